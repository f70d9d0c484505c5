//! The node daemon: the composition root. It builds every subsystem, hands each a narrow
//! handle, serves the mesh ALPN and the control socket, and applies config changes live.

mod catalog;
mod catalogs;
mod core;
mod exchange;
mod node;
mod org;
mod policy;
mod reach;
mod serving;
mod status;
mod status_page;
mod swarm;
mod trust;

use std::io::Write;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use iroh::address_lookup::MemoryLookup;
use iroh::protocol::Router;
use iroh::{Endpoint, EndpointId};
use mcpmesh_net::endpoint::{self, NetworkConfig};
use mcpmesh_net::gate::{CLOSE_SHUTDOWN, TrustGate};
use mcpmesh_net::ping::{ALPN_PING, PingProtocol};
use mcpmesh_net::registry::ConnectionRegistry;
use mcpmesh_net::session::{ALPN_MCP, Dialer, MeshProtocol};
use tokio::net::UnixListener;
use tokio_util::sync::CancellationToken;

use crate::audit::{AuditLog, AuditSink, RefusalTally};
use crate::backends::spawn::Launcher;
use crate::config::{ConfigError, ConfigFile, Settings};
use crate::control::codes;
use crate::control::server;
use crate::disk::Disk;
use crate::keys;
use crate::pairing::ALPN_PAIR;
use crate::paths::Profile;
use crate::peers::PeerGate;
use crate::roster::invite::ALPN_JOIN;
use crate::roster::sync::ALPN_ROSTER;
use crate::services::{ServiceHost, ServiceTable};
use crate::store::{Store, StoreError};
use crate::telemetry::{self, Metrics, Traces};

use catalog::Catalog;
use core::Core;
use node::Node;
use org::{JoinProtocol, Org, RosterProtocol};
use status::Status;
use trust::{PairProtocol, Trust};

/// How often the node prunes expired invites and idle rate-limit state.
const HOUSEKEEPING: Duration = Duration::from_secs(60);

/// How long shutdown waits for sessions to end their children.
pub(crate) const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error("a node is already running for this profile (control socket {0})")]
    AlreadyRunning(String),
    #[error("cannot prepare the node's files: {0}")]
    Files(std::io::Error),
    #[error(transparent)]
    Untrusted(#[from] crate::files::Untrusted),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Key(#[from] keys::KeyError),
    #[error(transparent)]
    Endpoint(#[from] endpoint::EndpointError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("cannot listen on the control socket {path}: {source}")]
    Socket {
        path: String,
        source: std::io::Error,
    },
}

impl DaemonError {
    /// The control API's stable code for this failure.
    pub fn code(&self) -> i64 {
        match self {
            DaemonError::AlreadyRunning(_) => codes::CONFLICT,
            DaemonError::Config(_) => codes::CONFIG,
            _ => codes::NODE_UNAVAILABLE,
        }
    }
}

/// What the daemon reports once it is ready.
#[derive(Debug, Clone)]
pub struct Ready {
    pub id: EndpointId,
    pub addrs: Vec<SocketAddr>,
    pub socket: std::path::PathBuf,
}

/// Raises the soft limit on open descriptors to the hard one: the default soft limit (1,024 on
/// most systems) is far below what the listeners' caps and the sessions together may hold.
fn raise_descriptor_limit() {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    if limit.current < limit.maximum {
        let raised = rustix::process::Rlimit {
            current: limit.maximum,
            maximum: limit.maximum,
        };
        if let Err(e) = setrlimit(Resource::Nofile, raised) {
            tracing::warn!("could not raise the open-files limit: {e}");
        }
    }
}

/// Runs the node for `profile` until it is told to stop (`node.shutdown`, SIGTERM, SIGINT).
/// `on_ready` is called once the control socket accepts connections. With `launcher`, the
/// servers of `run` services are started through it (see [`Launcher`]).
pub async fn run(
    profile: Profile,
    launcher: Option<Launcher>,
    on_ready: impl FnOnce(&Ready),
) -> Result<(), DaemonError> {
    raise_descriptor_limit();
    let lock = lock_profile(&profile)?;
    let Built {
        node,
        mut observers,
    } = build_node(&profile, launcher).await?;
    let refusals = Arc::new(RefusalTally::new(node.core.audit.clone()));
    let router = serve_mesh(&node, refusals.clone());
    // Pairing and joining are answered only while an invite of theirs is live.
    node.core.on_disk(|core| core.update_alpns()).await;
    let tasks = Tasks::start(&node, &refusals);
    open_local_endpoints(&node, observers.metrics.take()).await;

    let socket_path = profile.socket_path();
    let listener = bind_control_socket(&socket_path)?;
    let stop = CancellationToken::new();
    let control = tokio::spawn(server::serve(listener, node.clone(), stop.clone()));
    let addrs = endpoint::direct_addrs(&node.core.endpoint);
    tracing::info!(id = %node.core.endpoint.id(), ?addrs, "node ready");
    on_ready(&Ready {
        id: node.core.endpoint.id(),
        addrs,
        socket: socket_path.clone(),
    });

    wait_for_stop(&stop, &node.core).await;
    stop.cancel();
    let running = Running {
        node,
        router,
        control,
        socket_path,
        tasks,
        refusals,
        observers,
    };
    running.stop().await;
    // Released last: `down` returns once it can take this lock, when nothing is left running.
    drop(lock);
    Ok(())
}

/// Takes the profile's lock, so that one node runs per profile; the node holds it until it
/// has stopped.
fn lock_profile(profile: &Profile) -> Result<std::fs::File, DaemonError> {
    profile.create_dirs().map_err(DaemonError::Files)?;
    profile.check_trusted()?;
    let mut lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(profile.lock_file())
        .map_err(DaemonError::Files)?;
    if lock.try_lock().is_err() {
        return Err(DaemonError::AlreadyRunning(
            profile.socket_path().display().to_string(),
        ));
    }
    // The lock file names the running node's pid, for `kill -HUP` and the like.
    lock.set_len(0)
        .and_then(|()| writeln!(lock, "{}", std::process::id()))
        .map_err(DaemonError::Files)?;
    Ok(lock)
}

/// The node as built, and what records it from outside: closed by `run` after the node stops.
struct Built {
    node: Arc<Node>,
    observers: Observers,
}

/// Builds the node from its profile (config, key, endpoint, store, audit, the service host)
/// and settles its state before any peer can call.
async fn build_node(profile: &Profile, launcher: Option<Launcher>) -> Result<Built, DaemonError> {
    let config_file = ConfigFile::new(profile.config_file());
    let settings = config_file.load()?;
    let secret = keys::load_or_create(&profile.key_file())?;
    let issuer = caller_issuer(&secret);
    let book = MemoryLookup::new();
    let endpoint = bind_endpoint(profile, secret, &settings.network, book.clone()).await?;

    let disk = Disk::start(tokio::runtime::Handle::current()).map_err(DaemonError::Files)?;
    let store_file = profile.store_file();
    let store = disk
        .run(move || Store::open(&store_file))
        .await
        .ok_or_else(|| DaemonError::Files(std::io::Error::other("the store's writer failed")))??;
    let store = Arc::new(store);

    let shutdown = CancellationToken::new();
    let registry = Arc::new(ConnectionRegistry::new());
    let gate = Arc::new(PeerGate::default());
    let services = Arc::new(RwLock::new(ServiceTable::default()));
    let mark = Arc::new(crate::store::HighWaterOnDisk::new(
        store.clone(),
        disk.clone(),
    ));
    let (observers, audit) = Observers::start(profile, &settings, mark, endpoint.id())?;
    let mut host = ServiceHost::new(services.clone(), audit.clone(), shutdown.clone())
        .with_launcher(launcher)
        .with_principals(gate.clone());
    if let Some(issuer) = issuer {
        host = host.with_issuer(issuer);
    }
    let grants = crate::oauth::GrantBook::new(crate::oauth::GrantFiles::new(profile))
        .with_disk(disk.clone());
    let host = Arc::new(host.with_grants(Arc::new(grants)));
    let dialer = Arc::new(Dialer::new(
        endpoint.clone(),
        book,
        registry.clone(),
        settings.dial_timeout,
        settings.idle_close,
    ));
    let core = Core::new(core::Parts {
        config_file,
        disk,
        store,
        endpoint,
        gate,
        services,
        host,
        registry,
        dialer,
        shutdown,
        audit,
        settings: settings.clone(),
    });
    let trust = Trust::new(core.clone());
    let catalog = Catalog::new(core.clone(), catalogs::Catalogs::load(&profile.state_dir));
    let org = Org::new(core.clone(), catalog.clone(), profile.org_root_file());
    let status = Status::new(status::StatusParts {
        core: core.clone(),
        trust: trust.clone(),
        catalog: catalog.clone(),
        org: org.clone(),
        page: status_page::StatusPageSlot::new(profile.status_token_file(), profile.audit_dir()),
        log_file: profile.log_file(),
    });
    let node = Arc::new(Node {
        core,
        trust,
        catalog,
        org,
        status,
    });
    node.org.load_roster();
    node.core.apply(settings);
    // Before any peer can call: grants a pairing committed just before a crash.
    node.trust.settle_owed_grants_now().await;
    Ok(Built { node, observers })
}

/// What signs the caller assertion `url` services get. A key it cannot use is no reason not
/// to run the node: those services get none.
fn caller_issuer(secret: &iroh::SecretKey) -> Option<Arc<crate::assertion::Issuer>> {
    match crate::assertion::Issuer::new(secret) {
        Ok(issuer) => Some(Arc::new(issuer)),
        Err(e) => {
            tracing::error!("{e}; url services get no caller assertion");
            None
        }
    }
}

/// What records the node from outside its sessions: the audit log's writer, and the metrics
/// and traces the config asks for.
struct Observers {
    audit_log: AuditLog,
    /// Where to serve the metrics, until `run` opens that endpoint.
    metrics: Option<(SocketAddr, Arc<Metrics>)>,
    traces: Option<Arc<Traces>>,
}

impl Observers {
    /// Starts the audit log's writer and the traces' exporter; returns the sink every part
    /// records through, feeding the metrics and traces too.
    fn start(
        profile: &Profile,
        settings: &Settings,
        mark: Arc<dyn crate::audit::HighWater>,
        id: EndpointId,
    ) -> Result<(Self, AuditSink), DaemonError> {
        let (audit_log, audit) = AuditLog::start(
            profile.audit_dir(),
            settings.audit_retain_months,
            Some(mark),
        )
        .map_err(DaemonError::Files)?;
        let metrics = settings
            .metrics
            .map(|listen| (listen, Arc::new(Metrics::new())));
        let audit = match &metrics {
            Some((_, m)) => audit.with_metrics(m.clone()),
            None => audit,
        };
        let traces = settings.otlp.as_ref().and_then(|url| {
            // A collector that cannot be set up is no reason not to run the node.
            match Traces::new(url, &id.to_string()) {
                Ok(traces) => Some(Arc::new(traces)),
                Err(e) => {
                    tracing::error!("{e}; the node runs without traces");
                    None
                }
            }
        });
        let audit = match &traces {
            Some(t) => audit.with_traces(t.clone()),
            None => audit,
        };
        let observers = Observers {
            audit_log,
            metrics,
            traces,
        };
        Ok((observers, audit))
    }

    /// Writes out what is queued: the audit records, then the last spans.
    async fn close(self) {
        self.audit_log.close().await;
        if let Some(traces) = self.traces {
            // Sending the last spans blocks; `down` returns only after they were sent (or gave up).
            let _ = tokio::task::spawn_blocking(move || traces.shutdown()).await;
        }
    }
}

/// Answers the mesh ALPNs, each behind the gate it needs.
fn serve_mesh(node: &Node, refusals: Arc<RefusalTally>) -> Router {
    let core = &node.core;
    let audited = Arc::new(AuditedGate {
        peers: core.gate.clone(),
        refusals,
        org: Arc::downgrade(&node.org),
    });
    Router::builder(core.endpoint.clone())
        .accept(
            ALPN_MCP,
            MeshProtocol::new(audited.clone(), core.host.clone(), core.registry.clone()),
        )
        .accept(ALPN_PING, PingProtocol::new(audited.clone()))
        .accept(
            crate::catalog::ALPN_CATALOG,
            catalog::CatalogProtocol::new(node.catalog.clone(), audited.clone()),
        )
        .accept(
            swarm::ALPN_GOSSIP,
            org::GossipProtocol::new(node.org.clone()),
        )
        .accept(ALPN_ROSTER, RosterProtocol::new(node.org.clone(), audited))
        .accept(ALPN_PAIR, PairProtocol::new(node.trust.clone()))
        .accept(ALPN_JOIN, JoinProtocol::new(node.org.clone()))
        .spawn()
}

/// The node's periodic work, each a task of its own until shutdown.
struct Tasks {
    upkeep: tokio::task::JoinHandle<()>,
    puller: tokio::task::JoinHandle<()>,
    checker: tokio::task::JoinHandle<()>,
    /// Tells the org when this node's services change.
    announcer: tokio::task::JoinHandle<()>,
}

impl Tasks {
    /// Joins the org's gossip and starts the periodic work.
    fn start(node: &Arc<Node>, refusals: &Arc<RefusalTally>) -> Self {
        {
            let org = node.org.clone();
            tokio::spawn(async move { org.gossip_follow_roster(None).await });
        }
        let upkeep = tokio::spawn(keep_house(node.clone(), refusals.clone()));
        let puller = tokio::spawn(keep_roster_current(node.org.clone(), node.core.clone()));
        let checker = tokio::spawn(keep_checking_peers(node.core.clone()));
        let org = node.org.clone();
        let announcer = tokio::spawn(async move { org.announce_catalog_changes().await });
        Tasks {
            upkeep,
            puller,
            checker,
            announcer,
        }
    }

    async fn stop(self) {
        self.upkeep.abort();
        let _ = self.upkeep.await;
        self.checker.abort();
        let _ = self.checker.await;
        self.puller.abort();
        let _ = self.puller.await;
        self.announcer.abort();
        let _ = self.announcer.await;
    }
}

/// Every [`HOUSEKEEPING`]: writes out the tallied refusals, prunes what expired, and settles
/// what a crash left pending.
async fn keep_house(node: Arc<Node>, refusals: Arc<RefusalTally>) {
    let stop = node.core.shutdown.clone();
    let mut every = tokio::time::interval(HOUSEKEEPING);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            // The first tick is immediate: pairings a crash left pending or owing
            // grants are settled as soon as the node is up.
            _ = every.tick() => {
                refusals.flush();
                node.org.flush_refusals();
                let (trust, org) = (node.trust.clone(), node.org.clone());
                node.core
                    .on_disk(move |core| {
                        core.housekeeping();
                        trust.settle_owed_grants();
                        org.roster_upkeep();
                    })
                    .await;
                node.trust.confirm_pending().await;
                node.org.confirm_pending_join().await;
            }
        }
    }
}

/// Every `org_sync`: keeps the node on the org's gossip and its roster current.
async fn keep_roster_current(org: Arc<Org>, core: Arc<Core>) {
    let stop = core.shutdown.clone();
    let mut every = tokio::time::interval(core.settings().org_sync);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            // The first tick is immediate: a node coming back catches up at once.
            _ = every.tick() => {
                // A node left with too few gossip neighbors joins through more.
                org.gossip_follow_roster(None).await;
                org.sync_all().await;
            }
        }
    }
}

/// Keeps checking which peers are reachable, each as closely as it is used.
async fn keep_checking_peers(core: Arc<Core>) {
    let stop = core.shutdown.clone();
    // A connection open (either way) is its own witness; an org member is followed
    // closely only while in use.
    let peers = || {
        let incoming = core.registry.connected_peers();
        core.gate
            .snapshot()
            .all()
            .iter()
            .map(|p| {
                let connected = core.dialer.is_connected(&p.id) || incoming.contains(&p.id);
                let watch = match p.user {
                    _ if connected => reach::Watch::Connected,
                    Some(_) => reach::Watch::WhenUsed,
                    None => reach::Watch::Always,
                };
                (p.id, watch)
            })
            .collect()
    };
    core.reach
        .keep_checking(core.endpoint.clone(), peers, stop)
        .await;
}

/// Opens the status page and the metrics endpoint when the config asks for them.
async fn open_local_endpoints(node: &Arc<Node>, metrics: Option<(SocketAddr, Arc<Metrics>)>) {
    // A page configured to listen from the start that cannot is no reason not to run the
    // node: it is logged, and `status --web` tries again and says why.
    let page_configured = node.core.settings().status_listen.is_some();
    if page_configured && let Err(e) = node.status.status_web().await {
        tracing::warn!("the status page is not open: {e}");
    }
    if let Some((listen, metrics)) = metrics {
        let at = serve_metrics(node, listen, metrics).await;
        node.status.metrics_opened(at);
    }
}

/// What `run` started, to be stopped in order once the node is told to stop.
struct Running {
    node: Arc<Node>,
    router: Router,
    control: tokio::task::JoinHandle<()>,
    socket_path: std::path::PathBuf,
    tasks: Tasks,
    refusals: Arc<RefusalTally>,
    observers: Observers,
}

impl Running {
    /// Ends the sessions and their children, closes the connections and the control socket,
    /// stops the periodic work, and writes out what the node recorded.
    async fn stop(self) {
        let Running {
            node,
            router,
            control,
            socket_path,
            tasks,
            refusals,
            observers,
        } = self;
        node.core.stop_sessions().await;
        node.core
            .registry
            .close_all(CLOSE_SHUTDOWN, b"node shutting down");
        let _ = router.shutdown().await;
        let _ = control.await;
        let _ = std::fs::remove_file(&socket_path);
        tasks.stop().await;
        refusals.flush();
        node.org.flush_refusals();
        observers.close().await;
        tracing::info!("node stopped");
        // The store goes before the lock: a node started the moment the lock is free opens it.
        drop(router);
        drop(node);
    }
}

/// Starts the metrics endpoint. A node whose metrics port is taken still serves its peers:
/// the failure is logged, and `status` and `doctor` show it.
async fn serve_metrics(
    node: &Arc<Node>,
    listen: SocketAddr,
    metrics: Arc<Metrics>,
) -> Result<SocketAddr, String> {
    let weak = Arc::downgrade(&node.status);
    let peers = move || weak.upgrade().map(|s| s.peer_paths()).unwrap_or_default();
    match telemetry::serve(listen, metrics, peers, node.core.shutdown.clone()).await {
        Ok(endpoint) => {
            tracing::info!("metrics at http://{}/metrics", endpoint.addr);
            Ok(endpoint.addr)
        }
        Err(e) => {
            let error = format!("cannot listen for metrics on {listen}: {e}");
            tracing::error!("{error}; the node runs without its metrics endpoint");
            Err(error)
        }
    }
}

/// The peer table's gate, telling the audit log of every key it refuses (naming the org
/// user of a removed device).
#[derive(Debug)]
struct AuditedGate {
    peers: Arc<PeerGate>,
    refusals: Arc<RefusalTally>,
    org: std::sync::Weak<Org>,
}

impl TrustGate for AuditedGate {
    fn resolve(&self, remote: &EndpointId) -> Option<mcpmesh_net::PeerIdentity> {
        self.peers.resolve(remote)
    }

    fn refused(&self, remote: &EndpointId) {
        self.refusals.refused_from(
            || format!("eid:{remote}"),
            || self.org.upgrade()?.removed_user(remote),
        );
    }
}

/// How long a start waits for the remembered UDP port while a node that just stopped may
/// still hold it.
const PORT_WAIT: Duration = Duration::from_secs(3);

/// Binds the endpoint, reusing the UDP port of the last run wherever the config leaves the
/// port to the system (port 0, or no `bind` at all), so the address hints peers stored stay
/// valid across restarts.
async fn bind_endpoint(
    profile: &Profile,
    secret: iroh::SecretKey,
    network: &NetworkConfig,
    book: MemoryLookup,
) -> Result<Endpoint, DaemonError> {
    let alpns = vec![ALPN_MCP.to_vec(), ALPN_PING.to_vec()];
    let remembered: Option<u16> = std::fs::read_to_string(profile.port_file())
        .ok()
        .and_then(|s| s.trim().parse().ok());
    let mut preferred = network.clone();
    for addr in &mut preferred.bind {
        if addr.port() == 0
            && let Some(port) = remembered
        {
            addr.set_port(port);
        }
    }
    let wants_port = remembered.is_some() && (preferred != *network || network.bind.is_empty());
    let endpoint = if wants_port {
        let deadline = tokio::time::Instant::now() + PORT_WAIT;
        loop {
            let attempt = endpoint::bind_on_port(
                secret.clone(),
                &preferred,
                remembered,
                alpns.clone(),
                book.clone(),
            )
            .await;
            match attempt {
                Ok(ep) => break ep,
                // The node that stopped a moment ago may not have let go of it yet.
                Err(_) if tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => {
                    tracing::warn!(
                        "the remembered UDP port is not available ({e}); picking a new one"
                    );
                    break endpoint::bind(secret, network, alpns, book).await?;
                }
            }
        }
    } else {
        endpoint::bind(secret, network, alpns, book).await?
    };
    let sockets = endpoint.bound_sockets();
    let port = sockets
        .iter()
        .find(|a| a.is_ipv4())
        .or(sockets.first())
        .map(SocketAddr::port);
    if let Some(port) = port
        && remembered != Some(port)
    {
        let _ =
            crate::files::write_atomically(&profile.port_file(), format!("{port}\n").as_bytes());
    }
    Ok(endpoint)
}

fn bind_control_socket(path: &std::path::Path) -> Result<UnixListener, DaemonError> {
    let err = |source| DaemonError::Socket {
        path: path.display().to_string(),
        source,
    };
    // We hold the profile's lock, so a socket file left here belongs to a dead node.
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(err(e)),
    }
    let listener = UnixListener::bind(path).map_err(err)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(err)?;
    Ok(listener)
}

async fn wait_for_stop(stop: &CancellationToken, core: &Core) {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::signal::ctrl_c() => return,
            Some(()) = async { term.as_mut()?.recv().await } => return,
            Some(()) = async { hup.as_mut()?.recv().await } => {
                match core.config_file.load() {
                    Ok(settings) => {
                        core.apply_by(settings, "reload");
                        tracing::info!("config reloaded");
                    }
                    Err(e) => tracing::warn!("config not reloaded: {e}"),
                }
            }
        }
    }
}
