//! Publishing inside the application's own transaction: the job exists if and only if the
//! transaction commits, and a refused message (invalid, or a held dedup key) leaves the
//! transaction usable.

mod common;

use std::time::Duration;

use common::{Db, Live};
use sqlbroker::{BrokerError, Form, Message, Table};

fn msg(body: &str) -> Message {
    Message::new(body.as_bytes().to_vec()).set("k", "a")
}

/// Runs `f` on a transaction of the application's own on `live`'s database, then commits it
/// (`commit`) or drops it (a rollback).
fn in_tx(live: &Live, commit: bool, f: impl FnOnce(&mut dyn FnMut(TxOp) -> Got)) {
    match live.db {
        Db::Postgres => {
            let mut client = postgres::Client::connect(&live.url, postgres::NoTls).unwrap();
            // The application's session need not be in UTC.
            client
                .batch_execute("SET TIME ZONE 'Asia/Kolkata'")
                .unwrap();
            let mut tx = client.transaction().unwrap();
            f(&mut |op| op.run_pg(&mut tx));
            if commit {
                tx.commit().unwrap();
            }
        }
        Db::Mysql => {
            let mut conn = mysql::Conn::new(mysql::Opts::from_url(&live.url).unwrap()).unwrap();
            // The application's session need not be in UTC.
            mysql::prelude::Queryable::query_drop(&mut conn, "SET time_zone = '+05:30'").unwrap();
            let mut tx = conn.start_transaction(mysql::TxOpts::default()).unwrap();
            f(&mut |op| op.run_my(&mut tx));
            if commit {
                tx.commit().unwrap();
            }
        }
        Db::Sqlite => {
            let path = live.url.strip_prefix("sqlite:").unwrap();
            let mut conn = rusqlite::Connection::open(path).unwrap();
            conn.busy_timeout(Duration::from_secs(30)).unwrap();
            let tx = conn.transaction().unwrap();
            f(&mut |op| op.run_lite(&tx));
            if commit {
                tx.commit().unwrap();
            }
        }
    }
}

/// One call of the transactional API.
enum TxOp<'a> {
    One(&'a Table, Message),
    Batch(&'a Table, Vec<Message>),
}

type Got = Result<usize, BrokerError>;

impl TxOp<'_> {
    fn run_pg(self, tx: &mut postgres::Transaction<'_>) -> Got {
        match self {
            TxOp::One(t, m) => sqlbroker::postgres::publish(tx, t, m).map(|_| 1),
            TxOp::Batch(t, ms) => sqlbroker::postgres::publish_batch(tx, t, ms).map(|p| p.rows),
        }
    }
    fn run_my(self, tx: &mut mysql::Transaction<'_>) -> Got {
        match self {
            TxOp::One(t, m) => sqlbroker::mysql::publish(tx, t, m).map(|_| 1),
            TxOp::Batch(t, ms) => sqlbroker::mysql::publish_batch(tx, t, ms).map(|p| p.rows),
        }
    }
    fn run_lite(self, tx: &rusqlite::Transaction<'_>) -> Got {
        match self {
            TxOp::One(t, m) => sqlbroker::sqlite::publish(tx, t, m).map(|_| 1),
            TxOp::Batch(t, ms) => sqlbroker::sqlite::publish_batch(tx, t, ms).map(|p| p.rows),
        }
    }
}

/// Rolled back: no row; committed: the rows, delivered.
fn the_job_exists_iff_the_transaction_commits(db: Db) {
    let Some(live) = common::live(db) else { return };
    let t = live.table(Form::Lease, Duration::from_secs(30));
    in_tx(&live, false, |run| {
        assert_eq!(run(TxOp::One(&t, msg("rolled back"))).unwrap(), 1);
        let batch = vec![msg("rb 1"), msg("rb 2")];
        assert_eq!(run(TxOp::Batch(&t, batch)).unwrap(), 2);
    });
    assert_eq!(live.rows(&t), 0, "a rolled-back publish left a row");
    in_tx(&live, true, |run| {
        run(TxOp::One(&t, msg("one"))).unwrap();
        run(TxOp::Batch(&t, vec![msg("two"), msg("three")])).unwrap();
        // Not visible outside the transaction before it commits.
        assert_eq!(live.rows(&t), 0, "a publish was visible before the commit");
    });
    assert_eq!(live.rows(&t), 3);
    let sub = live.broker.subscription(&t).start().unwrap();
    let mut bodies: Vec<Vec<u8>> = (0..3)
        .map(|_| {
            let d = common::next(&sub, Duration::from_secs(10));
            let b = d.payload().to_vec();
            d.ack().unwrap();
            b
        })
        .collect();
    bodies.sort();
    assert_eq!(
        bodies,
        [b"one".to_vec(), b"three".to_vec(), b"two".to_vec()]
    );
    sub.shutdown(Duration::from_secs(5)).unwrap();
}
per_db!(the_job_exists_iff_the_transaction_commits);

/// A refused message (invalid, or its dedup key held) writes nothing and leaves the
/// application's transaction usable: what it publishes after still commits.
fn refusals_leave_the_transaction_usable(db: Db) {
    let Some(live) = common::live(db) else { return };
    let t = live.create(
        common::describe(&common::unique("t"), Form::Lease, Duration::from_secs(30)).dedup(),
    );
    in_tx(&live, true, |run| {
        run(TxOp::One(&t, msg("held").dedup_key("x"))).unwrap();
        match run(TxOp::One(&t, msg("again").dedup_key("x"))) {
            Err(e) => assert!(e.is_duplicate(), "{e:?}"),
            Ok(_) => panic!("a held key was published again"),
        }
        match run(TxOp::One(&t, msg("bad").set("nope", 1i64))) {
            Err(BrokerError::InvalidMessage { .. }) => {}
            other => panic!("{other:?}"),
        }
        let skipped = vec![msg("dup").dedup_key("x"), msg("new").dedup_key("y")];
        assert_eq!(run(TxOp::Batch(&t, skipped)).unwrap(), 1);
    });
    assert_eq!(live.rows(&t), 2, "held and new, nothing else");
}
per_db!(refusals_leave_the_transaction_usable);

/// Defect 5: the application's transaction took its snapshot (REPEATABLE READ, or SQLite's
/// read transaction) before another session published a dedup key and committed; then the
/// application publishes the same key in its transaction.
///
/// MySQL/MariaDB: `Duplicate` naming the other row. The insert sees the committed key, but the
/// holder lookup read the transaction's old snapshot and found nothing, three times; before
/// the fix the assertion "a key committed after the snapshot" failed with "the dedup key
/// changed hands three times". PostgreSQL (REPEATABLE READ and SERIALIZABLE) and SQLite
/// cannot see the holder from that snapshot at all: the publish fails as a transient error
/// (a serialization failure; SQLite's stale snapshot), and the same publish in a new
/// transaction is the `Duplicate`.
fn a_key_committed_after_the_snapshot(db: Db) {
    let Some(live) = common::live(db) else { return };
    // SQLite has no row lock form: its table leases.
    let t = Table::new(common::unique("t")).dedup();
    let t = live.create(match db {
        Db::Sqlite => t.lease(Duration::from_secs(30)),
        _ => t,
    });
    let keyed = |k: &str| Message::new(b"x".to_vec()).dedup_key(k);
    let count = format!("SELECT COUNT(*) FROM {}", t.name());
    let levels: &[&str] = match db {
        Db::Postgres => &["REPEATABLE READ", "SERIALIZABLE"],
        Db::Mysql => &["REPEATABLE READ"],
        Db::Sqlite => &["DEFERRED"],
    };
    for (i, level) in levels.iter().enumerate() {
        let key = format!("key-{i}");
        let (holder, in_tx) = match db {
            Db::Mysql => {
                use mysql::prelude::Queryable;
                let mut conn = mysql::Conn::new(mysql::Opts::from_url(&live.url).unwrap()).unwrap();
                let opts = mysql::TxOpts::default()
                    .set_isolation_level(Some(mysql::IsolationLevel::RepeatableRead));
                let mut tx = conn.start_transaction(opts).unwrap();
                let _: Option<i64> = tx.query_first(&count).unwrap(); // the snapshot
                let holder = live.broker.publish(&t, keyed(&key)).unwrap();
                let r = sqlbroker::mysql::publish(&mut tx, &t, keyed(&key));
                tx.commit().unwrap();
                (holder, r)
            }
            Db::Postgres => {
                let mut client = postgres::Client::connect(&live.url, postgres::NoTls).unwrap();
                let mut tx = client
                    .build_transaction()
                    .isolation_level(if *level == "SERIALIZABLE" {
                        postgres::IsolationLevel::Serializable
                    } else {
                        postgres::IsolationLevel::RepeatableRead
                    })
                    .start()
                    .unwrap();
                tx.query_one(&count, &[]).unwrap(); // the snapshot
                let holder = live.broker.publish(&t, keyed(&key)).unwrap();
                let r = sqlbroker::postgres::publish(&mut tx, &t, keyed(&key));
                drop(tx);
                (holder, r)
            }
            Db::Sqlite => {
                let path = live.url.strip_prefix("sqlite:").unwrap();
                let mut conn = rusqlite::Connection::open(path).unwrap();
                conn.busy_timeout(Duration::from_secs(5)).unwrap();
                let tx = conn.transaction().unwrap();
                let _: i64 = tx.query_row(&count, [], |r| r.get(0)).unwrap(); // the snapshot
                let holder = live.broker.publish(&t, keyed(&key)).unwrap();
                let r = sqlbroker::sqlite::publish(&tx, &t, keyed(&key));
                drop(tx);
                (holder, r)
            }
        };
        match db {
            Db::Mysql => assert_eq!(
                in_tx.as_ref().map_err(BrokerError::duplicate_of),
                Err(Some(holder)),
                "{db:?} {level}: a key committed after the snapshot: {in_tx:?}"
            ),
            _ => {
                let e = in_tx.expect_err("a publish over a held key made a row");
                assert!(e.is_transient(), "{db:?} {level}: not transient: {e:?}");
                // Tried again in a new transaction: the duplicate, named.
                let again = match db {
                    Db::Postgres => {
                        let mut c = postgres::Client::connect(&live.url, postgres::NoTls).unwrap();
                        let mut tx = c.transaction().unwrap();
                        sqlbroker::postgres::publish(&mut tx, &t, keyed(&key))
                    }
                    _ => {
                        let path = live.url.strip_prefix("sqlite:").unwrap();
                        let mut c = rusqlite::Connection::open(path).unwrap();
                        let tx = c.transaction().unwrap();
                        sqlbroker::sqlite::publish(&tx, &t, keyed(&key))
                    }
                };
                assert_eq!(
                    again.as_ref().map_err(BrokerError::duplicate_of),
                    Err(Some(holder)),
                    "{db:?} {level}: {again:?}"
                );
            }
        }
        assert_eq!(
            live.rows_where(&t, &format!("dedup_key = '{key}'")),
            1,
            "{db:?} {level}"
        );
    }
}

per_db!(a_key_committed_after_the_snapshot);

/// The publish time of a job published on the application's session is the server's clock in
/// UTC, whatever time zone that session runs in (`in_tx` sets +05:30 on the servers): the
/// job's `published_at` is within a minute of now, not hours off.
fn the_publish_time_is_utc_whatever_the_session_zone(db: Db) {
    let Some(live) = common::live(db) else { return };
    let t = live.table(Form::Lease, Duration::from_secs(30));
    in_tx(&live, true, |run| {
        run(TxOp::One(&t, msg("zoned"))).unwrap();
    });
    let jobs = live
        .broker
        .jobs(&t, sqlbroker::JobState::Ready, None, 10)
        .unwrap();
    let published = jobs[0].published_at().expect("a publish time");
    let now = std::time::SystemTime::now();
    let off = now
        .duration_since(published)
        .unwrap_or_else(|e| e.duration());
    assert!(off < Duration::from_secs(60), "published_at is {off:?} off");
}
per_db!(the_publish_time_is_utc_whatever_the_session_zone);

/// A description that disagrees with the table's record is refused by the transactional
/// publishes as by `Broker::publish` (one and batch), naming the difference, and the
/// transaction stays usable: a publish of the recorded description in it commits.
///
/// Fails (`a disagreeing description was published`) when the transactional paths skip the
/// record check: tried by passing `check: false`.
fn a_disagreeing_description_is_refused_in_a_transaction(db: Db) {
    let Some(live) = common::live(db) else { return };
    let t = live.table(Form::Lease, Duration::from_secs(30));
    let other = Table::new(t.name())
        .text_column("k")
        .lease(Duration::from_secs(30))
        .max_attempts(3);
    in_tx(&live, true, |run| {
        for op in [
            TxOp::One(&other, msg("no")),
            TxOp::Batch(&other, vec![msg("no"), msg("no")]),
        ] {
            match run(op) {
                Err(BrokerError::Schema { problems, .. }) => {
                    assert_eq!(problems.len(), 1, "{problems:?}");
                    assert!(problems[0].contains("max_attempts"), "{problems:?}");
                }
                other => panic!("a disagreeing description was published: {other:?}"),
            }
        }
        assert_eq!(run(TxOp::One(&t, msg("yes"))).unwrap(), 1);
    });
    assert_eq!(live.rows(&t), 1);
}
per_db!(a_disagreeing_description_is_refused_in_a_transaction);

/// A message published inside the application's transaction that waits on a job of another
/// table (`after_in`) is checked against that table's record, as `Broker::publish` checks it:
/// a description saying `dependencies()` of a table recorded without them is refused
/// (`Schema`, naming it), and the transaction stays usable. Fails (`refused`: `Ok`, a job
/// that would wait for ever) with the transactional path trusting the caller's description.
fn after_in_is_checked_in_a_transaction(db: Db) {
    let Some(live) = common::live(db) else { return };
    let long = Duration::from_secs(30);
    let waits = live.create(
        Table::new(common::unique("txw"))
            .text_column("k")
            .dependencies()
            .lease(long),
    );
    let name = common::unique("txp");
    let _plain = live.create(Table::new(&name).text_column("k").lease(long));
    let claimed = Table::new(&name)
        .text_column("k")
        .dependencies()
        .lease(long);
    in_tx(&live, true, |run| {
        let refused = run(TxOp::One(&waits, msg("no").after_in(&claimed, 1)));
        assert!(
            matches!(&refused, Err(BrokerError::Schema { table, .. }) if table == &name),
            "refused: {refused:?}"
        );
        assert_eq!(run(TxOp::One(&waits, msg("yes"))).unwrap(), 1);
    });
    assert_eq!(live.rows(&waits), 1);
    live.forget_deps(waits.name());
}
per_db!(after_in_is_checked_in_a_transaction);
