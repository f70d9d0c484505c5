//! `mcpmesh auth NAME`: the OAuth grant a `url` service's server requires.

use anyhow::Context;
use mcpmesh::oauth::auth::{Outcome, Target};
use mcpmesh::oauth::{Grant, GrantFiles};
use mcpmesh::paths::Profile;
use serde_json::{Value, json};

use crate::output::{Failure, Output};

/// What was asked of `auth`.
pub struct Auth {
    pub name: String,
    pub browser: Option<String>,
    pub redirect_url: Option<String>,
    pub status: bool,
    pub logout: bool,
}

/// Revokes `grant` at its server; `Ok(false)` when the server offers no revocation.
fn revoke(grant: &mcpmesh::oauth::Grant) -> Result<bool, String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    runtime.block_on(async {
        let http = mcpmesh::oauth::http_client().map_err(|e| e.to_string())?;
        mcpmesh::oauth::flow::revoke(&http, grant)
            .await
            .map_err(|e| e.to_string())
    })
}

pub fn run(profile: &Profile, out: &Output, auth: Auth) -> Result<(), Failure> {
    let files = GrantFiles::new(profile);
    if auth.logout {
        return logout(&files, &auth.name, out);
    }
    if auth.status {
        return show_grant(&files, &auth.name, out);
    }
    authorize(profile, auth, out)
}

/// `--logout`: the grant revoked at its server where it can be (RFC 7009), and forgotten here
/// in any case.
fn logout(files: &GrantFiles, name: &str, out: &Output) -> Result<(), Failure> {
    let grant = files.load(name).ok().flatten();
    let revoked = match &grant {
        Some(grant) => revoke(grant),
        None => Ok(false),
    };
    let had = files.remove(name)?;
    files.remove_pending(name)?;
    let mut answer = json!({ "service": name, "authorized": false, "revoked": false });
    match &revoked {
        Ok(done) => answer["revoked"] = json!(done),
        Err(why) => answer["revocation_failed"] = json!(why),
    }
    out.print(answer, || {
        let forgot = match had {
            true => format!("forgot the OAuth grant of {name}"),
            false => format!("{name} had no OAuth grant"),
        };
        match &revoked {
            Ok(true) => format!("{forgot}; revoked it at its authorization server"),
            Ok(false) if had => {
                format!("{forgot}; its authorization server offers no revocation")
            }
            Ok(false) => forgot,
            Err(why) => format!("{forgot}; revoking it at its server failed: {why}"),
        }
    });
    Ok(())
}

/// `--status`: whether the service has a grant, until when, for which scopes.
fn show_grant(files: &GrantFiles, name: &str, out: &Output) -> Result<(), Failure> {
    let grant = files.load(name)?;
    let answer = described(name, grant.as_ref());
    out.print(answer.clone(), || match &grant {
        Some(g) => format!("{name} is authorized by {}{}", g.issuer, until(g)),
        None => format!("{name} has no OAuth grant: run `mcpmesh auth {name}`"),
    });
    Ok(())
}

/// A new grant: finished from the redirect URL the user copied, or made now (in a browser,
/// or without one for the client-credentials grant); with no browser to open, the URL to
/// open elsewhere is the answer.
fn authorize(profile: &Profile, auth: Auth, out: &Output) -> Result<(), Failure> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let grant = match auth.redirect_url {
        Some(url) => runtime.block_on(mcpmesh::oauth::auth::finish(profile, &auth.name, &url))?,
        None => {
            let target = Target::of(profile, &auth.name)?;
            let browser = auth.browser.or_else(|| {
                std::env::var("BROWSER")
                    .ok()
                    .filter(|b| !b.trim().is_empty())
            });
            let outcome = runtime.block_on(mcpmesh::oauth::auth::authorize(
                profile,
                &target,
                browser.as_deref(),
            ))?;
            match outcome {
                Outcome::Authorized(grant) => *grant,
                Outcome::Open { authorize_url } => {
                    let mut answer = described(&auth.name, None);
                    answer["authorize_url"] = json!(authorize_url);
                    out.print(answer, || {
                        format!(
                            "open this URL in a browser, anywhere:\n  {authorize_url}\nthen, within 10 minutes, give the address it was sent to (it starts with http://127.0.0.1):\n  mcpmesh auth {} --redirect-url 'ADDRESS'",
                            auth.name
                        )
                    });
                    return Ok(());
                }
            }
        }
    };
    out.print(described(&auth.name, Some(&grant)), || {
        format!(
            "{} is authorized by {}{}",
            auth.name,
            grant.issuer,
            until(&grant)
        )
    });
    Ok(())
}

/// `{"service", "authorized", "expires_at"?, "scopes"?}`: never a token.
fn described(service: &str, grant: Option<&Grant>) -> Value {
    let mut v = json!({ "service": service, "authorized": grant.is_some() });
    if let Some(grant) = grant {
        if let Some(at) = grant.expires_at {
            v["expires_at"] = json!(at);
        }
        if !grant.scopes.is_empty() {
            v["scopes"] = json!(grant.scopes);
        }
    }
    v
}

fn until(grant: &Grant) -> String {
    let scopes = match grant.scopes.is_empty() {
        true => String::new(),
        false => format!(" for {}", grant.scopes.join(" ")),
    };
    let refresh = match grant.refresh_token {
        Some(_) => ", refreshed as it lapses",
        None => ", not refreshable",
    };
    format!("{scopes}{refresh}")
}

impl From<mcpmesh::oauth::OAuthError> for Failure {
    fn from(e: mcpmesh::oauth::OAuthError) -> Self {
        anyhow::Error::from(e).into()
    }
}
