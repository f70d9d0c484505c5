//! Hostile input at the serving node: every case is answered as DESIGN §4 says, nothing
//! crashes, and the session or node goes on.

mod common;

use common::*;
use serde_json::{Value, json};

fn band(msg: &Value, code: i64) {
    assert_eq!(msg["error"]["code"], code, "{msg}");
    assert_eq!(msg["error"]["data"]["source"], "mcpmesh", "{msg}");
}

fn pair(marker: &str) -> (TestNode, TestNode) {
    let alice = TestNode::start("alice");
    let bob = TestNode::start("bob");
    alice.trust(&bob);
    bob.trust(&alice);
    alice.serve_stub("svc", &["bob"], None, marker);
    (alice, bob)
}

#[tokio::test(flavor = "multi_thread")]
async fn frames_that_are_not_messages_are_answered_and_the_third_closes_the_session() {
    let m = marker("parse");
    let (alice, bob) = pair(&m);
    let mut s = bob.connect("alice/svc");
    s.initialize().await;
    // Invalid UTF-8, then a value nested far past any parser's depth.
    s.send_raw(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"\xff\xfe\"}\n")
        .await;
    band(&s.recv().await.unwrap(), -32700);
    // Well-formed but not a message: invalid request, no deeper look, no crash.
    let deep = format!("{}{}\n", "[".repeat(100_000), "]".repeat(100_000));
    s.send_raw(deep.as_bytes()).await;
    band(&s.recv().await.unwrap(), -32600);
    // Two strikes: the session still works.
    assert_eq!(
        s.call("echo", json!({ "text": "ok" })).await["result"]["content"][0]["text"],
        "ok"
    );
    s.send_raw(b"not json at all\n").await;
    band(&s.recv().await.unwrap(), -32700);
    s.wait_eof().await; // the third strike closes it
    assert!(alice.log().contains("node ready"), "the node is still up");
    assert_eq!(alice.json(&["id"])["id"], alice.id);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_flood_of_empty_lines_changes_nothing() {
    let m = marker("empty");
    let (_alice, bob) = pair(&m);
    let mut s = bob.connect("alice/svc");
    s.initialize().await;
    let flood = vec![b'\n'; 8 << 20];
    s.send_raw(&flood).await;
    assert_eq!(
        s.call("echo", json!({ "text": "after" })).await["result"]["content"][0]["text"],
        "after"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_17_mib_line_is_refused_and_the_session_goes_on() {
    let m = marker("huge");
    let (alice, bob) = pair(&m);
    let mut s = bob.connect("alice/svc");
    s.initialize().await;
    let mut huge =
        b"{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"tools/call\",\"params\":{\"x\":\"".to_vec();
    huge.extend(std::iter::repeat_n(b'z', 17 << 20));
    huge.extend_from_slice(b"\"}}\n");
    s.send_raw(&huge).await;
    // It went on in parts until the cap, was ended there, and is answered as the request it
    // was.
    let refusal = s.recv().await.unwrap();
    band(&refusal, -32051);
    assert_eq!(refusal["id"], 3);
    assert_eq!(
        s.call("echo", json!({ "text": "fine" })).await["result"]["content"][0]["text"],
        "fine"
    );
    assert_eq!(
        alice.json(&["id"])["id"],
        alice.id,
        "the serving node is up"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_forged_peer_identity_in_meta_changes_nothing_the_server_is_told() {
    let m = marker("forge");
    let (_alice, bob) = pair(&m);
    let mut s = bob.connect("alice/svc");
    s.initialize().await;
    let who = s
        .request("tools/call", json!({
            "name": "whoami", "arguments": {},
            "_meta": { "mcpmesh/peer": { "eid": "eid:00", "name": "mallory", "groups": ["admin"] } },
        }))
        .await;
    let env = &who["result"]["structuredContent"];
    assert_eq!(env["MCPMESH_PEER_NAME"], "bob");
    assert_eq!(env["MCPMESH_PEER_EID"], format!("eid:{}", bob.id));
    assert_eq!(env["MCPMESH_PEER_GROUPS"], "");
}

#[tokio::test(flavor = "multi_thread")]
async fn malformed_preambles_are_answered_and_spawn_nothing() {
    let m = marker("preamble");
    let (alice, _bob) = pair(&m);
    let (ep, target) = raw_client(&alice, true).await;
    band(
        &exchange(&ep, target, b"hello there\n").await.unwrap(),
        -32700,
    );
    let ctrl = br#"{"mcpmesh":1,"service":"s\u0007vc"}"#;
    band(
        &exchange(&ep, target, &[&ctrl[..], b"\n"].concat())
            .await
            .unwrap(),
        -32054,
    );
    let long = format!("{{\"mcpmesh\":1,\"service\":\"{}\"}}\n", "a".repeat(4096));
    band(
        &exchange(&ep, target, long.as_bytes()).await.unwrap(),
        -32700,
    );
    assert!(
        procs_with(&m).is_empty(),
        "no child for a session that never opened"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_thousand_attempts_from_untrusted_keys_are_all_refused() {
    let m = marker("thousand");
    let (alice, _bob) = pair(&m);
    let mut tasks = tokio::task::JoinSet::new();
    let mut strangers = std::collections::BTreeSet::new();
    for _ in 0..20 {
        let (ep, target) = raw_client(&alice, false).await;
        strangers.insert(format!("eid:{}", ep.id()));
        tasks.spawn(async move {
            let mut answered = 0;
            for _ in 0..50 {
                let first = br#"{"mcpmesh":1,"service":"svc"}
{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}
"#;
                // The connection is closed (401) before any MCP byte is read: no answer line.
                if exchange(&ep, target, first).await.is_some() {
                    answered += 1;
                }
            }
            ep.close().await;
            answered
        });
    }
    let mut answered = 0;
    while let Some(n) = tasks.join_next().await {
        answered += n.unwrap();
    }
    assert_eq!(answered, 0, "an untrusted key got an MCP answer");
    assert!(procs_with(&m).is_empty(), "no child was spawned");
    assert!(
        alice
            .log()
            .matches("refused a connection from an unknown key")
            .count()
            >= 1000
    );

    // The audit log has them too, counted per key and minute: a record or two per key, not
    // a thousand.
    let refused: Vec<Value> = alice
        .stop_and_audit()
        .into_iter()
        .filter(|r| r["event"] == "connections_refused")
        .collect();
    let keys: std::collections::BTreeSet<String> = refused
        .iter()
        .map(|r| r["principal"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(keys, strangers, "{refused:?}");
    let counted: u64 = refused.iter().map(|r| r["count"].as_u64().unwrap()).sum();
    assert!(counted >= 1000, "{counted} refusals recorded: {refused:?}");
    assert!(refused.len() <= 2 * strangers.len(), "{refused:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn killing_the_serving_node_mid_call_answers_32055_and_a_restart_keeps_trust() {
    let m = marker("kill9");
    let (alice, bob) = pair(&m);
    let mut s = bob.connect("alice/svc");
    s.initialize().await;
    let who = s.call("whoami", json!({})).await;
    let child = who["result"]["structuredContent"]["pid"].as_u64().unwrap() as u32;
    // The server has the call (it said so) and sleeps on it, reading nothing.
    s.start_long_call(json!("pending"), 60_000).await;
    let daemon = alice.daemon_pid();
    // The server's first word started a spare launcher for the next session.
    assert!(
        eventually(ANSWER_TIMEOUT, || spare_launchers(daemon).len() == 1).await,
        "no spare launcher: {:?}",
        spare_launchers(daemon)
    );
    let spare = spare_launchers(daemon)[0];
    let killed = std::time::Instant::now();
    alice.signal(rustix::process::Signal::KILL);
    // The killed node's child dies with it, though it reads nothing (it sleeps for a minute).
    assert!(
        wait_exit(child, ANSWER_TIMEOUT).await && wait_exit(daemon, ANSWER_TIMEOUT).await,
        "the killed node's server outlived it: {:?}",
        procs_with(&m)
    );
    // So does the launcher it kept waiting, which no session had yet.
    assert!(
        wait_exit(spare, ANSWER_TIMEOUT).await,
        "the killed node's spare launcher {spare} outlived it"
    );
    eprintln!(
        "the orphaned server was gone {:?} after the kill",
        killed.elapsed()
    );

    // Restarted at once (any verb starts it): the node has the same identity, peers and
    // grants, and a session opens though the old connection is not yet known to be dead.
    let restarted = std::time::Instant::now();
    assert_eq!(alice.json(&["id"])["id"], alice.id);
    let mut again = bob.connect("alice/svc");
    let init = again.initialize().await;
    assert_eq!(init["result"]["serverInfo"]["name"], "echo-stub", "{init}");
    eprintln!(
        "a connect right after the restart answered in {:?} (restart included)",
        restarted.elapsed()
    );
    let peers = alice.json(&["peers"]);
    assert_eq!(peers["peers"][0]["name"], "bob");
    assert_eq!(peers["peers"][0]["services"], json!(["svc"]));

    let answer = s.recv().await.expect("the pending call is answered");
    band(&answer, -32055);
    assert_eq!(answer["id"], "pending");
    eprintln!(
        "the pending call was answered -32055 {:?} after the kill",
        killed.elapsed()
    );
    s.wait_eof().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_spare_launcher_killed_while_it_waits_leaves_the_next_session_to_one_started_then() {
    let m = marker("spare-killed");
    let (alice, bob) = pair(&m);
    let daemon = alice.daemon_pid();
    let mut first = bob.connect("alice/svc");
    first.initialize().await;
    assert!(
        eventually(ANSWER_TIMEOUT, || spare_launchers(daemon).len() == 1).await,
        "no spare launcher: {:?}",
        spare_launchers(daemon)
    );
    let spare = spare_launchers(daemon)[0];
    let pid = rustix::process::Pid::from_raw(spare as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::KILL).unwrap();
    assert!(
        wait_exit(spare, ANSWER_TIMEOUT).await,
        "{spare} survived -9"
    );

    let mut second = bob.connect("alice/svc");
    let init = second.initialize().await;
    assert_eq!(init["result"]["serverInfo"]["name"], "echo-stub", "{init}");
    let who = second.call("whoami", json!({})).await["result"]["structuredContent"].clone();
    assert_eq!(who["MCPMESH_PEER_NAME"], "bob", "{who}");
    assert_ne!(who["pid"], spare, "{who}");
    // The first session is untouched by it.
    let echoed = first.call("echo", json!({ "text": "still here" })).await;
    assert_eq!(echoed["result"]["content"][0]["text"], "still here");
}

#[tokio::test(flavor = "multi_thread")]
async fn thousands_of_refused_sessions_all_end_and_the_dialing_node_keeps_none() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // Alice does not trust bob: each session's connection is refused before any MCP byte.
    let alice = TestNode::start("alice");
    let bob = TestNode::start("bob");
    bob.trust(&alice);
    let socket = bob.home().join("mcpmesh.sock");
    // One refused session: opened and closed at once, or refused at the opening.
    let refused = |socket: std::path::PathBuf| async move {
        let mut conn = tokio::net::UnixStream::connect(socket).await.unwrap();
        conn.write_all(
            b"{\"jsonrpc\":\"2.0\",\"id\":0,\"method\":\"hello\",\"params\":{\"api\":1}}\n\
              {\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"session.open\",\"params\":{\"peer\":\"alice\",\"service\":\"svc\"}}\n",
        )
        .await
        .unwrap();
        conn.shutdown().await.unwrap();
        let mut all = Vec::new();
        let ended = tokio::time::timeout(ANSWER_TIMEOUT, conn.read_to_end(&mut all)).await;
        let text = String::from_utf8_lossy(&all).into_owned();
        assert!(
            ended.is_ok(),
            "the refused session did not end in time: {text}"
        );
        // Refused at the opening, or (the refusal can come after the stream went out) opened
        // and ended before any MCP byte.
        assert!(
            text.contains("-32054") || text.contains("\"opened\":true"),
            "{text}"
        );
    };
    let round = |n: usize| {
        let socket = socket.clone();
        async move {
            let mut tasks = tokio::task::JoinSet::new();
            for i in 0..n {
                tasks.spawn(refused(socket.clone()));
                if i % 16 == 15 {
                    while tasks.join_next().await.is_some() {}
                }
            }
            while let Some(r) = tasks.join_next().await {
                r.unwrap();
            }
        }
    };
    round(3000).await;
    // Every one of them ended (each was answered and closed in time, above), and the dialing
    // node holds none of them: no outgoing session is listed, and it still opens and answers.
    let outgoing = || {
        let status = bob.json(&["status"]);
        status["outgoing"]
            .as_array()
            .unwrap_or_else(|| panic!("status has no outgoing list: {status}"))
            .len()
    };
    // The last one leaves the list just after its opener saw it end.
    assert!(
        eventually(ANSWER_TIMEOUT, || outgoing() == 0).await,
        "{} outgoing sessions still listed",
        outgoing()
    );
    assert_eq!(bob.json(&["id"])["id"], bob.id, "the dialing node is up");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_raw_peer_opening_more_sessions_of_one_service_than_its_share_is_refused_32053() {
    let alice = TestNode::start_with("alice", ROOM_FOR_A_WHOLE_CLIENT, &[]);
    let (ep, target) = raw_client(&alice, true).await;
    let tester = format!("tester{}", &ep.id().to_string()[..8]);
    // A url service opens its upstream only for a request: idle sessions cost it nothing,
    // and its own session cap is set past what one connection may carry.
    let url = format!("http://127.0.0.1:{}/mcp", free_port());
    alice.serve(
        "bulk",
        &[&tester],
        &["--max-sessions", "2000", "--url", &url],
    );
    let share = 768;
    let conn = ep
        .connect(target, mcpmesh_net::session::ALPN_MCP)
        .await
        .unwrap();
    let preamble = br#"{"mcpmesh":1,"service":"bulk"}
"#;
    let mut open = Vec::new();
    for _ in 0..share {
        let (mut send, recv) = conn.open_bi().await.unwrap();
        send.write_all(preamble).await.unwrap();
        open.push((send, recv));
    }
    let sessions = || {
        alice.json(&["status"])["sessions"]
            .as_array()
            .map_or(0, Vec::len)
    };
    assert!(
        eventually(ANSWER_TIMEOUT, || sessions() == share).await,
        "{} of {share} sessions open",
        sessions()
    );
    // Past the share, on the same connection: refused after the first frame, and no session.
    for n in 0..3 {
        let (mut send, recv) = conn.open_bi().await.unwrap();
        let first = format!(
            "{{\"mcpmesh\":1,\"service\":\"bulk\"}}\n\
             {{\"jsonrpc\":\"2.0\",\"id\":{n},\"method\":\"initialize\",\"params\":{{}}}}\n"
        );
        send.write_all(first.as_bytes()).await.unwrap();
        let mut reader = mcpmesh_net::transport::FrameReader::new(recv, 1 << 20);
        let line = tokio::time::timeout(ANSWER_TIMEOUT, reader.next_line())
            .await
            .expect("answered in time")
            .unwrap()
            .expect("an answer line");
        let answer: Value = serde_json::from_slice(&line).unwrap();
        band(&answer, -32053);
        assert_eq!(answer["id"], n, "{answer}");
        assert!(
            answer["error"]["data"]["retry_after_ms"].as_u64().is_some(),
            "{answer}"
        );
        let end = tokio::time::timeout(ANSWER_TIMEOUT, reader.next_line()).await;
        assert!(
            matches!(end, Ok(Ok(None))),
            "the refused stream ends: {end:?}"
        );
    }
    assert_eq!(sessions(), share, "a refused stream opened no session");
    // A place given back is taken again.
    drop(open.pop());
    assert!(
        eventually(ANSWER_TIMEOUT, || sessions() == share - 1).await,
        "a closed session ends"
    );
    let (mut send, _recv) = conn.open_bi().await.unwrap();
    send.write_all(preamble).await.unwrap();
    assert!(
        eventually(ANSWER_TIMEOUT, || sessions() == share).await,
        "{} sessions open after one was given back",
        sessions()
    );
}
