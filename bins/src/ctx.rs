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
