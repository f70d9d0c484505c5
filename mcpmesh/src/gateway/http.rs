//! The gateway's HTTP handlers: POST (a request, a notification or an answer of the client's),
//! GET (the server's stream), DELETE (the session's end).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use mcpmesh_net::errors::ErrorCode;
use mcpmesh_net::jsonrpc::{self, Kind};
use mcpmesh_net::transport::MAX_FRAME;
use serde_json::value::RawValue;
use tokio::sync::mpsc;

use super::answer::{busy, open_failed, plain, replay, respond, rpc_error, sse, unknown_session};
use super::routes::{Refused, with_id_and_token};
use super::session::{Lookup, Session, new_session};
use super::{BACKLOG, DRAIN, GIVE_WAY_RETRIES, Gateway, Reservation, SESSION_ID, STREAM_QUEUE};

pub(super) async fn post(
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
pub(super) struct Posted {
    pub(super) line: Bytes,
    pub(super) kind: Kind,
    pub(super) id: Option<Box<RawValue>>,
    pub(super) token: Option<Box<RawValue>>,
    pub(super) initialize: bool,
    /// A 2026-07-28 request, which needs no session.
    pub(super) stateless: bool,
}

impl Posted {
    /// The message a POST's body holds; for a body that is not one message, the error it is
    /// answered with (400).
    pub(super) fn read(body: &[u8]) -> Result<Posted, (ErrorCode, &'static str)> {
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
    pub(super) fn sent<'a>(&'a self, id: &'a RawValue, headers: &'a HeaderMap) -> Sent<'a> {
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
pub(super) async fn read_body(
    headers: &HeaderMap,
    body: axum::body::Body,
) -> Result<Bytes, Response> {
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
pub(super) struct Sent<'a> {
    pub(super) line: &'a [u8],
    pub(super) id: &'a RawValue,
    pub(super) token: Option<&'a RawValue>,
    pub(super) headers: &'a HeaderMap,
}

impl Sent<'_> {
    /// Sends the request into an HTTP session and answers with the stream that will carry
    /// its answer; if the mesh session is gone, 404 with `-32055`.
    pub(super) async fn send_into(self, session: &Session, cap: usize) -> Response {
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
    pub(super) async fn remapped(self, session: &Session, cap: usize) -> Response {
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

    pub(super) async fn send(
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

    pub(super) fn refused(&self, refused: Refused) -> Response {
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
    pub(super) async fn initialize(
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
pub(super) fn new_session_id() -> Result<String, String> {
    let mut raw = [0u8; 16];
    getrandom::fill(&mut raw).map_err(|e| e.to_string())?;
    Ok(data_encoding::HEXLOWER.encode(&raw))
}

pub(super) async fn get(
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

pub(super) async fn delete(
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
