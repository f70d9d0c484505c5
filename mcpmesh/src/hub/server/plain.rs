//! A client's `tools/call` passed on without a JSON tree: read once for its id, tool name and
//! members, and written upstream as the bytes it came as, but for the hub's id, the tool's own
//! name and (when it names one) the hub's progress token in its `_meta`. A call with anything
//! else for the hub to map (a stateless envelope in its `_meta`, a `task`), and anything this
//! reading does not take in plainly (an escaped key, a repeated member), goes the ordinary
//! way.

use std::fmt;
use std::ops::Range;
use std::sync::LazyLock;

use bytes::Bytes;
use memchr::memmem::Finder;
use serde::Deserialize;
use serde::de::{Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use super::wire::valid_id;

/// What the keys of the stateless era's envelope in `_meta` start with.
const ERA_KEYS: &str = "io.modelcontextprotocol/";

/// A `tools/call` read without a tree.
pub(super) struct PlainCall {
    line: Bytes,
    pub(super) id: Value,
    /// The tool's name as the client called it.
    pub(super) name: String,
    /// Every member of `params` but `name` and `_meta`, in the client's order: its key (quotes
    /// included) and its value, as ranges of `line`.
    rest: Vec<(Range<usize>, Range<usize>)>,
    /// `params._meta`, read (it is small, and may name a progress token the hub maps).
    pub(super) meta: Option<Value>,
    /// Where `_meta` stood among `rest`: before the member of this index.
    meta_at: usize,
}

/// The members of a request the hub reads.
#[derive(Deserialize)]
struct Head<'a> {
    #[serde(borrow)]
    id: Option<&'a RawValue>,
    method: Option<&'a str>,
    #[serde(borrow)]
    params: Option<Members<'a>>,
}

/// An object's members in their order, keys unescaped only when they needed no unescaping.
struct Members<'a>(Vec<(&'a str, &'a RawValue)>);

impl<'de: 'a, 'a> Deserialize<'de> for Members<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Each<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for Each<'a> {
            type Value = Members<'a>;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an object")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut members = Vec::new();
                while let Some(member) = map.next_entry::<&'de str, &'de RawValue>()? {
                    members.push(member);
                }
                Ok(Members(members))
            }
        }
        deserializer.deserialize_map(Each(std::marker::PhantomData))
    }
}

impl PlainCall {
    /// `line` as a plain `tools/call`, or `None` when it is anything else or needs more than
    /// an id and a name mapped.
    pub(super) fn read(line: &Bytes) -> Option<PlainCall> {
        static METHOD: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new("tools/call"));
        METHOD.find(line)?;
        let head: Head = serde_json::from_slice(line).ok()?;
        if head.method? != "tools/call" {
            return None;
        }
        let id: Value = serde_json::from_str(head.id?.get()).ok()?;
        if !valid_id(&id) {
            return None;
        }
        let (mut name, mut meta, mut meta_at) = (None, None, 0);
        let mut rest: Vec<(Range<usize>, Range<usize>)> = Vec::new();
        for (key, value) in head.params?.0 {
            match key {
                "task" => return None,
                "name" if name.is_some() => return None,
                "_meta" if meta.is_some() => return None,
                "name" => name = Some(serde_json::from_str::<String>(value.get()).ok()?),
                "_meta" => {
                    let members: Map<String, Value> = serde_json::from_str(value.get()).ok()?;
                    // The stateless era's envelope: the client's era to learn or check.
                    if members.keys().any(|k| k.starts_with(ERA_KEYS)) {
                        return None;
                    }
                    (meta, meta_at) = (Some(Value::Object(members)), rest.len());
                }
                _ => {
                    let key = quoted(line, key)?;
                    if rest
                        .iter()
                        .any(|(k, _)| line[k.clone()] == line[key.clone()])
                    {
                        return None;
                    }
                    rest.push((key, place(line, value.get())?));
                }
            }
        }
        Some(PlainCall {
            line: line.clone(),
            id,
            name: name?,
            rest,
            meta,
            meta_at,
        })
    }

    /// About how long the params are, written.
    pub(super) fn params_len(&self) -> usize {
        self.line.len() + 64
    }

    /// Writes the params as the server must see them: `name` (the tool's own) first, then the
    /// client's other members as they came, `meta` in its `_meta`'s place (when it had one).
    pub(super) fn write_params(&self, name: &str, meta: Option<&Value>, out: &mut Vec<u8>) {
        out.extend_from_slice(b"{\"name\":");
        // A `&str` and a tree always serialize.
        let _ = serde_json::to_writer(&mut *out, name);
        let write_meta = |out: &mut Vec<u8>| {
            if let Some(meta) = meta.filter(|_| self.meta.is_some()) {
                out.extend_from_slice(b",\"_meta\":");
                let _ = serde_json::to_writer(&mut *out, meta);
            }
        };
        for (at, (key, value)) in self.rest.iter().enumerate() {
            if at == self.meta_at {
                write_meta(out);
            }
            out.push(b',');
            out.extend_from_slice(&self.line[key.clone()]);
            out.push(b':');
            out.extend_from_slice(&self.line[value.clone()]);
        }
        if self.meta_at == self.rest.len() {
            write_meta(out);
        }
        out.push(b'}');
    }

    /// The params as a tree with the tool's own `name`, for the ordinary way.
    pub(super) fn params(&self, name: &str) -> Value {
        let mut out = Vec::with_capacity(self.params_len());
        self.write_params(name, self.meta.as_ref(), &mut out);
        serde_json::from_slice(&out).unwrap_or(Value::Null)
    }

    /// The whole frame as a tree, for the ordinary way.
    pub(super) fn frame(&self) -> Value {
        serde_json::from_slice(&self.line).unwrap_or(Value::Null)
    }
}

/// Where `part` (borrowed from `line`) lies in it.
fn place(line: &[u8], part: &str) -> Option<Range<usize>> {
    let start = (part.as_ptr() as usize).checked_sub(line.as_ptr() as usize)?;
    let end = start.checked_add(part.len())?;
    (end <= line.len()).then_some(start..end)
}

/// Where the key `key` (borrowed from `line`, so written without escapes) lies, quotes
/// included.
fn quoted(line: &[u8], key: &str) -> Option<Range<usize>> {
    let inner = place(line, key)?;
    let (start, end) = (inner.start.checked_sub(1)?, inner.end + 1);
    (line.get(start) == Some(&b'"') && line.get(end - 1) == Some(&b'"')).then_some(start..end)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(line: &str) -> Option<PlainCall> {
        PlainCall::read(&Bytes::copy_from_slice(line.as_bytes()))
    }

    fn written(call: &PlainCall, name: &str) -> String {
        let mut out = Vec::new();
        call.write_params(name, call.meta.as_ref(), &mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn a_plain_call_is_written_with_its_own_name_first_and_every_other_member_as_it_came() {
        let line = r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"arguments":{"text":"a\"b\u00e9", "n": 1.50},"name":"alice__notes__echo","extra":[1, 2]}}"#;
        let call = read(line).unwrap();
        assert_eq!(call.id, serde_json::json!(7));
        assert_eq!(call.name, "alice__notes__echo");
        let params = written(&call, "echo");
        assert_eq!(
            params,
            r#"{"name":"echo","arguments":{"text":"a\"b\u00e9", "n": 1.50},"extra":[1, 2]}"#
        );
        assert_eq!(
            call.params("echo"),
            serde_json::json!({"name": "echo", "arguments": {"text": "a\"bé", "n": 1.5}, "extra": [1, 2]})
        );
        let string_id = read(
            r#"{"method":"tools/call","id":"x-1","params":{"name":"t\u0061","arguments":{}}}"#,
        )
        .unwrap();
        assert_eq!(string_id.id, serde_json::json!("x-1"));
        assert_eq!(string_id.name, "ta");
        assert_eq!(written(&string_id, "t"), r#"{"name":"t","arguments":{}}"#);
    }

    #[test]
    fn a_calls_meta_is_read_and_written_in_its_place_with_what_the_hub_puts_there() {
        let line = r#"{"id":3,"method":"tools/call","params":{"name":"a","_meta":{"progressToken":"p-1","traceparent":"00-x"},"arguments":{"big":"yy"}}}"#;
        let call = read(line).unwrap();
        assert_eq!(
            call.meta,
            Some(serde_json::json!({"progressToken": "p-1", "traceparent": "00-x"}))
        );
        assert_eq!(
            written(&call, "b"),
            r#"{"name":"b","_meta":{"progressToken":"p-1","traceparent":"00-x"},"arguments":{"big":"yy"}}"#
        );
        let ours = serde_json::json!({"progressToken": "hub-9"});
        let mut out = Vec::new();
        call.write_params("b", Some(&ours), &mut out);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            r#"{"name":"b","_meta":{"progressToken":"hub-9"},"arguments":{"big":"yy"}}"#
        );
        let last =
            read(r#"{"id":3,"method":"tools/call","params":{"name":"a","_meta":{}}}"#).unwrap();
        assert_eq!(written(&last, "b"), r#"{"name":"b","_meta":{}}"#);
        assert_eq!(
            last.params("b"),
            serde_json::json!({"name": "b", "_meta": {}})
        );
    }

    #[test]
    fn anything_the_hub_must_map_or_cannot_read_plainly_goes_the_ordinary_way() {
        for line in [
            // Not a tools/call, or not a request.
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"name":"tools/call"}}"#,
            r#"{"jsonrpc":"2.0","method":"tools/call","params":{"name":"a"}}"#,
            r#"{"jsonrpc":"2.0","id":1,"result":{"method":"tools/call"}}"#,
            // Ids the serving node refuses, and a repeated member.
            r#"{"id":null,"method":"tools/call","params":{"name":"a"}}"#,
            r#"{"id":1.5,"method":"tools/call","params":{"name":"a"}}"#,
            r#"{"id":1,"id":2,"method":"tools/call","params":{"name":"a"}}"#,
            // Something in the params for the hub to map or to refuse.
            r#"{"id":1,"method":"tools/call","params":{"name":"a","_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}"#,
            r#"{"id":1,"method":"tools/call","params":{"name":"a","_meta":[1]}}"#,
            r#"{"id":1,"method":"tools/call","params":{"name":"a","_meta":{},"_meta":{}}}"#,
            r#"{"id":1,"method":"tools/call","params":{"name":"a","task":{"ttl":1000}}}"#,
            r#"{"id":1,"method":"tools/call","params":{"arguments":{}}}"#,
            r#"{"id":1,"method":"tools/call","params":{"name":5}}"#,
            r#"{"id":1,"method":"tools/call","params":{"name":"a","name":"b"}}"#,
            r#"{"id":1,"method":"tools/call","params":{"name":"a","x":1,"x":2}}"#,
            r#"{"id":1,"method":"tools/call","params":{"name":"a","\u0078":1}}"#,
            r#"{"id":1,"method":"tools/call","params":[1]}"#,
            r#"{"id":1,"method":"tools/call"}"#,
            // Not one JSON object.
            r#"{"id":1,"method":"tools/call","params":{"name":"a"}} {}"#,
            r#"{"id":1,"method":"tools/call","params":{"name":"a"}"#,
            r#"[{"id":1,"method":"tools/call","params":{"name":"a"}}]"#,
        ] {
            assert!(read(line).is_none(), "{line}");
        }
    }
}
