//! The hub's sessions, one per service at most: opened on first use, shared by every use
//! after it, closed when unused for the idle time, and opened again after one ended.
//!
//! Each service has a slot whose lock is held while its session opens, so concurrent first
//! uses wait for the one opening instead of opening their own. A use holds a [`Lease`]; when
//! the last lease goes, a reaper is scheduled for the idle time, and it closes the session
//! only if nothing leased it since (a generation counter says so) — a use arriving during the
//! wait keeps the session.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use tokio::sync::Mutex;

use super::Target;
use super::upstream::{Upstream, UpstreamError};

#[derive(Debug, Default)]
struct Slot {
    live: Mutex<Option<Arc<Upstream>>>,
    leases: AtomicUsize,
    /// Bumped by every lease and release.
    generation: AtomicU64,
}

/// The sessions of one hub.
#[derive(Debug)]
pub(crate) struct Pool {
    slots: StdMutex<HashMap<Target, Arc<Slot>>>,
    idle: Duration,
}

/// One use of a session; the session stays open at least while a lease on it lives.
#[derive(Debug)]
pub(crate) struct Lease {
    slot: Arc<Slot>,
    pub up: Arc<Upstream>,
    idle: Duration,
}

impl Drop for Lease {
    fn drop(&mut self) {
        let generation = self.slot.generation.fetch_add(1, Ordering::SeqCst) + 1;
        if self.slot.leases.fetch_sub(1, Ordering::SeqCst) != 1 {
            return;
        }
        let (slot, idle) = (self.slot.clone(), self.idle);
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        runtime.spawn(async move {
            tokio::time::sleep(idle).await;
            let mut live = slot.live.lock().await;
            if slot.leases.load(Ordering::SeqCst) == 0
                && slot.generation.load(Ordering::SeqCst) == generation
                && let Some(up) = live.take()
            {
                drop(live);
                tracing::debug!(target = %up.target, "closing an idle session");
                up.close().await;
            }
        });
    }
}

impl Pool {
    pub fn new(idle: Duration) -> Self {
        Pool {
            slots: StdMutex::new(HashMap::new()),
            idle,
        }
    }

    fn slot(&self, target: &Target) -> Arc<Slot> {
        self.slots
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(target.clone())
            .or_default()
            .clone()
    }

    /// A lease on `target`'s session, opened with `open` when there is none (or it ended).
    /// Concurrent callers share one opening; a failed opening is every waiter's error, and
    /// the next use tries again.
    pub async fn lease<F, Fut>(&self, target: &Target, open: F) -> Result<Lease, UpstreamError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Arc<Upstream>, UpstreamError>>,
    {
        let slot = self.slot(target);
        slot.leases.fetch_add(1, Ordering::SeqCst);
        slot.generation.fetch_add(1, Ordering::SeqCst);
        // From here the lease exists: dropping it (on error too) schedules the reaper.
        let mut live = slot.live.lock().await;
        let up = match live.as_ref().filter(|up| up.is_live()) {
            Some(up) => up.clone(),
            None => {
                let opened = open().await;
                match opened {
                    Ok(up) => {
                        *live = Some(up.clone());
                        up
                    }
                    Err(e) => {
                        *live = None;
                        drop(live);
                        release(&slot);
                        return Err(e);
                    }
                }
            }
        };
        drop(live);
        Ok(Lease {
            slot,
            up,
            idle: self.idle,
        })
    }

    /// Every slot there is now.
    fn all_slots(&self) -> Vec<Arc<Slot>> {
        self.slots
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect()
    }

    /// Every live session.
    pub async fn all_live(&self) -> Vec<Arc<Upstream>> {
        let mut out = Vec::new();
        for slot in self.all_slots() {
            if let Some(up) = slot.live.lock().await.as_ref().filter(|up| up.is_live()) {
                out.push(up.clone());
            }
        }
        out
    }

    /// Closes every session, waiting for each to end.
    pub async fn close_all(&self) {
        let mut closing = Vec::new();
        for slot in self.all_slots() {
            if let Some(up) = slot.live.lock().await.take() {
                closing.push(async move { up.close().await });
            }
        }
        futures_util::future::join_all(closing).await;
    }
}

/// A lease that never became one (its opening failed).
fn release(slot: &Slot) {
    slot.generation.fetch_add(1, Ordering::SeqCst);
    slot.leases.fetch_sub(1, Ordering::SeqCst);
}
