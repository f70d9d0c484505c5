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
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use bytes::BytesMut;
use iroh::endpoint::{Connection, RecvStream, SendStream};
use mcpmesh_net::errors::{ErrorCode, ErrorFrame};
use mcpmesh_net::jsonrpc::{self, Kind, Outcome};
use mcpmesh_net::pump::{LongLines, PumpError, Seen, forward, write_run};
use mcpmesh_net::session::{OpenedSession, abandon, close_reason_code};
use mcpmesh_net::transport::{FrameReader, MAX_FRAME};
use serde_json::value::RawValue;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::{Mutex, Notify};
use tokio_util::sync::CancellationToken;

use crate::telemetry::{Asked, Dialed};

/// After the client closed its side, how long responses still in flight may take to arrive.
const DRAIN: Duration = Duration::from_secs(2);
/// After a failure that came before any request, how long the client's first one is awaited.
const LINGER: Duration = Duration::from_secs(5);
/// Unanswered requests remembered per session; past this, new ones are not tracked.
const MAX_TRACKED: usize = 65_536;
/// Bytes moved per read by `connect`.
const PIPE_CHUNK: usize = 256 * 1024;

/// Requests sent and not yet answered, by id; with metrics, when and what each asked, so its
/// answer is timed (`mcp_client_operation_duration_seconds`).
#[derive(Debug, Default)]
struct Outstanding {
    ids: HashMap<String, Unanswered>,
    /// Whether the client has sent any request at all.
    requests_seen: bool,
    /// Whether the server side has sent anything yet.
    server_spoke: bool,
    /// The serving node's refusal of the session, while its first frame, a refusal, is all
    /// it sent.
    refusal: Option<Ending>,
    /// Bumped whenever `ids` changes.
    version: u64,
    dialed: Option<Dialed>,
}

#[derive(Debug)]
struct Unanswered {
    id: Box<RawValue>,
    asked: Option<Asked>,
}

impl Outstanding {
    fn timed(dialed: Option<Dialed>) -> Self {
        Outstanding {
            dialed,
            ..Default::default()
        }
    }

    fn client_sent(&mut self, seen: Seen<'_>) {
        seen.each_frame(|line, _| {
            let Some(peek) = jsonrpc::peek(line) else {
                return;
            };
            if let Some(cancelled) = peek.cancelled_request() {
                if let Some(gone) = self.ids.remove(&jsonrpc::id_key(cancelled)) {
                    self.version += 1;
                    self.answered(gone, "cancelled", None);
                }
            } else if let (Kind::Request, Some(id)) = (peek.kind(), peek.id) {
                self.requests_seen = true;
                if self.ids.len() < MAX_TRACKED {
                    let asked = self.dialed.as_ref().map(|dialed| {
                        dialed.asking(peek.method.as_deref().unwrap_or_default(), peek.params)
                    });
                    let id = id.to_owned();
                    self.ids
                        .insert(jsonrpc::id_key(&id), Unanswered { id, asked });
                    self.version += 1;
                }
            }
        });
    }

    fn server_sent(&mut self, seen: Seen<'_>) {
        if !self.server_spoke || self.refusal.is_some() {
            // A refusal is all the serving side says: anything after it makes it an answer.
            seen.each_frame(|line, _| {
                self.refusal = (!self.server_spoke).then(|| refusal(line)).flatten();
                self.server_spoke = true;
            });
        }
        if self.ids.is_empty() {
            return;
        }
        seen.each_frame(|line, _| {
            // A response whose `error` or `result` is malformed still answers its request.
            let (id, outcome) = match jsonrpc::peek_response(line) {
                Some(peek) => (
                    peek.id.filter(|_| peek.method.is_none()),
                    match peek.outcome() {
                        Outcome::Ok => ("ok", None),
                        Outcome::Error(code) => ("error", Some(code)),
                        Outcome::ToolError => ("tool_error", None),
                    },
                ),
                None => (
                    jsonrpc::peek(line)
                        .filter(|p| p.kind() == Kind::Response)
                        .and_then(|p| p.id),
                    ("error", None),
                ),
            };
            if let Some(id) = id
                && let Some(done) = self.ids.remove(&jsonrpc::id_key(id))
            {
                self.version += 1;
                self.answered(done, outcome.0, outcome.1);
            }
        });
    }

    fn answered(&self, done: Unanswered, outcome: &'static str, code: Option<i64>) {
        if let (Some(dialed), Some(asked)) = (&self.dialed, &done.asked) {
            dialed.answered(&done.id, asked, outcome, code);
        }
    }

    /// One error line per unanswered request, and forgets them.
    fn answer_all(&mut self, code: ErrorCode, message: &str) -> Vec<u8> {
        self.version += 1;
        let unanswered: Vec<Unanswered> = self.ids.drain().map(|(_, u)| u).collect();
        for u in &unanswered {
            if let (Some(dialed), Some(asked)) = (&self.dialed, &u.asked) {
                dialed.answered(&u.id, asked, "unanswered", Some(code.code()));
            }
        }
        answers(unanswered.into_iter().map(|u| u.id), code, message)
    }

    /// The report line naming every request still unanswered.
    fn note(&self) -> Vec<u8> {
        note_line(&SessionNote::Outstanding(self.unanswered()))
    }

    fn unanswered(&self) -> Vec<&RawValue> {
        self.ids.values().map(|u| u.id.as_ref()).collect()
    }
}

/// The memory file a `connect` passed with its descriptors (an anonymous file, `memfd`), where
/// the node keeps the set of unanswered requests, overwritten in place: unlike a line on the
/// control connection, a change wakes nobody. `connect` reads it only when the node went away
/// without ending the session.
///
/// Its content is the set's length in 10 ASCII digits, a newline, then the set as a JSON array
/// of ids: one write, never a truncation, and what follows the set (a longer set's tail) is
/// never read.
pub struct Ledger(std::fs::File);

/// The most of a ledger `connect` reads.
const MAX_LEDGER: usize = 64 << 20;

impl Ledger {
    /// `fd` as a ledger, if it is an anonymous file (no name on any disk to overwrite).
    pub fn of(fd: OwnedFd) -> Option<Ledger> {
        let stat = rustix::fs::fstat(&fd).ok()?;
        let regular = rustix::fs::FileType::from_raw_mode(stat.st_mode).is_file();
        (regular && stat.st_nlink == 0).then(|| Ledger(std::fs::File::from(fd)))
    }

    /// Keeps `ids` as the set of unanswered requests.
    fn keep(&self, ids: &[&RawValue]) -> std::io::Result<()> {
        use std::os::unix::fs::FileExt;
        let set = serde_json::to_vec(ids)?;
        let mut content = format!("{:010}\n", set.len()).into_bytes();
        content.extend_from_slice(&set);
        self.0.write_all_at(&content, 0)
    }

    /// The set last kept in `file`; `None` when it holds none that reads whole.
    fn read(file: &std::fs::File) -> Option<Vec<Box<RawValue>>> {
        use std::os::unix::fs::FileExt;
        let mut head = [0u8; 11];
        file.read_exact_at(&mut head, 0).ok()?;
        let len: usize = std::str::from_utf8(head.strip_suffix(b"\n")?)
            .ok()?
            .parse()
            .ok()?;
        let mut set = vec![0u8; len.min(MAX_LEDGER)];
        file.read_exact_at(&mut set, head.len() as u64).ok()?;
        serde_json::from_slice(&set).ok()
    }
}

/// The serving node's refusal of a session (`-32054` unknown or not allowed, `-32053` busy),
/// when `first` (the first frame the serving side sent) is one: the serving node answers the
/// first frame with it and closes the stream.
fn refusal(first: &[u8]) -> Option<Ending> {
    #[derive(serde::Deserialize)]
    struct Refusal {
        error: Body,
    }
    #[derive(serde::Deserialize)]
    struct Body {
        code: i64,
        #[serde(default)]
        message: String,
        data: Option<Data>,
    }
    #[derive(serde::Deserialize)]
    struct Data {
        source: Option<String>,
    }
    let r: Refusal = serde_json::from_slice(first).ok()?;
    let refused = [ErrorCode::UnknownService.code(), ErrorCode::Busy.code()];
    let by_mesh = r.error.data.and_then(|d| d.source).as_deref() == Some("mcpmesh");
    (by_mesh && refused.contains(&r.error.code)).then(|| Ending {
        code: Some(r.error.code),
        message: format!("the peer refused the session: {}", r.error.message),
    })
}

/// One error line per id.
fn answers<I: AsRef<RawValue>>(
    ids: impl IntoIterator<Item = I>,
    code: ErrorCode,
    message: &str,
) -> Vec<u8> {
    let mut out = Vec::new();
    for id in ids {
        out.extend(
            ErrorFrame::new(code)
                .id(Some(id.as_ref()))
                .message(message)
                .to_line(),
        );
    }
    out
}

/// What the node tells a `connect` that passed it its descriptors, one JSON line each, on the
/// control connection: which requests are unanswered whenever that changes (so that if the
/// node dies, `connect` can answer them), and how the session ended, last. A connection that
/// closes without `ended` means the node itself went away.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SessionNote<'a> {
    Outstanding(#[serde(borrow)] Vec<&'a RawValue>),
    Ended(Ending),
}

/// How a session ended: `code` is `None` when it ended the ordinary way (either side closed
/// with nothing left unanswered).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Ending {
    pub code: Option<i64>,
    pub message: String,
}

impl Ending {
    fn clean() -> Self {
        Ending {
            code: None,
            message: "the session ended".into(),
        }
    }
}

fn note_line(note: &SessionNote<'_>) -> Vec<u8> {
    let mut line = serde_json::to_vec(note).unwrap_or_default();
    line.push(b'\n');
    line
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
fn failure(end: &End) -> (ErrorCode, &'static str) {
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
        End::Lost(code) => (*code, "the peer went away or the session was lost"),
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
    /// Where [`SessionNote`]s go, when the opener reads them (it passed its descriptors).
    pub report: Option<Box<dyn AsyncWrite + Unpin + Send>>,
    /// Where the set of unanswered requests is kept instead, when the opener passed one.
    pub ledger: Option<Ledger>,
}

/// Runs one session between the AI client (`local`) and the mesh stream, until either side
/// ends it. On failure every unanswered request gets an error of the band. Returns how the
/// session ended.
pub async fn tunnel(
    local: LocalSide,
    session: OpenedSession,
    shutdown: CancellationToken,
    dialed: Option<Dialed>,
) -> Ending {
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
        mut gone,
        report,
        ledger,
    } = local;
    let mut local_r = FrameReader::new(input, MAX_FRAME);
    let mut mesh_r = FrameReader::new(recv, MAX_FRAME);
    let tunnel = Tunnel::new(output, send, &connection, shutdown, dialed);
    let reporter = report.map(|w| tunnel.report_to(w, ledger));
    tunnel.pass_leftover(leftover).await;

    // One pump for the server's side for the whole session: when the client's side ends first,
    // the same pump drains what is still coming, so an answer halfway through (a long line
    // passing in parts) goes on where it was. It holds `local_w` across a long line: it is
    // stopped (and has ended its line) before anything else is written there.
    let stop = CancellationToken::new();
    let mut server_side = Box::pin(forward(
        &mut mesh_r,
        &tunnel.local_w,
        &tunnel.local_w,
        LongLines::PassOn,
        stop.cancelled(),
        |seen| tunnel.track(&|o| o.server_sent(seen)),
    ));
    let mut server_done = false;
    let end = tokio::select! {
        r = forward(&mut local_r, &tunnel.mesh_w, &tunnel.local_w, LongLines::FromClient, std::future::pending(), |seen| tunnel.track(&|o| o.client_sent(seen))) => match r {
            Ok(()) => End::ClientClosed,
            Err(PumpError::Read(_)) => End::ClientGone,
            Err(PumpError::Write(_)) => tunnel.lost(),
            Err(PumpError::TooManyStrikes) => End::ClientGone,
        },
        r = &mut server_side => {
            server_done = true;
            match r {
                Ok(()) => End::ServerClosed,
                Err(PumpError::Write(_)) => End::ClientGone,
                Err(_) => tunnel.lost(),
            }
        },
        _ = tunnel.shutdown.cancelled() => End::Shutdown,
        _ = &mut gone => End::ClientGone,
    };
    let end = match end {
        End::ClientClosed => {
            let drained = tunnel.drain(&mut server_side, &mut gone).await;
            server_done = drained.server_done;
            drained.end
        }
        other => other,
    };
    if let End::ClientGone = end {
        drop(server_side);
        return client_gone(&mut mesh_r, &tunnel.mesh_w, reporter).await;
    }
    let mut line_ended = true;
    if !server_done {
        stop.cancel();
        // A pump that cannot even end its line (the client reads nothing) is dropped.
        line_ended = tokio::time::timeout(DRAIN, &mut server_side).await.is_ok();
    }
    drop(server_side);
    tunnel.finish(end, line_ended, &mut local_r, reporter).await
}

/// The daemon half of one session while it runs: the writers both pumps share, the requests
/// the client is still owed, and what may end the session.
struct Tunnel<'a> {
    mesh_w: Mutex<SendStream>,
    local_w: Mutex<Box<dyn AsyncWrite + Unpin + Send>>,
    outstanding: Arc<StdMutex<Outstanding>>,
    /// Told whenever `outstanding` changed (the reporter waits on it).
    changed: Arc<Notify>,
    /// Told whenever the last unanswered request is answered.
    settled: Notify,
    connection: &'a Connection,
    shutdown: CancellationToken,
}

/// How the wait for the answers owed after the client closed its side ended.
struct Drained {
    end: End,
    /// Whether the server's side pump ended meanwhile.
    server_done: bool,
}

impl<'a> Tunnel<'a> {
    fn new(
        output: Box<dyn AsyncWrite + Unpin + Send>,
        send: SendStream,
        connection: &'a Connection,
        shutdown: CancellationToken,
        dialed: Option<Dialed>,
    ) -> Self {
        Tunnel {
            mesh_w: Mutex::new(send),
            local_w: Mutex::new(output),
            outstanding: Arc::new(StdMutex::new(Outstanding::timed(dialed))),
            changed: Arc::new(Notify::new()),
            settled: Notify::new(),
            connection,
            shutdown,
        }
    }

    /// Applies `f` to the unanswered requests, telling whoever waits when they changed.
    fn track(&self, f: &dyn Fn(&mut Outstanding)) {
        let mut o = self.outstanding.lock().unwrap_or_else(|p| p.into_inner());
        let before = o.version;
        f(&mut o);
        if o.version != before {
            self.changed.notify_one();
            if o.ids.is_empty() {
                self.settled.notify_one();
            }
        }
    }

    /// Whether any request is still unanswered.
    fn owed(&self) -> bool {
        !self
            .outstanding
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .ids
            .is_empty()
    }

    /// The session lost with its connection, under the code the connection closed with.
    fn lost(&self) -> End {
        End::Lost(close_reason_code(self.connection.close_reason().as_ref()))
    }

    /// Starts writing the set of unanswered requests to the opener's `w`, or keeping it in
    /// `ledger` (see [`report_outstanding`]).
    fn report_to(&self, w: Box<dyn AsyncWrite + Unpin + Send>, ledger: Option<Ledger>) -> Reporter {
        let stop = CancellationToken::new();
        let task = tokio::spawn(report_outstanding(
            w,
            ledger,
            self.outstanding.clone(),
            self.changed.clone(),
            stop.clone(),
        ));
        (stop, task)
    }

    /// Sends the client's bytes read past the session's opening, tracked like any others.
    async fn pass_leftover(&self, leftover: BytesMut) {
        if !leftover.is_empty() {
            let run = leftover.freeze();
            self.track(&|o| o.client_sent(Seen::Lines(&run)));
            let _ = write_run(&self.mesh_w, &run).await;
        }
    }

    /// The client is done sending but may still read: every answer it is owed comes (the
    /// serving side bounds how long its server may take), then the stream ends.
    async fn drain<S>(&self, server_side: &mut S, gone: &mut LocalGone) -> Drained
    where
        S: Future<Output = Result<(), PumpError>> + Unpin,
    {
        let client_gone = Drained {
            end: End::ClientGone,
            server_done: false,
        };
        let _ = self.mesh_w.lock().await.finish();
        let drained = loop {
            let waiting = self.owed();
            tokio::select! {
                r = &mut *server_side => break Some(r),
                _ = tokio::time::sleep(DRAIN), if !waiting => break None,
                _ = self.settled.notified(), if waiting => {}
                _ = self.shutdown.cancelled() => break None,
                _ = &mut *gone => return client_gone,
            }
        };
        let end = match drained {
            Some(Ok(())) => End::ServerClosed,
            Some(Err(PumpError::Write(_))) => return client_gone,
            _ if self.shutdown.is_cancelled() => End::Shutdown,
            // The client had every answer it was owed and ended the session: a serving
            // side slow to end its own (a stalled machine) or gone meanwhile cost it
            // nothing, and the session ended as the client chose.
            _ if !self.owed() => End::ClientClosed,
            _ => self.lost(),
        };
        Drained {
            end,
            server_done: drained.is_some(),
        }
    }

    /// Ends a session whose client is still there, once the server's side pump is stopped:
    /// every unanswered request gets the error `end` calls for (when the client's output is
    /// not left halfway through a line), the mesh stream is finished and the opener told how
    /// the session ended.
    async fn finish(
        &self,
        end: End,
        line_ended: bool,
        local_r: &mut FrameReader<Box<dyn AsyncRead + Unpin + Send>>,
        reporter: Option<Reporter>,
    ) -> Ending {
        let (code, message) = failure(&end);
        let (answers, requests_seen, refusal) = {
            let mut o = self.outstanding.lock().unwrap_or_else(|p| p.into_inner());
            (
                o.answer_all(code, message),
                o.requests_seen,
                o.refusal.take(),
            )
        };
        if !answers.is_empty() && line_ended {
            let _ = tokio::time::timeout(DRAIN, write_run(&self.local_w, &answers)).await;
        }
        let _ = self.mesh_w.lock().await.finish();
        // Ending with nothing unanswered is ordinary unless the peer or the node went away.
        let ending = match end {
            End::ServerClosed if let Some(refusal) = refusal => refusal,
            End::Lost(_) | End::Shutdown => Ending {
                code: Some(code.code()),
                message: message.to_owned(),
            },
            _ if !answers.is_empty() => Ending {
                code: Some(code.code()),
                message: message.to_owned(),
            },
            _ => Ending::clean(),
        };
        finish_report(reporter, ending.clone()).await;
        if !requests_seen {
            // The session failed before the client asked anything (a refusal can outrun its
            // first request): answer what it sends next, so it learns why instead of seeing a
            // bare EOF.
            let _ = tokio::time::timeout(
                LINGER,
                answer_first_request(local_r, &self.local_w, code, message),
            )
            .await;
        }
        let _ = self.local_w.lock().await.shutdown().await;
        ending
    }
}

/// Resolves when the `connect` process is gone (see [`LocalSide::gone`]).
type LocalGone = std::pin::Pin<Box<dyn Future<Output = ()> + Send>>;

/// Ends a session whose client went away (its `connect` died, or its output closed): the mesh
/// stream is reset, not finished, so the serving side stops at once rather than finishing
/// what the client asked for nobody.
async fn client_gone(
    mesh_r: &mut FrameReader<RecvStream>,
    mesh_w: &Mutex<SendStream>,
    reporter: Option<Reporter>,
) -> Ending {
    abandon(&mut *mesh_w.lock().await, mesh_r.get_mut());
    finish_report(reporter, Ending::clean()).await;
    Ending::clean()
}

type Reporter = (
    CancellationToken,
    tokio::task::JoinHandle<Box<dyn AsyncWrite + Unpin + Send>>,
);

/// Tells the opener the set of unanswered requests whenever it changed (coalesced: a slow
/// reader gets the newest set, never a queue), until `stop`; returns the writer. With a
/// `ledger` the set is kept there; a ledger that cannot be written (its memory refused) is
/// dropped, and the set goes on `w` from then on, which `connect` reads as the newer.
async fn report_outstanding(
    mut w: Box<dyn AsyncWrite + Unpin + Send>,
    mut ledger: Option<Ledger>,
    outstanding: Arc<StdMutex<Outstanding>>,
    changed: Arc<Notify>,
    stop: CancellationToken,
) -> Box<dyn AsyncWrite + Unpin + Send> {
    loop {
        tokio::select! {
            biased;
            _ = stop.cancelled() => return w,
            _ = changed.notified() => {
                if let Some(kept) = &ledger {
                    let o = outstanding.lock().unwrap_or_else(|p| p.into_inner());
                    match kept.keep(&o.unanswered()) {
                        Ok(()) => continue,
                        Err(e) => {
                            tracing::debug!("the opener's ledger cannot be written ({e}); telling it on the connection");
                            ledger = None;
                        }
                    }
                }
                let line = outstanding.lock().unwrap_or_else(|p| p.into_inner()).note();
                if w.write_all(&line).await.is_err() {
                    return w;
                }
            }
        }
    }
}

/// Stops the reporter and tells the opener how the session ended.
async fn finish_report(reporter: Option<Reporter>, ending: Ending) {
    let Some((stop, task)) = reporter else {
        return;
    };
    stop.cancel();
    if let Ok(mut w) = task.await {
        let _ = w.write_all(&note_line(&SessionNote::Ended(ending))).await;
        let _ = w.shutdown().await;
    }
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

/// How a session ended, as `connect` tells its caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConnectEnd {
    /// Either side closed with nothing left unanswered.
    Clean,
    /// The session failed (the peer went away, the node stopped, …): why, in plain words.
    Failed(String),
    /// The serving node refused the session (`code`: `-32054` or `-32053`).
    Refused { code: i64, message: String },
}

impl ConnectEnd {
    fn of(ending: Ending) -> Self {
        match ending.code {
            None => ConnectEnd::Clean,
            Some(code)
                if code == ErrorCode::UnknownService.code() || code == ErrorCode::Busy.code() =>
            {
                ConnectEnd::Refused {
                    code,
                    message: ending.message,
                }
            }
            Some(_) => ConnectEnd::Failed(ending.message),
        }
    }
}

const NODE_GONE: &str = "the local mcpmesh node stopped during the session";
const ENDED_BY_SERVING_SIDE: &str = "the session ended before the client did: the peer went away, access was revoked, or its server stopped";

/// `mcpmesh connect`, handing off: passes stdin and stdout to the node over `stream` (a
/// session opened with `attach = "fds"`), then reads the node's [`SessionNote`]s until the
/// session ends. This process moves no bytes of the session; but if the node goes away
/// without saying the session ended, it answers every request the node last reported
/// unanswered with `-32055` itself. With `ledger` (the node offered it), a memory file for
/// that set goes with the two descriptors (see [`Ledger`]): then nothing wakes this process
/// until the session ends.
pub fn pass_stdio(stream: StdUnixStream, ledger: bool) -> std::io::Result<ConnectEnd> {
    let (stdin, stdout) = (std::io::stdin(), std::io::stdout());
    let ledger = match ledger {
        true => rustix::fs::memfd_create("mcpmesh-unanswered", rustix::fs::MemfdFlags::CLOEXEC)
            .ok()
            .map(std::fs::File::from),
        false => None,
    };
    let mut fds = vec![stdin.as_fd(), stdout.as_fd()];
    fds.extend(ledger.as_ref().map(AsFd::as_fd));
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(3))];
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
    // The set from the last line the node wrote, if it wrote any (it writes lines after it
    // could not keep the ledger, so they are the newer).
    let mut unanswered: Option<Vec<u8>> = None;
    let mut lines = std::io::BufReader::new(&stream);
    let mut line = Vec::new();
    loop {
        line.clear();
        match std::io::BufRead::read_until(&mut lines, b'\n', &mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        match serde_json::from_slice::<SessionNote<'_>>(&line) {
            Ok(SessionNote::Ended(ending)) => return Ok(ConnectEnd::of(ending)),
            Ok(SessionNote::Outstanding(ids)) => {
                unanswered = Some(serde_json::to_vec(&ids).unwrap_or_default());
            }
            Err(_) => {}
        }
    }
    // The node went away without ending the session: answer what it left unanswered.
    let ids: Vec<Box<RawValue>> = match (unanswered, &ledger) {
        (Some(line), _) => serde_json::from_slice(&line).unwrap_or_default(),
        (None, Some(file)) => Ledger::read(file).unwrap_or_default(),
        (None, None) => Vec::new(),
    };
    let mut stdout = std::fs::File::from(std::io::stdout().as_fd().try_clone_to_owned()?);
    let _ = stdout.write_all(&answers(&ids, ErrorCode::Unreachable, NODE_GONE));
    Ok(ConnectEnd::Failed(NODE_GONE.into()))
}

/// What `pass_stdio` sends: the session's input and output, and a ledger when it passed one.
pub type Passed = (OwnedFd, OwnedFd, Option<Ledger>);

/// Receives the descriptors `pass_stdio` sends: two, or three with a ledger (see [`Ledger`];
/// a third that is not an anonymous file is closed, and the set goes on the connection).
pub async fn receive_stdio(stream: &tokio::net::UnixStream) -> std::io::Result<Passed> {
    loop {
        stream.readable().await?;
        let received = stream.try_io(tokio::io::Interest::READABLE, || {
            let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(3))];
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
                let mut fds = fds.into_iter();
                return match (fds.next(), fds.next(), fds.next(), fds.next()) {
                    (Some(input), Some(output), ledger, None) => {
                        Ok((input, output, ledger.and_then(Ledger::of)))
                    }
                    _ => Err(std::io::Error::other("expected two or three descriptors")),
                };
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Resolves when the other end of `fd`, a session's output, is gone for good: a socket its
/// peer closed (not one that only shut down its writing side: that client may still read), a
/// pipe left with no reader. Never resolves when `fd` cannot be watched.
pub fn hung_up(fd: OwnedFd) -> impl Future<Output = ()> + Send + 'static {
    use tokio::io::Interest;
    async move {
        let watched = if is_fifo(&fd) {
            tokio::net::unix::pipe::Sender::from_owned_fd(fd).map(Watched::Pipe)
        } else {
            socket_from(fd).map(Watched::Socket)
        };
        let Ok(watched) = watched else {
            return std::future::pending().await;
        };
        loop {
            let ready = match &watched {
                Watched::Pipe(p) => p.ready(Interest::WRITABLE).await,
                Watched::Socket(s) => s.ready(Interest::WRITABLE).await,
            };
            match ready {
                Ok(r) if r.is_write_closed() || r.is_error() => return,
                Ok(_) => {}
                Err(_) => return std::future::pending().await,
            }
            // Writable is the usual state: forget it and wait for the next change.
            let would_block = || Err::<(), _>(std::io::ErrorKind::WouldBlock.into());
            let _ = match &watched {
                Watched::Pipe(p) => p.try_io(would_block),
                Watched::Socket(s) => s.try_io(Interest::WRITABLE, would_block),
            };
        }
    }
}

/// A second handle on a session's output, watched by [`hung_up`].
enum Watched {
    Pipe(tokio::net::unix::pipe::Sender),
    Socket(tokio::net::UnixStream),
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
/// opened on the control socket) until the node closes it. It watches the requests pass, so
/// that if the node goes away mid-session (`node_alive` says so once the stream ends; it may
/// take a moment to tell) it can answer those still unanswered with `-32055` itself.
pub fn pipe_stdio(
    stream: StdUnixStream,
    leftover: &[u8],
    node_alive: impl FnOnce() -> bool,
) -> std::io::Result<ConnectEnd> {
    let mut stdout = std::fs::File::from(std::io::stdout().as_fd().try_clone_to_owned()?);
    let mut stdin = std::fs::File::from(std::io::stdin().as_fd().try_clone_to_owned()?);
    let outstanding = Arc::new(StdMutex::new(Outstanding::default()));
    let mut from_server = LineWatch::default();
    from_server.feed(leftover, |line| server_line(&outstanding, line));
    stdout.write_all(leftover)?;
    let mut up = stream.try_clone()?;
    let up_outstanding = outstanding.clone();
    let client_done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let up_done = client_done.clone();
    std::thread::spawn(move || {
        let mut from_client = LineWatch::default();
        let _ = copy(&mut stdin, &mut up, |chunk| {
            from_client.feed(chunk, |line| client_line(&up_outstanding, line));
        });
        up_done.store(true, std::sync::atomic::Ordering::Release);
        let _ = up.shutdown(std::net::Shutdown::Write);
    });
    let mut down = stream;
    copy(&mut down, &mut stdout, |chunk| {
        from_server.feed(chunk, |line| server_line(&outstanding, line));
    })?;
    if let Some(refusal) = outstanding
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .refusal
        .take()
    {
        return Ok(ConnectEnd::of(refusal));
    }
    // The ordinary end: the client finished and every request was answered. Otherwise the
    // node may have died (its end of the stream closes with it).
    let settled = client_done.load(std::sync::atomic::Ordering::Acquire)
        && outstanding
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .ids
            .is_empty();
    if settled {
        return Ok(ConnectEnd::Clean);
    }
    if node_alive() {
        // The node ended the session while the client was still talking: the node answered
        // what was outstanding; say why the session is over.
        return Ok(if client_done.load(std::sync::atomic::Ordering::Acquire) {
            ConnectEnd::Clean
        } else {
            ConnectEnd::Failed(ENDED_BY_SERVING_SIDE.into())
        });
    }
    let answers = outstanding
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .answer_all(ErrorCode::Unreachable, NODE_GONE);
    let _ = stdout.write_all(&answers);
    Ok(ConnectEnd::Failed(NODE_GONE.into()))
}

fn client_line(outstanding: &StdMutex<Outstanding>, line: &[u8]) {
    let mut o = outstanding.lock().unwrap_or_else(|p| p.into_inner());
    o.client_sent(Seen::Lines(line));
}

fn server_line(outstanding: &StdMutex<Outstanding>, line: &[u8]) {
    let mut o = outstanding.lock().unwrap_or_else(|p| p.into_inner());
    o.server_sent(Seen::Lines(line));
}

/// Splits a byte stream into whole lines for watching (a line longer than the frame cap is
/// skipped: it cannot be a request anyone awaits an answer to).
#[derive(Debug, Default)]
struct LineWatch {
    partial: Vec<u8>,
    skipping: bool,
}

impl LineWatch {
    fn feed(&mut self, mut chunk: &[u8], mut each: impl FnMut(&[u8])) {
        while let Some(end) = chunk.iter().position(|b| *b == b'\n') {
            let (line, rest) = chunk.split_at(end + 1);
            if !self.skipping {
                if self.partial.is_empty() {
                    each(line);
                } else {
                    self.partial.extend_from_slice(line);
                    each(&self.partial);
                }
            }
            self.partial.clear();
            self.skipping = false;
            chunk = rest;
        }
        if !self.skipping {
            self.partial.extend_from_slice(chunk);
            if self.partial.len() > MAX_FRAME {
                self.partial = Vec::new();
                self.skipping = true;
            }
        }
    }
}

fn copy(
    from: &mut impl Read,
    to: &mut impl Write,
    mut seen: impl FnMut(&[u8]),
) -> std::io::Result<()> {
    let mut buf = vec![0u8; PIPE_CHUNK];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        seen(&buf[..n]);
        to.write_all(&buf[..n])?;
    }
}

/// How long a client told that its node carries all the sessions it may to that peer is asked
/// to wait.
const RETRY_WHEN_FULL: Duration = Duration::from_secs(1);

/// `mcpmesh connect` when no session could be opened: answers the client's requests with the
/// error (so it sees why instead of a silent exit), until its first request is answered.
pub fn answer_failed_open(code: i64, message: &str) -> std::io::Result<()> {
    answer_failed_open_on(
        std::io::stdin().lock(),
        &mut std::io::stdout().lock(),
        code,
        message,
    )
}

fn answer_failed_open_on(
    input: impl std::io::BufRead,
    out: &mut impl Write,
    code: i64,
    message: &str,
) -> std::io::Result<()> {
    let frame = failed_open(code).message(message);
    for line in input.split(b'\n') {
        let line = line?;
        let Some(peek) = jsonrpc::peek(&line) else {
            continue;
        };
        if let (Kind::Request, Some(id)) = (peek.kind(), peek.id) {
            out.write_all(&frame.clone().id(Some(id)).to_line())?;
            out.flush()?;
            return Ok(());
        }
    }
    Ok(())
}

/// The band's error for a session that could not be opened with the node's `code`: a refusal
/// and a full share keep theirs, anything else is `-32055`.
fn failed_open(code: i64) -> ErrorFrame {
    match code {
        c if c == ErrorCode::UnknownService.code() => ErrorFrame::new(ErrorCode::UnknownService),
        c if c == ErrorCode::Busy.code() => {
            ErrorFrame::new(ErrorCode::Busy).retry_after_ms(RETRY_WHEN_FULL.as_millis() as u64)
        }
        _ => ErrorFrame::new(ErrorCode::Unreachable),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::Metrics;

    fn memfd() -> OwnedFd {
        rustix::fs::memfd_create("test", rustix::fs::MemfdFlags::CLOEXEC).unwrap()
    }

    fn ids(json: &str) -> Vec<Box<RawValue>> {
        serde_json::from_str(json).unwrap()
    }

    fn texts(ids: &[Box<RawValue>]) -> Vec<&str> {
        ids.iter().map(|id| id.get()).collect()
    }

    #[test]
    fn a_ledger_reads_back_the_set_last_kept_however_it_shrank() {
        let fd = memfd();
        let reader = std::fs::File::from(fd.try_clone().unwrap());
        let ledger = Ledger::of(fd).expect("an anonymous file is a ledger");
        assert!(Ledger::read(&reader).is_none(), "nothing kept yet");
        let long = ids(r#"["a long id, longer than the next set", 2, {"x": 1}]"#);
        ledger
            .keep(&long.iter().map(AsRef::as_ref).collect::<Vec<_>>())
            .unwrap();
        let read = Ledger::read(&reader).unwrap();
        assert_eq!(
            texts(&read),
            [
                r#""a long id, longer than the next set""#,
                "2",
                r#"{"x": 1}"#
            ]
        );
        let short = ids("[7]");
        ledger
            .keep(&short.iter().map(AsRef::as_ref).collect::<Vec<_>>())
            .unwrap();
        assert_eq!(texts(&Ledger::read(&reader).unwrap()), ["7"]);
        ledger.keep(&[]).unwrap();
        assert!(Ledger::read(&reader).unwrap().is_empty());
    }

    #[test]
    fn a_named_file_or_a_pipe_is_never_taken_for_a_ledger() {
        let dir = tempfile::tempdir().unwrap();
        let named = std::fs::File::create(dir.path().join("precious")).unwrap();
        assert!(Ledger::of(OwnedFd::from(named)).is_none());
        let (r, _w) = std::io::pipe().unwrap();
        assert!(Ledger::of(OwnedFd::from(r)).is_none());
    }

    /// A reporter over `ledger`, and the session's first request sent: the reporter's stop and
    /// task, and what it writes on the connection.
    fn reporting(ledger: Option<Ledger>) -> (Reporter, tokio::io::DuplexStream) {
        let (w, r) = tokio::io::duplex(1 << 16);
        let outstanding = Arc::new(StdMutex::new(Outstanding::default()));
        let changed = Arc::new(Notify::new());
        let stop = CancellationToken::new();
        let task = tokio::spawn(report_outstanding(
            Box::new(w),
            ledger,
            outstanding.clone(),
            changed.clone(),
            stop.clone(),
        ));
        let request = br#"{"jsonrpc":"2.0","id":"q","method":"tools/call","params":{}}"#;
        outstanding
            .lock()
            .unwrap()
            .client_sent(Seen::Lines(&[&request[..], b"\n"].concat()));
        changed.notify_one();
        ((stop, task), r)
    }

    /// Ends the report cleanly, and checks that all `rest` then carries is the end.
    async fn ends_with_the_end_line(reporter: Reporter, mut rest: impl AsyncRead + Unpin) {
        finish_report(Some(reporter), Ending::clean()).await;
        let mut said = String::new();
        tokio::io::AsyncReadExt::read_to_string(&mut rest, &mut said)
            .await
            .unwrap();
        assert_eq!(
            said,
            "{\"ended\":{\"code\":null,\"message\":\"the session ended\"}}\n"
        );
    }

    #[tokio::test]
    async fn an_opener_that_passed_no_ledger_is_told_the_set_on_its_connection() {
        let (reporter, mut r) = reporting(None);
        let mut line = String::new();
        let mut lines = tokio::io::BufReader::new(&mut r);
        tokio::io::AsyncBufReadExt::read_line(&mut lines, &mut line)
            .await
            .unwrap();
        assert_eq!(line, "{\"outstanding\":[\"q\"]}\n");
        ends_with_the_end_line(reporter, lines).await;
    }

    #[tokio::test]
    async fn with_a_ledger_the_reporter_keeps_the_set_there_and_writes_nothing_but_the_end() {
        let fd = memfd();
        let reader = std::fs::File::from(fd.try_clone().unwrap());
        let (reporter, r) = reporting(Ledger::of(fd));
        let kept = async {
            loop {
                if let Some(set) = Ledger::read(&reader).filter(|s| !s.is_empty()) {
                    return set;
                }
                tokio::task::yield_now().await;
            }
        };
        let set = tokio::time::timeout(Duration::from_secs(10), kept)
            .await
            .unwrap();
        assert_eq!(texts(&set), [r#""q""#]);
        ends_with_the_end_line(reporter, r).await;
    }

    #[test]
    fn a_session_the_dialer_has_no_room_for_is_answered_32053_with_a_retry_hint() {
        let busy = mcpmesh_net::session::DialError::Busy("768 sessions".into());
        let input = b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/x\"}\n\
                      {\"jsonrpc\":\"2.0\",\"id\":5,\"method\":\"initialize\"}\n";
        let mut out = Vec::new();
        answer_failed_open_on(&input[..], &mut out, busy.error_code().code(), "full").unwrap();
        let answer: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(answer["id"], 5, "{answer}");
        assert_eq!(answer["error"]["code"], -32053, "{answer}");
        assert_eq!(answer["error"]["data"]["source"], "mcpmesh", "{answer}");
        assert_eq!(answer["error"]["data"]["retry_after_ms"], 1000, "{answer}");

        // A refusal keeps its code; anything else is unreachable.
        for (code, expected) in [(-32054, -32054), (-32000, -32055)] {
            let mut out = Vec::new();
            answer_failed_open_on(&input[..], &mut out, code, "no").unwrap();
            let answer: serde_json::Value = serde_json::from_slice(&out).unwrap();
            assert_eq!(answer["error"]["code"], expected, "{answer}");
        }
    }

    #[test]
    fn a_malformed_answer_still_answers_its_request_and_is_timed_as_an_error() {
        let metrics = Arc::new(Metrics::new());
        let mut o = Outstanding::timed(Dialed::new(Some(&metrics), None, "alice", "", "svc"));
        o.client_sent(Seen::Lines(
            b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\",\"params\":{\"name\":\"echo\"}}\n",
        ));
        assert_eq!(o.ids.len(), 1);
        o.server_sent(Seen::Lines(
            b"{\"jsonrpc\":\"2.0\",\"id\":1,\"error\":{\"code\":\"x\"}}\n",
        ));
        assert!(o.ids.is_empty(), "answered");
        let page = metrics.render();
        assert!(
            page.contains(r#"mcp_client_operation_duration_seconds_count{mcp_method_name="tools/call",gen_ai_tool_name="other",service="svc",peer="alice",outcome="error"} 1"#),
            "{page}"
        );
    }
}
