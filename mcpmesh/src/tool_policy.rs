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
//! This part is the decision alone; the node does not read rules from config yet.

use crate::principal::Principal;

/// One rule of a service's policy.
#[derive(Debug, Clone, PartialEq, Eq)]
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

/// Whether a caller holding `held` may use `tool` under `rules`.
pub fn may_use(rules: &[ToolRule], held: &[Principal], tool: &str) -> bool {
    if rules.is_empty() {
        return true;
    }
    let applying: Vec<&ToolRule> = rules.iter().filter(|r| r.applies_to(held)).collect();
    if applying.is_empty() {
        return false;
    }
    if applying
        .iter()
        .any(|r| r.deny.iter().any(|p| matches(p, tool)))
    {
        return false;
    }
    match applying.iter().find(|r| !r.allow.is_empty()) {
        Some(rule) => rule.allow.iter().any(|p| matches(p, tool)),
        None => true,
    }
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
}
