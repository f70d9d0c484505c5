//! `mcpmesh __exec --parent PID`: how the node starts a session's server so that the server
//! dies with the node. It asks the kernel for SIGKILL when its parent dies, checks that its
//! parent is still the node (which may have died before the request took hold), reads what to
//! become from its stdin (a [`Launch`], taking no byte past it) and becomes that; the request
//! outlives the exec. The node starts one ahead of need, so it usually waits here. (The kernel
//! watches the thread that spawned the shim: the node spawns from its one runtime thread, which
//! lives as long as the node.)

use std::ffi::OsString;
use std::os::fd::AsFd;
use std::os::unix::process::CommandExt;
use std::process::ExitCode;

use mcpmesh::backends::launcher::{Launch, Launcher};
use rustix::process::{Signal, getppid, set_parent_process_death_signal};

/// The hidden verb.
pub const VERB: &str = "__exec";

/// The launcher the node hands its service host: this very binary, naming the node as parent.
pub fn launcher() -> Option<Launcher> {
    let program = std::env::current_exe().ok()?;
    Some(Launcher::new(
        program,
        vec![
            VERB.to_owned(),
            "--parent".to_owned(),
            std::process::id().to_string(),
        ],
    ))
}

/// Runs the shim with the arguments after the verb; returns only when it could not exec.
pub fn run(args: &[OsString]) -> ExitCode {
    let parent = match args {
        [flag, pid] if flag == "--parent" => pid.to_str().and_then(|p| p.parse::<i32>().ok()),
        _ => {
            eprintln!(
                "usage: mcpmesh {VERB} --parent PID, told what to run on stdin (used by the node)"
            );
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
    // Unbuffered: every byte after the launch is the server's.
    let launch = std::io::stdin()
        .as_fd()
        .try_clone_to_owned()
        .map(std::fs::File::from)
        .and_then(|mut stdin| Launch::read(&mut stdin));
    let launch = match launch {
        Ok(Some(launch)) => launch,
        // The node let this spare go unused.
        Ok(None) => return ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cannot read what to start: {e}");
            return ExitCode::from(126);
        }
    };
    let mut cmd = std::process::Command::new(&launch.program);
    cmd.args(&launch.args).envs(launch.env);
    if let Some(cwd) = &launch.cwd {
        cmd.current_dir(cwd);
    }
    let e = cmd.exec();
    eprintln!("cannot start {}: {e}", launch.program);
    ExitCode::from(127)
}
