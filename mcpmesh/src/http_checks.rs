//! The checks every HTTP surface of the node shares (the gateway, the status page, the
//! metrics endpoint): `Host` and `Origin` against DNS rebinding, and the bearer token compared
//! in constant time.

use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};

/// The refusal of a request whose `Host` (checked when `check_host`: on a loopback bind) or
/// `Origin` is neither a loopback name nor one of those allowed: what a page a DNS rebinding
/// points at this port sends. `None` when both pass.
pub(crate) fn foreign_host_or_origin(
    headers: &HeaderMap,
    check_host: bool,
    allowed_hosts: &[String],
    allowed_origins: &[String],
) -> Option<Response> {
    if check_host {
        let host = headers
            .get(header::HOST)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        let name = host_name(host);
        if !is_loopback_name(name) && !allowed_hosts.iter().any(|h| h == name) {
            return Some(forbidden(
                "this Host is not allowed (DNS rebinding protection)",
            ));
        }
    }
    if let Some(origin) = headers.get(header::ORIGIN) {
        let origin = origin.to_str().unwrap_or_default();
        let allowed = origin_host(origin).is_some_and(is_loopback_name)
            || allowed_origins.iter().any(|o| o == origin);
        if !allowed {
            return Some(forbidden("this Origin is not allowed"));
        }
    }
    None
}

/// The token of an `Authorization: Bearer <token>` value. The scheme is case-insensitive and
/// may be followed by more than one space (RFC 9110 §11.1); anything else is no token.
pub(crate) fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, rest) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| rest.trim_start_matches(' '))
}

/// Whether two tokens are equal, in time that depends on neither their bytes nor their
/// lengths: both are hashed to 32 bytes first, and the digests compared in constant time.
pub(crate) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    use subtle::ConstantTimeEq;
    let (a, b) = (blake3::hash(a), blake3::hash(b));
    a.as_bytes().ct_eq(b.as_bytes()).into()
}

/// `host` of a `Host` header value (`host`, `host:port`, `[v6]:port`).
fn host_name(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split(']').next().unwrap_or_default();
    }
    host.rsplit_once(':').map_or(host, |(h, _)| h)
}

/// The host of an `Origin` value (`scheme://host[:port]`).
fn origin_host(origin: &str) -> Option<&str> {
    let (_, rest) = origin.split_once("://")?;
    Some(host_name(rest))
}

fn is_loopback_name(name: &str) -> bool {
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

fn forbidden(message: &str) -> Response {
    (
        StatusCode::FORBIDDEN,
        [(header::CONTENT_TYPE, "text/plain")],
        message.to_owned(),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_hosts_and_origins_are_recognized() {
        for host in [
            "localhost:8080",
            "127.0.0.1:1",
            "[::1]:9",
            "LOCALHOST",
            "127.0.0.2",
        ] {
            assert!(is_loopback_name(host_name(host)), "{host}");
        }
        for host in [
            "evil.example.com",
            "evil.example.com:80",
            "10.0.0.1:80",
            "[2001:db8::1]:1",
        ] {
            assert!(!is_loopback_name(host_name(host)), "{host}");
        }
        assert_eq!(origin_host("http://localhost:3000"), Some("localhost"));
        assert_eq!(
            origin_host("https://evil.example.com"),
            Some("evil.example.com")
        );
        assert_eq!(origin_host("null"), None);
    }

    #[test]
    fn tokens_are_compared_whole() {
        assert!(constant_time_eq(b"abc", b"abc") && !constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
    }
}
