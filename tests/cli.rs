//! The command-line contract scripts rely on (DESIGN §8) and the node's process hygiene:
//! `--json` shapes, error lines, private files, one daemon per profile, `down`.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use common::*;
use serde_json::{Value, json};

#[test]
fn json_output_has_the_documented_shapes() {
    let alice = TestNode::start("alice");
    let bob = TestNode::start("bob");
    assert_eq!(alice.id.len(), 64);
    assert!(
        alice.addrs.iter().all(|a| a.starts_with("127.0.0.1:")),
        "{:?}",
        alice.addrs
    );

    let up = alice.json(&["up"]);
    assert_eq!(
        up["socket"],
        json!(alice.home().join("mcpmesh.sock").display().to_string())
    );
    assert!(
        up["ms"].as_f64().is_some_and(f64::is_finite),
        "up reports its time: {up}"
    );

    let add = alice.json(&["peers", "add", "bob", &bob.id, "--addr", &bob.addrs[0]]);
    assert_eq!(add, json!({ "peer": "bob", "id": bob.id }));

    let served = alice.json(&["serve", "notes", "--allow", "bob", "--", "cat"]);
    assert_eq!(served, json!({ "service": "notes", "serving": true }));

    let peers = alice.json(&["peers"]);
    let list = peers["peers"].as_array().unwrap();
    assert_eq!(list.len(), 1);
    assert_eq!(list[0]["name"], "bob");
    assert_eq!(list[0]["id"], bob.id);
    assert_eq!(list[0]["services"], json!(["notes"]));

    let down = alice.json(&["down"]);
    assert_eq!(down["stopped"], true);
    assert!(!alice.home().join("mcpmesh.sock").exists());
}

#[test]
fn failures_are_one_json_line_on_stderr_with_a_stable_code() {
    let alice = TestNode::start("alice");
    let bad_id = error_line(&alice.cli(&["--json", "peers", "add", "bob", "not-a-key"]));
    assert_eq!(bad_id["error"]["code"], -32602);
    let own = error_line(&alice.cli(&["--json", "peers", "add", "me", &alice.id]));
    assert_eq!(own["error"]["code"], -32602);
    let bad_name = error_line(&alice.cli(&["--json", "serve", "a/b", "--", "cat"]));
    assert_eq!(bad_name["error"]["code"], 1001);
    assert!(
        bad_name["error"]["message"]
            .as_str()
            .unwrap()
            .contains("services.a/b")
    );
}

#[test]
fn serve_sets_where_a_url_service_asserts_its_caller_and_id_prints_the_key_to_verify_it() {
    let alice = TestNode::start("alice");
    let url = "http://127.0.0.1:9/mcp";
    let config = || std::fs::read_to_string(alice.home().join("config.toml")).unwrap();
    alice.json(&["serve", "web", "--url", url, "--caller-header", "X-Caller"]);
    assert!(
        config().contains("caller_header = \"X-Caller\""),
        "{}",
        config()
    );
    let doctor = alice.json(&["doctor", "--offline"]).to_string();
    assert!(
        doctor.contains("the caller is asserted in X-Caller"),
        "{doctor}"
    );
    // Replaced without a word about it, the service keeps its choice.
    alice.json(&["serve", "web", "--url", url, "--replace"]);
    assert!(
        config().contains("caller_header = \"X-Caller\""),
        "{}",
        config()
    );
    alice.json(&[
        "serve",
        "web",
        "--url",
        url,
        "--replace",
        "--no-caller-assertion",
    ]);
    assert!(
        config().contains("caller_assertion = false"),
        "{}",
        config()
    );
    for bad in [
        vec!["--caller-header", "bad name"],
        vec![
            "--caller-header",
            "Authorization",
            "--header",
            "authorization=x",
        ],
    ] {
        let mut args = vec!["--json", "serve", "other", "--url", url];
        args.extend(bad);
        let e = error_line(&alice.cli(&args));
        assert_eq!(e["error"]["code"], -32602, "{e}");
        assert!(
            e["error"]["message"]
                .as_str()
                .unwrap()
                .contains("--caller_header"),
            "{e}"
        );
    }
    // Only for --url: with a command they are refused, not ignored.
    for (flags, says) in [
        (vec!["--caller-header", "X"], "go with --url"),
        (vec!["--header", "a=b"], "go with --url"),
        (vec!["--caller-assertion"], "goes with --socket"),
    ] {
        let mut args = vec!["--json", "serve", "x"];
        args.extend(flags);
        args.extend(["--", "cat"]);
        let e = error_line(&alice.cli(&args));
        let message = e["error"]["message"].as_str().unwrap();
        assert!(message.contains(says), "{e}");
    }

    let jwks = alice.json(&["id", "--jwks"]);
    assert_eq!(jwks["keys"].as_array().unwrap().len(), 1, "{jwks}");
    let key = &jwks["keys"][0];
    assert_eq!(
        (&key["kty"], &key["crv"], &key["alg"]),
        (&json!("OKP"), &json!("Ed25519"), &json!("EdDSA"))
    );
    assert_eq!(key["kid"], alice.id.as_str());
    // Without --json too: it is a document to save.
    let plain = alice.cli(&["id", "--jwks"]);
    let parsed: Value = serde_json::from_slice(&plain.stdout).unwrap();
    assert_eq!(parsed, jwks);
}

#[test]
fn serve_writes_how_a_url_service_is_an_oauth_client_and_refuses_what_cannot_work() {
    let alice = TestNode::start("alice");
    let url = "http://127.0.0.1:9/mcp";
    let config = || std::fs::read_to_string(alice.home().join("config.toml")).unwrap();
    let secret = alice.home().join("wiki-secret");
    std::fs::write(&secret, "s3cret-value\n").unwrap();
    let secret = secret.display().to_string();
    alice.json(&[
        "serve",
        "wiki",
        "--url",
        url,
        "--client-id",
        "mesh-7",
        "--client-secret-file",
        &secret,
        "--scope",
        "wiki:read",
        "--scope",
        "wiki:write",
    ]);
    let written = config();
    for line in [
        "[services.wiki.oauth]",
        "client_id = \"mesh-7\"",
        "client_secret = \"s3cret-value\"",
        "scopes = [\"wiki:read\", \"wiki:write\"]",
    ] {
        assert!(written.contains(line), "{line}: {written}");
    }
    // The client credentials grant with a key: the path is kept, not the key.
    let key = alice.home().join("client.pem");
    std::fs::write(&key, "-----BEGIN PRIVATE KEY-----\n").unwrap();
    let key = key.display().to_string();
    alice.json(&[
        "serve",
        "reports",
        "--url",
        url,
        "--client-id",
        "mesh-7",
        "--client-credentials",
        "--client-key-file",
        &key,
    ]);
    let written = config();
    assert!(written.contains("client_credentials = true"), "{written}");
    assert!(
        written.contains(&format!("client_key = \"{key}\"")),
        "{written}"
    );

    let two_lines = alice.home().join("two-lines");
    std::fs::write(&two_lines, "a\nb\n").unwrap();
    let two_lines = two_lines.display().to_string();
    for (flags, says) in [
        (
            vec!["--client-id", "c", "--client-credentials"],
            "client_credentials: needs",
        ),
        (
            vec!["--client-id", "c", "--client-secret-file", &two_lines],
            "alone on one line",
        ),
        (
            vec![
                "--client-id",
                "c",
                "--client-metadata-url",
                "http://h/c.json",
            ],
            "must be an https://",
        ),
    ] {
        let mut args = vec!["--json", "serve", "other", "--url", url];
        args.extend(flags);
        let e = error_line(&alice.cli(&args));
        let message = e["error"]["message"].as_str().unwrap();
        assert!(message.contains(says), "{e}");
    }
    // A key and a secret at once, or client flags without --url, are refused before the node.
    let both = alice.cli(&[
        "serve",
        "other",
        "--url",
        url,
        "--client-id",
        "c",
        "--client-credentials",
        "--client-secret-file",
        &secret,
        "--client-key-file",
        &key,
    ]);
    assert!(!both.status.success());
    let e = error_line(&alice.cli(&["--json", "serve", "x", "--scope", "a", "--", "cat"]));
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("go with --url"),
        "{e}"
    );
    assert!(!config().contains("[services.other"), "{}", config());
}

#[test]
fn a_bad_config_is_a_clear_error_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("config.toml"),
        format!("{HERMETIC}\n[services.notes]\nrun = \"cat\"\nmax_sessions = 0\n"),
    )
    .unwrap();
    let out = std::process::Command::new(MCPMESH)
        .arg("--home")
        .arg(dir.path())
        .args(["--json", "id"])
        .output()
        .unwrap();
    let err = error_line(&out);
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("services.notes.max_sessions"),
        "{err}"
    );
    // The failed start left nothing running behind.
    assert!(!dir.path().join("mcpmesh.sock").exists());
}

#[test]
fn the_device_key_and_the_control_socket_are_private() {
    let alice = TestNode::start("alice");
    let bob = TestNode::start("bob");
    alice.trust(&bob); // the node rewrites its config
    let mode = |p: &str| {
        std::fs::metadata(alice.home().join(p))
            .unwrap()
            .permissions()
            .mode()
            & 0o777
    };
    assert_eq!(mode("device.key"), 0o600);
    assert_eq!(mode("mcpmesh.sock"), 0o600);
    assert_eq!(
        mode("config.toml") & 0o077,
        0,
        "config written by the node is private"
    );
    let key = std::fs::read_to_string(alice.home().join("device.key")).unwrap();
    assert!(
        !alice.log().contains(key.trim()),
        "the key never reaches the log"
    );
}

#[test]
fn a_device_key_reached_through_a_link_is_refused_by_the_node_and_named_by_doctor() {
    let alice = TestNode::start("alice");
    alice.json(&["down"]);
    let key = alice.home().join("device.key");
    let moved = alice.home().join("elsewhere.key");
    std::fs::rename(&key, &moved).unwrap();
    std::os::unix::fs::symlink(&moved, &key).unwrap();
    let secret = std::fs::read_to_string(&moved).unwrap();

    let doctor = alice.cli(&["--json", "doctor", "--offline"]);
    assert_eq!(doctor.status.code(), Some(1), "{doctor:?}");
    let report: Value = serde_json::from_slice(&doctor.stdout).unwrap();
    let check = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["check"] == "device key")
        .unwrap_or_else(|| panic!("no device key check: {report}"))
        .clone();
    assert_eq!(check["status"], "error", "{check}");
    assert!(
        check["message"].as_str().unwrap().contains("symbolic link"),
        "{check}"
    );

    let err = error_line(&alice.cli(&["--json", "up"]));
    let message = err["error"]["message"].as_str().unwrap();
    assert!(message.contains("symbolic link"), "{err}");
    assert!(!message.contains(secret.trim()), "{err}");
    assert!(!alice.home().join("mcpmesh.sock").exists(), "no node runs");
}

#[test]
fn a_second_daemon_for_the_same_profile_refuses_to_start() {
    let alice = TestNode::start("alice");
    let out = alice.cli(&["--json", "daemon"]);
    let err = error_line(&out);
    assert_eq!(err["error"]["code"], 1005);
    // The running node is untouched.
    assert_eq!(alice.json(&["id"])["id"], alice.id);
}

#[test]
fn the_node_keeps_its_identity_and_port_across_restarts() {
    let alice = TestNode::start("alice");
    // Restarted at once, a few times: the stopped node's socket may linger for a moment.
    for _ in 0..3 {
        alice.json(&["down"]);
        let again = alice.json(&["id"]);
        assert_eq!(again["id"], alice.id);
        assert_eq!(
            again["addrs"],
            json!(alice.addrs),
            "same UDP port, so address hints stay valid"
        );
    }
}

/// The UDP ports of the IPv4 addresses a node's `id` lists.
fn ports(id: &Value) -> std::collections::BTreeSet<u16> {
    id["addrs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().parse::<std::net::SocketAddr>().unwrap())
        .filter(std::net::SocketAddr::is_ipv4)
        .map(|a| a.port())
        .collect()
}

#[test]
fn a_node_without_a_bind_setting_keeps_its_port_across_restarts() {
    // No `bind`: iroh's default sockets on every interface. Still hermetic: relays, address
    // lookup and port mapping are off, so nothing is sent unless a peer is dialed.
    let home = tempfile::Builder::new().prefix("mm-").tempdir().unwrap();
    std::fs::write(
        home.path().join("config.toml"),
        "[identity]\nnickname = \"alice\"\n\n[network]\nrelay_mode = \"disabled\"\n",
    )
    .unwrap();
    let node = |args: &[&str]| {
        let out = std::process::Command::new(MCPMESH)
            .arg("--home")
            .arg(home.path())
            .arg("--json")
            .args(args)
            .env_remove("MCPMESH_HOME")
            .output()
            .unwrap();
        parse_ok(&out)
    };
    let first = node(&["id"]);
    let port = ports(&first);
    assert_eq!(port.len(), 1, "one IPv4 port on every address: {first}");
    for _ in 0..3 {
        node(&["down"]);
        let again = node(&["id"]);
        assert_eq!(again["id"], first["id"]);
        assert_eq!(ports(&again), port, "the same UDP port after a restart");
    }
    node(&["down"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn down_stops_every_child_the_node_spawned() {
    let m = marker("down");
    let alice = TestNode::start("alice");
    let bob = TestNode::start("bob");
    alice.trust(&bob);
    bob.trust(&alice);
    alice.serve_stub("svc", &["bob"], None, &m);
    let mut s = bob.connect("alice/svc");
    s.initialize().await;
    let pid = s.call("whoami", json!({})).await["result"]["structuredContent"]["pid"]
        .as_u64()
        .unwrap() as u32;
    assert_eq!(alice.json(&["down"])["stopped"], true);
    assert!(
        wait_exit(pid, Duration::from_secs(2)).await,
        "child {pid} outlived its node"
    );
    assert!(
        procs_with(&m).is_empty(),
        "no child or zombie left: {:?}",
        procs_with(&m)
    );
    // The client sees a clean end of its session.
    s.close_stdin();
    s.wait_eof().await;
}

#[test]
fn serve_socket_writes_an_absolute_path_replaces_run_and_doctor_checks_it() {
    let alice = TestNode::start("alice");
    alice.json(&["serve", "tools", "--", "cat"]);
    // A socket file nobody listens on any more (its server stopped).
    let sock = alice.home().join("srv.sock");
    drop(std::os::unix::net::UnixListener::bind(&sock).unwrap());
    // A relative path is resolved where the command runs, and `run` gives way to `socket`.
    let out = alice
        .command(&[
            "--json",
            "serve",
            "tools",
            "--replace",
            "--socket",
            "srv.sock",
        ])
        .current_dir(alice.home())
        .output()
        .unwrap();
    assert_eq!(
        parse_ok(&out),
        json!({ "service": "tools", "serving": true, "replaced": { "run": ["cat"] }, "allowed_peers": [] })
    );
    let config = std::fs::read_to_string(alice.home().join("config.toml")).unwrap();
    assert!(
        config.contains(&format!("socket = \"{}\"", sock.display())),
        "{config}"
    );
    assert!(!config.contains("run ="), "{config}");
    let status = alice.json(&["status"]);
    assert_eq!(status["services"][0]["socket"], sock.display().to_string());

    // Nothing listens yet: doctor says so and exits 1; once a server listens, it is content.
    let out = alice.cli(&["--json", "doctor"]);
    assert!(!out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("nothing accepts connections on"), "{text}");
    std::fs::remove_file(&sock).unwrap();
    let _listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let doctor = parse_ok(&alice.cli(&["--json", "doctor"]));
    let service = doctor["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["check"] == "service tools" && c["status"] != "warn")
        .cloned()
        .unwrap();
    assert_eq!(service["status"], "ok", "{doctor}");

    // Both at once is refused before anything is written.
    let out = alice.cli(&["serve", "tools", "--socket", "/x.sock", "--", "cat"]);
    assert!(!out.status.success());
}

#[test]
fn serving_a_name_again_is_refused_unless_replace_which_says_who_keeps_access() {
    let alice = TestNode::start("alice");
    let bob = TestNode::start("bob");
    let carol = TestNode::start("carol");
    alice.trust(&bob);
    alice.trust(&carol);
    alice.serve("notes", &["bob", "carol"], &["--", "cat"]);

    let refused = error_line(&alice.cli(&["--json", "serve", "notes", "--", "sh"]));
    assert_eq!(refused["error"]["code"], 1005, "{refused}");
    let message = refused["error"]["message"].as_str().unwrap();
    assert!(message.contains("--replace"), "{message}");
    assert!(message.contains("bob, carol"), "{message}");
    let config = std::fs::read_to_string(alice.home().join("config.toml")).unwrap();
    assert!(
        config.contains("run = [\"cat\"]"),
        "nothing changed: {config}"
    );

    let replaced = alice.json(&["serve", "notes", "--replace", "--", "sh"]);
    assert_eq!(replaced["replaced"], json!({ "run": ["cat"] }));
    assert_eq!(replaced["allowed_peers"], json!(["bob", "carol"]));
    let human = alice.cli(&["serve", "notes", "--replace", "--", "cat"]);
    let text = String::from_utf8_lossy(&human.stdout);
    assert!(
        text.contains("replaced notes (it was run = [\"sh\"]); bob, carol keep access"),
        "{text}"
    );
}

#[test]
fn serve_refuses_a_command_or_socket_that_is_not_there() {
    let alice = TestNode::start("alice");
    let cases: [(&[&str], &str); 4] = [
        (
            &["--", "no-such-mcp-server-anywhere"],
            "not found on the node's PATH",
        ),
        (&["--", "/nonexistent/mcp-server"], "does not exist"),
        (&["--socket", "/nonexistent/srv.sock"], "does not exist"),
        (&["--socket", "/etc/hostname"], "is not a socket"),
    ];
    for (backend, why) in cases {
        let mut args = vec!["--json", "serve", "ghost"];
        args.extend_from_slice(backend);
        let err = error_line(&alice.cli(&args));
        assert_eq!(err["error"]["code"], -32602, "{err}");
        assert!(
            err["error"]["message"].as_str().unwrap().contains(why),
            "{backend:?}: {err}"
        );
    }
    let status = alice.json(&["status"]);
    assert_eq!(status["services"], json!([]), "nothing was served");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_server_that_cannot_start_is_explained_to_the_owner_and_briefly_to_the_caller() {
    use std::os::unix::fs::PermissionsExt;
    let alice = TestNode::start("alice");
    let bob = TestNode::start("bob");
    alice.trust(&bob);
    bob.trust(&alice);
    let script = alice.home().join("notes-server.sh");
    std::fs::write(&script, format!("#!/bin/sh\nexec {}\n", stub())).unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    alice.serve("notes", &["bob"], &["--", script.to_str().unwrap()]);
    std::fs::remove_file(&script).unwrap();

    let mut watch = tokio::process::Command::new(MCPMESH);
    watch
        .arg("--home")
        .arg(alice.home())
        .args(["--json", "watch"]);
    let (mut watch, _) = Started::until(&mut watch, "watching").await;

    let mut s = bob.connect("alice/notes");
    let answer = s
        .request(
            "initialize",
            json!({ "protocolVersion": "2025-06-18", "capabilities": {},
                    "clientInfo": { "name": "t", "version": "0" } }),
        )
        .await;
    assert_eq!(answer["error"]["code"], -32055, "{answer}");
    let told = answer["error"]["message"].as_str().unwrap();
    assert!(
        told.contains("the service could not be started: its command was not found"),
        "{told}"
    );
    assert!(
        !told.contains("notes-server.sh"),
        "no path of alice's: {told}"
    );

    let event: Value = serde_json::from_str(&watch.wait_for("session_refused").await).unwrap();
    assert_eq!(event["code"], -32055);
    assert_eq!(event["peer"], "bob");
    assert!(
        event["reason"]
            .as_str()
            .unwrap()
            .contains("notes-server.sh"),
        "{event}"
    );
    let status = alice.json(&["status"]);
    let failure = &status["services"][0]["last_failure"];
    assert_eq!(failure["peer"], "bob", "{status}");
    assert!(
        failure["reason"]
            .as_str()
            .unwrap()
            .contains("notes-server.sh")
    );
    let human = String::from_utf8_lossy(&alice.cli(&["status"]).stdout).into_owned();
    assert!(human.contains("could not serve bob"), "{human}");
    // Where the owner looks next: the node's log, which holds the server's stderr.
    let log = status["log"].as_str().unwrap();
    assert!(Path::new(log).starts_with(alice.home()), "{status}");
    assert!(human.contains(&format!("node log: {log}")), "{human}");

    let records = alice.stop_and_audit();
    assert!(
        records.iter().any(|r| r["event"] == "session_refused"
            && r["reason"]
                .as_str()
                .is_some_and(|w| w.contains("notes-server.sh"))),
        "{records:?}"
    );
}

#[test]
fn every_failure_under_json_is_one_json_line_on_stderr_with_a_code() {
    let alice = TestNode::start("alice");
    // The one-line rule, and nothing on stdout.
    let only_error = |out: &std::process::Output| -> Value {
        let err = error_line(out);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(
            out.stdout.is_empty(),
            "{:?}",
            String::from_utf8_lossy(&out.stdout)
        );
        assert!(err["error"]["code"].is_i64(), "{err}");
        err
    };
    let usage = only_error(&alice.cli(&["--json", "peers", "add", "bob"]));
    assert_eq!(usage["error"]["code"], 1008);
    let usage = only_error(&alice.cli(&["no-such-verb", "--json"]));
    assert_eq!(usage["error"]["code"], 1008);

    let daemon = alice.cli(&["--json", "daemon"]);
    assert_eq!(only_error(&daemon)["error"]["code"], 1005);

    let local = std::process::Command::new(MCPMESH)
        .args(["--home", "/proc/mcpmesh-nope", "--json", "init"])
        .output()
        .unwrap();
    assert_eq!(only_error(&local)["error"]["code"], 1009);

    let completions = alice.json(&["completions", "bash"]);
    assert_eq!(completions["shell"], "bash");
    assert!(completions["script"].as_str().unwrap().contains("mcpmesh"));

    // A failing check: the report is the answer on stdout, and the failure its one line.
    std::fs::set_permissions(
        alice.home().join("device.key"),
        std::os::unix::fs::PermissionsExt::from_mode(0o644),
    )
    .unwrap();
    let doctor = alice.cli(&["--json", "doctor"]);
    let err = error_line(&doctor);
    assert_eq!(err["error"]["code"], 1010, "{err}");
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("device key")
    );
    let report: Value = serde_json::from_slice(&doctor.stdout).unwrap();
    assert_eq!(report["ok"], false);

    alice.serve("notes", &[], &["--", "cat"]);
    alice.json(&["down"]);
    let month = std::fs::read_dir(alice.home().join("state/audit"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "jsonl"))
        .expect("an audit file");
    let text = std::fs::read_to_string(&month).unwrap();
    std::fs::write(&month, text.replacen("\"notes\"", "\"n0tes\"", 1)).unwrap();
    let verify = alice.cli(&["--json", "audit", "verify"]);
    let err = error_line(&verify);
    assert_eq!(err["error"]["code"], 1010, "{err}");
    let report: Value = serde_json::from_slice(&verify.stdout).unwrap();
    assert_eq!(report["ok"], false);
}

#[test]
fn use_prints_a_complete_valid_block_for_each_client() {
    let alice = TestNode::start("alice");
    let bob = TestNode::start("bob");
    bob.trust(&alice);
    let v = bob.json(&["use", "alice/notes"]);
    // Existing keys stay; one entry per client.
    for key in ["claude_code", "mcpServers", "http_url", "command", "args"] {
        assert!(!v[key].is_null(), "{key}: {v}");
    }
    let clients = &v["clients"];
    let vscode = &clients["vscode"]["config"]["servers"]["alice-notes"];
    assert_eq!(vscode["type"], "stdio", "{v}");
    assert_eq!(vscode["args"], v["args"]);
    assert_eq!(
        clients["claude_desktop"]["config"]["mcpServers"]["alice-notes"]["command"],
        v["command"]
    );
    assert_eq!(clients["cursor"], clients["claude_desktop"]);
    assert!(
        clients["claude_code"]["command_line"]
            .as_str()
            .unwrap()
            .starts_with("claude mcp add alice-notes -- ")
    );
    assert_eq!(
        clients["http"]["config"]["servers"]["alice-notes"]["type"],
        "http"
    );
    // Added by id, not paired: nobody can tell whether alice serves it, and `use` says so.
    assert!(
        v["warning"].as_str().unwrap().contains("cannot tell"),
        "{v}"
    );

    // Every JSON block of the human output parses on its own.
    let out = bob.cli(&["use", "alice/notes"]);
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.starts_with("warning: "), "{stderr}");
    let text = String::from_utf8(out.stdout).unwrap();
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        match (&mut current, line) {
            (None, "  {") => current = Some("{".into()),
            (Some(block), "  }") => {
                block.push('}');
                blocks.push(serde_json::from_str::<Value>(block).unwrap());
                current = None;
            }
            (Some(block), l) => block.push_str(l),
            (None, _) => {}
        }
    }
    assert_eq!(blocks.len(), 3, "{text}");
    assert_eq!(blocks[0], clients["claude_desktop"]["config"]);
    assert_eq!(blocks[1], clients["vscode"]["config"]);
    assert_eq!(blocks[2], clients["http"]["config"]);

    let unknown = error_line(&bob.cli(&["--json", "use", "carol/notes"]));
    assert_eq!(unknown["error"]["code"], 1006);
}

#[test]
fn peers_add_takes_the_eid_form_and_a_host_name() {
    let alice = TestNode::start("alice");
    let bob = TestNode::start("bob");
    let port = bob.addrs[0].rsplit_once(':').unwrap().1;
    let added = alice.json(&[
        "peers",
        "add",
        "bob",
        &format!("eid:{}", bob.id),
        "--addr",
        &format!("localhost:{port}"),
    ]);
    assert_eq!(added["id"], bob.id);
    let peers = alice.json(&["peers"]);
    let addrs = peers["peers"][0]["addrs"].as_array().unwrap();
    assert!(
        addrs
            .iter()
            .any(|a| a == &json!(format!("127.0.0.1:{port}"))),
        "{peers}"
    );
    let no_port = error_line(&alice.cli(&[
        "--json", "peers", "add", "carol", &bob.id, "--addr", "bob.lan",
    ]));
    assert!(
        no_port["error"]["message"]
            .as_str()
            .unwrap()
            .contains("expected HOST:PORT or IP:PORT"),
        "{no_port}"
    );
}

#[test]
fn every_verb_has_an_example_and_the_top_level_help_speaks_to_users() {
    let top = String::from_utf8(
        std::process::Command::new(MCPMESH)
            .arg("--help")
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    assert!(!top.contains("suites"), "{top}");
    assert!(top.contains("Get started:"), "{top}");
    let verbs = [
        "init",
        "id",
        "up",
        "down",
        "daemon",
        "peers",
        "peers add",
        "peers rename",
        "peers remove",
        "serve",
        "unserve",
        "invite",
        "pair",
        "grant",
        "revoke",
        "use",
        "status",
        "watch",
        "doctor",
        "completions",
        "connect",
        "hub",
        "gateway",
        "audit",
        "audit tail",
        "audit verify",
        "audit summary",
        "demo",
    ];
    for verb in verbs {
        let mut args: Vec<&str> = verb.split(' ').collect();
        args.push("--help");
        let out = std::process::Command::new(MCPMESH)
            .args(&args)
            .output()
            .unwrap();
        let help = String::from_utf8(out.stdout).unwrap();
        assert!(help.contains("Examples:\n  mcpmesh "), "{verb}: {help}");
        // Every positional argument is described: no bare `<NAME>` line in its list.
        if let Some(list) = help.split("Arguments:\n").nth(1) {
            for line in list.lines().take_while(|l| !l.is_empty()) {
                let line = line.trim();
                if line.starts_with('<') || line.starts_with('[') {
                    assert!(line.contains("  "), "{verb}: {line:?} has no description");
                }
            }
        }
    }
}

#[test]
fn a_home_that_holds_no_profile_is_refused_not_made_into_a_new_identity() {
    let dir = tempfile::tempdir().unwrap();
    let typo = dir.path().join("mesh-tset");
    for verb in [
        &["status"][..],
        &["serve", "notes", "--", "cat"],
        &["peers"],
    ] {
        let mut args = vec!["--home", typo.to_str().unwrap(), "--json"];
        args.extend_from_slice(verb);
        let out = std::process::Command::new(MCPMESH)
            .args(&args)
            .env_remove("MCPMESH_HOME")
            .output()
            .unwrap();
        let err = error_line(&out);
        assert_eq!(err["error"]["code"], 1006, "{verb:?}: {err}");
        assert!(
            err["error"]["message"].as_str().unwrap().contains("init"),
            "{err}"
        );
        assert!(!typo.exists(), "{verb:?} created {}", typo.display());
    }
    // `init --loopback` makes a hermetic one; a second `init` leaves it alone.
    let home = dir.path().join("mesh");
    let init = |extra: &[&str]| {
        let mut args = vec!["--home", home.to_str().unwrap(), "--json", "init"];
        args.extend_from_slice(extra);
        std::process::Command::new(MCPMESH)
            .args(&args)
            .output()
            .unwrap()
    };
    let made = parse_ok(&init(&["--loopback", "--nickname", "tester"]));
    assert_eq!(made["running"], false, "{made}");
    let up = std::process::Command::new(MCPMESH)
        .args(["--home", home.to_str().unwrap(), "--json", "id"])
        .output()
        .unwrap();
    let id = parse_ok(&up);
    assert_eq!(id["id"], made["id"]);
    assert!(
        id["addrs"]
            .as_array()
            .unwrap()
            .iter()
            .all(|a| a.as_str().unwrap().starts_with("127.0.0.1:")),
        "{id}"
    );
    assert_eq!(error_line(&init(&[]))["error"]["code"], 1005);
    // The config it wrote is private (service env may hold tokens), and doctor agrees.
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(home.join("config.toml"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "config.toml mode {mode:o}");
    let doctor = std::process::Command::new(MCPMESH)
        .args(["--home", home.to_str().unwrap(), "--json", "doctor"])
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&doctor.stdout);
    assert!(!report.contains("config permissions"), "{report}");
    let down = std::process::Command::new(MCPMESH)
        .args(["--home", home.to_str().unwrap(), "down"])
        .output()
        .unwrap();
    assert!(down.status.success());
}

#[tokio::test(flavor = "multi_thread")]
async fn connect_under_json_writes_only_a_failures_json_line_on_stderr() {
    use tokio::io::AsyncReadExt;
    let alice = TestNode::start("alice");
    let bob = TestNode::start("bob");
    alice.trust(&bob);
    bob.trust(&alice);
    // (target, what stderr must be): a refused open, and a session the peer then refuses.
    for target in ["nobody/notes", "alice/notes"] {
        let mut cmd = tokio::process::Command::new(MCPMESH);
        cmd.arg("--home")
            .arg(bob.home())
            .args(["--json", "connect", target])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        let mut s = McpSession::spawn(cmd);
        let mut stderr = s.child.stderr.take().unwrap();
        let answer = s.initialize().await;
        assert_eq!(answer["error"]["code"], -32054, "{target}: {answer}");
        s.close_stdin();
        s.wait_eof().await;
        let mut text = String::new();
        tokio::time::timeout(ANSWER_TIMEOUT, stderr.read_to_string(&mut text))
            .await
            .unwrap()
            .unwrap();
        assert!(!text.contains("session open"), "{target}: {text}");
        let line: Value =
            serde_json::from_str(text.trim()).unwrap_or_else(|_| panic!("{target}: {text:?}"));
        assert_eq!(line["error"]["code"], -32054, "{target}: {line}");
        let status = tokio::time::timeout(ANSWER_TIMEOUT, s.child.wait())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(status.code(), Some(1), "{target}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn connect_to_a_service_it_may_not_use_claims_no_session_and_exits_non_zero() {
    use tokio::io::AsyncReadExt;
    let alice = TestNode::start("alice");
    let bob = TestNode::start("bob");
    alice.trust(&bob);
    bob.trust(&alice);
    alice.serve_stub("notes", &["carol"], None, &marker("notes-refused"));
    let initialize = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "t", "version": "0"}}});
    // Pipes (the node takes the descriptors) and a file on stdin (connect copies the bytes).
    for passed in [true, false] {
        let mut cmd = tokio::process::Command::new(MCPMESH);
        cmd.arg("--home")
            .arg(bob.home())
            .args(["connect", "alice/notes"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        let mut stderr = String::new();
        let (stdout, status) = if passed {
            cmd.stdin(std::process::Stdio::piped());
            let mut s = McpSession::spawn(cmd);
            let mut err = s.child.stderr.take().unwrap();
            let answer = s.request("initialize", initialize["params"].clone()).await;
            s.close_stdin();
            s.wait_eof().await;
            tokio::time::timeout(ANSWER_TIMEOUT, err.read_to_string(&mut stderr))
                .await
                .unwrap()
                .unwrap();
            let status = tokio::time::timeout(ANSWER_TIMEOUT, s.child.wait())
                .await
                .unwrap()
                .unwrap();
            (answer.to_string(), status)
        } else {
            let input = bob.home().join("requests.ndjson");
            std::fs::write(&input, format!("{initialize}\n")).unwrap();
            cmd.stdin(std::fs::File::open(&input).unwrap());
            let out = tokio::time::timeout(ANSWER_TIMEOUT, cmd.output())
                .await
                .unwrap()
                .unwrap();
            stderr = String::from_utf8_lossy(&out.stderr).into_owned();
            (
                String::from_utf8_lossy(&out.stdout).into_owned(),
                out.status,
            )
        };
        assert!(stdout.contains("-32054"), "passed={passed}: {stdout}");
        assert!(
            !stderr.contains("session open"),
            "passed={passed}: {stderr}"
        );
        assert!(stderr.contains("refused"), "passed={passed}: {stderr}");
        assert_eq!(status.code(), Some(1), "passed={passed}: {stderr}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_node_log_is_plain_text_bounded_in_size_and_named_by_doctor() {
    const BOUND: u64 = 4096;
    let alice = TestNode::start_with(
        "alice",
        "",
        &[
            ("MCPMESH_LOG_MAX_BYTES", "4096"),
            ("MCPMESH_LOG", "debug,iroh=warn,noq=warn,noq_proto=warn"),
        ],
    );
    let bob = TestNode::start("bob");
    alice.trust(&bob);
    bob.trust(&alice);
    // A server that talks a lot on stderr before it starts: the node logs every line.
    let script = alice.home().join("chatty.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\ni=0\nwhile [ $i -lt 300 ]; do echo \"chatty line $i of a server that says a lot\" >&2; i=$((i+1)); done\nexec {}\n", stub()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    alice.serve("chatty", &["bob"], &["--", script.to_str().unwrap()]);
    let mut s = bob.connect("alice/chatty");
    s.initialize().await;

    let doctor = alice.json(&["doctor", "--offline"]);
    let log = std::path::PathBuf::from(doctor["log"].as_str().unwrap());
    assert!(log.starts_with(alice.home()), "{doctor}");
    let check = doctor["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["check"] == "log")
        .unwrap_or_else(|| panic!("no log check: {doctor}"));
    assert!(
        check["message"]
            .as_str()
            .unwrap()
            .contains(&log.display().to_string()),
        "{check}"
    );

    let rotated = |n: u32| std::path::PathBuf::from(format!("{}.{n}", log.display()));
    let everything = || -> String {
        [log.clone(), rotated(1), rotated(2), rotated(3)]
            .iter()
            .filter_map(|p| std::fs::read(p).ok())
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .collect()
    };
    // The node reads the server's stderr as it comes: wait for the last line to be logged.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !everything().contains("chatty line 299 ") {
        assert!(
            std::time::Instant::now() < deadline,
            "the server's last stderr line never reached the log"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for p in [log.clone(), rotated(1), rotated(2), rotated(3)] {
        let meta = std::fs::metadata(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        assert!(
            meta.len() <= BOUND,
            "{} is {} bytes",
            p.display(),
            meta.len()
        );
        assert_eq!(meta.permissions().mode() & 0o777, 0o600, "{}", p.display());
        let bytes = std::fs::read(&p).unwrap();
        assert!(!bytes.contains(&0x1b), "colour codes in {}", p.display());
    }
    assert!(!rotated(4).exists(), "only three older files are kept");
    let all = everything();
    assert!(
        !all.contains("chatty line 0 "),
        "the oldest lines were dropped"
    );
}

#[test]
fn values_meant_for_command_substitution_are_alone_on_stdout() {
    let (alice, bob) = two_nodes();
    alice.serve_stub("notes", &[], None, &marker("substitution"));
    let alone = |out: &std::process::Output| {
        assert!(out.status.success(), "{out:?}");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert_eq!(stdout.lines().count(), 1, "one line on stdout: {stdout:?}");
        stdout.trim_end().to_owned()
    };
    // pair "$(mcpmesh invite notes)"
    let invite = alone(&alice.cli(&["invite", "notes"]));
    assert!(invite.starts_with("mcpmesh-invite:"), "{invite}");
    assert!(bob.cli(&["pair", &invite]).status.success());
    let id = alone(&alice.cli(&["id"]));
    assert_eq!(id, alice.json(&["id"])["id"].as_str().unwrap());
    let url = alone(&alice.cli(&["status", "--web"]));
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");
}

/// A profile in `dir` with a service that would leave `marker` behind if its command ran.
fn planted_profile(dir: &Path, marker: &Path) {
    std::fs::write(
        dir.join("config.toml"),
        format!(
            "{HERMETIC}\n[services.evil]\nrun = \"sh -c 'touch {}'\"\n",
            marker.display()
        ),
    )
    .unwrap();
}

fn refused_for_ownership(dir: &Path, args: &[&str], what: &str) {
    let out = std::process::Command::new(MCPMESH)
        .arg("--home")
        .arg(dir)
        .arg("--json")
        .args(args)
        .env_remove("MCPMESH_HOME")
        .output()
        .unwrap();
    let err = error_line(&out);
    let message = err["error"]["message"].as_str().unwrap();
    assert!(message.contains(what), "{args:?}: {message}");
    assert!(
        !dir.join("mcpmesh.sock").exists(),
        "{args:?} started no node"
    );
}

#[test]
fn a_profile_another_user_made_is_refused_by_every_command() {
    let base = tempfile::tempdir().unwrap();
    let home = base.path().join("shared");
    std::fs::create_dir(&home).unwrap();
    let marker = base.path().join("ran");
    planted_profile(&home, &marker);
    let nobody = Some(rustix::process::Uid::from_raw(65534));
    rustix::fs::chown(home.join("config.toml"), nobody, None).unwrap();
    rustix::fs::chown(&home, nobody, None).unwrap();
    for args in [&["status"][..], &["id"], &["init"], &["up"], &["peers"]] {
        refused_for_ownership(&home, args, "owned by");
    }
    assert!(!marker.exists(), "the planted service's command never ran");
}

#[test]
fn a_profile_others_may_write_is_refused_until_it_is_private() {
    let base = tempfile::tempdir().unwrap();
    let home = base.path().join("node");
    std::fs::create_dir(&home).unwrap();
    let marker = base.path().join("ran");
    planted_profile(&home, &marker);
    let chmod = |p: &Path, mode| {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap()
    };
    chmod(&home.join("config.toml"), 0o666);
    refused_for_ownership(&home, &["status"], "chmod go-w");
    chmod(&home.join("config.toml"), 0o600);
    chmod(&home, 0o777);
    refused_for_ownership(&home, &["id"], "chmod go-w");
    chmod(&home, 0o770);
    refused_for_ownership(&home, &["id"], "writable by its group");
    chmod(&home, 0o700);
    let out = std::process::Command::new(MCPMESH)
        .arg("--home")
        .arg(&home)
        .args(["--json", "down"])
        .env_remove("MCPMESH_HOME")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "a private profile is accepted: {out:?}"
    );
    assert!(!marker.exists());
}

#[test]
fn status_and_doctor_say_when_the_config_on_disk_no_longer_loads() {
    let alice = TestNode::start("alice");
    let config = alice.home().join("config.toml");
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, format!("{text}\n[telemetry]\n[telemetry]\n")).unwrap();
    let v = alice.json(&["status"]);
    let error = v["config_error"].as_str().unwrap_or_else(|| panic!("{v}"));
    assert!(error.contains("config.toml"), "{error}");
    let human = alice.cli(&["status"]);
    assert!(human.status.success());
    let said = String::from_utf8_lossy(&human.stderr);
    assert!(said.contains("does not load"), "{said}");
    let doctor = alice.cli(&["doctor"]);
    assert!(!doctor.status.success());
    assert!(
        String::from_utf8_lossy(&doctor.stdout).contains("config.toml"),
        "{doctor:?}"
    );
}

#[test]
fn init_starts_no_node_so_the_config_can_be_edited_first() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("fresh");
    let run = |args: &[&str]| {
        std::process::Command::new(MCPMESH)
            .arg("--home")
            .arg(&home)
            .args(args)
            .env_remove("MCPMESH_HOME")
            .output()
            .unwrap()
    };
    let made = parse_ok(&run(&["--json", "init", "--nickname", "tester"]));
    assert_eq!(made["running"], false, "{made}");
    let human = String::from_utf8_lossy(&run(&["init"]).stderr).into_owned();
    assert!(human.contains("already exists"), "{human}");
    // Nothing runs until asked: `down` finds no node.
    let down = parse_ok(&run(&["--json", "down"]));
    assert_eq!(down["was_running"], false, "init started a node: {down}");
    // The config can be edited before the node first goes on the network (here: hermetic),
    // and the identity init printed is the one the node then runs with.
    let config = home.join("config.toml");
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, format!("{text}\n{HERMETIC}")).unwrap();
    let id = parse_ok(&run(&["--json", "id"]));
    assert_eq!(id["id"], made["id"]);
    assert!(run(&["down"]).status.success());
}

#[tokio::test(flavor = "multi_thread")]
async fn serve_env_reaches_the_server_command_and_only_its_key_is_audited() {
    let m = marker("serve-env");
    let (alice, bob) = two_nodes();
    // The server learns its marker from the variable alone: found with it, it had the env.
    let script = format!("exec {} --marker \"$MARK\"", stub());
    let served = alice.json(&[
        "serve",
        "envd",
        "--allow",
        "bob",
        "--env",
        &format!("MARK={m}"),
        "--env",
        "LEVEL=2",
        "--",
        "sh",
        "-c",
        &script,
    ]);
    assert_eq!(served, json!({ "service": "envd", "serving": true }));
    let config = std::fs::read_to_string(alice.home().join("config.toml")).unwrap();
    assert!(config.contains(&format!("MARK = \"{m}\"")), "{config}");

    let mut s = bob.connect("alice/envd");
    let init = s.initialize_as("2025-11-25").await;
    assert_eq!(init["result"]["protocolVersion"], "2025-11-25", "{init}");
    let who = s.call("whoami", json!({})).await;
    let pid = who["result"]["structuredContent"]["pid"]
        .as_u64()
        .unwrap_or_else(|| panic!("{who}"));
    assert!(
        procs_with(&m).iter().any(|(p, _)| u64::from(*p) == pid),
        "the server was not started with MARK from --env"
    );
    s.close_stdin();
    s.wait_eof().await;

    // Bad pairs and reserved names are refused, and nothing is written.
    for bad in ["NOEQUALS", "MCPMESH_PEER_EID=x"] {
        let out = alice.cli(&[
            "--json",
            "serve",
            "envd",
            "--replace",
            "--env",
            bad,
            "--",
            "sh",
            "-c",
            &script,
        ]);
        let error = error_line(&out);
        assert!(
            error["error"]["message"]
                .as_str()
                .unwrap()
                .contains(bad.split('=').next().unwrap()),
            "{error}"
        );
    }
    let after = std::fs::read_to_string(alice.home().join("config.toml")).unwrap();
    assert_eq!(after, config, "a refused serve wrote nothing");

    let records = alice.stop_and_audit();
    let env: Vec<&Value> = records
        .iter()
        .filter(|r| r["event"] == "policy_changed" && r["what"] == "env")
        .collect();
    assert_eq!(env.len(), 1, "{env:?}");
    assert_eq!(env[0]["after"], json!(["LEVEL", "MARK"]), "{:?}", env[0]);
    assert_eq!(env[0]["by"], "command");
    let text = serde_json::to_string(&records).unwrap();
    assert!(!text.contains(&m), "an env value reached the audit log");
}

#[test]
fn grant_takes_any_principal_says_when_it_matches_nobody_and_refuses_an_unknown_kind() {
    let alice = TestNode::start("alice");
    alice.serve(
        "notes",
        &[],
        &["--", stub(), "--marker", &marker("grant-kinds")],
    );
    let error = error_line(&alice.cli(&["--json", "grant", "team:eng", "notes"]));
    let message = error["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("team:eng") && message.contains("org:NAME"),
        "{error}"
    );
    let error = error_line(&alice.cli(&["--json", "grant", "nobody", "notes"]));
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no peer named"),
        "{error}"
    );

    // Outside an org, a roster principal is written but matches nobody yet: said so.
    for principal in ["group:eng", "user:bob", "org:acme"] {
        let granted = alice.json(&["grant", principal, "notes"]);
        assert_eq!(granted["principal"], principal, "{granted}");
        let warning = granted["warning"].as_str().unwrap_or_default();
        assert!(
            warning.contains("until this node joins an org"),
            "{granted}"
        );
    }
    let key = format!("eid:{}", "ab".repeat(32));
    let granted = alice.json(&["grant", &key, "notes", "--tools", "echo"]);
    assert_eq!(granted["principal"], key.as_str(), "{granted}");
    assert_eq!(
        granted["tools"],
        json!({ "allow": ["echo"], "deny": [] }),
        "{granted}"
    );
    let human = String::from_utf8(alice.cli(&["grant", "group:ops", "notes"]).stdout).unwrap();
    assert!(
        human.contains("group:ops may now use notes") && human.contains("warning:"),
        "{human}"
    );
    let status = alice.json(&["status"]);
    assert_eq!(
        status["services"][0]["allow"],
        json!(["group:eng", "user:bob", "org:acme", key, "group:ops"]),
        "{status}"
    );
    let revoked = alice.json(&["revoke", "org:acme", "notes"]);
    assert_eq!(revoked["granted"], false, "{revoked}");
    assert_eq!(revoked["principal"], "org:acme", "{revoked}");
}

#[test]
fn doctor_finds_a_command_where_the_node_runs_it_on_the_services_own_path() {
    let alice = TestNode::start("alice");
    let dir = tempfile::tempdir().unwrap();
    let program = dir.path().join("my-mcp-server");
    std::fs::write(&program, "#!/bin/sh\nexit 0\n").unwrap();
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
    // Found on the service's own PATH only, as the node runs it: serve takes it...
    let path = format!("PATH={}", dir.path().display());
    let args = [
        "serve",
        "tool",
        "--allow",
        "bob",
        "--env",
        &path,
        "--",
        "my-mcp-server",
    ];
    assert_eq!(alice.json(&args)["serving"], true);
    // ...and doctor says where it runs, rather than "command not found".
    let report: Value = serde_json::from_slice(&alice.cli(&["--json", "doctor"]).stdout).unwrap();
    let check = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["check"] == "service tool")
        .cloned()
        .unwrap_or_else(|| panic!("no check of the service: {report}"));
    assert_eq!(check["status"], "ok", "{check}");
    assert_eq!(
        check["message"],
        format!("runs {}", program.display()),
        "{check}"
    );
}

/// The launcher a node starts servers through (`mcpmesh __exec`), run by hand.
fn launcher(parent: u32, input: &[u8]) -> std::process::Output {
    use std::io::Write;
    let mut child = std::process::Command::new(MCPMESH)
        .args(["__exec", "--parent", &parent.to_string()])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(input).unwrap();
    drop(stdin);
    child.wait_with_output().unwrap()
}

#[test]
fn the_launcher_becomes_what_its_stdin_names_and_leaves_the_bytes_after_it_to_that() {
    use mcpmesh::backends::launcher::Launch;
    let launch = Launch {
        program: "/bin/sh".into(),
        args: vec![
            "-c".into(),
            "printf '%s|%s|' \"$GREETING\" \"$PWD\"; cat".into(),
        ],
        env: vec![
            ("GREETING".into(), "overridden".into()),
            ("GREETING".into(), "hi".into()),
        ],
        cwd: Some("/".into()),
    };
    let mut input = launch.encode().unwrap();
    input.extend(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}\n");
    let out = launcher(std::process::id(), &input);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "hi|/|{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}\n"
    );

    // Let go unused (its input ends before a launch): it ends quietly.
    let out = launcher(std::process::id(), b"");
    assert!(out.status.success() && out.stderr.is_empty(), "{out:?}");
    // Garbled or cut off: it starts nothing and says why.
    for bad in [
        &b"\0\0\0\x03{{{"[..],
        &b"\0\0\0\x40{"[..],
        &b"\xff\xff\xff\xff"[..],
    ] {
        let out = launcher(std::process::id(), bad);
        assert_eq!(out.status.code(), Some(126), "{out:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("cannot read what to start"),
            "{out:?}"
        );
        assert!(out.stdout.is_empty(), "{out:?}");
    }
    // A parent that is not the one named: the node is gone, so nothing is started.
    let out = launcher(1, &input);
    assert_eq!(out.status.code(), Some(126), "{out:?}");
    assert!(out.stdout.is_empty(), "{out:?}");
    // A program that is not there: it says so.
    let missing = Launch {
        program: "/nonexistent/server".into(),
        ..launch
    };
    let out = launcher(std::process::id(), &missing.encode().unwrap());
    assert_eq!(out.status.code(), Some(127), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("cannot start /nonexistent/server"),
        "{out:?}"
    );
}
