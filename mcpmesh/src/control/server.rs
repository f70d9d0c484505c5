//! The daemon's side of the control socket: accept, check the peer's uid, dispatch.

use std::future::Future;
use std::sync::Arc;

use mcpmesh_net::session::OpenedSession;
use mcpmesh_net::transport::{NdjsonTransport, TransportError};
use serde_json::{Value, json};
use tokio::net::{UnixListener, UnixStream};
use tokio_util::sync::CancellationToken;

use super::{API_VERSION, ControlError, MAX_CONTROL_FRAME, Request, Response, codes, methods};

/// What a method call produced.
#[derive(Debug)]
pub enum Reply {
    /// An ordinary result.
    Value(Value),
    /// The result, after which the connection becomes the byte tunnel of an MCP session.
    Tunnel(Value, OpenedSession),
    /// The result, after which the node stops.
    ThenStop(Value),
}

/// The node operations the control API exposes. Implemented by the daemon.
pub trait ControlHandler: Send + Sync + 'static {
    fn call(
        &self,
        method: &str,
        params: Value,
    ) -> impl Future<Output = Result<Reply, ControlError>> + Send;

    /// Runs an opened session over the connection's halves until it ends.
    fn tunnel(
        &self,
        local: UnixStream,
        leftover: bytes::BytesMut,
        session: OpenedSession,
    ) -> impl Future<Output = ()> + Send;

    /// A `hello` result's node id.
    fn node_id(&self) -> String;
}

/// Serves the control socket until `stop` fires. Connections from other users are dropped.
pub async fn serve<H: ControlHandler>(
    listener: UnixListener,
    handler: Arc<H>,
    stop: CancellationToken,
) {
    let my_uid = rustix::process::getuid().as_raw();
    loop {
        let stream = tokio::select! {
            _ = stop.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    tracing::warn!("control socket accept failed: {e}");
                    continue;
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
            hello(&req.params, &handler.node_id()).map(|v| {
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
            Ok(Reply::ThenStop(v)) => {
                let _ = t.send_raw(&Response::to_line(req.id, Ok(v))).await;
                stop.cancel();
                return;
            }
            Ok(Reply::Tunnel(v, session)) => {
                if t.send_raw(&Response::to_line(req.id, Ok(v))).await.is_err() {
                    return;
                }
                let (reader, writer) = t.into_parts();
                let (read_half, leftover) = reader.into_parts();
                match read_half.reunite(writer) {
                    Ok(stream) => handler.tunnel(stream, leftover, session).await,
                    Err(_) => tracing::error!("control connection halves did not match"),
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

fn hello(params: &Value, node_id: &str) -> Result<Value, ControlError> {
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
    }))
}
