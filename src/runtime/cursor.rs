//! The claim cursor of a subscription (tables without priorities or FIFO groups: PostgreSQL in
//! every form, MySQL/MariaDB in the row lock and lease forms): where in claim order `(run_at,
//! id)` the next claim starts reading.
//!
//! Why: every acked or claimed row leaves a dead entry in the ready index until vacuum removes
//! it, and a claim that starts from the head of the index walks all of them. Over a
//! 1,000,000-job backlog that walk grew to thousands of index pages per claim and the rate fell
//! to a third (BENCHMARKS.md, issue 18); while another session holds a snapshot open, none of
//! them can be removed, and the row lock and advisory forms fell to a quarter and a seventh
//! (issue 28). A claim that starts past the last row claimed reads only live entries.
//!
//! What it costs in order: a row that becomes claimable behind the cursor (its lease expired, a
//! shutdown handed it back, a publish that committed after later ids were claimed, a `run_at`
//! in the past) is not seen by claims from the cursor. It is found by the next claim from the
//! head, which comes when a claim from the cursor finds fewer rows than it asked for (the end
//! of the backlog) and at least every [`RESCAN`]. Claims still take rows in claim order within
//! each pass, and every claim is the same fenced, `SKIP LOCKED` statement: the cursor only
//! chooses where the scan starts, never what a claim may take.

use std::time::{Duration, Instant, SystemTime};

use parking_lot::Mutex;

/// The longest a claim reads from the cursor before one reads from the head of the index
/// again. A rescan over a long backlog's dead entries costs a few milliseconds; once a second
/// that is under 1% of a burn-down.
pub(crate) const RESCAN: Duration = Duration::from_secs(1);

/// A position in claim order: `(run_at, id)` of a claimed row.
pub(crate) type Key = (SystemTime, i64);

/// Shared by the claim workers of one subscription.
#[derive(Debug)]
pub(crate) struct ClaimCursor {
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    /// Claims start after this key; `None`: from the head.
    after: Option<Key>,
    /// Bumped by every restart from the head: a claim that started in an older pass does not
    /// move the cursor (it would skip what the new pass has not read yet).
    pass: u64,
    /// When the next claim starts from the head whatever the cursor says.
    rescan_at: Instant,
}

/// Where one claim starts, handed back to [`ClaimCursor::advance`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Start {
    pub after: Option<Key>,
    pass: u64,
}

impl Default for ClaimCursor {
    fn default() -> Self {
        ClaimCursor {
            state: Mutex::new(State {
                after: None,
                pass: 0,
                rescan_at: Instant::now() + RESCAN,
            }),
        }
    }
}

impl ClaimCursor {
    /// Where the next claim starts: after the cursor, or from the head once [`RESCAN`] has
    /// passed since the last pass began.
    pub fn start(&self) -> Start {
        self.start_at(Instant::now())
    }

    fn start_at(&self, now: Instant) -> Start {
        let mut s = self.state.lock();
        if now >= s.rescan_at {
            s.restart(now);
        }
        Start {
            after: s.after,
            pass: s.pass,
        }
    }

    /// The next claim starts from the head whatever the cursor says (`testing::drain`: a claim
    /// that then finds nothing proves no row is claimable).
    #[cfg_attr(not(feature = "testing"), allow(dead_code))]
    pub fn rewind(&self) {
        self.state.lock().restart(Instant::now());
    }

    /// A claim that started at `start` asked for `limit` rows and took those keyed `keys`.
    /// Fewer than asked: it reached the end, the next claim starts from the head. Else the
    /// cursor moves to the largest key taken (never back within a pass).
    pub fn advance(&self, start: Start, limit: usize, keys: impl Iterator<Item = Key>) {
        self.advance_at(Instant::now(), start, limit, keys)
    }

    fn advance_at(
        &self,
        now: Instant,
        start: Start,
        limit: usize,
        keys: impl Iterator<Item = Key>,
    ) {
        let mut s = self.state.lock();
        if start.pass != s.pass {
            return;
        }
        let (mut taken, mut last) = (0, None);
        for k in keys {
            taken += 1;
            last = last.max(Some(k));
        }
        if taken < limit {
            s.restart(now);
        } else {
            s.after = s.after.max(last);
        }
    }
}

impl State {
    fn restart(&mut self, now: Instant) {
        self.after = None;
        self.pass += 1;
        self.rescan_at = now + RESCAN;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::UNIX_EPOCH;

    fn key(s: u64, id: i64) -> Key {
        (UNIX_EPOCH + Duration::from_secs(s), id)
    }

    #[test]
    fn full_claims_move_the_cursor_forward_and_a_short_one_restarts() {
        let c = ClaimCursor::default();
        let t = Instant::now();
        let s = c.start_at(t);
        assert_eq!(s.after, None);
        c.advance_at(t, s, 2, [key(5, 2), key(5, 1)].into_iter());
        assert_eq!(c.start_at(t).after, Some(key(5, 2)));
        // A later second beats a larger id.
        let s = c.start_at(t);
        c.advance_at(t, s, 2, [key(6, 3), key(5, 9)].into_iter());
        assert_eq!(c.start_at(t).after, Some(key(6, 3)));
        // Never back within a pass.
        let s = c.start_at(t);
        c.advance_at(t, s, 1, [key(1, 1)].into_iter());
        assert_eq!(c.start_at(t).after, Some(key(6, 3)));
        // Fewer rows than asked: the end; the next claim reads from the head.
        let s = c.start_at(t);
        c.advance_at(t, s, 3, [key(7, 4)].into_iter());
        assert_eq!(c.start_at(t).after, None);
    }

    #[test]
    fn a_rescan_comes_every_period_and_stale_claims_do_not_move_it() {
        let c = ClaimCursor::default();
        let t = Instant::now();
        let s = c.start_at(t);
        c.advance_at(t, s, 1, [key(5, 5)].into_iter());
        let old = c.start_at(t);
        assert_eq!(old.after, Some(key(5, 5)));
        // Past the period: from the head, whatever the cursor said.
        let later = t + RESCAN + Duration::from_millis(1);
        let fresh = c.start_at(later);
        assert_eq!(fresh.after, None);
        // A claim of the old pass ends after the restart: ignored.
        c.advance_at(later, old, 1, [key(9, 9)].into_iter());
        assert_eq!(c.start_at(later).after, None);
        // The new pass's claim sets it, even behind where the old pass was.
        c.advance_at(later, fresh, 1, [key(2, 2)].into_iter());
        assert_eq!(c.start_at(later).after, Some(key(2, 2)));
        // And the period starts again from the restart.
        assert_eq!(c.start_at(later + RESCAN / 2).after, Some(key(2, 2)));
    }
}
