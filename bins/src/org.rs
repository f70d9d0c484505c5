//! The org roster verbs (`mcpmesh org …` and `mcpmesh join`): one function per verb, each
//! one `org.*` request to the node, its answer printed verbatim with `--json`.

use std::path::Path;

use anyhow::Context;
use mcpmesh::control::{codes, methods};
use serde_json::{Value, json};

use crate::args::OrgAction;
use crate::ctx::{Ctx, parse_duration};
use crate::output::Failure;
use crate::render::{joined, utc};

pub(crate) fn run(ctx: &Ctx, action: OrgAction) -> Result<(), Failure> {
    match action {
        OrgAction::Create { name, user } => create(ctx, &name, user.as_deref()),
        OrgAction::Invite {
            user,
            groups,
            device,
            ttl,
            readmit,
        } => invite(
            ctx,
            &user,
            groups.as_deref(),
            device.as_deref(),
            &ttl,
            readmit,
        ),
        OrgAction::Members => members(ctx),
        OrgAction::Remove { user, device } => remove(ctx, &user, device.as_deref()),
        OrgAction::Groups { user, groups } => set_groups(ctx, &user, &groups),
        OrgAction::Status => status(ctx),
        OrgAction::ExportRoot { file } => export_root(ctx, &file),
        OrgAction::ImportRoot { file, user } => import_root(ctx, &file, user.as_deref()),
    }
}

fn create(ctx: &Ctx, name: &str, user: Option<&str>) -> Result<(), Failure> {
    let mut params = json!({ "name": name });
    if let Some(user) = user {
        params["user"] = json!(user);
    }
    let v = ctx.call(methods::ORG_CREATE, params)?;
    ctx.out.print(v.clone(), || {
        format!(
            "created org {} (root {}); you are user {}, roster serial {}, valid until {}.\nBack up the root key now: mcpmesh org export-root FILE",
            text(&v["org"]),
            short_key(&v["root"]),
            text(&v["user"]),
            v["serial"],
            utc(&v["expires_at"])
        )
    });
    Ok(())
}

fn invite(
    ctx: &Ctx,
    user: &str,
    groups: Option<&str>,
    device: Option<&str>,
    ttl: &str,
    readmit: bool,
) -> Result<(), Failure> {
    let ttl = parse_duration(ttl)?;
    let mut params = json!({ "user": user, "ttl_secs": ttl.as_secs() });
    if readmit {
        params["readmit"] = json!(true);
    }
    if let Some(groups) = groups {
        params["groups"] = json!(group_list(groups));
    }
    if let Some(device) = device {
        params["device"] = json!(device);
    }
    let v = ctx.call(methods::ORG_INVITE, params)?;
    // The line alone on stdout, so that it can be piped; what to do with it on stderr.
    ctx.out.print(v.clone(), || text(&v["invite"]).to_owned());
    ctx.out.note(|| {
        format!(
            "Send this line to {} (groups: {}; valid until {}). On their machine they run:\n  mcpmesh join '<the line>'",
            text(&v["user"]),
            joined(&v["groups"], ", ", "none"),
            utc(&v["expires_at"])
        )
    });
    Ok(())
}

/// `mcpmesh join`: top-level, as `pair` is, because a new member has no org yet.
pub(crate) fn join(ctx: &Ctx, invite: &str, device: Option<&str>) -> Result<(), Failure> {
    let mut params = json!({ "invite": invite });
    if let Some(device) = device {
        params["device"] = json!(device);
    }
    let v = ctx.call(methods::ORG_JOIN, params)?;
    ctx.out.print(v.clone(), || {
        format!(
            "joined {} as {} (groups: {}) — compare this code with the admin: {}",
            text(&v["org"]),
            text(&v["user"]),
            joined(&v["groups"], ", ", "none"),
            text(&v["code"])
        )
    });
    Ok(())
}

fn members(ctx: &Ctx) -> Result<(), Failure> {
    let v = ctx.call(methods::ORG_MEMBERS, json!({}))?;
    ctx.out.print(v.clone(), || render_members(&v));
    Ok(())
}

fn render_members(v: &Value) -> String {
    let mut s = format!(
        "org {}, roster serial {}, valid until {}\n\n{:<20} {:<24} {}\n",
        text(&v["org"]),
        v["serial"],
        utc(&v["expires_at"]),
        "user",
        "groups",
        "devices"
    );
    for m in v["members"].as_array().into_iter().flatten() {
        let devices: Vec<&str> = m["devices"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|d| d["name"].as_str())
            .collect();
        s.push_str(&format!(
            "{:<20} {:<24} {}\n",
            text(&m["user"]),
            joined(&m["groups"], ",", "-"),
            if devices.is_empty() {
                "-".to_owned()
            } else {
                devices.join(",")
            }
        ));
    }
    let revoked = v["revoked"].as_array().map_or(0, Vec::len);
    if revoked > 0 {
        s.push_str(&format!("\n{revoked} revoked device key(s)"));
        let removed: Vec<String> = v["removed"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|r| format!("{}'s {}", text(&r["user"]), text(&r["device"])))
            .collect();
        if !removed.is_empty() {
            s.push_str(&format!(
                ", lately: {} (readmit one: mcpmesh org invite USER --device NAME --readmit)",
                removed.join(", ")
            ));
        }
        s.push('\n');
    }
    s.trim_end().to_owned()
}

fn remove(ctx: &Ctx, user: &str, device: Option<&str>) -> Result<(), Failure> {
    let mut params = json!({ "user": user });
    if let Some(device) = device {
        params["device"] = json!(device);
    }
    let v = ctx.call(methods::ORG_REMOVE, params)?;
    let revoked = v["revoked"].as_array().map_or(0, Vec::len);
    ctx.out.print(v.clone(), || {
        let what = match device {
            Some(device) => format!("{user}'s device {device}"),
            None => user.to_owned(),
        };
        format!(
            "removed {what} from the roster ({revoked} key(s) revoked, their connections closed); roster serial {}",
            v["serial"]
        )
    });
    Ok(())
}

fn set_groups(ctx: &Ctx, user: &str, groups: &str) -> Result<(), Failure> {
    let v = ctx.call(
        methods::ORG_GROUPS,
        json!({ "user": user, "groups": group_list(groups) }),
    )?;
    ctx.out.print(v.clone(), || {
        format!(
            "{user}'s groups: {}; roster serial {}",
            joined(&v["groups"], ", ", "none"),
            v["serial"]
        )
    });
    Ok(())
}

fn status(ctx: &Ctx) -> Result<(), Failure> {
    let v = ctx.call(methods::ORG_STATUS, json!({}))?;
    ctx.out.print(v.clone(), || render_org_status(&v));
    Ok(())
}

fn render_org_status(v: &Value) -> String {
    let validity = if v["expired"] == json!(true) {
        format!("EXPIRED since {}", utc(&v["expires_at"]))
    } else {
        format!("valid until {}", utc(&v["expires_at"]))
    };
    let mut s = format!(
        "org {} (root {}): roster serial {}, issued {}, {validity}{}\n\n{:<20} {:<16} {:<24} {:<12} {}\n",
        text(&v["org"]),
        short_key(&v["root"]),
        v["serial"],
        utc(&v["issued_at"]),
        if v["admin"] == json!(true) {
            "; this is the admin node"
        } else {
            ""
        },
        "user",
        "device",
        "mount",
        "reachable",
        "serial"
    );
    for m in v["members"].as_array().into_iter().flatten() {
        let reach = if m["self"] == json!(true) {
            "this node"
        } else if m["reachable"] == json!(true) {
            "yes"
        } else {
            "no"
        };
        s.push_str(&format!(
            "{:<20} {:<16} {:<24} {:<12} {}\n",
            text(&m["user"]),
            text(&m["device"]),
            text(&m["mount"]),
            reach,
            m["serial"]
                .as_u64()
                .map_or_else(|| "-".to_owned(), |n| n.to_string())
        ));
    }
    s.trim_end().to_owned()
}

fn export_root(ctx: &Ctx, file: &Path) -> Result<(), Failure> {
    let path = absolute(file)?;
    let v = ctx.call(methods::ORG_EXPORT_ROOT, json!({ "path": path }))?;
    ctx.out.print(v.clone(), || {
        format!(
            "wrote the root key of org {} (roster serial {}) to {}.\nKeep it offline: whoever holds it can change the roster. To make another node the admin: mcpmesh org import-root FILE",
            text(&v["org"]),
            v["serial"],
            text(&v["path"])
        )
    });
    Ok(())
}

fn import_root(ctx: &Ctx, file: &Path, user: Option<&str>) -> Result<(), Failure> {
    let path = absolute(file)?;
    let mut params = json!({ "path": path });
    if let Some(user) = user {
        params["user"] = json!(user);
    }
    let v = ctx.call(methods::ORG_IMPORT_ROOT, params)?;
    ctx.out.print(v.clone(), || {
        format!(
            "this node is now the admin of org {} (root {}) as user {}, roster serial {}",
            text(&v["org"]),
            short_key(&v["root"]),
            text(&v["user"]),
            v["serial"]
        )
    });
    Ok(())
}

/// The node resolves nothing against the CLI's working directory, so a path goes absolute
/// (and as text: JSON carries nothing else).
fn absolute(file: &Path) -> Result<String, Failure> {
    let path = std::path::absolute(file).with_context(|| format!("the path {}", file.display()))?;
    path.to_str().map(str::to_owned).ok_or_else(|| {
        Failure::new(
            codes::INVALID_PARAMS,
            format!("{} is not valid UTF-8; choose another name", file.display()),
        )
    })
}

/// `eng,ops` as a list; an empty string is no groups at all.
fn group_list(text: &str) -> Vec<String> {
    text.split(',')
        .map(str::trim)
        .filter(|g| !g.is_empty())
        .map(str::to_owned)
        .collect()
}

/// The first eight hex digits of a key: enough to tell roots apart by eye.
fn short_key(hex: &Value) -> String {
    format!("{}…", text(hex).get(..8).unwrap_or_default())
}

fn text(v: &Value) -> &str {
    v.as_str().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::{Cli, Command};
    use crate::render::org_line;
    use clap::Parser;

    fn org(args: &[&str]) -> OrgAction {
        let argv = [&["mcpmesh", "org"], args].concat();
        match Cli::try_parse_from(argv).map(|c| c.command) {
            Ok(Command::Org { action }) => action,
            other => panic!("{args:?} parsed as {other:?}"),
        }
    }

    #[test]
    fn groups_given_as_an_empty_string_clear_them() {
        let OrgAction::Groups { user, groups } = org(&["groups", "bob", ""]) else {
            panic!("not org groups");
        };
        assert_eq!(user, "bob");
        assert!(group_list(&groups).is_empty());
        assert_eq!(group_list(" eng, ops,,"), ["eng", "ops"]);
    }

    #[test]
    fn org_groups_needs_the_groups_argument() {
        let argv = ["mcpmesh", "org", "groups", "bob"];
        assert!(Cli::try_parse_from(argv).is_err());
    }

    #[test]
    fn org_invite_ttl_defaults_to_a_day_and_reads_like_invite_ttl() {
        let OrgAction::Invite {
            user,
            groups,
            device,
            ttl,
            readmit,
        } = org(&["invite", "bob", "--groups", "eng,ops", "--device", "laptop"])
        else {
            panic!("not org invite");
        };
        assert_eq!(
            (user.as_str(), groups.as_deref(), device.as_deref()),
            ("bob", Some("eng,ops"), Some("laptop"))
        );
        assert!(!readmit);
        let OrgAction::Invite { readmit, .. } =
            org(&["invite", "bob", "--device", "laptop", "--readmit"])
        else {
            panic!("not org invite");
        };
        assert!(readmit);
        // Readmitting names the device whose key comes back.
        let argv = ["mcpmesh", "org", "invite", "bob", "--readmit"];
        assert!(Cli::try_parse_from(argv).is_err());
        assert_eq!(
            parse_duration(&ttl).ok(),
            Some(std::time::Duration::from_secs(86_400))
        );
        let OrgAction::Invite { ttl, .. } = org(&["invite", "bob", "--ttl", "7d"]) else {
            panic!("not org invite");
        };
        assert_eq!(
            parse_duration(&ttl).ok().map(|d| d.as_secs()),
            Some(604_800)
        );
        let bad = parse_duration("a week").err().map(|f| f.code);
        assert_eq!(bad, Some(mcpmesh::control::codes::INVALID_PARAMS));
    }

    #[test]
    fn root_files_are_sent_as_absolute_paths() {
        let OrgAction::ImportRoot { file, user } =
            org(&["import-root", "acme-root.json", "--user", "alice"])
        else {
            panic!("not org import-root");
        };
        assert_eq!(user.as_deref(), Some("alice"));
        let sent = absolute(&file).ok();
        let cwd = std::env::current_dir().ok();
        let expected = cwd.map(|d| d.join("acme-root.json").display().to_string());
        assert_eq!(sent, expected);
        assert_eq!(
            absolute(Path::new("/media/usb/k.json")).ok().as_deref(),
            Some("/media/usb/k.json")
        );
        use std::os::unix::ffi::OsStrExt;
        let not_utf8 = Path::new(std::ffi::OsStr::from_bytes(b"/tmp/\xff.json"));
        let refused = absolute(not_utf8).err().map(|f| f.code);
        assert_eq!(refused, Some(codes::INVALID_PARAMS));
    }

    #[test]
    fn join_is_a_top_level_verb_with_an_optional_device() {
        let parsed = Cli::try_parse_from(["mcpmesh", "join", "mcpmesh-join:x", "--device", "pc"])
            .map(|c| c.command);
        let Ok(Command::Join { invite, device }) = parsed else {
            panic!("not join: {parsed:?}");
        };
        assert_eq!(
            (invite.as_str(), device.as_deref()),
            ("mcpmesh-join:x", Some("pc"))
        );
    }

    #[test]
    fn org_remove_takes_one_device_or_the_whole_user() {
        let OrgAction::Remove { device, .. } = org(&["remove", "bob"]) else {
            panic!("not org remove");
        };
        assert_eq!(device, None);
        let OrgAction::Remove { device, .. } = org(&["remove", "bob", "--device", "old"]) else {
            panic!("not org remove");
        };
        assert_eq!(device.as_deref(), Some("old"));
    }

    #[test]
    fn the_status_line_says_when_the_roster_expired() {
        let fine = json!({ "name": "acme", "serial": 3, "expires_at": 0, "expired": false, "admin": false, "user": "bob" });
        let line = org_line(&fine).unwrap_or_default();
        assert!(
            line.starts_with("org acme: roster serial 3, valid until 1970-01-01"),
            "{line}"
        );
        assert!(line.contains("you are user bob"), "{line}");
        let expired = json!({ "name": "acme", "serial": 3, "expires_at": 0, "expired": true, "admin": false });
        let line = org_line(&expired).unwrap_or_default();
        assert!(
            line.contains("EXPIRED since 1970-01-01 00:00:00 UTC"),
            "{line}"
        );
        let removed =
            json!({ "name": "acme", "removed": { "serial": 7, "hint": "ask the admin" } });
        let line = org_line(&removed).unwrap_or_default();
        assert!(
            line.starts_with("removed from org acme (serial 7): ")
                && line.ends_with("ask the admin"),
            "{line}"
        );
        assert_eq!(org_line(&Value::Null), None);
    }

    #[test]
    fn members_render_as_a_table() {
        let v = json!({
            "org": "acme", "serial": 2, "expires_at": 0,
            "members": [
                { "user": "alice", "groups": [], "devices": [{ "name": "desk", "eid": "ab", "mount": "alice" }] },
                { "user": "bob", "groups": ["eng", "ops"], "devices": [{ "name": "laptop" }, { "name": "pc" }] }
            ],
            "revoked": ["cd"],
            "removed": [{ "user": "carol", "device": "pc", "eid": "cd", "serial": 2 }]
        });
        let table = render_members(&v);
        assert!(
            table.contains(
                "lately: carol's pc (readmit one: mcpmesh org invite USER --device NAME --readmit)"
            ),
            "{table}"
        );
        assert!(table.contains("alice"), "{table}");
        assert!(
            table
                .lines()
                .any(|l| l.starts_with("bob") && l.contains("eng,ops") && l.ends_with("laptop,pc")),
            "{table}"
        );
        assert!(table.contains("1 revoked"), "{table}");
    }

    #[test]
    fn completions_know_the_org_verbs() {
        use clap::CommandFactory;
        let mut script = Vec::new();
        clap_complete::generate(
            clap_complete::Shell::Bash,
            &mut Cli::command(),
            "mcpmesh",
            &mut script,
        );
        let script = String::from_utf8_lossy(&script);
        for verb in ["join", "export-root", "import-root", "members"] {
            assert!(script.contains(verb), "{verb} missing");
        }
    }
}
