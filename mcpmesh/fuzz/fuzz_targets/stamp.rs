//! The identity splice of the `socket` backend: any frame a peer sends is stamped or refused,
//! never a panic; a stamped frame is JSON whose `_meta` holds exactly the node's `mcpmesh/*`
//! member, and everything else in it is what the caller sent.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mcpmesh::backends::stamp::{PEER_KEY, PeerStamp, strip};
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
    if !original.is_object() {
        return;
    }
    if let Ok(out) = PeerStamp::new(&peer).request(line) {
        let stamped: Value = serde_json::from_slice(&out).expect("a stamped frame is JSON");
        let meta = stamped["params"]["_meta"].as_object().expect("_meta is an object");
        assert_eq!(meta[PEER_KEY]["name"], "fuzz");
        assert_eq!(meta.keys().filter(|k| k.starts_with("mcpmesh/")).count(), 1);
        // Apart from `_meta`, the frame is what the caller sent.
        let (mut a, mut b) = (original.clone(), stamped.clone());
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
    if let Ok(Some(out)) = strip(line) {
        let stripped: Value = serde_json::from_slice(&out).expect("a stripped frame is JSON");
        let meta = stripped["params"]["_meta"].as_object().expect("_meta is an object");
        assert!(meta.keys().all(|k| !k.starts_with("mcpmesh/")));
    }
});
