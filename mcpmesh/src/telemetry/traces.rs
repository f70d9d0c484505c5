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
//! The request path only copies what the span will say into a queue ([`Traces::finished`]).
//! A thread of the node's ([`export`](super::export)) samples, names and writes the spans, a
//! batch at a time, and posts them; past the queue's size (2,048 spans by default) spans are
//! dropped and counted, never held. What the exporter managed, and its last error, are kept
//! for `status` and `doctor` ([`Traces::exports`]).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry::KeyValue;
use opentelemetry_sdk::Resource;

use super::export::{self, Batching, Exports, Pushed, Queue, Sender};
use super::otlp::Batch;
use super::span::{Ended, Traced};

pub use super::export::ExportReport;

/// How long a stopping node waits for its last spans to be sent.
const FLUSH_ON_STOP: Duration = Duration::from_secs(5);

/// The node's queue of finished requests and the thread that sends them.
#[derive(Debug)]
pub struct Traces {
    queue: Arc<Queue>,
    sender: std::thread::Thread,
    /// Told when the sending thread has sent what was left and stopped.
    stopped: Mutex<std::sync::mpsc::Receiver<()>>,
    url: url::Url,
    exports: Arc<Exports>,
}

/// Traces could not be set up (no thread to send them).
#[derive(Debug, thiserror::Error)]
#[error("cannot send traces to {url}: {reason}")]
pub struct TracesError {
    url: String,
    reason: String,
}

impl Traces {
    /// Spans of the node `node_id`, posted to `url` (the collector's traces URL). The standard
    /// `OTEL_EXPORTER_OTLP_HEADERS` (or `OTEL_EXPORTER_OTLP_TRACES_HEADERS`), `OTEL_BSP_*`,
    /// `OTEL_TRACES_SAMPLER` and `OTEL_RESOURCE_ATTRIBUTES` variables are honoured (a
    /// collector's API key belongs in the first, never in the config file).
    pub fn new(url: &url::Url, node_id: &str) -> Result<Self, TracesError> {
        Traces::batched(url, node_id, Batching::from_env())
    }

    /// [`Traces::new`], batched as `batching` says.
    pub(super) fn batched(
        url: &url::Url,
        node_id: &str,
        batching: Batching,
    ) -> Result<Self, TracesError> {
        // iroh already brings rustls with ring; the exporter's HTTP client uses the same.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let resource = Resource::builder()
            .with_service_name("mcpmesh")
            .with_attributes([
                KeyValue::new("service.instance.id", node_id.to_owned()),
                KeyValue::new("service.version", env!("CARGO_PKG_VERSION")),
            ])
            .build();
        let resource: Vec<KeyValue> = resource
            .iter()
            .map(|(k, v)| KeyValue::new(k.clone(), v.clone()))
            .collect();
        let headers = std::env::var("OTEL_EXPORTER_OTLP_TRACES_HEADERS")
            .or_else(|_| std::env::var("OTEL_EXPORTER_OTLP_HEADERS"))
            .map(|h| export::headers_from(&h))
            .unwrap_or_default();
        let queue = Arc::new(Queue::new(batching));
        let exports = Arc::new(Exports::default());
        let sender = Sender {
            queue: queue.clone(),
            url: url.clone(),
            headers,
            exports: exports.clone(),
            batch: Batch::new(&resource, "mcpmesh", env!("CARGO_PKG_VERSION")),
        };
        let (done, stopped) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("mcpmesh-traces".into())
            .spawn(move || {
                sender.run();
                let _ = done.send(());
            })
            .map_err(|e| TracesError {
                url: url.to_string(),
                reason: e.to_string(),
            })?;
        Ok(Traces {
            queue,
            sender: thread.thread().clone(),
            stopped: Mutex::new(stopped),
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
        self.exports.report()
    }

    /// Queues the span of one finished request.
    pub fn finished(&self, r: &Traced<'_>) {
        if self.queue.push(Ended::of(r)) == Pushed::Full {
            self.sender.unpark();
        }
    }

    /// Sends what is still queued and stops (blocking: call it off the runtime).
    pub fn shutdown(&self) {
        self.queue.stop();
        self.sender.unpark();
        let stopped = self.stopped.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(FLUSH_ON_STOP)
        {
            tracing::warn!("the last spans may not have reached the collector");
        }
    }
}

impl Drop for Traces {
    /// The thread sends what is left and ends.
    fn drop(&mut self) {
        self.queue.stop();
        self.sender.unpark();
    }
}
