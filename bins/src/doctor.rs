//! `mcpmesh doctor`: what is wrong with this node's setup, and what to do about it.

use mcpmesh::config::BackendSpec;
use mcpmesh::control::client::ControlClient;
use mcpmesh::control::{codes, methods};
use mcpmesh::paths::Profile;
use mcpmesh::principal::Principal;
use serde_json::json;

use crate::output::{Failure, Output};

/// Where the node's log is, how large, and how it is bounded.
fn log_message(profile: &Profile) -> String {
    use mcpmesh::logfile::{KEEP, max_bytes_from_env};
    let path = profile.log_file();
    let bound = format!(
        "rotated at {} KiB, {KEEP} older files kept",
        max_bytes_from_env() / 1024
    );
    match std::fs::metadata(&path) {
        Ok(m) => format!(
            "{} ({} KiB; {bound})",
            path.display(),
            m.len().div_ceil(1024)
        ),
        Err(_) => format!(
            "{} (none yet; a node that `mcpmesh` starts writes there, {bound}; a node run by systemd logs to its journal)",
            path.display()
        ),
    }
}

/// What `doctor` says of a `url` service's OAuth grant: missing, made for another URL, lapsed
/// for good, or fine; nothing for a service that neither requires nor has one.
fn grant_check(
    profile: &Profile,
    svc: &mcpmesh::config::ServiceSpec,
    url: &str,
    required: bool,
) -> Option<(&'static str, String)> {
    use mcpmesh::oauth::{GrantFiles, GrantState};
    let state = GrantState::of(&GrantFiles::new(profile), &svc.name, url, required);
    match state {
        GrantState::NotNeeded => None,
        GrantState::Authorized { issuer, scopes, .. } => Some((
            "ok",
            format!(
                "authorized by {issuer} (scopes: {})",
                match scopes.is_empty() {
                    true => "as granted".to_owned(),
                    false => scopes.join(" "),
                }
            ),
        )),
        other => Some(("error", other.problem(&svc.name).unwrap_or_default())),
    }
}

/// One thing `doctor` looked at: its name, `ok`, `warn` or `error`, and what it found.
struct Check {
    name: String,
    status: &'static str,
    message: String,
}

/// What `doctor` found, in the order it looked.
#[derive(Default)]
struct Checks(Vec<Check>);

impl Checks {
    fn add(&mut self, name: &str, status: &'static str, message: String) {
        self.0.push(Check {
            name: name.to_owned(),
            status,
            message,
        });
    }
}

/// `mcpmesh doctor`: checks that need no running node, and a few that do; unless `offline`,
/// asks the configured relays and discovery servers whether they answer. Exit 1 on errors.
pub fn doctor(profile: &Profile, offline: bool, out: &Output) -> Result<(), Failure> {
    let mut checks = Checks::default();
    let config_file = mcpmesh::config::ConfigFile::new(profile.config_file());
    let settings = check_files(profile, &config_file, &mut checks);
    let mut node = check_node(profile, &mut checks);
    checks.add("log", "ok", log_message(profile));
    let status = node
        .as_mut()
        .and_then(|client| client.call(methods::STATUS, json!({})).ok());
    if let Some(status) = &status {
        check_telemetry(status, &mut checks);
        if let Some(message) = unloaded_config(&config_file, status) {
            checks.add("config loaded", "warn", message);
        }
    }
    // Which org this node is in, if any: only a running node knows.
    let org = status
        .map(|status| status["org"].clone())
        .filter(|org| org.is_object());
    if let Some((status, message)) = org.as_ref().and_then(org_check) {
        checks.add("org", status, message);
    }
    if let Some(s) = &settings {
        for svc in &s.services {
            check_service(profile, svc, &mut checks);
        }
        let peers = check_peers(profile, s, node.as_mut(), &mut checks);
        if let Some(node) = node.as_mut()
            && let Ok(catalog) = node.call(methods::SERVICES_LIST, json!({}))
        {
            let (status, message) = catalog_check(&catalog);
            checks.add("catalog", status, message);
        }
        let in_org = org.as_ref().is_some_and(|o| o.get("removed").is_none());
        check_allow_entries(s, peers.as_deref(), in_org, &mut checks);
        check_network(s, offline, &mut checks);
    }
    report(profile, &checks, out)
}

/// The profile's own files: who owns the profile, whether the config loads and is private,
/// and the keys. The settings, when the config loads.
fn check_files(
    profile: &Profile,
    config_file: &mcpmesh::config::ConfigFile,
    checks: &mut Checks,
) -> Option<mcpmesh::config::Settings> {
    use mcpmesh::files::{Rule, exposure, open_checked};
    match profile.check_trusted() {
        Ok(()) => checks.add(
            "profile ownership",
            "ok",
            "yours, and nobody else may write it".into(),
        ),
        Err(e) => checks.add("profile ownership", "error", e.to_string()),
    }
    let settings = match config_file.load() {
        Ok(s) => {
            checks.add(
                "config",
                "ok",
                format!("{} is valid", profile.config_file().display()),
            );
            Some(s)
        }
        Err(e) => {
            checks.add("config", "error", e.to_string());
            None
        }
    };
    let config_meta = std::fs::metadata(profile.config_file()).ok();
    if let Some(exposed) = config_meta.as_ref().and_then(exposure) {
        checks.add(
            "config permissions",
            "warn",
            format!(
                "{} is {exposed}; service env may hold tokens: chmod 600 it",
                profile.config_file().display(),
            ),
        );
    }
    // The keys are checked as the node opens them: the same rule, from the same place.
    match open_checked(&profile.key_file(), Rule::Secret) {
        Ok(None) => checks.add(
            "device key",
            "ok",
            "no key yet; one is minted on first start".into(),
        ),
        Ok(Some(_)) => checks.add("device key", "ok", "private (0600)".into()),
        Err(e) => checks.add("device key", "error", e.to_string()),
    }
    // The org root key, on the admin's node only: unless private, the node ignores it.
    if let Err(e) = open_checked(&profile.org_root_file(), Rule::Secret) {
        checks.add(
            "org root key",
            "error",
            format!("{e}; until then the node will not sign rosters with it"),
        );
    }
    settings
}

/// Whether a node runs behind a private control socket; a client of it when one answers.
fn check_node(profile: &Profile, checks: &mut Checks) -> Option<ControlClient> {
    let socket = std::fs::symlink_metadata(profile.socket_path());
    match socket.as_ref().map(mcpmesh::files::exposure) {
        Err(_) => checks.add("node", "ok", "not running (any verb starts it)".into()),
        Ok(Some(exposed)) => checks.add(
            "control socket",
            "error",
            format!(
                "{} has mode {:o}; expected 0600",
                profile.socket_path().display(),
                exposed.mode
            ),
        ),
        Ok(_) => match ControlClient::connect(profile) {
            Ok(Some(client)) => {
                checks.add(
                    "node",
                    "ok",
                    "running; control socket private (0600)".into(),
                );
                return Some(client);
            }
            _ => checks.add(
                "node",
                "warn",
                "a control socket exists but no node answers; `mcpmesh up` replaces it".into(),
            ),
        },
    }
    None
}

/// What the running node (its `status`) says of its metrics endpoint and trace export.
fn check_telemetry(status: &serde_json::Value, checks: &mut Checks) {
    if let Some(error) = status["metrics"]["error"].as_str() {
        checks.add(
            "metrics",
            "warn",
            format!(
                "{error}; free the port or change telemetry.metrics, then restart the node (`mcpmesh down`, `mcpmesh up`)"
            ),
        );
    }
    let traces = &status["traces"];
    if !traces.is_object() {
        return;
    }
    let url = traces["url"].as_str().unwrap_or_default();
    let sent = traces["sent"].as_u64().unwrap_or(0);
    match (
        traces["failed"].as_u64().unwrap_or(0),
        traces["last_error"].as_str(),
    ) {
        (failed, Some(error)) if failed > 0 => checks.add(
            "traces",
            "warn",
            format!(
                "{failed} spans could not be sent to {url} ({sent} were): {error}; check that the collector runs and telemetry.otlp names it"
            ),
        ),
        _ => checks.add("traces", "ok", format!("{sent} spans sent to {url}")),
    }
}

/// One configured service: whether what it is attached to is there, and whether anyone may
/// use it.
fn check_service(profile: &Profile, svc: &mcpmesh::config::ServiceSpec, checks: &mut Checks) {
    let what = format!("service {}", svc.name);
    match &svc.backend {
        BackendSpec::Run(cmd) => {
            let found = cmd.first().map(|program| {
                mcpmesh::backends::preflight::resolve_program(program, &svc.env, svc.cwd.as_deref())
            });
            match found {
                Some(Ok(path)) => checks.add(&what, "ok", format!("runs {}", path.display())),
                Some(Err(why)) => {
                    checks.add(&what, "error", format!("services.{}.run: {why}", svc.name))
                }
                None => checks.add(
                    &what,
                    "error",
                    format!("services.{}.run is empty", svc.name),
                ),
            }
        }
        BackendSpec::Url {
            url,
            headers,
            caller_header,
            oauth,
        } => {
            if let Some((status, message)) = grant_check(profile, svc, url, oauth.is_some()) {
                checks.add(&format!("service {} oauth", svc.name), status, message);
            }
            let caller = match caller_header {
                Some(name) => format!("; the caller is asserted in {name}"),
                None => "; no caller assertion".to_owned(),
            };
            match mcpmesh::backends::url::expand_headers(headers) {
                Ok(_) => checks.add(
                    &what,
                    "ok",
                    format!("a Streamable HTTP server at {url}{caller}"),
                ),
                Err(e) => checks.add(
                    &what,
                    "error",
                    format!("services.{}.headers: {e}", svc.name),
                ),
            }
        }
        BackendSpec::Socket { path, .. } => match std::os::unix::net::UnixStream::connect(path) {
            Ok(_) => checks.add(
                &what,
                "ok",
                format!("a server listens on {}", path.display()),
            ),
            Err(e) => checks.add(
                &what,
                "error",
                format!(
                    "services.{}.socket: nothing accepts connections on {}: {e}",
                    svc.name,
                    path.display()
                ),
            ),
        },
    }
    if svc.allow.is_empty() {
        checks.add(
            &what,
            "warn",
            format!(
                "nobody may use {} yet: mcpmesh grant PEER {}, or mcpmesh invite {}",
                svc.name, svc.name, svc.name
            ),
        );
    }
}

/// The trusted peers as (name, key), or a warning that the `allow` entries naming peers go
/// unchecked because they could not be listed.
fn check_peers(
    profile: &Profile,
    settings: &mcpmesh::config::Settings,
    node: Option<&mut ControlClient>,
    checks: &mut Checks,
) -> Option<Vec<(String, [u8; 32])>> {
    match known_peers(profile, settings, node) {
        Ok(peers) => Some(peers),
        Err(e) => {
            checks.add(
                "peers",
                "warn",
                format!(
                    "cannot list the paired peers ({e}); allow entries naming peers were not checked"
                ),
            );
            None
        }
    }
}

/// Every service's `allow` entries that admit nobody.
fn check_allow_entries(
    settings: &mcpmesh::config::Settings,
    peers: Option<&[(String, [u8; 32])]>,
    in_org: bool,
    checks: &mut Checks,
) {
    for svc in &settings.services {
        for entry in &svc.allow {
            if let Some(why) = matches_nobody(entry, peers, in_org) {
                checks.add(
                    &format!("service {}", svc.name),
                    "warn",
                    format!("services.{}.allow: {entry} {why}", svc.name),
                );
            }
        }
    }
}

/// How the node reaches the network; unless `offline`, whether its relays and discovery
/// servers answer.
fn check_network(settings: &mcpmesh::config::Settings, offline: bool, checks: &mut Checks) {
    match &settings.network.relay {
        mcpmesh_net::endpoint::RelayPolicy::Disabled => {
            checks.add(
                "network",
                "ok",
                "hermetic: no relays, no discovery (peers need direct addresses)".into(),
            );
            for p in settings.peers.iter().filter(|p| p.addrs.is_empty()) {
                checks.add(
                    &format!("peer {}", p.name),
                    "warn",
                    format!(
                        "no address for {} and relays are disabled: it can only be reached if it dials first",
                        p.name
                    ),
                );
            }
        }
        mcpmesh_net::endpoint::RelayPolicy::Default => {
            checks.add("network", "ok", "iroh's public relays and discovery".into())
        }
        mcpmesh_net::endpoint::RelayPolicy::Custom(urls) => checks.add(
            "network",
            "ok",
            format!("self-hosted relays: {}", urls.len()),
        ),
    }
    let reached = match offline {
        true => Vec::new(),
        false => reachability(&settings.network),
    };
    for r in reached {
        match r.outcome {
            Ok(what) => checks.add("reachable", "ok", format!("{}: {what}", r.server)),
            Err(why) => checks.add(
                "reachable",
                "warn",
                format!("{}: not reachable: {why}", r.server),
            ),
        }
    }
}

/// The checks as the answer; a failure naming the ones in error, if any.
fn report(profile: &Profile, checks: &Checks, out: &Output) -> Result<(), Failure> {
    let checks = &checks.0;
    let ok = !checks.iter().any(|c| c.status == "error");
    let value = json!({
        "ok": ok,
        "log": profile.log_file().display().to_string(),
        "checks": checks.iter().map(|c| json!({ "check": c.name, "status": c.status, "message": c.message })).collect::<Vec<_>>(),
    });
    out.print(value, || {
        checks
            .iter()
            .map(|c| {
                format!(
                    "{:<6} {}: {}",
                    match c.status {
                        "ok" => "ok",
                        "warn" => "warn",
                        _ => "ERROR",
                    },
                    c.name,
                    c.message
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    });
    if ok {
        return Ok(());
    }
    // The report is the answer (on stdout); the failure names what failed.
    let failed: Vec<&str> = checks
        .iter()
        .filter(|c| c.status == "error")
        .map(|c| c.name.as_str())
        .collect();
    Err(Failure::new(
        codes::CHECK_FAILED,
        format!(
            "doctor found {} problem{}: {}",
            failed.len(),
            if failed.len() == 1 { "" } else { "s" },
            failed.join(", ")
        ),
    ))
}

/// The configured relays and discovery servers, each asked once (a few seconds at most, all at
/// once); none for hermetic or public setups.
fn reachability(
    network: &mcpmesh_net::endpoint::NetworkConfig,
) -> Vec<mcpmesh::reachability::Reachability> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build();
    match runtime {
        Ok(rt) => rt.block_on(mcpmesh::reachability::check(network)),
        Err(e) => vec![mcpmesh::reachability::Reachability {
            server: "relays and discovery servers".into(),
            outcome: Err(format!("cannot start the checks: {e}")),
        }],
    }
}

/// The peers this node trusts, as (name, key): from the running node when there is one (it
/// knows the paired peers), else from config and the store.
fn known_peers(
    profile: &Profile,
    settings: &mcpmesh::config::Settings,
    node: Option<&mut ControlClient>,
) -> Result<Vec<(String, [u8; 32])>, String> {
    if let Some(node) = node {
        let listed = node
            .call(methods::PEERS_LIST, json!({}))
            .map_err(|e| e.message)?;
        return Ok(listed["peers"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|p| {
                let id = mcpmesh::config::parse_endpoint_id(p["id"].as_str()?)?;
                Some((p["name"].as_str()?.to_owned(), *id.as_bytes()))
            })
            .collect());
    }
    let mut peers: Vec<(String, [u8; 32])> = settings
        .peers
        .iter()
        .map(|p| (p.name.clone(), *p.id.as_bytes()))
        .collect();
    let store = profile.store_file();
    if store.exists() {
        let stored = mcpmesh::store::Store::read_peers(&store).map_err(|e| e.to_string())?;
        for p in stored {
            if let Some(id) = mcpmesh::config::parse_endpoint_id(&p.id) {
                peers.push((p.name, *id.as_bytes()));
            }
        }
    }
    Ok(peers)
}

/// The catalog check: what this node may mount, and which peers did not say.
fn catalog_check(catalog: &serde_json::Value) -> (&'static str, String) {
    let services = catalog["services"].as_array().map_or(0, Vec::len);
    let peers: std::collections::BTreeSet<&str> = catalog["services"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e["peer"].as_str())
        .collect();
    let offers = format!(
        "{services} service(s) from {} peer(s) to mount (mcpmesh services)",
        peers.len()
    );
    let silent: Vec<&str> = catalog["unanswered"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p.as_str())
        .collect();
    let refused: Vec<&str> = catalog["refused"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p.as_str())
        .collect();
    let mut problems = Vec::new();
    if !silent.is_empty() {
        problems.push(format!(
            "{} did not answer what they serve to this node (offline, or they do not trust it)",
            silent.join(", ")
        ));
    }
    if !refused.is_empty() {
        problems.push(format!(
            "{} answered with a catalog this node refused (over its size cap or malformed; see catalog_refused in the audit log)",
            refused.join(", ")
        ));
    }
    if problems.is_empty() {
        ("ok", offers)
    } else {
        ("warn", format!("{offers}; {}", problems.join("; ")))
    }
}

/// The org check: a roster past its validity is an error, because every `user:` and
/// `group:` grant stops matching until the admin's node re-signs it.
fn org_check(org: &serde_json::Value) -> Option<(&'static str, String)> {
    let name = org["name"].as_str()?;
    if let Some(removed) = org.get("removed").filter(|r| r.is_object()) {
        return Some((
            "warn",
            format!(
                "removed from org {name} (serial {}): this device no longer trusts, serves or dials the org's members, and user: and group: grants match nobody; {}",
                removed["serial"],
                removed["hint"].as_str().unwrap_or_default()
            ),
        ));
    }
    if let Some(damage) = org["damaged"].as_str() {
        return Some((
            "error",
            format!(
                "{damage}: until a member's node hands it a good copy, user: and group: grants match nobody and org members are not trusted. The node fetches it again from the members it remembers; keep one of them online"
            ),
        ));
    }
    let until =
        mcpmesh::time::format_time(org["expires_at"].as_u64().unwrap_or(0).saturating_mul(1000));
    if org["expired"] == json!(true) {
        return Some((
            "error",
            format!(
                "the roster of org {name} expired at {until} UTC: user: and group: grants no longer match anyone. Ask the admin's node to come online (it re-signs the roster and its members pass it on)"
            ),
        ));
    }
    Some((
        "ok",
        format!(
            "org {name}, roster serial {}, valid until {until} UTC",
            org["serial"]
        ),
    ))
}

/// What to say when config.toml on disk is not what the running node (its `status`) last
/// loaded: a hand edit not yet read, which the node does not follow.
fn unloaded_config(
    file: &mcpmesh::config::ConfigFile,
    status: &serde_json::Value,
) -> Option<String> {
    let loaded = status["config_loaded"].as_str()?;
    let on_disk = file.digest_on_disk().ok()?;
    if on_disk == loaded {
        return None;
    }
    let reload = match status["pid"].as_u64() {
        Some(pid) => format!("`kill -HUP {pid}` reloads it"),
        None => "send the node SIGHUP to reload it".to_owned(),
    };
    Some(format!(
        "the running node has not loaded config.toml as it is on disk (edited since the node last read it): {reload}, or `mcpmesh down` and any verb restarts the node with it"
    ))
}

/// Why an `allow` entry admits nobody, if it does not (`peers`: the trusted peers, when
/// known; `in_org`: whether this node holds an org roster).
fn matches_nobody(
    entry: &Principal,
    peers: Option<&[(String, [u8; 32])]>,
    in_org: bool,
) -> Option<&'static str> {
    match (entry, peers) {
        (Principal::User(_) | Principal::Group(_) | Principal::Org(_), _) if !in_org => {
            Some("matches nobody until this node joins an org roster")
        }
        (Principal::Peer(name), Some(peers)) if !peers.iter().any(|(n, _)| n == name) => {
            Some("matches nobody: no peer has that name")
        }
        (Principal::Eid(key), Some(peers)) if !peers.iter().any(|(_, k)| k == key) => {
            Some("matches nobody: no trusted peer has that key")
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_catalog_check_names_the_peers_that_did_not_answer() {
        let all = json!({"services": [{"peer": "alice"}, {"peer": "alice"}], "unanswered": []});
        assert_eq!(catalog_check(&all).0, "ok");
        assert!(
            catalog_check(&all)
                .1
                .starts_with("2 service(s) from 1 peer(s)")
        );
        let some = json!({"services": [], "unanswered": ["bob"]});
        let (status, message) = catalog_check(&some);
        assert_eq!(status, "warn");
        assert!(message.contains("bob did not answer"), "{message}");
        let hostile = json!({"services": [], "unanswered": [], "refused": ["mallory"]});
        let (status, message) = catalog_check(&hostile);
        assert_eq!(status, "warn");
        assert!(
            message.contains("mallory answered with a catalog this node refused"),
            "{message}"
        );
        assert!(!message.contains("did not answer"), "{message}");
    }

    #[test]
    fn an_expired_roster_fails_the_check_and_says_what_to_do() {
        let expired = json!({ "name": "acme", "serial": 3, "expires_at": 0, "expired": true });
        let (status, message) = org_check(&expired).unwrap_or_default();
        assert_eq!(status, "error");
        assert!(
            message.contains("user: and group: grants no longer match"),
            "{message}"
        );
        assert!(message.contains("admin's node to come online"), "{message}");
        let fine = json!({ "name": "acme", "serial": 3, "expires_at": 86_400, "expired": false });
        let (status, message) = org_check(&fine).unwrap_or_default();
        assert_eq!(status, "ok");
        assert_eq!(
            message,
            "org acme, roster serial 3, valid until 1970-01-02 00:00:00 UTC"
        );
    }

    #[test]
    fn a_damaged_roster_fails_the_check_and_says_it_is_being_fetched_again() {
        let removed = json!({ "name": "acme", "removed": { "serial": 7, "user": "bob", "device": "laptop", "hint": "ask the admin" } });
        let (status, message) = org_check(&removed).unwrap_or_default();
        assert_eq!(status, "warn");
        assert!(
            message.starts_with("removed from org acme (serial 7)")
                && message.ends_with("ask the admin"),
            "{message}"
        );
        let damaged = json!({ "name": "acme", "serial": 3, "damaged": "the stored roster of org acme is damaged (x)" });
        let (status, message) = org_check(&damaged).unwrap_or_default();
        assert_eq!(status, "error");
        assert!(message.contains("is damaged"), "{message}");
        assert!(message.contains("fetches it again"), "{message}");
    }

    #[test]
    fn user_and_group_entries_are_only_suspect_outside_an_org() {
        let group = Principal::Group("eng".into());
        assert!(matches_nobody(&group, None, false).is_some());
        assert!(matches_nobody(&group, None, true).is_none());
    }
}
