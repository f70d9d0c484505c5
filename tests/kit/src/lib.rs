//! The mcpmesh test kit: what the suites and the benchmarks run beside the `mcpmesh` binary,
//! and never shipped with it. Its binaries are `echo_mcp_stub` (the suites' and benchmarks'
//! MCP server), `mcpmesh-test-relay` and `mcpmesh-test-dns` (iroh's own relay and DNS servers,
//! for the network suite) and the benchmarks `mcpmesh-bench`, `mcpmesh-scale` and
//! `mcpmesh-fleet`; this library is what they share. It is not a client library for mcpmesh:
//! the benchmarks drive the `mcpmesh` binary built beside them, as a user would.

#![forbid(unsafe_code)]

pub mod bench;
pub mod stub_server;
