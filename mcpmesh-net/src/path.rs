//! Which way a connection's bytes travel right now: straight to the peer, or through a relay.
//! iroh keeps several paths open per connection (the relay's, and direct ones once hole
//! punching works) and sends on one of them; that selected path is what a user asks about.

use std::time::Duration;

use iroh::endpoint::Connection;
use iroh::{RelayUrl, TransportAddr};

/// The path a connection sends on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// Straight to the peer's address.
    Direct,
    /// Through this relay server.
    Relay(RelayUrl),
}

impl Route {
    /// `"direct"` or `"relay"`, as `peers --json` spells it.
    pub fn as_str(&self) -> &'static str {
        match self {
            Route::Direct => "direct",
            Route::Relay(_) => "relay",
        }
    }

    pub fn relay_url(&self) -> Option<&RelayUrl> {
        match self {
            Route::Direct => None,
            Route::Relay(url) => Some(url),
        }
    }
}

/// A connection's selected path and QUIC's round-trip estimate on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathInfo {
    pub route: Route,
    pub rtt: Duration,
}

/// The path `conn` sends on now; `None` when it has none selected (closed, or still starting).
pub fn selected(conn: &Connection) -> Option<PathInfo> {
    let paths = conn.paths();
    let path = paths.iter().find(|p| p.is_selected())?;
    let route = match path.remote_addr() {
        TransportAddr::Relay(url) => Route::Relay(url.clone()),
        _ => Route::Direct,
    };
    Some(PathInfo {
        route,
        rtt: path.rtt(),
    })
}
