//! The node's files on disk: private ones opened and created safely, trusted ones checked for
//! who may change them, and every write whole or not at all.
//!
//! A file or directory is *trusted* when it belongs to the running user (or root) and neither
//! its group nor others may write it — the rule OpenSSH applies to `~/.ssh`: anyone who can
//! write a profile's config decides what commands the node runs.

use std::fs::Metadata;
use std::io::Write;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::Path;

/// Why a file or directory of a profile is not trusted.
#[derive(Debug, thiserror::Error)]
pub enum Untrusted {
    #[error(
        "{path} is owned by another user (uid {owner}), so mcpmesh will not use it: another user's profile could run their commands as you. Use a profile of your own, or, if it is yours, run: chown -R $(id -u) {path}"
    )]
    Owner { path: String, owner: u32 },
    #[error(
        "{path} is writable by {who} (mode {mode:o}), so mcpmesh will not use it: another user could change what this node runs. Run: chmod go-w {path}"
    )]
    Writable {
        path: String,
        mode: u32,
        who: &'static str,
    },
    #[error("cannot check {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
}

/// Checks that what `meta` describes (the file at `path`) is the running user's (or root's)
/// and not writable by its group or others.
pub fn check_trusted(path: &Path, meta: &Metadata) -> Result<(), Untrusted> {
    let shown = || path.display().to_string();
    let me = rustix::process::geteuid().as_raw();
    if meta.uid() != me && meta.uid() != 0 {
        return Err(Untrusted::Owner {
            path: shown(),
            owner: meta.uid(),
        });
    }
    let mode = meta.mode() & 0o7777;
    // A socket's mode says nothing: who may reach it is the directory's business.
    if meta.file_type().is_symlink() || meta.file_type().is_socket() || mode & 0o022 == 0 {
        return Ok(());
    }
    Err(Untrusted::Writable {
        path: shown(),
        mode: mode & 0o777,
        who: if mode & 0o002 != 0 {
            "others"
        } else {
            "its group"
        },
    })
}

/// Checks `dir` and everything in it, `depth` levels down, with [`check_trusted`]; a link is
/// checked and so is what it points to. A `dir` that does not exist passes.
pub fn check_trusted_tree(dir: &Path, depth: usize) -> Result<(), Untrusted> {
    let io = |path: &Path| {
        let path = path.display().to_string();
        move |source| Untrusted::Io { path, source }
    };
    let meta = match std::fs::metadata(dir) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io(dir)(e)),
    };
    check_trusted(dir, &meta)?;
    if !meta.is_dir() {
        return Ok(());
    }
    for entry in std::fs::read_dir(dir).map_err(io(dir))? {
        let path = entry.map_err(io(dir))?.path();
        let meta = match std::fs::symlink_metadata(&path) {
            Ok(meta) => meta,
            // Gone between the listing and the look (a draft renamed into place).
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io(&path)(e)),
        };
        check_trusted(&path, &meta)?;
        if meta.file_type().is_symlink() {
            if let Ok(target) = std::fs::metadata(&path) {
                check_trusted(&path, &target)?;
            }
        } else if meta.is_dir() && depth > 0 {
            check_trusted_tree(&path, depth - 1)?;
        }
    }
    Ok(())
}

/// Writes `bytes` to a new file beside `path` and renames it over `path`: a reader sees the
/// old file or the new one, never half of either.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    drop(file);
    std::fs::rename(&tmp, path)?;
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// Creates `path` (mode `0600`) holding `bytes`, unless it exists: written whole under a name
/// of its own, synced, then linked into place, so nobody ever reads half of it and of two
/// processes creating it at once the first link wins. `false` when the file was already there
/// (the caller reads what is in it).
pub fn create_private_once(path: &Path, bytes: &[u8]) -> std::io::Result<bool> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let draft = path.with_file_name(format!(".{name}.{}.new", std::process::id()));
    let _ = std::fs::remove_file(&draft);
    let written = (|| {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&draft)?;
        file.write_all(bytes)?;
        file.sync_all()
    })();
    let linked = written.and_then(|()| std::fs::hard_link(&draft, path));
    let _ = std::fs::remove_file(&draft);
    match linked {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_private_file_is_created_once_whole_and_leaves_no_draft() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secret");
        assert!(create_private_once(&path, b"first\n").unwrap());
        assert!(!create_private_once(&path, b"second\n").unwrap());
        assert_eq!(std::fs::read(&path).unwrap(), b"first\n");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            1,
            "no draft left"
        );
    }
}
