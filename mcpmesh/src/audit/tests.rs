use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::chain::{GENESIS, HEAD_FILE, Writer, file_name, month_of};
use super::*;

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

async fn append(path: &Path, from: u64, n: u64) {
    let (log, sink) = AuditLog::start(path.to_owned(), None, None).unwrap();
    for i in from..from + n {
        sink.record(event(i));
    }
    log.close().await;
}

async fn log_of(n: u64) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit");
    append(&path, 0, n).await;
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

/// A log of `n` records written three a month from 2001-01, with `retain` months kept.
fn monthly_log(n: u64, retain: Option<u32>) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit");
    let (mut writer, _) = Writer::open(path.clone(), retain, None).unwrap();
    let month_ms = 31 * 86_400_000;
    let start = 978_307_200_000; // 2001-01-01
    writer
        .write(
            (0..n).map(|i| (start + (i / 3) * month_ms + i, event(i))),
            |_| {},
        )
        .unwrap();
    writer.close().unwrap();
    (dir, path)
}

fn bad(path: &Path) -> BadRecord {
    let report = verify(path, None).unwrap();
    assert!(!report.ok, "{report:?}");
    report.first_bad.unwrap()
}

fn seq_of(line: &str) -> u64 {
    serde_json::from_str::<serde_json::Value>(line).unwrap()["seq"]
        .as_u64()
        .unwrap()
}

#[tokio::test]
async fn an_untouched_log_verifies_and_continues_across_restarts() {
    let (_d, path) = log_of(5).await;
    append(&path, 9, 1).await;
    let r = verify(&path, None).unwrap();
    assert!(r.ok, "{r:?}");
    assert_eq!(r.records, 6);
}

#[tokio::test]
async fn an_edited_record_is_named() {
    let (_d, path) = log_of(5).await;
    let (file, mut l) = lines(&path);
    l[2] = l[2].replace("tool2", "toolX");
    rewrite(&file, &l);
    let bad = bad(&path);
    assert_eq!((bad.line, bad.seq), (3, Some(3)), "{bad:?}");
}

#[tokio::test]
async fn a_deleted_record_is_found() {
    let (_d, path) = log_of(5).await;
    let (file, mut l) = lines(&path);
    l.remove(1);
    rewrite(&file, &l);
    let bad = bad(&path);
    assert_eq!(bad.seq, Some(3), "{bad:?}");
    assert!(bad.reason.contains("missing"));
}

#[tokio::test]
async fn swapped_records_are_found() {
    let (_d, path) = log_of(5).await;
    let (file, mut l) = lines(&path);
    l.swap(1, 2);
    rewrite(&file, &l);
    assert_eq!(bad(&path).line, 2);
}

#[tokio::test]
async fn a_dropped_last_record_is_found_through_the_head() {
    let (_d, path) = log_of(5).await;
    let (file, mut l) = lines(&path);
    l.pop();
    rewrite(&file, &l);
    assert_eq!(bad(&path).seq, Some(4));
}

#[tokio::test]
async fn deleting_the_first_record_the_first_five_or_all_but_the_last_is_found() {
    for cut in [1, 5, 13] {
        let (_d, path) = log_of(14).await;
        let (file, l) = lines(&path);
        rewrite(&file, &l[cut..]);
        let bad = bad(&path);
        assert_eq!((bad.line, bad.seq), (1, Some(cut as u64 + 1)), "{bad:?}");
        assert!(bad.reason.contains("missing"), "{bad:?}");
    }
}

#[tokio::test]
async fn a_deleted_head_is_found_alone_and_with_the_end_dropped() {
    let (_d, path) = log_of(14).await;
    std::fs::remove_file(path.join(HEAD_FILE)).unwrap();
    let found = bad(&path);
    assert_eq!(found.seq, Some(14), "{found:?}");
    assert!(found.reason.contains(HEAD_FILE), "{found:?}");

    let (file, l) = lines(&path);
    rewrite(&file, &l[..11]);
    assert_eq!(bad(&path).seq, Some(11));
}

#[tokio::test]
async fn a_deleted_month_file_is_found_wherever_it_was() {
    let (_dir, path) = monthly_log(9, None);
    assert!(verify(&path, None).unwrap().ok);
    let files = month_files(&path);
    assert_eq!(files.len(), 3);
    for (k, expect_seq) in [(0, 4), (1, 7), (2, 6)] {
        let copy = tempfile::tempdir().unwrap();
        for entry in std::fs::read_dir(&path).unwrap() {
            let entry = entry.unwrap();
            std::fs::copy(entry.path(), copy.path().join(entry.file_name())).unwrap();
        }
        std::fs::remove_file(copy.path().join(files[k].1.file_name().unwrap())).unwrap();
        let found = bad(copy.path());
        assert_eq!(found.seq, Some(expect_seq), "month {k}: {found:?}");
    }
}

#[tokio::test]
async fn a_head_that_lags_after_a_crash_still_verifies() {
    let (_d, path) = log_of(3).await;
    let old_head = std::fs::read(path.join(HEAD_FILE)).unwrap();
    append(&path, 7, 1).await;
    std::fs::write(path.join(HEAD_FILE), old_head).unwrap();
    let r = verify(&path, None).unwrap();
    assert!(r.ok, "{r:?}");
    assert_eq!(r.records, 4);
}

#[tokio::test]
async fn after_a_crash_the_writer_resumes_from_the_log_not_the_head() {
    // The head lags the file (a kill -9 between appending records and moving the head):
    // the next records must continue after the last one on disk, not fork the chain.
    let (_d, path) = log_of(7).await;
    let lagging = std::fs::read(path.join(HEAD_FILE)).unwrap();
    append(&path, 7, 2).await;
    std::fs::write(path.join(HEAD_FILE), lagging).unwrap();
    append(&path, 9, 2).await;
    let r = verify(&path, None).unwrap();
    assert!(r.ok, "{r:?}");
    assert_eq!(r.records, 11);
    let (_, l) = lines(&path);
    let seqs: Vec<u64> = l.iter().map(|l| seq_of(l)).collect();
    assert_eq!(seqs, (1..=11).collect::<Vec<_>>());
}

#[tokio::test]
async fn a_torn_last_line_is_cut_off_recorded_and_the_chain_goes_on() {
    // A kill -9 in the middle of appending record 4: the head still names record 3.
    let (_d, path) = log_of(3).await;
    let head = std::fs::read(path.join(HEAD_FILE)).unwrap();
    append(&path, 3, 1).await;
    std::fs::write(path.join(HEAD_FILE), head).unwrap();
    let (file, l) = lines(&path);
    let torn = &l[3][..l[3].len() / 2];
    std::fs::write(&file, format!("{}\n{}\n{}\n{torn}", l[0], l[1], l[2])).unwrap();
    let before = bad(&path);
    assert!(before.reason.contains("cut off"), "{before:?}");
    append(&path, 20, 2).await;
    let r = verify(&path, None).unwrap();
    assert!(r.ok, "{r:?}");
    assert_eq!(r.records, 6, "three kept, the repair, two new");
    assert_eq!(r.repairs.len(), 1, "{r:?}");
    let (_, l) = lines(&path);
    assert!(l[3].contains("\"event\":\"audit_repaired\""), "{}", l[3]);
    assert!(l[3].contains(&format!("\"cut_bytes\":{}", torn.len())));
}

#[tokio::test]
async fn records_removed_from_the_end_before_a_restart_stay_detected() {
    let (_d, path) = log_of(8).await;
    let (file, l) = lines(&path);
    rewrite(&file, &l[..5]);
    append(&path, 30, 2).await;
    let found = bad(&path);
    assert_eq!(found.seq, Some(6), "{found:?}");
    assert!(found.reason.contains("record 8"), "{found:?}");
}

#[tokio::test]
async fn retention_deletes_old_months_and_the_log_still_verifies_from_where_it_starts() {
    let (_dir, path) = monthly_log(6, None);
    let (log, sink) = AuditLog::start(path.clone(), Some(3), None).unwrap();
    sink.record(event(9));
    log.close().await;
    let months: Vec<String> = month_files(&path).into_iter().map(|(m, _)| m).collect();
    assert_eq!(months, vec![month_of(now_ms())]);
    let r = verify(&path, None).unwrap();
    assert!(r.ok, "{r:?}");
    assert_eq!(r.records, 2, "the prune record and the new one");
    let (_, l) = lines(&path);
    assert!(l[0].contains("\"event\":\"audit_pruned\""), "{}", l[0]);
    assert!(
        l[0].contains("\"months\":[\"2001-01\",\"2001-02\"]"),
        "{}",
        l[0]
    );

    // Deleting what retention kept is still found: drop the prune record itself.
    let (file, l) = lines(&path);
    rewrite(&file, &l[1..]);
    assert_eq!(bad(&path).seq, Some(8));
}

#[tokio::test]
async fn retention_keeps_the_chain_anchored_at_the_oldest_month_kept() {
    let (_dir, path) = monthly_log(9, Some(2));
    // Opening 2001-03 with two months kept deletes 2001-01 and records that the chain now
    // starts at the first record of 2001-02.
    let months: Vec<String> = month_files(&path).into_iter().map(|(m, _)| m).collect();
    assert_eq!(months, vec!["2001-02".to_owned(), "2001-03".to_owned()]);
    let r = verify(&path, None).unwrap();
    assert!(r.ok, "{r:?}");
    assert_eq!(
        r.records, 7,
        "2001-02's three, the prune record, 2001-03's three"
    );
}

#[tokio::test]
async fn the_log_starts_at_genesis_and_its_files_are_private() {
    let (_d, path) = log_of(2).await;
    let (_, l) = lines(&path);
    assert!(l[0].contains(&format!("\"prev\":\"{GENESIS}\"")));
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&path), 0o700);
    assert_eq!(mode(&path.join(HEAD_FILE)), 0o600);
    assert_eq!(mode(&month_files(&path)[0].1), 0o600);
}

#[tokio::test]
async fn an_existing_folder_is_made_private_and_an_empty_log_has_a_head() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit");
    std::fs::create_dir(&path).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    let (log, _sink) = AuditLog::start(path.clone(), None, None).unwrap();
    log.close().await;
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700);
    assert!(path.join(HEAD_FILE).exists());
    let r = verify(&path, None).unwrap();
    assert!(r.ok && r.records == 0, "{r:?}");
}

#[tokio::test]
async fn follow_reads_only_whole_lines_added_since_its_cursor() {
    let (_d, path) = log_of(3).await;
    let (seen, mut cursor) = tail(&path, 2, |_| true).unwrap();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[1]["seq"], 3);
    let (file, _) = lines(&path);
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&file)
        .unwrap();
    std::io::Write::write_all(&mut f, b"{\"seq\":4,\"partial\":").unwrap();
    let mut got = Vec::new();
    follow(&path, &mut cursor, |v| got.push(v)).unwrap();
    assert!(
        got.is_empty(),
        "a line still being written is not read: {got:?}"
    );
    std::io::Write::write_all(&mut f, b"true}\n").unwrap();
    follow(&path, &mut cursor, |v| got.push(v)).unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0]["seq"], 4);
    follow(&path, &mut cursor, |v| got.push(v)).unwrap();
    assert_eq!(got.len(), 1, "nothing read twice");
}

#[test]
fn months_are_utc_calendar_months() {
    assert_eq!(month_of(0), "1970-01");
    assert_eq!(month_of(1_764_460_800_000), "2025-11-30".get(..7).unwrap());
    assert_eq!(month_of(951_782_400_000), "2000-02"); // 2000-02-29
    assert_eq!(file_name("2000-02"), "audit-2000-02.jsonl");
}

#[tokio::test]
async fn roster_refusals_are_recorded_once_per_sender_and_reason_and_then_counted() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit");
    let (log, sink) = AuditLog::start(path.clone(), None, None).unwrap();
    let tally = RosterRefusals::new(sink);
    let refuse = |who: &str, reason: &str| {
        tally.refused(format!("eid:{who}"), who, reason, "refused".into())
    };
    for _ in 0..5 {
        refuse("a", "bad_signature");
    }
    refuse("a", "other_org");
    // More senders in one minute than are recorded one by one: the rest are summed.
    for i in 0..300 {
        refuse(&format!("s{i}"), "stale");
    }
    tally.flush();
    // A new minute: the first refusal is recorded at once again.
    refuse("a", "bad_signature");
    log.close().await;

    let (records, _) = tail(&path, 10_000, |_| true).unwrap();
    let refusals: Vec<(String, String, Option<u64>)> = records
        .iter()
        .filter(|r| r["event"] == "roster_refused")
        .map(|r| {
            let text = |k: &str| r[k].as_str().unwrap_or_default().to_owned();
            (text("principal"), text("reason"), r["count"].as_u64())
        })
        .collect();
    let of = |who: &str| {
        refusals
            .iter()
            .filter(|(p, _, _)| p == who)
            .map(|(_, reason, count)| (reason.as_str(), *count))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        of("eid:a"),
        [
            ("bad_signature", None),
            ("other_org", None),
            ("bad_signature", Some(4)),
            ("bad_signature", None)
        ]
    );
    let one_by_one = refusals.iter().filter(|(_, r, _)| r == "stale").count();
    assert_eq!(one_by_one, 256 - 2, "the cap counts senders, not records");
    assert_eq!(of("*"), [("*", Some(300 - 254))]);
}

/// A high-water mark kept in memory, as the node keeps it in its store.
#[derive(Debug, Default)]
struct Mark(std::sync::Mutex<Option<Head>>);

impl HighWater for Mark {
    fn load(&self) -> Result<Option<Head>, String> {
        Ok(self.0.lock().unwrap().clone())
    }
    fn save(&self, mark: &Head) -> Result<(), String> {
        *self.0.lock().unwrap() = Some(mark.clone());
        Ok(())
    }
}

#[tokio::test]
async fn a_log_cut_short_with_its_head_rewritten_falls_short_of_the_mark_and_a_restart_records_it()
{
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit");
    let mark = std::sync::Arc::new(Mark::default());
    let (log, sink) = AuditLog::start(path.clone(), None, Some(mark.clone())).unwrap();
    for i in 0..6 {
        sink.record(event(i));
    }
    log.close().await;
    let high = mark.load().unwrap().unwrap();
    assert_eq!(high.seq, 6);
    assert!(verify(&path, Some(&high)).unwrap().ok);

    let (file, all) = lines(&path);
    rewrite(&file, &all[..4]);
    let last: serde_json::Value = serde_json::from_str(&all[3]).unwrap();
    std::fs::write(
        path.join(HEAD_FILE),
        serde_json::json!({ "seq": last["seq"], "hash": last["hash"] }).to_string(),
    )
    .unwrap();
    assert!(verify(&path, None).unwrap().ok, "the head alone is fooled");
    let report = verify(&path, Some(&high)).unwrap();
    let bad = report.first_bad.unwrap();
    assert_eq!(bad.seq, Some(4), "{bad:?}");
    assert!(bad.reason.contains("store says record 6"), "{bad:?}");

    // The writer started over the cut log records the damage, so it outlives the next mark.
    let (log, _sink) = AuditLog::start(path.clone(), None, Some(mark.clone())).unwrap();
    log.close().await;
    let report = verify(&path, mark.load().unwrap().as_ref()).unwrap();
    let bad = report.first_bad.unwrap();
    assert_eq!(bad.seq, Some(5), "{bad:?}");
    assert!(bad.reason.contains("records were removed"), "{bad:?}");
}

#[tokio::test]
async fn a_log_deleted_with_its_head_falls_short_of_the_mark() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit");
    let mark = std::sync::Arc::new(Mark::default());
    let (log, sink) = AuditLog::start(path.clone(), None, Some(mark.clone())).unwrap();
    sink.record(event(0));
    log.close().await;
    std::fs::remove_dir_all(&path).unwrap();
    std::fs::create_dir(&path).unwrap();
    let high = mark.load().unwrap();
    let report = verify(&path, high.as_ref()).unwrap();
    assert!(!report.ok, "{report:?}");
    let bad = report.first_bad.unwrap();
    assert!(bad.reason.contains("the log was removed"), "{bad:?}");
}

#[test]
fn a_record_is_sealed_byte_for_byte_as_serde_writes_it_with_the_event_flattened() {
    let awkward = "quote \" back \\ nl \n tab \t nul \u{0} é ☃ 🌐 \u{2028}".to_owned();
    let events = vec![
        event(1),
        AuditEvent::Request {
            service: awkward.clone(),
            principal: "eid:ab".into(),
            peer: awkward.clone(),
            method: "resources/read".into(),
            name: None,
            params_hash: None,
            bytes_in: u64::MAX,
            bytes_out: 0,
            latency_us: 7,
            outcome: "error".into(),
            code: Some(-32602),
        },
        AuditEvent::SessionRefused {
            service: "s".into(),
            principal: "p".into(),
            peer: "b".into(),
            code: -32050,
            reason: Some(awkward.clone()),
        },
        AuditEvent::OutgoingClose {
            peer: "a".into(),
            service: "s".into(),
            duration_ms: 3,
            ended: "failed".into(),
            code: None,
            reason: Some("gone".into()),
        },
        AuditEvent::Trust {
            action: "grant".into(),
            peer: None,
            service: Some("notes".into()),
        },
        AuditEvent::PolicyChanged {
            service: "notes".into(),
            what: "allow".into(),
            before: serde_json::json!(["peer:bob", {"nested": [1, 2.5, null, true]}]),
            after: serde_json::json!({"b": 1, "a": awkward.clone()}),
            changed: vec![],
            by: "reload".into(),
        },
        AuditEvent::AuditPruned {
            months: vec!["2026-01".into(), "2026-02".into()],
            first_seq: 9,
            first_prev: "ab".repeat(32),
        },
        AuditEvent::RecordsDropped { count: 0 },
        AuditEvent::RosterRefused {
            from: "x".into(),
            reason: "stale".into(),
            message: awkward,
            principal: None,
            count: Some(3),
        },
    ];
    for (i, event) in events.into_iter().enumerate() {
        let record = AuditRecord {
            seq: i as u64 * 1_000_000_007,
            at_ms: 1_764_000_000_000 + i as u64,
            event,
            prev: chain::GENESIS.to_owned(),
        };
        let body = serde_json::to_vec(&record).unwrap();
        let hash = blake3::hash(&body).to_hex().to_string();
        let mut expected = body;
        expected.pop();
        expected.extend_from_slice(format!(",\"hash\":\"{hash}\"}}\n").as_bytes());
        let (line, sealed_hash) = chain::seal(&record);
        assert_eq!(
            String::from_utf8_lossy(&line),
            String::from_utf8_lossy(&expected),
            "{record:?}"
        );
        assert_eq!(sealed_hash, hash);
    }
}
