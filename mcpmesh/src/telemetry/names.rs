//! Label values a caller chooses, bounded: a hostile caller can send a million distinct method
//! or tool names, and each distinct label value is a series kept for the node's lifetime.
//!
//! A method keeps its name only when the MCP specification defines it (everything else is
//! `other`). A tool keeps its name only once its server accepted a call of it (answered it, if
//! only with a tool error), and then only the first [`TOOLS_PER_SERVICE`] such names of a
//! service; every other call is labelled `other`.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

/// Distinct tool names labelled per service.
pub const TOOLS_PER_SERVICE: usize = 64;

/// The label of a value that is not kept.
pub const OTHER: &str = "other";

/// The requests of the MCP specification (client to server, and server to client).
const METHODS: [&str; 22] = [
    "initialize",
    "ping",
    "tools/list",
    "tools/call",
    "prompts/list",
    "prompts/get",
    "resources/list",
    "resources/templates/list",
    "resources/read",
    "resources/subscribe",
    "resources/unsubscribe",
    "completion/complete",
    "logging/setLevel",
    "sampling/createMessage",
    "elicitation/create",
    "roots/list",
    "tasks/get",
    "tasks/result",
    "tasks/list",
    "tasks/cancel",
    "notifications/cancelled",
    "notifications/initialized",
];

/// `method` as a label: its own name when the specification defines it, else `other`.
pub fn method(method: &str) -> &'static str {
    METHODS
        .iter()
        .find(|m| **m == method)
        .copied()
        .unwrap_or(OTHER)
}

/// `params.name` of a `tools/call`, read only as far as it comes: clients write it before the
/// arguments, which can be megabytes that nothing here needs to read.
pub fn tool_of(params: &str) -> Option<String> {
    struct UpToName<'a>(&'a mut Option<String>);
    impl<'de> serde::de::Visitor<'de> for UpToName<'_> {
        type Value = ();
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("an object")
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
            while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                if key == "name" {
                    *self.0 = map.next_value()?;
                    return Ok(());
                }
                map.next_value::<serde::de::IgnoredAny>()?;
            }
            Ok(())
        }
    }
    let mut name = None;
    let mut de = serde_json::Deserializer::from_str(params);
    // Stopping at the name leaves the object unfinished, which serde_json reports: the name
    // was read by then.
    let _ = serde::Deserializer::deserialize_map(&mut de, UpToName(&mut name));
    name
}

/// How a request ended, as a label (the ledger's outcomes; anything else is `other`).
pub fn outcome(outcome: &str) -> &'static str {
    const OUTCOMES: [&str; 9] = [
        "ok",
        "error",
        "tool_error",
        "refused",
        "rate_limited",
        "denied",
        "cancelled",
        "unanswered",
        "severed",
    ];
    OUTCOMES
        .iter()
        .find(|o| **o == outcome)
        .copied()
        .unwrap_or(OTHER)
}

/// The tool names each service has labels for.
#[derive(Debug)]
pub struct ToolNames {
    kept: Mutex<HashMap<String, HashSet<Arc<str>>>>,
    other: Arc<str>,
}

impl Default for ToolNames {
    fn default() -> Self {
        ToolNames {
            kept: Mutex::default(),
            other: Arc::from(OTHER),
        }
    }
}

impl ToolNames {
    /// The label for a call of `tool` on `service`. `accepted`: its server answered it (if
    /// only with a tool error), so the name is one the server knows and may be kept.
    pub fn label(&self, service: &str, tool: &str, accepted: bool) -> Arc<str> {
        let mut kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(known) = kept.get(service).and_then(|names| names.get(tool)) {
            return known.clone();
        }
        if !accepted {
            return self.other.clone();
        }
        let names = match kept.get_mut(service) {
            Some(names) => names,
            None => kept.entry(service.to_owned()).or_default(),
        };
        if names.len() >= TOOLS_PER_SERVICE {
            return self.other.clone();
        }
        let name: Arc<str> = Arc::from(tool);
        names.insert(name.clone());
        name
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_methods_of_the_specification_keep_their_name() {
        assert_eq!(method("tools/call"), "tools/call");
        assert_eq!(
            method("resources/templates/list"),
            "resources/templates/list"
        );
        assert_eq!(method("tools/call2"), OTHER);
        assert_eq!(method("x".repeat(10_000).as_str()), OTHER);
        assert_eq!(outcome("rate_limited"), "rate_limited");
        assert_eq!(outcome("whatever"), OTHER);
    }

    #[test]
    fn a_tool_name_is_read_before_or_after_its_arguments() {
        assert_eq!(
            tool_of(r#"{"name":"echo","arguments":{"text":"#).as_deref(),
            Some("echo"),
            "nothing after the name is read"
        );
        assert_eq!(
            tool_of(r#"{"arguments":{"a":[1,{"name":"inner"}]},"name":"e\u0063ho"}"#).as_deref(),
            Some("echo")
        );
        assert_eq!(tool_of(r#"{"arguments":{}}"#), None);
        assert_eq!(tool_of(r#"{"name":7}"#), None);
        assert_eq!(tool_of("[1]"), None);
    }

    #[test]
    fn tool_names_are_kept_only_when_accepted_and_only_so_many_per_service() {
        let names = ToolNames::default();
        // A name the server refused is never kept, however often it comes.
        assert_eq!(&*names.label("svc", "nope", false), OTHER);
        assert_eq!(&*names.label("svc", "echo", true), "echo");
        // Once kept, a refused call of it keeps its name too.
        assert_eq!(&*names.label("svc", "echo", false), "echo");
        for i in 1..TOOLS_PER_SERVICE {
            assert_eq!(
                &*names.label("svc", &format!("t{i}"), true),
                format!("t{i}")
            );
        }
        assert_eq!(&*names.label("svc", "one_too_many", true), OTHER);
        // Each service has its own room.
        assert_eq!(
            &*names.label("other_svc", "one_too_many", true),
            "one_too_many"
        );
    }
}
