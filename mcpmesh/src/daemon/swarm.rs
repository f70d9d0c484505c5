//! What an org broadcasts, over iroh's gossip on a topic derived from the org root: "I hold
//! roster serial N" and "my catalog changed". Members that install a roster announce its
//! serial too, so a roster spreads even with the admin's node gone; a node that hears of a newer
//! serial fetches the roster over the direct exchange and checks it as from anywhere. A notice
//! is never a trust input: it only says whom to ask.
//!
//! What it costs grows with the org, so each part is kept to what a large org can bear. A node
//! joins the topic through a few members (the one it got the roster from among them), and
//! through more only when it has fewer than two neighbors, never through every member at every
//! roster. The admin's node announces what it signs at once; every other member re-announces
//! what it installed after a random delay unless it heard it announced twice meanwhile (the
//! suppression of Trickle, RFC 6206), so a roster costs a few notices, not one per member. A
//! node runs one roster fetch at a time on notices (a second only when the first is slow: its
//! source may be gone), keeps further announcers as the next sources to try, and while none
//! runs starts one at most once a second, so that a burst of rosters (an org forming) is
//! fetched as its newest.
//!
//! Only roster members take part: the gossip ALPN is gated (a key that is not a member of the
//! roster held is closed before a byte is read). Each notice is one small JSON object, capped
//! in size; notices a member delivers past its rate are dropped, and a notice that does not
//! parse, or names a sender that is not a member, is refused; both are audited at most once a
//! minute per delivering member.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use iroh::EndpointId;
use iroh_gossip::api::GossipSender;
use iroh_gossip::{Gossip, TopicId};
use serde::{Deserialize, Serialize};
use tokio_util::task::AbortOnDropHandle;

use crate::limits::RateLimiter;

/// The ALPN of the org's gossip.
pub(super) const ALPN_GOSSIP: &[u8] = b"mcpmesh/gossip/1";
/// Largest notice accepted (they are well under 200 bytes).
pub(super) const MAX_NOTICE: usize = 1024;
/// Notices one member may deliver a minute (each roster install and catalog change of every
/// member passes through some neighbor).
pub(super) const NOTICES_PER_MIN: u32 = 600;
/// How often a refused or throttled run of one member's notices is recorded, at most.
pub(super) const RECORD_EVERY_MS: u64 = 60_000;
/// Members a node joins the topic through at once (the swarm keeps a few neighbors each and
/// finds the rest).
pub(super) const JOIN_THROUGH: usize = 4;
/// With fewer neighbors than this, a node joins through more members at its next roster.
pub(super) const MIN_NEIGHBORS: usize = 2;
/// How long after joining the topic a node checks it found a neighbor...
pub(super) const FIRST_NEIGHBOR_WAIT: Duration = Duration::from_secs(5);
/// ...and how long after losing its last one it joins through other members.
pub(super) const REJOIN_AFTER: Duration = Duration::from_secs(1);
/// A member re-announces a roster it installed after a random delay up to this long...
pub(super) const REANNOUNCE_WITHIN_MS: u64 = 300;
/// ...unless it heard that serial (or a newer one) announced this many times by then.
pub(super) const HEARD_ENOUGH: u32 = 2;
/// Roster fetches one node runs at once on notices: a second starts only when the first has
/// taken this long (its source may be gone).
pub(super) const SLOW_FETCH: Duration = Duration::from_millis(500);
pub(super) const MAX_FETCHES: usize = 2;
/// While none runs, a fetch starts at most this often: notices that come in a burst (an org
/// forming, one join after another) are gathered and only the newest serial is fetched.
pub(super) const FETCH_GAP: Duration = Duration::from_secs(1);
/// Announcers kept as the next sources to fetch from.
pub(super) const MAX_SOURCES: usize = 8;

/// One notice, as broadcast.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Notice {
    /// The member that made it (hex endpoint id); a claim, used only to know whom to ask.
    pub(super) from: String,
    /// The roster serial it installed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) roster: Option<u64>,
    /// Its catalog changed (a counter of its own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) catalog: Option<u64>,
}

/// The topic of the org whose root is `root` (hex).
pub(super) fn topic(root: &str) -> TopicId {
    let mut hasher = blake3::Hasher::new();
    hasher.update(b"mcpmesh org topic 1\0");
    hasher.update(root.to_ascii_lowercase().as_bytes());
    TopicId::from_bytes(*hasher.finalize().as_bytes())
}

/// The org's gossip on this node: the instance (started when first needed: a node in no org
/// never runs one), the topic joined (if in an org), and the bounds on what members deliver.
#[derive(Debug)]
pub(super) struct OrgGossip {
    pub(super) endpoint: iroh::Endpoint,
    pub(super) gossip: std::sync::OnceLock<Gossip>,
    pub(super) joined: Mutex<Option<Joined>>,
    pub(super) limiter: Arc<RateLimiter>,
    /// When a refusal was last recorded, per delivering member.
    pub(super) recorded: Mutex<HashMap<EndpointId, u64>>,
    /// This node's own catalog counter.
    pub(super) catalog_counter: AtomicU64,
    /// Roster announcements heard, by serial (the highest few).
    pub(super) heard: Mutex<BTreeMap<u64, u32>>,
    pub(super) fetches: Mutex<Fetches>,
    /// The direct pushes of the roster, gossip's fallback: one round at a time.
    pub(super) pushes: Pushes,
}

/// Whether a round of direct roster pushes runs, and whether another is wanted after it.
#[derive(Debug, Default)]
pub(super) struct Pushes {
    pub(super) running: std::sync::atomic::AtomicBool,
    pub(super) another_wanted: std::sync::atomic::AtomicBool,
}

#[derive(Debug)]
pub(super) struct Joined {
    pub(super) topic: TopicId,
    pub(super) sender: GossipSender,
    /// The swarm neighbors this node has on the topic now.
    pub(super) neighbors: Arc<AtomicUsize>,
    pub(super) _receiving: AbortOnDropHandle<()>,
}

/// The roster fetches notices started, and the members to fetch from next.
#[derive(Debug, Default)]
pub(super) struct Fetches {
    pub(super) running: HashMap<EndpointId, Instant>,
    /// Oldest first.
    pub(super) sources: Vec<Source>,
    /// When the last fetch started.
    pub(super) last: Option<Instant>,
    /// A wake-up is set for the end of the gap.
    pub(super) waking: bool,
}

/// A member that may hold a newer roster.
#[derive(Debug)]
pub(super) struct Source {
    pub(super) id: EndpointId,
    /// The newest serial it was heard of with.
    pub(super) serial: u64,
    /// It announced that serial itself (it installed it), rather than only passing on another
    /// member's notice (it may not have fetched it yet).
    pub(super) announced: bool,
}

/// What to do about the sources kept.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Next {
    /// Fetch from this one now.
    Now(EndpointId),
    /// Look again after this long (the gap since the last fetch is not over).
    After(Duration),
    /// Nothing now: no source, or a fetch runs and will look again when it ends or is slow.
    Nothing,
}

impl Fetches {
    /// Keeps `id` as a source of `serial` (its newest), even while a fetch from it runs: that
    /// fetch may end with an older serial. `announced`: it installed that serial itself.
    pub(super) fn offer(&mut self, id: EndpointId, serial: u64, announced: bool) {
        match self.sources.iter_mut().find(|s| s.id == id) {
            Some(known) if serial > known.serial => {
                known.serial = serial;
                known.announced = announced;
            }
            Some(known) => known.announced |= announced && serial == known.serial,
            None => {
                if self.sources.len() == MAX_SOURCES {
                    self.sources.remove(0);
                }
                self.sources.push(Source {
                    id,
                    serial,
                    announced,
                });
            }
        }
    }

    /// The fetch from `id` ended. One that brought nothing newer (its source was gone, or did
    /// not hold the roster yet) does not hold the next one back.
    pub(super) fn ended(&mut self, id: EndpointId, advanced: bool) {
        self.running.remove(&id);
        if !advanced && self.running.is_empty() {
            self.last = None;
        }
    }

    /// Whether a fetch may start at `now`, and from which source: when none runs and the last
    /// started [`FETCH_GAP`] ago (else after the rest of the gap, one wake-up at a time), or
    /// beside running ones that are all slow, up to [`MAX_FETCHES`]. The newest serial first,
    /// from one of the members that announced it, picked at random (the members that heard
    /// the same few announcements do not all fetch from the same one at once), else from one
    /// that passed the notice on.
    pub(super) fn start(&mut self, held: u64, now: Instant) -> Next {
        self.sources.retain(|s| s.serial > held);
        if self.sources.is_empty() || self.running.len() >= MAX_FETCHES {
            return Next::Nothing;
        }
        if !self.running.is_empty() {
            let all_slow = self
                .running
                .values()
                .all(|at| now.duration_since(*at) >= SLOW_FETCH);
            if !all_slow {
                return Next::Nothing;
            }
        } else if let Some(since) = self.last.map(|last| now.duration_since(last))
            && since < FETCH_GAP
        {
            if self.waking {
                return Next::Nothing;
            }
            self.waking = true;
            return Next::After(FETCH_GAP - since);
        }
        let idle: Vec<usize> = (0..self.sources.len())
            .filter(|&i| !self.running.contains_key(&self.sources[i].id))
            .collect();
        let Some(newest) = idle.iter().map(|&i| self.sources[i].serial).max() else {
            return Next::Nothing;
        };
        let of_newest = |announced: bool| -> Vec<usize> {
            idle.iter()
                .copied()
                .filter(|&i| {
                    let s = &self.sources[i];
                    s.serial == newest && s.announced == announced
                })
                .collect()
        };
        let mut candidates = of_newest(true);
        if candidates.is_empty() {
            candidates = of_newest(false);
        }
        let Some(&at) = candidates.get((random() % candidates.len().max(1) as u64) as usize) else {
            return Next::Nothing;
        };
        let id = self.sources.remove(at).id;
        self.running.insert(id, now);
        self.last = Some(now);
        Next::Now(id)
    }
}

/// How long a member waits before it re-announces a roster it installed: random, so that the
/// first few to speak silence the rest.
pub(super) fn reannounce_delay() -> Duration {
    Duration::from_millis(random() % REANNOUNCE_WITHIN_MS)
}

/// A random number, for delays and samples (zero if the system has none to give).
pub(super) fn random() -> u64 {
    let mut bytes = [0u8; 8];
    let _ = getrandom::fill(&mut bytes);
    u64::from_le_bytes(bytes)
}

/// Up to `n` of `ids`, `first` (when given and listed) among them, the rest picked at random.
pub(super) fn pick(
    mut ids: Vec<EndpointId>,
    first: Option<EndpointId>,
    n: usize,
) -> Vec<EndpointId> {
    let mut picked = Vec::with_capacity(n.min(ids.len()));
    if let Some(at) = first.and_then(|f| ids.iter().position(|id| *id == f)) {
        picked.push(ids.swap_remove(at));
    }
    while picked.len() < n && !ids.is_empty() {
        let at = (random() % ids.len() as u64) as usize;
        picked.push(ids.swap_remove(at));
    }
    picked
}

impl OrgGossip {
    pub(super) fn new(endpoint: iroh::Endpoint) -> Self {
        OrgGossip {
            endpoint,
            gossip: std::sync::OnceLock::new(),
            joined: Mutex::new(None),
            limiter: RateLimiter::per_minute_shared(NOTICES_PER_MIN),
            recorded: Default::default(),
            catalog_counter: AtomicU64::new(crate::time::unix_ms()),
            heard: Default::default(),
            fetches: Default::default(),
            pushes: Default::default(),
        }
    }

    /// The gossip instance, started on first use (from within the runtime).
    pub(super) fn instance(&self) -> &Gossip {
        self.gossip.get_or_init(|| {
            Gossip::builder()
                .alpn(ALPN_GOSSIP)
                .max_message_size(MAX_NOTICE)
                .spawn(self.endpoint.clone())
        })
    }

    pub(super) fn fetches(&self) -> std::sync::MutexGuard<'_, Fetches> {
        self.fetches.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts an announcement of roster `serial`.
    pub(super) fn heard(&self, serial: u64) {
        let mut heard = self.heard.lock().unwrap_or_else(|p| p.into_inner());
        *heard.entry(serial).or_default() += 1;
        while heard.len() > 16 {
            heard.pop_first();
        }
    }

    /// Announcements heard of `serial` or a newer one.
    pub(super) fn heard_of(&self, serial: u64) -> u32 {
        let heard = self.heard.lock().unwrap_or_else(|p| p.into_inner());
        heard.range(serial..).map(|(_, n)| n).sum()
    }

    pub(super) fn joined(&self) -> std::sync::MutexGuard<'_, Option<Joined>> {
        self.joined.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether a refusal of what `member` delivered is to be recorded now.
    pub(super) fn record_now(&self, member: EndpointId) -> bool {
        let now = crate::time::unix_ms();
        let mut recorded = self.recorded.lock().unwrap_or_else(|p| p.into_inner());
        if recorded.len() > 4096 {
            recorded.retain(|_, at| now.saturating_sub(*at) < RECORD_EVERY_MS);
        }
        match recorded.get(&member) {
            Some(at) if now.saturating_sub(*at) < RECORD_EVERY_MS => false,
            _ => {
                recorded.insert(member, now);
                true
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_notice_is_small_and_strict() {
        let n = Notice {
            from: "ab".repeat(32),
            roster: Some(7),
            catalog: None,
        };
        let bytes = serde_json::to_vec(&n).unwrap();
        assert!(bytes.len() < 200);
        assert_eq!(serde_json::from_slice::<Notice>(&bytes).unwrap(), n);
        assert!(
            serde_json::from_slice::<Notice>(br#"{"from":"x","roster":1,"grant":"all"}"#).is_err()
        );
    }

    fn id(n: u8) -> EndpointId {
        iroh::SecretKey::from_bytes(&[n; 32]).public()
    }

    #[test]
    fn one_fetch_at_a_time_the_newest_announcement_first_and_a_second_only_beside_a_slow_one() {
        let mut f = Fetches::default();
        let now = Instant::now();
        f.offer(id(1), 5, true);
        f.offer(id(2), 6, true);
        f.offer(id(3), 6, true);
        let first = f.start(4, now);
        assert!(
            first == Next::Now(id(2)) || first == Next::Now(id(3)),
            "the newest serial: {first:?}"
        );
        assert_eq!(f.start(4, now), Next::Nothing, "one runs, not slow yet");
        let later = now + SLOW_FETCH;
        let other = if first == Next::Now(id(2)) {
            id(3)
        } else {
            id(2)
        };
        assert_eq!(f.start(4, later), Next::Now(other), "beside a slow one");
        assert_eq!(f.start(4, later + SLOW_FETCH), Next::Nothing, "at most two");
        f.running.clear();
        assert_eq!(
            f.start(6, later),
            Next::Nothing,
            "what is held already is not fetched"
        );
        assert!(f.sources.is_empty());
        // The kept ones are bounded.
        for n in 10..30 {
            f.offer(id(n), 7, true);
        }
        assert_eq!(f.sources.len(), MAX_SOURCES);
    }

    #[test]
    fn the_announcers_of_the_newest_serial_share_the_fetches() {
        let mut picked = std::collections::HashSet::new();
        for _ in 0..64 {
            let mut f = Fetches::default();
            for n in 1..=3 {
                f.offer(id(n), 9, true);
            }
            f.offer(id(4), 8, true);
            match f.start(7, Instant::now()) {
                Next::Now(source) => picked.insert(source),
                other => panic!("a fetch starts: {other:?}"),
            };
        }
        // 64 fair picks of three miss one of them with a chance under 2 in 10^11.
        let newest: std::collections::HashSet<_> = (1..=3).map(id).collect();
        assert_eq!(picked, newest, "each announcer of serial 9, and only those");
    }

    #[test]
    fn a_member_that_announced_the_serial_is_asked_before_one_that_only_passed_it_on() {
        let mut f = Fetches::default();
        let now = Instant::now();
        // Member 2 delivered member 1's notice: it may not have fetched the roster yet.
        f.offer(id(2), 9, false);
        f.offer(id(1), 9, true);
        assert_eq!(f.start(8, now), Next::Now(id(1)));
        // The one that passed it on is the fallback, beside a slow fetch...
        assert_eq!(f.start(8, now + SLOW_FETCH), Next::Now(id(2)));
        // ...and it counts as an announcer once it announces the serial itself.
        let mut f = Fetches::default();
        f.offer(id(2), 9, false);
        f.offer(id(3), 9, false);
        f.offer(id(2), 9, true);
        assert_eq!(f.start(8, now), Next::Now(id(2)));
    }

    #[test]
    fn a_newer_serial_announced_by_the_source_being_fetched_is_fetched_after_it() {
        let mut f = Fetches::default();
        let now = Instant::now();
        f.offer(id(1), 49, true);
        assert_eq!(f.start(48, now), Next::Now(id(1)));
        // Serial 50 is announced while 49 is being fetched from the same member.
        f.offer(id(1), 50, true);
        assert_eq!(f.start(48, now), Next::Nothing, "not twice at once");
        f.running.clear();
        let after = now + FETCH_GAP;
        assert_eq!(f.start(49, after), Next::Now(id(1)), "50 is still wanted");
    }

    #[test]
    fn notices_in_a_burst_are_gathered_and_only_the_newest_is_fetched_after_the_gap() {
        let mut f = Fetches::default();
        let now = Instant::now();
        f.offer(id(1), 2, true);
        assert_eq!(f.start(1, now), Next::Now(id(1)), "the first at once");
        f.running.clear();
        let soon = now + Duration::from_millis(300);
        f.offer(id(1), 3, true);
        assert_eq!(
            f.start(2, soon),
            Next::After(FETCH_GAP - Duration::from_millis(300))
        );
        f.offer(id(2), 4, true);
        assert_eq!(f.start(2, soon), Next::Nothing, "one wake-up is set");
        f.waking = false;
        assert_eq!(f.start(2, now + FETCH_GAP), Next::Now(id(2)), "the newest");
        // A fetch whose source did not answer holds nothing back.
        f.offer(id(3), 5, true);
        f.ended(id(2), false);
        assert_eq!(f.start(2, now + FETCH_GAP), Next::Now(id(3)));
    }

    #[test]
    fn a_pick_is_bounded_distinct_and_starts_with_the_device_named() {
        let ids: Vec<EndpointId> = (1..20).map(id).collect();
        let picked = pick(ids.clone(), Some(id(7)), JOIN_THROUGH);
        assert_eq!(picked.len(), JOIN_THROUGH);
        assert_eq!(picked[0], id(7));
        let distinct: std::collections::HashSet<_> = picked.iter().collect();
        assert_eq!(distinct.len(), JOIN_THROUGH);
        assert_eq!(pick(ids[..2].to_vec(), None, JOIN_THROUGH).len(), 2);
        assert_eq!(pick(ids[..3].to_vec(), Some(id(99)), 1).len(), 1);
    }

    #[test]
    fn each_org_has_its_own_topic() {
        let a = topic(&"aa".repeat(32));
        assert_eq!(a, topic(&"AA".repeat(32)));
        assert_ne!(a, topic(&"bb".repeat(32)));
    }
}
