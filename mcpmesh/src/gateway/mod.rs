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
//!
//! The rooms: this module (the listener, the sessions held, opening mesh sessions, the
//! sessionless sharing), `http` (the POST, GET and DELETE handlers), `session` (one HTTP
//! session and where its server's messages go), `routes` (which stream answers which request),
//! `answer` (the HTTP answers and the errors the gateway makes itself), `guard`, `tls`, `token`.

mod answer;
pub(crate) mod guard;
mod http;
mod routes;
mod session;
pub mod tls;
pub mod token;

pub use tls::{GatewayTls, TlsFiles};
pub use token::{TokenChoice, check_bind, resolve_token};

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::Response;
use mcpmesh_net::errors::ErrorCode;
use tokio::net::UnixStream;
use tokio_util::sync::CancellationToken;

use crate::control::Attach;
use crate::control::client::ControlClient;
use crate::paths::Profile;

use http::{delete, get, post};
use session::{Lookup, Session, new_session};

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
