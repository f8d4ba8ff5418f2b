//! Time columns and `Message::deliver_at`: a time reads back as the same `Value::Time`, to the
//! second, on every database and form; a time a database cannot hold is refused before any
//! SQL; a message due at a time is not claimed before it, and one due in the past does not
//! jump the queue.

mod common;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::Db;
use sqlbroker::{BrokerError, Form, Message, Value};

/// A table of `form` with the test's usual columns and a time column `at`.
fn table_with_time(live: &common::Live, form: Form) -> sqlbroker::Table {
    let name = common::unique("time");
    live.create(common::describe(&name, form, Duration::from_secs(30)).time_column("at"))
}

/// A time with a fraction is kept to its second and read back as a time, by the delivery, the
/// job view and the dead letter alike; times outside 1970..9999 and values of other types are
/// refused, and nothing is written.
fn a_time_column_reads_back_as_a_time(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let t = table_with_time(&live, form);
    let sent = UNIX_EPOCH + Duration::from_millis(1_700_000_000_750);
    let kept = Value::Time(UNIX_EPOCH + Duration::from_secs(1_700_000_000));
    for bad in [
        Value::Time(UNIX_EPOCH - Duration::from_secs(1)),
        Value::Time(UNIX_EPOCH + Duration::from_secs(253_402_300_800)),
        Value::Text("2026-12-01".into()),
        Value::Int(1_700_000_000),
    ] {
        let e = live
            .broker
            .publish(&t, Message::new(b"x".to_vec()).set("at", bad.clone()))
            .expect_err("an unfit time was published");
        assert!(
            matches!(e, BrokerError::InvalidMessage { .. }),
            "{bad:?}: {e}"
        );
    }
    assert_eq!(live.rows(&t), 0, "a refused message wrote a row");
    let id = live
        .broker
        .publish(
            &t,
            Message::new(b"x".to_vec()).set("k", "a").set("at", sent),
        )
        .unwrap();
    let job = live.broker.job(&t, id).unwrap().expect("the job");
    assert_eq!(job.get("at"), Some(&kept), "the job view");
    let sub = live.broker.subscription(&t).start().unwrap();
    let d = sub
        .next_delivery_timeout(Duration::from_secs(10))
        .expect("the delivery");
    assert_eq!(d.get("at"), Some(&kept), "the delivery");
    d.dead_letter("to read it back").unwrap();
    let dead = live.broker.dead_letters(&t, 10).unwrap();
    assert_eq!(dead[0].get("at"), Some(&kept), "the dead letter");
    sub.close();
}
per_db_form!(a_time_column_reads_back_as_a_time);

/// A message due in 2 s is not claimed before its time, and is after; one due in the past is
/// due at once but behind an older due row (its due time is the publish, not the past).
fn deliver_at_holds_a_row_until_then(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let t = live.table(form, Duration::from_secs(30));
    let at = SystemTime::now() + Duration::from_secs(2);
    let later = live
        .broker
        .publish(
            &t,
            Message::new(b"later".to_vec()).set("k", "l").deliver_at(at),
        )
        .unwrap();
    assert_eq!(
        live.broker
            .job(&t, later)
            .unwrap()
            .expect("the job")
            .due_at(),
        common::ceil_secs(at)
    );
    let first = live
        .broker
        .publish(&t, Message::new(b"first".to_vec()).set("k", "f"))
        .unwrap();
    let past = live
        .broker
        .publish(
            &t,
            Message::new(b"past".to_vec())
                .set("k", "p")
                .deliver_at(UNIX_EPOCH + Duration::from_secs(86_400)),
        )
        .unwrap();
    let sub = live.broker.subscription(&t).start().unwrap();
    let mut order = Vec::new();
    while order.len() < 3 {
        let d = sub
            .next_delivery_timeout(Duration::from_secs(10))
            .expect("every row in time");
        if d.id() == later {
            assert!(SystemTime::now() >= at, "the row due at {at:?} came early");
        }
        order.push(d.id());
        d.ack().unwrap();
    }
    assert_eq!(
        order,
        [first, past, later],
        "the rows due now in publish order, then the one due later"
    );
    sub.close();
}
per_db_form!(deliver_at_holds_a_row_until_then);
