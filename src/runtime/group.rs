//! Group commit: settlements that arrive while others are being written are written together,
//! in one statement and one commit, instead of one commit each.
//!
//! A caller queues its item and, if fewer flushes are running than the load allows (one, or
//! two while flushes are thin: [`FLUSHERS_LOADED`]), becomes a
//! leader: it takes everything queued (at most `max` items), writes it with the caller's
//! `flush` outside the lock, posts the batch's result to each caller in it, and pokes the
//! first caller still queued to lead next. The others wait, each on a signal of its own, so a
//! flush wakes only its own callers. A lone caller writes its own item at once (no added delay):
//! batching comes only from concurrency, never from waiting for company.
//!
//! No lock is held across the flush (SQL). A flush that panics gives its batch the `fallback`
//! result, so no caller waits for ever.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Condvar, Mutex, MutexGuard};

/// Flushes that may run at once per group, by load. Under load (the last flush wrote at least
/// [`THIN`] items), one: while it commits, the next batch gathers, and that batch is the whole
/// of what arrived meanwhile. A second flush in flight would split the same arrivals into two
/// statements and two commits: 10-20% slower on PostgreSQL with 32 handlers (BENCHMARKS.md),
/// where a flush costs CPU more than it waits for the disk, and the database merges the WAL
/// flushes of overlapping commits anyway. With few callers (thin flushes), two: an ack that
/// arrives during a flush starts its own rather than wait for it, which is most of its
/// latency (lease, batch 1, 4 handlers: 0.71x the raw loop with one, 0.85x with two).
const FLUSHERS_LOADED: usize = 1;
const FLUSHERS_THIN: usize = 2;

/// A flush of fewer items than this is thin: callers are few, latency counts more than grouping.
const THIN: usize = 4;

pub(crate) struct GroupCommit<I, R> {
    state: Mutex<State<I, R>>,
    max: usize,
    /// One flush at a time, loaded or thin ([`GroupCommit::one_at_a_time`]).
    single: bool,
    /// Flushes run and items they wrote, ever: what tests read to see that concurrent callers
    /// shared flushes ([`GroupCommit::stats`]).
    flushes: AtomicU64,
    items: AtomicU64,
}

struct State<I, R> {
    queued: Vec<(I, Arc<Signal<R>>)>,
    flushing: usize,
    /// Items of the last flush started.
    last: usize,
}

/// One caller's mailbox: its batch's result, or a poke to try to lead. Each caller waits on
/// its own, so a finished flush wakes exactly its own callers (and one caller to lead the
/// next), not every waiting thread.
struct Signal<R> {
    slot: Mutex<(Option<R>, bool)>,
    cv: Condvar,
}

impl<R> Signal<R> {
    fn post(&self, result: Option<R>) {
        let mut slot = self.slot.lock();
        match result {
            Some(r) => slot.0 = Some(r),
            None => slot.1 = true,
        }
        self.cv.notify_one();
    }
}

impl<I, R: Clone> GroupCommit<I, R> {
    /// A group writing at most `max` items per flush.
    pub fn new(max: usize) -> Self {
        GroupCommit {
            state: Mutex::new(State {
                queued: Vec::new(),
                flushing: 0,
                last: 0,
            }),
            max: max.max(1),
            single: false,
            flushes: AtomicU64::new(0),
            items: AtomicU64::new(0),
        }
    }

    /// A group writing at most `max` items per flush, one flush at a time: for flushes whose
    /// transactions lock rows other flushes of the group may lock too, in another order (the
    /// counts of jobs waiting on several of the settled), which two flushes at once could
    /// deadlock on.
    pub fn one_at_a_time(max: usize) -> Self {
        GroupCommit {
            single: true,
            ..Self::new(max)
        }
    }

    /// Flushes run so far, and the items they wrote.
    pub fn stats(&self) -> (u64, u64) {
        (
            self.flushes.load(Ordering::Relaxed),
            self.items.load(Ordering::Relaxed),
        )
    }

    /// Writes `item` with others queued meanwhile; returns the result of the batch it was
    /// written in (`fallback` if that batch's flush panicked).
    pub fn run(&self, item: I, flush: &dyn Fn(Vec<I>) -> R, fallback: &R) -> R {
        let signal = Arc::new(Signal {
            slot: Mutex::new((None, false)),
            cv: Condvar::new(),
        });
        self.state.lock().queued.push((item, signal.clone()));
        loop {
            {
                // Only a caller whose item still waits leads: one whose item is being written
                // returns as soon as that flush ends, never held up by the next one.
                let mut st = self.state.lock();
                let mine = st.queued.iter().any(|(_, s)| Arc::ptr_eq(s, &signal));
                let flushers = if st.last < THIN && !self.single {
                    FLUSHERS_THIN
                } else {
                    FLUSHERS_LOADED
                };
                if mine && st.flushing < flushers {
                    self.lead(&mut st, flush, fallback);
                }
            }
            let mut slot = signal.slot.lock();
            if let Some(r) = slot.0.take() {
                return r;
            }
            if slot.1 {
                slot.1 = false;
                continue;
            }
            // A leader always posts its batch's results (a panicking flush included) and pokes
            // the next caller queued, so this wait ends.
            signal.cv.wait(&mut slot);
            if let Some(r) = slot.0.take() {
                return r;
            }
            slot.1 = false;
        }
    }

    /// Writes what is queued (up to `max`), posts the result to its callers, and pokes the
    /// first caller still queued to lead the next batch.
    fn lead(
        &self,
        st: &mut MutexGuard<'_, State<I, R>>,
        flush: &dyn Fn(Vec<I>) -> R,
        fallback: &R,
    ) {
        let n = st.queued.len().min(self.max);
        let (items, signals): (Vec<I>, Vec<Arc<Signal<R>>>) = st.queued.drain(..n).unzip();
        st.flushing += 1;
        st.last = n;
        self.flushes.fetch_add(1, Ordering::Relaxed);
        self.items.fetch_add(n as u64, Ordering::Relaxed);
        MutexGuard::unlocked(st, || {
            let result = catch_unwind(AssertUnwindSafe(|| flush(items)));
            let result = result.unwrap_or_else(|_| {
                log::error!("a grouped settlement panicked; its callers settle one by one");
                fallback.clone()
            });
            for s in &signals {
                s.post(Some(result.clone()));
            }
        });
        st.flushing -= 1;
        if let Some((_, next)) = st.queued.first() {
            next.post(None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    /// Concurrent callers share flushes (fewer flushes than callers), every caller gets the
    /// result of the batch that held its item, and a lone caller is flushed alone at once.
    #[test]
    fn concurrent_items_share_flushes() {
        let group: Arc<GroupCommit<u32, Vec<u32>>> = Arc::new(GroupCommit::new(64));
        let flushes = Arc::new(AtomicUsize::new(0));
        let flush = {
            let flushes = flushes.clone();
            move |items: Vec<u32>| {
                flushes.fetch_add(1, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(20));
                items
            }
        };
        assert_eq!(group.run(7, &flush, &Vec::new()), [7]);
        assert_eq!(flushes.swap(0, Ordering::SeqCst), 1);

        let threads: Vec<_> = (0..32u32)
            .map(|i| {
                let (group, flush) = (group.clone(), flush.clone());
                std::thread::spawn(move || {
                    let batch = group.run(i, &flush, &Vec::new());
                    assert!(batch.contains(&i), "{i} got a batch without it: {batch:?}");
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let n = flushes.load(Ordering::SeqCst);
        assert!(
            n < 32,
            "32 concurrent items took {n} flushes: nothing was grouped"
        );
    }

    /// A panicking flush gives its callers the fallback, and the group goes on working.
    #[test]
    fn a_panicking_flush_gives_the_fallback() {
        let group: GroupCommit<u32, Option<u32>> = GroupCommit::new(8);
        let panics = |_: Vec<u32>| -> Option<u32> { panic!("boom") };
        assert_eq!(group.run(1, &panics, &None), None);
        assert_eq!(
            group.run(2, &|items: Vec<u32>| items.first().copied(), &None),
            Some(2)
        );
    }

    /// While flushes are thin (few callers), an item that arrives during a flush is written
    /// at once by a flush of its own, not held behind the running one.
    #[test]
    fn a_thin_flush_does_not_hold_the_next_caller() {
        let group: Arc<GroupCommit<u32, u32>> = Arc::new(GroupCommit::new(8));
        let (release, held) = crossbeam_channel::bounded::<()>(0);
        let (started, running) = crossbeam_channel::bounded::<()>(1);
        let flush = move |items: Vec<u32>| {
            if items.contains(&1) {
                started.send(()).unwrap();
                // Held until the test lets it go (or for at most 5 s).
                let _ = held.recv_timeout(Duration::from_secs(5));
            }
            items.len() as u32
        };
        let first = {
            let (group, flush) = (group.clone(), flush.clone());
            std::thread::spawn(move || group.run(1, &flush, &0))
        };
        running.recv_timeout(Duration::from_secs(5)).unwrap();
        let (done, second) = crossbeam_channel::bounded(1);
        {
            let group = group.clone();
            std::thread::spawn(move || done.send(group.run(2, &flush, &0)).unwrap());
        }
        assert_eq!(
            second.recv_timeout(Duration::from_secs(2)),
            Ok(1),
            "the second item waited for the first one's flush"
        );
        release.send(()).unwrap();
        assert_eq!(first.join().unwrap(), 1);
    }
}
