//! Claim workers: threads named `sqlbroker-claim-<table>-<n>`, each claiming on a pooled
//! connection and sending deliveries into the subscription's channel.
//!
//! A worker takes handler slots before it claims (never more rows than free slots), claims at
//! most that many rows, gives back the slots it did not fill, and sends the deliveries. When a
//! claim finds nothing it waits for a wake-up (a publish or a returned row on this broker, or
//! the broker's change feed: another broker's publish) or the poll interval; where the database
//! has no change feed (MySQL/MariaDB) the wait is short right after rows were found and
//! doubles up to the poll interval ([`idle_poll`]), and each such poll is one plain select
//! that finds whether any row may be claimable before a claim transaction is spent on it (a
//! wake-up claims at once). On SQLite, whose change feed wakes every table's idle workers on
//! any commit to the file (this process's acks too), an idle worker asks that select after
//! every wake-up: a claim there is a write, queued behind the one writer. A claim that filled its batch wakes one more
//! idle worker: there may be more rows than one worker takes. A failed claim (a deadlock, a lost connection, a server that is down) is
//! retried with a doubling backoff and its error kept for
//! [`Subscription::last_error`](crate::Subscription::last_error). A panic closes the
//! subscription with an error.
//!
//! It lives above `form` and `runtime` rather than in `runtime`: it runs the forms' claims, and
//! the forms build on the runtime (its context, pool and lease book), so the runtime imports
//! neither.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crossbeam_channel::{Receiver, Sender};

use crate::consuming::delivery::Delivery;
use crate::consuming::form::{self, Claimed};
use crate::dialect::{ChangeFeed, DbConn};
use crate::error::BrokerError;
use crate::model::schedule::{backoff, claim_now, idle_poll};
use crate::model::value::Value;
use crate::runtime::slots::Taken;
use crate::runtime::wake::PauseCheck;
use crate::runtime::Ctx;

const BACKOFF_BASE: Duration = Duration::from_millis(10);
const BACKOFF_CAP: Duration = Duration::from_secs(2);

/// The worker: claims until the subscription stops, then hands back whatever is still queued
/// (a worker that ends after the subscription's own drain, or after a panic, must not leave
/// rows held in the channel). `_alive` is dropped as it ends: `close` waits for that. The
/// spawner counted this worker as running (`Marks::worker_starting`); it stops counting here.
pub(crate) fn run(ctx: Arc<Ctx>, tx: Sender<Delivery>, rx: Receiver<Delivery>, _alive: Sender<()>) {
    let running = ctx.marks.worker_running();
    let result = catch_unwind(AssertUnwindSafe(|| work(&ctx, &tx)));
    if let Err(panic) = result {
        let msg = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".into());
        ctx.fail(BrokerError::Panic {
            thread: format!("a claim worker of table {}", ctx.spec().name),
            message: msg,
        });
    }
    while let Ok(d) = rx.try_recv() {
        drop(d);
    }
    drop(running);
}

/// Reports a claim's outcome to the application's hooks.
pub(crate) fn report(ctx: &Ctx, r: &crate::error::Result<Vec<Claimed>>, took: Duration) {
    match r {
        Ok(rows) => {
            ctx.queue.meters.claimed(rows.len(), took);
            if !rows.is_empty() {
                let now = std::time::SystemTime::now();
                for row in rows {
                    ctx.queue.meters.waited(row.due, now);
                }
            }
        }
        Err(_) => ctx.queue.meters.claim_failed(),
    }
    let Some(events) = &ctx.events else { return };
    let table = ctx.spec().name.as_str();
    match r {
        Ok(rows) if rows.is_empty() => {}
        Ok(rows) => events.claimed(&crate::runtime::events::ClaimedRows {
            table,
            rows: rows.len(),
            ids: &rows.iter().map(|c| c.id).collect::<Vec<_>>(),
            took,
        }),
        Err(error) => {
            events.claim_failed(&crate::runtime::events::ClaimFailed { table, error, took })
        }
    }
}

/// Why a claimed row is dead-lettered instead of delivered: claimed past `max_attempts` (its
/// attempts spent by crashes), or a value that cannot be read (it would fail every claim).
fn undeliverable(ctx: &Ctx, c: &Claimed) -> Option<String> {
    if let Some(why) = &c.unreadable {
        return Some(format!("a value of the row cannot be read: {why}"));
    }
    let max = ctx.spec().max_attempts?;
    (c.attempt > max).then(|| format!("claimed for attempt {}, past max_attempts {max}", c.attempt))
}

fn dead_letter(ctx: &Arc<Ctx>, c: Claimed, reason: String) {
    let id = c.id;
    log::warn!(
        "table {}: row {id} dead-lettered at claim: {reason}",
        ctx.spec().name
    );
    if let Err(e) = Delivery::new(ctx.clone(), c).dead_letter(reason) {
        log::warn!("table {}: dead-lettering row {id}: {e}", ctx.spec().name);
    }
}

/// True if the table's cheap readiness check ([`TableSql::any_ready`]) says no row can be
/// claimed: an idle worker's poll then costs one plain select instead of a claim transaction,
/// and, as an empty claim would, clears the last claim error (the table answers again).
/// Unsure (no check on this database, an error, a subscription stopping) is false: claim.
///
/// Where the claims read on from the cursor, so does the check: from the head, every idle
/// poll walked the entries a snapshot held elsewhere keeps from purge. When the next claim is
/// the one from the head (`runtime/cursor.rs`), no check: that claim goes ahead.
///
/// [`TableSql::any_ready`]: crate::dialect::TableSql::any_ready
pub(crate) fn nothing_ready(ctx: &Ctx) -> bool {
    let sql = &ctx.queue.sql;
    let Some(from_head) = &sql.any_ready else {
        return false;
    };
    let now = Value::Time(claim_now(SystemTime::now()));
    let mut args = vec![now.clone(), now];
    let check = match (&sql.any_ready_from, ctx.cursor.peek_next()) {
        (Some(_), None) => return false,
        (Some(from), Some(Some((run_at, id)))) => {
            args.extend([Value::Time(run_at), Value::Time(run_at), Value::Int(id)]);
            from
        }
        _ => from_head,
    };
    let Ok(Some(mut conn)) = ctx.claim_conn(None) else {
        return false;
    };
    match conn.query(check, &args) {
        Ok(rows) if rows.is_empty() => {
            ctx.marks.claimed();
            ctx.clear_error();
            true
        }
        _ => false,
    }
}

/// How long to claim nothing for if the table is paused ([`Broker::pause`](crate::Broker::pause)),
/// `None` if it is not: the flag as this broker last read it, read again from the registry once
/// per poll interval (one worker reads it for all, the others wait a moment for it). A read
/// that fails claims nothing for a poll interval, then reads again: the last value may be
/// older than a pause made meanwhile (found by the promise checker: a broker whose database
/// stopped answering for two seconds claimed on its old value a second after a pause).
fn paused(ctx: &Ctx) -> Option<Duration> {
    let poll = ctx.opts.poll_interval;
    match read_pause(ctx) {
        Pause::Fresh(false) => None,
        Pause::Fresh(true) => Some(poll),
        Pause::Reading => Some(poll.min(Duration::from_millis(5))),
    }
}

/// The pause flag read from the registry now, for a claim on the caller's thread that must
/// not claim a paused table (`Subscription::claim_on_caller`); the flag the workers keep is
/// left as it is.
#[cfg_attr(not(feature = "testing"), allow(dead_code))]
pub(crate) fn paused_now(ctx: &Ctx) -> crate::error::Result<bool> {
    let q = &ctx.queue;
    q.retrying("pause check", |conn| {
        crate::runtime::registry::read_paused(q, conn)
    })
}

/// What [`read_pause`] found.
enum Pause {
    /// Read, now or less than a poll interval ago.
    Fresh(bool),
    /// Another worker is reading it.
    Reading,
}

/// The pause flag, read from the registry if it is this worker's turn.
fn read_pause(ctx: &Ctx) -> Pause {
    let read = match ctx.queue.wake.pause.check(ctx.opts.poll_interval) {
        PauseCheck::Fresh(paused) => return Pause::Fresh(paused),
        PauseCheck::Reading => return Pause::Reading,
        PauseCheck::Read(read) => read,
    };
    // A statement on the database like a claim (its connection checked out and pinged
    // included): counted as one (`claiming`).
    ctx.claiming.fetch_add(1, Ordering::Relaxed);
    let found = match ctx.claim_conn(None) {
        Ok(Some(mut conn)) => {
            crate::runtime::registry::read_pause_and_record(&ctx.queue, &mut *conn)
                .map_err(|e| e.to_string())
        }
        Ok(None) => Err("the subscription is closing".to_string()),
        // No connection (a pool run dry): the worker claims nothing until it reads the flag,
        // and says why, as a claim that found no connection would.
        Err(e) => {
            let text = e.to_string();
            ctx.set_error(e);
            Err(text)
        }
    };
    ctx.claiming.fetch_sub(1, Ordering::Relaxed);
    let found = match found {
        Ok((paused, record)) => {
            // The record changed under this description (a `migrate` added a limit, say):
            // claiming on would pass by what the table now holds.
            let problems = crate::runtime::registry::unenforced(&ctx.queue, &record);
            if !problems.is_empty() {
                let e = crate::error::BrokerError::Schema {
                    table: ctx.spec().name.clone(),
                    problems,
                };
                log::error!("{e}; the subscription closes");
                ctx.fail(e);
            }
            paused
        }
        Err(e) => {
            log::debug!("table {}: reading the pause flag: {e}", ctx.spec().name);
            return Pause::Fresh(read.failed());
        }
    };
    let (before, now) = read.set(found);
    if before != now {
        log::info!(
            "table {} is {}",
            ctx.spec().name,
            if now { "paused" } else { "resumed" }
        );
    }
    Pause::Fresh(now)
}

/// Rows a claim took, as deliveries (each owning one of `slots`; the slots left over go back)
/// and the rows to dead-letter instead (with why). Dead letters are written after the
/// deliveries are on their way ([`bury`]).
///
/// Modelled in model/advisory.pml (end_cancelled), model/lease.pml (end_cancelled).
pub(crate) fn sort(
    ctx: &Arc<Ctx>,
    claimed: Vec<Claimed>,
    mut slots: Taken<'_>,
) -> (Vec<Delivery>, Vec<(Claimed, Unrun)>) {
    // Each claimed row's slot is its delivery's from here; the rest go back.
    slots.hand_over(claimed.len());
    drop(slots);
    let mut fresh = Vec::with_capacity(claimed.len());
    let mut dead = Vec::new();
    for c in claimed {
        if c.cancel_requested {
            dead.push((c, Unrun::Cancelled));
            continue;
        }
        match undeliverable(ctx, &c) {
            Some(reason) => dead.push((c, Unrun::Dead(reason))),
            None => fresh.push(Delivery::new(ctx.clone(), c)),
        }
    }
    (fresh, dead)
}

/// Why a claimed row is settled at once instead of delivered.
pub(crate) enum Unrun {
    /// Dead-lettered, for this reason ([`undeliverable`]).
    Dead(String),
    /// Its cancel was requested while an earlier claim held it: ended as that claim's retry
    /// would have ended it (dead-lettered as `"cancelled"`, or completed and cancelled where
    /// completed rows are kept), so it never runs again.
    Cancelled,
}

/// Settles the rows of a claim that are not delivered.
pub(crate) fn bury(ctx: &Arc<Ctx>, dead: Vec<(Claimed, Unrun)>) {
    for (c, why) in dead {
        match why {
            Unrun::Dead(reason) => dead_letter(ctx, c, reason),
            Unrun::Cancelled => end_cancelled(ctx, c),
        }
    }
}

/// Ends a claimed row whose cancel was requested: the retry statement finishes a marked row
/// as cancelled ([`Syntax::cancelled_case`](crate::dialect::shared::Syntax::cancelled_case)).
///
/// Modelled in model/advisory.pml (end_cancelled), model/lease.pml (end_cancelled).
fn end_cancelled(ctx: &Arc<Ctx>, c: Claimed) {
    let id = c.id;
    log::info!(
        "table {}: row {id} ended at claim: its cancel was requested while an earlier claim held it",
        ctx.spec().name
    );
    if let Err(e) = Delivery::new(ctx.clone(), c).end_cancelled() {
        log::warn!("table {}: ending cancelled row {id}: {e}", ctx.spec().name);
    }
}

fn is_schema(e: &BrokerError) -> bool {
    matches!(
        e,
        BrokerError::Database {
            kind: crate::error::DbErrorKind::Schema,
            ..
        }
    )
}

/// The empty claims counted after a wait: a wake-up (a publish or a returned row in this
/// process) starts the fast polls again, as a claim that found rows does. Rows often come in
/// runs, and the rows of this one may have been claimed by a handler's thread
/// (`Subscription::claim_here`), which the workers' count would not see: without this, rows of
/// the same run published by other processes waited for the poll interval.
fn after_wait(empty: u32, polled: bool) -> u32 {
    if polled {
        empty
    } else {
        0
    }
}

fn work(ctx: &Arc<Ctx>, tx: &Sender<Delivery>) {
    let mut failures = 0u32;
    let adaptive = ctx.queue.dialect.change_feed() == ChangeFeed::Poll;
    // Woken by any commit (SQLite): an idle worker checks before it claims, woken or not.
    let check_woken = ctx.queue.dialect.wakes_on_every_commit();
    // The last claim found nothing (or none was made yet).
    let mut idle = true;
    // Empty claims in a row; a worker starts idle (no fast polls before any row was seen).
    let mut empty = u32::MAX;
    // The last wait timed out (a poll, not a wake-up): ask the readiness check first.
    let mut polling = true;
    while !ctx.stopped() {
        let Some(slots) = ctx.slots.take(ctx.opts.batch) else {
            break;
        };
        if ctx.stopped() {
            break;
        }
        let seen = ctx.queue.wake.seq();
        if let Some(wait) = paused(ctx) {
            // Claims nothing until resumed; deliveries in hand go on. The flag is read again
            // after a poll interval, or at once after a resume (`PauseFlag::stale`).
            drop(slots);
            failures = 0;
            ctx.queue.wake.wait(seen, wait);
            polling = true;
            continue;
        }
        if ((adaptive && polling) || (check_woken && idle)) && {
            // A statement on the database like a claim: counted as one (`claiming`).
            ctx.claiming.fetch_add(1, Ordering::Relaxed);
            let none = nothing_ready(ctx);
            ctx.claiming.fetch_sub(1, Ordering::Relaxed);
            none
        } {
            drop(slots);
            failures = 0;
            empty = empty.saturating_add(1);
            let poll = ctx.opts.poll_interval;
            let wait = if adaptive {
                idle_poll(empty, poll)
            } else {
                poll
            };
            polling = !ctx.queue.wake.wait(seen, wait);
            empty = after_wait(empty, polling);
            continue;
        }
        ctx.claiming.fetch_add(1, Ordering::Relaxed);
        let started = std::time::Instant::now();
        #[cfg(feature = "tracing")]
        let span = tracing::debug_span!("sqlbroker.claim", table = %ctx.spec().name).entered();
        let claimed = form::claim(ctx, slots.count(), None);
        #[cfg(feature = "tracing")]
        drop(span);
        ctx.claiming.fetch_sub(1, Ordering::Relaxed);
        report(ctx, &claimed, started.elapsed());
        match claimed {
            Ok(claimed) => {
                failures = 0;
                ctx.marks.claimed();
                ctx.clear_error();
                let got = claimed.len();
                idle = got == 0;
                empty = if got == 0 { empty.saturating_add(1) } else { 0 };
                if got > 0 && got == slots.count() {
                    ctx.queue.wake.notify(1);
                }
                let (fresh, dead) = sort(ctx, claimed, slots);
                ctx.slots.enqueue(fresh.len());
                ctx.sending.fetch_add(1, Ordering::AcqRel);
                for d in fresh {
                    // The slot is the delivery's now; a failed send drops it, which hands the
                    // row back.
                    let _ = tx.send(d);
                }
                ctx.sending.fetch_sub(1, Ordering::AcqRel);
                bury(ctx, dead);
                // Nothing claimed because the pause flag went stale while the claim waited
                // for its connection: read it again at once, rather than wait a poll.
                if got == 0 && ctx.queue.wake.pause.too_old(ctx.opts.poll_interval) {
                    continue;
                }
                if got == 0 {
                    let poll = ctx.opts.poll_interval;
                    let mut wait = if adaptive {
                        idle_poll(empty, poll)
                    } else {
                        poll
                    };
                    // A rate window found full: claim again as it has room.
                    if let Some(room) = ctx.queue.flow.room_wait() {
                        wait = wait.min(room + Duration::from_millis(1));
                    }
                    // Rows may wait behind the cursor: claim again at the head's turn.
                    if let Some(head) = ctx.cursor.head_in() {
                        wait = wait.min(head + Duration::from_millis(1));
                    }
                    polling = !ctx.queue.wake.wait(seen, wait);
                    empty = after_wait(empty, polling);
                } else {
                    polling = false;
                }
            }
            Err(e) if is_schema(&e) => {
                // A column the statements need is gone or changed: retrying cannot help. The
                // subscription closes with the error (`last_error`), instead of failing for
                // ever. (A missing table may be created again, and is retried.)
                drop(slots);
                log::error!("{e}; the subscription closes");
                ctx.fail(e);
            }
            Err(e) => {
                drop(slots);
                failures += 1;
                // A deadlock or lock-wait timeout now and then is routine under contention.
                if e.is_transient() && failures < 3 {
                    log::debug!("{e}; retrying");
                } else {
                    log::warn!("{e}");
                }
                ctx.set_error(e);
                ctx.queue
                    .wake
                    .wait(seen, backoff(failures, BACKOFF_BASE, BACKOFF_CAP));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::table::Form;
    use crate::runtime::testing::{ctx, options, Script};

    /// Defect 9: a claim worker that panics with deliveries queued hands them back (before:
    /// they stayed claimed, leases renewed, until the subscription was dropped).
    #[test]
    fn a_panicking_worker_hands_back_what_it_queued() {
        let script = Arc::new(Script {
            rows_per_claim: 2,
            panic_on_claim: Some(2),
            ..Script::default()
        });
        let ctx = ctx(&script, Form::Lease, options(4));
        let (tx, rx) = crossbeam_channel::bounded(4);
        let (alive, exited) = crossbeam_channel::bounded::<()>(0);
        let worker = {
            let (ctx, rx) = (ctx.clone(), rx.clone());
            std::thread::spawn(move || run(ctx, tx, rx, alive))
        };
        worker
            .join()
            .expect("the worker thread itself must not die of the panic");
        assert!(
            exited.recv().is_err(),
            "the worker's liveness sender outlived it"
        );
        assert!(
            ctx.stopped(),
            "a panicking worker must close its subscription"
        );
        assert!(ctx.last_error().unwrap().to_string().contains("panicked"));
        assert!(
            rx.try_recv().is_err(),
            "deliveries stayed queued after the panic"
        );
        let unclaims = script.log.lock().iter().filter(|s| *s == "unclaim").count();
        assert_eq!(unclaims, 2, "the two queued rows were not handed back");
        assert_eq!(ctx.slots.in_flight(), 0);
    }

    /// An idle worker on a database with no change feed costs one plain select per poll, and
    /// no claim transaction while nothing is ready.
    #[test]
    fn an_idle_worker_polls_with_one_select_and_claims_nothing() {
        let script = Arc::new(Script {
            any_ready: true,
            ..Script::default()
        });
        let mut opts = options(4);
        opts.poll_interval = Duration::from_millis(50);
        let ctx = ctx(&script, Form::Lease, opts);
        let (tx, rx) = crossbeam_channel::bounded(4);
        let (alive, exited) = crossbeam_channel::bounded::<()>(0);
        let worker = {
            let (ctx, rx) = (ctx.clone(), rx.clone());
            std::thread::spawn(move || run(ctx, tx, rx, alive))
        };
        std::thread::sleep(Duration::from_millis(500));
        ctx.stop();
        worker.join().unwrap();
        assert!(exited.recv().is_err());
        let polls = script
            .log
            .lock()
            .iter()
            .filter(|s| *s == "any_ready")
            .count();
        assert_eq!(
            script.claims.load(std::sync::atomic::Ordering::SeqCst),
            0,
            "an idle worker ran claim transactions although nothing was ready"
        );
        // One per 50 ms poll for 500 ms; never the fast polls (no rows were ever found).
        assert!((4..=12).contains(&polls), "{polls} polls in 500 ms");
    }

    /// The idle poll's check reads where the next claim would: from the cursor once it is
    /// set, from the head before; and when the next claim is the one from the head, no check
    /// (the claim goes ahead). Fails with the check from the head whatever the cursor says
    /// (MariaDB fell behind a steady load while a snapshot was held).
    #[test]
    fn the_idle_check_reads_where_the_claims_do() {
        let script = Arc::new(Script {
            any_ready: true,
            ..Script::default()
        });
        let ctx = ctx(&script, Form::Lease, options(4));
        let checks = || -> Vec<String> { std::mem::take(&mut *script.log.lock()) };
        let only = |log: Vec<String>| -> Vec<String> {
            log.into_iter()
                .filter(|s| s.starts_with("any_ready"))
                .collect()
        };
        assert!(nothing_ready(&ctx));
        assert_eq!(only(checks()), ["any_ready"]);
        let start = ctx.cursor.start();
        let key = (std::time::UNIX_EPOCH + Duration::from_secs(5), 7);
        ctx.cursor.advance(start, 1, [key].into_iter());
        assert!(nothing_ready(&ctx));
        assert_eq!(only(checks()), ["any_ready_from"]);
        ctx.cursor.rewind();
        assert!(!nothing_ready(&ctx), "the claim from the head goes ahead");
        assert_eq!(only(checks()), Vec::<String>::new());
    }

    /// A claim from the cursor that finds nothing sends the worker's next claim to the head
    /// as soon as the head's turn comes, not after a poll interval: a row behind the cursor
    /// (an immediate retry behind a higher id) waits no longer. Fails (no `claim head` within
    /// 2 s of a 10 s poll) with the wait not capped at the head's turn.
    #[test]
    fn an_empty_claim_from_the_cursor_claims_from_the_head_next() {
        let script = Arc::new(Script {
            cursor: true,
            ..Script::default()
        });
        let mut opts = options(4);
        opts.poll_interval = Duration::from_secs(10);
        let ctx = ctx(&script, Form::Lease, opts);
        let start = ctx.cursor.start();
        let key = (std::time::UNIX_EPOCH + Duration::from_secs(5), 7);
        ctx.cursor.advance(start, 1, [key].into_iter());
        let (tx, rx) = crossbeam_channel::bounded(4);
        let (alive, _exited) = crossbeam_channel::bounded::<()>(0);
        let worker = {
            let (ctx, rx) = (ctx.clone(), rx.clone());
            std::thread::spawn(move || run(ctx, tx, rx, alive))
        };
        let claims = || -> Vec<String> {
            let log = script.log.lock();
            log.iter()
                .filter(|s| s.starts_with("claim "))
                .cloned()
                .collect()
        };
        let began = std::time::Instant::now();
        while claims().len() < 2 && began.elapsed() < Duration::from_secs(2) {
            std::thread::sleep(Duration::from_millis(5));
        }
        ctx.stop();
        worker.join().unwrap();
        let first: Vec<String> = claims().into_iter().take(2).collect();
        assert_eq!(first, ["claim from", "claim head"]);
    }

    /// A paused table's worker claims nothing, reads the registry's flag about once per poll
    /// interval (not once per claim), and claims again once the flag is cleared.
    #[test]
    fn a_paused_table_is_not_claimed_and_its_flag_is_read_once_per_poll() {
        let script = Arc::new(Script {
            rows_per_claim: 1,
            ..Script::default()
        });
        script
            .paused
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let mut opts = options(4);
        opts.poll_interval = Duration::from_millis(50);
        let ctx = ctx(&script, Form::Lease, opts);
        let (tx, rx) = crossbeam_channel::bounded(4);
        let (alive, _exited) = crossbeam_channel::bounded::<()>(0);
        let worker = {
            let (ctx, rx) = (ctx.clone(), rx.clone());
            std::thread::spawn(move || run(ctx, tx, rx, alive))
        };
        std::thread::sleep(Duration::from_millis(500));
        let reads = |s: &Script| s.log.lock().iter().filter(|q| *q == "paused").count();
        // Fails if the pause check is removed (the worker claims) ...
        assert_eq!(
            script.claims.load(std::sync::atomic::Ordering::SeqCst),
            0,
            "a paused table was claimed"
        );
        // ... or made per claim: one read per 50 ms poll for 500 ms.
        let paused_reads = reads(&script);
        assert!(
            (4..=12).contains(&paused_reads),
            "{paused_reads} reads in 500 ms"
        );
        script
            .paused
            .store(false, std::sync::atomic::Ordering::SeqCst);
        let resumed = std::time::Instant::now();
        while script.claims.load(std::sync::atomic::Ordering::SeqCst) == 0 {
            assert!(
                resumed.elapsed() < Duration::from_secs(2),
                "no claim after the flag was cleared"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        // Claiming back to back (each claim finds a row, handed back as the test drops it),
        // the flag is read once per poll, not once per claim. Counted from here: the reads
        // while the resume was waited for (long on a loaded machine) are not this stretch's.
        let read_before = reads(&script);
        let started = std::time::Instant::now();
        while started.elapsed() < Duration::from_millis(300) {
            if let Ok(d) = rx.recv_timeout(Duration::from_millis(10)) {
                drop(d);
            }
        }
        ctx.stop();
        worker.join().unwrap();
        let took = started.elapsed();
        let claims = script.claims.load(std::sync::atomic::Ordering::SeqCst);
        let running_reads = reads(&script) - read_before;
        assert!(claims >= 50, "{claims} claims in {took:?}");
        // Fails if the flag is read per claim (`cached` with a zero interval).
        let polls = (took.as_millis() / 50) as usize;
        assert!(
            running_reads <= polls + 2,
            "{running_reads} flag reads in {took:?} of {claims} claims"
        );
    }
}
