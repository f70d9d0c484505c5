//! The `run` backend: one child MCP server per session, stdio pumped to and from the mesh.
//!
//! The child learns the caller from `MCPMESH_*` env vars that nothing else can set, runs in
//! its own process group, and that group is ended and reaped when the session ends. Its stderr
//! goes to the node's log, never into the MCP stream.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};

use mcpmesh_net::PeerIdentity;
use mcpmesh_net::errors::{ErrorCode, ErrorFrame};
use mcpmesh_net::pump::{Verdict, forward, forward_checked, write_run};
use mcpmesh_net::session::refuse;
use mcpmesh_net::transport::{Batch, FrameReader, MAX_FRAME, NdjsonTransport};
use serde_json::Value;
use serde_json::value::RawValue;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::process::{Child, ChildStderr, Command};
use tokio::sync::{Mutex, Semaphore};
use tokio_util::sync::CancellationToken;

use crate::audit::{AuditEvent, AuditSink};
use crate::backends::ledger::{Caller, Ledger};
use crate::config::RESERVED_ENV_PREFIX;
use crate::limits::RateLimiter;

/// How long a child gets after its stdin closes, and again after SIGTERM: the whole teardown
/// stays well under a second.
const GRACE: Duration = Duration::from_millis(300);
/// A caller told "at capacity" is asked to wait this long.
const RETRY_AT_CAPACITY: Duration = Duration::from_secs(1);
/// Longest stderr line logged whole.
const MAX_LOG_LINE: usize = 16 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("cannot start `{cmd}`: {source}")]
    Spawn { cmd: String, source: std::io::Error },
    #[error("the service has no command")]
    NoCommand,
}

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

/// Per-service settings beyond the command.
#[derive(Debug, Clone)]
pub struct SpawnOptions {
    /// Extra environment for the child (never `MCPMESH_*`).
    pub env: BTreeMap<String, String>,
    pub cwd: Option<PathBuf>,
    /// Fires when the node shuts down: the session ends and its child with it.
    pub shutdown: CancellationToken,
    /// Fires when a trust change takes the caller's access away: pending requests are
    /// answered `-32052`, then the session ends.
    pub sever: CancellationToken,
    /// Requests the session may have outstanding at once.
    pub max_in_flight: usize,
}

impl Default for SpawnOptions {
    fn default() -> Self {
        SpawnOptions {
            env: BTreeMap::new(),
            cwd: None,
            shutdown: CancellationToken::new(),
            sever: CancellationToken::new(),
            max_in_flight: crate::config::DEFAULT_IN_FLIGHT as usize,
        }
    }
}

/// How a session's pump ended.
enum End {
    ClientClosed,
    ServerClosed,
    Failed(String),
    Shutdown,
    Severed,
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
        let principal = identity
            .as_ref()
            .map_or_else(|| "local".to_owned(), PeerIdentity::principal);
        let peer_name = identity
            .as_ref()
            .map(|i| i.name.clone())
            .unwrap_or_default();

        let Ok(_permit) = self.concurrency.clone().try_acquire_owned() else {
            let frame = ErrorFrame::new(ErrorCode::Busy)
                .message(format!("service {} is at its session limit", self.service))
                .retry_after_ms(RETRY_AT_CAPACITY.as_millis() as u64);
            self.refuse(
                first_frame.as_ref(),
                transport,
                frame,
                &principal,
                &peer_name,
            )
            .await;
            return Ok(());
        };
        if let Err(wait) = self.limiter.check(&self.service, &principal) {
            let frame = ErrorFrame::new(ErrorCode::Busy)
                .message("rate limited")
                .retry_after_ms(wait.as_millis().max(1) as u64);
            self.refuse(
                first_frame.as_ref(),
                transport,
                frame,
                &principal,
                &peer_name,
            )
            .await;
            return Ok(());
        }

        let mut child = match self.spawn(identity.as_ref(), options) {
            Ok(child) => child,
            Err(e) => {
                tracing::error!(service = %self.service, "{e}");
                // Ending the stream makes the dialing side answer -32055 for what is pending.
                let _ = transport.writer_mut().shutdown().await;
                return Err(e);
            }
        };
        self.audit.record(AuditEvent::SessionOpen {
            service: self.service.clone(),
            principal: principal.clone(),
            peer: peer_name.clone(),
        });
        let started = Instant::now();
        if let Some(stderr) = child.stderr.take() {
            tokio::spawn(log_stderr(stderr, self.service.clone()));
        }
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            stop_child(&mut child, GRACE).await;
            return Ok(());
        };

        let (mut mesh_r, mesh_w) = transport.into_parts();
        let mesh_w = Mutex::new(mesh_w);
        let child_w = Mutex::new(stdin);
        let mut child_r = FrameReader::new(stdout, MAX_FRAME);
        let (mut bytes_in, mut bytes_out) = (0u64, 0u64);
        let caller = Caller {
            service: self.service.clone(),
            principal: principal.clone(),
            peer: peer_name.clone(),
        };
        let ledger = StdMutex::new(Ledger::new(
            caller,
            self.limiter.clone(),
            self.audit.clone(),
            options.max_in_flight,
        ));
        let account = || ledger.lock().unwrap_or_else(|p| p.into_inner());

        let mut end = End::ClientClosed;
        if let Some(first) = &first_frame {
            let line = serde_json::to_vec(first).unwrap_or_default();
            bytes_in += line.len() as u64 + 1;
            let verdict = account().client_line(&line);
            let written = match verdict {
                Verdict::Forward => write_run(&child_w, &[&line[..], b"\n"].concat()).await,
                Verdict::Answer(answer) | Verdict::Strike(answer) => {
                    write_run(&mesh_w, &answer).await
                }
            };
            if let Err(e) = written {
                end = End::Failed(format!("writing the first frame: {e}"));
            }
        }
        if matches!(end, End::ClientClosed) {
            end = tokio::select! {
                r = forward_checked(&mut mesh_r, &child_w, &mesh_w, |line| {
                    bytes_in += line.len() as u64 + 1;
                    account().client_line(line)
                }) => match r {
                    Ok(()) => End::ClientClosed,
                    Err(e) => End::Failed(e.to_string()),
                },
                r = forward(&mut child_r, &mesh_w, &mesh_w, |run| {
                    bytes_out += run.len() as u64;
                    account().server_run(run);
                }) => match r {
                    Ok(()) => End::ServerClosed,
                    Err(e) => End::Failed(e.to_string()),
                },
                _ = options.shutdown.cancelled() => End::Shutdown,
                _ = options.sever.cancelled() => End::Severed,
            };
        }

        if matches!(end, End::Severed) {
            let answers = account()
                .answer_pending(ErrorCode::NotReady, "session severed: access was revoked");
            if !answers.is_empty() {
                let _ = write_run(&mesh_w, &answers).await;
            }
        }
        drop(child_w.into_inner());
        let mut patience = GRACE;
        if matches!(end, End::ClientClosed) {
            // The client is done sending, perhaps not reading: answers the server still
            // writes as it sees its input end reach the client, for a short while.
            let drain = forward(&mut child_r, &mesh_w, &mesh_w, |run| {
                bytes_out += run.len() as u64;
                account().server_run(run);
            });
            if tokio::time::timeout(GRACE, drain).await.is_err() {
                patience = Duration::ZERO; // it had its grace while draining
            }
        }
        // Client-visible end first, so the caller is never kept waiting on the child's exit.
        let _ = mesh_w.lock().await.shutdown().await;
        stop_child(&mut child, patience).await;
        account().close();

        let ended = match &end {
            End::ClientClosed => "client_closed".to_owned(),
            End::ServerClosed => "server_closed".to_owned(),
            End::Shutdown => "node_shutdown".to_owned(),
            End::Severed => "severed".to_owned(),
            End::Failed(why) => {
                tracing::debug!(service = %self.service, "session failed: {why}");
                "failed".to_owned()
            }
        };
        self.audit.record(AuditEvent::SessionClose {
            service: self.service.clone(),
            principal,
            peer: peer_name,
            duration_ms: started.elapsed().as_millis() as u64,
            bytes_in,
            bytes_out,
            ended,
        });
        Ok(())
    }

    async fn refuse<R, W>(
        &self,
        first_frame: Option<&Value>,
        mut transport: NdjsonTransport<R, W>,
        frame: ErrorFrame,
        principal: &str,
        peer_name: &str,
    ) where
        R: AsyncRead + Unpin,
        W: AsyncWrite + Unpin,
    {
        tracing::info!(service = %self.service, peer = %peer_name, "refused a session: busy");
        self.audit.record(AuditEvent::SessionRefused {
            service: self.service.clone(),
            principal: principal.to_owned(),
            peer: peer_name.to_owned(),
            code: ErrorCode::Busy.code(),
        });
        match first_frame {
            Some(first) => {
                let id = first
                    .get("id")
                    .and_then(|id| RawValue::from_string(id.to_string()).ok());
                let _ = transport.send_raw(&frame.id(id.as_deref()).to_line()).await;
                let _ = transport.writer_mut().shutdown().await;
            }
            None => refuse(&mut transport, frame).await,
        }
    }

    fn spawn(
        &self,
        identity: Option<&PeerIdentity>,
        options: &SpawnOptions,
    ) -> Result<Child, BackendError> {
        let (program, args) = self.cmd.split_first().ok_or(BackendError::NoCommand)?;
        let mut cmd = Command::new(program);
        cmd.args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        // The node's own MCPMESH_* variables are not the child's business.
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with(RESERVED_ENV_PREFIX) {
                cmd.env_remove(key);
            }
        }
        for (key, value) in &options.env {
            if !key.starts_with(RESERVED_ENV_PREFIX) {
                cmd.env(key, value);
            }
        }
        // Set last: neither the service's env nor anything the caller sends can override them.
        if let Some(id) = identity {
            cmd.env("MCPMESH_PEER_EID", id.principal())
                .env("MCPMESH_PEER_NAME", &id.name)
                .env("MCPMESH_PEER_GROUPS", id.groups.join(","));
            if let Some(user) = &id.user_id {
                cmd.env("MCPMESH_PEER_USER", user);
            }
        }
        cmd.env("MCPMESH_SERVICE", &self.service);
        if let Some(cwd) = &options.cwd {
            cmd.current_dir(cwd);
        }
        cmd.spawn().map_err(|source| BackendError::Spawn {
            cmd: program.clone(),
            source,
        })
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
