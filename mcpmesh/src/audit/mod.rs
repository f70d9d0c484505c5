//! The audit log: who opened which service, every request and how it ended, every trust
//! change — never arguments (only a BLAKE3 hash of them), never secrets.
//!
//! Records are queued by an [`AuditSink`] (never blocking the request path) and written by one
//! thread of their own, in batches gathered over at most 20 ms, to append-only JSONL files, one
//! per month ([`chain`]). Each record carries the hash of the previous one and a hash of
//! itself, the chain starts at a genesis record, and a head file names the newest record, so
//! [`verify`] finds an edited, deleted, inserted or reordered record anywhere and names the
//! first bad one. The node's store keeps a high-water mark as well ([`HighWater`]), so a log
//! cut short with its head rewritten, or deleted with it, is found too. Reading ([`read`]) streams: nothing loads the whole log.

mod chain;
mod read;
mod refusals;

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use tokio::sync::{broadcast, mpsc, oneshot};

use crate::telemetry::{Metrics, Served, Traces};
use crate::time::unix_ms as now_ms;

pub use chain::{BadRecord, Head, HighWater, VerifyReport, month_files, verify};
pub use read::{Cursor, Summary, Totals, follow, summarize, tail};
pub use refusals::{RefusalTally, RosterRefusals};

/// Records queued for the writer; past this they are counted, and the count is itself logged.
const QUEUE: usize = 65_536;

/// One audit event. Never carries tool arguments or secrets.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum AuditEvent {
    SessionOpen {
        service: String,
        principal: String,
        peer: String,
    },
    SessionRefused {
        service: String,
        principal: String,
        peer: String,
        code: i64,
        /// Why, for the owner, when the server could not be started or reached.
        #[serde(skip_serializing_if = "Option::is_none", default)]
        reason: Option<String>,
    },
    SessionClose {
        service: String,
        principal: String,
        peer: String,
        duration_ms: u64,
        bytes_in: u64,
        bytes_out: u64,
        ended: String,
    },
    Request {
        service: String,
        principal: String,
        peer: String,
        method: String,
        /// The tool, prompt or resource the request names.
        #[serde(skip_serializing_if = "Option::is_none", default)]
        name: Option<String>,
        /// BLAKE3 of the raw `params` bytes; the params themselves are never recorded.
        #[serde(skip_serializing_if = "Option::is_none", default)]
        params_hash: Option<String>,
        bytes_in: u64,
        bytes_out: u64,
        latency_us: u64,
        /// `ok`, `error` (with `code`), `tool_error`, `refused`, `rate_limited`, `denied` (a
        /// tool the caller may not use, with `code` -32054), `unanswered`.
        outcome: String,
        #[serde(skip_serializing_if = "Option::is_none", default)]
        code: Option<i64>,
    },
    /// This node opened a session to a peer's service (for one of its own clients).
    OutgoingOpen { peer: String, service: String },
    /// A session this node opened to a peer ended: `ended` is `ok` when it ended the ordinary
    /// way, otherwise `failed` with the band's `code` and the `reason`.
    OutgoingClose {
        peer: String,
        service: String,
        duration_ms: u64,
        ended: String,
        #[serde(skip_serializing_if = "Option::is_none", default)]
        code: Option<i64>,
        #[serde(skip_serializing_if = "Option::is_none", default)]
        reason: Option<String>,
    },
    /// Over-limit notifications were dropped (recorded once per throttle episode).
    NotificationsThrottled {
        service: String,
        principal: String,
        peer: String,
    },
    /// A peer's catalog request refused (malformed, or past its rate), or a peer's answer to
    /// this node's request refused (over the cap, malformed; `reason` starts "its answer"):
    /// at most one record per peer a minute.
    CatalogRefused {
        principal: String,
        peer: String,
        reason: String,
    },
    /// Org gossip a member delivered, refused (malformed, naming a non-member) or dropped
    /// past its rate: at most one record per member a minute.
    GossipRefused { principal: String, reason: String },
    /// The queue overflowed and this many records were lost.
    RecordsDropped { count: u64 },
    /// A trust change: pair, unpair, grant, revoke, serve, unserve, peer added or removed.
    Trust {
        action: String,
        #[serde(skip_serializing_if = "Option::is_none", default)]
        peer: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none", default)]
        service: Option<String>,
    },
    /// A service's `allow`, tool rules or env changed, by a verb or by a hand edit the node
    /// reloaded: what it was and what it is. Env by its keys only, never a value.
    PolicyChanged {
        service: String,
        /// `allow`, `tools` or `env`.
        what: String,
        before: serde_json::Value,
        after: serde_json::Value,
        /// Env keys whose value changed (their values are not recorded).
        #[serde(skip_serializing_if = "Vec::is_empty", default)]
        changed: Vec<String>,
        /// `command` (a verb edited config.toml) or `reload` (config.toml edited by hand,
        /// read again at SIGHUP).
        by: String,
    },
    /// Connections from a key this node does not trust, refused before any byte was read:
    /// one record per key and minute. Past a cap of keys in one minute, the rest are summed
    /// into one record whose `principal` is `"*"`.
    ConnectionsRefused {
        principal: String,
        count: u64,
        /// When the first of them came (Unix ms).
        first_ms: u64,
        /// The org user whose removed device the key is, when the roster held says so.
        #[serde(skip_serializing_if = "Option::is_none", default)]
        user: Option<String>,
    },
    /// At start, the node cut off the end of a month file that was not a whole record (a line
    /// torn by a crash); what was cut is kept as its length and hash.
    AuditRepaired {
        file: String,
        cut_bytes: u64,
        cut_hash: String,
    },
    /// At start, the node found the log damaged (its head names records the log no longer
    /// holds, or the head is gone). `audit verify` fails at this record.
    AuditDamaged { reason: String },
    /// Retention deleted these months; the chain now starts at record `first_seq`, whose
    /// `prev` is `first_prev`.
    AuditPruned {
        months: Vec<String>,
        first_seq: u64,
        first_prev: String,
    },
    /// The node took a new org roster; `from` is `self` (signed here) or the peer it came
    /// from.
    RosterInstalled {
        org: String,
        serial: u64,
        from: String,
    },
    /// The node refused a roster: `reason` is one word (`bad_signature`, `stale`, `expired`,
    /// `not_yet_valid`, `other_org`, `invalid`, `malformed`, `too_large`, `no_org`). From a
    /// peer (`principal` its `eid:`), the first of each reason in a minute is recorded at once
    /// and the rest of that minute in one more record, with their `count`.
    RosterRefused {
        from: String,
        reason: String,
        message: String,
        #[serde(skip_serializing_if = "Option::is_none", default)]
        principal: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none", default)]
        count: Option<u64>,
    },
}

impl AuditEvent {
    /// The peer and service a record is about, for filtering.
    pub fn subject(&self) -> (Option<&str>, Option<&str>) {
        match self {
            AuditEvent::SessionOpen { peer, service, .. }
            | AuditEvent::SessionRefused { peer, service, .. }
            | AuditEvent::SessionClose { peer, service, .. }
            | AuditEvent::Request { peer, service, .. }
            | AuditEvent::NotificationsThrottled { peer, service, .. }
            | AuditEvent::OutgoingOpen { peer, service }
            | AuditEvent::OutgoingClose { peer, service, .. } => (Some(peer), Some(service)),
            AuditEvent::Trust { peer, service, .. } => (peer.as_deref(), service.as_deref()),
            AuditEvent::PolicyChanged { service, .. } => (None, Some(service)),
            AuditEvent::RecordsDropped { .. }
            | AuditEvent::ConnectionsRefused { .. }
            | AuditEvent::AuditRepaired { .. }
            | AuditEvent::AuditDamaged { .. }
            | AuditEvent::AuditPruned { .. }
            | AuditEvent::RosterRefused { .. } => (None, None),
            AuditEvent::RosterInstalled { from, .. } => (Some(from), None),
            AuditEvent::CatalogRefused { peer, .. } => (Some(peer), None),
            AuditEvent::GossipRefused { .. } => (None, None),
        }
    }
}

/// A record as written: the event with its place in the chain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditRecord {
    pub seq: u64,
    /// Unix time in milliseconds.
    pub at_ms: u64,
    #[serde(flatten)]
    pub event: AuditEvent,
    /// Hash of the previous record's line.
    pub prev: String,
}

enum Message {
    Event(Box<(u64, AuditEvent)>),
    Close(oneshot::Sender<()>),
}

/// Where audit records go. Clone freely; a disabled sink drops everything at no cost. With
/// metrics ([`AuditSink::with_metrics`]), each record is also counted there as it is queued;
/// with traces ([`AuditSink::with_traces`]), whoever records a request also makes its span.
#[derive(Debug, Clone)]
pub struct AuditSink {
    tx: Option<mpsc::Sender<Message>>,
    dropped: std::sync::Arc<std::sync::atomic::AtomicU64>,
    live: Option<broadcast::Sender<std::sync::Arc<str>>>,
    failures: Failures,
    metrics: Option<std::sync::Arc<Metrics>>,
    traces: Option<std::sync::Arc<Traces>>,
}

/// Each service's latest failure to start or reach its server, for `status`.
type Failures = std::sync::Arc<std::sync::Mutex<std::collections::HashMap<String, BackendFailure>>>;

/// A service's server could not be started or reached: when, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BackendFailure {
    pub at_ms: u64,
    pub peer: String,
    pub reason: String,
}

/// Records a watcher may fall behind by before it skips ahead.
const LIVE_BACKLOG: usize = 1024;

impl std::fmt::Debug for Message {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("audit message")
    }
}

impl AuditSink {
    /// A sink that records nothing.
    pub fn disabled() -> Self {
        AuditSink {
            tx: None,
            dropped: Default::default(),
            live: None,
            failures: Default::default(),
            metrics: None,
            traces: None,
        }
    }

    /// This sink, also counting every record in `metrics`.
    pub fn with_metrics(self, metrics: std::sync::Arc<Metrics>) -> Self {
        AuditSink {
            metrics: Some(metrics),
            ..self
        }
    }

    /// The node's metrics, when it keeps them, for what no record says.
    pub fn metrics(&self) -> Option<&std::sync::Arc<Metrics>> {
        self.metrics.as_ref()
    }

    /// This sink, with the node's tracer beside it.
    pub fn with_traces(self, traces: std::sync::Arc<Traces>) -> Self {
        AuditSink {
            traces: Some(traces),
            ..self
        }
    }

    /// The node's tracer, when it sends traces.
    pub fn traces(&self) -> Option<&std::sync::Arc<Traces>> {
        self.traces.as_ref()
    }

    /// Every record as it is written (its JSON line), for `watch`. `None` when disabled.
    pub fn subscribe(&self) -> Option<broadcast::Receiver<std::sync::Arc<str>>> {
        self.live.as_ref().map(broadcast::Sender::subscribe)
    }

    pub fn is_enabled(&self) -> bool {
        self.tx.is_some()
    }

    /// The latest time `service`'s server could not be started or reached, since it was
    /// last (re)served.
    pub fn last_failure(&self, service: &str) -> Option<BackendFailure> {
        self.failures_map().get(service).cloned()
    }

    /// Forgets `service`'s last failure (it was served anew).
    pub fn forget_failure(&self, service: &str) {
        self.failures_map().remove(service);
    }

    fn failures_map(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, BackendFailure>> {
        self.failures.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues an event without waiting. When the writer falls behind so far that the queue is
    /// full, the event is counted instead, and the count is logged as soon as there is room.
    pub fn record(&self, event: AuditEvent) {
        use std::sync::atomic::Ordering;
        if let AuditEvent::SessionRefused {
            service,
            peer,
            reason: Some(reason),
            ..
        } = &event
        {
            let failure = BackendFailure {
                at_ms: now_ms(),
                peer: peer.clone(),
                reason: reason.clone(),
            };
            self.failures_map().insert(service.clone(), failure);
        }
        if let Some(metrics) = &self.metrics {
            count(metrics, &event);
        }
        let Some(tx) = &self.tx else { return };
        let send = |event| {
            tx.try_send(Message::Event(Box::new((now_ms(), event))))
                .is_ok()
        };
        let dropped = self.dropped.swap(0, Ordering::Relaxed);
        if dropped > 0 && !send(AuditEvent::RecordsDropped { count: dropped }) {
            self.dropped.fetch_add(dropped, Ordering::Relaxed);
        }
        if !send(event) {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Counts what `event` records (the refusals of sessions are counted where their reason is
/// known, see [`crate::backends::session`]).
fn count(metrics: &Metrics, event: &AuditEvent) {
    match event {
        AuditEvent::Request {
            service,
            peer,
            method,
            name,
            bytes_in,
            bytes_out,
            latency_us,
            outcome,
            ..
        } => metrics.served(&Served {
            service,
            peer,
            method,
            tool: name.as_deref(),
            outcome,
            latency: std::time::Duration::from_micros(*latency_us),
            bytes_in: *bytes_in,
            bytes_out: *bytes_out,
        }),
        AuditEvent::SessionOpen { service, .. } => metrics.session_opened(service),
        AuditEvent::SessionClose {
            service,
            peer,
            duration_ms,
            ..
        } => metrics.session_closed(
            service,
            peer,
            std::time::Duration::from_millis(*duration_ms),
        ),
        AuditEvent::OutgoingClose {
            peer,
            service,
            duration_ms,
            ..
        } => metrics.dialed_session_closed(
            peer,
            service,
            std::time::Duration::from_millis(*duration_ms),
        ),
        _ => {}
    }
}

/// The running writer; [`AuditLog::close`] flushes everything queued before it.
///
/// The writer is a thread of its own, not a task: sealing and appending records is file I/O
/// and hashing that must never hold up the runtime the sessions' pumps run on (a slow disk
/// would otherwise stall every session), and on a multi-core machine it runs beside them.
#[derive(Debug)]
pub struct AuditLog {
    tx: mpsc::Sender<Message>,
    thread: std::thread::JoinHandle<()>,
}

impl AuditLog {
    /// Starts the writer over `dir` (created private if needed), continuing the chain from
    /// the last whole record on disk. `retain_months` deletes month files older than that.
    /// With `high_water`, the chain's high-water mark is kept there too, moved once per batch
    /// written, and a log found at start to fall short of it is recorded as damaged.
    pub fn start(
        dir: PathBuf,
        retain_months: Option<u32>,
        high_water: Option<std::sync::Arc<dyn HighWater>>,
    ) -> std::io::Result<(Self, AuditSink)> {
        let (mut writer, found) = chain::Writer::open(dir, retain_months, high_water)?;
        let now = now_ms();
        for event in &found {
            tracing::warn!("audit log: {}", describe(event));
        }
        writer.write(found.into_iter().map(|e| (now, e)), |_| {})?;
        let (tx, rx) = mpsc::channel(QUEUE);
        let (live, _) = broadcast::channel(LIVE_BACKLOG);
        let writer_live = live.clone();
        let thread = std::thread::Builder::new()
            .name("mcpmesh-audit".into())
            .spawn(move || write_loop(writer, rx, writer_live))?;
        let sink = AuditSink {
            tx: Some(tx.clone()),
            dropped: Default::default(),
            live: Some(live),
            failures: Default::default(),
            metrics: None,
            traces: None,
        };
        Ok((AuditLog { tx, thread }, sink))
    }

    /// Writes everything queued so far, syncs it to disk, and stops the writer.
    pub async fn close(self) {
        let (done, wait) = oneshot::channel();
        if self.tx.send(Message::Close(done)).await.is_ok() {
            let _ = wait.await;
        }
        // The writer returns right after answering; joining it cannot wait on anything else.
        let thread = self.thread;
        let _ = tokio::task::spawn_blocking(move || thread.join()).await;
    }
}

fn describe(event: &AuditEvent) -> String {
    match event {
        AuditEvent::AuditRepaired {
            file, cut_bytes, ..
        } => format!("cut {cut_bytes} bytes of a torn last line off the end of {file}"),
        AuditEvent::AuditDamaged { reason } => reason.clone(),
        _ => String::new(),
    }
}

/// Records sealed and appended per write.
const BATCH: usize = 1024;
/// How long the writer lets records gather once one has come. Under load it wakes at most
/// this often instead of once per request, and a record reaches the file at most this late; a
/// clean stop ([`AuditLog::close`]) writes everything queued.
const GATHER: std::time::Duration = std::time::Duration::from_millis(20);

fn write_loop(
    mut writer: chain::Writer,
    mut rx: mpsc::Receiver<Message>,
    live: broadcast::Sender<std::sync::Arc<str>>,
) {
    let mut batch = Vec::with_capacity(BATCH);
    let mut caught_up = true;
    loop {
        if caught_up {
            // Sleep until a record comes; senders wake this thread only then.
            let Some(first) = rx.blocking_recv() else {
                return;
            };
            let stop = matches!(first, Message::Close(_));
            batch.push(first);
            if !stop {
                std::thread::sleep(GATHER);
            }
        }
        while batch.len() < BATCH {
            match rx.try_recv() {
                Ok(msg) => batch.push(msg),
                Err(_) => break,
            }
        }
        caught_up = batch.len() < BATCH;
        let mut closing = None;
        let events: Vec<(u64, AuditEvent)> = batch
            .drain(..)
            .filter_map(|msg| match msg {
                Message::Event(boxed) => Some(*boxed),
                Message::Close(done) => {
                    closing = Some(done);
                    None
                }
            })
            .collect();
        // The head goes after the records it covers, so a crash leaves it lagging by one
        // batch at most, never ahead.
        let written = writer.write(events, |line| {
            if live.receiver_count() > 0 {
                let text = String::from_utf8_lossy(line.trim_ascii_end()).into_owned();
                let _ = live.send(text.into());
            }
        });
        if let Err(e) = written {
            tracing::error!("cannot write the audit log: {e}");
        }
        if let Some(done) = closing {
            if let Err(e) = writer.close() {
                tracing::error!("cannot sync the audit log: {e}");
            }
            let _ = done.send(());
            return;
        }
    }
}

#[cfg(test)]
mod tests;
