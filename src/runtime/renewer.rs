//! The lease timer: one thread per broker (`sqlbroker-renew`), started with its first lease
//! subscription, renews every in-flight lease of every lease subscription once per half lease,
//! one statement per table per round where the database allows it. It holds its subscriptions
//! by weak links and ends when the broker is dropped.
//!
//! Each in-flight lease has a cell holding its token. A round `try_lock`s the cells (a cell
//! being settled is skipped: it needs no renewal), renews the held tokens, writes the new token
//! into the cells it renewed and releases them. A settlement takes its cell's lock, so it never
//! runs between the database's renewal and the cell's update, and always names the token the
//! row holds. Only one delivery's settlement ever waits on a round, and for one statement.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use parking_lot::{Condvar, Mutex, MutexGuard};

use super::Ctx;
use crate::dialect::DbConn;
use crate::schedule::{lease_token, renew_every};

/// Rows renewed per statement (two parameters each).
const RENEW_CHUNK: usize = 500;

/// The token of one in-flight lease.
pub(crate) struct LeaseCell {
    pub id: i64,
    serial: u64,
    state: Mutex<LeaseState>,
}

pub(crate) struct LeaseState {
    pub token: SystemTime,
    /// Settled or abandoned: the renewer leaves it alone.
    pub done: bool,
}

impl LeaseCell {
    pub fn lock(&self) -> MutexGuard<'_, LeaseState> {
        self.state.lock()
    }
}

/// Every in-flight lease of a subscription.
#[derive(Default)]
pub(crate) struct LeaseBook {
    cells: Mutex<HashMap<u64, Arc<LeaseCell>>>,
    next: AtomicU64,
}

impl LeaseBook {
    pub fn insert(&self, id: i64, token: SystemTime) -> Arc<LeaseCell> {
        let serial = self.next.fetch_add(1, Ordering::Relaxed);
        let cell = Arc::new(LeaseCell {
            id,
            serial,
            state: Mutex::new(LeaseState { token, done: false }),
        });
        self.cells.lock().insert(serial, cell.clone());
        cell
    }

    pub fn remove(&self, cell: &LeaseCell) {
        self.cells.lock().remove(&cell.serial);
    }

    fn snapshot(&self) -> Vec<Arc<LeaseCell>> {
        self.cells.lock().values().cloned().collect()
    }
}

/// The broker's lease timer.
#[derive(Default)]
pub(crate) struct Renewer {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

#[derive(Default)]
struct Shared {
    subs: Mutex<Vec<Entry>>,
    cv: Condvar,
    stop: AtomicBool,
}

struct Entry {
    ctx: Weak<Ctx>,
    every: Duration,
    next: Instant,
}

impl Renewer {
    /// Renews the leases of `ctx` from now on, until it is dropped or stops renewing
    /// ([`Ctx::stop_renewing`]). Starts the thread on first use.
    pub fn register(&self, ctx: &Arc<Ctx>) -> std::io::Result<()> {
        let mut thread = self.thread.lock();
        if thread.is_none() {
            let shared = self.shared.clone();
            *thread = Some(
                std::thread::Builder::new()
                    .name("sqlbroker-renew".into())
                    .spawn(move || run(&shared))?,
            );
        }
        let every = renew_every(ctx.spec().lease_secs);
        self.shared.subs.lock().push(Entry {
            ctx: Arc::downgrade(ctx),
            every,
            next: Instant::now() + every,
        });
        self.shared.cv.notify_all();
        Ok(())
    }
}

impl Drop for Renewer {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.cv.notify_all();
        if let Some(h) = self.thread.lock().take() {
            // The last broker handle may be dropped on the renewer's own thread (a round holds
            // a context, which holds the queue, which holds the pool, not the broker; but be safe).
            if h.thread().id() != std::thread::current().id() {
                let _ = h.join();
            }
        }
    }
}

/// The timer loop: sleeps until the earliest round is due, runs the due rounds outside the
/// lock, drops the subscriptions that are gone.
fn run(shared: &Shared) {
    let mut subs = shared.subs.lock();
    while !shared.stop.load(Ordering::Acquire) {
        let now = Instant::now();
        subs.retain(|e| e.ctx.upgrade().is_some_and(|c| c.renewing()));
        let due: Vec<Arc<Ctx>> = subs
            .iter_mut()
            .filter(|e| e.next <= now)
            .filter_map(|e| {
                e.next = now + e.every;
                e.ctx.upgrade()
            })
            .collect();
        if due.is_empty() {
            match subs.iter().map(|e| e.next).min() {
                Some(next) => {
                    shared.cv.wait_until(&mut subs, next);
                }
                None => shared.cv.wait(&mut subs),
            }
            continue;
        }
        let failed: Vec<Arc<Ctx>> = MutexGuard::unlocked(&mut subs, || {
            due.into_iter().filter(|ctx| !round(ctx)).collect()
        });
        // A failed round is tried again after a quarter lease, not half: the leases have
        // half a lease left at most.
        for e in subs.iter_mut() {
            if failed
                .iter()
                .any(|f| std::ptr::eq(e.ctx.as_ptr(), Arc::as_ptr(f)))
            {
                e.next = Instant::now() + e.every / 2;
            }
        }
    }
}

/// One renewal round over every in-flight lease.
pub(crate) fn round(ctx: &Ctx) -> bool {
    let cells = ctx.leases.snapshot();
    if cells.is_empty() {
        return true;
    }
    // The connection first, waiting briefly: the cells' locks (which settlements wait on) are
    // then held only while the statement runs, never while the pool is exhausted (row lock
    // deliveries of the same broker may hold every connection).
    let q = &ctx.queue;
    let wait = (renew_every(q.spec.lease_secs) / 4).min(q.pool.connection_timeout());
    let mut conn = match q.pool.get_timeout(wait) {
        Ok(conn) => conn,
        Err(e) => {
            let e = format!(
                "renewing leases of table {}: no connection within {wait:?}: {e}",
                q.spec.name
            );
            log::warn!("{e}");
            ctx.set_error(e);
            return false;
        }
    };
    let mut held: Vec<(&Arc<LeaseCell>, MutexGuard<'_, LeaseState>)> = Vec::new();
    for cell in &cells {
        if let Some(state) = cell.state.try_lock() {
            if !state.done {
                held.push((cell, state));
            }
        }
    }
    // One row may have two cells here: a delivery whose lease was lost and a later claim of the
    // same row. Tokens grow with every claim, so only the largest can still match: renew that
    // one alone, or the stale delivery would be handed the new token.
    held.sort_by(|a, b| (a.0.id, b.1.token).cmp(&(b.0.id, a.1.token)));
    held.dedup_by_key(|(cell, _)| cell.id);
    held.chunks_mut(RENEW_CHUNK)
        .all(|chunk| renew_chunk(ctx, &mut **conn, chunk))
}

/// Renews one chunk of leases on `conn`; false if the statement failed.
fn renew_chunk(
    ctx: &Ctx,
    conn: &mut dyn DbConn,
    chunk: &mut [(&Arc<LeaseCell>, MutexGuard<'_, LeaseState>)],
) -> bool {
    let q = &ctx.queue;
    let pairs: Vec<(i64, SystemTime)> = chunk.iter().map(|(c, s)| (c.id, s.token)).collect();
    let token = lease_token(SystemTime::now(), q.spec.lease_secs);
    match q.dialect.lease_renew(conn, &q.spec, token, &pairs) {
        Ok(ids) => {
            let ids: HashSet<i64> = ids.into_iter().collect();
            for (cell, state) in chunk.iter_mut() {
                if ids.contains(&cell.id) {
                    state.token = token;
                } else {
                    log::warn!(
                        "table {}: lease of row {} was lost before renewal",
                        q.spec.name,
                        cell.id
                    );
                }
            }
            true
        }
        Err(e) => {
            // The leases keep their tokens; the next round, soon, tries again.
            let e = q.err("renew")(e);
            log::warn!("{e}");
            ctx.set_error(e.to_string());
            false
        }
    }
}
