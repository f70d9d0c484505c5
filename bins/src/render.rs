//! Human renderings of the node's answers (the `--json` forms are the answers themselves).

use std::io::Write;

use serde_json::{Value, json};

pub fn print_record(v: &Value, json: bool) {
    let mut stdout = std::io::stdout().lock();
    let _ = if json {
        writeln!(stdout, "{v}")
    } else {
        writeln!(stdout, "{}", render_record(v))
    };
    let _ = stdout.flush();
}

pub fn render_record(v: &Value) -> String {
    let s = |k: &str| v[k].as_str().unwrap_or("").to_owned();
    let detail = match v["event"].as_str() {
        Some("request") => format!(
            "{} {} → {}{} in {:.1} ms, {} B in / {} B out",
            s("method"),
            s("name"),
            s("outcome"),
            v["code"]
                .as_i64()
                .map(|c| format!(" {c}"))
                .unwrap_or_default(),
            v["latency_us"].as_u64().unwrap_or(0) as f64 / 1000.0,
            v["bytes_in"],
            v["bytes_out"]
        ),
        Some("session_close") => format!(
            "session closed ({}) after {} ms",
            s("ended"),
            v["duration_ms"]
        ),
        Some("trust") => format!("trust: {}", s("action")),
        Some("policy_changed") => format!(
            "{} changed ({}): {} → {}",
            s("what"),
            s("by"),
            v["before"],
            v["after"]
        ),
        Some("connections_refused") => match v["user"].as_str() {
            Some(user) => format!(
                "{} connections refused from {} (a removed device of user {user})",
                v["count"],
                s("principal")
            ),
            None => format!("{} connections refused from {}", v["count"], s("principal")),
        },
        Some("session_refused") => match v["reason"].as_str() {
            Some(reason) => format!("session refused ({}): {reason}", v["code"]),
            None => format!("session refused ({})", v["code"]),
        },
        Some("outgoing_open") => "you opened a session to it".to_owned(),
        Some("outgoing_close") => match v["code"].as_i64() {
            Some(code) => format!(
                "your session to it failed after {} ms: {} ({code})",
                v["duration_ms"],
                s("reason")
            ),
            None => format!("your session to it closed after {} ms", v["duration_ms"]),
        },
        Some(other) => other.replace('_', " "),
        None => String::new(),
    };
    format!(
        "{} {:<12} {:<12} {detail}",
        mcpmesh::time::format_time(v["at_ms"].as_u64().unwrap_or(0)),
        s("peer"),
        s("service"),
    )
}

pub fn render_summary(summary: &mcpmesh::audit::Summary) -> String {
    if summary.records == 0 {
        return "no audit records in that period".into();
    }
    let mut s = String::new();
    for (title, rows) in [("peer", &summary.peers), ("service", &summary.services)] {
        s.push_str(&format!(
            "{title:<16} {:>8} {:>9} {:>7} {:>8} {:>9} {:>9} {:>10} {:>10}\n",
            "sessions",
            "requests",
            "errors",
            "refused",
            "p50 ms",
            "p99 ms",
            "bytes in",
            "bytes out"
        ));
        for (name, t) in rows {
            s.push_str(&format!(
                "{name:<16} {:>8} {:>9} {:>7} {:>8} {:>9.1} {:>9.1} {:>10} {:>10}\n",
                t.sessions,
                t.requests,
                t.errors,
                t.refused,
                t.p50_ms,
                t.p99_ms,
                t.bytes_in,
                t.bytes_out
            ));
        }
        s.push('\n');
    }
    s.trim_end().to_owned()
}

pub fn render_peers(v: &Value) -> String {
    let peers = v["peers"].as_array().cloned().unwrap_or_default();
    if peers.is_empty() {
        return "no peers yet. Next: mcpmesh invite SERVICE (to share), or mcpmesh pair LINE (to redeem an invite)".into();
    }
    let list = |p: &Value, k: &str| joined(&p[k], ",", "-");
    // Roster members also show their user and groups, in a last column so that the others
    // line up as they always have.
    let with_users = peers.iter().any(|p| p["user"].is_string());
    let header = format!(
        "{:<16} {:<14} {:<14} {:<7} {:<20} {:<20}{}",
        "peer",
        "id",
        "reachable",
        "path",
        "they may use",
        "you may use",
        if with_users { " user" } else { "" }
    );
    let mut s = format!("{}\n", header.trim_end());
    for p in &peers {
        let reach = match p["rtt_ms"].as_f64() {
            Some(ms) => format!("yes {ms:.1} ms"),
            None => "no".to_owned(),
        };
        let row = format!(
            "{:<16} {:<14} {:<14} {:<7} {:<20} {:<20}{}",
            p["name"].as_str().unwrap_or_default(),
            format!(
                "{}…",
                p["id"]
                    .as_str()
                    .unwrap_or_default()
                    .get(..12)
                    .unwrap_or_default()
            ),
            reach,
            p["path"].as_str().unwrap_or("-"),
            list(p, "services"),
            list(p, "mounts"),
            user_cell(p),
        );
        s.push_str(row.trim_end());
        s.push('\n');
    }
    for p in &peers {
        if let Some(url) = p["relay_url"].as_str() {
            s.push_str(&format!(
                "{} is reached through the relay {url}\n",
                p["name"].as_str().unwrap_or_default()
            ));
        }
    }
    s.push_str(&restricted_tools(&peers, None));
    s.trim_end().to_owned()
}

/// The services this node may mount, one line each: the mount, the tools it may use there,
/// who admitted it, and what it is for.
pub fn services(services: &Value) -> String {
    let list = services.as_array().map(Vec::as_slice).unwrap_or_default();
    if list.is_empty() {
        return "no peer offers this node a service yet. Peers appear here once they serve one to you (mcpmesh serve NAME --allow YOU, or to a group of your org)".into();
    }
    let mut s = format!(
        "{:<28} {:<6} {:<16} {}\n",
        "mount", "tools", "admitted as", "description"
    );
    for e in list {
        let tools = e["tools"]
            .as_u64()
            .map_or_else(|| "?".to_owned(), |n| n.to_string());
        let mut description = e["description"].as_str().unwrap_or("-").to_owned();
        if e["reachable"] == false {
            description = format!("(unreachable; last known) {description}");
        }
        let row = format!(
            "{:<28} {:<6} {:<16} {}",
            e["mount"].as_str().unwrap_or_default(),
            tools,
            e["admitted_by"].as_str().unwrap_or_default(),
            description
        );
        s.push_str(row.trim_end());
        s.push('\n');
    }
    s.push_str("\nMount one with: mcpmesh use PEER/SERVICE (or all of them: mcpmesh use hub). \"?\" tools: not listed through that peer yet.");
    s
}

/// Which tools a `{"allow", "deny"}` summary lets a peer use, in words.
pub fn tool_access(access: &Value) -> String {
    let list = |k: &str| -> Vec<&str> { strings(&access[k]) };
    let (allow, deny) = (list("allow"), list("deny"));
    let allowed = match &allow[..] {
        [] => return "no tool".to_owned(),
        ["*"] => "every tool".to_owned(),
        some => some.join(", "),
    };
    if deny.is_empty() {
        allowed
    } else {
        format!("{allowed} except {}", deny.join(", "))
    }
}

/// One line per (peer, service) where the peer may use only some of the service's tools.
fn restricted_tools(peers: &[Value], service: Option<&str>) -> String {
    let mut s = String::new();
    for p in peers {
        let Some(tools) = p["tools"].as_object() else {
            continue;
        };
        for (name, access) in tools {
            let every = access["deny"].as_array().is_some_and(Vec::is_empty)
                && access["allow"] == serde_json::json!(["*"]);
            if every || service.is_some_and(|svc| svc != name) {
                continue;
            }
            s.push_str(&format!(
                "  {} may use on {name}: {}\n",
                p["name"].as_str().unwrap_or_default(),
                tool_access(access)
            ));
        }
    }
    s
}

pub fn render_status(v: &Value) -> String {
    let mut s = node_lines(v);
    s.push_str(&served_services(v));
    s.push_str(&telemetry_lines(v));
    if let Some(line) = org_line(&v["org"]) {
        s.push_str(&format!("{line}\n\n"));
    }
    s.push('\n');
    s.push_str(&render_peers(&json!({ "peers": v["peers"] })));
    s.push_str(&listed("live sessions", &v["sessions"], |x| {
        format!(
            "  {} → {} since {}\n",
            x["peer"].as_str().unwrap_or_default(),
            x["service"].as_str().unwrap_or_default(),
            mcpmesh::time::format_time(x["since"].as_u64().unwrap_or(0) * 1000)
        )
    }));
    s.push_str(&listed("your sessions to peers", &v["outgoing"], |x| {
        format!(
            "  {}/{} since {}\n",
            x["peer"].as_str().unwrap_or_default(),
            x["service"].as_str().unwrap_or_default(),
            mcpmesh::time::format_time(x["since"].as_u64().unwrap_or(0) * 1000)
        )
    }));
    s.push_str(&listed("recent pairings", &v["pairings"], |p| {
        format!(
            "  {:<16} code {:<24} {}\n",
            p["peer"].as_str().unwrap_or_default(),
            p["code"].as_str().unwrap_or_default(),
            mcpmesh::time::format_time(p["at"].as_u64().unwrap_or(0) * 1000)
        )
    }));
    s.trim_end().to_owned()
}

/// The status page's head: the node's id, nickname and addresses.
fn node_lines(v: &Value) -> String {
    format!(
        "node {}{}\naddresses: {}\n\n",
        v["id"].as_str().unwrap_or_default(),
        v["nickname"]
            .as_str()
            .map(|n| format!(" ({n})"))
            .unwrap_or_default(),
        strings(&v["addrs"]).join(" ")
    )
}

/// What the node serves, one block per service; a next step when it serves nothing.
fn served_services(v: &Value) -> String {
    let services = v["services"].as_array().cloned().unwrap_or_default();
    if services.is_empty() {
        return "serving nothing. Next: mcpmesh serve NAME -- COMMAND…\n".to_owned();
    }
    services.iter().map(|svc| served_service(v, svc)).collect()
}

/// One served service: to whom, its live sessions, the peers held to some of its tools, and
/// what went wrong with it lately.
fn served_service(v: &Value, svc: &Value) -> String {
    let peers = strings(&svc["peers"]);
    let mut s = format!(
        "serving {:<14} to {:<30} {} live session(s)\n",
        svc["name"].as_str().unwrap_or_default(),
        if peers.is_empty() {
            "no peer yet".to_owned()
        } else {
            peers.join(", ")
        },
        svc["sessions"]
    );
    let peers = v["peers"].as_array().cloned().unwrap_or_default();
    s.push_str(&restricted_tools(&peers, svc["name"].as_str()));
    if let Some(problem) = svc["oauth"]["problem"].as_str() {
        s.push_str(&format!("  ! {problem}\n"));
    }
    if let Some(reason) = svc["last_failure"]["reason"].as_str() {
        s.push_str(&format!(
            "  ! could not serve {} at {}: {reason}\n",
            svc["last_failure"]["peer"].as_str().unwrap_or_default(),
            mcpmesh::time::format_time(svc["last_failure"]["at_ms"].as_u64().unwrap_or(0))
        ));
        if let Some(log) = v["log"].as_str() {
            s.push_str(&format!(
                "    (the server's stderr is in the node log: {log})\n"
            ));
        }
    }
    s
}

/// Where the node's metrics and traces go, and whether that works.
fn telemetry_lines(v: &Value) -> String {
    let mut s = String::new();
    if let Some(url) = v["metrics"]["url"].as_str() {
        s.push_str(&format!("metrics at {url}\n"));
    } else if let Some(error) = v["metrics"]["error"].as_str() {
        s.push_str(&format!("! metrics off: {error}\n"));
    }
    if let Some(url) = v["traces"]["url"].as_str() {
        let t = &v["traces"];
        s.push_str(&format!(
            "traces to {url} ({} spans sent",
            t["sent"].as_u64().unwrap_or(0)
        ));
        match (t["failed"].as_u64().unwrap_or(0), t["last_error"].as_str()) {
            (0, _) | (_, None) => s.push_str(")\n"),
            (failed, Some(error)) => {
                s.push_str(&format!(", {failed} not sent)\n! last error: {error}\n"))
            }
        }
    }
    s
}

/// A titled list of `items`, one `row` each, after a blank line; nothing when there are none.
fn listed(title: &str, items: &Value, row: impl Fn(&Value) -> String) -> String {
    let items = items.as_array().map(Vec::as_slice).unwrap_or_default();
    if items.is_empty() {
        return String::new();
    }
    let mut s = format!("\n\n{title}:\n");
    s.extend(items.iter().map(row));
    s
}

/// A roster member's `user (groups)`, after a space; nothing for other peers.
fn user_cell(p: &Value) -> String {
    match p["user"].as_str() {
        Some(user) => format!(" {user} ({})", joined(&p["groups"], ",", "no groups")),
        None => String::new(),
    }
}

/// The strings of a JSON list joined with `sep`, or `empty` when there are none.
pub fn joined(v: &Value, sep: &str, empty: &str) -> String {
    let items = strings(v);
    if items.is_empty() {
        empty.to_owned()
    } else {
        items.join(sep)
    }
}

/// The one line `status` shows about the org this node is in, if it is in one.
pub(crate) fn org_line(org: &Value) -> Option<String> {
    let name = org["name"].as_str()?;
    if let Some(removed) = org.get("removed").filter(|r| r.is_object()) {
        return Some(format!(
            "removed from org {name} (serial {}): this device no longer trusts, serves or dials its members; {}",
            removed["serial"],
            removed["hint"].as_str().unwrap_or_default()
        ));
    }
    if let Some(damage) = org["damaged"].as_str() {
        return Some(format!(
            "org {name}: {damage}; fetching it again from the org's members"
        ));
    }
    let validity = if org["expired"] == json!(true) {
        format!("EXPIRED since {}", utc(&org["expires_at"]))
    } else {
        format!("valid until {}", utc(&org["expires_at"]))
    };
    let mut line = format!("org {name}: roster serial {}, {validity}", org["serial"]);
    if let Some(user) = org["user"].as_str() {
        line.push_str(&format!("; you are user {user}"));
    }
    if org["admin"] == json!(true) {
        line.push_str("; this is the admin node");
    }
    Some(line)
}

/// A Unix time in seconds as people read it.
pub(crate) fn utc(unix_secs: &Value) -> String {
    format!(
        "{} UTC",
        mcpmesh::time::format_time(unix_secs.as_u64().unwrap_or(0).saturating_mul(1000))
    )
}

/// The strings of a JSON array (none when it is not one); other items are skipped.
pub(crate) fn strings(v: &Value) -> Vec<&str> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roster_members_among_peers_show_user_and_groups() {
        let v = json!({ "peers": [
            { "name": "bob", "id": "ab", "services": [], "mounts": [], "user": "bob", "groups": ["eng", "ops"] },
            { "name": "carol", "id": "cd", "services": ["notes"], "mounts": [] }
        ]});
        let table = render_peers(&v);
        let lines: Vec<&str> = table.lines().collect();
        assert!(lines[0].ends_with(" user"), "{table}");
        assert!(lines[1].ends_with(" bob (eng,ops)"), "{table}");
        assert!(lines[2].ends_with("-"), "{table}");
        let plain = render_peers(&json!({ "peers": [{ "name": "carol", "id": "cd" }] }));
        assert!(plain.lines().all(|l| l == l.trim_end()), "{plain:?}");
    }

    #[test]
    fn peers_show_their_path_and_the_relay_a_relayed_one_goes_through() {
        let v = json!({ "peers": [
            { "name": "bob", "id": "ab", "rtt_ms": 1.2, "path": "relay", "relay_url": "http://10.77.0.1:3340/" },
            { "name": "carol", "id": "cd", "rtt_ms": 0.3, "path": "direct" },
            { "name": "dave", "id": "ef" }
        ]});
        let table = render_peers(&v);
        let lines: Vec<&str> = table.lines().collect();
        assert!(lines[0].contains(" path "), "{table}");
        let cell = |row: usize, n: usize| lines[row].split_whitespace().nth(n);
        assert_eq!(cell(1, 5), Some("relay"), "{table}");
        assert_eq!(cell(2, 5), Some("direct"), "{table}");
        assert_eq!(cell(3, 3), Some("-"), "{table}");
        assert_eq!(
            lines[4], "bob is reached through the relay http://10.77.0.1:3340/",
            "{table}"
        );
        assert_eq!(lines.len(), 5, "{table}");
    }

    #[test]
    fn status_names_the_org_when_there_is_one() {
        let org = json!({ "name": "acme", "serial": 3, "expires_at": 0, "expired": true });
        let shown = render_status(&json!({ "id": "ab", "org": org }));
        assert!(
            shown.contains("org acme: roster serial 3, EXPIRED since 1970-01-01"),
            "{shown}"
        );
        let none = render_status(&json!({ "id": "ab", "org": null }));
        assert!(!none.contains("org "), "{none}");
    }
}
