//! The files in `deploy/`: every systemd unit passes `systemd-analyze verify`, each rates "OK"
//! or better in `systemd-analyze security` (the node's user unit included), no file carries a
//! placeholder URL, and `mcpmesh doctor` accepts the example node config.
//!
//! `verify` refuses a unit whose `ExecStart=` binary does not exist, and the binaries the units
//! name (`~/.cargo/bin/mcpmesh`, `/usr/local/bin/iroh-relay`, `/usr/local/bin/iroh-dns-server`)
//! are not installed where the tests run. So each unit is verified as a copy in which only the
//! program of `ExecStart=` is replaced: by the `mcpmesh` just built for the node's unit, and by
//! that same file as a stand-in for the relay and the DNS server (`verify` checks that the
//! program is an executable file; it never runs it). The security ratings are of the files as
//! shipped.
//!
//! Without `systemd-analyze` the checks that need it are skipped, and say so on stderr past the
//! test harness's capture, so a skip shows in every run; under `CI=true` they fail instead.

mod common;

use common::{MCPMESH, cannot_run};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Longest one `systemd-analyze` or `mcpmesh doctor` run may take before the test fails.
const RUN_TIMEOUT: Duration = Duration::from_secs(60);

/// The units in `deploy/`, and whether each is a user unit or a system unit.
const UNITS: [(&str, Scope); 3] = [
    ("mcpmesh.service", Scope::User),
    ("iroh-relay.service", Scope::System),
    ("iroh-dns-server.service", Scope::System),
];

#[derive(Clone, Copy, PartialEq, Eq)]
enum Scope {
    User,
    System,
}

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

/// `systemd-analyze`, or `None` after saying why the checks that need it are skipped (under
/// CI its absence fails the test).
fn systemd_analyze(test: &str) -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("systemd-analyze"))
            .find(|path| path.is_file())
    });
    if found.is_none() {
        cannot_run(
            test,
            "systemd-analyze is not installed (Debian package `systemd`)",
        );
    }
    found
}

/// `systemd-analyze ARGS` in scope, with a runtime directory of its own (a user-scope run
/// needs `XDG_RUNTIME_DIR`, which a test environment may not have).
fn analyze(tool: &Path, scope: Scope, args: &[&str], runtime: &Path) -> Output {
    let mut cmd = Command::new(tool);
    if scope == Scope::User {
        cmd.arg("--user");
    }
    cmd.args(args).env("XDG_RUNTIME_DIR", runtime);
    run_bounded(cmd)
}

fn run_bounded(mut cmd: Command) -> Output {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    let deadline = Instant::now() + RUN_TIMEOUT;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("{cmd:?} took longer than {RUN_TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

fn text(out: &Output) -> String {
    format!(
        "status {}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// `unit` with the program of its `ExecStart=` replaced by `program`, arguments kept.
fn with_exec_start(unit: &str, program: &str) -> String {
    let mut replaced = 0;
    let lines: Vec<String> = unit
        .lines()
        .map(|line| match line.strip_prefix("ExecStart=") {
            Some(command) => {
                replaced += 1;
                let args = command.split_once(' ').map_or("", |(_, args)| args);
                format!("ExecStart={program} {args}")
            }
            None => line.to_owned(),
        })
        .collect();
    assert_eq!(replaced, 1, "one ExecStart= line in:\n{unit}");
    lines.join("\n") + "\n"
}

#[test]
fn every_unit_passes_systemd_analyze_verify() {
    let Some(tool) = systemd_analyze("every_unit_passes_systemd_analyze_verify") else {
        return;
    };
    let copies = tempfile::tempdir().unwrap();
    let runtime = tempfile::tempdir().unwrap();
    for (name, scope) in UNITS {
        let unit = std::fs::read_to_string(deploy_dir().join(name)).unwrap();
        let copy = copies.path().join(name);
        std::fs::write(&copy, with_exec_start(&unit, MCPMESH)).unwrap();
        let out = analyze(
            &tool,
            scope,
            &["verify", copy.to_str().unwrap()],
            runtime.path(),
        );
        assert!(out.status.success(), "{name}: {}", text(&out));
        assert!(
            !String::from_utf8_lossy(&out.stderr).contains(name),
            "{name} verifies with complaints: {}",
            text(&out)
        );
    }
}

#[test]
fn every_unit_rates_ok_or_better_in_systemd_analyze_security() {
    let Some(tool) = systemd_analyze("every_unit_rates_ok_or_better_in_systemd_analyze_security")
    else {
        return;
    };
    let runtime = tempfile::tempdir().unwrap();
    for (name, scope) in UNITS {
        let unit = deploy_dir().join(name);
        // The threshold is in tenths: above 4.9 the command fails. systemd rates 5.0 and up
        // "MEDIUM", below it "OK", below 1.0 "SAFE", 0 "PERFECT".
        let out = analyze(
            &tool,
            scope,
            &[
                "security",
                "--offline=true",
                "--threshold=49",
                unit.to_str().unwrap(),
            ],
            runtime.path(),
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        let verdict = stdout
            .lines()
            .find_map(|line| line.split_once(&format!("exposure level for {name}: ")))
            .map(|(_, verdict)| verdict.to_owned())
            .unwrap_or_else(|| panic!("{name}: no overall exposure in {}", text(&out)));
        let mut words = verdict.split_whitespace();
        let exposure: f64 = words.next().unwrap().parse().unwrap();
        let rating = words.next().unwrap_or_default();
        assert!(
            exposure < 5.0 && ["OK", "SAFE", "PERFECT"].contains(&rating),
            "{name} rates {verdict}"
        );
        assert!(out.status.success(), "{name}: {}", text(&out));
    }
}

#[test]
fn no_deploy_file_carries_a_placeholder() {
    for entry in std::fs::read_dir(deploy_dir()).unwrap() {
        let path = entry.unwrap().path();
        let content = std::fs::read_to_string(&path).unwrap();
        assert!(
            !content.contains("example.invalid"),
            "{} names a placeholder URL",
            path.display()
        );
        // The example domains belong in the config files the reader edits, never in a unit.
        if path.extension().is_some_and(|e| e == "service") {
            assert!(
                !content.contains("example."),
                "{} names an example domain",
                path.display()
            );
        }
    }
}

#[test]
fn doctor_accepts_the_example_node_config() {
    let home = tempfile::tempdir().unwrap();
    let config = home.path().join("config.toml");
    std::fs::copy(deploy_dir().join("node-config.toml"), &config).unwrap();
    std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o600)).unwrap();
    let mut cmd = Command::new(MCPMESH);
    cmd.arg("--home")
        .arg(home.path())
        // Offline: the example names relay.example.org, which must not be looked up.
        .args(["doctor", "--offline", "--json"]);
    let out = run_bounded(cmd);
    assert!(out.status.success(), "{}", text(&out));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["ok"], true, "{report}");
    let checks = report["checks"].as_array().unwrap();
    let check = |name: &str| {
        checks
            .iter()
            .find(|c| c["check"] == name)
            .unwrap_or_else(|| panic!("no {name} check in {report}"))
    };
    assert_eq!(check("config")["status"], "ok", "{report}");
    assert_eq!(
        check("network")["message"],
        "self-hosted relays: 1",
        "{report}"
    );
}
