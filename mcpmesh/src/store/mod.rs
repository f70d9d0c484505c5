//! The node's embedded store (redb): peers met by pairing, live invites, recent pairings,
//! the org this node belongs to (see `org`), and the audit log's high-water mark.
//!
//! Every change is one transaction, so a crash leaves the old state or the new one, never a
//! torn one. Values are JSON, so records can grow fields without a migration.

mod org;

use std::path::Path;

use redb::{Database, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// Peers by endpoint id (hex).
const PEERS: TableDefinition<&str, &[u8]> = TableDefinition::new("peers");
/// Invites by invite id (hex of a hash of the secret).
const INVITES: TableDefinition<&str, &[u8]> = TableDefinition::new("invites");
/// Pairings by time (unix ms), newest last.
const PAIRINGS: TableDefinition<u64, &[u8]> = TableDefinition::new("pairings");

/// The audit log's high-water mark, under one key.
const AUDIT: TableDefinition<&str, &[u8]> = TableDefinition::new("audit");
const HIGH_WATER: &str = "high_water";

/// Pairings kept for `status`.
const PAIRINGS_KEPT: usize = 32;

#[derive(Debug, thiserror::Error)]
#[error("the node's store: {0}")]
pub struct StoreError(String);

pub use org::{JoinStep, OrgRecord, PendingJoin, Removed, RosterSource, StoredJoinInvite};

fn err(e: impl std::fmt::Display) -> StoreError {
    StoreError(e.to_string())
}

/// A peer this node trusts because of a pairing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredPeer {
    pub id: String,
    pub name: String,
    #[serde(default)]
    pub addrs: Vec<String>,
    /// Services the peer granted this node when we paired (what we may mount).
    #[serde(default)]
    pub mounts: Vec<String>,
    pub paired_at: u64,
    /// A pairing this node redeemed whose completion the inviter has not confirmed yet
    /// (a crash came in between); recovery confirms it or drops it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pending: bool,
    /// Services a pairing granted this peer, stored with the pairing and cleared once the
    /// grants are in config: a crash in between leaves them here to be written at start.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub grants_owed: Vec<String>,
}

/// An invite this node minted. The secret stays here and in the line; never in logs.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredInvite {
    pub secret: [u8; 32],
    pub services: Vec<String>,
    pub expires_at: u64,
    pub uses_left: u32,
    pub failures: u32,
}

impl std::fmt::Debug for StoredInvite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoredInvite")
            .field("services", &self.services)
            .field("expires_at", &self.expires_at)
            .field("uses_left", &self.uses_left)
            .finish_non_exhaustive()
    }
}

/// A pairing, as `status` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pairing {
    pub peer: String,
    pub code: String,
    pub at: u64,
}

/// What redeeming an invite did.
#[derive(Debug)]
pub enum Redeemed<T> {
    /// Accepted; the closure's result.
    Accepted(T),
    /// Refused, with the invite's state updated (a failed attempt counted, or nothing).
    Refused(String),
}

#[derive(Debug)]
pub struct Store {
    db: Database,
}

impl Store {
    /// Opens the store at `path`, created `0600` if missing; it holds invite secrets, so it is
    /// held to the rule of a secret ([`crate::files::Rule::Secret`]) and never opened through
    /// a link.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let file = crate::files::open_private_rw(path).map_err(err)?;
        let backend = redb::backends::FileBackend::new(file).map_err(err)?;
        let db = redb::Builder::new()
            .create_with_backend(backend)
            .map_err(err)?;
        let txn = begin_write(&db)?;
        {
            txn.open_table(PEERS).map_err(err)?;
            txn.open_table(INVITES).map_err(err)?;
            txn.open_table(PAIRINGS).map_err(err)?;
            txn.open_table(org::ORG).map_err(err)?;
            txn.open_table(org::JOIN_INVITES).map_err(err)?;
            txn.open_table(AUDIT).map_err(err)?;
        }
        txn.commit().map_err(err)?;
        Ok(Store { db })
    }

    /// The peers in the store at `path`, read without taking it over; for tools that run
    /// beside a stopped node. Fails while a node has the store open.
    pub fn read_peers(path: &Path) -> Result<Vec<StoredPeer>, StoreError> {
        let db = redb::ReadOnlyDatabase::open(path).map_err(err)?;
        all_in(&db, PEERS)
    }

    /// The audit log's high-water mark in the store at `path`, read without taking it over
    /// (for `audit verify` beside a stopped node); `None` when none was kept yet.
    pub fn read_audit_mark(path: &Path) -> Result<Option<crate::audit::Head>, StoreError> {
        let db = redb::ReadOnlyDatabase::open(path).map_err(err)?;
        audit_mark_in(&db)
    }

    /// The audit log's high-water mark; `None` when none was kept yet.
    pub fn audit_mark(&self) -> Result<Option<crate::audit::Head>, StoreError> {
        audit_mark_in(&self.db)
    }

    pub fn put_audit_mark(&self, mark: &crate::audit::Head) -> Result<(), StoreError> {
        self.write(|txn| {
            txn.open_table(AUDIT)
                .map_err(err)?
                .insert(HIGH_WATER, encode(mark)?.as_slice())
                .map_err(err)?;
            Ok(())
        })
    }

    pub fn peers(&self) -> Result<Vec<StoredPeer>, StoreError> {
        self.all(PEERS)
    }

    pub fn invites(&self) -> Result<Vec<(String, StoredInvite)>, StoreError> {
        let txn = self.db.begin_read().map_err(err)?;
        let table = txn.open_table(INVITES).map_err(err)?;
        let mut out = Vec::new();
        for row in table.iter().map_err(err)? {
            let (k, v) = row.map_err(err)?;
            out.push((k.value().to_owned(), decode(v.value())?));
        }
        Ok(out)
    }

    /// Pairings, newest first.
    pub fn pairings(&self) -> Result<Vec<Pairing>, StoreError> {
        let mut all: Vec<Pairing> = self.all(PAIRINGS)?;
        all.reverse();
        Ok(all)
    }

    pub fn put_invite(&self, id: &str, invite: &StoredInvite) -> Result<(), StoreError> {
        self.write(|txn| {
            txn.open_table(INVITES)
                .map_err(err)?
                .insert(id, encode(invite)?.as_slice())
                .map_err(err)?;
            Ok(())
        })
    }

    /// Removes invites that expired or ran out of uses; returns how many live ones remain.
    pub fn prune_invites(&self, now: u64) -> Result<usize, StoreError> {
        check_writer();
        let live = self.invites()?;
        let dead: Vec<&String> = live
            .iter()
            .filter(|(_, i)| i.expires_at <= now || i.uses_left == 0)
            .map(|(k, _)| k)
            .collect();
        if !dead.is_empty() {
            self.write(|txn| {
                let mut table = txn.open_table(INVITES).map_err(err)?;
                for k in &dead {
                    table.remove(k.as_str()).map_err(err)?;
                }
                Ok(())
            })?;
        }
        Ok(live.len() - dead.len())
    }

    /// Checks a redemption of invite `id` without consuming it: a wrong proof (`check` says
    /// `Err`) is counted as a failed attempt (the invite dies after `max_failures`). An
    /// unknown invite or a proof that holds writes nothing.
    pub fn verify<T>(
        &self,
        id: &str,
        now: u64,
        max_failures: u32,
        check: impl Fn(&StoredInvite) -> Result<T, String>,
    ) -> Result<Redeemed<T>, StoreError> {
        check_writer();
        self.redeem_inner(id, now, max_failures, |i| check(i).map(|v| (None, v)))
    }

    /// Redeems invite `id` in one transaction: `check` sees the invite and decides; on
    /// `Ok`, a use is taken and `peer` and the pairing are stored with it; on `Err`, a failed
    /// attempt is counted (the invite dies after `max_failures`). `check` may be called
    /// twice (once on a read, once in the write), so it must have no effects.
    pub fn redeem<T>(
        &self,
        id: &str,
        now: u64,
        max_failures: u32,
        check: impl Fn(&StoredInvite) -> Result<(StoredPeer, Pairing, T), String>,
    ) -> Result<Redeemed<T>, StoreError> {
        check_writer();
        self.redeem_inner(id, now, max_failures, |i| {
            check(i).map(|(p, r, v)| (Some((p, r)), v))
        })
    }

    /// Decides on a read transaction first and opens a write transaction (which syncs the
    /// disk) only when a real invite's state changes: anyone who can reach the pairing
    /// protocol can send attempts, and an unknown invite id must cost them a lookup, not a
    /// disk sync.
    #[allow(clippy::type_complexity)]
    fn redeem_inner<T>(
        &self,
        id: &str,
        now: u64,
        max_failures: u32,
        check: impl Fn(&StoredInvite) -> Result<(Option<(StoredPeer, Pairing)>, T), String>,
    ) -> Result<Redeemed<T>, StoreError> {
        let seen = {
            let txn = self.db.begin_read().map_err(err)?;
            let invites = txn.open_table(INVITES).map_err(err)?;
            invite_in(&invites, id)?
        };
        match step(seen, now, max_failures, &check) {
            Step::Unchanged(outcome) => return Ok(outcome),
            Step::Change(..) => {}
        }
        let txn = begin_write(&self.db)?;
        let outcome = {
            let mut invites = txn.open_table(INVITES).map_err(err)?;
            // Decided again on what the write sees: another attempt may have come between.
            match step(invite_in(&invites, id)?, now, max_failures, &check) {
                Step::Unchanged(outcome) => return Ok(outcome),
                Step::Change(invite, stored, outcome) => {
                    match invite {
                        Some(i) => invites.insert(id, encode(&i)?.as_slice()).map_err(err)?,
                        None => invites.remove(id).map_err(err)?,
                    };
                    if let Some((peer, pairing)) = stored {
                        txn.open_table(PEERS)
                            .map_err(err)?
                            .insert(peer.id.as_str(), encode(&peer)?.as_slice())
                            .map_err(err)?;
                        insert_pairing(&txn, &pairing)?;
                    }
                    outcome
                }
            }
        };
        txn.commit().map_err(err)?;
        Ok(outcome)
    }

    /// Clears what a pairing owed peer `id` (its grants are in config now).
    pub fn clear_grants_owed(&self, id: &str) -> Result<(), StoreError> {
        self.write(|txn| {
            let mut peers = txn.open_table(PEERS).map_err(err)?;
            let peer: Option<StoredPeer> = match peers.get(id).map_err(err)? {
                Some(v) => Some(decode(v.value())?),
                None => None,
            };
            if let Some(mut peer) = peer.filter(|p| !p.grants_owed.is_empty()) {
                peer.grants_owed.clear();
                peers.insert(id, encode(&peer)?.as_slice()).map_err(err)?;
            }
            Ok(())
        })
    }

    /// Stores a peer (and optionally its pairing) in one transaction.
    pub fn put_peer(&self, peer: &StoredPeer, pairing: Option<&Pairing>) -> Result<(), StoreError> {
        self.write(|txn| {
            txn.open_table(PEERS)
                .map_err(err)?
                .insert(peer.id.as_str(), encode(peer)?.as_slice())
                .map_err(err)?;
            if let Some(p) = pairing {
                insert_pairing(txn, p)?;
            }
            Ok(())
        })
    }

    pub fn remove_peer(&self, id: &str) -> Result<bool, StoreError> {
        let mut removed = false;
        self.write(|txn| {
            removed = txn
                .open_table(PEERS)
                .map_err(err)?
                .remove(id)
                .map_err(err)?
                .is_some();
            Ok(())
        })?;
        Ok(removed)
    }

    fn all<K: redb::Key + 'static, T: DeserializeOwned>(
        &self,
        def: TableDefinition<K, &'static [u8]>,
    ) -> Result<Vec<T>, StoreError> {
        all_in(&self.db, def)
    }

    fn write(
        &self,
        f: impl FnOnce(&redb::WriteTransaction) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let txn = begin_write(&self.db)?;
        f(&txn)?;
        txn.commit().map_err(err)
    }
}

/// What one redemption attempt does to an invite. Lives for one attempt, so its size does
/// not matter.
#[allow(clippy::large_enum_variant)]
enum Step<T> {
    /// Nothing to write.
    Unchanged(Redeemed<T>),
    /// The invite's new state (`None`: it goes), what to store with it, and the outcome.
    Change(
        Option<StoredInvite>,
        Option<(StoredPeer, Pairing)>,
        Redeemed<T>,
    ),
}

fn step<T>(
    invite: Option<StoredInvite>,
    now: u64,
    max_failures: u32,
    check: impl Fn(&StoredInvite) -> Result<(Option<(StoredPeer, Pairing)>, T), String>,
) -> Step<T> {
    let refused = |reason: &str| Redeemed::Refused(reason.to_owned());
    match invite {
        None => Step::Unchanged(refused(
            "unknown invite (it may have been used up or withdrawn)",
        )),
        Some(i) if i.expires_at <= now => Step::Change(None, None, refused("the invite expired")),
        Some(i) if i.uses_left == 0 || i.failures >= max_failures => {
            Step::Change(None, None, refused("the invite is used up"))
        }
        Some(mut i) => match check(&i) {
            Ok((None, value)) => Step::Unchanged(Redeemed::Accepted(value)),
            Ok((Some(stored), value)) => {
                i.uses_left -= 1;
                let left = (i.uses_left > 0).then_some(i);
                Step::Change(left, Some(stored), Redeemed::Accepted(value))
            }
            Err(reason) => {
                i.failures += 1;
                let left = (i.failures < max_failures).then_some(i);
                Step::Change(left, None, Redeemed::Refused(reason))
            }
        },
    }
}

fn invite_in(
    table: &impl ReadableTable<&'static str, &'static [u8]>,
    id: &str,
) -> Result<Option<StoredInvite>, StoreError> {
    match table.get(id).map_err(err)? {
        Some(v) => Ok(Some(decode(v.value())?)),
        None => Ok(None),
    }
}

/// Every value of table `def`, decoded.
fn audit_mark_in(db: &impl ReadableDatabase) -> Result<Option<crate::audit::Head>, StoreError> {
    let txn = db.begin_read().map_err(err)?;
    let table = match txn.open_table(AUDIT) {
        Ok(table) => table,
        // A store from before the mark was kept.
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
        Err(e) => return Err(err(e)),
    };
    match table.get(HIGH_WATER).map_err(err)? {
        Some(v) => decode(v.value()).map(Some),
        None => Ok(None),
    }
}

impl crate::audit::HighWater for Store {
    fn load(&self) -> Result<Option<crate::audit::Head>, String> {
        self.audit_mark().map_err(|e| e.to_string())
    }

    fn save(&self, mark: &crate::audit::Head) -> Result<(), String> {
        self.put_audit_mark(mark).map_err(|e| e.to_string())
    }
}

/// A running node's store as the audit log's high-water mark: read where it is asked,
/// written on the node's writer like every other write.
#[derive(Debug)]
pub struct HighWaterOnDisk {
    store: std::sync::Arc<Store>,
    disk: crate::disk::Disk,
}

impl HighWaterOnDisk {
    pub fn new(store: std::sync::Arc<Store>, disk: crate::disk::Disk) -> Self {
        HighWaterOnDisk { store, disk }
    }
}

impl crate::audit::HighWater for HighWaterOnDisk {
    fn load(&self) -> Result<Option<crate::audit::Head>, String> {
        self.store.load()
    }

    fn save(&self, mark: &crate::audit::Head) -> Result<(), String> {
        let (store, mark) = (self.store.clone(), mark.clone());
        self.disk
            .run_blocking(move || crate::audit::HighWater::save(store.as_ref(), &mark))
            .unwrap_or_else(|| Err("the node's writer is gone".to_owned()))
    }
}

/// Every write transaction starts here, where the one-writer rule is checked (see
/// [`crate::disk`]).
fn begin_write(db: &Database) -> Result<redb::WriteTransaction, StoreError> {
    check_writer();
    db.begin_write().map_err(err)
}

/// The one-writer rule, checked in debug builds by every method that may write, whether or
/// not this call does: a write that happens only now and then is caught the first time.
fn check_writer() {
    debug_assert!(
        crate::disk::may_write_here(),
        "the store is written on an async runtime's thread: run the write on the node's Disk"
    );
}

fn all_in<K: redb::Key + 'static, T: DeserializeOwned>(
    db: &impl ReadableDatabase,
    def: TableDefinition<K, &'static [u8]>,
) -> Result<Vec<T>, StoreError> {
    let txn = db.begin_read().map_err(err)?;
    let table = txn.open_table(def).map_err(err)?;
    let mut out = Vec::new();
    for row in table.iter().map_err(err)? {
        let (_, v) = row.map_err(err)?;
        out.push(decode(v.value())?);
    }
    Ok(out)
}

fn insert_pairing(txn: &redb::WriteTransaction, p: &Pairing) -> Result<(), StoreError> {
    let mut table = txn.open_table(PAIRINGS).map_err(err)?;
    let mut at = p.at;
    while table.get(at).map_err(err)?.is_some() {
        at += 1;
    }
    table.insert(at, encode(p)?.as_slice()).map_err(err)?;
    let excess = table
        .len()
        .map_err(err)?
        .saturating_sub(PAIRINGS_KEPT as u64);
    for _ in 0..excess {
        table.pop_first().map_err(err)?;
    }
    Ok(())
}

fn encode<T: Serialize>(v: &T) -> Result<Vec<u8>, StoreError> {
    serde_json::to_vec(v).map_err(err)
}

fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, StoreError> {
    serde_json::from_slice(bytes).map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_store_is_private_and_a_link_at_its_path_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mcpmesh.redb");
        drop(Store::open(&path).unwrap());
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let elsewhere = dir.path().join("elsewhere.redb");
        std::fs::rename(&path, &elsewhere).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &path).unwrap();
        let e = Store::open(&path).unwrap_err().to_string();
        assert!(e.contains("symbolic link"), "{e}");
    }

    #[cfg(debug_assertions)]
    #[tokio::test(flavor = "current_thread")]
    async fn a_write_on_a_runtime_thread_fails_in_debug_builds_and_one_on_the_writer_does_not() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mcpmesh.redb");
        let disk = crate::disk::Disk::start(tokio::runtime::Handle::current()).unwrap();
        let store =
            std::sync::Arc::new(disk.run(move || Store::open(&path)).await.unwrap().unwrap());
        let on_writer = store.clone();
        let written = disk
            .run(move || on_writer.put_invite("i1", &invite(1)))
            .await;
        assert!(matches!(written, Some(Ok(()))));
        let here = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            store.put_invite("i2", &invite(1))
        }));
        assert!(here.is_err(), "a write on the runtime thread must not pass");
        assert_eq!(store.invites().unwrap().len(), 1);
    }

    fn invite(uses: u32) -> StoredInvite {
        StoredInvite {
            secret: [7; 32],
            services: vec!["notes".into()],
            expires_at: 1_000,
            uses_left: uses,
            failures: 0,
        }
    }

    fn peer(id: &str) -> StoredPeer {
        StoredPeer {
            id: id.into(),
            name: "bob".into(),
            addrs: vec![],
            mounts: vec![],
            paired_at: 1,
            pending: false,
            grants_owed: vec![],
        }
    }

    fn accept(
        id: &str,
    ) -> impl Fn(&StoredInvite) -> Result<(StoredPeer, Pairing, ()), String> + '_ {
        move |_| {
            Ok((
                peer(id),
                Pairing {
                    peer: "bob".into(),
                    code: "a-b-c".into(),
                    at: 5,
                },
                (),
            ))
        }
    }

    #[test]
    fn an_invite_is_used_once_and_stores_its_peer_and_pairing() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("s.redb")).unwrap();
        store.put_invite("i1", &invite(1)).unwrap();
        assert!(matches!(
            store.redeem("i1", 10, 10, accept("p1")).unwrap(),
            Redeemed::Accepted(())
        ));
        assert!(matches!(
            store.redeem("i1", 10, 10, accept("p2")).unwrap(),
            Redeemed::Refused(_)
        ));
        assert_eq!(store.peers().unwrap().len(), 1);
        assert_eq!(store.pairings().unwrap()[0].code, "a-b-c");
    }

    #[test]
    fn failed_attempts_do_not_burn_an_invite_until_the_budget_is_spent() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("s.redb")).unwrap();
        store.put_invite("i1", &invite(1)).unwrap();
        for _ in 0..3 {
            let r = store
                .redeem("i1", 10, 4, |_| {
                    Err::<(StoredPeer, Pairing, ()), _>("wrong secret".into())
                })
                .unwrap();
            assert!(matches!(r, Redeemed::Refused(_)));
        }
        assert!(matches!(
            store.redeem("i1", 10, 4, accept("p1")).unwrap(),
            Redeemed::Accepted(())
        ));

        store.put_invite("i2", &invite(1)).unwrap();
        for _ in 0..4 {
            let _ = store
                .redeem("i2", 10, 4, |_| {
                    Err::<(StoredPeer, Pairing, ()), _>("wrong".into())
                })
                .unwrap();
        }
        assert!(
            matches!(
                store.redeem("i2", 10, 4, accept("p2")).unwrap(),
                Redeemed::Refused(_)
            ),
            "budget spent"
        );
    }

    #[test]
    fn an_expired_invite_is_refused_and_pruned() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("s.redb")).unwrap();
        store.put_invite("i1", &invite(1)).unwrap();
        assert!(
            matches!(store.redeem("i1", 2_000, 10, accept("p1")).unwrap(), Redeemed::Refused(r) if r.contains("expired"))
        );
        store.put_invite("i2", &invite(1)).unwrap();
        assert_eq!(store.prune_invites(2_000).unwrap(), 0);
    }

    /// The store file's bytes: any committed write transaction changes them.
    fn bytes(dir: &tempfile::TempDir) -> Vec<u8> {
        std::fs::read(dir.path().join("s.redb")).unwrap()
    }

    #[test]
    fn unknown_invites_and_good_proofs_are_checked_without_writing() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("s.redb")).unwrap();
        store.put_invite("i1", &invite(2)).unwrap();
        let before = bytes(&dir);
        for _ in 0..50 {
            let r = store.verify("nope", 10, 10, |_| Ok(())).unwrap();
            assert!(matches!(r, Redeemed::Refused(_)));
        }
        assert!(matches!(
            store.verify("i1", 10, 10, |_| Ok(())).unwrap(),
            Redeemed::Accepted(())
        ));
        assert!(matches!(
            store.redeem("nope", 10, 10, accept("p1")).unwrap(),
            Redeemed::Refused(_)
        ));
        assert!(bytes(&dir) == before, "nothing was written");

        // A wrong proof for a real invite is counted.
        let r = store
            .verify("i1", 10, 10, |_| Err::<(), _>("wrong secret".into()))
            .unwrap();
        assert!(matches!(r, Redeemed::Refused(_)));
        assert!(bytes(&dir) != before, "the failure was written");
        assert_eq!(store.invites().unwrap()[0].1.failures, 1);
    }

    #[test]
    fn the_roster_is_a_record_of_its_own_and_an_older_inline_one_still_reads() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("s.redb")).unwrap();
        let record = OrgRecord {
            org: "acme".into(),
            root: "ab".repeat(32),
            roster: Some("{\"roster\":{}}".into()),
            serial: 4,
            ..OrgRecord::default()
        };
        store.put_org(&record).unwrap();
        assert_eq!(store.org().unwrap(), Some(record.clone()));
        // Damage to the roster record leaves the rest of the org.
        store
            .write(|txn| {
                let mut table = txn.open_table(org::ORG).map_err(err)?;
                table.insert("roster", &b"\xff\x00junk"[..]).map_err(err)?;
                Ok(())
            })
            .unwrap();
        let damaged = store.org().unwrap().unwrap();
        assert_eq!(
            (damaged.root.as_str(), damaged.serial),
            (record.root.as_str(), 4)
        );
        assert!(damaged.roster.is_some_and(|r| r.contains("junk")));
        // What an older version wrote: the roster inside the org record.
        let inline = r#"{"org":"acme","root":"cd","roster":"old"}"#;
        store
            .write(|txn| {
                let mut table = txn.open_table(org::ORG).map_err(err)?;
                table.remove("roster").map_err(err)?;
                table.insert("org", inline.as_bytes()).map_err(err)?;
                Ok(())
            })
            .unwrap();
        assert_eq!(store.org().unwrap().unwrap().roster.as_deref(), Some("old"));
        store.remove_org().unwrap();
        assert_eq!(store.org().unwrap(), None);
    }

    #[test]
    fn a_redeemed_peer_carries_the_grants_owed_until_they_are_cleared() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("s.redb")).unwrap();
        store.put_invite("i1", &invite(1)).unwrap();
        let owed = |_: &StoredInvite| {
            let p = StoredPeer {
                grants_owed: vec!["notes".into()],
                ..peer("p1")
            };
            let pairing = Pairing {
                peer: "bob".into(),
                code: "a-b-c".into(),
                at: 5,
            };
            Ok((p, pairing, ()))
        };
        assert!(matches!(
            store.redeem("i1", 10, 10, owed).unwrap(),
            Redeemed::Accepted(())
        ));
        assert_eq!(store.peers().unwrap()[0].grants_owed, ["notes"]);
        store.clear_grants_owed("p1").unwrap();
        assert!(store.peers().unwrap()[0].grants_owed.is_empty());
    }
}
