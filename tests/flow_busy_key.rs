//! README "Concurrency limits": a row over a limit "waits, ready" while the other keys' rows
//! are claimed. A key at its max whose backlog lies ahead of every other key's rows in claim
//! order, longer than one claim reads (10,000 rows), hid them all: each claim read the busy
//! key's rows, passed them by, and gave up. A claim now leaves a key found at its max out of
//! its later pages. Fails (`the other keys' rows waited`) with the later
//! pages reading every key again. Every form (SQLite has no row lock form).

mod common;

use std::time::{Duration, Instant};

use common::{unique, Db};
use sqlbroker::{Delivery, Form, Message, Table, Value};

/// Rows of the busy key ahead of the others: more than a claim reads.
const BACKLOG: usize = 10_050;
/// Other keys, one row each, published after the backlog.
const OTHERS: usize = 5;

/// The keys at their max ahead of the others.
#[derive(Debug, Clone, Copy)]
enum Busy {
    /// One key, "busy".
    One,
    /// The `NULL` key (rows without `k`).
    Null,
    /// 60 keys of 250 rows each, interleaved: more than one claim reads, in all, and still
    /// more with 16 of them left out.
    Many,
}

const MANY: usize = 60;

fn others_pass_a_full_key_with_a_long_backlog(db: Db, form: Form) {
    others_pass(db, form, Busy::One)
}

fn others_pass(db: Db, form: Form, busy: Busy) {
    let Some(l) = common::live(db) else { return };
    // `u`: each row's own key in the advisory form (the limit is what binds).
    let t = Table::new(unique("busykey"))
        .text_column("k")
        .text_column("u")
        .concurrency_limit("{k}", 1);
    let t = l.create_in_form(t, form);
    let mut batch = Vec::new();
    let backlog = match busy {
        Busy::Many => MANY * 250,
        _ => BACKLOG,
    };
    for i in 0..backlog {
        let m = Message::new(b"busy".to_vec()).set("u", format!("b{i}"));
        batch.push(match busy {
            Busy::One => m.set("k", "busy"),
            Busy::Null => m.set("k", Value::Null),
            Busy::Many => m.set("k", format!("busy{}", i % MANY)),
        });
        if batch.len() == 1000 || i + 1 == backlog {
            l.broker
                .publish_batch(&t, std::mem::take(&mut batch))
                .unwrap();
        }
    }
    for i in 0..OTHERS {
        l.broker
            .publish(
                &t,
                Message::new(b"other".to_vec())
                    .set("k", format!("other{i}"))
                    .set("u", format!("o{i}")),
            )
            .unwrap();
    }
    let sub = l
        .broker
        .subscription(&t)
        .batch_size(4)
        .max_in_flight(match busy {
            Busy::Many => MANY + 8,
            _ => 8,
        })
        .poll_interval(Duration::from_millis(50))
        .start()
        .unwrap();
    // Each busy key's first row is held in work (its key at its max) while the others come.
    let mut held: Vec<Delivery> = Vec::new();
    let mut others = 0;
    let deadline = Instant::now() + Duration::from_secs(20);
    while others < OTHERS && Instant::now() < deadline {
        let Ok(d) = sub.next_delivery_timeout(Duration::from_millis(200)) else {
            continue;
        };
        match d.payload() {
            b"busy" => held.push(d),
            _ => {
                d.ack().unwrap();
                others += 1;
            }
        }
    }
    let keys = match busy {
        Busy::Many => MANY,
        _ => 1,
    };
    assert!(
        held.len() <= keys,
        "{db:?} {form:?} {busy:?}: {} busy rows held, a limit of 1 on {keys} keys",
        held.len()
    );
    assert_eq!(
        others, OTHERS,
        "{db:?} {form:?} {busy:?}: the other keys' rows waited behind the busy keys' backlog"
    );
    drop(held);
    sub.shutdown(Duration::from_secs(10)).unwrap();
}

per_db_form!(others_pass_a_full_key_with_a_long_backlog);

/// The `NULL` key at its max (rows without the column) is left out as a value is.
fn null_key(db: Db, form: Form) {
    others_pass(db, form, Busy::Null)
}
per_db_form!(null_key);

/// 60 keys at their max, their rows together more than a claim reads: more than 16 values
/// left out (the first cap; fails with it). The lease form and SQLite's advisory form (the
/// servers' row lock and advisory forms hold a pooled connection per row in work: 60 is past
/// the pool).
mod many_keys {
    use super::*;
    #[test]
    fn sqlite_lease() {
        others_pass(Db::Sqlite, Form::Lease, Busy::Many)
    }
    #[test]
    fn postgres_lease() {
        others_pass(Db::Postgres, Form::Lease, Busy::Many)
    }
    #[cfg(feature = "mysql")]
    #[test]
    fn mysql_lease() {
        others_pass(Db::Mysql, Form::Lease, Busy::Many)
    }
    #[test]
    fn sqlite_advisory() {
        others_pass(Db::Sqlite, Form::AdvisoryLock, Busy::Many)
    }
}
