//! The behaviour suite, run for every database x form that supports it: claim and settle,
//! attempts, the drop policy, scheduling, dead letters, the `next_delivery` family,
//! backpressure, and publishing.

mod common;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::{msg, Db, Live};
use sqlbroker::{BrokerError, Delivery, Form, Message, NextError, Subscription, Table, Value};

const LEASE: Duration = Duration::from_secs(30);
const WAIT: Duration = Duration::from_secs(10);

fn next(sub: &Subscription) -> Delivery {
    common::next(sub, WAIT)
}

fn floor_secs(t: SystemTime) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(t.duration_since(UNIX_EPOCH).unwrap().as_secs())
}

fn claim_then_ack(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let t = live.table(form, LEASE);
    let first = live.broker.publish(&t, msg("zero", "a")).unwrap();
    let id = live.broker.publish(&t, msg("one", "a")).unwrap();
    assert!(
        id > first,
        "publish returns each new row's id: {first}, then {id}"
    );
    let sub = live.broker.subscription(&t).start().unwrap();
    // Both rows may come in one claim, and a claim promises no order among its rows (SQLite's
    // `UPDATE .. RETURNING` returns them in any order; several workers claim in parallel):
    // what is promised is that each delivery carries the id publish returned for its payload.
    let mut seen = Vec::new();
    for _ in 0..2 {
        let d = next(&sub);
        let want: &[u8] = if d.id() == first {
            b"zero"
        } else {
            assert_eq!(d.id(), id, "the delivery carries the id publish returned");
            b"one"
        };
        assert_eq!(
            d.payload(),
            want,
            "row {} carries another row's payload",
            d.id()
        );
        assert_eq!(d.attempt(), 1);
        assert_eq!(d.get("k").and_then(|v| v.as_str()), Some("a"));
        assert_eq!(d.get("not_a_column"), None);
        assert_eq!(d.table(), t.name());
        seen.push(d.id());
        d.ack().unwrap();
    }
    seen.sort_unstable();
    assert_eq!(seen, [first, id], "a row was delivered twice");
    assert_eq!(live.rows(&t), 0, "ack deletes the row");
    assert!(
        sub.next_delivery_timeout(Duration::from_millis(600))
            .is_err(),
        "acked row came back"
    );
    sub.shutdown(Duration::from_secs(5)).unwrap();
}
per_db_form!(claim_then_ack);

/// Attempts read 1, 2, 3 across retries, in every form.
fn attempts_count_across_retries(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let t = live.table(form, LEASE);
    live.broker.publish(&t, msg("r", "a")).unwrap();
    let sub = live.broker.subscription(&t).start().unwrap();
    let d = next(&sub);
    let id = d.id();
    assert_eq!(d.attempt(), 1);
    d.retry().unwrap();
    let d = next(&sub);
    assert_eq!((d.id(), d.attempt()), (id, 2));
    d.retry().unwrap();
    let d = next(&sub);
    assert_eq!((d.id(), d.attempt()), (id, 3));
    assert_eq!(d.payload(), b"r");
    d.ack().unwrap();
    assert_eq!(live.rows(&t), 0);
    sub.shutdown(Duration::from_secs(5)).unwrap();
}
per_db_form!(attempts_count_across_retries);

/// Dropping an unsettled delivery counts a failed attempt in every form (row lock: committed
/// with the retry) and returns the row after a short delay, also after its subscription is
/// gone, and never panics.
fn drop_unsettled_counts_an_attempt(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let t = live.table(form, LEASE);
    live.broker.publish(&t, msg("d", "a")).unwrap();
    let sub = live.broker.subscription(&t).start().unwrap();
    let d = next(&sub);
    let id = d.id();
    assert_eq!(d.attempt(), 1);
    let dropped = Instant::now();
    drop(d);
    // A failed attempt in every form, retried after the default retry policy's first delay
    // (1 s jittered into [0.5 s, 1 s]; well within the 30 s lease).
    let d = sub
        .next_delivery_timeout(Duration::from_secs(5))
        .expect("dropped row back after its delay");
    assert!(
        dropped.elapsed() >= Duration::from_millis(500),
        "back after {:?}",
        dropped.elapsed()
    );
    assert_eq!((d.id(), d.attempt()), (id, 2));

    // Dropped after its subscription is gone: still counted, and back on another broker.
    match sub.shutdown(Duration::ZERO) {
        Err(sqlbroker::BrokerError::Unsettled { unsettled: 1, .. }) => {}
        other => panic!("shutdown with a delivery held returned {other:?}"),
    }
    drop(d);
    let other = live.connect();
    let sub = other.subscription(&t).start().unwrap();
    let d = sub
        .next_delivery_timeout(Duration::from_secs(6))
        .expect("row back after a late drop");
    assert_eq!((d.id(), d.attempt()), (id, 3));
    d.ack().unwrap();
    assert_eq!(live.rows(&t), 0);
    sub.shutdown(Duration::from_secs(5)).unwrap();
}
per_db_form!(drop_unsettled_counts_an_attempt);

/// Waits until (nearly) `due` and asserts nothing was delivered meanwhile.
fn nothing_before(sub: &Subscription, due: SystemTime) {
    let left = due.duration_since(SystemTime::now()).unwrap_or_default();
    let window = left.saturating_sub(Duration::from_millis(150));
    assert!(
        window >= Duration::from_millis(500),
        "too little time left to observe ({left:?})"
    );
    assert_eq!(
        sub.next_delivery_timeout(window).err(),
        Some(NextError::Timeout),
        "delivered before it was due"
    );
}

/// `deliver_after(2 s)`: not claimed before it is due, claimed after.
fn deliver_after_waits_until_due(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let t = live.table(form, LEASE);
    let sub = live.broker.subscription(&t).start().unwrap();
    let before = SystemTime::now();
    live.broker
        .publish(&t, msg("later", "a").deliver_after(Duration::from_secs(2)))
        .unwrap();
    // Due at ceil(publish time + 2 s) >= ceil(before + 2 s).
    let due = common::ceil_secs(before + Duration::from_secs(2));
    nothing_before(&sub, due);
    let d = next(&sub);
    let got = SystemTime::now();
    assert!(
        got >= due,
        "delivered at {got:?}, before it was due at {due:?}"
    );
    assert_eq!((d.payload(), d.attempt()), (&b"later"[..], 1));
    d.ack().unwrap();
    sub.shutdown(Duration::from_secs(5)).unwrap();
}
per_db_form!(deliver_after_waits_until_due);

/// `retry_after(2 s)`: not claimed again before it is due, claimed after with the next attempt.
fn retry_after_waits_until_due(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let t = live.table(form, LEASE);
    live.broker.publish(&t, msg("again", "a")).unwrap();
    let sub = live.broker.subscription(&t).start().unwrap();
    let d = next(&sub);
    let id = d.id();
    let before = SystemTime::now();
    d.retry_after(Duration::from_secs(2)).unwrap();
    let due = common::ceil_secs(before + Duration::from_secs(2));
    nothing_before(&sub, due);
    let d = next(&sub);
    let got = SystemTime::now();
    assert!(
        got >= due,
        "redelivered at {got:?}, before it was due at {due:?}"
    );
    assert_eq!((d.id(), d.attempt()), (id, 2));
    d.ack().unwrap();
    sub.shutdown(Duration::from_secs(5)).unwrap();
}
per_db_form!(retry_after_waits_until_due);

/// `dead_letter` takes the row out of the queue for good; `dead_letters` lists it with its reason
/// and time; `requeue_dead` puts it back and it is delivered again.
fn dead_letters_and_requeue(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let t = live.table(form, LEASE);
    live.broker.publish(&t, msg("poison", "a")).unwrap();
    live.broker.publish(&t, msg("fine", "b")).unwrap();
    let sub = live.broker.subscription(&t).start().unwrap();
    // One at a time: the row lock and server advisory forms hand out one row per worker.
    let (mut id, mut before, mut after) = (None, SystemTime::now(), SystemTime::now());
    for _ in 0..2 {
        let d = next(&sub);
        if d.payload() == b"poison" {
            id = Some(d.id());
            before = SystemTime::now();
            d.dead_letter("bad json at byte 3").unwrap();
            after = SystemTime::now();
        } else {
            d.ack().unwrap();
        }
    }
    let id = id.expect("the poison row was delivered");

    assert_eq!(
        sub.next_delivery_timeout(Duration::from_millis(1200)).err(),
        Some(NextError::Timeout),
        "a dead letter was delivered again"
    );
    assert_eq!(live.rows(&t), 1, "the dead letter stays in the table");
    let dead = live.broker.dead_letters(&t, 10).unwrap();
    assert_eq!(dead.len(), 1, "{dead:?}");
    let dl = &dead[0];
    assert_eq!(dl.id, id);
    assert_eq!(dl.reason, "bad json at byte 3");
    assert_eq!(dl.payload, b"poison");
    assert_eq!(dl.attempts, 1, "the dead-lettered attempt is counted");
    assert_eq!(dl.get("k"), Some(&Value::Text("a".into())));
    assert!(
        dl.dead_at >= floor_secs(before) && dl.dead_at <= after,
        "dead_at {:?} not in [{before:?}, {after:?}]",
        dl.dead_at
    );

    assert!(
        !live.broker.requeue_dead(&t, id + 1_000_000).unwrap(),
        "requeued a row that does not exist"
    );
    assert!(live.broker.requeue_dead(&t, id).unwrap());
    assert!(
        !live.broker.requeue_dead(&t, id).unwrap(),
        "requeued a row that is not dead"
    );
    assert!(live.broker.dead_letters(&t, 10).unwrap().is_empty());
    let d = next(&sub);
    // Requeue gives the row a fresh attempt count.
    assert_eq!((d.id(), d.attempt(), d.payload()), (id, 1, &b"poison"[..]));
    d.ack().unwrap();
    assert_eq!(live.rows(&t), 0);
    sub.shutdown(Duration::from_secs(5)).unwrap();
}
per_db_form!(dead_letters_and_requeue);

/// `dead_letters` lists the oldest first, at most `limit`, and any `usize` is a limit (none
/// practical: `usize::MAX`).
fn dead_letters_oldest_first_and_limited(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let t = live.table(form, LEASE);
    let sub = live.broker.subscription(&t).start().unwrap();
    let mut ids = Vec::new();
    for i in 0..3 {
        live.broker
            .publish(&t, msg(&format!("p{i}"), &format!("k{i}")))
            .unwrap();
        let d = next(&sub);
        ids.push(d.id());
        d.dead_letter(format!("reason {i}")).unwrap();
    }
    let two: Vec<i64> = live
        .broker
        .dead_letters(&t, 2)
        .unwrap()
        .iter()
        .map(|d| d.id)
        .collect();
    assert_eq!(two, ids[..2]);
    assert!(live.broker.dead_letters(&t, 0).unwrap().is_empty());
    let all = live.broker.dead_letters(&t, usize::MAX);
    let all: Vec<i64> = all
        .expect("dead_letters(usize::MAX)")
        .iter()
        .map(|d| d.id)
        .collect();
    assert_eq!(all, ids);
    sub.shutdown(Duration::from_secs(5)).unwrap();
}
per_db_form!(dead_letters_oldest_first_and_limited);

/// `next_delivery_timeout` and `try_next_delivery` time out on an empty queue; after `close`,
/// `next_delivery` is `None` and the others are `Closed`, even with rows in the table.
fn next_family_timeout_and_closed(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let t = live.table(form, LEASE);
    let sub = live.broker.subscription(&t).start().unwrap();
    let t0 = Instant::now();
    assert_eq!(
        sub.next_delivery_timeout(Duration::from_millis(300)).err(),
        Some(NextError::Timeout)
    );
    assert!(
        t0.elapsed() >= Duration::from_millis(290),
        "returned before its timeout"
    );
    assert_eq!(sub.try_next_delivery().err(), Some(NextError::Empty));
    assert!(!sub.is_closed());

    sub.close();
    assert!(sub.is_closed());
    live.broker.publish(&t, msg("x", "a")).unwrap();
    assert!(sub.next_delivery().is_none());
    assert_eq!(
        sub.next_delivery_timeout(Duration::from_millis(500)).err(),
        Some(NextError::Closed)
    );
    assert_eq!(sub.try_next_delivery().err(), Some(NextError::Closed));
    assert!(sub.iter().next().is_none());
    assert_eq!(sub.in_flight(), 0);
    sub.shutdown(Duration::from_secs(1)).unwrap();
    // The row is still there for the next subscription.
    let sub = live.broker.subscription(&t).start().unwrap();
    let d = next(&sub);
    assert_eq!(d.attempt(), 1);
    d.ack().unwrap();
}
per_db_form!(next_family_timeout_and_closed);

/// A handler thread blocked in `iter()` ends when another thread closes the subscription.
fn iter_ends_after_close_from_another_thread(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let t = live.table(form, LEASE);
    let sub = Arc::new(live.broker.subscription(&t).start().unwrap());
    let (tx, rx) = crossbeam_channel::bounded(1);
    let handler = {
        let sub = sub.clone();
        std::thread::spawn(move || {
            let mut n = 0;
            for d in sub.iter() {
                d.ack().unwrap();
                n += 1;
            }
            let _ = tx.send(n);
        })
    };
    let msgs: Vec<Message> = (0..3).map(|i| msg("i", &format!("k{i}"))).collect();
    live.broker.publish_batch(&t, msgs).unwrap();
    assert!(
        common::wait_for(WAIT, || live.rows(&t) == 0),
        "the handler did not ack the rows"
    );
    // The handler is now blocked waiting for more.
    assert!(
        rx.recv_timeout(Duration::from_millis(300)).is_err(),
        "iter ended while open"
    );
    sub.close();
    let n = rx
        .recv_timeout(Duration::from_secs(5))
        .expect("iter() did not end after close()");
    assert_eq!(n, 3);
    handler.join().unwrap();
}
per_db_form!(iter_ends_after_close_from_another_thread);

/// Rows claimed but not handed out go back when the subscription closes: another subscription
/// gets them at once (well within the lease).
fn close_returns_unconsumed_rows(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let t = live.table(form, LEASE);
    let msgs: Vec<Message> = (0..5).map(|i| msg("c", &format!("k{i}"))).collect();
    live.broker.publish_batch(&t, msgs).unwrap();
    let sub = live
        .broker
        .subscription(&t)
        .max_in_flight(3)
        .start()
        .unwrap();
    assert!(
        common::wait_for(WAIT, || sub.in_flight() == 3),
        "in flight: {}",
        sub.in_flight()
    );
    sub.close();
    assert_eq!(sub.in_flight(), 0, "close did not return the claimed rows");
    let other = live.connect();
    let sub2 = other.subscription(&t).max_in_flight(5).start().unwrap();
    let mut got = Vec::new();
    for _ in 0..5 {
        got.push(
            sub2.next_delivery_timeout(Duration::from_secs(3))
                .unwrap_or_else(|e| {
                    panic!(
                        "row back at once after close: {e} after {} (last error {:?})",
                        got.len(),
                        sub2.last_error()
                    )
                }),
        );
    }
    let ids: HashSet<i64> = got.iter().map(Delivery::id).collect();
    assert_eq!(ids.len(), 5);
    // Rows claimed ahead and handed back by `close` never reached a handler: they spend
    // nothing, in every form (the attempts rules in the crate docs).
    let first = got.iter().filter(|d| d.attempt() == 1).count();
    assert_eq!(first, 5, "a row handed back by close spent an attempt");
    for d in got {
        d.ack().unwrap();
    }
    assert_eq!(live.rows(&t), 0);
}
per_db_form!(close_returns_unconsumed_rows);

/// Rows of `t` the database shows as held by a claim.
fn held_rows(live: &Live, t: &Table, form: Form) -> i64 {
    match form {
        Form::Lease => live.rows_where(t, "locked_until IS NOT NULL"),
        Form::AdvisoryLock => live.rows_where(t, "attempts > 0"),
        _ => {
            let free = live
                .ints(&format!(
                    "SELECT id FROM {} FOR UPDATE SKIP LOCKED",
                    t.name()
                ))
                .len() as i64;
            live.rows(t) - free
        }
    }
}

/// With `max_in_flight(2)`, never more than 2 rows are claimed and unsettled, and only 2 are
/// handed out while none is settled, however many workers there are.
fn backpressure_max_in_flight(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let t = live.table(form, LEASE);
    let msgs: Vec<Message> = (0..10).map(|i| msg("b", &format!("k{i}"))).collect();
    live.broker.publish_batch(&t, msgs).unwrap();
    let sub = Arc::new(
        live.broker
            .subscription(&t)
            .workers(4)
            .max_in_flight(2)
            .start()
            .unwrap(),
    );
    let (stop, max_seen) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicUsize::new(0)),
    );
    let monitor = {
        let (sub, stop, max_seen) = (sub.clone(), stop.clone(), max_seen.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                max_seen.fetch_max(sub.in_flight(), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(2));
            }
        })
    };
    let d1 = next(&sub);
    let d2 = next(&sub);
    assert_eq!(
        sub.next_delivery_timeout(Duration::from_millis(800)).err(),
        Some(NextError::Timeout),
        "a third row was handed out while two were unsettled"
    );
    assert_eq!(sub.in_flight(), 2);
    assert_eq!(
        held_rows(&live, &t, form),
        2,
        "the database shows more than 2 rows claimed"
    );
    let mut ids: HashSet<i64> = [d1.id(), d2.id()].into();
    d1.ack().unwrap();
    let mut pending = vec![d2];
    while ids.len() < 10 {
        let d = next(&sub);
        assert!(ids.insert(d.id()), "row {} delivered twice", d.id());
        pending.push(d);
        assert!(sub.in_flight() <= 2);
        pending.remove(0).ack().unwrap();
    }
    for d in pending {
        d.ack().unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    monitor.join().unwrap();
    assert!(
        max_seen.load(Ordering::Relaxed) <= 2,
        "in_flight reached {}",
        max_seen.load(Ordering::Relaxed)
    );
    assert_eq!(live.rows(&t), 0);
}
per_db_form!(backpressure_max_in_flight);

/// An SQL expression: the payload read as text.
fn payload_text(db: Db) -> &'static str {
    match db {
        Db::Postgres => "convert_from(payload, 'UTF8')",
        Db::Mysql => "CAST(payload AS CHAR)",
        Db::Sqlite => "CAST(payload AS TEXT)",
    }
}

/// `publish_batch` of 5,000 messages lands every row with its own payload and values.
fn publish_batch_lands_all(db: Db) {
    let Some(live) = common::live(db) else { return };
    let t = live.table(Form::Lease, LEASE);
    let msgs: Vec<Message> = (0..5000)
        .map(|i| msg(&format!("m{i}"), &format!("m{i}")))
        .collect();
    live.broker.publish_batch(&t, msgs).unwrap();
    assert_eq!(live.rows(&t), 5000);
    assert_eq!(
        live.int(&format!("SELECT COUNT(DISTINCT k) FROM {}", t.name())),
        5000
    );
    assert_eq!(
        live.rows_where(&t, &format!("{} = k", payload_text(db))),
        5000,
        "payloads and values mixed up"
    );
    assert_eq!(
        live.rows_where(&t, "attempts = 0 AND dead_at IS NULL"),
        5000
    );
    live.broker.publish_batch(&t, Vec::new()).unwrap();
    assert_eq!(live.rows(&t), 5000);
}
per_db!(publish_batch_lands_all);

/// A batch too wide for one statement goes in chunks, in one transaction: all rows land, and a
/// failure in the last chunk leaves none of the batch.
fn publish_batch_in_chunks_all_or_nothing(db: Db) {
    let Some(live) = common::live(db) else { return };
    let name = common::unique("t");
    // 33 parameters a row: 5,000 rows need several statements on every database.
    let mut t = Table::new(name.as_str()).text_column("k");
    for c in 0..31 {
        t = t.int_column(format!("c{c}"));
    }
    let t = live.create(t.lease(LEASE));
    let batch = |bad: Option<usize>| -> Vec<Message> {
        (0..5000usize)
            .map(|i| {
                let mut m = Message::new(format!("w{i}").into_bytes()).set("k", format!("w{i}"));
                for c in 0..31 {
                    m = m.set(format!("c{c}"), (i * c) as i64);
                }
                if Some(i) == bad {
                    m = m.set("k", if db == Db::Postgres { "bo\0om" } else { "boom" });
                }
                m
            })
            .collect()
    };
    live.broker.publish_batch(&t, batch(None)).unwrap();
    assert_eq!(live.rows(&t), 5000);
    let expected: i64 = (0..5000i64).map(|i| i * 30).sum();
    let sum = if db == Db::Postgres {
        "SUM(c30)::bigint"
    } else {
        "SUM(c30)"
    };
    assert_eq!(live.int(&format!("SELECT {sum} FROM {name}")), expected);
    assert_eq!(
        live.rows_where(&t, &format!("{} = k", payload_text(db))),
        5000
    );

    // A row of the last chunk fails on the server: nothing of the batch stays.
    match db {
        // PostgreSQL text cannot hold a NUL byte: the server refuses the row.
        Db::Postgres => {}
        Db::Sqlite => live.exec(&format!(
            "CREATE TRIGGER {name}_boom BEFORE INSERT ON {name} WHEN NEW.k = 'boom' BEGIN SELECT RAISE(ABORT, 'boom'); END"
        )),
        Db::Mysql => live.exec(&format!(
            "CREATE TRIGGER {name}_boom BEFORE INSERT ON {name} FOR EACH ROW \
             BEGIN IF NEW.k = 'boom' THEN SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'boom'; END IF; END"
        )),
    }
    let err = live
        .broker
        .publish_batch(&t, batch(Some(4990)))
        .expect_err("the bad row was accepted");
    assert!(matches!(err, BrokerError::Database { .. }), "{err:?}");
    assert_eq!(live.rows(&t), 5000, "a failed batch left rows behind");
}
per_db!(publish_batch_in_chunks_all_or_nothing);

/// A message setting a column the table does not describe is refused, and nothing is inserted.
fn invalid_message_inserts_nothing(db: Db) {
    let Some(live) = common::live(db) else { return };
    let t = live.table(Form::Lease, LEASE);
    let bad = || Message::new(b"x".to_vec()).set("k", "a").set("nope", 1);
    let e = live
        .broker
        .publish(&t, bad())
        .expect_err("accepted a column the table does not describe");
    assert!(matches!(e, BrokerError::InvalidMessage { .. }), "{e:?}");
    let e = live
        .broker
        .publish_batch(&t, vec![msg("good", "a"), bad()])
        .expect_err("accepted a bad batch");
    assert!(matches!(e, BrokerError::InvalidMessage { .. }), "{e:?}");
    assert_eq!(live.rows(&t), 0);
    live.broker.publish(&t, msg("good", "a")).unwrap();
    assert_eq!(live.rows(&t), 1);
}
per_db!(invalid_message_inserts_nothing);

/// Every column type and payload survives publish -> claim -> delivery and the dead letter
/// list: binary payloads (every byte value, empty, 1 MiB), text with quotes and non-ASCII,
/// extreme integers, floats, bytes, and NULL for unset columns.
fn values_round_trip(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let name = common::unique("t");
    let t = Table::new(name.as_str())
        .text_column("k")
        .int_column("n")
        .float_column("f")
        .bytes_column("b");
    let t = match form {
        Form::Lease => t.lease(LEASE),
        Form::AdvisoryLock => t.advisory_lock(format!("{name}-{{k}}-{{n}}")),
        _ => t,
    };
    let t = live.create(t);
    let all_bytes: Vec<u8> = (0..=255u8).collect();
    let text = "h\u{e9}llo \u{2713} 'single' \"double\" \\back`tick` ; -- %_";
    let big: Vec<u8> = (0..1024 * 1024).map(|i| (i % 251) as u8).collect();
    let cases: Vec<(Vec<u8>, Message)> = vec![
        (
            all_bytes.clone(),
            Message::new(all_bytes.clone())
                .set("k", text)
                .set("n", i64::MIN)
                .set("f", -0.25)
                .set("b", vec![0u8, 255, 10, 13, 0]),
        ),
        (
            Vec::new(),
            Message::new(Vec::new())
                .set("k", "max")
                .set("n", i64::MAX)
                .set("f", 1.5e300),
        ),
        (
            big.clone(),
            Message::new(big.clone()).set("k", "big").set("n", 0),
        ),
    ];
    let sub = live.broker.subscription(&t).start().unwrap();
    for (payload, m) in cases {
        live.broker.publish(&t, m).unwrap();
        let d = next(&sub);
        assert_eq!(d.payload().len(), payload.len());
        assert!(d.payload() == payload.as_slice(), "payload changed");
        match d.get("k").and_then(|v| v.as_str()) {
            Some(k) if k == text => {
                assert_eq!(d.get("n"), Some(&Value::Int(i64::MIN)));
                assert_eq!(d.get("f"), Some(&Value::Float(-0.25)));
                assert_eq!(d.get("b"), Some(&Value::Bytes(vec![0, 255, 10, 13, 0])));
                if form == Form::AdvisoryLock {
                    assert_eq!(
                        d.key(),
                        Some(format!("{name}-{text}-{}", i64::MIN).as_str())
                    );
                }
                // The dead letter list reads the same values.
                d.dead_letter("values").unwrap();
                let dead = live.broker.dead_letters(&t, 10).unwrap();
                assert_eq!(dead.len(), 1);
                assert!(dead[0].payload == all_bytes);
                assert_eq!(dead[0].get("k"), Some(&Value::Text(text.into())));
                assert_eq!(dead[0].get("n"), Some(&Value::Int(i64::MIN)));
                assert_eq!(dead[0].get("f"), Some(&Value::Float(-0.25)));
                assert_eq!(
                    dead[0].get("b"),
                    Some(&Value::Bytes(vec![0, 255, 10, 13, 0]))
                );
            }
            Some("max") => {
                assert_eq!(d.get("n"), Some(&Value::Int(i64::MAX)));
                assert_eq!(d.get("f"), Some(&Value::Float(1.5e300)));
                assert_eq!(d.get("b"), Some(&Value::Null), "an unset column reads NULL");
                d.ack().unwrap();
            }
            Some("big") => {
                assert_eq!(d.get("f"), Some(&Value::Null));
                d.ack().unwrap();
            }
            other => panic!("unexpected k {other:?}"),
        }
    }
    assert_eq!(live.rows(&t), 1);
    sub.shutdown(Duration::from_secs(5)).unwrap();
}
per_db_form!(values_round_trip);

/// A table whose role columns all have other names (an existing table used as it is) works in
/// every form: claim, retry, dead letter, requeue, lease renewal, ack.
fn renamed_roles_work(db: Db, form: Form) {
    use sqlbroker::Role;
    let Some(live) = common::live(db) else { return };
    let name = common::unique("t");
    let t = Table::new(name.as_str())
        .text_column("k")
        .rename(Role::Id, "job_id")
        .rename(Role::Payload, "body")
        .rename(Role::Attempts, "tries")
        .rename(Role::RunAt, "due")
        .rename(Role::LockedUntil, "lease_end")
        .rename(Role::DeadAt, "died")
        .rename(Role::DeadReason, "why");
    let t = match form {
        Form::Lease => t.lease(Duration::from_secs(2)),
        Form::AdvisoryLock => t.advisory_lock(format!("{name}-{{k}}")),
        _ => t,
    };
    let t = live.create(t);
    assert_eq!(live.int(&format!("SELECT COUNT(job_id) + COUNT(body) + COUNT(tries) + COUNT(due) + COUNT(died) + COUNT(why) FROM {name}")), 0);
    live.broker.publish(&t, msg("renamed", "a")).unwrap();
    let sub = live.broker.subscription(&t).start().unwrap();
    let d = next(&sub);
    let id = d.id();
    assert_eq!((d.attempt(), d.payload()), (1, &b"renamed"[..]));
    d.retry().unwrap();
    let d = next(&sub);
    assert_eq!((d.id(), d.attempt()), (id, 2));
    d.dead_letter("renamed roles").unwrap();
    let dead = live.broker.dead_letters(&t, 10).unwrap();
    assert_eq!(
        (dead.len(), dead[0].id, dead[0].reason.as_str()),
        (1, id, "renamed roles")
    );
    assert!(live.broker.requeue_dead(&t, id).unwrap());
    let d = next(&sub);
    // Requeue resets the renamed attempts column too.
    assert_eq!((d.id(), d.attempt()), (id, 1));
    if form == Form::Lease {
        // Held past its 2 s lease: only renewal (of the renamed column) keeps the subscription's
        // own worker from claiming it again.
        std::thread::sleep(Duration::from_millis(3500));
        assert_eq!(
            live.rows_where(&t, "tries = 1"),
            1,
            "the lease was not renewed"
        );
    }
    d.ack().unwrap();
    assert_eq!(live.rows(&t), 0);
    sub.shutdown(Duration::from_secs(5)).unwrap();
}
per_db_form!(renamed_roles_work);

/// `shutdown(grace)` waits for the deliveries handed out to be settled (up to `grace`), returns
/// the rows it claimed ahead, and stops claiming at once: a row published meanwhile stays in the
/// table, unclaimed.
///
/// After the shutdown the rows' *state* is checked, not just their count: a leaked claim keeps
/// its row, so `COUNT(*)` cannot see it. A lease claim shows as `locked_until` set, a lease or
/// advisory claim as an attempt counted, a server advisory claim as a key held and a row lock
/// claim only as a row nobody else can take (its transaction holds it). So: no row is leased,
/// the row published after the shutdown reads `attempts = 0`, and another broker's
/// subscription gets every row at once (well within the 30 s lease).
fn shutdown_waits_for_handed_out_deliveries(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let t = live.table(form, LEASE);
    // One row to hand out, two that the workers may claim ahead of the handler (the lease and
    // SQLite advisory forms claim in batches): shutdown must return those.
    let msgs = vec![msg("s", "a"), msg("ahead", "b"), msg("ahead", "c")];
    live.broker.publish_batch(&t, msgs).unwrap();
    let sub = live.broker.subscription(&t).start().unwrap();
    let d = next(&sub);
    let handled = d.id();
    let handler = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(700));
        d.ack().unwrap();
    });
    let t0 = Instant::now();
    sub.shutdown(Duration::from_secs(10)).unwrap();
    // The ack's delete is done before its delivery gives its slot back.
    assert_eq!(
        live.rows_where(&t, &format!("id = {handled}")),
        0,
        "shutdown returned before the delivery was settled"
    );
    assert!(t0.elapsed() >= Duration::from_millis(650));
    assert!(
        t0.elapsed() < Duration::from_secs(9),
        "shutdown waited for its whole grace"
    );
    handler.join().unwrap();
    let after = live.broker.publish(&t, msg("after", "d")).unwrap();
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(live.rows(&t), 3);
    // Lease and advisory count the attempt at claim: a claim of the new row by the shut-down
    // subscription reads 1. (The rows claimed ahead and handed back are not checked here: the contract
    // says they spend nothing, which `close_returns_unconsumed_rows` is about.)
    assert_eq!(
        live.rows_where(&t, &format!("id = {after} AND attempts = 0")),
        1,
        "a shut-down subscription claimed the row published after it stopped"
    );
    if form == Form::Lease {
        assert_eq!(
            live.rows_where(&t, "locked_until IS NULL"),
            3,
            "a lease outlived the shutdown"
        );
    }
    // Row lock shows a claim only as a row nobody else can take, a server advisory claim as a
    // key a session holds (SQLite: a key in the process's registry, which every broker on the
    // file shares). Another broker takes all three at once, or the shut-down subscription
    // still holds one.
    let other = live.connect();
    let sub = other.subscription(&t).max_in_flight(3).start().unwrap();
    let mut got = Vec::new();
    for _ in 0..3 {
        match sub.next_delivery_timeout(Duration::from_secs(3)) {
            Ok(d) => got.push(d),
            Err(e) => panic!(
                "only {} of 3 rows claimable after shutdown ({e}): the shut-down subscription \
                 still holds one",
                got.len()
            ),
        }
    }
    let mut ids: Vec<i64> = got.iter().map(Delivery::id).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 3);
    let d = got.iter().find(|d| d.id() == after).expect("the new row");
    assert_eq!(d.attempt(), 1);
    for d in got {
        d.ack().unwrap();
    }
    assert_eq!(live.rows(&t), 0);
    sub.shutdown(Duration::from_secs(5)).unwrap();
}
per_db_form!(shutdown_waits_for_handed_out_deliveries);

/// A delivery outlives its subscription and its broker: it still settles.
fn settle_after_subscription_and_broker_are_dropped(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let t = live.table(form, LEASE);
    live.broker.publish(&t, msg("late", "a")).unwrap();
    let broker = live.connect();
    let sub = broker.subscription(&t).start().unwrap();
    let d = next(&sub);
    drop(sub);
    drop(broker);
    d.ack().unwrap();
    assert_eq!(live.rows(&t), 0);
}
per_db_form!(settle_after_subscription_and_broker_are_dropped);

/// A subscription whose table disappears keeps running: waiters time out instead of hanging,
/// `last_error` says what failed, and once the table is back it claims again.
fn recovers_after_its_table_is_dropped_and_recreated(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let t = live.table(form, LEASE);
    let sub = live
        .broker
        .subscription(&t)
        .poll_interval(Duration::from_millis(100))
        .start()
        .unwrap();
    live.broker.publish(&t, msg("before", "a")).unwrap();
    next(&sub).ack().unwrap();

    live.exec(&format!("DROP TABLE {}", t.name()));
    assert!(
        common::wait_for(WAIT, || sub.last_error().is_some()),
        "no error reported while the table was gone"
    );
    let e = sub.last_error().unwrap();
    assert!(
        matches!(&*e, sqlbroker::BrokerError::Database { op: "claim", table, .. } if table == t.name()),
        "{e}"
    );
    assert_eq!(
        sub.next_delivery_timeout(Duration::from_millis(300)).err(),
        Some(NextError::Timeout)
    );
    assert!(!sub.is_closed());

    live.broker.create_table(&t).unwrap();
    live.broker.publish(&t, msg("after", "a")).unwrap();
    let d = next(&sub);
    assert_eq!((d.payload(), d.attempt()), (&b"after"[..], 1));
    d.ack().unwrap();
    assert!(
        common::wait_for(WAIT, || sub.last_error().is_none()),
        "{:?}",
        sub.last_error()
    );
    sub.shutdown(Duration::from_secs(5)).unwrap();
}
per_db_form!(recovers_after_its_table_is_dropped_and_recreated);

/// `max_attempts(2)`: the second attempt's retry dead-letters the row instead; and a row whose
/// attempts were spent by dropped deliveries (lease, advisory: counted at claim) is dead-lettered
/// by the claim instead of delivered. Row lock spends no attempt on a drop, so there the dropped
/// row comes back as attempt 1.
fn max_attempts_dead_letters(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let t = live.create(common::describe(&common::unique("t"), form, LEASE).max_attempts(2));
    let retried = live.broker.publish(&t, msg("retried", "a")).unwrap();
    let sub = live.broker.subscription(&t).start().unwrap();
    let d = next(&sub);
    assert_eq!((d.id(), d.attempt()), (retried, 1));
    d.retry().unwrap();
    let d = next(&sub);
    assert_eq!((d.id(), d.attempt()), (retried, 2));
    d.retry().unwrap();
    assert_eq!(
        sub.next_delivery_timeout(Duration::from_millis(600)).err(),
        Some(NextError::Timeout),
        "the last attempt's retry delivered the row again"
    );
    let dead = live.broker.dead_letters(&t, 10).unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!((dead[0].id, dead[0].attempts), (retried, 2));
    assert!(
        dead[0].reason.contains("max_attempts 2"),
        "{:?}",
        dead[0].reason
    );

    // A delivery dropped unsettled is a failed attempt in every form (the row lock form commits
    // the count): the second drop is the last attempt, and dead-letters the row.
    let dropped = live.broker.publish(&t, msg("dropped", "b")).unwrap();
    for attempt in 1..=2 {
        let d = next(&sub);
        assert_eq!((d.id(), d.attempt()), (dropped, attempt));
        drop(d);
    }
    assert!(
        common::wait_for(WAIT, || live.broker.dead_letters(&t, 10).unwrap().len()
            == 2),
        "the dropped row was not dead-lettered at max_attempts (last error: {:?})",
        sub.last_error()
    );
    let dead = live.broker.dead_letters(&t, 10).unwrap();
    let spent = dead
        .iter()
        .find(|d| d.id == dropped)
        .expect("dead-lettered");
    assert!(
        spent.reason.contains("dropped unsettled"),
        "{:?}",
        spent.reason
    );
    assert_eq!(spent.attempts, 2);
    assert_eq!(
        sub.next_delivery_timeout(Duration::from_millis(600)).err(),
        Some(NextError::Timeout),
        "a dead-lettered row was delivered"
    );
    assert_eq!(
        live.rows(&t),
        live.broker.dead_letters(&t, 10).unwrap().len() as i64
    );
    sub.shutdown(Duration::from_secs(5)).unwrap();
}
per_db_form!(max_attempts_dead_letters);
