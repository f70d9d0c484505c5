//! Refused connections, counted per key and written once a minute: an untrusted key's
//! attempts reach the audit log without a flood of them flooding it.

use std::collections::HashMap;
use std::sync::Mutex;

use super::{AuditEvent, AuditSink, now_ms};
use crate::telemetry::Refusal;

/// Distinct keys counted one by one in a minute; the rest are summed together.
const KEYS_PER_MINUTE: usize = 256;

/// The refusals of the current minute, until [`RefusalTally::flush`] writes them.
#[derive(Debug)]
pub struct RefusalTally {
    sink: AuditSink,
    window: Mutex<Window>,
}

#[derive(Debug, Default)]
struct Window {
    /// Principal → (count, first seen).
    keys: HashMap<String, (u64, u64)>,
    /// Keys past the cap, together: (count, first seen).
    others: Option<(u64, u64)>,
}

impl RefusalTally {
    pub fn new(sink: AuditSink) -> Self {
        RefusalTally {
            sink,
            window: Mutex::new(Window::default()),
        }
    }

    /// Counts one refused connection from `principal` (`eid:<hex>`).
    pub fn refused(&self, principal: impl FnOnce() -> String) {
        if let Some(metrics) = self.sink.metrics() {
            metrics.refused(Refusal::Trust, None);
        }
        if !self.sink.is_enabled() {
            return;
        }
        let now = now_ms();
        let mut w = self.window.lock().unwrap_or_else(|p| p.into_inner());
        let principal = principal();
        if let Some((count, _)) = w.keys.get_mut(&principal) {
            *count += 1;
        } else if w.keys.len() < KEYS_PER_MINUTE {
            w.keys.insert(principal, (1, now));
        } else {
            w.others.get_or_insert((0, now)).0 += 1;
        }
    }

    /// Writes one record per key counted since the last flush (called once a minute, and
    /// when the node stops).
    pub fn flush(&self) {
        let window = std::mem::take(&mut *self.window.lock().unwrap_or_else(|p| p.into_inner()));
        let mut keys: Vec<_> = window.keys.into_iter().collect();
        keys.sort_by_key(|(_, (_, first))| *first);
        for (principal, (count, first_ms)) in keys {
            self.sink.record(AuditEvent::ConnectionsRefused {
                principal,
                count,
                first_ms,
            });
        }
        if let Some((count, first_ms)) = window.others {
            self.sink.record(AuditEvent::ConnectionsRefused {
                principal: "*".into(),
                count,
                first_ms,
            });
        }
    }
}
