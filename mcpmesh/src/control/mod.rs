//! The local control API: newline-delimited JSON-RPC 2.0 over the node's Unix socket.
//!
//! Every verb and `connect` speak it; so can third-party tools (see `docs/control-api.md`).
//! The socket is `0600` and the server checks that the peer runs as the same user.

pub mod client;
pub mod server;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The API version `hello` negotiates.
pub const API_VERSION: u32 = 1;

/// Largest control frame (the session tunnel has its own, larger cap).
pub const MAX_CONTROL_FRAME: usize = 1024 * 1024;

/// Method names.
pub mod methods {
    pub const HELLO: &str = "hello";
    pub const NODE_ID: &str = "node.id";
    pub const NODE_SHUTDOWN: &str = "node.shutdown";
    pub const PEERS_ADD: &str = "peers.add";
    pub const PEERS_LIST: &str = "peers.list";
    pub const SERVICES_LIST: &str = "services.list";
    pub const PEERS_RENAME: &str = "peers.rename";
    pub const PEERS_REMOVE: &str = "peers.remove";
    pub const GRANT: &str = "grant";
    pub const REVOKE: &str = "revoke";
    pub const INVITE: &str = "invite";
    pub const PAIR: &str = "pair";
    pub const SERVICES_UNSERVE: &str = "services.unserve";
    pub const STATUS: &str = "status";
    pub const STATUS_WEB: &str = "status.web";
    /// The audit chain checked against the high-water mark in the node's store, which only
    /// the running node can read.
    pub const AUDIT_VERIFY: &str = "audit.verify";
    pub const WATCH: &str = "watch";
    pub const SERVICES_SERVE: &str = "services.serve";
    pub const SESSION_OPEN: &str = "session.open";
    pub const ORG_CREATE: &str = "org.create";
    pub const ORG_INVITE: &str = "org.invite";
    pub const ORG_JOIN: &str = "org.join";
    pub const ORG_MEMBERS: &str = "org.members";
    pub const ORG_REMOVE: &str = "org.remove";
    pub const ORG_GROUPS: &str = "org.groups";
    pub const ORG_STATUS: &str = "org.status";
    pub const ORG_EXPORT_ROOT: &str = "org.export_root";
    pub const ORG_IMPORT_ROOT: &str = "org.import_root";
}

/// Stable error codes of the control API. The session codes are the mesh error band's.
pub mod codes {
    pub const PARSE: i64 = -32700;
    pub const INVALID_REQUEST: i64 = -32600;
    pub const UNKNOWN_METHOD: i64 = -32601;
    pub const INVALID_PARAMS: i64 = -32602;
    pub const UNKNOWN_SERVICE: i64 = -32054;
    pub const UNREACHABLE: i64 = -32055;
    /// The change would make the config invalid, or the config on disk is invalid.
    pub const CONFIG: i64 = 1001;
    /// Client and node speak different API versions.
    pub const API_MISMATCH: i64 = 1003;
    /// The node is not running and could not be started or reached.
    pub const NODE_UNAVAILABLE: i64 = 1004;
    /// The name or key is already used by another entry.
    pub const CONFLICT: i64 = 1005;
    /// No peer or service by that name.
    pub const NOT_FOUND: i64 = 1006;
    /// The other side refused (an invite that is expired, used up, or does not match).
    pub const REFUSED: i64 = 1007;
    /// The command line is not valid (an unknown verb or flag, a missing or malformed
    /// argument); the CLI's own code, never the node's.
    pub const USAGE: i64 = 1008;
    /// A local operation failed: a file that could not be read or written, a process or
    /// runtime that could not be started.
    pub const LOCAL: i64 = 1009;
    /// A check failed: `doctor` found an error, or `audit verify` found the log damaged (the
    /// report on stdout says which).
    pub const CHECK_FAILED: i64 = 1010;
}

/// An error as the control API reports it: a stable code and a message for people.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{message}")]
pub struct ControlError {
    pub code: i64,
    pub message: String,
}

impl ControlError {
    pub fn new(code: i64, message: impl Into<String>) -> Self {
        ControlError {
            code,
            message: message.into(),
        }
    }

    pub fn invalid_params(message: impl Into<String>) -> Self {
        Self::new(codes::INVALID_PARAMS, message)
    }
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Request {
    #[serde(default)]
    pub jsonrpc: String,
    pub id: Value,
    pub method: String,
    #[serde(default)]
    pub params: Value,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Response {
    pub jsonrpc: String,
    pub id: Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<ControlError>,
}

impl Response {
    pub fn to_line(id: Value, outcome: Result<Value, ControlError>) -> Vec<u8> {
        let (result, error) = match outcome {
            Ok(v) => (Some(v), None),
            Err(e) => (None, Some(e)),
        };
        let mut line = serde_json::to_vec(&Response {
            jsonrpc: "2.0".into(),
            id,
            result,
            error,
        })
        .unwrap_or_default();
        line.push(b'\n');
        line
    }
}

/// Parameters of `session.open`.
#[derive(Debug, Serialize, Deserialize)]
pub struct SessionOpen {
    pub peer: String,
    pub service: String,
    #[serde(default)]
    pub attach: Attach,
}

/// How the opener's side of a session reaches the node after `session.open` is answered.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Attach {
    /// The control connection itself carries the session's bytes.
    #[default]
    Stream,
    /// The opener passes two descriptors (input, output) with `SCM_RIGHTS`; the node reads
    /// and writes them directly, and the control connection only says the opener is alive.
    Fds,
}
