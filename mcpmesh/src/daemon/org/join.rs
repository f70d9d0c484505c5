//! Joining an org: the joiner's `join` verb and the admin node's side of `mcpmesh/join/1`,
//! crash-safe like pairing (see `roster::invite`).

use std::net::SocketAddr;
use std::sync::Arc;

use iroh::endpoint::{Connection, VarInt};
use iroh::protocol::{AcceptError, ProtocolHandler};
use iroh::{EndpointAddr, EndpointId, RelayUrl};
use mcpmesh_net::ping::{PingOutcome, ping_outcome};
use mcpmesh_net::transport::NdjsonTransport;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;

use crate::audit::AuditEvent;
use crate::control::{ControlError, codes};
use crate::pairing;
use crate::roster::invite::{
    ALPN_JOIN, JoinCommit, JoinHello, JoinInvite, JoinReply, MAX_MESSAGE as MAX_JOIN_MESSAGE,
};
use crate::roster::sync::{EXCHANGE_TIMEOUT, MAX_MESSAGE};
use crate::roster::{
    self, DEFAULT_VALIDITY_SECS, Device, Member, Roster, RosterView, SignedRoster,
};
use crate::store::{JoinStep, OrgRecord, Pairing, PendingJoin, StoredJoinInvite};
use crate::time::unix_ms;

use super::super::core::{params_of, stopping};
use super::super::exchange::{Exchange, Wire, next_message, offered_addrs, send_message};
use super::Org;
use super::{bad, check_device, device_name, free_device_name, now_secs, store_err};

/// Failed join attempts after which a join invite is void.
const MAX_JOIN_FAILURES: u32 = 10;
/// Join exchanges (from keys not yet trusted) handled at once.
const MAX_CONCURRENT_JOINS: usize = 16;

impl Org {
    /// Settles a join left pending by a crash: the admin's node answers a roster exchange
    /// only if it admitted this device (then its roster completes the join), and refuses the
    /// connection if it did not (then the join is dropped). Unreachable: ask later.
    pub(in crate::daemon) async fn confirm_pending_join(&self) {
        let Ok(Some(record)) = self.core.store.org() else {
            return;
        };
        let Some(pending) = record.pending.clone() else {
            return;
        };
        let Some(admin) = roster::parse_eid(&pending.admin) else {
            return;
        };
        self.core
            .dialer
            .add_address_hint(hint(admin, &pending.addrs, pending.relay.as_deref()));
        match ping_outcome(&self.core.endpoint, admin, EXCHANGE_TIMEOUT).await {
            PingOutcome::Reachable { .. } => {
                self.sync_with(admin).await;
            }
            PingOutcome::Refused => {
                self.on_disk(move |org| org.undo_pending_join(&record.org))
                    .await;
            }
            PingOutcome::Unreachable => {
                tracing::info!(org = %record.org, "join still pending: the admin's node is unreachable");
            }
        }
    }

    pub(in crate::daemon) async fn org_join(&self, params: Value) -> Result<Value, ControlError> {
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
        let me = self.core.endpoint.id();
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
        check_device(j.device.as_deref())?;
        self.core
            .dialer
            .add_address_hint(hint(admin, &invite.addrs, invite.relay.as_deref()));
        self.check_free_to_join(&invite, admin).await?;
        let hello = JoinHello {
            join: 1,
            invite: invite.iid.clone(),
            proof: pairing::proof(&secret, &admin, &me),
            device: j
                .device
                .clone()
                .or_else(|| self.core.settings().nickname.clone()),
            addrs: self.core.direct_addrs(),
            relay: self.core.home_relay(),
        };
        let roster_text = self.join_through_admin(admin, &invite, &hello).await?;
        let admin_name = format!("eid:{}", admin.fmt_short());
        self.on_disk(move |org| {
            org.install_roster_by(roster_text.as_bytes(), &admin_name, Some(admin))
                .map(drop)
        })
        .await
        .ok_or_else(stopping)?
        .map_err(|e| ControlError::new(codes::REFUSED, format!("the admin's roster: {e}")))?;
        let view = self.held_roster()?;
        let seat = view.seat(&me).ok_or_else(|| {
            ControlError::new(
                codes::REFUSED,
                "the admin's roster does not name this device",
            )
        })?;
        let code = pairing::code(&admin, &me, &secret);
        self.core.trust_event("org_join", Some(&seat.user), None);
        Ok(json!({
            "org": view.roster().org,
            "user": seat.user,
            "groups": seat.groups,
            "device": seat.device,
            "code": code,
            "serial": view.roster().serial,
        }))
    }

    /// Refuses a join into another org while this node is in one (a removed device is in
    /// none), or into the org it is a member of already.
    async fn check_free_to_join(
        &self,
        invite: &JoinInvite,
        admin: EndpointId,
    ) -> Result<(), ControlError> {
        let Some(existing) = self.core.store.org().map_err(store_err)? else {
            return Ok(());
        };
        let me = self.core.endpoint.id();
        let same = existing.root.eq_ignore_ascii_case(&invite.root);
        let mut member = self.core.roster().is_some_and(|v| v.seat(&me).is_some());
        if same && member {
            // A device removed while it was away still holds the roster naming it: the
            // admin's node says whether it is a member before it is told it is one.
            self.sync_with(admin).await;
            member = self.core.roster().is_some_and(|v| v.seat(&me).is_some());
        }
        // A removed device is in no org: it may join this one again, or another.
        if !same && existing.removed.is_none() {
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
        Ok(())
    }

    /// The join's exchange with the admin's node: the hello, then, once the join is pinned
    /// here as pending, the commit. Returns the roster naming this device.
    async fn join_through_admin(
        &self,
        admin: EndpointId,
        invite: &JoinInvite,
        hello: &JoinHello,
    ) -> Result<String, ControlError> {
        let limit = self.core.settings().dial_timeout + EXCHANGE_TIMEOUT;
        let unanswered = || {
            ControlError::new(
                codes::UNREACHABLE,
                "the admin's node did not answer in time",
            )
        };
        let open = Exchange::open(
            &self.core.endpoint,
            admin,
            ALPN_JOIN,
            MAX_JOIN_MESSAGE + MAX_MESSAGE,
            "the admin's node",
        );
        let mut exchange = tokio::time::timeout(limit, open)
            .await
            .map_err(|_| unanswered())??;
        let reply: JoinReply = tokio::time::timeout(limit, exchange.ask(hello))
            .await
            .map_err(|_| unanswered())??;
        if !reply.ok {
            return Err(join_refusal(reply));
        }
        // Pinned and pending before the admin commits: whatever crashes next, recovery can
        // tell from the admin's node whether the join happened (see `confirm_pending_join`).
        let pinned = invite.clone();
        self.on_disk(move |org| org.pin_pending_join(&pinned))
            .await
            .unwrap_or_else(|| Err(stopping()))?;
        let done = tokio::time::timeout(
            limit,
            exchange.ask::<JoinReply>(&JoinCommit { commit: true }),
        )
        .await;
        exchange.close();
        match done {
            Ok(Ok(JoinReply {
                ok: true,
                roster: Some(text),
                ..
            })) => Ok(text),
            Ok(Ok(refused)) => {
                self.on_disk(|org| org.drop_pending_join()).await;
                Err(join_refusal(refused))
            }
            Err(_) | Ok(Err(_)) => Err(ControlError::new(
                codes::UNREACHABLE,
                "the admin's node did not confirm the join; it will be confirmed or undone when it can be reached",
            )),
        }
    }

    /// The admin's node refused this device's pending join: a node that held a roster before
    /// keeps it; a fresh joiner leaves the org.
    fn undo_pending_join(&self, org: &str) {
        let _guard = self.org_lock.lock().unwrap_or_else(|p| p.into_inner());
        if let Ok(Some(now)) = self.core.store.org()
            && now.pending.is_some()
        {
            let outcome = if now.roster.is_some() {
                self.core.store.put_org(&OrgRecord {
                    pending: None,
                    ..now
                })
            } else {
                self.core.store.remove_org()
            };
            if outcome.is_ok() {
                tracing::info!(org = %org, "join undone: the admin never completed it");
            }
        }
    }

    /// Stores the org as joined through `invite`, pending the admin's commit.
    fn pin_pending_join(&self, invite: &JoinInvite) -> Result<(), ControlError> {
        let _guard = self.org_lock.lock().unwrap_or_else(|p| p.into_inner());
        // A removal from another org is forgotten; one from this org is kept until the
        // join completes.
        let held = self
            .core
            .store
            .org()
            .map_err(store_err)?
            .filter(|h| h.root.eq_ignore_ascii_case(&invite.root));
        self.core
            .store
            .put_org(&OrgRecord {
                org: invite.org.clone(),
                root: invite.root.clone(),
                pending: Some(PendingJoin {
                    admin: invite.admin.clone(),
                    addrs: invite.addrs.clone(),
                    relay: invite.relay.clone(),
                    user: invite.user.clone(),
                    at: unix_ms(),
                }),
                ..held.unwrap_or_default()
            })
            .map_err(store_err)?;
        Ok(())
    }

    /// The admin's node refused the commit: the pending join is dropped, and with it the
    /// org, unless this node held a roster or a removal of it before.
    fn drop_pending_join(&self) {
        let _ = self.core.store.org().map(|held| match held {
            Some(h) if h.roster.is_some() || h.removed.is_some() => {
                self.core.store.put_org(&OrgRecord { pending: None, ..h })
            }
            _ => self.core.store.remove_org(),
        });
    }

    /// On the admin's node, on the joiner's hello: the proof must hold for a live invite.
    /// Nothing is stored but a failed attempt. Blocking (store transactions).
    pub(super) fn check_join(&self, joiner: EndpointId, hello: &JoinHello) -> JoinReply {
        if self.core.gate.is_revoked(&joiner) {
            return JoinReply::refused(self.revoked_join(&joiner));
        }
        let me = self.core.endpoint.id();
        let checked =
            self.core
                .store
                .attempt_join(&hello.invite, now_secs(), MAX_JOIN_FAILURES, |invite| {
                    pairing::check_proof(&invite.secret, &me, &joiner, &hello.proof)
                        .map(|()| (None, ()))
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
        self.core.update_alpns();
        reply
    }

    /// Why a revoked key may not join, and what to do instead.
    fn revoked_join(&self, joiner: &EndpointId) -> String {
        let view = self.core.roster();
        let org = view
            .as_ref()
            .map(|v| v.roster().org.clone())
            .unwrap_or_default();
        match view.as_ref().and_then(|v| v.removal(joiner)) {
            Some(r) => format!(
                "this device was removed from org {org} (serial {}) and its key stays refused; to readmit it the admin runs `mcpmesh org invite {} --device {} --readmit` and you join with that line; otherwise join from a profile with a new key",
                r.serial, r.user, r.device
            ),
            None => format!(
                "this device was removed from org {org} and its key stays refused; join from a profile with a new key"
            ),
        }
    }

    /// On the admin's node, on the joiner's commit: the used invite and the roster naming
    /// the new device, signed as the next serial, in one store transaction; then installed
    /// here and pushed to the members. Blocking.
    pub(super) fn complete_join(&self, joiner: EndpointId, hello: &JoinHello) -> JoinReply {
        let Ok((key, view)) = self.require_admin() else {
            return JoinReply::refused("this node is no longer the org's admin");
        };
        let me = self.core.endpoint.id();
        let now = now_secs();
        let record = match self.core.store.org() {
            Ok(Some(r)) => r,
            _ => return JoinReply::refused("the admin's store failed"),
        };
        let outcome = {
            let _guard = self.org_lock.lock().unwrap_or_else(|p| p.into_inner());
            self.core
                .store
                .attempt_join(&hello.invite, now, MAX_JOIN_FAILURES, |invite| {
                    pairing::check_proof(&invite.secret, &me, &joiner, &hello.proof)?;
                    let next = admitting(view.roster(), now, joiner, invite, hello)?;
                    let signed = SignedRoster::sign(next, &key).map_err(|e| e.to_string())?;
                    let code = pairing::code(&me, &joiner, &invite.secret);
                    let stored = OrgRecord {
                        roster: Some(signed.text.clone()),
                        serial: signed.roster.serial,
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
        self.core.update_alpns();
        match outcome {
            Ok(JoinStep::Accepted((signed, user))) => self.joined_here(joiner, signed, &user),
            Ok(JoinStep::Refused(reason)) => JoinReply::refused(reason),
            Err(e) => {
                tracing::error!("{e}");
                JoinReply::refused("the admin's store failed")
            }
        }
    }

    /// On the admin's node, once the roster naming `joiner` is stored: it is held here and
    /// spread to the members, and goes to the joiner in the reply.
    fn joined_here(&self, joiner: EndpointId, signed: SignedRoster, user: &str) -> JoinReply {
        let signed_view = Arc::new(RosterView::new(signed.clone()));
        self.hold(signed_view);
        self.core.audit.record(AuditEvent::RosterInstalled {
            org: signed.roster.org.clone(),
            serial: signed.roster.serial,
            from: "self".to_owned(),
        });
        self.core.refresh();
        self.core.trust_event("org_join", Some(user), None);
        tracing::info!(user = %user, device = %joiner.fmt_short(), "a device joined the org");
        self.spread_roster(signed.roster.serial, None);
        self.push_all();
        JoinReply {
            ok: true,
            error: None,
            roster: Some(signed.text),
        }
    }
}

/// The roster after `current` that names `joiner` as a device of the invite's user (a new
/// member with the invite's groups if the user is not one yet), its key no longer revoked.
/// Refused if the device is a member already.
fn admitting(
    current: &Roster,
    now: u64,
    joiner: EndpointId,
    invite: &StoredJoinInvite,
    hello: &JoinHello,
) -> Result<Roster, String> {
    let addrs = offered_addrs(&hello.addrs);
    let mut next = roster::successor(current, now, DEFAULT_VALIDITY_SECS);
    next.revoked
        .retain(|r| roster::parse_eid(r) != Some(joiner));
    next.removals
        .retain(|r| roster::parse_eid(&r.eid) != Some(joiner));
    let wanted = device_name(invite.device.as_deref().or(hello.device.as_deref()));
    let device = |member: &Member| Device {
        name: free_device_name(member, &wanted),
        eid: joiner.to_string(),
        addrs: addrs.clone(),
        relay: hello
            .relay
            .clone()
            .filter(|r| r.parse::<iroh::RelayUrl>().is_ok()),
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
    Ok(next)
}

pub(super) fn hint(id: EndpointId, addrs: &[String], relay: Option<&str>) -> EndpointAddr {
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

/// The `mcpmesh/join/1` handler, on the admin's node. Open to unknown keys by design: the
/// invite secret is the credential, with an attempt budget per invite. Revoked keys are
/// refused at the hello.
#[derive(Debug)]
pub(in crate::daemon) struct JoinProtocol {
    org: Arc<Org>,
    slots: Arc<tokio::sync::Semaphore>,
}

impl JoinProtocol {
    pub(in crate::daemon) fn new(org: Arc<Org>) -> Self {
        JoinProtocol {
            org,
            slots: Arc::new(tokio::sync::Semaphore::new(MAX_CONCURRENT_JOINS)),
        }
    }
}

impl ProtocolHandler for JoinProtocol {
    async fn accept(&self, conn: Connection) -> Result<(), AcceptError> {
        let joiner = conn.remote_id();
        // A revoked key is answered too, within the same slots: its hello is refused with
        // what its owner can do (readmission or a new key), and it burns no invite.
        let Ok(_slot) = self.slots.clone().try_acquire_owned() else {
            conn.close(VarInt::from_u32(503), b"busy");
            return Ok(());
        };
        let Ok(Ok((send, recv))) = tokio::time::timeout(EXCHANGE_TIMEOUT, conn.accept_bi()).await
        else {
            return Ok(());
        };
        let mut wire: Wire = NdjsonTransport::new(recv, send, MAX_JOIN_MESSAGE);
        let hello = next_message(&mut wire, EXCHANGE_TIMEOUT)
            .await
            .and_then(|v| serde_json::from_value::<JoinHello>(v).ok());
        let reply = match hello.clone() {
            Some(hello) if hello.join == 1 => self
                .org
                .on_disk(move |org| org.check_join(joiner, &hello))
                .await
                .unwrap_or_else(|| JoinReply::refused("the admin's store failed")),
            _ => JoinReply::refused("malformed join request"),
        };
        if send_message(&mut wire, &reply).await && reply.ok {
            let commit = next_message(&mut wire, EXCHANGE_TIMEOUT)
                .await
                .and_then(|v| serde_json::from_value::<JoinCommit>(v).ok());
            if let (Some(hello), Some(JoinCommit { commit: true })) = (hello, commit) {
                let done = self
                    .org
                    .on_disk(move |org| org.complete_join(joiner, &hello))
                    .await
                    .unwrap_or_else(|| JoinReply::refused("the admin's store failed"));
                send_message(&mut wire, &done).await;
            }
        }
        let _ = wire.writer_mut().shutdown().await;
        let _ = tokio::time::timeout(EXCHANGE_TIMEOUT, conn.closed()).await;
        Ok(())
    }
}
