//! The org verbs: creating an org, inviting, listing, removing and regrouping members (each
//! change signed as the next serial on the admin's node), the org's status, and moving the
//! root key. Joining is in `join`, the roster's distribution in `sync`, how a removed
//! device learns of it and leaves in `removal`.

mod gossip;
mod join;
mod removal;
mod sync;

pub(super) use gossip::GossipProtocol;
pub(super) use join::JoinProtocol;
pub(super) use sync::RosterProtocol;

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use iroh::{EndpointId, SecretKey};
use mcpmesh_net::session::valid_service_name;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::control::{ControlError, codes};
use crate::keys;
use crate::pairing;
use crate::roster::invite::JoinInvite;
use crate::roster::removal::MAX_REMOVALS;
use crate::roster::{
    self, DEFAULT_VALIDITY_SECS, Device, Member, Removal, Roster, RosterView, SignedRoster,
    valid_device, valid_user,
};
use crate::store::{OrgRecord, Removed, StoredJoinInvite};
use crate::time::unix_ms;

use super::catalog::Catalog;
use super::core::Core;
use super::core::params_of;
use super::swarm::OrgGossip;
use sync::SYNC_FANOUT;

fn bad(message: impl Into<String>) -> ControlError {
    ControlError::invalid_params(message)
}

fn now_secs() -> u64 {
    unix_ms() / 1000
}

fn store_err(e: crate::store::StoreError) -> ControlError {
    ControlError::new(codes::NODE_UNAVAILABLE, e.to_string())
}

/// Why the node holds no roster: it is in no org, was removed from one, or the copy it
/// stored is damaged.
fn no_roster(damage: Option<String>, removed: Option<(String, Removed)>) -> ControlError {
    match (damage, removed) {
        (Some(damage), _) => ControlError::new(
            codes::NODE_UNAVAILABLE,
            format!(
                "{damage}; the node is fetching it again from the org's members (keep one of them online)"
            ),
        ),
        (None, Some((org, removed))) => ControlError::new(
            codes::NOT_FOUND,
            format!(
                "this device was removed from org {org} (serial {}); {}",
                removed.serial,
                rejoin_hint(&removed)
            ),
        ),
        (None, None) => not_in_org(),
    }
}

/// What a removed device can do: ask the admin to readmit its key, or join with a new one.
pub(super) fn rejoin_hint(removed: &Removed) -> String {
    let device = if removed.device.is_empty() {
        "NAME"
    } else {
        &removed.device
    };
    let user = if removed.user.is_empty() {
        "USER"
    } else {
        &removed.user
    };
    format!(
        "to come back with this key the admin runs `mcpmesh org invite {user} --device {device} --readmit` and you join with that line; otherwise join from a profile with a new key"
    )
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

fn check_device(device: Option<&str>) -> Result<(), ControlError> {
    match device {
        Some(d) if !valid_device(d) => Err(bad(format!(
            "{d:?}: a device name is 1-{} letters, digits, '.', '_' or '-'",
            roster::MAX_DEVICE_LEN
        ))),
        _ => Ok(()),
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

/// The org this node is in: its roster (held in [`Core`], installed only here), the org's
/// gossip topic, the roster refusals it records, and on the admin's node the root key's file.
#[derive(Debug)]
pub(in crate::daemon) struct Org {
    core: Arc<Core>,
    /// Asked again when a member announces its catalog changed.
    catalog: Arc<Catalog>,
    /// The org's gossip (roster serials, catalog changes).
    gossip: OrgGossip,
    /// Rosters refused from peers, recorded without letting a peer flood the audit log.
    roster_refusals: crate::audit::RosterRefusals,
    /// Held while a roster is checked and installed, so two never interleave.
    org_lock: std::sync::Mutex<()>,
    /// Where the org root key is kept on the admin's node.
    root_file: std::path::PathBuf,
    me: std::sync::Weak<Org>,
}

impl Org {
    pub(in crate::daemon) fn new(
        core: Arc<Core>,
        catalog: Arc<Catalog>,
        root_file: std::path::PathBuf,
    ) -> Arc<Org> {
        Arc::new_cyclic(|me| Org {
            gossip: OrgGossip::new(core.endpoint.clone()),
            roster_refusals: crate::audit::RosterRefusals::new(core.audit.clone()),
            core,
            catalog,
            org_lock: Default::default(),
            root_file,
            me: me.clone(),
        })
    }

    /// Runs `job` on the node's writer, where every store and config write is made.
    async fn on_disk<T: Send + 'static>(
        &self,
        job: impl FnOnce(&Org) -> T + Send + 'static,
    ) -> Option<T> {
        self.core.on_disk_as(&self.me, job).await
    }

    /// Whether `peer` has a seat in the roster held (expired or not) and is not revoked.
    fn holds_seat(&self, peer: &EndpointId) -> bool {
        self.core
            .roster()
            .is_some_and(|v| v.seat(peer).is_some() && !v.is_revoked(peer))
    }

    /// Writes out the roster refusals tallied since the last time.
    pub(in crate::daemon) fn flush_refusals(&self) {
        self.roster_refusals.flush();
    }

    /// Tells the org each time this node's services change, until the node stops.
    pub(in crate::daemon) async fn announce_catalog_changes(&self) {
        let stop = self.core.shutdown.clone();
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = self.core.services_changed.notified() => self.announce_catalog().await,
            }
        }
    }

    /// The root key, when this node is the org's admin.
    fn root_key(&self) -> Option<SecretKey> {
        let record = self.core.store.org().ok()??;
        let key = keys::load(&self.root_file).ok()??;
        (key.public().to_string() == record.root).then_some(key)
    }

    fn require_admin(&self) -> Result<(SecretKey, Arc<RosterView>), ControlError> {
        let view = self.held_roster()?;
        let key = self.root_key().ok_or_else(|| {
            ControlError::new(
                codes::REFUSED,
                "only the org's admin node can change the roster (it holds the root key)",
            )
        })?;
        Ok((key, view))
    }

    /// The root key of an org being created. A key left by a create that crashed before
    /// storing the org is reused: it never signed anything anyone holds.
    fn new_root_key(&self) -> Result<SecretKey, ControlError> {
        match keys::load(&self.root_file) {
            Ok(Some(key)) => Ok(key),
            Ok(None) => {
                let key = SecretKey::generate();
                keys::store_new(&self.root_file, &key)
                    .map_err(|e| ControlError::new(codes::LOCAL, e.to_string()))?;
                Ok(keys::load(&self.root_file).ok().flatten().unwrap_or(key))
            }
            Err(e) => Err(ControlError::new(codes::LOCAL, e.to_string())),
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
        let nickname = self.core.settings().nickname.clone();
        let user = match c.user {
            Some(u) => u,
            None => nickname
                .clone()
                .filter(|n| valid_user(n))
                .unwrap_or_else(|| "admin".to_owned()),
        };
        check_user(&user)?;
        // A device removed from its org is in none: it may start one.
        if let Some(existing) = self.core.store.org().map_err(store_err)?
            && existing.removed.is_none()
        {
            return Err(ControlError::new(
                codes::CONFLICT,
                format!("this node is in the org {} already", existing.org),
            ));
        }
        let key = self.new_root_key()?;
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
                    eid: self.core.endpoint.id().to_string(),
                    addrs: self.core.direct_addrs(),
                    relay: self.core.home_relay(),
                }],
            }],
            revoked: Vec::new(),
            removals: Vec::new(),
        };
        let signed = SignedRoster::sign(first, &key)
            .map_err(|e| ControlError::new(codes::LOCAL, e.to_string()))?;
        self.core
            .store
            .put_org(&OrgRecord {
                org: c.name.clone(),
                root: key.public().to_string(),
                ..OrgRecord::default()
            })
            .map_err(store_err)?;
        self.install_roster(signed.text.as_bytes(), "self")
            .map_err(|e| ControlError::new(codes::LOCAL, e.to_string()))?;
        self.core.trust_event("org_create", Some(&user), None);
        Ok(json!({
            "org": c.name,
            "root": key.public().to_string(),
            "serial": 1,
            "user": user,
            "expires_at": now + DEFAULT_VALIDITY_SECS,
        }))
    }

    pub(super) fn org_invite(&self, params: Value) -> Result<Value, ControlError> {
        let m: InviteParams = params_of(params)?;
        check_user(&m.user)?;
        check_groups(&m.groups)?;
        check_device(m.device.as_deref())?;
        let (_key, mut view) = self.require_admin()?;
        if m.readmit {
            let device = m
                .device
                .as_deref()
                .ok_or_else(|| bad("--readmit needs the removed device: --device NAME"))?;
            view = self.readmit(&m.user, device)?;
        }
        let r = view.roster();
        let groups = invitee_groups(r, &m)?;
        let ttl = Duration::from_secs(m.ttl_secs.unwrap_or(roster::invite::DEFAULT_TTL.as_secs()));
        if ttl.is_zero() || ttl > roster::invite::MAX_TTL {
            return Err(bad("--ttl must be between 1s and 7d"));
        }
        let secret = pairing::new_secret()
            .map_err(|e| ControlError::new(codes::NODE_UNAVAILABLE, e.to_string()))?;
        let iid = pairing::new_invite_id()
            .map_err(|e| ControlError::new(codes::NODE_UNAVAILABLE, e.to_string()))?;
        let expires_at = now_secs() + ttl.as_secs();
        self.core
            .store
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
        self.core.update_alpns();
        let invite = JoinInvite {
            v: 1,
            org: r.org.clone(),
            root: r.root.clone(),
            admin: self.core.endpoint.id().to_string(),
            addrs: self.core.direct_addrs(),
            relay: self.core.home_relay(),
            iid,
            secret: pairing::encode_secret(&secret),
            user: m.user.clone(),
            groups: groups.clone(),
            exp: expires_at,
        };
        self.core.trust_event("org_invite", Some(&m.user), None);
        Ok(json!({
            "invite": invite.encode(),
            "expires_at": expires_at,
            "user": m.user,
            "groups": groups,
        }))
    }

    /// Clears the removed `user`'s device `device` from the revoked keys, as the next serial:
    /// that key may join again.
    fn readmit(&self, user: &str, device: &str) -> Result<Arc<RosterView>, ControlError> {
        let view = self.publish(|next| {
            let at = next
                .removals
                .iter()
                .position(|r| r.user == user && r.device == device)
                .ok_or_else(|| {
                    ControlError::new(
                        codes::NOT_FOUND,
                        format!(
                            "{user} has no removed device named {device:?} (see the revoked keys in `mcpmesh org members`)"
                        ),
                    )
                })?;
            let eid = next.removals.remove(at).eid;
            next.revoked.retain(|r| *r != eid);
            Ok(())
        })?;
        tracing::info!(user, device, "readmitted a removed device's key");
        Ok(view)
    }

    pub(super) fn org_members(&self) -> Result<Value, ControlError> {
        let view = self.held_roster()?;
        let r = view.roster();
        let removed: Vec<Value> = r
            .removals
            .iter()
            .map(
                |n| json!({ "user": n.user, "device": n.device, "eid": n.eid, "serial": n.serial }),
            )
            .collect();
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
            "removed": removed,
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
        let me = self.core.endpoint.id().to_string();
        let mut revoked = Vec::new();
        let key = self.root_key();
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
            let user = member.user.clone();
            if member.devices.is_empty() {
                next.members.remove(at);
            }
            // Each removed device gets the root's word of it, which members hand it alone.
            if let Some(key) = &key {
                for d in &gone {
                    let notice = Removal::sign(&next.org, key, &d.eid, &user, &d.name, next.serial)
                        .map_err(|e| ControlError::new(codes::LOCAL, e.to_string()))?;
                    next.removals.push(notice);
                }
                let over = next.removals.len().saturating_sub(MAX_REMOVALS);
                next.removals.drain(..over);
            }
            revoked = gone.into_iter().map(|d| d.eid).collect();
            next.revoked.extend(revoked.iter().cloned());
            Ok(())
        })?;
        self.tell_removed_soon(
            revoked
                .iter()
                .filter_map(|e| roster::parse_eid(e))
                .collect(),
        );
        self.core.trust_event("org_remove", Some(&r.user), None);
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
        self.core.trust_event("org_groups", Some(&g.user), None);
        Ok(json!({ "serial": view.roster().serial, "user": g.user, "groups": groups }))
    }

    pub(super) async fn org_status(&self) -> Result<Value, ControlError> {
        let view = self.held_roster()?;
        let me = self.core.endpoint.id();
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
        // The exchanges may have brought a newer roster: report what is held now.
        let view = self.core.roster().unwrap_or(view);
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
        let Some(view) = self.core.roster() else {
            // Still in the org when the copy of the roster is damaged: the root and the
            // membership are kept apart from it.
            return match (
                self.core.roster.damage(),
                self.core.store.org().ok().flatten(),
            ) {
                (Some(damage), Some(record)) => json!({
                    "name": record.org,
                    "damaged": damage,
                    "admin": self.root_key().is_some(),
                }),
                (
                    None,
                    Some(OrgRecord {
                        org,
                        removed: Some(removed),
                        ..
                    }),
                ) => json!({
                    "name": org,
                    "removed": {
                        "serial": removed.serial,
                        "user": removed.user,
                        "device": removed.device,
                        "at": removed.at / 1000,
                        "hint": rejoin_hint(&removed),
                    },
                    "admin": false,
                }),
                _ => Value::Null,
            };
        };
        let r = view.roster();
        let user = view.seat(&self.core.endpoint.id()).map(|s| s.user.clone());
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
        self.core.trust_event("org_export_root", None, None);
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
        self.adopt_org(&signed.roster.org, &root_hex)?;
        self.keep_root_key(&key)?;
        // The export's roster, unless this node holds a newer one of the same org.
        let _ = self.install_roster(signed.text.as_bytes(), "import");
        let me = self.core.endpoint.id();
        let nickname = self.core.settings().nickname.clone();
        let member = self.core.roster().is_some_and(|v| v.seat(&me).is_some());
        let mut user = i.user.clone();
        let addrs = self.core.direct_addrs();
        let view = self.publish(|next| {
            next.revoked.retain(|r| roster::parse_eid(r) != Some(me));
            next.removals
                .retain(|r| roster::parse_eid(&r.eid) != Some(me));
            if !member {
                let name = user.clone().or(nickname.clone()).filter(|u| valid_user(u));
                let name = name.unwrap_or_else(|| "admin".to_owned());
                let device = Device {
                    name: String::new(),
                    eid: me.to_string(),
                    addrs: addrs.clone(),
                    relay: None,
                };
                seat_device(next, &name, device, nickname.as_deref());
                user = Some(name);
            }
            Ok(())
        })?;
        let user = view.seat(&me).map(|s| s.user.clone()).or(user);
        self.core
            .trust_event("org_import_root", user.as_deref(), None);
        Ok(json!({
            "org": view.roster().org,
            "root": root_hex,
            "serial": view.roster().serial,
            "user": user,
        }))
    }

    /// Takes on the org whose root is `root_hex`, unless this node is in another one.
    fn adopt_org(&self, org: &str, root_hex: &str) -> Result<(), ControlError> {
        match self.core.store.org().map_err(store_err)? {
            Some(held) if !held.root.eq_ignore_ascii_case(root_hex) => Err(ControlError::new(
                codes::CONFLICT,
                format!("this node is in another org ({})", held.org),
            )),
            Some(_) => Ok(()),
            None => self
                .core
                .store
                .put_org(&OrgRecord {
                    org: org.to_owned(),
                    root: root_hex.to_owned(),
                    ..OrgRecord::default()
                })
                .map_err(store_err),
        }
    }

    /// Keeps the imported root `key`, unless this node holds another org's.
    fn keep_root_key(&self, key: &SecretKey) -> Result<(), ControlError> {
        match keys::load(&self.root_file) {
            Ok(Some(existing)) if existing.public() != key.public() => Err(ControlError::new(
                codes::CONFLICT,
                "this node holds another org's root key",
            )),
            Ok(Some(_)) => Ok(()),
            Ok(None) => {
                keys::store_new(&self.root_file, key)
                    .map_err(|e| ControlError::new(codes::LOCAL, e.to_string()))?;
                Ok(())
            }
            Err(e) => Err(ControlError::new(codes::LOCAL, e.to_string())),
        }
    }
}

/// The parameters of `org.invite`.
#[derive(Deserialize)]
struct InviteParams {
    user: String,
    #[serde(default)]
    groups: Vec<String>,
    #[serde(default)]
    device: Option<String>,
    #[serde(default)]
    ttl_secs: Option<u64>,
    #[serde(default)]
    readmit: bool,
}

/// The groups an invite gives: a member's own (a new device of theirs, which must be
/// named), or those asked for a new member. No user id may be a group name.
fn invitee_groups(r: &Roster, m: &InviteParams) -> Result<Vec<String>, ControlError> {
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
    Ok(groups)
}

/// Seats `device` (its name still to be chosen) in `next` as a device of `user`: beside
/// the user's others, or as a new member with no groups.
fn seat_device(next: &mut Roster, user: &str, device: Device, nickname: Option<&str>) {
    match next.members.iter_mut().find(|m| m.user == user) {
        Some(m) => {
            let d = Device {
                name: free_device_name(m, &device_name(nickname)),
                ..device
            };
            m.devices.push(d);
        }
        None => next.members.push(Member {
            user: user.to_owned(),
            groups: Vec::new(),
            devices: vec![Device {
                name: device_name(nickname),
                ..device
            }],
        }),
    }
}
