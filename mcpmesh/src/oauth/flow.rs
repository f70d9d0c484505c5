//! Making a grant: client registration, the authorization-code flow with PKCE (S256), the
//! RFC 8707 `resource` on every request, the RFC 9207 `iss` check on the redirect — and
//! refreshing the grant later.

use std::time::Duration;

use oauth2::basic::BasicClient;
use oauth2::{
    AuthUrl, AuthorizationCode, ClientId, ClientSecret, CsrfToken, PkceCodeChallenge,
    PkceCodeVerifier, RedirectUrl, RefreshToken, Scope, TokenResponse, TokenUrl,
};
use serde::Deserialize;
use subtle::ConstantTimeEq;

use super::discovery::{self, Found};
use super::{Grant, OAuthError, Pending, body_of};

/// How a service's node registers as a client: the `[services.NAME.oauth]` settings.
pub use crate::config::ClientSettings;

/// How long an authorization begun may be finished.
pub const PENDING_FOR: Duration = Duration::from_secs(10 * 60);

/// An authorization begun: the URL to open, and what finishing it needs.
#[derive(Debug)]
pub struct Begun {
    pub authorize_url: String,
    pub pending: Pending,
}

/// Discovers `url`'s authorization server, registers (or uses the configured client) with
/// `redirect_uri`, and builds the authorization URL.
pub async fn begin(
    http: &reqwest::Client,
    url: &str,
    settings: &ClientSettings,
    redirect_uri: &str,
    previous: Option<&Grant>,
) -> Result<Begun, OAuthError> {
    let parsed = crate::config::validate_url(url).map_err(OAuthError::Discovery)?;
    let found = discovery::discover(http, &parsed).await?;
    let Client {
        id: client_id,
        secret: client_secret,
        secret_in_body,
    } = client(http, &found, settings, redirect_uri).await?;
    let scopes = scopes(&found, settings, previous);
    let resource = found.protected.resource.clone();
    let mut oauth = BasicClient::new(ClientId::new(client_id.clone()))
        .set_auth_uri(
            AuthUrl::new(found.server.authorization_endpoint.clone())
                .map_err(|e| OAuthError::Discovery(format!("authorization_endpoint: {e}")))?,
        )
        .set_redirect_uri(
            RedirectUrl::new(redirect_uri.to_owned())
                .map_err(|e| OAuthError::Discovery(format!("redirect URI: {e}")))?,
        );
    if let Some(secret) = &client_secret {
        oauth = oauth.set_client_secret(ClientSecret::new(secret.clone()));
    }
    let (challenge, verifier) = PkceCodeChallenge::new_random_sha256();
    let mut request = oauth
        .authorize_url(CsrfToken::new_random)
        .set_pkce_challenge(challenge)
        .add_extra_param("resource", resource.clone());
    for scope in &scopes {
        request = request.add_scope(Scope::new(scope.clone()));
    }
    let (authorize_url, state) = request.url();
    Ok(Begun {
        authorize_url: authorize_url.to_string(),
        pending: Pending {
            url: url.to_owned(),
            resource,
            issuer: found.server.issuer.clone(),
            token_endpoint: found.server.token_endpoint.clone(),
            revocation_endpoint: found.server.revocation_endpoint.clone(),
            client_id,
            client_secret,
            secret_in_body,
            redirect_uri: redirect_uri.to_owned(),
            state: state.secret().clone(),
            verifier: verifier.secret().clone(),
            scopes,
            iss_required: found.server.authorization_response_iss_parameter_supported,
            created_at: crate::time::unix_ms() / 1000,
        },
    })
}

/// The scopes to ask for: configured ones, else what the server's 401 asked for, else all
/// its metadata lists (the resource's, else the authorization server's).
///
/// A step-up (the `previous` grant was refused for want of scope) asks for what it held, what
/// the refusal named — or, when it named nothing, every scope the resource lists — as well.
fn scopes(found: &Found, settings: &ClientSettings, previous: Option<&Grant>) -> Vec<String> {
    let mut scopes = if !settings.scopes.is_empty() {
        settings.scopes.clone()
    } else if let Some(scope) = &found.challenge_scope {
        scope.split_whitespace().map(str::to_owned).collect()
    } else if !found.protected.scopes_supported.is_empty() {
        found.protected.scopes_supported.clone()
    } else {
        found.server.scopes_supported.clone()
    };
    if let Some(previous) = previous
        && let Some(wanted) = &previous.wanted
    {
        let more = match wanted.is_empty() {
            true => &found.protected.scopes_supported,
            false => wanted,
        };
        for scope in previous.scopes.iter().chain(more) {
            if !scopes.contains(scope) {
                scopes.push(scope.clone());
            }
        }
    }
    scopes
}

/// The OAuth client the node is to its server's authorization server.
struct Client {
    id: String,
    secret: Option<String>,
    /// `client_secret_post` rather than `client_secret_basic`.
    secret_in_body: bool,
}

/// How a client with a secret authenticates at the token endpoint, among the methods the
/// authorization server lists (none listed: HTTP Basic, RFC 8414's default).
fn secret_in_body(supported: &[String]) -> bool {
    let offers = |m: &str| supported.iter().any(|s| s == m);
    !supported.is_empty() && !offers("client_secret_basic") && offers("client_secret_post")
}

/// The client to use: configured, a Client ID Metadata Document where the server takes one,
/// else a dynamic registration (RFC 7591).
async fn client(
    http: &reqwest::Client,
    found: &Found,
    settings: &ClientSettings,
    redirect_uri: &str,
) -> Result<Client, OAuthError> {
    let supported = &found.server.token_endpoint_auth_methods_supported;
    if let Some(id) = &settings.client_id {
        return Ok(Client {
            id: id.clone(),
            secret: settings.client_secret.clone(),
            secret_in_body: secret_in_body(supported),
        });
    }
    if let Some(document) = &settings.client_metadata_url
        && found.server.client_id_metadata_document_supported
    {
        return Ok(Client {
            id: document.clone(),
            secret: None,
            secret_in_body: false,
        });
    }
    let endpoint = found.server.registration_endpoint.as_deref().ok_or_else(|| {
        OAuthError::Discovery(format!(
            "the authorization server {} offers no client registration: set client_id in [services.NAME.oauth]",
            found.server.issuer
        ))
    })?;
    #[derive(Deserialize)]
    struct Registered {
        client_id: String,
        #[serde(default)]
        client_secret: Option<String>,
        #[serde(default)]
        token_endpoint_auth_method: Option<String>,
    }
    // A public client where the server takes one; else the secret method it offers.
    let method = match supported.iter().any(|m| m == "none") || supported.is_empty() {
        true => "none",
        false if secret_in_body(supported) => "client_secret_post",
        false => "client_secret_basic",
    };
    let metadata = serde_json::json!({
        "client_name": "mcpmesh",
        "redirect_uris": [redirect_uri],
        "grant_types": ["authorization_code", "refresh_token"],
        "response_types": ["code"],
        "token_endpoint_auth_method": method,
    });
    let answer = http
        .post(endpoint)
        .header("content-type", "application/json")
        .body(metadata.to_string())
        .send()
        .await
        .map_err(|e| OAuthError::Http(format!("registering at {endpoint}: {e}")))?;
    let status = answer.status();
    let body = body_of(answer).await?;
    if !status.is_success() {
        return Err(OAuthError::Refused(format!(
            "registration at {endpoint}: {status} {}",
            String::from_utf8_lossy(&body[..body.len().min(512)])
        )));
    }
    let registered: Registered = serde_json::from_slice(&body)
        .map_err(|e| OAuthError::Refused(format!("registration at {endpoint}: {e}")))?;
    // The method the server registered, else the one asked for.
    let registered_method = registered.token_endpoint_auth_method.as_deref();
    Ok(Client {
        id: registered.client_id,
        secret: registered.client_secret,
        secret_in_body: registered_method.unwrap_or(method) == "client_secret_post",
    })
}

/// What the authorization server's redirect carried.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Redirect {
    pub code: Option<String>,
    pub state: Option<String>,
    pub iss: Option<String>,
    pub error: Option<String>,
    pub error_description: Option<String>,
}

impl Redirect {
    /// The query of a redirect URL (or of the request line's target, `/callback?…`).
    pub fn parse(target: &str) -> Redirect {
        let query = target.split_once('?').map_or("", |(_, q)| q);
        let query = query.split('#').next().unwrap_or_default();
        let mut redirect = Redirect::default();
        for (key, value) in url::form_urlencoded::parse(query.as_bytes()) {
            let slot = match key.as_ref() {
                "code" => &mut redirect.code,
                "state" => &mut redirect.state,
                "iss" => &mut redirect.iss,
                "error" => &mut redirect.error,
                "error_description" => &mut redirect.error_description,
                _ => continue,
            };
            *slot = Some(value.into_owned());
        }
        redirect
    }
}

/// Finishes `pending` with the redirect the browser was sent to: state and issuer checked,
/// the code exchanged for tokens.
pub async fn finish(
    http: &reqwest::Client,
    pending: &Pending,
    redirect: &Redirect,
) -> Result<Grant, OAuthError> {
    let age = (crate::time::unix_ms() / 1000).saturating_sub(pending.created_at);
    if age > PENDING_FOR.as_secs() {
        return Err(OAuthError::Callback(
            "this authorization was begun over 10 minutes ago; run `mcpmesh auth` again".into(),
        ));
    }
    if let Some(error) = &redirect.error {
        let more = redirect.error_description.as_deref().unwrap_or_default();
        return Err(OAuthError::Refused(
            format!("{error} {more}").trim().to_owned(),
        ));
    }
    let state = redirect.state.as_deref().unwrap_or_default();
    if !bool::from(state.as_bytes().ct_eq(pending.state.as_bytes())) {
        return Err(OAuthError::Callback(
            "the redirect is not for this authorization (its state differs)".into(),
        ));
    }
    match &redirect.iss {
        Some(iss) if iss.trim_end_matches('/') != pending.issuer.trim_end_matches('/') => {
            return Err(OAuthError::Callback(format!(
                "the redirect comes from another issuer ({iss:?}, not {:?})",
                pending.issuer
            )));
        }
        None if pending.iss_required => {
            return Err(OAuthError::Callback(
                "the redirect lacks the issuer its server promised (iss)".into(),
            ));
        }
        _ => {}
    }
    let code = redirect
        .code
        .clone()
        .ok_or_else(|| OAuthError::Callback("the redirect carries no code".into()))?;
    let mut oauth = BasicClient::new(ClientId::new(pending.client_id.clone()))
        .set_token_uri(token_url(&pending.token_endpoint)?)
        .set_redirect_uri(
            RedirectUrl::new(pending.redirect_uri.clone())
                .map_err(|e| OAuthError::Callback(e.to_string()))?,
        );
    if let Some(secret) = &pending.client_secret {
        oauth = oauth.set_client_secret(ClientSecret::new(secret.clone()));
    }
    if pending.secret_in_body {
        oauth = oauth.set_auth_type(oauth2::AuthType::RequestBody);
    }
    let send = Exchanger(http.clone());
    let tokens = oauth
        .exchange_code(AuthorizationCode::new(code))
        .set_pkce_verifier(PkceCodeVerifier::new(pending.verifier.clone()))
        .add_extra_param("resource", pending.resource.clone())
        .request_async(&send)
        .await
        .map_err(|e| OAuthError::Refused(describe(&e)))?;
    let asked = Grant {
        url: pending.url.clone(),
        resource: pending.resource.clone(),
        issuer: pending.issuer.clone(),
        token_endpoint: pending.token_endpoint.clone(),
        revocation_endpoint: pending.revocation_endpoint.clone(),
        client_id: pending.client_id.clone(),
        client_secret: pending.client_secret.clone(),
        secret_in_body: pending.secret_in_body,
        client_credentials: false,
        client_key: None,
        access_token: String::new(),
        refresh_token: None,
        expires_at: None,
        issued_at: 0,
        scopes: pending.scopes.clone(),
        wanted: None,
    };
    Ok(renewed(asked, &tokens))
}

/// `grant` holding the tokens of `answer`: a refresh token, expiry or scope the answer does
/// not give stays as it was.
fn renewed(grant: Grant, answer: &oauth2::basic::BasicTokenResponse) -> Grant {
    let now = crate::time::unix_ms() / 1000;
    Grant {
        access_token: answer.access_token().secret().clone(),
        refresh_token: answer
            .refresh_token()
            .map(|t| t.secret().clone())
            .or(grant.refresh_token.clone()),
        expires_at: answer.expires_in().map(|d| now + d.as_secs()),
        issued_at: now,
        scopes: answer
            .scopes()
            .map(|s| s.iter().map(|s| s.to_string()).collect())
            .unwrap_or_else(|| grant.scopes.clone()),
        ..grant
    }
}

/// A grant by the client-credentials grant (RFC 6749 §4.4) for `url`: discovery as for a
/// user's grant, then the configured client asks the token endpoint itself — no browser.
pub async fn client_credentials(
    http: &reqwest::Client,
    url: &str,
    settings: &ClientSettings,
    previous: Option<&Grant>,
) -> Result<Grant, OAuthError> {
    let parsed = crate::config::validate_url(url).map_err(OAuthError::Discovery)?;
    let found = discovery::discover(http, &parsed).await?;
    let Some(client_id) = &settings.client_id else {
        return Err(OAuthError::Discovery(
            "the client-credentials grant needs client_id in [services.NAME.oauth]".into(),
        ));
    };
    let asked = Grant {
        url: url.to_owned(),
        resource: found.protected.resource.clone(),
        issuer: found.server.issuer.clone(),
        token_endpoint: found.server.token_endpoint.clone(),
        revocation_endpoint: found.server.revocation_endpoint.clone(),
        client_id: client_id.clone(),
        client_secret: settings.client_secret.clone(),
        secret_in_body: secret_in_body(&found.server.token_endpoint_auth_methods_supported),
        client_credentials: true,
        client_key: settings.client_key.clone(),
        access_token: String::new(),
        refresh_token: None,
        expires_at: None,
        issued_at: 0,
        scopes: scopes(&found, settings, previous),
        wanted: None,
    };
    reissue(http, asked).await
}

/// `grant` (a client-credentials one) with a new access token, asked for as it was first.
async fn reissue(http: &reqwest::Client, grant: Grant) -> Result<Grant, OAuthError> {
    let mut oauth = BasicClient::new(ClientId::new(grant.client_id.clone()))
        .set_token_uri(token_url(&grant.token_endpoint)?);
    if let Some(secret) = &grant.client_secret {
        oauth = oauth.set_client_secret(ClientSecret::new(secret.clone()));
    }
    let mut assertion = None;
    if let Some(path) = &grant.client_key {
        assertion = Some(client_assertion(path.clone(), &grant.client_id, &grant.issuer).await?);
    }
    if grant.secret_in_body || assertion.is_some() {
        oauth = oauth.set_auth_type(oauth2::AuthType::RequestBody);
    }
    let send = Exchanger(http.clone());
    let mut request = oauth
        .exchange_client_credentials()
        .add_scopes(grant.scopes.iter().cloned().map(Scope::new))
        .add_extra_param("resource", grant.resource.clone());
    if let Some(assertion) = assertion {
        request = request
            .add_extra_param("client_assertion_type", JWT_BEARER)
            .add_extra_param("client_assertion", assertion);
    }
    let tokens = request
        .request_async(&send)
        .await
        .map_err(|e| OAuthError::Refused(describe(&e)))?;
    Ok(renewed(grant, &tokens))
}

/// RFC 7523's client assertion type.
const JWT_BEARER: &str = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer";

/// A client assertion signed with the key in `path` (read off the runtime; a secret file:
/// `0600`, not a link), for the authorization server `issuer`.
async fn client_assertion(
    path: std::path::PathBuf,
    client_id: &str,
    issuer: &str,
) -> Result<String, OAuthError> {
    let shown = path.display().to_string();
    let read = tokio::task::spawn_blocking(move || crate::files::read_secret(&path, 64 * 1024))
        .await
        .map_err(|e| OAuthError::Http(e.to_string()))?;
    let store = |message: String| OAuthError::Store {
        path: shown.clone(),
        message,
    };
    let pem = read
        .map_err(|e| store(e.to_string()))?
        .ok_or_else(|| store("no such file".into()))?;
    crate::assertion::client_assertion(&pem, client_id, issuer).map_err(|e| store(e.to_string()))
}

/// `grant` with a fresh access token (and the rotated refresh token, when the server rotates);
/// a client-credentials grant asks for a new one.
pub async fn refresh(http: &reqwest::Client, grant: &Grant) -> Result<Grant, OAuthError> {
    if grant.client_credentials {
        return reissue(http, grant.clone()).await;
    }
    let refresh = grant
        .refresh_token
        .clone()
        .ok_or_else(|| OAuthError::Refused("the grant has no refresh token".into()))?;
    let mut oauth = BasicClient::new(ClientId::new(grant.client_id.clone()))
        .set_token_uri(token_url(&grant.token_endpoint)?);
    if let Some(secret) = &grant.client_secret {
        oauth = oauth.set_client_secret(ClientSecret::new(secret.clone()));
    }
    if grant.secret_in_body {
        oauth = oauth.set_auth_type(oauth2::AuthType::RequestBody);
    }
    let send = Exchanger(http.clone());
    let tokens = oauth
        .exchange_refresh_token(&RefreshToken::new(refresh))
        .add_extra_param("resource", grant.resource.clone())
        .request_async(&send)
        .await
        .map_err(|e| OAuthError::Refused(describe(&e)))?;
    Ok(renewed(grant.clone(), &tokens))
}

/// Revokes `grant` at its authorization server (RFC 7009): the refresh token, which takes the
/// grant with it at most servers, and the access token. `Ok(false)` when the server offers no
/// revocation. A client-credentials grant has no refresh token: its access token is revoked.
/// The request is made by hand: the `oauth2` crate insists on HTTPS for this endpoint alone,
/// while the token endpoint of the same server is taken as discovery found it.
pub async fn revoke(http: &reqwest::Client, grant: &Grant) -> Result<bool, OAuthError> {
    let Some(endpoint) = &grant.revocation_endpoint else {
        return Ok(false);
    };
    let mut tokens = Vec::new();
    if let Some(refresh) = &grant.refresh_token {
        tokens.push((refresh.as_str(), "refresh_token"));
    }
    tokens.push((grant.access_token.as_str(), "access_token"));
    for (token, hint) in tokens {
        // The client id goes in the body whatever the authentication (some servers, the MCP
        // Python SDK's among them, look for it there even beside Basic).
        let mut form = vec![
            ("token", token.to_owned()),
            ("token_type_hint", hint.to_owned()),
            ("client_id", grant.client_id.clone()),
        ];
        let mut request = http.post(endpoint);
        if let Some(path) = &grant.client_key {
            let assertion = client_assertion(path.clone(), &grant.client_id, &grant.issuer).await?;
            form.push(("client_assertion_type", JWT_BEARER.to_owned()));
            form.push(("client_assertion", assertion));
        } else {
            match &grant.client_secret {
                Some(secret) if !grant.secret_in_body => {
                    // RFC 6749 §2.3.1: each part form-encoded before Basic.
                    let encode = |s: &str| {
                        url::form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>()
                    };
                    request = request.basic_auth(encode(&grant.client_id), Some(encode(secret)));
                }
                Some(secret) => form.push(("client_secret", secret.clone())),
                None => {}
            }
        }
        let answer = request
            .header(
                reqwest::header::CONTENT_TYPE,
                "application/x-www-form-urlencoded",
            )
            .body(
                url::form_urlencoded::Serializer::new(String::new())
                    .extend_pairs(&form)
                    .finish(),
            )
            .send()
            .await
            .map_err(|e| OAuthError::Http(e.without_url().to_string()))?;
        let status = answer.status();
        if !status.is_success() {
            // The answer's `error` code only: nothing else of its body is shown.
            let body = body_of(answer).await.unwrap_or_default();
            let code = serde_json::from_slice::<serde_json::Value>(&body)
                .ok()
                .and_then(|v| v["error"].as_str().map(str::to_owned));
            return Err(OAuthError::Refused(match code {
                Some(code) => format!("revocation answered {status}: {code}"),
                None => format!("revocation answered {status}"),
            }));
        }
    }
    Ok(true)
}

fn token_url(endpoint: &str) -> Result<TokenUrl, OAuthError> {
    TokenUrl::new(endpoint.to_owned())
        .map_err(|e| OAuthError::Discovery(format!("token_endpoint: {e}")))
}

/// A token-endpoint failure in a few words, never a token.
fn describe<RE: std::error::Error + 'static, T: oauth2::ErrorResponse>(
    e: &oauth2::RequestTokenError<RE, T>,
) -> String {
    match e {
        oauth2::RequestTokenError::ServerResponse(answer) => answer.to_string(),
        oauth2::RequestTokenError::Request(e) => e.to_string(),
        oauth2::RequestTokenError::Parse(e, _) => format!("an answer that is not a token: {e}"),
        oauth2::RequestTokenError::Other(e) => e.clone(),
    }
}

/// The failure of one OAuth HTTP exchange.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ExchangeError(String);

/// Token-endpoint requests through our client. A named type rather than a closure, so the
/// futures stay `Send` (the daemon refreshes grants on its multi-task runtime).
struct Exchanger(reqwest::Client);

impl<'c> oauth2::AsyncHttpClient<'c> for Exchanger {
    type Error = ExchangeError;
    type Future = std::pin::Pin<
        Box<dyn Future<Output = Result<oauth2::HttpResponse, ExchangeError>> + Send + 'c>,
    >;

    fn call(&'c self, request: oauth2::HttpRequest) -> Self::Future {
        Box::pin(exchange(&self.0, request))
    }
}

/// One token-endpoint request through our client.
async fn exchange(
    http: &reqwest::Client,
    request: oauth2::HttpRequest,
) -> Result<oauth2::HttpResponse, ExchangeError> {
    let (parts, body) = request.into_parts();
    let answer = http
        .request(parts.method, parts.uri.to_string())
        .headers(parts.headers)
        .body(body)
        .send()
        .await
        .map_err(|e| ExchangeError(e.to_string()))?;
    let mut response = oauth2::http::Response::builder().status(answer.status());
    for (name, value) in answer.headers() {
        response = response.header(name, value);
    }
    let body = body_of(answer)
        .await
        .map_err(|e| ExchangeError(e.to_string()))?;
    response
        .body(body)
        .map_err(|e| ExchangeError(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_redirect_gives_its_code_state_issuer_or_error() {
        let r = Redirect::parse(
            "http://127.0.0.1:9/callback?code=a%2Fb&state=s&iss=http%3A%2F%2F127.0.0.1%3A8&x=1#f",
        );
        assert_eq!(r.code.as_deref(), Some("a/b"));
        assert_eq!(r.state.as_deref(), Some("s"));
        assert_eq!(r.iss.as_deref(), Some("http://127.0.0.1:8"));
        let r = Redirect::parse("/callback?error=access_denied&error_description=no&state=s");
        assert_eq!(r.error.as_deref(), Some("access_denied"));
        assert_eq!(r.code, None);
        assert_eq!(Redirect::parse("/callback"), Redirect::default());
    }

    fn pending() -> Pending {
        Pending {
            url: "http://127.0.0.1:9/mcp".into(),
            resource: "http://127.0.0.1:9/mcp".into(),
            issuer: "http://127.0.0.1:8".into(),
            token_endpoint: "http://127.0.0.1:8/token".into(),
            revocation_endpoint: None,
            client_id: "c".into(),
            client_secret: None,
            secret_in_body: false,
            redirect_uri: "http://127.0.0.1:7/callback".into(),
            state: "the-state".into(),
            verifier: "v".repeat(43),
            scopes: vec![],
            iss_required: true,
            created_at: crate::time::unix_ms() / 1000,
        }
    }

    #[tokio::test]
    async fn a_redirect_for_another_authorization_or_issuer_is_refused_before_any_exchange() {
        let http = super::super::http_client().unwrap();
        let p = pending();
        let with = |q: &str| Redirect::parse(&format!("/callback?{q}"));
        for (query, says) in [
            (
                "code=c&state=other&iss=http%3A%2F%2F127.0.0.1%3A8",
                "state differs",
            ),
            (
                "code=c&state=the-state&iss=http%3A%2F%2Fevil",
                "another issuer",
            ),
            ("code=c&state=the-state", "lacks the issuer"),
            ("state=the-state&iss=http%3A%2F%2F127.0.0.1%3A8", "no code"),
            ("error=access_denied&state=the-state", "access_denied"),
        ] {
            let e = finish(&http, &p, &with(query))
                .await
                .unwrap_err()
                .to_string();
            assert!(e.contains(says), "{query}: {e}");
        }
        let old = Pending {
            created_at: 1,
            ..pending()
        };
        let e = finish(&http, &old, &with("code=c&state=the-state"))
            .await
            .unwrap_err();
        assert!(e.to_string().contains("10 minutes"), "{e}");
    }
}
