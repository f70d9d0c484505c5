//! How every HTTP listener of the node serves its connections: the gateway, the metrics
//! endpoint and the status page. Each is a local port anyone on the machine can open, so each
//! is bounded here, before a request reaches its router:
//!
//! - at most [`Limits::max_connections`] open connections; one more is closed at once, so a
//!   flood of connections cannot take the node's descriptors;
//! - the request head must arrive within [`Limits::header_read`] (hyper's own timer: a
//!   connection whose head never ends never reaches a tower layer). hyper runs the same timer
//!   while a kept-alive connection waits for its next request, so an idle connection closes
//!   after that long too;
//! - a request body must arrive whole within [`Limits::body_read`] of its head. A request
//!   without a body (the SSE `GET`s) is not timed: its response may stream for as long as the
//!   client stays, counted against the cap.
//!
//! A listener that serves TLS ([`serve_tls`]) holds each connection to the same cap, and its
//! handshake to the head's timeout: a connection that never completes one is closed then.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::header;
use futures_util::Stream;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::time::{Instant, Sleep};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::accept::AcceptBackoff;

/// The test-only knob that shortens the header and body read timeouts, in milliseconds (the
/// suites hold slow connections without waiting the real 10 and 30 s).
pub const TIMEOUT_MS_ENV: &str = "MCPMESH_TEST_HTTP_TIMEOUT_MS";

/// The bounds one listener serves with.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_connections: usize,
    pub header_read: Duration,
    pub body_read: Duration,
}

impl Limits {
    /// The gateway's: 512 connections (one per MCP client's stream, many clients per machine).
    pub fn gateway() -> Self {
        Limits::with_connections(512)
    }

    /// The metrics endpoint's and the status page's: 64 connections.
    pub fn local_page() -> Self {
        Limits::with_connections(64)
    }

    fn with_connections(max_connections: usize) -> Self {
        let test = std::env::var(TIMEOUT_MS_ENV)
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_millis);
        Limits {
            max_connections,
            header_read: test.unwrap_or(Duration::from_secs(10)),
            body_read: test.unwrap_or(Duration::from_secs(30)),
        }
    }
}

/// Serves `app` on `listener` within `limits` until `stop`, then lets the open connections
/// finish (each is told to close after its current request) and returns.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    what: &'static str,
    stop: CancellationToken,
) {
    serve_tls(listener, app, limits, None, what, stop).await;
}

/// A connection's bytes, in the clear or through TLS.
trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}

impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Io for T {}

/// As [`serve`], each connection through TLS when `tls` is given.
pub async fn serve_tls(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    tls: Option<tokio_rustls::TlsAcceptor>,
    what: &'static str,
    stop: CancellationToken,
) {
    let body_read = limits.body_read;
    let app = app.layer(axum::middleware::from_fn(
        move |request: Request, next: axum::middleware::Next| async move {
            next.run(with_body_deadline(request, body_read)).await
        },
    ));
    let service = TowerToHyperService::new(app);
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_read)
        .keep_alive(true);
    let open = Arc::new(Semaphore::new(limits.max_connections));
    let connections = TaskTracker::new();
    let mut backoff = AcceptBackoff::new(what);
    loop {
        let stream = tokio::select! {
            _ = stop.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    backoff.succeeded();
                    stream
                }
                Err(e) => {
                    let wait = backoff.failed(&e);
                    tokio::select! {
                        _ = stop.cancelled() => break,
                        _ = tokio::time::sleep(wait) => continue,
                    }
                }
            },
        };
        // Beyond the cap the connection is dropped here, closed before a byte is read.
        let Ok(permit) = open.clone().try_acquire_owned() else {
            continue;
        };
        let (http, service, stop, tls) = (http.clone(), service.clone(), stop.clone(), tls.clone());
        let handshake = limits.header_read;
        connections.spawn(async move {
            let _permit = permit;
            let io: Box<dyn Io> = match tls {
                None => Box::new(stream),
                Some(tls) => match tokio::time::timeout(handshake, tls.accept(stream)).await {
                    Ok(Ok(stream)) => Box::new(stream),
                    Ok(Err(e)) => {
                        tracing::debug!("{what}: a TLS handshake failed: {e}");
                        return;
                    }
                    Err(_) => return,
                },
            };
            let connection = http.serve_connection(TokioIo::new(io), service);
            tokio::pin!(connection);
            tokio::select! {
                _ = &mut connection => {}
                _ = stop.cancelled() => {
                    connection.as_mut().graceful_shutdown();
                    let _ = connection.await;
                }
            }
        });
    }
    connections.close();
    connections.wait().await;
}

/// The request with its body (when it has one) ending in an error once `limit` has passed.
fn with_body_deadline(request: Request, limit: Duration) -> Request {
    let has_body = request.headers().contains_key(header::TRANSFER_ENCODING)
        || request
            .headers()
            .get(header::CONTENT_LENGTH)
            .is_some_and(|v| v.as_bytes() != b"0");
    if !has_body {
        return request;
    }
    request.map(|body| {
        Body::from_stream(DeadlineBody {
            inner: body.into_data_stream(),
            deadline: Box::pin(tokio::time::sleep_until(Instant::now() + limit)),
            done: false,
        })
    })
}

/// A request body that fails once its deadline passes.
struct DeadlineBody<S> {
    inner: S,
    deadline: Pin<Box<Sleep>>,
    done: bool,
}

#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive in time")]
pub struct BodyTimedOut;

impl<S> Stream for DeadlineBody<S>
where
    S: Stream<Item = Result<Bytes, axum::Error>> + Unpin,
{
    type Item = Result<Bytes, axum::Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.done {
            return Poll::Ready(None);
        }
        if let Poll::Ready(item) = Pin::new(&mut self.inner).poll_next(cx) {
            return Poll::Ready(item);
        }
        if self.deadline.as_mut().poll(cx).is_ready() {
            self.done = true;
            return Poll::Ready(Some(Err(axum::Error::new(BodyTimedOut))));
        }
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    async fn served(limits: Limits) -> (std::net::SocketAddr, CancellationToken) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = Router::new().route(
            "/",
            axum::routing::get(|| async { "ok" })
                .post(|body: Bytes| async move { format!("{} bytes", body.len()) }),
        );
        let stop = CancellationToken::new();
        tokio::spawn(serve(listener, app, limits, "test listener", stop.clone()));
        (addr, stop)
    }

    async fn get(addr: std::net::SocketAddr) -> String {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut answer = String::new();
        s.read_to_string(&mut answer).await.unwrap();
        answer
    }

    /// Reads until the server closes; `Err` when it had not closed by `within`.
    async fn closed_within(mut s: TcpStream, within: Duration) -> Result<(), ()> {
        let mut sink = Vec::new();
        match tokio::time::timeout(within, s.read_to_end(&mut sink)).await {
            Ok(_) => Ok(()),
            Err(_) => Err(()),
        }
    }

    #[tokio::test]
    async fn hundreds_of_slow_connections_do_not_stop_a_normal_request_and_are_dropped_in_time() {
        let limits = Limits {
            max_connections: 512,
            header_read: Duration::from_millis(1500),
            body_read: Duration::from_millis(1500),
        };
        let (addr, _stop) = served(limits).await;
        let mut slow = Vec::new();
        for n in 0..400 {
            let mut s = TcpStream::connect(addr).await.unwrap();
            if n % 2 == 0 {
                s.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n").await.unwrap();
            } else {
                s.write_all(b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 1000\r\n\r\nx")
                    .await
                    .unwrap();
            }
            slow.push(s);
        }
        let started = std::time::Instant::now();
        let answer = get(addr).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(answer.ends_with("ok"), "{answer}");
        let results = futures_util::future::join_all(
            slow.into_iter()
                .map(|s| closed_within(s, Duration::from_secs(10))),
        )
        .await;
        let held = results.iter().filter(|r| r.is_err()).count();
        assert_eq!(held, 0, "{held} of 400 slow connections still open");
        eprintln!(
            "400 slow connections held, all dropped {:?} after the normal request",
            started.elapsed()
        );
    }

    #[tokio::test]
    async fn a_connection_beyond_the_cap_is_closed_at_once() {
        let limits = Limits {
            max_connections: 8,
            header_read: Duration::from_secs(60),
            body_read: Duration::from_secs(60),
        };
        let (addr, _stop) = served(limits).await;
        let mut held = Vec::new();
        for _ in 0..8 {
            let mut s = TcpStream::connect(addr).await.unwrap();
            s.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
            held.push(s);
        }
        let extra = TcpStream::connect(addr).await.unwrap();
        assert!(
            closed_within(extra, Duration::from_secs(5)).await.is_ok(),
            "the ninth connection was kept"
        );
        drop(held);
    }
}
