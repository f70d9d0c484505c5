//! The catalog on both sides: answering peers over `mcpmesh/catalog/1` (each for itself), and
//! keeping what this node's peers answered it, so `services`, `peers`, `use` and the hub know
//! what may be mounted without asking every peer each time.
//!
//! What peers answered is kept in memory and in `<state>/catalog.json` (rewritten only when an
//! answer differs from the last one): `services` answers from it at once and refreshes behind
//! the answers older than it was asked to accept; only a peer never asked is waited for, and
//! only while it is not known to be unreachable.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use iroh::EndpointId;
use iroh::endpoint::{Connection, VarInt};
use iroh::protocol::{AcceptError, ProtocolHandler};
use mcpmesh_net::TrustGate;
use mcpmesh_net::gate::CLOSE_UNKNOWN_PEER;
use mcpmesh_net::transport::FrameReader;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::audit::AuditEvent;
use crate::catalog::{self, Answer, Entry};

use super::catalogs::Catalogs;
use super::core::Core;

use super::catalogs::DEFAULT_MAX_AGE;

/// How long a reply waits for the peers it had to ask first.
const FIRST_ASK_WAIT: Duration = Duration::from_secs(3);
/// Peers asked at once.
const FETCH_AT_ONCE: usize = 32;

/// What `services` was asked.
#[derive(Debug, Default, Deserialize)]
pub(super) struct ServicesParams {
    /// Answers older than this (ms) are refreshed behind the reply.
    #[serde(default)]
    max_age_ms: Option<u64>,
    /// Wait for the refresh instead of answering from what is known.
    #[serde(default)]
    refresh: bool,
}

/// The catalog exchange: what this node answers its peers, and what they answered it.
#[derive(Debug)]
pub(super) struct Catalog {
    core: Arc<Core>,
    /// What this node's peers last answered when asked for their catalog.
    catalogs: Catalogs,
    me: std::sync::Weak<Catalog>,
}

impl Catalog {
    pub(super) fn new(core: Arc<Core>, catalogs: Catalogs) -> Arc<Catalog> {
        Arc::new_cyclic(|me| Catalog {
            core,
            catalogs,
            me: me.clone(),
        })
    }

    /// This node's catalog for `peer`, as the catalog ALPN answers it.
    pub(super) fn catalog_for(&self, peer: &mcpmesh_net::PeerIdentity) -> Vec<Entry> {
        use crate::principal::PrincipalSource;
        let held = self
            .core
            .gate
            .principals_of(&peer.endpoint)
            .unwrap_or_else(|| crate::principal::principal_set(peer, None).into());
        self.core
            .services
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .catalog_for(&held)
    }

    /// Every service this node may mount, across its peers: from what they last answered,
    /// asking the ones never asked (unless known unreachable) and refreshing the stale ones
    /// behind the reply.
    pub(super) async fn services_list(&self, params: ServicesParams) -> Value {
        let max_age = params
            .max_age_ms
            .map_or(DEFAULT_MAX_AGE, Duration::from_millis);
        let refreshing = self.refresh_catalogs(max_age, params.refresh).await;
        let table = self.core.gate.snapshot();
        let mut services = Vec::new();
        let mut unanswered = Vec::new();
        let mut refused = Vec::new();
        for p in table.all() {
            let Some((entries, failed)) = self.catalogs.of(&p.id) else {
                unanswered.push(p.name.clone());
                continue;
            };
            if self.catalogs.refused(&p.id) {
                refused.push(p.name.clone());
            } else if failed {
                unanswered.push(p.name.clone());
            }
            let reachable = !failed && self.core.reach.get(&p.id).is_none_or(|s| s.reachable);
            for e in entries {
                services.push(json!({
                    "mount": format!("{}/{}", p.name, e.service),
                    "peer": p.name,
                    "service": e.service,
                    "description": e.description,
                    "tools": e.tools,
                    "backend": e.backend,
                    "reachable": reachable,
                    "admitted_by": e.admitted_by,
                }));
            }
        }
        // Peers whose catalog is not known now: their entries (if any) are the last known.
        // Peers whose last answer was refused (over the cap, malformed): likewise.
        // `refreshing`: answers older than `max_age` are being asked again behind this reply.
        json!({
            "services": services,
            "unanswered": unanswered,
            "refused": refused,
            "refreshing": refreshing,
        })
    }

    /// Brings the peers' catalogs up to date for a reply: asks (and waits for) the peers never
    /// asked or that never answered, or all of them with `now`, except those known not to
    /// answer; asks the ones answered longer than `max_age` ago behind the reply. Returns
    /// whether answers are being refreshed behind the reply.
    pub(super) async fn refresh_catalogs(&self, max_age: Duration, now: bool) -> bool {
        let table = self.core.gate.snapshot();
        let since = crate::time::unix_ms();
        let mut wait_for = Vec::new();
        let mut behind = Vec::new();
        for p in table.all() {
            // When it last answered, and whether it never did (it refused this node, which
            // may trust this node by now, or could not be reached): nothing to show yet.
            let known = self.catalogs.known().get(&p.id).map(|k| {
                let never = k.answered_at == 0 && k.failed.is_some() && k.services.is_empty();
                (k.answered_at, never)
            });
            // Known not to answer at all; a peer that refused this node did answer, and
            // asking it again costs a round trip.
            let down = self.core.reach.get(&p.id).is_some_and(|s| s.silent());
            match known {
                // A peer never asked is asked now even when the last check found it down (that
                // check may predate its trust in this node); the reply waits for it a moment.
                None => wait_for.push(p.id),
                // So is one that never answered, unless it is known not to answer at all.
                Some((_, true)) if !down => wait_for.push(p.id),
                _ if now && !down => wait_for.push(p.id),
                Some((at, false)) if since.saturating_sub(at) < max_age.as_millis() as u64 => {}
                _ => behind.push(p.id),
            }
        }
        let Some(catalog) = self.me.upgrade() else {
            return false;
        };
        if !wait_for.is_empty() {
            let asking = {
                let catalog = catalog.clone();
                tokio::spawn(async move { catalog.ask_catalogs(wait_for).await })
            };
            // What is not answered by then is kept when it comes, for the next reply; a
            // refresh waits for every answer (each bounded by the exchange's own timeout).
            let wait = if now {
                catalog::EXCHANGE_TIMEOUT + Duration::from_secs(1)
            } else {
                FIRST_ASK_WAIT
            };
            let _ = tokio::time::timeout(wait, asking).await;
        }
        let refreshing = !behind.is_empty();
        if refreshing {
            tokio::spawn(async move { catalog.ask_catalogs(behind).await });
        }
        refreshing
    }

    /// Asks each of `peers` (not already being asked) for its catalog, some at a time.
    pub(super) async fn ask_catalogs(&self, peers: Vec<EndpointId>) {
        let peers: Vec<EndpointId> = {
            let mut asking = self
                .catalogs
                .asking
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            peers.into_iter().filter(|p| asking.insert(*p)).collect()
        };
        if peers.is_empty() {
            return;
        }
        let mut changed = false;
        for chunk in peers.chunks(FETCH_AT_ONCE) {
            let answers = futures_util::future::join_all(chunk.iter().map(|&peer| async move {
                (peer, catalog::fetch(&self.core.endpoint, peer).await)
            }))
            .await;
            for (peer, answer) in answers {
                match &answer {
                    Err(e @ catalog::CatalogError::Invalid(_)) => self.refused_catalog(peer, e),
                    Err(e) => tracing::debug!(peer = %peer.fmt_short(), "no catalog: {e}"),
                    Ok(_) => {}
                }
                changed |= self.catalogs.keep(peer, &answer);
            }
        }
        {
            let mut asking = self
                .catalogs
                .asking
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            for p in &peers {
                asking.remove(p);
            }
        }
        let trusted: HashSet<EndpointId> = self
            .core
            .gate
            .snapshot()
            .all()
            .iter()
            .map(|p| p.id)
            .collect();
        changed |= self.catalogs.retain(&trusted);
        if changed {
            self.save_catalogs().await;
        }
    }

    /// `peer` answered with a catalog this node refused (over the cap, malformed): its last
    /// known entries stay, and the audit log says so (at most once a minute per peer), since
    /// only a faulty or hostile node sends one.
    fn refused_catalog(&self, peer: EndpointId, e: &catalog::CatalogError) {
        tracing::warn!(peer = %peer.fmt_short(), "refused a catalog answer: {e}");
        let principal = format!("eid:{peer}");
        if self.catalogs.record_refusal(&principal) {
            self.core.audit.record(AuditEvent::CatalogRefused {
                principal,
                peer: self.core.name_of(&peer),
                reason: format!("its answer: {e}"),
            });
        }
    }

    async fn save_catalogs(&self) {
        let file = self.catalogs.file.clone();
        let Ok(bytes) = serde_json::to_vec(&self.catalogs.snapshot()) else {
            return;
        };
        // On the writer, in order: a later snapshot is never overwritten by an earlier one.
        let written = self
            .core
            .disk
            .run(move || crate::files::write_atomically_unsynced(&file, &bytes))
            .await;
        if let Some(Err(e)) = written {
            tracing::warn!("cannot write {}: {e}", self.catalogs.file.display());
        }
    }

    /// Whether `peer` ever answered this node's ask for its catalog.
    pub(super) fn has_answered(&self, peer: &EndpointId) -> bool {
        self.catalogs.known().contains_key(peer)
    }

    /// The services `peer`'s last catalog answer lists, by name (`None`: never answered).
    pub(super) fn mountable_on(&self, peer: &EndpointId) -> Option<Vec<String>> {
        self.catalogs
            .of(peer)
            .map(|(entries, _)| entries.into_iter().map(|e| e.service).collect())
    }
}

/// The `mcpmesh/catalog/1` handler: gated like every mesh ALPN; answers the asking peer for
/// itself, one request per connection.
#[derive(Debug)]
pub(super) struct CatalogProtocol<G> {
    catalog: Arc<Catalog>,
    gate: Arc<G>,
}

impl<G> CatalogProtocol<G> {
    pub(super) fn new(catalog: Arc<Catalog>, gate: Arc<G>) -> Self {
        CatalogProtocol { catalog, gate }
    }
}

impl<G: TrustGate + std::fmt::Debug> ProtocolHandler for CatalogProtocol<G> {
    async fn accept(&self, conn: Connection) -> Result<(), AcceptError> {
        let peer = conn.remote_id();
        let Some(identity) = self.gate.resolve(&peer) else {
            conn.close(VarInt::from_u32(CLOSE_UNKNOWN_PEER), b"unknown peer");
            self.gate.refused(&peer);
            return Ok(());
        };
        let exchange = async {
            let (mut send, recv) = conn.accept_bi().await.ok()?;
            let mut frames = FrameReader::new(recv, catalog::MAX_REQUEST);
            let refusal = match frames.next_line().await {
                Ok(Some(line)) => catalog::read_request(&line).err(),
                Ok(None) => return None,
                Err(_) => Some(format!(
                    "a catalog request is one line of at most {} bytes",
                    catalog::MAX_REQUEST
                )),
            };
            let principal = identity.principal();
            let refusal = refusal.or_else(|| {
                self.catalog
                    .catalogs
                    .limiter
                    .check("catalog", &principal)
                    .err()
                    .map(|wait| {
                        format!(
                            "too many catalog requests; ask again in {} ms",
                            wait.as_millis()
                        )
                    })
            });
            let answer = match refusal {
                Some(reason) => {
                    if self.catalog.catalogs.record_refusal(&principal) {
                        self.catalog.core.audit.record(AuditEvent::CatalogRefused {
                            principal,
                            peer: identity.name.clone(),
                            reason: reason.clone(),
                        });
                    }
                    Answer {
                        services: Vec::new(),
                        error: Some(reason),
                    }
                }
                None => Answer {
                    services: self.catalog.catalog_for(&identity),
                    error: None,
                },
            };
            let mut line = serde_json::to_vec(&answer).ok()?;
            line.push(b'\n');
            send.write_all(&line).await.ok()?;
            send.finish().ok()?;
            Some(())
        };
        if tokio::time::timeout(catalog::EXCHANGE_TIMEOUT, exchange)
            .await
            .ok()
            .flatten()
            .is_some()
        {
            // The asker closes the connection once it has read the answer.
            let _ = tokio::time::timeout(catalog::EXCHANGE_TIMEOUT, conn.closed()).await;
        }
        Ok(())
    }
}
