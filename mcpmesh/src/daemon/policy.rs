//! What changed in the services' policy between two configurations, as audit records: each
//! service's `allow`, tool rules and env, before and after. Env is recorded by its keys
//! only: values often hold tokens.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::audit::AuditEvent;
use crate::config::ServiceSpec;

/// The records of what differs from `old` to `new` (a service added or removed counts as
/// one with nothing allowed, no rules and no env); `by` says who changed it.
pub(super) fn changes(old: &[ServiceSpec], new: &[ServiceSpec], by: &str) -> Vec<AuditEvent> {
    let mut names: Vec<&str> = old.iter().chain(new).map(|s| s.name.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    let find =
        |specs: &'_ [ServiceSpec], name: &str| specs.iter().find(|s| s.name == name).cloned();
    let mut out = Vec::new();
    for name in names {
        let (was, is) = (find(old, name), find(new, name));
        let mut record = |what: &str, before: Value, after: Value, changed: Vec<String>| {
            if before != after || !changed.is_empty() {
                out.push(AuditEvent::PolicyChanged {
                    service: name.to_owned(),
                    what: what.to_owned(),
                    before,
                    after,
                    changed,
                    by: by.to_owned(),
                });
            }
        };
        let allow = |s: &Option<ServiceSpec>| {
            json!(s.as_ref().map(|s| s.allow.clone()).unwrap_or_default())
        };
        record("allow", allow(&was), allow(&is), Vec::new());
        let tools = |s: &Option<ServiceSpec>| {
            json!(s.as_ref().map(|s| s.tools.clone()).unwrap_or_default())
        };
        record("tools", tools(&was), tools(&is), Vec::new());
        let env = |s: &Option<ServiceSpec>| s.as_ref().map(|s| s.env.clone()).unwrap_or_default();
        let (before, after): (BTreeMap<_, _>, BTreeMap<_, _>) = (env(&was), env(&is));
        let changed = before
            .iter()
            .filter(|(k, v)| after.get(*k).is_some_and(|now| now != *v))
            .map(|(k, _)| k.clone())
            .collect();
        let keys = |m: &BTreeMap<String, String>| json!(m.keys().collect::<Vec<_>>());
        record("env", keys(&before), keys(&after), changed);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn services(text: &str) -> Vec<ServiceSpec> {
        Config::parse(text, "config.toml").unwrap().services
    }

    #[test]
    fn each_change_is_one_record_with_before_and_after_and_no_env_value() {
        let old = services(
            "[services.files]\nrun = \"srv\"\nallow = [\"bob\"]\nenv = { TOKEN = \"s3cret\", MODE = \"a\" }\n",
        );
        let new = services(
            "[services.files]\nrun = \"srv\"\nallow = [\"bob\", \"group:eng\"]\nenv = { TOKEN = \"n3w-s3cret\", LEVEL = \"2\" }\n\n\
             [[services.files.tools]]\nwho = [\"group:eng\"]\nallow = [\"read_*\"]\n",
        );
        let records = changes(&old, &new, "reload");
        let text = serde_json::to_string(&records).unwrap();
        assert!(
            !text.contains("s3cret") && !text.contains("\"2\""),
            "{text}"
        );
        let by_what = |what: &str| {
            records
                .iter()
                .find_map(|r| match r {
                    AuditEvent::PolicyChanged {
                        what: w,
                        before,
                        after,
                        changed,
                        by,
                        service,
                    } if w == what => {
                        assert_eq!(by, "reload");
                        assert_eq!(service, "files");
                        Some((before.clone(), after.clone(), changed.clone()))
                    }
                    _ => None,
                })
                .unwrap_or_else(|| panic!("no {what} record in {text}"))
        };
        assert_eq!(
            by_what("allow"),
            (
                json!(["peer:bob"]),
                json!(["peer:bob", "group:eng"]),
                vec![]
            )
        );
        let (before, after, _) = by_what("tools");
        assert_eq!(before, json!([]));
        assert_eq!(after[0]["who"], json!(["group:eng"]));
        assert_eq!(
            by_what("env"),
            (
                json!(["MODE", "TOKEN"]),
                json!(["LEVEL", "TOKEN"]),
                vec!["TOKEN".to_owned()]
            )
        );
        assert_eq!(records.len(), 3);
        assert!(
            changes(&new, &new, "command").is_empty(),
            "no change, no record"
        );
        // A service that goes takes its grants with it: recorded too.
        let gone = changes(&new, &[], "command");
        assert_eq!(gone.len(), 3, "{gone:?}");
    }
}
