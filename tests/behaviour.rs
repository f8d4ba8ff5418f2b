//! The behaviour suite, run for every database x form that supports it.

mod common;

use std::time::Duration;

use common::Db;
use sqlbroker::{Form, Message};

fn claim_then_ack(db: Db, form: Form) {
    let Some(broker) = common::broker(db) else { return };
    let t = common::table(&broker, form, Duration::from_secs(30));
    broker.publish(&t, Message::new(b"one".to_vec()).set("k", "a")).unwrap();
    let sub = broker.subscription(&t).start().unwrap();
    let d = sub.next_delivery_timeout(Duration::from_secs(10)).expect("a delivery");
    assert_eq!(d.payload(), b"one");
    assert_eq!(d.attempt(), 1);
    assert_eq!(d.get("k").and_then(|v| v.as_str()), Some("a"));
    d.ack().unwrap();
    assert!(sub.next_delivery_timeout(Duration::from_millis(600)).is_err(), "acked row came back");
    sub.shutdown(Duration::from_secs(5)).unwrap();
}
per_db_form!(claim_then_ack);
