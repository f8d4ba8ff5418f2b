//! Values the library compares in SQL compare byte for byte on every database: dedup keys and
//! FIFO group values that differ only in case, trailing spaces or Unicode normalisation are
//! different (MySQL/MariaDB's default collations would make them equal), and a MySQL table
//! made by an earlier release is refused by the schema check until `migrate` converts it.

mod common;

use std::time::Duration;

use common::Db;
use sqlbroker::{BrokerError, Form, Message};

/// "é" precomposed (NFC) and decomposed (NFD: "e" and a combining acute accent).
const NFC: &str = "caf\u{e9}";
const NFD: &str = "cafe\u{301}";

fn keyed(key: &str) -> Message {
    Message::new(key.as_bytes().to_vec())
        .set("k", "a")
        .dedup_key(key)
}

/// Keys differing only in case, trailing spaces or normalisation each make a row; publishing
/// one of them again names its own row, not a look-alike.
fn look_alike_keys_are_different_keys(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let t =
        live.create(common::describe(&common::unique("t"), form, Duration::from_secs(30)).dedup());
    let keys = ["order-1", "Order-1", "ORDER-1", "k", "k ", "k  ", NFC, NFD];
    let ids: Vec<i64> = keys
        .iter()
        .map(|k| {
            live.broker
                .publish(&t, keyed(k))
                // Fails on MariaDB's default collation: "Order-1" is `Duplicate` of "order-1".
                .unwrap_or_else(|e| panic!("{k:?}: {e}"))
        })
        .collect();
    assert_eq!(live.rows(&t), keys.len() as i64);
    for (k, id) in keys.iter().zip(&ids) {
        let again = live.broker.publish(&t, keyed(k));
        assert_eq!(
            again.as_ref().err().and_then(BrokerError::duplicate_of),
            Some(*id),
            "{k:?} published again: {again:?}"
        );
    }
    assert_eq!(live.rows(&t), keys.len() as i64);
}
per_db_form!(look_alike_keys_are_different_keys);

/// A batch of keys differing only in case makes a row for each; only the exact repeat is a
/// duplicate.
fn a_batch_of_look_alike_keys_makes_a_row_each(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let t =
        live.create(common::describe(&common::unique("t"), form, Duration::from_secs(30)).dedup());
    let done = live
        .broker
        .publish_batch(
            &t,
            vec![
                keyed("Batch"),
                keyed("BATCH"),
                keyed("Batch "),
                keyed("Batch"),
            ],
        )
        .unwrap();
    // MariaDB's default collation: (1, 3), a distinct job silently never existed.
    assert_eq!((done.rows, done.duplicates), (3, 1));
    assert_eq!(live.rows(&t), 3);
}
per_db_form!(a_batch_of_look_alike_keys_makes_a_row_each);

/// FIFO groups "A", "a", "A " and "a" in NFC/NFD are five groups: their heads are worked in
/// parallel, while a second row of group "A" waits for its head.
fn look_alike_groups_are_different_groups(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let name = common::unique("t");
    let t = common::describe(&name, form, Duration::from_secs(30))
        .group("g")
        .fifo();
    // The advisory form: the natural template, the group column as the key, so the keys of
    // look-alike groups must be different keys too.
    let t = live.create(match form {
        Form::AdvisoryLock => t.advisory_lock(format!("{name}-{{g}}")),
        _ => t,
    });
    let groups = ["A", "a", "A ", NFC, NFD];
    for g in groups {
        let m = Message::new(format!("{g}#1").into_bytes()).set("g", g);
        live.broker.publish(&t, m).unwrap();
    }
    live.broker
        .publish(&t, Message::new(b"A#2".to_vec()).set("g", "A"))
        .unwrap();
    // A slot per group: in the row lock form each row in work holds a connection.
    let sub = live
        .broker
        .subscription(&t)
        .workers(groups.len())
        .start()
        .unwrap();
    // Held, not settled: every head stays in work while the next ones are claimed.
    // With groups compared by collation, "a" and "A " wait behind "A": `next` panics here.
    let held: Vec<_> = (0..groups.len())
        .map(|_| common::next(&sub, Duration::from_secs(10)))
        .collect();
    let mut heads: Vec<Vec<u8>> = held.iter().map(|d| d.payload().to_vec()).collect();
    heads.sort();
    let mut want: Vec<Vec<u8>> = groups
        .iter()
        .map(|g| format!("{g}#1").into_bytes())
        .collect();
    want.sort();
    assert_eq!(heads, want);
    // "A#2" waits for its head, which is still in work.
    if let Ok(d) = sub.next_delivery_timeout(Duration::from_millis(300)) {
        panic!("{:?} ran beside its group's head", d.payload());
    }
    for d in held {
        d.ack().unwrap();
    }
    let next = common::next(&sub, Duration::from_secs(10));
    assert_eq!(next.payload(), b"A#2");
    next.ack().unwrap();
    sub.shutdown(Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("{e}"));
}
per_db_form!(look_alike_groups_are_different_groups);

/// The previous release's DDL of a lease table with dedup keys and FIFO group `g`, as it made
/// it on each database (MySQL: text in the database's default collation, here MariaDB's
/// case-insensitive, space-padding `utf8mb4_general_ci`).
fn old_ddl(db: Db, t: &str) -> Vec<String> {
    match db {
        Db::Mysql => vec![format!(
            "CREATE TABLE IF NOT EXISTS `{t}` (`id` BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY, \
             `payload` LONGBLOB NOT NULL, `attempts` INT NOT NULL DEFAULT 0, \
             `run_at` DATETIME NOT NULL DEFAULT CURRENT_TIMESTAMP, `locked_until` DATETIME NULL, \
             `dead_at` DATETIME NULL, `dead_reason` MEDIUMTEXT NULL, `dedup_key` VARCHAR(255) NULL, \
             `k` VARCHAR(255) NULL, `g` VARCHAR(255) NULL, \
             INDEX `{t}_ready` (`dead_at`, `run_at`, `id`), UNIQUE KEY `{t}_dedup` (`dedup_key`), \
             INDEX `{t}_group` (`g`, `dead_at`, `id`)) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4"
        )],
        Db::Postgres => vec![
            format!(
                "CREATE TABLE IF NOT EXISTS \"{t}\" (\"id\" BIGINT GENERATED BY DEFAULT AS IDENTITY \
                 PRIMARY KEY, \"payload\" BYTEA NOT NULL, \"attempts\" INTEGER NOT NULL DEFAULT 0, \
                 \"run_at\" TIMESTAMPTZ NOT NULL DEFAULT date_trunc('second', now()), \
                 \"locked_until\" TIMESTAMPTZ, \"dead_at\" TIMESTAMPTZ, \"dead_reason\" TEXT, \
                 \"dedup_key\" TEXT, \"k\" TEXT, \"g\" TEXT)"
            ),
            format!(
                "CREATE INDEX IF NOT EXISTS \"{t}_ready\" ON \"{t}\" (\"run_at\", \"id\") \
                 WHERE \"dead_at\" IS NULL"
            ),
            format!("CREATE UNIQUE INDEX IF NOT EXISTS \"{t}_dedup\" ON \"{t}\" (\"dedup_key\")"),
        ],
        Db::Sqlite => vec![
            format!(
                "CREATE TABLE IF NOT EXISTS \"{t}\" (\"id\" INTEGER PRIMARY KEY AUTOINCREMENT, \
                 \"payload\" BLOB NOT NULL, \"attempts\" INTEGER NOT NULL DEFAULT 0, \
                 \"run_at\" INTEGER NOT NULL, \"locked_until\" INTEGER, \"dead_at\" INTEGER, \
                 \"dead_reason\" TEXT, \"dedup_key\" TEXT, \"k\" TEXT, \"g\" TEXT)"
            ),
            format!(
                "CREATE INDEX IF NOT EXISTS \"{t}_ready\" ON \"{t}\" (\"run_at\", \"id\") \
                 WHERE \"dead_at\" IS NULL"
            ),
            format!("CREATE UNIQUE INDEX IF NOT EXISTS \"{t}_dedup\" ON \"{t}\" (\"dedup_key\")"),
        ],
    }
}

/// A table made by the previous release: on MySQL its keys and groups compare by collation
/// (shown first), the schema check refuses it, and `migrate` converts the dedup key and the
/// group, keeping the rows; then keys compare byte for byte, as they always did on PostgreSQL
/// and SQLite, where `migrate` converts nothing.
fn migrate_brings_an_old_table_to_byte_exact_text(db: Db) {
    let Some(live) = common::live(db) else { return };
    let name = common::unique("t");
    live.track(&name);
    for stmt in old_ddl(db, &name) {
        live.exec(&stmt);
    }
    let t = common::describe(&name, Form::Lease, Duration::from_secs(30))
        .group("g")
        .fifo()
        .dedup();
    // The old table as the previous release wrote it (by hand: this release's inserts also
    // write the publish time, a column the old table lacks): only MySQL's collation makes
    // "Order-1" a duplicate of "order-1".
    let (payload, now, ignore, or_skip) = match db {
        Db::Postgres => ("'\\x00'::bytea", "now()", "", " ON CONFLICT DO NOTHING"),
        Db::Mysql => ("x'00'", "UTC_TIMESTAMP()", " IGNORE", ""),
        Db::Sqlite => ("x'00'", "0", "", " ON CONFLICT DO NOTHING"),
    };
    for key in ["order-1", "Order-1"] {
        live.exec(&format!(
            "INSERT{ignore} INTO {name} (payload, run_at, k, dedup_key) \
             VALUES ({payload}, {now}, 'a', '{key}'){or_skip}"
        ));
    }
    let held = live.rows_where(&t, "dedup_key IS NOT NULL");
    assert_eq!(
        held,
        if db == Db::Mysql { 1 } else { 2 },
        "rows the two keys made"
    );
    let first = live.int(&format!("SELECT MIN(id) FROM {name}"));
    let check = live.broker.subscription(&t).start().map(drop);
    // The previous release had no error history, cancel requests nor publish time: every
    // database names those columns first.
    let added = ["last_error", "errors", "cancel_requested", "created_at"];
    let check = match check {
        Err(BrokerError::Schema { problems, .. }) => {
            let missing: Vec<String> = added
                .iter()
                .map(|c| format!("column {c} is missing"))
                .collect();
            assert_eq!(problems[..added.len()], missing[..], "{problems:?}");
            let rest = problems[added.len()..].to_vec();
            if rest.is_empty() {
                Ok(())
            } else {
                Err(BrokerError::Schema {
                    table: name.clone(),
                    problems: rest,
                })
            }
        }
        other => panic!("the old table was accepted: {other:?}"),
    };
    if db == Db::Mysql {
        match check {
            // Fails if the schema check lets the old collation through.
            Err(BrokerError::Schema { problems, .. }) => {
                assert_eq!(problems.len(), 2, "{problems:?}");
                for (p, col) in problems.iter().zip(["dedup_key", "g"]) {
                    assert!(
                        p.starts_with(&format!("column {col} compares text by collation"))
                            && p.contains("Broker::migrate"),
                        "{p}"
                    );
                }
            }
            other => panic!("the old MySQL table was accepted: {other:?}"),
        }
    } else {
        check.unwrap();
    }
    let rows = live.rows(&t);
    let done = live.broker.migrate(&t).unwrap();
    let converted: Vec<&str> = done
        .iter()
        .filter(|d| d.starts_with("converted column"))
        .map(String::as_str)
        .collect();
    let want: &[&str] = if db == Db::Mysql {
        &[
            "converted column dedup_key to byte-exact text",
            "converted column g to byte-exact text",
        ]
    } else {
        &[]
    };
    // Fails if migrate leaves the old collation (or converts what needs no conversion).
    assert_eq!(converted, want, "{done:?}");
    assert_eq!(live.rows(&t), rows, "the migration lost rows");
    assert!(
        live.broker.migrate(&t).unwrap().is_empty(),
        "not idempotent"
    );
    // Byte for byte now: "ORDER-1" and "order-1 " are new keys, "order-1" is still held.
    for k in ["ORDER-1", "order-1 "] {
        live.broker
            .publish(&t, keyed(k))
            .unwrap_or_else(|e| panic!("{k:?} after migrate: {e}"));
    }
    assert_eq!(
        live.broker
            .publish(&t, keyed("order-1"))
            .err()
            .and_then(|e| e.duplicate_of()),
        Some(first)
    );
    // And the schema check takes the table.
    let sub = live.broker.subscription(&t).start().unwrap();
    sub.shutdown(Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("{e}"));
}
per_db!(migrate_brings_an_old_table_to_byte_exact_text);
