use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use mcpmesh::control::client::ControlClient;
use mcpmesh::control::{Attach, ControlError, codes, methods};
use mcpmesh::paths::Profile;
use serde_json::{Value, json};

/// Share MCP servers between machines, peer to peer.
#[derive(Debug, Parser)]
#[command(name = "mcpmesh", version, about, propagate_version = true)]
struct Cli {
    /// Keep all of this node's state under DIR (same as MCPMESH_HOME).
    #[arg(long, global = true, value_name = "DIR")]
    home: Option<PathBuf>,
    /// Print one JSON value on stdout (errors as one JSON line on stderr).
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Show this node's endpoint id and dialable addresses (starts the node if needed).
    Id,
    /// Start the node in the background.
    Up,
    /// Stop the node and every server it spawned.
    Down,
    /// Run the node in the foreground.
    Daemon {
        /// Report readiness or failure as one JSON line on stdout (for whoever started us).
        #[arg(long, hide = true)]
        notify: bool,
    },
    /// List trusted peers, or add one.
    Peers {
        #[command(subcommand)]
        action: Option<PeersAction>,
    },
    /// Serve a local stdio MCP server to peers, spawned once per session.
    Serve {
        /// The service's name, as peers will mount it (`<this node>/<NAME>`).
        name: String,
        /// Who may use it: a peer name, `eid:<hex>`, a user or a group. Repeatable.
        #[arg(long = "allow", value_name = "PRINCIPAL")]
        allow: Vec<String>,
        /// Sessions running at once (default 4).
        #[arg(long, value_name = "N")]
        max_sessions: Option<u32>,
        /// The server command and its arguments.
        #[arg(last = true, required = true, value_name = "CMD")]
        cmd: Vec<String>,
    },
    /// Be the stdio MCP server for a peer's service (what AI clients launch).
    Connect {
        /// PEER/SERVICE
        target: String,
    },
    /// Read the audit log: recent records, totals, or a check of its integrity.
    Audit {
        #[command(subcommand)]
        action: AuditAction,
    },
    /// Two nodes on this machine share a tool, end to end: no network, no accounts.
    Demo,
    /// The demo's built-in stdio MCP server.
    #[command(hide = true)]
    DemoServer,
}

#[derive(Debug, Subcommand)]
enum AuditAction {
    /// The most recent records (with --json, one JSON record per line).
    Tail {
        /// How many records.
        #[arg(short = 'n', long = "lines", default_value_t = 20)]
        lines: usize,
        /// Keep printing records as they are written.
        #[arg(long, short)]
        follow: bool,
        /// Only records about this peer.
        #[arg(long)]
        peer: Option<String>,
        /// Only records about this service.
        #[arg(long)]
        service: Option<String>,
    },
    /// Check the hash chain; exits 1 if any record was edited, removed, inserted or moved.
    Verify,
    /// Sessions, requests, errors, latency and bytes per peer and per service.
    Summary {
        /// Only records this recent (30m, 24h, 7d).
        #[arg(long, value_name = "DURATION")]
        since: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
enum PeersAction {
    /// Trust a peer by its endpoint id (static trust, no ceremony).
    Add {
        name: String,
        id: String,
        /// An address the peer can be reached at (HOST:PORT). Repeatable.
        #[arg(long = "addr", value_name = "HOST:PORT")]
        addrs: Vec<String>,
    },
}

/// A failure as the user sees it: a stable code (when there is one) and a message.
struct Failure {
    code: Option<i64>,
    message: String,
}

impl From<ControlError> for Failure {
    fn from(e: ControlError) -> Self {
        Failure {
            code: Some(e.code),
            message: e.message,
        }
    }
}

impl From<anyhow::Error> for Failure {
    fn from(e: anyhow::Error) -> Self {
        Failure {
            code: None,
            message: format!("{e:#}"),
        }
    }
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let json_mode = cli.json;
    init_logging(&cli.command);
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            if json_mode {
                eprintln!(
                    "{}",
                    json!({ "error": { "code": f.code, "message": f.message } })
                );
            } else {
                eprintln!("mcpmesh: {}", f.message);
            }
            ExitCode::FAILURE
        }
    }
}

fn init_logging(command: &Command) {
    let default = match command {
        Command::Daemon { .. } => "info",
        _ => "warn",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("MCPMESH_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

fn run(cli: Cli) -> Result<(), Failure> {
    let profile = Profile::resolve(cli.home.clone()).context("locating the node's files")?;
    let exe = std::env::current_exe().context("locating the mcpmesh executable")?;
    let out = Output { json: cli.json };
    match cli.command {
        Command::Daemon { notify } => daemon(profile, notify),
        Command::DemoServer => {
            crate::stub_server::serve_stdio("mcpmesh-demo", false).context("demo server")?;
            Ok(())
        }
        Command::Demo => {
            let mut stdout = std::io::stdout().lock();
            mcpmesh::demo::run(&exe, &mut stdout).context("demo failed")?;
            Ok(())
        }
        Command::Connect { target } => connect(&profile, &exe, &target),
        Command::Audit { action } => audit(&profile, action, &out),
        Command::Up => {
            ControlClient::connect_or_start(&profile, &exe)?;
            let socket = profile.socket_path().display().to_string();
            out.print(json!({ "socket": socket }), || {
                format!("node is up (control socket {socket})")
            });
            Ok(())
        }
        Command::Down => {
            let was_running = ControlClient::shutdown(&profile)?;
            out.print(
                json!({ "stopped": true, "was_running": was_running }),
                || {
                    if was_running {
                        "node stopped".into()
                    } else {
                        "no node was running".into()
                    }
                },
            );
            Ok(())
        }
        Command::Id => {
            let mut client = ControlClient::connect_or_start(&profile, &exe)?;
            let v = client.call(methods::NODE_ID, json!({}))?;
            out.print(v.clone(), || {
                let addrs: Vec<&str> = v["addrs"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str)
                    .collect();
                format!(
                    "{}\naddresses: {}",
                    v["id"].as_str().unwrap_or_default(),
                    addrs.join(" ")
                )
            });
            Ok(())
        }
        Command::Peers { action: None } => {
            let mut client = ControlClient::connect_or_start(&profile, &exe)?;
            let v = client.call(methods::PEERS_LIST, json!({}))?;
            out.print(v.clone(), || render_peers(&v));
            Ok(())
        }
        Command::Peers {
            action: Some(PeersAction::Add { name, id, addrs }),
        } => {
            let mut client = ControlClient::connect_or_start(&profile, &exe)?;
            let v = client.call(
                methods::PEERS_ADD,
                json!({ "name": name, "id": id, "addrs": addrs }),
            )?;
            out.print(json!({ "peer": v["peer"], "id": v["id"] }), || {
                format!("trusting {name}. Next: mcpmesh serve SERVICE --allow {name} -- COMMAND…, or mcpmesh connect {name}/SERVICE")
            });
            Ok(())
        }
        Command::Serve {
            name,
            allow,
            max_sessions,
            cmd,
        } => {
            let mut client = ControlClient::connect_or_start(&profile, &exe)?;
            let v = client.call(
                methods::SERVICES_SERVE,
                json!({ "name": name, "run": cmd, "allow": allow, "max_sessions": max_sessions }),
            )?;
            let node = client.node_id().to_owned();
            out.print(json!({ "service": v["service"], "serving": true }), || {
                let peers: Vec<&str> = v["allowed_peers"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
                if peers.is_empty() {
                    format!("serving {name}, to nobody yet. Next: mcpmesh serve {name} --allow PEER -- {}", cmd.join(" "))
                } else {
                    format!(
                        "serving {name} to {}. They mount it with: mcpmesh connect <your name>/{name} (this node is {}…)",
                        peers.join(", "),
                        node.get(..12).unwrap_or_default()
                    )
                }
            });
            Ok(())
        }
    }
}

fn audit(profile: &Profile, action: AuditAction, out: &Output) -> Result<(), Failure> {
    use mcpmesh::audit;
    let dir = profile.audit_dir();
    match action {
        AuditAction::Verify => {
            let report = audit::verify(&dir).context("reading the audit log")?;
            let value = serde_json::to_value(&report).context("rendering")?;
            out.print(value, || match &report.first_bad {
                None => format!("audit log intact: {} records", report.records),
                Some(bad) => format!(
                    "audit log damaged at {} line {}{}: {}",
                    bad.file,
                    bad.line,
                    bad.seq
                        .map(|s| format!(" (record {s})"))
                        .unwrap_or_default(),
                    bad.reason
                ),
            });
            if report.ok {
                Ok(())
            } else {
                // The report is the answer; the exit status tells scripts it is a bad one.
                std::process::exit(1)
            }
        }
        AuditAction::Summary { since } => {
            let since_ms = match since {
                None => 0,
                Some(text) => {
                    let d = audit::parse_duration(&text).ok_or_else(|| Failure {
                        code: Some(codes::INVALID_PARAMS),
                        message: format!("{text:?} is not a duration like 30m, 24h or 7d"),
                    })?;
                    audit::unix_ms().saturating_sub(d.as_millis() as u64)
                }
            };
            let records = audit::read_all(&dir).context("reading the audit log")?;
            let summary = audit::summarize(&records, since_ms);
            let value = serde_json::to_value(&summary).context("rendering")?;
            out.print(value, || render_summary(&summary));
            Ok(())
        }
        AuditAction::Tail {
            lines,
            follow,
            peer,
            service,
        } => {
            let wanted = |v: &Value| {
                peer.as_deref().is_none_or(|p| v["peer"] == p)
                    && service.as_deref().is_none_or(|s| v["service"] == s)
            };
            let records = audit::read_all(&dir).context("reading the audit log")?;
            let mut last_seq = records.last().and_then(|v| v["seq"].as_u64()).unwrap_or(0);
            let shown: Vec<&Value> = records.iter().filter(|v| wanted(v)).collect();
            for v in &shown[shown.len().saturating_sub(lines)..] {
                print_record(v, out.json);
            }
            if !follow {
                return Ok(());
            }
            loop {
                std::thread::sleep(std::time::Duration::from_millis(250));
                let records = audit::read_all(&dir).context("reading the audit log")?;
                let seen = last_seq;
                for v in records
                    .iter()
                    .filter(|v| v["seq"].as_u64().unwrap_or(0) > seen)
                {
                    last_seq = v["seq"].as_u64().unwrap_or(last_seq);
                    if wanted(v) {
                        print_record(v, out.json);
                    }
                }
            }
        }
    }
}

fn print_record(v: &Value, json: bool) {
    let mut stdout = std::io::stdout().lock();
    if json {
        let _ = writeln!(stdout, "{v}");
    } else {
        let s = |k: &str| v[k].as_str().unwrap_or("").to_owned();
        let detail = match v["event"].as_str() {
            Some("request") => format!(
                "{} {} → {}{} in {:.1} ms, {} B in / {} B out",
                s("method"),
                s("name"),
                s("outcome"),
                v["code"]
                    .as_i64()
                    .map(|c| format!(" {c}"))
                    .unwrap_or_default(),
                v["latency_us"].as_u64().unwrap_or(0) as f64 / 1000.0,
                v["bytes_in"],
                v["bytes_out"]
            ),
            Some("session_close") => format!(
                "session closed ({}) after {} ms",
                s("ended"),
                v["duration_ms"]
            ),
            Some("trust") => format!("trust: {}", s("action")),
            Some(other) => other.replace('_', " "),
            None => String::new(),
        };
        let _ = writeln!(
            stdout,
            "{} {:<12} {:<12} {detail}",
            mcpmesh::audit::format_time(v["at_ms"].as_u64().unwrap_or(0)),
            s("peer"),
            s("service"),
        );
    }
    let _ = stdout.flush();
}

fn render_summary(summary: &mcpmesh::audit::Summary) -> String {
    if summary.records == 0 {
        return "no audit records in that period".into();
    }
    let mut s = String::new();
    for (title, rows) in [("peer", &summary.peers), ("service", &summary.services)] {
        s.push_str(&format!(
            "{title:<16} {:>8} {:>9} {:>7} {:>8} {:>9} {:>9} {:>10} {:>10}\n",
            "sessions",
            "requests",
            "errors",
            "refused",
            "p50 ms",
            "p99 ms",
            "bytes in",
            "bytes out"
        ));
        for (name, t) in rows {
            s.push_str(&format!(
                "{name:<16} {:>8} {:>9} {:>7} {:>8} {:>9.1} {:>9.1} {:>10} {:>10}\n",
                t.sessions,
                t.requests,
                t.errors,
                t.refused,
                t.p50_ms,
                t.p99_ms,
                t.bytes_in,
                t.bytes_out
            ));
        }
        s.push('\n');
    }
    s.trim_end().to_owned()
}

fn render_peers(v: &Value) -> String {
    let peers = v["peers"].as_array().cloned().unwrap_or_default();
    if peers.is_empty() {
        return "no peers yet. Next: mcpmesh peers add NAME ID --addr HOST:PORT".into();
    }
    let mut s = String::new();
    for p in peers {
        let services: Vec<&str> = p["services"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        s.push_str(&format!(
            "{:<16} {}…  {}  may use: {}\n",
            p["name"].as_str().unwrap_or_default(),
            p["id"]
                .as_str()
                .unwrap_or_default()
                .get(..12)
                .unwrap_or_default(),
            if p["connected"] == json!(true) {
                "connected"
            } else {
                "idle     "
            },
            if services.is_empty() {
                "-".to_owned()
            } else {
                services.join(", ")
            },
        ));
    }
    s.trim_end().to_owned()
}

struct Output {
    json: bool,
}

impl Output {
    fn print(&self, value: Value, human: impl FnOnce() -> String) {
        let mut stdout = std::io::stdout().lock();
        let _ = if self.json {
            writeln!(stdout, "{value}")
        } else {
            writeln!(stdout, "{}", human())
        };
    }
}

fn daemon(profile: Profile, notify: bool) -> Result<(), Failure> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let result = runtime.block_on(mcpmesh::daemon::run(profile, |ready| {
        // One line on stdout once ready; logs go to stderr.
        let id = ready.id.to_string();
        let socket = ready.socket.display().to_string();
        let line = if notify {
            json!({ "ready": true, "id": id, "socket": socket }).to_string()
        } else {
            format!("node {id} is up; control socket {socket}")
        };
        let mut stdout = std::io::stdout().lock();
        let _ = writeln!(stdout, "{line}");
        let _ = stdout.flush();
    }));
    let Err(e) = result else { return Ok(()) };
    let failure = Failure {
        code: Some(e.code()),
        message: e.to_string(),
    };
    if notify {
        // Whoever started us learns why, on the line it waits for.
        println!(
            "{}",
            json!({ "error": { "code": failure.code, "message": failure.message } })
        );
    }
    Err(failure)
}

fn connect(profile: &Profile, exe: &std::path::Path, target: &str) -> Result<(), Failure> {
    let (peer, service) = target.split_once('/').ok_or_else(|| Failure {
        code: Some(codes::INVALID_PARAMS),
        message: format!("expected PEER/SERVICE, got {target:?}"),
    })?;
    let attach = if mcpmesh::proxy::stdio_passable() {
        Attach::Fds
    } else {
        Attach::Stream
    };
    let opened = ControlClient::connect_or_start(profile, exe)
        .and_then(|c| c.open_session(peer, service, attach));
    match opened {
        Ok((stream, leftover)) => {
            match attach {
                Attach::Fds => mcpmesh::proxy::pass_stdio(stream),
                Attach::Stream => mcpmesh::proxy::pipe_stdio(stream, &leftover),
            }
            .context("connect")?;
            Ok(())
        }
        Err(e) => {
            // The client gets a JSON-RPC error for its request, and the reason goes to stderr.
            eprintln!("mcpmesh connect {target}: {}", e.message);
            mcpmesh::proxy::answer_failed_open(e.code, &e.message).context("connect")?;
            Ok(())
        }
    }
}
