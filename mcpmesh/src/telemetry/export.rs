//! The thread that sends a node's spans: the queue the request path hands finished requests to,
//! and the thread that samples them, writes them as OTLP ([`super::otlp`]) and posts them.
//!
//! The request path takes a lock only to push onto a `Vec` and never wakes the thread but
//! once a batch is full; the thread otherwise wakes when its delay runs out (the batch span
//! processor's behaviour and variables: `OTEL_BSP_SCHEDULE_DELAY`, `OTEL_BSP_MAX_QUEUE_SIZE`,
//! `OTEL_BSP_MAX_EXPORT_BATCH_SIZE`). Past the queue's size, spans are dropped and counted as
//! not sent, never held.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use opentelemetry::trace::{SpanKind, TraceContextExt};
use opentelemetry_sdk::trace::{Config, SamplingDecision};

use super::otlp::{self, Attr, Batch, SpanOut};
use super::span::{Ended, Side, TraceParent};

/// The shortest and the longest wait between two looks at the queue.
const MIN_DELAY: Duration = Duration::from_millis(1);
const MAX_DELAY: Duration = Duration::from_secs(86_400);
/// How long a collector may take to accept one batch.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// How spans are batched, from the `OTEL_BSP_*` variables.
#[derive(Debug, Clone, Copy)]
pub(super) struct Batching {
    pub delay: Duration,
    pub max_queue: usize,
    pub batch: usize,
}

impl Batching {
    /// The standard variables' values, or their defaults.
    pub fn from_env() -> Self {
        use opentelemetry_sdk::trace::{
            OTEL_BSP_MAX_EXPORT_BATCH_SIZE, OTEL_BSP_MAX_EXPORT_BATCH_SIZE_DEFAULT,
            OTEL_BSP_MAX_QUEUE_SIZE, OTEL_BSP_MAX_QUEUE_SIZE_DEFAULT, OTEL_BSP_SCHEDULE_DELAY,
            OTEL_BSP_SCHEDULE_DELAY_DEFAULT,
        };
        let var = |name: &str| std::env::var(name).ok()?.trim().parse::<u64>().ok();
        Batching::new(
            var(OTEL_BSP_SCHEDULE_DELAY)
                .map_or(OTEL_BSP_SCHEDULE_DELAY_DEFAULT, Duration::from_millis),
            var(OTEL_BSP_MAX_QUEUE_SIZE).map_or(OTEL_BSP_MAX_QUEUE_SIZE_DEFAULT, |n| n as usize),
            var(OTEL_BSP_MAX_EXPORT_BATCH_SIZE)
                .map_or(OTEL_BSP_MAX_EXPORT_BATCH_SIZE_DEFAULT, |n| n as usize),
        )
    }

    /// Spans the queue makes room for ahead: a batch, up to a bound (the variables are the
    /// user's, and a huge one must not be allocated before any span is).
    fn room(&self) -> usize {
        self.batch.min(4096)
    }

    /// A batch is at most the queue, and both hold at least one span. The delay is at least a
    /// millisecond (at zero the thread would wake again at once, for ever) and at most a day
    /// (the variable is the user's; a wait past the clock's range would not be a wait).
    pub fn new(delay: Duration, max_queue: usize, batch: usize) -> Self {
        let max_queue = max_queue.max(1);
        Batching {
            delay: delay.clamp(MIN_DELAY, MAX_DELAY),
            max_queue,
            batch: batch.clamp(1, max_queue),
        }
    }
}

/// What the exporter has sent so far, and why it last failed.
#[derive(Debug, Default)]
pub struct Exports {
    sent: AtomicU64,
    failed: AtomicU64,
    last_error: Mutex<Option<String>>,
}

impl Exports {
    pub fn sent(&self, n: u64) {
        self.sent.fetch_add(n, Ordering::Relaxed);
    }

    /// What was sent and not, now.
    pub fn report(&self) -> ExportReport {
        ExportReport {
            sent: self.sent.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
            last_error: self
                .last_error
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
        }
    }

    /// `n` spans could not be sent, for `error`; a new error is logged once.
    pub fn failed_with(&self, n: u64, error: String) {
        self.failed.fetch_add(n, Ordering::Relaxed);
        let mut last = self.last_error.lock().unwrap_or_else(|p| p.into_inner());
        if last.as_deref() != Some(error.as_str()) {
            tracing::warn!("spans could not be sent to the collector: {error}");
        }
        *last = Some(error);
    }
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

/// What the request path shares with the thread.
#[derive(Debug)]
pub(super) struct Queue {
    spans: Mutex<Vec<Ended>>,
    batching: Batching,
    /// Spans dropped because the queue was full, not yet counted in [`Exports`].
    dropped: AtomicU64,
    stopping: AtomicBool,
}

/// What [`Queue::push`] asks of its caller.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Pushed {
    Queued,
    /// A batch is waiting: wake the thread.
    Full,
    Dropped,
}

impl Queue {
    pub fn new(batching: Batching) -> Self {
        Queue {
            spans: Mutex::new(Vec::with_capacity(batching.room())),
            batching,
            dropped: AtomicU64::new(0),
            stopping: AtomicBool::new(false),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Ended>> {
        self.spans.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn push(&self, span: Ended) -> Pushed {
        let mut spans = self.lock();
        if spans.len() >= self.batching.max_queue {
            drop(spans);
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return Pushed::Dropped;
        }
        spans.push(span);
        if spans.len() == self.batching.batch {
            Pushed::Full
        } else {
            Pushed::Queued
        }
    }

    pub fn stop(&self) {
        self.stopping.store(true, Ordering::Release);
    }

    /// What waits, leaving room for a batch (so the request path does not grow it).
    fn take(&self) -> Vec<Ended> {
        let room = Vec::with_capacity(self.batching.room());
        std::mem::replace(&mut *self.lock(), room)
    }
}

/// The thread's side: the queue, where spans go, and what it says of them.
pub(super) struct Sender {
    pub queue: Arc<Queue>,
    pub url: url::Url,
    pub headers: reqwest::header::HeaderMap,
    pub exports: Arc<Exports>,
    /// The resource (this node) and the scope its spans are sent under.
    pub batch: Batch,
}

impl Sender {
    /// Runs until the queue is stopped, then sends what is left.
    pub fn run(mut self) {
        // Built here, off the runtime: the blocking client runs one of its own.
        let client = match reqwest::blocking::Client::builder()
            .timeout(EXPORT_TIMEOUT)
            .build()
        {
            Ok(client) => Some(client),
            Err(e) => {
                self.exports
                    .failed_with(0, format!("no HTTP client for traces: {e}"));
                None
            }
        };
        let config = Config::default();
        let mut next = Instant::now() + self.queue.batching.delay;
        loop {
            let stopping = self.queue.stopping.load(Ordering::Acquire);
            let waiting = self.queue.lock().len();
            if stopping || waiting >= self.queue.batching.batch || Instant::now() >= next {
                let spans = self.queue.take();
                for chunk in spans.chunks(self.queue.batching.batch) {
                    self.send(client.as_ref(), &config, chunk);
                }
                self.count_dropped();
                if stopping {
                    return;
                }
                next = Instant::now() + self.queue.batching.delay;
                continue;
            }
            std::thread::park_timeout(next.saturating_duration_since(Instant::now()));
        }
    }

    fn count_dropped(&self) {
        let dropped = self.queue.dropped.swap(0, Ordering::Relaxed);
        if dropped > 0 {
            self.exports.failed_with(
                dropped,
                format!(
                    "{dropped} spans were dropped: more than {} waited to be sent \
                     (OTEL_BSP_MAX_QUEUE_SIZE)",
                    self.queue.batching.max_queue
                ),
            );
        }
    }

    /// Samples `spans`, and posts those kept as one request.
    fn send(
        &mut self,
        client: Option<&reqwest::blocking::Client>,
        config: &Config,
        spans: &[Ended],
    ) {
        let clock = Clock::now();
        for span in spans {
            write(&mut self.batch, config, &clock, span);
        }
        let n = self.batch.len() as u64;
        let body = self.batch.take();
        if n == 0 {
            return;
        }
        let Some(client) = client else {
            self.exports
                .failed_with(n, "no HTTP client for traces".into());
            return;
        };
        let sent = client
            .post(self.url.clone())
            .headers(self.headers.clone())
            .header(reqwest::header::CONTENT_TYPE, "application/x-protobuf")
            .body(body)
            .send();
        match sent {
            Ok(answer) if answer.status().is_success() => self.exports.sent(n),
            Ok(answer) => self
                .exports
                .failed_with(n, format!("the collector answered {}", answer.status())),
            Err(e) => self.exports.failed_with(n, e.to_string()),
        }
    }
}

/// Samples one finished request (the SDK's sampler, `OTEL_TRACES_SAMPLER`) and writes its span
/// into `batch` if it is kept.
fn write(batch: &mut Batch, config: &Config, clock: &Clock, e: &Ended) {
    let parent = e.parent.as_ref().map(TraceParent::context);
    let parent_span = parent.as_ref().map(|cx| cx.span().span_context().clone());
    let parent_span = parent_span.filter(|sc| sc.is_valid());
    let trace_id = parent_span
        .as_ref()
        .map_or_else(|| config.id_generator.new_trace_id(), |sc| sc.trace_id());
    let name = e.span_name();
    let kind = match e.side {
        Side::Served => SpanKind::Server,
        Side::Dialed => SpanKind::Client,
    };
    let sampled = config
        .sampler
        .should_sample(parent.as_ref(), trace_id, &name, &kind, &[], &[]);
    if sampled.decision != SamplingDecision::RecordAndSample {
        return;
    }
    let request_id = e.request_id();
    let code = e.code.map(|c| c.to_string());
    let mut attributes: Vec<(&str, Attr<'_>)> = Vec::with_capacity(10);
    e.attributes(&request_id, code.as_deref(), &mut attributes);
    for kv in &sampled.attributes {
        attributes.push((kv.key.as_str(), Attr::Any(&kv.value)));
    }
    let trace_state = sampled.trace_state.header();
    batch.push(&SpanOut {
        trace_id: trace_id.to_bytes(),
        span_id: config.id_generator.new_span_id().to_bytes(),
        trace_state: &trace_state,
        parent: parent_span.map(|sc| (sc.span_id().to_bytes(), sc.is_remote())),
        trace_flags: 1,
        name: &name,
        kind: match kind {
            SpanKind::Server => otlp::KIND_SERVER,
            _ => otlp::KIND_CLIENT,
        },
        start_ns: clock.unix_ns(e.started),
        end_ns: clock.unix_ns(e.ended),
        attributes: &attributes,
        error: e.error(code.as_deref()),
    });
}

/// The wall clock against the monotonic one, read once per batch: a span's [`Instant`]s become
/// the times since the epoch that OTLP carries.
struct Clock {
    now: SystemTime,
    at: Instant,
}

impl Clock {
    fn now() -> Self {
        Clock {
            now: SystemTime::now(),
            at: Instant::now(),
        }
    }

    fn unix_ns(&self, t: Instant) -> u64 {
        let wall = self
            .now
            .checked_sub(self.at.saturating_duration_since(t))
            .unwrap_or(UNIX_EPOCH);
        wall.duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
    }
}

/// The headers `OTEL_EXPORTER_OTLP_TRACES_HEADERS` (or else `OTEL_EXPORTER_OTLP_HEADERS`)
/// names: `key=value` pairs, comma-separated, values percent-encoded. A pair that is not a valid
/// header is left out, as the reference exporter does.
pub(super) fn headers_from(value: &str) -> reqwest::header::HeaderMap {
    use reqwest::header::{HeaderName, HeaderValue};
    let mut headers = reqwest::header::HeaderMap::new();
    for pair in value.split(',') {
        let Some((key, value)) = pair.split_once('=') else {
            continue;
        };
        let Ok(value) = percent_encoding::percent_decode_str(value.trim()).decode_utf8() else {
            continue;
        };
        if let (Ok(k), Ok(v)) = (
            HeaderName::from_bytes(key.trim().as_bytes()),
            HeaderValue::from_str(&value),
        ) {
            headers.insert(k, v);
        }
    }
    headers
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::{Traced, Traces};

    #[test]
    fn a_full_queue_drops_and_a_full_batch_wakes_the_thread() {
        let q = Queue::new(Batching::new(Duration::from_secs(3600), 3, 2));
        let span = || Ended::for_test("ping");
        assert_eq!(q.push(span()), Pushed::Queued);
        assert_eq!(q.push(span()), Pushed::Full);
        assert_eq!(q.push(span()), Pushed::Queued);
        assert_eq!(q.push(span()), Pushed::Dropped);
        assert_eq!(q.dropped.load(Ordering::Relaxed), 1);
        assert_eq!(q.take().len(), 3);
        assert_eq!(q.push(span()), Pushed::Queued);
        // A batch is never larger than the queue, and never empty.
        let b = Batching::new(Duration::ZERO, 0, 512);
        assert_eq!((b.max_queue, b.batch, b.delay), (1, 1, MIN_DELAY));
        let b = Batching::new(Duration::from_millis(u64::MAX), 2048, 512);
        assert_eq!(b.delay, MAX_DELAY, "a delay the clock can add");
    }

    #[test]
    fn a_spans_times_are_read_against_the_wall_clock_of_its_batch() {
        let clock = Clock::now();
        let wall = |t| clock.now.duration_since(UNIX_EPOCH).unwrap().as_nanos() as u64 - t;
        let earlier = clock.at.checked_sub(Duration::from_millis(1500)).unwrap();
        assert_eq!(clock.unix_ns(earlier), wall(1_500_000_000));
        assert_eq!(clock.unix_ns(clock.at), wall(0));
    }

    /// A collector on loopback answering every post with `status`; it keeps the spans posted.
    fn collector(status: u16) -> (url::Url, Arc<Mutex<Vec<String>>>) {
        use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
        use prost::Message;
        use std::io::{BufRead, BufReader, Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/v1/traces", listener.local_addr().unwrap());
        let names: Arc<Mutex<Vec<String>>> = Arc::default();
        let kept = names.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let kept = kept.clone();
                std::thread::spawn(move || {
                    let mut reader = BufReader::new(stream.try_clone().unwrap());
                    let mut stream = stream;
                    loop {
                        let mut length = 0;
                        loop {
                            let mut line = String::new();
                            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                                return;
                            }
                            let lower = line.to_ascii_lowercase();
                            if let Some(n) = lower.strip_prefix("content-length:") {
                                length = n.trim().parse().unwrap();
                            }
                            if line == "\r\n" {
                                break;
                            }
                        }
                        let mut body = vec![0; length];
                        reader.read_exact(&mut body).unwrap();
                        let request = ExportTraceServiceRequest::decode(&body[..]).unwrap();
                        let spans = request.resource_spans.iter().flat_map(|r| &r.scope_spans);
                        let spans = spans.flat_map(|s| &s.spans).map(|s| s.name.clone());
                        kept.lock().unwrap().extend(spans);
                        let answer = format!("HTTP/1.1 {status} X\r\ncontent-length: 0\r\n\r\n");
                        stream.write_all(answer.as_bytes()).unwrap();
                    }
                });
            }
        });
        (url.parse().unwrap(), names)
    }

    #[test]
    fn spans_past_the_queue_are_dropped_and_counted_and_the_rest_sent_on_stop() {
        let (url, posted) = collector(200);
        let queue = Arc::new(Queue::new(Batching::new(Duration::from_secs(3600), 2, 2)));
        for method in ["ping", "initialize", "tools/list", "prompts/list"] {
            queue.push(Ended::for_test(method));
        }
        let exports = Arc::new(Exports::default());
        let sender = Sender {
            queue: queue.clone(),
            url,
            headers: Default::default(),
            exports: exports.clone(),
            batch: Batch::new(&[], "mcpmesh", "1"),
        };
        // Stopped before it runs: it sends what waits, counts what was dropped, and returns.
        queue.stop();
        sender.run();
        let report = exports.report();
        assert_eq!((report.sent, report.failed), (2, 2), "{report:?}");
        let error = report.last_error.unwrap_or_default();
        assert!(error.contains("2 spans were dropped"), "{error}");
        assert_eq!(*posted.lock().unwrap(), ["ping", "initialize"]);
    }

    #[test]
    fn a_collector_that_refuses_is_counted_with_its_answer() {
        let (url, _) = collector(503);
        let batching = Batching::new(Duration::from_millis(10), 100, 100);
        let traces = Traces::batched(&url, "node", batching).unwrap();
        traces.finished(&Traced::for_test("ping"));
        traces.shutdown();
        let report = traces.exports();
        assert_eq!((report.sent, report.failed), (0, 1), "{report:?}");
        let error = report.last_error.unwrap_or_default();
        assert!(error.contains("503"), "{error}");
    }

    #[test]
    fn headers_are_pairs_with_percent_encoded_values() {
        let h = headers_from("api-key=se%20cret, x-team = core ,bad, =nokey,sp ace=1");
        assert_eq!(h.get("api-key").unwrap(), "se cret");
        assert_eq!(h.get("x-team").unwrap(), "core");
        assert_eq!(h.len(), 2, "{h:?}");
    }
}
