//! Lines to the hub's client: the shapes of the answers and errors the hub makes itself, and
//! the small helpers every part of the hub shares.

use std::sync::Mutex as StdMutex;

use mcpmesh_net::errors::{ErrorCode, ErrorFrame};
use serde_json::value::RawValue;
use serde_json::{Value, json};

pub(super) fn key(id: &Value) -> String {
    id.to_string()
}

pub(super) fn lock<T>(m: &StdMutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

pub(super) fn answer(id: &Value, result: Value) -> Vec<u8> {
    line(&json!({"jsonrpc": "2.0", "id": id, "result": result}))
}

pub(super) fn line(frame: &Value) -> Vec<u8> {
    let mut out = serde_json::to_vec(frame).unwrap_or_default();
    out.push(b'\n');
    out
}

/// An error of the mesh's band (or a JSON-RPC one) answering `id`.
pub(super) fn mesh_error(id: &Value, code: ErrorCode, message: impl Into<String>) -> Vec<u8> {
    let raw = RawValue::from_string(id.to_string()).ok();
    ErrorFrame::new(code)
        .id(raw.as_deref())
        .message(message)
        .to_line()
}

pub(super) fn rpc_error(id: &Value, code: i64, message: impl Into<String>) -> Vec<u8> {
    line(&json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": {"code": code, "message": message.into(), "data": {"source": "mcpmesh"}},
    }))
}

/// Whether `id` is one MCP allows a request: a string or an integer. The rule of
/// `mcpmesh_net::jsonrpc::valid_id`, read off the tree the hub already has (writing the id out
/// again to check it was 1% of the hub's work per request).
pub(super) fn valid_id(id: &Value) -> bool {
    id.is_string() || id.is_i64() || id.is_u64()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_is_valid_here_exactly_when_the_serving_node_takes_it() {
        for id in [
            "1",
            "-5",
            "-0",
            "\"a\"",
            "\"\"",
            "1.5",
            "1.0",
            "1e3",
            "null",
            "true",
            "[1]",
            "{}",
            "18446744073709551615",
            "18446744073709551616",
            "-9223372036854775809",
        ] {
            let raw = serde_json::value::RawValue::from_string(id.to_owned()).unwrap();
            let tree: Value = serde_json::from_str(id).unwrap();
            assert_eq!(
                valid_id(&tree),
                mcpmesh_net::jsonrpc::valid_id(&raw),
                "{id}"
            );
        }
    }
}
