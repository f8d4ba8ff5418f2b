//! Faults: the database ends the session that holds a delivery (`pg_terminate_backend`,
//! MySQL/MariaDB `KILL`). The settlement then fails with a transient error (connection lost),
//! and the database has returned the row: row lock with no attempt spent (the transaction was
//! rolled back), advisory with its key released by the session's end.
//!
//! One test running its cases one after another, in a test binary of its own, so nothing else
//! shares its moment (the sessions it looks for are the only ones of their kind). Cargo runs
//! test binaries one at a time in name order: the `zz_` prefix runs this one after the rest.

mod common;

use std::time::Duration;

use common::{next, Db, Live};
use sqlbroker::{BrokerError, DbErrorKind, Form, Message, Table};

/// The session holding the delivery of a row of `t`, found from the outside. `before`: the
/// sessions that held row locks before the claim.
fn holder(live: &Live, t: &Table, form: Form, before: &[Option<i64>]) -> i64 {
    let name = t.name();
    let sql = match (live.db, form) {
        // The row lock claim's transaction stays open: the only session idle in one whose last
        // statement named this table.
        (Db::Postgres, Form::RowLock) => format!(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() \
             AND state = 'idle in transaction' AND query LIKE '%{name}%'"
        ),
        // The session holding the row's advisory key (the 64-bit key is classid:objid).
        (Db::Postgres, _) => format!(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted \
             AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
             AND ((classid::bigint << 32) | objid::bigint) = hashtextextended('{name}-a', 0)"
        ),
        // The session that opened a locking transaction since the claim began (InnoDB shows
        // a transaction's row locks by table only while another session waits for them).
        (Db::Mysql, Form::RowLock) => MYSQL_LOCKING_SESSIONS.to_string(),
        // The session holding the row's GET_LOCK name (`<database>.<key>`).
        (Db::Mysql, _) => format!(
            "SELECT p.ID FROM information_schema.processlist p \
             WHERE p.ID = IS_USED_LOCK(CONCAT(DATABASE(), '.', '{name}-a'))"
        ),
        (Db::Sqlite, _) => unreachable!("SQLite has no sessions to kill"),
    };
    // InnoDB's information_schema tables are a cache refreshed only when it was last read more
    // than 100 ms ago: poll more slowly than that, or it never refreshes.
    let mut ids = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while ids.is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(250));
        ids = live.ints(&sql);
        ids.retain(|id| !before.contains(id));
    }
    assert_eq!(
        ids.len(),
        1,
        "expected one session holding the delivery, found {ids:?}"
    );
    ids[0].expect("a session id")
}

/// Sessions of the test database with an open InnoDB transaction holding row locks.
const MYSQL_LOCKING_SESSIONS: &str = "SELECT p.ID FROM information_schema.processlist p \
     JOIN information_schema.innodb_trx x ON x.trx_mysql_thread_id = p.ID \
     WHERE p.DB = DATABASE() AND x.trx_rows_locked > 0";

fn kill_session(live: &Live, id: i64) {
    match live.db {
        Db::Postgres => {
            assert_eq!(
                live.ints(&format!("SELECT pg_terminate_backend({id})::int")),
                [Some(1)]
            );
            let gone = common::wait_for(Duration::from_secs(10), || {
                live.int(&format!(
                    "SELECT COUNT(*) FROM pg_stat_activity WHERE pid = {id}"
                )) == 0
            });
            assert!(gone, "backend {id} did not end");
        }
        _ => {
            live.exec(&format!("KILL {id}"));
            let gone = common::wait_for(Duration::from_secs(10), || {
                live.int(&format!(
                    "SELECT COUNT(*) FROM information_schema.processlist WHERE ID = {id}"
                )) == 0
            });
            assert!(gone, "session {id} did not end");
        }
    }
}

/// A delivery whose session is killed: the settlement fails as a lost connection, and the row is
/// claimable again at once (row lock: attempt 1; advisory: attempt 2).
fn killed_session(live: &Live, form: Form) {
    let t = live.table(form, Duration::ZERO);
    live.broker
        .publish(&t, Message::new(b"fault".to_vec()).set("k", "a"))
        .unwrap();
    let before = if live.db == Db::Mysql {
        live.ints(MYSQL_LOCKING_SESSIONS)
    } else {
        Vec::new()
    };
    let sub = live.broker.subscription(&t).start().unwrap();
    let d = next(&sub, Duration::from_secs(10));
    let id = d.id();
    assert_eq!(d.attempt(), 1);
    let session = holder(live, &t, form, &before);
    kill_session(live, session);

    // Row lock: a retry, whose attempt count would be committed with it; advisory: an ack.
    let settled = if form == Form::RowLock {
        d.retry()
    } else {
        d.ack()
    };
    let e = settled.expect_err("a settlement on a killed session succeeded");
    assert!(
        e.is_transient(),
        "{:?} {}: not transient: {e:?}",
        live.db,
        form.name()
    );
    assert!(
        matches!(
            e,
            BrokerError::Database {
                kind: DbErrorKind::ConnectionLost,
                ..
            }
        ),
        "{:?} {}: expected a lost connection: {e:?}",
        live.db,
        form.name()
    );

    let d = next(&sub, Duration::from_secs(3));
    let expected = if form == Form::RowLock { 1 } else { 2 };
    assert_eq!(
        (d.id(), d.attempt()),
        (id, expected),
        "{:?} {}",
        live.db,
        form.name()
    );
    d.ack().unwrap();
    assert_eq!(live.rows(&t), 0);
    sub.shutdown(Duration::from_secs(5)).unwrap();
    eprintln!(
        "{:?} {}: killed session {session}, settlement failed with {e}, row back",
        live.db,
        form.name()
    );
}

#[test]
fn killed_sessions_return_their_rows() {
    let mut dbs = vec![Db::Postgres];
    if cfg!(feature = "mysql") {
        dbs.push(Db::Mysql);
    }
    for db in dbs {
        let Some(live) = common::live(db) else {
            continue;
        };
        for form in [Form::RowLock, Form::AdvisoryLock] {
            killed_session(&live, form);
        }
    }
}
