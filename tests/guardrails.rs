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
async fn over_limit_notifications_are_dropped_and_recorded_once_per_episode() {
    let m = marker("notes");
    let (alice, bob) = pair_with("[limits]\nrate_limit_per_min = 3\n", &m);
    let mut s = bob.connect("alice/svc");
    s.initialize().await; // the session and its initialize take two of three tokens
    let mut burst = Vec::new();
    for i in 0..20 {
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
    // The request after the burst is answered (refused), so the burst was handled before it.
    let answer = s.recv().await.unwrap();
    assert_eq!(answer["id"], 9);
    assert_eq!(answer["error"]["code"], -32053);
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
