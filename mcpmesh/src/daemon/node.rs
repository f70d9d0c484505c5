//! The running node as the control API sees it: its state, how config and store changes take
//! effect, and the dispatch of control methods to the verbs (here and in `trust`, `status`).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, RwLock};

use iroh::{Endpoint, EndpointId};
use mcpmesh_net::endpoint::{self, RelayPolicy};
use mcpmesh_net::gate::CLOSE_SEVERED;
use mcpmesh_net::ping::ALPN_PING;
use mcpmesh_net::registry::ConnectionRegistry;
use mcpmesh_net::session::{ALPN_MCP, DialError, Dialer, OpenedSession, valid_service_name};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::audit::{AuditEvent, AuditSink};
use crate::backends::preflight;
use crate::config::{self, ConfigFile, Settings, parse_endpoint_id};
use crate::control::server::{ControlHandler, Reply};
use crate::control::{ControlError, SessionOpen, codes, methods};
use crate::pairing::ALPN_PAIR;
use crate::peers::{KnownPeer, PeerGate, PeerTable, Source, yield_claimed_names};
use crate::principal::{Principal, PrincipalSource, is_allowed};
use crate::proxy;
use crate::roster::RosterView;
use crate::roster::invite::ALPN_JOIN;
use crate::roster::sync::ALPN_ROSTER;
use crate::services::{ServiceHost, ServiceTable};
use crate::store::{Store, StoredPeer};
use crate::telemetry::Dialed;

use super::DRAIN_TIMEOUT;
use super::reach::Reachability;

/// How long a verb that hands out this node's address waits for its home relay.
const HOME_RELAY_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

/// The running node.
#[derive(Debug)]
pub(super) struct Node {
    pub(super) config_file: ConfigFile,
    /// The one writer of the store and config file; no write happens on the runtime thread.
    pub(super) disk: crate::disk::Disk,
    pub(super) settings: RwLock<Settings>,
    pub(super) store: Arc<Store>,
    pub(super) endpoint: Endpoint,
    pub(super) gate: Arc<PeerGate>,
    pub(super) services: Arc<RwLock<ServiceTable>>,
    pub(super) host: Arc<ServiceHost>,
    pub(super) registry: Arc<ConnectionRegistry>,
    pub(super) dialer: Arc<Dialer>,
    pub(super) shutdown: CancellationToken,
    pub(super) audit: AuditSink,
    /// Held while a pairing picks a name for a new peer and stores it.
    pub(super) naming: tokio::sync::Mutex<()>,
    /// Sessions this node's own clients have open to peers.
    pub(super) outgoing: Outgoing,
    /// What this node's peers last answered when asked for their catalog.
    pub(super) catalogs: super::catalogs::Catalogs,
    /// The org's gossip (roster serials, catalog changes).
    pub(super) gossip: super::swarm::OrgGossip,
    /// What the node last found of each peer's reachability.
    pub(super) reach: Reachability,
    /// The org roster this node holds, if it is in an org.
    pub(super) roster_held: RwLock<Option<Arc<RosterView>>>,
    /// Why the roster in the store could not be loaded, until a good one is installed.
    pub(super) roster_damage: RwLock<Option<String>>,
    /// Rosters refused from peers, recorded without letting a peer flood the audit log.
    pub(super) roster_refusals: crate::audit::RosterRefusals,
    /// Held while a roster is checked and installed, so two never interleave.
    pub(super) org_lock: std::sync::Mutex<()>,
    /// Where the org root key is kept on the admin's node.
    pub(super) root_file: std::path::PathBuf,
    /// The node's log, which `status` names when a service failed.
    pub(super) log_file: std::path::PathBuf,
    /// The status page, opened at start or on the first `status.web`.
    pub(super) status_page: super::status_page::StatusPageSlot,
    /// The node itself, for work it hands to tasks of its own.
    pub(super) weak_self: std::sync::OnceLock<std::sync::Weak<Node>>,
    /// Where the metrics endpoint listens, or why it could not (set once, at start).
    pub(super) metrics_at: std::sync::OnceLock<Result<SocketAddr, String>>,
}

/// Sessions this node opened to peers' services, for `status`.
#[derive(Debug, Default)]
pub(super) struct Outgoing {
    live: std::sync::Mutex<(u64, std::collections::BTreeMap<u64, OutgoingSession>)>,
}

/// One session this node opened to a peer's service.
#[derive(Debug, Clone)]
pub(super) struct OutgoingSession {
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

    pub(super) fn list(&self) -> Vec<OutgoingSession> {
        self.live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .1
            .values()
            .cloned()
            .collect()
    }
}

impl Node {
    /// Makes `settings` (with the store's peers) the running configuration: trust, services
    /// and address hints. This is the one place a trust change takes effect: peers no longer
    /// trusted lose their connections, and every live session whose caller is no longer
    /// admitted to its service (a revoke, an unserve, a hand edit) is severed at once.
    /// Returns how many sessions were severed.
    pub(super) fn apply(&self, settings: Settings) -> usize {
        self.apply_by(settings, "command")
    }

    /// [`Node::apply`], auditing each change of a service's `allow`, tool rules or env as
    /// made `by` a verb (`command`) or a hand edit read again (`reload`).
    pub(super) fn apply_by(&self, settings: Settings, by: &str) -> usize {
        for change in super::policy::changes(&self.settings().services, &settings.services, by) {
            self.audit.record(change);
        }
        let stored = self.store.peers().unwrap_or_else(|e| {
            tracing::error!("{e}");
            Vec::new()
        });
        let new = peer_table(
            &settings,
            &stored,
            self.roster().as_deref(),
            self.endpoint.id(),
        );
        let old = self.gate.snapshot();
        for gone in old.all().iter().filter(|p| new.by_id(&p.id).is_none()) {
            let n = self
                .registry
                .sever(&gone.id, CLOSE_SEVERED, b"no longer trusted");
            self.dialer.forget(&gone.id);
            tracing::info!(peer = %gone.name, severed = n, "peer removed");
        }
        for hint in new.address_hints() {
            self.dialer.add_address_hint(hint);
        }
        self.gate.replace(new);
        // New peers (and new addresses) are checked at once.
        self.reach.poke();
        let services_changed = self.settings().services != settings.services;
        let table = {
            let mut table = self.services.write().unwrap_or_else(|p| p.into_inner());
            *table = table.rebuild(&settings.services);
            table.clone()
        };
        // Members that cached this node's catalog ask for it again.
        if services_changed && let Some(node) = self.arc() {
            tokio::spawn(async move { node.announce_catalog().await });
        }
        *self.settings.write().unwrap_or_else(|p| p.into_inner()) = settings;
        let severed = self.host.sever_where(|s| {
            let caller = self.gate.principals_of(&s.peer);
            match (caller, table.get(&s.service)) {
                (Some(held), Some(entry)) => !is_allowed(&entry.spec.allow, &held),
                _ => true,
            }
        });
        // The sessions that stay learn whether their tool list changed.
        self.host.tools_changed();
        severed
    }

    /// The node as a shared handle (`None` only while it is being torn down).
    pub(super) fn arc(&self) -> Option<Arc<Node>> {
        self.weak_self.get()?.upgrade()
    }

    /// Re-applies the current settings (after the store changed).
    pub(super) fn refresh(&self) {
        let settings = self.settings().clone();
        self.apply(settings);
    }

    pub(super) fn settings(&self) -> std::sync::RwLockReadGuard<'_, Settings> {
        self.settings.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Edits config.toml (validated, atomic) and applies the result; returns how many live
    /// sessions the change severed. Runs on the node's writer, like every write.
    pub(super) fn edit(
        &self,
        change: impl FnOnce(&mut toml_edit::DocumentMut) -> Result<(), String>,
    ) -> Result<usize, ControlError> {
        let settings = self
            .config_file
            .edit(change)
            .map_err(|e| ControlError::new(codes::CONFIG, e.to_string()))?;
        Ok(self.apply(settings))
    }

    pub(super) fn trust_event(&self, action: &str, peer: Option<&str>, service: Option<&str>) {
        self.audit.record(AuditEvent::Trust {
            action: action.to_owned(),
            peer: peer.map(str::to_owned),
            service: service.map(str::to_owned),
        });
    }

    /// Offers the pairing and join ALPNs only while an invite of theirs is live.
    pub(super) fn update_alpns(&self) {
        let live = self
            .store
            .prune_invites(crate::time::unix_ms() / 1000)
            .unwrap_or(0);
        let joins = self
            .store
            .prune_join_invites(crate::time::unix_ms() / 1000)
            .unwrap_or(0);
        let mut alpns = vec![
            ALPN_MCP.to_vec(),
            ALPN_PING.to_vec(),
            ALPN_ROSTER.to_vec(),
            crate::catalog::ALPN_CATALOG.to_vec(),
            super::swarm::ALPN_GOSSIP.to_vec(),
        ];
        if live > 0 {
            alpns.push(ALPN_PAIR.to_vec());
        }
        if joins > 0 {
            alpns.push(ALPN_JOIN.to_vec());
        }
        self.endpoint.set_alpns(alpns);
    }

    /// Periodic upkeep: expired invites go (and with the last one the pairing ALPN), grants a
    /// pairing still owes are written, and rate buckets of callers that went idle are
    /// dropped, so limiter memory stays bounded.
    pub(super) fn housekeeping(&self) {
        self.update_alpns();
        self.settle_owed_grants();
        let table = self
            .services
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        for name in table.names() {
            if let Some(entry) = table.get(&name) {
                entry.limiter.evict_idle();
            }
        }
    }

    pub(super) async fn stop_sessions(&self) {
        self.shutdown.cancel();
        if tokio::time::timeout(DRAIN_TIMEOUT, self.host.drain())
            .await
            .is_err()
        {
            tracing::warn!("some sessions did not end in time");
        }
    }

    pub(super) fn direct_addrs(&self) -> Vec<String> {
        endpoint::direct_addrs(&self.endpoint)
            .iter()
            .map(SocketAddr::to_string)
            .collect()
    }

    /// Waits, briefly, until this node is connected to its home relay, when it uses relays:
    /// an invite or a roster seat minted in the first moments after start would otherwise
    /// carry no relay, and a peer that cannot reach this node directly could not use it.
    async fn home_relay_settled(&self) {
        if self.settings().network.relay == RelayPolicy::Disabled || self.home_relay().is_some() {
            return;
        }
        let _ = tokio::time::timeout(HOME_RELAY_WAIT, self.endpoint.online()).await;
    }

    /// The relay this node can be reached through, when it has one (never waited for).
    pub(super) fn home_relay(&self) -> Option<String> {
        self.endpoint
            .addr()
            .relay_urls()
            .next()
            .map(ToString::to_string)
    }

    fn node_id_result(&self) -> Value {
        json!({ "id": self.endpoint.id().to_string(), "addrs": self.direct_addrs() })
    }

    fn serve(&self, params: Value) -> Result<Value, ControlError> {
        let serve: ServeParams = params_of(params)?;
        let existing = self.service_spec(&serve.name);
        let backend = backend_of(&serve, existing.as_ref())?;
        if let Some(old) = &existing
            && !serve.replace
        {
            return Err(self.already_served(&serve.name, old));
        }
        // A replaced service keeps its env and cwd, so its command is looked for with them.
        let (mut env, cwd) = existing
            .as_ref()
            .map(|old| (old.env.clone(), old.cwd.clone()))
            .unwrap_or_default();
        env.extend(serve.env.clone());
        preflight::check(&backend, &env, cwd.as_deref())
            .map_err(|e| ControlError::invalid_params(e.to_string()))?;
        if let Some(text) = &serve.description {
            crate::catalog::valid_description(text)
                .map_err(|e| ControlError::invalid_params(format!("--description: {e}")))?;
        }
        self.edit(|doc| {
            config::set_service(doc, &serve.name, &backend, &serve.allow, serve.max_sessions)?;
            config::set_env(doc, &serve.name, &serve.env)?;
            match &serve.description {
                Some(text) => config::set_description(doc, &serve.name, Some(text)),
                None => Ok(()),
            }
        })?;
        self.audit.forget_failure(&serve.name);
        self.trust_event("serve", None, Some(&serve.name));
        let allow = self
            .service_spec(&serve.name)
            .map(|s| s.allow)
            .unwrap_or_default();
        let mut result = json!({ "service": serve.name, "serving": true, "allowed_peers": self.admitted(&allow) });
        if let Some(old) = existing {
            let (key, value) = old.backend.describe();
            result["replaced"] = json!({ key: value });
        }
        Ok(result)
    }

    /// Why `serve` did not replace the service `name` already is, and how to.
    fn already_served(&self, name: &str, old: &config::ServiceSpec) -> ControlError {
        let (key, value) = old.backend.describe();
        let who = self.admitted(&old.allow);
        ControlError::new(
            codes::CONFLICT,
            format!(
                "a service named {:?} already exists ({key} = {value}, {}); to replace it and keep its grants, run the same command with --replace, or `mcpmesh unserve {}` first",
                name,
                shared_with(&who),
                name
            ),
        )
    }

    fn service_spec(&self, name: &str) -> Option<config::ServiceSpec> {
        self.settings()
            .services
            .iter()
            .find(|s| s.name == name)
            .cloned()
    }

    /// The peers an `allow` list admits, by name.
    pub(super) fn admitted(&self, allow: &[Principal]) -> Vec<String> {
        self.gate
            .snapshot()
            .all()
            .iter()
            .filter(|p| is_allowed(allow, &p.principals()))
            .map(|p| p.name.clone())
            .collect()
    }

    fn unserve(&self, params: Value) -> Result<Value, ControlError> {
        #[derive(Deserialize)]
        struct Unserve {
            name: String,
        }
        let u: Unserve = params_of(params)?;
        let mut existed = false;
        let ended = self.edit(|doc| {
            existed = config::remove_service(doc, &u.name)?;
            Ok(())
        })?;
        if !existed {
            return Err(ControlError::new(
                codes::NOT_FOUND,
                format!("no service named {:?}", u.name),
            ));
        }
        self.audit.forget_failure(&u.name);
        self.trust_event("unserve", None, Some(&u.name));
        Ok(json!({ "service": u.name, "serving": false, "sessions_ended": ended }))
    }

    async fn open_session(&self, open: &SessionOpen) -> Result<OpenedSession, ControlError> {
        let peer = self
            .gate
            .snapshot()
            .by_name(&open.peer)
            .cloned()
            .ok_or_else(|| {
                ControlError::new(
                    codes::UNKNOWN_SERVICE,
                    format!("no peer named {:?}; see `mcpmesh peers`", open.peer),
                )
            })?;
        if !valid_service_name(&open.service) {
            return Err(ControlError::new(
                codes::UNKNOWN_SERVICE,
                "unknown or unauthorized service",
            ));
        }
        // A peer whose last check failed is refused at once, unless a connection to it is
        // open: its sessions are the better witness (a ping can time out under their load),
        // and opening on it checks the peer is there.
        if let Some(age) = self.reach.recently_down(&peer.id)
            && !self.dialer.is_connected(&peer.id)
        {
            return Err(ControlError::new(
                codes::UNREACHABLE,
                format!(
                    "{} is unreachable (it did not answer {:.0} s ago); the node keeps trying, try again in a few seconds",
                    open.peer,
                    age.as_secs_f64().ceil()
                ),
            ));
        }
        let fresh = !self.dialer.is_connected(&peer.id);
        let opened = self.dialer.open(peer.id, &open.service).await;
        match &opened {
            Ok(_) => {
                self.reach.record(peer.id, true);
                self.reach.poke();
                // Two members that just connected compare rosters.
                if fresh && peer.user.is_some() {
                    self.sync_soon(peer.id);
                }
            }
            Err(DialError::Refused) => {}
            Err(_) => self.reach.record(peer.id, false),
        }
        opened.map_err(|e| ControlError::new(e.error_code().code(), format!("{}: {e}", open.peer)))
    }
}

/// The parameters of `serve`.
#[derive(Deserialize)]
struct ServeParams {
    name: String,
    #[serde(default)]
    run: Option<Vec<String>>,
    #[serde(default)]
    socket: Option<std::path::PathBuf>,
    #[serde(default)]
    url: Option<String>,
    #[serde(default)]
    headers: std::collections::BTreeMap<String, String>,
    /// `url`: the server requires an OAuth grant (absent: as the service being
    /// replaced did).
    #[serde(default)]
    oauth: bool,
    /// `url`: how the node registers as the server's OAuth client (a configured
    /// client, a Client ID Metadata Document, scopes), over what the service had.
    #[serde(default)]
    oauth_client: Option<config::OAuthConfig>,
    /// `url`: whether to send the signed caller assertion (absent: as the service
    /// being replaced did, else yes), and in which header.
    #[serde(default)]
    caller_assertion: Option<bool>,
    #[serde(default)]
    caller_header: Option<String>,
    #[serde(default)]
    allow: Vec<String>,
    /// Variables for the server command, set over those the service has.
    #[serde(default)]
    env: std::collections::BTreeMap<String, String>,
    max_sessions: Option<u32>,
    /// What the service is for, shown to the peers it admits.
    #[serde(default)]
    description: Option<String>,
    /// Replacing an existing service (and keeping its grants) must be asked for.
    #[serde(default)]
    replace: bool,
}

/// What `serve` attaches the service to: one of a command, a socket or a url. What is not
/// given is kept from the service being replaced.
fn backend_of(
    serve: &ServeParams,
    existing: Option<&config::ServiceSpec>,
) -> Result<config::BackendSpec, ControlError> {
    let was = existing.map(|old| &old.backend);
    match (&serve.run, &serve.socket, &serve.url) {
        (Some(cmd), None, None) => Ok(config::BackendSpec::Run(cmd.clone())),
        (None, Some(path), None) => socket_backend(serve, path, was),
        (None, None, Some(url)) => url_backend(serve, url, was),
        _ => Err(ControlError::new(
            codes::INVALID_PARAMS,
            "serve takes one of run (a command), socket (a path) or url",
        )),
    }
}

/// A socket service, sending the caller assertion (in `_meta`) if asked, else as before.
fn socket_backend(
    serve: &ServeParams,
    path: &std::path::Path,
    was: Option<&config::BackendSpec>,
) -> Result<config::BackendSpec, ControlError> {
    if serve.caller_header.is_some() {
        return Err(ControlError::invalid_params(
            "--caller-header goes with --url: a socket service gets the assertion in _meta",
        ));
    }
    let was = matches!(
        was,
        Some(config::BackendSpec::Socket {
            caller_assertion: true,
            ..
        })
    );
    Ok(config::BackendSpec::Socket {
        path: path.to_owned(),
        caller_assertion: serve.caller_assertion.unwrap_or(was),
    })
}

/// A url service: its caller assertion's header and its OAuth settings as asked, else as
/// the service being replaced had them.
fn url_backend(
    serve: &ServeParams,
    url: &str,
    was: Option<&config::BackendSpec>,
) -> Result<config::BackendSpec, ControlError> {
    let header_was = match was {
        Some(config::BackendSpec::Url { caller_header, .. }) => caller_header.clone(),
        _ => Some(crate::assertion::DEFAULT_HEADER.to_owned()),
    };
    let caller_header = match (serve.caller_assertion, serve.caller_header.clone()) {
        (Some(false), None) => None,
        (Some(false), Some(_)) => {
            return Err(ControlError::invalid_params(
                "--caller-header names the header of a caller assertion turned off",
            ));
        }
        (None, None) => header_was,
        (_, name) => Some(name.unwrap_or_else(|| crate::assertion::DEFAULT_HEADER.to_owned())),
    };
    if let Some(name) = &caller_header {
        config::valid_caller_header(name, &serve.headers)
            .map_err(|e| ControlError::invalid_params(format!("--{e}")))?;
    }
    let kept = match was {
        Some(config::BackendSpec::Url {
            oauth: Some(kept), ..
        }) => Some(kept.clone()),
        _ => serve.oauth.then(Default::default),
    };
    let oauth = match &serve.oauth_client {
        Some(given) => Some(
            config::oauth_settings(given)
                .map_err(|e| ControlError::invalid_params(format!("--{e}")))?,
        ),
        None => kept,
    };
    Ok(config::BackendSpec::Url {
        url: url.to_owned(),
        headers: serve.headers.clone(),
        caller_header,
        oauth,
    })
}

fn shared_with(peers: &[String]) -> String {
    if peers.is_empty() {
        "shared with nobody".to_owned()
    } else {
        format!("shared with {}", peers.join(", "))
    }
}

/// Static peers from config, then peers met by pairing (a config entry wins on a clash), then
/// the roster's members: a member already trusted gains its user and groups; one that is not
/// is known by its mount name (or, when this node gave that name to another key, by
/// `USER.DEVICE`, else not by name at all but by key). A member's `USER.DEVICE` is never left
/// to another key (see [`yield_claimed_names`]). An expired roster trusts nobody new,
/// and its revoked keys are refused whatever else trusts them.
pub(super) fn peer_table(
    settings: &Settings,
    stored: &[StoredPeer],
    roster: Option<&RosterView>,
    me: EndpointId,
) -> PeerTable {
    let mut peers: Vec<KnownPeer> = settings
        .peers
        .iter()
        .map(|p| KnownPeer::new(p.name.clone(), p.id, p.addrs.clone(), Source::Static))
        .collect();
    for sp in stored {
        let Some(id) = parse_endpoint_id(&sp.id) else {
            continue;
        };
        if peers.iter().any(|p| p.id == id || p.name == sp.name) {
            continue;
        }
        let addrs = sp.addrs.iter().filter_map(|a| a.parse().ok()).collect();
        peers.push(KnownPeer::new(sp.name.clone(), id, addrs, Source::Paired));
    }
    let Some(roster) = roster else {
        return PeerTable::new(peers);
    };
    // A member's `USER.DEVICE` is that device's, even against a peer an older version (or a
    // hand-edited config) named so, and even once the roster expired.
    let claimed: HashMap<String, EndpointId> = roster
        .seats()
        .iter()
        .map(|s| (format!("{}.{}", s.user, s.device), s.id))
        .collect();
    yield_claimed_names(&mut peers, &claimed);
    if !roster.is_expired(crate::time::unix_ms() / 1000) {
        for seat in roster.seats() {
            if seat.id == me {
                continue;
            }
            if let Some(known) = peers.iter_mut().find(|p| p.id == seat.id) {
                known.user = Some(seat.user.clone());
                known.groups = seat.groups.clone();
                known.org = Some(roster.roster().org.clone());
                if known.addrs.is_empty() {
                    known.addrs = seat.addrs.clone();
                }
                known.relay = seat.relay.clone();
                continue;
            }
            let candidates = [
                seat.mount.clone(),
                format!("{}.{}", seat.user, seat.device),
                format!("{}.{}", seat.mount, &seat.id.to_string()[..8]),
            ];
            let Some(name) = candidates
                .into_iter()
                .find(|n| valid_service_name(n) && !peers.iter().any(|p| &p.name == n))
            else {
                continue;
            };
            let mut known = KnownPeer::new(name, seat.id, seat.addrs.clone(), Source::Roster);
            known.relay = seat.relay.clone();
            known.user = Some(seat.user.clone());
            known.groups = seat.groups.clone();
            known.org = Some(roster.roster().org.clone());
            peers.push(known);
        }
    }
    PeerTable::new(peers).with_revoked(roster.revoked().clone())
}

pub(super) fn params_of<T: serde::de::DeserializeOwned>(params: Value) -> Result<T, ControlError> {
    serde_json::from_value(params).map_err(|e| ControlError::invalid_params(e.to_string()))
}

/// The verbs that change the store, config.toml or the org's files: each runs whole on the
/// node's writer ([`crate::disk`]).
const WRITING_VERBS: [&str; 14] = [
    methods::PEERS_ADD,
    methods::PEERS_RENAME,
    methods::PEERS_REMOVE,
    methods::GRANT,
    methods::REVOKE,
    methods::INVITE,
    methods::SERVICES_SERVE,
    methods::SERVICES_UNSERVE,
    methods::ORG_CREATE,
    methods::ORG_INVITE,
    methods::ORG_REMOVE,
    methods::ORG_GROUPS,
    methods::ORG_EXPORT_ROOT,
    methods::ORG_IMPORT_ROOT,
];

impl Node {
    /// Runs `job` on the node's writer, where every store and config write is made.
    pub(super) async fn on_disk<T: Send + 'static>(
        &self,
        job: impl FnOnce(&Node) -> T + Send + 'static,
    ) -> Option<T> {
        let node = self.arc()?;
        self.disk.run(move || job(&node)).await
    }

    /// A writing verb, run on the writer (after the relay wait of the verbs that hand out
    /// this node's address).
    async fn call_writing(&self, method: &str, params: Value) -> Result<Value, ControlError> {
        if [methods::INVITE, methods::ORG_CREATE, methods::ORG_INVITE].contains(&method) {
            self.home_relay_settled().await;
        }
        let method = method.to_owned();
        self.on_disk(move |node| node.writing_verb(&method, params))
            .await
            .unwrap_or_else(|| Err(stopping()))
    }

    fn writing_verb(&self, method: &str, params: Value) -> Result<Value, ControlError> {
        match method {
            methods::PEERS_ADD => self.peers_add(params),
            methods::PEERS_RENAME => self.peers_rename(params),
            methods::PEERS_REMOVE => self.peers_remove(params),
            methods::GRANT => self.grant(params),
            methods::REVOKE => self.revoke(params),
            methods::INVITE => self.invite(params),
            methods::SERVICES_SERVE => self.serve(params),
            methods::SERVICES_UNSERVE => self.unserve(params),
            methods::ORG_CREATE => self.org_create(params),
            methods::ORG_INVITE => self.org_invite(params),
            methods::ORG_REMOVE => self.org_remove(params),
            methods::ORG_GROUPS => self.org_groups(params),
            methods::ORG_EXPORT_ROOT => self.org_export_root(params),
            methods::ORG_IMPORT_ROOT => self.org_import_root(params),
            other => Err(ControlError::new(
                codes::UNKNOWN_METHOD,
                format!("unknown method {other:?}"),
            )),
        }
    }
}

/// The answer to a verb whose write the node's writer could not take: it is stopping.
pub(super) fn stopping() -> ControlError {
    ControlError::new(
        codes::NODE_UNAVAILABLE,
        "the node is stopping; nothing was changed",
    )
}

impl ControlHandler for Node {
    async fn call(&self, method: &str, params: Value) -> Result<Reply, ControlError> {
        if WRITING_VERBS.contains(&method) {
            return self.call_writing(method, params).await.map(Reply::Value);
        }
        let value = match method {
            methods::NODE_ID => self.node_id_result(),
            methods::PEERS_LIST => self.peers_list().await,
            methods::SERVICES_LIST => self.services_list(params_of(params)?).await,
            methods::PAIR => self.pair(params).await?,
            methods::STATUS => self.status().await,
            methods::STATUS_WEB => self.status_web().await?,
            methods::AUDIT_VERIFY => self.audit_verify().await?,
            methods::ORG_JOIN => self.org_join(params).await?,
            methods::ORG_MEMBERS => self.org_members()?,
            methods::ORG_STATUS => self.org_status().await?,
            methods::SESSION_OPEN => {
                let open: SessionOpen = params_of(params)?;
                let session = self.open_session(&open).await?;
                return Ok(Reply::Tunnel(
                    json!({ "opened": true }),
                    Box::new(session),
                    open,
                ));
            }
            methods::WATCH => {
                let events = self.audit.subscribe().ok_or_else(|| {
                    ControlError::new(codes::NODE_UNAVAILABLE, "this node records no events")
                })?;
                return Ok(Reply::Stream(json!({ "watching": true }), events));
            }
            methods::NODE_SHUTDOWN => {
                self.stop_sessions().await;
                return Ok(Reply::ThenStop(json!({ "stopped": true })));
            }
            other => {
                return Err(ControlError::new(
                    codes::UNKNOWN_METHOD,
                    format!("unknown method {other:?}"),
                ));
            }
        };
        Ok(Reply::Value(value))
    }

    async fn tunnel(&self, local: proxy::LocalSide, session: OpenedSession, open: SessionOpen) {
        let since = crate::time::unix_ms();
        let key = self.outgoing.opened(&open.peer, &open.service, since);
        self.audit.record(AuditEvent::OutgoingOpen {
            peer: open.peer.clone(),
            service: open.service.clone(),
        });
        let dialed = Dialed::new(
            self.audit.metrics(),
            self.audit.traces(),
            &open.peer,
            &session.connection.remote_id().to_string(),
            &open.service,
        );
        let ending = proxy::tunnel(local, session, self.shutdown.child_token(), dialed).await;
        self.outgoing.closed(key);
        self.audit.record(AuditEvent::OutgoingClose {
            peer: open.peer,
            service: open.service,
            duration_ms: crate::time::unix_ms().saturating_sub(since),
            ended: if ending.code.is_some() {
                "failed"
            } else {
                "ok"
            }
            .to_owned(),
            reason: ending.code.map(|_| ending.message),
            code: ending.code,
        });
    }

    fn node_id(&self) -> String {
        self.endpoint.id().to_string()
    }

    fn dial_timeout(&self) -> std::time::Duration {
        self.settings().dial_timeout
    }
}
