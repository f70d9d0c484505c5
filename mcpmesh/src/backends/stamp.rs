//! Writing the caller's identity into a request's `params._meta["mcpmesh/peer"]`: the one
//! change the node makes to a frame, for the `socket` and `url` backends (a `run` child learns
//! the caller from its environment instead).
//!
//! `mcpmesh/*` members of `_meta` are the node's alone, so every one the caller wrote is cut
//! out, whatever the frame: from `params._meta` of requests, notifications and method-less
//! frames, `result._meta` of responses and `error.data._meta` of errors. Requests then get the
//! node's member. A frame is edited as raw bytes: the spans of `params`, `_meta` and its
//! members are located with borrowed [`RawValue`]s, and every other byte — key order,
//! spacing, escapes, number spellings — is left exactly as the caller wrote it.
//!
//! The frame is parsed once, here: the pass that tells its kind also finds `params` and walks
//! `result` and `error` down to their `_meta`, so a response with nothing to cut costs one
//! pass and passes as it is.

use std::borrow::Cow;
use std::fmt;

use mcpmesh_net::PeerIdentity;

use crate::assertion::SessionAssertion;
use serde::Deserialize;
use serde::de::{Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;

/// The `_meta` key the node owns.
pub const PEER_KEY: &str = "mcpmesh/peer";
/// Where a `socket` service that asked for it gets the signed caller assertion.
pub const CALLER_KEY: &str = "mcpmesh/caller";
/// Every `_meta` key under this prefix is the node's; a caller's are removed.
const RESERVED_PREFIX: &str = "mcpmesh/";

/// Why a frame cannot be passed on; a request is answered `-32600`, anything else dropped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StampError {
    #[error("params must be an object")]
    ParamsNotObject,
    #[error("_meta must be an object")]
    MetaNotObject,
    /// A member a server would read only one of (which one differs between parsers).
    #[error("{0} appears more than once")]
    Repeated(&'static str),
    #[error("the message is not valid JSON")]
    Malformed,
}

/// The identity member for one caller, serialized once per session.
#[derive(Debug, Clone)]
pub struct PeerStamp {
    /// `"mcpmesh/peer":{…}`, ready to splice.
    member: String,
    /// The signed caller assertion requests also carry, as `"mcpmesh/caller":"<JWS>"`.
    caller: Option<std::sync::Arc<SessionAssertion>>,
}

impl PeerStamp {
    pub fn new(peer: &PeerIdentity) -> Self {
        let value = serde_json::json!({
            "eid": peer.principal(),
            "name": peer.name,
            "user_id": peer.user_id,
            "groups": peer.groups,
        });
        PeerStamp {
            member: format!("\"{PEER_KEY}\":{value}"),
            caller: None,
        }
    }

    /// Requests also carry `caller`'s assertion in `_meta["mcpmesh/caller"]`.
    pub fn with_caller(mut self, caller: SessionAssertion) -> Self {
        self.caller = Some(std::sync::Arc::new(caller));
        self
    }

    /// `line` (one JSON object, no newline) as the server gets it: a request with its identity
    /// member set, any other frame without caller-supplied `mcpmesh/*` members; `None` when it
    /// passes as it is (nothing to cut from a frame that is not a request).
    pub fn apply(&self, line: &[u8]) -> Result<Option<Vec<u8>>, StampError> {
        let member = match self.caller.as_ref().and_then(|c| c.token()) {
            // A JWS is base64url and dots: nothing in it needs escaping.
            Some(token) => Cow::Owned(format!("{},\"{CALLER_KEY}\":\"{token}\"", self.member)),
            None => Cow::Borrowed(self.member.as_str()),
        };
        let mut edits = edits_for(line, &member)?;
        if edits.is_empty() {
            return Ok(None);
        }
        edits.sort_unstable_by_key(|e| e.start);
        Ok(Some(splice(line, &edits)))
    }
}

/// One splice: replace `line[start..end]` with `text`.
struct Edit {
    start: usize,
    end: usize,
    text: String,
}

/// `line` with each of `edits` (in order, not overlapping) made.
fn splice(line: &[u8], edits: &[Edit]) -> Vec<u8> {
    let grown: usize = edits.iter().map(|e| e.text.len()).sum();
    let mut out = Vec::with_capacity(line.len() + grown);
    let mut at = 0;
    for edit in edits {
        out.extend_from_slice(&line[at..edit.start]);
        out.extend_from_slice(edit.text.as_bytes());
        at = edit.end;
    }
    out.extend_from_slice(&line[at..]);
    out
}

fn edits_for(line: &[u8], identity: &str) -> Result<Vec<Edit>, StampError> {
    let line = std::str::from_utf8(line).map_err(|_| StampError::Malformed)?;
    let frame: Frame = serde_json::from_str(line).map_err(|_| StampError::Malformed)?;
    if let Some(name) = frame.repeated {
        return Err(StampError::Repeated(name));
    }
    // Requests carry the identity; every other frame only loses forgeries.
    let member = (frame.method && frame.id).then_some(identity);
    let mut edits = Vec::new();
    match (frame.params.filter(|p| p.get() != "null"), member) {
        (Some(params), _) => edits.extend(params_edit(line, params, member)?),
        (None, Some(member)) => edits.push(new_params(line, &frame, member)?),
        (None, None) => {}
    }
    for meta in [frame.result_meta, frame.data_meta].into_iter().flatten() {
        edits.extend(meta_edit(line, meta, None)?);
    }
    Ok(edits)
}

/// A request without `params` (or with `"params":null`) gets one holding only the identity.
fn new_params(line: &str, frame: &Frame, member: &str) -> Result<Edit, StampError> {
    let text = format!("{{\"_meta\":{{{member}}}}}");
    Ok(match frame.params {
        // `"params":null` becomes the object.
        Some(null) => {
            let start = offset_in(line, null.get());
            Edit {
                start,
                end: start + null.get().len(),
                text,
            }
        }
        // No params: a member before the frame's closing brace.
        None => {
            let close = closing_brace(line.as_bytes()).ok_or(StampError::Malformed)?;
            let comma = if frame.members == 0 { "" } else { "," };
            Edit {
                start: close,
                end: close,
                text: format!("{comma}\"params\":{text}"),
            }
        }
    })
}

/// The edit of the object `params`: its `_meta` cleaned, and `member` added when given.
fn params_edit(
    line: &str,
    params: &RawValue,
    member: Option<&str>,
) -> Result<Option<Edit>, StampError> {
    let text = params.get();
    if !text.starts_with('{') {
        return Err(StampError::ParamsNotObject);
    }
    let holder: MetaOf = serde_json::from_str(text).map_err(|_| StampError::Malformed)?;
    if holder.repeated {
        return Err(StampError::Repeated("_meta"));
    }
    if let Some(meta) = holder.meta {
        return meta_edit(line, meta, member);
    }
    Ok(member.map(|member| {
        let comma = if holder.members == 0 { "" } else { "," };
        let close = offset_in(line, text) + text.len() - 1;
        Edit {
            start: close,
            end: close,
            text: format!("{comma}\"_meta\":{{{member}}}"),
        }
    }))
}

/// The edit of one `_meta` value: the caller's `mcpmesh/*` members cut out and `member`
/// appended when given; `None` when there is nothing to do.
fn meta_edit(
    line: &str,
    meta: &RawValue,
    member: Option<&str>,
) -> Result<Option<Edit>, StampError> {
    let meta_text = meta.get();
    let meta_start = offset_in(line, meta_text);
    let meta_end = meta_start + meta_text.len();
    if meta_text == "null" {
        return Ok(member.map(|m| Edit {
            start: meta_start,
            end: meta_end,
            text: format!("{{{m}}}"),
        }));
    }
    if !meta_text.starts_with('{') {
        return Err(StampError::MetaNotObject);
    }
    let entries = Members::parse(meta_text)?;
    let forged = entries
        .0
        .iter()
        .any(|(k, _)| k.starts_with(RESERVED_PREFIX));
    if !forged {
        // The common case: one member appended, nothing else touched.
        let Some(member) = member else {
            return Ok(None);
        };
        let comma = if entries.0.is_empty() { "" } else { "," };
        let close = meta_end - 1;
        return Ok(Some(Edit {
            start: close,
            end: close,
            text: format!("{comma}{member}"),
        }));
    }
    // Rebuild `_meta` from the kept members' own bytes, then the node's member.
    let mut kept = Vec::new();
    let mut prev_end = 1; // just after `{`
    for (key, value) in &entries.0 {
        let value_end = offset_in(meta_text, value.get()) + value.get().len();
        let member_text = meta_text[prev_end..value_end]
            .trim_start_matches(|c: char| c == ',' || c.is_ascii_whitespace());
        if !key.starts_with(RESERVED_PREFIX) {
            kept.push(member_text);
        }
        prev_end = value_end;
    }
    kept.extend(member);
    Ok(Some(Edit {
        start: meta_start,
        end: meta_end,
        text: format!("{{{}}}", kept.join(",")),
    }))
}

/// Where `part` (a subslice of `whole`) starts in it.
fn offset_in(whole: impl AsRef<[u8]>, part: &str) -> usize {
    part.as_ptr() as usize - whole.as_ref().as_ptr() as usize
}

/// Index of the closing `}` of the object `line` holds.
fn closing_brace(line: &[u8]) -> Option<usize> {
    let last = line.iter().rposition(|b| !b.is_ascii_whitespace())?;
    (line[last] == b'}').then_some(last)
}

/// What the one pass over a frame finds: its kind, `params`, and the `_meta` of `result` and
/// of `error.data`. Everything else is skipped, not kept.
#[derive(Default)]
struct Frame<'a> {
    members: usize,
    method: bool,
    id: bool,
    params: Option<&'a RawValue>,
    result_meta: Option<&'a RawValue>,
    data_meta: Option<&'a RawValue>,
    /// The first member that appears twice where a server would read only one of them.
    repeated: Option<&'static str>,
}

impl Frame<'_> {
    fn note_repeated(&mut self, repeated: bool, name: &'static str) {
        if repeated {
            self.repeated.get_or_insert(name);
        }
    }
}

impl<'de> Deserialize<'de> for Frame<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct FrameVisitor;
        impl<'de> Visitor<'de> for FrameVisitor {
            type Value = Frame<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON-RPC message")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut frame = Frame::default();
                let (mut result, mut error) = (false, false);
                while let Some(Key(key)) = map.next_key()? {
                    frame.members += 1;
                    match key.as_ref() {
                        "method" => frame.method = true,
                        "id" => frame.id = true,
                        "params" => {
                            let again = frame.params.replace(map.next_value()?).is_some();
                            frame.note_repeated(again, "params");
                            continue;
                        }
                        "result" => {
                            let holder: MetaOf = map.next_value()?;
                            frame.result_meta = holder.meta;
                            let again = std::mem::replace(&mut result, true);
                            frame.note_repeated(again, "result");
                            frame.note_repeated(holder.repeated, "_meta");
                            continue;
                        }
                        "error" => {
                            let body: ErrorOf = map.next_value()?;
                            frame.data_meta = body.data.meta;
                            let again = std::mem::replace(&mut error, true);
                            frame.note_repeated(again, "error");
                            frame.note_repeated(body.repeated, "error.data");
                            frame.note_repeated(body.data.repeated, "_meta");
                            continue;
                        }
                        _ => {}
                    }
                    map.next_value::<IgnoredAny>()?;
                }
                Ok(frame)
            }
        }
        deserializer.deserialize_map(FrameVisitor)
    }
}

/// An object that may hold `_meta` (`params`, `result`, `error.data`), walked in the same
/// pass as its frame. Any other value holds none.
#[derive(Default)]
struct MetaOf<'a> {
    members: usize,
    meta: Option<&'a RawValue>,
    repeated: bool,
}

impl<'de> Deserialize<'de> for MetaOf<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct MetaVisitor;
        impl<'de> Visitor<'de> for MetaVisitor {
            type Value = MetaOf<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut holder = MetaOf::default();
                while let Some(Key(key)) = map.next_key()? {
                    holder.members += 1;
                    if key == "_meta" {
                        let meta = map.next_value()?;
                        holder.repeated |= holder.meta.replace(meta).is_some();
                    } else {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
                Ok(holder)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
                IgnoredAny.visit_seq(seq).map(|_| MetaOf::default())
            }
            fn visit_unit<E>(self) -> Result<Self::Value, E> {
                Ok(MetaOf::default())
            }
            fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
                Ok(MetaOf::default())
            }
            fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
                Ok(MetaOf::default())
            }
            fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
                Ok(MetaOf::default())
            }
            fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
                Ok(MetaOf::default())
            }
            fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
                Ok(MetaOf::default())
            }
        }
        deserializer.deserialize_any(MetaVisitor)
    }
}

/// An `error` member, walked down to `data`.
#[derive(Default)]
struct ErrorOf<'a> {
    data: MetaOf<'a>,
    repeated: bool,
}

impl<'de> Deserialize<'de> for ErrorOf<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        // Only an object has `data`: anything else is taken as a holder with no `_meta`.
        struct ErrorVisitor;
        impl<'de> Visitor<'de> for ErrorVisitor {
            type Value = ErrorOf<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut error = ErrorOf::default();
                let mut seen = false;
                while let Some(Key(key)) = map.next_key()? {
                    if key == "data" {
                        error.data = map.next_value()?;
                        error.repeated |= std::mem::replace(&mut seen, true);
                    } else {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
                Ok(error)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
                IgnoredAny.visit_seq(seq).map(|_| ErrorOf::default())
            }
            fn visit_unit<E>(self) -> Result<Self::Value, E> {
                Ok(ErrorOf::default())
            }
            fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
                Ok(ErrorOf::default())
            }
            fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
                Ok(ErrorOf::default())
            }
            fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
                Ok(ErrorOf::default())
            }
            fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
                Ok(ErrorOf::default())
            }
            fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
                Ok(ErrorOf::default())
            }
        }
        deserializer.deserialize_any(ErrorVisitor)
    }
}

/// A member name as the receiver reads it: borrowed, or unescaped when written with escapes.
struct Key<'a>(Cow<'a, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl<'de> Visitor<'de> for KeyVisitor {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a member name")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Key(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Key(Cow::Owned(v.to_owned())))
            }
        }
        deserializer.deserialize_str(KeyVisitor)
    }
}

/// An object's members in order, each value a raw slice of the text.
struct Members<'a>(Vec<(String, &'a RawValue)>);

impl<'a> Members<'a> {
    fn parse(text: &'a str) -> Result<Self, StampError> {
        serde_json::from_str(text).map_err(|_| StampError::Malformed)
    }
}

impl<'de> Deserialize<'de> for Members<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct InOrder;
        impl<'de> Visitor<'de> for InOrder {
            type Value = Members<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut members = Vec::new();
                while let Some(entry) = map.next_entry::<String, &'de RawValue>()? {
                    members.push(entry);
                }
                Ok(Members(members))
            }
        }
        deserializer.deserialize_map(InOrder)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stamp() -> PeerStamp {
        PeerStamp::new(&PeerIdentity {
            endpoint: [7; 32],
            name: "bob".into(),
            user_id: None,
            groups: vec!["eng".into()],
        })
    }

    fn stamped(line: &str) -> Result<String, StampError> {
        let out = stamp()
            .apply(line.as_bytes())?
            .expect("a request is edited");
        Ok(String::from_utf8(out).expect("utf-8"))
    }

    const ME: &str = r#""mcpmesh/peer":{"eid":"eid:0707070707070707070707070707070707070707070707070707070707070707","groups":["eng"],"name":"bob","user_id":null}"#;

    #[test]
    fn the_member_is_appended_and_nothing_else_moves() {
        let line = r#"{"jsonrpc":"2.0", "id" : 7,"method":"tools/call","params":{"name":"x","arguments":{"b":1.50,"a":"\u00e9"},"_meta":{"progressToken":"t"}}}"#;
        let want = line.replace(r#""t"}}}"#, &format!(r#""t",{ME}}}}}}}"#));
        assert_eq!(stamped(line).unwrap(), want);
    }

    #[test]
    fn missing_params_or_meta_are_created() {
        assert_eq!(
            stamped(r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#).unwrap(),
            format!(r#"{{"jsonrpc":"2.0","id":1,"method":"ping","params":{{"_meta":{{{ME}}}}}}}"#)
        );
        assert_eq!(
            stamped(r#"{"id":1,"method":"ping","params":null }"#).unwrap(),
            format!(r#"{{"id":1,"method":"ping","params":{{"_meta":{{{ME}}}}} }}"#)
        );
        assert_eq!(
            stamped(r#"{"id":1,"method":"tools/list","params":{}}"#).unwrap(),
            format!(r#"{{"id":1,"method":"tools/list","params":{{"_meta":{{{ME}}}}}}}"#)
        );
        assert_eq!(
            stamped(r#"{"id":1,"method":"tools/list","params":{"cursor":"c"}}"#).unwrap(),
            format!(
                r#"{{"id":1,"method":"tools/list","params":{{"cursor":"c","_meta":{{{ME}}}}}}}"#
            )
        );
        assert_eq!(
            stamp().apply(br#"{"id":1,"result":{}}"#),
            Ok(None),
            "responses pass"
        );
        assert_eq!(
            stamped(r#"{"id":1,"method":"m","params":{"_meta":null}}"#).unwrap(),
            format!(r#"{{"id":1,"method":"m","params":{{"_meta":{{{ME}}}}}}}"#)
        );
    }

    #[test]
    fn a_forgery_is_cut_out_wherever_it_stands() {
        for meta in [
            r#"{"mcpmesh/peer":{"name":"root"},"k":1}"#,
            r#"{"k":1,"mcpmesh/peer":{"name":"root"}}"#,
            r#"{ "k" : 1 , "mcpmesh/other":0, "mcpmesh/peer":"x"}"#,
            r#"{"mcpmesh/p\u0065er":"escaped key","k":1}"#,
        ] {
            let line = format!(r#"{{"id":"a","method":"m","params":{{"_meta":{meta},"z":[]}}}}"#);
            let out = stamped(&line).unwrap();
            let v: serde_json::Value = serde_json::from_str(&out).unwrap();
            let m = &v["params"]["_meta"];
            assert_eq!(m["mcpmesh/peer"]["name"], "bob", "{out}");
            assert_eq!(m["k"], 1, "{out}");
            assert_eq!(m.as_object().unwrap().len(), 2, "{out}");
            assert!(out.ends_with(r#"},"z":[]}}"#), "{out}");
        }
        let kept_spacing =
            stamped(r#"{"id":1,"method":"m","params":{"_meta":{"mcpmesh/peer":1, "a" :  "x"}}}"#)
                .unwrap();
        assert!(
            kept_spacing.contains(r#"{"a" :  "x","mcpmesh/peer""#),
            "{kept_spacing}"
        );
    }

    #[test]
    fn notifications_lose_forgeries_and_are_otherwise_untouched() {
        let clean =
            r#"{"method":"notifications/progress","params":{"_meta":{"a":1},"progress":1}}"#;
        assert_eq!(stamp().apply(clean.as_bytes()), Ok(None));
        let forged = r#"{"method":"n","params":{"_meta":{"mcpmesh/peer":{},"a":1}}}"#;
        let out = stamp().apply(forged.as_bytes()).unwrap().unwrap();
        assert_eq!(out, br#"{"method":"n","params":{"_meta":{"a":1}}}"#);
    }

    /// `line` as the server gets it when the caller sent it.
    fn passed(line: &str) -> String {
        match stamp().apply(line.as_bytes()) {
            Ok(Some(out)) => String::from_utf8(out).expect("utf-8"),
            Ok(None) => line.to_owned(),
            Err(e) => panic!("{line} refused: {e}"),
        }
    }

    #[test]
    fn a_response_loses_a_forged_result_meta_and_nothing_else() {
        let line = r#"{"jsonrpc":"2.0","id":"s1", "result" :{"content":[{"type":"text","text":"hi"}],"_meta":{ "a" : 1,"mcpmesh/peer":{"name":"root"}}, "isError":false}}"#;
        assert_eq!(
            passed(line),
            r#"{"jsonrpc":"2.0","id":"s1", "result" :{"content":[{"type":"text","text":"hi"}],"_meta":{"a" : 1}, "isError":false}}"#
        );
        let only = r#"{"id":2,"result":{"_meta":{"mcpmesh/peer":{"name":"root"}},"roots":[]}}"#;
        assert_eq!(passed(only), r#"{"id":2,"result":{"_meta":{},"roots":[]}}"#);
    }

    #[test]
    fn an_error_loses_forged_data_meta_and_params_meta() {
        let line = r#"{"jsonrpc":"2.0","id":3,"error":{"code":-1,"message":"m","data":{"_meta":{"mcpmesh/peer":{"name":"root"},"k":"v"},"x":1}}}"#;
        assert_eq!(
            passed(line),
            r#"{"jsonrpc":"2.0","id":3,"error":{"code":-1,"message":"m","data":{"_meta":{"k":"v"},"x":1}}}"#
        );
        let with_params =
            r#"{"id":3,"error":{"code":-1,"message":"m"},"params":{"_meta":{"mcpmesh/peer":1}}}"#;
        assert_eq!(
            passed(with_params),
            r#"{"id":3,"error":{"code":-1,"message":"m"},"params":{"_meta":{}}}"#
        );
    }

    #[test]
    fn a_frame_with_params_but_no_method_loses_forgeries() {
        let line =
            r#"{"id":4,"params":{"_meta":{"mcpmesh/peer":{"name":"root"}, "p":[1, 2]},"q":0}}"#;
        assert_eq!(
            passed(line),
            r#"{"id":4,"params":{"_meta":{"p":[1, 2]},"q":0}}"#
        );
        let no_id = r#"{"params":{"_meta":{"mcpmesh/x":0}}}"#;
        assert_eq!(passed(no_id), r#"{"params":{"_meta":{}}}"#);
    }

    #[test]
    fn a_notification_loses_forgeries_and_keeps_its_spacing() {
        let line = r#"{ "method" : "notifications/progress", "params" : { "progressToken" : 1, "_meta" : { "mcpmesh/peer" : { }, "t" : 2 } } }"#;
        assert_eq!(
            passed(line),
            r#"{ "method" : "notifications/progress", "params" : { "progressToken" : 1, "_meta" : {"t" : 2} } }"#
        );
    }

    #[test]
    fn every_meta_of_one_frame_is_cleaned() {
        let line = r#"{"id":5,"result":{"_meta":{"mcpmesh/a":1}},"error":{"data":{"_meta":{"mcpmesh/b":2,"c":3}}},"params":{"_meta":{"mcpmesh/d":4}}}"#;
        assert_eq!(
            passed(line),
            r#"{"id":5,"result":{"_meta":{}},"error":{"data":{"_meta":{"c":3}}},"params":{"_meta":{}}}"#
        );
    }

    #[test]
    fn frames_with_nothing_to_cut_pass_as_they_are() {
        for line in [
            r#"{"id":1,"result":{}}"#,
            r#"{"id":1,"result":"text"}"#,
            r#"{"id":1,"result":[{"_meta":{"mcpmesh/peer":1}}]}"#,
            r#"{"id":1,"result":{"_meta":{"a":1},"content":[{"_meta":{"mcpmesh/peer":1}}]}}"#,
            r#"{"id":1,"result":{"_meta":null}}"#,
            r#"{"id":1,"error":{"code":-1,"message":"m","data":"x"}}"#,
            r#"{"id":1,"error":{"code":-1,"message":"m","data":{"_meta":{"b":2}}}}"#,
            r#"{"method":"n","params":{"_meta":{"a":1}}}"#,
        ] {
            assert_eq!(stamp().apply(line.as_bytes()), Ok(None), "{line}");
        }
    }

    #[test]
    fn names_written_with_escapes_are_read_as_a_server_reads_them() {
        let line = r#"{"id":1,"res\u0075lt":{"_m\u0065ta":{"mcpmesh\/peer":1,"a":2}}}"#;
        assert_eq!(
            passed(line),
            r#"{"id":1,"res\u0075lt":{"_m\u0065ta":{"a":2}}}"#
        );
    }

    #[test]
    fn a_member_a_server_would_read_only_once_is_refused_when_repeated() {
        for (line, name) in [
            (
                r#"{"id":1,"result":{},"result":{"_meta":{"mcpmesh/peer":1}}}"#,
                "result",
            ),
            (
                r#"{"id":1,"result":{"_meta":{},"_meta":{"mcpmesh/peer":1}}}"#,
                "_meta",
            ),
            (r#"{"id":1,"error":{"code":1},"error":{"code":2}}"#, "error"),
            (
                r#"{"id":1,"error":{"data":{},"data":{"_meta":{}}}}"#,
                "error.data",
            ),
            (
                r#"{"id":1,"error":{"data":{"_meta":{},"_meta":{}}}}"#,
                "_meta",
            ),
            (
                r#"{"method":"n","params":{},"params":{"_meta":{}}}"#,
                "params",
            ),
        ] {
            assert_eq!(
                stamp().apply(line.as_bytes()),
                Err(StampError::Repeated(name)),
                "{line}"
            );
        }
        assert_eq!(
            stamp().apply(br#"{"id":1,"result":{"_meta":"x"}}"#),
            Err(StampError::MetaNotObject)
        );
    }

    #[test]
    fn frames_that_cannot_carry_it_are_refused() {
        assert_eq!(
            stamped(r#"{"id":1,"method":"m","params":[1]}"#),
            Err(StampError::ParamsNotObject)
        );
        assert_eq!(
            stamped(r#"{"id":1,"method":"m","params":{"_meta":"x"}}"#),
            Err(StampError::MetaNotObject)
        );
        assert_eq!(
            stamped(r#"{"id":1,"method":"m","params":{"_meta":{},"_meta":{"mcpmesh/peer":1}}}"#),
            Err(StampError::Repeated("_meta"))
        );
        assert_eq!(
            stamped(r#"{"id":1,"method":"m","params":null,"params":{"_meta":{"mcpmesh/peer":1}}}"#),
            Err(StampError::Repeated("params"))
        );
    }
}
