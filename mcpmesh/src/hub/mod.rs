//! The hub: every service this node may mount, as one MCP server for a local AI client
//! (`mcpmesh hub`, and the gateway's `/mcp/hub`).
//!
//! - `names`: how merged tools and prompts are named and routed back (pure functions).
//! - `cache`: each service's listing on disk, so lists are answered at start without a session.
//! - `era`: the two eras of MCP (handshake, stateless): envelopes checked, results typed.
//! - `upstream`: one mesh session on which the hub is the MCP client, in its server's era.
//! - `pool`: at most one session per service, opened on first use, reaped when idle.
//! - `server`: the hub as its client sees it.

pub mod cache;
mod era;
pub mod names;
mod outlet;
mod pool;
mod server;
mod upstream;

use std::path::PathBuf;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};

pub use names::Naming;

use crate::paths::Profile;

/// By default, a session unused for this long is closed.
pub const DEFAULT_IDLE: Duration = Duration::from_secs(60);

/// One mounted service: `peer/service`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Target {
    pub peer: String,
    pub service: String,
}

impl Target {
    /// `PEER/SERVICE`, as the command line gives it.
    pub fn parse(text: &str) -> Result<Self, HubError> {
        match text.split_once('/') {
            Some((peer, service))
                if !peer.is_empty() && !service.is_empty() && !service.contains('/') =>
            {
                Ok(Target {
                    peer: peer.to_owned(),
                    service: service.to_owned(),
                })
            }
            _ => Err(HubError::Target(text.to_owned())),
        }
    }

    fn key(&self) -> String {
        self.to_string()
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.peer, self.service)
    }
}

/// How a hub runs.
#[derive(Debug, Clone)]
pub struct HubConfig {
    pub profile: Profile,
    /// The `mcpmesh` executable, to start the node when it is not running.
    pub exe: PathBuf,
    /// The services to present; empty: every one the node may mount.
    pub targets: Vec<Target>,
    /// A session unused this long is closed.
    pub idle: Duration,
    pub naming: Naming,
}

#[derive(Debug, thiserror::Error)]
pub enum HubError {
    #[error("{0:?} is not PEER/SERVICE")]
    Target(String),
    #[error("the node cannot be asked: {0}")]
    Node(String),
    #[error("{0}")]
    Collision(String),
}

/// Serves the hub to one client on `input`/`output` (newline-delimited JSON-RPC) until the
/// client's input ends; then every session the hub opened is closed.
pub async fn serve<R, W>(config: HubConfig, input: R, output: W) -> Result<(), HubError>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    server::run(config, input, output).await
}
