//! Links the `mcpmesh` binary's code in the order `symbol-order/PROFILE.txt` gives: the functions
//! a node runs first, busiest first (`scripts/symbol-order` writes the files and says how).
//!
//! The kernel maps a program's code in 64 KB windows around each page it runs, so a node's
//! resident code is every window it touches. Linked in the compiler's order, an idle node's
//! 5 MB of running code was spread over 18 MB of windows; linked together, it keeps 6 MB
//! (docs/performance.md).
//!
//! A function's linked name carries a hash of its crate's build: the profile, the crate's
//! features and the compiler's version. So each profile (`release`, `dist`) has a file of its
//! own, made by the compiler named on its first line; with another compiler the file would name
//! almost nothing, and this build says so and links in the compiler's order. A name the file has
//! and the build does not is skipped without a word, so a file only grows stale, never wrong.
//! In `release`, about one name in eight is a local function the compiler shares between
//! codegen units, renamed with a hash of the unit's contents, which hold the checkout's paths:
//! built in another directory, those are linked in the compiler's order (`dist`, one unit, has
//! one such name).
//!
//! Only an optimized build for x86_64 Linux, whose default linker (rust-lld) reads the file, and
//! only when no other linker was asked for: GNU ld does not know the option.
//! `MCPMESH_SYMBOL_ORDER=0` turns it off.
//!
//! It also packs the binary's relative relocations (`-z pack-relative-relocs`, DT_RELR): the
//! loader read 1.2 MB of them at every start (52,831 entries, 24 bytes each), which stayed
//! resident in every process; packed they are 15 KB. Each node keeps about 1 MB less, and every
//! `mcpmesh connect` starts with 25 fewer page faults. The loader must know the packed form
//! (glibc 2.36 and later, which the binary then requires), so only a native build on such a
//! glibc packs them, for x86_64 Linux with its default linker as above, in every profile.

use std::env;
use std::path::{Path, PathBuf};

fn main() {
    println!("cargo:rerun-if-changed=symbol-order");
    println!("cargo:rerun-if-env-changed=MCPMESH_SYMBOL_ORDER");
    if packs_relocations() {
        println!("cargo:rustc-link-arg-bin=mcpmesh=-Wl,-z,pack-relative-relocs");
    }
    if let Some(file) = order_file() {
        println!(
            "cargo:rustc-link-arg-bin=mcpmesh=-Wl,--symbol-ordering-file={}",
            file.display()
        );
        println!("cargo:rustc-link-arg-bin=mcpmesh=-Wl,--no-warn-symbol-ordering");
    }
}

fn var(key: &str) -> String {
    env::var(key).unwrap_or_default()
}

/// Whether the build links for x86_64 Linux with its default linker (rust-lld).
fn default_linker_for_linux() -> bool {
    let flags = var("CARGO_ENCODED_RUSTFLAGS");
    let other_linker = env::var_os("RUSTC_LINKER").is_some()
        || ["linker", "fuse-ld"].iter().any(|f| flags.contains(f));
    var("TARGET") == "x86_64-unknown-linux-gnu" && !other_linker
}

/// Whether to pack the binary's relative relocations: a native build, on a glibc whose loader
/// reads the packed form (2.36 and later, `getconf GNU_LIBC_VERSION`).
fn packs_relocations() -> bool {
    if !default_linker_for_linux() || var("HOST") != var("TARGET") {
        return false;
    }
    let Ok(out) = std::process::Command::new("getconf")
        .arg("GNU_LIBC_VERSION")
        .output()
    else {
        return false;
    };
    // "glibc 2.36"
    let said = String::from_utf8_lossy(&out.stdout);
    let mut version = said
        .trim()
        .strip_prefix("glibc ")
        .unwrap_or_default()
        .split('.')
        .map(|n| n.parse::<u32>().ok());
    match (version.next().flatten(), version.next().flatten()) {
        (Some(major), Some(minor)) => out.status.success() && (major, minor) >= (2, 36),
        _ => false,
    }
}

/// The file this build links by, if any.
fn order_file() -> Option<PathBuf> {
    if var("MCPMESH_SYMBOL_ORDER") == "0"
        || var("PROFILE") != "release"
        || !default_linker_for_linux()
    {
        return None;
    }
    // OUT_DIR is <target>/<profile>/build/<package>-<hash>/out: the profile's name, which
    // cargo tells a build script no other way.
    let out_dir = PathBuf::from(env::var_os("OUT_DIR")?);
    let profile = out_dir
        .ancestors()
        .nth(3)?
        .file_name()?
        .to_str()?
        .to_owned();
    let file = Path::new(&env::var_os("CARGO_MANIFEST_DIR")?)
        .join("symbol-order")
        .join(format!("{profile}.txt"));
    let made_by = std::fs::read_to_string(&file)
        .ok()?
        .lines()
        .next()?
        .strip_prefix("# ")?
        .to_owned();
    let rustc = std::process::Command::new(env::var_os("RUSTC")?)
        .arg("-V")
        .output()
        .ok()?;
    let ours = String::from_utf8_lossy(&rustc.stdout).trim().to_owned();
    if ours != made_by {
        println!(
            "cargo:warning={} was made by {made_by}, this build's compiler is {ours}: the code is linked in the compiler's order (scripts/symbol-order --profile {profile} makes a new file)",
            file.display()
        );
        return None;
    }
    Some(file)
}
