//! `mcpmesh-scale`: many sessions from many peers on one serving node. Prints the node's
//! memory per session (its own, children excluded) and the call latency while all sessions
//! are open and busy.
//!
//! One hermetic node serves `echo_mcp_stub` (a small compiled MCP server: one child per
//! session). The peers are in-process iroh endpoints with keys of their own, each trusted by
//! the node under its own name; each opens its sessions over its one pooled connection, as a
//! dialing node would.
//!
//!   cargo build --release && target/release/mcpmesh-scale [--peers 50] [--sessions 10] [--calls 20]

#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use iroh::address_lookup::MemoryLookup;
use iroh::{EndpointAddr, EndpointId, SecretKey};
use mcpmesh_net::endpoint::NetworkConfig;
use mcpmesh_net::session::{ALPN_MCP, Preamble};
use mcpmesh_net::transport::FrameReader;
use serde_json::{Value, json};

use mcpmesh_testkit::bench;

/// Many sessions from many peers on one serving node.
#[derive(clap::Parser)]
#[command(name = "mcpmesh-scale", args_override_self = true)]
struct Args {
    /// Peers, each with its own key (at least 1).
    #[arg(long, value_name = "N", default_value_t = 50, value_parser = bench::at_least(1))]
    peers: usize,
    /// Sessions each peer opens (at least 1).
    #[arg(long, value_name = "N", default_value_t = 10, value_parser = bench::at_least(1))]
    sessions: usize,
    /// Calls in each session (at least 1).
    #[arg(long, value_name = "N", default_value_t = 20, value_parser = bench::at_least(1))]
    calls: usize,
}

fn main() -> anyhow::Result<()> {
    let args = <Args as clap::Parser>::parse();
    let (mcpmesh, stub) = bench::sibling_binaries()?;
    bench::read_from_disk(&mcpmesh)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(run(args, mcpmesh, stub))
}

async fn run(args: Args, mcpmesh: PathBuf, stub: PathBuf) -> anyhow::Result<()> {
    let home = tempfile::Builder::new()
        .prefix("mcpmesh-scale-")
        .tempdir()?;
    let node = Node {
        mcpmesh,
        home: home.path().to_path_buf(),
    };
    let total = args.peers * args.sessions;
    std::fs::write(
        node.home.join("config.toml"),
        format!(
            "[network]\nrelay_mode = \"disabled\"\nbind = \"127.0.0.1:0\"\n\n[limits]\nrate_limit_per_min = 100000000\nmax_sessions = {}\n",
            total + 8
        ),
    )?;
    let id = node.cli(&["--json", "id"])?;
    let target: EndpointId = id["id"].as_str().unwrap_or_default().parse()?;
    let addr: std::net::SocketAddr = id["addrs"][0].as_str().unwrap_or_default().parse()?;

    // The peers: keys of their own, each trusted under its own name and granted the service.
    let mut keys = Vec::new();
    let mut serve = vec!["serve".to_owned(), "scale".to_owned()];
    for i in 0..args.peers {
        let key = SecretKey::generate();
        let name = format!("peer{i}");
        node.cli(&["peers", "add", &name, &key.public().to_string()])?;
        serve.extend(["--allow".to_owned(), name]);
        keys.push(key);
    }
    serve.extend(["--".to_owned(), stub.display().to_string()]);
    let serve: Vec<&str> = serve.iter().map(String::as_str).collect();
    node.cli(&serve)?;

    let pid = node.pid()?;
    let rss_idle = rss_kib(pid);
    let config = NetworkConfig::loopback();
    let opened = Instant::now();
    let mut peers = tokio::task::JoinSet::new();
    for key in keys {
        let config = config.clone();
        let sessions = args.sessions;
        peers.spawn(async move {
            let book = MemoryLookup::new();
            book.add_endpoint_info(EndpointAddr::new(target).with_ip_addr(addr));
            let ep = mcpmesh_net::endpoint::bind(key, &config, vec![], book).await?;
            let conn = ep.connect(target, ALPN_MCP).await?;
            let mut open = Vec::new();
            for _ in 0..sessions {
                open.push(Session::open(&conn).await?);
            }
            anyhow::Ok((ep, conn, open))
        });
    }
    let mut sessions = Vec::new();
    let mut keep = Vec::new();
    while let Some(r) = peers.join_next().await {
        let (ep, conn, open) = r??;
        sessions.extend(open);
        keep.push((ep, conn));
    }
    let open_secs = opened.elapsed().as_secs_f64();
    // Every session has its child and has answered initialize: the node holds them all.
    let rss_open = rss_kib(pid);
    let children = count_children(pid);

    // Load: every session calls at once, `calls` times in a row.
    let started = Instant::now();
    let mut calls = tokio::task::JoinSet::new();
    for mut s in sessions {
        let n = args.calls;
        calls.spawn(async move {
            let mut rtts = Vec::with_capacity(n);
            for _ in 0..n {
                let t = Instant::now();
                s.call().await?;
                rtts.push(t.elapsed());
            }
            anyhow::Ok((s, rtts))
        });
    }
    let mut rtts = Vec::new();
    let mut sessions = Vec::new();
    while let Some(r) = calls.join_next().await {
        let (s, r) = r??;
        rtts.extend(r);
        sessions.push(s);
    }
    let load_secs = started.elapsed().as_secs_f64();
    let rss_peak = peak_rss_kib(pid);
    rtts.sort();
    let pct = |p: f64| rtts[((rtts.len() - 1) as f64 * p) as usize].as_secs_f64() * 1e3;

    println!(
        "\nmcpmesh-scale: {} peers x {} sessions = {total} sessions on one node, loopback, {}",
        args.peers,
        args.sessions,
        bench::build_label(&node.mcpmesh)
    );
    println!(
        "opened {total} sessions (spawn + initialize each) in {open_secs:.2} s; {children} children running"
    );
    println!(
        "node RSS: idle {:.1} MB, all open {:.1} MB, peak under load {:.1} MB",
        rss_idle as f64 / 1024.0,
        rss_open as f64 / 1024.0,
        rss_peak as f64 / 1024.0
    );
    println!(
        "node memory per session (children excluded): {:.1} KiB at rest, {:.1} KiB at peak",
        rss_open.saturating_sub(rss_idle) as f64 / total as f64,
        rss_peak.saturating_sub(rss_idle) as f64 / total as f64
    );
    println!(
        "{} calls, all sessions busy at once: {:.0} calls/s; latency p50 {:.2} ms, p90 {:.2} ms, p99 {:.2} ms",
        rtts.len(),
        rtts.len() as f64 / load_secs,
        pct(0.50),
        pct(0.90),
        pct(0.99)
    );
    drop(sessions);
    drop(keep);
    let _ = node.cli(&["down"]);
    Ok(())
}

/// One raw mesh session: a stream with the preamble written, initialized.
struct Session {
    send: iroh::endpoint::SendStream,
    recv: FrameReader<iroh::endpoint::RecvStream>,
    next_id: u64,
}

impl Session {
    async fn open(conn: &iroh::endpoint::Connection) -> anyhow::Result<Self> {
        let (send, recv) = conn.open_bi().await?;
        let mut s = Session {
            send,
            recv: FrameReader::new(recv, 1 << 20),
            next_id: 0,
        };
        s.send.write_all(&Preamble::new("scale").to_line()).await?;
        s.request(
            "initialize",
            json!({ "protocolVersion": "2025-11-25", "capabilities": {},
                    "clientInfo": { "name": "mcpmesh-scale", "version": "0" } }),
        )
        .await?;
        Ok(s)
    }

    async fn request(&mut self, method: &str, params: Value) -> anyhow::Result<Value> {
        self.next_id += 1;
        let mut line = serde_json::to_vec(
            &json!({ "jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params }),
        )?;
        line.push(b'\n');
        self.send.write_all(&line).await?;
        let answer = tokio::time::timeout(Duration::from_secs(60), self.recv.next_line())
            .await
            .context("an answer in time")??
            .context("the session ended")?;
        let v: Value = serde_json::from_slice(&answer)?;
        if v.get("error").is_some() {
            bail!("{method} failed: {v}");
        }
        Ok(v)
    }

    async fn call(&mut self) -> anyhow::Result<()> {
        self.request(
            "tools/call",
            json!({ "name": "echo", "arguments": { "text": "x".repeat(130) } }),
        )
        .await?;
        Ok(())
    }
}

struct Node {
    mcpmesh: PathBuf,
    home: PathBuf,
}

impl Node {
    fn cli(&self, args: &[&str]) -> anyhow::Result<Value> {
        let out = Command::new(&self.mcpmesh)
            .arg("--home")
            .arg(&self.home)
            .args(args)
            .output()?;
        if !out.status.success() {
            bail!("mcpmesh {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(serde_json::from_slice(&out.stdout).unwrap_or(Value::Null))
    }

    fn pid(&self) -> anyhow::Result<u32> {
        bench::daemon_pid(&self.home).context("the node's pid")
    }
}

fn rss_kib(pid: u32) -> u64 {
    bench::status_kib(pid, "VmRSS:")
}

fn peak_rss_kib(pid: u32) -> u64 {
    bench::status_kib(pid, "VmHWM:")
}

/// The node's live children (one server per session).
fn count_children(pid: u32) -> usize {
    let path = Path::new("/proc").join(pid.to_string()).join("task");
    std::fs::read_dir(path)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .map(|c| c.split_whitespace().count())
        .sum()
}
