//! The lease timer: one thread per broker (`sqlbroker-renew`), started with its first lease
//! subscription, renews every in-flight lease of every lease subscription once per half lease,
//! one statement per table per round where the database allows it. It holds its subscriptions
//! by weak links and ends when the broker is dropped.
//!
//! Each in-flight lease has a cell holding its token. A round works in chunks of up to 500
//! leases: it `try_lock`s the chunk's cells (a cell being settled is skipped: it needs no
//! renewal), renews the held tokens in one statement, writes the new token into the cells it
//! renewed and releases them before the next chunk. A settlement takes its cell's lock, so it
//! never runs between the database's renewal and the cell's update, and always names the token
//! the row holds; it waits at most for one renewal statement. It takes the lock only once it
//! holds its connection: a settlement (or an extension, a checkpoint) waiting for a pool the
//! application holds whole leaves its lease to be renewed meanwhile.
//!
//! Renewal never waits on a row lock (servers: `FOR UPDATE SKIP LOCKED`): a row a user's
//! transaction holds is skipped this round and tried again a quarter lease later, so one locked
//! row cannot stall the leases of every table on the broker. A round that panics is reported on
//! its subscription and tried again; the thread goes on.
//!
//! Nor does renewal wait on a pool the application holds whole (row lock deliveries, its own
//! transactions): a round that gets no pooled connection within [`SPARE_AFTER`] renews on one
//! opened for it beyond the pool's size.
//!
//! Nor is the timer held up by a round that waits on a server that does not answer: each
//! round runs on a thread of its own ([`Runner`]), and the timer waits for it at most a quarter
//! of the shortest lease it renews. A round still running then is left to end by itself (its
//! statements give up at the round trip timeout, its checkout at the pool's), the timer goes on
//! with the other tables on a new runner, and the subscription's next round waits until that
//! one has ended. A handler learns nothing from it either way: `Delivery::lease_held` reads
//! the deadline of the last renewal that answered, without waiting for one in progress.

use std::collections::{HashMap, HashSet};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use parking_lot::{Condvar, Mutex, MutexGuard};

use super::pool::Tracked;
use super::{Ctx, PooledConn};
use crate::dialect::DbConn;
use crate::error::{BrokerError, DbErrorKind};
use crate::model::schedule::{lease_alive, lease_token, renew_every, renewal_is_ours};

/// How long a round waits for a pooled connection before it opens a spare one: a pool busy
/// with claims frees one sooner; one the application holds does not.
const SPARE_AFTER: Duration = Duration::from_millis(100);

/// Rows renewed per statement (two parameters each).
const RENEW_CHUNK: usize = 500;

/// Renewals with lost answers remembered per lease; past this many in a row, the oldest is
/// forgotten (its lease has expired by then).
const MAX_UNSURE: usize = 4;

/// The token of one in-flight lease.
pub(crate) struct LeaseCell {
    pub id: i64,
    serial: u64,
    state: Mutex<LeaseState>,
    /// The token as last written ([`LeaseCell::set_token`]), in nanoseconds since the epoch,
    /// read without the lock: a renewal holds the lock while its statement runs, and a handler
    /// asking whether it still holds its lease must be answered at once, above all while that
    /// statement waits on a server that does not answer.
    until: AtomicU64,
}

pub(crate) struct LeaseState {
    pub token: SystemTime,
    /// Tokens of renewals whose answers were lost: the row holds one of these or `token`.
    pub unsure: Vec<SystemTime>,
    /// Settled or abandoned: the renewer leaves it alone.
    pub done: bool,
}

impl LeaseCell {
    pub fn lock(&self) -> MutexGuard<'_, LeaseState> {
        self.state.lock()
    }

    /// The token held as far as this process knows, without waiting for the lock.
    pub fn deadline(&self) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_nanos(self.until.load(Ordering::Acquire))
    }

    /// Writes the token held (`state` is this cell's, locked).
    pub fn set_token(&self, state: &mut LeaseState, token: SystemTime) {
        state.token = token;
        self.until.store(nanos(token), Ordering::Release);
    }
}

/// `t` in nanoseconds since the epoch (0 before it; saturated past 2554).
fn nanos(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// Every in-flight lease of a subscription.
#[derive(Default)]
pub(crate) struct LeaseBook {
    cells: Mutex<HashMap<u64, Arc<LeaseCell>>>,
    next: AtomicU64,
}

impl LeaseBook {
    /// A cell per id, all with `token`, booked under one lock (a claim's rows).
    pub fn insert_all(&self, ids: &[i64], token: SystemTime) -> Vec<Arc<LeaseCell>> {
        let first = self.next.fetch_add(ids.len() as u64, Ordering::Relaxed);
        let cells: Vec<Arc<LeaseCell>> = ids
            .iter()
            .zip(first..)
            .map(|(&id, serial)| {
                Arc::new(LeaseCell {
                    id,
                    serial,
                    until: AtomicU64::new(nanos(token)),
                    state: Mutex::new(LeaseState {
                        token,
                        unsure: Vec::new(),
                        done: false,
                    }),
                })
            })
            .collect();
        let mut book = self.cells.lock();
        book.reserve(cells.len());
        for cell in &cells {
            book.insert(cell.serial, cell.clone());
        }
        cells
    }

    pub fn remove(&self, cell: &LeaseCell) {
        self.cells.lock().remove(&cell.serial);
    }

    /// [`remove`](LeaseBook::remove) of many under one lock (a batch settled together).
    pub fn remove_all<'a>(&self, cells: impl IntoIterator<Item = &'a LeaseCell>) {
        let mut book = self.cells.lock();
        for cell in cells {
            book.remove(&cell.serial);
        }
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
    /// A round of this subscription is running (perhaps on a runner the timer gave up
    /// waiting for).
    busy: Arc<AtomicBool>,
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
            busy: Arc::default(),
        });
        self.shared.cv.notify_all();
        Ok(())
    }
}

impl Drop for Renewer {
    fn drop(&mut self) {
        let handle = self.thread.lock().take();
        // The last handle may be dropped on the renewer's own thread (a context it ran a round
        // for), perhaps while its loop holds `subs`: then the loop sees the flag by itself.
        if handle
            .as_ref()
            .is_some_and(|h| h.thread().id() == std::thread::current().id())
        {
            self.shared.stop.store(true, Ordering::Release);
            return;
        }
        {
            // Under the lock the loop checks the flag and waits with: set outside it, the flag
            // and the notify could both land between the loop's check and its wait, and the
            // loop would wait for ever (and this join with it).
            let _subs = self.shared.subs.lock();
            self.shared.stop.store(true, Ordering::Release);
        }
        self.shared.cv.notify_all();
        if let Some(h) = handle {
            let _ = h.join();
        }
    }
}

/// The timer loop: sleeps until the earliest round is due, runs the due rounds outside the
/// lock (each on the [`Runner`], waited for at most a quarter of the shortest lease), drops
/// the subscriptions that are gone.
fn run(shared: &Shared) {
    let mut runner: Option<Runner> = None;
    let mut subs = shared.subs.lock();
    while !shared.stop.load(Ordering::Acquire) {
        let now = Instant::now();
        subs.retain(|e| e.ctx.upgrade().is_some_and(|c| c.renewing()));
        let patience = subs.iter().map(|e| e.every / 2).min().unwrap_or_default();
        let due: Vec<(Arc<Ctx>, Arc<AtomicBool>)> = subs
            .iter_mut()
            .filter(|e| e.next <= now)
            .filter_map(|e| {
                e.next = now + e.every;
                Some((e.ctx.upgrade()?, e.busy.clone()))
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
            due.into_iter()
                .filter(|(ctx, busy)| !run_round(&mut runner, ctx, busy, patience))
                .map(|(ctx, _)| ctx)
                .collect()
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

/// The thread renewal rounds run on, one round at a time, so the timer can stop waiting for a
/// round (a server that does not answer) and go on with the others. It ends when the timer
/// drops it, after the round it is running.
struct Runner {
    rounds: crossbeam_channel::Sender<(Arc<Ctx>, Arc<AtomicBool>)>,
    done: crossbeam_channel::Receiver<bool>,
}

impl Runner {
    fn spawn() -> std::io::Result<Runner> {
        let (rounds, todo) = crossbeam_channel::bounded::<(Arc<Ctx>, Arc<AtomicBool>)>(1);
        let (finished, done) = crossbeam_channel::bounded(1);
        std::thread::Builder::new()
            .name("sqlbroker-renew-round".into())
            .spawn(move || {
                for (ctx, busy) in todo {
                    let renewed = guarded_round(&ctx);
                    busy.store(false, Ordering::Release);
                    // The timer's hold on the subscription is not kept past its round.
                    drop(ctx);
                    if finished.send(renewed).is_err() {
                        return; // given up on: the timer has a new runner
                    }
                }
            })?;
        Ok(Runner { rounds, done })
    }
}

/// Runs `ctx`'s round on the runner and waits for it at most `patience`; false if it failed,
/// is still running (the runner is then left to finish it alone, and the next round gets a
/// new one), or a round of `ctx` still runs on a runner given up on.
fn run_round(
    runner: &mut Option<Runner>,
    ctx: &Arc<Ctx>,
    busy: &Arc<AtomicBool>,
    patience: Duration,
) -> bool {
    if busy.load(Ordering::Acquire) {
        log::debug!(
            "table {}: the last renewal round is still waiting on the database",
            ctx.spec().name
        );
        return false;
    }
    let r = match runner {
        Some(r) => r,
        None => match Runner::spawn() {
            Ok(r) => runner.insert(r),
            Err(e) => {
                log::warn!("renewal: no thread for a round ({e}); run on the timer's own");
                return guarded_round(ctx);
            }
        },
    };
    busy.store(true, Ordering::Release);
    if r.rounds.send((ctx.clone(), busy.clone())).is_err() {
        busy.store(false, Ordering::Release);
        *runner = None;
        return false;
    }
    match r.done.recv_timeout(patience) {
        Ok(renewed) => renewed,
        Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
            log::warn!(
                "table {}: a lease renewal round still runs after {patience:?} (a database \
                 that does not answer?); the other tables' rounds go on without it",
                ctx.spec().name
            );
            *runner = None;
            false
        }
        Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
            *runner = None;
            false
        }
    }
}

/// A round that cannot take the renewer down: a panic fails the round (tried again soon) and
/// is reported on the subscription, and the thread goes on renewing every other table.
fn guarded_round(ctx: &Ctx) -> bool {
    match catch_unwind(AssertUnwindSafe(|| round(ctx))) {
        Ok(done) => done,
        Err(panic) => {
            let message = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            let e = BrokerError::Panic {
                thread: format!("renewing leases of table {}", ctx.spec().name),
                message,
            };
            log::error!("{e}");
            ctx.set_error(e);
            false
        }
    }
}

/// One renewal round over every in-flight lease; false if some lease was not renewed (the
/// round is tried again after a quarter lease rather than half).
///
/// Modelled in model/lease.pml (renew).
pub(crate) fn round(ctx: &Ctx) -> bool {
    let mut cells = ctx.leases.snapshot();
    if cells.is_empty() {
        ctx.marks.renewed();
        return true;
    }
    // The connection first: the cells' locks (which settlements wait on) are then held only
    // while a statement runs, never while the pool is exhausted.
    let Some(mut conn) = connection(ctx) else {
        return false;
    };
    // One row may have two cells: a delivery whose lease was lost and a later claim of the
    // same row. Sorted by id, a row's cells are neighbours and land in one chunk.
    cells.sort_by_key(|c| c.id);
    let mut all = true;
    let mut rest = &cells[..];
    while !rest.is_empty() {
        let mut end = rest.len().min(RENEW_CHUNK);
        while end < rest.len() && rest[end].id == rest[end - 1].id {
            end += 1;
        }
        let (chunk, next) = rest.split_at(end);
        rest = next;
        // Only this chunk's cells are held, and only while its statement runs. A cell being
        // settled is skipped: it needs no renewal.
        let mut held: Vec<(&Arc<LeaseCell>, MutexGuard<'_, LeaseState>)> = chunk
            .iter()
            .filter_map(|cell| Some((cell, cell.state.try_lock()?)))
            .filter(|(_, state)| !state.done)
            .collect();
        // Tokens grow with every claim, so of a row's cells only the largest can still match:
        // renew that one alone, or the stale delivery would be handed the new token.
        held.sort_by(|a, b| (a.0.id, b.1.token).cmp(&(b.0.id, a.1.token)));
        held.dedup_by_key(|(cell, _)| cell.id);
        all &= renew_chunk(ctx, conn.as_mut(), &mut held);
    }
    if all {
        ctx.marks.renewed();
    }
    all
}

/// A round's connection: a pooled one, or, when none comes within [`SPARE_AFTER`] (the
/// application holds every pooled one: row lock deliveries, its own transactions), a spare
/// opened for the round and closed after it, so a held pool does not let the leases run out.
/// With neither (the server refuses another connection; an in-memory SQLite database has only
/// one), the pool is waited on for the rest of a short wait and a failure is reported on the
/// subscription.
fn connection(ctx: &Ctx) -> Option<RoundConn> {
    let q = &ctx.queue;
    let wait = (renew_every(q.spec.lease_secs) / 4).min(q.pool.connection_timeout());
    let first = SPARE_AFTER.min(wait);
    if let Ok(conn) = q.pool.get_timeout(first) {
        return Some(RoundConn::Pooled(conn));
    }
    match q.pool.spare() {
        Ok(spare) => return Some(RoundConn::Spare(spare)),
        Err(e) => log::debug!("renew on table {}: no spare connection: {e}", q.spec.name),
    }
    let failed = match q.pool.get_timeout(wait.saturating_sub(first)) {
        Ok(conn) => return Some(RoundConn::Pooled(conn)),
        Err(e) => e,
    };
    let e = BrokerError::Pool {
        op: "renew",
        table: q.spec.name.clone(),
        timeout: wait,
        source: failed.into(),
    };
    log::warn!("{e}");
    ctx.set_error(e);
    None
}

/// The connection a round renews on.
enum RoundConn {
    Pooled(PooledConn),
    Spare(Tracked),
}

impl RoundConn {
    fn as_mut(&mut self) -> &mut dyn DbConn {
        match self {
            RoundConn::Pooled(conn) => &mut **conn,
            RoundConn::Spare(conn) => conn,
        }
    }
}

/// Renews one chunk of leases on `conn`; false if the statement failed or a lease was not
/// renewed (lost, or skipped while another transaction had its row locked).
///
/// Modelled in model/fifo.pml (renew), model/lease.pml (renew), model/limits.pml (renew).
fn renew_chunk(
    ctx: &Ctx,
    conn: &mut dyn DbConn,
    chunk: &mut [(&Arc<LeaseCell>, MutexGuard<'_, LeaseState>)],
) -> bool {
    if chunk.is_empty() {
        return true;
    }
    let q = &ctx.queue;
    let now = SystemTime::now();
    let token = lease_token(now, q.spec.lease_secs);
    // A lease extended by hand past this round's deadline needs no renewal yet.
    // A lease that has ended is not brought back (`lease_alive`): its row may have been
    // counted free by a claim elsewhere; the delivery finds out at settlement.
    let mut pairs: Vec<(i64, SystemTime)> = Vec::with_capacity(chunk.len());
    let mut due = 0;
    for (cell, state) in chunk.iter() {
        if state.token >= token && state.unsure.is_empty() {
            continue;
        }
        due += 1;
        let held = std::iter::once(state.token).chain(state.unsure.iter().copied());
        pairs.extend(held.filter(|t| lease_alive(*t, now)).map(|t| (cell.id, t)));
    }
    if due == 0 {
        return true;
    }
    let renewed = match pairs.is_empty() {
        // Every lease due has ended: none is renewed.
        true => Ok(Vec::new()),
        false => crate::runtime::injected("lease.renew", &q.spec.name, || {
            q.dialect.lease_renew(conn, &q.spec, token, &pairs)
        }),
    };
    match renewed {
        Ok(ids) => {
            let ids: HashSet<i64> = ids.into_iter().collect();
            let mut all = true;
            for (cell, state) in chunk.iter_mut() {
                if state.token >= token && state.unsure.is_empty() {
                    continue; // extended by hand, not renewed
                }
                if ids.contains(&cell.id) {
                    cell.set_token(state, token);
                    state.unsure.clear();
                } else {
                    all = false;
                    log::debug!(
                        "table {}: lease of row {} not renewed this round (lost, or its row locked)",
                        q.spec.name,
                        cell.id
                    );
                }
            }
            all
        }
        Err(e) => {
            // A lost connection cannot tell whether the renewal committed: the row holds the
            // old token or the new one, and the next round and the settlement try both. Only
            // while the new token is one no other claim can write too: a renewal in the held
            // token's last second (or later) writes what a claim of the expired row by another
            // would write in that second, and a settlement matching it would settle the other's
            // lease. Such a renewal is forgotten: had it committed, this delivery learns that its
            // lease is lost (`LeaseLost`) and the row returns when the renewal's lease ends.
            if e.kind == DbErrorKind::ConnectionLost {
                for (_, state) in chunk.iter_mut() {
                    if !renewal_is_ours(now, state.token) {
                        continue;
                    }
                    if state.unsure.len() >= MAX_UNSURE {
                        state.unsure.remove(0);
                    }
                    state.unsure.push(token);
                }
            }
            let e = q.err("renew")(e);
            log::warn!("{e}");
            ctx.set_error(e);
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::table::Form;
    use crate::runtime::testing::{ctx, options, Script};

    /// Defect 9: a renewal round that panics is reported on its subscription and fails the
    /// round; it does not unwind the renewer thread (which renews every lease table of the
    /// broker and was never restarted).
    #[test]
    fn a_panicking_round_is_contained() {
        let script = Arc::new(Script {
            panic_on_renew: true,
            ..Script::default()
        });
        let ctx = ctx(&script, Form::Lease, options(1));
        // Leases that have not ended (an ended one is not renewed: `lease_alive`).
        let held = SystemTime::now() + Duration::from_secs(1);
        let _cell = ctx.leases.insert_all(&[7], held);
        assert!(!guarded_round(&ctx), "a panicked round reported success");
        assert!(ctx.last_error().unwrap().to_string().contains("panicked"));

        // The thread goes on: a healthy subscription registered beside it is renewed.
        let healthy = Arc::new(Script::default());
        let ok = ctx_with_lease(&healthy, 1);
        let _cell = ok.leases.insert_all(&[8], held);
        let renewer = Renewer::default();
        renewer.register(&ctx).unwrap();
        renewer.register(&ok).unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while healthy.log.lock().is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(
            !healthy.log.lock().is_empty(),
            "the renewer stopped renewing"
        );
    }

    /// Dropping the renewer always joins its thread: the stop flag and its wake-up cannot slip
    /// between the loop's check and its wait (a lost wake-up hung a CI run in the join). A race,
    /// so many rounds; each must end within seconds.
    #[test]
    fn dropping_the_renewer_never_hangs() {
        for _ in 0..300 {
            let (tx, rx) = crossbeam_channel::bounded(1);
            std::thread::spawn(move || {
                let script = Arc::new(Script::default());
                let ctx = ctx_with_lease(&script, 1);
                let renewer = Renewer::default();
                renewer.register(&ctx).unwrap();
                drop(ctx);
                drop(renewer);
                let _ = tx.send(());
            });
            assert!(
                rx.recv_timeout(Duration::from_secs(10)).is_ok(),
                "dropping the renewer hung"
            );
        }
    }

    /// A pool the application holds whole does not stop a round: it renews on a spare
    /// connection, opened beyond the pool's size. When the server refuses that one too, the
    /// round fails within its short wait and names the pool on the subscription.
    #[test]
    fn a_held_pool_renews_on_a_spare() {
        for refused in [false, true] {
            let script = Arc::new(Script {
                max_connects: refused.then_some(4),
                ..Script::default()
            });
            let ctx = ctx_with_lease(&script, 2);
            let held: Vec<_> = (0..4).map(|_| ctx.queue.pool.get().unwrap()).collect();
            let _cell = ctx
                .leases
                .insert_all(&[7], SystemTime::now() + Duration::from_secs(1));
            let started = Instant::now();
            let renewed = round(&ctx);
            let renewals = script.log.lock().iter().filter(|s| *s == "renew").count();
            assert_eq!((renewed, renewals), (!refused, usize::from(!refused)));
            assert!(
                started.elapsed() < Duration::from_secs(1),
                "{:?}",
                started.elapsed()
            );
            let error = ctx.last_error();
            let pool = matches!(
                error.as_deref(),
                Some(BrokerError::Pool { op: "renew", .. })
            );
            assert_eq!(pool, refused, "{error:?}");
            drop(held);
        }
    }

    /// Issue 38: a round that waits on a server that does not answer (here 3 s) holds up no
    /// other subscription's rounds: the timer waits for it a quarter of the shortest lease,
    /// then goes on with a new runner; the stalled subscription gets no second round while its
    /// first still waits. Run on the timer's own thread, as before, the healthy table's lease
    /// (1 s) ran out behind the stall and was never renewed.
    #[test]
    fn a_stalled_round_holds_up_no_other() {
        let stalled = Arc::new(Script {
            renew_stall: Some(Duration::from_secs(3)),
            ..Script::default()
        });
        let healthy = Arc::new(Script::default());
        let a = ctx_with_lease(&stalled, 1);
        let b = ctx_with_lease(&healthy, 1);
        let held = SystemTime::now() + Duration::from_secs(1);
        let _cells = (
            a.leases.insert_all(&[7], held),
            b.leases.insert_all(&[8], held),
        );
        let renewer = Renewer::default();
        renewer.register(&a).unwrap();
        renewer.register(&b).unwrap();
        let started = Instant::now();
        let renewed = |s: &Script| s.log.lock().iter().any(|l| l == "renew");
        while !renewed(&healthy) && started.elapsed() < Duration::from_millis(1500) {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(
            renewed(&healthy),
            "the healthy lease was not renewed while another table's round stalled"
        );
        // A lease the stalled round does not hold: a second round would take it.
        let _late = a
            .leases
            .insert_all(&[9], SystemTime::now() + Duration::from_secs(1));
        std::thread::sleep(Duration::from_millis(2500).saturating_sub(started.elapsed()));
        let stalls = stalled.log.lock().iter().filter(|l| *l == "stall").count();
        assert_eq!(
            stalls, 1,
            "a second round of the stalled table ran beside the first"
        );
    }

    /// A context whose table leases for `secs` (renewed every half of it).
    fn ctx_with_lease(script: &Arc<Script>, secs: u64) -> Arc<Ctx> {
        let ctx = ctx(script, Form::Lease, options(1));
        let mut spec = ctx.queue.spec.clone();
        spec.lease_secs = secs;
        let q = &ctx.queue;
        let queue = super::super::Queue::new(
            spec,
            q.sql.clone(),
            q.dialect.clone(),
            q.pool.clone(),
            q.wake.clone(),
            q.statement_timeout,
        );
        Arc::new(Ctx::new(Arc::new(queue), ctx.opts.clone(), None, None))
    }
}
