//! A subscription's health and its stuck handlers (`Subscription::health`,
//! `SubscriptionBuilder::stuck_after`, `Events::stuck`), on every database and form.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use common::{next, Db};
use sqlbroker::{Events, Form, Message, Stuck};

/// The stuck reports an [`Events`] hook saw: (id, timed out).
#[derive(Default)]
struct Seen(Mutex<Vec<(i64, bool)>>);

impl Events for Seen {
    fn stuck(&self, e: &Stuck<'_>) {
        self.0.lock().unwrap().push((e.id, e.timed_out));
    }
}

/// A handler that runs past `stuck_after` is reported once (the hook, `health().stuck()`), and
/// counted down when its delivery is settled; one that settles in time is never reported; one
/// its handler timeout already failed is still reported while its handler runs, marked so.
///
/// Fails (`not reported`) with no report scheduled, (`reported twice`) with a report per look,
/// (`still counted`) with a settlement that does not count it down, and (`reported in time`)
/// with a report that does not check the delivery is still alive.
fn a_stuck_handler_is_reported_once(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let t = live.table(form, Duration::from_secs(30));
    for i in 0..3 {
        live.broker
            .publish(
                &t,
                Message::new(format!("{i}").into_bytes()).set("k", format!("k{i}")),
            )
            .unwrap();
    }
    let seen = Arc::new(Seen::default());
    let sub = live
        .broker
        .subscription(&t)
        .max_in_flight(1)
        .stuck_after(Duration::from_millis(300))
        .handler_timeout(Duration::from_millis(1500))
        .events(seen.clone())
        .start()
        .unwrap();
    // In time: never reported.
    let quick = next(&sub, Duration::from_secs(10));
    let quick_id = quick.id();
    quick.ack().unwrap();
    // Past it: reported once, while it lasts.
    let slow = next(&sub, Duration::from_secs(10));
    assert!(
        common::wait_for(Duration::from_secs(5), || sub.health().stuck() == 1),
        "not reported"
    );
    assert!(!sub.health().is_healthy(), "healthy with a stuck handler");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        *seen.0.lock().unwrap(),
        vec![(slow.id(), false)],
        "reported twice, or not"
    );
    slow.ack().unwrap();
    assert_eq!(sub.health().stuck(), 0, "still counted");
    assert!(
        !seen.0.lock().unwrap().iter().any(|(id, _)| *id == quick_id),
        "reported in time"
    );
    // Past its handler timeout (1.5 s) too: reported at 300 ms, the timeout later; a handler
    // timed out before its report says so.
    let late = next(&sub, Duration::from_secs(10));
    let late_id = late.id();
    assert!(common::wait_for(Duration::from_secs(5), || late.timed_out()));
    assert!(seen.0.lock().unwrap().contains(&(late_id, false)));
    assert_eq!(sub.health().stuck(), 1);
    drop(late);
    assert_eq!(sub.health().stuck(), 0, "a dropped delivery still counted");
    sub.shutdown(Duration::from_secs(10)).unwrap();
}
per_db_form!(a_stuck_handler_is_reported_once);

/// A stuck report made after the handler timeout says `timed_out`.
fn a_timed_out_handler_is_reported_as_such(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let t = live.table(form, Duration::from_secs(30));
    live.broker
        .publish(&t, Message::new(b"x".to_vec()).set("k", "a"))
        .unwrap();
    let seen = Arc::new(Seen::default());
    let sub = live
        .broker
        .subscription(&t)
        .max_in_flight(1)
        .handler_timeout(Duration::from_millis(200))
        .stuck_after(Duration::from_millis(600))
        .events(seen.clone())
        .start()
        .unwrap();
    let d = next(&sub, Duration::from_secs(10));
    let id = d.id();
    assert!(common::wait_for(Duration::from_secs(5), || !seen
        .0
        .lock()
        .unwrap()
        .is_empty()));
    assert_eq!(*seen.0.lock().unwrap(), vec![(id, true)]);
    drop(d);
    sub.close();
}
per_db_form!(a_timed_out_handler_is_reported_as_such);

/// A running subscription is healthy: its claim loop alive, a recent claim, no error, its
/// renewals on time (lease form; `None` in the others); a table dropped under it makes its
/// claims fail: not healthy, the error named; once closed, its claim loop is not alive.
///
/// Fails (`no claim marked`, `renewals late`) with marks never written, (`late at the start`)
/// with no renewal counted at the start, and (`healthy with a dropped table`) with a health
/// that ignores the last error.
fn a_subscription_reports_its_health(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let t = live.table(form, Duration::from_secs(2));
    let sub = live
        .broker
        .subscription(&t)
        .workers(2)
        .poll_interval(Duration::from_millis(100))
        .start()
        .unwrap();
    let started = SystemTime::now();
    // Ready at once: no lease held yet is no lease late (found by review: a new lease
    // subscription read unhealthy until the timer's first round, half a lease).
    if form == Form::Lease {
        assert_eq!(
            sub.health().renewals_on_time(),
            Some(true),
            "late at the start"
        );
    }
    assert!(
        common::wait_for(Duration::from_secs(5), || sub
            .health()
            .last_claim()
            .is_some_and(|at| at >= started)),
        "no claim marked"
    );
    // Past what the start counts (three quarters of the 2 s lease), on time only if the
    // timer's rounds (every half lease) go on.
    std::thread::sleep(Duration::from_millis(1600));
    if form == Form::Lease {
        assert!(
            common::wait_for(Duration::from_secs(5), || sub.health().renewals_on_time()
                == Some(true)),
            "renewals late: {:?}",
            sub.health()
        );
    }
    let h = sub.health();
    assert!(h.claim_loop_alive(), "{h:?}");
    assert_eq!(h.workers(), (2, 2));
    if form != Form::Lease {
        assert_eq!(h.renewals_on_time(), None);
    }
    assert!(h.is_healthy(), "{h:?}");
    live.exec(&format!("DROP TABLE {}", t.name()));
    assert!(
        common::wait_for(Duration::from_secs(10), || sub
            .health()
            .last_error()
            .is_some()),
        "no error after the table was dropped"
    );
    assert!(!sub.health().is_healthy(), "healthy with a dropped table");
    sub.close();
    assert!(
        common::wait_for(Duration::from_secs(10), || !sub.health().claim_loop_alive()),
        "alive after close"
    );
}
per_db_form!(a_subscription_reports_its_health);
