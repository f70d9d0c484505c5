//! Real networks, with iroh's own relay server: two nodes in network namespaces of their own
//! (`scripts/netns`), the relay in a third, direct traffic between the nodes dropped or let
//! through by a firewall rule. Nothing leaves the namespaces the test builds. Faults too: delay
//! and loss on a link, a ten-second outage and a one-second blip with a call in flight, the
//! relay killed and started again. The delay is `scripts/netdelay`, a forwarder on a TUN device, so the kernel needs no
//! netem.
//!
//! Needs root (to build namespaces), `nft` and python3 (scripts/net-deps) and /dev/net/tun.
//! Where namespaces cannot be built, every test here says so loudly on stderr and passes
//! without running, except under `CI=true`, where it fails.

mod common;

use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use common::*;
use mcpmesh::pairing::Invite;
use serde_json::{Value, json};

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
/// The node's dial timeout (`[limits] dial_timeout_secs`, default): how soon a caller must hear
/// that its peer is gone.
const DIAL_TIMEOUT: Duration = Duration::from_secs(10);
/// How long an outage lasts: longer than a connection may stay silent (mcpmesh-net's idle
/// timeout, 4 s, with a keep-alive every second), so no connection can ride it out.
const OUTAGE: Duration = Duration::from_secs(10);
/// A blip: shorter than the idle timeout less a keep-alive interval and some slack, so every
/// connection rides it out.
const BLIP: Duration = Duration::from_secs(1);
/// The delay put on a link.
const DELAY: Duration = Duration::from_millis(100);

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

/// One test's three namespaces, removed when dropped (a failing test included).
struct Net {
    prefix: String,
}

impl Net {
    /// Builds a fresh network, or `None` (after saying so) where this machine cannot.
    fn up(test: &str) -> Option<Net> {
        if !rustix::process::geteuid().is_root() {
            cannot_run(
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
            cannot_run(
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
        dropped_in(&self.ns("a"), "mcpmesh_block")
    }

    /// Packets the rules of nftables table `table` in a's namespace have counted so far.
    fn dropped_by(&self, table: &str) -> u64 {
        dropped_in(&self.ns("a"), table)
    }

    /// Holds every packet `side` sends for `delay` (scripts/netdelay, through a TUN device).
    fn delay(&self, side: &str, delay: Duration) {
        netns_ok(&["delay", &self.prefix, side, &delay.as_millis().to_string()]);
    }

    /// Drops `pct`% of `side`'s packets each way, at random.
    fn loss(&self, side: &str, pct: u32) {
        netns_ok(&["loss", &self.prefix, side, &pct.to_string()]);
    }

    /// The live delay forwarders of `side`'s link (scripts/netdelay names its pid file).
    fn forwarders(&self, side: &str) -> Vec<u32> {
        forwarders_of(&self.ns(side))
    }

    /// Starts an outage on `side`'s link: every packet dropped, both ways.
    fn cut(&self, side: &str) {
        netns_ok(&["cut", &self.prefix, side]);
    }

    /// iroh's relay server in the infra namespace; returns it with its URL as it printed it.
    async fn relay(&self) -> (Started, String) {
        self.relay_on(&format!("{INFRA_IP}:0")).await
    }

    /// [`Net::relay`] on `addr` (`IP:PORT`).
    async fn relay_on(&self, addr: &str) -> (Started, String) {
        relay_in(&self.ns("infra"), addr).await
    }

    /// iroh's DNS server in the infra namespace (pkarr over HTTP, the zone `mcpmesh.test` over
    /// UDP DNS), its packets kept under `dir`; returns it with its pkarr URL and DNS address.
    async fn dns_server(&self, dir: &std::path::Path) -> (Started, String, String) {
        let mut cmd = tokio::process::Command::new("ip");
        let dns = kit_bin("mcpmesh-test-dns");
        cmd.args(["netns", "exec", &self.ns("infra"), &dns, INFRA_IP])
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

/// iroh's relay server in namespace `ns` on `addr`; returns it with its URL as it printed it.
async fn relay_in(ns: &str, addr: &str) -> (Started, String) {
    let mut cmd = tokio::process::Command::new("ip");
    cmd.args(["netns", "exec", ns, &kit_bin("mcpmesh-test-relay")])
        .arg(addr);
    let (relay, line) = Started::until(&mut cmd, "http://").await;
    (relay, line.trim().to_owned())
}

/// The live (non-zombie) delay forwarders of namespace `ns`.
fn forwarders_of(ns: &str) -> Vec<u32> {
    procs_with(&format!("/run/mcpmesh-netns/{ns}.delay.pid"))
        .into_iter()
        .filter(|(_, state)| *state != 'Z')
        .map(|(pid, _)| pid)
        .collect()
}

/// Packets the rules of nftables table `table` in namespace `ns` have dropped so far.
fn dropped_in(ns: &str, table: &str) -> u64 {
    let out = Command::new("ip")
        .args(["netns", "exec", ns])
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
    let Some(net) = Net::up("delay_loss") else {
        return;
    };
    let (_relay, url) = net.relay().await;
    let m = marker("net-delay");
    let (alice, bob) = paired(&net, &url, &m);
    let mut s = bob.connect("alice/notes");
    s.initialize().await;
    echo(&mut s, "unshaped").await;
    let unshaped = path_becomes(&bob, "alice", "direct", PATH_CHANGE_LIMIT)
        .await
        .expect("nothing blocks the direct path");
    show("bob sees alice, unshaped", &unshaped);

    // alice's link: everything she sends held 100 ms (so every answer is), one packet in twenty
    // lost each way.
    net.delay("a", DELAY);
    net.loss("a", 5);
    assert_eq!(net.forwarders("a").len(), 1, "one delay forwarder runs");
    let mut took = Vec::with_capacity(CALLS);
    for i in 0..CALLS {
        let started = Instant::now();
        echo(&mut s, &format!("shaped {i}")).await;
        took.push(started.elapsed());
    }
    took.sort();
    let at = |q: f64| took[((CALLS as f64 * q).ceil() as usize).clamp(1, CALLS) - 1];
    let shaped = path_becomes(&bob, "alice", "direct", Duration::ZERO)
        .await
        .unwrap_or_else(|| panic!("no longer direct: {}", bob.json(&["peers"])));
    show("bob sees alice, 100 ms delay and 5% loss", &shaped);
    let lost = net.dropped_by("mcpmesh_loss");
    println!(
        "{CALLS} sequential calls, alice's link with 100 ms delay and 5% loss ({lost} packets \
         lost): p50 {:?}, p99 {:?}, max {:?}",
        at(0.50),
        at(0.99),
        took[CALLS - 1]
    );
    // Both faults were really there: the answers waited, QUIC measured the longer round
    // trip, packets were lost.
    assert!(at(0.50) >= DELAY, "p50 {:?} under the delay", at(0.50));
    let rtt = shaped["rtt_ms"].as_f64().expect("a round trip");
    assert!(rtt >= DELAY.as_millis() as f64, "{shaped}");
    assert!(lost > 0, "no packet lost");

    // The network's teardown ends the forwarder, a process of its own outside the namespace.
    let ns = net.ns("a");
    drop((s, alice, bob));
    drop(net);
    assert_eq!(
        forwarders_of(&ns),
        Vec::<u32>::new(),
        "a forwarder outlived its network"
    );
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

/// The message answering `id` (progress and anything else skipped), or `None` at EOF.
async fn answer_to(s: &mut McpSession, id: &Value) -> Option<Value> {
    loop {
        let msg = s.recv().await?;
        if msg["id"] == *id {
            return Some(msg);
        }
    }
}

/// Whether `answer` is the mesh's own error for a peer or session lost.
fn is_lost(answer: &Value) -> bool {
    answer["error"]["code"] == -32055 && answer["error"]["data"]["source"] == "mcpmesh"
}

/// The session ends (EOF, the `connect` process exits) and alice's server child with it.
async fn ends_without_a_child_left(s: &mut McpSession, marker: &str) {
    s.wait_eof().await;
    let exited = tokio::time::timeout(ANSWER_TIMEOUT, s.child.wait()).await;
    assert!(
        matches!(exited, Ok(Ok(_))),
        "connect still running: {exited:?}"
    );
    assert!(
        eventually(DIAL_TIMEOUT, || procs_with(marker).is_empty()).await,
        "server children left after the session ended: {:?}",
        procs_with(marker)
    );
}

/// How soon after a fault is over a new session must open: iroh's relay clients come back on
/// an exponential backoff (up to 16 s between tries), so a node may need that long to be
/// reachable through its relay again.
const BACK_LIMIT: Duration = Duration::from_secs(30);

/// A new session from bob to alice, initialized and answering, on `path`. Until it opens, each
/// attempt must fail with the band's -32055 (never hang); returns how long it took.
async fn a_new_session_works(bob: &TestNode, path: &str) -> Duration {
    let started = Instant::now();
    let mut failed = 0;
    let mut s = loop {
        let mut s = bob.connect("alice/notes");
        let init = s.initialize().await;
        if init.get("result").is_some() {
            break s;
        }
        assert!(
            is_lost(&init),
            "a new session neither opened nor failed with -32055: {init}"
        );
        failed += 1;
        assert!(
            started.elapsed() < BACK_LIMIT,
            "no new session {BACK_LIMIT:?} after the fault: {init}"
        );
        // Nothing announces that the peer is reachable again: try again shortly.
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    echo(&mut s, "a new session").await;
    let took = started.elapsed();
    let p = path_becomes(bob, "alice", path, Duration::ZERO)
        .await
        .unwrap_or_else(|| panic!("the new session is not {path}"));
    show("bob sees alice on the new session", &p);
    println!("{failed} attempts failed with -32055 before it opened");
    took
}

/// bob has a call in flight to alice when every packet on alice's link is dropped for
/// [`OUTAGE`]. The call is due after the outage, and the connection cannot stay silent that
/// long, so the answer cannot come: the call must fail with the band's -32055 within the dial
/// timeout of the cut. The session then ends, no server child outlives it, and a new session
/// works once the link is back.
async fn outage_mid_call(test: &str, relayed: bool) {
    let Some(net) = Net::up(test) else {
        return;
    };
    if relayed {
        net.block();
    }
    let path = if relayed { "relay" } else { "direct" };
    let (_relay, url) = net.relay().await;
    let m = marker(&format!("net-{test}"));
    let (_alice, bob) = paired(&net, &url, &m);
    let mut s = bob.connect("alice/notes");
    s.initialize().await;
    echo(&mut s, "before the outage").await;
    let before = path_becomes(&bob, "alice", path, PATH_CHANGE_LIMIT)
        .await
        .unwrap_or_else(|| panic!("the session is not {path}"));
    show("bob sees alice before the outage", &before);
    assert_eq!(procs_with(&m).len(), 1, "{:?}", procs_with(&m));

    // Answered by the server 15 s after it was made: after the outage is over.
    let id = json!("across-the-outage");
    s.start_long_call(id.clone(), 15_000).await;
    let cut = Instant::now();
    net.cut("a");
    let (prefix, ns) = (net.prefix.clone(), net.ns("a"));
    let restore = tokio::task::spawn_blocking(move || {
        std::thread::sleep(OUTAGE);
        let dropped = dropped_in(&ns, "mcpmesh_cut");
        netns_ok(&["restore", &prefix, "a"]);
        (Instant::now(), dropped)
    });

    let answer = answer_to(&mut s, &id)
        .await
        .expect("an answer to the call in flight before EOF");
    let answered = cut.elapsed();
    assert!(
        is_lost(&answer),
        "{path} outage: the call in flight was not failed with -32055: {answer}"
    );
    println!(
        "{path} outage: the call in flight failed with -32055 {answered:?} after the cut ({})",
        answer["error"]["message"]
    );
    assert!(
        answered <= DIAL_TIMEOUT,
        "the error came {answered:?} after the cut, later than the dial timeout"
    );
    ends_without_a_child_left(&mut s, &m).await;
    println!(
        "{path} outage: session over, no server child left, {:?} after the cut",
        cut.elapsed()
    );

    let (restored, dropped) = restore.await.expect("the outage ends");
    println!("{path} outage: {dropped} packets dropped on alice's link");
    assert!(dropped > 0, "the outage dropped nothing");
    let took = a_new_session_works(&bob, path).await;
    println!(
        "{path} outage: a new session answered in {took:?}, {:?} after the link came back",
        restored.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_call_in_flight_across_a_ten_second_outage_fails_with_32055_in_time() {
    outage_mid_call("outage_direct", false).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_relayed_call_in_flight_across_a_ten_second_outage_fails_with_32055_in_time() {
    outage_mid_call("outage_relayed", true).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_call_in_flight_across_a_one_second_blip_is_answered_on_the_same_session() {
    let Some(net) = Net::up("blip") else {
        return;
    };
    let (_relay, url) = net.relay().await;
    let m = marker("net-blip");
    let (_alice, bob) = paired(&net, &url, &m);
    let mut s = bob.connect("alice/notes");
    s.initialize().await;
    echo(&mut s, "before the blip").await;
    path_becomes(&bob, "alice", "direct", PATH_CHANGE_LIMIT)
        .await
        .expect("the session is direct");

    // Due after the link is back: the answer can only come over the connection that rode
    // out the blip.
    let id = json!("across-the-blip");
    s.start_long_call(id.clone(), 3_000).await;
    let cut = Instant::now();
    net.cut("a");
    let (prefix, ns) = (net.prefix.clone(), net.ns("a"));
    let dropped = tokio::task::spawn_blocking(move || {
        std::thread::sleep(BLIP);
        let dropped = dropped_in(&ns, "mcpmesh_cut");
        netns_ok(&["restore", &prefix, "a"]);
        dropped
    })
    .await
    .expect("the blip ends");
    assert!(dropped > 0, "the blip dropped nothing");

    let answer = answer_to(&mut s, &id)
        .await
        .expect("an answer to the call in flight before EOF");
    assert!(
        answer.get("result").is_some(),
        "the call in flight across a {BLIP:?} blip was not answered: {answer}"
    );
    println!(
        "blip: the call in flight completed {:?} after the cut",
        cut.elapsed()
    );
    echo(&mut s, "after the blip").await;
    assert_eq!(
        procs_with(&m).len(),
        1,
        "one server child, the session's own"
    );
    s.close_stdin();
    ends_without_a_child_left(&mut s, &m).await;
}

/// bob has a call in flight to alice over the relay (direct traffic dropped) when the relay is
/// killed, and started again on its address `down` later. `down` is longer than a connection
/// may stay silent, so the call cannot be answered: it must fail with the band's -32055 within
/// the dial timeout of the kill. Nothing hangs, no server child outlives its session, and a
/// new session works through the restarted relay.
async fn relay_restart(test: &str, down: Duration) {
    let Some(net) = Net::up(test) else {
        return;
    };
    net.block();
    let (mut relay, url) = net.relay().await;
    let m = marker(&format!("net-{test}"));
    let (_alice, bob) = paired(&net, &url, &m);
    let mut s = bob.connect("alice/notes");
    s.initialize().await;
    for i in 0..5 {
        echo(&mut s, &format!("before {i}")).await;
    }
    let before = path_becomes(&bob, "alice", "relay", Duration::ZERO)
        .await
        .expect("the session is on the relay");
    show("bob sees alice before the restart", &before);

    // Due once the relay has been back for a while.
    let call = down + Duration::from_secs(5);
    let id = json!("across-the-restart");
    s.start_long_call(id.clone(), call.as_millis() as u64).await;
    let killed = Instant::now();
    relay.child.start_kill().expect("the relay is killed");
    relay.child.wait().await.expect("the relay exits");
    let (infra, addr) = (
        net.ns("infra"),
        url.trim_start_matches("http://").to_owned(),
    );
    let back = tokio::spawn(async move {
        tokio::time::sleep(down).await;
        let (relay, url) = relay_in(&infra, &addr).await;
        (relay, url, Instant::now())
    });

    let answer = answer_to(&mut s, &id)
        .await
        .expect("an answer to the call in flight before EOF");
    let answered = killed.elapsed();
    assert!(
        is_lost(&answer),
        "relay down {down:?}: the call in flight was not failed with -32055: {answer}"
    );
    println!(
        "relay down {down:?}: the call in flight failed with -32055 {answered:?} after the kill ({})",
        answer["error"]["message"]
    );
    assert!(
        answered <= DIAL_TIMEOUT,
        "the error came {answered:?} after the kill, later than the dial timeout"
    );
    ends_without_a_child_left(&mut s, &m).await;
    let (_relay, again, up) = back.await.expect("the relay starts again");
    assert_eq!(again, url, "the relay is back on its address");
    println!("relay killed, back {:?} later", up - killed);

    let took = a_new_session_works(&bob, "relay").await;
    println!(
        "relay down {down:?}: a new session answered in {took:?}, {:?} after the kill",
        killed.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_relay_down_past_the_idle_timeout_fails_the_call_in_flight_and_a_new_session_works_when_it_is_back()
 {
    relay_restart("relay_restart", Duration::from_secs(6)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_relay_down_longer_than_the_dial_timeout_fails_the_call_in_flight_with_32055_in_time() {
    relay_restart("relay_down", DIAL_TIMEOUT + Duration::from_secs(2)).await;
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
