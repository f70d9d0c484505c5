//! How the node starts a session's server so that the server dies with the node: the shim asks
//! the kernel for SIGKILL when its parent dies, checks that its parent is still the node (which
//! may have died before the request took hold), and then becomes CMD; the request outlives the
//! exec. (The kernel watches the thread that spawned the shim: the node spawns from its one
//! runtime thread, which lives as long as the node.)
//!
//! The shim is its own small program, `mcpmesh-exec --parent PID -- CMD…`, installed beside
//! `mcpmesh`: starting it costs a session's open about half a millisecond less than starting
//! the whole `mcpmesh` binary. Where it is missing, the node runs `mcpmesh __exec` (a hidden
//! verb) instead, which does the same. This file is a module of both programs.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::process::ExitCode;

use rustix::process::{Signal, getppid, set_parent_process_death_signal};

/// Runs the shim with the arguments after the verb; returns only when it could not exec.
pub fn run(args: &[OsString]) -> ExitCode {
    let (parent, cmd) = match args {
        [flag, pid, sep, cmd @ ..] if flag == "--parent" && sep == "--" && !cmd.is_empty() => {
            (pid.to_str().and_then(|p| p.parse::<i32>().ok()), cmd)
        }
        _ => {
            eprintln!("usage: mcpmesh-exec --parent PID -- CMD [ARGS…] (used by the node)");
            return ExitCode::from(2);
        }
    };
    if let Err(e) = set_parent_process_death_signal(Some(Signal::KILL)) {
        eprintln!("cannot tie the server's life to the node's: {e}");
        return ExitCode::from(126);
    }
    if getppid().map(|p| p.as_raw_nonzero().get()) != parent {
        // The node died before the death signal was set: nobody would end this server.
        return ExitCode::from(126);
    }
    let e = std::process::Command::new(&cmd[0]).args(&cmd[1..]).exec();
    eprintln!("cannot start {}: {e}", cmd[0].to_string_lossy());
    ExitCode::from(127)
}
