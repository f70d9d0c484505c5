//! What the client is shown: the merged lists, rebuilt from the cache whenever a listing
//! changes and paged out from memory.

use serde_json::{Map, Value, json};

use super::Hub;
use super::uris::present_uri;
use super::wire::{lock, rpc_error};
use crate::hub::Target;
use crate::hub::names::{self, Collision, Origin, Routes};

/// Items per page of a merged list.
const PAGE: usize = 100;

/// A tool or prompt as the hub lists it.
#[derive(Debug, Clone)]
struct Item {
    origin: Origin,
    target: Target,
    value: Value,
}

impl Item {
    /// The item as the client sees it: under the hub's `name`, its description saying where
    /// it lives (and whether its peer is reachable now); every other member as the server
    /// listed it.
    fn presented(&self, name: &str, reachable: bool) -> Value {
        let mut shown = self.value.clone();
        shown["name"] = json!(name);
        shown["description"] = json!(names::describe(
            &self.origin,
            self.value["description"].as_str(),
            reachable,
        ));
        shown
    }
}

/// The merged lists, rebuilt whenever a listing changes.
#[derive(Debug, Default)]
pub(super) struct View {
    tools: Vec<(String, Item)>,
    pub(super) tool_routes: Routes,
    prompts: Vec<(String, Item)>,
    pub(super) prompt_routes: Routes,
    /// Resources and templates under the URIs the hub presents.
    resources: Vec<Value>,
    templates: Vec<Value>,
    /// Skill entries, their URIs likewise.
    skills: Vec<Value>,
    /// Why the last rebuild failed (two items sharing a name), while it does.
    error: Option<String>,
}

impl Hub {
    /// Rebuilds the merged lists from the cache. On a collision the view keeps serving the
    /// previous names and lists say why until it is resolved.
    pub(super) fn rebuild(&self) -> Result<(), Collision> {
        let cache = lock(&self.cache);
        let mut tools = Vec::new();
        let mut prompts = Vec::new();
        let mut resources = Vec::new();
        let mut templates = Vec::new();
        let mut skills = Vec::new();
        for target in &self.targets() {
            let Some(listing) = cache.get(target) else {
                continue;
            };
            let item = |v: &Value| {
                v["name"].as_str().map(|name| Item {
                    origin: Origin::new(&target.peer, &target.service, name),
                    target: target.clone(),
                    value: v.clone(),
                })
            };
            tools.extend(listing.tools.iter().filter_map(item));
            prompts.extend(listing.prompts.iter().filter_map(item));
            let presented = |items: &[Value], field: &str| -> Vec<Value> {
                items
                    .iter()
                    .map(|item| {
                        let mut shown = item.clone();
                        present_uri(shown.get_mut(field), target);
                        shown
                    })
                    .collect()
            };
            resources.extend(presented(&listing.resources, "uri"));
            templates.extend(presented(&listing.templates, "uriTemplate"));
            skills.extend(listing.skills.iter().map(|entry| {
                let mut shown = entry.clone();
                super::skills::present_entry(&mut shown, target);
                shown
            }));
        }
        let naming = self.config.naming;
        let named = |items: Vec<Item>| -> Result<(Routes, Vec<(String, Item)>), Collision> {
            let origins: Vec<Origin> = items.iter().map(|i| i.origin.clone()).collect();
            let (routes, names) = Routes::build(&origins, naming)?;
            Ok((routes, names.into_iter().zip(items).collect()))
        };
        drop(cache);
        let built = named(tools).and_then(|t| Ok((t, named(prompts)?)));
        let mut view = lock(&self.view);
        match built {
            Ok(((tool_routes, tools), (prompt_routes, prompts))) => {
                *view = View {
                    tools,
                    tool_routes,
                    prompts,
                    prompt_routes,
                    resources,
                    templates,
                    skills,
                    error: None,
                };
                Ok(())
            }
            Err(c) => {
                view.error = Some(c.to_string());
                Err(c)
            }
        }
    }

    /// One page of a merged list.
    pub(super) fn list(&self, id: &Value, method: &str, params: &Value) -> Vec<u8> {
        let view = lock(&self.view);
        if let Some(error) = &view.error {
            return rpc_error(id, -32603, error.clone());
        }
        let reach = lock(&self.presented).reach.clone();
        let reachable = |t: &Target| reach.get(&t.peer) != Some(&false);
        let (field, all): (&str, Vec<Value>) = match method {
            "tools/list" => (
                "tools",
                view.tools
                    .iter()
                    .map(|(name, item)| {
                        let mut tool = item.presented(name, reachable(&item.target));
                        tool["inputSchema"] =
                            names::normalize_schema(item.value.get("inputSchema"));
                        tool
                    })
                    .collect(),
            ),
            "prompts/list" => (
                "prompts",
                view.prompts
                    .iter()
                    .map(|(name, item)| item.presented(name, reachable(&item.target)))
                    .collect(),
            ),
            "resources/list" => ("resources", view.resources.clone()),
            "skills/list" => ("skills", view.skills.clone()),
            _ => ("resourceTemplates", view.templates.clone()),
        };
        match page(field, all, params.get("cursor"), PAGE) {
            Ok(result) => self.typed_answer(id, method, result),
            Err(message) => rpc_error(id, -32602, message),
        }
    }
}

/// One page of a merged list: `size` items from the cursor on (the cursor is the offset the
/// previous page gave), with `nextCursor` while more follow.
fn page(
    field: &str,
    all: Vec<Value>,
    cursor: Option<&Value>,
    size: usize,
) -> Result<Value, String> {
    let start = match cursor {
        None | Some(Value::Null) => 0,
        Some(Value::String(c)) => match c.parse::<usize>() {
            Ok(n) if n <= all.len() => n,
            _ => return Err(format!("invalid cursor: {c}")),
        },
        Some(other) => return Err(format!("invalid cursor: {other}")),
    };
    let end = start.saturating_add(size).min(all.len());
    let mut result = Map::new();
    let more = end < all.len();
    result.insert(
        field.to_owned(),
        Value::Array(all.into_iter().skip(start).take(end - start).collect()),
    );
    if more {
        result.insert("nextCursor".into(), json!(end.to_string()));
    }
    Ok(Value::Object(result))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merged_lists_are_paged_by_offset_to_their_end_and_bad_cursors_are_refused() {
        let all: Vec<Value> = (0..250)
            .map(|i| json!({ "name": format!("t{i}") }))
            .collect();
        let mut cursor: Option<Value> = None;
        let mut seen = Vec::new();
        let mut pages = 0;
        loop {
            let result = page("tools", all.clone(), cursor.as_ref(), 100).unwrap();
            pages += 1;
            seen.extend(result["tools"].as_array().unwrap().iter().cloned());
            match result.get("nextCursor") {
                Some(next) => cursor = Some(next.clone()),
                None => break,
            }
        }
        assert_eq!((pages, seen), (3, all.clone()));
        // An exact multiple ends without a cursor to an empty page.
        let exact = page("tools", all[..100].to_vec(), None, 100).unwrap();
        assert!(exact.get("nextCursor").is_none(), "{exact}");
        for bad in [json!("x"), json!("251"), json!(7), json!("-1")] {
            assert!(
                page("tools", all.clone(), Some(&bad), 100).is_err(),
                "{bad}"
            );
        }
        let empty = page("prompts", Vec::new(), None, 100).unwrap();
        assert_eq!(empty, json!({ "prompts": [] }));
    }
}
