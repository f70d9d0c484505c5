//! The URIs a service names, presented under that service's place
//! (`mcpmesh-hub://PEER/SERVICE/…`) so that reading any of them leads back to it: in its
//! listings, its skills and its answers.

use serde_json::{Value, json};

use crate::hub::Target;
use crate::hub::names;

/// Puts `target`'s place in front of a URI (or URI template) it named, as the hub presents it.
pub(super) fn present_uri(uri: Option<&mut Value>, target: &Target) {
    if let Some(uri) = uri
        && let Some(own) = uri.as_str()
    {
        *uri = json!(names::wrap_uri(&target.peer, &target.service, own));
    }
}

/// Presents every URI `target` named in its answer to `method`: the contents a read returns,
/// and the resource links and embedded resources of a call's or a prompt's content, so that
/// reading any of them goes back to `target`.
pub(super) fn present_uris(method: &str, frame: &mut Value, target: &Target) {
    let Some(result) = frame.get_mut("result") else {
        return;
    };
    let content = |item: &mut Value| {
        let kind = item.get("type").and_then(Value::as_str).map(str::to_owned);
        match kind.as_deref() {
            Some("resource_link") => present_uri(item.get_mut("uri"), target),
            Some("resource") => {
                present_uri(
                    item.get_mut("resource").and_then(|r| r.get_mut("uri")),
                    target,
                );
            }
            _ => {}
        }
    };
    fn items(list: Option<&mut Value>) -> impl Iterator<Item = &mut Value> {
        list.and_then(Value::as_array_mut).into_iter().flatten()
    }
    match method {
        "resources/read" => {
            items(result.get_mut("contents")).for_each(|c| present_uri(c.get_mut("uri"), target))
        }
        "tools/call" | "tasks/result" => items(result.get_mut("content")).for_each(content),
        "prompts/get" => items(result.get_mut("messages"))
            .filter_map(|m| m.get_mut("content"))
            .for_each(content),
        _ => {}
    }
}
