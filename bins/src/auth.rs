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

pub fn run(profile: &Profile, out: &Output, auth: Auth) -> Result<(), Failure> {
    let files = GrantFiles::new(profile);
    if auth.logout {
        let had = files.remove(&auth.name)?;
        files.remove_pending(&auth.name)?;
        out.print(
            json!({ "service": auth.name, "authorized": false }),
            || match had {
                true => format!("forgot the OAuth grant of {}", auth.name),
                false => format!("{} had no OAuth grant", auth.name),
            },
        );
        return Ok(());
    }
    if auth.status {
        let grant = files.load(&auth.name)?;
        let answer = described(&auth.name, grant.as_ref());
        out.print(answer.clone(), || match &grant {
            Some(g) => format!("{} is authorized by {}{}", auth.name, g.issuer, until(g)),
            None => format!(
                "{} has no OAuth grant: run `mcpmesh auth {}`",
                auth.name, auth.name
            ),
        });
        return Ok(());
    }
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
