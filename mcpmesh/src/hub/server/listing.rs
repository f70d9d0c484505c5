//! Each service's listing: fetched on its session into the cache — first listings on the
//! client's first list, stale ones behind an answer, changed ones when a server says so, one
//! fetch per service at a time — and what a listing leaves out said to the log and the client.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::{Value, json};

use super::wire::{line, lock};
use super::{Hub, skills};
use crate::hub::Target;
use crate::hub::cache::{self, Listing, MAX_ITEMS};
use crate::hub::upstream::{Upstream, UpstreamError};

/// Pages read from one server's list before the rest is left out.
const MAX_PAGES: usize = 100;
/// How long a list waits for the first listing of services the cache does not know yet.
const FIRST_LISTING: Duration = Duration::from_secs(20);
/// Warnings held for a client whose `initialize` is not answered yet, at most.
const EARLY_WARNINGS: usize = 64;
/// MCP's log levels, least severe first.
const LOG_LEVELS: [&str; 8] = [
    "debug",
    "info",
    "notice",
    "warning",
    "error",
    "critical",
    "alert",
    "emergency",
];

/// The listings being fetched now.
#[derive(Default)]
pub(super) struct Fetching {
    /// Services whose listing is being fetched.
    pub(super) now: HashSet<Target>,
    /// Services that said their lists changed while being fetched.
    pub(super) changed: HashSet<Target>,
}

impl Hub {
    /// Starts fetching the listing of every service the cache does not know (once at a
    /// time), skipping peers the node cannot reach now.
    pub(super) fn first_listings(self: Arc<Self>) {
        let missing: Vec<Target> = {
            let cache = lock(&self.cache);
            let presented = lock(&self.presented);
            presented
                .targets
                .iter()
                .filter(|t| cache.get(t).is_none() && presented.reach.get(&t.peer) != Some(&false))
                .cloned()
                .collect()
        };
        for target in missing {
            if !lock(&self.fetching).now.insert(target.clone()) {
                continue;
            }
            self.first_fetches.send_modify(|n| *n += 1);
            let hub = self.clone();
            tokio::spawn(async move {
                let changed = hub.fetch(&target).await;
                lock(&hub.fetching).now.remove(&target);
                hub.first_fetches.send_modify(|n| *n = n.saturating_sub(1));
                if changed {
                    hub.announce_lists().await;
                }
            });
        }
    }

    /// A server said one of its lists changed: its listing is fetched again, one fetch at a
    /// time per service however often it says so (a change during a fetch means one more).
    pub(super) fn changed_upstream(self: Arc<Self>, target: Target, method: String) {
        if !lock(&self.fetching).now.insert(target.clone()) {
            lock(&self.fetching).changed.insert(target);
            return;
        }
        tokio::spawn(async move {
            loop {
                if self.fetch(&target).await && self.listed.load(Ordering::SeqCst) {
                    self.list_changed(&method).await;
                }
                if !lock(&self.fetching).changed.remove(&target) {
                    break;
                }
            }
            lock(&self.fetching).now.remove(&target);
        });
    }

    pub(super) async fn wait_for_first_listings(&self) {
        let mut rx = self.first_fetches.subscribe();
        let _ = tokio::time::timeout(FIRST_LISTING, rx.wait_for(|n| *n == 0)).await;
    }

    /// Refreshes, in the background, listings past their lifetime.
    pub(super) fn refresh_stale(self: &Arc<Self>) {
        let now = cache::now_ms();
        let stale: Vec<Target> = {
            let cache = lock(&self.cache);
            self.targets()
                .into_iter()
                .filter(|t| cache.get(t).is_some_and(|l| !l.is_fresh(now)))
                .collect()
        };
        for target in stale {
            if !self.in_reach(&target) {
                continue;
            }
            if !lock(&self.fetching).now.insert(target.clone()) {
                continue;
            }
            let hub = self.clone();
            tokio::spawn(async move {
                let changed = hub.fetch(&target).await;
                lock(&hub.fetching).now.remove(&target);
                if changed {
                    hub.announce_lists().await;
                }
            });
        }
    }

    /// Fetches `target`'s listing on its session (opened if needed) into the cache; whether
    /// what the client sees changed.
    async fn fetch(&self, target: &Target) -> bool {
        let lease = match self.lease(target).await {
            Ok(lease) => lease,
            Err(e) => {
                self.warn(target, &format!("cannot list its tools: {e}"))
                    .await;
                return false;
            }
        };
        let (mut listing, mut notes) = match list_all(&lease.up).await {
            Ok(listed) => listed,
            Err(e) if self.stop.is_cancelled() => {
                tracing::debug!(%target, "listing cut short by the hub's end: {e}");
                return false;
            }
            Err(e) => {
                self.warn(target, &format!("cannot list its tools: {e}"))
                    .await;
                return false;
            }
        };
        drop(lease);
        notes.extend(listing.drop_duplicates());
        for note in &notes {
            self.warn(target, note).await;
        }
        let before = lock(&self.cache).get(target).cloned();
        listing.era = listing.era.or(before.as_ref().and_then(|b| b.era));
        let changed = before.as_ref().is_none_or(|b| !same_items(b, &listing));
        self.cache_put(target, listing).await;
        if changed && let Err(c) = self.rebuild() {
            tracing::error!("{c}");
        }
        changed
    }

    /// Keeps `listing` for `target` and writes the cache out on a blocking thread: the hub's
    /// runtime is one thread, which a slow disk must not hold up. One write at a time, each of
    /// everything kept by then, so a later write never carries less than an earlier one.
    async fn cache_put(&self, target: &Target, listing: Listing) {
        lock(&self.cache).keep(target, listing);
        let _one_at_a_time = self.cache_writes.lock().await;
        let to_write = lock(&self.cache).to_write();
        if let Ok(others) = tokio::task::spawn_blocking(move || to_write.write()).await {
            lock(&self.cache).learn(others);
        }
    }

    /// Says what went wrong with `target`'s listing on stderr and, unless it asked for fewer
    /// messages, to the client, which would otherwise only see items missing.
    async fn warn(&self, target: &Target, note: &str) {
        tracing::warn!(%target, "{note}");
        // A stateless client takes no log messages outside a request.
        if self.client_era_is(crate::hub::era::Era::Stateless) {
            return;
        }
        let level = lock(&self.client)
            .log_level
            .as_ref()
            .and_then(|p| p.get("level")?.as_str().map(str::to_owned));
        let rank = |level: &str| LOG_LEVELS.iter().position(|l| *l == level);
        if level.and_then(|l| rank(&l)) > rank("warning") {
            return;
        }
        let message = line(&json!({
            "jsonrpc": "2.0",
            "method": "notifications/message",
            "params": {"level": "warning", "logger": "mcpmesh-hub", "data": format!("{target}: {note}")},
        }));
        // Before the client's `initialize` is answered, held until it is (a few at most).
        let mut early = self.early_warnings.lock().await;
        match early.as_mut() {
            Some(held) if held.len() < EARLY_WARNINGS => held.push(message),
            Some(_) => {}
            None => {
                drop(early);
                self.send(message).await;
            }
        }
    }

    pub(super) async fn announce_lists(&self) {
        if !self.listed.load(Ordering::SeqCst) {
            return;
        }
        for method in [
            "notifications/tools/list_changed",
            "notifications/prompts/list_changed",
            "notifications/resources/list_changed",
        ] {
            self.list_changed(method).await;
        }
    }
}

/// Whether two listings offer the same items (times aside).
fn same_items(a: &Listing, b: &Listing) -> bool {
    a.tools == b.tools
        && a.prompts == b.prompts
        && a.resources == b.resources
        && a.templates == b.templates
        && a.skills == b.skills
        && a.capabilities == b.capabilities
        && a.instructions == b.instructions
        && a.server_info == b.server_info
}

/// Everything one server lists, each list read to its end (within bounds), and what of it
/// could not be listed, and why.
async fn list_all(up: &Upstream) -> Result<(Listing, Vec<String>), UpstreamError> {
    let caps = up.capabilities();
    let mut listing = Listing {
        fetched_at_ms: cache::now_ms(),
        capabilities: caps.clone(),
        era: up.found(),
        instructions: up.instructions(),
        server_info: up.server_info(),
        ..Listing::default()
    };
    let mut notes = Vec::new();
    if caps.get("tools").is_some() {
        let (tools, ttl) = pages(up, "tools/list", "tools", &mut notes).await?;
        listing.tools = tools;
        listing.ttl_ms = ttl;
    }
    if caps.get("prompts").is_some() {
        listing.prompts = pages(up, "prompts/list", "prompts", &mut notes).await?.0;
    }
    if caps.get("resources").is_some() {
        listing.resources = pages(up, "resources/list", "resources", &mut notes)
            .await?
            .0;
        let templates = "resourceTemplates";
        listing.templates = pages(up, "resources/templates/list", templates, &mut notes)
            .await?
            .0;
    }
    if skills::declared(&caps) {
        listing.skills = pages(up, "skills/list", "skills", &mut notes).await?.0;
    }
    Ok((listing, notes))
}

/// One list, page by page; the items and the first page's `ttlMs`. Whatever cuts the list
/// short is noted in `notes`, except a server saying it has no such list.
async fn pages(
    up: &Upstream,
    method: &str,
    field: &str,
    notes: &mut Vec<String>,
) -> Result<(Vec<Value>, Option<u64>), UpstreamError> {
    let mut items = Vec::new();
    let mut cursor: Option<Value> = None;
    let mut ttl = None;
    for page in 0..MAX_PAGES {
        let params = match &cursor {
            Some(c) => json!({"cursor": c}),
            None => Value::Null,
        };
        let frame = up.request(method, params).await?;
        let Some(result) = frame.get("result") else {
            let error = frame.get("error");
            let code = error.and_then(|e| e.get("code")).and_then(Value::as_i64);
            if code != Some(-32601) {
                let message = error
                    .and_then(|e| e.get("message"))
                    .and_then(Value::as_str)
                    .unwrap_or("an answer without a result");
                let code = code.map_or_else(|| "no code".to_owned(), |c| c.to_string());
                notes.push(format!(
                    "its {method} failed, so its {field} are not all listed: {message} ({code})"
                ));
            }
            return Ok((items, ttl));
        };
        if page == 0 {
            ttl = result.get("ttlMs").and_then(Value::as_u64);
        }
        let Some(listed) = result.get(field).and_then(Value::as_array) else {
            notes.push(format!(
                "its {method} answer holds no {field} list, so its {field} are not all listed"
            ));
            return Ok((items, ttl));
        };
        for item in listed {
            if items.len() == MAX_ITEMS {
                notes.push(format!(
                    "it lists more than {MAX_ITEMS} {field}; the rest are left out"
                ));
                return Ok((items, ttl));
            }
            items.push(item.clone());
        }
        match result.get("nextCursor") {
            Some(c) if !c.is_null() => cursor = Some(c.clone()),
            _ => return Ok((items, ttl)),
        }
    }
    notes.push(format!(
        "its {method} runs past {MAX_PAGES} pages; the rest are left out"
    ));
    Ok((items, ttl))
}
