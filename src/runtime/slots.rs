//! Handler slots: the cap on rows claimed and not yet settled. A claim takes slots before it
//! runs and never claims more rows than it holds; each delivery gives its slot back when it is
//! settled or dropped. Rows waiting in the channel hold their slots (and their locks or leases).
//!
//! While rows are still queued for the handlers, a claim waits for half a batch of free slots
//! rather than one: claiming one row after every settlement doubles the claims per row and, on
//! SQLite, makes every claim collide with a settlement for the one write lock. With nothing
//! queued (handlers idle) one free slot is enough, so latency does not suffer.

use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

pub(crate) struct Slots {
    state: Mutex<State>,
    cv: Condvar,
    capacity: usize,
}

struct State {
    free: usize,
    /// Slots owned by deliveries (claimed rows not yet settled), as opposed to slots a claim in
    /// progress has taken and may give back.
    delivered: usize,
    /// Claimed rows not yet handed to a handler.
    queued: usize,
    /// Free slots a waiting claimer wants while rows are queued (half its batch).
    want: usize,
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
                closed: false,
            }),
            cv: Condvar::new(),
            capacity,
        }
    }

    /// Blocks until a slot is free (half of `max` while rows are queued), then takes up to
    /// `max`. `None` once closed.
    pub fn acquire(&self, max: usize) -> Option<usize> {
        let want = max.div_ceil(2).clamp(1, self.capacity);
        let mut st = self.state.lock();
        while !st.closed && (st.free == 0 || (st.queued > 0 && st.free < want)) {
            st.want = want;
            self.cv.wait(&mut st);
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
        self.cv.notify_all();
    }

    /// `n` taken slots now belong to deliveries.
    fn deliver(&self, n: usize) {
        self.state.lock().delivered += n;
    }

    /// A delivery was settled or dropped: its slot is free again. Wakes the waiters only when
    /// one may go on (the first free slot, the half batch a claimer waits for, or nothing left
    /// in flight for `wait_idle`), not on every settlement: with many handlers, waking every
    /// claimer per ack costs more than the ack.
    pub fn settled(&self) {
        let mut st = self.state.lock();
        st.delivered = st.delivered.saturating_sub(1);
        let was = st.free;
        st.free = (st.free + 1).min(self.capacity);
        if was == 0 || st.free == st.want || st.delivered == 0 {
            self.cv.notify_all();
        }
    }

    /// `n` claimed rows go into the channel.
    pub fn enqueue(&self, n: usize) {
        self.state.lock().queued += n;
    }

    /// A queued row was handed to a handler.
    pub fn dequeue(&self) {
        let mut st = self.state.lock();
        st.queued = st.queued.saturating_sub(1);
        if st.queued == 0 {
            self.cv.notify_all();
        }
    }

    /// Wakes claimers blocked in `acquire`; they get `None` from now on.
    pub fn close(&self) {
        self.state.lock().closed = true;
        self.cv.notify_all();
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
                    if self.cv.wait_until(&mut st, deadline).timed_out() {
                        return st.delivered == 0;
                    }
                }
                None => self.cv.wait(&mut st),
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

    #[test]
    fn waits_for_half_a_batch_while_rows_are_queued() {
        let s = Arc::new(Slots::new(10));
        assert_eq!(s.acquire(10), Some(10));
        s.enqueue(10);
        s.dequeue();
        s.release(1);
        let t = {
            let s = s.clone();
            std::thread::spawn(move || s.acquire(10))
        };
        std::thread::sleep(Duration::from_millis(50));
        assert!(
            !t.is_finished(),
            "claimed with one free slot while nine rows were queued"
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
}
