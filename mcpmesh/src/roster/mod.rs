//! The org roster: who is in a team, on which devices, in which groups, and whose keys are
//! revoked, signed by the org's root key.
//!
//! The root key lives on the admin's node only and signs nothing but rosters. A node pins the
//! root's public key when it joins and takes a roster only when it verifies under that key,
//! is newer than the one it holds, is within its validity window and is well formed; anything
//! else is refused whole, so a node never runs on half a roster.
//!
//! The signature covers the RFC 8785 (JCS) canonical form of the `roster` object exactly as it
//! arrived, so a roster with fields a later version adds still verifies here, and two encoders
//! that order keys or print numbers differently agree on the bytes signed.

pub mod invite;
pub mod removal;
pub mod root;
pub mod sync;

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;

use iroh::{EndpointId, PublicKey, SecretKey, Signature};
use mcpmesh_net::session::valid_service_name;
pub use removal::{Removal, RemovalNotice};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The largest roster accepted, encoded.
pub const MAX_ROSTER_BYTES: usize = 1024 * 1024;
/// Clock skew tolerated on `issued_at` and `expires_at`, in seconds.
pub const CLOCK_SKEW_SECS: u64 = 600;
/// How long a roster the admin signs is valid, by default.
pub const DEFAULT_VALIDITY_SECS: u64 = 30 * 24 * 3600;
/// Longest user id and device name: a device mounted as `USER.DEVICE` stays a valid name.
pub const MAX_USER_LEN: usize = 32;
pub const MAX_DEVICE_LEN: usize = 31;
const MAX_MEMBERS: usize = 4096;
const MAX_DEVICES: usize = 16;
const MAX_GROUPS: usize = 64;
const MAX_ADDRS: usize = 16;
const MAX_REVOKED: usize = 65536;

/// What the signature is over: this context, then the canonical roster.
const SIGNING_CONTEXT: &[u8] = b"mcpmesh roster v1\n";

/// A roster's content.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Roster {
    pub v: u32,
    pub org: String,
    /// The root's public key (hex).
    pub root: String,
    pub serial: u64,
    /// Unix seconds.
    pub issued_at: u64,
    /// Unix seconds.
    pub expires_at: u64,
    pub members: Vec<Member>,
    /// Endpoint ids (hex) refused everywhere this roster is held.
    #[serde(default)]
    pub revoked: Vec<String>,
    /// The notices of the latest removals, one per revoked key that has one: what a removed
    /// device is handed to learn of its removal (see [`removal`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub removals: Vec<Removal>,
}

/// A user and their devices.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    pub user: String,
    #[serde(default)]
    pub groups: Vec<String>,
    pub devices: Vec<Device>,
}

/// One device of a user: its key, and where it was last known to be reachable.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Device {
    pub name: String,
    /// The device's endpoint id (hex).
    pub eid: String,
    #[serde(default)]
    pub addrs: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub relay: Option<String>,
}

/// Why a roster was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RosterError {
    #[error("the roster is larger than {MAX_ROSTER_BYTES} bytes")]
    TooLarge,
    #[error("the roster is malformed: {0}")]
    Malformed(String),
    #[error("the roster belongs to another org (root {0})")]
    OtherOrg(String),
    #[error("the roster's signature does not verify under the org's root key")]
    BadSignature,
    #[error("the roster's serial {serial} is not above the one held ({held})")]
    Stale { serial: u64, held: u64 },
    #[error("the roster is not valid yet (issued at {0})")]
    NotYetValid(u64),
    #[error("the roster expired at {0}")]
    Expired(u64),
    #[error("the roster is invalid: {0}")]
    Invalid(String),
}

impl RosterError {
    /// A short stable word for the audit log.
    pub fn kind(&self) -> &'static str {
        match self {
            RosterError::TooLarge => "too_large",
            RosterError::Malformed(_) => "malformed",
            RosterError::OtherOrg(_) => "other_org",
            RosterError::BadSignature => "bad_signature",
            RosterError::Stale { .. } => "stale",
            RosterError::NotYetValid(_) => "not_yet_valid",
            RosterError::Expired(_) => "expired",
            RosterError::Invalid(_) => "invalid",
        }
    }
}

/// A roster and the signature that makes it one, as sent and stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignedRoster {
    /// The wire form: `{"roster": {…}, "sig": "<hex>"}`.
    pub text: String,
    pub roster: Roster,
}

#[derive(Serialize, Deserialize)]
struct Envelope {
    roster: Value,
    sig: String,
}

fn canonical(roster: &Value) -> Result<Vec<u8>, RosterError> {
    let mut bytes = SIGNING_CONTEXT.to_vec();
    bytes.extend(serde_jcs::to_vec(roster).map_err(|e| RosterError::Malformed(e.to_string()))?);
    Ok(bytes)
}

impl SignedRoster {
    /// Signs `roster` with the org's root key.
    pub fn sign(roster: Roster, root: &SecretKey) -> Result<Self, RosterError> {
        let value =
            serde_json::to_value(&roster).map_err(|e| RosterError::Malformed(e.to_string()))?;
        let sig = root.sign(&canonical(&value)?);
        let text = serde_json::to_string(&Envelope {
            roster: value,
            sig: data_encoding::HEXLOWER.encode(&sig.to_bytes()),
        })
        .map_err(|e| RosterError::Malformed(e.to_string()))?;
        Ok(SignedRoster { text, roster })
    }

    /// Reads a roster signed by `root` and checks it is well formed. Whether it is newer
    /// than the one held and within its validity is [`SignedRoster::check_fresh`]'s part.
    pub fn open(bytes: &[u8], root: &PublicKey) -> Result<Self, RosterError> {
        if bytes.len() > MAX_ROSTER_BYTES {
            return Err(RosterError::TooLarge);
        }
        let envelope: Envelope =
            serde_json::from_slice(bytes).map_err(|e| RosterError::Malformed(e.to_string()))?;
        let claimed = envelope.roster.get("root").and_then(Value::as_str);
        let pinned = root.to_string();
        if let Some(claimed) = claimed
            && !claimed.eq_ignore_ascii_case(&pinned)
        {
            return Err(RosterError::OtherOrg(short(claimed)));
        }
        let sig: [u8; 64] = data_encoding::HEXLOWER_PERMISSIVE
            .decode(envelope.sig.as_bytes())
            .ok()
            .and_then(|b| b.try_into().ok())
            .ok_or(RosterError::BadSignature)?;
        root.verify(&canonical(&envelope.roster)?, &Signature::from_bytes(&sig))
            .map_err(|_| RosterError::BadSignature)?;
        let roster: Roster = serde_json::from_value(envelope.roster)
            .map_err(|e| RosterError::Malformed(e.to_string()))?;
        check_shape(&roster)?;
        let text = String::from_utf8(bytes.to_vec())
            .map_err(|_| RosterError::Malformed("not UTF-8".into()))?;
        Ok(SignedRoster { text, roster })
    }

    /// Whether this roster may replace one of serial `held` at `now` (unix seconds).
    pub fn check_fresh(&self, held: u64, now: u64) -> Result<(), RosterError> {
        let r = &self.roster;
        if r.serial <= held {
            return Err(RosterError::Stale {
                serial: r.serial,
                held,
            });
        }
        if r.issued_at > now.saturating_add(CLOCK_SKEW_SECS) {
            return Err(RosterError::NotYetValid(r.issued_at));
        }
        if r.expires_at.saturating_add(CLOCK_SKEW_SECS) < now {
            return Err(RosterError::Expired(r.expires_at));
        }
        Ok(())
    }

    /// Opens and checks in one step: what a node does with a roster from anywhere.
    pub fn accept(
        bytes: &[u8],
        root: &PublicKey,
        held: u64,
        now: u64,
    ) -> Result<Self, RosterError> {
        let signed = Self::open(bytes, root)?;
        signed.check_fresh(held, now)?;
        Ok(signed)
    }
}

fn short(hex: &str) -> String {
    hex.chars().take(16).collect()
}

fn invalid(message: String) -> RosterError {
    RosterError::Invalid(message)
}

/// A user id: a valid name of at most [`MAX_USER_LEN`] characters.
pub fn valid_user(user: &str) -> bool {
    valid_service_name(user) && user.len() <= MAX_USER_LEN
}

/// A device name: a valid name of at most [`MAX_DEVICE_LEN`] characters.
pub fn valid_device(name: &str) -> bool {
    valid_service_name(name) && name.len() <= MAX_DEVICE_LEN
}

/// The structural rules: bounded sizes, valid names, each endpoint once, users and groups
/// never sharing a name.
fn check_shape(r: &Roster) -> Result<(), RosterError> {
    check_header(r)?;
    let mut seen = Seen::default();
    for m in &r.members {
        seen.member(m)?;
    }
    for eid in &r.revoked {
        let id = parse_eid(eid).ok_or_else(|| invalid("a revoked key is not an eid".into()))?;
        seen.endpoint(id, eid)?;
    }
    check_removals(r)?;
    if let Some(both) = seen.users.intersection(&seen.groups).next() {
        return Err(invalid(format!("{both} is both a user and a group")));
    }
    Ok(())
}

/// The roster's own fields: its format, its org's name, its size and its validity window.
fn check_header(r: &Roster) -> Result<(), RosterError> {
    if r.v != 1 {
        return Err(invalid(format!("format {} is from a newer mcpmesh", r.v)));
    }
    if !valid_service_name(&r.org) {
        return Err(invalid(format!("org name {:?}", r.org)));
    }
    if r.members.len() > MAX_MEMBERS || r.revoked.len() > MAX_REVOKED {
        return Err(invalid("too many members or revoked keys".into()));
    }
    if r.expires_at <= r.issued_at {
        return Err(invalid("it expires before it is issued".into()));
    }
    Ok(())
}

/// The names and endpoints met so far in one roster, each of which may appear only once.
#[derive(Default)]
struct Seen<'a> {
    users: HashSet<&'a str>,
    groups: HashSet<&'a str>,
    endpoints: HashSet<EndpointId>,
}

impl<'a> Seen<'a> {
    /// A member: a new, valid user id, a bounded number of devices and groups, and each of
    /// those well formed.
    fn member(&mut self, m: &'a Member) -> Result<(), RosterError> {
        if !valid_user(&m.user) {
            return Err(invalid(format!("user id {:?}", m.user)));
        }
        if !self.users.insert(m.user.as_str()) {
            return Err(invalid(format!("user {} appears twice", m.user)));
        }
        if m.devices.is_empty() || m.devices.len() > MAX_DEVICES || m.groups.len() > MAX_GROUPS {
            return Err(invalid(format!(
                "user {} has no devices, or too many devices or groups",
                m.user
            )));
        }
        let mut own_groups = HashSet::new();
        for g in &m.groups {
            if !valid_service_name(g) || !own_groups.insert(g.as_str()) {
                return Err(invalid(format!("group {g:?} of user {}", m.user)));
            }
            self.groups.insert(g.as_str());
        }
        let mut names = HashSet::new();
        for d in &m.devices {
            if !valid_device(&d.name) || !names.insert(d.name.as_str()) {
                return Err(invalid(format!("device {:?} of user {}", d.name, m.user)));
            }
            self.device(d, &m.user)?;
        }
        Ok(())
    }

    /// A device of `user`: an endpoint not seen before, and addresses that parse.
    fn device(&mut self, d: &Device, user: &str) -> Result<(), RosterError> {
        let id = parse_eid(&d.eid)
            .ok_or_else(|| invalid(format!("device {} of {}: bad eid", d.name, user)))?;
        self.endpoint(id, &d.eid)?;
        if d.addrs.len() > MAX_ADDRS || d.addrs.iter().any(|a| a.parse::<SocketAddr>().is_err()) {
            return Err(invalid(format!("addresses of device {}", d.name)));
        }
        if let Some(relay) = &d.relay
            && relay.parse::<iroh::RelayUrl>().is_err()
        {
            return Err(invalid(format!("relay of device {}", d.name)));
        }
        Ok(())
    }

    /// An endpoint (a device's or a revoked key), `eid` as written.
    fn endpoint(&mut self, id: EndpointId, eid: &str) -> Result<(), RosterError> {
        if !self.endpoints.insert(id) {
            return Err(invalid(format!("endpoint {} appears twice", short(eid))));
        }
        Ok(())
    }
}

/// The removal notices: a bounded number, each for a revoked key, at most one per key, and
/// none from a later roster.
fn check_removals(r: &Roster) -> Result<(), RosterError> {
    if r.removals.len() > removal::MAX_REMOVALS {
        return Err(invalid("too many removal notices".into()));
    }
    let revoked: HashSet<EndpointId> = r.revoked.iter().filter_map(|e| parse_eid(e)).collect();
    let mut noticed = HashSet::new();
    for n in &r.removals {
        let id = parse_eid(&n.eid).filter(|id| revoked.contains(id));
        if id.is_none_or(|id| !noticed.insert(id))
            || !valid_user(&n.user)
            || !valid_device(&n.device)
            || n.sig.len() != 128
            || n.serial > r.serial
        {
            return Err(invalid(format!(
                "the removal notice of {} does not match a revoked key",
                short(&n.eid)
            )));
        }
    }
    Ok(())
}

/// An endpoint id as the roster writes it: [`crate::endpoint_id::parse`].
pub use crate::endpoint_id::parse as parse_eid;

/// One device of the roster, as a node looks it up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seat {
    pub user: String,
    pub groups: Vec<String>,
    pub device: String,
    /// The name this device is mounted by: the user id for the user's oldest device (the
    /// first listed), `USER.DEVICE` for the others.
    pub mount: String,
    pub id: EndpointId,
    pub addrs: Vec<SocketAddr>,
    pub relay: Option<iroh::RelayUrl>,
}

/// A held roster, indexed for the trust gate.
#[derive(Debug, Clone)]
pub struct RosterView {
    pub signed: SignedRoster,
    seats: HashMap<EndpointId, Seat>,
    revoked: HashSet<EndpointId>,
}

impl RosterView {
    pub fn new(signed: SignedRoster) -> Self {
        let mut seats = HashMap::new();
        for m in &signed.roster.members {
            for (i, d) in m.devices.iter().enumerate() {
                let Some(id) = parse_eid(&d.eid) else {
                    continue;
                };
                // Devices are listed in the order they joined: a second device never renames
                // the first, and when the first leaves the next oldest takes the plain name.
                let mount = if i == 0 {
                    m.user.clone()
                } else {
                    format!("{}.{}", m.user, d.name)
                };
                seats.insert(
                    id,
                    Seat {
                        user: m.user.clone(),
                        groups: m.groups.clone(),
                        device: d.name.clone(),
                        mount,
                        id,
                        addrs: d.addrs.iter().filter_map(|a| a.parse().ok()).collect(),
                        relay: d.relay.as_deref().and_then(|r| r.parse().ok()),
                    },
                );
            }
        }
        let revoked = signed
            .roster
            .revoked
            .iter()
            .filter_map(|h| parse_eid(h))
            .collect();
        RosterView {
            signed,
            seats,
            revoked,
        }
    }

    pub fn roster(&self) -> &Roster {
        &self.signed.roster
    }

    pub fn is_revoked(&self, id: &EndpointId) -> bool {
        self.revoked.contains(id)
    }

    pub fn revoked(&self) -> &HashSet<EndpointId> {
        &self.revoked
    }

    pub fn seat(&self, id: &EndpointId) -> Option<&Seat> {
        self.seats.get(id)
    }

    /// The removal notice this roster carries for the revoked key `id`, if any.
    pub fn removal(&self, id: &EndpointId) -> Option<&Removal> {
        if !self.is_revoked(id) {
            return None;
        }
        self.roster()
            .removals
            .iter()
            .find(|r| parse_eid(&r.eid).as_ref() == Some(id))
    }

    /// Every device, in roster order.
    pub fn seats(&self) -> Vec<&Seat> {
        let mut all: Vec<&Seat> = self.seats.values().collect();
        all.sort_by(|a, b| a.mount.cmp(&b.mount));
        all
    }

    /// Whether the roster's validity has run out at `now` (unix seconds, skew allowed).
    pub fn is_expired(&self, now: u64) -> bool {
        self.roster().expires_at.saturating_add(CLOCK_SKEW_SECS) < now
    }
}

/// The next roster after `current`: the same org, serial + 1, issued now for `validity`.
pub fn successor(current: &Roster, now: u64, validity: u64) -> Roster {
    Roster {
        serial: current.serial + 1,
        issued_at: now,
        expires_at: now + validity,
        ..current.clone()
    }
}

#[cfg(test)]
mod tests;
