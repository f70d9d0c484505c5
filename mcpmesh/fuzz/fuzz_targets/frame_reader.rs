//! The line codec: whatever bytes arrive, in whatever chunks, the reader never panics, never
//! hands out a line over the cap, and hands out every byte of every line within it, unchanged.

#![forbid(unsafe_code)]
#![no_main]

use libfuzzer_sys::fuzz_target;
use mcpmesh_net::transport::{Batch, FrameReader};

/// A source that delivers `data` in chunks of the given sizes.
struct Chunked<'a> {
    data: &'a [u8],
    sizes: &'a [u8],
}

impl tokio::io::AsyncRead for Chunked<'_> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let size = self
            .sizes
            .first()
            .map_or(self.data.len(), |s| usize::from(*s).max(1));
        if let Some((_, rest)) = self.sizes.split_first() {
            self.sizes = rest;
        }
        let n = size.min(self.data.len()).min(buf.remaining());
        buf.put_slice(&self.data[..n]);
        self.data = &self.data[n..];
        std::task::Poll::Ready(Ok(()))
    }
}

fuzz_target!(|input: &[u8]| {
    let (cap, rest) = match input.split_first() {
        Some((c, rest)) => (usize::from(*c % 64) + 1, rest),
        None => return,
    };
    let split = rest.len() / 4;
    let (sizes, data) = rest.split_at(split);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut reader = FrameReader::new(Chunked { data, sizes }, cap);
        let mut out = Vec::new();
        while let Ok(Some(batch)) = reader.next_batch().await {
            if let Batch::Lines(run) = batch {
                for line in run.split_inclusive(|b| *b == b'\n') {
                    let body = line.strip_suffix(b"\n").unwrap_or(line);
                    assert!(body.len() <= cap, "a line over the cap got through");
                }
                out.extend_from_slice(&run);
            }
        }
        // What came out is the input with oversized lines removed: every kept line is one of
        // the input's lines, in order.
        let kept: Vec<&[u8]> = out.split_inclusive(|b| *b == b'\n').collect();
        let mut input_lines = data.split_inclusive(|b| *b == b'\n');
        for line in kept {
            assert!(
                input_lines.any(|l| l == line),
                "a line was altered or reordered"
            );
        }
    });
});
