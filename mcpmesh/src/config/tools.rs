//! Editing a service's `[[services.NAME.tools]]` rules for one principal: what `grant --tools`
//! and `revoke --tools` write.
//!
//! A principal's *own* rule is one whose `who` names that principal alone (in any spelling).
//! `grant --tools` adds the given tools to its `allow` list (and takes them off its own
//! `deny`) and makes it the first rule, so that it is the rule that decides for that caller
//! (denies of other rules still apply, as always); `revoke --tools` adds to its `deny` list,
//! creating it at the end if there is none.

use toml_edit::{ArrayOfTables, DocumentMut, Item, Table};

use crate::principal::Principal;

/// Makes `who`'s own rule of `service` the first one, with `allow` added to its `allow` list
/// and taken off its `deny` list (other patterns there stay).
pub fn grant_own_tools(
    doc: &mut DocumentMut,
    service: &str,
    who: &Principal,
    allow: &[String],
) -> Result<(), String> {
    let rules = rules(doc, service)?;
    let mut all: Vec<Table> = rules.iter().cloned().collect();
    let mut own = match all.iter().position(|t| is_own(t, who)) {
        Some(at) => all.remove(at),
        None => new_rule(who),
    };
    let mut allowed = patterns(&own, "allow");
    for a in allow {
        if !allowed.contains(a) {
            allowed.push(a.clone());
        }
    }
    own.insert("allow", toml_edit::value(list(&allowed)));
    let denied = patterns(&own, "deny");
    if !denied.is_empty() {
        let kept: Vec<String> = denied.into_iter().filter(|d| !allow.contains(d)).collect();
        if kept.is_empty() {
            own.remove("deny");
        } else {
            own.insert("deny", toml_edit::value(list(&kept)));
        }
    }
    all.insert(0, own);
    rules.clear();
    for mut table in all {
        // Written in the order of the list, not where each stood before.
        table.set_position(None);
        rules.push(table);
    }
    Ok(())
}

/// Adds `deny` to `who`'s own rule of `service`, creating it (last) if there is none.
pub fn deny_own_tools(
    doc: &mut DocumentMut,
    service: &str,
    who: &Principal,
    deny: &[String],
) -> Result<(), String> {
    let rules = rules(doc, service)?;
    let found = rules.iter().position(|t| is_own(t, who));
    let at = match found {
        Some(at) => at,
        None => {
            rules.push(new_rule(who));
            rules.len() - 1
        }
    };
    let own = rules
        .get_mut(at)
        .ok_or_else(|| format!("services.{service}.tools: the rule went missing"))?;
    let mut denied = patterns(own, "deny");
    for d in deny {
        if !denied.contains(d) {
            denied.push(d.clone());
        }
    }
    own.insert("deny", toml_edit::value(list(&denied)));
    Ok(())
}

/// The patterns of a rule's `allow` or `deny` list.
fn patterns(rule: &Table, key: &str) -> Vec<String> {
    rule.get(key)
        .and_then(Item::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// The service's rules as an array of tables (created empty if absent; an inline list of
/// inline tables is turned into one).
fn rules<'a>(doc: &'a mut DocumentMut, service: &str) -> Result<&'a mut ArrayOfTables, String> {
    let entry = doc
        .get_mut("services")
        .and_then(|s| s.get_mut(service))
        .and_then(Item::as_table_like_mut)
        .ok_or_else(|| format!("services.{service}: no such service"))?;
    let item = entry
        .entry("tools")
        .or_insert(Item::ArrayOfTables(ArrayOfTables::new()));
    if !item.is_array_of_tables() {
        let taken = std::mem::take(item);
        *item = Item::ArrayOfTables(taken.into_array_of_tables().map_err(|_| {
            format!("services.{service}.tools: expected [[services.{service}.tools]] rules")
        })?);
    }
    item.as_array_of_tables_mut()
        .ok_or_else(|| format!("services.{service}.tools: expected a list of rules"))
}

fn is_own(rule: &Table, who: &Principal) -> bool {
    let named: Vec<Option<Principal>> = rule
        .get("who")
        .and_then(Item::as_array)
        .map(|a| a.iter().map(|v| v.as_str()?.parse().ok()).collect())
        .unwrap_or_default();
    named.len() == 1 && named[0].as_ref() == Some(who)
}

fn new_rule(who: &Principal) -> Table {
    let mut rule = Table::new();
    rule.insert("who", toml_edit::value(list(&[who.to_string()])));
    rule
}

fn list(items: &[String]) -> toml_edit::Array {
    items.iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    const BASE: &str = "# mine\n[services.files]\nrun = \"srv\"\nallow = [\"group:eng\", \"bob\"]\n\n\
        [[services.files.tools]]\nwho = [\"group:eng\"] # the team\nallow = [\"read_*\"]\n";

    fn rules_of(doc: &DocumentMut) -> Vec<crate::tool_policy::ToolRule> {
        Config::parse(&doc.to_string(), "config.toml")
            .unwrap()
            .services[0]
            .tools
            .clone()
    }

    #[test]
    fn granting_tools_puts_the_own_rule_first_and_keeps_its_denies_and_the_rest() {
        let bob = Principal::peer("bob");
        let mut doc: DocumentMut = BASE.parse().unwrap();
        deny_own_tools(&mut doc, "files", &bob, &["drop".into()]).unwrap();
        deny_own_tools(&mut doc, "files", &bob, &["drop".into(), "rm".into()]).unwrap();
        let rules = rules_of(&doc);
        assert_eq!(rules.len(), 2);
        assert_eq!(rules[1].who, std::slice::from_ref(&bob));
        assert_eq!(rules[1].deny, ["drop", "rm"]);

        grant_own_tools(&mut doc, "files", &bob, &["list_*".into(), "rm".into()]).unwrap();
        let rules = rules_of(&doc);
        assert_eq!(rules.len(), 2, "{doc}");
        assert_eq!(rules[0].who, std::slice::from_ref(&bob));
        assert_eq!(rules[0].allow, ["list_*", "rm"]);
        // Granting a tool takes it off the rule's own denies; the others stay.
        assert_eq!(rules[0].deny, ["drop"]);
        grant_own_tools(&mut doc, "files", &bob, &["read_*".into(), "rm".into()]).unwrap();
        assert_eq!(
            rules_of(&doc)[0].allow,
            ["list_*", "rm", "read_*"],
            "added to"
        );
        assert_eq!(rules[1].allow, ["read_*"]);
        let text = doc.to_string();
        assert!(
            text.starts_with("# mine\n") && text.contains("# the team"),
            "{text}"
        );

        // Another spelling of the same principal is the same rule.
        grant_own_tools(
            &mut doc,
            "files",
            &"peer:bob".parse().unwrap(),
            &["x".into()],
        )
        .unwrap();
        assert_eq!(rules_of(&doc).len(), 2);
    }

    #[test]
    fn a_service_without_rules_gets_its_first_and_an_unknown_service_is_an_error() {
        let eid: Principal = format!("eid:{}", "ab".repeat(32)).parse().unwrap();
        let mut doc: DocumentMut = "[services.s]\nrun = \"x\"\n".parse().unwrap();
        grant_own_tools(&mut doc, "s", &eid, &["a".into(), "b*".into()]).unwrap();
        let rules = rules_of(&doc);
        assert_eq!(rules.len(), 1);
        assert_eq!(rules[0].who, std::slice::from_ref(&eid));
        assert_eq!(rules[0].allow, ["a", "b*"]);
        assert!(grant_own_tools(&mut doc, "nope", &eid, &[]).is_err());
    }
}
