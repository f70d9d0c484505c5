//! Reading the log: records one line at a time, from a position, so `audit tail --follow`
//! reads only what was added and `audit summary` holds totals, never the records.

use std::collections::{BTreeMap, VecDeque};
use std::fs::File;
use std::io::{BufRead, Seek, SeekFrom};
use std::path::Path;

use serde::Serialize;
use serde_json::Value;

use super::chain::month_files;

/// A position in the log: a month file and a byte offset in it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Cursor {
    month: String,
    offset: u64,
}

/// Calls `each` with every whole record after `cursor` (each as its JSON value) and moves
/// the cursor past the last one. A line still being written is left for the next call.
pub fn follow(dir: &Path, cursor: &mut Cursor, mut each: impl FnMut(Value)) -> std::io::Result<()> {
    for (month, path) in month_files(dir) {
        if month < cursor.month {
            continue;
        }
        let offset = if month == cursor.month {
            cursor.offset
        } else {
            0
        };
        let mut file = match File::open(&path) {
            Ok(f) => f,
            // Pruned since it was listed.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        if file.metadata()?.len() < offset {
            // Cut shorter (a repaired torn line): read on from its new end.
            *cursor = Cursor {
                month,
                offset: file.metadata()?.len(),
            };
            continue;
        }
        file.seek(SeekFrom::Start(offset))?;
        let mut reader = std::io::BufReader::new(file);
        let mut at = offset;
        let mut line = Vec::new();
        loop {
            line.clear();
            let n = reader.read_until(b'\n', &mut line)?;
            if n == 0 || line.last() != Some(&b'\n') {
                break;
            }
            at += n as u64;
            if let Ok(v) = serde_json::from_slice::<Value>(&line) {
                each(v);
            }
        }
        *cursor = Cursor { month, offset: at };
    }
    Ok(())
}

/// The last `n` records that `wanted` keeps, oldest first, and the position after them.
pub fn tail(
    dir: &Path,
    n: usize,
    wanted: impl Fn(&Value) -> bool,
) -> std::io::Result<(Vec<Value>, Cursor)> {
    let mut kept = VecDeque::with_capacity(n.min(4096));
    let mut cursor = Cursor::default();
    follow(dir, &mut cursor, |v| {
        if n > 0 && wanted(&v) {
            if kept.len() == n {
                kept.pop_front();
            }
            kept.push_back(v);
        }
    })?;
    Ok((kept.into(), cursor))
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
    latencies: Latencies,
}

/// `audit summary`: totals per peer and per service over the records since `since_ms`.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Summary {
    pub since_ms: u64,
    pub records: u64,
    /// Connections refused because the key was not trusted.
    pub refused_connections: u64,
    pub peers: BTreeMap<String, Totals>,
    pub services: BTreeMap<String, Totals>,
}

impl Summary {
    pub fn new(since_ms: u64) -> Self {
        Summary {
            since_ms,
            ..Summary::default()
        }
    }

    /// Counts one record in.
    pub fn add(&mut self, v: &Value) {
        if v["at_ms"].as_u64().unwrap_or(0) < self.since_ms {
            return;
        }
        if v["event"] == "connections_refused" {
            self.records += 1;
            self.refused_connections += v["count"].as_u64().unwrap_or(0);
            return;
        }
        let (Some(peer), Some(service)) = (v["peer"].as_str(), v["service"].as_str()) else {
            return;
        };
        self.records += 1;
        for totals in [
            self.peers.entry(peer.to_owned()).or_default(),
            self.services.entry(service.to_owned()).or_default(),
        ] {
            match v["event"].as_str() {
                Some("session_open") => totals.sessions += 1,
                Some("session_refused") => totals.refused += 1,
                Some("request") => {
                    totals.requests += 1;
                    let refused = matches!(v["outcome"].as_str(), Some("refused" | "rate_limited"));
                    if refused {
                        totals.refused += 1;
                    } else if v["outcome"] != "ok" {
                        totals.errors += 1;
                    }
                    totals.bytes_in += v["bytes_in"].as_u64().unwrap_or(0);
                    totals.bytes_out += v["bytes_out"].as_u64().unwrap_or(0);
                    if !refused {
                        totals.latencies.add(v["latency_us"].as_u64().unwrap_or(0));
                    }
                }
                _ => {}
            }
        }
    }

    /// Works out the percentiles.
    pub fn finish(mut self) -> Self {
        for totals in self.peers.values_mut().chain(self.services.values_mut()) {
            totals.p50_ms = totals.latencies.quantile(0.50) as f64 / 1000.0;
            totals.p99_ms = totals.latencies.quantile(0.99) as f64 / 1000.0;
        }
        self
    }
}

/// Sums up the records at or after `since_ms`, reading the log once.
pub fn summarize(dir: &Path, since_ms: u64) -> std::io::Result<Summary> {
    let mut summary = Summary::new(since_ms);
    follow(dir, &mut Cursor::default(), |v| summary.add(&v))?;
    Ok(summary.finish())
}

/// Latencies in microseconds as a log-linear histogram: exact below 128 µs, within 1% above,
/// in a few kilobytes however many requests there were.
#[derive(Debug, Clone, Default, PartialEq)]
struct Latencies {
    buckets: BTreeMap<u16, u64>,
    count: u64,
}

/// Sub-buckets per power of two, as bits.
const SUB_BITS: u32 = 6;

impl Latencies {
    fn index(us: u64) -> u16 {
        let linear = 1u64 << (SUB_BITS + 1);
        if us < linear {
            return us as u16;
        }
        let exp = 63 - us.leading_zeros(); // >= SUB_BITS + 1
        let sub = (us >> (exp - SUB_BITS)) & ((1 << SUB_BITS) - 1);
        (linear + u64::from(exp - SUB_BITS - 1) * (1 << SUB_BITS) + sub) as u16
    }

    /// The middle of a bucket's range.
    fn value(index: u16) -> u64 {
        let linear = 1u64 << (SUB_BITS + 1);
        let index = u64::from(index);
        if index < linear {
            return index;
        }
        let exp = (index - linear) / (1 << SUB_BITS) + u64::from(SUB_BITS) + 1;
        let sub = (index - linear) % (1 << SUB_BITS);
        let width = 1u64 << (exp - u64::from(SUB_BITS));
        ((1 << SUB_BITS) + sub) * width + width / 2
    }

    fn add(&mut self, us: u64) {
        *self.buckets.entry(Self::index(us)).or_default() += 1;
        self.count += 1;
    }

    /// The latency at quantile `q`: the `round((n - 1) q)`-th smallest, to within 1%.
    fn quantile(&self, q: f64) -> u64 {
        if self.count == 0 {
            return 0;
        }
        let rank = ((self.count - 1) as f64 * q).round() as u64;
        let mut seen = 0;
        for (&index, &n) in &self.buckets {
            seen += n;
            if seen > rank {
                return Self::value(index);
            }
        }
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_quantiles_are_exact_when_small_and_within_a_percent_above() {
        let mut l = Latencies::default();
        for us in [5, 7, 9, 100] {
            l.add(us);
        }
        assert_eq!(l.quantile(0.0), 5);
        assert_eq!(l.quantile(1.0), 100);
        for us in [128u64, 1000, 3000, 123_456, 9_876_543_210] {
            let mut l = Latencies::default();
            l.add(us);
            let got = l.quantile(0.5) as f64;
            assert!((got - us as f64).abs() / us as f64 <= 0.01, "{us} -> {got}");
        }
    }

    #[test]
    fn summaries_count_per_peer_and_service() {
        let rec = |event: &str, outcome: &str, latency: u64| {
            serde_json::json!({ "at_ms": 10, "event": event, "peer": "bob", "service": "svc",
                                "outcome": outcome, "latency_us": latency, "bytes_in": 5, "bytes_out": 7 })
        };
        let records = [
            rec("session_open", "", 0),
            rec("request", "ok", 100),
            rec("request", "error", 120),
            rec("request", "rate_limited", 0),
            serde_json::json!({ "at_ms": 10, "event": "connections_refused", "principal": "eid:ab", "count": 7, "first_ms": 9 }),
        ];
        let mut s = Summary::new(0);
        records.iter().for_each(|r| s.add(r));
        let s = s.finish();
        let bob = &s.peers["bob"];
        assert_eq!(
            (bob.sessions, bob.requests, bob.errors, bob.refused),
            (1, 3, 1, 1)
        );
        assert_eq!(bob.bytes_in, 15);
        assert_eq!(bob.p50_ms, 0.12);
        assert_eq!(s.services["svc"].requests, 3);
        assert_eq!(s.refused_connections, 7);
        let mut later = Summary::new(11);
        records.iter().for_each(|r| later.add(r));
        assert_eq!(later.finish().records, 0);
    }
}
