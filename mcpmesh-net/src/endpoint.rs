//! Building the node's iroh endpoint for one of the three network modes.

use std::net::SocketAddr;

use iroh::address_lookup::{AddrFilter, DnsAddressLookup, MemoryLookup, PkarrPublisher};
use iroh::dns::{DnsResolver, NameserverConfig};
use iroh::endpoint::{
    AckFrequencyConfig, BindOpts, PortmapperConfig, QuicTransportConfig, presets,
};
use iroh::{Endpoint, RelayMode, RelayUrl, SecretKey};

/// How the endpoint reaches peers beyond its own addresses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RelayPolicy {
    /// iroh's public relays and address lookup.
    Default,
    /// Self-hosted iroh relays only; no public address lookup.
    Custom(Vec<RelayUrl>),
    /// Hermetic: no relay, no address lookup, no port mapping. Nothing leaves the host unless
    /// a peer's own address says so.
    Disabled,
}

/// A team's own discovery service (iroh's `iroh-dns-server`, or any pkarr relay with a DNS
/// zone): where the node publishes its signed address record, and where it looks peers up by
/// key. Used beside the relay policy's own discovery (none for custom relays).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Discovery {
    /// The pkarr relay the node publishes to (`PUT <url>/<key>`), relay url and direct
    /// addresses both: a team's server is trusted with them, unlike a public one.
    pub pkarr_relay: Option<url::Url>,
    /// The DNS zone peers' records are looked up in (`_iroh.<key>.<origin>` TXT records).
    pub dns_origin: Option<String>,
    /// The nameserver asked for `dns_origin` (UDP), instead of the system's resolver.
    pub dns_nameserver: Option<SocketAddr>,
}

impl Discovery {
    pub fn is_empty(&self) -> bool {
        self.pkarr_relay.is_none() && self.dns_origin.is_none()
    }
}

/// The network part of a node's configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetworkConfig {
    pub relay: RelayPolicy,
    /// Sockets to bind. Empty means iroh's defaults (all interfaces, a random port).
    pub bind: Vec<SocketAddr>,
    /// A team's own discovery service; never used with [`RelayPolicy::Disabled`].
    pub discovery: Discovery,
}

impl NetworkConfig {
    /// One socket on 127.0.0.1 (a port the system picks), no relay, no discovery: an endpoint
    /// that reaches, and is reached by, only this machine's endpoints told its address. What
    /// the tests and benchmarks build their own endpoints with.
    pub fn loopback() -> Self {
        NetworkConfig {
            relay: RelayPolicy::Disabled,
            bind: vec![SocketAddr::from(([127, 0, 0, 1], 0))],
            discovery: Discovery::default(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    #[error("cannot bind {addr}: {reason}")]
    BadBind { addr: SocketAddr, reason: String },
    #[error("cannot start the network endpoint: {0}")]
    Bind(String),
}

/// Sessions one peer may have open on one connection at once.
pub const MAX_STREAMS_PER_CONNECTION: u32 = 1024;
/// A live connection hears from its peer at least this often, so that silence means loss.
const KEEP_ALIVE: std::time::Duration = std::time::Duration::from_secs(1);
/// A connection (or path) silent this long is gone: with keep-alives every second, a peer that
/// vanished mid-call (killed, unplugged) is noticed in about four seconds rather than after
/// QUIC's usual 30, and three lost keep-alives in a row are still forgiven.
const IDLE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(4);

/// Ack-eliciting packets a peer takes in before it must acknowledge them at once (QUIC's ACK
/// frequency extension, which every `noq` endpoint speaks; without it a receiver acknowledges
/// every second one). The transport puts an acknowledgement in a packet only when one is due,
/// so on a session's requests and answers every second packet each way drew an
/// acknowledgement-only datagram of its own, and with it a wakeup of the node it went to: half
/// a datagram and half a wakeup more per call on each node. After four packets instead, the
/// nodes spend 12-15% less CPU per sequential call (docs/performance.md). Out-of-order packets
/// are still acknowledged at once, and fewer packets than this after [`MAX_ACK_DELAY`]. Far
/// higher thresholds (16 was tried) starve a sender whose congestion window stays small while it
/// is not the bound, and a pooled connection's liveness probe must send one packet more than
/// this (`session.rs`).
pub(crate) const ACK_ELICITING_THRESHOLD: u32 = 3;

/// How long a peer may hold back the acknowledgement of fewer packets than it must acknowledge
/// at once (asked with the same extension; 1 ms is the least `noq` takes, its timer
/// granularity). QUIC's usual 25 ms stalled a sender whose congestion window had shrunk to two or
/// three packets: after an 8 MiB answer, the side that received it had lost a few of its own
/// packets to the burst, and 16 requests in flight then went out three packets at a time, each
/// time waiting out the peer's 25 ms for want of a fourth (two bare endpoints: 16 in flight at
/// 0.16-0.28x its rate before the answer in five runs of six; 0.57-0.95x with 1 ms). A peer that
/// has fallen silent is acknowledged after 1 ms instead of 25: one datagram either way.
pub(crate) const MAX_ACK_DELAY: std::time::Duration = std::time::Duration::from_millis(1);

/// Binds an endpoint with `secret` as its identity. `book` is the address source for dialing
/// by key (filled from persisted address hints); it is consulted in every mode.
pub async fn bind(
    secret: SecretKey,
    config: &NetworkConfig,
    alpns: Vec<Vec<u8>>,
    book: MemoryLookup,
) -> Result<Endpoint, EndpointError> {
    bind_on_port(secret, config, None, alpns, book).await
}

/// [`bind`], with the wildcard sockets iroh binds when `config.bind` is empty put on `port`
/// (IPv4 must get it; IPv6 is bound there only if it can be).
pub async fn bind_on_port(
    secret: SecretKey,
    config: &NetworkConfig,
    port: Option<u16>,
    alpns: Vec<Vec<u8>>,
    book: MemoryLookup,
) -> Result<Endpoint, EndpointError> {
    let mut ack = AckFrequencyConfig::default();
    ack.ack_eliciting_threshold(ACK_ELICITING_THRESHOLD.into())
        .reordering_threshold(1u32.into())
        .max_ack_delay(Some(MAX_ACK_DELAY));
    let transport = QuicTransportConfig::builder()
        .ack_frequency_config(Some(ack))
        .max_concurrent_bidi_streams(MAX_STREAMS_PER_CONNECTION.into())
        .max_idle_timeout(IDLE_TIMEOUT.try_into().ok())
        .keep_alive_interval(KEEP_ALIVE)
        .default_path_keep_alive_interval(KEEP_ALIVE)
        .default_path_max_idle_timeout(IDLE_TIMEOUT)
        .build();
    let mut builder = match &config.relay {
        RelayPolicy::Default => Endpoint::builder(presets::N0),
        RelayPolicy::Custom(urls) => {
            Endpoint::builder(presets::Minimal).relay_mode(RelayMode::custom(urls.iter().cloned()))
        }
        RelayPolicy::Disabled => Endpoint::builder(presets::Minimal)
            .relay_mode(RelayMode::Disabled)
            .portmapper_config(PortmapperConfig::Disabled),
    };
    builder = builder
        .secret_key(secret)
        .alpns(alpns)
        .transport_config(transport)
        .address_lookup(book);
    if config.relay != RelayPolicy::Disabled {
        builder = add_discovery(builder, &config.discovery);
    }
    if !config.bind.is_empty() {
        builder = builder.clear_ip_transports();
        for addr in &config.bind {
            builder = builder
                .bind_addr(*addr)
                .map_err(|e| EndpointError::BadBind {
                    addr: *addr,
                    reason: e.to_string(),
                })?;
        }
    } else if let Some(port) = port {
        let v4 = SocketAddr::from((std::net::Ipv4Addr::UNSPECIFIED, port));
        let v6 = SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, port));
        let bad = |addr: SocketAddr| {
            move |e: iroh::endpoint::InvalidSocketAddr| EndpointError::BadBind {
                addr,
                reason: e.to_string(),
            }
        };
        builder = builder
            .clear_ip_transports()
            .bind_addr(v4)
            .map_err(bad(v4))?
            .bind_addr_with_opts(v6, BindOpts::default().set_is_required(false))
            .map_err(bad(v6))?;
    }
    builder
        .bind()
        .await
        .map_err(|e| EndpointError::Bind(e.to_string()))
}

/// How long peers may cache this node's published record, in seconds: a node that moved is
/// found again at most this long after it published its new address (iroh's default is 30).
/// Lookups happen only when a peer dials, so a short one costs the server little.
const PUBLISHED_TTL_SECS: u32 = 5;

/// Adds the team's pkarr publisher and DNS lookup, when configured.
fn add_discovery(
    mut builder: iroh::endpoint::Builder,
    discovery: &Discovery,
) -> iroh::endpoint::Builder {
    if let Some(url) = &discovery.pkarr_relay {
        builder = builder.address_lookup(
            PkarrPublisher::builder(url.clone())
                .addr_filter(AddrFilter::unfiltered())
                .ttl(PUBLISHED_TTL_SECS),
        );
    }
    if let Some(origin) = &discovery.dns_origin {
        let mut lookup = DnsAddressLookup::builder(origin.clone());
        if let Some(server) = discovery.dns_nameserver {
            // Only this server: no system or public resolvers behind it.
            let resolver = DnsResolver::builder()
                .add_nameserver_config(NameserverConfig::udp(server.ip()).with_port(server.port()))
                .disable_fallback()
                .build();
            lookup = lookup.dns_resolver(resolver);
        }
        builder = builder.address_lookup(lookup);
    }
    builder
}

/// The endpoint's dialable direct addresses (relay urls are not included).
pub fn direct_addrs(endpoint: &Endpoint) -> Vec<SocketAddr> {
    let mut addrs: Vec<SocketAddr> = endpoint.addr().ip_addrs().copied().collect();
    if addrs.is_empty() {
        addrs = endpoint.bound_sockets();
    }
    addrs.sort();
    addrs.dedup();
    addrs
}
