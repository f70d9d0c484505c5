//! The org root key on the admin's node, and the file that moves it to a new admin node.
//!
//! The key signs rosters and nothing else; it is never sent to a peer and never used as a
//! transport identity. `org export-root` writes it with the current roster into one `0600`
//! file; `org import-root` takes that file on another node, which then signs the next serial.

use std::path::Path;

use iroh::SecretKey;
use serde::{Deserialize, Serialize};

use super::{RosterError, SignedRoster};

/// The export file: the key, and the roster it last signed (so the next serial is known).
#[derive(Serialize, Deserialize)]
pub struct RootExport {
    pub mcpmesh_org_root: u32,
    pub org: String,
    /// The root secret key, hex.
    pub secret: String,
    /// The last roster signed, in its wire form.
    pub roster: String,
}

impl std::fmt::Debug for RootExport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RootExport")
            .field("org", &self.org)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("cannot write {path}: {source}")]
    Write {
        path: String,
        source: std::io::Error,
    },
    #[error("{0} exists already; pick a new file name")]
    Exists(String),
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{0} is not an mcpmesh org root export")]
    NotAnExport(String),
    /// A link, another user's file, or a file others may read: never used.
    #[error(transparent)]
    Unsafe(#[from] crate::files::Untrusted),
    #[error("the roster in the export does not match its key: {0}")]
    Roster(RosterError),
}

/// Writes the export, `0600`, refusing to overwrite a file.
pub fn export(path: &Path, key: &SecretKey, roster: &SignedRoster) -> Result<(), ExportError> {
    let body = RootExport {
        mcpmesh_org_root: 1,
        org: roster.roster.org.clone(),
        secret: data_encoding::HEXLOWER.encode(&key.to_bytes()),
        roster: roster.text.clone(),
    };
    let text = serde_json::to_string_pretty(&body).unwrap_or_default();
    let shown = path.display().to_string();
    match crate::files::create_private_once(path, text.as_bytes()) {
        Ok(true) => Ok(()),
        Ok(false) => Err(ExportError::Exists(shown)),
        Err(source) => Err(ExportError::Write {
            path: shown,
            source,
        }),
    }
}

/// Reads an export: the key, and the roster it signed (verified under that key).
pub fn import(path: &Path) -> Result<(SecretKey, SignedRoster), ExportError> {
    let shown = path.display().to_string();
    let limit = (super::MAX_ROSTER_BYTES * 2) as u64;
    let bytes = crate::files::read_secret(path, limit + 1)?.ok_or_else(|| ExportError::Read {
        path: shown.clone(),
        source: std::io::Error::from(std::io::ErrorKind::NotFound),
    })?;
    if bytes.len() as u64 > limit {
        return Err(ExportError::NotAnExport(shown));
    }
    let text = String::from_utf8(bytes).map_err(|_| ExportError::NotAnExport(shown.clone()))?;
    let body: RootExport =
        serde_json::from_str(&text).map_err(|_| ExportError::NotAnExport(shown.clone()))?;
    let key = crate::keys::parse_hex(&body.secret)
        .filter(|_| body.mcpmesh_org_root == 1)
        .ok_or_else(|| ExportError::NotAnExport(shown.clone()))?;
    let roster =
        SignedRoster::open(body.roster.as_bytes(), &key.public()).map_err(ExportError::Roster)?;
    Ok((key, roster))
}
