//! How a verb's answer and its failure reach the user: one JSON value with `--json`, plain
//! text otherwise.

use std::io::Write;

use mcpmesh::control::ControlError;
use serde_json::Value;

/// A failure as the user sees it: a stable code (when there is one) and a message.
pub struct Failure {
    pub code: Option<i64>,
    pub message: String,
}

impl From<ControlError> for Failure {
    fn from(e: ControlError) -> Self {
        Failure {
            code: Some(e.code),
            message: e.message,
        }
    }
}

impl From<anyhow::Error> for Failure {
    fn from(e: anyhow::Error) -> Self {
        Failure {
            code: None,
            message: format!("{e:#}"),
        }
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
}
