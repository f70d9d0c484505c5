//! The daemon's side of the control socket: accept, check the peer's uid, dispatch.

use std::future::Future;
use std::os::fd::AsFd;
use std::sync::Arc;

use std::time::Duration;

use mcpmesh_net::session::OpenedSession;
use mcpmesh_net::transport::{NdjsonTransport, TransportError};
use serde_json::{Value, json};
use tokio::io::AsyncReadExt;
use tokio::net::{UnixListener, UnixStream};
use tokio_util::sync::CancellationToken;

use super::{
    API_VERSION, Attach, ControlError, MAX_CONTROL_FRAME, Request, Response, SessionOpen, codes,
    methods,
};
use crate::proxy::{self, LocalSide};

/// How long an opener that asked to pass descriptors has to send them.
const FDS_TIMEOUT: Duration = Duration::from_secs(10);

/// What a method call produced.
#[derive(Debug)]
pub enum Reply {
    /// An ordinary result.
    Value(Value),
    /// The result, after which the connection attaches the opener to an MCP session.
    Tunnel(Value, Box<OpenedSession>, SessionOpen),
    /// The result, after which the node stops.
    ThenStop(Value),
    /// The result, after which each event is sent as an `event` notification until the client
    /// goes away.
    Stream(Value, tokio::sync::broadcast::Receiver<std::sync::Arc<str>>),
}

/// The node operations the control API exposes. Implemented by the daemon.
pub trait ControlHandler: Send + Sync + 'static {
    fn call(
        &self,
        method: &str,
        params: Value,
    ) -> impl Future<Output = Result<Reply, ControlError>> + Send;

    /// Runs an opened session (to `open`'s peer and service) with the opener's side until it
    /// ends.
    fn tunnel(
        &self,
        local: LocalSide,
        session: OpenedSession,
        open: SessionOpen,
    ) -> impl Future<Output = ()> + Send;

    /// A `hello` result's node id.
    fn node_id(&self) -> String;

    /// How long the node gives one dial of a peer: a `hello` result's `dial_timeout_secs`, so
    /// that clients wait on a dialing method a little longer than the node itself does.
    fn dial_timeout(&self) -> std::time::Duration;
}

/// Serves the control socket until `stop` fires. Connections from other users are dropped.
pub async fn serve<H: ControlHandler>(
    listener: UnixListener,
    handler: Arc<H>,
    stop: CancellationToken,
) {
    let my_uid = rustix::process::getuid().as_raw();
    let mut backoff = crate::accept::AcceptBackoff::new("control socket");
    loop {
        let stream = tokio::select! {
            _ = stop.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    backoff.succeeded();
                    stream
                }
                Err(e) => {
                    let wait = backoff.failed(&e);
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = tokio::time::sleep(wait) => continue,
                    }
                }
            },
        };
        match stream.peer_cred() {
            Ok(cred) if cred.uid() == my_uid => {}
            _ => {
                tracing::warn!("refused a control connection from another user");
                continue;
            }
        }
        let handler = handler.clone();
        let stop = stop.clone();
        tokio::spawn(async move { connection(stream, handler, stop).await });
    }
}

async fn connection<H: ControlHandler>(
    stream: UnixStream,
    handler: Arc<H>,
    stop: CancellationToken,
) {
    let (r, w) = stream.into_split();
    let mut t = NdjsonTransport::new(r, w, MAX_CONTROL_FRAME);
    let mut greeted = false;
    loop {
        let line = match t.recv_line().await {
            Ok(Some(line)) => line,
            Ok(None) | Err(TransportError::Io(_)) => return,
            Err(e) => {
                let err = ControlError::new(codes::INVALID_REQUEST, e.to_string());
                let _ = t.send_raw(&Response::to_line(Value::Null, Err(err))).await;
                continue;
            }
        };
        let req: Request = match serde_json::from_slice(&line) {
            Ok(req) => req,
            Err(e) => {
                let err = ControlError::new(codes::PARSE, format!("not a JSON-RPC request: {e}"));
                let _ = t.send_raw(&Response::to_line(Value::Null, Err(err))).await;
                continue;
            }
        };
        let outcome = if req.method == methods::HELLO {
            hello(&req.params, &handler.node_id(), handler.dial_timeout()).map(|v| {
                greeted = true;
                Reply::Value(v)
            })
        } else if !greeted {
            Err(ControlError::new(
                codes::INVALID_REQUEST,
                "send hello first",
            ))
        } else {
            handler.call(&req.method, req.params).await
        };
        match outcome {
            Ok(Reply::Value(v)) => {
                if t.send_raw(&Response::to_line(req.id, Ok(v))).await.is_err() {
                    return;
                }
            }
            Ok(Reply::Stream(v, events)) => {
                if t.send_raw(&Response::to_line(req.id, Ok(v))).await.is_ok() {
                    stream_events(t, events, &stop).await;
                }
                return;
            }
            Ok(Reply::ThenStop(v)) => {
                let _ = t.send_raw(&Response::to_line(req.id, Ok(v))).await;
                stop.cancel();
                return;
            }
            Ok(Reply::Tunnel(v, session, open)) => {
                if t.send_raw(&Response::to_line(req.id, Ok(v))).await.is_err() {
                    return;
                }
                let (reader, writer) = t.into_parts();
                let (read_half, leftover) = reader.into_parts();
                let Ok(stream) = read_half.reunite(writer) else {
                    tracing::error!("control connection halves did not match");
                    return;
                };
                match attach_local(stream, leftover, open.attach).await {
                    Ok(local) => handler.tunnel(local, *session, open).await,
                    Err(e) => tracing::warn!("a session's opener did not attach: {e}"),
                }
                return;
            }
            Err(e) => {
                if t.send_raw(&Response::to_line(req.id, Err(e)))
                    .await
                    .is_err()
                {
                    return;
                }
            }
        }
    }
}

/// Sends every event as `{"jsonrpc":"2.0","method":"event","params":<record>}` until the client
/// closes the connection or the node stops. A watcher that falls behind is told how many events
/// it missed (`{"method":"lagged","params":{"missed":N}}`) and continues.
async fn stream_events(
    mut t: NdjsonTransport<tokio::net::unix::OwnedReadHalf, tokio::net::unix::OwnedWriteHalf>,
    mut events: tokio::sync::broadcast::Receiver<std::sync::Arc<str>>,
    stop: &CancellationToken,
) {
    use tokio::sync::broadcast::error::RecvError;
    loop {
        let line = tokio::select! {
            _ = stop.cancelled() => return,
            // Whatever the client sends now, or its EOF, ends the stream.
            _ = t.recv_line() => return,
            event = events.recv() => match event {
                Ok(record) => format!("{{\"jsonrpc\":\"2.0\",\"method\":\"event\",\"params\":{record}}}\n"),
                Err(RecvError::Lagged(n)) => format!("{{\"jsonrpc\":\"2.0\",\"method\":\"lagged\",\"params\":{{\"missed\":{n}}}}}\n"),
                Err(RecvError::Closed) => return,
            },
        };
        if t.send_raw(line.as_bytes()).await.is_err() {
            return;
        }
    }
}

/// The opener's side of a session: the control connection itself, or the descriptors it passes.
async fn attach_local(
    stream: UnixStream,
    leftover: bytes::BytesMut,
    attach: Attach,
) -> std::io::Result<LocalSide> {
    match attach {
        Attach::Stream => {
            // The opener shuts down its writing side when its client's input ends; a closed
            // connection means the opener itself is gone.
            let gone = proxy::hung_up(stream.as_fd().try_clone_to_owned()?);
            let (input, output) = stream.into_split();
            Ok(LocalSide {
                input: Box::new(input),
                output: Box::new(output),
                leftover,
                gone: Box::pin(gone),
                report: None,
                ledger: None,
            })
        }
        Attach::Fds => {
            let (input, output, ledger) =
                tokio::time::timeout(FDS_TIMEOUT, proxy::receive_stdio(&stream))
                    .await
                    .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
            let output_closed = proxy::hung_up(output.try_clone()?);
            let (mut alive, report) = stream.into_split();
            Ok(LocalSide {
                input: proxy::input_from(input)?,
                output: proxy::output_from(output)?,
                leftover,
                gone: Box::pin(async move {
                    // The opener writes nothing more; EOF (or an error) means it is gone. So
                    // does a client that closed the output it was reading.
                    let mut buf = [0u8; 64];
                    let opener_gone =
                        async { while matches!(alive.read(&mut buf).await, Ok(n) if n > 0) {} };
                    tokio::select! {
                        () = opener_gone => {}
                        () = output_closed => {}
                    }
                }),
                report: Some(Box::new(report)),
                ledger,
            })
        }
    }
}

fn hello(
    params: &Value,
    node_id: &str,
    dial_timeout: std::time::Duration,
) -> Result<Value, ControlError> {
    let api = params
        .get("api")
        .and_then(Value::as_u64)
        .unwrap_or(u64::from(API_VERSION));
    if api != u64::from(API_VERSION) {
        return Err(ControlError::new(
            codes::API_MISMATCH,
            format!(
                "this node speaks control API {API_VERSION}, the client asked for {api}; use matching mcpmesh versions"
            ),
        ));
    }
    Ok(json!({
        "api": API_VERSION,
        "version": env!("CARGO_PKG_VERSION"),
        "id": node_id,
        "dial_timeout_secs": dial_timeout.as_secs(),
    }))
}
