//! One session's requests, as the serving node keeps account of them: the per-caller rate
//! limit, the in-flight cap, the service's per-tool rules, and the audit record of every
//! request with its outcome.
//!
//! The pump asks [`Ledger::client_line`] about each line the caller sends and tells
//! [`Ledger::server_sent`] what the server sends back. While a `tools/list` the rules concern
//! is waiting, the pump holds the server's lines whole ([`Ledger::holding`]) and
//! [`Ledger::server_line`] filters its answer. Records go to the audit sink's queue; nothing
//! here waits on disk.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mcpmesh_net::errors::{ErrorCode, ErrorFrame};
use mcpmesh_net::jsonrpc::{self, Kind, Outcome};
use mcpmesh_net::pump::{Seen, Verdict};
use mcpmesh_net::scan::{self, Scan, Scanned};
use serde_json::value::RawValue;

use crate::audit::{AuditEvent, AuditSink};
use crate::limits::{Budget, RateLimiter};
use crate::principal::Held;
use crate::telemetry::{Side, TraceParent, Traced};
use crate::tool_policy::{ListedTools, ToolPolicy, filter_tools_list, listed_tool_names, may_use};

/// A caller told "too many requests in flight" is asked to wait this long.
const RETRY_IN_FLIGHT_MS: u64 = 100;
/// How long a cancelled request still counts in flight when its server never answers it
/// (servers should not answer a cancelled request, but most are still working on it).
const CANCEL_GRACE: Duration = Duration::from_secs(30);
/// How long without a dropped notification ends a run of drops (one audit record a run).
const THROTTLE_RUN_GAP: Duration = Duration::from_secs(1);
/// How long after a refusal the caller's long lines are held whole (see [`Ledger::may_pass`]).
const HOLD_AFTER_REFUSAL: Duration = Duration::from_secs(1);
/// Notifications that are protocol plumbing rather than work are never throttled.
const UNTHROTTLED: [&str; 2] = ["notifications/initialized", "notifications/cancelled"];

/// Who is calling which service: for the records, and for the service's per-tool rules.
#[derive(Debug, Clone)]
pub struct Caller {
    pub service: String,
    pub principal: String,
    pub peer: String,
    /// The caller's whole principal set, which the rules are evaluated against, read live.
    pub held: Held,
    /// The service's rules, read live.
    pub tools: ToolPolicy,
    /// Where the service's tool names are kept when its server lists them (for the catalog).
    pub listed: ListedTools,
}

#[derive(Debug)]
struct Pending {
    /// The request's id as it arrived (raw JSON).
    id: String,
    started: Instant,
    method: String,
    name: Option<String>,
    params_hash: Option<String>,
    bytes_in: u64,
    /// When the caller cancelled it: it stays in flight until its answer, or the grace ends.
    cancelled: Option<Instant>,
    /// A `tools/list`, whose answer is read (its names kept for the catalog) and filtered for
    /// the caller.
    filtered: bool,
    /// Whether a `tools/list` asked for the first page (no cursor); the params of any other
    /// request are not read for it.
    first_page: bool,
    /// The caller's trace context, read only when the node sends traces.
    parent: Option<TraceParent>,
}

/// The account of one session's requests.
#[derive(Debug)]
pub struct Ledger {
    caller: Caller,
    limiter: Arc<RateLimiter>,
    /// The caller's budget on this service, made once for the session.
    budget: Budget,
    audit: AuditSink,
    max_in_flight: usize,
    pending: HashMap<String, Pending>,
    /// When a notification was last dropped, while a run of drops lasts.
    throttling_notifications: Option<Instant>,
    cancel_grace: Duration,
    /// How many of `pending` are filtered `tools/list`s.
    lists_pending: usize,
    /// Whether the caller asked for the tool list in this session.
    listed_tools: bool,
    /// When a request was last refused here.
    refused_at: Option<Instant>,
}

/// The answer to a line that is JSON but not one JSON-RPC message.
fn not_a_message() -> Vec<u8> {
    ErrorFrame::new(ErrorCode::InvalidRequest)
        .message("not a JSON-RPC message: one object per line (batches are not supported)")
        .to_line()
}

/// Why a message with a member spelled like one MCP reads is refused.
const SMUGGLING: &str = "invalid request: a member's name differs only in case from one MCP \
    reads, which a server ignoring case would read as that member";

/// The answer to a notification with a member spelled like one MCP reads.
fn smuggling() -> Vec<u8> {
    ErrorFrame::new(ErrorCode::InvalidRequest)
        .message(SMUGGLING)
        .to_line()
}

/// The answer to a line that is not JSON.
fn unparsable() -> Vec<u8> {
    ErrorFrame::new(ErrorCode::Parse)
        .message("parse error: the mesh could not read this frame as JSON")
        .to_line()
}

/// Whether a request's `params` carry a `cursor` (a later page of a listing).
fn has_cursor(params: &RawValue) -> bool {
    #[derive(serde::Deserialize)]
    struct Paged<'a> {
        #[serde(borrow, default)]
        cursor: Option<&'a RawValue>,
    }
    serde_json::from_str::<Paged<'_>>(params.get()).is_ok_and(|p| p.cursor.is_some())
}

impl Ledger {
    pub fn new(
        caller: Caller,
        limiter: Arc<RateLimiter>,
        audit: AuditSink,
        max_in_flight: usize,
    ) -> Self {
        Ledger {
            budget: Budget::of(&caller.service, &caller.principal),
            caller,
            limiter,
            audit,
            max_in_flight: max_in_flight.max(1),
            pending: HashMap::new(),
            throttling_notifications: None,
            cancel_grace: CANCEL_GRACE,
            lists_pending: 0,
            listed_tools: false,
            refused_at: None,
        }
    }

    /// Decides on one line from the caller: forward it, or answer it here.
    pub fn client_line(&mut self, line: &[u8]) -> Verdict {
        let smuggles = scan::smuggles(line);
        self.decide(line, line.len() as u64 + 1, None, smuggles)
    }

    /// Whether the caller's next long line may go on to the server before it is decided on:
    /// not while the session is at its in-flight cap, nor for a while after a refusal, so
    /// that what is likely to be refused is held whole and never reaches the server.
    pub fn may_pass(&self) -> bool {
        self.pending.len() < self.max_in_flight
            && self
                .refused_at
                .is_none_or(|at| at.elapsed() >= HOLD_AFTER_REFUSAL)
    }

    /// Whether a long line whose start `scan` has read may go on before it is whole:
    /// `Some(false)` for a call of a tool the caller may not use, so that it is held whole,
    /// refused as a short line is, and never reaches the server; `None` while the start does
    /// not name the method or the tool yet. Only read under tool rules: without them nothing
    /// in a request's start refuses it. This decides nothing: [`Ledger::client_streamed`]
    /// decides on the whole line (a later doubled `name` is still refused there).
    pub fn foresee(&self, scan: &Scan) -> Option<bool> {
        let rules = self.caller.tools.current();
        if rules.is_empty() {
            return Some(true);
        }
        if scan.smuggles() {
            return Some(false);
        }
        let ahead = scan.ahead();
        // What a peek cannot read is refused when the line ends.
        let Some(peek) = jsonrpc::peek(&ahead) else {
            return Some(false);
        };
        match peek.method.as_deref() {
            None => None,
            Some("tools/call") => {
                let tool = peek.params.and_then(jsonrpc::subject_name)?;
                Some(may_use(&rules, &self.caller.held.current(), &tool))
            }
            Some(_) => Some(true),
        }
    }

    /// Decides on a long line from the caller that went on as it arrived, from what the scan
    /// kept of it (see [`mcpmesh_net::scan`]) and its length on the wire.
    pub fn client_streamed(&mut self, scanned: Scanned, len: usize) -> Verdict {
        let gist = match scanned {
            Scanned::Object(gist) => gist,
            Scanned::NotAnObject => return Verdict::Strike(not_a_message()),
            Scanned::Broken => return Verdict::Strike(unparsable()),
            // Cut off at the cap by the node it came through, which answered it.
            Scanned::Unclosed => return Verdict::Strike(Vec::new()),
        };
        let hash = gist.params_hash.map(|h| h.to_hex().to_string());
        self.decide(&gist.object, len as u64, Some(hash), gist.smuggles)
    }

    /// Decides on `line` (or what a scan kept of a longer one, whose `params` hash is then
    /// given), `bytes` long on the wire; `smuggles`: a member of it is spelled like one MCP
    /// reads ([`scan::smuggles`]), and it is refused.
    fn decide(
        &mut self,
        line: &[u8],
        bytes: u64,
        hash: Option<Option<String>>,
        smuggles: bool,
    ) -> Verdict {
        let Some(peek) = jsonrpc::peek(line) else {
            let frame = if jsonrpc::is_json(line) {
                not_a_message()
            } else {
                unparsable()
            };
            return Verdict::Strike(frame);
        };
        match (peek.kind(), peek.id) {
            (Kind::Request, Some(id)) => {
                let hash = peek.params.and_then(|p| match hash {
                    Some(streamed) => streamed,
                    None => Some(blake3::hash(p.get().as_bytes()).to_hex().to_string()),
                });
                self.request(id, &peek, bytes, hash, smuggles)
            }
            (Kind::Notification, _) if smuggles => Verdict::Strike(smuggling()),
            (Kind::Notification, _) => {
                let method = peek.method.as_deref().unwrap_or_default();
                if let Some(cancelled) = peek.cancelled_request()
                    && let Some(p) = self.pending.get_mut(&jsonrpc::id_key(cancelled))
                {
                    // The server may still be working on it: its answer frees the slot.
                    p.cancelled.get_or_insert_with(Instant::now);
                }
                self.within_rate(UNTHROTTLED.contains(&method))
            }
            // The caller answering the server's own requests (sampling, roots, …): the server
            // asked for them, so they cost the caller nothing.
            _ => Verdict::Forward,
        }
    }

    /// A notification passes while the caller's notification cap allows, unless `exempt`;
    /// past it, it is dropped, and the first drop of a run is audited. A run ends after
    /// [`THROTTLE_RUN_GAP`] without a drop (the cap's refill lets one through now and then
    /// within a flood; that does not end it).
    fn within_rate(&mut self, exempt: bool) -> Verdict {
        let allowed = || self.limiter.check_notification(&self.budget).is_ok();
        if exempt || allowed() {
            if self
                .throttling_notifications
                .is_some_and(|at| at.elapsed() >= THROTTLE_RUN_GAP)
            {
                self.throttling_notifications = None;
            }
            return Verdict::Forward;
        }
        if self
            .throttling_notifications
            .replace(Instant::now())
            .is_none()
        {
            self.audit.record(AuditEvent::NotificationsThrottled {
                service: self.caller.service.clone(),
                principal: self.caller.principal.clone(),
                peer: self.caller.peer.clone(),
            });
        }
        Verdict::Answer(Vec::new())
    }

    fn request(
        &mut self,
        id: &RawValue,
        peek: &jsonrpc::Peek<'_>,
        bytes_in: u64,
        params_hash: Option<String>,
        smuggles: bool,
    ) -> Verdict {
        let mut pending = Pending {
            id: id.get().to_owned(),
            started: Instant::now(),
            method: peek.method.as_deref().unwrap_or_default().to_owned(),
            name: peek.params.and_then(jsonrpc::subject_name),
            params_hash,
            bytes_in,
            cancelled: None,
            filtered: false,
            first_page: peek.method.as_deref() != Some("tools/list")
                || peek.params.is_none_or(|p| !has_cursor(p)),
            parent: self
                .audit
                .traces()
                .and_then(|_| TraceParent::of(peek.params)),
        };
        // Cancelled requests past their grace matter only to a session at its cap.
        if self.pending.len() >= self.max_in_flight {
            self.expire_cancelled();
        }
        let key = jsonrpc::id_key(id);
        let refusal = if smuggles {
            let frame = ErrorFrame::new(ErrorCode::InvalidRequest).message(SMUGGLING);
            Some(("invalid", frame, Some(ErrorCode::InvalidRequest.code())))
        } else if !jsonrpc::valid_id(id) {
            let frame = ErrorFrame::new(ErrorCode::InvalidRequest)
                .message("invalid request: an id must be a string or an integer");
            Some(("invalid", frame, Some(ErrorCode::InvalidRequest.code())))
        } else if self.pending.contains_key(&key) {
            let frame = ErrorFrame::new(ErrorCode::InvalidRequest)
                .message("invalid request: a request with this id is still pending");
            Some(("invalid", frame, Some(ErrorCode::InvalidRequest.code())))
        } else if let Err(wait) = self.check_rate() {
            let frame = ErrorFrame::new(ErrorCode::Busy)
                .message("rate limited")
                .retry_after_ms(wait.as_millis().max(1) as u64);
            Some(("rate_limited", frame, None))
        } else if let Some(frame) = self.tool_refusal(&mut pending) {
            Some(("denied", frame, Some(ErrorCode::UnknownService.code())))
        } else if self.pending.len() >= self.max_in_flight {
            let frame = ErrorFrame::new(ErrorCode::Busy)
                .message(format!(
                    "too many requests in flight (at most {})",
                    self.max_in_flight
                ))
                .retry_after_ms(RETRY_IN_FLIGHT_MS);
            Some(("refused", frame, None))
        } else {
            None
        };
        match refusal {
            Some((outcome, frame, code)) => {
                self.refused_at = Some(Instant::now());
                self.record(pending, 0, outcome, code);
                Verdict::Answer(frame.id(Some(id)).to_line())
            }
            None => {
                self.listed_tools |= pending.method == "tools/list";
                self.lists_pending += usize::from(pending.filtered);
                self.pending.insert(key, pending);
                Verdict::Forward
            }
        }
    }

    /// The answer to a `tools/call` of a tool the caller may not use; marks a `tools/list`
    /// whose answer is to be filtered. Rules are read only for those two methods.
    fn tool_refusal(&self, pending: &mut Pending) -> Option<ErrorFrame> {
        let method = pending.method.as_str();
        if method == "tools/list" {
            pending.filtered = true;
            return None;
        }
        if method != "tools/call" {
            return None;
        }
        let rules = self.caller.tools.current();
        if rules.is_empty() {
            return None;
        }
        match &pending.name {
            Some(tool) if may_use(&rules, &self.caller.held.current(), tool) => None,
            Some(tool) => Some(ErrorFrame::new(ErrorCode::UnknownService).message(format!(
                "tool {tool:?} is not available to you on this service"
            ))),
            None => Some(
                ErrorFrame::new(ErrorCode::UnknownService)
                    .message("a tools/call must name its tool (params.name)"),
            ),
        }
    }

    /// Whether the caller has asked for the tool list in this session (so a change of what it
    /// may use is worth telling it).
    pub fn listed_tools(&self) -> bool {
        self.listed_tools
    }

    /// Whether a filtered `tools/list` is waiting: the server's lines are then held whole and
    /// offered to [`Ledger::server_line`].
    pub fn holding(&self) -> bool {
        self.lists_pending > 0
    }

    /// The server's `line` as the caller gets it: the answer to a filtered `tools/list`
    /// without the tools the caller may not use (`None`: as it is). An answer that cannot be
    /// filtered is withheld: the caller gets `-32054` for it instead.
    pub fn server_line(&mut self, line: &[u8]) -> Option<Vec<u8>> {
        let peek = jsonrpc::peek_response(line)?;
        let id = peek.answers()?;
        let first_page = self
            .pending
            .get(&jsonrpc::id_key(id))
            .filter(|p| p.filtered)?
            .first_page;
        if let Some(names) = listed_tool_names(line) {
            self.caller.listed.record(names, first_page);
        }
        let rules = self.caller.tools.current();
        if rules.is_empty() {
            return None;
        }
        let held = self.caller.held.current();
        match filter_tools_list(line, |tool| may_use(&rules, &held, tool)) {
            Ok(edited) => edited,
            Err(e) => {
                tracing::warn!(service = %self.caller.service, "a tools/list answer was withheld: {e}");
                Some(
                    ErrorFrame::new(ErrorCode::UnknownService)
                        .id(Some(id))
                        .message(format!(
                            "the tool list could not be filtered for you ({e}), so it is withheld"
                        ))
                        .to_line()
                        .strip_suffix(b"\n")
                        .map(<[u8]>::to_vec)
                        .unwrap_or_default(),
                )
            }
        }
    }

    /// Notes what the server sent: answers complete their requests' records.
    pub fn server_sent(&mut self, seen: Seen<'_>) {
        if self.pending.is_empty() {
            return;
        }
        seen.each_frame(|line, len| {
            let Some(peek) = jsonrpc::peek_response(line) else {
                return;
            };
            let Some(id) = peek.answers() else { return };
            let key = jsonrpc::id_key(id);
            let (outcome, code) = match peek.outcome() {
                _ if self
                    .pending
                    .get(&key)
                    .is_some_and(|p| p.cancelled.is_some()) =>
                {
                    ("cancelled", None)
                }
                Outcome::Ok => ("ok", None),
                Outcome::Error(code) => ("error", Some(code)),
                Outcome::ToolError => ("tool_error", None),
            };
            self.finish(&key, outcome, code, len as u64);
        });
    }

    /// Whether a request the caller has not cancelled still waits for the server's answer.
    pub fn owes_answers(&self) -> bool {
        self.pending.values().any(|p| p.cancelled.is_none())
    }

    /// The id of the one request still waiting for the server's answer, when exactly one is.
    pub fn lone_pending(&self) -> Option<Box<RawValue>> {
        let mut waiting = self.pending.values();
        match (waiting.next(), waiting.next()) {
            (Some(p), None) => RawValue::from_string(p.id.clone()).ok(),
            _ => None,
        }
    }

    /// A request the node answered itself after letting it through (an error `code`).
    pub fn answered_here(&mut self, id: &RawValue, code: i64) {
        self.finish(&jsonrpc::id_key(id), "error", Some(code), 0);
    }

    /// Answers every pending request with `code` (the session is being cut), recording each.
    pub fn answer_pending(&mut self, code: ErrorCode, message: &str) -> Vec<u8> {
        let mut out = Vec::new();
        self.lists_pending = 0;
        for (_, p) in std::mem::take(&mut self.pending) {
            if let Ok(id) = RawValue::from_string(p.id.clone()) {
                out.extend(
                    ErrorFrame::new(code)
                        .id(Some(&id))
                        .message(message)
                        .to_line(),
                );
            }
            self.record(p, 0, "severed", Some(code.code()));
        }
        out
    }

    /// Records every request still unanswered when the session ends.
    pub fn close(&mut self) {
        self.lists_pending = 0;
        for (_, p) in std::mem::take(&mut self.pending) {
            let outcome = if p.cancelled.is_some() {
                "cancelled"
            } else {
                "unanswered"
            };
            self.record(p, 0, outcome, None);
        }
    }

    /// Stops counting cancelled requests whose answer did not come within the grace.
    fn expire_cancelled(&mut self) {
        let grace = self.cancel_grace;
        let expired: Vec<String> = self
            .pending
            .iter()
            .filter(|(_, p)| p.cancelled.is_some_and(|at| at.elapsed() >= grace))
            .map(|(k, _)| k.clone())
            .collect();
        for key in expired {
            self.finish(&key, "cancelled", None, 0);
        }
    }

    fn finish(&mut self, key: &str, outcome: &str, code: Option<i64>, bytes_out: u64) {
        if let Some(p) = self.pending.remove(key) {
            self.lists_pending -= usize::from(p.filtered);
            self.record(p, bytes_out, outcome, code);
        }
    }

    fn check_rate(&self) -> Result<(), std::time::Duration> {
        self.limiter.check_budget(&self.budget)
    }

    fn record(&self, p: Pending, bytes_out: u64, outcome: &str, code: Option<i64>) {
        if let Some(traces) = self.audit.traces() {
            traces.finished(&Traced {
                side: Side::Served,
                method: &p.method,
                name: p.name.as_deref(),
                request_id: &p.id,
                service: &self.caller.service,
                peer_id: self.caller.principal.strip_prefix("eid:").unwrap_or(""),
                outcome,
                code,
                started: p.started,
                parent: p.parent.as_ref(),
            });
        }
        self.audit.record(AuditEvent::Request {
            service: self.caller.service.clone(),
            principal: self.caller.principal.clone(),
            peer: self.caller.peer.clone(),
            method: p.method,
            name: p.name,
            params_hash: p.params_hash,
            bytes_in: p.bytes_in,
            bytes_out,
            latency_us: p.started.elapsed().as_micros() as u64,
            outcome: outcome.to_owned(),
            code,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ledger(max_in_flight: usize) -> Ledger {
        let caller = Caller {
            service: "svc".into(),
            principal: "eid:ab".into(),
            peer: "bob".into(),
            held: Held::fixed(Vec::new()),
            tools: ToolPolicy::default(),
            listed: Default::default(),
        };
        Ledger::new(
            caller,
            RateLimiter::unlimited_shared(),
            AuditSink::disabled(),
            max_in_flight,
        )
    }

    fn call(id: u64) -> Vec<u8> {
        format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"slow"}}}}"#)
            .into_bytes()
    }

    fn cancel(id: u64) -> Vec<u8> {
        format!(r#"{{"jsonrpc":"2.0","method":"notifications/cancelled","params":{{"requestId":{id}}}}}"#)
            .into_bytes()
    }

    fn refused(verdict: &Verdict) -> bool {
        matches!(verdict, Verdict::Answer(line) if String::from_utf8_lossy(line).contains("-32053"))
    }

    /// `line` as a scan of it in two parts gives it.
    fn scanned(line: &[u8]) -> Scanned {
        let mut scan = mcpmesh_net::scan::Scan::default();
        scan.feed(&line[..line.len() / 2]);
        scan.feed(&line[line.len() / 2..]);
        scan.finish()
    }

    #[test]
    fn a_long_line_is_decided_on_as_a_short_one_and_a_refusal_holds_the_next_ones_whole() {
        let mut l = ledger(1);
        assert!(l.may_pass());
        assert!(matches!(
            l.client_streamed(scanned(&call(1)), 70_000),
            Verdict::Forward
        ));
        // At the cap: the next long line is held whole, and refused as a short one is.
        assert!(!l.may_pass());
        assert!(refused(&l.client_streamed(scanned(&call(2)), 70_000)));
        assert!(refused(&l.client_line(&call(2))));
        l.server_sent(Seen::Lines(
            b"{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\n",
        ));
        assert!(
            !l.may_pass(),
            "a refusal a moment ago still holds them whole"
        );
        l.refused_at = l.refused_at.map(|at| at - HOLD_AFTER_REFUSAL);
        assert!(l.may_pass());
        let answer = |v: Verdict| match v {
            Verdict::Strike(answer) => String::from_utf8_lossy(&answer).into_owned(),
            other => panic!("{other:?}"),
        };
        assert!(answer(l.client_streamed(scanned(b"{\"id\":3,"), 70_000)).is_empty());
        assert!(answer(l.client_streamed(scanned(b"{\"id\":3 /* */}"), 70_000)).contains("-32700"));
        assert!(answer(l.client_streamed(scanned(b"[{\"id\":3}]"), 70_000)).contains("-32600"));
    }

    #[test]
    fn a_cancelled_request_holds_its_slot_until_the_server_answers_it() {
        let mut l = ledger(1);
        assert!(matches!(l.client_line(&call(1)), Verdict::Forward));
        assert!(matches!(l.client_line(&cancel(1)), Verdict::Forward));
        // The server is still working on request 1: a second request is over the cap.
        assert!(refused(&l.client_line(&call(2))));
        l.server_sent(Seen::Lines(
            b"{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\n",
        ));
        assert!(matches!(l.client_line(&call(3)), Verdict::Forward));
    }

    #[test]
    fn a_later_page_of_the_tool_list_adds_to_the_names_kept_and_a_first_page_replaces_them() {
        let mut l = ledger(8);
        let listed = l.caller.listed.clone();
        let page = |l: &mut Ledger, id: u64, params: &str, tool: &str| {
            let ask =
                format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/list","params":{params}}}"#);
            assert!(matches!(l.client_line(ask.as_bytes()), Verdict::Forward));
            let answer = format!(
                r#"{{"jsonrpc":"2.0","id":{id},"result":{{"tools":[{{"name":"{tool}"}}]}}}}"#
            );
            assert!(l.server_line(answer.as_bytes()).is_none());
            l.server_sent(Seen::Lines(format!("{answer}\n").as_bytes()));
        };
        page(&mut l, 1, "{}", "a");
        page(&mut l, 2, r#"{"cursor":"p2"}"#, "b");
        assert_eq!(
            listed.get().as_deref(),
            Some(&["a".to_owned(), "b".to_owned()][..])
        );
        page(&mut l, 3, "{}", "c");
        assert_eq!(listed.get().as_deref(), Some(&["c".to_owned()][..]));
    }

    fn limited(per_minute: u32) -> Ledger {
        let caller = Caller {
            service: "svc".into(),
            principal: "eid:ab".into(),
            peer: "bob".into(),
            held: Held::fixed(Vec::new()),
            tools: ToolPolicy::default(),
            listed: Default::default(),
        };
        Ledger::new(
            caller,
            RateLimiter::per_minute_shared(per_minute),
            AuditSink::disabled(),
            8,
        )
    }

    #[test]
    fn the_callers_answers_to_the_server_are_not_counted() {
        let mut l = limited(2);
        let answer = br#"{"jsonrpc":"2.0","id":"s1","result":{}}"#;
        for _ in 0..100 {
            assert!(matches!(l.client_line(answer), Verdict::Forward));
        }
        // The answers took nothing from the caller's budget of requests.
        assert!(matches!(l.client_line(&call(1)), Verdict::Forward));
        assert!(matches!(l.client_line(&call(2)), Verdict::Forward));
        assert!(refused(&l.client_line(&call(3))));
    }

    #[test]
    fn notifications_have_their_own_cap_and_leave_requests_their_budget() {
        let mut l = limited(2);
        let progress = br#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":1,"progress":1}}"#;
        let mut passed = 0;
        while matches!(l.client_line(progress), Verdict::Forward) {
            passed += 1;
            assert!(
                passed <= crate::limits::NOTIFICATIONS_PER_MIN,
                "notifications are capped"
            );
        }
        // Past their own cap a notification is dropped, not answered.
        assert!(matches!(l.client_line(progress), Verdict::Answer(a) if a.is_empty()));
        assert!(
            passed > 2,
            "notifications do not share the requests' budget ({passed})"
        );
        assert!(matches!(l.client_line(&call(1)), Verdict::Forward));
        assert!(matches!(l.client_line(&call(2)), Verdict::Forward));
        assert!(refused(&l.client_line(&call(3))));
    }

    #[test]
    fn a_session_has_listed_tools_once_its_caller_asked_for_them() {
        let mut l = ledger(8);
        assert!(matches!(l.client_line(&call(1)), Verdict::Forward));
        assert!(!l.listed_tools());
        let list = br#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#;
        assert!(matches!(l.client_line(list), Verdict::Forward));
        assert!(l.listed_tools());
    }

    #[test]
    fn a_cancelled_request_never_answered_frees_its_slot_after_the_grace() {
        let mut l = ledger(1);
        l.cancel_grace = Duration::ZERO;
        assert!(matches!(l.client_line(&call(1)), Verdict::Forward));
        l.client_line(&cancel(1));
        assert!(matches!(l.client_line(&call(2)), Verdict::Forward));
    }

    fn ruled(rules: &[(&str, &[&str], &[&str])], held: &[&str]) -> Ledger {
        let rule = |(who, allow, deny): &(&str, &[&str], &[&str])| crate::tool_policy::ToolRule {
            who: vec![who.parse().unwrap()],
            allow: allow.iter().map(|s| s.to_string()).collect(),
            deny: deny.iter().map(|s| s.to_string()).collect(),
        };
        let caller = Caller {
            service: "svc".into(),
            principal: "eid:ab".into(),
            peer: "bob".into(),
            held: Held::fixed(held.iter().map(|p| p.parse().unwrap()).collect()),
            tools: ToolPolicy::new(rules.iter().map(rule).collect()),
            listed: Default::default(),
        };
        Ledger::new(
            caller,
            RateLimiter::unlimited_shared(),
            AuditSink::disabled(),
            8,
        )
    }

    fn tool_call(id: u64, tool: &str) -> Vec<u8> {
        format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"{tool}","arguments":{{"secret":1}}}}}}"#)
            .into_bytes()
    }

    #[test]
    fn a_member_spelled_like_one_mcp_reads_is_refused_however_long_the_line() {
        let mut l = ruled(&[("peer:bob", &["read_*"], &[])], &["peer:bob"]);
        let answer = |v: Verdict| match v {
            Verdict::Answer(a) | Verdict::Strike(a) => String::from_utf8_lossy(&a).into_owned(),
            other => panic!("{other:?}"),
        };
        // A server ignoring case would call `write_file`: the node read `read_file`.
        let call = br#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"read_file","Name":"write_file"}}"#;
        let refused = answer(l.client_line(call));
        assert!(
            refused.contains("-32600") && refused.contains(r#""id":5"#),
            "{refused}"
        );
        assert!(answer(l.client_streamed(scanned(call), 70_000)).contains("-32600"));
        let list = br#"{"jsonrpc":"2.0","id":6,"method":"tools/list","METHOD":"tools/call"}"#;
        assert!(answer(l.client_line(list)).contains("-32600"));
        let cancel =
            br#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestid":1}}"#;
        assert!(matches!(l.client_line(cancel), Verdict::Strike(_)));
        assert!(l.pending.is_empty());
        // Such a spelling inside the arguments is the tool's business.
        let inner = br#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"read_file","arguments":{"Name":"x"}}}"#;
        assert!(matches!(l.client_line(inner), Verdict::Forward));
        // A long line's start that shows one is held whole, to be refused before the server
        // reads any of it.
        let mut scan = Scan::default();
        scan.feed(br#"{"id":8,"method":"tools/call","params":{"Name":"x","arguments":{"#);
        assert_eq!(l.foresee(&scan), Some(false));
    }

    #[test]
    fn the_start_of_a_long_call_tells_whether_it_may_go_on_once_it_names_its_tool() {
        let seen = |l: &Ledger, start: &str| {
            let mut scan = Scan::default();
            scan.feed(start.as_bytes());
            l.foresee(&scan)
        };
        let start = |tool: &str| {
            format!(
                r#"{{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{{"name":"{tool}","arguments":{{"text":"xx"#
            )
        };
        let l = ruled(&[("peer:bob", &["read_*"], &[])], &["peer:bob"]);
        assert_eq!(seen(&l, &start("read_file")), Some(true));
        assert_eq!(seen(&l, &start("write_file")), Some(false));
        // Not yet named: the arguments first, or the method after `params`.
        let later = r#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"arguments":{"t"#;
        assert_eq!(seen(&l, later), None);
        assert_eq!(
            seen(&l, r#"{"params":{"name":"write_file","arguments":{"#),
            None
        );
        assert_eq!(
            seen(&l, r#"{"id":4,"method":"resources/read","params":{"#),
            Some(true)
        );
        assert_eq!(seen(&l, r#"{"id":4,"method":7,"params":{"#), Some(false));
        // A look decides nothing: the whole line is still decided on when it ends.
        assert!(l.pending.is_empty() && l.refused_at.is_none());
        // Without tool rules nothing in a start refuses a request.
        assert_eq!(seen(&ledger(1), &start("write_file")), Some(true));
    }

    #[test]
    fn a_call_of_a_tool_the_caller_may_not_use_is_answered_here() {
        let bob = ["peer:bob", "group:eng"];
        for (rules, tool, forwarded) in [
            (&[][..], "anything", true),
            (
                &[("peer:bob", &["read_*"][..], &[][..])][..],
                "read_file",
                true,
            ),
            (&[("peer:bob", &["read_*"], &[])], "write_file", false),
            // Deny beats allow across two principals the caller holds.
            (
                &[("peer:bob", &["*"], &[]), ("group:eng", &[], &["echo"])],
                "echo",
                false,
            ),
            (
                &[("peer:bob", &["*"], &[]), ("group:eng", &[], &["echo"])],
                "add",
                true,
            ),
            // Rules naming someone else: the caller is named by none, so no tool.
            (&[("peer:carol", &["*"], &[])], "add", false),
        ] {
            let mut l = ruled(rules, &bob);
            let verdict = l.client_line(&tool_call(7, tool));
            match verdict {
                Verdict::Forward => assert!(forwarded, "{tool} under {rules:?}"),
                Verdict::Answer(answer) => {
                    assert!(!forwarded, "{tool} under {rules:?}");
                    let v: serde_json::Value = serde_json::from_slice(&answer).unwrap();
                    assert_eq!(v["id"], 7);
                    assert_eq!(v["error"]["code"], -32054);
                    assert_eq!(v["error"]["data"]["source"], "mcpmesh");
                    let message = v["error"]["message"].as_str().unwrap();
                    assert!(message.contains(tool), "{message}");
                    assert!(!String::from_utf8_lossy(&answer).contains("secret"));
                    assert!(
                        !l.holding() && l.lone_pending().is_none(),
                        "nothing pending"
                    );
                }
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn only_the_answer_to_a_filtered_tools_list_is_rewritten() {
        let list = br#"{"jsonrpc":"2.0","id":"L","method":"tools/list"}"#;
        let answer =
            br#"{"jsonrpc":"2.0","id":"L","result":{"tools":[{"name":"add"},{"name":"echo"}]}}"#;
        let other = br#"{"jsonrpc":"2.0","id":"O","result":{"tools":[{"name":"echo"}]}}"#;

        // No rules: the answer is read (its names kept for the catalog), not rewritten.
        let mut l = ruled(&[], &["peer:bob"]);
        assert!(matches!(l.client_line(list), Verdict::Forward));
        assert!(l.holding());
        assert_eq!(l.server_line(other), None);
        assert_eq!(
            l.caller.listed.get(),
            None,
            "another answer is not a listing"
        );
        assert_eq!(l.server_line(answer), None);
        assert_eq!(
            l.caller.listed.get().as_deref(),
            Some(&["add".to_owned(), "echo".to_owned()][..])
        );
        l.server_sent(Seen::Lines(&[&answer[..], b"\n"].concat()));
        assert!(!l.holding());
        // A later page adds to the listing; a first page replaces it.
        let page = br#"{"jsonrpc":"2.0","id":"P","method":"tools/list","params":{"cursor":"2"}}"#;
        assert!(matches!(l.client_line(page), Verdict::Forward));
        l.server_line(br#"{"jsonrpc":"2.0","id":"P","result":{"tools":[{"name":"sum"}]}}"#);
        assert_eq!(l.caller.listed.get().unwrap().len(), 3);
        assert!(matches!(l.client_line(list), Verdict::Forward));
        l.server_line(other);
        l.server_line(br#"{"jsonrpc":"2.0","id":"L","result":{"tools":[{"name":"one"}]}}"#);
        assert_eq!(l.caller.listed.get().unwrap().len(), 1);

        let mut l = ruled(&[("peer:bob", &[], &["echo"])], &["peer:bob"]);
        assert!(!l.holding());
        assert!(matches!(l.client_line(list), Verdict::Forward));
        assert!(l.holding());
        // An answer to another request passes as it is, whatever it holds.
        assert_eq!(l.server_line(other), None);
        let edited = l.server_line(answer).unwrap();
        assert_eq!(
            edited,
            br#"{"jsonrpc":"2.0","id":"L","result":{"tools":[{"name":"add"}]}}"#
        );
        l.server_sent(Seen::Lines(&[&edited[..], b"\n"].concat()));
        assert!(!l.holding(), "the answer ended the hold");

        // An answer that cannot be filtered is withheld.
        assert!(matches!(l.client_line(list), Verdict::Forward));
        let withheld = l
            .server_line(br#"{"jsonrpc":"2.0","id":"L","result":{"tools":"echo"}}"#)
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&withheld).unwrap();
        assert_eq!(v["id"], "L");
        assert_eq!(v["error"]["code"], -32054);
    }
}

#[cfg(test)]
mod ids {
    use super::tests_support::*;
    use super::*;

    #[test]
    fn a_request_whose_id_is_not_a_string_or_integer_is_refused_and_no_rule_is_skipped() {
        for id in ["null", "1.5", "true", "{}", "[1]"] {
            let mut l = ruled_denying_whoami();
            let line = format!(
                r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"whoami"}}}}"#
            );
            let Verdict::Answer(answer) = l.client_line(line.as_bytes()) else {
                panic!("id {id} was forwarded")
            };
            let v: serde_json::Value = serde_json::from_slice(&answer).unwrap();
            assert_eq!(v["error"]["code"], -32600, "{id}");
            assert_eq!(v["error"]["data"]["source"], "mcpmesh", "{id}");
        }
    }
    #[test]
    fn a_second_pending_request_with_the_same_id_is_refused_and_the_list_stays_filtered() {
        for (first, second) in [("5", "5"), (r#""a""#, r#""\u0061""#)] {
            let mut l = ruled_denying_whoami();
            let list = format!(r#"{{"jsonrpc":"2.0","id":{first},"method":"tools/list"}}"#);
            assert!(matches!(l.client_line(list.as_bytes()), Verdict::Forward));
            let ping = format!(r#"{{"jsonrpc":"2.0","id":{second},"method":"ping"}}"#);
            let Verdict::Answer(answer) = l.client_line(ping.as_bytes()) else {
                panic!("a second request {second} was forwarded")
            };
            let v: serde_json::Value = serde_json::from_slice(&answer).unwrap();
            assert_eq!(v["error"]["code"], -32600);
            assert_eq!(v["error"]["data"]["source"], "mcpmesh");
            let answer = format!(
                r#"{{"jsonrpc":"2.0","id":{first},"result":{{"tools":[{{"name":"echo"}},{{"name":"whoami"}}]}}}}"#
            );
            let edited = l
                .server_line(answer.as_bytes())
                .expect("the list is filtered");
            assert!(!String::from_utf8_lossy(&edited).contains("whoami"));
        }
    }
}

#[cfg(test)]
mod tests_support {
    use super::*;

    pub fn ruled_denying_whoami() -> Ledger {
        let caller = Caller {
            service: "svc".into(),
            principal: "eid:ab".into(),
            peer: "bob".into(),
            held: Held::fixed(vec!["peer:bob".parse().unwrap()]),
            tools: ToolPolicy::new(vec![crate::tool_policy::ToolRule {
                who: vec!["peer:bob".parse().unwrap()],
                allow: vec!["*".into()],
                deny: vec!["whoami".into()],
            }]),
            listed: Default::default(),
        };
        Ledger::new(
            caller,
            RateLimiter::unlimited_shared(),
            AuditSink::disabled(),
            8,
        )
    }
}
