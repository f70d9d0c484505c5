//! Joining an org: the one-line `mcpmesh-join:` invite and the exchange over `mcpmesh/join/1`.
//!
//! The line is built like a pairing invite (base64url JSON with a checksum, readable after a
//! mail client wrapped and quoted it) and is as sensitive: its secret is a single-use bearer
//! credential, never logged. The joiner dials the admin's node by the key in the line, proves
//! it holds the secret with a hash bound to both keys, and both print the same three words.
//!
//! Crash safety mirrors pairing: the admin checks the proof and stores nothing; the joiner
//! pins the root and records the join as pending, then says `commit`; the admin then takes the
//! invite and signs the roster with the new device in one store transaction, and answers with
//! that roster. A joiner left pending (either side crashed in between) asks the admin's node
//! for its roster over the gated sync ALPN: a roster naming this device completes the join,
//! a refusal (the admin does not know the device) drops it.

use std::time::Duration;

use iroh::{EndpointId, PublicKey};
use serde::{Deserialize, Serialize};

use crate::pairing::{LineError, decode_line, encode_line};

/// ALPN of joining, offered by the admin's node only while a join invite is live.
pub const ALPN_JOIN: &[u8] = b"mcpmesh/join/1";
/// Prefix of a join invite line.
pub const JOIN_PREFIX: &str = "mcpmesh-join:";
/// Longest join message.
pub const MAX_MESSAGE: usize = 8 * 1024;
/// Default and longest validity of a join invite.
pub const DEFAULT_TTL: Duration = Duration::from_secs(24 * 3600);
pub const MAX_TTL: Duration = Duration::from_secs(7 * 24 * 3600);

/// What a join invite line says.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JoinInvite {
    pub v: u32,
    pub org: String,
    /// The org root's public key (hex): what the joiner pins.
    pub root: String,
    /// The admin node's endpoint id (hex).
    pub admin: String,
    #[serde(default)]
    pub addrs: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub relay: Option<String>,
    /// Which invite (random, 32 hex characters).
    pub iid: String,
    /// The secret, base64url.
    pub secret: String,
    /// The user the device joins as, and that user's groups.
    pub user: String,
    #[serde(default)]
    pub groups: Vec<String>,
    /// Expiry, unix seconds.
    pub exp: u64,
}

impl std::fmt::Debug for JoinInvite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JoinInvite")
            .field("org", &self.org)
            .field("user", &self.user)
            .field("exp", &self.exp)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JoinInviteError {
    #[error("this is not an org invite (it should start with {JOIN_PREFIX})")]
    NotAnInvite,
    #[error("this is a pairing invite: use `mcpmesh pair` for it")]
    PairingInvite,
    #[error("this invite is damaged: a character was changed or lost in copying")]
    Damaged,
    #[error("this invite is from a newer mcpmesh (format {0}); update mcpmesh")]
    Version(u32),
}

impl JoinInvite {
    pub fn encode(&self) -> String {
        encode_line(JOIN_PREFIX, &serde_json::to_vec(self).unwrap_or_default())
    }

    /// Parses a line as pasted, rejecting anything malformed or altered.
    pub fn decode(line: &str) -> Result<Self, JoinInviteError> {
        let json = decode_line(JOIN_PREFIX, line).map_err(|e| match e {
            LineError::OtherKind if decode_line(crate::pairing::INVITE_PREFIX, line).is_ok() => {
                JoinInviteError::PairingInvite
            }
            LineError::OtherKind => JoinInviteError::NotAnInvite,
            LineError::Damaged => JoinInviteError::Damaged,
        })?;
        let invite: JoinInvite =
            serde_json::from_slice(&json).map_err(|_| JoinInviteError::Damaged)?;
        if invite.v != 1 {
            return Err(JoinInviteError::Version(invite.v));
        }
        let iid_ok = invite.iid.len() == 32 && invite.iid.bytes().all(|b| b.is_ascii_hexdigit());
        let names_ok = mcpmesh_net::session::valid_service_name(&invite.org)
            && super::valid_user(&invite.user)
            && invite.groups.len() <= 64
            && invite
                .groups
                .iter()
                .all(|g| mcpmesh_net::session::valid_service_name(g));
        if invite.admin_id().is_none()
            || invite.root_key().is_none()
            || invite.secret_bytes().is_none()
            || !iid_ok
            || !names_ok
        {
            return Err(JoinInviteError::Damaged);
        }
        Ok(invite)
    }

    pub fn admin_id(&self) -> Option<EndpointId> {
        super::parse_eid(&self.admin)
    }

    pub fn root_key(&self) -> Option<PublicKey> {
        super::parse_eid(&self.root)
    }

    pub fn secret_bytes(&self) -> Option<[u8; 32]> {
        data_encoding::BASE64URL_NOPAD
            .decode(self.secret.as_bytes())
            .ok()?
            .try_into()
            .ok()
    }
}

/// The joiner's first message.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JoinHello {
    pub join: u32,
    /// Which invite (its `iid`).
    pub invite: String,
    /// `pairing::proof` over the secret and both keys.
    pub proof: String,
    /// The device name the joiner asks for (the admin makes it unique within the user).
    #[serde(default)]
    pub device: Option<String>,
    /// Where the joiner can be reached, recorded in the roster.
    #[serde(default)]
    pub addrs: Vec<String>,
    /// The joiner's home relay, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub relay: Option<String>,
}

/// The admin's answers: to the hello (proof holds, nothing stored), then to the commit (the
/// device is in the signed roster carried here).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct JoinReply {
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The signed roster naming the new device (answer to the commit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub roster: Option<String>,
}

impl JoinReply {
    pub fn refused(reason: impl Into<String>) -> Self {
        JoinReply {
            ok: false,
            error: Some(reason.into()),
            roster: None,
        }
    }
}

/// The joiner's second message: it pinned the root and recorded the join as pending.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JoinCommit {
    pub commit: bool,
}
