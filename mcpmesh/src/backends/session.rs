//! One served session, whatever it is attached to: admission (the service's session cap and
//! the caller's rate), the two pumps with the ledger in between, severing, draining, and the
//! session's audit records. A backend supplies the server's reader and writer and its own
//! teardown.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};

use mcpmesh_net::PeerIdentity;
use mcpmesh_net::errors::{ErrorCode, ErrorFrame};
use mcpmesh_net::jsonrpc;
use mcpmesh_net::pump::{
    DecideLong, LongLines, Observer, PumpError, Seen, Verdict, forward_checked, forward_observed,
    write_run,
};
use mcpmesh_net::scan::{Scan, Scanned};
use mcpmesh_net::session::refuse;
use mcpmesh_net::transport::{FrameReader, MAX_FRAME, NdjsonTransport};
use serde_json::Value;
use serde_json::value::RawValue;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::{Mutex, Notify, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use crate::audit::{AuditEvent, AuditSink};
use crate::backends::BackendError;
use crate::backends::ledger::{Caller, Ledger};
use crate::backends::stamp::PeerStamp;
use crate::limits::RateLimiter;
use crate::principal::{Held, principal_set};
use crate::telemetry::Refusal;
use crate::tool_policy::{ListedTools, ToolPolicy};

/// How long a server that owes no answer gets to finish writing after its input ends; the
/// spawn backend also gives a child this long after SIGTERM.
pub(crate) const GRACE: Duration = Duration::from_millis(300);
/// A caller told "at capacity" is asked to wait this long.
const RETRY_AT_CAPACITY: Duration = Duration::from_secs(1);
/// What a caller whose usable tools changed is sent (the node's own frame, the server's
/// tools being the same).
const LIST_CHANGED: &[u8] =
    b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/tools/list_changed\"}\n";

/// Settings of one session beyond what it is attached to.
#[derive(Debug, Clone)]
pub struct SessionOptions {
    /// Fires when the node shuts down: the session ends (and a child with it).
    pub shutdown: CancellationToken,
    /// Fires when a trust change takes the caller's access away: pending requests are
    /// answered `-32052`, then the session ends.
    pub sever: CancellationToken,
    /// Requests the session may have outstanding at once.
    pub max_in_flight: usize,
    /// The service's per-tool rules (by default none: every tool).
    pub tools: ToolPolicy,
    /// Where the tool names the server lists are kept, for the catalog.
    pub listed: ListedTools,
    /// How long the server may take over a request: once the caller has closed its side,
    /// the session waits this long at most for the answers still owed.
    pub request_timeout: Duration,
    /// Fires when the caller is gone (its stream was reset or stopped, its connection lost),
    /// unlike a caller that only closed its side: nothing owed can reach it any more, so the
    /// session ends at once.
    pub caller_gone: CancellationToken,
    /// The caller's principal set as the node reads it now (by default, the set of the
    /// identity the session opened with).
    pub held: Option<Held>,
    /// Told when what the caller may use of the service's tools changed: if it listed them
    /// in this session, it is sent `notifications/tools/list_changed`.
    pub relist: Arc<Notify>,
}

impl Default for SessionOptions {
    fn default() -> Self {
        SessionOptions {
            shutdown: CancellationToken::new(),
            sever: CancellationToken::new(),
            max_in_flight: crate::config::DEFAULT_IN_FLIGHT as usize,
            tools: ToolPolicy::default(),
            listed: ListedTools::default(),
            request_timeout: Duration::from_secs(crate::config::DEFAULT_REQUEST_TIMEOUT_SECS),
            caller_gone: CancellationToken::new(),
            held: None,
            relist: Arc::new(Notify::new()),
        }
    }
}

/// What a backend knows of its service beyond what it attaches to: the name, the session cap,
/// the per-caller rate limiter, and where records go.
#[derive(Debug, Clone)]
pub struct ServiceCtx {
    pub service: String,
    /// The service's session cap; a session that finds no permit is refused before anything
    /// is started or connected.
    pub concurrency: Arc<Semaphore>,
    pub audit: AuditSink,
    pub limiter: Arc<RateLimiter>,
}

/// The caller's principal set as the session reads it: the live one the host gave, else the
/// one the gate resolved at open.
pub(crate) fn held_of(identity: &PeerIdentity, options: &SessionOptions) -> Held {
    options
        .held
        .clone()
        .unwrap_or_else(|| Held::fixed(principal_set(identity, None)))
}

impl ServiceCtx {
    /// Admits a session for the gate-resolved `identity`, nothing read from it yet; `None`
    /// when it was refused (and answered).
    pub(crate) async fn admit<R, W>(
        &self,
        identity: &PeerIdentity,
        options: &SessionOptions,
        transport: &mut NdjsonTransport<R, W>,
    ) -> Option<(Who, OwnedSemaphorePermit)>
    where
        R: AsyncRead + Unpin,
        W: AsyncWrite + Unpin,
    {
        let who = Who::of(Some(identity), options.held.clone());
        let permit = self.host().admit(&who, None, transport).await?;
        Some((who, permit))
    }

    /// A session whose server could not be reached or started: the owner learns why in full
    /// (log, audit record, `watch`); the caller gets `-32055` saying the service could not be
    /// started, with a short reason that names nothing of the owner's machine.
    pub(crate) async fn unreachable<R, W>(
        &self,
        who: &Who,
        first_frame: Option<&Value>,
        transport: &mut NdjsonTransport<R, W>,
        e: BackendError,
    ) -> Result<(), BackendError>
    where
        R: AsyncRead + Unpin,
        W: AsyncWrite + Unpin,
    {
        tracing::error!(service = %self.service, peer = %who.peer, "{e}");
        self.audit.record(AuditEvent::SessionRefused {
            service: self.service.clone(),
            principal: who.principal.clone(),
            peer: who.peer.clone(),
            code: ErrorCode::Unreachable.code(),
            reason: Some(e.to_string()),
        });
        let frame = ErrorFrame::new(ErrorCode::Unreachable).message(format!(
            "{} (its owner sees why in `mcpmesh watch`, `status` and `audit tail`)",
            e.caller_message()
        ));
        answer_refusal(first_frame, transport, frame).await;
        Err(e)
    }

    pub(crate) fn host(&self) -> Host<'_> {
        Host {
            service: &self.service,
            audit: &self.audit,
            limiter: &self.limiter,
            concurrency: &self.concurrency,
        }
    }
}

/// Answers a session refused before its server was reached: `frame` echoing the id of the
/// first frame (read already, or read now), then end of stream.
async fn answer_refusal<R, W>(
    first_frame: Option<&Value>,
    transport: &mut NdjsonTransport<R, W>,
    frame: ErrorFrame,
) where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    match first_frame {
        Some(first) => {
            let id = first
                .get("id")
                .and_then(|id| RawValue::from_string(id.to_string()).ok());
            let _ = transport.send_raw(&frame.id(id.as_deref()).to_line()).await;
            let _ = transport.writer_mut().shutdown().await;
        }
        None => refuse(transport, frame).await,
    }
}

/// The service a session belongs to, as the session machinery needs it.
pub(crate) struct Host<'a> {
    pub service: &'a str,
    pub audit: &'a AuditSink,
    pub limiter: &'a Arc<RateLimiter>,
    pub concurrency: &'a Arc<Semaphore>,
}

/// Who is calling, as the records name them, and the principals the tool rules look at.
pub(crate) struct Who {
    pub principal: String,
    pub peer: String,
    /// Empty for a local caller: under tool rules it may use no tool.
    pub held: Held,
}

impl Who {
    /// The caller `identity`, holding `held` (by default, the principals of `identity`).
    pub fn of(identity: Option<&PeerIdentity>, held: Option<Held>) -> Self {
        Who {
            principal: identity.map_or_else(|| "local".to_owned(), PeerIdentity::principal),
            peer: identity.map(|i| i.name.clone()).unwrap_or_default(),
            held: held.unwrap_or_else(|| {
                Held::fixed(identity.map(|i| principal_set(i, None)).unwrap_or_default())
            }),
        }
    }
}

/// How a session's pump ended.
enum End {
    ClientClosed,
    /// The caller went away: its stream was reset or stopped, or its connection lost.
    ClientGone,
    ServerClosed,
    Failed(String),
    Shutdown,
    Severed,
}

impl Host<'_> {
    /// Takes a session slot and checks the caller's rate; on refusal the caller is answered
    /// `-32053` (echoing the first frame's id when it was already read) and `None` returned.
    pub async fn admit<R, W>(
        &self,
        who: &Who,
        first_frame: Option<&Value>,
        transport: &mut NdjsonTransport<R, W>,
    ) -> Option<OwnedSemaphorePermit>
    where
        R: AsyncRead + Unpin,
        W: AsyncWrite + Unpin,
    {
        let (reason, refusal) = match self.concurrency.clone().try_acquire_owned() {
            Err(_) => (
                Refusal::SessionCap,
                ErrorFrame::new(ErrorCode::Busy)
                    .message(format!("service {} is at its session limit", self.service))
                    .retry_after_ms(RETRY_AT_CAPACITY.as_millis() as u64),
            ),
            Ok(permit) => match self.limiter.check(self.service, &who.principal) {
                Ok(()) => return Some(permit),
                Err(wait) => (
                    Refusal::Rate,
                    ErrorFrame::new(ErrorCode::Busy)
                        .message("rate limited")
                        .retry_after_ms(wait.as_millis().max(1) as u64),
                ),
            },
        };
        if let Some(metrics) = self.audit.metrics() {
            metrics.refused(reason, Some(self.service));
        }
        tracing::info!(service = %self.service, peer = %who.peer, "refused a session: busy");
        self.audit.record(AuditEvent::SessionRefused {
            service: self.service.to_owned(),
            principal: who.principal.clone(),
            peer: who.peer.clone(),
            code: ErrorCode::Busy.code(),
            reason: None,
        });
        answer_refusal(first_frame, transport, refusal).await;
        None
    }

    /// Pumps the session between the mesh `transport` and the server until either side ends
    /// (or shutdown, or a sever), then ends the client's side, runs `teardown` with how long
    /// the server may still take to go, and writes the session's records. With `stamp`, each
    /// request carries the caller's identity in `params._meta`, and no frame keeps a
    /// caller's `mcpmesh/*` member in any `_meta`. Under per-tool rules, `tools/list` answers
    /// lose the tools the caller may not use (with the identity, the only edits to a frame).
    #[allow(clippy::too_many_arguments)]
    pub async fn pump<R, W, SR, SW, T, F>(
        &self,
        who: Who,
        first_frame: Option<Value>,
        transport: NdjsonTransport<R, W>,
        server_r: SR,
        server_w: SW,
        options: &SessionOptions,
        stamp: Option<PeerStamp>,
        teardown: T,
    ) where
        R: AsyncRead + Unpin + Send,
        W: AsyncWrite + Unpin + Send,
        SR: AsyncRead + Unpin + Send,
        SW: AsyncWrite + Unpin + Send,
        T: FnOnce(Duration) -> F,
        F: Future<Output = ()>,
    {
        self.record_open(&who);
        let mut traffic = Traffic::from_now();
        let (mut mesh_r, mesh_w) = transport.into_parts();
        let mesh_w = Mutex::new(mesh_w);
        let server_w = Mutex::new(server_w);
        let mut server_r = FrameReader::new(server_r, MAX_FRAME);
        let ledger = StdMutex::new(self.ledger(&who, options));
        // Both deciders count what the caller sent.
        let bytes_in = AtomicU64::new(0);
        let mut check = |line: &[u8]| {
            bytes_in.fetch_add(line.len() as u64 + 1, Ordering::Relaxed);
            let verdict = account(&ledger).client_line(line);
            match (&stamp, verdict) {
                (Some(stamp), Verdict::Forward) => stamped(stamp, line, |id, code| {
                    account(&ledger).answered_here(id, code)
                }),
                (_, verdict) => verdict,
            }
        };

        // A long request goes on to the server as it arrives, unless the node writes the
        // caller's identity into requests (it must then hold each whole to rewrite it).
        let mut long = stamp.is_none().then_some(Streamed {
            ledger: &ledger,
            bytes_in: &bytes_in,
        });
        let mut ending = Ending::new(match &first_frame {
            Some(first) => forward_first(first, &mut check, &server_w, &mesh_w).await,
            None => End::ClientClosed,
        });
        // One pump for the server's side for the whole session: when the client's side ends
        // first, the same pump drains what the server still sends, so an answer halfway
        // through (a long line passing in parts) goes on where it was. It holds `mesh_w`
        // across a long line: it is stopped (and has ended its line) before anything else is
        // written there.
        let stop = CancellationToken::new();
        let settled = Notify::new();
        let mut server_account = ServerSent {
            ledger: &ledger,
            bytes_out: &mut traffic.bytes_out,
            settled: &settled,
        };
        let mut server_side = Box::pin(forward_observed(
            &mut server_r,
            &mesh_w,
            &mesh_w,
            LongLines::PassOn,
            stop.cancelled(),
            &mut server_account,
        ));
        if matches!(ending.end, End::ClientClosed) {
            ending.end = tokio::select! {
                r = forward_checked(&mut mesh_r, &server_w, &mesh_w, &mut check, long.as_mut().map(|d| d as &mut dyn DecideLong)) => match r {
                    Ok(()) => End::ClientClosed,
                    Err(PumpError::Read(_)) => End::ClientGone,
                    Err(e) => End::Failed(e.to_string()),
                },
                r = &mut server_side => {
                    ending.server_done = true;
                    server_ended(r)
                },
                _ = options.shutdown.cancelled() => End::Shutdown,
                _ = options.sever.cancelled() => End::Severed,
                _ = options.caller_gone.cancelled() => End::ClientGone,
                never = relist(&options.relist, || account(&ledger).listed_tools(), &mesh_w) => match never {},
            };
        }
        // The server's input ends: EOF on a child's stdin, a half-close on a socket.
        let _ = server_w.into_inner().shutdown().await;
        if !ending.server_done && matches!(ending.end, End::ClientClosed) {
            ending
                .drain(&mut server_side, options, &ledger, &settled)
                .await;
        }
        ending.stop_server_side(&mut server_side, &stop).await;
        drop(server_side);
        if matches!(ending.end, End::Severed) && ending.server_done {
            answer_severed(&ledger, &mesh_w).await;
        }
        // Client-visible end first, so the caller is never kept waiting on the server.
        let _ = mesh_w.lock().await.shutdown().await;
        drop(server_r);
        teardown(ending.patience).await;
        account(&ledger).close();
        traffic.bytes_in += bytes_in.into_inner();
        self.record_close(who, &ending.end, traffic);
    }

    /// The account the session's requests are kept in: the caller, the service's tool rules
    /// and its in-flight cap.
    fn ledger(&self, who: &Who, options: &SessionOptions) -> Ledger {
        let caller = Caller {
            service: self.service.to_owned(),
            principal: who.principal.clone(),
            peer: who.peer.clone(),
            held: who.held.clone(),
            tools: options.tools.clone(),
            listed: options.listed.clone(),
        };
        Ledger::new(
            caller,
            self.limiter.clone(),
            self.audit.clone(),
            options.max_in_flight,
        )
    }

    fn record_open(&self, who: &Who) {
        self.audit.record(AuditEvent::SessionOpen {
            service: self.service.to_owned(),
            principal: who.principal.clone(),
            peer: who.peer.clone(),
        });
    }

    /// Writes the session's closing record, saying how it ended.
    fn record_close(&self, who: Who, end: &End, traffic: Traffic) {
        let ended = match end {
            End::ClientClosed => "client_closed".to_owned(),
            End::ClientGone => "client_gone".to_owned(),
            End::ServerClosed => "server_closed".to_owned(),
            End::Shutdown => "node_shutdown".to_owned(),
            End::Severed => "severed".to_owned(),
            End::Failed(why) => {
                tracing::debug!(service = %self.service, "session failed: {why}");
                "failed".to_owned()
            }
        };
        self.audit.record(AuditEvent::SessionClose {
            service: self.service.to_owned(),
            principal: who.principal,
            peer: who.peer,
            duration_ms: traffic.started.elapsed().as_millis() as u64,
            bytes_in: traffic.bytes_in,
            bytes_out: traffic.bytes_out,
            ended,
        });
    }
}

/// What a session carried, for its closing record.
struct Traffic {
    started: Instant,
    bytes_in: u64,
    bytes_out: u64,
}

impl Traffic {
    fn from_now() -> Self {
        Traffic {
            started: Instant::now(),
            bytes_in: 0,
            bytes_out: 0,
        }
    }
}

/// The session's ledger, locked (a poisoned lock is taken as it is).
fn account(ledger: &StdMutex<Ledger>) -> std::sync::MutexGuard<'_, Ledger> {
    ledger.lock().unwrap_or_else(|p| p.into_inner())
}

/// Passes on the first frame, read before the session was admitted, as the client's pump
/// would have; a failed write ends the session before the pumps start.
async fn forward_first<W, SW>(
    first: &Value,
    check: &mut impl FnMut(&[u8]) -> Verdict,
    server_w: &Mutex<SW>,
    mesh_w: &Mutex<W>,
) -> End
where
    W: AsyncWrite + Unpin,
    SW: AsyncWrite + Unpin,
{
    let line = serde_json::to_vec(first).unwrap_or_default();
    let written = match check(&line) {
        Verdict::Forward => write_run(server_w, &[&line[..], b"\n"].concat()).await,
        Verdict::Replace(line) => write_run(server_w, &line).await,
        Verdict::Answer(answer) | Verdict::Strike(answer) => write_run(mesh_w, &answer).await,
    };
    match written {
        Ok(()) => End::ClientClosed,
        Err(e) => End::Failed(format!("writing the first frame: {e}")),
    }
}

/// A severed session's requests still pending are answered `-32052` (given [`GRACE`] to
/// reach a caller that may have stopped reading).
async fn answer_severed<W: AsyncWrite + Unpin>(ledger: &StdMutex<Ledger>, mesh_w: &Mutex<W>) {
    let answers =
        account(ledger).answer_pending(ErrorCode::NotReady, "session severed: access was revoked");
    if !answers.is_empty() {
        let _ = tokio::time::timeout(GRACE, write_run(mesh_w, &answers)).await;
    }
}

/// Where a session's ending stands once the client's side stopped.
struct Ending {
    end: End,
    /// Whether the server's side pump has ended.
    server_done: bool,
    /// How long the server may still take to go after its input ended.
    patience: Duration,
}

impl Ending {
    fn new(end: End) -> Self {
        Ending {
            end,
            server_done: false,
            patience: GRACE,
        }
    }

    /// The client is done sending and may still be reading: the server answers what it was
    /// asked, within its request timeout, then gets a short grace to exit.
    async fn drain<S>(
        &mut self,
        server_side: &mut S,
        options: &SessionOptions,
        ledger: &StdMutex<Ledger>,
        settled: &Notify,
    ) where
        S: Future<Output = Result<(), PumpError>> + Unpin,
    {
        let deadline = tokio::time::Instant::now() + options.request_timeout;
        loop {
            let owed = account(ledger).owes_answers();
            let until = match owed {
                true => deadline,
                false => (tokio::time::Instant::now() + GRACE).min(deadline),
            };
            tokio::select! {
                r = &mut *server_side => {
                    self.server_done = true;
                    if let End::ClientGone = server_ended(r) {
                        self.end = End::ClientGone;
                    }
                    break;
                }
                _ = tokio::time::sleep_until(until) => break,
                _ = settled.notified(), if owed => {}
                _ = options.shutdown.cancelled() => {
                    self.end = End::Shutdown;
                    break;
                }
                _ = options.sever.cancelled() => {
                    self.end = End::Severed;
                    break;
                }
                _ = options.caller_gone.cancelled() => {
                    self.end = End::ClientGone;
                    break;
                }
            }
        }
        if !self.server_done {
            self.patience = Duration::ZERO; // it had its time while draining
        }
    }

    /// Stops the server's side pump unless it ended or nobody is left to read it; it gets
    /// [`GRACE`] to end the line it is in.
    async fn stop_server_side<S>(&mut self, server_side: &mut S, stop: &CancellationToken)
    where
        S: Future<Output = Result<(), PumpError>> + Unpin,
    {
        if matches!(self.end, End::ClientGone) {
            // Nobody is left to read what the server still sends, nor to wait for it.
            self.patience = Duration::ZERO;
        } else if !self.server_done {
            stop.cancel();
            // A pump that cannot even end its line (the client reads nothing) is dropped.
            self.server_done = tokio::time::timeout(GRACE, server_side).await.is_ok();
        }
    }
}

/// Sends the caller `notifications/tools/list_changed` each time `changed` is told, when it
/// has listed tools (`listed`) in this session; never ends by itself.
async fn relist<W: AsyncWrite + Unpin>(
    changed: &Notify,
    listed: impl Fn() -> bool,
    mesh_w: &Mutex<W>,
) -> std::convert::Infallible {
    loop {
        changed.notified().await;
        if listed() {
            // A caller that stopped reading ends the session through the other branches.
            let _ = write_run(mesh_w, LIST_CHANGED).await;
        }
    }
}

/// How a session ends when its server's side stopped first: a failed write goes to the mesh
/// stream, so it means the caller is gone.
fn server_ended(r: Result<(), PumpError>) -> End {
    match r {
        Ok(()) => End::ServerClosed,
        Err(PumpError::Write(_)) => End::ClientGone,
        Err(e) => End::Failed(e.to_string()),
    }
}

/// The serving node's watch on what the server sends: every answer ends its request's record,
/// and an answer cut off before its id went by is taken for the one request still waiting.
struct ServerSent<'a> {
    ledger: &'a StdMutex<Ledger>,
    bytes_out: &'a mut u64,
    /// Told whenever an answer leaves the server owing none.
    settled: &'a Notify,
}

impl ServerSent<'_> {
    fn ledger(&self) -> std::sync::MutexGuard<'_, Ledger> {
        self.ledger.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The caller's long lines, passed on as they arrive and decided on by the ledger.
struct Streamed<'a> {
    ledger: &'a StdMutex<Ledger>,
    bytes_in: &'a AtomicU64,
}

impl DecideLong for Streamed<'_> {
    fn may_pass(&mut self) -> bool {
        account(self.ledger).may_pass()
    }

    fn foresee(&mut self, scan: &Scan) -> Option<bool> {
        account(self.ledger).foresee(scan)
    }

    fn decide(&mut self, scanned: Scanned, len: usize) -> Verdict {
        self.bytes_in.fetch_add(len as u64, Ordering::Relaxed);
        account(self.ledger).client_streamed(scanned, len)
    }
}

impl Observer for ServerSent<'_> {
    fn seen(&mut self, seen: Seen<'_>) {
        *self.bytes_out += seen.len() as u64;
        let mut ledger = self.ledger();
        ledger.server_sent(seen);
        if !ledger.owes_answers() {
            self.settled.notify_one();
        }
    }

    fn lone_pending(&mut self) -> Option<Box<RawValue>> {
        self.ledger().lone_pending()
    }

    fn holding(&mut self) -> bool {
        self.ledger().holding()
    }

    fn rewrite(&mut self, line: &[u8]) -> Option<Vec<u8>> {
        self.ledger().server_line(line)
    }
}

/// A line the ledger let through, as the server gets it (see [`PeerStamp::apply`]). A request
/// that cannot carry the identity is answered `-32600` here, and `refused` told so; any other
/// frame that cannot be cleaned is dropped (a response is not answered).
fn stamped(stamp: &PeerStamp, line: &[u8], refused: impl FnOnce(&RawValue, i64)) -> Verdict {
    let error = match stamp.apply(line) {
        Ok(Some(mut line)) => {
            line.push(b'\n');
            return Verdict::Replace(line);
        }
        Ok(None) => return Verdict::Forward,
        Err(e) => e,
    };
    // The rare refusal is the only path that looks at the frame a second time.
    let peek = jsonrpc::peek(line);
    match peek
        .filter(|p| p.kind() == jsonrpc::Kind::Request)
        .and_then(|p| p.id)
    {
        Some(id) => {
            refused(id, ErrorCode::InvalidRequest.code());
            Verdict::Answer(
                ErrorFrame::new(ErrorCode::InvalidRequest)
                    .id(Some(id))
                    .message(format!("invalid request: {error}"))
                    .to_line(),
            )
        }
        None => Verdict::Answer(Vec::new()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stamp() -> PeerStamp {
        PeerStamp::new(&PeerIdentity {
            endpoint: [1; 32],
            name: "carol".into(),
            user_id: None,
            groups: Vec::new(),
        })
    }

    #[test]
    fn a_request_that_cannot_be_stamped_is_answered_and_a_response_is_dropped() {
        let mut refused = Vec::new();
        let verdict = stamped(
            &stamp(),
            br#"{"id":9,"method":"m","params":[1]}"#,
            |id, code| {
                refused.push((id.get().to_owned(), code));
            },
        );
        let Verdict::Answer(answer) = verdict else {
            panic!("{verdict:?}")
        };
        assert!(String::from_utf8_lossy(&answer).contains(r#""id":9"#));
        assert_eq!(refused, [("9".to_owned(), -32600)]);

        // A caller's broken answer to the server's request 9 is not answered back as if it
        // were the caller's own request 9.
        let verdict = stamped(&stamp(), br#"{"id":9,"result":{"_meta":[]}}"#, |_, _| {
            panic!("a response is never refused as a request")
        });
        assert!(
            matches!(&verdict, Verdict::Answer(a) if a.is_empty()),
            "{verdict:?}"
        );
    }
}
