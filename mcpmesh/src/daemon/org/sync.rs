//! The roster's life in the node: installing rosters from anywhere after checking them,
//! signing changes on the admin's node and pushing them, the exchange over
//! `mcpmesh/roster/1`, the periodic pull, and re-signing before expiry.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures_util::StreamExt;

use iroh::EndpointId;
use iroh::endpoint::{Connection, VarInt};
use iroh::protocol::{AcceptError, ProtocolHandler};
use mcpmesh_net::TrustGate;
use mcpmesh_net::gate::CLOSE_UNKNOWN_PEER;
use mcpmesh_net::transport::NdjsonTransport;
use tokio::io::AsyncWriteExt;

use crate::audit::AuditEvent;
use crate::control::{ControlError, codes};
use crate::roster::sync::{ALPN_ROSTER, EXCHANGE_TIMEOUT, MAX_MESSAGE, Offer};
use crate::roster::{self, DEFAULT_VALIDITY_SECS, Roster, RosterError, RosterView, SignedRoster};
use crate::store::{OrgRecord, Removed, RosterSource};
use crate::time::unix_ms;

use super::super::exchange::{Wire, hang_up, next_message};
use super::Org;
use super::join::hint;
use super::removal::{Told, tell_removed};
use super::{not_in_org, now_secs};

/// Members a roster is pushed to (or pulled from) at once.
pub(super) const SYNC_FANOUT: usize = 16;

/// What installing a roster did.
#[derive(Debug)]
pub(in crate::daemon) enum Installed {
    /// The roster held already.
    Unchanged,
    /// Now held.
    Held(Arc<RosterView>),
    /// It revoked this device: the node left the org.
    Removed(Removed),
}

impl Org {
    /// The roster this node holds, or why it holds none.
    pub(in crate::daemon) fn held_roster(&self) -> Result<Arc<RosterView>, ControlError> {
        self.core.roster().ok_or_else(|| {
            let removed = self
                .core
                .store
                .org()
                .ok()
                .flatten()
                .and_then(|r| Some((r.org, r.removed?)));
            super::no_roster(self.core.roster.damage(), removed)
        })
    }

    /// Loads the held roster from the store at start (it was checked when it was installed).
    /// A copy that no longer opens leaves the node in its org, saying so, until a pull from
    /// the members it remembers brings a good one.
    pub(in crate::daemon) fn load_roster(&self) {
        let Ok(Some(record)) = self.core.store.org() else {
            return;
        };
        let (Some(text), Some(root)) = (record.roster, roster::parse_eid(&record.root)) else {
            return;
        };
        match SignedRoster::open(text.as_bytes(), &root) {
            Ok(signed) => self.hold(Arc::new(RosterView::new(signed))),
            Err(e) => {
                let damage = format!("the stored roster of org {} is damaged ({e})", record.org);
                tracing::error!("{damage}; fetching it again from the org's members");
                self.core.audit.record(AuditEvent::RosterRefused {
                    from: "store".to_owned(),
                    reason: e.kind().to_owned(),
                    message: damage.clone(),
                    principal: None,
                    count: None,
                });
                self.core.roster.damaged(damage);
            }
        }
    }

    /// Makes `view` the roster held, and arranges for trust to be refreshed the moment it
    /// expires (its members then stop matching, and their sessions are cut).
    pub(in crate::daemon) fn hold(&self, view: Arc<RosterView>) {
        let serial = view.roster().serial;
        let expiry_ms = view
            .roster()
            .expires_at
            .saturating_add(roster::CLOCK_SKEW_SECS + 1)
            .saturating_mul(1000);
        self.core.roster.set(Some(view));
        let org = self.me.clone();
        let stop = self.core.shutdown.clone();
        let wait = Duration::from_millis(expiry_ms.saturating_sub(unix_ms()));
        tokio::spawn(async move {
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = tokio::time::sleep(wait) => {
                    // Weak: a timer never keeps a stopped node (and its store) alive.
                    if let Some(org) = org.upgrade()
                        && org.core.roster().is_some_and(|v| v.roster().serial == serial)
                    {
                        tracing::warn!(serial, "the org roster expired; user and group grants stop matching");
                        org.core.refresh();
                    }
                }
            }
        });
    }

    /// Checks `bytes` as a roster from `from` and installs it when it verifies under the
    /// pinned root and is newer than the one held. Every refusal is audited. Returns whether
    /// it was installed.
    pub(in crate::daemon) fn install_roster(
        &self,
        bytes: &[u8],
        from: &str,
    ) -> Result<bool, RosterError> {
        self.install_roster_by(bytes, from, None)
    }

    /// [`Org::install_roster`] for a roster `peer` sent: its refusals are recorded by sender,
    /// so that a peer sending bad rosters over and over cannot flood the audit log.
    pub(super) fn install_roster_by(
        &self,
        bytes: &[u8],
        from: &str,
        peer: Option<EndpointId>,
    ) -> Result<bool, RosterError> {
        let before = self.core.roster();
        let installed = {
            let _one_at_a_time = self.org_lock.lock().unwrap_or_else(|p| p.into_inner());
            self.install_locked(bytes, from)
        };
        match &installed {
            Ok(Installed::Held(view)) => {
                let r = view.roster();
                tracing::info!(org = %r.org, serial = r.serial, from, "roster installed");
                self.core.audit.record(AuditEvent::RosterInstalled {
                    org: r.org.clone(),
                    serial: r.serial,
                    from: from.to_owned(),
                });
                if let Some(before) = &before {
                    self.audit_readmissions(before, view);
                }
                // Peers revoked or dropped lose their connections and sessions here.
                self.core.refresh();
                // The org hears of it: at once from the node that signed it, and from a few of
                // the members that installed it.
                self.spread_roster(r.serial, peer);
            }
            Ok(Installed::Removed(removed)) => self.removed_now(removed),
            Ok(Installed::Unchanged) => {}
            Err(e) => {
                tracing::warn!(from, "refused a roster: {e}");
                match peer {
                    Some(peer) => self.roster_refusals.refused(
                        format!("eid:{peer}"),
                        from,
                        e.kind(),
                        e.to_string(),
                    ),
                    None => self.core.audit.record(AuditEvent::RosterRefused {
                        from: from.to_owned(),
                        reason: e.kind().to_owned(),
                        message: e.to_string(),
                        principal: None,
                        count: None,
                    }),
                }
            }
        }
        installed.map(|v| !matches!(v, Installed::Unchanged))
    }

    pub(super) fn install_locked(
        &self,
        bytes: &[u8],
        from: &str,
    ) -> Result<Installed, RosterError> {
        let record = self
            .core
            .store
            .org()
            .ok()
            .flatten()
            .ok_or_else(|| RosterError::Invalid("this node is not in an org".into()))?;
        let root = roster::parse_eid(&record.root)
            .ok_or_else(|| RosterError::Invalid("the pinned root is damaged".into()))?;
        let held = self.core.roster();
        // With no roster loaded (its copy damaged), the serial last stored is the floor: a
        // copy fetched anew may be that one again, never an older one.
        let held_serial = held
            .as_ref()
            .map_or(record.serial.saturating_sub(1), |v| v.roster().serial);
        let signed = match SignedRoster::accept(bytes, &root, held_serial, now_secs()) {
            Ok(signed) => signed,
            // The same roster again (a push and a pull crossing): nothing to do.
            Err(RosterError::Stale { serial, held: h }) if serial == h => {
                if held.is_some_and(|v| v.signed.text.as_bytes() == bytes) {
                    return Ok(Installed::Unchanged);
                }
                return Err(RosterError::Stale { serial, held: h });
            }
            Err(e) => return Err(e),
        };
        let me = self.core.endpoint.id();
        let view = Arc::new(RosterView::new(signed));
        // A node holding the root key is never put out: it signs its own way back in.
        let admin = self.root_key().is_some();
        if view.is_revoked(&me) && !admin {
            let removed = self.removal_of(&view, held.as_deref(), &record, from);
            self.leave_org(record, removed.clone())
                .map_err(|e| RosterError::Invalid(format!("could not store it: {e}")))?;
            return Ok(Installed::Removed(removed));
        }
        // A removed device trusts the org's members again only once a roster names it.
        if record.removed.is_some()
            && record.pending.is_none()
            && view.seat(&me).is_none()
            && !admin
        {
            return Err(RosterError::Invalid(
                "this device was removed from the org; it takes a roster again when it joins"
                    .into(),
            ));
        }
        let pending = record
            .pending
            .filter(|_| view.seat(&me).is_none() && !view.is_revoked(&me));
        let sources = view
            .seats()
            .into_iter()
            .filter(|s| s.id != me)
            .map(|s| RosterSource {
                eid: s.id.to_string(),
                addrs: s.addrs.iter().map(ToString::to_string).collect(),
                relay: s.relay.as_ref().map(ToString::to_string),
            });
        let updated = OrgRecord {
            org: view.roster().org.clone(),
            root: record.root,
            roster: Some(view.signed.text.clone()),
            pending,
            serial: view.roster().serial,
            sources: RosterSource::few(sources),
            // Named again (a readmission, a new join): no longer removed.
            removed: record.removed.filter(|_| view.seat(&me).is_none()),
        };
        self.core
            .store
            .put_org(&updated)
            .map_err(|e| RosterError::Invalid(format!("could not store it: {e}")))?;
        self.hold(view.clone());
        tracing::debug!(from, "roster stored");
        Ok(Installed::Held(view))
    }

    /// [`Org::install_roster`] of a roster `peer` sent, on the node's writer.
    async fn install_on_disk(&self, text: String, peer: EndpointId) {
        let from = self.core.name_of(&peer);
        self.on_disk(move |org| org.install_roster_by(text.as_bytes(), &from, Some(peer)))
            .await;
    }

    /// `peer` offered the roster of another org (a root other than the one pinned here): it
    /// is not taken, and the refusal is recorded like that of any roster from a peer.
    fn foreign_root(&self, peer: EndpointId, root: &str) {
        let e = RosterError::OtherOrg(root.chars().take(16).collect());
        let from = self.core.name_of(&peer);
        tracing::warn!(from, "refused a roster exchange: {e}");
        self.roster_refusals
            .refused(format!("eid:{peer}"), &from, e.kind(), e.to_string());
    }

    /// On the admin's node: signs `change` applied to the held roster as the next serial,
    /// installs it and pushes it to every member it can reach.
    pub(super) fn publish(
        &self,
        change: impl FnOnce(&mut Roster) -> Result<(), ControlError>,
    ) -> Result<Arc<RosterView>, ControlError> {
        let (key, view) = self.require_admin()?;
        let mut next = roster::successor(view.roster(), now_secs(), DEFAULT_VALIDITY_SECS);
        change(&mut next)?;
        let signed = SignedRoster::sign(next, &key)
            .map_err(|e| ControlError::new(codes::LOCAL, e.to_string()))?;
        self.install_roster(signed.text.as_bytes(), "self")
            .map_err(|e| ControlError::new(codes::REFUSED, e.to_string()))?;
        let view = self.core.roster().ok_or_else(not_in_org)?;
        self.push_all();
        Ok(view)
    }

    /// Joins the org's gossip through `from` (the device it came from, when not this node's
    /// own) and tells the org of roster `serial`: at once when this node made or imported it,
    /// else as one of the few members that re-announce it.
    pub(super) fn spread_roster(&self, serial: u64, from: Option<EndpointId>) {
        let weak = self.me.clone();
        tokio::spawn(async move {
            let Some(org) = weak.upgrade() else { return };
            org.gossip_follow_roster(from).await;
            if from.is_none() {
                org.announce_roster(serial).await;
                return;
            }
            // The wait holds no reference: a node stopping meanwhile is not kept alive.
            drop(org);
            tokio::time::sleep(super::super::swarm::reannounce_delay()).await;
            if let Some(org) = weak.upgrade() {
                org.reannounce_roster(serial).await;
            }
        });
    }

    /// Offers the held roster to every member device (those behind take it), when the org's
    /// gossip cannot tell them: the node has no neighbor on its topic. One round at a time;
    /// a call during a round asks for one more after it, with the roster held then.
    pub(in crate::daemon) fn push_all(&self) {
        if self.gossip_has_neighbors() {
            return;
        }
        if self.gossip.pushes.running.swap(true, Ordering::AcqRel) {
            self.gossip
                .pushes
                .another_wanted
                .store(true, Ordering::Release);
            return;
        }
        let Some(org) = self.me.upgrade() else {
            self.gossip.pushes.running.store(false, Ordering::Release);
            return;
        };
        tokio::spawn(async move {
            loop {
                org.gossip
                    .pushes
                    .another_wanted
                    .store(false, Ordering::Release);
                org.sync_all().await;
                if org.gossip.pushes.another_wanted.load(Ordering::Acquire) {
                    continue;
                }
                org.gossip.pushes.running.store(false, Ordering::Release);
                // A call between the check and the release would be lost without this.
                if !org.gossip.pushes.another_wanted.load(Ordering::Acquire)
                    || org.gossip.pushes.running.swap(true, Ordering::AcqRel)
                {
                    return;
                }
            }
        });
    }

    /// Whether `peer` is the admin's node of a join this node has pending.
    pub(in crate::daemon) fn is_pending_admin(&self, peer: &EndpointId) -> bool {
        self.core
            .store
            .org()
            .ok()
            .flatten()
            .and_then(|r| r.pending)
            .is_some_and(|p| roster::parse_eid(&p.admin).as_ref() == Some(peer))
    }

    /// One roster exchange with `peer`, in the background.
    pub(in crate::daemon) fn sync_soon(&self, peer: EndpointId) {
        if let Some(org) = self.me.upgrade() {
            tokio::spawn(async move {
                org.sync_with(peer).await;
            });
        }
    }

    /// Pulls from (and pushes to) every member device the node can reach; at start and
    /// every `[org] sync_secs`.
    pub(in crate::daemon) async fn sync_all(self: &Arc<Self>) {
        let me = self.core.endpoint.id();
        let targets: Vec<EndpointId> = match self.core.roster() {
            Some(view) => view.seats().iter().map(|s| s.id).collect(),
            None => self.roster_sources(),
        };
        let targets: Vec<EndpointId> = targets.into_iter().filter(|id| *id != me).collect();
        futures_util::stream::iter(targets)
            .for_each_concurrent(SYNC_FANOUT, |id| {
                let org = self.clone();
                async move {
                    org.sync_with(id).await;
                }
            })
            .await;
    }

    /// Where to fetch the roster from while the stored copy is damaged: the member devices
    /// remembered with the org, made dialable.
    fn roster_sources(&self) -> Vec<EndpointId> {
        if self.core.roster.damage().is_none() {
            return Vec::new();
        }
        let Ok(Some(record)) = self.core.store.org() else {
            return Vec::new();
        };
        record
            .sources
            .iter()
            .filter_map(|s| {
                let id = roster::parse_eid(&s.eid)?;
                self.core
                    .dialer
                    .add_address_hint(hint(id, &s.addrs, s.relay.as_deref()));
                Some(id)
            })
            .collect()
    }

    /// One roster exchange with `peer`: the newer side sends its roster. Returns the serial
    /// the peer held when asked, or `None` when it could not be reached.
    pub(in crate::daemon) async fn sync_with(&self, peer: EndpointId) -> Option<u64> {
        let record = self.core.store.org().ok()??;
        let mine = self.core.roster();
        let offer = Offer {
            root: Some(record.root.clone()),
            serial: mine.as_ref().map_or(0, |v| v.roster().serial),
            roster: None,
            removed: None,
        };
        let exchange = async {
            let conn = self.core.endpoint.connect(peer, ALPN_ROSTER).await.ok()?;
            let (send, recv) = conn.open_bi().await.ok()?;
            let mut wire: Wire = NdjsonTransport::new(recv, send, MAX_MESSAGE);
            wire.send_value(serde_json::to_value(&offer).ok()?)
                .await
                .ok()?;
            let theirs: Offer = serde_json::from_value(wire.recv_value().await.ok()??).ok()?;
            let same_org = theirs
                .root
                .as_deref()
                .is_some_and(|r| r.eq_ignore_ascii_case(&record.root));
            if let Some(root) = theirs.root.as_deref().filter(|_| !same_org) {
                self.foreign_root(peer, root);
            }
            if same_org {
                if let Some(notice) = theirs.removed.clone() {
                    self.take_notice_on_disk(notice, peer).await;
                } else if let Some(text) = &theirs.roster {
                    self.install_on_disk(text.clone(), peer).await;
                } else if let Some(view) = mine.as_ref().filter(|v| {
                    v.roster().serial > theirs.serial
                        && v.seat(&peer).is_some_and(|_| !v.is_revoked(&peer))
                }) {
                    let push = Offer {
                        root: None,
                        serial: view.roster().serial,
                        roster: Some(view.signed.text.clone()),
                        removed: None,
                    };
                    wire.send_value(serde_json::to_value(&push).ok()?)
                        .await
                        .ok()?;
                }
            }
            // The other side ends its stream once it has read (and installed) what it was
            // sent; only then does the connection go.
            hang_up(wire, &conn).await;
            Some(theirs.serial)
        };
        tokio::time::timeout(EXCHANGE_TIMEOUT, exchange)
            .await
            .ok()
            .flatten()
    }

    /// The acceptor's side of a roster exchange with a peer the gate admitted.
    pub(super) async fn answer_sync(&self, peer: EndpointId, wire: &mut Wire) {
        let Some(theirs) = next_offer(wire).await else {
            return;
        };
        if let Some(notice) = theirs.removed {
            self.take_notice_on_disk(notice, peer).await;
            return;
        }
        let record = self.core.store.org().ok().flatten();
        let mine = self.core.roster();
        // The roster goes to its members only: a key trusted by pairing alone learns the
        // org's root and serial, never who is in it.
        let member = mine
            .as_ref()
            .is_some_and(|v| v.seat(&peer).is_some() && !v.is_revoked(&peer));
        let same_org = match (&record, &theirs.root) {
            (Some(r), Some(root)) => root.eq_ignore_ascii_case(&r.root),
            _ => false,
        };
        if let (Some(_), Some(root)) = (&record, theirs.root.as_deref().filter(|_| !same_org)) {
            self.foreign_root(peer, root);
        }
        let my_serial = mine.as_ref().map_or(0, |v| v.roster().serial);
        let answer = Offer {
            root: record.as_ref().map(|r| r.root.clone()),
            serial: my_serial,
            roster: mine
                .as_ref()
                .filter(|_| same_org && member && my_serial > theirs.serial)
                .map(|v| v.signed.text.clone()),
            removed: None,
        };
        let Ok(value) = serde_json::to_value(&answer) else {
            return;
        };
        if wire.send_value(value).await.is_err() {
            return;
        }
        if same_org
            && theirs.serial > my_serial
            && let Some(pushed) = next_offer(wire).await
            && let Some(text) = pushed.roster
        {
            self.install_on_disk(text, peer).await;
        }
    }

    /// On the admin's node: re-signs the roster when less than a third of its validity is
    /// left, and refreshes trust when the held roster has just expired (its members stop
    /// matching).
    pub(in crate::daemon) fn roster_upkeep(&self) {
        let Some(view) = self.core.roster() else {
            return;
        };
        let now = now_secs();
        let r = view.roster();
        let left = r.expires_at.saturating_sub(now);
        if left < DEFAULT_VALIDITY_SECS / 3
            && self.root_key().is_some()
            && let Err(e) = self.publish(|_| Ok(()))
        {
            tracing::warn!("re-signing the roster failed: {}", e.message);
        }
        if view.is_expired(now) {
            // The table drops the members (a no-op when it already has).
            self.core.refresh();
        }
    }
}

async fn next_offer(wire: &mut Wire) -> Option<Offer> {
    serde_json::from_value(next_message(wire, EXCHANGE_TIMEOUT).await?).ok()
}

/// The `mcpmesh/roster/1` handler: gated like every mesh ALPN, and open to the members of
/// the roster held even once it expired.
#[derive(Debug)]
pub(in crate::daemon) struct RosterProtocol<G> {
    org: Arc<Org>,
    gate: Arc<G>,
    /// Revoked keys handed their removal notice lately.
    told: Told,
}

impl<G> RosterProtocol<G> {
    pub(in crate::daemon) fn new(org: Arc<Org>, gate: Arc<G>) -> Self {
        RosterProtocol {
            org,
            gate,
            told: Told::default(),
        }
    }
}

impl<G: TrustGate + std::fmt::Debug> ProtocolHandler for RosterProtocol<G> {
    async fn accept(&self, conn: Connection) -> Result<(), AcceptError> {
        let peer = conn.remote_id();
        // A member of the roster held is heard even when that roster has expired: a fresh
        // roster from the admin is how an expired one is replaced.
        // So is the admin's node while this node's join is pending: its roster completes it.
        let member = self.org.holds_seat(&peer) || self.org.is_pending_admin(&peer);
        if !member && self.gate.resolve(&peer).is_none() {
            self.gate.refused(&peer);
            // A key the roster revoked learns that, and only that, now and then.
            let notice = self
                .org
                .notice_for(&peer)
                .filter(|_| self.told.may_tell(peer));
            match notice {
                Some(notice) => tell_removed(conn, notice).await,
                None => conn.close(VarInt::from_u32(CLOSE_UNKNOWN_PEER), b"unknown peer"),
            }
            return Ok(());
        }
        let Ok(Ok((send, recv))) = tokio::time::timeout(EXCHANGE_TIMEOUT, conn.accept_bi()).await
        else {
            return Ok(());
        };
        let mut wire: Wire = NdjsonTransport::new(recv, send, MAX_MESSAGE);
        self.org.answer_sync(peer, &mut wire).await;
        let _ = wire.writer_mut().shutdown().await;
        let _ = tokio::time::timeout(EXCHANGE_TIMEOUT, conn.closed()).await;
        Ok(())
    }
}
