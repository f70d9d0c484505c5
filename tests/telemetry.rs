//! The metrics endpoint through real daemons: after a known sequence of calls, refusals and a
//! rate-limited burst, every counter holds its exact value on both nodes, and the page parses
//! with the Prometheus client's strict OpenMetrics parser. Label values stay bounded whatever
//! a caller sends; the endpoint refuses a foreign `Host` or `Origin`, is off by default, and a
//! port already taken leaves the node running and says so.

mod common;

use std::io::{Read, Write};
use std::process::Stdio;

use common::*;
use serde_json::{Value, json};

/// A `GET path` with `Host: host` and `extra` header lines; the status code and the body.
fn get(port: u16, path: &str, host: &str, extra: &str) -> (u16, String) {
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream.set_read_timeout(Some(ANSWER_TIMEOUT)).unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {host}\r\n{extra}Connection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let status = answer
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// One scrape, as it parses.
struct Page {
    text: String,
    samples: Vec<Value>,
}

impl Page {
    /// The value of the one sample named `name` whose labels are exactly `labels`.
    fn value(&self, name: &str, labels: Value) -> Option<f64> {
        self.samples
            .iter()
            .find(|s| s["name"] == name && s["labels"] == labels)
            .and_then(|s| s["value"].as_f64())
    }

    /// Every distinct value of label `label` among the samples named `name`.
    fn label_values(&self, name: &str, label: &str) -> Vec<String> {
        let mut values: Vec<String> = self
            .samples
            .iter()
            .filter(|s| s["name"] == name)
            .filter_map(|s| s["labels"][label].as_str().map(str::to_owned))
            .collect();
        values.sort();
        values.dedup();
        values
    }
}

/// Scrapes `port` and parses the page with `prometheus_client`'s OpenMetrics parser (the test
/// fails when the page is not valid OpenMetrics text).
fn scrape(port: u16) -> Page {
    let (status, text) = get(port, "/metrics", &format!("127.0.0.1:{port}"), "");
    assert_eq!(status, 200, "{text}");
    let mut parser = std::process::Command::new(python())
        .arg(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../tests/telemetry/openmetrics.py"),
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    parser
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = parser.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the page does not parse: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    let samples = serde_json::from_slice(&out.stdout).unwrap();
    Page { text, samples }
}

fn metrics_config(port: u16) -> String {
    format!("[telemetry]\nmetrics = \"127.0.0.1:{port}\"\n")
}

/// A request line as sent, newline included.
fn line(id: i64, method: &str, params: Value) -> Vec<u8> {
    let mut line = serde_json::to_vec(
        &json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params }),
    )
    .unwrap();
    line.push(b'\n');
    line
}

fn call(id: i64, tool: &str) -> Vec<u8> {
    line(
        id,
        "tools/call",
        json!({ "name": tool, "arguments": { "text": "hi" } }),
    )
}

/// Labels of an operation's duration.
fn op(method: &str, tool: Option<&str>, service: &str, peer: &str, outcome: &str) -> Value {
    let mut labels =
        json!({ "mcp_method_name": method, "service": service, "peer": peer, "outcome": outcome });
    if let Some(tool) = tool {
        labels["gen_ai_tool_name"] = json!(tool);
    }
    labels
}

/// The inodes of the TCP sockets `pid` listens on.
fn listening_sockets(pid: u32) -> Vec<String> {
    let owned: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter_map(|l| {
            let l = l.to_string_lossy().into_owned();
            Some(l.strip_prefix("socket:[")?.strip_suffix(']')?.to_owned())
        })
        .collect();
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .flat_map(|f| {
            std::fs::read_to_string(f)
                .unwrap_or_default()
                .lines()
                .skip(1)
                .filter_map(|l| {
                    let cols: Vec<&str> = l.split_whitespace().collect();
                    // Column 3 is the state (0A: listening), column 9 the inode.
                    (cols.get(3) == Some(&"0A")).then(|| cols.get(9).map(|s| s.to_string()))?
                })
                .collect::<Vec<_>>()
        })
        .filter(|inode| owned.contains(inode))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_known_sequence_of_calls_and_refusals_is_counted_exactly_on_both_nodes() {
    let (alice_port, bob_port) = (free_port(), free_port());
    let (m, stub) = (marker("telemetry"), stub());
    let alice = TestNode::start_with(
        "alice",
        &format!(
            "[limits]\nrate_limit_per_min = 6\nmax_in_flight = 2\n\n{}\n\
             [services.svc]\nrun = [{stub:?}, \"--marker\", {m:?}]\nallow = [\"bob\"]\n\n\
             [[services.svc.tools]]\nwho = [\"peer:bob\"]\nallow = [\"*\"]\ndeny = [\"whoami\"]\n\n\
             [services.one]\nrun = [{stub:?}, \"--marker\", {m:?}]\nallow = [\"bob\"]\nmax_sessions = 1\n",
            metrics_config(alice_port)
        ),
        &[],
    );
    let bob = TestNode::start_with("bob", &metrics_config(bob_port), &[]);
    alice.trust(&bob);
    bob.trust(&alice);

    // Session 1 on svc, six tokens of the caller's rate: the admission, then five requests;
    // three more requests are over the rate.
    let mut s = bob.connect("alice/svc");
    let sent = [
        line(
            1,
            "initialize",
            json!({ "protocolVersion": "2025-06-18", "capabilities": {},
                                      "clientInfo": { "name": "t", "version": "0" } }),
        ),
        call(2, "echo"),
        call(3, "nope"),
        call(4, "whoami"),
        call(5, "echo"),
        call(6, "echo"),
        call(7, "echo"),
        call(8, "echo"),
    ];
    let mut from_server = 0;
    for (i, request) in sent.iter().enumerate() {
        s.send_raw(request).await;
        let answer = s.recv_raw().await.expect("every request is answered");
        let v: Value = serde_json::from_slice(&answer).unwrap();
        assert_eq!(v["id"], i + 1, "{v}");
        let refused_here = v["error"]["data"]["source"] == "mcpmesh";
        match i + 1 {
            1 | 2 | 5 => assert!(v.get("result").is_some(), "{v}"),
            3 => assert_eq!(
                v["error"]["code"], -32602,
                "the stub knows no such tool: {v}"
            ),
            4 => assert_eq!(v["error"]["code"], -32054, "whoami is denied: {v}"),
            _ => assert_eq!(v["error"]["code"], -32053, "over the rate: {v}"),
        }
        if !refused_here {
            from_server += answer.len() + 1;
        }
    }
    let to_server: usize = sent.iter().map(Vec::len).sum();
    s.close_stdin();
    s.wait_eof().await;

    // Session 2 on svc: refused at admission, over the rate.
    let mut refused = bob.connect("alice/svc");
    let r = refused.initialize().await;
    assert_eq!(r["error"]["code"], -32053, "{r}");
    drop(refused);

    // On `one` (one session at most, two requests in flight): a second session is over the
    // cap; a third request in flight is over the in-flight cap.
    let mut held = bob.connect("alice/one");
    assert!(held.initialize().await.get("result").is_some());
    let mut capped = bob.connect("alice/one");
    let r = capped.initialize().await;
    assert_eq!(r["error"]["code"], -32053, "{r}");
    drop(capped);
    held.send_raw(
        &[
            line(
                11,
                "tools/call",
                json!({ "name": "sleep", "arguments": { "ms": 300 } }),
            ),
            line(
                12,
                "tools/call",
                json!({ "name": "sleep", "arguments": { "ms": 300 } }),
            ),
            line(13, "tools/call", json!({ "name": "echo", "arguments": {} })),
        ]
        .concat(),
    )
    .await;
    let first = held.recv().await.unwrap();
    assert_eq!(
        (first["id"].clone(), first["error"]["code"].clone()),
        (json!(13), json!(-32053))
    );
    held.recv().await.unwrap();
    held.recv().await.unwrap();

    // A key alice does not trust knocks once.
    let (stranger, target) = raw_client(&alice, false).await;
    let knock = exchange(
        &stranger,
        target,
        b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}\n",
    )
    .await;
    assert!(
        knock.as_ref().is_none_or(|v| v.get("result").is_none()),
        "{knock:?}"
    );
    let stranger_key = stranger.id().to_string();

    // Session 1's end is recorded once its child is gone.
    let live = |page: &Page, service: &str| {
        page.value("mcpmesh_sessions_live", json!({ "service": service }))
    };
    assert!(
        eventually(ANSWER_TIMEOUT, || {
            let page = scrape(alice_port);
            live(&page, "svc") == Some(0.0)
                && page.value("mcpmesh_refusals_total", json!({ "reason": "trust" })) == Some(1.0)
        })
        .await,
        "svc's session ended and the stranger was counted:\n{}",
        scrape(alice_port).text
    );

    let page = scrape(alice_port);
    let count = "mcp_server_operation_duration_seconds_count";
    for (labels, n) in [
        (op("initialize", None, "svc", "bob", "ok"), 1.0),
        (op("tools/call", Some("echo"), "svc", "bob", "ok"), 2.0),
        (op("tools/call", Some("other"), "svc", "bob", "error"), 1.0),
        (op("tools/call", Some("other"), "svc", "bob", "denied"), 1.0),
        (
            op("tools/call", Some("echo"), "svc", "bob", "rate_limited"),
            3.0,
        ),
        (op("initialize", None, "one", "bob", "ok"), 1.0),
        // Never answered on `one`, so its name is not kept there.
        (
            op("tools/call", Some("other"), "one", "bob", "refused"),
            1.0,
        ),
    ] {
        assert_eq!(
            page.value(count, labels.clone()),
            Some(n),
            "{labels}\n{}",
            page.text
        );
    }
    for (labels, n) in [
        (
            json!({ "service": "svc", "peer": "bob", "outcome": "ok" }),
            3.0,
        ),
        (
            json!({ "service": "svc", "peer": "bob", "outcome": "error" }),
            1.0,
        ),
        (
            json!({ "service": "svc", "peer": "bob", "outcome": "denied" }),
            1.0,
        ),
        (
            json!({ "service": "svc", "peer": "bob", "outcome": "rate_limited" }),
            3.0,
        ),
    ] {
        assert_eq!(
            page.value("mcpmesh_requests_total", labels.clone()),
            Some(n),
            "{labels}"
        );
    }
    for (labels, n) in [
        (json!({ "reason": "rate", "service": "svc" }), 4.0),
        (json!({ "reason": "tool_policy", "service": "svc" }), 1.0),
        (json!({ "reason": "session_cap", "service": "one" }), 1.0),
        (json!({ "reason": "in_flight", "service": "one" }), 1.0),
        (json!({ "reason": "trust" }), 1.0),
    ] {
        assert_eq!(
            page.value("mcpmesh_refusals_total", labels.clone()),
            Some(n),
            "{labels}"
        );
    }
    let bytes = |direction| {
        page.value(
            "mcpmesh_request_bytes_total",
            json!({ "service": "svc", "direction": direction }),
        )
    };
    assert_eq!(bytes("in"), Some(to_server as f64));
    assert_eq!(bytes("out"), Some(from_server as f64));
    assert_eq!(
        page.value(
            "mcp_server_session_duration_seconds_count",
            json!({ "service": "svc", "peer": "bob" })
        ),
        Some(1.0)
    );
    assert_eq!(live(&page, "one"), Some(1.0), "the held session is live");
    assert_eq!(
        page.value("mcpmesh_children_alive", json!({})),
        Some(1.0),
        "only the held session's server runs"
    );
    // The stranger is counted, never named.
    assert!(!page.text.contains(&stranger_key), "{}", page.text);
    assert!(!page.text.contains("eid:"), "{}", page.text);

    // The dialing side timed the same requests as its client saw them answered.
    let page = scrape(bob_port);
    let count = "mcp_client_operation_duration_seconds_count";
    for (labels, n) in [
        (op("initialize", None, "svc", "alice", "ok"), 1.0),
        (op("tools/call", Some("echo"), "svc", "alice", "ok"), 2.0),
        (op("tools/call", Some("echo"), "svc", "alice", "error"), 3.0),
        (
            op("tools/call", Some("other"), "svc", "alice", "error"),
            2.0,
        ),
    ] {
        assert_eq!(
            page.value(count, labels.clone()),
            Some(n),
            "{labels}\n{}",
            page.text
        );
    }
    assert!(
        page.value(
            "mcp_client_session_duration_seconds_count",
            json!({ "service": "svc", "peer": "alice" })
        )
        .is_some_and(|n| n >= 1.0),
        "{}",
        page.text
    );

    // Peers by path, with their round trip.
    assert!(
        eventually(ANSWER_TIMEOUT, || {
            let page = scrape(alice_port);
            page.value("mcpmesh_peers", json!({ "path": "direct" })) == Some(1.0)
                && page
                    .value(
                        "mcpmesh_peer_rtt_seconds",
                        json!({ "peer": "bob", "path": "direct" }),
                    )
                    .is_some_and(|rtt| rtt > 0.0)
        })
        .await,
        "{}",
        scrape(alice_port).text
    );

    // The held session ends: no session live, no child left.
    held.close_stdin();
    held.wait_eof().await;
    assert!(
        eventually(ANSWER_TIMEOUT, || {
            let page = scrape(alice_port);
            live(&page, "one") == Some(0.0)
                && page.value("mcpmesh_children_alive", json!({})) == Some(0.0)
        })
        .await,
        "{}",
        scrape(alice_port).text
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn method_and_tool_names_a_caller_invents_are_labelled_other() {
    let port = free_port();
    let m = marker("telemetry-names");
    let alice = TestNode::start_with(
        "alice",
        &format!(
            "[limits]\nrate_limit_per_min = 100000\nmax_in_flight = 1000\n\n{}",
            metrics_config(port)
        ),
        &[],
    );
    let bob = TestNode::start("bob");
    alice.trust(&bob);
    bob.trust(&alice);
    alice.serve_stub("svc", &["bob"], None, &m);
    let mut s = bob.connect("alice/svc");
    s.initialize().await;
    assert!(
        s.call("echo", json!({ "text": "x" }))
            .await
            .get("result")
            .is_some()
    );
    let invented = 300;
    let mut burst = Vec::new();
    for i in 0..invented {
        burst.extend(call(1000 + i, &format!("tool-{i}")));
        burst.extend(line(5000 + i, &format!("made/up/{i}"), json!({})));
    }
    s.send_raw(&burst).await;
    for _ in 0..2 * invented {
        let answer = s.recv().await.expect("every request is answered");
        assert!(answer.get("error").is_some(), "{answer}");
    }
    let page = scrape(port);
    let name = "mcp_server_operation_duration_seconds_count";
    assert_eq!(
        page.label_values(name, "gen_ai_tool_name"),
        ["echo", "other"],
        "{}",
        page.text
    );
    assert_eq!(
        page.label_values(name, "mcp_method_name"),
        ["initialize", "other", "tools/call"]
    );
    assert_eq!(
        page.value(name, op("tools/call", Some("other"), "svc", "bob", "error")),
        Some(invented as f64)
    );
    assert_eq!(
        page.value(name, op("other", None, "svc", "bob", "error")),
        Some(invented as f64)
    );
    assert!(
        page.text.len() < 64 * 1024,
        "the page stays small: {}",
        page.text.len()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_endpoint_refuses_a_foreign_host_or_origin_and_answers_only_metrics() {
    let port = free_port();
    let node = TestNode::start_with("alice", &metrics_config(port), &[]);
    let status = node.json(&["status"]);
    assert_eq!(
        status["metrics"]["url"],
        format!("http://127.0.0.1:{port}/metrics")
    );
    let local = format!("127.0.0.1:{port}");
    let (code, body) = get(port, "/metrics", &local, "");
    assert_eq!(code, 200);
    assert!(body.contains("mcpmesh_children_alive 0"), "{body}");
    let (code, _) = get(
        port,
        "/metrics",
        &format!("localhost:{port}"),
        "Origin: http://localhost:3000\r\n",
    );
    assert_eq!(code, 200);
    let (code, body) = get(port, "/metrics", &format!("evil.example.com:{port}"), "");
    assert_eq!(code, 403, "a foreign Host (DNS rebinding): {body}");
    let (code, body) = get(
        port,
        "/metrics",
        &local,
        "Origin: https://evil.example.com\r\n",
    );
    assert_eq!(code, 403, "a foreign Origin: {body}");
    let (code, _) = get(port, "/", &local, "");
    assert_eq!(code, 404);
    assert_eq!(listening_sockets(node.daemon_pid()).len(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn metrics_are_off_by_default() {
    let node = TestNode::start("alice");
    assert_eq!(node.json(&["status"])["metrics"], Value::Null);
    assert_eq!(
        listening_sockets(node.daemon_pid()),
        Vec::<String>::new(),
        "the node listens on no TCP port"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_metrics_port_already_taken_leaves_the_node_serving_and_is_reported() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let m = marker("telemetry-taken");
    let (alice, bob) = (
        TestNode::start_with("alice", &metrics_config(port), &[]),
        TestNode::start("bob"),
    );
    alice.trust(&bob);
    bob.trust(&alice);
    alice.serve_stub("svc", &["bob"], None, &m);
    let mut s = bob.connect("alice/svc");
    assert!(
        s.initialize().await.get("result").is_some(),
        "the node serves"
    );

    let status = alice.json(&["status"]);
    let error = status["metrics"]["error"].as_str().unwrap_or_default();
    assert!(error.contains(&format!("127.0.0.1:{port}")), "{status}");
    let human = String::from_utf8_lossy(&alice.cli(&["status"]).stdout).into_owned();
    assert!(human.contains("metrics off: cannot listen"), "{human}");
    let doctor = alice.cli(&["--json", "doctor", "--offline"]);
    let report: Value = serde_json::from_slice(&doctor.stdout).unwrap();
    let check = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["check"] == "metrics")
        .cloned()
        .unwrap_or_default();
    assert_eq!(check["status"], "warn", "{report}");
    assert!(
        check["message"]
            .as_str()
            .unwrap_or_default()
            .contains("telemetry.metrics"),
        "{check}"
    );
    assert!(
        alice.log().contains("cannot listen for metrics"),
        "{}",
        alice.log()
    );
    drop(taken);
}

/// Whether the server has closed `stream` by `deadline` (end of stream or a reset).
fn closed_by(mut stream: std::net::TcpStream, deadline: std::time::Instant) -> bool {
    let mut sink = [0u8; 1024];
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() || stream.set_read_timeout(Some(left)).is_err() {
            return false;
        }
        match stream.read(&mut sink) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return false,
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => return false,
            Err(_) => return true,
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn slow_connections_to_the_metrics_port_are_capped_and_dropped_while_a_scrape_is_served() {
    // The test knob shortens the 10 s header and 30 s body read timeouts.
    let timeout = std::time::Duration::from_millis(1500);
    let port = free_port();
    let node = TestNode::start_with(
        "alice",
        &metrics_config(port),
        &[("MCPMESH_TEST_HTTP_TIMEOUT_MS", "1500")],
    );
    let mut slow = Vec::new();
    for n in 0..300 {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        // Half a head, or a whole head and one byte of a declared body.
        let partial: &[u8] = if n % 2 == 0 {
            b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        } else {
            b"POST /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1000\r\n\r\nx"
        };
        // A connection beyond the cap may already be closed: its write may fail.
        let _ = s.write_all(partial);
        slow.push(s);
        if n == 59 {
            // Sixty held below the cap of 64: a scrape still gets through.
            let (code, body) = get(port, "/metrics", &format!("127.0.0.1:{port}"), "");
            assert_eq!(code, 200, "{body}");
        }
    }
    assert!(node.json(&["status"])["metrics"]["url"].is_string());
    let started = std::time::Instant::now();
    let deadline = started + timeout + std::time::Duration::from_secs(10);
    let held = slow.into_iter().map(|s| closed_by(s, deadline));
    let still_open = held.filter(|closed| !closed).count();
    assert_eq!(
        still_open, 0,
        "{still_open} of 300 slow connections still open"
    );
    eprintln!(
        "300 slow connections (60 below the cap), all closed {:?} after the last was opened",
        started.elapsed()
    );
    let (code, _) = get(port, "/metrics", &format!("127.0.0.1:{port}"), "");
    assert_eq!(code, 200);
}
