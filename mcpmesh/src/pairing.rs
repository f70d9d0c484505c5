//! Pairing two people: an invite line, its redemption over `mcpmesh/pair/1`, and the short
//! code both sides show so the humans can compare them.
//!
//! The line carries the inviter's key and addresses and a 32-byte secret. The redeemer dials
//! the inviter *by that key* (so TLS proves it reached the right node) and proves it holds the
//! secret with a keyed hash bound to both keys, so the proof is useless anywhere else. The
//! secret itself never crosses the wire and is never logged.
//!
//! Crash safety: the inviter checks the proof but stores nothing; the redeemer stores the
//! inviter as *pending* and says `commit`; only then does the inviter store the pairing and
//! grant. A redeemer left with a pending entry (either side crashed in between) asks the
//! inviter over the gated ping: answered means the inviter committed (confirm), refused means
//! it did not (drop). So after a crash both sides have the pairing or neither does.

use std::time::Duration;

use data_encoding::BASE64URL_NOPAD;
use iroh::EndpointId;
use serde::{Deserialize, Serialize};

/// ALPN of pairing, offered only while an invite is live.
pub const ALPN_PAIR: &[u8] = b"mcpmesh/pair/1";
/// Prefix of an invite line.
pub const INVITE_PREFIX: &str = "mcpmesh-invite:";
/// Failed redemption attempts after which an invite is void.
pub const MAX_FAILURES: u32 = 10;
/// Default and longest validity of an invite.
pub const DEFAULT_TTL: Duration = Duration::from_secs(24 * 3600);
pub const MAX_TTL: Duration = Duration::from_secs(7 * 24 * 3600);
/// Largest number of uses one invite may grant.
pub const MAX_USES: u32 = 64;
/// Longest pairing message.
pub const MAX_MESSAGE: usize = 4096;
/// How long either side waits on the other during a pairing.
pub const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(10);

/// Bytes of the checksum that ends an encoded invite.
const CHECKSUM: usize = 6;

/// What an invite line says.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Invite {
    pub v: u32,
    /// The inviter's endpoint id (hex).
    pub id: String,
    /// Which of the inviter's invites this is (random; not derived from the secret, so a
    /// wrong secret for a real invite counts against that invite's attempt budget).
    pub iid: String,
    /// Where the inviter can be reached directly.
    #[serde(default)]
    pub addrs: Vec<String>,
    /// The inviter's home relay, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub relay: Option<String>,
    /// The secret, base64url.
    pub secret: String,
    pub services: Vec<String>,
    /// Expiry, unix seconds.
    pub exp: u64,
    pub uses: u32,
    /// The name the inviter suggests the redeemer call it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nick: Option<String>,
}

impl std::fmt::Debug for Invite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Invite")
            .field("id", &self.id)
            .field("services", &self.services)
            .field("exp", &self.exp)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InviteError {
    #[error("this is not an mcpmesh invite (it should start with {INVITE_PREFIX})")]
    NotAnInvite,
    #[error("this invite is damaged: a character was changed or lost in copying")]
    Damaged,
    #[error("this invite is from a newer mcpmesh (format {0}); update mcpmesh")]
    Version(u32),
}

/// `text` without the quotes around it, however many layers (`'…'`, `"…"`, `` `…` ``, `<…>`).
fn unquote(mut text: &str) -> &str {
    loop {
        let inner = [('\'', '\''), ('"', '"'), ('`', '`'), ('<', '>')]
            .iter()
            .find_map(|&(open, close)| text.strip_prefix(open)?.strip_suffix(close));
        match inner {
            Some(inner) => text = inner,
            None => return text,
        }
    }
}

/// The one-line form of a message: `<prefix><base64url(json ‖ checksum)>`.
pub fn encode_line(prefix: &str, json: &[u8]) -> String {
    let mut bytes = json.to_vec();
    let sum = blake3::hash(&bytes);
    bytes.extend_from_slice(&sum.as_bytes()[..CHECKSUM]);
    format!("{prefix}{}", BASE64URL_NOPAD.encode(&bytes))
}

/// Why a line could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineError {
    /// It does not start with the prefix.
    OtherKind,
    /// It does, but a character was changed or lost.
    Damaged,
}

/// The JSON of a line made by [`encode_line`], read as people paste it: mail and chat clients
/// wrap long lines and quote them, so whitespace anywhere (line breaks included) and
/// surrounding quotes (`'`, `"`, a backtick, `<…>`) are dropped first; the alphabet has none
/// of them.
pub fn decode_line(prefix: &str, line: &str) -> Result<Vec<u8>, LineError> {
    if line.len() > 64 * 1024 {
        return Err(LineError::Damaged);
    }
    let compact: String = line.chars().filter(|c| !c.is_whitespace()).collect();
    let body = unquote(&compact)
        .strip_prefix(prefix)
        .ok_or(LineError::OtherKind)?;
    if body.len() > 8 * 1024 {
        return Err(LineError::Damaged);
    }
    let mut bytes = BASE64URL_NOPAD
        .decode(body.as_bytes())
        .map_err(|_| LineError::Damaged)?;
    let split = bytes
        .len()
        .checked_sub(CHECKSUM)
        .ok_or(LineError::Damaged)?;
    let sum = bytes.split_off(split);
    if blake3::hash(&bytes).as_bytes()[..CHECKSUM] != *sum {
        return Err(LineError::Damaged);
    }
    Ok(bytes)
}

impl Invite {
    /// The one-line form, `mcpmesh-invite:<base64url(json ‖ checksum)>`.
    pub fn encode(&self) -> String {
        encode_line(INVITE_PREFIX, &serde_json::to_vec(self).unwrap_or_default())
    }

    /// Parses a line (see [`decode_line`]), rejecting anything malformed or altered.
    pub fn decode(line: &str) -> Result<Self, InviteError> {
        let json = decode_line(INVITE_PREFIX, line).map_err(|e| match e {
            LineError::OtherKind => InviteError::NotAnInvite,
            LineError::Damaged => InviteError::Damaged,
        })?;
        let invite: Invite = serde_json::from_slice(&json).map_err(|_| InviteError::Damaged)?;
        if invite.v != 1 {
            return Err(InviteError::Version(invite.v));
        }
        let iid_ok = invite.iid.len() == 32 && invite.iid.bytes().all(|b| b.is_ascii_hexdigit());
        if invite.endpoint().is_none() || invite.secret_bytes().is_none() || !iid_ok {
            return Err(InviteError::Damaged);
        }
        Ok(invite)
    }

    pub fn endpoint(&self) -> Option<EndpointId> {
        self.id.parse().ok()
    }

    pub fn secret_bytes(&self) -> Option<[u8; 32]> {
        BASE64URL_NOPAD
            .decode(self.secret.as_bytes())
            .ok()?
            .try_into()
            .ok()
    }
}

/// A fresh 32-byte secret from the OS.
pub fn new_secret() -> std::io::Result<[u8; 32]> {
    let mut secret = [0u8; 32];
    getrandom::fill(&mut secret).map_err(|e| std::io::Error::other(e.to_string()))?;
    Ok(secret)
}

pub fn encode_secret(secret: &[u8; 32]) -> String {
    BASE64URL_NOPAD.encode(secret)
}

/// A fresh invite id: 16 random bytes, hex.
pub fn new_invite_id() -> std::io::Result<String> {
    let mut id = [0u8; 16];
    getrandom::fill(&mut id).map_err(|e| std::io::Error::other(e.to_string()))?;
    Ok(data_encoding::HEXLOWER.encode(&id))
}

/// Proof of the secret, bound to both keys: useless with any other pair of nodes. The
/// redeemer (or joiner) sends it; the inviter (or admin) checks it with [`check_proof`].
pub fn proof(secret: &[u8; 32], inviter: &EndpointId, redeemer: &EndpointId) -> String {
    proof_hash(secret, inviter, redeemer).to_hex().to_string()
}

/// Whether `claimed` is the right [`proof`] (compared in constant time); when not, the reason
/// the refusal gives.
pub fn check_proof(
    secret: &[u8; 32],
    inviter: &EndpointId,
    redeemer: &EndpointId,
    claimed: &str,
) -> Result<(), String> {
    match blake3::Hash::from_hex(claimed) {
        Ok(claimed) if proof_hash(secret, inviter, redeemer) == claimed => Ok(()),
        _ => Err("the invite's secret does not match".to_owned()),
    }
}

fn proof_hash(secret: &[u8; 32], inviter: &EndpointId, redeemer: &EndpointId) -> blake3::Hash {
    let mut h = blake3::Hasher::new_keyed(secret);
    h.update(b"mcpmesh/pair/1 proof");
    h.update(inviter.as_bytes());
    h.update(redeemer.as_bytes());
    h.finalize()
}

/// The three-word code both sides show: the same for both, whoever invited whom.
pub fn code(a: &EndpointId, b: &EndpointId, secret: &[u8; 32]) -> String {
    let (lo, hi) = if a.as_bytes() <= b.as_bytes() {
        (a, b)
    } else {
        (b, a)
    };
    let mut h = blake3::Hasher::new_derive_key("mcpmesh 2026 pairing code");
    h.update(lo.as_bytes());
    h.update(hi.as_bytes());
    h.update(secret);
    let digest = h.finalize();
    let b = digest.as_bytes();
    format!(
        "{}-{}-{}",
        WORDS[b[0] as usize], WORDS[b[1] as usize], WORDS[b[2] as usize]
    )
}

/// The redeemer's message.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PairHello {
    pub pair: u32,
    /// Which invite (its `iid`).
    pub invite: String,
    /// See [`proof`].
    pub proof: String,
    /// The name the redeemer suggests the inviter call it.
    #[serde(default)]
    pub nick: Option<String>,
    /// Where the redeemer can be reached, for the inviter's dial-back entry.
    #[serde(default)]
    pub addrs: Vec<String>,
}

/// The inviter's answers: first to the hello (the proof holds; nothing stored yet), then to
/// the redeemer's `{"commit": true}` (the inviter stored the pairing).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PairReply {
    pub ok: bool,
    #[serde(default)]
    pub services: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl PairReply {
    pub fn refused(reason: impl Into<String>) -> Self {
        PairReply {
            ok: false,
            services: Vec::new(),
            error: Some(reason.into()),
        }
    }
}

/// The redeemer's second message: it stored the inviter (as pending); the inviter may commit.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PairCommit {
    pub commit: bool,
}

const WORDS: [&str; 256] = [
    "able", "acid", "aged", "also", "area", "army", "away", "baby", "back", "ball", "band", "bank",
    "base", "bath", "bear", "beat", "bell", "belt", "best", "bird", "blue", "boat", "body", "bone",
    "book", "boot", "born", "boss", "both", "bowl", "bulk", "burn", "bush", "busy", "cafe", "cake",
    "calm", "camp", "card", "care", "cart", "case", "cash", "cast", "cell", "chat", "chef", "chip",
    "city", "clay", "club", "coal", "coat", "code", "cold", "cook", "cool", "copy", "cord", "corn",
    "cost", "crew", "crop", "cube", "dark", "data", "dawn", "deal", "deep", "deer", "desk", "dial",
    "diet", "disk", "dock", "door", "dose", "down", "draw", "drum", "duck", "dune", "dust", "duty",
    "each", "east", "easy", "edge", "echo", "envy", "epic", "even", "exit", "face", "fact", "fair",
    "farm", "fast", "fern", "film", "fire", "firm", "fish", "five", "flag", "flat", "flow", "foam",
    "fold", "folk", "food", "foot", "fork", "form", "fort", "four", "free", "frog", "fuel", "full",
    "fund", "gain", "game", "gate", "gear", "gift", "glad", "glow", "goal", "gold", "golf", "good",
    "gown", "grab", "gray", "grid", "grow", "gulf", "hair", "half", "hall", "hand", "harp", "hawk",
    "head", "heat", "herb", "hero", "high", "hill", "hint", "home", "hood", "hook", "hope", "horn",
    "host", "hour", "huge", "hunt", "idea", "inch", "iron", "isle", "item", "jade", "jazz", "jump",
    "jury", "keen", "kept", "kick", "kind", "king", "kite", "knee", "knot", "lace", "lake", "lamp",
    "land", "lane", "last", "lava", "lawn", "leaf", "lens", "life", "lift", "lime", "line", "lion",
    "list", "loaf", "lock", "loft", "long", "loop", "lord", "lucky", "lunar", "mail", "main",
    "malt", "mane", "many", "map", "mark", "mast", "math", "maze", "meal", "melt", "menu", "mild",
    "milk", "mill", "mint", "mist", "mode", "moon", "moss", "most", "moth", "much", "mule", "myth",
    "nail", "name", "navy", "neat", "nest", "news", "next", "nice", "nine", "node", "noon", "nose",
    "note", "oak", "oar", "oath", "ocean", "olive", "open", "oval", "oven", "pace", "pack", "page",
    "palm", "park", "path", "peak", "pear",
];

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Invite {
        Invite {
            v: 1,
            id: iroh::SecretKey::generate().public().to_string(),
            iid: "00112233445566778899aabbccddeeff".into(),
            addrs: vec!["127.0.0.1:4433".into()],
            relay: None,
            secret: encode_secret(&[9; 32]),
            services: vec!["notes".into()],
            exp: 1_900_000_000,
            uses: 1,
            nick: Some("alice".into()),
        }
    }

    #[test]
    fn an_invite_round_trips_and_any_changed_character_is_caught() {
        let invite = sample();
        let line = invite.encode();
        assert!(line.starts_with(INVITE_PREFIX));
        assert_eq!(Invite::decode(&line).unwrap(), invite);
        let body_start = INVITE_PREFIX.len();
        for i in (body_start..line.len()).step_by(7) {
            let mut chars: Vec<char> = line.chars().collect();
            chars[i] = if chars[i] == 'A' { 'B' } else { 'A' };
            let tampered: String = chars.into_iter().collect();
            if tampered != line {
                assert!(
                    Invite::decode(&tampered).is_err(),
                    "change at {i} went unnoticed"
                );
            }
        }
        assert_eq!(Invite::decode("hello"), Err(InviteError::NotAnInvite));
        assert_eq!(
            Invite::decode("mcpmesh-invite:!!!"),
            Err(InviteError::Damaged)
        );
    }

    #[test]
    fn a_line_wrapped_or_quoted_invite_decodes_as_delivered() {
        let invite = sample();
        let line = invite.encode();
        let (head, tail) = line.split_at(40);
        let (middle, end) = tail.split_at(30);
        for delivered in [
            format!("{head}\n{middle}\r\n  {end}\n"),
            format!("'{line}'"),
            format!("\"{head} {tail}\""),
            format!("`{line}`"),
            format!("<{head}\n{tail}>"),
            format!("  \"'{line}'\"  "),
        ] {
            assert_eq!(
                Invite::decode(&delivered),
                Ok(invite.clone()),
                "{delivered:?}"
            );
        }
        assert_eq!(
            Invite::decode(&format!("'{line}\"")),
            Err(InviteError::NotAnInvite),
            "quotes that do not pair are not stripped"
        );
    }

    #[test]
    fn the_code_is_the_same_on_both_sides_and_depends_on_the_secret() {
        let (a, b) = (
            iroh::SecretKey::generate().public(),
            iroh::SecretKey::generate().public(),
        );
        assert_eq!(code(&a, &b, &[1; 32]), code(&b, &a, &[1; 32]));
        assert_ne!(code(&a, &b, &[1; 32]), code(&a, &b, &[2; 32]));
        assert_eq!(code(&a, &b, &[1; 32]).split('-').count(), 3);
    }

    #[test]
    fn a_proof_is_bound_to_both_keys() {
        let (a, b, c) = (
            iroh::SecretKey::generate().public(),
            iroh::SecretKey::generate().public(),
            iroh::SecretKey::generate().public(),
        );
        let p = proof(&[3; 32], &a, &b);
        assert_eq!(check_proof(&[3; 32], &a, &b, &p), Ok(()));
        assert!(check_proof(&[3; 32], &a, &c, &p).is_err());
        assert!(check_proof(&[4; 32], &a, &b, &p).is_err());
        assert!(check_proof(&[3; 32], &b, &a, &p).is_err());
        assert!(check_proof(&[3; 32], &a, &b, "zz").is_err());
    }

    #[test]
    fn the_word_list_has_no_duplicates() {
        let mut w = WORDS.to_vec();
        w.sort_unstable();
        w.dedup();
        assert_eq!(w.len(), 256);
    }
}
