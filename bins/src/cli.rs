//! What each verb does: one function per verb, each parsing nothing (clap did, in `args`)
//! and rendering its answer through `Output`.

use std::io::{IsTerminal, Write};
use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use mcpmesh::control::client::ControlClient;
use mcpmesh::control::{Attach, codes, methods};
use mcpmesh::paths::Profile;
use serde_json::{Value, json};

use crate::args::{AuditAction, Cli, Command, GatewayArgs, PeersAction, ServeArgs, wants_json};
use crate::ctx::{Ctx, parse_duration, positive_duration};
use crate::doctor::doctor;
use crate::output::{Failure, Output};
use crate::render::{
    print_record, render_peers, render_record, render_status, render_summary, strings,
};

pub fn main() -> ExitCode {
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let json_mode = wants_json(&argv);
    let cli = match Cli::try_parse_from(&argv) {
        Ok(cli) => cli,
        // Help and version are answers, not failures.
        Err(e) if !e.use_stderr() => {
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) if json_mode => {
            Failure::new(codes::USAGE, usage_message(&e)).report(true);
            return ExitCode::FAILURE;
        }
        Err(e) => e.exit(),
    };
    init_logging(&cli);
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            f.report(json_mode);
            ExitCode::FAILURE
        }
    }
}

/// A clap error as one line: what is wrong, without the usage block clap appends.
fn usage_message(e: &clap::Error) -> String {
    let text = e.render().to_string();
    let what = text.split("\n\nUsage:").next().unwrap_or_default();
    let what = what.trim().trim_start_matches("error: ");
    let what = what.split_whitespace().collect::<Vec<_>>().join(" ");
    format!("{what} (see `mcpmesh --help`)")
}

fn init_logging(cli: &Cli) {
    // iroh's own spans and events stay at warn: entering its per-poll spans was a few percent
    // of the node's CPU per call, and its info lines are not the node's story.
    let default = match &cli.command {
        Command::Daemon { .. } => {
            "info,iroh=warn,iroh_relay=warn,noq=warn,noq_proto=warn,netwatch=warn,portmapper=warn"
        }
        _ => "warn",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("MCPMESH_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    if let Command::Daemon { log_file: true, .. } = &cli.command
        && let Ok(profile) = Profile::resolve(cli.home.clone())
    {
        let path = profile.log_file();
        let max = mcpmesh::logfile::max_bytes_from_env();
        // An untrusted profile gets no log of ours: the node refuses it on stderr.
        let opened = profile
            .create_dirs()
            .and_then(|()| profile.check_trusted().map_err(std::io::Error::other))
            .and_then(|()| mcpmesh::logfile::LogFile::open(&path, max, true));
        match opened {
            Ok(file) => {
                let _ = builder
                    .with_ansi(false)
                    .with_writer(std::sync::Mutex::new(file))
                    .try_init();
                return;
            }
            Err(e) => eprintln!("cannot open the node log {}: {e}", path.display()),
        }
    }
    // Colour only for a person at a terminal; a service manager's journal gets plain text.
    let _ = builder
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .try_init();
}

/// Whether a verb may create the profile it is pointed at. Every other verb refuses a
/// `--home` (or `MCPMESH_HOME`) that holds no profile: a mistyped directory would otherwise
/// become a new identity.
fn creates_profile(command: &Command) -> bool {
    matches!(
        command,
        Command::Init { .. }
            | Command::Up
            | Command::Id { .. }
            | Command::Daemon { .. }
            | Command::Demo
            | Command::DemoServer
            | Command::Completions { .. }
    )
}

/// Whether a verb reads the profile it is pointed at (and so must trust it first). `doctor`
/// reads it to report what is wrong, and says so itself.
fn reads_profile(command: &Command) -> bool {
    !matches!(
        command,
        Command::Demo | Command::DemoServer | Command::Completions { .. } | Command::Doctor { .. }
    )
}

fn run(cli: Cli) -> Result<(), Failure> {
    let profile = Profile::resolve(cli.home.clone()).context("locating the node's files")?;
    let exe = std::env::current_exe().context("locating the mcpmesh executable")?;
    let out = Output { json: cli.json };
    check_profile(&profile, &cli.command)?;
    let ctx = Ctx {
        profile: &profile,
        exe: &exe,
        out: &out,
    };
    run_verb(&ctx, cli.command)
}

/// Refuses a profile the verb may not use: one it reads that is not trusted, or a `--home`
/// that holds none when the verb does not create one.
fn check_profile(profile: &Profile, command: &Command) -> Result<(), Failure> {
    if reads_profile(command) {
        profile
            .check_trusted()
            .map_err(|e| Failure::new(codes::CONFIG, e.to_string()))?;
    }
    if let Some(home) = &profile.home
        && !creates_profile(command)
        && !profile.exists()
    {
        return Err(Failure::new(
            codes::NOT_FOUND,
            format!(
                "no mcpmesh profile in {} (is the directory right?). To make one there: mcpmesh --home {} init",
                home.display(),
                home.display()
            ),
        ));
    }
    Ok(())
}

/// The verb asked for, handed to the function that does it.
fn run_verb(ctx: &Ctx, command: Command) -> Result<(), Failure> {
    match command {
        Command::Init { loopback, nickname } => init(ctx, loopback, nickname.as_deref()),
        Command::Daemon { notify, .. } => daemon(ctx.profile.clone(), notify, ctx.out.json),
        Command::DemoServer => {
            crate::demo_server::serve_stdio("mcpmesh-demo").context("demo server")?;
            Ok(())
        }
        Command::Demo => demo(ctx),
        Command::Connect { target } => connect(ctx.profile, ctx.exe, &target, ctx.out.json),
        Command::Hub {
            targets,
            idle,
            names,
        } => hub(ctx.profile, ctx.exe, &targets, &idle, names),
        Command::Gateway(flags) => gateway(ctx, flags),
        Command::Audit { action } => audit(ctx.profile, action, ctx.out),
        Command::Up => up(ctx),
        Command::Down => down(ctx),
        Command::Id { jwks: false } => id(ctx),
        Command::Id { jwks: true } => id_jwks(ctx),
        Command::Peers { action } => peers(ctx, action),
        Command::Unserve { name } => unserve(ctx, &name),
        Command::Grant {
            peer,
            service,
            tools,
        } => grant(ctx, &peer, &service, tools),
        Command::Revoke {
            peer,
            service,
            tools,
        } => revoke(ctx, &peer, &service, tools),
        Command::Invite {
            services,
            uses,
            ttl,
        } => invite(ctx, &services, uses, &ttl),
        Command::Pair { invite, name } => pair(ctx, &invite, name.as_deref()),
        Command::Join { invite, device } => crate::org::join(ctx, &invite, device.as_deref()),
        Command::Org { action } => crate::org::run(ctx, action),
        Command::Use {
            target: Some(target),
        } => crate::mount::use_lines(ctx.profile, ctx.exe, &target, ctx.out),
        Command::Use { target: None } => crate::mount::mountable(ctx),
        Command::Services { refresh } => services_list(ctx, refresh),
        Command::Status { web: false } => status(ctx),
        Command::Status { web: true } => status_web(ctx),
        Command::Doctor { offline } => doctor(ctx.profile, offline, ctx.out),
        Command::Watch => watch(ctx),
        Command::Completions { shell } => completions(shell, ctx.out),
        Command::Auth {
            name,
            browser,
            redirect_url,
            status,
            logout,
        } => crate::auth::run(
            ctx.profile,
            ctx.out,
            crate::auth::Auth {
                name,
                browser,
                redirect_url,
                status,
                logout,
            },
        ),
        Command::Serve(flags) => serve(ctx, Serve::from_flags(flags)?),
    }
}

fn init(ctx: &Ctx, loopback: bool, nickname: Option<&str>) -> Result<(), Failure> {
    let profile = ctx.profile;
    let config = profile.config_file();
    if profile.exists() {
        return Err(Failure::new(
            codes::CONFLICT,
            format!(
                "a profile already exists here ({}); `mcpmesh id` shows its identity",
                config.display()
            ),
        ));
    }
    profile
        .create_dirs()
        .context("creating the profile's directories")?;
    let mut text = String::new();
    if let Some(nick) = nickname {
        text.push_str(&format!("[identity]\nnickname = {}\n\n", json!(nick)));
    }
    if loopback {
        text.push_str("[network]\nrelay_mode = \"disabled\"\nbind = \"127.0.0.1:0\"\n");
    }
    // Private from the start: service env may come to hold tokens (doctor checks it).
    let created = mcpmesh::files::create_private_once(&config, text.as_bytes())
        .with_context(|| format!("writing {}", config.display()))?;
    if !created {
        return Err(Failure::new(
            codes::CONFLICT,
            format!(
                "a profile was made here meanwhile ({}); `mcpmesh id` shows its identity",
                config.display()
            ),
        ));
    }
    // The identity is minted here, but no node is started: the user may edit the config
    // (relays, bind) before the node first goes on the network.
    let key = mcpmesh::keys::load_or_create(&profile.key_file())
        .map_err(|e| Failure::new(codes::LOCAL, e.to_string()))?;
    let id = key.public().to_string();
    let value = json!({ "id": id, "config": config.display().to_string(), "running": false });
    ctx.out.print(value, || {
        format!(
            "created a profile in {}\nthis node is {id}{}",
            config.parent().unwrap_or(&config).display(),
            if loopback {
                " (loopback only, no relays)"
            } else {
                ""
            }
        )
    });
    ctx.out.note(|| {
        format!(
            "No node runs yet: edit {} if you like (relays, bind), then run `mcpmesh up`, or any verb (it starts the node), e.g. mcpmesh serve NAME -- COMMAND…",
            config.display()
        )
    });
    Ok(())
}

fn demo(ctx: &Ctx) -> Result<(), Failure> {
    if ctx.out.json {
        let report = mcpmesh::demo::run(ctx.exe, &mut std::io::sink()).context("demo failed")?;
        ctx.out.print(
            serde_json::to_value(&report).context("rendering")?,
            String::new,
        );
    } else {
        mcpmesh::demo::run(ctx.exe, &mut std::io::stdout().lock()).context("demo failed")?;
    }
    Ok(())
}

fn up(ctx: &Ctx) -> Result<(), Failure> {
    let started = std::time::Instant::now();
    ControlClient::connect_or_start(ctx.profile, ctx.exe)?;
    let ms = started.elapsed().as_secs_f64() * 1e3;
    let socket = ctx.profile.socket_path().display().to_string();
    ctx.out.print(
        json!({ "socket": socket, "ms": (ms * 10.0).round() / 10.0 }),
        || format!("node is up in {ms:.0} ms (control socket {socket})"),
    );
    Ok(())
}

fn down(ctx: &Ctx) -> Result<(), Failure> {
    let was_running = ControlClient::shutdown(ctx.profile)?;
    ctx.out.print(
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

fn id(ctx: &Ctx) -> Result<(), Failure> {
    let v = ctx.call(methods::NODE_ID, json!({}))?;
    // The id alone on stdout, for `$(mcpmesh id)`; the addresses beside it on stderr.
    ctx.out.print(v.clone(), || {
        v["id"].as_str().unwrap_or_default().to_owned()
    });
    ctx.out.note(|| {
        let addrs = strings(&v["addrs"]);
        format!("addresses: {}", addrs.join(" "))
    });
    Ok(())
}

/// The running node's key as a JWKS document: the same JSON with or without `--json`, since it
/// is meant to be saved and pinned.
fn id_jwks(ctx: &Ctx) -> Result<(), Failure> {
    let v = ctx.call(methods::NODE_ID, json!({}))?;
    let jwks = v["id"]
        .as_str()
        .and_then(mcpmesh::assertion::jwks_of)
        .ok_or_else(|| anyhow::anyhow!("the node answered without a valid id"))?;
    let jwks =
        serde_json::to_value(jwks).map_err(|e| anyhow::anyhow!("cannot write the JWKS: {e}"))?;
    ctx.out.print(jwks.clone(), || {
        serde_json::to_string_pretty(&jwks).unwrap_or_default()
    });
    Ok(())
}

/// `mcpmesh peers` and its subverbs.
fn peers(ctx: &Ctx, action: Option<PeersAction>) -> Result<(), Failure> {
    match action {
        None => peers_list(ctx),
        Some(PeersAction::Add { name, id, addrs }) => peers_add(ctx, &name, &id, &addrs),
        Some(PeersAction::Rename { old, new }) => peers_rename(ctx, &old, &new),
        Some(PeersAction::Remove { name }) => peers_remove(ctx, &name),
    }
}

fn peers_list(ctx: &Ctx) -> Result<(), Failure> {
    let v = ctx.call(methods::PEERS_LIST, json!({}))?;
    ctx.out.print(v.clone(), || render_peers(&v));
    Ok(())
}

fn services_list(ctx: &Ctx, refresh: bool) -> Result<(), Failure> {
    let v = ctx.call(methods::SERVICES_LIST, json!({ "refresh": refresh }))?;
    ctx.out
        .print(v.clone(), || crate::render::services(&v["services"]));
    Ok(())
}

fn peers_add(ctx: &Ctx, name: &str, id: &str, addrs: &[String]) -> Result<(), Failure> {
    let addrs = resolve_addrs(addrs)?;
    let v = ctx.call(
        methods::PEERS_ADD,
        json!({ "name": name, "id": id, "addrs": addrs }),
    )?;
    ctx.out.print(json!({ "peer": v["peer"], "id": v["id"] }), || {
        format!("trusting {name}. Next: mcpmesh serve SERVICE --allow {name} -- COMMAND…, or mcpmesh connect {name}/SERVICE")
    });
    Ok(())
}

/// `--addr` values as IP:PORT: an IP address is kept, a host name is resolved now (to every
/// address it has).
fn resolve_addrs(addrs: &[String]) -> Result<Vec<String>, Failure> {
    use std::net::{SocketAddr, ToSocketAddrs};
    let mut resolved = Vec::new();
    for a in addrs {
        if let Ok(addr) = a.parse::<SocketAddr>() {
            resolved.push(addr.to_string());
            continue;
        }
        let has_port = a
            .rsplit_once(':')
            .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
        if !has_port {
            return Err(Failure::new(
                codes::INVALID_PARAMS,
                format!(
                    "--addr {a:?}: expected HOST:PORT or IP:PORT, like 192.0.2.7:4433 or bob.lan:4433 (`mcpmesh id` on the peer prints its addresses)"
                ),
            ));
        }
        let found: Vec<SocketAddr> = a
            .to_socket_addrs()
            .map_err(|e| {
                Failure::new(
                    codes::INVALID_PARAMS,
                    format!("--addr {a:?}: the host name could not be resolved ({e})"),
                )
            })?
            .collect();
        if found.is_empty() {
            return Err(Failure::new(
                codes::INVALID_PARAMS,
                format!("--addr {a:?}: the host name has no address"),
            ));
        }
        resolved.extend(found.iter().map(SocketAddr::to_string));
    }
    Ok(resolved)
}

fn peers_rename(ctx: &Ctx, old: &str, new: &str) -> Result<(), Failure> {
    let v = ctx.call(methods::PEERS_RENAME, json!({ "old": old, "new": new }))?;
    ctx.out
        .print(v, || format!("{old} is now {new}; its grants followed"));
    Ok(())
}

fn peers_remove(ctx: &Ctx, name: &str) -> Result<(), Failure> {
    let v = ctx.call(methods::PEERS_REMOVE, json!({ "name": name }))?;
    ctx.out.print(v, || {
        format!("{name} removed: no longer trusted, its connections closed")
    });
    Ok(())
}

fn unserve(ctx: &Ctx, name: &str) -> Result<(), Failure> {
    let v = ctx.call(methods::SERVICES_UNSERVE, json!({ "name": name }))?;
    let ended = v["sessions_ended"].as_u64().unwrap_or(0);
    ctx.out.print(v, || {
        format!("no longer serving {name} ({ended} live sessions ended)")
    });
    Ok(())
}

fn grant(ctx: &Ctx, peer: &str, service: &str, tools: Option<Vec<String>>) -> Result<(), Failure> {
    let mut params = json!({ "peer": peer, "service": service });
    if let Some(tools) = &tools {
        params["tools"] = json!(tools);
    }
    let v = ctx.call(methods::GRANT, params)?;
    let access = crate::render::tool_access(&v["tools"]);
    let warning = v["warning"]
        .as_str()
        .map(|w| format!("\nwarning: {w}"))
        .unwrap_or_default();
    ctx.out.print(v.clone(), || match tools {
        Some(_) => format!("{peer} may now use {service}, and of its tools {access}. They mount it with: mcpmesh connect <your name>/{service}{warning}"),
        None => format!("{peer} may now use {service}. They mount it with: mcpmesh connect <your name>/{service}{warning}"),
    });
    Ok(())
}

fn revoke(ctx: &Ctx, peer: &str, service: &str, tools: Option<Vec<String>>) -> Result<(), Failure> {
    let mut params = json!({ "peer": peer, "service": service });
    if let Some(tools) = &tools {
        params["tools"] = json!(tools);
    }
    let v = ctx.call(methods::REVOKE, params)?;
    let still = v["granted"] == json!(true);
    let access = crate::render::tool_access(&v["tools"]);
    ctx.out.print(v, || {
        if let Some(tools) = tools {
            format!("{peer} may no longer use {} on {service}; of its tools they may use {access}", tools.join(", "))
        } else if still {
            format!("revoked the grant, but {peer} is still admitted to {service} by another allow entry (see config.toml)")
        } else {
            format!("{peer} may no longer use {service}")
        }
    });
    Ok(())
}

fn invite(ctx: &Ctx, services: &[String], uses: u32, ttl: &str) -> Result<(), Failure> {
    let ttl = parse_duration(ttl)?;
    let started = std::time::Instant::now();
    let v = ctx.call(
        methods::INVITE,
        json!({ "services": services, "uses": uses, "ttl_secs": ttl.as_secs() }),
    )?;
    let took = started.elapsed();
    // The line alone on stdout, so that `pair "$(mcpmesh invite …)"` works; hints on stderr.
    ctx.out.print(v.clone(), || {
        v["invite"].as_str().unwrap_or_default().to_owned()
    });
    ctx.out.note(|| {
        format!(
            "Send this line to the person you are sharing with ({} use{}, valid until {} UTC). They run:\n  mcpmesh pair '<the line>'\n(minted in {:.0} ms)",
            uses,
            if uses == 1 { "" } else { "s" },
            mcpmesh::time::format_time(v["expires_at"].as_u64().unwrap_or(0) * 1000),
            took.as_secs_f64() * 1e3
        )
    });
    Ok(())
}

fn pair(ctx: &Ctx, invite: &str, name: Option<&str>) -> Result<(), Failure> {
    let started = std::time::Instant::now();
    let v = ctx.call(methods::PAIR, json!({ "invite": invite, "name": name }))?;
    let took = started.elapsed();
    ctx.out.print(v.clone(), || {
        let peer = v["peer"].as_str().unwrap_or_default();
        let mounts = strings(&v["mounts"]);
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

fn status(ctx: &Ctx) -> Result<(), Failure> {
    let mut v = ctx.call(methods::STATUS, json!({}))?;
    // The node answers from the config it last loaded: say when the file has since broken.
    let config = mcpmesh::config::ConfigFile::new(ctx.profile.config_file());
    if let Err(e) = config.load() {
        v["config_error"] = json!(e.to_string());
    }
    ctx.out.print(v.clone(), || render_status(&v));
    if let Some(error) = v["config_error"].as_str() {
        ctx.out.note(|| {
            format!(
                "warning: the config file does not load ({error}); the node runs on the config it last loaded until the file is fixed (`mcpmesh doctor` checks it)"
            )
        });
    }
    Ok(())
}

fn status_web(ctx: &Ctx) -> Result<(), Failure> {
    let v = ctx.call(methods::STATUS_WEB, json!({}))?;
    // The URL alone on stdout, for `xdg-open "$(mcpmesh status --web)"`.
    ctx.out.print(v.clone(), || {
        v["url"].as_str().unwrap_or_default().to_owned()
    });
    ctx.out
        .note(|| "open the status page at the URL above (it holds its token)".to_owned());
    Ok(())
}

fn watch(ctx: &Ctx) -> Result<(), Failure> {
    let events = ControlClient::connect_or_start(ctx.profile, ctx.exe)?.watch()?;
    // Printed once subscribed: every event after this line is shown.
    if ctx.out.json {
        println!("{}", json!({ "watching": true }));
    } else {
        println!(
            "watching {} (Ctrl-C to stop)",
            ctx.profile.socket_path().display()
        );
    }
    for event in events {
        match event["method"].as_str() {
            Some("event") => print_record(&event["params"], ctx.out.json),
            Some("lagged") if !ctx.out.json => println!(
                "… {} events skipped (too fast to show)",
                event["params"]["missed"]
            ),
            _ if ctx.out.json => print_record(&event, true),
            _ => {}
        }
    }
    // The stream ends only when the node goes away.
    Err(Failure::new(codes::NODE_UNAVAILABLE, "the node stopped"))
}

fn completions(shell: clap_complete::Shell, out: &Output) -> Result<(), Failure> {
    use clap::CommandFactory;
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "mcpmesh", &mut script);
    let script = String::from_utf8(script).context("rendering the completion script")?;
    out.print(
        json!({ "shell": shell.to_string(), "script": script }),
        || script.trim_end().to_owned(),
    );
    Ok(())
}

enum Backend {
    Run(Vec<String>),
    Socket {
        path: std::path::PathBuf,
        caller_assertion: bool,
    },
    Url {
        url: String,
        /// NAME=VALUE, as given.
        headers: Vec<String>,
        caller_header: Option<String>,
        no_caller_assertion: bool,
        oauth: bool,
        /// How the node registers as the OAuth client, when a flag said.
        oauth_client: Option<Value>,
    },
}

struct Serve {
    name: String,
    allow: Vec<String>,
    max_sessions: Option<u32>,
    description: Option<String>,
    replace: bool,
    backend: Backend,
    /// KEY=VALUE, as given.
    env: Vec<String>,
}

impl Serve {
    /// What `serve`'s flags ask for, refusing flags given without the backend they go with.
    fn from_flags(flags: ServeArgs) -> Result<Self, Failure> {
        let oauth_client = oauth_client(&flags)?;
        let url_only = !flags.headers.is_empty()
            || flags.caller_header.is_some()
            || flags.no_caller_assertion
            || flags.oauth
            || oauth_client.is_some();
        if flags.url.is_none() && url_only {
            return Err(Failure::new(
                codes::USAGE,
                "--header, --caller-header, --no-caller-assertion, --oauth and its client flags go with --url",
            ));
        }
        if flags.socket.is_none() && flags.caller_assertion {
            return Err(Failure::new(
                codes::USAGE,
                "--caller-assertion goes with --socket (a --url service gets one unless --no-caller-assertion)",
            ));
        }
        let backend = match (flags.socket, flags.url) {
            (Some(path), _) => Backend::Socket {
                path,
                caller_assertion: flags.caller_assertion,
            },
            (None, Some(url)) => Backend::Url {
                url,
                headers: flags.headers,
                caller_header: flags.caller_header,
                no_caller_assertion: flags.no_caller_assertion,
                oauth: flags.oauth,
                oauth_client,
            },
            (None, None) => Backend::Run(flags.cmd),
        };
        Ok(Serve {
            name: flags.name,
            allow: flags.allow,
            max_sessions: flags.max_sessions,
            description: flags.description,
            replace: flags.replace,
            backend,
            env: flags.env,
        })
    }
}

/// How the node registers as the OAuth client of a `--url` service, when a flag said: the
/// secret read from its file now, the key file by its absolute path (it is read at each
/// token request).
fn oauth_client(flags: &ServeArgs) -> Result<Option<Value>, Failure> {
    let given = flags.client_id.is_some()
        || flags.client_metadata_url.is_some()
        || !flags.scopes.is_empty();
    if !given {
        return Ok(None);
    }
    let client_secret = flags
        .client_secret_file
        .as_deref()
        .map(read_secret_file)
        .transpose()?;
    let client_key = flags
        .client_key_file
        .as_deref()
        .map(|p| std::path::absolute(p).map_err(|e| Failure::from(anyhow::Error::from(e))))
        .transpose()?;
    Ok(Some(json!({
        "client_id": flags.client_id,
        "client_secret": client_secret,
        "client_metadata_url": flags.client_metadata_url,
        "scopes": flags.scopes,
        "client_credentials": flags.client_credentials,
        "client_key": client_key,
    })))
}

/// The secret in `path` (one line; surrounding whitespace dropped).
fn read_secret_file(path: &std::path::Path) -> Result<String, Failure> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("--client-secret-file {}", path.display()))?;
    let secret = text.trim();
    if secret.is_empty() || secret.contains(['\n', '\r']) {
        return Err(Failure::new(
            codes::INVALID_PARAMS,
            format!(
                "--client-secret-file {}: expected the secret alone on one line",
                path.display()
            ),
        ));
    }
    Ok(secret.to_owned())
}

/// `NAME=VALUE` pairs of a repeatable `flag`, as a JSON object.
fn pairs(flag: &str, given: &[String]) -> Result<Value, Failure> {
    let mut map = serde_json::Map::new();
    for pair in given {
        let (k, v) = pair.split_once('=').ok_or_else(|| {
            Failure::new(
                codes::INVALID_PARAMS,
                format!("{flag} {pair:?}: expected NAME=VALUE"),
            )
        })?;
        map.insert(k.trim().to_owned(), json!(v));
    }
    Ok(Value::Object(map))
}

fn serve(ctx: &Ctx, serve: Serve) -> Result<(), Failure> {
    let name = serve.name.clone();
    let params = serve.params()?;
    let mut client = ControlClient::connect_or_start(ctx.profile, ctx.exe)?;
    let v = client.call(methods::SERVICES_SERVE, params)?;
    print_served(ctx.out, &name, client.node_id(), &v);
    Ok(())
}

impl Serve {
    /// The `services/serve` request; `NAME=VALUE` flags are checked here, before any node is
    /// asked.
    fn params(self) -> Result<Value, Failure> {
        let mut params = json!({
            "name": self.name, "allow": self.allow, "max_sessions": self.max_sessions,
            "replace": self.replace, "description": self.description,
        });
        if !self.env.is_empty() {
            params["env"] = pairs("--env", &self.env)?;
        }
        self.backend.add_params(&mut params)?;
        Ok(params)
    }
}

impl Backend {
    /// Adds what the node needs to know of this backend to a `services/serve` request.
    fn add_params(self, params: &mut Value) -> Result<(), Failure> {
        match self {
            Backend::Socket {
                path,
                caller_assertion,
            } => {
                let path = std::path::absolute(&path)
                    .with_context(|| format!("socket path {}", path.display()))?;
                params["socket"] = json!(path);
                if caller_assertion {
                    params["caller_assertion"] = json!(true);
                }
            }
            Backend::Url {
                url,
                headers,
                caller_header,
                no_caller_assertion,
                oauth,
                oauth_client,
            } => {
                if oauth || oauth_client.is_some() {
                    params["oauth"] = json!(true);
                }
                if let Some(client) = oauth_client {
                    params["oauth_client"] = client;
                }
                params["url"] = json!(url);
                params["headers"] = pairs("--header", &headers)?;
                if no_caller_assertion {
                    params["caller_assertion"] = json!(false);
                }
                if let Some(name) = caller_header {
                    params["caller_header"] = json!(name);
                }
            }
            Backend::Run(cmd) => params["run"] = json!(cmd),
        }
        Ok(())
    }
}

/// The node's answer to `serve`: who may use the service now, what it replaced, and the next
/// step. `node` is this node's id.
fn print_served(out: &Output, name: &str, node: &str, v: &Value) {
    let peers = strings(&v["allowed_peers"]);
    let mut answer = json!({ "service": v["service"], "serving": true });
    if !v["replaced"].is_null() {
        answer["replaced"] = v["replaced"].clone();
        answer["allowed_peers"] = v["allowed_peers"].clone();
    }
    out.print(answer, || {
        let mut s = String::new();
        if let Some((key, old)) = v["replaced"].as_object().and_then(|o| o.iter().next()) {
            let keep = if peers.is_empty() {
                "nobody has access yet".to_owned()
            } else {
                format!("{} keep access", peers.join(", "))
            };
            s.push_str(&format!("replaced {name} (it was {key} = {old}); {keep}\n"));
        }
        if peers.is_empty() {
            s.push_str(&format!("serving {name}, to nobody yet. Next: mcpmesh invite {name}  (a one-line invite to send to whoever should use it)"));
        } else {
            s.push_str(&format!(
                "serving {name} to {} (this node is {}…). To share it with someone new: mcpmesh invite {name}",
                peers.join(", "),
                node.get(..12).unwrap_or_default()
            ));
        }
        s
    });
}

/// The audit chain checked against the high-water mark in the node's store: by the running
/// node (which holds the store), or here from the store of a stopped one. A folder with no
/// store beside it (a copy of the log) is checked against its head alone.
fn verify_audit(profile: &Profile) -> Result<mcpmesh::audit::VerifyReport, Failure> {
    if let Some(mut node) = ControlClient::connect(profile)? {
        let value = node.call(methods::AUDIT_VERIFY, json!({}))?;
        return Ok(serde_json::from_value(value).context("reading the node's answer")?);
    }
    let store = profile.store_file();
    let mark = match store.exists() {
        true => mcpmesh::store::Store::read_audit_mark(&store)
            .map_err(|e| Failure::new(codes::LOCAL, e.to_string()))?,
        false => None,
    };
    Ok(mcpmesh::audit::verify(&profile.audit_dir(), mark.as_ref())
        .context("reading the audit log")?)
}

fn audit(profile: &Profile, action: AuditAction, out: &Output) -> Result<(), Failure> {
    let dir = profile.audit_dir();
    match action {
        AuditAction::Verify => audit_verify(profile, out),
        AuditAction::Summary { since } => audit_summary(&dir, since.as_deref(), out),
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
            audit_tail(&dir, lines, follow, wanted, out)
        }
    }
}

/// `audit verify`: the report, and a failure when the chain is damaged.
fn audit_verify(profile: &Profile, out: &Output) -> Result<(), Failure> {
    let report = verify_audit(profile)?;
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
    match &report.first_bad {
        None => Ok(()),
        // The report is the answer (on stdout); the failure says it is a bad one.
        Some(bad) => Err(Failure::new(
            codes::CHECK_FAILED,
            format!(
                "the audit log is damaged at {} line {}: {}",
                bad.file, bad.line, bad.reason
            ),
        )),
    }
}

/// `audit summary`: the totals of the records `since` ago (all of them without it).
fn audit_summary(dir: &Path, since: Option<&str>, out: &Output) -> Result<(), Failure> {
    let since_ms = match since {
        None => 0,
        Some(text) => {
            let d = parse_duration(text)?;
            mcpmesh::time::unix_ms().saturating_sub(d.as_millis() as u64)
        }
    };
    let summary = mcpmesh::audit::summarize(dir, since_ms).context("reading the audit log")?;
    let value = serde_json::to_value(&summary).context("rendering")?;
    out.print(value, || render_summary(&summary));
    Ok(())
}

/// `audit tail`: the last `lines` records that are `wanted`; with `follow`, every one written
/// after them too, until interrupted.
fn audit_tail(
    dir: &Path,
    lines: usize,
    follow: bool,
    wanted: impl Fn(&Value) -> bool,
    out: &Output,
) -> Result<(), Failure> {
    use mcpmesh::audit;
    let (last, mut cursor) = audit::tail(dir, lines, &wanted).context("reading the audit log")?;
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
        audit::follow(dir, &mut cursor, |v| {
            if wanted(&v) {
                print_record(&v, out.json);
            }
        })
        .context("reading the audit log")?;
    }
}

/// `mcpmesh hub`: the hub on this process's stdio until the client's input ends.
fn hub(
    profile: &Profile,
    exe: &Path,
    targets: &[String],
    idle: &str,
    naming: mcpmesh::hub::Naming,
) -> Result<(), Failure> {
    let invalid = |e: mcpmesh::hub::HubError| Failure::new(codes::INVALID_PARAMS, e.to_string());
    let targets = targets
        .iter()
        .map(|t| mcpmesh::hub::Target::parse(t))
        .collect::<Result<Vec<_>, _>>()
        .map_err(invalid)?;
    let idle = positive_duration("--idle", idle)?;
    let config = mcpmesh::hub::HubConfig {
        profile: profile.clone(),
        exe: exe.to_owned(),
        targets,
        idle,
        naming,
    };
    // One thread, as the node's: a request crosses the hub as a few wakeups of tasks that hand
    // it on to each other, and across two worker threads each of those was a thread wakeup
    // (the hub's call p50 1.45-1.62x connect's with two workers, 1.37x with one; 16 in flight
    // 0.50-0.61x against 0.65-0.71x). What blocks (the cache's file) runs on blocking threads.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime
        .block_on(async {
            // Pipes and sockets are read and written as the async sources they are; tokio's
            // own stdio goes through a blocking thread per read and write.
            type Input = Box<dyn tokio::io::AsyncRead + Unpin + Send>;
            type Output = Box<dyn tokio::io::AsyncWrite + Unpin + Send>;
            let direct = || -> std::io::Result<(Input, Output)> {
                use std::os::fd::AsFd;
                let input = std::io::stdin().as_fd().try_clone_to_owned()?;
                let output = std::io::stdout().as_fd().try_clone_to_owned()?;
                Ok((
                    mcpmesh::proxy::input_from(input)?,
                    mcpmesh::proxy::output_from(output)?,
                ))
            };
            let (input, output): (Input, Output) =
                match mcpmesh::proxy::stdio_passable().then(direct) {
                    Some(Ok(pair)) => pair,
                    _ => (Box::new(tokio::io::stdin()), Box::new(tokio::io::stdout())),
                };
            mcpmesh::hub::serve(config, input, output).await
        })
        .map_err(|e| match e {
            mcpmesh::hub::HubError::Node(m) => Failure::new(codes::UNREACHABLE, m),
            other => invalid(other),
        })?;
    // Blocking stdin reads would otherwise keep the runtime alive after the client is gone.
    runtime.shutdown_background();
    Ok(())
}

/// `mcpmesh gateway`: its flags as the gateway's configuration, then the gateway itself until
/// Ctrl-C.
fn gateway(ctx: &Ctx, flags: GatewayArgs) -> Result<(), Failure> {
    use mcpmesh::gateway::{GatewayConfig, TlsFiles, TokenChoice};
    let token = match (flags.token, flags.no_token) {
        (_, true) => TokenChoice::Waived,
        (Some(t), false) => TokenChoice::Given(t),
        (None, false) => TokenChoice::Profile,
    };
    let config = GatewayConfig {
        listen: flags.listen,
        token: None,
        allowed_origins: flags.allowed_origins,
        allowed_hosts: flags.allowed_hosts,
        profile: ctx.profile.clone(),
        exe: ctx.exe.to_owned(),
        idle: positive_duration("--idle", &flags.idle)?,
        tls: None,
    };
    let tls = flags
        .tls_cert
        .zip(flags.tls_key)
        .map(|(cert, key)| TlsFiles { cert, key });
    serve_gateway(config, flags.allow_remote, token, tls, ctx.out)
}

/// The gateway on `config.listen`, once the bind, the token and the TLS files check out.
fn serve_gateway(
    mut config: mcpmesh::gateway::GatewayConfig,
    allow_remote: bool,
    token: mcpmesh::gateway::TokenChoice,
    tls: Option<mcpmesh::gateway::TlsFiles>,
    out: &Output,
) -> Result<(), Failure> {
    use mcpmesh::gateway::{self, TokenChoice};
    let failed = |e: gateway::GatewayError| Failure::new(codes::INVALID_PARAMS, e.to_string());
    gateway::check_bind(config.listen, allow_remote, &token, tls.is_some()).map_err(failed)?;
    config.tls = match &tls {
        Some(files) => Some(
            files
                .load()
                .map_err(|e| failed(gateway::GatewayError::Tls(e)))?,
        ),
        None => None,
    };
    let scheme = if tls.is_some() { "https" } else { "http" };
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
        let base = format!("{scheme}://{addr}/mcp");
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

/// `notify` is the starter's protocol (readiness or failure as one JSON line on stdout, the
/// log on stderr); `json` is a person's `--json`: the ready line as JSON, a failure only as
/// the JSON line on stderr.
fn daemon(profile: Profile, notify: bool, json: bool) -> Result<(), Failure> {
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
        let line = if notify || json {
            json!({ "ready": true, "id": id, "socket": socket }).to_string()
        } else {
            format!("node {id} is up; control socket {socket}")
        };
        let mut stdout = std::io::stdout().lock();
        let _ = writeln!(stdout, "{line}");
        let _ = stdout.flush();
    }));
    let Err(e) = result else { return Ok(()) };
    let failure = Failure::new(e.code(), e.to_string());
    if notify && !json {
        // Whoever started us learns why, on the line it waits for.
        println!(
            "{}",
            json!({ "error": { "code": failure.code, "message": failure.message } })
        );
    }
    Err(failure)
}

/// Whether the node whose profile lock is `lock` still runs (it holds that lock while it
/// does). A node that was just killed may close its sockets a moment before its lock goes, so
/// a held lock is checked again for a short while.
fn node_running(lock: &std::path::Path) -> bool {
    let Ok(file) = std::fs::File::open(lock) else {
        return false;
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_millis(500);
    while file.try_lock().is_err() {
        if std::time::Instant::now() > deadline {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    false
}

/// With `json`, stderr carries nothing but a failure's JSON line.
fn connect(profile: &Profile, exe: &Path, target: &str, json: bool) -> Result<(), Failure> {
    let (peer, service) = target.split_once('/').ok_or_else(|| {
        Failure::new(
            codes::INVALID_PARAMS,
            format!("expected PEER/SERVICE, got {target:?}"),
        )
    })?;
    let attach = if mcpmesh::proxy::stdio_passable() {
        Attach::Fds
    } else {
        Attach::Stream
    };
    let started = std::time::Instant::now();
    let opened = ControlClient::connect_or_start(profile, exe)
        .and_then(|c| c.open_session_answered(peer, service, attach));
    match opened {
        Ok((stream, leftover, answer)) => {
            // One line for the client's log: how long the mesh took to reach the peer (node
            // start and dial included). It claims no session: the serving node admits or
            // refuses one only when it reads the first request.
            // One write: stderr is unbuffered, and a formatted eprintln! is one write per piece.
            if !json {
                let note = format!(
                    "mcpmesh connect {target}: peer reached in {:.1} ms\n",
                    started.elapsed().as_secs_f64() * 1e3
                );
                let _ = std::io::stderr().write_all(note.as_bytes());
            }
            let lock = profile.lock_file();
            let end = match attach {
                Attach::Fds => {
                    let ledger = answer["ledger"].as_bool().unwrap_or(false);
                    mcpmesh::proxy::pass_stdio(stream, ledger)
                }
                Attach::Stream => {
                    mcpmesh::proxy::pipe_stdio(stream, &leftover, || node_running(&lock))
                }
            }
            .context("connect")?;
            match end {
                mcpmesh::proxy::ConnectEnd::Clean => Ok(()),
                mcpmesh::proxy::ConnectEnd::Failed(why) => Err(Failure::new(
                    codes::UNREACHABLE,
                    format!("connect {target}: {why}"),
                )),
                mcpmesh::proxy::ConnectEnd::Refused { code, message } => {
                    Err(Failure::new(code, format!("connect {target}: {message}")))
                }
            }
        }
        Err(e) => {
            // The client gets a JSON-RPC error for its request, the reason goes to stderr and
            // the exit status says it failed.
            mcpmesh::proxy::answer_failed_open(e.code, &e.message).context("connect")?;
            Err(Failure::new(
                e.code,
                format!("connect {target}: {}", e.message),
            ))
        }
    }
}
