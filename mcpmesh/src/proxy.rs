//! The consuming side of a session: `mcpmesh connect` and the daemon half it talks to.
//!
//! `connect` is a plain byte pipe between its stdio and the node's control socket. The daemon
//! half ([`tunnel`]) moves those bytes over the mesh stream unchanged and remembers which
//! requests are still unanswered, so that when the session fails it can answer every one of
//! them with the error band's code instead of leaving the client hanging.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream as StdUnixStream;
use std::sync::Mutex as StdMutex;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use mcpmesh_net::errors::{ErrorCode, ErrorFrame};
use mcpmesh_net::jsonrpc::{self, Kind};
use mcpmesh_net::pump::{PumpError, forward, write_run};
use mcpmesh_net::session::{OpenedSession, close_reason_code};
use mcpmesh_net::transport::{FrameReader, MAX_FRAME, lines};
use serde_json::value::RawValue;
use tokio::io::AsyncWriteExt;
use tokio::net::UnixStream;
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

use crate::control::ControlError;

/// After the client closed its side, how long responses still in flight may take to arrive.
const DRAIN: Duration = Duration::from_secs(2);
/// After a failure, how long requests the client is still sending get answered.
const LINGER: Duration = Duration::from_secs(5);
/// Unanswered requests remembered per session; past this, new ones are not tracked.
const MAX_TRACKED: usize = 65_536;
/// Bytes moved per read by `connect`.
const PIPE_CHUNK: usize = 256 * 1024;

/// Requests sent and not yet answered, by id.
#[derive(Debug, Default)]
struct Outstanding {
    ids: HashMap<String, Box<RawValue>>,
}

impl Outstanding {
    fn client_sent(&mut self, run: &Bytes) {
        for line in lines(run) {
            let Some(peek) = jsonrpc::peek(line) else {
                continue;
            };
            if let Some(cancelled) = peek.cancelled_request() {
                self.ids.remove(&jsonrpc::id_key(cancelled));
            } else if let (Kind::Request, Some(id)) = (peek.kind(), peek.id)
                && self.ids.len() < MAX_TRACKED
            {
                self.ids.insert(jsonrpc::id_key(id), id.to_owned());
            }
        }
    }

    fn server_sent(&mut self, run: &Bytes) {
        if self.ids.is_empty() {
            return;
        }
        for line in lines(run) {
            let Some(peek) = jsonrpc::peek(line) else {
                continue;
            };
            if let (Kind::Response, Some(id)) = (peek.kind(), peek.id) {
                self.ids.remove(&jsonrpc::id_key(id));
            }
        }
    }

    /// One error line per unanswered request, and forgets them.
    fn answer_all(&mut self, code: ErrorCode, message: &str) -> Vec<u8> {
        let mut out = Vec::new();
        for (_, id) in self.ids.drain() {
            out.extend(
                ErrorFrame::new(code)
                    .id(Some(&id))
                    .message(message)
                    .to_line(),
            );
        }
        out
    }
}

/// How the daemon half of a session ended.
enum End {
    ClientClosed,
    ClientGone,
    ServerClosed,
    Lost(ErrorCode),
    Shutdown,
}

/// The error every unanswered request gets when a session ends this way.
fn failure(end: End) -> (ErrorCode, &'static str) {
    match end {
        End::ServerClosed | End::ClientClosed | End::ClientGone => (
            ErrorCode::Unreachable,
            "the service ended the session before answering",
        ),
        End::Lost(ErrorCode::UnknownService) => (
            ErrorCode::UnknownService,
            "the peer does not trust this node",
        ),
        End::Lost(ErrorCode::NotReady) => {
            (ErrorCode::NotReady, "session severed by a trust change")
        }
        End::Lost(code) => (code, "peer unreachable or session lost before the answer"),
        End::Shutdown => (ErrorCode::Unreachable, "the local node is shutting down"),
    }
}

/// Runs one session between a `connect` process (`local`) and the mesh stream, until either
/// side ends it. On failure every unanswered request gets an error of the band.
pub async fn tunnel(
    local: UnixStream,
    leftover: BytesMut,
    session: OpenedSession,
    shutdown: CancellationToken,
) {
    let OpenedSession {
        send,
        recv,
        connection,
    } = session;
    let (local_r, local_w) = local.into_split();
    let mut local_r = FrameReader::new(local_r, MAX_FRAME);
    let mut mesh_r = FrameReader::new(recv, MAX_FRAME);
    let local_w = Mutex::new(local_w);
    let mesh_w = Mutex::new(send);
    let outstanding = StdMutex::new(Outstanding::default());
    let track = |f: &dyn Fn(&mut Outstanding)| {
        f(&mut outstanding.lock().unwrap_or_else(|p| p.into_inner()))
    };

    if !leftover.is_empty() {
        let run = leftover.freeze();
        track(&|o| o.client_sent(&run));
        let _ = write_run(&mesh_w, &run).await;
    }

    let end = tokio::select! {
        r = forward(&mut local_r, &mesh_w, &local_w, |run| track(&|o| o.client_sent(run))) => match r {
            Ok(()) => End::ClientClosed,
            Err(PumpError::Read(_)) => End::ClientGone,
            Err(PumpError::Write(_)) => End::Lost(close_reason_code(connection.close_reason().as_ref())),
            Err(PumpError::TooManyStrikes) => End::ClientGone,
        },
        r = forward(&mut mesh_r, &local_w, &local_w, |run| track(&|o| o.server_sent(run))) => match r {
            Ok(()) => End::ServerClosed,
            Err(PumpError::Write(_)) => End::ClientGone,
            Err(_) => End::Lost(close_reason_code(connection.close_reason().as_ref())),
        },
        _ = shutdown.cancelled() => End::Shutdown,
    };

    let (code, message) = match end {
        End::ClientGone => {
            let _ = mesh_w.lock().await.finish();
            return;
        }
        End::ClientClosed => {
            // The client is done sending but may still read: let answers in flight arrive.
            let _ = mesh_w.lock().await.finish();
            let drained = tokio::time::timeout(
                DRAIN,
                forward(&mut mesh_r, &local_w, &local_w, |run| {
                    track(&|o| o.server_sent(run))
                }),
            )
            .await;
            match drained {
                Ok(Ok(())) => failure(End::ServerClosed),
                _ => failure(End::Lost(close_reason_code(
                    connection.close_reason().as_ref(),
                ))),
            }
        }
        other => failure(other),
    };
    let answers = {
        let mut o = outstanding.lock().unwrap_or_else(|p| p.into_inner());
        o.answer_all(code, message)
    };
    if !answers.is_empty() {
        let _ = write_run(&local_w, &answers).await;
    }
    let _ = mesh_w.lock().await.finish();
    // Requests still arriving (a client that wrote before it saw the failure) are answered
    // too, for a short while, so nothing waits forever. Returns at once if the client is done.
    let _ = tokio::time::timeout(
        LINGER,
        answer_remaining(&mut local_r, &local_w, code, message),
    )
    .await;
    let _ = local_w.lock().await.shutdown().await;
}

async fn answer_remaining(
    local_r: &mut FrameReader<tokio::net::unix::OwnedReadHalf>,
    local_w: &Mutex<tokio::net::unix::OwnedWriteHalf>,
    code: ErrorCode,
    message: &str,
) {
    while let Ok(Some(line)) = local_r.next_line().await {
        let Some(peek) = jsonrpc::peek(&line) else {
            continue;
        };
        if let (Kind::Request, Some(id)) = (peek.kind(), peek.id) {
            let frame = ErrorFrame::new(code)
                .id(Some(id))
                .message(message)
                .to_line();
            if write_run(local_w, &frame).await.is_err() {
                return;
            }
        }
    }
}

/// `mcpmesh connect`: pipes this process's stdin and stdout through `stream` (a session opened
/// on the control socket) until the node closes it. Raw bytes both ways; the node does the rest.
pub fn pipe_stdio(stream: StdUnixStream, leftover: &[u8]) -> std::io::Result<()> {
    let mut stdout = std::fs::File::from(std::io::stdout().as_fd().try_clone_to_owned()?);
    let mut stdin = std::fs::File::from(std::io::stdin().as_fd().try_clone_to_owned()?);
    stdout.write_all(leftover)?;
    let mut up = stream.try_clone()?;
    std::thread::spawn(move || {
        let _ = copy(&mut stdin, &mut up);
        let _ = up.shutdown(std::net::Shutdown::Write);
    });
    let mut down = stream;
    copy(&mut down, &mut stdout)
}

fn copy(from: &mut impl Read, to: &mut impl Write) -> std::io::Result<()> {
    let mut buf = vec![0u8; PIPE_CHUNK];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        to.write_all(&buf[..n])?;
    }
}

/// `mcpmesh connect` when no session could be opened: answers the client's requests with the
/// error (so it sees why instead of a silent exit), until its first request is answered.
pub fn answer_failed_open(error: &ControlError) -> std::io::Result<()> {
    let code = match error.code {
        c if c == ErrorCode::UnknownService.code() => ErrorCode::UnknownService,
        _ => ErrorCode::Unreachable,
    };
    let mut stdout = std::io::stdout().lock();
    let stdin = std::io::stdin().lock();
    for line in std::io::BufRead::split(stdin, b'\n') {
        let line = line?;
        let Some(peek) = jsonrpc::peek(&line) else {
            continue;
        };
        if let (Kind::Request, Some(id)) = (peek.kind(), peek.id) {
            stdout.write_all(
                &ErrorFrame::new(code)
                    .id(Some(id))
                    .message(&error.message)
                    .to_line(),
            )?;
            stdout.flush()?;
            return Ok(());
        }
    }
    Ok(())
}
