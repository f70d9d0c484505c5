//! The catalog: "what may I use here?", asked of a peer over the gated `mcpmesh/catalog/1` and
//! answered for the asking peer only.
//!
//! The asker opens one stream and writes one [`Request`] line; the node writes one [`Answer`]
//! line — the services whose `allow` admits the asker, each with its description, its backend
//! kind, how many tools the asker may use there (counted from the last `tools/list` the node
//! relayed for it, under the asker's rules; `null` when it has never listed it) and the
//! principal that admitted it — and ends the stream. Nothing about a service the asker may not
//! use leaves the node. The request names no one: the node answers for the key that dialed it.
//!
//! Every answer is untrusted input to the asker: it is read under a size cap and each entry is
//! checked (names, lengths, counts) before anything keeps it.

use std::time::Duration;

use iroh::endpoint::{Connection, VarInt};
use iroh::{Endpoint, EndpointId};
use mcpmesh_net::session::valid_service_name;
use serde::{Deserialize, Serialize};

/// ALPN of the catalog; gated like every mesh ALPN.
pub const ALPN_CATALOG: &[u8] = b"mcpmesh/catalog/1";
/// The protocol revision a request names.
pub const VERSION: u32 = 1;
/// Longest request line.
pub const MAX_REQUEST: usize = 1024;
/// Longest answer line: a node's whole catalog for one asker.
pub const MAX_ANSWER: usize = 256 * 1024;
/// Most services one answer may list.
pub const MAX_ENTRIES: usize = 512;
/// Longest service description, in characters (`serve --description`).
pub const MAX_DESCRIPTION: usize = 280;
/// How long either side waits on the other.
pub const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(10);

/// What the asker sends: the revision it speaks, nothing about who it is.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Request {
    pub catalog: u32,
}

/// One service the asker may use.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub service: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// `run`, `socket` or `url`.
    pub backend: String,
    /// Tools the asker may use, from the last listing the node relayed; `None`: never listed.
    pub tools: Option<u32>,
    /// The principal of the service's `allow` that admitted the asker.
    pub admitted_by: String,
}

/// The node's answer: the asker's catalog, or a refusal.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Answer {
    #[serde(default)]
    pub services: Vec<Entry>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    #[error("unreachable: {0}")]
    Unreachable(String),
    #[error("no answer within {}s", EXCHANGE_TIMEOUT.as_secs())]
    Timeout,
    #[error("the peer refused: {0}")]
    Refused(String),
    #[error("the peer's catalog is invalid: {0}")]
    Invalid(String),
}

/// Whether `text` may be shown as a service's description: bounded, one line, printable.
pub fn valid_description(text: &str) -> Result<(), String> {
    if text.chars().count() > MAX_DESCRIPTION {
        return Err(format!("at most {MAX_DESCRIPTION} characters"));
    }
    if text.chars().any(char::is_control) {
        return Err("one line of printable text (no control characters)".into());
    }
    Ok(())
}

impl Entry {
    /// Checks an entry received from a peer.
    fn check(&self) -> Result<(), String> {
        if !valid_service_name(&self.service) {
            return Err(format!("{:?} is not a service name", self.service));
        }
        if let Some(d) = &self.description {
            valid_description(d).map_err(|e| format!("{}: description: {e}", self.service))?;
        }
        if !matches!(self.backend.as_str(), "run" | "socket" | "url") {
            return Err(format!("{}: unknown backend kind", self.service));
        }
        if self.admitted_by.len() > 160 || self.admitted_by.chars().any(char::is_control) {
            return Err(format!("{}: admitted_by is not a principal", self.service));
        }
        Ok(())
    }
}

impl Answer {
    /// Parses and checks an answer line from a peer.
    pub fn parse(line: &[u8]) -> Result<Self, CatalogError> {
        let answer: Answer =
            serde_json::from_slice(line).map_err(|e| CatalogError::Invalid(e.to_string()))?;
        if let Some(error) = answer.error {
            return Err(CatalogError::Refused(error.chars().take(200).collect()));
        }
        if answer.services.len() > MAX_ENTRIES {
            return Err(CatalogError::Invalid(format!(
                "more than {MAX_ENTRIES} services"
            )));
        }
        let mut seen = std::collections::HashSet::new();
        for entry in &answer.services {
            entry.check().map_err(CatalogError::Invalid)?;
            if !seen.insert(entry.service.as_str()) {
                return Err(CatalogError::Invalid(format!(
                    "{} is listed twice",
                    entry.service
                )));
            }
        }
        Ok(answer)
    }
}

/// Asks `peer` for this node's catalog there.
pub async fn fetch(endpoint: &Endpoint, peer: EndpointId) -> Result<Vec<Entry>, CatalogError> {
    let exchange = async {
        let conn = endpoint
            .connect(peer, ALPN_CATALOG)
            .await
            .map_err(|e| CatalogError::Unreachable(e.to_string()))?;
        let result = ask(&conn).await;
        conn.close(VarInt::from_u32(0), b"done");
        result
    };
    tokio::time::timeout(EXCHANGE_TIMEOUT, exchange)
        .await
        .map_err(|_| CatalogError::Timeout)?
}

async fn ask(conn: &Connection) -> Result<Vec<Entry>, CatalogError> {
    let lost = |e: &dyn std::fmt::Display| CatalogError::Unreachable(e.to_string());
    let (mut send, recv) = conn.open_bi().await.map_err(|e| lost(&e))?;
    let mut line = serde_json::to_vec(&Request { catalog: VERSION })
        .map_err(|e| CatalogError::Invalid(e.to_string()))?;
    line.push(b'\n');
    send.write_all(&line).await.map_err(|e| lost(&e))?;
    send.finish().map_err(|e| lost(&e))?;
    let mut frames = mcpmesh_net::transport::FrameReader::new(recv, MAX_ANSWER);
    match frames.next_line().await {
        Ok(Some(line)) => Ok(Answer::parse(&line)?.services),
        Ok(None) => Err(CatalogError::Unreachable(
            "the peer closed the stream without an answer".into(),
        )),
        Err(mcpmesh_net::transport::TransportError::FrameTooLarge(_)) => Err(
            CatalogError::Invalid(format!("the answer is over {MAX_ANSWER} bytes")),
        ),
        Err(e) => Err(lost(&e)),
    }
}

/// Reads the asker's request line on the serving side: `Ok` when it is a request of this
/// revision.
pub fn read_request(line: &[u8]) -> Result<(), String> {
    let request: Request =
        serde_json::from_slice(line).map_err(|_| "the request is not a catalog request")?;
    if request.catalog != VERSION {
        return Err(format!("unsupported catalog revision {}", request.catalog));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(service: &str) -> Entry {
        Entry {
            service: service.into(),
            description: Some("Team notes".into()),
            backend: "run".into(),
            tools: Some(3),
            admitted_by: "group:eng".into(),
        }
    }

    #[test]
    fn an_answer_round_trips_and_its_entries_are_checked() {
        let answer = Answer {
            services: vec![entry("notes"), entry("files")],
            error: None,
        };
        let line = serde_json::to_vec(&answer).unwrap();
        assert_eq!(Answer::parse(&line).unwrap(), answer);
    }

    #[test]
    fn a_hostile_answer_is_refused_whole() {
        let bad = |answer: &Answer| Answer::parse(&serde_json::to_vec(answer).unwrap()).is_err();
        let mut e = entry("../etc");
        assert!(bad(&Answer {
            services: vec![e.clone()],
            error: None
        }));
        e = entry("notes");
        e.description = Some("x\u{1b}[2Jclear".into());
        assert!(bad(&Answer {
            services: vec![e.clone()],
            error: None
        }));
        e = entry("notes");
        e.description = Some("d".repeat(MAX_DESCRIPTION + 1));
        assert!(bad(&Answer {
            services: vec![e],
            error: None
        }));
        e = entry("notes");
        e.backend = "shell".into();
        assert!(bad(&Answer {
            services: vec![e],
            error: None
        }));
        assert!(bad(&Answer {
            services: vec![entry("notes"), entry("notes")],
            error: None
        }));
        assert!(bad(&Answer {
            services: (0..=MAX_ENTRIES).map(|i| entry(&format!("s{i}"))).collect(),
            error: None
        }));
        assert!(Answer::parse(b"[1,2]").is_err());
        assert!(matches!(
            Answer::parse(br#"{"error":"no"}"#),
            Err(CatalogError::Refused(_))
        ));
    }

    #[test]
    fn a_request_names_only_the_revision() {
        assert!(read_request(br#"{"catalog":1}"#).is_ok());
        assert!(read_request(br#"{"catalog":2}"#).is_err());
        // Asking for someone else's catalog is not a thing a request can say.
        assert!(read_request(br#"{"catalog":1,"for":"eid:00"}"#).is_err());
        assert!(read_request(b"hello").is_err());
    }
}
