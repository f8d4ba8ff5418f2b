//! A subscription's timer thread (`sqlbroker-timer-<table>`), started only when the
//! subscription has a handler timeout: it runs small tasks at their deadlines (failing a
//! delivery whose handler ran too long). It knows nothing of forms: a task is a closure that
//! returns `Some(delay)` to run again after `delay` (its delivery was busy), or `None` when done.
//!
//! The thread ends when its [`Timer`] is dropped (with the subscription's last delivery); tasks
//! hold weak links, so a pending task keeps nothing alive. A panicking task is logged and
//! dropped; the thread goes on.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};

/// A task: run at its deadline; `Some(delay)` to run again after `delay`.
pub(crate) type Task = Box<dyn FnMut() -> Option<Duration> + Send>;

/// The handle of a timer thread; dropping it ends the thread.
pub(crate) struct Timer {
    tx: Sender<(Instant, Task)>,
}

impl Timer {
    pub fn start(name: String) -> std::io::Result<Timer> {
        let (tx, rx) = crossbeam_channel::unbounded();
        std::thread::Builder::new()
            .name(name)
            .spawn(move || run(&rx))?;
        Ok(Timer { tx })
    }

    /// Runs `task` at `due` (or at once if `due` has passed).
    pub fn at(&self, due: Instant, task: Task) {
        // The thread ends only once every handle is gone, so the send cannot fail while `self`
        // lives.
        let _ = self.tx.send((due, task));
    }
}

/// Tasks by deadline.
#[derive(Default)]
struct Queue {
    due: BinaryHeap<Reverse<(Instant, u64)>>,
    tasks: HashMap<u64, Task>,
    next_key: u64,
}

impl Queue {
    fn add(&mut self, at: Instant, task: Task) {
        self.next_key += 1;
        self.tasks.insert(self.next_key, task);
        self.due.push(Reverse((at, self.next_key)));
    }

    /// The earliest task whose deadline has passed.
    fn pop_due(&mut self) -> Option<Task> {
        while let Some(&Reverse((at, key))) = self.due.peek() {
            if at > Instant::now() {
                return None;
            }
            self.due.pop();
            if let Some(task) = self.tasks.remove(&key) {
                return Some(task);
            }
        }
        None
    }
}

fn run(rx: &Receiver<(Instant, Task)>) {
    let mut queue = Queue::default();
    loop {
        let received = match queue.due.peek() {
            Some(Reverse((at, _))) => rx.recv_timeout(at.saturating_duration_since(Instant::now())),
            None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
        };
        match received {
            Ok((at, task)) => queue.add(at, task),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
        while let Some(mut task) = queue.pop_due() {
            match catch_unwind(AssertUnwindSafe(&mut task)) {
                Ok(Some(again)) => queue.add(Instant::now() + again, task),
                Ok(None) => {}
                Err(_) => log::error!("a timer task panicked; it was dropped"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    /// Tasks run at their deadlines in deadline order, a task asking to run again does, and a
    /// panicking task does not stop the thread.
    #[test]
    fn runs_tasks_in_deadline_order_and_survives_a_panic() {
        let timer = Timer::start("sqlbroker-timer-test".into()).unwrap();
        let (tx, rx) = crossbeam_channel::unbounded();
        let now = Instant::now();
        timer.at(now, Box::new(|| panic!("boom")));
        for (name, after_ms) in [("late", 300), ("early", 100)] {
            let tx = tx.clone();
            timer.at(
                now + Duration::from_millis(after_ms),
                Box::new(move || {
                    let _ = tx.send((name, Instant::now()));
                    None
                }),
            );
        }
        let runs = Arc::new(AtomicUsize::new(0));
        let r = runs.clone();
        let tx2 = tx.clone();
        timer.at(
            now,
            Box::new(move || {
                if r.fetch_add(1, Ordering::SeqCst) < 2 {
                    Some(Duration::from_millis(10))
                } else {
                    let _ = tx2.send(("again", Instant::now()));
                    None
                }
            }),
        );
        let mut got = Vec::new();
        for _ in 0..3 {
            got.push(
                rx.recv_timeout(Duration::from_secs(5))
                    .expect("a task did not run"),
            );
        }
        let names: Vec<&str> = got.iter().map(|(n, _)| *n).collect();
        assert_eq!(names, ["again", "early", "late"]);
        assert!(got[1].1 >= now + Duration::from_millis(100), "ran early");
        assert_eq!(runs.load(Ordering::SeqCst), 3);
    }
}
