//! Principals: the typed names an `allow` list admits, and the set a caller holds.
//!
//! `eid:<hex>` is a key, `peer:<name>` a name *this* node gave a peer, `user:<id>` and
//! `group:<name>` come only from an org roster. A bare `NAME` means `peer:NAME`. Matching is
//! by kind and value, so a peer named `eng` never holds `group:eng`: nothing the other side
//! chooses can add a principal of another kind.

use std::fmt;
use std::str::FromStr;

use mcpmesh_net::PeerIdentity;
use mcpmesh_net::session::valid_service_name;

/// One entry of an `allow` list, or one principal a caller holds.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Principal {
    /// A device key.
    Eid([u8; 32]),
    /// A name this node gave a peer (static or paired).
    Peer(String),
    /// A roster user.
    User(String),
    /// A roster group.
    Group(String),
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PrincipalError {
    #[error(
        "{0:?} has an unknown kind; use a peer name, peer:NAME, eid:HEX, user:ID or group:NAME"
    )]
    UnknownKind(String),
    #[error("{0:?}: an eid is 64 hex characters")]
    BadEid(String),
    #[error("{0:?}: a name is 1-64 letters, digits, '.', '_' or '-'")]
    BadName(String),
}

impl Principal {
    /// The peer-name principal for `name`.
    pub fn peer(name: impl Into<String>) -> Self {
        Principal::Peer(name.into())
    }

    /// The key principal of `id`.
    pub fn eid(id: &iroh::EndpointId) -> Self {
        Principal::Eid(*id.as_bytes())
    }

    /// Whether this entry names the peer called `name` (as `NAME` or `peer:NAME`).
    pub fn is_peer_named(&self, name: &str) -> bool {
        matches!(self, Principal::Peer(n) if n == name)
    }
}

impl FromStr for Principal {
    type Err = PrincipalError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let name = |value: &str, make: fn(String) -> Principal| {
            if valid_service_name(value) {
                Ok(make(value.to_owned()))
            } else {
                Err(PrincipalError::BadName(text.to_owned()))
            }
        };
        match text.split_once(':') {
            None => name(text, Principal::Peer),
            Some(("peer", v)) => name(v, Principal::Peer),
            Some(("user", v)) => name(v, Principal::User),
            Some(("group", v)) => name(v, Principal::Group),
            Some(("eid", hex)) => data_encoding::HEXLOWER_PERMISSIVE
                .decode(hex.as_bytes())
                .ok()
                .and_then(|b| <[u8; 32]>::try_from(b).ok())
                .map(Principal::Eid)
                .ok_or_else(|| PrincipalError::BadEid(text.to_owned())),
            Some(_) => Err(PrincipalError::UnknownKind(text.to_owned())),
        }
    }
}

impl fmt::Display for Principal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Principal::Eid(key) => write!(f, "eid:{}", data_encoding::HEXLOWER.encode(key)),
            Principal::Peer(n) => write!(f, "peer:{n}"),
            Principal::User(u) => write!(f, "user:{u}"),
            Principal::Group(g) => write!(f, "group:{g}"),
        }
    }
}

impl serde::Serialize for Principal {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// A caller's principal set: its key, its peer name here, and (from a roster only) its user
/// and groups. The one definition every authorization site uses.
pub fn principal_set(peer: &PeerIdentity) -> Vec<Principal> {
    let mut set = vec![
        Principal::Eid(peer.endpoint),
        Principal::Peer(peer.name.clone()),
    ];
    set.extend(peer.user_id.iter().cloned().map(Principal::User));
    set.extend(peer.groups.iter().cloned().map(Principal::Group));
    set
}

/// Whether `allow` admits `peer`. An empty list admits nobody (local use only).
pub fn is_allowed(allow: &[Principal], peer: &PeerIdentity) -> bool {
    let held = principal_set(peer);
    allow.iter().any(|a| held.contains(a))
}

/// Whether any of `lists` names the peer `name`: such a name is never given to a new peer,
/// which would otherwise inherit what those entries grant.
pub fn mentions_peer<'a>(lists: impl IntoIterator<Item = &'a [Principal]>, name: &str) -> bool {
    lists
        .into_iter()
        .any(|allow| allow.iter().any(|p| p.is_peer_named(name)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paired(name: &str) -> PeerIdentity {
        PeerIdentity {
            endpoint: [1; 32],
            name: name.into(),
            user_id: None,
            groups: vec![],
        }
    }

    fn parse(list: &[&str]) -> Vec<Principal> {
        list.iter().map(|s| s.parse().unwrap()).collect()
    }

    #[test]
    fn a_bare_name_is_a_peer_name() {
        assert_eq!(
            "bob".parse::<Principal>().unwrap(),
            "peer:bob".parse().unwrap()
        );
        assert!(is_allowed(&parse(&["bob"]), &paired("bob")));
        assert!(is_allowed(&parse(&["peer:bob"]), &paired("bob")));
        assert!(!is_allowed(&parse(&["alice"]), &paired("bob")));
        assert!(!is_allowed(&[], &paired("bob")));
    }

    #[test]
    fn groups_and_users_never_match_a_paired_peer_whatever_its_name() {
        let eng = paired("eng");
        assert!(!is_allowed(&parse(&["group:eng", "user:eng"]), &eng));
        // A roster's group is not a peer name either.
        let member = PeerIdentity {
            groups: vec!["ops".into()],
            user_id: Some("u1".into()),
            ..paired("carol")
        };
        assert!(!is_allowed(&parse(&["ops", "u1"]), &member));
        assert!(is_allowed(&parse(&["group:ops"]), &member));
        assert!(is_allowed(&parse(&["user:u1"]), &member));
    }

    #[test]
    fn an_eid_matches_its_key_in_any_case() {
        let p = paired("bob");
        let hex = "01".repeat(32);
        assert!(is_allowed(&parse(&[&format!("eid:{hex}")]), &p));
        assert!(is_allowed(
            &parse(&[&format!("eid:{}", hex.to_uppercase())]),
            &p
        ));
        assert!(!is_allowed(
            &parse(&[&format!("eid:{}", "02".repeat(32))]),
            &p
        ));
        assert_eq!(
            format!("eid:{hex}")
                .parse::<Principal>()
                .unwrap()
                .to_string(),
            format!("eid:{hex}")
        );
    }

    #[test]
    fn malformed_entries_are_refused() {
        for bad in [
            "foo:bar",
            "eid:abc",
            &format!("eid:{}", "zz".repeat(32)),
            "peer:",
            "group:a b",
            "-bob",
            "",
            "a/b",
        ] {
            assert!(bad.parse::<Principal>().is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn mentions_see_bare_and_prefixed_names_only() {
        let allow = parse(&["eng", "peer:ops", "group:qa", "user:dev"]);
        for name in ["eng", "ops"] {
            assert!(mentions_peer([allow.as_slice()], name));
        }
        for name in ["qa", "dev", "bob"] {
            assert!(!mentions_peer([allow.as_slice()], name));
        }
    }
}
