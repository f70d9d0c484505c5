//! The error band: the JSON-RPC errors the mesh itself synthesizes.
//!
//! Every frame built here carries `"data":{"source":"mcpmesh"}` so a client can tell a mesh
//! failure from an error its MCP server returned. This is the only place such frames are made.

use serde_json::value::RawValue;
use serde_json::{Map, Value, json};

/// The codes of the mesh's own error band (from -32051, the README's "What happens on the
/// wire"), plus the JSON-RPC parse error used where the mesh has to parse input and cannot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// A line longer than the frame cap.
    FrameTooLarge,
    /// The session is not ready, or a trust change severed it mid-request.
    NotReady,
    /// Rate limited or at capacity; carries `retry_after_ms`.
    Busy,
    /// Unknown or unauthorized service (indistinguishable on purpose).
    UnknownService,
    /// Peer unreachable, or the session was lost before the answer.
    Unreachable,
    /// A `url` service that needs an OAuth grant this node does not have (or that lapsed);
    /// `data.service` and `data.command` say what to run.
    NeedsGrant,
    /// A gateway session id that names no session (never issued, or ended).
    UnknownSession,
    /// A feature that cannot be bridged between MCP eras (`data.feature` names it).
    Unbridged,
    /// Input the mesh had to parse was not JSON.
    Parse,
    /// JSON, but not one JSON-RPC message (an array, a bare value).
    InvalidRequest,
}

impl ErrorCode {
    pub const fn code(self) -> i64 {
        match self {
            ErrorCode::FrameTooLarge => -32051,
            ErrorCode::NotReady => -32052,
            ErrorCode::Busy => -32053,
            ErrorCode::UnknownService => -32054,
            ErrorCode::Unreachable => -32055,
            ErrorCode::NeedsGrant => -32056,
            ErrorCode::Unbridged => -32057,
            ErrorCode::UnknownSession => -32058,
            ErrorCode::Parse => -32700,
            ErrorCode::InvalidRequest => -32600,
        }
    }

    /// The message a client sees when the caller gives none.
    pub const fn default_message(self) -> &'static str {
        match self {
            ErrorCode::FrameTooLarge => "frame larger than the 16 MiB cap",
            ErrorCode::NotReady => "session not ready or severed by a trust change",
            ErrorCode::Busy => "rate limited or at capacity, retry later",
            ErrorCode::UnknownService => "unknown or unauthorized service",
            ErrorCode::Unreachable => "peer unreachable or session lost",
            ErrorCode::NeedsGrant => "the service needs an OAuth grant this node does not have",
            ErrorCode::UnknownSession => "unknown or ended session",
            ErrorCode::Unbridged => "a feature that cannot be bridged between MCP eras",
            ErrorCode::Parse => "parse error: not a JSON value",
            ErrorCode::InvalidRequest => "invalid request: not a JSON-RPC message",
        }
    }
}

/// Builds one error line of the band. The id is echoed as the raw JSON it arrived as, so its
/// value and JSON type survive (`"7"` stays a string, `7` a number).
#[derive(Debug, Clone)]
pub struct ErrorFrame {
    code: ErrorCode,
    id: Option<Box<RawValue>>,
    message: Option<String>,
    data: Map<String, Value>,
}

/// The code of `frame`'s error when the mesh made it (its `data.source` is `mcpmesh`), as
/// against an error a server sent.
pub fn mesh_code(frame: &Value) -> Option<i64> {
    let error = frame.get("error")?;
    (error.get("data")?.get("source")? == "mcpmesh").then(|| error.get("code")?.as_i64())?
}

impl ErrorFrame {
    pub fn new(code: ErrorCode) -> Self {
        let mut data = Map::new();
        data.insert("source".into(), Value::from("mcpmesh"));
        ErrorFrame {
            code,
            id: None,
            message: None,
            data,
        }
    }

    /// Echo this request id (raw JSON). Without it the frame carries `"id":null`.
    pub fn id(mut self, id: Option<&RawValue>) -> Self {
        self.id = id.map(RawValue::to_owned);
        self
    }

    pub fn message(mut self, message: impl Into<String>) -> Self {
        self.message = Some(message.into());
        self
    }

    /// What cannot be bridged, for [`ErrorCode::Unbridged`].
    pub fn feature(mut self, feature: impl Into<String>) -> Self {
        self.data
            .insert("feature".into(), Value::from(feature.into()));
        self
    }

    /// The service and the command its owner runs, for [`ErrorCode::NeedsGrant`].
    pub fn grant_needed(mut self, service: &str, command: &str) -> Self {
        self.data.insert("service".into(), Value::from(service));
        self.data.insert("command".into(), Value::from(command));
        self
    }

    pub fn retry_after_ms(mut self, ms: u64) -> Self {
        self.data.insert("retry_after_ms".into(), Value::from(ms));
        self
    }

    /// The frame as one compact JSON line, newline included.
    pub fn to_line(&self) -> Vec<u8> {
        let id = self.id.as_deref().map_or("null", RawValue::get);
        let error = json!({
            "code": self.code.code(),
            "message": self.message.as_deref().unwrap_or(self.code.default_message()),
            "data": self.data,
        });
        // The error object is built by serde_json; only the already-valid raw id is spliced in.
        let mut line = Vec::with_capacity(96 + id.len());
        line.extend_from_slice(br#"{"jsonrpc":"2.0","id":"#);
        line.extend_from_slice(id.as_bytes());
        line.extend_from_slice(br#","error":"#);
        line.extend_from_slice(error.to_string().as_bytes());
        line.extend_from_slice(b"}\n");
        line
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(line: &[u8]) -> Value {
        assert_eq!(line.last(), Some(&b'\n'));
        serde_json::from_slice(line).unwrap()
    }

    #[test]
    fn every_band_frame_is_marked_as_coming_from_the_mesh() {
        for code in [
            ErrorCode::FrameTooLarge,
            ErrorCode::NotReady,
            ErrorCode::Busy,
            ErrorCode::UnknownService,
            ErrorCode::Unreachable,
            ErrorCode::NeedsGrant,
            ErrorCode::UnknownSession,
            ErrorCode::Parse,
            ErrorCode::InvalidRequest,
        ] {
            let v = parse(&ErrorFrame::new(code).to_line());
            assert_eq!(v["error"]["code"], code.code());
            assert_eq!(v["error"]["data"]["source"], "mcpmesh");
            assert_eq!(v["id"], Value::Null);
        }
    }

    #[test]
    fn echoed_ids_keep_their_json_type() {
        let raw = RawValue::from_string("\"7\"".into()).unwrap();
        let v = parse(
            &ErrorFrame::new(ErrorCode::Busy)
                .id(Some(&raw))
                .retry_after_ms(250)
                .to_line(),
        );
        assert_eq!(v["id"], Value::from("7"));
        assert_eq!(v["error"]["data"]["retry_after_ms"], 250);
    }
}
