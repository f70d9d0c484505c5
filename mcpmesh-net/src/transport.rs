//! NDJSON framing: one codec for every wire (mesh stream, child stdio, control socket).
//!
//! [`FrameReader`] finds newlines in chunks and hands out runs of whole lines as shared
//! [`Bytes`] without parsing them; [`crate::pump::forward`] is the line pump built on it.
//! Forwarded bytes are never changed: JSON is parsed only where a decision needs it and never
//! re-serialized on the way through. A line longer than the cap is discarded and reported, not
//! buffered. Where nothing has to decide on a line before it goes on, [`FrameReader::next_piece`]
//! hands out a long line in parts as it arrives instead of holding it whole.

use std::io;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// The largest line a peer may send (16 MiB): one past it is answered `-32051` and dropped.
pub const MAX_FRAME: usize = 16 * 1024 * 1024;

/// How much one read may take from the source (never more than the cap either, so within one
/// run of lines only the first, which may have started in an earlier read, can exceed it).
const READ_CHUNK: usize = 256 * 1024;

/// A line still without its newline after this many bytes is passed on in parts by
/// [`FrameReader::next_piece`]; shorter lines always go whole.
pub const PASS_AT: usize = 64 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    #[error("i/o: {0}")]
    Io(#[from] io::Error),
    #[error("frame larger than the {0}-byte cap")]
    FrameTooLarge(usize),
    #[error("frame is not JSON: {0}")]
    Parse(#[from] serde_json::Error),
}

/// What one read of a line source produced.
#[derive(Debug)]
pub enum Batch {
    /// One or more complete lines, each ending in `\n` (the last may lack it at EOF).
    Lines(Bytes),
    /// A line over the cap was discarded (the rest of it is skipped as it arrives).
    Oversize,
}

/// What [`FrameReader::next_piece`] produced.
#[derive(Debug)]
pub enum Piece {
    /// One or more complete lines, as [`Batch::Lines`].
    Lines(Bytes),
    /// A line over the cap was discarded, as [`Batch::Oversize`].
    Oversize,
    /// The first bytes of a line longer than [`PASS_AT`]; the rest comes from
    /// [`FrameReader::next_part`].
    LongStart(Bytes),
}

/// The next bytes of a long line (see [`Piece::LongStart`]).
#[derive(Debug)]
pub enum Part {
    More(Bytes),
    /// The line's last bytes, through its newline (or up to EOF).
    Last(Bytes),
    /// The line ran past the cap: what was handed out is all of it there will be, and the rest
    /// is skipped as it arrives.
    Cut,
}

/// Reads newline-delimited frames from a byte source, in chunks.
#[derive(Debug)]
pub struct FrameReader<R> {
    inner: R,
    buf: BytesMut,
    /// Complete lines already split off the buffer but not yet handed out.
    pending: Bytes,
    /// `buf[..scanned]` holds no newline: a long line is scanned once, not once per read.
    scanned: usize,
    max_frame: usize,
    /// Inside an oversized line: drop bytes until its newline.
    discarding: bool,
    /// Inside a long line being handed out in parts: how many bytes of it went out so far.
    passing: Option<usize>,
    eof: bool,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    pub fn new(inner: R, max_frame: usize) -> Self {
        FrameReader {
            inner,
            buf: BytesMut::with_capacity(16 * 1024),
            pending: Bytes::new(),
            scanned: 0,
            max_frame,
            discarding: false,
            passing: None,
            eof: false,
        }
    }

    /// The next run of complete lines, or `None` at EOF. Cancel-safe: bytes read stay buffered.
    pub async fn next_batch(&mut self) -> io::Result<Option<Batch>> {
        loop {
            if let Some(batch) = self.take_buffered() {
                return Ok(Some(batch));
            }
            if self.eof {
                return Ok(None);
            }
            self.read().await?;
        }
    }

    /// Like [`FrameReader::next_batch`], except that a line still without its newline after
    /// [`PASS_AT`] bytes is handed out as it arrives: [`Piece::LongStart`], then
    /// [`FrameReader::next_part`] until [`Part::Last`] or [`Part::Cut`]. Cancel-safe.
    pub async fn next_piece(&mut self) -> io::Result<Option<Piece>> {
        loop {
            match self.take_buffered() {
                Some(Batch::Lines(run)) => return Ok(Some(Piece::Lines(run))),
                Some(Batch::Oversize) => return Ok(Some(Piece::Oversize)),
                None => {}
            }
            if self.eof {
                return Ok(None);
            }
            if self.buf.len() >= PASS_AT {
                // No newline in it yet (take_buffered looked) and within the cap.
                self.scanned = 0;
                self.passing = Some(self.buf.len());
                return Ok(Some(Piece::LongStart(self.buf.split().freeze())));
            }
            self.read().await?;
        }
    }

    /// The next bytes of the long line [`FrameReader::next_piece`] started handing out, as
    /// they arrive. Outside such a line: an empty [`Part::Last`]. Cancel-safe.
    pub async fn next_part(&mut self) -> io::Result<Part> {
        loop {
            let Some(sent) = self.passing else {
                return Ok(Part::Last(Bytes::new()));
            };
            if !self.buf.is_empty() {
                return Ok(match memchr::memchr(b'\n', &self.buf) {
                    Some(i) if sent + i > self.max_frame => {
                        self.passing = None;
                        self.buf.advance(i + 1);
                        Part::Cut
                    }
                    Some(i) => {
                        self.passing = None;
                        Part::Last(self.buf.split_to(i + 1).freeze())
                    }
                    None if sent + self.buf.len() > self.max_frame => {
                        self.passing = None;
                        self.buf.clear();
                        self.discarding = true;
                        Part::Cut
                    }
                    None => {
                        self.passing = Some(sent + self.buf.len());
                        Part::More(self.buf.split().freeze())
                    }
                });
            }
            if self.eof {
                self.passing = None;
                return Ok(Part::Last(Bytes::new()));
            }
            // Each read's bytes go on as they are: reserve a whole chunk rather than the few
            // bytes an empty buffer would grow by.
            self.buf.reserve(READ_CHUNK);
            self.read().await?;
        }
    }

    async fn read(&mut self) -> io::Result<()> {
        let limit = self.read_limit();
        let n = self
            .inner
            .read_buf(&mut (&mut self.buf).limit(limit))
            .await?;
        if n == 0 {
            self.eof = true;
        }
        Ok(())
    }

    /// The next non-blank line without its line ending, `Err(TransportError::FrameTooLarge)`
    /// for a discarded oversized line, or `None` at EOF.
    pub async fn next_line(&mut self) -> Result<Option<Bytes>, TransportError> {
        loop {
            if !self.pending.is_empty() {
                let end =
                    memchr::memchr(b'\n', &self.pending).map_or(self.pending.len(), |i| i + 1);
                let line = trim_line_ending(self.pending.split_to(end));
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                return Ok(Some(line));
            }
            match self.next_batch().await? {
                None => return Ok(None),
                Some(Batch::Oversize) => return Err(TransportError::FrameTooLarge(self.max_frame)),
                Some(Batch::Lines(lines)) => self.pending = lines,
            }
        }
    }

    /// Changes the cap for the lines still to come (a preamble is read under a small cap, the
    /// session under the frame cap).
    pub fn set_max_frame(&mut self, max_frame: usize) {
        self.max_frame = max_frame;
    }

    /// The source, for what it offers beyond reading (a QUIC stream's `stop`).
    pub fn get_mut(&mut self) -> &mut R {
        &mut self.inner
    }

    /// The source and everything read from it but not yet handed out, in order.
    pub fn into_parts(self) -> (R, BytesMut) {
        let mut rest = BytesMut::from(&self.pending[..]);
        rest.extend_from_slice(&self.buf);
        (self.inner, rest)
    }

    fn read_limit(&self) -> usize {
        READ_CHUNK.min(self.max_frame.max(1))
    }

    fn take_buffered(&mut self) -> Option<Batch> {
        if !self.pending.is_empty() {
            return Some(Batch::Lines(std::mem::take(&mut self.pending)));
        }
        if self.discarding {
            match memchr::memchr(b'\n', &self.buf) {
                Some(i) => {
                    self.buf.advance(i + 1);
                    self.discarding = false;
                }
                None => {
                    self.buf.clear();
                    return None;
                }
            }
        }
        let from = self.scanned.min(self.buf.len());
        match memchr::memchr(b'\n', &self.buf[from..]).map(|i| from + i) {
            Some(i) if i > self.max_frame => {
                self.buf.advance(i + 1);
                self.scanned = 0;
                Some(Batch::Oversize)
            }
            Some(i) => {
                let last = memchr::memrchr(b'\n', &self.buf[i..]).map_or(i, |j| i + j);
                self.scanned = 0;
                Some(Batch::Lines(self.buf.split_to(last + 1).freeze()))
            }
            None if self.buf.len() > self.max_frame => {
                self.buf.clear();
                self.scanned = 0;
                self.discarding = true;
                Some(Batch::Oversize)
            }
            None if self.eof && !self.buf.is_empty() => {
                self.scanned = 0;
                Some(Batch::Lines(self.buf.split().freeze()))
            }
            None => {
                self.scanned = self.buf.len();
                None
            }
        }
    }
}

fn trim_line_ending(mut line: Bytes) -> Bytes {
    if line.last() == Some(&b'\n') {
        line.truncate(line.len() - 1);
    }
    if line.last() == Some(&b'\r') {
        line.truncate(line.len() - 1);
    }
    line
}

/// Iterates the lines of a run (each without its line ending), skipping blank ones. Line ends
/// are found with `memchr` (a multi-megabyte line is one SIMD scan, not a byte loop).
pub fn lines(run: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut rest = run;
    std::iter::from_fn(move || {
        while !rest.is_empty() {
            let (line, next) = match memchr::memchr(b'\n', rest) {
                Some(i) => (&rest[..i], &rest[i + 1..]),
                None => (rest, &rest[rest.len()..]),
            };
            rest = next;
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if !line.iter().all(u8::is_ascii_whitespace) {
                return Some(line);
            }
        }
        None
    })
}

/// A bidirectional NDJSON wire: a [`FrameReader`] and a byte sink.
///
/// `recv_value`/`send_value` parse and serialize, for the few places that decide on a frame's
/// content (control socket, tests). Session traffic goes through [`FrameReader::next_batch`]
/// and raw writes instead.
#[derive(Debug)]
pub struct NdjsonTransport<R, W> {
    reader: FrameReader<R>,
    writer: W,
}

impl<R: AsyncRead + Unpin, W: AsyncWrite + Unpin> NdjsonTransport<R, W> {
    pub fn new(reader: R, writer: W, max_frame: usize) -> Self {
        NdjsonTransport {
            reader: FrameReader::new(reader, max_frame),
            writer,
        }
    }

    /// The next frame parsed as JSON, or `None` at EOF.
    pub async fn recv_value(&mut self) -> Result<Option<Value>, TransportError> {
        match self.reader.next_line().await? {
            None => Ok(None),
            Some(line) => Ok(Some(serde_json::from_slice(&line)?)),
        }
    }

    /// The next frame's raw bytes (line ending removed), or `None` at EOF.
    pub async fn recv_line(&mut self) -> Result<Option<Bytes>, TransportError> {
        self.reader.next_line().await
    }

    /// Serializes one value as a compact line.
    pub async fn send_value(&mut self, value: Value) -> Result<(), TransportError> {
        let mut line = serde_json::to_vec(&value)?;
        line.push(b'\n');
        self.send_raw(&line).await
    }

    /// Writes bytes that already are one or more complete lines.
    pub async fn send_raw(&mut self, lines: &[u8]) -> Result<(), TransportError> {
        self.writer.write_all(lines).await?;
        self.writer.flush().await?;
        Ok(())
    }

    pub fn into_parts(self) -> (FrameReader<R>, W) {
        (self.reader, self.writer)
    }

    pub fn reader_mut(&mut self) -> &mut FrameReader<R> {
        &mut self.reader
    }

    pub fn writer(&self) -> &W {
        &self.writer
    }

    pub fn writer_mut(&mut self) -> &mut W {
        &mut self.writer
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncWriteExt, duplex};

    /// The whole input is usually available to the reader's first read.
    async fn batches(input: Vec<u8>, max: usize) -> Vec<Result<Vec<u8>, ()>> {
        let (mut tx, rx) = duplex(1 << 20);
        let writer = tokio::spawn(async move {
            tx.write_all(&input).await.unwrap();
        });
        let mut reader = FrameReader::new(rx, max);
        let mut out = Vec::new();
        while let Some(b) = reader.next_batch().await.unwrap() {
            out.push(match b {
                Batch::Lines(l) => Ok(l.to_vec()),
                Batch::Oversize => Err(()),
            });
        }
        writer.await.unwrap();
        out
    }

    fn joined(batches: &[Result<Vec<u8>, ()>]) -> Vec<u8> {
        batches.iter().flatten().flatten().copied().collect()
    }

    #[test]
    fn a_run_splits_into_its_non_blank_lines() {
        let run = b"{\"a\":1}\n\r\n  \n{\"b\":2}\r\n{\"c\":3}";
        let got: Vec<&[u8]> = lines(run).collect();
        assert_eq!(got, [&b"{\"a\":1}"[..], b"{\"b\":2}", b"{\"c\":3}"]);
        assert_eq!(lines(b"\n\n").count(), 0);
        assert_eq!(lines(b"").count(), 0);
    }

    #[tokio::test]
    async fn lines_pass_byte_for_byte_in_whole_lines() {
        let input = b"{\"a\": 1}\n{ \"b\" :[1,2] }\r\n\n{\"c\":\"\xc3\xa9\"}\n".to_vec();
        let out = batches(input.clone(), 1024).await;
        assert_eq!(joined(&out), input);
        for b in out.iter().flatten() {
            assert_eq!(b.last(), Some(&b'\n'), "runs end on a line boundary");
        }
    }

    #[tokio::test]
    async fn an_oversized_line_is_dropped_and_its_neighbours_survive() {
        let mut input = b"{\"ok\":1}\n".to_vec();
        input.extend(std::iter::repeat_n(b'x', 5000));
        input.extend_from_slice(b"\n{\"ok\":2}\n");
        let out = batches(input, 100).await;
        assert!(out.iter().any(Result::is_err), "oversize reported");
        assert_eq!(joined(&out), b"{\"ok\":1}\n{\"ok\":2}\n");
    }

    #[tokio::test]
    async fn a_line_at_the_cap_is_kept() {
        let mut input = vec![b'y'; 100];
        input.push(b'\n');
        let out = batches(input.clone(), 100).await;
        assert_eq!(out, vec![Ok(input)]);
    }

    #[tokio::test]
    async fn a_trailing_line_without_newline_is_delivered_at_eof() {
        let out = batches(b"{\"a\":1}\n{\"b\":2}".to_vec(), 100).await;
        assert_eq!(joined(&out), b"{\"a\":1}\n{\"b\":2}");
    }

    /// Everything `next_piece`/`next_part` hand out, fed in `chunk`-byte writes: whole runs as
    /// `Ok`, each long line as the list of its parts (`None` closing a cut one).
    async fn pieces(
        input: Vec<u8>,
        max: usize,
        chunk: usize,
    ) -> Vec<Result<Vec<u8>, Vec<Option<Vec<u8>>>>> {
        let (mut tx, rx) = duplex(1 << 16);
        let writer = tokio::spawn(async move {
            for c in input.chunks(chunk) {
                tx.write_all(c).await.unwrap();
            }
        });
        let mut reader = FrameReader::new(rx, max);
        let mut out = Vec::new();
        while let Some(p) = reader.next_piece().await.unwrap() {
            out.push(match p {
                Piece::Lines(l) => Ok(l.to_vec()),
                Piece::Oversize => Err(vec![]),
                Piece::LongStart(head) => {
                    let mut parts = vec![Some(head.to_vec())];
                    loop {
                        match reader.next_part().await.unwrap() {
                            Part::More(b) => parts.push(Some(b.to_vec())),
                            Part::Last(b) => {
                                parts.push(Some(b.to_vec()));
                                break;
                            }
                            Part::Cut => {
                                parts.push(None);
                                break;
                            }
                        }
                    }
                    Err(parts)
                }
            });
        }
        writer.await.unwrap();
        out
    }

    #[tokio::test]
    async fn a_long_line_is_handed_out_in_parts_and_its_neighbours_whole() {
        let long: Vec<u8> = [&vec![b'q'; 3 * PASS_AT + 17][..], b"\n"].concat();
        let input = [&b"{\"a\":1}\n"[..], &long, b"{\"b\":2}\n"].concat();
        let out = pieces(input, MAX_FRAME, 4096).await;
        assert_eq!(out.first(), Some(&Ok(b"{\"a\":1}\n".to_vec())));
        assert_eq!(out.last(), Some(&Ok(b"{\"b\":2}\n".to_vec())));
        let parts: Vec<_> = out.iter().filter_map(|p| p.as_ref().err()).collect();
        assert_eq!(parts.len(), 1, "one long line");
        assert!(
            parts[0].len() > 2,
            "passed on in several parts, not held whole"
        );
        let joined: Vec<u8> = parts[0].iter().flatten().flatten().copied().collect();
        assert_eq!(joined, long, "its bytes, unchanged and in order");
        for part in parts[0].iter().flatten() {
            assert!(
                part.len() <= PASS_AT + READ_CHUNK,
                "a part of {} bytes",
                part.len()
            );
        }
    }

    #[tokio::test]
    async fn a_long_line_past_the_cap_is_cut_there_and_the_next_line_survives() {
        let max = 2 * PASS_AT;
        let input = [&vec![b'z'; 5 * PASS_AT][..], b"\n{\"ok\":1}\n"].concat();
        let out = pieces(input, max, 8192).await;
        let Some(Err(parts)) = out.first() else {
            panic!("no long line: {out:?}")
        };
        assert_eq!(parts.last(), Some(&None), "cut");
        let sent: usize = parts.iter().flatten().map(Vec::len).sum();
        assert!(sent <= max, "{sent} bytes went out, over the cap of {max}");
        assert_eq!(out.last(), Some(&Ok(b"{\"ok\":1}\n".to_vec())));
    }

    #[tokio::test]
    async fn a_long_line_ended_by_eof_is_handed_out_whole() {
        let input = vec![b'e'; 2 * PASS_AT];
        let out = pieces(input.clone(), MAX_FRAME, 1000).await;
        let joined: Vec<u8> = out
            .iter()
            .flat_map(|p| match p {
                Ok(run) => run.clone(),
                Err(parts) => parts.iter().flatten().flatten().copied().collect(),
            })
            .collect();
        assert_eq!(joined, input);
    }

    #[tokio::test]
    async fn next_line_skips_blank_lines_and_strips_endings() {
        let (mut tx, rx) = duplex(1024);
        tx.write_all(b"\n  \r\n{\"x\":1}\r\n").await.unwrap();
        drop(tx);
        let mut reader = FrameReader::new(rx, 100);
        assert_eq!(
            reader.next_line().await.unwrap().unwrap(),
            &b"{\"x\":1}"[..]
        );
        assert!(reader.next_line().await.unwrap().is_none());
    }
}
