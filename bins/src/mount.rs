//! `mcpmesh use PEER/SERVICE`: a complete, copyable block per AI client that mounts a peer's
//! service — each JSON block valid on its own, in the shape that client's settings file wants.

use std::path::Path;

use mcpmesh::control::{codes, methods};
use mcpmesh::paths::Profile;
use serde_json::{Value, json};

use crate::ctx::call;
use crate::output::{Failure, Output};

/// Where the gateway listens unless told otherwise.
const GATEWAY: &str = "127.0.0.1:8484";

pub fn use_lines(profile: &Profile, exe: &Path, target: &str, out: &Output) -> Result<(), Failure> {
    if target == "hub" {
        return hub_lines(profile, exe, out);
    }
    let (peer, service) = target.split_once('/').ok_or_else(|| {
        Failure::new(
            codes::INVALID_PARAMS,
            format!("expected PEER/SERVICE or hub, got {target:?}"),
        )
    })?;
    if !mcpmesh_net::session::valid_service_name(service) {
        return Err(Failure::new(
            codes::INVALID_PARAMS,
            format!("{service:?} is not a service name (1-64 letters, digits, '.', '_' or '-')"),
        ));
    }
    let peers = call(profile, exe, methods::PEERS_LIST, json!({}))?;
    peers["peers"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["name"] == peer)
        .ok_or_else(|| {
            Failure::new(
                codes::NOT_FOUND,
                format!("no peer named {peer:?}; see `mcpmesh peers`"),
            )
        })?;
    // What the peer answered when asked what this node may use there.
    let catalog = call(profile, exe, methods::SERVICES_LIST, json!({}))?;
    let offered: Vec<&Value> = catalog["services"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["peer"] == peer)
        .collect();
    let granted = offered.iter().any(|e| e["service"] == service);
    let warning = (!granted).then(|| {
        let names: Vec<&str> = offered
            .iter()
            .filter_map(|e| e["service"].as_str())
            .collect();
        let unanswered = catalog["unanswered"]
            .as_array()
            .is_some_and(|u| u.iter().any(|p| p == peer));
        if unanswered {
            format!(
                "cannot tell whether {peer} serves {service:?} to this node: it did not answer when asked (it may be offline, or not trust this node); the client will be refused if not"
            )
        } else {
            format!(
                "{peer} does not offer {service:?} to this node (it offers: {}); the client will be refused unless it grants it",
                if names.is_empty() {
                    "nothing".to_owned()
                } else {
                    names.join(", ")
                }
            )
        }
    });

    let mount = Mount {
        target,
        name: format!("{peer}-{service}"),
        verb: &["connect", target],
        path: target,
    };
    let mut value = blocks(profile, exe, &mount, out, warning.as_deref());
    value["known_grant"] = json!(granted);
    if let Some(warning) = &warning {
        value["warning"] = json!(warning);
    }
    out.print(value.clone(), || {
        value["text"].as_str().unwrap_or_default().to_owned()
    });
    Ok(())
}

/// `mcpmesh use` with no argument: what can be mounted, and how.
pub fn mountable(ctx: &crate::ctx::Ctx) -> Result<(), Failure> {
    let v = ctx.call(methods::SERVICES_LIST, json!({}))?;
    ctx.out
        .print(v.clone(), || crate::render::services(&v["services"]));
    Ok(())
}

/// `mcpmesh use hub`: the same blocks for the hub over every mountable service.
fn hub_lines(profile: &Profile, exe: &Path, out: &Output) -> Result<(), Failure> {
    let catalog = call(profile, exe, methods::SERVICES_LIST, json!({}))?;
    let services: Vec<String> = catalog["services"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e["mount"].as_str().map(str::to_owned))
        .collect();
    let mount = Mount {
        target: "hub",
        name: "mcpmesh".to_owned(),
        verb: &["hub"],
        path: "hub",
    };
    let warning = services.is_empty().then(|| {
        "no peer offers this node a service yet; the hub shows them as they appear (see mcpmesh services)".to_owned()
    });
    let mut value = blocks(profile, exe, &mount, out, warning.as_deref());
    value["services"] = json!(services);
    if let Some(warning) = &warning {
        value["warning"] = json!(warning);
    }
    out.print(value.clone(), || {
        format!(
            "The hub presents {} as one MCP server.\n\n{}",
            if services.is_empty() {
                "nothing yet".to_owned()
            } else {
                services.join(", ")
            },
            value["text"].as_str().unwrap_or_default()
        )
    });
    Ok(())
}

/// What a client mounts: the verb it runs and the gateway path that serves the same.
struct Mount<'a> {
    target: &'a str,
    name: String,
    verb: &'a [&'a str],
    path: &'a str,
}

/// The blocks for every client, as the `--json` value; `text` holds the human form.
fn blocks(
    profile: &Profile,
    exe: &Path,
    mount: &Mount<'_>,
    out: &Output,
    warning: Option<&str>,
) -> Value {
    let target = mount.target;
    let mut args: Vec<String> = Vec::new();
    if let Some(home) = &profile.home {
        args.extend(["--home".to_owned(), home.display().to_string()]);
    }
    args.extend(mount.verb.iter().map(|w| (*w).to_owned()));
    let command = exe.display().to_string();
    let name = mount.name.clone();
    let shell_line = shell_words(std::iter::once(&command).chain(&args));
    let claude = format!("claude mcp add {} -- {shell_line}", shell_quote(&name));
    let entry = json!({ "command": command, "args": args });
    let mcp_servers = json!({ "mcpServers": { name.clone(): entry.clone() } });
    let vscode = json!({ "servers": { name.clone(): { "type": "stdio", "command": command, "args": args } } });

    let http_url = format!("http://{GATEWAY}/mcp/{}", mount.path);
    let mut gateway = vec![command.clone()];
    if let Some(home) = &profile.home {
        gateway.extend(["--home".to_owned(), home.display().to_string()]);
    }
    gateway.push("gateway".to_owned());
    let gateway_line = shell_words(&gateway);
    // The gateway's own token, minted now if it has none, so these lines stay right for it.
    let token = profile
        .create_dirs()
        .map_err(|e| e.to_string())
        .and_then(|()| {
            mcpmesh::gateway::token::load_or_mint(&profile.gateway_token_file())
                .map_err(|e| e.to_string())
        });
    let mut http = json!({ "type": "http", "url": http_url });
    if let Ok(token) = &token {
        http["headers"] = json!({ "Authorization": format!("Bearer {token}") });
    }
    let http_config = json!({ "servers": { name.clone(): http } });

    let mut value = json!({
        "target": target,
        "name": name,
        "command": command,
        "args": args,
        "claude_code": claude,
        "mcpServers": { name.clone(): entry },
        "http_url": http_url,
        "clients": {
            "claude_code": { "command_line": claude },
            "claude_desktop": { "config": mcp_servers },
            "cursor": { "config": mcp_servers },
            "vscode": { "config": vscode },
            "stdio": { "command_line": shell_line, "command": command, "args": args },
            "http": { "gateway": gateway_line, "url": http_url, "config": http_config },
        },
    });
    let http_note = match &token {
        Ok(token) => {
            value["http_token"] = json!(token);
            value["http_headers"] = json!({ "Authorization": format!("Bearer {token}") });
            format!("(the header is this node's gateway token: Authorization: Bearer {token})")
        }
        Err(e) => format!("(the gateway's token is not available: {e})"),
    };
    if let (Some(warning), false) = (warning, out.json) {
        // Before the blocks, so it is seen before they are copied.
        eprintln!("warning: {warning}");
    }
    let text = format!(
        "Claude Code — run:\n  {claude}\n\n\
             Claude Desktop (claude_desktop_config.json) and Cursor (~/.cursor/mcp.json):\n{}\n\n\
             VS Code (.vscode/mcp.json):\n{}\n\n\
             Any other stdio MCP client — the command to run:\n  {shell_line}\n\n\
             A client that speaks Streamable HTTP — keep `{gateway_line}` running (it listens on {GATEWAY}), then:\n{}\n{http_note}",
        indent(&mcp_servers),
        indent(&vscode),
        indent(&http_config),
    );
    if !out.json {
        value["text"] = json!(text);
    }
    value
}

/// `v` pretty-printed, indented two spaces, ready to paste.
fn indent(v: &Value) -> String {
    serde_json::to_string_pretty(v)
        .unwrap_or_default()
        .lines()
        .map(|l| format!("  {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn shell_words<'a>(words: impl IntoIterator<Item = &'a String>) -> String {
    words
        .into_iter()
        .map(|w| shell_quote(w))
        .collect::<Vec<_>>()
        .join(" ")
}

/// `word` as a POSIX shell reads it back: bare when safe, single-quoted otherwise.
fn shell_quote(word: &str) -> String {
    let safe = !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:=@%+,".contains(c));
    if safe {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_word_with_spaces_or_quotes_is_quoted_for_the_shell() {
        assert_eq!(shell_quote("/usr/bin/mcpmesh"), "/usr/bin/mcpmesh");
        assert_eq!(shell_quote("/home/a b/x"), "'/home/a b/x'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote(""), "''");
    }
}
