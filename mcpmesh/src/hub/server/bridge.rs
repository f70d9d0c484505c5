//! The bridge for a 2026-07-28 client over a service of the handshake era. Such a server asks
//! its client things during a call — elicitation, sampling, roots — as requests of its own,
//! which a client of the stateless revision never takes. The hub holds the server's call and
//! answers the client's request with an `input_required` result carrying the server's requests
//! and a sealed `requestState`; the client's retry, carrying `inputResponses`, answers the
//! server's requests, and the call goes on, for as many rounds as the server asks.
//!
//! A state names a call the hub holds; nothing in it is trusted: it is bound to this hub (a
//! key of its own), to the call's method and name, is used once, and lapses after
//! [`STATE_TTL`]. A client that never retries gets its server's requests answered for it when
//! the state lapses: an elicitation `cancel`, anything else an error.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde_json::{Map, Value, json};
use tokio::sync::mpsc;

use super::Hub;
use super::call::{Ask, Call};
use super::wire::{lock, rpc_error};
use crate::hub::upstream::Answer;
use crate::hub::{Target, era};

/// What a server may ask during a call that the bridge carries to a stateless client.
pub(super) const BRIDGED: [&str; 3] =
    ["elicitation/create", "sampling/createMessage", "roots/list"];
/// A server's requests queued for one call at once, at most.
pub(super) const ASKS_AT_ONCE: usize = 8;
/// How long a state is valid.
const STATE_TTL: Duration = Duration::from_secs(600);
/// Calls held for their client's retry, at most.
const MAX_PARKED: usize = 256;
/// The longest state accepted back.
const MAX_STATE: usize = 64 * 1024;
/// The most the answers of one retry may weigh.
const MAX_RESPONSES: usize = 4 * 1024 * 1024;
/// What a state of this hub starts with.
const STATE_PREFIX: &str = "mcpmesh-hub1.";

/// A call held for its client's retry.
pub(super) struct Parked {
    call: Call,
    asks_tx: Option<mpsc::Sender<Ask>>,
    /// The server's requests of this round, under the keys the client was given.
    asks: Vec<(String, Ask)>,
    expires: Instant,
}

/// The calls the hub holds, and its key for their states.
pub(super) struct Bridge {
    key: [u8; 32],
    parked: HashMap<String, Parked>,
}

impl Bridge {
    pub(super) fn new() -> Self {
        let mut key = [0u8; 32];
        if getrandom::fill(&mut key).is_err() {
            // No randomness: no state of this hub can be trusted, so none is ever valid.
            tracing::warn!("no randomness for the hub's bridge; input requests are refused");
        }
        Bridge {
            key,
            parked: HashMap::new(),
        }
    }

    fn seal(&self, handle: &str, bound: &str) -> String {
        let mac = blake3::keyed_hash(&self.key, format!("{handle}\0{bound}").as_bytes());
        format!("{STATE_PREFIX}{handle}.{}", mac.to_hex())
    }

    /// The handle a state names, if this hub sealed it for a call bound to `bound`.
    fn open(&self, state: &str, bound: &str) -> Option<String> {
        if state.len() > MAX_STATE || self.key == [0u8; 32] {
            return None;
        }
        let (handle, _) = state.strip_prefix(STATE_PREFIX)?.split_once('.')?;
        let expected = self.seal(handle, bound);
        let same: bool =
            subtle::ConstantTimeEq::ct_eq(expected.as_bytes(), state.as_bytes()).into();
        same.then(|| handle.to_owned())
    }
}

/// What a retry must be to resume a call: its service, method and the name it calls there.
pub(super) fn bound(target: &Target, method: &str, params: &Value) -> String {
    format!(
        "{target}\0{method}\0{}",
        params["name"].as_str().unwrap_or_default()
    )
}

/// Whether `params` are a retry carrying one of this hub's states.
pub(super) fn is_retry(params: &Value) -> bool {
    params["requestState"]
        .as_str()
        .is_some_and(|s| s.starts_with(STATE_PREFIX))
}

/// The mode of an elicitation's `params`: as it says, else `url` when it gives one.
fn elicitation_mode(params: &Value) -> &str {
    match params.get("mode").and_then(Value::as_str) {
        Some(mode) => mode,
        None if params.get("url").is_some() => "url",
        None => "form",
    }
}

/// Whether a client whose request declared `capabilities` takes a server's request `method`
/// with `params`. The session the server was told of may be another client's (a shared one),
/// so each call's own declaration decides.
pub(super) fn declared(capabilities: &Value, method: &str, params: &Value) -> bool {
    match method {
        "elicitation/create" => {
            let elicitation = &capabilities["elicitation"];
            match elicitation_mode(params) {
                "url" => elicitation["url"].is_object(),
                // An empty `elicitation` declares the form mode alone.
                _ => {
                    elicitation["form"].is_object()
                        || elicitation.as_object().is_some_and(|e| e.is_empty())
                }
            }
        }
        "sampling/createMessage" => capabilities["sampling"].is_object(),
        "roots/list" => capabilities["roots"].is_object(),
        _ => false,
    }
}

/// The params a stateless client is given for a server's request.
fn input_request(ask: &Ask) -> Value {
    let mut params = ask.params.clone();
    if ask.method == "elicitation/create"
        && let Some(p) = params.as_object_mut()
        && !p.contains_key("mode")
    {
        let mode = elicitation_mode(&ask.params);
        p.insert("mode".into(), json!(mode));
    }
    json!({"method": ask.method, "params": params})
}

/// The answer a server gets for a request its client never answered.
fn unanswered(ask: &Ask) -> Value {
    if ask.method == "elicitation/create" {
        json!({"jsonrpc": "2.0", "id": ask.their_id, "result": {"action": "cancel"}})
    } else {
        json!({"jsonrpc": "2.0", "id": ask.their_id, "error": {"code": -32603,
            "message": "the client did not answer", "data": {"source": "mcpmesh"}}})
    }
}

fn state_ttl() -> Duration {
    std::env::var("MCPMESH_TEST_HUB_STATE_TTL_MS")
        .ok()
        .and_then(|ms| ms.parse().ok())
        .map_or(STATE_TTL, Duration::from_millis)
}

/// Rounds of `input_required` one call of a handshake-era client may take.
const MAX_ROUNDS: u32 = 16;
/// How long the client may take to answer what a round asks.
const CLIENT_ANSWER: Duration = Duration::from_secs(600);

impl Hub {
    /// The other way: a stateless server answered a handshake-era client's call with
    /// `input_required`. Each of its input requests goes to the client as a request of the
    /// hub's, and the call is retried with the answers and the server's `requestState`, until
    /// the server answers otherwise (at most [`MAX_ROUNDS`] rounds).
    pub(super) async fn input_rounds(
        &self,
        id: &Value,
        mut call: Call,
        mut asked: Value,
        params: Value,
    ) -> Vec<u8> {
        for _ in 0..MAX_ROUNDS {
            let requests = asked["inputRequests"]
                .as_object()
                .cloned()
                .unwrap_or_default();
            let mut responses = Map::new();
            for (name, request) in requests.into_iter().take(ASKS_AT_ONCE) {
                let method = request["method"].as_str().unwrap_or_default().to_owned();
                match self.ask_client(&method, &request["params"]).await {
                    Ok(answer) => {
                        responses.insert(name, answer);
                    }
                    Err(message) => {
                        call.lease.up.forget(call.upstream_id);
                        return rpc_error(id, -32603, format!("{}: {message}", call.target));
                    }
                }
            }
            let mut retry = params.clone();
            retry["inputResponses"] = Value::Object(responses);
            retry["requestState"] = asked["requestState"].clone();
            let Ok((upstream_id, rx)) = call.lease.up.start(&call.method, retry).await else {
                return rpc_error(id, -32603, format!("{}: the session ended", call.target));
            };
            call.upstream_id = upstream_id;
            call.rx = rx;
            let answer = (&mut call.rx).await.ok().map(Answer::into_frame);
            match answer {
                Some(frame) if frame["result"]["resultType"] == "input_required" => {
                    asked = frame["result"].clone();
                }
                Some(frame) => {
                    call.retry = None;
                    let (tx, rx) = tokio::sync::oneshot::channel();
                    let _ = tx.send(Answer::Frame(frame));
                    call.rx = rx;
                    return self.await_call(id, call, None).await;
                }
                None => {
                    return rpc_error(id, -32603, format!("{}: the session ended", call.target));
                }
            }
        }
        call.lease.up.forget(call.upstream_id);
        let message = format!(
            "{}: the server asked for input more than {MAX_ROUNDS} times",
            call.target
        );
        rpc_error(id, -32603, message)
    }

    /// Asks the client `method` (a request of the hub's) and waits for its result.
    async fn ask_client(&self, method: &str, params: &Value) -> Result<Value, String> {
        let ours = json!(format!(
            "hub-{}",
            self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        let (tx, rx) = tokio::sync::oneshot::channel();
        lock(&self.asks).bridged.insert(super::wire::key(&ours), tx);
        self.send(super::wire::line(
            &json!({"jsonrpc": "2.0", "id": ours, "method": method, "params": params}),
        ))
        .await;
        let answer = tokio::time::timeout(CLIENT_ANSWER, rx).await;
        lock(&self.asks).bridged.remove(&super::wire::key(&ours));
        match answer {
            Ok(Ok(frame)) => match frame.get("result") {
                Some(result) => Ok(result.clone()),
                None => Err(format!(
                    "the client refused the server's {method}: {}",
                    frame["error"]["message"].as_str().unwrap_or("an error")
                )),
            },
            _ => Err(format!("the client did not answer the server's {method}")),
        }
    }

    /// Holds `call`, whose server asked `first` (and maybe more at once), and answers the
    /// client's request `id` with an `input_required` result naming the held call.
    pub(super) async fn park(
        &self,
        id: &Value,
        mut call: Call,
        asks_tx: Option<mpsc::Sender<Ask>>,
        first: Ask,
        cancelled: bool,
    ) -> Vec<u8> {
        let mut asks = vec![first];
        if let Some(asked) = call.asked.as_mut() {
            while asks.len() < ASKS_AT_ONCE
                && let Ok(more) = asked.try_recv()
            {
                asks.push(more);
            }
        }
        let full = lock(&self.bridge).parked.len() >= MAX_PARKED;
        if cancelled || full {
            // Nobody will retry this one: the server's requests are answered for the client.
            for ask in &asks {
                call.lease.up.send(&unanswered(ask)).await;
            }
            call.lease.up.forget(call.upstream_id);
            if cancelled {
                return Vec::new();
            }
            let message = format!("the hub holds {MAX_PARKED} calls waiting for input already");
            return rpc_error(id, -32603, message);
        }
        let mut random = [0u8; 16];
        let _ = getrandom::fill(&mut random);
        let handle: String = random.iter().map(|b| format!("{b:02x}")).collect();
        let keyed: Vec<(String, Ask)> = asks
            .into_iter()
            .enumerate()
            .map(|(n, ask)| (format!("mcpmesh-{}", n + 1), ask))
            .collect();
        let requests: Map<String, Value> = keyed
            .iter()
            .map(|(key, ask)| (key.clone(), input_request(ask)))
            .collect();
        let ttl = state_ttl();
        let state = {
            let mut bridge = lock(&self.bridge);
            let state = bridge.seal(&handle, &call.bound);
            bridge.parked.insert(
                handle.clone(),
                Parked {
                    call,
                    asks_tx,
                    asks: keyed,
                    expires: Instant::now() + ttl,
                },
            );
            state
        };
        self.lapse_after(handle, ttl);
        let mut result = json!({
            "resultType": "input_required",
            "inputRequests": requests,
            "requestState": state,
        });
        era::typed("tools/call", &mut result, &super::server_info());
        super::wire::answer(id, result)
    }

    /// After `ttl`, a call still held for `handle` lapses: its server's requests are answered
    /// for the client and its answer is not waited for.
    fn lapse_after(&self, handle: String, ttl: Duration) {
        let bridge = self.bridge.clone();
        tokio::spawn(async move {
            tokio::time::sleep(ttl).await;
            let lapsed = lock(&bridge).parked.remove(&handle);
            if let Some(parked) = lapsed {
                tracing::warn!(
                    target = %parked.call.target,
                    "a call held for its client's input lapsed after {} s without a retry; its server's requests were answered for the client",
                    ttl.as_secs()
                );
                for (_, ask) in &parked.asks {
                    parked.call.lease.up.send(&unanswered(ask)).await;
                }
                parked.call.lease.up.forget(parked.call.upstream_id);
            }
        });
    }

    /// A stateless client's retry of a held call (`params` carry `requestState` and
    /// `inputResponses`): its answers go to the server, and the call goes on under `id`.
    pub(super) async fn resume(&self, id: &Value, method: &str, params: &Value) -> Vec<u8> {
        let refuse = |why: &str| rpc_error(id, -32602, format!("invalid params: {why}"));
        let state = params["requestState"].as_str().unwrap_or_default();
        let responses = match params.get("inputResponses") {
            Some(Value::Object(r)) => r.clone(),
            _ => return refuse("a retry must carry inputResponses (an object)"),
        };
        if serde_json::to_vec(&responses).map_or(usize::MAX, |b| b.len()) > MAX_RESPONSES {
            return refuse("inputResponses over 4 MiB");
        }
        let Ok((target, routed)) = self.destination(method, params.clone()) else {
            return refuse("unknown, lapsed or already used requestState");
        };
        let parked = {
            let mut bridge = lock(&self.bridge);
            let handle = bridge.open(state, &bound(&target, method, &routed));
            handle.and_then(|h| bridge.parked.remove(&h))
        };
        let Some(parked) = parked.filter(|p| p.expires > Instant::now()) else {
            return refuse("unknown, lapsed or already used requestState");
        };
        let up = parked.call.lease.up.clone();
        for (key, ask) in &parked.asks {
            let answer = match responses.get(key) {
                Some(response) => json!({"jsonrpc": "2.0", "id": ask.their_id, "result": response}),
                None => unanswered(ask),
            };
            up.send(&answer).await;
        }
        self.await_call(id, parked.call, parked.asks_tx).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_opens_only_for_its_own_hub_and_call_and_untouched() {
        let bridge = Bridge::new();
        let target = Target::parse("a/b").unwrap();
        let bound = bound(&target, "tools/call", &json!({"name": "ask"}));
        let state = bridge.seal("00ff", &bound);
        assert!(is_retry(&json!({ "requestState": state })));
        assert_eq!(bridge.open(&state, &bound).as_deref(), Some("00ff"));
        // Another call's name, another hub, an edited handle or MAC, an oversize state.
        let other = super::bound(&target, "tools/call", &json!({"name": "other"}));
        assert_eq!(bridge.open(&state, &other), None);
        assert_eq!(Bridge::new().open(&state, &bound), None);
        assert_eq!(bridge.open(&state.replace("00ff", "00fe"), &bound), None);
        let mut forged = state.clone();
        forged.pop();
        forged.push('0');
        assert!(forged == state || bridge.open(&forged, &bound).is_none());
        let huge = format!("{state}{}", "0".repeat(MAX_STATE));
        assert_eq!(bridge.open(&huge, &bound), None);
        assert!(!is_retry(&json!({"requestState": "v1.theirs"})));
    }

    #[test]
    fn a_form_elicitation_says_its_mode_and_an_unanswered_request_is_answered_for_the_client() {
        // Each request is taken only as the call's client declared.
        let caps = json!({"elicitation": {}, "sampling": {}});
        assert!(declared(
            &caps,
            "elicitation/create",
            &json!({"message": "m"})
        ));
        assert!(!declared(
            &caps,
            "elicitation/create",
            &json!({"url": "https://x"})
        ));
        assert!(declared(&caps, "sampling/createMessage", &json!({})));
        assert!(!declared(&caps, "roots/list", &json!({})));
        let url_only = json!({"elicitation": {"url": {}}});
        assert!(!declared(
            &url_only,
            "elicitation/create",
            &json!({"mode": "form"})
        ));
        assert!(declared(
            &url_only,
            "elicitation/create",
            &json!({"mode": "url"})
        ));
        assert!(!declared(&json!({}), "elicitation/create", &json!({})));
        assert!(!declared(
            &Value::Null,
            "sampling/createMessage",
            &json!({})
        ));

        let ask = |method: &str, params: Value| Ask {
            their_id: json!(7),
            method: method.into(),
            params,
        };
        let form = input_request(&ask("elicitation/create", json!({"message": "m"})));
        assert_eq!(form["params"]["mode"], "form");
        let url = input_request(&ask("elicitation/create", json!({"url": "https://x"})));
        assert_eq!(url["params"]["mode"], "url");
        assert_eq!(
            unanswered(&ask("elicitation/create", json!({})))["result"]["action"],
            "cancel"
        );
        let sampled = unanswered(&ask("sampling/createMessage", json!({})));
        assert_eq!(sampled["id"], 7);
        assert!(sampled["error"]["code"].is_i64());
    }
}
