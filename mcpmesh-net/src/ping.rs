//! A small gated ping (ALPN `mcpmesh/ping/1`): tells whether a peer is reachable and how far
//! away it is. Answered only for keys the trust gate resolves, so it reveals nothing to others.

use std::sync::Arc;
use std::time::{Duration, Instant};

use iroh::endpoint::{Connection, VarInt};
use iroh::protocol::{AcceptError, ProtocolHandler};
use iroh::{Endpoint, EndpointId};

use crate::gate::{CLOSE_UNKNOWN_PEER, TrustGate};
use crate::path::Route;

pub const ALPN_PING: &[u8] = b"mcpmesh/ping/1";

const PAYLOAD: &[u8] = b"mcpmesh ping";

#[derive(Debug)]
pub struct PingProtocol<G> {
    gate: Arc<G>,
}

impl<G> PingProtocol<G> {
    pub fn new(gate: Arc<G>) -> Self {
        PingProtocol { gate }
    }
}

impl<G: TrustGate + std::fmt::Debug> ProtocolHandler for PingProtocol<G> {
    async fn accept(&self, conn: Connection) -> Result<(), AcceptError> {
        if self.gate.resolve(&conn.remote_id()).is_none() {
            conn.close(VarInt::from_u32(CLOSE_UNKNOWN_PEER), b"unknown peer");
            self.gate.refused(&conn.remote_id());
            return Ok(());
        }
        while let Ok((mut send, mut recv)) = conn.accept_bi().await {
            let mut buf = [0u8; 16];
            let Ok(Some(n)) = recv.read(&mut buf).await else {
                break;
            };
            if send.write_all(&buf[..n]).await.is_err() || send.finish().is_err() {
                break;
            }
        }
        Ok(())
    }
}

/// What one ping found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PingOutcome {
    /// Answered: the round trip (after the handshake), and the path the answer came on.
    Reachable { rtt: Duration, route: Option<Route> },
    /// Reached, but the peer does not trust this node.
    Refused,
    /// No answer in time.
    Unreachable,
}

/// One ping: the round trip on a fresh connection, after its handshake.
pub async fn ping(endpoint: &Endpoint, peer: EndpointId, limit: Duration) -> Option<Duration> {
    match ping_outcome(endpoint, peer, limit).await {
        PingOutcome::Reachable { rtt, .. } => Some(rtt),
        _ => None,
    }
}

/// One ping, telling a peer that refuses this node from one that cannot be reached.
pub async fn ping_outcome(endpoint: &Endpoint, peer: EndpointId, limit: Duration) -> PingOutcome {
    let attempt = async {
        let conn = endpoint.connect(peer, ALPN_PING).await.ok()?;
        let exchange = async {
            let (mut send, mut recv) = conn.open_bi().await.ok()?;
            let started = Instant::now();
            send.write_all(PAYLOAD).await.ok()?;
            send.finish().ok()?;
            let echo = recv.read_to_end(64).await.ok()?;
            (echo == PAYLOAD).then(|| started.elapsed())
        };
        let outcome = match exchange.await {
            Some(rtt) => PingOutcome::Reachable {
                rtt,
                route: crate::path::selected(&conn).map(|p| p.route),
            },
            None if crate::session::close_reason_code(conn.close_reason().as_ref())
                == crate::errors::ErrorCode::UnknownService =>
            {
                PingOutcome::Refused
            }
            None => PingOutcome::Unreachable,
        };
        conn.close(VarInt::from_u32(0), b"");
        Some(outcome)
    };
    tokio::time::timeout(limit, attempt)
        .await
        .ok()
        .flatten()
        .unwrap_or(PingOutcome::Unreachable)
}
