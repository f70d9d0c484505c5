//! `mcpmesh demo`: two hermetic nodes on this machine share a small built-in tool, end to end.
//!
//! The tool is `mcpmesh demo-server`, a tiny stdio MCP server that answers from memory.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::control::client::ControlClient;
use crate::control::{ControlError, methods};
use crate::paths::Profile;

/// How long the demo waits for any one answer.
const STEP_TIMEOUT: Duration = Duration::from_secs(20);

/// Why the demo stopped.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    #[error("{step}: {message}")]
    Step { step: &'static str, message: String },
}

fn fail(step: &'static str) -> impl Fn(&dyn std::fmt::Display) -> DemoError {
    move |e| DemoError::Step {
        step,
        message: e.to_string(),
    }
}

/// Two nodes that are stopped however the demo ends.
struct Nodes(Vec<Profile>);

impl Drop for Nodes {
    fn drop(&mut self) {
        for profile in &self.0 {
            let _ = ControlClient::shutdown(profile);
        }
    }
}

/// Runs the demo with `exe` (this `mcpmesh` binary) as node, tool and `connect`, printing each
/// step with its timing to `out`.
pub fn run(exe: &Path, out: &mut dyn Write) -> Result<Report, DemoError> {
    let total = Instant::now();
    let base = tempfile::Builder::new()
        .prefix("mcpmesh-demo-")
        .tempdir()
        .map_err(|e| fail("creating temporary profiles")(&e))?;
    let mut log = Transcript {
        report: Report::default(),
        out,
    };
    let _ = writeln!(
        log.out,
        "mcpmesh demo: two nodes on this machine share a tool (no network, no accounts)"
    );

    let alice = Profile::at(base.path().join("alice"));
    let bob = Profile::at(base.path().join("bob"));
    let mut nodes = Nodes(Vec::new());
    let [mut a, mut b] = start_nodes(
        exe,
        [(&alice, "alice"), (&bob, "bob")],
        &mut nodes,
        &mut log,
    )?;
    introduce(&mut a, &mut b, &mut log)?;

    let t = Instant::now();
    let run = vec![exe.display().to_string(), "demo-server".to_owned()];
    a.client
        .call(
            methods::SERVICES_SERVE,
            json!({ "name": "demo", "run": run, "allow": ["bob"] }),
        )
        .map_err(|e| fail("alice serving demo")(&e))?;
    log.say(
        t,
        "alice serves \"demo\" (a built-in MCP server) to bob".into(),
    );

    let mut connect = open_session(exe, &bob, &mut log)?;
    call_tools(&mut connect, &mut log)?;

    let t = Instant::now();
    connect.finish();
    drop(nodes);
    log.say(t, "closed the session and stopped both nodes".into());
    let _ = writeln!(
        log.out,
        "done in {:.0} ms. Share your own tool: mcpmesh serve NAME -- COMMAND…, then mcpmesh invite NAME",
        total.elapsed().as_secs_f64() * 1e3
    );
    log.report.total_ms = total.elapsed().as_secs_f64() * 1e3;
    Ok(log.report)
}

/// A node the demo started: the control connection to it, and its `node.id` answer.
struct Started {
    client: ControlClient,
    id: Value,
}

/// Writes each profile's hermetic config and starts its node (recorded in `nodes`, so it is
/// stopped however the demo ends).
fn start_nodes(
    exe: &Path,
    profiles: [(&Profile, &str); 2],
    nodes: &mut Nodes,
    log: &mut Transcript<'_>,
) -> Result<[Started; 2], DemoError> {
    let mut started = Vec::new();
    for (profile, nick) in profiles {
        let t = Instant::now();
        profile
            .create_dirs()
            .map_err(|e| fail("creating a profile")(&e))?;
        let config = format!(
            "[identity]\nnickname = \"{nick}\"\n\n[network]\nrelay_mode = \"disabled\"\nbind = \"127.0.0.1:0\"\n"
        );
        std::fs::write(profile.config_file(), config).map_err(|e| fail("writing a config")(&e))?;
        nodes.0.push(profile.clone());
        let mut client = ControlClient::connect_or_start(profile, exe)
            .map_err(|e| fail("starting a node")(&e))?;
        let id = client
            .call(methods::NODE_ID, json!({}))
            .map_err(|e| fail("asking a node its id")(&e))?;
        log.say(
            t,
            format!(
                "started node {nick:<5} id {}… at {}",
                id["id"]
                    .as_str()
                    .unwrap_or_default()
                    .get(..12)
                    .unwrap_or_default(),
                id["addrs"][0].as_str().unwrap_or("?")
            ),
        );
        started.push(Started { client, id });
    }
    started
        .try_into()
        .map_err(|_| fail("starting nodes")(&"two nodes expected"))
}

/// Alice and bob each add the other's key and addresses as a peer.
fn introduce(
    alice: &mut Started,
    bob: &mut Started,
    log: &mut Transcript<'_>,
) -> Result<(), DemoError> {
    let t = Instant::now();
    let add = |c: &mut ControlClient, name: &str, id: &Value| -> Result<Value, ControlError> {
        c.call(
            methods::PEERS_ADD,
            json!({ "name": name, "id": id["id"], "addrs": id["addrs"] }),
        )
    };
    add(&mut alice.client, "bob", &bob.id).map_err(|e| fail("alice trusting bob")(&e))?;
    add(&mut bob.client, "alice", &alice.id).map_err(|e| fail("bob trusting alice")(&e))?;
    log.say(t, "alice and bob trust each other's keys".into());
    Ok(())
}

/// Bob's `mcpmesh connect alice/demo`, initialized: the session an AI client would hold.
fn open_session(
    exe: &Path,
    bob: &Profile,
    log: &mut Transcript<'_>,
) -> Result<McpProcess, DemoError> {
    let t = Instant::now();
    let mut connect =
        McpProcess::start(exe, bob, "alice/demo").map_err(|e| fail("starting connect")(&e))?;
    let init = connect
        .request(
            "initialize",
            json!({
                "protocolVersion": "2025-06-18", "capabilities": {},
                "clientInfo": { "name": "mcpmesh-demo", "version": env!("CARGO_PKG_VERSION") },
            }),
        )
        .map_err(|e| fail("initialize through the mesh")(&e))?;
    connect
        .notify("notifications/initialized")
        .map_err(|e| fail("initialized")(&e))?;
    log.say(
        t,
        format!(
            "bob ran `mcpmesh connect alice/demo`: initialize answered by {:?}",
            init["serverInfo"]["name"].as_str().unwrap_or("?")
        ),
    );
    Ok(connect)
}

/// Lists the demo's tools and calls two: `echo`, and `whoami` to show the caller alice's
/// server saw.
fn call_tools(connect: &mut McpProcess, log: &mut Transcript<'_>) -> Result<(), DemoError> {
    let t = Instant::now();
    let tools = connect
        .request("tools/list", json!({}))
        .map_err(|e| fail("tools/list")(&e))?;
    let names: Vec<&str> = tools["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["name"].as_str())
        .collect();
    log.say(t, format!("tools/list: {}", names.join(", ")));

    let t = Instant::now();
    let echo = connect
        .request(
            "tools/call",
            json!({ "name": "echo", "arguments": { "text": "hello from bob" } }),
        )
        .map_err(|e| fail("tools/call echo")(&e))?;
    log.say(
        t,
        format!(
            "tools/call echo → {:?}",
            echo["content"][0]["text"].as_str().unwrap_or("?")
        ),
    );

    let t = Instant::now();
    let who = connect
        .request("tools/call", json!({ "name": "whoami", "arguments": {} }))
        .map_err(|e| fail("tools/call whoami")(&e))?;
    let seen = &who["structuredContent"];
    log.say(
        t,
        format!(
            "tools/call whoami → alice's server saw caller {} ({}…)",
            seen["MCPMESH_PEER_NAME"].as_str().unwrap_or("?"),
            seen["MCPMESH_PEER_EID"]
                .as_str()
                .unwrap_or("?")
                .get(..16)
                .unwrap_or("?"),
        ),
    );
    Ok(())
}

/// What the demo did, step by step, with each step's time.
#[derive(Debug, Default, serde::Serialize)]
pub struct Report {
    pub steps: Vec<Step>,
    pub total_ms: f64,
}

#[derive(Debug, serde::Serialize)]
pub struct Step {
    pub step: String,
    pub ms: f64,
}

/// What the demo prints as it goes, and the report it builds alongside.
struct Transcript<'a> {
    report: Report,
    out: &'a mut dyn Write,
}

impl Transcript<'_> {
    /// A step done, timed from `started`.
    fn say(&mut self, started: Instant, text: String) {
        let ms = started.elapsed().as_secs_f64() * 1e3;
        let _ = writeln!(self.out, "  [{ms:>6.1} ms] {text}");
        self.report.steps.push(Step { step: text, ms });
    }
}

/// An MCP client over a child's stdio: the demo's stand-in for an AI client.
struct McpProcess {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<Value>,
    next_id: u64,
}

impl McpProcess {
    fn start(exe: &Path, profile: &Profile, target: &str) -> std::io::Result<Self> {
        let mut cmd = Command::new(exe);
        if let Some(home) = &profile.home {
            cmd.arg("--home").arg(home);
        }
        let mut child = cmd
            .args(["connect", target])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| std::io::Error::other("no stdout"))?;
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                if let Ok(v) = serde_json::from_str(&line)
                    && tx.send(v).is_err()
                {
                    return;
                }
            }
        });
        let stdin = child.stdin.take();
        Ok(McpProcess {
            child,
            stdin,
            lines,
            next_id: 0,
        })
    }

    fn send(&mut self, msg: &Value) -> std::io::Result<()> {
        let stdin = self
            .stdin
            .as_mut()
            .ok_or_else(|| std::io::Error::other("closed"))?;
        let mut line = serde_json::to_vec(msg)?;
        line.push(b'\n');
        stdin.write_all(&line)?;
        stdin.flush()
    }

    fn notify(&mut self, method: &str) -> std::io::Result<()> {
        self.send(&json!({ "jsonrpc": "2.0", "method": method }))
    }

    fn request(&mut self, method: &str, params: Value) -> Result<Value, String> {
        self.next_id += 1;
        let id = self.next_id;
        self.send(&json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params }))
            .map_err(|e| e.to_string())?;
        let deadline = Instant::now() + STEP_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let msg = self
                .lines
                .recv_timeout(left)
                .map_err(|_| "no answer".to_owned())?;
            if msg["id"] != json!(id) {
                continue;
            }
            if let Some(err) = msg.get("error") {
                return Err(err.to_string());
            }
            return Ok(msg["result"].clone());
        }
    }

    fn finish(mut self) {
        drop(self.stdin.take());
        let _ = self.child.wait();
    }
}

impl Drop for McpProcess {
    fn drop(&mut self) {
        if self.stdin.is_some() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
