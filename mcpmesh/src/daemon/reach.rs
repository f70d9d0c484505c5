//! What the node knows of its peers' reachability: the outcome of the last gated ping (or
//! dial) to each, and when. A background task keeps it fresh — peers that answered are checked
//! now and then, peers that did not are retried every few seconds — so read-only verbs answer
//! from it at once, and a dial to a peer that just failed fails at once too.

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
    /// Unix ms of the check.
    pub(super) checked_at_ms: u64,
    at: Instant,
}

impl Seen {
    pub(super) fn age(&self) -> Duration {
        self.at.elapsed()
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
}

impl Default for Reachability {
    fn default() -> Self {
        Reachability {
            seen: Mutex::default(),
            rounds: watch::Sender::new(0),
            wake: tokio::sync::Notify::new(),
            asked: Default::default(),
        }
    }
}

impl Reachability {
    pub(super) fn get(&self, peer: &EndpointId) -> Option<Seen> {
        self.lock().get(peer).cloned()
    }

    /// Records what a dial found. A dial that worked keeps the last ping's RTT and route.
    pub(super) fn record(&self, peer: EndpointId, reachable: bool) {
        self.record_answer(peer, reachable, reachable, None);
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
        seen.insert(
            peer,
            Seen {
                reachable,
                answered,
                rtt,
                route,
                checked_at_ms: crate::time::unix_ms(),
                at: Instant::now(),
            },
        );
    }

    /// When the last check of `peer` got no answer less than [`FAIL_FAST`] ago, how long ago.
    pub(super) fn recently_down(&self, peer: &EndpointId) -> Option<Duration> {
        self.get(peer)
            .filter(|s| !s.answered)
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
        self.poke();
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

    fn due(&self, peer: &EndpointId, asked: bool) -> bool {
        match self.get(peer) {
            None => true,
            Some(s) if s.unmeasured() => true,
            Some(s) if asked => s.age() >= ON_DEMAND,
            Some(s) if s.reachable => s.age() >= RECHECK_UP,
            Some(s) => s.age() >= RECHECK_DOWN,
        }
    }

    /// Checks the peers `peers()` names whenever they are due, until `stop`.
    pub(super) async fn keep_checking(
        &self,
        endpoint: Endpoint,
        peers: impl Fn() -> Vec<EndpointId>,
        stop: CancellationToken,
    ) {
        loop {
            let all = peers();
            let asked = self.asked.swap(false, std::sync::atomic::Ordering::Relaxed);
            self.lock().retain(|id, _| all.contains(id));
            let mut pings = tokio::task::JoinSet::new();
            for id in all.into_iter().filter(|id| self.due(id, asked)) {
                let endpoint = endpoint.clone();
                pings.spawn(async move { (id, ping_outcome(&endpoint, id, PING_TIMEOUT).await) });
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
