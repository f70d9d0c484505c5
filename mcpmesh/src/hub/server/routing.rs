//! Requests between the client and the services: where a client request goes and under
//! which id and progress token, its answer mapped back; cancellations following their
//! request; and everything a server sends — its requests to the client under hub ids, its
//! progress and notifications — routed back in the order it sent them.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use mcpmesh_net::errors::{self, ErrorCode, ErrorFrame};
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};

use super::Hub;
use super::bridge;
use super::call::{Ask, Call};
use super::plain::PlainCall;
use super::skills;
use super::tasks;
use super::uris::{present_uri, present_uris};
use super::wire::{key, line, lock, mesh_error, rpc_error};
use crate::hub::Target;
use crate::hub::era::{self, Era};
use crate::hub::names::{self, Origin, Routes};
use crate::hub::pool::Lease;
use crate::hub::upstream::{Answer, Inbound, Upstream, UpstreamError};

/// Server requests to the client awaiting the client's answer, at most.
const MAX_ASKED: usize = 4096;

/// A client request sent upstream, until its answer.
pub(super) struct Forwarded {
    up: Arc<Upstream>,
    upstream_id: u64,
    cancelled: bool,
    /// Where the server's requests to a stateless client go during this call (bridged).
    asks: Option<mpsc::Sender<Ask>>,
    /// What the call's client declared it can do (bridged): what the server may ask of it.
    declared: Value,
}

/// Where a bridged call takes its server's requests, and what its client declared.
type Asker = (mpsc::Sender<Ask>, Value);

/// What a bridged call (a stateless client's call to a handshake-era server) keeps: what its
/// retry must match, where the server's requests to the client during it go, and what its
/// client declared it can do. Nothing for any other call.
struct Bridging {
    bound: String,
    asks: Option<mpsc::Sender<Ask>>,
    asked: Option<mpsc::Receiver<Ask>>,
    declared: Value,
}

impl Bridging {
    fn of(bridged: bool, target: &Target, method: &str, params: &Value) -> Self {
        if !bridged {
            return Bridging {
                bound: String::new(),
                asks: None,
                asked: None,
                declared: Value::Null,
            };
        }
        let (tx, rx) = mpsc::channel(bridge::ASKS_AT_ONCE);
        Bridging {
            bound: bridge::bound(target, method, params),
            asks: Some(tx),
            asked: Some(rx),
            declared: params
                .get("_meta")
                .and_then(|m| m.get(era::META_CLIENT_CAPABILITIES))
                .cloned()
                .unwrap_or(Value::Null),
        }
    }
}

/// The client's requests under way.
#[derive(Default)]
pub(super) struct Requests {
    /// Client request id (as JSON text) → where it went.
    pub(super) forwarded: HashMap<String, Forwarded>,
    /// (service, hub progress token) → the client's token.
    pub(super) tokens: HashMap<(Target, String), Value>,
}

/// Requests made of the client, waiting for its answer.
#[derive(Default)]
pub(super) struct Asks {
    /// Hub id of a server's request to the client → the session and the server's own id.
    pub(super) asked: HashMap<String, (Arc<Upstream>, Value)>,
    /// Hub id of a request the hub made of a handshake-era client for a stateless server's
    /// `input_required` result → where its answer goes.
    pub(super) bridged: HashMap<String, oneshot::Sender<Value>>,
}

impl Hub {
    /// Where a request goes, and its params as that server must see them.
    pub(super) fn destination(
        &self,
        method: &str,
        mut params: Value,
    ) -> Result<(Target, Value), String> {
        let target = self.destination_in(method, &mut params)?;
        Ok((target, params))
    }

    /// Where a request goes; `params` are made what that server must see (and left as they
    /// were when it goes nowhere).
    pub(super) fn destination_in(
        &self,
        method: &str,
        params: &mut Value,
    ) -> Result<Target, String> {
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
            "tools/call" => {
                drop(view);
                let name = params["name"].as_str().unwrap_or_default();
                let (target, tool) = self.tool_destination(name)?;
                params["name"] = json!(tool);
                Ok(target)
            }
            "prompts/get" => {
                let name = params["name"].as_str().unwrap_or_default().to_owned();
                let origin = by_name(&view.prompt_routes, &name, "prompt")?;
                params["name"] = json!(origin.name);
                Ok(target_of(&origin))
            }
            "completion/complete" => match params["ref"]["type"].as_str() {
                Some("ref/prompt") => {
                    let name = params["ref"]["name"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned();
                    let origin = by_name(&view.prompt_routes, &name, "prompt")?;
                    params["ref"]["name"] = json!(origin.name);
                    Ok(target_of(&origin))
                }
                _ => {
                    let uri = params["ref"]["uri"].as_str().unwrap_or_default();
                    let (target, own) = self.resource_owner(uri)?;
                    params["ref"]["uri"] = json!(own);
                    Ok(target)
                }
            },
            _ => {
                let uri = params["uri"].as_str().unwrap_or_default();
                let (target, own) = self.resource_owner(uri)?;
                params["uri"] = json!(own);
                Ok(target)
            }
        }
    }

    /// The service a `tools/call` of `name` goes to, and the tool's own name there. A tool the
    /// listing does not show (the caller may not use it, or it is new) under its full name goes
    /// to its service, whose node decides and records the attempt.
    fn tool_destination(&self, name: &str) -> Result<(Target, String), String> {
        let listed = lock(&self.view)
            .tool_routes
            .route(name)
            .map(|origin| (target_of(origin), origin.name.clone()));
        listed
            .or_else(|| self.unlisted_tool("tools/call", name))
            .ok_or_else(|| format!("unknown tool: {name}"))
    }

    /// For a `tools/call` of `name` no listing shows: the service it points to and the tool's
    /// own name, so that the service's node refuses it and records the attempt. By its full
    /// name (`<peer>__<service>__<tool>`), else, as `--names service` and `bare` shorten
    /// names, by `<service>__<tool>` when one service presented has that name, else to the one
    /// service presented when there is only one.
    fn unlisted_tool(&self, method: &str, name: &str) -> Option<(Target, String)> {
        if method != "tools/call" {
            return None;
        }
        let targets = self.targets();
        let own = |prefix: String| {
            name.strip_prefix(&prefix)
                .filter(|tool| !tool.is_empty())
                .map(str::to_owned)
        };
        let full = targets.iter().find_map(|t| {
            own(names::full_prefix(&t.peer, &t.service)).map(|tool| (t.clone(), tool))
        });
        if full.is_some() {
            return full;
        }
        let mut by_service = targets
            .iter()
            .filter_map(|t| own(names::service_prefix(&t.service)).map(|tool| (t.clone(), tool)));
        match (by_service.next(), by_service.next()) {
            (Some(one), None) => return Some(one),
            (Some(_), Some(_)) => return None,
            (None, _) => {}
        }
        match targets.as_slice() {
            [only] => Some((only.clone(), name.to_owned())),
            _ => None,
        }
    }

    /// The service behind a URI the hub presented, and that service's own URI.
    fn resource_owner(&self, uri: &str) -> Result<(Target, String), String> {
        names::unwrap_uri(uri)
            .and_then(|(peer, service, own)| {
                self.targets()
                    .into_iter()
                    .find(|t| t.peer == peer && t.service == service)
                    .map(|t| (t, own.to_owned()))
            })
            .ok_or_else(|| format!("unknown resource: {uri}"))
    }

    /// Sends a client request to `target`'s session (opening it when needed) and returns
    /// the line that answers the client.
    pub(super) async fn forward(
        &self,
        id: &Value,
        target: Target,
        method: &str,
        mut params: Value,
    ) -> Vec<u8> {
        let lease = match self.reach(id, &target).await {
            Ok(lease) => lease,
            Err(refusal) => return refusal,
        };
        let up = lease.up.clone();
        // A task the client could not reach is never made: a task call to a service that
        // offers none (or from a client the hub offers no tasks) runs plainly.
        let stateless = self.client_era_is(Era::Stateless);
        // A stateless server has no `resources/subscribe`: the hub listens for the client.
        if !stateless
            && up.era() == Era::Stateless
            && matches!(method, "resources/subscribe" | "resources/unsubscribe")
        {
            let own = params["uri"].as_str().unwrap_or_default().to_owned();
            let mut shown = Some(json!(own.clone()));
            present_uri(shown.as_mut(), &target);
            let shown = shown.as_ref().and_then(Value::as_str).unwrap_or_default();
            return self.subscription(id, method, shown, &own, lease).await;
        }
        if method == "tools/call"
            && params.get("task").is_some()
            && (stateless || !tasks::offers_task_calls(&up.capabilities()))
            && let Some(params) = params.as_object_mut()
        {
            params.remove("task");
        }
        let token_key = self.own_progress_token(&target, params.get_mut("_meta"));
        // Which way a call may need bridging is known before it goes: the client's era against
        // the server's.
        let bridged = stateless && up.era() == Era::Handshake;
        let bridging = Bridging::of(bridged, &target, method, &params);
        let retry = (!stateless && up.era() == Era::Stateless).then(|| params.clone());
        let Ok((upstream_id, rx)) = self.start(id, &up, method, params, &bridging).await else {
            lock(&self.requests).forwarded.remove(&key(id));
            if let Some(k) = token_key {
                lock(&self.requests).tokens.remove(&k);
            }
            return lost(id, &target);
        };
        let Bridging {
            bound,
            asks,
            asked,
            declared,
        } = bridging;
        let call = Call {
            lease,
            rx,
            asked,
            upstream_id,
            target,
            method: method.to_owned(),
            bound,
            token_key,
            retry,
            declared,
        };
        self.await_call(id, call, asks).await
    }

    /// Sends a [`PlainCall`] to its tool's service and answers it: the ordinary way
    /// ([`Hub::request`]) for a client or a server of the stateless era, whose frames the hub
    /// must read.
    pub(super) async fn plain_call(self: Arc<Self>, call: PlainCall) {
        if self.client_era_is(Era::Stateless) {
            return self
                .request(call.id.clone(), "tools/call", call.frame())
                .await;
        }
        let mut routed = self.tool_destination(&call.name);
        if routed.is_err() {
            // A name the cache does not know yet may be in a listing on its way.
            self.clone().first_listings();
            self.wait_for_first_listings().await;
            routed = self.tool_destination(&call.name);
        }
        let reply = match routed {
            Ok((target, tool)) => self.forward_plain(&call, target, &tool).await,
            Err(message) => rpc_error(&call.id, -32602, message),
        };
        self.send(reply).await;
    }

    async fn forward_plain(&self, call: &PlainCall, target: Target, tool: &str) -> Vec<u8> {
        let id = &call.id;
        let lease = match self.reach(id, &target).await {
            Ok(lease) => lease,
            Err(refusal) => return refusal,
        };
        let up = lease.up.clone();
        if up.era() != Era::Handshake {
            drop(lease);
            return self
                .forward(id, target, "tools/call", call.params(tool))
                .await;
        }
        // The client's progress token becomes one of the hub's, as on the ordinary way.
        let mut meta = call.meta.clone();
        let token_key = self.own_progress_token(&target, meta.as_mut());
        let started = up
            .start_written("tools/call", call.params_len(), |out| {
                call.write_params(tool, meta.as_ref(), out)
            })
            .await;
        let Ok((upstream_id, rx)) = started else {
            if let Some(k) = token_key {
                lock(&self.requests).tokens.remove(&k);
            }
            return lost(id, &target);
        };
        let call = Call {
            lease,
            rx,
            asked: None,
            upstream_id,
            target,
            method: "tools/call".to_owned(),
            bound: String::new(),
            token_key,
            retry: None,
            declared: Value::Null,
        };
        self.await_call(id, call, None).await
    }

    /// `target`'s session for request `id` (opened when needed), or the line that answers
    /// the request when its peer was not reachable at its node's last check or the session
    /// did not open.
    async fn reach(&self, id: &Value, target: &Target) -> Result<Lease, Vec<u8>> {
        if !self.in_reach(target) {
            return Err(mesh_error(
                id,
                ErrorCode::Unreachable,
                format!(
                    "{target}: peer {} is not reachable now (its node's last check); try again when it is",
                    target.peer
                ),
            ));
        }
        self.lease(target)
            .await
            .map_err(|e| open_failed(id, target, &e))
    }

    /// Gives the request the hub's own progress token in place of the client's (when its
    /// `_meta` names one), remembered to map the server's progress back; the key it is
    /// remembered under.
    fn own_progress_token(
        &self,
        target: &Target,
        meta: Option<&mut Value>,
    ) -> Option<(Target, String)> {
        let slot = meta?.get_mut("progressToken")?;
        let ours = json!(format!("hub-{}", self.next.fetch_add(1, Ordering::Relaxed)));
        let token = std::mem::replace(slot, ours.clone());
        let k = (target.clone(), key(&ours));
        lock(&self.requests).tokens.insert(k.clone(), token);
        Some(k)
    }

    /// Starts the client's request `id` on `up`'s session. A bridged call is findable before
    /// it goes, since the server may ask before `start` returns.
    async fn start(
        &self,
        id: &Value,
        up: &Arc<Upstream>,
        method: &str,
        params: Value,
        bridging: &Bridging,
    ) -> Result<(u64, oneshot::Receiver<Answer>), UpstreamError> {
        let noted = |upstream_id| {
            if bridging.asks.is_some() {
                lock(&self.requests).forwarded.insert(
                    key(id),
                    Forwarded {
                        up: up.clone(),
                        upstream_id,
                        cancelled: false,
                        asks: bridging.asks.clone(),
                        declared: bridging.declared.clone(),
                    },
                );
            }
        };
        up.start_noting(method, params, noted).await
    }

    /// Waits for `call`'s answer and gives the line that answers the client's request `id`:
    /// the server's answer, or (bridged) an `input_required` result when the server asks the
    /// client something first.
    pub(super) async fn await_call(
        &self,
        id: &Value,
        mut call: Call,
        asks: Option<mpsc::Sender<Ask>>,
    ) -> Vec<u8> {
        // A bridged call is there already (noted before it went, perhaps cancelled since).
        lock(&self.requests)
            .forwarded
            .entry(key(id))
            .or_insert_with(|| Forwarded {
                up: call.lease.up.clone(),
                upstream_id: call.upstream_id,
                cancelled: false,
                asks: asks.clone(),
                declared: call.declared.clone(),
            });
        let asked = async {
            match call.asked.as_mut() {
                Some(asked) => asked.recv().await,
                None => std::future::pending().await,
            }
        };
        let outcome = tokio::select! {
            got = &mut call.rx => Err(got.ok()),
            Some(ask) = asked => Ok(ask),
        };
        let forwarded = lock(&self.requests).forwarded.remove(&key(id));
        let cancelled = forwarded.is_some_and(|f| f.cancelled);
        let reply = match outcome {
            Ok(ask) => return self.park(id, call, asks, ask, cancelled).await,
            Err(reply) => reply,
        };
        if !cancelled && let Some(line) = reply.as_ref().and_then(|a| self.whole(id, &call, a)) {
            if let Some(k) = &call.token_key {
                lock(&self.requests).tokens.remove(k);
            }
            return line;
        }
        let reply = reply.map(Answer::into_frame);
        // A stateless server's `input_required` for a handshake-era client: the client is
        // asked, and the call retried with its answers.
        if !cancelled
            && let Some(frame) = &reply
            && frame["result"]["resultType"] == "input_required"
            && let Some(params) = call.retry.clone()
        {
            return Box::pin(self.input_rounds(id, call, frame["result"].clone(), params)).await;
        }
        if let Some(k) = &call.token_key {
            lock(&self.requests).tokens.remove(k);
        }
        if cancelled {
            // The client cancelled it: it expects no answer.
            return Vec::new();
        }
        let Call {
            lease,
            target,
            method,
            ..
        } = call;
        match reply {
            Some(mut frame) => {
                frame["id"] = id.clone();
                name_the_service(&mut frame, &target);
                present_uris(&method, &mut frame, &target);
                tasks::present_answer(&method, &mut frame, &target);
                skills::present_answer(&method, &mut frame, &target);
                self.hold_for_task(&method, &frame, lease);
                self.release_task(&method, &frame);
                if self.client_era_is(Era::Stateless)
                    && let Some(result) = frame.get_mut("result")
                {
                    era::typed(&method, result, &super::server_info());
                }
                line(&frame)
            }
            None => lost(id, &target),
        }
    }

    /// The line answering the client's request `id` with `answer` passed whole, its id the
    /// client's, when nothing in it is the hub's to present: a `tools/call` result without a
    /// URI or a task, to a handshake-era client, from a server of the same era. `None` when
    /// the answer must be read (and then [`Hub::await_call`] reads it).
    fn whole(&self, id: &Value, call: &Call, answer: &Answer) -> Option<Vec<u8>> {
        if call.method != "tools/call" || call.retry.is_some() || self.client_era_is(Era::Stateless)
        {
            return None;
        }
        let (jsonrpc, result) = answer.plain_parts()?;
        if !presents_nothing(result) {
            return None;
        }
        let mut out = Vec::with_capacity(jsonrpc.len() + result.len() + 64);
        out.extend_from_slice(b"{\"jsonrpc\":");
        out.extend_from_slice(jsonrpc);
        out.extend_from_slice(b",\"id\":");
        serde_json::to_writer(&mut out, id).ok()?;
        out.extend_from_slice(b",\"result\":");
        out.extend_from_slice(result);
        out.extend_from_slice(b"}\n");
        Some(out)
    }

    pub(super) async fn client_notification(self: Arc<Self>, method: &str, frame: Value) {
        match method {
            "notifications/cancelled" => {
                let Some(request) = frame.pointer("/params/requestId") else {
                    return;
                };
                let target = {
                    let mut requests = lock(&self.requests);
                    requests.forwarded.get_mut(&key(request)).map(|f| {
                        f.cancelled = true;
                        (f.up.clone(), f.upstream_id)
                    })
                };
                // A stateless client ends a `subscriptions/listen` stream by cancelling it.
                self.end_listen(request);
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

    /// Where `up`'s request to a stateless client goes: the one bridged call in flight on it
    /// (`None`: no call). A handshake-era server's request names no call, so with several in
    /// flight nothing says which one asks: `Err` with how many there are.
    fn asks_of(&self, up: &Arc<Upstream>) -> Result<Option<Asker>, usize> {
        let requests = lock(&self.requests);
        let mut calls = requests
            .forwarded
            .values()
            .filter(|f| Arc::ptr_eq(&f.up, up) && !f.cancelled)
            .filter_map(|f| Some((f.asks.clone()?, f.declared.clone())));
        match (calls.next(), calls.next()) {
            (None, _) => Ok(None),
            (Some(asks), None) => Ok(Some(asks)),
            (Some(_), Some(_)) => Err(2 + calls.count()),
        }
    }

    /// The client answering a server's request: back to that server, with its own id.
    pub(super) async fn client_answer(&self, id: &Value, mut frame: Value) {
        if let Some(waiter) = lock(&self.asks).bridged.remove(&key(id)) {
            let _ = waiter.send(frame);
            return;
        }
        let Some((up, theirs)) = lock(&self.asks).asked.remove(&key(id)) else {
            return;
        };
        frame["id"] = theirs;
        up.send(&frame).await;
    }

    /// What servers send, each server's frames in the order it sent them.
    pub(super) async fn from_servers(self: Arc<Self>, mut inbound: mpsc::Receiver<Inbound>) {
        while let Some(inbound) = inbound.recv().await {
            let (from, frame) = match inbound {
                Inbound::Frame { from, frame } if frame.get("method").is_some() => (from, frame),
                // An answer goes to its waiter only now, after what the server sent before it
                // (a call's progress above all) went to the client.
                Inbound::Answer { from, id, answer } => {
                    from.answered(id, answer);
                    continue;
                }
                // An answer to no request of the hub's.
                Inbound::Frame { .. } => continue,
                Inbound::Ended(from) => {
                    from.abandon_waiting();
                    continue;
                }
            };
            let method = frame["method"].as_str().unwrap_or_default().to_owned();
            let stateless = self.client_era_is(Era::Stateless);
            match frame.get("id").cloned() {
                Some(theirs) if stateless => {
                    self.server_request_to_stateless(&from, &theirs, &method, &frame)
                        .await;
                }
                Some(theirs) => self.server_request(&from, theirs, frame).await,
                None => {
                    self.server_notification(&from, method, frame, stateless)
                        .await;
                }
            }
        }
    }

    /// A server's request while the client is stateless: during a bridged call it becomes
    /// that call's input request; anything else is refused (`-32057`).
    async fn server_request_to_stateless(
        &self,
        from: &Arc<Upstream>,
        theirs: &Value,
        method: &str,
        frame: &Value,
    ) {
        // During a call, what the bridge carries becomes that call's input request.
        let asks = match bridge::BRIDGED.contains(&method) {
            true => self.asks_of(from),
            false => Ok(None),
        };
        match asks {
            Ok(Some((_, declared)))
                if !bridge::declared(
                    &declared,
                    method,
                    frame.get("params").unwrap_or(&Value::Null),
                ) =>
            {
                // The server was told another client's capabilities (its session
                // is shared): this call's client never said it takes such a request.
                let why = format!("{method}: the client of this call declared no such capability");
                refuse_unbridged(from, theirs, method, why).await;
                return;
            }
            Ok(Some((asks, _))) => {
                let ask = Ask {
                    their_id: theirs.clone(),
                    method: method.to_owned(),
                    params: frame.get("params").cloned().unwrap_or(Value::Null),
                };
                if asks.try_send(ask).is_ok() {
                    return;
                }
            }
            // Given to a guess, it could reach the client as another call's question.
            Err(calls) => {
                let why = format!(
                    "{method}: {calls} calls of the hub's client are in flight on this session, and the request names none of them, so the hub cannot tell which call asks"
                );
                refuse_unbridged(from, theirs, method, why).await;
                return;
            }
            Ok(None) => {}
        }
        // A stateless client takes no requests from a server (its sessions to
        // handshake-era servers declare no capabilities, so a server asks only
        // against them).
        let why = format!(
            "{method}: the hub's client speaks MCP {} and takes no such request from a server outside a call",
            era::STATELESS
        );
        refuse_unbridged(from, theirs, method, why).await;
    }

    /// A server's request to a handshake-era client: under a hub id, answered back to this
    /// session.
    async fn server_request(&self, from: &Arc<Upstream>, theirs: Value, mut frame: Value) {
        let ours = json!(format!("hub-{}", self.next.fetch_add(1, Ordering::Relaxed)));
        let full = {
            let mut asks = lock(&self.asks);
            let asked = &mut asks.asked;
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
            return;
        }
        frame["id"] = ours;
        if let Some(params) = frame.get_mut("params") {
            tasks::present_related(params, &from.target);
        }
        self.send(line(&frame)).await;
    }

    /// A server's notification, passed to the client as it speaks of that service.
    async fn server_notification(
        self: &Arc<Self>,
        from: &Arc<Upstream>,
        method: String,
        mut frame: Value,
        stateless: bool,
    ) {
        match method.as_str() {
            "notifications/progress" => {
                let Some(token) = frame.pointer("/params/progressToken") else {
                    return;
                };
                let theirs = lock(&self.requests)
                    .tokens
                    .get(&(from.target.clone(), key(token)))
                    .cloned();
                if let Some(client_token) = theirs {
                    frame["params"]["progressToken"] = client_token;
                    self.send(line(&frame)).await;
                }
            }
            "notifications/cancelled" => self.server_cancelled(from, frame).await,
            "notifications/tools/list_changed"
            | "notifications/prompts/list_changed"
            | "notifications/resources/list_changed" => {
                self.clone().changed_upstream(from.target.clone(), method);
            }
            "notifications/resources/updated" => {
                self.server_resource_updated(from, frame, stateless).await;
            }
            // What a stateless server acknowledges is the hub's own listen.
            "notifications/subscriptions/acknowledged" => {}
            // Nothing else reaches a stateless client outside a request.
            _ if stateless => {}
            "notifications/tasks/status" => {
                if let Some(params) = frame.get_mut("params") {
                    tasks::present_status(params, &from.target);
                }
                self.send(line(&frame)).await;
            }
            _ => self.send(line(&frame)).await,
        }
    }

    /// The server gave up one of its requests to the client: the client is told under the
    /// request's hub id.
    async fn server_cancelled(&self, from: &Arc<Upstream>, mut frame: Value) {
        let Some(request) = frame.pointer("/params/requestId").cloned() else {
            return;
        };
        let ours = {
            let mut asks = lock(&self.asks);
            let ours = asks
                .asked
                .iter()
                .find(|(_, (up, id))| Arc::ptr_eq(up, from) && *id == request)
                .map(|(k, _)| k.clone());
            if let Some(k) = &ours {
                asks.asked.remove(k);
            }
            ours
        };
        if let Some(ours) = ours
            && let Ok(id) = serde_json::from_str::<Value>(&ours)
        {
            frame["params"]["requestId"] = id;
            self.send(line(&frame)).await;
        }
    }

    /// A resource of the server's changed: its URI shown under the service's place, to the
    /// client's own subscription, or (stateless) to the listen streams that follow it.
    async fn server_resource_updated(
        &self,
        from: &Arc<Upstream>,
        mut frame: Value,
        stateless: bool,
    ) {
        let uri = frame.get_mut("params").and_then(|p| p.get_mut("uri"));
        present_uri(uri, &from.target);
        // The stream of a stateless server's update is the hub's, not the client's.
        if let Some(meta) = frame
            .pointer_mut("/params/_meta")
            .and_then(Value::as_object_mut)
        {
            meta.remove(era::META_SUBSCRIPTION);
            if meta.is_empty()
                && let Some(params) = frame["params"].as_object_mut()
            {
                params.remove("_meta");
            }
        }
        if stateless {
            let params = frame["params"].clone();
            let shown = params["uri"].as_str().unwrap_or_default();
            self.resource_updated(shown, &params).await;
        } else {
            self.send(line(&frame)).await;
        }
    }
}

/// Whether a `tools/call` result (an object) holds nothing the hub presents: no `"uri"`, no
/// `"task…"` key or text, and no letter written as a `\u` escape (a key could be spelled with
/// one; other escapes, of accents or emoji, pass).
fn presents_nothing(result: &[u8]) -> bool {
    let named = |needle: &str| memchr::memmem::find(result, needle.as_bytes()).is_some();
    let spelled = named("\\u006") || named("\\u007");
    result.starts_with(b"{") && !named("\"uri\"") && !named("\"task") && !spelled
}

fn target_of(origin: &Origin) -> Target {
    Target {
        peer: origin.peer.clone(),
        service: origin.service.clone(),
    }
}

fn lost(id: &Value, target: &Target) -> Vec<u8> {
    mesh_error(
        id,
        ErrorCode::Unreachable,
        format!("{target}: the session ended before it answered; the next call opens a new one"),
    )
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
    if errors::mesh_code(frame).is_none() {
        return;
    }
    let Some(error) = frame.get_mut("error").and_then(Value::as_object_mut) else {
        return;
    };
    let message = error
        .get("message")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let named = format!("{target}: {message}");
    error.insert("message".into(), json!(named));
}

/// Answers a server's request `theirs` (`method`) that the hub cannot bridge to its client:
/// `-32057`, with `data.feature` naming the method.
async fn refuse_unbridged(from: &Upstream, theirs: &Value, method: &str, why: String) {
    let raw = serde_json::value::to_raw_value(theirs).ok();
    let refusal = ErrorFrame::new(ErrorCode::Unbridged)
        .id(raw.as_deref())
        .message(why)
        .feature(method.to_owned());
    if let Ok(refusal) = serde_json::from_slice::<Value>(&refusal.to_line()) {
        from.send(&refusal).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_result_passes_whole_only_when_nothing_in_it_is_the_hubs_to_present() {
        for plain in [
            r#"{"content":[{"type":"text","text":"hi é"}]}"#,
            r#"{"content":[{"type":"text","text":"\u00e9 \ud83c\udf10 \"q\" \\"}]}"#,
            r#"{}"#,
        ] {
            assert!(presents_nothing(plain.as_bytes()), "{plain}");
        }
        for read in [
            // What the hub presents: a resource's URI, a task.
            r#"{"content":[{"type":"resource_link","uri":"x://a"}]}"#,
            r#"{"content":[{"type":"resource","resource":{"uri":"x://a"}}]}"#,
            r#"{"task":{"taskId":"t1"}}"#,
            r#"{"resultType":"task","taskId":"t1"}"#,
            // A key spelled with an escape.
            r#"{"content":[{"type":"resource_link","\u0075ri":"x://a"}]}"#,
            r#"{"content":[{"type":"resource_link","ur\u0069":"x://a"}]}"#,
            r#"{"\u0074ask":{"taskId":"t1"}}"#,
            // Not an object.
            r#"[1]"#,
        ] {
            assert!(!presents_nothing(read.as_bytes()), "{read}");
        }
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
}
