//! Writing the caller's identity into a request's `params._meta["mcpmesh/peer"]`: the one
//! change the node makes to a frame (DESIGN §5, `socket` and `url` backends).
//!
//! A frame is edited as raw bytes: the spans of `params`, `_meta` and its members are located
//! with borrowed [`RawValue`]s, caller-supplied `mcpmesh/*` members of `_meta` are cut out, and
//! the node's member is spliced in. Every other byte of the frame — key order, spacing,
//! escapes, number spellings — is left exactly as the caller wrote it.

use std::fmt;

use mcpmesh_net::PeerIdentity;
use serde::Deserialize;
use serde::de::{Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;

/// The `_meta` key the node owns.
pub const PEER_KEY: &str = "mcpmesh/peer";
/// Every `_meta` key under this prefix is the node's; a caller's are removed.
const RESERVED_PREFIX: &str = "mcpmesh/";

/// Why a frame cannot carry the identity; answered `-32600` to the caller.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StampError {
    #[error("params must be an object")]
    ParamsNotObject,
    #[error("params._meta must be an object")]
    MetaNotObject,
    #[error("params has more than one _meta member")]
    DuplicateMeta,
    #[error("the request has more than one params member")]
    DuplicateParams,
    #[error("params is not valid JSON")]
    Malformed,
}

/// The identity member for one caller, serialized once per session.
#[derive(Debug, Clone)]
pub struct PeerStamp {
    /// `"mcpmesh/peer":{…}`, ready to splice.
    member: String,
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
        }
    }

    /// `line` (one JSON object, no newline) as the server gets it: a request with its identity
    /// member set, a notification without caller-supplied `mcpmesh/*` members; `None` when it
    /// passes as it is (a response, or a notification with nothing to cut). The frame is
    /// parsed once, here: what kind it is comes from the same pass that finds `params`.
    pub fn apply(&self, line: &[u8]) -> Result<Option<Vec<u8>>, StampError> {
        Ok(edit_for(line, &self.member)?.map(|e| e.apply(line)))
    }
}

/// One splice: replace `line[start..end]` with `text`.
struct Edit {
    start: usize,
    end: usize,
    text: String,
}

impl Edit {
    fn apply(&self, line: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(line.len() + self.text.len());
        out.extend_from_slice(&line[..self.start]);
        out.extend_from_slice(self.text.as_bytes());
        out.extend_from_slice(&line[self.end..]);
        out
    }
}

fn edit_for(line: &[u8], identity: &str) -> Result<Option<Edit>, StampError> {
    let line = std::str::from_utf8(line).map_err(|_| StampError::Malformed)?;
    let top = Members::parse(line)?;
    let has = |key: &str| top.0.iter().any(|(k, _)| k == key);
    if !has("method") {
        return Ok(None); // a response: the caller answering the server
    }
    // Requests carry the identity; notifications only lose forgeries.
    let member = has("id").then_some(identity);
    let mut all_params = top.0.iter().filter(|(k, _)| k == "params");
    let params = all_params.next().map(|(_, v)| *v);
    if all_params.next().is_some() {
        return Err(StampError::DuplicateParams);
    }
    let Some(params) = params.filter(|p| p.get() != "null") else {
        let Some(member) = member else {
            return Ok(None);
        };
        let text = format!("{{\"_meta\":{{{member}}}}}");
        return Ok(Some(match params {
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
                let comma = if top.0.is_empty() { "" } else { "," };
                Edit {
                    start: close,
                    end: close,
                    text: format!("{comma}\"params\":{text}"),
                }
            }
        }));
    };
    let text = params.get();
    if !text.starts_with('{') {
        return Err(StampError::ParamsNotObject);
    }
    let base = offset_in(line, text);
    let members = Members::parse(text)?;
    let mut metas = members.0.iter().filter(|(k, _)| k == "_meta");
    let meta = metas.next();
    if metas.next().is_some() {
        return Err(StampError::DuplicateMeta);
    }
    let Some((_, meta)) = meta else {
        let Some(member) = member else {
            return Ok(None);
        };
        let comma = if members.0.is_empty() { "" } else { "," };
        let close = base + text.len() - 1;
        return Ok(Some(Edit {
            start: close,
            end: close,
            text: format!("{comma}\"_meta\":{{{member}}}"),
        }));
    };
    let meta_text = meta.get();
    let meta_start = base + offset_in(text, meta_text);
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
            Err(StampError::DuplicateMeta)
        );
        assert_eq!(
            stamped(r#"{"id":1,"method":"m","params":null,"params":{"_meta":{"mcpmesh/peer":1}}}"#),
            Err(StampError::DuplicateParams)
        );
    }
}
