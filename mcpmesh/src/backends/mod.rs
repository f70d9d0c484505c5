//! Backends: what a served service is attached to for one session.
//!
//! `spawn` runs a stdio MCP server once per session; `socket` connects to a long-running one;
//! `url` is the HTTP client of a Streamable HTTP server.
//! All share the session machinery in `session`: admission, the pump, the ledger, audit.

pub mod launcher;
pub mod ledger;
pub mod preflight;
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

impl BackendError {
    /// What the caller is told: what failed, in a few words, naming no command, path or URL
    /// of the owner's machine (the owner's log and audit record keep the full error).
    pub fn caller_message(&self) -> String {
        use std::io::ErrorKind;
        let reason = match self {
            BackendError::Spawn { source, .. } => match source.kind() {
                ErrorKind::NotFound => "its command was not found",
                ErrorKind::PermissionDenied => "its command is not executable",
                _ => "its command failed to start",
            },
            BackendError::NoCommand => "it has no command",
            BackendError::Connect { source, .. } => match source.kind() {
                ErrorKind::NotFound => "its socket does not exist",
                ErrorKind::ConnectionRefused => "nothing listens on its socket",
                ErrorKind::TimedOut => "its server did not accept in time",
                _ => "its server could not be reached",
            },
            BackendError::Upstream { .. } => "its upstream server could not be reached",
        };
        let what = match self {
            BackendError::Spawn { .. } | BackendError::NoCommand => "started",
            _ => "reached",
        };
        format!("the service could not be {what}: {reason}")
    }
}
