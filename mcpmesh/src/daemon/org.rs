//! The org verbs and the roster's life in the node: creating an org, inviting and joining,
//! changing the roster on the admin's node (each change signed as the next serial and pushed
//! to every member it can reach), installing rosters from anywhere after checking them, and
//! the periodic pull that brings a node that was away up to date.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use iroh::endpoint::{Connection, VarInt};
use iroh::protocol::{AcceptError, ProtocolHandler};
use iroh::{EndpointAddr, EndpointId, RelayUrl, SecretKey};
use mcpmesh_net::TrustGate;
use mcpmesh_net::gate::CLOSE_UNKNOWN_PEER;
use mcpmesh_net::ping::{PingOutcome, ping_outcome};
use mcpmesh_net::session::valid_service_name;
use mcpmesh_net::transport::NdjsonTransport;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;

use crate::audit::AuditEvent;
use crate::control::{ControlError, codes};
use crate::keys;
use crate::pairing;
use crate::roster::invite::{
    ALPN_JOIN, JoinCommit, JoinHello, JoinInvite, JoinReply, MAX_MESSAGE as MAX_JOIN_MESSAGE,
};
use crate::roster::sync::{ALPN_ROSTER, EXCHANGE_TIMEOUT, MAX_MESSAGE, Offer};
use crate::roster::{
    self, DEFAULT_VALIDITY_SECS, Device, Member, Roster, RosterError, RosterView, SignedRoster,
    valid_device, valid_user,
};
use crate::store::{JoinStep, OrgRecord, Pairing, PendingJoin, StoredJoinInvite};
use crate::time::unix_ms;

use super::node::{Node, params_of};

/// Failed join attempts after which a join invite is void.
const MAX_JOIN_FAILURES: u32 = 10;
/// Join exchanges (from keys not yet trusted) handled at once.
const MAX_CONCURRENT_JOINS: usize = 16;
/// Members a roster is pushed to (or pulled from) at once.
const SYNC_FANOUT: usize = 16;

fn bad(message: impl Into<String>) -> ControlError {
    ControlError::invalid_params(message)
}

fn now_secs() -> u64 {
    unix_ms() / 1000
}

fn store_err(e: crate::store::StoreError) -> ControlError {
    ControlError::new(codes::NODE_UNAVAILABLE, e.to_string())
}

fn not_in_org() -> ControlError {
    ControlError::new(
        codes::NOT_FOUND,
        "this node is not in an org; `mcpmesh org create NAME` or `mcpmesh join LINE`",
    )
}

fn check_groups(groups: &[String]) -> Result<(), ControlError> {
    if groups.len() > 64 {
        return Err(bad("at most 64 groups"));
    }
    match groups.iter().find(|g| !valid_service_name(g)) {
        Some(g) => Err(bad(format!(
            "{g:?}: a group name is 1-64 letters, digits, '.', '_' or '-'"
        ))),
        None => Ok(()),
    }
}

fn check_user(user: &str) -> Result<(), ControlError> {
    if valid_user(user) {
        Ok(())
    } else {
        Err(bad(format!(
            "{user:?}: a user id is 1-{} letters, digits, '.', '_' or '-'",
            roster::MAX_USER_LEN
        )))
    }
}

/// A device name from a suggestion: the allowed characters only, never empty.
fn device_name(wanted: Option<&str>) -> String {
    let clean: String = wanted
        .unwrap_or_default()
        .chars()
        .map(|c| c.to_ascii_lowercase())
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        .skip_while(|c| !c.is_ascii_alphanumeric())
        .take(roster::MAX_DEVICE_LEN)
        .collect();
    if valid_device(&clean) {
        clean
    } else {
        "device".to_owned()
    }
}

/// `wanted`, or `wanted-2`, `wanted-3`… whichever `member` does not have yet.
fn free_device_name(member: &Member, wanted: &str) -> String {
    let taken = |n: &str| member.devices.iter().any(|d| d.name == n);
    let mut name = wanted.to_owned();
    let mut n = 2;
    while taken(&name) || !valid_device(&name) {
        let suffix = format!("-{n}");
        let keep = roster::MAX_DEVICE_LEN.saturating_sub(suffix.len());
        name = format!("{}{suffix}", &wanted[..wanted.len().min(keep)]);
        n += 1;
    }
    name
}

impl Node {
    /// The roster this node holds.
    pub(super) fn roster(&self) -> Option<Arc<RosterView>> {
        self.held.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Loads the held roster from the store at start (it was checked when it was installed).
    pub(super) fn load_roster(&self) {
        let Ok(Some(record)) = self.store.org() else {
            return;
        };
        let (Some(text), Some(root)) = (record.roster, roster::parse_eid(&record.root)) else {
            return;
        };
        match SignedRoster::open(text.as_bytes(), &root) {
            Ok(signed) => {
                *self.held.write().unwrap_or_else(|p| p.into_inner()) =
                    Some(Arc::new(RosterView::new(signed)));
            }
            Err(e) => tracing::error!("the stored roster does not open: {e}"),
        }
    }

    /// The root key, when this node is the org's admin.
    fn root_key(&self) -> Option<SecretKey> {
        let record = self.store.org().ok()??;
        let key = keys::load(&self.root_file).ok()??;
        (key.public().to_string() == record.root).then_some(key)
    }

    fn require_admin(&self) -> Result<(SecretKey, Arc<RosterView>), ControlError> {
        let view = self.roster().ok_or_else(not_in_org)?;
        let key = self.root_key().ok_or_else(|| {
            ControlError::new(
                codes::REFUSED,
                "only the org's admin node can change the roster (it holds the root key)",
            )
        })?;
        Ok((key, view))
    }

    /// Checks `bytes` as a roster from `from` and installs it when it verifies under the
    /// pinned root and is newer than the one held. Every refusal is audited. Returns whether
    /// it was installed.
    pub(super) fn install_roster(&self, bytes: &[u8], from: &str) -> Result<bool, RosterError> {
        let installed = {
            let _one_at_a_time = self.org_lock.lock().unwrap_or_else(|p| p.into_inner());
            self.install_locked(bytes, from)
        };
        match &installed {
            Ok(Some(view)) => {
                let r = view.roster();
                tracing::info!(org = %r.org, serial = r.serial, from, "roster installed");
                self.audit.record(AuditEvent::RosterInstalled {
                    org: r.org.clone(),
                    serial: r.serial,
                    from: from.to_owned(),
                });
                // Peers revoked or dropped lose their connections and sessions here.
                self.refresh();
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(from, "refused a roster: {e}");
                self.audit.record(AuditEvent::RosterRefused {
                    from: from.to_owned(),
                    reason: e.kind().to_owned(),
                    message: e.to_string(),
                });
            }
        }
        installed.map(|v| v.is_some())
    }

    fn install_locked(
        &self,
        bytes: &[u8],
        from: &str,
    ) -> Result<Option<Arc<RosterView>>, RosterError> {
        let record = self
            .store
            .org()
            .ok()
            .flatten()
            .ok_or_else(|| RosterError::Invalid("this node is not in an org".into()))?;
        let root = roster::parse_eid(&record.root)
            .ok_or_else(|| RosterError::Invalid("the pinned root is damaged".into()))?;
        let held = self.roster();
        let held_serial = held.as_ref().map_or(0, |v| v.roster().serial);
        let signed = match SignedRoster::accept(bytes, &root, held_serial, now_secs()) {
            Ok(signed) => signed,
            // The same roster again (a push and a pull crossing): nothing to do.
            Err(RosterError::Stale { serial, held: h }) if serial == h => {
                if held.is_some_and(|v| v.signed.text.as_bytes() == bytes) {
                    return Ok(None);
                }
                return Err(RosterError::Stale { serial, held: h });
            }
            Err(e) => return Err(e),
        };
        let me = self.endpoint.id();
        let view = Arc::new(RosterView::new(signed));
        let pending = record
            .pending
            .filter(|_| view.seat(&me).is_none() && !view.is_revoked(&me));
        let updated = OrgRecord {
            org: view.roster().org.clone(),
            root: record.root,
            roster: Some(view.signed.text.clone()),
            pending,
        };
        self.store
            .put_org(&updated)
            .map_err(|e| RosterError::Invalid(format!("could not store it: {e}")))?;
        *self.held.write().unwrap_or_else(|p| p.into_inner()) = Some(view.clone());
        tracing::debug!(from, "roster stored");
        Ok(Some(view))
    }

    /// On the admin's node: signs `change` applied to the held roster as the next serial,
    /// installs it and pushes it to every member it can reach.
    fn publish(
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
        let view = self.roster().ok_or_else(not_in_org)?;
        self.push_all();
        Ok(view)
    }

    /// Offers the held roster to every member device at once (those behind take it).
    pub(super) fn push_all(&self) {
        let (Some(view), Some(node)) = (self.roster(), self.arc()) else {
            return;
        };
        let me = self.endpoint.id();
        let targets: Vec<EndpointId> = view
            .seats()
            .iter()
            .map(|s| s.id)
            .filter(|id| *id != me)
            .collect();
        tokio::spawn(async move {
            futures_util::stream::iter(targets)
                .for_each_concurrent(SYNC_FANOUT, |id| {
                    let node = node.clone();
                    async move {
                        node.sync_with(id).await;
                    }
                })
                .await;
        });
    }

    /// Pulls from (and pushes to) every member device the node can reach; at start and
    /// every `[org] sync_secs`.
    pub(super) async fn sync_all(self: &Arc<Self>) {
        let Some(view) = self.roster() else {
            return;
        };
        let me = self.endpoint.id();
        let targets: Vec<EndpointId> = view
            .seats()
            .iter()
            .map(|s| s.id)
            .filter(|id| *id != me)
            .collect();
        futures_util::stream::iter(targets)
            .for_each_concurrent(SYNC_FANOUT, |id| {
                let node = self.clone();
                async move {
                    node.sync_with(id).await;
                }
            })
            .await;
    }

    /// One roster exchange with `peer`: the newer side sends its roster. Returns the serial
    /// the peer held when asked, or `None` when it could not be reached.
    pub(super) async fn sync_with(&self, peer: EndpointId) -> Option<u64> {
        let record = self.store.org().ok()??;
        let mine = self.roster();
        let offer = Offer {
            root: Some(record.root.clone()),
            serial: mine.as_ref().map_or(0, |v| v.roster().serial),
            roster: None,
        };
        let exchange = async {
            let conn = self.endpoint.connect(peer, ALPN_ROSTER).await.ok()?;
            let (send, recv) = conn.open_bi().await.ok()?;
            let mut wire: RosterWire = NdjsonTransport::new(recv, send, MAX_MESSAGE);
            wire.send_value(serde_json::to_value(&offer).ok()?)
                .await
                .ok()?;
            let theirs: Offer = serde_json::from_value(wire.recv_value().await.ok()??).ok()?;
            let same_org = theirs
                .root
                .as_deref()
                .is_some_and(|r| r.eq_ignore_ascii_case(&record.root));
            if same_org {
                if let Some(text) = &theirs.roster {
                    let from = self.name_of(&peer);
                    let _ = self.install_roster(text.as_bytes(), &from);
                } else if let Some(view) =
                    mine.as_ref().filter(|v| v.roster().serial > theirs.serial)
                {
                    let push = Offer {
                        root: None,
                        serial: view.roster().serial,
                        roster: Some(view.signed.text.clone()),
                    };
                    wire.send_value(serde_json::to_value(&push).ok()?)
                        .await
                        .ok()?;
                }
            }
            // The other side ends its stream once it has read (and installed) what it was
            // sent; only then does the connection go.
            let _ = wire.writer_mut().shutdown().await;
            let _ = wire.recv_value().await;
            conn.close(VarInt::from_u32(0), b"done");
            Some(theirs.serial)
        };
        tokio::time::timeout(EXCHANGE_TIMEOUT, exchange)
            .await
            .ok()
            .flatten()
    }

    /// The name this node knows `id` by, for the records.
    fn name_of(&self, id: &EndpointId) -> String {
        self.gate
            .snapshot()
            .by_id(id)
            .map(|p| p.name.clone())
            .unwrap_or_else(|| format!("eid:{}", id.fmt_short()))
    }

    /// The acceptor's side of a roster exchange with a peer the gate admitted.
    async fn answer_sync(&self, peer: EndpointId, wire: &mut RosterWire) {
        let Some(theirs) = next_offer(wire).await else {
            return;
        };
        let record = self.store.org().ok().flatten();
        let mine = self.roster();
        let same_org = match (&record, &theirs.root) {
            (Some(r), Some(root)) => root.eq_ignore_ascii_case(&r.root),
            _ => false,
        };
        let my_serial = mine.as_ref().map_or(0, |v| v.roster().serial);
        let answer = Offer {
            root: record.as_ref().map(|r| r.root.clone()),
            serial: my_serial,
            roster: mine
                .as_ref()
                .filter(|_| same_org && my_serial > theirs.serial)
                .map(|v| v.signed.text.clone()),
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
            let from = self.name_of(&peer);
            let _ = self.install_roster(text.as_bytes(), &from);
        }
    }

    /// Settles a join left pending by a crash: the admin's node answers a roster exchange
    /// only if it admitted this device (then its roster completes the join), and refuses the
    /// connection if it did not (then the join is dropped). Unreachable: ask later.
    pub(super) async fn confirm_pending_join(&self) {
        let Ok(Some(record)) = self.store.org() else {
            return;
        };
        let Some(pending) = record.pending.clone() else {
            return;
        };
        let Some(admin) = roster::parse_eid(&pending.admin) else {
            return;
        };
        self.dialer
            .add_address_hint(hint(admin, &pending.addrs, pending.relay.as_deref()));
        match ping_outcome(&self.endpoint, admin, EXCHANGE_TIMEOUT).await {
            PingOutcome::Reachable(_) => {
                self.sync_with(admin).await;
            }
            PingOutcome::Refused => {
                let _guard = self.org_lock.lock().unwrap_or_else(|p| p.into_inner());
                if let Ok(Some(now)) = self.store.org()
                    && now.pending.is_some()
                {
                    // A node that held a roster before keeps it; a fresh joiner leaves the org.
                    let outcome = if now.roster.is_some() {
                        self.store.put_org(&OrgRecord {
                            pending: None,
                            ..now
                        })
                    } else {
                        self.store.remove_org()
                    };
                    if outcome.is_ok() {
                        tracing::info!(org = %record.org, "join undone: the admin never completed it");
                    }
                }
            }
            PingOutcome::Unreachable => {}
        }
    }

    /// On the admin's node: re-signs the roster when less than a third of its validity is
    /// left, and refreshes trust when the held roster has just expired (its members stop
    /// matching).
    pub(super) fn roster_upkeep(&self) {
        let Some(view) = self.roster() else {
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
            self.refresh();
        }
    }

    pub(super) fn org_create(&self, params: Value) -> Result<Value, ControlError> {
        #[derive(Deserialize)]
        struct Create {
            name: String,
            #[serde(default)]
            user: Option<String>,
        }
        let c: Create = params_of(params)?;
        if !valid_service_name(&c.name) {
            return Err(bad(format!(
                "{:?}: an org name is 1-64 letters, digits, '.', '_' or '-'",
                c.name
            )));
        }
        let nickname = self.settings().nickname.clone();
        let user = match c.user {
            Some(u) => u,
            None => nickname
                .clone()
                .filter(|n| valid_user(n))
                .unwrap_or_else(|| "admin".to_owned()),
        };
        check_user(&user)?;
        if let Some(existing) = self.store.org().map_err(store_err)? {
            return Err(ControlError::new(
                codes::CONFLICT,
                format!("this node is in the org {} already", existing.org),
            ));
        }
        // A key left by a create that crashed before storing the org is reused: it never
        // signed anything anyone holds.
        let key = match keys::load(&self.root_file) {
            Ok(Some(key)) => key,
            Ok(None) => {
                let key = SecretKey::generate();
                keys::store_new(&self.root_file, &key)
                    .map_err(|e| ControlError::new(codes::LOCAL, e.to_string()))?;
                keys::load(&self.root_file).ok().flatten().unwrap_or(key)
            }
            Err(e) => return Err(ControlError::new(codes::LOCAL, e.to_string())),
        };
        let now = now_secs();
        let first = Roster {
            v: 1,
            org: c.name.clone(),
            root: key.public().to_string(),
            serial: 1,
            issued_at: now,
            expires_at: now + DEFAULT_VALIDITY_SECS,
            members: vec![Member {
                user: user.clone(),
                groups: Vec::new(),
                devices: vec![Device {
                    name: device_name(nickname.as_deref()),
                    eid: self.endpoint.id().to_string(),
                    addrs: self.direct_addrs(),
                    relay: self
                        .endpoint
                        .addr()
                        .relay_urls()
                        .next()
                        .map(ToString::to_string),
                }],
            }],
            revoked: Vec::new(),
        };
        let signed = SignedRoster::sign(first, &key)
            .map_err(|e| ControlError::new(codes::LOCAL, e.to_string()))?;
        self.store
            .put_org(&OrgRecord {
                org: c.name.clone(),
                root: key.public().to_string(),
                roster: None,
                pending: None,
            })
            .map_err(store_err)?;
        self.install_roster(signed.text.as_bytes(), "self")
            .map_err(|e| ControlError::new(codes::LOCAL, e.to_string()))?;
        self.trust_event("org_create", Some(&user), None);
        Ok(json!({
            "org": c.name,
            "root": key.public().to_string(),
            "serial": 1,
            "user": user,
            "expires_at": now + DEFAULT_VALIDITY_SECS,
        }))
    }

    pub(super) fn org_invite(&self, params: Value) -> Result<Value, ControlError> {
        #[derive(Deserialize)]
        struct Mint {
            user: String,
            #[serde(default)]
            groups: Vec<String>,
            #[serde(default)]
            device: Option<String>,
            #[serde(default)]
            ttl_secs: Option<u64>,
        }
        let m: Mint = params_of(params)?;
        check_user(&m.user)?;
        check_groups(&m.groups)?;
        if let Some(d) = &m.device
            && !valid_device(d)
        {
            return Err(bad(format!(
                "{d:?}: a device name is 1-{} letters, digits, '.', '_' or '-'",
                roster::MAX_DEVICE_LEN
            )));
        }
        let (_key, view) = self.require_admin()?;
        let r = view.roster();
        let existing = r.members.iter().find(|x| x.user == m.user);
        let groups = match existing {
            Some(member) => {
                let Some(device) = &m.device else {
                    return Err(ControlError::new(
                        codes::CONFLICT,
                        format!(
                            "{} is a member already; to add a device: mcpmesh org invite {} --device NAME",
                            m.user, m.user
                        ),
                    ));
                };
                if member.devices.iter().any(|d| &d.name == device) {
                    return Err(ControlError::new(
                        codes::CONFLICT,
                        format!("{} has a device named {device} already", m.user),
                    ));
                }
                if !m.groups.is_empty() && m.groups != member.groups {
                    return Err(bad(format!(
                        "{} is a member already; change groups with: mcpmesh org groups {} G1,G2",
                        m.user, m.user
                    )));
                }
                member.groups.clone()
            }
            None => m.groups.clone(),
        };
        if r.members.iter().any(|x| groups.contains(&x.user))
            || r.members.iter().any(|x| x.groups.contains(&m.user))
        {
            return Err(bad("a user id and a group name may not be the same"));
        }
        let ttl = Duration::from_secs(m.ttl_secs.unwrap_or(roster::invite::DEFAULT_TTL.as_secs()));
        if ttl.is_zero() || ttl > roster::invite::MAX_TTL {
            return Err(bad("--ttl must be between 1s and 7d"));
        }
        let secret = pairing::new_secret()
            .map_err(|e| ControlError::new(codes::NODE_UNAVAILABLE, e.to_string()))?;
        let iid = pairing::new_invite_id()
            .map_err(|e| ControlError::new(codes::NODE_UNAVAILABLE, e.to_string()))?;
        let expires_at = now_secs() + ttl.as_secs();
        self.store
            .put_join_invite(
                &iid,
                &StoredJoinInvite {
                    secret,
                    user: m.user.clone(),
                    groups: groups.clone(),
                    device: m.device.clone(),
                    expires_at,
                    failures: 0,
                },
            )
            .map_err(store_err)?;
        self.update_alpns();
        let invite = JoinInvite {
            v: 1,
            org: r.org.clone(),
            root: r.root.clone(),
            admin: self.endpoint.id().to_string(),
            addrs: self.direct_addrs(),
            relay: self
                .endpoint
                .addr()
                .relay_urls()
                .next()
                .map(ToString::to_string),
            iid,
            secret: pairing::encode_secret(&secret),
            user: m.user.clone(),
            groups: groups.clone(),
            exp: expires_at,
        };
        self.trust_event("org_invite", Some(&m.user), None);
        Ok(json!({
            "invite": invite.encode(),
            "expires_at": expires_at,
            "user": m.user,
            "groups": groups,
        }))
    }

    pub(super) async fn org_join(&self, params: Value) -> Result<Value, ControlError> {
        #[derive(Deserialize)]
        struct Join {
            invite: String,
            #[serde(default)]
            device: Option<String>,
        }
        let j: Join = params_of(params)?;
        let invite = JoinInvite::decode(&j.invite).map_err(|e| bad(e.to_string()))?;
        let (Some(admin), Some(_), Some(secret)) =
            (invite.admin_id(), invite.root_key(), invite.secret_bytes())
        else {
            return Err(bad("this invite is damaged"));
        };
        let me = self.endpoint.id();
        if admin == me {
            return Err(bad("this is one of this node's own invites"));
        }
        if invite.exp <= now_secs() {
            return Err(ControlError::new(
                codes::REFUSED,
                format!(
                    "this invite expired at {} UTC; ask for a new one",
                    crate::time::format_time(invite.exp * 1000)
                ),
            ));
        }
        if let Some(d) = &j.device
            && !valid_device(d)
        {
            return Err(bad(format!(
                "{d:?}: a device name is 1-{} letters, digits, '.', '_' or '-'",
                roster::MAX_DEVICE_LEN
            )));
        }
        if let Some(existing) = self.store.org().map_err(store_err)? {
            let same = existing.root.eq_ignore_ascii_case(&invite.root);
            let member = self.roster().is_some_and(|v| v.seat(&me).is_some());
            if !same {
                return Err(ControlError::new(
                    codes::CONFLICT,
                    format!(
                        "this node is in the org {} already; a node belongs to one org",
                        existing.org
                    ),
                ));
            }
            if member {
                return Err(ControlError::new(
                    codes::CONFLICT,
                    format!("this node is a member of {} already", existing.org),
                ));
            }
        }
        self.dialer
            .add_address_hint(hint(admin, &invite.addrs, invite.relay.as_deref()));
        let hello = JoinHello {
            join: 1,
            invite: invite.iid.clone(),
            proof: pairing::proof(&secret, &admin, &me),
            device: j
                .device
                .clone()
                .or_else(|| self.settings().nickname.clone()),
            addrs: self.direct_addrs(),
        };
        let limit = self.settings().dial_timeout + EXCHANGE_TIMEOUT;
        let unanswered = || {
            ControlError::new(
                codes::UNREACHABLE,
                "the admin's node did not answer in time",
            )
        };
        let mut exchange = tokio::time::timeout(limit, JoinExchange::open(&self.endpoint, admin))
            .await
            .map_err(|_| unanswered())??;
        let reply = tokio::time::timeout(limit, exchange.ask(&hello))
            .await
            .map_err(|_| unanswered())??;
        if !reply.ok {
            return Err(join_refusal(reply));
        }
        // Pinned and pending before the admin commits: whatever crashes next, recovery can
        // tell from the admin's node whether the join happened (see `confirm_pending_join`).
        {
            let _guard = self.org_lock.lock().unwrap_or_else(|p| p.into_inner());
            let held = self.store.org().map_err(store_err)?;
            self.store
                .put_org(&OrgRecord {
                    org: invite.org.clone(),
                    root: invite.root.clone(),
                    roster: held.and_then(|h| h.roster),
                    pending: Some(PendingJoin {
                        admin: invite.admin.clone(),
                        addrs: invite.addrs.clone(),
                        relay: invite.relay.clone(),
                        user: invite.user.clone(),
                        at: unix_ms(),
                    }),
                })
                .map_err(store_err)?;
        }
        let done = tokio::time::timeout(limit, exchange.ask(&JoinCommit { commit: true })).await;
        exchange.close();
        let roster_text = match done {
            Ok(Ok(JoinReply {
                ok: true,
                roster: Some(text),
                ..
            })) => text,
            Ok(Ok(refused)) => {
                let _ = self.store.org().map(|held| match held {
                    Some(h) if h.roster.is_some() => {
                        self.store.put_org(&OrgRecord { pending: None, ..h })
                    }
                    _ => self.store.remove_org(),
                });
                return Err(join_refusal(refused));
            }
            Err(_) | Ok(Err(_)) => {
                return Err(ControlError::new(
                    codes::UNREACHABLE,
                    "the admin's node did not confirm the join; it will be confirmed or undone when it can be reached",
                ));
            }
        };
        let admin_name = format!("eid:{}", admin.fmt_short());
        self.install_roster(roster_text.as_bytes(), &admin_name)
            .map_err(|e| ControlError::new(codes::REFUSED, format!("the admin's roster: {e}")))?;
        let view = self.roster().ok_or_else(not_in_org)?;
        let seat = view.seat(&me).ok_or_else(|| {
            ControlError::new(
                codes::REFUSED,
                "the admin's roster does not name this device",
            )
        })?;
        let code = pairing::code(&admin, &me, &secret);
        self.trust_event("org_join", Some(&seat.user), None);
        Ok(json!({
            "org": view.roster().org,
            "user": seat.user,
            "groups": seat.groups,
            "device": seat.device,
            "code": code,
            "serial": view.roster().serial,
        }))
    }

    /// On the admin's node, on the joiner's hello: the proof must hold for a live invite.
    /// Nothing is stored but a failed attempt. Blocking (store transactions).
    fn check_join(&self, joiner: EndpointId, hello: &JoinHello) -> JoinReply {
        if self.gate.is_revoked(&joiner) {
            return JoinReply::refused("this device was removed from the org");
        }
        let me = self.endpoint.id();
        let checked =
            self.store
                .attempt_join(&hello.invite, now_secs(), MAX_JOIN_FAILURES, |invite| {
                    if pairing::proof_matches(&invite.secret, &me, &joiner, &hello.proof) {
                        Ok((None, ()))
                    } else {
                        Err("the invite's secret does not match".to_owned())
                    }
                });
        let reply = match checked {
            Ok(JoinStep::Accepted(())) => JoinReply {
                ok: true,
                ..Default::default()
            },
            Ok(JoinStep::Refused(reason)) => {
                tracing::info!(peer = %joiner.fmt_short(), "refused a join: {reason}");
                JoinReply::refused(reason)
            }
            Err(e) => {
                tracing::error!("{e}");
                JoinReply::refused("the admin's store failed")
            }
        };
        self.update_alpns();
        reply
    }

    /// On the admin's node, on the joiner's commit: the used invite and the roster naming
    /// the new device, signed as the next serial, in one store transaction; then installed
    /// here and pushed to the members. Blocking.
    fn complete_join(&self, joiner: EndpointId, hello: &JoinHello) -> JoinReply {
        let Ok((key, view)) = self.require_admin() else {
            return JoinReply::refused("this node is no longer the org's admin");
        };
        let me = self.endpoint.id();
        let addrs: Vec<String> = hello
            .addrs
            .iter()
            .filter(|a| a.parse::<SocketAddr>().is_ok())
            .take(16)
            .cloned()
            .collect();
        let now = now_secs();
        let record = match self.store.org() {
            Ok(Some(r)) => r,
            _ => return JoinReply::refused("the admin's store failed"),
        };
        let outcome = {
            let _guard = self.org_lock.lock().unwrap_or_else(|p| p.into_inner());
            self.store
                .attempt_join(&hello.invite, now, MAX_JOIN_FAILURES, |invite| {
                    if !pairing::proof_matches(&invite.secret, &me, &joiner, &hello.proof) {
                        return Err("the invite's secret does not match".to_owned());
                    }
                    let mut next = roster::successor(view.roster(), now, DEFAULT_VALIDITY_SECS);
                    next.revoked
                        .retain(|r| roster::parse_eid(r) != Some(joiner));
                    let wanted = device_name(invite.device.as_deref().or(hello.device.as_deref()));
                    let device = |member: &Member| Device {
                        name: free_device_name(member, &wanted),
                        eid: joiner.to_string(),
                        addrs: addrs.clone(),
                        relay: None,
                    };
                    if next.members.iter().any(|m| {
                        m.devices
                            .iter()
                            .any(|d| roster::parse_eid(&d.eid) == Some(joiner))
                    }) {
                        return Err("this device is a member already".to_owned());
                    }
                    match next.members.iter_mut().find(|m| m.user == invite.user) {
                        Some(member) => {
                            let d = device(member);
                            member.devices.push(d);
                        }
                        None => {
                            let member = Member {
                                user: invite.user.clone(),
                                groups: invite.groups.clone(),
                                devices: Vec::new(),
                            };
                            let d = device(&member);
                            next.members.push(Member {
                                devices: vec![d],
                                ..member
                            });
                        }
                    }
                    let signed = SignedRoster::sign(next, &key).map_err(|e| e.to_string())?;
                    let code = pairing::code(&me, &joiner, &invite.secret);
                    let stored = OrgRecord {
                        roster: Some(signed.text.clone()),
                        ..record.clone()
                    };
                    let pairing = Pairing {
                        peer: format!("{} (org {})", invite.user, record.org),
                        code,
                        at: unix_ms(),
                    };
                    Ok((Some((stored, pairing)), (signed, invite.user.clone())))
                })
        };
        self.update_alpns();
        match outcome {
            Ok(JoinStep::Accepted((signed, user))) => {
                let signed_view = Arc::new(RosterView::new(signed.clone()));
                *self.held.write().unwrap_or_else(|p| p.into_inner()) = Some(signed_view);
                self.audit.record(AuditEvent::RosterInstalled {
                    org: signed.roster.org.clone(),
                    serial: signed.roster.serial,
                    from: "self".to_owned(),
                });
                self.refresh();
                self.trust_event("org_join", Some(&user), None);
                tracing::info!(user = %user, device = %joiner.fmt_short(), "a device joined the org");
                self.push_all();
                JoinReply {
                    ok: true,
                    error: None,
                    roster: Some(signed.text),
                }
            }
            Ok(JoinStep::Refused(reason)) => JoinReply::refused(reason),
            Err(e) => {
                tracing::error!("{e}");
                JoinReply::refused("the admin's store failed")
            }
        }
    }

    pub(super) fn org_members(&self) -> Result<Value, ControlError> {
        let view = self.roster().ok_or_else(not_in_org)?;
        let r = view.roster();
        let members: Vec<Value> = r
            .members
            .iter()
            .map(|m| {
                let devices: Vec<Value> = m
                    .devices
                    .iter()
                    .map(|d| {
                        let mount = roster::parse_eid(&d.eid)
                            .and_then(|id| view.seat(&id))
                            .map(|s| s.mount.clone());
                        json!({ "name": d.name, "eid": d.eid, "mount": mount })
                    })
                    .collect();
                json!({ "user": m.user, "groups": m.groups, "devices": devices })
            })
            .collect();
        Ok(json!({
            "org": r.org,
            "serial": r.serial,
            "expires_at": r.expires_at,
            "members": members,
            "revoked": r.revoked,
        }))
    }

    pub(super) fn org_remove(&self, params: Value) -> Result<Value, ControlError> {
        #[derive(Deserialize)]
        struct Remove {
            user: String,
            #[serde(default)]
            device: Option<String>,
        }
        let r: Remove = params_of(params)?;
        let me = self.endpoint.id().to_string();
        let mut revoked = Vec::new();
        let view = self.publish(|next| {
            let at = next
                .members
                .iter()
                .position(|m| m.user == r.user)
                .ok_or_else(|| {
                    ControlError::new(codes::NOT_FOUND, format!("no member {:?}", r.user))
                })?;
            let member = &mut next.members[at];
            let gone: Vec<Device> = match &r.device {
                Some(d) => {
                    let i = member
                        .devices
                        .iter()
                        .position(|x| &x.name == d)
                        .ok_or_else(|| {
                            ControlError::new(
                                codes::NOT_FOUND,
                                format!("{} has no device {d:?}", r.user),
                            )
                        })?;
                    vec![member.devices.remove(i)]
                }
                None => std::mem::take(&mut member.devices),
            };
            if gone.iter().any(|d| d.eid == me) {
                return Err(ControlError::new(
                    codes::CONFLICT,
                    "this is the admin's own device; move the root first (org export-root / import-root)",
                ));
            }
            if member.devices.is_empty() {
                next.members.remove(at);
            }
            revoked = gone.into_iter().map(|d| d.eid).collect();
            next.revoked.extend(revoked.iter().cloned());
            Ok(())
        })?;
        self.trust_event("org_remove", Some(&r.user), None);
        Ok(json!({ "serial": view.roster().serial, "user": r.user, "revoked": revoked }))
    }

    pub(super) fn org_groups(&self, params: Value) -> Result<Value, ControlError> {
        #[derive(Deserialize)]
        struct Groups {
            user: String,
            groups: Vec<String>,
        }
        let g: Groups = params_of(params)?;
        check_groups(&g.groups)?;
        let mut groups = g.groups.clone();
        groups.sort();
        groups.dedup();
        let view = self.publish(|next| {
            if next.members.iter().any(|m| groups.contains(&m.user)) {
                return Err(bad("a user id and a group name may not be the same"));
            }
            let member = next
                .members
                .iter_mut()
                .find(|m| m.user == g.user)
                .ok_or_else(|| {
                    ControlError::new(codes::NOT_FOUND, format!("no member {:?}", g.user))
                })?;
            member.groups = groups.clone();
            Ok(())
        })?;
        self.trust_event("org_groups", Some(&g.user), None);
        Ok(json!({ "serial": view.roster().serial, "user": g.user, "groups": groups }))
    }

    pub(super) async fn org_status(&self) -> Result<Value, ControlError> {
        let view = self.roster().ok_or_else(not_in_org)?;
        let me = self.endpoint.id();
        let seats: Vec<_> = view.seats().into_iter().cloned().collect();
        let ids: Vec<EndpointId> = seats.iter().map(|s| s.id).collect();
        let serials = futures_util::stream::iter(ids)
            .map(|id| async move {
                if id == me {
                    None
                } else {
                    self.sync_with(id).await
                }
            })
            .buffered(SYNC_FANOUT)
            .collect::<Vec<_>>()
            .await;
        let r = view.roster();
        let members: Vec<Value> = seats
            .iter()
            .zip(serials)
            .map(|(s, serial)| {
                let own = s.id == me;
                json!({
                    "user": s.user,
                    "device": s.device,
                    "mount": s.mount,
                    "eid": s.id.to_string(),
                    "self": own,
                    "reachable": own || serial.is_some(),
                    "serial": if own { Some(r.serial) } else { serial },
                })
            })
            .collect();
        Ok(json!({
            "org": r.org,
            "root": r.root,
            "serial": r.serial,
            "issued_at": r.issued_at,
            "expires_at": r.expires_at,
            "expired": view.is_expired(now_secs()),
            "admin": self.root_key().is_some(),
            "members": members,
        }))
    }

    /// The `org` part of `status`.
    pub(super) fn org_summary(&self) -> Value {
        let Some(view) = self.roster() else {
            return Value::Null;
        };
        let r = view.roster();
        let user = view.seat(&self.endpoint.id()).map(|s| s.user.clone());
        json!({
            "name": r.org,
            "serial": r.serial,
            "expires_at": r.expires_at,
            "expired": view.is_expired(now_secs()),
            "admin": self.root_key().is_some(),
            "user": user,
        })
    }

    pub(super) fn org_export_root(&self, params: Value) -> Result<Value, ControlError> {
        #[derive(Deserialize)]
        struct Export {
            path: std::path::PathBuf,
        }
        let e: Export = params_of(params)?;
        if !e.path.is_absolute() {
            return Err(bad("the export path must be absolute"));
        }
        let (key, view) = self.require_admin()?;
        roster::root::export(&e.path, &key, &view.signed)
            .map_err(|err| ControlError::new(codes::LOCAL, err.to_string()))?;
        self.trust_event("org_export_root", None, None);
        Ok(json!({
            "org": view.roster().org,
            "path": e.path.display().to_string(),
            "serial": view.roster().serial,
        }))
    }

    pub(super) fn org_import_root(&self, params: Value) -> Result<Value, ControlError> {
        #[derive(Deserialize)]
        struct Import {
            path: std::path::PathBuf,
            #[serde(default)]
            user: Option<String>,
        }
        let i: Import = params_of(params)?;
        let (key, signed) = roster::root::import(&i.path)
            .map_err(|e| ControlError::new(codes::REFUSED, e.to_string()))?;
        let root_hex = key.public().to_string();
        let org = signed.roster.org.clone();
        match self.store.org().map_err(store_err)? {
            Some(held) if !held.root.eq_ignore_ascii_case(&root_hex) => {
                return Err(ControlError::new(
                    codes::CONFLICT,
                    format!("this node is in another org ({})", held.org),
                ));
            }
            Some(_) => {}
            None => self
                .store
                .put_org(&OrgRecord {
                    org: org.clone(),
                    root: root_hex.clone(),
                    roster: None,
                    pending: None,
                })
                .map_err(store_err)?,
        }
        match keys::load(&self.root_file) {
            Ok(Some(existing)) if existing.public() != key.public() => {
                return Err(ControlError::new(
                    codes::CONFLICT,
                    "this node holds another org's root key",
                ));
            }
            Ok(Some(_)) => {}
            Ok(None) => {
                keys::store_new(&self.root_file, &key)
                    .map_err(|e| ControlError::new(codes::LOCAL, e.to_string()))?;
            }
            Err(e) => return Err(ControlError::new(codes::LOCAL, e.to_string())),
        }
        // The export's roster, unless this node holds a newer one of the same org.
        let _ = self.install_roster(signed.text.as_bytes(), "import");
        let me = self.endpoint.id();
        let nickname = self.settings().nickname.clone();
        let member = self.roster().is_some_and(|v| v.seat(&me).is_some());
        let mut user = i.user.clone();
        let addrs = self.direct_addrs();
        let view = self.publish(|next| {
            next.revoked.retain(|r| roster::parse_eid(r) != Some(me));
            if !member {
                let name = user.clone().or(nickname.clone()).filter(|u| valid_user(u));
                let name = name.unwrap_or_else(|| "admin".to_owned());
                let device = Device {
                    name: String::new(),
                    eid: me.to_string(),
                    addrs: addrs.clone(),
                    relay: None,
                };
                match next.members.iter_mut().find(|m| m.user == name) {
                    Some(m) => {
                        let d = Device {
                            name: free_device_name(m, &device_name(nickname.as_deref())),
                            ..device
                        };
                        m.devices.push(d);
                    }
                    None => next.members.push(Member {
                        user: name.clone(),
                        groups: Vec::new(),
                        devices: vec![Device {
                            name: device_name(nickname.as_deref()),
                            ..device
                        }],
                    }),
                }
                user = Some(name);
            }
            Ok(())
        })?;
        let user = view.seat(&me).map(|s| s.user.clone()).or(user);
        self.trust_event("org_import_root", user.as_deref(), None);
        Ok(json!({
            "org": view.roster().org,
            "root": root_hex,
            "serial": view.roster().serial,
            "user": user,
        }))
    }
}

fn hint(id: EndpointId, addrs: &[String], relay: Option<&str>) -> EndpointAddr {
    let mut hint = EndpointAddr::new(id);
    for a in addrs.iter().filter_map(|a| a.parse::<SocketAddr>().ok()) {
        hint = hint.with_ip_addr(a);
    }
    if let Some(relay) = relay.and_then(|u| u.parse::<RelayUrl>().ok()) {
        hint = hint.with_relay_url(relay);
    }
    hint
}

fn join_refusal(reply: JoinReply) -> ControlError {
    ControlError::new(
        codes::REFUSED,
        format!(
            "the admin's node refused: {}",
            reply.error.unwrap_or_else(|| "no reason given".into())
        ),
    )
}

type RosterWire = NdjsonTransport<iroh::endpoint::RecvStream, iroh::endpoint::SendStream>;

async fn next_message(wire: &mut RosterWire) -> Option<Value> {
    tokio::time::timeout(EXCHANGE_TIMEOUT, wire.recv_value())
        .await
        .ok()
        .and_then(Result::ok)
        .flatten()
}

async fn next_offer(wire: &mut RosterWire) -> Option<Offer> {
    let value = tokio::time::timeout(EXCHANGE_TIMEOUT, wire.recv_value())
        .await
        .ok()?
        .ok()??;
    serde_json::from_value(value).ok()
}

/// The joiner's side of the join exchange.
struct JoinExchange {
    conn: Connection,
    wire: RosterWire,
}

impl JoinExchange {
    async fn open(endpoint: &iroh::Endpoint, admin: EndpointId) -> Result<Self, ControlError> {
        let conn = endpoint.connect(admin, ALPN_JOIN).await.map_err(|e| {
            // A node with no live join invite does not offer the protocol at all.
            if e.to_string().contains("known protocol") {
                ControlError::new(
                    codes::REFUSED,
                    "the admin's node is not accepting this invite: it was used, expired or withdrawn",
                )
            } else {
                unreachable(&e)
            }
        })?;
        let (send, recv) = conn.open_bi().await.map_err(|e| unreachable(&e))?;
        Ok(JoinExchange {
            conn,
            wire: NdjsonTransport::new(recv, send, MAX_JOIN_MESSAGE + MAX_MESSAGE),
        })
    }

    async fn ask(&mut self, message: &impl serde::Serialize) -> Result<JoinReply, ControlError> {
        let value = serde_json::to_value(message).map_err(|e| bad(e.to_string()))?;
        self.wire
            .send_value(value)
            .await
            .map_err(|e| unreachable(&e))?;
        let answer = self
            .wire
            .recv_value()
            .await
            .map_err(|e| unreachable(&e))?
            .ok_or_else(|| unreachable(&"the connection closed"))?;
        serde_json::from_value(answer).map_err(|e| unreachable(&e))
    }

    fn close(self) {
        self.conn.close(VarInt::from_u32(0), b"done");
    }
}

fn unreachable(e: &dyn std::fmt::Display) -> ControlError {
    ControlError::new(
        codes::UNREACHABLE,
        format!("cannot reach the admin's node ({e}); is it running, and the invite still live?"),
    )
}

/// The `mcpmesh/roster/1` handler: gated like every mesh ALPN.
#[derive(Debug)]
pub(super) struct RosterProtocol<G> {
    node: Arc<Node>,
    gate: Arc<G>,
}

impl<G> RosterProtocol<G> {
    pub(super) fn new(node: Arc<Node>, gate: Arc<G>) -> Self {
        RosterProtocol { node, gate }
    }
}

impl<G: TrustGate + std::fmt::Debug> ProtocolHandler for RosterProtocol<G> {
    async fn accept(&self, conn: Connection) -> Result<(), AcceptError> {
        let peer = conn.remote_id();
        if self.gate.resolve(&peer).is_none() {
            conn.close(VarInt::from_u32(CLOSE_UNKNOWN_PEER), b"unknown peer");
            self.gate.refused(&peer);
            return Ok(());
        }
        let Ok(Ok((send, recv))) = tokio::time::timeout(EXCHANGE_TIMEOUT, conn.accept_bi()).await
        else {
            return Ok(());
        };
        let mut wire: RosterWire = NdjsonTransport::new(recv, send, MAX_MESSAGE);
        self.node.answer_sync(peer, &mut wire).await;
        let _ = wire.writer_mut().shutdown().await;
        let _ = tokio::time::timeout(EXCHANGE_TIMEOUT, conn.closed()).await;
        Ok(())
    }
}

/// The `mcpmesh/join/1` handler, on the admin's node. Open to unknown keys by design: the
/// invite secret is the credential, with an attempt budget per invite. Revoked keys are
/// turned away.
#[derive(Debug)]
pub(super) struct JoinProtocol {
    node: Arc<Node>,
    slots: Arc<tokio::sync::Semaphore>,
}

impl JoinProtocol {
    pub(super) fn new(node: Arc<Node>) -> Self {
        JoinProtocol {
            node,
            slots: Arc::new(tokio::sync::Semaphore::new(MAX_CONCURRENT_JOINS)),
        }
    }
}

impl ProtocolHandler for JoinProtocol {
    async fn accept(&self, conn: Connection) -> Result<(), AcceptError> {
        let joiner = conn.remote_id();
        if self.node.gate.is_revoked(&joiner) {
            conn.close(VarInt::from_u32(CLOSE_UNKNOWN_PEER), b"unknown peer");
            return Ok(());
        }
        let Ok(_slot) = self.slots.clone().try_acquire_owned() else {
            conn.close(VarInt::from_u32(503), b"busy");
            return Ok(());
        };
        let Ok(Ok((send, recv))) = tokio::time::timeout(EXCHANGE_TIMEOUT, conn.accept_bi()).await
        else {
            return Ok(());
        };
        let mut wire: RosterWire = NdjsonTransport::new(recv, send, MAX_JOIN_MESSAGE);
        let hello = next_message(&mut wire)
            .await
            .and_then(|v| serde_json::from_value::<JoinHello>(v).ok());
        let reply = match hello.clone() {
            Some(hello) if hello.join == 1 => {
                let node = self.node.clone();
                tokio::task::spawn_blocking(move || node.check_join(joiner, &hello))
                    .await
                    .unwrap_or_else(|_| JoinReply::refused("the admin's store failed"))
            }
            _ => JoinReply::refused("malformed join request"),
        };
        if send_reply(&mut wire, &reply).await && reply.ok {
            let commit = next_message(&mut wire)
                .await
                .and_then(|v| serde_json::from_value::<JoinCommit>(v).ok());
            if let (Some(hello), Some(JoinCommit { commit: true })) = (hello, commit) {
                let node = self.node.clone();
                let done = tokio::task::spawn_blocking(move || node.complete_join(joiner, &hello))
                    .await
                    .unwrap_or_else(|_| JoinReply::refused("the admin's store failed"));
                send_reply(&mut wire, &done).await;
            }
        }
        let _ = wire.writer_mut().shutdown().await;
        let _ = tokio::time::timeout(EXCHANGE_TIMEOUT, conn.closed()).await;
        Ok(())
    }
}

async fn send_reply(wire: &mut RosterWire, reply: &JoinReply) -> bool {
    match serde_json::to_value(reply) {
        Ok(v) => wire.send_value(v).await.is_ok(),
        Err(_) => false,
    }
}
