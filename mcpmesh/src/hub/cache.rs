//! What each service advertises, kept on disk under the profile so a hub answers its lists
//! at start without opening any session.
//!
//! One file, `<state>/hub/cache.json`, written whole and atomically; several hubs of one
//! profile share it (the last writer wins, each entry is whole). An unreadable file is an
//! empty cache, never an error: it is only a cache.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::Target;
use super::names;

/// How long a listing is fresh when its server gives no `ttlMs`.
pub const DEFAULT_TTL: Duration = Duration::from_secs(600);
/// Items of one kind kept per service; a server listing more is cut here.
pub const MAX_ITEMS: usize = 10_000;
/// Duplicates of one kind named one by one; past these, only counted.
const NAMED_DUPLICATES: usize = 5;
/// Largest cache file read back (anything bigger is discarded as not ours).
const MAX_FILE: u64 = 64 << 20;
const VERSION: u32 = 1;

/// What one service advertised when it was last asked.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Listing {
    /// When it was fetched, in milliseconds since the epoch.
    pub fetched_at_ms: u64,
    /// The server's `ttlMs` on its `tools/list`, when it gave one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_ms: Option<u64>,
    /// The server's `capabilities` from its `initialize` (or `server/discover`) answer.
    #[serde(default)]
    pub capabilities: Value,
    /// What a `server/discover` probe last found the service speaks (a stateless client's
    /// sessions skip the probe of a handshake-only one); kept across listings made without
    /// a probe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub era: Option<super::era::Era>,
    /// Who the server says it is: its `serverInfo` (name, version, title, icons…).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_info: Option<Value>,
    /// The server's own `instructions`, as it gave them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instructions: Option<String>,
    #[serde(default)]
    pub tools: Vec<Value>,
    #[serde(default)]
    pub prompts: Vec<Value>,
    #[serde(default)]
    pub resources: Vec<Value>,
    #[serde(default)]
    pub templates: Vec<Value>,
    /// Its skills (the Skills extension's `skills/list` entries), when it declares them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skills: Vec<Value>,
}

impl Listing {
    /// Keeps only the first of the items that share a name (tools and prompts, compared as
    /// the hub names them, so `a.b` and `a_b` are one) or a URI (resources and templates);
    /// says what was dropped.
    pub fn drop_duplicates(&mut self) -> Vec<String> {
        let mut dropped = Vec::new();
        keep_first(&mut self.tools, "tool", "name", &mut dropped);
        keep_first(&mut self.prompts, "prompt", "name", &mut dropped);
        keep_first(&mut self.resources, "resource", "uri", &mut dropped);
        keep_first(
            &mut self.templates,
            "resource template",
            "uriTemplate",
            &mut dropped,
        );
        keep_first(&mut self.skills, "skill", "uri", &mut dropped);
        dropped
    }

    /// Whether the listing is still within its lifetime at `now_ms`.
    pub fn is_fresh(&self, now_ms: u64) -> bool {
        let ttl = self.ttl_ms.unwrap_or(DEFAULT_TTL.as_millis() as u64);
        now_ms.saturating_sub(self.fetched_at_ms) < ttl
    }
}

/// Drops each item whose `field` an earlier item already had; each drop is noted in `dropped`.
fn keep_first(items: &mut Vec<Value>, kind: &str, field: &str, dropped: &mut Vec<String>) {
    let mut seen: HashMap<String, String> = HashMap::new();
    let mut count = 0;
    items.retain(|item| {
        let Some(given) = item.get(field).and_then(Value::as_str) else {
            return true;
        };
        let key = if field == "name" {
            names::sanitize(given)
        } else {
            given.to_owned()
        };
        let Some(first) = seen.get(&key) else {
            seen.insert(key, given.to_owned());
            return true;
        };
        count += 1;
        if count <= NAMED_DUPLICATES {
            dropped.push(if first == given {
                format!("the {kind} {given:?} is listed twice; only the first is kept")
            } else {
                format!(
                    "the {kind} {given:?} is listed twice (named {key} like {first:?} before it); only the first is kept"
                )
            });
        }
        false
    });
    if count > NAMED_DUPLICATES {
        let more = count - NAMED_DUPLICATES;
        dropped.push(format!(
            "{more} more duplicates of a {kind} listed twice are dropped as well"
        ));
    }
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct File {
    version: u32,
    #[serde(default)]
    services: BTreeMap<String, Listing>,
}

/// The cache of every service's listing.
#[derive(Debug)]
pub struct Cache {
    path: PathBuf,
    entries: BTreeMap<String, Listing>,
}

impl Cache {
    /// The cache of the profile whose state lives in `state_dir`.
    pub fn path_in(state_dir: &Path) -> PathBuf {
        state_dir.join("hub").join("cache.json")
    }

    /// Reads the cache at `path`; a missing, oversized or unreadable file is an empty cache.
    pub fn load(path: PathBuf) -> Self {
        let entries = read(&path).unwrap_or_default();
        Cache { path, entries }
    }

    pub fn get(&self, target: &Target) -> Option<&Listing> {
        self.entries.get(&target.key())
    }

    /// Keeps `listing` for `target`, in memory; [`Cache::to_write`] is what to write out.
    pub fn keep(&mut self, target: &Target, listing: Listing) {
        self.entries.insert(target.key(), listing);
    }

    /// Every listing kept now, for [`ToWrite::write`] off the runtime.
    pub fn to_write(&self) -> ToWrite {
        ToWrite {
            path: self.path.clone(),
            entries: self.entries.clone(),
        }
    }

    /// Takes in the listings another hub wrote that this one has none of.
    pub fn learn(&mut self, others: BTreeMap<String, Listing>) {
        for (key, value) in others {
            self.entries.entry(key).or_insert(value);
        }
    }
}

/// The cache as it is to be written.
#[derive(Debug)]
pub struct ToWrite {
    path: PathBuf,
    entries: BTreeMap<String, Listing>,
}

impl ToWrite {
    /// Writes the listings out, with those another hub of this profile wrote meanwhile (the
    /// file is re-read first); returns those others. Blocking: file reads, writes and a sync.
    pub fn write(self) -> BTreeMap<String, Listing> {
        let mut others = read(&self.path).unwrap_or_default();
        others.retain(|key, _| !self.entries.contains_key(key));
        let mut all = self.entries;
        all.extend(others.iter().map(|(k, v)| (k.clone(), v.clone())));
        if let Err(e) = save(&self.path, all) {
            tracing::warn!("cannot write the hub cache {}: {e}", self.path.display());
        }
        others
    }
}

fn save(path: &Path, services: BTreeMap<String, Listing>) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let file = File {
        version: VERSION,
        services,
    };
    let bytes = serde_json::to_vec(&file).map_err(std::io::Error::other)?;
    crate::files::write_atomically(path, &bytes)
}

fn read(path: &Path) -> Option<BTreeMap<String, Listing>> {
    let meta = std::fs::metadata(path).ok()?;
    if meta.len() > MAX_FILE {
        return None;
    }
    let bytes = std::fs::read(path).ok()?;
    match serde_json::from_slice::<File>(&bytes) {
        Ok(mut file) if file.version == VERSION => {
            // A file written by hand or by an older hub may hold duplicates the hub never keeps.
            for listing in file.services.values_mut() {
                listing.drop_duplicates();
            }
            Some(file.services)
        }
        Ok(_) => None,
        Err(e) => {
            tracing::warn!("ignoring an unreadable hub cache {}: {e}", path.display());
            None
        }
    }
}

/// Milliseconds since the epoch.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(peer: &str, service: &str) -> Target {
        Target {
            peer: peer.into(),
            service: service.into(),
        }
    }

    #[test]
    fn a_listing_survives_a_restart_and_another_hubs_entries_are_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = Cache::path_in(dir.path());
        let listing = Listing {
            fetched_at_ms: 5,
            tools: vec![serde_json::json!({"name": "echo"})],
            ..Listing::default()
        };
        let mut one = Cache::load(path.clone());
        let mut two = Cache::load(path.clone());
        // As the hub writes: kept at once, written off the runtime, the other's listings
        // learned from the file.
        let put = |cache: &mut Cache, t: Target| {
            cache.keep(&t, listing.clone());
            let others = cache.to_write().write();
            cache.learn(others);
        };
        put(&mut one, target("alice", "notes"));
        put(&mut two, target("bob", "files"));
        assert_eq!(
            two.get(&target("alice", "notes")),
            Some(&listing),
            "what the other hub wrote is learned"
        );
        let again = Cache::load(path);
        assert_eq!(again.get(&target("alice", "notes")), Some(&listing));
        assert_eq!(again.get(&target("bob", "files")), Some(&listing));
    }

    #[test]
    fn a_broken_cache_file_is_an_empty_cache() {
        let dir = tempfile::tempdir().unwrap();
        let path = Cache::path_in(dir.path());
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, b"{not json").unwrap();
        assert!(Cache::load(path).get(&target("a", "b")).is_none());
    }

    #[test]
    fn duplicates_are_dropped_keeping_the_first_and_each_is_named_up_to_a_count() {
        let named = |names: &[&str]| -> Vec<Value> {
            names
                .iter()
                .map(|n| serde_json::json!({"name": n, "order": n}))
                .collect()
        };
        let mut listing = Listing {
            tools: named(&["echo", "echo", "a.b", "a_b", "other"]),
            prompts: named(&["p", "q", "p"]),
            resources: vec![serde_json::json!({"uri": "r://1"}); 3],
            templates: vec![
                serde_json::json!({"uriTemplate": "r://{x}"}),
                serde_json::json!({}),
            ],
            ..Listing::default()
        };
        let dropped = listing.drop_duplicates();
        let names = |items: &[Value], field: &str| -> Vec<String> {
            items
                .iter()
                .map(|i| i[field].as_str().unwrap_or("-").to_owned())
                .collect()
        };
        assert_eq!(names(&listing.tools, "name"), ["echo", "a.b", "other"]);
        assert_eq!(names(&listing.prompts, "name"), ["p", "q"]);
        assert_eq!(names(&listing.resources, "uri"), ["r://1"]);
        assert_eq!(names(&listing.templates, "uriTemplate"), ["r://{x}", "-"]);
        assert_eq!(dropped.len(), 5, "{dropped:?}");
        assert!(dropped[1].contains("\"a_b\"") && dropped[1].contains("\"a.b\""));
        assert!(listing.drop_duplicates().is_empty());

        let mut many = Listing {
            tools: named(&["x"; 20]),
            ..Listing::default()
        };
        let dropped = many.drop_duplicates();
        assert_eq!(dropped.len(), NAMED_DUPLICATES + 1, "{dropped:?}");
        assert!(
            dropped[NAMED_DUPLICATES].starts_with("14 more"),
            "{dropped:?}"
        );
    }

    #[test]
    fn freshness_follows_the_servers_ttl_or_the_default() {
        let mut l = Listing {
            fetched_at_ms: 1_000,
            ..Listing::default()
        };
        assert!(l.is_fresh(1_000 + DEFAULT_TTL.as_millis() as u64 - 1));
        assert!(!l.is_fresh(1_000 + DEFAULT_TTL.as_millis() as u64));
        l.ttl_ms = Some(0);
        assert!(!l.is_fresh(1_000));
        l.ttl_ms = Some(50);
        assert!(l.is_fresh(1_049));
    }
}
