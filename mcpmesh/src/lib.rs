//! The mcpmesh node as a library.
//!
//! What it is: the node's policy and process — profile paths and config, the device key, the
//! peer table and trust gate, pairing and the embedded store, services and their backends,
//! limits, audit, the daemon (the composition root) with its local control API, and the
//! connect proxy that AI clients launch, and the HTTP gateway for clients that speak HTTP.
//!
//! What it is not: the transport. QUIC, framing, gating mechanics and the error band live in
//! `mcpmesh-net`; this crate decides *who* and *what*, that one moves the bytes.

#![forbid(unsafe_code)]
// No function over the threshold in clippy.toml (80 lines): each can be read whole.
#![warn(clippy::too_many_lines)]

pub mod accept;
pub mod assertion;
pub mod audit;
pub mod backends;
pub mod catalog;
pub mod config;
pub mod control;
pub mod daemon;
pub mod demo;
pub mod disk;
pub mod endpoint_id;
pub mod files;
pub mod gateway;
pub mod http_checks;
pub mod http_listener;
pub mod hub;
pub mod keys;
pub mod limits;
pub mod logfile;
pub mod memory;
pub mod oauth;
pub mod pairing;
pub mod paths;
pub mod peers;
pub mod principal;
pub mod proxy;
pub mod reachability;
pub mod roster;
pub mod services;
pub mod store;
pub mod telemetry;
pub mod template;
pub mod time;
pub mod tool_policy;
pub mod web;
