//! How a verb's answer and its failure reach the user: one JSON value with `--json`, plain
//! text otherwise.

use std::io::Write;

use mcpmesh::control::{ControlError, codes};
use serde_json::Value;

/// A failure as the user sees it: a stable code (`mcpmesh::control::codes`) and a message.
#[derive(Debug)]
pub struct Failure {
    pub code: i64,
    pub message: String,
}

impl Failure {
    pub fn new(code: i64, message: impl Into<String>) -> Self {
        Failure {
            code,
            message: message.into(),
        }
    }

    /// Tells the user: with `json`, as the one JSON line on stderr that every failure is;
    /// otherwise as one plain line.
    pub fn report(&self, json: bool) {
        let line = if json {
            serde_json::json!({ "error": { "code": self.code, "message": self.message } })
                .to_string()
        } else {
            format!("mcpmesh: {}", self.message)
        };
        let _ = writeln!(std::io::stderr().lock(), "{line}");
    }
}

impl From<ControlError> for Failure {
    fn from(e: ControlError) -> Self {
        Failure::new(e.code, e.message)
    }
}

/// What went wrong locally (a file, a process, the runtime), with its context.
impl From<anyhow::Error> for Failure {
    fn from(e: anyhow::Error) -> Self {
        Failure::new(codes::LOCAL, format!("{e:#}"))
    }
}

pub struct Output {
    pub json: bool,
}

impl Output {
    pub fn print(&self, value: Value, human: impl FnOnce() -> String) {
        let mut stdout = std::io::stdout().lock();
        let _ = if self.json {
            writeln!(stdout, "{value}")
        } else {
            writeln!(stdout, "{}", human())
        };
    }

    /// Words for people beside an answer that scripts pipe (on stderr, and not at all with
    /// `--json`).
    pub fn note(&self, human: impl FnOnce() -> String) {
        if !self.json {
            let _ = writeln!(std::io::stderr().lock(), "{}", human());
        }
    }
}
