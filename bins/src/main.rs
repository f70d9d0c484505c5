//! `mcpmesh`: the command line and the node daemon. Parses arguments, talks to the node over
//! its control socket, renders the answer for people or, with `--json`, for scripts.

#![forbid(unsafe_code)]
// No function over the threshold in clippy.toml (80 lines): each can be read whole.
#![warn(clippy::too_many_lines)]

mod args;
mod auth;
mod cli;
mod ctx;
mod demo_server;
mod doctor;
mod exec_shim;
mod mount;
mod org;
mod output;
mod render;

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    if args.first().is_some_and(|verb| verb == exec_shim::VERB) {
        return exec_shim::run(&args[1..]);
    }
    // Whatever the user's umask, nothing this process (or the node it starts) creates is
    // writable by group or others: the node refuses a profile that is.
    use rustix::fs::Mode;
    let umask = rustix::process::umask(Mode::from_raw_mode(0o077));
    rustix::process::umask(umask | Mode::WGRP | Mode::WOTH);
    cli::main()
}
