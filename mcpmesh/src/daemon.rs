//! The node daemon: the composition root. It builds every subsystem, hands each a narrow
//! handle, serves the mesh ALPN and the control socket, and applies config changes live.

use std::io::Write;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use iroh::address_lookup::MemoryLookup;
use iroh::protocol::Router;
use iroh::{Endpoint, EndpointId};
use mcpmesh_net::endpoint::{self, NetworkConfig};
use mcpmesh_net::gate::{CLOSE_SEVERED, CLOSE_SHUTDOWN};
use mcpmesh_net::registry::ConnectionRegistry;
use mcpmesh_net::session::{ALPN_MCP, Dialer, MeshProtocol, OpenedSession, valid_service_name};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::net::UnixListener;
use tokio_util::sync::CancellationToken;

use crate::audit::{AuditEvent, AuditLog, AuditSink};
use crate::config::{self, ConfigError, ConfigFile, Settings, parse_endpoint_id};
use crate::control::server::{self, ControlHandler, Reply};
use crate::control::{ControlError, SessionOpen, codes, methods};
use crate::keys;
use crate::paths::Profile;
use crate::peers::{PeerGate, PeerTable};
use crate::proxy;
use crate::services::{ServiceHost, ServiceTable, is_allowed};

/// How long shutdown waits for sessions to end their children.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error("a node is already running for this profile (control socket {0})")]
    AlreadyRunning(String),
    #[error("cannot prepare the node's files: {0}")]
    Files(std::io::Error),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Key(#[from] keys::KeyError),
    #[error(transparent)]
    Endpoint(#[from] endpoint::EndpointError),
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

/// Runs the node for `profile` until it is told to stop (`node.shutdown`, SIGTERM, SIGINT).
/// `on_ready` is called once the control socket accepts connections.
pub async fn run(profile: Profile, on_ready: impl FnOnce(&Ready)) -> Result<(), DaemonError> {
    profile.create_dirs().map_err(DaemonError::Files)?;
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

    let config_file = ConfigFile::new(profile.config_file());
    let settings = config_file.load()?;
    let secret = keys::load_or_create(&profile.key_file())?;
    let book = MemoryLookup::new();
    let endpoint = bind_endpoint(&profile, secret, &settings.network, book.clone()).await?;

    let shutdown = CancellationToken::new();
    let registry = Arc::new(ConnectionRegistry::new());
    let gate = Arc::new(PeerGate::new(PeerTable::new(settings.peers.clone())));
    let services = Arc::new(RwLock::new(
        ServiceTable::default().rebuild(&settings.services),
    ));
    let (audit_log, audit) = AuditLog::start(profile.audit_dir(), settings.audit_retain_months)
        .map_err(DaemonError::Files)?;
    let host = Arc::new(ServiceHost::new(
        services.clone(),
        audit.clone(),
        shutdown.clone(),
    ));
    let router = Router::builder(endpoint.clone())
        .accept(
            ALPN_MCP,
            MeshProtocol::new(gate.clone(), host.clone(), registry.clone()),
        )
        .spawn();
    let dialer = Arc::new(Dialer::new(
        endpoint.clone(),
        book,
        registry.clone(),
        settings.dial_timeout,
    ));
    for hint in PeerTable::new(settings.peers.clone()).address_hints() {
        dialer.add_address_hint(hint);
    }

    let socket_path = profile.socket_path();
    let listener = bind_control_socket(&socket_path)?;
    let stop = CancellationToken::new();
    let node = Arc::new(Node {
        config_file,
        settings: RwLock::new(settings),
        endpoint: endpoint.clone(),
        gate,
        services,
        host: host.clone(),
        registry: registry.clone(),
        dialer,
        shutdown: shutdown.clone(),
        audit,
    });
    let control = tokio::spawn(server::serve(listener, node.clone(), stop.clone()));
    let addrs = endpoint::direct_addrs(&endpoint);
    tracing::info!(id = %endpoint.id(), ?addrs, "node ready");
    on_ready(&Ready {
        id: endpoint.id(),
        addrs,
        socket: socket_path.clone(),
    });

    wait_for_stop(&stop, &node).await;
    stop.cancel();
    node.stop_sessions().await;
    registry.close_all(CLOSE_SHUTDOWN, b"node shutting down");
    let _ = router.shutdown().await;
    let _ = control.await;
    let _ = std::fs::remove_file(&socket_path);
    audit_log.close().await;
    tracing::info!("node stopped");
    // Released last: `down` returns once it can take this lock, when nothing is left running.
    drop(lock);
    Ok(())
}

/// Binds the endpoint, reusing the UDP port of the last run when `bind` asks for port 0, so
/// the address hints peers stored stay valid across restarts.
async fn bind_endpoint(
    profile: &Profile,
    secret: iroh::SecretKey,
    network: &NetworkConfig,
    book: MemoryLookup,
) -> Result<Endpoint, DaemonError> {
    let alpns = vec![ALPN_MCP.to_vec()];
    let remembered: Option<u16> = std::fs::read_to_string(profile.port_file())
        .ok()
        .and_then(|s| s.trim().parse().ok());
    let mut preferred = network.clone();
    if let Some(port) = remembered {
        for addr in &mut preferred.bind {
            if addr.port() == 0 {
                addr.set_port(port);
            }
        }
    }
    let endpoint =
        match endpoint::bind(secret.clone(), &preferred, alpns.clone(), book.clone()).await {
            Ok(ep) => ep,
            Err(e) if preferred != *network => {
                tracing::info!("the remembered UDP port is not available ({e}); picking a new one");
                endpoint::bind(secret, network, alpns, book).await?
            }
            Err(e) => return Err(e.into()),
        };
    if let Some(port) = endpoint.bound_sockets().first().map(SocketAddr::port)
        && remembered != Some(port)
    {
        let _ = config::write_atomically(&profile.port_file(), format!("{port}\n").as_bytes());
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

async fn wait_for_stop(stop: &CancellationToken, node: &Node) {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::signal::ctrl_c() => return,
            Some(()) = async { term.as_mut()?.recv().await } => return,
            Some(()) = async { hup.as_mut()?.recv().await } => {
                match node.config_file.load() {
                    Ok(settings) => {
                        node.apply(settings);
                        tracing::info!("config reloaded");
                    }
                    Err(e) => tracing::warn!("config not reloaded: {e}"),
                }
            }
        }
    }
}

/// The running node, as the control API sees it.
#[derive(Debug)]
struct Node {
    config_file: ConfigFile,
    settings: RwLock<Settings>,
    endpoint: Endpoint,
    gate: Arc<PeerGate>,
    services: Arc<RwLock<ServiceTable>>,
    host: Arc<ServiceHost>,
    registry: Arc<ConnectionRegistry>,
    dialer: Arc<Dialer>,
    shutdown: CancellationToken,
    audit: AuditSink,
}

impl Node {
    /// Makes `settings` the running configuration: trust, services and address hints. Peers
    /// no longer trusted lose their connections at once.
    fn apply(&self, settings: Settings) {
        let old = self.gate.snapshot();
        let new = PeerTable::new(settings.peers.clone());
        for gone in old.all().iter().filter(|p| new.by_id(&p.id).is_none()) {
            let n = self
                .registry
                .sever(&gone.id, CLOSE_SEVERED, b"no longer trusted");
            self.dialer.forget(&gone.id);
            tracing::info!(peer = %gone.name, severed = n, "peer removed");
        }
        for hint in new.address_hints() {
            self.dialer.add_address_hint(hint);
        }
        self.gate.replace(new);
        {
            let mut table = self.services.write().unwrap_or_else(|p| p.into_inner());
            *table = table.rebuild(&settings.services);
        }
        *self.settings.write().unwrap_or_else(|p| p.into_inner()) = settings;
    }

    fn edit(
        &self,
        change: impl FnOnce(&mut toml_edit::DocumentMut) -> Result<(), String>,
    ) -> Result<(), ControlError> {
        let settings = self
            .config_file
            .edit(change)
            .map_err(|e| ControlError::new(codes::CONFIG, e.to_string()))?;
        self.apply(settings);
        Ok(())
    }

    async fn stop_sessions(&self) {
        self.shutdown.cancel();
        if tokio::time::timeout(DRAIN_TIMEOUT, self.host.drain())
            .await
            .is_err()
        {
            tracing::warn!("some sessions did not end in time");
        }
    }

    fn node_id_result(&self) -> Value {
        let addrs: Vec<String> = endpoint::direct_addrs(&self.endpoint)
            .iter()
            .map(SocketAddr::to_string)
            .collect();
        json!({ "id": self.endpoint.id().to_string(), "addrs": addrs })
    }

    fn peers_add(&self, params: Value) -> Result<Value, ControlError> {
        #[derive(Deserialize)]
        struct Add {
            name: String,
            id: String,
            #[serde(default)]
            addrs: Vec<String>,
        }
        let add: Add = params_of(params)?;
        if !valid_service_name(&add.name) {
            return Err(ControlError::invalid_params(
                "a peer name is 1-64 letters, digits, '.', '_' or '-'",
            ));
        }
        let id = parse_endpoint_id(&add.id).ok_or_else(|| {
            ControlError::invalid_params(format!("{:?} is not an endpoint id", add.id))
        })?;
        if id == self.endpoint.id() {
            return Err(ControlError::invalid_params("that is this node's own id"));
        }
        if let Some(other) = self
            .gate
            .snapshot()
            .by_id(&id)
            .filter(|p| p.name != add.name)
        {
            return Err(ControlError::new(
                codes::CONFLICT,
                format!("this key is already trusted as {}", other.name),
            ));
        }
        let addrs = add
            .addrs
            .iter()
            .map(|a| {
                a.parse::<SocketAddr>().map_err(|_| {
                    ControlError::invalid_params(format!(
                        "{a:?} is not an address like 192.0.2.7:4433"
                    ))
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        self.edit(|doc| config::set_peer(doc, &add.name, &id, &addrs))?;
        self.audit.record(AuditEvent::Trust {
            action: "peer_added".into(),
            peer: Some(add.name.clone()),
            service: None,
        });
        Ok(json!({ "peer": add.name, "id": id.to_string() }))
    }

    fn peers_list(&self) -> Value {
        let table = self.gate.snapshot();
        let services = self
            .services
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let connected = self.registry.connected_peers();
        let peers: Vec<Value> = table
            .all()
            .iter()
            .map(|p| {
                let identity = mcpmesh_net::PeerIdentity::new(p.id, p.name.clone());
                json!({
                    "name": p.name,
                    "id": p.id.to_string(),
                    "addrs": p.addrs.iter().map(SocketAddr::to_string).collect::<Vec<_>>(),
                    "services": services.granted_to(&identity),
                    "connected": connected.contains(&p.id),
                })
            })
            .collect();
        json!({ "peers": peers })
    }

    fn serve(&self, params: Value) -> Result<Value, ControlError> {
        #[derive(Deserialize)]
        struct Serve {
            name: String,
            run: Vec<String>,
            #[serde(default)]
            allow: Vec<String>,
            max_sessions: Option<u32>,
        }
        let serve: Serve = params_of(params)?;
        self.edit(|doc| {
            config::set_service(
                doc,
                &serve.name,
                &serve.run,
                &serve.allow,
                serve.max_sessions,
            )
        })?;
        self.audit.record(AuditEvent::Trust {
            action: "serve".into(),
            peer: None,
            service: Some(serve.name.clone()),
        });
        let table = self.gate.snapshot();
        let reachable_by: Vec<&str> = table
            .all()
            .iter()
            .filter(|p| {
                is_allowed(
                    &serve.allow,
                    &mcpmesh_net::PeerIdentity::new(p.id, p.name.clone()),
                )
            })
            .map(|p| p.name.as_str())
            .collect();
        Ok(json!({ "service": serve.name, "serving": true, "allowed_peers": reachable_by }))
    }

    async fn open_session(&self, open: &SessionOpen) -> Result<OpenedSession, ControlError> {
        let peer = self
            .gate
            .snapshot()
            .by_name(&open.peer)
            .cloned()
            .ok_or_else(|| {
                ControlError::new(
                    codes::UNKNOWN_SERVICE,
                    format!("no peer named {:?}; see `mcpmesh peers`", open.peer),
                )
            })?;
        if !valid_service_name(&open.service) {
            return Err(ControlError::new(
                codes::UNKNOWN_SERVICE,
                "unknown or unauthorized service",
            ));
        }
        self.dialer
            .open(peer.id, &open.service)
            .await
            .map_err(|e| ControlError::new(e.error_code().code(), format!("{}: {e}", open.peer)))
    }
}

fn params_of<T: serde::de::DeserializeOwned>(params: Value) -> Result<T, ControlError> {
    serde_json::from_value(params).map_err(|e| ControlError::invalid_params(e.to_string()))
}

impl ControlHandler for Node {
    async fn call(&self, method: &str, params: Value) -> Result<Reply, ControlError> {
        match method {
            methods::NODE_ID => Ok(Reply::Value(self.node_id_result())),
            methods::PEERS_ADD => self.peers_add(params).map(Reply::Value),
            methods::PEERS_LIST => Ok(Reply::Value(self.peers_list())),
            methods::SERVICES_SERVE => self.serve(params).map(Reply::Value),
            methods::SESSION_OPEN => {
                let open: SessionOpen = params_of(params)?;
                let session = self.open_session(&open).await?;
                Ok(Reply::Tunnel(
                    json!({ "opened": true }),
                    session,
                    open.attach,
                ))
            }
            methods::NODE_SHUTDOWN => {
                self.stop_sessions().await;
                Ok(Reply::ThenStop(json!({ "stopped": true })))
            }
            other => Err(ControlError::new(
                codes::UNKNOWN_METHOD,
                format!("unknown method {other:?}"),
            )),
        }
    }

    async fn tunnel(&self, local: proxy::LocalSide, session: OpenedSession) {
        proxy::tunnel(local, session, self.shutdown.child_token()).await;
    }

    fn node_id(&self) -> String {
        self.endpoint.id().to_string()
    }
}
