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
        Timer::start_with_clock(name, Instant::now)
    }

    /// A timer that reads the time from `now`: the system's clock in production; a clock the
    /// test moves by hand in tests, so what is due does not depend on how busy the machine is.
    fn start_with_clock(
        name: String,
        now: impl Fn() -> Instant + Send + 'static,
    ) -> std::io::Result<Timer> {
        let (tx, rx) = crossbeam_channel::unbounded();
        std::thread::Builder::new()
            .name(name)
            .spawn(move || run(&rx, now))?;
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

    /// The earliest task whose deadline is `now` or has passed (ties in the order added).
    fn pop_due(&mut self, now: Instant) -> Option<Task> {
        while let Some(&Reverse((at, key))) = self.due.peek() {
            if at > now {
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

fn run(rx: &Receiver<(Instant, Task)>, now: impl Fn() -> Instant) {
    let mut queue = Queue::default();
    loop {
        let received = match queue.due.peek() {
            Some(Reverse((at, _))) => rx.recv_timeout(at.saturating_duration_since(now())),
            None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
        };
        match received {
            Ok((at, task)) => queue.add(at, task),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
        while let Some(mut task) = queue.pop_due(now()) {
            match catch_unwind(AssertUnwindSafe(&mut task)) {
                Ok(Some(again)) => queue.add(now() + again, task),
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
    use std::sync::{Arc, Mutex};

    /// Tasks run at their deadlines (not before), in deadline order when several are due at
    /// once, a task asking to run again does after the delay it asked for, and a panicking task
    /// does not stop the thread. The timer reads a clock the test moves, and each step waits
    /// for a marker task due at the new time, which runs after every task due by then (ties run
    /// in the order added): nothing here depends on how fast the machine is.
    #[test]
    fn runs_tasks_in_deadline_order_and_survives_a_panic() {
        let t0 = Instant::now();
        let clock = Arc::new(Mutex::new(t0));
        let read = clock.clone();
        let timer =
            Timer::start_with_clock("sqlbroker-timer-test".into(), move || *read.lock().unwrap())
                .unwrap();
        let (tx, rx) = crossbeam_channel::unbounded();
        let ms = Duration::from_millis;
        timer.at(t0, Box::new(|| panic!("boom")));
        // Added latest first, so running in the order added would fail.
        for (name, after) in [("late", 300), ("middle", 200), ("early", 100)] {
            let tx = tx.clone();
            timer.at(
                t0 + ms(after),
                Box::new(move || {
                    let _ = tx.send(name);
                    None
                }),
            );
        }
        let runs = Arc::new(AtomicUsize::new(0));
        let r = runs.clone();
        timer.at(
            t0,
            Box::new(move || {
                if r.fetch_add(1, Ordering::SeqCst) < 2 {
                    Some(ms(10))
                } else {
                    let _ = tx.send("again");
                    None
                }
            }),
        );
        // Moves the clock to `t0 + after`, waits until the timer has run everything due by
        // then, and returns the names sent meanwhile.
        let step = |after: u64| -> Vec<&str> {
            let to = t0 + ms(after);
            *clock.lock().unwrap() = to;
            let (done_tx, done_rx) = crossbeam_channel::bounded(1);
            timer.at(
                to,
                Box::new(move || {
                    let _ = done_tx.send(());
                    None
                }),
            );
            done_rx
                .recv_timeout(Duration::from_secs(10))
                .expect("the timer thread did not run a task that was due");
            rx.try_iter().collect()
        };
        assert!(step(0).is_empty());
        assert_eq!(
            runs.load(Ordering::SeqCst),
            1,
            "the due task did not run once"
        );
        assert!(step(9).is_empty());
        assert_eq!(runs.load(Ordering::SeqCst), 1, "ran again before its delay");
        assert!(step(10).is_empty());
        assert_eq!(
            runs.load(Ordering::SeqCst),
            2,
            "did not run again after its delay"
        );
        assert_eq!(step(20), ["again"]);
        assert_eq!(runs.load(Ordering::SeqCst), 3);
        assert!(step(99).is_empty(), "a task ran before its deadline");
        assert_eq!(step(100), ["early"]);
        assert_eq!(step(1000), ["middle", "late"], "not in deadline order");
        assert!(step(5000).is_empty());
        assert_eq!(runs.load(Ordering::SeqCst), 3, "a finished task ran again");
    }
}
