//! `mcpmesh auth NAME`: making, showing and dropping a service's grant, in the CLI's own
//! process (the browser and the loopback redirect are the user's; the node reads the grant
//! from its file when a session needs it).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::http::Uri;
use axum::response::Html;
use axum::routing::get;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::flow::{self, ClientSettings, PENDING_FOR, Redirect};
use super::{Grant, GrantFiles, OAuthError};
use crate::config::{BackendSpec, ConfigFile};
use crate::paths::Profile;

/// The service a grant is for, as the config names it.
#[derive(Debug, Clone)]
pub struct Target {
    pub service: String,
    pub url: String,
    pub settings: ClientSettings,
}

impl Target {
    /// The `url` service `service` of the profile's config.
    pub fn of(profile: &Profile, service: &str) -> Result<Target, OAuthError> {
        let settings = ConfigFile::new(profile.config_file())
            .load()
            .map_err(|e| OAuthError::Discovery(e.to_string()))?;
        let spec = settings
            .services
            .into_iter()
            .find(|s| s.name == service)
            .ok_or_else(|| OAuthError::Discovery(format!("no service named {service:?}")))?;
        match spec.backend {
            BackendSpec::Url { url, oauth, .. } => Ok(Target {
                service: service.to_owned(),
                url,
                settings: oauth.unwrap_or_default(),
            }),
            _ => Err(OAuthError::Discovery(format!(
                "{service} is not a url service: only those are OAuth clients"
            ))),
        }
    }
}

/// How `auth` ended.
#[derive(Debug)]
pub enum Outcome {
    Authorized(Box<Grant>),
    /// No browser to open: the user opens `authorize_url` anywhere and gives the URL it was
    /// redirected to to `mcpmesh auth NAME --redirect-url`.
    Open {
        authorize_url: String,
    },
}

/// Begins an authorization of `target`: with a `browser` command, opens it on the
/// authorization URL and finishes on the loopback redirect; without one, leaves it to
/// [`finish`].
pub async fn authorize(
    profile: &Profile,
    target: &Target,
    browser: Option<&str>,
) -> Result<Outcome, OAuthError> {
    let files = GrantFiles::new(profile);
    files.remove_pending(&target.service)?;
    let previous = files.load(&target.service)?;
    let http = super::http_client()?;
    if target.settings.client_credentials {
        let grant =
            flow::client_credentials(&http, &target.url, &target.settings, previous.as_ref())
                .await?;
        files.save(&target.service, &grant)?;
        return Ok(Outcome::Authorized(Box::new(grant)));
    }
    let loopback = Loopback::bind().await?;
    let begun = flow::begin(
        &http,
        &target.url,
        &target.settings,
        &loopback.redirect_uri,
        previous.as_ref(),
    )
    .await?;
    files.save_pending(&target.service, &begun.pending)?;
    let Some(browser) = browser else {
        return Ok(Outcome::Open {
            authorize_url: begun.authorize_url,
        });
    };
    let redirect = loopback
        .wait(browser, &begun.authorize_url, PENDING_FOR)
        .await?;
    let grant = flow::finish(&http, &begun.pending, &redirect).await?;
    files.save(&target.service, &grant)?;
    files.remove_pending(&target.service)?;
    Ok(Outcome::Authorized(Box::new(grant)))
}

/// Finishes the authorization begun for `service` with the URL the browser was sent to.
pub async fn finish(
    profile: &Profile,
    service: &str,
    redirect_url: &str,
) -> Result<Grant, OAuthError> {
    let files = GrantFiles::new(profile);
    let pending = files
        .load_pending(service)?
        .ok_or_else(|| OAuthError::NoPending(service.to_owned()))?;
    let http = super::http_client()?;
    let grant = flow::finish(&http, &pending, &Redirect::parse(redirect_url)).await?;
    files.save(service, &grant)?;
    files.remove_pending(service)?;
    Ok(grant)
}

/// The redirect's listener on loopback, for the one request the browser makes to it.
struct Loopback {
    listener: TcpListener,
    redirect_uri: String,
}

impl Loopback {
    async fn bind() -> Result<Loopback, OAuthError> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| OAuthError::Callback(format!("cannot listen on loopback: {e}")))?;
        let port = listener
            .local_addr()
            .map_err(|e| OAuthError::Callback(e.to_string()))?
            .port();
        Ok(Loopback {
            listener,
            redirect_uri: format!("http://127.0.0.1:{port}/callback"),
        })
    }

    /// Opens `browser` on `url` and waits (at most `limit`) for the redirect. A browser
    /// command that fails before the redirect comes ends the wait.
    async fn wait(self, browser: &str, url: &str, limit: Duration) -> Result<Redirect, OAuthError> {
        let (tx, rx) = tokio::sync::oneshot::channel::<String>();
        let tx = Arc::new(Mutex::new(Some(tx)));
        let app = Router::new().route(
            "/callback",
            get(move |uri: Uri| {
                let tx = tx.clone();
                async move {
                    if let Some(tx) = tx.lock().unwrap_or_else(|p| p.into_inner()).take() {
                        let _ = tx.send(uri.to_string());
                    }
                    Html("<!doctype html><p>mcpmesh: the authorization is done; this page may be closed.</p>")
                }
            }),
        );
        let stop = CancellationToken::new();
        let stopped = stop.clone();
        let server = tokio::spawn(async move {
            axum::serve(self.listener, app)
                .with_graceful_shutdown(stopped.cancelled_owned())
                .await
        });
        let mut child = open_browser(browser, url)?;
        let browser_failed = async {
            match child.wait().await {
                Ok(status) if status.success() => std::future::pending().await,
                Ok(status) => status.to_string(),
                Err(e) => e.to_string(),
            }
        };
        let got = tokio::select! {
            got = rx => got.map_err(|_| OAuthError::Callback("the redirect listener stopped".into())),
            why = browser_failed => Err(OAuthError::Callback(format!("the browser command failed ({why}) before the redirect came"))),
            () = tokio::time::sleep(limit) => Err(OAuthError::Callback(format!(
                "no redirect within {} minutes", limit.as_secs() / 60
            ))),
        };
        // The page is answered before the listener stops.
        stop.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(2), server).await;
        Ok(Redirect::parse(&got?))
    }
}

/// Starts `command` (split like a shell would, no shell run) with `url` as its last argument.
fn open_browser(command: &str, url: &str) -> Result<tokio::process::Child, OAuthError> {
    let mut words = shlex::split(command)
        .filter(|w| !w.is_empty())
        .ok_or_else(|| OAuthError::Callback(format!("--browser {command:?}: not a command")))?;
    let program = words.remove(0);
    tokio::process::Command::new(&program)
        .args(words)
        .arg(url)
        .stdin(std::process::Stdio::null())
        .spawn()
        .map_err(|e| OAuthError::Callback(format!("cannot start the browser {program:?}: {e}")))
}
