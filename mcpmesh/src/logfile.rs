//! The node's own log file, bounded in size: when the file would pass [`LogFile::max_bytes`],
//! it becomes `mcpmesh.log.1` (the older ones shift to `.2`, … up to [`KEEP`]; the oldest is
//! dropped) and a new file is started. The process's stderr follows the current file, so what
//! is written there without going through the log (a panic's message) lands beside the log
//! lines and is rotated with them.
//!
//! Ours, not tracing-appender's: that rotates on a schedule, not by size, and neither opens the
//! file private and never through a link ([`crate::files::open_append`]) nor moves stderr along.

use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// How large the log grows before it is rotated, unless `MCPMESH_LOG_MAX_BYTES` says.
pub const DEFAULT_MAX_BYTES: u64 = 10 * 1024 * 1024;
/// How many rotated files are kept beside the current one.
pub const KEEP: usize = 3;
/// The environment variable that sets the rotation size in bytes.
pub const MAX_BYTES_ENV: &str = "MCPMESH_LOG_MAX_BYTES";

/// The rotation size: `MCPMESH_LOG_MAX_BYTES` when it holds a number (at least 4 KiB), or
/// [`DEFAULT_MAX_BYTES`].
pub fn max_bytes_from_env() -> u64 {
    std::env::var(MAX_BYTES_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map_or(DEFAULT_MAX_BYTES, |n| n.max(4096))
}

/// The log file `path`, and its rotated predecessors `path.1` … `path.KEEP`, oldest last.
pub fn files(path: &Path) -> Vec<PathBuf> {
    std::iter::once(path.to_path_buf())
        .chain((1..=KEEP).map(|n| rotated(path, n)))
        .collect()
}

fn rotated(path: &Path, n: usize) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(format!(".{n}"));
    PathBuf::from(name)
}

/// An open log file that rotates itself. Writes are whole: a write that would pass the bound
/// goes to a new file, so no log line is split across two.
#[derive(Debug)]
pub struct LogFile {
    path: PathBuf,
    file: File,
    written: u64,
    max_bytes: u64,
    /// Point stderr at each new file.
    redirect_stderr: bool,
    /// The current file was renamed away but no new one could be opened (no descriptor left,
    /// say): the next rotation only opens `path`, shifting nothing again.
    detached: bool,
}

impl LogFile {
    /// Opens (appending to) the log at `path`, created `0600`; a link there is refused.
    pub fn open(path: &Path, max_bytes: u64, redirect_stderr: bool) -> io::Result<Self> {
        let file = open_append(path)?;
        let written = file.metadata()?.len();
        let log = LogFile {
            path: path.to_path_buf(),
            file,
            written,
            max_bytes,
            redirect_stderr,
            detached: false,
        };
        log.follow_with_stderr();
        Ok(log)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn max_bytes(&self) -> u64 {
        self.max_bytes
    }

    fn rotate(&mut self) -> io::Result<()> {
        if !self.detached {
            for n in (1..KEEP).rev() {
                let from = rotated(&self.path, n);
                if from.exists() {
                    std::fs::rename(&from, rotated(&self.path, n + 1))?;
                }
            }
            match std::fs::rename(&self.path, rotated(&self.path, 1)) {
                Ok(()) => {}
                // Someone removed the file: start a new one all the same.
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
            self.detached = true;
        }
        self.file = open_append(&self.path)?;
        self.detached = false;
        self.written = 0;
        self.follow_with_stderr();
        Ok(())
    }

    fn follow_with_stderr(&self) {
        if self.redirect_stderr {
            // Best effort: a stderr left on the old file loses nothing but order.
            let _ = rustix::stdio::dup2_stderr(&self.file);
        }
    }
}

fn open_append(path: &Path) -> io::Result<File> {
    #[cfg(test)]
    if tests::FAILING_OPENS.with(|n| n.replace(n.get().saturating_sub(1))) > 0 {
        return Err(io::Error::from_raw_os_error(24));
    }
    // Never through a link: the log's lines land in the profile's own file or nowhere.
    crate::files::open_append(path, crate::files::Rule::Trusted).map_err(io::Error::other)
}

impl Write for LogFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let len = buf.len() as u64;
        if self.written > 0 && self.written.saturating_add(len) > self.max_bytes {
            // A log that cannot rotate (a full or read-only disk) keeps writing where it is.
            let _ = self.rotate();
        }
        let n = self.file.write(buf)?;
        self.written = self.written.saturating_add(n as u64);
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    thread_local! {
        /// How many of this thread's next log opens fail as with no descriptor left.
        pub(super) static FAILING_OPENS: Cell<u32> = const { Cell::new(0) };
    }

    #[test]
    fn rotation_recovers_after_opens_fail_and_the_current_file_is_the_log_again() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mcpmesh.log");
        let mut log = LogFile::open(&path, 100, false).unwrap();
        let line = |c: u8| {
            let mut l = vec![c; 39];
            l.push(b'\n');
            l
        };
        log.write_all(&line(b'a')).unwrap();
        log.write_all(&line(b'b')).unwrap();
        FAILING_OPENS.with(|n| n.set(5));
        for c in b'c'..b'j' {
            log.write_all(&line(c)).unwrap();
        }
        FAILING_OPENS.with(|n| n.set(0));
        log.write_all(&line(b'z')).unwrap();
        let current = std::fs::read_to_string(&path).unwrap();
        assert!(
            current.ends_with(&format!("{}\n", "z".repeat(39))),
            "{current:?}"
        );
        assert!(
            !rotated(&path, 3).exists(),
            "the failed opens shifted nothing further"
        );
        // What was written while no file could be opened followed the lines before it, in .2.
        let older = std::fs::read_to_string(rotated(&path, 2)).unwrap();
        assert!(older.starts_with('a'), "{older:?}");
        assert!(
            older.ends_with(&format!("{}\n", "g".repeat(39))),
            "{older:?}"
        );
    }

    fn sizes(path: &Path) -> Vec<Option<u64>> {
        files(path)
            .iter()
            .map(|p| std::fs::metadata(p).ok().map(|m| m.len()))
            .collect()
    }

    #[test]
    fn the_log_rotates_before_passing_its_bound_and_keeps_only_so_many_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mcpmesh.log");
        let mut log = LogFile::open(&path, 100, false).unwrap();
        let line = [b'x'; 39];
        for n in 0..40u8 {
            let mut l = line.to_vec();
            l[0] = b'a' + (n % 26);
            l.push(b'\n');
            log.write_all(&l).unwrap();
        }
        let sizes = sizes(&path);
        assert_eq!(sizes.len(), KEEP + 1);
        for (n, size) in sizes.iter().enumerate() {
            let size = size.unwrap_or_else(|| panic!("file {n} missing: {sizes:?}"));
            assert!(
                size <= 100 && size % 40 == 0,
                "whole lines within bound: {sizes:?}"
            );
        }
        assert!(!rotated(&path, KEEP + 1).exists(), "the oldest is dropped");
        // The newest line is in the current file, the older ones in .1.
        let current = std::fs::read_to_string(&path).unwrap();
        assert!(current.ends_with(&format!("{}\n", "x".repeat(38))));
        assert!(
            current.starts_with('m') || current.starts_with('n'),
            "{current}"
        );
    }

    #[test]
    fn a_line_larger_than_the_bound_is_written_whole_in_a_file_of_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mcpmesh.log");
        let mut log = LogFile::open(&path, 10, false).unwrap();
        log.write_all(b"short\n").unwrap();
        log.write_all(&[b'y'; 50]).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), [b'y'; 50]);
        assert_eq!(std::fs::read(rotated(&path, 1)).unwrap(), b"short\n");
    }

    #[test]
    fn a_link_planted_at_the_log_path_is_refused_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let elsewhere = dir.path().join("elsewhere");
        std::fs::write(&elsewhere, b"untouched\n").unwrap();
        let path = dir.path().join("mcpmesh.log");
        std::os::unix::fs::symlink(&elsewhere, &path).unwrap();
        let e = LogFile::open(&path, 100, false).unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
        assert_eq!(std::fs::read(&elsewhere).unwrap(), b"untouched\n");
    }

    #[test]
    fn a_reopened_log_counts_what_the_file_already_holds() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mcpmesh.log");
        std::fs::write(&path, [b'z'; 90]).unwrap();
        let mut log = LogFile::open(&path, 100, false).unwrap();
        log.write_all(&[b'w'; 20]).unwrap();
        assert_eq!(std::fs::read(rotated(&path, 1)).unwrap(), [b'z'; 90]);
        assert_eq!(std::fs::read(&path).unwrap(), [b'w'; 20]);
    }
}
