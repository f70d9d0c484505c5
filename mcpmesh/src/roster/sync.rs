//! Rosters between nodes, over the gated `mcpmesh/roster/1`: each side says which org and
//! serial it holds, and the side holding the newer roster sends it.
//!
//! The dialer opens one stream and sends an [`Offer`]; the other side answers with its own
//! `Offer`, with its roster when that is newer. When the dialer's was the newer one, it then
//! sends its roster in a third message. Every roster received is checked as from anywhere
//! (`SignedRoster::accept`); a node learns nothing it could not verify.
//!
//! Only a member of the roster held is sent that roster. A key the roster revoked is sent,
//! in place of an answer, nothing but its own removal notice (`removed`), at most once per
//! [`NOTICE_INTERVAL`]; any other key is refused at the gate.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// ALPN of roster exchange; gated like every mesh ALPN.
pub const ALPN_ROSTER: &[u8] = b"mcpmesh/roster/1";
/// How long either side waits on the other.
pub const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest message: a roster at its cap, plus the envelope.
pub const MAX_MESSAGE: usize = super::MAX_ROSTER_BYTES + 4096;
/// Longest message read from a key the roster revoked: an offer without a roster.
pub const MAX_REVOKED_MESSAGE: usize = 4096;
/// How often one revoked key is handed its removal notice; between, it is refused.
pub const NOTICE_INTERVAL: Duration = Duration::from_secs(60);
/// Revoked keys remembered as told within [`NOTICE_INTERVAL`]; past that, the rest are
/// refused until the oldest age out.
pub const MAX_TOLD: usize = 1024;

/// What a node holds: its org's root (hex) and serial, and the roster itself when it is
/// sending it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Offer {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root: Option<String>,
    #[serde(default)]
    pub serial: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub roster: Option<String>,
    /// To a key the roster revoked: the root's notice of its removal, and nothing else.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub removed: Option<super::RemovalNotice>,
}
