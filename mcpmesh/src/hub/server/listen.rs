//! A 2026-07-28 client's `subscriptions/listen` streams: the only way notifications reach such
//! a client. A stream carries the merged lists' changes it asked for, and the updates of the
//! resources it named: each one is subscribed to at the service that owns it — a 2025 server
//! with `resources/subscribe`, a 2026 one with a `subscriptions/listen` of the hub's own —
//! whose session the stream holds open until it ends. The acknowledgement names what the
//! stream will carry and comes before anything on it.
//!
//! A 2025-11-25 client's `resources/subscribe` of a resource whose service speaks only the
//! 2026 revision becomes such an upstream `subscriptions/listen` too, held until the client's
//! `resources/unsubscribe` (or the hub's end).

use serde_json::{Map, Value, json};

use super::Hub;
use super::wire::{key, line, lock, rpc_error};
use crate::hub::era::{self, Era};
use crate::hub::pool::Lease;

/// Open streams of one client, at most.
const MAX_LISTENS: usize = 64;
/// Resources one stream may name, at most.
const MAX_RESOURCES: usize = 64;

/// One open stream (or a handshake-era client's subscription to one resource).
pub(super) struct Listen {
    id: Value,
    /// The notifications agreed to (a `SubscriptionFilter`).
    agreed: Value,
    /// The resources subscribed to: presented URI, how, and its session held.
    resources: Vec<(String, Held, Lease)>,
}

/// How the hub holds a subscription to a resource at its service.
enum Held {
    /// `resources/subscribe` of the service's own URI (a handshake-era server).
    Subscribed(String),
    /// The hub's own `subscriptions/listen` request, by its id (a stateless server).
    Listening(u64),
}

/// The `listens` key of a handshake-era client's subscription to `uri` (a stream's key is the
/// JSON text of its id, which never starts with this).
fn subscription_key(uri: &str) -> String {
    format!("resources/subscribe {uri}")
}

impl Hub {
    /// Opens a stream: subscribes to the resources it names where their service can, then
    /// acknowledges what it will carry. The request is answered only if the hub ends it.
    pub(super) async fn listen(&self, id: &Value, params: &Value) {
        if lock(&self.listens).len() >= MAX_LISTENS {
            let message = format!("at most {MAX_LISTENS} subscriptions/listen streams at once");
            self.send(rpc_error(id, -32603, message)).await;
            return;
        }
        let asked = &params["notifications"];
        let mut agreed = Map::new();
        for kind in [
            "toolsListChanged",
            "promptsListChanged",
            "resourcesListChanged",
        ] {
            if asked[kind] == json!(true) {
                agreed.insert(kind.into(), json!(true));
            }
        }
        let mut resources = Vec::new();
        let uris = asked["resourceSubscriptions"].as_array().cloned();
        for uri in uris.into_iter().flatten().take(MAX_RESOURCES) {
            let Some(uri) = uri.as_str() else { continue };
            if let Some(subscribed) = self.subscribe(uri).await {
                resources.push(subscribed);
            }
        }
        if !resources.is_empty() {
            let uris: Vec<&str> = resources.iter().map(|(uri, _, _)| uri.as_str()).collect();
            agreed.insert("resourceSubscriptions".into(), json!(uris));
        }
        self.send(line(&json!({
            "jsonrpc": "2.0",
            "method": "notifications/subscriptions/acknowledged",
            "params": {"notifications": agreed, "_meta": {era::META_SUBSCRIPTION: id}},
        })))
        .await;
        let listen = Listen {
            id: id.clone(),
            agreed: Value::Object(agreed),
            resources,
        };
        if let Some(replaced) = lock(&self.listens).insert(key(id), listen) {
            self.unsubscribe(replaced);
        }
    }

    /// Subscribes to the resource the hub presented as `uri` at its service, when that
    /// service offers subscriptions.
    async fn subscribe(&self, uri: &str) -> Option<(String, Held, Lease)> {
        let (target, routed) = self
            .destination("resources/subscribe", json!({ "uri": uri }))
            .ok()?;
        let lease = self.lease(&target).await.ok()?;
        let own = routed["uri"].as_str()?.to_owned();
        let held = hold(&lease, &own).await?;
        Some((uri.to_owned(), held, lease))
    }

    /// A handshake-era client's `resources/subscribe` (`unsubscribe`) of a resource of a
    /// stateless server, `own` its URI there: held as the hub's own `subscriptions/listen`
    /// (ended by cancelling it). Both are answered `{}`, as a server does; a second subscribe
    /// to the same resource keeps the first.
    pub(super) async fn subscription(
        &self,
        id: &Value,
        method: &str,
        shown: &str,
        own: &str,
        lease: Lease,
    ) -> Vec<u8> {
        let key = subscription_key(shown);
        if method == "resources/unsubscribe" {
            self.end_listen_key(&key);
            return line(&json!({"jsonrpc": "2.0", "id": id, "result": {}}));
        }
        if lock(&self.listens).contains_key(&key) {
            return line(&json!({"jsonrpc": "2.0", "id": id, "result": {}}));
        }
        if lock(&self.listens).len() >= MAX_LISTENS {
            let message = format!("at most {MAX_LISTENS} resource subscriptions at once");
            return rpc_error(id, -32603, message);
        }
        let Some(held) = hold(&lease, own).await else {
            return rpc_error(
                id,
                -32601,
                format!("{shown}: its server offers no subscriptions"),
            );
        };
        let listen = Listen {
            id: Value::Null,
            agreed: json!({}),
            resources: vec![(shown.to_owned(), held, lease)],
        };
        if let Some(replaced) = lock(&self.listens).insert(key, listen) {
            self.unsubscribe(replaced);
        }
        line(&json!({"jsonrpc": "2.0", "id": id, "result": {}}))
    }

    /// Ends stream `id` (its client cancelled it): its resources are unsubscribed from and
    /// their sessions let go.
    pub(super) fn end_listen(&self, id: &Value) {
        self.end_listen_key(&key(id));
    }

    fn end_listen_key(&self, key: &str) {
        let ended = lock(&self.listens).remove(key);
        if let Some(listen) = ended {
            self.unsubscribe(listen);
        }
    }

    fn unsubscribe(&self, listen: Listen) {
        if listen.resources.is_empty() {
            return;
        }
        tokio::spawn(async move {
            for (_, held, lease) in listen.resources {
                match held {
                    Held::Subscribed(own) => {
                        let end = json!({ "uri": own });
                        let _ = lease.up.start("resources/unsubscribe", end).await;
                    }
                    Held::Listening(request) => {
                        lease.up.forget(request);
                        let end = json!({ "requestId": request, "reason": "unsubscribed" });
                        let _ = lease.up.notify("notifications/cancelled", Some(end)).await;
                    }
                }
            }
        });
    }

    /// Tells the client one of the merged lists changed: a client of the handshake era at
    /// once, a stateless one on each of its streams that asked for that list's changes.
    pub(super) async fn list_changed(&self, method: &str) {
        if !self.client_era_is(Era::Stateless) {
            self.send(line(&json!({"jsonrpc": "2.0", "method": method})))
                .await;
            return;
        }
        let kind = match method {
            "notifications/tools/list_changed" => "toolsListChanged",
            "notifications/prompts/list_changed" => "promptsListChanged",
            _ => "resourcesListChanged",
        };
        let streams: Vec<Value> = lock(&self.listens)
            .values()
            .filter(|l| l.agreed[kind] == json!(true))
            .map(|l| l.id.clone())
            .collect();
        for id in streams {
            self.send(line(&json!({
                "jsonrpc": "2.0",
                "method": method,
                "params": {"_meta": {era::META_SUBSCRIPTION: id}},
            })))
            .await;
        }
    }

    /// A resource the hub presented as `uri` was updated: a stateless client hears it on each
    /// stream that named it.
    pub(super) async fn resource_updated(&self, uri: &str, params: &Value) {
        let streams: Vec<Value> = lock(&self.listens)
            .values()
            .filter(|l| l.resources.iter().any(|(shown, _, _)| shown == uri))
            .map(|l| l.id.clone())
            .collect();
        for id in streams {
            let mut params = params.clone();
            params["_meta"] = json!({ era::META_SUBSCRIPTION: id });
            self.send(line(&json!({
                "jsonrpc": "2.0",
                "method": "notifications/resources/updated",
                "params": params,
            })))
            .await;
        }
    }
}

/// Subscribes to `own` at the server of `lease`, when it offers subscriptions: with
/// `resources/subscribe` at a handshake-era server (answered before this returns), with a
/// `subscriptions/listen` request of the hub's own at a stateless one (its acknowledgement and
/// updates come as notifications; the request stays open until cancelled).
async fn hold(lease: &Lease, own: &str) -> Option<Held> {
    let up = &lease.up;
    if up.capabilities()["resources"]["subscribe"] != json!(true) {
        return None;
    }
    match up.era() {
        Era::Handshake => {
            let answer = up
                .request("resources/subscribe", json!({ "uri": own }))
                .await
                .ok()?;
            answer.get("result")?;
            Some(Held::Subscribed(own.to_owned()))
        }
        Era::Stateless => {
            let asked = json!({ "notifications": { "resourceSubscriptions": [own] } });
            let (request, _answer) = up.start("subscriptions/listen", asked).await.ok()?;
            Some(Held::Listening(request))
        }
    }
}
