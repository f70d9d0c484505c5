//! Real networks, with iroh's own relay server: two nodes in network namespaces of their own
//! (`scripts/netns`), the relay in a third, direct traffic between the nodes dropped or let
//! through by a firewall rule. Nothing leaves the namespaces the test builds.
//!
//! Needs root (to build namespaces) and `nft` (scripts/net-deps). Where namespaces cannot be
//! built, every test here says so loudly on stderr and passes without running.

mod common;

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use common::*;
use mcpmesh::pairing::Invite;
use serde_json::{Value, json};

const RELAY: &str = env!("CARGO_BIN_EXE_mcpmesh-test-relay");
const DNS: &str = env!("CARGO_BIN_EXE_mcpmesh-test-dns");
/// Where scripts/netns puts the relay and the two nodes.
const INFRA_IP: &str = "10.77.0.1";
const A_IP: &str = "10.77.0.2";
const B_IP: &str = "10.77.0.3";
/// Where `scripts/netns move` puts a.
const A_MOVED_IP: &str = "10.77.0.12";
/// The zone mcpmesh-test-dns serves.
const DNS_ORIGIN: &str = "mcpmesh.test";
/// How soon a node that moved must be reached again through discovery.
const REDISCOVERY_LIMIT: Duration = Duration::from_secs(60);
/// How soon a live session must change path: to direct once let through, to the relay once not.
const PATH_CHANGE_LIMIT: Duration = Duration::from_secs(10);

fn netns_script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/netns")
}

fn run_netns(args: &[&str]) -> Output {
    Command::new(netns_script()).args(args).output().unwrap()
}

fn netns_ok(args: &[&str]) {
    let out = run_netns(args);
    assert!(
        out.status.success(),
        "scripts/netns {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Says, past the test harness's capture, that a test did not run and why.
fn skip_loudly(test: &str, why: &str) {
    let _ = writeln!(std::io::stderr(), "\n!!!! SKIPPED {test}: {why}\n");
}

/// One test's three namespaces, removed when dropped (a failing test included).
struct Net {
    prefix: String,
}

impl Net {
    /// Builds a fresh network, or `None` (after saying so) where this machine cannot.
    fn up(test: &str) -> Option<Net> {
        if !rustix::process::geteuid().is_root() {
            skip_loudly(
                test,
                "not running as root; the network suite needs root (CI runs it as root)",
            );
            return None;
        }
        static N: AtomicU32 = AtomicU32::new(0);
        let prefix = format!(
            "t{}x{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        let _ = run_netns(&["gc"]);
        let out = run_netns(&["up", &prefix]);
        let net = Net { prefix };
        if !out.status.success() {
            skip_loudly(
                test,
                &format!(
                    "cannot build network namespaces: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                ),
            );
            return None;
        }
        Some(net)
    }

    fn ns(&self, side: &str) -> String {
        format!("{}-{side}", self.prefix)
    }

    fn block(&self) {
        netns_ok(&["block", &self.prefix]);
    }

    fn unblock(&self) {
        netns_ok(&["unblock", &self.prefix]);
    }

    /// Packets the block rule has dropped so far.
    fn dropped(&self) -> u64 {
        self.dropped_by("mcpmesh_block")
    }

    /// Packets the rules of nftables table `table` in a's namespace have counted so far.
    fn dropped_by(&self, table: &str) -> u64 {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.ns("a")])
            .args(["nft", "list", "table", "inet", table])
            .output()
            .unwrap();
        let rules = String::from_utf8_lossy(&out.stdout);
        let words: Vec<&str> = rules.split_whitespace().collect();
        words
            .windows(2)
            .filter(|w| w[0] == "packets")
            .filter_map(|w| w[1].parse::<u64>().ok())
            .sum()
    }

    /// Shapes `side`'s link with `tc netem ARGS…`; the error when this machine cannot.
    fn netem(&self, side: &str, args: &[&str]) -> Result<(), String> {
        let mut all = vec!["netem", &self.prefix, side];
        all.extend_from_slice(args);
        let out = run_netns(&all);
        match out.status.success() {
            true => Ok(()),
            false => Err(String::from_utf8_lossy(&out.stderr).trim().to_owned()),
        }
    }

    /// iroh's relay server in the infra namespace; returns it with its URL as it printed it.
    async fn relay(&self) -> (Started, String) {
        let mut cmd = tokio::process::Command::new("ip");
        cmd.args(["netns", "exec", &self.ns("infra"), RELAY])
            .arg(format!("{INFRA_IP}:0"));
        let (relay, line) = Started::until(&mut cmd, "http://").await;
        (relay, line.trim().to_owned())
    }

    /// iroh's DNS server in the infra namespace (pkarr over HTTP, the zone `mcpmesh.test` over
    /// UDP DNS), its packets kept under `dir`; returns it with its pkarr URL and DNS address.
    async fn dns_server(&self, dir: &std::path::Path) -> (Started, String, String) {
        let mut cmd = tokio::process::Command::new("ip");
        cmd.args(["netns", "exec", &self.ns("infra"), DNS, INFRA_IP])
            .arg(dir);
        let (server, line) = Started::until(&mut cmd, "pkarr=").await;
        let field = |key: &str| {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(key))
                .unwrap_or_else(|| panic!("no {key} in {line:?}"))
                .to_owned()
        };
        let (pkarr, dns) = (field("pkarr="), field("dns="));
        (server, pkarr, dns)
    }

    /// Runs `mcpmesh ARGS…` for `node` inside namespace `side` (where its daemon lives).
    fn cli_in(&self, side: &str, node: &TestNode, args: &[&str]) -> Output {
        Command::new("ip")
            .args(["netns", "exec", &self.ns(side), MCPMESH, "--home"])
            .arg(node.home())
            .args(args)
            .env_remove("MCPMESH_HOME")
            .output()
            .unwrap()
    }

    /// A node in namespace `side` that uses only `relay`, bound to its namespace's address.
    fn node(&self, side: &str, name: &str, relay: &str) -> TestNode {
        let ip = if side == "a" { A_IP } else { B_IP };
        let network = format!(
            "[network]\nrelay_mode = \"custom\"\nrelay_urls = [\"{relay}\"]\nbind = \"{ip}:0\"\n"
        );
        TestNode::start_in_netns(name, &self.ns(side), &network)
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        let _ = run_netns(&["down", &self.prefix]);
    }
}

/// `url` as iroh spells a relay URL (with its path).
fn relay_url(url: &str) -> String {
    format!("{}/", url.trim_end_matches('/'))
}

fn peer<'a>(list: &'a Value, name: &str) -> &'a Value {
    list["peers"]
        .as_array()
        .and_then(|all| all.iter().find(|p| p["name"] == name))
        .unwrap_or_else(|| panic!("no peer {name} in {list}"))
}

/// alice (in `a`) serves the stub as `notes`; bob (in `b`) redeems her invite. Checks that
/// the invite names the relay.
fn paired(net: &Net, relay: &str, marker: &str) -> (TestNode, TestNode) {
    let alice = net.node("a", "alice", relay);
    let bob = net.node("b", "bob", relay);
    alice.serve_stub("notes", &[], None, marker);
    let line = alice.json(&["invite", "notes"])["invite"]
        .as_str()
        .unwrap()
        .to_owned();
    let invite = Invite::decode(&line).unwrap();
    assert_eq!(invite.relay.as_deref(), Some(relay_url(relay).as_str()));
    assert!(
        invite
            .addrs
            .iter()
            .all(|a| a.starts_with(&format!("{A_IP}:"))),
        "{:?}",
        invite.addrs
    );
    let paired = bob.json(&["pair", &line]);
    assert_eq!(paired["mounts"], json!(["alice/notes"]));
    (alice, bob)
}

async fn echo(s: &mut McpSession, text: &str) {
    let answer = s.call("echo", json!({ "text": text })).await;
    assert_eq!(answer["result"]["content"][0]["text"], text, "{answer}");
}

/// `peers --json` of `node` until `name`'s path is `path`, or `limit` passes.
async fn path_becomes(node: &TestNode, name: &str, path: &str, limit: Duration) -> Option<Value> {
    let deadline = Instant::now() + limit;
    loop {
        let list = node.json(&["peers"]);
        let p = peer(&list, name);
        if p["path"] == path {
            return Some(p.clone());
        }
        if Instant::now() > deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn show(label: &str, p: &Value) {
    println!(
        "{label}: path {} rtt_ms {} relay_url {}",
        p["path"], p["rtt_ms"], p["relay_url"]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn with_direct_traffic_dropped_pairing_and_sessions_go_through_the_relay() {
    let Some(net) = Net::up("relay_only") else {
        return;
    };
    net.block();
    let (_relay, url) = net.relay().await;
    let m = marker("net-relay");
    let (alice, bob) = paired(&net, &url, &m);

    let mut s = bob.connect("alice/notes");
    let init = s.initialize().await;
    assert_eq!(init["result"]["serverInfo"]["name"], "echo-stub", "{init}");
    for i in 0..20 {
        echo(&mut s, &format!("relayed {i}")).await;
    }

    for (node, other) in [(&bob, "alice"), (&alice, "bob")] {
        let list = node.json(&["peers"]);
        let p = peer(&list, other);
        show(&format!("{} sees {other}", node.name), p);
        assert_eq!(p["reachable"], true, "{p}");
        assert_eq!(p["path"], "relay", "{p}");
        assert_eq!(p["relay_url"], relay_url(&url), "{p}");
        assert!(p["rtt_ms"].as_f64().is_some(), "{p}");
        let status = node.json(&["status"]);
        assert_eq!(peer(&status, other)["path"], "relay");
    }
    // The nodes did try each other directly: the rule, not a lack of trying, kept them apart.
    let dropped = net.dropped();
    println!("{dropped} direct packets dropped");
    assert!(dropped > 0);

    let table = String::from_utf8(bob.cli(&["peers"]).stdout).unwrap();
    println!("{table}");
    let row = table.lines().find(|l| l.starts_with("alice ")).unwrap();
    assert!(row.contains(" relay "), "{table}");
    assert!(
        table.contains(&format!(
            "alice is reached through the relay {}",
            relay_url(&url)
        )),
        "{table}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_live_session_moves_to_the_direct_path_once_let_through_without_noticing() {
    let Some(net) = Net::up("upgrade") else {
        return;
    };
    net.block();
    let (_relay, url) = net.relay().await;
    let m = marker("net-upgrade");
    let (alice, bob) = paired(&net, &url, &m);

    let mut s = bob.connect("alice/notes");
    s.initialize().await;
    for i in 0..5 {
        echo(&mut s, &format!("before {i}")).await;
    }
    let relayed = path_becomes(&bob, "alice", "relay", Duration::ZERO)
        .await
        .expect("the session starts on the relay");
    show("bob sees alice, blocked", &relayed);
    let children = procs_with(&m);
    assert_eq!(children.len(), 1, "{children:?}");

    // A call stays in flight across the whole window the move may take.
    let long = json!("in-flight");
    let hold = PATH_CHANGE_LIMIT + Duration::from_secs(2);
    s.start_long_call(long.clone(), hold.as_millis() as u64)
        .await;
    let lifted = Instant::now();
    net.unblock();
    let direct = path_becomes(&bob, "alice", "direct", PATH_CHANGE_LIMIT)
        .await
        .unwrap_or_else(|| {
            panic!("still not direct {PATH_CHANGE_LIMIT:?} after the rule was lifted")
        });
    let took = lifted.elapsed();
    println!("direct {took:?} after the rule was lifted");
    let alice_side = path_becomes(&alice, "bob", "direct", PATH_CHANGE_LIMIT)
        .await
        .expect("alice's side moves too");

    // The call in flight is answered on the session it was sent on, and so are later ones.
    let answer = loop {
        let msg = s.recv().await.expect("the in-flight answer before EOF");
        if msg["id"] == long {
            break msg;
        }
    };
    assert!(answer.get("result").is_some(), "{answer}");
    for i in 0..20 {
        echo(&mut s, &format!("after {i}")).await;
    }
    // Still the one session: the same server child, one session on alice's side.
    assert_eq!(procs_with(&m), children);
    let sessions = alice.json(&["status"])["sessions"].clone();
    assert_eq!(sessions.as_array().map(Vec::len), Some(1), "{sessions}");

    let direct = path_becomes(&bob, "alice", "direct", Duration::ZERO)
        .await
        .unwrap_or(direct);
    show("bob sees alice, let through", &direct);
    show("alice sees bob, let through", &alice_side);
    assert!(direct.get("relay_url").is_none(), "{direct}");
    assert!(direct["rtt_ms"].as_f64().is_some(), "{direct}");
}

#[tokio::test(flavor = "multi_thread")]
async fn with_loss_and_delay_on_one_link_every_call_of_a_sequential_run_is_answered() {
    const CALLS: usize = 100;
    let Some(net) = Net::up("netem") else {
        return;
    };
    let (_relay, url) = net.relay().await;
    let m = marker("net-netem");
    let (_alice, bob) = paired(&net, &url, &m);
    let mut s = bob.connect("alice/notes");
    s.initialize().await;
    echo(&mut s, "unshaped").await;

    // alice's link: 100 ms on the way out, one packet in twenty lost. A kernel without netem
    // gets the loss alone (nftables, each way), and says so.
    let delayed = match net.netem("a", &["delay", "100ms", "loss", "5%"]) {
        Ok(()) => true,
        Err(why) => {
            skip_loudly(
                "netem's 100 ms delay",
                &format!("no tc netem here ({why}); 5% loss each way by nftables instead"),
            );
            netns_ok(&["loss", &net.prefix, "a", "5"]);
            false
        }
    };
    let mut took = Vec::with_capacity(CALLS);
    for i in 0..CALLS {
        let started = Instant::now();
        echo(&mut s, &format!("shaped {i}")).await;
        took.push(started.elapsed());
    }
    took.sort();
    let at = |q: f64| took[((CALLS as f64 * q).ceil() as usize).clamp(1, CALLS) - 1];
    println!(
        "{CALLS} sequential calls, alice's link with {}5% loss: p50 {:?}, p99 {:?}, max {:?}",
        if delayed { "100 ms delay and " } else { "" },
        at(0.50),
        at(0.99),
        took[CALLS - 1]
    );
    if delayed {
        assert!(
            at(0.50) >= Duration::from_millis(100),
            "the delay was applied"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_live_session_falls_back_to_the_relay_when_direct_traffic_is_dropped() {
    let Some(net) = Net::up("fallback") else {
        return;
    };
    let (_relay, url) = net.relay().await;
    let m = marker("net-fallback");
    let (_alice, bob) = paired(&net, &url, &m);
    let mut s = bob.connect("alice/notes");
    s.initialize().await;
    let direct = path_becomes(&bob, "alice", "direct", PATH_CHANGE_LIMIT)
        .await
        .expect("nothing blocks the direct path");
    show("bob sees alice, open", &direct);
    let children = procs_with(&m);

    let dropped = Instant::now();
    net.block();
    // Calls go on being answered while the direct path dies and the relay takes over.
    let (mut calls, mut slowest) = (0, Duration::ZERO);
    let relayed = loop {
        let started = Instant::now();
        echo(&mut s, &format!("across {calls}")).await;
        slowest = slowest.max(started.elapsed());
        calls += 1;
        let list = bob.json(&["peers"]);
        let p = peer(&list, "alice");
        if p["path"] == "relay" {
            break p.clone();
        }
        assert!(
            dropped.elapsed() < PATH_CHANGE_LIMIT,
            "still not on the relay {PATH_CHANGE_LIMIT:?} after direct traffic was dropped: {p}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    println!(
        "on the relay {:?} after direct traffic was dropped; {calls} calls answered meanwhile, the slowest in {slowest:?}",
        dropped.elapsed()
    );
    show("bob sees alice, direct dropped", &relayed);
    assert_eq!(relayed["relay_url"], relay_url(&url), "{relayed}");
    for i in 0..10 {
        echo(&mut s, &format!("relayed {i}")).await;
    }
    assert_eq!(procs_with(&m), children);
}

/// `doctor --json`'s reachability lines, as (status, message), of `node` run inside `side`.
fn reachability(net: &Net, side: &str, node: &TestNode) -> Vec<(String, String)> {
    let out = net.cli_in(side, node, &["--json", "doctor"]);
    let report: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("doctor printed no JSON ({e}): {out:?}"));
    report["checks"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c["check"] == "reachable")
        .map(|c| {
            let text = |k: &str| c[k].as_str().unwrap_or_default().to_owned();
            (text("status"), text("message"))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_node_that_moves_is_found_again_through_the_teams_dns_server() {
    let Some(net) = Net::up("discovery") else {
        return;
    };
    let (mut relay, url) = net.relay().await;
    let data = tempfile::tempdir().unwrap();
    let (mut dns_server, pkarr, dns) = net.dns_server(data.path()).await;
    println!("relay {url}, pkarr relay {pkarr}, dns {dns}");
    // No `bind`: all interfaces, on a port the node keeps across restarts, so a's address is
    // whatever its namespace gives it, and nobody edits a config when that changes.
    let network = format!(
        "[network]\nrelay_mode = \"custom\"\nrelay_urls = [\"{url}\"]\npkarr_relay = \"{pkarr}\"\ndns_origin = \"{DNS_ORIGIN}\"\ndns_nameserver = \"{dns}\"\n"
    );
    let alice = TestNode::start_in_netns("alice", &net.ns("a"), &network);
    let bob = TestNode::start_in_netns("bob", &net.ns("b"), &network);
    let m = marker("net-discovery");
    alice.serve_stub("notes", &[], None, &m);
    let line = alice.json(&["invite", "notes"])["invite"]
        .as_str()
        .unwrap()
        .to_owned();
    let paired = bob.json(&["pair", &line]);
    assert_eq!(paired["mounts"], json!(["alice/notes"]));
    let mut s = bob.connect("alice/notes");
    s.initialize().await;
    echo(&mut s, "before the move").await;
    drop(s);

    // doctor, from b's namespace: every server answers.
    let checks = reachability(&net, "b", &bob);
    println!("doctor on b: {checks:?}");
    assert_eq!(checks.len(), 3, "{checks:?}");
    for (status, message) in &checks {
        assert_eq!(status, "ok", "{message}");
    }
    assert!(checks[0].1.starts_with("relay http://"), "{checks:?}");
    assert!(
        checks[1].1.starts_with(&format!("pkarr relay {pkarr}")),
        "{checks:?}"
    );
    assert!(
        checks[2]
            .1
            .starts_with(&format!("dns zone {DNS_ORIGIN} at {dns}")),
        "{checks:?}"
    );

    // The relay goes away, so nothing can carry b to a but an address; a moves to a new one
    // and comes back up there, and may answer b but not dial it (so b cannot learn the new
    // address from a's own packets). b's hints still name the old address only.
    relay.child.kill().await.unwrap();
    let checks = reachability(&net, "b", &bob);
    println!("doctor on b, relay gone: {checks:?}");
    assert_eq!(checks[0].0, "warn", "{checks:?}");
    assert!(checks[0].1.contains("not reachable: "), "{checks:?}");
    assert_eq!((checks[1].0.as_str(), checks[2].0.as_str()), ("ok", "ok"));

    let port = alice.addrs[0].rsplit(':').next().unwrap().to_owned();
    alice.json(&["down"]);
    netns_ok(&["move", &net.prefix, "a"]);
    netns_ok(&["mute", &net.prefix]);
    let up = net.cli_in("a", &alice, &["--json", "up"]);
    parse_ok(&up);
    let restarted = Instant::now();
    let moved = alice.json(&["id"]);
    println!("alice moved: {}", moved["addrs"]);
    assert!(
        moved["addrs"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| *a == format!("{A_MOVED_IP}:{port}")),
        "{moved}"
    );
    let hints = peer(&bob.json(&["peers"]), "alice")["addrs"].clone();
    assert!(
        hints
            .as_array()
            .unwrap()
            .iter()
            .all(|a| a.as_str().unwrap().starts_with(&format!("{A_IP}:"))),
        "bob's hints name only the old address: {hints}"
    );

    let alice_z32 = alice.id.parse::<iroh::EndpointId>().unwrap().to_z32();
    dns_server.drain();
    // b reaches a again: the new address can only have come from the DNS server (polled:
    // nothing says when a's record is published).
    let mut attempts = 0;
    loop {
        attempts += 1;
        let mut s = bob.connect("alice/notes");
        let init = s.initialize().await;
        if init.get("result").is_some() {
            echo(&mut s, "after the move").await;
            break;
        }
        assert!(
            restarted.elapsed() < REDISCOVERY_LIMIT,
            "bob did not reach alice {REDISCOVERY_LIMIT:?} after she moved: {init}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let took = restarted.elapsed();
    println!(
        "bob reached alice at her new address {took:?} after she came back up ({attempts} attempts)"
    );
    let p = path_becomes(&bob, "alice", "direct", Duration::ZERO)
        .await
        .unwrap_or_else(|| panic!("not direct: {}", bob.json(&["peers"])));
    show("bob sees alice, moved", &p);
    println!(
        "packets alice started toward bob after the move (dropped): {}",
        net.dropped_by("mcpmesh_mute")
    );
    // The DNS server answered a lookup of a's key with her record.
    let served = dns_server.drain();
    let found = served
        .iter()
        .find(|l| l.contains(&alice_z32) && l.contains("found") && l.contains("records"))
        .unwrap_or_else(|| panic!("no lookup of alice answered by the DNS server: {served:#?}"));
    println!("dns server: {found}");
}
