//! Per-tool policy on the serving side: which of a service's tools a caller may use, decided
//! from its whole principal set.
//!
//! A service's rules each name principals (`who`) and tool patterns to `allow` and `deny`
//! (`*` any run of characters, `?` one). A service with no rules lets every admitted caller
//! use every tool. Otherwise only the rules naming one of the caller's principals apply, and
//! a caller no rule names may use no tool. A tool any applying rule denies is denied — a deny
//! is never undone by another principal the caller also holds — and otherwise the first
//! applying rule with an `allow` list decides; applying rules that only deny leave the rest
//! allowed.
//!
//! The rules come from `[[services.X.tools]]` and are read live: a session asks for the
//! current rules on each request, so `grant --tools` and hand edits apply to sessions already
//! open. The serving session answers a `tools/call` of a tool the caller may not use itself
//! (`-32054`, see `backends::ledger`) and drops the tools it may not use from each
//! `tools/list` answer ([`filter_tools_list`]), editing nothing else of that frame.

use std::borrow::Cow;
use std::sync::{Arc, RwLock};

use serde::Deserialize;
use serde_json::value::RawValue;

use crate::principal::Principal;

/// One rule of a service's policy.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ToolRule {
    pub who: Vec<Principal>,
    pub allow: Vec<String>,
    pub deny: Vec<String>,
}

impl ToolRule {
    fn applies_to(&self, held: &[Principal]) -> bool {
        self.who.iter().any(|p| held.contains(p))
    }
}

/// A service's rules as its sessions read them: one handle per service, kept across config
/// reloads and updated in place, so every session sees the rules of the moment.
#[derive(Debug, Clone, Default)]
pub struct ToolPolicy(Arc<RwLock<Arc<[ToolRule]>>>);

impl ToolPolicy {
    pub fn new(rules: Vec<ToolRule>) -> Self {
        ToolPolicy(Arc::new(RwLock::new(rules.into())))
    }

    /// The rules in force now (empty: every tool).
    pub fn current(&self) -> Arc<[ToolRule]> {
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn set(&self, rules: Vec<ToolRule>) {
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = rules.into();
    }
}

/// The tool names of the last `tools/list` a service's server answered (its pages joined), as
/// the catalog counts them: one handle per service, kept across config reloads.
#[derive(Debug, Clone, Default)]
pub struct ListedTools(Arc<RwLock<Option<Arc<[String]>>>>);

impl ListedTools {
    /// The names last listed; `None`: the service was never listed through this node.
    pub fn get(&self) -> Option<Arc<[String]>> {
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Keeps the names of one page of a listing: a first page replaces what was known, a
    /// later one (asked with a cursor) adds to it.
    pub fn record(&self, names: Vec<String>, first_page: bool) {
        let mut known = self.0.write().unwrap_or_else(|p| p.into_inner());
        let names: Arc<[String]> = match known.as_deref() {
            Some(before) if !first_page => {
                let mut all = before.to_vec();
                all.extend(names.into_iter().filter(|n| !before.contains(n)));
                all.into()
            }
            _ => names.into(),
        };
        *known = Some(names);
    }
}

/// The names of the tools in a `tools/list` answer, `None` when `line` is not one.
pub fn listed_tool_names(line: &[u8]) -> Option<Vec<String>> {
    #[derive(Deserialize)]
    struct Answer<'a> {
        #[serde(borrow)]
        result: Option<ListResult<'a>>,
    }
    #[derive(Deserialize)]
    struct ListResult<'a> {
        #[serde(borrow)]
        tools: Vec<Named<'a>>,
    }
    let answer: Answer<'_> = serde_json::from_slice(line).ok()?;
    Some(
        answer
            .result?
            .tools
            .into_iter()
            .map(|t| t.name.into_owned())
            .collect(),
    )
}

/// The patterns that decide for one caller, borrowed from its rules: the one place the
/// rules' precedence is read, for [`may_use`] and [`access`] alike.
struct Deciding<'r> {
    /// `None`: every tool.
    allow: Option<&'r [String]>,
    /// Every applying rule's, in order, possibly repeated.
    deny: Vec<&'r String>,
}

impl Deciding<'_> {
    fn of<'r>(rules: &'r [ToolRule], held: &[Principal]) -> Deciding<'r> {
        if rules.is_empty() {
            return Deciding {
                allow: None,
                deny: Vec::new(),
            };
        }
        let applying: Vec<&ToolRule> = rules.iter().filter(|r| r.applies_to(held)).collect();
        let allow = match applying.iter().find(|r| !r.allow.is_empty()) {
            Some(rule) => Some(&rule.allow[..]),
            // Named by no rule: no tool.
            None if applying.is_empty() => Some(&[][..]),
            None => None,
        };
        let deny = applying.iter().flat_map(|r| &r.deny).collect();
        Deciding { allow, deny }
    }

    fn permits(&self, tool: &str) -> bool {
        self.allow
            .is_none_or(|allow| allow.iter().any(|p| matches(p, tool)))
            && !self.deny.iter().any(|p| matches(p, tool))
    }
}

/// Whether a caller holding `held` may use `tool` under `rules`.
pub fn may_use(rules: &[ToolRule], held: &[Principal], tool: &str) -> bool {
    Deciding::of(rules, held).permits(tool)
}

/// What [`may_use`] decides for one caller, as patterns: a tool is usable when it matches
/// one of `allow` and none of `deny`. The node knows patterns, not tool names, until a
/// session asks the server.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ToolAccess {
    pub allow: Vec<String>,
    pub deny: Vec<String>,
}

impl ToolAccess {
    /// Every tool.
    pub fn is_all(&self) -> bool {
        self.deny.is_empty() && self.allow.iter().any(|p| p == "*")
    }
}

/// The patterns that decide which tools a caller holding `held` may use under `rules`.
pub fn access(rules: &[ToolRule], held: &[Principal]) -> ToolAccess {
    let deciding = Deciding::of(rules, held);
    let mut deny: Vec<String> = Vec::new();
    for pattern in deciding.deny {
        if !deny.contains(pattern) {
            deny.push(pattern.clone());
        }
    }
    let allow = match deciding.allow {
        Some(allow) => allow.to_vec(),
        None => vec!["*".to_owned()],
    };
    ToolAccess { allow, deny }
}

/// Whether `name` matches `pattern` (`*`: any run of characters, `?`: one).
pub fn matches(pattern: &str, name: &str) -> bool {
    let (p, n): (Vec<char>, Vec<char>) = (pattern.chars().collect(), name.chars().collect());
    // The classic two-pointer match with one backtrack point: linear in practice, never
    // exponential, whatever the pattern.
    let (mut pi, mut ni) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ni < n.len() {
        match p.get(pi) {
            Some('*') => {
                star = Some((pi, ni));
                pi += 1;
            }
            Some(&c) if c == '?' || c == n[ni] => {
                pi += 1;
                ni += 1;
            }
            _ => match star {
                Some((sp, sn)) => {
                    pi = sp + 1;
                    ni = sn + 1;
                    star = Some((sp, sn + 1));
                }
                None => return false,
            },
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

/// Why a `tools/list` answer cannot be filtered; it is then withheld from the caller.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FilterError {
    #[error("the answer is not valid JSON")]
    Malformed,
    #[error("result.tools is not a list")]
    NotAList,
    /// A member a client would read only one of (which one differs between parsers).
    #[error("{0} appears more than once")]
    Repeated(&'static str),
}

/// A `tools/list` answer (`line`, one JSON object, no newline) with the tools `keep` refuses
/// dropped from `result.tools`: the one span rewritten, every other byte of the frame as the
/// server wrote it. `None` when every tool is kept (the line passes as it is), and for an
/// answer without `result.tools` (an error). A tool entry without a readable name is dropped.
pub fn filter_tools_list(
    line: &[u8],
    keep: impl Fn(&str) -> bool,
) -> Result<Option<Vec<u8>>, FilterError> {
    let text = std::str::from_utf8(line).map_err(|_| FilterError::Malformed)?;
    let answer: Members<'_> = serde_json::from_str(text).map_err(|_| FilterError::Malformed)?;
    let Some(result) = answer.get("result")? else {
        return Ok(None);
    };
    let result: Members<'_> =
        serde_json::from_str(result.get()).map_err(|_| FilterError::NotAList)?;
    let Some(tools) = result.get("tools")? else {
        return Ok(None);
    };
    let entries: Vec<&RawValue> =
        serde_json::from_str(tools.get()).map_err(|_| FilterError::NotAList)?;
    let kept: Vec<&str> = entries
        .iter()
        .filter(|entry| {
            serde_json::from_str::<Named<'_>>(entry.get()).is_ok_and(|tool| keep(&tool.name))
        })
        .map(|entry| entry.get())
        .collect();
    if kept.len() == entries.len() {
        return Ok(None);
    }
    // `tools` borrows from `line`: its span is where its text starts, for its length.
    let start = tools.get().as_ptr() as usize - text.as_ptr() as usize;
    let end = start + tools.get().len();
    let mut out = Vec::with_capacity(line.len());
    out.extend_from_slice(&line[..start]);
    out.push(b'[');
    out.extend_from_slice(kept.join(",").as_bytes());
    out.push(b']');
    out.extend_from_slice(&line[end..]);
    Ok(Some(out))
}

/// The members of one JSON object, in order (names unescaped, values raw and borrowed).
struct Members<'a>(Vec<(String, &'a RawValue)>);

impl<'de> Deserialize<'de> for Members<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Object;
        impl<'de> serde::de::Visitor<'de> for Object {
            type Value = Members<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Self::Value, A::Error> {
                let mut members = Vec::new();
                while let Some(member) = map.next_entry::<String, &'de RawValue>()? {
                    members.push(member);
                }
                Ok(Members(members))
            }
        }
        deserializer.deserialize_map(Object)
    }
}

impl<'a> Members<'a> {
    fn get(&self, name: &'static str) -> Result<Option<&'a RawValue>, FilterError> {
        let mut found = self.0.iter().filter(|(k, _)| k == name).map(|(_, v)| *v);
        match (found.next(), found.next()) {
            (_, Some(_)) => Err(FilterError::Repeated(name)),
            (one, None) => Ok(one),
        }
    }
}

/// A tool entry's name; its other members are not read.
#[derive(Deserialize)]
struct Named<'a> {
    #[serde(borrow)]
    name: Cow<'a, str>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(who: &[&str], allow: &[&str], deny: &[&str]) -> ToolRule {
        ToolRule {
            who: who.iter().map(|w| w.parse().unwrap()).collect(),
            allow: allow.iter().map(|s| s.to_string()).collect(),
            deny: deny.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn held(principals: &[&str]) -> Vec<Principal> {
        principals.iter().map(|p| p.parse().unwrap()).collect()
    }

    #[test]
    fn patterns_match_whole_names() {
        for (pattern, name, want) in [
            ("read_*", "read_file", true),
            ("read_*", "read_", true),
            ("read_*", "unread_file", false),
            ("*", "", true),
            ("*", "anything", true),
            ("list_?", "list_a", true),
            ("list_?", "list_ab", false),
            ("*_file", "read_file", true),
            ("*_file", "read_files", false),
            ("a*b*c", "aXXbYYc", true),
            ("a*b*c", "aXXbYY", false),
            ("search_files", "search_files", true),
            ("search_files", "search_file", false),
            ("", "", true),
            ("", "x", false),
            ("**", "x", true),
        ] {
            assert_eq!(matches(pattern, name), want, "{pattern:?} ~ {name:?}");
        }
    }

    #[test]
    fn a_pathological_pattern_stays_fast() {
        let name = "a".repeat(10_000);
        let pattern = format!("{}b", "*a".repeat(50));
        assert!(!matches(&pattern, &name));
    }

    #[test]
    fn the_issue_example_and_its_edges() {
        // [[services.files.tools]] who = ["group:eng"], allow = ["read_*", "list_*",
        // "search_files"]; then who = ["peer:dave"], deny = ["*"].
        let rules = [
            rule(&["group:eng"], &["read_*", "list_*", "search_files"], &[]),
            rule(&["peer:dave"], &[], &["*"]),
        ];
        let eng = held(&["peer:bob", "user:bob", "group:eng"]);
        let dave = held(&["peer:dave"]);
        let dave_in_eng = held(&["peer:dave", "user:dave", "group:eng"]);
        let sales = held(&["peer:carol", "user:carol", "group:sales"]);
        for (who, tool, want) in [
            (&eng, "read_file", true),
            (&eng, "list_directory", true),
            (&eng, "search_files", true),
            (&eng, "write_file", false),
            (&dave, "read_file", false),
            // The group's allow never undoes the deny dave's own name carries.
            (&dave_in_eng, "read_file", false),
            // Named by no rule: no tool.
            (&sales, "read_file", false),
        ] {
            assert_eq!(may_use(&rules, who, tool), want, "{who:?} {tool}");
        }
    }

    #[test]
    fn no_rules_mean_every_tool_and_deny_only_rules_leave_the_rest() {
        let anyone = held(&["peer:bob"]);
        assert!(may_use(&[], &anyone, "delete_everything"));
        let rules = [rule(&["peer:bob"], &[], &["delete_*", "write_?ile"])];
        for (tool, want) in [
            ("read_file", true),
            ("delete_file", false),
            ("write_file", false),
            ("write_files", true),
        ] {
            assert_eq!(may_use(&rules, &anyone, tool), want, "{tool}");
        }
    }

    #[test]
    fn the_first_applying_rule_with_an_allow_list_decides() {
        let rules = [
            rule(&["group:ops"], &[], &["drop_*"]),
            rule(&["group:eng"], &["read_*"], &[]),
            rule(&["user:bob"], &["*"], &[]),
        ];
        let bob = held(&["user:bob", "group:eng", "group:ops"]);
        assert!(may_use(&rules, &bob, "read_x"));
        // The eng rule comes first: bob's own `*` is not reached.
        assert!(!may_use(&rules, &bob, "write_x"));
        assert!(!may_use(&rules, &bob, "drop_x"));
        let bob_alone = held(&["user:bob"]);
        assert!(may_use(&rules, &bob_alone, "write_x"));
    }

    fn filtered(line: &str) -> Result<Option<String>, FilterError> {
        let keep = |name: &str| name.starts_with("read") || name == "ünï";
        filter_tools_list(line.as_bytes(), keep)
            .map(|out| out.map(|b| String::from_utf8(b).unwrap()))
    }

    #[test]
    fn a_tools_list_answer_loses_only_the_refused_tools() {
        for (line, want) in [
            (
                r#"{"jsonrpc":"2.0","id":1,"result":{"tools":[{"name":"read_file"},{"name":"write_file"}]}}"#,
                Some(r#"{"jsonrpc":"2.0","id":1,"result":{"tools":[{"name":"read_file"}]}}"#),
            ),
            // Spacing, key order, escapes and unicode outside `tools` stay byte for byte, and
            // the kept entries keep their own spelling.
            (
                "{ \"result\" : { \"nextCursor\":\"c\\u00e9\", \"tools\" : [ {\"name\" : \"\\u0072ead\", \"d\":\"\u{2713}\"} ,\n {\"name\":\"drop\"}, {\"name\":\"ünï\"} ] , \"_meta\":{} }, \"id\" : \"x\" ,\"jsonrpc\":\"2.0\" }",
                Some(
                    "{ \"result\" : { \"nextCursor\":\"c\\u00e9\", \"tools\" : [{\"name\" : \"\\u0072ead\", \"d\":\"\u{2713}\"},{\"name\":\"ünï\"}] , \"_meta\":{} }, \"id\" : \"x\" ,\"jsonrpc\":\"2.0\" }",
                ),
            ),
            // Nothing refused: the line passes as it is.
            (r#"{"id":1,"result":{"tools":[{"name":"read"}]}}"#, None),
            (r#"{"id":1,"result":{"tools":[]}}"#, None),
            // An error, or a result without tools: nothing to filter.
            (r#"{"id":1,"error":{"code":-1,"message":"no"}}"#, None),
            (r#"{"id":1,"result":{}}"#, None),
            // Entries whose name cannot be read are not offered.
            (
                r#"{"id":1,"result":{"tools":[{"name":"read"},{"title":"x"},7,{"name":"read","name":"write"}]}}"#,
                Some(r#"{"id":1,"result":{"tools":[{"name":"read"}]}}"#),
            ),
            (
                r#"{"id":1,"result":{"tools":[{"name":"write"}]}}"#,
                Some(r#"{"id":1,"result":{"tools":[]}}"#),
            ),
        ] {
            assert_eq!(filtered(line).unwrap().as_deref(), want, "{line}");
        }
    }

    #[test]
    fn an_answer_that_cannot_be_filtered_is_an_error() {
        for (line, want) in [
            (
                r#"{"id":1,"result":{"tools":{"name":"x"}}}"#,
                FilterError::NotAList,
            ),
            (r#"{"id":1,"result":[]}"#, FilterError::NotAList),
            (r#"{"id":1,"result":{"tools":[]"#, FilterError::Malformed),
            (
                r#"{"id":1,"result":{"tools":[]},"result":{"tools":[{"name":"w"}]}}"#,
                FilterError::Repeated("result"),
            ),
            (
                r#"{"id":1,"result":{"tools":[],"tools":[{"name":"w"}]}}"#,
                FilterError::Repeated("tools"),
            ),
        ] {
            assert_eq!(filtered(line), Err(want), "{line}");
        }
    }

    #[test]
    fn the_access_summary_decides_as_may_use_does() {
        let policies = [
            vec![],
            vec![
                rule(&["group:ops"], &[], &["drop_*"]),
                rule(&["group:eng"], &["read_*", "drop_x"], &[]),
                rule(&["peer:dave"], &[], &["*"]),
            ],
            vec![rule(&["peer:bob"], &[], &["delete_*", "write_?"])],
            vec![
                rule(&["group:eng"], &["read_*"], &["read_secret"]),
                rule(&["user:bob"], &["*"], &["drop_*"]),
                rule(&["group:ops"], &["write", "drop_y"], &[]),
            ],
        ];
        let callers = [
            held(&["peer:bob", "group:eng", "group:ops"]),
            held(&["peer:bob", "group:ops"]),
            held(&["peer:bob", "user:bob"]),
            held(&["peer:dave", "group:eng"]),
            held(&["peer:carol"]),
            held(&[]),
        ];
        let tools = [
            "read_a",
            "read_secret",
            "drop_x",
            "drop_y",
            "write",
            "write_a",
            "delete_all",
            "",
        ];
        for rules in &policies {
            for who in &callers {
                let summary = access(rules, who);
                for tool in tools {
                    let by_summary = summary.allow.iter().any(|p| matches(p, tool))
                        && !summary.deny.iter().any(|p| matches(p, tool));
                    assert_eq!(
                        by_summary,
                        may_use(rules, who, tool),
                        "{rules:?} {who:?} {tool}"
                    );
                }
            }
        }
        assert!(access(&[], &held(&["peer:x"])).is_all());
        assert_eq!(
            access(&policies[1], &held(&["peer:carol"])),
            ToolAccess {
                allow: vec![],
                deny: vec![]
            }
        );
        assert_eq!(
            access(&policies[1], &held(&["peer:bob", "group:ops", "group:eng"])),
            ToolAccess {
                allow: vec!["read_*".into(), "drop_x".into()],
                deny: vec!["drop_*".into()]
            }
        );
    }

    #[test]
    fn a_policy_handle_shows_every_holder_the_new_rules() {
        let policy = ToolPolicy::default();
        let session = policy.clone();
        assert!(session.current().is_empty());
        policy.set(vec![rule(&["peer:bob"], &[], &["x"])]);
        assert_eq!(session.current().len(), 1);
    }
}
