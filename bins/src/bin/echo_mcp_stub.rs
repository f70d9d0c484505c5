//! A small, fast MCP server for the test suites and benchmarks: answers from memory, reports
//! the identity the node gave it, and can crash or stall on request.
//!
//! `echo_mcp_stub [--marker TAG]` serves stdio (the marker only tags the process for tests);
//! `echo_mcp_stub --socket PATH [--record FILE]` listens on a Unix socket instead, one session
//! per connection, and appends every line it receives to FILE.

use std::path::PathBuf;

#[path = "../stub_server.rs"]
mod stub_server;

fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let (mut socket, mut record) = (None::<PathBuf>, None::<PathBuf>);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--socket" => socket = args.next().map(PathBuf::from),
            "--record" => record = args.next().map(PathBuf::from),
            _ => {}
        }
    }
    match socket {
        Some(path) => stub_server::serve_socket(&path, "echo-stub", record.as_deref()),
        None => stub_server::serve_stdio("echo-stub", true),
    }
}
