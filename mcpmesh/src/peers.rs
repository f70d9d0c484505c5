//! The peer table: whom this node trusts, by key, and the trust gate over it.
//!
//! Three sources feed it, with one precedence: a key the org roster revokes is refused
//! whatever else trusts it; a roster member holds its user and groups; a static or paired
//! peer keeps the name this node gave it (and a roster member with no such name is known by
//! the name the roster mounts it under).
//!
//! A name with a `.` is the roster's: it is how a member's device is named (`USER.DEVICE`).
//! This node gives no peer such a name any more, and one given by an older version yields to
//! the member whose `USER.DEVICE` it is.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, RwLock};

use iroh::{EndpointAddr, EndpointId, RelayUrl};
use mcpmesh_net::session::valid_service_name;
use mcpmesh_net::{PeerIdentity, TrustGate};

use crate::principal::{Principal, PrincipalSource, principal_set};

/// A name this node may give a static or paired peer: a valid name with no `.`.
pub fn valid_peer_name(name: &str) -> bool {
    valid_service_name(name) && !name.contains('.')
}

/// Renames every peer in `peers` holding a name `claimed` gives another key (a roster
/// member's `USER.DEVICE`, to that device's key): a `.` becomes a `-`, with `-2`, `-3`… when
/// that is taken too. The member then resolves by its name, and the peer stays trusted by key.
pub fn yield_claimed_names(peers: &mut [KnownPeer], claimed: &HashMap<String, EndpointId>) {
    for i in 0..peers.len() {
        if claimed
            .get(&peers[i].name)
            .is_none_or(|owner| *owner == peers[i].id)
        {
            continue;
        }
        let base: String = peers[i].name.replace('.', "-").chars().take(56).collect();
        let taken = |n: &str| claimed.contains_key(n) || peers.iter().any(|p| p.name == n);
        let mut name = base.clone();
        let mut n = 2;
        while taken(&name) {
            name = format!("{base}-{n}");
            n += 1;
        }
        peers[i].name = name;
    }
}

/// Where the node's trust in a peer comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// `[peers.NAME]` in config.
    Static,
    /// A pairing.
    Paired,
    /// The org roster only.
    Roster,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Static => "static",
            Source::Paired => "paired",
            Source::Roster => "roster",
        }
    }
}

/// One trusted peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KnownPeer {
    pub name: String,
    pub id: EndpointId,
    pub addrs: Vec<SocketAddr>,
    pub relay: Option<RelayUrl>,
    /// From the roster only.
    pub user: Option<String>,
    pub groups: Vec<String>,
    /// The org of the roster that names this peer (with its user).
    pub org: Option<String>,
    pub source: Source,
}

impl KnownPeer {
    pub fn new(
        name: impl Into<String>,
        id: EndpointId,
        addrs: Vec<SocketAddr>,
        source: Source,
    ) -> Self {
        KnownPeer {
            name: name.into(),
            id,
            addrs,
            relay: None,
            user: None,
            groups: Vec::new(),
            org: None,
            source,
        }
    }

    /// The principals this peer holds here (see [`principal_set`]).
    pub fn principals(&self) -> Vec<Principal> {
        principal_set(&self.identity(), self.org.as_deref())
    }

    /// The identity the gate resolves this peer to.
    pub fn identity(&self) -> PeerIdentity {
        PeerIdentity {
            endpoint: *self.id.as_bytes(),
            name: self.name.clone(),
            user_id: self.user.clone(),
            groups: self.groups.clone(),
        }
    }
}

/// Every peer this node trusts, and the keys a roster revoked. Swapped whole on any change.
#[derive(Debug, Default, Clone)]
pub struct PeerTable {
    peers: Vec<KnownPeer>,
    revoked: HashSet<EndpointId>,
    /// Each peer's principal set, made once per table: sessions read it at every request.
    held: HashMap<[u8; 32], Arc<[Principal]>>,
}

impl PeerTable {
    pub fn new(peers: Vec<KnownPeer>) -> Self {
        let held = peers
            .iter()
            .map(|p| (*p.id.as_bytes(), p.principals().into()))
            .collect();
        PeerTable {
            peers,
            revoked: HashSet::new(),
            held,
        }
    }

    /// The table with `revoked` keys refused: they leave it, whatever trusted them.
    pub fn with_revoked(mut self, revoked: HashSet<EndpointId>) -> Self {
        self.peers.retain(|p| !revoked.contains(&p.id));
        let gone: HashSet<[u8; 32]> = revoked.iter().map(|r| *r.as_bytes()).collect();
        self.held.retain(|id, _| !gone.contains(id));
        self.revoked = revoked;
        self
    }

    /// The principal set of the peer with key `id`.
    pub fn principals_of(&self, id: &[u8; 32]) -> Option<Arc<[Principal]>> {
        self.held.get(id).cloned()
    }

    pub fn by_name(&self, name: &str) -> Option<&KnownPeer> {
        self.peers.iter().find(|p| p.name == name)
    }

    pub fn by_id(&self, id: &EndpointId) -> Option<&KnownPeer> {
        self.peers.iter().find(|p| &p.id == id)
    }

    pub fn all(&self) -> &[KnownPeer] {
        &self.peers
    }

    pub fn is_revoked(&self, id: &EndpointId) -> bool {
        self.revoked.contains(id)
    }

    /// The address hints of every peer, for the dialer's address book.
    pub fn address_hints(&self) -> impl Iterator<Item = EndpointAddr> + '_ {
        self.peers.iter().map(|p| {
            let addr = p
                .addrs
                .iter()
                .fold(EndpointAddr::new(p.id), |a, s| a.with_ip_addr(*s));
            match &p.relay {
                Some(relay) => addr.with_relay_url(relay.clone()),
                None => addr,
            }
        })
    }
}

/// The trust gate over a live, swappable peer table.
#[derive(Debug, Clone, Default)]
pub struct PeerGate {
    table: Arc<RwLock<PeerTable>>,
}

impl PeerGate {
    pub fn new(table: PeerTable) -> Self {
        PeerGate {
            table: Arc::new(RwLock::new(table)),
        }
    }

    pub fn replace(&self, table: PeerTable) {
        *self.table.write().unwrap_or_else(|p| p.into_inner()) = table;
    }

    pub fn snapshot(&self) -> PeerTable {
        self.table.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn is_revoked(&self, id: &EndpointId) -> bool {
        self.table
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .is_revoked(id)
    }
}

impl PrincipalSource for PeerGate {
    fn principals_of(&self, endpoint: &[u8; 32]) -> Option<Arc<[Principal]>> {
        self.table
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .principals_of(endpoint)
    }
}

impl TrustGate for PeerGate {
    fn resolve(&self, remote: &EndpointId) -> Option<PeerIdentity> {
        let table = self.table.read().unwrap_or_else(|p| p.into_inner());
        table.by_id(remote).map(KnownPeer::identity)
    }
}
