//! Dedup keys: while an unfinished row holds a key, a message with the same key makes no row
//! and names the holder; race-free across producers and brokers (a unique index).

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::Db;
use sqlbroker::{BrokerError, Form, Message, Table};

fn keyed(body: &str, key: &str) -> Message {
    Message::new(body.as_bytes().to_vec())
        .set("k", "a")
        .dedup_key(key)
}

fn dedup_table(live: &common::Live, form: Form) -> Table {
    let name = common::unique("t");
    live.create(common::describe(&name, form, Duration::from_secs(30)).dedup())
}

/// A held key makes no row and names its holder; acking or dead-lettering the holder frees it;
/// a message without a key is never a duplicate.
fn a_held_key_is_a_duplicate(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let t = dedup_table(&live, form);
    let first = live.broker.publish(&t, keyed("1", "order-7")).unwrap();
    match live.broker.publish(&t, keyed("2", "order-7")) {
        Err(e @ BrokerError::Duplicate { .. }) => {
            assert!(e.is_duplicate());
            assert_eq!(e.duplicate_of(), Some(first));
        }
        other => panic!("a held key was published again: {other:?}"),
    }
    assert_eq!(live.rows(&t), 1, "the duplicate made a row");
    for _ in 0..2 {
        live.broker
            .publish(&t, Message::new(b"no key".to_vec()).set("k", "a"))
            .unwrap();
    }
    // Acked: the key is free at once.
    let sub = live.broker.subscription(&t).start().unwrap();
    let mut seen = 0;
    while seen < 3 {
        let d = common::next(&sub, Duration::from_secs(10));
        seen += 1;
        if d.id() == first {
            d.ack().unwrap();
        } else {
            d.dead_letter("keyless").unwrap();
        }
    }
    let second = live.broker.publish(&t, keyed("3", "order-7")).unwrap();
    assert_ne!(second, first);
    // Dead-lettered: the key is free too.
    let d = common::next(&sub, Duration::from_secs(10));
    assert_eq!(d.id(), second);
    d.dead_letter("gone").unwrap();
    let third = live.broker.publish(&t, keyed("4", "order-7")).unwrap();
    assert_ne!(third, second);
    assert_eq!(
        live.broker
            .publish(&t, keyed("5", "order-7"))
            .err()
            .and_then(|e| e.duplicate_of()),
        Some(third)
    );
    sub.shutdown(Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("{e}"));
}
per_db_form!(a_held_key_is_a_duplicate);

/// A batch skips messages whose key is held, by a row or by an earlier message of the batch,
/// and counts them.
fn batch_skips_duplicates(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let t = dedup_table(&live, form);
    live.broker.publish(&t, keyed("held", "a")).unwrap();
    let batch = vec![
        keyed("1", "a"), // held by a row
        keyed("2", "b"),
        keyed("3", "b"), // held by the message before it
        keyed("4", "c"),
        Message::new(b"5".to_vec()).set("k", "a"),
    ];
    let done = live.broker.publish_batch(&t, batch).unwrap();
    assert_eq!((done.rows, done.duplicates), (3, 2));
    assert_eq!(live.rows(&t), 4);
    let keys = live.int(&format!(
        "SELECT COUNT(DISTINCT dedup_key) FROM {}",
        t.name()
    ));
    assert_eq!(keys, 3);
}
per_db_form!(batch_skips_duplicates);

/// 8 threads on 2 brokers publish the same 50 keys 20 times each: exactly 50 rows, and every
/// duplicate names the row that holds its key.
fn concurrent_producers_make_one_row_per_key(db: Db) {
    let Some(live) = common::live(db) else { return };
    let t = dedup_table(&live, Form::Lease);
    let brokers = [live.connect(), live.connect()];
    let made: Arc<Mutex<HashMap<String, HashSet<i64>>>> = Arc::default();
    let dups: Arc<Mutex<Vec<(String, i64)>>> = Arc::default();
    let threads: Vec<_> = (0..8)
        .map(|i| {
            let (broker, t, made, dups) = (
                brokers[i % 2].clone(),
                t.clone(),
                made.clone(),
                dups.clone(),
            );
            std::thread::spawn(move || {
                for round in 0..20 {
                    for k in 0..50 {
                        let key = format!("key-{k}");
                        match broker.publish(&t, keyed(&format!("{i}/{round}"), &key)) {
                            Ok(id) => {
                                made.lock().unwrap().entry(key).or_default().insert(id);
                            }
                            Err(e) => {
                                let id = e.duplicate_of().unwrap_or_else(|| panic!("{e}"));
                                dups.lock().unwrap().push((key, id));
                            }
                        }
                    }
                }
            })
        })
        .collect();
    for th in threads {
        th.join().unwrap();
    }
    let made = made.lock().unwrap();
    assert_eq!(live.rows(&t), 50, "not exactly one row per key");
    assert_eq!(made.len(), 50);
    assert!(
        made.values().all(|ids| ids.len() == 1),
        "a key was published twice"
    );
    let dups = dups.lock().unwrap();
    assert_eq!(dups.len(), 8 * 20 * 50 - 50);
    for (key, id) in dups.iter() {
        assert!(
            made[key].contains(id),
            "{key}: duplicate named row {id}, not its holder"
        );
    }
}
per_db!(concurrent_producers_make_one_row_per_key);

/// A dedup key for a table without dedup keys is refused, and nothing is written.
#[test]
fn a_key_needs_a_dedup_table() {
    let Some(live) = common::live(Db::Sqlite) else {
        return;
    };
    let t = live.table(Form::Lease, Duration::from_secs(30));
    match live.broker.publish(&t, keyed("x", "k")) {
        Err(BrokerError::InvalidMessage { reason, .. }) => assert!(reason.contains("dedup")),
        other => panic!("{other:?}"),
    }
    assert_eq!(live.rows(&t), 0);
}

/// A key is held through the whole life of its row: while the row is in a handler, while it
/// waits for a retry, and through the retried attempt; only the ack frees it.
fn a_key_is_held_in_work_and_while_retried(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let t = dedup_table(&live, form);
    let dup_of = |body: &str| {
        live.broker
            .publish(&t, keyed(body, "job-1"))
            .err()
            .and_then(|e| e.duplicate_of())
    };
    let first = live.broker.publish(&t, keyed("1", "job-1")).unwrap();
    let sub = live.broker.subscription(&t).start().unwrap();
    let d = common::next(&sub, Duration::from_secs(10));
    assert_eq!(d.id(), first);
    // In work (leased, row-locked, or under its advisory key): still the holder.
    assert_eq!(
        dup_of("in work"),
        Some(first),
        "a key in work was given away"
    );
    d.retry_after(Duration::from_secs(1)).unwrap();
    // Scheduled for a retry: still the holder.
    assert_eq!(
        dup_of("retrying"),
        Some(first),
        "a retried key was given away"
    );
    let d = common::next(&sub, Duration::from_secs(10));
    assert_eq!((d.id(), d.attempt()), (first, 2));
    assert_eq!(
        dup_of("second attempt"),
        Some(first),
        "a key in its second attempt was given away"
    );
    assert_eq!(live.rows(&t), 1);
    d.ack().unwrap();
    // Acked: the key makes a new row.
    let second = live.broker.publish(&t, keyed("after", "job-1")).unwrap();
    assert_ne!(second, first);
    assert_eq!(live.rows(&t), 1);
    sub.shutdown(Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("{e}"));
}
per_db_form!(a_key_is_held_in_work_and_while_retried);
