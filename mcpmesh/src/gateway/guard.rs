//! The checks every gateway request passes before any handler: the bearer token, and `Host`
//! and `Origin` against DNS rebinding.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;

use super::Gateway;
use super::answer::plain;
use crate::http_checks::{bearer_token, constant_time_eq, foreign_host_or_origin};

/// Host, Origin and bearer checks, before any handler.
pub(super) async fn guard(
    State(gateway): State<Arc<Gateway>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let config = &gateway.config;
    let headers = request.headers();
    if let Some(token) = config.token.as_deref().filter(|t| !t.is_empty()) {
        let given = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(bearer_token)
            .unwrap_or_default();
        if !constant_time_eq(given.as_bytes(), token.as_bytes()) {
            let mut r = plain(StatusCode::UNAUTHORIZED, "a bearer token is required");
            r.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            return r;
        }
    }
    if let Some(refused) = foreign_host_or_origin(
        headers,
        config.listen.ip().is_loopback(),
        &config.allowed_hosts,
        &config.allowed_origins,
    ) {
        return refused;
    }
    next.run(request).await
}
