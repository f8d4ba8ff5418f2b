//! Typed jobs (feature `serde`): `Message::json` and `Delivery::json`, and a payload that does
//! not decode: a typed error, with the row still held by its delivery, then settled as the
//! application chooses, never lost.
#![cfg(feature = "serde")]

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::{Db, Live};
use serde::{Deserialize, Serialize};
use sqlbroker::{BrokerError, Form, Message, RetryPolicy, Subscription};

const LEASE: Duration = Duration::from_secs(30);
const WAIT: Duration = Duration::from_secs(15);

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Charge {
    account: String,
    cents: u64,
    tags: Vec<String>,
    note: Option<String>,
}

fn charge() -> Charge {
    Charge {
        account: "a-17 ü €".into(),
        cents: u64::MAX,
        tags: vec!["x".into(), "\"quoted\"".into()],
        note: None,
    }
}

/// A subscription whose `fail` retries after a second.
fn subscribe(live: &Live, t: &sqlbroker::Table) -> Subscription {
    let quick = RetryPolicy::exponential(Duration::from_secs(1), Duration::from_secs(1));
    live.broker
        .subscription(t)
        .workers(1)
        .retry_policy(quick.without_jitter())
        .start()
        .unwrap()
}

/// A value survives the round trip through the table, with the table's own columns beside it.
fn json_roundtrip(db: Db) {
    let Some(live) = common::live(db) else { return };
    let t = live.table(Form::Lease, LEASE);
    let m = Message::json(&charge()).unwrap().set("k", "typed");
    let id = live.broker.publish(&t, m).unwrap();
    let sub = subscribe(&live, &t);
    let d = common::next(&sub, WAIT);
    assert_eq!(d.id(), id);
    assert_eq!(d.json::<Charge>().unwrap(), charge());
    // As loosely typed JSON too.
    assert_eq!(d.json::<serde_json::Value>().unwrap()["cents"], u64::MAX);
    assert_eq!(common::key_of(&d), "typed");
    d.ack().unwrap();
    sub.shutdown(Duration::from_secs(5)).unwrap();
    assert_eq!(live.rows(&t), 0);
}
per_db!(json_roundtrip);

/// A payload that is not a `Charge` (not JSON at all; JSON of another shape) is a `Decode`
/// error naming the row and table. The delivery still holds the row: it is in the table, no
/// other claim gets it, and it comes back after a drop, then after a `fail`, and is finally
/// dead-lettered with its payload intact.
fn undecodable_payload_keeps_its_row(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let t = live.table(form, LEASE);
    let bad = live
        .broker
        .publish(&t, common::msg("not json {", "a"))
        .unwrap();
    let sub = subscribe(&live, &t);

    let d = common::next(&sub, WAIT);
    assert_eq!(d.id(), bad);
    match d.json::<Charge>() {
        Err(BrokerError::Decode { table, id, source }) => {
            assert_eq!((table.as_str(), id), (t.name(), bad));
            assert!(source.is::<serde_json::Error>(), "{source:?}");
        }
        other => panic!("expected Decode, got {other:?}"),
    }
    // Still held after the error: the row is there and no second claim gets it.
    assert_eq!(live.rows(&t), 1);
    assert!(
        sub.next_delivery_timeout(Duration::from_millis(1500))
            .is_err(),
        "the row was handed out again while its delivery held it"
    );
    drop(d); // unsettled: a failed attempt, back after about a second

    let d = common::next(&sub, WAIT);
    assert_eq!((d.id(), d.attempt()), (bad, 2));
    let e = d.json::<Charge>().unwrap_err();
    d.fail(&e).unwrap();

    let d = common::next(&sub, WAIT);
    assert_eq!((d.id(), d.attempt()), (bad, 3));
    let e = d.json::<Charge>().unwrap_err();
    assert!(e.to_string().contains("does not decode"), "{e}");
    d.dead_letter(e.to_string()).unwrap();
    sub.shutdown(Duration::from_secs(5)).unwrap();

    let dead = live.broker.dead_letters(&t, 10).unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(
        (dead[0].id, dead[0].payload.as_slice()),
        (bad, &b"not json {"[..])
    );
    assert!(
        dead[0].reason.contains("does not decode"),
        "{}",
        dead[0].reason
    );

    // Valid JSON of another shape is a Decode error too.
    let other = Message::json(&serde_json::json!({"account": 1}))
        .unwrap()
        .set("k", "b");
    live.broker.publish(&t, other).unwrap();
    let sub = subscribe(&live, &t);
    let d = common::next(&sub, WAIT);
    assert!(matches!(
        d.json::<Charge>(),
        Err(BrokerError::Decode { .. })
    ));
    d.ack().unwrap();
    sub.shutdown(Duration::from_secs(5)).unwrap();
}
per_db_form!(undecodable_payload_keeps_its_row);

/// A value JSON cannot hold is an `Encode` error, and nothing is published.
#[test]
fn unencodable_value_is_a_typed_error() {
    let mut map = HashMap::new();
    map.insert((1, 2), "a map whose keys are not strings");
    match Message::json(&map) {
        Err(e @ BrokerError::Encode { .. }) => {
            assert!(e.to_string().contains("key must be a string"), "{e}")
        }
        other => panic!("expected Encode, got {other:?}"),
    }
}
