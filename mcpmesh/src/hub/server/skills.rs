//! The Skills extension (SEP-2640, `io.modelcontextprotocol/skills`) through the hub: each
//! service's `skills/list` entries merged into one list, `skills/get` and
//! `resources/directory/read` routed by URI, and every URI a skill names presented under its
//! service's place, the one rule every resource URI follows, so reading a skill's files goes
//! back to the service that listed it. An entry's `frontmatter` is passed on verbatim (the
//! extension has a host compare it with the `SKILL.md` it reads); where it came from is said
//! in the entry's `_meta` under the hub's own key.

use serde_json::{Map, Value, json};

use super::uris::present_uri;
use crate::hub::Target;

/// The extension's name in `capabilities.extensions`.
pub(super) const EXTENSION: &str = "io.modelcontextprotocol/skills";
/// Where a presented entry says which service it came from (`PEER/SERVICE`).
const ORIGIN: &str = "mcpmesh/origin";

/// Whether `capabilities` (a server's) declare the Skills extension.
pub(super) fn declared(capabilities: &Value) -> bool {
    capabilities["extensions"].get(EXTENSION).is_some()
}

/// Whether `capabilities` also declare `resources/directory/read`.
pub(super) fn reads_directories(capabilities: &Value) -> bool {
    capabilities["extensions"][EXTENSION]["directoryRead"] == json!(true)
}

/// A skill entry of `target` as the client is shown it: its `uri` and the `uri` of each of
/// its files presented, its origin in `_meta`; anything else as the server gave it.
pub(super) fn present_entry(entry: &mut Value, target: &Target) {
    let Some(object) = entry.as_object_mut() else {
        return;
    };
    present_uri(object.get_mut("uri"), target);
    // `resources` is a list of files, or the string "dynamic", kept as it is.
    if let Some(files) = object.get_mut("resources").and_then(Value::as_array_mut) {
        for file in files {
            present_uri(file.get_mut("uri"), target);
        }
    }
    let meta = object
        .entry("_meta")
        .or_insert_with(|| Value::Object(Map::new()));
    if !meta.is_object() {
        *meta = Value::Object(Map::new());
    }
    if let Some(meta) = meta.as_object_mut() {
        meta.insert(ORIGIN.into(), json!(target.to_string()));
    }
}

/// Presents what `target` named in its answer to a Skills method: the entry `skills/get`
/// returns, the children a directory read lists.
pub(super) fn present_answer(method: &str, frame: &mut Value, target: &Target) {
    let Some(result) = frame.get_mut("result") else {
        return;
    };
    match method {
        "skills/get" => {
            if let Some(entry) = result.get_mut("skill") {
                present_entry(entry, target);
            }
        }
        "resources/directory/read" => {
            for child in result
                .get_mut("resources")
                .and_then(Value::as_array_mut)
                .into_iter()
                .flatten()
            {
                present_uri(child.get_mut("uri"), target);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target() -> Target {
        Target {
            peer: "alice".into(),
            service: "notes".into(),
        }
    }

    #[test]
    fn an_entry_is_presented_under_its_service_with_its_frontmatter_untouched() {
        let mut entry = json!({
            "uri": "skill://git-workflow/SKILL.md",
            "frontmatter": {"name": "git-workflow", "description": "d", "x": {"uri": "keep"}},
            "resources": [
                {"uri": "skill://git-workflow/SKILL.md", "digest": "sha256:ab", "size": 3},
                {"uri": "skill://git-workflow/references/A.md", "digest": "sha256:cd", "size": 4},
            ],
        });
        present_entry(&mut entry, &target());
        let shown = |own: &str| format!("mcpmesh-hub://alice/notes/{own}");
        assert_eq!(entry["uri"], shown("skill://git-workflow/SKILL.md"));
        assert_eq!(
            entry["resources"][1]["uri"],
            shown("skill://git-workflow/references/A.md")
        );
        assert_eq!(entry["resources"][1]["digest"], "sha256:cd");
        assert_eq!(entry["frontmatter"]["x"]["uri"], "keep");
        assert_eq!(entry["_meta"][ORIGIN], "alice/notes");

        let mut dynamic = json!({"uri": "skill://d/SKILL.md", "resources": "dynamic"});
        present_entry(&mut dynamic, &target());
        assert_eq!(dynamic["resources"], "dynamic");

        let mut listed = json!({"result": {"resources": [{"uri": "skill://d/t", "name": "t"}]}});
        present_answer("resources/directory/read", &mut listed, &target());
        assert_eq!(
            listed["result"]["resources"][0]["uri"],
            shown("skill://d/t")
        );
    }

    #[test]
    fn the_extension_is_read_from_a_servers_capabilities() {
        let caps = json!({"extensions": {EXTENSION: {"directoryRead": true}}});
        assert!(declared(&caps) && reads_directories(&caps));
        let caps = json!({"extensions": {EXTENSION: {}}});
        assert!(declared(&caps) && !reads_directories(&caps));
        assert!(!declared(&json!({"resources": {}})));
    }
}
