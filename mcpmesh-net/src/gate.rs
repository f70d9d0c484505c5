//! The trust gate: the one question asked of every inbound connection before any MCP byte.

use iroh::EndpointId;

use crate::PeerIdentity;

/// QUIC application close code for a connection refused by the gate (unknown peer).
pub const CLOSE_UNKNOWN_PEER: u32 = 401;
/// QUIC application close code for connections severed by a trust change (unpair, revoke).
pub const CLOSE_SEVERED: u32 = 403;
/// QUIC application close code for a node shutting down.
pub const CLOSE_SHUTDOWN: u32 = 0;

/// Resolves a TLS-verified remote key to a peer identity, or refuses it.
///
/// Implemented by the node's policy (static peers, pairing allowlist, roster); it must be
/// cheap and must not block, because it runs on every accepted connection.
pub trait TrustGate: Send + Sync + 'static {
    fn resolve(&self, remote: &EndpointId) -> Option<PeerIdentity>;

    /// Told of every connection closed because `resolve` refused its key (for the audit
    /// log). Must be as cheap as `resolve`: a flood of strangers calls it once each.
    fn refused(&self, _remote: &EndpointId) {}
}

impl<F> TrustGate for F
where
    F: Fn(&EndpointId) -> Option<PeerIdentity> + Send + Sync + 'static,
{
    fn resolve(&self, remote: &EndpointId) -> Option<PeerIdentity> {
        self(remote)
    }
}
