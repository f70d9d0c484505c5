//! The device key (and the org root key, kept the same way): minted on first run, kept
//! `0600`, never logged.

use std::path::Path;

use iroh::SecretKey;

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("cannot create the key {path}: {source}")]
    Create {
        path: String,
        source: std::io::Error,
    },
    /// A link, another user's file, or a file others may read: never used.
    #[error(transparent)]
    Unsafe(#[from] crate::files::Untrusted),
    #[error("the key {path} is damaged (expected 64 hex characters)")]
    Malformed { path: String },
}

/// Longer than any key file this module writes.
const MAX_LEN: u64 = 256;

/// Loads the device key, minting and storing it (`0600`) if there is none yet.
pub fn load_or_create(path: &Path) -> Result<SecretKey, KeyError> {
    match load(path)? {
        Some(key) => Ok(key),
        None => create(path),
    }
}

/// Loads a key kept as a secret ([`crate::files::Rule::Secret`]) in hex; `None` when there is
/// no file.
pub fn load(path: &Path) -> Result<Option<SecretKey>, KeyError> {
    let Some(bytes) = crate::files::read_secret(path, MAX_LEN)? else {
        return Ok(None);
    };
    let malformed = || KeyError::Malformed {
        path: path.display().to_string(),
    };
    let text = std::str::from_utf8(&bytes).map_err(|_| malformed())?;
    parse_hex(text.trim()).map(Some).ok_or_else(malformed)
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
    use std::os::unix::fs::PermissionsExt;

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
    fn a_key_readable_by_others_is_refused_with_the_chmod_to_run_and_not_shown() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("device.key");
        load_or_create(&path).unwrap();
        let hex = std::fs::read_to_string(&path).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = load_or_create(&path).unwrap_err().to_string();
        assert!(e.contains(&format!("chmod 600 {}", path.display())), "{e}");
        assert!(!e.contains(hex.trim()), "{e}");
    }

    #[test]
    fn a_link_planted_at_the_key_path_is_refused_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let elsewhere = dir.path().join("someone-elses.key");
        load_or_create(&elsewhere).unwrap();
        let path = dir.path().join("device.key");
        std::os::unix::fs::symlink(&elsewhere, &path).unwrap();
        let e = load(&path).map(|k| k.map(|k| k.public())).unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
        assert!(
            std::fs::symlink_metadata(&path)
                .unwrap()
                .file_type()
                .is_symlink(),
            "nothing was written in the link's place"
        );
    }
}
