//! The identity splice of the `socket` and `url` backends: any frame a peer sends is edited,
//! passed or refused, never a panic. No `_meta` the server gets (`params._meta`,
//! `result._meta`, `error.data._meta`) holds a caller's `mcpmesh/*` member; an edited request
//! holds exactly the node's; apart from those `_meta` members, every edited frame is what the
//! caller sent.

#![forbid(unsafe_code)]
#![no_main]

use libfuzzer_sys::fuzz_target;
use mcpmesh::backends::stamp::{PEER_KEY, PeerStamp};
use mcpmesh_net::PeerIdentity;
use serde_json::{Map, Value};

/// The `_meta` objects of a frame a server reads.
fn metas(frame: &mut Value) -> Vec<&mut Map<String, Value>> {
    let Some(fields) = frame.as_object_mut() else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for (key, value) in fields.iter_mut() {
        let holder = match key.as_str() {
            "params" | "result" => Some(value),
            "error" => value.get_mut("data"),
            _ => None,
        };
        if let Some(meta) = holder
            .and_then(|h| h.get_mut("_meta"))
            .and_then(Value::as_object_mut)
        {
            found.push(meta);
        }
    }
    found
}

/// `frame` without the `mcpmesh/*` members of its `_meta`s, and without what the node adds
/// to a request that had no `_meta` (or no `params`) to hold them.
fn without_ours(mut frame: Value) -> Value {
    for meta in metas(&mut frame) {
        meta.retain(|k, _| !k.starts_with("mcpmesh/"));
    }
    let Some(fields) = frame.as_object_mut() else {
        return frame;
    };
    if let Some(params) = fields.get_mut("params").and_then(Value::as_object_mut) {
        let empty = |m: &Value| m.is_null() || m.as_object().is_some_and(Map::is_empty);
        if params.get("_meta").is_some_and(empty) {
            params.remove("_meta");
        }
    }
    let bare = |p: &Value| p.is_null() || p.as_object().is_some_and(Map::is_empty);
    if fields.get("params").is_some_and(bare) {
        fields.remove("params");
    }
    frame
}

fn ours(frame: &mut Value) -> usize {
    metas(frame)
        .iter()
        .map(|m| m.keys().filter(|k| k.starts_with("mcpmesh/")).count())
        .sum()
}

fuzz_target!(|line: &[u8]| {
    let peer = PeerIdentity {
        endpoint: [9; 32],
        name: "fuzz".into(),
        user_id: None,
        groups: vec!["g".into()],
    };
    let Ok(mut original) = serde_json::from_slice::<Value>(line) else {
        return;
    };
    let Some(fields) = original.as_object() else {
        return;
    };
    let request = fields.contains_key("method") && fields.contains_key("id");
    match PeerStamp::new(&peer).apply(line) {
        Ok(Some(out)) => {
            let mut edited: Value = serde_json::from_slice(&out).expect("an edited frame is JSON");
            if request {
                assert_eq!(edited["params"]["_meta"][PEER_KEY]["name"], "fuzz");
                assert_eq!(ours(&mut edited), 1);
            } else {
                assert_eq!(ours(&mut edited), 0);
            }
            assert_eq!(without_ours(original), without_ours(edited));
        }
        Ok(None) => {
            assert!(!request, "a request always carries the identity");
            assert_eq!(ours(&mut original), 0, "a forgery passed");
        }
        Err(_) => {}
    }
});
