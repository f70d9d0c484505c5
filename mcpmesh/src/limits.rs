//! Rate limits: token buckets per (service, caller principal), via `governor`. A caller's
//! requests and session opens share one budget (`rate_limit_per_min`); its notifications have
//! a cap of their own, so that a client's progress or log chatter never costs it requests; its
//! answers to the server's own requests are not counted (the server asked for them).

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota};

/// Notifications a caller may send a service a minute, whatever its request budget.
pub const NOTIFICATIONS_PER_MIN: u32 = 6_000;

/// The burst a budget of `per_minute` allows: a tenth of it, at least 60, never more than it.
fn burst(per_minute: NonZeroU32) -> NonZeroU32 {
    let n = per_minute.get();
    NonZeroU32::new((n / 10).max(60).min(n)).unwrap_or(per_minute)
}

/// Whose budget a token comes from: a service and a caller's principal. A session makes its key
/// once ([`Budget::of`]) and every request of it takes from that, with nothing allocated.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Budget {
    service: Arc<str>,
    principal: Arc<str>,
}

impl Budget {
    pub fn of(service: &str, principal: &str) -> Self {
        Budget {
            service: service.into(),
            principal: principal.into(),
        }
    }
}

fn bucket(per_minute: NonZeroU32) -> DefaultKeyedRateLimiter<Budget> {
    DefaultKeyedRateLimiter::keyed(Quota::per_minute(per_minute).allow_burst(burst(per_minute)))
}

/// Per-(service, caller) budgets. One instance serves the whole node.
#[derive(Debug)]
pub struct RateLimiter {
    buckets: Option<DefaultKeyedRateLimiter<Budget>>,
    notifications: Option<DefaultKeyedRateLimiter<Budget>>,
    clock: DefaultClock,
}

impl RateLimiter {
    /// A limiter that admits everything, shared.
    pub fn unlimited_shared() -> Arc<Self> {
        Arc::new(RateLimiter {
            buckets: None,
            notifications: None,
            clock: DefaultClock::default(),
        })
    }

    /// `per_minute` requests and session opens a minute per key, bursting up to a tenth of
    /// that (at least 60); notifications up to [`NOTIFICATIONS_PER_MIN`].
    pub fn per_minute_shared(per_minute: u32) -> Arc<Self> {
        let notifications = NonZeroU32::new(NOTIFICATIONS_PER_MIN).map(bucket);
        Arc::new(RateLimiter {
            buckets: NonZeroU32::new(per_minute).map(bucket),
            notifications,
            clock: DefaultClock::default(),
        })
    }

    /// Takes one request token for `principal` on `service`; `Err` says how long until the
    /// next one.
    pub fn check(&self, service: &str, principal: &str) -> Result<(), Duration> {
        self.take(self.buckets.as_ref(), &Budget::of(service, principal))
    }

    /// Takes one request token from `budget`.
    pub fn check_budget(&self, budget: &Budget) -> Result<(), Duration> {
        self.take(self.buckets.as_ref(), budget)
    }

    /// Takes one notification token from `budget`.
    pub fn check_notification(&self, budget: &Budget) -> Result<(), Duration> {
        self.take(self.notifications.as_ref(), budget)
    }

    fn take(
        &self,
        buckets: Option<&DefaultKeyedRateLimiter<Budget>>,
        budget: &Budget,
    ) -> Result<(), Duration> {
        let Some(buckets) = buckets else {
            return Ok(());
        };
        buckets
            .check_key(budget)
            .map_err(|not_until| not_until.wait_time_from(self.clock.now()))
    }

    /// How many (service, caller) buckets are held.
    pub fn tracked_callers(&self) -> usize {
        self.buckets.as_ref().map_or(0, |b| b.len())
    }

    /// Forgets callers whose buckets are full again, so idle callers cost no memory.
    pub fn evict_idle(&self) {
        for b in [&self.buckets, &self.notifications].into_iter().flatten() {
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
    fn a_sessions_budget_is_the_bucket_of_its_service_and_caller() {
        let l = RateLimiter::per_minute_shared(2);
        let budget = Budget::of("s", "a");
        assert!(l.check_budget(&budget).is_ok());
        assert!(l.check("s", "a").is_ok());
        assert!(l.check_budget(&budget).is_err(), "one bucket for both");
        assert!(
            l.check_notification(&budget).is_ok(),
            "notifications have a cap of their own"
        );
        assert!(l.check_budget(&Budget::of("s", "b")).is_ok());
        assert!(
            l.check_budget(&Budget::of("sa", "")).is_ok(),
            "no two keys run together"
        );
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
