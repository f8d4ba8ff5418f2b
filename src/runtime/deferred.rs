//! Deferred acks ([`AckMode::Deferred`](crate::AckMode::Deferred)): `ack()` queues the row and
//! returns; one thread of the subscription writes what is queued, many rows per statement and
//! commit, within the mode's bound.
//!
//! A queued row keeps its lease, renewed as before, until its flush: a crash before the flush
//! leaves the row leased, and it is delivered again once the lease ends, as after a crash before
//! an ack. The flusher starts a flush when [`ACK_GROUP_MAX`] rows are queued or the oldest has
//! waited `within`; while it writes, handlers queue the next batch. Handlers wait only when
//! [`QUEUED_MAX`] rows are queued (the database is behind), so what is unwritten stays bounded.

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::runtime::renewer::LeaseCell;
use crate::runtime::{Ctx, ACK_GROUP_MAX};

/// The most acks queued and not yet written: an `ack()` beyond it waits for a flush.
pub(crate) const QUEUED_MAX: usize = 4 * ACK_GROUP_MAX;

/// One acked row waiting for its flush.
pub(crate) struct Pending {
    /// Keeps the subscription's context alive until the row is written (a subscription dropped
    /// right after its last ack still has that ack written).
    pub ctx: Arc<Ctx>,
    pub id: i64,
    pub attempt: u32,
    pub cell: Arc<LeaseCell>,
    pub handed_at: Option<Instant>,
    /// When `ack()` queued it.
    pub at: Instant,
}

struct State {
    queued: Vec<Pending>,
    /// A flush is being written right now.
    flushing: bool,
    /// Someone waits for everything queued to be written (`close`, `shutdown`): flush at once.
    urgent: usize,
    /// The subscription's context is gone: the thread ends once nothing is queued.
    closed: bool,
}

struct Shared {
    state: Mutex<State>,
    /// Wakes the flusher (first row queued, a full batch, an urgent wait, closing).
    work: Condvar,
    /// Wakes those waiting for room or for a flush to end.
    flushed: Condvar,
    within: Duration,
}

/// The deferred-ack queue of one subscription, and its flusher thread.
pub(crate) struct DeferredAcks {
    shared: Arc<Shared>,
}

impl DeferredAcks {
    /// Starts the flusher thread (`sqlbroker-ack-<table>`); `flush` writes one batch.
    pub fn start(
        table: &str,
        within: Duration,
        flush: fn(&[Pending]),
    ) -> std::io::Result<DeferredAcks> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                queued: Vec::new(),
                flushing: false,
                urgent: 0,
                closed: false,
            }),
            work: Condvar::new(),
            flushed: Condvar::new(),
            within,
        });
        let s = shared.clone();
        std::thread::Builder::new()
            .name(format!("sqlbroker-ack-{table}"))
            .spawn(move || run(&s, flush))?;
        Ok(DeferredAcks { shared })
    }

    /// Queues an acked row; waits only while [`QUEUED_MAX`] rows are queued.
    pub fn push(&self, p: Pending) {
        let sh = &self.shared;
        let mut st = sh.state.lock();
        while st.queued.len() >= QUEUED_MAX && !st.closed {
            sh.flushed.wait(&mut st);
        }
        st.queued.push(p);
        // The flusher sleeps until a first row arrives, a batch fills, or the bound is due.
        if st.queued.len() == 1 || st.queued.len() == ACK_GROUP_MAX {
            sh.work.notify_one();
        }
    }

    /// Writes everything queued now (not waiting for the bound) and waits until it is written,
    /// at most `timeout`; false if rows were still unwritten then.
    pub fn flush_within(&self, timeout: Duration) -> bool {
        let sh = &self.shared;
        let deadline = Instant::now() + timeout;
        let mut st = sh.state.lock();
        st.urgent += 1;
        sh.work.notify_one();
        while (!st.queued.is_empty() || st.flushing) && Instant::now() < deadline {
            sh.flushed.wait_until(&mut st, deadline);
        }
        st.urgent -= 1;
        st.queued.is_empty() && !st.flushing
    }
}

impl Drop for DeferredAcks {
    fn drop(&mut self) {
        // Only the context owns this, and every queued row holds the context: nothing is
        // queued now, and the thread ends.
        let mut st = self.shared.state.lock();
        st.closed = true;
        self.shared.work.notify_one();
        self.shared.flushed.notify_all();
    }
}

/// The flusher: waits for a full batch, the oldest row's bound or an urgent wait, writes.
fn run(sh: &Shared, flush: fn(&[Pending])) {
    let mut st = sh.state.lock();
    loop {
        if st.queued.is_empty() {
            if st.closed {
                return;
            }
            sh.work.wait(&mut st);
            continue;
        }
        let due = st.queued[0].at + sh.within;
        if st.queued.len() < ACK_GROUP_MAX && st.urgent == 0 && Instant::now() < due {
            sh.work.wait_until(&mut st, due);
            continue;
        }
        let n = st.queued.len().min(ACK_GROUP_MAX);
        let batch: Vec<Pending> = st.queued.drain(..n).collect();
        st.flushing = true;
        // Room for the handlers waiting for it.
        sh.flushed.notify_all();
        drop(st);
        // `flush` reports its own failures; a panic in it must not stop the thread, which
        // would leave every later ack unwritten (their rows would return with their leases).
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| flush(&batch))).is_err() {
            log::error!("a deferred ack flush panicked; its rows return when their leases end");
        }
        // Written or not, these leases are no longer renewed (a flush that failed has said
        // so): an unwritten row returns when its lease ends.
        for p in &batch {
            p.cell.lock().done = true;
            p.ctx.leases.remove(&p.cell);
        }
        // Outside the lock: the last context dropped here drops this queue.
        drop(batch);
        st = sh.state.lock();
        st.flushing = false;
        sh.flushed.notify_all();
    }
}
