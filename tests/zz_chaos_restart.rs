//! Chaos, server restarts: a subscription in this process (row lock, lease and advisory forms in
//! turn) is consuming a table when the database server is restarted under it (PostgreSQL: `pg_ctlcluster .. restart`; MariaDB:
//! `mysqladmin shutdown`, then `mariadbd` started again). The subscription must go on by itself
//! once the server is back, and every row must be finished:
//!
//! 1. the table is empty within a bounded wait after the restart (a subscription whose workers
//!    died, or whose pool kept dead connections, leaves rows behind);
//! 2. the subscription did not close itself, and rows were acked after the server came back
//!    (else the test proved nothing: the rows were all done before the outage);
//! 3. every published id was acked exactly once, or its ack failed during the outage with the
//!    row gone at the end (an ack whose commit happened but whose reply was lost); no id is
//!    acked twice;
//! 4. every settlement that failed failed with a transient error (or `LeaseLost` in the lease
//!    form): an outage is something to try again after;
//! 5. row lock: every delivery reads attempt 1 (the outage rolls back; nothing here retries);
//! 6. the outage was seen, from the restart command to the table's end: a claim or settlement
//!    failed, or took [`STALL`] or more (`Events` hooks; a pool waits for the server rather
//!    than fail, so a lease subscription may see the outage only as a stall); and in the row
//!    lock and advisory forms, a settlement failed (the deliveries in work held sessions the
//!    restart ended). Else the server never went away under the subscription, and 1-3 proved
//!    nothing about an outage.
//!
//! Failed settlements and claims are counted and printed. The server is always brought back up, even when
//! the test fails (a guard with `Drop`).
//!
//! A restart disturbs every other user of the server, so it runs only with
//! `SQLBROKER_REQUIRE_SERVERS=1` or `SQLBROKER_CHAOS_RESTART=1`; otherwise it says loudly that
//! it skipped.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::server::{Server, UpGuard, UP};
use common::{Db, Live};
use sqlbroker::{ClaimFailed, ClaimedRows, Events, Form, NextError, Settled};

/// Enough work (about 6 s for the two handlers) that most of it is left when the server is back.
const ROWS: usize = 600;
const LEASE: Duration = Duration::from_secs(3);
const FINISH: Duration = Duration::from_secs(90);

static SERIAL: Mutex<()> = Mutex::new(());

fn say(msg: &str) {
    // Straight to the process's stderr: the test harness captures `eprintln!`.
    let _ = writeln!(std::io::stderr(), "{msg}");
}

fn enabled() -> bool {
    ["SQLBROKER_REQUIRE_SERVERS", "SQLBROKER_CHAOS_RESTART"]
        .iter()
        .any(|v| std::env::var(v).is_ok_and(|v| v == "1"))
}

/// Sets its flag when dropped.
struct SetOnDrop<'a>(&'a AtomicBool);

impl Drop for SetOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// A claim or settlement on the database that took this long was held up by the outage (they
/// take milliseconds; a pool waits for the server to come back rather than fail at once).
const STALL: Duration = Duration::from_millis(100);

/// What the subscription's hooks report while `outage` is set (from the restart command to the
/// table's end): failed claims (and their errors), and claims and settlements that stalled.
#[derive(Default)]
struct Outage {
    on: AtomicBool,
    claims_failed: AtomicUsize,
    stalls: AtomicUsize,
    longest_ms: AtomicUsize,
    errors: Mutex<BTreeSet<String>>,
}

impl Outage {
    fn took(&self, took: Duration) {
        if self.on.load(Ordering::Relaxed) {
            let ms = took.as_millis() as usize;
            self.longest_ms.fetch_max(ms, Ordering::Relaxed);
            if took >= STALL {
                self.stalls.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

impl Events for Outage {
    fn claimed(&self, e: &ClaimedRows<'_>) {
        self.took(e.took);
    }
    fn claim_failed(&self, e: &ClaimFailed<'_>) {
        if self.on.load(Ordering::Relaxed) {
            self.claims_failed.fetch_add(1, Ordering::Relaxed);
            let mut errors = self.errors.lock().unwrap();
            if errors.len() < 8 {
                errors.insert(e.error.to_string());
            }
        }
    }
    fn acked(&self, e: &Settled<'_>) {
        self.took(e.took);
    }
    fn retried(&self, e: &Settled<'_>) {
        self.took(e.took);
    }
    fn dead_lettered(&self, e: &Settled<'_>) {
        self.took(e.took);
    }
    fn lease_lost(&self, e: &Settled<'_>) {
        self.took(e.took);
    }
}

#[derive(Default)]
struct Ledger {
    /// Successful acks per id.
    acked: BTreeMap<i64, usize>,
    /// Ids whose ack failed, with the errors.
    failed: BTreeMap<i64, Vec<String>>,
    /// Failures of the harness's checks seen by the handlers.
    bad: Vec<String>,
    deliveries: usize,
}

/// Returns the failures and the figures as a markdown table row.
fn restart_run(live: &Live, server: Server, form: Form) -> (Vec<String>, String) {
    let began = Instant::now();
    let db = live.db;
    let t = live.table(form, LEASE);
    let mut published = Vec::with_capacity(ROWS);
    for i in 0..ROWS {
        let m = common::msg(&format!("restart {i}"), &format!("k{i}"));
        published.push(live.broker.publish(&t, m).expect("publish"));
    }
    let seen = std::sync::Arc::new(Outage::default());
    let sub = live
        .broker
        .subscription(&t)
        .workers(2)
        .events(seen.clone())
        .start()
        .expect("start");
    let ledger = Mutex::new(Ledger::default());
    let (stop, back) = (AtomicBool::new(false), AtomicBool::new(false));
    // Set around the restart command: a handler holding a delivery keeps it until the command
    // has cut the sessions, so some delivery is surely in work across the restart.
    let hold = AtomicBool::new(false);
    let in_hand = AtomicUsize::new(0);
    let acked_after = AtomicUsize::new(0);
    let closed_early = AtomicBool::new(false);
    let mut failures = Vec::new();
    let mut outage = Duration::ZERO;
    let mut last_errors = BTreeSet::new();

    std::thread::scope(|s| {
        for h in 0..2u64 {
            let (sub, ledger, stop, back) = (&sub, &ledger, &stop, &back);
            let (hold, in_hand) = (&hold, &in_hand);
            let (acked_after, closed_early) = (&acked_after, &closed_early);
            s.spawn(move || {
                let mut n = h;
                while !stop.load(Ordering::Relaxed) {
                    let d = match sub.next_delivery_timeout(Duration::from_millis(100)) {
                        Ok(d) => d,
                        Err(NextError::Timeout | NextError::Empty) => continue,
                        Err(_) => {
                            closed_early.store(true, Ordering::Relaxed);
                            return;
                        }
                    };
                    let (id, attempt) = (d.id(), d.attempt());
                    {
                        let mut l = ledger.lock().unwrap();
                        l.deliveries += 1;
                        if form == Form::RowLock && attempt != 1 {
                            l.bad
                                .push(format!("row {id} delivered with attempt {attempt} (row lock: the outage must spend nothing)"));
                        }
                    }
                    in_hand.fetch_add(1, Ordering::SeqCst);
                    n += 1;
                    std::thread::sleep(Duration::from_millis(10 + n * 7 % 21));
                    // Held until the restart command returns (bounded by its wait).
                    common::wait_for(UP, || {
                        !hold.load(Ordering::SeqCst) || stop.load(Ordering::Relaxed)
                    });
                    let r = d.ack();
                    in_hand.fetch_sub(1, Ordering::SeqCst);
                    let mut l = ledger.lock().unwrap();
                    match r {
                        Ok(()) => {
                            *l.acked.entry(id).or_default() += 1;
                            if back.load(Ordering::Relaxed) {
                                acked_after.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        Err(e) => {
                            if !(e.is_transient() || (form == Form::Lease && e.is_lease_lost())) {
                                l.bad.push(format!(
                                    "row {id}: the ack failed with an error that is not \
                                     transient: {e:?}"
                                ));
                            }
                            l.failed
                                .entry(id)
                                .or_default()
                                .push(format!("attempt {attempt}: {e}"));
                        }
                    }
                }
            });
        }

        // The handlers end with the scope even if a check below panics.
        let _stop = SetOnDrop(&stop);
        // Restart once a quarter of the rows are done.
        let started = common::wait_for(Duration::from_secs(60), || {
            ledger.lock().unwrap().acked.len() >= ROWS / 4
        });
        if !started {
            failures.push(format!(
                "only {} rows acked within 60 s before the restart (last error {:?})",
                ledger.lock().unwrap().acked.len(),
                sub.last_error()
            ));
        } else {
            let guard = UpGuard(server);
            let down = Instant::now();
            say(&format!(
                "chaos restart: restarting {db:?} ({})",
                form.name()
            ));
            seen.on.store(true, Ordering::Relaxed);
            // Row lock and advisory: a delivery in work across the restart (the check on
            // settlements below needs one: without the hold, a restart between two deliveries
            // cut no delivery's session). Lease deliveries hold no session: their handlers go
            // on settling, and meet the outage.
            if form != Form::Lease {
                hold.store(true, Ordering::SeqCst);
                if !common::wait_for(Duration::from_secs(5), || {
                    in_hand.load(Ordering::SeqCst) > 0
                }) {
                    failures.push("no delivery was in work when the restart began".into());
                }
            }
            let restarted = server.restart();
            hold.store(false, Ordering::SeqCst);
            if !restarted {
                failures.push(format!("the restart command of {db:?} failed"));
            }
            // Note the subscription's view of the outage while waiting.
            let up = {
                let deadline = Instant::now() + UP;
                loop {
                    if let Some(e) = sub.last_error() {
                        last_errors.insert(e.to_string());
                    }
                    if server.up() {
                        break true;
                    }
                    if Instant::now() > deadline {
                        break false;
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            };
            outage = down.elapsed();
            drop(guard);
            back.store(true, Ordering::Relaxed);
            if !up {
                failures.push(format!("{db:?} did not come back within {UP:?}"));
            } else {
                let finished = common::wait_for(FINISH, || live.rows(&t) == 0);
                if !finished {
                    failures.push(format!(
                        "{} rows left {FINISH:?} after the server came back (subscription \
                         closed: {}, last error: {:?}, in flight: {})",
                        live.rows(&t),
                        sub.is_closed(),
                        sub.last_error(),
                        sub.in_flight()
                    ));
                }
            }
        }
    });
    seen.on.store(false, Ordering::Relaxed);
    let claims_failed = seen.claims_failed.load(Ordering::Relaxed);
    let stalls = seen.stalls.load(Ordering::Relaxed);
    let longest = seen.longest_ms.load(Ordering::Relaxed);
    if closed_early.load(Ordering::Relaxed) || sub.is_closed() {
        failures.push(format!(
            "the subscription closed itself (last error: {:?})",
            sub.last_error()
        ));
    }
    if let Err(e) = sub.shutdown(Duration::from_secs(5)) {
        failures.push(format!("shutdown failed: {e}"));
    }

    let l = ledger.into_inner().unwrap();
    failures.extend(l.bad.iter().cloned());
    let left = live.rows(&t);
    if left != 0 {
        failures.push(format!("{left} rows left in the table at the end"));
    }
    let after = acked_after.load(Ordering::Relaxed);
    if failures.is_empty() && after == 0 {
        failures
            .push("no row was acked after the server came back: the restart was not tested".into());
    }
    let mut unknown = 0;
    for id in &published {
        match (l.acked.get(id).copied().unwrap_or(0), l.failed.get(id)) {
            (1, _) => {}
            // Its ack failed and the row is gone: the commit went through, its reply did not.
            (0, Some(_)) if left == 0 => unknown += 1,
            (n, errs) => {
                failures.push(format!("row {id}: acked {n} times (failed acks: {errs:?})"))
            }
        }
    }
    let errors: usize = l.failed.values().map(Vec::len).sum();
    // Fails when the server did not go away under the subscription: no claim or settlement
    // failed or stalled from the restart command to the table's end.
    if claims_failed + errors + stalls == 0 {
        failures.push(format!(
            "the outage was not seen: no claim or settlement failed or took {STALL:?} or more \
             (longest {longest} ms)"
        ));
    }
    // Row lock and advisory: the deliveries in work at the restart held their sessions, which
    // the restart ended: their settlements fail.
    if form != Form::Lease && errors == 0 {
        failures.push(
            "no settlement failed: the restart did not cut the sessions of the deliveries in work"
                .into(),
        );
    }
    let db_name = match db {
        Db::Postgres => "PostgreSQL",
        _ => "MySQL(MariaDB)",
    };
    say(&format!(
        "chaos restart: {db_name} {}: outage {:.1} s, {ROWS} rows, {} deliveries, {after} acked \
         after the restart, {claims_failed} failed claims, {stalls} claims or settlements \
         stalled (longest {longest} ms), {errors} failed settlements ({unknown} of unknown \
         outcome, row gone), {} failures, {:.1} s",
        form.name(),
        outage.as_secs_f64(),
        l.deliveries,
        failures.len(),
        began.elapsed().as_secs_f64()
    ));
    let row = format!(
        "| {db_name} | {} | {:.1} | {ROWS} | {} | {after} | {claims_failed} | {stalls} \
         ({longest} ms) | {errors} | {unknown} | {} |\n",
        form.name(),
        outage.as_secs_f64(),
        l.deliveries,
        failures.len()
    );
    for (id, errs) in &l.failed {
        for e in errs {
            say(&format!("  failed settlement, row {id}: {e}"));
        }
    }
    for e in &last_errors {
        say(&format!("  subscription last_error during the outage: {e}"));
    }
    for e in seen.errors.lock().unwrap().iter() {
        say(&format!("  failed claim during the outage: {e}"));
    }
    (failures, row)
}

fn restart_db(db: Db) {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !enabled() {
        say(&format!(
            "\n!!!!! SKIPPED: chaos restart of {db:?}: it restarts the server under everyone \
             using it; set SQLBROKER_CHAOS_RESTART=1 (or SQLBROKER_REQUIRE_SERVERS=1) to run it \
             !!!!!\n"
        ));
        return;
    }
    let Some(live) = common::live(db) else {
        say(&format!(
            "\n!!!!! SKIPPED: chaos restart of {db:?}: the server is not reachable !!!!!\n"
        ));
        return;
    };
    let server = Server(db);
    let mut all = Vec::new();
    let mut report = String::from(
        "| database | form | outage (s) | rows | deliveries | acked after the restart | \
         failed claims | stalled claims or settlements (longest) | failed settlements | of \
         unknown outcome | failures |\n|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for form in [Form::RowLock, Form::Lease, Form::AdvisoryLock] {
        let (failures, row) = restart_run(&live, server, form);
        report.push_str(&row);
        for f in &failures {
            say(&format!("  FAIL {db:?} {}: {f}", form.name()));
        }
        all.extend(
            failures
                .into_iter()
                .map(|f| format!("{}: {f}", form.name())),
        );
        // Whatever happened, the next form (and the next test binary) gets a live server.
        assert!(server.wait_up(UP), "{db:?} is not up after the restart run");
    }
    let file = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "chaos-restart-{}.md",
        format!("{db:?}").to_lowercase()
    ));
    if let Err(e) = std::fs::write(&file, report) {
        say(&format!("warning: could not write {}: {e}", file.display()));
    }
    assert!(
        all.is_empty(),
        "{} failures on {db:?}:\n{}",
        all.len(),
        all.join("\n")
    );
}

#[test]
fn restart_postgres() {
    restart_db(Db::Postgres);
}

#[cfg(feature = "mysql")]
#[test]
fn restart_mysql() {
    restart_db(Db::Mysql);
}
