//! Where a gateway session's server messages go: the answer to each request in flight, its
//! progress, and, while no GET stream is open, the newest request's stream. Each step is a map
//! look-up, however many requests are in flight; how many may be is capped by the caller.

use std::collections::{BTreeMap, HashMap, VecDeque};

use axum::body::Bytes;
use mcpmesh_net::jsonrpc;
use serde_json::value::RawValue;
use tokio::sync::mpsc;

use super::STREAM_QUEUE;

/// Where the server's messages go. Every step of routing one message is a map look-up: the
/// answer to a request, its progress, and the newest request's stream.
#[derive(Default)]
pub(super) struct Routes {
    /// Request id as the server sees it (an id key) → the POST waiting for its answer.
    pub(super) waiting: HashMap<String, Waiter>,
    /// Progress token (as a key) → request id key.
    pub(super) tokens: HashMap<String, String>,
    /// Request ids by arrival (for unrelated messages while no GET stream is open).
    pub(super) order: BTreeMap<u64, String>,
    /// Numbers requests in arrival order, and names the remapped ones.
    pub(super) next: u64,
    pub(super) get: Option<mpsc::Sender<Bytes>>,
    pub(super) backlog: VecDeque<Bytes>,
}

/// One POST waiting for its answer.
pub(super) struct Waiter {
    pub(super) tx: mpsc::Sender<Bytes>,
    /// Its place in [`Routes::order`].
    seq: u64,
    /// Its progress token's key, when it asked for progress.
    token: Option<String>,
    /// The id the client wrote, when the server was sent another: the answer gets it back.
    pub(super) client_id: Option<Box<RawValue>>,
    /// Likewise its progress token: its progress notifications get it back.
    pub(super) client_token: Option<Box<RawValue>>,
}

/// Why a request was not registered.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Refused {
    /// The session has as many requests in flight as it may.
    Full,
    /// The session already waits for an answer under that id.
    Duplicate,
}

impl Routes {
    /// Registers a request under `key`; `client`: the id and progress token the client wrote,
    /// when the server is sent others.
    pub(super) fn insert(
        &mut self,
        key: String,
        token: Option<&RawValue>,
        client: Option<(Box<RawValue>, Option<Box<RawValue>>)>,
        cap: usize,
    ) -> Result<mpsc::Receiver<Bytes>, Refused> {
        if let Some(w) = self.waiting.get(&key) {
            if !w.tx.is_closed() {
                return Err(Refused::Duplicate);
            }
            // Its client went away; the id is free again.
            self.remove(&key);
        }
        if self.waiting.len() >= cap {
            // Only at the cap: the waiters whose clients went away make room first.
            let gone: Vec<String> = self
                .waiting
                .iter()
                .filter(|(_, w)| w.tx.is_closed())
                .map(|(k, _)| k.clone())
                .collect();
            for k in &gone {
                self.remove(k);
            }
            if self.waiting.len() >= cap {
                return Err(Refused::Full);
            }
        }
        let (tx, rx) = mpsc::channel(STREAM_QUEUE);
        let seq = self.next;
        self.next += 1;
        let token = token.map(jsonrpc::id_key);
        if let Some(t) = &token {
            self.tokens.insert(t.clone(), key.clone());
        }
        self.order.insert(seq, key.clone());
        let (client_id, client_token) = client.map_or((None, None), |(id, t)| (Some(id), t));
        self.waiting.insert(
            key,
            Waiter {
                tx,
                seq,
                token,
                client_id,
                client_token,
            },
        );
        Ok(rx)
    }

    /// Takes the waiter for `key` out of every map.
    pub(super) fn remove(&mut self, key: &str) -> Option<Waiter> {
        let w = self.waiting.remove(key)?;
        self.order.remove(&w.seq);
        if let Some(t) = &w.token
            && self.tokens.get(t).is_some_and(|k| k == key)
        {
            self.tokens.remove(t);
        }
        Some(w)
    }

    pub(super) fn clear(&mut self) {
        self.waiting.clear();
        self.tokens.clear();
        self.order.clear();
        self.get = None;
    }
}

/// `line` (one JSON-RPC message) with its `id` member's value replaced by `id`; every other
/// byte stays as it was. `None` when it has no id.
pub(super) fn with_id(line: &[u8], id: &RawValue) -> Option<Bytes> {
    let old = jsonrpc::peek(line)?.id?;
    Some(replaced(line, old, id))
}

/// A request `line` with its id and its `params._meta.progressToken` (when it has one)
/// replaced; every other byte stays as it was.
pub(super) fn with_id_and_token(line: &[u8], id: &RawValue, token: &RawValue) -> Option<Bytes> {
    #[derive(serde::Deserialize)]
    struct Request<'a> {
        #[serde(borrow)]
        params: Option<Params<'a>>,
    }
    #[derive(serde::Deserialize)]
    struct Params<'a> {
        #[serde(borrow, rename = "_meta")]
        meta: Option<Meta<'a>>,
    }
    #[derive(serde::Deserialize)]
    struct Meta<'a> {
        #[serde(borrow, rename = "progressToken")]
        token: Option<&'a RawValue>,
    }
    let with_id = with_id(line, id)?;
    let request: Request<'_> = serde_json::from_slice(&with_id).ok()?;
    match request.params.and_then(|p| p.meta?.token) {
        Some(old) => Some(replaced(&with_id, old, token)),
        None => Some(with_id.clone()),
    }
}

/// A `notifications/progress` line with its `params.progressToken` replaced by `token`.
pub(super) fn with_progress_token(line: &[u8], token: &RawValue) -> Option<Bytes> {
    let peek = jsonrpc::peek(line)?;
    let old = peek.progress_token()?;
    Some(replaced(line, old, token))
}

/// Where a 2026-07-28 notification names the `subscriptions/listen` stream it belongs to.
const SUBSCRIPTION_ID: &str = "io.modelcontextprotocol/subscriptionId";

/// The `params._meta` subscription id of a notification `line`, when it names one.
pub(super) fn subscription_id<'a>(peek: &jsonrpc::Peek<'a>) -> Option<&'a RawValue> {
    #[derive(serde::Deserialize)]
    struct Params<'a> {
        #[serde(borrow, rename = "_meta")]
        meta: Option<std::collections::HashMap<std::borrow::Cow<'a, str>, &'a RawValue>>,
    }
    if peek.id.is_some() {
        return None;
    }
    let params: Params<'a> = serde_json::from_str(peek.params?.get()).ok()?;
    params.meta?.get(SUBSCRIPTION_ID).copied()
}

/// A notification `line` with its `params._meta` subscription id replaced by `id`.
pub(super) fn with_subscription_id(line: &[u8], id: &RawValue) -> Option<Bytes> {
    let peek = jsonrpc::peek(line)?;
    let old = subscription_id(&peek)?;
    Some(replaced(line, old, id))
}

/// `line` with the value `old` (a slice of it) replaced by `new`.
fn replaced(line: &[u8], old: &RawValue, new: &RawValue) -> Bytes {
    let old = old.get();
    let start = old.as_ptr() as usize - line.as_ptr() as usize;
    let end = start + old.len();
    let mut out = Vec::with_capacity(line.len() - old.len() + new.get().len());
    out.extend_from_slice(&line[..start]);
    out.extend_from_slice(new.get().as_bytes());
    out.extend_from_slice(&line[end..]);
    out.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(s: &str) -> Box<RawValue> {
        RawValue::from_string(s.to_owned()).unwrap()
    }

    #[test]
    fn an_id_is_replaced_and_every_other_byte_kept() {
        let line = br#"{ "result" : {"id":1}, "id" :"mcpmesh-gateway:3" ,"jsonrpc":"2.0"}"#;
        let out = with_id(line, &raw(r#""a\u0062""#)).unwrap();
        assert_eq!(
            &out[..],
            br#"{ "result" : {"id":1}, "id" :"a\u0062" ,"jsonrpc":"2.0"}"#
        );
        assert!(with_id(br#"{"method":"n"}"#, &raw("1")).is_none());
    }

    #[test]
    fn a_progress_token_is_replaced_both_ways_and_every_other_byte_kept() {
        let line =
            br#"{"id":7,"method":"m","params":{"x":1,"_meta":{"progressToken": "p\u0031"}}}"#;
        let out = with_id_and_token(line, &raw(r#""g:1""#), &raw(r#""g:1""#)).unwrap();
        assert_eq!(
            &out[..],
            br#"{"id":"g:1","method":"m","params":{"x":1,"_meta":{"progressToken": "g:1"}}}"#
        );
        let bare = with_id_and_token(br#"{"id":7,"method":"m"}"#, &raw("8"), &raw("9")).unwrap();
        assert_eq!(&bare[..], br#"{"id":8,"method":"m"}"#);
        let note =
            br#"{"method":"notifications/progress","params":{"progressToken":"g:1","progress":0}}"#;
        let back = with_progress_token(note, &raw(r#""p\u0031""#)).unwrap();
        assert_eq!(
            &back[..],
            br#"{"method":"notifications/progress","params":{"progressToken":"p\u0031","progress":0}}"#
        );
    }

    #[test]
    fn a_listen_streams_notification_gets_the_clients_subscription_id_back() {
        let line = br#"{"jsonrpc":"2.0","method":"notifications/resources/updated","params":{"uri":"u","_meta":{"io.modelcontextprotocol/subscriptionId":"mcpmesh-gateway:4"}}}"#;
        let peek = jsonrpc::peek(line).unwrap();
        assert_eq!(
            subscription_id(&peek).unwrap().get(),
            r#""mcpmesh-gateway:4""#
        );
        let back = with_subscription_id(line, &raw(r#"{"a":1}"#)).unwrap();
        assert_eq!(
            &back[..],
            &br#"{"jsonrpc":"2.0","method":"notifications/resources/updated","params":{"uri":"u","_meta":{"io.modelcontextprotocol/subscriptionId":{"a":1}}}}"#[..]
        );
        // An answer is no stream's notification, and a notification without one names none.
        let answer = br#"{"jsonrpc":"2.0","id":1,"params":{"_meta":{"io.modelcontextprotocol/subscriptionId":1}}}"#;
        assert!(subscription_id(&jsonrpc::peek(answer).unwrap()).is_none());
        let plain =
            br#"{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info"}}"#;
        assert!(subscription_id(&jsonrpc::peek(plain).unwrap()).is_none());
    }

    #[test]
    fn a_full_table_refuses_until_an_answer_or_a_departed_client_frees_a_place() {
        let mut routes = Routes::default();
        let a = routes
            .insert("1".into(), Some(&raw(r#""t""#)), None, 2)
            .unwrap();
        let _b = routes.insert("2".into(), None, None, 2).unwrap();
        assert_eq!(
            routes.insert("3".into(), None, None, 2).err(),
            Some(Refused::Full)
        );
        assert_eq!(
            routes.insert("2".into(), None, None, 9).err(),
            Some(Refused::Duplicate)
        );
        assert!(routes.remove("1").is_some());
        assert!(routes.tokens.is_empty() && routes.order.len() == 1);
        let _c = routes.insert("3".into(), None, None, 2).unwrap();
        drop(a);
        drop(_b);
        // Both places are held by gone clients now: the next insert clears them.
        drop(_c);
        let _d = routes.insert("4".into(), None, None, 2).unwrap();
        assert_eq!(routes.waiting.len(), 1);
        assert_eq!(
            routes.order.values().next_back().map(String::as_str),
            Some("4")
        );
    }
}
