use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use mcpmesh::control::client::ControlClient;
use mcpmesh::control::{Attach, codes, methods};
use mcpmesh::paths::Profile;

use crate::doctor::doctor;
use crate::output::{Failure, Output};
use crate::render::{print_record, render_peers, render_record, render_status, render_summary};
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
    /// Serve an MCP server to peers: a stdio command spawned once per session
    /// (`serve NAME -- CMD…`), a long-running server on a Unix socket (`--socket PATH`), or a
    /// Streamable HTTP server (`--url URL`).
    Serve {
        /// The service's name, as peers will mount it (`<this node>/<NAME>`).
        name: String,
        /// Who may use it: a peer name (`NAME` or `peer:NAME`) or a key (`eid:<hex>`);
        /// `user:` and `group:` are reserved for a team roster. Repeatable.
        #[arg(long = "allow", value_name = "PRINCIPAL")]
        allow: Vec<String>,
        /// Sessions running at once (default 4).
        #[arg(long, value_name = "N")]
        max_sessions: Option<u32>,
        /// A Unix socket a running MCP server listens on; one connection per session, the
        /// caller's identity in each request's `params._meta["mcpmesh/peer"]`.
        #[arg(long, value_name = "PATH", conflicts_with_all = ["cmd", "url"])]
        socket: Option<PathBuf>,
        /// A Streamable HTTP MCP server (http:// or https://); one upstream session per mesh
        /// session, the caller's identity in each request's `_meta` as for `--socket`.
        #[arg(long, value_name = "URL", conflicts_with = "cmd")]
        url: Option<String>,
        /// A header sent to `--url`, as NAME=VALUE; `${VAR}` in VALUE is read from the node's
        /// environment when a session starts (for tokens). Repeatable.
        #[arg(long = "header", value_name = "NAME=VALUE", requires = "url")]
        headers: Vec<String>,
        /// The server command and its arguments.
        #[arg(last = true, required_unless_present_any = ["socket", "url"], value_name = "CMD")]
        cmd: Vec<String>,
    },
    /// Stop serving a service (its live sessions end).
    Unserve { name: String },
    /// Mint a one-line invite that shares services with whoever redeems it.
    Invite {
        /// The services to share.
        #[arg(required = true)]
        services: Vec<String>,
        /// How many times it may be redeemed (1 to 64).
        #[arg(long, default_value_t = 1)]
        uses: u32,
        /// How long it stays valid (e.g. 30m, 24h, 7d; at most 7d).
        #[arg(long, default_value = "24h")]
        ttl: String,
    },
    /// Redeem an invite: both nodes trust each other and you can mount the shared services.
    Pair {
        /// The `mcpmesh-invite:…` line.
        invite: String,
        /// What to call the inviter here (default: the name it suggests).
        #[arg(long)]
        name: Option<String>,
    },
    /// Let a peer use one of your services.
    Grant { peer: String, service: String },
    /// Take a peer's access to a service away (its live sessions to it end).
    Revoke { peer: String, service: String },
    /// Print how to mount a peer's service in Claude Code, Claude Desktop, Cursor, VS Code.
    Use {
        /// PEER/SERVICE
        target: String,
    },
    /// What this node serves and to whom, its peers, live sessions, recent pairings.
    Status,
    /// Follow the node live: sessions opening and closing, each request's latency and bytes,
    /// trust changes (with --json, one JSON event per line).
    Watch,
    /// Check config, key and socket permissions, service commands and network settings.
    Doctor,
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions { shell: clap_complete::Shell },
    /// Be the stdio MCP server for a peer's service (what AI clients launch).
    Connect {
        /// PEER/SERVICE
        target: String,
    },
    /// Serve every mountable PEER/SERVICE as a Streamable HTTP MCP endpoint at
    /// http://LISTEN/mcp/PEER/SERVICE, for clients that speak HTTP (runs in the foreground).
    /// Every request must carry this node's gateway token (`Authorization: Bearer …`; `mcpmesh
    /// use PEER/SERVICE` prints it).
    Gateway {
        /// Where to listen: loopback unless --allow-remote.
        #[arg(long, value_name = "ADDR:PORT", default_value = "127.0.0.1:8484")]
        listen: std::net::SocketAddr,
        /// Allow a non-loopback address (never with --no-token).
        #[arg(long)]
        allow_remote: bool,
        /// The bearer token clients must send, instead of this node's own (minted once and
        /// kept in the profile); read from MCPMESH_GATEWAY_TOKEN when not given, to keep it
        /// out of process listings.
        #[arg(
            long,
            value_name = "TOKEN",
            env = "MCPMESH_GATEWAY_TOKEN",
            hide_env_values = true
        )]
        token: Option<String>,
        /// Serve on loopback without a token: every local user can then act as this node
        /// through the gateway.
        #[arg(long, conflicts_with = "token")]
        no_token: bool,
        /// An Origin browsers may call from besides loopback ones (e.g. https://app.example).
        /// Repeatable.
        #[arg(long = "allow-origin", value_name = "ORIGIN")]
        allowed_origins: Vec<String>,
        /// A Host name accepted besides loopback names (for a loopback bind reached through a
        /// local proxy). Repeatable.
        #[arg(long = "allow-host", value_name = "NAME")]
        allowed_hosts: Vec<String>,
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
    /// Give a peer another name (its grants follow).
    Rename { old: String, new: String },
    /// Stop trusting a peer: its grants go and its live connections end at once.
    Remove { name: String },
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
    // iroh's own spans and events stay at warn: entering its per-poll spans was a few percent
    // of the node's CPU per call, and its info lines are not the node's story.
    let default = match command {
        Command::Daemon { .. } => {
            "info,iroh=warn,iroh_relay=warn,noq=warn,noq_proto=warn,netwatch=warn,portmapper=warn"
        }
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
        Command::Daemon { notify } => daemon(profile, notify || out.json),
        Command::DemoServer => {
            crate::stub_server::serve_stdio("mcpmesh-demo", false).context("demo server")?;
            Ok(())
        }
        Command::Demo => {
            if out.json {
                let report =
                    mcpmesh::demo::run(&exe, &mut std::io::sink()).context("demo failed")?;
                out.print(
                    serde_json::to_value(&report).context("rendering")?,
                    String::new,
                );
            } else {
                mcpmesh::demo::run(&exe, &mut std::io::stdout().lock()).context("demo failed")?;
            }
            Ok(())
        }
        Command::Connect { target } => connect(&profile, &exe, &target),
        Command::Gateway {
            listen,
            allow_remote,
            token,
            no_token,
            allowed_origins,
            allowed_hosts,
        } => {
            use mcpmesh::gateway::TokenChoice;
            let token = match (token, no_token) {
                (_, true) => TokenChoice::Waived,
                (Some(t), false) => TokenChoice::Given(t),
                (None, false) => TokenChoice::Profile,
            };
            gateway(
                mcpmesh::gateway::GatewayConfig {
                    listen,
                    token: None,
                    allowed_origins,
                    allowed_hosts,
                    profile,
                    exe,
                },
                allow_remote,
                token,
                &out,
            )
        }
        Command::Audit { action } => audit(&profile, action, &out),
        Command::Up => {
            let started = std::time::Instant::now();
            ControlClient::connect_or_start(&profile, &exe)?;
            let ms = started.elapsed().as_secs_f64() * 1e3;
            let socket = profile.socket_path().display().to_string();
            out.print(
                json!({ "socket": socket, "ms": (ms * 10.0).round() / 10.0 }),
                || format!("node is up in {ms:.0} ms (control socket {socket})"),
            );
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
        Command::Peers {
            action: Some(PeersAction::Rename { old, new }),
        } => {
            let v = call(
                &profile,
                &exe,
                methods::PEERS_RENAME,
                json!({ "old": old, "new": new }),
            )?;
            out.print(v, || format!("{old} is now {new}; its grants followed"));
            Ok(())
        }
        Command::Peers {
            action: Some(PeersAction::Remove { name }),
        } => {
            let v = call(
                &profile,
                &exe,
                methods::PEERS_REMOVE,
                json!({ "name": name }),
            )?;
            out.print(v, || {
                format!("{name} removed: no longer trusted, its connections closed")
            });
            Ok(())
        }
        Command::Unserve { name } => {
            let v = call(
                &profile,
                &exe,
                methods::SERVICES_UNSERVE,
                json!({ "name": name }),
            )?;
            let ended = v["sessions_ended"].as_u64().unwrap_or(0);
            out.print(v, || {
                format!("no longer serving {name} ({ended} live sessions ended)")
            });
            Ok(())
        }
        Command::Grant { peer, service } => {
            let v = call(
                &profile,
                &exe,
                methods::GRANT,
                json!({ "peer": peer, "service": service }),
            )?;
            out.print(v, || format!("{peer} may now use {service}. They mount it with: mcpmesh connect <your name>/{service}"));
            Ok(())
        }
        Command::Revoke { peer, service } => {
            let v = call(
                &profile,
                &exe,
                methods::REVOKE,
                json!({ "peer": peer, "service": service }),
            )?;
            let still = v["granted"] == json!(true);
            out.print(v, || {
                if still {
                    format!("revoked the grant, but {peer} is still admitted to {service} by another allow entry (see config.toml)")
                } else {
                    format!("{peer} may no longer use {service}")
                }
            });
            Ok(())
        }
        Command::Invite {
            services,
            uses,
            ttl,
        } => {
            let ttl = mcpmesh::time::parse_duration(&ttl).ok_or_else(|| Failure {
                code: Some(codes::INVALID_PARAMS),
                message: format!("{ttl:?} is not a duration like 30m, 24h or 7d"),
            })?;
            let started = std::time::Instant::now();
            let v = call(
                &profile,
                &exe,
                methods::INVITE,
                json!({ "services": services, "uses": uses, "ttl_secs": ttl.as_secs() }),
            )?;
            let took = started.elapsed();
            out.print(v.clone(), || {
                format!(
                    "{}\n\nSend this line to the person you are sharing with ({} use{}, valid until {} UTC). They run:\n  mcpmesh pair '<the line>'\n(minted in {:.0} ms)",
                    v["invite"].as_str().unwrap_or_default(),
                    uses,
                    if uses == 1 { "" } else { "s" },
                    mcpmesh::time::format_time(v["expires_at"].as_u64().unwrap_or(0) * 1000),
                    took.as_secs_f64() * 1e3
                )
            });
            Ok(())
        }
        Command::Pair { invite, name } => {
            let started = std::time::Instant::now();
            let v = call(
                &profile,
                &exe,
                methods::PAIR,
                json!({ "invite": invite, "name": name }),
            )?;
            let took = started.elapsed();
            out.print(v.clone(), || {
                let peer = v["peer"].as_str().unwrap_or_default();
                let mounts: Vec<&str> = v["mounts"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str)
                    .collect();
                let mut s = format!(
                    "paired with {peer} in {:.0} ms. Check that {peer} sees the same code: {}\n",
                    took.as_secs_f64() * 1e3,
                    v["code"].as_str().unwrap_or_default()
                );
                for m in &mounts {
                    s.push_str(&format!("you can mount {m}: mcpmesh use {m}\n"));
                }
                s.trim_end().to_owned()
            });
            Ok(())
        }
        Command::Use { target } => use_lines(&profile, &exe, &target, &out),
        Command::Status => {
            let v = call(&profile, &exe, methods::STATUS, json!({}))?;
            out.print(v.clone(), || render_status(&v));
            Ok(())
        }
        Command::Doctor => doctor(&profile, &out),
        Command::Watch => {
            let events = ControlClient::connect_or_start(&profile, &exe)?.watch()?;
            // Printed once subscribed: every event after this line is shown.
            if out.json {
                println!("{}", json!({ "watching": true }));
            } else {
                println!(
                    "watching {} (Ctrl-C to stop)",
                    profile.socket_path().display()
                );
            }
            for event in events {
                match event["method"].as_str() {
                    Some("event") => print_record(&event["params"], out.json),
                    Some("lagged") if !out.json => println!(
                        "… {} events skipped (too fast to show)",
                        event["params"]["missed"]
                    ),
                    _ if out.json => print_record(&event, true),
                    _ => {}
                }
            }
            Ok(())
        }
        Command::Completions { shell } => {
            use clap::CommandFactory;
            clap_complete::generate(
                shell,
                &mut Cli::command(),
                "mcpmesh",
                &mut std::io::stdout(),
            );
            Ok(())
        }
        Command::Serve {
            name,
            allow,
            max_sessions,
            socket,
            url,
            headers,
            cmd,
        } => {
            let mut params = json!({ "name": name, "allow": allow, "max_sessions": max_sessions });
            if let Some(path) = socket {
                let path = std::path::absolute(&path)
                    .with_context(|| format!("socket path {}", path.display()))?;
                params["socket"] = json!(path);
            } else if let Some(url) = url {
                let mut map = serde_json::Map::new();
                for h in &headers {
                    let (k, v) = h
                        .split_once('=')
                        .with_context(|| format!("--header {h:?}: expected NAME=VALUE"))?;
                    map.insert(k.trim().to_owned(), json!(v));
                }
                params["url"] = json!(url);
                params["headers"] = Value::Object(map);
            } else {
                params["run"] = json!(cmd);
            }
            let mut client = ControlClient::connect_or_start(&profile, &exe)?;
            let v = client.call(methods::SERVICES_SERVE, params)?;
            let node = client.node_id().to_owned();
            out.print(json!({ "service": v["service"], "serving": true }), || {
                let peers: Vec<&str> = v["allowed_peers"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
                if peers.is_empty() {
                    format!("serving {name}, to nobody yet. Next: mcpmesh invite {name}  (a one-line invite to send to whoever should use it)")
                } else {
                    format!(
                        "serving {name} to {} (this node is {}…). To share it with someone new: mcpmesh invite {name}",
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
                None if report.repairs.is_empty() => {
                    format!("audit log intact: {} records", report.records)
                }
                None => format!(
                    "audit log intact: {} records; repairs the node made after a crash:\n  {}",
                    report.records,
                    report.repairs.join("\n  ")
                ),
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
                    let d = mcpmesh::time::parse_duration(&text).ok_or_else(|| Failure {
                        code: Some(codes::INVALID_PARAMS),
                        message: format!("{text:?} is not a duration like 30m, 24h or 7d"),
                    })?;
                    mcpmesh::time::unix_ms().saturating_sub(d.as_millis() as u64)
                }
            };
            let summary = audit::summarize(&dir, since_ms).context("reading the audit log")?;
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
            let (last, mut cursor) =
                audit::tail(&dir, lines, wanted).context("reading the audit log")?;
            if !follow {
                // One JSON value when the answer is complete; JSON Lines only when streaming.
                out.print(json!({ "records": last }), || {
                    last.iter()
                        .map(render_record)
                        .collect::<Vec<_>>()
                        .join("\n")
                });
                return Ok(());
            }
            for v in &last {
                print_record(v, out.json);
            }
            // Only what was added since is read, from where the last read ended.
            loop {
                std::thread::sleep(std::time::Duration::from_millis(250));
                audit::follow(&dir, &mut cursor, |v| {
                    if wanted(&v) {
                        print_record(&v, out.json);
                    }
                })
                .context("reading the audit log")?;
            }
        }
    }
}

/// One request to the node (started if needed).
fn call(
    profile: &Profile,
    exe: &std::path::Path,
    method: &str,
    params: Value,
) -> Result<Value, Failure> {
    let mut client = ControlClient::connect_or_start(profile, exe)?;
    Ok(client.call(method, params)?)
}

/// `mcpmesh use PEER/SERVICE`: the lines that mount it in common AI clients.
fn use_lines(
    profile: &Profile,
    exe: &std::path::Path,
    target: &str,
    out: &Output,
) -> Result<(), Failure> {
    let (peer, service) = target.split_once('/').ok_or_else(|| Failure {
        code: Some(codes::INVALID_PARAMS),
        message: format!("expected PEER/SERVICE, got {target:?}"),
    })?;
    let peers = call(profile, exe, methods::PEERS_LIST, json!({}))?;
    let known = peers["peers"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["name"] == peer);
    let Some(known) = known else {
        return Err(Failure {
            code: Some(codes::NOT_FOUND),
            message: format!("no peer named {peer:?}; see `mcpmesh peers`"),
        });
    };
    let mut args: Vec<String> = Vec::new();
    if let Some(home) = &profile.home {
        args.extend(["--home".to_owned(), home.display().to_string()]);
    }
    args.extend(["connect".to_owned(), target.to_owned()]);
    let command = exe.display().to_string();
    let name = format!("{peer}-{service}");
    let shell_line = std::iter::once(command.clone())
        .chain(args.iter().cloned())
        .collect::<Vec<_>>()
        .join(" ");
    let claude = format!("claude mcp add {name} -- {shell_line}");
    let entry = json!({ "command": command, "args": args });
    let granted = known["mounts"]
        .as_array()
        .is_some_and(|m| m.iter().any(|s| s == service));
    let http_url = format!("http://127.0.0.1:8484/mcp/{target}");
    let mut gateway_line = vec![command.clone()];
    if let Some(home) = &profile.home {
        gateway_line.extend(["--home".to_owned(), home.display().to_string()]);
    }
    gateway_line.push("gateway".to_owned());
    let gateway_line = gateway_line.join(" ");
    // The gateway's own token, minted now if it has none, so these lines stay right for it.
    let token = profile
        .create_dirs()
        .map_err(|e| e.to_string())
        .and_then(|()| {
            mcpmesh::gateway::token::load_or_mint(&profile.gateway_token_file())
                .map_err(|e| e.to_string())
        });
    let mut value = json!({
        "target": target,
        "name": name,
        "command": command,
        "args": args,
        "claude_code": claude,
        "mcpServers": { name.clone(): entry.clone() },
        "known_grant": granted,
        "http_url": http_url,
    });
    let http_header = match &token {
        Ok(token) => {
            value["http_token"] = json!(token);
            value["http_headers"] = json!({ "Authorization": format!("Bearer {token}") });
            format!("\nwith the header\n  Authorization: Bearer {token}")
        }
        Err(e) => format!("\n(the gateway's token is not available: {e})"),
    };
    out.print(value, || {
        let mut s = format!(
            "Claude Code:\n  {claude}\n\nClaude Desktop, Cursor, VS Code (\"mcpServers\" in their MCP settings):\n  \"{name}\": {entry}\n\nAny other stdio MCP client: run\n  {shell_line}\n\nA client that speaks Streamable HTTP: keep `{gateway_line}` running (it listens on 127.0.0.1:8484), then use\n  {http_url}{http_header}"
        );
        if !granted && known["source"] == "paired" {
            s.push_str(&format!("\n\nnote: {peer} did not list {service} when you paired; it may refuse."));
        }
        s
    });
    Ok(())
}

fn gateway(
    mut config: mcpmesh::gateway::GatewayConfig,
    allow_remote: bool,
    token: mcpmesh::gateway::TokenChoice,
    out: &Output,
) -> Result<(), Failure> {
    use mcpmesh::gateway::{self, TokenChoice};
    let failed = |e: gateway::GatewayError| Failure {
        code: Some(codes::INVALID_PARAMS),
        message: e.to_string(),
    };
    gateway::check_bind(config.listen, allow_remote, &token).map_err(failed)?;
    // Where the token is, for people and scripts; never the token itself.
    let token_file = (token == TokenChoice::Profile)
        .then(|| config.profile.gateway_token_file().display().to_string());
    let token_note = match &token_file {
        Some(file) => format!(
            "requests must carry `Authorization: Bearer <the token in {file}>` (`mcpmesh use PEER/SERVICE` prints it)"
        ),
        None if token == TokenChoice::Waived => {
            "no token (--no-token): every local user can act as this node through it".to_owned()
        }
        None => "requests must carry `Authorization: Bearer <the token you gave>`".to_owned(),
    };
    let token_required = token != TokenChoice::Waived;
    config.token = gateway::resolve_token(token, &config.profile).map_err(failed)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async {
        let listener = gateway::bind(&config).await.map_err(failed)?;
        let addr = listener.local_addr().context("the gateway's address")?;
        let base = format!("http://{addr}/mcp");
        let mut ready = json!({ "listening": addr.to_string(), "url": base, "token_required": token_required });
        if let Some(file) = &token_file {
            ready["token_file"] = json!(file);
        }
        out.print(ready, || {
            format!("gateway listening: mount PEER/SERVICE at {base}/PEER/SERVICE (Ctrl-C stops it)\n{token_note}")
        });
        let _ = std::io::stdout().flush();
        let shutdown = tokio_util::sync::CancellationToken::new();
        let stop = shutdown.clone();
        tokio::spawn(async move {
            let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {}
            }
            stop.cancel();
        });
        gateway::serve(listener, config, shutdown).await.map_err(failed)
    })
}

fn daemon(profile: Profile, notify: bool) -> Result<(), Failure> {
    if let Some(mut tuned) = mcpmesh::memory::restart_tuned() {
        // Started by hand without the allocator setting: become the same node with it.
        use std::os::unix::process::CommandExt;
        let e = tuned.exec(); // returns only if it failed
        tracing::warn!("running without the allocator setting (restarting with it failed: {e})");
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let launcher = crate::exec_shim::launcher();
    let result = runtime.block_on(mcpmesh::daemon::run(profile, launcher, |ready| {
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
    let started = std::time::Instant::now();
    let opened = ControlClient::connect_or_start(profile, exe)
        .and_then(|c| c.open_session(peer, service, attach));
    match opened {
        Ok((stream, leftover)) => {
            // One line for the client's log: how long the mesh took to be ready (node start,
            // dial and session included).
            // One write: stderr is unbuffered, and a formatted eprintln! is one write per piece.
            let note = format!(
                "mcpmesh connect {target}: session open in {:.1} ms\n",
                started.elapsed().as_secs_f64() * 1e3
            );
            let _ = std::io::stderr().write_all(note.as_bytes());
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
