//! From `config.toml` as written to the settings the node runs on: every key checked, each
//! error naming the key it is about.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use iroh::RelayUrl;
use mcpmesh_net::endpoint::{Discovery, NetworkConfig, RelayPolicy};
use mcpmesh_net::session::valid_service_name;

use crate::tool_policy::ToolRule;

use super::schema::{
    BackendSpec, ClientSettings, Config, ConfigError, DEFAULT_ORG_SYNC_SECS, LimitsSection,
    NetworkSection, OAuthConfig, OneOrMany, PeerConfig, PeerSpec, RESERVED_ENV_PREFIX, RelayMode,
    ServiceConfig, ServiceSpec, Settings, ToolRuleConfig,
};

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
