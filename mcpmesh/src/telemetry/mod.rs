//! The node's telemetry: metrics of what it serves and dials, counted and timed, for a
//! Prometheus scrape on a loopback port ([`serve`]), and a span per request for an OTLP
//! collector ([`traces`]).
//!
//! Names follow the OpenTelemetry semantic conventions for MCP where they exist
//! (`mcp_server_operation_duration_seconds`, `mcp_client_session_duration_seconds`, …, with
//! `mcp_method_name` and `gen_ai_tool_name`); the rest are `mcpmesh_*`. Every label value is
//! bounded: services and peers are names this node configured or paired, a caller that is not
//! trusted is counted under no label at all, and the method and tool names a caller chooses
//! pass through [`names`]. Each node has its own registry (several nodes share a test
//! process); nothing here is global.
//!
//! Metrics observe: the audit sink hands over each record as it queues it, and the few facts
//! no record carries (why a session was refused, a child's life, a dialed request's answer)
//! are told here by the code that knows them. Nothing here waits or holds a lock across an
//! await.

mod export;
pub mod names;
mod otlp;
mod serve;
mod span;
pub mod traces;

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::encoding::{EncodeLabel, EncodeLabelSet, LabelSetEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};
use serde_json::value::RawValue;

pub use serve::{MetricsListener, serve};
pub use span::{Side, TraceParent, Traced};
pub use traces::Traces;

use names::ToolNames;

/// The buckets the OpenTelemetry MCP conventions advise for operation and session durations.
const BUCKETS: [f64; 14] = [
    0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
];

/// What a caller is called in labels when it is a local client (the HTTP gateway's).
const LOCAL: &str = "local";

/// Why the node refused something, as the `reason` label says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// A connection from a key this node does not trust.
    Trust,
    /// A session or request over the caller's rate.
    Rate,
    /// A session over the service's session cap.
    SessionCap,
    /// A request over the session's in-flight cap.
    InFlight,
    /// A call of a tool the caller may not use.
    ToolPolicy,
}

impl Refusal {
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::Trust => "trust",
            Refusal::Rate => "rate",
            Refusal::SessionCap => "session_cap",
            Refusal::InFlight => "in_flight",
            Refusal::ToolPolicy => "tool_policy",
        }
    }
}

/// One request a served session's server answered (or the node answered for it).
#[derive(Debug, Clone, Copy)]
pub struct Served<'a> {
    pub service: &'a str,
    pub peer: &'a str,
    pub method: &'a str,
    pub tool: Option<&'a str>,
    /// The ledger's outcome (`ok`, `error`, `rate_limited`, …).
    pub outcome: &'a str,
    pub latency: Duration,
    pub bytes_in: u64,
    pub bytes_out: u64,
}

/// A peer as the scrape shows it: its path now and the round trip on it.
#[derive(Debug, Clone)]
pub struct PeerPath {
    pub peer: String,
    /// `direct` or `relay`; `None` while it is unreachable.
    pub path: Option<&'static str>,
    pub rtt: Option<Duration>,
}

/// The labels of an operation's duration. Label values on the request path are interned
/// ([`Metrics::names`]) or static: finding a request's series allocates nothing.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Operation {
    method: &'static str,
    tool: Option<Arc<str>>,
    service: Arc<str>,
    peer: Arc<str>,
    outcome: &'static str,
}

impl EncodeLabelSet for Operation {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> Result<(), std::fmt::Error> {
        ("mcp_method_name", self.method).encode(encoder.encode_label())?;
        if let Some(tool) = &self.tool {
            ("gen_ai_tool_name", &**tool).encode(encoder.encode_label())?;
        }
        ("service", &*self.service).encode(encoder.encode_label())?;
        ("peer", &*self.peer).encode(encoder.encode_label())?;
        ("outcome", self.outcome).encode(encoder.encode_label())
    }
}

/// `service`, `peer`, `outcome`: a served request's count.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Outcome {
    service: Arc<str>,
    peer: Arc<str>,
    outcome: &'static str,
}

impl EncodeLabelSet for Outcome {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> Result<(), std::fmt::Error> {
        ("service", &*self.service).encode(encoder.encode_label())?;
        ("peer", &*self.peer).encode(encoder.encode_label())?;
        ("outcome", self.outcome).encode(encoder.encode_label())
    }
}

/// `service`, `direction`: bytes of served requests.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Direction {
    service: Arc<str>,
    direction: &'static str,
}

impl EncodeLabelSet for Direction {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> Result<(), std::fmt::Error> {
        ("service", &*self.service).encode(encoder.encode_label())?;
        ("direction", self.direction).encode(encoder.encode_label())
    }
}

/// A list of `(name, value)` labels, all known names.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Labels(Vec<(&'static str, String)>);

impl EncodeLabelSet for Labels {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> Result<(), std::fmt::Error> {
        for (name, value) in &self.0 {
            (*name, value.as_str()).encode(encoder.encode_label())?;
        }
        Ok(())
    }
}

fn labels<const N: usize>(pairs: [(&'static str, &str); N]) -> Labels {
    Labels(pairs.iter().map(|(k, v)| (*k, (*v).to_owned())).collect())
}

type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

fn histogram() -> Histogram {
    Histogram::new(BUCKETS)
}

/// The node's metrics and the registry they are scraped from.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    server_ops: Histograms<Operation>,
    client_ops: Histograms<Operation>,
    server_sessions: Histograms<Labels>,
    client_sessions: Histograms<Labels>,
    requests: Family<Outcome, Counter>,
    refusals: Family<Labels, Counter>,
    bytes: Family<Direction, Counter>,
    sessions_live: Family<Labels, Gauge>,
    children_alive: Gauge,
    peers: Family<Labels, Gauge>,
    peer_rtt: Family<Labels, Gauge<f64, AtomicU64>>,
    tools: ToolNames,
    /// Service and peer names, interned (both are names this node configured or paired).
    names: Mutex<HashSet<Arc<str>>>,
    /// The series each kind of served request counts in, once found ([`Metrics::served`]).
    served_series: Mutex<SeriesCache<ServedSeries>>,
    /// The same for the requests this node's clients sent ([`Metrics::asked`]).
    asked_series: Mutex<SeriesCache<Histogram>>,
}

/// The series a kind of request counts in, by a key of its label values: found by hashing one
/// short key, where finding them in their families hashed four label sets and interned the
/// names, under as many locks, on every request.
#[derive(Debug)]
struct SeriesCache<S> {
    series: HashMap<String, S>,
    /// The key being looked up, kept to be written again without allocating.
    key: String,
}

impl<S> Default for SeriesCache<S> {
    fn default() -> Self {
        SeriesCache {
            series: HashMap::new(),
            key: String::new(),
        }
    }
}

impl<S: Clone> SeriesCache<S> {
    /// The series of `parts`, if kept.
    fn get(&mut self, parts: [&str; 5]) -> Option<S> {
        self.key(parts);
        self.series.get(self.key.as_str()).cloned()
    }

    /// Keeps `series` for `parts`.
    fn keep(&mut self, parts: [&str; 5], series: S) {
        let key = self.key(parts).to_owned();
        self.series.insert(key, series);
    }

    /// The label values of a kind of request are names this node configured or paired,
    /// bounded names of methods and outcomes, and a tool name last: joined with a byte none
    /// of the first can hold, they key it.
    fn key(&mut self, parts: [&str; 5]) -> &str {
        self.key.clear();
        for part in parts {
            self.key.push_str(part);
            self.key.push('\0');
        }
        &self.key
    }
}

/// A served request's series: its duration, its count, its bytes in and out.
#[derive(Debug, Clone)]
struct ServedSeries {
    duration: Histogram,
    count: Counter,
    bytes_in: Counter,
    bytes_out: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let server_ops = Histograms::<Operation>::new_with_constructor(histogram as fn() -> _);
        let client_ops = Histograms::<Operation>::new_with_constructor(histogram as fn() -> _);
        let server_sessions = Histograms::<Labels>::new_with_constructor(histogram as fn() -> _);
        let client_sessions = Histograms::<Labels>::new_with_constructor(histogram as fn() -> _);
        let m = Metrics {
            server_ops,
            client_ops,
            server_sessions,
            client_sessions,
            requests: Family::default(),
            refusals: Family::default(),
            bytes: Family::default(),
            sessions_live: Family::default(),
            children_alive: Gauge::default(),
            peers: Family::default(),
            peer_rtt: Family::default(),
            tools: ToolNames::default(),
            names: Mutex::default(),
            served_series: Mutex::default(),
            asked_series: Mutex::default(),
            registry: Registry::default(),
        };
        let mut registry = Registry::default();
        m.register(&mut registry);
        Metrics { registry, ..m }
    }

    /// Registers every metric in `registry` under its name, help text and unit (the registry
    /// holds clones of the families, which share their series with `self`).
    fn register(&self, registry: &mut Registry) {
        let seconds = || Unit::Seconds;
        registry.register_with_unit(
            "mcp_server_operation_duration",
            "Requests served, from the caller's request to the server's answer",
            seconds(),
            self.server_ops.clone(),
        );
        registry.register_with_unit(
            "mcp_client_operation_duration",
            "Requests this node's clients sent to peers, from the request to its answer",
            seconds(),
            self.client_ops.clone(),
        );
        registry.register_with_unit(
            "mcp_server_session_duration",
            "Sessions served, from admission to their end",
            seconds(),
            self.server_sessions.clone(),
        );
        registry.register_with_unit(
            "mcp_client_session_duration",
            "Sessions this node opened to peers' services, from opening to their end",
            seconds(),
            self.client_sessions.clone(),
        );
        registry.register(
            "mcpmesh_requests",
            "Requests to served services, by how they ended",
            self.requests.clone(),
        );
        registry.register(
            "mcpmesh_refusals",
            "Connections, sessions and requests refused, by reason",
            self.refusals.clone(),
        );
        registry.register_with_unit(
            "mcpmesh_request",
            "Bytes of served requests (in) and of their answers (out)",
            Unit::Bytes,
            self.bytes.clone(),
        );
        registry.register(
            "mcpmesh_sessions_live",
            "Sessions being served now, per service",
            self.sessions_live.clone(),
        );
        registry.register(
            "mcpmesh_children_alive",
            "Server processes the node runs now",
            self.children_alive.clone(),
        );
        registry.register(
            "mcpmesh_peers",
            "Peers by the path their traffic takes now (unreachable: no path)",
            self.peers.clone(),
        );
        registry.register_with_unit(
            "mcpmesh_peer_rtt",
            "Round trip to each reachable peer on its current path",
            seconds(),
            self.peer_rtt.clone(),
        );
    }

    /// `name` as a label value, shared.
    fn name(&self, name: &str) -> Arc<str> {
        let mut names = self.names.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(known) = names.get(name) {
            return known.clone();
        }
        let name: Arc<str> = Arc::from(name);
        names.insert(name.clone());
        name
    }

    /// A request a served session finished (answered, refused, or left unanswered).
    pub fn served(&self, r: &Served<'_>) {
        let peer = if r.peer.is_empty() { LOCAL } else { r.peer };
        let outcome = names::outcome(r.outcome);
        let method = names::method(r.method);
        let refusal = match outcome {
            "rate_limited" => Some(Refusal::Rate),
            "refused" => Some(Refusal::InFlight),
            "denied" => Some(Refusal::ToolPolicy),
            _ => None,
        };
        if let Some(reason) = refusal {
            self.refused(reason, Some(r.service));
        }
        let tool = (method == "tools/call").then(|| r.tool.unwrap_or(names::OTHER));
        let parts = [r.service, peer, method, outcome, tool.unwrap_or_default()];
        let cached = lock(&self.served_series).get(parts);
        let series = match cached {
            Some(series) => series,
            None => self.served_series_of(r.service, peer, method, outcome, tool),
        };
        series.duration.observe(r.latency.as_secs_f64());
        series.count.inc();
        series.bytes_in.inc_by(r.bytes_in);
        series.bytes_out.inc_by(r.bytes_out);
    }

    /// The series of a kind of served request, found in their families; kept for the next
    /// request of its kind once its labels are final (a tool not accepted yet is `other` only
    /// until it is).
    fn served_series_of(
        &self,
        service: &str,
        peer: &str,
        method: &'static str,
        outcome: &'static str,
        tool: Option<&str>,
    ) -> ServedSeries {
        let accepted = matches!(outcome, "ok" | "tool_error");
        let label = tool.map(|tool| self.tools.label(service, tool, accepted));
        let fin = tool.is_none_or(|tool| label.as_deref() == Some(tool));
        let (service, peer) = (self.name(service), self.name(peer));
        let duration = self.server_ops.get_or_create_owned(&Operation {
            method,
            tool: label,
            service: service.clone(),
            peer: peer.clone(),
            outcome,
        });
        let count = self.requests.get_or_create_owned(&Outcome {
            service: service.clone(),
            peer: peer.clone(),
            outcome,
        });
        let bytes = |direction| {
            self.bytes.get_or_create_owned(&Direction {
                service: service.clone(),
                direction,
            })
        };
        let series = ServedSeries {
            duration,
            count,
            bytes_in: bytes("in"),
            bytes_out: bytes("out"),
        };
        if fin {
            let parts = [&*service, &*peer, method, outcome, tool.unwrap_or_default()];
            lock(&self.served_series).keep(parts, series.clone());
        }
        series
    }

    /// Something refused for `reason`, on `service` when one was named.
    pub fn refused(&self, reason: Refusal, service: Option<&str>) {
        let set = match service {
            Some(service) => labels([("reason", reason.as_str()), ("service", service)]),
            None => labels([("reason", reason.as_str())]),
        };
        self.refusals.get_or_create(&set).inc();
    }

    pub fn session_opened(&self, service: &str) {
        self.sessions_live
            .get_or_create(&labels([("service", service)]))
            .inc();
    }

    pub fn session_closed(&self, service: &str, peer: &str, duration: Duration) {
        let peer = if peer.is_empty() { LOCAL } else { peer };
        self.sessions_live
            .get_or_create(&labels([("service", service)]))
            .dec();
        self.server_sessions
            .get_or_create(&labels([("service", service), ("peer", peer)]))
            .observe(duration.as_secs_f64());
    }

    /// A session this node opened to `peer`'s `service` ended.
    pub fn dialed_session_closed(&self, peer: &str, service: &str, duration: Duration) {
        self.client_sessions
            .get_or_create(&labels([("service", service), ("peer", peer)]))
            .observe(duration.as_secs_f64());
    }

    /// A request this node's client sent to `peer`'s `service` was answered (or never was).
    fn asked(&self, dialed: &Dialed, asked: &Asked, outcome: &'static str) {
        let tool = asked
            .name
            .as_deref()
            .filter(|_| asked.method == "tools/call");
        let parts = [
            &*dialed.service,
            &*dialed.peer,
            asked.method,
            outcome,
            tool.unwrap_or_default(),
        ];
        let cached = lock(&self.asked_series).get(parts);
        let duration = cached.unwrap_or_else(|| {
            let accepted = matches!(outcome, "ok" | "tool_error");
            let label = tool.map(|tool| self.tools.label(&dialed.service, tool, accepted));
            let fin = tool.is_none_or(|tool| label.as_deref() == Some(tool));
            let duration = self.client_ops.get_or_create_owned(&Operation {
                method: asked.method,
                tool: label,
                service: dialed.service.clone(),
                peer: dialed.peer.clone(),
                outcome,
            });
            if fin {
                lock(&self.asked_series).keep(parts, duration.clone());
            }
            duration
        });
        duration.observe(asked.at.elapsed().as_secs_f64());
    }

    /// A server process started; it counts as alive until the guard is dropped.
    pub fn child_alive(self: &Arc<Self>) -> ChildAlive {
        self.children_alive.inc();
        ChildAlive(self.clone())
    }

    /// Sets the peer gauges to what `peers` says now.
    pub fn set_peers(&self, peers: &[PeerPath]) {
        self.peer_rtt.clear();
        let mut counts = [("direct", 0), ("relay", 0), ("unreachable", 0)];
        for p in peers {
            let path = p.path.unwrap_or("unreachable");
            if let Some(slot) = counts.iter_mut().find(|(name, _)| *name == path) {
                slot.1 += 1;
            }
            if let (Some(path), Some(rtt)) = (p.path, p.rtt) {
                self.peer_rtt
                    .get_or_create(&labels([("peer", &p.peer), ("path", path)]))
                    .set(rtt.as_secs_f64());
            }
        }
        for (path, n) in counts {
            self.peers.get_or_create(&labels([("path", path)])).set(n);
        }
    }

    /// The page a scrape gets (OpenMetrics text, which Prometheus reads).
    pub fn render(&self) -> String {
        let mut page = String::with_capacity(16 * 1024);
        if prometheus_client::encoding::text::encode(&mut page, &self.registry).is_err() {
            page.clear();
            let _ = writeln!(page, "# EOF");
        }
        page
    }
}

/// A live server process, counted in `mcpmesh_children_alive` until dropped.
#[derive(Debug)]
pub struct ChildAlive(Arc<Metrics>);

impl Drop for ChildAlive {
    fn drop(&mut self) {
        self.0.children_alive.dec();
    }
}

/// A session this node opened to a peer's service, as its requests are timed and traced.
#[derive(Debug, Clone)]
pub struct Dialed {
    metrics: Option<Arc<Metrics>>,
    traces: Option<Arc<Traces>>,
    peer: Arc<str>,
    /// The peer's endpoint id (hex), for spans.
    peer_id: Arc<str>,
    service: Arc<str>,
}

impl Dialed {
    /// A session to `peer`'s `service`; `None` when the node neither keeps metrics nor sends
    /// traces.
    pub fn new(
        metrics: Option<&Arc<Metrics>>,
        traces: Option<&Arc<Traces>>,
        peer: &str,
        peer_id: &str,
        service: &str,
    ) -> Option<Self> {
        if metrics.is_none() && traces.is_none() {
            return None;
        }
        let name = |n: &str| metrics.map_or_else(|| Arc::from(n), |m| m.name(n));
        Some(Dialed {
            metrics: metrics.cloned(),
            traces: traces.cloned(),
            peer: name(peer),
            peer_id: Arc::from(peer_id),
            service: name(service),
        })
    }

    /// What to remember of a request the client sent (`method` and `params` as they came).
    pub fn asking(&self, method: &str, params: Option<&RawValue>) -> Asked {
        let bounded = names::method(method);
        let traced = self.traces.as_ref().map(|_| TracedAsk {
            unlisted_method: (bounded == names::OTHER).then(|| method.to_owned()),
            parent: TraceParent::of(params),
        });
        Asked {
            method: bounded,
            name: matches!(method, "tools/call" | "prompts/get")
                .then(|| params.and_then(|p| names::tool_of(p.get())))
                .flatten(),
            at: std::time::Instant::now(),
            traced,
        }
    }

    /// The request `asked` (its id `id`) ended with `outcome`: its answer's (`ok`, `error` with
    /// its `code`, `tool_error`), or `cancelled`, or `unanswered` (with the code the client
    /// was answered with).
    pub fn answered(&self, id: &RawValue, asked: &Asked, outcome: &'static str, code: Option<i64>) {
        if let Some(metrics) = &self.metrics {
            metrics.asked(self, asked, outcome);
        }
        if let (Some(traces), Some(traced)) = (&self.traces, &asked.traced) {
            traces.finished(&Traced {
                side: Side::Dialed,
                method: traced.unlisted_method.as_deref().unwrap_or(asked.method),
                name: asked.name.as_deref(),
                request_id: id.get(),
                service: &self.service,
                peer_id: &self.peer_id,
                outcome,
                code,
                started: asked.at,
                parent: traced.parent.as_ref(),
            });
        }
    }
}

/// A request a dialed session sent and has not had answered yet.
#[derive(Debug)]
pub struct Asked {
    /// The method as a label ([`names::method`]).
    pub method: &'static str,
    /// The tool or prompt it names (`tools/call`, `prompts/get`).
    pub name: Option<String>,
    pub at: std::time::Instant,
    traced: Option<TracedAsk>,
}

/// What a span needs of a request beyond what the metrics keep.
#[derive(Debug)]
struct TracedAsk {
    /// The method, when the specification does not define it (`Asked::method` says `other`).
    unlisted_method: Option<String>,
    parent: Option<TraceParent>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_served_request_is_timed_counted_and_its_refusal_reason_counted() {
        let m = Metrics::new();
        let served = |outcome, tool| Served {
            service: "files",
            peer: "bob",
            method: "tools/call",
            tool,
            outcome,
            latency: Duration::from_millis(3),
            bytes_in: 10,
            bytes_out: 20,
        };
        m.served(&served("ok", Some("echo")));
        m.served(&served("rate_limited", Some("echo")));
        m.served(&served("denied", Some("secret_tool")));
        m.refused(Refusal::Trust, None);
        let page = m.render();
        for line in [
            r#"mcp_server_operation_duration_seconds_count{mcp_method_name="tools/call",gen_ai_tool_name="echo",service="files",peer="bob",outcome="ok"} 1"#,
            r#"mcp_server_operation_duration_seconds_count{mcp_method_name="tools/call",gen_ai_tool_name="echo",service="files",peer="bob",outcome="rate_limited"} 1"#,
            r#"mcp_server_operation_duration_seconds_count{mcp_method_name="tools/call",gen_ai_tool_name="other",service="files",peer="bob",outcome="denied"} 1"#,
            r#"mcpmesh_refusals_total{reason="rate",service="files"} 1"#,
            r#"mcpmesh_refusals_total{reason="tool_policy",service="files"} 1"#,
            r#"mcpmesh_refusals_total{reason="trust"} 1"#,
            r#"mcpmesh_request_bytes_total{service="files",direction="in"} 30"#,
            r#"mcpmesh_request_bytes_total{service="files",direction="out"} 60"#,
            "# EOF",
        ] {
            assert!(page.contains(line), "{line} not in\n{page}");
        }
    }

    #[test]
    fn a_kind_of_request_counted_again_lands_in_the_same_series_and_a_tool_is_named_once_accepted()
    {
        let m = Metrics::new();
        let served = |outcome, bytes_in| Served {
            service: "files",
            peer: "bob",
            method: "tools/call",
            tool: Some("echo"),
            outcome,
            latency: Duration::from_millis(3),
            bytes_in,
            bytes_out: 1,
        };
        // Refused before it was ever accepted: `other`, and not kept as such.
        m.served(&served("error", 1));
        m.served(&served("ok", 10));
        m.served(&served("ok", 100));
        m.served(&served("error", 1000));
        let dialed = Dialed::new(Some(&Arc::new(Metrics::new())), None, "alice", "", "svc");
        let dialed = dialed.unwrap();
        let id = serde_json::value::RawValue::from_string("1".into()).unwrap();
        let params = serde_json::value::RawValue::from_string(r#"{"name":"echo"}"#.into()).unwrap();
        for _ in 0..3 {
            dialed.answered(&id, &dialed.asking("tools/call", Some(&params)), "ok", None);
        }
        let page = m.render();
        let op = |tool: &str, outcome: &str| {
            format!(
                r#"mcp_server_operation_duration_seconds_count{{mcp_method_name="tools/call",gen_ai_tool_name="{tool}",service="files",peer="bob",outcome="{outcome}"}}"#
            )
        };
        for line in [
            format!("{} 1", op("other", "error")),
            format!("{} 2", op("echo", "ok")),
            format!("{} 1", op("echo", "error")),
            r#"mcpmesh_requests_total{service="files",peer="bob",outcome="ok"} 2"#.to_owned(),
            r#"mcpmesh_request_bytes_total{service="files",direction="in"} 1111"#.to_owned(),
        ] {
            assert!(page.contains(&line), "{line} not in\n{page}");
        }
        let dialed_page = dialed.metrics.as_ref().unwrap().render();
        let line = r#"mcp_client_operation_duration_seconds_count{mcp_method_name="tools/call",gen_ai_tool_name="echo",service="svc",peer="alice",outcome="ok"} 3"#;
        assert!(dialed_page.contains(line), "{line} not in\n{dialed_page}");
    }

    #[test]
    fn peers_are_counted_by_path_and_their_rtt_follows_the_latest_view() {
        let m = Metrics::new();
        let peer = |name: &str, path, ms: Option<u64>| PeerPath {
            peer: name.into(),
            path,
            rtt: ms.map(Duration::from_millis),
        };
        m.set_peers(&[
            peer("bob", Some("direct"), Some(2)),
            peer("carol", None, None),
        ]);
        m.set_peers(&[peer("carol", Some("relay"), Some(40))]);
        let page = m.render();
        assert!(page.contains("mcpmesh_peers{path=\"relay\"} 1"), "{page}");
        assert!(page.contains("mcpmesh_peers{path=\"direct\"} 0"), "{page}");
        assert!(
            page.contains("mcpmesh_peer_rtt_seconds{peer=\"carol\",path=\"relay\"} 0.04"),
            "{page}"
        );
        assert!(!page.contains("peer=\"bob\""), "bob's view is gone: {page}");
    }
}
