//! A batch of finished spans as one OTLP `ExportTraceServiceRequest`, in protobuf, written with
//! prost's wire primitives straight from what the node knows of each request.
//!
//! Kept ours rather than the SDK's span and the reference exporter's conversion: those build a
//! `SpanData`, then a generated message with a fresh `String` per attribute key and value, then
//! encode and free it all. That was about three quarters of what a span cost a node, and at
//! 16 calls in flight a quarter of its CPU (docs/performance.md). The layout is the protocol's
//! (`opentelemetry/proto/trace/v1/trace.proto`); the tests decode what this writes with the
//! generated types of `opentelemetry-proto`.

use opentelemetry::{Array, KeyValue, Value};
use prost::encoding::{WireType, encode_key, encode_varint, encoded_len_varint, key_len};

/// `Span.kind` (`SPAN_KIND_SERVER`, `SPAN_KIND_CLIENT`).
pub(super) const KIND_SERVER: u64 = 2;
pub(super) const KIND_CLIENT: u64 = 3;
/// `Span.flags`: the W3C trace flags, and whether the parent is known to be remote.
const FLAGS_HAS_IS_REMOTE: u32 = 0x100;
const FLAGS_IS_REMOTE: u32 = 0x200;
/// `Status.code` `STATUS_CODE_ERROR`.
const STATUS_ERROR: u64 = 2;

/// One span, as it is written.
#[derive(Debug)]
pub(super) struct SpanOut<'a> {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    /// The W3C `tracestate` header, empty for none.
    pub trace_state: &'a str,
    /// With whether the parent is remote.
    pub parent: Option<([u8; 8], bool)>,
    pub trace_flags: u8,
    pub name: &'a str,
    pub kind: u64,
    pub start_ns: u64,
    pub end_ns: u64,
    pub attributes: &'a [(&'a str, Attr<'a>)],
    /// The message of an error status; `None`: the status is unset.
    pub error: Option<&'a str>,
}

/// An attribute's value.
#[derive(Debug, Clone, Copy)]
pub(super) enum Attr<'a> {
    Str(&'a str),
    Any(&'a Value),
}

/// A batch of spans of one node (its resource) and one instrumentation scope.
#[derive(Debug)]
pub(super) struct Batch {
    /// `ResourceSpans.resource` and `ScopeSpans.scope`, written once.
    resource: Vec<u8>,
    scope: Vec<u8>,
    /// The spans so far, each as a `ScopeSpans.spans` field.
    spans: Vec<u8>,
    scratch: Vec<u8>,
    count: usize,
}

impl Batch {
    /// An empty batch from `resource`'s attributes, under the scope `scope_name` `version`.
    pub fn new(resource: &[KeyValue], scope_name: &str, scope_version: &str) -> Self {
        let mut body = Vec::new();
        for kv in resource {
            key_value(1, kv.key.as_str(), Attr::Any(&kv.value), &mut body);
        }
        let mut resource = Vec::new();
        message(1, &body, &mut resource);
        body.clear();
        string(1, scope_name, &mut body);
        string(2, scope_version, &mut body);
        let mut scope = Vec::new();
        message(1, &body, &mut scope);
        Batch {
            resource,
            scope,
            spans: Vec::new(),
            scratch: Vec::new(),
            count: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.count
    }

    /// Adds one span.
    pub fn push(&mut self, s: &SpanOut<'_>) {
        let b = &mut self.scratch;
        b.clear();
        bytes(1, &s.trace_id, b);
        bytes(2, &s.span_id, b);
        string(3, s.trace_state, b);
        if let Some((parent, _)) = &s.parent {
            bytes(4, parent, b);
        }
        string(5, s.name, b);
        varint(6, s.kind, b);
        fixed64(7, s.start_ns, b);
        fixed64(8, s.end_ns, b);
        for (key, value) in s.attributes {
            key_value(9, key, *value, b);
        }
        if let Some(message) = s.error {
            let len = field_len(2, message.len()) + key_len(3) + encoded_len_varint(STATUS_ERROR);
            encode_key(15, WireType::LengthDelimited, b);
            encode_varint(len as u64, b);
            string(2, message, b);
            varint(3, STATUS_ERROR, b);
        }
        let mut flags = u32::from(s.trace_flags) | FLAGS_HAS_IS_REMOTE;
        if s.parent.is_some_and(|(_, remote)| remote) {
            flags |= FLAGS_IS_REMOTE;
        }
        encode_key(16, WireType::ThirtyTwoBit, b);
        b.extend_from_slice(&flags.to_le_bytes());
        message(2, b, &mut self.spans);
        self.count += 1;
    }

    /// The request carrying every span pushed since the last call, which empties the batch.
    pub fn take(&mut self) -> Vec<u8> {
        let scope_spans = self.scope.len() + self.spans.len();
        let resource_spans = self.resource.len() + field_len(2, scope_spans);
        let mut out = Vec::with_capacity(field_len(1, resource_spans));
        encode_key(1, WireType::LengthDelimited, &mut out);
        encode_varint(resource_spans as u64, &mut out);
        out.extend_from_slice(&self.resource);
        encode_key(2, WireType::LengthDelimited, &mut out);
        encode_varint(scope_spans as u64, &mut out);
        out.extend_from_slice(&self.scope);
        out.extend_from_slice(&self.spans);
        self.spans.clear();
        self.count = 0;
        out
    }
}

/// The length of a length-delimited field `tag` of `len` bytes.
fn field_len(tag: u32, len: usize) -> usize {
    key_len(tag) + encoded_len_varint(len as u64) + len
}

fn bytes(tag: u32, value: &[u8], out: &mut Vec<u8>) {
    message(tag, value, out);
}

fn message(tag: u32, body: &[u8], out: &mut Vec<u8>) {
    encode_key(tag, WireType::LengthDelimited, out);
    encode_varint(body.len() as u64, out);
    out.extend_from_slice(body);
}

/// A string field; proto3 leaves an empty one out.
fn string(tag: u32, value: &str, out: &mut Vec<u8>) {
    if !value.is_empty() {
        message(tag, value.as_bytes(), out);
    }
}

fn varint(tag: u32, value: u64, out: &mut Vec<u8>) {
    encode_key(tag, WireType::Varint, out);
    encode_varint(value, out);
}

fn fixed64(tag: u32, value: u64, out: &mut Vec<u8>) {
    encode_key(tag, WireType::SixtyFourBit, out);
    out.extend_from_slice(&value.to_le_bytes());
}

/// A `KeyValue` as field `tag`.
fn key_value(tag: u32, key: &str, value: Attr<'_>, out: &mut Vec<u8>) {
    match value {
        // The common case, written without a scratch buffer: `AnyValue.string_value`.
        Attr::Str(s) => {
            let any = field_len(1, s.len());
            let len = field_len(1, key.len()) + field_len(2, any);
            encode_key(tag, WireType::LengthDelimited, out);
            encode_varint(len as u64, out);
            message(1, key.as_bytes(), out);
            encode_key(2, WireType::LengthDelimited, out);
            encode_varint(any as u64, out);
            message(1, s.as_bytes(), out);
        }
        Attr::Any(v) => {
            let mut any = Vec::new();
            any_value(v, &mut any);
            let mut kv = Vec::new();
            message(1, key.as_bytes(), &mut kv);
            message(2, &any, &mut kv);
            message(tag, &kv, out);
        }
    }
}

/// The body of an `AnyValue`.
fn any_value(v: &Value, out: &mut Vec<u8>) {
    match v {
        Value::String(s) => message(1, s.as_str().as_bytes(), out),
        Value::Bool(b) => varint(2, u64::from(*b), out),
        // int64 is written as its two's complement, ten bytes when negative.
        Value::I64(i) => varint(3, *i as u64, out),
        Value::F64(f) => fixed64(4, f.to_bits(), out),
        Value::Array(array) => {
            let mut values = Vec::new();
            let mut each = |v: Value| {
                let mut one = Vec::new();
                any_value(&v, &mut one);
                message(1, &one, &mut values);
            };
            match array {
                Array::Bool(a) => a.iter().for_each(|x| each(Value::Bool(*x))),
                Array::I64(a) => a.iter().for_each(|x| each(Value::I64(*x))),
                Array::F64(a) => a.iter().for_each(|x| each(Value::F64(*x))),
                Array::String(a) => a.iter().for_each(|x| each(Value::String(x.clone()))),
                // A kind of array a later API adds: written as its text.
                other => each(Value::String(other.to_string().into())),
            }
            message(5, &values, out);
        }
        other => message(1, other.as_str().as_bytes(), out),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
    use opentelemetry_proto::tonic::trace::v1::Span;
    use prost::Message;

    fn text(kv: &opentelemetry_proto::tonic::common::v1::KeyValue) -> (String, Option<Any>) {
        (
            kv.key.clone(),
            kv.value.as_ref().and_then(|v| v.value.clone()),
        )
    }

    fn span(name: &'static str) -> SpanOut<'static> {
        SpanOut {
            trace_id: [4; 16],
            span_id: [5; 8],
            trace_state: "",
            parent: None,
            trace_flags: 1,
            name,
            kind: KIND_CLIENT,
            start_ns: 1,
            end_ns: 2,
            attributes: &[],
            error: None,
        }
    }

    /// The spans of the one resource and scope `batch` sends.
    fn spans_of(batch: &mut Batch) -> Vec<Span> {
        let request = ExportTraceServiceRequest::decode(&batch.take()[..]).unwrap();
        let [rs] = &request.resource_spans[..] else {
            panic!("one resource: {request:#?}")
        };
        let [ss] = &rs.scope_spans[..] else {
            panic!("one scope: {rs:#?}")
        };
        ss.spans.clone()
    }

    #[test]
    fn the_resource_and_scope_decode_as_the_protocols_own_messages() {
        let resource = [
            KeyValue::new("service.name", "mcpmesh"),
            KeyValue::new("count", 7i64),
            KeyValue::new("negative", -3i64),
            KeyValue::new("ratio", 0.5),
            KeyValue::new("on", true),
            KeyValue::new("list", Value::Array(vec![1i64, 2].into())),
        ];
        let mut batch = Batch::new(&resource, "mcpmesh", "1.2.3");
        batch.push(&span("ping"));
        let request = ExportTraceServiceRequest::decode(&batch.take()[..]).unwrap();
        let rs = &request.resource_spans[0];
        let got: Vec<_> = rs
            .resource
            .as_ref()
            .unwrap()
            .attributes
            .iter()
            .map(text)
            .collect();
        assert_eq!(
            got[0],
            (
                "service.name".into(),
                Some(Any::StringValue("mcpmesh".into()))
            )
        );
        assert_eq!(got[1], ("count".into(), Some(Any::IntValue(7))));
        assert_eq!(got[2], ("negative".into(), Some(Any::IntValue(-3))));
        assert_eq!(got[3], ("ratio".into(), Some(Any::DoubleValue(0.5))));
        assert_eq!(got[4], ("on".into(), Some(Any::BoolValue(true))));
        let Some(Any::ArrayValue(list)) = &got[5].1 else {
            panic!("{got:?}")
        };
        let list: Vec<_> = list.values.iter().map(|v| v.value.clone()).collect();
        assert_eq!(list, [Some(Any::IntValue(1)), Some(Any::IntValue(2))]);
        let scope = rs.scope_spans[0].scope.as_ref().unwrap();
        assert_eq!((&*scope.name, &*scope.version), ("mcpmesh", "1.2.3"));
    }

    #[test]
    fn a_span_decodes_as_the_protocols_own_message() {
        let mut batch = Batch::new(&[], "mcpmesh", "1");
        let long = "x".repeat(300);
        let attributes = [
            ("mcp.method.name", Attr::Str("tools/call")),
            ("empty", Attr::Str("")),
            ("é", Attr::Str(&long)),
            ("n", Attr::Any(&Value::I64(9))),
        ];
        batch.push(&SpanOut {
            trace_id: [1; 16],
            span_id: [2; 8],
            trace_state: "k=v",
            parent: Some(([3; 8], true)),
            trace_flags: 1,
            name: "tools/call echo",
            kind: KIND_SERVER,
            start_ns: 1_700_000_000_000_000_000,
            end_ns: 1_700_000_000_000_500_000,
            attributes: &attributes,
            error: Some("-32602"),
        });
        batch.push(&span("initialize"));
        assert_eq!(batch.len(), 2);
        let [a, b] = &spans_of(&mut batch)[..] else {
            panic!("two spans")
        };
        assert_eq!(
            (a.trace_id.as_slice(), a.span_id.as_slice()),
            (&[1; 16][..], &[2; 8][..])
        );
        assert_eq!(a.parent_span_id, [3; 8]);
        assert_eq!(
            (&*a.trace_state, &*a.name, a.kind),
            ("k=v", "tools/call echo", 2)
        );
        assert_eq!(a.start_time_unix_nano, 1_700_000_000_000_000_000);
        assert_eq!(a.end_time_unix_nano, 1_700_000_000_000_500_000);
        assert_eq!(a.flags, 0x301);
        let attrs: Vec<_> = a.attributes.iter().map(text).collect();
        assert_eq!(
            attrs,
            [
                (
                    "mcp.method.name".into(),
                    Some(Any::StringValue("tools/call".into()))
                ),
                ("empty".into(), Some(Any::StringValue(String::new()))),
                ("é".into(), Some(Any::StringValue(long.clone()))),
                ("n".into(), Some(Any::IntValue(9))),
            ]
        );
        let status = a.status.as_ref().unwrap();
        assert_eq!((&*status.message, status.code), ("-32602", 2));

        assert!(b.parent_span_id.is_empty() && b.trace_state.is_empty());
        assert_eq!((&*b.name, b.kind, b.flags), ("initialize", 3, 0x101));
        assert!(b.attributes.is_empty() && b.status.is_none());
    }

    #[test]
    fn a_batch_taken_is_empty_again() {
        let mut batch = Batch::new(&[], "mcpmesh", "1");
        batch.push(&span("one"));
        assert_eq!(spans_of(&mut batch).len(), 1);
        assert_eq!(batch.len(), 0);
        batch.push(&span("two"));
        let names: Vec<String> = spans_of(&mut batch).into_iter().map(|s| s.name).collect();
        assert_eq!(names, ["two"]);
    }
}
