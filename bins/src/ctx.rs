//! What every verb that talks to the node needs, shared by the verbs' modules: the profile,
//! the binary (to start the node), where output goes, one request to the node, and the
//! duration syntax of every flag that takes one.

use std::path::Path;

use mcpmesh::control::client::ControlClient;
use mcpmesh::control::codes;
use mcpmesh::paths::Profile;
use serde_json::Value;

use crate::output::{Failure, Output};

/// What every verb that talks to the node needs.
pub(crate) struct Ctx<'a> {
    pub profile: &'a Profile,
    pub exe: &'a Path,
    pub out: &'a Output,
}

impl Ctx<'_> {
    /// One request to the node (started if needed).
    pub fn call(&self, method: &str, params: Value) -> Result<Value, Failure> {
        call(self.profile, self.exe, method, params)
    }
}

/// One request to the node (started if needed).
pub(crate) fn call(
    profile: &Profile,
    exe: &std::path::Path,
    method: &str,
    params: Value,
) -> Result<Value, Failure> {
    let mut client = ControlClient::connect_or_start(profile, exe)?;
    Ok(client.call(method, params)?)
}

/// A duration as people write it (`--ttl`, `--since`): 30m, 24h, 7d.
pub(crate) fn parse_duration(text: &str) -> Result<std::time::Duration, Failure> {
    mcpmesh::time::parse_duration(text).ok_or_else(|| {
        Failure::new(
            codes::INVALID_PARAMS,
            format!("{text:?} is not a duration like 30m, 24h or 7d"),
        )
    })
}

/// A duration `flag` takes that must be more than zero.
pub(crate) fn positive_duration(flag: &str, text: &str) -> Result<std::time::Duration, Failure> {
    let duration = parse_duration(text)?;
    if duration.is_zero() {
        return Err(Failure::new(
            codes::INVALID_PARAMS,
            format!("{flag} must be more than 0s"),
        ));
    }
    Ok(duration)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_every_flag_reads_them_and_zero_is_refused_where_it_must() {
        let secs = |t: &str| parse_duration(t).map(|d| d.as_secs()).ok();
        assert_eq!(secs("90"), Some(90), "a bare number is seconds");
        assert_eq!(secs("90s"), Some(90));
        assert_eq!(secs("5m"), Some(300));
        assert_eq!(secs("2h"), Some(7200));
        assert_eq!(secs("five"), None);
        assert!(positive_duration("--idle", "0s").is_err());
        assert!(positive_duration("--idle", "0").is_err());
        assert_eq!(
            positive_duration("--idle", "1").ok(),
            Some(std::time::Duration::from_secs(1))
        );
    }

    #[test]
    fn the_gateways_default_idle_is_the_librarys() {
        use clap::Parser;
        let cli = crate::args::Cli::try_parse_from(["mcpmesh", "gateway"]).unwrap();
        let crate::args::Command::Gateway(flags) = cli.command else {
            panic!("not the gateway verb");
        };
        assert_eq!(
            positive_duration("--idle", &flags.idle).ok(),
            Some(mcpmesh::gateway::DEFAULT_IDLE)
        );
    }
}
