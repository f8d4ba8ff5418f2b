//! The advisory lock form's promises: rows with equal keys are worked one at a time, rows with
//! different keys in parallel, and keys belong to the database: two tables whose rows render the
//! same key wait for each other.

mod common;

use std::collections::HashSet;
use std::time::Duration;

use common::{key_of, Db};
use sqlbroker::{Delivery, Form, Message, NextError, Subscription, Table};

fn next(sub: &Subscription) -> Delivery {
    common::next(sub, Duration::from_secs(10))
}

/// Two rows with key `a`, one with key `b`: with the first `a` held, `b` is delivered and the
/// second `a` is not, until the first settles.
fn equal_keys_run_one_at_a_time(db: Db) {
    let Some(live) = common::live(db) else { return };
    let t = live.table(Form::AdvisoryLock, Duration::ZERO);
    for (body, k) in [("a1", "a"), ("a2", "a"), ("b1", "b")] {
        live.broker
            .publish(&t, Message::new(body.as_bytes().to_vec()).set("k", k))
            .unwrap();
    }
    let sub = live.broker.subscription(&t).workers(3).start().unwrap();
    let first = next(&sub);
    let second = next(&sub);
    let mut got = [first, second];
    got.sort_by_key(|d| d.payload().to_vec());
    let [a1, b1] = got;
    assert_eq!(
        (a1.payload(), b1.payload()),
        (&b"a1"[..], &b"b1"[..]),
        "expected a1 and b1 first"
    );
    assert_eq!(a1.key(), Some(format!("{}-a", t.name()).as_str()));
    assert_eq!(
        sub.next_delivery_timeout(Duration::from_millis(1000)).err(),
        Some(NextError::Timeout),
        "a second row of key a was delivered while the first was in work"
    );
    // Settling b does not free a.
    b1.ack().unwrap();
    assert_eq!(
        sub.next_delivery_timeout(Duration::from_millis(600)).err(),
        Some(NextError::Timeout)
    );
    a1.ack().unwrap();
    let a2 = next(&sub);
    assert_eq!((a2.payload(), a2.attempt()), (&b"a2"[..], 1));
    a2.ack().unwrap();
    assert_eq!(live.rows(&t), 0);
    sub.shutdown(Duration::from_secs(5)).unwrap();
}
per_db!(equal_keys_run_one_at_a_time);

/// Rows with different keys are held at the same time, on separate brokers too.
fn different_keys_run_in_parallel(db: Db) {
    let Some(live) = common::live(db) else { return };
    let t = live.table(Form::AdvisoryLock, Duration::ZERO);
    let msgs: Vec<Message> = ["a", "b", "c", "d"]
        .iter()
        .map(|k| Message::new(k.as_bytes().to_vec()).set("k", *k))
        .collect();
    live.broker.publish_batch(&t, msgs).unwrap();
    let other = live.connect();
    // Two rows each: SQLite's in-process keys let one claim take several rows.
    let s1 = live
        .broker
        .subscription(&t)
        .workers(2)
        .max_in_flight(2)
        .start()
        .unwrap();
    let s2 = other
        .subscription(&t)
        .workers(2)
        .max_in_flight(2)
        .start()
        .unwrap();
    let held = vec![next(&s1), next(&s1), next(&s2), next(&s2)];
    let keys: HashSet<String> = held.iter().map(key_of).collect();
    assert_eq!(keys.len(), 4, "the same key held twice: {keys:?}");
    for d in held {
        d.ack().unwrap();
    }
    assert_eq!(live.rows(&t), 0);
}
per_db!(different_keys_run_in_parallel);

/// Two advisory tables whose templates render the same keys wait for each other.
fn equal_keys_across_tables_wait(db: Db) {
    let Some(live) = common::live(db) else { return };
    let prefix = common::unique("acct");
    let describe = |name: &str| {
        Table::new(name)
            .text_column("k")
            .advisory_lock(format!("{prefix}-{{k}}"))
    };
    let t1 = live.create(describe(&common::unique("t")));
    let t2 = live.create(describe(&common::unique("t")));
    for t in [&t1, &t2] {
        live.broker
            .publish(t, Message::new(t.name().as_bytes().to_vec()).set("k", "x"))
            .unwrap();
    }
    let s1 = live.broker.subscription(&t1).start().unwrap();
    let d1 = next(&s1);
    assert_eq!(d1.key(), Some(format!("{prefix}-x").as_str()));
    // Started only now, so it cannot have taken the key first.
    let other = live.connect();
    let s2 = other.subscription(&t2).start().unwrap();
    assert_eq!(
        s2.next_delivery_timeout(Duration::from_millis(1200)).err(),
        Some(NextError::Timeout),
        "the other table's row with the same key was delivered while the key was held"
    );
    d1.ack().unwrap();
    let d2 = next(&s2);
    assert_eq!(d2.payload(), t2.name().as_bytes());
    // And the other way round: t2's key held keeps a new t1 row waiting.
    live.broker
        .publish(&t1, Message::new(b"again".to_vec()).set("k", "x"))
        .unwrap();
    assert_eq!(
        s1.next_delivery_timeout(Duration::from_millis(1200)).err(),
        Some(NextError::Timeout)
    );
    d2.ack().unwrap();
    let d1 = next(&s1);
    assert_eq!(d1.payload(), b"again");
    d1.ack().unwrap();
    assert_eq!(live.rows(&t1) + live.rows(&t2), 0);
}
per_db!(equal_keys_across_tables_wait);

/// A FIFO table whose key template reads another column than the group: the rows' keys still
/// serialise what they name across groups (a group key is held beside the row's key, not in
/// its place). Groups g1 and g2 each have one row, both with key `a`; g3's row has key `b`.
/// With one of g1's and g2's rows held (whichever a worker took first: they are different
/// groups), g3's is delivered and the other is not, though it heads its own group, on this
/// broker or another; once the held row settles, the other comes. The delivery's key is the
/// row's.
fn fifo_key_template_still_serialises_across_groups(db: Db) {
    let Some(live) = common::live(db) else { return };
    let name = common::unique("t");
    let t = live.create(
        Table::new(&name)
            .text_column("k")
            .group("customer")
            .fifo()
            .advisory_lock(format!("{name}-{{k}}")),
    );
    for (body, customer, k) in [("g1", "g1", "a"), ("g2", "g2", "a"), ("g3", "g3", "b")] {
        live.broker
            .publish(
                &t,
                Message::new(body.as_bytes().to_vec())
                    .set("customer", customer)
                    .set("k", k),
            )
            .unwrap();
    }
    let sub = live.broker.subscription(&t).workers(3).start().unwrap();
    let mut got = [next(&sub), next(&sub)];
    got.sort_by_key(|d| d.payload().to_vec());
    // g1 and g2 are different groups: either may take key `a` first (three workers race for
    // it); g3 (key `b`) is delivered beside it, and the other of g1 and g2 waits.
    let [held, g3] = got;
    assert_eq!(g3.payload(), b"g3");
    let (first, second): (&[u8], &[u8]) = match held.payload() {
        b"g1" => (b"g1", b"g2"),
        b"g2" => (b"g2", b"g1"),
        other => panic!("delivered with g3: {other:?}, not a row of key a"),
    };
    assert_eq!(held.key(), Some(format!("{name}-a").as_str()));
    let other = live.connect();
    let elsewhere = other.subscription(&t).start().unwrap();
    for s in [&sub, &elsewhere] {
        assert_eq!(
            s.next_delivery_timeout(Duration::from_millis(600)).err(),
            Some(NextError::Timeout),
            "the other row of key a was delivered while {first:?}'s row held key a"
        );
    }
    elsewhere.shutdown(Duration::from_secs(5)).unwrap();
    g3.ack().unwrap();
    held.ack().unwrap();
    let later = next(&sub);
    assert_eq!(later.payload(), second);
    later.ack().unwrap();
    assert_eq!(live.rows(&t), 0);
    sub.shutdown(Duration::from_secs(5)).unwrap();
}
per_db!(fifo_key_template_still_serialises_across_groups);
