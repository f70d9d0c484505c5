//! Refused connections, counted per key and written once a minute, and rosters refused from
//! peers, the first of each kind at once and the rest once a minute: a key's attempts reach
//! the audit log without a flood of them flooding it.

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
    /// Principal → (count, first seen, the org user whose removed device it is).
    keys: HashMap<String, (u64, u64, Option<String>)>,
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
        self.refused_from(principal, || None);
    }

    /// Counts one refused connection from `principal`, naming the org `user` whose removed
    /// device it is, when it is one.
    pub fn refused_from(
        &self,
        principal: impl FnOnce() -> String,
        user: impl FnOnce() -> Option<String>,
    ) {
        if let Some(metrics) = self.sink.metrics() {
            metrics.refused(Refusal::Trust, None);
        }
        if !self.sink.is_enabled() {
            return;
        }
        let now = now_ms();
        let mut w = self.window.lock().unwrap_or_else(|p| p.into_inner());
        let principal = principal();
        if let Some((count, _, _)) = w.keys.get_mut(&principal) {
            *count += 1;
        } else if w.keys.len() < KEYS_PER_MINUTE {
            w.keys.insert(principal, (1, now, user()));
        } else {
            w.others.get_or_insert((0, now)).0 += 1;
        }
    }

    /// Writes one record per key counted since the last flush (called once a minute, and
    /// when the node stops).
    pub fn flush(&self) {
        let window = std::mem::take(&mut *self.window.lock().unwrap_or_else(|p| p.into_inner()));
        let mut keys: Vec<_> = window.keys.into_iter().collect();
        keys.sort_by_key(|(_, (_, first, _))| *first);
        for (principal, (count, first_ms, user)) in keys {
            self.sink.record(AuditEvent::ConnectionsRefused {
                principal,
                count,
                first_ms,
                user,
            });
        }
        if let Some((count, first_ms)) = window.others {
            self.sink.record(AuditEvent::ConnectionsRefused {
                principal: "*".into(),
                count,
                first_ms,
                user: None,
            });
        }
    }
}

/// A roster refused from a peer: the first record of its minute is written at once.
#[derive(Debug)]
struct Repeats {
    from: String,
    message: String,
    count: u64,
}

/// Rosters refused from peers. The first refusal of each (sender, reason) in a minute is
/// recorded at once, so it is seen as it happens; the others of that minute are counted and
/// written as one record at [`RosterRefusals::flush`].
#[derive(Debug)]
pub struct RosterRefusals {
    sink: AuditSink,
    window: Mutex<RosterWindow>,
}

#[derive(Debug, Default)]
struct RosterWindow {
    /// (principal, reason) → the refusals after the first.
    seen: HashMap<(String, String), Repeats>,
    /// Refusals past the cap of senders, together.
    others: u64,
}

impl RosterRefusals {
    pub fn new(sink: AuditSink) -> Self {
        RosterRefusals {
            sink,
            window: Mutex::default(),
        }
    }

    /// A roster from `principal` (`eid:<hex>`, known here as `from`) refused for `reason`.
    pub fn refused(&self, principal: String, from: &str, reason: &str, message: String) {
        let mut w = self.window.lock().unwrap_or_else(|p| p.into_inner());
        let key = (principal, reason.to_owned());
        if let Some(repeats) = w.seen.get_mut(&key) {
            repeats.count += 1;
            repeats.message = message;
            return;
        }
        if w.seen.len() >= KEYS_PER_MINUTE {
            w.others += 1;
            return;
        }
        let (principal, reason) = key.clone();
        let repeats = Repeats {
            from: from.to_owned(),
            message: message.clone(),
            count: 0,
        };
        w.seen.insert(key, repeats);
        drop(w);
        self.sink.record(AuditEvent::RosterRefused {
            from: from.to_owned(),
            reason,
            message,
            principal: Some(principal),
            count: None,
        });
    }

    /// Writes what was counted since the last flush and starts a new minute.
    pub fn flush(&self) {
        let window = std::mem::take(&mut *self.window.lock().unwrap_or_else(|p| p.into_inner()));
        let mut repeated: Vec<_> = window
            .seen
            .into_iter()
            .filter(|(_, r)| r.count > 0)
            .collect();
        repeated.sort_by(|a, b| a.0.cmp(&b.0));
        for ((principal, reason), r) in repeated {
            self.sink.record(AuditEvent::RosterRefused {
                from: r.from,
                reason,
                message: r.message,
                principal: Some(principal),
                count: Some(r.count),
            });
        }
        if window.others > 0 {
            self.sink.record(AuditEvent::RosterRefused {
                from: "*".into(),
                reason: "*".into(),
                message: "rosters refused from more senders than are recorded one by one".into(),
                principal: Some("*".into()),
                count: Some(window.others),
            });
        }
    }
}
