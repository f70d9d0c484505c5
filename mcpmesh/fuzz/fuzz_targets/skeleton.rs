//! The skeleton of a long line: whatever bytes arrive, split wherever, the scan never panics,
//! builds the same skeleton from any split of the line, and on a small JSON object (where
//! every member is kept) tells the same id, kind and outcome as peeking at the whole line. What
//! a JSON object cut off anywhere still tells (`so_far`) is itself a JSON object.

#![forbid(unsafe_code)]
#![no_main]

use libfuzzer_sys::fuzz_target;
use mcpmesh_net::jsonrpc;
use mcpmesh_net::skeleton::{self, Skeleton};

fuzz_target!(|input: &[u8]| {
    let Some((cut, line)) = input.split_first() else {
        return;
    };
    let whole = skeleton::of(line);
    let mut parts = Skeleton::default();
    let cut = usize::from(*cut).min(line.len());
    for part in [&line[..cut / 2], &line[cut / 2..cut], &line[cut..]] {
        parts.feed(part);
    }
    assert_eq!(parts.finish(), whole, "the split changed the skeleton");

    let Some(skeleton) = whole else { return };
    assert!(skeleton.len() <= line.len() + 2);
    if serde_json::from_slice::<serde_json::Value>(line).is_err() {
        return;
    }
    let mut prefix = Skeleton::default();
    prefix.feed(&line[..cut]);
    if let Some(so_far) = prefix.so_far() {
        let value = serde_json::from_slice::<serde_json::Value>(&so_far);
        assert!(
            value.as_ref().is_ok_and(serde_json::Value::is_object),
            "{:?}",
            String::from_utf8_lossy(&so_far)
        );
    }
    let (full, kept) = (jsonrpc::peek(line), jsonrpc::peek(&skeleton));
    assert_eq!(full.is_some(), kept.is_some());
    if let (Some(full), Some(kept)) = (full, kept) {
        assert_eq!(full.kind(), kept.kind());
        assert_eq!(full.id.map(|i| i.get()), kept.id.map(|i| i.get()));
        assert_eq!(full.method, kept.method);
    }
    let (full, kept) = (jsonrpc::peek_response(line), jsonrpc::peek_response(&skeleton));
    assert_eq!(full.is_some(), kept.is_some());
    if let (Some(full), Some(kept)) = (full, kept) {
        assert_eq!(full.answers().map(|i| i.get()), kept.answers().map(|i| i.get()));
        assert_eq!(full.outcome(), kept.outcome());
    }
});
