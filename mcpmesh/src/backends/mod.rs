//! Backends: what a served service is attached to for one session.
//!
//! `spawn` runs a stdio MCP server once per session.

pub mod ledger;
pub mod spawn;
