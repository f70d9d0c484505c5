//! The hub: every service this node may mount, as one MCP server for a local AI client.
//!
//! This first part is its naming (`names`): pure functions that give each merged tool and
//! prompt a name clients accept and a route back to where it lives. The server itself is not
//! built yet.

pub mod names;
