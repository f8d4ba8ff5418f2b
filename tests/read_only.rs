//! A server session that takes no writes (issue 24 item 6): after a switchover that leaves the
//! old primary up read-only, every pooled session still reaches it and each write is refused
//! (PostgreSQL SQLSTATE 25006; MySQL 1290, or 1792 for a read-only session). Such a session is
//! a lost connection: the refused write is a transient error, the session is discarded, and so
//! is every session the pool opened before it, so the next write connects anew.
//!
//! The shared servers cannot be made read-only for everyone: one pooled session is, from a row
//! lock handler's own SQL (`in_delivery`: PostgreSQL `SET default_transaction_read_only = on`,
//! MySQL `SET SESSION TRANSACTION READ ONLY`), which gives the same errors as a read-only
//! server. SQLite has no server to switch over (and no row lock form): not run there. The
//! switchover itself is in `zz_pg_failover`.
#![cfg(all(feature = "postgres", feature = "mysql"))]

mod common;

use std::time::Duration;

use common::Db;
use sqlbroker::{Broker, Form};

/// The session's own id on the server, and it made read-only, from the delivery's handler.
fn make_read_only(db: Db, d: &mut sqlbroker::Delivery) -> i64 {
    match db {
        Db::Postgres => sqlbroker::postgres::in_delivery(d, |c| {
            c.batch_execute("SET default_transaction_read_only = on")?;
            c.query_one("SELECT pg_backend_pid()", &[])
                .map(|r| i64::from(r.get::<_, i32>(0)))
        })
        .unwrap()
        .unwrap(),
        Db::Mysql => {
            use mysql::prelude::Queryable;
            sqlbroker::mysql::in_delivery(d, |c| {
                c.query_drop("SET SESSION TRANSACTION READ ONLY")?;
                c.query_first::<u64, _>("SELECT CONNECTION_ID()")
                    .map(|id| id.unwrap() as i64)
            })
            .unwrap()
            .unwrap()
        }
        Db::Sqlite => unreachable!(),
    }
}

/// The session's id, from the delivery's handler.
fn session_of(db: Db, d: &mut sqlbroker::Delivery) -> i64 {
    match db {
        Db::Postgres => sqlbroker::postgres::in_delivery(d, |c| {
            c.query_one("SELECT pg_backend_pid()", &[])
                .map(|r| i64::from(r.get::<_, i32>(0)))
        })
        .unwrap()
        .unwrap(),
        Db::Mysql => {
            use mysql::prelude::Queryable;
            sqlbroker::mysql::in_delivery(d, |c| {
                c.query_first::<u64, _>("SELECT CONNECTION_ID()")
                    .map(|id| id.unwrap() as i64)
            })
            .unwrap()
            .unwrap()
        }
        Db::Sqlite => unreachable!(),
    }
}

fn sessions_open(live: &common::Live, ids: &[i64]) -> i64 {
    let list = ids
        .iter()
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(",");
    live.int(&match live.db {
        Db::Postgres => format!("SELECT COUNT(*) FROM pg_stat_activity WHERE pid IN ({list})"),
        _ => format!("SELECT COUNT(*) FROM information_schema.processlist WHERE id IN ({list})"),
    })
}

fn a_read_only_session_is_a_lost_connection(db: Db) {
    let Some(live) = common::live(db) else { return };
    let t = live.table(Form::RowLock, Duration::from_secs(30));
    let broker = Broker::builder(&live.url).pool_size(4).build().unwrap();
    broker.publish(&t, common::msg("a", "a")).unwrap();
    broker.publish(&t, common::msg("b", "b")).unwrap();
    // Two deliveries, each on a pooled session of its own.
    let sub = broker
        .subscription(&t)
        .workers(1)
        .max_in_flight(2)
        .start()
        .unwrap();
    let mut poisoned = common::next(&sub, Duration::from_secs(10));
    let mut healthy = common::next(&sub, Duration::from_secs(10));
    // The claim workers' sessions back in the pool first.
    sub.close();
    let read_only = make_read_only(db, &mut poisoned);
    let other = session_of(db, &mut healthy);
    assert_ne!(read_only, other);
    healthy.ack().unwrap();
    // Its commit is the last write the session may make; back in the pool, it is the next one
    // handed out.
    poisoned.ack().unwrap();

    let e = broker
        .publish(&t, common::msg("c", "c"))
        .expect_err("the read-only session was not the next one used: the test proved nothing");
    assert!(
        e.is_transient() && e.to_string().contains("takes no writes"),
        "{db:?}: a write refused by a session that takes no writes is permanent: {e}"
    );
    // The next write connects anew, and succeeds.
    for i in 0..5 {
        broker
            .publish(&t, common::msg(&format!("d{i}"), "d"))
            .unwrap_or_else(|e| panic!("{db:?}: a publish after the refused write failed: {e}"));
    }
    assert!(
        common::wait_for(Duration::from_secs(5), || sessions_open(
            &live,
            &[read_only]
        ) == 0),
        "{db:?}: the read-only session {read_only} was given back to the pool"
    );
    // The other session opened before the refusal most likely reaches the same server: gone
    // too, though it refused nothing.
    assert!(
        common::wait_for(Duration::from_secs(5), || sessions_open(&live, &[other])
            == 0),
        "{db:?}: the session {other}, opened before a write was refused, is still pooled"
    );
    // Both first rows acked; the refused publish wrote nothing.
    assert_eq!(live.rows(&t), 5, "{db:?}: a publish was lost or doubled");
}

#[test]
fn postgres_a_read_only_session_is_a_lost_connection() {
    a_read_only_session_is_a_lost_connection(Db::Postgres);
}

#[test]
fn mysql_a_read_only_session_is_a_lost_connection() {
    a_read_only_session_is_a_lost_connection(Db::Mysql);
}
