//! Finding a server's authorization server, as the MCP authorization spec says: the server's
//! 401 names its protected-resource metadata (RFC 9728; else the well-known path), which
//! names the authorization server, whose own metadata (RFC 8414; OpenID discovery as the
//! fallback) names its endpoints.

use serde::Deserialize;

use super::{OAuthError, body_of};

/// What a 401's `WWW-Authenticate: Bearer …` said.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Challenge {
    pub resource_metadata: Option<String>,
    pub scope: Option<String>,
    pub error: Option<String>,
}

/// The `Bearer` challenge of a `WWW-Authenticate` value, its parameters unquoted; `None` when
/// it has none. Ours: nothing in the dependency tree (oauth2, reqwest, http) reads one.
pub fn parse_challenge(header: &str) -> Option<Challenge> {
    let rest = header.trim_start();
    let params = rest
        .get(..6)
        .filter(|scheme| scheme.eq_ignore_ascii_case("bearer"))
        .map(|_| &rest[6..])?;
    let mut challenge = Challenge::default();
    let mut input = params.trim_start();
    while !input.is_empty() {
        let Some((name, after)) = input.split_once('=') else {
            break;
        };
        let name = name
            .trim()
            .trim_start_matches(',')
            .trim()
            .to_ascii_lowercase();
        let after = after.trim_start();
        let (value, next) = match after.strip_prefix('"') {
            Some(quoted) => {
                let mut value = String::new();
                let mut chars = quoted.char_indices();
                let mut end = quoted.len();
                while let Some((i, c)) = chars.next() {
                    match c {
                        '\\' => value.extend(chars.next().map(|(_, c)| c)),
                        '"' => {
                            end = i + 1;
                            break;
                        }
                        c => value.push(c),
                    }
                }
                (value, &quoted[end..])
            }
            None => {
                let end = after.find(',').unwrap_or(after.len());
                (after[..end].trim().to_owned(), &after[end..])
            }
        };
        match name.as_str() {
            "resource_metadata" => challenge.resource_metadata = Some(value),
            "scope" => challenge.scope = Some(value),
            "error" => challenge.error = Some(value),
            _ => {}
        }
        input = next.trim_start().trim_start_matches(',').trim_start();
    }
    Some(challenge)
}

/// The `Bearer` challenges of a response's `WWW-Authenticate` headers.
pub fn challenges(response: &reqwest::Response) -> impl Iterator<Item = Challenge> + '_ {
    response
        .headers()
        .get_all(reqwest::header::WWW_AUTHENTICATE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .filter_map(parse_challenge)
}

/// RFC 9728 protected-resource metadata, the part used.
#[derive(Debug, Clone, Deserialize)]
pub struct Protected {
    pub resource: String,
    #[serde(default)]
    pub authorization_servers: Vec<String>,
    #[serde(default)]
    pub scopes_supported: Vec<String>,
}

/// RFC 8414 authorization-server metadata, the part used.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct AuthServer {
    pub issuer: String,
    pub authorization_endpoint: String,
    pub token_endpoint: String,
    #[serde(default)]
    pub registration_endpoint: Option<String>,
    /// RFC 7009: where `auth --logout` revokes the grant.
    #[serde(default)]
    pub revocation_endpoint: Option<String>,
    #[serde(default)]
    pub scopes_supported: Vec<String>,
    #[serde(default)]
    pub code_challenge_methods_supported: Vec<String>,
    #[serde(default)]
    pub token_endpoint_auth_methods_supported: Vec<String>,
    #[serde(default)]
    pub client_id_metadata_document_supported: bool,
    #[serde(default)]
    pub authorization_response_iss_parameter_supported: bool,
}

/// What discovery found for a service.
#[derive(Debug, Clone)]
pub struct Found {
    pub protected: Protected,
    pub server: AuthServer,
    /// The scope the server's 401 asked for, if it named one.
    pub challenge_scope: Option<String>,
}

/// Discovers the authorization server of the MCP server at `url`: its challenge to an
/// unauthenticated client ([`probe`]), the protected-resource metadata and the authorization
/// server's — or, for a server of the 2025-03-26 revision that publishes no protected-resource
/// metadata, the server's own origin as its authorization server.
pub async fn discover(http: &reqwest::Client, url: &reqwest::Url) -> Result<Found, OAuthError> {
    let challenge = probe(http, url).await?;
    let (protected, server) =
        match protected_metadata(http, url, challenge.resource_metadata.as_deref()).await {
            Ok(protected) => {
                if !covers(&protected.resource, url) {
                    return Err(OAuthError::Discovery(format!(
                        "the server's metadata is for {:?}, not {url}",
                        protected.resource
                    )));
                }
                let issuer = protected.authorization_servers.first().ok_or_else(|| {
                    OAuthError::Discovery(format!("{url}'s metadata names no authorization server"))
                })?;
                let server = server_metadata(http, issuer).await?;
                (protected, server)
            }
            Err(_) if challenge.resource_metadata.is_none() => {
                let origin = url.origin().ascii_serialization();
                let protected = Protected {
                    resource: url.as_str().to_owned(),
                    authorization_servers: vec![origin.clone()],
                    scopes_supported: Vec::new(),
                };
                (protected, origin_as_server(http, &origin).await)
            }
            Err(e) => return Err(e),
        };
    if !server
        .code_challenge_methods_supported
        .iter()
        .any(|m| m == "S256")
    {
        return Err(OAuthError::Discovery(format!(
            "the authorization server {} does not offer PKCE with S256",
            server.issuer
        )));
    }
    Ok(Found {
        protected,
        server,
        challenge_scope: challenge.scope,
    })
}

/// The challenge `url` gives a client without a grant: the answer to an unauthenticated
/// `initialize` — or, from a server that lets anyone initialize, to the request after it
/// (`tools/list` in that session, which then ends). A server that answers both without a
/// 401 needs no grant.
async fn probe(http: &reqwest::Client, url: &reqwest::Url) -> Result<Challenge, OAuthError> {
    const VERSION: &str = "2025-11-25";
    let post = |body: serde_json::Value, session: Option<&reqwest::header::HeaderValue>| {
        let mut request = http
            .post(url.clone())
            .header("accept", "application/json, text/event-stream")
            .header("content-type", "application/json")
            .body(body.to_string());
        if let Some(id) = session {
            request = request
                .header("mcp-session-id", id)
                .header("mcp-protocol-version", VERSION);
        }
        request.send()
    };
    let failed = |e: reqwest::Error| OAuthError::Http(format!("{url}: {e}"));
    let initialize = serde_json::json!({
        "jsonrpc": "2.0", "id": 0, "method": "initialize",
        "params": { "protocolVersion": VERSION, "capabilities": {},
                    "clientInfo": { "name": "mcpmesh", "version": env!("CARGO_PKG_VERSION") } }
    });
    let answer = post(initialize, None).await.map_err(failed)?;
    if answer.status() == reqwest::StatusCode::UNAUTHORIZED {
        return Ok(challenges(&answer).next().unwrap_or_default());
    }
    let status = answer.status();
    let session = answer.headers().get("mcp-session-id").cloned();
    let _ = body_of(answer).await;
    if status.is_success() {
        let initialized =
            serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        if let Ok(answer) = post(initialized, session.as_ref()).await {
            let _ = body_of(answer).await;
        }
        let list = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"});
        let answer = post(list, session.as_ref()).await.map_err(failed)?;
        let challenge = (answer.status() == reqwest::StatusCode::UNAUTHORIZED)
            .then(|| challenges(&answer).next().unwrap_or_default());
        drop(answer);
        if let Some(id) = &session {
            let end = http.delete(url.clone()).header("mcp-session-id", id);
            let _ = end.send().await;
        }
        if let Some(challenge) = challenge {
            return Ok(challenge);
        }
    }
    Err(OAuthError::Discovery(match status.is_success() {
        true => format!(
            "{url} answered {status} without asking for authorization: the service needs no grant"
        ),
        false => format!(
            "{url} answered {status} to an unauthenticated initialize, not 401 with a Bearer challenge"
        ),
    }))
}

/// A 2025-03-26 server's authorization server, at its own origin: its RFC 8414 metadata, else
/// the default endpoints that revision names (`/authorize`, `/token`, `/register`).
async fn origin_as_server(http: &reqwest::Client, origin: &str) -> AuthServer {
    match server_metadata(http, origin).await {
        Ok(server) => server,
        Err(e) => {
            tracing::debug!(
                "{origin} publishes no authorization-server metadata ({e}); using the default endpoints"
            );
            AuthServer {
                issuer: origin.to_owned(),
                authorization_endpoint: format!("{origin}/authorize"),
                token_endpoint: format!("{origin}/token"),
                registration_endpoint: Some(format!("{origin}/register")),
                code_challenge_methods_supported: vec!["S256".into()],
                ..AuthServer::default()
            }
        }
    }
}

/// Whether metadata for `resource` describes `url`: the same scheme, host and port, and a
/// path that is `url`'s or a parent of it, segment by segment (a trailing slash and the query
/// aside) — the MCP authorization spec lets one resource cover the endpoints beneath it.
fn covers(resource: &str, url: &reqwest::Url) -> bool {
    let Ok(resource) = reqwest::Url::parse(resource) else {
        return false;
    };
    let parent = resource.path().trim_end_matches('/');
    let path = url.path().trim_end_matches('/');
    resource.scheme() == url.scheme()
        && resource.host_str() == url.host_str()
        && resource.port_or_known_default() == url.port_or_known_default()
        && (path == parent
            || path
                .strip_prefix(parent)
                .is_some_and(|rest| rest.starts_with('/')))
}

async fn protected_metadata(
    http: &reqwest::Client,
    url: &reqwest::Url,
    named: Option<&str>,
) -> Result<Protected, OAuthError> {
    let mut candidates = Vec::new();
    if let Some(named) = named {
        candidates.push(named.to_owned());
    }
    let path = url.path().trim_end_matches('/');
    let origin = url.origin().ascii_serialization();
    if !path.is_empty() {
        candidates.push(format!(
            "{origin}/.well-known/oauth-protected-resource{path}"
        ));
    }
    candidates.push(format!("{origin}/.well-known/oauth-protected-resource"));
    first_document(http, &candidates, "protected-resource metadata").await
}

async fn server_metadata(http: &reqwest::Client, issuer: &str) -> Result<AuthServer, OAuthError> {
    let parsed = reqwest::Url::parse(issuer)
        .map_err(|e| OAuthError::Discovery(format!("issuer {issuer:?}: {e}")))?;
    let origin = parsed.origin().ascii_serialization();
    let path = parsed.path().trim_end_matches('/');
    let candidates = if path.is_empty() {
        vec![
            format!("{origin}/.well-known/oauth-authorization-server"),
            format!("{origin}/.well-known/openid-configuration"),
        ]
    } else {
        vec![
            format!("{origin}/.well-known/oauth-authorization-server{path}"),
            format!("{origin}/.well-known/openid-configuration{path}"),
            format!("{origin}{path}/.well-known/openid-configuration"),
        ]
    };
    let server: AuthServer =
        first_document(http, &candidates, "authorization-server metadata").await?;
    // RFC 8414 §3.3: the metadata is the issuer's own.
    if server.issuer.trim_end_matches('/') != issuer.trim_end_matches('/') {
        return Err(OAuthError::Discovery(format!(
            "the metadata of {issuer} names another issuer ({:?})",
            server.issuer
        )));
    }
    Ok(server)
}

/// The first of `candidates` that answers 200 with a JSON document of type `T`.
async fn first_document<T: for<'de> Deserialize<'de>>(
    http: &reqwest::Client,
    candidates: &[String],
    what: &str,
) -> Result<T, OAuthError> {
    let mut tried = Vec::new();
    for candidate in candidates {
        let answer = match http
            .get(candidate)
            .header("accept", "application/json")
            .send()
            .await
        {
            Ok(answer) if answer.status().is_success() => answer,
            Ok(answer) => {
                tried.push(format!("{candidate} ({})", answer.status()));
                continue;
            }
            Err(e) => {
                tried.push(format!("{candidate} ({e})"));
                continue;
            }
        };
        let body = body_of(answer).await?;
        return serde_json::from_slice(&body)
            .map_err(|e| OAuthError::Discovery(format!("{what} at {candidate}: {e}")));
    }
    Err(OAuthError::Discovery(format!(
        "no {what} found: {}",
        tried.join(", ")
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bearer_challenge_gives_its_parameters_quoted_or_not() {
        let c = parse_challenge(
            r#"Bearer error="invalid_token", error_description="the \"token\" lapsed", resource_metadata="http://127.0.0.1:9/.well-known/oauth-protected-resource/mcp", scope=mcp:read"#,
        )
        .unwrap();
        assert_eq!(c.error.as_deref(), Some("invalid_token"));
        assert_eq!(
            c.resource_metadata.as_deref(),
            Some("http://127.0.0.1:9/.well-known/oauth-protected-resource/mcp")
        );
        assert_eq!(c.scope.as_deref(), Some("mcp:read"));
        assert_eq!(parse_challenge("bearer").unwrap(), Challenge::default());
        assert_eq!(parse_challenge("Basic realm=\"x\""), None);
        assert_eq!(parse_challenge(""), None);
        // Cut short or odd: no panic, what could be read is kept.
        let c = parse_challenge(r#"Bearer scope="a b"#).unwrap();
        assert_eq!(c.scope.as_deref(), Some("a b"));
        assert!(parse_challenge("Bearer =,=\"").is_some());
    }

    #[test]
    fn metadata_describes_a_url_by_scheme_host_port_and_path_or_a_parent_of_it() {
        let url = reqwest::Url::parse("http://127.0.0.1:9/mcp").unwrap();
        assert!(covers("http://127.0.0.1:9/mcp", &url));
        assert!(covers("http://127.0.0.1:9/mcp/", &url));
        assert!(covers("http://127.0.0.1:9", &url));
        assert!(covers("http://127.0.0.1:9/", &url));
        assert!(!covers("http://127.0.0.1:9/other", &url));
        assert!(!covers("http://127.0.0.1:9/mc", &url));
        assert!(!covers("http://127.0.0.1:9/mcp/deeper", &url));
        assert!(!covers("https://127.0.0.1:9/mcp", &url));
        assert!(!covers("http://127.0.0.1:10/mcp", &url));
        assert!(!covers("not a url", &url));
        let deep = reqwest::Url::parse("http://127.0.0.1:9/team/mcp").unwrap();
        assert!(covers("http://127.0.0.1:9/team", &deep));
        assert!(!covers("http://127.0.0.1:9/tea", &deep));
    }
}
