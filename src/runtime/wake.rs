//! In-process wake-ups: a publish (or a returned row) wakes the idle claim workers of its table
//! at once instead of at their next poll.

use std::time::Duration;

use parking_lot::{Condvar, Mutex};

/// A counter that waiters watch; every notify bumps it.
#[derive(Default)]
pub(crate) struct Wake {
    seq: Mutex<u64>,
    cv: Condvar,
}

impl Wake {
    /// The current count, read before a claim so a publish during the claim is not missed.
    pub fn seq(&self) -> u64 {
        *self.seq.lock()
    }

    /// Wakes every waiter.
    pub fn notify(&self) {
        *self.seq.lock() += 1;
        self.cv.notify_all();
    }

    /// Waits until the count moves past `seen` or `timeout` passes.
    pub fn wait(&self, seen: u64, timeout: Duration) {
        let mut seq = self.seq.lock();
        if *seq == seen {
            self.cv.wait_for(&mut seq, timeout);
        }
    }
}
