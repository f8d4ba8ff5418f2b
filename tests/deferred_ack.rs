//! Deferred acks (`AckMode::Deferred`): `ack()` returns before the row's commit, and the
//! subscription writes it within the mode's bound (or at once when a full batch is queued);
//! a failed write reaches `Events::ack_failed` and the row's last error; `shutdown` and `close` write what is queued; a crash before the write delivers the
//! row again once its lease ends, as a crash before an ack does. On every database.

mod common;

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::Db;
use sqlbroker::{AckFailed, AckMode, Broker, BrokerError, Events, Form, Message, Settled, Table};

const LEASE: Duration = Duration::from_secs(30);

fn deferred(within: Duration) -> AckMode {
    AckMode::Deferred { within }
}

/// The row is written no sooner than a good part of the bound (the ack did not commit it) and
/// no later than the bound plus a statement's slack; a full batch (256) is written at once.
fn the_bound_is_honoured(db: Db) {
    let Some(live) = common::live(db) else { return };
    let t = live.table(Form::Lease, LEASE);
    live.broker.publish(&t, common::msg("one", "a")).unwrap();
    let within = Duration::from_millis(1_500);
    let sub = live
        .broker
        .subscription(&t)
        .ack_mode(deferred(within))
        .start()
        .unwrap();
    let d = common::next(&sub, Duration::from_secs(10));
    let acked = Instant::now();
    d.ack().unwrap();
    assert_eq!(
        live.rows(&t),
        1,
        "{db:?}: ack() wrote its row before returning"
    );
    assert!(
        common::wait_for(within + Duration::from_secs(2), || live.rows(&t) == 0),
        "{db:?}: the deferred ack was not written within its bound plus 2 s"
    );
    let took = acked.elapsed();
    assert!(
        took >= within / 2,
        "{db:?}: written after {took:?}, before half its bound"
    );
    sub.shutdown(Duration::from_secs(5)).unwrap();

    // A full batch does not wait for the bound.
    const FULL: usize = 256;
    let msgs: Vec<Message> = (0..FULL)
        .map(|i| common::msg(&format!("m{i}"), "a"))
        .collect();
    live.broker.publish_batch(&t, msgs).unwrap();
    let sub = live
        .broker
        .subscription(&t)
        .batch_size(100)
        .ack_mode(deferred(Duration::from_secs(10)))
        .start()
        .unwrap();
    let started = Instant::now();
    for _ in 0..FULL {
        common::next(&sub, Duration::from_secs(10)).ack().unwrap();
    }
    assert!(
        common::wait_for(Duration::from_secs(5), || live.rows(&t) == 0),
        "{db:?}: a full batch of deferred acks waited for the 10 s bound"
    );
    assert!(started.elapsed() < Duration::from_secs(10), "{db:?}");
    sub.shutdown(Duration::from_secs(5)).unwrap();
}
per_db!(the_bound_is_honoured);

/// `shutdown` writes the acks queued (long before their bound), and so does dropping the
/// subscription.
fn shutdown_and_drop_write_the_queue(db: Db) {
    let Some(live) = common::live(db) else { return };
    let t = live.table(Form::Lease, LEASE);
    let msgs: Vec<Message> = (0..6).map(|i| common::msg(&format!("m{i}"), "a")).collect();
    live.broker.publish_batch(&t, msgs).unwrap();
    let mode = deferred(Duration::from_secs(10));
    let sub = live.broker.subscription(&t).ack_mode(mode).start().unwrap();
    for _ in 0..3 {
        common::next(&sub, Duration::from_secs(10)).ack().unwrap();
    }
    // Long enough for a write that did not wait for its bound (10 s) to have committed.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(live.rows(&t), 6, "{db:?}: written before its bound");
    let started = Instant::now();
    sub.shutdown(Duration::from_secs(5)).unwrap();
    assert_eq!(
        live.rows(&t),
        3,
        "{db:?}: shutdown left deferred acks unwritten"
    );
    assert!(started.elapsed() < Duration::from_secs(5), "{db:?}");

    let sub = live.broker.subscription(&t).ack_mode(mode).start().unwrap();
    for _ in 0..3 {
        common::next(&sub, Duration::from_secs(10)).ack().unwrap();
    }
    drop(sub);
    assert_eq!(
        live.rows(&t),
        0,
        "{db:?}: the drop left deferred acks unwritten"
    );
}
per_db!(shutdown_and_drop_write_the_queue);

#[derive(Default)]
struct Seen {
    failed: Mutex<Vec<(i64, String)>>,
    acked: Mutex<Vec<i64>>,
    lost: Mutex<Vec<i64>>,
}

impl Events for Seen {
    fn ack_failed(&self, e: &AckFailed<'_>) {
        self.failed
            .lock()
            .unwrap()
            .push((e.id, e.error.to_string()));
    }
    fn acked(&self, e: &Settled<'_>) {
        self.acked.lock().unwrap().push(e.id);
    }
    fn lease_lost(&self, e: &Settled<'_>) {
        self.lost.lock().unwrap().push(e.id);
    }
}

/// A lease that moves on (another claim's) between `ack()` and the write: the write leaves
/// that row alone and reports `Events::lease_lost` for it; the other rows of the same write
/// are acked and reported so.
fn a_lease_lost_before_the_write_is_reported(db: Db) {
    let Some(live) = common::live(db) else { return };
    let t = live.table(Form::Lease, LEASE);
    let msgs: Vec<Message> = (0..3).map(|i| common::msg(&format!("m{i}"), "a")).collect();
    live.broker.publish_batch(&t, msgs).unwrap();
    let seen = Arc::new(Seen::default());
    let sub = live
        .broker
        .subscription(&t)
        .batch_size(3)
        .events(seen.clone())
        .ack_mode(deferred(Duration::from_secs(10)))
        .start()
        .unwrap();
    let ds: Vec<_> = (0..3)
        .map(|_| common::next(&sub, Duration::from_secs(10)))
        .collect();
    let stolen = ds[1].id();
    for d in ds {
        d.ack().unwrap();
    }
    let later = match db {
        Db::Postgres => "locked_until + interval '1 second'",
        Db::Mysql => "locked_until + INTERVAL 1 SECOND",
        Db::Sqlite => "locked_until + 1",
    };
    live.exec(&format!(
        "UPDATE {} SET locked_until = {later} WHERE id = {stolen}",
        t.name()
    ));
    sub.shutdown(Duration::from_secs(5)).unwrap();
    assert_eq!(
        live.ints(&format!("SELECT id FROM {}", t.name())),
        [Some(stolen)],
        "{db:?}: the write deleted a row whose lease moved on, or left a row it held"
    );
    assert_eq!(
        *seen.lost.lock().unwrap(),
        [stolen],
        "{db:?}: lease_lost events"
    );
    assert_eq!(seen.acked.lock().unwrap().len(), 2, "{db:?}: acked events");
}
per_db!(a_lease_lost_before_the_write_is_reported);

/// Makes every delete on `t` fail (a trigger), as a database refusing the ack would.
fn refuse_deletes(live: &common::Live, t: &Table) {
    let name = t.name();
    match live.db {
        Db::Postgres => {
            live.exec(&format!(
                "CREATE FUNCTION {name}_nodel() RETURNS trigger LANGUAGE plpgsql AS \
                 $$ BEGIN RAISE EXCEPTION 'deletes refused'; END $$"
            ));
            live.exec(&format!(
                "CREATE TRIGGER {name}_nodel BEFORE DELETE ON {name} \
                 FOR EACH ROW EXECUTE FUNCTION {name}_nodel()"
            ));
        }
        Db::Mysql => live.exec(&format!(
            "CREATE TRIGGER {name}_nodel BEFORE DELETE ON {name} FOR EACH ROW \
             SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'deletes refused'"
        )),
        Db::Sqlite => live.exec(&format!(
            "CREATE TRIGGER {name}_nodel BEFORE DELETE ON {name} \
             BEGIN SELECT RAISE(ABORT, 'deletes refused'); END"
        )),
    }
}

/// A write the database refuses: `ack()` had returned `Ok`; the failure reaches
/// `Events::ack_failed`, the row keeps the error as its last
/// error and is failed (its lease cleared, an error counted), not lost.
fn a_failed_write_is_reported(db: Db) {
    let Some(live) = common::live(db) else { return };
    let t = live.table(Form::Lease, LEASE);
    live.broker.publish(&t, common::msg("one", "a")).unwrap();
    refuse_deletes(&live, &t);
    let seen = Arc::new(Seen::default());
    let sub = live
        .broker
        .subscription(&t)
        .events(seen.clone())
        .ack_mode(deferred(Duration::from_millis(20)))
        .start()
        .unwrap();
    let d = common::next(&sub, Duration::from_secs(10));
    let id = d.id();
    d.ack().unwrap();
    assert!(
        common::wait_for(Duration::from_secs(10), || !seen
            .failed
            .lock()
            .unwrap()
            .is_empty()),
        "{db:?}: a refused deferred ack was not reported to Events::ack_failed"
    );
    let failed = seen.failed.lock().unwrap().clone();
    assert_eq!(failed.len(), 1, "{db:?}: {failed:?}");
    assert_eq!(failed[0].0, id, "{db:?}");
    assert!(
        seen.acked.lock().unwrap().is_empty(),
        "{db:?}: reported acked"
    );
    sub.close();
    let job = live.broker.job(&t, id).unwrap().expect("the row is kept");
    let last = job.last_error().unwrap_or_default();
    assert!(
        last.contains("deferred ack could not be written") && last.contains("deletes refused"),
        "{db:?}: the row's last error is {last:?}"
    );
    assert_eq!(
        job.errors(),
        1,
        "{db:?}: the failed attempt was not counted"
    );
}
per_db!(a_failed_write_is_reported);

/// Carries `<table>\t<url>` to the child of the crash test.
const CHILD_ENV: &str = "SQLBROKER_DEFERRED_CHILD";
const SHORT_LEASE: Duration = Duration::from_secs(2);

/// The child half of the crash test: acks one delivery with a 10 s bound, prints
/// `ACKED <id>`, and blocks until it is killed.
#[test]
fn deferred_child_entry() {
    let Some((_, name, url)) = common::child_spec(CHILD_ENV) else {
        return;
    };
    let broker = Broker::connect(&url).expect("child: connect");
    let t = common::describe(&name, Form::Lease, SHORT_LEASE);
    let sub = broker
        .subscription(&t)
        .ack_mode(deferred(Duration::from_secs(10)))
        .start()
        .expect("child: start");
    let d = common::next(&sub, Duration::from_secs(30));
    let id = d.id();
    d.ack().expect("child: ack");
    let mut out = std::io::stdout();
    writeln!(out, "\nACKED {id}").unwrap();
    out.flush().unwrap();
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
    std::process::exit(3);
}

/// A process killed after `ack()` returned and before the write: the row stays, leased, and
/// is delivered again (attempt 2) once its lease ends, as after a crash before an ack.
fn a_crash_before_the_write_redelivers(db: Db) {
    let Some(live) = common::live(db) else { return };
    let t = live.create(common::describe(
        &common::unique("t"),
        Form::Lease,
        SHORT_LEASE,
    ));
    live.broker.publish(&t, common::msg("one", "a")).unwrap();
    let child = common::spawn_child(
        "deferred_child_entry",
        CHILD_ENV,
        &format!("lease\t{}\t{}", t.name(), live.url),
    );
    let id: i64 = child
        .line_after("ACKED ", Duration::from_secs(60))
        .expect("the child did not ack")
        .trim()
        .parse()
        .unwrap();
    // Long enough for a write that did not wait for its bound (10 s) to have committed.
    std::thread::sleep(Duration::from_millis(500));
    child.kill();
    assert_eq!(
        live.rows(&t),
        1,
        "{db:?}: the deferred ack was written before the kill"
    );
    let sub = live.broker.subscription(&t).start().unwrap();
    let d = common::next(&sub, SHORT_LEASE + Duration::from_secs(10));
    assert_eq!((d.id(), d.attempt()), (id, 2), "{db:?}");
    d.ack().unwrap();
    sub.shutdown(Duration::from_secs(5)).unwrap();
}
per_db!(a_crash_before_the_write_redelivers);

/// Only the lease form defers; the others and a bound out of range are refused at start.
fn other_forms_and_bad_bounds_are_refused(db: Db) {
    let Some(live) = common::live(db) else { return };
    let lease = live.table(Form::Lease, LEASE);
    for within in [Duration::ZERO, Duration::from_secs(11)] {
        let r = live
            .broker
            .subscription(&lease)
            .ack_mode(deferred(within))
            .start();
        assert!(
            matches!(
                r,
                Err(BrokerError::InvalidOption {
                    option: "ack_mode",
                    ..
                })
            ),
            "{db:?}: {within:?}: {:?}",
            r.err()
        );
    }
    let forms: &[Form] = match db {
        Db::Sqlite => &[Form::AdvisoryLock],
        _ => &[Form::RowLock, Form::AdvisoryLock],
    };
    for form in forms {
        let t = live.table(*form, LEASE);
        let r = live
            .broker
            .subscription(&t)
            .ack_mode(deferred(Duration::from_millis(10)))
            .start();
        assert!(
            matches!(
                r,
                Err(BrokerError::InvalidOption {
                    option: "ack_mode",
                    ..
                })
            ),
            "{db:?} {form:?}: {:?}",
            r.err()
        );
    }
}
per_db!(other_forms_and_bad_bounds_are_refused);
