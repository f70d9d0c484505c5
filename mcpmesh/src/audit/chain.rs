//! The hash chain on disk: sealing records into month files, resuming after a crash, pruning
//! old months, and checking the whole chain.
//!
//! The writer always continues from the last sealed record *on disk*, never from the head
//! file: the head is only a witness of how far the log reached, written after the records it
//! covers. What the writer finds at start that is not a clean continuation — a torn last line
//! (repaired, and recorded), or a head that names records the log no longer has (recorded as
//! damage) — becomes a record of the chain itself, so the evidence outlives the restart.
//!
//! The head lives beside the log, so whoever cuts the log short can rewrite the head to match.
//! A second witness, the high-water mark ([`HighWater`]), is kept apart from the log (in the
//! node's store): the chain must reach it too.

use std::collections::HashSet;
use std::fs::File;
use std::io::{BufRead, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{AuditEvent, AuditRecord};
use crate::time::civil;

/// The `prev` of the very first record.
pub(super) const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";
pub(super) const HEAD_FILE: &str = "audit.head";
/// How far back from a file's end the writer looks for the last whole record at start.
const TAIL_WINDOW: u64 = 1 << 20;

/// The chain's position after a record: its seq, and its hash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Head {
    pub seq: u64,
    pub hash: String,
}

impl Head {
    fn genesis() -> Self {
        Head {
            seq: 0,
            hash: GENESIS.to_owned(),
        }
    }
}

/// Where the writer keeps the chain's high-water mark (the last record sealed and on disk), away
/// from the log's own files: a log cut short together with its head still falls short of it.
pub trait HighWater: Send + Sync + std::fmt::Debug {
    fn load(&self) -> Result<Option<Head>, String>;
    fn save(&self, mark: &Head) -> Result<(), String>;
}

/// The head file, if there is one.
fn read_head(dir: &Path) -> std::io::Result<Option<Head>> {
    match std::fs::read_to_string(dir.join(HEAD_FILE)) {
        Ok(text) => serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| std::io::Error::other(format!("the audit head is unreadable: {e}"))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Replaces the head file (write-new + rename, mode 0600); synced to disk only when `durable`.
fn write_head(dir: &Path, head: &Head, durable: bool) -> std::io::Result<()> {
    let bytes = serde_json::to_vec(head).map_err(std::io::Error::other)?;
    match durable {
        true => crate::files::write_atomically(&dir.join(HEAD_FILE), &bytes),
        false => crate::files::write_atomically_unsynced(&dir.join(HEAD_FILE), &bytes),
    }
}

/// The record's line (newline included) and its hash. The line ends in `,"hash":"<hex>"}`,
/// the BLAKE3 of the same line without that member.
pub(super) fn seal(record: &AuditRecord) -> (Vec<u8>, String) {
    let mut line = body_of(record);
    let hash = blake3::hash(&line).to_hex();
    line.pop(); // the closing brace
    line.extend_from_slice(b",\"hash\":\"");
    line.extend_from_slice(hash.as_bytes());
    line.extend_from_slice(b"\"}\n");
    (line, hash.to_string())
}

/// The record as `serde_json` writes it (the event flattened between `at_ms` and `prev`),
/// byte for byte — every hash in the chain depends on it — without serde's flattening, which
/// took half of the writer's time per record: the event, an object with its tag first, is
/// written on its own and its members spliced in.
fn body_of(record: &AuditRecord) -> Vec<u8> {
    use std::io::Write;
    let mut out = Vec::with_capacity(512);
    let _ = write!(out, "{{\"seq\":{},\"at_ms\":{},", record.seq, record.at_ms);
    let event_at = out.len();
    let written = serde_json::to_writer(&mut out, &record.event);
    if written.is_err() || out.len() < event_at + 2 || out.pop() != Some(b'}') {
        return serde_json::to_vec(record).unwrap_or_default();
    }
    out.remove(event_at); // the event's opening brace
    out.extend_from_slice(b",\"prev\":");
    let _ = serde_json::to_writer(&mut out, &record.prev);
    out.push(b'}');
    out
}

/// Splits a sealed line into its body (as hashed) and the hash it claims.
fn unseal(line: &str) -> Option<(String, &str)> {
    const SUFFIX: usize = r#","hash":""#.len() + 64 + r#""}"#.len();
    let cut = line.len().checked_sub(SUFFIX)?;
    let (rest, tail) = (line.get(..cut)?, line.get(cut..)?);
    let hash = tail.strip_prefix(",\"hash\":\"")?.strip_suffix("\"}")?;
    (hash.len() == 64).then(|| (format!("{rest}}}"), hash))
}

/// Why a line is not a good sealed record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Unsealed {
    NotSealed,
    NotARecord,
    Altered,
}

impl Unsealed {
    fn reason(self) -> &'static str {
        match self {
            Unsealed::NotSealed => "not a sealed audit record",
            Unsealed::NotARecord => "not an audit record",
            Unsealed::Altered => "the record was altered",
        }
    }
}

/// A line checked against its own seal: the record and the hash it rightly claims.
fn open_line(line: &str) -> Result<(AuditRecord, String), (Unsealed, Option<u64>)> {
    let (body, claimed) = unseal(line).ok_or((Unsealed::NotSealed, None))?;
    let record: AuditRecord =
        serde_json::from_str(&body).map_err(|_| (Unsealed::NotARecord, None))?;
    if blake3::hash(body.as_bytes()).to_hex().as_str() != claimed {
        return Err((Unsealed::Altered, Some(record.seq)));
    }
    Ok((record, claimed.to_owned()))
}

pub(super) fn month_of(at_ms: u64) -> String {
    let (year, month, _) = civil(at_ms);
    format!("{year:04}-{month:02}")
}

pub(super) fn file_name(month: &str) -> String {
    format!("audit-{month}.jsonl")
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

fn month_index(month: &str) -> Option<i64> {
    let (y, mo) = month.split_once('-')?;
    Some(y.parse::<i64>().ok()? * 12 + mo.parse::<i64>().ok()? - 1)
}

/// Appends sealed records to the month files, continuing the chain found on disk.
#[derive(Debug)]
pub(super) struct Writer {
    dir: PathBuf,
    head: Head,
    file: Option<(String, File)>,
    retain_months: Option<u32>,
    high_water: Option<Arc<dyn HighWater>>,
    /// The mark last saved, so a batch that sealed nothing saves nothing.
    marked: Option<Head>,
}

/// The last whole record of the log, found from the end.
struct LastRecord {
    seq: u64,
    hash: String,
    /// Hashes of the records read on the way, by seq, to check a lagging head against.
    seen: Vec<(u64, String)>,
}

impl Writer {
    /// Opens the chain in `dir` (created private if needed). Returns the writer and what it
    /// found that must be recorded before anything else: a repaired torn end, or damage.
    pub fn open(
        dir: PathBuf,
        retain_months: Option<u32>,
        high_water: Option<Arc<dyn HighWater>>,
    ) -> std::io::Result<(Self, Vec<AuditEvent>)> {
        std::fs::create_dir_all(&dir)?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
        let mut found = Vec::new();
        let mut unreadable = false;
        let head = read_head(&dir).unwrap_or_else(|e| {
            unreadable = true;
            found.push(AuditEvent::AuditDamaged {
                reason: e.to_string(),
            });
            None
        });
        let last = last_record(&dir, &mut found)?;
        let position = resume_point(head.as_ref(), last.as_ref(), unreadable, &mut found);
        let marked = load_mark(high_water.as_deref());
        if let Some(mark) = marked.as_ref().filter(|_| found.is_empty()) {
            found.extend(check_mark(mark, last.as_ref()));
        }
        // The head exists from the start, so a log without one is a log someone changed.
        write_head(&dir, &position, true)?;
        Ok((
            Writer {
                dir,
                head: position,
                file: None,
                retain_months,
                high_water,
                marked,
            },
            found,
        ))
    }

    /// Seals `events` into the chain and appends them; `each` sees every sealed line.
    pub fn write(
        &mut self,
        events: impl IntoIterator<Item = (u64, AuditEvent)>,
        mut each: impl FnMut(&[u8]),
    ) -> std::io::Result<()> {
        let mut pending: Vec<u8> = Vec::new();
        for (at_ms, event) in events {
            // Records never go back to an older month file (a clock set back): the files'
            // order is the chain's order.
            let mut month = month_of(at_ms);
            if let Some((current, _)) = &self.file
                && *current > month
            {
                month = current.clone();
            }
            if self.file.as_ref().is_none_or(|(m, _)| *m != month) {
                self.flush(&mut pending)?;
                self.switch_to(&month, &mut each)?;
            }
            pending.extend(self.seal_next(at_ms, event, &mut each));
        }
        self.flush(&mut pending)?;
        write_head(&self.dir, &self.head, false)?;
        self.save_mark()
    }

    /// Syncs the current file and writes the head durably.
    pub fn close(&mut self) -> std::io::Result<()> {
        if let Some((_, f)) = &self.file {
            f.sync_all()?;
        }
        write_head(&self.dir, &self.head, true)?;
        self.save_mark()
    }

    /// Moves the high-water mark to the last record sealed, once it is on disk: the mark never
    /// names a record a power cut could still take away.
    fn save_mark(&mut self) -> std::io::Result<()> {
        let Some(high_water) = &self.high_water else {
            return Ok(());
        };
        if self.marked.as_ref() == Some(&self.head) {
            return Ok(());
        }
        if let Some((_, f)) = &self.file {
            f.sync_data()?;
        }
        high_water
            .save(&self.head)
            .map_err(|e| std::io::Error::other(format!("cannot keep the high-water mark: {e}")))?;
        self.marked = Some(self.head.clone());
        Ok(())
    }

    fn seal_next(
        &mut self,
        at_ms: u64,
        event: AuditEvent,
        each: &mut impl FnMut(&[u8]),
    ) -> Vec<u8> {
        let record = AuditRecord {
            seq: self.head.seq + 1,
            at_ms,
            event,
            prev: self.head.hash.clone(),
        };
        let (line, hash) = seal(&record);
        each(&line);
        self.head = Head {
            seq: record.seq,
            hash,
        };
        line
    }

    fn flush(&mut self, pending: &mut Vec<u8>) -> std::io::Result<()> {
        if let (false, Some((_, f))) = (pending.is_empty(), &mut self.file) {
            f.write_all(pending)?;
        }
        pending.clear();
        Ok(())
    }

    /// Opens `month`'s file and, when retention says so, deletes older months — after a
    /// record that says where the chain now starts is safely on disk.
    fn switch_to(&mut self, month: &str, each: &mut impl FnMut(&[u8])) -> std::io::Result<()> {
        let f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(self.dir.join(file_name(month)))?;
        if let Some((_, old)) = self.file.take() {
            old.sync_all()?;
        }
        self.file = Some((month.to_owned(), f));
        let Some(keep) = self.retain_months else {
            return Ok(());
        };
        let Some(now) = month_index(month) else {
            return Ok(());
        };
        let (old, kept): (Vec<_>, Vec<_>) = month_files(&self.dir)
            .into_iter()
            .partition(|(m, _)| month_index(m).is_some_and(|i| now - i >= i64::from(keep.max(1))));
        if old.is_empty() {
            return Ok(());
        }
        // The chain now starts at the first record of the oldest month kept, or, when no
        // older record is kept, at the record that says so.
        let first = kept
            .iter()
            .find_map(|(_, path)| first_record(path))
            .unwrap_or((self.head.seq + 1, self.head.hash.clone()));
        let event = AuditEvent::AuditPruned {
            months: old.iter().map(|(m, _)| m.clone()).collect(),
            first_seq: first.0,
            first_prev: first.1,
        };
        let mut line = self.seal_next(crate::time::unix_ms(), event, each);
        self.flush(&mut line)?;
        if let Some((_, f)) = &self.file {
            f.sync_all()?;
        }
        write_head(&self.dir, &self.head, true)?;
        for (_, path) in old {
            std::fs::remove_file(path)?;
        }
        Ok(())
    }
}

/// Where the chain continues: after the last record on disk, checked against the head file
/// (`head_unreadable`: there was one, but it could not be read). What does not agree is noted
/// in `found` as damage.
fn resume_point(
    head: Option<&Head>,
    last: Option<&LastRecord>,
    head_unreadable: bool,
    found: &mut Vec<AuditEvent>,
) -> Head {
    match (head, last) {
        (None, None) => Head::genesis(),
        (Some(h), None) => {
            if h.seq > 0 {
                found.push(AuditEvent::AuditDamaged {
                    reason: format!(
                        "the head named record {} but the log holds no record",
                        h.seq
                    ),
                });
            }
            h.clone()
        }
        (None, Some(l)) => {
            if !head_unreadable {
                found.push(AuditEvent::AuditDamaged {
                    reason: format!(
                        "{HEAD_FILE} was missing; the log was resumed after record {}",
                        l.seq
                    ),
                });
            }
            Head {
                seq: l.seq,
                hash: l.hash.clone(),
            }
        }
        (Some(h), Some(l)) => {
            if h.seq > l.seq {
                found.push(AuditEvent::AuditDamaged {
                    reason: format!(
                        "the head named record {} but the log ended at record {}: records were removed",
                        h.seq, l.seq
                    ),
                });
            } else if l
                .seen
                .iter()
                .any(|(seq, hash)| *seq == h.seq && *hash != h.hash)
            {
                found.push(AuditEvent::AuditDamaged {
                    reason: format!(
                        "record {} differs from the one the head named: it was replaced",
                        h.seq
                    ),
                });
            }
            Head {
                seq: l.seq,
                hash: l.hash.clone(),
            }
        }
    }
}

/// The high-water mark kept in the node's store, if there is one and it can be read.
fn load_mark(high_water: Option<&dyn HighWater>) -> Option<Head> {
    match high_water.map(|h| h.load()) {
        Some(Ok(mark)) => mark,
        Some(Err(e)) => {
            tracing::warn!("cannot read the audit log's high-water mark: {e}");
            None
        }
        None => None,
    }
}

/// The damage the high-water `mark` reveals in a log that ends at `last`: records removed
/// past it, or the record it names replaced.
fn check_mark(mark: &Head, last: Option<&LastRecord>) -> Option<AuditEvent> {
    let reached = match last {
        Some(l) => l.seq,
        None => 0,
    };
    if mark.seq > reached {
        Some(AuditEvent::AuditDamaged {
            reason: format!(
                "the node's store says record {} was written but the log ends at record {reached}: records were removed",
                mark.seq
            ),
        })
    } else if last.is_some_and(|l| {
        l.seen
            .iter()
            .any(|(seq, hash)| *seq == mark.seq && *hash != mark.hash)
    }) {
        Some(AuditEvent::AuditDamaged {
            reason: format!(
                "record {} differs from the one the node's store names: it was replaced",
                mark.seq
            ),
        })
    } else {
        None
    }
}

/// The `(seq, prev)` of the first record in `path`.
fn first_record(path: &Path) -> Option<(u64, String)> {
    let mut line = String::new();
    std::io::BufReader::new(File::open(path).ok()?)
        .read_line(&mut line)
        .ok()?;
    let (record, _) = open_line(line.trim_end_matches('\n')).ok()?;
    Some((record.seq, record.prev))
}

/// Finds the last whole sealed record, newest file first, cutting off what follows it (a
/// line torn by a crash) and noting each cut in `found`.
fn last_record(dir: &Path, found: &mut Vec<AuditEvent>) -> std::io::Result<Option<LastRecord>> {
    for (_, path) in month_files(dir).into_iter().rev() {
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)?;
        let len = file.metadata()?.len();
        if len == 0 {
            continue;
        }
        let start = len.saturating_sub(TAIL_WINDOW);
        file.seek(SeekFrom::Start(start))?;
        let mut window = Vec::new();
        file.read_to_end(&mut window)?;
        let mut ends: Vec<usize> = window
            .iter()
            .enumerate()
            .filter(|(_, b)| **b == b'\n')
            .map(|(i, _)| i + 1)
            .collect();
        // Whole lines only: a window that starts inside a line skips to the next one.
        let first_start = if start == 0 || ends.is_empty() {
            0
        } else {
            ends.remove(0)
        };
        let mut seen = Vec::new();
        let mut good: Option<(usize, u64, String)> = None;
        for (k, &end) in ends.iter().enumerate().rev() {
            let begin = if k == 0 { first_start } else { ends[k - 1] };
            let text = String::from_utf8_lossy(&window[begin..end - 1]);
            if let Ok((record, hash)) = open_line(&text) {
                seen.push((record.seq, hash.clone()));
                if good.is_none() {
                    good = Some((end, record.seq, hash));
                }
                if seen.len() > 1024 {
                    break;
                }
            } else if good.is_some() {
                break;
            }
        }
        let keep = match &good {
            Some((end, _, _)) => start + *end as u64,
            None if start == 0 => 0,
            None => {
                return Err(std::io::Error::other(format!(
                    "the end of {} holds no audit record; move the file away to start a new log",
                    path.display()
                )));
            }
        };
        if keep < len {
            let cut = &window[(keep - start) as usize..];
            found.push(AuditEvent::AuditRepaired {
                file: path
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default(),
                cut_bytes: cut.len() as u64,
                cut_hash: blake3::hash(cut).to_hex().to_string(),
            });
            file.set_len(keep)?;
            file.sync_all()?;
        }
        if let Some((_, seq, hash)) = good {
            return Ok(Some(LastRecord { seq, hash, seen }));
        }
    }
    Ok(None)
}

/// What `audit verify` found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VerifyReport {
    pub ok: bool,
    pub records: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_bad: Option<BadRecord>,
    /// Repairs the node made at start (a torn last line cut off after a crash): not damage,
    /// but part of the record.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub repairs: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BadRecord {
    pub file: String,
    pub line: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seq: Option<u64>,
    pub reason: String,
}

/// Where a record stands in the files.
#[derive(Debug, Clone)]
struct Place {
    file: String,
    line: u64,
    seq: u64,
}

impl Place {
    fn bad(&self, reason: impl Into<String>) -> BadRecord {
        BadRecord {
            file: self.file.clone(),
            line: self.line,
            seq: Some(self.seq),
            reason: reason.into(),
        }
    }
}

/// Checks the whole chain, across month files and against the head: it must start at the
/// genesis record (or where a recorded prune says), run without a gap, and reach the record
/// the head names, and the one the high-water `mark` names when there is one. Reads one line
/// at a time.
pub fn verify(dir: &Path, mark: Option<&Head>) -> std::io::Result<VerifyReport> {
    let head = read_head(dir);
    let mut walk = Walk::new(head.as_ref().ok().and_then(Option::as_ref), mark);
    let mut verdict = Ok(());
    for (_, path) in month_files(dir) {
        verdict = walk.read_file(&path)?;
        if verdict.is_err() {
            break;
        }
    }
    let verdict = verdict.and_then(|()| walk.check_end(&head));
    Ok(VerifyReport {
        ok: verdict.is_ok(),
        records: walk.records,
        first_bad: verdict.err(),
        repairs: walk.repairs,
    })
}

/// The chain as `verify` has read it so far, and the witnesses its records must agree with:
/// the head file's record and the high-water mark's.
struct Walk<'a> {
    head: Option<&'a Head>,
    mark: Option<&'a Head>,
    records: u64,
    repairs: Vec<String>,
    /// The first record read, and the `prev` it names.
    first: Option<(Place, String)>,
    /// The last record read, and its hash.
    last: Option<(Place, String)>,
    /// Where recorded prunes say the chain may start: `(first_seq, first_prev)`.
    starts: HashSet<(u64, String)>,
    head_seen: bool,
    mark_seen: bool,
}

impl<'a> Walk<'a> {
    fn new(head: Option<&'a Head>, mark: Option<&'a Head>) -> Self {
        Walk {
            head,
            mark,
            records: 0,
            repairs: Vec::new(),
            first: None,
            last: None,
            starts: HashSet::new(),
            head_seen: false,
            mark_seen: false,
        }
    }

    /// Reads one month file a line at a time, up to its end or its first bad record.
    fn read_file(&mut self, path: &Path) -> std::io::Result<Result<(), BadRecord>> {
        let shown = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let mut reader = std::io::BufReader::new(File::open(path)?);
        let mut line = String::new();
        let mut number = 0;
        loop {
            line.clear();
            if reader.read_line(&mut line)? == 0 {
                return Ok(Ok(()));
            }
            number += 1;
            let whole = line.ends_with('\n');
            let text = line.trim_end_matches('\n');
            let (record, hash) = match open_line(text) {
                Ok(ok) => ok,
                Err((why, seq)) => {
                    let reason = if whole {
                        why.reason().to_owned()
                    } else {
                        "the last line is cut off (a crash mid-write: the node cuts it off and records that when it next starts)".to_owned()
                    };
                    return Ok(Err(BadRecord {
                        file: shown,
                        line: number,
                        seq,
                        reason,
                    }));
                }
            };
            let place = Place {
                file: shown.clone(),
                line: number,
                seq: record.seq,
            };
            let step = self.advance(place, &record, hash);
            if step.is_err() {
                return Ok(step);
            }
        }
    }

    /// Takes in one record, sealed as it claims: it must follow the last one, agree with the
    /// witnesses, and not be a record of damage.
    fn advance(
        &mut self,
        place: Place,
        record: &AuditRecord,
        hash: String,
    ) -> Result<(), BadRecord> {
        self.check_link(&place, record)?;
        self.check_witnesses(&place, &hash)?;
        match &record.event {
            AuditEvent::AuditDamaged { reason } => {
                return Err(place.bad(format!("the node found the log damaged when it started: {reason}")));
            }
            AuditEvent::AuditRepaired {
                file, cut_bytes, ..
            } => self.repairs.push(format!(
                "record {}: {cut_bytes} bytes of a line cut off by a crash were removed from the end of {file}",
                record.seq
            )),
            AuditEvent::AuditPruned {
                first_seq,
                first_prev,
                ..
            } => {
                self.starts.insert((*first_seq, first_prev.clone()));
            }
            _ => {}
        }
        self.records += 1;
        if self.first.is_none() {
            self.first = Some((place.clone(), record.prev.clone()));
        }
        self.last = Some((place, hash));
        Ok(())
    }

    /// The record comes right after the last one read, and names its hash.
    fn check_link(&self, place: &Place, record: &AuditRecord) -> Result<(), BadRecord> {
        let Some((before, prev)) = &self.last else {
            return Ok(());
        };
        if record.seq <= before.seq {
            return Err(place.bad("out of order or inserted"));
        }
        if record.seq > before.seq + 1 {
            return Err(place.bad("records before this one are missing"));
        }
        if record.prev != *prev {
            return Err(place.bad("the chain breaks here: an earlier record was replaced"));
        }
        Ok(())
    }

    /// The record at the head's seq, or the mark's, is the one it names.
    fn check_witnesses(&mut self, place: &Place, hash: &str) -> Result<(), BadRecord> {
        if let Some(h) = self.head
            && h.seq == place.seq
        {
            if h.hash != hash {
                return Err(
                    place.bad("the record was replaced (it differs from the one the head names)")
                );
            }
            self.head_seen = true;
        }
        if let Some(m) = self.mark
            && m.seq == place.seq
        {
            if m.hash != hash {
                return Err(place.bad(
                    "the record was replaced (it differs from the one the node's store names)",
                ));
            }
            self.mark_seen = true;
        }
        Ok(())
    }

    /// After the last record: the head could be read, the chain starts where it may, and it
    /// reaches the records the head and the mark name.
    fn check_end(&self, head: &std::io::Result<Option<Head>>) -> Result<(), BadRecord> {
        if let Err(e) = head {
            let at = self.last.as_ref().map(|(p, _)| p.bad(e.to_string()));
            return Err(at.unwrap_or_else(|| no_record(e.to_string())));
        }
        let (Some((first, first_prev)), Some((last, _))) = (&self.first, &self.last) else {
            return self.check_empty();
        };
        let genesis = first.seq == 1 && first_prev == GENESIS;
        if !genesis && !self.starts.contains(&(first.seq, first_prev.clone())) {
            return Err(first.bad("records before this one are missing: the log must start at record 1 or where a recorded prune says"));
        }
        let Some(head) = self.head else {
            return Err(last.bad(format!(
                "{HEAD_FILE} is missing, so the end of the log cannot be checked"
            )));
        };
        if head.seq > last.seq || (head.seq >= first.seq && !self.head_seen) {
            return Err(last.bad(format!(
                "the log ends at record {} but record {} was written: its end was removed or changed",
                last.seq, head.seq
            )));
        }
        if let Some(m) = self.mark
            && (m.seq > last.seq || (m.seq >= first.seq && !self.mark_seen))
        {
            return Err(last.bad(format!(
                "the log ends at record {} but the node's store says record {} was written: its end was removed (and its head rewritten to match)",
                last.seq, m.seq
            )));
        }
        Ok(())
    }

    /// A log without a record is whole only if neither witness names a record written.
    fn check_empty(&self) -> Result<(), BadRecord> {
        match (self.head, self.mark) {
            (Some(h), _) if h.seq > 0 => Err(no_record(format!(
                "the log holds no record but record {} was written",
                h.seq
            ))),
            (_, Some(m)) if m.seq > 0 => Err(no_record(format!(
                "the log holds no record but the node's store says record {} was written: the log was removed",
                m.seq
            ))),
            _ => Ok(()),
        }
    }
}

fn no_record(reason: String) -> BadRecord {
    BadRecord {
        file: String::new(),
        line: 0,
        seq: None,
        reason,
    }
}
