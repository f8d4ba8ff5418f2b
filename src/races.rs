//! Live tests of races and lost answers the servers cannot be made to produce on cue: the
//! runtime is paused or its statement's answer dropped at a named point (`testing`), against
//! the real databases (SQLite, and the servers at `SQLBROKER_PG_URL` / `SQLBROKER_MYSQL_URL`,
//! skipped loudly when unreachable unless `SQLBROKER_REQUIRE_SERVERS=1`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::broker::Broker;
use crate::consuming::delivery::Delivery;
use crate::dialect::DbConn;
use crate::error::BrokerError;
use crate::error::DbErrorKind;
use crate::model::schedule::{ceil, lease_token};
use crate::model::table::Table;
use crate::model::value::Value;
use crate::producing::message::Message;
use crate::runtime::testing::{self, live_url, Fault};
use crate::runtime::{renewer, Ctx};

/// A table name no other test uses.
fn unique(prefix: &str) -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}_{}_{n}", std::process::id())
}

/// Creates `t` on `broker` and drops it when the guard goes.
struct Made {
    broker: Broker,
    table: Table,
}

fn create(broker: &Broker, t: &Table) -> Made {
    broker.create_table(t).expect("create table");
    Made {
        broker: broker.clone(),
        table: t.clone(),
    }
}

impl Drop for Made {
    fn drop(&mut self) {
        if self.broker.database() == "SQLite" {
            return;
        }
        let q = self.broker.queue(&self.table).unwrap();
        let name = self.table.name();
        let quoted = (q.dialect.syntax().quote)(name);
        if let Ok(mut conn) = q.pool.get() {
            let _ = conn.batch(&format!("DROP TABLE IF EXISTS {quoted}"));
            let _ = conn.batch(&format!(
                "DELETE FROM sqlbroker_tables WHERE name = '{name}'"
            ));
        }
    }
}

/// The first column of the first row `sql` returns, as an integer.
fn int(conn: &mut dyn DbConn, sql: &str) -> i64 {
    let rows = conn.query(sql, &[]).expect(sql);
    match rows.first().and_then(|r| r.first()) {
        Some(Value::Int(n)) => *n,
        Some(Value::Text(s)) => s.parse().expect(sql),
        other => panic!("{sql}: {other:?}"),
    }
}

/// Rows in `t`, counted directly.
fn rows(broker: &Broker, t: &Table) -> i64 {
    let q = broker.queue(t).unwrap();
    let mut conn = q.pool.get().unwrap();
    let sql = format!(
        "SELECT COUNT(*) FROM {}",
        (q.dialect.syntax().quote)(t.name())
    );
    int(&mut *conn, &sql)
}

/// A subscription context of `t` with no threads (no claimer, no renewer): the test claims,
/// renews and settles by hand, each step when it says.
fn bare_ctx(broker: &Broker, t: &Table) -> Arc<Ctx> {
    let q = broker.queue(t).unwrap();
    Arc::new(Ctx::new(q, testing::options(8), None, None))
}

/// Up to `n` rows claimed on `ctx`, as handed-out deliveries (lease form).
fn claim(ctx: &Arc<Ctx>, n: usize) -> Vec<Delivery> {
    crate::consuming::form::lease::claim(ctx, n, None)
        .expect("claim")
        .into_iter()
        .map(|c| Delivery::new(ctx.clone(), c).hand_out())
        .collect()
}

/// Waits (at most 10 s) until `cond` holds for the time now.
fn wait_until(what: &str, cond: impl Fn(SystemTime) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond(SystemTime::now()) {
        assert!(Instant::now() < deadline, "waited 10 s for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn millis_into_second(t: SystemTime) -> u32 {
    t.duration_since(UNIX_EPOCH).unwrap().subsec_millis()
}

fn is_lost_connection(r: &crate::error::Result<()>) -> bool {
    matches!(
        r,
        Err(BrokerError::Database {
            kind: DbErrorKind::ConnectionLost,
            ..
        })
    )
}

// ---------------------------------------------------------------------------------------------
// Defect 3: a renewal whose answer was lost must not let its delivery settle another's lease.

/// A delivery's lease expires; its renewer, late, tries a renewal whose answer is lost (it did
/// not commit); in the same second another broker claims the expired row, writing the token
/// that renewal would have written. The stale delivery must not renew or ack the other's
/// lease. Before the fix it kept the renewal's token as one its row might hold: the assertion
/// "the stale holder's renewal matched the other claim's lease" failed (and, that skipped, its
/// ack deleted the other's row and returned `Ok`).
fn a_late_lost_renewal_never_matches_another_claim(db: &str) {
    let Some(url) = live_url(db) else { return };
    let broker = Broker::connect(&url).unwrap();
    // Another process's broker: a pool and a lease book of its own.
    let other = Broker::connect(&url).unwrap();
    let t = Table::new(unique("races_late")).lease(Duration::from_secs(1));
    let _made = create(&broker, &t);
    let ctx = bare_ctx(&broker, &t);
    let theirs_ctx = bare_ctx(&other, &t);
    for _ in 0..5 {
        broker.publish(&t, Message::new(b"x".to_vec())).unwrap();
        let stale = claim(&ctx, 1).pop().expect("the row");
        let held = stale.lease_deadline().unwrap();
        // Past the held token, early in a second: the renewal and the claim share it.
        wait_until("the lease to expire", |now| {
            now >= held && millis_into_second(now) < 300
        });
        let before = SystemTime::now();
        testing::arm("lease.renew", t.name(), Fault::Fail);
        assert!(!renewer::round(&ctx), "{db}: a failed renewal succeeded");
        let theirs = claim(&theirs_ctx, 1).pop();
        let after = SystemTime::now();
        let theirs = theirs.expect("precondition: the expired row was not claimable");
        if ceil(before) != ceil(after) {
            // A second ended in between: the tokens differ. Once more.
            theirs.ack().unwrap();
            drop(stale);
            continue;
        }
        // The other claim holds the very token the lost renewal would have written.
        let token = lease_token(before, 1);
        assert_eq!(theirs.lease_deadline(), Some(token), "{db}: precondition");
        assert!(
            !renewer::round(&ctx),
            "{db}: the stale holder's renewal matched the other claim's lease"
        );
        let acked = stale.ack();
        assert!(
            matches!(acked, Err(BrokerError::LeaseLost { .. })),
            "{db}: the stale holder's ack matched the other claim's lease: {acked:?}"
        );
        // The other holder's row is there, with its lease: its own ack matches it.
        assert_eq!(rows(&broker, &t), 1, "{db}");
        assert_eq!(theirs.lease_deadline(), Some(token), "{db}");
        theirs.ack().unwrap();
        assert_eq!(rows(&broker, &t), 0, "{db}");
        return;
    }
    panic!("{db}: precondition: the renewal and the claim never fell in one second");
}

#[cfg(feature = "sqlite")]
#[test]
fn a_late_lost_renewal_never_matches_another_claim_sqlite() {
    a_late_lost_renewal_never_matches_another_claim("sqlite");
}

#[cfg(feature = "postgres")]
#[test]
fn a_late_lost_renewal_never_matches_another_claim_postgres() {
    a_late_lost_renewal_never_matches_another_claim("postgres");
}

#[cfg(feature = "mysql")]
#[test]
fn a_late_lost_renewal_never_matches_another_claim_mysql() {
    a_late_lost_renewal_never_matches_another_claim("mysql");
}

// ---------------------------------------------------------------------------------------------
// Untested promise: a renewal whose answer was lost, in time.

// ---------------------------------------------------------------------------------------------
// Finding F2 of the model (model/README.md): a late renewal brought an ended lease back.

/// A delivery's lease ends before its renewer runs (no claim has taken the row yet). The late
/// renewal must not bring it back: a claim elsewhere may already have counted the row free (a
/// concurrency limit's rows in work, a FIFO group's head). So the row stays claimable, and
/// another broker takes it; nor does an extension by hand revive it. Before the fix the
/// renewal matched the token the row still held: the assertion "a late renewal brought an
/// ended lease back" failed.
fn a_late_renewal_does_not_revive_an_ended_lease(db: &str) {
    let Some(url) = live_url(db) else { return };
    let broker = Broker::connect(&url).unwrap();
    let other = Broker::connect(&url).unwrap();
    let t = Table::new(unique("races_revive")).lease(Duration::from_secs(1));
    let _made = create(&broker, &t);
    let ctx = bare_ctx(&broker, &t);
    broker.publish(&t, Message::new(b"x".to_vec())).unwrap();
    let d = claim(&ctx, 1).pop().expect("the row");
    let held = d.lease_deadline().unwrap();
    wait_until("the lease to end", |now| {
        now >= held + Duration::from_millis(20)
    });
    assert!(!renewer::round(&ctx), "{db}: an ended lease was renewed");
    assert!(
        d.extend(Duration::from_secs(30)).is_err(),
        "{db}: an ended lease was extended"
    );
    let theirs = bare_ctx(&other, &t);
    let again = claim(&theirs, 1);
    assert_eq!(
        again.len(),
        1,
        "{db}: a late renewal brought an ended lease back"
    );
    for d in again {
        d.ack().unwrap();
    }
}

#[test]
fn a_late_renewal_does_not_revive_an_ended_lease_sqlite() {
    a_late_renewal_does_not_revive_an_ended_lease("sqlite");
}

#[test]
fn a_late_renewal_does_not_revive_an_ended_lease_postgres() {
    a_late_renewal_does_not_revive_an_ended_lease("postgres");
}

#[test]
fn a_late_renewal_does_not_revive_an_ended_lease_mysql() {
    a_late_renewal_does_not_revive_an_ended_lease("mysql");
}

// ---------------------------------------------------------------------------------------------
// Finding F1 of the model (model/README.md): a hand-back whose answer was lost, run again.

/// A row claimed ahead is handed back (its lease cleared, its attempt given back); the
/// hand-back commits but its answer is lost. In the same second another broker claims the row,
/// writing the same token (`ceil(now) + lease`). The first broker must not run the hand-back
/// again: fenced by that token, it would match the other claim and clear its lease while its
/// handler runs. Before the fix it did (a statement that leaves the row claimable was run
/// again after a lost connection, like one that finishes it): the assertion "the other
/// claim's ack lost its lease to a hand-back run again" failed.
fn a_lost_hand_back_is_not_run_again(db: &str) {
    let Some(url) = live_url(db) else { return };
    let broker = Broker::connect(&url).unwrap();
    let other = Broker::connect(&url).unwrap();
    let t = Table::new(unique("races_rerun")).lease(Duration::from_secs(30));
    let _made = create(&broker, &t);
    let ctx = bare_ctx(&broker, &t);
    let theirs = bare_ctx(&other, &t);
    // A loaded machine may take the two claims across a second's end: then once more.
    for _ in 0..5 {
        broker.publish(&t, Message::new(b"x".to_vec())).unwrap();
        // Early in a second: the claims below share it, so their tokens are equal.
        wait_until("the start of a second", |now| millis_into_second(now) < 100);
        let second = ceil(SystemTime::now());
        let claimed = crate::consuming::form::lease::claim(&ctx, 1, None)
            .expect("claim")
            .pop()
            .expect("the row");
        testing::arm("lease.fenced", t.name(), Fault::LoseAnswer);
        let rerun = testing::pause_at("lease.rerun", t.name());
        // Dropped unhanded: the delivery hands its row back.
        let handing = std::thread::spawn({
            let ctx = ctx.clone();
            move || drop(Delivery::new(ctx, claimed))
        });
        // The hand-back has committed; it is paused before a second run, or done.
        let deadline = Instant::now() + Duration::from_secs(10);
        while rerun.reached.try_recv().is_err() && !handing.is_finished() {
            assert!(Instant::now() < deadline, "{db}: the hand-back never ended");
            std::thread::sleep(Duration::from_millis(1));
        }
        let d = claim(&theirs, 1).pop().expect("the row handed back");
        let same_second = ceil(SystemTime::now()) == second;
        drop(rerun.resume);
        handing.join().unwrap();
        let acked = d.ack();
        if !same_second {
            // The tokens differ: nothing to tell. Once more, on an empty table.
            drop(acked);
            let q = broker.queue(&t).unwrap();
            let sql = format!("DELETE FROM {}", (q.dialect.syntax().quote)(t.name()));
            q.pool.get().unwrap().batch(&sql).unwrap();
            continue;
        }
        assert!(
            acked.is_ok(),
            "{db}: the other claim's ack lost its lease to a hand-back run again: {acked:?}"
        );
        assert_eq!(rows(&broker, &t), 0, "{db}");
        return;
    }
    panic!("{db}: precondition: the two claims never fell in one second");
}

#[test]
fn a_lost_hand_back_is_not_run_again_sqlite() {
    a_lost_hand_back_is_not_run_again("sqlite");
}

#[test]
fn a_lost_hand_back_is_not_run_again_postgres() {
    a_lost_hand_back_is_not_run_again("postgres");
}

#[test]
fn a_lost_hand_back_is_not_run_again_mysql() {
    a_lost_hand_back_is_not_run_again("mysql");
}

/// A renewal whose answer is lost after it committed, in the lease's first second: the
/// delivery does not know its new token, but keeps it as one its row may hold. Once the old
/// token has passed, another broker finds nothing to claim (the row holds the renewal's
/// token), and the delivery's ack matches it. Break it by trying only the held token at
/// settlement: the assertion "the ack lost a lease its renewal had taken" fails.
fn a_lost_renewal_that_committed_keeps_the_lease(db: &str) {
    let Some(url) = live_url(db) else { return };
    let broker = Broker::connect(&url).unwrap();
    let other = Broker::connect(&url).unwrap();
    let t = Table::new(unique("races_kept")).lease(Duration::from_secs(2));
    let _made = create(&broker, &t);
    let ctx = bare_ctx(&broker, &t);
    broker.publish(&t, Message::new(b"x".to_vec())).unwrap();
    let d = claim(&ctx, 1).pop().expect("the row");
    let held = d.lease_deadline().unwrap();
    // In the second after the claim's: the renewal writes a token one second later.
    let start = held - Duration::from_secs(2);
    wait_until("the second after the claim", |now| {
        now >= start + Duration::from_millis(20)
    });
    let before = SystemTime::now();
    testing::arm("lease.renew", t.name(), Fault::LoseAnswer);
    assert!(!renewer::round(&ctx), "{db}: a lost answer was a success");
    assert!(
        ceil(before) < held && ceil(SystemTime::now()) == ceil(before),
        "{db}: precondition: the renewal ran late"
    );
    // The delivery knows only its old token.
    assert_eq!(
        d.lease_deadline(),
        Some(held),
        "{db}: the lost answer was read"
    );
    wait_until("the old token to pass", |now| {
        now >= held + Duration::from_millis(20)
    });
    let theirs = bare_ctx(&other, &t);
    assert!(
        claim(&theirs, 1).is_empty(),
        "{db}: the row was claimable: the renewal did not commit"
    );
    let acked = d.ack();
    assert!(
        acked.is_ok(),
        "{db}: the ack lost a lease its renewal had taken: {acked:?}"
    );
    assert_eq!(rows(&broker, &t), 0, "{db}");
}

/// A renewal whose answer is lost before it ran: the row holds the old token. The next round
/// renews the lease (fenced by both tokens), and the ack matches. Break it by taking the lost
/// renewal for a success: the assertion "a renewal that did not run moved the delivery's
/// token" fails.
fn a_lost_renewal_that_did_not_run_keeps_the_lease(db: &str) {
    let Some(url) = live_url(db) else { return };
    let broker = Broker::connect(&url).unwrap();
    let t = Table::new(unique("races_lost")).lease(Duration::from_secs(30));
    let _made = create(&broker, &t);
    let ctx = bare_ctx(&broker, &t);
    broker.publish(&t, Message::new(b"x".to_vec())).unwrap();
    let d = claim(&ctx, 1).pop().expect("the row");
    let held = d.lease_deadline().unwrap();
    // In a later second than the claim's: a renewal writes a later token.
    let start = held - Duration::from_secs(30);
    wait_until("the second after the claim", |now| {
        now >= start + Duration::from_millis(20)
    });
    testing::arm("lease.renew", t.name(), Fault::Fail);
    assert!(!renewer::round(&ctx), "{db}: a failed renewal succeeded");
    assert_eq!(
        d.lease_deadline(),
        Some(held),
        "{db}: a renewal that did not run moved the delivery's token"
    );
    assert!(renewer::round(&ctx), "{db}: the next round did not renew");
    assert!(d.lease_deadline().unwrap() > held, "{db}");
    d.ack().unwrap();
    assert_eq!(rows(&broker, &t), 0, "{db}");
}

#[cfg(feature = "sqlite")]
#[test]
fn lost_renewal_committed_sqlite() {
    a_lost_renewal_that_committed_keeps_the_lease("sqlite");
}

#[cfg(feature = "postgres")]
#[test]
fn lost_renewal_committed_postgres() {
    a_lost_renewal_that_committed_keeps_the_lease("postgres");
}

#[cfg(feature = "mysql")]
#[test]
fn lost_renewal_committed_mysql() {
    a_lost_renewal_that_committed_keeps_the_lease("mysql");
}

#[cfg(feature = "sqlite")]
#[test]
fn lost_renewal_not_run_sqlite() {
    a_lost_renewal_that_did_not_run_keeps_the_lease("sqlite");
}

#[cfg(feature = "postgres")]
#[test]
fn lost_renewal_not_run_postgres() {
    a_lost_renewal_that_did_not_run_keeps_the_lease("postgres");
}

#[cfg(feature = "mysql")]
#[test]
fn lost_renewal_not_run_mysql() {
    a_lost_renewal_that_did_not_run_keeps_the_lease("mysql");
}

// ---------------------------------------------------------------------------------------------
// Defect 4: `ack_all` after its statement's answer was lost.

/// The grouped ack of a batch commits and its answer is lost: each delivery's result must say
/// what a single `ack` says then (a lost connection: it may have committed), not `LeaseLost`.
/// Before the fix the per-row fallback matched nothing and the assertion "reported LeaseLost
/// for a row its own statement deleted" failed. When the statement did not run, the rows are
/// acked one by one and each result is `Ok`.
fn ack_all_after_a_lost_answer(db: &str) {
    let Some(url) = live_url(db) else { return };
    let broker = Broker::connect(&url).unwrap();
    let t = Table::new(unique("races_ackall")).lease(Duration::from_secs(30));
    let _made = create(&broker, &t);
    let ctx = bare_ctx(&broker, &t);
    let batch = |n: usize| {
        for i in 0..n {
            broker.publish(&t, Message::new(vec![i as u8])).unwrap();
        }
        let ds = claim(&ctx, n);
        assert_eq!(ds.len(), n, "{db}: precondition");
        ds
    };

    testing::arm("lease.ack_many", t.name(), Fault::LoseAnswer);
    for r in Delivery::ack_all(batch(3)) {
        assert!(
            is_lost_connection(&r),
            "{db}: reported {r:?} for a row its own statement deleted"
        );
    }
    assert_eq!(rows(&broker, &t), 0, "{db}: the statement committed");

    testing::arm("lease.ack_many", t.name(), Fault::Fail);
    for r in Delivery::ack_all(batch(3)) {
        assert!(r.is_ok(), "{db}: {r:?}");
    }
    assert_eq!(rows(&broker, &t), 0, "{db}: acked alone");

    // The single ack says the same (the answer `ack_all` follows).
    testing::arm("lease.ack_many", t.name(), Fault::LoseAnswer);
    let r = batch(1).pop().unwrap().ack();
    assert!(is_lost_connection(&r), "{db}: {r:?}");
    assert_eq!(rows(&broker, &t), 0, "{db}");
}

#[cfg(feature = "sqlite")]
#[test]
fn ack_all_after_a_lost_answer_sqlite() {
    ack_all_after_a_lost_answer("sqlite");
}

#[cfg(feature = "postgres")]
#[test]
fn ack_all_after_a_lost_answer_postgres() {
    ack_all_after_a_lost_answer("postgres");
}

#[cfg(feature = "mysql")]
#[test]
fn ack_all_after_a_lost_answer_mysql() {
    ack_all_after_a_lost_answer("mysql");
}

// ---------------------------------------------------------------------------------------------
// Defect 2: a handler timeout's cancel must not reach the next user of the delivery's session.

#[cfg(all(feature = "postgres", feature = "mysql"))]
/// A statement that runs for `secs` on `conn` and says whether it ran to its end (`Err`: it
/// was cancelled, or MySQL's `SLEEP` was interrupted and returned 1).
fn sleep_on(db: &str, conn: &mut dyn DbConn, secs: f64) -> Result<(), String> {
    if db == "postgres" {
        conn.batch(&format!("SELECT pg_sleep({secs})"))
            .map_err(|e| e.source.to_string())
    } else {
        match conn.query(&format!("SELECT SLEEP({secs})"), &[]) {
            Ok(rows) if rows.first().and_then(|r| r.first()) == Some(&Value::Int(0)) => Ok(()),
            Ok(rows) => Err(format!("SLEEP was interrupted: {rows:?}")),
            Err(e) => Err(e.source.to_string()),
        }
    }
}

#[cfg(all(feature = "postgres", feature = "mysql"))]
/// A sleep of `secs` inside a row lock delivery, on its session, whose id goes to `session`
/// first.
fn sleep_in_delivery(
    db: &str,
    d: &mut crate::consuming::delivery::Delivery,
    secs: f64,
    session: crossbeam_channel::Sender<u64>,
) -> crate::error::Result<()> {
    let ran = if db == "postgres" {
        crate::postgres::in_delivery(d, |c| {
            let pid: i32 = c.query_one("SELECT pg_backend_pid()", &[])?.get(0);
            let _ = session.send(pid as u64);
            c.batch_execute(&format!("SELECT pg_sleep({secs})"))
        })?
        .map_err(|e| e.to_string())
    } else {
        use mysql::prelude::Queryable;
        crate::mysql::in_delivery(d, |c| {
            let id: u64 = c.query_first("SELECT CONNECTION_ID()")?.unwrap_or(0);
            let _ = session.send(id);
            c.query_drop(format!("SELECT SLEEP({secs})"))
        })?
        .map_err(|e| e.to_string())
    };
    ran.expect("the handler's statements");
    Ok(())
}

#[cfg(all(feature = "postgres", feature = "mysql"))]
/// The session that runs `sql` right now (PostgreSQL and MySQL/MariaDB), counted.
fn running(db: &str, conn: &mut dyn DbConn, session: u64, like: &str) -> bool {
    let sql = if db == "postgres" {
        format!(
            "SELECT COUNT(*) FROM pg_stat_activity WHERE pid = {session} AND state = 'active' \
             AND query LIKE '{like}%'"
        )
    } else {
        format!(
            "SELECT COUNT(*) FROM information_schema.processlist WHERE ID = {session} \
             AND INFO LIKE '{like}%'"
        )
    };
    int(conn, &sql) == 1
}

#[cfg(all(feature = "postgres", feature = "mysql"))]
/// The handler timeout decides to cancel the statement its handler runs, and is held (the
/// pause) before it sends the cancel. Meanwhile the handler's statement ends, the delivery
/// settles, and its session goes back to the pool, where another user runs a long statement
/// on it. Then the timeout goes on: it must not cancel that statement. Before the fix it sent
/// `pg_cancel_backend` / `KILL QUERY` to the session id it had read, and the assertion
/// "another user's statement on the delivery's old session was cancelled" failed.
fn cancel_stays_with_its_delivery(db: &str) {
    let Some(url) = live_url(db) else { return };
    let broker = Broker::builder(&url).pool_size(4).build().unwrap();
    let t = Table::new(unique("races_cancel"));
    let _made = create(&broker, &t);
    let id = broker.publish(&t, Message::new(b"slow".to_vec())).unwrap();
    let paused = testing::pause_at("expiry.cancel", t.name());
    let sub = broker
        .subscription(&t)
        .handler_timeout(Duration::from_millis(300))
        .start()
        .unwrap();
    let mut d = sub.next_delivery_timeout(Duration::from_secs(10)).unwrap();
    let (session_tx, session_rx) = crossbeam_channel::bounded(1);
    let db2 = db.to_string();
    let handler = std::thread::spawn(move || {
        let ran = sleep_in_delivery(&db2, &mut d, 1.5, session_tx);
        (ran, d.ack())
    });
    let session = session_rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the handler's session");
    paused
        .reached
        .recv_timeout(Duration::from_secs(10))
        .expect("precondition: the handler timeout did not decide to cancel");
    let (ran, acked) = handler.join().unwrap();
    // The handler learns of its timeout; its settlement wrote the failure (a retry).
    assert!(
        matches!(ran, Err(BrokerError::HandlerTimeout { .. })),
        "{db}: {ran:?}"
    );
    assert!(
        matches!(acked, Err(BrokerError::HandlerTimeout { .. })),
        "{db}: {acked:?}"
    );
    sub.close();
    // Its session is back in the pool: find it there (holding the others meanwhile).
    let q = broker.queue(&t).unwrap();
    let mut others = Vec::new();
    let mut reused = None;
    while reused.is_none() {
        assert!(
            others.len() < 4,
            "{db}: session {session} is not in the pool"
        );
        let mut conn = q.pool.get().expect("a pooled connection");
        if conn.session_id() == Some(session) {
            reused = Some(conn);
        } else {
            others.push(conn);
        }
    }
    let mut reused = reused.unwrap();
    let mut watch = others.pop().unwrap_or_else(|| q.pool.get().unwrap());
    drop(others);
    let db2 = db.to_string();
    let other_user = std::thread::spawn(move || sleep_on(&db2, &mut *reused, 2.0));
    let started = Instant::now();
    let sleep = if db == "postgres" {
        "SELECT pg_sleep"
    } else {
        "SELECT SLEEP"
    };
    while !running(db, &mut *watch, session, sleep) {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{db}: precondition: the other user's statement never ran"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(watch);
    // The timeout goes on now, its cancel decided 1.2 s ago.
    paused.resume.send(()).unwrap();
    let other = other_user.join().unwrap();
    assert_eq!(
        other,
        Ok(()),
        "{db}: another user's statement on the delivery's old session was cancelled"
    );
    // The timeout's failure was written once: the row is back for attempt 2.
    let mut conn = q.pool.get().unwrap();
    let attempts = int(
        &mut *conn,
        &format!(
            "SELECT attempts FROM {} WHERE id = {id}",
            (q.dialect.syntax().quote)(t.name())
        ),
    );
    assert_eq!(attempts, 1, "{db}");
}

#[cfg(all(feature = "postgres", feature = "mysql"))]
#[test]
fn cancel_stays_with_its_delivery_postgres() {
    cancel_stays_with_its_delivery("postgres");
}

#[cfg(all(feature = "postgres", feature = "mysql"))]
#[test]
fn cancel_stays_with_its_delivery_mysql() {
    cancel_stays_with_its_delivery("mysql");
}

/// Moves row `id` of `t` to due a minute ago, directly.
fn due_a_minute_ago(broker: &Broker, t: &Table, id: i64) {
    let q = broker.queue(t).unwrap();
    let syntax = q.dialect.syntax();
    let sql = format!(
        "UPDATE {} SET run_at = {} WHERE id = {}",
        (syntax.quote)(t.name()),
        (syntax.param)(1),
        (syntax.param)(2)
    );
    let ago = Value::Time(SystemTime::now() - Duration::from_secs(60));
    let mut conn = q.pool.get().unwrap();
    assert_eq!(conn.execute(&sql, &[ago, Value::Int(id)]).unwrap(), 1);
}

// ---------------------------------------------------------------------------------------------
// Issue 18: lease claims read on from a cursor (PostgreSQL), so a long backlog's dead index
// entries behind it are not walked by every claim.

/// Whole claims move the cursor to the last row claimed and the next claim reads on from there
/// (PostgreSQL, MySQL: a row that became due behind it waits for the next pass); a claim that
/// finds fewer rows than asked sends the next claim back to the head. SQLite reads from the
/// head every time (no cursor), so the row due earlier is taken next.
fn lease_claims_read_on_from_the_cursor(db: &str) {
    let Some(url) = live_url(db) else { return };
    let broker = Broker::connect(&url).unwrap();
    let t = Table::new(unique("races_cursor")).lease(Duration::from_secs(30));
    let _made = create(&broker, &t);
    let msgs: Vec<Message> = (0..5).map(|_| Message::new(b"x".to_vec())).collect();
    broker.publish_batch(&t, msgs).unwrap();
    let ctx = bare_ctx(&broker, &t);
    let ids = |n: usize| {
        let mut ds = claim(&ctx, n);
        ds.sort_by_key(Delivery::id);
        let ids: Vec<i64> = ds.iter().map(Delivery::id).collect();
        for d in ds {
            d.ack().unwrap();
        }
        ids
    };
    let first = ids(2);
    assert_eq!(first.len(), 2, "{db}");
    let b = first[0];
    // The servers read on from a cursor; SQLite from the head.
    let servers = db != "sqlite";
    let cursor = ctx.cursor.peek().map(|k| k.1);
    assert_eq!(
        cursor,
        servers.then_some(b + 1),
        "{db}: the cursor after a whole claim"
    );
    // Row b + 3 becomes due a minute earlier: behind the cursor in claim order.
    due_a_minute_ago(&broker, &t, b + 3);
    if servers {
        // Read on from the cursor: the rows after it, not the one now due first.
        assert_eq!(
            ids(2),
            [b + 2, b + 4],
            "{db}: the claim did not read from the cursor"
        );
        // Nothing after the cursor: an empty claim, and the next one reads from the head.
        assert_eq!(ids(5), Vec::<i64>::new(), "{db}");
        wait_for_the_head(&ctx);
        assert_eq!(ids(5), [b + 3], "{db}: the row behind the cursor");
    } else {
        assert_eq!(ids(2), [b + 2, b + 3], "{db}");
        assert_eq!(ids(5), [b + 4], "{db}");
        assert_eq!(ctx.cursor.peek(), None, "{db}");
    }
}

/// Waits out the spacing a short claim from the cursor leaves before the next claim reads
/// from the head (`runtime/cursor.rs`), as a claim worker's next claim would.
fn wait_for_the_head(ctx: &Ctx) {
    let wait = ctx
        .cursor
        .head_in()
        .expect("a short claim from the cursor sends the next to the head");
    assert!(wait < crate::runtime::cursor::RESCAN, "{wait:?}");
    std::thread::sleep(wait);
}

#[test]
fn lease_claims_read_on_from_the_cursor_postgres() {
    lease_claims_read_on_from_the_cursor("postgres");
}

#[test]
fn lease_claims_read_on_from_the_cursor_sqlite() {
    lease_claims_read_on_from_the_cursor("sqlite");
}

#[test]
fn lease_claims_read_on_from_the_cursor_mysql() {
    lease_claims_read_on_from_the_cursor("mysql");
}

/// Issue 28: the row lock and advisory claims read on from the cursor too (PostgreSQL and
/// MySQL; MySQL's advisory form since issue 41), past the dead entries of rows acked since (which a snapshot held
/// elsewhere keeps from being pruned or purged). A row made due behind the cursor waits for the
/// pass that ends when a claim finds nothing; the others read from the head, so it is taken
/// next. Fails with the claim reading from the head (`did not read from the cursor`).
fn claims_read_on_from_the_cursor(db: &str, form: crate::model::table::Form) {
    use crate::model::table::Form;
    let Some(url) = live_url(db) else { return };
    let broker = Broker::connect(&url).unwrap();
    let name = unique("races_rlcursor");
    let t = match form {
        Form::AdvisoryLock => Table::new(&name)
            .text_column("k")
            .advisory_lock(format!("{name}-{{k}}")),
        _ => Table::new(&name).text_column("k"),
    };
    let _made = create(&broker, &t);
    let msgs: Vec<Message> = (0..5)
        .map(|i| Message::new(b"x".to_vec()).set("k", format!("k{i}")))
        .collect();
    broker.publish_batch(&t, msgs).unwrap();
    let ctx = bare_ctx(&broker, &t);
    let next = || -> Option<i64> {
        let claimed = match form {
            Form::AdvisoryLock => crate::consuming::form::advisory::claim(&ctx, 1, None),
            _ => crate::consuming::form::row_lock::claim(&ctx, None),
        };
        let d = claimed
            .expect("claim")
            .pop()
            .map(|c| Delivery::new(ctx.clone(), c).hand_out())?;
        let id = d.id();
        d.ack().unwrap();
        Some(id)
    };
    let b = next().expect("the first row");
    // The servers' claims read on from a cursor in both forms (MySQL's advisory claims since
    // issue 41); SQLite's read from the head.
    let pg = db == "postgres" || db == "mysql";
    assert_eq!(
        ctx.cursor.peek().map(|k| k.1),
        pg.then_some(b),
        "{db} {form:?}: the cursor after a claim"
    );
    // Row b + 2 becomes due a minute earlier: behind the cursor in claim order.
    due_a_minute_ago(&broker, &t, b + 2);
    let mut order: Vec<Option<i64>> = (0..4).map(|_| next()).collect();
    if pg {
        wait_for_the_head(&ctx);
    }
    order.push(next());
    let expected = match pg {
        // From the cursor, then an empty claim (the pass's end), then the row behind it.
        true => [Some(b + 1), Some(b + 3), Some(b + 4), None, Some(b + 2)],
        false => [Some(b + 2), Some(b + 1), Some(b + 3), Some(b + 4), None],
    };
    assert_eq!(
        order, expected,
        "{db} {form:?}: the claim did not read from the cursor"
    );
}

#[test]
fn row_lock_and_advisory_claims_read_on_from_the_cursor_postgres() {
    use crate::model::table::Form;
    for form in [Form::RowLock, Form::AdvisoryLock] {
        claims_read_on_from_the_cursor("postgres", form);
    }
}

#[test]
fn row_lock_and_advisory_claims_read_on_from_the_cursor_mysql() {
    use crate::model::table::Form;
    for form in [Form::RowLock, Form::AdvisoryLock] {
        claims_read_on_from_the_cursor("mysql", form);
    }
}

#[test]
fn advisory_claims_read_on_from_the_cursor_sqlite() {
    claims_read_on_from_the_cursor("sqlite", crate::model::table::Form::AdvisoryLock);
}

/// Waits (at most 5 s) until a session of the server waits on a row lock: the second
/// settlement queued behind the first's count. SQLite, whose second writer waits in its busy
/// handler where nothing shows it, waits 300 ms. Either way the test's assertions hold; only
/// how surely the second settlement is queued first depends on it.
fn wait_for_a_lock_wait(broker: &Broker, t: &Table) {
    let probe = match broker.database() {
        "PostgreSQL" => {
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND \
             datname = current_database()"
        }
        "SQLite" => {
            std::thread::sleep(Duration::from_millis(300));
            return;
        }
        _ => "SELECT count(*) FROM information_schema.innodb_trx WHERE trx_state = 'LOCK WAIT'",
    };
    let q = broker.queue(t).unwrap();
    let mut conn = q.pool.get().unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline && int(&mut *conn, probe) == 0 {
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The last two jobs of a callback settled at once: the first pauses after counting the
/// callback down (2 to 1, its count locked), and the second settles meanwhile. The second
/// must wait for the first's commit (the count's row lock) and then take it to 0: the callback
/// is released exactly once. Fails (`never released`) on the servers with the count read
/// before the count-down (outside its lock: both then see 2 and leave 1).
fn the_last_two_settlements_of_a_callback_release_it(db: &str, form: crate::model::table::Form) {
    use crate::model::table::Form;
    let Some(url) = live_url(db) else { return };
    let broker = Broker::connect(&url).unwrap();
    let name = unique("races_deps");
    let t = Table::new(&name).text_column("u").dependencies();
    let t = match form {
        Form::Lease => t.lease(Duration::from_secs(30)),
        Form::AdvisoryLock => t.advisory_lock(format!("{name}-{{u}}")),
        _ => t,
    };
    let _made = create(&broker, &t);
    let msg = |u: &str| Message::new(u.as_bytes().to_vec()).set("u", u);
    let a = broker.publish(&t, msg("a")).unwrap();
    let b = broker.publish(&t, msg("b")).unwrap();
    let cb = broker
        .publish(&t, msg("cb").after_settled(a).after_settled(b))
        .unwrap();
    let sub = broker.subscription(&t).max_in_flight(2).start().unwrap();
    let first = sub.next_delivery_timeout(Duration::from_secs(10)).unwrap();
    let second = sub.next_delivery_timeout(Duration::from_secs(10)).unwrap();
    let paused = testing::pause_at("deps.counted", t.name());
    let one = std::thread::spawn(move || first.ack());
    paused
        .reached
        .recv_timeout(Duration::from_secs(10))
        .expect("precondition: the first settlement did not count");
    let two = std::thread::spawn(move || second.ack());
    wait_for_a_lock_wait(&broker, &t);
    let _ = paused.resume.send(());
    one.join().unwrap().unwrap();
    two.join().unwrap().unwrap();
    let d = sub
        .next_delivery_timeout(Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("{db}: the callback was never released: {e}"));
    assert_eq!(d.id(), cb, "{db}");
    d.ack().unwrap();
    assert!(
        sub.next_delivery_timeout(Duration::from_millis(300))
            .is_err(),
        "{db}: released twice"
    );
    sub.close();
    let q = broker.queue(&t).unwrap();
    if let Ok(mut conn) = q.pool.get() {
        let _ = conn.batch(&format!(
            "DELETE FROM sqlbroker_deps WHERE parent_table = '{name}' OR child_table = '{name}'"
        ));
    }
}

#[test]
fn the_last_two_settlements_of_a_callback_sqlite() {
    use crate::model::table::Form;
    for form in [Form::Lease, Form::AdvisoryLock] {
        the_last_two_settlements_of_a_callback_release_it("sqlite", form);
    }
}

#[test]
fn the_last_two_settlements_of_a_callback_postgres() {
    use crate::model::table::Form;
    for form in [Form::Lease, Form::AdvisoryLock, Form::RowLock] {
        the_last_two_settlements_of_a_callback_release_it("postgres", form);
    }
}

#[test]
fn the_last_two_settlements_of_a_callback_mysql() {
    use crate::model::table::Form;
    for form in [Form::Lease, Form::AdvisoryLock, Form::RowLock] {
        the_last_two_settlements_of_a_callback_release_it("mysql", form);
    }
}

/// A row lock checkpoint commits the delivery's transaction and locks the row again in a
/// chained one. Paused in between, a claim of another broker must find nothing: the row's due
/// time moved ahead with the commit, and (PostgreSQL behind a transaction pooler, a concurrency
/// limit of 1) the slot key is held by the session across the commit, so the table's other row
/// waits too. Fails with the due time left as it was (the paused row is claimed) or without
/// the session's hold (the other row is claimed over the limit).
fn a_row_lock_checkpoint_keeps_its_row_and_slot(db: &str, url: &str, limited: bool) {
    let connect = || {
        Broker::builder(url)
            .cross_process_wake(false)
            .build()
            .unwrap()
    };
    let broker = connect();
    let name = unique("races_ckpt");
    let mut t = Table::new(&name).checkpoints();
    if limited {
        t = t.concurrency_limit("", 1);
    }
    let _made = create(&broker, &t);
    let first = broker.publish(&t, Message::new(b"a".to_vec())).unwrap();
    let sub = broker.subscription(&t).start().unwrap();
    let d = sub.next_delivery_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(d.id(), first, "{db}");
    if limited {
        broker.publish(&t, Message::new(b"b".to_vec())).unwrap();
    }
    let paused = testing::pause_at("checkpoint.committed", t.name());
    let saving = std::thread::spawn(move || {
        let saved = d.checkpoint(b"half way");
        (saved, d)
    });
    paused
        .reached
        .recv_timeout(Duration::from_secs(10))
        .expect("precondition: the checkpoint did not commit");
    let other = connect();
    let rival = other.subscription(&t).start().unwrap();
    let taken = rival.next_delivery_timeout(Duration::from_millis(1500));
    assert!(
        taken.is_err(),
        "{db}: a claim took row {:?} between the checkpoint's commit and its lock",
        taken.map(|d| d.id())
    );
    let _ = paused.resume.send(());
    let (saved, d) = saving.join().unwrap();
    saved.unwrap();
    assert_eq!(d.last_checkpoint().as_deref(), Some(&b"half way"[..]));
    d.ack().unwrap();
    rival.close();
    sub.close();
    if !limited {
        assert_eq!(rows(&broker, &t), 0, "{db}");
    }
}

#[test]
fn a_row_lock_checkpoint_keeps_its_row_postgres() {
    let Some(url) = live_url("postgres") else {
        return;
    };
    a_row_lock_checkpoint_keeps_its_row_and_slot("postgres", &url, false);
    let pooled = format!(
        "{url}{}pool_mode=transaction",
        if url.contains('?') { '&' } else { '?' }
    );
    a_row_lock_checkpoint_keeps_its_row_and_slot("postgres pooled", &pooled, true);
}

#[test]
fn a_row_lock_checkpoint_keeps_its_row_mysql() {
    let Some(url) = live_url("mysql") else { return };
    a_row_lock_checkpoint_keeps_its_row_and_slot("mysql", &url, false);
    a_row_lock_checkpoint_keeps_its_row_and_slot("mysql limited", &url, true);
}

/// A URL on `url`'s server whose tables are a space of their own (a PostgreSQL schema, a
/// MySQL database; a SQLite file is one already), and what drops it again: for a test that
/// sweeps `sqlbroker_deps` as if days had passed, which must not touch other tests' rows.
fn own_space(db: &str, url: &str) -> (String, Option<String>) {
    if db == "sqlite" {
        return (url.to_string(), None);
    }
    let space = unique("races_space");
    let admin = Broker::builder(url)
        .cross_process_wake(false)
        .build()
        .unwrap();
    let mut conn = admin.pooled("space", "").unwrap();
    let sep = if url.contains('?') { '&' } else { '?' };
    let (create, url, drop) = match db {
        "postgres" => (
            format!("CREATE SCHEMA {space}"),
            format!("{url}{sep}options=-c%20search_path%3D{space}"),
            format!("DROP SCHEMA {space} CASCADE"),
        ),
        _ => {
            let base = url.rsplit_once('/').map_or(url, |(b, _)| b);
            (
                format!("CREATE DATABASE {space}"),
                format!("{base}/{space}"),
                format!("DROP DATABASE {space}"),
            )
        }
    };
    conn.batch(&create).unwrap();
    (url, Some(drop))
}

/// A sweep reads a settled head nothing waits on (a cancelled job's whose row is gone, past
/// its day: the pass is told it is two days later) and pauses before deleting it; a publish
/// names the job meanwhile (its callback, released at once). The sweep must leave the head:
/// the job it names is still cancelled for the next publish, whose `after` is dead-lettered.
/// Fails (`dead-lettered`: `Ready`, the job read as gone, acked) with the sweep's delete not
/// comparing the head's `at`, which the publish moved on.
fn the_sweep_leaves_a_head_a_publish_named_meanwhile(db: &str) {
    use crate::operating::jobs::JobState;
    use crate::runtime::sweep::{pass, Cursor, How};
    let Some(url) = live_url(db) else { return };
    let (space_url, drop_space) = own_space(db, &url);
    let broker = Broker::builder(&space_url)
        .cross_process_wake(false)
        .build()
        .unwrap();
    let name = unique("races_sweep");
    let t = Table::new(&name)
        .dependencies()
        .lease(Duration::from_secs(30));
    let made = create(&broker, &t);
    let msg = || Message::new(b"x".to_vec());
    let p = broker.publish(&t, msg()).unwrap();
    assert!(broker.cancel(&t, p).unwrap());
    let q = broker.queue(&t).unwrap();
    let paused = testing::pause_at("deps.sweep", &name);
    let sweeping = {
        let (q, name) = (q.clone(), name.clone());
        std::thread::spawn(move || {
            let deps = q.sql.deps.as_ref().unwrap();
            let mut conn = q.pool.get().unwrap();
            let mut cursor = Cursor::past(&name, p - 1, "", 0);
            let later = SystemTime::now() + Duration::from_secs(2 * 86_400);
            let tables = crate::runtime::deps::Others::default();
            let how = How {
                now: later,
                orphans: false,
                stopped: &|| false,
            };
            pass(deps, &*q.dialect, &tables, &mut *conn, &mut cursor, &how)
        })
    };
    paused
        .reached
        .recv_timeout(Duration::from_secs(10))
        .expect("precondition: the sweep did not come to the cancelled job's head");
    let callback = broker.publish(&t, msg().after_settled(p)).unwrap();
    let _ = paused.resume.send(());
    sweeping.join().unwrap().unwrap();
    let after = broker.publish(&t, msg().after(p)).unwrap();
    let states: Vec<_> = [callback, after]
        .iter()
        .map(|id| broker.job(&t, *id).unwrap().map(|j| j.state()))
        .collect();
    assert_eq!(
        states,
        [Some(JobState::Ready), Some(JobState::Dead)],
        "{db}: the callback released, the job after it dead-lettered"
    );
    drop((made, q, broker));
    if let Some(sql) = drop_space {
        let admin = Broker::builder(&url)
            .cross_process_wake(false)
            .build()
            .unwrap();
        let mut conn = admin.pooled("space", "").unwrap();
        if let Err(e) = conn.batch(&sql).or_else(|_| conn.batch(&sql)) {
            eprintln!("{db}: {sql}: {e}");
        }
    }
}

#[test]
fn the_sweep_leaves_a_head_a_publish_named_meanwhile_sqlite() {
    the_sweep_leaves_a_head_a_publish_named_meanwhile("sqlite");
}

#[test]
fn the_sweep_leaves_a_head_a_publish_named_meanwhile_postgres() {
    the_sweep_leaves_a_head_a_publish_named_meanwhile("postgres");
}

#[test]
fn the_sweep_leaves_a_head_a_publish_named_meanwhile_mysql() {
    the_sweep_leaves_a_head_a_publish_named_meanwhile("mysql");
}
