//! The node's files on disk: private ones opened and created safely, trusted ones checked for
//! who may change them, and every write whole or not at all.
//!
//! A file or directory is *trusted* when it belongs to the running user (or root) and neither
//! its group nor others may write it — the rule OpenSSH applies to `~/.ssh`: anyone who can
//! write a profile's config decides what commands the node runs. A *secret* (a key, a token)
//! is stricter: a regular file of the running user's own that nobody else may read or write,
//! never reached through a link.
//!
//! A file is opened once and checked on the descriptor it was opened as (`fstat`), then read
//! from that descriptor: what is read is what was checked, whatever happens to the path in
//! between. A new file is written under a name of its own, created exclusive at `0600` (never
//! a file someone placed there beforehand), synced, then renamed or linked into place.

use std::fs::{File, Metadata, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// What a file must be for the node to use it: the one place the owners and modes it accepts
/// are decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// A key, a token, the store: the running user's, nobody else may read or write it, and
    /// it is never opened through a link.
    Secret,
    /// Config and the node's log: the running user's (or root's), and nobody else may write
    /// it. Read with [`open_checked`], a link is followed (a config kept with one's dotfiles)
    /// and the file it leads to is the one checked; the log is never appended through one.
    Trusted,
}

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
    #[error(
        "{path} holds a secret but is owned by another user (uid {owner}), so mcpmesh will not use it. If it is yours, run: chown $(id -u) {path}"
    )]
    NotYours { path: String, owner: u32 },
    #[error(
        "{path} holds a secret but is {exposure}, so mcpmesh will not use it. Run: chmod 600 {path}"
    )]
    Exposed { path: String, exposure: Exposure },
    #[error(
        "{path} is a symbolic link, so mcpmesh will not use it: its keys, tokens, store and log are files of their own. Remove the link (rm {path}), or put the file itself there"
    )]
    Link { path: String },
    #[error("{path} is not a regular file, so mcpmesh will not use it; move it away")]
    NotAFile { path: String },
    #[error("cannot check {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
}

/// Checks what `meta` describes (the file at `path`) against `rule`. Whether it is a regular
/// file is the business of whoever opened it.
pub fn check(path: &Path, meta: &Metadata, rule: Rule) -> Result<(), Untrusted> {
    match rule {
        Rule::Trusted => check_trusted(path, meta),
        Rule::Secret => check_secret(path, meta),
    }
}

fn check_secret(path: &Path, meta: &Metadata) -> Result<(), Untrusted> {
    let shown = || path.display().to_string();
    if meta.uid() != rustix::process::geteuid().as_raw() {
        return Err(Untrusted::NotYours {
            path: shown(),
            owner: meta.uid(),
        });
    }
    match exposure(meta) {
        None => Ok(()),
        Some(exposure) => Err(Untrusted::Exposed {
            path: shown(),
            exposure,
        }),
    }
}

/// How a file is open to others than its owner, said as "readable by others (mode 644)".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exposure {
    /// The permission bits (`0o777`).
    pub mode: u32,
    how: &'static str,
    who: &'static str,
}

impl std::fmt::Display for Exposure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} by {} (mode {:o})", self.how, self.who, self.mode)
    }
}

/// How anyone but its owner may read or write what `meta` describes; `None` when nobody may:
/// what a secret (and the control socket) must be.
pub fn exposure(meta: &Metadata) -> Option<Exposure> {
    let mode = meta.mode() & 0o777;
    if mode & 0o077 == 0 {
        return None;
    }
    Some(Exposure {
        mode,
        how: if mode & 0o044 != 0 {
            "readable"
        } else {
            "writable"
        },
        who: if mode & 0o007 != 0 {
            "others"
        } else {
            "its group"
        },
    })
}

/// `O_NOFOLLOW`: the open fails (`ELOOP`) when the last component is a link.
fn no_follow() -> i32 {
    rustix::fs::OFlags::NOFOLLOW.bits() as i32
}

/// Maps an open's failure: a link refused by `O_NOFOLLOW` is named as one.
fn open_error(path: &Path, e: std::io::Error) -> Untrusted {
    let path = path.display().to_string();
    if e.raw_os_error() == Some(rustix::io::Errno::LOOP.raw_os_error()) {
        return Untrusted::Link { path };
    }
    Untrusted::Io { path, source: e }
}

/// Checks the file just opened, on its descriptor.
fn checked(path: &Path, file: File, rule: Rule) -> Result<File, Untrusted> {
    let meta = file.metadata().map_err(|source| Untrusted::Io {
        path: path.display().to_string(),
        source,
    })?;
    if !meta.is_file() {
        return Err(Untrusted::NotAFile {
            path: path.display().to_string(),
        });
    }
    check(path, &meta, rule)?;
    Ok(file)
}

/// Opens `path` for reading as `rule` says (a secret never through a link) and checks the
/// opened file itself; `None` when there is none. Read from the returned file: it is the one
/// that was checked.
pub fn open_checked(path: &Path, rule: Rule) -> Result<Option<File>, Untrusted> {
    let mut options = OpenOptions::new();
    options.read(true);
    // Not blocked by a FIFO planted in the file's place: it is opened, then refused.
    let mut flags = rustix::fs::OFlags::NONBLOCK.bits() as i32;
    if rule == Rule::Secret {
        flags |= no_follow();
    }
    match options.custom_flags(flags).open(path) {
        Ok(file) => checked(path, file, rule).map(Some),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(open_error(path, e)),
    }
}

/// The first `limit` bytes of the secret at `path`, read from the descriptor that was checked;
/// `None` when there is no file.
pub fn read_secret(path: &Path, limit: u64) -> Result<Option<Vec<u8>>, Untrusted> {
    let Some(file) = open_checked(path, Rule::Secret)? else {
        return Ok(None);
    };
    let mut bytes = Vec::new();
    file.take(limit)
        .read_to_end(&mut bytes)
        .map_err(|source| Untrusted::Io {
            path: path.display().to_string(),
            source,
        })?;
    Ok(Some(bytes))
}

/// Opens `path` for reading and writing in place (created `0600` if missing), never through a
/// link, and checks the opened file as a secret: the node's store.
pub fn open_private_rw(path: &Path) -> Result<File, Untrusted> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(no_follow())
        .open(path)
        .map_err(|e| open_error(path, e))?;
    checked(path, file, Rule::Secret)
}

/// Opens `path` for appending (created `0600` if missing), never through a link, and checks the
/// opened file as `rule` says: the node's log, whose lines must not land in another file.
pub fn open_append(path: &Path, rule: Rule) -> Result<File, Untrusted> {
    let file = OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .custom_flags(no_follow())
        .open(path)
        .map_err(|e| open_error(path, e))?;
    checked(path, file, rule)
}

/// Checks that what `meta` describes (the file at `path`) is the running user's (or root's)
/// and not writable by its group or others.
pub fn check_trusted(path: &Path, meta: &Metadata) -> Result<(), Untrusted> {
    check_trusted_as(rustix::process::geteuid().as_raw(), path, meta)
}

/// [`check_trusted`] for the user `me`.
fn check_trusted_as(me: u32, path: &Path, meta: &Metadata) -> Result<(), Untrusted> {
    let shown = || path.display().to_string();
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
    check_tree_as(rustix::process::geteuid().as_raw(), dir, depth)
}

/// [`check_trusted_tree`] for the user `me`. Each entry is looked at from its directory's open
/// handle (`fstatat`), not by its whole path again: every verb checks its profile, so this is
/// on the path of each `connect`'s start.
fn check_tree_as(me: u32, dir: &Path, depth: usize) -> Result<(), Untrusted> {
    let io = |path: &Path| {
        let path = path.display().to_string();
        move |source| Untrusted::Io { path, source }
    };
    let meta = match std::fs::metadata(dir) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io(dir)(e)),
    };
    check_trusted_as(me, dir, &meta)?;
    if !meta.is_dir() {
        return Ok(());
    }
    for entry in std::fs::read_dir(dir).map_err(io(dir))? {
        let entry = entry.map_err(io(dir))?;
        let path = entry.path();
        // Of the entry itself, a link not followed.
        let meta = match entry.metadata() {
            Ok(meta) => meta,
            // Gone between the listing and the look (a draft renamed into place).
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io(&path)(e)),
        };
        check_trusted_as(me, &path, &meta)?;
        if meta.file_type().is_symlink() {
            if let Ok(target) = std::fs::metadata(&path) {
                check_trusted_as(me, &path, &target)?;
            }
        } else if meta.is_dir() && depth > 0 {
            check_tree_as(me, &path, depth - 1)?;
        }
    }
    Ok(())
}

/// The name a new version of `path` is written under before it takes `path`'s place: one per
/// process and thread, so two writers never share one.
fn draft_path(path: &Path, tag: &str) -> PathBuf {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    thread_local! {
        static THREAD: u64 = NEXT.fetch_add(1, Ordering::Relaxed);
    }
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let thread = THREAD.with(|t| *t);
    path.with_file_name(format!(".{name}.{}.{thread}.{tag}", std::process::id()))
}

/// Creates the draft of `path` afresh (exclusive, `0600`), writes `bytes` to it and, when
/// `durable`, syncs it. Whatever was at the draft's name before (a crash's leftover, a file or
/// link someone placed there) is removed, never written through or reused with its mode.
fn write_draft(path: &Path, tag: &str, bytes: &[u8], durable: bool) -> std::io::Result<PathBuf> {
    let draft = draft_path(path, tag);
    let create = || {
        OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&draft)
    };
    let mut file = match create() {
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            std::fs::remove_file(&draft)?;
            create()?
        }
        opened => opened?,
    };
    let written = file
        .write_all(bytes)
        .and_then(|()| if durable { file.sync_all() } else { Ok(()) });
    if let Err(e) = written {
        let _ = std::fs::remove_file(&draft);
        return Err(e);
    }
    Ok(draft)
}

/// Writes `bytes` to a new file beside `path` and renames it over `path`: a reader sees the
/// old file or the new one, never half of either. The new file is `0600` and synced, and so is
/// the rename.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    replace(path, bytes, true)
}

/// [`write_atomically`] without waiting for the disk: whole or not at all for every reader,
/// but a power cut may leave the old file.
pub fn write_atomically_unsynced(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    replace(path, bytes, false)
}

fn replace(path: &Path, bytes: &[u8], durable: bool) -> std::io::Result<()> {
    let draft = write_draft(path, "tmp", bytes, durable)?;
    if let Err(e) = std::fs::rename(&draft, path) {
        let _ = std::fs::remove_file(&draft);
        return Err(e);
    }
    if durable && let Ok(dir) = File::open(path.parent().unwrap_or(Path::new("."))) {
        let _ = dir.sync_all();
    }
    Ok(())
}

/// Creates `path` (mode `0600`) holding `bytes`, unless it exists: written whole under a name
/// of its own, synced, then linked into place, so nobody ever reads half of it and of two
/// processes creating it at once the first link wins. `false` when the file was already there
/// (the caller reads what is in it).
pub fn create_private_once(path: &Path, bytes: &[u8]) -> std::io::Result<bool> {
    let draft = write_draft(path, "new", bytes, true)?;
    // A link made without following: a link planted at `path` counts as a file there.
    let linked = std::fs::hard_link(&draft, path);
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

    fn mode(path: &Path) -> u32 {
        std::fs::symlink_metadata(path)
            .unwrap()
            .permissions()
            .mode()
            & 0o777
    }

    #[test]
    fn a_tree_is_refused_for_what_others_may_write_down_to_its_depth_links_followed() {
        let base = tempfile::tempdir().unwrap();
        let top = base.path().join("profile");
        let deep = top.join("state").join("audit");
        std::fs::create_dir_all(&deep).unwrap();
        for dir in [&top, &top.join("state"), &deep] {
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        }
        let file = deep.join("audit.jsonl");
        std::fs::write(&file, b"").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(check_trusted_tree(&top, 2).is_ok());
        assert!(check_trusted_tree(&base.path().join("absent"), 2).is_ok());

        // Two levels down: seen with depth 2, not with depth 1.
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o620)).unwrap();
        match check_trusted_tree(&top, 2) {
            Err(Untrusted::Writable { path, who, .. }) => {
                assert_eq!(path, file.display().to_string());
                assert_eq!(who, "its group");
            }
            other => panic!("{other:?}"),
        }
        assert!(check_trusted_tree(&top, 1).is_ok());
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();

        // A link is fine as a link, and refused for what it leads to.
        let outside = base.path().join("shared.toml");
        std::fs::write(&outside, b"").unwrap();
        std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o666)).unwrap();
        std::os::unix::fs::symlink(&outside, top.join("config.toml")).unwrap();
        match check_trusted_tree(&top, 2) {
            Err(Untrusted::Writable { path, who, .. }) => {
                assert_eq!(path, top.join("config.toml").display().to_string());
                assert_eq!(who, "others");
            }
            other => panic!("{other:?}"),
        }
        std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(check_trusted_tree(&top, 2).is_ok());
    }

    #[test]
    fn a_temp_file_planted_beforehand_does_not_make_the_written_file_readable() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.toml");
        let planted = draft_path(&path, "tmp");
        std::fs::write(&planted, b"planted").unwrap();
        std::fs::set_permissions(&planted, std::fs::Permissions::from_mode(0o666)).unwrap();
        write_atomically(&path, b"secret = 1\n").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"secret = 1\n");
        assert_eq!(mode(&path), 0o600, "the written file is private");
    }

    #[test]
    fn a_link_planted_as_the_temp_file_is_not_written_through() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("udp-port");
        let elsewhere = dir.path().join("elsewhere");
        std::fs::write(&elsewhere, b"untouched").unwrap();
        std::os::unix::fs::symlink(&elsewhere, draft_path(&path, "tmp")).unwrap();
        write_atomically(&path, b"4242\n").unwrap();
        assert_eq!(std::fs::read(&elsewhere).unwrap(), b"untouched");
        assert_eq!(std::fs::read(&path).unwrap(), b"4242\n");
        assert_eq!(mode(&path), 0o600);
    }

    #[test]
    fn a_secret_is_read_from_the_descriptor_that_was_checked_even_if_the_path_is_swapped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("device.key");
        std::fs::write(&path, b"the checked one").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let mut file = open_checked(&path, Rule::Secret).unwrap().unwrap();
        // Swapped after the check: a file anyone may read takes the path.
        let other = dir.path().join("other");
        std::fs::write(&other, b"a swapped one").unwrap();
        std::fs::set_permissions(&other, std::fs::Permissions::from_mode(0o644)).unwrap();
        std::fs::rename(&other, &path).unwrap();
        let mut read = String::new();
        file.read_to_string(&mut read).unwrap();
        assert_eq!(read, "the checked one");
        // Opened anew, the swapped file is checked, and refused.
        let e = open_checked(&path, Rule::Secret).unwrap_err().to_string();
        assert!(e.contains("chmod 600"), "{e}");
    }

    #[test]
    fn a_secret_is_refused_through_a_link_as_a_fifo_or_owned_by_another_user() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target");
        std::fs::write(&target, b"k").unwrap();
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o600)).unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let e = read_secret(&link, 64).unwrap_err();
        assert!(matches!(e, Untrusted::Link { .. }), "{e}");
        assert!(e.to_string().contains("symbolic link"), "{e}");
        // A config may be a link: the file it leads to is the one checked.
        assert!(open_checked(&link, Rule::Trusted).unwrap().is_some());

        let fifo = dir.path().join("fifo");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        let e = read_secret(&fifo, 64).unwrap_err();
        assert!(matches!(e, Untrusted::NotAFile { .. }), "{e}");

        if rustix::process::geteuid().is_root() {
            rustix::fs::chown(&target, Some(rustix::process::Uid::from_raw(65534)), None).unwrap();
            let e = read_secret(&target, 64).unwrap_err().to_string();
            assert!(
                e.contains("owned by another user") && e.contains("chown"),
                "{e}"
            );
        }
        assert_eq!(read_secret(&dir.path().join("none"), 64).unwrap(), None);
    }

    #[test]
    fn a_file_open_to_others_says_who_may_do_what() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"x").unwrap();
        let said = |mode| {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            exposure(&std::fs::metadata(&path).unwrap()).map(|e| e.to_string())
        };
        assert_eq!(said(0o600), None);
        assert_eq!(said(0o700), None);
        assert_eq!(
            said(0o644).as_deref(),
            Some("readable by others (mode 644)")
        );
        assert_eq!(
            said(0o640).as_deref(),
            Some("readable by its group (mode 640)")
        );
        assert_eq!(
            said(0o620).as_deref(),
            Some("writable by its group (mode 620)")
        );
        let e = read_secret(&path, 64).unwrap_err().to_string();
        assert!(e.contains("is writable by its group (mode 620), so"), "{e}");
    }

    #[test]
    fn the_log_is_not_appended_through_a_link() {
        let dir = tempfile::tempdir().unwrap();
        let elsewhere = dir.path().join("elsewhere");
        std::fs::write(&elsewhere, b"untouched").unwrap();
        let log = dir.path().join("mcpmesh.log");
        std::os::unix::fs::symlink(&elsewhere, &log).unwrap();
        let e = open_append(&log, Rule::Trusted).unwrap_err();
        assert!(matches!(e, Untrusted::Link { .. }), "{e}");
        let fresh = open_append(&dir.path().join("new.log"), Rule::Trusted).unwrap();
        assert_eq!(
            fresh.metadata().unwrap().permissions().mode() & 0o777,
            0o600
        );
    }

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
