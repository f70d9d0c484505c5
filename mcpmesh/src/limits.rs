//! Rate limits: a token bucket per (service, caller principal), via `governor`.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota};

/// Per-(service, caller) request budgets. One instance serves the whole node.
#[derive(Debug)]
pub struct RateLimiter {
    buckets: Option<DefaultKeyedRateLimiter<(String, String)>>,
    clock: DefaultClock,
}

impl RateLimiter {
    /// A limiter that admits everything, shared.
    pub fn unlimited_shared() -> Arc<Self> {
        Arc::new(RateLimiter {
            buckets: None,
            clock: DefaultClock::default(),
        })
    }

    /// `per_minute` requests a minute per key, bursting up to the same number.
    pub fn per_minute_shared(per_minute: u32) -> Arc<Self> {
        let buckets = NonZeroU32::new(per_minute)
            .map(|n| DefaultKeyedRateLimiter::keyed(Quota::per_minute(n)));
        Arc::new(RateLimiter {
            buckets,
            clock: DefaultClock::default(),
        })
    }

    /// Takes one token for `principal` on `service`; `Err` says how long until the next one.
    pub fn check(&self, service: &str, principal: &str) -> Result<(), Duration> {
        let Some(buckets) = &self.buckets else {
            return Ok(());
        };
        buckets
            .check_key(&(service.to_owned(), principal.to_owned()))
            .map_err(|not_until| not_until.wait_time_from(self.clock.now()))
    }

    /// How many (service, caller) buckets are held.
    pub fn tracked_callers(&self) -> usize {
        self.buckets.as_ref().map_or(0, |b| b.len())
    }

    /// Forgets callers whose buckets are full again, so idle callers cost no memory.
    pub fn evict_idle(&self) {
        if let Some(b) = &self.buckets {
            b.retain_recent();
            b.shrink_to_fit();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budgets_are_per_service_and_caller() {
        let l = RateLimiter::per_minute_shared(2);
        assert!(l.check("s", "a").is_ok());
        assert!(l.check("s", "a").is_ok());
        let wait = l.check("s", "a").unwrap_err();
        assert!(wait > Duration::ZERO && wait <= Duration::from_secs(30));
        assert!(
            l.check("s", "b").is_ok(),
            "another caller has its own bucket"
        );
        assert!(
            l.check("t", "a").is_ok(),
            "another service has its own bucket"
        );
        assert!(RateLimiter::unlimited_shared().check("s", "a").is_ok());
    }

    #[test]
    fn callers_that_went_idle_are_forgotten() {
        let l = RateLimiter::per_minute_shared(600_000); // refills in 100 µs
        for caller in 0..100 {
            l.check("s", &format!("eid:{caller}")).unwrap();
        }
        assert_eq!(l.tracked_callers(), 100);
        // Waiting out the refill is the behaviour under test.
        std::thread::sleep(Duration::from_millis(5));
        l.evict_idle();
        assert_eq!(l.tracked_callers(), 0);
    }
}
