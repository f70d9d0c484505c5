//! The config file of a profile: read whole, or edited in place and replaced atomically.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::files::write_atomically;

use super::schema::{Config, ConfigError, Settings};

/// The config file of a profile: read, and edited in place.
#[derive(Debug, Clone)]
pub struct ConfigFile {
    path: PathBuf,
    /// The digest of the text last loaded or written whole (shared by clones), so that
    /// `doctor` can tell a hand edit the node has not read.
    loaded: Arc<Mutex<Option<String>>>,
}

impl ConfigFile {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        ConfigFile {
            path: path.into(),
            loaded: Default::default(),
        }
    }

    /// The digest of the text this handle last loaded or wrote (`None`: neither yet).
    pub fn loaded_digest(&self) -> Option<String> {
        self.loaded
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The digest of the file as it is on disk now.
    pub fn digest_on_disk(&self) -> Result<String, ConfigError> {
        Ok(digest(&self.read_text()?))
    }

    fn loaded(&self, text: &str) {
        *self.loaded.lock().unwrap_or_else(|p| p.into_inner()) = Some(digest(text));
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file's text; empty when there is no file yet (every setting has a default). Read
    /// from the very file checked to be trusted ([`crate::files::Rule::Trusted`]).
    pub fn read_text(&self) -> Result<String, ConfigError> {
        use std::io::Read;
        let Some(mut file) = crate::files::open_checked(&self.path, crate::files::Rule::Trusted)?
        else {
            return Ok(String::new());
        };
        let mut text = String::new();
        file.read_to_string(&mut text)
            .map_err(|source| ConfigError::Read {
                path: self.shown(),
                source,
            })?;
        Ok(text)
    }

    pub fn load(&self) -> Result<Settings, ConfigError> {
        let text = self.read_text()?;
        let settings = Config::parse(&text, &self.shown())?;
        self.loaded(&text);
        Ok(settings)
    }

    /// Applies `change` to the document, validates the result and replaces the file
    /// atomically. Nothing is written when the result would be invalid. A running node edits
    /// on its writer thread ([`crate::disk`]).
    pub fn edit(
        &self,
        change: impl FnOnce(&mut toml_edit::DocumentMut) -> Result<(), String>,
    ) -> Result<Settings, ConfigError> {
        debug_assert!(
            crate::disk::may_write_here(),
            "config.toml is edited on an async runtime's thread: run the edit on the node's Disk"
        );
        let text = self.read_text()?;
        let mut doc: toml_edit::DocumentMut =
            text.parse()
                .map_err(|e: toml_edit::TomlError| ConfigError::Invalid {
                    path: self.shown(),
                    message: e.to_string(),
                })?;
        change(&mut doc).map_err(|message| ConfigError::Invalid {
            path: self.shown(),
            message,
        })?;
        let new_text = doc.to_string();
        let settings = Config::parse(&new_text, &self.shown())?;
        write_atomically(&self.path, new_text.as_bytes()).map_err(|source| ConfigError::Write {
            path: self.shown(),
            source,
        })?;
        // A hand edit made since the last load is in `text`, and now applied with the rest.
        self.loaded(&new_text);
        Ok(settings)
    }

    fn shown(&self) -> String {
        self.path.display().to_string()
    }
}

/// A config text's digest (BLAKE3, hex).
fn digest(text: &str) -> String {
    blake3::hash(text.as_bytes()).to_hex().to_string()
}
