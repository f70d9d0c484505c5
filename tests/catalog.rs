//! The catalog: each node answers "what may I use here?" for the asking peer only, over the gated
//! `mcpmesh/catalog/1`; `services`, `peers`, `use` and the hub read the answers.
//!
//! Real nodes on loopback (relays off), the stub as the served MCP server, raw iroh endpoints
//! for the hostile cases (a peer asking for someone else, an untrusted key, a flood, a peer
//! answering more than the cap or nonsense).

mod common;

use std::collections::BTreeSet;
use std::process::Stdio;
use std::time::Duration;

use common::*;
use serde_json::{Value, json};

/// Longest a change may take to reach a running hub's client (the hub re-reads the catalog
/// every few seconds; the target is 10 s).
const HUB_FOLLOWS: Duration = Duration::from_secs(30);
const ALPN_CATALOG: &[u8] = b"mcpmesh/catalog/1";

/// The stub's tool count, as a direct `tools/list` gives it.
async fn stub_tool_count() -> u64 {
    let mut direct = McpSession::direct_stub();
    direct.initialize().await;
    let listed = direct.request("tools/list", json!({})).await;
    listed["result"]["tools"].as_array().unwrap().len() as u64
}

/// `services --json` (with `--refresh`: every peer asked now).
fn services(node: &TestNode, refresh: bool) -> Vec<Value> {
    let mut args = vec!["services"];
    if refresh {
        args.push("--refresh");
    }
    node.json(&args)["services"].as_array().unwrap().clone()
}

fn mounts(entries: &[Value]) -> Vec<String> {
    entries
        .iter()
        .map(|e| e["mount"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn services_lists_what_each_peer_offers_this_node_and_nothing_about_the_rest() {
    let (alice, bob, carol) = three_nodes_with("");
    let v = alice.json(&[
        "serve",
        "notes",
        "--allow",
        "bob",
        "--description",
        "Team notes, read-only",
        "--",
        stub(),
    ]);
    assert_eq!(v["serving"], true);
    alice.serve("secret", &["carol"], &["--", stub()]);

    let seen = services(&bob, false);
    assert_eq!(
        seen,
        vec![json!({
            "mount": "alice/notes", "peer": "alice", "service": "notes",
            "description": "Team notes, read-only", "backend": "run", "tools": null,
            "reachable": true, "admitted_by": "peer:bob",
        })],
        "bob sees notes, never secret"
    );
    assert_eq!(mounts(&services(&carol, false)), ["alice/secret"]);
    assert!(
        services(&alice, false).is_empty(),
        "bob and carol serve nothing"
    );

    // `peers` says what bob may use on alice; `use` no longer guesses.
    let peers = bob.json(&["peers"]);
    let on_alice = peers["peers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "alice")
        .unwrap()
        .clone();
    assert_eq!(on_alice["mounts"], json!(["notes"]));
    let used = bob.json(&["use", "alice/notes"]);
    assert!(used.get("warning").is_none(), "{used}");
    assert_eq!(used["known_grant"], true);
    let refused = bob.json(&["use", "alice/secret"]);
    let warning = refused["warning"].as_str().unwrap();
    assert!(warning.contains("does not offer \"secret\""), "{warning}");
    assert!(warning.contains("notes"), "{warning}");
    assert_eq!(
        mounts(&bob.json(&["use"])["services"].as_array().unwrap().clone()),
        ["alice/notes"]
    );

    // Once bob's session listed the tools, the catalog counts them.
    let mut session = bob.connect("alice/notes");
    session.initialize().await;
    let listed = session.request("tools/list", json!({})).await;
    assert!(listed["result"]["tools"].is_array(), "{listed}");
    session.close_stdin();
    session.wait_eof().await;
    let seen = services(&bob, true);
    assert_eq!(seen[0]["tools"], json!(stub_tool_count().await));

    // The human listing says the same.
    let out = bob.cli(&["services"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("alice/notes") && text.contains("Team notes, read-only"),
        "{text}"
    );
    assert!(!text.contains("secret"), "{text}");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_tool_count_follows_the_callers_own_rules() {
    let (alice, bob) = two_nodes();
    alice.serve("notes", &["bob"], &["--", stub()]);
    let mut session = bob.connect("alice/notes");
    session.initialize().await;
    session.request("tools/list", json!({})).await;
    session.close_stdin();
    session.wait_eof().await;
    assert_eq!(
        services(&bob, true)[0]["tools"],
        json!(stub_tool_count().await)
    );

    alice.json(&["grant", "bob", "notes", "--tools", "echo,whoami"]);
    assert_eq!(services(&bob, true)[0]["tools"], json!(2));
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unreachable_peer_keeps_its_last_known_entries_marked_as_such() {
    let (alice, bob) = two_nodes();
    alice.serve("notes", &["bob"], &["--", stub()]);
    assert_eq!(mounts(&services(&bob, false)), ["alice/notes"]);
    alice.json(&["down"]);
    let seen = services(&bob, true);
    assert_eq!(
        mounts(&seen),
        ["alice/notes"],
        "the last known entries stay"
    );
    assert_eq!(seen[0]["reachable"], false, "{seen:?}");
    // And survive a restart of bob's node (read back from its state).
    bob.json(&["down"]);
    let seen = services(&bob, false);
    assert_eq!(mounts(&seen), ["alice/notes"]);
}

/// One catalog exchange on a fresh connection: the request line, the answer line (`None`:
/// the connection was closed without one).
async fn ask_raw(ep: &iroh::Endpoint, target: iroh::EndpointId, request: &[u8]) -> Option<Value> {
    let conn = ep.connect(target, ALPN_CATALOG).await.ok()?;
    let (mut send, recv) = conn.open_bi().await.ok()?;
    send.write_all(request).await.ok()?;
    send.finish().ok()?;
    let mut reader = mcpmesh_net::transport::FrameReader::new(recv, 1 << 20);
    let line = tokio::time::timeout(Duration::from_secs(10), reader.next_line())
        .await
        .ok()?
        .ok()??;
    conn.close(0u32.into(), b"done");
    serde_json::from_slice(&line).ok()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_peer_that_refused_this_node_is_asked_again_once_it_trusts_it() {
    let alice = TestNode::start("alice");
    let bob = TestNode::start("bob");
    bob.trust(&alice);
    let first = bob.json(&["services", "--refresh"]);
    assert_eq!(first["unanswered"], json!(["alice"]), "{first}");
    // bob's node has found alice answering only to refuse it.
    let peers = bob.json(&["peers"]);
    assert_eq!(peers["peers"][0]["reachable"], false, "{peers}");

    // Once alice trusts bob, bob's next look asks her again and waits for the answer (it had
    // nothing of hers to show), though she once refused it.
    alice.trust(&bob);
    alice.serve("notes", &["bob"], &["--", stub()]);
    let listed = bob.json(&["services", "--refresh"]);
    let seen = listed["services"].as_array().unwrap().clone();
    assert_eq!(mounts(&seen), ["alice/notes"], "{listed}");
    assert_eq!(listed["unanswered"], json!([]), "{listed}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_look_without_refresh_waits_for_a_peer_that_has_never_answered_yet() {
    let alice = TestNode::start("alice");
    let bob = TestNode::start("bob");
    bob.trust(&alice);
    let first = bob.json(&["services"]);
    assert_eq!(first["unanswered"], json!(["alice"]), "{first}");
    alice.trust(&bob);
    alice.serve("notes", &["bob"], &["--", stub()]);
    // What doctor and `status` ask: answers up to 30 s old are fine, but alice's never came.
    let listed = bob.json(&["services"]);
    let seen = listed["services"].as_array().unwrap().clone();
    assert_eq!(mounts(&seen), ["alice/notes"], "{listed}");
    assert_eq!(listed["unanswered"], json!([]), "{listed}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_peer_gets_its_own_catalog_only_and_a_flood_is_refused_and_recorded_once() {
    let alice = TestNode::start("alice");
    let (ep, target) = raw_client(&alice, true).await;
    let tester = alice.json(&["peers"])["peers"][0]["name"]
        .as_str()
        .unwrap()
        .to_owned();
    alice.serve("notes", &[&tester], &["--", stub()]);
    alice.serve("secret", &[], &["--", stub()]);

    let answer = ask_raw(&ep, target, b"{\"catalog\":1}\n").await.unwrap();
    assert_eq!(answer["services"].as_array().unwrap().len(), 1, "{answer}");
    assert_eq!(answer["services"][0]["service"], "notes");
    assert!(!answer.to_string().contains("secret"));

    // A request cannot name anyone else, nor be anything but the one line.
    let other = format!("{{\"catalog\":1,\"for\":\"eid:{}\"}}\n", alice.id);
    let refused = ask_raw(&ep, target, other.as_bytes()).await.unwrap();
    assert!(refused["error"].is_string(), "{refused}");
    assert_eq!(refused["services"], json!([]));
    let long = format!("{{\"catalog\":1,\"pad\":\"{}\"}}\n", "x".repeat(4096));
    let refused = ask_raw(&ep, target, long.as_bytes()).await.unwrap();
    assert!(refused["error"].is_string(), "{refused}");

    // An untrusted key gets nothing at all.
    let (stranger, _) = raw_client(&alice, false).await;
    assert!(
        ask_raw(&stranger, target, b"{\"catalog\":1}\n")
            .await
            .is_none()
    );

    // A flood: past the per-peer rate, refused; recorded once, not once per request.
    let mut refusals = 0;
    for _ in 0..200 {
        if let Some(a) = ask_raw(&ep, target, b"{\"catalog\":1}\n").await
            && a["error"].as_str().is_some_and(|e| e.contains("too many"))
        {
            refusals += 1;
        }
    }
    assert!(refusals > 0, "200 requests at once were all answered");
    let records = alice.stop_and_audit();
    let recorded: Vec<&Value> = records
        .iter()
        .filter(|r| r["event"] == "catalog_refused")
        .collect();
    assert_eq!(recorded.len(), 1, "{recorded:?}");
    assert!(!recorded[0].to_string().contains("secret"));
}

/// A peer that answers catalog requests with `answer` (as many times as asked).
async fn hostile_catalog_peer(answer: Vec<u8>) -> (iroh::Endpoint, tokio::task::JoinHandle<()>) {
    let key = iroh::SecretKey::generate();
    let config = mcpmesh_net::endpoint::NetworkConfig::loopback();
    let ep = mcpmesh_net::endpoint::bind(
        key,
        &config,
        vec![ALPN_CATALOG.to_vec()],
        iroh::address_lookup::MemoryLookup::new(),
    )
    .await
    .unwrap();
    let server = ep.clone();
    let task = tokio::spawn(async move {
        while let Some(incoming) = server.accept().await {
            let answer = answer.clone();
            tokio::spawn(async move {
                let Ok(conn) = incoming.await else { return };
                let Ok((mut send, _recv)) = conn.accept_bi().await else {
                    return;
                };
                let _ = send.write_all(&answer).await;
                let _ = send.finish();
                let _ = conn.closed().await;
            });
        }
    });
    (ep, task)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_catalog_answer_over_the_cap_or_malformed_is_refused_and_the_rest_still_listed() {
    let (alice, bob) = two_nodes();
    alice.serve("notes", &["bob"], &["--", stub()]);
    let huge = format!(
        "{{\"services\":[{{\"service\":\"x\",\"backend\":\"run\",\"tools\":1,\"admitted_by\":\"{}\"}}]}}\n",
        "a".repeat(300 * 1024)
    );
    let bad_name = b"{\"services\":[{\"service\":\"../../etc\",\"backend\":\"run\",\"tools\":1,\"admitted_by\":\"peer:bob\"}]}\n".to_vec();
    let mut peers = Vec::new();
    for (name, answer) in [("huge", huge.into_bytes()), ("liar", bad_name)] {
        let (ep, task) = hostile_catalog_peer(answer).await;
        let addr = ep.bound_sockets()[0].to_string();
        bob.json(&["peers", "add", name, &ep.id().to_string(), "--addr", &addr]);
        peers.push((ep, task));
    }
    let listed = bob.json(&["services", "--refresh"]);
    let seen = listed["services"].as_array().unwrap().clone();
    assert_eq!(mounts(&seen), ["alice/notes"], "{seen:?}");
    assert_eq!(listed["refused"], json!(["huge", "liar"]), "{listed}");
    assert_eq!(listed["unanswered"], json!([]), "{listed}");
    // Asked again within the minute: still refused, recorded once per peer.
    bob.json(&["services", "--refresh"]);
    assert!(
        bob.json(&["status"])["id"].is_string(),
        "bob's node still answers"
    );
    let records = bob.stop_and_audit();
    let refused: Vec<&Value> = records
        .iter()
        .filter(|r| r["event"] == "catalog_refused")
        .collect();
    let by: Vec<&str> = refused
        .iter()
        .map(|r| r["peer"].as_str().unwrap())
        .collect();
    assert_eq!(by.len(), 2, "one record per peer: {refused:?}");
    assert!(by.contains(&"huge") && by.contains(&"liar"), "{refused:?}");
    for r in &refused {
        let reason = r["reason"].as_str().unwrap();
        assert!(reason.starts_with("its answer"), "{r}");
        assert!(r["principal"].as_str().unwrap().starts_with("eid:"), "{r}");
        // What the peer sent is not copied into the record.
        assert!(!r.to_string().contains("aaaaaaaa"), "{r}");
    }
}

/// `mcpmesh hub` with no argument, driven with raw JSON-RPC.
fn whole_hub(node: &TestNode) -> McpSession {
    hub_with(node, &[])
}

/// `mcpmesh hub ARGS…`, driven with raw JSON-RPC.
fn hub_with(node: &TestNode, args: &[&str]) -> McpSession {
    let mut cmd = tokio::process::Command::new(MCPMESH);
    cmd.arg("--home")
        .arg(node.home())
        .arg("hub")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true);
    McpSession::spawn(cmd)
}

async fn tool_names(hub: &mut McpSession) -> BTreeSet<String> {
    let listed = hub.request("tools/list", json!({})).await;
    listed["result"]["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("{listed}"))
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_owned())
        .collect()
}

/// Waits for the hub to send `method`, skipping everything else.
async fn notified(hub: &mut McpSession, method: &str) -> bool {
    tokio::time::timeout(HUB_FOLLOWS, async {
        while let Some(msg) = hub.recv().await {
            if msg["method"] == method {
                return true;
            }
        }
        false
    })
    .await
    .unwrap_or(false)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hub_with_no_argument_presents_the_catalog_and_follows_its_changes() {
    let (alice, bob) = two_nodes();
    alice.serve("notes", &["bob"], &["--", stub()]);
    let mut hub = whole_hub(&bob);
    hub.initialize().await;
    let names = tool_names(&mut hub).await;
    assert!(names.contains("alice__notes__echo"), "{names:?}");

    // A service served later appears, announced.
    alice.serve("calc", &["bob"], &["--", stub()]);
    assert!(notified(&mut hub, "notifications/tools/list_changed").await);
    let mut names = tool_names(&mut hub).await;
    for _ in 0..3 {
        if names.contains("alice__calc__echo") {
            break;
        }
        assert!(notified(&mut hub, "notifications/tools/list_changed").await);
        names = tool_names(&mut hub).await;
    }
    assert!(names.contains("alice__calc__echo"), "{names:?}");

    // One that goes leaves, announced.
    alice.json(&["unserve", "calc"]);
    assert!(notified(&mut hub, "notifications/tools/list_changed").await);
    let names = tool_names(&mut hub).await;
    assert!(!names.iter().any(|n| n.contains("calc")), "{names:?}");
    assert!(names.contains("alice__notes__echo"));
    hub.close_stdin();
    hub.wait_eof().await;

    // A whole hub started again lists from its cache: no session opens at alice.
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let mut hub = whole_hub(&bob);
    hub.initialize().await;
    let names = tool_names(&mut hub).await;
    assert!(names.contains("alice__notes__echo"), "{names:?}");
    hub.close_stdin();
    hub.wait_eof().await;
    let opened: Vec<Value> = alice
        .stop_and_audit()
        .into_iter()
        .filter(|r| r["event"] == "session_open" && r["at_ms"].as_u64() >= Some(since))
        .collect();
    assert!(
        opened.is_empty(),
        "a warm start opened sessions: {opened:?}"
    );
}

/// The names a hub's `method` (`prompts/list`, `resources/list`) answers, under `field`.
async fn listed(hub: &mut McpSession, method: &str, list: &str, field: &str) -> BTreeSet<String> {
    let answer = hub.request(method, json!({})).await;
    answer["result"][list]
        .as_array()
        .unwrap_or_else(|| panic!("{method}: {answer}"))
        .iter()
        .map(|item| item[field].as_str().unwrap_or_default().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_service_with_prompts_and_resources_served_later_reaches_every_list_of_a_whole_hub() {
    let (alice, bob) = two_nodes();
    alice.serve("notes", &["bob"], &["--", stub()]);
    let mut hub = whole_hub(&bob);
    hub.initialize().await;
    // The client has read every list once: each is announced when it changes.
    assert!(tool_names(&mut hub).await.contains("alice__notes__echo"));
    let prompts = listed(&mut hub, "prompts/list", "prompts", "name").await;
    assert!(
        !prompts.iter().any(|p| p.starts_with("alice__every__")),
        "{prompts:?}"
    );
    listed(&mut hub, "resources/list", "resources", "uri").await;

    // server-everything offers tools, prompts and resources.
    let index = deps()
        .join("node_modules/@modelcontextprotocol/server-everything/dist/index.js")
        .display()
        .to_string();
    let started = std::time::Instant::now();
    alice.serve(
        "every",
        &["bob"],
        &["--", "node", &index, "stdio", &marker("catalog-every")],
    );
    let mut seen = (BTreeSet::new(), BTreeSet::new(), BTreeSet::new());
    for _ in 0..3 {
        for method in [
            "notifications/tools/list_changed",
            "notifications/prompts/list_changed",
            "notifications/resources/list_changed",
        ] {
            assert!(notified(&mut hub, method).await, "no {method}");
        }
        seen = (
            tool_names(&mut hub).await,
            listed(&mut hub, "prompts/list", "prompts", "name").await,
            listed(&mut hub, "resources/list", "resources", "uri").await,
        );
        if seen.1.iter().any(|p| p.starts_with("alice__every__")) {
            break;
        }
    }
    eprintln!(
        "HUB-FOLLOWS: a service served later was in a running hub's lists {:?} after `serve`",
        started.elapsed()
    );
    let (tools, prompts, resources) = seen;
    assert!(
        tools.iter().any(|t| t.starts_with("alice__every__")),
        "{tools:?}"
    );
    assert!(
        prompts.iter().any(|p| p.starts_with("alice__every__")),
        "{prompts:?}"
    );
    assert!(
        resources
            .iter()
            .any(|r| r.starts_with("mcpmesh-hub://alice/every/")),
        "{resources:?}"
    );
    hub.close_stdin();
    hub.wait_eof().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_call_through_the_hub_to_a_tool_the_caller_may_not_use_is_refused_and_audited_by_its_owner()
 {
    let (alice, bob) = two_nodes();
    alice.serve("notes", &["bob"], &["--", stub()]);
    alice.json(&["grant", "bob", "notes", "--tools", "echo"]);
    let mut hub = whole_hub(&bob);
    hub.initialize().await;
    let names = tool_names(&mut hub).await;
    assert_eq!(
        names,
        BTreeSet::from(["alice__notes__echo".to_owned()]),
        "bob's listing shows only what he may use"
    );
    let answer = hub.call("alice__notes__whoami", json!({})).await;
    assert_eq!(answer["error"]["code"], -32054, "{answer}");
    hub.close_stdin();
    hub.wait_eof().await;
    let mut denied = vec!["whoami"];
    // Under the shorter names a hub can present, the attempt reaches alice all the same.
    for (naming, name, tool) in [("service", "notes__blob", "blob"), ("bare", "size", "size")] {
        let mut hub = hub_with(&bob, &["--names", naming]);
        hub.initialize().await;
        let listed = tool_names(&mut hub).await;
        assert_eq!(listed.len(), 1, "{naming}: {listed:?}");
        let answer = hub.call(name, json!({})).await;
        assert_eq!(answer["error"]["code"], -32054, "{naming}: {answer}");
        assert_eq!(answer["error"]["data"]["source"], "mcpmesh", "{answer}");
        hub.close_stdin();
        hub.wait_eof().await;
        denied.push(tool);
    }
    let records = alice.stop_and_audit();
    for tool in denied {
        assert!(
            records
                .iter()
                .any(|r| r["event"] == "request" && r["name"] == tool && r["outcome"] == "denied"),
            "alice's audit records the attempt at {tool}: {records:?}"
        );
    }
}
