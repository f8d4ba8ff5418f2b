//! The retry policy: how long a failed delivery waits before its next attempt. Pure logic,
//! the random part passed in.

use std::time::Duration;

/// How long a delivery retried without a delay of its own waits before its next attempt:
/// exponential backoff with jitter, capped. That is every retry path but an explicit delay:
/// [`Delivery::retry`](crate::Delivery::retry), [`Delivery::fail`](crate::Delivery::fail), an
/// error or a panic in [`Subscription::run`](crate::Subscription::run), a delivery dropped
/// unsettled, and a handler timeout. Once the table's
/// [`max_attempts`](crate::Table::max_attempts) (25 by default) are spent the row is
/// dead-lettered with the error's text instead.
/// [`Delivery::retry_after`](crate::Delivery::retry_after) and
/// [`Outcome::RetryAfter`](crate::Outcome::RetryAfter) set their own delay. Set it per
/// subscription with
/// [`SubscriptionBuilder::retry_policy`](crate::SubscriptionBuilder::retry_policy).
///
/// The delay after attempt `n` is `base x 2^(n-1)`, capped at `cap`, then jittered into its
/// upper half (`[d/2, d]`), so rows that failed together do not all come back together.
///
/// ```
/// use sqlbroker::RetryPolicy;
/// use std::time::Duration;
///
/// let p = RetryPolicy::exponential(Duration::from_secs(1), Duration::from_secs(60));
/// for attempt in 1..=10 {
///     let d = p.delay(attempt);
///     assert!(d <= Duration::from_secs(60));
/// }
/// assert!(p.delay(3) >= Duration::from_secs(2)); // 4 s, jittered into [2 s, 4 s]
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    base: Duration,
    cap: Duration,
    jitter: bool,
}

impl Default for RetryPolicy {
    /// 1 s after the first attempt, doubling, at most 10 minutes, with jitter.
    fn default() -> Self {
        RetryPolicy::exponential(Duration::from_secs(1), Duration::from_secs(600))
    }
}

impl RetryPolicy {
    /// `base` after the first attempt, doubling with each, at most `cap`; with jitter.
    pub fn exponential(base: Duration, cap: Duration) -> Self {
        RetryPolicy {
            base,
            cap: cap.max(base),
            jitter: true,
        }
    }

    /// The same delays without jitter (for tests and for work that must be evenly spaced).
    pub fn without_jitter(mut self) -> Self {
        self.jitter = false;
        self
    }

    /// The delay before the attempt after attempt `attempt` (1-based).
    pub fn delay(&self, attempt: u32) -> Duration {
        self.delay_with(attempt, random_unit())
    }

    /// [`delay`](RetryPolicy::delay) with the random draw `u` in `[0, 1)` given.
    pub(crate) fn delay_with(&self, attempt: u32, u: f64) -> Duration {
        let full = crate::model::schedule::backoff(attempt.max(1), self.base, self.cap);
        if !self.jitter {
            return full;
        }
        let half = full / 2;
        half + half.mul_f64(u.clamp(0.0, 1.0))
    }
}

/// A draw in `[0, 1)` from the clock and a per-process counter (splitmix64): jitter needs
/// spread, not secrecy.
fn random_unit() -> f64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or_default();
    let mut z = nanos ^ N.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_caps_and_jitters_into_the_upper_half() {
        let p = RetryPolicy::exponential(Duration::from_secs(1), Duration::from_secs(30));
        let plain = p.without_jitter();
        let got: Vec<u64> = (1..=7).map(|a| plain.delay(a).as_secs()).collect();
        assert_eq!(got, [1, 2, 4, 8, 16, 30, 30]);
        assert_eq!(p.delay_with(3, 0.0), Duration::from_secs(2));
        assert_eq!(p.delay_with(3, 0.5), Duration::from_secs(3));
        assert!(p.delay_with(3, 0.999_999) <= Duration::from_secs(4));
        for a in 1..=40 {
            let d = p.delay(a);
            let full = plain.delay(a);
            assert!(
                d >= full / 2 && d <= full,
                "attempt {a}: {d:?} outside [{:?}, {full:?}]",
                full / 2
            );
        }
        let draws: Vec<f64> = (0..100).map(|_| random_unit()).collect();
        assert!(draws.iter().all(|u| (0.0..1.0).contains(u)));
        assert!(draws.windows(2).any(|w| w[0] != w[1]), "no spread");
    }
}
