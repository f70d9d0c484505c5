//! The gateway's HTTP answers: a JSON body or an SSE stream, and the errors it answers itself.

use std::collections::VecDeque;
use std::convert::Infallible;

use axum::body::Bytes;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream::{self, Stream};
use mcpmesh_net::errors::{ErrorCode, ErrorFrame};
use serde_json::value::RawValue;
use tokio::sync::mpsc;

use super::SESSION_ID;

/// `-32053` as an HTTP 503 with `Retry-After`: the gateway holds as much as it may.
pub(super) fn busy(id: Option<&RawValue>, message: &str) -> Response {
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

pub(super) fn plain(status: StatusCode, message: &str) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain")],
        message.to_owned(),
    )
        .into_response()
}

/// 404 for a session id that names no session (never issued, ended, or closed when idle).
pub(super) fn unknown_session() -> Response {
    rpc_error(
        StatusCode::NOT_FOUND,
        ErrorCode::UnknownSession,
        None,
        "unknown or ended session: initialize a new one",
    )
}

/// A JSON-RPC error as an HTTP response (`id` null unless given).
pub(super) fn rpc_error(
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
pub(super) fn respond(
    rx: mpsc::Receiver<Bytes>,
    headers: &HeaderMap,
    session: Option<&str>,
) -> Response {
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

pub(super) fn sse(rx: mpsc::Receiver<Bytes>) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let events = stream::unfold(rx, |mut rx| async move {
        let line = rx.recv().await?;
        let data = String::from_utf8_lossy(&line).into_owned();
        Some((Ok(Event::default().event("message").data(data)), rx))
    });
    Sse::new(events).keep_alive(KeepAlive::default())
}

/// For a client that accepts only JSON: the last message (the answer) as the body.
pub(super) fn json_answer(rx: mpsc::Receiver<Bytes>) -> Response {
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

/// Answers with messages already received, as [`respond`] would have as they came.
pub(super) fn replay(
    lines: VecDeque<Bytes>,
    headers: &HeaderMap,
    session: Option<&str>,
) -> Response {
    let (tx, rx) = mpsc::channel(lines.len().max(1));
    for line in lines {
        let _ = tx.try_send(line);
    }
    respond(rx, headers, session)
}

/// The answer to a request whose mesh session could not be opened.
pub(super) fn open_failed(code: i64, id: Option<&RawValue>, message: &str) -> Response {
    let code = if code == ErrorCode::UnknownService.code() {
        ErrorCode::UnknownService
    } else {
        ErrorCode::Unreachable
    };
    rpc_error(StatusCode::OK, code, id, message)
}
