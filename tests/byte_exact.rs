//! Values the library compares in SQL compare byte for byte on every database: dedup keys and
//! FIFO group values that differ only in case, trailing spaces or Unicode normalisation are
//! different (MySQL/MariaDB's default collations would make them equal), and a MySQL table
//! made by an earlier release is refused by the schema check until `migrate` converts it.

mod common;

use std::time::Duration;

use common::Db;
use sqlbroker::{BrokerError, Form, Message, Table};

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
    let t = live.create(
        common::describe(&name, form, Duration::from_secs(30))
            .group("g")
            .fifo(),
    );
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
per_db_claim_form!(look_alike_groups_are_different_groups);
