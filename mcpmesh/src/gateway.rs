//! `mcpmesh gateway`: every mountable `peer/service` as a Streamable HTTP MCP endpoint at
//! `/mcp/<peer>/<service>`, for clients that speak HTTP instead of spawning a command.
//!
//! One HTTP MCP session is one mesh session, opened through the local node like `connect`
//! does: the session id is issued on `initialize`; each POSTed request is answered on its own
//! SSE stream (with the progress notifications that carry its token), other server-initiated
//! messages go to the GET stream (or, while none is open, to an open request's stream); DELETE
//! ends the mesh session and with it the remote server; an unknown session id is 404.
//! 2026-07-28 requests without a session share one mesh session per service (one server
//! instance, so a multi-round-trip retry meets the state it was given), ended when idle.
//!
//! Every request carries the profile's bearer token (see [`token`]): the gateway opens sessions
//! as this node, and without it any local user could, past the control socket's same-uid
//! check. It listens on loopback unless told otherwise, and checks `Host` and `Origin` against
//! DNS rebinding. Beyond loopback it serves TLS only (see [`tls`]), so the token never
//! crosses a network in the clear.

pub(crate) mod guard;
mod routes;
pub mod tls;
pub mod token;

pub use tls::{GatewayTls, TlsFiles};
pub use token::{TokenChoice, check_bind, resolve_token};

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream::{self, Stream};
use mcpmesh_net::errors::{ErrorCode, ErrorFrame};
use mcpmesh_net::jsonrpc::{self, Kind};
use mcpmesh_net::transport::{FrameReader, MAX_FRAME};
use serde_json::value::RawValue;
use tokio::io::AsyncWriteExt;
use tokio::net::UnixStream;
use tokio::net::unix::OwnedWriteHalf;
use tokio::sync::{Mutex, mpsc};
use tokio_util::sync::CancellationToken;

use crate::control::Attach;
use crate::control::client::ControlClient;
use crate::paths::Profile;
use routes::{Refused, Routes, with_id, with_id_and_token, with_progress_token};

const SESSION_ID: &str = "mcp-session-id";
/// Messages queued toward one HTTP stream before the mesh session waits for its reader.
pub(crate) const STREAM_QUEUE: usize = 64;
/// How much of a body past the frame cap is read and discarded before the refusal.
const DRAIN: usize = 64 << 20;
/// Server-initiated messages held while no stream is open to carry them.
const BACKLOG: usize = 1024;
/// HTTP sessions the gateway holds at once; past it, `initialize` is answered 503.
const MAX_SESSIONS: usize = 1024;
/// Test-only knobs: the session cap, the cap on one session's requests in flight, and a pause
/// between finding a sessionless request's shared session and registering the request there
/// (the suites widen that window to show that concurrent requests cannot cross).
pub const TEST_MAX_SESSIONS_ENV: &str = "MCPMESH_TEST_GATEWAY_MAX_SESSIONS";
pub const TEST_MAX_PENDING_ENV: &str = "MCPMESH_TEST_GATEWAY_MAX_PENDING";
pub const TEST_REGISTER_DELAY_MS_ENV: &str = "MCPMESH_TEST_GATEWAY_REGISTER_DELAY_MS";
/// Requests one HTTP session (or the shared sessionless one of a service) may have in flight;
/// past it, a request is answered `-32053`.
const MAX_PENDING: usize = 1024;
/// By default, a session with no request in flight and no open stream for this long is
/// ended: clients that go away without `DELETE` must not hold a server for long.
pub const DEFAULT_IDLE: Duration = Duration::from_secs(300);
/// Opening attempts after a session gave way to a new one at the service's session limit
/// (the serving node frees the slot just after the old session's stream ends).
const GIVE_WAY_RETRIES: u32 = 6;
/// The shared mesh session of a service's sessionless (2026-07-28) requests is ended after
/// this long without one.
const STATELESS_IDLE: Duration = Duration::from_secs(300);

/// How the gateway runs.
#[derive(Debug, Clone)]
pub struct GatewayConfig {
    pub listen: SocketAddr,
    /// The bearer token every request must carry; `None` only with `--no-token` on loopback
    /// (see [`check_bind`] and [`resolve_token`]).
    pub token: Option<String>,
    /// Origins allowed besides loopback ones (`http://host:port`).
    pub allowed_origins: Vec<String>,
    /// Host names allowed besides loopback ones (only checked on a loopback bind).
    pub allowed_hosts: Vec<String>,
    pub profile: Profile,
    /// The `mcpmesh` executable, to start the node when it is not running.
    pub exe: PathBuf,
    /// A session with no request in flight and no open stream for this long is ended.
    pub idle: Duration,
    /// The certificate and key to serve TLS with (required beyond loopback).
    pub tls: Option<GatewayTls>,
}

#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    #[error(
        "{0} is not a loopback address: a gateway reachable from other machines needs --allow-remote, a bearer token (--no-token is for loopback only) and TLS (--tls-cert CERT.pem --tls-key KEY.pem)"
    )]
    NotLoopback(SocketAddr),
    #[error(
        "{0} is not a loopback address: a gateway reachable from other machines must serve TLS, or every request's token crosses the network in the clear; give --tls-cert CERT.pem --tls-key KEY.pem (a certificate for the name clients use, and its key)"
    )]
    NeedsTls(SocketAddr),
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
    #[error(
        "the gateway token is empty: give one, leave it out to use this node's own, or pass --no-token"
    )]
    EmptyToken,
    #[error(
        "the gateway token is too short: give at least 22 base64url characters (128 bits), or leave it out to use this node's own"
    )]
    ShortToken,
    #[error(transparent)]
    Token(#[from] token::TokenError),
    #[error("cannot create this node's directories: {0}")]
    Dirs(std::io::Error),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("the gateway stopped: {0}")]
    Serve(std::io::Error),
}

/// Binds the listener; `serve` then runs until `shutdown` fires.
pub async fn bind(config: &GatewayConfig) -> Result<tokio::net::TcpListener, GatewayError> {
    tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|source| GatewayError::Bind {
            addr: config.listen,
            source,
        })
}

pub async fn serve(
    listener: tokio::net::TcpListener,
    config: GatewayConfig,
    shutdown: CancellationToken,
) -> Result<(), GatewayError> {
    let tls = config.tls.clone().map(|t| t.0);
    let gateway = Arc::new(Gateway {
        config,
        bounds: Bounds::from_env(),
        sessions: StdMutex::new(Sessions::default()),
        stateless: StdMutex::new(HashMap::new()),
    });
    let janitor = tokio::spawn(gateway.clone().expire_idle(shutdown.clone()));
    let app = Router::new()
        .route(
            "/mcp/{peer}/{service}",
            axum::routing::post(post).get(get).delete(delete),
        )
        .route(
            "/mcp/hub",
            axum::routing::post(post_hub)
                .get(get_hub)
                .delete(delete_hub),
        )
        .layer(axum::middleware::from_fn_with_state(
            gateway.clone(),
            guard::guard,
        ))
        .with_state(gateway.clone());
    crate::http_listener::serve_tls(
        listener,
        app,
        crate::http_listener::Limits::gateway(),
        tls,
        "gateway",
        shutdown.clone(),
    )
    .await;
    janitor.abort();
    for session in gateway.take_all() {
        session.close().await;
    }
    Ok(())
}

/// How much the gateway holds at once.
#[derive(Debug, Clone, Copy)]
struct Bounds {
    max_sessions: usize,
    max_pending: usize,
    register_delay: Duration,
}

impl Bounds {
    fn from_env() -> Self {
        let knob = |name: &str| {
            std::env::var(name)
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
        };
        Bounds {
            max_sessions: knob(TEST_MAX_SESSIONS_ENV).map_or(MAX_SESSIONS, |n| n as usize),
            max_pending: knob(TEST_MAX_PENDING_ENV).map_or(MAX_PENDING, |n| n as usize),
            register_delay: Duration::from_millis(knob(TEST_REGISTER_DELAY_MS_ENV).unwrap_or(0)),
        }
    }
}

/// The HTTP sessions, and the places held for `initialize`s under way: the cap counts both.
#[derive(Default)]
struct Sessions {
    map: HashMap<String, Arc<Session>>,
    reserved: usize,
}

/// A place among the gateway's sessions for one `initialize`, taken under the same lock that
/// checks the cap, so concurrent initializes cannot both pass it; given back when dropped
/// unfilled (the server refused, the mesh failed, the client went away).
struct Reservation {
    gateway: Arc<Gateway>,
    filled: bool,
}

impl Reservation {
    /// The session takes the place.
    fn fill(mut self, sid: String, session: Arc<Session>) {
        let mut sessions = self.gateway.sessions();
        sessions.reserved -= 1;
        sessions.map.insert(sid, session);
        self.filled = true;
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if !self.filled {
            self.gateway.sessions().reserved -= 1;
        }
    }
}

struct Gateway {
    config: GatewayConfig,
    bounds: Bounds,
    sessions: StdMutex<Sessions>,
    /// Per `(peer, service)`: one mesh session carrying the requests that come without an
    /// HTTP session (2026-07-28). One server instance answers them all, so a multi-round-trip
    /// result's `requestState` is honoured on the retry.
    stateless: StdMutex<HashMap<(String, String), Arc<Session>>>,
}

impl Gateway {
    fn sessions(&self) -> std::sync::MutexGuard<'_, Sessions> {
        self.sessions.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A place for one more session, or `None` at the cap.
    fn reserve(self: &Arc<Self>) -> Option<Reservation> {
        let mut sessions = self.sessions();
        if sessions.map.len() + sessions.reserved >= self.bounds.max_sessions {
            return None;
        }
        sessions.reserved += 1;
        Some(Reservation {
            gateway: self.clone(),
            filled: false,
        })
    }

    fn take_all(&self) -> Vec<Arc<Session>> {
        let mut all: Vec<Arc<Session>> = self.sessions().map.drain().map(|(_, s)| s).collect();
        all.extend(self.stateless_map().drain().map(|(_, s)| s));
        all
    }

    fn stateless_map(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), Arc<Session>>> {
        self.stateless.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The shared mesh session for sessionless requests to `peer/service`, opened on demand.
    async fn stateless_session(
        self: &Arc<Self>,
        peer: &str,
        service: &str,
    ) -> Result<Arc<Session>, (i64, String)> {
        let key = (peer.to_owned(), service.to_owned());
        if let Some(s) = self
            .stateless_map()
            .get(&key)
            .filter(|s| !s.closed.is_cancelled())
        {
            return Ok(s.clone());
        }
        let session = new_session(self, peer, service).await?;
        // Two first requests may race here; the loser's session serves its one request.
        self.stateless_map().insert(key, session.clone());
        Ok(session)
    }

    /// The session `headers` name, when it exists and belongs to `peer/service`.
    fn session(&self, headers: &HeaderMap, peer: &str, service: &str) -> Lookup {
        let Some(id) = headers.get(SESSION_ID).and_then(|v| v.to_str().ok()) else {
            return Lookup::NoHeader;
        };
        match self.sessions().map.get(id) {
            Some(s) if s.peer == peer && s.service == service && !s.closed.is_cancelled() => {
                Lookup::Found(s.clone())
            }
            _ => Lookup::Unknown,
        }
    }

    async fn expire_idle(self: Arc<Self>, shutdown: CancellationToken) {
        let idle = self.config.idle;
        let mut tick = tokio::time::interval(
            (idle / 2).clamp(Duration::from_millis(100), Duration::from_secs(60)),
        );
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = shutdown.cancelled() => return,
            }
            let mut stale: Vec<Arc<Session>> = {
                let mut sessions = self.sessions();
                let map = &mut sessions.map;
                let ids: Vec<String> = map
                    .iter()
                    .filter(|(_, s)| s.closed.is_cancelled() || s.idle_for() > Some(idle))
                    .map(|(id, _)| id.clone())
                    .collect();
                ids.iter().filter_map(|id| map.remove(id)).collect()
            };
            {
                let mut map = self.stateless_map();
                let keys: Vec<(String, String)> = map
                    .iter()
                    .filter(|(_, s)| s.closed.is_cancelled() || s.idle_for() > Some(STATELESS_IDLE))
                    .map(|(k, _)| k.clone())
                    .collect();
                stale.extend(keys.iter().filter_map(|k| map.remove(k)));
            }
            for s in stale {
                s.close().await;
            }
        }
    }

    /// Takes the HTTP session to `peer/service` that has been idle longest out of the map (so
    /// its id is then unknown); `None` when every one is in use.
    fn take_longest_idle(&self, peer: &str, service: &str) -> Option<Arc<Session>> {
        let mut sessions = self.sessions();
        let map = &mut sessions.map;
        let id = map
            .iter()
            .filter(|(_, s)| s.peer == peer && s.service == service && !s.closed.is_cancelled())
            .filter_map(|(id, s)| Some((s.idle_for()?, id)))
            .max_by_key(|(idle, _)| *idle)
            .map(|(_, id)| id.clone())?;
        map.remove(&id)
    }

    /// Opens a mesh session to `peer/service` through the local node; for the hub's path, a
    /// hub of its own over every mountable service, on one end of a socket pair.
    async fn open(&self, peer: &str, service: &str) -> Result<UnixStream, (i64, String)> {
        if (peer, service) == HUB {
            return self.open_hub();
        }
        let (profile, exe) = (self.config.profile.clone(), self.config.exe.clone());
        let (peer, service) = (peer.to_owned(), service.to_owned());
        let opened = tokio::task::spawn_blocking(move || {
            ControlClient::connect_or_start(&profile, &exe)
                .and_then(|c| c.open_session(&peer, &service, Attach::Stream))
        })
        .await
        .map_err(|e| (ErrorCode::Unreachable.code(), e.to_string()))?;
        let (stream, leftover) = opened.map_err(|e| (e.code, e.message))?;
        if !leftover.is_empty() {
            // The node never writes before the client's first frame; nothing to keep.
            tracing::debug!("{} unexpected bytes after session.open", leftover.len());
        }
        stream
            .set_nonblocking(true)
            .and_then(|()| UnixStream::from_std(stream))
            .map_err(|e| (ErrorCode::Unreachable.code(), e.to_string()))
    }

    /// A hub serving one HTTP session (or the shared sessionless one), as `mcpmesh hub` does
    /// on stdio; it ends, closing its sessions, when the gateway's end of the pair closes.
    fn open_hub(&self) -> Result<UnixStream, (i64, String)> {
        let (ours, hubs) =
            UnixStream::pair().map_err(|e| (ErrorCode::Unreachable.code(), e.to_string()))?;
        let config = crate::hub::HubConfig {
            profile: self.config.profile.clone(),
            exe: self.config.exe.clone(),
            targets: Vec::new(),
            idle: crate::hub::DEFAULT_IDLE,
            naming: crate::hub::Naming::Prefixed,
        };
        tokio::spawn(async move {
            let (input, output) = hubs.into_split();
            if let Err(e) = crate::hub::serve(config, input, output).await {
                tracing::warn!("the gateway's hub stopped: {e}");
            }
        });
        Ok(ours)
    }
}

/// The gateway's key for `/mcp/hub` (no peer has an empty name).
const HUB: (&str, &str) = ("", "hub");

async fn post_hub(
    State(gateway): State<Arc<Gateway>>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Response {
    post(State(gateway), hub_path(), headers, body).await
}

async fn get_hub(State(gateway): State<Arc<Gateway>>, headers: HeaderMap) -> Response {
    get(State(gateway), hub_path(), headers).await
}

async fn delete_hub(State(gateway): State<Arc<Gateway>>, headers: HeaderMap) -> Response {
    delete(State(gateway), hub_path(), headers).await
}

fn hub_path() -> Path<(String, String)> {
    Path((HUB.0.to_owned(), HUB.1.to_owned()))
}

enum Lookup {
    NoHeader,
    Unknown,
    Found(Arc<Session>),
}

struct Session {
    peer: String,
    service: String,
    writer: Mutex<OwnedWriteHalf>,
    routes: StdMutex<Routes>,
    closed: CancellationToken,
    /// Fires when the node has ended the mesh session's stream.
    ended: CancellationToken,
    last_active: StdMutex<Instant>,
}

impl Session {
    fn routes(&self) -> std::sync::MutexGuard<'_, Routes> {
        self.routes.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn touch(&self) {
        *self.last_active.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
    }

    /// How long the session has had no request in flight and no open stream; `None` while
    /// it has. A stream or request whose client went away does not count.
    fn idle_for(&self) -> Option<Duration> {
        let routes = self.routes();
        let in_use = routes.get.as_ref().is_some_and(|g| !g.is_closed())
            || routes.waiting.values().any(|w| !w.tx.is_closed());
        drop(routes);
        if in_use {
            // Idle time counts from when the session was last seen in use.
            self.touch();
            return None;
        }
        Some(
            self.last_active
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .elapsed(),
        )
    }

    async fn send(&self, line: &[u8]) -> std::io::Result<()> {
        self.touch();
        let mut w = self.writer.lock().await;
        w.write_all(line).await?;
        w.write_all(b"\n").await?;
        w.flush().await
    }

    /// Ends the mesh session: the node closes the stream and the remote server goes.
    async fn close(&self) {
        self.closed.cancel();
        let _ = self.writer.lock().await.shutdown().await;
        self.routes().clear();
    }

    /// Registers the stream that answers request `id` (and carries its progress).
    fn route_answer(
        &self,
        id: &RawValue,
        token: Option<&RawValue>,
        cap: usize,
    ) -> Result<mpsc::Receiver<Bytes>, Refused> {
        self.routes().insert(jsonrpc::id_key(id), token, None, cap)
    }

    /// As [`Session::route_answer`], under an id of the gateway's own, unique in this session: the
    /// id to send the server instead of `id`, which the answer gets back. Requests of
    /// independent clients that happen to use the same id can then share the session.
    fn expect_remapped(
        &self,
        id: &RawValue,
        token: Option<&RawValue>,
        cap: usize,
    ) -> Result<(Box<RawValue>, mpsc::Receiver<Bytes>), Refused> {
        let mut routes = self.routes();
        // The same name serves as its progress token: both are unique in the session.
        let ours = RawValue::from_string(format!("\"mcpmesh-gateway:{}\"", routes.next))
            .map_err(|_| Refused::Full)?;
        let client = (id.to_owned(), token.map(ToOwned::to_owned));
        let ours_token = token.map(|_| &*ours);
        let rx = routes.insert(ours.get().to_owned(), ours_token, Some(client), cap)?;
        Ok((ours, rx))
    }

    /// Reads the server's lines from the mesh and routes each to its stream.
    async fn route(self: Arc<Self>, reader: tokio::net::unix::OwnedReadHalf) {
        let mut reader = FrameReader::new(reader, MAX_FRAME);
        loop {
            let line = tokio::select! {
                l = reader.next_line() => l,
                _ = self.closed.cancelled() => break,
            };
            let Ok(Some(line)) = line else { break };
            if let Some((tx, done, line)) = self.target_of(line.clone())
                && tx.send(line.clone()).await.is_err()
                && !done
            {
                // The stream's reader went away; hold the message for the next one.
                self.hold(line);
            }
        }
        // The mesh session ended (the node answered whatever was outstanding first).
        self.closed.cancel();
        self.ended.cancel();
        self.routes().clear();
    }

    /// Picks the stream for one server line: `(sender, is_final, line)`, the line with the
    /// client's own id when it answers a remapped request; `None` when it was held in the
    /// backlog.
    fn target_of(&self, line: Bytes) -> Option<(mpsc::Sender<Bytes>, bool, Bytes)> {
        let mut routes = self.routes();
        let peek = jsonrpc::peek(&line);
        let kind = peek.as_ref().map(jsonrpc::Peek::kind);
        if kind == Some(Kind::Response) {
            if let Some(key) = peek.as_ref().and_then(|p| p.id).map(jsonrpc::id_key)
                && let Some(w) = routes.remove(&key)
            {
                let line = match &w.client_id {
                    Some(id) => with_id(&line, id).unwrap_or(line),
                    None => line,
                };
                return Some((w.tx, true, line));
            }
        } else if let Some(token) = peek
            .as_ref()
            .and_then(|p| p.progress_token().map(jsonrpc::id_key))
            && let Some(key) = routes.tokens.get(&token)
            && let Some(w) = routes.waiting.get(key)
        {
            let line = match &w.client_token {
                Some(t) => with_progress_token(&line, t).unwrap_or(line),
                None => line,
            };
            return Some((w.tx.clone(), false, line));
        } else if let Some(key) = peek
            .as_ref()
            .and_then(routes::subscription_id)
            .map(jsonrpc::id_key)
            && let Some(w) = routes.waiting.get(&key)
        {
            // A `subscriptions/listen` stream's notification goes to that stream, under the
            // id its client gave the listen request.
            let line = match &w.client_id {
                Some(id) => routes::with_subscription_id(&line, id).unwrap_or(line),
                None => line,
            };
            return Some((w.tx.clone(), false, line));
        }
        if let Some(get) = routes.get.as_ref().filter(|g| !g.is_closed()) {
            return Some((get.clone(), false, line));
        }
        let newest = routes
            .order
            .values()
            .next_back()
            .and_then(|k| routes.waiting.get(k));
        if let Some(w) = newest {
            return Some((w.tx.clone(), false, line));
        }
        drop(routes);
        self.hold(line);
        None
    }

    fn hold(&self, line: Bytes) {
        let mut routes = self.routes();
        if routes.backlog.len() >= BACKLOG {
            routes.backlog.pop_front();
            tracing::warn!("gateway: a server message was dropped (no stream open to carry it)");
        }
        routes.backlog.push_back(line);
    }
}

/// `-32053` as an HTTP 503 with `Retry-After`: the gateway holds as much as it may.
fn busy(id: Option<&RawValue>, message: &str) -> Response {
    let frame = ErrorFrame::new(ErrorCode::Busy)
        .id(id)
        .message(message)
        .retry_after_ms(1000);
    let mut r = (
        StatusCode::SERVICE_UNAVAILABLE,
        [(header::CONTENT_TYPE, "application/json")],
        frame.to_line(),
    )
        .into_response();
    r.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    r
}

fn plain(status: StatusCode, message: &str) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain")],
        message.to_owned(),
    )
        .into_response()
}

/// 404 for a session id that names no session (never issued, ended, or closed when idle).
fn unknown_session() -> Response {
    rpc_error(
        StatusCode::NOT_FOUND,
        ErrorCode::UnknownSession,
        None,
        "unknown or ended session: initialize a new one",
    )
}

/// A JSON-RPC error as an HTTP response (`id` null unless given).
fn rpc_error(
    status: StatusCode,
    code: ErrorCode,
    id: Option<&RawValue>,
    message: &str,
) -> Response {
    let line = ErrorFrame::new(code).id(id).message(message).to_line();
    (status, [(header::CONTENT_TYPE, "application/json")], line).into_response()
}

/// The message streams back to the client: SSE when it accepts it, else the final answer as
/// JSON.
fn respond(rx: mpsc::Receiver<Bytes>, headers: &HeaderMap, session: Option<&str>) -> Response {
    let accept = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let mut response = if accept.contains("text/event-stream") || accept.is_empty() {
        sse(rx).into_response()
    } else {
        json_answer(rx)
    };
    if let Some(id) = session.and_then(|s| HeaderValue::from_str(s).ok()) {
        response.headers_mut().insert(SESSION_ID, id);
    }
    response
}

fn sse(rx: mpsc::Receiver<Bytes>) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let events = stream::unfold(rx, |mut rx| async move {
        let line = rx.recv().await?;
        let data = String::from_utf8_lossy(&line).into_owned();
        Some((Ok(Event::default().event("message").data(data)), rx))
    });
    Sse::new(events).keep_alive(KeepAlive::default())
}

/// For a client that accepts only JSON: the last message (the answer) as the body.
fn json_answer(rx: mpsc::Receiver<Bytes>) -> Response {
    let body = stream::once(async move {
        let mut rx = rx;
        let mut last = Bytes::new();
        while let Some(line) = rx.recv().await {
            last = line;
        }
        Ok::<_, Infallible>(last)
    });
    (
        [(header::CONTENT_TYPE, "application/json")],
        axum::body::Body::from_stream(body),
    )
        .into_response()
}

async fn post(
    State(gateway): State<Arc<Gateway>>,
    Path((peer, service)): Path<(String, String)>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Response {
    let body = match read_body(&headers, body).await {
        Ok(body) => body,
        Err(refusal) => return refusal,
    };
    let posted = match Posted::read(&body) {
        Ok(posted) => posted,
        Err((code, why)) => return rpc_error(StatusCode::BAD_REQUEST, code, None, why),
    };
    let id = posted.id.as_deref();
    let session = match gateway.session(&headers, &peer, &service) {
        Lookup::Found(s) => s,
        Lookup::Unknown => {
            return rpc_error(
                StatusCode::NOT_FOUND,
                ErrorCode::UnknownSession,
                id,
                "unknown or ended session: initialize a new one",
            );
        }
        Lookup::NoHeader if posted.initialize => {
            let Some(id) = id else {
                return plain(StatusCode::BAD_REQUEST, "initialize needs an id");
            };
            let Some(place) = gateway.reserve() else {
                return busy(
                    Some(id),
                    "the gateway holds as many sessions as it may; end one (DELETE) first",
                );
            };
            let sent = posted.sent(id, &headers);
            return sent.initialize(&gateway, &peer, &service, place).await;
        }
        Lookup::NoHeader if posted.stateless => {
            let Some(rid) = id else {
                return plain(StatusCode::BAD_REQUEST, "a request needs an id");
            };
            let shared = match gateway.stateless_session(&peer, &service).await {
                Ok(s) => s,
                Err((code, message)) => return open_failed(code, id, &message),
            };
            if !gateway.bounds.register_delay.is_zero() {
                tokio::time::sleep(gateway.bounds.register_delay).await;
            }
            let sent = posted.sent(rid, &headers);
            return sent.remapped(&shared, gateway.bounds.max_pending).await;
        }
        Lookup::NoHeader => {
            return rpc_error(
                StatusCode::BAD_REQUEST,
                ErrorCode::NotReady,
                id,
                "an Mcp-Session-Id header is required (initialize first)",
            );
        }
    };

    match (posted.kind, id) {
        (Kind::Request, Some(id)) => {
            let sent = posted.sent(id, &headers);
            sent.send_into(&session, gateway.bounds.max_pending).await
        }
        _ => match session.send(&posted.line).await {
            Ok(()) => StatusCode::ACCEPTED.into_response(),
            Err(_) => plain(StatusCode::NOT_FOUND, "the mesh session ended"),
        },
    }
}

/// One JSON-RPC message as a POST brings it, and what the gateway reads of it.
struct Posted {
    line: Bytes,
    kind: Kind,
    id: Option<Box<RawValue>>,
    token: Option<Box<RawValue>>,
    initialize: bool,
    /// A 2026-07-28 request, which needs no session.
    stateless: bool,
}

impl Posted {
    /// The message a POST's body holds; for a body that is not one message, the error it is
    /// answered with (400).
    fn read(body: &[u8]) -> Result<Posted, (ErrorCode, &'static str)> {
        // One message, one line: the line breaks a client may put between tokens go (JSON
        // strings cannot hold raw ones); every other byte passes as sent.
        let line: Bytes = body
            .iter()
            .copied()
            .filter(|b| *b != b'\n' && *b != b'\r')
            .collect::<Vec<u8>>()
            .into();
        let Some(peek) = jsonrpc::peek(&line) else {
            return Err(if jsonrpc::is_json(&line) {
                (
                    ErrorCode::InvalidRequest,
                    "one JSON-RPC message per POST (no batches)",
                )
            } else {
                (ErrorCode::Parse, "the body is not JSON")
            });
        };
        let kind = peek.kind();
        let id = peek.id.map(ToOwned::to_owned);
        let meta = jsonrpc::meta(peek.params);
        let initialize = peek.method.as_deref() == Some("initialize");
        let stateless = kind == Kind::Request && !initialize && meta.protocol_version.is_some();
        Ok(Posted {
            kind,
            id,
            token: meta.progress_token,
            initialize,
            stateless,
            line,
        })
    }

    /// The message as a request `id` on its way into a mesh session.
    fn sent<'a>(&'a self, id: &'a RawValue, headers: &'a HeaderMap) -> Sent<'a> {
        Sent {
            line: &self.line,
            id,
            token: self.token.as_deref(),
            headers,
        }
    }
}

/// A POST's body, held to the frame cap. A body past the cap is read on and discarded up to
/// [`DRAIN`], so that a client still sending it gets the refusal rather than a broken pipe; a
/// declared length past that is refused at once, before any of the body is read.
async fn read_body(headers: &HeaderMap, body: axum::body::Body) -> Result<Bytes, Response> {
    use futures_util::StreamExt;
    let too_large = || {
        rpc_error(
            StatusCode::PAYLOAD_TOO_LARGE,
            ErrorCode::FrameTooLarge,
            None,
            "the message is larger than the frame cap",
        )
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n > DRAIN as u64) {
        return Err(too_large());
    }
    let mut stream = body.into_data_stream();
    let mut read = Vec::new();
    let mut discarded = 0usize;
    while let Some(chunk) = stream.next().await {
        let Ok(chunk) = chunk else {
            return Err(plain(StatusCode::BAD_REQUEST, "the body could not be read"));
        };
        if discarded > 0 || read.len() + chunk.len() > MAX_FRAME {
            discarded += std::mem::take(&mut read).len() + chunk.len();
            if discarded > DRAIN {
                return Err(too_large());
            }
            continue;
        }
        read.extend_from_slice(&chunk);
    }
    if discarded > 0 {
        return Err(too_large());
    }
    Ok(read.into())
}

/// A request on its way into a mesh session.
struct Sent<'a> {
    line: &'a [u8],
    id: &'a RawValue,
    token: Option<&'a RawValue>,
    headers: &'a HeaderMap,
}

impl Sent<'_> {
    /// Sends the request into an HTTP session and answers with the stream that will carry
    /// its answer; if the mesh session is gone, 404 with `-32055`.
    async fn send_into(self, session: &Session, cap: usize) -> Response {
        let rx = match session.route_answer(self.id, self.token, cap) {
            Ok(rx) => rx,
            Err(refused) => return self.refused(refused),
        };
        self.send(session, self.line, rx, StatusCode::NOT_FOUND)
            .await
    }

    /// Sends a sessionless request into its service's shared mesh session under an id of the
    /// gateway's own, so that it never meets another client's request with the same id; the
    /// answer carries the client's id again, exactly as it was written.
    async fn remapped(self, session: &Session, cap: usize) -> Response {
        let (ours, rx) = match session.expect_remapped(self.id, self.token, cap) {
            Ok(registered) => registered,
            Err(refused) => return self.refused(refused),
        };
        let Some(line) = with_id_and_token(self.line, &ours, &ours) else {
            return rpc_error(
                StatusCode::BAD_REQUEST,
                ErrorCode::InvalidRequest,
                Some(self.id),
                "the request could not be read",
            );
        };
        self.send(session, &line, rx, StatusCode::OK).await
    }

    async fn send(
        &self,
        session: &Session,
        line: &[u8],
        rx: mpsc::Receiver<Bytes>,
        lost: StatusCode,
    ) -> Response {
        if session.send(line).await.is_err() {
            session.close().await;
            return rpc_error(
                lost,
                ErrorCode::Unreachable,
                Some(self.id),
                "the mesh session ended",
            );
        }
        respond(rx, self.headers, None)
    }

    fn refused(&self, refused: Refused) -> Response {
        match refused {
            Refused::Full => busy(
                Some(self.id),
                "this session has as many requests in flight as it may; retry when one is answered",
            ),
            Refused::Duplicate => rpc_error(
                StatusCode::BAD_REQUEST,
                ErrorCode::InvalidRequest,
                Some(self.id),
                "a request with this id is already in flight in this session",
            ),
        }
    }
}

impl Sent<'_> {
    /// Opens a mesh session for an `initialize` and answers it. The HTTP session exists (and
    /// its id is given) only once the server accepted; when the service refuses because it is
    /// at its session limit, this service's longest-idle HTTP session gives way first.
    async fn initialize(
        self,
        gateway: &Arc<Gateway>,
        peer: &str,
        service: &str,
        place: Reservation,
    ) -> Response {
        let mut gave_way = false;
        let mut delay = Duration::from_millis(50);
        let mut attempts = 0;
        loop {
            let session = match new_session(gateway, peer, service).await {
                Ok(s) => s,
                Err((code, message)) => return open_failed(code, Some(self.id), &message),
            };
            // A client that goes away before the answer takes the mesh session with it.
            let armed = session.closed.clone().drop_guard();
            let Ok(mut rx) = session.route_answer(self.id, self.token, 1) else {
                // A fresh session waits for nothing else.
                session.close().await;
                return open_failed(ErrorCode::Unreachable.code(), Some(self.id), "no room");
            };
            if session.send(self.line).await.is_err() {
                session.close().await;
                return rpc_error(
                    StatusCode::OK,
                    ErrorCode::Unreachable,
                    Some(self.id),
                    "the mesh session ended",
                );
            }
            // Held until the answer says whether there is a session; what a server sends
            // before answering is bounded like the backlog.
            let mut lines = VecDeque::new();
            while let Some(line) = rx.recv().await {
                if lines.len() >= BACKLOG {
                    lines.pop_front();
                }
                lines.push_back(line);
            }
            let refused = match lines.back().and_then(|l| jsonrpc::peek_response(l)) {
                Some(answer) => match answer.outcome() {
                    jsonrpc::Outcome::Error(code) => Some(code),
                    _ => None,
                },
                None => {
                    session.close().await;
                    return rpc_error(
                        StatusCode::OK,
                        ErrorCode::Unreachable,
                        Some(self.id),
                        "the mesh session ended before the server answered",
                    );
                }
            };
            let Some(code) = refused else {
                armed.disarm();
                let sid = match new_session_id() {
                    Ok(sid) => sid,
                    Err(message) => {
                        session.close().await;
                        return open_failed(ErrorCode::Unreachable.code(), Some(self.id), &message);
                    }
                };
                place.fill(sid.clone(), session);
                return replay(lines, self.headers, Some(&sid));
            };
            session.close().await;
            let busy = code == ErrorCode::Busy.code();
            if busy && !gave_way {
                match gateway.take_longest_idle(peer, service) {
                    Some(idle) => {
                        tracing::info!(peer, service, "closing an idle session to make room");
                        idle.close().await;
                        let _ =
                            tokio::time::timeout(Duration::from_secs(5), idle.ended.cancelled())
                                .await;
                        gave_way = true;
                    }
                    None => return replay(lines, self.headers, None),
                }
            } else if !busy || attempts >= GIVE_WAY_RETRIES {
                return replay(lines, self.headers, None);
            } else {
                tokio::time::sleep(delay).await;
                delay *= 2;
            }
            attempts += 1;
        }
    }
}

/// A fresh, unguessable HTTP session id.
fn new_session_id() -> Result<String, String> {
    let mut raw = [0u8; 16];
    getrandom::fill(&mut raw).map_err(|e| e.to_string())?;
    Ok(data_encoding::HEXLOWER.encode(&raw))
}

/// Answers with messages already received, as [`respond`] would have as they came.
fn replay(lines: VecDeque<Bytes>, headers: &HeaderMap, session: Option<&str>) -> Response {
    let (tx, rx) = mpsc::channel(lines.len().max(1));
    for line in lines {
        let _ = tx.try_send(line);
    }
    respond(rx, headers, session)
}

/// Opens a mesh session to `peer/service` and starts routing the server's messages.
async fn new_session(
    gateway: &Arc<Gateway>,
    peer: &str,
    service: &str,
) -> Result<Arc<Session>, (i64, String)> {
    let stream = gateway.open(peer, service).await?;
    let (reader, writer) = stream.into_split();
    let session = Arc::new(Session {
        peer: peer.to_owned(),
        service: service.to_owned(),
        writer: Mutex::new(writer),
        routes: StdMutex::new(Routes::default()),
        closed: CancellationToken::new(),
        ended: CancellationToken::new(),
        last_active: StdMutex::new(Instant::now()),
    });
    tokio::spawn(session.clone().route(reader));
    Ok(session)
}

/// The answer to a request whose mesh session could not be opened.
fn open_failed(code: i64, id: Option<&RawValue>, message: &str) -> Response {
    let code = if code == ErrorCode::UnknownService.code() {
        ErrorCode::UnknownService
    } else {
        ErrorCode::Unreachable
    };
    rpc_error(StatusCode::OK, code, id, message)
}

async fn get(
    State(gateway): State<Arc<Gateway>>,
    Path((peer, service)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    let session = match gateway.session(&headers, &peer, &service) {
        Lookup::Found(s) => s,
        Lookup::Unknown => return unknown_session(),
        Lookup::NoHeader => {
            return plain(
                StatusCode::BAD_REQUEST,
                "an Mcp-Session-Id header is required",
            );
        }
    };
    let (tx, rx) = mpsc::channel(STREAM_QUEUE);
    {
        let mut routes = session.routes();
        if routes.get.as_ref().is_some_and(|g| !g.is_closed()) {
            return plain(
                StatusCode::CONFLICT,
                "this session already has a GET stream",
            );
        }
        // What arrived while no stream was open goes out first.
        while let Some(line) = routes.backlog.pop_front() {
            if tx.try_send(line.clone()).is_err() {
                routes.backlog.push_front(line);
                break;
            }
        }
        routes.get = Some(tx);
    }
    session.touch();
    sse(rx).into_response()
}

async fn delete(
    State(gateway): State<Arc<Gateway>>,
    Path((peer, service)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    match gateway.session(&headers, &peer, &service) {
        Lookup::Found(session) => {
            if let Some(id) = headers.get(SESSION_ID).and_then(|v| v.to_str().ok()) {
                gateway.sessions().map.remove(id);
            }
            session.close().await;
            StatusCode::OK.into_response()
        }
        Lookup::Unknown => unknown_session(),
        Lookup::NoHeader => plain(
            StatusCode::BAD_REQUEST,
            "an Mcp-Session-Id header is required",
        ),
    }
}
