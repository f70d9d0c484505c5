//! The org in the store: the pinned root, the roster held, a join left pending, and (on the
//! admin's node) the live join invites. A join commits the used invite and the roster that
//! names the new device in one transaction.
//!
//! The roster is kept in a record of its own, beside the org record: damage to it leaves the
//! pinned root, the membership and where to fetch a new copy from intact.

use redb::{ReadableDatabase, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};

use super::{Pairing, Store, StoreError, decode, encode, err, insert_pairing};

/// The org record, under one key.
pub(super) const ORG: TableDefinition<&str, &[u8]> = TableDefinition::new("org");
/// Join invites by invite id.
pub(super) const JOIN_INVITES: TableDefinition<&str, &[u8]> = TableDefinition::new("join_invites");

const ORG_KEY: &str = "org";
/// The roster held, in its signed wire form, as received.
const ROSTER_KEY: &str = "roster";
/// Members remembered to fetch the roster from when the copy held is damaged.
const MAX_SOURCES: usize = 16;

/// The org this node belongs to.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OrgRecord {
    pub org: String,
    /// The root's public key (hex), pinned at `org create` or `join`.
    pub root: String,
    /// The roster held, in its signed wire form; `None` while a join is pending. Stored in a
    /// record of its own (an older version kept it in this one, which still reads).
    #[serde(default, skip_serializing)]
    pub roster: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending: Option<PendingJoin>,
    /// The serial of the roster held last: a copy fetched anew is never older.
    #[serde(default)]
    pub serial: u64,
    /// Member devices to fetch the roster from when the copy held cannot be read.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sources: Vec<RosterSource>,
    /// Set when a roster (or its removal notice) revoked this device: the node holds no
    /// roster then, and keeps this for the record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub removed: Option<Removed>,
}

/// How this device learned it was removed from its org.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Removed {
    /// The serial of the roster that removed it.
    pub serial: u64,
    pub user: String,
    pub device: String,
    /// When the node learned it (unix ms).
    pub at: u64,
    /// Who told it (a member's name or `eid:…`).
    pub from: String,
    /// The signed removal notice, as received (JSON), when one was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notice: Option<String>,
}

/// A member device the roster can be fetched from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RosterSource {
    /// Its endpoint id (hex).
    pub eid: String,
    #[serde(default)]
    pub addrs: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub relay: Option<String>,
}

impl RosterSource {
    /// Up to [`MAX_SOURCES`] of `sources`.
    pub fn few(sources: impl IntoIterator<Item = RosterSource>) -> Vec<RosterSource> {
        sources.into_iter().take(MAX_SOURCES).collect()
    }
}

/// A join this node made whose completion the admin has not confirmed yet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingJoin {
    /// The admin node's endpoint id (hex) and addresses.
    pub admin: String,
    #[serde(default)]
    pub addrs: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub relay: Option<String>,
    pub user: String,
    pub at: u64,
}

/// A join invite the admin's node minted: single use. The secret never leaves the store and
/// the line.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredJoinInvite {
    pub secret: [u8; 32],
    pub user: String,
    #[serde(default)]
    pub groups: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    pub expires_at: u64,
    pub failures: u32,
}

impl std::fmt::Debug for StoredJoinInvite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoredJoinInvite")
            .field("user", &self.user)
            .field("expires_at", &self.expires_at)
            .finish_non_exhaustive()
    }
}

/// What one attempt on a join invite did.
#[derive(Debug)]
pub enum JoinStep<T> {
    Accepted(T),
    Refused(String),
}

impl Store {
    /// The org record with the roster held. A roster record that is not even text comes back
    /// as its lossy decoding: opening it fails, and the node says the roster is damaged.
    pub fn org(&self) -> Result<Option<OrgRecord>, StoreError> {
        let txn = self.db.begin_read().map_err(err)?;
        let table = txn.open_table(ORG).map_err(err)?;
        let Some(v) = table.get(ORG_KEY).map_err(err)? else {
            return Ok(None);
        };
        let mut record: OrgRecord = decode(v.value())?;
        if let Some(roster) = table.get(ROSTER_KEY).map_err(err)? {
            record.roster = Some(String::from_utf8_lossy(roster.value()).into_owned());
        }
        Ok(Some(record))
    }

    pub fn put_org(&self, record: &OrgRecord) -> Result<(), StoreError> {
        self.write(|txn| write_org(txn, record))
    }

    pub fn remove_org(&self) -> Result<(), StoreError> {
        self.write(|txn| {
            let mut table = txn.open_table(ORG).map_err(err)?;
            table.remove(ORG_KEY).map_err(err)?;
            table.remove(ROSTER_KEY).map_err(err)?;
            Ok(())
        })
    }

    pub fn put_join_invite(&self, id: &str, invite: &StoredJoinInvite) -> Result<(), StoreError> {
        self.write(|txn| {
            txn.open_table(JOIN_INVITES)
                .map_err(err)?
                .insert(id, encode(invite)?.as_slice())
                .map_err(err)?;
            Ok(())
        })
    }

    /// Drops expired join invites; returns how many are live.
    pub fn prune_join_invites(&self, now: u64) -> Result<usize, StoreError> {
        super::check_writer();
        let (live, dead): (Vec<_>, Vec<_>) = {
            let txn = self.db.begin_read().map_err(err)?;
            let table = txn.open_table(JOIN_INVITES).map_err(err)?;
            let mut rows = Vec::new();
            for row in table.iter().map_err(err)? {
                let (k, v) = row.map_err(err)?;
                let invite: StoredJoinInvite = decode(v.value())?;
                rows.push((k.value().to_owned(), invite.expires_at > now));
            }
            rows.into_iter().partition(|(_, live)| *live)
        };
        if !dead.is_empty() {
            self.write(|txn| {
                let mut table = txn.open_table(JOIN_INVITES).map_err(err)?;
                for (id, _) in &dead {
                    table.remove(id.as_str()).map_err(err)?;
                }
                Ok(())
            })?;
        }
        Ok(live.len())
    }

    /// One attempt on join invite `id`. `check` sees the invite and decides: `Err` counts a
    /// failed attempt (the invite dies after `max_failures`); `Ok((None, v))` writes nothing
    /// (the proof holds, nothing is committed yet); `Ok((Some(record), v))` takes the
    /// invite and stores `record` as the org in the same transaction. `check` may run twice
    /// (on a read, then in the write), so it must have no effects. The join's pairing record
    /// (its code, for `status`) is stored with the org.
    #[allow(clippy::type_complexity)]
    pub fn attempt_join<T>(
        &self,
        id: &str,
        now: u64,
        max_failures: u32,
        check: impl Fn(&StoredJoinInvite) -> Result<(Option<(OrgRecord, Pairing)>, T), String>,
    ) -> Result<JoinStep<T>, StoreError> {
        super::check_writer();
        let decide = |invite: Option<StoredJoinInvite>| match invite {
            None => Err(JoinStep::Refused(
                "unknown invite (it may have been used or withdrawn)".to_owned(),
            )),
            Some(i) if i.expires_at <= now || i.failures >= max_failures => Ok((
                None,
                None,
                JoinStep::Refused("the invite expired or is used up".into()),
            )),
            Some(mut i) => match check(&i) {
                Ok((None, v)) => Err(JoinStep::Accepted(v)),
                Ok((Some(record), v)) => Ok((None, Some(record), JoinStep::Accepted(v))),
                Err(reason) => {
                    i.failures += 1;
                    let left = (i.failures < max_failures).then_some(i);
                    Ok((left, None, JoinStep::Refused(reason)))
                }
            },
        };
        let seen = {
            let txn = self.db.begin_read().map_err(err)?;
            let table = txn.open_table(JOIN_INVITES).map_err(err)?;
            join_invite_in(&table, id)?
        };
        // Nothing to write: answered from the read alone.
        if let Err(outcome) = decide(seen) {
            return Ok(outcome);
        }
        let txn = super::begin_write(&self.db)?;
        let outcome = {
            let mut invites = txn.open_table(JOIN_INVITES).map_err(err)?;
            match decide(join_invite_in(&invites, id)?) {
                Err(outcome) => return Ok(outcome),
                Ok((left, record, outcome)) => {
                    match left {
                        Some(i) => invites.insert(id, encode(&i)?.as_slice()).map_err(err)?,
                        None => invites.remove(id).map_err(err)?,
                    };
                    if let Some((record, pairing)) = record {
                        write_org(&txn, &record)?;
                        insert_pairing(&txn, &pairing)?;
                    }
                    outcome
                }
            }
        };
        txn.commit().map_err(err)?;
        Ok(outcome)
    }
}

/// The org record, and the roster in its own record (gone when the record holds none).
fn write_org(txn: &redb::WriteTransaction, record: &OrgRecord) -> Result<(), StoreError> {
    let mut table = txn.open_table(ORG).map_err(err)?;
    table
        .insert(ORG_KEY, encode(record)?.as_slice())
        .map_err(err)?;
    match &record.roster {
        Some(text) => table.insert(ROSTER_KEY, text.as_bytes()).map(drop),
        None => table.remove(ROSTER_KEY).map(drop),
    }
    .map_err(err)
}

fn join_invite_in(
    table: &impl ReadableTable<&'static str, &'static [u8]>,
    id: &str,
) -> Result<Option<StoredJoinInvite>, StoreError> {
    match table.get(id).map_err(err)? {
        Some(v) => Ok(Some(decode(v.value())?)),
        None => Ok(None),
    }
}
