//! The hub as its client sees it: one MCP server whose lists merge every service's, answered
//! from the cache, and whose calls go to the right service's session, opened on first use.
//!
//! Ids never cross unchanged: a client request forwarded upstream gets the session's own id
//! (and its progress token one of the hub's), and a server's request to the client gets a hub
//! id; answers, progress and cancellations are mapped back on the way. A progress notification
//! or answer that names nothing the hub sent that session is dropped, so one service cannot
//! speak for another.
//!
//! - `view`: what the client is shown (the merged lists, and URIs under their service's place).
//! - `listing`: each service's listing fetched into the cache, and what it leaves out said.
//! - `routing`: requests and answers between the client and the services, ids mapped.
//! - `skills`: the Skills extension's entries and answers presented under their service.
//! - `wire`: lines to the client and the hub's own answers.

mod bridge;
mod call;
mod listen;
mod listing;
mod plain;
mod routing;
mod skills;
mod tasks;
mod uris;
mod view;
mod wire;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use bytes::Bytes;

use mcpmesh_net::errors::{ErrorCode, ErrorFrame};
use mcpmesh_net::transport::{FrameReader, MAX_FRAME, TransportError};
use serde_json::{Map, Value, json};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use self::plain::PlainCall;
use self::view::View;
use self::wire::{answer, line, lock, rpc_error, valid_id};
use super::cache::{Cache, Listing};
use super::era::{self, Envelope, Era};
use super::outlet::write_out;
use super::pool::Pool;
use super::upstream::{Hello, Inbound, NodeAccess, Upstream, UpstreamError};
use super::{HubConfig, HubError, Target};

/// How often the node is asked which peers are reachable.
const REACH_EVERY: Duration = Duration::from_secs(3);
/// Following the catalog, how old the node's answers from peers may be: a service that
/// appears or goes shows in the lists within about this plus [`REACH_EVERY`] (and the time to
/// list it).
const CATALOG_MAX_AGE: Duration = Duration::from_secs(4);
/// When the node is asking its peers again behind its answer, how long until the hub reads
/// the fresh answers, rather than at its next round.
const CATALOG_FRESH_AFTER: Duration = Duration::from_secs(1);
/// After the client's input ends, how long the answers it is still owed may take (a first
/// listing, a slow call)...
const OWED: Duration = Duration::from_secs(30);
/// ...and then what else is on its way (a listen stream the client can no longer end).
const DRAIN: Duration = Duration::from_secs(2);
/// Lines queued toward the client before senders wait.
const OUT_QUEUE: usize = 256;
/// How long a greeting waits for the first listings of services the cache does not know.
const GREETING_WAIT: Duration = Duration::from_secs(3);
/// Where the hub's greeting names each service's own `serverInfo`.
const SERVICES: &str = "mcpmesh/services";
/// Bytes of one service's own instructions the hub passes on, at most...
const SERVICE_INSTRUCTIONS: usize = 2048;
/// ...and of its whole instructions.
const ALL_INSTRUCTIONS: usize = 16 * 1024;

pub(super) struct Hub {
    config: HubConfig,
    node: NodeAccess,
    /// The services presented, and whether their peers are in reach.
    presented: StdMutex<Presented>,
    /// Whether the services presented follow the node's catalog (no services named).
    follow: bool,
    out: mpsc::Sender<Vec<u8>>,
    inbound: mpsc::Sender<Inbound>,
    pool: Pool,
    cache: StdMutex<Cache>,
    /// Held while the cache is written out ([`listing`]'s `cache_put`).
    cache_writes: tokio::sync::Mutex<()>,
    view: StdMutex<View>,
    /// What the hub knows of its client: its era, envelope, `initialize` params, log level.
    client: StdMutex<Client>,
    /// A stateless client's `subscriptions/listen` streams, by request id (as JSON text).
    listens: StdMutex<HashMap<String, listen::Listen>>,
    /// Calls held for a stateless client's retry (bridged), and the key of their states.
    bridge: Arc<StdMutex<bridge::Bridge>>,
    /// The client's requests under way: where each went, and their progress tokens.
    requests: StdMutex<routing::Requests>,
    /// Requests made of the client (a server's, or the hub's own), waiting for its answer.
    asks: StdMutex<routing::Asks>,
    /// Presented task id → a lease on the session the task lives in, until the task ends or
    /// its lifetime passes: a session holding a task the client may still ask for is not idle.
    task_leases: Arc<StdMutex<HashMap<String, super::pool::Lease>>>,
    /// The listings being fetched now.
    fetching: StdMutex<listing::Fetching>,
    /// First listings still being fetched.
    first_fetches: watch::Sender<usize>,
    /// Whether the client was given a list yet (until then, a new listing is not news).
    listed: AtomicBool,
    /// Warnings for a handshake-era client made before its `initialize` was answered (the
    /// greeting may wait for the first listings): sent once it is.
    early_warnings: tokio::sync::Mutex<Option<Vec<Vec<u8>>>>,
    next: AtomicU64,
    tasks: TaskTracker,
    /// Requests of the client not answered yet, listen streams aside.
    owed: Arc<OwedCount>,
    stop: CancellationToken,
    /// Cancelled when the client's input ends (what is on its way gets [`DRAIN`] then).
    input_ended: CancellationToken,
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
    let (targets, tool_counts) = presented(&node, &config).await?;
    let (hub, out_rx, inbound_rx) = Hub::new(config, node, &peers, targets, tool_counts);
    let hub = Arc::new(hub);
    // Two items sharing a name is an error at start, before the client sees anything.
    hub.rebuild()
        .map_err(|c| HubError::Collision(c.to_string()))?;

    let writer = tokio::spawn(write_out(out_rx, output, hub.stop.clone()));
    tokio::spawn(hub.clone().from_servers(inbound_rx));
    tokio::spawn(hub.clone().watch_reach());

    hub.read_client(input).await;
    // Answers still on their way get a moment; then every session is closed.
    hub.input_ended.cancel();
    hub.tasks.close();
    let _ = tokio::time::timeout(OWED, hub.owed.none_left()).await;
    let _ = tokio::time::timeout(DRAIN, hub.tasks.wait()).await;
    hub.stop.cancel();
    lock(&hub.task_leases).clear();
    hub.pool.close_all().await;
    let _ = writer.await;
    Ok(())
}

/// The services the hub presents: those named on the command line, else every one in the
/// node's catalog, with the tool count the catalog gave each.
async fn presented(
    node: &NodeAccess,
    config: &HubConfig,
) -> Result<(Vec<Target>, HashMap<Target, Option<u64>>), HubError> {
    if !config.targets.is_empty() {
        return Ok((config.targets.clone(), HashMap::new()));
    }
    let catalog = node
        .call(crate::control::methods::SERVICES_LIST, json!({}))
        .await
        .map_err(|e| HubError::Node(e.to_string()))?;
    Ok(catalog_targets(&catalog))
}

/// Every `peer/service` the node may mount, from its `services.list` answer (its peers'
/// catalogs), with the tool count each catalog gave.
fn catalog_targets(catalog: &Value) -> (Vec<Target>, HashMap<Target, Option<u64>>) {
    let mut targets = Vec::new();
    let mut counts = HashMap::new();
    for e in catalog["services"].as_array().into_iter().flatten() {
        let (Some(peer), Some(service)) = (e["peer"].as_str(), e["service"].as_str()) else {
            continue;
        };
        let target = Target {
            peer: peer.to_owned(),
            service: service.to_owned(),
        };
        counts.insert(target.clone(), e["tools"].as_u64());
        targets.push(target);
    }
    (targets, counts)
}

/// The services the hub presents.
struct Presented {
    /// Those named on the command line, or the node's catalog.
    targets: Vec<Target>,
    /// Following the catalog: the tool count it last gave each service, to notice a service
    /// whose tools changed while the hub had no session to it.
    tool_counts: HashMap<Target, Option<u64>>,
    /// Peer name → whether the node reached it at its last check.
    reach: HashMap<String, bool>,
}

/// What the hub knows of its client.
#[derive(Debug, Default)]
struct Client {
    /// The era the client speaks (set by its first `initialize`, `server/discover` or
    /// stateless request) and, stateless, the envelope of its latest request.
    era: Option<Era>,
    envelope: Option<Envelope>,
    /// A handshake-era client's `initialize` params, for the sessions the hub opens for it.
    hello: Option<Value>,
    /// The log level the client set, which sessions opened later follow.
    log_level: Option<Value>,
}

fn reachability(peers: &Value) -> HashMap<String, bool> {
    peers["peers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| Some((p["name"].as_str()?.to_owned(), p["reachable"].as_bool()?)))
        .collect()
}

impl Hub {
    /// A hub presenting `targets` (following the node's catalog when none were named), with
    /// the receiving ends of its queues toward the client and from the servers.
    fn new(
        config: HubConfig,
        node: NodeAccess,
        peers: &Value,
        targets: Vec<Target>,
        tool_counts: HashMap<Target, Option<u64>>,
    ) -> (Hub, mpsc::Receiver<Vec<u8>>, mpsc::Receiver<Inbound>) {
        let cache = Cache::load(Cache::path_in(&config.profile.state_dir));
        let (out, out_rx) = mpsc::channel::<Vec<u8>>(OUT_QUEUE);
        let (inbound, inbound_rx) = mpsc::channel::<Inbound>(OUT_QUEUE);
        let hub = Hub {
            pool: Pool::new(config.idle),
            node,
            presented: StdMutex::new(Presented {
                targets,
                tool_counts,
                reach: reachability(peers),
            }),
            follow: config.targets.is_empty(),
            out,
            inbound,
            cache: StdMutex::new(cache),
            cache_writes: tokio::sync::Mutex::new(()),
            view: StdMutex::new(View::default()),
            client: StdMutex::new(Client::default()),
            listens: StdMutex::new(HashMap::new()),
            bridge: Arc::new(StdMutex::new(bridge::Bridge::new())),
            requests: StdMutex::default(),
            asks: StdMutex::default(),
            task_leases: Arc::new(StdMutex::new(HashMap::new())),
            fetching: StdMutex::default(),
            first_fetches: watch::channel(0).0,
            listed: AtomicBool::new(false),
            early_warnings: tokio::sync::Mutex::new(Some(Vec::new())),
            next: AtomicU64::new(1),
            tasks: TaskTracker::new(),
            owed: Arc::default(),
            stop: CancellationToken::new(),
            input_ended: CancellationToken::new(),
            config,
        };
        (hub, out_rx, inbound_rx)
    }

    /// Takes the client's frames until its input ends (or fails) or the hub stops.
    async fn read_client<R: AsyncRead + Unpin>(self: &Arc<Self>, input: R) {
        let mut frames = FrameReader::new(input, MAX_FRAME);
        loop {
            let line = tokio::select! {
                line = frames.next_line() => line,
                _ = self.stop.cancelled() => break,
            };
            match line {
                Ok(Some(line)) => self.clone().client_frame(&line).await,
                Ok(None) => break,
                Err(TransportError::FrameTooLarge(_)) => {
                    self.send(ErrorFrame::new(ErrorCode::FrameTooLarge).to_line())
                        .await;
                }
                Err(e) => {
                    tracing::debug!("the client's input failed: {e}");
                    break;
                }
            }
        }
    }

    async fn send(&self, line: Vec<u8>) {
        if !line.is_empty() {
            let _ = self.out.send(line).await;
        }
    }

    /// One frame from the client.
    async fn client_frame(self: Arc<Self>, line: &Bytes) {
        // A call with nothing in it to map but its id, name and progress token goes without a
        // tree (a stateless client's never: its envelope is the hub's to check).
        if !self.client_era_is(Era::Stateless)
            && let Some(call) = PlainCall::read(line)
        {
            let (hub, owed) = (self.clone(), Owed::new(&self.owed));
            self.tasks.spawn(async move {
                hub.plain_call(call).await;
                drop(owed);
            });
            return;
        }
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
                // A listen stream is never answered: the client ends it.
                let owed = (method != "subscriptions/listen").then(|| Owed::new(&self.owed));
                self.tasks.spawn(async move {
                    hub.request(id, &method, frame).await;
                    drop(owed);
                });
            }
            (Some(method), None) => self.client_notification(&method, frame).await,
            (None, Some(id)) => self.client_answer(&id, frame).await,
            (None, None) => {}
        }
    }

    pub(super) async fn request(self: Arc<Self>, id: Value, method: &str, mut frame: Value) {
        // Taken, not copied: an 8 MiB request is not held twice.
        let params = frame.get_mut("params").map_or(Value::Null, Value::take);
        if let Err(refusal) = self.client_era(method, &params) {
            self.send(refusal_line(&id, refusal)).await;
            return;
        }
        let stateless = self.client_era_is(Era::Stateless);
        let reply = match method {
            "initialize" => self.initialize(&id, &params).await,
            "server/discover" => self.discover(&id, method).await,
            "subscriptions/listen" if stateless => {
                self.listen(&id, &params).await;
                return;
            }
            "ping" => self.typed_answer(&id, method, json!({})),
            // The Skills extension is a 2026-07-28 one: offered to stateless clients.
            "tools/list"
            | "prompts/list"
            | "resources/list"
            | "resources/templates/list"
            | "skills/list"
                if method != "skills/list" || stateless =>
            {
                self.clone().first_listings();
                self.wait_for_first_listings().await;
                self.refresh_stale();
                self.listed.store(true, Ordering::SeqCst);
                self.list(&id, method, &params)
            }
            "logging/setLevel" => self.set_log_level(&id, method, &params).await,
            "tools/call" | "prompts/get" | "resources/read"
                if stateless && bridge::is_retry(&params) =>
            {
                self.resume(&id, method, &params).await
            }
            "tools/call"
            | "prompts/get"
            | "resources/read"
            | "resources/subscribe"
            | "resources/unsubscribe"
            | "completion/complete" => self.route(&id, method, params).await,
            "skills/get" | "resources/directory/read" if stateless => {
                self.route(&id, method, params).await
            }
            // Each revision's task methods: 2025-11-25's, and the 2026-07-28 tasks extension's.
            "tasks/get" | "tasks/result" | "tasks/cancel" | "tasks/update"
                if tasks::routed_in(method, stateless) =>
            {
                match self.task_destination(params) {
                    Ok((target, params)) => self.forward(&id, target, method, params).await,
                    Err(message) => rpc_error(&id, -32602, message),
                }
            }
            "tasks/list" if !stateless => self.list_tasks(&id).await,
            other => rpc_error(&id, -32601, format!("method not found: {other}")),
        };
        if method == "initialize" {
            self.send_greeting(reply).await;
            return;
        }
        self.send(reply).await;
    }

    /// Answers a handshake-era client's `initialize` (once the first listings came, or
    /// [`GREETING_WAIT`] passed), in the protocol version it asked for when the hub speaks it.
    async fn initialize(self: &Arc<Self>, id: &Value, params: &Value) -> Vec<u8> {
        lock(&self.client).hello = Some(params.clone());
        self.clone().first_listings();
        self.greeting_wait().await;
        let asked = params["protocolVersion"].as_str().unwrap_or_default();
        let version = era::HANDSHAKE
            .iter()
            .find(|v| **v == asked)
            .copied()
            .unwrap_or(era::HANDSHAKE[0]);
        answer(
            id,
            json!({
                "protocolVersion": version,
                "capabilities": self.capabilities(),
                "serverInfo": server_info(),
                "instructions": self.instructions(),
                "_meta": { SERVICES: self.services_info() },
            }),
        )
    }

    /// Answers a stateless client's `server/discover`, like [`Hub::initialize`] its greeting.
    async fn discover(self: &Arc<Self>, id: &Value, method: &str) -> Vec<u8> {
        self.clone().first_listings();
        self.greeting_wait().await;
        let mut versions = vec![era::STATELESS];
        versions.extend(era::HANDSHAKE);
        self.typed_answer(
            id,
            method,
            json!({
                "supportedVersions": versions,
                "capabilities": self.capabilities(),
                "instructions": self.instructions(),
                "_meta": { SERVICES: self.services_info() },
            }),
        )
    }

    /// Keeps the client's log level (sessions opened later and the hub's own warnings follow
    /// it) and passes it to every live handshake-era session whose server logs.
    async fn set_log_level(&self, id: &Value, method: &str, params: &Value) -> Vec<u8> {
        lock(&self.client).log_level = Some(params.clone());
        for up in self.pool.all_live().await {
            if up.era() == Era::Handshake && up.capabilities().get("logging").is_some() {
                let _ = up.start("logging/setLevel", params.clone()).await;
            }
        }
        self.typed_answer(id, method, json!({}))
    }

    /// Sends the answer to `initialize` with the warnings held until it went.
    async fn send_greeting(&self, reply: Vec<u8>) {
        // The warnings held go out in the same write as the answer, so nothing the client
        // asks after reading it (a list, answered at once) can come before them.
        let mut early = self.early_warnings.lock().await;
        let mut reply = reply;
        for warning in early.take().into_iter().flatten() {
            reply.extend(warning);
        }
        self.send(reply).await;
    }

    /// Sends a request that names what it is for (a tool, a prompt, a URI) to the service
    /// behind that name, and gives the line that answers it.
    async fn route(self: &Arc<Self>, id: &Value, method: &str, mut params: Value) -> Vec<u8> {
        let mut routed = self.destination_in(method, &mut params);
        if routed.is_err() {
            // A name the cache does not know yet may be in a listing on its way.
            self.clone().first_listings();
            self.wait_for_first_listings().await;
            routed = self.destination_in(method, &mut params);
        }
        match routed {
            Ok(target) => self.forward(id, target, method, params).await,
            Err(message) => rpc_error(id, -32602, message),
        }
    }

    /// Learns or checks the client's era from a request: `initialize` says the handshake era,
    /// `server/discover` or an envelope the stateless one; once said, the other era's greeting
    /// is refused as the unsupported version it is there, and a stateless client's request
    /// must carry a valid envelope.
    fn client_era(&self, method: &str, params: &Value) -> Result<(), era::Refusal> {
        let envelope = Envelope::of(params).transpose()?;
        let mut client = lock(&self.client);
        let said = match (method, &envelope) {
            ("initialize", _) => Some(Era::Handshake),
            ("server/discover", _) | (_, Some(_)) => Some(Era::Stateless),
            _ => None,
        };
        match (client.era, said) {
            (Some(Era::Stateless), Some(Era::Handshake)) => {
                return Err(era::Refusal::Version(params["protocolVersion"].clone()));
            }
            (Some(Era::Handshake), Some(Era::Stateless)) => {
                return Err(era::Refusal::Handshaken);
            }
            (Some(Era::Stateless), None) => {
                return Err(era::Refusal::Missing(era::META_VERSION));
            }
            (None, Some(said)) => client.era = Some(said),
            _ => {}
        }
        if envelope.is_some() {
            client.envelope = envelope;
        }
        Ok(())
    }

    fn client_era_is(&self, era: Era) -> bool {
        lock(&self.client).era == Some(era)
    }

    /// An answer the hub makes itself, typed for a stateless client.
    fn typed_answer(&self, id: &Value, method: &str, mut result: Value) -> Vec<u8> {
        if self.client_era_is(Era::Stateless) {
            era::typed(method, &mut result, &server_info());
        } else if method == "server/discover" {
            result["serverInfo"] = server_info();
        }
        answer(id, result)
    }

    async fn lease(&self, target: &Target) -> Result<super::pool::Lease, UpstreamError> {
        self.pool.lease(target, || self.open(target)).await
    }

    /// Opens `target`'s session in its server's era: with the client's own `initialize`
    /// params, or a stateless client's envelope.
    async fn open(&self, target: &Target) -> Result<Arc<Upstream>, UpstreamError> {
        let known = lock(&self.cache).get(target).and_then(|l| l.era);
        let stateless = self.stateless_envelope();
        let handshake = self.upstream_hello();
        let fallback = stateless.is_none().then(|| Envelope {
            client_info: handshake["clientInfo"].clone(),
            capabilities: handshake["capabilities"].clone(),
        });
        let hello = Hello {
            handshake,
            stateless,
            known,
            fallback,
        };
        let up = Upstream::open(&self.node, target, hello, self.inbound.clone()).await?;
        let level = lock(&self.client).log_level.clone();
        if let Some(level) = level
            && up.era() == Era::Handshake
            && up.capabilities().get("logging").is_some()
        {
            let _ = up.start("logging/setLevel", level).await;
        }
        Ok(up)
    }

    /// A stateless client's envelope (the hub's own until its first request), for sessions
    /// to servers of that era; `None` for a client of the handshake era.
    fn stateless_envelope(&self) -> Option<Envelope> {
        let client = lock(&self.client);
        (client.era == Some(Era::Stateless))
            .then(|| client.envelope.clone().unwrap_or_else(Envelope::hub))
    }

    /// The `initialize` params of a session to a handshake-era server: the client's own; for
    /// a stateless client, its name and the capabilities its envelope gives (what the server
    /// asks during a call reaches it through the bridge).
    fn upstream_hello(&self) -> Value {
        if let Some(envelope) = self.stateless_envelope() {
            return json!({
                "protocolVersion": era::HANDSHAKE[0],
                "capabilities": envelope.capabilities,
                "clientInfo": envelope.client_info,
            });
        }
        let given = lock(&self.client).hello.clone().unwrap_or(Value::Null);
        let version = given["protocolVersion"]
            .as_str()
            .filter(|v| era::HANDSHAKE.contains(v))
            .unwrap_or(era::HANDSHAKE[0]);
        json!({
            "protocolVersion": version,
            "capabilities": given.get("capabilities").cloned().unwrap_or(json!({})),
            "clientInfo": given
                .get("clientInfo")
                .cloned()
                .unwrap_or_else(|| json!({"name": "mcpmesh-hub", "version": env!("CARGO_PKG_VERSION")})),
        })
    }

    /// Asks the node every few seconds which peers it reaches (and, following the catalog,
    /// what they offer); a change of a peer's state changes its tools' descriptions, a service
    /// that appears or goes changes the lists, and the client is told.
    async fn watch_reach(self: Arc<Self>) {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(REACH_EVERY) => {}
                _ = self.stop.cancelled() => return,
            }
            if self.follow && self.clone().follow_catalog().await {
                let hub = self.clone();
                tokio::spawn(async move {
                    tokio::select! {
                        _ = tokio::time::sleep(CATALOG_FRESH_AFTER) => {
                            hub.follow_catalog().await;
                        }
                        _ = hub.stop.cancelled() => {}
                    }
                });
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
                let mut presented = lock(&self.presented);
                let changed = presented
                    .targets
                    .iter()
                    .any(|t| presented.reach.get(&t.peer) != now.get(&t.peer));
                presented.reach = now;
                changed
            };
            if changed && lock(&self.client).hello.is_some() {
                // A peer back in reach may have services still to list.
                self.clone().first_listings();
                self.list_changed("notifications/tools/list_changed").await;
            }
        }
    }

    /// Reads the node's catalog again (its answers at most [`CATALOG_MAX_AGE`] old): services
    /// that appeared are listed, services gone leave the lists, and a service whose tool
    /// count changed is listed again; the client is told what changed. Returns whether the
    /// node is asking its peers again behind that answer.
    async fn follow_catalog(self: Arc<Self>) -> bool {
        let Some(catalog) = self
            .node
            .call_running(
                crate::control::methods::SERVICES_LIST,
                json!({ "max_age_ms": CATALOG_MAX_AGE.as_millis() as u64 }),
            )
            .await
        else {
            return false;
        };
        let refreshing = catalog["refreshing"] == json!(true);
        let (now, counts) = catalog_targets(&catalog);
        let (set_changed, relist) = {
            let mut presented = lock(&self.presented);
            let set_changed = presented.targets != now;
            let known = &presented.tool_counts;
            let relist: Vec<Target> = counts
                .iter()
                .filter(|(t, n)| n.is_some() && known.get(*t).is_some_and(|was| was != *n))
                .map(|(t, _)| t.clone())
                .collect();
            presented.targets = now;
            presented.tool_counts = counts;
            (set_changed, relist)
        };
        for target in relist {
            self.clone()
                .changed_upstream(target, "notifications/tools/list_changed".to_owned());
        }
        if set_changed {
            if let Err(c) = self.rebuild() {
                tracing::error!("{c}");
            }
            self.clone().first_listings();
            self.announce_lists().await;
        }
        refreshing
    }

    /// Whether `target`'s peer was in reach at the node's last check (or was never checked).
    pub(super) fn in_reach(&self, target: &Target) -> bool {
        lock(&self.presented).reach.get(&target.peer) != Some(&false)
    }

    /// The services presented now.
    pub(super) fn targets(&self) -> Vec<Target> {
        lock(&self.presented).targets.clone()
    }

    /// The union of what the services can do, as far as the cache knows; everything the hub
    /// can route while a service is still unknown.
    fn capabilities(&self) -> Value {
        let cache = lock(&self.cache);
        let targets = self.targets();
        let known: Vec<&Listing> = targets.iter().filter_map(|t| cache.get(t)).collect();
        let all_known = known.len() == targets.len();
        let any = |cap: &str| !all_known || known.iter().any(|l| l.capabilities.get(cap).is_some());
        // A stateless client takes notifications only on its `subscriptions/listen` streams,
        // which carry list changes and resource updates: no log messages.
        let stateless = self.client_era_is(Era::Stateless);
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
        if !stateless {
            caps.insert("logging".into(), json!({}));
        }
        if any("completions") {
            caps.insert("completions".into(), json!({}));
        }
        // Skills as the services offer them (while one is unknown, as it may), to a stateless
        // client (the extension's revision); directory reads likewise (a URI of a service
        // that reads none goes to it all the same, and it answers as it does).
        let offered =
            |has: fn(&Value) -> bool| !all_known || known.iter().any(|l| has(&l.capabilities));
        let mut extensions = Map::new();
        if stateless && offered(skills::declared) {
            let directories = offered(skills::reads_directories);
            let mut setting = Map::new();
            if directories {
                setting.insert("directoryRead".into(), json!(true));
            }
            extensions.insert(skills::EXTENSION.into(), Value::Object(setting));
        }
        // The tasks extension likewise, to a stateless client: its task ids are presented
        // and routed as the 2025 revision's are.
        if stateless && offered(tasks::extension_declared) {
            extensions.insert(tasks::EXTENSION.into(), json!({}));
        }
        if !extensions.is_empty() {
            caps.insert("extensions".into(), Value::Object(extensions));
        }
        // Tasks as the services that are known offer them (a task call to another runs
        // plainly); not to a stateless client, whose revision makes tasks an extension.
        let offer = |has: &dyn Fn(&Value) -> bool| known.iter().any(|l| has(&l.capabilities));
        if !stateless && offer(&|c| c.get("tasks").is_some()) {
            let mut tasks = Map::new();
            if offer(&|c| c["tasks"]["list"].is_object()) {
                tasks.insert("list".into(), json!({}));
            }
            if offer(&|c| c["tasks"]["cancel"].is_object()) {
                tasks.insert("cancel".into(), json!({}));
            }
            if offer(&tasks::offers_task_calls) {
                tasks.insert("requests".into(), json!({"tools": {"call": {}}}));
            }
            caps.insert("tasks".into(), Value::Object(tasks));
        }
        Value::Object(caps)
    }

    /// Before the greeting is answered: while the cache does not know every service, a
    /// moment for the first listings, which bring the services' own instructions and who
    /// they are (a warm cache answers at once, without a session).
    async fn greeting_wait(&self) {
        let unknown = {
            let cache = lock(&self.cache);
            self.targets().iter().any(|t| cache.get(t).is_none())
        };
        // A client whose input ended gets its answers within the drain: no more waiting then.
        if unknown {
            tokio::select! {
                _ = tokio::time::timeout(GREETING_WAIT, self.wait_for_first_listings()) => {}
                _ = self.input_ended.cancelled() => {}
            }
        }
    }

    /// Who each service the cache knows says it is, by `PEER/SERVICE`: the `serverInfo` each
    /// gave, which the hub's own `serverInfo` stands in front of.
    fn services_info(&self) -> Value {
        let cache = lock(&self.cache);
        let mut services = Map::new();
        for target in self.targets() {
            if let Some(info) = cache.get(&target).and_then(|l| l.server_info.clone()) {
                services.insert(target.to_string(), info);
            }
        }
        Value::Object(services)
    }

    /// The hub's instructions: what it presents, then each service's own instructions under
    /// its `PEER/SERVICE` heading, as the listing cache knows them (a service not listed yet
    /// has none here), each cut to [`SERVICE_INSTRUCTIONS`] bytes and all to
    /// [`ALL_INSTRUCTIONS`].
    fn instructions(&self) -> String {
        let targets = self.targets();
        let list: Vec<String> = targets.iter().map(ToString::to_string).collect();
        let mut text = format!(
            "mcpmesh hub: the tools, prompts and resources of {} through this node ({}). Tool and prompt names say where each lives.",
            if list.is_empty() {
                "no service".to_owned()
            } else {
                format!("{} services", list.len())
            },
            list.join(", "),
        );
        let cache = lock(&self.cache);
        for target in &targets {
            let own = cache
                .get(target)
                .and_then(|l| l.instructions.as_deref())
                .map(str::trim)
                .filter(|own| !own.is_empty());
            let Some(own) = own else { continue };
            let section = format!("\n\n## {target}\n{}", cut(own, SERVICE_INSTRUCTIONS));
            if text.len() + section.len() > ALL_INSTRUCTIONS {
                text.push_str(
                    "\n\n(the other services' instructions are left out: too long together)",
                );
                break;
            }
            text.push_str(&section);
        }
        text
    }
}

/// `text` cut to at most `max` bytes at a character boundary, ending in "…" when cut.
fn cut(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max.saturating_sub('…'.len_utf8());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// How many requests the client is owed answers to. Counted with an atomic, and told only when
/// the count reaches zero: a `watch` channel woke its receivers' notifiers on every request.
#[derive(Debug, Default)]
struct OwedCount {
    n: AtomicUsize,
    none_left: tokio::sync::Notify,
}

impl OwedCount {
    /// Until no request is owed an answer.
    async fn none_left(&self) {
        loop {
            let told = self.none_left.notified();
            tokio::pin!(told);
            // Registered before the count is read, so a last answer in between still tells it.
            told.as_mut().enable();
            if self.n.load(Ordering::Acquire) == 0 {
                return;
            }
            told.await;
        }
    }
}

/// One request the client is owed an answer to, counted while it lives.
struct Owed(Arc<OwedCount>);

impl Owed {
    fn new(count: &Arc<OwedCount>) -> Self {
        count.n.fetch_add(1, Ordering::AcqRel);
        Owed(count.clone())
    }
}

impl Drop for Owed {
    fn drop(&mut self) {
        if self.0.n.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.none_left.notify_waiters();
        }
    }
}

/// The error line refusing a request for its era.
fn refusal_line(id: &Value, refusal: era::Refusal) -> Vec<u8> {
    let (code, message, data) = refusal.error();
    line(&json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": {"code": code, "message": message, "data": data},
    }))
}

fn server_info() -> Value {
    json!({"name": "mcpmesh-hub", "title": "mcpmesh hub", "version": env!("CARGO_PKG_VERSION")})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "current_thread")]
    async fn the_wait_for_owed_answers_ends_when_the_last_is_answered_not_before() {
        let count = Arc::new(OwedCount::default());
        count.none_left().await; // none owed: at once
        let (first, second) = (Owed::new(&count), Owed::new(&count));
        let waiting = tokio::spawn({
            let count = count.clone();
            async move { count.none_left().await }
        });
        tokio::task::yield_now().await;
        drop(first);
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "one answer is still owed");
        drop(second);
        tokio::time::timeout(Duration::from_secs(10), waiting)
            .await
            .expect("told when none is owed")
            .unwrap();
    }

    #[test]
    fn the_presented_services_come_from_the_nodes_catalog() {
        let catalog = json!({"services": [
            {"peer": "alice", "service": "notes", "tools": 3},
            {"peer": "alice", "service": "files", "tools": null},
            {"peer": "bob"},
        ]});
        let (targets, counts) = catalog_targets(&catalog);
        let names: Vec<String> = targets.iter().map(ToString::to_string).collect();
        assert_eq!(names, ["alice/notes", "alice/files"]);
        assert_eq!(counts[&targets[0]], Some(3));
        assert_eq!(counts[&targets[1]], None);
    }

    #[test]
    fn instructions_are_cut_at_a_character_boundary_within_the_bound() {
        assert_eq!(cut("short", 10), "short");
        let long = "é".repeat(100);
        let shown = cut(&long, 51);
        assert!(shown.len() <= 51, "{}", shown.len());
        assert!(shown.ends_with('…'));
        assert!(shown.starts_with("éé"));
    }

    #[test]
    fn reachability_comes_from_the_nodes_peer_list() {
        let peers = json!({"peers": [
            {"name": "alice", "mounts": ["notes", "files"], "reachable": true},
            {"name": "bob", "mounts": [], "reachable": false},
            {"name": "carol"},
        ]});
        let reach = reachability(&peers);
        assert_eq!(reach.get("alice"), Some(&true));
        assert_eq!(reach.get("bob"), Some(&false));
        assert_eq!(reach.get("carol"), None);
    }
}
