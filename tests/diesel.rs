//! Publishing inside the application's own Diesel transaction (feature `diesel`), on
//! `PgConnection`, `MysqlConnection` and `SqliteConnection`: the job exists if and only if the
//! transaction commits, a held dedup key is a `Duplicate` naming its holder, bad input writes
//! nothing and leaves the transaction usable, and an idle worker of a broker sees the job once
//! the transaction commits (PostgreSQL: its notification, delivered at the commit; SQLite: the
//! file's change probe; MySQL/MariaDB: its poll).

mod common;

use std::time::{Duration, Instant, SystemTime};

use common::{Db, Live};
use diesel::connection::SimpleConnection;
use diesel::{Connection, MysqlConnection, PgConnection, SqliteConnection};
use sqlbroker::{BrokerError, Form, Message, Published, Table, Value};

fn msg(body: &str) -> Message {
    Message::new(body.as_bytes().to_vec()).set("k", "a")
}

/// A Diesel connection of the application's own to `live`'s database.
enum Conn {
    Pg(PgConnection),
    My(MysqlConnection),
    Lite(SqliteConnection),
}

/// A connection inside the application's transaction (or outside any).
enum Tx<'a> {
    Pg(&'a mut PgConnection),
    My(&'a mut MysqlConnection),
    Lite(&'a mut SqliteConnection),
}

fn connect(live: &Live) -> Conn {
    match live.db {
        Db::Postgres => Conn::Pg(PgConnection::establish(&live.url).unwrap()),
        Db::Mysql => Conn::My(MysqlConnection::establish(&live.url).unwrap()),
        Db::Sqlite => {
            let path = live.url.strip_prefix("sqlite:").unwrap();
            let mut c = SqliteConnection::establish(path).unwrap();
            c.batch_execute("PRAGMA busy_timeout = 30000").unwrap();
            Conn::Lite(c)
        }
    }
}

impl Conn {
    /// Runs `f` in a Diesel transaction, then commits it (`commit`) or rolls it back.
    fn in_tx<T>(&mut self, commit: bool, f: impl FnOnce(&mut Tx<'_>) -> T) -> T {
        let mut out = None;
        let end = |out: T, slot: &mut Option<T>| {
            *slot = Some(out);
            if commit {
                Ok(())
            } else {
                Err(diesel::result::Error::RollbackTransaction)
            }
        };
        let r = match self {
            Conn::Pg(c) => c.transaction(|c| end(f(&mut Tx::Pg(c)), &mut out)),
            Conn::My(c) => c.transaction(|c| end(f(&mut Tx::My(c)), &mut out)),
            Conn::Lite(c) => c.transaction(|c| end(f(&mut Tx::Lite(c)), &mut out)),
        };
        match r {
            Ok(()) => assert!(commit),
            Err(diesel::result::Error::RollbackTransaction) => assert!(!commit),
            Err(e) => panic!("the application's transaction failed: {e}"),
        }
        out.unwrap()
    }

    /// The connection outside any transaction.
    fn bare(&mut self) -> Tx<'_> {
        match self {
            Conn::Pg(c) => Tx::Pg(c),
            Conn::My(c) => Tx::My(c),
            Conn::Lite(c) => Tx::Lite(c),
        }
    }
}

impl Tx<'_> {
    fn publish(&mut self, t: &Table, m: Message) -> Result<i64, BrokerError> {
        match self {
            Tx::Pg(c) => sqlbroker::diesel::publish(*c, t, m),
            Tx::My(c) => sqlbroker::diesel::publish(*c, t, m),
            Tx::Lite(c) => sqlbroker::diesel::publish(*c, t, m),
        }
    }

    /// Runs `sql` as it is (a read that takes the transaction's snapshot, a setting).
    fn exec(&mut self, sql: &str) {
        match self {
            Tx::Pg(c) => c.batch_execute(sql),
            Tx::My(c) => c.batch_execute(sql),
            Tx::Lite(c) => c.batch_execute(sql),
        }
        .unwrap()
    }

    fn batch(&mut self, t: &Table, ms: Vec<Message>) -> Result<Published, BrokerError> {
        match self {
            Tx::Pg(c) => sqlbroker::diesel::publish_batch(*c, t, ms),
            Tx::My(c) => sqlbroker::diesel::publish_batch(*c, t, ms),
            Tx::Lite(c) => sqlbroker::diesel::publish_batch(*c, t, ms),
        }
    }
}

/// Payloads of the next `n` deliveries, acked, sorted.
fn drain(live: &Live, t: &Table, n: usize) -> Vec<String> {
    let sub = live.broker.subscription(t).start().unwrap();
    let mut bodies: Vec<String> = (0..n)
        .map(|_| {
            let d = common::next(&sub, Duration::from_secs(10));
            let body = String::from_utf8(d.payload().to_vec()).unwrap();
            d.ack().unwrap();
            body
        })
        .collect();
    bodies.sort();
    sub.shutdown(Duration::from_secs(5)).unwrap();
    bodies
}

/// Rolled back: no row; committed: the rows, delivered, each value as written (every column
/// type, `NULL`s, the due time).
fn the_job_exists_iff_the_transaction_commits(db: Db) {
    let Some(live) = common::live(db) else { return };
    let t = live.create(
        common::describe(&common::unique("t"), Form::Lease, Duration::from_secs(30))
            .int_column("n")
            .float_column("f")
            .bytes_column("b"),
    );
    let mut conn = connect(&live);
    conn.in_tx(false, |tx| {
        assert!(tx.publish(&t, msg("rolled back")).unwrap() > 0);
        let made = tx.batch(&t, vec![msg("rb 1"), msg("rb 2")]).unwrap();
        assert_eq!((made.rows, made.duplicates), (2, 0));
    });
    assert_eq!(live.rows(&t), 0, "a rolled-back publish left a row");
    let typed = msg("one")
        .set("n", 7i64)
        .set("f", 2.5f64)
        .set("b", vec![1u8, 0, 255]);
    let (one, nulls, later) = conn.in_tx(true, |tx| {
        let one = tx.publish(&t, typed).unwrap();
        let nulls = tx.publish(&t, Message::new(b"nulls".to_vec())).unwrap();
        let later = tx
            .publish(&t, msg("later").deliver_after(Duration::from_secs(3600)))
            .unwrap();
        let made = tx.batch(&t, vec![msg("two"), msg("three")]).unwrap();
        assert_eq!((made.rows, made.duplicates), (2, 0));
        assert_eq!(live.rows(&t), 0, "a publish was visible before the commit");
        (one, nulls, later)
    });
    assert_eq!(live.rows(&t), 5);
    let now = SystemTime::now();
    let job = |id| {
        live.broker
            .job(&t, id)
            .unwrap()
            .expect("the id returned is the row's")
    };
    let one = job(one);
    assert_eq!(one.payload(), b"one");
    let want = [
        ("k", Value::Text("a".into())),
        ("n", Value::Int(7)),
        ("f", Value::Float(2.5)),
        ("b", Value::Bytes(vec![1, 0, 255])),
    ];
    for (column, value) in &want {
        assert_eq!(one.get(column), Some(value), "column {column}");
    }
    let near = |t: SystemTime| {
        t.duration_since(now)
            .or_else(|e| Ok::<_, ()>(e.duration()))
            .unwrap()
            < Duration::from_secs(60)
    };
    assert!(near(one.due_at()), "due at {:?}, now {now:?}", one.due_at());
    let published = one.published_at().expect("published_at");
    assert!(near(published), "published at {published:?}, now {now:?}");
    let nulls = job(nulls);
    for (column, _) in &want {
        assert_eq!(nulls.get(column), Some(&Value::Null), "column {column}");
    }
    let due = job(later).due_at();
    assert!(
        due > now + Duration::from_secs(3500),
        "a job delayed an hour is due at {due:?}, now {now:?}"
    );
    assert_eq!(drain(&live, &t, 4), ["nulls", "one", "three", "two"]);
}
per_db!(the_job_exists_iff_the_transaction_commits);

/// A held key is a `Duplicate` naming its holder, a batch skips held keys, and the
/// transaction goes on: what it published commits.
fn dedup_keys_as_the_other_transactional_publishes(db: Db) {
    let Some(live) = common::live(db) else { return };
    let t = live.create(
        common::describe(&common::unique("t"), Form::Lease, Duration::from_secs(30))
            .dedup()
            .priorities(),
    );
    let held = live
        .broker
        .publish(&t, msg("committed").dedup_key("c"))
        .unwrap();
    let mut conn = connect(&live);
    conn.in_tx(true, |tx| {
        let x = tx.publish(&t, msg("held").dedup_key("x")).unwrap();
        let again = tx.publish(&t, msg("again").dedup_key("x"));
        assert_eq!(
            again.as_ref().map_err(BrokerError::duplicate_of),
            Err(Some(x)),
            "a key held in this transaction: {again:?}"
        );
        let other = tx.publish(&t, msg("other").dedup_key("c"));
        assert_eq!(
            other.as_ref().map_err(BrokerError::duplicate_of),
            Err(Some(held)),
            "a key held by a committed row: {other:?}"
        );
        let batch = vec![
            msg("dup x").dedup_key("x"),
            msg("dup c").dedup_key("c"),
            msg("new y").dedup_key("y").priority(5),
            msg("no key"),
        ];
        let made = tx.batch(&t, batch).unwrap();
        assert_eq!((made.rows, made.duplicates), (2, 2));
    });
    assert_eq!(live.rows(&t), 4, "committed, held, new y, no key");
    assert_eq!(live.rows_where(&t, "dedup_key = 'y' AND priority = 5"), 1);
    assert_eq!(live.rows_where(&t, "dedup_key IS NULL"), 1);
}
per_db!(dedup_keys_as_the_other_transactional_publishes);

/// A message that does not fit the table, alone or in a batch, is `InvalidMessage` and writes
/// nothing; a publish the database refuses (a table never created) is a `Database` error that
/// leaves nothing of itself and the transaction usable: what is published after commits.
fn bad_input_writes_nothing(db: Db) {
    let Some(live) = common::live(db) else { return };
    let t = live.table(Form::Lease, Duration::from_secs(30));
    let missing = Table::new(common::unique("never_made")).lease(Duration::from_secs(30));
    let mut conn = connect(&live);
    conn.in_tx(true, |tx| {
        match tx.publish(&t, msg("bad").set("nope", 1i64)) {
            Err(BrokerError::InvalidMessage { .. }) => {}
            other => panic!("an unknown column: {other:?}"),
        }
        match tx.batch(&t, vec![msg("good"), msg("bad").set("k", 5i64)]) {
            Err(BrokerError::InvalidMessage { .. }) => {}
            other => panic!("a batch with an integer in a text column: {other:?}"),
        }
        match tx.publish(&missing, Message::new(b"x".to_vec())) {
            Err(BrokerError::Database { op: "publish", .. }) => {}
            other => panic!("a table never created: {other:?}"),
        }
    });
    assert_eq!(live.rows(&t), 0, "bad input wrote a row");
    conn.in_tx(true, |tx| {
        let refused = tx.batch(&missing, vec![Message::new(b"x".to_vec())]);
        assert!(
            refused.is_err(),
            "a batch into a table never created: {refused:?}"
        );
        tx.publish(&t, msg("after")).unwrap();
    });
    assert_eq!(drain(&live, &t, 1), ["after"]);
}
per_db!(bad_input_writes_nothing);

/// Outside any transaction a publish commits on its own, as `Broker::publish` does.
fn outside_a_transaction_a_publish_commits_on_its_own(db: Db) {
    let Some(live) = common::live(db) else { return };
    let t = live.table(Form::Lease, Duration::from_secs(30));
    let mut conn = connect(&live);
    let mut tx = conn.bare();
    tx.publish(&t, msg("alone")).unwrap();
    assert_eq!(tx.batch(&t, vec![msg("b1"), msg("b2")]).unwrap().rows, 2);
    assert_eq!(live.rows(&t), 3);
}
per_db!(outside_a_transaction_a_publish_commits_on_its_own);

/// An idle worker of a broker, on a connection of its own, gets the job once the
/// application's transaction commits, not before. PostgreSQL and SQLite subscriptions poll
/// every 30 s here, so only the notification (delivered at the commit) or the change probe
/// can bring the row within 2 s; MySQL/MariaDB cannot notify, and its worker finds the row at
/// its next poll (the default 250 ms). The worker waits on a thread of its own: on SQLite its
/// claim waits for the write lock the application's transaction holds.
fn a_worker_is_woken_by_the_commit(db: Db) {
    let Some(live) = common::live(db) else { return };
    let t = live.table(Form::Lease, Duration::from_secs(30));
    let other = live.connect();
    let poll = match db {
        Db::Mysql => Duration::from_millis(250),
        _ => Duration::from_secs(30),
    };
    let sub = other.subscription(&t).poll_interval(poll).start().unwrap();
    std::thread::sleep(Duration::from_millis(300)); // idle: its first claim found nothing
    let mut conn = connect(&live);
    std::thread::scope(|s| {
        let worker = s.spawn(|| {
            let got = sub.next_delivery_timeout(Duration::from_secs(10));
            let at = Instant::now();
            let d = got.unwrap_or_else(|e| panic!("{db:?}: no delivery within 10 s: {e}"));
            assert_eq!(d.payload(), b"in-tx");
            d.ack().unwrap();
            at
        });
        let committing = conn.in_tx(true, |tx| {
            tx.publish(&t, msg("in-tx")).unwrap();
            std::thread::sleep(Duration::from_millis(600));
            Instant::now()
        });
        let committed = Instant::now();
        let delivered = worker.join().unwrap();
        assert!(
            delivered > committing,
            "{db:?}: a row was delivered before its transaction committed"
        );
        let after = delivered.saturating_duration_since(committed);
        assert!(
            after < Duration::from_secs(2),
            "{db:?}: the commit reached the idle worker only after {after:?}"
        );
    });
    sub.shutdown(Duration::from_secs(5)).unwrap();
}
per_db!(a_worker_is_woken_by_the_commit);

/// The application's transaction took its snapshot (PostgreSQL REPEATABLE READ, MariaDB's
/// default REPEATABLE READ, SQLite's deferred read) before another session published a dedup
/// key and committed; then it publishes the same key. As the other transactional publishes:
/// MySQL/MariaDB names the holder as a `Duplicate` (a locking read sees past the snapshot);
/// PostgreSQL and SQLite cannot see it from that snapshot, and fail as a transient error, and
/// the same publish in a new transaction is the `Duplicate`.
fn a_key_committed_after_the_snapshot(db: Db) {
    let Some(live) = common::live(db) else { return };
    // SQLite has no row lock form: its table leases.
    let t = Table::new(common::unique("t")).dedup();
    let t = live.create(match db {
        Db::Sqlite => t.lease(Duration::from_secs(30)),
        _ => t,
    });
    let keyed = || Message::new(b"x".to_vec()).dedup_key("k");
    let mut conn = connect(&live);
    if db == Db::Mysql {
        conn.bare()
            .exec("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ");
    }
    let mut holder = None;
    let in_tx = conn.in_tx(false, |tx| {
        if db == Db::Postgres {
            tx.exec("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ");
        }
        tx.exec(&format!("SELECT COUNT(*) FROM {}", t.name())); // the snapshot
        holder = Some(live.broker.publish(&t, keyed()).unwrap());
        tx.publish(&t, keyed())
    });
    let holder = holder.unwrap();
    match db {
        Db::Mysql => assert_eq!(
            in_tx.as_ref().map_err(BrokerError::duplicate_of),
            Err(Some(holder)),
            "a key committed after the snapshot: {in_tx:?}"
        ),
        _ => {
            let e = in_tx.expect_err("a publish over a held key made a row");
            assert!(e.is_transient(), "{db:?}: not transient: {e:?}");
            let again = conn.in_tx(false, |tx| tx.publish(&t, keyed()));
            assert_eq!(
                again.as_ref().map_err(BrokerError::duplicate_of),
                Err(Some(holder)),
                "{db:?}: in a new transaction: {again:?}"
            );
        }
    }
    assert_eq!(live.rows(&t), 1);
}
per_db!(a_key_committed_after_the_snapshot);
