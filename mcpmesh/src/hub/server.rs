//! The hub as its client sees it: one MCP server whose lists merge every service's, answered
//! from the cache, and whose calls go to the right service's session, opened on first use.
//!
//! Ids never cross unchanged: a client request forwarded upstream gets the session's own id
//! (and its progress token one of the hub's), and a server's request to the client gets a hub
//! id; answers, progress and cancellations are mapped back on the way. A progress notification
//! or answer that names nothing the hub sent that session is dropped, so one service cannot
//! speak for another.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use mcpmesh_net::errors::{ErrorCode, ErrorFrame};
use mcpmesh_net::transport::{FrameReader, MAX_FRAME, TransportError};
use serde_json::value::RawValue;
use serde_json::{Map, Value, json};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::cache::{self, Cache, Listing, MAX_ITEMS};
use super::names::{self, Collision, Origin, Routes};
use super::pool::Pool;
use super::upstream::{Inbound, NodeAccess, Upstream, UpstreamError};
use super::{HubConfig, HubError, Target};

/// Items per page of a merged list.
const PAGE: usize = 100;
/// Pages read from one server's list before the rest is left out.
const MAX_PAGES: usize = 100;
/// How often the node is asked which peers are reachable.
const REACH_EVERY: Duration = Duration::from_secs(3);
/// How long a list waits for the first listing of services the cache does not know yet.
const FIRST_LISTING: Duration = Duration::from_secs(20);
/// After the client's input ends, how long answers still on their way may take.
const DRAIN: Duration = Duration::from_secs(2);
/// Server requests to the client awaiting the client's answer, at most.
const MAX_ASKED: usize = 4096;
/// Bytes of queued lines written to the client at once.
const BATCH: usize = 256 * 1024;
/// Lines queued toward the client before senders wait.
const OUT_QUEUE: usize = 256;
/// Protocol revisions of the `initialize` era the hub speaks; the first is its default.
const VERSIONS: [&str; 4] = ["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"];
/// The stateless revision, answered through `server/discover`.
const MODERN: &str = "2026-07-28";
/// MCP's log levels, least severe first.
const LOG_LEVELS: [&str; 8] = [
    "debug",
    "info",
    "notice",
    "warning",
    "error",
    "critical",
    "alert",
    "emergency",
];

/// A tool or prompt as the hub lists it.
#[derive(Debug, Clone)]
struct Item {
    origin: Origin,
    target: Target,
    value: Value,
}

impl Item {
    /// The item as the client sees it: under the hub's `name`, its description saying where
    /// it lives (and whether its peer is reachable now); every other member as the server
    /// listed it.
    fn presented(&self, name: &str, reachable: bool) -> Value {
        let mut shown = self.value.clone();
        shown["name"] = json!(name);
        shown["description"] = json!(names::describe(
            &self.origin,
            self.value["description"].as_str(),
            reachable,
        ));
        shown
    }
}

/// The merged lists, rebuilt whenever a listing changes.
#[derive(Debug, Default)]
struct View {
    tools: Vec<(String, Item)>,
    tool_routes: Routes,
    prompts: Vec<(String, Item)>,
    prompt_routes: Routes,
    /// Resources and templates under the URIs the hub presents.
    resources: Vec<Value>,
    templates: Vec<Value>,
    /// Why the last rebuild failed (two items sharing a name), while it does.
    error: Option<String>,
}

/// A client request sent upstream, until its answer.
struct Forwarded {
    up: Arc<Upstream>,
    upstream_id: u64,
    cancelled: bool,
}

pub(super) struct Hub {
    config: HubConfig,
    node: NodeAccess,
    targets: Vec<Target>,
    out: mpsc::Sender<Vec<u8>>,
    inbound: mpsc::Sender<Inbound>,
    pool: Pool,
    cache: StdMutex<Cache>,
    view: StdMutex<View>,
    hello: StdMutex<Option<Value>>,
    log_level: StdMutex<Option<Value>>,
    /// Client request id (as JSON text) → where it went.
    forwarded: StdMutex<HashMap<String, Forwarded>>,
    /// Hub id of a server's request to the client → the session and the server's own id.
    asked: StdMutex<HashMap<String, (Arc<Upstream>, Value)>>,
    /// (service, hub progress token) → the client's token.
    tokens: StdMutex<HashMap<(Target, String), Value>>,
    /// Peer name → whether the node reached it at its last check.
    reach: StdMutex<HashMap<String, bool>>,
    /// Services whose listing is being fetched now.
    refreshing: StdMutex<HashSet<Target>>,
    /// Services that said their lists changed while being fetched.
    again: StdMutex<HashSet<Target>>,
    /// First listings still being fetched.
    first_fetches: watch::Sender<usize>,
    /// Whether the client was given a list yet (until then, a new listing is not news).
    listed: AtomicBool,
    next: AtomicU64,
    tasks: TaskTracker,
    stop: CancellationToken,
}

pub(super) async fn run<R, W>(config: HubConfig, input: R, output: W) -> Result<(), HubError>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let node = NodeAccess {
        profile: config.profile.clone(),
        exe: config.exe.clone(),
    };
    let peers = node
        .call(crate::control::methods::PEERS_LIST, json!({}))
        .await
        .map_err(|e| HubError::Node(e.to_string()))?;
    let targets = if config.targets.is_empty() {
        mountable(&peers)
    } else {
        config.targets.clone()
    };
    let cache = Cache::load(Cache::path_in(&config.profile.state_dir));
    let (out, out_rx) = mpsc::channel::<Vec<u8>>(OUT_QUEUE);
    let (inbound, inbound_rx) = mpsc::channel::<Inbound>(OUT_QUEUE);
    let hub = Arc::new(Hub {
        pool: Pool::new(config.idle),
        node,
        targets,
        out,
        inbound,
        cache: StdMutex::new(cache),
        view: StdMutex::new(View::default()),
        hello: StdMutex::new(None),
        log_level: StdMutex::new(None),
        forwarded: StdMutex::new(HashMap::new()),
        asked: StdMutex::new(HashMap::new()),
        tokens: StdMutex::new(HashMap::new()),
        reach: StdMutex::new(reachability(&peers)),
        refreshing: StdMutex::new(HashSet::new()),
        again: StdMutex::new(HashSet::new()),
        first_fetches: watch::channel(0).0,
        listed: AtomicBool::new(false),
        next: AtomicU64::new(1),
        tasks: TaskTracker::new(),
        stop: CancellationToken::new(),
        config,
    });
    // Two items sharing a name is an error at start, before the client sees anything.
    hub.rebuild()
        .map_err(|c| HubError::Collision(c.to_string()))?;

    let writer = tokio::spawn(write_out(out_rx, output, hub.stop.clone()));
    tokio::spawn(hub.clone().from_servers(inbound_rx));
    tokio::spawn(hub.clone().watch_reach());

    let mut frames = FrameReader::new(input, MAX_FRAME);
    loop {
        let line = tokio::select! {
            line = frames.next_line() => line,
            _ = hub.stop.cancelled() => break,
        };
        match line {
            Ok(Some(line)) => hub.clone().client_frame(&line).await,
            Ok(None) => break,
            Err(TransportError::FrameTooLarge(_)) => {
                hub.send(ErrorFrame::new(ErrorCode::FrameTooLarge).to_line())
                    .await;
            }
            Err(e) => {
                tracing::debug!("the client's input failed: {e}");
                break;
            }
        }
    }
    // Answers still on their way get a moment; then every session is closed.
    hub.tasks.close();
    let _ = tokio::time::timeout(DRAIN, hub.tasks.wait()).await;
    hub.stop.cancel();
    hub.pool.close_all().await;
    let _ = writer.await;
    Ok(())
}

/// Every `peer/service` the node may mount, from its `peers.list` answer.
fn mountable(peers: &Value) -> Vec<Target> {
    let mut out = Vec::new();
    for p in peers["peers"].as_array().into_iter().flatten() {
        let Some(peer) = p["name"].as_str() else {
            continue;
        };
        for service in p["mounts"].as_array().into_iter().flatten() {
            if let Some(service) = service.as_str() {
                out.push(Target {
                    peer: peer.to_owned(),
                    service: service.to_owned(),
                });
            }
        }
    }
    out
}

fn reachability(peers: &Value) -> HashMap<String, bool> {
    peers["peers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| Some((p["name"].as_str()?.to_owned(), p["reachable"].as_bool()?)))
        .collect()
}

async fn write_out<W: AsyncWrite + Unpin>(
    mut rx: mpsc::Receiver<Vec<u8>>,
    mut output: W,
    stop: CancellationToken,
) {
    loop {
        let line = tokio::select! {
            line = rx.recv() => line,
            _ = stop.cancelled() => None,
        };
        let Some(mut batch) = line else { break };
        // What is already queued goes out in the same write.
        while batch.len() < BATCH
            && let Ok(more) = rx.try_recv()
        {
            batch.extend_from_slice(&more);
        }
        if output.write_all(&batch).await.is_err() || output.flush().await.is_err() {
            stop.cancel();
            break;
        }
    }
    let _ = output.shutdown().await;
}

fn key(id: &Value) -> String {
    id.to_string()
}

fn lock<T>(m: &StdMutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn answer(id: &Value, result: Value) -> Vec<u8> {
    line(&json!({"jsonrpc": "2.0", "id": id, "result": result}))
}

fn line(frame: &Value) -> Vec<u8> {
    let mut out = serde_json::to_vec(frame).unwrap_or_default();
    out.push(b'\n');
    out
}

/// An error of the mesh's band (or a JSON-RPC one) answering `id`.
fn mesh_error(id: &Value, code: ErrorCode, message: impl Into<String>) -> Vec<u8> {
    let raw = RawValue::from_string(id.to_string()).ok();
    ErrorFrame::new(code)
        .id(raw.as_deref())
        .message(message)
        .to_line()
}

fn rpc_error(id: &Value, code: i64, message: impl Into<String>) -> Vec<u8> {
    line(&json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": {"code": code, "message": message.into(), "data": {"source": "mcpmesh"}},
    }))
}

impl Hub {
    async fn send(&self, line: Vec<u8>) {
        if !line.is_empty() {
            let _ = self.out.send(line).await;
        }
    }

    /// One frame from the client.
    async fn client_frame(self: Arc<Self>, line: &[u8]) {
        let frame: Value = match serde_json::from_slice(line) {
            Ok(Value::Object(frame)) => Value::Object(frame),
            Ok(_) => {
                self.send(
                    ErrorFrame::new(ErrorCode::InvalidRequest)
                        .message("not a JSON-RPC message: one object per line")
                        .to_line(),
                )
                .await;
                return;
            }
            Err(_) => {
                self.send(ErrorFrame::new(ErrorCode::Parse).to_line()).await;
                return;
            }
        };
        let method = frame
            .get("method")
            .and_then(Value::as_str)
            .map(str::to_owned);
        match (method, frame.get("id").cloned()) {
            (Some(_), Some(id)) if !valid_id(&id) => {
                // Refused as the serving node refuses it: no answer could name it.
                self.send(
                    ErrorFrame::new(ErrorCode::InvalidRequest)
                        .message("invalid request: an id must be a string or an integer")
                        .to_line(),
                )
                .await;
            }
            (Some(method), Some(id)) => {
                let hub = self.clone();
                self.tasks
                    .spawn(async move { hub.request(id, &method, frame).await });
            }
            (Some(method), None) => self.client_notification(&method, frame).await,
            (None, Some(id)) => self.client_answer(&id, frame).await,
            (None, None) => {}
        }
    }

    async fn request(self: Arc<Self>, id: Value, method: &str, frame: Value) {
        let params = frame.get("params").cloned().unwrap_or(Value::Null);
        let reply = match method {
            "initialize" => {
                *lock(&self.hello) = Some(params.clone());
                self.clone().first_listings();
                let asked = params["protocolVersion"].as_str().unwrap_or_default();
                let version = VERSIONS
                    .iter()
                    .find(|v| **v == asked)
                    .copied()
                    .unwrap_or(VERSIONS[0]);
                answer(
                    &id,
                    json!({
                        "protocolVersion": version,
                        "capabilities": self.capabilities(),
                        "serverInfo": server_info(),
                        "instructions": self.instructions(),
                    }),
                )
            }
            "server/discover" => {
                self.clone().first_listings();
                answer(
                    &id,
                    json!({
                        "supportedVersions": [MODERN],
                        "capabilities": self.capabilities(),
                        "serverInfo": server_info(),
                        "instructions": self.instructions(),
                    }),
                )
            }
            "ping" => answer(&id, json!({})),
            "tools/list" | "prompts/list" | "resources/list" | "resources/templates/list" => {
                self.clone().first_listings();
                self.wait_for_first_listings().await;
                self.refresh_stale();
                self.listed.store(true, Ordering::SeqCst);
                self.list(&id, method, &params)
            }
            "logging/setLevel" => {
                *lock(&self.log_level) = Some(params.clone());
                for up in self.pool.all_live().await {
                    if up.capabilities().get("logging").is_some() {
                        let _ = up.start("logging/setLevel", params.clone()).await;
                    }
                }
                answer(&id, json!({}))
            }
            "tools/call"
            | "prompts/get"
            | "resources/read"
            | "resources/subscribe"
            | "resources/unsubscribe"
            | "completion/complete" => {
                let mut routed = self.destination(method, params.clone());
                if routed.is_err() {
                    // A name the cache does not know yet may be in a listing on its way.
                    self.clone().first_listings();
                    self.wait_for_first_listings().await;
                    routed = self.destination(method, params);
                }
                match routed {
                    Ok((target, params)) => self.forward(&id, target, method, params).await,
                    Err(message) => rpc_error(&id, -32602, message),
                }
            }
            other => rpc_error(&id, -32601, format!("method not found: {other}")),
        };
        self.send(reply).await;
    }

    /// Where a request goes, and its params as that server must see them.
    fn destination(&self, method: &str, mut params: Value) -> Result<(Target, Value), String> {
        if !params.is_object() {
            return Err(format!("{method}: params must be an object"));
        }
        if method == "completion/complete" && !params["ref"].is_object() {
            return Err("completion/complete: params.ref must be an object".to_owned());
        }
        let view = lock(&self.view);
        let by_name = |routes: &Routes, name: &str, kind: &str| {
            routes
                .route(name)
                .cloned()
                .ok_or_else(|| format!("unknown {kind}: {name}"))
        };
        match method {
            "tools/call" | "prompts/get" => {
                let (routes, kind) = if method == "tools/call" {
                    (&view.tool_routes, "tool")
                } else {
                    (&view.prompt_routes, "prompt")
                };
                let name = params["name"].as_str().unwrap_or_default().to_owned();
                let origin = by_name(routes, &name, kind)?;
                params["name"] = json!(origin.name);
                Ok((target_of(&origin), params))
            }
            "completion/complete" => match params["ref"]["type"].as_str() {
                Some("ref/prompt") => {
                    let name = params["ref"]["name"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned();
                    let origin = by_name(&view.prompt_routes, &name, "prompt")?;
                    params["ref"]["name"] = json!(origin.name);
                    Ok((target_of(&origin), params))
                }
                _ => {
                    let uri = params["ref"]["uri"].as_str().unwrap_or_default();
                    let (target, own) = self.resource_owner(uri)?;
                    params["ref"]["uri"] = json!(own);
                    Ok((target, params))
                }
            },
            _ => {
                let uri = params["uri"].as_str().unwrap_or_default();
                let (target, own) = self.resource_owner(uri)?;
                params["uri"] = json!(own);
                Ok((target, params))
            }
        }
    }

    /// The service behind a URI the hub presented, and that service's own URI.
    fn resource_owner(&self, uri: &str) -> Result<(Target, String), String> {
        names::unwrap_uri(uri)
            .and_then(|(peer, service, own)| {
                self.targets
                    .iter()
                    .find(|t| t.peer == peer && t.service == service)
                    .map(|t| (t.clone(), own.to_owned()))
            })
            .ok_or_else(|| format!("unknown resource: {uri}"))
    }

    /// Sends a client request to `target`'s session (opening it when needed) and returns
    /// the line that answers the client.
    async fn forward(
        &self,
        id: &Value,
        target: Target,
        method: &str,
        mut params: Value,
    ) -> Vec<u8> {
        if lock(&self.reach).get(&target.peer) == Some(&false) {
            return mesh_error(
                id,
                ErrorCode::Unreachable,
                format!(
                    "{target}: peer {} is not reachable now (its node's last check); try again when it is",
                    target.peer
                ),
            );
        }
        let lease = match self.lease(&target).await {
            Ok(lease) => lease,
            Err(e) => return open_failed(id, &target, &e),
        };
        let up = lease.up.clone();
        // The progress token the server sees is the hub's own, mapped back on the way.
        let mut token_key = None;
        if let Some(token) = params.pointer("/_meta/progressToken").cloned() {
            let ours = json!(format!("hub-{}", self.next.fetch_add(1, Ordering::Relaxed)));
            params["_meta"]["progressToken"] = ours.clone();
            let k = (target.clone(), key(&ours));
            lock(&self.tokens).insert(k.clone(), token);
            token_key = Some(k);
        }
        let started = up.start(method, params).await;
        let reply = match started {
            Err(_) => None,
            Ok((upstream_id, rx)) => {
                lock(&self.forwarded).insert(
                    key(id),
                    Forwarded {
                        up: up.clone(),
                        upstream_id,
                        cancelled: false,
                    },
                );
                let got = rx.await.ok();
                let forwarded = lock(&self.forwarded).remove(&key(id));
                if forwarded.is_some_and(|f| f.cancelled) {
                    // The client cancelled it: it expects no answer.
                    if let Some(k) = token_key {
                        lock(&self.tokens).remove(&k);
                    }
                    return Vec::new();
                }
                got
            }
        };
        if let Some(k) = token_key {
            lock(&self.tokens).remove(&k);
        }
        drop(lease);
        match reply {
            Some(mut frame) => {
                frame["id"] = id.clone();
                name_the_service(&mut frame, &target);
                present_uris(method, &mut frame, &target);
                line(&frame)
            }
            None => mesh_error(
                id,
                ErrorCode::Unreachable,
                format!(
                    "{target}: the session ended before it answered; the next call opens a new one"
                ),
            ),
        }
    }

    async fn lease(&self, target: &Target) -> Result<super::pool::Lease, UpstreamError> {
        self.pool.lease(target, || self.open(target)).await
    }

    /// Opens `target`'s session with the client's own `initialize` params.
    async fn open(&self, target: &Target) -> Result<Arc<Upstream>, UpstreamError> {
        let up = Upstream::open(
            &self.node,
            target,
            self.upstream_hello(),
            self.inbound.clone(),
        )
        .await?;
        let level = lock(&self.log_level).clone();
        if let Some(level) = level
            && up.capabilities().get("logging").is_some()
        {
            let _ = up.start("logging/setLevel", level).await;
        }
        Ok(up)
    }

    fn upstream_hello(&self) -> Value {
        let given = lock(&self.hello).clone().unwrap_or(Value::Null);
        let version = given["protocolVersion"]
            .as_str()
            .filter(|v| VERSIONS.contains(v))
            .unwrap_or(VERSIONS[0]);
        json!({
            "protocolVersion": version,
            "capabilities": given.get("capabilities").cloned().unwrap_or(json!({})),
            "clientInfo": given
                .get("clientInfo")
                .cloned()
                .unwrap_or_else(|| json!({"name": "mcpmesh-hub", "version": env!("CARGO_PKG_VERSION")})),
        })
    }

    async fn client_notification(self: Arc<Self>, method: &str, frame: Value) {
        match method {
            "notifications/cancelled" => {
                let Some(request) = frame.pointer("/params/requestId") else {
                    return;
                };
                let target = {
                    let mut forwarded = lock(&self.forwarded);
                    forwarded.get_mut(&key(request)).map(|f| {
                        f.cancelled = true;
                        (f.up.clone(), f.upstream_id)
                    })
                };
                if let Some((up, upstream_id)) = target {
                    let mut params = frame["params"].clone();
                    params["requestId"] = json!(upstream_id);
                    up.notify("notifications/cancelled", Some(params)).await;
                    up.forget(upstream_id);
                }
            }
            "notifications/roots/list_changed" => {
                for up in self.pool.all_live().await {
                    up.notify(method, frame.get("params").cloned()).await;
                }
            }
            // The hub's own handshake; progress from the client has no upstream meaning.
            _ => {}
        }
    }

    /// The client answering a server's request: back to that server, with its own id.
    async fn client_answer(&self, id: &Value, mut frame: Value) {
        let Some((up, theirs)) = lock(&self.asked).remove(&key(id)) else {
            return;
        };
        frame["id"] = theirs;
        up.send(&frame).await;
    }

    /// What servers send, each server's frames in the order it sent them.
    async fn from_servers(self: Arc<Self>, mut inbound: mpsc::Receiver<Inbound>) {
        while let Some(inbound) = inbound.recv().await {
            let (from, mut frame) = match inbound {
                Inbound::Frame { from, frame } if frame.get("method").is_some() => (from, frame),
                // An answer goes to its waiter only now, after what the server sent before it
                // (a call's progress above all) went to the client.
                Inbound::Frame { from, frame } => {
                    from.answered(frame);
                    continue;
                }
                Inbound::Ended(from) => {
                    from.abandon_waiting();
                    continue;
                }
            };
            let method = frame["method"].as_str().unwrap_or_default().to_owned();
            if let Some(theirs) = frame.get("id").cloned() {
                // A request to the client: under a hub id, answered back to this session.
                let ours = json!(format!("hub-{}", self.next.fetch_add(1, Ordering::Relaxed)));
                let full = {
                    let mut asked = lock(&self.asked);
                    let full = asked.len() >= MAX_ASKED;
                    if !full {
                        asked.insert(key(&ours), (from.clone(), theirs.clone()));
                    }
                    full
                };
                if full {
                    let refusal = json!({"jsonrpc": "2.0", "id": theirs, "error": {
                        "code": -32603, "message": "the hub has too many requests waiting for its client",
                        "data": {"source": "mcpmesh"}}});
                    from.send(&refusal).await;
                    continue;
                }
                frame["id"] = ours;
                self.send(line(&frame)).await;
                continue;
            }
            match method.as_str() {
                "notifications/progress" => {
                    let Some(token) = frame.pointer("/params/progressToken") else {
                        continue;
                    };
                    let theirs = lock(&self.tokens)
                        .get(&(from.target.clone(), key(token)))
                        .cloned();
                    if let Some(client_token) = theirs {
                        frame["params"]["progressToken"] = client_token;
                        self.send(line(&frame)).await;
                    }
                }
                "notifications/cancelled" => {
                    // The server gave up one of its requests to the client.
                    let Some(request) = frame.pointer("/params/requestId").cloned() else {
                        continue;
                    };
                    let ours = lock(&self.asked)
                        .iter()
                        .find(|(_, (up, id))| Arc::ptr_eq(up, &from) && *id == request)
                        .map(|(k, _)| k.clone());
                    if let Some(ours) = ours {
                        lock(&self.asked).remove(&ours);
                        if let Ok(id) = serde_json::from_str::<Value>(&ours) {
                            frame["params"]["requestId"] = id;
                            self.send(line(&frame)).await;
                        }
                    }
                }
                "notifications/tools/list_changed"
                | "notifications/prompts/list_changed"
                | "notifications/resources/list_changed" => {
                    self.clone().changed_upstream(from.target.clone(), method);
                }
                "notifications/resources/updated" => {
                    let uri = frame.get_mut("params").and_then(|p| p.get_mut("uri"));
                    present_uri(uri, &from.target);
                    self.send(line(&frame)).await;
                }
                _ => self.send(line(&frame)).await,
            }
        }
    }

    /// Asks the node every few seconds which peers it reaches; a change of a peer's state
    /// changes its tools' descriptions, and the client is told the list changed.
    async fn watch_reach(self: Arc<Self>) {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(REACH_EVERY) => {}
                _ = self.stop.cancelled() => return,
            }
            let Some(peers) = self
                .node
                .call_running(crate::control::methods::PEERS_LIST, json!({}))
                .await
            else {
                continue;
            };
            let now = reachability(&peers);
            let changed = {
                let mut reach = lock(&self.reach);
                let changed = self
                    .targets
                    .iter()
                    .any(|t| reach.get(&t.peer) != now.get(&t.peer));
                *reach = now;
                changed
            };
            if changed && lock(&self.hello).is_some() {
                // A peer back in reach may have services still to list.
                self.clone().first_listings();
                self.send(line(
                    &json!({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}),
                ))
                .await;
            }
        }
    }

    /// Starts fetching the listing of every service the cache does not know (once at a
    /// time), skipping peers the node cannot reach now.
    fn first_listings(self: Arc<Self>) {
        let missing: Vec<Target> = {
            let cache = lock(&self.cache);
            let reach = lock(&self.reach);
            self.targets
                .iter()
                .filter(|t| cache.get(t).is_none() && reach.get(&t.peer) != Some(&false))
                .cloned()
                .collect()
        };
        for target in missing {
            if !lock(&self.refreshing).insert(target.clone()) {
                continue;
            }
            self.first_fetches.send_modify(|n| *n += 1);
            let hub = self.clone();
            tokio::spawn(async move {
                let changed = hub.fetch(&target).await;
                lock(&hub.refreshing).remove(&target);
                hub.first_fetches.send_modify(|n| *n = n.saturating_sub(1));
                if changed {
                    hub.announce_lists().await;
                }
            });
        }
    }

    /// A server said one of its lists changed: its listing is fetched again, one fetch at a
    /// time per service however often it says so (a change during a fetch means one more).
    fn changed_upstream(self: Arc<Self>, target: Target, method: String) {
        if !lock(&self.refreshing).insert(target.clone()) {
            lock(&self.again).insert(target);
            return;
        }
        tokio::spawn(async move {
            loop {
                if self.fetch(&target).await && self.listed.load(Ordering::SeqCst) {
                    self.send(line(&json!({"jsonrpc": "2.0", "method": method})))
                        .await;
                }
                if !lock(&self.again).remove(&target) {
                    break;
                }
            }
            lock(&self.refreshing).remove(&target);
        });
    }

    async fn wait_for_first_listings(&self) {
        let mut rx = self.first_fetches.subscribe();
        let _ = tokio::time::timeout(FIRST_LISTING, rx.wait_for(|n| *n == 0)).await;
    }

    /// Refreshes, in the background, listings past their lifetime.
    fn refresh_stale(self: &Arc<Self>) {
        let now = cache::now_ms();
        let stale: Vec<Target> = {
            let cache = lock(&self.cache);
            self.targets
                .iter()
                .filter(|t| cache.get(t).is_some_and(|l| !l.is_fresh(now)))
                .cloned()
                .collect()
        };
        for target in stale {
            if lock(&self.reach).get(&target.peer) == Some(&false) {
                continue;
            }
            if !lock(&self.refreshing).insert(target.clone()) {
                continue;
            }
            let hub = self.clone();
            tokio::spawn(async move {
                let changed = hub.fetch(&target).await;
                lock(&hub.refreshing).remove(&target);
                if changed {
                    hub.announce_lists().await;
                }
            });
        }
    }

    /// Fetches `target`'s listing on its session (opened if needed) into the cache; whether
    /// what the client sees changed.
    async fn fetch(&self, target: &Target) -> bool {
        let lease = match self.lease(target).await {
            Ok(lease) => lease,
            Err(e) => {
                self.warn(target, &format!("cannot list its tools: {e}"))
                    .await;
                return false;
            }
        };
        let (mut listing, mut notes) = match list_all(&lease.up).await {
            Ok(listed) => listed,
            Err(e) if self.stop.is_cancelled() => {
                tracing::debug!(%target, "listing cut short by the hub's end: {e}");
                return false;
            }
            Err(e) => {
                self.warn(target, &format!("cannot list its tools: {e}"))
                    .await;
                return false;
            }
        };
        drop(lease);
        notes.extend(listing.drop_duplicates());
        for note in &notes {
            self.warn(target, note).await;
        }
        let before = lock(&self.cache).get(target).cloned();
        let changed = before.as_ref().is_none_or(|b| !same_items(b, &listing));
        lock(&self.cache).put(target, listing);
        if changed && let Err(c) = self.rebuild() {
            tracing::error!("{c}");
        }
        changed
    }

    /// Says what went wrong with `target`'s listing on stderr and, unless it asked for fewer
    /// messages, to the client, which would otherwise only see items missing.
    async fn warn(&self, target: &Target, note: &str) {
        tracing::warn!(%target, "{note}");
        let level = lock(&self.log_level)
            .as_ref()
            .and_then(|p| p.get("level")?.as_str()?.to_owned().into());
        let rank = |level: &str| LOG_LEVELS.iter().position(|l| *l == level);
        if level.and_then(|l| rank(&l)) > rank("warning") {
            return;
        }
        self.send(line(&json!({
            "jsonrpc": "2.0",
            "method": "notifications/message",
            "params": {"level": "warning", "logger": "mcpmesh-hub", "data": format!("{target}: {note}")},
        })))
        .await;
    }

    async fn announce_lists(&self) {
        if !self.listed.load(Ordering::SeqCst) {
            return;
        }
        for method in [
            "notifications/tools/list_changed",
            "notifications/prompts/list_changed",
            "notifications/resources/list_changed",
        ] {
            self.send(line(&json!({"jsonrpc": "2.0", "method": method})))
                .await;
        }
    }

    /// Rebuilds the merged lists from the cache. On a collision the view keeps serving the
    /// previous names and lists say why until it is resolved.
    fn rebuild(&self) -> Result<(), Collision> {
        let cache = lock(&self.cache);
        let mut tools = Vec::new();
        let mut prompts = Vec::new();
        let mut resources = Vec::new();
        let mut templates = Vec::new();
        for target in &self.targets {
            let Some(listing) = cache.get(target) else {
                continue;
            };
            let item = |v: &Value| {
                v["name"].as_str().map(|name| Item {
                    origin: Origin::new(&target.peer, &target.service, name),
                    target: target.clone(),
                    value: v.clone(),
                })
            };
            tools.extend(listing.tools.iter().filter_map(item));
            prompts.extend(listing.prompts.iter().filter_map(item));
            let presented = |items: &[Value], field: &str| -> Vec<Value> {
                items
                    .iter()
                    .map(|item| {
                        let mut shown = item.clone();
                        present_uri(shown.get_mut(field), target);
                        shown
                    })
                    .collect()
            };
            resources.extend(presented(&listing.resources, "uri"));
            templates.extend(presented(&listing.templates, "uriTemplate"));
        }
        let naming = self.config.naming;
        let named = |items: Vec<Item>| -> Result<(Routes, Vec<(String, Item)>), Collision> {
            let origins: Vec<Origin> = items.iter().map(|i| i.origin.clone()).collect();
            let (routes, names) = Routes::build(&origins, naming)?;
            Ok((routes, names.into_iter().zip(items).collect()))
        };
        drop(cache);
        let built = named(tools).and_then(|t| Ok((t, named(prompts)?)));
        let mut view = lock(&self.view);
        match built {
            Ok(((tool_routes, tools), (prompt_routes, prompts))) => {
                *view = View {
                    tools,
                    tool_routes,
                    prompts,
                    prompt_routes,
                    resources,
                    templates,
                    error: None,
                };
                Ok(())
            }
            Err(c) => {
                view.error = Some(c.to_string());
                Err(c)
            }
        }
    }

    /// One page of a merged list.
    fn list(&self, id: &Value, method: &str, params: &Value) -> Vec<u8> {
        let view = lock(&self.view);
        if let Some(error) = &view.error {
            return rpc_error(id, -32603, error.clone());
        }
        let reach = lock(&self.reach).clone();
        let reachable = |t: &Target| reach.get(&t.peer) != Some(&false);
        let (field, all): (&str, Vec<Value>) = match method {
            "tools/list" => (
                "tools",
                view.tools
                    .iter()
                    .map(|(name, item)| {
                        let mut tool = item.presented(name, reachable(&item.target));
                        tool["inputSchema"] =
                            names::normalize_schema(item.value.get("inputSchema"));
                        tool
                    })
                    .collect(),
            ),
            "prompts/list" => (
                "prompts",
                view.prompts
                    .iter()
                    .map(|(name, item)| item.presented(name, reachable(&item.target)))
                    .collect(),
            ),
            "resources/list" => ("resources", view.resources.clone()),
            _ => ("resourceTemplates", view.templates.clone()),
        };
        match page(field, all, params.get("cursor"), PAGE) {
            Ok(result) => answer(id, result),
            Err(message) => rpc_error(id, -32602, message),
        }
    }

    /// The union of what the services can do, as far as the cache knows; everything the hub
    /// can route while a service is still unknown.
    fn capabilities(&self) -> Value {
        let cache = lock(&self.cache);
        let known: Vec<&Listing> = self.targets.iter().filter_map(|t| cache.get(t)).collect();
        let all_known = known.len() == self.targets.len();
        let any = |cap: &str| !all_known || known.iter().any(|l| l.capabilities.get(cap).is_some());
        let mut caps = Map::new();
        caps.insert("tools".into(), json!({"listChanged": true}));
        if any("prompts") {
            caps.insert("prompts".into(), json!({"listChanged": true}));
        }
        if any("resources") {
            let subscribe = !all_known
                || known
                    .iter()
                    .any(|l| l.capabilities["resources"]["subscribe"] == json!(true));
            caps.insert(
                "resources".into(),
                json!({"listChanged": true, "subscribe": subscribe}),
            );
        }
        // The hub logs too: what it could not list, and why.
        caps.insert("logging".into(), json!({}));
        if any("completions") {
            caps.insert("completions".into(), json!({}));
        }
        Value::Object(caps)
    }

    fn instructions(&self) -> String {
        let list: Vec<String> = self.targets.iter().map(ToString::to_string).collect();
        format!(
            "mcpmesh hub: the tools, prompts and resources of {} through this node ({}). Tool and prompt names say where each lives.",
            if list.is_empty() {
                "no service".to_owned()
            } else {
                format!("{} services", list.len())
            },
            list.join(", "),
        )
    }
}

/// One page of a merged list: `size` items from the cursor on (the cursor is the offset the
/// previous page gave), with `nextCursor` while more follow.
fn page(
    field: &str,
    all: Vec<Value>,
    cursor: Option<&Value>,
    size: usize,
) -> Result<Value, String> {
    let start = match cursor {
        None | Some(Value::Null) => 0,
        Some(Value::String(c)) => match c.parse::<usize>() {
            Ok(n) if n <= all.len() => n,
            _ => return Err(format!("invalid cursor: {c}")),
        },
        Some(other) => return Err(format!("invalid cursor: {other}")),
    };
    let end = start.saturating_add(size).min(all.len());
    let mut result = Map::new();
    let more = end < all.len();
    result.insert(
        field.to_owned(),
        Value::Array(all.into_iter().skip(start).take(end - start).collect()),
    );
    if more {
        result.insert("nextCursor".into(), json!(end.to_string()));
    }
    Ok(Value::Object(result))
}

fn target_of(origin: &Origin) -> Target {
    Target {
        peer: origin.peer.clone(),
        service: origin.service.clone(),
    }
}

fn server_info() -> Value {
    json!({"name": "mcpmesh-hub", "title": "mcpmesh hub", "version": env!("CARGO_PKG_VERSION")})
}

fn open_failed(id: &Value, target: &Target, e: &UpstreamError) -> Vec<u8> {
    match e {
        UpstreamError::Open { code, message } if *code < -32000 && *code > -32100 => {
            rpc_error(id, *code, format!("{target}: {message}"))
        }
        other => mesh_error(
            id,
            ErrorCode::Unreachable,
            format!("{target}: cannot open a session: {other}"),
        ),
    }
}

/// Puts `target` in front of a mesh error's message (one a node made, not the server: a
/// session lost mid-call, say), so the client of many services knows which one failed.
fn name_the_service(frame: &mut Value, target: &Target) {
    let Some(error) = frame.get_mut("error").and_then(Value::as_object_mut) else {
        return;
    };
    if error.get("data").and_then(|d| d.get("source")) != Some(&json!("mcpmesh")) {
        return;
    }
    let message = error
        .get("message")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let named = format!("{target}: {message}");
    error.insert("message".into(), json!(named));
}

/// Whether `id` is one MCP allows a request: a string or an integer.
fn valid_id(id: &Value) -> bool {
    serde_json::value::to_raw_value(id).is_ok_and(|raw| mcpmesh_net::jsonrpc::valid_id(&raw))
}

/// Puts `target`'s place in front of a URI (or URI template) it named, as the hub presents it.
fn present_uri(uri: Option<&mut Value>, target: &Target) {
    if let Some(uri) = uri
        && let Some(own) = uri.as_str()
    {
        *uri = json!(names::wrap_uri(&target.peer, &target.service, own));
    }
}

/// Presents every URI `target` named in its answer to `method`: the contents a read returns,
/// and the resource links and embedded resources of a call's or a prompt's content, so that
/// reading any of them goes back to `target`.
fn present_uris(method: &str, frame: &mut Value, target: &Target) {
    let Some(result) = frame.get_mut("result") else {
        return;
    };
    let content = |item: &mut Value| {
        let kind = item.get("type").and_then(Value::as_str).map(str::to_owned);
        match kind.as_deref() {
            Some("resource_link") => present_uri(item.get_mut("uri"), target),
            Some("resource") => {
                present_uri(
                    item.get_mut("resource").and_then(|r| r.get_mut("uri")),
                    target,
                );
            }
            _ => {}
        }
    };
    fn items(list: Option<&mut Value>) -> impl Iterator<Item = &mut Value> {
        list.and_then(Value::as_array_mut).into_iter().flatten()
    }
    match method {
        "resources/read" => {
            items(result.get_mut("contents")).for_each(|c| present_uri(c.get_mut("uri"), target))
        }
        "tools/call" => items(result.get_mut("content")).for_each(content),
        "prompts/get" => items(result.get_mut("messages"))
            .filter_map(|m| m.get_mut("content"))
            .for_each(content),
        _ => {}
    }
}

/// Whether two listings offer the same items (times aside).
fn same_items(a: &Listing, b: &Listing) -> bool {
    a.tools == b.tools
        && a.prompts == b.prompts
        && a.resources == b.resources
        && a.templates == b.templates
        && a.capabilities == b.capabilities
}

/// Everything one server lists, each list read to its end (within bounds), and what of it
/// could not be listed, and why.
async fn list_all(up: &Upstream) -> Result<(Listing, Vec<String>), UpstreamError> {
    let caps = up.capabilities();
    let mut listing = Listing {
        fetched_at_ms: cache::now_ms(),
        capabilities: caps.clone(),
        ..Listing::default()
    };
    let mut notes = Vec::new();
    if caps.get("tools").is_some() {
        let (tools, ttl) = pages(up, "tools/list", "tools", &mut notes).await?;
        listing.tools = tools;
        listing.ttl_ms = ttl;
    }
    if caps.get("prompts").is_some() {
        listing.prompts = pages(up, "prompts/list", "prompts", &mut notes).await?.0;
    }
    if caps.get("resources").is_some() {
        listing.resources = pages(up, "resources/list", "resources", &mut notes)
            .await?
            .0;
        let templates = "resourceTemplates";
        listing.templates = pages(up, "resources/templates/list", templates, &mut notes)
            .await?
            .0;
    }
    Ok((listing, notes))
}

/// One list, page by page; the items and the first page's `ttlMs`. Whatever cuts the list
/// short is noted in `notes`, except a server saying it has no such list.
async fn pages(
    up: &Upstream,
    method: &str,
    field: &str,
    notes: &mut Vec<String>,
) -> Result<(Vec<Value>, Option<u64>), UpstreamError> {
    let mut items = Vec::new();
    let mut cursor: Option<Value> = None;
    let mut ttl = None;
    for page in 0..MAX_PAGES {
        let params = match &cursor {
            Some(c) => json!({"cursor": c}),
            None => Value::Null,
        };
        let frame = up.request(method, params).await?;
        let Some(result) = frame.get("result") else {
            let error = frame.get("error");
            let code = error.and_then(|e| e.get("code")).and_then(Value::as_i64);
            if code != Some(-32601) {
                let message = error
                    .and_then(|e| e.get("message"))
                    .and_then(Value::as_str)
                    .unwrap_or("an answer without a result");
                let code = code.map_or_else(|| "no code".to_owned(), |c| c.to_string());
                notes.push(format!(
                    "its {method} failed, so its {field} are not all listed: {message} ({code})"
                ));
            }
            return Ok((items, ttl));
        };
        if page == 0 {
            ttl = result.get("ttlMs").and_then(Value::as_u64);
        }
        let Some(listed) = result.get(field).and_then(Value::as_array) else {
            notes.push(format!(
                "its {method} answer holds no {field} list, so its {field} are not all listed"
            ));
            return Ok((items, ttl));
        };
        for item in listed {
            if items.len() == MAX_ITEMS {
                notes.push(format!(
                    "it lists more than {MAX_ITEMS} {field}; the rest are left out"
                ));
                return Ok((items, ttl));
            }
            items.push(item.clone());
        }
        match result.get("nextCursor") {
            Some(c) if !c.is_null() => cursor = Some(c.clone()),
            _ => return Ok((items, ttl)),
        }
    }
    notes.push(format!(
        "its {method} runs past {MAX_PAGES} pages; the rest are left out"
    ));
    Ok((items, ttl))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merged_lists_are_paged_by_offset_to_their_end_and_bad_cursors_are_refused() {
        let all: Vec<Value> = (0..250)
            .map(|i| json!({ "name": format!("t{i}") }))
            .collect();
        let mut cursor: Option<Value> = None;
        let mut seen = Vec::new();
        let mut pages = 0;
        loop {
            let result = page("tools", all.clone(), cursor.as_ref(), 100).unwrap();
            pages += 1;
            seen.extend(result["tools"].as_array().unwrap().iter().cloned());
            match result.get("nextCursor") {
                Some(next) => cursor = Some(next.clone()),
                None => break,
            }
        }
        assert_eq!((pages, seen), (3, all.clone()));
        // An exact multiple ends without a cursor to an empty page.
        let exact = page("tools", all[..100].to_vec(), None, 100).unwrap();
        assert!(exact.get("nextCursor").is_none(), "{exact}");
        for bad in [json!("x"), json!("251"), json!(7), json!("-1")] {
            assert!(
                page("tools", all.clone(), Some(&bad), 100).is_err(),
                "{bad}"
            );
        }
        let empty = page("prompts", Vec::new(), None, 100).unwrap();
        assert_eq!(empty, json!({ "prompts": [] }));
    }

    #[test]
    fn a_mesh_error_names_its_service_and_a_servers_own_error_is_left_alone() {
        let target = Target::parse("alice/notes").unwrap();
        let mut lost = json!({"jsonrpc": "2.0", "id": 1, "error": {"code": -32055,
            "message": "the service ended the session before answering", "data": {"source": "mcpmesh"}}});
        name_the_service(&mut lost, &target);
        assert_eq!(
            lost["error"]["message"],
            "alice/notes: the service ended the session before answering"
        );
        for frame in [
            json!({"jsonrpc": "2.0", "id": 1, "error": {"code": -32602, "message": "bad"}}),
            json!({"jsonrpc": "2.0", "id": 1, "result": {}}),
            json!({"jsonrpc": "2.0", "id": 1, "error": "not an object"}),
        ] {
            let mut same = frame.clone();
            name_the_service(&mut same, &target);
            assert_eq!(same, frame);
        }
    }

    #[test]
    fn the_mountable_services_and_reachability_come_from_the_nodes_peer_list() {
        let peers = json!({"peers": [
            {"name": "alice", "mounts": ["notes", "files"], "reachable": true},
            {"name": "bob", "mounts": [], "reachable": false},
            {"name": "carol"},
        ]});
        let targets: Vec<String> = mountable(&peers).iter().map(ToString::to_string).collect();
        assert_eq!(targets, ["alice/notes", "alice/files"]);
        let reach = reachability(&peers);
        assert_eq!(reach.get("alice"), Some(&true));
        assert_eq!(reach.get("bob"), Some(&false));
        assert_eq!(reach.get("carol"), None);
    }
}
