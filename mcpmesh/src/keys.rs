//! The device key (and the org root key, kept the same way): minted on first run, kept
//! `0600`, never logged.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use iroh::SecretKey;

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("cannot read the device key {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot create the device key {path}: {source}")]
    Create {
        path: String,
        source: std::io::Error,
    },
    #[error("the device key {path} is readable by others (mode {mode:o}); run: chmod 600 {path}")]
    Permissions { path: String, mode: u32 },
    #[error("the device key {path} is damaged (expected 64 hex characters)")]
    Malformed { path: String },
}

/// Loads the device key, minting and storing it (`0600`) if there is none yet.
pub fn load_or_create(path: &Path) -> Result<SecretKey, KeyError> {
    match load(path)? {
        Some(key) => Ok(key),
        None => create(path),
    }
}

/// Loads a key kept `0600` as hex; `None` when there is no file.
pub fn load(path: &Path) -> Result<Option<SecretKey>, KeyError> {
    let shown = path.display().to_string();
    match std::fs::metadata(path) {
        Ok(meta) => {
            let mode = meta.permissions().mode() & 0o777;
            if mode & 0o077 != 0 {
                return Err(KeyError::Permissions { path: shown, mode });
            }
            let text = std::fs::read_to_string(path).map_err(|source| KeyError::Read {
                path: shown.clone(),
                source,
            })?;
            parse_hex(text.trim())
                .map(Some)
                .ok_or(KeyError::Malformed { path: shown })
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(KeyError::Read {
            path: shown,
            source,
        }),
    }
}

fn create(path: &Path) -> Result<SecretKey, KeyError> {
    let key = SecretKey::generate();
    // A crash never leaves half a key; of two nodes starting at once, the first key wins.
    if store_new(path, &key)? {
        Ok(key)
    } else {
        load_or_create(path)
    }
}

/// Writes `key` to `path` (`0600`, whole or not at all) unless a file is there already;
/// `false` when one was.
pub fn store_new(path: &Path, key: &SecretKey) -> Result<bool, KeyError> {
    let hex = data_encoding::HEXLOWER.encode(&key.to_bytes());
    crate::files::create_private_once(path, format!("{hex}\n").as_bytes()).map_err(|source| {
        KeyError::Create {
            path: path.display().to_string(),
            source,
        }
    })
}

/// A secret key from 64 hex characters.
pub fn parse_hex(text: &str) -> Option<SecretKey> {
    let bytes: [u8; 32] = data_encoding::HEXLOWER_PERMISSIVE
        .decode(text.as_bytes())
        .ok()?
        .try_into()
        .ok()?;
    Some(SecretKey::from_bytes(&bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_minted_key_is_private_and_stable() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("device.key");
        let first = load_or_create(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(load_or_create(&path).unwrap().public(), first.public());
    }

    #[test]
    fn a_key_readable_by_others_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("device.key");
        load_or_create(&path).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(matches!(
            load_or_create(&path),
            Err(KeyError::Permissions { .. })
        ));
    }
}
