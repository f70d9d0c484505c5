//! Services: who may open which, and the session handler that runs them.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};

use mcpmesh_net::PeerIdentity;
use mcpmesh_net::errors::{ErrorCode, ErrorFrame};
use mcpmesh_net::session::{MeshTransport, SessionHandler, refuse};
use reqwest::header::HeaderName;
use tokio::sync::{Notify, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::assertion::Issuer;
use crate::audit::{AuditEvent, AuditSink};
use crate::backends::BackendError;
use crate::backends::session::{ServiceCtx, SessionOptions};
use crate::backends::socket::SocketBackend;
use crate::backends::spawn::{Launcher, SpawnBackend, SpawnOptions};
use crate::backends::url::{CallerAssertion, UrlBackend};
use crate::config::{BackendSpec, ServiceSpec};
use crate::limits::RateLimiter;
use crate::oauth::GrantBook;
use crate::principal::{Held, Principal, PrincipalSource, is_allowed, principal_set};
use crate::tool_policy::{ListedTools, ToolAccess, ToolPolicy, access, may_use};

/// A served service with the state that outlives a config reload: its session semaphore and
/// its rate limiter.
#[derive(Debug, Clone)]
pub struct ServiceEntry {
    pub spec: ServiceSpec,
    pub sessions: Arc<Semaphore>,
    pub limiter: Arc<RateLimiter>,
    /// The service's per-tool rules, as its live sessions read them.
    pub tools: ToolPolicy,
    /// The tool names its server last listed, kept by its sessions.
    pub listed: ListedTools,
}

/// Every served service by name. Rebuilt from config on change, keeping the runtime state of
/// services whose limits did not change.
#[derive(Debug, Default, Clone)]
pub struct ServiceTable {
    entries: HashMap<String, ServiceEntry>,
}

impl ServiceTable {
    pub fn rebuild(&self, specs: &[ServiceSpec]) -> ServiceTable {
        let entries = specs
            .iter()
            .map(|spec| {
                // One handle per service for good: sessions already open see new rules.
                let tools = match self.entries.get(&spec.name) {
                    Some(old) => old.tools.clone(),
                    None => ToolPolicy::default(),
                };
                tools.set(spec.tools.clone());
                let listed = self
                    .entries
                    .get(&spec.name)
                    .map(|old| old.listed.clone())
                    .unwrap_or_default();
                let entry = match self.entries.get(&spec.name) {
                    Some(old)
                        if old.spec.max_sessions == spec.max_sessions
                            && old.spec.rate_limit_per_min == spec.rate_limit_per_min =>
                    {
                        ServiceEntry {
                            spec: spec.clone(),
                            ..old.clone()
                        }
                    }
                    _ => ServiceEntry {
                        spec: spec.clone(),
                        sessions: Arc::new(Semaphore::new(spec.max_sessions as usize)),
                        limiter: RateLimiter::per_minute_shared(spec.rate_limit_per_min),
                        tools,
                        listed,
                    },
                };
                (spec.name.clone(), entry)
            })
            .collect();
        ServiceTable { entries }
    }

    pub fn get(&self, name: &str) -> Option<&ServiceEntry> {
        self.entries.get(name)
    }

    pub fn names(&self) -> Vec<String> {
        let mut v: Vec<_> = self.entries.keys().cloned().collect();
        v.sort();
        v
    }

    /// For each service a caller holding `held` may open, the tools it may use there.
    pub fn tools_for(&self, held: &[Principal]) -> BTreeMap<String, ToolAccess> {
        self.entries
            .values()
            .filter(|e| is_allowed(&e.spec.allow, held))
            .map(|e| (e.spec.name.clone(), access(&e.spec.tools, held)))
            .collect()
    }

    /// The catalog here of a caller holding `held`: every service whose `allow` admits it, by
    /// name, with the principal that admitted it and the number of tools it may use (from the
    /// last listing).
    pub fn catalog_for(&self, held: &[Principal]) -> Vec<crate::catalog::Entry> {
        let mut entries: Vec<crate::catalog::Entry> = self
            .entries
            .values()
            .filter_map(|e| {
                let admitted_by = e.spec.allow.iter().find(|p| held.contains(p))?;
                let rules = e.tools.current();
                let tools = e.listed.get().map(|names| {
                    let usable = names.iter().filter(|t| may_use(&rules, held, t)).count();
                    u32::try_from(usable).unwrap_or(u32::MAX)
                });
                Some(crate::catalog::Entry {
                    service: e.spec.name.clone(),
                    description: e.spec.description.clone(),
                    backend: e.spec.backend.kind().to_owned(),
                    tools,
                    admitted_by: admitted_by.to_string(),
                })
            })
            .collect();
        entries.sort_by(|a, b| a.service.cmp(&b.service));
        entries
    }

    /// Services a caller holding `held` may open.
    pub fn granted_to(&self, held: &[Principal]) -> Vec<String> {
        let mut v: Vec<_> = self
            .entries
            .values()
            .filter(|e| is_allowed(&e.spec.allow, held))
            .map(|e| e.spec.name.clone())
            .collect();
        v.sort();
        v
    }
}

/// The serving side of mesh sessions: authorizes the caller for the named service and runs
/// its backend. Sessions are tracked so shutdown can end them and wait for their children,
/// and so a trust change can sever exactly the ones it concerns.
#[derive(Debug)]
pub struct ServiceHost {
    table: Arc<RwLock<ServiceTable>>,
    audit: AuditSink,
    shutdown: CancellationToken,
    sessions: TaskTracker,
    live: std::sync::Mutex<HashMap<u64, LiveSession>>,
    next_id: std::sync::atomic::AtomicU64,
    /// Starts the servers of `run` services, so that they die with the node.
    launcher: Option<Launcher>,
    /// Where sessions read their callers' principals at each request (without it, the set
    /// the gate resolved at open, with no org).
    principals: Option<Arc<dyn PrincipalSource>>,
    /// Signs the caller assertions `url` services get.
    issuer: Option<Arc<Issuer>>,
    /// The OAuth grants `url` services send.
    grants: Option<Arc<GrantBook>>,
}

/// A session being served.
#[derive(Debug, Clone)]
pub struct LiveSession {
    pub peer: [u8; 32],
    pub peer_name: String,
    pub service: String,
    /// Unix ms.
    pub since: u64,
    sever: CancellationToken,
    /// What the caller may use of the service's tools, as it was last told.
    tools: Arc<std::sync::Mutex<ToolAccess>>,
    /// Told when that changed: a caller that listed tools is sent `list_changed`.
    relist: Arc<Notify>,
}

/// Removes a session from the live set when it ends, however it ends.
struct LiveGuard<'a> {
    host: &'a ServiceHost,
    id: u64,
}

impl Drop for LiveGuard<'_> {
    fn drop(&mut self) {
        self.host.live_map().remove(&self.id);
    }
}

impl ServiceHost {
    pub fn new(
        table: Arc<RwLock<ServiceTable>>,
        audit: AuditSink,
        shutdown: CancellationToken,
    ) -> Self {
        ServiceHost {
            table,
            audit,
            shutdown,
            sessions: TaskTracker::new(),
            live: Default::default(),
            next_id: Default::default(),
            launcher: None,
            principals: None,
            issuer: None,
            grants: None,
        }
    }

    /// Sessions read their callers' principals from `source` at each request.
    pub fn with_principals(mut self, source: Arc<dyn PrincipalSource>) -> Self {
        self.principals = Some(source);
        self
    }

    /// The principal set of the caller `peer`, as it is now.
    fn held_by(&self, peer: &PeerIdentity) -> Held {
        match &self.principals {
            Some(source) => Held::live(source.clone(), peer.endpoint),
            None => Held::fixed(principal_set(peer, None)),
        }
    }

    /// Tells every live session whose caller may now use other tools than before (the
    /// service's rules or the caller's principals changed) so; returns how many.
    pub fn tools_changed(&self) -> usize {
        let table = self.table.read().unwrap_or_else(|p| p.into_inner());
        let map = self.live_map();
        let mut told = 0;
        for s in map.values() {
            let Some(entry) = table.get(&s.service) else {
                continue;
            };
            // A caller no longer trusted is being severed: nothing to tell it.
            let Some(held) = self
                .principals
                .as_ref()
                .and_then(|source| source.principals_of(&s.peer))
            else {
                continue;
            };
            let now = access(&entry.spec.tools, &held);
            let mut was = s.tools.lock().unwrap_or_else(|p| p.into_inner());
            if *was != now {
                *was = now;
                s.relist.notify_one();
                told += 1;
            }
        }
        told
    }

    /// Signs the caller assertions of `url` services with `issuer` (the node's key); without
    /// it, none is sent.
    pub fn with_issuer(mut self, issuer: Arc<Issuer>) -> Self {
        self.issuer = Some(issuer);
        self
    }

    /// The grants `url` services send, when the host has them.
    pub fn grants(&self) -> Option<&Arc<GrantBook>> {
        self.grants.as_ref()
    }

    /// `url` services send the grants `book` keeps (`mcpmesh auth`).
    pub fn with_grants(mut self, book: Arc<GrantBook>) -> Self {
        self.grants = Some(book);
        self
    }

    /// How a `url` service at `audience` asserts its callers, if it does.
    fn caller_assertion(&self, audience: &str, header: Option<&str>) -> Option<CallerAssertion> {
        let header = HeaderName::from_bytes(header?.as_bytes()).ok()?;
        Some(CallerAssertion {
            header,
            issuer: self.issuer.clone()?,
            audience: audience.to_owned(),
        })
    }

    /// Starts the servers of `run` services through `launcher`.
    pub fn with_launcher(mut self, launcher: Option<Launcher>) -> Self {
        self.launcher = launcher;
        self
    }

    /// Sessions currently running.
    pub fn live_sessions(&self) -> Vec<LiveSession> {
        let mut v: Vec<LiveSession> = self.live_map().values().cloned().collect();
        v.sort_by_key(|s| s.since);
        v
    }

    /// Ends every session `no_longer_admitted` picks: its pending requests are answered
    /// `-32052` and its child is stopped. Returns how many there were.
    pub fn sever_where(&self, no_longer_admitted: impl Fn(&LiveSession) -> bool) -> usize {
        let map = self.live_map();
        let hit: Vec<&LiveSession> = map.values().filter(|s| no_longer_admitted(s)).collect();
        for s in &hit {
            s.sever.cancel();
        }
        hit.len()
    }

    fn live_map(&self) -> std::sync::MutexGuard<'_, HashMap<u64, LiveSession>> {
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits for every session to end (after the shutdown token fired).
    pub async fn drain(&self) {
        self.sessions.close();
        self.sessions.wait().await;
    }

    fn entry(&self, name: &str) -> Option<ServiceEntry> {
        self.table
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
            .cloned()
    }
}

impl SessionHandler for ServiceHost {
    async fn handle(&self, peer: PeerIdentity, service: String, mut transport: MeshTransport) {
        let held = self.held_by(&peer);
        let now = held.current();
        let entry = self
            .entry(&service)
            .filter(|e| is_allowed(&e.spec.allow, &now));
        let Some(entry) = entry else {
            self.refuse_unknown(peer, service, &mut transport).await;
            return;
        };
        let sever = CancellationToken::new();
        let relist = Arc::new(Notify::new());
        let _guard = self.go_live(LiveSession {
            peer: peer.endpoint,
            peer_name: peer.name.clone(),
            service: service.clone(),
            since: crate::time::unix_ms(),
            sever: sever.clone(),
            tools: Arc::new(std::sync::Mutex::new(access(&entry.spec.tools, &now))),
            relist: relist.clone(),
        });
        let caller_gone = CancellationToken::new();
        let gone_watch = caller_gone_watch(&transport, caller_gone.clone());
        let session = SessionOptions {
            shutdown: self.shutdown.child_token(),
            sever,
            max_in_flight: entry.spec.max_in_flight as usize,
            tools: entry.tools.clone(),
            listed: entry.listed.clone(),
            request_timeout: entry.spec.request_timeout,
            caller_gone,
            held: Some(held),
            relist,
        };
        let ctx = ServiceCtx {
            service: service.clone(),
            concurrency: entry.sessions.clone(),
            audit: self.audit.clone(),
            limiter: entry.limiter.clone(),
        };
        let run = self.run_backend(&entry, ctx, &peer, transport, session);
        let run = async {
            tokio::select! {
                r = run => r,
                never = gone_watch => match never {},
            }
        };
        if let Err(e) = self.sessions.track_future(run).await {
            tracing::warn!(peer = %peer.name, %service, "session ended with an error: {e}");
        }
    }
}

impl ServiceHost {
    /// Refuses a session to a service that is unknown or that the caller may not use.
    async fn refuse_unknown(
        &self,
        peer: PeerIdentity,
        service: String,
        transport: &mut MeshTransport,
    ) {
        // Unknown and unauthorized look the same to the caller, on purpose.
        tracing::info!(peer = %peer.name, %service, "refused a session: unknown or unauthorized service");
        self.audit.record(AuditEvent::SessionRefused {
            service,
            principal: peer.principal(),
            peer: peer.name,
            code: ErrorCode::UnknownService.code(),
            reason: None,
        });
        refuse(transport, ErrorFrame::new(ErrorCode::UnknownService)).await;
    }

    /// Counts `session` among the live ones (the ones a trust change may sever) until the
    /// returned guard drops.
    fn go_live(&self, session: LiveSession) -> LiveGuard<'_> {
        let id = self
            .next_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.live_map().insert(id, session);
        LiveGuard { host: self, id }
    }

    /// Runs an admitted session on the backend `entry` names.
    async fn run_backend(
        &self,
        entry: &ServiceEntry,
        ctx: ServiceCtx,
        peer: &PeerIdentity,
        transport: MeshTransport,
        session: SessionOptions,
    ) -> Result<(), BackendError> {
        match &entry.spec.backend {
            BackendSpec::Run(cmd) => {
                let backend = SpawnBackend {
                    cmd: cmd.clone(),
                    concurrency: ctx.concurrency,
                    service: ctx.service,
                    audit: ctx.audit,
                    limiter: ctx.limiter,
                };
                let options = SpawnOptions {
                    env: entry.spec.env.clone(),
                    cwd: entry.spec.cwd.clone(),
                    session,
                    launcher: self.launcher.clone(),
                };
                backend
                    .run_session(Some(peer.clone()), None, transport, &options)
                    .await
            }
            BackendSpec::Socket {
                path,
                caller_assertion,
            } => {
                let backend = SocketBackend {
                    path: path.clone(),
                    ctx,
                    issuer: self.issuer.clone().filter(|_| *caller_assertion),
                };
                backend.run_session(peer.clone(), transport, &session).await
            }
            BackendSpec::Url {
                url: configured,
                headers,
                caller_header,
                oauth,
            } => match crate::config::validate_url(configured) {
                Ok(url) => {
                    let backend = UrlBackend {
                        url,
                        headers: headers.clone(),
                        ctx,
                        timeout: entry.spec.request_timeout,
                        caller: self.caller_assertion(configured, caller_header.as_deref()),
                        grants: self.grants.clone(),
                        oauth_required: oauth.is_some(),
                        configured: configured.clone(),
                    };
                    backend.run_session(peer.clone(), transport, &session).await
                }
                Err(message) => Err(BackendError::Upstream {
                    url: configured.clone(),
                    message,
                }),
            },
        }
    }
}

/// Fires `gone` when the caller stops reading the session's stream (a dialer whose client
/// went away stops it) or its connection is lost; never resolves itself.
fn caller_gone_watch(
    transport: &MeshTransport,
    gone: CancellationToken,
) -> impl Future<Output = std::convert::Infallible> + use<> {
    let stopped = transport.writer().stopped();
    async move {
        // `Ok(None)`: this side finished and the caller read everything, an ordinary end.
        if !matches!(stopped.await, Ok(None)) {
            gone.cancel();
        }
        std::future::pending().await
    }
}
