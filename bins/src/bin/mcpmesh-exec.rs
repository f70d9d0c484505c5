//! `mcpmesh-exec --parent PID -- CMD…`: how a node starts a session's server, as a program of
//! its own so that it starts fast (see `exec_shim.rs`).

#![forbid(unsafe_code)]

#[path = "../exec_shim.rs"]
mod exec_shim;

fn main() -> std::process::ExitCode {
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    exec_shim::run(&args)
}
