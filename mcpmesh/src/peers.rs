//! The peer table: whom this node trusts, by key, and the trust gate over it.

use std::sync::{Arc, RwLock};

use iroh::{EndpointAddr, EndpointId};
use mcpmesh_net::{PeerIdentity, TrustGate};

use crate::config::PeerSpec;

/// Peers trusted statically (`[peers.NAME]`). Swapped whole when the config changes.
#[derive(Debug, Default, Clone)]
pub struct PeerTable {
    peers: Vec<PeerSpec>,
}

impl PeerTable {
    pub fn new(peers: Vec<PeerSpec>) -> Self {
        PeerTable { peers }
    }

    pub fn by_name(&self, name: &str) -> Option<&PeerSpec> {
        self.peers.iter().find(|p| p.name == name)
    }

    pub fn by_id(&self, id: &EndpointId) -> Option<&PeerSpec> {
        self.peers.iter().find(|p| &p.id == id)
    }

    pub fn all(&self) -> &[PeerSpec] {
        &self.peers
    }

    /// The address hints of every peer, for the dialer's address book.
    pub fn address_hints(&self) -> impl Iterator<Item = EndpointAddr> + '_ {
        self.peers.iter().map(|p| {
            p.addrs
                .iter()
                .fold(EndpointAddr::new(p.id), |a, s| a.with_ip_addr(*s))
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
}

impl TrustGate for PeerGate {
    fn resolve(&self, remote: &EndpointId) -> Option<PeerIdentity> {
        let table = self.table.read().unwrap_or_else(|p| p.into_inner());
        table
            .by_id(remote)
            .map(|p| PeerIdentity::new(p.id, p.name.clone()))
    }
}
