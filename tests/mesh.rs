//! Two and three nodes on loopback: gating, authorization, failures, caps, teardown, framing
//! and identity — each through real `mcpmesh` daemons and `connect` processes.

mod common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::{Value, json};

fn band_error(msg: &Value, code: i64) {
    assert_eq!(msg["error"]["code"], code, "expected {code}: {msg}");
    assert_eq!(msg["error"]["data"]["source"], "mcpmesh", "{msg}");
}

/// alice serves the stub as `svc` to bob; bob trusts alice.
fn pair(marker: &str, max_sessions: Option<u32>) -> (TestNode, TestNode) {
    let alice = TestNode::start("alice");
    let bob = TestNode::start("bob");
    alice.trust(&bob);
    bob.trust(&alice);
    alice.serve_stub("svc", &["bob"], max_sessions, marker);
    (alice, bob)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_session_through_two_nodes_reaches_the_served_tool() {
    let m = marker("basic");
    let (_alice, bob) = pair(&m, None);
    let mut s = bob.connect("alice/svc");
    let init = s.initialize().await;
    assert_eq!(init["result"]["serverInfo"]["name"], "echo-stub");
    let tools = s.request("tools/list", json!({})).await;
    assert!(
        tools["result"]["tools"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["name"] == "echo")
    );
    let echo = s.call("echo", json!({ "text": "hi ✓" })).await;
    assert_eq!(echo["result"]["content"][0]["text"], "hi ✓");
    assert_eq!(echo["result"]["peer_name"], "bob");
}

#[tokio::test(flavor = "multi_thread")]
async fn connect_reading_requests_from_a_file_still_gets_every_answer() {
    // A regular file cannot be handed to the node, so connect copies bytes itself; and the
    // client's end of input comes before the answers, which must still arrive.
    let m = marker("file");
    let (_alice, bob) = pair(&m, None);
    let requests = bob.home().join("requests.jsonl");
    let mut text = String::new();
    for (id, method, params) in [
        (
            1,
            "initialize",
            json!({ "protocolVersion": "2025-06-18", "capabilities": {} }),
        ),
        (
            2,
            "tools/call",
            json!({ "name": "echo", "arguments": { "text": "from a file" } }),
        ),
    ] {
        text +=
            &json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params }).to_string();
        text += "\n";
    }
    std::fs::write(&requests, text).unwrap();
    let out = bob
        .command(&["connect", "alice/svc"])
        .stdin(std::fs::File::open(&requests).unwrap())
        .output()
        .unwrap();
    assert!(out.status.success());
    let answers: Vec<Value> = out
        .stdout
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_slice(l).unwrap())
        .collect();
    assert_eq!(answers.len(), 2, "{answers:?}");
    assert_eq!(answers[0]["result"]["serverInfo"]["name"], "echo-stub");
    assert_eq!(answers[1]["result"]["content"][0]["text"], "from a file");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_untrusted_node_is_refused_before_any_mcp_byte_and_nothing_is_spawned() {
    let m = marker("untrusted");
    let (alice, _bob) = pair(&m, None);
    let carol = TestNode::start("carol");
    carol.trust(&alice); // carol trusts alice; alice has never heard of carol
    let mut s = carol.connect("alice/svc");
    let answer = s
        .request(
            "initialize",
            json!({ "protocolVersion": "2025-06-18", "capabilities": {} }),
        )
        .await;
    band_error(&answer, -32054);
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap()
            .contains("does not trust"),
        "refused by the gate, at connection level: {answer}"
    );
    s.wait_eof().await;
    assert!(
        procs_with(&m).is_empty(),
        "no child was spawned for an untrusted key"
    );
    assert!(
        alice
            .log()
            .contains("refused a connection from an unknown key")
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_peer_outside_allow_gets_what_a_missing_service_gets() {
    let m = marker("allow");
    let alice = TestNode::start("alice");
    let bob = TestNode::start("bob");
    alice.trust(&bob);
    bob.trust(&alice);
    alice.serve_stub("private", &["carol"], None, &m);

    let mut answers = Vec::new();
    for target in ["alice/private", "alice/nosuch"] {
        let mut s = bob.connect(target);
        let a = s
            .request(
                "initialize",
                json!({ "protocolVersion": "2025-06-18", "capabilities": {} }),
            )
            .await;
        band_error(&a, -32054);
        s.wait_eof().await;
        answers.push(a["error"].clone());
    }
    assert_eq!(
        answers[0], answers[1],
        "unauthorized and unknown are indistinguishable"
    );
    assert!(procs_with(&m).is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_backend_crash_mid_call_answers_the_pending_id_with_32055_within_a_second() {
    let m = marker("crash");
    let (_alice, bob) = pair(&m, None);
    let mut s = bob.connect("alice/svc");
    s.initialize().await;
    s.send(
        &json!({ "jsonrpc": "2.0", "id": "crash-1", "method": "tools/call",
                    "params": { "name": "crash", "arguments": {} } }),
    )
    .await;
    let sent = Instant::now();
    let answer = s.recv().await.expect("an answer, not EOF");
    let waited = sent.elapsed();
    band_error(&answer, -32055);
    assert_eq!(
        answer["id"], "crash-1",
        "the pending id, with its JSON type"
    );
    assert!(waited < Duration::from_secs(1), "answered after {waited:?}");
    s.wait_eof().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_lost_session_answers_every_outstanding_request_with_its_own_id() {
    let m = marker("outstanding");
    let (_alice, bob) = pair(&m, None);
    let mut s = bob.connect("alice/svc");
    s.initialize().await;
    // Three requests in flight, ids of both JSON types, written at once; the server reads the
    // first, dies, and never answers the two behind it.
    let mut burst = Vec::new();
    for (id, tool) in [
        (json!(41), "crash"),
        (json!("forty-two"), "echo"),
        (json!(43), "echo"),
    ] {
        burst.extend(
            serde_json::to_vec(&json!({ "jsonrpc": "2.0", "id": id, "method": "tools/call",
                                                 "params": { "name": tool, "arguments": {} } }))
            .unwrap(),
        );
        burst.push(b'\n');
    }
    s.send_raw(&burst).await;
    let mut ids = Vec::new();
    while let Some(answer) = s.recv().await {
        band_error(&answer, -32055);
        ids.push(answer["id"].clone());
    }
    ids.sort_by_key(|id| id.to_string());
    assert_eq!(ids, vec![json!("forty-two"), json!(41), json!(43)]);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_servers_stderr_goes_to_the_node_log_not_the_stream() {
    let m = marker("stderr");
    let (alice, bob) = pair(&m, None);
    let mut s = bob.connect("alice/svc");
    let init = s.initialize().await;
    assert_eq!(
        init["result"]["serverInfo"]["name"], "echo-stub",
        "the stream carries only MCP"
    );
    let pid = whoami(&mut s).await["pid"].as_u64().unwrap();
    let line = format!("echo-stub: ready (pid {pid})");
    assert!(
        eventually(Duration::from_secs(5), || alice.log().contains(&line)).await,
        "{}",
        alice.log()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn six_sessions_on_a_two_session_service_spawn_two_and_refuse_four() {
    let m = marker("cap");
    let (_alice, bob) = pair(&m, Some(2));
    let mut sessions: Vec<McpSession> = (0..6).map(|_| bob.connect("alice/svc")).collect();
    // Every initialize is written before any answer is read: six sessions open at once.
    let init = json!({ "jsonrpc": "2.0", "id": 1, "method": "initialize",
                       "params": { "protocolVersion": "2025-06-18", "capabilities": {} } });
    for s in &mut sessions {
        s.send(&init).await;
    }
    let mut answers = Vec::new();
    for s in &mut sessions {
        answers.push(s.recv().await.expect("an answer"));
    }
    let ok = answers.iter().filter(|a| a.get("result").is_some()).count();
    let refused: Vec<&Value> = answers
        .iter()
        .filter(|a| a.get("error").is_some())
        .collect();
    assert_eq!(ok, 2, "{answers:?}");
    assert_eq!(refused.len(), 4);
    for r in refused {
        band_error(r, -32053);
        assert!(r["error"]["data"]["retry_after_ms"].as_u64().unwrap() > 0);
    }
    let alive: Vec<_> = procs_with(&m)
        .into_iter()
        .filter(|(_, s)| *s != 'Z')
        .collect();
    assert_eq!(alive.len(), 2, "exactly two children alive: {alive:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_next_session_starts_from_a_spare_launcher_that_knows_nothing_of_the_last_caller() {
    let m = marker("spare");
    let (alice, bob, carol) = three_nodes_with("");
    alice.serve_stub("svc", &["bob", "carol"], None, &m);
    let daemon = alice.daemon_pid();
    assert_eq!(
        spare_launchers(daemon),
        Vec::<u32>::new(),
        "a spare before any session"
    );

    let mut first = bob.connect("alice/svc");
    first.initialize().await;
    assert_eq!(whoami(&mut first).await["MCPMESH_PEER_NAME"], "bob");
    // Once the first server has said its first word, one launcher waits for the next session.
    assert!(
        eventually(ANSWER_TIMEOUT, || spare_launchers(daemon).len() == 1).await,
        "{:?}",
        spare_launchers(daemon)
    );
    let spare = spare_launchers(daemon)[0];

    let mut second = carol.connect("alice/svc");
    second.initialize().await;
    let who = whoami(&mut second).await;
    assert_eq!(who["pid"], spare, "the spare became carol's server: {who}");
    assert_eq!(who["MCPMESH_PEER_NAME"], "carol", "{who}");
    assert_eq!(who["MCPMESH_SERVICE"], "svc", "{who}");
    assert_eq!(
        who["MCPMESH_PEER_EID"],
        format!("eid:{}", carol.id),
        "{who}"
    );
    let mut servers: Vec<u32> = procs_with(&m)
        .into_iter()
        .filter(|(_, state)| *state != 'Z')
        .map(|(pid, _)| pid)
        .collect();
    servers.sort();
    let mut expected = vec![
        spare,
        whoami(&mut first).await["pid"].as_u64().unwrap() as u32,
    ];
    expected.sort();
    assert_eq!(servers, expected, "one server per session");
    // Another one waits now, and only one.
    assert!(
        eventually(ANSWER_TIMEOUT, || {
            let now = spare_launchers(daemon);
            now.len() == 1 && now[0] != spare
        })
        .await,
        "{:?}",
        spare_launchers(daemon)
    );
    let next = spare_launchers(daemon)[0];
    // Stopping the node ends the launcher it kept waiting.
    let audit = alice.stop_and_audit();
    assert!(!audit.is_empty());
    assert!(
        wait_exit(next, ANSWER_TIMEOUT).await,
        "the stopped node's spare launcher {next} outlived it"
    );
}

async fn whoami(s: &mut McpSession) -> Value {
    s.call("whoami", json!({})).await["result"]["structuredContent"].clone()
}

#[tokio::test(flavor = "multi_thread")]
async fn closing_connects_stdin_ends_the_remote_child_within_a_second() {
    let m = marker("stdin");
    let (_alice, bob) = pair(&m, None);
    let mut s = bob.connect("alice/svc");
    s.initialize().await;
    let pid = whoami(&mut s).await["pid"].as_u64().unwrap() as u32;
    s.close_stdin();
    assert_child_ends(pid, &m).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_server_that_ignores_eof_and_sigterm_is_ended_with_its_group_within_a_second() {
    let m = marker("stubborn");
    let alice = TestNode::start("alice");
    let bob = TestNode::start("bob");
    alice.trust(&bob);
    bob.trust(&alice);
    // sh ignores SIGTERM (so does the `sleep` it leaves running, holding stdout open).
    let script = "trap '' TERM; \"$0\" \"$@\"; sleep 30";
    alice.json(&[
        "serve",
        "svc",
        "--allow",
        "bob",
        "--",
        "sh",
        "-c",
        script,
        stub(),
        "--marker",
        &m,
    ]);
    let mut s = bob.connect("alice/svc");
    s.initialize().await;
    let sh = procs_with(&m)
        .into_iter()
        .map(|(p, _)| p)
        .min()
        .expect("the server runs");
    assert!(!procs_in_group(sh).is_empty());
    s.close_stdin();
    assert!(
        wait_exit(sh, Duration::from_secs(1)).await,
        "sh {sh} still running"
    );
    assert!(
        eventually(Duration::from_secs(2), || procs_in_group(sh).is_empty()).await,
        "left behind in the group: {:?}",
        procs_in_group(sh)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_peer_removed_from_the_config_loses_its_live_session_at_once() {
    let m = marker("sever");
    let (alice, bob) = pair(&m, None);
    let mut s = bob.connect("alice/svc");
    s.initialize().await;
    let pid = whoami(&mut s).await["pid"].as_u64().unwrap() as u32;
    s.start_long_call(json!("slow"), 20_000).await;
    // Remove [peers.bob] by hand and tell the node to reload.
    let path = alice.home().join("config.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    let start = text.find("[peers.bob]").unwrap();
    let end = text[start + 1..]
        .find("\n[")
        .map_or(text.len(), |i| start + 2 + i);
    std::fs::write(&path, format!("{}{}", &text[..start], &text[end..])).unwrap();
    alice.signal(rustix::process::Signal::HUP);

    let answer = s.recv().await.expect("the pending request is answered");
    band_error(&answer, -32052);
    assert_eq!(answer["id"], "slow");
    s.wait_eof().await;
    assert!(
        wait_exit(pid, Duration::from_secs(2)).await,
        "the severed session's child ended"
    );
    assert!(
        alice.json(&["peers"])["peers"]
            .as_array()
            .unwrap()
            .is_empty()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_grant_dropped_by_hand_ends_the_session_on_reload() {
    let m = marker("handedit");
    let (alice, bob) = pair(&m, None);
    let mut s = bob.connect("alice/svc");
    s.initialize().await;
    s.start_long_call(json!(8), 20_000).await;
    // bob stays trusted; only the service's allow list loses him.
    let path = alice.home().join("config.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains(r#"allow = ["bob"]"#), "{text}");
    std::fs::write(&path, text.replace(r#"allow = ["bob"]"#, "allow = []")).unwrap();
    alice.signal(rustix::process::Signal::HUP);

    let answer = s.recv().await.expect("the pending request is answered");
    band_error(&answer, -32052);
    assert_eq!(answer["id"], 8);
    s.wait_eof().await;
    assert_eq!(
        alice.json(&["peers"])["peers"][0]["name"],
        "bob",
        "still a peer"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn killing_connect_ends_the_remote_child_within_a_second() {
    let m = marker("kill");
    let (_alice, bob) = pair(&m, None);
    let mut s = bob.connect("alice/svc");
    s.initialize().await;
    let pid = whoami(&mut s).await["pid"].as_u64().unwrap() as u32;
    s.child.start_kill().unwrap();
    assert_child_ends(pid, &m).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn killing_connect_while_a_call_hangs_ends_the_remote_child_within_a_second() {
    let m = marker("kill-hung");
    let (_alice, bob) = pair(&m, None);
    let mut s = bob.connect("alice/svc");
    s.initialize().await;
    let pid = whoami(&mut s).await["pid"].as_u64().unwrap() as u32;
    // The server has the call and sleeps on it for a minute: nothing it could answer will
    // reach anyone once its caller is killed.
    s.start_long_call(json!("hung"), 60_000).await;
    s.child.start_kill().unwrap();
    assert_child_ends(pid, &m).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_client_that_stops_reading_while_a_call_hangs_ends_the_remote_child_within_a_second() {
    let m = marker("stdout-closed");
    let (_alice, bob) = pair(&m, None);
    let mut s = bob.connect("alice/svc");
    s.initialize().await;
    let pid = whoami(&mut s).await["pid"].as_u64().unwrap() as u32;
    s.start_long_call(json!("hung"), 60_000).await;
    // The client closes the output it reads, its input still open: nobody can read an answer.
    let (mut connect, _stdin) = s.close_stdout();
    assert_child_ends(pid, &m).await;
    let status = tokio::time::timeout(ANSWER_TIMEOUT, connect.wait())
        .await
        .expect("connect exits once its session ended")
        .unwrap();
    eprintln!("connect exited {status}");
}

#[tokio::test(flavor = "multi_thread")]
async fn killing_connect_while_a_call_hangs_ends_the_remote_child_when_it_copies_bytes_too() {
    let m = marker("kill-hung-copy");
    let (_alice, bob) = pair(&m, None);
    let mut c = CopyingConnect::start(&bob, "alice/svc");
    c.send(json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/call",
                   "params": { "name": "whoami", "arguments": {} } }))
        .await;
    assert!(
        eventually(ANSWER_TIMEOUT, || c.lines().iter().any(|v| v["id"] == 1)).await,
        "whoami answered"
    );
    let lines = c.lines();
    let who = lines.iter().find(|v| v["id"] == 1).unwrap();
    let pid = who["result"]["structuredContent"]["pid"].as_u64().unwrap() as u32;
    c.send(json!({ "jsonrpc": "2.0", "id": 2, "method": "tools/call",
                   "params": { "name": "sleep", "arguments": { "ms": 60_000 },
                               "_meta": { "progressToken": 2 } } }))
        .await;
    let started = || {
        c.lines()
            .iter()
            .any(|v| v["method"] == "notifications/progress")
    };
    assert!(
        eventually(ANSWER_TIMEOUT, started).await,
        "the call started"
    );
    c.child.start_kill().unwrap();
    assert_child_ends(pid, &m).await;
}

/// A `blob` call for `bytes` bytes, and the line the stub answers it with when run directly.
async fn blob_call_and_direct_answer(bytes: usize) -> (Value, Vec<u8>) {
    let request = json!({ "jsonrpc": "2.0", "id": 7, "method": "tools/call",
                          "params": { "name": "blob", "arguments": { "bytes": bytes } } });
    let mut direct = McpSession::direct_stub();
    direct.send(&request).await;
    let expected = direct.recv_raw().await.unwrap();
    assert!(expected.len() > bytes);
    (request, expected)
}

#[tokio::test(flavor = "multi_thread")]
async fn an_8_mib_response_passes_byte_identical() {
    let m = marker("8mib");
    let (_alice, bob) = pair(&m, None);
    let (request, expected) = blob_call_and_direct_answer(8 << 20).await;

    let mut s = bob.connect("alice/svc");
    s.initialize().await;
    s.send(&request).await;
    let got = s.recv_raw().await.unwrap();
    assert!(
        got == expected,
        "8 MiB response differs ({} vs {} bytes)",
        got.len(),
        expected.len()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_answer_still_passing_when_the_client_stops_sending_arrives_whole_and_once() {
    let m = marker("midway");
    let (_alice, bob) = pair(&m, None);
    let (request, expected) = blob_call_and_direct_answer(1 << 20).await;

    let mut s = bob.connect("alice/svc");
    s.initialize().await;
    s.send(&request).await;
    // Both nodes see the client's input end while the answer is halfway through them.
    let got = s.recv_long_closing_stdin_midway().await;
    assert!(
        got.strip_suffix(b"\n") == Some(&expected[..]),
        "the answer differs ({} vs {} bytes)",
        got.len(),
        expected.len() + 1
    );
    // It was counted as the answer: no error for request 7 follows, only the end.
    let after = s.recv_raw().await;
    assert!(
        after.is_none(),
        "after the answer: {}",
        String::from_utf8_lossy(&after.unwrap_or_default())
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_answer_over_16_mib_is_cut_at_the_cap_as_it_passes_and_the_session_survives() {
    let m = marker("cut");
    let (alice, bob) = pair(&m, None);
    let mut s = bob.connect("alice/svc");
    s.initialize().await;
    s.send(&json!({ "jsonrpc": "2.0", "id": 5, "method": "tools/call",
                    "params": { "name": "blob", "arguments": { "bytes": 17 << 20 } } }))
        .await;
    // Passed through in parts, not held whole: what already went on cannot be taken back, so
    // the client gets it (no more than the cap) ended as one line of its own, then the refusal
    // of the request it was answering.
    let cut = s.recv_raw().await.unwrap();
    let cap = mcpmesh_net::transport::MAX_FRAME;
    assert!(
        cut.len() <= cap && cut.len() > cap - (1 << 20),
        "{} bytes",
        cut.len()
    );
    assert!(serde_json::from_slice::<Value>(&cut).is_err());
    let refusal = s.recv().await.unwrap();
    band_error(&refusal, -32051);
    assert_eq!(refusal["id"], 5);
    let echo = s.call("echo", json!({ "text": "still here" })).await;
    assert_eq!(echo["result"]["content"][0]["text"], "still here");
    // The serving node's account ends the request there too.
    s.close_stdin();
    s.wait_eof().await;
    let records = alice.stop_and_audit();
    let record = |key: &str, value: &str| {
        let found = records.iter().find(|r| r[key] == value);
        found.unwrap_or_else(|| panic!("no {key} {value} in {records:?}"))
    };
    let blob = record("name", "blob");
    assert_eq!(blob["outcome"], "error", "{blob}");
    assert_eq!(blob["code"], -32051, "{blob}");
    // The session's byte count has the part that went on.
    let closed = record("event", "session_close");
    assert!(
        closed["bytes_out"].as_u64().unwrap() > (cap - (1 << 20)) as u64,
        "{closed}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_line_over_16_mib_is_refused_and_the_session_survives_the_strike() {
    let m = marker("oversize");
    let (_alice, bob) = pair(&m, None);
    let mut s = bob.connect("alice/svc");
    s.initialize().await;
    let mut huge = br#"{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"echo","arguments":{"text":""#.to_vec();
    huge.extend(std::iter::repeat_n(b'a', 17 << 20));
    huge.extend_from_slice(b"\"}}}\n");
    s.send_raw(&huge).await;
    let refusal = s.recv().await.unwrap();
    band_error(&refusal, -32051);
    assert_eq!(refusal["id"], 9, "answered as the request it was");
    let echo = s.call("echo", json!({ "text": "still here" })).await;
    assert_eq!(echo["result"]["content"][0]["text"], "still here");
}

/// A process's environment, from /proc.
fn environ(pid: u32) -> std::collections::HashMap<String, String> {
    let raw = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    raw.split(|b| *b == 0)
        .filter_map(|kv| {
            let kv = String::from_utf8_lossy(kv);
            let (k, v) = kv.split_once('=')?;
            Some((k.to_owned(), v.to_owned()))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_started_node_gets_the_allocator_setting_and_its_servers_keep_their_own_environment() {
    let m = marker("malloc");
    let (alice, bob) = pair(&m, None);
    let node = environ(alice.daemon_pid());
    assert_eq!(
        node.get("GLIBC_TUNABLES").map(String::as_str),
        Some(mcpmesh::memory::TUNABLES),
        "the node that `id` started returns large freed buffers at once"
    );
    let mut s = bob.connect("alice/svc");
    s.initialize().await;
    let child = whoami(&mut s).await["pid"].as_u64().unwrap() as u32;
    let child = environ(child);
    assert!(!child.contains_key("GLIBC_TUNABLES"), "{child:?}");
    assert!(!child.contains_key("MCPMESH_MALLOC_TUNED"), "{child:?}");

    // Tunables of the user's own are theirs: the node and its servers keep them unchanged.
    let own = "glibc.malloc.arena_max=2";
    let carol = TestNode::start_with("carol", "", &[("GLIBC_TUNABLES", own)]);
    carol.trust(&bob);
    bob.trust(&carol);
    carol.serve_stub("svc", &["bob"], None, &m);
    assert_eq!(environ(carol.daemon_pid())["GLIBC_TUNABLES"], own);
    let mut s = bob.connect("carol/svc");
    s.initialize().await;
    let child = whoami(&mut s).await["pid"].as_u64().unwrap() as u32;
    assert_eq!(environ(child)["GLIBC_TUNABLES"], own);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_node_started_by_hand_becomes_the_same_node_with_the_allocator_setting() {
    let node = TestNode::start("solo");
    node.json(&["down"]);
    let mut cmd = tokio::process::Command::new(MCPMESH);
    cmd.arg("--home")
        .arg(node.home())
        .arg("daemon")
        .env_remove("MCPMESH_HOME")
        .env_remove("GLIBC_TUNABLES")
        .env_remove("MCPMESH_MALLOC_TUNED")
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true);
    let mut daemon = cmd.spawn().unwrap();
    let pid = daemon.id().unwrap();
    let mut lines = mcpmesh_net::transport::FrameReader::new(daemon.stdout.take().unwrap(), 4096);
    let ready = tokio::time::timeout(ANSWER_TIMEOUT, lines.next_line())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(String::from_utf8_lossy(&ready).contains("is up"));
    // The same process (same pid, same arguments), now with the setting.
    let env = environ(pid);
    assert_eq!(
        env.get("GLIBC_TUNABLES").map(String::as_str),
        Some(mcpmesh::memory::TUNABLES),
        "{env:?}"
    );
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
    assert!(args.contains(&&b"daemon"[..]), "{args:?}");
    assert_eq!(
        node.daemon_pid(),
        pid,
        "the node that runs is the one started by hand"
    );
    node.json(&["down"]);
    let status = tokio::time::timeout(ANSWER_TIMEOUT, daemon.wait()).await;
    assert!(status.unwrap().unwrap().success());
}

#[tokio::test(flavor = "multi_thread")]
async fn the_identity_env_reaches_the_child_and_cannot_be_overridden() {
    let m = marker("identity");
    // The serving node itself runs with forged identity variables in its environment.
    let alice = TestNode::start_with(
        "alice",
        "",
        &[
            ("MCPMESH_PEER_NAME", "mallory"),
            ("MCPMESH_PEER_EID", "eid:forged"),
            ("MCPMESH_PEER_USER", "root"),
        ],
    );
    let bob = TestNode::start("bob");
    alice.trust(&bob);
    bob.trust(&alice);
    alice.serve_stub("svc", &["bob"], None, &m);
    // A service env may not set them either: the config refuses the key.
    std::fs::write(
        alice.home().join("config.toml"),
        std::fs::read_to_string(alice.home().join("config.toml")).unwrap()
            + "\n[services.forged]\nrun = \"true\"\nenv = { MCPMESH_PEER_NAME = \"mallory\" }\n",
    )
    .unwrap();
    let err = alice.cli(&["--json", "serve", "other", "--", "true"]);
    assert!(!err.status.success());
    assert!(String::from_utf8_lossy(&err.stderr).contains("services.forged.env.MCPMESH_PEER_NAME"));

    let mut s = bob.connect("alice/svc");
    s.initialize().await;
    let env = whoami(&mut s).await;
    assert_eq!(env["MCPMESH_PEER_NAME"], "bob");
    assert_eq!(env["MCPMESH_PEER_EID"], format!("eid:{}", bob.id));
    assert_eq!(env["MCPMESH_SERVICE"], "svc");
    assert_eq!(env["MCPMESH_PEER_GROUPS"], "");
    assert!(
        env.get("MCPMESH_PEER_USER").is_none(),
        "no user is known for a static peer: {env}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unreachable_peer_answers_32055_and_then_eof() {
    let bob = TestNode::start_with("bob", "[limits]\ndial_timeout_secs = 2\n", &[]);
    // A key nobody holds, at an address nobody answers on.
    let ghost = "a".repeat(64);
    bob.json(&["peers", "add", "ghost", &ghost, "--addr", "127.0.0.1:9"]);
    let mut s = bob.connect("ghost/svc");
    let answer = s
        .request(
            "initialize",
            json!({ "protocolVersion": "2025-06-18", "capabilities": {} }),
        )
        .await;
    band_error(&answer, -32055);
    s.wait_eof().await;
}

/// `connect alice/svc` on `node` as an AI client launches it, with its stderr kept.
fn connect_keeping_stderr(
    node: &TestNode,
    target: &str,
) -> (McpSession, tokio::process::ChildStderr) {
    let mut cmd = tokio::process::Command::new(MCPMESH);
    cmd.arg("--home")
        .arg(node.home())
        .args(["connect", target])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let mut s = McpSession::spawn(cmd);
    let stderr = s.child.stderr.take().unwrap();
    (s, stderr)
}

/// Waits (bounded) for `connect` to exit and returns its status and everything on its stderr.
async fn exit_and_stderr(
    child: &mut tokio::process::Child,
    mut stderr: tokio::process::ChildStderr,
) -> (std::process::ExitStatus, String) {
    use tokio::io::AsyncReadExt;
    let status = tokio::time::timeout(ANSWER_TIMEOUT, child.wait())
        .await
        .expect("connect exits in time")
        .unwrap();
    let mut text = String::new();
    let _ = tokio::time::timeout(ANSWER_TIMEOUT, stderr.read_to_string(&mut text)).await;
    (status, text)
}

#[tokio::test(flavor = "multi_thread")]
async fn killing_the_calling_node_mid_call_answers_32055_and_connect_fails_saying_why() {
    let m = marker("kill-caller");
    let (_alice, bob) = pair(&m, None);
    let (mut s, stderr) = connect_keeping_stderr(&bob, "alice/svc");
    s.initialize().await;
    s.start_long_call(json!("outstanding"), 60_000).await;
    bob.signal(rustix::process::Signal::KILL);
    let answer = s.recv().await.expect("the outstanding call is answered");
    band_error(&answer, -32055);
    assert_eq!(answer["id"], "outstanding");
    s.wait_eof().await;
    let (status, stderr) = exit_and_stderr(&mut s.child, stderr).await;
    assert!(
        !status.success(),
        "connect exited {status}; stderr: {stderr}"
    );
    assert!(stderr.contains("node stopped"), "stderr: {stderr}");
}

#[tokio::test(flavor = "multi_thread")]
async fn killing_the_calling_node_mid_call_when_connect_copies_bytes_answers_32055_and_fails() {
    let m = marker("kill-caller-copy");
    let (_alice, bob) = pair(&m, None);
    let mut c = CopyingConnect::start(&bob, "alice/svc");
    c.send(json!({ "jsonrpc": "2.0", "id": 1, "method": "initialize",
                   "params": { "protocolVersion": "2025-06-18", "capabilities": {} } }))
        .await;
    c.send(
        json!({ "jsonrpc": "2.0", "id": "outstanding", "method": "tools/call",
                 "params": { "name": "sleep", "arguments": { "ms": 60_000 },
                             "_meta": { "progressToken": "p" } } }),
    )
    .await;
    // A file announces nothing: look for the call's first progress notification.
    assert!(
        eventually(ANSWER_TIMEOUT, || c
            .lines()
            .iter()
            .any(|v| v["method"] == "notifications/progress"))
        .await,
        "the call reached the server: {:?}",
        c.lines()
    );
    bob.signal(rustix::process::Signal::KILL);
    let (status, stderr) = c.exit().await;
    assert!(
        !status.success(),
        "connect exited {status}; stderr: {stderr}"
    );
    assert!(stderr.contains("node stopped"), "stderr: {stderr}");
    let answer = c
        .lines()
        .into_iter()
        .find(|v| v["id"] == "outstanding")
        .expect("the outstanding call is answered");
    band_error(&answer, -32055);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_peer_going_away_mid_session_makes_connect_fail_saying_why() {
    let m = marker("peer-gone");
    let (alice, bob) = pair(&m, None);
    let (mut s, stderr) = connect_keeping_stderr(&bob, "alice/svc");
    s.initialize().await;
    // Nothing outstanding: the session is idle when the peer goes.
    alice.signal(rustix::process::Signal::KILL);
    s.wait_eof().await;
    let (status, stderr) = exit_and_stderr(&mut s.child, stderr).await;
    assert!(
        !status.success(),
        "connect exited {status}; stderr: {stderr}"
    );
    assert!(stderr.contains("peer went away"), "stderr: {stderr}");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_offline_peer_is_answered_from_what_the_node_knows_and_shows_again_when_it_returns() {
    let m = marker("offline");
    // A dial would take longer than any answer may: an answer in time was not a dial.
    let bob = TestNode::start_with("bob", "[limits]\ndial_timeout_secs = 30\n", &[]);
    let alice = TestNode::start("alice");
    alice.trust(&bob);
    bob.trust(&alice);
    alice.serve_stub("svc", &["bob"], None, &m);
    let alice_of = |v: &Value| {
        v["peers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == "alice")
            .cloned()
            .unwrap()
    };
    assert!(
        eventually(
            ANSWER_TIMEOUT,
            || alice_of(&bob.json(&["peers"]))["reachable"] == true
        )
        .await
    );
    alice.json(&["down"]);
    assert!(
        eventually(
            ANSWER_TIMEOUT,
            || alice_of(&bob.json(&["peers"]))["reachable"] == false
        )
        .await,
        "the node notices the peer went"
    );

    let timed = |args: &[&str]| {
        let started = Instant::now();
        let v = bob.json(args);
        println!("{args:?} with the peer offline: {:?}", started.elapsed());
        v
    };
    let peer = alice_of(&timed(&["peers"]));
    assert_eq!(peer["reachable"], false, "{peer}");
    assert!(peer["checked_at"].as_u64().is_some(), "{peer}");
    assert!(peer.get("rtt_ms").is_none(), "{peer}");
    let status = timed(&["status"]);
    assert_eq!(alice_of(&status)["reachable"], false);
    timed(&["use", "alice/svc"]);
    let started = Instant::now();
    let mut s = bob.connect("alice/svc");
    let answer = s
        .request(
            "initialize",
            json!({ "protocolVersion": "2025-06-18", "capabilities": {} }),
        )
        .await;
    println!(
        "connect with the peer offline: answered in {:?}",
        started.elapsed()
    );
    band_error(&answer, -32055);
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap()
            .contains("unreachable"),
        "{answer}"
    );
    s.wait_eof().await;

    // Back (same key, same port): shown reachable again, and a session opens.
    alice.json(&["id"]);
    assert!(
        eventually(
            ANSWER_TIMEOUT,
            || alice_of(&bob.json(&["peers"]))["reachable"] == true
        )
        .await,
        "the node notices the peer is back"
    );
    let mut again = bob.connect("alice/svc");
    assert_eq!(
        again.initialize().await["result"]["serverInfo"]["name"],
        "echo-stub"
    );
}

/// Asks the stub for an 8 MiB answer written 64 KiB every 100 ms (about 13 s in all) and
/// returns once its head reached the client.
async fn start_slow_long_answer(s: &mut McpSession, id: u64) -> usize {
    s.send(&json!({ "jsonrpc": "2.0", "id": id, "method": "tools/call",
                    "params": { "name": "trickle", "arguments": { "bytes": 8 << 20, "ms": 100 } } }))
        .await;
    let head = s.recv_long_head().await;
    assert!(
        head.starts_with(b"{\"jsonrpc\""),
        "{}",
        String::from_utf8_lossy(&head[..64])
    );
    head.len()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_revoke_during_a_long_slow_answer_ends_the_session_and_its_child() {
    let m = marker("revokelong");
    let (alice, bob) = pair(&m, None);
    let mut s = bob.connect("alice/svc");
    s.initialize().await;
    let pid = whoami(&mut s).await["pid"].as_u64().unwrap() as u32;
    start_slow_long_answer(&mut s, 9).await;
    alice.json(&["revoke", "bob", "svc"]);
    // The answer halfway through is ended where it was, then its request is answered.
    let rest = s.recv_long_rest().await.len();
    assert!(rest < 8 << 20, "the whole answer came ({rest} bytes)");
    let answer = s.recv().await.expect("the pending call is answered");
    band_error(&answer, -32052);
    assert_eq!(answer["id"], 9);
    s.wait_eof().await;
    assert_child_ends(pid, &m).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn closing_stdin_halfway_through_a_long_slow_answer_still_gets_it_whole_then_ends() {
    let m = marker("stdinlong");
    let (_alice, bob) = pair(&m, None);
    let mut s = bob.connect("alice/svc");
    s.initialize().await;
    let pid = whoami(&mut s).await["pid"].as_u64().unwrap() as u32;
    let head = start_slow_long_answer(&mut s, 9).await;
    // A pipe may close its write side and wait: the answer it is owed still comes, whole.
    s.close_stdin();
    let rest = s.recv_long_rest().await.len();
    assert!(
        head + rest >= 8 << 20,
        "the whole answer came ({} bytes)",
        head + rest
    );
    s.wait_eof().await;
    assert_child_ends(pid, &m).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn one_service_filling_the_connection_is_refused_32053_and_another_service_still_opens() {
    let (alice, bob) = two_nodes();
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("server.sock");
    let mut cmd = tokio::process::Command::new(stub());
    cmd.arg("--socket").arg(&sock);
    let (_server, _) = Started::until(&mut cmd, "listening").await;
    let sock = sock.to_str().unwrap();
    alice.serve(
        "bulk",
        &["bob"],
        &["--max-sessions", "2000", "--socket", sock],
    );
    alice.serve("other", &["bob"], &["--socket", sock]);

    // Sessions to one service, 32 at a time, until one is refused (or past what one
    // connection can carry at all).
    let (mut open, mut refusal) = (Vec::new(), None);
    'filling: while open.len() < 1100 {
        let mut batch = tokio::task::JoinSet::new();
        for _ in 0..32 {
            let bob_home = bob.home().to_owned();
            batch.spawn(async move {
                let started = std::time::Instant::now();
                let node = NodeRef(bob_home);
                let (answer, conn) = node.open("alice", "bulk").await;
                (answer, conn, started.elapsed())
            });
        }
        let mut refused = None;
        while let Some(done) = batch.join_next().await {
            let (answer, conn, took) = done.unwrap();
            if answer["result"]["opened"] == true {
                open.push(conn);
            } else {
                refused.get_or_insert((answer, took));
            }
        }
        if refused.is_some() {
            refusal = refused;
            break 'filling;
        }
    }
    let (answer, took) = refusal.expect("a session was refused");
    eprintln!(
        "{} sessions to one service open; the next refused in {took:?}: {answer}",
        open.len()
    );
    assert_eq!(answer["error"]["code"], -32053, "{answer}");
    assert!(
        open.len() < mcpmesh_net::endpoint::MAX_STREAMS_PER_CONNECTION as usize,
        "{} sessions to one service",
        open.len()
    );
    // Another service between the same two nodes still opens, and answers.
    let (answer, mut conn) = NodeRef(bob.home().to_owned()).open("alice", "other").await;
    assert_eq!(answer["result"]["opened"], true, "{answer}");
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    conn.write_all(b"{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"ping\"}\n")
        .await
        .unwrap();
    let mut line = String::new();
    tokio::time::timeout(
        ANSWER_TIMEOUT,
        tokio::io::BufReader::new(&mut conn).read_line(&mut line),
    )
    .await
    .expect("the other service answers in time")
    .unwrap();
    let pong: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(pong["id"], 2, "{pong}");
}

/// A node by its profile folder, for tasks that cannot borrow the [`TestNode`].
struct NodeRef(std::path::PathBuf);

impl NodeRef {
    /// Opens a session to `service` on `peer` through the node's control socket; the
    /// connection carries the session once the answer says `opened`.
    async fn open(&self, peer: &str, service: &str) -> (Value, tokio::net::UnixStream) {
        use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
        let mut conn = tokio::net::UnixStream::connect(self.0.join("mcpmesh.sock"))
            .await
            .unwrap();
        let hello = json!({ "jsonrpc": "2.0", "id": 0, "method": "hello", "params": { "api": 1 } });
        let open = json!({ "jsonrpc": "2.0", "id": 1, "method": "session.open",
                           "params": { "peer": peer, "service": service } });
        conn.write_all(format!("{hello}\n{open}\n").as_bytes())
            .await
            .unwrap();
        // Read the answers a byte at a time: what follows them belongs to the session.
        let mut reader = tokio::io::BufReader::with_capacity(1, &mut conn);
        let mut line = Vec::new();
        for _ in 0..2 {
            line.clear();
            tokio::time::timeout(ANSWER_TIMEOUT, reader.read_until(b'\n', &mut line))
                .await
                .expect("session.open answered in time")
                .unwrap();
        }
        (serde_json::from_slice(&line).unwrap(), conn)
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_peer_going_away_mid_session_makes_connect_fail_when_it_copies_bytes_too() {
    let m = marker("peer-gone-copy");
    let (alice, bob) = pair(&m, None);
    let mut c = CopyingConnect::start(&bob, "alice/svc");
    c.send(json!({ "jsonrpc": "2.0", "id": 1, "method": "initialize",
                   "params": { "protocolVersion": "2025-06-18", "capabilities": {} } }))
        .await;
    assert!(
        eventually(ANSWER_TIMEOUT, || c.lines().iter().any(|v| v["id"] == 1)).await,
        "initialize answered"
    );
    // The client keeps its stdin open; the peer goes.
    alice.signal(rustix::process::Signal::KILL);
    let (status, stderr) = c.exit().await;
    assert!(
        !status.success(),
        "connect exited {status}; stderr: {stderr}"
    );
    assert!(
        stderr.contains("ended before the client did"),
        "stderr: {stderr}"
    );
}

/// `connect` with its output going to a file: it cannot hand its stdio to the node and copies
/// bytes itself.
struct CopyingConnect {
    child: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
    stderr: Option<tokio::process::ChildStderr>,
    out: std::path::PathBuf,
}

impl CopyingConnect {
    fn start(node: &TestNode, target: &str) -> Self {
        let out = node
            .home()
            .join(format!("answers-{}.jsonl", marker("copy")));
        let mut child = tokio::process::Command::new(MCPMESH)
            .arg("--home")
            .arg(node.home())
            .args(["connect", target])
            .stdin(std::process::Stdio::piped())
            .stdout(std::fs::File::create(&out).unwrap())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        CopyingConnect {
            stdin: child.stdin.take().unwrap(),
            stderr: child.stderr.take(),
            child,
            out,
        }
    }

    async fn send(&mut self, v: Value) {
        use tokio::io::AsyncWriteExt;
        let mut line = serde_json::to_vec(&v).unwrap();
        line.push(b'\n');
        self.stdin.write_all(&line).await.unwrap();
    }

    /// What `connect` wrote so far, one value a line.
    fn lines(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.out)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// Waits (bounded) for `connect` to exit, its stdin still open; its status and stderr.
    async fn exit(&mut self) -> (std::process::ExitStatus, String) {
        let stderr = self.stderr.take().unwrap();
        exit_and_stderr(&mut self.child, stderr).await
    }
}

/// A client that got every answer and closed its input ended the session: however long the
/// serving node then takes to end its side (here it is stopped for 4 s, as a loaded machine
/// may stall any process), `connect` exits 0 and says nothing was lost.
#[tokio::test(flavor = "multi_thread")]
async fn a_client_that_got_every_answer_and_closed_ends_cleanly_however_slow_the_server_is_to_go() {
    let m = marker("slow-to-go");
    let (alice, bob) = pair(&m, None);
    let (mut s, stderr) = connect_keeping_stderr(&bob, "alice/svc");
    s.initialize().await;
    let echo = s.call("echo", json!({ "text": "all of it" })).await;
    assert_eq!(echo["result"]["content"][0]["text"], "all of it", "{echo}");
    alice.signal(rustix::process::Signal::STOP);
    s.close_stdin();
    let stalled = tokio::time::sleep(Duration::from_secs(4));
    let (status, stderr) = tokio::join!(
        async {
            s.wait_eof().await;
            exit_and_stderr(&mut s.child, stderr).await
        },
        stalled
    )
    .0;
    alice.signal(rustix::process::Signal::CONT);
    assert!(
        status.success(),
        "connect exited {status} after every answer came; stderr: {stderr}"
    );
    assert!(!stderr.contains("lost"), "stderr: {stderr}");
}
