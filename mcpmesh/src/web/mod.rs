//! The status page: what `mcpmesh status` says, as a page on loopback that updates itself.
//!
//! One HTML file, a small script and a style sheet, embedded in the binary (no build step, no
//! CDN); `/api/status` answers the node's state as JSON and `/api/events` pushes it again, as
//! server-sent events, whenever the audit log records something (a session opening or ending,
//! a request, a refusal, a trust change) and every few seconds for round-trip times.
//!
//! The page shows who this node serves and trusts, so it needs a token (its own, apart from
//! the gateway's: it only lets one look). A browser cannot put a header on an `EventSource`,
//! so the URL `status --web` prints carries the token once, as `?token=`; the page answers it
//! with an `HttpOnly`, `SameSite=Strict` cookie and a redirect to the clean URL (see
//! [`guard`]). `Host` and `Origin` are checked as the gateway checks them.

mod feed;
mod guard;

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use futures_util::stream::{self, Stream};
use serde_json::Value;
use tokio::sync::{Semaphore, watch};
use tokio_util::sync::CancellationToken;

use crate::audit::AuditSink;
use feed::Feed;

/// Pages open at once on `/api/events`; past it a new one is answered 503.
const MAX_VIEWERS: usize = 16;

const INDEX: &str = include_str!("assets/index.html");
const SCRIPT: &str = include_str!("assets/app.js");
const STYLE: &str = include_str!("assets/style.css");
const ICON: &str = include_str!("assets/favicon.svg");

/// No script but the page's own, no inline script or style, nothing loaded from elsewhere,
/// and no framing.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
                   connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// Where the page gets the node's state from. Implemented by the daemon.
pub trait StatusSource: Send + Sync + 'static {
    /// What `status` answers, and the org's members when there is an org.
    fn snapshot(&self) -> impl Future<Output = Value> + Send;
}

#[derive(Debug, thiserror::Error)]
pub enum WebError {
    #[error("cannot listen for the status page on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// A running status page; it stops when the `stop` it was started with fires.
#[derive(Debug)]
pub struct StatusPage {
    addr: SocketAddr,
    token: String,
}

impl StatusPage {
    /// Listens on `listen` (loopback) and serves the page until `stop`. `audit_dir` is read
    /// once, for the records the page shows first; `audit` brings the ones after.
    pub async fn start<S: StatusSource>(
        listen: SocketAddr,
        token: String,
        source: Arc<S>,
        audit: &AuditSink,
        audit_dir: PathBuf,
        stop: CancellationToken,
    ) -> Result<StatusPage, WebError> {
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .map_err(|source| WebError::Listen {
                addr: listen,
                source,
            })?;
        let addr = listener.local_addr().map_err(|source| WebError::Listen {
            addr: listen,
            source,
        })?;
        let feed = Feed::start(source, audit, audit_dir, stop.clone());
        let page = Arc::new(Page {
            feed,
            viewers: Arc::new(Semaphore::new(MAX_VIEWERS)),
            stop: stop.clone(),
        });
        let checked = Arc::new(guard::PageToken::new(token.clone(), addr.port()));
        let app = Router::new()
            .route("/", get(index))
            .route("/app.js", get(script))
            .route("/style.css", get(style))
            .route("/favicon.svg", get(icon))
            .route("/api/status", get(snapshot))
            .route("/api/events", get(events))
            .with_state(page)
            .layer(axum::middleware::from_fn_with_state(checked, guard::guard))
            .layer(axum::middleware::map_response(harden));
        tokio::spawn(crate::http_listener::serve(
            listener,
            app,
            crate::http_listener::Limits::local_page(),
            "status page",
            stop,
        ));
        tracing::info!(%addr, "status page listening");
        Ok(StatusPage { addr, token })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The URL to open: the page, with its token, which the page trades for a cookie.
    pub fn url(&self) -> String {
        format!("http://{}/?token={}", self.addr, self.token)
    }
}

struct Page {
    feed: Feed,
    viewers: Arc<Semaphore>,
    /// Ends the open feeds when the node stops (the server's graceful stop waits for them).
    stop: CancellationToken,
}

async fn index() -> Response {
    asset("text/html; charset=utf-8", INDEX)
}

async fn script() -> Response {
    asset("text/javascript; charset=utf-8", SCRIPT)
}

async fn style() -> Response {
    asset("text/css; charset=utf-8", STYLE)
}

async fn icon() -> Response {
    asset("image/svg+xml", ICON)
}

fn asset(kind: &'static str, body: &'static str) -> Response {
    ([(header::CONTENT_TYPE, kind)], body).into_response()
}

async fn snapshot(State(page): State<Arc<Page>>) -> Response {
    let body = page.feed.snapshot().await;
    (
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

/// The state now, then again whenever it changes. A page that reads slowly only ever has the
/// newest state waiting for it (a `watch` channel), never a backlog.
async fn events(State(page): State<Arc<Page>>) -> Response {
    let Ok(permit) = page.viewers.clone().try_acquire_owned() else {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::CONTENT_TYPE, "text/plain")],
            "too many status pages are open; close one and reload",
        )
            .into_response();
    };
    let changes = page.feed.subscribe();
    let first = page.feed.snapshot().await.to_string();
    Sse::new(pushes(first, changes, permit, page.stop.clone()))
        .keep_alive(KeepAlive::default())
        .into_response()
}

/// One page's feed; the permit it holds is its place among [`MAX_VIEWERS`].
struct Viewer {
    changes: watch::Receiver<Arc<str>>,
    _permit: tokio::sync::OwnedSemaphorePermit,
    stop: CancellationToken,
}

fn pushes(
    first: String,
    changes: watch::Receiver<Arc<str>>,
    permit: tokio::sync::OwnedSemaphorePermit,
    stop: CancellationToken,
) -> impl Stream<Item = Result<Event, Infallible>> {
    let viewer = Viewer {
        changes,
        _permit: permit,
        stop,
    };
    stream::unfold((Some(first), viewer), |(first, mut viewer)| async move {
        if let Some(first) = first {
            return Some((Ok(Event::default().data(first)), (None, viewer)));
        }
        tokio::select! {
            _ = viewer.stop.cancelled() => return None,
            changed = viewer.changes.changed() => changed.ok()?,
        }
        let next = viewer.changes.borrow_and_update().to_string();
        Some((Ok(Event::default().data(next)), (None, viewer)))
    })
}

/// Headers every answer carries, refusals too.
async fn harden(mut response: Response) -> Response {
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    // The first URL carries the token: it must never be sent on as a referrer.
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}
