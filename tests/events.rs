//! The application's hooks (`Events`): each claim, settlement and failed claim is reported
//! once, as what it was, with the handler's time.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::Db;
use sqlbroker::{ClaimFailed, ClaimedRows, Events, Form, Settled};

#[derive(Default)]
struct Record {
    seen: Mutex<Vec<String>>,
    claimed_rows: Mutex<usize>,
    handled_for: Mutex<Vec<(i64, Duration)>>,
}

impl Events for Record {
    fn claimed(&self, e: &ClaimedRows<'_>) {
        *self.claimed_rows.lock().unwrap() += e.rows;
    }
    fn claim_failed(&self, e: &ClaimFailed<'_>) {
        self.seen
            .lock()
            .unwrap()
            .push(format!("claim failed: {}", e.error));
    }
    fn acked(&self, e: &Settled<'_>) {
        self.note("acked", e);
    }
    fn retried(&self, e: &Settled<'_>) {
        self.note("retried", e);
    }
    fn dead_lettered(&self, e: &Settled<'_>) {
        self.note(&format!("dead: {}", e.reason.unwrap_or("?")), e);
    }
    fn lease_lost(&self, e: &Settled<'_>) {
        self.note("lease lost", e);
    }
}

impl Record {
    fn note(&self, what: &str, e: &Settled<'_>) {
        self.seen
            .lock()
            .unwrap()
            .push(format!("{what} {} #{}", e.id, e.attempt));
        self.handled_for.lock().unwrap().push((e.id, e.handled_for));
    }
}

fn every_outcome_is_reported_once(db: Db) {
    let Some(live) = common::live(db) else { return };
    let t = live.table(Form::Lease, Duration::from_secs(30));
    let ids: Vec<i64> = (0..4)
        .map(|i| {
            live.broker
                .publish(&t, common::msg(&format!("m{i}"), "a"))
                .unwrap()
        })
        .collect();
    let record = Arc::new(Record::default());
    let sub = live
        .broker
        .subscription(&t)
        .batch_size(4)
        .events(record.clone())
        .start()
        .unwrap();
    let mut got: Vec<_> = (0..4)
        .map(|_| common::next(&sub, Duration::from_secs(10)))
        .collect();
    got.sort_by_key(|d| d.id());
    sub.close();
    let [a, b, c, d] = <[_; 4]>::try_from(got).ok().unwrap();
    std::thread::sleep(Duration::from_millis(60));
    a.ack().unwrap();
    b.retry_after(Duration::from_secs(60)).unwrap();
    c.dead_letter("bad input").unwrap();
    let later = match db {
        Db::Postgres => "locked_until + interval '1 second'",
        Db::Mysql => "locked_until + INTERVAL 1 SECOND",
        Db::Sqlite => "locked_until + 1",
    };
    live.exec(&format!(
        "UPDATE {} SET locked_until = {later} WHERE id = {}",
        t.name(),
        d.id()
    ));
    assert!(d.ack().unwrap_err().is_lease_lost());

    let seen = record.seen.lock().unwrap().clone();
    assert_eq!(
        seen,
        [
            format!("acked {} #1", ids[0]),
            format!("retried {} #1", ids[1]),
            format!("dead: bad input {} #1", ids[2]),
            format!("lease lost {} #1", ids[3]),
        ]
    );
    assert_eq!(*record.claimed_rows.lock().unwrap(), 4);
    let first = record.handled_for.lock().unwrap()[0];
    assert!(
        first.1 >= Duration::from_millis(60),
        "the handler's time is not measured: {first:?}"
    );

    // A claim that fails (the table is gone) is reported too.
    let sub = live
        .broker
        .subscription(&t)
        .events(record.clone())
        .start()
        .unwrap();
    live.exec(&format!("DROP TABLE {}", t.name()));
    let failed = common::wait_for(Duration::from_secs(10), || {
        record
            .seen
            .lock()
            .unwrap()
            .iter()
            .any(|s| s.starts_with("claim failed") && s.contains(t.name()))
    });
    assert!(failed, "{:?}", record.seen.lock().unwrap());
    sub.close();
}
per_db!(every_outcome_is_reported_once);
