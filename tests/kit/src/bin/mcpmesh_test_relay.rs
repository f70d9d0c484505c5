//! iroh's own relay server, for the network suite: `mcpmesh-test-relay [IP:PORT]` serves the
//! relay in dev mode (plain HTTP, no QUIC address discovery, no metrics) on the address given
//! (default `127.0.0.1:0`), prints its URL on one line once it accepts connections, and runs
//! until it is interrupted or killed.

#![forbid(unsafe_code)]

use std::io::Write;
use std::net::SocketAddr;

use anyhow::Context;
use iroh_relay::server::{RelayConfig, Server, ServerConfig};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let addr: SocketAddr = match std::env::args().nth(1) {
        Some(a) => a.parse().context("usage: mcpmesh-test-relay [IP:PORT]")?,
        None => SocketAddr::from(([127, 0, 0, 1], 0)),
    };
    let mut config = ServerConfig::default();
    config.relay = Some(RelayConfig::new(addr));
    let server = Server::spawn(config)
        .await
        .context("cannot start the relay server")?;
    let bound = server
        .http_addr()
        .context("the relay server has no HTTP address")?;
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "http://{bound}")?;
        out.flush()?;
    }
    tokio::signal::ctrl_c()
        .await
        .context("cannot wait for a signal")?;
    server.shutdown().await.context("the relay server failed")?;
    Ok(())
}
