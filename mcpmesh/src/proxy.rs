//! The consuming side of a session: `mcpmesh connect` and the daemon half it talks to.
//!
//! When its stdin and stdout are pipes or sockets (what AI clients give it), `connect` hands
//! them to the node over the control socket and steps out of the data path: the node reads and
//! writes the AI client's pipes itself, one process hop fewer each way. Otherwise (a file, a
//! terminal) `connect` copies bytes between its stdio and the control connection. Either way
//! the daemon half ([`tunnel`]) moves the bytes over the mesh stream unchanged and remembers
//! which requests are still unanswered, so that when the session fails it can answer every one
//! of them with the error band's code instead of leaving the client hanging.

use std::collections::HashMap;
use std::future::Future;
use std::io::{Read, Write};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream as StdUnixStream;
use std::sync::Mutex as StdMutex;
use std::time::Duration;

use bytes::BytesMut;
use mcpmesh_net::errors::{ErrorCode, ErrorFrame};
use mcpmesh_net::jsonrpc::{self, Kind};
use mcpmesh_net::pump::{LongLines, PumpError, Seen, forward, write_run};
use mcpmesh_net::session::{OpenedSession, close_reason_code};
use mcpmesh_net::transport::{FrameReader, MAX_FRAME};
use serde_json::value::RawValue;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

/// After the client closed its side, how long responses still in flight may take to arrive.
const DRAIN: Duration = Duration::from_secs(2);
/// After a failure that came before any request, how long the client's first one is awaited.
const LINGER: Duration = Duration::from_secs(5);
/// Unanswered requests remembered per session; past this, new ones are not tracked.
const MAX_TRACKED: usize = 65_536;
/// Bytes moved per read by `connect`.
const PIPE_CHUNK: usize = 256 * 1024;

/// Requests sent and not yet answered, by id.
#[derive(Debug, Default)]
struct Outstanding {
    ids: HashMap<String, Box<RawValue>>,
    /// Whether the client has sent any request at all.
    requests_seen: bool,
}

impl Outstanding {
    fn client_sent(&mut self, seen: Seen<'_>) {
        seen.each_frame(|line, _| {
            let Some(peek) = jsonrpc::peek(line) else {
                return;
            };
            if let Some(cancelled) = peek.cancelled_request() {
                self.ids.remove(&jsonrpc::id_key(cancelled));
            } else if let (Kind::Request, Some(id)) = (peek.kind(), peek.id) {
                self.requests_seen = true;
                if self.ids.len() < MAX_TRACKED {
                    self.ids.insert(jsonrpc::id_key(id), id.to_owned());
                }
            }
        });
    }

    fn server_sent(&mut self, seen: Seen<'_>) {
        if self.ids.is_empty() {
            return;
        }
        seen.each_frame(|line, _| {
            let Some(peek) = jsonrpc::peek(line) else {
                return;
            };
            if let (Kind::Response, Some(id)) = (peek.kind(), peek.id) {
                self.ids.remove(&jsonrpc::id_key(id));
            }
        });
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

/// The AI client's side of a session, as the daemon holds it.
pub struct LocalSide {
    /// What the client sends (its requests).
    pub input: Box<dyn AsyncRead + Unpin + Send>,
    /// Where the server's messages go.
    pub output: Box<dyn AsyncWrite + Unpin + Send>,
    /// Bytes of the client's already read past the session's opening.
    pub leftover: BytesMut,
    /// Resolves when the `connect` process is gone (its control connection closed).
    pub gone: std::pin::Pin<Box<dyn Future<Output = ()> + Send>>,
}

/// Runs one session between the AI client (`local`) and the mesh stream, until either side
/// ends it. On failure every unanswered request gets an error of the band.
pub async fn tunnel(local: LocalSide, session: OpenedSession, shutdown: CancellationToken) {
    // The lease keeps the pooled connection counted as in use until the session ends.
    let OpenedSession {
        send,
        recv,
        connection,
        lease: _lease,
    } = session;
    let LocalSide {
        input,
        output,
        leftover,
        gone,
    } = local;
    let mut local_r = FrameReader::new(input, MAX_FRAME);
    let mut mesh_r = FrameReader::new(recv, MAX_FRAME);
    let local_w = Mutex::new(output);
    let mesh_w = Mutex::new(send);
    let outstanding = StdMutex::new(Outstanding::default());
    let track = |f: &dyn Fn(&mut Outstanding)| {
        f(&mut outstanding.lock().unwrap_or_else(|p| p.into_inner()))
    };

    if !leftover.is_empty() {
        let run = leftover.freeze();
        track(&|o| o.client_sent(Seen::Lines(&run)));
        let _ = write_run(&mesh_w, &run).await;
    }

    // One pump for the server's side for the whole session: when the client's side ends first,
    // the same pump drains what is still coming, so an answer halfway through (a long line
    // passing in parts) goes on where it was. It holds `local_w` across a long line: it is
    // stopped (and has ended its line) before anything else is written there.
    let stop = CancellationToken::new();
    let mut server_side = Box::pin(forward(
        &mut mesh_r,
        &local_w,
        &local_w,
        LongLines::PassOn,
        stop.cancelled(),
        |seen| track(&|o| o.server_sent(seen)),
    ));
    let mut server_done = false;
    let end = tokio::select! {
        r = forward(&mut local_r, &mesh_w, &local_w, LongLines::Whole, std::future::pending(), |seen| track(&|o| o.client_sent(seen))) => match r {
            Ok(()) => End::ClientClosed,
            Err(PumpError::Read(_)) => End::ClientGone,
            Err(PumpError::Write(_)) => End::Lost(close_reason_code(connection.close_reason().as_ref())),
            Err(PumpError::TooManyStrikes) => End::ClientGone,
        },
        r = &mut server_side => {
            server_done = true;
            match r {
                Ok(()) => End::ServerClosed,
                Err(PumpError::Write(_)) => End::ClientGone,
                Err(_) => End::Lost(close_reason_code(connection.close_reason().as_ref())),
            }
        },
        _ = shutdown.cancelled() => End::Shutdown,
        _ = gone => End::ClientGone,
    };

    let (code, message) = match end {
        End::ClientGone => {
            drop(server_side);
            let _ = mesh_w.lock().await.finish();
            return;
        }
        End::ClientClosed => {
            // The client is done sending but may still read: let answers in flight arrive.
            let _ = mesh_w.lock().await.finish();
            let drained = tokio::time::timeout(DRAIN, &mut server_side).await;
            server_done = drained.is_ok();
            match drained {
                Ok(Ok(())) => failure(End::ServerClosed),
                _ => failure(End::Lost(close_reason_code(
                    connection.close_reason().as_ref(),
                ))),
            }
        }
        other => failure(other),
    };
    let mut line_ended = true;
    if !server_done {
        stop.cancel();
        // A pump that cannot even end its line (the client reads nothing) is dropped.
        line_ended = tokio::time::timeout(DRAIN, &mut server_side).await.is_ok();
    }
    drop(server_side);
    let (answers, requests_seen) = {
        let mut o = outstanding.lock().unwrap_or_else(|p| p.into_inner());
        (o.answer_all(code, message), o.requests_seen)
    };
    if !answers.is_empty() && line_ended {
        let _ = tokio::time::timeout(DRAIN, write_run(&local_w, &answers)).await;
    }
    let _ = mesh_w.lock().await.finish();
    if !requests_seen {
        // The session failed before the client asked anything (a refusal can outrun its first
        // request): answer what it sends next, so it learns why instead of seeing a bare EOF.
        let _ = tokio::time::timeout(
            LINGER,
            answer_first_request(&mut local_r, &local_w, code, message),
        )
        .await;
    }
    let _ = local_w.lock().await.shutdown().await;
}

async fn answer_first_request<R: AsyncRead + Unpin, W: AsyncWrite + Unpin>(
    local_r: &mut FrameReader<R>,
    local_w: &Mutex<W>,
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
            let _ = write_run(local_w, &frame).await;
            return;
        }
    }
}

/// Whether this process's stdin and stdout can be handed to the node: pipes or sockets, which
/// the node can wait on (a regular file or a terminal cannot be).
pub fn stdio_passable() -> bool {
    let passable = |fd: std::os::fd::BorrowedFd<'_>| {
        rustix::fs::fstat(fd).is_ok_and(|st| {
            matches!(
                rustix::fs::FileType::from_raw_mode(st.st_mode),
                rustix::fs::FileType::Fifo | rustix::fs::FileType::Socket
            )
        })
    };
    passable(std::io::stdin().as_fd()) && passable(std::io::stdout().as_fd())
}

/// `mcpmesh connect`, handing off: passes stdin and stdout to the node over `stream` (a
/// session opened with `attach = "fds"`), then waits until the node closes the connection at
/// the session's end. This process moves no bytes of the session.
pub fn pass_stdio(stream: StdUnixStream) -> std::io::Result<()> {
    let (stdin, stdout) = (std::io::stdin(), std::io::stdout());
    let fds = [stdin.as_fd(), stdout.as_fd()];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(2))];
    let mut control = rustix::net::SendAncillaryBuffer::new(&mut space);
    if !control.push(rustix::net::SendAncillaryMessage::ScmRights(&fds)) {
        return Err(std::io::Error::other("cannot attach descriptors"));
    }
    rustix::net::sendmsg(
        &stream,
        &[std::io::IoSlice::new(b"F")],
        &mut control,
        rustix::net::SendFlags::empty(),
    )?;
    // The node closes this connection when the session ends; until then there is nothing to do.
    let mut rest = Vec::new();
    let _ = (&stream).read_to_end(&mut rest);
    Ok(())
}

/// Receives the two descriptors `pass_stdio` sends: (input, output).
pub async fn receive_stdio(stream: &tokio::net::UnixStream) -> std::io::Result<(OwnedFd, OwnedFd)> {
    loop {
        stream.readable().await?;
        let received = stream.try_io(tokio::io::Interest::READABLE, || {
            let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(2))];
            let mut control = rustix::net::RecvAncillaryBuffer::new(&mut space);
            let mut byte = [0u8; 1];
            let msg = rustix::net::recvmsg(
                stream,
                &mut [std::io::IoSliceMut::new(&mut byte)],
                &mut control,
                rustix::net::RecvFlags::CMSG_CLOEXEC,
            )?;
            let fds: Vec<OwnedFd> = control
                .drain()
                .filter_map(|m| match m {
                    rustix::net::RecvAncillaryMessage::ScmRights(fds) => Some(fds),
                    _ => None,
                })
                .flatten()
                .collect();
            Ok((msg.bytes, fds))
        });
        match received {
            Ok((0, _)) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok((_, fds)) => {
                let [input, output]: [OwnedFd; 2] = fds
                    .try_into()
                    .map_err(|_| std::io::Error::other("expected two descriptors"))?;
                return Ok((input, output));
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Makes a received descriptor the session's input.
pub fn input_from(fd: OwnedFd) -> std::io::Result<Box<dyn AsyncRead + Unpin + Send>> {
    if is_fifo(&fd) {
        Ok(Box::new(tokio::net::unix::pipe::Receiver::from_owned_fd(
            fd,
        )?))
    } else {
        Ok(Box::new(socket_from(fd)?))
    }
}

/// Makes a received descriptor the session's output.
pub fn output_from(fd: OwnedFd) -> std::io::Result<Box<dyn AsyncWrite + Unpin + Send>> {
    if is_fifo(&fd) {
        Ok(Box::new(tokio::net::unix::pipe::Sender::from_owned_fd(fd)?))
    } else {
        Ok(Box::new(socket_from(fd)?))
    }
}

fn is_fifo(fd: &OwnedFd) -> bool {
    rustix::fs::fstat(fd).is_ok_and(|st| {
        rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Fifo
    })
}

fn socket_from(fd: OwnedFd) -> std::io::Result<tokio::net::UnixStream> {
    let std = StdUnixStream::from(fd);
    std.set_nonblocking(true)?;
    tokio::net::UnixStream::from_std(std)
}

/// `mcpmesh connect`, copying: pipes this process's stdin and stdout through `stream` (a session
/// opened on the control socket) until the node closes it.
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
pub fn answer_failed_open(code: i64, message: &str) -> std::io::Result<()> {
    let code = match code {
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
                    .message(message)
                    .to_line(),
            )?;
            stdout.flush()?;
            return Ok(());
        }
    }
    Ok(())
}
