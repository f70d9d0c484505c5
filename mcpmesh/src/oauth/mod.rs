//! OAuth for `url` services whose server requires a grant (the MCP authorization spec): the
//! node is the OAuth client, one grant per service.
//!
//! `mcpmesh auth NAME` makes the grant ([`flow`]): it discovers the authorization server from
//! the server's own 401 ([`discovery`]), registers a client, and runs the authorization-code
//! flow with PKCE, taking the code on a loopback redirect — or, on a headless node, from a
//! second call given the URL the browser was sent to. Sessions then send the access token
//! ([`GrantBook`]), refreshing it before it lapses and when the server answers 401.
//!
//! Grants are kept like keys: one `0600` file per service beside the device key, never logged,
//! never in audit records, status or metrics.

pub mod auth;
pub mod discovery;
pub mod flow;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::paths::Profile;

/// How long before its expiry an access token is refreshed.
pub const REFRESH_AHEAD: Duration = Duration::from_secs(30);
/// The longest document an OAuth endpoint may answer with.
const MAX_BODY: usize = 1 << 20;
/// How long one OAuth HTTP request may take.
const HTTP_TIMEOUT: Duration = Duration::from_secs(15);

#[derive(Debug, thiserror::Error)]
pub enum OAuthError {
    /// The server or its authorization server did not say what the spec asks of it.
    #[error("{0}")]
    Discovery(String),
    /// The authorization server answered the flow with an error.
    #[error("the authorization server refused: {0}")]
    Refused(String),
    /// The redirect did not carry what this flow expects (wrong state, an error, no code).
    #[error("{0}")]
    Callback(String),
    #[error("cannot keep the grant in {path}: {message}")]
    Store { path: String, message: String },
    #[error("{0}")]
    Http(String),
    #[error("no authorization of {0} is under way; run `mcpmesh auth {0}` first")]
    NoPending(String),
}

/// A grant as kept on disk: what refreshing it needs, and the current tokens.
#[derive(Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Grant {
    /// The service URL it was made for; a service moved to another URL needs a new grant.
    pub url: String,
    /// The RFC 8707 resource the tokens are for.
    pub resource: String,
    pub issuer: String,
    pub token_endpoint: String,
    /// Where the grant is revoked (RFC 7009), when the authorization server has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revocation_endpoint: Option<String>,
    pub client_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_secret: Option<String>,
    /// The secret goes in the token request's body (`client_secret_post`), not in HTTP Basic.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub secret_in_body: bool,
    /// Made with the client-credentials grant: renewed by asking again, no refresh token.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub client_credentials: bool,
    /// The key file the client authenticates with (`private_key_jwt`), instead of a secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_key: Option<PathBuf>,
    pub access_token: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refresh_token: Option<String>,
    /// Unix seconds; `None` when the server did not say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<u64>,
    /// Unix seconds: when the access token was issued.
    #[serde(default)]
    pub issued_at: u64,
    #[serde(default)]
    pub scopes: Vec<String>,
    /// The server refused this grant for want of scope (403 `insufficient_scope`): the scopes
    /// its challenge named, if any. The next `mcpmesh auth` asks for them as well.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wanted: Option<Vec<String>>,
}

impl std::fmt::Debug for Grant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never a token or a secret.
        f.debug_struct("Grant")
            .field("url", &self.url)
            .field("issuer", &self.issuer)
            .field("client_id", &self.client_id)
            .field("expires_at", &self.expires_at)
            .field("scopes", &self.scopes)
            .finish_non_exhaustive()
    }
}

impl Grant {
    /// Whether the access token lapses within `ahead` (or a third of its lifetime, when
    /// that is shorter), or has.
    pub fn lapses_within(&self, ahead: Duration) -> bool {
        self.expires_at.is_some_and(|at| {
            let ahead = ahead.as_secs().min(at.saturating_sub(self.issued_at) / 3);
            at <= crate::time::unix_ms() / 1000 + ahead
        })
    }
}

/// An authorization begun and not finished: what finishing it needs.
#[derive(Clone, Serialize, Deserialize)]
pub struct Pending {
    pub url: String,
    pub resource: String,
    pub issuer: String,
    pub token_endpoint: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revocation_endpoint: Option<String>,
    pub client_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_secret: Option<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub secret_in_body: bool,
    pub redirect_uri: String,
    pub state: String,
    pub verifier: String,
    pub scopes: Vec<String>,
    /// The server promised `iss` on its redirect (RFC 9207): one without it is refused.
    pub iss_required: bool,
    /// Unix seconds; a pending authorization is good for [`flow::PENDING_FOR`].
    pub created_at: u64,
}

impl std::fmt::Debug for Pending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pending")
            .field("url", &self.url)
            .field("issuer", &self.issuer)
            .finish_non_exhaustive()
    }
}

/// The grant and pending-authorization files of a profile, one pair per service.
#[derive(Debug, Clone)]
pub struct GrantFiles {
    dir: PathBuf,
}

impl GrantFiles {
    pub fn new(profile: &Profile) -> Self {
        GrantFiles {
            dir: profile.oauth_dir(),
        }
    }

    fn path(&self, service: &str, kind: &str) -> PathBuf {
        // Service names are 1-64 letters, digits, '.', '_' or '-' (checked by the config).
        self.dir.join(format!("{service}.{kind}.json"))
    }

    pub fn load(&self, service: &str) -> Result<Option<Grant>, OAuthError> {
        self.read(&self.path(service, "grant"))
    }

    pub fn save(&self, service: &str, grant: &Grant) -> Result<(), OAuthError> {
        self.write(&self.path(service, "grant"), grant)
    }

    /// Forgets the service's grant; `false` when there was none.
    pub fn remove(&self, service: &str) -> Result<bool, OAuthError> {
        self.delete(&self.path(service, "grant"))
    }

    pub fn load_pending(&self, service: &str) -> Result<Option<Pending>, OAuthError> {
        self.read(&self.path(service, "pending"))
    }

    pub fn save_pending(&self, service: &str, pending: &Pending) -> Result<(), OAuthError> {
        self.write(&self.path(service, "pending"), pending)
    }

    pub fn remove_pending(&self, service: &str) -> Result<bool, OAuthError> {
        self.delete(&self.path(service, "pending"))
    }

    fn read<T: for<'de> Deserialize<'de>>(&self, path: &Path) -> Result<Option<T>, OAuthError> {
        let store = store_error(path);
        let Some(bytes) =
            crate::files::read_secret(path, MAX_BODY as u64).map_err(|e| store(e.to_string()))?
        else {
            return Ok(None);
        };
        serde_json::from_slice(&bytes).map(Some).map_err(|e| {
            store(format!(
                "damaged ({e}); run `mcpmesh auth --logout` and again"
            ))
        })
    }

    fn write<T: Serialize>(&self, path: &Path, value: &T) -> Result<(), OAuthError> {
        let store = store_error(path);
        crate::paths::create_private_dir(&self.dir).map_err(|e| store(e.to_string()))?;
        let bytes = serde_json::to_vec(value).map_err(|e| store(e.to_string()))?;
        crate::files::write_atomically(path, &bytes).map_err(|e| store(e.to_string()))
    }

    fn delete(&self, path: &Path) -> Result<bool, OAuthError> {
        match std::fs::remove_file(path) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(store_error(path)(e.to_string())),
        }
    }
}

/// What a service's grant is good for now, as `status` and `doctor` tell it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GrantState {
    /// The service is not known to need one, and has none.
    NotNeeded,
    Missing,
    ForAnotherUrl(String),
    /// Its access token lapsed and nothing can renew it (no refresh token, not client
    /// credentials).
    Lapsed,
    Authorized {
        issuer: String,
        scopes: Vec<String>,
        expires_at: Option<u64>,
    },
    Unreadable(String),
}

impl GrantState {
    /// The state of `service`'s grant for `url`; `required` when the service is configured as
    /// an OAuth client (one that is not may still hold a grant found on a 401).
    pub fn of(files: &GrantFiles, service: &str, url: &str, required: bool) -> GrantState {
        match files.load(service) {
            Err(e) => GrantState::Unreadable(e.to_string()),
            Ok(None) if required => GrantState::Missing,
            Ok(None) => GrantState::NotNeeded,
            Ok(Some(grant)) if grant.url != url => GrantState::ForAnotherUrl(grant.url),
            Ok(Some(grant))
                if grant.lapses_within(Duration::ZERO)
                    && grant.refresh_token.is_none()
                    && !grant.client_credentials =>
            {
                GrantState::Lapsed
            }
            Ok(Some(grant)) => GrantState::Authorized {
                issuer: grant.issuer,
                scopes: grant.scopes,
                expires_at: grant.expires_at,
            },
        }
    }

    /// Why the service cannot send a grant, in words ending with what to run; `None` when it
    /// can (or needs none).
    pub fn problem(&self, service: &str) -> Option<String> {
        let run = format!("run `mcpmesh auth {service}`");
        Some(match self {
            GrantState::NotNeeded | GrantState::Authorized { .. } => return None,
            GrantState::Missing => {
                format!("the server requires an OAuth grant and this node has none: {run}")
            }
            GrantState::ForAnotherUrl(other) => {
                format!("the grant was made for {other}, not this service's URL: {run}")
            }
            GrantState::Lapsed => {
                format!("the grant's access token lapsed and it has no refresh token: {run}")
            }
            GrantState::Unreadable(e) => e.clone(),
        })
    }

    /// As `status --json` shows it: `None` for a service that needs no grant.
    pub fn to_json(&self, service: &str) -> Option<serde_json::Value> {
        match self {
            GrantState::NotNeeded => None,
            GrantState::Authorized {
                scopes, expires_at, ..
            } => Some(serde_json::json!({
                "authorized": true, "scopes": scopes, "expires_at": expires_at,
            })),
            other => Some(serde_json::json!({
                "authorized": false,
                "problem": other.problem(service),
                "command": format!("mcpmesh auth {service}"),
            })),
        }
    }
}

/// The error of keeping a grant in `path`.
fn store_error(path: &Path) -> impl Fn(String) -> OAuthError + '_ {
    move |message| OAuthError::Store {
        path: path.display().to_string(),
        message,
    }
}

/// Why a session cannot send a token: what its caller is told (`-32056`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NeedsGrant {
    pub service: String,
    /// Said to the caller in plain words; names nothing of the owner's machine.
    pub why: &'static str,
}

impl NeedsGrant {
    /// The command the node's owner runs.
    pub fn command(&self) -> String {
        format!("mcpmesh auth {}", self.service)
    }
}

/// The grants the node's sessions use, read from disk when a session needs one and shared by
/// every session of a service, so one refresh serves them all (a refresh token rotated by one
/// session is not spent again by another).
#[derive(Debug)]
pub struct GrantBook {
    files: GrantFiles,
    /// The node's writer, which every grant written goes through (without one, the blocking
    /// pool).
    disk: Option<crate::disk::Disk>,
    /// Made on the first refresh: a node that never refreshes a grant never loads TLS roots.
    http: std::sync::OnceLock<reqwest::Client>,
    slots: Mutex<HashMap<String, Arc<tokio::sync::Mutex<Option<Grant>>>>>,
}

impl GrantBook {
    pub fn new(files: GrantFiles) -> Self {
        GrantBook {
            files,
            disk: None,
            http: std::sync::OnceLock::new(),
            slots: Mutex::new(HashMap::new()),
        }
    }

    /// Writes the grants on `disk`, a running node's writer.
    pub fn with_disk(self, disk: crate::disk::Disk) -> Self {
        GrantBook {
            disk: Some(disk),
            ..self
        }
    }

    /// Where the book reads its grants.
    pub fn files(&self) -> &GrantFiles {
        &self.files
    }

    /// Runs a write of grant files off the runtime; `None` if it panicked.
    async fn write<T: Send + 'static>(
        &self,
        job: impl FnOnce() -> T + Send + 'static,
    ) -> Option<T> {
        match &self.disk {
            Some(disk) => disk.run(job).await,
            None => tokio::task::spawn_blocking(job).await.ok(),
        }
    }

    fn http(&self) -> Result<&reqwest::Client, OAuthError> {
        if let Some(client) = self.http.get() {
            return Ok(client);
        }
        let client = http_client()?;
        Ok(self.http.get_or_init(|| client))
    }

    fn slot(&self, service: &str) -> Arc<tokio::sync::Mutex<Option<Grant>>> {
        self.slots
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(service.to_owned())
            .or_default()
            .clone()
    }

    /// The grant `url`'s sessions send now: read from disk (a grant made or dropped by `mcpmesh
    /// auth` since is seen), refreshed first when it lapses within [`REFRESH_AHEAD`].
    pub async fn current(&self, service: &str, url: &str) -> Result<Grant, NeedsGrant> {
        let slot = self.slot(service);
        let mut held = slot.lock().await;
        *held = self.read(service).await;
        self.usable(service, url, &mut held, None).await
    }

    /// After the server refused `sent`: a grant refreshed since (by another session, or by
    /// `mcpmesh auth`) is taken as it is; otherwise this one is refreshed.
    pub async fn refused(&self, service: &str, url: &str, sent: &str) -> Result<Grant, NeedsGrant> {
        let slot = self.slot(service);
        let mut held = slot.lock().await;
        *held = self.read(service).await;
        self.usable(service, url, &mut held, Some(sent)).await
    }

    async fn usable(
        &self,
        service: &str,
        url: &str,
        held: &mut Option<Grant>,
        refused: Option<&str>,
    ) -> Result<Grant, NeedsGrant> {
        let needs = |why| NeedsGrant {
            service: service.to_owned(),
            why,
        };
        let grant = held
            .clone()
            .ok_or(needs("the service has no OAuth grant on its node"))?;
        if grant.url != url {
            return Err(needs("the service's grant was made for another URL"));
        }
        let stale = refused.is_some_and(|sent| sent == grant.access_token);
        if !stale && !grant.lapses_within(REFRESH_AHEAD) {
            return Ok(grant);
        }
        let refreshed = match self.http() {
            Ok(http) => flow::refresh(http, &grant).await,
            Err(e) => Err(e),
        };
        match refreshed {
            Ok(fresh) => {
                let (files, name, kept) = (self.files.clone(), service.to_owned(), fresh.clone());
                if let Some(Err(e)) = self.write(move || files.save(&name, &kept)).await {
                    tracing::warn!(%service, "{e}");
                }
                tracing::info!(%service, "refreshed the service's OAuth access token");
                *held = Some(fresh.clone());
                Ok(fresh)
            }
            Err(e) => {
                tracing::warn!(%service, "cannot refresh the service's OAuth grant: {e}");
                Err(needs(
                    "the service's OAuth grant lapsed and could not be refreshed",
                ))
            }
        }
    }

    /// Records that the server refused `service`'s grant for want of scope (`wanted`, what
    /// its challenge named): the next `mcpmesh auth` asks for more.
    pub async fn needs_scope(&self, service: &str, wanted: Vec<String>) {
        let slot = self.slot(service);
        let _held = slot.lock().await;
        let (files, name) = (self.files.clone(), service.to_owned());
        let saved = self
            .write(move || {
                let Some(grant) = files.load(&name)? else {
                    return Ok(());
                };
                files.save(
                    &name,
                    &Grant {
                        wanted: Some(wanted),
                        ..grant
                    },
                )
            })
            .await;
        if let Some(Err(e)) = saved {
            tracing::warn!(%service, "{e}");
        }
    }

    async fn read(&self, service: &str) -> Option<Grant> {
        let (files, name) = (self.files.clone(), service.to_owned());
        match tokio::task::spawn_blocking(move || files.load(&name)).await {
            Ok(Ok(grant)) => grant,
            Ok(Err(e)) => {
                tracing::warn!(%service, "{e}");
                None
            }
            Err(_) => None,
        }
    }
}

/// The client every OAuth request goes through: no redirects followed (an endpoint that
/// redirects is refused, as the OAuth security practice asks), bounded in time.
pub fn http_client() -> Result<reqwest::Client, OAuthError> {
    // iroh already brings rustls with ring; the HTTP client uses the same provider.
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .user_agent(concat!("mcpmesh/", env!("CARGO_PKG_VERSION")))
        .redirect(reqwest::redirect::Policy::none())
        .timeout(HTTP_TIMEOUT)
        .connect_timeout(HTTP_TIMEOUT)
        .build()
        .map_err(|e| OAuthError::Http(e.to_string()))
}

/// A response body of at most [`MAX_BODY`] bytes.
async fn body_of(mut response: reqwest::Response) -> Result<Vec<u8>, OAuthError> {
    let mut body = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| OAuthError::Http(e.to_string()))?
    {
        if body.len() + chunk.len() > MAX_BODY {
            return Err(OAuthError::Http("an answer over 1 MiB".into()));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn grant() -> Grant {
        Grant {
            url: "http://127.0.0.1:9/mcp".into(),
            resource: "http://127.0.0.1:9/mcp".into(),
            issuer: "http://127.0.0.1:9".into(),
            token_endpoint: "http://127.0.0.1:9/token".into(),
            revocation_endpoint: None,
            client_id: "client".into(),
            client_secret: Some("client-secret-value".into()),
            secret_in_body: false,
            client_credentials: false,
            client_key: None,
            access_token: "access-token-value".into(),
            refresh_token: Some("refresh-token-value".into()),
            expires_at: Some(1),
            issued_at: 0,
            scopes: vec!["mcp:read".into()],
            wanted: None,
        }
    }

    #[test]
    fn a_grant_is_kept_private_and_never_shown_in_debug_output() {
        let dir = tempfile::tempdir().unwrap();
        let files = GrantFiles::new(&Profile::at(dir.path()));
        assert_eq!(files.load("wiki").unwrap(), None);
        files.save("wiki", &grant()).unwrap();
        assert_eq!(files.load("wiki").unwrap(), Some(grant()));
        let path = dir.path().join("oauth/wiki.grant.json");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let dir_mode = std::fs::metadata(path.parent().unwrap())
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(dir_mode & 0o077, 0, "the directory is the user's alone");
        let shown = format!("{:?}", grant());
        for secret in [
            "access-token-value",
            "refresh-token-value",
            "client-secret-value",
        ] {
            assert!(!shown.contains(secret), "{shown}");
        }
        // A file others may read is refused, not used.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(files.load("wiki").is_err());
        assert!(files.remove("wiki").unwrap());
        assert!(!files.remove("wiki").unwrap());
    }

    #[test]
    fn a_grant_lapses_by_its_expiry_and_one_without_expiry_never_does() {
        let now = crate::time::unix_ms() / 1000;
        let at = |expires_at| Grant {
            expires_at,
            issued_at: now - 3500,
            ..grant()
        };
        assert!(at(Some(now + 10)).lapses_within(REFRESH_AHEAD));
        assert!(!at(Some(now + 120)).lapses_within(REFRESH_AHEAD));
        assert!(!at(None).lapses_within(REFRESH_AHEAD));
        // A token good for 9 s is refreshed 3 s before it lapses, not at once.
        let short = Grant {
            expires_at: Some(now + 9),
            issued_at: now,
            ..grant()
        };
        assert!(!short.lapses_within(REFRESH_AHEAD));
        assert!(at(Some(now.saturating_sub(1))).lapses_within(Duration::ZERO));
    }
}
