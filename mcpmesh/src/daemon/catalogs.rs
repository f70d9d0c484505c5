//! What this node's peers last answered when asked for their catalog: kept in memory and in
//! `<state>/catalog.json` (rewritten only when an answer differs from the last one), with the
//! bounds on who may ask this node for its own.

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use iroh::EndpointId;

use crate::catalog::{self, Entry};
use crate::limits::RateLimiter;

/// Answers older than this are refreshed behind a `services` that does not say otherwise.
pub(in crate::daemon) const DEFAULT_MAX_AGE: Duration = Duration::from_secs(30);
/// Catalog requests one peer may make a minute (a hub refreshing every few seconds makes 20).
const REQUESTS_PER_MIN: u32 = 120;
/// Largest `catalog.json` read back.
const MAX_FILE: u64 = 16 * 1024 * 1024;

/// What a peer last answered, and when this node last asked.
#[derive(Debug, Clone, Default)]
pub(super) struct Known {
    pub(super) services: Vec<Entry>,
    /// Unix ms of the last answer; 0 for one read back from disk (to be refreshed).
    pub(super) answered_at: u64,
    /// Why the last attempt failed, when it did (the services are then the last known ones).
    pub(super) failed: Option<String>,
    /// The last attempt got an answer this node refused (over the cap, malformed).
    pub(super) refused: bool,
}

/// The answers of this node's peers.
#[derive(Debug)]
pub(in crate::daemon) struct Catalogs {
    pub(super) file: PathBuf,
    known: Mutex<BTreeMap<EndpointId, Known>>,
    /// Peers being asked now.
    pub(super) asking: Mutex<HashSet<EndpointId>>,
    /// Requests of this node's catalog, per asking peer.
    pub(super) limiter: Arc<RateLimiter>,
    /// When a refusal was last recorded, per asking peer (one record a minute at most).
    recorded: Mutex<std::collections::HashMap<String, u64>>,
}

impl Catalogs {
    pub(in crate::daemon) fn load(state_dir: &std::path::Path) -> Self {
        let file = state_dir.join("catalog.json");
        let known = read(&file).unwrap_or_default();
        Catalogs {
            file,
            known: Mutex::new(known),
            asking: Default::default(),
            limiter: RateLimiter::per_minute_shared(REQUESTS_PER_MIN),
            recorded: Default::default(),
        }
    }

    /// Whether a refusal of `principal`'s request is to be recorded now.
    pub(super) fn record_refusal(&self, principal: &str) -> bool {
        let now = crate::time::unix_ms();
        let mut recorded = self.recorded.lock().unwrap_or_else(|p| p.into_inner());
        if recorded.len() > 4096 {
            recorded.retain(|_, at| now.saturating_sub(*at) < 60_000);
        }
        match recorded.get(principal) {
            Some(at) if now.saturating_sub(*at) < 60_000 => false,
            _ => {
                recorded.insert(principal.to_owned(), now);
                true
            }
        }
    }

    pub(super) fn known(&self) -> std::sync::MutexGuard<'_, BTreeMap<EndpointId, Known>> {
        self.known.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The last known answer of `peer`: its services, and whether the last attempt failed.
    pub(in crate::daemon) fn of(&self, peer: &EndpointId) -> Option<(Vec<Entry>, bool)> {
        self.known()
            .get(peer)
            .map(|k| (k.services.clone(), k.failed.is_some()))
    }

    /// Whether the last answer of `peer` was refused (over the cap, malformed).
    pub(in crate::daemon) fn refused(&self, peer: &EndpointId) -> bool {
        self.known().get(peer).is_some_and(|k| k.refused)
    }

    /// Keeps the outcome of asking `peer`; returns whether the file must be rewritten.
    pub(super) fn keep(
        &self,
        peer: EndpointId,
        outcome: &Result<Vec<Entry>, catalog::CatalogError>,
    ) -> bool {
        let mut known = self.known();
        let entry = known.entry(peer).or_default();
        match outcome {
            Ok(services) => {
                let changed = entry.services != *services || entry.answered_at == 0;
                entry.services = services.clone();
                entry.answered_at = crate::time::unix_ms();
                entry.failed = None;
                entry.refused = false;
                changed
            }
            Err(why) => {
                entry.failed = Some(why.to_string());
                entry.refused = matches!(why, catalog::CatalogError::Invalid(_));
                false
            }
        }
    }

    /// Forgets the peers no longer trusted.
    pub(super) fn retain(&self, peers: &HashSet<EndpointId>) -> bool {
        let mut known = self.known();
        let before = known.len();
        known.retain(|id, _| peers.contains(id));
        known.len() != before
    }

    pub(super) fn snapshot(&self) -> BTreeMap<String, Vec<Entry>> {
        self.known()
            .iter()
            .map(|(id, k)| (id.to_string(), k.services.clone()))
            .collect()
    }
}

fn read(file: &std::path::Path) -> Option<BTreeMap<EndpointId, Known>> {
    let meta = std::fs::metadata(file).ok()?;
    if meta.len() > MAX_FILE {
        return None;
    }
    let bytes = std::fs::read(file).ok()?;
    let on_disk: BTreeMap<String, Vec<Entry>> = match serde_json::from_slice(&bytes) {
        Ok(v) => v,
        Err(e) => {
            tracing::warn!("ignoring an unreadable {}: {e}", file.display());
            return None;
        }
    };
    Some(
        on_disk
            .into_iter()
            .filter_map(|(id, services)| {
                Some((
                    id.parse().ok()?,
                    Known {
                        services,
                        answered_at: 0,
                        ..Known::default()
                    },
                ))
            })
            .collect(),
    )
}
