//! `mcpmesh __exec --parent PID -- CMD…`: how the node starts a session's server so that the
//! server dies with the node. It asks the kernel for SIGKILL when its parent dies, checks that
//! its parent is still the node (which may have died before the request took hold), and then
//! becomes CMD; the request outlives the exec. (The kernel watches the thread that spawned the
//! shim: the node spawns from its one runtime thread, which lives as long as the node.)

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::process::ExitCode;

use mcpmesh::backends::spawn::Launcher;
use rustix::process::{Signal, getppid, set_parent_process_death_signal};

/// The hidden verb.
pub const VERB: &str = "__exec";

/// The launcher the node hands its service host: this very binary, naming the node as parent.
pub fn launcher() -> Option<Launcher> {
    let program = std::env::current_exe().ok()?;
    Some(Launcher {
        program,
        args: vec![
            VERB.to_owned(),
            "--parent".to_owned(),
            std::process::id().to_string(),
        ],
    })
}

/// Runs the shim with the arguments after the verb; returns only when it could not exec.
pub fn run(args: &[OsString]) -> ExitCode {
    let (parent, cmd) = match args {
        [flag, pid, sep, cmd @ ..] if flag == "--parent" && sep == "--" && !cmd.is_empty() => {
            (pid.to_str().and_then(|p| p.parse::<i32>().ok()), cmd)
        }
        _ => {
            eprintln!("usage: mcpmesh {VERB} --parent PID -- CMD [ARGS…] (used by the node)");
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
