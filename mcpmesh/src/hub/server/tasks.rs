//! MCP tasks through the hub, of both revisions: the 2025-11-25 revision's, and the
//! 2026-07-28 tasks extension's (SEP-2663, `io.modelcontextprotocol/tasks`). A task a service
//! made is presented under an id naming that service, `PEER/SERVICE/ID`, so `tasks/get`,
//! `tasks/result`, `tasks/cancel` (and the extension's `tasks/update`) go back to it by the id
//! alone, and its status notifications and the requests it makes while the client waits on
//! `tasks/result` carry that id too. `tasks/list` (2025) merges the lists of the services with
//! a session open now (a task lives in its server's session). A call asking for a task of a
//! service that offers none runs plainly: a task the client could not reach is never made.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use super::Hub;
use super::uris::present_uris;
use super::wire::lock;
use crate::hub::Target;
use crate::hub::pool::Lease;

/// Where a message names the task it belongs to.
const RELATED: &str = "io.modelcontextprotocol/related-task";
/// Tasks listed at most, across every service.
const MAX_LISTED: usize = 1000;

/// The 2026-07-28 tasks extension's name in `capabilities.extensions`.
pub(super) const EXTENSION: &str = "io.modelcontextprotocol/tasks";

/// Whether a server's capabilities declare the 2026-07-28 tasks extension.
pub(super) fn extension_declared(capabilities: &Value) -> bool {
    capabilities["extensions"].get(EXTENSION).is_some()
}

/// Whether the hub routes the task method `method` for a client of this era: 2025-11-25 has
/// `tasks/result` and `tasks/list`, the extension `tasks/update`; both `tasks/get` and
/// `tasks/cancel`.
pub(super) fn routed_in(method: &str, stateless: bool) -> bool {
    match method {
        "tasks/get" | "tasks/cancel" => true,
        "tasks/update" => stateless,
        _ => !stateless,
    }
}

/// Whether a server's capabilities offer task-augmented `tools/call`.
pub(super) fn offers_task_calls(capabilities: &Value) -> bool {
    capabilities["tasks"]["requests"]["tools"]["call"].is_object()
}

/// The id the client is shown for `target`'s task `id`.
fn present_id(id: &mut Value, target: &Target) {
    if let Some(own) = id.as_str() {
        *id = json!(format!("{}/{}/{own}", target.peer, target.service));
    }
}

/// The service a presented task id names, and its own id.
pub(super) fn unwrap_id(id: &str) -> Option<(&str, &str, &str)> {
    let (peer, rest) = id.split_once('/')?;
    let (service, own) = rest.split_once('/')?;
    (!peer.is_empty() && !service.is_empty() && !own.is_empty()).then_some((peer, service, own))
}

/// Presents every task id in `target`'s answer to `method`.
pub(super) fn present_answer(method: &str, frame: &mut Value, target: &Target) {
    let Some(result) = frame.get_mut("result") else {
        return;
    };
    match method {
        "tools/call" => {
            if let Some(id) = result.get_mut("task").and_then(|t| t.get_mut("taskId")) {
                present_id(id, target);
            }
            // The extension's answer is the task itself, flat.
            if result["resultType"] == "task"
                && let Some(id) = result.get_mut("taskId")
            {
                present_id(id, target);
            }
        }
        "tasks/get" | "tasks/cancel" => {
            if let Some(id) = result.get_mut("taskId") {
                present_id(id, target);
            }
            // The extension's finished task carries the call's own result: its URIs lead back
            // to the service like those of any call.
            if let Some(inner) = result.get_mut("result").filter(|r| r.is_object()) {
                let mut call = json!({ "result": inner.take() });
                present_uris("tools/call", &mut call, target);
                *inner = call["result"].take();
            }
        }
        "tasks/list" => {
            for task in result
                .get_mut("tasks")
                .and_then(Value::as_array_mut)
                .into_iter()
                .flatten()
            {
                if let Some(id) = task.get_mut("taskId") {
                    present_id(id, target);
                }
            }
        }
        _ => {}
    }
    present_related(result, target);
}

/// Presents the task a server's message (`params`, or a result) says it belongs to: a task's
/// status notification, a request made while the client waits on `tasks/result`.
pub(super) fn present_related(object: &mut Value, target: &Target) {
    if let Some(id) = object
        .get_mut("_meta")
        .and_then(|m| m.get_mut(RELATED))
        .and_then(|r| r.get_mut("taskId"))
    {
        present_id(id, target);
    }
}

/// Presents the task a status notification's params describe.
pub(super) fn present_status(params: &mut Value, target: &Target) {
    if let Some(id) = params.get_mut("taskId") {
        present_id(id, target);
    }
    present_related(params, target);
}

/// Sessions kept for unfinished tasks, at most; past it a task's session may close when idle.
const MAX_HELD: usize = 1000;
/// How long a task keeps its session when it does not say its lifetime, and at most.
const HELD_DEFAULT: Duration = Duration::from_secs(600);
const HELD_MAX: Duration = Duration::from_secs(3600);

/// The task a `tools/call` answer (`result`) made, as presented: its id and its lifetime.
fn made_task(result: &Value) -> Option<(String, Option<u64>)> {
    // 2025-11-25: `{task: {taskId, ttl}}`; the extension's: the task itself, flat.
    let task = match result.get("task") {
        Some(task) => task,
        None if result["resultType"] == "task" => result,
        None => return None,
    };
    let id = task["taskId"].as_str()?.to_owned();
    let ttl = task["ttl"].as_u64().or_else(|| task["ttlMs"].as_u64());
    Some((id, ttl))
}

/// Whether a task's status is one it does not leave.
fn ended(status: &Value) -> bool {
    matches!(status.as_str(), Some("completed" | "failed" | "cancelled"))
}

impl Hub {
    /// Keeps `lease` (on the session a call went to) while the task its answer made may be
    /// asked for: until an answer says it ended, or its lifetime passes.
    pub(super) fn hold_for_task(&self, method: &str, frame: &Value, lease: Lease) {
        if method != "tools/call" {
            return;
        }
        let Some((id, ttl)) = frame.get("result").and_then(made_task) else {
            return;
        };
        {
            let mut held = lock(&self.task_leases);
            if held.len() >= MAX_HELD {
                return;
            }
            held.insert(id.clone(), lease);
        }
        let ttl = ttl
            .map_or(HELD_DEFAULT, Duration::from_millis)
            .min(HELD_MAX);
        let held = Arc::downgrade(&self.task_leases);
        tokio::spawn(async move {
            tokio::time::sleep(ttl).await;
            if let Some(held) = held.upgrade() {
                lock(&held).remove(&id);
            }
        });
    }

    /// Lets a task's session go once an answer about the task (to `method`, its ids as
    /// presented) says it ended: its result, or a status it does not leave.
    pub(super) fn release_task(&self, method: &str, frame: &Value) {
        let result = &frame["result"];
        let (id, done) = match method {
            "tasks/result" => (&result["_meta"][RELATED]["taskId"], result.is_object()),
            "tasks/get" | "tasks/cancel" => (&result["taskId"], ended(&result["status"])),
            _ => return,
        };
        if done && let Some(id) = id.as_str() {
            lock(&self.task_leases).remove(id);
        }
    }

    /// Where a `tasks/get`, `tasks/result` or `tasks/cancel` goes: the service its task id
    /// names, with the service's own id.
    pub(super) fn task_destination(&self, mut params: Value) -> Result<(Target, Value), String> {
        let id = params["taskId"].as_str().unwrap_or_default().to_owned();
        let (peer, service, own) = unwrap_id(&id).ok_or_else(|| format!("unknown task: {id}"))?;
        let target = self
            .targets()
            .into_iter()
            .find(|t| t.peer == peer && t.service == service)
            .ok_or_else(|| format!("unknown task: {id}"))?;
        params["taskId"] = json!(own);
        Ok((target, params))
    }

    /// `tasks/list`: the tasks of every service with a session open now that lists its tasks,
    /// under their presented ids, in one page.
    pub(super) async fn list_tasks(&self, id: &Value) -> Vec<u8> {
        let mut tasks = Vec::new();
        for up in self.pool.all_live().await {
            if !up.capabilities()["tasks"]["list"].is_object() {
                continue;
            }
            let Ok(mut frame) = up.request("tasks/list", Value::Null).await else {
                continue;
            };
            present_answer("tasks/list", &mut frame, &up.target);
            let listed = frame["result"]["tasks"].as_array().cloned();
            for task in listed.into_iter().flatten() {
                if tasks.len() == MAX_LISTED {
                    break;
                }
                tasks.push(task);
            }
        }
        self.typed_answer(id, "tasks/list", json!({ "tasks": tasks }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_task_id_names_its_service_and_routes_back_by_itself() {
        let target = Target::parse("alice/everything").unwrap();
        let mut created = json!({"result": {"task": {"taskId": "t-1", "status": "working"}}});
        present_answer("tools/call", &mut created, &target);
        let shown = created["result"]["task"]["taskId"].as_str().unwrap();
        assert_eq!(shown, "alice/everything/t-1");
        assert_eq!(unwrap_id(shown), Some(("alice", "everything", "t-1")));
        // An id of the server's own that holds slashes stays whole after the service.
        assert_eq!(unwrap_id("a/b/x/y"), Some(("a", "b", "x/y")));
        for bad in ["", "a", "a/b", "a/b/", "/b/x", "a//x"] {
            assert_eq!(unwrap_id(bad), None, "{bad}");
        }

        let mut got = json!({"result": {"taskId": "t-1", "status": "completed"}});
        present_answer("tasks/get", &mut got, &target);
        assert_eq!(got["result"]["taskId"], "alice/everything/t-1");

        // The 2026-07-28 extension's shapes: a flat task for the call, the call's own result
        // inside the finished task.
        let mut created = json!({"result": {"resultType": "task", "taskId": "t-2"}});
        present_answer("tools/call", &mut created, &target);
        assert_eq!(created["result"]["taskId"], "alice/everything/t-2");
        let mut done = json!({"result": {"taskId": "t-2", "status": "completed", "result":
            {"content": [{"type": "resource_link", "uri": "file:///x", "name": "x"}]}}});
        present_answer("tasks/get", &mut done, &target);
        assert_eq!(done["result"]["taskId"], "alice/everything/t-2");
        assert_eq!(
            done["result"]["result"]["content"][0]["uri"],
            "mcpmesh-hub://alice/everything/file:///x"
        );
        let mut plain = json!({"result": {"resultType": "complete", "taskId": "not-a-task"}});
        present_answer("tools/call", &mut plain, &target);
        assert_eq!(plain["result"]["taskId"], "not-a-task");

        let mut payload = json!({"result": {"content": [], "_meta": {RELATED: {"taskId": "t-1"}}}});
        present_answer("tasks/result", &mut payload, &target);
        assert_eq!(
            payload["result"]["_meta"][RELATED]["taskId"],
            "alice/everything/t-1"
        );

        let mut listed = json!({"result": {"tasks": [{"taskId": "a"}, {"taskId": "b"}]}});
        present_answer("tasks/list", &mut listed, &target);
        assert_eq!(listed["result"]["tasks"][1]["taskId"], "alice/everything/b");

        let mut status = json!({"taskId": "t-1", "status": "working"});
        present_status(&mut status, &target);
        assert_eq!(status["taskId"], "alice/everything/t-1");
    }

    #[test]
    fn each_eras_task_methods_are_routed_for_its_clients_only() {
        for stateless in [false, true] {
            assert!(routed_in("tasks/get", stateless));
            assert!(routed_in("tasks/cancel", stateless));
            assert_eq!(routed_in("tasks/update", stateless), stateless);
            assert_eq!(routed_in("tasks/result", stateless), !stateless);
        }
        assert!(extension_declared(&json!({"extensions": {EXTENSION: {}}})));
        assert!(!extension_declared(&json!({"tasks": {}})));
    }

    #[test]
    fn task_calls_are_offered_only_as_the_server_says() {
        assert!(offers_task_calls(
            &json!({"tasks": {"requests": {"tools": {"call": {}}}}})
        ));
        assert!(!offers_task_calls(&json!({"tasks": {"list": {}}})));
        assert!(!offers_task_calls(&json!({})));
    }
}
