//! Checks made when a service is served, so that a command that is not there or a socket that
//! does not exist is refused to its owner at once instead of failing each caller's session.
//!
//! A socket that exists but has nobody listening yet is accepted: its server may be started
//! after the service is served (`doctor` reports it).

use std::collections::BTreeMap;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::config::BackendSpec;

/// Why a backend cannot be served as given; the message says what to do.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PreflightError {
    #[error("the service has no command")]
    NoCommand,
    #[error(
        "command {0:?} was not found on the node's PATH; give its full path, or install it where the node can find it"
    )]
    NotOnPath(String),
    #[error("command {0} does not exist")]
    Missing(PathBuf),
    #[error(
        "command {0} is not an executable file (chmod +x it, or name the program that runs it)"
    )]
    NotExecutable(PathBuf),
    #[error("socket {0} does not exist; start the server that listens on it first, then serve it")]
    SocketMissing(PathBuf),
    #[error("{0} is not a socket; --socket takes the Unix socket a running MCP server listens on")]
    NotASocket(PathBuf),
}

/// Checks that `backend` can be started: a `run` command exists and is executable (found on
/// `PATH` — the service's own `env` PATH if it sets one — when it names no directory, relative
/// to `cwd` when it does), a `socket` path is a socket. A `url` is checked when a session
/// opens.
pub fn check(
    backend: &BackendSpec,
    env: &BTreeMap<String, String>,
    cwd: Option<&Path>,
) -> Result<(), PreflightError> {
    match backend {
        BackendSpec::Run(cmd) => {
            let program = cmd.first().ok_or(PreflightError::NoCommand)?;
            resolve_program(program, env, cwd).map(drop)
        }
        BackendSpec::Socket { path, .. } => match std::fs::metadata(path) {
            Err(_) => Err(PreflightError::SocketMissing(path.clone())),
            Ok(meta) if !meta.file_type().is_socket() => {
                Err(PreflightError::NotASocket(path.clone()))
            }
            Ok(_) => Ok(()),
        },
        BackendSpec::Url { .. } => Ok(()),
    }
}

/// Where the node finds `program` when it runs it: the path it names (relative to `cwd`) when
/// it names a directory, else the first executable of that name on `PATH` — the service's own
/// `env` PATH if it sets one, as the child is started with it, else the node's.
pub fn resolve_program(
    program: &str,
    env: &BTreeMap<String, String>,
    cwd: Option<&Path>,
) -> Result<PathBuf, PreflightError> {
    if program.contains('/') {
        let path = match cwd {
            Some(dir) => dir.join(program),
            None => PathBuf::from(program),
        };
        return executable(&path).map(|()| path);
    }
    let path = env
        .get("PATH")
        .map(std::ffi::OsString::from)
        .or_else(|| std::env::var_os("PATH"))
        .unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|candidate| executable(candidate).is_ok())
        .ok_or_else(|| PreflightError::NotOnPath(program.to_owned()))
}

fn executable(path: &Path) -> Result<(), PreflightError> {
    let meta = std::fs::metadata(path).map_err(|_| PreflightError::Missing(path.to_owned()))?;
    if meta.is_file() && meta.permissions().mode() & 0o111 != 0 {
        Ok(())
    } else {
        Err(PreflightError::NotExecutable(path.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(cmd: &str) -> BackendSpec {
        BackendSpec::Run(vec![cmd.to_owned()])
    }

    #[test]
    fn a_command_on_path_or_an_executable_path_is_accepted() {
        let none = BTreeMap::new();
        assert_eq!(check(&run("sh"), &none, None), Ok(()));
        assert_eq!(check(&run("/bin/sh"), &none, None), Ok(()));
    }

    #[test]
    fn a_missing_or_non_executable_command_is_refused_with_what_is_wrong() {
        let none = BTreeMap::new();
        assert_eq!(
            check(&run("no-such-mcp-server-x"), &none, None),
            Err(PreflightError::NotOnPath("no-such-mcp-server-x".into()))
        );
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("server.sh");
        assert!(matches!(
            check(&run("./server.sh"), &none, Some(dir.path())),
            Err(PreflightError::Missing(_))
        ));
        std::fs::write(&script, "#!/bin/sh\n").unwrap();
        assert!(matches!(
            check(&run("./server.sh"), &none, Some(dir.path())),
            Err(PreflightError::NotExecutable(_))
        ));
        let empty_path = BTreeMap::from([("PATH".to_owned(), String::new())]);
        assert!(check(&run("sh"), &empty_path, None).is_err());
    }

    #[test]
    fn a_socket_must_exist_and_be_a_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sock");
        let none = BTreeMap::new();
        let sock = BackendSpec::Socket {
            path: path.clone(),
            caller_assertion: false,
        };
        assert_eq!(
            check(&sock, &none, None),
            Err(PreflightError::SocketMissing(path.clone()))
        );
        std::fs::write(&path, "").unwrap();
        assert_eq!(
            check(&sock, &none, None),
            Err(PreflightError::NotASocket(path.clone()))
        );
        std::fs::remove_file(&path).unwrap();
        let _listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        assert_eq!(check(&sock, &none, None), Ok(()));
    }
}
