//! Load: twenty callers above their rate for a minute against one serving node.

mod common;

use std::time::{Duration, Instant};

use common::*;
use mcpmesh_net::transport::FrameReader;
use serde_json::{Value, json};

const CALLERS: usize = 20;
const RUN: Duration = Duration::from_secs(60);
/// Each caller sends this often: 300 a minute against a limit of 120.
const EVERY: Duration = Duration::from_millis(200);

#[tokio::test(flavor = "multi_thread")]
async fn twenty_callers_over_their_rate_for_a_minute_are_limited_answered_and_cost_flat_memory() {
    let m = marker("load");
    let alice = TestNode::start_with(
        "alice",
        "[limits]\nrate_limit_per_min = 120\nmax_sessions = 32\n",
        &[],
    );
    alice.serve_stub("svc", &[], Some(32), &m);
    let mut callers = Vec::new();
    for _ in 0..CALLERS {
        let (ep, target) = raw_client(&alice, true).await;
        callers.push((ep, target));
    }
    // Grant every raw caller (named tester<prefix> by raw_client).
    for p in alice.json(&["peers"])["peers"].as_array().unwrap() {
        alice.json(&["grant", p["name"].as_str().unwrap(), "svc"]);
    }
    let baseline = rss_kib(&alice);
    let mut tasks = tokio::task::JoinSet::new();
    for (ep, target) in callers {
        tasks.spawn(async move {
            let conn = ep
                .connect(target, mcpmesh_net::session::ALPN_MCP)
                .await
                .unwrap();
            let (mut send, recv) = conn.open_bi().await.unwrap();
            send.write_all(b"{\"mcpmesh\":1,\"service\":\"svc\"}\n")
                .await
                .unwrap();
            let mut reader = FrameReader::new(recv, 1 << 20);
            let (mut sent, mut ok, mut limited, mut id) = (0u64, 0u64, 0u64, 0u64);
            let started = Instant::now();
            let mut next = tokio::time::interval(EVERY);
            while started.elapsed() < RUN {
                next.tick().await;
                id += 1;
                let req = json!({ "jsonrpc": "2.0", "id": id, "method": "tools/call",
                                  "params": { "name": "echo", "arguments": { "text": "x" } } });
                send.write_all(format!("{req}\n").as_bytes()).await.unwrap();
                sent += 1;
                let line = tokio::time::timeout(ANSWER_TIMEOUT, reader.next_line())
                    .await
                    .unwrap()
                    .unwrap()
                    .unwrap();
                let answer: Value = serde_json::from_slice(&line).unwrap();
                assert_eq!(answer["id"], id, "every request gets its own answer");
                match answer["error"]["code"].as_i64() {
                    None => ok += 1,
                    Some(-32053) => {
                        assert!(answer["error"]["data"]["retry_after_ms"].as_u64().unwrap() > 0);
                        limited += 1;
                    }
                    Some(other) => panic!("unexpected error {other}: {answer}"),
                }
            }
            send.finish().ok();
            (sent, ok, limited)
        });
    }
    let mut peak = baseline;
    let mut totals = (0, 0, 0);
    while !tasks.is_empty() {
        tokio::select! {
            done = tasks.join_next() => {
                if let Some(r) = done {
                    let (sent, ok, limited) = r.unwrap();
                    assert_eq!(sent, ok + limited);
                    assert!(limited > 0, "the limiter engaged for every caller");
                    // A bucket of 120 that refills at 2/s serves at most 120 + 2 × 60 in a minute.
                    assert!(ok <= 245, "a caller got past its budget: {ok}");
                    totals = (totals.0 + sent, totals.1 + ok, totals.2 + limited);
                }
            }
            _ = tokio::time::sleep(Duration::from_secs(5)) => peak = peak.max(rss_kib(&alice)),
        }
    }
    eprintln!(
        "load: {} requests, {} served, {} rate-limited; node RSS {} KiB → peak {} KiB",
        totals.0, totals.1, totals.2, baseline, peak
    );
    alice.json(&["down"]); // a clean stop flushes every queued record
    let summary = alice.cli(&["audit", "summary"]);
    eprintln!(
        "audit summary after the load:\n{}",
        String::from_utf8_lossy(&summary.stdout)
    );
    let json = alice.json(&["audit", "summary"]);
    let limited: u64 = json["peers"]
        .as_object()
        .unwrap()
        .values()
        .map(|t| t["refused"].as_u64().unwrap())
        .sum();
    assert_eq!(limited, totals.2, "every refusal is in the audit log");
}
