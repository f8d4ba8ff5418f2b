//! Bad input gets a clear error and changes nothing: a table description carrying SQL in an
//! identifier, or a template naming an unknown column, is refused by every entry point before
//! any SQL runs; a row lock table on SQLite is refused at `start()`.

mod common;

use std::time::Duration;

use common::{Db, Live};
use sqlbroker::{Broker, BrokerError, Form, Message, Role, Table};

fn expect_invalid_table<T>(what: &str, r: Result<T, BrokerError>) {
    match r {
        Err(BrokerError::InvalidTable { .. }) => {}
        Err(e) => panic!("{what}: expected InvalidTable, got {e:?}"),
        Ok(_) => panic!("{what}: a bad description was accepted"),
    }
}

/// Every way into the database with `bad` returns `InvalidTable`.
fn refused_everywhere(broker: &Broker, bad: &Table) {
    let name = bad.name();
    expect_invalid_table(&format!("create_table({name:?})"), broker.create_table(bad));
    expect_invalid_table(
        &format!("publish({name:?})"),
        broker.publish(bad, Message::new(b"x".to_vec())),
    );
    let batch = vec![Message::new(b"x".to_vec())];
    expect_invalid_table(
        &format!("publish_batch({name:?})"),
        broker.publish_batch(bad, batch),
    );
    expect_invalid_table(
        &format!("start({name:?})"),
        broker.subscription(bad).start(),
    );
    expect_invalid_table(
        &format!("dead_letters({name:?})"),
        broker.dead_letters(bad, 10),
    );
    expect_invalid_table(
        &format!("requeue_dead({name:?})"),
        broker.requeue_dead(bad, 1),
    );
}

/// On a server: a broker whose only pooled connection is held by a row lock delivery, so any
/// statement would wait for the pool and fail with `Pool`, not `InvalidTable`: the refusals
/// below prove that no SQL was even attempted. On SQLite (no row lock), the database file is
/// the test's own: its table count shows that nothing was created.
fn bad_descriptions_run_no_sql(db: Db) {
    let Some(live) = common::live(db) else { return };
    let canary = live.table(Form::Lease, Duration::from_secs(30));
    live.broker
        .publish(&canary, Message::new(b"alive".to_vec()).set("k", "a"))
        .unwrap();
    let base = common::unique("t");

    let (broker, hold) = match db {
        Db::Sqlite => (live.connect(), None),
        _ => {
            let (broker, held) = common::held_pool(&live);
            // The control: with its connections held, this broker cannot run a statement.
            match broker.publish(&canary, Message::new(b"x".to_vec()).set("k", "b")) {
                Err(BrokerError::Pool { .. }) => {}
                other => panic!("the held pool still ran a statement: {other:?}"),
            }
            (broker, Some(held))
        }
    };
    let tables_before = live.table_count();

    let injected = format!("{base}; DROP TABLE {}", canary.name());
    let bad = [
        Table::new(injected.as_str()),
        Table::new(format!("{base}\"; DROP TABLE {} --", canary.name())),
        Table::new(base.as_str()).text_column("a\"b"),
        Table::new(base.as_str()).column("k`; DROP TABLE x", sqlbroker::ColumnType::Int),
        Table::new(base.as_str()).rename(Role::Payload, "body; --"),
        Table::new(base.as_str())
            .text_column("k")
            .advisory_lock("acct-{nope}"),
        Table::new(base.as_str())
            .text_column("k")
            .advisory_lock("acct-{k"),
        Table::new(base.as_str())
            .text_column("k")
            .lease(Duration::from_secs(5))
            .advisory_lock("{k}"),
    ];
    for t in &bad {
        refused_everywhere(&broker, t);
    }
    // The reasons name what is wrong.
    match broker.create_table(&bad[5]) {
        Err(BrokerError::InvalidTable { reason, .. }) => {
            assert!(reason.contains("nope"), "{reason}")
        }
        other => panic!("{other:?}"),
    }

    // Nothing was created, nothing dropped.
    assert!(!live.table_exists(&base));
    assert!(!live.table_exists(&injected));
    assert!(live.table_exists(canary.name()));
    assert_eq!(live.rows(&canary), 1);
    if db == Db::Sqlite {
        assert_eq!(live.table_count(), tables_before);
    }
    for (sub, d) in hold.into_iter().flatten() {
        d.ack().unwrap();
        sub.shutdown(Duration::from_secs(5)).unwrap();
    }
    check_good_description_still_works(&live, &broker);
}
per_db!(bad_descriptions_run_no_sql);

fn check_good_description_still_works(live: &Live, broker: &Broker) {
    let t = live.table(Form::Lease, Duration::from_secs(30));
    broker
        .publish(&t, Message::new(b"ok".to_vec()).set("k", "a"))
        .unwrap();
    assert_eq!(live.rows(&t), 1);
}

/// A row lock table on SQLite is refused where it is described (`create_table`, `migrate`)
/// with `Unsupported` naming the forms it has, and nothing is made; the servers take it.
#[test]
fn sqlite_row_lock_is_unsupported() {
    let Some(live) = common::live(Db::Sqlite) else {
        return;
    };
    let t = common::describe(&common::unique("t"), Form::RowLock, Duration::ZERO);
    let unsupported = |r: sqlbroker::Result<()>, what: &str| match r {
        Err(e @ BrokerError::Unsupported { .. }) => {
            let msg = e.to_string();
            assert!(
                msg.contains("SQLite") && msg.contains("row lock") && msg.contains("Table::lease"),
                "{what}: {msg}"
            );
        }
        Err(e) => panic!("{what}: expected Unsupported, got {e:?}"),
        Ok(()) => panic!("{what}: a row lock table was made on SQLite"),
    };
    // Refused where it is described, before anything is made or recorded.
    unsupported(live.broker.create_table(&t), "create_table");
    unsupported(live.broker.migrate(&t).map(drop), "migrate");
    assert!(!live.table_exists(t.name()), "the refused table was made");
    assert!(
        live.broker.tables().unwrap().is_empty(),
        "the refused table was recorded"
    );
    // The servers still take the form.
    for db in [Db::Postgres, Db::Mysql] {
        if let Some(server) = common::live(db) {
            let r = server.table(Form::RowLock, Duration::ZERO);
            server.broker.publish(&r, common::msg("x", "a")).unwrap();
        }
    }
}

/// Runs `f`, turning a panic into a test failure that names `what`.
fn no_panic<T>(what: &str, f: impl FnOnce() -> T) -> T {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(p) => {
            let msg = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            panic!("{what} panicked ({msg}); bad input should get a clear error")
        }
    }
}

// Durations too large for a time are not an error: every time the queue writes saturates at
// 9999-12-31 23:59:59 UTC (the end of a MySQL `DATETIME`), which means "never". Never a panic,
// never wrapped to a time soon, and nothing lost.

/// The latest time the queue writes, in epoch seconds: 9999-12-31 23:59:59 UTC.
const LATEST_SECS: i64 = 253_402_300_799;

/// The time column `col` of row `id` in `t`, read directly as epoch seconds.
fn epoch_of(live: &Live, t: &Table, col: &str, id: i64) -> Vec<Option<i64>> {
    let expr = match live.db {
        Db::Sqlite => col.to_string(),
        Db::Postgres => format!("CAST(EXTRACT(EPOCH FROM {col}) AS BIGINT)"),
        Db::Mysql => format!("TIMESTAMPDIFF(SECOND, '1970-01-01 00:00:00', {col})"),
    };
    live.ints(&format!("SELECT {expr} FROM {} WHERE id = {id}", t.name()))
}

/// A message delayed by `Duration::MAX` is published, due at the latest time. Fails if it were
/// refused (`expect`), or its due time wrapped or not saturated (`run_at`; tried by
/// saturating at a year earlier: every variant of the three tests failed).
fn deliver_after_max_is_not_a_panic(db: Db) {
    let Some(live) = common::live(db) else { return };
    let t = live.table(Form::Lease, Duration::from_secs(30));
    let m = Message::new(b"never".to_vec())
        .set("k", "a")
        .deliver_after(Duration::MAX);
    let id = no_panic("publish(deliver_after(Duration::MAX))", || {
        live.broker.publish(&t, m)
    })
    .expect("a delay past the latest time saturates");
    assert_eq!(
        epoch_of(&live, &t, "run_at", id),
        [Some(LATEST_SECS)],
        "run_at"
    );
}
per_db!(deliver_after_max_is_not_a_panic);

/// A delivery retried after `Duration::MAX` is retried, due at the latest time: its lease
/// cleared, its attempt counted, not dead. Fails if the retry were refused (`expect`) or the
/// due time wrapped or not saturated (`run_at`).
fn retry_after_max_is_not_a_panic(db: Db) {
    let Some(live) = common::live(db) else { return };
    let t = live.table(Form::Lease, Duration::from_secs(30));
    let id = live
        .broker
        .publish(&t, Message::new(b"r".to_vec()).set("k", "a"))
        .unwrap();
    let sub = live.broker.subscription(&t).start().unwrap();
    let d = sub
        .next_delivery_timeout(Duration::from_secs(10))
        .expect("a delivery");
    no_panic("retry_after(Duration::MAX)", || {
        d.retry_after(Duration::MAX)
    })
    .expect("a delay past the latest time saturates");
    assert_eq!(
        epoch_of(&live, &t, "run_at", id),
        [Some(LATEST_SECS)],
        "run_at"
    );
    assert_eq!(
        live.rows_where(
            &t,
            &format!("id = {id} AND attempts = 1 AND locked_until IS NULL AND dead_at IS NULL")
        ),
        1,
        "the retried row's state"
    );
    sub.shutdown(Duration::from_secs(1)).unwrap();
}
per_db!(retry_after_max_is_not_a_panic);

/// A lease too long to compute with is accepted, and its deadline saturates at the latest time
/// (not wrapped to a short lease). Fails if such a table or subscription were refused
/// (`expect`), or the deadline wrapped or not saturated (`locked_until`).
fn huge_lease_is_not_a_panic(db: Db) {
    let Some(live) = common::live(db) else { return };
    for lease in [Duration::MAX, Duration::from_secs(u64::MAX / 1000)] {
        let t = Table::new(common::unique("t"))
            .text_column("k")
            .lease(lease);
        live.track(t.name());
        no_panic("create_table(lease(huge))", || live.broker.create_table(&t))
            .expect("a huge lease is a valid description");
        let id = live
            .broker
            .publish(&t, Message::new(b"l".to_vec()).set("k", "a"))
            .unwrap();
        let sub = no_panic("start(lease(huge))", || {
            live.broker.subscription(&t).start()
        })
        .expect("a huge lease starts");
        let d = sub.next_delivery_timeout(Duration::from_secs(5));
        assert!(d.is_ok(), "{d:?} (last error: {:?})", sub.last_error());
        assert_eq!(
            epoch_of(&live, &t, "locked_until", id),
            [Some(LATEST_SECS)],
            "locked_until of lease {lease:?}"
        );
        drop(d);
        sub.close();
    }
}
per_db!(huge_lease_is_not_a_panic);

/// A database error names its cause in its message (what `Display` and `last_error` show), not
/// just that there was one: here, a payload column renamed behind the library's back.
fn database_errors_name_their_cause(db: Db) {
    let Some(live) = common::live(db) else { return };
    let t = live.table(Form::Lease, Duration::from_secs(30));
    live.exec(&format!(
        "ALTER TABLE {} RENAME COLUMN payload TO body",
        t.name()
    ));
    let e = live
        .broker
        .publish(&t, Message::new(b"x".to_vec()))
        .expect_err("published into no column");
    assert!(matches!(e, BrokerError::Database { .. }), "{e:?}");
    let shown = e.to_string();
    let cause = match db {
        Db::Postgres => "column \"payload\" of relation",
        Db::Mysql => "Unknown column 'payload'",
        Db::Sqlite => "no column named payload",
    };
    assert!(
        shown.contains(cause),
        "the message hides the cause: {shown:?}"
    );
    assert!(
        !shown.contains("MySqlError {"),
        "the driver's wrapping: {shown:?}"
    );
}
per_db!(database_errors_name_their_cause);

/// A database that cannot be opened will not open on a retry either: a permanent connect error
/// that names what is missing (PostgreSQL and MariaDB: a database that does not exist; SQLite:
/// a file in a folder that does not exist, which SQLite cannot create).
fn a_database_that_cannot_be_opened_is_permanent(db: Db) {
    let Some(url) = common::url(db) else { return };
    let (bad, named) = match db {
        Db::Sqlite => {
            let dir = std::env::temp_dir().join(common::unique("no_such_folder"));
            let file = dir.join("q.db");
            (
                format!("sqlite:{}", file.display()),
                format!("the folder {} does not exist", dir.display()),
            )
        }
        _ => {
            let (server, _) = url.rsplit_once('/').expect("a database in the URL");
            (
                format!("{server}/no_such_db_sqlbroker"),
                "no_such_db_sqlbroker".to_string(),
            )
        }
    };
    let e = Broker::builder(&bad)
        .connection_timeout(Duration::from_secs(5))
        .build()
        .map(drop)
        .expect_err("opened a database that is not there");
    assert!(matches!(e, BrokerError::Connect { .. }), "{e:?}");
    assert!(!e.is_transient(), "a retry cannot help: {e}");
    assert!(e.to_string().contains(&named), "{e}");
}
per_db!(a_database_that_cannot_be_opened_is_permanent);

/// A server that is not there: `build` fails at once (not after the pool's timeout) with a
/// connect error that says so and is transient; URLs we cannot read are `InvalidUrl`.
#[test]
fn unreachable_server_and_bad_urls() {
    for url in [
        "postgres://postgres@127.0.0.1:1/test",
        "mysql://root@127.0.0.1:1/test",
    ] {
        if url.starts_with("mysql") && !cfg!(feature = "mysql") {
            continue;
        }
        let started = std::time::Instant::now();
        match Broker::builder(url)
            .connection_timeout(Duration::from_secs(20))
            .build()
        {
            Err(e @ BrokerError::Connect { .. }) => {
                assert!(e.is_transient(), "{e:?}");
                assert!(
                    started.elapsed() < Duration::from_secs(5),
                    "{url}: waited out the pool"
                );
            }
            Err(e) => panic!("{url}: expected a connect error, got {e:?}"),
            Ok(_) => panic!("{url}: connected to nothing"),
        }
    }
    for url in [
        "redis://127.0.0.1/0",
        "sqlite:",
        "",
        "postgres://postgres@127.0.0.1:notaport/test",
    ] {
        match Broker::connect(url) {
            Err(BrokerError::InvalidUrl { .. }) => {}
            other => panic!("{url:?}: expected InvalidUrl, got {other:?}"),
        }
    }
}

/// Options out of their range are typed errors naming the option, and nothing starts: no claim
/// worker runs (a row published before stays unclaimed). Before: `workers(0)` and the like were
/// clamped silently, `poll_interval(0)` spun a core, `connection_timeout(0)` panicked in r2d2.
#[test]
fn options_out_of_range_are_refused() {
    use sqlbroker::SubscriptionBuilder;
    let broker = Broker::connect("sqlite::memory:").unwrap();
    let t = Table::new("jobs").lease(Duration::from_secs(30));
    broker.create_table(&t).unwrap();
    broker
        .publish(&t, sqlbroker::Message::new(b"x".to_vec()))
        .unwrap();
    type Bad = fn(SubscriptionBuilder<'_>) -> SubscriptionBuilder<'_>;
    let cases: [(&str, Bad); 8] = [
        ("workers", |b| b.workers(0)),
        ("workers", |b| b.workers(257)),
        ("batch_size", |b| b.batch_size(0)),
        ("batch_size", |b| b.batch_size(1_001)),
        ("max_in_flight", |b| b.max_in_flight(0)),
        ("poll_interval", |b| b.poll_interval(Duration::ZERO)),
        ("poll_interval", |b| {
            b.poll_interval(Duration::from_secs(86_400))
        }),
        ("handler_timeout", |b| b.handler_timeout(Duration::ZERO)),
    ];
    for (option, bad) in cases {
        match bad(broker.subscription(&t)).start() {
            Err(BrokerError::InvalidOption { option: o, reason }) => {
                assert_eq!(o, option);
                assert!(!reason.is_empty());
            }
            other => panic!("{option}: {other:?}"),
        }
    }
    // Nothing claimed the row meanwhile: the first good subscription gets it at attempt 1.
    let sub = broker.subscription(&t).start().unwrap();
    let d = sub.next_delivery_timeout(Duration::from_secs(5)).unwrap();
    assert_eq!(d.attempt(), 1);
    d.ack().unwrap();

    type BadBroker = fn(sqlbroker::BrokerBuilder) -> sqlbroker::BrokerBuilder;
    let cases: [(&str, BadBroker); 4] = [
        ("pool_size", |b| b.pool_size(0)),
        ("connection_timeout", |b| {
            b.connection_timeout(Duration::ZERO)
        }),
        ("statement_timeout", |b| {
            b.statement_timeout(Duration::from_millis(10))
        }),
        ("statement_timeout", |b| {
            b.statement_timeout(Duration::from_secs(10 * 86_400))
        }),
    ];
    for (option, bad) in cases {
        match bad(Broker::builder("sqlite::memory:")).build() {
            Err(BrokerError::InvalidOption { option: o, .. }) => assert_eq!(o, option),
            other => panic!("{option}: {other:?}"),
        }
    }
}

/// Off a Galera cluster the single-writer declaration changes nothing: with it and without,
/// every form the database has starts, FIFO groups included. Fails if the Galera refusal
/// applied to a single server (tried on MariaDB: the row lock form refused there).
fn single_writer_declaration_changes_nothing_off_galera(db: Db) {
    let Some(live) = common::live(db) else { return };
    let forms: &[Form] = if db == Db::Sqlite {
        &[Form::Lease, Form::AdvisoryLock]
    } else {
        &[Form::RowLock, Form::Lease, Form::AdvisoryLock]
    };
    let mut tables = Vec::new();
    for &form in forms {
        tables.push(live.table(form, Duration::from_secs(30)));
        let fifo = common::describe(&common::unique("gf"), form, Duration::from_secs(30));
        tables.push(live.create(fifo.group("g").fifo()));
    }
    for declared in [false, true] {
        let broker = Broker::builder(&live.url)
            .galera_single_writer(declared)
            .build()
            .expect("connect");
        for t in &tables {
            let sub = broker
                .subscription(t)
                .start()
                .unwrap_or_else(|e| panic!("{} (declared {declared}): {e}", t.name()));
            sub.close();
        }
    }
}
per_db!(single_writer_declaration_changes_nothing_off_galera);

/// A message that leaves out a column the advisory key template reads is refused
/// (`InvalidMessage`, naming the column) and nothing is inserted, on every database and through
/// `publish` and `publish_batch` alike; the same column set to NULL on purpose is taken, and a
/// FIFO table's message without its group is taken (a group of its own, as documented).
///
/// Fails (`a message without its key column was published`) without the check in
/// `Message::params_into`: every such row then shared the key `acct-`.
fn messages_without_their_key_column_are_refused(db: Db) {
    let Some(live) = common::live(db) else { return };
    let t = live.create(
        Table::new(common::unique("t"))
            .text_column("tenant")
            .text_column("note")
            .advisory_lock("acct-{tenant}"),
    );
    let without = || Message::new(b"x".to_vec());
    for r in [
        live.broker.publish(&t, without()).map(|_| ()),
        live.broker
            .publish_batch(&t, vec![without().set("tenant", "a"), without()])
            .map(|_| ()),
    ] {
        match r {
            Err(BrokerError::InvalidMessage { reason, .. }) => {
                assert!(reason.contains("\"tenant\""), "{reason}")
            }
            other => panic!("a message without its key column was published: {other:?}"),
        }
    }
    assert_eq!(live.rows(&t), 0, "a refused publish inserted rows");
    live.broker
        .publish(&t, without().set("tenant", sqlbroker::Value::Null))
        .unwrap();
    live.broker
        .publish(&t, without().set("tenant", "a"))
        .unwrap();
    assert_eq!(live.rows(&t), 2);
    let fifo = live.create(
        Table::new(common::unique("t"))
            .text_column("customer")
            .group("customer")
            .fifo()
            .lease(Duration::from_secs(30)),
    );
    live.broker.publish(&fifo, without()).unwrap();
    assert_eq!(live.rows(&fifo), 1);
}
per_db!(messages_without_their_key_column_are_refused);
