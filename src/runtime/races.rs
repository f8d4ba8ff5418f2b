//! Live tests of races and lost answers the servers cannot be made to produce on cue: the
//! runtime is paused or its statement's answer dropped at a named point (`testing`), against
//! the real databases (SQLite, and the servers at `SQLBROKER_PG_URL` / `SQLBROKER_MYSQL_URL`,
//! skipped loudly when unreachable unless `SQLBROKER_REQUIRE_SERVERS=1`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::testing::{self, live_url};
use crate::dialect::DbConn;
use crate::{Broker, BrokerError, Message, Table, Value};

/// A table name no other test uses.
fn unique(prefix: &str) -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}_{}_{n}", std::process::id())
}

/// Creates `t` on `broker` and drops it when the guard goes.
struct Made {
    broker: Broker,
    name: String,
}

fn create(broker: &Broker, t: &Table) -> Made {
    broker.create_table(t).expect("create table");
    Made {
        broker: broker.clone(),
        name: t.name().to_string(),
    }
}

impl Drop for Made {
    fn drop(&mut self) {
        if self.broker.database() == "SQLite" {
            return;
        }
        let q = self.broker.queue(&Table::new(self.name.as_str())).unwrap();
        let sql = format!(
            "DROP TABLE IF EXISTS {}",
            (q.dialect.syntax().quote)(&self.name)
        );
        if let Ok(mut conn) = q.pool.get() {
            let _ = conn.batch(&sql);
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

// ---------------------------------------------------------------------------------------------
// Defect 2: a handler timeout's cancel must not reach the next user of the delivery's session.

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

/// A sleep of `secs` inside a row lock delivery, on its session, whose id goes to `session`
/// first.
fn sleep_in_delivery(
    db: &str,
    d: &mut crate::Delivery,
    secs: f64,
    session: crossbeam_channel::Sender<u64>,
) -> crate::Result<()> {
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

#[test]
fn cancel_stays_with_its_delivery_postgres() {
    cancel_stays_with_its_delivery("postgres");
}

#[test]
fn cancel_stays_with_its_delivery_mysql() {
    cancel_stays_with_its_delivery("mysql");
}
