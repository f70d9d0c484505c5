//! What the page shows, kept current: the node's state (asked of the daemon) with the newest
//! audit records and refusals, published anew when the audit log records something (gathered
//! over a moment, so a burst of requests costs one snapshot) and every few seconds for the
//! round-trip times, and only while a page is watching.

use std::collections::VecDeque;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;
use tokio::sync::broadcast::{self, error::RecvError, error::TryRecvError};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::StatusSource;
use crate::audit::{self, AuditSink};

/// Audit records of any kind the page shows.
const RECENT: usize = 50;
/// Refusals the page shows.
const REFUSALS: usize = 20;
/// How long records may gather before the page is sent a new state.
const GATHER: Duration = Duration::from_millis(150);
/// How often the page is sent a new state when nothing was recorded (round-trip times and
/// reachability move on their own).
const REFRESH: Duration = Duration::from_secs(5);

type Build = Arc<dyn Fn() -> Pin<Box<dyn Future<Output = Value> + Send>> + Send + Sync>;

pub(super) struct Feed {
    build: Build,
    records: Arc<Mutex<Records>>,
    changes: watch::Sender<Arc<str>>,
}

impl Feed {
    pub(super) fn start<S: StatusSource>(
        source: Arc<S>,
        audit: &AuditSink,
        audit_dir: PathBuf,
        stop: CancellationToken,
    ) -> Feed {
        let build: Build = Arc::new(move || {
            let source = source.clone();
            Box::pin(async move { source.snapshot().await })
        });
        let records = Arc::new(Mutex::new(Records::default()));
        let (changes, _) = watch::channel(Arc::from(""));
        let feed = Feed {
            build,
            records,
            changes,
        };
        // Subscribed before the log is read, so no record falls between the two.
        let live = audit.subscribe();
        tokio::spawn(feed.publisher().run(live, audit_dir, stop));
        feed
    }

    /// The state now.
    pub(super) async fn snapshot(&self) -> Value {
        snapshot(&self.build, &self.records).await
    }

    /// Every new state from now on.
    pub(super) fn subscribe(&self) -> watch::Receiver<Arc<str>> {
        self.changes.subscribe()
    }

    fn publisher(&self) -> Publisher {
        Publisher {
            build: self.build.clone(),
            records: self.records.clone(),
            changes: self.changes.clone(),
        }
    }
}

async fn snapshot(build: &Build, records: &Mutex<Records>) -> Value {
    let mut v = build().await;
    let (recent, refusals) = records.lock().unwrap_or_else(|p| p.into_inner()).to_json();
    if let Some(map) = v.as_object_mut() {
        map.insert("recent".into(), recent);
        map.insert("refusals".into(), refusals);
    }
    v
}

struct Publisher {
    build: Build,
    records: Arc<Mutex<Records>>,
    changes: watch::Sender<Arc<str>>,
}

impl Publisher {
    async fn run(
        self,
        mut live: Option<broadcast::Receiver<Arc<str>>>,
        audit_dir: PathBuf,
        stop: CancellationToken,
    ) {
        let seeded = tokio::task::spawn_blocking(move || Records::read(&audit_dir)).await;
        if let Ok(seeded) = seeded {
            self.records
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .absorb(seeded);
        }
        let mut every = tokio::time::interval(REFRESH);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = every.tick() => {}
                Some(record) = next_record(&mut live) => {
                    if let Some(line) = record {
                        self.add(&line);
                    }
                    tokio::time::sleep(GATHER).await;
                    self.drain(&mut live);
                }
            }
            if self.changes.receiver_count() == 0 {
                continue;
            }
            let state = snapshot(&self.build, &self.records).await.to_string();
            self.changes.send_replace(Arc::from(state));
        }
    }

    fn add(&self, line: &str) {
        self.records
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(line);
    }

    /// Takes every record that came meanwhile.
    fn drain(&self, live: &mut Option<broadcast::Receiver<Arc<str>>>) {
        let Some(rx) = live else { return };
        loop {
            match rx.try_recv() {
                Ok(line) => self.add(&line),
                Err(TryRecvError::Lagged(_)) => {}
                Err(TryRecvError::Empty) => return,
                Err(TryRecvError::Closed) => {
                    *live = None;
                    return;
                }
            }
        }
    }
}

/// The next audit record (`Some(None)` when some were missed: the state is sent anew all the
/// same); never, once the log is closed or the node records nothing.
async fn next_record(live: &mut Option<broadcast::Receiver<Arc<str>>>) -> Option<Option<Arc<str>>> {
    let Some(rx) = live else {
        return std::future::pending().await;
    };
    match rx.recv().await {
        Ok(line) => Some(Some(line)),
        Err(RecvError::Lagged(_)) => Some(None),
        Err(RecvError::Closed) => {
            *live = None;
            std::future::pending().await
        }
    }
}

/// The newest records, and the newest refusals among them, each with its sequence number.
#[derive(Debug, Default)]
struct Records {
    recent: VecDeque<(u64, Arc<str>)>,
    refusals: VecDeque<(u64, Arc<str>)>,
}

/// What decides where a record goes.
#[derive(Deserialize)]
struct Head<'a> {
    seq: u64,
    #[serde(borrow)]
    event: &'a str,
    #[serde(borrow, default)]
    outcome: Option<&'a str>,
}

impl Records {
    /// The newest records already in the log.
    fn read(dir: &std::path::Path) -> Records {
        let mut records = Records::default();
        let _ = audit::follow(dir, &mut audit::Cursor::default(), |v| {
            records.push(&v.to_string());
        });
        records
    }

    fn push(&mut self, line: &str) {
        let Ok(head) = serde_json::from_str::<Head>(line) else {
            return;
        };
        // A record both read from the log and received live is kept once.
        if self.recent.back().is_some_and(|(seq, _)| *seq >= head.seq) {
            return;
        }
        let refusal = matches!(
            head.event,
            "session_refused" | "connections_refused" | "roster_refused"
        ) || (head.event == "request"
            && matches!(head.outcome, Some("refused" | "rate_limited" | "denied")));
        let line: Arc<str> = Arc::from(line);
        keep(&mut self.recent, RECENT, (head.seq, line.clone()));
        if refusal {
            keep(&mut self.refusals, REFUSALS, (head.seq, line));
        }
    }

    /// Takes what was read from the log under what was received meanwhile.
    fn absorb(&mut self, older: Records) {
        let live = std::mem::replace(self, older);
        for (_, line) in live.recent {
            self.push(&line);
        }
    }

    fn to_json(&self) -> (Value, Value) {
        let parse = |q: &VecDeque<(u64, Arc<str>)>| {
            Value::Array(
                q.iter()
                    .filter_map(|(_, line)| serde_json::from_str(line).ok())
                    .collect(),
            )
        };
        (parse(&self.recent), parse(&self.refusals))
    }
}

fn keep<T>(queue: &mut VecDeque<T>, cap: usize, item: T) {
    if queue.len() == cap {
        queue.pop_front();
    }
    queue.push_back(item);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(seq: u64, event: &str, outcome: &str) -> String {
        format!(r#"{{"seq":{seq},"at_ms":1,"event":"{event}","outcome":"{outcome}"}}"#)
    }

    #[test]
    fn the_newest_records_and_refusals_are_kept_bounded_and_once() {
        let mut r = Records::default();
        for seq in 1..=200 {
            let outcome = if seq % 3 == 0 { "rate_limited" } else { "ok" };
            r.push(&line(seq, "request", outcome));
        }
        r.push(&line(150, "request", "denied"));
        r.push("not json");
        assert_eq!(r.recent.len(), RECENT);
        assert_eq!(r.recent.back().map(|x| x.0), Some(200));
        assert_eq!(r.refusals.len(), REFUSALS);
        assert!(r.refusals.iter().all(|(seq, _)| seq % 3 == 0));

        let mut live = Records::default();
        live.push(&line(199, "session_refused", ""));
        live.push(&line(201, "session_refused", ""));
        live.absorb(r);
        assert_eq!(live.recent.back().map(|x| x.0), Some(201));
        assert_eq!(live.recent.iter().filter(|x| x.0 == 199).count(), 1);
        assert_eq!(live.refusals.back().map(|x| x.0), Some(201));
    }
}
