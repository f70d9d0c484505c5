//! The audit seam: sessions and requests become records, handed off the hot path.
//!
//! An [`AuditSink`] is a cheap handle that queues records for a writer task; recording never
//! waits on disk. The durable hash-chained JSONL writer plugs in behind [`AuditSink::channel`].

use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;
use tokio::sync::mpsc;

/// Records queued for the writer before new ones are dropped (and counted).
const QUEUE: usize = 4096;

/// One audit record. Never carries tool arguments or secrets.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AuditRecord {
    /// Unix time in milliseconds.
    pub at_ms: u64,
    #[serde(flatten)]
    pub event: AuditEvent,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
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
}

/// Where audit records go. Clone freely; a disabled sink drops everything at no cost.
#[derive(Debug, Clone)]
pub struct AuditSink {
    tx: Option<mpsc::Sender<AuditRecord>>,
}

impl AuditSink {
    /// A sink that records nothing.
    pub fn disabled() -> Self {
        AuditSink { tx: None }
    }

    /// A sink whose records arrive on the returned receiver, for a writer task to persist.
    pub fn channel() -> (Self, mpsc::Receiver<AuditRecord>) {
        let (tx, rx) = mpsc::channel(QUEUE);
        (AuditSink { tx: Some(tx) }, rx)
    }

    pub fn is_enabled(&self) -> bool {
        self.tx.is_some()
    }

    /// Queues a record without waiting. A full queue drops it with a warning: the request
    /// path never blocks on the audit writer.
    pub fn record(&self, event: AuditEvent) {
        let Some(tx) = &self.tx else { return };
        let at_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        if tx.try_send(AuditRecord { at_ms, event }).is_err() {
            tracing::warn!("audit queue full or closed; a record was dropped");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn records_reach_the_writer_and_serialize_without_surprises() {
        let (sink, mut rx) = AuditSink::channel();
        sink.record(AuditEvent::SessionOpen {
            service: "notes".into(),
            principal: "eid:ab".into(),
            peer: "bob".into(),
        });
        let rec = rx.recv().await.unwrap();
        let v = serde_json::to_value(&rec).unwrap();
        assert_eq!(v["event"], "session_open");
        assert_eq!(v["service"], "notes");
        assert!(v["at_ms"].as_u64().unwrap() > 0);
        AuditSink::disabled().record(rec.event);
    }
}
