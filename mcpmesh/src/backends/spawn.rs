//! The `run` backend: one child MCP server per session, stdio pumped to and from the mesh.
//!
//! The child learns the caller from `MCPMESH_*` env vars that nothing else can set, runs in
//! its own process group, and that group is ended and reaped when the session ends. Its stderr
//! goes to the node's log, never into the MCP stream.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use mcpmesh_net::PeerIdentity;
use mcpmesh_net::transport::{Batch, FrameReader, NdjsonTransport};
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::process::{Child, ChildStderr};
use tokio::sync::Semaphore;

use crate::audit::AuditSink;
use crate::backends::BackendError;
pub use crate::backends::launcher::Launcher;
use crate::backends::launcher::{Launch, server_command};
use crate::backends::preflight::PreflightError;
use crate::backends::session::{GRACE, ServiceCtx, SessionOptions, Who};
use crate::config::RESERVED_ENV_PREFIX;
use crate::limits::RateLimiter;

/// Longest stderr line logged whole.
const MAX_LOG_LINE: usize = 16 * 1024;

/// Runs `cmd` once per session. The fields are the seam the daemon (and tests) fill in.
#[derive(Debug, Clone)]
pub struct SpawnBackend {
    pub cmd: Vec<String>,
    /// The service's session cap; a session that finds no permit is refused before spawning.
    pub concurrency: Arc<Semaphore>,
    pub service: String,
    pub audit: AuditSink,
    pub limiter: Arc<RateLimiter>,
}

/// Per-service settings of a spawned server.
#[derive(Debug, Clone, Default)]
pub struct SpawnOptions {
    /// Extra environment for the child (never `MCPMESH_*`).
    pub env: BTreeMap<String, String>,
    pub cwd: Option<PathBuf>,
    pub session: SessionOptions,
    /// Starts the child through this program, when set; else the command is run directly.
    pub launcher: Option<Launcher>,
}

impl SpawnBackend {
    /// Runs a session whose first frame was already read (and possibly inspected) by the
    /// caller. Returns `Ok` on the transport's EOF and on a handled refusal.
    pub async fn run_over<R, W>(
        &self,
        identity: Option<PeerIdentity>,
        first_frame: Value,
        transport: NdjsonTransport<R, W>,
    ) -> Result<(), BackendError>
    where
        R: AsyncRead + Unpin + Send,
        W: AsyncWrite + Unpin + Send,
    {
        self.run_session(
            identity,
            Some(first_frame),
            transport,
            &SpawnOptions::default(),
        )
        .await
    }

    /// Runs one session. With `first_frame` `None`, nothing is read before the child starts:
    /// the client's bytes flow to it untouched from the first one.
    pub async fn run_session<R, W>(
        &self,
        identity: Option<PeerIdentity>,
        first_frame: Option<Value>,
        mut transport: NdjsonTransport<R, W>,
        options: &SpawnOptions,
    ) -> Result<(), BackendError>
    where
        R: AsyncRead + Unpin + Send,
        W: AsyncWrite + Unpin + Send,
    {
        let ctx = ServiceCtx {
            service: self.service.clone(),
            concurrency: self.concurrency.clone(),
            audit: self.audit.clone(),
            limiter: self.limiter.clone(),
        };
        let host = ctx.host();
        let who = Who::of(identity.as_ref(), options.session.held.clone());
        let Some(_permit) = host.admit(&who, first_frame.as_ref(), &mut transport).await else {
            return Ok(());
        };
        let mut child = match self.spawn(identity.as_ref(), options).await {
            Ok(child) => child,
            Err(e) => {
                return ctx
                    .unreachable(&who, first_frame.as_ref(), &mut transport, e)
                    .await;
            }
        };
        let _alive = self.audit.metrics().map(|m| m.child_alive());
        if let Some(stderr) = child.stderr.take() {
            tokio::spawn(log_stderr(stderr, self.service.clone()));
        }
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            stop_child(&mut child, GRACE).await;
            return Ok(());
        };
        let teardown = |patience| async move { stop_child(&mut child, patience).await };
        // The next session's launcher starts once this one's server is under way.
        let launcher = options.launcher.clone();
        let stdout = FirstWord {
            inner: stdout,
            then: Some(move || {
                if let Some(launcher) = launcher {
                    launcher.replenish();
                }
            }),
        };
        host.pump(
            who,
            first_frame,
            transport,
            stdout,
            stdin,
            &options.session,
            None,
            teardown,
        )
        .await;
        Ok(())
    }

    async fn spawn(
        &self,
        identity: Option<&PeerIdentity>,
        options: &SpawnOptions,
    ) -> Result<Child, BackendError> {
        let (program, args) = self.cmd.split_first().ok_or(BackendError::NoCommand)?;
        let failed = |source| BackendError::Spawn {
            cmd: program.clone(),
            source,
        };
        // The service's env first; the caller's identity after it, so that neither the
        // service's env nor anything the caller sends can override it.
        let mut env: Vec<(String, String)> = options
            .env
            .iter()
            .filter(|(key, _)| !key.starts_with(RESERVED_ENV_PREFIX))
            .map(|(key, value)| (key.clone(), value.clone()))
            .collect();
        if let Some(id) = identity {
            env.push(("MCPMESH_PEER_EID".into(), id.principal()));
            env.push(("MCPMESH_PEER_NAME".into(), id.name.clone()));
            env.push(("MCPMESH_PEER_GROUPS".into(), id.groups.join(",")));
            if let Some(user) = &id.user_id {
                env.push(("MCPMESH_PEER_USER".into(), user.clone()));
            }
        }
        env.push(("MCPMESH_SERVICE".into(), self.service.clone()));
        let Some(launcher) = &options.launcher else {
            let mut cmd = server_command(program);
            cmd.args(args).envs(env);
            if let Some(cwd) = &options.cwd {
                cmd.current_dir(cwd);
            }
            return cmd.spawn().map_err(failed);
        };
        // The launcher starts whatever it is given; a command that is not there fails here, as
        // it would without it, not inside the launcher.
        let runnable = crate::backends::preflight::check(
            &crate::config::BackendSpec::Run(self.cmd.clone()),
            &options.env,
            options.cwd.as_deref(),
        );
        if let Err(e) = runnable {
            let kind = match e {
                PreflightError::NotExecutable(_) => std::io::ErrorKind::PermissionDenied,
                _ => std::io::ErrorKind::NotFound,
            };
            return Err(failed(std::io::Error::new(kind, e.to_string())));
        }
        let cwd = match &options.cwd {
            Some(cwd) => Some(cwd.to_str().map(str::to_owned).ok_or_else(|| {
                failed(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!("the working directory {} is not UTF-8", cwd.display()),
                ))
            })?),
            None => None,
        };
        let launch = Launch {
            program: program.clone(),
            args: args.to_vec(),
            env,
            cwd,
        };
        launcher.start(&launch).await.map_err(failed)
    }
}

/// A server's stdout that calls `then` once its first read completes (a line, or its end).
struct FirstWord<R, F> {
    inner: R,
    then: Option<F>,
}

impl<R: AsyncRead + Unpin, F: FnOnce() + Unpin> AsyncRead for FirstWord<R, F> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        if polled.is_ready()
            && let Some(then) = this.then.take()
        {
            then();
        }
        polled
    }
}

/// Ends a session's child: its stdin is already closed; after `patience` SIGTERM, then after a
/// grace SIGKILL, to the whole process group. The child is reaped; no zombie stays behind.
async fn stop_child(child: &mut Child, patience: Duration) {
    let group = child
        .id()
        .and_then(|pid| rustix::process::Pid::from_raw(pid as i32));
    if tokio::time::timeout(patience, child.wait()).await.is_err() {
        signal_group(group, rustix::process::Signal::TERM);
        if tokio::time::timeout(GRACE, child.wait()).await.is_err() {
            signal_group(group, rustix::process::Signal::KILL);
            let _ = child.wait().await;
        }
    }
    // Whatever the server left running in its group goes with it.
    signal_group(group, rustix::process::Signal::KILL);
}

fn signal_group(group: Option<rustix::process::Pid>, signal: rustix::process::Signal) {
    if let Some(pgid) = group {
        // ESRCH (the group is already gone) is the common, expected case.
        let _ = rustix::process::kill_process_group(pgid, signal);
    }
}

async fn log_stderr(stderr: ChildStderr, service: String) {
    let mut reader = FrameReader::new(stderr, MAX_LOG_LINE);
    while let Ok(Some(batch)) = reader.next_batch().await {
        match batch {
            Batch::Lines(run) => {
                for line in mcpmesh_net::transport::lines(&run) {
                    tracing::info!(target: "mcpmesh::child", %service, "{}", String::from_utf8_lossy(line));
                }
            }
            Batch::Oversize => {
                tracing::info!(target: "mcpmesh::child", %service, "(a stderr line over {MAX_LOG_LINE} bytes was skipped)");
            }
        }
    }
}
