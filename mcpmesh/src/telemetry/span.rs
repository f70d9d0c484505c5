//! What a span says: the request it describes as the request path hands it over ([`Traced`]),
//! and as it waits in the queue for the sending thread ([`Ended`]).

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::LazyLock;
use std::time::Instant;

use opentelemetry::Context;
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry_sdk::propagation::TraceContextPropagator;

use super::names;
use super::otlp::Attr;

/// Longest method, tool or prompt name a span carries (a caller chooses them).
const MAX_NAME: usize = 128;

/// The trace context a request carried in `params._meta`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceParent {
    pub traceparent: String,
    pub tracestate: Option<String>,
}

impl TraceParent {
    /// The caller's context from a request's `params`, when it carried one.
    pub fn of(params: Option<&serde_json::value::RawValue>) -> Option<Self> {
        // Most requests carry none, and `_meta` often comes after megabytes of arguments: a
        // byte search, far cheaper than a parse, rules those out.
        static TRACEPARENT: LazyLock<memchr::memmem::Finder<'static>> =
            LazyLock::new(|| memchr::memmem::Finder::new(b"traceparent"));
        TRACEPARENT.find(params?.get().as_bytes())?;
        let meta = mcpmesh_net::jsonrpc::meta(params);
        Some(TraceParent {
            traceparent: meta.traceparent?,
            tracestate: meta.tracestate,
        })
    }

    /// As the parent of a span; a malformed `traceparent` is no parent (a new trace).
    pub(super) fn context(&self) -> Context {
        let mut carrier = HashMap::with_capacity(2);
        carrier.insert("traceparent".to_owned(), self.traceparent.clone());
        if let Some(state) = &self.tracestate {
            carrier.insert("tracestate".to_owned(), state.clone());
        }
        TraceContextPropagator::new().extract(&carrier)
    }
}

/// Which node's side of a request a span describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// This node served it (span kind SERVER).
    Served,
    /// This node sent it to a peer for one of its clients (span kind CLIENT).
    Dialed,
}

/// One finished request, as its span tells it.
#[derive(Debug, Clone, Copy)]
pub struct Traced<'a> {
    pub side: Side,
    pub method: &'a str,
    /// The tool, prompt or resource the request names.
    pub name: Option<&'a str>,
    /// The request's id as it arrived (raw JSON).
    pub request_id: &'a str,
    pub service: &'a str,
    /// The peer's endpoint id (hex); empty for a local caller.
    pub peer_id: &'a str,
    /// How it ended: `ok`, `error` (with `code`), `tool_error`, or what the node made of it
    /// (`rate_limited`, `denied`, `unanswered`, …).
    pub outcome: &'a str,
    pub code: Option<i64>,
    pub started: Instant,
    pub parent: Option<&'a TraceParent>,
}

#[cfg(test)]
impl Traced<'static> {
    /// An answered request of `method`, served.
    pub fn for_test(method: &'static str) -> Self {
        Traced {
            side: Side::Served,
            method,
            name: None,
            request_id: "1",
            service: "svc",
            peer_id: "",
            outcome: "ok",
            code: None,
            started: Instant::now(),
            parent: None,
        }
    }
}

/// A finished request as the request path queues it: [`Traced`], owned in one allocation,
/// every caller-chosen name already bounded. Its times stay [`Instant`]s until the sending
/// thread writes them (one clock read on the request path).
#[derive(Debug)]
pub(super) struct Ended {
    pub side: Side,
    /// The method (when the specification does not define it), the name, the raw id, the
    /// service, the peer's id and the outcome (when the node does not name it), one after
    /// another; `ends` says where each ends.
    text: String,
    ends: [usize; 6],
    /// The method and the outcome when they are known words, else empty (then in `text`).
    known_method: &'static str,
    known_outcome: &'static str,
    has_name: bool,
    pub code: Option<i64>,
    pub started: Instant,
    pub ended: Instant,
    pub parent: Option<TraceParent>,
}

impl Ended {
    pub fn of(r: &Traced<'_>) -> Self {
        let ended = Instant::now();
        // A method the specification defines is named without a copy.
        let known_method = match names::method(r.method) {
            names::OTHER => "",
            known => known,
        };
        // The outcomes the metrics name are kept without a copy; any other is copied as it is.
        let known_outcome = match names::outcome(r.outcome) {
            names::OTHER if r.outcome != names::OTHER => "",
            known => known,
        };
        let parts = [
            if known_method.is_empty() {
                bounded(r.method)
            } else {
                ""
            },
            r.name.map(bounded).unwrap_or_default(),
            r.request_id,
            r.service,
            r.peer_id,
            if known_outcome.is_empty() {
                bounded(r.outcome)
            } else {
                ""
            },
        ];
        let mut text = String::with_capacity(parts.iter().map(|p| p.len()).sum());
        let mut ends = [0; 6];
        for (part, end) in parts.iter().zip(&mut ends) {
            text.push_str(part);
            *end = text.len();
        }
        Ended {
            side: r.side,
            text,
            ends,
            known_method,
            known_outcome,
            has_name: r.name.is_some(),
            code: r.code,
            started: r.started,
            ended,
            parent: r.parent.cloned(),
        }
    }

    /// Part `i` of `text`.
    fn part(&self, i: usize) -> &str {
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        self.text.get(start..self.ends[i]).unwrap_or_default()
    }

    fn method(&self) -> &str {
        match self.known_method {
            "" => self.part(0),
            known => known,
        }
    }

    fn name(&self) -> Option<&str> {
        self.has_name.then(|| self.part(1))
    }

    fn service(&self) -> &str {
        self.part(3)
    }

    fn peer_id(&self) -> &str {
        self.part(4)
    }

    fn outcome(&self) -> &str {
        match self.known_outcome {
            "" => self.part(5),
            known => known,
        }
    }

    /// `{method} {target}`: tool and prompt names are low-cardinality targets; a resource's
    /// URI is not.
    pub fn span_name(&self) -> Cow<'_, str> {
        match (self.method(), self.name()) {
            (method @ ("tools/call" | "prompts/get"), Some(target)) => {
                format!("{method} {target}").into()
            }
            (method, _) => method.into(),
        }
    }

    /// The id as the conventions write it: a string id without its quotes, a number as it is.
    pub fn request_id(&self) -> String {
        request_id(self.part(2))
    }

    /// The span's attributes, `request_id` and `code` as [`Self::request_id`] and the code's
    /// text give them.
    pub fn attributes<'a>(
        &'a self,
        request_id: &'a str,
        code: Option<&'a str>,
        out: &mut Vec<(&'a str, Attr<'a>)>,
    ) {
        let method = self.method();
        out.extend([
            ("mcp.method.name", Attr::Str(method)),
            ("jsonrpc.request.id", Attr::Str(request_id)),
            ("network.transport", Attr::Str("quic")),
            ("mcpmesh.service", Attr::Str(self.service())),
        ]);
        if !self.peer_id().is_empty() {
            out.push(("mcpmesh.peer.id", Attr::Str(self.peer_id())));
        }
        match (method, self.name()) {
            ("tools/call", Some(tool)) => {
                out.push(("gen_ai.tool.name", Attr::Str(tool)));
                out.push(("gen_ai.operation.name", Attr::Str("execute_tool")));
            }
            ("prompts/get", Some(prompt)) => out.push(("gen_ai.prompt.name", Attr::Str(prompt))),
            (m, Some(uri)) if m.starts_with("resources/") => {
                out.push(("mcp.resource.uri", Attr::Str(uri)));
            }
            _ => {}
        }
        if let Some(code) = code {
            out.push(("rpc.response.status_code", Attr::Str(code)));
        }
        if let Some(error) = self.error(code) {
            out.push(("error.type", Attr::Str(error)));
        }
    }

    /// The error the span's status carries: the JSON-RPC code, else the outcome; `None` for
    /// `ok`.
    pub fn error<'a>(&'a self, code: Option<&'a str>) -> Option<&'a str> {
        match (self.outcome(), code) {
            ("ok", _) => None,
            (_, Some(code)) => Some(code),
            (outcome, None) => Some(outcome),
        }
    }

    #[cfg(test)]
    pub fn for_test(method: &'static str) -> Self {
        Ended::of(&Traced::for_test(method))
    }
}

/// A caller-chosen name cut to [`MAX_NAME`] bytes (on a character boundary).
fn bounded(name: &str) -> &str {
    if name.len() <= MAX_NAME {
        return name;
    }
    let mut end = MAX_NAME;
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    &name[..end]
}

/// A request id as the conventions write it: a string id without its quotes, a number as it is.
fn request_id(raw: &str) -> String {
    if raw.starts_with('"')
        && let Ok(id) = serde_json::from_str::<Cow<'_, str>>(raw)
    {
        return bounded(&id).to_owned();
    }
    bounded(raw).to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caller_chosen_names_and_ids_are_bounded() {
        assert_eq!(bounded("tools/call"), "tools/call");
        let long = "é".repeat(100);
        assert!(bounded(&long).len() <= MAX_NAME);
        assert!(long.starts_with(bounded(&long)));
        assert_eq!(request_id("7"), "7");
        assert_eq!(request_id(r#""a-1""#), "a-1");
    }

    #[test]
    fn a_queued_request_keeps_every_text_it_was_given_in_one_piece() {
        let long = "t".repeat(300);
        let r = |method, name, outcome, code| Traced {
            side: Side::Dialed,
            method,
            name,
            request_id: r#""a-1""#,
            service: "notes",
            peer_id: "ab12",
            outcome,
            code,
            started: Instant::now(),
            parent: None,
        };
        let e = Ended::of(&r("tools/call", Some("echo"), "ok", None));
        assert_eq!(
            (e.method(), e.name(), e.service()),
            ("tools/call", Some("echo"), "notes")
        );
        assert_eq!(
            (e.peer_id(), e.outcome(), e.request_id()),
            ("ab12", "ok", "a-1".into())
        );
        assert_eq!(e.span_name(), "tools/call echo");
        assert_eq!(e.error(None), None);
        let mut attributes = Vec::new();
        e.attributes("a-1", None, &mut attributes);
        let keys: Vec<&str> = attributes.iter().map(|(k, _)| *k).collect();
        assert_eq!(
            keys,
            [
                "mcp.method.name",
                "jsonrpc.request.id",
                "network.transport",
                "mcpmesh.service",
                "mcpmesh.peer.id",
                "gen_ai.tool.name",
                "gen_ai.operation.name"
            ]
        );

        // A method and an outcome the node does not know, and a name too long: bounded copies.
        let e = Ended::of(&r("x/custom", Some(&long), "teapot", Some(-32000)));
        assert_eq!((e.method(), e.outcome()), ("x/custom", "teapot"));
        assert_eq!(e.name().map(str::len), Some(MAX_NAME));
        assert_eq!(
            e.span_name(),
            "x/custom",
            "only tools and prompts name a target"
        );
        assert_eq!(e.error(Some("-32000")), Some("-32000"));
        assert_eq!(e.error(None), Some("teapot"));
        let e = Ended::of(&r("resources/read", None, "denied", None));
        assert_eq!(
            (e.name(), e.outcome(), e.peer_id()),
            (None, "denied", "ab12")
        );
    }

    #[test]
    fn a_malformed_traceparent_is_no_parent() {
        use opentelemetry::trace::TraceContextExt;
        let good = TraceParent {
            traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into(),
            tracestate: None,
        };
        let context = good.context();
        let parent = context.span().span_context().clone();
        assert!(parent.is_valid() && parent.is_remote());
        assert_eq!(
            parent.trace_id().to_string(),
            "0af7651916cd43dd8448eb211c80319c"
        );
        let bad = TraceParent {
            traceparent: "00-zz-b7ad6b7169203331-01".into(),
            tracestate: None,
        };
        assert!(!bad.context().span().span_context().is_valid());
    }
}
