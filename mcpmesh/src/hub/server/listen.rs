//! A 2026-07-28 client's `subscriptions/listen` streams: the only way notifications reach such
//! a client. A stream carries the merged lists' changes it asked for, and the updates of the
//! resources it named: each one is subscribed to at the service that owns it (a 2025 server,
//! with `resources/subscribe`), whose session the stream holds open until it ends. The
//! acknowledgement names what the stream will carry and comes before anything on it.

use serde_json::{Map, Value, json};

use super::Hub;
use super::wire::{key, line, lock, rpc_error};
use crate::hub::era::{self, Era};
use crate::hub::pool::Lease;

/// Open streams of one client, at most.
const MAX_LISTENS: usize = 64;
/// Resources one stream may name, at most.
const MAX_RESOURCES: usize = 64;

/// One open stream.
pub(super) struct Listen {
    id: Value,
    /// The notifications agreed to (a `SubscriptionFilter`).
    agreed: Value,
    /// The resources subscribed to: presented URI, the service's own, and its session held.
    resources: Vec<(String, String, Lease)>,
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
    /// service is of the handshake era and offers subscriptions.
    async fn subscribe(&self, uri: &str) -> Option<(String, String, Lease)> {
        let (target, routed) = self
            .destination("resources/subscribe", json!({ "uri": uri }))
            .ok()?;
        let lease = self.lease(&target).await.ok()?;
        let up = &lease.up;
        if up.era() != Era::Handshake || up.capabilities()["resources"]["subscribe"] != json!(true)
        {
            return None;
        }
        let answer = up
            .request("resources/subscribe", routed.clone())
            .await
            .ok()?;
        answer.get("result")?;
        let own = routed["uri"].as_str()?.to_owned();
        Some((uri.to_owned(), own, lease))
    }

    /// Ends stream `id` (its client cancelled it): its resources are unsubscribed from and
    /// their sessions let go.
    pub(super) fn end_listen(&self, id: &Value) {
        let ended = lock(&self.listens).remove(&key(id));
        if let Some(listen) = ended {
            self.unsubscribe(listen);
        }
    }

    fn unsubscribe(&self, listen: Listen) {
        if listen.resources.is_empty() {
            return;
        }
        tokio::spawn(async move {
            for (_, own, lease) in listen.resources {
                let _ = lease
                    .up
                    .start("resources/unsubscribe", json!({ "uri": own }))
                    .await;
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
