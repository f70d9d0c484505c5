//! `mcpmesh hub`: one stdio MCP server over the services of several peers, seen from its
//! client (the official Python SDK through `tests/interop/hub_client.py`, or raw JSON-RPC)
//! and from the serving nodes (their live sessions, their children, their audit records).
//!
//! Bob runs the hub; alice and carol serve. The serving side is real: the stub
//! (`echo_mcp_stub`) and npm `@modelcontextprotocol/server-everything`, each tagged with a
//! marker argument so that its processes can be found.

mod common;

use std::collections::BTreeSet;
use std::process::Stdio;
use std::time::Duration;

use common::*;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout};

/// Longest one driver step may take (the driver bounds each step itself at 60 s).
const STEP_TIMEOUT: Duration = Duration::from_secs(90);
/// Longest the serving nodes may take to show a change of their sessions or children.
const SETTLE: Duration = Duration::from_secs(15);
/// The stub's tools (it serves its test tools too).
const STUB_TOOLS: [&str; 8] = [
    "echo", "whoami", "blob", "crash", "size", "sleep", "trickle", "ask",
];

/// The SDK client of one hub (`hub_client.py`), driven one step at a time.
struct HubClient {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Lines<BufReader<ChildStdout>>,
}

impl HubClient {
    /// `mcpmesh --home <node> hub ARGS…` under the SDK client, initialized.
    async fn hub(node: &TestNode, args: &[&str]) -> Self {
        let mut command = vec![
            MCPMESH.to_owned(),
            "--home".into(),
            node.home().display().to_string(),
            "hub".into(),
        ];
        command.extend(args.iter().map(|a| a.to_string()));
        Self::start(&command).await
    }

    /// The SDK client of any stdio MCP server `command`, initialized.
    async fn start(command: &[String]) -> Self {
        let mut child = tokio::process::Command::new(python())
            .arg(interop_script("hub_client.py"))
            .arg("--")
            .args(command)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let stdin = child.stdin.take();
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut client = HubClient {
            child,
            stdin,
            lines,
        };
        let ready = client.next().await;
        assert!(ready.get("ready").is_some(), "{ready}");
        client
    }

    async fn next(&mut self) -> Value {
        let line = tokio::time::timeout(STEP_TIMEOUT, self.lines.next_line())
            .await
            .expect("the driver answers in time")
            .unwrap()
            .expect("the driver answers before it exits");
        let answer: Value = serde_json::from_str(&line).unwrap();
        assert!(answer.get("fatal").is_none(), "the driver failed: {answer}");
        answer
    }

    async fn step(&mut self, command: Value) -> Value {
        let mut line = serde_json::to_vec(&command).unwrap();
        line.push(b'\n');
        let stdin = self.stdin.as_mut().expect("the driver's stdin is open");
        stdin.write_all(&line).await.unwrap();
        stdin.flush().await.unwrap();
        self.next().await
    }

    /// Every tool listed, as (name, description).
    async fn tools(&mut self) -> Vec<(String, String)> {
        let listed = self.step(json!({ "op": "list" })).await;
        listed["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| {
                let text = |k: &str| t[k].as_str().unwrap_or_default().to_owned();
                (text("name"), text("description"))
            })
            .collect()
    }

    async fn call(&mut self, name: &str, arguments: Value) -> Value {
        self.step(json!({ "op": "call", "name": name, "arguments": arguments }))
            .await
    }

    /// Ends the session (the SDK closes the hub's stdin) and waits for the driver to exit.
    async fn close(mut self) {
        self.stdin = None;
        let status = tokio::time::timeout(STEP_TIMEOUT, self.child.wait())
            .await
            .expect("the driver exits in time")
            .unwrap();
        assert!(status.success(), "the driver exited {status}");
    }
}

/// `mcpmesh --home <node> hub ARGS…` driven with raw JSON-RPC.
fn raw_hub(node: &TestNode, args: &[&str]) -> McpSession {
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

/// The names a raw client sees in `tools/list`.
async fn raw_tool_names(hub: &mut McpSession) -> BTreeSet<String> {
    let listed = hub.request("tools/list", json!({})).await;
    listed["result"]["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("no tools: {listed}"))
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_owned())
        .collect()
}

fn everything_index() -> String {
    deps()
        .join("node_modules/@modelcontextprotocol/server-everything/dist/index.js")
        .display()
        .to_string()
}

/// Serves server-everything to bob; `marker` tags its process (the server ignores it).
fn serve_everything(node: &TestNode, service: &str, marker: &str) {
    let index = everything_index();
    node.serve(service, &["bob"], &["--", "node", &index, "stdio", marker]);
}

/// The tools `command` lists when the SDK client talks to it directly.
async fn direct_tools(command: &[String]) -> BTreeSet<String> {
    let mut client = HubClient::start(command).await;
    let names = client.tools().await.into_iter().map(|(n, _)| n).collect();
    client.close().await;
    names
}

fn names(tools: &[(String, String)]) -> BTreeSet<String> {
    tools.iter().map(|(n, _)| n.clone()).collect()
}

/// What a call's outcome says in text.
fn text(outcome: &Value) -> String {
    let texts = outcome["texts"]
        .as_array()
        .unwrap_or_else(|| panic!("not a result: {outcome}"));
    assert_eq!(outcome["is_error"], false, "{outcome}");
    texts
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect::<Vec<_>>()
        .join("\n")
}

/// The pid of the stub that answered a `whoami`.
fn pid_of(outcome: &Value) -> u32 {
    outcome["structured"]["pid"]
        .as_u64()
        .unwrap_or_else(|| panic!("no pid: {outcome}")) as u32
}

/// The node's live sessions (every service, every peer).
fn live_sessions(node: &TestNode) -> usize {
    node.json(&["status"])["sessions"]
        .as_array()
        .map_or(0, Vec::len)
}

/// The node's live sessions of `service`.
fn sessions_of(node: &TestNode, service: &str) -> u64 {
    let status = node.json(&["status"]);
    status["services"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|s| s["name"] == service)
        .and_then(|s| s["sessions"].as_u64())
        .unwrap_or_else(|| panic!("{} does not serve {service}: {status}", node.name))
}

/// Waits until none of `nodes` has a live session.
async fn until_no_sessions(nodes: &[&TestNode]) {
    let ended = eventually(SETTLE, || nodes.iter().all(|n| live_sessions(n) == 0)).await;
    let left: Vec<usize> = nodes.iter().map(|n| live_sessions(n)).collect();
    assert!(ended, "sessions still live at the serving nodes: {left:?}");
}

/// Live (not zombie) processes tagged `marker`.
fn live_children(marker: &str) -> Vec<u32> {
    procs_with(marker)
        .into_iter()
        .filter(|(_, state)| *state != 'Z')
        .map(|(pid, _)| pid)
        .collect()
}

/// How many sessions bob opened to `service` by the serving node's audit records.
fn opened_by_bob(records: &[Value], service: &str) -> usize {
    records
        .iter()
        .filter(|r| r["event"] == "session_open" && r["service"] == service && r["peer"] == "bob")
        .count()
}

#[tokio::test(flavor = "multi_thread")]
async fn two_peers_services_are_listed_prefixed_from_the_cache_without_a_session_and_each_call_reaches_its_own_child()
 {
    let (alice, bob, carol) = three_nodes_with(ROOM_FOR_A_WHOLE_CLIENT);
    let stub_marks = [marker("hub-stub-alice"), marker("hub-stub-carol")];
    for (node, mark) in [&alice, &carol].into_iter().zip(&stub_marks) {
        node.serve_stub("stub", &["bob"], None, mark);
        serve_everything(
            node,
            "everything",
            &marker(&format!("hub-ev-{}", node.name)),
        );
    }
    let targets = [
        "alice/stub",
        "alice/everything",
        "carol/stub",
        "carol/everything",
    ];

    // Every tool each server lists directly, under peer__service__tool.
    let stub = direct_tools(&[STUB.to_owned()]).await;
    let everything = direct_tools(&["node".into(), everything_index(), "stdio".into()]).await;
    assert_eq!(stub, STUB_TOOLS.iter().map(|t| t.to_string()).collect());
    assert!(
        everything.contains("trigger-sampling-request"),
        "{everything:?}"
    );
    let mut expected = BTreeSet::new();
    for peer in ["alice", "carol"] {
        for (service, tools) in [("stub", &stub), ("everything", &everything)] {
            expected.extend(tools.iter().map(|t| format!("{peer}__{service}__{t}")));
        }
    }

    // The first run knows nothing yet: its first list asks every service.
    let mut hub = HubClient::hub(&bob, &targets).await;
    let listed = hub.tools().await;
    assert_eq!(names(&listed), expected);
    for (name, description) in &listed {
        let mut parts = name.splitn(3, "__");
        let (peer, service) = (parts.next().unwrap(), parts.next().unwrap());
        assert!(
            description.starts_with(&format!("[{peer}/{service}]")),
            "{name}: {description}"
        );
        assert!(
            !description.contains("unavailable"),
            "{name}: {description}"
        );
    }
    hub.close().await;
    until_no_sessions(&[&alice, &carol]).await;

    // The second run lists from the cache: the same tools, and no session at either node.
    let mut hub = HubClient::hub(&bob, &targets).await;
    assert_eq!(names(&hub.tools().await), expected);
    assert_eq!(
        (live_sessions(&alice), live_sessions(&carol)),
        (0, 0),
        "listing opened a session"
    );

    // Each call goes to its own peer's service, and only there.
    let echo = hub
        .call("alice__everything__echo", json!({ "message": "to alice" }))
        .await;
    assert_eq!(text(&echo), "Echo: to alice");
    assert_eq!(
        (
            sessions_of(&alice, "everything"),
            sessions_of(&carol, "everything")
        ),
        (1, 0)
    );
    let echo = hub
        .call("carol__everything__echo", json!({ "message": "to carol" }))
        .await;
    assert_eq!(text(&echo), "Echo: to carol");
    assert_eq!(sessions_of(&carol, "everything"), 1);
    for (node, mark) in [&alice, &carol].into_iter().zip(&stub_marks) {
        let whoami = hub
            .call(&format!("{}__stub__whoami", node.name), json!({}))
            .await;
        assert!(
            live_children(mark).contains(&pid_of(&whoami)),
            "{}'s whoami was not answered by its own child: {whoami}",
            node.name
        );
        assert_eq!(whoami["structured"]["MCPMESH_PEER_NAME"], "bob", "{whoami}");
        let greeting = format!("hello {}", node.name);
        let echo = hub
            .call(
                &format!("{}__stub__echo", node.name),
                json!({ "text": greeting }),
            )
            .await;
        assert_eq!(text(&echo), greeting);
    }
    hub.close().await;

    // Sessions opened, by the serving nodes' records: one per service for the first run's
    // list, one per service for the second run's calls, none for its list.
    for node in [&alice, &carol] {
        let records = node.stop_and_audit();
        for service in ["stub", "everything"] {
            assert_eq!(
                opened_by_bob(&records, service),
                2,
                "{}/{service}: {records:?}",
                node.name
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn ten_concurrent_first_calls_share_one_session_which_closes_when_idle_and_reopens_on_the_next_call()
 {
    let (alice, bob) = two_nodes();
    let mark = marker("hub-ten");
    alice.serve_stub("stub", &["bob"], None, &mark);
    let mut hub = HubClient::hub(&bob, &["alice/stub", "--idle", "2s"]).await;

    // The first list opens a session to learn the tools; unused for 2 s, it is closed.
    assert_eq!(hub.tools().await.len(), STUB_TOOLS.len());
    until_no_sessions(&[&alice]).await;

    // Ten first calls at once: one session, one child answered them all.
    let calls: Vec<Value> = (0..10)
        .map(|_| json!({ "name": "alice__stub__whoami" }))
        .collect();
    let answers = hub.step(json!({ "op": "calls", "calls": calls })).await;
    let pids: BTreeSet<u32> = answers["outcomes"]
        .as_array()
        .unwrap()
        .iter()
        .map(pid_of)
        .collect();
    assert_eq!(pids.len(), 1, "{answers}");
    assert_eq!(sessions_of(&alice, "stub"), 1);
    let first = *pids.first().unwrap();

    // Unused for 2 s, the session is closed and its child ends.
    until_no_sessions(&[&alice]).await;
    assert!(
        wait_exit(first, SETTLE).await,
        "the idle session's child {first} still runs"
    );

    // A later call opens a new one.
    let again = hub.call("alice__stub__whoami", json!({})).await;
    assert_ne!(pid_of(&again), first);
    assert!(live_children(&mark).contains(&pid_of(&again)));
    hub.close().await;

    let records = alice.stop_and_audit();
    assert_eq!(
        opened_by_bob(&records, "stub"),
        3,
        "one session to list, one for the ten calls, one after the idle close: {records:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_child_dying_mid_call_fails_that_call_naming_its_service_and_the_next_call_opens_a_new_session()
 {
    let (alice, bob) = two_nodes();
    let mark = marker("hub-crash");
    alice.serve_stub("stub", &["bob"], None, &mark);
    let mut hub = HubClient::hub(&bob, &["alice/stub"]).await;
    assert_eq!(hub.tools().await.len(), STUB_TOOLS.len());
    let before = pid_of(&hub.call("alice__stub__whoami", json!({})).await);

    // The stub's `crash` exits without answering.
    let crashed = hub.call("alice__stub__crash", json!({})).await;
    assert_eq!(crashed["error"]["code"], -32055, "{crashed}");
    let message = crashed["error"]["message"].as_str().unwrap();
    assert!(message.contains("alice/stub"), "{crashed}");
    assert!(wait_exit(before, SETTLE).await, "the crashed child runs on");

    let after = hub.call("alice__stub__whoami", json!({})).await;
    assert_ne!(pid_of(&after), before);
    assert!(live_children(&mark).contains(&pid_of(&after)));
    hub.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sampling_elicitation_and_progress_cross_the_hub_between_server_everything_and_the_sdk() {
    let (alice, bob) = two_nodes_with(ROOM_FOR_A_WHOLE_CLIENT);
    serve_everything(&alice, "everything", &marker("hub-asks"));
    let mut hub = HubClient::hub(&bob, &["alice/everything"]).await;
    let listed = names(&hub.tools().await);
    for tool in [
        "trigger-sampling-request",
        "trigger-elicitation-request",
        "trigger-long-running-operation",
    ] {
        assert!(
            listed.contains(&format!("alice__everything__{tool}")),
            "{listed:?}"
        );
    }

    // Sampling: the server asks the hub's client, and the client's answer is in the result.
    let prompt = "What is six times seven?";
    let sampled = hub
        .call(
            "alice__everything__trigger-sampling-request",
            json!({ "prompt": prompt, "maxTokens": 42 }),
        )
        .await;
    let sampled = text(&sampled);
    assert!(sampled.starts_with("LLM sampling result:"), "{sampled}");
    assert!(
        sampled.contains(&format!(
            "sampled<Resource trigger-sampling-request context: {prompt}>"
        )),
        "{sampled}"
    );
    assert!(sampled.contains("mcpmesh-hub-model"), "{sampled}");

    // Elicitation: the form the client filled in is in the result.
    let elicited = hub
        .call("alice__everything__trigger-elicitation-request", json!({}))
        .await;
    let elicited = text(&elicited);
    assert!(elicited.contains("- Name: Ada Hub"), "{elicited}");
    assert!(elicited.contains("- Favorite Integer: 42"), "{elicited}");

    let asked = hub.step(json!({ "op": "asked" })).await;
    assert_eq!(asked["sampling"].as_array().unwrap().len(), 1, "{asked}");
    assert!(
        asked["sampling"][0].as_str().unwrap().contains(prompt),
        "{asked}"
    );
    assert!(
        asked["elicitations"][0]
            .as_str()
            .unwrap()
            .contains("Please provide inputs"),
        "{asked}"
    );

    // Progress: the client's token is the hub's upstream, and each step reaches the client.
    let long = hub
        .step(
            json!({ "op": "call", "name": "alice__everything__trigger-long-running-operation",
                      "arguments": { "duration": 0.2, "steps": 2 }, "progress": true }),
        )
        .await;
    assert_eq!(
        text(&long),
        "Long running operation completed. Duration: 0.2 seconds, Steps: 2."
    );
    assert_eq!(long["progress"], json!([[1.0, 2.0], [2.0, 2.0]]), "{long}");
    hub.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn closing_the_hubs_input_ends_every_session_and_child_at_both_serving_nodes() {
    let (alice, bob, carol) = three_nodes_with(ROOM_FOR_A_WHOLE_CLIENT);
    let mut marks = Vec::new();
    for node in [&alice, &carol] {
        let (stub, everything) = (
            marker(&format!("hub-close-stub-{}", node.name)),
            marker(&format!("hub-close-ev-{}", node.name)),
        );
        node.serve_stub("stub", &["bob"], None, &stub);
        serve_everything(node, "everything", &everything);
        marks.extend([stub, everything]);
    }
    let mut hub = raw_hub(
        &bob,
        &[
            "alice/stub",
            "alice/everything",
            "carol/stub",
            "carol/everything",
        ],
    );
    let init = hub.initialize().await;
    assert_eq!(
        init["result"]["serverInfo"]["name"], "mcpmesh-hub",
        "{init}"
    );
    // Nothing cached yet: the first list opens a session to each service.
    let listed = raw_tool_names(&mut hub).await;
    for prefix in [
        "alice__stub__",
        "alice__everything__",
        "carol__stub__",
        "carol__everything__",
    ] {
        assert!(listed.iter().any(|n| n.starts_with(prefix)), "{listed:?}");
    }
    let echo = hub
        .call("carol__everything__echo", json!({ "message": "x" }))
        .await;
    assert_eq!(echo["result"]["content"][0]["text"], "Echo: x", "{echo}");
    for node in [&alice, &carol] {
        assert_eq!(live_sessions(node), 2, "{}", node.name);
    }
    for mark in &marks {
        assert!(!live_children(mark).is_empty(), "no child tagged {mark}");
    }

    // The client goes: the hub ends, and so does everything it opened.
    hub.close_stdin();
    hub.wait_eof().await;
    let status = tokio::time::timeout(SETTLE, hub.child.wait())
        .await
        .expect("the hub exits once its input ends")
        .unwrap();
    assert!(status.success(), "the hub exited {status}");
    until_no_sessions(&[&alice, &carol]).await;
    let gone = eventually(SETTLE, || marks.iter().all(|m| live_children(m).is_empty())).await;
    let left: Vec<Vec<u32>> = marks.iter().map(|m| live_children(m)).collect();
    assert!(gone, "children left at the serving nodes: {left:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_offline_peers_tools_stay_listed_as_unavailable_and_its_calls_fail_at_once_naming_it() {
    let (alice, bob, carol) = three_nodes_with("");
    for node in [&alice, &carol] {
        node.serve_stub(
            "stub",
            &["bob"],
            None,
            &marker(&format!("hub-off-{}", node.name)),
        );
    }
    let mut hub = HubClient::hub(&bob, &["alice/stub", "carol/stub"]).await;
    let listed = hub.tools().await;
    assert_eq!(listed.len(), 2 * STUB_TOOLS.len());
    assert!(
        listed.iter().all(|(_, d)| !d.contains("unavailable")),
        "{listed:?}"
    );

    // Carol's node dies. Once bob's node finds her unreachable, the hub says her tools changed.
    carol.kill_daemon().await;
    let unavailable = |tools: &[(String, String)]| {
        tools
            .iter()
            .filter(|(_, d)| d.ends_with("(unavailable: its peer is not reachable now)"))
            .map(|(n, _)| n.clone())
            .collect::<BTreeSet<_>>()
    };
    let carols: BTreeSet<String> = STUB_TOOLS
        .iter()
        .map(|t| format!("carol__stub__{t}"))
        .collect();
    let mut listed = Vec::new();
    for _ in 0..5 {
        hub.step(json!({ "op": "wait_list_changed" })).await;
        listed = hub.tools().await;
        if !unavailable(&listed).is_empty() {
            break;
        }
    }
    assert_eq!(
        listed.len(),
        2 * STUB_TOOLS.len(),
        "still listed: {listed:?}"
    );
    assert_eq!(unavailable(&listed), carols, "{listed:?}");

    let call = hub.call("carol__stub__echo", json!({ "text": "x" })).await;
    println!("a call to the offline peer failed after {} ms", call["ms"]);
    assert_eq!(call["error"]["code"], -32055, "{call}");
    assert!(
        call["error"]["message"].as_str().unwrap().contains("carol"),
        "{call}"
    );
    // At once: from what the hub knows, not after a dial (loosely bounded; see the figure).
    assert!(call["ms"].as_u64().unwrap() < 5_000, "{call}");

    // Alice is still there.
    let echo = hub
        .call("alice__stub__echo", json!({ "text": "still" }))
        .await;
    assert_eq!(text(&echo), "still");
    hub.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn shorter_names_are_given_where_unique_and_shared_ones_keep_their_peer_and_service() {
    let (alice, bob, carol) = three_nodes_with("");
    alice.serve_stub("stub", &["bob"], None, &marker("hub-names-alice"));
    carol.serve_stub("stub", &["bob"], None, &marker("hub-names-carol"));
    serve_everything(&alice, "everything", &marker("hub-names-ev"));
    let targets = ["alice/stub", "carol/stub", "alice/everything"];

    // A first run, prefixed, fills the cache.
    let mut hub = raw_hub(&bob, &targets);
    hub.initialize().await;
    let prefixed = raw_tool_names(&mut hub).await;
    hub.close_stdin();
    hub.wait_eof().await;
    let everything: BTreeSet<String> = prefixed
        .iter()
        .filter_map(|n| n.strip_prefix("alice__everything__"))
        .map(str::to_owned)
        .collect();
    assert!(
        everything.contains("echo") && everything.contains("get-sum"),
        "{everything:?}"
    );
    // The stub's tools are on two peers under one service name: they keep the long form.
    let stubs = STUB_TOOLS
        .iter()
        .flat_map(|t| [format!("alice__stub__{t}"), format!("carol__stub__{t}")]);

    let mut want_service: BTreeSet<String> = stubs.clone().collect();
    want_service.extend(everything.iter().map(|t| format!("everything__{t}")));
    // Bare: server-everything's `echo` is shared with the stubs, so it keeps its service.
    let mut want_bare: BTreeSet<String> = stubs.collect();
    want_bare.extend(everything.iter().map(|t| match t.as_str() {
        "echo" => "everything__echo".to_owned(),
        other => other.to_owned(),
    }));

    for (naming, want) in [("service", want_service), ("bare", want_bare)] {
        let mut args = targets.to_vec();
        args.extend(["--names", naming]);
        let mut hub = raw_hub(&bob, &args);
        hub.initialize().await;
        assert_eq!(raw_tool_names(&mut hub).await, want, "--names {naming}");
        // And each short name still reaches its tool.
        let (sum, echo) = match naming {
            "service" => ("everything__get-sum", "everything__echo"),
            _ => ("get-sum", "everything__echo"),
        };
        let got = hub.call(sum, json!({ "a": 2, "b": 3 })).await;
        let got = got["result"]["content"][0]["text"]
            .as_str()
            .unwrap_or_default();
        assert!(got.contains('5'), "{naming}: {got}");
        let got = hub.call(echo, json!({ "message": naming })).await;
        assert_eq!(
            got["result"]["content"][0]["text"],
            format!("Echo: {naming}")
        );
        let got = hub
            .call("carol__stub__echo", json!({ "text": naming }))
            .await;
        assert_eq!(got["result"]["content"][0]["text"], naming, "{got}");
        hub.close_stdin();
        hub.wait_eof().await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn tools_sharing_even_their_full_name_are_an_error_naming_both_and_a_warm_hub_refuses_to_start()
 {
    let (alice, bob) = two_nodes();
    // `a.b` and `a_b` are both `a_b` in a tool name.
    alice.serve_stub("a.b", &["bob"], None, &marker("hub-clash-dot"));
    alice.serve_stub("a_b", &["bob"], None, &marker("hub-clash-under"));
    let args = ["alice/a.b", "alice/a_b", "--names", "bare"];
    // The message names the first name they share (the tools are listed in order).
    let both = ["alice/a.b/ask, alice/a_b/ask", "\"alice__a_b__ask\""];

    // Nothing cached: the clash shows once both services listed, as the lists' error.
    let mut hub = raw_hub(&bob, &args);
    hub.initialize().await;
    let listed = hub.request("tools/list", json!({})).await;
    let message = listed["error"]["message"].as_str().unwrap_or_default();
    for part in both {
        assert!(message.contains(part), "{listed}");
    }
    hub.close_stdin();
    hub.wait_eof().await;

    // Cached: the hub refuses at start, before its client sees anything.
    let out = bob
        .command(&["hub", args[0], args[1], args[2], args[3]])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the hub started: {stderr}");
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    for part in both {
        assert!(stderr.contains(part), "{stderr}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_call_made_before_any_list_waits_for_the_first_listing_instead_of_failing_as_unknown() {
    let (alice, bob) = two_nodes();
    alice.serve_stub("stub", &["bob"], None, &marker("hub-early"));
    // Nothing cached, and the client calls a tool it knows from elsewhere without listing.
    let mut hub = raw_hub(&bob, &["alice/stub"]);
    hub.initialize().await;
    let echo = hub
        .call("alice__stub__echo", json!({ "text": "early" }))
        .await;
    assert_eq!(echo["result"]["content"][0]["text"], "early", "{echo}");
    // A tool no service has is still unknown.
    let unknown = hub.call("alice__stub__nope", json!({})).await;
    assert_eq!(unknown["error"]["code"], -32602, "{unknown}");
    hub.close_stdin();
    hub.wait_eof().await;
    let records = alice.stop_and_audit();
    assert_eq!(opened_by_bob(&records, "stub"), 1, "{records:?}");
}
