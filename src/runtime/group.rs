//! Group commit: settlements that arrive while others are being written are written together,
//! in one statement and one commit, instead of one commit each.
//!
//! A caller queues its item and, if fewer than [`FLUSHERS`] flushes are running, becomes a
//! leader: it takes everything queued (at most `max` items), writes it with the caller's
//! `flush` outside the lock, and publishes the batch's result to every caller in it. The others
//! wait for their batch's result. A lone caller writes its own item at once (no added delay):
//! batching comes only from concurrency, never from waiting for company.
//!
//! No lock is held across the flush (SQL). A flush that panics gives its batch the `fallback`
//! result, so no caller waits for ever.

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};

use parking_lot::{Condvar, Mutex, MutexGuard};

/// Flushes that may run at once per group: while one commits, the next batch gathers and can
/// start, so the database always has a commit in progress.
const FLUSHERS: usize = 2;

pub(crate) struct GroupCommit<I, R> {
    state: Mutex<State<I, R>>,
    cv: Condvar,
    max: usize,
}

struct State<I, R> {
    queued: Vec<(u64, I)>,
    /// Results of finished batches by ticket, taken by their callers.
    done: HashMap<u64, R>,
    next: u64,
    flushing: usize,
}

impl<I, R: Clone> GroupCommit<I, R> {
    /// A group writing at most `max` items per flush.
    pub fn new(max: usize) -> Self {
        GroupCommit {
            state: Mutex::new(State {
                queued: Vec::new(),
                done: HashMap::new(),
                next: 0,
                flushing: 0,
            }),
            cv: Condvar::new(),
            max: max.max(1),
        }
    }

    /// Writes `item` with others queued meanwhile; returns the result of the batch it was
    /// written in (`fallback` if that batch's flush panicked).
    pub fn run(&self, item: I, flush: &dyn Fn(Vec<I>) -> R, fallback: &R) -> R {
        let mut st = self.state.lock();
        let ticket = st.next;
        st.next += 1;
        st.queued.push((ticket, item));
        loop {
            if let Some(r) = st.done.remove(&ticket) {
                return r;
            }
            if st.flushing < FLUSHERS && !st.queued.is_empty() {
                self.lead(&mut st, flush, fallback);
                continue;
            }
            // A leader always finishes (a panicking flush included) and notifies.
            self.cv.wait(&mut st);
        }
    }

    /// Writes what is queued (up to `max`) and posts the result to its callers.
    fn lead(
        &self,
        st: &mut MutexGuard<'_, State<I, R>>,
        flush: &dyn Fn(Vec<I>) -> R,
        fallback: &R,
    ) {
        let n = st.queued.len().min(self.max);
        let (tickets, items): (Vec<u64>, Vec<I>) = st.queued.drain(..n).unzip();
        st.flushing += 1;
        let result = MutexGuard::unlocked(st, || catch_unwind(AssertUnwindSafe(|| flush(items))));
        st.flushing -= 1;
        let result = result.unwrap_or_else(|_| {
            log::error!("a grouped settlement panicked; its callers settle one by one");
            fallback.clone()
        });
        for t in tickets {
            st.done.insert(t, result.clone());
        }
        self.cv.notify_all();
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
}
