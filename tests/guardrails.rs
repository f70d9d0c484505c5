//! Guardrails on the serving node: per-request limits and the audit log, through real daemons.

mod common;

use std::time::Duration;

use common::*;
use serde_json::{Value, json};

fn pair_with(limits: &str, marker: &str) -> (TestNode, TestNode) {
    let alice = TestNode::start_with("alice", limits, &[]);
    let bob = TestNode::start("bob");
    alice.trust(&bob);
    bob.trust(&alice);
    alice.serve_stub("svc", &["bob"], None, marker);
    (alice, bob)
}

fn request(id: i64, tool: &str, args: Value) -> Vec<u8> {
    let mut line = serde_json::to_vec(&json!({ "jsonrpc": "2.0", "id": id, "method": "tools/call",
                                               "params": { "name": tool, "arguments": args } }))
    .unwrap();
    line.push(b'\n');
    line
}

#[tokio::test(flavor = "multi_thread")]
async fn a_caller_over_its_rate_is_answered_32053_and_every_request_gets_an_answer() {
    let m = marker("rate");
    let (alice, bob) = pair_with("[limits]\nrate_limit_per_min = 6\n", &m);
    let mut s = bob.connect("alice/svc");
    s.initialize().await;
    let mut limited = 0;
    for id in 1..=10 {
        s.send_raw(&request(id, "echo", json!({ "text": "x" })))
            .await;
        let answer = s.recv().await.expect("every request is answered");
        assert_eq!(answer["id"], id);
        if answer.get("error").is_some() {
            assert_eq!(answer["error"]["code"], -32053, "{answer}");
            assert_eq!(answer["error"]["data"]["source"], "mcpmesh");
            assert!(answer["error"]["data"]["retry_after_ms"].as_u64().unwrap() > 0);
            limited += 1;
        }
    }
    assert!(limited >= 4, "the limiter engaged ({limited} refused)");
    alice.json(&["down"]);
    let summary = alice.json(&["audit", "summary"]);
    assert!(summary["peers"]["bob"]["refused"].as_u64().unwrap() >= limited);
}

#[tokio::test(flavor = "multi_thread")]
async fn requests_beyond_the_in_flight_cap_are_refused_at_once() {
    let m = marker("inflight");
    let (_alice, bob) = pair_with("[limits]\nmax_in_flight = 2\n", &m);
    let mut s = bob.connect("alice/svc");
    s.initialize().await;
    let burst = [
        request(1, "sleep", json!({ "ms": 300 })),
        request(2, "sleep", json!({ "ms": 300 })),
        request(3, "echo", json!({ "text": "third" })),
    ]
    .concat();
    s.send_raw(&burst).await;
    let first = s.recv().await.unwrap();
    assert_eq!(
        first["id"], 3,
        "the third is answered by the mesh before the server is done: {first}"
    );
    assert_eq!(first["error"]["code"], -32053);
    assert!(first["error"]["data"]["retry_after_ms"].as_u64().unwrap() > 0);
    for id in [1, 2] {
        let answer = s.recv().await.unwrap();
        assert_eq!(answer["id"], id);
        assert!(answer.get("result").is_some(), "{answer}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_audit_log_records_requests_without_their_arguments_and_verifies() {
    let m = marker("audit");
    let (alice, bob) = pair_with("", &m);
    let secret = format!("s3cret-{}", std::process::id());
    let mut s = bob.connect("alice/svc");
    s.initialize().await;
    let params = json!({ "name": "echo", "arguments": { "text": secret } });
    let answer = s.request("tools/call", params.clone()).await;
    assert_eq!(answer["result"]["content"][0]["text"], secret.as_str());
    s.close_stdin();
    s.wait_eof().await;
    alice.json(&["down"]); // flushes the log

    let dir = alice.home().join("state/audit");
    for entry in std::fs::read_dir(&dir).unwrap() {
        let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        assert!(!text.contains(&secret), "an argument reached the audit log");
    }
    let tail = alice.json(&["audit", "tail", "--peer", "bob", "-n", "100"]);
    let records = tail["records"].as_array().unwrap().clone();
    let call = records
        .iter()
        .find(|r| r["method"] == "tools/call")
        .expect("the call is recorded");
    assert_eq!(call["name"], "echo");
    assert_eq!(call["outcome"], "ok");
    assert_eq!(call["principal"], format!("eid:{}", bob.id));
    let raw_params = serde_json::to_string(&params).unwrap();
    assert_eq!(
        call["params_hash"],
        blake3::hash(raw_params.as_bytes()).to_hex().as_str()
    );
    assert!(records.iter().any(|r| r["event"] == "session_open"));
    assert!(records.iter().any(|r| r["event"] == "session_close"));
    assert_eq!(alice.json(&["audit", "verify"])["ok"], true);

    // An edited record is found, by file and line.
    let (_, file) = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".jsonl"))
        .map(|e| (e.file_name(), e.path()))
        .max()
        .unwrap();
    let text = std::fs::read_to_string(&file).unwrap();
    std::fs::write(
        &file,
        text.replacen("\"outcome\":\"ok\"", "\"outcome\":\"error\"", 1),
    )
    .unwrap();
    let out = alice.cli(&["--json", "audit", "verify"]);
    assert_eq!(out.status.code(), Some(1));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["ok"], false);
    assert_eq!(report["first_bad"]["reason"], "the record was altered");
}

#[tokio::test(flavor = "multi_thread")]
async fn notifications_past_their_own_cap_are_dropped_recorded_once_and_cost_no_requests() {
    let m = marker("notes");
    let (alice, bob) = pair_with("[limits]\nrate_limit_per_min = 3\n", &m);
    let mut s = bob.connect("alice/svc");
    s.initialize().await; // the session and its initialize take two of three request tokens
    // More notifications than their own cap bursts to (600 of 6,000 a minute).
    let mut burst = Vec::new();
    for i in 0..1_000 {
        burst.extend(
            serde_json::to_vec(
                &json!({ "jsonrpc": "2.0", "method": "notifications/progress",
                                                 "params": { "progressToken": i, "progress": i } }),
            )
            .unwrap(),
        );
        burst.push(b'\n');
    }
    burst.extend(request(9, "echo", json!({ "text": "after" })));
    s.send_raw(&burst).await;
    // The request after the burst still had its token: notifications have a budget of their own.
    let answer = s.recv().await.unwrap();
    assert_eq!(answer["id"], 9);
    assert!(answer.get("result").is_some(), "{answer}");
    let records = alice.stop_and_audit();
    let throttled = records
        .iter()
        .filter(|r| r["event"] == "notifications_throttled")
        .count();
    assert_eq!(throttled, 1, "one record for the whole episode");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_idle_connection_to_a_peer_is_closed() {
    let m = marker("idle");
    let alice = TestNode::start("alice");
    let bob = TestNode::start_with("bob", "[limits]\nidle_close_secs = 1\n", &[]);
    alice.trust(&bob);
    bob.trust(&alice);
    alice.serve_stub("svc", &["bob"], None, &m);
    let mut s = bob.connect("alice/svc");
    s.initialize().await;
    assert_eq!(bob.json(&["peers"])["peers"][0]["connected"], true);
    s.close_stdin();
    s.wait_eof().await;
    // No event announces another node's idle timer; check until it fired.
    let closed = eventually(Duration::from_secs(10), || {
        bob.json(&["peers"])["peers"][0]["connected"] == false
    })
    .await;
    assert!(closed, "the idle connection stayed open");
}

/// A change made to a copy of the audit folder: (folder, newest month file, its lines).
type Tamper = fn(&std::path::Path, &std::path::Path, &[String]);

/// Kills the node with SIGKILL and waits until it is gone.
async fn kill_9(node: &TestNode) {
    let pid = node.daemon_pid();
    node.signal(rustix::process::Signal::KILL);
    assert!(wait_exit(pid, ANSWER_TIMEOUT).await, "the node did not die");
}

/// Starts `node` again after a kill.
fn restart(node: &TestNode) {
    node.json(&["id"]);
}

/// Runs `audit verify --json` on `home` and returns its exit code and report.
fn verify_at(home: &std::path::Path) -> (Option<i32>, Value) {
    let out = std::process::Command::new(MCPMESH)
        .arg("--home")
        .arg(home)
        .args(["--json", "audit", "verify"])
        .env_remove("MCPMESH_HOME")
        .output()
        .unwrap();
    (
        out.status.code(),
        serde_json::from_slice(&out.stdout).unwrap(),
    )
}

/// A copy of `node`'s audit folder in a profile of its own, to tamper with.
fn audit_copy(node: &TestNode) -> (tempfile::TempDir, std::path::PathBuf) {
    let home = tempfile::tempdir().unwrap();
    std::fs::write(home.path().join("config.toml"), HERMETIC).unwrap();
    let dir = home.path().join("state/audit");
    std::fs::create_dir_all(&dir).unwrap();
    for entry in std::fs::read_dir(node.home().join("state/audit")).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), dir.join(entry.file_name())).unwrap();
    }
    (home, dir)
}

fn audit_lines(dir: &std::path::Path) -> (std::path::PathBuf, Vec<String>) {
    let file = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
        .max()
        .unwrap();
    let text = std::fs::read_to_string(&file).unwrap();
    (file, text.lines().map(|l| format!("{l}\n")).collect())
}

#[tokio::test(flavor = "multi_thread")]
async fn the_audit_chain_survives_kill_9_and_restarts_and_tells_every_tamper() {
    let m = marker("auditkill");
    let (alice, bob) = pair_with("", &m);
    // Calls, then a kill -9 right after a burst (records still on their way to disk), a
    // restart, more calls, then a kill -9 in the middle of a call, and a restart again.
    let mut s = bob.connect("alice/svc");
    s.initialize().await;
    for i in 0..20 {
        s.call("echo", json!({ "text": format!("burst {i}") }))
            .await;
    }
    kill_9(&alice).await;
    restart(&alice);
    let mut s = bob.connect("alice/svc");
    s.initialize().await;
    for i in 0..5 {
        s.call("echo", json!({ "text": format!("after {i}") }))
            .await;
    }
    s.start_long_call(json!("slow"), 60_000).await;
    kill_9(&alice).await;
    let answer = s.recv().await.expect("the pending call is answered");
    assert_eq!(answer["error"]["code"], -32055, "{answer}");
    restart(&alice);
    let mut s = bob.connect("alice/svc");
    s.initialize().await;
    s.call("echo", json!({ "text": "last" })).await;
    s.close_stdin();
    s.wait_eof().await;
    alice.json(&["down"]);

    let (code, report) = verify_at(alice.home());
    assert_eq!(code, Some(0), "{report}");
    let (_, lines) = audit_lines(&alice.home().join("state/audit"));
    assert_eq!(report["records"], lines.len() as u64, "{report}");
    let seqs: Vec<u64> = lines
        .iter()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["seq"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert_eq!(
        seqs,
        (1..=lines.len() as u64).collect::<Vec<_>>(),
        "one chain, no fork"
    );
    // A kill -9 loses what was still queued (up to the writer's 20 ms); what the last
    // session did after the restarts is all there, at the end of the one chain.
    let events: Vec<Value> = lines
        .iter()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .collect();
    let tail: Vec<(&str, &str)> = events[events.len() - 4..]
        .iter()
        .map(|v| {
            (
                v["event"].as_str().unwrap(),
                v["method"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(
        tail,
        [
            ("session_open", ""),
            ("request", "initialize"),
            ("request", "tools/call"),
            ("session_close", "")
        ],
        "{}",
        lines.concat()
    );

    // Each tamper is found, and the first bad record named.
    let n = lines.len() as u64;
    let tampers: [(&str, Tamper, u64); 4] = [
        (
            "the tail truncated",
            |_, file, l| {
                std::fs::write(file, l[..l.len() - 3].concat()).unwrap();
            },
            n - 3,
        ),
        (
            "the head deleted",
            |dir, _, _| {
                std::fs::remove_file(dir.join("audit.head")).unwrap();
            },
            n,
        ),
        (
            "the first record deleted",
            |_, file, l| {
                std::fs::write(file, l[1..].concat()).unwrap();
            },
            2,
        ),
        (
            "an earlier month file deleted",
            |dir, file, l| {
                // The log split over two month files verifies; without the older one it does
                // not. Split in the middle: how many records the kills left varies with load.
                let older = dir.join("audit-2000-01.jsonl");
                let half = l.len() / 2;
                std::fs::write(&older, l[..half].concat()).unwrap();
                std::fs::write(file, l[half..].concat()).unwrap();
                assert_eq!(
                    verify_at(dir.parent().unwrap().parent().unwrap()).0,
                    Some(0)
                );
                std::fs::remove_file(older).unwrap();
            },
            n / 2 + 1,
        ),
    ];
    for (what, tamper, first_bad) in tampers {
        let (home, dir) = audit_copy(&alice);
        let (file, lines) = audit_lines(&dir);
        tamper(&dir, &file, &lines);
        let (code, report) = verify_at(home.path());
        assert_eq!(code, Some(1), "{what}: {report}");
        assert_eq!(report["ok"], false, "{what}: {report}");
        assert_eq!(report["first_bad"]["seq"], first_bad, "{what}: {report}");
        assert!(
            report["first_bad"]["line"].as_u64().unwrap() >= 1,
            "{what}: {report}"
        );
    }
}

/// `audit verify` on `node` as a script runs it: its exit code and report.
fn verify(node: &TestNode) -> (Option<i32>, Value) {
    let out = node.cli(&["--json", "audit", "verify"]);
    (
        out.status.code(),
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out:?}")),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn an_audit_log_cut_short_with_its_head_rewritten_or_deleted_with_it_fails_against_the_stores_mark()
 {
    let m = marker("auditmark");
    let (alice, bob) = pair_with("", &m);
    let mut s = bob.connect("alice/svc");
    s.initialize().await;
    for i in 0..3 {
        s.call("echo", json!({ "text": format!("call {i}") })).await;
    }
    s.close_stdin();
    s.wait_eof().await;
    // Intact, across a restart: checked by the running node, then from the stopped node's
    // store.
    alice.json(&["down"]);
    restart(&alice);
    let (code, report) = verify(&alice);
    assert_eq!(code, Some(0), "verified by the running node: {report}");
    alice.json(&["down"]);
    let (code, report) = verify(&alice);
    assert_eq!(code, Some(0), "verified from the store: {report}");

    let dir = alice.home().join("state/audit");
    let (file, lines) = audit_lines(&dir);
    let n = lines.len();
    assert!(n > 5, "{}", lines.concat());
    let saved: Vec<(std::path::PathBuf, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| (e.path(), std::fs::read(e.path()).unwrap()))
        .collect();
    let restore = || {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            std::fs::remove_file(entry.path()).unwrap();
        }
        for (path, bytes) in &saved {
            std::fs::write(path, bytes).unwrap();
        }
    };

    // The log's last three records cut off and the head rewritten to the new last one: the
    // log and its head agree, but the store remembers how far the chain reached.
    std::fs::write(&file, lines[..n - 3].concat()).unwrap();
    let last: Value = serde_json::from_str(&lines[n - 4]).unwrap();
    std::fs::write(
        dir.join("audit.head"),
        json!({ "seq": last["seq"], "hash": last["hash"] }).to_string(),
    )
    .unwrap();
    let (code, report) = verify(&alice);
    assert_eq!(code, Some(1), "{report}");
    assert_eq!(report["ok"], false, "{report}");
    assert_eq!(report["first_bad"]["seq"], last["seq"], "{report}");
    let reason = report["first_bad"]["reason"].as_str().unwrap();
    assert!(
        reason.contains(&format!("record {n}")) && reason.contains("store"),
        "{report}"
    );

    // Put back as it was, the log verifies again.
    restore();
    let (code, report) = verify(&alice);
    assert_eq!(code, Some(0), "{report}");

    // The log and its head deleted together.
    for entry in std::fs::read_dir(&dir).unwrap().flatten() {
        std::fs::remove_file(entry.path()).unwrap();
    }
    let (code, report) = verify(&alice);
    assert_eq!(code, Some(1), "{report}");
    assert_eq!(report["ok"], false, "{report}");
    let reason = report["first_bad"]["reason"].as_str().unwrap();
    assert!(reason.contains(&format!("record {n}")), "{report}");

    // A node started over the deleted log records what it found, so the new chain fails too.
    restart(&alice);
    let (code, report) = verify(&alice);
    assert_eq!(code, Some(1), "{report}");
    assert!(
        report["first_bad"]["reason"]
            .as_str()
            .unwrap()
            .contains("damaged"),
        "{report}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_audit_folder_and_head_are_private() {
    use std::os::unix::fs::PermissionsExt;
    let m = marker("auditmode");
    let (alice, bob) = pair_with("", &m);
    let mut s = bob.connect("alice/svc");
    s.initialize().await;
    s.close_stdin();
    s.wait_eof().await;
    alice.json(&["down"]);
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    let dir = alice.home().join("state/audit");
    assert_eq!(mode(&dir), 0o700);
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        assert_eq!(mode(&path), 0o600, "{}", path.display());
    }
}

/// Bytes a process has read so far (`rchar` of /proc/PID/io).
fn bytes_read(pid: u32) -> u64 {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io")).unwrap();
    io.lines()
        .find_map(|l| l.strip_prefix("rchar: "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn audit_tail_follow_reads_only_what_was_added() {
    // A 4 MiB log; following it must not read it again for each new record.
    let home = tempfile::tempdir().unwrap();
    std::fs::write(home.path().join("config.toml"), HERMETIC).unwrap();
    let dir = home.path().join("state/audit");
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("audit-2026-01.jsonl");
    let line = |seq: u64| {
        format!(
            "{{\"seq\":{seq},\"at_ms\":{seq},\"event\":\"trust\",\"action\":\"grant\",\"peer\":\"p{seq}\",\"pad\":\"{}\"}}\n",
            "x".repeat(180)
        )
    };
    let text: String = (1..=20_000).map(line).collect();
    std::fs::write(&file, &text).unwrap();
    let mut cmd = tokio::process::Command::new(MCPMESH);
    cmd.arg("--home")
        .arg(home.path())
        .args(["--json", "audit", "tail", "-n", "1", "--follow"])
        .env_remove("MCPMESH_HOME");
    let (mut follow, first) = Started::until(&mut cmd, "\"seq\":20000").await;
    assert!(first.contains("p20000"), "{first}");
    let pid = follow.child.id().unwrap();
    let before = bytes_read(pid);
    for seq in 20_001..=20_003 {
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&file)
            .unwrap();
        std::io::Write::write_all(&mut f, line(seq).as_bytes()).unwrap();
        let shown = follow.wait_for(&format!("\"seq\":{seq}")).await;
        assert!(shown.contains(&format!("p{seq}")), "{shown}");
    }
    let read = bytes_read(pid) - before;
    assert!(
        read < text.len() as u64 / 4,
        "following three new records read {read} bytes of a {} byte log",
        text.len()
    );
}

/// Lines of `log` that report a failed accept.
fn accept_failures(log: &str) -> usize {
    log.lines().filter(|l| l.contains("accept failed")).count()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_node_out_of_descriptors_stays_up_logs_a_bounded_count_and_serves_again_once_they_free() {
    // alice's node is started with few descriptors allowed (soft 64, hard 200): it raises its
    // soft limit to the hard one, and a flood of control connections then takes the rest.
    let dir = tempfile::Builder::new().prefix("mm-").tempdir().unwrap();
    let config = format!("[identity]\nnickname = \"alice\"\n\n{HERMETIC}");
    std::fs::write(dir.path().join("config.toml"), config).unwrap();
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg("ulimit -Sn 64 && ulimit -Hn 200 && exec \"$0\" \"$@\"")
        .arg(MCPMESH)
        .arg("--home")
        .arg(dir.path())
        .args(["--json", "id"])
        .env_remove("MCPMESH_HOME")
        .output()
        .unwrap();
    let v = parse_ok(&out);
    let alice = TestNode {
        dir,
        name: "alice".into(),
        id: v["id"].as_str().unwrap().to_owned(),
        addrs: v["addrs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap().to_owned())
            .collect(),
    };
    let pid = alice.daemon_pid();
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let open_files = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap_or_default();
    assert_eq!(
        open_files.split_whitespace().collect::<Vec<_>>()[3..5],
        ["200", "200"],
        "the soft limit is raised to the hard one: {open_files}"
    );
    let m = marker("nofile");
    let bob = TestNode::start("bob");
    alice.trust(&bob);
    bob.trust(&alice);
    alice.serve_stub("svc", &["bob"], None, &m);

    // The flood: more control connections than the node has descriptors, held open.
    let socket = alice.home().join("mcpmesh.sock");
    let mut flood = Vec::new();
    for _ in 0..400 {
        flood.push(tokio::net::UnixStream::connect(&socket).await.unwrap());
    }
    let failing = eventually(ANSWER_TIMEOUT, || accept_failures(&alice.log()) >= 1).await;
    assert!(failing, "the node never ran out of descriptors");
    // Held for a few seconds: the failures are counted, not logged one by one.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        !wait_exit(pid, Duration::from_millis(1)).await,
        "the node died"
    );
    let lines = accept_failures(&alice.log());
    eprintln!("{lines} accept-failure lines while the flood was held");
    assert!(
        lines <= 3,
        "{lines} accept-failure lines in 3 s:\n{}",
        alice.log()
    );

    // The flood ends: the node answers its porcelain and serves a new session.
    drop(flood);
    assert_eq!(alice.json(&["status"])["id"], alice.id);
    let mut s = bob.connect("alice/svc");
    assert_eq!(
        s.initialize().await["result"]["serverInfo"]["name"],
        "echo-stub"
    );
    assert_eq!(
        s.call("echo", json!({ "text": "back" })).await["result"]["content"][0]["text"],
        "back"
    );
}
