//! Self-describing tables: `create_table` and `migrate` record the description, `open_table`
//! reads it back in another broker, and a description that disagrees with the record (or,
//! with no record, with the table's columns) is refused by publish, subscriptions and stats,
//! on every database x form.

mod common;

use std::time::Duration;

use common::Db;
use sqlbroker::{BrokerError, Form, Isolation, Message, Role, Table};

const LEASE: Duration = Duration::from_secs(30);

/// The problems of a `Schema` error, or a panic naming what came instead.
fn schema_problems<T: std::fmt::Debug>(r: sqlbroker::Result<T>) -> Vec<String> {
    match r {
        Err(BrokerError::Schema { problems, .. }) => problems,
        other => panic!("expected a schema error, got {other:?}"),
    }
}

/// Another form's description of the same table, and how the record's form reads.
fn other_form(name: &str, form: Form) -> (Table, String) {
    match form {
        Form::Lease => (
            Table::new(name).text_column("k"),
            "recorded as lease 30s, described as row lock".into(),
        ),
        Form::RowLock => (
            common::describe(name, Form::Lease, LEASE),
            "recorded as row lock, described as lease 30s".into(),
        ),
        _ => (
            common::describe(name, Form::Lease, LEASE),
            format!("recorded as advisory lock \"{name}-{{k}}\", described as lease 30s"),
        ),
    }
}

/// A table described in another form than its record is refused by publish, batch publish,
/// subscriptions and stats of another broker, naming the difference, and nothing is written;
/// `open_table` gives the description that works.
///
/// Fails (`publish of another form was accepted`) when the check is skipped: tried by
/// starting every queue as checked (`described: true`).
fn a_table_described_in_another_form_is_refused(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let t = live.table(form, LEASE);
    let other = live.connect();
    let (wrong, difference) = other_form(t.name(), form);
    let difference = [difference];

    let published = other.publish(&wrong, common::msg("x", "a"));
    assert!(published.is_err(), "publish of another form was accepted");
    assert_eq!(schema_problems(published), difference);
    let batch = other.publish_batch(&wrong, [common::msg("y", "b")]);
    assert_eq!(schema_problems(batch), difference);
    let started = other.subscription(&wrong).start();
    assert_eq!(schema_problems(started), difference);
    assert_eq!(schema_problems(other.stats(&wrong)), difference);
    assert_eq!(live.rows(&t), 0, "a refused publish wrote a row");

    let opened = other.open_table(t.name()).unwrap();
    assert_eq!(opened, t);
    other.publish(&opened, common::msg("ok", "a")).unwrap();
    assert_eq!(live.rows(&t), 1);
}
per_db_form!(a_table_described_in_another_form_is_refused);

/// Issue 16's defect, for a table with no record (made by the previous release): a lease
/// table opened as `Table::new(same)` ran one row in two subscriptions. Its `locked_until`
/// column now refuses the row lock description (by publish, start and migrate); `migrate`
/// gives it its record, after which the record refuses it (migrate too: a table keeps its
/// form). A row lock table with no record is accepted as row lock.
///
/// Fails (`a lease table was accepted as row lock`) without the column inference: tried by
/// treating a table with no record as always matching.
fn a_lease_table_without_a_record_refuses_row_lock(db: Db) {
    let Some(live) = common::live(db) else { return };
    let t = live.table(Form::Lease, LEASE);
    live.exec(&format!(
        "DELETE FROM sqlbroker_tables WHERE name = '{}'",
        t.name()
    ));
    let fresh = live.connect();
    let plain = Table::new(t.name()).text_column("k");
    let published = fresh.publish(&plain, common::msg("x", "a"));
    assert!(published.is_err(), "a lease table was accepted as row lock");
    let problems = schema_problems(published);
    assert_eq!(
        problems,
        [
            "the table has no record, and its locked_until column makes it a lease table, \
          described as row lock"
        ]
    );
    assert_eq!(
        schema_problems(fresh.subscription(&plain).start()),
        problems
    );
    assert_eq!(live.rows(&t), 0);
    assert!(matches!(
        fresh.open_table(t.name()),
        Err(BrokerError::UnknownTable { .. })
    ));

    // Nor may migrate record it as row lock (SQLite: no row lock form at all) ...
    match db {
        Db::Sqlite => assert!(matches!(
            fresh.migrate(&plain),
            Err(BrokerError::Unsupported { .. })
        )),
        _ => assert_eq!(schema_problems(fresh.migrate(&plain)), problems),
    }
    // ... but the previous release's table gets its record from migrate.
    assert!(fresh.migrate(&t).unwrap().is_empty());
    assert_eq!(fresh.open_table(t.name()).unwrap(), t);
    assert_eq!(
        schema_problems(live.connect().publish(&plain, common::msg("x", "a"))),
        ["recorded as lease 30s, described as row lock"]
    );
    if db != Db::Sqlite {
        let refused = schema_problems(live.connect().migrate(&plain));
        assert_eq!(refused.len(), 1);
        assert!(
            refused[0].starts_with(
                "recorded as lease 30s, described as row lock: migrate does not change a \
                 table's form"
            ),
            "{refused:?}"
        );
    }
    assert_eq!(
        fresh.open_table(t.name()).unwrap(),
        t,
        "a refused migrate changed the record"
    );

    // A row lock table with no record: accepted as row lock (the servers: SQLite has none).
    if db == Db::Sqlite {
        return;
    }
    let r = live.table(Form::RowLock, LEASE);
    live.exec(&format!(
        "DELETE FROM sqlbroker_tables WHERE name = '{}'",
        r.name()
    ));
    live.connect().publish(&r, common::msg("x", "a")).unwrap();
    assert_eq!(live.rows(&r), 1);
}
per_db!(a_lease_table_without_a_record_refuses_row_lock);

/// Every option of a description survives the record: `open_table` in another broker gives
/// a table equal to the one created, which publishes to subscribers of the original.
///
/// Fails (`assert_eq!(opened, t)`) when an option is left out of the record: tried with
/// `max_attempts` not written.
fn open_table_reads_back_every_option(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let name = common::unique("o");
    let mut t = common::describe(&name, form, LEASE)
        .int_column("n")
        .float_column("f")
        .bytes_column("b")
        .rename(Role::Payload, "body")
        .rename(Role::DeadReason, "why")
        .dedup()
        .max_attempts(5)
        .keep_completed(Duration::from_secs(86_400))
        .isolation(Isolation::RepeatableRead);
    if form != Form::AdvisoryLock {
        t = t.priorities().group("g").fifo();
    }
    let t = live.create(t);
    let other = live.connect();
    let opened = other.open_table(&name).unwrap();
    assert_eq!(opened, t);
    assert_eq!(opened.form(), form);
    let m = common::msg("body", "k1").set("n", 7).dedup_key("d1");
    other.publish(&opened, m).unwrap();
    let sub = match form {
        Form::RowLock => live.broker.subscription(&t),
        _ => live.broker.subscription(&t).batch_size(1),
    }
    .start()
    .unwrap();
    let d = common::next(&sub, Duration::from_secs(10));
    assert_eq!(d.payload(), b"body");
    assert_eq!(d.get("n").and_then(|v| v.as_i64()), Some(7));
    d.ack().unwrap();
    sub.shutdown(Duration::from_secs(5)).unwrap();
}
per_db_form!(open_table_reads_back_every_option);

/// Bad input changes nothing: an unknown name, a name that is no identifier, and a record
/// written by a newer release; a pause of a table with no record records it first.
///
/// Fails (`UnknownTable` expected) when a name with no record opens as a default
/// description: tried with `open_table` returning `Table::new(name)` for no record.
fn unknown_names_and_newer_records_are_refused(db: Db) {
    let Some(live) = common::live(db) else { return };
    let nope = common::unique("nope");
    match live.broker.open_table(&nope) {
        Err(BrokerError::UnknownTable { table }) => assert_eq!(table, nope),
        other => panic!("UnknownTable expected, got {other:?}"),
    }
    assert!(matches!(
        live.broker.open_table("no such; table"),
        Err(BrokerError::InvalidTable { .. })
    ));
    assert!(matches!(
        live.broker.pause(&Table::new(nope.as_str())),
        Err(BrokerError::UnknownTable { .. })
    ));

    // A table with no record: its first use (here a pause) gives it the description used as
    // its record, then pauses it.
    let t = live.table(Form::Lease, LEASE);
    let unrecorded = format!(
        "SELECT COUNT(*) FROM sqlbroker_tables WHERE name = '{}'",
        t.name()
    );
    live.exec(&format!(
        "DELETE FROM sqlbroker_tables WHERE name = '{}'",
        t.name()
    ));
    live.connect().pause(&t).unwrap();
    assert_eq!(live.int(&unrecorded), 1);
    assert_eq!(live.connect().open_table(t.name()).unwrap(), t);

    // A record of a newer format: refused by open_table and by any use of the table.
    let n = live.table(Form::Lease, LEASE);
    live.exec(&format!(
        "UPDATE sqlbroker_tables SET format = 99 WHERE name = '{}'",
        n.name()
    ));
    let fresh = live.connect();
    for problems in [
        schema_problems(fresh.open_table(n.name())),
        schema_problems(fresh.publish(&n, Message::new(b"x".to_vec()).set("k", "a"))),
    ] {
        assert_eq!(problems.len(), 1);
        assert!(
            problems[0].contains("newer sqlbroker (record format 99"),
            "{problems:?}"
        );
    }
    assert_eq!(live.rows(&n), 0);
    assert!(fresh
        .tables()
        .unwrap()
        .iter()
        .all(|r| r.table.name() != n.name()));
}
per_db!(unknown_names_and_newer_records_are_refused);

/// `tables` lists the recorded tables with their descriptions and pause flags.
///
/// Fails (`paused` asserted) when the flag is not read from the registry: tried with
/// `paused: false` in `tables`.
fn tables_lists_descriptions_and_pauses(db: Db) {
    let Some(live) = common::live(db) else { return };
    let a = live.table(Form::Lease, LEASE);
    let b = live.table(Form::AdvisoryLock, LEASE);
    live.broker.pause(&b).unwrap();
    let all = live.connect().tables().unwrap();
    let find = |t: &Table| {
        all.iter()
            .find(|r| r.table.name() == t.name())
            .unwrap_or_else(|| panic!("{} not listed", t.name()))
    };
    assert_eq!((&find(&a).table, find(&a).paused), (&a, false));
    assert_eq!((&find(&b).table, find(&b).paused), (&b, true));
    assert!(live.broker.stats(&b).unwrap().paused);
    live.broker.resume(&b).unwrap();
    assert!(!live.connect().stats(&b).unwrap().paused);
}
per_db!(tables_lists_descriptions_and_pauses);

/// A table with no record is given the first description used on it as its record: another
/// description of it (here FIFO against not, and advisory against row lock) is then refused
/// by every broker, whichever order they come in, and `open_table` reads the first.
///
/// Fails when `verify` does not record what it accepted (tried by skipping `adopt`: the
/// `open_table` after the first publish finds no record, `UnknownTable`); the second
/// description's refusal is asserted after it.
fn an_unrecorded_table_keeps_the_first_description_used(db: Db) {
    let Some(live) = common::live(db) else { return };
    let name = common::unique("t");
    let fifo = Table::new(&name)
        .text_column("k")
        .group("g")
        .fifo()
        .lease(LEASE);
    let plain = Table::new(&name)
        .text_column("k")
        .text_column("g")
        .lease(LEASE);
    for (first, second) in [(&fifo, &plain), (&plain, &fifo)] {
        let _ = live.create(first.clone());
        live.exec(&format!(
            "DELETE FROM sqlbroker_tables WHERE name = '{name}'"
        ));
        let a = live.connect();
        a.publish(
            first,
            Message::new(b"x".to_vec()).set("k", "a").set("g", "g1"),
        )
        .unwrap();
        assert_eq!(live.connect().open_table(&name).unwrap(), *first);
        let b = live.connect();
        let refused = b.publish(
            second,
            Message::new(b"y".to_vec()).set("k", "a").set("g", "g1"),
        );
        assert!(
            refused.is_err(),
            "a second description of an unrecorded table was accepted"
        );
        assert!(!schema_problems(refused).is_empty());
        assert!(b.subscription(second).start().is_err());
        assert_eq!(live.rows(first), 1, "the refused publish wrote");
        live.exec(&format!("DROP TABLE {name}"));
    }
    if db == Db::Sqlite {
        return; // SQLite has no row lock form: the advisory and row lock case needs one.
    }
    // Advisory first: a row lock description (no column tells them apart once recorded) is
    // refused; and a row lock description of an advisory-made table is refused by its
    // cancel_requested column before any record.
    let adv = live.table(Form::AdvisoryLock, LEASE);
    live.exec(&format!(
        "DELETE FROM sqlbroker_tables WHERE name = '{}'",
        adv.name()
    ));
    let row_lock = Table::new(adv.name()).text_column("k");
    assert_eq!(
        schema_problems(live.connect().publish(&row_lock, common::msg("x", "a"))),
        [
            "the table has no record, and its cancel_requested column makes it an advisory lock \
          table, described as row lock"
        ]
    );
    live.connect().publish(&adv, common::msg("x", "a")).unwrap();
    assert_eq!(live.connect().open_table(adv.name()).unwrap(), adv);
}
per_db!(an_unrecorded_table_keeps_the_first_description_used);

/// Brokers that create one new table at the same moment with different descriptions: one
/// records its own and succeeds, the others are refused with the differences (they would
/// otherwise each run their own form on one table), and the record is the winner's. Several
/// rounds, each on a new table, with the creators released together.
///
/// Fails (`2 descriptions of one new table were accepted`) with the record written by an
/// upsert (last writer wins): tried with `record_created` replaced by the old upsert.
fn concurrent_creators_keep_one_description(db: Db) {
    let Some(live) = common::live(db) else { return };
    let mut accepted_total = 0;
    for _ in 0..4 {
        let name = common::unique("t");
        live.track(&name);
        let forms = [
            common::describe(&name, Form::Lease, LEASE),
            common::describe(&name, Form::AdvisoryLock, LEASE),
            common::describe(&name, Form::Lease, Duration::from_secs(60)),
        ];
        let barrier = std::sync::Arc::new(std::sync::Barrier::new(forms.len()));
        let threads: Vec<_> = forms
            .iter()
            .cloned()
            .map(|t| {
                let broker = live.connect();
                let barrier = barrier.clone();
                std::thread::spawn(move || {
                    barrier.wait();
                    (t.clone(), broker.create_table(&t))
                })
            })
            .collect();
        let results: Vec<_> = threads.into_iter().map(|h| h.join().unwrap()).collect();
        let ok: Vec<&Table> = results
            .iter()
            .filter(|(_, r)| r.is_ok())
            .map(|(t, _)| t)
            .collect();
        assert_eq!(
            ok.len(),
            1,
            "{} descriptions of one new table were accepted: {results:?}",
            ok.len()
        );
        for (_, r) in results.iter().filter(|(_, r)| r.is_err()) {
            match r {
                Err(BrokerError::Schema { .. }) => {}
                // Two creators' DDL colliding is a transient error on PostgreSQL: also a
                // refusal, changing nothing.
                Err(e) if e.is_transient() => {}
                other => panic!("a losing creator got {other:?}"),
            }
        }
        assert_eq!(live.connect().open_table(&name).unwrap(), *ok[0]);
        accepted_total += ok.len();
    }
    assert_eq!(accepted_total, 4);
}
per_db!(concurrent_creators_keep_one_description);
