//! The node on its org's topic: joining it through a few members, announcing what it holds,
//! hearing what members announce, and fetching the rosters they name. What the topic carries
//! and the bounds on it are in `swarm.rs`, which holds the node's place on the topic.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::StreamExt;
use iroh::EndpointId;
use iroh::endpoint::{Connection, VarInt};
use iroh::protocol::{AcceptError, ProtocolHandler};
use iroh_gossip::TopicId;
use iroh_gossip::api::{Event, GossipReceiver};
use mcpmesh_net::gate::CLOSE_UNKNOWN_PEER;
use tokio_util::task::AbortOnDropHandle;

use crate::audit::AuditEvent;

use super::super::swarm::{
    FIRST_NEIGHBOR_WAIT, HEARD_ENOUGH, JOIN_THROUGH, Joined, MIN_NEIGHBORS, NOTICES_PER_MIN, Next,
    Notice, REJOIN_AFTER, SLOW_FETCH, pick, topic,
};
use super::Org;

/// Hands each notice the topic delivers to the node, and counts the node's neighbors on it,
/// until the topic or the node is gone.
async fn receive_notices(
    org: std::sync::Weak<Org>,
    mut receiver: GossipReceiver,
    counted: Arc<AtomicUsize>,
) {
    while let Some(event) = receiver.next().await {
        let Some(org) = org.upgrade() else { return };
        match event {
            Ok(Event::Received(message)) => {
                org.heard_notice(message.delivered_from, &message.content);
            }
            Ok(Event::NeighborUp(_)) => {
                counted.fetch_add(1, Ordering::Relaxed);
            }
            Ok(Event::NeighborDown(_)) => {
                let was = counted
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
                if was == Ok(1) {
                    // Alone on the topic: notices would no longer reach it.
                    org.rejoin_gossip_soon(REJOIN_AFTER);
                }
            }
            Ok(Event::Lagged) => {
                tracing::debug!("gossip: notices were dropped (lagged)");
            }
            Err(e) => {
                tracing::debug!("gossip: {e}");
                return;
            }
        }
    }
}

impl Org {
    /// Joins the topic of the org held (leaving another one) through a few of its members,
    /// `via` (a device known to hold the roster) first; joins through a few more when it has
    /// fewer than [`MIN_NEIGHBORS`]; leaves it when the node holds no roster. Called whenever a
    /// roster is installed, and at every periodic sync.
    pub(in crate::daemon) async fn gossip_follow_roster(self: &Arc<Self>, via: Option<EndpointId>) {
        let Some(view) = self.core.roster() else {
            *self.gossip.joined() = None;
            return;
        };
        let Some(root) = self.core.store.org().ok().flatten().map(|r| r.root) else {
            return;
        };
        let topic = topic(&root);
        let me = self.core.endpoint.id();
        let members: Vec<EndpointId> = view
            .seats()
            .iter()
            .map(|s| s.id)
            .filter(|id| *id != me && !view.is_revoked(id))
            .collect();
        let current = self
            .gossip
            .joined()
            .as_ref()
            .map(|j| (j.topic, j.sender.clone(), j.neighbors.clone()));
        match current {
            Some((t, sender, neighbors)) if t == topic => {
                if neighbors.load(Ordering::Relaxed) < MIN_NEIGHBORS {
                    let through = pick(members, via, JOIN_THROUGH);
                    if let Err(e) = sender.join_peers(through).await {
                        tracing::debug!("gossip: {e}");
                    }
                }
            }
            _ => {
                self.join_gossip(topic, pick(members, via, JOIN_THROUGH))
                    .await
            }
        }
    }

    /// Subscribes to `topic` through the members `through`, in place of any topic joined
    /// before, and receives its notices.
    async fn join_gossip(self: &Arc<Self>, topic: TopicId, through: Vec<EndpointId>) {
        let subscribed = self.gossip.instance().subscribe(topic, through).await;
        let (sender, receiver) = match subscribed {
            Ok(topic) => topic.split(),
            Err(e) => {
                tracing::warn!("cannot join the org's gossip: {e}");
                return;
            }
        };
        let org = Arc::downgrade(self);
        let neighbors = Arc::new(AtomicUsize::new(0));
        let receiving = tokio::spawn(receive_notices(org, receiver, neighbors.clone()));
        *self.gossip.joined() = Some(Joined {
            topic,
            sender,
            neighbors,
            _receiving: AbortOnDropHandle::new(receiving),
        });
        // The members it joined through may all be away: it tries others if so.
        self.rejoin_gossip_soon(FIRST_NEIGHBOR_WAIT);
    }

    /// After `wait`, joins the topic through more members if the node has fewer than
    /// [`MIN_NEIGHBORS`] then.
    fn rejoin_gossip_soon(self: &Arc<Self>, wait: Duration) {
        let org = Arc::downgrade(self);
        tokio::spawn(async move {
            tokio::time::sleep(wait).await;
            if let Some(org) = org.upgrade() {
                org.gossip_follow_roster(None).await;
            }
        });
    }

    /// Whether the node has a neighbor on the org's topic (its announcements reach the org).
    pub(in crate::daemon) fn gossip_has_neighbors(&self) -> bool {
        self.gossip
            .joined()
            .as_ref()
            .is_some_and(|j| j.neighbors.load(Ordering::Relaxed) > 0)
    }

    /// Tells the org that this node installed roster `serial` (after [`reannounce_delay`](super::super::swarm::reannounce_delay)),
    /// unless it heard it (or a newer one) announced [`HEARD_ENOUGH`] times by then or holds a
    /// newer one itself.
    pub(in crate::daemon) async fn reannounce_roster(&self, serial: u64) {
        let held = self.core.roster().map_or(0, |v| v.roster().serial);
        if held > serial || self.gossip.heard_of(serial) >= HEARD_ENOUGH {
            return;
        }
        self.announce_roster(serial).await;
    }

    /// Tells the org this node installed roster `serial`.
    pub(in crate::daemon) async fn announce_roster(&self, serial: u64) {
        self.announce(Notice {
            from: self.core.endpoint.id().to_string(),
            roster: Some(serial),
            catalog: None,
        })
        .await;
    }

    /// Tells the org this node's catalog changed.
    pub(in crate::daemon) async fn announce_catalog(&self) {
        let n = self
            .gossip
            .catalog_counter
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.announce(Notice {
            from: self.core.endpoint.id().to_string(),
            roster: None,
            catalog: Some(n + 1),
        })
        .await;
    }

    async fn announce(&self, notice: Notice) {
        let sender = self.gossip.joined().as_ref().map(|j| j.sender.clone());
        let (Some(sender), Ok(bytes)) = (sender, serde_json::to_vec(&notice)) else {
            return;
        };
        if let Err(e) = sender.broadcast(Bytes::from(bytes)).await {
            tracing::debug!("gossip: cannot broadcast: {e}");
        }
    }

    /// One notice `member` delivered: bounded, checked, and at most a fetch.
    fn heard_notice(self: &Arc<Self>, member: EndpointId, content: &[u8]) {
        let refuse = |reason: String| {
            if self.gossip.record_now(member) {
                self.core.audit.record(AuditEvent::GossipRefused {
                    principal: format!("eid:{member}"),
                    reason,
                });
            }
        };
        if let Err(wait) = self.gossip.limiter.check("gossip", &member.to_string()) {
            refuse(format!(
                "more than {NOTICES_PER_MIN} notices a minute; dropped for {} ms",
                wait.as_millis()
            ));
            return;
        }
        let notice = match serde_json::from_slice::<Notice>(content) {
            Ok(notice) => notice,
            Err(e) => {
                refuse(format!("not a notice: {e}"));
                return;
            }
        };
        let Some(view) = self.core.roster() else {
            return;
        };
        // A device the roster no longer lists (removed while its gossip connection lasts)
        // is heard no more.
        if view.seat(&member).is_none() || view.is_revoked(&member) {
            refuse("the delivering device is not a member".into());
            return;
        }
        let from = match crate::roster::parse_eid(&notice.from) {
            Some(id) if view.seat(&id).is_some() && !view.is_revoked(&id) => id,
            _ => {
                refuse("the notice names a sender that is not a member".into());
                return;
            }
        };
        if from == self.core.endpoint.id() {
            return;
        }
        if let Some(serial) = notice.roster {
            self.gossip.heard(serial);
            if serial > view.roster().serial {
                // The member that installed it has it; the one that delivered it may too.
                let mut fetches = self.gossip.fetches();
                fetches.offer(from, serial, true);
                if member != from {
                    fetches.offer(member, serial, false);
                }
                drop(fetches);
                self.fetch_rosters();
            }
        }
        if notice.catalog.is_some() && self.catalog.has_answered(&from) {
            let org = self.clone();
            tokio::spawn(async move { org.catalog.ask_catalogs(vec![from]).await });
        }
    }
}

impl Org {
    /// Starts a roster fetch from the best source announced, if one may start now.
    fn fetch_rosters(self: &Arc<Self>) {
        let held = self.core.roster().map_or(0, |v| v.roster().serial);
        let next = self.gossip.fetches().start(held, Instant::now());
        match next {
            Next::Nothing => {}
            Next::After(wait) => {
                let org = Arc::downgrade(self);
                tokio::spawn(async move {
                    tokio::time::sleep(wait).await;
                    if let Some(org) = org.upgrade() {
                        org.gossip.fetches().waking = false;
                        org.fetch_rosters();
                    }
                });
            }
            Next::Now(source) => {
                let org = self.clone();
                tokio::spawn(async move {
                    let serial = || org.core.roster().map_or(0, |v| v.roster().serial);
                    let before = serial();
                    let exchange = org.sync_with(source);
                    tokio::pin!(exchange);
                    let answered = match tokio::time::timeout(SLOW_FETCH, &mut exchange).await {
                        Ok(answered) => answered,
                        Err(_) => {
                            // Slow: another source may be tried beside it.
                            org.fetch_rosters();
                            exchange.await
                        }
                    };
                    let advanced = answered.is_some() && serial() > before;
                    org.gossip.fetches().ended(source, advanced);
                    org.fetch_rosters();
                });
            }
        }
    }
}

/// The gossip ALPN's handler: open to the members of the roster held only.
#[derive(Debug)]
pub(in crate::daemon) struct GossipProtocol {
    org: Arc<Org>,
}

impl GossipProtocol {
    pub(in crate::daemon) fn new(org: Arc<Org>) -> Self {
        GossipProtocol { org }
    }
}

impl ProtocolHandler for GossipProtocol {
    async fn accept(&self, conn: Connection) -> Result<(), AcceptError> {
        let peer = conn.remote_id();
        if !self.org.holds_seat(&peer) {
            conn.close(VarInt::from_u32(CLOSE_UNKNOWN_PEER), b"unknown peer");
            return Ok(());
        }
        self.org.gossip.instance().accept(conn).await
    }
}
