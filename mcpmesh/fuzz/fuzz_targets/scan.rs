//! A long request read as it streams by: whatever bytes arrive, split wherever, the scan never
//! panics, ends the same way from any split of the line, and on a JSON object tells what a
//! peek at the whole line tells — id, method, the tool's name, the params' hash, and whether a
//! member is spelled like one MCP reads. What a JSON line is not, it is not to the scan either.

#![forbid(unsafe_code)]
#![no_main]

use libfuzzer_sys::fuzz_target;
use mcpmesh_net::jsonrpc;
use mcpmesh_net::scan::{Scan, Scanned};

/// What the serving node reads of a request, from a peek at `object`.
fn decision(object: &[u8]) -> Option<(String, String, Option<String>)> {
    let peek = jsonrpc::peek(object)?;
    Some((
        peek.id.map(|id| id.get().to_owned()).unwrap_or_default(),
        peek.method.as_deref().unwrap_or_default().to_owned(),
        peek.params.and_then(jsonrpc::subject_name),
    ))
}

fn scan(parts: &[&[u8]]) -> (Scanned, Option<usize>) {
    let (mut scan, mut at, mut closed) = (Scan::default(), 0, None);
    for part in parts {
        if let Some(i) = scan.feed(part) {
            closed.get_or_insert(at + i);
        }
        at += part.len();
    }
    (scan.finish(), closed)
}

fuzz_target!(|input: &[u8]| {
    let Some((cut, line)) = input.split_first() else {
        return;
    };
    let cut = usize::from(*cut).min(line.len());
    let (split, closed) = scan(&[&line[..cut / 2], &line[cut / 2..cut], &line[cut..]]);
    let (whole, whole_closed) = scan(&[line]);
    assert_eq!(closed, whole_closed, "the split moved the close");
    let is_json = jsonrpc::is_json(line);
    match (split, whole) {
        (Scanned::Object(a), Scanned::Object(b)) => {
            assert_eq!(a.object, b.object, "the split changed what was kept");
            assert_eq!(a.params_hash, b.params_hash);
            assert_eq!(a.smuggles, b.smuggles);
            // Only well-formed UTF-8 is compared: the scan, as a peek, does not check the
            // UTF-8 of strings it skips.
            if is_json && closed.is_some_and(|c| line[c + 1..].iter().all(u8::is_ascii_whitespace)) {
                assert_eq!(decision(&a.object), decision(line));
                assert_eq!(a.smuggles, mcpmesh_net::scan::smuggles(line));
                let params = jsonrpc::peek(line).and_then(|p| p.params);
                if let Some(params) = params {
                    assert_eq!(a.params_hash, Some(blake3::hash(params.get().as_bytes())));
                }
            }
        }
        (Scanned::NotAnObject, Scanned::NotAnObject)
        | (Scanned::Broken, Scanned::Broken)
        | (Scanned::Unclosed, Scanned::Unclosed) => {}
        (a, b) => panic!("the split changed how it ended: {a:?} against {b:?}"),
    }
});
