//! Handler slots: the cap on rows claimed and not yet settled. A claim takes slots before it
//! runs and never claims more rows than it holds; each delivery gives its slot back when it is
//! settled or dropped. Rows waiting in the channel hold their slots (and their locks or leases).
//!
//! While rows are still queued for the handlers, a claim waits for a whole batch of free slots
//! (half a batch when the cap holds fewer than two batches, so a claim still overlaps the
//! handling of the last one) rather than one: claiming a few rows after every settlement
//! multiplies the claims per row, and a claim's cost is mostly per statement (on PostgreSQL it
//! walks past every row leased and not yet settled); on SQLite every claim would also collide
//! with a settlement for the one write lock. With nothing queued (handlers idle) one free slot
//! is enough, so latency does not suffer. A batch settled at once gives its slots back at once
//! ([`settled_many`](Slots::settled_many)), so the claim it wakes finds the whole batch free.

use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

pub(crate) struct Slots {
    state: Mutex<State>,
    /// Claimers waiting for free slots.
    cv: Condvar,
    /// `wait_idle` waiting for the last delivery to settle.
    idle: Condvar,
    capacity: usize,
}

struct State {
    free: usize,
    /// Slots owned by deliveries (claimed rows not yet settled), as opposed to slots a claim in
    /// progress has taken and may give back.
    delivered: usize,
    /// Claimed rows not yet handed to a handler.
    queued: usize,
    /// Free slots a waiting claimer wants while rows are queued (its batch, or half of it).
    want: usize,
    /// The most slots a waiting claimer takes (its batch).
    batch: usize,
    /// Claimers waiting in `acquire`, and those of them woken and not yet running: the free
    /// slots beyond what the woken will take are what the next wake-up may promise.
    waiting: usize,
    woken: usize,
    closed: bool,
}

impl Slots {
    pub fn new(capacity: usize) -> Self {
        Slots {
            state: Mutex::new(State {
                free: capacity,
                delivered: 0,
                queued: 0,
                want: 1,
                batch: 1,
                waiting: 0,
                woken: 0,
                closed: false,
            }),
            cv: Condvar::new(),
            idle: Condvar::new(),
            capacity,
        }
    }

    /// Blocks until a slot is free (a batch of `max`, or half of it, while rows are queued),
    /// then takes up to `max`. `None` once closed.
    pub fn acquire(&self, max: usize) -> Option<usize> {
        let max = max.max(1);
        let want = if self.capacity >= 2 * max {
            max
        } else {
            max.div_ceil(2).clamp(1, self.capacity)
        };
        let mut st = self.state.lock();
        while !st.closed && (st.free == 0 || (st.queued > 0 && st.free < want)) {
            st.want = want;
            st.batch = max;
            st.waiting += 1;
            self.cv.wait(&mut st);
            st.waiting -= 1;
            st.woken = st.woken.saturating_sub(1);
        }
        if st.closed {
            return None;
        }
        let n = st.free.min(max.max(1));
        st.free -= n;
        Some(n)
    }

    /// [`acquire`](Slots::acquire), as a guard that gives back what is not handed over, on every
    /// path (a claim that fails or panics included).
    pub fn take(&self, max: usize) -> Option<Taken<'_>> {
        self.acquire(max).map(|n| Taken { slots: self, n })
    }

    /// Up to `max` free slots without waiting; `None` if none is free or the slots are closed.
    pub fn try_take(&self, max: usize) -> Option<Taken<'_>> {
        let mut st = self.state.lock();
        if st.closed || st.free == 0 {
            return None;
        }
        let n = st.free.min(max.max(1));
        st.free -= n;
        Some(Taken { slots: self, n })
    }

    pub fn release(&self, n: usize) {
        if n == 0 {
            return;
        }
        let mut st = self.state.lock();
        st.free = (st.free + n).min(self.capacity);
        self.wake(&mut st);
    }

    /// Wakes as many waiting claimers as the free slots can serve, each counted as taking a
    /// whole batch, and no more: the claimers of a subscription all wait for the same thing,
    /// so one woken for slots another takes first would only go back to sleep (with one-row
    /// claims, every settlement used to wake them all).
    fn wake(&self, st: &mut State) {
        let enough = if st.queued > 0 { st.want } else { 1 };
        let mut spare = st.free.saturating_sub(st.woken * st.batch);
        while st.woken < st.waiting && spare >= enough {
            if !self.cv.notify_one() {
                break;
            }
            st.woken += 1;
            spare = spare.saturating_sub(st.batch);
        }
    }

    /// `n` taken slots now belong to deliveries.
    fn deliver(&self, n: usize) {
        self.state.lock().delivered += n;
    }

    /// A delivery was settled or dropped: its slot is free again. Wakes a claimer only when
    /// one may go on that is not already woken ([`wake`](Slots::wake)), and `wait_idle` when
    /// nothing is left in flight.
    pub fn settled(&self) {
        self.settled_many(1);
    }

    /// `n` deliveries were settled together: their slots are free again, with one wake-up.
    pub fn settled_many(&self, n: usize) {
        if n == 0 {
            return;
        }
        let mut st = self.state.lock();
        st.delivered = st.delivered.saturating_sub(n);
        st.free = (st.free + n).min(self.capacity);
        self.wake(&mut st);
        if st.delivered == 0 {
            self.idle.notify_all();
        }
    }

    /// `n` claimed rows go into the channel.
    pub fn enqueue(&self, n: usize) {
        self.state.lock().queued += n;
    }

    /// A queued row was handed to a handler.
    pub fn dequeue(&self) {
        self.dequeue_many(1);
    }

    /// `n` queued rows were handed to a handler together.
    pub fn dequeue_many(&self, n: usize) {
        if n == 0 {
            return;
        }
        let mut st = self.state.lock();
        st.queued = st.queued.saturating_sub(n);
        if st.queued == 0 {
            self.wake(&mut st);
        }
    }

    /// Wakes claimers blocked in `acquire`; they get `None` from now on.
    pub fn close(&self) {
        self.state.lock().closed = true;
        self.cv.notify_all();
        self.idle.notify_all();
    }

    /// Deliveries not yet settled (claimed rows, counting those waiting to be handed out; not
    /// the slots a claim in progress holds).
    pub fn in_flight(&self) -> usize {
        self.state.lock().delivered
    }

    /// Waits until every delivery is settled or `timeout` passes (a timeout too large for a
    /// deadline waits for ever); true if none is left.
    pub fn wait_idle(&self, timeout: Duration) -> bool {
        let deadline = Instant::now().checked_add(timeout);
        let mut st = self.state.lock();
        while st.delivered > 0 {
            match deadline {
                Some(deadline) => {
                    if self.idle.wait_until(&mut st, deadline).timed_out() {
                        return st.delivered == 0;
                    }
                }
                None => self.idle.wait(&mut st),
            }
        }
        true
    }
}

/// Slots taken for a claim; dropping it gives back those not handed over to deliveries.
pub(crate) struct Taken<'a> {
    slots: &'a Slots,
    n: usize,
}

impl Taken<'_> {
    pub fn count(&self) -> usize {
        self.n
    }

    /// `k` slots now belong to deliveries (each gives its own back when settled or dropped).
    pub fn hand_over(&mut self, k: usize) {
        let k = k.min(self.n);
        self.n -= k;
        self.slots.deliver(k);
    }
}

impl Drop for Taken<'_> {
    fn drop(&mut self) {
        self.slots.release(self.n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn never_more_than_capacity() {
        let s = Slots::new(3);
        assert_eq!(s.acquire(2), Some(2));
        assert_eq!(s.acquire(5), Some(1));
        let s = Arc::new(s);
        let t = {
            let s = s.clone();
            std::thread::spawn(move || s.acquire(4))
        };
        s.release(2);
        assert_eq!(t.join().unwrap(), Some(2));
        s.release(3);
        s.close();
        assert_eq!(s.acquire(1), None);
    }

    #[test]
    fn only_deliveries_are_in_flight() {
        let s = Slots::new(4);
        let mut claim = s.take(4).unwrap();
        // A claim in progress holds slots, but no delivery exists yet: nothing to wait for.
        assert_eq!(s.in_flight(), 0);
        assert!(s.wait_idle(Duration::ZERO));
        claim.hand_over(2);
        drop(claim);
        assert_eq!(s.in_flight(), 2);
        assert!(!s.wait_idle(Duration::from_millis(10)));
        s.settled();
        s.settled();
        assert!(s.wait_idle(Duration::from_millis(10)));
        // Every slot is free again: the two handed over and the two given back.
        assert_eq!(s.acquire(4), Some(4));
    }

    /// Waits (at most 5 s) until `n` claimers wait in `acquire`.
    fn waiting(s: &Slots, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while s.state.lock().waiting < n {
            assert!(Instant::now() < deadline, "{n} claimers never waited");
            std::thread::yield_now();
        }
    }

    /// A claimer in `acquire(max)`, checked to be still waiting 50 ms later.
    fn blocked_claimer(
        s: &Arc<Slots>,
        max: usize,
        why: &str,
    ) -> std::thread::JoinHandle<Option<usize>> {
        let t = {
            let s = s.clone();
            std::thread::spawn(move || s.acquire(max))
        };
        std::thread::sleep(Duration::from_millis(50));
        assert!(!t.is_finished(), "{why}");
        t
    }

    #[test]
    fn waits_for_half_a_batch_while_rows_are_queued() {
        let s = Arc::new(Slots::new(10));
        assert_eq!(s.acquire(10), Some(10));
        s.enqueue(10);
        s.dequeue();
        s.release(1);
        let t = blocked_claimer(
            &s,
            10,
            "claimed with one free slot while nine rows were queued",
        );
        s.release(4);
        assert_eq!(t.join().unwrap(), Some(5));
        // With nothing queued, one free slot is enough.
        for _ in 0..9 {
            s.dequeue();
        }
        s.release(1);
        assert_eq!(s.acquire(10), Some(1));
    }

    /// With room for two batches, a claim waits for a whole batch of free slots while rows are
    /// queued (before: half a batch, so claims took about half as many rows as they could).
    #[test]
    fn waits_for_a_whole_batch_when_the_cap_holds_two() {
        let s = Arc::new(Slots::new(20));
        assert_eq!(s.acquire(10), Some(10));
        assert_eq!(s.acquire(10), Some(10));
        s.enqueue(20);
        s.release(5);
        let t = blocked_claimer(
            &s,
            10,
            "claimed with half a batch free while rows were queued",
        );
        s.release(5);
        assert_eq!(t.join().unwrap(), Some(10));
    }

    /// A batch settled together frees its slots at once: the claimer it wakes takes the whole
    /// batch. (Settled one by one, the claimer woke at the first slot, with nothing queued,
    /// and claimed only what was free by then.)
    #[test]
    fn a_batch_settled_together_frees_a_whole_claim() {
        let s = Arc::new(Slots::new(8));
        let mut claim = s.take(8).unwrap();
        claim.hand_over(8);
        drop(claim);
        let t = {
            let s = s.clone();
            std::thread::spawn(move || s.acquire(8))
        };
        waiting(&s, 1);
        s.settled_many(8);
        assert_eq!(t.join().unwrap(), Some(8));
        assert_eq!(s.in_flight(), 0);
    }

    /// Each freed slot wakes a claimer of its own: two settlements in a row, before the first
    /// claimer woken has run, still let two one-row claimers go on (a wake-up is promised to
    /// one claimer per batch of free slots, not to all, and none is lost).
    #[test]
    fn each_freed_batch_wakes_one_claimer() {
        let s = Arc::new(Slots::new(3));
        let mut claim = s.take(3).unwrap();
        claim.hand_over(3);
        drop(claim);
        let (tx, rx) = crossbeam_channel::unbounded();
        for _ in 0..3 {
            let (s, tx) = (s.clone(), tx.clone());
            std::thread::spawn(move || tx.send(s.acquire(1)).unwrap());
        }
        waiting(&s, 3);
        s.settled();
        s.settled();
        let wait = Duration::from_secs(5);
        assert_eq!(rx.recv_timeout(wait).unwrap(), Some(1));
        assert_eq!(rx.recv_timeout(wait).unwrap(), Some(1));
        assert!(
            rx.recv_timeout(Duration::from_millis(50)).is_err(),
            "a third claimer went on with no slot free"
        );
        s.close();
        assert_eq!(rx.recv_timeout(wait).unwrap(), None);
    }
}
