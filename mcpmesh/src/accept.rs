//! What an accept loop does when `accept` fails: wait before the next try, longer each time,
//! and say so in the log once in a while rather than once per failure.
//!
//! An accept that fails for want of descriptors (`EMFILE`, `ENFILE`) fails again at once while
//! the pending connection stays queued, so a loop that retries straight away spins and fills the
//! log. Waiting gives the open connections time to end.

use std::time::{Duration, Instant};

/// The first wait after a failed accept; it doubles with each failure in a row.
const FIRST_WAIT: Duration = Duration::from_millis(10);
/// The longest wait between two tries.
const LONGEST_WAIT: Duration = Duration::from_secs(1);
/// How often a run of failures is logged.
const LOG_EVERY: Duration = Duration::from_secs(10);

/// The state of one accept loop's failures.
#[derive(Debug)]
pub struct AcceptBackoff {
    /// What is logged: "control socket", "gateway", …
    what: &'static str,
    wait: Duration,
    /// Failures since the last line logged.
    unlogged: u64,
    last_logged: Option<Instant>,
}

impl AcceptBackoff {
    pub fn new(what: &'static str) -> Self {
        AcceptBackoff {
            what,
            wait: FIRST_WAIT,
            unlogged: 0,
            last_logged: None,
        }
    }

    /// An accept succeeded: the next failure waits the shortest time again.
    pub fn succeeded(&mut self) {
        self.wait = FIRST_WAIT;
    }

    /// An accept failed with `error`: logs it (the first of a run, then at most every
    /// [`LOG_EVERY`], with the count) and returns how long to wait before the next try.
    pub fn failed(&mut self, error: &std::io::Error) -> Duration {
        self.unlogged += 1;
        let now = Instant::now();
        let due = self
            .last_logged
            .is_none_or(|at| now.duration_since(at) >= LOG_EVERY);
        if due {
            if self.unlogged == 1 {
                tracing::warn!("{}: accept failed: {error}", self.what);
            } else {
                tracing::warn!(
                    "{}: accept failed {} times since the last report: {error}",
                    self.what,
                    self.unlogged
                );
            }
            self.unlogged = 0;
            self.last_logged = Some(now);
        }
        let wait = self.wait;
        self.wait = (self.wait * 2).min(LONGEST_WAIT);
        wait
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_in_a_row_wait_longer_up_to_a_bound_and_a_success_resets_the_wait() {
        let mut backoff = AcceptBackoff::new("test");
        let emfile = std::io::Error::from_raw_os_error(24);
        let waits: Vec<Duration> = (0..10).map(|_| backoff.failed(&emfile)).collect();
        assert_eq!(waits[0], FIRST_WAIT);
        assert!(waits.windows(2).all(|w| w[1] >= w[0]), "{waits:?}");
        assert_eq!(*waits.last().unwrap(), LONGEST_WAIT);
        backoff.succeeded();
        assert_eq!(backoff.failed(&emfile), FIRST_WAIT);
    }

    #[test]
    fn a_run_of_failures_is_logged_once_until_the_interval_passes() {
        let mut backoff = AcceptBackoff::new("test");
        let emfile = std::io::Error::from_raw_os_error(24);
        backoff.failed(&emfile);
        for _ in 0..1000 {
            backoff.failed(&emfile);
        }
        assert_eq!(backoff.unlogged, 1000, "logged once, the rest counted");
    }
}
