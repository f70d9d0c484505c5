//! iroh's own DNS server, for the network suite: `mcpmesh-test-dns IP DATA_DIR` serves pkarr
//! over plain HTTP (`http://IP:PORT/pkarr`) and the zone `mcpmesh.test` over UDP DNS on `IP`
//! (both on ports the kernel picks), keeps its signed packets under `DATA_DIR`, prints
//! `pkarr=http://IP:PORT/pkarr dns=IP:PORT` on one line once both listen, and runs until it is
//! interrupted or killed. No HTTPS, no metrics listener, no mainline DHT: nothing leaves `IP`.
//! The server's own debug log goes to stderr: each publish and each lookup, by key.

#![forbid(unsafe_code)]

use std::io::Write;
use std::net::IpAddr;
use std::path::PathBuf;

use anyhow::Context;
use iroh_dns_server::Server;
use iroh_dns_server::config::{Config, MetricsConfig};

/// The zone the suite's nodes publish under and resolve in.
const ORIGIN: &str = "mcpmesh.test";

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let usage = "usage: mcpmesh-test-dns IP DATA_DIR";
    let mut args = std::env::args().skip(1);
    let ip: IpAddr = args.next().context(usage)?.parse().context(usage)?;
    let data_dir = PathBuf::from(args.next().context(usage)?);
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("iroh_dns_server=debug"))
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();

    let mut config = Config::default();
    config.data_dir = Some(data_dir);
    config.https = None;
    config.metrics = Some(MetricsConfig::disabled());
    if let Some(http) = config.http.as_mut() {
        http.port = 0;
        http.bind_addr = Some(ip);
    }
    config.dns.port = 0;
    config.dns.bind_addr = Some(ip);
    config.dns.origins = vec![format!("{ORIGIN}."), ".".to_owned()];
    config.dns.default_soa = format!("ns1.{ORIGIN} hostmaster.{ORIGIN} 0 10800 3600 604800 3600");
    config.dns.rr_ns = Some(format!("ns1.{ORIGIN}."));
    config.dns.rr_a = match ip {
        IpAddr::V4(v4) => Some(v4),
        IpAddr::V6(_) => None,
    };

    let server = Server::bind(config)
        .await
        .map_err(|e| anyhow::anyhow!("cannot start the DNS server: {e:#}"))?;
    let http = server
        .http_addr()
        .context("the DNS server has no HTTP address")?;
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "pkarr=http://{http}/pkarr dns={}", server.dns_addr())?;
        out.flush()?;
    }
    tokio::signal::ctrl_c()
        .await
        .context("cannot wait for a signal")?;
    server
        .shutdown()
        .await
        .map_err(|e| anyhow::anyhow!("the DNS server failed: {e:#}"))?;
    Ok(())
}
