//! Priorities: claims take the highest priority first, then the earliest due, then the oldest;
//! within a FIFO group the order stays publish order.

mod common;

use std::time::Duration;

use common::Db;
use sqlbroker::{BrokerError, Form, Message, Table};

fn prioritised(live: &common::Live, form: Form) -> Table {
    let name = common::unique("t");
    live.create(common::describe(&name, form, Duration::from_secs(30)).priorities())
}

/// A high-priority row published after 1,000 low ones is the next one delivered; then the
/// rest come oldest first.
fn high_priority_goes_first(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let t = prioritised(&live, form);
    let low: Vec<Message> = (0..1000)
        .map(|i| Message::new(format!("low {i}").into_bytes()).set("k", "a"))
        .collect();
    live.broker.publish_batch(&t, low).unwrap();
    let high = live
        .broker
        .publish(&t, Message::new(b"high".to_vec()).set("k", "a").priority(5))
        .unwrap();
    let sub = live.broker.subscription(&t).batch_size(1).start().unwrap();
    let d = common::next(&sub, Duration::from_secs(10));
    assert_eq!(
        (d.id(), d.payload()),
        (high, &b"high"[..]),
        "the high priority row waited"
    );
    d.ack().unwrap();
    let d = common::next(&sub, Duration::from_secs(10));
    assert_eq!(d.payload(), b"low 0", "after it, the oldest");
    d.ack().unwrap();
    sub.close();
}
per_db_claim_form!(high_priority_goes_first);

/// Rows of equal priority go by due time, not by id: published with delays in an order other
/// than their ids', then all made due by moving every `run_at` back by the same hour (so their
/// order stays), they are delivered earliest due first; a lower priority row due before them
/// all comes last. The advisory form has no priorities: its rows are all of one priority, and
/// the same due-time order holds. Fails (the order assertion) if the claims' `ORDER BY` drops
/// `run_at` between the priority and the id.
fn equal_priorities_go_by_due_time(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let name = common::unique("t");
    let described = common::describe(&name, form, Duration::from_secs(30));
    let advisory = form == Form::AdvisoryLock;
    let t = live.create(if advisory {
        described
    } else {
        described.priorities()
    });
    let publish = |body: &str, delay: u64, priority: i16| {
        let mut m = Message::new(body.as_bytes().to_vec())
            .set("k", body)
            .deliver_after(Duration::from_secs(delay));
        if !advisory {
            m = m.priority(priority);
        }
        live.broker.publish(&t, m).unwrap()
    };
    // Ids in publish order: third, first, second by due time.
    publish("due 30s", 30, 1);
    publish("due 10s", 10, 1);
    publish("due 20s", 20, 1);
    if !advisory {
        publish("low, due first", 0, 0);
    }
    let back = match db {
        Db::Postgres => "run_at - interval '1 hour'",
        Db::Mysql => "run_at - INTERVAL 1 HOUR",
        Db::Sqlite => "run_at - 3600",
    };
    live.exec(&format!("UPDATE {} SET run_at = {back}", t.name()));
    let sub = live.broker.subscription(&t).batch_size(1).start().unwrap();
    let mut order = Vec::new();
    let expected: &[&str] = if advisory {
        &["due 10s", "due 20s", "due 30s"]
    } else {
        &["due 10s", "due 20s", "due 30s", "low, due first"]
    };
    for _ in 0..expected.len() {
        let d = common::next(&sub, Duration::from_secs(10));
        order.push(String::from_utf8(d.payload().to_vec()).unwrap());
        d.ack().unwrap();
    }
    assert_eq!(order, expected, "equal priorities out of due-time order");
    sub.close();
}
per_db_form!(equal_priorities_go_by_due_time);

/// Priority orders the groups' heads, never the rows of one group.
fn priority_does_not_reorder_a_fifo_group(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let t = Table::new(common::unique("t"))
        .group("customer")
        .fifo()
        .priorities();
    let t = live.create(match form {
        Form::Lease => t.lease(Duration::from_secs(30)),
        _ => t,
    });
    let m = |body: &str, customer: &str, p: i16| {
        Message::new(body.as_bytes().to_vec())
            .set("customer", customer)
            .priority(p)
    };
    live.broker.publish(&t, m("a1", "a", 0)).unwrap();
    live.broker.publish(&t, m("a2", "a", 9)).unwrap();
    live.broker.publish(&t, m("b1", "b", 1)).unwrap();
    let sub = live.broker.subscription(&t).batch_size(1).start().unwrap();
    let mut order = Vec::new();
    for _ in 0..3 {
        let d = common::next(&sub, Duration::from_secs(10));
        order.push(String::from_utf8(d.payload().to_vec()).unwrap());
        d.ack().unwrap();
    }
    // b1 (priority 1) before a1 (priority 0, its group's head); a2 (priority 9) after a1.
    assert_eq!(order, ["b1", "a1", "a2"]);
    sub.close();
}
per_db_claim_form!(priority_does_not_reorder_a_fifo_group);

#[test]
fn advisory_refuses_priorities() {
    let broker = sqlbroker::Broker::connect("sqlite::memory:").unwrap();
    let t = Table::new("p")
        .text_column("k")
        .advisory_lock("{k}")
        .priorities();
    assert!(matches!(
        broker.create_table(&t),
        Err(BrokerError::InvalidTable { .. })
    ));
    let plain = Table::new("q").lease(Duration::from_secs(5));
    broker.create_table(&plain).unwrap();
    assert!(matches!(
        broker.publish(&plain, Message::new(b"x".to_vec()).priority(1)),
        Err(BrokerError::InvalidMessage { .. })
    ));
}
