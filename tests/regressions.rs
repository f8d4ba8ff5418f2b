//! Regressions found in review: each test failed before its fix.

mod common;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

use common::{key_of, msg, next, Db};
use sqlbroker::{Broker, Form, Message};

const LEASE: Duration = Duration::from_secs(30);

/// The advisory form's promise: "Rows with equal keys are worked one at a time ... while other accounts' rows run in
/// parallel." A key with more ready rows than one page of advisory candidates (40 by default)
/// at the head of the queue must not hide the other keys' rows: the claim pages past them.
fn advisory_busy_key_starves_other_keys(db: Db) {
    let Some(live) = common::live(db) else { return };
    let t = live.table(Form::AdvisoryLock, LEASE);
    let batch: Vec<Message> = (0..60).map(|i| msg(&format!("a{i}"), "a")).collect();
    live.broker.publish_batch(&t, batch).unwrap();
    let b = live.broker.publish(&t, msg("b", "b")).unwrap();
    let sub = live.broker.subscription(&t).workers(2).start().unwrap();
    // Two workers may claim in either order: one delivery holds key "a", and while it is held
    // the row of key "b" must arrive too.
    let first = next(&sub, Duration::from_secs(10));
    let other = sub.next_delivery_timeout(Duration::from_secs(3));
    let mut got = vec![(first.id(), key_of(&first))];
    got.extend(other.as_ref().map(|d| (d.id(), key_of(d))));
    got.sort_by(|x, y| x.1.cmp(&y.1));
    drop(other);
    drop(first);
    sub.shutdown(Duration::from_secs(5)).unwrap();
    assert_eq!(
        got.len(),
        2,
        "the row of key b was not delivered while key a was in work: {got:?}"
    );
    assert_eq!(
        (got[0].1.as_str(), got[1].clone()),
        ("a", (b, "b".to_string()))
    );
}
per_db!(advisory_busy_key_starves_other_keys);

/// The candidate scan also reads the rows already in work (they stay ready); the advisory form
/// must still fill every slot it has (60 here), not stop at one page of candidates (40).
fn advisory_in_flight_not_capped_by_scan_window(db: Db) {
    let Some(live) = common::live(db) else { return };
    let t = live.table(Form::AdvisoryLock, LEASE);
    let batch: Vec<Message> = (0..100)
        .map(|i| msg(&format!("m{i}"), &format!("k{i}")))
        .collect();
    live.broker.publish_batch(&t, batch).unwrap();
    let broker = Broker::builder(&live.url).pool_size(80).build().unwrap();
    let sub = broker
        .subscription(&t)
        .workers(8)
        .max_in_flight(60)
        .start()
        .unwrap();
    let mut held = Vec::new();
    while held.len() < 60 {
        match sub.next_delivery_timeout(Duration::from_secs(3)) {
            Ok(d) => held.push(d),
            Err(_) => break,
        }
    }
    let n = held.len();
    drop(held);
    sub.shutdown(Duration::from_secs(5)).unwrap();
    assert_eq!(
        n, 60,
        "100 distinct keys ready, max_in_flight 60, but only {n} could be held at once"
    );
}
per_db!(advisory_in_flight_not_capped_by_scan_window);

/// A row dead-lettered by `max_attempts` and put back with `requeue_dead` is delivered again
/// (requeue resets its attempts), not dead-lettered again by the next claim.
fn requeue_after_max_attempts_is_delivered(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let t = live.create(common::describe(&common::unique("t"), form, LEASE).max_attempts(1));
    let id = live.broker.publish(&t, msg("x", "a")).unwrap();
    let sub = live.broker.subscription(&t).start().unwrap();
    let d = next(&sub, Duration::from_secs(10));
    d.retry().unwrap(); // last attempt: dead-lettered
    assert_eq!(live.broker.dead_letters(&t, 10).unwrap().len(), 1);
    assert!(live.broker.requeue_dead(&t, id).unwrap());
    let again = sub.next_delivery_timeout(Duration::from_secs(5));
    let dead = live.broker.dead_letters(&t, 10).unwrap();
    let ok = again.is_ok();
    if let Ok(d) = again {
        d.ack().unwrap();
    }
    sub.shutdown(Duration::from_secs(5)).unwrap();
    assert!(
        ok,
        "the requeued row was not delivered; dead letters now: {:?}",
        dead.iter()
            .map(|d| (d.id, d.attempts, d.reason.clone()))
            .collect::<Vec<_>>()
    );
}
per_db_form!(requeue_after_max_attempts_is_delivered);

/// `shutdown(Duration::MAX)` ("wait as long as it takes") waits, it does not overflow a deadline:
/// with a delivery in flight that its handler acks 300 ms later, it returns `Ok` only after the
/// ack. Fails if it panicked (`panicked`), gave up at once (`Ok(Err(Unsettled))` in the match;
/// tried by waiting zero instead of `grace` when the deadline overflows), or returned before
/// the ack (`returned after`).
#[test]
fn shutdown_with_duration_max_does_not_panic() {
    const ACK_AFTER: Duration = Duration::from_millis(300);
    let broker = Broker::connect("sqlite::memory:").unwrap();
    let t = sqlbroker::Table::new("jobs").lease(LEASE);
    broker.create_table(&t).unwrap();
    broker.publish(&t, Message::new(b"x".to_vec())).unwrap();
    let sub = broker.subscription(&t).start().unwrap();
    let d = next(&sub, Duration::from_secs(10));
    let started = std::time::Instant::now();
    let handler = std::thread::spawn(move || {
        std::thread::sleep(ACK_AFTER);
        d.ack()
    });
    let r = catch_unwind(AssertUnwindSafe(|| sub.shutdown(Duration::MAX)));
    let took = started.elapsed();
    match r {
        Ok(Ok(())) => {}
        Ok(Err(e)) => panic!("shutdown(Duration::MAX) did not wait for the delivery: {e:?}"),
        Err(_) => panic!("shutdown(Duration::MAX) panicked"),
    }
    assert!(
        took >= ACK_AFTER,
        "shutdown(Duration::MAX) returned after {took:?}, before the delivery was settled"
    );
    handler.join().unwrap().unwrap();
}

/// `connection_timeout(Duration::MAX)` (the pool adds it to `Instant::now()`) and
/// `connection_timeout(ZERO)` (r2d2 asserts it is positive) are typed errors, not panics.
#[test]
fn connection_timeouts_out_of_range_are_refused() {
    for d in [Duration::MAX, Duration::ZERO] {
        let r = catch_unwind(|| {
            Broker::builder("sqlite::memory:")
                .connection_timeout(d)
                .build()
                .map(drop)
        });
        match r {
            Ok(Err(sqlbroker::BrokerError::InvalidOption { option, .. })) => {
                assert_eq!(option, "connection_timeout")
            }
            Ok(other) => panic!("connection_timeout({d:?}) gave {other:?}"),
            Err(_) => panic!("connection_timeout({d:?}) panicked in build"),
        }
    }
}
