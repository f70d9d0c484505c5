//! A call in flight upstream, as the hub holds it between sending a client's request and
//! answering it, and what its server asks the client meanwhile.

use serde_json::Value;
use tokio::sync::{mpsc, oneshot};

use crate::hub::Target;
use crate::hub::pool::Lease;
use crate::hub::upstream::Answer;

/// A call in flight upstream: its session held, its answer to come, and (bridged) the
/// server's requests to the client during it.
pub(super) struct Call {
    pub(super) lease: Lease,
    pub(super) rx: oneshot::Receiver<Answer>,
    pub(super) asked: Option<mpsc::Receiver<Ask>>,
    pub(super) upstream_id: u64,
    pub(super) target: Target,
    pub(super) method: String,
    /// What a retry must be to resume it (method and name).
    pub(super) bound: String,
    pub(super) token_key: Option<(Target, String)>,
    /// For a handshake-era client over a stateless server: the params to retry with once the
    /// client answered what an `input_required` result asks.
    pub(super) retry: Option<Value>,
    /// Bridged: the capabilities the call's client declared in its envelope.
    pub(super) declared: Value,
}

/// A server's request to the client, during a call.
#[derive(Debug)]
pub(super) struct Ask {
    pub their_id: Value,
    pub method: String,
    pub params: Value,
}
