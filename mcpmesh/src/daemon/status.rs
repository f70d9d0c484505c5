//! What the node can say about itself: its peers (with reachability, round-trip time and the
//! path their traffic takes, direct or through a relay), what it serves and to whom, live
//! sessions, recent pairings, the org it is in, and whether its audit log is intact.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Weak};
use std::time::Duration;

use iroh::EndpointId;
use mcpmesh_net::path::Route;
use serde_json::{Value, json};

use crate::control::{ControlError, codes};
use crate::gateway::token;
use crate::peers::Source;
use crate::telemetry::PeerPath;
use crate::web::{StatusPage, StatusSource};

use super::catalog::Catalog;
use super::core::Core;
use super::org::Org;
use super::reach::Seen;
use super::trust::Trust;

/// The node as the status page sees it; held weakly, so an open page never keeps a stopped
/// node's store open.
struct NodeStatus(Weak<Status>);

impl StatusSource for NodeStatus {
    async fn snapshot(&self) -> Value {
        let Some(node) = self.0.upgrade() else {
            return Value::Null;
        };
        // The page asks often: it shows what the checker found on its own schedule instead of
        // asking for new checks each time.
        let mut v = node.status_as_checked(false).await;
        v["roster"] = node.org.org_members().unwrap_or(Value::Null);
        v
    }
}

/// What the node says about itself (`status`, `peers`, the status page, `audit.verify`), and
/// what only it keeps: the page once open, where metrics are served, the sessions this node's
/// own clients have open to peers.
#[derive(Debug)]
pub(super) struct Status {
    core: Arc<Core>,
    trust: Arc<Trust>,
    catalog: Arc<Catalog>,
    org: Arc<Org>,
    /// The status page, opened at start or on the first `status.web`.
    page: super::status_page::StatusPageSlot,
    /// Where the metrics endpoint listens, or why it could not (set once, at start).
    metrics_at: std::sync::OnceLock<Result<SocketAddr, String>>,
    /// The node's log, which `status` names when a service failed.
    log_file: std::path::PathBuf,
    /// Sessions this node's own clients have open to peers.
    outgoing: Outgoing,
    me: Weak<Status>,
}

/// What [`Status`] reads from the other services, and the files it names.
pub(super) struct StatusParts {
    pub(super) core: Arc<Core>,
    pub(super) trust: Arc<Trust>,
    pub(super) catalog: Arc<Catalog>,
    pub(super) org: Arc<Org>,
    pub(super) page: super::status_page::StatusPageSlot,
    pub(super) log_file: std::path::PathBuf,
}

impl Status {
    pub(super) fn new(parts: StatusParts) -> Arc<Status> {
        Arc::new_cyclic(|me| Status {
            core: parts.core,
            trust: parts.trust,
            catalog: parts.catalog,
            org: parts.org,
            page: parts.page,
            metrics_at: Default::default(),
            log_file: parts.log_file,
            outgoing: Default::default(),
            me: me.clone(),
        })
    }

    /// Where the metrics endpoint listens, or why it could not: told once, at start.
    pub(super) fn metrics_opened(&self, at: Result<SocketAddr, String>) {
        let _ = self.metrics_at.set(at);
    }

    /// A session this node's own client opened to `peer`'s `service`; the key closes it.
    pub(super) fn session_opened(&self, peer: &str, service: &str, since: u64) -> u64 {
        self.outgoing.opened(peer, service, since)
    }

    pub(super) fn session_closed(&self, key: u64) {
        self.outgoing.closed(key);
    }

    /// Every peer with what this node knows of it. Reachability comes from what the node's
    /// checker last found (`checked_at`, unix seconds), so this answers at once even when a
    /// peer is offline; only a peer never checked yet is waited for, briefly.
    pub(super) async fn peers_list(&self) -> Value {
        self.peers_as_checked(true).await
    }

    /// [`Status::peers_list`]; with `recheck`, peers not checked in the last moments are checked
    /// again in the background.
    async fn peers_as_checked(&self, recheck: bool) -> Value {
        // A pairing a crash left pending is settled before it is shown.
        self.trust.confirm_pending().await;
        let table = self.core.gate.snapshot();
        let services = self
            .core
            .services
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let stored = self.core.store.peers().unwrap_or_default();
        let connected = self.core.registry.connected_peers();
        let ids: Vec<_> = table.all().iter().map(|p| p.id).collect();
        self.core.reach.first_checks(&ids).await;
        if recheck {
            self.core.reach.refresh();
        }
        // "You may use" is each peer's catalog for this node.
        self.catalog
            .refresh_catalogs(super::catalogs::DEFAULT_MAX_AGE, false)
            .await;
        let peers: Vec<Value> = table
            .all()
            .iter()
            .map(|p| {
                let held = p.principals();
                let hex = p.id.to_string();
                let record = stored.iter().find(|s| s.id == hex);
                let seen = self.core.reach.get(&p.id);
                let mut v = json!({
                    "name": p.name,
                    "id": hex,
                    "addrs": p.addrs.iter().map(ToString::to_string).collect::<Vec<_>>(),
                    "services": services.granted_to(&held),
                    "tools": services.tools_for(&held),
                    // What the peer's catalog last said; before it was asked, what it granted
                    // at pairing.
                    "mounts": self
                        .catalog
                        .mountable_on(&p.id)
                        .or_else(|| record.map(|r| r.mounts.clone()))
                        .unwrap_or_default(),
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
        let live = self.core.registry.path(&id);
        let rtt = live.as_ref().map(|l| l.rtt).or(seen.rtt);
        let route = live.map(|l| l.route).or_else(|| seen.route.clone());
        (rtt, route)
    }

    /// Every peer's path and round trip as last known, for the metrics (never waits).
    pub(super) fn peer_paths(&self) -> Vec<PeerPath> {
        self.core
            .gate
            .snapshot()
            .all()
            .iter()
            .map(|p| {
                let seen = self.core.reach.get(&p.id).filter(|s| s.reachable);
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

    /// Where traces go and how sending them went: `null` when traces are off.
    fn traces_status(&self) -> Value {
        let Some(traces) = self.core.audit.traces() else {
            return Value::Null;
        };
        let e = traces.exports();
        json!({
            "url": traces.url().as_str(),
            "sent": e.sent,
            "failed": e.failed,
            "last_error": e.last_error,
        })
    }

    /// The grant of each `url` service, read off the runtime (a file per service).
    async fn grant_states(&self) -> std::collections::HashMap<String, crate::oauth::GrantState> {
        let Some(files) = self.core.host.grants().map(|book| book.files().clone()) else {
            return Default::default();
        };
        let wanted: Vec<(String, String, bool)> = self
            .core
            .settings()
            .services
            .iter()
            .filter_map(|s| match &s.backend {
                crate::config::BackendSpec::Url { url, oauth, .. } => {
                    Some((s.name.clone(), url.clone(), oauth.is_some()))
                }
                _ => None,
            })
            .collect();
        if wanted.is_empty() {
            return Default::default();
        }
        tokio::task::spawn_blocking(move || {
            wanted
                .into_iter()
                .map(|(name, url, required)| {
                    let state = crate::oauth::GrantState::of(&files, &name, &url, required);
                    (name, state)
                })
                .collect()
        })
        .await
        .unwrap_or_default()
    }

    pub(super) async fn status(&self) -> Value {
        self.status_as_checked(true).await
    }

    async fn status_as_checked(&self, recheck: bool) -> Value {
        let peers = self.peers_as_checked(recheck).await["peers"].take();
        let sessions = self.core.host.live_sessions();
        let grants = self.grant_states().await;
        let settings = self.core.settings();
        let services: Vec<Value> = settings
            .services
            .iter()
            .map(|s| {
                let (kind, target) = s.backend.describe();
                let mut row = json!({
                    "name": s.name,
                    kind: target,
                    "allow": s.allow,
                    "tools": s.tools,
                    "peers": self.core.admitted(&s.allow),
                    "max_sessions": s.max_sessions,
                    "sessions": sessions.iter().filter(|x| x.service == s.name).count(),
                    "last_failure": self.core.audit.last_failure(&s.name),
                });
                if let Some(grant) = grants.get(&s.name).and_then(|g| g.to_json(&s.name)) {
                    row["oauth"] = grant;
                }
                row
            })
            .collect();
        let pairings: Vec<Value> = self
            .core
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
        let invites = self.core.store.invites().unwrap_or_default().len();
        json!({
            "id": self.core.endpoint.id().to_string(),
            "addrs": self.core.direct_addrs(),
            "nickname": self.core.settings().nickname,
            "services": services,
            "peers": peers,
            "pairings": pairings,
            "sessions": live,
            "outgoing": outgoing,
            "invites_live": invites,
            "org": self.org.org_summary(),
            "log": self.log_file.display().to_string(),
            "metrics": self.metrics_status(),
            "traces": self.traces_status(),
            "pid": std::process::id(),
            "config_loaded": self.core.config_file.loaded_digest(),
        })
    }

    /// `status.web`: the status page's URL (with its token), the page opened first if it is
    /// not yet: on `[telemetry] status`, else on an ephemeral loopback port.
    pub(super) async fn status_web(&self) -> Result<Value, ControlError> {
        let slot = &self.page;
        let mut page = slot.page.lock().await;
        if page.is_none() {
            let listen = self
                .core
                .settings()
                .status_listen
                .unwrap_or(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)));
            let local = |e: String| ControlError::new(codes::LOCAL, e);
            let file = slot.token_file.clone();
            let token = self
                .core
                .on_disk(move |_| token::load_or_mint(&file))
                .await
                .ok_or_else(super::core::stopping)?
                .map_err(|e| local(e.to_string()))?;
            // It goes in a URL and a cookie as it is.
            if !token
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            {
                return Err(local(format!(
                    "the status page token {} may hold only letters, digits, '-' and '_': delete it and a new one is minted",
                    slot.token_file.display()
                )));
            }
            let source = Arc::new(NodeStatus(self.me.clone()));
            let opened = StatusPage::start(
                listen,
                token,
                source,
                &self.core.audit,
                slot.audit_dir.clone(),
                self.core.shutdown.child_token(),
            )
            .await
            .map_err(|e| local(e.to_string()))?;
            *page = Some(opened);
        }
        let url = page.as_ref().map(StatusPage::url).unwrap_or_default();
        Ok(json!({ "url": url }))
    }

    /// `audit.verify`: the audit chain, checked against the high-water mark in the store
    /// (which the running node holds locked).
    pub(super) async fn audit_verify(&self) -> Result<Value, ControlError> {
        let local = |e: String| ControlError::new(codes::LOCAL, e);
        let mark = self
            .core
            .store
            .audit_mark()
            .map_err(|e| local(e.to_string()))?;
        let dir = self.page.audit_dir.clone();
        // A long log takes a while to read: not on the runtime's threads.
        let report = tokio::task::spawn_blocking(move || crate::audit::verify(&dir, mark.as_ref()))
            .await
            .map_err(|e| local(e.to_string()))?
            .map_err(|e| local(format!("cannot read the audit log: {e}")))?;
        serde_json::to_value(report).map_err(|e| local(e.to_string()))
    }
}

/// Sessions this node opened to peers' services, for `status`.
#[derive(Debug, Default)]
struct Outgoing {
    live: std::sync::Mutex<(u64, std::collections::BTreeMap<u64, OutgoingSession>)>,
}

/// One session this node opened to a peer's service.
#[derive(Debug, Clone)]
struct OutgoingSession {
    pub(super) peer: String,
    pub(super) service: String,
    /// Unix ms.
    pub(super) since: u64,
}

impl Outgoing {
    fn opened(&self, peer: &str, service: &str, since: u64) -> u64 {
        let mut live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        live.0 += 1;
        let key = live.0;
        live.1.insert(
            key,
            OutgoingSession {
                peer: peer.to_owned(),
                service: service.to_owned(),
                since,
            },
        );
        key
    }

    fn closed(&self, key: u64) {
        self.live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .1
            .remove(&key);
    }

    fn list(&self) -> Vec<OutgoingSession> {
        self.live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .1
            .values()
            .cloned()
            .collect()
    }
}
