//! The harness of the cross-node suites: real `mcpmesh` processes in temporary hermetic
//! profiles on loopback, real `connect` processes driven over their stdio.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use mcpmesh_net::transport::FrameReader;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
use tokio::process::{Child, ChildStdin, ChildStdout};

pub const MCPMESH: &str = env!("CARGO_BIN_EXE_mcpmesh");

/// The test kit's MCP server, `echo_mcp_stub` (see [`kit_bin`]).
pub fn stub() -> &'static str {
    static STUB: OnceLock<String> = OnceLock::new();
    STUB.get_or_init(|| kit_bin("echo_mcp_stub"))
}

/// A binary of the test kit (`tests/kit`, package `mcpmesh-testkit`). Cargo tells a package's
/// tests where its own binaries are, not another package's; every binary of the workspace
/// lands in one directory per profile, so this looks there as assert_cmd does: beside this
/// test executable (`target/PROFILE/deps/`), then one level up (`target/PROFILE/`). A missing
/// one fails the test with the command that builds it.
pub fn kit_bin(name: &str) -> String {
    let exe = std::env::current_exe().expect("the test executable's path");
    let found = exe
        .ancestors()
        .skip(1)
        .take(2)
        .map(|dir| dir.join(name))
        .find(|path| path.is_file());
    match found {
        Some(path) => path
            .into_os_string()
            .into_string()
            .expect("a target directory with a UTF-8 path"),
        None => panic!(
            "the test kit's `{name}` is neither beside {} nor one directory up: build it \
             first with `cargo build -p mcpmesh-testkit --bins` (with the profile of these \
             tests, e.g. `--release`, if not the default)",
            exe.display()
        ),
    }
}

/// Longest any single answer may take before a test fails instead of hanging.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(20);

pub const HERMETIC: &str = "[network]\nrelay_mode = \"disabled\"\nbind = \"127.0.0.1:0\"\n";

/// Whether this run is CI's (`CI` set to anything but empty, `0` or `false`), where every test
/// must run.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !matches!(v.as_str(), "" | "0" | "false"))
}

/// The one rule for a test that cannot run here: under CI it fails with `why`; elsewhere it
/// says so loudly, past the harness's capture, and the caller returns (the test passes
/// without running).
pub fn cannot_run(test: &str, why: &str) {
    assert!(!in_ci(), "{test} cannot run, and CI requires it to: {why}");
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "\n!!!! SKIPPED {test}: {why}\n");
}

/// One node in a temporary profile. Stopped (with its children) when dropped.
pub struct TestNode {
    pub dir: tempfile::TempDir,
    pub name: String,
    pub id: String,
    pub addrs: Vec<String>,
}

impl TestNode {
    pub fn start(name: &str) -> Self {
        Self::start_with(name, "", &[])
    }

    /// A node whose config is hermetic plus `extra`, started with `envs` in its environment.
    pub fn start_with(name: &str, extra: &str, envs: &[(&str, &str)]) -> Self {
        let dir = tempfile::Builder::new().prefix("mm-").tempdir().unwrap();
        let config = format!("[identity]\nnickname = \"{name}\"\n\n{HERMETIC}\n{extra}");
        std::fs::write(dir.path().join("config.toml"), config).unwrap();
        Self::identified(dir, name, envs)
    }

    /// A node whose daemon lives in the network namespace `netns` (started there with `up`;
    /// its control socket is reached by path as usual), with `network` as its whole
    /// `[network]` section.
    pub fn start_in_netns(name: &str, netns: &str, network: &str) -> Self {
        let dir = tempfile::Builder::new().prefix("mm-").tempdir().unwrap();
        let config = format!("[identity]\nnickname = \"{name}\"\n\n{network}");
        std::fs::write(dir.path().join("config.toml"), config).unwrap();
        let up = Command::new("ip")
            .args(["netns", "exec", netns, MCPMESH, "--home"])
            .arg(dir.path())
            .args(["--json", "up"])
            .env_remove("MCPMESH_HOME")
            .output()
            .unwrap();
        parse_ok(&up);
        Self::identified(dir, name, &[])
    }

    /// The node of the profile in `dir`, its id and addresses asked of its daemon (which this
    /// starts when it is not running yet).
    fn identified(dir: tempfile::TempDir, name: &str, envs: &[(&str, &str)]) -> Self {
        let mut node = TestNode {
            dir,
            name: name.to_owned(),
            id: String::new(),
            addrs: Vec::new(),
        };
        let out = node
            .command(&["--json", "id"])
            .envs(envs.iter().copied())
            .output()
            .unwrap();
        let v = parse_ok(&out);
        node.id = v["id"].as_str().unwrap().to_owned();
        node.addrs = v["addrs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap().to_owned())
            .collect();
        node
    }

    pub fn home(&self) -> &Path {
        self.dir.path()
    }

    pub fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(MCPMESH);
        cmd.arg("--home")
            .arg(self.home())
            .args(args)
            .env_remove("MCPMESH_HOME");
        cmd
    }

    pub fn cli(&self, args: &[&str]) -> Output {
        self.command(args).output().unwrap()
    }

    /// Runs a verb with `--json` and returns its stdout value; fails the test on an error.
    pub fn json(&self, args: &[&str]) -> Value {
        let mut all = vec!["--json"];
        all.extend_from_slice(args);
        parse_ok(&self.cli(&all))
    }

    /// Stops the node (a clean stop writes every queued audit record) and returns its newest
    /// audit records, oldest first.
    pub fn stop_and_audit(&self) -> Vec<Value> {
        self.json(&["down"]);
        let tail = self.json(&["audit", "tail", "-n", "1000"]);
        tail["records"].as_array().expect("audit records").clone()
    }

    /// Makes this node trust `other` under `other`'s nickname, with its addresses.
    pub fn trust(&self, other: &TestNode) {
        let mut args = vec!["peers", "add", other.name.as_str(), other.id.as_str()];
        for a in &other.addrs {
            args.extend(["--addr", a.as_str()]);
        }
        self.json(&args);
    }

    /// Serves the stub under `service`; `marker` tags its processes for [`procs_with`].
    pub fn serve_stub(
        &self,
        service: &str,
        allow: &[&str],
        max_sessions: Option<u32>,
        marker: &str,
    ) {
        let n = max_sessions.map(|n| n.to_string());
        let mut backend = Vec::new();
        if let Some(n) = &n {
            backend.extend(["--max-sessions", n.as_str()]);
        }
        backend.extend(["--", stub(), "--marker", marker]);
        self.serve(service, allow, &backend);
    }

    /// `mcpmesh serve service --allow …` followed by `backend` (`-- CMD…` or `--socket P`).
    pub fn serve(&self, service: &str, allow: &[&str], backend: &[&str]) {
        let mut args = vec!["serve", service];
        for a in allow {
            args.extend(["--allow", a]);
        }
        args.extend(backend);
        let v = self.json(&args);
        assert_eq!(v, json!({ "service": service, "serving": true }));
    }

    /// Launches `mcpmesh connect target` as an AI client would.
    pub fn connect(&self, target: &str) -> McpSession {
        let mut cmd = tokio::process::Command::new(MCPMESH);
        cmd.arg("--home")
            .arg(self.home())
            .args(["connect", target])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        McpSession::spawn(cmd)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.home().join("state/mcpmesh.log")).unwrap_or_default()
    }
}

/// Runs `f` as a tool beside a stopped node does: on a thread with no async runtime, where
/// the store and config may be written directly (see `mcpmesh::disk`).
pub fn offline<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|scope| match scope.spawn(f).join() {
        Ok(value) => value,
        Err(panic) => std::panic::resume_unwind(panic),
    })
}

impl Drop for TestNode {
    /// Stops the node, and fails the test when the node panicked anywhere while it ran (its
    /// stderr is its log): a panic in a background task ends only that task, which a test of
    /// something else would not notice. Debug builds check there that no store or config
    /// write runs on the node's runtime thread.
    fn drop(&mut self) {
        let _ = self.cli(&["down"]);
        let log = self.log();
        if let Some(at) = log.find("panicked at")
            && !std::thread::panicking()
        {
            let end = log[at..].find("\n\n").map_or(log.len(), |n| at + n);
            panic!(
                "the node {} panicked:\n{}",
                self.name,
                &log[at..end.min(at + 2000)]
            );
        }
    }
}

/// `modern_client.py` in `era` (`modern` or `legacy`), with its 4 MiB echo when `big`; the
/// caller appends `-- CMD…` or `--url URL`.
pub fn modern_client(era: &str, big: bool) -> Vec<String> {
    let mut args = vec![
        interop_script("modern_client.py"),
        "--era".into(),
        era.into(),
    ];
    if big {
        args.extend(["--big".into(), "4194304".into()]);
    }
    args
}

/// What the `whoami` check of an interop driver's report (`ok   whoami {…}`) said.
pub fn whoami_in(report: &str) -> Value {
    let line = report
        .lines()
        .find_map(|l| l.strip_prefix("ok   whoami "))
        .unwrap_or_else(|| panic!("a whoami line in {report}"));
    serde_json::from_str(line).unwrap()
}

/// The one JSON error line a failed command ends its stderr with (exit status 1).
pub fn error_line(out: &Output) -> Value {
    assert!(!out.status.success(), "expected a failure");
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let line = stderr.lines().last().unwrap_or_default();
    let v: Value = serde_json::from_str(line)
        .unwrap_or_else(|_| panic!("stderr ends in one JSON line: {stderr}"));
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty())
    );
    v
}

/// Now, in Unix seconds.
pub fn unix_now() -> u64 {
    mcpmesh::time::unix_ms() / 1000
}

pub fn parse_ok(out: &Output) -> Value {
    assert!(
        out.status.success(),
        "command failed: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not one JSON value ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// An MCP client over a child process's stdio.
pub struct McpSession {
    pub child: Child,
    stdin: Option<ChildStdin>,
    reader: FrameReader<ChildStdout>,
    next_id: i64,
    /// Frames `request` read past while waiting for its answer (notifications, mostly).
    pub skipped: Vec<Value>,
}

impl McpSession {
    pub fn spawn(mut cmd: tokio::process::Command) -> Self {
        let mut child = cmd.spawn().unwrap();
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().unwrap();
        McpSession {
            child,
            stdin,
            reader: FrameReader::new(stdout, 64 << 20),
            next_id: 100,
            skipped: Vec::new(),
        }
    }

    /// The served stub run directly, for comparisons against the mesh.
    pub fn direct_stub() -> Self {
        let mut cmd = tokio::process::Command::new(stub());
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true);
        Self::spawn(cmd)
    }

    pub async fn send_raw(&mut self, bytes: &[u8]) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        stdin.write_all(bytes).await.unwrap();
        stdin.flush().await.unwrap();
    }

    /// Sends `msg` if the client's side is still open (`false`: the session already ended
    /// and `connect` with it).
    pub async fn try_send(&mut self, msg: &Value) -> bool {
        let mut line = serde_json::to_vec(msg).unwrap();
        line.push(b'\n');
        let Some(stdin) = self.stdin.as_mut() else {
            return false;
        };
        stdin.write_all(&line).await.is_ok() && stdin.flush().await.is_ok()
    }

    /// The answer to a request sent now to a session a trust change is severing: `None` when
    /// the session had already ended (no answer, end of stream), else what came back.
    pub async fn next_request_on_severed(&mut self, tool: &str) -> Option<Value> {
        self.next_id += 1;
        let id = self.next_id;
        let call = json!({ "jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": { "name": tool, "arguments": {} } });
        if !self.try_send(&call).await {
            return None;
        }
        loop {
            let msg = self.recv().await?;
            if msg["id"] == json!(id) {
                return Some(msg);
            }
            self.skipped.push(msg);
        }
    }

    pub async fn send(&mut self, msg: &Value) {
        let mut line = serde_json::to_vec(msg).unwrap();
        line.push(b'\n');
        self.send_raw(&line).await;
    }

    /// The next line's raw bytes (without the newline); `None` at EOF.
    pub async fn recv_raw(&mut self) -> Option<Vec<u8>> {
        tokio::time::timeout(ANSWER_TIMEOUT, self.reader.next_line())
            .await
            .expect("an answer in time")
            .expect("a readable line")
            .map(|b| b.to_vec())
    }

    pub async fn recv(&mut self) -> Option<Value> {
        let line = self.recv_raw().await?;
        Some(serde_json::from_slice(&line).expect("a JSON line"))
    }

    /// Sends a request and returns the message answering it (skipping anything else).
    pub async fn request(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        self.send(&json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params }))
            .await;
        loop {
            let msg = self.recv().await.expect("an answer before EOF");
            if msg["id"] == json!(id) {
                return msg;
            }
            self.skipped.push(msg);
        }
    }

    /// Waits for a notification `method` (one `request` read past counts), taking it; `None`
    /// when none came within `limit`, or the stream ended first.
    pub async fn notified(&mut self, method: &str, limit: Duration) -> Option<Value> {
        if let Some(at) = self.skipped.iter().position(|m| m["method"] == method) {
            return Some(self.skipped.remove(at));
        }
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let line = tokio::time::timeout_at(deadline, self.reader.next_line())
                .await
                .ok()?
                .expect("a readable line")?;
            let msg: Value = serde_json::from_slice(&line).expect("a JSON line");
            if msg["method"] == method {
                return Some(msg);
            }
            self.skipped.push(msg);
        }
    }

    pub async fn initialize(&mut self) -> Value {
        self.initialize_as("2025-06-18").await
    }

    /// `initialize` speaking protocol `version`, then `initialized` when it succeeded.
    pub async fn initialize_as(&mut self, version: &str) -> Value {
        let r = self
            .request(
                "initialize",
                json!({
                    "protocolVersion": version, "capabilities": {},
                    "clientInfo": { "name": "mcpmesh-tests", "version": "0" },
                }),
            )
            .await;
        // As a client does: only an initialize that succeeded is followed by `initialized` (a
        // refused session may already be gone).
        if r.get("result").is_some() {
            self.send(&json!({ "jsonrpc": "2.0", "method": "notifications/initialized" }))
                .await;
        }
        r
    }

    pub async fn call(&mut self, tool: &str, args: Value) -> Value {
        self.request("tools/call", json!({ "name": tool, "arguments": args }))
            .await
    }

    /// Starts a call to the stub's `sleep` tool and returns once the server has it (its first
    /// progress notification arrived), so the request is known to be in flight at the server.
    pub async fn start_long_call(&mut self, id: Value, ms: u64) {
        self.send(&json!({ "jsonrpc": "2.0", "id": id, "method": "tools/call",
                           "params": { "name": "sleep", "arguments": { "ms": ms },
                                       "_meta": { "progressToken": id } } }))
            .await;
        loop {
            let msg = self.recv().await.expect("progress before EOF");
            if msg["method"] == "notifications/progress" && msg["params"]["progressToken"] == id {
                return;
            }
        }
    }

    pub fn close_stdin(&mut self) {
        self.stdin = None;
    }

    /// Stops reading: closes the client's end of the server's output, keeping the process and
    /// its stdin (returned).
    pub fn close_stdout(self) -> (Child, Option<ChildStdin>) {
        (self.child, self.stdin)
    }

    /// Reads one long line (newline included), closing stdin as soon as its first part has
    /// arrived: the client is done sending while the answer is still on its way.
    pub async fn recv_long_closing_stdin_midway(&mut self) -> Vec<u8> {
        let mut line = self.recv_long_head().await;
        self.close_stdin();
        line.extend(self.recv_long_rest().await);
        line
    }

    /// Reads the head of a long line (the first part a node passed on), or fails the test.
    pub async fn recv_long_head(&mut self) -> Vec<u8> {
        use mcpmesh_net::transport::Piece;
        let first = tokio::time::timeout(ANSWER_TIMEOUT, self.reader.next_piece())
            .await
            .expect("an answer in time")
            .expect("a readable line");
        let Some(Piece::LongStart(head)) = first else {
            panic!("not the start of a long line: {first:?}")
        };
        head.to_vec()
    }

    /// Reads the rest of a long line whose head was read, up to its newline.
    pub async fn recv_long_rest(&mut self) -> Vec<u8> {
        use mcpmesh_net::transport::Part;
        let mut rest = Vec::new();
        loop {
            let part = tokio::time::timeout(ANSWER_TIMEOUT, self.reader.next_part())
                .await
                .expect("the rest in time")
                .expect("a readable line");
            match part {
                Part::More(bytes) => rest.extend_from_slice(&bytes),
                Part::Last(bytes) => {
                    rest.extend_from_slice(&bytes);
                    return rest;
                }
                Part::Cut => panic!("the line ran past the cap"),
            }
        }
    }

    pub async fn wait_eof(&mut self) {
        while self.recv_raw().await.is_some() {}
    }
}

/// Every process: its pid, its state letter (`Z` = zombie), its process group, and its
/// command line split into arguments.
fn processes() -> Vec<(u32, char, u32, Vec<Vec<u8>>)> {
    let dir = std::fs::read_dir("/proc")
        .unwrap_or_else(|e| panic!("cannot list processes in /proc (is it mounted?): {e}"));
    dir.flatten()
        .filter_map(|entry| {
            let pid = entry.file_name().to_string_lossy().parse::<u32>().ok()?;
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            // After the command in parentheses: state, ppid, pgrp, …
            let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
            let state = fields.first()?.chars().next()?;
            let pgrp = fields.get(2)?.parse().ok()?;
            let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            let args = cmdline.split(|b| *b == 0).map(<[u8]>::to_vec).collect();
            Some((pid, state, pgrp, args))
        })
        .collect()
}

/// Processes whose command line has the argument `marker`, with their state letter.
pub fn procs_with(marker: &str) -> Vec<(u32, char)> {
    processes()
        .into_iter()
        .filter(|(_, _, _, args)| args.iter().any(|a| a == marker.as_bytes()))
        .map(|(pid, state, _, _)| (pid, state))
        .collect()
}

/// The node `daemon`'s spare launchers: live `mcpmesh __exec --parent DAEMON` processes, each
/// waiting to become the next session's server.
pub fn spare_launchers(daemon: u32) -> Vec<u32> {
    let parent = daemon.to_string();
    processes()
        .into_iter()
        .filter(|(_, state, _, args)| {
            *state != 'Z'
                && args.get(1).is_some_and(|a| a == b"__exec")
                && args.get(3).is_some_and(|a| a == parent.as_bytes())
        })
        .map(|(pid, _, _, _)| pid)
        .collect()
}

/// Live (non-zombie) processes whose process group is `pgid`.
pub fn procs_in_group(pgid: u32) -> Vec<u32> {
    processes()
        .into_iter()
        .filter(|(_, state, group, _)| *group == pgid && *state != 'Z')
        .map(|(pid, _, _, _)| pid)
        .collect()
}

/// Asserts that the server process `pid` (tagged `marker`) exits within a second and is
/// reaped by its node.
pub async fn assert_child_ends(pid: u32, marker: &str) {
    assert!(
        wait_exit(pid, Duration::from_secs(1)).await,
        "child {pid} still running"
    );
    let reaped = eventually(Duration::from_secs(2), || {
        !procs_with(marker).iter().any(|(p, _)| *p == pid)
    })
    .await;
    assert!(reaped, "child {pid} was not reaped");
}

/// A tag unique to this test run, for [`procs_with`].
pub fn marker(test: &str) -> String {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let since_epoch = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    format!(
        "mm-marker-{test}-{}-{since_epoch}-{}",
        std::process::id(),
        N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    )
}

/// Waits for a process this test did not spawn to exit, by its pidfd (an event, not a poll).
pub async fn wait_exit(pid: u32, limit: Duration) -> bool {
    let Some(raw) = rustix::process::Pid::from_raw(pid as i32) else {
        panic!("wait_exit: {pid} is not a process id");
    };
    let fd = match rustix::process::pidfd_open(raw, rustix::process::PidfdFlags::empty()) {
        Ok(fd) => fd,
        // Only "no such process" means it is gone; any other error says nothing about it.
        Err(rustix::io::Errno::SRCH) => return true,
        Err(e) => panic!("cannot watch process {pid} (pidfd_open): {e}"),
    };
    // A pidfd turns readable when its process exits.
    tokio::task::spawn_blocking(move || {
        let mut fds = [rustix::event::PollFd::new(
            &fd,
            rustix::event::PollFlags::IN,
        )];
        let limit = rustix::event::Timespec::try_from(limit).unwrap_or(rustix::event::Timespec {
            tv_sec: 1,
            tv_nsec: 0,
        });
        matches!(rustix::event::poll(&mut fds, Some(&limit)), Ok(n) if n > 0)
    })
    .await
    .unwrap_or(false)
}

/// For conditions no event announces (another process reaping its child): checks `cond`
/// until it holds or `limit` passes.
pub async fn eventually(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

pub fn stub_path() -> PathBuf {
    PathBuf::from(stub())
}

impl TestNode {
    /// This node's daemon's pid (kept in the profile's lock file).
    pub fn daemon_pid(&self) -> u32 {
        let pid = std::fs::read_to_string(self.home().join("daemon.lock")).unwrap();
        pid.trim().parse().unwrap()
    }

    /// Sends `signal` to this node's daemon.
    pub fn signal(&self, signal: rustix::process::Signal) {
        let pid = rustix::process::Pid::from_raw(self.daemon_pid() as i32).unwrap();
        let _ = rustix::process::kill_process(pid, signal);
    }

    /// Kills this node's daemon (`kill -9`) and waits until it is gone: until then its
    /// control socket may still take a connection and drop it, failing the next verb.
    pub async fn kill_daemon(&self) {
        let pid = self.daemon_pid();
        self.signal(rustix::process::Signal::KILL);
        assert!(
            wait_exit(pid, Duration::from_secs(10)).await,
            "{}'s killed node did not exit",
            self.name
        );
    }
}

/// The serving daemon's resident memory, in KiB.
pub fn rss_kib(node: &TestNode) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", node.daemon_pid())).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap()
}

/// A raw mesh client with its own key, which `node` trusts as `tester`.
pub async fn raw_client(node: &TestNode, trusted: bool) -> (iroh::Endpoint, iroh::EndpointId) {
    let key = iroh::SecretKey::generate();
    if trusted {
        node.json(&[
            "peers",
            "add",
            &format!("tester{}", &key.public().to_string()[..8]),
            &key.public().to_string(),
        ]);
    }
    endpoint_as(key, node).await
}

/// A bare endpoint with `key` (hermetic, on loopback) that can dial `target` by its addresses.
pub async fn endpoint_as(
    key: iroh::SecretKey,
    target: &TestNode,
) -> (iroh::Endpoint, iroh::EndpointId) {
    endpoint_accepting(key, target, vec![]).await
}

/// [`endpoint_as`], also accepting connections for `alpns` (a hostile peer running a protocol).
pub async fn endpoint_accepting(
    key: iroh::SecretKey,
    target: &TestNode,
    alpns: Vec<Vec<u8>>,
) -> (iroh::Endpoint, iroh::EndpointId) {
    let book = iroh::address_lookup::MemoryLookup::new();
    let id: iroh::EndpointId = target.id.parse().unwrap();
    let mut addr = iroh::EndpointAddr::new(id);
    for a in &target.addrs {
        addr = addr.with_ip_addr(a.parse().unwrap());
    }
    book.add_endpoint_info(addr);
    let config = mcpmesh_net::endpoint::NetworkConfig::loopback();
    let ep = mcpmesh_net::endpoint::bind(key, &config, alpns, book)
        .await
        .unwrap();
    (ep, id)
}

/// Opens a stream, writes `bytes`, and returns the first line answered.
pub async fn exchange(
    ep: &iroh::Endpoint,
    target: iroh::EndpointId,
    bytes: &[u8],
) -> Option<Value> {
    let conn = ep
        .connect(target, mcpmesh_net::session::ALPN_MCP)
        .await
        .ok()?;
    let (mut send, recv) = conn.open_bi().await.ok()?;
    send.write_all(bytes).await.ok()?;
    let mut reader = mcpmesh_net::transport::FrameReader::new(recv, 1 << 20);
    let line = tokio::time::timeout(ANSWER_TIMEOUT, reader.next_line())
        .await
        .ok()?
        .ok()??;
    serde_json::from_slice(&line).ok()
}

// ---- third-party MCP software (tests/interop, installed by scripts/interop-deps) ----

/// Where `scripts/interop-deps` put the third-party software.
pub fn deps() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/interop");
    assert!(
        dir.join("installed").exists(),
        "the interop suite needs the pinned MCP SDK and server-everything: run scripts/interop-deps \
         (scripts/test does)"
    );
    dir
}

/// Two nodes: alice trusts bob, bob trusts alice.
pub fn two_nodes() -> (TestNode, TestNode) {
    two_nodes_with("")
}

/// Limits for suites that drive many third-party clients (or a hub's many sessions) through
/// one caller's budget at once. One whole client fits in the default budget (interop's
/// `the_official_python_sdk_uses_every_feature…` runs with it); the rate limit has its own
/// tests (guardrails, http).
pub const ROOM_FOR_A_WHOLE_CLIENT: &str = "[limits]\nrate_limit_per_min = 100000\n";

/// Two nodes with `extra` in both configs: alice trusts bob, bob trusts alice.
pub fn two_nodes_with(extra: &str) -> (TestNode, TestNode) {
    let alice = TestNode::start_with("alice", extra, &[]);
    let bob = TestNode::start_with("bob", extra, &[]);
    alice.trust(&bob);
    bob.trust(&alice);
    (alice, bob)
}

/// Three nodes with `extra` in every config, each trusting the other two.
pub fn three_nodes_with(extra: &str) -> (TestNode, TestNode, TestNode) {
    let (alice, bob) = two_nodes_with(extra);
    let carol = TestNode::start_with("carol", extra, &[]);
    for other in [&alice, &bob] {
        carol.trust(other);
        other.trust(&carol);
    }
    (alice, bob, carol)
}

/// The command line of `mcpmesh connect TARGET` for `node`, for a driver to spawn.
pub fn connect_args(node: &TestNode, target: &str) -> Vec<String> {
    vec![
        MCPMESH.into(),
        "--home".into(),
        node.home().display().to_string(),
        "connect".into(),
        target.into(),
    ]
}

pub fn python() -> PathBuf {
    deps().join("venv/bin/python")
}

pub fn interop_script(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/interop")
        .join(name)
        .display()
        .to_string()
}

/// Runs a Python driver to completion (bounded), echoing its report; returns its stdout.
pub async fn run_driver(args: &[String]) -> String {
    run_driver_with(args, &[]).await
}

/// The JSON a driver printed as its last line (its report).
pub fn report_line(out: &str) -> Value {
    serde_json::from_str(out.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("no report line ({e}): {out}"))
}

/// [`run_driver`] with extra environment variables.
pub async fn run_driver_with(args: &[String], envs: &[(&str, &str)]) -> String {
    let out = tokio::time::timeout(
        std::time::Duration::from_secs(240),
        tokio::process::Command::new(python())
            .args(args)
            .envs(envs.iter().copied())
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the driver finishes in time")
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    println!("$ python {}\n{stdout}", args.join(" "));
    assert!(
        out.status.success(),
        "{} failed ({}):\n{stdout}\n{}",
        args[0],
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// A helper process this test started (a server), its output read line by line all the time
/// (a full pipe would stall it) into a channel, and killed when dropped.
pub struct Started {
    pub child: Child,
    pub output: tokio::sync::mpsc::UnboundedReceiver<String>,
}

impl Started {
    /// Spawns `cmd` with stdout and stderr captured and waits (bounded) for a line containing
    /// `ready`; returns the process and that line.
    pub async fn until(cmd: &mut tokio::process::Command, ready: &str) -> (Started, String) {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let (tx, output) = tokio::sync::mpsc::unbounded_channel();
        for stream in [
            child
                .stdout
                .take()
                .map(|s| Box::new(s) as Box<dyn tokio::io::AsyncRead + Unpin + Send>),
            child
                .stderr
                .take()
                .map(|s| Box::new(s) as Box<dyn tokio::io::AsyncRead + Unpin + Send>),
        ]
        .into_iter()
        .flatten()
        {
            let tx = tx.clone();
            tokio::spawn(async move {
                use tokio::io::AsyncBufReadExt;
                let mut lines = tokio::io::BufReader::new(stream).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            });
        }
        let mut started = Started { child, output };
        let line = started.wait_for(ready).await;
        (started, line)
    }

    /// Takes output lines until one contains `needle` (bounded); returns it.
    pub async fn wait_for(&mut self, needle: &str) -> String {
        tokio::time::timeout(ANSWER_TIMEOUT, async {
            loop {
                match self.output.recv().await {
                    Some(line) if line.contains(needle) => return line,
                    Some(_) => {}
                    None => panic!("the output ended before {needle:?}"),
                }
            }
        })
        .await
        .unwrap_or_else(|_| panic!("no line with {needle:?} in time"))
    }

    /// Every output line read so far, without waiting.
    pub fn drain(&mut self) -> Vec<String> {
        let mut lines = Vec::new();
        while let Ok(line) = self.output.try_recv() {
            lines.push(line);
        }
        lines
    }
}

/// Asserts that a `modern_client.py` report shows a 2026-07-28 session: `server/discover`
/// first, and the `input_required` round trip completed by a retry.
pub fn assert_stateless_report(report: &str) {
    assert!(
        report.contains("ok   first-frame server/discover"),
        "{report}"
    );
    assert!(
        report.contains("input_required -> elicitation -> retry"),
        "{report}"
    );
}

/// server-everything in its Streamable HTTP mode on a loopback port (it logs on stdout and
/// stderr; both are kept, to watch for what it logs).
pub struct EverythingHttp {
    pub process: Started,
    pub url: String,
}

impl EverythingHttp {
    pub async fn start() -> Self {
        let port = free_port();
        let dir = deps().join("node_modules/@modelcontextprotocol/server-everything/dist");
        let mut cmd = tokio::process::Command::new("node");
        cmd.arg("--require")
            .arg(interop_script("loopback.cjs"))
            .arg(dir.join("index.js"))
            .arg("streamableHttp")
            .env("PORT", port.to_string());
        let (process, _) = Started::until(&mut cmd, "listening on port").await;
        EverythingHttp {
            process,
            url: format!("http://127.0.0.1:{port}/mcp"),
        }
    }
}

/// A port nothing listens on right now (the kernel's pick, released at once).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The long-running stub server on a Unix socket, recording every line it receives.
pub struct SocketServer {
    _process: Started,
    dir: tempfile::TempDir,
}

impl SocketServer {
    pub async fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut cmd = tokio::process::Command::new(stub());
        cmd.arg("--socket")
            .arg(dir.path().join("server.sock"))
            .arg("--record")
            .arg(dir.path().join("received"));
        // It says so on stderr once it listens.
        let (process, _) = Started::until(&mut cmd, "listening").await;
        SocketServer {
            _process: process,
            dir,
        }
    }

    pub fn path(&self) -> PathBuf {
        self.dir.path().join("server.sock")
    }

    pub fn received(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("received")).unwrap_or_default()
    }
}

/// Longest one step of the SDK driver may take (the driver bounds each step itself at 60 s).
pub const STEP_TIMEOUT: Duration = Duration::from_secs(90);

/// The SDK client of one hub (`hub_client.py`), driven one step at a time.
pub struct HubClient {
    pub child: Child,
    stdin: Option<ChildStdin>,
    lines: tokio::io::Lines<tokio::io::BufReader<ChildStdout>>,
    /// The driver's first line: the server it initialized (`{"ready": NAME}`).
    pub ready: Value,
}

impl HubClient {
    /// `mcpmesh --home <node> hub ARGS…` under the SDK client, initialized.
    pub async fn hub(node: &TestNode, args: &[&str]) -> Self {
        let mut command = vec![
            MCPMESH.to_owned(),
            "--home".into(),
            node.home().display().to_string(),
            "hub".into(),
        ];
        command.extend(args.iter().map(|a| a.to_string()));
        Self::start(&command).await
    }

    /// The SDK client of any stdio MCP server `command`, initialized.
    pub async fn start(command: &[String]) -> Self {
        let mut child = tokio::process::Command::new(python())
            .arg(interop_script("hub_client.py"))
            .arg("--")
            .args(command)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let stdin = child.stdin.take();
        let lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
        let mut client = HubClient {
            child,
            stdin,
            lines,
            ready: Value::Null,
        };
        let ready = client.next().await;
        assert!(ready.get("ready").is_some(), "{ready}");
        client.ready = ready;
        client
    }

    pub async fn next(&mut self) -> Value {
        let line = tokio::time::timeout(STEP_TIMEOUT, self.lines.next_line())
            .await
            .expect("the driver answers in time")
            .unwrap()
            .expect("the driver answers before it exits");
        let answer: Value = serde_json::from_str(&line).unwrap();
        assert!(answer.get("fatal").is_none(), "the driver failed: {answer}");
        answer
    }

    pub async fn step(&mut self, command: Value) -> Value {
        let mut line = serde_json::to_vec(&command).unwrap();
        line.push(b'\n');
        let stdin = self.stdin.as_mut().expect("the driver's stdin is open");
        stdin.write_all(&line).await.unwrap();
        stdin.flush().await.unwrap();
        self.next().await
    }

    /// Every tool listed, as (name, description).
    pub async fn tools(&mut self) -> Vec<(String, String)> {
        let listed = self.step(json!({ "op": "list" })).await;
        listed["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| {
                let text = |k: &str| t[k].as_str().unwrap_or_default().to_owned();
                (text("name"), text("description"))
            })
            .collect()
    }

    pub async fn call(&mut self, name: &str, arguments: Value) -> Value {
        self.step(json!({ "op": "call", "name": name, "arguments": arguments }))
            .await
    }

    /// Ends the session (the SDK closes the hub's stdin) and waits for the driver to exit.
    pub async fn close(mut self) {
        self.stdin = None;
        let status = tokio::time::timeout(STEP_TIMEOUT, self.child.wait())
            .await
            .expect("the driver exits in time")
            .unwrap();
        assert!(status.success(), "the driver exited {status}");
    }
}

/// Everything a node's telemetry lets out, for a test that searches it for secrets: the
/// metrics page on a loopback port, and an OTLP/HTTP sink on loopback keeping every raw trace
/// export (protobuf carries strings as their bytes, so a search of the bodies finds any).
pub struct TelemetrySink {
    metrics_port: u16,
    otlp: String,
    exports: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
}

impl TelemetrySink {
    pub async fn start() -> Self {
        let exports: std::sync::Arc<std::sync::Mutex<Vec<u8>>> = Default::default();
        let kept = exports.clone();
        let app = axum::Router::new().route(
            "/v1/traces",
            axum::routing::post(move |body: axum::body::Bytes| {
                let kept = kept.clone();
                async move {
                    kept.lock().unwrap().extend_from_slice(&body);
                    axum::http::StatusCode::OK
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let otlp = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        TelemetrySink {
            metrics_port: free_port(),
            otlp,
            exports,
        }
    }

    /// The `[telemetry]` section of the node whose telemetry this receives.
    pub fn config(&self) -> String {
        format!(
            "[telemetry]\nmetrics = \"127.0.0.1:{}\"\notlp = {:?}\n",
            self.metrics_port, self.otlp
        )
    }

    /// Spans leave the node a tenth of a second after they end (the SDK's standard variable).
    pub const QUICK_EXPORT: [(&str, &str); 1] = [("OTEL_BSP_SCHEDULE_DELAY", "100")];

    /// The metrics page as a scraper gets it now.
    pub fn metrics_page(&self) -> String {
        use std::io::{Read, Write};
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", self.metrics_port)).unwrap();
        stream.set_read_timeout(Some(ANSWER_TIMEOUT)).unwrap();
        write!(
            stream,
            "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nConnection: close\r\n\r\n",
            self.metrics_port
        )
        .unwrap();
        let mut page = String::new();
        stream.read_to_string(&mut page).unwrap();
        assert!(page.starts_with("HTTP/1.1 200"), "{page}");
        page
    }

    /// Waits until some trace export arrived, then fails the test if the metrics page or any
    /// export holds one of `secrets`.
    pub async fn assert_never_seen(&self, secrets: &[&str]) {
        let exported =
            eventually(ANSWER_TIMEOUT, || !self.exports.lock().unwrap().is_empty()).await;
        assert!(exported, "the node exported no spans");
        let page = self.metrics_page();
        let exports = self.exports.lock().unwrap().clone();
        for secret in secrets.iter().filter(|s| !s.is_empty()) {
            assert!(!page.contains(secret), "a secret on the metrics page");
            let found = exports
                .windows(secret.len())
                .any(|w| w == secret.as_bytes());
            assert!(!found, "a secret in the exported traces");
        }
    }
}

/// `node` serves `tests/interop/skills_server.py` (FastMCP) over two skills as `skills` to bob.
pub fn serve_skills(node: &TestNode) {
    let root = node.home().join("skills");
    write_skills(&root);
    let (py, server) = (
        python().display().to_string(),
        interop_script("skills_server.py"),
    );
    let root = root.display().to_string();
    node.serve("skills", &["bob"], &["--", &py, &server, &root]);
}

/// `node` serves `tests/interop/tasks_server.py` (FastMCP's tasks extension) as `tasks` to bob.
pub fn serve_tasks(node: &TestNode) {
    let (py, server) = (
        python().display().to_string(),
        interop_script("tasks_server.py"),
    );
    node.serve("tasks", &["bob"], &["--", &py, &server]);
}

/// Two skills below `root` (one with a supporting file, one under a prefix), as FastMCP's
/// `SkillsDirectoryProvider` serves a folder.
fn write_skills(root: &std::path::Path) {
    let workflow = root.join("git-workflow");
    std::fs::create_dir_all(workflow.join("references")).unwrap();
    std::fs::write(
        workflow.join("SKILL.md"),
        "---\nname: git-workflow\ndescription: Follow the team's Git conventions\nlicense: Apache-2.0\n---\n\nRead `references/BRANCHES.md` first.\n",
    )
    .unwrap();
    std::fs::write(
        workflow.join("references/BRANCHES.md"),
        "Branches are named topic/NAME.\n",
    )
    .unwrap();
    let refunds = root.join("acme/refunds");
    std::fs::create_dir_all(&refunds).unwrap();
    std::fs::write(
        refunds.join("SKILL.md"),
        "---\nname: refunds\ndescription: Process a refund per policy\n---\n\nWithin 30 days.\n",
    )
    .unwrap();
}

/// A server of the 2026-07-28 revision only: the SDK's dual-era server behind a filter that
/// refuses the handshake as such a server does (-32022 naming the one version it speaks).
pub const STATELESS_ONLY: &str = r#"
import json, subprocess, sys, threading
child = subprocess.Popen(sys.argv[1:], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
lock = threading.Lock()
def out(data):
    with lock:
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
def down():
    for line in child.stdout:
        out(line)
threading.Thread(target=down, daemon=True).start()
for line in sys.stdin.buffer:
    try:
        msg = json.loads(line)
    except ValueError:
        msg = None
    method = msg.get("method") if isinstance(msg, dict) else None
    if method == "initialize":
        asked = (msg.get("params") or {}).get("protocolVersion")
        error = {"code": -32022, "message": "this server speaks only 2026-07-28",
                 "data": {"requested": asked, "supported": ["2026-07-28"]}}
        out((json.dumps({"jsonrpc": "2.0", "id": msg.get("id"), "error": error}) + "\n").encode())
        continue
    if method == "notifications/initialized":
        continue
    child.stdin.write(line)
    child.stdin.flush()
child.stdin.close()
child.wait()
"#;
