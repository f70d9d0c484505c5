//! Who is on the other end of a connection, as a trust gate resolved it.

use iroh::EndpointId;

/// A remote peer after the trust gate resolved its TLS-verified key. Built before any MCP byte
/// of the peer is read; everything downstream (authorization, the child's identity env, audit)
/// works from this.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerIdentity {
    /// The peer's Ed25519 public key (its EndpointId).
    pub endpoint: [u8; 32],
    /// The nickname this node knows the peer by.
    pub name: String,
    /// The user the peer's device belongs to, when a roster says so.
    pub user_id: Option<String>,
    /// Groups the peer belongs to, when a roster says so.
    pub groups: Vec<String>,
}

impl PeerIdentity {
    /// A peer known only by key and nickname (static trust or pairing).
    pub fn new(endpoint: EndpointId, name: impl Into<String>) -> Self {
        PeerIdentity {
            endpoint: *endpoint.as_bytes(),
            name: name.into(),
            user_id: None,
            groups: Vec::new(),
        }
    }

    /// The endpoint id as 64 lowercase hex characters.
    pub fn endpoint_hex(&self) -> String {
        data_encoding::HEXLOWER.encode(&self.endpoint)
    }

    /// The peer's principal string, `eid:<hex>`.
    pub fn principal(&self) -> String {
        format!("eid:{}", self.endpoint_hex())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn principal_is_eid_and_lowercase_hex() {
        let id = PeerIdentity {
            endpoint: [0xab; 32],
            name: "bob".into(),
            user_id: None,
            groups: vec![],
        };
        assert_eq!(id.principal(), format!("eid:{}", "ab".repeat(32)));
    }
}
