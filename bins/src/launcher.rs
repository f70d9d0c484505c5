//! The launcher the node hands its service host: the shim of `exec_shim.rs`, as the small
//! `mcpmesh-exec` beside this binary when it is there, else as this binary's hidden verb.

use std::path::{Path, PathBuf};

use mcpmesh::backends::spawn::Launcher;

/// The hidden verb of `mcpmesh` that runs the shim.
pub const VERB: &str = "__exec";
/// The shim as a program of its own, beside `mcpmesh`.
const SHIM: &str = "mcpmesh-exec";

/// The launcher for a node that is this very process.
pub fn launcher() -> Option<Launcher> {
    let program = std::env::current_exe().ok()?;
    Some(launcher_for(&program, std::process::id()))
}

/// The launcher for a node run by the `mcpmesh` at `program` as process `pid`.
fn launcher_for(program: &Path, pid: u32) -> Launcher {
    let parent = ["--parent".to_owned(), pid.to_string()];
    match shim_beside(program) {
        Some(shim) => Launcher {
            program: shim,
            args: parent.to_vec(),
        },
        None => Launcher {
            program: program.to_owned(),
            args: [VERB.to_owned()].into_iter().chain(parent).collect(),
        },
    }
}

/// `mcpmesh-exec` in `program`'s folder, when it is a file there.
fn shim_beside(program: &Path) -> Option<PathBuf> {
    let shim = program.parent()?.join(SHIM);
    shim.is_file().then_some(shim)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_small_shim_is_used_when_it_is_beside_mcpmesh_and_the_hidden_verb_when_not() {
        let dir = tempfile::tempdir().unwrap();
        let program = dir.path().join("mcpmesh");
        std::fs::write(&program, b"").unwrap();
        let without = launcher_for(&program, 42);
        assert_eq!(without.program, program);
        assert_eq!(without.args, ["__exec", "--parent", "42"]);
        std::fs::create_dir(dir.path().join(SHIM)).unwrap();
        let a_folder = launcher_for(&program, 42);
        assert_eq!(
            a_folder.program, program,
            "a folder by that name is no shim"
        );
        std::fs::remove_dir(dir.path().join(SHIM)).unwrap();
        std::fs::write(dir.path().join(SHIM), b"").unwrap();
        let with = launcher_for(&program, 42);
        assert_eq!(with.program, dir.path().join(SHIM));
        assert_eq!(with.args, ["--parent", "42"]);
    }
}
