//! A small, fast stdio MCP server for the test suites and benchmarks: answers from memory,
//! reports the identity env the node gave it, and can crash or stall on request.

fn main() -> std::io::Result<()> {
    mcpmesh::demo::serve_stdio("echo-stub", true)
}
