//! What the benchmark binaries share: their count flags, the binaries they drive, and reading a
//! process's figures from /proc.

use std::path::PathBuf;

use anyhow::{Context, bail};

/// A count flag's parser for clap: the number given, raised to `min` when below it.
pub fn at_least(min: usize) -> impl Fn(&str) -> Result<usize, std::num::ParseIntError> + Clone {
    move |text| text.parse::<usize>().map(|n| n.max(min))
}

/// Which build is measured, for a report's header: optimized or not, and the `mcpmesh` binary
/// driven (its directory names the cargo profile when run from `target/`).
pub fn build_label(mcpmesh: &std::path::Path) -> String {
    let kind = if cfg!(debug_assertions) {
        "unoptimized build (figures mean little)"
    } else {
        "optimized build"
    };
    format!("{kind} {}", mcpmesh.display())
}

/// `mcpmesh` and `echo_mcp_stub` from the same build as this binary: one workspace, one target
/// directory, so the product's binary sits beside the kit's.
pub fn sibling_binaries() -> anyhow::Result<(PathBuf, PathBuf)> {
    let dir = std::env::current_exe()?
        .parent()
        .context("exe dir")?
        .to_path_buf();
    let (mcpmesh, stub) = (dir.join("mcpmesh"), dir.join("echo_mcp_stub"));
    for b in [&mcpmesh, &stub] {
        if !b.exists() {
            bail!(
                "{} not found: build the workspace first (`cargo build --release`, or the profile measured)",
                b.display()
            );
        }
    }
    Ok((mcpmesh, stub))
}

/// Lets the kernel forget the cached pages of `binary`, so the nodes read its code back from
/// disk, as after a reboot. A node's resident code depends on how its file's pages came into
/// the page cache: on this machine (Linux 6.18, ext4) two nodes run from a binary just copied
/// with `cp` idle 3.3 MB higher than from the same file linked in place or read back from disk
/// (docs/performance.md, "How to measure"), which made builds look apart that were not.
/// Pages a running process maps stay; a binary no process runs is dropped whole.
pub fn read_from_disk(binary: &std::path::Path) -> anyhow::Result<()> {
    let file = std::fs::File::open(binary).with_context(|| binary.display().to_string())?;
    // Written pages are dropped only once on disk.
    file.sync_data()?;
    rustix::fs::fadvise(&file, 0, None, rustix::fs::Advice::DontNeed)?;
    Ok(())
}

/// The pid of the node whose profile is `home` (kept in its lock file).
pub fn daemon_pid(home: &std::path::Path) -> Option<u32> {
    std::fs::read_to_string(home.join("daemon.lock"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// A `/proc/PID/status` figure in KiB (`VmRSS:`, `VmHWM:`), 0 when unreadable.
pub fn status_kib(pid: u32, key: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

/// The unit of utime/stime in /proc/PID/stat: USER_HZ, which Linux fixes at 100.
pub fn clock_ticks_per_sec() -> f64 {
    100.0
}

/// The CPU time of `pid`'s threads, in nanoseconds: the sum of each live thread's
/// `/proc/PID/task/TID/schedstat`. Precise where utime/stime count 10 ms ticks (a few hundred
/// calls of tens of microseconds are a handful of ticks); a thread that ended meanwhile is not
/// counted, so it is for short phases of long-lived threads.
pub fn cpu_ns_of(pid: u32) -> u64 {
    threads_cpu_ns_of(pid, |_| true)
}

/// [`cpu_ns_of`], of the threads whose name (`comm`) `keep` keeps.
pub fn threads_cpu_ns_of(pid: u32, keep: impl Fn(&str) -> bool) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .flatten()
        .filter(|task| {
            std::fs::read_to_string(task.path().join("comm")).is_ok_and(|c| keep(c.trim_end()))
        })
        .filter_map(|task| std::fs::read_to_string(task.path().join("schedstat")).ok())
        .filter_map(|line| line.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// utime + stime of `pid`, in clock ticks.
pub fn cpu_ticks_of(pid: u32) -> u64 {
    ticks_in(&format!("/proc/{pid}/stat"))
}

/// utime + stime in a `/proc/…/stat` file, in clock ticks.
pub fn ticks_in(path: &str) -> u64 {
    let Ok(stat) = std::fs::read_to_string(path) else {
        return 0;
    };
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return 0;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the command: state(0) … utime(11) stime(12).
    let field = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    field(11) + field(12)
}
