//! `mcpmesh-fleet`: many whole nodes on one machine, as a team of them would run. Prints the
//! time for every ordered pair of nodes to open a session and make a call, the failures, each
//! daemon's memory, and how long one removal from the team roster takes to reach every node.
//!
//! N hermetic daemons (loopback, no relay), each in a profile of its own under one temporary
//! directory and each serving `echo_mcp_stub` as `stub` to the group `fleet` (and to node0's
//! user: the admin holds no group). Trust comes from the roster alone: node0 creates the org
//! and invites the others, who join. Then:
//!
//! 1. every ordered pair (i → j, i ≠ j) runs `mcpmesh connect nodeJ/stub` from node i (the real
//!    client path), `--parallel` at a time, and calls `whoami`, whose answer must name node i's
//!    user as the caller;
//! 2. the last node keeps a session open to every other node, the admin removes its user, and
//!    the time until the last of those sessions ends is the time until every node severed it.
//!
//! Every node is stopped and the directory removed on the way out, on error too (`--keep 1`
//! keeps it after a run that ends, for the nodes' logs and audit logs).
//!
//!   cargo build --release -p mcpmesh-cli --bins
//!   target/release/mcpmesh-fleet [--nodes 50] [--parallel 8] [--sync-secs 120] [--pairs 0|1] [--keep 0|1]

#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures_util::future::join_all;
use mcpmesh_net::transport::FrameReader;
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;
use tokio::process::{Child, ChildStdin, ChildStdout};

use mcpmesh_testkit::bench;

/// Longest one answer may take before the session counts as failed.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest the roster may take to reach every node, or a removal to cut every session.
const SPREAD_TIMEOUT: Duration = Duration::from_secs(120);
const ORG: &str = "fleet";
const SERVICE: &str = "stub";

/// Many nodes in one org on this machine: how the org forms, spreads its roster and catalog,
/// carries sessions between every pair, and takes a member's removal.
#[derive(clap::Parser)]
#[command(name = "mcpmesh-fleet", args_override_self = true)]
struct Args {
    /// Nodes in the org (at least 2).
    #[arg(long, value_name = "N", default_value_t = 50, value_parser = bench::at_least(2))]
    nodes: usize,
    /// How many of the fleet's steps (starts, joins, sessions) run at once (at least 1).
    #[arg(long, value_name = "N", default_value_t = 8, value_parser = bench::at_least(1))]
    parallel: usize,
    /// The nodes' `[org] sync_secs` (at least 1).
    #[arg(long, value_name = "N", default_value_t = 120, value_parser = bench::at_least(1))]
    sync_secs: usize,
    /// 0 skips the sessions of every ordered pair (to look at the org's own figures alone).
    #[arg(long, value_name = "N", default_value_t = 1)]
    pairs: usize,
    /// 1 keeps the nodes' profiles (logs, audit logs) once they are stopped, and says where.
    #[arg(long, value_name = "N", default_value_t = 0)]
    keep: usize,
}

fn main() -> anyhow::Result<()> {
    let args = <Args as clap::Parser>::parse();
    let (mcpmesh, stub) = bench::sibling_binaries()?;
    bench::read_from_disk(&mcpmesh)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let fleet = Fleet::start(&args, mcpmesh).await?;
        let result = run(&args, &fleet, &stub).await;
        fleet.stop(args.keep > 0).await;
        result
    })
}

async fn run(args: &Args, fleet: &Fleet, stub: &Path) -> anyhow::Result<()> {
    let n = fleet.nodes.len();
    println!(
        "\nmcpmesh-fleet: {n} nodes on one machine, loopback, {}",
        bench::build_label(&fleet.mcpmesh)
    );
    let formed = Instant::now();
    fleet.form_org().await?;
    let joined = formed.elapsed();
    let last_join = unix_ms();
    let serial = fleet.admin().serial().await?;
    let spread = fleet.converge(serial, last_join).await?;
    println!(
        "org formed ({} invites and joins) in {:.1} s; roster serial {serial} on every node {:.2} s after the last join (by their audit records)",
        n - 1,
        joined.as_secs_f64(),
        spread.as_secs_f64()
    );
    fleet.serve_everywhere(stub).await?;
    let catalog = fleet.full_catalogs().await?;
    println!(
        "every node's `services` lists the other {} nodes' {SERVICE} {:.1} s after the roster converged",
        n - 1,
        catalog.as_secs_f64()
    );
    let news = fleet.new_service(stub).await?;
    println!(
        "a service served later ({}/extra) in every other node's `services`: p50 {:.2} s, p99 {:.2} s, last {:.2} s",
        fleet.nodes[1].user,
        news[news.len() / 2].as_secs_f64(),
        news[(news.len() * 99 / 100).min(news.len() - 1)].as_secs_f64(),
        news.last().copied().unwrap_or_default().as_secs_f64()
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let idle = fleet.rss_kib();
    let idle_cpu = fleet.idle_cpu(Duration::from_secs(10));
    println!(
        "idle CPU per node over 10 s: mean {:.2}%, max {:.2}%",
        idle_cpu.iter().sum::<f64>() / idle_cpu.len() as f64,
        idle_cpu.iter().copied().fold(0.0, f64::max)
    );

    if args.pairs == 0 {
        println!("the sessions of every ordered pair: skipped (--pairs 0)");
        return fleet.removal(args.sync_secs).await;
    }
    let sampler = RssSampler::start(fleet.pids());
    let started = Instant::now();
    let failures = fleet.all_pairs(args.parallel).await;
    let secs = started.elapsed().as_secs_f64();
    let peak = sampler.stop().await;
    let pairs = n * (n - 1);
    println!(
        "{pairs} sessions (every ordered pair: connect, initialize, whoami checked), {} at a time: {secs:.1} s, {:.1} sessions/s, {} failed",
        args.parallel,
        pairs as f64 / secs,
        failures.len()
    );
    for (i, j, e) in failures.iter().take(5) {
        println!("  node{i} → node{j}: {e:#}");
    }
    print_failures_by_caller(&failures, n);
    // The sessions' children are gone and the node has settled before "after" is read.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = fleet.rss_kib();
    for (label, kib) in [("idle", &idle), ("peak", &peak), ("after", &after)] {
        let mean = kib.iter().sum::<u64>() as f64 / kib.len() as f64;
        let max = kib.iter().copied().max().unwrap_or(0);
        println!(
            "RSS per node {label:>5}: mean {:.1} MB, max {:.1} MB",
            mean / 1024.0,
            max as f64 / 1024.0
        );
    }

    fleet.removal(args.sync_secs).await?;
    if !failures.is_empty() {
        bail!("{} of {pairs} sessions failed", failures.len());
    }
    Ok(())
}

/// `ask` of every item, [`POLL_AT_ONCE`] at a time, in order: a look at a hundred nodes does
/// not start a hundred processes at once.
async fn sweep<'a, T, F, R>(items: &'a [T], ask: impl Fn(&'a T) -> F) -> Vec<R>
where
    F: std::future::Future<Output = R>,
{
    use futures_util::StreamExt;
    futures_util::stream::iter(items.iter().map(ask))
        .buffered(POLL_AT_ONCE)
        .collect()
        .await
}

/// How long after `since` (unix ms) the last of `nodes` installed roster `serial`, by their
/// audit records.
fn last_install(nodes: &[Node], serial: u64, since: u64) -> Duration {
    let last = nodes
        .iter()
        .filter_map(|n| n.installed_at(serial))
        .max()
        .unwrap_or(since);
    Duration::from_millis(last.saturating_sub(since))
}

/// How roster `serial` spread over `nodes` after `since` (unix ms): when they installed it
/// (p50, p90, last) and from whom (the admin's node or another member).
fn print_spread(nodes: &[Node], serial: u64, since: u64, admin: &str) {
    let mut installs: Vec<(u64, String, &str)> = nodes
        .iter()
        .filter_map(|n| {
            n.install(serial)
                .map(|(at, from)| (at.saturating_sub(since), from, n.user.as_str()))
        })
        .collect();
    installs.sort();
    let Some(last) = installs.last() else {
        return;
    };
    let at = |q: usize| installs[(installs.len() * q / 100).min(installs.len() - 1)].0;
    let from_admin = installs.iter().filter(|(_, from, _)| from == admin).count();
    println!(
        "  installed by {} members: p50 {} ms, p90 {} ms, last {} ms ({}); {from_admin} had it from the admin's node, {} from other members",
        installs.len(),
        at(50),
        at(90),
        last.0,
        last.2,
        installs.len() - from_admin
    );
    let slowest: Vec<String> = installs
        .iter()
        .rev()
        .take(5)
        .map(|(at, from, user)| format!("{user} {at} ms from {from}"))
        .collect();
    println!("  the last five: {}", slowest.join(", "));
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// How many nodes a poll asks at once.
const POLL_AT_ONCE: usize = 8;

/// How many sessions failed per calling node and per called node, for the nodes with any.
fn print_failures_by_caller(failures: &[(usize, usize, anyhow::Error)], n: usize) {
    let count = |side: fn(&(usize, usize, anyhow::Error)) -> usize| {
        let mut by = vec![0usize; n + 1];
        for f in failures {
            by[side(f).min(n)] += 1;
        }
        let seen: Vec<String> = by
            .iter()
            .enumerate()
            .filter(|(_, c)| **c > 0)
            .map(|(i, c)| format!("node{i}: {c}"))
            .collect();
        seen.join(", ")
    };
    if !failures.is_empty() {
        println!("  failed sessions by caller: {}", count(|f| f.0));
        println!("  failed sessions by target: {}", count(|f| f.1));
    }
}

/// The nodes, in profiles under one temporary directory removed when this is dropped.
struct Fleet {
    mcpmesh: PathBuf,
    nodes: Vec<Node>,
    /// Removed when dropped (unless taken to be kept).
    dir: Option<tempfile::TempDir>,
}

/// One node: its profile, its user (its nickname), its key and its daemon's pid.
struct Node {
    mcpmesh: PathBuf,
    home: PathBuf,
    user: String,
    id: String,
    pid: u32,
}

impl Fleet {
    /// Starts `args.nodes` hermetic daemons, a few at a time.
    async fn start(args: &Args, mcpmesh: PathBuf) -> anyhow::Result<Fleet> {
        let dir = tempfile::Builder::new()
            .prefix("mcpmesh-fleet-")
            .tempdir()?;
        let mut nodes = Vec::new();
        for i in 0..args.nodes {
            let home = dir.path().join(format!("node{i}"));
            std::fs::create_dir(&home)?;
            let user = format!("node{i}");
            std::fs::write(
                home.join("config.toml"),
                format!(
                    "[identity]\nnickname = \"{user}\"\n\n[network]\nrelay_mode = \"disabled\"\nbind = \"127.0.0.1:0\"\n\n[org]\nsync_secs = {}\n",
                    args.sync_secs
                ),
            )?;
            nodes.push(Node {
                mcpmesh: mcpmesh.clone(),
                home,
                user,
                id: String::new(),
                pid: 0,
            });
        }
        // Held by the fleet before any starts, so that a failed start still stops the others.
        let mut fleet = Fleet {
            mcpmesh,
            nodes,
            dir: Some(dir),
        };
        let started = Instant::now();
        for chunk in fleet.nodes.chunks(8) {
            for up in join_all(chunk.iter().map(|n| n.cli(&["up"]))).await {
                up?;
            }
        }
        for node in &mut fleet.nodes {
            node.id = node.cli(&["id"]).await?["id"]
                .as_str()
                .context("the node's id")?
                .to_owned();
            node.pid = bench::daemon_pid(&node.home).context("the daemon's pid")?;
        }
        println!(
            "{} daemons up in {:.1} s",
            fleet.nodes.len(),
            started.elapsed().as_secs_f64()
        );
        Ok(fleet)
    }

    fn admin(&self) -> &Node {
        &self.nodes[0]
    }

    fn pids(&self) -> Vec<u32> {
        self.nodes.iter().map(|n| n.pid).collect()
    }

    fn rss_kib(&self) -> Vec<u64> {
        self.pids()
            .into_iter()
            .map(|p| bench::status_kib(p, "VmRSS:"))
            .collect()
    }

    /// node0 creates the org; every other node joins it as its own user in group `fleet`.
    async fn form_org(&self) -> anyhow::Result<()> {
        let admin = self.admin();
        admin.cli(&["org", "create", ORG]).await?;
        for node in &self.nodes[1..] {
            let invite = admin
                .cli(&["org", "invite", &node.user, "--groups", ORG])
                .await?;
            let line = invite["invite"].as_str().context("an invite line")?;
            let joined = node.cli(&["join", line]).await?;
            if joined["user"] != node.user.as_str() {
                bail!("{} joined as {}", node.user, joined["user"]);
            }
        }
        Ok(())
    }

    async fn serve_everywhere(&self, stub: &Path) -> anyhow::Result<()> {
        let group = format!("group:{ORG}");
        let stub = stub.display().to_string();
        // The admin holds no group of its own: it is allowed by its user.
        let admin = format!("user:{}", self.admin().user);
        let args = [
            "serve", SERVICE, "--allow", &group, "--allow", &admin, "--", &stub,
        ];
        for r in sweep(&self.nodes, |n| n.cli(&args)).await {
            r?;
        }
        Ok(())
    }

    /// Waits until every node holds roster `serial`; returns how long after `since` (unix ms)
    /// the last node installed it, by its own audit record (polling only finds when to look).
    async fn converge(&self, serial: u64, since: u64) -> anyhow::Result<Duration> {
        let started = Instant::now();
        loop {
            let held = sweep(&self.nodes, |n| n.held_serial()).await;
            let behind: Vec<&str> = self
                .nodes
                .iter()
                .zip(&held)
                .filter(|(_, s)| **s != Some(serial))
                .map(|(n, _)| n.user.as_str())
                .collect();
            if behind.is_empty() {
                return Ok(last_install(&self.nodes, serial, since));
            }
            if started.elapsed() > SPREAD_TIMEOUT {
                bail!("roster serial {serial} not reached by {behind:?}");
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Waits until every node's `services` lists every other node's service; returns how
    /// long that took.
    async fn full_catalogs(&self) -> anyhow::Result<Duration> {
        let started = Instant::now();
        let want = self.nodes.len() - 1;
        loop {
            let counts = sweep(&self.nodes, |n| n.mounts()).await;
            let short: Vec<&str> = self
                .nodes
                .iter()
                .zip(&counts)
                .filter(|(_, c)| c.as_ref().map_or(true, |c| c.len() < want))
                .map(|(n, _)| n.user.as_str())
                .collect();
            if short.is_empty() {
                return Ok(started.elapsed());
            }
            if started.elapsed() > SPREAD_TIMEOUT {
                bail!(
                    "{} nodes' catalogs still short: {:?}",
                    short.len(),
                    &short[..short.len().min(5)]
                );
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// node1 serves one more service; returns, sorted, how long each other node took to list
    /// it in `services`.
    async fn new_service(&self, stub: &Path) -> anyhow::Result<Vec<Duration>> {
        let server = &self.nodes[1];
        let group = format!("group:{ORG}");
        let admin = format!("user:{}", self.admin().user);
        let stub = stub.display().to_string();
        let started = Instant::now();
        server
            .cli(&[
                "serve", "extra", "--allow", &group, "--allow", &admin, "--", &stub,
            ])
            .await?;
        let mount = format!("{}/extra", server.user);
        let mut seen: Vec<Option<Duration>> = vec![None; self.nodes.len()];
        seen[1] = Some(Duration::ZERO);
        while seen.iter().any(Option::is_none) {
            if started.elapsed() > SPREAD_TIMEOUT {
                bail!("{mount} not in every node's services");
            }
            let waiting: Vec<usize> = (0..seen.len()).filter(|i| seen[*i].is_none()).collect();
            let lists = sweep(&waiting, |i| self.nodes[*i].mounts()).await;
            for (i, list) in waiting.into_iter().zip(lists) {
                if list.is_ok_and(|l| l.contains(&mount)) {
                    seen[i] = Some(started.elapsed());
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let mut times: Vec<Duration> = seen
            .into_iter()
            .enumerate()
            .filter(|(i, _)| *i != 1)
            .filter_map(|(_, t)| t)
            .collect();
        times.sort();
        Ok(times)
    }

    /// Each node's share of one CPU over `over`, idle (from `/proc/PID/stat`).
    fn idle_cpu(&self, over: Duration) -> Vec<f64> {
        let before: Vec<u64> = self.pids().into_iter().map(bench::cpu_ticks_of).collect();
        std::thread::sleep(over);
        let after: Vec<u64> = self.pids().into_iter().map(bench::cpu_ticks_of).collect();
        let hz = bench::clock_ticks_per_sec();
        before
            .iter()
            .zip(&after)
            .map(|(b, a)| a.saturating_sub(*b) as f64 / hz / over.as_secs_f64() * 100.0)
            .collect()
    }

    /// Every ordered pair opens a session and calls `whoami`, `parallel` at a time; returns
    /// the failures.
    async fn all_pairs(&self, parallel: usize) -> Vec<(usize, usize, anyhow::Error)> {
        let n = self.nodes.len();
        let pairs = (0..n).flat_map(|i| (0..n).filter(move |j| *j != i).map(move |j| (i, j)));
        let permits = Arc::new(tokio::sync::Semaphore::new(parallel));
        let mut sessions = tokio::task::JoinSet::new();
        for (i, j) in pairs {
            let Ok(permit) = permits.clone().acquire_owned().await else {
                break;
            };
            let client = self.nodes[i].client();
            let (caller, target) = (self.nodes[i].user.clone(), self.nodes[j].user.clone());
            sessions.spawn(async move {
                let r = whoami_session(client, &caller, &target).await;
                drop(permit);
                (i, j, r)
            });
        }
        let mut failures = Vec::new();
        while let Some(done) = sessions.join_next().await {
            match done {
                Ok((i, j, Err(e))) => failures.push((i, j, e)),
                Ok(_) => {}
                Err(e) => failures.push((n, n, e.into())),
            }
        }
        failures.sort_by_key(|(i, j, _)| (*i, *j));
        failures
    }

    /// The last node holds a session to every other node; the admin removes its user. Prints
    /// when each of those sessions ended (the serving node cut it) and checks that no node
    /// lists the removed key any more.
    async fn removal(&self, sync_secs: usize) -> anyhow::Result<()> {
        let removed = self.nodes.last().context("a node to remove")?;
        let others = &self.nodes[..self.nodes.len() - 1];
        let mut open = Vec::new();
        for node in others {
            let mut s = McpClient::spawn(removed.client(), &format!("{}/{SERVICE}", node.user))?;
            match s.initialize().await {
                Ok(()) => open.push(s),
                Err(e) => println!("  {} → {} not opened: {e:#}", removed.user, node.user),
            }
        }
        let open_count = open.len();
        let started = Instant::now();
        let waits = open.into_iter().map(|mut s| async move {
            tokio::time::timeout(SPREAD_TIMEOUT, s.until_end())
                .await
                .ok()
                .map(|()| started.elapsed())
        });
        let ends = tokio::spawn(join_all(waits));
        let since = unix_ms();
        let answer = self.admin().cli(&["org", "remove", &removed.user]).await?;
        let command = started.elapsed();
        let serial = answer["serial"].as_u64().context("the removal's serial")?;
        // The admin's node goes as soon as one member holds the new roster: the others must
        // get it from the members.
        let members = &others[1..];
        // Watched from the members' audit files, not by asking their nodes: a file read per
        // member, so that looking does not load the machine the figure is taken on.
        let first = loop {
            if let Some(i) = members
                .iter()
                .position(|n| n.installed_at(serial).is_some())
            {
                break i;
            }
            if started.elapsed() > SPREAD_TIMEOUT {
                bail!("no member took serial {serial}");
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        self.admin().cli(&["down"]).await?;
        let admin_down = started.elapsed();
        let spread = loop {
            let held = sweep(members, |n| n.held_serial()).await;
            if held.iter().all(|s| *s == Some(serial)) {
                break last_install(members, serial, since);
            }
            if started.elapsed() > SPREAD_TIMEOUT {
                let behind = held.iter().filter(|s| **s != Some(serial)).count();
                bail!("{behind} members never took serial {serial} with the admin down");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        println!(
            "removal roster (serial {serial}): first member ({}) had it, admin's node down {:.2} s after `org remove`; all {} members had it {:.2} s after",
            members[first].user,
            admin_down.as_secs_f64(),
            members.len(),
            spread.as_secs_f64()
        );
        print_spread(members, serial, since, &self.admin().user);
        let mut ends = ends.await?;
        let cut = ends.iter().filter(|e| e.is_some()).count();
        ends.sort();
        let last = ends.iter().flatten().max().copied().unwrap_or_default();
        let median = ends
            .get(ends.len() / 2)
            .copied()
            .flatten()
            .unwrap_or_default();
        println!(
            "removal of {} (serial {}, [org] sync_secs = {sync_secs}): `org remove` returned in {:.2} s; \
             its sessions on {cut} of {open_count} nodes ended, median {:.2} s, last {:.2} s",
            removed.user,
            answer["serial"],
            command.as_secs_f64(),
            median.as_secs_f64(),
            last.as_secs_f64()
        );
        let listing = sweep(others, |n| n.lists(&removed.id)).await;
        let still: Vec<&str> = others
            .iter()
            .zip(listing)
            .filter(|(_, l)| !matches!(l, Ok(false)))
            .map(|(n, _)| n.user.as_str())
            .collect();
        println!(
            "nodes still listing {} afterwards: {}",
            removed.user,
            if still.is_empty() {
                "none".to_owned()
            } else {
                still.join(", ")
            }
        );
        if cut < open_count || !still.is_empty() {
            bail!("the removal did not reach every node");
        }
        Ok(())
    }

    /// Stops every node that started (its children with it), a few at a time.
    async fn stop(mut self, keep: bool) {
        let nodes = std::mem::take(&mut self.nodes);
        for chunk in nodes.chunks(8) {
            join_all(chunk.iter().map(|n| n.cli(&["down"]))).await;
        }
        if keep && let Some(dir) = self.dir.take() {
            println!("the nodes' profiles are kept in {}", dir.keep().display());
        }
    }
}

impl Drop for Fleet {
    /// On a panic or early return the nodes still stop, before their profiles go.
    fn drop(&mut self) {
        for node in &self.nodes {
            let _ = std::process::Command::new(&node.mcpmesh)
                .arg("--home")
                .arg(&node.home)
                .arg("down")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}

impl Node {
    /// `mcpmesh --home H --json ARGS…`; its stdout's value, or an error with its stderr.
    async fn cli(&self, args: &[&str]) -> anyhow::Result<Value> {
        let out = tokio::process::Command::new(&self.mcpmesh)
            .arg("--home")
            .arg(&self.home)
            .arg("--json")
            .args(args)
            .env_remove("MCPMESH_HOME")
            .stdin(Stdio::null())
            .output()
            .await?;
        if !out.status.success() {
            bail!(
                "{}: mcpmesh {args:?}: {}",
                self.user,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(serde_json::from_slice(&out.stdout).unwrap_or(Value::Null))
    }

    /// The admin's serial (from `org members`).
    async fn serial(&self) -> anyhow::Result<u64> {
        self.cli(&["org", "members"]).await?["serial"]
            .as_u64()
            .context("a roster serial")
    }

    /// The roster serial this node holds (from `org members`, which asks no other node and
    /// starts no checks).
    async fn held_serial(&self) -> Option<u64> {
        self.cli(&["org", "members"]).await.ok()?["serial"].as_u64()
    }

    /// When this node installed roster `serial` (unix ms), by its audit log.
    fn installed_at(&self, serial: u64) -> Option<u64> {
        self.install(serial).map(|(at, _)| at)
    }

    /// When this node installed roster `serial` (unix ms) and whom it had it from, by its
    /// audit log.
    fn install(&self, serial: u64) -> Option<(u64, String)> {
        let dir = self.home.join("state").join("audit");
        let files = std::fs::read_dir(dir).ok()?;
        let mut at = None;
        for file in files.flatten() {
            let Ok(text) = std::fs::read_to_string(file.path()) else {
                continue;
            };
            for line in text.lines().filter(|l| l.contains("roster_installed")) {
                let Ok(record) = serde_json::from_str::<Value>(line) else {
                    continue;
                };
                if record["event"] == "roster_installed" && record["serial"] == serial {
                    let from = record["from"].as_str().unwrap_or_default().to_owned();
                    at = at.or(record["at_ms"].as_u64().map(|at| (at, from)));
                }
            }
        }
        at
    }

    /// The mounts this node's `services` lists.
    async fn mounts(&self) -> anyhow::Result<Vec<String>> {
        let listed = self.cli(&["services"]).await?;
        Ok(listed["services"]
            .as_array()
            .context("a services list")?
            .iter()
            .filter_map(|e| e["mount"].as_str().map(str::to_owned))
            .collect())
    }

    /// Whether this node's `peers` lists the key `id`.
    async fn lists(&self, id: &str) -> anyhow::Result<bool> {
        let peers = self.cli(&["peers"]).await?;
        let list = peers["peers"].as_array().context("a peers list")?;
        Ok(list.iter().any(|p| p["id"] == id))
    }

    /// What a `connect` process of this node needs.
    fn client(&self) -> Client {
        Client {
            mcpmesh: self.mcpmesh.clone(),
            home: self.home.clone(),
        }
    }
}

/// Enough to launch `mcpmesh connect` as one node, from any task.
struct Client {
    mcpmesh: PathBuf,
    home: PathBuf,
}

/// One session: connect, initialize, `whoami`, checked to name `caller` as the peer's user.
async fn whoami_session(client: Client, caller: &str, target: &str) -> anyhow::Result<()> {
    let mut s = McpClient::spawn(client, &format!("{target}/{SERVICE}"))?;
    s.initialize().await?;
    let answer = s
        .request("tools/call", json!({ "name": "whoami", "arguments": {} }))
        .await?;
    let seen = &answer["result"]["structuredContent"]["MCPMESH_PEER_USER"];
    if seen != caller {
        bail!("whoami names {seen} as the caller: {answer}");
    }
    s.close().await
}

/// An MCP client over a `mcpmesh connect` process's stdio.
struct McpClient {
    child: Child,
    stdin: Option<ChildStdin>,
    reader: FrameReader<ChildStdout>,
    next_id: u64,
}

impl McpClient {
    fn spawn(client: Client, target: &str) -> anyhow::Result<Self> {
        let mut child = tokio::process::Command::new(&client.mcpmesh)
            .arg("--home")
            .arg(&client.home)
            .args(["connect", target])
            .env_remove("MCPMESH_HOME")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            // Kept for the failure's message (connect writes a line or two at most).
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().context("connect's stdout")?;
        Ok(McpClient {
            child,
            stdin,
            reader: FrameReader::new(stdout, 1 << 20),
            next_id: 0,
        })
    }

    async fn send(&mut self, msg: &Value) -> anyhow::Result<()> {
        let mut line = serde_json::to_vec(msg)?;
        line.push(b'\n');
        let stdin = self.stdin.as_mut().context("stdin open")?;
        stdin.write_all(&line).await?;
        stdin.flush().await?;
        Ok(())
    }

    /// Sends a request and returns its answer (skipping anything else); an error answer fails.
    async fn request(&mut self, method: &str, params: Value) -> anyhow::Result<Value> {
        self.next_id += 1;
        let id = self.next_id;
        self.send(&json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params }))
            .await?;
        loop {
            let line = tokio::time::timeout(ANSWER_TIMEOUT, self.reader.next_line())
                .await
                .context("an answer in time")??
                .context("the session ended before answering")?;
            let v: Value = serde_json::from_slice(&line)?;
            if v["id"] == id {
                if v.get("error").is_some() {
                    bail!("{method} refused: {}", v["error"]);
                }
                return Ok(v);
            }
        }
    }

    async fn initialize(&mut self) -> anyhow::Result<()> {
        self.request(
            "initialize",
            json!({ "protocolVersion": "2025-11-25", "capabilities": {},
                    "clientInfo": { "name": "mcpmesh-fleet", "version": "0" } }),
        )
        .await?;
        self.send(&json!({ "jsonrpc": "2.0", "method": "notifications/initialized" }))
            .await
    }

    /// Ends the session as a client does (stdin closed) and waits for the process to exit.
    async fn close(mut self) -> anyhow::Result<()> {
        self.stdin = None;
        let status = tokio::time::timeout(ANSWER_TIMEOUT, self.child.wait())
            .await
            .context("connect exiting in time")??;
        if !status.success() {
            let mut said = String::new();
            if let Some(mut stderr) = self.child.stderr.take() {
                use tokio::io::AsyncReadExt;
                let _ =
                    tokio::time::timeout(Duration::from_secs(1), stderr.read_to_string(&mut said))
                        .await;
            }
            bail!("connect exited with {status}: {}", said.trim());
        }
        Ok(())
    }

    /// Returns once the session has ended from the far side (its output closed).
    async fn until_end(&mut self) {
        while let Ok(Some(_)) = self.reader.next_line().await {}
    }
}

/// Samples every node's RSS a few times a second, keeping each one's highest.
struct RssSampler {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Vec<u64>>,
}

impl RssSampler {
    fn start(pids: Vec<u32>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let task = tokio::spawn(async move {
            let mut peak = vec![0u64; pids.len()];
            while !flag.load(Ordering::Relaxed) {
                for (p, pid) in peak.iter_mut().zip(&pids) {
                    *p = (*p).max(bench::status_kib(*pid, "VmRSS:"));
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            peak
        });
        RssSampler { stop, task }
    }

    async fn stop(self) -> Vec<u64> {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.unwrap_or_default()
    }
}
