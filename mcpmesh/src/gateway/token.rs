//! The gateway's bearer token: minted once per profile (32 random bytes, URL-safe base64) and
//! kept `0600` beside the device key, so it stays the same across gateway restarts and the
//! clients configured with it keep working. Never logged.

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// Longer than any token this module mints or a person would write.
const MAX_LEN: u64 = 4096;

#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("cannot read the gateway token {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot store a new gateway token in {path}: {source}")]
    Create {
        path: String,
        source: std::io::Error,
    },
    #[error(
        "the gateway token {path} is readable by others (mode {mode:o}), so it may have leaked: delete it to get a new one, or run: chmod 600 {path}"
    )]
    Permissions { path: String, mode: u32 },
    #[error("the gateway token {path} is damaged: delete it and a new one is minted")]
    Malformed { path: String },
    #[error("no randomness for a gateway token: {0}")]
    Random(String),
}

/// The token in `path`, minted and stored (`0600`) if there is none yet.
pub fn load_or_mint(path: &Path) -> Result<String, TokenError> {
    match std::fs::File::open(path) {
        Ok(file) => read(path, file),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => mint(path),
        Err(source) => Err(TokenError::Read {
            path: path.display().to_string(),
            source,
        }),
    }
}

fn read(path: &Path, file: std::fs::File) -> Result<String, TokenError> {
    let shown = || path.display().to_string();
    let failed = |source| TokenError::Read {
        path: shown(),
        source,
    };
    let mode = file.metadata().map_err(failed)?.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(TokenError::Permissions {
            path: shown(),
            mode,
        });
    }
    let mut text = String::new();
    file.take(MAX_LEN)
        .read_to_string(&mut text)
        .map_err(|_| TokenError::Malformed { path: shown() })?;
    let token = text.trim();
    // What goes in an `Authorization` header as it is: visible ASCII, no spaces.
    if token.is_empty() || !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(TokenError::Malformed { path: shown() });
    }
    Ok(token.to_owned())
}

fn mint(path: &Path) -> Result<String, TokenError> {
    let failed = |source| TokenError::Create {
        path: path.display().to_string(),
        source,
    };
    let mut raw = [0u8; 32];
    getrandom::fill(&mut raw).map_err(|e| TokenError::Random(e.to_string()))?;
    let token = data_encoding::BASE64URL_NOPAD.encode(&raw);
    // Of two minting at once (a gateway and `mcpmesh use`) the first wins and the other reads
    // what it wrote.
    if crate::files::create_private_once(path, format!("{token}\n").as_bytes()).map_err(failed)? {
        return Ok(token);
    }
    let file = std::fs::File::open(path).map_err(failed)?;
    read(path, file)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_minted_private_and_kept_across_loads() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gateway.token");
        let token = load_or_mint(&path).unwrap();
        assert_eq!(token.len(), 43, "{token}");
        assert!(
            token
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        );
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(load_or_mint(&path).unwrap(), token);
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            1,
            "no draft left"
        );
        let other = tempfile::tempdir().unwrap();
        assert_ne!(load_or_mint(&other.path().join("t")).unwrap(), token);
    }

    #[test]
    fn a_token_others_can_read_or_a_damaged_one_is_refused_without_showing_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gateway.token");
        let token = load_or_mint(&path).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = load_or_mint(&path).unwrap_err().to_string();
        assert!(
            e.contains("readable by others") && e.contains("chmod 600"),
            "{e}"
        );
        assert!(!e.contains(&token), "{e}");

        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::write(&path, "two words\n").unwrap();
        let e = load_or_mint(&path).unwrap_err().to_string();
        assert!(e.contains("damaged") && !e.contains("words"), "{e}");
    }
}
