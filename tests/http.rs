//! HTTP on both ends: a Streamable HTTP server shared with the `url` backend, and mounted
//! services served to HTTP clients by `mcpmesh gateway`. Third-party software (server-everything,
//! the official Python SDK, the official conformance suite) comes from `scripts/interop-deps`.

mod common;

use std::process::Stdio;
use std::time::Duration;

use common::*;
use serde_json::{Value, json};
use tokio::process::Command;

/// `mcpmesh gateway` for `node`, on a kernel-picked loopback port.
struct Gateway {
    _process: Started,
    base: String,
    /// What it printed once listening.
    ready: Value,
    /// The token its clients send: the one given with `--token`, else the node's own.
    token: Option<String>,
}

impl Gateway {
    async fn start(node: &TestNode, extra: &[&str]) -> Self {
        Gateway::start_env(node, extra, &[]).await
    }

    /// As [`Gateway::start`], with `envs` set for the gateway (the test-only knobs).
    async fn start_env(node: &TestNode, extra: &[&str], envs: &[(&str, &str)]) -> Self {
        let mut cmd = Command::new(MCPMESH);
        cmd.arg("--home")
            .arg(node.home())
            .args(["--json", "gateway", "--listen", "127.0.0.1:0"])
            .args(extra)
            .envs(envs.iter().copied())
            .env_remove("MCPMESH_GATEWAY_TOKEN");
        let (process, ready) = Started::until(&mut cmd, "listening").await;
        let ready: Value = serde_json::from_str(&ready).unwrap();
        let given = extra.iter().position(|a| *a == "--token");
        let token = match (given, ready["token_file"].as_str()) {
            (Some(at), _) => Some(extra[at + 1].to_owned()),
            (None, Some(file)) => Some(std::fs::read_to_string(file).unwrap().trim().to_owned()),
            (None, None) => None,
        };
        Gateway {
            _process: process,
            base: ready["url"].as_str().unwrap().to_owned(),
            ready,
            token,
        }
    }

    fn url(&self, target: &str) -> String {
        format!("{}/{target}", self.base)
    }

    /// An HTTP client that sends the gateway's token on every request.
    fn client(&self) -> reqwest::Client {
        http_client_with(self.token.as_deref())
    }

    /// The header the Python SDK clients send, as their `--header` option takes it.
    fn header_args(&self) -> Vec<String> {
        let token = self.token.as_deref().expect("a gateway with a token");
        vec!["--header".into(), format!("Authorization=Bearer {token}")]
    }
}

/// Waits until `node`'s catalog shows every one of `mounts` (the gateway's hub presents what
/// it shows).
async fn until_mounted(node: &TestNode, mounts: &[&str]) {
    let listed = || {
        let services = node.json(&["services", "--refresh"])["services"].clone();
        mounts.iter().all(|m| {
            services
                .as_array()
                .is_some_and(|s| s.iter().any(|e| e["mount"] == *m))
        })
    };
    assert!(
        eventually(Duration::from_secs(15), listed).await,
        "the catalog never showed {mounts:?}"
    );
}

/// `modern_client.py` in `era` against the gateway's hub over `alice/modern`'s checks.
fn modern_client_through_the_gateways_hub(gateway: &Gateway, era: &str) -> Vec<String> {
    let mut args = modern_client(era, false);
    args.extend(gateway.header_args());
    args.extend(["--name-prefix", "alice__modern__"].map(String::from));
    args.extend(
        [
            "--resource-uri",
            "mcpmesh-hub://alice/modern/mcpmesh://interop/hello",
        ]
        .map(String::from),
    );
    args.extend(["--url".into(), gateway.url("hub")]);
    args
}

/// An HTTP client for the tests (rustls needs its crypto provider named first).
fn http_client() -> reqwest::Client {
    http_client_with(None)
}

/// As [`http_client`], sending `Authorization: Bearer <token>` on every request when given.
fn http_client_with(token: Option<&str>) -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut headers = reqwest::header::HeaderMap::new();
    if let Some(token) = token {
        let value = format!("Bearer {token}").parse().unwrap();
        headers.insert(reqwest::header::AUTHORIZATION, value);
    }
    reqwest::Client::builder()
        .default_headers(headers)
        .build()
        .unwrap()
}

/// `initialize` as a 2025-11-25 client sends it.
fn initialize_request() -> Value {
    json!({ "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": { "protocolVersion": "2025-11-25", "capabilities": {},
                    "clientInfo": { "name": "t", "version": "1" } } })
}

/// A POST of `body` to `url` as a streamable-HTTP MCP client sends it, in session `sid` once
/// it has one.
fn mcp_post(
    http: &reqwest::Client,
    url: &str,
    body: &Value,
    sid: Option<&str>,
) -> reqwest::RequestBuilder {
    let r = http
        .post(url)
        .header("accept", "application/json, text/event-stream")
        .header("content-type", "application/json")
        .body(body.to_string());
    match sid {
        Some(sid) => r.header("mcp-session-id", sid),
        None => r,
    }
}

/// Alice serves the stub to bob, bob's gateway mounts it, and an HTTP client has opened a
/// session through it (initialized).
struct StubThroughGateway {
    // Fields drop in order: the gateway before the nodes.
    _gateway: Gateway,
    _nodes: (TestNode, TestNode),
    http: reqwest::Client,
    url: String,
    sid: String,
}

impl StubThroughGateway {
    async fn open(name: &str) -> Self {
        let (alice, bob) = two_nodes();
        alice.serve_stub("svc", &["bob"], None, &marker(name));
        let gateway = Gateway::start(&bob, &[]).await;
        let url = gateway.url("alice/svc");
        let http = gateway.client();
        let r = mcp_post(&http, &url, &initialize_request(), None)
            .send()
            .await
            .unwrap();
        let sid = r.headers()["mcp-session-id"].to_str().unwrap().to_owned();
        let note = json!({ "jsonrpc": "2.0", "method": "notifications/initialized" });
        mcp_post(&http, &url, &note, Some(&sid))
            .send()
            .await
            .unwrap();
        StubThroughGateway {
            _gateway: gateway,
            _nodes: (alice, bob),
            http,
            url,
            sid,
        }
    }

    /// POSTs `body` in the session and returns the response body, within the tests' bound.
    async fn exchange(&self, body: &Value) -> String {
        let exchange = async {
            let r = mcp_post(&self.http, &self.url, body, Some(&self.sid));
            r.send().await.unwrap().text().await.unwrap()
        };
        tokio::time::timeout(ANSWER_TIMEOUT, exchange)
            .await
            .unwrap_or_else(|_| panic!("no answer in time to {body}"))
    }
}

fn everything_client() -> String {
    interop_script("everything_client.py")
}

fn everything_stdio() -> Vec<String> {
    let index = deps().join("node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    vec!["node".into(), index.display().to_string(), "stdio".into()]
}

/// `node` serves stdio server-everything as `everything` to bob, with `options` before the
/// command.
fn serve_everything(node: &TestNode, options: &[&str]) {
    let command = everything_stdio();
    let mut backend = options.to_vec();
    backend.push("--");
    backend.extend(command.iter().map(String::as_str));
    node.serve("everything", &["bob"], &backend);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_streamable_http_server_is_shared_with_url_and_used_through_connect() {
    let mut server = EverythingHttp::start().await;
    let (alice, bob) = two_nodes_with(ROOM_FOR_A_WHOLE_CLIENT);
    alice.serve("web", &["bob"], &["--url", &server.url]);

    // The official SDK's client, over HTTP straight to the server, and over stdio through
    // `connect` → bob's node → alice's node → HTTP: the same checks, the same report. (The
    // big payload is 3 MiB both ways: server-everything refuses HTTP bodies over 4 MiB.)
    let big = "3145728".to_owned();
    let mut mesh = vec![
        everything_client(),
        "--big-bytes".into(),
        big.clone(),
        "--".into(),
    ];
    mesh.extend(connect_args(&bob, "alice/web"));
    let mesh = run_driver(&mesh).await;
    assert!(mesh.contains(r#"{"passed":32,"failed":0}"#), "{mesh}");
    // When the mesh session ended, alice's node ended the upstream session (DELETE).
    server
        .process
        .wait_for("Received session termination request")
        .await;

    let direct = [
        everything_client(),
        "--big-bytes".into(),
        big,
        "--url".into(),
        server.url.clone(),
    ];
    let direct = run_driver(&direct).await;
    assert_eq!(direct, mesh);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_gateway_serves_a_mounted_server_to_the_official_sdks_http_client() {
    let (alice, bob) = two_nodes_with(ROOM_FOR_A_WHOLE_CLIENT);
    serve_everything(&alice, &[]);
    let gateway = Gateway::start(&bob, &[]).await;

    // The SDK's Streamable HTTP client through the gateway, and its stdio client straight to
    // the server: the same 32 checks, the same report (a 4 MiB payload both ways).
    let mut via_gateway = vec![
        everything_client(),
        "--big-bytes".into(),
        "4194304".into(),
        "--url".into(),
        gateway.url("alice/everything"),
    ];
    via_gateway.extend(gateway.header_args());
    let mut direct = vec![everything_client(), "--".into()];
    direct.extend(everything_stdio());
    let (via_gateway, direct) = tokio::join!(run_driver(&via_gateway), run_driver(&direct));
    assert!(
        via_gateway.contains(r#"{"passed":32,"failed":0}"#),
        "{via_gateway}"
    );
    assert_eq!(direct, via_gateway);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_official_conformance_suite_passes_through_the_gateway_where_it_passes_directly() {
    let (alice, bob) = two_nodes_with(ROOM_FOR_A_WHOLE_CLIENT);
    // The suite opens a session per scenario and never ends one (no DELETE), so the service
    // gets room for all of them.
    serve_everything(&alice, &["--max-sessions", "64"]);
    let gateway = Gateway::start(&bob, &[]).await;

    let baseline = std::fs::read_to_string(interop_script("conformance-baseline.txt")).unwrap();
    let scenarios: Vec<&str> = baseline.split_whitespace().collect();
    assert!(scenarios.len() >= 10, "{baseline}");
    // The same scenarios against server-everything's own Streamable HTTP, in the same run.
    let direct = EverythingHttp::start().await;
    let token = gateway.token.clone().unwrap();
    let mounted = gateway.url("alice/everything");
    let (through, straight) = tokio::join!(
        conformance(&mounted, &scenarios, Some(&token)),
        conformance(&direct.url, &scenarios, None),
    );
    for scenario in scenarios {
        let pass = format!("pass {scenario}");
        assert!(
            straight.lines().any(|l| l == pass),
            "{scenario} no longer passes against server-everything directly; update the baseline:\n{straight}"
        );
        assert!(
            through.lines().any(|l| l == pass),
            "{scenario} passes against server-everything directly but not through the gateway:\n{through}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_conformance_suites_client_auth_scenarios_pass_with_the_node_as_the_client_wherever_the_sdks_own_client_passes()
 {
    // Every `auth/` client scenario of the official suite, twice in one run: the node as the
    // OAuth client (alice serves the scenario's server as a `url` service, bob's AI client
    // calls it, -32056 tells it to run `mcpmesh auth`), and the official Python SDK's own client.
    let sink = TelemetrySink::start().await;
    let (alice, bob) = watched_nodes(&sink, "");
    let python = python().display().to_string();
    let client = |role: &str| {
        format!(
            "{python} {} {role}",
            interop_script("conformance_client.py")
        )
    };
    let (as_mesh, as_sdk) = (client("mesh"), client("sdk"));
    let (mesh, sdk) = tokio::join!(
        client_conformance(&as_mesh, "auth/*", &alice, &bob),
        client_conformance(&as_sdk, "auth/*", &alice, &bob),
    );
    let verdicts = |run: &str| -> Vec<(String, bool)> {
        run.lines()
            .filter_map(|l| l.split_once(' '))
            .map(|(v, s)| (s.to_owned(), v == "pass"))
            .collect()
    };
    let (mesh, sdk) = (verdicts(&mesh), verdicts(&sdk));
    assert_eq!(mesh.len(), sdk.len(), "{mesh:?} {sdk:?}");
    assert!(
        mesh.len() >= 20,
        "the suite lists its auth scenarios: {mesh:?}"
    );
    println!("scenario | mesh node | Python SDK");
    for ((scenario, node), (_, own)) in mesh.iter().zip(&sdk) {
        let word = |pass: &bool| if *pass { "pass" } else { "fail" };
        println!("{scenario} | {} | {}", word(node), word(own));
    }
    for ((scenario, node), (_, own)) in mesh.iter().zip(&sdk) {
        assert!(
            *node || !own,
            "{scenario} passes with the SDK's own client but not with the node as the client"
        );
    }
    // The floor as of suite 0.1.16: all but the two neither client passes.
    let passed = mesh.iter().filter(|(_, pass)| *pass).count();
    assert!(passed >= 20, "{mesh:?}");

    // The scenarios' secrets, keys and tokens never reach the node's log, audit, status,
    // metrics page or traces.
    let secrets = [
        "pre-registered-secret",
        "conformance-test-secret",
        "test-token-",
        "cc-token-",
        "PRIVATE KEY",
    ];
    assert_kept_secret(&alice, &sink, &secrets).await;
}

/// Runs the conformance suite's client `scenarios` with `command` as the client under test
/// (`alice` serving, `bob` calling, for tests/interop/conformance_client.py's `mesh` role);
/// its verdict lines.
async fn client_conformance(
    command: &str,
    scenarios: &str,
    alice: &TestNode,
    bob: &TestNode,
) -> String {
    let out_dir = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(interop_script("conformance.sh"));
    cmd.arg("--client")
        .arg(command)
        .arg(out_dir.path())
        .env("CONFORMANCE_SCENARIOS", scenarios)
        .env("CONFORMANCE_BUDGET", "400")
        .env("MCPMESH_BIN", MCPMESH)
        .env("CONFORMANCE_SERVING_HOME", alice.home())
        .env("CONFORMANCE_CALLING_HOME", bob.home())
        .env("CONFORMANCE_CALLER", &bob.name)
        .env("CONFORMANCE_SERVING_PEER", &alice.name)
        .stdin(Stdio::null())
        .kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(450), cmd.output())
        .await
        .expect("the conformance run finishes in time")
        .unwrap();
    let verdicts = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    verdicts
}

/// Runs the conformance suite's `scenarios` against `url`; its verdict lines.
async fn conformance(url: &str, scenarios: &[&str], token: Option<&str>) -> String {
    let out_dir = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(interop_script("conformance.sh"));
    cmd.arg(url)
        .arg(out_dir.path())
        .env("CONFORMANCE_SCENARIOS", scenarios.join(" "))
        .stdin(Stdio::null())
        .kill_on_drop(true);
    if let Some(token) = token {
        cmd.env("CONFORMANCE_BEARER_TOKEN", token);
    }
    let out = tokio::time::timeout(Duration::from_secs(400), cmd.output())
        .await
        .expect("the conformance run finishes in time")
        .unwrap();
    let verdicts = String::from_utf8_lossy(&out.stdout).into_owned();
    println!("{url}:\n{verdicts}");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    verdicts
}

#[tokio::test(flavor = "multi_thread")]
async fn the_gateway_refuses_foreign_origins_and_hosts_and_a_delete_ends_the_remote_child() {
    let (alice, bob) = two_nodes();
    let m = marker("gateway-delete");
    alice.serve_stub("svc", &["bob"], None, &m);
    let gateway = Gateway::start(&bob, &[]).await;
    let url = gateway.url("alice/svc");
    let http = gateway.client();
    let initialize = initialize_request();
    let post = |body: &Value| mcp_post(&http, &url, body, None);

    // DNS rebinding: a page on a foreign origin, or a foreign Host, is refused before anything
    // reaches the mesh.
    let r = post(&initialize)
        .header("origin", "http://evil.example")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    let r = post(&initialize)
        .header("host", "evil.example:80")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    assert!(
        procs_with(&m).is_empty(),
        "nothing was spawned for a refused request"
    );

    // A session: initialize issues its id; requests without it, or with a made-up one, fail.
    let r = post(&initialize)
        .header("origin", "http://localhost:3000")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let sid = r.headers()["mcp-session-id"].to_str().unwrap().to_owned();
    let body = r.text().await.unwrap();
    assert!(body.contains(r#""serverInfo""#), "{body}");
    let note = json!({ "jsonrpc": "2.0", "method": "notifications/initialized" });
    let r = post(&note)
        .header("mcp-session-id", &sid)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    let list = json!({ "jsonrpc": "2.0", "id": "two", "method": "tools/list" });
    assert_eq!(post(&list).send().await.unwrap().status(), 400);
    let r = post(&list)
        .header("mcp-session-id", "no-such-session")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let r = post(&list)
        .header("mcp-session-id", &sid)
        .send()
        .await
        .unwrap();
    let body = r.text().await.unwrap();
    assert!(
        body.contains(r#""id":"two""#) && body.contains("whoami"),
        "{body}"
    );

    // DELETE ends the mesh session, and with it the server alice's node spawned for it.
    let children = procs_with(&m);
    assert_eq!(children.len(), 1, "{children:?}");
    let r = http
        .delete(&url)
        .header("mcp-session-id", &sid)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_child_ends(children[0].0, &m).await;
    let r = post(&list)
        .header("mcp-session-id", &sid)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_answer_cut_at_the_frame_cap_reaches_the_gateways_caller_as_an_error_for_its_request() {
    let g = StubThroughGateway::open("gateway-cut").await;

    // A 17 MiB answer passes through both nodes until the cap, where it is cut off; the HTTP
    // request it was answering gets the refusal as its answer instead of waiting forever.
    let big = json!({ "jsonrpc": "2.0", "id": "big", "method": "tools/call",
        "params": { "name": "blob", "arguments": { "bytes": 17 << 20 } } });
    let r = g.exchange(&big).await;
    let answer = r
        .lines()
        .map(|l| l.strip_prefix("data:").unwrap_or(l).trim())
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v["id"] == "big")
        .unwrap_or_else(|| panic!("no answer for the request in {} bytes", r.len()));
    assert_eq!(answer["error"]["code"], -32051, "{answer}");
    assert_eq!(answer["error"]["data"]["source"], "mcpmesh", "{answer}");

    // The session goes on.
    let list = json!({ "jsonrpc": "2.0", "id": "after", "method": "tools/list" });
    let body = g.exchange(&list).await;
    assert!(
        body.contains(r#""id":"after""#) && body.contains("blob"),
        "{body}"
    );
}

#[test]
fn a_gateway_beyond_loopback_needs_allow_remote_and_a_token() {
    let node = TestNode::start("solo");
    for args in [
        vec!["gateway", "--listen", "0.0.0.0:0"],
        vec![
            "gateway",
            "--listen",
            "0.0.0.0:0",
            "--allow-remote",
            "--no-token",
        ],
        vec![
            "gateway",
            "--listen",
            "0.0.0.0:0",
            "--token",
            "a-user-chosen-token-long-enough",
        ],
    ] {
        let out = node
            .command(&args)
            .env_remove("MCPMESH_GATEWAY_TOKEN")
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?} started");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("not a loopback address"), "{err}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn with_a_token_every_request_must_carry_it() {
    let (alice, bob) = two_nodes();
    let m = marker("gateway-token");
    alice.serve_stub("svc", &["bob"], None, &m);
    let gateway = Gateway::start(&bob, &["--token", "s3cret-t0ken-of-22-chars"]).await;
    let http = http_client();
    let ping = json!({ "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": { "protocolVersion": "2025-11-25", "capabilities": {},
                    "clientInfo": { "name": "t", "version": "1" } } });
    let send = |authorization: Option<&str>| {
        let mut r = http
            .post(gateway.url("alice/svc"))
            .header("accept", "application/json, text/event-stream")
            .body(ping.to_string());
        if let Some(a) = authorization {
            r = r.header("authorization", a);
        }
        r.send()
    };
    assert_eq!(send(None).await.unwrap().status(), 401);
    assert_eq!(send(Some("Bearer wrong")).await.unwrap().status(), 401);
    assert_eq!(
        send(Some("Basic s3cret-t0ken-of-22-chars"))
            .await
            .unwrap()
            .status(),
        401
    );
    assert_eq!(
        send(Some("Bearers3cret-t0ken-of-22-chars"))
            .await
            .unwrap()
            .status(),
        401
    );
    // The scheme is case-insensitive (RFC 9110 §11.1), and clients differ in how they write it.
    for header in [
        "Bearer s3cret-t0ken-of-22-chars",
        "bearer s3cret-t0ken-of-22-chars",
        "BEARER s3cret-t0ken-of-22-chars",
        "Bearer  s3cret-t0ken-of-22-chars",
    ] {
        assert_eq!(send(Some(header)).await.unwrap().status(), 200, "{header}");
    }
}

/// An `initialize` POST to `url`, with `Authorization: Bearer <token>` when given.
async fn initialize_with(url: &str, token: Option<&str>) -> reqwest::Response {
    let r = mcp_post(&http_client(), url, &initialize_request(), None);
    let r = match token {
        Some(t) => r.bearer_auth(t),
        None => r,
    };
    r.send().await.unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn without_token_flags_every_request_must_carry_this_nodes_own_token() {
    use std::os::unix::fs::PermissionsExt;
    let (alice, bob) = two_nodes();
    let m = marker("gateway-own-token");
    alice.serve_stub("svc", &["bob"], None, &m);
    let gateway = Gateway::start(&bob, &[]).await;
    let url = gateway.url("alice/svc");

    // Another local user does not know the token: refused before anything reaches the mesh.
    let r = initialize_with(&url, None).await;
    assert_eq!(r.status(), 401);
    assert_eq!(r.headers()["www-authenticate"], "Bearer");
    assert_eq!(initialize_with(&url, Some("wrong")).await.status(), 401);
    assert!(procs_with(&m).is_empty(), "nothing was spawned");

    // It says where the token is, never the token itself; the file is the user's alone.
    assert_eq!(gateway.ready["token_required"], true, "{}", gateway.ready);
    let file = gateway.ready["token_file"]
        .as_str()
        .expect("where the token is");
    let token = std::fs::read_to_string(file).unwrap().trim().to_owned();
    assert_eq!(token.len(), 43, "32 random bytes, URL-safe base64");
    assert!(!gateway.ready.to_string().contains(&token));
    let mode = std::fs::metadata(file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);

    // `use` hands out the same token: the URL, and the header to set.
    let used = bob.json(&["use", "alice/svc"]);
    assert_eq!(used["http_token"], token.as_str());
    assert_eq!(
        used["http_headers"]["Authorization"],
        format!("Bearer {token}")
    );
    let r = initialize_with(&url, used["http_token"].as_str()).await;
    assert_eq!(r.status(), 200);
    assert!(r.text().await.unwrap().contains(r#""serverInfo""#));

    // A restarted gateway keeps it, so the clients it was given to keep working.
    drop(gateway);
    let again = Gateway::start(&bob, &[]).await;
    assert_eq!(again.token.as_deref(), Some(token.as_str()));
    let r = initialize_with(&again.url("alice/svc"), Some(&token)).await;
    assert_eq!(r.status(), 200);
    assert!(!bob.log().contains(&token), "the token is not logged");
}

#[tokio::test(flavor = "multi_thread")]
async fn with_no_token_the_gateway_serves_loopback_without_one() {
    let (alice, bob) = two_nodes();
    alice.serve_stub("svc", &["bob"], None, &marker("gateway-no-token"));
    let gateway = Gateway::start(&bob, &["--no-token"]).await;
    assert_eq!(gateway.ready["token_required"], false, "{}", gateway.ready);
    assert!(
        gateway.ready.get("token_file").is_none(),
        "{}",
        gateway.ready
    );
    let r = initialize_with(&gateway.url("alice/svc"), None).await;
    assert_eq!(r.status(), 200);
    assert!(
        !bob.home().join("gateway.token").exists(),
        "none was minted"
    );
}

/// The official Python SDK's Streamable HTTP server (`http_server.py`: both MCP eras, bodies
/// up to 16 MiB), with its `request:` log lines kept.
struct SdkHttp {
    process: Started,
    url: String,
}

impl SdkHttp {
    async fn start() -> Self {
        SdkHttp::start_with(&[]).await
    }

    async fn start_with(args: &[&str]) -> Self {
        let mut cmd = Command::new(python());
        cmd.arg(interop_script("http_server.py")).args(args);
        let (process, ready) = Started::until(&mut cmd, "listening on").await;
        let url = ready.rsplit(' ').next().unwrap().to_owned();
        SdkHttp { process, url }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn both_mcp_eras_reach_an_sdk_http_server_through_url_with_the_callers_identity() {
    let mut server = SdkHttp::start().await;
    let (alice, bob) = two_nodes();
    alice.serve("sdk", &["bob"], &["--url", &server.url]);
    let peer =
        json!({ "eid": format!("eid:{}", bob.id), "groups": [], "name": "bob", "user_id": null });
    for era in ["modern", "legacy"] {
        let mut args = modern_client(era, true);
        args.push("--".into());
        args.extend(connect_args(&bob, "alice/sdk"));
        // This server escapes every non-ASCII character of its answers and returns the text
        // twice: 4 MiB of awkward UTF-8 would come back as ~46 MB, past the 16 MiB frame cap.
        let report = run_driver_with(&args, &[("INTEROP_BIG_MOSTLY_ASCII", "1")]).await;
        assert!(
            report.contains("ok   big 4194304 bytes echoed intact"),
            "{report}"
        );
        let whoami = whoami_in(&report);
        assert_eq!(whoami["meta_peer"], peer, "{era}");
    }
    // The 2026-07-28 requests carried their routing headers (the SDK's server insists: it
    // answers 400 without them), taken from each frame.
    let seen = server.process.drain().join("\n");
    for expected in [
        "mcp-method=server/discover mcp-name=- mcp-protocol-version=2026-07-28",
        "mcp-method=tools/call mcp-name=confirm mcp-protocol-version=2026-07-28",
        "mcp-method=resources/read mcp-name=mcpmesh://interop/hello mcp-protocol-version=2026-07-28",
    ] {
        assert!(seen.contains(expected), "{expected} not in:\n{seen}");
    }
    // And the handshake-era session was ended with a DELETE.
    assert!(seen.contains("request: DELETE"), "{seen}");
}

#[tokio::test(flavor = "multi_thread")]
async fn both_mcp_eras_pass_through_the_gateway() {
    let (alice, bob) = two_nodes();
    let py = python().display().to_string();
    let server = interop_script("modern_server.py");
    alice.serve("modern", &["bob"], &["--", &py, &server]);
    let gateway = Gateway::start(&bob, &[]).await;
    for era in ["modern", "legacy"] {
        let mut args = modern_client(era, true);
        args.extend(gateway.header_args());
        args.extend(["--url".into(), gateway.url("alice/modern")]);
        let report = run_driver(&args).await;
        assert!(
            report.contains("ok   big 4194304 bytes echoed intact"),
            "{report}"
        );
        // A 2026-07-28 request needs no session: the first frame is server/discover, and
        // the input_required round trip works (the retry meets the same server instance).
        if era == "modern" {
            assert_stateless_report(&report);
        }
        assert!(report.contains(r#""MCPMESH_PEER_NAME":"bob""#), "{report}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn both_mcp_eras_use_a_service_through_the_gateways_hub() {
    let (alice, bob) = two_nodes();
    let py = python().display().to_string();
    let server = interop_script("modern_server.py");
    alice.serve("modern", &["bob"], &["--", &py, &server]);
    // The gateway's hub presents what bob's catalog shows: wait until it shows the service.
    until_mounted(&bob, &["alice/modern"]).await;
    let gateway = Gateway::start(&bob, &[]).await;
    for era in ["modern", "legacy"] {
        let report = run_driver(&modern_client_through_the_gateways_hub(&gateway, era)).await;
        assert!(!report.contains("FAIL"), "{report}");
        // 2026-07-28 requests without a session share the gateway's one hub, which speaks
        // that era to them (typed results, the input_required round trip passed through).
        if era == "modern" {
            assert_stateless_report(&report);
        }
        assert!(report.contains(r#""MCPMESH_PEER_NAME":"bob""#), "{report}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_2026_07_28_client_over_http_answers_a_2025_servers_elicitation_and_sampling_through_the_gateways_hub()
 {
    let (alice, bob) = two_nodes_with(ROOM_FOR_A_WHOLE_CLIENT);
    let index = deps()
        .join("node_modules/@modelcontextprotocol/server-everything/dist/index.js")
        .display()
        .to_string();
    alice.serve("everything", &["bob"], &["--", "node", &index, "stdio"]);
    until_mounted(&bob, &["alice/everything"]).await;
    let gateway = Gateway::start(&bob, &[]).await;
    // Sessionless requests: the call, and its retry with the client's answers, meet the one
    // hub the gateway keeps for them, which holds the server's call in between.
    let mut args = vec![interop_script("bridge_client.py")];
    args.extend(gateway.header_args());
    args.extend(["--url".into(), gateway.url("hub")]);
    args.push("alice__everything__trigger-elicitation-request".into());
    args.push(
        r#"alice__everything__trigger-sampling-request={"prompt":"six times seven?","maxTokens":10}"#
            .into(),
    );
    let report = run_driver(&args).await;
    assert!(report.contains(r#""era": "2026-07-28""#), "{report}");
    assert!(report.contains("- Name: Ada Bridge"), "{report}");
    assert!(report.contains("forty-two"), "{report}");
    assert!(!report.contains(r#""is_error": true"#), "{report}");
}

/// An upstream (HTTP/1.1, kept alive) that drops the connection of the first `tools/call` it
/// reads without answering, as a server closing an idle kept-alive connection does to a
/// request that arrives at that moment; everything else is answered. It prints each request's
/// method and whether it was dropped.
const CLOSING_UPSTREAM: &str = r#"
import http.server, json, sys, threading
dropped = []
lock = threading.Lock()
def say(text):
    with lock:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_POST(self):
        msg = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))))
        method = msg.get("method")
        with lock:
            drop = method == "tools/call" and not dropped
            if drop:
                dropped.append(1)
        if drop:
            say("dropped " + method)
            self.close_connection = True
            return
        say("answered " + str(method))
        if "id" not in msg:
            self.send_response(202)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if method == "initialize":
            result = {"protocolVersion": "2025-11-25", "capabilities": {"tools": {}},
                      "serverInfo": {"name": "closing", "version": "1"}}
        else:
            result = {"content": [{"type": "text", "text": "answered"}]}
        body = json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": result}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
s = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
print("listening", s.server_address[1], flush=True)
s.serve_forever()
"#;

#[tokio::test(flavor = "multi_thread")]
async fn a_request_on_a_connection_the_upstream_closes_unanswered_goes_once_more_on_a_new_one() {
    let mut cmd = Command::new("python3");
    cmd.args(["-c", CLOSING_UPSTREAM]);
    let (mut upstream, ready) = Started::until(&mut cmd, "listening").await;
    let port = ready.split(' ').nth(1).unwrap().to_owned();
    let (alice, bob) = two_nodes();
    alice.serve(
        "closing",
        &["bob"],
        &["--url", &format!("http://127.0.0.1:{port}/mcp")],
    );
    let mut s = bob.connect("alice/closing");
    s.initialize().await;
    let answer = s
        .request("tools/call", json!({ "name": "x", "arguments": {} }))
        .await;
    assert_eq!(
        answer["result"]["content"][0]["text"], "answered",
        "{answer}"
    );
    assert_eq!(upstream.wait_for("dropped").await, "dropped tools/call");
    assert_eq!(
        upstream.wait_for("answered tools").await,
        "answered tools/call"
    );
}

/// An upstream that answers every POST `429 Too Many Requests` with `Retry-After: 2` and
/// prints the `Authorization` header it was sent.
const BUSY_UPSTREAM: &str = r#"
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", 0)))
        print("auth:", self.headers.get("authorization"), flush=True)
        self.send_response(429)
        self.send_header("Retry-After", "2")
        self.send_header("Content-Length", "0")
        self.end_headers()
    def log_message(self, *a):
        pass
s = http.server.HTTPServer(("127.0.0.1", 0), H)
print("listening", s.server_address[1], flush=True)
s.serve_forever()
"#;

#[tokio::test(flavor = "multi_thread")]
async fn upstream_failures_become_errors_of_the_band_and_header_secrets_stay_out_of_logs() {
    let mut cmd = Command::new("python3");
    cmd.args(["-c", BUSY_UPSTREAM]);
    let (mut upstream, ready) = Started::until(&mut cmd, "listening").await;
    let port = ready.split(' ').nth(1).unwrap().to_owned();

    // The token lives in the serving node's environment; config names it.
    let alice = TestNode::start_with("alice", "", &[("UPSTREAM_TOKEN", "s3cret-t0ken")]);
    let bob = TestNode::start("bob");
    alice.trust(&bob);
    bob.trust(&alice);
    let busy = format!("http://127.0.0.1:{port}/mcp");
    alice.serve(
        "busy",
        &["bob"],
        &[
            "--url",
            &busy,
            "--header",
            "Authorization=Bearer ${UPSTREAM_TOKEN}",
        ],
    );
    let gone = format!("http://127.0.0.1:{}/mcp", free_port());
    alice.serve("gone", &["bob"], &["--url", &gone]);

    let init = json!({ "protocolVersion": "2025-11-25", "capabilities": {},
                       "clientInfo": { "name": "t", "version": "1" } });
    let mut s = bob.connect("alice/busy");
    let answer = s.request("initialize", init.clone()).await;
    assert_eq!(answer["error"]["code"], -32053, "{answer}");
    assert_eq!(answer["error"]["data"]["retry_after_ms"], 2000, "{answer}");
    assert_eq!(answer["error"]["data"]["source"], "mcpmesh", "{answer}");
    assert_eq!(
        upstream.wait_for("auth:").await,
        "auth: Bearer s3cret-t0ken"
    );

    let mut s = bob.connect("alice/gone");
    let answer = s.request("initialize", init).await;
    assert_eq!(answer["error"]["code"], -32055, "{answer}");

    assert!(
        !alice.log().contains("s3cret-t0ken"),
        "the header value reached the log"
    );
    let config = std::fs::read_to_string(alice.home().join("config.toml")).unwrap();
    assert!(
        config.contains("${UPSTREAM_TOKEN}") && !config.contains("s3cret"),
        "{config}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn progress_reaches_the_stream_of_the_request_that_asked_for_it_not_the_get_stream() {
    let g = StubThroughGateway::open("gateway-progress").await;
    // A GET stream is open: messages tied to no request go there, progress does not.
    let get = g
        .http
        .get(&g.url)
        .header("accept", "text/event-stream")
        .header("mcp-session-id", &g.sid)
        .send()
        .await
        .unwrap();
    assert_eq!(get.status(), 200);

    let call = json!({ "jsonrpc": "2.0", "id": 7, "method": "tools/call",
        "params": { "name": "echo", "arguments": { "text": "hi" },
                    "_meta": { "progressToken": "p-7" } } });
    let body = g.exchange(&call).await;
    let events: Vec<Value> = body
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .filter_map(|l| serde_json::from_str(l.trim()).ok())
        .collect();
    assert_eq!(events.len(), 2, "progress, then the answer: {body}");
    assert_eq!(events[0]["method"], "notifications/progress", "{body}");
    assert_eq!(events[0]["params"]["progressToken"], "p-7", "{body}");
    assert_eq!(events[1]["id"], 7, "{body}");
    assert_eq!(events[1]["result"]["content"][0]["text"], "hi", "{body}");
    drop(get);
}

/// Reads one HTTP/1.1 response (head, then a `Content-Length` body) from a raw connection.
async fn read_response(tcp: &mut tokio::net::TcpStream) -> (String, String) {
    use tokio::io::AsyncReadExt;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let text = String::from_utf8_lossy(&buf).into_owned();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length = head
                .lines()
                .find_map(|l| {
                    let (name, value) = l.split_once(':')?;
                    name.eq_ignore_ascii_case("content-length")
                        .then(|| value.trim().parse::<usize>().ok())?
                })
                .unwrap_or(0);
            if body.len() >= length {
                return (head.to_owned(), body.to_owned());
            }
        }
        let n = tcp.read(&mut chunk).await.unwrap();
        assert!(
            n > 0,
            "the connection closed before a whole response: {text}"
        );
        buf.extend_from_slice(&chunk[..n]);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_body_past_the_frame_cap_is_refused_at_once_with_the_frame_cap_error() {
    use tokio::io::AsyncWriteExt;
    let (alice, bob) = two_nodes();
    alice.serve_stub("svc", &["bob"], None, &marker("gateway-413"));
    let gateway = Gateway::start(&bob, &[]).await;
    let url = gateway.url("alice/svc");
    let token = gateway.token.clone().unwrap();
    let host = url
        .strip_prefix("http://")
        .and_then(|rest| rest.split('/').next())
        .unwrap()
        .to_owned();

    // A 20 MB body: 413 with the mesh's frame-cap error, as JSON-RPC.
    let big = vec![b' '; 20_000_000];
    let sent = mcp_post(&gateway.client(), &url, &json!({}), None)
        .body(big)
        .send();
    let r = tokio::time::timeout(ANSWER_TIMEOUT, sent)
        .await
        .expect("an answer to a 20 MB POST in time")
        .unwrap();
    assert_eq!(r.status(), 413);
    let body = r.text().await.unwrap();
    let answer: Value = serde_json::from_str(&body).unwrap_or_else(|_| panic!("{body}"));
    assert_eq!(answer["error"]["code"], -32051, "{answer}");
    assert_eq!(answer["error"]["data"]["source"], "mcpmesh", "{answer}");

    // A Content-Length far past the cap and no body at all: refused at once, not waited on.
    let mut tcp = tokio::net::TcpStream::connect(&host).await.unwrap();
    let head = format!(
        "POST /mcp/alice/svc HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {token}\r\n\
         Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n\
         Content-Length: 99999999999\r\n\r\n"
    );
    tcp.write_all(head.as_bytes()).await.unwrap();
    let (head, body) = tokio::time::timeout(Duration::from_secs(5), read_response(&mut tcp))
        .await
        .expect("a prompt answer to a Content-Length past the cap");
    assert!(head.starts_with("HTTP/1.1 413"), "{head}");
    let answer: Value = serde_json::from_str(&body).unwrap_or_else(|_| panic!("{body}"));
    assert_eq!(answer["error"]["code"], -32051, "{answer}");
}

/// Opens an HTTP session at `url` (initialize, initialized) with a client of its own, and
/// returns the session id.
async fn open_http_session(gateway: &Gateway, url: &str) -> String {
    let http = gateway.client();
    let r = tokio::time::timeout(
        ANSWER_TIMEOUT,
        mcp_post(&http, url, &initialize_request(), None).send(),
    )
    .await
    .expect("an answer to initialize in time")
    .unwrap();
    assert_eq!(r.status(), 200);
    let sid = r
        .headers()
        .get("mcp-session-id")
        .map(|v| v.to_str().unwrap().to_owned());
    let body = r.text().await.unwrap();
    assert!(body.contains(r#""serverInfo""#), "{body}");
    let sid = sid.unwrap_or_else(|| panic!("no session id with {body}"));
    let note = json!({ "jsonrpc": "2.0", "method": "notifications/initialized" });
    let r = mcp_post(&http, url, &note, Some(&sid))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    sid
}

#[tokio::test(flavor = "multi_thread")]
async fn abandoned_gateway_sessions_give_way_to_a_new_client_at_the_services_limit() {
    let (alice, bob) = two_nodes();
    let m = marker("gateway-abandoned");
    alice.serve_stub("svc", &["bob"], Some(4), &m);
    let gateway = Gateway::start(&bob, &[]).await;
    let url = gateway.url("alice/svc");

    // Four clients initialize and go away without DELETE, as the Inspector CLI does.
    let first = open_http_session(&gateway, &url).await;
    let children = procs_with(&m);
    assert_eq!(children.len(), 1, "{children:?}");
    for _ in 0..3 {
        open_http_session(&gateway, &url).await;
    }
    // A fifth is still served: the longest-idle session gave way, and its child with it.
    open_http_session(&gateway, &url).await;
    assert_child_ends(children[0].0, &m).await;
    let list = json!({ "jsonrpc": "2.0", "id": 2, "method": "tools/list" });
    let r = mcp_post(&gateway.client(), &url, &list, Some(&first))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_idle_gateway_session_is_reaped_and_a_refused_initialize_gets_no_session_id() {
    let (alice, bob) = two_nodes();
    let m = marker("gateway-idle");
    alice.serve_stub("svc", &["bob"], Some(1), &m);
    let gateway = Gateway::start(&bob, &["--idle", "1"]).await;
    let url = gateway.url("alice/svc");
    let http = gateway.client();

    // A session with its GET stream open is in use, however long: a second client finds the
    // service at its limit, and the refusal names no session.
    let sid = open_http_session(&gateway, &url).await;
    let children = procs_with(&m);
    assert_eq!(children.len(), 1, "{children:?}");
    let stream = http
        .get(&url)
        .header("accept", "text/event-stream")
        .header("mcp-session-id", &sid)
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), 200);
    let r = mcp_post(&http, &url, &initialize_request(), None)
        .send()
        .await
        .unwrap();
    assert!(r.headers().get("mcp-session-id").is_none(), "{r:?}");
    let body = r.text().await.unwrap();
    assert!(body.contains("-32053"), "{body}");
    let r = mcp_post(
        &http,
        &gateway.url("alice/nosuch"),
        &initialize_request(),
        None,
    )
    .send()
    .await
    .unwrap();
    assert!(r.headers().get("mcp-session-id").is_none(), "{r:?}");
    let body = r.text().await.unwrap();
    assert!(body.contains("-32054"), "{body}");

    // Its client goes away without DELETE: once idle for a second, the session ends, and its
    // child with it.
    drop(stream);
    assert!(
        wait_exit(children[0].0, ANSWER_TIMEOUT).await,
        "the idle session's child is still running"
    );
    let list = json!({ "jsonrpc": "2.0", "id": 2, "method": "tools/list" });
    let r = mcp_post(&http, &url, &list, Some(&sid))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let body = r.text().await.unwrap();
    let answer: Value = serde_json::from_str(&body).unwrap_or_else(|_| panic!("{body}"));
    assert_eq!(answer["error"]["code"], -32058, "{answer}");
    assert_eq!(answer["id"], 2, "{answer}");
}

/// What [`SlowUpstream`] has seen.
#[derive(Default)]
struct UpstreamCounts {
    /// POSTs it holds open now, and the most it held at once.
    open: std::sync::atomic::AtomicUsize,
    /// POSTs of notifications open now, and the most at once.
    notes_open: std::sync::atomic::AtomicUsize,
    notes_peak: std::sync::atomic::AtomicUsize,
    notes: std::sync::atomic::AtomicUsize,
    /// The caller's answers to the server that reached it.
    answers: std::sync::atomic::AtomicUsize,
}

/// A Streamable HTTP MCP server on loopback, written for these tests: it answers `initialize`
/// and the `echo` tool at once, never answers the `hang` tool (holding the POST until its
/// client goes away), holds each notification a little, and counts what it holds.
struct SlowUpstream {
    url: String,
    counts: std::sync::Arc<UpstreamCounts>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for SlowUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl SlowUpstream {
    async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/mcp", listener.local_addr().unwrap());
        let counts = std::sync::Arc::new(UpstreamCounts::default());
        let shared = counts.clone();
        let task = tokio::spawn(async move {
            let mut connections = tokio::task::JoinSet::new();
            while let Ok((tcp, _)) = listener.accept().await {
                connections.spawn(Self::connection(tcp, shared.clone()));
            }
        });
        SlowUpstream { url, counts, task }
    }

    fn count(&self, of: impl Fn(&UpstreamCounts) -> &std::sync::atomic::AtomicUsize) -> usize {
        of(&self.counts).load(std::sync::atomic::Ordering::SeqCst)
    }

    /// One connection's requests, one after another (HTTP/1.1 keep-alive).
    async fn connection(mut tcp: tokio::net::TcpStream, counts: std::sync::Arc<UpstreamCounts>) {
        use std::sync::atomic::Ordering::SeqCst;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut buf = Vec::new();
        let mut chunk = [0u8; 8192];
        loop {
            let (head, body) = loop {
                if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                    let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                    let length = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .and_then(|v| v.trim().parse::<usize>().ok())
                        .unwrap_or(0);
                    if buf.len() >= end + 4 + length {
                        let body = buf[end + 4..end + 4 + length].to_vec();
                        buf.drain(..end + 4 + length);
                        break (head, body);
                    }
                }
                match tcp.read(&mut chunk).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            };
            let reply = |status: &str, body: &str| {
                format!(
                    "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                    body.len()
                )
            };
            if !head.starts_with("post") {
                // No GET stream here; DELETE is never needed (no session id is issued).
                let _ = tcp
                    .write_all(reply("405 Method Not Allowed", "").as_bytes())
                    .await;
                continue;
            }
            let message: Value = serde_json::from_slice(&body).unwrap_or_default();
            counts.open.fetch_add(1, SeqCst);
            let answer = match (
                message["method"].as_str(),
                message["params"]["name"].as_str(),
            ) {
                (Some("initialize"), _) => Some(json!({ "jsonrpc": "2.0", "id": message["id"],
                    "result": { "protocolVersion": "2025-11-25", "capabilities": { "tools": {} },
                                "serverInfo": { "name": "slow", "version": "1" } } })),
                (Some("notifications/initialized"), _) => None,
                (Some("tools/call"), Some("hang")) => {
                    // Held until the client goes away.
                    while matches!(tcp.read(&mut chunk).await, Ok(n) if n > 0) {}
                    counts.open.fetch_sub(1, SeqCst);
                    return;
                }
                (Some(_), _) if message.get("id").is_some() => Some(json!({ "jsonrpc": "2.0",
                    "id": message["id"], "result": { "content": [] } })),
                (Some(_), _) => {
                    let now = counts.notes_open.fetch_add(1, SeqCst) + 1;
                    counts.notes_peak.fetch_max(now, SeqCst);
                    // Some work, so that POSTs that may overlap do.
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    counts.notes_open.fetch_sub(1, SeqCst);
                    counts.notes.fetch_add(1, SeqCst);
                    None
                }
                (None, _) => {
                    counts.answers.fetch_add(1, SeqCst);
                    None
                }
            };
            let response = match answer {
                Some(answer) => reply("200 OK", &answer.to_string()),
                None => reply("202 Accepted", ""),
            };
            counts.open.fetch_sub(1, SeqCst);
            if tcp.write_all(response.as_bytes()).await.is_err() {
                return;
            }
        }
    }
}

/// Alice serves `upstream` as `quick` (silent upstreams given up on after a second), `slow`
/// (after ten minutes) and `strict` (five requests a minute), with at most four requests in
/// flight per session; bob trusts her.
fn serve_slow_upstream(upstream: &SlowUpstream) -> (TestNode, TestNode) {
    let url = &upstream.url;
    let config = format!(
        "[limits]\nmax_in_flight = 4\nrequest_timeout_secs = 1\n\n\
         [services.quick]\nurl = \"{url}\"\nallow = [\"bob\"]\n\n\
         [services.slow]\nurl = \"{url}\"\nallow = [\"bob\"]\nrequest_timeout_secs = 600\n\n\
         [services.strict]\nurl = \"{url}\"\nallow = [\"bob\"]\nrate_limit_per_min = 5\n"
    );
    let alice = TestNode::start_with("alice", &config, &[]);
    let bob = TestNode::start("bob");
    alice.trust(&bob);
    bob.trust(&alice);
    (alice, bob)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_silent_url_upstream_is_given_up_on_and_its_post_dropped() {
    let upstream = SlowUpstream::start().await;
    let (_alice, bob) = serve_slow_upstream(&upstream);

    // A request the upstream never answers gets the mesh's error once the timeout passes,
    // and its POST is dropped.
    let mut quick = bob.connect("alice/quick");
    quick.initialize().await;
    let answer = quick.call("hang", json!({})).await;
    assert_eq!(answer["error"]["code"], -32055, "{answer}");
    assert_eq!(answer["error"]["data"]["source"], "mcpmesh", "{answer}");
    let message = answer["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("did not answer within 1 s"), "{answer}");
    assert!(
        eventually(ANSWER_TIMEOUT, || upstream.count(|c| &c.open) == 0).await,
        "a timed-out POST is still open at the upstream"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_session_whose_caller_is_killed_while_its_request_hangs_takes_the_post_with_it() {
    let upstream = SlowUpstream::start().await;
    let (_alice, bob) = serve_slow_upstream(&upstream);
    let mut slow = bob.connect("alice/slow");
    slow.initialize().await;
    slow.send(&json!({ "jsonrpc": "2.0", "id": 9, "method": "tools/call",
                       "params": { "name": "hang", "arguments": {} } }))
        .await;
    assert!(
        eventually(ANSWER_TIMEOUT, || upstream.count(|c| &c.open) == 1).await,
        "the request never reached the upstream"
    );
    // The client goes away (closing its input alone would wait for the owed answer, up to
    // this service's 600 s request timeout).
    slow.child.start_kill().unwrap();
    slow.wait_eof().await;
    assert!(
        eventually(ANSWER_TIMEOUT, || upstream.count(|c| &c.open) == 0).await,
        "{} POSTs are still open at the upstream after the session ended",
        upstream.count(|c| &c.open)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_url_service_bounds_the_posts_in_flight_and_counts_only_the_callers_requests() {
    let upstream = SlowUpstream::start().await;
    let (_alice, bob) = serve_slow_upstream(&upstream);

    // Forty notifications at once: never more than the session's bound in flight upstream.
    let mut quick = bob.connect("alice/quick");
    quick.initialize().await;
    for n in 0..40 {
        quick
            .send(
                &json!({ "jsonrpc": "2.0", "method": "notifications/message",
                           "params": { "level": "info", "data": n } }),
            )
            .await;
    }
    assert!(
        eventually(ANSWER_TIMEOUT, || upstream.count(|c| &c.notes) == 40).await,
        "{} of 40 notifications reached the upstream",
        upstream.count(|c| &c.notes)
    );
    let peak = upstream.count(|c| &c.notes_peak);
    assert!(peak <= 4, "{peak} notifications were in flight at once");

    // The caller's answers to the server are not counted against its rate (five requests a
    // minute here, one gone on opening the session and one on initialize): all ten reach the
    // upstream, and the caller still has its three requests.
    let mut strict = bob.connect("alice/strict");
    strict.initialize().await;
    for n in 0..10 {
        strict
            .send(&json!({ "jsonrpc": "2.0", "id": format!("s{n}"), "result": {} }))
            .await;
    }
    for _ in 0..3 {
        let answer = strict.call("echo", json!({})).await;
        assert!(answer.get("result").is_some(), "{answer}");
    }
    let answer = strict.call("echo", json!({})).await;
    assert_eq!(answer["error"]["code"], -32053, "{answer}");
    assert!(
        eventually(ANSWER_TIMEOUT, || upstream.count(|c| &c.answers) == 10).await,
        "{} of the caller's 10 answers reached the upstream",
        upstream.count(|c| &c.answers)
    );
    strict.close_stdin();
    strict.wait_eof().await;
}

/// The JSON-RPC answer in a gateway response body, sent as JSON or as SSE events.
fn answer_in(body: &str) -> Value {
    let answer = |text: &str| {
        serde_json::from_str::<Value>(text.trim())
            .ok()
            .filter(|v| v.get("id").is_some() && v.get("method").is_none())
    };
    answer(body)
        .or_else(|| {
            body.lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .find_map(answer)
        })
        .unwrap_or_else(|| panic!("no answer in {body:?}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn the_gateways_hub_serves_the_paired_services_with_its_token_and_a_delete_ends_their_sessions()
 {
    // Bob's node mounts alice's stub by pairing, as the hub's services come.
    let alice = TestNode::start("alice");
    let bob = TestNode::start("bob");
    let m = marker("gateway-hub");
    alice.serve_stub("stub", &[], None, &m);
    let invite = alice.json(&["invite", "stub"])["invite"]
        .as_str()
        .unwrap()
        .to_owned();
    bob.json(&["pair", &invite]);
    // Just after a pairing bob's node may still hold a failed check of alice for a few
    // seconds, and a hub lists no peer out of reach.
    let reachable = || bob.json(&["peers"])["peers"][0]["reachable"] == true;
    assert!(eventually(Duration::from_secs(15), reachable).await);
    let gateway = Gateway::start(&bob, &[]).await;
    let url = gateway.url("hub");
    assert!(url.ends_with("/mcp/hub"), "{url}");

    // Like every path of the gateway, the hub's needs the token.
    assert_eq!(initialize_with(&url, None).await.status(), 401);
    assert_eq!(initialize_with(&url, Some("wrong")).await.status(), 401);

    let http = gateway.client();
    let exchange = |body: Value, sid: Option<String>| {
        let r = mcp_post(&http, &url, &body, sid.as_deref());
        async move {
            let r = tokio::time::timeout(ANSWER_TIMEOUT, r.send())
                .await
                .expect("an answer in time")
                .unwrap();
            let sid = r
                .headers()
                .get("mcp-session-id")
                .map(|v| v.to_str().unwrap().to_owned());
            let status = r.status();
            (status, sid, r.text().await.unwrap())
        }
    };
    let (status, sid, body) = exchange(initialize_request(), None).await;
    assert_eq!(status, 200, "{body}");
    let sid = sid.expect("a session id");
    assert_eq!(
        answer_in(&body)["result"]["serverInfo"]["name"],
        "mcpmesh-hub",
        "{body}"
    );
    let note = json!({ "jsonrpc": "2.0", "method": "notifications/initialized" });
    let (status, _, _) = exchange(note, Some(sid.clone())).await;
    assert_eq!(status, 202);

    let list = json!({ "jsonrpc": "2.0", "id": 2, "method": "tools/list" });
    let (_, _, body) = exchange(list, Some(sid.clone())).await;
    let tools: Vec<String> = answer_in(&body)["result"]["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("no tools: {body}"))
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_owned())
        .collect();
    for tool in ["alice__stub__echo", "alice__stub__whoami"] {
        assert!(tools.iter().any(|t| t == tool), "{tools:?} {body}");
    }
    let call = json!({ "jsonrpc": "2.0", "id": 3, "method": "tools/call",
        "params": { "name": "alice__stub__echo", "arguments": { "text": "via /mcp/hub" } } });
    let (_, _, body) = exchange(call, Some(sid.clone())).await;
    assert_eq!(
        answer_in(&body)["result"]["content"][0]["text"],
        "via /mcp/hub",
        "{body}"
    );
    let sessions = |node: &TestNode| {
        node.json(&["status"])["sessions"]
            .as_array()
            .map_or(0, Vec::len)
    };
    assert_eq!(sessions(&alice), 1);

    // DELETE ends the HTTP session's hub, and with it its session at alice's node.
    let r = http
        .delete(&url)
        .header("mcp-session-id", &sid)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let ended = eventually(Duration::from_secs(15), || sessions(&alice) == 0).await;
    assert!(ended, "alice still has {} sessions", sessions(&alice));
    let gone = eventually(Duration::from_secs(15), || {
        procs_with(&m).iter().all(|(_, state)| *state == 'Z')
    })
    .await;
    assert!(gone, "the stub still runs: {:?}", procs_with(&m));
}

/// The answer (the last JSON message) in a response body, SSE or JSON.
fn last_message(body: &str) -> Value {
    body.lines()
        .rev()
        .find_map(|l| {
            serde_json::from_str::<Value>(l.strip_prefix("data:").unwrap_or(l).trim()).ok()
        })
        .unwrap_or_else(|| panic!("no message in {body:?}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_initializes_never_take_the_gateway_past_its_session_cap() {
    let (alice, bob) = two_nodes();
    alice.serve_stub("svc", &["bob"], Some(16), &marker("gateway-session-cap"));
    let gateway =
        Gateway::start_env(&bob, &[], &[("MCPMESH_TEST_GATEWAY_MAX_SESSIONS", "2")]).await;
    let (url, http) = (gateway.url("alice/svc"), gateway.client());

    // An initialize that fails gives its place back.
    for _ in 0..3 {
        let r = mcp_post(
            &http,
            &gateway.url("alice/nothing"),
            &initialize_request(),
            None,
        )
        .send()
        .await
        .unwrap();
        assert!(r.headers().get("mcp-session-id").is_none());
        let body = r.text().await.unwrap();
        assert!(body.contains("-32054"), "{body}");
    }

    let initialize = || async {
        let r = mcp_post(&http, &url, &initialize_request(), None)
            .send()
            .await
            .unwrap();
        let status = r.status();
        let sid = r
            .headers()
            .get("mcp-session-id")
            .map(|v| v.to_str().unwrap().to_owned());
        (status, sid, r.text().await.unwrap())
    };
    let answers = tokio::time::timeout(
        ANSWER_TIMEOUT,
        futures_util::future::join_all((0..6).map(|_| initialize())),
    )
    .await
    .expect("every initialize answered in time");
    let opened: Vec<&String> = answers
        .iter()
        .filter_map(|(_, sid, _)| sid.as_ref())
        .collect();
    assert_eq!(
        opened.len(),
        2,
        "sessions opened past a cap of 2: {answers:?}"
    );
    for (status, sid, body) in &answers {
        if sid.is_none() {
            assert_eq!(*status, 503, "{body}");
            let e = last_message(body);
            assert_eq!(e["error"]["code"], -32053, "{body}");
            assert_eq!(e["error"]["data"]["source"], "mcpmesh", "{body}");
        }
    }

    // Ending a session makes room for a new one.
    let r = http
        .delete(&url)
        .header("mcp-session-id", opened[0].as_str())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let (status, sid, body) = initialize().await;
    assert!(status == 200 && sid.is_some(), "{status} {body}");
}

#[tokio::test(flavor = "multi_thread")]
async fn sessionless_requests_with_the_same_id_each_get_their_own_answer_under_their_own_id() {
    let (alice, bob) = two_nodes();
    alice.serve_stub("svc", &["bob"], None, &marker("gateway-same-id"));
    // The gateway pauses between finding the shared session and registering a request there,
    // so both requests are on their way at once.
    let gateway = Gateway::start_env(
        &bob,
        &[],
        &[("MCPMESH_TEST_GATEWAY_REGISTER_DELAY_MS", "300")],
    )
    .await;
    let (url, http) = (gateway.url("alice/svc"), gateway.client());
    // The same id, spelled with an escape: each caller must get it back exactly as it wrote it.
    let call = |text: &str| {
        format!(
            r#"{{"jsonrpc":"2.0","id":"a\u0062","method":"tools/call","params":{{"name":"echo","arguments":{{"text":"{text}"}},"_meta":{{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}}}}"#
        )
    };
    let post = |body: String| {
        let http = http.clone();
        let url = url.clone();
        async move {
            let r = http
                .post(&url)
                .header("accept", "application/json")
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await
                .unwrap();
            assert!(r.headers().get("mcp-session-id").is_none());
            r.text().await.unwrap()
        }
    };
    // The first request opens the service's shared mesh session.
    let first = tokio::time::timeout(ANSWER_TIMEOUT, post(call("first")))
        .await
        .expect("an answer in time");
    assert!(first.contains("first"), "{first}");

    let (a, b) = tokio::time::timeout(
        ANSWER_TIMEOUT,
        futures_util::future::join(post(call("from A")), post(call("from B"))),
    )
    .await
    .expect("both answered in time");
    for (body, mine, theirs) in [(&a, "from A", "from B"), (&b, "from B", "from A")] {
        assert!(body.contains(mine) && !body.contains(theirs), "{body}");
        assert!(body.contains(r#""id":"a\u0062""#), "{body}");
    }
    assert!(first.contains(r#""id":"a\u0062""#), "{first}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_session_past_its_cap_of_requests_in_flight_is_answered_busy() {
    let (alice, bob) = two_nodes();
    alice.serve_stub("svc", &["bob"], None, &marker("gateway-pending-cap"));
    let gateway = Gateway::start_env(&bob, &[], &[("MCPMESH_TEST_GATEWAY_MAX_PENDING", "2")]).await;
    let (url, http) = (gateway.url("alice/svc"), gateway.client());
    let r = mcp_post(&http, &url, &initialize_request(), None)
        .send()
        .await
        .unwrap();
    let sid = r.headers()["mcp-session-id"].to_str().unwrap().to_owned();
    let post = |body: Value| mcp_post(&http, &url, &body, Some(&sid)).send();

    // Two slow calls in flight: their streams are open once the gateway has them.
    let sleep = |id: u32| {
        json!({ "jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": { "name": "sleep", "arguments": { "ms": 1500 } } })
    };
    let held = [post(sleep(1)).await.unwrap(), post(sleep(2)).await.unwrap()];

    let list = json!({ "jsonrpc": "2.0", "id": "over", "method": "tools/list" });
    let r = tokio::time::timeout(Duration::from_secs(1), post(list.clone()))
        .await
        .expect("refused at once, not queued")
        .unwrap();
    assert_eq!(r.status(), 503);
    assert_eq!(r.headers()["retry-after"], "1");
    let e = last_message(&r.text().await.unwrap());
    assert_eq!(e["id"], "over", "{e}");
    assert_eq!(e["error"]["code"], -32053, "{e}");
    assert_eq!(e["error"]["data"]["source"], "mcpmesh", "{e}");
    assert!(
        e["error"]["data"]["retry_after_ms"].as_u64().is_some(),
        "{e}"
    );

    // The calls in flight are answered as ever, and then there is room again.
    for (n, r) in held.into_iter().enumerate() {
        let body = tokio::time::timeout(ANSWER_TIMEOUT, r.text())
            .await
            .expect("answered in time")
            .unwrap();
        let answer = last_message(&body);
        assert_eq!(answer["id"], n + 1, "{body}");
        assert!(body.contains("slept 1500 ms"), "{body}");
    }
    let body = post(list).await.unwrap().text().await.unwrap();
    assert!(last_message(&body)["result"]["tools"].is_array(), "{body}");
}

/// A self-signed certificate for 127.0.0.1 and localhost, written as PEM files into `dir`:
/// `(cert path, key path, cert PEM)`.
fn self_signed(dir: &std::path::Path) -> (String, String, String) {
    use std::os::unix::fs::PermissionsExt;
    let made =
        rcgen::generate_simple_self_signed(vec!["127.0.0.1".into(), "localhost".into()]).unwrap();
    let cert = made.cert.pem();
    let (cert_path, key_path) = (dir.join("cert.pem"), dir.join("key.pem"));
    std::fs::write(&cert_path, &cert).unwrap();
    std::fs::write(&key_path, made.signing_key.serialize_pem()).unwrap();
    std::fs::set_permissions(&key_path, std::fs::Permissions::from_mode(0o600)).unwrap();
    let shown = |p: std::path::PathBuf| p.display().to_string();
    (shown(cert_path), shown(key_path), cert)
}

#[tokio::test(flavor = "multi_thread")]
async fn the_gateway_serves_https_with_a_given_certificate_and_bounds_the_handshake() {
    use tokio::io::AsyncReadExt;
    let (alice, bob) = two_nodes();
    alice.serve_stub("svc", &["bob"], None, &marker("gateway-tls"));
    let dir = tempfile::tempdir().unwrap();
    let (cert, key, cert_pem) = self_signed(dir.path());
    let gateway = Gateway::start_env(
        &bob,
        &["--tls-cert", &cert, "--tls-key", &key],
        &[("MCPMESH_TEST_HTTP_TIMEOUT_MS", "1500")],
    )
    .await;
    assert!(
        gateway.base.starts_with("https://127.0.0.1:"),
        "{}",
        gateway.ready
    );
    let url = gateway.url("alice/svc");

    // A TLS client that trusts only that certificate.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let token = gateway.token.clone().unwrap();
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert(
        reqwest::header::AUTHORIZATION,
        format!("Bearer {token}").parse().unwrap(),
    );
    let https = reqwest::Client::builder()
        .default_headers(headers)
        .tls_certs_only([reqwest::Certificate::from_pem(cert_pem.as_bytes()).unwrap()])
        .build()
        .unwrap();
    let r = mcp_post(&https, &url, &initialize_request(), None)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let sid = r.headers()["mcp-session-id"].to_str().unwrap().to_owned();
    assert!(r.text().await.unwrap().contains("serverInfo"));
    let call = json!({ "jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": { "name": "echo", "arguments": { "text": "over tls" } } });
    let body = mcp_post(&https, &url, &call, Some(&sid))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(body.contains("over tls"), "{body}");

    // A client that does not trust the certificate gets no answer, nor does plain HTTP.
    assert!(
        mcp_post(&gateway.client(), &url, &initialize_request(), None)
            .send()
            .await
            .is_err()
    );
    let plain = url.replacen("https://", "http://", 1);
    assert!(
        mcp_post(&gateway.client(), &plain, &initialize_request(), None)
            .send()
            .await
            .map_or(true, |r| r.status() != 200)
    );

    // A connection that never starts its handshake is closed after the header timeout.
    let addr = gateway.base.trim_start_matches("https://");
    let addr = addr.split('/').next().unwrap();
    let mut idle = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut sink = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), idle.read_to_end(&mut sink))
        .await
        .expect("the silent connection was closed")
        .ok();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_gateway_beyond_loopback_needs_tls_and_says_how_and_bad_pem_files_are_refused() {
    let node = TestNode::start("solo");
    let refusal = |args: &[&str]| {
        let mut cmd = Command::new(MCPMESH);
        cmd.arg("--home")
            .arg(node.home())
            .args(args)
            .env_remove("MCPMESH_GATEWAY_TOKEN")
            .stdin(Stdio::null())
            .kill_on_drop(true);
        async move {
            let out = tokio::time::timeout(ANSWER_TIMEOUT, cmd.output())
                .await
                .expect("refused, not started")
                .unwrap();
            assert!(!out.status.success());
            String::from_utf8_lossy(&out.stderr).into_owned()
        }
    };
    let err = refusal(&["gateway", "--listen", "0.0.0.0:0", "--allow-remote"]).await;
    assert!(
        err.contains("not a loopback address")
            && err.contains("--tls-cert")
            && err.contains("--tls-key"),
        "{err}"
    );

    let dir = tempfile::tempdir().unwrap();
    let (cert, key, _) = self_signed(dir.path());
    let missing = dir.path().join("missing.pem").display().to_string();
    let err = refusal(&["gateway", "--tls-cert", &missing, "--tls-key", &key]).await;
    assert!(err.contains("missing.pem"), "{err}");
    let err = refusal(&["gateway", "--tls-cert", &key, "--tls-key", &key]).await;
    assert!(err.contains("no certificate"), "{err}");
    let err = refusal(&["gateway", "--tls-cert", &cert, "--tls-key", &cert]).await;
    assert!(err.contains("no private key"), "{err}");
    let err = refusal(&["gateway", "--tls-cert", &cert]).await;
    assert!(err.contains("--tls-key"), "{err}");
}

#[tokio::test(flavor = "multi_thread")]
async fn sessionless_requests_with_the_same_progress_token_each_get_their_own_progress() {
    let (alice, bob) = two_nodes();
    alice.serve_stub("svc", &["bob"], None, &marker("gateway-same-token"));
    let gateway = Gateway::start_env(
        &bob,
        &[],
        &[("MCPMESH_TEST_GATEWAY_REGISTER_DELAY_MS", "300")],
    )
    .await;
    let (url, http) = (gateway.url("alice/svc"), gateway.client());
    // The stub reports progress under the request's token before it answers.
    let call = |id: u32, text: &str| {
        format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"echo","arguments":{{"text":"{text}"}},"_meta":{{"progressToken":"p\u0031","io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}}}}"#
        )
    };
    let post = |body: String| {
        let http = http.clone();
        let url = url.clone();
        async move {
            let r = http
                .post(&url)
                .header("accept", "application/json, text/event-stream")
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await
                .unwrap();
            r.text().await.unwrap()
        }
    };
    let first = tokio::time::timeout(ANSWER_TIMEOUT, post(call(1, "first")))
        .await
        .expect("an answer in time");
    assert!(first.contains("first"), "{first}");

    let (a, b) = tokio::time::timeout(
        ANSWER_TIMEOUT,
        futures_util::future::join(post(call(2, "from A")), post(call(3, "from B"))),
    )
    .await
    .expect("both answered in time");
    for (body, mine) in [(&a, "from A"), (&b, "from B")] {
        assert!(body.contains(mine), "{body}");
        assert_eq!(
            body.matches("notifications/progress").count(),
            1,
            "one progress notification, its own: {body}"
        );
        assert!(body.contains(r#""progressToken":"p\u0031""#), "{body}");
    }
}

/// The claims of the `caller:` lines the SDK server logged since it was last drained.
fn callers_logged(server: &mut SdkHttp) -> (Vec<Value>, Vec<String>) {
    let lines = server.process.drain();
    let seen = lines
        .iter()
        .filter_map(|l| l.strip_prefix("caller: "))
        .map(|c| serde_json::from_str(c).unwrap())
        .collect();
    let refused = lines
        .iter()
        .filter_map(|l| l.strip_prefix("caller refused: "))
        .map(str::to_owned)
        .collect();
    (seen, refused)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_url_server_verifies_the_signed_caller_with_a_jose_library_and_refuses_forgeries() {
    // An org: alice (the admin) serves, bob calls as user bob of group eng.
    let alice = TestNode::start("alice");
    let bob = TestNode::start("bob");
    alice.json(&["org", "create", "acme"]);
    let invite = alice.json(&["org", "invite", "bob", "--groups", "eng"]);
    bob.json(&["join", invite["invite"].as_str().unwrap()]);

    // The server pins alice's key as `id --jwks` prints it, and checks every HTTP request
    // with PyJWT: EdDSA, kid, iss, its own URL as the audience, expiry.
    let jwks = alice.json(&["id", "--jwks"]);
    assert_eq!(jwks["keys"][0]["kid"], alice.id.as_str(), "{jwks}");
    let pinned = alice.home().join("pinned-jwks.json");
    std::fs::write(&pinned, jwks.to_string()).unwrap();
    let mut server = SdkHttp::start_with(&["--jwks", pinned.to_str().unwrap()]).await;
    alice.serve("who", &["group:eng"], &["--url", &server.url]);

    // Both eras through the mesh: every check passes, so every request the node made (discover
    // or initialize, calls, the GET stream, the DELETE) carried an assertion the server took.
    for era in ["modern", "legacy"] {
        let mut args = modern_client(era, false);
        args.push("--".into());
        args.extend(connect_args(&bob, "alice/who"));
        let report = run_driver(&args).await;
        assert!(report.contains(r#""failed": 0}"#), "{era}: {report}");
        let whoami = whoami_in(&report);
        let caller = &whoami["caller"];
        assert_eq!(
            caller["iss"],
            format!("eid:{}", alice.id),
            "{era}: {caller}"
        );
        assert_eq!(caller["sub"], format!("eid:{}", bob.id), "{era}: {caller}");
        assert_eq!(caller["aud"], server.url.as_str(), "{era}: {caller}");
        assert_eq!(caller["user"], "bob", "{era}: {caller}");
        assert_eq!(caller["groups"], json!(["eng"]), "{era}: {caller}");
        assert_eq!(caller["org"], "acme", "{era}: {caller}");
        assert_eq!(caller["service"], "who", "{era}: {caller}");
        assert!(caller["peer"].is_string(), "{era}: {caller}");
        let lifetime = caller["exp"].as_u64().unwrap() - caller["iat"].as_u64().unwrap();
        assert_eq!(lifetime, 300, "{era}: {caller}");
        assert!(
            caller["jti"].as_str().is_some_and(|j| j.len() >= 16),
            "{caller}"
        );
    }
    // A client that closes its input right after its last request still gets the answer,
    // from a server that verified the caller.
    let mut s = bob.connect("alice/who");
    s.initialize().await;
    s.send(&json!({ "jsonrpc": "2.0", "id": 7, "method": "tools/call",
                    "params": { "name": "whoami", "arguments": {} } }))
        .await;
    s.close_stdin();
    let answer = s.recv().await.expect("the answer after input closed");
    let text = answer["result"]["content"][0]["text"].as_str().unwrap();
    let whoami: Value = serde_json::from_str(text).unwrap();
    assert_eq!(
        whoami["caller"]["sub"],
        format!("eid:{}", bob.id),
        "{answer}"
    );
    s.wait_eof().await;
    let (seen, refused) = callers_logged(&mut server);
    assert!(refused.is_empty(), "{refused:?}");
    assert!(seen.len() >= 10, "every request verified: {seen:?}");
    assert!(seen.iter().all(|c| c["sub"] == format!("eid:{}", bob.id)));

    // A second service on the same server under another URL: its assertions name that URL, so
    // this server (whose audience is its own URL) refuses them.
    let other = format!("{}?tenant=b", server.url);
    alice.serve("other", &["group:eng"], &["--url", &other]);
    // And a service with the assertion turned off gets none.
    alice.serve(
        "plain",
        &["group:eng"],
        &["--url", &server.url, "--no-caller-assertion"],
    );
    for (service, reason) in [
        ("other", "InvalidAudienceError"),
        ("plain", "InvalidTokenError: no assertion"),
    ] {
        let mut s = bob.connect(&format!("alice/{service}"));
        let answer = s.initialize().await;
        assert_eq!(answer["error"]["code"], -32054, "{service}: {answer}");
        assert!(
            answer["error"]["message"]
                .as_str()
                .unwrap()
                .contains("HTTP 401"),
            "{service}: {answer}"
        );
        // The server logs each request it refused (initialize, then the GET stream).
        while !server
            .process
            .wait_for("caller refused: ")
            .await
            .contains(reason)
        {}
        s.close_stdin();
        s.wait_eof().await;
    }

    // Straight to the server: an assertion alice's key really signed is taken; the same claims
    // expired, aimed at another audience, rewritten after signing, or signed by bob's key are not.
    let key = |node: &TestNode| {
        let profile = mcpmesh::paths::Profile::at(node.home());
        let key = mcpmesh::keys::load(&profile.key_file()).unwrap().unwrap();
        mcpmesh::assertion::Issuer::new(&key).unwrap()
    };
    let (alice_key, bob_key) = (key(&alice), key(&bob));
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let good = mcpmesh::assertion::Claims {
        iss: format!("eid:{}", alice.id),
        sub: format!("eid:{}", bob.id),
        aud: server.url.clone(),
        peer: Some("bob".into()),
        user: Some("bob".into()),
        groups: vec!["eng".into()],
        org: Some("acme".into()),
        service: "who".into(),
        iat: now,
        exp: now + 300,
        jti: "direct-test-1".into(),
    };
    let post = |token: String| {
        let url = server.url.clone();
        async move {
            let r = mcp_post(&http_client(), &url, &initialize_request(), None)
                .header("mcpmesh-caller", token)
                .send()
                .await
                .unwrap();
            (r.status().as_u16(), r.text().await.unwrap())
        }
    };
    assert_eq!(post(alice_key.sign(&good).unwrap()).await.0, 200);
    // Rewritten: the claims of another assertion (group admin) under this one's signature.
    let signed = alice_key.sign(&good).unwrap();
    let admin = alice_key
        .sign(&mcpmesh::assertion::Claims {
            groups: vec!["admin".into()],
            ..good.clone()
        })
        .unwrap();
    let mut parts: Vec<&str> = signed.split('.').collect();
    parts[1] = admin.split('.').nth(1).unwrap();
    let cases = [
        (
            "expired",
            alice_key.sign(&mcpmesh::assertion::Claims {
                iat: now - 900,
                exp: now - 600,
                ..good.clone()
            }),
            "ExpiredSignatureError",
        ),
        (
            "another audience",
            alice_key.sign(&mcpmesh::assertion::Claims {
                aud: other.clone(),
                ..good.clone()
            }),
            "InvalidAudienceError",
        ),
        ("rewritten", Ok(parts.join(".")), "InvalidSignatureError"),
        ("bob's key", bob_key.sign(&good), "unknown key id"),
    ];
    for (case, token, reason) in cases {
        let (status, body) = post(token.unwrap()).await;
        assert_eq!(status, 401, "{case}: {body}");
        assert!(body.contains(reason), "{case}: {body}");
    }

    // The node never writes an assertion into its log or its audit records.
    let log = alice.log();
    let audit = alice.json(&["audit", "tail", "-n", "1000"]).to_string();
    for text in [&log, &audit] {
        assert!(!text.contains("eyJ"), "no JWS in the log or audit");
    }
}

/// The official Python SDK's authorization server and, behind it, its Streamable HTTP server
/// (`oauth_server.py`: grants made with PKCE, short-lived access tokens, rotated refresh
/// tokens, an admin endpoint that revokes them all).
struct SdkOAuth {
    process: Started,
    url: String,
}

impl SdkOAuth {
    async fn start(args: &[&str]) -> Self {
        let mut cmd = Command::new(python());
        cmd.arg(interop_script("oauth_server.py")).args(args);
        let (process, ready) = Started::until(&mut cmd, "listening on").await;
        let url = ready.rsplit(' ').next().unwrap().to_owned();
        SdkOAuth { process, url }
    }

    /// Revokes every token the server issued.
    async fn revoke_all(&self) {
        let base = self.url.trim_end_matches("/mcp");
        let r = http_client()
            .post(format!("{base}/admin/revoke-all"))
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "{}", r.status());
    }
}

/// Fails the test if any of `secrets` is in `node`'s log, audit records or status, or on its
/// metrics page or in its exported traces (`sink`).
async fn assert_kept_secret(node: &TestNode, sink: &TelemetrySink, secrets: &[&str]) {
    let log = node.log();
    let audit = node.json(&["audit", "tail", "-n", "1000"]).to_string();
    let status = node.json(&["status"]).to_string();
    for secret in secrets.iter().filter(|s| !s.is_empty()) {
        for (what, text) in [("log", &log), ("audit", &audit), ("status", &status)] {
            assert!(!text.contains(secret), "a secret in the {what}");
        }
    }
    sink.assert_never_seen(secrets).await;
}

/// The tokens and secret of a grant file's contents.
fn secrets_of(grant: &Value) -> Vec<String> {
    ["access_token", "refresh_token", "client_secret"]
        .iter()
        .filter_map(|k| grant[k].as_str().map(str::to_owned))
        .collect()
}

/// alice, whose telemetry (metrics page and traces) goes to `sink` (`extra` in her config), and bob, trusting each
/// other: for the tests that search everything a node lets out for the grant's secrets.
fn watched_nodes(sink: &TelemetrySink, extra: &str) -> (TestNode, TestNode) {
    let config = format!("{}\n{extra}", sink.config());
    let alice = TestNode::start_with("alice", &config, &TelemetrySink::QUICK_EXPORT);
    let bob = TestNode::start("bob");
    alice.trust(&bob);
    bob.trust(&alice);
    (alice, bob)
}

/// `mcpmesh --json auth ARGS…` for `node`, with no `$BROWSER` of the test's own.
fn auth(node: &TestNode, args: &[&str]) -> std::process::Output {
    let mut all = vec!["--json", "auth"];
    all.extend_from_slice(args);
    node.command(&all).env_remove("BROWSER").output().unwrap()
}

/// The grant `node` keeps for `service`, as the test reads it from its own profile.
fn grant_of(node: &TestNode, service: &str) -> Value {
    let path = node.home().join(format!("oauth/{service}.grant.json"));
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_url_server_that_requires_oauth_is_served_once_its_node_holds_a_grant_refreshed_as_it_lapses()
 {
    let mut server = SdkOAuth::start(&["--token-ttl", "3"]).await;
    let sink = TelemetrySink::start().await;
    let (alice, bob) = watched_nodes(&sink, "");
    alice.serve("wiki", &["bob"], &["--url", &server.url, "--oauth"]);

    // Without a grant, the caller is told what the owner runs; nothing reaches the server.
    let mut s = bob.connect("alice/wiki");
    let answer = s.initialize().await;
    assert_eq!(answer["error"]["code"], -32056, "{answer}");
    assert_eq!(answer["error"]["data"]["service"], "wiki", "{answer}");
    assert_eq!(
        answer["error"]["data"]["command"], "mcpmesh auth wiki",
        "{answer}"
    );
    s.close_stdin();
    s.wait_eof().await;
    // `doctor` fails (exit 1) and says what to run.
    let doctor = alice.cli(&["--json", "doctor", "--offline"]);
    assert!(!doctor.status.success());
    let doctor = String::from_utf8_lossy(&doctor.stdout);
    assert!(doctor.contains("run `mcpmesh auth wiki`"), "{doctor}");
    // So does `status`, in both forms.
    let oauth_status = || {
        let status = alice.json(&["status"]);
        let wiki = status["services"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["name"] == "wiki")
            .cloned()
            .unwrap();
        wiki["oauth"].clone()
    };
    let missing = oauth_status();
    assert_eq!(missing["authorized"], false, "{missing}");
    assert_eq!(missing["command"], "mcpmesh auth wiki", "{missing}");
    let plain = String::from_utf8_lossy(&alice.cli(&["status"]).stdout).into_owned();
    assert!(
        plain.contains("has none: run `mcpmesh auth wiki`"),
        "{plain}"
    );
    assert!(
        !server
            .process
            .drain()
            .iter()
            .any(|l| l.starts_with("request: POST /mcp")),
        "nothing was sent without a grant"
    );

    // The grant: discovery from the server's 401, dynamic registration, PKCE, the code on
    // the loopback redirect, through a stand-in for the user's browser.
    let browser = format!("{} {}", python().display(), interop_script("browser.py"));
    let made = parse_ok(&auth(&alice, &["wiki", "--browser", &browser]));
    assert_eq!(made["authorized"], true, "{made}");
    assert_eq!(made["service"], "wiki", "{made}");
    assert!(made["expires_at"].as_u64().is_some(), "{made}");
    let status = parse_ok(&auth(&alice, &["wiki", "--status"]));
    assert_eq!(status["authorized"], true, "{status}");
    let held = oauth_status();
    assert_eq!(held["authorized"], true, "{held}");
    assert!(held["expires_at"].as_u64().is_some(), "{held}");
    let file = alice.home().join("oauth/wiki.grant.json");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let first = grant_of(&alice, "wiki");

    // Both eras through the mesh, with the token; it lapses (3 s) mid-session and is refreshed
    // without the caller seeing an error.
    for era in ["modern", "legacy"] {
        let mut args = modern_client(era, false);
        args.push("--".into());
        args.extend(connect_args(&bob, "alice/wiki"));
        let report = run_driver(&args).await;
        assert!(report.contains(r#""failed": 0}"#), "{era}: {report}");
    }
    // Every request carried the token: the POSTs, and the legacy session's GET stream.
    let seen = server.process.drain();
    assert!(
        seen.iter()
            .any(|l| l.starts_with("request: GET /mcp auth=present")),
        "{seen:?}"
    );
    // (Before the grant, only `mcpmesh auth`'s own probe went without.)
    let granted = seen
        .iter()
        .position(|l| l.starts_with("token: grant=authorization_code"))
        .expect("the grant in the server's log");
    assert!(
        !seen[granted..]
            .iter()
            .any(|l| l.starts_with("request: ") && l.contains("/mcp auth=absent")),
        "{seen:?}"
    );
    let mut s = bob.connect("alice/wiki");
    s.initialize().await;
    let echo = s.call("echo", json!({ "text": "before" })).await;
    assert_eq!(echo["result"]["content"][0]["text"], "before", "{echo}");
    // The token this session holds (the eras may have refreshed the first one already), past
    // its expiry: the next call refreshes it.
    let held = grant_of(&alice, "wiki");
    let lapse = held["expires_at"].as_u64().unwrap() + 1;
    while unix_now() < lapse {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    server.process.drain();
    let echo = s.call("echo", json!({ "text": "after" })).await;
    assert_eq!(echo["result"]["content"][0]["text"], "after", "{echo}");
    let refreshed = grant_of(&alice, "wiki");
    assert_ne!(refreshed["access_token"], held["access_token"]);
    assert_ne!(refreshed["refresh_token"], held["refresh_token"], "rotated");
    assert_ne!(refreshed["access_token"], first["access_token"]);
    server.process.wait_for("token: grant=refresh_token").await;

    // Every token revoked: once the access token lapses, the refresh fails and the caller is
    // told to have the grant made again — in the session already open.
    server.revoke_all().await;
    let lapse = refreshed["expires_at"].as_u64().unwrap() + 1;
    while unix_now() < lapse {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let refused = s.call("echo", json!({ "text": "revoked" })).await;
    assert_eq!(refused["error"]["code"], -32056, "{refused}");
    assert_eq!(
        refused["error"]["data"]["command"], "mcpmesh auth wiki",
        "{refused}"
    );
    s.close_stdin();
    s.wait_eof().await;

    // No token or secret in the node's log, audit records, status, metrics or traces.
    let secrets: Vec<String> = [&first, &refreshed]
        .into_iter()
        .flat_map(secrets_of)
        .collect();
    let secrets: Vec<&str> = secrets.iter().map(String::as_str).collect();
    assert_kept_secret(&alice, &sink, &secrets).await;

    // Forgotten (and revoked at the server, where it was already): the next session is
    // refused again.
    let out = parse_ok(&auth(&alice, &["wiki", "--logout"]));
    assert_eq!(out["authorized"], false, "{out}");
    assert_eq!(out["revoked"], true, "{out}");
    assert!(!file.exists());
    let mut s = bob.connect("alice/wiki");
    assert_eq!(s.initialize().await["error"]["code"], -32056);
    s.close_stdin();
    s.wait_eof().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_headless_node_finishes_a_grant_with_the_address_the_browser_was_sent_to() {
    let mut server = SdkOAuth::start(&[]).await;
    let sink = TelemetrySink::start().await;
    let (alice, bob) = watched_nodes(&sink, "");
    alice.serve("wiki", &["bob"], &["--url", &server.url, "--oauth"]);

    // No browser: the URL to open, and nothing else happens.
    let begun = parse_ok(&auth(&alice, &["wiki"]));
    assert_eq!(begun["authorized"], false, "{begun}");
    let url = begun["authorize_url"].as_str().unwrap();
    assert!(url.contains("code_challenge_method=S256"), "{url}");
    assert!(url.contains("resource="), "{url}");
    // The user's browser, elsewhere: it is sent to a loopback address that does not answer.
    let out = Command::new(python())
        .arg(interop_script("browser.py"))
        .arg("--stop-at-callback")
        .arg(url)
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let sent_to = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    assert!(sent_to.starts_with("http://127.0.0.1:"), "{sent_to}");

    // Someone else's redirect (another state) is refused; the right one finishes the grant.
    let forged = sent_to.replace("state=", "state=x");
    let e = error_line(&auth(&alice, &["wiki", "--redirect-url", &forged]));
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("state differs"),
        "{e}"
    );
    let made = parse_ok(&auth(&alice, &["wiki", "--redirect-url", &sent_to]));
    assert_eq!(made["authorized"], true, "{made}");
    // The pending authorization is spent.
    let again = error_line(&auth(&alice, &["wiki", "--redirect-url", &sent_to]));
    assert!(
        again["error"]["message"]
            .as_str()
            .unwrap()
            .contains("run `mcpmesh auth wiki` first"),
        "{again}"
    );

    let mut s = bob.connect("alice/wiki");
    let init = s.initialize().await;
    assert!(init["result"]["serverInfo"].is_object(), "{init}");
    s.close_stdin();
    s.wait_eof().await;

    // A service not marked --oauth learns it from the server's 401, and grants are per
    // service: this one has none yet.
    alice.serve("plain", &["bob"], &["--url", &server.url]);
    let mut s = bob.connect("alice/plain");
    let answer = s.initialize().await;
    assert_eq!(answer["error"]["code"], -32056, "{answer}");
    assert_eq!(
        answer["error"]["data"]["command"], "mcpmesh auth plain",
        "{answer}"
    );
    s.close_stdin();
    s.wait_eof().await;

    let grant = secrets_of(&grant_of(&alice, "wiki"));
    let mut secrets: Vec<&str> = grant.iter().map(String::as_str).collect();
    // The redirect address carries the code and the state.
    secrets.push(&sent_to);
    assert_kept_secret(&alice, &sink, &secrets).await;

    // Logging out revokes the grant at its authorization server (RFC 7009), then forgets it;
    // a session open under it is told to make a new one at its next request.
    let mut s = bob.connect("alice/wiki");
    let init = s.initialize().await;
    assert!(init["result"]["serverInfo"].is_object(), "{init}");
    let out = parse_ok(&auth(&alice, &["wiki", "--logout"]));
    assert_eq!(out["authorized"], false, "{out}");
    assert_eq!(out["revoked"], true, "{out}");
    server.process.wait_for("revoked: client_id=").await;
    assert!(!alice.home().join("oauth/wiki.grant.json").exists());
    let answer = s.request("tools/list", json!({})).await;
    assert_eq!(answer["error"]["code"], -32056, "{answer}");
    assert_eq!(
        answer["error"]["data"]["command"], "mcpmesh auth wiki",
        "{answer}"
    );
    s.close_stdin();
    s.wait_eof().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_node_acting_for_itself_gets_client_credentials_tokens_without_a_browser_and_renews_them()
{
    let mut server = SdkOAuth::start(&[
        "--token-ttl",
        "3",
        "--machine-client",
        "mesh-7:cc-secret-value",
    ])
    .await;
    let sink = TelemetrySink::start().await;
    let (alice, bob) = watched_nodes(&sink, "");
    let secret = alice.home().join("reports-secret");
    std::fs::write(&secret, "cc-secret-value\n").unwrap();
    let secret = secret.display().to_string();
    let client = [
        "--client-id",
        "mesh-7",
        "--client-credentials",
        "--client-secret-file",
    ];
    let mut backend = vec!["--url", server.url.as_str()];
    backend.extend(client);
    backend.push(&secret);
    alice.serve("reports", &["bob"], &backend);

    // Until the first token, the caller is told what the owner runs, as for a user's grant.
    let mut s = bob.connect("alice/reports");
    let answer = s.initialize().await;
    assert_eq!(answer["error"]["code"], -32056, "{answer}");
    assert_eq!(
        answer["error"]["data"]["command"], "mcpmesh auth reports",
        "{answer}"
    );
    s.close_stdin();
    s.wait_eof().await;
    // No browser: the node asks the token endpoint itself.
    let made = parse_ok(&auth(&alice, &["reports"]));
    assert_eq!(made["authorized"], true, "{made}");
    assert!(made.get("authorize_url").is_none(), "{made}");
    let grant = grant_of(&alice, "reports");
    assert_eq!(grant["client_credentials"], true, "{grant}");
    assert!(grant.get("refresh_token").is_none(), "{grant}");
    server
        .process
        .wait_for("token: grant=client_credentials client_id=mesh-7")
        .await;

    // Past the 3 s token's expiry, the node asks for a new one; the caller sees no error.
    let mut s = bob.connect("alice/reports");
    s.initialize().await;
    let echo = s.call("echo", json!({ "text": "first" })).await;
    assert_eq!(echo["result"]["content"][0]["text"], "first", "{echo}");
    let lapse = grant_of(&alice, "reports")["expires_at"].as_u64().unwrap() + 1;
    while unix_now() < lapse {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    server.process.drain();
    let echo = s.call("echo", json!({ "text": "after" })).await;
    assert_eq!(echo["result"]["content"][0]["text"], "after", "{echo}");
    server
        .process
        .wait_for("token: grant=client_credentials client_id=mesh-7")
        .await;
    let renewed = grant_of(&alice, "reports");
    assert_ne!(renewed["access_token"], grant["access_token"]);
    s.close_stdin();
    s.wait_eof().await;

    // Through bob's gateway it is an ordinary service.
    let gateway = Gateway::start(&bob, &[]).await;
    let (http, url) = (gateway.client(), gateway.url("alice/reports"));
    let sid = open_http_session(&gateway, &url).await;
    let echo = json!({ "name": "echo", "arguments": { "text": "via the gateway" } });
    let answer = http_request(&http, &url, Some(&sid), 2, "tools/call", echo).await;
    assert_eq!(
        answer["result"]["content"][0]["text"], "via the gateway",
        "{answer}"
    );
    // And through bob's hub.
    let mut cmd = Command::new(MCPMESH);
    cmd.arg("--home")
        .arg(bob.home())
        .args(["hub", "alice/reports"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true);
    let mut hub = McpSession::spawn(cmd);
    hub.initialize().await;
    let listed = hub.request("tools/list", json!({})).await;
    let echo = listed["result"]["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("{listed}"))
        .iter()
        .filter_map(|t| t["name"].as_str())
        .find(|n| n.ends_with("echo"))
        .unwrap_or_else(|| panic!("{listed}"))
        .to_owned();
    let answer = hub.call(&echo, json!({ "text": "via the hub" })).await;
    assert_eq!(
        answer["result"]["content"][0]["text"], "via the hub",
        "{answer}"
    );
    hub.close_stdin();
    hub.wait_eof().await;

    // A wrong secret: `auth` fails with the server's word for it, and makes no grant.
    let wrong = alice.home().join("wrong-secret");
    std::fs::write(&wrong, "not-the-secret\n").unwrap();
    let wrong = wrong.display().to_string();
    let mut backend = vec!["--url", server.url.as_str()];
    backend.extend(client);
    backend.push(&wrong);
    alice.serve("wrong", &["bob"], &backend);
    let refused = auth(&alice, &["wrong"]);
    assert!(!refused.status.success());
    let e = error_line(&refused);
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("invalid_client"),
        "{e}"
    );
    assert!(!alice.home().join("oauth/wrong.grant.json").exists());

    // The secret and the tokens never reach the log, audit, status, metrics or traces.
    let secrets = [
        "cc-secret-value",
        grant["access_token"].as_str().unwrap(),
        renewed["access_token"].as_str().unwrap(),
    ];
    assert_kept_secret(&alice, &sink, &secrets).await;
    // The audit log records who used the service under the node's grant, as for any service.
    let records = alice.stop_and_audit();
    let calls: Vec<&Value> = records
        .iter()
        .filter(|r| r["service"] == "reports" && r["method"] == "tools/call")
        .collect();
    assert!(calls.len() >= 4, "{records:?}");
    for call in calls {
        assert_eq!(call["principal"], format!("eid:{}", bob.id), "{call}");
        assert_eq!(call["name"], "echo", "{call}");
        assert_eq!(call["outcome"], "ok", "{call}");
    }

    // A server that refuses the revocation (this one's /revoke knows only the clients it
    // registered, not the machine client): the grant is forgotten here all the same, and the
    // answer says why it was not revoked, without a secret.
    let out = parse_ok(&auth(&alice, &["reports", "--logout"]));
    assert_eq!(out["authorized"], false, "{out}");
    assert_eq!(out["revoked"], false, "{out}");
    let why = out["revocation_failed"]
        .as_str()
        .unwrap_or_else(|| panic!("{out}"));
    assert!(why.contains("401"), "{out}");
    assert!(secrets.iter().all(|s| !why.contains(s)), "{out}");
    assert!(!alice.home().join("oauth/reports.grant.json").exists());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_grant_refused_for_want_of_scope_is_stepped_up_by_the_next_auth() {
    // The server needs mcp:read and mcp:write; the service asks for mcp:read alone.
    let server = SdkOAuth::start(&["--required-scopes", "mcp:read,mcp:write"]).await;
    let config = format!(
        "[services.wiki]\nurl = \"{}\"\nallow = [\"bob\"]\n[services.wiki.oauth]\nscopes = [\"mcp:read\"]\n",
        server.url
    );
    let sink = TelemetrySink::start().await;
    let (alice, bob) = watched_nodes(&sink, &config);
    let browser = format!("{} {}", python().display(), interop_script("browser.py"));
    let made = parse_ok(&auth(&alice, &["wiki", "--browser", &browser]));
    assert_eq!(made["scopes"], json!(["mcp:read"]), "{made}");

    // 403 insufficient_scope: the caller is told what the owner runs, in a session that goes on.
    let mut s = bob.connect("alice/wiki");
    let answer = s.initialize().await;
    assert_eq!(answer["error"]["code"], -32056, "{answer}");
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap()
            .contains("more scope"),
        "{answer}"
    );

    // The next grant asks for what it had and what the resource lists (the browser, this time,
    // from $BROWSER).
    let out = alice
        .command(&["--json", "auth", "wiki"])
        .env("BROWSER", &browser)
        .output()
        .unwrap();
    let made = parse_ok(&out);
    let scopes = made["scopes"].as_array().unwrap();
    assert!(
        scopes.contains(&json!("mcp:read")) && scopes.contains(&json!("mcp:write")),
        "{made}"
    );
    // The session already open takes the new grant at its next request.
    let init = s.initialize().await;
    assert!(init["result"]["serverInfo"].is_object(), "{init}");
    s.close_stdin();
    s.wait_eof().await;

    let grant = secrets_of(&grant_of(&alice, "wiki"));
    let secrets: Vec<&str> = grant.iter().map(String::as_str).collect();
    assert_kept_secret(&alice, &sink, &secrets).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_servers_skills_are_listed_and_read_verified_through_the_gateways_hub_over_http() {
    let (alice, bob) = two_nodes_with(ROOM_FOR_A_WHOLE_CLIENT);
    serve_skills(&alice);
    until_mounted(&bob, &["alice/skills"]).await;
    let gateway = Gateway::start(&bob, &[]).await;
    // FastMCP's Skills client over Streamable HTTP, sessionless at 2026-07-28.
    let shown = |own: &str| format!("mcpmesh-hub://alice/skills/{own}");
    let mut args = vec![
        interop_script("skills_client.py"),
        "--unknown".into(),
        shown("skill://nope/SKILL.md"),
    ];
    args.extend(gateway.header_args());
    args.extend(["--url".into(), gateway.url("hub")]);
    let out = run_driver(&args).await;
    let report = report_line(&out);
    assert_eq!(report["protocol"], "2026-07-28", "{report}");
    let skills = report["skills"]
        .as_array()
        .unwrap_or_else(|| panic!("{report}"));
    assert_eq!(skills.len(), 2, "{report}");
    for skill in skills {
        assert_eq!(skill["origin"], "alice/skills", "{report}");
        assert_eq!(skill["get_same"], true, "{report}");
        assert!(skill["read"]["files"].is_array(), "{report}");
    }
    let workflow = skills
        .iter()
        .find(|s| s["name"] == "git-workflow")
        .unwrap_or_else(|| panic!("{report}"));
    assert_eq!(workflow["uri"], shown("skill://git-workflow/SKILL.md"));
    assert_eq!(
        workflow["read"],
        json!({"files": ["SKILL.md", "references/BRANCHES.md"]}),
        "{report}"
    );
    assert_eq!(report["unknown"]["code"], -32602, "{report}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_2026_07_28_task_through_the_gateways_hub_over_http_is_polled_to_its_result_and_cancelled()
 {
    let (alice, bob) = two_nodes_with(ROOM_FOR_A_WHOLE_CLIENT);
    serve_tasks(&alice);
    until_mounted(&bob, &["alice/tasks"]).await;
    let gateway = Gateway::start(&bob, &[]).await;
    // FastMCP's client with fastmcp-tasks over Streamable HTTP, sessionless: each poll is a
    // request of its own, and reaches the session that holds the task by the id alone.
    let mut args = vec![
        interop_script("tasks_client.py"),
        "--prefix".into(),
        "alice__tasks__".into(),
        "--unknown".into(),
        "alice/nothing/x".into(),
    ];
    args.extend(gateway.header_args());
    args.extend(["--url".into(), gateway.url("hub")]);
    let out = run_driver(&args).await;
    let report = report_line(&out);
    assert_eq!(report["protocol"], "2026-07-28", "{report}");
    assert_eq!(report["transparent"], "crunched 0.5", "{report}");
    assert_eq!(report["handle"]["result"], "crunched 1.0", "{report}");
    assert!(
        report["handle"]["task_id"]
            .as_str()
            .is_some_and(|id| id.starts_with("alice/tasks/")),
        "{report}"
    );
    assert_eq!(report["cancel"]["status"], "cancelled", "{report}");
    assert_eq!(report["plain"], "plainly", "{report}");
    assert_eq!(report["unknown"]["code"], -32602, "{report}");
}

/// One request over streamable HTTP to `url` (in session `sid`, or sessionless), its answer.
async fn http_request(
    http: &reqwest::Client,
    url: &str,
    sid: Option<&str>,
    id: u64,
    method: &str,
    params: Value,
) -> Value {
    let body = json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params });
    let r = tokio::time::timeout(ANSWER_TIMEOUT, mcp_post(http, url, &body, sid).send())
        .await
        .expect("an answer in time")
        .unwrap();
    answer_in(&r.text().await.unwrap())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_legacy_session_of_the_gateways_hub_gets_each_services_instructions_and_its_tasks_by_their_presented_ids()
 {
    let (alice, bob) = two_nodes_with(ROOM_FOR_A_WHOLE_CLIENT);
    serve_everything(&alice, &[]);
    let (py, server) = (
        python().display().to_string(),
        interop_script("modern_server.py"),
    );
    alice.serve("modern", &["bob"], &["--", &py, &server]);
    until_mounted(&bob, &["alice/everything", "alice/modern"]).await;
    let gateway = Gateway::start(&bob, &[]).await;
    let (url, http) = (gateway.url("hub"), gateway.client());
    let open = || async {
        let r = mcp_post(&http, &url, &initialize_request(), None)
            .send()
            .await
            .unwrap();
        let sid = r.headers()["mcp-session-id"].to_str().unwrap().to_owned();
        (sid, answer_in(&r.text().await.unwrap()))
    };
    // A first session lists the services (their instructions come with the listing).
    let (sid, _) = open().await;
    let tools = http_request(&http, &url, Some(&sid), 2, "tools/list", json!({})).await;
    assert!(tools.to_string().contains("alice__modern__echo"), "{tools}");

    // The next one is told each service's own instructions under its heading.
    let (sid, hello) = open().await;
    let text = hello["result"]["instructions"].as_str().unwrap_or_default();
    assert!(
        text.contains("\n\n## alice/modern\nmcpmesh interop test server (dual-era stdio)."),
        "{hello}"
    );
    assert_eq!(
        hello["result"]["capabilities"]["tasks"]["requests"]["tools"]["call"],
        json!({}),
        "{hello}"
    );

    // 2025-11-25 tasks over HTTP: made, got, listed, its result, another cancelled.
    let research = |topic: &str| {
        json!({"name": "alice__everything__simulate-research-query",
            "arguments": {"topic": topic}, "task": {"ttl": 60000}})
    };
    let created = http_request(&http, &url, Some(&sid), 3, "tools/call", research("mesh")).await;
    let id = created["result"]["task"]["taskId"]
        .as_str()
        .unwrap_or_else(|| panic!("no task: {created}"))
        .to_owned();
    assert!(id.starts_with("alice/everything/"), "{id}");
    let got = http_request(
        &http,
        &url,
        Some(&sid),
        4,
        "tasks/get",
        json!({"taskId": id}),
    )
    .await;
    assert_eq!(got["result"]["taskId"], id.as_str(), "{got}");
    let listed = http_request(&http, &url, Some(&sid), 5, "tasks/list", json!({})).await;
    assert!(listed.to_string().contains(&id), "{listed}");
    let payload = http_request(
        &http,
        &url,
        Some(&sid),
        6,
        "tasks/result",
        json!({"taskId": id}),
    )
    .await;
    assert!(payload.to_string().contains("mesh"), "{payload}");
    let created = http_request(
        &http,
        &url,
        Some(&sid),
        7,
        "tools/call",
        research("to cancel"),
    )
    .await;
    let second = created["result"]["task"]["taskId"]
        .as_str()
        .unwrap_or_else(|| panic!("no task: {created}"))
        .to_owned();
    let cancelled = http_request(
        &http,
        &url,
        Some(&sid),
        8,
        "tasks/cancel",
        json!({"taskId": second}),
    )
    .await;
    assert_eq!(cancelled["result"]["status"], "cancelled", "{cancelled}");
    let refused = http_request(
        &http,
        &url,
        Some(&sid),
        9,
        "tasks/get",
        json!({"taskId": "carol/everything/x"}),
    )
    .await;
    assert_eq!(refused["error"]["code"], -32602, "{refused}");

    // Sessionless, at 2026-07-28: a forged requestState resumes nothing and is refused.
    let forged = json!({
        "name": "alice__everything__trigger-elicitation-request",
        "arguments": {},
        "inputResponses": {"mcpmesh-1": {"action": "accept", "content": {}}},
        "requestState": "mcpmesh-hub1.1.00",
        "_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "1"},
            "io.modelcontextprotocol/clientCapabilities": {"elicitation": {}},
        },
    });
    let refused = http_request(&http, &url, None, 10, "tools/call", forged).await;
    assert_eq!(refused["error"]["code"], -32602, "{refused}");
}

#[tokio::test(flavor = "multi_thread")]
async fn both_mcp_eras_use_a_2026_only_server_through_the_gateways_hub() {
    let (alice, bob) = two_nodes_with(ROOM_FOR_A_WHOLE_CLIENT);
    let filter = alice.home().join("stateless_only.py");
    std::fs::write(&filter, STATELESS_ONLY).unwrap();
    let (py, server) = (
        python().display().to_string(),
        interop_script("modern_server.py"),
    );
    let filter = filter.display().to_string();
    alice.serve("modern", &["bob"], &["--", &py, &filter, &py, &server]);
    until_mounted(&bob, &["alice/modern"]).await;
    let gateway = Gateway::start(&bob, &[]).await;
    // The 2025 client's `confirm` is asked of it mid-call (the server's input_required become
    // the hub's requests on its HTTP session), the 2026 client's round trip passes through.
    for era in ["legacy", "modern"] {
        let report = run_driver(&modern_client_through_the_gateways_hub(&gateway, era)).await;
        assert!(!report.contains("FAIL"), "{report}");
        if era == "legacy" {
            assert!(
                report.contains("ok   confirm elicitation/create mid-call"),
                "{report}"
            );
        } else {
            assert_stateless_report(&report);
        }
    }
}

/// Reads the SSE response `r` until an event whose JSON has `method`; that JSON.
async fn sse_until(r: &mut reqwest::Response, seen: &mut String, method: &str) -> Value {
    let found = |seen: &str| {
        seen.lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
            .find(|v| v["method"] == method)
    };
    tokio::time::timeout(SETTLE_HTTP, async {
        loop {
            if let Some(v) = found(seen) {
                return v;
            }
            match r.chunk().await {
                Ok(Some(chunk)) => seen.push_str(&String::from_utf8_lossy(&chunk)),
                other => panic!("the stream ended before {method}: {other:?}\n{seen}"),
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no {method} on the stream in time:\n{seen}"))
}

/// Longest a listen stream may take to carry what a test caused.
const SETTLE_HTTP: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread")]
async fn a_listen_stream_over_http_carries_a_2025_servers_resource_updates_through_the_gateways_hub()
 {
    let (alice, bob) = two_nodes_with(ROOM_FOR_A_WHOLE_CLIENT);
    serve_everything(&alice, &[]);
    until_mounted(&bob, &["alice/everything"]).await;
    let gateway = Gateway::start(&bob, &[]).await;
    let (url, http) = (gateway.url("hub"), gateway.client());
    let envelope = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": {},
    });
    // The hub lists the service first (its resources are known by their presented URIs).
    let tools = http_request(
        &http,
        &url,
        None,
        1,
        "tools/list",
        json!({"_meta": envelope.clone()}),
    )
    .await;
    assert!(
        tools.to_string().contains("alice__everything__echo"),
        "{tools}"
    );

    let document = "mcpmesh-hub://alice/everything/demo://resource/static/document/architecture.md";
    let listen = json!({"jsonrpc": "2.0", "id": "listen-1", "method": "subscriptions/listen",
        "params": {"notifications": {"resourceSubscriptions": [document]}, "_meta": envelope.clone()}});
    let mut stream =
        tokio::time::timeout(ANSWER_TIMEOUT, mcp_post(&http, &url, &listen, None).send())
            .await
            .expect("the stream opens in time")
            .unwrap();
    assert_eq!(stream.status(), 200);
    let mut seen = String::new();
    let ack = sse_until(
        &mut stream,
        &mut seen,
        "notifications/subscriptions/acknowledged",
    )
    .await;
    assert_eq!(
        ack["params"]["notifications"]["resourceSubscriptions"],
        json!([document]),
        "{ack}"
    );
    // Under the id this client gave its listen request, not the one the gateway sent on.
    assert_eq!(
        ack["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"], "listen-1",
        "{ack}"
    );

    // Another request, sessionless, makes the server update its subscribed resources: the
    // update reaches the open stream under the presented URI.
    let toggle = json!({"name": "alice__everything__toggle-subscriber-updates", "arguments": {},
        "_meta": envelope});
    let toggled = http_request(&http, &url, None, 2, "tools/call", toggle).await;
    assert!(toggled.get("result").is_some(), "{toggled}");
    let updated = sse_until(&mut stream, &mut seen, "notifications/resources/updated").await;
    assert_eq!(updated["params"]["uri"], document, "{updated}");
    assert_eq!(
        updated["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"], "listen-1",
        "{updated}"
    );
}
