//! The verbs that change whom this node trusts: static peers, renames and removals, grants,
//! and pairing (minting invites, redeeming them, answering redemptions).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use iroh::endpoint::{Connection, VarInt};
use iroh::protocol::{AcceptError, ProtocolHandler};
use iroh::{EndpointAddr, EndpointId, RelayUrl};
use mcpmesh_net::session::valid_service_name;
use mcpmesh_net::transport::NdjsonTransport;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;

use crate::config::{self, parse_endpoint_id};
use crate::control::{ControlError, codes};
use crate::pairing::{self, ALPN_PAIR, Invite, PairHello, PairReply};
use crate::peers::valid_peer_name;
use crate::principal::{Principal, is_allowed};
use crate::store::{Pairing, Redeemed, StoredInvite, StoredPeer};
use crate::time::unix_ms;
use mcpmesh_net::ping::{PingOutcome, ping_outcome};

use super::core::Core;
use super::core::{params_of, stopping};
use super::exchange::{Exchange, Wire, next_message, offered_addrs, send_message};

fn bad(message: impl Into<String>) -> ControlError {
    ControlError::invalid_params(message)
}

/// A name the user gives a peer. A name with a `.` is refused: it is how the org roster
/// names a member's device (`USER.DEVICE`), and a peer under it would take that device's calls.
fn check_name(name: &str) -> Result<(), ControlError> {
    if name.contains('.') && valid_service_name(name) {
        return Err(bad(format!(
            "{name:?}: a peer name may not contain '.', which the org roster keeps for its USER.DEVICE names; try {:?}",
            name.replace('.', "-")
        )));
    }
    if valid_peer_name(name) {
        Ok(())
    } else {
        Err(bad(format!(
            "{name:?}: a peer name is 1-64 letters, digits, '_' or '-'"
        )))
    }
}

/// A name from someone else's suggestion: the allowed characters only (a `.` becomes a
/// `-`: dotted names are the roster's), never empty.
fn sanitize(name: Option<&str>, fallback: &str) -> String {
    let clean: String = name
        .unwrap_or_default()
        .chars()
        .map(|c| match c.to_ascii_lowercase() {
            '.' => '-',
            c => c,
        })
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-'))
        .skip_while(|c| !c.is_ascii_alphanumeric())
        .take(32)
        .collect();
    if clean.is_empty() {
        fallback.to_owned()
    } else {
        clean
    }
}

/// The name a pairing gives the inviter: one the user chose with `--name`, or one the
/// invite suggests (made free if taken).
enum WantedName {
    Chosen(String),
    Suggested(String),
}

/// Where the inviter may be reached: the addresses and relay its invite names.
fn inviter_hint(inviter: EndpointId, invite: &Invite) -> EndpointAddr {
    let mut hint = EndpointAddr::new(inviter);
    for a in invite
        .addrs
        .iter()
        .filter_map(|a| a.parse::<SocketAddr>().ok())
    {
        hint = hint.with_ip_addr(a);
    }
    if let Some(relay) = invite
        .relay
        .as_deref()
        .and_then(|u| u.parse::<RelayUrl>().ok())
    {
        hint = hint.with_relay_url(relay);
    }
    hint
}

/// Whom this node trusts: static peers, pairing and grants. Held while a pairing picks a
/// name for a new peer and stores it, `naming` keeps two pairings from taking one name.
#[derive(Debug)]
pub(super) struct Trust {
    core: Arc<Core>,
    naming: tokio::sync::Mutex<()>,
    me: std::sync::Weak<Trust>,
}

impl Trust {
    pub(super) fn new(core: Arc<Core>) -> Arc<Trust> {
        Arc::new_cyclic(|me| Trust {
            core,
            naming: Default::default(),
            me: me.clone(),
        })
    }

    /// Runs `job` on the node's writer, where every store and config write is made.
    async fn on_disk<T: Send + 'static>(
        &self,
        job: impl FnOnce(&Trust) -> T + Send + 'static,
    ) -> Option<T> {
        self.core.on_disk_as(&self.me, job).await
    }

    /// A name for `id`: its current one if known, else `wanted` or the first free one of
    /// `wanted-2`, `wanted-3`… Free means no peer has it and no `allow` mentions it: a new
    /// peer under a name an `allow` already holds would get that access unasked.
    fn name_for(&self, id: &EndpointId, wanted: &str) -> String {
        let table = self.core.gate.snapshot();
        if let Some(p) = table.by_id(id) {
            return p.name.clone();
        }
        let taken = |name: &str| table.by_name(name).is_some() || self.allow_naming(name).is_some();
        let mut name = wanted.to_owned();
        let mut n = 2;
        while taken(&name) {
            name = format!("{wanted}-{n}");
            n += 1;
        }
        name
    }

    /// The first service whose `allow` names the peer `name` (as `NAME` or `peer:NAME`).
    fn allow_naming(&self, name: &str) -> Option<String> {
        self.core
            .settings()
            .services
            .iter()
            .find(|s| s.allow.iter().any(|p| p.is_peer_named(name)))
            .map(|s| s.name.clone())
    }

    fn peer_by_name(&self, name: &str) -> Result<crate::peers::KnownPeer, ControlError> {
        self.core
            .gate
            .snapshot()
            .by_name(name)
            .cloned()
            .ok_or_else(|| {
                ControlError::new(
                    codes::NOT_FOUND,
                    format!("no peer named {name:?}; see `mcpmesh peers`"),
                )
            })
    }

    /// A peer known from the org roster only is the admin's to rename or remove.
    fn refuse_roster_only(&self, peer: &crate::peers::KnownPeer) -> Result<(), ControlError> {
        if peer.source == crate::peers::Source::Roster {
            return Err(ControlError::new(
                codes::CONFLICT,
                format!(
                    "{} is known from the org roster; only the org's admin node can change that (mcpmesh org remove / org groups)",
                    peer.name
                ),
            ));
        }
        Ok(())
    }

    /// The name of the `[peers]` entry that holds `id`: the peer's name here, unless it gave
    /// that name up to a roster member's `USER.DEVICE`.
    fn static_name(&self, id: &EndpointId) -> Option<String> {
        self.core
            .settings()
            .peers
            .iter()
            .find(|p| p.id == *id)
            .map(|p| p.name.clone())
    }

    fn stored_peer(&self, id: &EndpointId) -> Option<StoredPeer> {
        let hex = id.to_string();
        self.core
            .store
            .peers()
            .ok()?
            .into_iter()
            .find(|p| p.id == hex)
    }

    pub(super) fn peers_add(&self, params: Value) -> Result<Value, ControlError> {
        #[derive(Deserialize)]
        struct Add {
            name: String,
            id: String,
            #[serde(default)]
            addrs: Vec<String>,
        }
        let add: Add = params_of(params)?;
        check_name(&add.name)?;
        let id = parse_endpoint_id(&add.id)
            .ok_or_else(|| bad(format!("{:?} is not an endpoint id", add.id)))?;
        if id == self.core.endpoint.id() {
            return Err(bad("that is this node's own id"));
        }
        let table = self.core.gate.snapshot();
        if let Some(other) = table.by_id(&id).filter(|p| p.name != add.name) {
            return Err(ControlError::new(
                codes::CONFLICT,
                format!("this key is already trusted as {}", other.name),
            ));
        }
        if table.by_name(&add.name).is_some_and(|p| p.id != id) {
            return Err(ControlError::new(
                codes::CONFLICT,
                format!("the name {} is taken by another key", add.name),
            ));
        }
        let addrs = parse_addrs(&add.addrs)?;
        self.core
            .edit(|doc| config::set_peer(doc, &add.name, &id, &addrs))?;
        self.core.trust_event("peer_added", Some(&add.name), None);
        Ok(json!({ "peer": add.name, "id": id.to_string() }))
    }

    pub(super) fn peers_rename(&self, params: Value) -> Result<Value, ControlError> {
        #[derive(Deserialize)]
        struct Rename {
            old: String,
            new: String,
        }
        let r: Rename = params_of(params)?;
        check_name(&r.new)?;
        let peer = self.peer_by_name(&r.old)?;
        self.refuse_roster_only(&peer)?;
        if r.old == r.new {
            return Ok(json!({ "peer": r.new, "id": peer.id.to_string() }));
        }
        if self.core.gate.snapshot().by_name(&r.new).is_some() {
            return Err(ControlError::new(
                codes::CONFLICT,
                format!("the name {} is taken", r.new),
            ));
        }
        let in_config = self.static_name(&peer.id);
        // The store first: the edit below is applied with the peer already under its new name,
        // so grants by name, renamed in the same edit, never stop admitting its sessions.
        if let Some(mut stored) = self.stored_peer(&peer.id) {
            stored.name = r.new.clone();
            self.core.store.put_peer(&stored, None).map_err(store_err)?;
        }
        // Grants by name follow the peer; grants by key need nothing.
        self.core.edit(|doc| {
            if let Some(name) = &in_config {
                config::rename_peer(doc, name, &r.new)?;
            }
            config::rename_allow(doc, &r.old, &r.new)
        })?;
        self.core.trust_event("peer_renamed", Some(&r.new), None);
        Ok(json!({ "peer": r.new, "id": peer.id.to_string(), "was": r.old }))
    }

    pub(super) fn peers_remove(&self, params: Value) -> Result<Value, ControlError> {
        #[derive(Deserialize)]
        struct Remove {
            name: String,
        }
        let r: Remove = params_of(params)?;
        let peer = self.peer_by_name(&r.name)?;
        self.refuse_roster_only(&peer)?;
        let principals = [Principal::eid(&peer.id), Principal::peer(&r.name)];
        let in_config = self.static_name(&peer.id);
        if self.stored_peer(&peer.id).is_some() {
            self.core
                .store
                .remove_peer(&peer.id.to_string())
                .map_err(store_err)?;
        }
        // Applying the edit severs the peer's connections and sessions at once.
        self.core.edit(|doc| {
            if let Some(name) = &in_config {
                config::remove_peer(doc, name)?;
            }
            config::remove_allow_everywhere(doc, &principals)
        })?;
        self.core.trust_event("peer_removed", Some(&r.name), None);
        Ok(json!({ "peer": r.name, "removed": true }))
    }

    /// Whom a grant names: a peer of this node by name (or `peer:NAME`), whose key is what
    /// is written, or any other principal, written as given. The peer is returned when the
    /// principal is one of this node's peers.
    fn grantee(
        &self,
        text: &str,
    ) -> Result<(Principal, Option<crate::peers::KnownPeer>), ControlError> {
        let principal: Principal = text.parse().map_err(|e| bad(format!("{e}")))?;
        Ok(match principal {
            Principal::Peer(name) => {
                let peer = self.peer_by_name(&name)?;
                (Principal::eid(&peer.id), Some(peer))
            }
            Principal::Eid(key) => {
                let peer = EndpointId::from_bytes(&key)
                    .ok()
                    .and_then(|id| self.core.gate.snapshot().by_id(&id).cloned());
                (Principal::Eid(key), peer)
            }
            other => (other, None),
        })
    }

    /// Why an org principal granted here matches nobody yet, if it does not.
    fn unmatched_org_principal(&self, principal: &Principal) -> Option<String> {
        let org = self.core.roster().map(|v| v.roster().org.clone());
        match (principal, org) {
            (Principal::User(_) | Principal::Group(_) | Principal::Org(_), None) => Some(format!(
                "{principal} matches nobody until this node joins an org (`mcpmesh join`)"
            )),
            (Principal::Org(name), Some(org)) if *name != org => Some(format!(
                "{principal} matches nobody: this node's org is {org}"
            )),
            _ => None,
        }
    }

    /// Lets `principal` use a service; with `tools`, adds those to its own tool rule, placed
    /// first.
    pub(super) fn grant(&self, params: Value) -> Result<Value, ControlError> {
        let g: Grant = params_of(params)?;
        let (key, peer) = self.grantee(&g.peer)?;
        self.require_service(&g.service)?;
        let tools = g.tools.as_deref().map(tool_patterns).transpose()?;
        // The first rule of a service narrows every admitted caller it does not name to no
        // tool: the answer says so, for the one who may not expect it.
        let first_rule = tools.is_some()
            && self
                .core
                .settings()
                .services
                .iter()
                .any(|s| s.name == g.service && s.tools.is_empty());
        self.core.edit(|doc| {
            config::add_allow(doc, &g.service, &key)?;
            match &tools {
                Some(allow) => config::grant_own_tools(doc, &g.service, &key, allow),
                None => Ok(()),
            }
        })?;
        let action = if tools.is_some() {
            "grant_tools"
        } else {
            "grant"
        };
        self.core
            .trust_event(action, Some(&g.peer), Some(&g.service));
        let mut answer = json!({
            "peer": g.peer,
            "principal": key.to_string(),
            "service": g.service,
            "granted": true,
            "tools": self.tool_access(&key, peer.as_ref(), &g.service),
        });
        let mut warnings = Vec::new();
        warnings.extend(self.unmatched_org_principal(&key));
        if first_rule {
            warnings.push(format!(
                "{} had no tool rules: now a caller no rule names may use none of its tools (give others theirs with `grant PRINCIPAL {} --tools …`, or add a rule for them in config.toml)",
                g.service, g.service
            ));
        }
        if !warnings.is_empty() {
            answer["warning"] = json!(warnings.join("; "));
        }
        Ok(answer)
    }

    /// Takes `principal`'s access to a service away; with `tools`, only those tools (a deny
    /// in its own rule), and the grant stays.
    pub(super) fn revoke(&self, params: Value) -> Result<Value, ControlError> {
        let g: Grant = params_of(params)?;
        let (key, peer) = self.grantee(&g.peer)?;
        self.require_service(&g.service)?;
        let mut principals = vec![key.clone()];
        if let Some(peer) = &peer {
            principals.push(Principal::peer(&peer.name));
        }
        let ended = match g.tools.as_deref().map(tool_patterns).transpose()? {
            Some(deny) => {
                let ended = self
                    .core
                    .edit(|doc| config::deny_own_tools(doc, &g.service, &key, &deny))?;
                self.core
                    .trust_event("revoke_tools", Some(&g.peer), Some(&g.service));
                ended
            }
            None => {
                let ended = self
                    .core
                    .edit(|doc| config::remove_allow(doc, &g.service, &principals).map(drop))?;
                self.core
                    .trust_event("revoke", Some(&g.peer), Some(&g.service));
                ended
            }
        };
        // Access may remain through a user or group entry; say so rather than pretend.
        let held = match &peer {
            Some(peer) => peer.principals(),
            None => vec![key.clone()],
        };
        let still = self
            .core
            .services
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&g.service)
            .is_some_and(|e| is_allowed(&e.spec.allow, &held));
        Ok(json!({
            "peer": g.peer,
            "principal": key.to_string(),
            "service": g.service,
            "granted": still,
            "sessions_ended": ended,
            "tools": self.tool_access(&key, peer.as_ref(), &g.service),
        }))
    }

    /// The tools `principal` may use on `service` now (`null` when it may not open it): for
    /// a peer, with everything it holds here; otherwise as a caller named by it alone.
    fn tool_access(
        &self,
        principal: &Principal,
        peer: Option<&crate::peers::KnownPeer>,
        service: &str,
    ) -> Value {
        let held = match peer {
            Some(peer) => peer.principals(),
            None => vec![principal.clone()],
        };
        let table = self.core.services.read().unwrap_or_else(|p| p.into_inner());
        json!(table.tools_for(&held).get(service))
    }

    fn require_service(&self, name: &str) -> Result<(), ControlError> {
        if self.core.settings().services.iter().any(|s| s.name == name) {
            Ok(())
        } else {
            Err(ControlError::new(
                codes::NOT_FOUND,
                format!("no service named {name:?}; see `mcpmesh status`"),
            ))
        }
    }

    pub(super) fn invite(&self, params: Value) -> Result<Value, ControlError> {
        #[derive(Deserialize)]
        struct Mint {
            services: Vec<String>,
            #[serde(default)]
            uses: Option<u32>,
            #[serde(default)]
            ttl_secs: Option<u64>,
        }
        let m: Mint = params_of(params)?;
        if m.services.is_empty() {
            return Err(bad("name at least one service to share"));
        }
        for s in &m.services {
            self.require_service(s)?;
        }
        let uses = m.uses.unwrap_or(1);
        if !(1..=pairing::MAX_USES).contains(&uses) {
            return Err(bad(format!("--uses must be 1 to {}", pairing::MAX_USES)));
        }
        let ttl = Duration::from_secs(m.ttl_secs.unwrap_or(pairing::DEFAULT_TTL.as_secs()));
        if ttl.is_zero() || ttl > pairing::MAX_TTL {
            return Err(bad("--ttl must be between 1s and 7d"));
        }
        let secret = pairing::new_secret()
            .map_err(|e| ControlError::new(codes::NODE_UNAVAILABLE, e.to_string()))?;
        let expires_at = unix_ms() / 1000 + ttl.as_secs();
        let stored = StoredInvite {
            secret,
            services: m.services.clone(),
            expires_at,
            uses_left: uses,
            failures: 0,
        };
        let iid = pairing::new_invite_id()
            .map_err(|e| ControlError::new(codes::NODE_UNAVAILABLE, e.to_string()))?;
        self.core
            .store
            .put_invite(&iid, &stored)
            .map_err(store_err)?;
        self.core.update_alpns();
        let invite = Invite {
            v: 1,
            id: self.core.endpoint.id().to_string(),
            iid,
            addrs: self.core.direct_addrs(),
            relay: self.core.home_relay(),
            secret: pairing::encode_secret(&secret),
            services: m.services.clone(),
            exp: expires_at,
            uses,
            nick: self.core.settings().nickname.clone(),
        };
        self.core.trust_event("invite", None, None);
        Ok(
            json!({ "invite": invite.encode(), "expires_at": expires_at, "services": m.services, "uses": uses }),
        )
    }

    pub(super) async fn pair(&self, params: Value) -> Result<Value, ControlError> {
        #[derive(Deserialize)]
        struct Redeem {
            invite: String,
            #[serde(default)]
            name: Option<String>,
        }
        let r: Redeem = params_of(params)?;
        let invite = Invite::decode(&r.invite).map_err(|e| bad(e.to_string()))?;
        let (Some(inviter), Some(secret)) = (invite.endpoint(), invite.secret_bytes()) else {
            return Err(bad("this invite is damaged"));
        };
        if inviter == self.core.endpoint.id() {
            return Err(bad("this is one of this node's own invites"));
        }
        if invite.exp <= unix_ms() / 1000 {
            return Err(ControlError::new(
                codes::REFUSED,
                format!(
                    "this invite expired at {} UTC; ask for a new one",
                    crate::time::format_time(invite.exp * 1000)
                ),
            ));
        }
        let wanted = match r.name {
            Some(n) => {
                self.check_chosen_name(&n, &inviter)?;
                WantedName::Chosen(n)
            }
            None => WantedName::Suggested(sanitize(invite.nick.as_deref(), "peer")),
        };
        self.core
            .dialer
            .add_address_hint(inviter_hint(inviter, &invite));

        let hello = PairHello {
            pair: 1,
            invite: invite.iid.clone(),
            proof: pairing::proof(&secret, &inviter, &self.core.endpoint.id()),
            nick: self.core.settings().nickname.clone(),
            addrs: self.core.direct_addrs(),
        };
        let (pending, services) = self
            .pair_through_inviter(inviter, &invite, &hello, wanted)
            .await?;
        self.on_disk(move |trust| trust.confirm_paired(inviter, &secret, pending, &services))
            .await
            .unwrap_or_else(|| Err(stopping()))
    }

    /// The pairing's exchange with the inviter: the hello, then, once the inviter is stored
    /// here as a pending peer, the commit. Returns that peer and the services it shares.
    async fn pair_through_inviter(
        &self,
        inviter: EndpointId,
        invite: &Invite,
        hello: &PairHello,
        wanted: WantedName,
    ) -> Result<(StoredPeer, Vec<String>), ControlError> {
        let limit = self.core.settings().dial_timeout + pairing::EXCHANGE_TIMEOUT;
        let unanswered =
            || ControlError::new(codes::UNREACHABLE, "the inviter did not answer in time");
        let open = Exchange::open(
            &self.core.endpoint,
            inviter,
            ALPN_PAIR,
            pairing::MAX_MESSAGE,
            "the inviter",
        );
        let mut exchange = tokio::time::timeout(limit, open)
            .await
            .map_err(|_| unanswered())??;
        let reply: PairReply = tokio::time::timeout(limit, exchange.ask(hello))
            .await
            .map_err(|_| unanswered())??;
        if !reply.ok {
            return Err(refusal(reply));
        }
        let pending = self
            .store_pending_peer(inviter, wanted, invite, &reply)
            .await?;
        let done = tokio::time::timeout(
            limit,
            exchange.ask::<PairReply>(&pairing::PairCommit { commit: true }),
        )
        .await;
        exchange.close();
        match done {
            Ok(Ok(done)) if done.ok => {}
            Ok(Ok(refused)) => {
                let id = pending.id.clone();
                self.on_disk(move |trust| {
                    trust.core.store.remove_peer(&id).map_err(store_err)?;
                    trust.core.refresh();
                    Ok(())
                })
                .await
                .unwrap_or_else(|| Err(stopping()))?;
                return Err(refusal(refused));
            }
            _ => {
                let name = &pending.name;
                return Err(ControlError::new(
                    codes::UNREACHABLE,
                    format!(
                        "the inviter did not confirm the pairing; it will be confirmed or undone when {name} can be reached"
                    ),
                ));
            }
        }
        Ok((pending, reply.services))
    }

    /// Names the inviter and stores it as a pending peer, before the inviter commits:
    /// whatever crashes next, recovery can tell from the inviter whether the pairing happened
    /// (see `confirm_pending`).
    async fn store_pending_peer(
        &self,
        inviter: EndpointId,
        wanted: WantedName,
        invite: &Invite,
        reply: &PairReply,
    ) -> Result<StoredPeer, ControlError> {
        // The name is chosen and taken with nothing awaited in between, so no other pairing
        // picks it meanwhile.
        let naming = self.naming.lock().await;
        let name = match wanted {
            WantedName::Chosen(name) => {
                self.check_chosen_name(&name, &inviter)?;
                name
            }
            WantedName::Suggested(name) => self.name_for(&inviter, &name),
        };
        let peer = StoredPeer {
            id: inviter.to_string(),
            name,
            addrs: invite.addrs.clone(),
            mounts: reply.services.clone(),
            paired_at: unix_ms(),
            pending: true,
            grants_owed: Vec::new(),
        };
        let stored = peer.clone();
        self.on_disk(move |trust| {
            trust
                .core
                .store
                .put_peer(&stored, None)
                .map_err(store_err)?;
            trust.core.refresh();
            Ok(())
        })
        .await
        .unwrap_or_else(|| Err(stopping()))?;
        drop(naming);
        Ok(peer)
    }

    /// The inviter committed: the peer is no longer pending, and the pairing's code is kept.
    fn confirm_paired(
        &self,
        inviter: EndpointId,
        secret: &[u8; 32],
        mut peer: StoredPeer,
        services: &[String],
    ) -> Result<Value, ControlError> {
        let name = peer.name.clone();
        let code = pairing::code(&inviter, &self.core.endpoint.id(), secret);
        peer.pending = false;
        let record = Pairing {
            peer: name.clone(),
            code: code.clone(),
            at: peer.paired_at,
        };
        self.core
            .store
            .put_peer(&peer, Some(&record))
            .map_err(store_err)?;
        // A check set off by the pending record may have met the inviter before its commit
        // and been refused; it admits this node now.
        self.core.reach.recheck(&inviter);
        self.core.trust_event("pair", Some(&name), None);
        let mounts: Vec<String> = services.iter().map(|s| format!("{name}/{s}")).collect();
        Ok(json!({ "peer": name, "code": code, "services": services, "mounts": mounts }))
    }

    /// A name the user chose for the inviter with `--name`: refused when another peer has it,
    /// or when an `allow` names it (the inviter would get that access unasked), unless it is
    /// already the inviter's own name.
    fn check_chosen_name(&self, name: &str, inviter: &EndpointId) -> Result<(), ControlError> {
        check_name(name)?;
        let table = self.core.gate.snapshot();
        if table.by_id(inviter).is_some_and(|p| p.name == name) {
            return Ok(());
        }
        if table.by_name(name).is_some() {
            return Err(ControlError::new(
                codes::CONFLICT,
                format!("the name {name} is taken; pick another with --name"),
            ));
        }
        if let Some(service) = self.allow_naming(name) {
            return Err(ControlError::new(
                codes::CONFLICT,
                format!(
                    "the allow list of {service} names {name}: the inviter would be let in under that name; pick another with --name"
                ),
            ));
        }
        Ok(())
    }

    /// Settles pairings left pending by a crash: the inviter answers our ping only if it
    /// stored the pairing (confirm), and refuses it if not (drop). Unreachable: ask later.
    pub(super) async fn confirm_pending(&self) {
        let pending: Vec<StoredPeer> = self
            .core
            .store
            .peers()
            .unwrap_or_default()
            .into_iter()
            .filter(|p| p.pending)
            .collect();
        for mut peer in pending {
            let Some(id) = parse_endpoint_id(&peer.id) else {
                continue;
            };
            let outcome = ping_outcome(&self.core.endpoint, id, pairing::EXCHANGE_TIMEOUT).await;
            if matches!(outcome, PingOutcome::Unreachable) {
                continue;
            }
            self.on_disk(move |trust| match outcome {
                PingOutcome::Reachable { .. } => {
                    peer.pending = false;
                    if trust.core.store.put_peer(&peer, None).is_ok() {
                        tracing::info!(peer = %peer.name, "pairing confirmed");
                        trust.core.trust_event("pair", Some(&peer.name), None);
                    }
                }
                _ => {
                    if trust.core.store.remove_peer(&peer.id).is_ok() {
                        tracing::info!(peer = %peer.name, "pairing undone: the inviter never stored it");
                        trust.core.refresh();
                    }
                }
            })
            .await;
        }
    }

    /// The inviter, on the hello: the proof must hold for a live invite. Nothing is stored
    /// but a failed attempt. Blocking (store transactions): run it on the node's writer.
    fn check_redemption(&self, redeemer: EndpointId, hello: &PairHello) -> PairReply {
        let me = self.core.endpoint.id();
        let checked = self.core.store.verify(
            &hello.invite,
            unix_ms() / 1000,
            pairing::MAX_FAILURES,
            |invite| {
                pairing::check_proof(&invite.secret, &me, &redeemer, &hello.proof)
                    .map(|()| invite.services.clone())
            },
        );
        let reply = match checked {
            Ok(Redeemed::Accepted(services)) => PairReply {
                ok: true,
                services: services
                    .into_iter()
                    .filter(|s| self.core.settings().services.iter().any(|x| &x.name == s))
                    .collect(),
                error: None,
            },
            Ok(Redeemed::Refused(reason)) => {
                tracing::info!(peer = %redeemer.fmt_short(), "refused a pairing: {reason}");
                PairReply::refused(reason)
            }
            Err(e) => {
                tracing::error!("{e}");
                PairReply::refused("the inviter's store failed")
            }
        };
        self.core.update_alpns();
        reply
    }

    /// The inviter, on `commit`: the peer, the pairing, the used invite and the grants owed
    /// to the peer in one store transaction; only once it committed are the grants written
    /// to config. A redeem refused at commit (the last use taken meanwhile, the invite
    /// expired) grants nothing; a crash after the commit leaves the grants owed in the store,
    /// and `settle_owed_grants` writes them when the node is next up.
    async fn complete_redemption(
        self: &Arc<Self>,
        redeemer: EndpointId,
        hello: PairHello,
        services: Vec<String>,
    ) -> PairReply {
        // Pairings take their names one at a time: two redeemers suggesting the same nickname
        // get two names.
        let _naming = self.naming.lock().await;
        let name = self.name_for(&redeemer, &sanitize(hello.nick.as_deref(), "peer"));
        let (peer_name, owed) = (name.clone(), services.clone());
        let outcome = self
            .on_disk(move |trust| {
                let outcome = trust.redeem(redeemer, &hello, peer_name, owed);
                trust.core.update_alpns();
                match outcome {
                    Ok(Redeemed::Accepted(peer)) => {
                        Ok(Redeemed::Accepted(trust.settle_grants(&peer)))
                    }
                    Ok(Redeemed::Refused(reason)) => Ok(Redeemed::Refused(reason)),
                    Err(e) => Err(e),
                }
            })
            .await;
        match outcome {
            Some(Ok(Redeemed::Accepted(granted))) => {
                self.core.trust_event("pair", Some(&name), None);
                for s in &granted {
                    self.core.trust_event("grant", Some(&name), Some(s));
                }
                tracing::info!(peer = %name, "paired");
                PairReply {
                    ok: true,
                    services: granted,
                    error: None,
                }
            }
            Some(Ok(Redeemed::Refused(reason))) => {
                tracing::info!(peer = %redeemer.fmt_short(), "refused a pairing at commit: {reason}");
                PairReply::refused(reason)
            }
            Some(Err(e)) => {
                tracing::error!("{e}");
                PairReply::refused("the inviter's store failed")
            }
            None => PairReply::refused("the inviter's store failed"),
        }
    }

    /// Takes a use of the invite and stores the redeemer, its pairing and the grants owed to
    /// it, in one transaction. Blocking.
    fn redeem(
        &self,
        redeemer: EndpointId,
        hello: &PairHello,
        name: String,
        services: Vec<String>,
    ) -> Result<Redeemed<StoredPeer>, crate::store::StoreError> {
        let me = self.core.endpoint.id();
        let addrs = offered_addrs(&hello.addrs);
        let now = unix_ms();
        self.core
            .store
            .redeem(&hello.invite, now / 1000, pairing::MAX_FAILURES, |invite| {
                pairing::check_proof(&invite.secret, &me, &redeemer, &hello.proof)?;
                let peer = StoredPeer {
                    id: redeemer.to_string(),
                    name: name.clone(),
                    addrs: addrs.clone(),
                    mounts: Vec::new(),
                    paired_at: now,
                    pending: false,
                    grants_owed: services.clone(),
                };
                let code = pairing::code(&me, &redeemer, &invite.secret);
                let pairing = Pairing {
                    peer: name.clone(),
                    code,
                    at: now,
                };
                Ok((peer.clone(), pairing, peer))
            })
    }

    /// Writes the grants a pairing owes `peer` (those of its services still served) as
    /// `eid:` entries, then clears the debt in the store. Returns the services granted.
    fn settle_grants(&self, peer: &StoredPeer) -> Vec<String> {
        let Some(id) = parse_endpoint_id(&peer.id) else {
            return Vec::new();
        };
        let served: Vec<String> = peer
            .grants_owed
            .iter()
            .filter(|s| self.core.settings().services.iter().any(|x| &x.name == *s))
            .cloned()
            .collect();
        if served.is_empty() {
            self.core.refresh();
            if let Err(e) = self.core.store.clear_grants_owed(&peer.id) {
                tracing::error!("{e}");
            }
            return served;
        }
        let principal = Principal::eid(&id);
        let granted = self.core.edit(|doc| {
            for s in &served {
                config::add_allow(doc, s, &principal)?;
            }
            Ok(())
        });
        if let Err(e) = granted {
            // Still owed: housekeeping tries again.
            tracing::error!(peer = %peer.name, "granting the paired services failed: {}", e.message);
            self.core.refresh();
            return Vec::new();
        }
        if let Err(e) = self.core.store.clear_grants_owed(&peer.id) {
            tracing::error!("{e}");
        }
        served
    }

    /// [`Trust::settle_owed_grants`] on the node's writer.
    pub(super) async fn settle_owed_grants_now(&self) {
        self.on_disk(|trust| trust.settle_owed_grants()).await;
    }

    /// Writes grants that pairings committed but a crash (or a config that could not be
    /// written) kept out of config.
    pub(super) fn settle_owed_grants(&self) {
        let owed: Vec<StoredPeer> = self
            .core
            .store
            .peers()
            .unwrap_or_default()
            .into_iter()
            .filter(|p| !p.grants_owed.is_empty())
            .collect();
        for peer in owed {
            let granted = self.settle_grants(&peer);
            for s in &granted {
                self.core.trust_event("grant", Some(&peer.name), Some(s));
            }
            if !granted.is_empty() {
                tracing::info!(peer = %peer.name, services = ?granted, "granted what a pairing owed");
            }
        }
    }
}

fn refusal(reply: PairReply) -> ControlError {
    ControlError::new(
        codes::REFUSED,
        format!(
            "the inviter refused: {}",
            reply.error.unwrap_or_else(|| "no reason given".into())
        ),
    )
}

#[derive(Deserialize)]
struct Grant {
    /// A peer name, or any principal (`peer:`, `eid:`, `user:`, `group:`, `org:`).
    #[serde(alias = "principal")]
    peer: String,
    service: String,
    /// Tool names or globs: granted exactly (grant), or denied (revoke).
    #[serde(default)]
    tools: Option<Vec<String>>,
}

/// The patterns of a `--tools` list, each non-empty.
fn tool_patterns(tools: &[String]) -> Result<Vec<String>, ControlError> {
    let patterns: Vec<String> = tools.iter().map(|t| t.trim().to_owned()).collect();
    if patterns.is_empty() || patterns.iter().any(String::is_empty) {
        return Err(bad(
            "tools: give one or more tool names or globs, like read_*,list_*",
        ));
    }
    Ok(patterns)
}

fn parse_addrs(addrs: &[String]) -> Result<Vec<SocketAddr>, ControlError> {
    addrs
        .iter()
        .map(|a| {
            a.parse::<SocketAddr>()
                .map_err(|_| bad(format!("{a:?} is not an address like 192.0.2.7:4433")))
        })
        .collect()
}

fn store_err(e: crate::store::StoreError) -> ControlError {
    ControlError::new(codes::NODE_UNAVAILABLE, e.to_string())
}

/// The `mcpmesh/pair/1` handler. Open to unknown keys by design: the invite secret is the
/// credential, checked against the stored invite, with an attempt budget per invite.
#[derive(Debug)]
pub(super) struct PairProtocol {
    trust: Arc<Trust>,
    /// Pairing exchanges under way; past the cap, more are turned away at once.
    slots: Arc<tokio::sync::Semaphore>,
}

impl PairProtocol {
    pub(super) fn new(trust: Arc<Trust>) -> Self {
        PairProtocol {
            trust,
            slots: Arc::new(tokio::sync::Semaphore::new(MAX_CONCURRENT_PAIRINGS)),
        }
    }
}

/// Pairing exchanges (from keys not yet trusted) handled at once.
const MAX_CONCURRENT_PAIRINGS: usize = 16;

impl ProtocolHandler for PairProtocol {
    async fn accept(&self, conn: Connection) -> Result<(), AcceptError> {
        let Ok(_slot) = self.slots.clone().try_acquire_owned() else {
            conn.close(VarInt::from_u32(503), b"busy");
            return Ok(());
        };
        let redeemer = conn.remote_id();
        // A key the org revoked is refused on every ALPN, pairing included.
        if self.trust.core.gate.is_revoked(&redeemer) {
            conn.close(VarInt::from_u32(401), b"unknown peer");
            return Ok(());
        }
        let Ok(Ok((send, recv))) =
            tokio::time::timeout(pairing::EXCHANGE_TIMEOUT, conn.accept_bi()).await
        else {
            return Ok(());
        };
        let mut wire: Wire = NdjsonTransport::new(recv, send, pairing::MAX_MESSAGE);
        let hello = next_message(&mut wire, pairing::EXCHANGE_TIMEOUT)
            .await
            .and_then(|v| serde_json::from_value::<PairHello>(v).ok());
        let reply = match hello.clone() {
            Some(hello) if hello.pair == 1 => self
                .trust
                .on_disk(move |trust| trust.check_redemption(redeemer, &hello))
                .await
                .unwrap_or_else(|| PairReply::refused("the inviter's store failed")),
            _ => PairReply::refused("malformed pairing request"),
        };
        if send_message(&mut wire, &reply).await && reply.ok {
            let commit = next_message(&mut wire, pairing::EXCHANGE_TIMEOUT)
                .await
                .and_then(|v| serde_json::from_value::<pairing::PairCommit>(v).ok());
            if let (Some(hello), Some(pairing::PairCommit { commit: true })) = (hello, commit) {
                let done = self
                    .trust
                    .complete_redemption(redeemer, hello, reply.services)
                    .await;
                send_message(&mut wire, &done).await;
            }
        }
        let _ = wire.writer_mut().shutdown().await;
        // Let the last answer reach the redeemer before the connection goes.
        let _ = tokio::time::timeout(pairing::EXCHANGE_TIMEOUT, conn.closed()).await;
        Ok(())
    }
}
