//! The hero flow through the CLI only: serve, invite, pair, connect; refusals of bad invites;
//! removing, revoking and granting with live sessions; doctor; `--json` everywhere.

mod common;

use std::time::{Duration, Instant};

use common::*;
use mcpmesh::pairing::Invite;
use serde_json::{Value, json};

fn invite(node: &TestNode, args: &[&str]) -> String {
    let mut all = vec!["invite"];
    all.extend_from_slice(args);
    node.json(&all)["invite"].as_str().unwrap().to_owned()
}

fn refused(out: &std::process::Output) -> Value {
    assert_eq!(
        out.status.code(),
        Some(1),
        "expected a refusal: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    serde_json::from_str(stderr.lines().last().unwrap_or_default())
        .unwrap_or_else(|_| panic!("{stderr}"))
}

async fn whoami(s: &mut McpSession) -> Value {
    s.call("whoami", json!({})).await["result"]["structuredContent"].clone()
}

/// alice serves the stub as `notes` (and `calc`) and bob redeems an invite for both.
fn paired(marker: &str) -> (TestNode, TestNode, String) {
    let alice = TestNode::start("alice");
    let bob = TestNode::start("bob");
    alice.serve_stub("notes", &[], None, marker);
    alice.serve_stub("calc", &[], None, marker);
    let line = invite(&alice, &["notes", "calc"]);
    let paired = bob.json(&["pair", &line]);
    let code = paired["code"].as_str().unwrap().to_owned();
    (alice, bob, code)
}

#[tokio::test(flavor = "multi_thread")]
async fn serve_invite_pair_connect_reaches_the_child_as_the_redeemer() {
    let m = marker("hero");
    let alice = TestNode::start("alice");
    let bob = TestNode::start("bob");
    alice.serve_stub("notes", &[], None, &m);
    let line = invite(&alice, &["notes"]);
    assert!(line.starts_with("mcpmesh-invite:"));
    let paired = bob.json(&["pair", &line]);
    assert_eq!(paired["peer"], "alice");
    assert_eq!(paired["services"], json!(["notes"]));
    assert_eq!(paired["mounts"], json!(["alice/notes"]));
    let code = paired["code"].as_str().unwrap();
    assert_eq!(code.split('-').count(), 3);

    let mut s = bob.connect("alice/notes");
    s.initialize().await;
    let env = whoami(&mut s).await;
    assert_eq!(env["MCPMESH_PEER_NAME"], "bob");
    assert_eq!(env["MCPMESH_PEER_EID"], format!("eid:{}", bob.id));

    // Both sides show the same code.
    let status = alice.json(&["status"]);
    assert_eq!(status["pairings"][0]["peer"], "bob");
    assert_eq!(status["pairings"][0]["code"], code);
    let peers = bob.json(&["peers"]);
    assert_eq!(peers["peers"][0]["mounts"], json!(["notes"]));
    assert_eq!(peers["peers"][0]["reachable"], true);
    assert!(peers["peers"][0]["rtt_ms"].as_f64().is_some());
    // Without relays there is only the direct path.
    assert_eq!(peers["peers"][0]["path"], "direct");
    assert!(peers["peers"][0].get("relay_url").is_none());
}

#[test]
fn used_expired_and_tampered_invites_are_refused() {
    let alice = TestNode::start("alice");
    alice.json(&["serve", "notes", "--", stub()]);
    let (bob, carol) = (TestNode::start("bob"), TestNode::start("carol"));

    let line = invite(&alice, &["notes"]);
    bob.json(&["pair", &line]);
    let used = refused(&carol.cli(&["--json", "pair", &line]));
    assert_eq!(used["error"]["code"], 1007);

    let short = invite(&alice, &["notes", "--ttl", "1s"]);
    // Waiting for wall-clock expiry is the behaviour under test, not synchronization.
    std::thread::sleep(Duration::from_millis(1100));
    let expired = refused(&carol.cli(&["--json", "pair", &short]));
    assert_eq!(expired["error"]["code"], 1007);
    assert!(
        expired["error"]["message"]
            .as_str()
            .unwrap()
            .contains("expired")
    );

    let good = invite(&alice, &["notes"]);
    let mut chars: Vec<char> = good.chars().collect();
    let i = chars.len() / 2;
    chars[i] = if chars[i] == 'x' { 'y' } else { 'x' };
    let tampered: String = chars.into_iter().collect();
    let damaged = refused(&carol.cli(&["--json", "pair", &tampered]));
    assert!(
        damaged["error"]["message"]
            .as_str()
            .unwrap()
            .contains("damaged"),
        "{damaged}"
    );
    assert_eq!(
        carol.json(&["pair", &good])["peer"],
        "alice",
        "the good line still works"
    );
}

#[test]
fn a_wrong_secret_is_refused_and_does_not_burn_the_invite() {
    let alice = TestNode::start("alice");
    alice.json(&["serve", "notes", "--", stub()]);
    let bob = TestNode::start("bob");
    let line = invite(&alice, &["notes"]);
    let mut forged = Invite::decode(&line).unwrap();
    forged.secret = mcpmesh::pairing::encode_secret(&[42; 32]);
    let wrong = refused(&bob.cli(&["--json", "pair", &forged.encode()]));
    assert_eq!(wrong["error"]["code"], 1007);
    assert!(
        wrong["error"]["message"]
            .as_str()
            .unwrap()
            .contains("secret"),
        "{wrong}"
    );
    assert_eq!(bob.json(&["pair", &line])["peer"], "alice");

    // Ten wrong attempts void an invite, even one with uses left.
    let carol = TestNode::start("carol");
    let line2 = invite(&alice, &["notes", "--uses", "5"]);
    let mut forged2 = Invite::decode(&line2).unwrap();
    forged2.secret = mcpmesh::pairing::encode_secret(&[43; 32]);
    for _ in 0..10 {
        refused(&carol.cli(&["--json", "pair", &forged2.encode()]));
    }
    let spent = refused(&carol.cli(&["--json", "pair", &line2]));
    assert_eq!(spent["error"]["code"], 1007, "{spent}");

    // The secret is nowhere in the inviter's log or audit records.
    let secret = Invite::decode(&line).unwrap().secret;
    assert!(!alice.log().contains(&secret));
    for entry in std::fs::read_dir(alice.home().join("state/audit")).unwrap() {
        assert!(
            !std::fs::read_to_string(entry.unwrap().path())
                .unwrap()
                .contains(&secret)
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn removing_a_peer_ends_its_long_call_within_a_second_and_refuses_the_next_connect() {
    let m = marker("remove");
    let (alice, bob, _) = paired(&m);
    let mut s = bob.connect("alice/notes");
    s.initialize().await;
    s.start_long_call(json!("long"), 30_000).await;
    let started = Instant::now();
    alice.json(&["peers", "remove", "bob"]);
    let answer = s.recv().await.expect("the long call is answered");
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "took {:?}",
        started.elapsed()
    );
    assert_eq!(answer["id"], "long");
    assert_eq!(answer["error"]["code"], -32052, "{answer}");
    s.wait_eof().await;

    let mut again = bob.connect("alice/notes");
    let refusal = again
        .request(
            "initialize",
            json!({ "protocolVersion": "2025-06-18", "capabilities": {} }),
        )
        .await;
    assert_eq!(refusal["error"]["code"], -32054, "{refusal}");
    assert!(
        alice.json(&["peers"])["peers"]
            .as_array()
            .unwrap()
            .is_empty()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn revoke_ends_that_services_sessions_and_grant_applies_without_a_restart() {
    let m = marker("revoke");
    let (alice, bob, _) = paired(&m);
    let mut notes = bob.connect("alice/notes");
    notes.initialize().await;
    let mut calc = bob.connect("alice/calc");
    calc.initialize().await;
    notes.start_long_call(json!(5), 30_000).await;
    let started = Instant::now();
    let revoked = alice.json(&["revoke", "bob", "notes"]);
    assert_eq!(revoked["granted"], false);
    let answer = notes.recv().await.expect("the call is answered");
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "took {:?}",
        started.elapsed()
    );
    assert_eq!(answer["error"]["code"], -32052, "{answer}");
    notes.wait_eof().await;

    let mut refused = bob.connect("alice/notes");
    let r = refused
        .request(
            "initialize",
            json!({ "protocolVersion": "2025-06-18", "capabilities": {} }),
        )
        .await;
    assert_eq!(r["error"]["code"], -32054);
    // The other service is untouched.
    assert_eq!(
        calc.call("echo", json!({ "text": "still" })).await["result"]["content"][0]["text"],
        "still"
    );

    alice.json(&["grant", "bob", "notes"]);
    let mut back = bob.connect("alice/notes");
    assert_eq!(
        back.initialize().await["result"]["serverInfo"]["name"],
        "echo-stub"
    );
}

#[test]
fn doctor_flags_a_missing_command_and_a_loose_key() {
    use std::os::unix::fs::PermissionsExt;
    let alice = TestNode::start("alice");
    // A command that was there when it was served and is gone now.
    let server = alice.home().join("mcp-server");
    std::fs::write(&server, "#!/bin/sh\n").unwrap();
    std::fs::set_permissions(&server, std::fs::Permissions::from_mode(0o755)).unwrap();
    alice.json(&["serve", "ghost", "--", server.to_str().unwrap()]);
    std::fs::remove_file(&server).unwrap();
    std::fs::set_permissions(
        alice.home().join("device.key"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    let out = alice.cli(&["--json", "doctor"]);
    assert_eq!(out.status.code(), Some(1));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let errors: Vec<&Value> = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["status"] == "error")
        .collect();
    assert!(
        errors
            .iter()
            .any(|c| c["message"].as_str().unwrap().contains("does not exist")),
        "{report}"
    );
    assert!(
        errors.iter().any(|c| c["check"] == "device key"),
        "{report}"
    );
}

#[test]
fn an_invite_wrapped_and_quoted_by_a_mail_client_still_pairs() {
    let alice = TestNode::start("alice");
    let bob = TestNode::start("bob");
    alice.serve_stub("notes", &[], None, &marker("wrapped"));
    let line = invite(&alice, &["notes"]);
    let (head, tail) = line.split_at(line.len() / 2);
    let delivered = format!("\"{head}\n  {tail}\"\n");
    let paired = bob.json(&["pair", &delivered]);
    assert_eq!(paired["peer"], "alice");
    assert_eq!(paired["mounts"], json!(["alice/notes"]));
}

#[test]
fn every_verb_prints_one_json_value() {
    let alice = TestNode::start("alice");
    let bob = TestNode::start("bob");
    let runs: Vec<Vec<String>> = {
        let s = |v: &[&str]| v.iter().map(|x| (*x).to_owned()).collect::<Vec<String>>();
        vec![
            s(&["id"]),
            s(&["up"]),
            s(&["serve", "notes", "--", stub()]),
            s(&["serve", "spare", "--", stub()]),
            s(&["status"]),
            s(&["doctor"]),
            s(&["audit", "verify"]),
            s(&["audit", "summary"]),
            s(&["audit", "tail"]),
            s(&["demo"]),
        ]
    };
    let one_value = |node: &TestNode, args: &[String]| -> Value {
        let mut all = vec!["--json".to_owned()];
        all.extend_from_slice(args);
        let refs: Vec<&str> = all.iter().map(String::as_str).collect();
        let out = node.cli(&refs);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8(out.stdout).unwrap();
        let mut stream = serde_json::Deserializer::from_str(&text).into_iter::<Value>();
        let first = stream
            .next()
            .unwrap_or_else(|| panic!("{args:?} printed nothing"))
            .unwrap();
        assert!(
            stream.next().is_none(),
            "{args:?} printed more than one value: {text}"
        );
        first
    };
    for args in &runs {
        one_value(&alice, args);
    }
    let line = one_value(&alice, &["invite".into(), "notes".into()])["invite"]
        .as_str()
        .unwrap()
        .to_owned();
    for args in [
        vec!["pair".to_owned(), line],
        vec!["peers".into()],
        vec!["use".into(), "alice/notes".into()],
        vec!["peers".into(), "rename".into(), "alice".into(), "al".into()],
        vec!["peers".into(), "remove".into(), "al".into()],
    ] {
        one_value(&bob, &args);
    }
    for args in [
        vec!["grant".to_owned(), "bob".into(), "spare".into()],
        vec!["revoke".into(), "bob".into(), "spare".into()],
        vec!["unserve".into(), "spare".into()],
        vec![
            "peers".into(),
            "add".into(),
            "carol".into(),
            TestNode::start("carol").id.clone(),
        ],
        vec!["down".into()],
    ] {
        one_value(&alice, &args);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn watch_streams_trust_changes_sessions_and_requests() {
    let m = marker("watch");
    let (alice, bob, _) = paired(&m);
    let mut cmd = tokio::process::Command::new(MCPMESH);
    cmd.arg("--home")
        .arg(alice.home())
        .args(["--json", "watch"])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true);
    let mut watch = cmd.spawn().unwrap();
    let mut lines = mcpmesh_net::transport::FrameReader::new(watch.stdout.take().unwrap(), 1 << 20);
    let first = tokio::time::timeout(ANSWER_TIMEOUT, lines.next_line())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(
        serde_json::from_slice::<Value>(&first).unwrap(),
        json!({ "watching": true })
    );
    let mut seen = Vec::new();
    alice.json(&["grant", "bob", "notes"]);
    let mut s = bob.connect("alice/notes");
    s.initialize().await;
    s.call("echo", json!({ "text": "watched" })).await;
    while !seen
        .iter()
        .any(|e: &Value| e["event"] == "request" && e["method"] == "tools/call")
    {
        let line = tokio::time::timeout(ANSWER_TIMEOUT, lines.next_line())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        seen.push(serde_json::from_slice(&line).unwrap());
    }
    assert!(
        seen.iter()
            .any(|e| e["event"] == "trust" && e["action"] == "grant"),
        "{seen:?}"
    );
    assert!(
        seen.iter()
            .any(|e| e["event"] == "session_open" && e["peer"] == "bob"),
        "{seen:?}"
    );
    let call = seen.iter().find(|e| e["method"] == "tools/call").unwrap();
    assert!(call["latency_us"].as_u64().is_some() && call["bytes_out"].as_u64().unwrap() > 0);
    watch.start_kill().unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn killing_either_side_during_a_pairing_leaves_both_or_neither() {
    let mut outcomes = (0, 0);
    for (round, delay_ms) in [20u64, 40, 60, 70, 80, 90, 100, 120].iter().enumerate() {
        let alice = TestNode::start("alice");
        let bob = TestNode::start("bob");
        alice.json(&["serve", "notes", "--", stub()]);
        let line = invite(&alice, &["notes"]);
        let victim = if round % 2 == 0 { &alice } else { &bob };
        let pair = bob
            .command(&["--json", "pair", &line])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        tokio::time::sleep(Duration::from_millis(*delay_ms)).await;
        victim.kill_daemon().await;
        let _ = tokio::task::spawn_blocking(move || {
            let mut pair = pair;
            pair.wait()
        })
        .await;
        // Both nodes up again (any verb starts one); listing peers settles a pending pairing.
        let alice_has = alice.json(&["peers"])["peers"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["id"] == bob.id);
        let bob_peers = bob.json(&["peers"]);
        let bob_entry = bob_peers["peers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["id"] == alice.id)
            .cloned();
        if let Some(entry) = &bob_entry {
            assert_eq!(
                entry["pending"], false,
                "settled once alice is reachable: {entry}"
            );
        }
        assert_eq!(
            alice_has,
            bob_entry.is_some(),
            "round {round} (+{delay_ms} ms): alice has bob: {alice_has}, bob has alice: {}",
            bob_entry.is_some()
        );
        if alice_has {
            outcomes.0 += 1
        } else {
            outcomes.1 += 1
        }
    }
    eprintln!(
        "pairings completed: {}, undone or never started: {}",
        outcomes.0, outcomes.1
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn renaming_a_peer_keeps_its_grants_by_key_and_by_name() {
    let m = marker("rename");
    let (alice, bob, _) = paired(&m); // bob holds notes and calc by key (eid:)
    alice.json(&["serve", "byname", "--allow", "bob", "--", stub()]);
    let renamed = alice.json(&["peers", "rename", "bob", "robert"]);
    assert_eq!(renamed["peer"], "robert");
    let status = alice.json(&["status"]);
    for service in status["services"].as_array().unwrap() {
        assert_eq!(service["peers"], json!(["robert"]), "{service}");
    }
    for target in ["alice/notes", "alice/byname"] {
        let mut s = bob.connect(target);
        assert_eq!(
            s.initialize().await["result"]["serverInfo"]["name"],
            "echo-stub",
            "{target}"
        );
        assert_eq!(whoami(&mut s).await["MCPMESH_PEER_NAME"], "robert");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn serving_again_changes_the_command_and_keeps_grants_and_settings() {
    let m = marker("reserve");
    let (alice, bob, _) = paired(&m); // bob holds notes by key, from the pairing
    let path = alice.home().join("config.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(
        &path,
        text.replace(
            "[services.notes]",
            "[services.notes]\nenv = { KEEP = \"me\" }",
        ),
    )
    .unwrap();
    alice.signal(rustix::process::Signal::HUP);
    let m2 = marker("reserve2");
    alice.json(&[
        "serve",
        "notes",
        "--replace",
        "--allow",
        "carol",
        "--",
        stub(),
        "--marker",
        &m2,
    ]);
    let notes = alice.json(&["status"])["services"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "notes")
        .cloned()
        .unwrap();
    assert_eq!(
        notes["peers"],
        json!(["bob"]),
        "the pairing's grant survives: {notes}"
    );
    assert!(
        notes["allow"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a == "peer:carol")
    );
    let mut s = bob.connect("alice/notes");
    s.initialize().await;
    let env = whoami(&mut s).await;
    assert!(!procs_with(&m2).is_empty(), "the new command runs");
    assert_eq!(env["MCPMESH_SERVICE"], "notes");
    let config = std::fs::read_to_string(&path).unwrap();
    assert!(
        config.contains("KEEP"),
        "settings made by hand survive: {config}"
    );
}

/// One pairing exchange spoken by hand, as a redeemer (honest or not) would.
struct RawPairing {
    conn: iroh::endpoint::Connection,
    wire: mcpmesh_net::transport::NdjsonTransport<
        iroh::endpoint::RecvStream,
        iroh::endpoint::SendStream,
    >,
}

impl RawPairing {
    async fn open(ep: &iroh::Endpoint, inviter: iroh::EndpointId) -> Self {
        let conn = ep
            .connect(inviter, mcpmesh::pairing::ALPN_PAIR)
            .await
            .unwrap();
        let (send, recv) = conn.open_bi().await.unwrap();
        let wire = mcpmesh_net::transport::NdjsonTransport::new(recv, send, 4096);
        RawPairing { conn, wire }
    }

    async fn ask(&mut self, message: Value) -> Value {
        self.wire.send_value(message).await.unwrap();
        tokio::time::timeout(ANSWER_TIMEOUT, self.wire.recv_value())
            .await
            .expect("an answer in time")
            .unwrap()
            .expect("an answer before the stream ends")
    }

    fn close(self) {
        self.conn.close(0u32.into(), b"done");
    }
}

/// A hello for `invite` from `redeemer`, proving `secret`.
fn hello(invite: &Invite, secret: &[u8; 32], redeemer: &iroh::EndpointId, nick: &str) -> Value {
    let inviter: iroh::EndpointId = invite.id.parse().unwrap();
    json!({
        "pair": 1,
        "invite": invite.iid,
        "proof": mcpmesh::pairing::proof(secret, &inviter, redeemer),
        "nick": nick,
    })
}

fn allow_of(node: &TestNode, service: &str) -> Vec<Value> {
    node.json(&["status"])["services"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == service)
        .unwrap()["allow"]
        .as_array()
        .unwrap()
        .clone()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_nickname_an_allow_list_names_gets_a_free_name_and_nothing_that_list_grants() {
    let m = marker("nick");
    let alice = TestNode::start("alice");
    alice.serve_stub("notes", &[], None, &m);
    // Written before bob exists: meant for someone else.
    alice.serve_stub("secret", &["eng"], None, &m);
    let bob = TestNode::start("eng");
    bob.json(&["pair", &invite(&alice, &["notes"])]);

    let peers = alice.json(&["peers"]);
    let entry = peers["peers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["id"] == bob.id)
        .cloned()
        .unwrap();
    assert_eq!(entry["name"], "eng-2", "{entry}");
    assert_eq!(entry["services"], json!(["notes"]), "{entry}");

    let mut notes = bob.connect("alice/notes");
    assert_eq!(
        notes.initialize().await["result"]["serverInfo"]["name"],
        "echo-stub"
    );
    let mut secret = bob.connect("alice/secret");
    let refusal = secret
        .request(
            "initialize",
            json!({ "protocolVersion": "2025-06-18", "capabilities": {} }),
        )
        .await;
    assert_eq!(refusal["error"]["code"], -32054, "{refusal}");
}

#[test]
fn the_redeemer_never_names_the_inviter_after_an_allow_entry() {
    let alice = TestNode::start("alice");
    alice.json(&["serve", "notes", "--", stub()]);
    let bob = TestNode::start("bob");
    bob.json(&["serve", "mine", "--allow", "peer:alice", "--", stub()]);

    let chosen = refused(&bob.cli(&[
        "--json",
        "pair",
        &invite(&alice, &["notes"]),
        "--name",
        "alice",
    ]));
    assert_eq!(chosen["error"]["code"], 1005, "{chosen}");
    assert!(
        chosen["error"]["message"]
            .as_str()
            .unwrap()
            .contains("mine"),
        "{chosen}"
    );

    let paired = bob.json(&["pair", &invite(&alice, &["notes"])]);
    assert_eq!(paired["peer"], "alice-2", "{paired}");
    assert_eq!(paired["mounts"], json!(["alice-2/notes"]));
    let mine = bob.json(&["status"])["services"][0].clone();
    assert_eq!(mine["peers"], json!([]), "{mine}");
}

#[test]
fn renames_and_removals_follow_every_spelling_of_a_peers_name() {
    let alice = TestNode::start("alice");
    let bob = TestNode::start("bob");
    alice.trust(&bob);
    alice.json(&["serve", "a", "--allow", "bob", "--", stub()]);
    alice.json(&[
        "serve",
        "b",
        "--allow",
        "peer:bob",
        "--allow",
        "group:bob",
        "--",
        stub(),
    ]);
    alice.json(&["peers", "rename", "bob", "robert"]);
    assert_eq!(allow_of(&alice, "a"), [json!("peer:robert")]);
    assert_eq!(
        allow_of(&alice, "b"),
        [json!("peer:robert"), json!("group:bob")]
    );
    alice.json(&["grant", "robert", "a"]);
    alice.json(&["revoke", "robert", "a"]);
    assert!(allow_of(&alice, "a").is_empty());
    alice.json(&["peers", "remove", "robert"]);
    assert_eq!(allow_of(&alice, "b"), [json!("group:bob")]);
}

#[tokio::test(flavor = "multi_thread")]
async fn doctor_warns_of_allow_entries_that_match_nobody() {
    let alice = TestNode::start("alice");
    let bob = TestNode::start("bob");
    let carol = TestNode::start("carol");
    alice.trust(&bob);
    alice.json(&["serve", "notes", "--", stub()]);
    carol.json(&["pair", &invite(&alice, &["notes"])]);
    alice.json(&[
        "serve",
        "x",
        "--allow",
        "bob",
        "--allow",
        "group:x",
        "--allow",
        "peer:ghost",
        "--allow",
        "user:u1",
        "--",
        stub(),
    ]);
    let warned = |alice: &TestNode| -> Vec<String> {
        let report = alice.json(&["doctor"]);
        report["checks"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["status"] == "warn")
            .map(|c| c["message"].as_str().unwrap().to_owned())
            .collect()
    };
    let running = warned(&alice);
    // Stopped: the peers come from config and the store, once the node let go of it.
    let pid = alice.daemon_pid();
    alice.json(&["down"]);
    assert!(wait_exit(pid, ANSWER_TIMEOUT).await, "the node exits");
    for warnings in [running, warned(&alice)] {
        for entry in ["group:x", "peer:ghost", "user:u1"] {
            assert!(
                warnings
                    .iter()
                    .any(|w| w.contains("services.x.allow") && w.contains(entry)),
                "{entry}: {warnings:?}"
            );
        }
        assert!(
            warnings.iter().any(|w| w.contains("roster")),
            "{warnings:?}"
        );
        // bob (config) and carol (paired, by key) are real.
        assert!(
            !warnings
                .iter()
                .any(|w| w.contains("peer:bob") || w.contains("eid:")),
            "{warnings:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_redeem_refused_at_commit_leaves_no_grant() {
    let alice = TestNode::start("alice");
    alice.json(&["serve", "notes", "--", stub()]);
    let line = invite(&alice, &["notes"]);
    let parsed = Invite::decode(&line).unwrap();
    let secret = parsed.secret_bytes().unwrap();

    // mallory proves the secret, then holds her commit back while bob takes the only use.
    let (ep, target) = raw_client(&alice, false).await;
    let mut mallory = RawPairing::open(&ep, target).await;
    let first = mallory
        .ask(hello(&parsed, &secret, &ep.id(), "mallory"))
        .await;
    assert_eq!(first["ok"], true, "{first}");
    bob_pairs(&line);
    let done = mallory.ask(json!({ "commit": true })).await;
    mallory.close();
    assert_eq!(done["ok"], false, "{done}");

    let config = std::fs::read_to_string(alice.home().join("config.toml")).unwrap();
    assert!(
        !config.contains(&ep.id().to_string()),
        "a grant for the refused redeemer: {config}"
    );
    let peers = alice.json(&["peers"]);
    assert_eq!(peers["peers"].as_array().unwrap().len(), 1, "{peers}");
}

/// A fresh node named bob redeems `line`.
fn bob_pairs(line: &str) {
    let bob = TestNode::start("bob");
    assert_eq!(bob.json(&["pair", line])["peer"], "alice");
}

#[tokio::test(flavor = "multi_thread")]
async fn attempts_with_an_unknown_invite_write_nothing_and_a_wrong_secret_counts() {
    let alice = TestNode::start("alice");
    alice.json(&["serve", "notes", "--", stub()]);
    let line = invite(&alice, &["notes"]);
    let real = Invite::decode(&line).unwrap();
    // Minting the invite is audited, and each audit batch moves the log's high-water mark in
    // the store a moment later; a clean stop writes it, so after a restart only the attempts
    // below could change the store.
    alice.json(&["down"]);
    alice.json(&["up"]);
    let store = alice.home().join("state/mcpmesh.redb");
    let before = std::fs::read(&store).unwrap();

    let (ep, target) = raw_client(&alice, false).await;
    let mut unknown = real.clone();
    unknown.iid = "0".repeat(32);
    for _ in 0..30 {
        let mut attempt = RawPairing::open(&ep, target).await;
        let reply = attempt
            .ask(hello(&unknown, &[1; 32], &ep.id(), "stranger"))
            .await;
        attempt.close();
        assert_eq!(reply["ok"], false, "{reply}");
        assert!(
            reply["error"].as_str().unwrap().contains("unknown invite"),
            "{reply}"
        );
    }
    assert!(
        std::fs::read(&store).unwrap() == before,
        "attempts with an unknown invite wrote to the store"
    );

    let mut wrong = RawPairing::open(&ep, target).await;
    let reply = wrong
        .ask(hello(&real, &[1; 32], &ep.id(), "stranger"))
        .await;
    wrong.close();
    assert_eq!(reply["ok"], false, "{reply}");
    assert!(
        std::fs::read(&store).unwrap() != before,
        "a wrong secret for a real invite is counted"
    );
    // The invite still works: a wrong secret never burns it.
    bob_pairs(&line);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_caller_sees_its_own_sessions_in_status_and_watch_and_watch_fails_when_the_node_stops()
{
    let m = marker("caller-watch");
    let (alice, bob, _) = paired(&m);
    alice.json(&["grant", "bob", "notes"]);
    let mut cmd = tokio::process::Command::new(MCPMESH);
    cmd.arg("--home")
        .arg(bob.home())
        .args(["--json", "watch"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let mut watch = cmd.spawn().unwrap();
    let mut watch_err = watch.stderr.take().unwrap();
    let mut lines = mcpmesh_net::transport::FrameReader::new(watch.stdout.take().unwrap(), 1 << 20);
    // The next event of this kind (records written just before may still come first).
    let mut next = async |kind: &str| -> Value {
        loop {
            let line = tokio::time::timeout(ANSWER_TIMEOUT, lines.next_line())
                .await
                .expect("an event in time")
                .unwrap()
                .expect("an event, not the end");
            let v: Value = serde_json::from_slice(&line).unwrap();
            if kind.is_empty() || v["event"] == kind {
                return v;
            }
        }
    };
    assert_eq!(next("").await, json!({ "watching": true }));

    let mut s = bob.connect("alice/notes");
    s.initialize().await;
    let opened = next("outgoing_open").await;
    assert_eq!(
        (&opened["peer"], &opened["service"]),
        (&json!("alice"), &json!("notes"))
    );
    let status = bob.json(&["status"]);
    let outgoing = status["outgoing"]
        .as_array()
        .expect("status lists outgoing sessions");
    assert_eq!(outgoing.len(), 1, "{status}");
    assert_eq!(
        (&outgoing[0]["peer"], &outgoing[0]["service"]),
        (&json!("alice"), &json!("notes"))
    );
    assert!(outgoing[0]["since"].as_u64().is_some(), "{status}");
    let human = String::from_utf8(bob.cli(&["status"]).stdout).unwrap();
    assert!(human.contains("alice/notes"), "{human}");

    s.close_stdin();
    s.wait_eof().await;
    let closed = next("outgoing_close").await;
    assert_eq!(closed["ended"], "ok", "{closed}");
    assert!(
        bob.json(&["status"])["outgoing"]
            .as_array()
            .unwrap()
            .is_empty()
    );

    bob.json(&["down"]);
    let status = tokio::time::timeout(ANSWER_TIMEOUT, watch.wait())
        .await
        .expect("watch ends with the node")
        .unwrap();
    let mut stderr = String::new();
    tokio::io::AsyncReadExt::read_to_string(&mut watch_err, &mut stderr)
        .await
        .unwrap();
    assert!(!status.success(), "watch exited {status}");
    assert!(stderr.contains("the node stopped"), "stderr: {stderr}");
}

/// Right after `pair` returns, the new peer shows as reachable: the ping the new trust set off
/// may have reached the inviter before it committed (and been refused), so the pairing's end
/// has the peer checked again instead of leaving that refusal standing for the next seconds.
/// (It raced about one pairing in three before; six in a row make a regression show.)
#[test]
fn a_peer_just_paired_is_reachable_at_once() {
    for round in 0..6 {
        let alice = TestNode::start("alice");
        let bob = TestNode::start("bob");
        alice.serve_stub("notes", &[], None, "reach");
        let line = invite(&alice, &["notes"]);
        bob.json(&["pair", &line]);
        let peers = bob.json(&["peers"]);
        assert_eq!(
            peers["peers"][0]["reachable"], true,
            "round {round}: {peers}"
        );
    }
}

/// The name `node` gave the key `id`, from its `peers` list.
fn name_of(node: &TestNode, id: &str) -> String {
    node.json(&["peers"])["peers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["id"] == id)
        .and_then(|p| p["name"].as_str())
        .unwrap_or_else(|| panic!("{} does not list {id}", node.name))
        .to_owned()
}

#[test]
fn a_dotted_peer_name_is_the_rosters_chosen_ones_are_refused_and_suggested_ones_lose_the_dot() {
    let alice = TestNode::start("alice");
    alice.json(&["serve", "notes", "--", stub()]);
    // Both sides suggest a `USER.DEVICE`-shaped nickname: each side names the other without it.
    let bob = TestNode::start("u5.o5");
    bob.json(&["serve", "mine", "--", stub()]);
    let carol = TestNode::start("u6.o6");
    carol.json(&["serve", "theirs", "--", stub()]);
    let paired = bob.json(&["pair", &invite(&alice, &["notes"])]);
    assert_eq!(paired["peer"], "alice", "{paired}");
    assert_eq!(name_of(&alice, &bob.id), "u5-o5");
    let paired = bob.json(&["pair", &invite(&carol, &["theirs"])]);
    assert_eq!(paired["peer"], "u6-o6", "{paired}");
    assert_eq!(paired["mounts"], json!(["u6-o6/theirs"]), "{paired}");

    // A name the user gives is refused plainly, on every verb that gives one.
    let dave = TestNode::start("dave");
    let line = invite(&alice, &["notes"]);
    let chosen = refused(&dave.cli(&["--json", "pair", &line, "--name", "u1.d1"]));
    let added = refused(&alice.cli(&["--json", "peers", "add", "u1.d1", &dave.id]));
    let renamed = refused(&alice.cli(&["--json", "peers", "rename", "u5-o5", "u5.o5"]));
    for error in [&chosen, &added, &renamed] {
        let message = error["error"]["message"].as_str().unwrap();
        assert!(message.contains("roster"), "{error}");
        assert!(message.contains("USER.DEVICE"), "{error}");
    }
    assert_eq!(name_of(&alice, &bob.id), "u5-o5", "the rename did nothing");
    // The refused `pair` used nothing: the same line still pairs under an undotted name.
    let paired = dave.json(&["pair", &line, "--name", "u1-d1"]);
    assert_eq!(paired["peer"], "u1-d1", "{paired}");
}

/// The checks `node`'s `doctor --offline --json` reports, by name.
fn doctor_checks(node: &TestNode) -> Vec<(String, String, String)> {
    let out = node.cli(&["--json", "doctor", "--offline"]);
    let report: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("{}", String::from_utf8_lossy(&out.stdout)));
    report["checks"]
        .as_array()
        .unwrap_or_else(|| panic!("{report}"))
        .iter()
        .map(|c| {
            let s = |k: &str| c[k].as_str().unwrap_or_default().to_owned();
            (s("check"), s("status"), s("message"))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hand_edit_reloaded_at_sighup_reaches_an_open_session_and_is_audited_without_env_values()
{
    let m = marker("hand-rules");
    let (alice, bob, _) = paired(&m);
    let mut s = bob.connect("alice/notes");
    let init = s.initialize_as("2025-11-25").await;
    assert_eq!(init["result"]["protocolVersion"], "2025-11-25", "{init}");
    let listed = s.request("tools/list", json!({})).await;
    assert!(listed.to_string().contains("\"echo\""), "{listed}");
    // A second session whose caller never listed the tools has nothing to refresh.
    let mut quiet = bob.connect("alice/notes");
    quiet.initialize_as("2025-11-25").await;
    let clean = doctor_checks(&alice);
    assert!(
        !clean.iter().any(|(c, _, _)| c == "config loaded"),
        "{clean:?}"
    );

    // By hand: bob may no longer echo, and the service gets a token in its env.
    let path = alice.home().join("config.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    let edited = text.replace(
        "[services.notes]",
        "[services.notes]\nenv = { API_TOKEN = \"s3cret-t0ken\" }",
    ) + "\n[[services.notes.tools]]\nwho = [\"bob\"]\ndeny = [\"echo\"]\n";
    std::fs::write(&path, edited).unwrap();
    let waiting = doctor_checks(&alice);
    let line = waiting
        .iter()
        .find(|(c, _, _)| c == "config loaded")
        .unwrap_or_else(|| panic!("doctor does not say the edit is not loaded: {waiting:?}"));
    assert_eq!(line.1, "warn", "{line:?}");
    assert!(
        line.2.contains("has not loaded") && line.2.contains("kill -HUP"),
        "{line:?}"
    );
    // Until then the session is as it was.
    let echo = s.call("echo", json!({ "text": "hi" })).await;
    assert!(echo["result"].is_object(), "{echo}");

    alice.signal(rustix::process::Signal::HUP);
    let told = s
        .notified("notifications/tools/list_changed", ANSWER_TIMEOUT)
        .await;
    assert!(told.is_some(), "no list_changed reached bob's open session");
    let echo = s.call("echo", json!({ "text": "hi" })).await;
    assert_eq!(echo["error"]["code"], -32054, "{echo}");
    assert!(whoami(&mut s).await["MCPMESH_PEER_NAME"] == "bob");
    let echo = quiet.call("echo", json!({ "text": "hi" })).await;
    assert_eq!(echo["error"]["code"], -32054, "{echo}");
    assert!(quiet.skipped.is_empty(), "{:?}", quiet.skipped);
    let after = doctor_checks(&alice);
    assert!(
        !after.iter().any(|(c, _, _)| c == "config loaded"),
        "{after:?}"
    );

    // The reload is audited: what changed, before and after, env by its keys only.
    let changes = || {
        alice.json(&["audit", "tail", "-n", "1000"])["records"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["event"] == "policy_changed" && r["by"] == "reload")
            .cloned()
            .collect::<Vec<Value>>()
    };
    assert!(eventually(ANSWER_TIMEOUT, || changes().len() >= 2).await);
    let records = changes();
    let of = |what: &str| {
        records
            .iter()
            .find(|r| r["what"] == what)
            .unwrap_or_else(|| panic!("no {what} record: {records:?}"))
            .clone()
    };
    let tools = of("tools");
    assert_eq!(tools["service"], "notes");
    assert_eq!(tools["before"], json!([]), "{tools}");
    assert_eq!(
        tools["after"],
        json!([{ "who": ["peer:bob"], "allow": [], "deny": ["echo"] }]),
        "{tools}"
    );
    let env = of("env");
    assert_eq!(
        (&env["before"], &env["after"]),
        (&json!([]), &json!(["API_TOKEN"])),
        "{env}"
    );
    assert_eq!(records.len(), 2, "nothing else changed: {records:?}");
    let log = std::fs::read_dir(alice.home().join("state/audit"))
        .unwrap()
        .flatten()
        .map(|f| std::fs::read_to_string(f.path()).unwrap_or_default())
        .collect::<String>();
    assert!(
        log.contains("API_TOKEN"),
        "the audit log is where it was looked for"
    );
    assert!(
        !log.contains("s3cret-t0ken"),
        "an env value reached the audit log"
    );
}
