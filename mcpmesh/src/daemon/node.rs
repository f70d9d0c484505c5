//! The composition root's front: the node as the control API sees it, a few services wired
//! together (the shared [`Core`], [`Trust`], [`Catalog`], [`Org`], [`Status`]), and the
//! dispatch of each control method to the service that owns it.

use std::sync::Arc;

use mcpmesh_net::session::{DialError, OpenedSession, valid_service_name};
use serde_json::{Value, json};

use crate::audit::AuditEvent;
use crate::control::server::{ControlHandler, Reply};
use crate::control::{ControlError, SessionOpen, codes, methods};
use crate::proxy;
use crate::telemetry::Dialed;

use super::catalog::Catalog;
use super::core::{Core, params_of, stopping};
use super::org::Org;
use super::status::Status;
use super::trust::Trust;

/// The running node: its services, each owning its own state.
#[derive(Debug, Clone)]
pub(super) struct Node {
    pub(super) core: Arc<Core>,
    pub(super) trust: Arc<Trust>,
    pub(super) catalog: Arc<Catalog>,
    pub(super) org: Arc<Org>,
    pub(super) status: Arc<Status>,
}

impl Node {
    fn node_id_result(&self) -> Value {
        json!({ "id": self.core.endpoint.id().to_string(), "addrs": self.core.direct_addrs() })
    }

    async fn open_session(&self, open: &SessionOpen) -> Result<OpenedSession, ControlError> {
        let peer = self
            .core
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
        // A peer whose last check failed is refused at once, unless a connection to it is
        // open: its sessions are the better witness (a ping can time out under their load),
        // and opening on it checks the peer is there.
        if let Some(age) = self.core.reach.recently_down(&peer.id)
            && !self.core.dialer.is_connected(&peer.id)
        {
            return Err(ControlError::new(
                codes::UNREACHABLE,
                format!(
                    "{} is unreachable (it did not answer {:.0} s ago); the node keeps trying, try again in a few seconds",
                    open.peer,
                    age.as_secs_f64().ceil()
                ),
            ));
        }
        let fresh = !self.core.dialer.is_connected(&peer.id);
        let opened = self.core.dialer.open(peer.id, &open.service).await;
        match &opened {
            Ok(_) => {
                self.core.reach.record(peer.id, true);
                self.core.reach.poke();
                // Two members that just connected compare rosters.
                if fresh && peer.user.is_some() {
                    self.org.sync_soon(peer.id);
                }
            }
            Err(DialError::Refused) => {}
            Err(_) => self.core.reach.record(peer.id, false),
        }
        opened.map_err(|e| ControlError::new(e.error_code().code(), format!("{}: {e}", open.peer)))
    }
}

/// The verbs that change the store, config.toml or the org's files: each runs whole on the
/// node's writer ([`crate::disk`]).
const WRITING_VERBS: [&str; 14] = [
    methods::PEERS_ADD,
    methods::PEERS_RENAME,
    methods::PEERS_REMOVE,
    methods::GRANT,
    methods::REVOKE,
    methods::INVITE,
    methods::SERVICES_SERVE,
    methods::SERVICES_UNSERVE,
    methods::ORG_CREATE,
    methods::ORG_INVITE,
    methods::ORG_REMOVE,
    methods::ORG_GROUPS,
    methods::ORG_EXPORT_ROOT,
    methods::ORG_IMPORT_ROOT,
];

impl Node {
    /// A writing verb, run on the writer (after the relay wait of the verbs that hand out
    /// this node's address).
    async fn call_writing(&self, method: &str, params: Value) -> Result<Value, ControlError> {
        if [methods::INVITE, methods::ORG_CREATE, methods::ORG_INVITE].contains(&method) {
            self.core.home_relay_settled().await;
        }
        let method = method.to_owned();
        let node = self.clone();
        self.core
            .disk
            .run(move || node.writing_verb(&method, params))
            .await
            .unwrap_or_else(|| Err(stopping()))
    }

    fn writing_verb(&self, method: &str, params: Value) -> Result<Value, ControlError> {
        match method {
            methods::PEERS_ADD => self.trust.peers_add(params),
            methods::PEERS_RENAME => self.trust.peers_rename(params),
            methods::PEERS_REMOVE => self.trust.peers_remove(params),
            methods::GRANT => self.trust.grant(params),
            methods::REVOKE => self.trust.revoke(params),
            methods::INVITE => self.trust.invite(params),
            methods::SERVICES_SERVE => super::serving::serve(&self.core, params),
            methods::SERVICES_UNSERVE => super::serving::unserve(&self.core, params),
            methods::ORG_CREATE => self.org.org_create(params),
            methods::ORG_INVITE => self.org.org_invite(params),
            methods::ORG_REMOVE => self.org.org_remove(params),
            methods::ORG_GROUPS => self.org.org_groups(params),
            methods::ORG_EXPORT_ROOT => self.org.org_export_root(params),
            methods::ORG_IMPORT_ROOT => self.org.org_import_root(params),
            other => Err(ControlError::new(
                codes::UNKNOWN_METHOD,
                format!("unknown method {other:?}"),
            )),
        }
    }
}

impl ControlHandler for Node {
    async fn call(&self, method: &str, params: Value) -> Result<Reply, ControlError> {
        if WRITING_VERBS.contains(&method) {
            return self.call_writing(method, params).await.map(Reply::Value);
        }
        let value = match method {
            methods::NODE_ID => self.node_id_result(),
            methods::PEERS_LIST => self.status.peers_list().await,
            methods::SERVICES_LIST => self.catalog.services_list(params_of(params)?).await,
            methods::PAIR => self.trust.pair(params).await?,
            methods::STATUS => self.status.status().await,
            methods::STATUS_WEB => self.status.status_web().await?,
            methods::AUDIT_VERIFY => self.status.audit_verify().await?,
            methods::ORG_JOIN => self.org.org_join(params).await?,
            methods::ORG_MEMBERS => self.org.org_members()?,
            methods::ORG_STATUS => self.org.org_status().await?,
            methods::SESSION_OPEN => {
                let open: SessionOpen = params_of(params)?;
                let session = self.open_session(&open).await?;
                // An opener that passes its descriptors may pass a memory file for the set of
                // unanswered requests too (see `proxy::pass_stdio`).
                let ledger = open.attach == crate::control::Attach::Fds;
                return Ok(Reply::Tunnel(
                    json!({ "opened": true, "ledger": ledger }),
                    Box::new(session),
                    open,
                ));
            }
            methods::WATCH => {
                let events = self.core.audit.subscribe().ok_or_else(|| {
                    ControlError::new(codes::NODE_UNAVAILABLE, "this node records no events")
                })?;
                return Ok(Reply::Stream(json!({ "watching": true }), events));
            }
            methods::NODE_SHUTDOWN => {
                self.core.stop_sessions().await;
                return Ok(Reply::ThenStop(json!({ "stopped": true })));
            }
            other => {
                return Err(ControlError::new(
                    codes::UNKNOWN_METHOD,
                    format!("unknown method {other:?}"),
                ));
            }
        };
        Ok(Reply::Value(value))
    }

    async fn tunnel(&self, local: proxy::LocalSide, session: OpenedSession, open: SessionOpen) {
        let since = crate::time::unix_ms();
        let key = self.status.session_opened(&open.peer, &open.service, since);
        self.core.audit.record(AuditEvent::OutgoingOpen {
            peer: open.peer.clone(),
            service: open.service.clone(),
        });
        let dialed = Dialed::new(
            self.core.audit.metrics(),
            self.core.audit.traces(),
            &open.peer,
            &session.connection.remote_id().to_string(),
            &open.service,
        );
        let ending = proxy::tunnel(local, session, self.core.shutdown.child_token(), dialed).await;
        self.status.session_closed(key);
        self.core.audit.record(AuditEvent::OutgoingClose {
            peer: open.peer,
            service: open.service,
            duration_ms: crate::time::unix_ms().saturating_sub(since),
            ended: if ending.code.is_some() {
                "failed"
            } else {
                "ok"
            }
            .to_owned(),
            reason: ending.code.map(|_| ending.message),
            code: ending.code,
        });
    }

    fn node_id(&self) -> String {
        self.core.endpoint.id().to_string()
    }

    fn dial_timeout(&self) -> std::time::Duration {
        self.core.settings().dial_timeout
    }
}
