//! What the node can say about itself: its peers (with reachability, round-trip time and the
//! path their traffic takes, direct or through a relay), what it serves and to whom, live
//! sessions, recent pairings, the org it is in.

use std::time::Duration;

use iroh::EndpointId;
use mcpmesh_net::path::Route;
use serde_json::{Value, json};

use crate::peers::Source;
use crate::telemetry::PeerPath;

use super::node::Node;
use super::reach::Seen;

impl Node {
    /// Every peer with what this node knows of it. Reachability comes from what the node's
    /// checker last found (`checked_at`, unix seconds), so this answers at once even when a
    /// peer is offline; only a peer never checked yet is waited for, briefly.
    pub(super) async fn peers_list(&self) -> Value {
        // A pairing a crash left pending is settled before it is shown.
        self.confirm_pending().await;
        let table = self.gate.snapshot();
        let services = self
            .services
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let stored = self.store.peers().unwrap_or_default();
        let connected = self.registry.connected_peers();
        let ids: Vec<_> = table.all().iter().map(|p| p.id).collect();
        self.reach.first_checks(&ids).await;
        self.reach.refresh();
        let peers: Vec<Value> = table
            .all()
            .iter()
            .map(|p| {
                let identity = p.identity();
                let hex = p.id.to_string();
                let record = stored.iter().find(|s| s.id == hex);
                let seen = self.reach.get(&p.id);
                let mut v = json!({
                    "name": p.name,
                    "id": hex,
                    "addrs": p.addrs.iter().map(ToString::to_string).collect::<Vec<_>>(),
                    "services": services.granted_to(&identity),
                    "tools": services.tools_for(&identity),
                    "mounts": record.map(|r| r.mounts.clone()).unwrap_or_default(),
                    "source": match p.source {
                        Source::Static => "config",
                        other => other.as_str(),
                    },
                    "pending": record.is_some_and(|r| r.pending),
                    "connected": connected.contains(&p.id),
                    "reachable": seen.as_ref().is_some_and(|s| s.reachable),
                });
                if let Some(user) = &p.user {
                    v["user"] = json!(user);
                    v["groups"] = json!(p.groups);
                }
                if let Some(seen) = &seen {
                    v["checked_at"] = json!(seen.checked_at_ms / 1000);
                }
                if let Some(seen) = seen.as_ref().filter(|s| s.reachable) {
                    let (rtt, route) = self.path_now(p.id, seen);
                    if let Some(rtt) = rtt {
                        v["rtt_ms"] = json!((rtt.as_secs_f64() * 1e4).round() / 10.0);
                    }
                    if let Some(route) = route {
                        v["path"] = json!(route.as_str());
                        if let Some(url) = route.relay_url() {
                            v["relay_url"] = json!(url.to_string());
                        }
                    }
                }
                v
            })
            .collect();
        json!({ "peers": peers })
    }

    /// The path a reachable peer's traffic takes now and its round trip: a live connection's
    /// (sessions use it, with QUIC's estimate of its round trip); without one, the last
    /// ping's.
    fn path_now(&self, id: EndpointId, seen: &Seen) -> (Option<Duration>, Option<Route>) {
        let live = self.registry.path(&id);
        let rtt = live.as_ref().map(|l| l.rtt).or(seen.rtt);
        let route = live.map(|l| l.route).or_else(|| seen.route.clone());
        (rtt, route)
    }

    /// Every peer's path and round trip as last known, for the metrics (never waits).
    pub(super) fn peer_paths(&self) -> Vec<PeerPath> {
        self.gate
            .snapshot()
            .all()
            .iter()
            .map(|p| {
                let seen = self.reach.get(&p.id).filter(|s| s.reachable);
                let (rtt, route) = seen
                    .map(|seen| self.path_now(p.id, &seen))
                    .unwrap_or_default();
                PeerPath {
                    peer: p.name.clone(),
                    path: route.map(|r| r.as_str()),
                    rtt,
                }
            })
            .collect()
    }

    /// The metrics endpoint as `status` shows it: `null` when metrics are off.
    fn metrics_status(&self) -> Value {
        match self.metrics_at.get() {
            None => Value::Null,
            Some(Ok(addr)) => json!({ "url": format!("http://{addr}/metrics") }),
            Some(Err(error)) => json!({ "error": error }),
        }
    }

    pub(super) async fn status(&self) -> Value {
        let peers = self.peers_list().await["peers"].take();
        let sessions = self.host.live_sessions();
        let services: Vec<Value> = self
            .settings()
            .services
            .iter()
            .map(|s| {
                let (kind, target) = s.backend.describe();
                json!({
                    "name": s.name,
                    kind: target,
                    "allow": s.allow,
                    "tools": s.tools,
                    "peers": self.admitted(&s.allow),
                    "max_sessions": s.max_sessions,
                    "sessions": sessions.iter().filter(|x| x.service == s.name).count(),
                    "last_failure": self.audit.last_failure(&s.name),
                })
            })
            .collect();
        let pairings: Vec<Value> = self
            .store
            .pairings()
            .unwrap_or_default()
            .into_iter()
            .map(|p| json!({ "peer": p.peer, "code": p.code, "at": p.at / 1000 }))
            .collect();
        let live: Vec<Value> = sessions
            .iter()
            .map(|s| json!({ "peer": s.peer_name, "service": s.service, "since": s.since / 1000 }))
            .collect();
        let outgoing: Vec<Value> = self
            .outgoing
            .list()
            .iter()
            .map(|s| json!({ "peer": s.peer, "service": s.service, "since": s.since / 1000 }))
            .collect();
        let invites = self.store.invites().unwrap_or_default().len();
        json!({
            "id": self.endpoint.id().to_string(),
            "addrs": self.direct_addrs(),
            "nickname": self.settings().nickname,
            "services": services,
            "peers": peers,
            "pairings": pairings,
            "sessions": live,
            "outgoing": outgoing,
            "invites_live": invites,
            "org": self.org_summary(),
            "metrics": self.metrics_status(),
        })
    }
}
