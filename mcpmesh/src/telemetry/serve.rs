//! The scrape endpoint: `GET /metrics` on a loopback listener, in OpenMetrics text.
//!
//! Exporters' convention: loopback and no token. A page from this machine's browser is no
//! reader, so a foreign `Host` (DNS rebinding) or `Origin` is refused, like the gateway's.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use tokio_util::sync::CancellationToken;

use super::{Metrics, PeerPath};
use crate::http_checks::foreign_host_or_origin;

/// What a scrape is served from: the metrics, and where the peers' paths are read from then.
struct Scrape {
    metrics: Arc<Metrics>,
    peers: Box<dyn Fn() -> Vec<PeerPath> + Send + Sync>,
    listen: SocketAddr,
}

/// The running endpoint.
#[derive(Debug)]
pub struct MetricsListener {
    /// The address it listens on (the port filled in when the config said 0).
    pub addr: SocketAddr,
}

/// Binds `listen` and serves scrapes until `stop`. `peers` is asked for the peers' paths at
/// each scrape. An address in use is an error here, before anything is spawned.
pub async fn serve(
    listen: SocketAddr,
    metrics: Arc<Metrics>,
    peers: impl Fn() -> Vec<PeerPath> + Send + Sync + 'static,
    stop: CancellationToken,
) -> std::io::Result<MetricsListener> {
    let listener = tokio::net::TcpListener::bind(listen).await?;
    let addr = listener.local_addr()?;
    let scrape = Arc::new(Scrape {
        metrics,
        peers: Box::new(peers),
        listen: addr,
    });
    let app = Router::new()
        .route("/metrics", axum::routing::get(page))
        .layer(axum::middleware::from_fn_with_state(scrape.clone(), guard))
        .with_state(scrape);
    tokio::spawn(crate::http_listener::serve(
        listener,
        app,
        crate::http_listener::Limits::local_page(),
        "metrics endpoint",
        stop,
    ));
    Ok(MetricsListener { addr })
}

async fn guard(
    State(scrape): State<Arc<Scrape>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    match foreign_host_or_origin(
        request.headers(),
        scrape.listen.ip().is_loopback(),
        &[],
        &[],
    ) {
        Some(refused) => refused,
        None => next.run(request).await,
    }
}

async fn page(State(scrape): State<Arc<Scrape>>) -> Response {
    scrape.metrics.set_peers(&(scrape.peers)());
    let page = scrape.metrics.render();
    (
        StatusCode::OK,
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        page,
    )
        .into_response()
}
