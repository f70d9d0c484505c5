//! The `socket` backend: a long-running MCP server on a Unix socket, one connection per
//! session, speaking MCP's stdio framing (one JSON value per line) over it.
//!
//! The server cannot learn the caller from its environment, so the node writes the caller's
//! identity into every request's `params._meta["mcpmesh/peer"]` after removing any
//! `mcpmesh/*` member the caller put there (see [`crate::backends::stamp`]), and — for a
//! service with `caller_assertion = true` — the signed caller assertion beside it in
//! `_meta["mcpmesh/caller"]`. That is the only edit; every other byte passes as it was sent.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::assertion::{Issuer, SessionAssertion};
use crate::backends::BackendError;
use crate::backends::session::{ServiceCtx, SessionOptions, held_of};
use crate::backends::stamp::PeerStamp;
use mcpmesh_net::PeerIdentity;
use mcpmesh_net::transport::NdjsonTransport;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::UnixStream;

/// How long connecting to the server's socket may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Connects to `path` once per session.
#[derive(Debug, Clone)]
pub struct SocketBackend {
    pub path: PathBuf,
    pub ctx: ServiceCtx,
    /// Signs the caller assertion each request carries in `_meta["mcpmesh/caller"]`; `None`:
    /// the service did not ask for one.
    pub issuer: Option<Arc<Issuer>>,
}

impl SocketBackend {
    /// Runs one session for `identity` (the gate-resolved caller). Nothing is read before the
    /// connection is made; the caller's frames then flow with only the identity written in.
    pub async fn run_session<R, W>(
        &self,
        identity: PeerIdentity,
        mut transport: NdjsonTransport<R, W>,
        options: &SessionOptions,
    ) -> Result<(), BackendError>
    where
        R: AsyncRead + Unpin + Send,
        W: AsyncWrite + Unpin + Send,
    {
        let Some((who, _permit)) = self.ctx.admit(&identity, options, &mut transport).await else {
            return Ok(());
        };
        let host = self.ctx.host();
        let stream = match tokio::time::timeout(CONNECT_TIMEOUT, UnixStream::connect(&self.path))
            .await
            .unwrap_or_else(|_| Err(std::io::ErrorKind::TimedOut.into()))
        {
            Ok(stream) => stream,
            Err(source) => {
                let e = BackendError::Connect {
                    path: self.path.display().to_string(),
                    source,
                };
                return self.ctx.unreachable(&who, None, &mut transport, e).await;
            }
        };
        let (server_r, server_w) = stream.into_split();
        // The connection closes when both halves are dropped; the server stays up.
        let teardown = |_patience| async {};
        host.pump(
            who,
            None,
            transport,
            server_r,
            server_w,
            options,
            Some(self.stamp(&identity, options)),
            teardown,
        )
        .await;
        Ok(())
    }

    /// The identity the caller's requests get: `mcpmesh/peer`, and the assertion when asked
    /// for (its audience `unix:PATH`, the socket as configured).
    fn stamp(&self, identity: &PeerIdentity, options: &SessionOptions) -> PeerStamp {
        let stamp = PeerStamp::new(identity);
        match &self.issuer {
            Some(issuer) => stamp.with_caller(SessionAssertion::new(
                issuer.clone(),
                format!("unix:{}", self.path.display()),
                self.ctx.service.clone(),
                identity.endpoint,
                held_of(identity, options),
            )),
            None => stamp,
        }
    }
}
