//! Live connections per peer, so a trust change can sever them at once, and the node can say
//! which path each peer is on.

use std::collections::HashMap;
use std::sync::Mutex;

use iroh::EndpointId;
use iroh::endpoint::{Connection, VarInt};

use crate::path::PathInfo;

/// Every open connection, inbound and outbound, by remote peer.
#[derive(Debug, Default)]
pub struct ConnectionRegistry {
    conns: Mutex<HashMap<EndpointId, Vec<Connection>>>,
}

impl ConnectionRegistry {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn register(&self, conn: &Connection) {
        let mut map = self.lock();
        prune(&mut map);
        map.entry(conn.remote_id()).or_default().push(conn.clone());
    }

    /// Closes every connection with `peer` with `code`; returns how many were open.
    pub fn sever(&self, peer: &EndpointId, code: u32, reason: &[u8]) -> usize {
        let conns = self.lock().remove(peer).unwrap_or_default();
        let mut n = 0;
        for conn in conns {
            if conn.close_reason().is_none() {
                n += 1;
            }
            conn.close(VarInt::from_u32(code), reason);
        }
        n
    }

    /// Closes everything (node shutdown).
    pub fn close_all(&self, code: u32, reason: &[u8]) {
        let all: Vec<_> = self.lock().drain().flat_map(|(_, v)| v).collect();
        for conn in all {
            conn.close(VarInt::from_u32(code), reason);
        }
    }

    /// Peers with at least one open connection.
    pub fn connected_peers(&self) -> Vec<EndpointId> {
        let mut map = self.lock();
        prune(&mut map);
        map.keys().copied().collect()
    }

    /// The path of the newest open connection with `peer`, if any.
    pub fn path(&self, peer: &EndpointId) -> Option<PathInfo> {
        let newest = self.lock().get(peer).and_then(|conns| {
            conns
                .iter()
                .rev()
                .find(|c| c.close_reason().is_none())
                .cloned()
        })?;
        crate::path::selected(&newest)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<EndpointId, Vec<Connection>>> {
        // A panic while holding this lock cannot leave the map inconsistent: take it anyway.
        self.conns.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn prune(map: &mut HashMap<EndpointId, Vec<Connection>>) {
    map.retain(|_, conns| {
        conns.retain(|c| c.close_reason().is_none());
        !conns.is_empty()
    });
}
