//! What every service of the node stands on: the endpoint and its dialer, the trust gate, the
//! store and its one writer, the running configuration and the services it serves, the audit
//! sink, what the node last found of its peers' reachability and the org roster it holds. Here
//! is the one place a change of configuration, store or roster takes effect ([`Core::apply`]).
//!
//! The services above it (trust, catalog, org, status) each own their own state and reach one
//! another only through the composition root that wires them (`node.rs`, `mod.rs`); none of
//! them is known here.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, RwLock, Weak};

use iroh::{Endpoint, EndpointId};
use mcpmesh_net::endpoint::{self, RelayPolicy};
use mcpmesh_net::gate::CLOSE_SEVERED;
use mcpmesh_net::ping::ALPN_PING;
use mcpmesh_net::registry::ConnectionRegistry;
use mcpmesh_net::session::{ALPN_MCP, Dialer, valid_service_name};
use tokio_util::sync::CancellationToken;

use crate::audit::{AuditEvent, AuditSink};
use crate::config::{ConfigFile, Settings, parse_endpoint_id};
use crate::control::{ControlError, codes};
use crate::pairing::ALPN_PAIR;
use crate::peers::{KnownPeer, PeerGate, PeerTable, Source, yield_claimed_names};
use crate::principal::{Principal, PrincipalSource, is_allowed};
use crate::roster::RosterView;
use crate::roster::invite::ALPN_JOIN;
use crate::roster::sync::ALPN_ROSTER;
use crate::services::{ServiceHost, ServiceTable};
use crate::store::{Store, StoredPeer};

use super::DRAIN_TIMEOUT;
use super::reach::Reachability;

/// How long a verb that hands out this node's address waits for its home relay.
const HOME_RELAY_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

/// The node's shared ground (see the module's doc).
#[derive(Debug)]
pub(super) struct Core {
    pub(super) config_file: ConfigFile,
    /// The one writer of the store and config file; no write happens on the runtime thread.
    pub(super) disk: crate::disk::Disk,
    /// The running configuration, read as a snapshot (see [`Current`]).
    settings: Current<Settings>,
    pub(super) store: Arc<Store>,
    pub(super) endpoint: Endpoint,
    pub(super) gate: Arc<PeerGate>,
    pub(super) services: Arc<RwLock<ServiceTable>>,
    pub(super) host: Arc<ServiceHost>,
    pub(super) registry: Arc<ConnectionRegistry>,
    pub(super) dialer: Arc<Dialer>,
    pub(super) shutdown: CancellationToken,
    pub(super) audit: AuditSink,
    /// What the node last found of each peer's reachability.
    pub(super) reach: Reachability,
    /// The org roster this node holds: the org service installs it, trust is made from it.
    pub(super) roster: HeldRoster,
    /// Raised when the services served change, for whoever tells the org.
    pub(super) services_changed: tokio::sync::Notify,
    me: Weak<Core>,
}

/// What [`Core`] is built from.
pub(super) struct Parts {
    pub(super) config_file: ConfigFile,
    pub(super) disk: crate::disk::Disk,
    pub(super) store: Arc<Store>,
    pub(super) endpoint: Endpoint,
    pub(super) gate: Arc<PeerGate>,
    pub(super) services: Arc<RwLock<ServiceTable>>,
    pub(super) host: Arc<ServiceHost>,
    pub(super) registry: Arc<ConnectionRegistry>,
    pub(super) dialer: Arc<Dialer>,
    pub(super) shutdown: CancellationToken,
    pub(super) audit: AuditSink,
    pub(super) settings: Settings,
}

/// A value read as a snapshot and replaced whole. A reader holds no lock while it reads, so
/// it may read again while a replacement is waiting: with a read guard instead, that second
/// read waits behind the writer, which waits for the first guard, and both hang (the status
/// verb read the settings twice while a roster install applied new ones).
#[derive(Debug)]
pub(super) struct Current<T>(RwLock<Arc<T>>);

impl<T> Current<T> {
    pub(super) fn new(value: T) -> Self {
        Current(RwLock::new(Arc::new(value)))
    }

    pub(super) fn get(&self) -> Arc<T> {
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub(super) fn set(&self, value: T) {
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(value);
    }
}

/// The org roster this node holds, or why the stored one could not be loaded.
#[derive(Debug, Default)]
pub(super) struct HeldRoster {
    view: RwLock<Option<Arc<RosterView>>>,
    damage: RwLock<Option<String>>,
}

impl HeldRoster {
    pub(super) fn get(&self) -> Option<Arc<RosterView>> {
        self.view.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Why the stored roster could not be loaded, while no good one has replaced it.
    pub(super) fn damage(&self) -> Option<String> {
        self.damage
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Holds `view` (or none, on leaving the org); a damage once recorded is forgotten.
    pub(super) fn set(&self, view: Option<Arc<RosterView>>) {
        *self.view.write().unwrap_or_else(|p| p.into_inner()) = view;
        *self.damage.write().unwrap_or_else(|p| p.into_inner()) = None;
    }

    pub(super) fn damaged(&self, why: String) {
        *self.damage.write().unwrap_or_else(|p| p.into_inner()) = Some(why);
    }
}

impl Core {
    pub(super) fn new(parts: Parts) -> Arc<Core> {
        Arc::new_cyclic(|me| Core {
            config_file: parts.config_file,
            disk: parts.disk,
            settings: Current::new(parts.settings),
            store: parts.store,
            endpoint: parts.endpoint,
            gate: parts.gate,
            services: parts.services,
            host: parts.host,
            registry: parts.registry,
            dialer: parts.dialer,
            shutdown: parts.shutdown,
            audit: parts.audit,
            reach: Default::default(),
            roster: Default::default(),
            services_changed: Default::default(),
            me: me.clone(),
        })
    }

    /// Makes `settings` (with the store's peers) the running configuration: trust, services
    /// and address hints. This is the one place a trust change takes effect: peers no longer
    /// trusted lose their connections, and every live session whose caller is no longer
    /// admitted to its service (a revoke, an unserve, a hand edit) is severed at once.
    /// Returns how many sessions were severed.
    pub(super) fn apply(&self, settings: Settings) -> usize {
        self.apply_by(settings, "command")
    }

    /// [`Core::apply`], auditing each change of a service's `allow`, tool rules or env as
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
            self.roster.get().as_deref(),
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
        if services_changed {
            self.services_changed.notify_one();
        }
        self.settings.set(settings);
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

    /// Re-applies the current settings (after the store or the roster changed).
    pub(super) fn refresh(&self) {
        let settings = Settings::clone(&self.settings());
        self.apply(settings);
    }

    /// The running configuration now: a snapshot, so no lock is held while it is read.
    pub(super) fn settings(&self) -> Arc<Settings> {
        self.settings.get()
    }

    /// The roster this node holds.
    pub(super) fn roster(&self) -> Option<Arc<RosterView>> {
        self.roster.get()
    }

    /// Runs `job` on the node's writer, where every store and config write is made.
    pub(super) async fn on_disk<T: Send + 'static>(
        &self,
        job: impl FnOnce(&Core) -> T + Send + 'static,
    ) -> Option<T> {
        self.on_disk_as(&self.me, job).await
    }

    /// Runs `job` on the node's writer with a service's own handle (`service`, which a
    /// service keeps of itself): how a service makes its writes.
    pub(super) async fn on_disk_as<S: Send + Sync + 'static, T: Send + 'static>(
        &self,
        service: &Weak<S>,
        job: impl FnOnce(&S) -> T + Send + 'static,
    ) -> Option<T> {
        let service = service.upgrade()?;
        self.disk.run(move || job(&service)).await
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

    /// Periodic upkeep: expired invites go (and with the last one the pairing ALPN), and rate
    /// buckets of callers that went idle are dropped, so limiter memory stays bounded.
    pub(super) fn housekeeping(&self) {
        self.update_alpns();
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
    pub(super) async fn home_relay_settled(&self) {
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

    /// What this node calls `id`: its peer name, else a short form of its key.
    pub(super) fn name_of(&self, id: &EndpointId) -> String {
        self.gate
            .snapshot()
            .by_id(id)
            .map(|p| p.name.clone())
            .unwrap_or_else(|| format!("eid:{}", id.fmt_short()))
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

/// A verb's parameters, read into what it takes.
pub(super) fn params_of<T: serde::de::DeserializeOwned>(
    params: serde_json::Value,
) -> Result<T, ControlError> {
    serde_json::from_value(params).map_err(|e| ControlError::invalid_params(e.to_string()))
}

/// The answer to a verb whose write the node's writer could not take: it is stopping.
pub(super) fn stopping() -> ControlError {
    ControlError::new(
        codes::NODE_UNAVAILABLE,
        "the node is stopping; nothing was changed",
    )
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::mpsc;
    use std::time::Duration;

    use super::Current;

    #[test]
    fn a_reader_holding_the_settings_does_not_hold_back_a_replacement_or_its_own_next_read() {
        let current = Arc::new(Current::new(1));
        let held = current.get();
        let (done, replaced) = mpsc::channel();
        let writer = {
            let current = current.clone();
            std::thread::spawn(move || {
                current.set(2);
                let _ = done.send(());
            })
        };
        replaced
            .recv_timeout(Duration::from_secs(10))
            .expect("the replacement does not wait for a reader's snapshot");
        assert_eq!(*held, 1, "a snapshot stays what it was");
        assert_eq!(*current.get(), 2, "the next read sees the replacement");
        writer.join().expect("the writer ends");
    }
}
