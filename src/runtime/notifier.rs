//! The notify thread (`sqlbroker-notify`, one per broker, started with its first notification):
//! sends the cross-process notifications of the broker's publishes (PostgreSQL `pg_notify`)
//! after their commits, on a pooled connection of its own, so a publish returns once its rows
//! are durable instead of paying one more round trip. Publishes that arrive while a
//! notification is being sent, or within [`GAP`] of the last, are announced together by the
//! next one.
//!
//! A notification that fails is logged, and the other brokers' poll finds the rows. A broker
//! that is dropped sends what it still owes first, waiting at most [`DRAIN`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::Queue;

/// The longest a dropped broker waits for its last notifications to go out.
const DRAIN: Duration = Duration::from_secs(2);

/// The least time between two notifications: a run of publishes one at a time is announced
/// once per millisecond, not once per publish (each notification is a statement on the
/// server), at the cost of at most a millisecond of wake-up latency in a burst.
const GAP: Duration = Duration::from_millis(1);

pub(crate) struct Notifier {
    shared: Arc<Shared>,
    /// This broker, in the notifications it sends (its own listener skips them).
    me: u64,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    cv: Condvar,
}

#[derive(Default)]
struct State {
    /// Rows to announce, by table (a queue appears once; later publishes add to its rows).
    owed: Vec<(Arc<Queue>, usize)>,
    started: bool,
    stop: bool,
    /// The thread has ended (or never started).
    ended: bool,
}

impl Notifier {
    pub fn new(me: u64) -> Self {
        Notifier {
            shared: Arc::default(),
            me,
        }
    }

    /// Announces `rows` committed rows of `q` to other brokers, soon, from the notify thread.
    pub fn send(&self, q: &Arc<Queue>, rows: usize) {
        let mut st = self.shared.state.lock();
        match st.owed.iter_mut().find(|(o, _)| Arc::ptr_eq(o, q)) {
            Some((_, n)) => *n += rows,
            None => st.owed.push((q.clone(), rows)),
        }
        if !st.started {
            let (shared, me) = (self.shared.clone(), self.me);
            let spawned = std::thread::Builder::new()
                .name("sqlbroker-notify".into())
                .spawn(move || run(&shared, me));
            match spawned {
                Ok(_) => st.started = true,
                Err(e) => {
                    // No thread: this publish sends what is owed itself.
                    let owed = std::mem::take(&mut st.owed);
                    drop(st);
                    log::warn!("starting the notify thread: {e}; notifying inline");
                    announce(owed, self.me);
                    return;
                }
            }
        }
        self.shared.cv.notify_one();
    }
}

impl Drop for Notifier {
    fn drop(&mut self) {
        let deadline = Instant::now() + DRAIN;
        let mut st = self.shared.state.lock();
        st.stop = true;
        self.shared.cv.notify_all();
        while st.started && !st.ended {
            if self.shared.cv.wait_until(&mut st, deadline).timed_out() {
                log::debug!("the notify thread did not finish within {DRAIN:?}");
                break;
            }
        }
    }
}

fn run(shared: &Shared, me: u64) {
    let mut last: Option<Instant> = None;
    loop {
        let owed = {
            let mut st = shared.state.lock();
            while st.owed.is_empty() && !st.stop {
                shared.cv.wait(&mut st);
            }
            // Publishes arriving within `GAP` of the last notification wait for the next one,
            // which then announces them all (unless the broker is stopping).
            if let Some(next) = last.map(|at| at + GAP) {
                while !st.stop && Instant::now() < next {
                    shared.cv.wait_until(&mut st, next);
                }
            }
            if st.owed.is_empty() {
                st.ended = true;
                shared.cv.notify_all();
                return;
            }
            std::mem::take(&mut st.owed)
        };
        announce(owed, me);
        last = Some(Instant::now());
    }
}

/// Sends one notification per table; a failure is logged and opens the gate again, so the
/// next publish notifies.
fn announce(owed: Vec<(Arc<Queue>, usize)>, me: u64) {
    for (q, rows) in owed {
        let sent = q.conn("notify").and_then(|mut conn| {
            q.dialect
                .announce(&mut *conn, &q.sql, rows, Some(me))
                .map_err(q.err("notify"))
        });
        if let Err(e) = sent {
            q.wake.gate.failed();
            log::debug!("notifying a publish to table {}: {e}", q.spec.name);
        }
    }
}
