//! The client side of the control socket, blocking: verbs are one request and one answer, and
//! `connect` turns the connection into a byte pipe. Starts the node when it is not running.

use std::io::{BufRead, BufReader, Read, Write};
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

/// A connection to the local node.
#[derive(Debug)]
pub struct ControlClient {
    writer: UnixStream,
    reader: BufReader<UnixStream>,
    next_id: u64,
    node_id: String,
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
        };
        let hello = client.call(methods::HELLO, json!({ "api": API_VERSION }))?;
        client.node_id = hello["id"].as_str().unwrap_or_default().to_owned();
        Ok(client)
    }

    /// The node's endpoint id, from `hello`.
    pub fn node_id(&self) -> &str {
        &self.node_id
    }

    /// One request, one answer.
    pub fn call(&mut self, method: &str, params: Value) -> Result<Value, ControlError> {
        self.next_id += 1;
        let mut line = serde_json::to_vec(&json!({
            "jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params,
        }))
        .map_err(|e| ControlError::new(codes::INVALID_PARAMS, e.to_string()))?;
        line.push(b'\n');
        self.writer.write_all(&line).map_err(io_err)?;
        let mut answer = Vec::new();
        let n = (&mut self.reader)
            .take(MAX_CONTROL_FRAME as u64)
            .read_until(b'\n', &mut answer)
            .map_err(io_err)?;
        if n == 0 {
            return Err(unavailable("the node closed the control connection"));
        }
        let resp: Response = serde_json::from_slice(&answer)
            .map_err(|e| unavailable(format!("the node sent a malformed answer: {e}")))?;
        match (resp.result, resp.error) {
            (_, Some(e)) => Err(e),
            (Some(v), None) => Ok(v),
            (None, None) => Ok(Value::Null),
        }
    }

    /// Subscribes to the node's events; each call to the returned iterator yields one event
    /// (`{"method":"event"|"lagged","params":…}`), ending when the node goes away.
    pub fn watch(mut self) -> Result<impl Iterator<Item = Value>, ControlError> {
        self.call(methods::WATCH, json!({}))?;
        Ok(self
            .reader
            .lines()
            .map_while(Result::ok)
            .filter_map(|l| serde_json::from_str(&l).ok()))
    }

    /// Opens an MCP session to `peer/service`; the returned stream then carries the session's
    /// bytes both ways, and the bytes are whatever the node already sent past its answer.
    pub fn open_session(
        mut self,
        peer: &str,
        service: &str,
        attach: Attach,
    ) -> Result<(UnixStream, Vec<u8>), ControlError> {
        let params = serde_json::to_value(SessionOpen {
            peer: peer.to_owned(),
            service: service.to_owned(),
            attach,
        })
        .map_err(|e| ControlError::invalid_params(e.to_string()))?;
        self.call(methods::SESSION_OPEN, params)?;
        let leftover = self.reader.buffer().to_vec();
        Ok((self.writer, leftover))
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
