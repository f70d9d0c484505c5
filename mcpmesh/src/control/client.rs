//! The client side of the control socket, blocking: verbs are one request and one answer, and
//! `connect` turns the connection into a byte pipe. Starts the node when it is not running.
//!
//! Every answer has a deadline ([`deadline`]): a node that is stuck fails the call with a
//! message that says so, rather than hanging the CLI, the hub or the gateway. Methods that
//! dial a peer wait longer than the node's own dial bound; a stream (`watch`, a session) is
//! timed only until its opening answer.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::{
    API_VERSION, Attach, ControlError, MAX_CONTROL_FRAME, Response, SessionOpen, codes, methods,
};
use crate::paths::Profile;

/// How long a verb waits for a node it started to become ready.
const START_TIMEOUT: Duration = Duration::from_secs(20);
/// How long the node may take over an ordinary answer (and over `hello`). Generous: a node on
/// a loaded machine is slow, not stuck.
const ANSWER: Duration = Duration::from_secs(30);
/// `node.shutdown` answers once every session and child has ended.
const SHUTDOWN: Duration = Duration::from_secs(60);
/// The node's dial timeout when its `hello` does not say (its default).
const DEFAULT_DIAL: Duration = Duration::from_secs(10);

/// A connection to the local node.
#[derive(Debug)]
pub struct ControlClient {
    writer: UnixStream,
    reader: BufReader<UnixStream>,
    next_id: u64,
    node_id: String,
    /// The node's own bound on one dial, from `hello`.
    dial: Duration,
}

impl ControlClient {
    /// Stops the profile's node, if one runs, and returns once it has exited (its children
    /// ended). `Ok(false)` when no node was running.
    pub fn shutdown(profile: &Profile) -> Result<bool, ControlError> {
        let Some(mut client) = Self::connect(profile)? else {
            return Ok(false);
        };
        client.call(methods::NODE_SHUTDOWN, json!({}))?;
        // The node holds its profile lock until its very last step; taking it means it is gone.
        let lock = std::fs::File::open(profile.lock_file()).map_err(io_err)?;
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(lock.lock().is_ok());
        });
        match rx.recv_timeout(START_TIMEOUT) {
            Ok(true) => Ok(true),
            _ => Err(unavailable("the node did not exit in time")),
        }
    }

    /// Connects to the profile's running node; `Ok(None)` when none is running.
    pub fn connect(profile: &Profile) -> Result<Option<Self>, ControlError> {
        match UnixStream::connect(profile.socket_path()) {
            Ok(stream) => Self::greet(stream).map(Some),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
                ) =>
            {
                Ok(None)
            }
            Err(e) => Err(unavailable(format!(
                "cannot reach the node at {}: {e}",
                profile.socket_path().display()
            ))),
        }
    }

    /// Connects to the profile's node, starting it (`<exe> daemon`) if it is not running.
    pub fn connect_or_start(profile: &Profile, exe: &Path) -> Result<Self, ControlError> {
        if let Some(client) = Self::connect(profile)? {
            return Ok(client);
        }
        start_daemon(profile, exe)?;
        // Only when two verbs started the node at once can the winner's socket lag behind the
        // loser's answer; give it a moment.
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(client) = Self::connect(profile)? {
                return Ok(client);
            }
            if Instant::now() > deadline {
                return Err(unavailable(
                    "the node started but its control socket is gone",
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn greet(stream: UnixStream) -> Result<Self, ControlError> {
        let reader = BufReader::new(stream.try_clone().map_err(io_err)?);
        let mut client = ControlClient {
            writer: stream,
            reader,
            next_id: 0,
            node_id: String::new(),
            dial: DEFAULT_DIAL,
        };
        let hello = client.call(methods::HELLO, json!({ "api": API_VERSION }))?;
        client.node_id = hello["id"].as_str().unwrap_or_default().to_owned();
        if let Some(secs) = hello["dial_timeout_secs"].as_u64() {
            client.dial = Duration::from_secs(secs.clamp(1, 3600));
        }
        Ok(client)
    }

    /// The node's endpoint id, from `hello`.
    pub fn node_id(&self) -> &str {
        &self.node_id
    }

    /// One request, one answer, within the method's [`deadline`].
    pub fn call(&mut self, method: &str, params: Value) -> Result<Value, ControlError> {
        self.next_id += 1;
        let mut line = serde_json::to_vec(&json!({
            "jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params,
        }))
        .map_err(|e| ControlError::new(codes::INVALID_PARAMS, e.to_string()))?;
        line.push(b'\n');
        let within = deadline(method, self.dial);
        let late = || {
            unavailable(format!(
                "the node did not answer `{method}` within {}; `mcpmesh doctor` checks it, and its log says what it is doing",
                shown(within)
            ))
        };
        let started = Instant::now();
        self.writer
            .set_write_timeout(Some(within))
            .map_err(io_err)?;
        if let Err(e) = self.writer.write_all(&line) {
            return Err(if timed_out(&e) { late() } else { io_err(e) });
        }
        let answer = self.read_line(started + within).map_err(|e| match e {
            ReadError::Late => late(),
            ReadError::Failed(e) => e,
        })?;
        let resp: Response = serde_json::from_slice(&answer)
            .map_err(|e| unavailable(format!("the node sent a malformed answer: {e}")))?;
        match (resp.result, resp.error) {
            (_, Some(e)) => Err(e),
            (Some(v), None) => Ok(v),
            (None, None) => Ok(Value::Null),
        }
    }

    /// One answer line, read by `deadline` (the socket's read timeout is the time left, so a
    /// node that sends an answer byte by byte cannot stretch it).
    fn read_line(&mut self, deadline: Instant) -> Result<Vec<u8>, ReadError> {
        let mut answer = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(ReadError::Late);
            }
            self.reader
                .get_ref()
                .set_read_timeout(Some(left))
                .map_err(|e| ReadError::Failed(io_err(e)))?;
            let buf = match self.reader.fill_buf() {
                Ok(buf) => buf,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) if timed_out(&e) => return Err(ReadError::Late),
                Err(e) => return Err(ReadError::Failed(io_err(e))),
            };
            if buf.is_empty() {
                return Err(ReadError::Failed(unavailable(
                    "the node closed the control connection",
                )));
            }
            let (taken, done) = match memchr::memchr(b'\n', buf) {
                Some(at) => (at + 1, true),
                None => (buf.len(), false),
            };
            answer.extend_from_slice(&buf[..taken]);
            self.reader.consume(taken);
            if done {
                return Ok(answer);
            }
            if answer.len() > MAX_CONTROL_FRAME {
                return Err(ReadError::Failed(unavailable(
                    "the node sent an answer larger than the control frame cap",
                )));
            }
        }
    }

    /// The connection with no deadline left on it: a stream's data comes when it comes.
    fn untimed(&self) -> Result<(), ControlError> {
        self.writer.set_read_timeout(None).map_err(io_err)?;
        self.writer.set_write_timeout(None).map_err(io_err)
    }

    /// Subscribes to the node's events; each call to the returned iterator yields one event
    /// (`{"method":"event"|"lagged","params":…}`), ending when the node goes away.
    pub fn watch(mut self) -> Result<impl Iterator<Item = Value>, ControlError> {
        self.call(methods::WATCH, json!({}))?;
        self.untimed()?;
        Ok(self
            .reader
            .lines()
            .map_while(Result::ok)
            .filter_map(|l| serde_json::from_str(&l).ok()))
    }

    /// Opens an MCP session to `peer/service`; the returned stream then carries the session's
    /// bytes both ways, and the bytes are whatever the node already sent past its answer.
    pub fn open_session(
        self,
        peer: &str,
        service: &str,
        attach: Attach,
    ) -> Result<(UnixStream, Vec<u8>), ControlError> {
        self.open_session_answered(peer, service, attach)
            .map(|(stream, leftover, _)| (stream, leftover))
    }

    /// [`Self::open_session`], with the node's answer (what it offers the opener, such as
    /// `ledger`; see docs/control-api.md).
    pub fn open_session_answered(
        mut self,
        peer: &str,
        service: &str,
        attach: Attach,
    ) -> Result<(UnixStream, Vec<u8>, Value), ControlError> {
        let params = serde_json::to_value(SessionOpen {
            peer: peer.to_owned(),
            service: service.to_owned(),
            attach,
        })
        .map_err(|e| ControlError::invalid_params(e.to_string()))?;
        let answer = self.call(methods::SESSION_OPEN, params)?;
        self.untimed()?;
        let leftover = self.reader.buffer().to_vec();
        Ok((self.writer, leftover, answer))
    }
}

enum ReadError {
    Late,
    Failed(ControlError),
}

/// How long the node may take to answer `method`, given its own bound on one dial.
fn deadline(method: &str, dial: Duration) -> Duration {
    #[cfg(test)]
    if let Some(short) = tests::SHORT_DEADLINE.get() {
        return short;
    }
    match method {
        // The node bounds opening a session by one dial.
        methods::SESSION_OPEN => dial + ANSWER,
        // Dial, ask and confirm, each bounded by a dial plus the exchange's own timeout.
        methods::PAIR | methods::ORG_JOIN => {
            let exchange =
                crate::pairing::EXCHANGE_TIMEOUT.max(crate::roster::sync::EXCHANGE_TIMEOUT);
            (dial + exchange) * 3 + ANSWER
        }
        methods::NODE_SHUTDOWN => SHUTDOWN,
        _ => ANSWER,
    }
}

fn timed_out(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    )
}

/// `30 s`, or `0.3 s` under a second.
fn shown(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{} s", d.as_secs())
    } else {
        format!("{:.1} s", d.as_secs_f64())
    }
}

fn io_err(e: std::io::Error) -> ControlError {
    unavailable(format!("control connection failed: {e}"))
}

fn unavailable(message: impl Into<String>) -> ControlError {
    ControlError::new(codes::NODE_UNAVAILABLE, message)
}

/// Starts `<exe> daemon` detached (its own process group, log to the profile's log file) and
/// waits for the line it prints once its control socket accepts connections.
fn start_daemon(profile: &Profile, exe: &Path) -> Result<(), ControlError> {
    profile
        .create_dirs()
        .map_err(|e| unavailable(format!("cannot create the node's directories: {e}")))?;
    let log_path = profile.log_file();
    let log = crate::files::open_append(&log_path, crate::files::Rule::Trusted).map_err(|e| {
        unavailable(format!(
            "cannot open the node log {}: {e}",
            log_path.display()
        ))
    })?;
    let mut cmd = Command::new(exe);
    if let Some(home) = &profile.home {
        cmd.arg("--home").arg(home);
    }
    crate::memory::tune_node(&mut cmd);
    cmd.args(["daemon", "--notify", "--log-file"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log)
        .process_group(0);
    let mut child = cmd
        .spawn()
        .map_err(|e| unavailable(format!("cannot start the node ({}): {e}", exe.display())))?;
    let Some(stdout) = child.stdout.take() else {
        return Err(unavailable("cannot watch the node start"));
    };
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx.recv_timeout(START_TIMEOUT).unwrap_or_default();
    let report: Value = serde_json::from_str(&line).unwrap_or(Value::Null);
    if let Some(err) = report.get("error") {
        let _ = child.wait();
        if err["code"] == json!(codes::CONFLICT) {
            // Another start won the race; its node owns the profile.
            return Ok(());
        }
        return Err(ControlError::new(
            err["code"].as_i64().unwrap_or(codes::NODE_UNAVAILABLE),
            err["message"].as_str().unwrap_or("the node did not start"),
        ));
    }
    if report.get("ready").is_some() {
        // The daemon runs on in its own process group.
        return Ok(());
    }
    let _ = child.kill();
    let _ = child.wait();
    Err(unavailable(format!(
        "the node did not start; see {}",
        log_path.display()
    )))
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use std::cell::Cell;
    use std::os::unix::net::UnixListener;

    thread_local! {
        /// A deadline for every call made on this thread, so a test waits tenths of a second.
        pub(super) static SHORT_DEADLINE: Cell<Option<Duration>> = const { Cell::new(None) };
    }

    /// The longest any call here may take before the test calls it hung.
    const HUNG: Duration = Duration::from_secs(20);

    /// A profile whose socket is served by `node` (one thread per connection), in the
    /// returned directory.
    fn fake_node(node: fn(UnixStream)) -> (tempfile::TempDir, Profile) {
        let home = tempfile::tempdir().unwrap();
        let profile = Profile::at(home.path());
        let listener = UnixListener::bind(profile.socket_path()).unwrap();
        std::thread::spawn(move || {
            for stream in listener.incoming().map_while(Result::ok) {
                std::thread::spawn(move || node(stream));
            }
        });
        (home, profile)
    }

    /// Runs `call` on a thread of its own with every deadline `short`; panics if it had not
    /// returned after [`HUNG`].
    fn bounded<T: Send + 'static>(
        short: Duration,
        call: impl FnOnce() -> T + Send + 'static,
    ) -> (T, Duration) {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            SHORT_DEADLINE.set(Some(short));
            let started = Instant::now();
            let out = call();
            let _ = tx.send((out, started.elapsed()));
        });
        rx.recv_timeout(HUNG)
            .unwrap_or_else(|_| panic!("the call had not returned after {HUNG:?}"))
    }

    /// Reads lines until the client goes, answering none.
    fn silent(stream: UnixStream) {
        let mut sink = Vec::new();
        let _ = BufReader::new(stream).read_until(0, &mut sink);
    }

    /// Answers `hello`, then reads on and answers nothing more.
    fn greets_then_stalls(stream: UnixStream) {
        let mut reader = BufReader::new(stream.try_clone().unwrap());
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        let hello = json!({"jsonrpc": "2.0", "id": 1,
            "result": {"api": API_VERSION, "version": "test", "id": "abc", "dial_timeout_secs": 10}});
        (&stream)
            .write_all(format!("{hello}\n").as_bytes())
            .unwrap();
        silent(reader.into_inner());
    }

    fn is_late(e: &ControlError) -> bool {
        e.code == codes::NODE_UNAVAILABLE
            && e.message.contains("did not answer")
            && e.message.contains("mcpmesh doctor")
    }

    #[test]
    fn a_node_that_never_answers_the_hello_fails_the_call_within_its_deadline() {
        let (_home, profile) = fake_node(silent);
        let short = Duration::from_millis(300);
        let (outcome, took) = bounded(short, move || ControlClient::connect(&profile));
        let e = outcome.unwrap_err();
        assert!(is_late(&e), "{e:?}");
        assert!(e.message.contains("`hello` within 0.3 s"), "{e:?}");
        assert!(took >= short && took < short * 10, "{took:?}");
    }

    #[test]
    fn a_node_that_answers_the_hello_and_then_stalls_fails_the_next_call_within_its_deadline() {
        let (_home, profile) = fake_node(greets_then_stalls);
        let short = Duration::from_millis(300);
        let (outcome, took) = bounded(short, move || {
            let mut client = ControlClient::connect(&profile)?.expect("a node");
            assert_eq!(client.node_id(), "abc");
            client.call(methods::STATUS, json!({}))
        });
        let e = outcome.unwrap_err();
        assert!(is_late(&e) && e.message.contains("`status`"), "{e:?}");
        assert!(took >= short && took < short * 10, "{took:?}");
    }

    #[test]
    fn a_stream_is_timed_until_its_answer_only() {
        // The node answers `hello` and `watch`, then sends an event after longer than the
        // deadline: the watcher still gets it.
        fn node(stream: UnixStream) {
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            for n in 1..=2 {
                let mut line = String::new();
                reader.read_line(&mut line).unwrap();
                let answer = json!({"jsonrpc": "2.0", "id": n, "result": {"api": API_VERSION}});
                (&stream)
                    .write_all(format!("{answer}\n").as_bytes())
                    .unwrap();
            }
            std::thread::sleep(Duration::from_millis(900));
            let event = json!({"jsonrpc": "2.0", "method": "event", "params": {"seq": 1}});
            let _ = (&stream).write_all(format!("{event}\n").as_bytes());
            silent(stream);
        }
        let (_home, profile) = fake_node(node);
        let (first, _) = bounded(Duration::from_millis(300), move || {
            let client = ControlClient::connect(&profile).unwrap().unwrap();
            client.watch().unwrap().next()
        });
        assert_eq!(first.unwrap()["params"]["seq"], 1);
    }

    #[test]
    fn dialing_methods_wait_longer_than_the_nodes_own_bound() {
        let dial = Duration::from_secs(25);
        assert!(deadline(methods::SESSION_OPEN, dial) > dial);
        assert!(deadline(methods::PAIR, dial) > (dial + crate::pairing::EXCHANGE_TIMEOUT) * 3);
        assert!(
            deadline(methods::ORG_JOIN, dial) > (dial + crate::roster::sync::EXCHANGE_TIMEOUT) * 3
        );
        assert_eq!(deadline(methods::STATUS, dial), ANSWER);
        assert_eq!(shown(ANSWER), "30 s");
    }
}
