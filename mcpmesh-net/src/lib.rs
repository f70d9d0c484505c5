//! The mcpmesh transport kernel.
//!
//! What it is: iroh endpoint construction for the three network modes, the NDJSON frame
//! codec and the byte-level line pump every hot path uses, the peer identity a trust gate
//! resolves, the mesh session protocol (preamble, accept-time refusal, dialing by key), the
//! registry of live connections that lets a trust change sever them (and tells which path,
//! direct or through a relay, each is on), and the one builder of the error band's frames.
//!
//! What it is not: it reads no config file, knows nothing of pairing, rosters or service
//! policy. Those live in the `mcpmesh` crate and reach this one through [`TrustGate`] and
//! [`session::SessionHandler`].

#![forbid(unsafe_code)]
// No function over the threshold in clippy.toml (80 lines): each can be read whole.
#![warn(clippy::too_many_lines)]

pub mod endpoint;
pub mod errors;
pub mod gate;
pub mod identity;
pub mod jsonrpc;
pub mod path;
pub mod ping;
pub mod pump;
pub mod registry;
pub mod scan;
pub mod session;
pub mod skeleton;
pub mod transport;

pub use errors::{ErrorCode, ErrorFrame};
pub use gate::TrustGate;
pub use identity::PeerIdentity;
pub use iroh::{EndpointAddr, EndpointId, SecretKey};
