//! The identity splice of the `socket` and `url` backends: any frame a peer sends is edited,
//! passed or refused, never a panic. An edited request is JSON whose `_meta` holds exactly the
//! node's `mcpmesh/*` member; an edited notification holds none; apart from `_meta`, every
//! edited frame is what the caller sent.

#![forbid(unsafe_code)]
#![no_main]

use libfuzzer_sys::fuzz_target;
use mcpmesh::backends::stamp::{PEER_KEY, PeerStamp};
use mcpmesh_net::PeerIdentity;
use serde_json::Value;

fuzz_target!(|line: &[u8]| {
    let peer = PeerIdentity {
        endpoint: [9; 32],
        name: "fuzz".into(),
        user_id: None,
        groups: vec!["g".into()],
    };
    let Ok(original) = serde_json::from_slice::<Value>(line) else {
        return;
    };
    let Some(fields) = original.as_object() else {
        return;
    };
    let request = fields.contains_key("method") && fields.contains_key("id");
    match PeerStamp::new(&peer).apply(line) {
        Ok(Some(out)) => {
            let edited: Value = serde_json::from_slice(&out).expect("an edited frame is JSON");
            let meta = edited["params"]["_meta"].as_object().expect("_meta is an object");
            let ours = meta.keys().filter(|k| k.starts_with("mcpmesh/")).count();
            if request {
                assert_eq!(meta[PEER_KEY]["name"], "fuzz");
                assert_eq!(ours, 1);
            } else {
                assert_eq!(ours, 0);
            }
            let (mut a, mut b) = (original.clone(), edited.clone());
            for v in [&mut a, &mut b] {
                if let Some(params) = v.get_mut("params").and_then(Value::as_object_mut) {
                    params.remove("_meta");
                }
                if v.get("params").is_some_and(|p| p.as_object().is_some_and(|o| o.is_empty()) || p.is_null()) {
                    v.as_object_mut().map(|o| o.remove("params"));
                }
            }
            assert_eq!(a, b);
        }
        Ok(None) => assert!(!request, "a request always carries the identity"),
        Err(_) => {}
    }
});
