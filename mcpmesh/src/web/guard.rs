//! The checks every status page request passes before any handler: `Host` and `Origin` as
//! the gateway checks them, then the token, from the cookie the page set, or `?token=` (traded
//! for that cookie), or an `Authorization: Bearer` header (for scripts).

use std::borrow::Cow;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::http_checks::{bearer_token, constant_time_eq, foreign_host_or_origin};

/// The token and the name of the cookie that carries it.
#[derive(Debug)]
pub(super) struct PageToken {
    token: String,
    /// Cookies are kept per host, not per port: two nodes' pages on one machine each need a
    /// name of their own.
    cookie: String,
}

impl PageToken {
    pub(super) fn new(token: String, port: u16) -> Self {
        PageToken {
            token,
            cookie: format!("mcpmesh_status_{port}"),
        }
    }

    fn matches(&self, given: &str) -> bool {
        constant_time_eq(given.as_bytes(), self.token.as_bytes())
    }
}

pub(super) async fn guard(
    State(token): State<Arc<PageToken>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let headers = request.headers();
    if let Some(refused) = foreign_host_or_origin(headers, true, &[], &[]) {
        return refused;
    }
    if let Some(given) = query_token(request.uri().query()) {
        if !token.matches(&given) || request.method() != Method::GET {
            return unauthorized();
        }
        return into_cookie(&token, request.uri().path());
    }
    let carried = cookie_token(headers, &token.cookie).or_else(|| {
        headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(bearer_token)
    });
    match carried {
        Some(given) if token.matches(given) => next.run(request).await,
        _ => unauthorized(),
    }
}

/// The answer to a right `?token=`: the cookie, and the same page without the token in its
/// URL (so it stays out of the address bar and of what is bookmarked).
fn into_cookie(token: &PageToken, path: &str) -> Response {
    let cookie = format!(
        "{}={}; HttpOnly; SameSite=Strict; Path=/",
        token.cookie, token.token
    );
    let mut r = StatusCode::SEE_OTHER.into_response();
    // Neither is ever invalid: the token is URL-safe base64 and the path came in a URI.
    if let (Ok(cookie), Ok(location)) =
        (HeaderValue::from_str(&cookie), HeaderValue::from_str(path))
    {
        r.headers_mut().insert(header::SET_COOKIE, cookie);
        r.headers_mut().insert(header::LOCATION, location);
    }
    r
}

fn unauthorized() -> Response {
    (
        StatusCode::UNAUTHORIZED,
        [(header::CONTENT_TYPE, "text/plain")],
        "this page needs its token: open the URL `mcpmesh status --web` prints",
    )
        .into_response()
}

/// The first non-empty `token` of a query string, percent-decoded by `url`'s form_urlencoded,
/// as the OAuth redirect's query is read.
fn query_token(query: Option<&str>) -> Option<Cow<'_, str>> {
    url::form_urlencoded::parse(query?.as_bytes())
        .find(|(key, value)| key == "token" && !value.is_empty())
        .map(|(_, value)| value)
}

// Ours, not the `cookie` crate's (not in the tree): finding one cookie by name in a `Cookie`
// header is a split on `;` and `=`, and the page's own cookie value is never quoted.
fn cookie_token<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|pair| {
            let (key, value) = pair.trim().split_once('=')?;
            (key == name).then_some(value)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_is_found_in_the_query_or_in_this_pages_cookie_only() {
        let token = |query| query_token(query).map(Cow::into_owned);
        assert_eq!(token(Some("a=1&token=xyz")).as_deref(), Some("xyz"));
        assert_eq!(
            token(Some("token=x-y_z&token=other")).as_deref(),
            Some("x-y_z")
        );
        assert_eq!(token(Some("token=x%2Dy")).as_deref(), Some("x-y"));
        assert_eq!(token(Some("tokens=xyz")), None);
        assert_eq!(token(Some("token")), None);
        assert_eq!(token(None), None);
        let mut headers = HeaderMap::new();
        headers.insert(
            header::COOKIE,
            HeaderValue::from_static("other=1; mcpmesh_status_9=abc; mcpmesh_status_10=def"),
        );
        assert_eq!(cookie_token(&headers, "mcpmesh_status_10"), Some("def"));
        assert_eq!(cookie_token(&headers, "mcpmesh_status_9"), Some("abc"));
        assert_eq!(cookie_token(&headers, "mcpmesh_status_1"), None);
    }
}
