//! The one allocator setting a node starts with, and keeping it from the servers it spawns.
//!
//! glibc raises its mmap threshold each time it frees a large block, up to 32 MiB, and from
//! then on keeps freed memory of that size in its heap: a node that once moved an 8 MiB request
//! stayed about 20 MB larger for good. A fixed threshold (1 MiB, far above the pieces a
//! session's pumps use) hands such memory back as soon as it is freed. glibc reads the setting
//! only at process start, so whoever starts a node sets it: `up` and every verb that starts the
//! node, and the systemd unit in `deploy/`; a node started by hand (`mcpmesh daemon`) without it
//! replaces itself once with it ([`restart_tuned`]). Spawned MCP servers get the environment the
//! node itself was given.
//!
//! An environment variable and a re-exec, not `mallopt` at start (a C call, and the crates
//! forbid `unsafe`) nor another allocator (jemalloc, mimalloc: a C library built into the
//! binary to change one setting).

/// The setting, in glibc's tunables syntax.
pub const TUNABLES: &str = "glibc.malloc.mmap_threshold=1048576";
const TUNABLES_VAR: &str = "GLIBC_TUNABLES";
/// Set beside it when the node's starter added it (never when the user had their own).
const TUNED_VAR: &str = "MCPMESH_MALLOC_TUNED";

/// Adds the setting to the environment of a node about to be started, unless the user has
/// glibc tunables of their own.
pub fn tune_node(cmd: &mut std::process::Command) {
    if std::env::var_os(TUNABLES_VAR).is_none() {
        cmd.env(TUNABLES_VAR, TUNABLES).env(TUNED_VAR, "1");
    }
}

/// For a node started without the setting, and without tunables of the user's own: this same
/// program with the same arguments and the setting added, for the node to `exec` (it keeps its
/// pid, so whoever started it notices nothing). `None` when there is nothing to add.
pub fn restart_tuned() -> Option<std::process::Command> {
    use std::os::unix::process::CommandExt;
    if std::env::var_os(TUNABLES_VAR).is_some() {
        return None;
    }
    let exe = std::env::current_exe().ok()?;
    let mut args = std::env::args_os();
    let mut cmd = std::process::Command::new(exe);
    if let Some(arg0) = args.next() {
        cmd.arg0(arg0);
    }
    cmd.args(args);
    tune_node(&mut cmd);
    Some(cmd)
}

/// Takes the setting out of a spawned server's environment when the node's starter added it.
pub fn untune_child(cmd: &mut tokio::process::Command) {
    if std::env::var_os(TUNED_VAR).is_some() {
        cmd.env_remove(TUNABLES_VAR);
    }
}
