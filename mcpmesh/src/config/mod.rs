//! `config.toml`: what the node serves, whom it trusts statically, how it reaches the network.
//!
//! Read with serde and validated into clear errors that name the offending key. Written only
//! through [`ConfigFile`], which edits the document in place (a user's comments and layout
//! survive), validates the result, and replaces the file atomically.
//!
//! The rooms: `schema` (the file as written, and the settings it becomes), `validate` (from
//! one to the other), `file` (reading and replacing the file), `edit` and `tools` (the changes
//! the node's verbs make to the document).

mod edit;
mod file;
mod schema;
mod tools;
mod validate;

pub use edit::*;
pub use file::ConfigFile;
pub use schema::*;
pub use tools::{deny_own_tools, grant_own_tools};
pub use validate::*;

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::path::Path;

    use iroh::EndpointId;
    use mcpmesh_net::endpoint::RelayPolicy;

    use super::*;
    use crate::principal::Principal;

    /// The README's example config (the `toml` block that opens with `[identity]`).
    fn readme_example() -> String {
        let readme = include_str!("../../../README.md");
        let block = readme
            .split("```toml\n")
            .skip(1)
            .filter_map(|b| b.split_once("\n```").map(|(b, _)| b))
            .find(|b| b.starts_with("[identity]"))
            .expect("the README has an example config");
        block.to_owned()
    }

    #[test]
    fn the_readmes_config_example_parses_as_it_is_and_with_every_setting_uncommented() {
        let example = readme_example();
        let uncommented: String = example
            .lines()
            .map(|line| {
                let setting = line.strip_prefix("# ").filter(|rest| {
                    rest.split_once(" = ").is_some_and(|(key, _)| {
                        !key.is_empty()
                            && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                    })
                });
                format!("{}\n", setting.unwrap_or(line))
            })
            .collect();
        assert_ne!(example, uncommented, "the example has commented settings");
        for (what, text) in [("as it is", &example), ("uncommented", &uncommented)] {
            if let Err(e) = Config::parse(text, "README.md") {
                panic!("the README's example, {what}, does not load: {e}\n{text}");
            }
        }
    }

    fn some_id() -> EndpointId {
        iroh::SecretKey::generate().public()
    }

    fn hermetic() -> String {
        HERMETIC.replace("PEER_ID", &some_id().to_string())
    }

    const HERMETIC: &str = r#"
[identity]
nickname = "alice"

[network]
relay_mode = "disabled"
bind = "127.0.0.1:0"

[services.notes]
run = "python3 -m notes --dir '/tmp/my notes'"
allow = ["bob"]
max_sessions = 2

[peers.bob]
id = "PEER_ID"
addrs = ["127.0.0.1:4433"]
"#;

    #[test]
    fn a_hermetic_config_parses() {
        let s = Config::parse(&hermetic(), "config.toml").unwrap();
        assert_eq!(s.network.relay, RelayPolicy::Disabled);
        assert_eq!(s.network.bind, vec!["127.0.0.1:0".parse().unwrap()]);
        assert_eq!(
            s.services[0].backend,
            BackendSpec::Run(
                ["python3", "-m", "notes", "--dir", "/tmp/my notes"]
                    .map(String::from)
                    .to_vec()
            )
        );
        assert_eq!(s.services[0].max_sessions, 2);
        assert_eq!(s.peers[0].addrs.len(), 1);
    }

    fn error_of(text: &str) -> String {
        Config::parse(text, "config.toml").unwrap_err().to_string()
    }

    #[test]
    fn the_status_page_address_is_loopback_or_an_error_naming_the_key() {
        let s = Config::parse("[telemetry]\nstatus = \"127.0.0.1:9465\"\n", "c").unwrap();
        assert_eq!(s.status_listen, Some("127.0.0.1:9465".parse().unwrap()));
        assert_eq!(Config::parse("", "c").unwrap().status_listen, None);
        for bad in ["0.0.0.0:9465", "192.168.1.2:80", "localhost:9465", "9465"] {
            let e = error_of(&format!("[telemetry]\nstatus = \"{bad}\"\n"));
            assert!(
                e.contains("telemetry.status") && e.contains("loopback"),
                "{e}"
            );
        }
    }

    #[test]
    fn a_teams_discovery_server_is_read_with_custom_relays_and_refused_when_hermetic() {
        let custom =
            "[network]\nrelay_mode = \"custom\"\nrelay_urls = [\"http://10.0.0.1:3340\"]\n";
        let s = Config::parse(
            &format!(
                "{custom}pkarr_relay = \"http://10.0.0.1:8080/pkarr\"\ndns_origin = \"dns.team.example.\"\ndns_nameserver = \"10.0.0.1\"\n"
            ),
            "config.toml",
        )
        .unwrap();
        let d = &s.network.discovery;
        assert_eq!(
            d.pkarr_relay.as_ref().map(|u| u.as_str()),
            Some("http://10.0.0.1:8080/pkarr")
        );
        assert_eq!(d.dns_origin.as_deref(), Some("dns.team.example"));
        assert_eq!(d.dns_nameserver, Some("10.0.0.1:53".parse().unwrap()));
        // None by default, in every mode.
        assert!(
            Config::parse(custom, "c")
                .unwrap()
                .network
                .discovery
                .is_empty()
        );
        assert!(Config::parse("", "c").unwrap().network.discovery.is_empty());

        let hermetic = "[network]\nrelay_mode = \"disabled\"\n";
        for key in [
            "pkarr_relay = \"http://a/pkarr\"",
            "dns_origin = \"a.example\"",
        ] {
            let e = error_of(&format!("{hermetic}{key}\n"));
            assert!(e.contains("hermetic (no discovery)"), "{e}");
            assert!(
                e.contains(&format!("network.{}", &key[..key.find(' ').unwrap()])),
                "{e}"
            );
        }
        let e = error_of(&format!("{custom}pkarr_relay = \"ftp://a/pkarr\"\n"));
        assert!(e.contains("network.pkarr_relay"), "{e}");
        let e = error_of(&format!("{custom}pkarr_relay = \"not a url\"\n"));
        assert!(e.contains("network.pkarr_relay"), "{e}");
        let e = error_of(&format!("{custom}dns_origin = \"bad name.example\"\n"));
        assert!(e.contains("network.dns_origin"), "{e}");
        let e = error_of(&format!("{custom}dns_origin = \"\"\n"));
        assert!(e.contains("network.dns_origin"), "{e}");
        let e = error_of(&format!("{custom}dns_nameserver = \"10.0.0.1\"\n"));
        assert!(e.contains("network.dns_nameserver: set dns_origin"), "{e}");
        let e = error_of(&format!(
            "{custom}dns_origin = \"a.example\"\ndns_nameserver = \"ns1\"\n"
        ));
        assert!(e.contains("network.dns_nameserver"), "{e}");
    }

    #[test]
    fn a_url_service_asserts_its_caller_unless_turned_off() {
        let header_of = |extra: &str| {
            let text = format!("[services.x]\nurl = \"http://127.0.0.1:9/mcp\"\n{extra}");
            match &Config::parse(&text, "c").unwrap().services[0].backend {
                BackendSpec::Url { caller_header, .. } => caller_header.clone(),
                other => panic!("{other:?}"),
            }
        };
        assert_eq!(header_of("").as_deref(), Some("Mcpmesh-Caller"));
        assert_eq!(
            header_of("caller_assertion = true\n").as_deref(),
            Some("Mcpmesh-Caller")
        );
        assert_eq!(
            header_of("caller_header = \"X-Caller\"\n").as_deref(),
            Some("X-Caller")
        );
        assert_eq!(header_of("caller_assertion = false\n"), None);
        let url = "[services.x]\nurl = \"http://h/\"\n";
        for (extra, says) in [
            ("caller_header = \"bad name\"\n", "not a header name"),
            (
                "caller_assertion = false\ncaller_header = \"X\"\n",
                "turned off",
            ),
            (
                "headers = { mcpmesh-caller = \"forged\" }\n",
                "also set in headers",
            ),
            (
                "caller_header = \"X\"\nheaders = { x = \"forged\" }\n",
                "also set in headers",
            ),
        ] {
            let e = error_of(&format!("{url}{extra}"));
            assert!(
                e.contains("services.x.caller_header") && e.contains(says),
                "{e}"
            );
        }
        let e = error_of("[services.x]\nrun = \"a\"\ncaller_assertion = true\n");
        assert!(
            e.contains("services.x.caller_assertion: only url and socket"),
            "{e}"
        );
        let e = error_of("[services.x]\nsocket = \"/s\"\ncaller_header = \"X\"\n");
        assert!(
            e.contains("services.x.caller_header: only a url service"),
            "{e}"
        );
        let socket = |extra: &str| {
            let text = format!("[services.x]\nsocket = \"/s\"\n{extra}");
            Config::parse(&text, "c").unwrap().services[0]
                .backend
                .clone()
        };
        let asked = |caller_assertion| BackendSpec::Socket {
            path: "/s".into(),
            caller_assertion,
        };
        assert_eq!(socket(""), asked(false), "a socket service asks for one");
        assert_eq!(socket("caller_assertion = true\n"), asked(true));
    }

    #[test]
    fn an_oauth_table_makes_a_url_service_an_oauth_client_and_bad_keys_are_named() {
        let oauth_of = |extra: &str| {
            let text = format!("[services.x]\nurl = \"http://127.0.0.1:9/mcp\"\n{extra}");
            match &Config::parse(&text, "c").unwrap().services[0].backend {
                BackendSpec::Url { oauth, .. } => oauth.clone(),
                other => panic!("{other:?}"),
            }
        };
        assert_eq!(oauth_of(""), None);
        assert_eq!(oauth_of("[services.x.oauth]\n"), Some(Default::default()));
        let set = oauth_of(
            "[services.x.oauth]\nclient_id = \"c\"\nclient_secret = \"s\"\nscopes = [\"a\", \"b\"]\n",
        )
        .unwrap();
        assert_eq!(set.client_id.as_deref(), Some("c"));
        assert_eq!(set.scopes, ["a", "b"]);
        let machine = oauth_of(
            "[services.x.oauth]\nclient_id = \"c\"\nclient_credentials = true\nclient_key = \"/k.pem\"\n",
        )
        .unwrap();
        assert!(machine.client_credentials);
        assert_eq!(machine.client_key.as_deref(), Some(Path::new("/k.pem")));
        let url = "[services.x]\nurl = \"http://h/\"\n[services.x.oauth]\n";
        for (extra, says) in [
            (
                "client_metadata_url = \"http://h/c.json\"\n",
                "client_metadata_url",
            ),
            ("client_secret = \"s\"\n", "client_secret"),
            ("scopes = [\"a b\"]\n", "scopes"),
            (
                "client_id = \"c\"\nclient_credentials = true\n",
                "client_credentials: needs",
            ),
            ("client_id = \"c\"\nclient_key = \"/k.pem\"\n", "client_key"),
            (
                "client_id = \"c\"\nclient_credentials = true\nclient_secret = \"s\"\nclient_key = \"/k.pem\"\n",
                "not both",
            ),
            ("bogus = 1\n", "bogus"),
            (
                "[services.x.headers]\nAuthorization = \"Bearer t\"\n",
                "remove one",
            ),
        ] {
            let e = error_of(&format!("{url}{extra}"));
            assert!(e.contains(says), "{e}");
        }
        let e = error_of("[services.x]\nrun = \"a\"\n[services.x.oauth]\n");
        assert!(e.contains("services.x.oauth: only a url service"), "{e}");
    }

    #[test]
    fn serve_writes_the_caller_assertion_only_where_it_departs_from_the_default() {
        let mut doc: toml_edit::DocumentMut = "".parse().unwrap();
        let url = |caller_header: Option<&str>| BackendSpec::Url {
            url: "http://127.0.0.1:9/mcp".into(),
            headers: BTreeMap::new(),
            caller_header: caller_header.map(str::to_owned),
            oauth: None,
        };
        set_service(&mut doc, "x", &url(Some("Mcpmesh-Caller")), &[], None).unwrap();
        assert!(!doc.to_string().contains("caller_"), "{doc}");
        set_service(&mut doc, "x", &url(None), &[], None).unwrap();
        assert!(
            doc.to_string().contains("caller_assertion = false"),
            "{doc}"
        );
        set_service(&mut doc, "x", &url(Some("X-Caller")), &[], None).unwrap();
        let text = doc.to_string();
        assert!(
            text.contains("caller_header = \"X-Caller\"") && !text.contains("caller_assertion")
        );
        let backend = &Config::parse(&text, "c").unwrap().services[0].backend;
        assert_eq!(backend, &url(Some("X-Caller")));
        set_service(
            &mut doc,
            "x",
            &BackendSpec::Run(vec!["a".into()]),
            &[],
            None,
        )
        .unwrap();
        assert!(!doc.to_string().contains("caller_"), "{doc}");
    }

    #[test]
    fn bad_configs_name_the_key() {
        assert!(error_of("[services.x]\nrun = []\n").contains("services.x.run"));
        assert!(error_of("[peers.bob]\nid = \"nope\"\n").contains("peers.bob.id"));
        assert!(error_of("[network]\nrelay_mode = \"custom\"\n").contains("network.relay_urls"));
        assert!(error_of("[network]\nbind = \"here\"\n").contains("network.bind"));
        assert!(
            error_of("[services.x]\nrun = \"a\"\nenv = { MCPMESH_PEER_EID = \"x\" }\n")
                .contains("services.x.env.MCPMESH_PEER_EID")
        );
        assert!(
            error_of("[services.x]\nrun = \"a\"\nmax_sessions = \"two\"\n")
                .contains("max_sessions")
        );
        assert!(error_of("[services.x]\nrun = \"a\"\nalow = []\n").contains("alow"));
        assert!(error_of("[services.\"a/b\"]\nrun = \"a\"\n").contains("services.a/b"));
        assert!(error_of("[services.x]\nrun = \"a\"\nsocket = \"/s\"\n").contains("not several"));
        assert!(error_of("[services.x]\nurl = \"ftp://h/\"\n").contains("services.x.url"));
        assert!(
            error_of("[services.x]\nurl = \"http://h/\"\nheaders = { A = \"${B\" }\n")
                .contains("services.x.headers.A")
        );
        assert!(
            error_of("[services.x]\nrun = \"a\"\nheaders = { A = \"b\" }\n").contains("only a url")
        );
        assert!(error_of("[services.x]\nsocket = \"rel.sock\"\n").contains("absolute"));
        assert!(error_of("[services.x]\nallow = []\n").contains("services.x.run"));
        assert!(error_of("[telemetry]\nmetrics = \"9464\"\n").contains("telemetry.metrics"));
        let e = error_of("[telemetry]\nmetrics = \"0.0.0.0:9464\"\n");
        assert!(
            e.contains("telemetry.metrics") && e.contains("loopback"),
            "{e}"
        );
        assert!(error_of("[telemetry]\nmetric = \"127.0.0.1:1\"\n").contains("metric"));
        for bad in ["127.0.0.1:4318", "grpc://h:4317", "http://"] {
            let e = error_of(&format!("[telemetry]\notlp = {bad:?}\n"));
            assert!(e.contains("telemetry.otlp") && e.contains("4318"), "{e}");
        }
        let e = error_of("[telemetry]\notlp = \"https://me:s3cret@otel.example\"\n");
        assert!(
            e.contains("OTEL_EXPORTER_OTLP_HEADERS") && !e.contains("s3cret"),
            "{e}"
        );
    }

    #[test]
    fn traces_are_off_by_default_and_go_to_the_collectors_traces_path() {
        let otlp = |text: &str| {
            Config::parse(&format!("[telemetry]\notlp = {text:?}\n"), "config.toml")
                .unwrap()
                .otlp
                .map(String::from)
        };
        assert_eq!(Config::parse("", "config.toml").unwrap().otlp, None);
        for (given, used) in [
            ("http://127.0.0.1:4318", "http://127.0.0.1:4318/v1/traces"),
            (
                "https://otel.example:443/",
                "https://otel.example/v1/traces",
            ),
            ("http://h:4318/custom/traces", "http://h:4318/custom/traces"),
        ] {
            assert_eq!(otlp(given).as_deref(), Some(used), "{given}");
        }
    }

    #[test]
    fn metrics_are_off_by_default_and_listen_on_loopback_when_asked() {
        let parse = |text: &str| Config::parse(text, "config.toml").unwrap();
        assert_eq!(parse("").metrics, None);
        assert_eq!(
            parse("[telemetry]\nmetrics = \"127.0.0.1:9464\"\n").metrics,
            Some("127.0.0.1:9464".parse().unwrap())
        );
        assert_eq!(
            parse("[telemetry]\nmetrics = \"[::1]:0\"\n").metrics,
            Some("[::1]:0".parse().unwrap())
        );
    }

    #[test]
    fn an_allow_entry_that_is_not_a_principal_is_an_error_naming_the_key() {
        for bad in ["foo:bar", "eid:abc", "peer:a b", "group:", "-x"] {
            let text = format!("[services.x]\nrun = \"a\"\nallow = [{bad:?}]\n");
            let e = error_of(&text);
            assert!(e.contains("services.x.allow"), "{bad}: {e}");
        }
        let hex = "ab".repeat(32);
        let text = format!(
            "[services.x]\nrun = \"a\"\nallow = [\"bob\", \"peer:carol\", \"eid:{hex}\", \"user:u1\", \"group:eng\"]\n"
        );
        let s = Config::parse(&text, "config.toml").unwrap();
        let shown: Vec<String> = s.services[0].allow.iter().map(|p| p.to_string()).collect();
        assert_eq!(
            shown,
            [
                "peer:bob",
                "peer:carol",
                &format!("eid:{hex}"),
                "user:u1",
                "group:eng"
            ]
        );
    }

    #[test]
    fn tool_rules_parse_and_bad_ones_name_the_service_and_the_rule() {
        let text = "[services.files]\nrun = \"a\"\nallow = [\"group:eng\", \"dave\"]\n\
            [[services.files.tools]]\nwho = [\"group:eng\"]\nallow = [\"read_*\", \"list_*\"]\n\
            [[services.files.tools]]\nwho = [\"dave\"]\ndeny = [\"*\"]\n";
        let s = Config::parse(text, "config.toml").unwrap();
        let tools = &s.services[0].tools;
        assert_eq!(tools.len(), 2);
        assert_eq!(tools[0].who, ["group:eng".parse::<Principal>().unwrap()]);
        assert_eq!(tools[0].allow, ["read_*", "list_*"]);
        assert_eq!(tools[1].who, [Principal::peer("dave")]);
        assert_eq!(tools[1].deny, ["*"]);
        for (rule, says) in [
            ("allow = [\"x\"]", "services.files.tools[0]: who"),
            ("who = []\nallow = [\"x\"]", "services.files.tools[0]: who"),
            ("who = [\"team:x\"]\nallow = [\"x\"]", "unknown kind"),
            ("who = [\"bob\"]", "give allow or deny"),
            ("who = [\"bob\"]\nallow = []", "give allow or deny"),
            (
                "who = [\"bob\"]\ndeny = [\"\"]",
                "deny: a tool pattern cannot be empty",
            ),
        ] {
            let text = format!("[services.files]\nrun = \"a\"\n[[services.files.tools]]\n{rule}\n");
            let e = error_of(&text);
            assert!(e.contains(says), "{rule}: {e}");
            assert!(e.contains("services.files.tools[0]"), "{rule}: {e}");
        }
        // A misspelt key is the TOML reader's error, which points at the line.
        let e = error_of(
            "[services.files]\nrun = \"a\"\n[[services.files.tools]]\nwho = [\"bob\"]\nalow = [\"x\"]\n",
        );
        assert!(e.contains("unknown field `alow`"), "{e}");
    }

    #[test]
    fn renames_and_removals_reach_every_spelling_of_a_peer_and_nothing_else() {
        let hex = "ab".repeat(32);
        let text = format!(
            "[services.x]\nrun = \"a\"\nallow = [\"bob\", \"peer:bob\", \"group:bob\", \"user:bob\", \"eid:{hex}\", \"bobby\"]\n"
        );
        let allow = |doc: &toml_edit::DocumentMut| -> Vec<String> {
            doc["services"]["x"]["allow"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_str().unwrap().to_owned())
                .collect()
        };
        let mut doc: toml_edit::DocumentMut = text.parse().unwrap();
        rename_allow(&mut doc, "bob", "robert").unwrap();
        assert_eq!(
            allow(&doc),
            [
                "robert",
                "peer:robert",
                "group:bob",
                "user:bob",
                &format!("eid:{hex}"),
                "bobby"
            ]
        );
        let gone = [
            Principal::peer("robert"),
            format!("eid:{hex}").parse().unwrap(),
        ];
        assert_eq!(remove_allow(&mut doc, "x", &gone).unwrap(), 3);
        assert_eq!(allow(&doc), ["group:bob", "user:bob", "bobby"]);
        add_allow(&mut doc, "x", &Principal::peer("bobby")).unwrap();
        assert_eq!(allow(&doc).len(), 3, "already there as a bare name");
    }

    #[test]
    fn edits_keep_comments_and_refuse_invalid_results() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.toml");
        std::fs::write(&path, "# my node\n[network]\nrelay_mode = \"disabled\"\n").unwrap();
        let file = ConfigFile::new(&path);
        let id = some_id();
        let s = file
            .edit(|d| set_peer(d, "bob", &id, &["127.0.0.1:9".parse().unwrap()]))
            .unwrap();
        assert_eq!(s.peers[0].id, id);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.starts_with("# my node\n"), "{text}");
        let err = file.edit(|d| set_service(d, "bad", &BackendSpec::Run(vec![]), &[], None));
        assert!(err.is_err());
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            text,
            "invalid edit wrote nothing"
        );
    }
}
