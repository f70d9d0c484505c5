//! Where a node keeps its files: one directory with `MCPMESH_HOME`, XDG paths otherwise.

use std::path::{Path, PathBuf};

/// The environment variable that puts all of a node's state under one directory.
pub const HOME_ENV: &str = "MCPMESH_HOME";

/// The files of one node (one profile).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Profile {
    /// `config.toml` and the device key.
    pub config_dir: PathBuf,
    /// Logs, the persisted port, later the store and the audit log.
    pub state_dir: PathBuf,
    /// The control socket and the daemon lock.
    pub runtime_dir: PathBuf,
    /// Set when the profile is one directory (`MCPMESH_HOME` or `--home`).
    pub home: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
#[error("cannot tell where this node's files live: set MCPMESH_HOME or HOME")]
pub struct NoHome;

impl Profile {
    /// `home` (from `--home`) wins over `MCPMESH_HOME`, which wins over the XDG defaults.
    pub fn resolve(home: Option<PathBuf>) -> Result<Self, NoHome> {
        if let Some(home) = home.or_else(|| env_path(HOME_ENV)) {
            return Ok(Self::at(home));
        }
        let user_home = env_path("HOME").ok_or(NoHome)?;
        let config = env_path("XDG_CONFIG_HOME").unwrap_or_else(|| user_home.join(".config"));
        let state = env_path("XDG_STATE_HOME").unwrap_or_else(|| user_home.join(".local/state"));
        let state_dir = state.join("mcpmesh");
        let runtime_dir = env_path("XDG_RUNTIME_DIR")
            .map(|d| d.join("mcpmesh"))
            .unwrap_or_else(|| state_dir.clone());
        Ok(Profile {
            config_dir: config.join("mcpmesh"),
            state_dir,
            runtime_dir,
            home: None,
        })
    }

    /// A profile that keeps everything under `home`.
    pub fn at(home: impl Into<PathBuf>) -> Self {
        let home = absolute(home.into());
        Profile {
            config_dir: home.clone(),
            state_dir: home.join("state"),
            runtime_dir: home.clone(),
            home: Some(home),
        }
    }

    /// Whether this profile was ever created: it has a config file, a device key or a state
    /// directory (an audit log copied aside for checking is one).
    pub fn exists(&self) -> bool {
        self.config_file().exists() || self.key_file().exists() || self.state_dir.is_dir()
    }

    pub fn config_file(&self) -> PathBuf {
        self.config_dir.join("config.toml")
    }

    pub fn key_file(&self) -> PathBuf {
        self.config_dir.join("device.key")
    }

    /// The org root key, on the admin's node only: the one file to back up.
    pub fn org_root_file(&self) -> PathBuf {
        self.config_dir.join("org-root.key")
    }

    /// The bearer token HTTP clients of `mcpmesh gateway` send, beside the device key.
    pub fn gateway_token_file(&self) -> PathBuf {
        self.config_dir.join("gateway.token")
    }

    /// The OAuth grants of `url` services (`0600` files, one per service), kept like keys.
    pub fn oauth_dir(&self) -> PathBuf {
        self.config_dir.join("oauth")
    }

    /// The status page's token (`0600`), apart from the gateway's: it only lets one look.
    pub fn status_token_file(&self) -> PathBuf {
        self.config_dir.join("status.token")
    }

    pub fn socket_path(&self) -> PathBuf {
        self.runtime_dir.join("mcpmesh.sock")
    }

    pub fn lock_file(&self) -> PathBuf {
        self.runtime_dir.join("daemon.lock")
    }

    pub fn log_file(&self) -> PathBuf {
        self.state_dir.join("mcpmesh.log")
    }

    /// The embedded store: peers met by pairing, invites, pairings.
    pub fn store_file(&self) -> PathBuf {
        self.state_dir.join("mcpmesh.redb")
    }

    /// The audit log's month files and head.
    pub fn audit_dir(&self) -> PathBuf {
        self.state_dir.join("audit")
    }

    /// The UDP port picked on first start, reused so address hints stay valid.
    pub fn port_file(&self) -> PathBuf {
        self.state_dir.join("udp-port")
    }

    /// Checks that the profile's directories and everything in them belong to the user and
    /// that nobody else may write them: a profile another user made or can change would run
    /// that user's config (its services' commands) as this one.
    pub fn check_trusted(&self) -> Result<(), crate::files::Untrusted> {
        let dirs = [&self.config_dir, &self.state_dir, &self.runtime_dir];
        for (i, dir) in dirs.iter().enumerate() {
            // A `--home` profile's config and runtime directories are one: checked once.
            if !dirs[..i].contains(dir) {
                crate::files::check_trusted_tree(dir, 2)?;
            }
        }
        Ok(())
    }

    /// Creates the profile's directories, private to the user.
    pub fn create_dirs(&self) -> std::io::Result<()> {
        for dir in [&self.config_dir, &self.state_dir, &self.runtime_dir] {
            create_private_dir(dir)?;
        }
        Ok(())
    }
}

fn env_path(name: &str) -> Option<PathBuf> {
    std::env::var_os(name)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

fn absolute(path: PathBuf) -> PathBuf {
    std::path::absolute(&path).unwrap_or(path)
}

pub fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_home_profile_keeps_everything_under_it() {
        let p = Profile::at("/tmp/x");
        for path in [
            p.config_file(),
            p.key_file(),
            p.gateway_token_file(),
            p.status_token_file(),
            p.socket_path(),
            p.log_file(),
            p.port_file(),
        ] {
            assert!(path.starts_with("/tmp/x"), "{path:?}");
        }
    }
}
