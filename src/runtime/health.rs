//! What a subscription's threads say of themselves as they go, for `Subscription::health`:
//! how many claim workers run, when a claim last answered, when the lease timer last renewed
//! its leases, how many of its handlers are stuck now. Plain atomics written on the way
//! (a claim's answer, a renewal round, a delivery handed out or dropped), read without a lock.

use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

/// A subscription's marks; times in milliseconds since the epoch, 0 for never.
#[derive(Default)]
pub(crate) struct Marks {
    workers_running: AtomicUsize,
    last_claim: AtomicU64,
    last_renewal: AtomicU64,
    /// Signed: a delivery's drop may count its stuck handler down a moment before the report
    /// that raced it counted it up.
    stuck: AtomicI64,
}

fn millis(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn time(ms: u64) -> Option<SystemTime> {
    (ms > 0).then(|| SystemTime::UNIX_EPOCH + Duration::from_millis(ms))
}

impl Marks {
    /// A claim worker is about to start: counted by the thread that spawns it, before the
    /// spawn, so a subscription is alive from the moment `start` returns (not once the new
    /// thread is scheduled). The worker's thread takes the count over with
    /// [`Marks::worker_running`].
    pub fn worker_starting(&self) {
        self.workers_running.fetch_add(1, Ordering::AcqRel);
    }

    /// The spawn of a counted worker failed: it never ran.
    pub fn worker_not_started(&self) {
        self.workers_running.fetch_sub(1, Ordering::AcqRel);
    }

    /// The claim worker counted by [`Marks::worker_starting`] runs; it counts until the guard
    /// drops (its thread ends, even by a panic).
    pub fn worker_running(&self) -> WorkerRunning<'_> {
        WorkerRunning(self)
    }

    pub fn workers_running(&self) -> usize {
        self.workers_running.load(Ordering::Acquire)
    }

    /// A claim answered (rows or none).
    pub fn claimed(&self) {
        self.last_claim
            .store(millis(SystemTime::now()), Ordering::Release);
    }

    pub fn last_claim(&self) -> Option<SystemTime> {
        time(self.last_claim.load(Ordering::Acquire))
    }

    /// A renewal round renewed every lease it had to.
    pub fn renewed(&self) {
        self.last_renewal
            .store(millis(SystemTime::now()), Ordering::Release);
    }

    pub fn last_renewal(&self) -> Option<SystemTime> {
        time(self.last_renewal.load(Ordering::Acquire))
    }

    /// A handler was reported stuck (`true`) or a stuck one ended (`false`).
    pub fn stuck(&self, now: bool) {
        if now {
            self.stuck.fetch_add(1, Ordering::AcqRel);
        } else {
            self.stuck.fetch_sub(1, Ordering::AcqRel);
        }
    }

    pub fn stuck_now(&self) -> u64 {
        self.stuck.load(Ordering::Acquire).max(0) as u64
    }
}

/// A running claim worker, counted until dropped.
pub(crate) struct WorkerRunning<'a>(&'a Marks);

impl Drop for WorkerRunning<'_> {
    fn drop(&mut self) {
        self.0.workers_running.fetch_sub(1, Ordering::AcqRel);
    }
}
