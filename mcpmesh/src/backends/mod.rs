//! Backends: what a served service is attached to for one session.
//!
//! `spawn` runs a stdio MCP server once per session; `socket` connects to a long-running one;
//! `url` is the HTTP client of a Streamable HTTP server.
//! All share the session machinery in `session`: admission, the pump, the ledger, audit.

pub mod ledger;
pub mod session;
pub mod socket;
pub mod spawn;
pub mod sse;
pub mod stamp;
pub mod url;

/// Why a backend could not serve a session.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("cannot start `{cmd}`: {source}")]
    Spawn { cmd: String, source: std::io::Error },
    #[error("the service has no command")]
    NoCommand,
    #[error("cannot connect to {path}: {source}")]
    Connect {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot reach {url}: {message}")]
    Upstream { url: String, message: String },
}
