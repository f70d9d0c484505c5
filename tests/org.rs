//! Org rosters end to end, through the CLI and real nodes: a team shares a service by group
//! with no pairing between its members; a removal reaches live sessions on other nodes and
//! wins over static trust; forged, replayed, expired and foreign rosters are refused and
//! audited; a node that was offline catches up from any member; a join killed halfway leaves
//! the device on both sides or neither; damaged, used and wrong-kind join lines are refused
//! plainly; an expired roster grants nothing by group and doctor says so; a removed device
//! learns it from its removal notice, says so and stops dialing, and comes back only when the
//! admin readmits its key or with a new key; a non-member fetching the roster gets nothing.

mod common;

use std::time::{Duration, Instant};

use common::*;
use mcpmesh::roster::{CLOCK_SKEW_SECS, DEFAULT_VALIDITY_SECS, Device, Member, Roster};
use mcpmesh::roster::{SignedRoster, successor};
use serde_json::{Value, json};

/// Members pull from each other this often (seconds) in the suites that wait for a pull.
const SYNC_FAST: &str = "[org]\nsync_secs = 2\n";

/// Longest a roster may take to reach every member before a test fails.
const CONVERGE: Duration = Duration::from_secs(30);

/// `mcpmesh --json org ARGS…`, failing the test on an error.
fn org(node: &TestNode, args: &[&str]) -> Value {
    let mut all = vec!["org"];
    all.extend_from_slice(args);
    node.json(&all)
}

/// The org part of `node`'s `status` (`null` outside an org). Unlike `org status`, which
/// asks every member for its serial (an exchange that may carry a roster), it only reads
/// what the node holds: waiting on it leaves the spreading to pushes and pulls.
fn org_summary(node: &TestNode) -> Value {
    node.json(&["status"])["org"].clone()
}

/// The roster serial `node` holds, or `None` when it holds none.
fn serial_of(node: &TestNode) -> Option<u64> {
    org_summary(node)["serial"].as_u64()
}

/// What `node`'s `peers` says of the key `id`, if it lists it.
fn peer_entry(node: &TestNode, id: &str) -> Option<Value> {
    node.json(&["peers"])["peers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["id"] == id)
        .cloned()
}

/// A failed verb: exit status 1 and one JSON line on stderr, returned.
fn refused(out: &std::process::Output) -> Value {
    assert_eq!(
        out.status.code(),
        Some(1),
        "expected a refusal: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one line on stderr: {stderr}");
    let v: Value = serde_json::from_str(lines[0]).unwrap_or_else(|_| panic!("{stderr}"));
    assert!(v["error"]["message"].as_str().is_some(), "{v}");
    v
}

/// The admin mints an invite for `node`'s nickname with `groups`; `node` joins with it.
/// Returns the join result, its fields checked.
fn join(admin: &TestNode, node: &TestNode, groups: &str) -> Value {
    let invite = org(admin, &["invite", &node.name, "--groups", groups]);
    let line = invite["invite"].as_str().unwrap();
    assert!(line.starts_with("mcpmesh-join:"), "{invite}");
    assert_eq!(invite["user"], node.name.as_str(), "{invite}");
    assert_eq!(invite["groups"], json!([groups]), "{invite}");
    assert!(
        invite["expires_at"].as_u64().unwrap() > unix_now(),
        "{invite}"
    );
    let joined = node.json(&["join", line]);
    assert_eq!(joined["org"], "acme", "{joined}");
    assert_eq!(joined["user"], node.name.as_str(), "{joined}");
    assert_eq!(joined["groups"], json!([groups]), "{joined}");
    assert_eq!(
        joined["code"].as_str().unwrap().split('-').count(),
        3,
        "{joined}"
    );
    assert!(joined["serial"].as_u64().is_some(), "{joined}");
    // The admin's node shows the same three words, as a pairing's inviter does.
    let status = admin.json(&["status"]);
    let shown = status["pairings"].as_array().unwrap().iter().any(|p| {
        p["code"] == joined["code"] && p["peer"].as_str().unwrap().contains(node.name.as_str())
    });
    assert!(
        shown,
        "the admin's status shows {}'s code: {status}",
        node.name
    );
    joined
}

/// alice (the admin), bob (eng), carol (sales) and dave (eng), all in org `acme`.
struct Team {
    alice: TestNode,
    bob: TestNode,
    carol: TestNode,
    dave: TestNode,
}

impl Team {
    fn start(extra: &str) -> Self {
        Self::start_after(extra, |_| {})
    }

    /// The team, with `before` run once the four nodes are up and before the org exists.
    fn start_after(extra: &str, before: impl FnOnce(&Team)) -> Self {
        let node = |name: &str| TestNode::start_with(name, extra, &[]);
        let t = Team {
            alice: node("alice"),
            bob: node("bob"),
            carol: node("carol"),
            dave: node("dave"),
        };
        before(&t);
        let created = org(&t.alice, &["create", "acme"]);
        assert_eq!(created["org"], "acme", "{created}");
        assert_eq!(created["serial"], 1, "{created}");
        assert_eq!(created["user"], "alice", "{created}");
        assert_eq!(created["root"].as_str().unwrap().len(), 64, "{created}");
        assert!(created["expires_at"].as_u64().unwrap() > unix_now());
        let mut last = 1;
        for (node, groups) in [(&t.bob, "eng"), (&t.carol, "sales"), (&t.dave, "eng")] {
            let serial = join(&t.alice, node, groups)["serial"].as_u64().unwrap();
            assert!(serial > last, "each join signs a newer roster");
            last = serial;
        }
        t
    }

    fn all(&self) -> [&TestNode; 4] {
        [&self.alice, &self.bob, &self.carol, &self.dave]
    }

    /// The admin's current serial.
    fn serial(&self) -> u64 {
        org(&self.alice, &["members"])["serial"].as_u64().unwrap()
    }
}

/// Waits until every node in `nodes` holds roster `serial`, or fails the test.
async fn converged(nodes: &[&TestNode], serial: u64) {
    let started = Instant::now();
    let all = eventually(CONVERGE, || {
        nodes.iter().all(|n| serial_of(n) == Some(serial))
    })
    .await;
    let held: Vec<(String, Option<u64>)> = nodes
        .iter()
        .map(|n| (n.name.clone(), serial_of(n)))
        .collect();
    assert!(all, "not every node reached serial {serial}: {held:?}");
    println!("serial {serial} everywhere after {:?}", started.elapsed());
}

async fn whoami(s: &mut McpSession) -> Value {
    s.call("whoami", json!({})).await["result"]["structuredContent"].clone()
}

/// A session `node` opens to `target` that must be refused; returns the error.
async fn refused_session(node: &TestNode, target: &str) -> Value {
    let mut s = node.connect(target);
    let answer = s
        .request(
            "initialize",
            json!({ "protocolVersion": "2025-06-18", "capabilities": {} }),
        )
        .await;
    assert!(
        answer.get("result").is_none() && answer["error"]["code"].as_i64().is_some(),
        "{} → {target} was not refused: {answer}",
        node.name
    );
    answer["error"].clone()
}

/// A session `node` opens to `target` that must be admitted; closed again.
async fn admitted_session(node: &TestNode, target: &str) {
    let mut s = node.connect(target);
    let answer = s.initialize().await;
    assert_eq!(
        answer["result"]["serverInfo"]["name"], "echo-stub",
        "{} → {target}: {answer}",
        node.name
    );
    s.close_stdin();
    s.wait_eof().await;
}

/// The newest audit records of a running node (records are written within milliseconds).
fn audit(node: &TestNode) -> Vec<Value> {
    node.json(&["audit", "tail", "-n", "1000"])["records"]
        .as_array()
        .expect("audit records")
        .clone()
}

/// The `trust` actions in the node's audit log, oldest first.
fn trust_actions(node: &TestNode) -> Vec<String> {
    audit(node)
        .iter()
        .filter(|r| r["event"] == "trust")
        .filter_map(|r| r["action"].as_str().map(str::to_owned))
        .collect()
}

/// The node's `roster_refused` records with this `reason`.
fn refusals(node: &TestNode, reason: &str) -> Vec<Value> {
    audit(node)
        .into_iter()
        .filter(|r| r["event"] == "roster_refused" && r["reason"] == reason)
        .collect()
}

/// Waits for a `roster_installed` record of `serial` on `node` and returns it.
async fn installed(node: &TestNode, serial: u64) -> Value {
    let find = || {
        audit(node)
            .into_iter()
            .find(|r| r["event"] == "roster_installed" && r["serial"] == serial)
    };
    assert!(
        eventually(ANSWER_TIMEOUT, || find().is_some()).await,
        "no roster_installed record of serial {serial} on {}: {:?}",
        node.name,
        audit(node)
    );
    find().unwrap()
}

/// The org's root key (from the admin's `org-root.key`, hex) and the roster it signed last
/// (from an `org export-root` file named `file`).
fn root_and_roster(admin: &TestNode, file: &str) -> (iroh::SecretKey, SignedRoster) {
    let text = std::fs::read_to_string(admin.home().join("org-root.key")).unwrap();
    let key = mcpmesh::keys::parse_hex(text.trim()).expect("org-root.key holds a hex key");
    let path = admin.home().join(file);
    let exported = org(admin, &["export-root", path.to_str().unwrap()]);
    assert_eq!(exported["org"], "acme", "{exported}");
    let (exported_key, roster) = mcpmesh::roster::root::import(&path).unwrap();
    assert_eq!(
        exported_key.to_bytes(),
        key.to_bytes(),
        "the export holds the key in org-root.key"
    );
    assert_eq!(Some(roster.roster.serial), exported["serial"].as_u64());
    (key, roster)
}

/// Offers `text` over `mcpmesh/roster/1` as a trusted peer claiming `claimed` under `root`,
/// keeps the connection open until `done` holds (bounded), and returns the node's answer to
/// the offer.
async fn deliver(
    ep: &iroh::Endpoint,
    target: iroh::EndpointId,
    root: &str,
    claimed: u64,
    text: &str,
    done: impl FnMut() -> bool,
) -> (Value, bool) {
    let conn = ep
        .connect(target, mcpmesh::roster::sync::ALPN_ROSTER)
        .await
        .expect("a trusted key may dial the roster ALPN");
    let (send, recv) = conn.open_bi().await.unwrap();
    let mut wire = mcpmesh_net::transport::NdjsonTransport::new(
        recv,
        send,
        mcpmesh::roster::sync::MAX_MESSAGE,
    );
    wire.send_value(json!({ "root": root, "serial": claimed }))
        .await
        .unwrap();
    let answer = tokio::time::timeout(ANSWER_TIMEOUT, wire.recv_value())
        .await
        .expect("an answer to the offer in time")
        .expect("a readable answer")
        .expect("an answer before the stream ends");
    wire.send_value(json!({ "roster": text })).await.unwrap();
    let _ = wire.writer_mut().finish();
    let seen = eventually(ANSWER_TIMEOUT, done).await;
    conn.close(0u32.into(), b"done");
    (answer, seen)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_team_of_four_shares_a_service_by_group_and_the_child_sees_user_and_groups() {
    let m = marker("team");
    let t = Team::start("");
    t.dave.serve_stub("notes", &["group:eng"], None, &m);
    let serial = t.serial();
    converged(&t.all(), serial).await;

    // bob and dave never paired: the roster is all bob's node knows dave by.
    let dave = peer_entry(&t.bob, &t.dave.id).expect("bob's node lists dave");
    assert_eq!(dave["source"], "roster", "{dave}");
    assert_eq!(dave["user"], "dave", "{dave}");
    assert_eq!(dave["groups"], json!(["eng"]), "{dave}");

    let mut s = t.bob.connect("dave/notes");
    assert_eq!(
        s.initialize().await["result"]["serverInfo"]["name"],
        "echo-stub"
    );
    let env = whoami(&mut s).await;
    assert_eq!(env["MCPMESH_PEER_USER"], "bob", "{env}");
    assert_eq!(env["MCPMESH_PEER_GROUPS"], "eng", "{env}");
    assert_eq!(
        env["MCPMESH_PEER_EID"],
        format!("eid:{}", t.bob.id),
        "{env}"
    );

    // carol is a member, but not in eng: what a missing service gets.
    let error = refused_session(&t.carol, "dave/notes").await;
    assert_eq!(error["code"], -32054, "{error}");
    assert!(
        !error["message"]
            .as_str()
            .unwrap()
            .contains("does not trust"),
        "carol is a member: dave's node admits her, its notes do not: {error}"
    );

    let members = org(&t.alice, &["members"]);
    assert_eq!(members["org"], "acme");
    assert_eq!(members["serial"], serial);
    assert_eq!(members["revoked"], json!([]), "{members}");
    let list = members["members"].as_array().unwrap();
    assert_eq!(list.len(), 4, "{members}");
    for (node, groups) in [
        (&t.alice, json!([])),
        (&t.bob, json!(["eng"])),
        (&t.carol, json!(["sales"])),
        (&t.dave, json!(["eng"])),
    ] {
        let member = list
            .iter()
            .find(|m| m["user"] == node.name.as_str())
            .unwrap_or_else(|| panic!("{} is listed: {members}", node.name));
        assert_eq!(member["groups"], groups, "{member}");
        let devices = member["devices"].as_array().unwrap();
        assert_eq!(devices.len(), 1, "{member}");
        assert_eq!(devices[0]["eid"], node.id.as_str(), "{member}");
        assert_eq!(devices[0]["mount"], node.name.as_str(), "{member}");
    }

    // Every member sees every device, reachable and at the same serial.
    let seen = org(&t.dave, &["status"]);
    assert_eq!(seen["admin"], false, "{seen}");
    assert_eq!(seen["expired"], false, "{seen}");
    let devices = seen["members"].as_array().unwrap();
    assert_eq!(devices.len(), 4, "{seen}");
    for d in devices {
        assert_eq!(d["reachable"], true, "{d}");
        assert_eq!(d["serial"], serial, "{d}");
        assert_eq!(d["self"], d["user"] == "dave", "{d}");
    }

    let status = t.bob.json(&["status"]);
    assert_eq!(status["org"]["name"], "acme", "{status}");
    assert_eq!(status["org"]["serial"], serial, "{status}");
    assert_eq!(status["org"]["admin"], false, "{status}");
    assert_eq!(t.alice.json(&["status"])["org"]["admin"], true);

    // Every change of trust is in the audit log, on the node that made it.
    let actions = trust_actions(&t.alice);
    assert!(actions.iter().any(|a| a == "org_create"), "{actions:?}");
    assert_eq!(
        actions.iter().filter(|a| *a == "org_invite").count(),
        3,
        "{actions:?}"
    );
    for member in [&t.bob, &t.carol, &t.dave] {
        let actions = trust_actions(member);
        assert!(actions.iter().any(|a| a == "org_join"), "{actions:?}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn org_remove_cuts_a_live_session_on_another_node_within_five_seconds() {
    let m = marker("org-remove");
    // carol trusted bob's key before there was an org, and serves him by her name for him.
    let t = Team::start_after("", |t| {
        let mut add = vec!["peers", "add", "robert", t.bob.id.as_str()];
        for a in &t.bob.addrs {
            add.extend(["--addr", a.as_str()]);
        }
        t.carol.json(&add);
        t.carol.serve_stub("diary", &["robert"], None, &m);
    });
    t.dave.serve_stub("notes", &["group:eng"], None, &m);
    converged(&t.all(), t.serial()).await;
    // On carol's node bob keeps her name for him and gains his user and groups.
    let robert = peer_entry(&t.carol, &t.bob.id).expect("carol lists bob");
    assert_eq!(robert["name"], "robert", "{robert}");
    assert_eq!(robert["user"], "bob", "{robert}");
    assert_eq!(robert["groups"], json!(["eng"]), "{robert}");
    admitted_session(&t.bob, "carol/diary").await;

    let mut s = t.bob.connect("dave/notes");
    s.initialize().await;
    s.start_long_call(json!("long"), 30_000).await;
    let started = Instant::now();
    let removed = org(&t.alice, &["remove", "bob"]);
    let answer = s.recv().await; // `None`: the stream ended
    let cut = started.elapsed();
    eprintln!("REMOVAL-TO-CUT: org remove bob → bob's live session on dave ended after {cut:?}");
    if let Some(answer) = &answer {
        assert_eq!(answer["id"], "long", "{answer}");
        // dave severs it for the trust change (-32052), unless bob's own node, told of its
        // removal at the same moment, let go of dave first (the session lost: -32055).
        let code = answer["error"]["code"].as_i64();
        assert!(matches!(code, Some(-32052 | -32055)), "{answer}");
        s.wait_eof().await;
    }
    assert!(cut < Duration::from_secs(5), "the cut took {cut:?}");

    let serial = removed["serial"].as_u64().unwrap();
    let recorded = || trust_actions(&t.alice).iter().any(|a| a == "org_remove");
    assert!(
        eventually(ANSWER_TIMEOUT, recorded).await,
        "{:?}",
        trust_actions(&t.alice)
    );
    assert!(
        removed["revoked"]
            .as_array()
            .unwrap()
            .iter()
            .any(|k| k == t.bob.id.as_str()),
        "{removed}"
    );
    converged(&[&t.alice, &t.carol, &t.dave], serial).await;
    let members = org(&t.alice, &["members"]);
    assert!(
        !members["members"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["user"] == "bob"),
        "{members}"
    );

    // bob's node was told: it no longer knows the members, so it dials none of them.
    let error = refused_session(&t.bob, "dave/notes").await;
    assert!(
        error["message"].as_str().unwrap().contains("no peer named"),
        "{error}"
    );
    // His key is refused at the gate, before any MCP byte: revoked, not merely out of a
    // group; and at carol too, where revoked wins over her own static trust in bob's key.
    let bob_key = device_key(&t.bob);
    for target in [&t.dave, &t.carol] {
        let (ep, id) = endpoint_as(bob_key.clone(), target).await;
        let preamble = b"{\"mcpmesh\":1,\"service\":\"notes\"}\n{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}\n";
        let answer = exchange(&ep, id, preamble).await;
        assert_eq!(answer, None, "{} answered a revoked key", target.name);
        ep.close().await;
    }
    let robert = peer_entry(&t.carol, &t.bob.id);
    assert!(robert.is_none(), "carol lists a revoked key: {robert:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn rosters_that_are_forged_replayed_expired_or_from_another_org_are_refused_and_audited() {
    let alice = TestNode::start("alice");
    let bob = TestNode::start("bob");
    org(&alice, &["create", "acme"]);
    let (_, first) = root_and_roster(&alice, "root-at-1.json");
    join(&alice, &bob, "eng");
    let (root, current) = root_and_roster(&alice, "root-now.json");
    let held = current.roster.serial;
    converged(&[&alice, &bob], held).await;
    assert!(first.roster.serial < held);
    let root_hex = root.public().to_string();
    assert_eq!(current.roster.root, root_hex);

    let now = unix_now();
    let next = successor(&current.roster, now, DEFAULT_VALIDITY_SECS);
    let sign = |r: Roster| SignedRoster::sign(r, &root).unwrap().text;

    // Signed, then given bob a group on the way.
    let mut forged: Value = serde_json::from_str(&sign(next.clone())).unwrap();
    for member in forged["roster"]["members"].as_array_mut().unwrap() {
        if member["user"] == "bob" {
            member["groups"] = json!(["eng", "admin"]);
        }
    }
    let forged = forged.to_string();
    // The org's root on the roster, another key's signature under it.
    let other = iroh::SecretKey::generate();
    let wrong_key = SignedRoster::sign(next.clone(), &other).unwrap().text;
    let expired = sign(Roster {
        issued_at: now - 3 * 3600,
        expires_at: now - 2 * CLOCK_SKEW_SECS,
        ..next.clone()
    });
    let early = sign(Roster {
        issued_at: now + 3 * CLOCK_SKEW_SECS,
        expires_at: now + DEFAULT_VALIDITY_SECS,
        ..next.clone()
    });
    let foreign = SignedRoster::sign(
        Roster {
            org: "evil".into(),
            root: other.public().to_string(),
            ..next.clone()
        },
        &other,
    )
    .unwrap()
    .text;
    let mut twice = next.clone();
    twice.members.push(Member {
        user: "mallory".into(),
        groups: vec![],
        devices: vec![Device {
            name: "laptop".into(),
            eid: bob.id.clone(),
            addrs: vec![],
            relay: None,
        }],
    });
    let duplicated = sign(twice);

    let cases = [
        ("forged", "bad_signature", forged),
        ("signed by another key", "bad_signature", wrong_key),
        // (The very roster held, sent again, is a push and a pull crossing: no refusal.)
        ("replayed", "stale", first.text.clone()),
        ("expired", "expired", expired),
        ("issued in the future", "not_yet_valid", early),
        ("not a roster", "malformed", "{\"roster\": 1}".to_owned()),
        ("from another org", "other_org", foreign),
        ("an endpoint twice", "invalid", duplicated),
    ];
    for (case, reason, text) in cases {
        // A sender of its own per case: a sender's repeats of one reason are recorded once a
        // minute (see the foreign-root test below).
        let (ep, target) = raw_client(&bob, true).await;
        let before = refusals(&bob, reason).len();
        // Claiming a newer serial, as an attacker would, so the node asks for the roster.
        let (answer, seen) = deliver(&ep, target, &root_hex, held + 1, &text, || {
            refusals(&bob, reason).len() > before
        })
        .await;
        assert_eq!(answer["serial"], held, "{case}: {answer}");
        assert!(answer.get("roster").is_none(), "{case}: {answer}");
        assert!(
            seen,
            "{case}: no roster_refused record with reason {reason}: {:?}",
            audit(&bob)
                .iter()
                .filter(|r| r["event"].as_str().unwrap_or("").starts_with("roster"))
                .collect::<Vec<_>>()
        );
        let record = refusals(&bob, reason).pop().unwrap();
        assert!(
            record["from"].as_str().unwrap().starts_with("tester"),
            "{case}: {record}"
        );
        assert_eq!(serial_of(&bob), Some(held), "{case} changed the roster");
    }
    let status = org(&bob, &["status"]);
    assert_eq!(status["root"], root_hex.as_str(), "{status}");
    assert_eq!(status["serial"], held, "{status}");

    let good = sign(next.clone());
    let (ep, target) = raw_client(&bob, true).await;
    let (_, seen) = deliver(&ep, target, &root_hex, next.serial, &good, || {
        serial_of(&bob) == Some(next.serial)
    })
    .await;
    assert!(seen, "a valid newer roster is installed: {:?}", audit(&bob));
    let record = installed(&bob, next.serial).await;
    assert!(
        record["from"].as_str().unwrap().starts_with("tester"),
        "{record}"
    );
    assert_eq!(record["org"], "acme", "{record}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_node_offline_during_a_removal_converges_from_any_member_when_it_returns() {
    let m = marker("org-offline");
    let t = Team::start(SYNC_FAST);
    t.carol.serve_stub("diary", &["user:bob"], None, &m);
    converged(&t.all(), t.serial()).await;
    admitted_session(&t.bob, "carol/diary").await;

    assert_eq!(t.carol.json(&["down"])["stopped"], true);
    let serial = org(&t.alice, &["remove", "bob"])["serial"]
        .as_u64()
        .unwrap();
    converged(&[&t.dave], serial).await;
    // Only dave holds the news now: the admin and bob are gone too.
    t.alice.json(&["down"]);
    t.bob.json(&["down"]);

    let started = Instant::now();
    t.carol.json(&["up"]);
    converged(&[&t.carol], serial).await;
    eprintln!(
        "OFFLINE-CATCH-UP: carol reached serial {serial} {:?} after it came back",
        started.elapsed()
    );
    let record = installed(&t.carol, serial).await;
    assert_eq!(record["from"], "dave", "{record}");

    let error = refused_session(&t.bob, "carol/diary").await;
    assert_eq!(error["code"], -32054, "{error}");
}

/// Where a round of [`kill_9_mid_join_leaves_the_member_on_both_sides_or_neither`] kills.
#[derive(Clone, Copy, Debug)]
enum KillAt {
    /// The admin's node, before the join is run: the join cannot have happened.
    AdminBeforeTheJoin,
    /// `victim` this many ms into the join: wherever that lands.
    Into(u64),
    /// `victim` once the join returned: it happened.
    AfterTheJoin,
}

#[tokio::test(flavor = "multi_thread")]
async fn kill_9_mid_join_leaves_the_member_on_both_sides_or_neither() {
    let mut rounds = vec![KillAt::AdminBeforeTheJoin, KillAt::AfterTheJoin];
    rounds.extend([20u64, 40, 60, 70, 80, 90, 100, 120].map(KillAt::Into));
    let (mut both, mut neither) = (0, 0);
    for (round, at) in rounds.into_iter().enumerate() {
        let alice = TestNode::start_with("alice", SYNC_FAST, &[]);
        let bob = TestNode::start_with("bob", SYNC_FAST, &[]);
        org(&alice, &["create", "acme"]);
        let invite = org(&alice, &["invite", "bob", "--groups", "eng"]);
        let line = invite["invite"].as_str().unwrap().to_owned();
        let victim = if round % 2 == 0 { &alice } else { &bob };
        let victim = match at {
            KillAt::AdminBeforeTheJoin => &alice,
            _ => victim,
        };
        if let KillAt::AdminBeforeTheJoin = at {
            victim.kill_daemon().await;
        }
        let joining = bob
            .command(&["--json", "join", &line])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let joined = match at {
            KillAt::Into(delay_ms) => {
                // Where in the join the kill lands is the variable under test, not
                // synchronization.
                tokio::time::sleep(Duration::from_millis(delay_ms)).await;
                victim.kill_daemon().await;
                wait_output(joining).await.status.success()
            }
            KillAt::AfterTheJoin => {
                let out = wait_output(joining).await;
                assert!(
                    out.status.success(),
                    "round {round}: the join failed: {out:?}"
                );
                victim.kill_daemon().await;
                true
            }
            KillAt::AdminBeforeTheJoin => {
                let out = wait_output(joining).await;
                assert!(
                    !out.status.success(),
                    "round {round}: joined a dead admin: {out:?}"
                );
                false
            }
        };
        // Only the killed node comes back: a joiner left pending asks the admin's node at
        // start, and an admin that committed pushes its roster to the pending joiner.
        assert_eq!(victim.json(&["down"])["stopped"], true);
        victim.json(&["up"]);
        let alice_has = || {
            org(&alice, &["members"])["members"]
                .as_array()
                .unwrap()
                .iter()
                .any(|m| m["user"] == "bob")
        };
        let bob_has = || serial_of(&bob).is_some_and(|s| s > 0);
        let agreed = eventually(CONVERGE, || alice_has() == bob_has()).await;
        let what = format!("round {round} ({at:?}, {} killed)", victim.name);
        assert!(
            agreed,
            "{what}: alice has bob: {}, bob's org: {}",
            alice_has(),
            org_summary(&bob)
        );
        match at {
            KillAt::AdminBeforeTheJoin => assert!(!alice_has(), "{what}: bob is a member"),
            KillAt::AfterTheJoin => assert!(alice_has(), "{what}: bob is no member"),
            // A join that said it succeeded was committed, whoever died after.
            KillAt::Into(_) if joined => assert!(alice_has(), "{what}: the join said it succeeded"),
            KillAt::Into(_) => {}
        }
        if alice_has() {
            let serial = org(&alice, &["members"])["serial"].as_u64().unwrap();
            converged(&[&bob], serial).await;
            both += 1;
        } else {
            neither += 1;
        }
    }
    eprintln!("joins completed: {both}, undone or never started: {neither}");
    assert!(
        both > 0 && neither > 0,
        "both outcomes occur: {both} and {neither}"
    );
}

/// What `child` printed, once it exited (waited for off the runtime).
async fn wait_output(child: std::process::Child) -> std::process::Output {
    tokio::task::spawn_blocking(move || child.wait_with_output())
        .await
        .unwrap()
        .unwrap()
}

#[test]
fn a_damaged_pairing_or_used_join_line_is_refused_with_one_json_error_line() {
    let alice = TestNode::start("alice");
    let bob = TestNode::start("bob");
    let carol = TestNode::start("carol");
    org(&alice, &["create", "acme"]);
    let line = org(&alice, &["invite", "bob"])["invite"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(bob.json(&["join", &line])["user"], "bob");

    let used = refused(&carol.cli(&["--json", "join", &line]));
    assert_eq!(used["error"]["code"], 1007, "{used}");

    let good = org(&alice, &["invite", "carol"])["invite"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut chars: Vec<char> = good.chars().collect();
    let i = chars.len() / 2;
    chars[i] = if chars[i] == 'x' { 'y' } else { 'x' };
    let tampered: String = chars.into_iter().collect();
    let damaged = refused(&carol.cli(&["--json", "join", &tampered]));
    assert!(damaged["error"]["code"].as_i64().is_some(), "{damaged}");
    assert!(
        damaged["error"]["message"]
            .as_str()
            .unwrap()
            .contains("damaged"),
        "{damaged}"
    );

    alice.json(&["serve", "notes", "--", stub()]);
    let pairing = alice.json(&["invite", "notes"])["invite"]
        .as_str()
        .unwrap()
        .to_owned();
    let wrong_kind = refused(&carol.cli(&["--json", "join", &pairing]));
    assert!(
        wrong_kind["error"]["code"].as_i64().is_some(),
        "{wrong_kind}"
    );
    assert!(
        wrong_kind["error"]["message"]
            .as_str()
            .unwrap()
            .contains("mcpmesh pair"),
        "{wrong_kind}"
    );
    assert!(
        serial_of(&carol).is_none(),
        "the refusals left carol outside"
    );

    let joined = carol.json(&["join", &good]);
    assert_eq!(joined["user"], "carol", "the good line still works");

    // The invite secrets are nowhere in either side's log or audit records.
    for line in [&line, &good] {
        let secret = mcpmesh::roster::invite::JoinInvite::decode(line)
            .unwrap()
            .secret;
        for node in [&alice, &bob, &carol] {
            assert!(!node.log().contains(&secret), "{}'s log", node.name);
            for entry in std::fs::read_dir(node.home().join("state/audit")).unwrap() {
                let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
                assert!(!text.contains(&secret), "{}'s audit", node.name);
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_expired_roster_stops_group_grants_and_doctor_says_so() {
    let m = marker("org-expired");
    let alice = TestNode::start("alice");
    let bob = TestNode::start("bob");
    let dave = TestNode::start("dave");
    org(&alice, &["create", "acme"]);
    join(&alice, &bob, "eng");
    join(&alice, &dave, "eng");
    bob.serve_stub("notes", &["group:eng"], None, &m);
    let (root, current) = root_and_roster(&alice, "root.json");
    converged(&[&alice, &bob, &dave], current.roster.serial).await;
    admitted_session(&dave, "bob/notes").await;

    // The admin is away (it would sign a fresh one); the last roster it signed runs out in
    // seconds (the node tolerates CLOCK_SKEW_SECS past `expires_at`).
    alice.json(&["down"]);
    let now = unix_now();
    let last = Roster {
        serial: current.roster.serial + 1,
        issued_at: now - 3600,
        expires_at: now + 8 - CLOCK_SKEW_SECS,
        ..current.roster.clone()
    };
    let text = SignedRoster::sign(last.clone(), &root).unwrap().text;
    let (ep, target) = raw_client(&bob, true).await;
    let (_, seen) = deliver(
        &ep,
        target,
        &root.public().to_string(),
        last.serial,
        &text,
        || serial_of(&bob) == Some(last.serial),
    )
    .await;
    assert!(
        seen,
        "the short-lived roster is installed: {:?}",
        audit(&bob)
    );

    // Waiting for wall-clock expiry is the behaviour under test, not synchronization.
    let expired = eventually(CONVERGE, || org_summary(&bob)["expired"] == true).await;
    assert!(expired, "{}", org_summary(&bob));
    let status = org(&bob, &["status"]);
    assert_eq!(status["expired"], true, "{status}");

    // From then on the roster grants nothing. Should a session still be admitted, fresh ones
    // are tried once a second (no event marks the gate catching up) to say for how long.
    let expired_at = Instant::now();
    let mut admitted = 0;
    let error = loop {
        let mut s = dave.connect("bob/notes");
        let answer = s
            .request(
                "initialize",
                json!({ "protocolVersion": "2025-06-18", "capabilities": {} }),
            )
            .await;
        if answer.get("result").is_none() {
            break answer["error"].clone();
        }
        admitted += 1;
        s.close_stdin();
        s.wait_eof().await;
        if expired_at.elapsed() > Duration::from_secs(75) {
            break Value::Null;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    eprintln!(
        "EXPIRY-TO-REFUSAL: {admitted} sessions admitted after the roster expired, refused after {:?}: {error}",
        expired_at.elapsed()
    );
    assert_eq!(
        admitted,
        0,
        "a group grant still admitted a session {:?} after the roster expired (then: {error})",
        expired_at.elapsed()
    );

    let out = bob.cli(&["--json", "doctor"]);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        report["checks"].as_array().unwrap().iter().any(|c| {
            c["status"] != "ok"
                && c["message"]
                    .as_str()
                    .unwrap_or_default()
                    .contains("expired")
        }),
        "{report}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_second_device_is_mounted_as_user_dot_device_and_the_next_oldest_takes_the_plain_name() {
    let m = marker("org-device");
    let alice = TestNode::start("alice");
    let bob = TestNode::start("bob");
    let laptop = TestNode::start("laptop");
    org(&alice, &["create", "acme"]);
    join(&alice, &bob, "eng");
    alice.serve_stub("notes", &["group:eng"], None, &m);

    // A second device for bob: the invite names the device, and the user keeps his groups.
    let invite = org(&alice, &["invite", "bob", "--device", "laptop"]);
    assert_eq!(invite["groups"], json!(["eng"]), "{invite}");
    let joined = laptop.json(&["join", invite["invite"].as_str().unwrap()]);
    assert_eq!(joined["user"], "bob", "{joined}");
    assert_eq!(joined["device"], "laptop", "{joined}");
    assert_eq!(joined["groups"], json!(["eng"]), "{joined}");
    // Inviting bob again without a device is refused: he is a member already.
    let again = alice.cli(&["--json", "org", "invite", "bob"]);
    assert_eq!(refused(&again)["error"]["code"], 1005);

    // The first device keeps the plain name; the second is bob.laptop.
    let mounts = |node: &TestNode| -> Vec<String> {
        let members = org(node, &["members"]);
        let bob_entry = members["members"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["user"] == "bob")
            .cloned()
            .unwrap();
        bob_entry["devices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["mount"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(mounts(&alice), ["bob", "bob.laptop"]);
    assert_eq!(peer_name(&alice, &bob.id), "bob");
    assert_eq!(peer_name(&alice, &laptop.id), "bob.laptop");

    // `use` knows from alice's catalog that she offers notes to this device: no warning.
    let mount = laptop.json(&["use", "alice/notes"]);
    assert!(mount.get("warning").is_none(), "{mount}");
    assert_eq!(mount["known_grant"], true, "{mount}");

    let mut s = laptop.connect("alice/notes");
    s.initialize().await;
    let env = whoami(&mut s).await;
    assert_eq!(env["MCPMESH_PEER_USER"], "bob", "{env}");
    assert_eq!(env["MCPMESH_PEER_GROUPS"], "eng", "{env}");
    assert_eq!(env["MCPMESH_PEER_NAME"], "bob.laptop", "{env}");
    s.close_stdin();
    s.wait_eof().await;

    // The oldest device leaves: the laptop, next oldest, takes the plain name.
    org(&alice, &["remove", "bob", "--device", "bob"]);
    assert_eq!(mounts(&alice), ["bob"]);
    assert_eq!(peer_name(&alice, &laptop.id), "bob");
    let mut s = laptop.connect("alice/notes");
    s.initialize().await;
    let env = whoami(&mut s).await;
    assert_eq!(env["MCPMESH_PEER_NAME"], "bob", "{env}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_group_change_cuts_the_sessions_the_new_groups_no_longer_admit() {
    let m = marker("org-groups");
    let alice = TestNode::start("alice");
    let bob = TestNode::start("bob");
    let dave = TestNode::start("dave");
    org(&alice, &["create", "acme"]);
    join(&alice, &bob, "eng");
    join(&alice, &dave, "eng");
    dave.serve_stub("notes", &["group:eng"], None, &m);
    converged(
        &[&alice, &bob, &dave],
        org(&alice, &["members"])["serial"].as_u64().unwrap(),
    )
    .await;

    let mut s = bob.connect("dave/notes");
    s.initialize().await;
    s.start_long_call(json!("long"), 30_000).await;
    let changed = org(&alice, &["groups", "bob", "sales"]);
    assert_eq!(changed["groups"], json!(["sales"]), "{changed}");
    if let Some(answer) = s.recv().await {
        assert_eq!(answer["error"]["code"], -32052, "{answer}");
        s.wait_eof().await;
    }
    // Still a member, now refused by the service rather than the gate.
    let error = refused_session(&bob, "dave/notes").await;
    assert_eq!(error["code"], -32054, "{error}");
    assert_eq!(org_summary(&bob)["user"], "bob");
}

/// Appends `rules` to `node`'s config.toml while its node is down (the next verb starts it).
fn add_rules_offline(node: &TestNode, rules: &str) {
    node.json(&["down"]);
    let config = node.home().join("config.toml");
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str(rules);
    std::fs::write(&config, text).unwrap();
}

/// The tool names of a `tools/list` answer.
fn tool_names(list: &Value) -> Vec<String> {
    list["result"]["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("{list}"))
        .iter()
        .filter_map(|t| t["name"].as_str().map(str::to_owned))
        .collect()
}

const LIST_CHANGED: &str = "notifications/tools/list_changed";

#[tokio::test(flavor = "multi_thread")]
async fn a_group_change_reaches_an_open_session_at_its_next_request_and_says_the_list_changed() {
    let m = marker("live-groups");
    let alice = TestNode::start("alice");
    let bob = TestNode::start("bob");
    let dave = TestNode::start("dave");
    // Rules written by hand, as an admin would, read when dave's node starts again (before
    // any member could find it down).
    dave.serve_stub("notes", &["group:eng", "group:sales"], None, &m);
    add_rules_offline(
        &dave,
        "\n[[services.notes.tools]]\nwho = [\"group:eng\"]\nallow = [\"*\"]\n\n\
         [[services.notes.tools]]\nwho = [\"group:sales\"]\nallow = [\"whoami\"]\n",
    );
    org(&alice, &["create", "acme"]);
    join(&alice, &bob, "eng");
    join(&alice, &dave, "eng");
    converged(
        &[&alice, &bob, &dave],
        org(&alice, &["members"])["serial"].as_u64().unwrap(),
    )
    .await;

    let mut s = bob.connect("dave/notes");
    let init = s.initialize_as("2025-11-25").await;
    assert_eq!(init["result"]["protocolVersion"], "2025-11-25", "{init}");
    let listed = tool_names(&s.request("tools/list", json!({})).await);
    assert!(listed.contains(&"echo".to_owned()), "{listed:?}");
    let echo = s.call("echo", json!({ "text": "hi" })).await;
    assert!(echo["result"].is_object(), "{echo}");

    // The change is made on the admin's node; dave, serving, learns it from the roster.
    let started = Instant::now();
    let changed = org(&alice, &["groups", "bob", "sales"]);
    let told = s.notified(LIST_CHANGED, CONVERGE).await;
    let echo = s.call("echo", json!({ "text": "hi" })).await;
    let took = started.elapsed();
    eprintln!(
        "GROUPS-TO-REFUSAL: org groups bob sales (on alice) → {LIST_CHANGED} and a refused echo in bob's open session on dave after {took:?}"
    );
    // Whatever the session was told, dave holds the new roster now: the next call is refused.
    converged(&[&dave], changed["serial"].as_u64().unwrap()).await;
    let echo = match echo.get("result") {
        Some(_) => s.call("echo", json!({ "text": "hi" })).await,
        None => echo,
    };
    assert_eq!(
        echo["error"]["code"], -32054,
        "bob's open session still used echo once dave held the roster moving bob to sales: {echo}"
    );
    assert_eq!(echo["error"]["data"]["source"], "mcpmesh", "{echo}");
    assert!(told.is_some(), "no {LIST_CHANGED} reached bob's session");
    // The same session, now as sales: its list and its calls follow.
    let listed = tool_names(&s.request("tools/list", json!({})).await);
    assert_eq!(listed, ["whoami"]);
    let who = s.call("whoami", json!({})).await;
    assert_eq!(
        who["result"]["structuredContent"]["MCPMESH_PEER_USER"], "bob",
        "{who}"
    );
    s.close_stdin();
    s.wait_eof().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_admin_re_signs_a_roster_near_its_expiry_on_its_own() {
    let alice = TestNode::start("alice");
    let bob = TestNode::start("bob");
    org(&alice, &["create", "acme"]);
    join(&alice, &bob, "eng");
    let (root, current) = root_and_roster(&alice, "root.json");
    converged(&[&alice, &bob], current.roster.serial).await;

    // A roster with a day left, as if the admin's node had been off for four weeks.
    let now = unix_now();
    let short = Roster {
        expires_at: now + 24 * 3600,
        ..successor(&current.roster, now, DEFAULT_VALIDITY_SECS)
    };
    let text = SignedRoster::sign(short.clone(), &root).unwrap().text;
    let (ep, target) = raw_client(&alice, true).await;
    let (_, seen) = deliver(
        &ep,
        target,
        &current.roster.root,
        short.serial,
        &text,
        || serial_of(&alice) == Some(short.serial),
    )
    .await;
    assert!(seen, "the admin took the short roster");

    // The admin's upkeep runs at start: the roster is re-signed for 30 days and pushed.
    alice.json(&["down"]);
    alice.json(&["up"]);
    let renewed = short.serial + 1;
    converged(&[&alice, &bob], renewed).await;
    let held = org_summary(&bob);
    let left = held["expires_at"].as_u64().unwrap() - unix_now();
    assert!(left > DEFAULT_VALIDITY_SECS - 3600, "{held}");
    assert_eq!(installed(&bob, renewed).await["from"], "alice");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_root_moves_to_a_new_admin_node_and_the_org_goes_on() {
    let alice = TestNode::start("alice");
    let bob = TestNode::start("bob");
    let carol = TestNode::start("carol");
    org(&alice, &["create", "acme"]);
    join(&alice, &bob, "eng");
    join(&alice, &carol, "eng");
    let file = alice.home().join("acme-root.json");
    let exported = org(&alice, &["export-root", file.to_str().unwrap()]);
    let serial = exported["serial"].as_u64().unwrap();
    converged(&[&alice, &bob, &carol], serial).await;
    // The admin's machine is lost; its export reaches bob's.
    alice.json(&["down"]);
    let moved = bob.home().join("acme-root.json");
    std::fs::copy(&file, &moved).unwrap();

    // Only the admin's node changes the roster.
    let refused_remove = bob.cli(&["--json", "org", "remove", "carol"]);
    assert_eq!(refused(&refused_remove)["error"]["code"], 1007);
    let imported = org(&bob, &["import-root", moved.to_str().unwrap()]);
    assert_eq!(imported["org"], "acme", "{imported}");
    assert_eq!(org_summary(&bob)["admin"], true);
    let changed = org(&bob, &["groups", "carol", "sales"]);
    let next = changed["serial"].as_u64().unwrap();
    assert!(next > serial, "{changed}");
    // carol's node takes the new admin's rosters: same root, newer serial.
    converged(&[&bob, &carol], next).await;
    let bob_seen = peer_entry(&carol, &bob.id).expect("carol lists bob");
    assert_eq!(bob_seen["user"], "bob", "{bob_seen}");
    assert_eq!(installed(&carol, next).await["from"], "bob");
}

#[test]
fn a_root_key_readable_by_others_is_not_used_and_doctor_says_so() {
    use std::os::unix::fs::PermissionsExt;
    let alice = TestNode::start("alice");
    org(&alice, &["create", "acme"]);
    let key = alice.home().join("org-root.key");
    let mode = std::fs::metadata(&key).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();

    let invite = alice.cli(&["--json", "org", "invite", "bob"]);
    assert_eq!(refused(&invite)["error"]["code"], 1007);
    let doctor = alice.cli(&["doctor"]);
    assert_eq!(doctor.status.code(), Some(1));
    let report = String::from_utf8_lossy(&doctor.stdout);
    assert!(report.contains("org root key"), "{report}");
    assert!(report.contains("chmod 600"), "{report}");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_admin_that_committed_a_join_completes_it_for_the_pending_joiner_when_it_returns() {
    let alice = TestNode::start("alice");
    let bob = TestNode::start("bob");
    org(&alice, &["create", "acme"]);
    join(&alice, &bob, "eng");
    let serial = org(&alice, &["members"])["serial"].as_u64().unwrap();
    converged(&[&alice, &bob], serial).await;

    // bob's node as a crash leaves it when the admin committed and died before answering:
    // the root pinned, the join pending, no roster yet.
    alice.json(&["down"]);
    bob.json(&["down"]);
    let store_file = mcpmesh::paths::Profile::at(bob.home()).store_file();
    common::offline(|| {
        let store = mcpmesh::store::Store::open(&store_file).unwrap();
        let record = store.org().unwrap().unwrap();
        store
            .put_org(&mcpmesh::store::OrgRecord {
                roster: None,
                pending: Some(mcpmesh::store::PendingJoin {
                    admin: alice.id.clone(),
                    addrs: alice.addrs.clone(),
                    relay: None,
                    user: "bob".into(),
                    at: mcpmesh::time::unix_ms(),
                }),
                ..record
            })
            .unwrap();
    });
    // bob comes back while the admin is away: it cannot ask, so the join stays pending.
    bob.json(&["up"]);
    let asked = eventually(Duration::from_secs(20), || {
        bob.log()
            .contains("join still pending: the admin's node is unreachable")
    })
    .await;
    assert!(asked, "bob's node never asked the admin's: {}", bob.log());
    assert!(org_summary(&bob).is_null());

    // The admin's node returns and offers its roster to every member, bob's pending node
    // included, which takes it from the admin it is joining (not a minute later on its own).
    alice.json(&["up"]);
    let started = Instant::now();
    let done = eventually(Duration::from_secs(15), || serial_of(&bob) == Some(serial)).await;
    assert!(done, "bob's join is still pending: {}", org_summary(&bob));
    eprintln!(
        "pending join completed {:?} after the admin returned",
        started.elapsed()
    );
    assert_eq!(org_summary(&bob)["user"], "bob");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_socket_service_sees_the_members_user_and_groups_in_meta() {
    let alice = TestNode::start("alice");
    let bob = TestNode::start("bob");
    org(&alice, &["create", "acme"]);
    join(&alice, &bob, "eng");
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("server.sock");
    let mut cmd = tokio::process::Command::new(stub());
    cmd.arg("--socket").arg(&sock);
    // It says so on stderr once it listens.
    let (_server, _) = Started::until(&mut cmd, "listening").await;
    alice.serve(
        "tools",
        &["group:eng"],
        &["--socket", sock.to_str().unwrap()],
    );

    let mut s = bob.connect("alice/tools");
    s.initialize().await;
    let who = whoami(&mut s).await;
    let expected = json!({
        "eid": format!("eid:{}", bob.id),
        "name": "bob",
        "user_id": "bob",
        "groups": ["eng"],
    });
    assert_eq!(who["meta_peer"], expected, "{who}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_deny_on_a_roster_user_beats_the_allow_of_its_group() {
    let m = marker("tool-rules");
    let t = Team::start("");
    t.alice.serve_stub("notes", &["group:eng"], None, &m);
    // Rules are written by hand, as an admin would; the node reads them when it starts.
    t.alice.json(&["down"]);
    let config = t.alice.home().join("config.toml");
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str(
        "\n[[services.notes.tools]]\nwho = [\"group:eng\"]\nallow = [\"*\"]\n\n\
         [[services.notes.tools]]\nwho = [\"user:dave\"]\ndeny = [\"echo\"]\n",
    );
    std::fs::write(&config, text).unwrap();
    converged(&t.all(), t.serial()).await;

    for (node, may_echo) in [(&t.bob, true), (&t.dave, false)] {
        let mut s = node.connect("alice/notes");
        s.initialize().await;
        let list = s.request("tools/list", json!({})).await;
        let names: Vec<&str> = list["result"]["tools"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|t| t["name"].as_str())
            .collect();
        assert!(names.contains(&"whoami"), "{}: {list}", node.name);
        assert_eq!(names.contains(&"echo"), may_echo, "{}: {list}", node.name);
        let echo = s.call("echo", json!({ "text": "hi" })).await;
        assert_eq!(
            echo["result"].is_object(),
            may_echo,
            "{}: {echo}",
            node.name
        );
        if !may_echo {
            assert_eq!(echo["error"]["code"], -32054, "{echo}");
        }
        s.close_stdin();
        s.wait_eof().await;
    }
}

/// The name `node` gives the key `id`, from its `peers` list.
fn peer_name(node: &TestNode, id: &str) -> String {
    peer_entry(node, id)
        .and_then(|p| p["name"].as_str().map(str::to_owned))
        .unwrap_or_else(|| panic!("{} does not list {id}", node.name))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_members_user_dot_device_name_wins_over_a_peer_an_older_version_stored_under_it() {
    let m = marker("org-dotted");
    let alice = TestNode::start("alice");
    let bob = TestNode::start("bob");
    let laptop = TestNode::start("laptop");
    org(&alice, &["create", "acme"]);
    join(&alice, &bob, "eng");
    let invite = org(&alice, &["invite", "bob", "--device", "laptop"]);
    laptop.json(&["join", invite["invite"].as_str().unwrap()]);
    laptop.serve_stub("notes", &["user:alice"], None, &m);

    // Names an older version let peers take: one in config, one met by pairing.
    let in_config = iroh::SecretKey::generate().public().to_string();
    let paired = iroh::SecretKey::generate().public().to_string();
    assert_eq!(alice.json(&["down"])["stopped"], true);
    let config = alice.home().join("config.toml");
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str(&format!("\n[peers.\"bob.laptop\"]\nid = \"{in_config}\"\n"));
    std::fs::write(&config, text).unwrap();
    common::offline(|| {
        let store = mcpmesh::store::Store::open(&alice.home().join("state/mcpmesh.redb")).unwrap();
        let peer = mcpmesh::store::StoredPeer {
            id: paired.clone(),
            name: "bob.bob".into(),
            addrs: vec![],
            mounts: vec![],
            paired_at: 1,
            pending: false,
            grants_owed: vec![],
        };
        store.put_peer(&peer, None).unwrap();
    });
    alice.json(&["up"]);

    assert_eq!(peer_name(&alice, &laptop.id), "bob.laptop");
    // bob's first device is mounted as plain `bob`; `bob.bob` stays its own all the same.
    assert_eq!(peer_name(&alice, &bob.id), "bob");
    assert_eq!(peer_name(&alice, &in_config), "bob-laptop");
    assert_eq!(peer_name(&alice, &paired), "bob-bob");
    // The call meant for bob's laptop reaches bob's laptop.
    let mut s = alice.connect("bob.laptop/notes");
    s.initialize().await;
    let env = whoami(&mut s).await;
    assert_eq!(env["MCPMESH_PEER_USER"], "alice", "{env}");

    // The peers that gave their names up are renamed and removed by the names they now have.
    alice.json(&["peers", "rename", "bob-bob", "old-bob"]);
    assert_eq!(peer_name(&alice, &paired), "old-bob");
    alice.json(&["peers", "remove", "bob-laptop"]);
    assert!(peer_entry(&alice, &in_config).is_none(), "still trusted");
    let text = std::fs::read_to_string(&config).unwrap();
    assert!(!text.contains(&in_config), "still in config: {text}");
    assert_eq!(peer_name(&alice, &laptop.id), "bob.laptop");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_member_whose_stored_roster_is_damaged_says_so_and_fetches_it_again_from_the_org() {
    let alice = TestNode::start("alice");
    let bob = TestNode::start_with("bob", SYNC_FAST, &[]);
    org(&alice, &["create", "acme"]);
    let serial = join(&alice, &bob, "eng")["serial"].as_u64().unwrap();

    // Garbage over the roster bob holds, while bob is down; the admin is down too, so bob
    // cannot mend it before it is seen.
    assert_eq!(bob.json(&["down"])["stopped"], true);
    assert_eq!(alice.json(&["down"])["stopped"], true);
    common::offline(|| {
        let store = mcpmesh::store::Store::open(&bob.home().join("state/mcpmesh.redb")).unwrap();
        let mut record = store.org().unwrap().expect("bob's org record");
        record.roster = Some("{\"roster\": garbage".into());
        store.put_org(&record).unwrap();
    });
    bob.json(&["up"]);
    let summary = org_summary(&bob);
    assert_eq!(
        summary["name"], "acme",
        "bob is still in the org: {summary}"
    );
    assert!(
        summary["damaged"]
            .as_str()
            .is_some_and(|d| d.contains("damaged")),
        "{summary}"
    );
    let status = refused(&bob.cli(&["--json", "org", "status"]));
    let message = status["error"]["message"].as_str().unwrap();
    assert!(message.contains("damaged"), "{status}");
    assert!(!message.contains("not in an org"), "{status}");
    // A problem: doctor fails, its report on stdout.
    let out = bob.cli(&["--json", "doctor"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let doctor: Value = serde_json::from_slice(&out.stdout).unwrap();
    let check = doctor["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["check"] == "org")
        .cloned()
        .unwrap_or_else(|| panic!("doctor has no org check: {doctor}"));
    assert_eq!(check["status"], "error", "{check}");
    assert!(
        check["message"].as_str().unwrap().contains("damaged"),
        "{check}"
    );

    // Once a member is back, bob's pull fetches the roster again: no admin action.
    alice.json(&["up"]);
    converged(&[&bob], serial).await;
    assert!(org_summary(&bob).get("damaged").is_none_or(Value::is_null));
    let record = installed(&bob, serial).await;
    assert_eq!(record["org"], "acme", "{record}");
    assert_eq!(org(&bob, &["status"])["serial"], serial);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_roster_of_a_foreign_root_is_refused_and_audited_without_letting_its_sender_flood_the_log()
 {
    let alice = TestNode::start("alice");
    let bob = TestNode::start("bob");
    org(&alice, &["create", "acme"]);
    let held = join(&alice, &bob, "eng")["serial"].as_u64().unwrap();
    let now = unix_now();
    let other = iroh::SecretKey::generate();
    let other_root = other.public().to_string();
    let foreign = SignedRoster::sign(
        Roster {
            v: 1,
            org: "evil".into(),
            root: other_root.clone(),
            serial: held + 5,
            issued_at: now,
            expires_at: now + DEFAULT_VALIDITY_SECS,
            members: vec![],
            revoked: vec![],
            removals: vec![],
        },
        &other,
    )
    .unwrap()
    .text;

    // A trusted peer offers its own org's roster, under its own root.
    let (ep, target) = raw_client(&bob, true).await;
    let sender = format!("eid:{}", ep.id());
    let from_sender = || {
        refusals(&bob, "other_org")
            .into_iter()
            .filter(|r| r["principal"] == sender.as_str())
            .collect::<Vec<_>>()
    };
    let (answer, seen) = deliver(&ep, target, &other_root, held + 5, &foreign, || {
        !from_sender().is_empty()
    })
    .await;
    assert!(answer.get("roster").is_none(), "{answer}");
    assert!(
        seen,
        "no roster_refused record names the sender: {:?}",
        audit(&bob)
    );
    let first = from_sender().pop().unwrap();
    assert!(
        first["from"].as_str().unwrap().starts_with("tester"),
        "{first}"
    );
    assert!(
        first["message"].as_str().unwrap().contains("another org"),
        "{first}"
    );
    assert!(first.get("count").is_none(), "{first}");

    // The same again and again: counted, not written one by one.
    const AGAIN: u64 = 20;
    for _ in 0..AGAIN {
        deliver(&ep, target, &other_root, held + 5, &foreign, || true).await;
    }
    let seen = bob.json(&["audit", "tail", "-n", "1000"])["records"].clone();
    assert_eq!(from_sender().len(), 1, "{seen}");
    assert_eq!(
        serial_of(&bob),
        Some(held),
        "the foreign roster changed nothing"
    );
    // The count is written when the minute is over, or when the node stops.
    let records = bob.stop_and_audit();
    let counted: Vec<&Value> = records
        .iter()
        .filter(|r| r["event"] == "roster_refused" && r["principal"] == sender.as_str())
        .collect();
    assert_eq!(counted.len(), 2, "{counted:?}");
    assert_eq!(counted[1]["count"], AGAIN, "{counted:?}");
    assert_eq!(counted[1]["reason"], "other_org", "{counted:?}");
}

/// `node`'s device key, read from its profile.
fn device_key(node: &TestNode) -> iroh::SecretKey {
    let text = std::fs::read_to_string(node.home().join("device.key")).unwrap();
    mcpmesh::keys::parse_hex(text.trim()).expect("device.key holds a hex key")
}

/// The `connections_refused` records in `records` of the key `id`.
fn refused_connections<'a>(records: &'a [Value], id: &str) -> Vec<&'a Value> {
    let principal = format!("eid:{id}");
    records
        .iter()
        .filter(|r| r["event"] == "connections_refused" && r["principal"] == principal.as_str())
        .collect()
}

/// alice (the admin), bob and carol (eng), carol serving `notes` to group eng, all holding
/// the same roster.
async fn team_of_three(m: &str) -> (TestNode, TestNode, TestNode) {
    let alice = TestNode::start_with("alice", SYNC_FAST, &[]);
    let bob = TestNode::start_with("bob", SYNC_FAST, &[]);
    let carol = TestNode::start_with("carol", SYNC_FAST, &[]);
    org(&alice, &["create", "acme"]);
    join(&alice, &bob, "eng");
    join(&alice, &carol, "eng");
    carol.serve_stub("notes", &["group:eng"], None, m);
    let serial = org(&alice, &["members"])["serial"].as_u64().unwrap();
    converged(&[&alice, &bob, &carol], serial).await;
    (alice, bob, carol)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_member_removed_while_offline_learns_it_says_so_and_stops_dialing_the_members() {
    let m = marker("org-removed");
    let (alice, bob, carol) = team_of_three(&m).await;
    admitted_session(&bob, "carol/notes").await;

    assert_eq!(bob.json(&["down"])["stopped"], true);
    let serial = org(&alice, &["remove", "bob"])["serial"].as_u64().unwrap();
    converged(&[&alice, &carol], serial).await;

    // Back online, bob's node dials the members it knows; they refuse it and hand it the
    // root's notice of its removal, which it verifies and acts on.
    bob.json(&["up"]);
    let learned = eventually(CONVERGE, || org_summary(&bob)["removed"].is_object()).await;
    assert!(learned, "bob never learned: {}", org_summary(&bob));
    let summary = org_summary(&bob);
    assert_eq!(summary["name"], "acme", "{summary}");
    assert_eq!(summary["removed"]["serial"], serial, "{summary}");
    assert_eq!(summary["removed"]["user"], "bob", "{summary}");
    assert!(summary.get("user").is_none(), "{summary}");
    let shown = String::from_utf8_lossy(&bob.cli(&["status"]).stdout).into_owned();
    assert!(
        shown.contains(&format!("removed from org acme (serial {serial})")),
        "{shown}"
    );
    let report: Value = serde_json::from_slice(&bob.cli(&["--json", "doctor"]).stdout).unwrap();
    let check = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["check"] == "org")
        .cloned()
        .unwrap_or_else(|| panic!("doctor has no org check: {report}"));
    assert_eq!(check["status"], "warn", "{check}");
    let message = check["message"].as_str().unwrap();
    assert!(
        message.starts_with(&format!("removed from org acme (serial {serial})"))
            && message.contains("--readmit"),
        "{check}"
    );
    // The record is written by the audit log's own thread, a moment after the node acts.
    let recorded = || trust_actions(&bob).iter().any(|a| a == "org_removed");
    assert!(
        eventually(ANSWER_TIMEOUT, recorded).await,
        "no org_removed record"
    );
    // It trusts (and offers) the members nothing any more, and org verbs say why.
    for member in [&alice, &carol] {
        assert!(peer_entry(&bob, &member.id).is_none(), "{}", member.name);
    }
    let members = bob.cli(&["--json", "org", "members"]);
    let error = refused(&members);
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("removed from org acme"),
        "{error}"
    );

    // The members counted its refused connections under its user; once it learned, there
    // are no more: its restart (a roster pull at once), `status` (which checks every peer
    // it trusts) and `doctor` dial nobody.
    let records: Vec<Vec<Value>> = [&alice, &carol].map(|n| n.stop_and_audit()).into();
    let before: Vec<usize> = records
        .iter()
        .map(|r| refused_connections(r, &bob.id).len())
        .collect();
    let named = records
        .iter()
        .flat_map(|r| refused_connections(r, &bob.id))
        .any(|r| r["user"] == "bob");
    assert!(named, "no refusal names user bob: {records:?}");
    alice.json(&["up"]);
    carol.json(&["up"]);
    bob.json(&["down"]);
    bob.json(&["up"]);
    bob.json(&["status"]);
    bob.cli(&["doctor"]);
    let error = refused_session(&bob, "carol/notes").await;
    assert!(
        error["message"].as_str().unwrap().contains("no peer named"),
        "{error}"
    );
    let after: Vec<usize> = [&alice, &carol]
        .map(|n| refused_connections(&n.stop_and_audit(), &bob.id).len())
        .into();
    assert_eq!(
        after, before,
        "bob kept dialing the members after it learned"
    );

    // Out of acme, bob's node is in no org: it may start one of its own.
    let created = org(&bob, &["create", "bobs"]);
    assert_eq!(created["serial"], 1, "{created}");
    let summary = org_summary(&bob);
    assert_eq!(summary["name"], "bobs", "{summary}");
    assert!(summary.get("removed").is_none(), "{summary}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_removed_device_comes_back_only_when_the_admin_readmits_its_key_or_with_a_new_key() {
    let m = marker("org-readmit");
    let (alice, bob, carol) = team_of_three(&m).await;

    // bob is online: the admin's node tells him at once.
    let removed = org(&alice, &["remove", "bob"])["serial"].as_u64().unwrap();
    let learned = eventually(CONVERGE, || org_summary(&bob)["removed"].is_object()).await;
    assert!(learned, "bob never learned: {}", org_summary(&bob));
    assert_eq!(org_summary(&bob)["removed"]["serial"], removed);

    // A plain invite does not bring the old key back, and the refusal says what does.
    let invite = org(
        &alice,
        &["invite", "bob", "--device", "bob", "--groups", "eng"],
    );
    let out = bob.cli(&["--json", "join", invite["invite"].as_str().unwrap()]);
    let error = refused(&out);
    let message = error["error"]["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("removed from org acme (serial {removed})"))
            && message.contains("mcpmesh org invite bob --device bob --readmit")
            && message.contains("new key"),
        "{error}"
    );
    assert!(org_summary(&bob)["removed"].is_object());

    // Only a device that was removed can be readmitted.
    let out = alice.cli(&[
        "--json",
        "org",
        "invite",
        "bob",
        "--device",
        "phone",
        "--readmit",
    ]);
    let error = refused(&out);
    assert_eq!(error["error"]["code"], 1006, "{error}");
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no removed device named \"phone\""),
        "{error}"
    );

    // The admin readmits the key explicitly: a roster that no longer revokes it, recorded
    // on every node that takes it.
    let invite = org(
        &alice,
        &[
            "invite",
            "bob",
            "--device",
            "bob",
            "--groups",
            "eng",
            "--readmit",
        ],
    );
    let members = org(&alice, &["members"]);
    assert!(
        !members["revoked"]
            .as_array()
            .unwrap()
            .iter()
            .any(|k| k == bob.id.as_str()),
        "{members}"
    );
    for node in [&alice, &carol] {
        let readmitted = || trust_actions(node).iter().any(|a| a == "org_readmit");
        assert!(
            eventually(CONVERGE, readmitted).await,
            "{}: {:?}",
            node.name,
            trust_actions(node)
        );
    }
    // Readmitted is not yet a member: a roster that does not name bob changes nothing on
    // his node (it would trust the members again) and is refused.
    let (_, readmitting) = root_and_roster(&alice, "root.json");
    let (ep, target) = raw_client(&bob, true).await;
    let sender = format!("eid:{}", ep.id());
    let (_, seen) = deliver(
        &ep,
        target,
        &readmitting.roster.root,
        readmitting.roster.serial,
        &readmitting.text,
        || {
            refusals(&bob, "invalid")
                .iter()
                .any(|r| r["principal"] == sender.as_str())
        },
    )
    .await;
    assert!(seen, "{:?}", audit(&bob));
    assert!(org_summary(&bob)["removed"].is_object());
    assert!(peer_entry(&bob, &alice.id).is_none());

    let joined = bob.json(&["join", invite["invite"].as_str().unwrap()]);
    assert_eq!(joined["user"], "bob", "{joined}");
    assert_eq!(joined["device"], "bob", "{joined}");
    assert_eq!(org_summary(&bob)["user"], "bob");
    assert!(org_summary(&bob).get("removed").is_none());
    let serial = joined["serial"].as_u64().unwrap();
    converged(&[&alice, &bob, &carol], serial).await;
    admitted_session(&bob, "carol/notes").await;

    // Removed again, bob comes back from a new key (a new profile) with a plain invite.
    org(&alice, &["remove", "bob"]);
    let new_key = TestNode::start("bob");
    let joined = join(&alice, &new_key, "eng");
    assert_eq!(joined["user"], "bob", "{joined}");
    converged(
        &[&alice, &carol, &new_key],
        joined["serial"].as_u64().unwrap(),
    )
    .await;
    admitted_session(&new_key, "carol/notes").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_non_member_fetching_the_roster_gets_nothing_and_a_removed_key_only_its_notice() {
    let alice = TestNode::start("alice");
    let bob = TestNode::start("bob");
    let carol = TestNode::start("carol");
    org(&alice, &["create", "acme"]);
    join(&alice, &bob, "eng");
    join(&alice, &carol, "eng");
    let root = org(&alice, &["status"])["root"]
        .as_str()
        .unwrap()
        .to_owned();
    // bob is down first: his node would otherwise hear of the removal (gossip) and ask, and
    // a revoked key is told once a minute.
    bob.json(&["down"]);
    let removed = org(&alice, &["remove", "bob"])["serial"].as_u64().unwrap();

    // One roster exchange as `key` would open it: the answer, or `None` when refused.
    let ask = |key: iroh::SecretKey| {
        let root = root.clone();
        let alice = &alice;
        async move {
            let (ep, target) = endpoint_as(key, alice).await;
            let answer = async {
                let conn = ep
                    .connect(target, mcpmesh::roster::sync::ALPN_ROSTER)
                    .await
                    .ok()?;
                let (send, recv) = conn.open_bi().await.ok()?;
                let mut wire = mcpmesh_net::transport::NdjsonTransport::new(
                    recv,
                    send,
                    mcpmesh::roster::sync::MAX_MESSAGE,
                );
                wire.send_value(json!({ "root": root, "serial": 0 }))
                    .await
                    .ok()?;
                let answer = wire.recv_value().await.ok()??;
                let _ = wire.writer_mut().finish();
                Some(answer)
            };
            let answer = tokio::time::timeout(ANSWER_TIMEOUT, answer).await.ok()?;
            ep.close().await;
            answer
        }
    };

    // A key nobody knows is refused before anything is said.
    assert_eq!(ask(iroh::SecretKey::generate()).await, None);

    // A key trusted by pairing alone learns the org's root and serial, not its roster.
    let paired = iroh::SecretKey::generate();
    alice.json(&["peers", "add", "stranger", &paired.public().to_string()]);
    let answer = ask(paired).await.expect("a trusted peer is answered");
    assert!(answer.get("roster").is_none(), "{answer}");
    assert!(answer.get("removed").is_none(), "{answer}");

    // bob's removed key gets its own removal notice and nothing else.
    let bob_key = device_key(&bob);
    let answer = ask(bob_key.clone())
        .await
        .expect("a removed key is told of its removal");
    let keys: Vec<&str> = answer
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(keys, ["removed", "root", "serial"], "{answer}");
    assert_eq!(answer["serial"], removed, "{answer}");
    let notice: mcpmesh::roster::RemovalNotice =
        serde_json::from_value(answer["removed"].clone()).unwrap();
    assert_eq!(
        (
            notice.org.as_str(),
            notice.user.as_str(),
            notice.eid.as_str()
        ),
        ("acme", "bob", bob.id.as_str())
    );
    let me: iroh::EndpointId = bob.id.parse().unwrap();
    let pinned: iroh::PublicKey = root.parse().unwrap();
    assert_eq!(notice.check(&pinned, &me, removed - 1), Ok(()));
    let said = answer.to_string();
    for other in [&alice, &carol] {
        assert!(!said.contains(other.id.as_str()), "{said}");
        assert!(
            other.addrs.iter().all(|a| !said.contains(a.as_str())),
            "{said}"
        );
    }
    assert!(!said.contains("eng"), "{said}");

    // Asking again at once is refused: a removed key is told once a minute.
    assert_eq!(ask(bob_key).await, None);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_forged_foreign_or_replayed_removal_notice_changes_nothing_but_the_revoking_roster_tells()
{
    let alice = TestNode::start("alice");
    let bob = TestNode::start("bob");
    org(&alice, &["create", "acme"]);
    let held = join(&alice, &bob, "eng")["serial"].as_u64().unwrap();
    let (root, _) = root_and_roster(&alice, "root.json");
    let root_hex = root.public().to_string();
    converged(&[&alice, &bob], held).await;

    let notice = |key: &iroh::SecretKey, eid: &str, serial: u64| {
        let r = mcpmesh::roster::Removal::sign("acme", key, eid, "bob", "bob", serial).unwrap();
        serde_json::to_value(r.notice("acme", &root_hex)).unwrap()
    };
    let other = TestNode::start("mallory");
    let cases = [
        // Signed by a key that is not the org's root.
        (
            "bad_signature",
            notice(&iroh::SecretKey::generate(), &bob.id, held + 1),
        ),
        // The root's word about another device.
        ("invalid", notice(&root, &other.id, held + 1)),
        // A removal older than the roster bob holds (undone since).
        ("stale", notice(&root, &bob.id, held)),
    ];
    // A member pushing notices to bob, as the admin's node does.
    let (ep, target) = raw_client(&bob, true).await;
    let sender = format!("eid:{}", ep.id());
    for (reason, removed) in cases {
        let conn = ep
            .connect(target, mcpmesh::roster::sync::ALPN_ROSTER)
            .await
            .unwrap();
        let (send, recv) = conn.open_bi().await.unwrap();
        let mut wire = mcpmesh_net::transport::NdjsonTransport::new(
            recv,
            send,
            mcpmesh::roster::sync::MAX_MESSAGE,
        );
        wire.send_value(json!({ "root": root_hex, "serial": held + 1, "removed": removed }))
            .await
            .unwrap();
        let _ = wire.writer_mut().finish();
        let recorded = || {
            refusals(&bob, reason)
                .iter()
                .any(|r| r["principal"] == sender.as_str())
        };
        assert!(
            eventually(ANSWER_TIMEOUT, recorded).await,
            "no {reason} refusal: {:?}",
            audit(&bob)
        );
        conn.close(0u32.into(), b"done");
    }
    let summary = org_summary(&bob);
    assert_eq!(summary["user"], "bob", "{summary}");
    assert!(summary.get("removed").is_none(), "{summary}");
    assert!(peer_entry(&bob, &alice.id).is_some());

    // The roster that revoked bob, handed over by anyone (here while the admin is away),
    // tells him as well as the notice does.
    bob.json(&["down"]);
    let serial = org(&alice, &["remove", "bob"])["serial"].as_u64().unwrap();
    let (_, revoking) = root_and_roster(&alice, "root-after.json");
    assert_eq!(revoking.roster.serial, serial);
    alice.json(&["down"]);
    bob.json(&["up"]);
    assert_eq!(
        serial_of(&bob),
        Some(held),
        "bob could not have learned yet"
    );
    let (ep, target) = raw_client(&bob, true).await;
    let (_, seen) = deliver(&ep, target, &root_hex, serial, &revoking.text, || {
        org_summary(&bob)["removed"].is_object()
    })
    .await;
    assert!(seen, "{}", org_summary(&bob));
    let summary = org_summary(&bob);
    assert_eq!(summary["removed"]["serial"], serial, "{summary}");
    assert_eq!(summary["removed"]["user"], "bob", "{summary}");
    assert_eq!(summary["removed"]["device"], "bob", "{summary}");
    assert!(peer_entry(&bob, &alice.id).is_none());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_roster_one_member_installed_reaches_the_others_over_gossip_with_the_admin_gone() {
    // No periodic pull within the test's bound: only the members' re-announcements can
    // carry the roster from bob to carol and dave.
    let t = Team::start("");
    converged(&t.all(), t.serial()).await;
    let (root, current) = root_and_roster(&t.alice, "root-gossip.json");
    assert_eq!(t.alice.json(&["down"])["stopped"], true);

    let mut next = successor(&current.roster, unix_now(), DEFAULT_VALIDITY_SECS);
    for member in &mut next.members {
        if member.user == "carol" {
            member.groups = vec!["sales".into(), "eng".into()];
        }
    }
    let serial = next.serial;
    let text = SignedRoster::sign(next, &root).unwrap().text;
    // Only bob is given it, by a key he trusts.
    let (ep, target) = raw_client(&t.bob, true).await;
    let root_hex = root.public().to_string();
    let (_, installed_on_bob) = deliver(&ep, target, &root_hex, serial, &text, || {
        serial_of(&t.bob) == Some(serial)
    })
    .await;
    assert!(installed_on_bob, "bob took the roster");
    let started = Instant::now();
    converged(&[&t.carol, &t.dave], serial).await;
    eprintln!(
        "GOSSIP: serial {serial} on carol and dave {:?} after bob installed it, the admin down",
        started.elapsed()
    );
    for node in [&t.carol, &t.dave] {
        let record = installed(node, serial).await;
        assert_ne!(record["from"], "alice", "{record}");
    }
}

/// The org's gossip topic, as every node derives it from the root (hex).
fn gossip_topic(root: &str) -> iroh_gossip::TopicId {
    let mut hasher = blake3::Hasher::new();
    hasher.update(b"mcpmesh org topic 1\0");
    hasher.update(root.to_ascii_lowercase().as_bytes());
    iroh_gossip::TopicId::from_bytes(*hasher.finalize().as_bytes())
}

#[tokio::test(flavor = "multi_thread")]
async fn forged_and_flooding_gossip_from_a_member_is_refused_bounded_and_audited() {
    let alice = TestNode::start("alice");
    let bob = TestNode::start("bob");
    org(&alice, &["create", "acme"]);
    join(&alice, &bob, "eng");
    let (root, current) = root_and_roster(&alice, "root-flood.json");
    converged(&[&alice, &bob], current.roster.serial).await;

    // mallory: a member device (the admin signed her in), driven by the test.
    let key = iroh::SecretKey::generate();
    let mut next = successor(&current.roster, unix_now(), DEFAULT_VALIDITY_SECS);
    next.members.push(Member {
        user: "mallory".into(),
        groups: vec![],
        devices: vec![Device {
            name: "laptop".into(),
            eid: key.public().to_string(),
            addrs: vec![],
            relay: None,
        }],
    });
    let serial = next.serial;
    let text = SignedRoster::sign(next, &root).unwrap().text;
    let (ep, target) = raw_client(&bob, true).await;
    let root_hex = root.public().to_string();
    let (_, took) = deliver(&ep, target, &root_hex, serial, &text, || {
        serial_of(&bob) == Some(serial)
    })
    .await;
    assert!(took, "bob holds the roster with mallory");

    let alpn = b"mcpmesh/gossip/1";
    let (mallory, _) = endpoint_accepting(key, &bob, vec![alpn.to_vec()]).await;
    let gossip = iroh_gossip::Gossip::builder()
        .alpn(alpn)
        .spawn(mallory.clone());
    let _router = iroh::protocol::Router::builder(mallory.clone())
        .accept(alpn, gossip.clone())
        .spawn();
    let mut topic = gossip
        .subscribe(gossip_topic(&root_hex), vec![target])
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(30), topic.joined())
        .await
        .expect("mallory meets bob on the org's topic")
        .unwrap();

    // Not a notice; a notice naming a non-member; a newer serial nobody has; then a flood.
    topic
        .broadcast(bytes::Bytes::from_static(b"{\"grant\":\"everything\"}"))
        .await
        .unwrap();
    let stranger = iroh::SecretKey::generate().public().to_string();
    topic
        .broadcast(format!("{{\"from\":\"{stranger}\",\"roster\":1000}}").into())
        .await
        .unwrap();
    topic
        .broadcast(format!("{{\"from\":\"{}\",\"roster\":1000}}", mallory.id()).into())
        .await
        .unwrap();
    for i in 0..1500u32 {
        let notice = format!("{{\"from\":\"{}\",\"catalog\":{i}}}", mallory.id());
        topic.broadcast(notice.into()).await.unwrap();
    }
    let gossip_refusals = || {
        audit(&bob)
            .into_iter()
            .filter(|r| r["event"] == "gossip_refused")
            .collect::<Vec<_>>()
    };
    assert!(
        eventually(CONVERGE, || !gossip_refusals().is_empty()).await,
        "bob records the refused gossip: {:?}",
        audit(&bob)
    );
    // A minute's worth of records at most: one for mallory, whatever she sent.
    let records = gossip_refusals();
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(
        records[0]["principal"],
        format!("eid:{}", mallory.id()),
        "{records:?}"
    );
    // Nothing she said moved bob's roster, and bob still serves.
    assert_eq!(serial_of(&bob), Some(serial));
    assert!(bob.json(&["status"])["id"].is_string());
    gossip.shutdown().await.ok();
}

#[tokio::test(flavor = "multi_thread")]
async fn the_orgs_gossip_is_closed_to_a_key_the_roster_does_not_name_even_one_trusted_by_pairing() {
    let t = Team::start("");
    converged(&t.all(), t.serial()).await;
    for trusted in [true, false] {
        let (ep, target) = raw_client(&t.bob, trusted).await;
        let conn = ep
            .connect(target, b"mcpmesh/gossip/1")
            .await
            .expect("the handshake completes; the gossip handler decides");
        // Were it let in, the node's gossip would wait for this key's first frame.
        let (mut send, _recv) = match conn.open_bi().await {
            Ok(stream) => stream,
            Err(e) => panic!("a stream can be opened before the refusal: {e}"),
        };
        let _ = send.write_all(b"\x00").await;
        let closed = tokio::time::timeout(ANSWER_TIMEOUT, conn.closed())
            .await
            .expect("the node closes the connection");
        assert_eq!(
            mcpmesh_net::session::close_reason_code(Some(&closed)),
            mcpmesh_net::errors::ErrorCode::UnknownService,
            "trusted by pairing: {trusted}: {closed:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_service_served_later_reaches_the_members_catalogs_through_gossip() {
    let t = Team::start("");
    converged(&t.all(), t.serial()).await;
    t.alice.serve("notes", &["group:eng"], &["--", stub()]);
    let mounts = |node: &TestNode| -> Vec<String> {
        node.json(&["services"])["services"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["mount"].as_str().unwrap().to_owned())
            .collect()
    };
    // Answers are re-asked only after 30 s unless the serving node announces a change (and
    // bob's `status` calls asked alice's catalog while the team formed).
    let seen = eventually(Duration::from_secs(10), || {
        mounts(&t.bob) == ["alice/notes"]
    })
    .await;
    assert!(seen, "{:?}", mounts(&t.bob));
    assert!(mounts(&t.carol).is_empty(), "sales gets nothing");

    let started = Instant::now();
    t.alice.serve("calc", &["group:eng"], &["--", stub()]);
    let reached = eventually(Duration::from_secs(10), || {
        mounts(&t.bob).contains(&"alice/calc".to_owned())
    })
    .await;
    assert!(reached, "bob's catalog of alice: {:?}", mounts(&t.bob));
    eprintln!(
        "CATALOG-GOSSIP: alice/calc in bob's services {:?} after it was served",
        started.elapsed()
    );
    assert!(!mounts(&t.carol).contains(&"alice/calc".to_owned()));
}

/// The `policy_changed` records of `node` about `what`, oldest first.
fn policy_changes(node: &TestNode, what: &str) -> Vec<Value> {
    audit(node)
        .into_iter()
        .filter(|r| r["event"] == "policy_changed" && r["what"] == what)
        .collect()
}

/// Asserts a request `s` sends now is not served: the session was severed. A caller the
/// node no longer trusts at all loses its connection, and the request is answered `-32052`
/// (or the session had already ended); one a service no longer admits sees its session end
/// as one the service ended (`-32055`), unless a request was pending (`-32052`).
async fn severed_at_next_request(s: &mut McpSession, who: &str, codes: &[i64]) {
    match s.next_request_on_severed("whoami").await {
        None => {}
        Some(answer) => {
            let code = answer["error"]["code"].as_i64();
            assert!(code.is_some_and(|c| codes.contains(&c)), "{who}: {answer}");
            assert_eq!(answer["error"]["data"]["source"], "mcpmesh", "{answer}");
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_grant_to_one_user_and_its_tool_rule_reach_that_users_open_session() {
    let t = Team::start("");
    t.alice
        .serve_stub("notes", &[], None, &marker("org-user-grant"));
    converged(&t.all(), t.serial()).await;
    let granted = t.alice.json(&["grant", "user:bob", "notes"]);
    assert_eq!(granted["principal"], "user:bob", "{granted}");
    let mut bob = t.bob.connect("alice/notes");
    bob.initialize().await;
    let all = tool_names(&bob.request("tools/list", json!({})).await);
    assert!(all.contains(&"whoami".to_owned()), "{all:?}");
    // carol is no user:bob.
    refused_session(&t.carol, "alice/notes").await;

    // bob's own rule: echo only, at his next request, and he is told.
    let granted = t
        .alice
        .json(&["grant", "user:bob", "notes", "--tools", "echo"]);
    assert_eq!(granted["tools"]["allow"], json!(["echo"]), "{granted}");
    assert!(bob.notified(LIST_CHANGED, ANSWER_TIMEOUT).await.is_some());
    assert_eq!(
        tool_names(&bob.request("tools/list", json!({})).await),
        ["echo"]
    );
    let denied = bob.call("whoami", json!({})).await;
    assert_eq!(denied["error"]["code"], -32054, "{denied}");
    let echo = bob.call("echo", json!({ "text": "hi" })).await;
    assert!(echo["result"].is_object(), "{echo}");

    // The grant taken back: his session is cut.
    let revoked = t.alice.json(&["revoke", "user:bob", "notes"]);
    assert_eq!(revoked["granted"], false, "{revoked}");
    assert_eq!(revoked["sessions_ended"], 1, "{revoked}");
    severed_at_next_request(&mut bob, "bob", &[-32052, -32055]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn grants_to_the_org_and_to_a_group_with_tools_reach_open_sessions_and_are_audited() {
    let m = marker("org-grants");
    let t = Team::start("");
    t.alice.serve_stub("notes", &[], None, &m);
    converged(&t.all(), t.serial()).await;

    // org:acme: every current member, whatever their groups.
    let granted = t.alice.json(&["grant", "org:acme", "notes"]);
    assert_eq!(granted["principal"], "org:acme", "{granted}");
    assert_eq!(granted["service"], "notes", "{granted}");
    assert!(granted.get("warning").is_none(), "{granted}");
    let mut bob = t.bob.connect("alice/notes");
    let mut carol = t.carol.connect("alice/notes");
    for s in [&mut bob, &mut carol] {
        let init = s.initialize_as("2025-11-25").await;
        assert_eq!(init["result"]["protocolVersion"], "2025-11-25", "{init}");
        let all = tool_names(&s.request("tools/list", json!({})).await);
        assert!(all.len() > 2 && all.contains(&"echo".to_owned()), "{all:?}");
    }
    // A group's own rule, first: the service's first rule, so carol (sales, named by no
    // rule) is left no tool, and the answer says so.
    let granted = t
        .alice
        .json(&["grant", "group:eng", "notes", "--tools", "whoami,echo"]);
    assert_eq!(
        granted["tools"],
        json!({ "allow": ["whoami", "echo"], "deny": [] }),
        "{granted}"
    );
    let warning = granted["warning"].as_str().unwrap_or_default();
    assert!(warning.contains("no rule names"), "{granted}");
    for (s, who, want) in [
        (&mut bob, "bob", &["echo", "whoami"][..]),
        (&mut carol, "carol", &[][..]),
    ] {
        let told = s.notified(LIST_CHANGED, ANSWER_TIMEOUT).await;
        assert!(told.is_some(), "{who} was not told its tools changed");
        assert_eq!(
            tool_names(&s.request("tools/list", json!({})).await),
            want,
            "{who}"
        );
    }
    let denied = carol.call("whoami", json!({})).await;
    assert_eq!(denied["error"]["code"], -32054, "{denied}");

    // revoke --tools: a deny in the group's own rule; the grant and the sessions stay.
    let revoked = t
        .alice
        .json(&["revoke", "group:eng", "notes", "--tools", "echo"]);
    assert_eq!(revoked["granted"], true, "{revoked}");
    assert_eq!(revoked["sessions_ended"], 0, "{revoked}");
    assert_eq!(
        revoked["tools"],
        json!({ "allow": ["whoami", "echo"], "deny": ["echo"] }),
        "{revoked}"
    );
    assert!(bob.notified(LIST_CHANGED, ANSWER_TIMEOUT).await.is_some());
    let echo = bob.call("echo", json!({ "text": "hi" })).await;
    assert_eq!(echo["error"]["code"], -32054, "{echo}");
    let who = bob.call("whoami", json!({})).await;
    assert_eq!(
        who["result"]["structuredContent"]["MCPMESH_PEER_USER"], "bob",
        "{who}"
    );
    // carol's usable tools did not change (none before, none now): nothing to tell her.
    let ping = carol.request("ping", json!({})).await;
    assert!(ping["result"].is_object(), "{ping}");
    assert!(
        !carol.skipped.iter().any(|m| m["method"] == LIST_CHANGED),
        "{:?}",
        carol.skipped
    );

    // A roster removal: carol is no longer a member, so no longer in org:acme.
    org(&t.alice, &["remove", "carol"]);
    severed_at_next_request(&mut carol, "carol", &[-32052]).await;
    // The org's grant taken back, bob (eng) stays; the group's too, and his session ends.
    let revoked = t.alice.json(&["revoke", "org:acme", "notes"]);
    assert_eq!(revoked["granted"], false, "{revoked}");
    assert_eq!(revoked["sessions_ended"], 0, "{revoked}");
    let who = bob.call("whoami", json!({})).await;
    assert!(who["result"].is_object(), "{who}");
    let revoked = t.alice.json(&["revoke", "group:eng", "notes"]);
    assert_eq!(revoked["granted"], false, "{revoked}");
    assert_eq!(revoked["sessions_ended"], 1, "{revoked}");
    severed_at_next_request(&mut bob, "bob", &[-32052, -32055]).await;

    // Each change is an audit record saying what it was and what it is.
    let recorded = || policy_changes(&t.alice, "allow").len() >= 4;
    assert!(eventually(ANSWER_TIMEOUT, recorded).await);
    let allow = policy_changes(&t.alice, "allow");
    let steps: Vec<(Value, Value, Value)> = allow
        .iter()
        .map(|r| (r["before"].clone(), r["after"].clone(), r["by"].clone()))
        .collect();
    let want = [
        (json!([]), json!(["org:acme"])),
        (json!(["org:acme"]), json!(["org:acme", "group:eng"])),
        (json!(["org:acme", "group:eng"]), json!(["group:eng"])),
        (json!(["group:eng"]), json!([])),
    ];
    let want: Vec<(Value, Value, Value)> = want
        .into_iter()
        .map(|(before, after)| (before, after, json!("command")))
        .collect();
    assert_eq!(steps, want, "{allow:?}");
    let tools = policy_changes(&t.alice, "tools");
    assert_eq!(tools.len(), 2, "{tools:?}");
    assert_eq!(tools[0]["before"], json!([]), "{tools:?}");
    assert_eq!(
        tools[0]["after"],
        json!([{ "who": ["group:eng"], "allow": ["whoami", "echo"], "deny": [] }]),
        "{tools:?}"
    );
    assert_eq!(tools[1]["before"], tools[0]["after"], "{tools:?}");
    assert_eq!(
        tools[1]["after"],
        json!([{ "who": ["group:eng"], "allow": ["whoami", "echo"], "deny": ["echo"] }]),
        "{tools:?}"
    );
    assert!(tools.iter().all(|r| r["service"] == "notes"));

    // Another org's name matches nobody here: written, and said so.
    let other = t.alice.json(&["grant", "org:globex", "notes"]);
    let warning = other["warning"].as_str().unwrap_or_default();
    assert!(warning.contains("this node's org is acme"), "{other}");
}
