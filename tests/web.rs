//! The status page (`mcpmesh status --web`): served by the daemon on loopback, behind its
//! token and the gateway's Host/Origin checks, live over server-sent events; and seen in a
//! real browser, the system's headless Chromium driven by playwright-core (tests/web/, which
//! `scripts/web-deps` installs).

mod common;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use common::*;
use reqwest::StatusCode;
use reqwest::header::{CONTENT_SECURITY_POLICY, COOKIE, HOST, LOCATION, ORIGIN, SET_COOKIE};
use serde_json::{Value, json};

/// alice serves the stub as `svc` to bob; her status page is open.
struct Served {
    alice: TestNode,
    bob: TestNode,
    url: String,
    base: String,
    token: String,
}

fn served(test: &str) -> Served {
    let (alice, bob) = two_nodes();
    alice.serve_stub("svc", &["bob"], None, &marker(test));
    let url = alice.json(&["status", "--web"])["url"]
        .as_str()
        .expect("a url")
        .to_owned();
    let (base, token) = url
        .split_once("/?token=")
        .expect("the url carries the token");
    Served {
        base: base.to_owned(),
        token: token.to_owned(),
        url: url.clone(),
        alice,
        bob,
    }
}

fn client() -> reqwest::Client {
    // rustls needs its crypto provider named first, even for plain HTTP.
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

/// Reads server-sent events off `response`, one `data:` value at a time.
struct Events {
    response: reqwest::Response,
    buffer: String,
}

impl Events {
    async fn next(&mut self) -> Value {
        tokio::time::timeout(ANSWER_TIMEOUT, async {
            loop {
                if let Some(end) = self.buffer.find("\n\n") {
                    let event: String = self.buffer.drain(..end + 2).collect();
                    let data: String = event
                        .lines()
                        .filter_map(|l| l.strip_prefix("data:"))
                        .map(str::trim_start)
                        .collect();
                    if !data.is_empty() {
                        return serde_json::from_str(&data).unwrap();
                    }
                    continue;
                }
                let chunk = self
                    .response
                    .chunk()
                    .await
                    .unwrap()
                    .expect("the stream stays open");
                self.buffer.push_str(&String::from_utf8_lossy(&chunk));
            }
        })
        .await
        .expect("an event in time")
    }

    /// Takes events until one satisfies `cond`; returns it.
    /// The first event for which `cond` holds; bounded as a whole, since the feed keeps
    /// sending events whether or not one ever does.
    async fn until(&mut self, cond: impl Fn(&Value) -> bool) -> Value {
        let mut last = Value::Null;
        let found = tokio::time::timeout(ANSWER_TIMEOUT, async {
            loop {
                let v = self.next().await;
                if cond(&v) {
                    return v;
                }
                last = v;
            }
        })
        .await;
        found.unwrap_or_else(|_| panic!("no such event in {ANSWER_TIMEOUT:?}; the last: {last}"))
    }
}

async fn events(s: &Served) -> Events {
    let response = client()
        .get(format!("{}/api/events", s.base))
        .bearer_auth(&s.token)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    Events {
        response,
        buffer: String::new(),
    }
}

fn has_session_of(v: &Value, peer: &str) -> bool {
    v["sessions"]
        .as_array()
        .is_some_and(|a| a.iter().any(|s| s["peer"] == peer))
}

#[tokio::test(flavor = "multi_thread")]
async fn the_page_refuses_a_missing_or_wrong_token_and_a_foreign_host_or_origin() {
    let s = served("web-guard");
    let http = client();
    let get = |path: &str| http.get(format!("{}{path}", s.base));

    for (what, request) in [
        ("no token", get("/")),
        ("no token, the feed", get("/api/events")),
        ("no token, the state", get("/api/status")),
        ("a wrong token in the URL", get("/?token=wrong")),
        (
            "a wrong bearer token",
            get("/api/status").bearer_auth("wrong"),
        ),
        (
            "a wrong cookie",
            get("/api/status").header(COOKIE, "mcpmesh_status_1=wrong"),
        ),
    ] {
        let r = request.send().await.unwrap();
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "{what}");
        assert!(!r.text().await.unwrap().contains(&s.token));
    }

    // The URL's token is traded for this page's cookie and a clean URL.
    let r = http.get(&s.url).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    assert_eq!(r.headers()[LOCATION], "/");
    let cookie = r.headers()[SET_COOKIE].to_str().unwrap().to_owned();
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    let pair = cookie.split(';').next().unwrap().to_owned();
    assert!(pair.ends_with(&format!("={}", s.token)), "{pair}");
    let page = get("/").header(COOKIE, &pair).send().await.unwrap();
    assert_eq!(page.status(), StatusCode::OK);
    let csp = page.headers()[CONTENT_SECURITY_POLICY].to_str().unwrap();
    assert!(
        csp.contains("script-src 'self'") && !csp.contains("unsafe-inline"),
        "{csp}"
    );
    assert!(page.text().await.unwrap().contains("/app.js"));
    for asset in ["/app.js", "/style.css", "/api/status"] {
        let r = get(asset).header(COOKIE, &pair).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::OK, "{asset}");
    }

    // A page a DNS rebinding points at this port is refused, token or not.
    let foreign_host = get("/api/status")
        .bearer_auth(&s.token)
        .header(HOST, "evil.example:80")
        .send()
        .await
        .unwrap();
    assert_eq!(foreign_host.status(), StatusCode::FORBIDDEN);
    let foreign_origin = get("/api/events")
        .header(COOKIE, &pair)
        .header(ORIGIN, "http://evil.example")
        .send()
        .await
        .unwrap();
    assert_eq!(foreign_origin.status(), StatusCode::FORBIDDEN);

    // Kept private, never logged; the same token across asks.
    let file = s.alice.home().join("status.token");
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&file).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600);
    assert_eq!(s.alice.json(&["status", "--web"])["url"], s.url.as_str());
    let human = s.alice.cli(&["status", "--web"]);
    assert!(String::from_utf8_lossy(&human.stdout).contains(&s.url));
    s.alice.json(&["down"]);
    let log = s.alice.log();
    assert!(log.contains("status page listening"), "{log}");
    assert!(!log.contains(&s.token), "the token is in the log");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_state_shows_what_the_node_serves_and_the_feed_pushes_a_session_as_it_opens() {
    let s = served("web-feed");
    let state: Value = client()
        .get(format!("{}/api/status", s.base))
        .bearer_auth(&s.token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(state["nickname"], "alice");
    assert_eq!(state["id"], s.alice.id.as_str());
    assert_eq!(state["services"][0]["name"], "svc");
    assert_eq!(state["services"][0]["peers"][0], "bob");
    assert_eq!(state["peers"][0]["name"], "bob");
    assert!(state["recent"].is_array() && state["refusals"].is_array());
    assert_eq!(state["roster"], Value::Null);

    let mut feed = events(&s).await;
    let first = feed.next().await;
    assert!(!has_session_of(&first, "bob"), "{first}");

    // The org roster shows once there is one.
    s.alice.json(&["org", "create", "acme"]);
    let in_org = feed.until(|v| !v["roster"].is_null()).await;
    assert_eq!(in_org["roster"]["org"], "acme");
    assert_eq!(in_org["roster"]["members"][0]["user"], "alice");
    assert_eq!(in_org["org"]["name"], "acme");

    let mut session = s.bob.connect("alice/svc");
    session.initialize().await;
    let opened = feed.until(|v| has_session_of(v, "bob")).await;
    assert_eq!(opened["sessions"][0]["service"], "svc");
    // The page shows what the node's checker found, on the checker's schedule.
    let checked = feed.until(|v| v["peers"][0]["reachable"] == true).await;
    let bob = &checked["peers"][0];
    assert_eq!(bob["path"], "direct", "{bob}");
    assert!(bob["rtt_ms"].as_f64().is_some(), "{bob}");
    let recent = opened["recent"].as_array().unwrap();
    assert!(
        recent
            .iter()
            .any(|r| r["event"] == "session_open" && r["peer"] == "bob"),
        "{opened}"
    );

    // A refusal shows among the refusals.
    let mut refused = s.bob.connect("alice/nothing-here");
    let answer = refused.initialize().await;
    assert!(answer["error"].is_object(), "{answer}");
    let with_refusal = feed
        .until(|v| {
            v["refusals"]
                .as_array()
                .is_some_and(|a| a.iter().any(|r| r["service"] == "nothing-here"))
        })
        .await;
    assert_eq!(
        with_refusal["refusals"].as_array().unwrap().last().unwrap()["event"],
        "session_refused"
    );

    session.close_stdin();
    session.wait_eof().await;
    feed.until(|v| !has_session_of(v, "bob")).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_page_serves_a_bounded_number_of_live_viewers() {
    let s = served("web-viewers");
    let mut open = Vec::new();
    for _ in 0..16 {
        open.push(events(&s).await);
    }
    let one_too_many = client()
        .get(format!("{}/api/events", s.base))
        .bearer_auth(&s.token)
        .send()
        .await
        .unwrap();
    assert_eq!(one_too_many.status(), StatusCode::SERVICE_UNAVAILABLE);
    open.pop();
    // The place a closed page held is free again once the node sees it closed.
    let mut again = None;
    for _ in 0..200 {
        let r = client()
            .get(format!("{}/api/events", s.base))
            .bearer_auth(&s.token)
            .send()
            .await
            .unwrap();
        if r.status() == StatusCode::OK {
            again = Some(r);
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(again.is_some(), "a closed page's place was not freed");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_configured_address_is_used_and_one_in_use_is_reported_without_stopping_the_node() {
    let port = free_port();
    let node = TestNode::start_with(
        "alice",
        &format!("[telemetry]\nstatus = \"127.0.0.1:{port}\"\n"),
        &[],
    );
    let url = node.json(&["status", "--web"])["url"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        url.starts_with(&format!("http://127.0.0.1:{port}/?token=")),
        "{url}"
    );

    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let busy = TestNode::start_with(
        "bob",
        &format!("[telemetry]\nstatus = \"127.0.0.1:{port}\"\n"),
        &[],
    );
    let out = busy.cli(&["--json", "status", "--web"]);
    assert!(!out.status.success());
    let err = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(err.contains(&format!("127.0.0.1:{port}")), "{err}");
    // The node runs on.
    assert_eq!(busy.json(&["status"])["nickname"], "bob");
    assert!(busy.log().contains("the status page is not open"));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_token_file_others_can_read_or_unfit_for_a_url_keeps_the_page_closed_and_says_why() {
    use std::os::unix::fs::PermissionsExt;
    let node = TestNode::start("alice");
    let file = node.home().join("status.token");
    std::fs::write(&file, "leaked-token\n").unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = node.cli(&["--json", "status", "--web"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("readable by others") && err.contains("chmod 600"),
        "{err}"
    );
    assert!(!err.contains("leaked-token"), "{err}");

    // It goes in a URL and a cookie as it is.
    std::fs::write(&file, "leaked;token\n").unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let out = node.cli(&["--json", "status", "--web"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("only letters, digits"), "{err}");
    assert!(!err.contains("leaked;token"), "{err}");

    std::fs::write(&file, "leaked-token\n").unwrap();
    let url = node.json(&["status", "--web"])["url"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(url.ends_with("?token=leaked-token"), "{url}");
}

// ---- in a real browser ----

/// The driver's next report line starting with `what`; a `fail` line fails the test.
async fn report(browser: &mut Started, what: &str) -> String {
    tokio::time::timeout(ANSWER_TIMEOUT * 2, async {
        loop {
            match browser.output.recv().await {
                Some(line) if line.starts_with(what) => return line,
                Some(line) if line.starts_with("fail ") => panic!("the browser: {line}"),
                Some(line) => println!("browser: {line}"),
                None => panic!("the browser driver ended before {what:?}"),
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no {what:?} from the browser in time"))
}

/// Where the browser test keeps its screenshots.
fn artifacts() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/test-artifacts/web")
}

/// playwright-core, installed by `scripts/web-deps`, and the system's Chromium; `None` (said
/// loudly) when either is missing outside CI. In CI both must be there.
fn browser_deps() -> Option<(PathBuf, PathBuf)> {
    let modules = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/web/node_modules");
    let chromium = std::env::var_os("CHROMIUM")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/chromium"));
    if modules.join("playwright-core").exists() && chromium.exists() {
        return Some((modules, chromium));
    }
    let why = format!(
        "the browser test needs {} and playwright-core in {}: run scripts/web-deps (as root, it installs chromium too)",
        chromium.display(),
        modules.display()
    );
    cannot_run("the status page browser test", &why);
    None
}

#[tokio::test(flavor = "multi_thread")]
async fn in_a_browser_the_page_shows_a_session_appear_and_disappear_without_reloading() {
    let Some((modules, chromium)) = browser_deps() else {
        return;
    };
    let s = served("web-browser");
    // So that the screenshots show every part of the page: an org, a refusal.
    s.alice.json(&["org", "create", "acme"]);
    let mut refused = s.bob.connect("alice/nothing-here");
    refused.initialize().await;
    // What alice may use on bob: the page's peers table shows bob's catalog for alice.
    s.bob
        .serve_stub("notes", &["alice"], None, &marker("web-browser-notes"));
    s.alice.json(&["services", "--refresh"]);
    let shots = artifacts();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/web/drive.cjs");
    let mut cmd = tokio::process::Command::new("node");
    cmd.arg(&script)
        .args([s.url.as_str(), "bob"])
        .arg(&shots)
        .env("NODE_PATH", &modules)
        .env("CHROMIUM", &chromium)
        .stdin(Stdio::null());
    let (mut browser, ready) = Started::until(&mut cmd, "ready ").await;
    assert_eq!(ready, "ready alice");
    assert_eq!(report(&mut browser, "mounts ").await, "mounts bob notes");

    let mut session = s.bob.connect("alice/svc");
    session.initialize().await;
    assert_eq!(report(&mut browser, "shown ").await, "shown bob");
    session.call(r#"<b id="injected">x</b>"#, json!({})).await;
    report(&mut browser, "escaped").await;

    session.close_stdin();
    session.wait_eof().await;
    assert_eq!(report(&mut browser, "gone ").await, "gone bob");
    let shot = report(&mut browser, "screenshot ").await;
    let errors = report(&mut browser, "errors ").await;
    assert_eq!(errors, "errors 0", "the page logged errors");
    let path = shot.trim_start_matches("screenshot ");
    for file in [PathBuf::from(path), shots.join("live.png")] {
        let png = std::fs::read(&file).unwrap();
        assert!(png.starts_with(b"\x89PNG"), "{}", file.display());
        println!("screenshot kept: {}", file.display());
    }
    let status = tokio::time::timeout(ANSWER_TIMEOUT, browser.child.wait())
        .await
        .expect("the browser driver ends")
        .unwrap();
    assert!(status.success());
}
