//! The program that starts a session's server for the node, and the one it keeps started ahead.
//!
//! The node starts each `run` server through a launcher (`mcpmesh __exec --parent PID`): the
//! launcher asks the kernel to kill it when the node dies (even by SIGKILL, which no teardown of
//! the node's own can see), checks the node is still its parent, reads what to start from its
//! stdin ([`Launch`]) and becomes that server, same pid. What it starts comes after it is
//! running, so the node keeps one launcher started ahead of need: a session then waits only for
//! its server's own start, not for a second program's (the `mcpmesh` binary takes about as
//! long to start as the server does). After a session takes the spare, the node starts the
//! next one once that session's server has said its first word: started at once, the new
//! launcher's own start competed for the CPU with the server's and slowed the session's open.

use std::io::{self, Read};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use tokio::io::AsyncWriteExt;
use tokio::process::{Child, Command};

use crate::config::RESERVED_ENV_PREFIX;

/// Longest [`Launch`] a launcher reads.
pub const MAX_LAUNCH: usize = 1024 * 1024;

/// What a launcher is told to become: written to its stdin as a 4-byte big-endian length and
/// that many bytes of JSON, before any byte of the session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Launch {
    pub program: String,
    pub args: Vec<String>,
    /// Set in this order over the launcher's own environment (a later one wins).
    pub env: Vec<(String, String)>,
    pub cwd: Option<String>,
}

impl Launch {
    /// The bytes a launcher reads.
    pub fn encode(&self) -> io::Result<Vec<u8>> {
        let body = serde_json::to_vec(self).map_err(io::Error::other)?;
        if body.len() > MAX_LAUNCH {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "the server's command and environment take {} bytes; at most {MAX_LAUNCH}",
                    body.len()
                ),
            ));
        }
        let mut out = (body.len() as u32).to_be_bytes().to_vec();
        out.extend(body);
        Ok(out)
    }

    /// Reads one from `from`, taking no byte past it. `None` when `from` ends before it starts:
    /// the node let the launcher go unused.
    pub fn read(from: &mut impl Read) -> io::Result<Option<Launch>> {
        let mut len = [0u8; 4];
        let first = loop {
            match from.read(&mut len) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                other => break other?,
            }
        };
        if first == 0 {
            return Ok(None);
        }
        from.read_exact(&mut len[first..])?;
        let len = u32::from_be_bytes(len) as usize;
        if len > MAX_LAUNCH {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("a launch of {len} bytes; at most {MAX_LAUNCH}"),
            ));
        }
        let mut body = vec![0u8; len];
        from.read_exact(&mut body)?;
        serde_json::from_slice(&body)
            .map(Some)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
    }
}

/// A program that starts servers for the node: `PROGRAM ARGS…`, told what to become on its
/// stdin. Clones share the spare.
#[derive(Debug, Clone)]
pub struct Launcher {
    pub program: PathBuf,
    pub args: Vec<String>,
    spare: Arc<Mutex<Spare>>,
}

/// The launcher started ahead, and whether one is being started.
#[derive(Debug, Default)]
struct Spare {
    child: Option<Child>,
    starting: bool,
}

impl Launcher {
    pub fn new(program: PathBuf, args: Vec<String>) -> Self {
        Launcher {
            program,
            args,
            spare: Arc::default(),
        }
    }

    /// A server started as `launch` says: the spare when there is a live one, else a launcher
    /// started now. Its stdin, stdout and stderr are pipes; it leads a process group of its
    /// own and is killed when dropped. The caller calls [`Launcher::replenish`] once the server
    /// is under way.
    pub async fn start(&self, launch: &Launch) -> io::Result<Child> {
        let bytes = launch.encode()?;
        let spare = self.take_spare();
        let from_spare = spare.is_some();
        let mut child = match spare {
            Some(child) => child,
            None => self.launcher()?,
        };
        let mut told = tell(&mut child, &bytes).await;
        if told.is_err() && from_spare {
            // It died waiting (killed by someone): one started now does the same.
            child = self.launcher()?;
            told = tell(&mut child, &bytes).await;
        }
        told?;
        Ok(child)
    }

    /// Starts a spare unless there is one (or one is being started), on a task of the runtime
    /// the caller runs on: the kernel's death signal follows the thread that started the
    /// launcher, and the node's runtime thread lives as long as the node.
    pub fn replenish(&self) {
        {
            let mut spare = self.spare();
            if spare.child.is_some() || spare.starting {
                return;
            }
            spare.starting = true;
        }
        let this = self.clone();
        tokio::spawn(async move {
            let started = this.launcher();
            let mut spare = this.spare();
            spare.starting = false;
            match started {
                Ok(child) => spare.child = Some(child),
                Err(e) => tracing::warn!("cannot start a spare launcher: {e}"),
            }
        });
    }

    fn spare(&self) -> std::sync::MutexGuard<'_, Spare> {
        self.spare.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The spare, when it is still waiting.
    fn take_spare(&self) -> Option<Child> {
        let mut spare = self.spare().child.take()?;
        match spare.try_wait() {
            Ok(None) => Some(spare),
            _ => None,
        }
    }

    /// A launcher, waiting for its [`Launch`].
    fn launcher(&self) -> io::Result<Child> {
        server_command(&self.program).args(&self.args).spawn()
    }
}

/// A command for a session's server, or for the launcher that becomes one: its stdin, stdout
/// and stderr piped, a process group of its own, killed when dropped, and none of the node's
/// own `MCPMESH_*` variables nor the allocator setting the node was started with.
pub(crate) fn server_command(program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut cmd = Command::new(program);
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with(RESERVED_ENV_PREFIX) {
            cmd.env_remove(key);
        }
    }
    crate::memory::untune_child(&mut cmd);
    cmd
}

async fn tell(child: &mut Child, bytes: &[u8]) -> io::Result<()> {
    let stdin = child
        .stdin
        .as_mut()
        .ok_or_else(|| io::Error::other("the launcher has no stdin"))?;
    stdin.write_all(bytes).await?;
    stdin.flush().await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn launch() -> Launch {
        Launch {
            program: "/bin/server".into(),
            args: vec!["--flag".into(), "ü".into()],
            env: vec![
                ("A".into(), "1".into()),
                ("MCPMESH_PEER_EID".into(), "k".into()),
            ],
            cwd: Some("/tmp".into()),
        }
    }

    #[test]
    fn a_launch_is_read_back_and_nothing_after_it_is_taken() {
        let mut bytes = launch().encode().unwrap();
        bytes.extend(b"{\"jsonrpc\":\"2.0\"}\n");
        let mut from = io::Cursor::new(bytes);
        assert_eq!(Launch::read(&mut from).unwrap(), Some(launch()));
        let mut rest = String::new();
        from.read_to_string(&mut rest).unwrap();
        assert_eq!(rest, "{\"jsonrpc\":\"2.0\"}\n");
    }

    #[test]
    fn an_input_that_ends_at_once_is_no_launch_and_one_that_ends_inside_is_an_error() {
        assert_eq!(Launch::read(&mut io::empty()).unwrap(), None);
        let bytes = launch().encode().unwrap();
        for cut in [2, 4, bytes.len() - 1] {
            let err = Launch::read(&mut &bytes[..cut]).unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof, "cut at {cut}");
        }
    }

    #[test]
    fn an_oversized_or_garbled_launch_is_refused_without_reading_it() {
        let mut huge = ((MAX_LAUNCH + 1) as u32).to_be_bytes().to_vec();
        huge.extend(b"{}");
        let err = Launch::read(&mut &huge[..]).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        let mut garbled = 3u32.to_be_bytes().to_vec();
        garbled.extend(b"{{{");
        let err = Launch::read(&mut &garbled[..]).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        let big = Launch {
            env: vec![("A".into(), "x".repeat(MAX_LAUNCH))],
            ..launch()
        };
        assert_eq!(
            big.encode().unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
    }
}
