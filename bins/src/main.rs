//! `mcpmesh`: the command line and the node daemon. Parses arguments, talks to the node over
//! its control socket, renders the answer for people or, with `--json`, for scripts.

#![forbid(unsafe_code)]

mod args;
mod cli;
mod doctor;
mod mount;
mod output;
mod render;
mod stub_server;

use std::process::ExitCode;

fn main() -> ExitCode {
    cli::main()
}
