//! A small, fast stdio MCP server for the test suites and benchmarks: answers from memory,
//! reports the identity env the node gave it, and can crash or stall on request.

#[path = "../stub_server.rs"]
mod stub_server;

fn main() -> std::io::Result<()> {
    stub_server::serve_stdio("echo-stub", true)
}
