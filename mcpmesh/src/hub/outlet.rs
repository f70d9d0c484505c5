//! The one writer of a stream the hub writes lines to (its client's output, each session's
//! socket to the node): what is queued meanwhile goes out in the same write, so requests or
//! answers that come together cost one system call and wake the reader once.

use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Bytes of queued lines written at once.
const BATCH: usize = 256 * 1024;

/// How [`write_out`] ended.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Ended {
    /// Stopped, or every sender gone: what was queued was written, and the stream shut.
    Stopped,
    /// A write failed (and `stop` was cancelled).
    Failed,
}

/// Writes the lines `rx` gives to `output` until `stop` is cancelled or the senders are gone.
pub(crate) async fn write_out<W: AsyncWrite + Unpin>(
    mut rx: mpsc::Receiver<Vec<u8>>,
    mut output: W,
    stop: CancellationToken,
) -> Ended {
    loop {
        // What is queued goes out before a stop is heard: the last answers are queued just
        // before the hub stops, and an unbiased pick could drop them.
        let line = tokio::select! {
            biased;
            line = rx.recv() => line,
            _ = stop.cancelled() => None,
        };
        let Some(mut batch) = line else { break };
        // What is already queued goes out in the same write.
        while batch.len() < BATCH
            && let Ok(more) = rx.try_recv()
        {
            batch.extend_from_slice(&more);
        }
        if output.write_all(&batch).await.is_err() || output.flush().await.is_err() {
            stop.cancel();
            return Ended::Failed;
        }
    }
    let _ = output.shutdown().await;
    Ended::Stopped
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::pin::Pin;
    use std::sync::{Arc, Mutex};
    use std::task::{Context, Poll};

    /// A stream that keeps each write apart, or fails every write.
    #[derive(Clone, Default)]
    struct Writes {
        each: Arc<Mutex<Vec<Vec<u8>>>>,
        shut: Arc<Mutex<bool>>,
        broken: bool,
    }

    impl AsyncWrite for Writes {
        fn poll_write(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<std::io::Result<usize>> {
            if self.broken {
                return Poll::Ready(Err(std::io::ErrorKind::BrokenPipe.into()));
            }
            self.each.lock().unwrap().push(buf.to_vec());
            Poll::Ready(Ok(buf.len()))
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            *self.shut.lock().unwrap() = true;
            Poll::Ready(Ok(()))
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn lines_queued_together_go_in_one_write_and_a_stop_writes_what_is_queued_first() {
        let (tx, rx) = mpsc::channel(8);
        let out = Writes::default();
        let stop = CancellationToken::new();
        for line in ["a\n", "b\n", "c\n"] {
            tx.send(line.as_bytes().to_vec()).await.unwrap();
        }
        stop.cancel();
        assert_eq!(write_out(rx, out.clone(), stop).await, Ended::Stopped);
        assert_eq!(*out.each.lock().unwrap(), [b"a\nb\nc\n".to_vec()]);
        assert!(*out.shut.lock().unwrap(), "the stream is shut at the end");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_failed_write_cancels_the_stop_and_says_so() {
        let (tx, rx) = mpsc::channel(8);
        let out = Writes {
            broken: true,
            ..Writes::default()
        };
        let stop = CancellationToken::new();
        tx.send(b"a\n".to_vec()).await.unwrap();
        assert_eq!(write_out(rx, out, stop.clone()).await, Ended::Failed);
        assert!(stop.is_cancelled());
        assert!(
            tx.send(b"b\n".to_vec()).await.is_err(),
            "nothing writes any more"
        );
    }
}
