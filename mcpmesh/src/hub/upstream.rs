//! One upstream session of the hub: a mesh session to `peer/service` opened through the local
//! node like `connect` does, on which the hub is the MCP client.
//!
//! The hub's own requests get fresh numeric ids and wait for their answers here. Everything
//! the server sends goes to the hub's router in the order it was sent, answers too: the router
//! hands an answer to its waiter only after what came before it (a call's progress, a request
//! to the client) went on, so an answer never overtakes them. When the session ends, every
//! request still waiting learns so, after the answers already read.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use mcpmesh_net::errors::{self, ErrorCode};
use mcpmesh_net::transport::{FrameReader, MAX_FRAME, TransportError};
use serde_json::{Value, json};
use tokio::net::UnixStream;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::Target;
use super::era::{self, Envelope, Era};
use super::outlet;
use crate::control::Attach;
use crate::control::client::ControlClient;
use crate::paths::Profile;

/// How long an upstream server gets to answer `initialize` (or `server/discover`).
const HANDSHAKE: Duration = Duration::from_secs(30);
/// How long a closed session's reader may take to see its end.
const CLOSE_WAIT: Duration = Duration::from_secs(2);
/// Lines queued for a session's writer before a sender waits.
const LINES_QUEUED: usize = 64;

/// What a server sent, in the order it sent it; `Ended` follows its last frame.
#[derive(Debug)]
pub(crate) enum Inbound {
    /// A request or a notification of the server's.
    Frame {
        from: Arc<Upstream>,
        frame: Value,
    },
    /// The server's answer to the hub's request `id`.
    Answer {
        from: Arc<Upstream>,
        id: u64,
        answer: Answer,
    },
    Ended(Arc<Upstream>),
}

/// A server's answer to one of the hub's requests. A plain result stays the line it came as
/// until the hub must look inside it ([`Answer::into_frame`]): most pass to the client with
/// only their id changed, and an 8 MiB result is then copied once, not parsed and written
/// again.
#[derive(Debug)]
pub(crate) enum Answer {
    /// A line of exactly `jsonrpc`, `id` and `result` (in any order), and where the first and
    /// the last lie in it: all an answer passed on whole needs, found in the one read of it.
    Plain {
        line: bytes::Bytes,
        jsonrpc: std::ops::Range<usize>,
        result: std::ops::Range<usize>,
    },
    /// An answer the hub read already, or made.
    Frame(Value),
}

impl Answer {
    pub fn into_frame(self) -> Value {
        match self {
            Answer::Plain { line, .. } => serde_json::from_slice(&line).unwrap_or(Value::Null),
            Answer::Frame(frame) => frame,
        }
    }

    /// The `jsonrpc` member's and the result's bytes of a plain answer.
    pub fn plain_parts(&self) -> Option<(&[u8], &[u8])> {
        match self {
            Answer::Plain {
                line,
                jsonrpc,
                result,
            } => Some((line.get(jsonrpc.clone())?, line.get(result.clone())?)),
            _ => None,
        }
    }
}

/// Why an upstream request got no answer.
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum UpstreamError {
    /// The session could not be opened (the node's code and message).
    #[error("{message}")]
    Open { code: i64, message: String },
    /// The session ended before the answer came.
    #[error("the session ended before it answered")]
    Lost,
    #[error("it did not answer `initialize` within {0:?}")]
    Handshake(Duration),
    /// The serving node or the server answered `initialize` with an error.
    #[error("{message}")]
    Refused { code: i64, message: String },
}

/// Where the node is and how to start it.
#[derive(Debug, Clone)]
pub(crate) struct NodeAccess {
    pub profile: Profile,
    pub exe: PathBuf,
}

impl NodeAccess {
    /// A control connection to the node, started when it is not running.
    pub async fn control(&self) -> Result<ControlClient, UpstreamError> {
        let (profile, exe) = (self.profile.clone(), self.exe.clone());
        blocking(move || ControlClient::connect_or_start(&profile, &exe)).await
    }

    /// Calls one control method of the running node; `None` when it is not running (it is
    /// not started for this: a node someone stopped stays stopped).
    pub async fn call_running(&self, method: &'static str, params: Value) -> Option<Value> {
        let profile = self.profile.clone();
        tokio::task::spawn_blocking(move || {
            let mut client = ControlClient::connect(&profile).ok()??;
            client.call(method, params).ok()
        })
        .await
        .ok()?
    }

    /// Calls one control method, starting the node when it is not running.
    pub async fn call(&self, method: &'static str, params: Value) -> Result<Value, UpstreamError> {
        let mut client = self.control().await?;
        blocking(move || client.call(method, params)).await
    }
}

/// Runs a blocking control call off the runtime; its failure (or the task's) as an opening
/// error carrying the node's code.
async fn blocking<T: Send + 'static>(
    call: impl FnOnce() -> Result<T, crate::control::ControlError> + Send + 'static,
) -> Result<T, UpstreamError> {
    tokio::task::spawn_blocking(call)
        .await
        .map_err(|e| UpstreamError::Open {
            code: mcpmesh_net::errors::ErrorCode::Unreachable.code(),
            message: e.to_string(),
        })?
        .map_err(|e| UpstreamError::Open {
            code: e.code,
            message: e.message,
        })
}

/// How a session greets its server.
#[derive(Debug, Clone)]
pub(crate) struct Hello {
    /// The `initialize` params for a server of the handshake era.
    pub handshake: Value,
    /// For a client of the stateless era: its envelope, and `server/discover` is tried first.
    pub stateless: Option<Envelope>,
    /// The era this service was found to speak before (the listing cache's), if known.
    pub known: Option<Era>,
    /// For a client of the handshake era: the envelope its `initialize` params make, for a
    /// server that refuses the handshake (one of the stateless revision only).
    pub fallback: Option<Envelope>,
}

/// A live session to one service.
#[derive(Debug)]
pub(crate) struct Upstream {
    pub target: Target,
    /// Whether the server speaks the stateless era on this session (else the handshake's).
    stateless: AtomicBool,
    /// Whether this session probed the server with `server/discover`.
    probed: AtomicBool,
    /// The envelope a stateless server's requests carry when the client's own gives none.
    envelope: Option<Envelope>,
    /// Lines to the node's socket, written by the session's writer ([`outlet::write_out`]).
    lines: mpsc::Sender<Vec<u8>>,
    /// Tells the writer to write what is queued and shut the socket's write half.
    closing: CancellationToken,
    next_id: AtomicU64,
    waiting: StdMutex<HashMap<u64, oneshot::Sender<Answer>>>,
    /// Fires when the session has ended (either side).
    pub ended: CancellationToken,
    /// The server's `initialize` result.
    pub init: StdMutex<Value>,
}

impl Upstream {
    /// Opens a session to `target` in the server's own era: for a stateless client,
    /// `server/discover` first (unless the service was found to speak only the handshake),
    /// and the handshake when the server does not speak the stateless revision; for a client
    /// of the handshake era, the handshake with its own `initialize` params, so the server sees
    /// its capabilities.
    pub async fn open(
        node: &NodeAccess,
        target: &Target,
        hello: Hello,
        inbound: mpsc::Sender<Inbound>,
    ) -> Result<Arc<Upstream>, UpstreamError> {
        let probe = hello.stateless.is_some() && hello.known != Some(Era::Handshake);
        match Self::open_with(node, target, &hello, inbound.clone(), probe).await {
            // A server that ends its session on a request before `initialize` still gets the
            // handshake, on a new session.
            Err(UpstreamError::Lost) if probe => {
                let up = Self::open_with(node, target, &hello, inbound, false).await?;
                // What the probe found: a server that does not speak the stateless era.
                up.probed.store(true, Ordering::Release);
                Ok(up)
            }
            // A server that ends its session on `initialize` gets `server/discover` on a new one.
            Err(UpstreamError::Lost) if hello.fallback.is_some() => {
                let hello = Hello {
                    stateless: hello.fallback.clone(),
                    ..hello
                };
                Self::open_with(node, target, &hello, inbound, true).await
            }
            opened => opened,
        }
    }

    async fn open_with(
        node: &NodeAccess,
        target: &Target,
        hello: &Hello,
        inbound: mpsc::Sender<Inbound>,
        probe: bool,
    ) -> Result<Arc<Upstream>, UpstreamError> {
        let client = node.control().await?;
        let (peer, service) = (target.peer.clone(), target.service.clone());
        let (stream, _leftover) =
            blocking(move || client.open_session(&peer, &service, Attach::Stream)).await?;
        let stream = stream
            .set_nonblocking(true)
            .and_then(|()| UnixStream::from_std(stream))
            .map_err(|e| UpstreamError::Open {
                code: mcpmesh_net::errors::ErrorCode::Unreachable.code(),
                message: e.to_string(),
            })?;
        let (reader, writer) = stream.into_split();
        let (lines, queued) = mpsc::channel(LINES_QUEUED);
        let probe = hello.stateless.clone().filter(|_| probe);
        let probing = probe.is_some();
        let up = Arc::new(Upstream {
            target: target.clone(),
            // The probe goes out as a stateless request.
            stateless: AtomicBool::new(probe.is_some()),
            probed: AtomicBool::new(probe.is_some()),
            envelope: hello.stateless.clone().or_else(|| hello.fallback.clone()),
            lines,
            closing: CancellationToken::new(),
            next_id: AtomicU64::new(1),
            waiting: StdMutex::new(HashMap::new()),
            ended: CancellationToken::new(),
            init: StdMutex::new(Value::Null),
        });
        tokio::spawn(read_loop(up.clone(), reader, inbound));
        up.spawn_writer(queued, writer);

        if let Some(envelope) = probe {
            if up.discover(&envelope).await {
                return Ok(up);
            }
            if !up.is_live() {
                up.close().await;
                return Err(UpstreamError::Lost);
            }
            // Not the stateless revision (an error, or only handshake versions): the
            // handshake on the same session.
        }
        let answer =
            tokio::time::timeout(HANDSHAKE, up.request("initialize", hello.handshake.clone()))
                .await
                .map_err(|_| UpstreamError::Handshake(HANDSHAKE));
        let answer = match answer {
            Ok(Ok(answer)) => answer,
            Ok(Err(e)) | Err(e) => {
                up.close().await;
                return Err(e);
            }
        };
        match answer.get("result") {
            Some(result) => {
                *up.init.lock().unwrap_or_else(|p| p.into_inner()) = result.clone();
            }
            None => {
                // A server of the stateless revision only refuses the handshake: it may still
                // be spoken to in its own era, on the same session.
                if !probing
                    && let Some(envelope) = &hello.fallback
                    && up.discover(envelope).await
                {
                    return Ok(up);
                }
                up.close().await;
                let message = answer
                    .pointer("/error/message")
                    .and_then(Value::as_str)
                    .unwrap_or("no result")
                    .to_owned();
                let code = answer
                    .pointer("/error/code")
                    .and_then(Value::as_i64)
                    .unwrap_or(-32603);
                return Err(UpstreamError::Refused { code, message });
            }
        }
        up.notify("notifications/initialized", None).await;
        Ok(up)
    }

    /// Asks the server `server/discover` with `envelope`: whether it speaks the stateless
    /// revision (the session then does; its answer is the session's greeting).
    async fn discover(&self, envelope: &Envelope) -> bool {
        self.stateless.store(true, Ordering::Release);
        self.probed.store(true, Ordering::Release);
        let mut params = Value::Null;
        envelope.stamp(&mut params);
        let answer = tokio::time::timeout(HANDSHAKE, self.request("server/discover", params)).await;
        if let Ok(Ok(answer)) = answer
            && let Some(result) = answer.get("result").filter(|r| era::speaks_stateless(r))
        {
            *self.init.lock().unwrap_or_else(|p| p.into_inner()) = result.clone();
            return true;
        }
        self.stateless.store(false, Ordering::Release);
        false
    }

    /// The era the server speaks on this session.
    pub fn era(&self) -> Era {
        if self.stateless.load(Ordering::Acquire) {
            Era::Stateless
        } else {
            Era::Handshake
        }
    }

    /// What this session's `server/discover` probe found the server speaks: `None` when it
    /// made none (a handshake-era client's session says nothing of the stateless era).
    pub fn found(&self) -> Option<Era> {
        self.probed.load(Ordering::Acquire).then(|| self.era())
    }

    /// The server's capabilities, from its `initialize` (or `server/discover`) answer.
    pub fn capabilities(&self) -> Value {
        self.init
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get("capabilities")
            .cloned()
            .unwrap_or(Value::Null)
    }

    /// The server's own `instructions`, from the same answer.
    pub fn instructions(&self) -> Option<String> {
        self.init
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get("instructions")
            .and_then(Value::as_str)
            .map(str::to_owned)
    }

    /// Who the server says it is (`serverInfo` of its `initialize` answer, or what its
    /// `server/discover` answer names in `_meta`).
    pub fn server_info(&self) -> Option<Value> {
        let init = self.init.lock().unwrap_or_else(|p| p.into_inner());
        init.get("serverInfo")
            .or_else(|| init.get("_meta")?.get(super::era::META_SERVER_INFO))
            .filter(|info| info.is_object())
            .cloned()
    }

    /// Sends a request and waits for the whole answer frame.
    pub async fn request(&self, method: &str, params: Value) -> Result<Value, UpstreamError> {
        let (_, rx) = self.start(method, params).await?;
        rx.await
            .map(Answer::into_frame)
            .map_err(|_| UpstreamError::Lost)
    }

    /// Writes what the session queues to the node's socket; a failed write ends the session.
    fn spawn_writer(
        &self,
        queued: mpsc::Receiver<Vec<u8>>,
        writer: tokio::net::unix::OwnedWriteHalf,
    ) {
        let (closing, ended) = (self.closing.clone(), self.ended.clone());
        tokio::spawn(async move {
            if outlet::write_out(queued, writer, closing).await == outlet::Ended::Failed {
                ended.cancel();
            }
        });
    }

    /// Sends a request and returns its id and where its answer will arrive. A stateless
    /// server's request carries the client's envelope (or, for the hub's own requests, the one
    /// the session was opened with); a handshake-era server's carries none.
    pub async fn start(
        &self,
        method: &str,
        params: Value,
    ) -> Result<(u64, oneshot::Receiver<Answer>), UpstreamError> {
        self.start_noting(method, params, |_| {}).await
    }

    /// As [`Upstream::start`], with `noted` told the request's id before the request goes: what
    /// the server sends back during it (its own requests) may arrive before `start` returns.
    pub async fn start_noting(
        &self,
        method: &str,
        mut params: Value,
        noted: impl FnOnce(u64),
    ) -> Result<(u64, oneshot::Receiver<Answer>), UpstreamError> {
        match (&self.envelope, self.era()) {
            (Some(envelope), Era::Stateless) => {
                if Envelope::of(&params).is_none_or(|e| e.is_err()) {
                    envelope.stamp(&mut params);
                }
            }
            _ => era::strip(&mut params),
        }
        self.start_line(noted, |id| {
            let mut frame = json!({"jsonrpc": "2.0", "id": id, "method": method});
            if !params.is_null() {
                frame["params"] = params;
            }
            serde_json::to_vec(&frame).ok()
        })
        .await
    }

    /// Sends a request whose params are JSON text already, written into the line by
    /// `write_params`, and returns its id and where its answer will arrive. For a session whose
    /// server speaks the handshake era, with params that carry no envelope: nothing in them is
    /// the session's to stamp or strip.
    pub async fn start_written(
        &self,
        method: &str,
        params_len: usize,
        write_params: impl FnOnce(&mut Vec<u8>),
    ) -> Result<(u64, oneshot::Receiver<Answer>), UpstreamError> {
        self.start_line(
            |_| {},
            |id| {
                let mut line = Vec::with_capacity(params_len + method.len() + 64);
                line.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"id\":");
                line.extend_from_slice(id.to_string().as_bytes());
                line.extend_from_slice(b",\"method\":");
                serde_json::to_writer(&mut line, method).ok()?;
                line.extend_from_slice(b",\"params\":");
                write_params(&mut line);
                line.push(b'}');
                Some(line)
            },
        )
        .await
    }

    /// Sends the request `frame` makes of its id (a line without its newline), with `noted`
    /// told the id first.
    async fn start_line(
        &self,
        noted: impl FnOnce(u64),
        frame: impl FnOnce(u64) -> Option<Vec<u8>>,
    ) -> Result<(u64, oneshot::Receiver<Answer>), UpstreamError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.waiting().insert(id, tx);
        noted(id);
        let sent = match frame(id) {
            Some(line) => self.queue(line).await,
            None => false,
        };
        if !sent {
            self.waiting().remove(&id);
            return Err(UpstreamError::Lost);
        }
        Ok((id, rx))
    }

    /// Gives up waiting for request `id` (its caller went away).
    pub fn forget(&self, id: u64) {
        self.waiting().remove(&id);
    }

    pub async fn notify(&self, method: &str, params: Option<Value>) -> bool {
        let mut frame = json!({"jsonrpc": "2.0", "method": method});
        if let Some(params) = params {
            frame["params"] = params;
        }
        self.send(&frame).await
    }

    /// Queues one frame for the session's writer; `false` when the session is gone. A write
    /// that fails later ends the session, and what waits on it is told so.
    pub async fn send(&self, frame: &Value) -> bool {
        match serde_json::to_vec(frame) {
            Ok(line) => self.queue(line).await,
            Err(_) => false,
        }
    }

    /// Queues one line (without its newline) for the session's writer; as [`Upstream::send`].
    async fn queue(&self, mut line: Vec<u8>) -> bool {
        line.push(b'\n');
        if self.ended.is_cancelled() || self.closing.is_cancelled() {
            return false;
        }
        self.lines.send(line).await.is_ok()
    }

    /// Ends the session: the node then ends the remote one (and its child). Waits briefly for
    /// the end to come back.
    pub async fn close(&self) {
        self.closing.cancel();
        let _ = tokio::time::timeout(CLOSE_WAIT, self.ended.cancelled()).await;
        self.ended.cancel();
    }

    pub fn is_live(&self) -> bool {
        !self.ended.is_cancelled()
    }

    /// Hands an answer to the request `id` waiting for it, if one still does.
    pub fn answered(&self, id: u64, answer: Answer) {
        let waiter = self.waiting().remove(&id);
        if let Some(tx) = waiter {
            let _ = tx.send(answer);
        }
    }

    /// Tells every request still waiting that the session is gone.
    pub fn abandon_waiting(&self) {
        self.waiting().clear();
    }

    fn waiting(&self) -> std::sync::MutexGuard<'_, HashMap<u64, oneshot::Sender<Answer>>> {
        self.waiting.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Reads the server's frames until the session ends, passing each to the router.
async fn read_loop(
    up: Arc<Upstream>,
    reader: tokio::net::unix::OwnedReadHalf,
    inbound: mpsc::Sender<Inbound>,
) {
    let mut frames = FrameReader::new(reader, MAX_FRAME);
    loop {
        let line = tokio::select! {
            line = frames.next_line() => line,
            _ = up.ended.cancelled() => break,
        };
        let line = match line {
            Ok(Some(line)) => line,
            Ok(None) => break,
            Err(TransportError::FrameTooLarge(cap)) => {
                tracing::warn!(target = %up.target, "dropped a frame over the {cap}-byte cap");
                continue;
            }
            Err(e) => {
                tracing::debug!(target = %up.target, "upstream read failed: {e}");
                break;
            }
        };
        let Some(inbound_frame) = inbound_of(&up, line) else {
            tracing::warn!(target = %up.target, "dropped a frame that is not a JSON-RPC object");
            continue;
        };
        if inbound.send(inbound_frame).await.is_err() {
            break;
        }
    }
    up.ended.cancel();
    up.closing.cancel();
    if inbound.send(Inbound::Ended(up.clone())).await.is_err() {
        up.abandon_waiting();
    }
}

/// What `line` is: a plain answer to one of the hub's requests (kept as the line), or any other
/// frame (read whole). `None` for a line that is not a JSON object.
fn inbound_of(up: &Arc<Upstream>, line: bytes::Bytes) -> Option<Inbound> {
    if let Some((id, jsonrpc, result)) = plain_answer(&line) {
        return Some(Inbound::Answer {
            from: up.clone(),
            id,
            answer: Answer::Plain {
                line,
                jsonrpc,
                result,
            },
        });
    }
    // Anything else is read whole once: an error answer is read by its waiter anyway.
    let Value::Object(members) = serde_json::from_slice::<Value>(&line).ok()? else {
        return None;
    };
    let frame = Value::Object(members);
    let ours = frame["id"]
        .as_u64()
        .filter(|_| frame.get("method").is_none());
    let Some(id) = ours else {
        return Some(Inbound::Frame {
            from: up.clone(),
            frame,
        });
    };
    // The mesh saying the session was lost (the serving node strips that mark from a server's
    // own errors): it is over, whatever the stream's end has yet to say, and the next call must
    // open a new one rather than go where nothing answers.
    if errors::mesh_code(&frame) == Some(ErrorCode::Unreachable.code()) {
        up.ended.cancel();
    }
    Some(Inbound::Answer {
        from: up.clone(),
        id,
        answer: Answer::Frame(frame),
    })
}

/// An answer of exactly `jsonrpc`, `id` (one of the hub's) and `result`: its id, and where its
/// `jsonrpc` member and its result lie in `line`. Anything else (an error, a request, a
/// notification, a member more) is `None`, and read the ordinary way.
fn plain_answer(line: &[u8]) -> Option<(u64, std::ops::Range<usize>, std::ops::Range<usize>)> {
    use serde_json::value::RawValue;
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Plain<'a> {
        #[serde(borrow)]
        jsonrpc: &'a RawValue,
        #[serde(borrow)]
        id: &'a RawValue,
        #[serde(borrow)]
        result: &'a RawValue,
    }
    let plain: Plain = serde_json::from_slice(line).ok()?;
    let id = serde_json::from_str::<u64>(plain.id.get()).ok()?;
    // Each member borrows from `line`: its place is its address's distance from the start.
    let place = |raw: &RawValue| {
        let start = (raw.get().as_ptr() as usize).checked_sub(line.as_ptr() as usize)?;
        let end = start.checked_add(raw.get().len())?;
        (end <= line.len()).then_some(start..end)
    };
    Some((id, place(plain.jsonrpc)?, place(plain.result)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_mesh_says_a_session_was_lost() {
        let mesh = r#"{"jsonrpc":"2.0","id":3,"error":{"code":-32055,"message":"lost","data":{"source":"mcpmesh"}}}"#;
        assert_eq!(
            errors::mesh_code(&serde_json::from_str(mesh).unwrap()),
            Some(-32055)
        );
        for server in [
            r#"{"jsonrpc":"2.0","id":3,"error":{"code":-32055,"message":"mine"}}"#,
            r#"{"jsonrpc":"2.0","id":3,"error":{"code":-32055,"message":"mine","data":{"source":"me"}}}"#,
            r#"{"jsonrpc":"2.0","id":3,"result":{}}"#,
        ] {
            assert_eq!(
                errors::mesh_code(&serde_json::from_str(server).unwrap()),
                None,
                "{server}"
            );
        }
    }

    #[test]
    fn a_plain_answer_is_found_in_one_read_and_anything_else_is_read_the_ordinary_way() {
        let line = r#"{"result":{"content":[{"type":"text","text":"é"}]},"id":7,"jsonrpc":"2.0"}"#;
        let (id, jsonrpc, result) = plain_answer(line.as_bytes()).unwrap();
        assert_eq!(id, 7);
        assert_eq!(&line[jsonrpc], r#""2.0""#);
        assert_eq!(&line[result], r#"{"content":[{"type":"text","text":"é"}]}"#);
        for other in [
            // Errors are named after their service; a member more is kept.
            r#"{"jsonrpc":"2.0","id":7,"error":{"code":-32055,"message":"gone"}}"#,
            r#"{"jsonrpc":"2.0","id":7,"result":{},"extra":1}"#,
            r#"{"jsonrpc":"2.0","id":7,"result":{},"result":{}}"#,
            r#"{"id":7,"result":{}}"#,
            // Not an id of the hub's, not a whole line, a request.
            r#"{"jsonrpc":"2.0","id":"7","result":{}}"#,
            r#"{"jsonrpc":"2.0","id":7,"result":{}"#,
            r#"{"jsonrpc":"2.0","id":7,"method":"ping"}"#,
        ] {
            assert_eq!(plain_answer(other.as_bytes()), None, "{other}");
        }
    }
}
