//! The command-line contract scripts rely on (DESIGN §8) and the node's process hygiene:
//! `--json` shapes, error lines, private files, one daemon per profile, `down`.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use common::*;
use serde_json::{Value, json};

fn error_line(out: &std::process::Output) -> Value {
    assert!(!out.status.success(), "expected a failure");
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let line = stderr.lines().last().unwrap_or_default();
    let v: Value = serde_json::from_str(line)
        .unwrap_or_else(|_| panic!("stderr ends in one JSON line: {stderr}"));
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty())
    );
    v
}

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
    assert!(up["ms"].as_f64().is_some_and(|ms| ms >= 0.0), "{up}");

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
    // A relative path is resolved where the command runs, and `run` gives way to `socket`.
    let out = alice
        .command(&["--json", "serve", "tools", "--socket", "srv.sock"])
        .current_dir(alice.home())
        .output()
        .unwrap();
    assert_eq!(
        parse_ok(&out),
        json!({ "service": "tools", "serving": true })
    );
    let config = std::fs::read_to_string(alice.home().join("config.toml")).unwrap();
    let sock = alice.home().join("srv.sock");
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
