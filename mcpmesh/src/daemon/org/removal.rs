//! A device's removal from its org, from both ends: members hand a key the roster revoked
//! its removal notice (and nothing else), the admin's node tells the devices it removes at
//! once, and a removed device that verified its notice leaves the org (it keeps the notice,
//! holds no roster, trusts and dials no member) until the admin readmits its key or it
//! joins again.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use iroh::EndpointId;
use iroh::endpoint::{Connection, VarInt};
use mcpmesh_net::gate::CLOSE_UNKNOWN_PEER;
use mcpmesh_net::transport::NdjsonTransport;
use tokio::io::AsyncWriteExt;

use crate::roster::sync::{
    ALPN_ROSTER, EXCHANGE_TIMEOUT, MAX_REVOKED_MESSAGE, MAX_TOLD, NOTICE_INTERVAL, Offer,
};
use crate::roster::{self, RemovalNotice, RosterError, RosterView};
use crate::store::{OrgRecord, Removed, StoreError};
use crate::time::unix_ms;

use super::super::exchange::{Wire, hang_up, next_message};
use super::Org;

/// Revoked keys handed their notice within the last [`NOTICE_INTERVAL`]: a removed device
/// that keeps dialing is told once a minute at most, and the table stays bounded.
#[derive(Debug, Default)]
pub(super) struct Told(std::sync::Mutex<HashMap<EndpointId, Instant>>);

impl Told {
    /// Whether `peer` may be told now (and, if so, that it was).
    pub(super) fn may_tell(&self, peer: EndpointId) -> bool {
        let now = Instant::now();
        let mut told = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if told
            .get(&peer)
            .is_some_and(|at| now.duration_since(*at) < NOTICE_INTERVAL)
        {
            return false;
        }
        if told.len() >= MAX_TOLD {
            told.retain(|_, at| now.duration_since(*at) < NOTICE_INTERVAL);
            if told.len() >= MAX_TOLD {
                return false;
            }
        }
        told.insert(peer, now);
        true
    }
}

/// Answers a revoked key's roster exchange with its removal notice, then closes: whatever it
/// sent is read (bounded) and ignored.
pub(super) async fn tell_removed(conn: Connection, notice: RemovalNotice) {
    let told = async {
        let (send, recv) = conn.accept_bi().await.ok()?;
        let mut wire: Wire = NdjsonTransport::new(recv, send, MAX_REVOKED_MESSAGE);
        next_message(&mut wire, EXCHANGE_TIMEOUT).await?;
        let answer = Offer {
            root: Some(notice.root.clone()),
            serial: notice.serial,
            roster: None,
            removed: Some(notice),
        };
        wire.send_value(serde_json::to_value(&answer).ok()?)
            .await
            .ok()?;
        let _ = wire.writer_mut().shutdown().await;
        // The dialer ends its stream once it has read the answer.
        let _ = wire.recv_value().await;
        Some(())
    };
    let _ = tokio::time::timeout(EXCHANGE_TIMEOUT, told).await;
    conn.close(
        VarInt::from_u32(CLOSE_UNKNOWN_PEER),
        b"removed from the org",
    );
}

impl Org {
    /// The removal notice for `peer`, when the roster held revoked it and carries one.
    pub(super) fn notice_for(&self, peer: &EndpointId) -> Option<RemovalNotice> {
        let view = self.core.roster()?;
        let r = view.roster();
        Some(view.removal(peer)?.notice(&r.org, &r.root))
    }

    /// The user whose removed device `peer` is, for the records of its refused connections.
    pub(in crate::daemon) fn removed_user(&self, peer: &EndpointId) -> Option<String> {
        Some(self.core.roster()?.removal(peer)?.user.clone())
    }

    /// What a roster revoking this device says of it: the serial, and whose device it was
    /// (from the roster's notice, else from the roster held before).
    pub(super) fn removal_of(
        &self,
        view: &RosterView,
        before: Option<&RosterView>,
        record: &OrgRecord,
        from: &str,
    ) -> Removed {
        let me = self.core.endpoint.id();
        let r = view.roster();
        let notice = view.removal(&me);
        let seat = before.and_then(|v| v.seat(&me));
        let (user, device) = match (notice, seat) {
            (Some(n), _) => (n.user.clone(), n.device.clone()),
            (None, Some(s)) => (s.user.clone(), s.device.clone()),
            (None, None) => (
                record
                    .pending
                    .as_ref()
                    .map(|p| p.user.clone())
                    .unwrap_or_default(),
                String::new(),
            ),
        };
        Removed {
            serial: notice.map_or(r.serial, |n| n.serial),
            user,
            device,
            at: unix_ms(),
            from: from.to_owned(),
            notice: notice.and_then(|n| serde_json::to_string(&n.notice(&r.org, &r.root)).ok()),
        }
    }

    /// Leaves the org on a verified removal: the root stays pinned (a notice or roster from
    /// it is still recognised), the roster and the members to fetch it from go, and the
    /// removal is kept for the record. Called with the org lock held.
    pub(super) fn leave_org(&self, record: OrgRecord, removed: Removed) -> Result<(), StoreError> {
        self.core.store.put_org(&OrgRecord {
            org: record.org,
            root: record.root,
            roster: None,
            pending: None,
            serial: removed.serial,
            sources: Vec::new(),
            removed: Some(removed),
        })?;
        self.core.roster.set(None);
        Ok(())
    }

    /// After leaving the org: recorded, and the members lose this node's trust (their
    /// connections and sessions end here).
    pub(super) fn removed_now(&self, removed: &Removed) {
        tracing::warn!(
            serial = removed.serial,
            from = %removed.from,
            "this device was removed from its org; it no longer trusts or dials the org's members"
        );
        self.core
            .trust_event("org_removed", Some(&removed.user), None);
        self.core.refresh();
        // And it leaves the org's gossip.
        if let Some(org) = self.me.upgrade() {
            tokio::spawn(async move { org.gossip_follow_roster(None).await });
        }
    }

    /// Checks a removal notice `peer` handed over and, when it verifies, leaves the org. A
    /// bad notice is refused and recorded like a bad roster.
    pub(super) async fn take_notice_on_disk(&self, notice: RemovalNotice, peer: EndpointId) {
        let from = self.core.name_of(&peer);
        self.on_disk(move |org| {
            let taken = {
                let _one_at_a_time = org.org_lock.lock().unwrap_or_else(|p| p.into_inner());
                org.notice_locked(&notice, &from)
            };
            match taken {
                Ok(Some(removed)) => org.removed_now(&removed),
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(from, "refused a removal notice: {e}");
                    org.roster_refusals.refused(
                        format!("eid:{peer}"),
                        &from,
                        e.kind(),
                        e.to_string(),
                    );
                }
            }
        })
        .await;
    }

    fn notice_locked(
        &self,
        notice: &RemovalNotice,
        from: &str,
    ) -> Result<Option<Removed>, RosterError> {
        let record = self
            .core
            .store
            .org()
            .ok()
            .flatten()
            .ok_or_else(|| RosterError::Invalid("this node is not in an org".into()))?;
        if record.removed.is_some() {
            return Ok(None);
        }
        if self.root_key().is_some() {
            return Err(RosterError::Invalid(
                "this node holds the org's root key".into(),
            ));
        }
        let root = roster::parse_eid(&record.root)
            .ok_or_else(|| RosterError::Invalid("the pinned root is damaged".into()))?;
        let held = self
            .core
            .roster()
            .map_or(record.serial.saturating_sub(1), |v| v.roster().serial);
        notice.check(&root, &self.core.endpoint.id(), held)?;
        let removed = Removed {
            serial: notice.serial,
            user: notice.user.clone(),
            device: notice.device.clone(),
            at: unix_ms(),
            from: from.to_owned(),
            notice: serde_json::to_string(notice).ok(),
        };
        self.leave_org(record, removed.clone())
            .map_err(|e| RosterError::Invalid(format!("could not store it: {e}")))?;
        Ok(Some(removed))
    }

    /// On the admin's node, after a removal: each removed device still online is handed its
    /// notice at once, so it stops dialing the members instead of learning it on its next
    /// pull.
    pub(super) fn tell_removed_soon(&self, ids: Vec<EndpointId>) {
        let Some(org) = self.me.upgrade() else {
            return;
        };
        tokio::spawn(async move {
            for id in ids {
                let Some(notice) = org.notice_for(&id) else {
                    continue;
                };
                org.push_notice(id, notice).await;
            }
        });
    }

    async fn push_notice(&self, peer: EndpointId, notice: RemovalNotice) {
        let push = async {
            let conn = self.core.endpoint.connect(peer, ALPN_ROSTER).await.ok()?;
            let (send, recv) = conn.open_bi().await.ok()?;
            let mut wire: Wire = NdjsonTransport::new(recv, send, MAX_REVOKED_MESSAGE);
            let offer = Offer {
                root: Some(notice.root.clone()),
                serial: notice.serial,
                roster: None,
                removed: Some(notice),
            };
            wire.send_value(serde_json::to_value(&offer).ok()?)
                .await
                .ok()?;
            // The device ends its side once it has taken the notice.
            hang_up(wire, &conn).await;
            Some(())
        };
        let _ = tokio::time::timeout(EXCHANGE_TIMEOUT, push).await;
    }

    /// Keys a new roster no longer revokes were readmitted by the admin: each node records
    /// it, naming the device as the roster's notice did.
    pub(super) fn audit_readmissions(&self, before: &RosterView, after: &Arc<RosterView>) {
        for id in before.revoked().iter().filter(|id| !after.is_revoked(id)) {
            let who = before.removal(id).map_or_else(
                || format!("eid:{}", id.fmt_short()),
                |r| format!("{}.{}", r.user, r.device),
            );
            tracing::info!(device = %who, "a removed device's key was readmitted");
            self.core.trust_event("org_readmit", Some(&who), None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_revoked_key_is_told_once_a_minute_and_the_table_stays_bounded() {
        let told = Told::default();
        let key = || iroh::SecretKey::generate().public();
        let first = key();
        assert!(told.may_tell(first));
        assert!(!told.may_tell(first), "told twice within the interval");
        for _ in 1..MAX_TOLD {
            assert!(told.may_tell(key()));
        }
        // Full of keys told within the interval: the next is refused, not remembered.
        let late = key();
        assert!(!told.may_tell(late));
        assert_eq!(told.0.lock().unwrap().len(), MAX_TOLD);
    }
}
