//! Backends: what a served service is attached to for one session.
//!
//! `spawn` runs a stdio MCP server once per session; `socket` connects to a long-running one;
//! `url` is the HTTP client of a Streamable HTTP server.
//! Both share the session machinery in `session`: admission, the pump, the ledger, audit.

pub mod ledger;
pub mod session;
pub mod socket;
pub mod spawn;
pub mod sse;
pub mod stamp;
pub mod url;
