//! Principals: the typed names an `allow` list admits, and the set a caller holds.
//!
//! `eid:<hex>` is a key, `peer:<name>` a name *this* node gave a peer, `user:<id>`,
//! `group:<name>` and `org:<name>` (every current member) come only from an org roster. A bare
//! `NAME` means `peer:NAME`. Matching is by kind and value, so a peer named `eng` never holds
//! `group:eng`: nothing the other side chooses can add a principal of another kind.
//!
//! A session reads its caller's set at each request ([`Held`]), from the node's current peer
//! table: a roster or config change applies to sessions already open.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

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
    /// Every current member of the roster's org.
    Org(String),
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PrincipalError {
    #[error(
        "{0:?} has an unknown kind; use a peer name, peer:NAME, eid:HEX, user:ID, group:NAME or org:NAME"
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
            Some(("org", v)) => name(v, Principal::Org),
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
            Principal::Org(o) => write!(f, "org:{o}"),
        }
    }
}

impl serde::Serialize for Principal {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// A caller's principal set: its key, its peer name here, and (from a roster only) its user,
/// its groups and `org` (the org of the roster that names it). The one definition every
/// authorization site uses.
pub fn principal_set(peer: &PeerIdentity, org: Option<&str>) -> Vec<Principal> {
    let mut set = vec![
        Principal::Eid(peer.endpoint),
        Principal::Peer(peer.name.clone()),
    ];
    set.extend(peer.user_id.iter().cloned().map(Principal::User));
    set.extend(peer.groups.iter().cloned().map(Principal::Group));
    if peer.user_id.is_some() {
        set.extend(org.map(|o| Principal::Org(o.to_owned())));
    }
    set
}

/// Whether `allow` admits a caller holding `held`. An empty list admits nobody (local use
/// only).
pub fn is_allowed(allow: &[Principal], held: &[Principal]) -> bool {
    allow.iter().any(|a| held.contains(a))
}

/// Where a session reads its caller's principal set: the node's peer table as it is now.
pub trait PrincipalSource: Send + Sync + fmt::Debug {
    /// The set of the peer with key `endpoint`; `None` when it is no longer trusted.
    fn principals_of(&self, endpoint: &[u8; 32]) -> Option<Arc<[Principal]>>;
}

/// One caller's principal set as its session reads it: fixed (a local caller, a test), or
/// read from a [`PrincipalSource`] at each use, so that a roster or config change applies to
/// the next request of a session already open.
#[derive(Debug, Clone)]
pub struct Held(HeldBy);

#[derive(Debug, Clone)]
enum HeldBy {
    Fixed(Arc<[Principal]>),
    Live {
        source: Arc<dyn PrincipalSource>,
        endpoint: [u8; 32],
    },
}

impl Held {
    pub fn fixed(set: Vec<Principal>) -> Self {
        Held(HeldBy::Fixed(set.into()))
    }

    pub fn live(source: Arc<dyn PrincipalSource>, endpoint: [u8; 32]) -> Self {
        Held(HeldBy::Live { source, endpoint })
    }

    /// The set now: a lock-free clone of a shared set, or a lookup in the live table (empty
    /// for a caller no longer trusted, whose session is being severed).
    pub fn current(&self) -> Arc<[Principal]> {
        match &self.0 {
            HeldBy::Fixed(set) => set.clone(),
            HeldBy::Live { source, endpoint } => source
                .principals_of(endpoint)
                .unwrap_or_else(|| Arc::from(Vec::new())),
        }
    }
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

    fn is_allowed(allow: &[Principal], peer: &PeerIdentity) -> bool {
        super::is_allowed(allow, &principal_set(peer, Some("acme")))
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
    fn only_a_roster_member_holds_its_org_and_no_peer_name_is_an_org() {
        let member = PeerIdentity {
            user_id: Some("u1".into()),
            ..paired("acme")
        };
        assert!(is_allowed(&parse(&["org:acme"]), &member));
        assert!(!is_allowed(&parse(&["org:other"]), &member));
        // A paired peer named after the org, or one outside any roster, holds no org.
        assert!(!is_allowed(&parse(&["org:acme"]), &paired("acme")));
        assert!(
            !super::is_allowed(&parse(&["org:acme"]), &principal_set(&member, None)),
            "no roster, no org"
        );
        assert_eq!(
            "org:acme".parse::<Principal>().unwrap().to_string(),
            "org:acme"
        );
        assert!("org:".parse::<Principal>().is_err());
        assert!("org:a b".parse::<Principal>().is_err());
    }

    #[test]
    fn a_live_set_follows_its_source_and_an_untrusted_caller_holds_nothing() {
        #[derive(Debug)]
        struct Table(std::sync::RwLock<Option<Arc<[Principal]>>>);
        impl PrincipalSource for Table {
            fn principals_of(&self, _: &[u8; 32]) -> Option<Arc<[Principal]>> {
                self.0.read().unwrap().clone()
            }
        }
        let table = Arc::new(Table(std::sync::RwLock::new(Some(
            parse(&["group:eng"]).into(),
        ))));
        let held = Held::live(table.clone(), [1; 32]);
        assert_eq!(&*held.current(), parse(&["group:eng"]).as_slice());
        *table.0.write().unwrap() = Some(parse(&["group:sales"]).into());
        assert_eq!(&*held.current(), parse(&["group:sales"]).as_slice());
        *table.0.write().unwrap() = None;
        assert!(held.current().is_empty());
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
