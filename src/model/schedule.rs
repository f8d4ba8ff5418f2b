//! Pure time logic, `now` passed in: due times, lease tokens, backoff.
//!
//! Every time the queue stores is whole seconds from the host's clock (a MySQL `DATETIME` keeps
//! no more, and a lease token compared by equality must survive the column exactly). The rules:
//! - a row published or retried for now is due at `floor(now)`; one delayed by `d` is due at
//!   `ceil(now + d)`, so it is never claimed before it is due;
//! - a claim passes `floor(now)` and takes rows with `run_at <= now`;
//! - a lease token is `ceil(now) + lease`, so a lease lasts at least its full duration, and a row
//!   is free again once `locked_until <= floor(now)`. A later claim therefore always writes a
//!   larger token than the expired one it replaces.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Seconds since the Unix epoch, rounded down (negative before 1970).
pub(crate) fn epoch_secs(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_secs() as i64,
        Err(e) => {
            let d = e.duration();
            -(d.as_secs() as i64) - i64::from(d.subsec_nanos() > 0)
        }
    }
}

/// The time `secs` whole seconds after the epoch.
pub(crate) fn from_epoch_secs(secs: i64) -> SystemTime {
    if secs >= 0 {
        UNIX_EPOCH + Duration::from_secs(secs as u64)
    } else {
        UNIX_EPOCH - Duration::from_secs(secs.unsigned_abs())
    }
}

/// `t` rounded down to a whole second.
pub(crate) fn floor(t: SystemTime) -> SystemTime {
    from_epoch_secs(epoch_secs(t))
}

/// `t` rounded up to a whole second.
pub(crate) fn ceil(t: SystemTime) -> SystemTime {
    let f = floor(t);
    if f == t {
        f
    } else {
        f + Duration::from_secs(1)
    }
}

/// When a row published or retried at `now` with `delay` becomes due.
/// Delays past [`LATEST_SECS`] saturate there rather than overflow.
pub(crate) fn due_at(now: SystemTime, delay: Duration) -> SystemTime {
    if delay.is_zero() {
        floor(now)
    } else {
        later(now, delay)
    }
}

/// The latest time the queue writes: 9999-12-31 23:59:59 UTC, the end of a MySQL `DATETIME`.
/// A due time further out means "never", and saturates here.
pub(crate) const LATEST_SECS: i64 = 253_402_300_799;

/// `ceil(now + d)`, saturating at [`LATEST_SECS`].
fn later(now: SystemTime, d: Duration) -> SystemTime {
    let latest = from_epoch_secs(LATEST_SECS);
    match now.checked_add(d) {
        Some(t) if t < latest => ceil(t),
        _ => latest,
    }
}

/// The `now` a claim compares due times and lease deadlines with.
pub(crate) fn claim_now(now: SystemTime) -> SystemTime {
    floor(now)
}

/// True while a lease whose row holds `token` has not ended at `now`: a claim at `now` would
/// not find the row ([`claim_now`]`(now) < token`). A lease that has ended is not renewed or
/// extended, even if no claim has taken its row yet: a claim elsewhere may already have counted
/// it as free (a concurrency limit's rows in work, a FIFO group's), and bringing it back would
/// put one more row of a key, or a second row of a group, in work (model/README.md, F2).
pub(crate) fn lease_alive(token: SystemTime, now: SystemTime) -> bool {
    token > claim_now(now)
}

/// The lease token (deadline) a claim or renewal at `now` writes.
pub(crate) fn lease_token(now: SystemTime, lease_secs: u64) -> SystemTime {
    later(ceil(now), Duration::from_secs(lease_secs))
}

/// True if a renewal at `now` of a lease that holds at least `held` writes a token no claim
/// by another can write as well, so that a settlement may try it when the renewal's answer
/// was lost. A claim writes `ceil(c) + lease` and finds the row only once `floor(c) >= held`;
/// the renewal writes `ceil(now) + lease`: the two can be equal only if `ceil(now) >= held`
/// (a renewal late in the lease's last second, or after it).
///
/// Modelled in model/lease.pml (renew).
pub(crate) fn renewal_is_ours(now: SystemTime, held: SystemTime) -> bool {
    ceil(now) < held
}

/// Whole seconds of a lease duration: rounded up, at least one.
pub(crate) fn lease_secs(d: Duration) -> u64 {
    let s = d.as_secs().saturating_add(u64::from(d.subsec_nanos() > 0));
    s.max(1)
}

/// How often the renewer renews: half the lease, and at least hourly (renewing early is
/// harmless; a timer years out is not a timer).
pub(crate) fn renew_every(lease_secs: u64) -> Duration {
    Duration::from_millis(lease_secs.saturating_mul(500)).min(Duration::from_secs(3600))
}

/// Backoff after the `failures`-th consecutive failed claim round: doubling from `base`,
/// capped at `cap`.
pub(crate) fn backoff(failures: u32, base: Duration, cap: Duration) -> Duration {
    let factor = 1u32
        .checked_shl(failures.saturating_sub(1).min(16))
        .unwrap_or(u32::MAX);
    base.saturating_mul(factor).min(cap)
}

/// The first wait of an idle claim worker after a claim that found rows, where the database
/// has no change feed (MySQL/MariaDB): rows that keep arriving from other processes are seen
/// within milliseconds.
pub(crate) const FAST_POLL: Duration = Duration::from_millis(5);

/// The wait of an idle claim worker during the first [`HOT_POLLS`] empty polls after rows were
/// found, where the database has no change feed: a row another process publishes within
/// [`HOT_POLLS`] x [`HOT_POLL`] (50 ms) of the last is found 1 ms late on average, which is
/// what a stream of jobs from another service sees (cross-process p50 under 5 ms on MariaDB).
/// Each such poll is one plain indexed select.
pub(crate) const HOT_POLL: Duration = Duration::from_millis(2);
pub(crate) const HOT_POLLS: u32 = 25;

/// How long an idle claim worker waits after its `empty`-th empty claim in a row, where the
/// database has no change feed: [`HOT_POLL`] for the first [`HOT_POLLS`], then [`FAST_POLL`],
/// doubling with each one after, up to `poll_interval` (which an idle worker then keeps: one
/// claim per interval). A `poll_interval` shorter is kept as it is.
pub(crate) fn idle_poll(empty: u32, poll_interval: Duration) -> Duration {
    if empty <= HOT_POLLS {
        return HOT_POLL.min(poll_interval);
    }
    backoff(empty - HOT_POLLS, FAST_POLL, poll_interval).min(poll_interval)
}

/// How often the SQLite change probe looks, `idle` after the last change it saw: every
/// 250 us for 100 ms (a queue in use: a publish is seen an eighth of a millisecond late on
/// average), then every millisecond for a second, then every 2 ms for ten, then every 4 ms
/// (250 probes a second while nothing changes; a change is seen 2 ms late on average).
#[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
pub(crate) fn probe_every(idle: Duration) -> Duration {
    if idle < Duration::from_millis(100) {
        Duration::from_micros(250)
    } else if idle < Duration::from_secs(1) {
        Duration::from_millis(1)
    } else if idle < Duration::from_secs(10) {
        Duration::from_millis(2)
    } else {
        Duration::from_millis(4)
    }
}

/// Milliseconds since the epoch (0 before it): the rate limits' window stamps.
pub(crate) fn millis(t: SystemTime) -> i64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A lost renewal's token is kept only while no claim could write the same one: before
    /// the second in which the held token expires.
    #[test]
    fn a_renewal_is_ours_only_before_the_held_tokens_second() {
        let at = |s: f64| UNIX_EPOCH + Duration::from_secs_f64(s);
        let held = at(100.0);
        assert!(renewal_is_ours(at(98.5), held));
        assert!(renewal_is_ours(at(99.0), held));
        // ceil(99.2) = 100: a claim at 100.0 (floor 100 >= held) writes the same token.
        assert!(!renewal_is_ours(at(99.2), held));
        assert!(!renewal_is_ours(at(100.0), held));
        assert!(!renewal_is_ours(at(100.4), held));
        // The claim's side of it: a claim finds the row at 100.0 and writes ceil(100.0) + L,
        // which the renewal at 99.2 wrote too.
        assert_eq!(lease_token(at(99.2), 5), lease_token(at(100.0), 5));
    }

    #[test]
    fn idle_poll_is_fast_after_rows_and_backs_off_to_the_poll_interval() {
        let ms = Duration::from_millis;
        let poll = ms(250);
        assert!((1..=HOT_POLLS).all(|n| idle_poll(n, poll) == HOT_POLL));
        let waits: Vec<_> = (HOT_POLLS + 1..=HOT_POLLS + 9)
            .map(|n| idle_poll(n, poll))
            .collect();
        assert_eq!(
            waits,
            [
                ms(5),
                ms(10),
                ms(20),
                ms(40),
                ms(80),
                ms(160),
                poll,
                poll,
                poll
            ]
        );
        // Idle for ever: the interval, never more, never an overflow.
        assert_eq!(idle_poll(u32::MAX, poll), poll);
        assert_eq!(
            idle_poll(1, ms(2)),
            ms(2),
            "a shorter poll interval is kept"
        );
        assert_eq!(idle_poll(0, poll), HOT_POLL);
        // Claims an idle worker makes in its first second after the last rows; then 4 a second.
        let mut t = Duration::ZERO;
        let mut claims = 0;
        while t < Duration::from_secs(1) {
            claims += 1;
            t += idle_poll(claims, poll);
        }
        assert_eq!(claims, HOT_POLLS + 9);
    }

    #[test]
    fn the_probe_backs_off_when_idle() {
        let ms = Duration::from_millis;
        assert_eq!(probe_every(ms(0)), Duration::from_micros(250));
        assert_eq!(probe_every(ms(99)), Duration::from_micros(250));
        assert_eq!(probe_every(ms(100)), ms(1));
        assert_eq!(probe_every(ms(999)), ms(1));
        assert_eq!(probe_every(ms(1000)), ms(2));
        assert_eq!(probe_every(ms(10_000)), ms(4));
        assert_eq!(probe_every(Duration::MAX), ms(4));
    }

    fn at(secs: u64, millis: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs) + Duration::from_millis(millis)
    }

    #[test]
    fn rounding() {
        for (t, f, c) in [
            (at(100, 0), 100, 100),
            (at(100, 1), 100, 101),
            (at(100, 999), 100, 101),
        ] {
            assert_eq!(epoch_secs(floor(t)), f);
            assert_eq!(epoch_secs(ceil(t)), c);
        }
        assert_eq!(epoch_secs(UNIX_EPOCH - Duration::from_millis(500)), -1);
        assert_eq!(from_epoch_secs(-1), UNIX_EPOCH - Duration::from_secs(1));
    }

    #[test]
    fn due_times_are_never_early() {
        // Published at 100.7 for now: due at 100, claimable by a claim at 100.9 (now = 100).
        assert_eq!(epoch_secs(due_at(at(100, 700), Duration::ZERO)), 100);
        assert!(due_at(at(100, 700), Duration::ZERO) <= claim_now(at(100, 900)));
        // Delayed by one second at 100.7: due at 102, not at 101.2.
        let due = due_at(at(100, 700), Duration::from_secs(1));
        assert_eq!(epoch_secs(due), 102);
        assert!(due > claim_now(at(101, 200)));
        assert!(due <= claim_now(at(102, 0)));
    }

    #[test]
    fn lease_lasts_at_least_its_duration_and_tokens_grow() {
        let claimed = at(100, 10);
        let token = lease_token(claimed, 2);
        assert_eq!(epoch_secs(token), 103);
        // Still held at 102.99, free at 103.
        assert!(token > claim_now(at(102, 990)));
        assert!(token <= claim_now(at(103, 0)));
        // A claim after expiry writes a larger token.
        assert!(lease_token(at(103, 0), 2) > token);
    }

    #[test]
    fn lease_seconds() {
        assert_eq!(lease_secs(Duration::from_millis(1)), 1);
        assert_eq!(lease_secs(Duration::ZERO), 1);
        assert_eq!(lease_secs(Duration::from_millis(1500)), 2);
        assert_eq!(lease_secs(Duration::from_secs(30)), 30);
        assert_eq!(renew_every(30), Duration::from_secs(15));
        assert_eq!(renew_every(1), Duration::from_millis(500));
        assert_eq!(lease_secs(Duration::MAX), u64::MAX);
        assert_eq!(renew_every(u64::MAX), Duration::from_secs(3600));
    }

    #[test]
    fn huge_delays_saturate() {
        let now = at(100, 500);
        assert_eq!(epoch_secs(due_at(now, Duration::MAX)), LATEST_SECS);
        assert_eq!(epoch_secs(lease_token(now, u64::MAX)), LATEST_SECS);
        assert_eq!(epoch_secs(due_at(now, Duration::from_secs(10))), 111);
    }

    #[test]
    fn backoff_doubles_then_caps() {
        let b = Duration::from_millis(10);
        let cap = Duration::from_millis(1000);
        let got: Vec<_> = (1..=9).map(|n| backoff(n, b, cap).as_millis()).collect();
        assert_eq!(got, [10, 20, 40, 80, 160, 320, 640, 1000, 1000]);
        assert_eq!(backoff(1000, b, cap), cap);
    }
}
