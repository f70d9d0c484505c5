//! One HTTP MCP session of the gateway: its mesh session, and where each of the server's
//! messages goes.

use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use mcpmesh_net::jsonrpc::{self, Kind};
use mcpmesh_net::transport::{FrameReader, MAX_FRAME};
use serde_json::value::RawValue;
use tokio::io::AsyncWriteExt;
use tokio::net::unix::OwnedWriteHalf;
use tokio::sync::{Mutex, mpsc};
use tokio_util::sync::CancellationToken;

use super::routes::{self, Refused, Routes, with_id, with_progress_token};
use super::{BACKLOG, Gateway};

pub(super) enum Lookup {
    NoHeader,
    Unknown,
    Found(Arc<Session>),
}

pub(super) struct Session {
    pub(super) peer: String,
    pub(super) service: String,
    pub(super) writer: Mutex<OwnedWriteHalf>,
    pub(super) routes: StdMutex<Routes>,
    pub(super) closed: CancellationToken,
    /// Fires when the node has ended the mesh session's stream.
    pub(super) ended: CancellationToken,
    pub(super) last_active: StdMutex<Instant>,
}

impl Session {
    pub(super) fn routes(&self) -> std::sync::MutexGuard<'_, Routes> {
        self.routes.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn touch(&self) {
        *self.last_active.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
    }

    /// How long the session has had no request in flight and no open stream; `None` while
    /// it has. A stream or request whose client went away does not count.
    pub(super) fn idle_for(&self) -> Option<Duration> {
        let routes = self.routes();
        let in_use = routes.get.as_ref().is_some_and(|g| !g.is_closed())
            || routes.waiting.values().any(|w| !w.tx.is_closed());
        drop(routes);
        if in_use {
            // Idle time counts from when the session was last seen in use.
            self.touch();
            return None;
        }
        Some(
            self.last_active
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .elapsed(),
        )
    }

    pub(super) async fn send(&self, line: &[u8]) -> std::io::Result<()> {
        self.touch();
        let mut w = self.writer.lock().await;
        w.write_all(line).await?;
        w.write_all(b"\n").await?;
        w.flush().await
    }

    /// Ends the mesh session: the node closes the stream and the remote server goes.
    pub(super) async fn close(&self) {
        self.closed.cancel();
        let _ = self.writer.lock().await.shutdown().await;
        self.routes().clear();
    }

    /// Registers the stream that answers request `id` (and carries its progress).
    pub(super) fn route_answer(
        &self,
        id: &RawValue,
        token: Option<&RawValue>,
        cap: usize,
    ) -> Result<mpsc::Receiver<Bytes>, Refused> {
        self.routes().insert(jsonrpc::id_key(id), token, None, cap)
    }

    /// As [`Session::route_answer`], under an id of the gateway's own, unique in this session: the
    /// id to send the server instead of `id`, which the answer gets back. Requests of
    /// independent clients that happen to use the same id can then share the session.
    pub(super) fn expect_remapped(
        &self,
        id: &RawValue,
        token: Option<&RawValue>,
        cap: usize,
    ) -> Result<(Box<RawValue>, mpsc::Receiver<Bytes>), Refused> {
        let mut routes = self.routes();
        // The same name serves as its progress token: both are unique in the session.
        let ours = RawValue::from_string(format!("\"mcpmesh-gateway:{}\"", routes.next))
            .map_err(|_| Refused::Full)?;
        let client = (id.to_owned(), token.map(ToOwned::to_owned));
        let ours_token = token.map(|_| &*ours);
        let rx = routes.insert(ours.get().to_owned(), ours_token, Some(client), cap)?;
        Ok((ours, rx))
    }

    /// Reads the server's lines from the mesh and routes each to its stream.
    pub(super) async fn route(self: Arc<Self>, reader: tokio::net::unix::OwnedReadHalf) {
        let mut reader = FrameReader::new(reader, MAX_FRAME);
        loop {
            let line = tokio::select! {
                l = reader.next_line() => l,
                _ = self.closed.cancelled() => break,
            };
            let Ok(Some(line)) = line else { break };
            if let Some((tx, done, line)) = self.target_of(line.clone())
                && tx.send(line.clone()).await.is_err()
                && !done
            {
                // The stream's reader went away; hold the message for the next one.
                self.hold(line);
            }
        }
        // The mesh session ended (the node answered whatever was outstanding first).
        self.closed.cancel();
        self.ended.cancel();
        self.routes().clear();
    }

    /// Picks the stream for one server line: `(sender, is_final, line)`, the line with the
    /// client's own id when it answers a remapped request; `None` when it was held in the
    /// backlog.
    pub(super) fn target_of(&self, line: Bytes) -> Option<(mpsc::Sender<Bytes>, bool, Bytes)> {
        let mut routes = self.routes();
        let peek = jsonrpc::peek(&line);
        let kind = peek.as_ref().map(jsonrpc::Peek::kind);
        if kind == Some(Kind::Response) {
            if let Some(key) = peek.as_ref().and_then(|p| p.id).map(jsonrpc::id_key)
                && let Some(w) = routes.remove(&key)
            {
                let line = match &w.client_id {
                    Some(id) => with_id(&line, id).unwrap_or(line),
                    None => line,
                };
                return Some((w.tx, true, line));
            }
        } else if let Some(token) = peek
            .as_ref()
            .and_then(|p| p.progress_token().map(jsonrpc::id_key))
            && let Some(key) = routes.tokens.get(&token)
            && let Some(w) = routes.waiting.get(key)
        {
            let line = match &w.client_token {
                Some(t) => with_progress_token(&line, t).unwrap_or(line),
                None => line,
            };
            return Some((w.tx.clone(), false, line));
        } else if let Some(key) = peek
            .as_ref()
            .and_then(routes::subscription_id)
            .map(jsonrpc::id_key)
            && let Some(w) = routes.waiting.get(&key)
        {
            // A `subscriptions/listen` stream's notification goes to that stream, under the
            // id its client gave the listen request.
            let line = match &w.client_id {
                Some(id) => routes::with_subscription_id(&line, id).unwrap_or(line),
                None => line,
            };
            return Some((w.tx.clone(), false, line));
        }
        if let Some(get) = routes.get.as_ref().filter(|g| !g.is_closed()) {
            return Some((get.clone(), false, line));
        }
        let newest = routes
            .order
            .values()
            .next_back()
            .and_then(|k| routes.waiting.get(k));
        if let Some(w) = newest {
            return Some((w.tx.clone(), false, line));
        }
        drop(routes);
        self.hold(line);
        None
    }

    pub(super) fn hold(&self, line: Bytes) {
        let mut routes = self.routes();
        if routes.backlog.len() >= BACKLOG {
            routes.backlog.pop_front();
            tracing::warn!("gateway: a server message was dropped (no stream open to carry it)");
        }
        routes.backlog.push_back(line);
    }
}

/// Opens a mesh session to `peer/service` and starts routing the server's messages.
pub(super) async fn new_session(
    gateway: &Arc<Gateway>,
    peer: &str,
    service: &str,
) -> Result<Arc<Session>, (i64, String)> {
    let stream = gateway.open(peer, service).await?;
    let (reader, writer) = stream.into_split();
    let session = Arc::new(Session {
        peer: peer.to_owned(),
        service: service.to_owned(),
        writer: Mutex::new(writer),
        routes: StdMutex::new(Routes::default()),
        closed: CancellationToken::new(),
        ended: CancellationToken::new(),
        last_active: StdMutex::new(Instant::now()),
    });
    tokio::spawn(session.clone().route(reader));
    Ok(session)
}
