//! `config.toml`: what the node serves, whom it trusts statically, how it reaches the network.
//!
//! Read with serde and validated into clear errors that name the offending key. Written only
//! through [`ConfigFile`], which edits the document in place (a user's comments and layout
//! survive), validates the result, and replaces the file atomically.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use iroh::{EndpointId, RelayUrl};
use mcpmesh_net::endpoint::{Discovery, NetworkConfig, RelayPolicy};
use mcpmesh_net::session::valid_service_name;
use serde::Deserialize;

mod tools;

pub use tools::{deny_own_tools, grant_own_tools};

use crate::files::write_atomically;
use crate::principal::Principal;
use crate::tool_policy::ToolRule;

/// Sessions a service runs at once unless it says otherwise.
pub const DEFAULT_MAX_SESSIONS: u32 = 4;
/// Requests and session opens per minute per (service, caller) unless configured otherwise
/// (notifications have their own cap, `limits::NOTIFICATIONS_PER_MIN`).
pub const DEFAULT_RATE_PER_MIN: u32 = 600;
const DEFAULT_DIAL_TIMEOUT_SECS: u64 = 10;
/// Outstanding requests per session unless configured otherwise: room for clients that run
/// tool calls concurrently (the official Python SDK's task groups pipeline dozens), while a
/// server is still never flooded.
pub const DEFAULT_IN_FLIGHT: u32 = 64;
const DEFAULT_IDLE_CLOSE_SECS: u64 = 120;
/// How long a `url` service's server may stay silent on a request before it is answered
/// `-32055`.
pub const DEFAULT_REQUEST_TIMEOUT_SECS: u64 = 300;

/// Environment variables the node sets for a child; no config may set them.
pub const RESERVED_ENV_PREFIX: &str = "MCPMESH_";

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub identity: IdentitySection,
    #[serde(default)]
    pub network: NetworkSection,
    #[serde(default)]
    pub limits: LimitsSection,
    #[serde(default)]
    pub audit: AuditSection,
    #[serde(default)]
    pub org: OrgSection,
    #[serde(default)]
    pub telemetry: TelemetrySection,
    #[serde(default)]
    pub services: BTreeMap<String, ServiceConfig>,
    #[serde(default)]
    pub peers: BTreeMap<String, PeerConfig>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IdentitySection {
    /// The name this node suggests to peers.
    pub nickname: Option<String>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RelayMode {
    #[default]
    Default,
    Custom,
    Disabled,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkSection {
    #[serde(default)]
    pub relay_mode: RelayMode,
    #[serde(default)]
    pub relay_urls: Vec<String>,
    /// `"127.0.0.1:0"` or a list of such; empty means all interfaces.
    #[serde(default)]
    pub bind: OneOrMany,
    /// A team's own pkarr relay, where the node publishes its signed addresses:
    /// `"https://dns.team.example/pkarr"`.
    pub pkarr_relay: Option<String>,
    /// The DNS zone peers are looked up in: `"dns.team.example"`.
    pub dns_origin: Option<String>,
    /// The nameserver asked for `dns_origin`, `"IP:PORT"` or `"IP"` (port 53); unset means the
    /// system's resolver.
    pub dns_nameserver: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditSection {
    /// Month files older than this many months are deleted; unset keeps everything.
    pub retain_months: Option<u32>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OrgSection {
    /// How often the node pulls the roster from reachable members, in seconds.
    pub sync_secs: Option<u64>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TelemetrySection {
    /// Where the status page listens from the start, `"127.0.0.1:PORT"` (loopback only);
    /// unset, it opens on an ephemeral loopback port at the first `status --web`.
    pub status: Option<String>,
    /// Where Prometheus scrapes the node's metrics (`GET /metrics`): a loopback address like
    /// `"127.0.0.1:9464"`. Unset: no metrics endpoint.
    pub metrics: Option<String>,
    /// The OTLP/HTTP collector the node sends its traces to, like `"http://127.0.0.1:4318"`
    /// (traces go to its `/v1/traces`; a URL with a path is used as it is). Unset: no traces.
    pub otlp: Option<String>,
}

/// How often a node pulls the roster from reachable members, by default.
pub const DEFAULT_ORG_SYNC_SECS: u64 = 120;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsSection {
    #[serde(default = "default_rate")]
    pub rate_limit_per_min: u32,
    #[serde(default = "default_max_sessions")]
    pub max_sessions: u32,
    #[serde(default = "default_dial_timeout")]
    pub dial_timeout_secs: u64,
    /// Requests one session may have outstanding at once.
    #[serde(default = "default_in_flight")]
    pub max_in_flight: u32,
    /// A connection to a peer with no session for this long is closed.
    #[serde(default = "default_idle_close")]
    pub idle_close_secs: u64,
    /// How long a `url` service's server may stay silent on one request.
    #[serde(default = "default_request_timeout")]
    pub request_timeout_secs: u64,
}

impl Default for LimitsSection {
    fn default() -> Self {
        LimitsSection {
            rate_limit_per_min: DEFAULT_RATE_PER_MIN,
            max_sessions: DEFAULT_MAX_SESSIONS,
            dial_timeout_secs: DEFAULT_DIAL_TIMEOUT_SECS,
            max_in_flight: DEFAULT_IN_FLIGHT,
            idle_close_secs: DEFAULT_IDLE_CLOSE_SECS,
            request_timeout_secs: DEFAULT_REQUEST_TIMEOUT_SECS,
        }
    }
}

fn default_rate() -> u32 {
    DEFAULT_RATE_PER_MIN
}
fn default_max_sessions() -> u32 {
    DEFAULT_MAX_SESSIONS
}
fn default_dial_timeout() -> u64 {
    DEFAULT_DIAL_TIMEOUT_SECS
}
fn default_request_timeout() -> u64 {
    DEFAULT_REQUEST_TIMEOUT_SECS
}

fn default_in_flight() -> u32 {
    DEFAULT_IN_FLIGHT
}
fn default_idle_close() -> u64 {
    DEFAULT_IDLE_CLOSE_SECS
}

/// A string or a list of strings (`run = "python3 srv.py"` or `run = ["python3", "srv.py"]`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany {
    #[default]
    None,
    One(String),
    Many(Vec<String>),
}

impl OneOrMany {
    fn items(&self) -> Vec<String> {
        match self {
            OneOrMany::None => Vec::new(),
            OneOrMany::One(s) => vec![s.clone()],
            OneOrMany::Many(v) => v.clone(),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServiceConfig {
    /// The command spawned once per session. A string is split like a shell would.
    #[serde(default)]
    pub run: OneOrMany,
    /// Or: the Unix socket of a long-running MCP server, one connection per session.
    pub socket: Option<PathBuf>,
    /// Or: a Streamable HTTP MCP server, one upstream session per mesh session.
    pub url: Option<String>,
    /// Headers sent to `url`; `${VAR}` in a value is the node's environment variable VAR.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Whether `url` sends a signed caller assertion with every request (default: yes).
    pub caller_assertion: Option<bool>,
    /// The header it goes in (default `Mcpmesh-Caller`).
    pub caller_header: Option<String>,
    /// `url`: the server requires an OAuth grant (`mcpmesh auth NAME` makes it); how the node
    /// registers as its client.
    pub oauth: Option<OAuthConfig>,
    /// Principals admitted: a peer name (bare or `peer:NAME`), `eid:<hex>`, `user:<id>` or
    /// `group:<name>` (the last two only from a roster). Empty: nobody.
    #[serde(default)]
    pub allow: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// What the service is for, one line, shown to the peers it admits.
    pub description: Option<String>,
    pub cwd: Option<PathBuf>,
    pub max_sessions: Option<u32>,
    pub rate_limit_per_min: Option<u32>,
    pub max_in_flight: Option<u32>,
    pub request_timeout_secs: Option<u64>,
    /// Per-tool rules (`[[services.NAME.tools]]`); none: every tool.
    #[serde(default)]
    pub tools: Vec<ToolRuleConfig>,
}

/// How a service's node registers as a client, from `[services.NAME.oauth]`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientSettings {
    /// A client registered beforehand with the authorization server.
    pub client_id: Option<String>,
    pub client_secret: Option<String>,
    /// A Client ID Metadata Document the user serves over HTTPS: its URL is the client id,
    /// where the authorization server supports that.
    pub client_metadata_url: Option<String>,
    /// The scopes to ask for; otherwise the server's challenge or metadata decides.
    pub scopes: Vec<String>,
    /// The node acts for itself, not for a user: tokens come from the client-credentials
    /// grant (with `client_id` and `client_secret`), no browser, and are asked for again
    /// when they lapse.
    pub client_credentials: bool,
    /// A PKCS#8 PEM private key (P-256 or Ed25519, a `0600` file) the client authenticates
    /// with instead of a secret (`private_key_jwt`, RFC 7523); client credentials only.
    pub client_key: Option<std::path::PathBuf>,
}

/// `[services.NAME.oauth]` as written: every key optional (an empty table says the service
/// requires a grant, with the client registered dynamically).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OAuthConfig {
    pub client_id: Option<String>,
    pub client_secret: Option<String>,
    /// A Client ID Metadata Document the user serves over HTTPS.
    pub client_metadata_url: Option<String>,
    #[serde(default)]
    pub scopes: Vec<String>,
    /// The client-credentials grant (machine to machine) instead of a user's authorization.
    #[serde(default)]
    pub client_credentials: bool,
    /// With `client_credentials`: a PKCS#8 PEM private key file (P-256 or Ed25519, `0600`)
    /// the client authenticates with (`private_key_jwt`) instead of `client_secret`.
    pub client_key: Option<PathBuf>,
}

/// One `[[services.NAME.tools]]` rule as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolRuleConfig {
    /// The principals the rule is about.
    #[serde(default)]
    pub who: Vec<String>,
    /// Tool names or globs (`*`, `?`) they may use.
    #[serde(default)]
    pub allow: Vec<String>,
    /// Tool names or globs they may not use, whatever another rule allows.
    #[serde(default)]
    pub deny: Vec<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeerConfig {
    pub id: String,
    #[serde(default)]
    pub addrs: Vec<String>,
}

/// A config error, with the file and the key it is about.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Invalid { path: String, message: String },
    /// Another user's file, or one others may write: never read.
    #[error(transparent)]
    Untrusted(#[from] crate::files::Untrusted),
    #[error("cannot write {path}: {source}")]
    Write {
        path: String,
        source: std::io::Error,
    },
}

/// What a service's sessions are attached to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackendSpec {
    /// `run`: a command spawned once per session.
    Run(Vec<String>),
    /// `socket`: a Unix socket, connected once per session.
    Socket {
        path: PathBuf,
        /// Whether requests also carry the signed caller assertion in `_meta`.
        caller_assertion: bool,
    },
    /// `url`: a Streamable HTTP server, with header templates (values may hold secrets).
    Url {
        url: String,
        headers: BTreeMap<String, String>,
        /// The header the signed caller assertion goes in; `None`: none is sent.
        caller_header: Option<String>,
        /// The server requires an OAuth grant, and how the node registers as its client.
        oauth: Option<ClientSettings>,
    },
}

impl BackendSpec {
    /// `run`, `socket` or `url`.
    pub fn kind(&self) -> &'static str {
        match self {
            BackendSpec::Run(_) => "run",
            BackendSpec::Socket { .. } => "socket",
            BackendSpec::Url { .. } => "url",
        }
    }

    /// The config key and its value, for display (`run` as a list, `socket` as a path).
    pub fn describe(&self) -> (&'static str, serde_json::Value) {
        match self {
            BackendSpec::Run(cmd) => ("run", serde_json::json!(cmd)),
            BackendSpec::Socket { path, .. } => ("socket", serde_json::json!(path)),
            // Never the headers: they may carry tokens.
            BackendSpec::Url { url, .. } => ("url", serde_json::json!(url)),
        }
    }
}

/// A service as the node runs it, after validation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceSpec {
    pub name: String,
    pub backend: BackendSpec,
    pub allow: Vec<Principal>,
    pub env: BTreeMap<String, String>,
    /// What the service is for, shown in the catalog of the peers it admits.
    pub description: Option<String>,
    pub cwd: Option<PathBuf>,
    pub max_sessions: u32,
    pub rate_limit_per_min: u32,
    pub max_in_flight: u32,
    /// How long a `url` service's server may stay silent on one request.
    pub request_timeout: Duration,
    /// Per-tool rules; none: every tool.
    pub tools: Vec<ToolRule>,
}

/// A statically trusted peer, after validation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerSpec {
    pub name: String,
    pub id: EndpointId,
    pub addrs: Vec<SocketAddr>,
}

/// The validated configuration the daemon runs on.
#[derive(Debug, Clone)]
pub struct Settings {
    pub nickname: Option<String>,
    pub network: NetworkConfig,
    pub rate_limit_per_min: u32,
    pub dial_timeout: Duration,
    pub idle_close: Duration,
    pub services: Vec<ServiceSpec>,
    pub peers: Vec<PeerSpec>,
    pub audit_retain_months: Option<u32>,
    /// How often the roster is pulled from reachable members.
    pub org_sync: Duration,
    /// Where the status page listens from the start (`[telemetry] status`).
    pub status_listen: Option<SocketAddr>,
    /// Where the metrics endpoint listens, when there is one.
    pub metrics: Option<SocketAddr>,
    /// Where traces are sent (the collector's traces URL), when they are.
    pub otlp: Option<url::Url>,
}

/// The `[network]` keys of a team's own discovery service: only with relays (a hermetic node
/// never publishes or looks anything up), a resolver only for a zone to resolve.
fn validate_discovery(network: &NetworkSection) -> Result<Discovery, String> {
    if network.relay_mode == RelayMode::Disabled {
        let keys = [
            ("pkarr_relay", network.pkarr_relay.is_some()),
            ("dns_origin", network.dns_origin.is_some()),
            ("dns_nameserver", network.dns_nameserver.is_some()),
        ];
        if let Some((key, _)) = keys.iter().find(|(_, set)| *set) {
            return Err(format!(
                "network.{key}: relay_mode = \"disabled\" is hermetic (no discovery): use relay_mode = \"custom\" or remove the key"
            ));
        }
    }
    let pkarr_relay = match &network.pkarr_relay {
        None => None,
        Some(u) => {
            let url = url::Url::parse(u)
                .map_err(|e| format!("network.pkarr_relay: {u:?} is not a url: {e}"))?;
            if !matches!(url.scheme(), "http" | "https") || url.host().is_none() {
                return Err(format!(
                    "network.pkarr_relay: {u:?} is not an http(s) url like \"https://dns.example.org/pkarr\""
                ));
            }
            Some(url)
        }
    };
    let dns_origin = match &network.dns_origin {
        None => None,
        Some(o) => {
            let name = o.strip_suffix('.').unwrap_or(o);
            let label_ok = |l: &str| {
                !l.is_empty()
                    && l.len() <= 63
                    && l.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            };
            if name.len() > 253 || !name.split('.').all(label_ok) {
                return Err(format!(
                    "network.dns_origin: {o:?} is not a domain name like \"dns.example.org\""
                ));
            }
            Some(name.to_owned())
        }
    };
    let dns_nameserver = match &network.dns_nameserver {
        None => None,
        Some(_) if dns_origin.is_none() => {
            return Err(
                "network.dns_nameserver: set dns_origin too (the zone to look peers up in)".into(),
            );
        }
        Some(n) => Some(
            n.parse::<SocketAddr>()
                .or_else(|_| n.parse::<std::net::IpAddr>().map(|ip| SocketAddr::new(ip, 53)))
                .map_err(|_| {
                    format!(
                        "network.dns_nameserver: {n:?} is not an address like \"10.0.0.1:53\" or \"10.0.0.1\""
                    )
                })?,
        ),
    };
    Ok(Discovery {
        pkarr_relay,
        dns_origin,
        dns_nameserver,
    })
}

impl Config {
    /// Parses and validates config text; `origin` names the file in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Settings, ConfigError> {
        let config: Config = toml::from_str(text).map_err(|e| ConfigError::Invalid {
            path: origin.to_owned(),
            message: e.to_string().trim_end().to_owned(),
        })?;
        config.validate().map_err(|message| ConfigError::Invalid {
            path: origin.to_owned(),
            message,
        })
    }

    fn validate(&self) -> Result<Settings, String> {
        let network = validate_network(&self.network)?;
        let metrics = self
            .telemetry
            .metrics
            .as_deref()
            .map(|a| {
                // No token (Prometheus exporters' convention), so not reachable from elsewhere.
                loopback_listen("telemetry.metrics", a, "the metrics endpoint has no token")
            })
            .transpose()?;
        let otlp = self
            .telemetry
            .otlp
            .as_deref()
            .map(otlp_traces_url)
            .transpose()?;
        check_limits(&self.limits)?;
        let status_listen = self
            .telemetry
            .status
            .as_deref()
            .map(|a| {
                loopback_listen(
                    "telemetry.status",
                    a,
                    "the status page is served on this machine only",
                )
            })
            .transpose()?;
        let mut services = Vec::new();
        for (name, svc) in &self.services {
            services.push(validate_service(name, svc, &self.limits)?);
        }
        let peers = validate_peers(&self.peers)?;
        Ok(Settings {
            nickname: self.identity.nickname.clone(),
            network,
            rate_limit_per_min: self.limits.rate_limit_per_min,
            dial_timeout: Duration::from_secs(self.limits.dial_timeout_secs.max(1)),
            idle_close: Duration::from_secs(self.limits.idle_close_secs.max(1)),
            services,
            peers,
            audit_retain_months: self.audit.retain_months,
            org_sync: Duration::from_secs(
                self.org.sync_secs.unwrap_or(DEFAULT_ORG_SYNC_SECS).max(1),
            ),
            status_listen,
            metrics,
            otlp,
        })
    }
}

/// `[network]`: the relays, the addresses to bind and the discovery service.
fn validate_network(network: &NetworkSection) -> Result<NetworkConfig, String> {
    let relay = relay_policy(network)?;
    let bind = network
        .bind
        .items()
        .iter()
        .map(|b| {
            b.parse::<SocketAddr>()
                .map_err(|_| format!("network.bind: {b:?} is not an address like \"127.0.0.1:0\""))
        })
        .collect::<Result<_, _>>()?;
    let discovery = validate_discovery(network)?;
    Ok(NetworkConfig {
        relay,
        bind,
        discovery,
    })
}

/// `relay_mode` and, for a custom one, its `relay_urls`.
fn relay_policy(network: &NetworkSection) -> Result<RelayPolicy, String> {
    Ok(match network.relay_mode {
        RelayMode::Default => RelayPolicy::Default,
        RelayMode::Disabled => RelayPolicy::Disabled,
        RelayMode::Custom => {
            if network.relay_urls.is_empty() {
                return Err(
                    "network.relay_urls: relay_mode = \"custom\" needs at least one relay url"
                        .into(),
                );
            }
            let urls = network
                .relay_urls
                .iter()
                .map(|u| {
                    u.parse::<RelayUrl>()
                        .map_err(|e| format!("network.relay_urls: {u:?} is not a relay url: {e}"))
                })
                .collect::<Result<_, _>>()?;
            RelayPolicy::Custom(urls)
        }
    })
}

/// The node-wide `[limits]` that have no sensible zero.
fn check_limits(limits: &LimitsSection) -> Result<(), String> {
    if limits.max_sessions == 0 {
        return Err("limits.max_sessions: must be at least 1".into());
    }
    if limits.rate_limit_per_min == 0 {
        return Err("limits.rate_limit_per_min: must be at least 1".into());
    }
    Ok(())
}

/// `[peers.NAME]`, each checked, and no key configured under two names.
fn validate_peers(configured: &BTreeMap<String, PeerConfig>) -> Result<Vec<PeerSpec>, String> {
    let mut peers = Vec::new();
    for (name, peer) in configured {
        peers.push(validate_peer(name, peer)?);
    }
    for (i, a) in peers.iter().enumerate() {
        if let Some(b) = peers[..i].iter().find(|b| b.id == a.id) {
            return Err(format!(
                "peers.{}.id: the same key is already configured as peers.{}",
                a.name, b.name
            ));
        }
    }
    Ok(peers)
}

/// `[telemetry] otlp` as the URL traces are posted to: an `http` or `https` collector, whose
/// `/v1/traces` is meant when the URL names no path (the OTLP/HTTP convention).
fn otlp_traces_url(text: &str) -> Result<url::Url, String> {
    let example = "a collector's URL like \"http://127.0.0.1:4318\"";
    let mut url = url::Url::parse(text)
        .map_err(|e| format!("telemetry.otlp: {text:?} is not {example} ({e})"))?;
    if !matches!(url.scheme(), "http" | "https") || url.host().is_none() {
        return Err(format!("telemetry.otlp: {text:?} is not {example}"));
    }
    // The URL is shown by `status` and logged; a credential belongs in a header.
    if !url.username().is_empty() || url.password().is_some() {
        return Err("telemetry.otlp: the URL carries a user or password; put the collector's credentials in OTEL_EXPORTER_OTLP_HEADERS in the node's environment instead".into());
    }
    if url.path() == "/" {
        url.set_path("/v1/traces");
    }
    Ok(url)
}

/// The `key` of `[telemetry]`: a loopback address to listen on, and nothing else (`why` says
/// why, in the error).
fn loopback_listen(key: &str, text: &str, why: &str) -> Result<SocketAddr, String> {
    let addr = text.parse::<SocketAddr>().map_err(|_| {
        format!("{key}: {text:?} is not a loopback address like \"127.0.0.1:9464\"")
    })?;
    if !addr.ip().is_loopback() {
        return Err(format!(
            "{key}: {addr} is not a loopback address; {why}, so it listens on this machine only (\"127.0.0.1:{port}\" or \"[::1]:{port}\")",
            port = addr.port()
        ));
    }
    Ok(addr)
}

fn validate_service(
    name: &str,
    svc: &ServiceConfig,
    limits: &LimitsSection,
) -> Result<ServiceSpec, String> {
    if !valid_service_name(name) {
        return Err(format!(
            "services.{name}: a service name is 1-64 letters, digits, '.', '_' or '-'"
        ));
    }
    let cmd = run_command(name, svc)?;
    check_backend_keys(name, svc, cmd.is_some())?;
    let backend = backend_spec(name, svc, cmd)?;
    check_env(name, &svc.env)?;
    let allow = svc
        .allow
        .iter()
        .map(|a| a.parse().map_err(|e| format!("services.{name}.allow: {e}")))
        .collect::<Result<_, _>>()?;
    if let Some(text) = &svc.description {
        crate::catalog::valid_description(text)
            .map_err(|e| format!("services.{name}.description: {e}"))?;
    }
    let limits = service_limits(name, svc, limits)?;
    let tools = svc
        .tools
        .iter()
        .enumerate()
        .map(|(i, rule)| {
            validate_tool_rule(rule).map_err(|e| format!("services.{name}.tools[{i}]: {e}"))
        })
        .collect::<Result<_, _>>()?;
    Ok(ServiceSpec {
        tools,
        max_in_flight: limits.max_in_flight,
        request_timeout: limits.request_timeout,
        name: name.to_owned(),
        backend,
        allow,
        env: svc.env.clone(),
        description: svc.description.clone().filter(|d| !d.is_empty()),
        cwd: svc.cwd.clone(),
        max_sessions: limits.max_sessions,
        rate_limit_per_min: limits.rate_limit_per_min,
    })
}

/// `run` as a command line: a string is split like a shell would.
fn run_command(name: &str, svc: &ServiceConfig) -> Result<Option<Vec<String>>, String> {
    Ok(match &svc.run {
        OneOrMany::One(line) => Some(
            shlex::split(line)
                .ok_or_else(|| format!("services.{name}.run: unbalanced quotes in {line:?}"))?,
        ),
        OneOrMany::Many(v) => Some(v.clone()),
        OneOrMany::None => None,
    })
}

/// One backend at most, and the keys that belong to another kind of backend absent.
fn check_backend_keys(name: &str, svc: &ServiceConfig, has_run: bool) -> Result<(), String> {
    let given = [has_run, svc.socket.is_some(), svc.url.is_some()];
    if given.iter().filter(|g| **g).count() > 1 {
        return Err(format!(
            "services.{name}: give one of run, socket or url, not several"
        ));
    }
    if !svc.headers.is_empty() && svc.url.is_none() {
        return Err(format!(
            "services.{name}.headers: only a url service sends headers"
        ));
    }
    if svc.url.is_none() && svc.oauth.is_some() {
        return Err(format!(
            "services.{name}.oauth: only a url service is an OAuth client"
        ));
    }
    if svc.oauth.is_some()
        && svc
            .headers
            .keys()
            .any(|h| h.eq_ignore_ascii_case("authorization"))
    {
        return Err(format!(
            "services.{name}.oauth: the grant's token goes in Authorization, which headers also sets; remove one"
        ));
    }
    if svc.url.is_none() && svc.caller_header.is_some() {
        return Err(format!(
            "services.{name}.caller_header: only a url service sends headers"
        ));
    }
    if has_run && svc.caller_assertion.is_some() {
        return Err(format!(
            "services.{name}.caller_assertion: only url and socket services get one (a run service reads the caller from its environment)"
        ));
    }
    Ok(())
}

/// What the service's sessions are attached to: `cmd` (its `run`), its socket or its url.
fn backend_spec(
    name: &str,
    svc: &ServiceConfig,
    cmd: Option<Vec<String>>,
) -> Result<BackendSpec, String> {
    if let Some(cmd) = cmd {
        if cmd.first().is_none_or(|c| c.is_empty()) {
            return Err(format!("services.{name}.run: must name a command"));
        }
        Ok(BackendSpec::Run(cmd))
    } else if let Some(path) = &svc.socket {
        if !path.is_absolute() {
            return Err(format!(
                "services.{name}.socket: must be an absolute path, not {}",
                path.display()
            ));
        }
        Ok(BackendSpec::Socket {
            path: path.clone(),
            caller_assertion: svc.caller_assertion.unwrap_or(false),
        })
    } else if let Some(url) = &svc.url {
        url_backend(name, url, svc)
    } else {
        Err(format!(
            "services.{name}.run: must name a command (or give socket = \"/path/to/server.sock\" or url = \"http://…\")"
        ))
    }
}

/// A `url` service: the URL, its header templates, the caller assertion's header and the
/// OAuth client settings.
fn url_backend(name: &str, url: &str, svc: &ServiceConfig) -> Result<BackendSpec, String> {
    validate_url(url).map_err(|e| format!("services.{name}.url: {e}"))?;
    for (header, template) in &svc.headers {
        reqwest::header::HeaderName::from_bytes(header.as_bytes())
            .map_err(|_| format!("services.{name}.headers: {header:?} is not a header name"))?;
        crate::template::expand(template, |_| Some(String::new()))
            .map_err(|e| format!("services.{name}.headers.{header}: {e}"))?;
    }
    Ok(BackendSpec::Url {
        url: url.to_owned(),
        headers: svc.headers.clone(),
        caller_header: caller_header(svc).map_err(|e| format!("services.{name}.{e}"))?,
        oauth: svc
            .oauth
            .as_ref()
            .map(oauth_settings)
            .transpose()
            .map_err(|e| format!("services.{name}.oauth.{e}"))?,
    })
}

/// The service's `env`: names a child can be given, none of them the node's own.
fn check_env(name: &str, env: &BTreeMap<String, String>) -> Result<(), String> {
    if let Some(key) = env.keys().find(|k| k.starts_with(RESERVED_ENV_PREFIX)) {
        return Err(format!(
            "services.{name}.env.{key}: variables starting with {RESERVED_ENV_PREFIX} are set by the node"
        ));
    }
    if let Some(bad) = env.keys().find(|k| k.is_empty() || k.contains(['=', '\0'])) {
        return Err(format!(
            "services.{name}.env: {bad:?} is not a variable name"
        ));
    }
    Ok(())
}

/// A service's own limits: each one it sets, or the node's `[limits]`.
struct ServiceLimits {
    max_sessions: u32,
    rate_limit_per_min: u32,
    max_in_flight: u32,
    request_timeout: Duration,
}

fn service_limits(
    name: &str,
    svc: &ServiceConfig,
    limits: &LimitsSection,
) -> Result<ServiceLimits, String> {
    let max_sessions = svc.max_sessions.unwrap_or(limits.max_sessions);
    if max_sessions == 0 {
        return Err(format!("services.{name}.max_sessions: must be at least 1"));
    }
    let rate = svc.rate_limit_per_min.unwrap_or(limits.rate_limit_per_min);
    if rate == 0 {
        return Err(format!(
            "services.{name}.rate_limit_per_min: must be at least 1"
        ));
    }
    let max_in_flight = svc.max_in_flight.unwrap_or(limits.max_in_flight);
    if max_in_flight == 0 {
        return Err(format!("services.{name}.max_in_flight: must be at least 1"));
    }
    let timeout = svc
        .request_timeout_secs
        .unwrap_or(limits.request_timeout_secs);
    if timeout == 0 {
        return Err(format!(
            "services.{name}.request_timeout_secs: must be at least 1"
        ));
    }
    Ok(ServiceLimits {
        max_sessions,
        rate_limit_per_min: rate,
        max_in_flight,
        request_timeout: Duration::from_secs(timeout),
    })
}

fn validate_tool_rule(rule: &ToolRuleConfig) -> Result<ToolRule, String> {
    if rule.who.is_empty() {
        return Err(
            "who: name at least one principal (peer:NAME, eid:HEX, user:ID or group:NAME)".into(),
        );
    }
    let who = rule
        .who
        .iter()
        .map(|w| w.parse().map_err(|e| format!("who: {e}")))
        .collect::<Result<_, String>>()?;
    if rule.allow.is_empty() && rule.deny.is_empty() {
        return Err("give allow or deny (or both): a list of tool names or globs".into());
    }
    for (key, patterns) in [("allow", &rule.allow), ("deny", &rule.deny)] {
        if patterns.iter().any(|p| p.trim().is_empty()) {
            return Err(format!("{key}: a tool pattern cannot be empty"));
        }
    }
    Ok(ToolRule {
        who,
        allow: rule.allow.clone(),
        deny: rule.deny.clone(),
    })
}

/// An `http://` or `https://` URL with a host.
pub fn validate_url(url: &str) -> Result<reqwest::Url, String> {
    let parsed = reqwest::Url::parse(url).map_err(|e| format!("{url:?} is not a URL: {e}"))?;
    if !matches!(parsed.scheme(), "http" | "https") || parsed.host().is_none() {
        return Err(format!("{url:?} is not an http:// or https:// URL"));
    }
    Ok(parsed)
}

fn validate_peer(name: &str, peer: &PeerConfig) -> Result<PeerSpec, String> {
    if !valid_service_name(name) {
        return Err(format!(
            "peers.{name}: a peer name is 1-64 letters, digits, '.', '_' or '-'"
        ));
    }
    let id = parse_endpoint_id(&peer.id)
        .ok_or_else(|| format!("peers.{name}.id: not an endpoint id (64 hex characters)"))?;
    let addrs = peer
        .addrs
        .iter()
        .map(|a| {
            a.parse::<SocketAddr>().map_err(|_| {
                format!("peers.{name}.addrs: {a:?} is not an address like \"192.0.2.7:4433\"")
            })
        })
        .collect::<Result<_, _>>()?;
    Ok(PeerSpec {
        name: name.to_owned(),
        id,
        addrs,
    })
}

/// An endpoint id as `[peers]` and the CLI take it: [`crate::endpoint_id::parse`].
pub use crate::endpoint_id::parse as parse_endpoint_id;

/// The config file of a profile: read, and edited in place.
#[derive(Debug, Clone)]
pub struct ConfigFile {
    path: PathBuf,
    /// The digest of the text last loaded or written whole (shared by clones), so that
    /// `doctor` can tell a hand edit the node has not read.
    loaded: Arc<Mutex<Option<String>>>,
}

impl ConfigFile {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        ConfigFile {
            path: path.into(),
            loaded: Default::default(),
        }
    }

    /// The digest of the text this handle last loaded or wrote (`None`: neither yet).
    pub fn loaded_digest(&self) -> Option<String> {
        self.loaded
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The digest of the file as it is on disk now.
    pub fn digest_on_disk(&self) -> Result<String, ConfigError> {
        Ok(digest(&self.read_text()?))
    }

    fn loaded(&self, text: &str) {
        *self.loaded.lock().unwrap_or_else(|p| p.into_inner()) = Some(digest(text));
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file's text; empty when there is no file yet (every setting has a default). Read
    /// from the very file checked to be trusted ([`crate::files::Rule::Trusted`]).
    pub fn read_text(&self) -> Result<String, ConfigError> {
        use std::io::Read;
        let Some(mut file) = crate::files::open_checked(&self.path, crate::files::Rule::Trusted)?
        else {
            return Ok(String::new());
        };
        let mut text = String::new();
        file.read_to_string(&mut text)
            .map_err(|source| ConfigError::Read {
                path: self.shown(),
                source,
            })?;
        Ok(text)
    }

    pub fn load(&self) -> Result<Settings, ConfigError> {
        let text = self.read_text()?;
        let settings = Config::parse(&text, &self.shown())?;
        self.loaded(&text);
        Ok(settings)
    }

    /// Applies `change` to the document, validates the result and replaces the file
    /// atomically. Nothing is written when the result would be invalid. A running node edits
    /// on its writer thread ([`crate::disk`]).
    pub fn edit(
        &self,
        change: impl FnOnce(&mut toml_edit::DocumentMut) -> Result<(), String>,
    ) -> Result<Settings, ConfigError> {
        debug_assert!(
            crate::disk::may_write_here(),
            "config.toml is edited on an async runtime's thread: run the edit on the node's Disk"
        );
        let text = self.read_text()?;
        let mut doc: toml_edit::DocumentMut =
            text.parse()
                .map_err(|e: toml_edit::TomlError| ConfigError::Invalid {
                    path: self.shown(),
                    message: e.to_string(),
                })?;
        change(&mut doc).map_err(|message| ConfigError::Invalid {
            path: self.shown(),
            message,
        })?;
        let new_text = doc.to_string();
        let settings = Config::parse(&new_text, &self.shown())?;
        write_atomically(&self.path, new_text.as_bytes()).map_err(|source| ConfigError::Write {
            path: self.shown(),
            source,
        })?;
        // A hand edit made since the last load is in `text`, and now applied with the rest.
        self.loaded(&new_text);
        Ok(settings)
    }

    fn shown(&self) -> String {
        self.path.display().to_string()
    }
}

/// A config text's digest (BLAKE3, hex).
fn digest(text: &str) -> String {
    blake3::hash(text.as_bytes()).to_hex().to_string()
}

/// Sets `[peers.NAME]`.
pub fn set_peer(
    doc: &mut toml_edit::DocumentMut,
    name: &str,
    id: &EndpointId,
    addrs: &[SocketAddr],
) -> Result<(), String> {
    let peers = table(doc, "peers")?;
    let mut entry = toml_edit::Table::new();
    entry["id"] = toml_edit::value(id.to_string());
    if !addrs.is_empty() {
        let list: toml_edit::Array = addrs.iter().map(|a| a.to_string()).collect();
        entry["addrs"] = toml_edit::value(list);
    }
    peers[name] = toml_edit::Item::Table(entry);
    Ok(())
}

/// Sets (or, with `None` or an empty text, removes) the description of the service `name`.
pub fn set_description(
    doc: &mut toml_edit::DocumentMut,
    name: &str,
    description: Option<&str>,
) -> Result<(), String> {
    let entry = table(doc, "services")?
        .get_mut(name)
        .and_then(toml_edit::Item::as_table_like_mut)
        .ok_or_else(|| format!("no service named {name:?}"))?;
    match description.filter(|d| !d.is_empty()) {
        Some(text) => {
            crate::catalog::valid_description(text).map_err(|e| format!("description: {e}"))?;
            entry.insert("description", toml_edit::value(text));
        }
        None => {
            entry.remove("description");
        }
    }
    Ok(())
}

/// A `[services.NAME.oauth]` table, checked.
pub fn oauth_settings(oauth: &OAuthConfig) -> Result<ClientSettings, String> {
    if let Some(url) = &oauth.client_metadata_url {
        let parsed = reqwest::Url::parse(url)
            .map_err(|e| format!("client_metadata_url: {url:?} is not a URL: {e}"))?;
        if parsed.scheme() != "https" || parsed.path().trim_matches('/').is_empty() {
            return Err(format!(
                "client_metadata_url: {url:?} must be an https:// URL with a path (the document you serve)"
            ));
        }
    }
    if oauth.client_secret.is_some() && oauth.client_id.is_none() {
        return Err("client_secret: given without client_id".into());
    }
    if oauth.client_key.is_some() && (oauth.client_id.is_none() || !oauth.client_credentials) {
        return Err("client_key: goes with client_id and client_credentials = true".into());
    }
    if oauth.client_key.is_some() && oauth.client_secret.is_some() {
        return Err("client_key: the client authenticates with a key or a secret, not both".into());
    }
    if oauth.client_credentials && oauth.client_secret.is_none() && oauth.client_key.is_none() {
        return Err(
            "client_credentials: needs the client_id it was registered with, and its client_secret or client_key".into(),
        );
    }
    if let Some(bad) = oauth
        .scopes
        .iter()
        .find(|s| s.is_empty() || s.contains(char::is_whitespace))
    {
        return Err(format!("scopes: {bad:?} is not one scope"));
    }
    Ok(ClientSettings {
        client_id: oauth.client_id.clone(),
        client_secret: oauth.client_secret.clone(),
        client_metadata_url: oauth.client_metadata_url.clone(),
        scopes: oauth.scopes.clone(),
        client_credentials: oauth.client_credentials,
        client_key: oauth.client_key.clone(),
    })
}

/// `[services.NAME.oauth]` as `set_service` writes it: the keys `settings` gives.
fn oauth_table(settings: &ClientSettings) -> toml_edit::Table {
    let mut table = toml_edit::Table::new();
    let keys = [
        ("client_id", &settings.client_id),
        ("client_secret", &settings.client_secret),
        ("client_metadata_url", &settings.client_metadata_url),
    ];
    for (key, value) in keys {
        if let Some(value) = value {
            table.insert(key, toml_edit::value(value.as_str()));
        }
    }
    if settings.client_credentials {
        table.insert("client_credentials", toml_edit::value(true));
    }
    if let Some(key) = &settings.client_key {
        table.insert(
            "client_key",
            toml_edit::value(key.to_string_lossy().as_ref()),
        );
    }
    if !settings.scopes.is_empty() {
        table.insert(
            "scopes",
            toml_edit::value(settings.scopes.iter().collect::<toml_edit::Array>()),
        );
    }
    table
}

/// The header a `url` service's caller assertion goes in, `None` when it is turned off.
pub fn caller_header(svc: &ServiceConfig) -> Result<Option<String>, String> {
    match (svc.caller_assertion, &svc.caller_header) {
        (Some(false), Some(_)) => Err(
            "caller_header: names the header of a caller assertion turned off (caller_assertion = false)"
                .to_owned(),
        ),
        (Some(false), None) => Ok(None),
        (_, name) => {
            let name = name.as_deref().unwrap_or(crate::assertion::DEFAULT_HEADER);
            valid_caller_header(name, &svc.headers).map(|()| Some(name.to_owned()))
        }
    }
}

/// A header name the assertion may go in: a valid one that `headers` does not also set.
pub fn valid_caller_header(name: &str, headers: &BTreeMap<String, String>) -> Result<(), String> {
    reqwest::header::HeaderName::from_bytes(name.as_bytes())
        .map_err(|_| format!("caller_header: {name:?} is not a header name"))?;
    if headers.keys().any(|h| h.eq_ignore_ascii_case(name)) {
        return Err(format!(
            "caller_header: {name:?} is also set in headers; the assertion must not be overwritten"
        ));
    }
    Ok(())
}

/// Serves `[services.NAME]` with `backend`. An existing entry is updated in place: its
/// backend (and `max_sessions`, if given) change, `allow` gains the new principals, and
/// everything else — grants already made, `env`, `cwd`, limits — stays.
pub fn set_service(
    doc: &mut toml_edit::DocumentMut,
    name: &str,
    backend: &BackendSpec,
    allow: &[String],
    max_sessions: Option<u32>,
) -> Result<(), String> {
    let entry = table(doc, "services")?
        .entry(name)
        .or_insert_with(|| toml_edit::Item::Table(toml_edit::Table::new()))
        .as_table_like_mut()
        .ok_or_else(|| format!("services.{name}: expected a table"))?;
    write_backend(entry, backend);
    if let Some(n) = max_sessions {
        entry.insert("max_sessions", toml_edit::value(i64::from(n)));
    }
    if entry.get("allow").is_none() {
        entry.insert("allow", toml_edit::value(toml_edit::Array::new()));
    }
    for entry in allow {
        let principal: Principal = entry
            .parse()
            .map_err(|e| format!("services.{name}.allow: {e}"))?;
        push_allow(doc, name, &principal, entry)?;
    }
    Ok(())
}

/// Every key a backend writes in its service's table.
const BACKEND_KEYS: [&str; 7] = [
    "run",
    "socket",
    "url",
    "headers",
    "caller_assertion",
    "caller_header",
    "oauth",
];

/// Drops every backend key but `kept` (which the backend then writes in its place).
fn drop_backend_keys(entry: &mut dyn toml_edit::TableLike, kept: &str) {
    for key in BACKEND_KEYS.iter().filter(|key| **key != kept) {
        entry.remove(key);
    }
}

/// Writes `backend`'s keys into a service's entry and removes those of the other kinds, so
/// the entry names one backend.
fn write_backend(entry: &mut dyn toml_edit::TableLike, backend: &BackendSpec) {
    match backend {
        BackendSpec::Run(cmd) => {
            drop_backend_keys(entry, "run");
            entry.insert(
                "run",
                toml_edit::value(cmd.iter().collect::<toml_edit::Array>()),
            );
        }
        BackendSpec::Socket {
            path,
            caller_assertion,
        } => {
            drop_backend_keys(entry, "socket");
            entry.insert("socket", toml_edit::value(path.to_string_lossy().as_ref()));
            if *caller_assertion {
                entry.insert("caller_assertion", toml_edit::value(true));
            }
        }
        BackendSpec::Url {
            url,
            headers,
            caller_header,
            oauth,
        } => write_url_backend(
            entry,
            url,
            headers,
            caller_header.as_deref(),
            oauth.as_ref(),
        ),
    }
}

/// A `url` backend's keys: `oauth`, `url`, the caller assertion's header (written only where
/// it departs from the default) and `headers`.
fn write_url_backend(
    entry: &mut dyn toml_edit::TableLike,
    url: &str,
    headers: &BTreeMap<String, String>,
    caller_header: Option<&str>,
    oauth: Option<&ClientSettings>,
) {
    entry.remove("run");
    entry.remove("socket");
    match oauth {
        Some(settings) => {
            entry.insert("oauth", toml_edit::Item::Table(oauth_table(settings)));
        }
        None => {
            entry.remove("oauth");
        }
    }
    entry.insert("url", toml_edit::value(url));
    entry.remove("caller_assertion");
    entry.remove("caller_header");
    match caller_header {
        None => {
            entry.insert("caller_assertion", toml_edit::value(false));
        }
        Some(crate::assertion::DEFAULT_HEADER) => {}
        Some(other) => {
            entry.insert("caller_header", toml_edit::value(other));
        }
    }
    if headers.is_empty() {
        entry.remove("headers");
    } else {
        let mut table = toml_edit::InlineTable::new();
        for (k, v) in headers {
            table.insert(k, v.as_str().into());
        }
        entry.insert("headers", toml_edit::value(table));
    }
}

/// Sets `env` in `[services.NAME] env` (the service's other variables stay).
pub fn set_env(
    doc: &mut toml_edit::DocumentMut,
    name: &str,
    env: &BTreeMap<String, String>,
) -> Result<(), String> {
    if env.is_empty() {
        return Ok(());
    }
    let entry = table(doc, "services")?
        .get_mut(name)
        .and_then(toml_edit::Item::as_table_like_mut)
        .ok_or_else(|| format!("services.{name}: no such service"))?;
    let vars = entry
        .entry("env")
        .or_insert(toml_edit::value(toml_edit::InlineTable::new()))
        .as_table_like_mut()
        .ok_or_else(|| format!("services.{name}.env: expected a table"))?;
    for (key, value) in env {
        vars.insert(key, toml_edit::value(value.as_str()));
    }
    Ok(())
}

/// Removes `[services.NAME]`; `Ok(false)` if there was none.
pub fn remove_service(doc: &mut toml_edit::DocumentMut, name: &str) -> Result<bool, String> {
    Ok(table(doc, "services")?.remove(name).is_some())
}

/// Removes `[peers.NAME]`; `Ok(false)` if there was none.
pub fn remove_peer(doc: &mut toml_edit::DocumentMut, name: &str) -> Result<bool, String> {
    Ok(table(doc, "peers")?.remove(name).is_some())
}

/// Renames `[peers.OLD]` to `[peers.NEW]`, keeping its contents.
pub fn rename_peer(doc: &mut toml_edit::DocumentMut, old: &str, new: &str) -> Result<bool, String> {
    let peers = table(doc, "peers")?;
    match peers.remove(old) {
        Some(item) => {
            peers.insert(new, item);
            Ok(true)
        }
        None => Ok(false),
    }
}

/// The principal an allow entry of the document names, if it is one.
fn entry_principal(v: &toml_edit::Value) -> Option<Principal> {
    v.as_str()?.parse().ok()
}

/// Adds `principal` to `[services.NAME] allow` (unless an entry already names it).
pub fn add_allow(
    doc: &mut toml_edit::DocumentMut,
    service: &str,
    principal: &Principal,
) -> Result<(), String> {
    push_allow(doc, service, principal, &principal.to_string())
}

/// Adds `principal`, spelled `written` (as the user gave it), unless an entry names it.
fn push_allow(
    doc: &mut toml_edit::DocumentMut,
    service: &str,
    principal: &Principal,
    written: &str,
) -> Result<(), String> {
    let list = allow_list(doc, service)?;
    if !list
        .iter()
        .any(|v| entry_principal(v).as_ref() == Some(principal))
    {
        list.push(written);
    }
    Ok(())
}

/// Removes every entry naming one of `principals` (in any spelling: `bob` and `peer:bob`
/// alike) from `[services.NAME] allow`; returns how many.
pub fn remove_allow(
    doc: &mut toml_edit::DocumentMut,
    service: &str,
    principals: &[Principal],
) -> Result<usize, String> {
    let list = allow_list(doc, service)?;
    let before = list.len();
    list.retain(|v| entry_principal(v).is_none_or(|p| !principals.contains(&p)));
    Ok(before - list.len())
}

/// Renames the peer `old` to `new` in every service's allow list, keeping each entry's
/// spelling (`old` becomes `new`, `peer:old` becomes `peer:new`).
pub fn rename_allow(doc: &mut toml_edit::DocumentMut, old: &str, new: &str) -> Result<(), String> {
    let names: Vec<String> = table(doc, "services")?
        .iter()
        .map(|(k, _)| k.to_owned())
        .collect();
    for service in names {
        let list = allow_list(doc, &service)?;
        for v in list.iter_mut() {
            let renamed = match v.as_str() {
                Some(s) if s == old => new.to_owned(),
                Some(s) if s.strip_prefix("peer:") == Some(old) => format!("peer:{new}"),
                _ => continue,
            };
            *v = toml_edit::Value::from(renamed);
        }
    }
    Ok(())
}

/// Removes `principals` from every service's allow list (a peer is gone).
pub fn remove_allow_everywhere(
    doc: &mut toml_edit::DocumentMut,
    principals: &[Principal],
) -> Result<(), String> {
    let names: Vec<String> = table(doc, "services")?
        .iter()
        .map(|(k, _)| k.to_owned())
        .collect();
    for service in names {
        remove_allow(doc, &service, principals)?;
    }
    Ok(())
}

fn allow_list<'a>(
    doc: &'a mut toml_edit::DocumentMut,
    service: &str,
) -> Result<&'a mut toml_edit::Array, String> {
    let entry = table(doc, "services")?
        .get_mut(service)
        .and_then(toml_edit::Item::as_table_like_mut)
        .ok_or_else(|| format!("services.{service}: no such service"))?;
    if entry.get("allow").is_none() {
        entry.insert("allow", toml_edit::value(toml_edit::Array::new()));
    }
    entry
        .get_mut("allow")
        .and_then(toml_edit::Item::as_array_mut)
        .ok_or_else(|| format!("services.{service}.allow: expected a list"))
}

/// The `[key]` table, created if absent.
fn table<'a>(
    doc: &'a mut toml_edit::DocumentMut,
    key: &str,
) -> Result<&'a mut toml_edit::Table, String> {
    doc.as_table_mut()
        .entry(key)
        .or_insert_with(|| {
            let mut t = toml_edit::Table::new();
            t.set_implicit(true);
            toml_edit::Item::Table(t)
        })
        .as_table_mut()
        .ok_or_else(|| {
            format!("{key}: mcpmesh edits only [{key}.NAME] sections; rewrite {key} that way")
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The README's example config (the `toml` block that opens with `[identity]`).
    fn readme_example() -> String {
        let readme = include_str!("../../../README.md");
        let block = readme
            .split("```toml\n")
            .skip(1)
            .filter_map(|b| b.split_once("\n```").map(|(b, _)| b))
            .find(|b| b.starts_with("[identity]"))
            .expect("the README has an example config");
        block.to_owned()
    }

    #[test]
    fn the_readmes_config_example_parses_as_it_is_and_with_every_setting_uncommented() {
        let example = readme_example();
        let uncommented: String = example
            .lines()
            .map(|line| {
                let setting = line.strip_prefix("# ").filter(|rest| {
                    rest.split_once(" = ").is_some_and(|(key, _)| {
                        !key.is_empty()
                            && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                    })
                });
                format!("{}\n", setting.unwrap_or(line))
            })
            .collect();
        assert_ne!(example, uncommented, "the example has commented settings");
        for (what, text) in [("as it is", &example), ("uncommented", &uncommented)] {
            if let Err(e) = Config::parse(text, "README.md") {
                panic!("the README's example, {what}, does not load: {e}\n{text}");
            }
        }
    }

    fn some_id() -> EndpointId {
        iroh::SecretKey::generate().public()
    }

    fn hermetic() -> String {
        HERMETIC.replace("PEER_ID", &some_id().to_string())
    }

    const HERMETIC: &str = r#"
[identity]
nickname = "alice"

[network]
relay_mode = "disabled"
bind = "127.0.0.1:0"

[services.notes]
run = "python3 -m notes --dir '/tmp/my notes'"
allow = ["bob"]
max_sessions = 2

[peers.bob]
id = "PEER_ID"
addrs = ["127.0.0.1:4433"]
"#;

    #[test]
    fn a_hermetic_config_parses() {
        let s = Config::parse(&hermetic(), "config.toml").unwrap();
        assert_eq!(s.network.relay, RelayPolicy::Disabled);
        assert_eq!(s.network.bind, vec!["127.0.0.1:0".parse().unwrap()]);
        assert_eq!(
            s.services[0].backend,
            BackendSpec::Run(
                ["python3", "-m", "notes", "--dir", "/tmp/my notes"]
                    .map(String::from)
                    .to_vec()
            )
        );
        assert_eq!(s.services[0].max_sessions, 2);
        assert_eq!(s.peers[0].addrs.len(), 1);
    }

    fn error_of(text: &str) -> String {
        Config::parse(text, "config.toml").unwrap_err().to_string()
    }

    #[test]
    fn the_status_page_address_is_loopback_or_an_error_naming_the_key() {
        let s = Config::parse("[telemetry]\nstatus = \"127.0.0.1:9465\"\n", "c").unwrap();
        assert_eq!(s.status_listen, Some("127.0.0.1:9465".parse().unwrap()));
        assert_eq!(Config::parse("", "c").unwrap().status_listen, None);
        for bad in ["0.0.0.0:9465", "192.168.1.2:80", "localhost:9465", "9465"] {
            let e = error_of(&format!("[telemetry]\nstatus = \"{bad}\"\n"));
            assert!(
                e.contains("telemetry.status") && e.contains("loopback"),
                "{e}"
            );
        }
    }

    #[test]
    fn a_teams_discovery_server_is_read_with_custom_relays_and_refused_when_hermetic() {
        let custom =
            "[network]\nrelay_mode = \"custom\"\nrelay_urls = [\"http://10.0.0.1:3340\"]\n";
        let s = Config::parse(
            &format!(
                "{custom}pkarr_relay = \"http://10.0.0.1:8080/pkarr\"\ndns_origin = \"dns.team.example.\"\ndns_nameserver = \"10.0.0.1\"\n"
            ),
            "config.toml",
        )
        .unwrap();
        let d = &s.network.discovery;
        assert_eq!(
            d.pkarr_relay.as_ref().map(|u| u.as_str()),
            Some("http://10.0.0.1:8080/pkarr")
        );
        assert_eq!(d.dns_origin.as_deref(), Some("dns.team.example"));
        assert_eq!(d.dns_nameserver, Some("10.0.0.1:53".parse().unwrap()));
        // None by default, in every mode.
        assert!(
            Config::parse(custom, "c")
                .unwrap()
                .network
                .discovery
                .is_empty()
        );
        assert!(Config::parse("", "c").unwrap().network.discovery.is_empty());

        let hermetic = "[network]\nrelay_mode = \"disabled\"\n";
        for key in [
            "pkarr_relay = \"http://a/pkarr\"",
            "dns_origin = \"a.example\"",
        ] {
            let e = error_of(&format!("{hermetic}{key}\n"));
            assert!(e.contains("hermetic (no discovery)"), "{e}");
            assert!(
                e.contains(&format!("network.{}", &key[..key.find(' ').unwrap()])),
                "{e}"
            );
        }
        let e = error_of(&format!("{custom}pkarr_relay = \"ftp://a/pkarr\"\n"));
        assert!(e.contains("network.pkarr_relay"), "{e}");
        let e = error_of(&format!("{custom}pkarr_relay = \"not a url\"\n"));
        assert!(e.contains("network.pkarr_relay"), "{e}");
        let e = error_of(&format!("{custom}dns_origin = \"bad name.example\"\n"));
        assert!(e.contains("network.dns_origin"), "{e}");
        let e = error_of(&format!("{custom}dns_origin = \"\"\n"));
        assert!(e.contains("network.dns_origin"), "{e}");
        let e = error_of(&format!("{custom}dns_nameserver = \"10.0.0.1\"\n"));
        assert!(e.contains("network.dns_nameserver: set dns_origin"), "{e}");
        let e = error_of(&format!(
            "{custom}dns_origin = \"a.example\"\ndns_nameserver = \"ns1\"\n"
        ));
        assert!(e.contains("network.dns_nameserver"), "{e}");
    }

    #[test]
    fn a_url_service_asserts_its_caller_unless_turned_off() {
        let header_of = |extra: &str| {
            let text = format!("[services.x]\nurl = \"http://127.0.0.1:9/mcp\"\n{extra}");
            match &Config::parse(&text, "c").unwrap().services[0].backend {
                BackendSpec::Url { caller_header, .. } => caller_header.clone(),
                other => panic!("{other:?}"),
            }
        };
        assert_eq!(header_of("").as_deref(), Some("Mcpmesh-Caller"));
        assert_eq!(
            header_of("caller_assertion = true\n").as_deref(),
            Some("Mcpmesh-Caller")
        );
        assert_eq!(
            header_of("caller_header = \"X-Caller\"\n").as_deref(),
            Some("X-Caller")
        );
        assert_eq!(header_of("caller_assertion = false\n"), None);
        let url = "[services.x]\nurl = \"http://h/\"\n";
        for (extra, says) in [
            ("caller_header = \"bad name\"\n", "not a header name"),
            (
                "caller_assertion = false\ncaller_header = \"X\"\n",
                "turned off",
            ),
            (
                "headers = { mcpmesh-caller = \"forged\" }\n",
                "also set in headers",
            ),
            (
                "caller_header = \"X\"\nheaders = { x = \"forged\" }\n",
                "also set in headers",
            ),
        ] {
            let e = error_of(&format!("{url}{extra}"));
            assert!(
                e.contains("services.x.caller_header") && e.contains(says),
                "{e}"
            );
        }
        let e = error_of("[services.x]\nrun = \"a\"\ncaller_assertion = true\n");
        assert!(
            e.contains("services.x.caller_assertion: only url and socket"),
            "{e}"
        );
        let e = error_of("[services.x]\nsocket = \"/s\"\ncaller_header = \"X\"\n");
        assert!(
            e.contains("services.x.caller_header: only a url service"),
            "{e}"
        );
        let socket = |extra: &str| {
            let text = format!("[services.x]\nsocket = \"/s\"\n{extra}");
            Config::parse(&text, "c").unwrap().services[0]
                .backend
                .clone()
        };
        let asked = |caller_assertion| BackendSpec::Socket {
            path: "/s".into(),
            caller_assertion,
        };
        assert_eq!(socket(""), asked(false), "a socket service asks for one");
        assert_eq!(socket("caller_assertion = true\n"), asked(true));
    }

    #[test]
    fn an_oauth_table_makes_a_url_service_an_oauth_client_and_bad_keys_are_named() {
        let oauth_of = |extra: &str| {
            let text = format!("[services.x]\nurl = \"http://127.0.0.1:9/mcp\"\n{extra}");
            match &Config::parse(&text, "c").unwrap().services[0].backend {
                BackendSpec::Url { oauth, .. } => oauth.clone(),
                other => panic!("{other:?}"),
            }
        };
        assert_eq!(oauth_of(""), None);
        assert_eq!(oauth_of("[services.x.oauth]\n"), Some(Default::default()));
        let set = oauth_of(
            "[services.x.oauth]\nclient_id = \"c\"\nclient_secret = \"s\"\nscopes = [\"a\", \"b\"]\n",
        )
        .unwrap();
        assert_eq!(set.client_id.as_deref(), Some("c"));
        assert_eq!(set.scopes, ["a", "b"]);
        let machine = oauth_of(
            "[services.x.oauth]\nclient_id = \"c\"\nclient_credentials = true\nclient_key = \"/k.pem\"\n",
        )
        .unwrap();
        assert!(machine.client_credentials);
        assert_eq!(machine.client_key.as_deref(), Some(Path::new("/k.pem")));
        let url = "[services.x]\nurl = \"http://h/\"\n[services.x.oauth]\n";
        for (extra, says) in [
            (
                "client_metadata_url = \"http://h/c.json\"\n",
                "client_metadata_url",
            ),
            ("client_secret = \"s\"\n", "client_secret"),
            ("scopes = [\"a b\"]\n", "scopes"),
            (
                "client_id = \"c\"\nclient_credentials = true\n",
                "client_credentials: needs",
            ),
            ("client_id = \"c\"\nclient_key = \"/k.pem\"\n", "client_key"),
            (
                "client_id = \"c\"\nclient_credentials = true\nclient_secret = \"s\"\nclient_key = \"/k.pem\"\n",
                "not both",
            ),
            ("bogus = 1\n", "bogus"),
            (
                "[services.x.headers]\nAuthorization = \"Bearer t\"\n",
                "remove one",
            ),
        ] {
            let e = error_of(&format!("{url}{extra}"));
            assert!(e.contains(says), "{e}");
        }
        let e = error_of("[services.x]\nrun = \"a\"\n[services.x.oauth]\n");
        assert!(e.contains("services.x.oauth: only a url service"), "{e}");
    }

    #[test]
    fn serve_writes_the_caller_assertion_only_where_it_departs_from_the_default() {
        let mut doc: toml_edit::DocumentMut = "".parse().unwrap();
        let url = |caller_header: Option<&str>| BackendSpec::Url {
            url: "http://127.0.0.1:9/mcp".into(),
            headers: BTreeMap::new(),
            caller_header: caller_header.map(str::to_owned),
            oauth: None,
        };
        set_service(&mut doc, "x", &url(Some("Mcpmesh-Caller")), &[], None).unwrap();
        assert!(!doc.to_string().contains("caller_"), "{doc}");
        set_service(&mut doc, "x", &url(None), &[], None).unwrap();
        assert!(
            doc.to_string().contains("caller_assertion = false"),
            "{doc}"
        );
        set_service(&mut doc, "x", &url(Some("X-Caller")), &[], None).unwrap();
        let text = doc.to_string();
        assert!(
            text.contains("caller_header = \"X-Caller\"") && !text.contains("caller_assertion")
        );
        let backend = &Config::parse(&text, "c").unwrap().services[0].backend;
        assert_eq!(backend, &url(Some("X-Caller")));
        set_service(
            &mut doc,
            "x",
            &BackendSpec::Run(vec!["a".into()]),
            &[],
            None,
        )
        .unwrap();
        assert!(!doc.to_string().contains("caller_"), "{doc}");
    }

    #[test]
    fn bad_configs_name_the_key() {
        assert!(error_of("[services.x]\nrun = []\n").contains("services.x.run"));
        assert!(error_of("[peers.bob]\nid = \"nope\"\n").contains("peers.bob.id"));
        assert!(error_of("[network]\nrelay_mode = \"custom\"\n").contains("network.relay_urls"));
        assert!(error_of("[network]\nbind = \"here\"\n").contains("network.bind"));
        assert!(
            error_of("[services.x]\nrun = \"a\"\nenv = { MCPMESH_PEER_EID = \"x\" }\n")
                .contains("services.x.env.MCPMESH_PEER_EID")
        );
        assert!(
            error_of("[services.x]\nrun = \"a\"\nmax_sessions = \"two\"\n")
                .contains("max_sessions")
        );
        assert!(error_of("[services.x]\nrun = \"a\"\nalow = []\n").contains("alow"));
        assert!(error_of("[services.\"a/b\"]\nrun = \"a\"\n").contains("services.a/b"));
        assert!(error_of("[services.x]\nrun = \"a\"\nsocket = \"/s\"\n").contains("not several"));
        assert!(error_of("[services.x]\nurl = \"ftp://h/\"\n").contains("services.x.url"));
        assert!(
            error_of("[services.x]\nurl = \"http://h/\"\nheaders = { A = \"${B\" }\n")
                .contains("services.x.headers.A")
        );
        assert!(
            error_of("[services.x]\nrun = \"a\"\nheaders = { A = \"b\" }\n").contains("only a url")
        );
        assert!(error_of("[services.x]\nsocket = \"rel.sock\"\n").contains("absolute"));
        assert!(error_of("[services.x]\nallow = []\n").contains("services.x.run"));
        assert!(error_of("[telemetry]\nmetrics = \"9464\"\n").contains("telemetry.metrics"));
        let e = error_of("[telemetry]\nmetrics = \"0.0.0.0:9464\"\n");
        assert!(
            e.contains("telemetry.metrics") && e.contains("loopback"),
            "{e}"
        );
        assert!(error_of("[telemetry]\nmetric = \"127.0.0.1:1\"\n").contains("metric"));
        for bad in ["127.0.0.1:4318", "grpc://h:4317", "http://"] {
            let e = error_of(&format!("[telemetry]\notlp = {bad:?}\n"));
            assert!(e.contains("telemetry.otlp") && e.contains("4318"), "{e}");
        }
        let e = error_of("[telemetry]\notlp = \"https://me:s3cret@otel.example\"\n");
        assert!(
            e.contains("OTEL_EXPORTER_OTLP_HEADERS") && !e.contains("s3cret"),
            "{e}"
        );
    }

    #[test]
    fn traces_are_off_by_default_and_go_to_the_collectors_traces_path() {
        let otlp = |text: &str| {
            Config::parse(&format!("[telemetry]\notlp = {text:?}\n"), "config.toml")
                .unwrap()
                .otlp
                .map(String::from)
        };
        assert_eq!(Config::parse("", "config.toml").unwrap().otlp, None);
        for (given, used) in [
            ("http://127.0.0.1:4318", "http://127.0.0.1:4318/v1/traces"),
            (
                "https://otel.example:443/",
                "https://otel.example/v1/traces",
            ),
            ("http://h:4318/custom/traces", "http://h:4318/custom/traces"),
        ] {
            assert_eq!(otlp(given).as_deref(), Some(used), "{given}");
        }
    }

    #[test]
    fn metrics_are_off_by_default_and_listen_on_loopback_when_asked() {
        let parse = |text: &str| Config::parse(text, "config.toml").unwrap();
        assert_eq!(parse("").metrics, None);
        assert_eq!(
            parse("[telemetry]\nmetrics = \"127.0.0.1:9464\"\n").metrics,
            Some("127.0.0.1:9464".parse().unwrap())
        );
        assert_eq!(
            parse("[telemetry]\nmetrics = \"[::1]:0\"\n").metrics,
            Some("[::1]:0".parse().unwrap())
        );
    }

    #[test]
    fn an_allow_entry_that_is_not_a_principal_is_an_error_naming_the_key() {
        for bad in ["foo:bar", "eid:abc", "peer:a b", "group:", "-x"] {
            let text = format!("[services.x]\nrun = \"a\"\nallow = [{bad:?}]\n");
            let e = error_of(&text);
            assert!(e.contains("services.x.allow"), "{bad}: {e}");
        }
        let hex = "ab".repeat(32);
        let text = format!(
            "[services.x]\nrun = \"a\"\nallow = [\"bob\", \"peer:carol\", \"eid:{hex}\", \"user:u1\", \"group:eng\"]\n"
        );
        let s = Config::parse(&text, "config.toml").unwrap();
        let shown: Vec<String> = s.services[0].allow.iter().map(|p| p.to_string()).collect();
        assert_eq!(
            shown,
            [
                "peer:bob",
                "peer:carol",
                &format!("eid:{hex}"),
                "user:u1",
                "group:eng"
            ]
        );
    }

    #[test]
    fn tool_rules_parse_and_bad_ones_name_the_service_and_the_rule() {
        let text = "[services.files]\nrun = \"a\"\nallow = [\"group:eng\", \"dave\"]\n\
            [[services.files.tools]]\nwho = [\"group:eng\"]\nallow = [\"read_*\", \"list_*\"]\n\
            [[services.files.tools]]\nwho = [\"dave\"]\ndeny = [\"*\"]\n";
        let s = Config::parse(text, "config.toml").unwrap();
        let tools = &s.services[0].tools;
        assert_eq!(tools.len(), 2);
        assert_eq!(tools[0].who, ["group:eng".parse::<Principal>().unwrap()]);
        assert_eq!(tools[0].allow, ["read_*", "list_*"]);
        assert_eq!(tools[1].who, [Principal::peer("dave")]);
        assert_eq!(tools[1].deny, ["*"]);
        for (rule, says) in [
            ("allow = [\"x\"]", "services.files.tools[0]: who"),
            ("who = []\nallow = [\"x\"]", "services.files.tools[0]: who"),
            ("who = [\"team:x\"]\nallow = [\"x\"]", "unknown kind"),
            ("who = [\"bob\"]", "give allow or deny"),
            ("who = [\"bob\"]\nallow = []", "give allow or deny"),
            (
                "who = [\"bob\"]\ndeny = [\"\"]",
                "deny: a tool pattern cannot be empty",
            ),
        ] {
            let text = format!("[services.files]\nrun = \"a\"\n[[services.files.tools]]\n{rule}\n");
            let e = error_of(&text);
            assert!(e.contains(says), "{rule}: {e}");
            assert!(e.contains("services.files.tools[0]"), "{rule}: {e}");
        }
        // A misspelt key is the TOML reader's error, which points at the line.
        let e = error_of(
            "[services.files]\nrun = \"a\"\n[[services.files.tools]]\nwho = [\"bob\"]\nalow = [\"x\"]\n",
        );
        assert!(e.contains("unknown field `alow`"), "{e}");
    }

    #[test]
    fn renames_and_removals_reach_every_spelling_of_a_peer_and_nothing_else() {
        let hex = "ab".repeat(32);
        let text = format!(
            "[services.x]\nrun = \"a\"\nallow = [\"bob\", \"peer:bob\", \"group:bob\", \"user:bob\", \"eid:{hex}\", \"bobby\"]\n"
        );
        let allow = |doc: &toml_edit::DocumentMut| -> Vec<String> {
            doc["services"]["x"]["allow"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_str().unwrap().to_owned())
                .collect()
        };
        let mut doc: toml_edit::DocumentMut = text.parse().unwrap();
        rename_allow(&mut doc, "bob", "robert").unwrap();
        assert_eq!(
            allow(&doc),
            [
                "robert",
                "peer:robert",
                "group:bob",
                "user:bob",
                &format!("eid:{hex}"),
                "bobby"
            ]
        );
        let gone = [
            Principal::peer("robert"),
            format!("eid:{hex}").parse().unwrap(),
        ];
        assert_eq!(remove_allow(&mut doc, "x", &gone).unwrap(), 3);
        assert_eq!(allow(&doc), ["group:bob", "user:bob", "bobby"]);
        add_allow(&mut doc, "x", &Principal::peer("bobby")).unwrap();
        assert_eq!(allow(&doc).len(), 3, "already there as a bare name");
    }

    #[test]
    fn edits_keep_comments_and_refuse_invalid_results() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.toml");
        std::fs::write(&path, "# my node\n[network]\nrelay_mode = \"disabled\"\n").unwrap();
        let file = ConfigFile::new(&path);
        let id = some_id();
        let s = file
            .edit(|d| set_peer(d, "bob", &id, &["127.0.0.1:9".parse().unwrap()]))
            .unwrap();
        assert_eq!(s.peers[0].id, id);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.starts_with("# my node\n"), "{text}");
        let err = file.edit(|d| set_service(d, "bad", &BackendSpec::Run(vec![]), &[], None));
        assert!(err.is_err());
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            text,
            "invalid edit wrote nothing"
        );
    }
}
