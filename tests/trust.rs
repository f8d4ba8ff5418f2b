//! Regressions for the defects of the trust-under-failure review (issue 6): each test names the
//! defect it pins and the assertion that failed before its fix.

mod common;

/// Tests of the cases named, each a `#[test]` `<body>::<case>`: for defects of one database or
/// form only (a case that could not fail is not listed).
macro_rules! cases {
    ($body:ident: $($case:ident($($arg:expr),*)),+ $(,)?) => {
        mod $body {
            #[allow(unused_imports)]
            use super::*;
            $(
                #[test]
                fn $case() {
                    super::$body($($arg),*)
                }
            )+
        }
    };
}

use std::time::{Duration, Instant};

use common::{msg, next, Db};
use sqlbroker::{Broker, BrokerError, Form, NextError, Table};

/// The description with `max_attempts`, created.
fn capped(live: &common::Live, form: Form, max: u32) -> Table {
    let name = common::unique("t");
    live.create(common::describe(&name, form, Duration::from_secs(30)).max_attempts(max))
}

/// Defect 1: rows a subscription claimed ahead and handed back at shutdown must not spend an
/// attempt. Before: with `max_attempts(1)` the four rows no handler saw were dead-lettered by the
/// next subscription's claim (lease and advisory), or read attempt 2 without a cap.
fn unhandled_rows_keep_their_attempt(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let t = capped(&live, form, 1);
    for i in 0..5 {
        // Distinct keys, so the advisory form may claim them all.
        live.broker.publish(&t, msg("x", &format!("k{i}"))).unwrap();
    }
    let sub = live.broker.subscription(&t).workers(1).start().unwrap();
    let first = next(&sub, Duration::from_secs(10));
    assert_eq!(first.attempt(), 1);
    first.ack().unwrap();
    sub.shutdown(Duration::from_secs(5)).unwrap();

    // Every row left is claimable now: nothing leased, nothing dead.
    if form == Form::Lease {
        assert_eq!(
            live.rows_where(&t, "locked_until IS NOT NULL"),
            0,
            "a lease was left behind"
        );
    }
    assert_eq!(
        live.rows_where(&t, "attempts <> 0"),
        0,
        "a handed-back row spent an attempt"
    );

    let sub = live.broker.subscription(&t).workers(1).start().unwrap();
    for _ in 0..4 {
        let d = next(&sub, Duration::from_secs(10));
        assert_eq!(d.attempt(), 1, "row {} came back spent", d.id());
        d.ack().unwrap();
    }
    assert!(live.broker.dead_letters(&t, 10).unwrap().is_empty());
    assert_eq!(live.rows(&t), 0);
    sub.shutdown(Duration::from_secs(5)).unwrap();
}
per_db_form!(unhandled_rows_keep_their_attempt);

/// Defects 9 and 10: a handler that panics with its delivery drops it unsettled. That counts a
/// failed attempt in every form, after a short delay, so a poison row reaches its dead letter.
/// Before: the row lock form rolled back and redelivered at once with the same attempt, for
/// ever (thousands of deliveries a second).
fn a_poison_row_reaches_its_dead_letter(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let t = capped(&live, form, 3);
    let id = live.broker.publish(&t, msg("poison", "a")).unwrap();
    let sub = std::sync::Arc::new(live.broker.subscription(&t).start().unwrap());
    let mut attempts = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline && attempts.len() < 10 {
        let Ok(d) = sub.next_delivery_timeout(Duration::from_millis(200)) else {
            if !live.broker.dead_letters(&t, 1).unwrap().is_empty() {
                break;
            }
            continue;
        };
        assert_eq!(d.id(), id);
        attempts.push(d.attempt());
        // A real panic on a handler thread, which drops the delivery as it unwinds.
        let handler = std::thread::spawn(move || {
            let _held = d;
            panic!("poison");
        });
        assert!(handler.join().is_err());
    }
    assert_eq!(attempts, [1, 2, 3], "each drop must count one attempt");
    let dead = live.broker.dead_letters(&t, 10).unwrap();
    assert_eq!(dead.len(), 1, "the poison row was not dead-lettered");
    assert!(
        dead[0].reason.contains("dropped unsettled"),
        "reason: {}",
        dead[0].reason
    );
    assert_eq!(dead[0].attempts, 3);
}
per_db_form!(a_poison_row_reaches_its_dead_letter);

/// Defect 5: `shutdown` names the deliveries it left unsettled instead of returning `Ok`, and
/// returns within its grace.
fn shutdown_reports_unsettled_deliveries(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let t = live.table(form, Duration::from_secs(30));
    live.broker.publish(&t, msg("held", "a")).unwrap();
    let sub = live.broker.subscription(&t).start().unwrap();
    let d = next(&sub, Duration::from_secs(10));
    let started = Instant::now();
    match sub.shutdown(Duration::from_millis(300)) {
        Err(BrokerError::Unsettled { unsettled, .. }) => assert_eq!(unsettled, 1),
        other => panic!("shutdown with a delivery held returned {other:?}"),
    }
    let took = started.elapsed();
    assert!(took < Duration::from_secs(3), "shutdown took {took:?}");
    d.ack().unwrap();
    assert_eq!(live.rows(&t), 0);
}
per_db_form!(shutdown_reports_unsettled_deliveries);

/// Defect 5: a row lock handler that publishes while a DDL waits for the table. The DDL waits
/// for the handler's transaction, the publish waits for the DDL: an undetected deadlock across
/// two sessions. Before: no lock timeout was set, and the publish never returned.
fn publish_behind_a_waiting_ddl_is_bounded(db: Db) {
    let Some(live) = common::live(db) else { return };
    let broker = Broker::builder(&live.url)
        .statement_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let t = live.create(common::describe(
        &common::unique("t"),
        Form::RowLock,
        Duration::ZERO,
    ));
    broker.publish(&t, msg("a", "a")).unwrap();
    let sub = broker.subscription(&t).start().unwrap();
    let d = next(&sub, Duration::from_secs(10));

    // The DDL, from a session of its own, queues behind the handler's row lock.
    let ddl = {
        let (db, url, name) = (live.db, live.url.clone(), t.name().to_string());
        std::thread::spawn(move || {
            let quote = if db == Db::Postgres { '"' } else { '`' };
            common::exec(
                db,
                &url,
                &format!("ALTER TABLE {quote}{name}{quote} ADD COLUMN extra INT"),
            );
        })
    };
    // Until the DDL waits for the handler's lock, seen from the server.
    let waiting = match db {
        Db::Postgres => format!(
            "SELECT COUNT(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
             AND query LIKE 'ALTER TABLE %{}%'",
            t.name()
        ),
        _ => format!(
            "SELECT COUNT(*) FROM information_schema.processlist WHERE STATE LIKE \
             'Waiting for table metadata lock' AND INFO LIKE 'ALTER TABLE %{}%'",
            t.name()
        ),
    };
    assert!(
        common::wait_for(Duration::from_secs(10), || live.int(&waiting) > 0),
        "the DDL never queued behind the handler's lock"
    );

    let (tx, rx) = crossbeam_channel::bounded(1);
    {
        let (broker, t) = (broker.clone(), t.clone());
        std::thread::spawn(move || {
            let _ = tx.send(broker.publish(&t, msg("b", "b")));
        });
    }
    let published = rx.recv_timeout(Duration::from_secs(15));
    // Let the DDL through whatever happened.
    d.ack().unwrap();
    ddl.join().unwrap();
    let e = published
        .expect("the publish behind the DDL never returned")
        .expect_err("the publish behind the DDL succeeded while the DDL still waited");
    assert!(e.is_transient(), "a lock timeout is transient: {e:?}");
    sub.shutdown(Duration::from_secs(5)).unwrap();
}
// SQLite: no row lock form, no DDL lock queue.
cases!(publish_behind_a_waiting_ddl_is_bounded: postgres(Db::Postgres), mysql(Db::Mysql));

#[cfg(any(feature = "postgres", feature = "mysql"))]
/// A transaction held open on a row of `t`, from a session of its own; rolled back on drop.
enum RowLocker {
    #[cfg(feature = "postgres")]
    Pg(Box<postgres::Client>),
    #[cfg(feature = "mysql")]
    My(mysql::Conn),
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
impl RowLocker {
    fn lock(live: &common::Live, t: &Table, id: i64) -> RowLocker {
        match live.db {
            #[cfg(feature = "postgres")]
            Db::Postgres => {
                let mut c = postgres::Client::connect(&live.url, postgres::NoTls).unwrap();
                c.batch_execute(&format!(
                    "BEGIN; SELECT id FROM \"{}\" WHERE id = {id} FOR UPDATE",
                    t.name()
                ))
                .unwrap();
                RowLocker::Pg(Box::new(c))
            }
            #[cfg(feature = "mysql")]
            Db::Mysql => {
                use mysql::prelude::Queryable;
                let mut c = mysql::Conn::new(mysql::Opts::from_url(&live.url).unwrap()).unwrap();
                c.query_drop("START TRANSACTION").unwrap();
                c.query_drop(format!(
                    "SELECT id FROM `{}` WHERE id = {id} FOR UPDATE",
                    t.name()
                ))
                .unwrap();
                RowLocker::My(c)
            }
            other => unreachable!("{other:?} has no row locks"),
        }
    }
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
impl Drop for RowLocker {
    fn drop(&mut self) {
        match self {
            #[cfg(feature = "postgres")]
            RowLocker::Pg(c) => {
                let _ = c.batch_execute("ROLLBACK");
            }
            #[cfg(feature = "mysql")]
            RowLocker::My(c) => {
                use mysql::prelude::Queryable;
                let _ = c.query_drop("ROLLBACK");
            }
            #[allow(unreachable_patterns)]
            _ => {}
        }
    }
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
/// Defect 7: a renewal round must not wait on a row a user's transaction has locked, nor hold
/// the other deliveries' leases meanwhile. Before: the round blocked on the locked row holding
/// every cell, so the other delivery's ack waited for the user's transaction (seconds here).
fn renewal_skips_a_locked_row(db: Db) {
    let Some(live) = common::live(db) else { return };
    let t = live.table(Form::Lease, Duration::from_secs(2));
    for k in ["a", "b"] {
        live.broker.publish(&t, msg(k, k)).unwrap();
    }
    let sub = live.broker.subscription(&t).start().unwrap();
    let a = next(&sub, Duration::from_secs(10));
    let b = next(&sub, Duration::from_secs(10));
    let locker = RowLocker::lock(&live, &t, a.id());
    // Past a renewal round (every second for a 2 s lease), with the user's lock still held.
    std::thread::sleep(Duration::from_millis(2500));
    let (tx, rx) = crossbeam_channel::bounded(1);
    let started = Instant::now();
    std::thread::spawn(move || {
        let _ = tx.send(b.ack());
    });
    let acked = rx.recv_timeout(Duration::from_secs(1));
    let took = started.elapsed();
    // Then the user's transaction ends, whatever happened (a stuck round waits for it).
    drop(locker);
    acked
        .unwrap_or_else(|_| panic!("b's ack waited {took:?} on a renewal round"))
        .expect("b's lease was not renewed beside the locked row");
    drop(a);
    sub.close();
}
// SQLite: no row locks to skip.
#[cfg(any(feature = "postgres", feature = "mysql"))]
cases!(renewal_skips_a_locked_row: postgres(Db::Postgres), mysql(Db::Mysql));

/// Defect 8: a PostgreSQL lease table whose time columns are `timestamp` (no time zone), used
/// from sessions whose `TimeZone` is not UTC. Before: the renewal bound the token as
/// `timestamptz`, missed every row, and the lease expired under its handler (`LeaseLost`).
#[test]
fn postgres_renewal_on_timestamp_columns() {
    let Some(live) = common::live(Db::Postgres) else {
        return;
    };
    let name = common::unique("t");
    live.track(&name);
    live.exec(&format!(
        "CREATE TABLE \"{name}\" (id BIGSERIAL PRIMARY KEY, payload BYTEA NOT NULL, \
         attempts INT NOT NULL DEFAULT 0, run_at TIMESTAMP NOT NULL, locked_until TIMESTAMP, \
         dead_at TIMESTAMP, dead_reason TEXT, last_error TEXT, errors INT NOT NULL DEFAULT 0, \
         cancel_requested INT NOT NULL DEFAULT 0, created_at TIMESTAMP, k TEXT)"
    ));
    let sep = if live.url.contains('?') { '&' } else { '?' };
    let url = format!("{}{sep}options=-c%20TimeZone%3DAsia%2FTokyo", live.url);
    let broker = Broker::connect(&url).unwrap();
    let t = Table::new(&name)
        .text_column("k")
        .lease(Duration::from_secs(1));
    let id = broker.publish(&t, msg("ts", "a")).unwrap();
    let sub = broker.subscription(&t).start().unwrap();
    let d = next(&sub, Duration::from_secs(10));
    assert_eq!(d.id(), id);
    // Three leases long: only renewals keep it.
    assert_eq!(
        sub.next_delivery_timeout(Duration::from_secs(3)).err(),
        Some(NextError::Timeout),
        "the row was delivered again while its handler held it"
    );
    d.ack().expect("the lease was lost though the renewer ran");
    assert_eq!(live.rows(&t), 0);
    sub.shutdown(Duration::from_secs(5)).unwrap();
}

/// Defect 4: one SQLite file reached by two spellings (a symbolic link, `..`) is one database:
/// its advisory keys are shared. Before: two registries, two live handlers for one key.
#[test]
fn sqlite_one_file_many_spellings_one_key_registry() {
    let dir = std::env::temp_dir().join(common::unique("sqlite_dir"));
    std::fs::create_dir_all(dir.join("sub")).unwrap();
    let link = std::env::temp_dir().join(common::unique("sqlite_link"));
    std::os::unix::fs::symlink(&dir, &link).unwrap();
    let file = dir.join("q.db");
    let plain = format!("sqlite:{}", file.display());
    let dotted = format!("sqlite:{}/sub/../q.db", dir.display());
    let linked = format!("sqlite:{}/q.db", link.display());

    let t = Table::new("jobs")
        .text_column("k")
        .advisory_lock("jobs-{k}");
    let a = Broker::connect(&plain).unwrap();
    a.create_table(&t).unwrap();
    a.publish(&t, msg("1", "same")).unwrap();
    a.publish(&t, msg("2", "same")).unwrap();
    let sub_a = a.subscription(&t).start().unwrap();
    let held = next(&sub_a, Duration::from_secs(10));
    for url in [&dotted, &linked] {
        let b = Broker::connect(url).unwrap();
        let sub_b = b.subscription(&t).start().unwrap();
        assert_eq!(
            sub_b
                .next_delivery_timeout(Duration::from_millis(800))
                .err(),
            Some(NextError::Timeout),
            "{url}: a second handler got key `same` while the first held it"
        );
        sub_b.close();
    }
    held.ack().unwrap();
    sub_a.close();
    let _ = std::fs::remove_file(&link);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Defect 11: a subscription whose deliveries each hold a connection must leave the pool one to
/// spare. Before: it started, and a handler that published waited out the pool's timeout.
fn pool_too_small_is_refused(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let broker = Broker::builder(&live.url).pool_size(4).build().unwrap();
    let t = live.table(form, Duration::ZERO);
    match broker.subscription(&t).workers(4).start() {
        Err(BrokerError::PoolTooSmall {
            holds, pool_size, ..
        }) => {
            assert_eq!((holds, pool_size), (4, 4))
        }
        other => panic!("a subscription holding the whole pool started: {other:?}"),
    }
    let sub = broker.subscription(&t).workers(3).start().unwrap();
    sub.close();
}
// The forms whose deliveries hold a connection: row lock, and advisory on a server.
cases!(
    pool_too_small_is_refused:
    postgres_row_lock(Db::Postgres, Form::RowLock),
    postgres_advisory(Db::Postgres, Form::AdvisoryLock),
    mysql_row_lock(Db::Mysql, Form::RowLock),
    mysql_advisory(Db::Mysql, Form::AdvisoryLock),
);

/// Defect 11: a lease delivery dropped while the pool is exhausted must not block its handler
/// thread for the pool's whole timeout. Before: the drop waited 30 s for a connection. What
/// the drop does instead is give up after a second and leave the row to its lease: the row is
/// unchanged by the drop (still leased, attempt 1, not dead), and once its lease runs out
/// (nobody renews it any more) it is delivered again, attempt 2.
///
/// Fails if the drop waited out the pool (`the drop blocked`; tried by waiting the pool's
/// timeout), if it wrote anything (`the drop changed the row`), or if the lease were still
/// renewed after the drop gave up (`not delivered again`; tried by leaving the lease with the
/// renewer when the settlement fails).
#[test]
fn a_lease_drop_does_not_wait_out_the_pool() {
    const LEASE: Duration = Duration::from_secs(3);
    let Some(live) = common::live(Db::Postgres) else {
        return;
    };
    let broker = Broker::builder(&live.url)
        .pool_size(3)
        .connection_timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let lease = live.table(Form::Lease, LEASE);
    let id = broker.publish(&lease, msg("l", "l")).unwrap();
    let lease_sub = broker.subscription(&lease).start().unwrap();
    let d = next(&lease_sub, Duration::from_secs(10));
    lease_sub.close();
    // Three row lock deliveries, on subscriptions of their own, hold the pool's three
    // connections.
    let rows = live.table(Form::RowLock, Duration::ZERO);
    let mut held = Vec::new();
    for i in 0..3 {
        broker.publish(&rows, msg(&format!("r{i}"), "r")).unwrap();
        let s = broker.subscription(&rows).max_in_flight(1).start().unwrap();
        held.push((next(&s, Duration::from_secs(10)), s));
    }
    let started = Instant::now();
    drop(d);
    let took = started.elapsed();
    assert!(took < Duration::from_secs(5), "the drop blocked {took:?}");
    assert_eq!(
        live.rows_where(
            &lease,
            &format!("id = {id} AND attempts = 1 AND locked_until IS NOT NULL AND dead_at IS NULL")
        ),
        1,
        "the drop changed the row (it could get no connection)"
    );
    for (r, s) in held {
        r.ack().unwrap();
        s.close();
    }
    // Left to its lease: back once the lease runs out, the drop's attempt counted by the claim.
    let again = live.broker.subscription(&lease).start().unwrap();
    let d = again
        .next_delivery_timeout(LEASE + Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("not delivered again after its lease: {e}"));
    assert_eq!((d.id(), d.attempt()), (id, 2));
    d.ack().unwrap();
    again.shutdown(Duration::from_secs(5)).unwrap();
}

/// Defect 11: a row whose value the library cannot read (a PostgreSQL `uuid` behind a text
/// column of the description: a type the schema check does not know, so it lets it pass) is
/// dead-lettered with the reason. Before: its claim failed every
/// round for ever, spending an attempt each time in the lease form.
fn unreadable_row_is_dead_lettered(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let name = common::unique("t");
    let t = common::describe(&name, form, Duration::from_secs(30));
    live.track(&name);
    live.broker.create_table(&t).unwrap();
    live.exec(&format!(
        "ALTER TABLE \"{name}\" ALTER COLUMN k TYPE uuid USING NULL; \
         INSERT INTO \"{name}\" (payload, run_at, k) \
         VALUES ('\\x00', now(), 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11')"
    ));
    let sub = live.broker.subscription(&t).start().unwrap();
    match sub.next_delivery_timeout(Duration::from_secs(3)) {
        Err(NextError::Timeout) => {}
        Ok(d) => panic!("an unreadable row reached a handler: {d:?}"),
        Err(e) => panic!("the subscription ended: {e}"),
    }
    let dead = live.broker.dead_letters(&t, 10).unwrap();
    assert_eq!(
        dead.len(),
        1,
        "the unreadable row was not dead-lettered: {:?}",
        sub.last_error()
    );
    assert!(
        dead[0].reason.contains("column k"),
        "reason: {}",
        dead[0].reason
    );
    sub.shutdown(Duration::from_secs(5)).unwrap();
}
// Only PostgreSQL has column types a `Value` cannot hold.
cases!(
    unreadable_row_is_dead_lettered:
    postgres_row_lock(Db::Postgres, Form::RowLock),
    postgres_lease(Db::Postgres, Form::Lease),
);
