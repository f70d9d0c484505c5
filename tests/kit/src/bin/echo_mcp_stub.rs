//! A small, fast MCP server for the test suites and benchmarks: answers from memory, reports
//! the identity the node gave it, and can crash or stall on request.
//!
//! `echo_mcp_stub [--marker TAG]` serves stdio (the marker only tags the process for tests);
//! `echo_mcp_stub --socket PATH [--record FILE]` listens on a Unix socket instead, one session
//! per connection, and appends every line it receives to FILE.
//! `echo_mcp_stub --relay -- CMD…` serves nothing itself: it starts CMD and copies bytes between
//! its own stdio and CMD's, a process hop that does nothing else (the benchmark's baseline for
//! what the mesh's two process hops cost on their own).

#![forbid(unsafe_code)]

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};

use mcpmesh_testkit::stub_server;

fn main() -> std::io::Result<()> {
    let all: Vec<String> = std::env::args().skip(1).collect();
    if let [flag, sep, cmd @ ..] = &all[..]
        && flag == "--relay"
        && sep == "--"
        && !cmd.is_empty()
    {
        return relay(cmd);
    }
    let mut args = all.into_iter();
    let (mut socket, mut record) = (None::<PathBuf>, None::<PathBuf>);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--socket" => socket = args.next().map(PathBuf::from),
            "--record" => record = args.next().map(PathBuf::from),
            _ => {}
        }
    }
    match socket {
        Some(path) => stub_server::serve_socket(&path, "echo-stub", record.as_deref()),
        None => stub_server::serve_stdio("echo-stub"),
    }
}

/// Copies stdin to `cmd`'s stdin and its stdout to stdout, a read and a write per chunk, until
/// both ends close.
fn relay(cmd: &[String]) -> std::io::Result<()> {
    let mut child = Command::new(&cmd[0])
        .args(&cmd[1..])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    let (Some(mut to_child), Some(mut from_child)) = (child.stdin.take(), child.stdout.take())
    else {
        return Err(std::io::Error::other("no pipes to the child"));
    };
    let answers = std::thread::spawn(move || copy(&mut from_child, &mut std::io::stdout()));
    copy(&mut std::io::stdin(), &mut to_child)?;
    drop(to_child);
    answers
        .join()
        .map_err(|_| std::io::Error::other("the copying thread panicked"))??;
    child.wait()?;
    Ok(())
}

fn copy(from: &mut impl Read, to: &mut impl Write) -> std::io::Result<()> {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = from.read(&mut buf)?;
        if n == 0 {
            return Ok(());
        }
        to.write_all(&buf[..n])?;
        to.flush()?;
    }
}
