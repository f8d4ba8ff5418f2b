//! The claim cursor of a subscription (tables without priorities or FIFO groups, in every form
//! on PostgreSQL and MySQL/MariaDB): where in claim order `(run_at, id)` the next claim starts
//! reading.
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
//! head, which comes after a claim from the cursor finds fewer rows than it asked for (the end
//! of the backlog) and at least every [`RESCAN`] (or the spacing below, when that is
//! longer). Claims still take rows in claim order within
//! each pass, and every claim is the same fenced, `SKIP LOCKED` statement: the cursor only
//! chooses where the scan starts, never what a claim may take.
//!
//! How soon after a short claim: at once while reading from the head is cheap, but no sooner
//! than [`HEAD_SPACING`] times what the last claim from the head took, counted from when it
//! began. And one claim at a time reads from the head: the subscription's other claim workers
//! read on from the cursor meanwhile. Under a steady load below the burn-down rate nearly every
//! claim is short (it takes the few rows just published), and while a snapshot is held the
//! walk from the head grows with every row claimed since: sent back on every short claim, and
//! every worker at once, the claims fell behind the publisher (BENCHMARKS.md, "Steady load
//! with a snapshot held, mended"). Spaced and one at a time, the walks from the head take at
//! most about a tenth of one worker's time; the price is that a row behind the cursor waits
//! up to that spacing, which is longer than [`RESCAN`] only while a walk from the head takes
//! over a tenth of a second. A worker whose claim from the cursor found nothing claims again
//! at the head's turn ([`ClaimCursor::head_in`]), not after its poll interval.

use std::time::{Duration, Instant, SystemTime};

use parking_lot::Mutex;

/// The longest a claim reads from the cursor before one reads from the head of the index
/// again, unless a claim from the head takes over a tenth of it ([`HEAD_SPACING`]). A rescan
/// over a long backlog's dead entries costs a few milliseconds; once a second that is under 1%
/// of a burn-down. Also how long a claim from the head may be under way before another may
/// begin (one that failed never reports).
pub(crate) const RESCAN: Duration = Duration::from_secs(1);

/// After a claim from the cursor comes back short, the next claim from the head waits until
/// this many times what the last claim from the head took has passed since it began.
pub(crate) const HEAD_SPACING: u32 = 10;

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
    /// Bumped when a claim from the head moves the cursor back: a claim that started before
    /// does not move it on (it would skip what the new pass has not read yet).
    pass: u64,
    /// The next claim reads from the head whatever the cursor says ([`ClaimCursor::rewind`]).
    rewound: bool,
    /// When the last claim from the head began, and how long it took.
    head_at: Instant,
    head_cost: Duration,
    /// A claim from the head is under way, begun then: the others read on from the cursor.
    head_flying: Option<Instant>,
    /// A claim from the cursor came back short: rows may wait behind it, and the next claim
    /// once the spacing has passed reads from the head.
    behind: bool,
}

/// Where one claim starts, handed back to [`ClaimCursor::advance`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Start {
    pub after: Option<Key>,
    pass: u64,
    /// When the claim began: what a claim from the head took is measured from here.
    at: Instant,
    /// This claim is the pass from the head.
    head: bool,
}

impl Default for ClaimCursor {
    fn default() -> Self {
        let now = Instant::now();
        ClaimCursor {
            state: Mutex::new(State {
                after: None,
                pass: 0,
                rewound: false,
                head_at: now,
                head_cost: Duration::ZERO,
                head_flying: None,
                behind: false,
            }),
        }
    }
}

impl ClaimCursor {
    /// Where the next claim starts: from the head once [`RESCAN`] has passed since the last
    /// claim from the head began, or the spacing after a short claim, unless a claim from the
    /// head is under way; else after the cursor.
    pub fn start(&self) -> Start {
        self.start_at(Instant::now())
    }

    fn start_at(&self, now: Instant) -> Start {
        let mut s = self.state.lock();
        let head = s.head_turn(now);
        if head {
            s.head_flying = Some(now);
            s.head_at = now;
            s.rewound = false;
            s.behind = false;
        }
        Start {
            after: if head { None } else { s.after },
            pass: s.pass,
            at: now,
            head,
        }
    }

    /// Where the next claim would read, without starting it: `None` when it would be the
    /// claim from the head, else the cursor (`Some(None)`: not set, from the head as well).
    /// For the readiness check of an idle worker, which reads where the claims do.
    pub fn peek_next(&self) -> Option<Option<Key>> {
        let s = self.state.lock();
        (!s.head_turn(Instant::now())).then_some(s.after)
    }

    /// The cursor, without starting a claim (which may take the turn to read from the head).
    #[cfg(test)]
    pub fn peek(&self) -> Option<Key> {
        self.state.lock().after
    }

    /// How long until the next claim reads from the head, if a short claim from the cursor
    /// asked for that: a worker whose claim came back empty claims again then, rather than
    /// sleeping through it (a row behind the cursor, an immediate retry, waits no longer).
    /// `None` while a claim from the head is under way: it reads what is behind.
    pub fn head_in(&self) -> Option<Duration> {
        self.head_in_at(Instant::now())
    }

    fn head_in_at(&self, now: Instant) -> Option<Duration> {
        let s = self.state.lock();
        let flying = s.head_flying.is_some_and(|at| now < at + s.period());
        (s.behind && !flying).then(|| s.head_due().saturating_duration_since(now))
    }

    /// The next claim starts from the head whatever the cursor says (`testing::drain`: a claim
    /// that then finds nothing proves no row is claimable).
    #[cfg_attr(not(feature = "testing"), allow(dead_code))]
    pub fn rewind(&self) {
        let mut s = self.state.lock();
        s.head_flying = None;
        s.rewound = true;
    }

    /// A claim that started at `start` asked for `limit` rows and took those keyed `keys`.
    /// From the cursor, the cursor moves to the largest key taken (never back within a pass);
    /// fewer than asked: it reached the end, and a claim from the head comes next once the
    /// spacing allows. From the head: fewer than asked, it read everything ready, and the
    /// cursor moves on as from the cursor; all it asked for, more may wait behind the cursor,
    /// and the claims read on from its last row (a new pass).
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
        let (mut taken, mut last) = (0, None);
        for k in keys {
            taken += 1;
            last = last.max(Some(k));
        }
        if start.head {
            if s.head_flying == Some(start.at) {
                s.head_flying = None;
            }
            s.head_cost = now.saturating_duration_since(start.at);
            if taken >= limit {
                s.after = last;
                s.pass += 1;
            } else {
                s.after = s.after.max(last);
            }
            return;
        }
        if start.pass != s.pass {
            return;
        }
        s.after = s.after.max(last);
        if taken < limit && start.after.is_some() {
            s.behind = true;
        }
    }
}

impl State {
    /// True if the next claim is the one from the head: one is due (the period, or the
    /// spacing after a short claim) and none is under way (or one has been for a period: it
    /// failed and never reported).
    fn head_turn(&self, now: Instant) -> bool {
        let due = self.rewound
            || now >= self.head_at + self.period()
            || (self.behind && now >= self.head_due());
        due && self.head_flying.is_none_or(|at| now >= at + self.period())
    }

    /// The longest between claims from the head: [`RESCAN`], or the spacing when that is
    /// longer (a walk from the head of over a tenth of a second).
    fn period(&self) -> Duration {
        RESCAN.max(self.head_cost * HEAD_SPACING)
    }

    /// When a short claim's pass from the head may begin.
    fn head_due(&self) -> Instant {
        self.head_at + self.head_cost * HEAD_SPACING
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
        // Past the period: one claim from the head, whatever the cursor said.
        let later = t + RESCAN + Duration::from_millis(1);
        let fresh = c.start_at(later);
        assert_eq!(fresh.after, None);
        // While it is under way, the others read on from the cursor.
        let other = c.start_at(later);
        assert_eq!(other.after, Some(key(5, 5)));
        // It took all it asked for: the claims read on from its last row, behind where the
        // cursor was (rows were waiting there).
        c.advance_at(later, fresh, 1, [key(2, 2)].into_iter());
        assert_eq!(c.start_at(later).after, Some(key(2, 2)));
        // Claims begun before it do not move the cursor on past what it has not read yet.
        c.advance_at(later, old, 1, [key(9, 9)].into_iter());
        c.advance_at(later, other, 1, [key(8, 8)].into_iter());
        assert_eq!(c.start_at(later).after, Some(key(2, 2)));
        // And the period starts again from the claim from the head.
        assert_eq!(c.start_at(later + RESCAN / 2).after, Some(key(2, 2)));
        assert_eq!(c.start_at(later + RESCAN).after, None);
    }

    /// Fails with every claim reading from the head while one does (`other.after`), or with
    /// a claim from the head that failed holding the others off for ever.
    #[test]
    fn one_claim_at_a_time_reads_from_the_head() {
        let c = ClaimCursor::default();
        let t = Instant::now() + Duration::from_secs(5);
        let s = c.start_at(t - RESCAN * 2);
        c.advance_at(t - RESCAN * 2, s, 1, [key(5, 5)].into_iter());
        let head = c.start_at(t);
        assert_eq!(head.after, None);
        for other in [t, t + RESCAN / 2] {
            assert_eq!(c.start_at(other).after, Some(key(5, 5)));
        }
        // A claim from the cursor comes back empty meanwhile: its worker is not sent to claim
        // again at once (it would spin on empty claims for as long as the walk takes).
        let short = c.start_at(t);
        c.advance_at(t, short, 4, std::iter::empty());
        assert_eq!(c.head_in_at(t + RESCAN / 2), None);
        // The claim from the head never reported (its statement failed): after a period
        // another claim reads from the head.
        let again = c.start_at(t + RESCAN);
        assert_eq!(again.after, None);
        assert_eq!(c.start_at(t + RESCAN).after, Some(key(5, 5)));
        // The lost one reporting late changes nothing of the new one's flight.
        c.advance_at(t + RESCAN, head, 4, std::iter::empty());
        assert_eq!(c.start_at(t + RESCAN).after, Some(key(5, 5)));
        // The new one's report ends it; a short claim from the head keeps the cursor.
        c.advance_at(t + RESCAN, again, 4, std::iter::empty());
        assert_eq!(c.start_at(t + RESCAN).after, Some(key(5, 5)));
        // `rewind`: the next claim reads from the head.
        c.rewind();
        assert_eq!(c.start().after, None);
    }

    /// Fails with every short claim sending the next to the head (the walks that kept
    /// PostgreSQL behind a steady load while a snapshot was held).
    #[test]
    fn a_short_claim_waits_for_the_spacing_before_the_head() {
        let c = ClaimCursor::default();
        let t = Instant::now() + Duration::from_secs(5);
        // The pass begins at t; its claim from the head takes 20 ms and is short: the cursor
        // moves to what it took, and the next claim reads on from there (nothing can be
        // behind a claim that read from the head).
        let s = c.start_at(t);
        assert_eq!(s.after, None);
        let head = Duration::from_millis(20);
        c.advance_at(t + head, s, 4, [key(5, 1)].into_iter());
        assert_eq!(c.start_at(t + head).after, Some(key(5, 1)));
        // A short claim from the cursor: rows may wait behind it, but the next head pass
        // waits until ten head claims' time has passed since the pass began.
        let s = c.start_at(t + head);
        c.advance_at(t + head * 2, s, 4, [key(5, 2)].into_iter());
        let spaced = t + head * HEAD_SPACING;
        assert!(spaced > t + head * 3);
        // A walk from the head of 200 ms: the period is still RESCAN; of 300 ms, ten of them.
        {
            let c = ClaimCursor::default();
            let s = c.start_at(t);
            c.advance_at(t + head * 15, s, 4, [key(5, 1)].into_iter());
            for (at, after) in [(RESCAN * 29 / 10, Some(key(5, 1))), (RESCAN * 3, None)] {
                assert_eq!(c.start_at(t + at).after, after, "{at:?}");
            }
        }
        for now in [t + head * 3, spaced - head] {
            assert_eq!(c.start_at(now).after, Some(key(5, 2)));
        }
        // Then from the head.
        let s = c.start_at(spaced);
        assert_eq!(s.after, None);
        // A cheap pass from the head: the next short claim sends the next one back at once.
        c.advance_at(spaced, s, 1, [key(5, 3)].into_iter());
        let s = c.start_at(spaced);
        assert_eq!(s.after, Some(key(5, 3)));
        c.advance_at(spaced, s, 1, std::iter::empty());
        assert_eq!(c.start_at(spaced).after, None);
    }
}
