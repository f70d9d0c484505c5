//! `config.toml` as written (the serde schema, with its defaults) and the settings the node
//! runs on once it is validated.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use iroh::EndpointId;
use mcpmesh_net::endpoint::NetworkConfig;
use serde::Deserialize;

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
    pub(super) fn items(&self) -> Vec<String> {
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
