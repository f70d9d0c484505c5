//! The line pump: moves whole runs of lines from a reader to a writer, unchanged.
//!
//! One direction per call; a session runs two of them under a `select!`. Each run is written
//! as one `write_all` of the bytes as they were read. An oversized line is dropped and answered
//! on the client-facing writer; the third such strike ends the direction.

use std::io;

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::Mutex;

use crate::errors::{ErrorCode, ErrorFrame};
use crate::transport::{Batch, FrameReader};

/// Oversized frames tolerated per direction before the session is closed.
pub const MAX_STRIKES: u8 = 3;

/// How a forwarding direction ended.
#[derive(Debug, thiserror::Error)]
pub enum PumpError {
    #[error("reading failed: {0}")]
    Read(io::Error),
    #[error("writing failed: {0}")]
    Write(io::Error),
    #[error("three oversized frames; session closed")]
    TooManyStrikes,
}

/// Forwards every line from `reader` to `dest` until EOF (`Ok`) or a failure.
///
/// `observe` sees each run before it is written (it may record, never alter). Oversized lines
/// are answered with `-32051` on `client`, the writer facing the MCP client; for the direction
/// that carries the client's own frames that is the reverse direction's writer.
pub async fn forward<R, W, C>(
    reader: &mut FrameReader<R>,
    dest: &Mutex<W>,
    client: &Mutex<C>,
    mut observe: impl FnMut(&Bytes),
) -> Result<(), PumpError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
    C: AsyncWrite + Unpin,
{
    let mut strikes = 0u8;
    while let Some(batch) = reader.next_batch().await.map_err(PumpError::Read)? {
        match batch {
            Batch::Lines(run) => {
                observe(&run);
                write_run(dest, &run).await.map_err(PumpError::Write)?;
            }
            Batch::Oversize => {
                strikes += 1;
                tracing::debug!(strikes, "dropped a frame over the cap");
                let line = ErrorFrame::new(ErrorCode::FrameTooLarge).to_line();
                write_run(client, &line).await.map_err(PumpError::Write)?;
                if strikes >= MAX_STRIKES {
                    return Err(PumpError::TooManyStrikes);
                }
            }
        }
    }
    Ok(())
}

/// Writes complete lines under the writer's lock, so frames from two sources never interleave.
pub async fn write_run<W: AsyncWrite + Unpin>(dest: &Mutex<W>, run: &[u8]) -> io::Result<()> {
    let mut w = dest.lock().await;
    w.write_all(run).await?;
    w.flush().await
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, duplex};

    #[tokio::test]
    async fn forwarded_bytes_are_identical_and_oversize_is_answered_to_the_client() {
        let (mut src_w, src_r) = duplex(1 << 20);
        let (dst_w, mut dst_r) = duplex(1 << 20);
        let (cli_w, mut cli_r) = duplex(1 << 20);
        let mut input = b"{\"id\":1, \"k\":\"\xe2\x9c\x93\"}\n".to_vec();
        input.extend(std::iter::repeat_n(b'a', 300));
        input.extend_from_slice(b"\n{\"id\" :2}\n");
        let feed = input.clone();
        tokio::spawn(async move { src_w.write_all(&feed).await });
        let mut reader = FrameReader::new(src_r, 200);
        let (dest, client) = (Mutex::new(dst_w), Mutex::new(cli_w));
        let mut seen = 0;
        tokio::time::timeout(std::time::Duration::from_secs(5), async {
            let _ = forward(&mut reader, &dest, &client, |run| seen += run.len()).await;
        })
        .await
        .ok();
        drop((dest, client));
        let mut out = Vec::new();
        dst_r.read_to_end(&mut out).await.unwrap();
        assert_eq!(out, b"{\"id\":1, \"k\":\"\xe2\x9c\x93\"}\n{\"id\" :2}\n");
        assert_eq!(seen, out.len());
        let mut notice = Vec::new();
        cli_r.read_to_end(&mut notice).await.unwrap();
        let v: serde_json::Value = serde_json::from_slice(&notice).unwrap();
        assert_eq!(v["error"]["code"], -32051);
        assert!(v["id"].is_null());
    }

    #[tokio::test]
    async fn the_third_strike_ends_the_direction() {
        let (mut src_w, src_r) = duplex(1 << 16);
        let big = [vec![b'z'; 50], b"\n".to_vec()].concat().repeat(3);
        tokio::spawn(async move {
            src_w.write_all(&big).await.unwrap();
            // Keep the source open: only the strikes may end the pump.
            std::future::pending::<()>().await;
        });
        let mut reader = FrameReader::new(src_r, 10);
        let (dest, client) = (Mutex::new(tokio::io::sink()), Mutex::new(tokio::io::sink()));
        let r = forward(&mut reader, &dest, &client, |_| {}).await;
        assert!(matches!(r, Err(PumpError::TooManyStrikes)));
    }
}
