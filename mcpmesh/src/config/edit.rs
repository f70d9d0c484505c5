//! The edits the node's verbs make to `config.toml`, in place (a user's comments and layout
//! survive): peers, services, their backends, env and `allow` lists.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use iroh::EndpointId;

use crate::principal::Principal;

use super::schema::{BackendSpec, ClientSettings};

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
