//! Per-tool rules on the serving side, over two real nodes: a caller's `tools/list` shows
//! only the tools it may use, a call of any other never reaches the server and is audited,
//! a deny is never undone by another principal the caller holds, `grant`/`revoke --tools`
//! change live sessions and show in `peers` and `status`, and a bad rule is a clear error.

mod common;

use common::*;
use serde_json::{Value, json};

/// The tool names of a `tools/list` answer, in order.
fn names(answer: &Value) -> Vec<String> {
    answer["result"]["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("a tool list: {answer}"))
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_owned())
        .collect()
}

/// Sends `tools/list` with id `id` as raw bytes and returns the raw answer line.
async fn raw_list(s: &mut McpSession, id: &str) -> Vec<u8> {
    let request = format!("{{\"jsonrpc\":\"2.0\",\"id\":\"{id}\",\"method\":\"tools/list\"}}\n");
    s.send_raw(request.as_bytes()).await;
    s.recv_raw().await.expect("an answer")
}

/// The stub's own answer to the same request, with every tool but `kept` taken out: what a
/// filtered answer must be byte for byte.
async fn stub_list_keeping(id: &str, kept: &[&str]) -> Vec<u8> {
    let mut direct = McpSession::direct_stub();
    let whole: Value = serde_json::from_slice(&raw_list(&mut direct, id).await).unwrap();
    let mut filtered = whole.clone();
    let tools = filtered["result"]["tools"].as_array_mut().unwrap();
    tools.retain(|t| kept.contains(&t["name"].as_str().unwrap()));
    assert_eq!(tools.len(), kept.len(), "the stub serves {kept:?}: {whole}");
    serde_json::to_vec(&filtered).unwrap()
}

/// Whether a tools/call answer is the mesh's refusal naming `tool`.
fn refused(answer: &Value, tool: &str) -> bool {
    answer["error"]["code"] == -32054
        && answer["error"]["data"]["source"] == "mcpmesh"
        && answer["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains(tool))
}

/// bob is served the stub on a socket (recording what it receives) under `rules`, written in
/// alice's config before her node starts; `BOB` in `rules` is bob's key.
async fn served_with(rules: &str) -> (TestNode, TestNode, SocketServer) {
    let server = SocketServer::start().await;
    let bob = TestNode::start("bob");
    let config = format!(
        "[services.tools]\nsocket = {:?}\nallow = [\"bob\"]\n\n{}",
        server.path().to_str().unwrap(),
        rules.replace("BOB", &bob.id)
    );
    let alice = TestNode::start_with("alice", &config, &[]);
    alice.trust(&bob);
    bob.trust(&alice);
    (alice, bob, server)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_deny_on_the_callers_key_beats_an_allow_on_its_name_in_lists_calls_and_the_audit() {
    // Two rules name bob: by peer name (every tool) and by key (not echo, not crash).
    let (alice, bob, server) = served_with(
        "[[services.tools.tools]]\nwho = [\"peer:bob\"]\nallow = [\"*\"]\n\n\
         [[services.tools.tools]]\nwho = [\"eid:BOB\"]\ndeny = [\"echo\", \"cr?sh\"]\n",
    )
    .await;
    let mut s = bob.connect("alice/tools");
    s.initialize().await;

    // The list is the server's own frame with two entries gone, byte for byte.
    let kept = ["whoami", "blob", "size", "sleep", "trickle", "ask"];
    let listed = raw_list(&mut s, "list-1").await;
    assert_eq!(
        String::from_utf8_lossy(&listed),
        String::from_utf8_lossy(&stub_list_keeping("list-1", &kept).await)
    );

    // The denied call is answered by alice's node; the server never sees it.
    let secret = "an argument nobody may record";
    let denied = s.call("echo", json!({ "text": secret })).await;
    assert!(refused(&denied, "echo"), "{denied}");
    assert!(!denied.to_string().contains(secret), "{denied}");
    let crash = s.call("crash", json!({})).await;
    assert!(refused(&crash, "crash"), "{crash}");
    let allowed = s.call("whoami", json!({})).await;
    assert!(allowed["result"].is_object(), "{allowed}");
    // The server writes what it receives before it answers: the whoami answer means every
    // line before it is on record.
    let received = server.received();
    assert!(received.contains(r#""name":"whoami""#), "{received}");
    for never in [r#""name":"echo""#, r#""name":"crash""#, secret] {
        assert!(
            !received.contains(never),
            "{never} reached the server: {received}"
        );
    }
    s.close_stdin();
    s.wait_eof().await;

    let records = alice.stop_and_audit();
    let denials: Vec<&Value> = records
        .iter()
        .filter(|r| r["event"] == "request" && r["outcome"] == "denied")
        .collect();
    assert_eq!(denials.len(), 2, "{records:?}");
    let echo = denials.iter().find(|r| r["name"] == "echo").expect("echo");
    assert_eq!(echo["code"], -32054, "{echo}");
    assert_eq!(echo["method"], "tools/call", "{echo}");
    assert_eq!(echo["principal"], format!("eid:{}", bob.id));
    let raw_params =
        serde_json::to_string(&json!({ "name": "echo", "arguments": { "text": secret } })).unwrap();
    assert_eq!(
        echo["params_hash"],
        blake3::hash(raw_params.as_bytes()).to_hex().as_str()
    );
    for entry in std::fs::read_dir(alice.home().join("state/audit")).unwrap() {
        let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        assert!(!text.contains(secret), "an argument reached the audit log");
    }
    assert_eq!(alice.json(&["audit", "verify"])["ok"], true);
}

#[tokio::test(flavor = "multi_thread")]
async fn grant_and_revoke_tools_change_a_live_session_and_show_in_peers_and_status() {
    let (alice, bob, _server) = served_with("").await;
    let mut s = bob.connect("alice/tools");
    s.initialize().await;
    let all = s.request("tools/list", json!({})).await;
    assert_eq!(names(&all).len(), 8, "{all}");
    let peers = alice.json(&["peers"]);
    assert_eq!(
        peers["peers"][0]["tools"]["tools"],
        json!({ "allow": ["*"], "deny": [] }),
        "{peers}"
    );

    let granted = alice.json(&["grant", "bob", "tools", "--tools", "who*,blob,size"]);
    assert_eq!(
        granted["tools"],
        json!({ "allow": ["who*", "blob", "size"], "deny": [] })
    );
    // The service's first rule cuts off every caller it does not name: the answer says so,
    // once.
    let warning = granted["warning"].as_str().unwrap_or_default();
    assert!(warning.contains("no rule names"), "{granted}");
    let again = alice.json(&["grant", "bob", "tools", "--tools", "who*,blob,size"]);
    assert!(again.get("warning").is_none(), "{again}");
    let listed = s.request("tools/list", json!({})).await;
    assert_eq!(names(&listed), ["whoami", "blob", "size"]);

    let revoked = alice.json(&["revoke", "bob", "tools", "--tools", "blob"]);
    assert_eq!(revoked["granted"], true, "{revoked}");
    assert_eq!(revoked["sessions_ended"], 0, "{revoked}");
    let listed = s.request("tools/list", json!({})).await;
    assert_eq!(names(&listed), ["whoami", "size"]);
    let blob = s.call("blob", json!({ "bytes": 3 })).await;
    assert!(refused(&blob, "blob"), "{blob}");
    let size = s.call("size", json!({ "text": "abc" })).await;
    assert_eq!(size["result"]["content"][0]["text"], "3", "{size}");

    let want = json!({ "allow": ["who*", "blob", "size"], "deny": ["blob"] });
    let peers = alice.json(&["peers"]);
    assert_eq!(peers["peers"][0]["tools"]["tools"], want, "{peers}");
    let status = alice.json(&["status"]);
    assert_eq!(status["peers"][0]["tools"]["tools"], want, "{status}");
    let rules = &status["services"][0]["tools"];
    assert_eq!(
        *rules,
        json!([{ "who": [format!("eid:{}", bob.id)], "allow": ["who*", "blob", "size"], "deny": ["blob"] }]),
        "{status}"
    );
    // People read it too.
    let human = String::from_utf8(alice.cli(&["peers"]).stdout).unwrap();
    assert!(
        human.contains("bob may use on tools: who*, blob, size except blob"),
        "{human}"
    );
    let human = String::from_utf8(alice.cli(&["status"]).stdout).unwrap();
    assert!(human.contains("bob may use on tools:"), "{human}");

    // Plain revoke keeps its meaning: the grant goes, and the session with it.
    let revoked = alice.json(&["revoke", "bob", "tools"]);
    assert_eq!(revoked["granted"], false, "{revoked}");
    assert_eq!(revoked["sessions_ended"], 1, "{revoked}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_url_services_tool_list_is_filtered_too() {
    let server = EverythingHttp::start().await;
    let (alice, bob) = two_nodes();
    alice.serve("web", &["bob"], &["--url", &server.url]);
    let mut s = bob.connect("alice/web");
    s.initialize().await;
    let all = names(&s.request("tools/list", json!({})).await);
    assert!(all.len() > 2 && all.contains(&"echo".to_owned()), "{all:?}");

    alice.json(&["grant", "bob", "web", "--tools", "echo"]);
    let listed = s.request("tools/list", json!({})).await;
    assert_eq!(names(&listed), ["echo"], "{listed}");
    let other = all.iter().find(|t| *t != "echo").unwrap();
    let denied = s.call(other, json!({})).await;
    assert!(refused(&denied, other), "{denied}");
    let echoed = s.call("echo", json!({ "message": "hi" })).await;
    assert!(echoed["result"].is_object(), "{echoed}");
}

#[test]
fn a_malformed_rule_is_reported_naming_the_service_and_the_rule() {
    let alice = TestNode::start("alice");
    alice.json(&["down"]);
    let config = alice.home().join("config.toml");
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str(
        "\n[services.files]\nrun = \"cat\"\n\n[[services.files.tools]]\nwho = [\"team:eng\"]\nallow = [\"read_*\"]\n",
    );
    std::fs::write(&config, text).unwrap();
    let says =
        |text: &str| text.contains("services.files.tools[0]: who") && text.contains("team:eng");
    let status = alice.cli(&["--json", "status"]);
    assert!(!status.status.success(), "status fails");
    let stderr = String::from_utf8_lossy(&status.stderr);
    assert!(says(&stderr), "{stderr}");
    let doctor = alice.cli(&["--json", "doctor"]);
    assert!(!doctor.status.success(), "doctor fails");
    let report: Value = serde_json::from_slice(&doctor.stdout).unwrap();
    let check = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["check"] == "config")
        .unwrap_or_else(|| panic!("{report}"));
    assert_eq!(check["status"], "error", "{report}");
    assert!(says(check["message"].as_str().unwrap()), "{report}");
}

/// alice serves the stub as a spawned server behind `tee`, which keeps every byte the server
/// is given in `received`, under `rules`.
fn run_with_rules(rules: &str, received: &std::path::Path) -> (TestNode, TestNode) {
    let bob = TestNode::start("bob");
    let run = format!("tee -a '{}' | '{}'", received.display(), stub());
    let config = format!(
        "[services.tools]\nrun = [\"/bin/sh\", \"-c\", {run:?}]\nallow = [\"bob\"]\n\n{rules}"
    );
    let alice = TestNode::start_with("alice", &config, &[]);
    alice.trust(&bob);
    bob.trust(&alice);
    (alice, bob)
}

/// A `run` service behind `tee` (every byte its server was given kept in `received`), whose
/// rules deny bob `echo`, and bob's session with it: the directory, `received`, alice, bob and
/// the session.
async fn denying_echo() -> (
    tempfile::TempDir,
    std::path::PathBuf,
    TestNode,
    TestNode,
    McpSession,
) {
    let dir = tempfile::tempdir().unwrap();
    let received = dir.path().join("received");
    let (alice, bob) = run_with_rules(
        "[[services.tools.tools]]\nwho = [\"peer:bob\"]\ndeny = [\"echo\"]\n",
        &received,
    );
    let mut s = bob.connect("alice/tools");
    s.initialize().await;
    (dir, received, alice, bob, s)
}

/// Whether the server behind `tee` (see [`denying_echo`]) was given `mark`, once every byte
/// sent before now reached it: a `whoami` answered after them.
async fn server_was_given(s: &mut McpSession, received: &std::path::Path, mark: &[u8]) -> bool {
    let last = s.call("whoami", json!({})).await;
    assert!(last["result"].is_object(), "{last}");
    let bytes = std::fs::read(received).unwrap();
    bytes.windows(mark.len()).any(|w| w == mark)
}

/// The answer to request `id`, keeping what came before it in `s.skipped`.
async fn answer_to(s: &mut McpSession, id: u64) -> Value {
    loop {
        let msg = s.recv().await.expect("an answer before EOF");
        if msg["id"] == id {
            return msg;
        }
        s.skipped.push(msg);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_long_call_goes_on_as_it_arrives_and_one_refused_never_reaches_the_server_as_a_message() {
    let (_dir, received, alice, _bob, mut s) = denying_echo().await;
    // Past the length a node holds whole: these go on in parts.
    let text = |mark: &str| format!("{mark}{}", "y".repeat(1 << 20));

    let allowed = s.call("size", json!({ "text": text("first-") })).await;
    assert_eq!(
        allowed["result"]["content"][0]["text"],
        ((1 << 20) + 6).to_string()
    );
    // serde_json writes `arguments` before `name`: the call's start does not name its tool,
    // so it goes on as it arrives, and is decided on when it ends.
    let denied = s.call("echo", json!({ "text": text("streamed-") })).await;
    assert!(refused(&denied, "echo"), "{denied}");
    // Right after a refusal the next long line is held whole, and refused before any of it
    // reaches the server.
    let again = s.call("echo", json!({ "text": text("held-") })).await;
    assert!(refused(&again, "echo"), "{again}");
    let last = s.call("whoami", json!({})).await;
    assert!(last["result"].is_object(), "{last}");

    // The whoami answer means every byte before it went through `tee`.
    let bytes = std::fs::read(&received).unwrap();
    let lines: Vec<&[u8]> = bytes.split(|b| *b == b'\n').collect();
    let with = |mark: &str| {
        let mark = mark.as_bytes();
        let found = lines
            .iter()
            .find(|l| l.windows(mark.len()).any(|w| w == mark));
        found.copied()
    };
    let first = with("first-").expect("the allowed call reached the server");
    assert!(serde_json::from_slice::<Value>(first).is_ok());
    // The refused call went on as it arrived, and ended without its closing bracket: no
    // parser reads it as a message.
    let cut = with("streamed-").expect("the first refused call went on in parts");
    assert!(serde_json::from_slice::<Value>(cut).is_err());
    assert!(with("held-").is_none(), "the held call reached the server");
    // If the server answered the fragment, it answered a parse error, not a call.
    let stray: Vec<&Value> = s
        .skipped
        .iter()
        .filter(|m| m["error"]["code"] != -32700)
        .collect();
    assert!(stray.is_empty(), "{stray:?}");
    s.close_stdin();
    s.wait_eof().await;

    // The audit record of a call that went on in parts hashes its params as written.
    let records = alice.stop_and_audit();
    let size = records.iter().find(|r| r["name"] == "size").expect("size");
    let params = json!({ "name": "size", "arguments": { "text": text("first-") } });
    let raw = serde_json::to_string(&params).unwrap();
    assert_eq!(
        size["params_hash"],
        blake3::hash(raw.as_bytes()).to_hex().as_str()
    );
    assert_eq!(size["outcome"], "ok", "{size}");
    let denials = records.iter().filter(|r| r["outcome"] == "denied").count();
    assert_eq!(denials, 2, "{records:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_refused_long_call_that_names_its_tool_first_never_reaches_the_server() {
    let (_dir, received, alice, _bob, mut s) = denying_echo().await;
    // As the SDKs write a call: its tool named before its arguments, here a megabyte long.
    let fill = "z".repeat(1 << 20);
    let line = format!(
        "{{\"jsonrpc\":\"2.0\",\"id\":41,\"method\":\"tools/call\",\"params\":{{\"name\":\"echo\",\"arguments\":{{\"text\":\"named-first-{fill}\"}}}}}}\n"
    );
    s.send_raw(line.as_bytes()).await;
    let denied = answer_to(&mut s, 41).await;
    assert!(refused(&denied, "echo"), "{denied}");
    assert!(
        !server_was_given(&mut s, &received, b"named-first-").await,
        "some of the refused call reached the server"
    );
    assert!(s.skipped.is_empty(), "{:?}", s.skipped);
    s.close_stdin();
    s.wait_eof().await;
    let records = alice.stop_and_audit();
    let denial = records
        .iter()
        .find(|r| r["outcome"] == "denied")
        .expect("the refusal is audited");
    assert_eq!(denial["name"], "echo", "{denial}");
    assert!(denial["bytes_in"].as_u64().unwrap() > 1 << 20, "{denial}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_call_with_a_member_spelled_like_one_mcp_reads_never_reaches_the_server() {
    let (_dir, received, alice, _bob, mut s) = denying_echo().await;
    // A server whose parser ignores case (Go's encoding/json; CVE-2026-27896) reads the last
    // of `name` and `Name` and calls `echo`, which bob may not use; the node read `size`.
    let smuggled = |id: u64, mark: &str| {
        format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"tools/call\",\"params\":{{\"name\":\"size\",\"Name\":\"echo\",\"arguments\":{{\"text\":\"{mark}\"}}}}}}\n"
        )
    };
    // Short, held whole; and past the length a node passes on in parts.
    let long = format!("long-smuggled-{}", "q".repeat(1 << 20));
    for (id, mark) in [(51, "short-smuggled"), (52, long.as_str())] {
        s.send_raw(smuggled(id, mark).as_bytes()).await;
        let answer = answer_to(&mut s, id).await;
        assert_eq!(answer["error"]["code"], -32600, "{answer}");
    }
    assert!(
        !server_was_given(&mut s, &received, b"smuggled-").await,
        "a smuggled call reached the server"
    );
    s.close_stdin();
    s.wait_eof().await;
    let records = alice.stop_and_audit();
    let invalid: Vec<&Value> = records
        .iter()
        .filter(|r| r["outcome"] == "invalid")
        .collect();
    assert_eq!(invalid.len(), 2, "{records:?}");
    assert!(invalid.iter().all(|r| r["code"] == -32600), "{invalid:?}");
}
