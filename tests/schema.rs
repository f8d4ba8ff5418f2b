//! Schema checks and migration: a table that drifted from its description is refused with a
//! typed error naming what is wrong, `migrate` adds what is missing, and a claim that fails for
//! a reason retrying cannot heal closes its subscription.

mod common;

use std::time::Duration;

use common::Db;
use sqlbroker::{BrokerError, DbErrorKind, Form, Message, Table};

fn schema_problems(r: Result<impl std::fmt::Debug, BrokerError>) -> Vec<String> {
    match r {
        Err(BrokerError::Schema { problems, .. }) => problems,
        other => panic!("expected a schema error, got {other:?}"),
    }
}

/// An earlier version's table (no priorities, no dedup keys) is refused by a description that
/// has them, until `migrate` adds the columns and the dedup index, rebuilds the ready index in
/// the new claim order (priority first), and records the new description. Fails without the
/// rebuild (`ready_by_priority`: 0, tried).
fn migrate_adds_what_an_older_table_lacks(db: Db) {
    let Some(live) = common::live(db) else { return };
    let name = common::unique("t");
    let old = live.create(common::describe(
        &name,
        Form::Lease,
        Duration::from_secs(30),
    ));
    live.broker.publish(&old, common::msg("old", "a")).unwrap();
    let new = common::describe(&name, Form::Lease, Duration::from_secs(30))
        .priorities()
        .dedup();

    // The table's record (made by create_table) names how the descriptions differ; the
    // columns' check names what the table lacks.
    let problems = schema_problems(live.broker.subscription(&new).start());
    assert_eq!(
        problems,
        [
            "dedup is recorded as false, described as true",
            "priorities is recorded as false, described as true"
        ]
    );
    assert_eq!(
        schema_problems(live.broker.create_table(&new)),
        ["column priority is missing", "column dedup_key is missing"]
    );

    // The ready index found by name is in the old claim order: without a rebuild every claim
    // would sort the backlog by priority.
    let ready_by_priority = || {
        live.int(&match db {
            Db::Postgres => format!(
                "SELECT COUNT(*) FROM pg_indexes WHERE indexname = '{name}_ready' \
                 AND indexdef LIKE '%priority DESC, run_at, id%'"
            ),
            Db::Mysql => format!(
                "SELECT COUNT(*) FROM information_schema.statistics WHERE table_schema = \
                 DATABASE() AND table_name = '{name}' AND index_name = '{name}_ready' \
                 AND column_name = 'priority' AND seq_in_index = 2"
            ),
            Db::Sqlite => format!(
                "SELECT COUNT(*) FROM sqlite_master WHERE name = '{name}_ready' \
                 AND sql LIKE '%\"priority\" DESC, \"run_at\", \"id\"%'"
            ),
        })
    };
    assert_eq!(ready_by_priority(), 0);
    let done = live.broker.migrate(&new).unwrap();
    assert_eq!(
        done,
        [
            "added column priority",
            "added column dedup_key",
            &format!("rebuilt index {name}_ready in priority order")
        ]
    );
    assert_eq!(ready_by_priority(), 1, "the ready index is in claim order");
    assert!(
        live.broker.migrate(&new).unwrap().is_empty(),
        "not idempotent"
    );
    // The dedup index came with it: a second unfinished row with the key is refused.
    let msg = || Message::new(b"x".to_vec()).set("k", "b").dedup_key("once");
    live.broker.publish(&new, msg().priority(5)).unwrap();
    assert!(live.broker.publish(&new, msg()).unwrap_err().is_duplicate());
    // The old row is there, and the new description works it.
    // One row per claim: rows of one claim are delivered in the order the database returns
    // them, which need not be the claim's order.
    let sub = live
        .broker
        .subscription(&new)
        .batch_size(1)
        .start()
        .unwrap();
    let first = common::next(&sub, Duration::from_secs(10));
    assert_eq!(first.payload(), b"x", "priority 5 comes first");
    first.ack().unwrap();
    let second = common::next(&sub, Duration::from_secs(10));
    assert_eq!(second.payload(), b"old");
    second.ack().unwrap();
    sub.shutdown(Duration::from_secs(5)).unwrap();
}
per_db!(migrate_adds_what_an_older_table_lacks);

/// A table made without `fair` by its DDL alone (no record: a migration tool's, an earlier
/// release's), then given a fair description by `create_table`: the table gets the index the
/// description names (`<table>_fair`), and fair claims deliver every row. A review's probe:
/// on MySQL the index sits inside `CREATE TABLE IF NOT EXISTS`, which does nothing on a table
/// that is there, and a fair key's read names the index by force, so every claim failed and
/// nothing was delivered (0 of 10 in 20 s). Every form: each reads the fair heads. Fails
/// without the indexes added on an existing table.
fn an_unrecorded_table_takes_a_fair_description(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let name = common::unique("t");
    let plain = common::describe(&name, form, Duration::from_secs(30));
    live.track(&name);
    for stmt in live.broker.create_table_sql(&plain).unwrap() {
        if !stmt.contains("sqlbroker_tables") {
            live.exec(&stmt);
        }
    }
    let fair = common::describe(&name, form, Duration::from_secs(30)).fair("{k}");
    live.broker.create_table(&fair).unwrap();
    for i in 0..10 {
        let k = if i % 2 == 0 { "a" } else { "b" };
        live.broker.publish(&fair, common::msg("x", k)).unwrap();
    }
    let sub = live.broker.subscription(&fair).start().unwrap();
    for _ in 0..10 {
        common::next(&sub, Duration::from_secs(10)).ack().unwrap();
    }
    sub.shutdown(Duration::from_secs(5)).unwrap();
}
per_db_form!(an_unrecorded_table_takes_a_fair_description);

/// A column of a type the statements cannot use is named, and `migrate` does not touch it.
fn a_mistyped_column_is_named(db: Db) {
    let Some(live) = common::live(db) else { return };
    let name = common::unique("t");
    live.track(&name);
    let (id, time) = match db {
        Db::Postgres => (
            "BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY",
            "TIMESTAMPTZ",
        ),
        Db::Mysql => ("BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY", "DATETIME"),
        Db::Sqlite => ("INTEGER PRIMARY KEY AUTOINCREMENT", "INTEGER"),
    };
    live.exec(&format!(
        "CREATE TABLE {name} (id {id}, payload TEXT NOT NULL, attempts INTEGER NOT NULL DEFAULT 0, \
         run_at TEXT NOT NULL, locked_until {time}, dead_at TEXT, dead_reason TEXT, \
         last_error TEXT, errors INTEGER NOT NULL DEFAULT 0, \
         cancel_requested INTEGER NOT NULL DEFAULT 0, created_at {time})"
    ));
    let t = Table::new(&name).lease(Duration::from_secs(30));
    let problems = schema_problems(live.broker.subscription(&t).start());
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(problems[0].starts_with("column run_at is "), "{problems:?}");
    assert!(
        problems[1].starts_with("column dead_at is "),
        "{problems:?}"
    );
    schema_problems(live.broker.migrate(&t));
}
per_db!(a_mistyped_column_is_named);

/// A column dropped under a running subscription: its claims cannot succeed again, so it
/// closes with the error instead of retrying for ever.
fn a_claim_that_cannot_heal_closes_the_subscription(db: Db) {
    let Some(live) = common::live(db) else { return };
    let t = live.table(Form::Lease, Duration::from_secs(30));
    let sub = live
        .broker
        .subscription(&t)
        .poll_interval(Duration::from_millis(20))
        .start()
        .unwrap();
    live.exec(&format!("ALTER TABLE {} DROP COLUMN k", t.name()));
    // A ready row, inserted by another tool: the claims must read it, and cannot.
    let now = match db {
        Db::Postgres => "now()",
        Db::Mysql => "UTC_TIMESTAMP()",
        Db::Sqlite => "0",
    };
    live.exec(&format!(
        "INSERT INTO {} (payload, run_at) VALUES ({}, {now})",
        t.name(),
        match db {
            Db::Postgres => "'\\x00'::bytea",
            _ => "x'00'",
        }
    ));
    let closed = common::wait_for(Duration::from_secs(10), || sub.is_closed());
    assert!(closed, "still retrying: {:?}", sub.last_error());
    // The iterator's end, and the reason reachable from it.
    assert!(sub.next_delivery().is_none());
    let e = sub.closed_by().expect("the reason the subscription closed");
    assert!(
        matches!(
            &*e,
            BrokerError::Database {
                kind: DbErrorKind::Schema,
                ..
            }
        ),
        "{e}"
    );
    assert!(!e.is_transient());
}
per_db!(a_claim_that_cannot_heal_closes_the_subscription);

/// A plain close has no reason: `closed_by` stays `None`, though an earlier error may linger
/// in `last_error`.
fn a_plain_close_has_no_reason(db: Db) {
    let Some(live) = common::live(db) else { return };
    let t = live.table(Form::Lease, Duration::from_secs(30));
    let sub = live.broker.subscription(&t).start().unwrap();
    assert!(sub.closed_by().is_none());
    sub.close();
    assert!(sub.next_delivery().is_none());
    assert!(sub.closed_by().is_none(), "{:?}", sub.closed_by());
}
per_db!(a_plain_close_has_no_reason);

/// A publish to a table never made says what to do, as a subscription does, instead of the
/// driver's words; one and batch alike.
fn a_publish_before_create_table_says_so(db: Db) {
    let Some(live) = common::live(db) else { return };
    let t = Table::new(common::unique("never_made").as_str()).lease(Duration::from_secs(30));
    let says = |r: Result<(), BrokerError>| match r {
        Err(BrokerError::Schema { problems, .. }) => {
            assert!(
                problems[0].contains("create_table makes it"),
                "{problems:?}"
            )
        }
        other => panic!("not a schema error: {other:?}"),
    };
    says(
        live.broker
            .publish(&t, Message::new(b"x".to_vec()))
            .map(drop),
    );
    says(
        live.broker
            .publish_batch(
                &t,
                [Message::new(b"x".to_vec()), Message::new(b"y".to_vec())],
            )
            .map(drop),
    );
}
per_db!(a_publish_before_create_table_says_so);
