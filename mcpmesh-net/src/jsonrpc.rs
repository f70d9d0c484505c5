//! Just enough JSON-RPC to make decisions about a frame without changing it.
//!
//! [`peek`] borrows from the line: the id and params stay raw slices, nothing is re-serialized,
//! and the caller forwards the original bytes.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;

/// The members of a JSON-RPC message that routing decisions look at.
#[derive(Debug, Deserialize)]
pub struct Peek<'a> {
    /// Present whenever the frame has an `id` member, `null` included: such a frame is a
    /// request (or a response), never a notification.
    #[serde(borrow, default, deserialize_with = "member")]
    pub id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub method: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub params: Option<&'a RawValue>,
}

/// Keeps a member that is present, `null` included (serde reads `null` as absent).
fn member<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&RawValue>::deserialize(d).map(Some)
}

/// Whether `id` is one MCP allows: a string or an integer.
pub fn valid_id(id: &RawValue) -> bool {
    if spelled_as_key(id) {
        return true;
    }
    match serde_json::from_str::<serde_json::Value>(id.get()) {
        Ok(serde_json::Value::String(_)) => true,
        Ok(serde_json::Value::Number(n)) => n.is_i64() || n.is_u64(),
        _ => false,
    }
}

/// What kind of message a frame is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Request,
    Notification,
    Response,
}

impl Peek<'_> {
    pub fn kind(&self) -> Kind {
        match (&self.method, &self.id) {
            (Some(_), Some(_)) => Kind::Request,
            (Some(_), None) => Kind::Notification,
            (None, _) => Kind::Response,
        }
    }

    /// For `notifications/cancelled`, the id of the request it cancels.
    pub fn cancelled_request(&self) -> Option<&RawValue> {
        self.notification_param("notifications/cancelled", "requestId")
    }

    /// For `notifications/progress`, the token it reports progress under.
    pub fn progress_token(&self) -> Option<&RawValue> {
        self.notification_param("notifications/progress", "progressToken")
    }

    /// Member `key` of the params, when this is the notification `method`.
    fn notification_param(&self, method: &str, key: &str) -> Option<&RawValue> {
        if self.method.as_deref() != Some(method) || self.id.is_some() {
            return None;
        }
        let params: std::collections::HashMap<Cow<'_, str>, &RawValue> =
            serde_json::from_str(self.params?.get()).ok()?;
        params.get(key).copied()
    }
}

/// How a response ended, as far as an audit record cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Ok,
    /// A JSON-RPC error, with its code.
    Error(i64),
    /// A tool result with `isError: true`.
    ToolError,
}

/// The members of a response an audit record looks at.
#[derive(Debug, Deserialize)]
pub struct ResponsePeek<'a> {
    #[serde(borrow, default)]
    pub id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub method: Option<&'a RawValue>,
    #[serde(default)]
    error: Option<ErrorPeek>,
    #[serde(default)]
    result: Option<ResultPeek>,
}

#[derive(Debug, Deserialize)]
struct ErrorPeek {
    #[serde(default)]
    code: i64,
}

#[derive(Debug, Deserialize)]
struct ResultPeek {
    #[serde(rename = "isError", default)]
    is_error: Option<bool>,
}

impl ResponsePeek<'_> {
    /// The id this frame answers, when it is a response.
    pub fn answers(&self) -> Option<&RawValue> {
        if self.method.is_some() {
            return None;
        }
        self.id
    }

    pub fn outcome(&self) -> Outcome {
        match (&self.error, &self.result) {
            (Some(e), _) => Outcome::Error(e.code),
            (
                None,
                Some(ResultPeek {
                    is_error: Some(true),
                }),
            ) => Outcome::ToolError,
            _ => Outcome::Ok,
        }
    }
}

/// Peeks at a frame from a server; `None` if it is not a JSON object.
pub fn peek_response(line: &[u8]) -> Option<ResponsePeek<'_>> {
    if !is_object(line) {
        return None;
    }
    serde_json::from_slice(line).ok()
}

/// What a request's `params._meta` says about transport matters.
#[derive(Debug, Default)]
pub struct MetaPeek {
    /// `progressToken`: the request asks for progress under this token.
    pub progress_token: Option<Box<RawValue>>,
    /// `io.modelcontextprotocol/protocolVersion`: a 2026-07-28 (stateless) request.
    pub protocol_version: Option<String>,
    /// W3C trace context (`traceparent`, `tracestate`): the caller's span (SEP-414).
    pub traceparent: Option<String>,
    pub tracestate: Option<String>,
}

/// Peeks at `params._meta`; an absent or malformed one says nothing.
pub fn meta(params: Option<&RawValue>) -> MetaPeek {
    #[derive(Deserialize)]
    struct Params {
        #[serde(rename = "_meta", default)]
        meta: Option<Meta>,
    }
    #[derive(Deserialize)]
    struct Meta {
        #[serde(rename = "progressToken", default)]
        progress_token: Option<Box<RawValue>>,
        #[serde(rename = "io.modelcontextprotocol/protocolVersion", default)]
        protocol_version: Option<String>,
        // Read as any value, so that a malformed one says nothing rather than hiding the rest.
        #[serde(default)]
        traceparent: Option<serde_json::Value>,
        #[serde(default)]
        tracestate: Option<serde_json::Value>,
    }
    let text = |v: Option<serde_json::Value>| match v {
        Some(serde_json::Value::String(s)) => Some(s),
        _ => None,
    };
    params
        .and_then(|p| serde_json::from_str::<Params>(p.get()).ok())
        .and_then(|p| p.meta)
        .map(|m| MetaPeek {
            progress_token: m.progress_token,
            protocol_version: m.protocol_version,
            traceparent: text(m.traceparent),
            tracestate: text(m.tracestate),
        })
        .unwrap_or_default()
}

/// The name a request is about: `params.name` (tools, prompts) or `params.uri` (resources).
pub fn subject_name(params: &RawValue) -> Option<String> {
    #[derive(Deserialize)]
    struct Named {
        #[serde(default)]
        name: Option<String>,
        #[serde(default)]
        uri: Option<String>,
    }
    let named: Named = serde_json::from_str(params.get()).ok()?;
    named.name.or(named.uri)
}

/// The members a decision on a message reads at its top level.
pub const TOP_KEYS: &[&str] = &["jsonrpc", "id", "method", "params", "result", "error"];
/// The members a decision on a message reads of its `params`, or a server reads to act.
pub const PARAMS_KEYS: &[&str] = &[
    "name",
    "uri",
    "arguments",
    "cursor",
    "_meta",
    "requestId",
    "progressToken",
];

/// Whether `key`, not one of `keys` itself, is one of them to a parser that matches keys
/// ignoring case — Go's `encoding/json` (CVE-2026-27896 in the Go MCP SDK), or a .NET or Java
/// parser told to: ASCII case, and the four letters outside ASCII whose case mapping is an
/// ASCII letter (`ſ` as s, the Kelvin sign as k, `ı` and `İ` as i).
pub fn spelled_like(key: &str, keys: &[&str]) -> bool {
    !keys.contains(&key) && keys.iter().any(|k| folds_to(key, k))
}

fn folds_to(key: &str, ascii: &str) -> bool {
    let mut chars = key.chars();
    ascii
        .bytes()
        .all(|a| chars.next().and_then(fold) == Some(a.to_ascii_lowercase()))
        && chars.next().is_none()
}

/// The ASCII letter (lower case) a parser ignoring case may read `c` as.
fn fold(c: char) -> Option<u8> {
    match c {
        '\u{17F}' => Some(b's'),
        '\u{212A}' => Some(b'k'),
        '\u{130}' | '\u{131}' => Some(b'i'),
        c if c.is_ascii() => Some(c.to_ascii_lowercase() as u8),
        _ => None,
    }
}

/// Peeks at one frame (a JSON object); `None` if it is not one.
pub fn peek(line: &[u8]) -> Option<Peek<'_>> {
    // serde would also build the struct from an array; only an object is a message.
    if !is_object(line) {
        return None;
    }
    serde_json::from_slice(line).ok()
}

/// Whether `line` is a JSON value at all: UTF-8 (which skipping a value does not check) and
/// well-formed.
pub fn is_json(line: &[u8]) -> bool {
    std::str::from_utf8(line)
        .is_ok_and(|text| serde_json::from_str::<serde::de::IgnoredAny>(text).is_ok())
}

fn is_object(line: &[u8]) -> bool {
    line.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{')
}

/// A key under which two spellings of the same id compare equal (`1` and `1`, `"a"` and
/// `"\u0061"`), for matching a response to its request.
pub fn id_key(id: &RawValue) -> String {
    if spelled_as_key(id) {
        return id.get().to_owned();
    }
    match serde_json::from_str::<serde_json::Value>(id.get()) {
        Ok(v) => v.to_string(),
        Err(_) => id.get().to_owned(),
    }
}

/// Whether `id` is already written as its key, as nearly every client writes it: an integer of
/// at most 19 digits (a `u64`, written back digit for digit) or a string without escapes
/// (written back as it is: a JSON string holds no raw quote or control character). Such an id
/// is keyed without a parse and a re-serialization per frame.
fn spelled_as_key(id: &RawValue) -> bool {
    match id.get().as_bytes() {
        [b'"', inner @ .., b'"'] => !inner.contains(&b'\\'),
        digits => (1..=19).contains(&digits.len()) && digits.iter().all(u8::is_ascii_digit),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_member_spelled_as_one_mcp_reads_ignoring_case_is_told() {
        for key in ["Name", "NAME", "nAme", "URI", "\u{131}d", "\u{130}D"] {
            let keys = [TOP_KEYS, PARAMS_KEYS].concat();
            assert!(spelled_like(key, &keys), "{key}");
        }
        assert!(spelled_like("param\u{17F}", TOP_KEYS));
        assert!(spelled_like("requestid", PARAMS_KEYS));
        assert!(spelled_like(
            "PROGRE\u{17F}\u{17F}TO\u{212A}EN",
            PARAMS_KEYS
        ));
        for key in [
            "name",
            "requestId",
            "names",
            "nam",
            "text",
            "n\u{e1}me",
            "\u{ff4e}ame",
        ] {
            assert!(!spelled_like(key, PARAMS_KEYS), "{key}");
        }
        let smuggled = [
            &br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"ok","Name":"no"}}"#[..],
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/list","Method":"tools/call"}"#,
            br#"{"id":1,"method":"tools/call","params":{"name":"ok"},"PARAMS":{"name":"no"}}"#,
            br#"{"id":1,"method":"m","params":{"_meta":{},"_Meta":{"mcpmesh/peer":"x"}}}"#,
            br#"{"id":1,"method":"m","params":{"\u004eame":"no"}}"#,
            br#"{"id":1,"method":"m","param\u017f":{}}"#,
        ];
        for line in smuggled {
            assert!(
                crate::scan::smuggles(line),
                "{}",
                String::from_utf8_lossy(line)
            );
        }
        let plain = [
            &br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"ok","arguments":{"Name":"x","METHOD":1}}}"#[..],
            br#"{"jsonrpc":"2.0","id":1,"method":"m","params":[{"Name":1}]}"#,
            br#"{"jsonrpc":"2.0","id":1,"method":"m","params":null,"extra":{"Params":1}}"#,
            br#"{"jsonrpc":"2.0","id":1,"result":{"Name":1}}"#,
            br#"[{"Method":1}]"#,
            b"not json",
        ];
        for line in plain {
            assert!(
                !crate::scan::smuggles(line),
                "{}",
                String::from_utf8_lossy(line)
            );
        }
    }

    #[test]
    fn kinds_are_told_apart() {
        let req = peek(br#"{"jsonrpc":"2.0","id":"x","method":"tools/call","params":{}}"#).unwrap();
        assert_eq!(req.kind(), Kind::Request);
        assert_eq!(req.id.unwrap().get(), r#""x""#);
        let note = peek(br#"{"jsonrpc":"2.0","method":"notifications/progress"}"#).unwrap();
        assert_eq!(note.kind(), Kind::Notification);
        let resp = peek(br#"{"jsonrpc":"2.0","result":{"big":[1,2,3]},"id":3}"#).unwrap();
        assert_eq!(resp.kind(), Kind::Response);
        assert!(peek(b"[1,2]").is_none());
        assert!(
            peek(br#"[{"jsonrpc":"2.0","id":1,"method":"x"}]"#).is_none(),
            "no batches"
        );
        let deep = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
        assert!(
            peek(deep.as_bytes()).is_none(),
            "deep nesting is not a message"
        );
        assert!(
            !is_json(b"{\"method\":\"\xff\"}"),
            "invalid UTF-8 is not JSON"
        );
        assert!(peek(b"not json").is_none());
    }

    #[test]
    fn meta_tells_progress_tokens_and_stateless_requests() {
        let p = peek(br#"{"id":1,"method":"m","params":{"_meta":{"progressToken":"t","io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}"#).unwrap();
        let m = meta(p.params);
        assert_eq!(m.progress_token.unwrap().get(), r#""t""#);
        assert_eq!(m.protocol_version.as_deref(), Some("2026-07-28"));
        let p = peek(br#"{"id":1,"method":"m","params":{"_meta":7}}"#).unwrap();
        let m = meta(p.params);
        assert!(m.progress_token.is_none() && m.protocol_version.is_none());
    }

    #[test]
    fn meta_tells_the_callers_trace_context_and_ignores_a_malformed_one() {
        let tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        let line = format!(
            r#"{{"id":1,"method":"tools/call","params":{{"name":"t","arguments":{{}},"_meta":{{"traceparent":"{tp}","tracestate":"k=v"}}}}}}"#
        );
        let m = meta(peek(line.as_bytes()).unwrap().params);
        assert_eq!(m.traceparent.as_deref(), Some(tp));
        assert_eq!(m.tracestate.as_deref(), Some("k=v"));
        let p = peek(
            br#"{"id":1,"method":"m","params":{"_meta":{"traceparent":7,"progressToken":"t"}}}"#,
        )
        .unwrap();
        let m = meta(p.params);
        assert!(m.traceparent.is_none());
        assert_eq!(m.progress_token.unwrap().get(), r#""t""#);
    }

    #[test]
    fn response_outcomes_are_told_apart() {
        let ok = peek_response(br#"{"jsonrpc":"2.0","id":1,"result":{"content":[]}}"#).unwrap();
        assert_eq!(
            (ok.answers().unwrap().get(), ok.outcome()),
            ("1", Outcome::Ok)
        );
        let tool = peek_response(br#"{"id":2,"result":{"isError":true,"content":[]}}"#).unwrap();
        assert_eq!(tool.outcome(), Outcome::ToolError);
        let err = peek_response(br#"{"id":3,"error":{"code":-32601,"message":"x"}}"#).unwrap();
        assert_eq!(err.outcome(), Outcome::Error(-32601));
        let req =
            peek_response(br#"{"id":4,"method":"sampling/createMessage","params":{}}"#).unwrap();
        assert!(
            req.answers().is_none(),
            "a server's request is not an answer"
        );
    }

    #[test]
    fn cancellation_names_its_request() {
        let p = peek(br#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":7,"reason":"x"}}"#).unwrap();
        assert_eq!(p.cancelled_request().unwrap().get(), "7");
        assert!(p.progress_token().is_none());
        let p = peek(br#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"t","progress":1}}"#).unwrap();
        assert_eq!(p.progress_token().unwrap().get(), r#""t""#);
        assert!(p.cancelled_request().is_none());
    }

    #[test]
    fn id_keys_match_equal_ids_only() {
        let a = RawValue::from_string(r#""a""#.into()).unwrap();
        let b = RawValue::from_string(r#""\u0061""#.into()).unwrap();
        let one = RawValue::from_string("1".into()).unwrap();
        let one_s = RawValue::from_string(r#""1""#.into()).unwrap();
        assert_eq!(id_key(&a), id_key(&b));
        assert_ne!(id_key(&one), id_key(&one_s));
    }

    #[test]
    fn ids_keyed_without_a_parse_get_the_key_and_verdict_a_parse_gives() {
        let parsed = |raw: &str| serde_json::from_str::<serde_json::Value>(raw).unwrap();
        for raw in [
            "0",
            "7",
            "9999999999999999999",
            "18446744073709551615",
            "18446744073709551616",
            "-0",
            "-12",
            "1.0",
            "1e3",
            r#""""#,
            r#""a""#,
            "\"é ☃ \u{2028} \u{7f}\"",
            r#""\u0061""#,
            r#""a\"b""#,
            r#""\/""#,
            "null",
            "true",
            "{}",
            "[1]",
        ] {
            let id = RawValue::from_string(raw.into()).unwrap();
            let v = parsed(raw);
            assert_eq!(id_key(&id), v.to_string(), "{raw}");
            let allowed = v.is_string() || v.is_i64() || v.is_u64();
            assert_eq!(valid_id(&id), allowed, "{raw}");
        }
    }
}
