//! Writing files so that a crash leaves the old content or the new, never a torn one.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

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
