//! The mesh session protocol (ALPN `mcpmesh/mcp/1`): one bidirectional stream per MCP session.
//!
//! The dialer opens a stream and writes one preamble line naming the service, then its
//! client's MCP bytes, untouched. The acceptor gates the connection before reading anything,
//! reads the preamble, and hands the stream to a [`SessionHandler`] (the node's policy).

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use iroh::address_lookup::MemoryLookup;
use iroh::endpoint::{Connection, ConnectionError, RecvStream, SendStream, VarInt};
use iroh::protocol::{AcceptError, ProtocolHandler};
use iroh::{Endpoint, EndpointAddr, EndpointId};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

use crate::PeerIdentity;
use crate::errors::{ErrorCode, ErrorFrame};
use crate::gate::{CLOSE_SEVERED, CLOSE_UNKNOWN_PEER, TrustGate};
use crate::jsonrpc;
use crate::registry::ConnectionRegistry;
use crate::transport::{FrameReader, MAX_FRAME, NdjsonTransport, TransportError};

/// ALPN of MCP sessions between nodes.
pub const ALPN_MCP: &[u8] = b"mcpmesh/mcp/1";

/// The session protocol version a preamble carries.
pub const PROTOCOL_VERSION: u32 = 1;

/// A preamble is one short line; anything longer is not one.
const MAX_PREAMBLE: usize = 1024;

/// How long the acceptor waits for a preamble, or a refused session's first frame.
pub const FIRST_BYTES_TIMEOUT: Duration = Duration::from_secs(10);

/// An accepted session's wire.
pub type MeshTransport = NdjsonTransport<RecvStream, SendStream>;

/// The code a dialer resets and stops a session's stream with when its client went away, as
/// opposed to closing its input: the serving side then ends the session at once instead of
/// finishing what was asked.
pub const STREAM_CLIENT_GONE: u32 = 499;

/// Abandons a session stream whose client went away (see [`STREAM_CLIENT_GONE`]).
pub fn abandon(send: &mut SendStream, recv: &mut RecvStream) {
    let code = VarInt::from_u32(STREAM_CLIENT_GONE);
    // Either may fail only because that half already ended; the other half still tells.
    let _ = recv.stop(code);
    let _ = send.reset(code);
}

/// The first line of every session stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Preamble {
    pub mcpmesh: u32,
    pub service: String,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PreambleError {
    #[error("the session preamble is not JSON")]
    NotJson,
    #[error("unsupported session protocol version {0}")]
    Version(u32),
    #[error("invalid service name")]
    ServiceName,
}

impl Preamble {
    pub fn new(service: &str) -> Self {
        Preamble {
            mcpmesh: PROTOCOL_VERSION,
            service: service.to_owned(),
        }
    }

    pub fn to_line(&self) -> Vec<u8> {
        let mut line = serde_json::to_vec(self).unwrap_or_default();
        line.push(b'\n');
        line
    }

    pub fn parse(line: &[u8]) -> Result<Self, PreambleError> {
        let p: Preamble = serde_json::from_slice(line).map_err(|_| PreambleError::NotJson)?;
        if p.mcpmesh != PROTOCOL_VERSION {
            return Err(PreambleError::Version(p.mcpmesh));
        }
        if !valid_service_name(&p.service) {
            return Err(PreambleError::ServiceName);
        }
        Ok(p)
    }
}

/// Service names: 1–64 characters of `A-Z a-z 0-9 . _ -`, starting with a letter or digit.
pub fn valid_service_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphanumeric())
        && name.len() <= 64
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

/// The node's side of an accepted, gated session: authorize, then run a backend.
pub trait SessionHandler: Send + Sync + 'static {
    fn handle(
        &self,
        peer: PeerIdentity,
        service: String,
        transport: MeshTransport,
    ) -> impl Future<Output = ()> + Send;
}

/// The `mcpmesh/mcp/1` protocol handler: gate, preamble, hand-off.
#[derive(Debug)]
pub struct MeshProtocol<G, H> {
    gate: Arc<G>,
    handler: Arc<H>,
    registry: Arc<ConnectionRegistry>,
}

impl<G, H> MeshProtocol<G, H> {
    pub fn new(gate: Arc<G>, handler: Arc<H>, registry: Arc<ConnectionRegistry>) -> Self {
        MeshProtocol {
            gate,
            handler,
            registry,
        }
    }
}

impl<G, H> ProtocolHandler for MeshProtocol<G, H>
where
    G: TrustGate + std::fmt::Debug,
    H: SessionHandler + std::fmt::Debug,
{
    async fn accept(&self, conn: Connection) -> Result<(), AcceptError> {
        let remote = conn.remote_id();
        if self.gate.resolve(&remote).is_none() {
            tracing::info!(peer = %remote.fmt_short(), "refused a connection from an unknown key");
            conn.close(VarInt::from_u32(CLOSE_UNKNOWN_PEER), b"unknown peer");
            self.gate.refused(&remote);
            return Ok(());
        }
        self.registry.register(&conn);
        // This connection's sessions per service: a peer that ignores the dialer's share (a
        // client of its own) is held to it here.
        let counts: ServiceCounts = Default::default();
        while let Ok((send, recv)) = conn.accept_bi().await {
            // Resolved per stream, so a rename or a revocation applies to the next session.
            let Some(peer) = self.gate.resolve(&remote) else {
                conn.close(VarInt::from_u32(CLOSE_SEVERED), b"no longer trusted");
                break;
            };
            let handler = self.handler.clone();
            let counts = counts.clone();
            tokio::spawn(async move {
                let mut transport = NdjsonTransport::new(recv, send, MAX_PREAMBLE);
                let preamble = read_preamble(&mut transport).await;
                transport.reader_mut().set_max_frame(MAX_FRAME);
                match preamble {
                    Ok(p) => {
                        let Some(_share) = Share::take(&counts, &p.service) else {
                            tracing::info!(peer = %peer.name, service = %p.service, "refused a session: the connection carries the most one service may have");
                            refuse(&mut transport, share_full(&p.service)).await;
                            return;
                        };
                        handler.handle(peer, p.service, transport).await
                    }
                    Err(frame) => {
                        let _ = transport.send_raw(&frame.to_line()).await;
                        let _ = transport.writer_mut().shutdown().await;
                    }
                }
            });
        }
        Ok(())
    }
}

/// Sessions per service on one accepted connection.
type ServiceCounts = Arc<std::sync::Mutex<HashMap<String, usize>>>;

/// A caller told that a connection carries all it may is asked to wait this long.
const RETRY_SHARE_FULL: Duration = Duration::from_secs(1);

/// One accepted session's place in its connection's share for its service, given back when
/// the session ends.
struct Share {
    counts: ServiceCounts,
    service: String,
}

impl Share {
    /// A place for a session of `service`, unless the connection already carries
    /// [`MAX_SESSIONS_PER_SERVICE`] of them.
    fn take(counts: &ServiceCounts, service: &str) -> Option<Share> {
        let mut map = counts.lock().unwrap_or_else(|p| p.into_inner());
        let n = map.entry(service.to_owned()).or_default();
        if *n >= MAX_SESSIONS_PER_SERVICE {
            return None;
        }
        *n += 1;
        Some(Share {
            counts: counts.clone(),
            service: service.to_owned(),
        })
    }
}

impl Drop for Share {
    fn drop(&mut self) {
        let mut map = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = map.get_mut(&self.service) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                map.remove(&self.service);
            }
        }
    }
}

/// The refusal of a session beyond its service's share of a connection.
fn share_full(service: &str) -> ErrorFrame {
    ErrorFrame::new(ErrorCode::Busy)
        .message(format!(
            "{MAX_SESSIONS_PER_SERVICE} sessions to {service} are open on this connection, the \
             most one service may have; close one and try again"
        ))
        .retry_after_ms(RETRY_SHARE_FULL.as_millis() as u64)
}

async fn read_preamble(transport: &mut MeshTransport) -> Result<Preamble, ErrorFrame> {
    let line = match tokio::time::timeout(FIRST_BYTES_TIMEOUT, transport.recv_line()).await {
        Ok(Ok(Some(line))) => line,
        Ok(Err(TransportError::FrameTooLarge(_))) => {
            return Err(ErrorFrame::new(ErrorCode::Parse).message("session preamble too long"));
        }
        _ => return Err(ErrorFrame::new(ErrorCode::Parse).message("no session preamble")),
    };
    Preamble::parse(&line).map_err(|e| match e {
        PreambleError::NotJson => ErrorFrame::new(ErrorCode::Parse).message(e.to_string()),
        PreambleError::Version(_) => ErrorFrame::new(ErrorCode::NotReady).message(e.to_string()),
        PreambleError::ServiceName => ErrorFrame::new(ErrorCode::UnknownService),
    })
}

/// The most of a refused session's first frame that is read for its id: a request that is
/// refused anyway needs no 16 MiB read (its id is then `null`).
pub const REFUSED_FIRST_FRAME: usize = 64 * 1024;

/// Reads a refused session's first frame and returns its id (`None` when it has none, is not
/// JSON, or is longer than [`REFUSED_FIRST_FRAME`]), bounded in time and size.
pub async fn first_frame_id<R: AsyncRead + Unpin>(
    reader: &mut FrameReader<R>,
) -> Option<Box<RawValue>> {
    reader.set_max_frame(REFUSED_FIRST_FRAME);
    let line = tokio::time::timeout(FIRST_BYTES_TIMEOUT, reader.next_line())
        .await
        .ok()?
        .ok()??;
    jsonrpc::peek(&line)?.id.map(RawValue::to_owned)
}

/// Answers a refused session: `frame` echoing the first frame's id, then end of stream.
pub async fn refuse<R, W>(transport: &mut NdjsonTransport<R, W>, frame: ErrorFrame)
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let id = first_frame_id(transport.reader_mut()).await;
    let _ = transport.send_raw(&frame.id(id.as_deref()).to_line()).await;
    let _ = transport.writer_mut().shutdown().await;
}

/// Why a session could not be opened, or ended early, as the dialing side sees it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DialError {
    #[error("peer unreachable: {0}")]
    Unreachable(String),
    #[error("the peer does not trust this node")]
    Refused,
    #[error("no session could be opened within {0:?}")]
    Timeout(Duration),
    #[error("too many sessions: {0}")]
    Busy(String),
}

impl DialError {
    pub fn error_code(&self) -> ErrorCode {
        match self {
            DialError::Refused => ErrorCode::UnknownService,
            DialError::Busy(_) => ErrorCode::Busy,
            _ => ErrorCode::Unreachable,
        }
    }
}

/// The error-band code for a session whose connection closed with `reason`.
pub fn close_reason_code(reason: Option<&ConnectionError>) -> ErrorCode {
    match reason {
        Some(ConnectionError::ApplicationClosed(close)) => {
            match u32::try_from(close.error_code.into_inner()) {
                Ok(CLOSE_UNKNOWN_PEER) => ErrorCode::UnknownService,
                Ok(CLOSE_SEVERED) => ErrorCode::NotReady,
                _ => ErrorCode::Unreachable,
            }
        }
        _ => ErrorCode::Unreachable,
    }
}

/// How long a pooled connection gets to show that its peer is still there.
const LIVENESS_WAIT: Duration = Duration::from_millis(1500);
/// How long [`hears_from_peer`] looks at every turn of the runtime before it sleeps between
/// looks: what a session's open may spend of the node's CPU waiting for a near peer.
const LOOK_CLOSELY: Duration = Duration::from_millis(2);
/// Whether anything arrives on `connection` (past the `heard` datagrams counted before the
/// preamble was written) within [`LIVENESS_WAIT`]. A live peer acknowledges within a round trip:
/// [`write_preamble_probing`] makes the preamble more packets than the peer may take in without
/// acknowledging them, so it acknowledges at once rather than after its acknowledgement delay
/// (RFC 9000 §13.2.2, and the ACK frequency extension's threshold), and it sends
/// keep-alives every second anyway.
async fn hears_from_peer(connection: &Connection, heard: u64) -> bool {
    let looked_from = tokio::time::Instant::now();
    let deadline = looked_from + LIVENESS_WAIT;
    loop {
        // Closed first: what arrived may have been what closed it (the reset a restarted peer
        // sends for a connection it no longer knows).
        if connection.close_reason().is_some() {
            return false;
        }
        if connection.stats().udp_rx.datagrams > heard {
            return true;
        }
        let now = tokio::time::Instant::now();
        if now >= deadline {
            return false;
        }
        // The transport offers no event for an acknowledgement. A near peer's comes within a
        // fraction of a millisecond: look again at every turn of the runtime (which reads the
        // socket first) for a little while, then at the timer's granularity. A timer of 1 ms
        // wakes 1-2 ms later, and later still under load: it made the session's open wait 2-5
        // ms for an acknowledgement that had come in 0.3.
        if now < looked_from + LOOK_CLOSELY {
            tokio::task::yield_now().await;
        } else {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
}

/// Writes `preamble` as [`PROBE_PACKETS`] packets: a byte at a time, each once the one before
/// has left as a datagram (or after a millisecond), then the rest. The peer acknowledges that
/// many ack-eliciting packets in a row immediately, so a liveness probe costs a round trip
/// rather than the peer's acknowledgement delay (`MAX_ACK_DELAY`); the stream's bytes are the same
/// either way.
async fn write_preamble_probing(
    connection: &Connection,
    send: &mut SendStream,
    preamble: &[u8],
) -> Result<(), iroh::endpoint::WriteError> {
    let mut rest = preamble;
    for _ in 1..PROBE_PACKETS {
        let Some((first, tail)) = rest.split_first_chunk::<1>() else {
            break;
        };
        let sent = connection.stats().udp_tx.datagrams;
        send.write_all(first).await?;
        let deadline = tokio::time::Instant::now() + Duration::from_millis(1);
        while connection.stats().udp_tx.datagrams == sent && tokio::time::Instant::now() < deadline
        {
            tokio::task::yield_now().await;
        }
        rest = tail;
    }
    send.write_all(rest).await
}

/// How many packets a liveness probe is written as: one more than the peer may take in before
/// it must acknowledge them ([`crate::endpoint::ACK_ELICITING_THRESHOLD`]).
const PROBE_PACKETS: usize = crate::endpoint::ACK_ELICITING_THRESHOLD as usize + 1;

/// Opens sessions to peers by key, over one pooled connection per peer.
#[derive(Debug)]
pub struct Dialer {
    endpoint: Endpoint,
    book: MemoryLookup,
    registry: Arc<ConnectionRegistry>,
    pool: std::sync::Mutex<HashMap<EndpointId, Arc<tokio::sync::Mutex<Option<Pooled>>>>>,
    timeout: Duration,
    idle_close: Duration,
}

/// An opened session: the stream pair and the connection it rides on (whose close reason
/// tells a refusal from a loss). Holding it keeps the pooled connection in use.
#[derive(Debug)]
pub struct OpenedSession {
    pub send: SendStream,
    pub recv: RecvStream,
    pub connection: Connection,
    pub lease: Lease,
}

/// One session's claim on a pooled connection. When the last one goes, the connection is
/// closed after it stayed idle for the dialer's idle time.
#[derive(Debug)]
pub struct Lease {
    sessions: Arc<AtomicUsize>,
    /// Sessions per service on this connection, this one's among them.
    services: Arc<std::sync::Mutex<HashMap<String, usize>>>,
    service: String,
    connection: Connection,
    idle_close: Duration,
}

impl Drop for Lease {
    fn drop(&mut self) {
        {
            let mut services = self.services.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(n) = services.get_mut(&self.service) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    services.remove(&self.service);
                }
            }
        }
        // A connection already closed (a peer that refused this node closes each one) needs no
        // idle timer, and a timer must not keep a closed connection's state alive either.
        if self.sessions.fetch_sub(1, Ordering::AcqRel) != 1
            || self.connection.close_reason().is_some()
        {
            return;
        }
        let (sessions, conn, idle) = (
            self.sessions.clone(),
            self.connection.clone(),
            self.idle_close,
        );
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                tokio::select! {
                    () = tokio::time::sleep(idle) => {
                        if sessions.load(Ordering::Acquire) == 0 {
                            conn.close(VarInt::from_u32(0), b"idle");
                        }
                    }
                    _ = conn.closed() => {}
                }
            });
        }
    }
}

/// A pooled connection and the sessions using it.
#[derive(Debug)]
struct Pooled {
    connection: Connection,
    sessions: Arc<AtomicUsize>,
    services: Arc<std::sync::Mutex<HashMap<String, usize>>>,
}

/// What a connection's sessions are counted in: all of them, and per service.
type Counts = (
    Arc<AtomicUsize>,
    Arc<std::sync::Mutex<HashMap<String, usize>>>,
);

/// Sessions one connection carries at once: the streams every node allows its peer.
const MAX_SESSIONS: usize = crate::endpoint::MAX_STREAMS_PER_CONNECTION as usize;
/// Sessions one service may have on one connection, so that the others always find room.
const MAX_SESSIONS_PER_SERVICE: usize = MAX_SESSIONS * 3 / 4;
/// How long opening a stream may wait for the peer to allow one more.
const STREAM_WAIT: Duration = Duration::from_secs(2);

/// Counts a session of `service` in `counts`, unless the connection or the service's share of it
/// is full.
fn claim(counts: &Counts, service: &str) -> Result<(), DialError> {
    let mut services = counts.1.lock().unwrap_or_else(|p| p.into_inner());
    let of_service = services.get(service).copied().unwrap_or(0);
    if of_service >= MAX_SESSIONS_PER_SERVICE {
        return Err(DialError::Busy(format!(
            "{of_service} sessions to {service} are open with this peer, the most one service may \
             have; close one and try again"
        )));
    }
    if counts.0.load(Ordering::Acquire) >= MAX_SESSIONS {
        return Err(DialError::Busy(format!(
            "{MAX_SESSIONS} sessions are open with this peer, the most one connection carries; \
             close one and try again"
        )));
    }
    *services.entry(service.to_owned()).or_default() += 1;
    counts.0.fetch_add(1, Ordering::AcqRel);
    Ok(())
}

impl Dialer {
    pub fn new(
        endpoint: Endpoint,
        book: MemoryLookup,
        registry: Arc<ConnectionRegistry>,
        timeout: Duration,
        idle_close: Duration,
    ) -> Self {
        Dialer {
            endpoint,
            book,
            registry,
            pool: Default::default(),
            timeout,
            idle_close,
        }
    }

    /// Teaches the address book where a peer can be reached.
    pub fn add_address_hint(&self, addr: EndpointAddr) {
        if !addr.is_empty() {
            self.book.add_endpoint_info(addr);
        }
    }

    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// Opens a session to `service` on `peer`: a stream on the pooled connection (dialed if
    /// needed) with the preamble written, so the peer sees the stream at once.
    pub async fn open(&self, peer: EndpointId, service: &str) -> Result<OpenedSession, DialError> {
        let attempt = async {
            // A pooled connection may have died since it was last used: one fresh dial is part
            // of opening, never of a session already running.
            for fresh in [false, true] {
                let (connection, counts, pooled) = self.connection(peer, fresh).await?;
                claim(&counts, service)?;
                let lease = Lease {
                    sessions: counts.0,
                    services: counts.1,
                    service: service.to_owned(),
                    connection: connection.clone(),
                    idle_close: self.idle_close,
                };
                let opened = tokio::time::timeout(STREAM_WAIT, connection.open_bi()).await;
                let Ok(opened) = opened else {
                    return Err(DialError::Busy(
                        "the peer allows no more sessions on this connection now; try again shortly"
                            .into(),
                    ));
                };
                let Ok((mut send, recv)) = opened else {
                    if close_reason_code(connection.close_reason().as_ref())
                        == ErrorCode::UnknownService
                    {
                        return Err(DialError::Refused);
                    }
                    continue;
                };
                let preamble = Preamble::new(service).to_line();
                // A pooled connection may lead to a peer that is gone (killed, restarted) without
                // this side having noticed yet: the peer must answer the preamble (its
                // acknowledgement is enough) before a session is trusted to it. Having heard from
                // it moments ago proves nothing: a peer killed and restarted at once fits in any
                // such window.
                let heard = connection.stats().udp_rx.datagrams;
                let written = if pooled {
                    write_preamble_probing(&connection, &mut send, &preamble).await
                } else {
                    send.write_all(&preamble).await
                };
                if written.is_err() {
                    continue;
                }
                if pooled && !hears_from_peer(&connection, heard).await {
                    tracing::debug!(peer = %peer.fmt_short(), "the pooled connection is dead; dialing afresh");
                    connection.close(VarInt::from_u32(0), b"no answer");
                    continue;
                }
                return Ok(OpenedSession {
                    send,
                    recv,
                    connection,
                    lease,
                });
            }
            Err(DialError::Unreachable(
                "the connection closed while opening a session".into(),
            ))
        };
        tokio::time::timeout(self.timeout, attempt)
            .await
            .map_err(|_| DialError::Timeout(self.timeout))?
    }

    /// The connection to `peer` (`fresh`: a new one), its session count, and whether it was taken
    /// from the pool rather than dialed now.
    async fn connection(
        &self,
        peer: EndpointId,
        fresh: bool,
    ) -> Result<(Connection, Counts, bool), DialError> {
        let slot = {
            let mut pool = self.pool.lock().unwrap_or_else(|p| p.into_inner());
            pool.entry(peer).or_default().clone()
        };
        // Holding the slot's lock across the dial makes concurrent opens share one connection.
        let mut slot = slot.lock().await;
        if let Some(p) = slot
            .as_ref()
            .filter(|p| !fresh && p.connection.close_reason().is_none())
        {
            let counts = (p.sessions.clone(), p.services.clone());
            return Ok((p.connection.clone(), counts, true));
        }
        let conn = self
            .endpoint
            .connect(peer, ALPN_MCP)
            .await
            .map_err(|e| DialError::Unreachable(e.to_string()))?;
        self.registry.register(&conn);
        let counts: Counts = Default::default();
        *slot = Some(Pooled {
            connection: conn.clone(),
            sessions: counts.0.clone(),
            services: counts.1.clone(),
        });
        Ok((conn, counts, false))
    }

    /// Whether a pooled connection to `peer` is open, or being dialed, right now.
    pub fn is_connected(&self, peer: &EndpointId) -> bool {
        let slot = self
            .pool
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(peer)
            .cloned();
        slot.is_some_and(|slot| match slot.try_lock() {
            Ok(pooled) => pooled
                .as_ref()
                .is_some_and(|p| p.connection.close_reason().is_none()),
            Err(_) => true,
        })
    }

    /// Drops the pooled connection to `peer` (after the peer was removed or severed).
    pub fn forget(&self, peer: &EndpointId) {
        self.pool
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(peer);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reader that counts the bytes taken from it.
    struct Counting<'a> {
        bytes: &'a [u8],
        taken: usize,
    }

    impl AsyncRead for Counting<'_> {
        fn poll_read(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            buf: &mut tokio::io::ReadBuf<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            let n = buf.remaining().min(self.bytes.len() - self.taken).min(8192);
            let from = self.taken;
            buf.put_slice(&self.bytes[from..from + n]);
            self.taken += n;
            std::task::Poll::Ready(Ok(()))
        }
    }

    #[tokio::test]
    async fn a_refused_session_reads_at_most_a_little_of_its_first_frame() {
        let mut line = br#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"x":""#.to_vec();
        line.resize(4 << 20, b'a');
        line.extend_from_slice(b"\"}}\n");
        let reader = Counting {
            bytes: &line,
            taken: 0,
        };
        let mut transport = NdjsonTransport::new(reader, Vec::new(), crate::transport::MAX_FRAME);
        refuse(&mut transport, ErrorFrame::new(ErrorCode::Busy)).await;
        let (reader, answer) = transport.into_parts();
        let (counting, _) = reader.into_parts();
        assert!(
            counting.taken <= 2 * REFUSED_FIRST_FRAME,
            "read {} bytes of a frame that was refused anyway",
            counting.taken
        );
        let answer: serde_json::Value = serde_json::from_slice(&answer).unwrap();
        assert_eq!(answer["error"]["code"], -32053);
        assert!(answer["id"].is_null(), "{answer}");

        // A small first frame still has its id echoed.
        let small = b"{\"jsonrpc\":\"2.0\",\"id\":7,\"method\":\"ping\"}\n";
        let mut transport =
            NdjsonTransport::new(&small[..], Vec::new(), crate::transport::MAX_FRAME);
        refuse(&mut transport, ErrorFrame::new(ErrorCode::Busy)).await;
        let answer: serde_json::Value = serde_json::from_slice(&transport.into_parts().1).unwrap();
        assert_eq!(answer["id"], 7);
    }

    #[test]
    fn a_connection_carries_a_bounded_share_of_sessions_per_service_and_gives_places_back() {
        let counts = ServiceCounts::default();
        let held: Vec<Share> = (0..MAX_SESSIONS_PER_SERVICE)
            .map(|_| Share::take(&counts, "bulk").expect("a place within the share"))
            .collect();
        assert!(Share::take(&counts, "bulk").is_none(), "one past the share");
        // Another service on the same connection still finds room.
        assert!(Share::take(&counts, "other").is_some());
        drop(held);
        assert!(
            Share::take(&counts, "bulk").is_some(),
            "places are given back"
        );
        let refusal: serde_json::Value =
            serde_json::from_slice(&share_full("bulk").to_line()).unwrap();
        assert_eq!(refusal["error"]["code"], -32053, "{refusal}");
        assert_eq!(
            refusal["error"]["data"]["retry_after_ms"], 1000,
            "{refusal}"
        );
    }

    #[test]
    fn preamble_round_trips_and_rejects_bad_input() {
        let line = Preamble::new("notes").to_line();
        assert_eq!(line, b"{\"mcpmesh\":1,\"service\":\"notes\"}\n");
        assert_eq!(
            Preamble::parse(&line[..line.len() - 1]).unwrap().service,
            "notes"
        );
        assert_eq!(Preamble::parse(b"hello"), Err(PreambleError::NotJson));
        assert_eq!(
            Preamble::parse(br#"{"mcpmesh":2,"service":"notes"}"#),
            Err(PreambleError::Version(2))
        );
        assert_eq!(
            Preamble::parse(br#"{"mcpmesh":1,"service":"no\u0007tes"}"#),
            Err(PreambleError::ServiceName)
        );
    }

    #[test]
    fn service_names_are_plain() {
        assert!(valid_service_name("notes"));
        assert!(valid_service_name("fs.home_2-x"));
        assert!(!valid_service_name(""));
        assert!(!valid_service_name("-x"));
        assert!(!valid_service_name("a/b"));
        assert!(!valid_service_name(&"a".repeat(65)));
    }
}
