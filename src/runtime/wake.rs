//! Wake-ups of idle claim workers: a publish (or a returned row) on this broker, or a change
//! another process made that the broker's watcher saw (`listen`), wakes idle claim workers of
//! its table at once instead of at their next poll.
//!
//! No herd: a wake-up for `n` rows wakes at most `n` idle workers (each gets a ticket); only
//! stop and a watcher's reconnection wake them all. A worker reads [`Wake::seq`] before it
//! claims and waits only while the count has not moved since, so a wake-up that lands during
//! its claim is never missed.

use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

/// A counter that waiters watch, and tickets for the waiters a wake-up lets go.
#[derive(Default)]
pub(crate) struct Wake {
    state: Mutex<State>,
    cv: Condvar,
    /// Debounces this table's cross-process notifications (PostgreSQL).
    pub gate: Gate,
    /// The table's pause flag as this broker last read it.
    pub pause: PauseFlag,
}

#[derive(Default)]
struct State {
    seq: u64,
    /// Threads inside [`Wake::wait`].
    waiting: usize,
    /// Wake-ups granted to waiters that have not taken them yet (never more than `waiting`).
    tickets: usize,
}

impl Wake {
    /// The current count, read before a claim so a wake-up during the claim is not missed.
    pub fn seq(&self) -> u64 {
        self.state.lock().seq
    }

    /// Wakes at most `n` idle waiters: a publish of `n` rows needs no more claimers than that.
    /// Workers inside a claim see the count move and claim once more instead of waiting.
    pub fn notify(&self, n: usize) {
        let give = {
            let mut s = self.state.lock();
            s.seq += 1;
            let give = n.min(s.waiting - s.tickets);
            s.tickets += give;
            give
        };
        for _ in 0..give {
            self.cv.notify_one();
        }
    }

    /// Wakes every waiter: stop, or a watcher that reconnected (rows may have arrived unseen).
    pub fn notify_all(&self) {
        {
            let mut s = self.state.lock();
            s.seq += 1;
            s.tickets = s.waiting;
        }
        self.cv.notify_all();
    }

    /// Waits until a wake-up lets this waiter go or `timeout` passes; returns at once if the
    /// count moved past `seen`. True if woken (or the count had moved), false if it timed out.
    pub fn wait(&self, seen: u64, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut s = self.state.lock();
        if s.seq != seen {
            return true;
        }
        s.waiting += 1;
        let woken = loop {
            // A ticket granted as the wait timed out is taken all the same: the count of
            // tickets never exceeds the waiters left to take them.
            let timed_out = self.cv.wait_until(&mut s, deadline).timed_out();
            if s.tickets > 0 {
                s.tickets -= 1;
                break true;
            }
            if timed_out {
                break false;
            }
        };
        s.waiting -= 1;
        woken
    }

    /// Threads waiting now (tests).
    #[cfg(test)]
    pub fn waiting(&self) -> usize {
        self.state.lock().waiting
    }
}

/// A table's pause flag ([`Broker::pause`](crate::Broker::pause)) as this broker's claimers
/// last read it from the registry: read again at most once per poll interval, whichever
/// worker of whichever subscription finds it due, so claims pay nothing per claim. A wake-up
/// while paused, this broker's own pause or resume, and a pause notification from another
/// broker (PostgreSQL) make it due at once.
#[derive(Default)]
pub(crate) struct PauseFlag {
    state: Mutex<PauseState>,
}

#[derive(Default)]
struct PauseState {
    paused: bool,
    /// When it was last read (or set); `None`: read it before the next claim.
    read_at: Option<Instant>,
    /// A worker is reading it: nobody claims on the old value meanwhile.
    reading: bool,
    /// Bumped by this broker's own pause or resume and by a notification: a read that began
    /// before either may have seen the old value, so its result does not overwrite the flag.
    epoch: u64,
    /// It was read (or set) once: from then on, `read_at` being `None` means a read failed
    /// or a notification came since, not that nobody ever asked.
    ever_read: bool,
}

/// What [`PauseFlag::check`] tells a claim worker.
pub(crate) enum PauseCheck<'a> {
    /// Read less than a poll interval ago: paused or not.
    Fresh(bool),
    /// Due: this worker reads it and reports through the [`PauseRead`] (dropping it unreported,
    /// a panic included, counts as a failed read, so no worker waits on it for ever).
    Read(PauseRead<'a>),
    /// Another worker is reading it: claim nothing until it has.
    Reading,
}

/// One worker's read of the flag under way ([`PauseCheck::Read`]).
pub(crate) struct PauseRead<'a> {
    flag: &'a PauseFlag,
    epoch: u64,
    done: bool,
}

impl PauseRead<'_> {
    /// The flag as just read from the registry; returns (before, now). A read that began before
    /// this broker's own pause or resume (or a notification) leaves the newer value standing.
    pub fn set(mut self, paused: bool) -> (bool, bool) {
        self.done = true;
        let mut s = self.flag.state.lock();
        s.reading = false;
        let before = s.paused;
        if s.epoch == self.epoch {
            s.read_at = Some(Instant::now());
            s.paused = paused;
            s.ever_read = true;
        }
        (before, s.paused)
    }

    /// A read that failed: claim nothing now (true), and read it again before the next claim.
    /// The last value may be old by now (a database that stopped answering for seconds, and
    /// a pause made meanwhile): a claim on it could start long after the pause returned.
    pub fn failed(mut self) -> bool {
        self.done = true;
        self.flag.unread()
    }
}

impl Drop for PauseRead<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.flag.unread();
        }
    }
}

impl PauseFlag {
    /// The flag if it was read less than `every` ago; otherwise the caller is the one to read
    /// it (so other workers do not read it too), or another worker already is. A worker that
    /// claimed on the old value while a read was under way could claim just after a pause.
    pub fn check(&self, every: Duration) -> PauseCheck<'_> {
        let mut s = self.state.lock();
        if s.reading {
            return PauseCheck::Reading;
        }
        match s.read_at {
            Some(at) if at.elapsed() < every => PauseCheck::Fresh(s.paused),
            _ => {
                s.reading = true;
                PauseCheck::Read(PauseRead {
                    flag: self,
                    epoch: s.epoch,
                    done: false,
                })
            }
        }
    }

    /// True if the table was paused, or the flag was last read `every` or longer ago, or its
    /// last read failed or a notification came since (another worker's failed read must not
    /// make an old decision look fresh: the soak's seed 1 on PostgreSQL advisory, a claim
    /// decided before a silence ran after it, past a pause made during it): a claim decided
    /// on an earlier read must not run now. (Never read at all: the worker's loop reads it
    /// before it claims; a claim made without it, as the crate's own tests make, is let be.)
    pub fn too_old(&self, every: Duration) -> bool {
        let s = self.state.lock();
        s.paused
            || match s.read_at {
                Some(at) => at.elapsed() >= every,
                None => s.ever_read,
            }
    }

    /// True if the flag was read less than `every` ago, no read is under way, and the table
    /// was not paused: a handler thread's own claim goes ahead only then (it leaves reads to
    /// the workers).
    pub fn running(&self, every: Duration) -> bool {
        let s = self.state.lock();
        !s.paused && !s.reading && s.read_at.is_some_and(|at| at.elapsed() < every)
    }

    /// This broker's own pause or resume, just written to the registry: it stands over any
    /// read under way.
    pub fn own(&self, paused: bool) {
        let mut s = self.state.lock();
        s.epoch += 1;
        s.read_at = Some(Instant::now());
        s.paused = paused;
        s.ever_read = true;
    }

    /// A read that failed or never reported: nobody claims on the old value; the next check
    /// reads the flag again.
    fn unread(&self) -> bool {
        let mut s = self.state.lock();
        s.read_at = None;
        s.reading = false;
        true
    }

    /// Reads the flag again before the next claim (a notification: a read under way may have
    /// missed what it announces).
    pub fn stale(&self) {
        let mut s = self.state.lock();
        s.epoch += 1;
        s.read_at = None;
    }
}

/// Debounce of a table's cross-process notifications from this broker (PostgreSQL): while a
/// notification this broker sent has not come back through its own listener, a publish skips
/// its own and counts its rows here instead; the listener sends one notification for them when
/// the earlier one arrives (by then the skipped rows have committed), so the last one is never
/// lost. A notification not back within [`Gate::STALE`] no longer holds anything back.
#[derive(Default)]
pub(crate) struct Gate {
    state: Mutex<GateState>,
}

#[derive(Default)]
struct GateState {
    /// Our listener listens on the table's channel: notifications come back.
    armed: bool,
    /// When the notification not yet back was sent.
    in_flight: Option<Instant>,
    /// Rows committed whose notification was skipped.
    owed: usize,
}

impl Gate {
    /// How long a notification may take to come back before it holds nothing back.
    pub const STALE: Duration = Duration::from_millis(50);

    /// The listener listens (true) or lost its connection (false: nothing comes back).
    pub fn arm(&self, armed: bool) {
        let mut s = self.state.lock();
        s.armed = armed;
        s.in_flight = None;
    }

    /// A publish's rows committed: true if their notification may be skipped, an earlier
    /// one still being on its way (the rows are then owed to the one the listener sends when
    /// it arrives); false to send one now (it is then the one in flight).
    pub fn defer(&self, rows: usize, now: Instant) -> bool {
        let mut s = self.state.lock();
        match s.in_flight {
            Some(sent) if s.armed && now.saturating_duration_since(sent) < Self::STALE => {
                s.owed += rows;
                true
            }
            _ => {
                s.in_flight = Some(now);
                false
            }
        }
    }

    /// A notification on the table's channel arrived (or a tick found the one in flight
    /// stale): the rows owed, if any, to notify now (the gate is then in flight again).
    pub fn arrived(&self, now: Instant, stale_only: bool) -> usize {
        let mut s = self.state.lock();
        if stale_only {
            match s.in_flight {
                Some(sent) if now.saturating_duration_since(sent) < Self::STALE => return 0,
                _ => {}
            }
        }
        s.in_flight = None;
        let owed = std::mem::take(&mut s.owed);
        if owed > 0 {
            s.in_flight = Some(now);
        }
        owed
    }

    /// The notification could not be sent.
    pub fn failed(&self) {
        self.state.lock().in_flight = None;
    }

    /// The listener could not send what it owed: owed again.
    pub fn restore(&self, rows: usize) {
        let mut s = self.state.lock();
        s.in_flight = None;
        s.owed += rows;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    fn waiters(
        wake: &Arc<Wake>,
        n: usize,
        woke: &Arc<AtomicUsize>,
    ) -> Vec<std::thread::JoinHandle<()>> {
        let seen = wake.seq();
        let handles = (0..n)
            .map(|_| {
                let (wake, woke) = (wake.clone(), woke.clone());
                std::thread::spawn(move || {
                    let start = Instant::now();
                    wake.wait(seen, Duration::from_secs(5));
                    if start.elapsed() < Duration::from_secs(4) {
                        woke.fetch_add(1, Ordering::SeqCst);
                    }
                })
            })
            .collect();
        let deadline = Instant::now() + Duration::from_secs(5);
        while wake.waiting() < n && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(wake.waiting(), n, "the waiters did not all park");
        handles
    }

    /// No herd: a wake-up for one row lets one of four idle waiters go, for two rows two;
    /// `notify_all` the rest.
    #[test]
    fn a_wake_up_for_n_rows_wakes_at_most_n_waiters() {
        let wake = Arc::new(Wake::default());
        let woke = Arc::new(AtomicUsize::new(0));
        let handles = waiters(&wake, 4, &woke);
        wake.notify(1);
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(
            woke.load(Ordering::SeqCst),
            1,
            "a wake-up for 1 row woke more than 1"
        );
        assert_eq!(wake.waiting(), 3);
        wake.notify(2);
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(
            woke.load(Ordering::SeqCst),
            3,
            "a wake-up for 2 rows woke other than 2"
        );
        wake.notify_all();
        for h in handles {
            h.join().unwrap();
        }
        assert_eq!(
            woke.load(Ordering::SeqCst),
            4,
            "notify_all left a waiter asleep"
        );
    }

    /// A wake-up that lands between the read of the count and the wait is not missed.
    #[test]
    fn a_wake_up_during_the_claim_is_not_missed() {
        let wake = Wake::default();
        let seen = wake.seq();
        wake.notify(1);
        let start = Instant::now();
        wake.wait(seen, Duration::from_secs(5));
        assert!(
            start.elapsed() < Duration::from_secs(1),
            "the wait missed the wake-up"
        );
        // A wake-up with nobody waiting leaves no ticket behind for a later waiter.
        let seen = wake.seq();
        let start = Instant::now();
        wake.wait(seen, Duration::from_millis(50));
        assert!(start.elapsed() >= Duration::from_millis(50));
    }

    #[test]
    fn the_gate_skips_while_a_notification_is_on_its_way_and_owes_the_rows() {
        let g = Gate::default();
        let ms = Duration::from_millis;
        let t0 = Instant::now();
        // Not armed (no listener of ours on the channel): nothing comes back, every publish
        // notifies.
        assert!(!g.defer(1, t0));
        assert!(!g.defer(1, t0));
        g.arm(true);
        assert!(!g.defer(1, t0), "the first of a burst notifies");
        assert!(
            g.defer(1, t0 + ms(1)),
            "a burst must not notify per publish"
        );
        assert!(g.defer(2, t0 + ms(2)));
        // The first notification comes back: the 3 rows owed are notified now, by the listener.
        assert_eq!(g.arrived(t0 + ms(3), false), 3, "the owed rows were lost");
        // That one is in flight now; when it is back, nothing more is owed.
        assert!(g.defer(1, t0 + ms(4)));
        assert_eq!(g.arrived(t0 + ms(5), false), 1);
        assert_eq!(g.arrived(t0 + ms(6), false), 0);
        assert!(
            !g.defer(1, t0 + ms(7)),
            "nothing in flight: a publish notifies"
        );
        // A notification that never comes back holds nothing back past STALE...
        assert!(!g.defer(1, t0 + ms(7) + Gate::STALE));
        // ... and a tick sends what a stale one owes.
        assert!(g.defer(2, t0 + ms(60)));
        assert_eq!(g.arrived(t0 + ms(70), true), 0, "not stale yet");
        assert_eq!(
            g.arrived(t0 + ms(200), true),
            2,
            "a stale flight kept its rows"
        );
        // A send that failed owes its rows again.
        g.restore(4);
        assert_eq!(g.arrived(t0 + ms(201), true), 4);
        // A listener that lost its connection: every publish notifies again.
        g.arm(false);
        assert!(!g.defer(1, t0 + ms(202)));
        assert!(!g.defer(1, t0 + ms(202)));
    }

    /// While one worker reads the pause flag, nobody claims on its old value: the handler
    /// threads' own claims (`running`) and the other workers (`Reading`) wait for the read.
    /// Fails with the flag marked read before the read was made (a claim on the old value
    /// right after a pause in another process: seen as `delivered while paused` on MariaDB),
    /// and (`a failed read let a claim go ahead`) with a failed read keeping the last value.
    #[test]
    fn nobody_claims_on_the_old_flag_while_it_is_read() {
        let every = Duration::from_secs(60);
        let flag = PauseFlag::default();
        let PauseCheck::Read(read) = flag.check(every) else {
            panic!("a new flag is not read first")
        };
        assert!(
            !flag.running(every),
            "a handler claimed while the flag was read"
        );
        assert!(matches!(flag.check(every), PauseCheck::Reading));
        assert_eq!(read.set(false), (false, false));
        assert!(matches!(flag.check(every), PauseCheck::Fresh(false)));
        assert!(flag.running(every));
        flag.stale();
        let PauseCheck::Read(read) = flag.check(every) else {
            panic!("a stale flag is not read again")
        };
        assert!(!flag.running(every));
        // A failed read claims on no old value: the table may have been paused since.
        assert!(
            read.failed(),
            "a failed read let a claim go ahead on the old value"
        );
        assert!(!flag.running(every));
        let PauseCheck::Read(read) = flag.check(every) else {
            panic!("a failed read is not tried again before the next claim")
        };
        assert_eq!(read.set(true), (false, true));
        assert!(matches!(flag.check(every), PauseCheck::Fresh(true)));
        assert!(!flag.running(every));
    }

    /// A claim goes ahead on the flag only while the read it was decided on is younger than a
    /// poll interval and said running (`Ctx::claim_conn_checked` asks once it has its
    /// connection). Fails (`a claim ran on a flag older than a poll`) with `too_old` ignoring
    /// the read's age.
    #[test]
    fn a_claim_runs_only_on_a_fresh_flag() {
        let flag = PauseFlag::default();
        let PauseCheck::Read(read) = flag.check(Duration::from_secs(60)) else {
            panic!("a new flag is not read first")
        };
        read.set(false);
        assert!(!flag.too_old(Duration::from_secs(60)));
        std::thread::sleep(Duration::from_millis(20));
        assert!(
            flag.too_old(Duration::from_millis(10)),
            "a claim ran on a flag older than a poll"
        );
        flag.own(true);
        assert!(flag.too_old(Duration::from_secs(60)), "paused");
    }

    /// A claim decided on a fresh read waits for its connection while the database is silent;
    /// another worker's read fails meanwhile. The failed read must not make the decision look
    /// fresh: the claim reads the flag again on its connection. Fails (`a failed read made an
    /// old decision fresh`) with `too_old` false for an unread flag (the promise checker's
    /// soak, seed 1 on PostgreSQL advisory: a claim after a silence, past a pause made in it).
    #[test]
    fn a_failed_read_elsewhere_does_not_make_an_old_decision_fresh() {
        let every = Duration::from_secs(60);
        let flag = PauseFlag::default();
        assert!(!flag.too_old(every), "a flag never read holds nothing back");
        let PauseCheck::Read(read) = flag.check(every) else {
            panic!("a new flag is not read first")
        };
        read.set(false);
        assert!(!flag.too_old(every));
        flag.stale();
        let PauseCheck::Read(read) = flag.check(every) else {
            panic!("a stale flag is not read again")
        };
        read.failed();
        assert!(
            flag.too_old(every),
            "a failed read made an old decision fresh"
        );
    }

    /// A read that began before this broker's own pause does not overwrite it with the older
    /// value it read. Fails (`the stale read resumed the table`) with `set` ignoring the epoch.
    #[test]
    fn a_read_under_way_does_not_overwrite_a_pause_made_meanwhile() {
        let every = Duration::from_secs(60);
        let flag = PauseFlag::default();
        let PauseCheck::Read(read) = flag.check(every) else {
            panic!("a new flag is not read first")
        };
        flag.own(true);
        assert_eq!(read.set(false), (true, true));
        assert!(
            matches!(flag.check(every), PauseCheck::Fresh(true)),
            "the stale read resumed the table"
        );
        // A notification while reading: the read's value does not stand, it is read again.
        flag.own(false);
        flag.stale();
        let PauseCheck::Read(read) = flag.check(every) else {
            panic!("a stale flag is not read again")
        };
        flag.stale();
        read.set(true);
        assert!(
            matches!(flag.check(every), PauseCheck::Read(_)),
            "a read overtaken by a notification was taken as fresh"
        );
    }

    /// A reader that panics leaves no read under way, so other workers go on. Fails (the
    /// other worker is told `Reading` for ever) without `PauseRead`'s `Drop`.
    #[test]
    fn a_reader_that_panics_does_not_hold_every_worker() {
        let every = Duration::from_secs(60);
        let flag = PauseFlag::default();
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let PauseCheck::Read(_read) = flag.check(every) else {
                panic!("a new flag is not read first")
            };
            panic!("the driver panicked");
        }));
        assert!(caught.is_err());
        // Not `Reading`: the next worker reads it again (a failed read stands for no value).
        assert!(
            matches!(flag.check(every), PauseCheck::Read(_)),
            "a panicked read left the flag being read"
        );
    }
}
