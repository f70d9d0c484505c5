//! One short conversation over a fresh QUIC stream, as the node's peer protocols hold them
//! (pairing, joining, roster exchange): NDJSON messages, each read with a deadline.

use std::time::Duration;

use iroh::endpoint::{Connection, RecvStream, SendStream, VarInt};
use iroh::{Endpoint, EndpointId};
use mcpmesh_net::transport::NdjsonTransport;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio::io::AsyncWriteExt;

use crate::control::{ControlError, codes};

/// Addresses a peer offers of itself in a conversation (pairing, joining) worth keeping: the
/// ones that read as socket addresses, at most 16.
pub(super) fn offered_addrs(addrs: &[String]) -> Vec<String> {
    addrs
        .iter()
        .filter(|a| a.parse::<std::net::SocketAddr>().is_ok())
        .take(16)
        .cloned()
        .collect()
}

/// A conversation's stream, one JSON value per line.
pub(super) type Wire = NdjsonTransport<RecvStream, SendStream>;

/// The next message within `limit`; `None` when none came, it was not JSON or the stream
/// ended.
pub(super) async fn next_message(wire: &mut Wire, limit: Duration) -> Option<Value> {
    tokio::time::timeout(limit, wire.recv_value())
        .await
        .ok()
        .and_then(Result::ok)
        .flatten()
}

/// Sends `message`; whether it went.
pub(super) async fn send_message(wire: &mut Wire, message: &impl Serialize) -> bool {
    match serde_json::to_value(message) {
        Ok(v) => wire.send_value(v).await.is_ok(),
        Err(_) => false,
    }
}

/// Ends a conversation this side dialed: its half of the stream first, then, once the other
/// side has read (and acted on) what it was sent and ended its own half, the connection.
pub(super) async fn hang_up(mut wire: Wire, conn: &Connection) {
    let _ = wire.writer_mut().shutdown().await;
    let _ = wire.recv_value().await;
    conn.close(VarInt::from_u32(0), b"done");
}

/// The redeemer's side of an invite's exchange: messages out, the other side's answers back.
pub(super) struct Exchange {
    conn: Connection,
    wire: Wire,
    /// The other side, as errors name it ("the inviter").
    who: &'static str,
}

impl Exchange {
    pub(super) async fn open(
        endpoint: &Endpoint,
        to: EndpointId,
        alpn: &[u8],
        max_message: usize,
        who: &'static str,
    ) -> Result<Self, ControlError> {
        let conn = endpoint.connect(to, alpn).await.map_err(|e| {
            // A node with no live invite does not offer the protocol at all.
            if e.to_string().contains("known protocol") {
                ControlError::new(
                    codes::REFUSED,
                    format!(
                        "{who} is not accepting this invite: it was used up, expired or withdrawn"
                    ),
                )
            } else {
                unreachable(who, &e)
            }
        })?;
        let (send, recv) = conn.open_bi().await.map_err(|e| unreachable(who, &e))?;
        Ok(Exchange {
            conn,
            wire: NdjsonTransport::new(recv, send, max_message),
            who,
        })
    }

    /// Sends `message` and reads the answer.
    pub(super) async fn ask<R: DeserializeOwned>(
        &mut self,
        message: &impl Serialize,
    ) -> Result<R, ControlError> {
        let who = self.who;
        let value = serde_json::to_value(message)
            .map_err(|e| ControlError::invalid_params(e.to_string()))?;
        self.wire
            .send_value(value)
            .await
            .map_err(|e| unreachable(who, &e))?;
        let answer = self
            .wire
            .recv_value()
            .await
            .map_err(|e| unreachable(who, &e))?
            .ok_or_else(|| unreachable(who, &"the connection closed"))?;
        serde_json::from_value(answer).map_err(|e| unreachable(who, &e))
    }

    pub(super) fn close(self) {
        self.conn.close(VarInt::from_u32(0), b"done");
    }
}

fn unreachable(who: &str, e: &dyn std::fmt::Display) -> ControlError {
    ControlError::new(
        codes::UNREACHABLE,
        format!("cannot reach {who} ({e}); is its node running, and the invite still live?"),
    )
}
