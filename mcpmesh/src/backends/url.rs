//! The `url` backend: a Streamable HTTP MCP server (local or remote), one upstream HTTP
//! session per mesh session, the node its HTTP client.
//!
//! Inside the node the upstream looks like any other server: the session core writes the
//! caller's lines (identity already written into `_meta`, as for `socket`) into one end of an
//! in-memory pipe and reads the server's lines from it. The bridge on the other end POSTs each
//! line, turns JSON and SSE responses back into lines, keeps `Mcp-Session-Id` and
//! `MCP-Protocol-Version`, listens on the GET stream when the server offers one, and DELETEs
//! the upstream session when the mesh session ends. Upstream failures become errors of the
//! mesh's band for the request that met them. Bodies are bounded by the frame cap.
//!
//! Nothing here is unbounded: a session POSTs at most `max_in_flight` requests and as many
//! other messages at once (the next line waits, which slows the caller), an upstream silent
//! on a POST for the service's request timeout is given up on (`-32055`), and when the session
//! ends every POST still open is dropped with it.
//!
//! 2026-07-28 requests (protocol version in `_meta`) also carry `Mcp-Method` and `Mcp-Name`.
//!
//! Every HTTP request of a session carries the signed caller assertion (unless the service
//! turned it off), minted when first needed and again at half its lifetime.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex as StdMutex, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use mcpmesh_net::PeerIdentity;
use mcpmesh_net::errors::{ErrorCode, ErrorFrame};
use mcpmesh_net::jsonrpc::{self, Kind};
use mcpmesh_net::transport::{FrameReader, MAX_FRAME, NdjsonTransport};
use reqwest::header::{ACCEPT, CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use serde::Deserialize;
use serde_json::value::RawValue;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, DuplexStream, WriteHalf};
use tokio::sync::{Mutex, Semaphore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::assertion::{Issuer, SessionAssertion};
use crate::backends::BackendError;
use crate::backends::session::{ServiceCtx, SessionOptions, held_of};
use crate::backends::sse::SseParser;
use crate::backends::stamp::PeerStamp;
use crate::oauth::{Grant, GrantBook, NeedsGrant};

const SESSION_ID: &str = "mcp-session-id";
const PROTOCOL_VERSION: &str = "mcp-protocol-version";
const LAST_EVENT_ID: &str = "last-event-id";
/// How long connecting to the upstream may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a pooled connection to an upstream may sit idle before it is dropped.
const POOL_IDLE: Duration = Duration::from_secs(4);
/// How long the DELETE that ends an upstream session may take.
const DELETE_TIMEOUT: Duration = Duration::from_secs(2);
/// Consecutive GET-stream reconnects without an event before the node stops listening.
const MAX_GET_RETRIES: u32 = 3;
/// The in-memory pipe between the session core and the bridge.
const PIPE: usize = 256 * 1024;

/// A service whose sessions are upstream Streamable HTTP sessions.
#[derive(Debug, Clone)]
pub struct UrlBackend {
    pub url: reqwest::Url,
    /// Header templates: `${VAR}` is replaced by the node's environment variable VAR when a
    /// session starts. Values are secrets (tokens): never logged.
    pub headers: BTreeMap<String, String>,
    pub ctx: ServiceCtx,
    /// How long the upstream may stay silent on one POST (before its response starts, or
    /// between two parts of it) before the request is answered `-32055`.
    pub timeout: Duration,
    /// The signed caller assertion every request carries; `None`: turned off.
    pub caller: Option<CallerAssertion>,
    /// Where the service's OAuth grant is kept; `None`: the node keeps none.
    pub grants: Option<Arc<GrantBook>>,
    /// The service requires a grant (`[services.NAME.oauth]`): without one, requests are
    /// answered `-32056` and never sent.
    pub oauth_required: bool,
    /// The service URL as configured (what its grant was made for).
    pub configured: String,
}

/// How a service's sessions assert their caller.
#[derive(Debug, Clone)]
pub struct CallerAssertion {
    pub header: HeaderName,
    pub issuer: Arc<Issuer>,
    /// The service URL as configured: the assertion's audience.
    pub audience: String,
}

impl UrlBackend {
    pub async fn run_session<R, W>(
        &self,
        identity: PeerIdentity,
        mut transport: NdjsonTransport<R, W>,
        options: &SessionOptions,
    ) -> Result<(), BackendError>
    where
        R: AsyncRead + Unpin + Send,
        W: AsyncWrite + Unpin + Send,
    {
        let Some((who, _permit)) = self.ctx.admit(&identity, options, &mut transport).await else {
            return Ok(());
        };
        let host = self.ctx.host();
        let prepared = client().and_then(|c| Ok((c, expand_headers(&self.headers)?)));
        let (client, headers) = match prepared {
            Ok(ready) => ready,
            Err(message) => {
                let e = BackendError::Upstream {
                    url: self.url.to_string(),
                    message,
                };
                return self.ctx.unreachable(&who, None, &mut transport, e).await;
            }
        };
        let asserting = self.caller.clone().map(|caller| Asserting {
            header: caller.header,
            session: SessionAssertion::new(
                caller.issuer,
                caller.audience,
                self.ctx.service.clone(),
                identity.endpoint,
                held_of(&identity, options),
            ),
        });
        let (core, bridge) = tokio::io::duplex(PIPE);
        let (core_r, core_w) = tokio::io::split(core);
        let (bridge_r, bridge_w) = tokio::io::split(bridge);
        let upstream = Arc::new(Upstream {
            client,
            url: self.url.clone(),
            headers,
            session: StdMutex::new(None),
            protocol: StdMutex::new(None),
            out: Mutex::new(bridge_w),
            closing: CancellationToken::new(),
            service: self.ctx.service.clone(),
            timeout: self.timeout,
            requests: Arc::new(Semaphore::new(options.max_in_flight.max(1))),
            others: Arc::new(Semaphore::new(options.max_in_flight.max(1))),
            asserting,
            oauth: self.grants.clone().map(|book| OAuthUse {
                book,
                url: self.configured.clone(),
                required: self.oauth_required,
                grant: Mutex::new(None),
                header: StdMutex::new(None),
                consulted: std::sync::atomic::AtomicBool::new(false),
            }),
        });
        let bridge = tokio::spawn(upstream.clone().run(bridge_r));
        let teardown = |_patience| async move {
            upstream.closing.cancel();
            // The bridge owns every open POST: they end with it.
            bridge.abort();
            upstream.delete().await;
        };
        host.pump(
            who,
            None,
            transport,
            core_r,
            core_w,
            options,
            Some(PeerStamp::new(&identity)),
            teardown,
        )
        .await;
        Ok(())
    }
}

/// One process-wide HTTP client: connections to an upstream are pooled across sessions.
pub(crate) fn client() -> Result<reqwest::Client, String> {
    static CLIENT: OnceLock<Result<reqwest::Client, String>> = OnceLock::new();
    CLIENT
        .get_or_init(|| {
            // iroh already brings rustls with ring; the HTTP client uses the same provider.
            let _ = rustls::crypto::ring::default_provider().install_default();
            reqwest::Client::builder()
                .connect_timeout(CONNECT_TIMEOUT)
                // Below the 5 s keep-alive of Node's and uvicorn's servers, so an idle pooled
                // connection is dropped here before the server drops it.
                .pool_idle_timeout(POOL_IDLE)
                .user_agent(concat!("mcpmesh/", env!("CARGO_PKG_VERSION")))
                .build()
                .map_err(|e| format!("cannot build the HTTP client: {e}"))
        })
        .clone()
}

/// Whether a request failed because its connection closed before any answer came (hyper's
/// incomplete message): a kept-alive connection the server closed as the request went out.
fn closed_unanswered(e: &reqwest::Error) -> bool {
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        if let Some(hyper) = cause.downcast_ref::<hyper::Error>() {
            return hyper.is_incomplete_message();
        }
        source = cause.source();
    }
    false
}

/// The configured headers with `${VAR}` references filled in from the environment.
pub fn expand_headers(templates: &BTreeMap<String, String>) -> Result<HeaderMap, String> {
    let mut map = HeaderMap::new();
    for (name, template) in templates {
        let header = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| format!("{name:?} is not a header name"))?;
        let value = crate::template::expand(template, |var| std::env::var(var).ok())
            .map_err(|e| format!("header {name}: {e}"))?;
        let mut value = HeaderValue::from_str(&value)
            .map_err(|_| format!("header {name}: the value is not a valid header value"))?;
        value.set_sensitive(true);
        map.insert(header, value);
    }
    Ok(map)
}

/// What the bridge needs to know about a line before POSTing it.
struct Frame {
    line: Bytes,
    kind: Option<Kind>,
    id: Option<Box<RawValue>>,
    method: Option<String>,
    name: Option<String>,
    /// The protocol version a 2026-07-28 request names in its `_meta`.
    modern: Option<String>,
}

impl Frame {
    fn of(line: Bytes) -> Frame {
        let (kind, id, method, name, modern) = match jsonrpc::peek(&line) {
            Some(p) => (
                Some(p.kind()),
                p.id.map(ToOwned::to_owned),
                p.method.as_deref().map(str::to_owned),
                p.params.and_then(jsonrpc::subject_name),
                jsonrpc::meta(p.params).protocol_version,
            ),
            None => (None, None, None, None, None),
        };
        Frame {
            line,
            kind,
            id,
            method,
            name,
            modern,
        }
    }

    fn is_request(&self) -> bool {
        self.kind == Some(Kind::Request)
    }
}

/// One upstream session: the state its POSTs, its GET stream and its DELETE share.
struct Upstream {
    client: reqwest::Client,
    url: reqwest::Url,
    headers: HeaderMap,
    session: StdMutex<Option<HeaderValue>>,
    protocol: StdMutex<Option<HeaderValue>>,
    /// Lines toward the session core (the MCP client), whole lines under the lock.
    out: Mutex<WriteHalf<DuplexStream>>,
    closing: CancellationToken,
    service: String,
    timeout: Duration,
    /// POSTs of requests open at once (the ledger refuses requests past `max_in_flight`).
    requests: Arc<Semaphore>,
    /// POSTs of everything else (notifications, answers to the server) open at once.
    others: Arc<Semaphore>,
    asserting: Option<Asserting>,
    oauth: Option<OAuthUse>,
}

/// A session's use of its service's OAuth grant.
struct OAuthUse {
    book: Arc<GrantBook>,
    url: String,
    required: bool,
    /// The grant this session sends, once it has one.
    grant: Mutex<Option<Grant>>,
    /// Its `Authorization` header, which every request of the session carries (POSTs, the
    /// GET stream, the DELETE).
    header: StdMutex<Option<HeaderValue>>,
    /// Whether the book was asked yet: a service that needs no grant costs nothing more
    /// than that one look.
    consulted: std::sync::atomic::AtomicBool,
}

/// One session's caller assertion and the header it goes in.
struct Asserting {
    header: HeaderName,
    session: SessionAssertion,
}

impl Asserting {
    fn value(&self) -> Option<HeaderValue> {
        // A JWS is base64url and dots: always a valid header value.
        let mut value = HeaderValue::from_str(&self.session.token()?).ok()?;
        value.set_sensitive(true);
        Some(value)
    }
}

impl OAuthUse {
    /// Makes `grant` the one this session sends; returns its access token.
    fn take(&self, held: &mut Option<Grant>, grant: Grant) -> String {
        let token = grant.access_token.clone();
        if let Ok(mut value) = HeaderValue::from_str(&format!("Bearer {token}")) {
            value.set_sensitive(true);
            Upstream::set(&self.header, value);
        }
        *held = Some(grant);
        token
    }
}

impl Upstream {
    /// Reads the client's lines and POSTs each; an `initialize` is completed before anything
    /// after it is sent, since its answer carries the session id the rest need.
    async fn run(self: Arc<Self>, reader: tokio::io::ReadHalf<DuplexStream>) {
        // The session core already held each line to the frame cap; the identity it wrote in
        // may add a little, which must not end the session here.
        let mut reader = FrameReader::new(reader, MAX_FRAME + 64 * 1024);
        // Dropped with this task (the session's teardown aborts it): every open POST, and the
        // GET stream, end with it.
        let mut posts = JoinSet::new();
        let mut stream = JoinSet::new();
        while let Ok(Some(line)) = reader.next_line().await {
            while posts.try_join_next().is_some() {}
            let frame = Frame::of(line);
            if frame.method.as_deref() == Some("initialize") {
                self.clone().post(frame).await;
                stream.spawn(self.clone().listen());
                continue;
            }
            let pool = if frame.is_request() {
                &self.requests
            } else {
                &self.others
            };
            // Waiting here stops reading the caller's lines: backpressure, not a queue.
            let Ok(permit) = pool.clone().acquire_owned().await else {
                break;
            };
            let upstream = self.clone();
            posts.spawn(async move {
                upstream.post(frame).await;
                drop(permit);
            });
        }
        while posts.join_next().await.is_some() {}
        // The client is done: its side of the pipe ends once every answer is written.
        let _ = self.out.lock().await.shutdown().await;
    }

    fn get(slot: &StdMutex<Option<HeaderValue>>) -> Option<HeaderValue> {
        slot.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn set(slot: &StdMutex<Option<HeaderValue>>, value: HeaderValue) {
        *slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(value);
    }

    /// The headers every request to this upstream session carries.
    fn session_headers(&self, builder: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        let mut builder = builder.headers(self.headers.clone());
        if let Some(asserting) = &self.asserting
            && let Some(value) = asserting.value()
        {
            builder = builder.header(asserting.header.clone(), value);
        }
        if let Some(id) = Self::get(&self.session) {
            builder = builder.header(SESSION_ID, id);
        }
        if let Some(bearer) = self.oauth.as_ref().and_then(|o| Self::get(&o.header)) {
            builder = builder.header(reqwest::header::AUTHORIZATION, bearer);
        }
        if let Some(v) = Self::get(&self.protocol) {
            builder = builder.header(PROTOCOL_VERSION, v);
        }
        builder
    }

    async fn post(self: Arc<Self>, frame: Frame) {
        let bearer = match self.bearer().await {
            Ok(bearer) => bearer,
            Err(needs) => return self.needs_grant(&frame, &needs).await,
        };
        let Some(mut response) = self.send(&frame).await else {
            return;
        };
        if response.status() == reqwest::StatusCode::UNAUTHORIZED
            && let Some(oauth) = &self.oauth
            && (bearer.is_some() || oauth.required || asks_for_oauth(&response))
        {
            // The token lapsed or was revoked, or the server wants a grant: a refreshed (or
            // newly made) one goes once; without one the caller learns what its owner runs.
            match oauth
                .book
                .refused(
                    &self.service,
                    &oauth.url,
                    bearer.as_deref().unwrap_or_default(),
                )
                .await
            {
                Ok(grant) => {
                    oauth.take(&mut *oauth.grant.lock().await, grant);
                    let Some(again) = self.send(&frame).await else {
                        return;
                    };
                    response = again;
                }
                Err(needs) => return self.needs_grant(&frame, &needs).await,
            }
        }
        if response.status() == reqwest::StatusCode::FORBIDDEN
            && let Some(oauth) = &self.oauth
            && let Some(wanted) = insufficient_scope(&response)
        {
            // Only the owner can grant more (a browser and a person): the grant is marked, and
            // the caller told what to run.
            oauth.book.needs_scope(&self.service, wanted).await;
            // The next request reads the grant again: the one `mcpmesh auth` makes next.
            *oauth.grant.lock().await = None;
            oauth
                .consulted
                .store(false, std::sync::atomic::Ordering::Relaxed);
            let needs = NeedsGrant {
                service: self.service.clone(),
                why: "the server asks for more scope than the service's OAuth grant holds",
            };
            return self.needs_grant(&frame, &needs).await;
        }
        self.answered(frame, response).await;
    }

    /// The access token to send: the session's, refreshed when it lapses; on the first
    /// request, the service's grant if it has one. `Err` when the service requires a grant
    /// and there is none.
    async fn bearer(&self) -> Result<Option<String>, NeedsGrant> {
        let Some(oauth) = &self.oauth else {
            return Ok(None);
        };
        let mut held = oauth.grant.lock().await;
        if let Some(grant) = held.as_ref()
            && !grant.lapses_within(crate::oauth::REFRESH_AHEAD)
        {
            return Ok(Some(grant.access_token.clone()));
        }
        let first = !oauth
            .consulted
            .swap(true, std::sync::atomic::Ordering::Relaxed);
        if held.is_none() && !first && !oauth.required {
            return Ok(None);
        }
        match oauth.book.current(&self.service, &oauth.url).await {
            Ok(grant) => Ok(Some(oauth.take(&mut held, grant))),
            Err(needs) if oauth.required || held.is_some() => Err(needs),
            Err(_) => Ok(None),
        }
    }

    /// Answers `frame` `-32056`: the service needs a grant its node does not have.
    async fn needs_grant(&self, frame: &Frame, needs: &NeedsGrant) {
        if !frame.is_request() {
            return;
        }
        let error = ErrorFrame::new(ErrorCode::NeedsGrant)
            .id(frame.id.as_deref())
            .message(format!(
                "{}: its owner runs `{}` on the serving node",
                needs.why,
                needs.command()
            ))
            .grant_needed(&needs.service, &needs.command());
        let _ = self.out.lock().await.write_all(&error.to_line()).await;
    }

    /// POSTs `frame`; `None` when it failed and was answered.
    async fn send(&self, frame: &Frame) -> Option<reqwest::Response> {
        let mut req = self
            .session_headers(self.client.post(self.url.clone()))
            .header(CONTENT_TYPE, "application/json")
            .header(ACCEPT, "application/json, text/event-stream");
        if let Some(version) = &frame.modern {
            // 2026-07-28: the version is per request, and the method (and the tool, prompt
            // or resource it is about) ride in headers too, for routing without parsing.
            if let Ok(v) = HeaderValue::from_str(version) {
                req = req.header(PROTOCOL_VERSION, v);
            }
            if let Some(Ok(m)) = frame.method.as_deref().map(header_text) {
                req = req.header("mcp-method", m);
            }
            if let Some(Ok(n)) = frame.name.as_deref().map(header_text) {
                req = req.header("mcp-name", n);
            }
        }
        // A server may close a kept-alive connection just as a request goes out on it: the
        // request then fails with nothing answered (the server never read it), and goes once
        // more, on a new connection.
        let retry = req.try_clone();
        let mut sent =
            tokio::time::timeout(self.timeout, req.body(frame.line.clone()).send()).await;
        if let (Ok(Err(e)), Some(retry)) = (&sent, retry)
            && closed_unanswered(e)
        {
            tracing::debug!(service = %self.service, "POST on a closing connection, sent again: {e}");
            sent = tokio::time::timeout(self.timeout, retry.body(frame.line.clone()).send()).await;
        }
        match sent {
            Err(_) => {
                self.timed_out(frame).await;
                None
            }
            Ok(Ok(r)) => Some(r),
            Ok(Err(e)) => {
                let why = if e.is_connect() || e.is_timeout() {
                    "the upstream server is unreachable"
                } else {
                    "the upstream connection failed"
                };
                tracing::debug!(service = %self.service, "POST failed: {e}");
                self.fail(frame, ErrorCode::Unreachable, why, None).await;
                None
            }
        }
    }

    /// Relays the server's response to `frame`.
    async fn answered(&self, frame: Frame, response: reqwest::Response) {
        if frame.method.as_deref() == Some("initialize")
            && let Some(id) = response.headers().get(SESSION_ID)
            && id.to_str().is_ok_and(|s| !s.is_empty())
        {
            Self::set(&self.session, id.clone());
        }
        let status = response.status();
        if !status.is_success() {
            return self.http_error(&frame, response).await;
        }
        let relayed = match content_type(&response).as_str() {
            "text/event-stream" => {
                self.relay_events(response, frame.id.as_deref(), None, Some(self.timeout))
                    .await
            }
            _ => self.relay_json(response, &frame).await,
        };
        let answered = match relayed {
            Ok(answered) => answered,
            Err(Silent) => return self.timed_out(&frame).await,
        };
        if frame.is_request() && !answered {
            self.fail(
                &frame,
                ErrorCode::Unreachable,
                "the upstream server ended its response without an answer",
                None,
            )
            .await;
        }
    }

    /// Answers `frame` (when it is a request) for an upstream that stayed silent too long.
    async fn timed_out(&self, frame: &Frame) {
        tracing::debug!(service = %self.service, "upstream silent for {:?}", self.timeout);
        let why = format!(
            "the upstream server did not answer within {} s",
            self.timeout.as_secs()
        );
        self.fail(frame, ErrorCode::Unreachable, &why, None).await;
    }

    /// A JSON body: one message, passed on as one line. Returns whether it answered `frame`.
    async fn relay_json(
        &self,
        mut response: reqwest::Response,
        frame: &Frame,
    ) -> Result<bool, Silent> {
        let mut body = Vec::new();
        loop {
            let chunk = tokio::time::timeout(self.timeout, response.chunk())
                .await
                .map_err(|_| Silent)?;
            match chunk {
                Ok(Some(chunk)) if body.len() + chunk.len() <= MAX_FRAME => {
                    body.extend_from_slice(&chunk);
                }
                Ok(Some(_)) => {
                    self.fail(
                        frame,
                        ErrorCode::FrameTooLarge,
                        "the upstream answer is larger than the frame cap",
                        None,
                    )
                    .await;
                    return Ok(true);
                }
                Ok(None) => break,
                Err(_) => return Ok(false),
            }
        }
        if body.iter().all(u8::is_ascii_whitespace) {
            // 202 Accepted (or an empty 200): nothing to relay.
            return Ok(false);
        }
        Ok(self.emit(&body, frame.id.as_deref()).await)
    }

    /// An SSE body: each event's data is one message. Returns whether one of them answered
    /// `id`, or `Silent` when the stream went `silence` without a byte before that answer.
    /// `last_id`, for the GET stream, records the last event id seen.
    async fn relay_events(
        &self,
        mut response: reqwest::Response,
        id: Option<&RawValue>,
        mut last_id: Option<&mut Option<String>>,
        silence: Option<Duration>,
    ) -> Result<bool, Silent> {
        let mut parser = SseParser::new(MAX_FRAME);
        let mut answered = false;
        loop {
            let next = async {
                match silence {
                    Some(limit) => tokio::time::timeout(limit, response.chunk()).await.ok(),
                    None => Some(response.chunk().await),
                }
            };
            let chunk = tokio::select! {
                c = next => match c {
                    Some(c) => c,
                    // Silent past the limit: given up on (after its answer, simply closed).
                    None if answered => return Ok(true),
                    None => return Err(Silent),
                },
                _ = self.closing.cancelled() => return Ok(answered),
            };
            let Ok(Some(chunk)) = chunk else {
                return Ok(answered);
            };
            let events = match parser.feed(&chunk) {
                Ok(events) => events,
                Err(e) => {
                    tracing::warn!(service = %self.service, "upstream event stream: {e}");
                    return Ok(answered);
                }
            };
            for event in events {
                if let Some(slot) = last_id.as_deref_mut() {
                    *slot = event.id.clone();
                }
                if !event.data.iter().all(u8::is_ascii_whitespace) {
                    answered |= self.emit(&event.data, id).await;
                }
            }
        }
    }

    /// Writes one message toward the client, as one line: the bytes as the server sent them,
    /// less the line breaks a pretty-printing server may put between tokens (JSON strings
    /// cannot hold raw line breaks, so this changes no value). Returns whether it answers `id`.
    async fn emit(&self, message: &[u8], id: Option<&RawValue>) -> bool {
        let mut line: Vec<u8> = message
            .iter()
            .copied()
            .filter(|b| *b != b'\n' && *b != b'\r')
            .collect();
        let answers = answers(&line, id);
        if answers {
            // An initialize answer's negotiated version rides on every later request.
            self.note_protocol(&line);
        }
        line.push(b'\n');
        let _ = self.out.lock().await.write_all(&line).await;
        answers
    }

    /// Keeps the protocol version an `initialize` answer negotiated.
    fn note_protocol(&self, line: &[u8]) {
        #[derive(Deserialize)]
        struct Answer {
            result: Option<Negotiated>,
        }
        #[derive(Deserialize)]
        struct Negotiated {
            #[serde(rename = "protocolVersion")]
            protocol_version: Option<String>,
        }
        if let Ok(Answer {
            result: Some(Negotiated {
                protocol_version: Some(v),
            }),
        }) = serde_json::from_slice(line)
            && let Ok(v) = HeaderValue::from_str(&v)
        {
            Self::set(&self.protocol, v);
        }
    }

    /// A non-2xx answer: a JSON-RPC error body for this request passes as the server wrote
    /// it; anything else becomes an error of the band.
    async fn http_error(&self, frame: &Frame, response: reqwest::Response) {
        let status = response.status();
        let retry_after = response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
            .map(|secs| secs * 1000);
        let body = read_capped(response, 64 * 1024).await;
        if frame.is_request() && answers(&body, frame.id.as_deref()) {
            self.emit(&body, frame.id.as_deref()).await;
            return;
        }
        let (code, why) = match status.as_u16() {
            401 | 403 => (
                ErrorCode::UnknownService,
                "the upstream server refused the request",
            ),
            404 if Self::get(&self.session).is_some() => (
                ErrorCode::Unreachable,
                "the upstream server no longer knows this session",
            ),
            404 => (ErrorCode::UnknownService, "the upstream URL does not exist"),
            413 => (
                ErrorCode::FrameTooLarge,
                "the upstream server refused the size",
            ),
            429 | 503 => (ErrorCode::Busy, "the upstream server is busy"),
            _ => (ErrorCode::Unreachable, "the upstream server failed"),
        };
        tracing::debug!(service = %self.service, %status, "upstream refused a frame");
        let why = format!("{why} (HTTP {})", status.as_u16());
        let retry = (code == ErrorCode::Busy).then(|| retry_after.unwrap_or(1000));
        self.fail(frame, code, &why, retry).await;
    }

    /// Answers `frame` (when it is a request) with a mesh error; other frames are dropped.
    async fn fail(&self, frame: &Frame, code: ErrorCode, why: &str, retry_ms: Option<u64>) {
        if !frame.is_request() {
            tracing::debug!(service = %self.service, "an upstream frame was lost: {why}");
            return;
        }
        let mut error = ErrorFrame::new(code).id(frame.id.as_deref()).message(why);
        if let Some(ms) = retry_ms {
            error = error.retry_after_ms(ms);
        }
        let _ = self.out.lock().await.write_all(&error.to_line()).await;
    }

    /// The GET stream for server-initiated messages, when the server offers one (405 when
    /// not). Reconnects with `Last-Event-ID` when the server ends it, until the session ends.
    async fn listen(self: Arc<Self>) {
        let mut last_id: Option<String> = None;
        let mut failures = 0;
        let mut delay = Duration::from_millis(500);
        while failures < MAX_GET_RETRIES && !self.closing.is_cancelled() {
            let mut req = self
                .session_headers(self.client.get(self.url.clone()))
                .header(ACCEPT, "text/event-stream");
            if let Some(id) = last_id
                .as_deref()
                .and_then(|v| HeaderValue::from_str(v).ok())
            {
                req = req.header(LAST_EVENT_ID, id);
            }
            let response = tokio::select! {
                r = req.send() => r,
                _ = self.closing.cancelled() => return,
            };
            match response {
                Ok(r) if r.status().is_success() && content_type(&r) == "text/event-stream" => {
                    let before = last_id.clone();
                    let _ = self.relay_events(r, None, Some(&mut last_id), None).await;
                    failures = if last_id != before { 0 } else { failures + 1 };
                }
                // 405: no GET stream offered. Anything else: not ours to retry.
                Ok(_) => return,
                Err(e) => {
                    tracing::debug!(service = %self.service, "GET stream: {e}");
                    failures += 1;
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = self.closing.cancelled() => return,
            }
            delay = (delay * 2).min(Duration::from_secs(5));
        }
    }

    /// Ends the upstream session (when the server gave it an id).
    async fn delete(&self) {
        if Self::get(&self.session).is_none() {
            return;
        }
        let req = self.session_headers(self.client.delete(self.url.clone()));
        match tokio::time::timeout(DELETE_TIMEOUT, req.send()).await {
            Ok(Ok(r)) => {
                tracing::debug!(service = %self.service, status = %r.status(), "upstream session deleted")
            }
            Ok(Err(e)) => tracing::debug!(service = %self.service, "DELETE failed: {e}"),
            Err(_) => tracing::debug!(service = %self.service, "DELETE timed out"),
        }
    }
}

/// The upstream stayed silent on a POST for longer than the request timeout.
struct Silent;

/// A value for a 2026-07-28 routing header: plain printable ASCII as it is, anything else
/// (non-ASCII, control characters, edge whitespace, or what looks like the wrapper itself)
/// as `=?base64?<UTF-8 in base64>?=`, so the server recovers the exact name.
fn header_text(value: &str) -> Result<HeaderValue, reqwest::header::InvalidHeaderValue> {
    let plain = value.bytes().all(|b| (0x20..=0x7e).contains(&b))
        && value == value.trim()
        && !(value.starts_with("=?base64?") && value.ends_with("?="));
    if plain {
        return HeaderValue::from_str(value);
    }
    let encoded = data_encoding::BASE64.encode(value.as_bytes());
    HeaderValue::from_str(&format!("=?base64?{encoded}?="))
}

/// Whether `message` is the answer to the request `id`.
fn answers(message: &[u8], id: Option<&RawValue>) -> bool {
    jsonrpc::peek_response(message)
        .and_then(|p| Some(jsonrpc::id_key(p.answers()?) == jsonrpc::id_key(id?)))
        .unwrap_or(false)
}

/// Whether a 401 is an MCP server asking for an OAuth grant: a `Bearer` challenge naming
/// its protected-resource metadata.
fn asks_for_oauth(response: &reqwest::Response) -> bool {
    crate::oauth::discovery::challenges(response).any(|c| c.resource_metadata.is_some())
}

/// The scopes a 403 `insufficient_scope` challenge names (empty when it names none); `None`
/// for any other 403.
fn insufficient_scope(response: &reqwest::Response) -> Option<Vec<String>> {
    crate::oauth::discovery::challenges(response)
        .find(|c| c.error.as_deref() == Some("insufficient_scope"))
        .map(|c| {
            c.scope
                .unwrap_or_default()
                .split_whitespace()
                .map(str::to_owned)
                .collect()
        })
}

fn content_type(response: &reqwest::Response) -> String {
    response
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .map(|v| v.trim().to_ascii_lowercase())
        .unwrap_or_default()
}

async fn read_capped(mut response: reqwest::Response, cap: usize) -> Vec<u8> {
    let mut body = Vec::new();
    while let Ok(Some(chunk)) = response.chunk().await {
        if body.len() + chunk.len() > cap {
            return Vec::new();
        }
        body.extend_from_slice(&chunk);
    }
    body
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routing_headers_wrap_what_http_cannot_carry() {
        let text = |v: &str| header_text(v).unwrap().to_str().unwrap().to_owned();
        assert_eq!(text("get-sum"), "get-sum");
        assert_eq!(text("héllo"), "=?base64?aMOpbGxv?=");
        assert_eq!(text(" x"), "=?base64?IHg=?=");
        assert_eq!(text("=?base64?eA==?="), "=?base64?PT9iYXNlNjQ/ZUE9PT89?=");
    }
}
