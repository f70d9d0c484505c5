//! Transparency with MCP software nobody on this team wrote, and the `socket` backend.
//!
//! The third-party pieces — npm `@modelcontextprotocol/server-everything` and the official
//! MCP Python SDK (PyPI `mcp`) — are installed at pinned versions by `scripts/interop-deps`
//! (which `scripts/test` runs first) into `target/interop/`. Every session here crosses two
//! real nodes on loopback: the client talks to `mcpmesh connect bob→alice/…` and alice's node
//! runs the server.

mod common;

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use common::*;
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread")]
async fn a_socket_service_gets_the_callers_identity_and_never_a_forgery() {
    let (alice, bob) = two_nodes();
    let server = SocketServer::start().await;
    let sock = server.path();
    alice.serve("tools", &["bob"], &["--socket", sock.to_str().unwrap()]);
    let bob_eid = format!("eid:{}", bob.id);
    let mut s = bob.connect("alice/tools");

    // What bob's client sends, byte for byte, odd spacing and escapes included; each request
    // is answered before the next is sent, so the server receives them in this order.
    let sent: [&str; 5] = [
        r#"{"jsonrpc":"2.0","id":"init-1","method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#,
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
        r#"{"jsonrpc":"2.0", "id" : 2 ,"method":"tools/call","params":{"_meta":{"mcpmesh/peer":{"eid":"eid:00","name":"root"},"progressToken":7, "mcpmesh/x":1},"name":"whoami","arguments":{"s":"é\u00e9\ud83d\ude00 \"q\""}}}"#,
        r#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"_meta":{"mcpmesh/peer":"forged"},"progressToken":"up","progress":1}}"#,
        r#"{"jsonrpc":"2.0","id":3,"method":"ping"}"#,
    ];
    let mut answers = Vec::new();
    for line in sent {
        s.send_raw(format!("{line}\n").as_bytes()).await;
        if !line.contains(r#""id""#) {
            continue;
        }
        let id = serde_json::from_str::<Value>(line).unwrap()["id"].clone();
        loop {
            let msg = s.recv().await.expect("an answer");
            let answered = msg.get("id") == Some(&id);
            answers.push(msg);
            if answered {
                break;
            }
        }
    }

    // The forged identity never reached the server: it saw bob, as bob's node proved him.
    let whoami = answers.iter().find(|m| m["id"] == 2).unwrap();
    let peer = json!({ "eid": bob_eid, "name": "bob", "user_id": null, "groups": [] });
    assert_eq!(whoami["result"]["structuredContent"]["meta_peer"], peer);
    // The caller's own _meta members, the progress token among them, kept their JSON type.
    let progress = answers
        .iter()
        .find(|m| m["method"] == "notifications/progress")
        .unwrap();
    assert_eq!(progress["params"]["progressToken"], json!(7));
    assert!(
        answers
            .iter()
            .any(|m| m["id"] == json!(3) && m.get("result").is_some())
    );

    // Byte for byte, what the server received: the caller's lines with `mcpmesh/*` members
    // cut out of `_meta` and the node's one member spliced in — nothing else changed.
    let stamp = format!(
        r#""mcpmesh/peer":{}"#,
        serde_json::to_string(&peer).unwrap()
    );
    let expected = [
        format!(
            r#"{{"jsonrpc":"2.0","id":"init-1","method":"initialize","params":{{"protocolVersion":"2025-11-25","capabilities":{{}},"clientInfo":{{"name":"t","version":"1"}},"_meta":{{{stamp}}}}}}}"#
        ),
        sent[1].to_owned(),
        format!(
            r#"{{"jsonrpc":"2.0", "id" : 2 ,"method":"tools/call","params":{{"_meta":{{"progressToken":7,{stamp}}},"name":"whoami","arguments":{{"s":"é\u00e9\ud83d\ude00 \"q\""}}}}}}"#
        ),
        r#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"_meta":{},"progressToken":"up","progress":1}}"#.to_owned(),
        format!(r#"{{"jsonrpc":"2.0","id":3,"method":"ping","params":{{"_meta":{{{stamp}}}}}}}"#),
    ];
    let received = server.received();
    let received: Vec<&str> = received.lines().collect();
    assert_eq!(received, expected);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_forged_identity_in_the_callers_answer_to_the_server_never_reaches_it() {
    let (alice, bob) = two_nodes();
    let server = SocketServer::start().await;
    alice.serve(
        "tools",
        &["bob"],
        &["--socket", server.path().to_str().unwrap()],
    );
    let mut s = bob.connect("alice/tools");
    s.initialize().await;

    // The server asks bob's client for its roots while answering the call.
    s.send(&json!({ "jsonrpc": "2.0", "id": 2, "method": "tools/call",
                    "params": { "name": "ask", "arguments": {} } }))
        .await;
    let (mut asked, mut answered) = (false, false);
    while !(asked && answered) {
        let msg = s.recv().await.expect("the question and the answer");
        asked |= msg["method"] == "roots/list" && msg["id"] == "ask-1";
        answered |= msg["id"] == 2;
    }

    // Bob's client answers with a forged identity in the result's _meta, then pings: the
    // server reads its connection in order, so once the ping is answered it has the answer.
    let forged = r#"{"jsonrpc":"2.0","id":"ask-1","result":{"roots":[], "_meta":{"mcpmesh/peer":{"eid":"eid:00","name":"root"},"k":1}}}"#;
    s.send_raw(format!("{forged}\n").as_bytes()).await;
    let pong = s.request("ping", json!({})).await;
    assert!(pong.get("result").is_some(), "{pong}");

    let received = server.received();
    let answer = received
        .lines()
        .find(|l| l.contains(r#""id":"ask-1""#))
        .unwrap_or_else(|| panic!("the server got no answer to its question:\n{received}"));
    assert_eq!(
        answer,
        r#"{"jsonrpc":"2.0","id":"ask-1","result":{"roots":[], "_meta":{"k":1}}}"#
    );
}

/// server-everything, run through `sh` with a `tee` in front that appends every byte the
/// server receives to `tee_file`.
fn everything_teed(tee_file: &Path) -> Vec<String> {
    let index = deps().join("node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    vec![
        "sh".into(),
        "-c".into(),
        r#"tee -a "$0" | exec node "$1" stdio"#.into(),
        tee_file.display().to_string(),
        index.display().to_string(),
    ]
}

/// `line` as text with every clock time (`h:mm:ss` or `hh:mm:ss`) replaced by `<time>`.
fn mask_clock(line: &[u8]) -> String {
    let text = String::from_utf8(line.to_vec()).expect("UTF-8");
    let b = text.as_bytes();
    let digits = |at: usize, n: usize| {
        b.get(at..at + n)
            .is_some_and(|s| s.iter().all(u8::is_ascii_digit))
    };
    let (mut out, mut i, mut copied) = (String::new(), 0, 0);
    while i < b.len() {
        let hour = if digits(i, 2) {
            2
        } else if digits(i, 1) {
            1
        } else {
            0
        };
        let clock = hour > 0
            && (i == 0 || !b[i - 1].is_ascii_digit())
            && b.get(i + hour) == Some(&b':')
            && digits(i + hour + 1, 2)
            && b.get(i + hour + 3) == Some(&b':')
            && digits(i + hour + 4, 2);
        if clock {
            out.push_str(&text[copied..i]);
            out.push_str("<time>");
            i += hour + 6;
            copied = i;
        } else {
            i += 1;
        }
    }
    out.push_str(&text[copied..]);
    out
}

/// One step of a scripted raw session.
enum Step {
    /// Send this line; when it carries an id, read until that id is answered.
    Send(&'static str),
    /// Read until a frame with this method arrives (a server-initiated request or
    /// notification with a fixed place in the session).
    Await(&'static str),
}

/// The client's fixed answer to a server-initiated request (by method), echoing its raw id.
fn canned_answer(method: &str, raw_id: &str) -> String {
    let result = match method {
        "roots/list" => r#"{"roots":[{"uri":"file:///tmp/ünïcode root","name":"rø\u00f6t"}]}"#,
        "sampling/createMessage" => {
            r#"{"role":"assistant","content":{"type":"text","text":"sampled: 𝄞 ok"},"model":"canned-model","stopReason":"endTurn"}"#
        }
        "elicitation/create" => r#"{"action":"accept","content":{"name":"Zoë \"Q\" Example"}}"#,
        "ping" => "{}",
        other => panic!("the script has no answer for a server request {other}"),
    };
    format!(r#"{{"jsonrpc":"2.0","id":{raw_id},"result":{result}}}"#)
}

/// Runs the script on `s`, answering server requests with [`canned_answer`]; returns every
/// line the server sent, as raw bytes.
async fn run_script(s: &mut McpSession, script: &[Step]) -> Vec<Vec<u8>> {
    #[derive(serde::Deserialize)]
    struct Frame<'a> {
        #[serde(borrow)]
        id: Option<&'a serde_json::value::RawValue>,
        method: Option<String>,
    }
    let mut received = Vec::new();
    for step in script {
        let (wait_id, wait_method) = match step {
            Step::Send(line) => {
                s.send_raw(format!("{line}\n").as_bytes()).await;
                let v: Value = serde_json::from_str(line).unwrap();
                match (v.get("id"), v.get("method")) {
                    (Some(id), Some(_)) => (Some(id.clone()), None),
                    _ => continue,
                }
            }
            Step::Await(method) => (None, Some(*method)),
        };
        loop {
            let line = s.recv_raw().await.expect("the server answers before EOF");
            let frame: Frame = serde_json::from_slice(&line).expect("a JSON-RPC frame");
            let method = frame.method.clone();
            if let (Some(id), Some(m)) = (frame.id, &frame.method) {
                let answer = canned_answer(m, id.get());
                s.send_raw(format!("{answer}\n").as_bytes()).await;
            }
            let is_answer = frame.method.is_none()
                && wait_id.as_ref().is_some_and(|want| {
                    frame
                        .id
                        .map(|id| serde_json::from_str::<Value>(id.get()).unwrap())
                        == Some(want.clone())
                });
            received.push(line);
            if is_answer || (wait_method.is_some() && method.as_deref() == wait_method) {
                break;
            }
        }
    }
    received
}

/// A session exercising every kind of traffic with fixed ids of both JSON types, progress
/// tokens of both types, awkward UTF-8 and escapes, and server-to-client requests.
const SCRIPT: &[Step] = &[
    Step::Send(
        r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{"roots":{"listChanged":true},"sampling":{},"elicitation":{"form":{}}},"clientInfo":{"name":"mcpmesh-transcript","version":"1.0.0"}}}"#,
    ),
    Step::Send(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#),
    // 350 ms later the server asks for roots, then logs that it got them.
    Step::Await("roots/list"),
    Step::Await("notifications/message"),
    Step::Send(r#"{"jsonrpc":"2.0","id":"list-1","method":"tools/list"}"#),
    Step::Send(
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo","arguments":{"message":"é中😀\u0301 \u2028\u2029 \"quoted\" back\\slash \u0001\t end"}}}"#,
    ),
    Step::Send(
        r#"{ "jsonrpc" : "2.0" , "id" : "3" , "method" : "tools/call" , "params" : { "name" : "get-sum" , "arguments" : { "a" : 2 , "b" : 3.5 } } }"#,
    ),
    Step::Send(
        r#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"trigger-long-running-operation","arguments":{"duration":0.2,"steps":2},"_meta":{"progressToken":"tok-4"}}}"#,
    ),
    Step::Send(
        r#"{"jsonrpc":"2.0","id":"5","method":"tools/call","params":{"name":"trigger-long-running-operation","arguments":{"duration":0.2,"steps":2},"_meta":{"progressToken":5}}}"#,
    ),
    Step::Send(
        r#"{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":"trigger-sampling-request","arguments":{"prompt":"say ✓","maxTokens":20}}}"#,
    ),
    Step::Send(
        r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"trigger-elicitation-request","arguments":{}}}"#,
    ),
    Step::Send(
        r#"{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"get-roots-list","arguments":{}}}"#,
    ),
    Step::Send(r#"{"jsonrpc":"2.0","id":9,"method":"resources/list"}"#),
    Step::Send(r#"{"jsonrpc":"2.0","id":10,"method":"resources/templates/list"}"#),
    Step::Send(
        r#"{"jsonrpc":"2.0","id":11,"method":"resources/read","params":{"uri":"demo://resource/dynamic/text/1"}}"#,
    ),
    Step::Send(
        r#"{"jsonrpc":"2.0","id":12,"method":"resources/subscribe","params":{"uri":"demo://resource/dynamic/text/1"}}"#,
    ),
    Step::Send(
        r#"{"jsonrpc":"2.0","id":13,"method":"resources/unsubscribe","params":{"uri":"demo://resource/dynamic/text/1"}}"#,
    ),
    Step::Send(r#"{"jsonrpc":"2.0","id":14,"method":"prompts/list"}"#),
    Step::Send(
        r#"{"jsonrpc":"2.0","id":15,"method":"prompts/get","params":{"name":"args-prompt","arguments":{"city":"Zürich","state":"ZH"}}}"#,
    ),
    Step::Send(
        r#"{"jsonrpc":"2.0","id":16,"method":"completion/complete","params":{"ref":{"type":"ref/prompt","name":"completable-prompt"},"argument":{"name":"department","value":"E"}}}"#,
    ),
    Step::Send(
        r#"{"jsonrpc":"2.0","id":17,"method":"logging/setLevel","params":{"level":"debug"}}"#,
    ),
    Step::Send(r#"{"jsonrpc":"2.0","id":"ping-18","method":"ping"}"#),
    Step::Send(
        r#"{"jsonrpc":"2.0","id":19,"method":"tools/call","params":{"name":"no-such-tool","arguments":{}}}"#,
    ),
    Step::Send(r#"{"jsonrpc":"2.0","id":20,"method":"no/such/method"}"#),
    Step::Send(r#"{"jsonrpc":"2.0","method":"notifications/roots/list_changed"}"#),
    Step::Await("roots/list"),
    Step::Await("notifications/message"),
    Step::Send(
        r#"{"jsonrpc":"2.0","id":21,"method":"tools/call","params":{"name":"get-tiny-image","arguments":{}}}"#,
    ),
];

#[tokio::test(flavor = "multi_thread")]
async fn server_everything_sees_and_says_the_same_bytes_directly_and_through_two_nodes() {
    let dir = tempfile::tempdir().unwrap();
    let (direct_in, mesh_in) = (dir.path().join("direct.in"), dir.path().join("mesh.in"));

    // Directly: the client spawns the server itself.
    let cmd = everything_teed(&direct_in);
    let mut direct = tokio::process::Command::new(&cmd[0]);
    direct
        .args(&cmd[1..])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    let mut direct = McpSession::spawn(direct);
    let direct_out = run_script(&mut direct, SCRIPT).await;
    direct.close_stdin();
    direct.wait_eof().await;

    // Through the mesh: alice serves the same command to bob, bob's client uses connect.
    let (alice, bob) = two_nodes();
    let cmd = everything_teed(&mesh_in);
    let mut backend = vec!["--"];
    backend.extend(cmd.iter().map(String::as_str));
    alice.serve("everything", &["bob"], &backend);
    let mut mesh = bob.connect("alice/everything");
    let mesh_out = run_script(&mut mesh, SCRIPT).await;
    mesh.close_stdin();
    mesh.wait_eof().await;

    // Server → client: the same lines, byte for byte.
    assert_eq!(direct_out.len(), mesh_out.len(), "as many lines either way");
    // (The one value the server itself varies: the clock time in dynamic resources.)
    for (i, (d, m)) in direct_out.iter().zip(&mesh_out).enumerate() {
        assert_eq!(
            mask_clock(d),
            mask_clock(m),
            "server→client line {i} differs"
        );
    }
    // Client → server: what the server read, byte for byte (the tee saw it).
    let (d, m) = (
        std::fs::read(&direct_in).unwrap(),
        std::fs::read(&mesh_in).unwrap(),
    );
    assert!(d.len() > 2000, "the tee recorded the session");
    assert!(
        d == m,
        "client→server bytes differ:\n{}\n---\n{}",
        String::from_utf8_lossy(&d),
        String::from_utf8_lossy(&m)
    );
    // The ids and tokens came back with their JSON types.
    let find = |id: Value| {
        mesh_out
            .iter()
            .map(|l| serde_json::from_slice::<Value>(l).unwrap())
            .find(|v| v.get("id") == Some(&id) && v.get("method").is_none())
            .unwrap_or_else(|| panic!("no answer to {id}"))
    };
    assert!(
        find(json!("3"))["result"]["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("5.5")
    );
    assert!(find(json!(2))["result"].is_object());
    // The server's own requests reached the client and its answers reached the server.
    let text = |id: Value| find(id)["result"].to_string();
    assert!(
        text(json!(6)).contains("sampled: 𝄞 ok"),
        "{}",
        text(json!(6))
    );
    assert!(text(json!(7)).contains("Zoë"), "{}", text(json!(7)));
    assert!(
        text(json!(8)).contains("ünïcode root"),
        "{}",
        text(json!(8))
    );
    let progress_tokens: Vec<Value> = mesh_out
        .iter()
        .map(|l| serde_json::from_slice::<Value>(l).unwrap())
        .filter(|v| v["method"] == "notifications/progress")
        .map(|v| v["params"]["progressToken"].clone())
        .collect();
    assert!(
        progress_tokens.contains(&json!("tok-4")) && progress_tokens.contains(&json!(5)),
        "{progress_tokens:?}"
    );
    assert!(
        !progress_tokens.contains(&json!("5")),
        "{progress_tokens:?}"
    );
}

/// A relay transcript's lines in one direction (`>` client→server, `<` server→client).
fn direction(transcript: &str, arrow: char) -> Vec<String> {
    transcript
        .lines()
        .filter_map(|l| l.strip_prefix(arrow)?.strip_prefix(' '))
        .map(str::to_owned)
        .collect()
}

/// Masks the one value the server randomizes per process: the sealed `requestState`.
fn mask_request_state(line: &str) -> String {
    match line.find(r#""requestState":""#) {
        Some(at) => {
            let start = at + r#""requestState":""#.len();
            let end = start + line[start..].find('"').unwrap_or(0);
            format!("{}<sealed>{}", &line[..start], &line[end..])
        }
        None => line.to_owned(),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_2026_07_28_stateless_session_opens_is_gated_audited_and_passes_byte_identical() {
    let dir = tempfile::tempdir().unwrap();
    let at = |f: &str| dir.path().join(f).display().to_string();
    let (client, server) = (
        interop_script("modern_client.py"),
        interop_script("modern_server.py"),
    );
    let py = python().display().to_string();

    // Directly: the official SDK's client spawns the SDK's server (2026-07-28, no initialize).
    run_driver(&[
        client.clone(),
        "--transcript".into(),
        at("direct"),
        "--".into(),
        py.clone(),
        server.clone(),
    ])
    .await;

    // Through two nodes; a relay in front of the served server records what reached it.
    let (alice, bob) = two_nodes();
    let carol = TestNode::start("carol");
    alice.trust(&carol);
    carol.trust(&alice);
    let served = [
        py.as_str(),
        client.as_str(),
        "--relay",
        &at("served"),
        "--",
        py.as_str(),
        server.as_str(),
    ];
    let mut backend = vec!["--"];
    backend.extend(served);
    alice.serve("modern", &["bob"], &backend);
    let home = bob.home().display().to_string();
    let connect = [
        MCPMESH.to_owned(),
        "--home".into(),
        home.clone(),
        "connect".into(),
        "alice/modern".into(),
    ];
    let mut args = vec![
        client.clone(),
        "--transcript".into(),
        at("mesh"),
        "--".into(),
    ];
    args.extend(connect.iter().cloned());
    let report = run_driver(&args).await;
    assert_stateless_report(&report);

    let read = |f: &str| std::fs::read_to_string(dir.path().join(f)).unwrap();
    let (direct, mesh, served) = (read("direct"), read("mesh"), read("served"));
    // Both ends of the mesh saw exactly the same bytes, both ways, nothing masked.
    for arrow in ['>', '<'] {
        assert_eq!(
            direction(&mesh, arrow),
            direction(&served, arrow),
            "direction {arrow}"
        );
    }
    // And the same as without the mesh: the first frame is server/discover, the retry
    // carries the requestState it was given; only the sealed state and the caller's identity
    // (absent directly, bob through the mesh) differ.
    let sent = direction(&mesh, '>');
    assert!(
        sent[0].contains(r#""method":"server/discover""#),
        "{}",
        sent[0]
    );
    assert!(!mesh.contains(r#""method":"initialize""#));
    let whoami = |t: &str| {
        direction(t, '<')
            .into_iter()
            .find(|l| l.contains("MCPMESH_PEER_NAME"))
            .unwrap()
    };
    assert!(
        whoami(&mesh).contains(r#"\"MCPMESH_PEER_NAME\": \"bob\""#),
        "{}",
        whoami(&mesh)
    );
    for arrow in ['>', '<'] {
        let masked = |t: &str| -> Vec<String> {
            direction(t, arrow)
                .iter()
                .filter(|l| !l.contains("MCPMESH_PEER_NAME"))
                .map(|l| mask_request_state(l))
                .collect()
        };
        assert_eq!(
            masked(&direct),
            masked(&mesh),
            "direction {arrow}, direct vs mesh"
        );
    }

    // The same server through the mesh in the handshake era, for good measure.
    let mut args = vec![client.clone(), "--era".into(), "legacy".into(), "--".into()];
    args.extend(connect.iter().cloned());
    run_driver(&args).await;

    // Gated: carol is trusted as a peer but not allowed this service. Her first frame is a
    // stateless request, and it is answered -32054 with its own id.
    let mut s = carol.connect("alice/modern");
    s.send_raw(sent[0].replace(r#""id":1"#, r#""id":"d-1""#).as_bytes())
        .await;
    s.send_raw(b"\n").await;
    let refusal = s.recv().await.expect("an answer");
    assert_eq!(refusal["id"], "d-1");
    assert_eq!(refusal["error"]["code"], -32054);

    // Audited: the stateless requests are on record like any others.
    let records = alice.stop_and_audit();
    let by = |method: &str| {
        records
            .iter()
            .filter(|r| r["method"] == method && r["peer"] == "bob")
            .count()
    };
    assert!(by("server/discover") >= 1, "{records:?}");
    let confirms = records
        .iter()
        .filter(|r| r["method"] == "tools/call" && r["name"] == "confirm" && r["outcome"] == "ok")
        .count();
    assert!(confirms >= 2, "the call and its retry are both recorded");
    assert!(
        records
            .iter()
            .any(|r| r["event"] == "session_refused" && r["peer"] == "carol")
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_official_python_sdk_uses_every_feature_of_server_everything_through_two_nodes() {
    let index = deps().join("node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    let index = index.display().to_string();
    let client = interop_script("everything_client.py");
    // The default limits: a whole full-featured client fits in them.
    let (alice, bob) = two_nodes();
    alice.serve("everything", &["bob"], &["--", "node", &index, "stdio"]);
    let home = bob.home().display().to_string();

    // The same checks directly and through the mesh, at the same time.
    let direct_args = [
        client.clone(),
        "--".into(),
        "node".into(),
        index.clone(),
        "stdio".into(),
    ];
    let mesh_args = [
        client.clone(),
        "--".into(),
        MCPMESH.into(),
        "--home".into(),
        home,
        "connect".into(),
        "alice/everything".into(),
    ];
    let (direct, mesh) = (run_driver(&direct_args), run_driver(&mesh_args));
    let (direct, mesh) = tokio::join!(direct, mesh);
    // Every check passed both ways (run_driver asserts the exit status), and the reports
    // (no ids, times or other varying values in them) are the same.
    assert!(mesh.contains(r#"{"passed":32,"failed":0}"#), "{mesh}");
    assert_eq!(direct, mesh);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_sdk_server_on_a_socket_serves_both_eras_and_its_tools_see_the_caller() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("sdk.sock");
    let mut cmd = tokio::process::Command::new(python());
    cmd.arg(interop_script("socket_server.py")).arg(&sock);
    let (_server, _) = Started::until(&mut cmd, "listening on").await;

    let (alice, bob) = two_nodes();
    alice.serve("sdk", &["bob"], &["--socket", sock.to_str().unwrap()]);
    let connect = [
        MCPMESH.to_owned(),
        "--home".into(),
        bob.home().display().to_string(),
        "connect".into(),
        "alice/sdk".into(),
    ];
    let peer =
        json!({ "eid": format!("eid:{}", bob.id), "groups": [], "name": "bob", "user_id": null });
    for era in ["modern", "legacy"] {
        let mut args = modern_client(era, false);
        args.push("--".into());
        args.extend(connect.iter().cloned());
        let report = run_driver(&args).await;
        // The tool read the identity the node wrote into the request's _meta.
        let whoami = whoami_in(&report);
        assert_eq!(whoami["meta_peer"], peer, "{era}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_socket_server_that_asks_for_it_verifies_the_signed_caller_and_a_forged_one_never_arrives()
 {
    let (alice, bob) = two_nodes();
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("sdk.sock");
    let jwks = dir.path().join("jwks.json");
    std::fs::write(&jwks, alice.json(&["id", "--jwks"]).to_string()).unwrap();
    let mut cmd = tokio::process::Command::new(python());
    cmd.arg(interop_script("socket_server.py"))
        .arg(&sock)
        .arg("--jwks")
        .arg(&jwks);
    let (_server, _) = Started::until(&mut cmd, "listening on").await;
    let sock = sock.to_str().unwrap();
    alice.serve(
        "signed",
        &["bob"],
        &["--socket", sock, "--caller-assertion"],
    );
    alice.serve("plain", &["bob"], &["--socket", sock]);

    // Both eras: the tool verified, with PyJWT against alice's JWKS, the assertion the node
    // put in `_meta` — for the socket as the audience.
    for era in ["modern", "legacy"] {
        let mut args = modern_client(era, false);
        args.push("--".into());
        args.extend(connect_args(&bob, "alice/signed"));
        let report = run_driver(&args).await;
        let whoami = whoami_in(&report);
        let caller = &whoami["caller"];
        assert_eq!(caller["sub"], format!("eid:{}", bob.id), "{era}: {whoami}");
        assert_eq!(
            caller["iss"],
            format!("eid:{}", alice.id),
            "{era}: {whoami}"
        );
        assert_eq!(caller["aud"], format!("unix:{sock}"), "{era}: {whoami}");
        assert_eq!(caller["service"], "signed", "{era}: {whoami}");
        assert_eq!(caller["peer"], "bob", "{era}: {whoami}");
    }

    // A caller's own `mcpmesh/caller` never reaches the server: replaced where the service
    // asked for an assertion, removed where it did not. (Input is closed only after the answer:
    // the SDK's server answers what is in flight "Connection closed" when its input ends, on a
    // socket through the mesh as on its own stdio.)
    for (service, expect_claims) in [("signed", true), ("plain", false)] {
        let mut s = bob.connect(&format!("alice/{service}"));
        s.initialize().await;
        s.send(&json!({ "jsonrpc": "2.0", "id": 9, "method": "tools/call",
            "params": { "name": "whoami", "arguments": {},
                        "_meta": { "mcpmesh/caller": "eyJhbGciOiJub25lIn0.e30." } } }))
            .await;
        let answer = s.recv().await.expect("the answer");
        s.close_stdin();
        let text = answer["result"]["content"][0]["text"]
            .as_str()
            .unwrap_or_else(|| panic!("{service}: {answer}"));
        let caller = serde_json::from_str::<Value>(text).unwrap()["caller"].clone();
        if expect_claims {
            assert_eq!(
                caller["sub"],
                format!("eid:{}", bob.id),
                "{service}: {caller}"
            );
        } else {
            assert_eq!(
                caller["refused"], "InvalidTokenError: no assertion",
                "{caller}"
            );
        }
        s.wait_eof().await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_typescript_sdk_answer_cut_at_the_cap_still_answers_its_request() {
    // The TypeScript SDK writes `{"result":…,"jsonrpc":"2.0","id":…}`: cut at 16 MiB, the part
    // that went on never named the request. With one request waiting, the node knows which.
    let (alice, bob) = two_nodes();
    let script = interop_script("ts_blob_server.cjs");
    let sdk = deps().display().to_string();
    alice.serve("tsblob", &["bob"], &["--", "node", &script, &sdk]);
    let mut s = bob.connect("alice/tsblob");
    let init = s.initialize().await;
    assert_eq!(init["result"]["serverInfo"]["name"], "ts-blob", "{init}");
    s.send(
        &json!({ "jsonrpc": "2.0", "id": "big", "method": "tools/call",
                    "params": { "name": "blob", "arguments": { "bytes": 17 << 20 } } }),
    )
    .await;
    let cut = s.recv_raw().await.expect("the cut answer");
    assert!(cut.starts_with(br#"{"result":"#), "the SDK's order");
    assert!(cut.len() <= mcpmesh_net::transport::MAX_FRAME);
    let refusal = s.recv().await.expect("the refusal");
    assert_eq!(refusal["error"]["code"], -32051, "{refusal}");
    assert_eq!(refusal["id"], "big", "{refusal}");
    // The session goes on, and the serving node's record ends the request there.
    let small = s.call("blob", json!({ "bytes": 3 })).await;
    assert_eq!(small["result"]["content"][0]["text"], "xxx", "{small}");
    s.close_stdin();
    s.wait_eof().await;
    let records = alice.stop_and_audit();
    let blobs: Vec<&Value> = records.iter().filter(|r| r["name"] == "blob").collect();
    assert_eq!(blobs.len(), 2, "{records:?}");
    assert_eq!(blobs[0]["outcome"], "error", "{}", blobs[0]);
    assert_eq!(blobs[0]["code"], -32051, "{}", blobs[0]);
    assert_eq!(blobs[1]["outcome"], "ok", "{}", blobs[1]);
}

/// Runs `cmd` with `input` on its stdin, closed right after, and returns the frames it wrote
/// before it exited (bounded in time).
async fn piped(cmd: &[String], input: &str) -> Vec<Value> {
    piped_until_answered(cmd, input, 0).await
}

/// Runs `cmd` with `input` on its stdin, kept open until `requests` answers came (0: closed
/// right after; some servers drop what is in progress when their input ends, directly too),
/// and returns the frames it wrote before it exited (bounded in time).
async fn piped_until_answered(cmd: &[String], input: &str, requests: usize) -> Vec<Value> {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    let mut child = tokio::process::Command::new(&cmd[0])
        .args(&cmd[1..])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take();
    if let Some(w) = stdin.as_mut() {
        w.write_all(input.as_bytes()).await.unwrap();
    }
    if requests == 0 {
        drop(stdin.take());
    }
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let read = async {
        let mut frames: Vec<Value> = Vec::new();
        while let Some(line) = lines.next_line().await.unwrap() {
            frames.push(serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}")));
            let answers = frames.iter().filter(|f| f.get("method").is_none()).count();
            if answers == requests {
                drop(stdin.take());
            }
        }
        frames
    };
    let frames = tokio::time::timeout(Duration::from_secs(60), read)
        .await
        .expect("the client's answers come in time");
    let _ = child.wait().await;
    frames
}

/// `mcpmesh connect target` as `node`'s user runs it, as an argument vector.
fn connect_argv(node: &TestNode, target: &str) -> Vec<String> {
    let home = node.home().display().to_string();
    [MCPMESH, "--home", &home, "connect", target]
        .map(str::to_owned)
        .to_vec()
}

/// The `_meta` members a 2026-07-28 client sends with each request.
const STATELESS_META: &str = r#""_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientInfo":{"name":"pipe","version":"1"},"io.modelcontextprotocol/clientCapabilities":{}}"#;

/// The ids of `frames` answered with a result, in order.
fn answered(frames: &[Value]) -> Vec<Value> {
    frames
        .iter()
        .filter(|f| f.get("result").is_some())
        .map(|f| f["id"].clone())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_client_that_closes_its_input_after_its_requests_gets_every_answer_as_it_does_direct() {
    let index = deps().join("node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    let py = python().display().to_string();
    let legacy = [
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"pipe","version":"1"}}}"#,
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#,
    ]
    .join("\n")
        + "\n";
    let meta = STATELESS_META;
    let modern = format!(
        "{{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"server/discover\",\"params\":{{{meta}}}}}\n\
         {{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"tools/list\",\"params\":{{{meta}}}}}\n"
    );
    let everything = [
        "node".to_owned(),
        index.display().to_string(),
        "stdio".into(),
    ];
    let sdk = [py, interop_script("modern_server.py")];
    let (alice, bob) = two_nodes();
    alice.serve(
        "everything",
        &["bob"],
        &everything.iter().fold(vec!["--"], |mut v, a| {
            v.push(a);
            v
        }),
    );
    alice.serve(
        "sdk",
        &["bob"],
        &sdk.iter().fold(vec!["--"], |mut v, a| {
            v.push(a);
            v
        }),
    );
    let connect = |service: &str| connect_argv(&bob, &format!("alice/{service}"));
    let direct = answered(&piped(&everything, &legacy).await);
    assert_eq!(
        direct,
        [json!(1), json!(2)],
        "server-everything answers directly"
    );
    let mesh = piped(&connect("everything"), &legacy).await;
    assert_eq!(answered(&mesh), direct, "{mesh:?}");
    // The Python SDK's server itself sometimes drops a request still in progress when its
    // input ends (directly too): what it answers arrives, and a request it dropped is
    // answered by the mesh, never left hanging.
    for script in [&legacy, &modern] {
        let mesh = piped(&connect("sdk"), script).await;
        let ids: Vec<&Value> = mesh.iter().map(|f| &f["id"]).collect();
        assert_eq!(ids, [&json!(1), &json!(2)], "{mesh:?}");
        assert!(mesh[0].get("result").is_some(), "{mesh:?}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_long_call_whose_client_closes_its_input_still_gets_its_answer() {
    let (alice, bob) = two_nodes();
    alice.serve_stub("stub", &["bob"], None, "half-close-long");
    let script = [
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"pipe","version":"1"}}}"#,
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
        // Longer than any fixed grace of either node.
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"sleep","arguments":{"ms":4000}}}"#,
    ]
    .join("\n")
        + "\n";
    let frames = piped(&connect_argv(&bob, "alice/stub"), &script).await;
    assert_eq!(answered(&frames), [json!(1), json!(2)], "{frames:?}");
    assert_eq!(
        frames[1]["result"]["content"][0]["text"], "slept 4000 ms",
        "{frames:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_official_python_sdk_is_told_its_tools_changed_and_lists_what_it_may_use_now() {
    let m = marker("sdk-list-changed");
    let (alice, bob) = two_nodes();
    alice.serve_stub("notes", &["bob"], None, &m);
    // The SDK (it speaks 2025-11-25) as the client of `mcpmesh connect`, one step a line.
    let connect = [
        MCPMESH,
        "--home",
        bob.home().to_str().unwrap(),
        "connect",
        "alice/notes",
    ];
    let mut driver = HubClient::start(&connect.map(str::to_owned)).await;
    assert_eq!(driver.ready["ready"], "echo-stub", "{}", driver.ready);
    let names = |tools: Vec<(String, String)>| -> Vec<String> {
        tools.into_iter().map(|(name, _)| name).collect()
    };
    let before = names(driver.tools().await);
    assert!(before.contains(&"echo".to_owned()), "{before:?}");

    let revoked = alice.json(&["revoke", "bob", "notes", "--tools", "echo"]);
    assert_eq!(revoked["sessions_ended"], 0, "{revoked}");
    let changed = driver.step(json!({ "op": "wait_list_changed" })).await;
    assert_eq!(changed["changed"], true, "{changed}");
    let after = names(driver.tools().await);
    let want: Vec<String> = before.iter().filter(|t| *t != "echo").cloned().collect();
    assert_eq!(after, want);
    let echo = driver.call("echo", json!({ "text": "hi" })).await;
    assert_eq!(echo["error"]["code"], -32054, "{echo}");
    driver.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_oauth_test_bed_does_what_the_authorization_spec_says_for_the_sdks_own_client() {
    // tests/http.rs makes grants against oauth_server.py; this holds that server to the spec
    // by itself, and shows the official SDK's own OAuth client using it.
    let report = run_driver(&[interop_script("oauth_selfcheck.py")]).await;
    for check in [
        "pkce",
        "refresh",
        "invalid-target",
        "sdk-echo-modern",
        "sdk-refresh",
        "log",
    ] {
        assert!(
            report
                .lines()
                .any(|l| l.starts_with(&format!("ok   {check} "))),
            "{check}: {report}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_megabyte_call_reaches_real_servers_of_both_eras_whole() {
    // Longer than a node holds whole: the call passes both nodes in parts, decided on as it
    // goes. server-everything (2025-06-18) and the Python SDK's server (2026-07-28, its
    // `_meta` after the arguments, where a decision still reads it) each echo it back.
    // server-everything's client closes its input right after the call. The Python SDK's
    // server drops a request in progress when its input ends (directly too, in about half
    // of the runs), so its client closes its input once answered.
    let text = format!("start-{}-end", "m".repeat(1 << 20));
    let index = deps().join("node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    let everything = [
        "node".to_owned(),
        index.display().to_string(),
        "stdio".into(),
    ];
    let sdk = [
        python().display().to_string(),
        interop_script("modern_server.py"),
    ];
    let (alice, bob) = two_nodes();
    for (service, cmd) in [("everything", &everything[..]), ("sdk", &sdk[..])] {
        let backend = cmd.iter().fold(vec!["--"], |mut v, a| {
            v.push(a);
            v
        });
        alice.serve(service, &["bob"], &backend);
    }
    let legacy = format!(
        "{}\n{}\n{}\n",
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"pipe","version":"1"}}}"#,
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
        json!({ "jsonrpc": "2.0", "id": 2, "method": "tools/call",
                "params": { "name": "echo", "arguments": { "message": text } } }),
    );
    let meta = STATELESS_META;
    let modern = format!(
        "{{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"server/discover\",\"params\":{{{meta}}}}}\n\
         {{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"tools/call\",\"params\":{{\"name\":\"echo\",\"arguments\":{{\"text\":\"{text}\"}},{meta}}}}}\n"
    );
    let connect = |service: &str| connect_argv(&bob, &format!("alice/{service}"));
    for (service, script) in [("everything", &legacy), ("sdk", &modern)] {
        let frames = match service {
            "everything" => piped(&connect(service), script).await,
            _ => piped_until_answered(&connect(service), script, 2).await,
        };
        assert_eq!(answered(&frames), [json!(1), json!(2)], "{service}");
        let call = frames
            .iter()
            .find(|f| f["id"] == 2 && f.get("result").is_some());
        let echoed = call.and_then(|f| f["result"]["content"][0]["text"].as_str());
        let echoed = echoed.unwrap_or_default();
        assert!(
            echoed.ends_with(&text) && echoed.len() < text.len() + 64,
            "{service}: {} bytes echoed",
            echoed.len()
        );
    }
    let records = alice.stop_and_audit();
    let calls: Vec<&Value> = records
        .iter()
        .filter(|r| r["method"] == "tools/call")
        .collect();
    assert_eq!(calls.len(), 2, "{records:?}");
    for call in calls {
        assert_eq!(call["outcome"], "ok", "{call}");
        assert!(call["bytes_in"].as_u64().unwrap() > 1 << 20, "{call}");
    }
}
