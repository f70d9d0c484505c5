//! The node's traces: one OpenTelemetry span per request per node, sent to a collector over
//! OTLP/HTTP when `[telemetry] otlp` names one.
//!
//! A span is made when its request ends, from what the serving ledger or the dialing tracker
//! already knows then (method, target, id, outcome, how long it took), so nothing on the
//! request path waits for tracing and nothing is threaded through the pump. A `traceparent` the
//! caller put in the request's `params._meta` (SEP-414) is the parent of the span on both
//! nodes; the node only reads `_meta` and forwards it unchanged, so the server's own span has
//! the same parent and the caller's trace shows all three.
//!
//! The SDK's batch processor sends spans from a thread of its own; past its queue (2,048 spans
//! by default) spans are dropped, never held. What the exporter managed, and its last error,
//! are kept for `status` and `doctor` ([`Traces::exports`]).

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{Span as _, SpanKind, Status, Tracer as _, TracerProvider as _};
use opentelemetry::{Context, InstrumentationScope, KeyValue, StringValue};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider, SpanData, SpanExporter};

use super::names;

/// Longest method, tool or prompt name a span carries (a caller chooses them).
const MAX_NAME: usize = 128;
/// How long a collector may take to accept one batch.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a stopping node waits for its last spans to be sent.
const FLUSH_ON_STOP: Duration = Duration::from_secs(5);

/// The trace context a request carried in `params._meta`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceParent {
    pub traceparent: String,
    pub tracestate: Option<String>,
}

impl TraceParent {
    /// The caller's context from a request's `params`, when it carried one.
    pub fn of(params: Option<&serde_json::value::RawValue>) -> Option<Self> {
        // Most requests carry none, and `_meta` often comes after megabytes of arguments: a
        // byte search, far cheaper than a parse, rules those out.
        memchr::memmem::find(params?.get().as_bytes(), b"traceparent")?;
        let meta = mcpmesh_net::jsonrpc::meta(params);
        Some(TraceParent {
            traceparent: meta.traceparent?,
            tracestate: meta.tracestate,
        })
    }

    /// As the parent of a span; a malformed `traceparent` is no parent (a new trace).
    fn context(&self) -> Context {
        let mut carrier = HashMap::with_capacity(2);
        carrier.insert("traceparent".to_owned(), self.traceparent.clone());
        if let Some(state) = &self.tracestate {
            carrier.insert("tracestate".to_owned(), state.clone());
        }
        TraceContextPropagator::new().extract(&carrier)
    }
}

/// Which node's side of a request a span describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// This node served it (span kind SERVER).
    Served,
    /// This node sent it to a peer for one of its clients (span kind CLIENT).
    Dialed,
}

/// One finished request, as its span tells it.
#[derive(Debug, Clone, Copy)]
pub struct Traced<'a> {
    pub side: Side,
    pub method: &'a str,
    /// The tool, prompt or resource the request names.
    pub name: Option<&'a str>,
    /// The request's id as it arrived (raw JSON).
    pub request_id: &'a str,
    pub service: &'a str,
    /// The peer's endpoint id (hex); empty for a local caller.
    pub peer_id: &'a str,
    /// How it ended: `ok`, `error` (with `code`), `tool_error`, or what the node made of it
    /// (`rate_limited`, `denied`, `unanswered`, …).
    pub outcome: &'a str,
    pub code: Option<i64>,
    pub started: Instant,
    pub parent: Option<&'a TraceParent>,
}

/// The node's tracer and the exporter behind it.
#[derive(Debug)]
pub struct Traces {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
    url: url::Url,
    exports: Arc<Exports>,
}

/// What the exporter has sent so far, and why it last failed.
#[derive(Debug, Default)]
pub struct Exports {
    sent: AtomicU64,
    failed: AtomicU64,
    last_error: Mutex<Option<String>>,
}

/// [`Exports`] at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportReport {
    /// Spans the collector accepted.
    pub sent: u64,
    /// Spans that could not be sent.
    pub failed: u64,
    pub last_error: Option<String>,
}

/// The OTLP exporter, with what it managed counted in [`Exports`].
#[derive(Debug)]
struct Counted {
    inner: opentelemetry_otlp::SpanExporter,
    exports: Arc<Exports>,
}

impl SpanExporter for Counted {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let n = batch.len() as u64;
        let result = self.inner.export(batch).await;
        match &result {
            Ok(()) => {
                self.exports.sent.fetch_add(n, Ordering::Relaxed);
            }
            Err(e) => {
                self.exports.failed.fetch_add(n, Ordering::Relaxed);
                let error = e.to_string();
                let mut last = self
                    .exports
                    .last_error
                    .lock()
                    .unwrap_or_else(|p| p.into_inner());
                if last.as_deref() != Some(error.as_str()) {
                    tracing::warn!("spans could not be sent to the collector: {error}");
                }
                *last = Some(error);
            }
        }
        result
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// Traces could not be set up (a bad URL or no HTTP client).
#[derive(Debug, thiserror::Error)]
#[error("cannot send traces to {url}: {reason}")]
pub struct TracesError {
    url: String,
    reason: String,
}

impl Traces {
    /// Spans of the node `node_id`, posted to `url` (the collector's traces URL). The standard
    /// `OTEL_EXPORTER_OTLP_HEADERS` and `OTEL_BSP_*` variables are honoured (a collector's API
    /// key belongs in the former, never in the config file).
    pub fn new(url: &url::Url, node_id: &str) -> Result<Self, TracesError> {
        let error = |reason: String| TracesError {
            url: url.to_string(),
            reason,
        };
        // iroh already brings rustls with ring; the exporter's HTTP client uses the same.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_endpoint(url.as_str())
            .with_timeout(EXPORT_TIMEOUT)
            .build()
            .map_err(|e| error(e.to_string()))?;
        let exports = Arc::new(Exports::default());
        let exporter = Counted {
            inner: exporter,
            exports: exports.clone(),
        };
        let resource = Resource::builder()
            .with_service_name("mcpmesh")
            .with_attributes([
                KeyValue::new("service.instance.id", node_id.to_owned()),
                KeyValue::new("service.version", env!("CARGO_PKG_VERSION")),
            ])
            .build();
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(resource)
            .build();
        let scope = InstrumentationScope::builder("mcpmesh")
            .with_version(env!("CARGO_PKG_VERSION"))
            .build();
        let tracer = provider.tracer_with_scope(scope);
        Ok(Traces {
            provider,
            tracer,
            url: url.clone(),
            exports,
        })
    }

    /// Where spans go.
    pub fn url(&self) -> &url::Url {
        &self.url
    }

    /// What the exporter has managed so far.
    pub fn exports(&self) -> ExportReport {
        let e = &self.exports;
        ExportReport {
            sent: e.sent.load(Ordering::Relaxed),
            failed: e.failed.load(Ordering::Relaxed),
            last_error: e
                .last_error
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
        }
    }

    /// Records the span of one finished request.
    pub fn finished(&self, r: &Traced<'_>) {
        let ended = SystemTime::now();
        let started = ended
            .checked_sub(r.started.elapsed())
            .unwrap_or(SystemTime::UNIX_EPOCH);
        // A method the specification defines is named without allocating.
        let method: StringValue = match names::method(r.method) {
            names::OTHER => bounded(r.method).to_owned().into(),
            known => known.into(),
        };
        let name = r.name.map(bounded);
        // Tool and prompt names are low-cardinality targets; a resource's URI is not.
        let target = match method.as_str() {
            "tools/call" | "prompts/get" => name,
            _ => None,
        };
        let span_name: Cow<'static, str> = match target {
            Some(target) => format!("{} {target}", method.as_str()).into(),
            None => method.to_string().into(),
        };
        let kind = match r.side {
            Side::Served => SpanKind::Server,
            Side::Dialed => SpanKind::Client,
        };
        let parent = r.parent.map(TraceParent::context).unwrap_or_default();
        let mut span = self
            .tracer
            .span_builder(span_name)
            .with_kind(kind)
            .with_start_time(started)
            .start_with_context(&self.tracer, &parent);
        // A span the sampler dropped (`OTEL_TRACES_SAMPLER`, or an unsampled parent) costs no
        // more than this.
        if !span.is_recording() {
            return;
        }
        let mut attributes = Vec::with_capacity(10);
        attributes.extend([
            KeyValue::new("mcp.method.name", method.clone()),
            KeyValue::new("jsonrpc.request.id", request_id(r.request_id)),
            KeyValue::new("network.transport", "quic"),
            KeyValue::new("mcpmesh.service", r.service.to_owned()),
        ]);
        if !r.peer_id.is_empty() {
            attributes.push(KeyValue::new("mcpmesh.peer.id", r.peer_id.to_owned()));
        }
        match (method.as_str(), name) {
            ("tools/call", Some(tool)) => {
                attributes.push(KeyValue::new("gen_ai.tool.name", tool.to_owned()));
                attributes.push(KeyValue::new("gen_ai.operation.name", "execute_tool"));
            }
            ("prompts/get", Some(prompt)) => {
                attributes.push(KeyValue::new("gen_ai.prompt.name", prompt.to_owned()));
            }
            (m, Some(uri)) if m.starts_with("resources/") => {
                attributes.push(KeyValue::new("mcp.resource.uri", uri.to_owned()));
            }
            _ => {}
        }
        let error: Option<StringValue> = match (r.outcome, r.code) {
            ("ok", _) => None,
            (_, Some(code)) => {
                let code = StringValue::from(code.to_string());
                attributes.push(KeyValue::new("rpc.response.status_code", code.clone()));
                Some(code)
            }
            (outcome, None) => Some(outcome.to_owned().into()),
        };
        if let Some(error) = error {
            attributes.push(KeyValue::new("error.type", error.clone()));
            span.set_status(Status::error(error.to_string()));
        }
        span.set_attributes(attributes);
        span.end_with_timestamp(ended);
    }

    /// Sends what is still queued and stops (blocking: call it off the runtime).
    pub fn shutdown(&self) {
        if let Err(e) = self.provider.shutdown_with_timeout(FLUSH_ON_STOP) {
            tracing::warn!("the last spans may not have reached the collector: {e}");
        }
    }
}

/// A caller-chosen name cut to [`MAX_NAME`] bytes (on a character boundary).
fn bounded(name: &str) -> &str {
    if name.len() <= MAX_NAME {
        return name;
    }
    let mut end = MAX_NAME;
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    &name[..end]
}

/// A request id as the conventions write it: a string id without its quotes, a number as it is.
fn request_id(raw: &str) -> String {
    if raw.starts_with('"')
        && let Ok(id) = serde_json::from_str::<Cow<'_, str>>(raw)
    {
        return bounded(&id).to_owned();
    }
    bounded(raw).to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caller_chosen_names_and_ids_are_bounded() {
        assert_eq!(bounded("tools/call"), "tools/call");
        let long = "é".repeat(100);
        assert!(bounded(&long).len() <= MAX_NAME);
        assert!(long.starts_with(bounded(&long)));
        assert_eq!(request_id("7"), "7");
        assert_eq!(request_id(r#""a-1""#), "a-1");
    }

    #[test]
    fn a_malformed_traceparent_is_no_parent() {
        use opentelemetry::trace::TraceContextExt;
        let good = TraceParent {
            traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into(),
            tracestate: None,
        };
        let context = good.context();
        let parent = context.span().span_context().clone();
        assert!(parent.is_valid() && parent.is_remote());
        assert_eq!(
            parent.trace_id().to_string(),
            "0af7651916cd43dd8448eb211c80319c"
        );
        let bad = TraceParent {
            traceparent: "00-zz-b7ad6b7169203331-01".into(),
            tracestate: None,
        };
        assert!(!bad.context().span().span_context().is_valid());
    }
}
