//! The verbs that change what this node serves: `serve` (a command, a socket or a url, new
//! or replacing one) and `unserve`. Both run on the node's writer and take effect through
//! [`Core::edit`].

use serde::Deserialize;
use serde_json::{Value, json};

use crate::backends::preflight;
use crate::config;
use crate::control::{ControlError, codes};

use super::core::Core;
use super::core::params_of;

pub(super) fn serve(core: &Core, params: Value) -> Result<Value, ControlError> {
    let serve: ServeParams = params_of(params)?;
    let existing = service_spec(core, &serve.name);
    let backend = backend_of(&serve, existing.as_ref())?;
    if let Some(old) = &existing
        && !serve.replace
    {
        return Err(already_served(core, &serve.name, old));
    }
    // A replaced service keeps its env and cwd, so its command is looked for with them.
    let (mut env, cwd) = existing
        .as_ref()
        .map(|old| (old.env.clone(), old.cwd.clone()))
        .unwrap_or_default();
    env.extend(serve.env.clone());
    preflight::check(&backend, &env, cwd.as_deref())
        .map_err(|e| ControlError::invalid_params(e.to_string()))?;
    if let Some(text) = &serve.description {
        crate::catalog::valid_description(text)
            .map_err(|e| ControlError::invalid_params(format!("--description: {e}")))?;
    }
    core.edit(|doc| {
        config::set_service(doc, &serve.name, &backend, &serve.allow, serve.max_sessions)?;
        config::set_env(doc, &serve.name, &serve.env)?;
        match &serve.description {
            Some(text) => config::set_description(doc, &serve.name, Some(text)),
            None => Ok(()),
        }
    })?;
    core.audit.forget_failure(&serve.name);
    core.trust_event("serve", None, Some(&serve.name));
    let allow = service_spec(core, &serve.name)
        .map(|s| s.allow)
        .unwrap_or_default();
    let mut result =
        json!({ "service": serve.name, "serving": true, "allowed_peers": core.admitted(&allow) });
    if let Some(old) = existing {
        let (key, value) = old.backend.describe();
        result["replaced"] = json!({ key: value });
    }
    Ok(result)
}

/// Why `serve` did not replace the service `name` already is, and how to.
fn already_served(core: &Core, name: &str, old: &config::ServiceSpec) -> ControlError {
    let (key, value) = old.backend.describe();
    let who = core.admitted(&old.allow);
    ControlError::new(
        codes::CONFLICT,
        format!(
            "a service named {:?} already exists ({key} = {value}, {}); to replace it and keep its grants, run the same command with --replace, or `mcpmesh unserve {}` first",
            name,
            shared_with(&who),
            name
        ),
    )
}

fn service_spec(core: &Core, name: &str) -> Option<config::ServiceSpec> {
    core.settings()
        .services
        .iter()
        .find(|s| s.name == name)
        .cloned()
}

pub(super) fn unserve(core: &Core, params: Value) -> Result<Value, ControlError> {
    #[derive(Deserialize)]
    struct Unserve {
        name: String,
    }
    let u: Unserve = params_of(params)?;
    let mut existed = false;
    let ended = core.edit(|doc| {
        existed = config::remove_service(doc, &u.name)?;
        Ok(())
    })?;
    if !existed {
        return Err(ControlError::new(
            codes::NOT_FOUND,
            format!("no service named {:?}", u.name),
        ));
    }
    core.audit.forget_failure(&u.name);
    core.trust_event("unserve", None, Some(&u.name));
    Ok(json!({ "service": u.name, "serving": false, "sessions_ended": ended }))
}

/// The parameters of `serve`.
#[derive(Deserialize)]
struct ServeParams {
    name: String,
    #[serde(default)]
    run: Option<Vec<String>>,
    #[serde(default)]
    socket: Option<std::path::PathBuf>,
    #[serde(default)]
    url: Option<String>,
    #[serde(default)]
    headers: std::collections::BTreeMap<String, String>,
    /// `url`: the server requires an OAuth grant (absent: as the service being
    /// replaced did).
    #[serde(default)]
    oauth: bool,
    /// `url`: how the node registers as the server's OAuth client (a configured
    /// client, a Client ID Metadata Document, scopes), over what the service had.
    #[serde(default)]
    oauth_client: Option<config::OAuthConfig>,
    /// `url`: whether to send the signed caller assertion (absent: as the service
    /// being replaced did, else yes), and in which header.
    #[serde(default)]
    caller_assertion: Option<bool>,
    #[serde(default)]
    caller_header: Option<String>,
    #[serde(default)]
    allow: Vec<String>,
    /// Variables for the server command, set over those the service has.
    #[serde(default)]
    env: std::collections::BTreeMap<String, String>,
    max_sessions: Option<u32>,
    /// What the service is for, shown to the peers it admits.
    #[serde(default)]
    description: Option<String>,
    /// Replacing an existing service (and keeping its grants) must be asked for.
    #[serde(default)]
    replace: bool,
}

/// What `serve` attaches the service to: one of a command, a socket or a url. What is not
/// given is kept from the service being replaced.
fn backend_of(
    serve: &ServeParams,
    existing: Option<&config::ServiceSpec>,
) -> Result<config::BackendSpec, ControlError> {
    let was = existing.map(|old| &old.backend);
    match (&serve.run, &serve.socket, &serve.url) {
        (Some(cmd), None, None) => Ok(config::BackendSpec::Run(cmd.clone())),
        (None, Some(path), None) => socket_backend(serve, path, was),
        (None, None, Some(url)) => url_backend(serve, url, was),
        _ => Err(ControlError::new(
            codes::INVALID_PARAMS,
            "serve takes one of run (a command), socket (a path) or url",
        )),
    }
}

/// A socket service, sending the caller assertion (in `_meta`) if asked, else as before.
fn socket_backend(
    serve: &ServeParams,
    path: &std::path::Path,
    was: Option<&config::BackendSpec>,
) -> Result<config::BackendSpec, ControlError> {
    if serve.caller_header.is_some() {
        return Err(ControlError::invalid_params(
            "--caller-header goes with --url: a socket service gets the assertion in _meta",
        ));
    }
    let was = matches!(
        was,
        Some(config::BackendSpec::Socket {
            caller_assertion: true,
            ..
        })
    );
    Ok(config::BackendSpec::Socket {
        path: path.to_owned(),
        caller_assertion: serve.caller_assertion.unwrap_or(was),
    })
}

/// A url service: its caller assertion's header and its OAuth settings as asked, else as
/// the service being replaced had them.
fn url_backend(
    serve: &ServeParams,
    url: &str,
    was: Option<&config::BackendSpec>,
) -> Result<config::BackendSpec, ControlError> {
    let header_was = match was {
        Some(config::BackendSpec::Url { caller_header, .. }) => caller_header.clone(),
        _ => Some(crate::assertion::DEFAULT_HEADER.to_owned()),
    };
    let caller_header = match (serve.caller_assertion, serve.caller_header.clone()) {
        (Some(false), None) => None,
        (Some(false), Some(_)) => {
            return Err(ControlError::invalid_params(
                "--caller-header names the header of a caller assertion turned off",
            ));
        }
        (None, None) => header_was,
        (_, name) => Some(name.unwrap_or_else(|| crate::assertion::DEFAULT_HEADER.to_owned())),
    };
    if let Some(name) = &caller_header {
        config::valid_caller_header(name, &serve.headers)
            .map_err(|e| ControlError::invalid_params(format!("--{e}")))?;
    }
    let kept = match was {
        Some(config::BackendSpec::Url {
            oauth: Some(kept), ..
        }) => Some(kept.clone()),
        _ => serve.oauth.then(Default::default),
    };
    let oauth = match &serve.oauth_client {
        Some(given) => Some(
            config::oauth_settings(given)
                .map_err(|e| ControlError::invalid_params(format!("--{e}")))?,
        ),
        None => kept,
    };
    Ok(config::BackendSpec::Url {
        url: url.to_owned(),
        headers: serve.headers.clone(),
        caller_header,
        oauth,
    })
}

fn shared_with(peers: &[String]) -> String {
    if peers.is_empty() {
        "shared with nobody".to_owned()
    } else {
        format!("shared with {}", peers.join(", "))
    }
}
