//! How the hub names what it merges: every tool and prompt of every mounted service gets one
//! name an AI client accepts (`[A-Za-z0-9_-]`, at most 64 characters), and a route back to
//! where it lives.
//!
//! The default is `peer__service__tool`. `service` and `bare` drop the leading parts only for
//! items whose shorter name no other item shares, nor any longer name of another item; the
//! others keep the longer form. Two items that still share a name are an error at start, never
//! one shadowing the other. A name cut to the limit ends in a short hash of the whole path, so
//! it stays distinct and the same from run to run.
//!
//! Resources keep their servers' URIs behind a prefix naming the service,
//! `mcpmesh-hub://peer/service/URI`, and templates likewise: a URI routes by that prefix alone,
//! so no service can answer for a URI another listed, whatever it lists or templates itself.

use std::collections::{BTreeMap, HashMap};

use serde_json::{Map, Value, json};

/// The longest name a client is given.
pub const MAX_NAME: usize = 64;
/// Hex digits of the hash that ends a cut name.
const HASH_DIGITS: usize = 6;
/// What joins the parts of a name.
const JOIN: &str = "__";

/// How much of an item's path its name carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Naming {
    /// `peer__service__tool`.
    Prefixed,
    /// `service__tool`, where no other item has that name.
    Service,
    /// `tool`, where no other item has that name.
    Bare,
}

impl std::str::FromStr for Naming {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "prefixed" => Ok(Naming::Prefixed),
            "service" => Ok(Naming::Service),
            "bare" => Ok(Naming::Bare),
            other => Err(format!(
                "{other:?}: names are `prefixed`, `service` or `bare`"
            )),
        }
    }
}

/// Where an item lives, and its name there.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Origin {
    pub peer: String,
    pub service: String,
    pub name: String,
}

impl Origin {
    pub fn new(peer: &str, service: &str, name: &str) -> Self {
        Origin {
            peer: peer.to_owned(),
            service: service.to_owned(),
            name: name.to_owned(),
        }
    }

    fn path(&self) -> String {
        format!("{}/{}/{}", self.peer, self.service, self.name)
    }
}

/// Two or more items the hub cannot tell apart by name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{} would all be named {name:?}; rename a service, or use --names prefixed", .origins.iter().map(Origin::path).collect::<Vec<_>>().join(", "))]
pub struct Collision {
    pub name: String,
    pub origins: Vec<Origin>,
}

/// What the full name of every item of `peer`'s `service` starts with.
pub fn full_prefix(peer: &str, service: &str) -> String {
    format!("{}{JOIN}{}{JOIN}", sanitize(peer), sanitize(service))
}

/// What the name of every item of a `service` starts with, as `--names service` shortens it.
pub fn service_prefix(service: &str) -> String {
    format!("{}{JOIN}", sanitize(service))
}

/// `text` with every character a client would refuse replaced by `_`; never empty.
pub fn sanitize(text: &str) -> String {
    let clean: String = text
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if clean.is_empty() {
        "_".to_owned()
    } else {
        clean
    }
}

/// The name of `origin` carrying `parts` of its path (1: the item, 2: service and item, 3:
/// all), sanitized and cut to [`MAX_NAME`].
fn name_with(origin: &Origin, parts: usize) -> String {
    let all = [&origin.peer, &origin.service, &origin.name];
    let kept: Vec<String> = all[3 - parts.clamp(1, 3)..]
        .iter()
        .map(|p| sanitize(p))
        .collect();
    let full = kept.join(JOIN);
    if full.len() <= MAX_NAME {
        return full;
    }
    let hash = blake3::hash(origin.path().as_bytes()).to_hex();
    let keep = MAX_NAME - HASH_DIGITS - 1;
    // Sanitized names are ASCII, so any byte index is a character boundary.
    format!("{}-{}", &full[..keep], &hash[..HASH_DIGITS])
}

fn parts_of(naming: Naming) -> usize {
    match naming {
        Naming::Bare => 1,
        Naming::Service => 2,
        Naming::Prefixed => 3,
    }
}

/// A name for each of `origins` under `naming`: the shortest the mode allows that no other
/// item shares, lengthened only for the items that would share one. The longer names of an
/// item are its own too: a shorter name that equals one of them (a tool called
/// `alice__svc__echo` on carol) leaves both items in full, so no item takes another's name.
pub fn assign(origins: &[Origin], naming: Naming) -> Result<Vec<String>, Collision> {
    let mut parts = vec![parts_of(naming); origins.len()];
    let mut longer: HashMap<String, Vec<usize>> = HashMap::new();
    for (i, o) in origins.iter().enumerate() {
        for form in [name_with(o, 2), name_with(o, 3)] {
            let owners = longer.entry(form).or_default();
            if owners.last() != Some(&i) {
                owners.push(i);
            }
        }
    }
    loop {
        let names: Vec<String> = origins
            .iter()
            .zip(&parts)
            .map(|(o, p)| name_with(o, *p))
            .collect();
        let mut lengthened = false;
        for (i, name) in names.iter().enumerate() {
            let owners = longer.get(name).into_iter().flatten();
            for &j in owners.filter(|&&j| j != i) {
                for k in [i, j] {
                    if parts[k] < 3 {
                        parts[k] = 3;
                        lengthened = true;
                    }
                }
            }
        }
        if lengthened {
            continue;
        }
        let mut holders: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
        for (i, n) in names.iter().enumerate() {
            holders.entry(n.as_str()).or_default().push(i);
        }
        for (name, who) in holders.iter().filter(|(_, who)| who.len() > 1) {
            if who.iter().all(|&i| parts[i] == 3) {
                let mut shared: Vec<Origin> = who.iter().map(|&i| origins[i].clone()).collect();
                shared.sort();
                return Err(Collision {
                    name: (*name).to_owned(),
                    origins: shared,
                });
            }
            for &i in who {
                if parts[i] < 3 {
                    parts[i] += 1;
                    lengthened = true;
                }
            }
        }
        if !lengthened {
            return Ok(names);
        }
    }
}

/// What every URI the hub presents starts with.
const URI_PREFIX: &str = "mcpmesh-hub://";

/// The URI (or URI template) a client is shown for `uri` of `peer/service`.
pub fn wrap_uri(peer: &str, service: &str, uri: &str) -> String {
    format!("{URI_PREFIX}{peer}/{service}/{uri}")
}

/// The peer, service and the service's own URI behind a URI the hub presented.
pub fn unwrap_uri(uri: &str) -> Option<(&str, &str, &str)> {
    let rest = uri.strip_prefix(URI_PREFIX)?;
    let (peer, rest) = rest.split_once('/')?;
    let (service, own) = rest.split_once('/')?;
    (!peer.is_empty() && !service.is_empty() && !own.is_empty()).then_some((peer, service, own))
}

/// Names back to where the items live.
#[derive(Debug, Clone, Default)]
pub struct Routes {
    by_name: HashMap<String, Origin>,
}

impl Routes {
    /// The routes of `origins` under `naming`, with the names in the same order.
    pub fn build(origins: &[Origin], naming: Naming) -> Result<(Self, Vec<String>), Collision> {
        let names = assign(origins, naming)?;
        let by_name = names.iter().cloned().zip(origins.iter().cloned()).collect();
        Ok((Routes { by_name }, names))
    }

    /// Where the item a client calls `name` lives.
    pub fn route(&self, name: &str) -> Option<&Origin> {
        self.by_name.get(name)
    }

    pub fn len(&self) -> usize {
        self.by_name.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }
}

/// A tool's input schema as clients expect one: an object schema. A missing schema, or one
/// that is not an object, becomes an empty object schema; an object without `type` or
/// `properties` gets them; any other type than `object` (which a tool's arguments cannot be)
/// is replaced.
pub fn normalize_schema(schema: Option<&Value>) -> Value {
    let empty = || json!({ "type": "object", "properties": {} });
    let Some(Value::Object(given)) = schema else {
        return empty();
    };
    match given.get("type") {
        None => {}
        Some(Value::String(t)) if t == "object" => {}
        Some(_) => return empty(),
    }
    let mut out: Map<String, Value> = given.clone();
    out.insert("type".into(), json!("object"));
    if !matches!(out.get("properties"), Some(Value::Object(_))) {
        out.insert("properties".into(), json!({}));
    }
    Value::Object(out)
}

/// A description that says where the item lives, and when its peer cannot be reached.
pub fn describe(origin: &Origin, description: Option<&str>, reachable: bool) -> String {
    let place = format!("[{}/{}]", origin.peer, origin.service);
    let text = description.map(str::trim).filter(|d| !d.is_empty());
    let mut out = match text {
        Some(d) => format!("{place} {d}"),
        None => format!("{place} {}", origin.name),
    };
    if !reachable {
        out.push_str(" (unavailable: its peer is not reachable now)");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn o(peer: &str, service: &str, name: &str) -> Origin {
        Origin::new(peer, service, name)
    }

    #[test]
    fn sanitizing_keeps_what_clients_accept_and_replaces_the_rest() {
        for (given, want) in [
            ("read_file", "read_file"),
            ("get-sum", "get-sum"),
            ("alice.laptop", "alice_laptop"),
            ("files/read", "files_read"),
            ("émoji 😀", "_moji__"),
            ("", "_"),
            ("a b\tc", "a_b_c"),
        ] {
            assert_eq!(sanitize(given), want, "{given:?}");
        }
    }

    #[test]
    fn names_follow_the_mode_and_lengthen_only_where_they_would_collide() {
        let items = [
            o("alice", "notes", "search"),
            o("bob", "notes", "search"),
            o("bob", "files", "read"),
            o("carol", "web", "fetch"),
        ];
        let cases: [(Naming, [&str; 4]); 3] = [
            (
                Naming::Prefixed,
                [
                    "alice__notes__search",
                    "bob__notes__search",
                    "bob__files__read",
                    "carol__web__fetch",
                ],
            ),
            // Two `notes__search`: those two keep their peer; the others drop it.
            (
                Naming::Service,
                [
                    "alice__notes__search",
                    "bob__notes__search",
                    "files__read",
                    "web__fetch",
                ],
            ),
            (
                Naming::Bare,
                [
                    "alice__notes__search",
                    "bob__notes__search",
                    "read",
                    "fetch",
                ],
            ),
        ];
        for (naming, want) in cases {
            assert_eq!(assign(&items, naming).unwrap(), want, "{naming:?}");
        }
    }

    #[test]
    fn a_lengthened_name_that_meets_a_short_one_lengthens_that_one_too() {
        // Bare: two `x`; `s__x`, their longer name, is also the bare name of a third item, so
        // all three end in full.
        let items = [o("p", "s", "x"), o("q", "s", "x"), o("r", "t", "s__x")];
        let names = assign(&items, Naming::Bare).unwrap();
        assert_eq!(names, ["p__s__x", "q__s__x", "r__t__s__x"]);
        // Service: `s__x` twice lengthens those two, and the third, `t__s__x`, stays.
        let names = assign(&items, Naming::Service).unwrap();
        assert_eq!(names, ["p__s__x", "q__s__x", "t__s__x"]);
    }

    #[test]
    fn a_short_name_that_is_another_items_longer_name_leaves_both_in_full() {
        let items = [
            o("alice", "svc", "echo"),
            o("carol", "evil", "alice__svc__echo"),
            o("carol", "alice", "svc__read"),
            o("alice", "svc", "read"),
            o("bob", "files", "list"),
        ];
        let want_bare = [
            "alice__svc__echo",
            "carol__evil__alice__svc__echo",
            "carol__alice__svc__read",
            "alice__svc__read",
            "list",
        ];
        assert_eq!(assign(&items, Naming::Bare).unwrap(), want_bare);
        let want_service = [
            "svc__echo",
            "evil__alice__svc__echo",
            "carol__alice__svc__read",
            "alice__svc__read",
            "files__list",
        ];
        assert_eq!(assign(&items, Naming::Service).unwrap(), want_service);
    }

    #[test]
    fn items_that_share_a_full_name_are_a_clear_error() {
        // Different peers whose names sanitize the same.
        let items = [o("a.b", "svc", "t"), o("a_b", "svc", "t")];
        for naming in [Naming::Prefixed, Naming::Service, Naming::Bare] {
            let err = assign(&items, naming).unwrap_err();
            assert_eq!(err.name, "a_b__svc__t");
            assert_eq!(err.origins.len(), 2);
            let text = err.to_string();
            assert!(
                text.contains("a.b/svc/t") && text.contains("a_b/svc/t"),
                "{text}"
            );
        }
    }

    #[test]
    fn long_names_are_cut_with_a_stable_hash_that_keeps_them_apart() {
        let long = "t".repeat(80);
        let a = o("alice", "notes", &format!("{long}1"));
        let b = o("alice", "notes", &format!("{long}2"));
        let names = assign(&[a.clone(), b.clone()], Naming::Prefixed).unwrap();
        assert!(names.iter().all(|n| n.len() == MAX_NAME), "{names:?}");
        assert_ne!(names[0], names[1]);
        assert_eq!(names[0][..50], names[1][..50]);
        // The same from run to run.
        assert_eq!(assign(&[a, b], Naming::Prefixed).unwrap(), names);
    }

    #[test]
    fn routes_lead_back_to_where_each_item_lives() {
        let items = [o("alice", "notes", "search"), o("bob", "files", "read")];
        let (routes, names) = Routes::build(&items, Naming::Bare).unwrap();
        assert_eq!(names, ["search", "read"]);
        assert_eq!(routes.route("read"), Some(&items[1]));
        assert_eq!(routes.route("search"), Some(&items[0]));
        assert_eq!(routes.route("alice__notes__search"), None);
        assert_eq!(routes.len(), 2);
    }

    #[test]
    fn a_presented_uri_leads_back_to_its_service_and_its_own_uri_unchanged() {
        for own in [
            "file:///etc/hosts",
            "note://alice/{id}",
            "{+anything}",
            "mcpmesh-hub://bob/x/y",
            "a b?c#d",
        ] {
            let shown = wrap_uri("alice", "notes", own);
            assert!(shown.starts_with("mcpmesh-hub://alice/notes/"), "{shown}");
            assert_eq!(unwrap_uri(&shown), Some(("alice", "notes", own)));
        }
        for foreign in [
            "file:///etc/hosts",
            "mcpmesh-hub://alice",
            "mcpmesh-hub://alice/notes",
            "mcpmesh-hub://alice/notes/",
            "mcpmesh-hub:///notes/x",
            "mcpmesh-hub://alice//x",
        ] {
            assert_eq!(unwrap_uri(foreign), None, "{foreign}");
        }
    }

    #[test]
    fn schemas_become_object_schemas() {
        let cases = [
            (None, json!({ "type": "object", "properties": {} })),
            (
                Some(json!(null)),
                json!({ "type": "object", "properties": {} }),
            ),
            (
                Some(json!("x")),
                json!({ "type": "object", "properties": {} }),
            ),
            (
                Some(json!({})),
                json!({ "type": "object", "properties": {} }),
            ),
            (
                Some(json!({ "properties": { "q": { "type": "string" } }, "required": ["q"] })),
                json!({ "type": "object", "properties": { "q": { "type": "string" } }, "required": ["q"] }),
            ),
            (
                Some(json!({ "type": "object", "properties": [] })),
                json!({ "type": "object", "properties": {} }),
            ),
            (
                Some(json!({ "type": "string" })),
                json!({ "type": "object", "properties": {} }),
            ),
            (
                Some(json!({ "type": "object", "properties": {}, "additionalProperties": false })),
                json!({ "type": "object", "properties": {}, "additionalProperties": false }),
            ),
        ];
        for (given, want) in cases {
            assert_eq!(normalize_schema(given.as_ref()), want, "{given:?}");
        }
    }

    #[test]
    fn descriptions_say_where_a_tool_lives_and_when_it_is_unavailable() {
        let origin = o("bob", "files", "read");
        assert_eq!(
            describe(&origin, Some(" Reads a file. "), true),
            "[bob/files] Reads a file."
        );
        assert_eq!(describe(&origin, None, true), "[bob/files] read");
        assert_eq!(
            describe(&origin, Some(""), false),
            "[bob/files] read (unavailable: its peer is not reachable now)"
        );
    }

    #[test]
    fn the_naming_modes_parse_from_their_flag_values() {
        assert_eq!("prefixed".parse(), Ok(Naming::Prefixed));
        assert_eq!("service".parse(), Ok(Naming::Service));
        assert_eq!("bare".parse(), Ok(Naming::Bare));
        assert!("short".parse::<Naming>().is_err());
    }
}
