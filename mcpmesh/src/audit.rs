//! The audit log: who opened which service, every request and how it ended, every trust
//! change — never arguments (only a BLAKE3 hash of them), never secrets.
//!
//! Records are queued by an [`AuditSink`] (never blocking the request path) and written by one
//! thread of their own, in batches gathered over at most 20 ms, to append-only JSONL files, one
//! per month. Each record carries the hash of
//! the previous one and a hash of itself, so [`verify`] finds an edited, deleted, inserted or
//! reordered record and names the first bad one. A head file keeps the last record's hash, so
//! even the newest record cannot be changed or dropped unnoticed.

use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::{broadcast, mpsc, oneshot};

/// Records queued for the writer; past this they are counted, and the count is itself logged.
const QUEUE: usize = 65_536;
/// The `prev` of the very first record.
const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";
const HEAD_FILE: &str = "audit.head";
/// How often the head is brought up to date while records keep coming.
const HEAD_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

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
        /// `ok`, `error` (with `code`), `tool_error`, `refused`, `rate_limited`, `unanswered`.
        outcome: String,
        #[serde(skip_serializing_if = "Option::is_none", default)]
        code: Option<i64>,
    },
    /// Over-limit notifications were dropped (recorded once per throttle episode).
    NotificationsThrottled {
        service: String,
        principal: String,
        peer: String,
    },
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
}

impl AuditEvent {
    /// The peer and service a record is about, for filtering.
    pub fn subject(&self) -> (Option<&str>, Option<&str>) {
        match self {
            AuditEvent::SessionOpen { peer, service, .. }
            | AuditEvent::SessionRefused { peer, service, .. }
            | AuditEvent::SessionClose { peer, service, .. }
            | AuditEvent::Request { peer, service, .. }
            | AuditEvent::NotificationsThrottled { peer, service, .. } => {
                (Some(peer), Some(service))
            }
            AuditEvent::Trust { peer, service, .. } => (peer.as_deref(), service.as_deref()),
            AuditEvent::RecordsDropped { .. } => (None, None),
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

/// Where audit records go. Clone freely; a disabled sink drops everything at no cost.
#[derive(Debug, Clone)]
pub struct AuditSink {
    tx: Option<mpsc::Sender<Message>>,
    dropped: std::sync::Arc<std::sync::atomic::AtomicU64>,
    live: Option<broadcast::Sender<std::sync::Arc<str>>>,
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
        }
    }

    /// Every record as it is written (its JSON line), for `watch`. `None` when disabled.
    pub fn subscribe(&self) -> Option<broadcast::Receiver<std::sync::Arc<str>>> {
        self.live.as_ref().map(broadcast::Sender::subscribe)
    }

    pub fn is_enabled(&self) -> bool {
        self.tx.is_some()
    }

    /// Queues an event without waiting. When the writer falls behind so far that the queue is
    /// full, the event is counted instead, and the count is logged as soon as there is room.
    pub fn record(&self, event: AuditEvent) {
        use std::sync::atomic::Ordering;
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

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
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
    /// Starts the writer over `dir` (created if needed), continuing the chain found there.
    /// `retain_months` deletes month files older than that many months.
    pub fn start(dir: PathBuf, retain_months: Option<u32>) -> std::io::Result<(Self, AuditSink)> {
        std::fs::create_dir_all(&dir)?;
        let head = read_head(&dir)?;
        let (tx, rx) = mpsc::channel(QUEUE);
        let (live, _) = broadcast::channel(LIVE_BACKLOG);
        let writer_live = live.clone();
        let thread = std::thread::Builder::new()
            .name("mcpmesh-audit".into())
            .spawn(move || write_loop(dir, head, retain_months, rx, writer_live))?;
        let sink = AuditSink {
            tx: Some(tx.clone()),
            dropped: Default::default(),
            live: Some(live),
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

/// The chain's position after the last record written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Head {
    seq: u64,
    hash: String,
}

fn read_head(dir: &Path) -> std::io::Result<Head> {
    match std::fs::read_to_string(dir.join(HEAD_FILE)) {
        Ok(text) => serde_json::from_str(&text)
            .map_err(|e| std::io::Error::other(format!("audit head: {e}"))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Head {
            seq: 0,
            hash: GENESIS.to_owned(),
        }),
        Err(e) => Err(e),
    }
}

/// Records sealed and appended per write.
const BATCH: usize = 1024;
/// How long the writer lets records gather once one has come. Under load it wakes at most
/// this often instead of once per request, and a record reaches the file at most this late; a
/// clean stop ([`AuditLog::close`]) writes everything queued.
const GATHER: std::time::Duration = std::time::Duration::from_millis(20);

fn write_loop(
    dir: PathBuf,
    mut head: Head,
    retain_months: Option<u32>,
    mut rx: mpsc::Receiver<Message>,
    live: broadcast::Sender<std::sync::Arc<str>>,
) {
    let mut batch = Vec::with_capacity(BATCH);
    let mut file: Option<(String, std::fs::File)> = None;
    let mut head_written = std::time::Instant::now();
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
        let mut out: BTreeMap<String, Vec<u8>> = BTreeMap::new();
        for msg in batch.drain(..) {
            match msg {
                Message::Event(boxed) => {
                    let (at_ms, event) = *boxed;
                    let record = AuditRecord {
                        seq: head.seq + 1,
                        at_ms,
                        event,
                        prev: head.hash.clone(),
                    };
                    let (line, hash) = seal(&record);
                    if live.receiver_count() > 0 {
                        let text = String::from_utf8_lossy(line.trim_ascii_end()).into_owned();
                        let _ = live.send(text.into());
                    }
                    head = Head {
                        seq: record.seq,
                        hash,
                    };
                    let month = month_of(at_ms);
                    out.entry(month).or_default().extend(line);
                }
                Message::Close(done) => closing = Some(done),
            }
        }
        for (month, bytes) in out {
            if let Err(e) = append(&dir, &month, &bytes, &mut file, retain_months) {
                tracing::error!("cannot write the audit log: {e}");
            }
        }
        // The head goes after the records it covers, so a crash leaves it lagging, never ahead;
        // and at most once a second, since every request makes a record.
        if closing.is_some() || head_written.elapsed() >= HEAD_EVERY {
            if let Some((_, f)) = &file
                && closing.is_some()
            {
                let _ = f.sync_all();
            }
            if let Err(e) = write_head(&dir, &head, closing.is_some()) {
                tracing::error!("cannot write the audit head: {e}");
            }
            head_written = std::time::Instant::now();
        }
        if let Some(done) = closing {
            let _ = done.send(());
            return;
        }
    }
}

/// Replaces the head file (write-new + rename); synced to disk only when `durable`.
fn write_head(dir: &Path, head: &Head, durable: bool) -> std::io::Result<()> {
    let bytes = serde_json::to_vec(head).map_err(std::io::Error::other)?;
    if durable {
        return crate::config::write_atomically(&dir.join(HEAD_FILE), &bytes);
    }
    let tmp = dir.join(format!(".{HEAD_FILE}.tmp"));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(tmp, dir.join(HEAD_FILE))
}

/// The record's line (newline included) and its hash. The line ends in `,"hash":"<hex>"}`,
/// the BLAKE3 of the same line without that member.
fn seal(record: &AuditRecord) -> (Vec<u8>, String) {
    let body = serde_json::to_vec(record).unwrap_or_default();
    let hash = blake3::hash(&body).to_hex().to_string();
    let mut line = body;
    line.pop(); // the closing brace
    line.extend_from_slice(format!(",\"hash\":\"{hash}\"}}\n").as_bytes());
    (line, hash)
}

/// Splits a sealed line into its body (as hashed) and the hash it claims.
fn unseal(line: &str) -> Option<(String, &str)> {
    const SUFFIX: usize = r#","hash":""#.len() + 64 + r#""}"#.len();
    let cut = line.len().checked_sub(SUFFIX)?;
    let (rest, tail) = (line.get(..cut)?, line.get(cut..)?);
    let hash = tail.strip_prefix(",\"hash\":\"")?.strip_suffix("\"}")?;
    (hash.len() == 64).then(|| (format!("{rest}}}"), hash))
}

fn month_of(at_ms: u64) -> String {
    let (year, month, _) = civil(at_ms);
    format!("{year:04}-{month:02}")
}

/// `2026-11-30 08:59:01` (UTC) for a Unix time in milliseconds.
pub fn format_time(at_ms: u64) -> String {
    let (year, month, day) = civil(at_ms);
    let secs = (at_ms / 1000) % 86_400;
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

/// The UTC calendar date of a Unix time in milliseconds (Howard Hinnant's algorithm).
fn civil(at_ms: u64) -> (i64, i64, i64) {
    let days = (at_ms / 86_400_000) as i64;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let day = doy - (153 * mp + 2) / 5 + 1;
    (year, month, day)
}

fn file_name(month: &str) -> String {
    format!("audit-{month}.jsonl")
}

fn append(
    dir: &Path,
    month: &str,
    bytes: &[u8],
    file: &mut Option<(String, std::fs::File)>,
    retain_months: Option<u32>,
) -> std::io::Result<()> {
    if file.as_ref().is_none_or(|(m, _)| m != month) {
        use std::os::unix::fs::OpenOptionsExt;
        let f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(dir.join(file_name(month)))?;
        if let Some((_, old)) = file.take() {
            let _ = old.sync_all();
        }
        *file = Some((month.to_owned(), f));
        if let Some(keep) = retain_months {
            prune(dir, month, keep);
        }
    }
    if let Some((_, f)) = file {
        f.write_all(bytes)?;
    }
    Ok(())
}

/// Deletes month files more than `keep` months older than `current`.
fn prune(dir: &Path, current: &str, keep: u32) {
    let index = |m: &str| -> Option<i64> {
        let (y, mo) = m.split_once('-')?;
        Some(y.parse::<i64>().ok()? * 12 + mo.parse::<i64>().ok()? - 1)
    };
    let Some(now) = index(current) else { return };
    for (month, path) in month_files(dir) {
        if index(&month).is_some_and(|i| now - i >= i64::from(keep.max(1))) {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// The log's month files, oldest first.
pub fn month_files(dir: &Path) -> Vec<(String, PathBuf)> {
    let mut files: Vec<(String, PathBuf)> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let month = name
                .strip_prefix("audit-")?
                .strip_suffix(".jsonl")?
                .to_owned();
            Some((month, e.path()))
        })
        .collect();
    files.sort();
    files
}

/// What `audit verify` found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VerifyReport {
    pub ok: bool,
    pub records: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_bad: Option<BadRecord>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BadRecord {
    pub file: String,
    pub line: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seq: Option<u64>,
    pub reason: String,
}

/// Checks the whole chain, across month files and against the head.
pub fn verify(dir: &Path) -> std::io::Result<VerifyReport> {
    let head = read_head(dir)?;
    let mut expected: Option<(u64, String)> = None; // (next seq, prev hash)
    let mut records = 0;
    // The head may lag behind the log (it is brought up to date once a second), but the
    // record it names must be in the chain, and the log must not end before it.
    let mut head_seen = head.seq == 0;
    let mut last = (0u64, GENESIS.to_owned(), String::new());
    for (_, path) in month_files(dir) {
        let shown = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let reader = std::io::BufReader::new(std::fs::File::open(&path)?);
        for (i, line) in reader.lines().enumerate() {
            let line = line?;
            let bad = |seq: Option<u64>, reason: &str| BadRecord {
                file: shown.clone(),
                line: i as u64 + 1,
                seq,
                reason: reason.to_owned(),
            };
            let report = |b: BadRecord| VerifyReport {
                ok: false,
                records,
                first_bad: Some(b),
            };
            let Some((body, claimed)) = unseal(&line) else {
                return Ok(report(bad(None, "not a sealed audit record")));
            };
            let Ok(record) = serde_json::from_str::<AuditRecord>(&body) else {
                return Ok(report(bad(None, "not an audit record")));
            };
            if blake3::hash(body.as_bytes()).to_hex().as_str() != claimed {
                return Ok(report(bad(Some(record.seq), "the record was altered")));
            }
            match &expected {
                // The oldest record kept anchors the chain (older months may have been pruned).
                None => {}
                Some((seq, _)) if record.seq < *seq => {
                    return Ok(report(bad(Some(record.seq), "out of order or inserted")));
                }
                Some((seq, _)) if record.seq > *seq => {
                    return Ok(report(bad(
                        Some(record.seq),
                        "records before this one are missing",
                    )));
                }
                Some((_, prev)) if &record.prev != prev => {
                    return Ok(report(bad(
                        Some(record.seq),
                        "the chain breaks here: an earlier record was replaced",
                    )));
                }
                Some(_) => {}
            }
            if record.seq == head.seq {
                if claimed != head.hash {
                    return Ok(report(bad(
                        Some(record.seq),
                        "the record was replaced (it differs from the one the head names)",
                    )));
                }
                head_seen = true;
            }
            records += 1;
            expected = Some((record.seq + 1, claimed.to_owned()));
            last = (record.seq, claimed.to_owned(), shown.clone());
        }
    }
    if !head_seen || head.seq > last.0 {
        return Ok(VerifyReport {
            ok: false,
            records,
            first_bad: Some(BadRecord {
                file: last.2,
                line: 0,
                seq: Some(head.seq),
                reason: format!(
                    "the log ends at record {} but record {} was written: its end was removed or changed",
                    last.0, head.seq
                ),
            }),
        });
    }
    Ok(VerifyReport {
        ok: true,
        records,
        first_bad: None,
    })
}

/// Every record in order, each as its JSON value (with `seq`, `at_ms`, `event`, …).
pub fn read_all(dir: &Path) -> std::io::Result<Vec<Value>> {
    let mut out = Vec::new();
    for (_, path) in month_files(dir) {
        let reader = std::io::BufReader::new(std::fs::File::open(&path)?);
        for line in reader.lines() {
            if let Ok(v) = serde_json::from_str::<Value>(&line?) {
                out.push(v);
            }
        }
    }
    Ok(out)
}

/// Per-peer or per-service totals for `audit summary`.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Totals {
    pub sessions: u64,
    pub requests: u64,
    pub errors: u64,
    pub refused: u64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub bytes_in: u64,
    pub bytes_out: u64,
    #[serde(skip)]
    latencies_us: Vec<u64>,
}

/// `audit summary`: totals per peer and per service over the records since `since_ms`.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Summary {
    pub since_ms: u64,
    pub records: u64,
    pub peers: BTreeMap<String, Totals>,
    pub services: BTreeMap<String, Totals>,
}

/// Sums up the records at or after `since_ms`.
pub fn summarize(records: &[Value], since_ms: u64) -> Summary {
    let mut summary = Summary {
        since_ms,
        ..Summary::default()
    };
    for v in records {
        if v["at_ms"].as_u64().unwrap_or(0) < since_ms {
            continue;
        }
        let (Some(peer), Some(service)) = (v["peer"].as_str(), v["service"].as_str()) else {
            continue;
        };
        summary.records += 1;
        for totals in [
            summary.peers.entry(peer.to_owned()).or_default(),
            summary.services.entry(service.to_owned()).or_default(),
        ] {
            match v["event"].as_str() {
                Some("session_open") => totals.sessions += 1,
                Some("session_refused") => totals.refused += 1,
                Some("request") => {
                    totals.requests += 1;
                    match v["outcome"].as_str() {
                        Some("ok") => {}
                        Some("refused" | "rate_limited") => totals.refused += 1,
                        _ => totals.errors += 1,
                    }
                    totals.bytes_in += v["bytes_in"].as_u64().unwrap_or(0);
                    totals.bytes_out += v["bytes_out"].as_u64().unwrap_or(0);
                    if v["outcome"] != "refused" && v["outcome"] != "rate_limited" {
                        totals
                            .latencies_us
                            .push(v["latency_us"].as_u64().unwrap_or(0));
                    }
                }
                _ => {}
            }
        }
    }
    for totals in summary
        .peers
        .values_mut()
        .chain(summary.services.values_mut())
    {
        totals.latencies_us.sort_unstable();
        let pick = |q: f64| -> f64 {
            let l = &totals.latencies_us;
            if l.is_empty() {
                return 0.0;
            }
            l[((l.len() - 1) as f64 * q).round() as usize] as f64 / 1000.0
        };
        totals.p50_ms = pick(0.50);
        totals.p99_ms = pick(0.99);
    }
    summary
}

/// Parses `30s`, `15m`, `24h`, `7d` (or a bare number of seconds).
pub fn parse_duration(text: &str) -> Option<std::time::Duration> {
    let text = text.trim();
    let (number, unit) = text.split_at(
        text.find(|c: char| !c.is_ascii_digit())
            .unwrap_or(text.len()),
    );
    let n: u64 = number.parse().ok()?;
    let secs = match unit {
        "" | "s" => n,
        "m" => n.checked_mul(60)?,
        "h" => n.checked_mul(3600)?,
        "d" => n.checked_mul(86_400)?,
        _ => return None,
    };
    Some(std::time::Duration::from_secs(secs))
}

/// Milliseconds since the Unix epoch, now.
pub fn unix_ms() -> u64 {
    now_ms()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_like_people_write_them() {
        assert_eq!(
            parse_duration("90"),
            Some(std::time::Duration::from_secs(90))
        );
        assert_eq!(
            parse_duration("15m"),
            Some(std::time::Duration::from_secs(900))
        );
        assert_eq!(
            parse_duration("7d"),
            Some(std::time::Duration::from_secs(604_800))
        );
        assert_eq!(parse_duration("7w"), None);
        assert_eq!(parse_duration("m"), None);
    }

    #[test]
    fn summaries_count_per_peer_and_service() {
        let rec = |event: &str, outcome: &str, latency: u64| {
            serde_json::json!({ "at_ms": 10, "event": event, "peer": "bob", "service": "svc",
                                "outcome": outcome, "latency_us": latency, "bytes_in": 5, "bytes_out": 7 })
        };
        let records = vec![
            rec("session_open", "", 0),
            rec("request", "ok", 1000),
            rec("request", "error", 3000),
            rec("request", "rate_limited", 0),
        ];
        let s = summarize(&records, 0);
        let bob = &s.peers["bob"];
        assert_eq!(
            (bob.sessions, bob.requests, bob.errors, bob.refused),
            (1, 3, 1, 1)
        );
        assert_eq!(bob.bytes_in, 15);
        assert_eq!(bob.p50_ms, 3.0);
        assert_eq!(s.services["svc"].requests, 3);
        assert_eq!(summarize(&records, 11).records, 0);
    }

    fn event(i: u64) -> AuditEvent {
        AuditEvent::Request {
            service: "svc".into(),
            principal: "eid:ab".into(),
            peer: "bob".into(),
            method: "tools/call".into(),
            name: Some(format!("tool{i}")),
            params_hash: Some(blake3::hash(b"{}").to_hex().to_string()),
            bytes_in: 10,
            bytes_out: 20,
            latency_us: 100,
            outcome: "ok".into(),
            code: None,
        }
    }

    async fn log_of(n: u64) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit");
        let (log, sink) = AuditLog::start(path.clone(), None).unwrap();
        for i in 0..n {
            sink.record(event(i));
        }
        log.close().await;
        (dir, path)
    }

    fn lines(path: &Path) -> (PathBuf, Vec<String>) {
        let (_, file) = month_files(path).pop().unwrap();
        let text = std::fs::read_to_string(&file).unwrap();
        (file, text.lines().map(str::to_owned).collect())
    }

    fn rewrite(file: &Path, lines: &[String]) {
        std::fs::write(
            file,
            lines.iter().map(|l| format!("{l}\n")).collect::<String>(),
        )
        .unwrap();
    }

    #[tokio::test]
    async fn an_untouched_log_verifies_and_continues_across_restarts() {
        let (_d, path) = log_of(5).await;
        let (log, sink) = AuditLog::start(path.clone(), None).unwrap();
        sink.record(event(9));
        log.close().await;
        let r = verify(&path).unwrap();
        assert!(r.ok, "{r:?}");
        assert_eq!(r.records, 6);
    }

    #[tokio::test]
    async fn an_edited_record_is_named() {
        let (_d, path) = log_of(5).await;
        let (file, mut l) = lines(&path);
        l[2] = l[2].replace("tool2", "toolX");
        rewrite(&file, &l);
        let bad = verify(&path).unwrap().first_bad.unwrap();
        assert_eq!((bad.line, bad.seq), (3, Some(3)), "{bad:?}");
    }

    #[tokio::test]
    async fn a_deleted_record_is_found() {
        let (_d, path) = log_of(5).await;
        let (file, mut l) = lines(&path);
        l.remove(1);
        rewrite(&file, &l);
        let bad = verify(&path).unwrap().first_bad.unwrap();
        assert_eq!(bad.seq, Some(3), "{bad:?}");
        assert!(bad.reason.contains("missing"));
    }

    #[tokio::test]
    async fn swapped_records_are_found() {
        let (_d, path) = log_of(5).await;
        let (file, mut l) = lines(&path);
        l.swap(1, 2);
        rewrite(&file, &l);
        let bad = verify(&path).unwrap().first_bad.unwrap();
        assert_eq!(bad.line, 2, "{bad:?}");
    }

    #[tokio::test]
    async fn a_dropped_last_record_is_found_through_the_head() {
        let (_d, path) = log_of(5).await;
        let (file, mut l) = lines(&path);
        l.pop();
        rewrite(&file, &l);
        assert!(!verify(&path).unwrap().ok);
    }

    #[tokio::test]
    async fn a_head_that_lags_after_a_crash_still_verifies() {
        let (_d, path) = log_of(3).await;
        let old_head = std::fs::read(path.join(HEAD_FILE)).unwrap();
        let (log, sink) = AuditLog::start(path.clone(), None).unwrap();
        sink.record(event(7));
        log.close().await;
        std::fs::write(path.join(HEAD_FILE), old_head).unwrap();
        let r = verify(&path).unwrap();
        assert!(r.ok, "{r:?}");
        assert_eq!(r.records, 4);
    }

    #[tokio::test]
    async fn retention_deletes_months_older_than_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit");
        std::fs::create_dir_all(&path).unwrap();
        for old in ["2001-01", "2001-02"] {
            std::fs::write(path.join(file_name(old)), "").unwrap();
        }
        let current = month_of(now_ms());
        let (log, sink) = AuditLog::start(path.clone(), Some(3)).unwrap();
        sink.record(event(1));
        log.close().await;
        let months: Vec<String> = month_files(&path).into_iter().map(|(m, _)| m).collect();
        assert_eq!(months, vec![current]);
    }

    #[test]
    fn months_are_utc_calendar_months() {
        assert_eq!(month_of(0), "1970-01");
        assert_eq!(month_of(1_764_460_800_000), "2025-11-30".get(..7).unwrap());
        assert_eq!(month_of(951_782_400_000), "2000-02"); // 2000-02-29
        assert_eq!(
            format_time(951_782_400_000 + 3_661_000),
            "2000-02-29 01:01:01"
        );
    }
}
