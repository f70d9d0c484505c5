//! What the node knows of its peers' reachability: the outcome of the last gated ping (or
//! dial) to each, and when. A background task keeps it fresh — peers that answered are checked
//! now and then, peers that did not are retried every few seconds — so read-only verbs answer
//! from it at once, and a dial to a peer that just failed fails at once too.
//!
//! The schedule is for peers added by hand or by pairing and for org members dialed in the last
//! ten minutes. A peer with a connection open is not checked on it: the connection's keep-alives
//! are the witness, and a silent one is gone within seconds. An org member not used lately is
//! checked only when a read asks (at most every 30 s), so a node's background work does not grow
//! with the size of its org: each check is a QUIC handshake, and a hundred members each
//! checking every other would spend the machine on it.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use iroh::{Endpoint, EndpointId};
use mcpmesh_net::path::Route;
use mcpmesh_net::ping::{PingOutcome, ping_outcome};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// How long one ping may take.
const PING_TIMEOUT: Duration = Duration::from_millis(1500);
/// How long the ping that would confirm a miss may take: a first miss may only mean this
/// machine was busy (fifty nodes starting on two cores miss many 1.5 s pings), so the second
/// look is a patient one.
const CONFIRM_TIMEOUT: Duration = Duration::from_secs(5);
/// How many checks in a row must go unanswered before dials to the peer fail at once.
const MISSES_TO_FAIL_FAST: u32 = 2;
/// How many pings one node has in flight at once: each is a QUIC handshake, and a node with
/// many peers must not starve its own sessions (nor time its own pings out) checking them.
const MAX_PINGS: usize = 8;
/// How often a peer that answered is checked again.
const RECHECK_UP: Duration = Duration::from_secs(30);
/// A read asks for peers checked longer ago than this to be checked again (in the background).
const ON_DEMAND: Duration = Duration::from_secs(2);
/// How often a peer that did not answer is tried again, so one that comes back shows promptly.
const RECHECK_DOWN: Duration = Duration::from_secs(3);
/// A dial to a peer whose last check failed more recently than this fails at once; an older
/// failure lets the dial through.
pub(super) const FAIL_FAST: Duration = Duration::from_secs(5);
/// How long a read waits for the first check of a peer it has never checked.
const FIRST_CHECK_WAIT: Duration = Duration::from_millis(500);
/// How often the checker looks for peers that are due.
const TICK: Duration = Duration::from_secs(1);
/// A peer dialed within this long is watched as one in use.
const IN_USE: Duration = Duration::from_secs(600);
/// A read asks for a peer not watched to be checked again when its last check is this old.
const ON_DEMAND_UNWATCHED: Duration = Duration::from_secs(30);

/// How closely the checker follows a peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Watch {
    /// On the schedule: a peer added by hand or by pairing, with no connection open.
    Always,
    /// A connection to it is open: its keep-alives are the witness (a silent one is gone in
    /// seconds), so it is checked only when asked about.
    Connected,
    /// An org member with no connection open: on the schedule while dialed lately, otherwise
    /// only when asked about.
    WhenUsed,
}

/// The last thing known about one peer's reachability.
#[derive(Debug, Clone)]
pub(super) struct Seen {
    pub(super) reachable: bool,
    /// It answered, if only to refuse this node (a pairing not yet complete on its side).
    answered: bool,
    /// The round trip of the last ping that answered.
    pub(super) rtt: Option<Duration>,
    /// The path that ping's answer came on.
    pub(super) route: Option<Route>,
    /// Checks in a row that got no answer (a failed dial counts as enough of them).
    misses: u32,
    /// Unix ms of the check.
    pub(super) checked_at_ms: u64,
    at: Instant,
}

impl Seen {
    pub(super) fn age(&self) -> Duration {
        self.at.elapsed()
    }

    /// Not reachable, and it did not even answer to refuse this node.
    pub(super) fn silent(&self) -> bool {
        !self.reachable && !self.answered
    }

    /// Reachable by a dial, but no ping has measured the round trip yet.
    fn unmeasured(&self) -> bool {
        self.reachable && self.rtt.is_none()
    }
}

#[derive(Debug)]
pub(super) struct Reachability {
    seen: Mutex<HashMap<EndpointId, Seen>>,
    /// Counts finished check rounds; readers wait on it for a first check.
    rounds: watch::Sender<u64>,
    wake: tokio::sync::Notify,
    /// A read asked for fresher results than the schedule gives.
    asked: std::sync::atomic::AtomicBool,
    /// When each peer was last dialed.
    dialed: Mutex<HashMap<EndpointId, Instant>>,
}

impl Default for Reachability {
    fn default() -> Self {
        Reachability {
            seen: Mutex::default(),
            rounds: watch::Sender::new(0),
            wake: tokio::sync::Notify::new(),
            asked: Default::default(),
            dialed: Default::default(),
        }
    }
}

impl Reachability {
    pub(super) fn get(&self, peer: &EndpointId) -> Option<Seen> {
        self.lock().get(peer).cloned()
    }

    /// Records what a dial found. A dial that worked keeps the last ping's RTT and route; one
    /// that failed had the whole dial timeout, so dials fail at once for a while.
    pub(super) fn record(&self, peer: EndpointId, reachable: bool) {
        self.dialed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(peer, Instant::now());
        self.record_answer(peer, reachable, reachable, None);
        if !reachable && let Some(seen) = self.lock().get_mut(&peer) {
            seen.misses = seen.misses.max(MISSES_TO_FAIL_FAST);
        }
    }

    /// Records what a ping found: `measured` is its round trip and route when it answered.
    fn record_answer(
        &self,
        peer: EndpointId,
        reachable: bool,
        answered: bool,
        measured: Option<(Duration, Option<Route>)>,
    ) {
        let mut seen = self.lock();
        let (rtt, route) = match (reachable, measured) {
            (true, None) => seen
                .get(&peer)
                .map(|s| (s.rtt, s.route.clone()))
                .unwrap_or_default(),
            (true, Some((rtt, route))) => (Some(rtt), route),
            (false, _) => (None, None),
        };
        let misses = match seen.get(&peer) {
            _ if answered => 0,
            Some(s) => s.misses.saturating_add(1),
            None => 1,
        };
        seen.insert(
            peer,
            Seen {
                reachable,
                answered,
                rtt,
                route,
                misses,
                checked_at_ms: crate::time::unix_ms(),
                at: Instant::now(),
            },
        );
    }

    /// When the last [`MISSES_TO_FAIL_FAST`] checks of `peer` (or a dial) got no answer, the
    /// last less than [`FAIL_FAST`] ago, how long ago.
    pub(super) fn recently_down(&self, peer: &EndpointId) -> Option<Duration> {
        self.get(peer)
            .filter(|s| !s.answered && s.misses >= MISSES_TO_FAIL_FAST)
            .map(|s| s.age())
            .filter(|age| *age < FAIL_FAST)
    }

    /// Forgets what was found of `peer` and has it checked now: something changed on its side
    /// that the last check may have missed (it just committed a pairing with this node). The
    /// next read waits for that check as for any first one.
    pub(super) fn recheck(&self, peer: &EndpointId) {
        self.lock().remove(peer);
        self.poke();
    }

    /// Asks the checker to look now (a peer was added, a dial failed).
    pub(super) fn poke(&self) {
        self.wake.notify_one();
    }

    /// Asks for peers not checked within the last moments to be checked again, without
    /// waiting for it: the next read shows what was found.
    pub(super) fn refresh(&self) {
        self.asked.store(true, std::sync::atomic::Ordering::Relaxed);
        self.poke();
    }

    /// Waits (briefly) until every one of `peers` has been checked at least once (and the
    /// round trip of those a dial found reachable has been measured).
    pub(super) async fn first_checks(&self, peers: &[EndpointId]) {
        let unknown = || {
            peers
                .iter()
                .any(|p| self.get(p).is_none_or(|s| s.unmeasured()))
        };
        if !unknown() {
            return;
        }
        // A read: peers not watched are checked for it too.
        self.refresh();
        let mut rounds = self.rounds.subscribe();
        let _ = tokio::time::timeout(FIRST_CHECK_WAIT, async {
            while unknown() {
                if rounds.changed().await.is_err() {
                    return;
                }
            }
        })
        .await;
    }

    fn due(&self, peer: &EndpointId, asked: bool, watch: Watch) -> bool {
        let in_use = || {
            self.dialed
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(peer)
                .is_some_and(|at| at.elapsed() < IN_USE)
        };
        let (scheduled, on_demand) = match watch {
            Watch::Always => (true, ON_DEMAND),
            Watch::Connected => (false, ON_DEMAND),
            Watch::WhenUsed if in_use() => (true, ON_DEMAND),
            Watch::WhenUsed => (false, ON_DEMAND_UNWATCHED),
        };
        let connected = watch == Watch::Connected;
        match self.get(peer) {
            // A connected peer never checked, or last found down, is checked (on the schedule
            // of a peer that is down): its connection says it is there.
            None => scheduled || asked || connected,
            Some(s) if s.unmeasured() => scheduled || asked,
            Some(s) if asked => s.age() >= on_demand,
            Some(s) if connected => !s.reachable && s.age() >= RECHECK_DOWN,
            Some(_) if !scheduled => false,
            Some(s) if s.reachable => s.age() >= RECHECK_UP,
            Some(s) => s.age() >= RECHECK_DOWN,
        }
    }

    /// Checks the peers `peers()` names, each watched as it says, whenever they are due,
    /// until `stop`.
    pub(super) async fn keep_checking(
        &self,
        endpoint: Endpoint,
        peers: impl Fn() -> Vec<(EndpointId, Watch)>,
        stop: CancellationToken,
    ) {
        loop {
            let all = peers();
            let asked = self.asked.swap(false, std::sync::atomic::Ordering::Relaxed);
            self.lock()
                .retain(|id, _| all.iter().any(|(peer, _)| peer == id));
            self.dialed
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .retain(|_, at| at.elapsed() < IN_USE);
            let mut pings = tokio::task::JoinSet::new();
            let slots = std::sync::Arc::new(tokio::sync::Semaphore::new(MAX_PINGS));
            let due = all
                .into_iter()
                .filter(|(id, watch)| self.due(id, asked, *watch))
                .map(|(id, _)| id);
            for id in due {
                let endpoint = endpoint.clone();
                let limit = match self.get(&id) {
                    Some(s) if s.misses > 0 => CONFIRM_TIMEOUT,
                    _ => PING_TIMEOUT,
                };
                let slots = slots.clone();
                pings.spawn(async move {
                    let _slot = slots.acquire_owned().await;
                    (id, ping_outcome(&endpoint, id, limit).await)
                });
            }
            let checked = !pings.is_empty();
            while let Some(done) = pings.join_next().await {
                if let Ok((id, outcome)) = done {
                    match outcome {
                        PingOutcome::Reachable { rtt, route } => {
                            self.record_answer(id, true, true, Some((rtt, route)))
                        }
                        PingOutcome::Refused => self.record_answer(id, false, true, None),
                        PingOutcome::Unreachable => self.record(id, false),
                    }
                }
            }
            if checked {
                self.rounds.send_modify(|n| *n += 1);
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(TICK) => {}
                _ = self.wake.notified() => {}
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<EndpointId, Seen>> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer() -> EndpointId {
        iroh::SecretKey::from_bytes(&[7; 32]).public()
    }

    #[test]
    fn one_missed_ping_does_not_make_dials_fail_at_once_two_in_a_row_do() {
        let reach = Reachability::default();
        let id = peer();
        reach.record_answer(id, false, false, None);
        assert_eq!(
            reach.recently_down(&id),
            None,
            "one miss may be this machine's load"
        );
        reach.record_answer(id, false, false, None);
        assert!(reach.recently_down(&id).is_some(), "two misses in a row");
    }

    #[test]
    fn an_org_member_not_in_use_is_checked_only_when_asked_and_then_seldom() {
        let reach = Reachability::default();
        let id = peer();
        assert!(reach.due(&id, false, Watch::Always), "a first check");
        assert!(!reach.due(&id, false, Watch::WhenUsed), "not until asked");
        assert!(reach.due(&id, true, Watch::WhenUsed), "a read asks");
        reach.record_answer(id, true, true, Some((Duration::from_millis(1), None)));
        let aged = |by: Duration| {
            if let Some(s) = reach.lock().get_mut(&id) {
                s.at = Instant::now() - by;
            }
        };
        aged(Duration::from_secs(10));
        assert!(reach.due(&id, true, Watch::Always), "a read asks");
        assert!(
            !reach.due(&id, true, Watch::WhenUsed),
            "a read asks again only after {ON_DEMAND_UNWATCHED:?}"
        );
        aged(RECHECK_UP.max(ON_DEMAND_UNWATCHED));
        assert!(reach.due(&id, false, Watch::Always));
        assert!(!reach.due(&id, false, Watch::WhenUsed), "no schedule");
        assert!(reach.due(&id, true, Watch::WhenUsed));
        // Dialed: watched like any other for a while; with a connection open, its keep-alives
        // stand in for the checks.
        reach.record(id, true);
        if let Some(s) = reach.lock().get_mut(&id) {
            s.at = Instant::now() - RECHECK_UP;
        }
        assert!(reach.due(&id, false, Watch::WhenUsed));
        assert!(!reach.due(&id, false, Watch::Connected));
        assert!(reach.due(&id, true, Watch::Connected), "unless asked");
        // Last found down, but a connection is open: checked again.
        reach.record_answer(id, false, false, None);
        if let Some(s) = reach.lock().get_mut(&id) {
            s.at = Instant::now() - RECHECK_DOWN;
        }
        assert!(reach.due(&id, false, Watch::Connected));
    }

    #[test]
    fn an_answer_between_misses_starts_the_count_again() {
        let reach = Reachability::default();
        let id = peer();
        reach.record_answer(id, false, false, None);
        reach.record_answer(id, true, true, Some((Duration::from_millis(1), None)));
        reach.record_answer(id, false, false, None);
        assert_eq!(reach.recently_down(&id), None);
        // A refusal is an answer too: the peer is there.
        reach.record_answer(id, false, false, None);
        reach.record_answer(id, false, true, None);
        reach.record_answer(id, false, false, None);
        assert_eq!(reach.recently_down(&id), None);
    }

    #[test]
    fn a_failed_dial_makes_the_next_dials_fail_at_once() {
        let reach = Reachability::default();
        let id = peer();
        reach.record(id, false);
        assert!(reach.recently_down(&id).is_some());
        reach.record(id, true);
        assert_eq!(reach.recently_down(&id), None);
    }
}
