//! The two eras of MCP the hub speaks, to its client and to each service: the handshake era
//! (`initialize`; 2025-11-25 and the revisions before it) and the stateless one (2026-07-28:
//! no handshake, `server/discover`, the protocol's fields in every request's `_meta`, every
//! result typed with `resultType`, lists and reads carrying `cacheScope` and `ttlMs`).
//!
//! A stateless request's envelope is checked here, once, and never forwarded on trust: the
//! hub stamps the envelope a service sees itself, and takes it off for a handshake-era one.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

/// The stateless revision.
pub const STATELESS: &str = "2026-07-28";
/// Revisions of the handshake era the hub speaks; the first is its default.
pub const HANDSHAKE: [&str; 4] = ["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"];

pub const META_VERSION: &str = "io.modelcontextprotocol/protocolVersion";
pub const META_CLIENT_INFO: &str = "io.modelcontextprotocol/clientInfo";
pub const META_CLIENT_CAPABILITIES: &str = "io.modelcontextprotocol/clientCapabilities";
pub const META_SERVER_INFO: &str = "io.modelcontextprotocol/serverInfo";
pub const META_SUBSCRIPTION: &str = "io.modelcontextprotocol/subscriptionId";
/// A stateless client's opt-in to log messages.
const META_LOG_LEVEL: &str = "io.modelcontextprotocol/logLevel";
/// The stateless era's error for a protocol version the receiver does not speak.
pub const UNSUPPORTED_VERSION: i64 = -32022;

/// Which era a client or a service speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Era {
    Handshake,
    Stateless,
}

/// A stateless request's envelope, checked: who asks, and what it can take.
#[derive(Debug, Clone, PartialEq)]
pub struct Envelope {
    pub client_info: Value,
    pub capabilities: Value,
}

/// Why a stateless request is refused.
#[derive(Debug, Clone, PartialEq)]
pub enum Refusal {
    /// A protocol version the hub does not speak (the value as sent).
    Version(Value),
    /// A field the envelope must carry is missing or not an object.
    Missing(&'static str),
    /// A stateless request from a client that began with `initialize`.
    Handshaken,
}

impl Refusal {
    /// The JSON-RPC error answering the request (code, message, data).
    pub fn error(&self) -> (i64, String, Value) {
        match self {
            Refusal::Version(asked) => (
                UNSUPPORTED_VERSION,
                format!("unsupported protocol version {asked}"),
                json!({"requested": asked, "supported": [STATELESS]}),
            ),
            Refusal::Handshaken => (
                UNSUPPORTED_VERSION,
                format!(
                    "this session began with initialize; {STATELESS} requests have no place in it"
                ),
                json!({"requested": STATELESS, "supported": HANDSHAKE}),
            ),
            Refusal::Missing(field) => (
                -32602,
                format!("invalid params: _meta must carry {field} (an object)"),
                json!({"source": "mcpmesh"}),
            ),
        }
    }
}

impl Envelope {
    /// The envelope `params` carry: `None` when they name no protocol version (a request of
    /// the handshake era), else the checked envelope or why it is refused.
    pub fn of(params: &Value) -> Option<Result<Envelope, Refusal>> {
        let meta = params.get("_meta")?;
        let version = meta.get(META_VERSION)?;
        if version.as_str() != Some(STATELESS) {
            return Some(Err(Refusal::Version(version.clone())));
        }
        let object = |key: &'static str| {
            meta.get(key)
                .filter(|v| v.is_object())
                .cloned()
                .ok_or(Refusal::Missing(key))
        };
        Some(object(META_CLIENT_INFO).and_then(|client_info| {
            Ok(Envelope {
                client_info,
                capabilities: object(META_CLIENT_CAPABILITIES)?,
            })
        }))
    }

    /// The hub's own envelope, for a service asked before its client said who it is.
    pub fn hub() -> Envelope {
        Envelope {
            client_info: json!({"name": "mcpmesh-hub", "version": env!("CARGO_PKG_VERSION")}),
            capabilities: json!({}),
        }
    }

    /// Writes this envelope into `params._meta`, keeping what else `_meta` holds (a progress
    /// token, a trace context).
    pub fn stamp(&self, params: &mut Value) {
        let Some(meta) = meta_of(params) else { return };
        meta.insert(META_VERSION.into(), json!(STATELESS));
        meta.insert(META_CLIENT_INFO.into(), self.client_info.clone());
        meta.insert(META_CLIENT_CAPABILITIES.into(), self.capabilities.clone());
    }
}

/// `params._meta` as an object to write into (made when missing); `None` when `params` is
/// neither null nor an object.
fn meta_of(params: &mut Value) -> Option<&mut Map<String, Value>> {
    if params.is_null() {
        *params = json!({});
    }
    let params = params.as_object_mut()?;
    let meta = params.entry("_meta").or_insert_with(|| json!({}));
    if !meta.is_object() {
        *meta = json!({});
    }
    meta.as_object_mut()
}

/// Takes the stateless envelope off `params`, for a service of the handshake era (whose
/// session already says who asks); `_meta` goes when nothing else is in it.
pub fn strip(params: &mut Value) {
    let Some(object) = params.as_object_mut() else {
        return;
    };
    let Some(meta) = object.get_mut("_meta").and_then(Value::as_object_mut) else {
        return;
    };
    for key in [
        META_VERSION,
        META_CLIENT_INFO,
        META_CLIENT_CAPABILITIES,
        META_LOG_LEVEL,
    ] {
        meta.remove(key);
    }
    if meta.is_empty() {
        object.remove("_meta");
    }
}

/// Whether the answer to `method` is one a client may cache (it carries `cacheScope` and
/// `ttlMs` in the stateless era).
fn cacheable(method: &str) -> bool {
    matches!(
        method,
        "server/discover"
            | "tools/list"
            | "prompts/list"
            | "resources/list"
            | "resources/templates/list"
            | "resources/read"
            | "skills/list"
            | "skills/get"
    )
}

/// Makes `result` (the answer to `method`) one a stateless client accepts: typed `complete`
/// unless it says otherwise (an `input_required` result stays one), `cacheScope` and `ttlMs`
/// where the answer is cacheable — `private`, since what the hub lists depends on the caller's
/// rights — and the hub named as the server that answered.
pub fn typed(method: &str, result: &mut Value, server_info: &Value) {
    let Some(object) = result.as_object_mut() else {
        return;
    };
    object
        .entry("resultType")
        .or_insert_with(|| json!("complete"));
    if cacheable(method) {
        object.insert("cacheScope".into(), json!("private"));
        let ttl = object.get("ttlMs").and_then(Value::as_u64).unwrap_or(0);
        object.insert("ttlMs".into(), json!(ttl));
    }
    let meta = object.entry("_meta").or_insert_with(|| json!({}));
    if !meta.is_object() {
        *meta = json!({});
    }
    if let Some(meta) = meta.as_object_mut() {
        meta.insert(META_SERVER_INFO.into(), server_info.clone());
    }
}

/// Whether a `server/discover` result says the server speaks the stateless revision.
pub fn speaks_stateless(discovered: &Value) -> bool {
    discovered["supportedVersions"]
        .as_array()
        .is_some_and(|v| v.iter().any(|v| v == STATELESS))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta() -> Value {
        json!({
            META_VERSION: STATELESS,
            META_CLIENT_INFO: {"name": "c", "version": "1"},
            META_CLIENT_CAPABILITIES: {"elicitation": {}},
            "progressToken": 7,
        })
    }

    #[test]
    fn an_envelope_is_read_checked_and_refused_with_the_eras_own_errors() {
        assert_eq!(Envelope::of(&json!({"name": "x"})), None);
        assert_eq!(Envelope::of(&json!({"_meta": {"progressToken": 1}})), None);
        let ok = Envelope::of(&json!({"_meta": meta()})).unwrap().unwrap();
        assert_eq!(ok.client_info["name"], "c");
        assert_eq!(ok.capabilities, json!({"elicitation": {}}));

        let mut other = meta();
        other[META_VERSION] = json!("2099-01-01");
        let refused = Envelope::of(&json!({"_meta": other})).unwrap().unwrap_err();
        let (code, _, data) = refused.error();
        assert_eq!(code, -32022);
        assert_eq!(data["requested"], "2099-01-01");
        assert_eq!(data["supported"], json!([STATELESS]));

        for field in [META_CLIENT_INFO, META_CLIENT_CAPABILITIES] {
            let mut lacking = meta();
            lacking.as_object_mut().unwrap().remove(field);
            let refused = Envelope::of(&json!({"_meta": lacking}))
                .unwrap()
                .unwrap_err();
            assert_eq!(refused, Refusal::Missing(field));
            assert_eq!(refused.error().0, -32602);
        }
        let mut not_object = meta();
        not_object[META_CLIENT_INFO] = json!("c");
        assert!(
            Envelope::of(&json!({"_meta": not_object}))
                .unwrap()
                .is_err()
        );
    }

    #[test]
    fn stamping_keeps_the_rest_of_meta_and_stripping_takes_only_the_envelope() {
        let envelope = Envelope::hub();
        let mut params = json!({"name": "t", "_meta": {"progressToken": "p"}});
        envelope.stamp(&mut params);
        assert_eq!(params["_meta"]["progressToken"], "p");
        assert_eq!(params["_meta"][META_VERSION], STATELESS);
        assert_eq!(params["_meta"][META_CLIENT_INFO]["name"], "mcpmesh-hub");

        let mut none = Value::Null;
        envelope.stamp(&mut none);
        assert_eq!(none["_meta"][META_VERSION], STATELESS);

        let mut params = json!({"name": "t", "_meta": meta()});
        strip(&mut params);
        assert_eq!(params, json!({"name": "t", "_meta": {"progressToken": 7}}));
        let mut params = json!({"name": "t", "_meta": {META_VERSION: STATELESS}});
        strip(&mut params);
        assert_eq!(params, json!({"name": "t"}));
    }

    #[test]
    fn results_are_typed_cacheable_ones_scoped_private_and_input_required_stays() {
        let info = json!({"name": "mcpmesh-hub", "version": "1"});
        let mut list = json!({"tools": []});
        typed("tools/list", &mut list, &info);
        assert_eq!(list["resultType"], "complete");
        assert_eq!(list["cacheScope"], "private");
        assert_eq!(list["ttlMs"], 0);
        assert_eq!(list["_meta"][META_SERVER_INFO], info);

        let mut read = json!({"contents": [], "ttlMs": 5000, "cacheScope": "public"});
        typed("resources/read", &mut read, &info);
        assert_eq!(read["ttlMs"], 5000);
        assert_eq!(read["cacheScope"], "private");

        let mut call = json!({"resultType": "input_required", "requestState": "s",
            "_meta": {META_SERVER_INFO: {"name": "upstream"}, "other": 1}});
        typed("tools/call", &mut call, &info);
        assert_eq!(call["resultType"], "input_required");
        assert!(call.get("cacheScope").is_none());
        assert_eq!(call["_meta"][META_SERVER_INFO], info);
        assert_eq!(call["_meta"]["other"], 1);
    }

    #[test]
    fn a_discover_result_speaks_the_stateless_revision_only_when_it_lists_it() {
        assert!(speaks_stateless(
            &json!({"supportedVersions": ["2026-07-28"]})
        ));
        assert!(!speaks_stateless(
            &json!({"supportedVersions": ["2025-11-25"]})
        ));
        assert!(!speaks_stateless(&json!({})));
    }
}
