//! OTLP traces through real daemons: a collector the test runs (OTLP/HTTP, decoded with the
//! protocol's own generated types) receives one span per request from each node. A request
//! from the official Python SDK's traced client (whose `params._meta` carries its
//! `traceparent`) lands in the client's trace: the dialing node's span, the serving node's
//! span and the SDK server's own span all have the client's span as parent. A request without
//! one starts a new trace, and one its caller did not sample is not recorded; a collector that
//! is not there fails no call.

mod common;

use std::collections::HashMap;
use std::process::Stdio;
use std::sync::{Arc, Mutex};

use common::*;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use prost::Message;
use serde_json::{Value, json};

/// `SPAN_KIND_SERVER` and `SPAN_KIND_CLIENT` in OTLP.
const SERVER: i32 = 2;
const CLIENT: i32 = 3;
/// `STATUS_CODE_ERROR` in OTLP.
const ERROR: i32 = 2;

/// One span as the collector received it.
#[derive(Debug, Clone)]
struct Received {
    /// The sender's `service.name` and `service.instance.id`.
    service: String,
    instance: String,
    name: String,
    kind: i32,
    trace_id: String,
    span_id: String,
    /// Empty for a root span.
    parent: String,
    attributes: HashMap<String, String>,
    error: bool,
    /// The post's `x-api-key` header (`OTEL_EXPORTER_OTLP_HEADERS`).
    api_key: Option<String>,
}

impl Received {
    fn attr(&self, key: &str) -> Option<&str> {
        self.attributes.get(key).map(String::as_str)
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn text(value: Option<&AnyValue>) -> String {
    match value.and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::IntValue(i)) => i.to_string(),
        Some(any_value::Value::BoolValue(b)) => b.to_string(),
        Some(any_value::Value::DoubleValue(d)) => d.to_string(),
        other => format!("{other:?}"),
    }
}

fn attributes(kvs: &[KeyValue]) -> HashMap<String, String> {
    kvs.iter()
        .map(|kv| (kv.key.clone(), text(kv.value.as_ref())))
        .collect()
}

/// An OTLP/HTTP collector on loopback that keeps every span it is sent.
struct Collector {
    url: String,
    spans: Arc<Mutex<Vec<Received>>>,
}

impl Collector {
    async fn start() -> Self {
        let spans: Arc<Mutex<Vec<Received>>> = Arc::default();
        let kept = spans.clone();
        let app = axum::Router::new().route(
            "/v1/traces",
            axum::routing::post(
                move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
                    let kept = kept.clone();
                    let api_key = headers
                        .get("x-api-key")
                        .and_then(|v| v.to_str().ok())
                        .map(str::to_owned);
                    async move {
                        let Ok(request) = ExportTraceServiceRequest::decode(body) else {
                            return axum::http::StatusCode::BAD_REQUEST;
                        };
                        let mut kept = kept.lock().unwrap();
                        for rs in request.resource_spans {
                            let resource =
                                attributes(&rs.resource.map(|r| r.attributes).unwrap_or_default());
                            for span in rs.scope_spans.into_iter().flat_map(|s| s.spans) {
                                kept.push(Received {
                                    service: resource
                                        .get("service.name")
                                        .cloned()
                                        .unwrap_or_default(),
                                    instance: resource
                                        .get("service.instance.id")
                                        .cloned()
                                        .unwrap_or_default(),
                                    name: span.name,
                                    kind: span.kind,
                                    trace_id: hex(&span.trace_id),
                                    span_id: hex(&span.span_id),
                                    parent: hex(&span.parent_span_id),
                                    attributes: attributes(&span.attributes),
                                    error: span.status.is_some_and(|s| s.code == ERROR),
                                    api_key: api_key.clone(),
                                });
                            }
                        }
                        axum::http::StatusCode::OK
                    }
                },
            ),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        Collector { url, spans }
    }

    fn spans(&self) -> Vec<Received> {
        self.spans.lock().unwrap().clone()
    }

    /// Waits until `enough` holds of the spans received so far.
    async fn until(&self, enough: impl Fn(&[Received]) -> bool) -> Vec<Received> {
        let arrived = eventually(ANSWER_TIMEOUT, || enough(&self.spans())).await;
        let spans = self.spans();
        assert!(arrived, "the spans did not arrive; received:\n{spans:#?}");
        spans
    }
}

fn traced_script() -> String {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/telemetry/traced.py")
        .display()
        .to_string()
}

/// Spans leave a node a tenth of a second after they end, with a collector's key (the standard
/// variables; the key's value percent-encoded, as they write it).
const QUICK_EXPORT: [(&str, &str); 2] = [
    ("OTEL_BSP_SCHEDULE_DELAY", "100"),
    ("OTEL_EXPORTER_OTLP_HEADERS", "x-api-key=team%20key"),
];

/// alice serving `svc` (its server started by `run`, a TOML array) to bob, both sending
/// traces to `otlp`, each trusting the other.
fn traced_nodes(otlp: &str, run: &str) -> (TestNode, TestNode) {
    let telemetry = format!("[telemetry]\notlp = {otlp:?}\n");
    let alice = TestNode::start_with(
        "alice",
        &format!("{telemetry}\n[services.svc]\nrun = {run}\nallow = [\"bob\"]\n"),
        &QUICK_EXPORT,
    );
    let bob = TestNode::start_with("bob", &telemetry, &QUICK_EXPORT);
    alice.trust(&bob);
    bob.trust(&alice);
    (alice, bob)
}

/// Calls the stub's `echo` as request `id`, with `meta` as its `_meta`; fails unless answered.
async fn echo(s: &mut McpSession, id: Value, meta: Option<Value>) {
    let mut params = json!({ "name": "echo", "arguments": { "text": "x" } });
    if let Some(meta) = meta {
        params["_meta"] = meta;
    }
    s.send(&json!({ "jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params }))
        .await;
    let answer = s.recv().await.expect("answered");
    assert!(answer.get("result").is_some(), "{answer}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_traced_clients_request_is_one_trace_across_both_nodes_and_the_sdk_server() {
    let collector = Collector::start().await;
    let py = python().display().to_string();
    let server = [
        py.as_str(),
        &traced_script(),
        "server",
        "--otlp",
        &collector.url,
    ];
    let (alice, bob) = traced_nodes(&collector.url, &format!("{server:?}"));

    let client = tokio::process::Command::new(&py)
        .arg(traced_script())
        .args(["client", "--otlp", &collector.url, "--", MCPMESH, "--home"])
        .arg(bob.home())
        .args(["connect", "alice/svc"])
        .env_remove("MCPMESH_HOME")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output();
    let out = tokio::time::timeout(ANSWER_TIMEOUT * 3, client)
        .await
        .expect("the client finished")
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["echo"], "traced", "{report}");
    assert_eq!(report["fail_is_error"], true, "{report}");
    let trace_id = report["trace_id"].as_str().unwrap().to_owned();

    // The client's three calls, each seen by the client, both nodes and the server.
    let calls = ["echo", "fail", "no_such_tool"];
    let of_call = |spans: &[Received], tool: &str| -> Vec<Received> {
        spans
            .iter()
            .filter(|s| s.trace_id == trace_id && s.name.ends_with(&format!("tools/call {tool}")))
            .cloned()
            .collect()
    };
    let spans = collector
        .until(|spans| calls.iter().all(|tool| of_call(spans, tool).len() >= 4))
        .await;
    // The trace as a collector shows it (with --nocapture).
    for s in spans.iter().filter(|s| s.trace_id == trace_id) {
        let who = match &s.instance {
            i if *i == alice.id => "alice (serving node)".to_owned(),
            i if *i == bob.id => "bob (dialing node)".to_owned(),
            _ => s.service.clone(),
        };
        eprintln!(
            "{who:<22} {:<32} kind {} span {} parent {}",
            s.name, s.kind, s.span_id, s.parent
        );
    }
    for tool in calls {
        let seen = of_call(&spans, tool);
        let by = |service: &str, instance: &str| -> Received {
            let mine: Vec<&Received> = seen
                .iter()
                .filter(|s| s.service == service && (instance.is_empty() || s.instance == instance))
                .collect();
            assert_eq!(mine.len(), 1, "{service} {instance}: {seen:#?}");
            mine[0].clone()
        };
        let client = by("python-client", "");
        let dialing = by("mcpmesh", &bob.id);
        let serving = by("mcpmesh", &alice.id);
        let server = by("python-server", "");
        assert_eq!(client.kind, CLIENT, "{client:?}");
        // The client's span is the parent of all three: the nodes only read `_meta`, so the
        // server received the traceparent as the client sent it.
        for (span, kind) in [(&dialing, CLIENT), (&serving, SERVER), (&server, SERVER)] {
            assert_eq!(span.parent, client.span_id, "{span:#?}\n{client:#?}");
            assert_eq!(span.kind, kind, "{span:#?}");
        }
        for (node, peer) in [(&dialing, &alice.id), (&serving, &bob.id)] {
            assert_eq!(node.name, format!("tools/call {tool}"));
            assert_eq!(node.attr("mcp.method.name"), Some("tools/call"));
            assert_eq!(node.attr("gen_ai.tool.name"), Some(tool));
            assert_eq!(node.attr("network.transport"), Some("quic"));
            assert_eq!(node.attr("mcpmesh.service"), Some("svc"));
            assert_eq!(node.attr("mcpmesh.peer.id"), Some(peer.as_str()));
            assert_eq!(
                node.attr("jsonrpc.request.id"),
                client.attr("jsonrpc.request.id"),
                "{node:#?}\n{client:#?}"
            );
        }
        // Each node tells the call's error as the server's own span does.
        let expected_error = server.attr("error.type").map(str::to_owned);
        match tool {
            "echo" => assert_eq!(expected_error, None, "{server:#?}"),
            "fail" => assert_eq!(expected_error.as_deref(), Some("tool_error")),
            _ => assert!(expected_error.is_some(), "{server:#?}"),
        }
        for node in [&dialing, &serving] {
            assert_eq!(
                node.attr("error.type").map(str::to_owned),
                expected_error,
                "{node:#?}"
            );
            assert_eq!(node.error, expected_error.is_some(), "{node:#?}");
        }
    }
    // The session's initialize is in the trace too, one span per node.
    let initialize = |instance: &str| {
        spans
            .iter()
            .filter(|s| s.instance == instance && s.name == "initialize")
            .count()
    };
    assert_eq!((initialize(&alice.id), initialize(&bob.id)), (1, 1));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_request_without_a_traceparent_starts_a_new_trace_on_each_node() {
    let collector = Collector::start().await;
    let (alice, bob) = traced_nodes(&collector.url, &format!("[{:?}]", stub()));

    let mut s = bob.connect("alice/svc");
    assert!(s.initialize().await.get("result").is_some());
    // A caller that decided not to sample this request (flags 00): neither node records it.
    let unsampled = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00";
    echo(
        &mut s,
        json!("call-0"),
        Some(json!({ "traceparent": unsampled })),
    )
    .await;
    echo(&mut s, json!("call-1"), None).await;

    let call = |spans: &[Received], instance: &str| {
        spans
            .iter()
            .find(|s| s.instance == instance && s.name == "tools/call echo")
            .cloned()
    };
    let spans = collector
        .until(|spans| call(spans, &alice.id).is_some() && call(spans, &bob.id).is_some())
        .await;
    let (serving, dialing) = (
        call(&spans, &alice.id).unwrap(),
        call(&spans, &bob.id).unwrap(),
    );
    for span in [&serving, &dialing] {
        assert!(span.parent.is_empty(), "a root span: {span:#?}");
        assert_eq!(span.attr("jsonrpc.request.id"), Some("call-1"));
        assert!(!span.error, "{span:#?}");
        assert_eq!(
            span.api_key.as_deref(),
            Some("team key"),
            "the collector's key was sent"
        );
    }
    assert_ne!(
        serving.trace_id, dialing.trace_id,
        "two traces of their own"
    );
    assert_eq!((serving.kind, dialing.kind), (SERVER, CLIENT));
    // Each node sends its spans in order: call-1's arrived, so call-0's would have.
    let unsampled_spans: Vec<&Received> = spans
        .iter()
        .filter(|s| s.attr("jsonrpc.request.id") == Some("call-0"))
        .collect();
    assert!(unsampled_spans.is_empty(), "{unsampled_spans:#?}");

    // `status` says where spans go and how many were sent.
    let status = alice.json(&["status"]);
    assert_eq!(
        status["traces"]["url"],
        format!("{}/v1/traces", collector.url)
    );
    assert!(status["traces"]["sent"].as_u64().unwrap() >= 2, "{status}");
    assert_eq!(status["traces"]["failed"], 0, "{status}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_collector_that_is_not_there_fails_no_call_and_is_reported() {
    // A port nothing listens on.
    let gone = format!("http://127.0.0.1:{}", free_port());
    let (alice, bob) = traced_nodes(&gone, &format!("[{:?}]", stub()));

    let mut s = bob.connect("alice/svc");
    assert!(s.initialize().await.get("result").is_some());
    // Answered while their spans fail to leave.
    for id in 0..20 {
        echo(&mut s, json!(id), None).await;
    }
    s.close_stdin();
    s.wait_eof().await;

    // The failure is seen: in `status`, and as a warning from `doctor`.
    assert!(
        eventually(ANSWER_TIMEOUT, || {
            alice.json(&["status"])["traces"]["failed"]
                .as_u64()
                .is_some_and(|n| n > 0)
        })
        .await,
        "{}",
        alice.json(&["status"])
    );
    let status = alice.json(&["status"]);
    assert_eq!(status["traces"]["sent"], 0, "{status}");
    assert!(status["traces"]["last_error"].is_string(), "{status}");
    let doctor = alice.cli(&["--json", "doctor", "--offline"]);
    let doctor: Value = serde_json::from_slice(&doctor.stdout).unwrap();
    let check = doctor["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["check"] == "traces")
        .cloned()
        .unwrap_or_else(|| panic!("a traces check: {doctor}"));
    assert_eq!(check["status"], "warn", "{check}");
    assert!(
        check["message"].as_str().unwrap().contains(&gone),
        "{check}"
    );
    // Stopping does not hang on the spans that cannot leave.
    let stop = std::time::Instant::now();
    alice.json(&["down"]);
    bob.json(&["down"]);
    assert!(
        stop.elapsed() < ANSWER_TIMEOUT,
        "stopped in {:?}",
        stop.elapsed()
    );
}
