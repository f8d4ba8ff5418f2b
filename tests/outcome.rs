//! Handlers say what happened ([`Outcome`] from a `Subscription::run` handler, and
//! `Delivery::cancel`), and the defaults: a finite `max_attempts` of 25 and retries that wait
//! the subscription's retry policy, on every database x form.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::{next, Db};
use sqlbroker::{BrokerError, Delivery, Form, NextError, Outcome, RetryPolicy, Table};

const LEASE: Duration = Duration::from_secs(30);
const WAIT: Duration = Duration::from_secs(10);
/// How long the snoozed row stays away.
const SNOOZE: Duration = Duration::from_secs(2);

/// The attempts column of row `id`, read directly.
fn attempts(live: &common::Live, t: &Table, id: i64) -> i64 {
    live.int(&format!(
        "SELECT attempts FROM {} WHERE id = {id}",
        t.name()
    ))
}

/// Four rows, one per outcome; a `run` handler returns `Ok(())`, `Ok(DeadLetter)`,
/// `Ok(RetryAfter(2 s))` and `Ok(Cancel)` by the row's `k`. Then: the acked and cancelled rows
/// are gone, the dead one is dead with the handler's reason and its attempt counted, the
/// snoozed one is scheduled with its attempt counted, and comes back no sooner than 2 s later
/// as attempt 2. `Ran` counts each outcome once.
///
/// Fails when an outcome is settled as another: with `Outcome::Cancel` settled as a retry (3
/// rows left), or `RetryAfter` or `DeadLetter` settled as an ack (1 row left), the assertion on
/// `live.rows(&t)` (the dead and the snoozed row, 2) fails.
fn run_outcomes_settle_rows(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let t = live.table(form, LEASE);
    let mut ids = Vec::new();
    for k in ["ack", "dead", "snooze", "cancel"] {
        ids.push(live.broker.publish(&t, common::msg(k, k)).unwrap());
    }
    let [ack, dead, snooze, cancel] = ids[..] else {
        unreachable!()
    };
    let sub = live.broker.subscription(&t).start().unwrap();
    let handled = AtomicUsize::new(0);
    let snoozed_at = Mutex::new(None);
    let deadline = Instant::now() + WAIT;
    let ran = sub
        .run(1, |d| {
            if handled.fetch_add(1, Ordering::SeqCst) + 1 == 4 || Instant::now() > deadline {
                sub.close();
            }
            let said = match d.get("k").and_then(|v| v.as_str()) {
                Some("dead") => Outcome::DeadLetter("bad payload".into()),
                Some("snooze") => {
                    *snoozed_at.lock().unwrap() = Some(Instant::now());
                    Outcome::RetryAfter(SNOOZE)
                }
                Some("cancel") => Outcome::Cancel,
                _ => ().into(),
            };
            Ok::<_, String>(said)
        })
        .unwrap();
    assert_eq!(
        (ran.acked, ran.dead_lettered, ran.retried, ran.cancelled),
        (1, 1, 1, 1),
        "{ran:?}"
    );
    assert_eq!((ran.failed, ran.unsettled), (0, 0), "{ran:?}");
    drop(sub);

    // Acked and cancelled: deleted.
    assert_eq!(live.rows(&t), 2, "not the dead and the snoozed row left");
    let left = live.ints(&format!("SELECT id FROM {} ORDER BY id", t.name()));
    assert_eq!(
        left,
        [Some(dead), Some(snooze)],
        "acked {ack}, cancelled {cancel}"
    );
    // Dead, with the handler's reason and the attempt counted.
    let dl = live.broker.dead_letters(&t, 10).unwrap();
    assert_eq!(dl.len(), 1);
    assert_eq!(
        (dl[0].id, dl[0].attempts, dl[0].reason.as_str()),
        (dead, 1, "bad payload")
    );
    // Snoozed: scheduled, its attempt counted.
    let stats = live.broker.stats(&t).unwrap();
    assert_eq!(
        (stats.ready, stats.scheduled, stats.dead),
        (0, 1, 1),
        "{stats:?}"
    );
    assert_eq!(attempts(&live, &t, snooze), 1, "the snooze was not counted");

    let sub = live.broker.subscription(&t).start().unwrap();
    let d = next(&sub, WAIT);
    let away = snoozed_at.lock().unwrap().expect("never snoozed").elapsed();
    assert_eq!((d.id(), d.attempt()), (snooze, 2));
    assert!(away >= SNOOZE, "back after {away:?}, before its {SNOOZE:?}");
    d.ack().unwrap();
    assert_eq!(live.rows(&t), 1);
    sub.shutdown(Duration::from_secs(5)).unwrap();
}
per_db_form!(run_outcomes_settle_rows);

/// On a table that keeps completed rows a cancel keeps the row, completed and finished with
/// the reason "cancelled", its attempt counted; out of the dead letters and never claimed
/// again. One row cancelled by a `run` handler's `Outcome::Cancel`, one by `Delivery::cancel`.
///
/// Fails if the cancel deleted the row, or settled it as a retry (the `cancelled` count is 0
/// or 1, not 2).
fn cancel_keeps_completed_rows(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let name = common::unique("t");
    let t =
        live.create(common::describe(&name, form, LEASE).keep_completed(Duration::from_secs(600)));
    let by_run = live.broker.publish(&t, common::msg("a", "a")).unwrap();
    let sub = live.broker.subscription(&t).start().unwrap();
    let ran = sub
        .run(1, |d| {
            sub.close();
            assert_eq!(d.id(), by_run);
            Ok::<_, String>(Outcome::Cancel)
        })
        .unwrap();
    assert_eq!((ran.cancelled, ran.unsettled), (1, 0), "{ran:?}");
    drop(sub);
    let direct = live.broker.publish(&t, common::msg("b", "b")).unwrap();
    let sub = live.broker.subscription(&t).start().unwrap();
    let d = next(&sub, WAIT);
    assert_eq!(d.id(), direct);
    d.cancel().unwrap();

    let cancelled = live.rows_where(
        &t,
        "completed_at IS NOT NULL AND dead_at IS NOT NULL AND dead_reason = 'cancelled' \
         AND attempts = 1",
    );
    assert_eq!(cancelled, 2, "not both kept completed and cancelled");
    assert!(live.broker.dead_letters(&t, 10).unwrap().is_empty());
    let stats = live.broker.stats(&t).unwrap();
    assert_eq!(
        (stats.ready, stats.dead, stats.completed),
        (0, 0, Some(2)),
        "{stats:?}"
    );
    assert_eq!(
        sub.next_delivery_timeout(Duration::from_millis(600)).err(),
        Some(NextError::Timeout),
        "a cancelled row was delivered again"
    );
    sub.shutdown(Duration::from_secs(5)).unwrap();
}
per_db_form!(cancel_keeps_completed_rows);

/// A table that says nothing about attempts: a row whose handler fails every time is
/// dead-lettered at attempt 25, with a reason naming it, and never delivered again (the retry
/// policy's delays are zero to keep it fast).
///
/// Fails with unlimited attempts as the default (the row is never dead-lettered: the
/// `wait_for` assertion), or another cap (the `ran.failed` and `attempts` figures).
fn failing_for_ever_dies_at_attempt_25(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let t = live.table(form, LEASE);
    let id = live.broker.publish(&t, common::msg("poison", "p")).unwrap();
    let sub = live
        .broker
        .subscription(&t)
        .retry_policy(RetryPolicy::exponential(Duration::ZERO, Duration::ZERO))
        .start()
        .unwrap();
    let ran = std::thread::scope(|s| {
        let watcher = s.spawn(|| {
            let dead = common::wait_for(Duration::from_secs(60), || {
                !live.broker.dead_letters(&t, 1).unwrap().is_empty()
            });
            // A 26th delivery, had there been one, would have come within this.
            std::thread::sleep(Duration::from_millis(300));
            sub.close();
            dead
        });
        let ran = sub
            .run(1, |d| Err::<(), _>(format!("boom #{}", d.attempt())))
            .unwrap();
        assert!(
            watcher.join().unwrap(),
            "the failing row was never dead-lettered"
        );
        ran
    });
    assert_eq!((ran.failed, ran.acked), (25, 0), "{ran:?}");
    let dead = live.broker.dead_letters(&t, 10).unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!((dead[0].id, dead[0].attempts), (id, 25));
    assert_eq!(
        dead[0].reason,
        "attempt 25 of max_attempts 25 failed: boom #25"
    );
}
per_db_form!(failing_for_ever_dies_at_attempt_25);

/// `max_attempts(u32::MAX)` asks for no limit: a row claimed at attempt 26 (its attempts set
/// directly) is delivered, not dead-lettered by the claim.
///
/// Fails if the default applied instead (the claim dead-letters the row: the first `next`
/// times out).
fn unlimited_on_request(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let name = common::unique("t");
    let t = live.create(common::describe(&name, form, LEASE).max_attempts(u32::MAX));
    let id = live.broker.publish(&t, common::msg("x", "x")).unwrap();
    live.exec(&format!("UPDATE {name} SET attempts = 30 WHERE id = {id}"));
    let sub = live.broker.subscription(&t).start().unwrap();
    let d = next(&sub, WAIT);
    assert_eq!(d.id(), id);
    d.retry_after(Duration::ZERO).unwrap();
    let d = next(&sub, WAIT);
    assert_eq!(d.id(), id);
    d.ack().unwrap();
    assert!(live.broker.dead_letters(&t, 10).unwrap().is_empty());
    sub.shutdown(Duration::from_secs(5)).unwrap();
}
per_db_form!(unlimited_on_request);

/// `Delivery::retry` and a delivery dropped unsettled wait the subscription's retry policy
/// (here 3 s, no jitter): the row is scheduled, not ready, and comes back no sooner.
///
/// Fails with `retry` due at once (the old behaviour: the `(ready, scheduled)` assertion sees
/// `(1, 0)`), or with the drop's old fixed delay (1 s: the "back after" assertion, 2 s).
fn retry_and_drop_wait_the_policy(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let t = live.table(form, LEASE);
    let policy = RetryPolicy::exponential(Duration::from_secs(3), Duration::from_secs(3));
    let sub = live
        .broker
        .subscription(&t)
        .retry_policy(policy.without_jitter())
        .start()
        .unwrap();
    for (what, settle) in [
        ("retry", (|d: Delivery| d.retry().unwrap()) as fn(Delivery)),
        ("drop", drop as fn(Delivery)),
    ] {
        let id = live.broker.publish(&t, common::msg(what, what)).unwrap();
        let d = next(&sub, WAIT);
        assert_eq!(d.id(), id);
        let at = Instant::now();
        settle(d);
        let stats = live.broker.stats(&t).unwrap();
        assert_eq!((stats.ready, stats.scheduled), (0, 1), "{what}: {stats:?}");
        let d = next(&sub, WAIT);
        let away = at.elapsed();
        assert_eq!((d.id(), d.attempt()), (id, 2), "{what}");
        assert!(
            away >= Duration::from_secs(3),
            "{what}: back after {away:?}"
        );
        d.ack().unwrap();
    }
    sub.shutdown(Duration::from_secs(5)).unwrap();
}
per_db_form!(retry_and_drop_wait_the_policy);

/// A lease cancel is fenced by the token: after the lease was lost to another claim, the late
/// cancel is `LeaseLost` and changes nothing (the row stays, leased by the new holder, whose
/// own cancel then deletes it).
///
/// Fails if the cancel were not fenced (the late cancel returns `Ok`: the `LeaseLost` match).
fn late_lease_cancel_is_lease_lost(db: Db) {
    let Some(live) = common::live(db) else { return };
    let t = live.table(Form::Lease, Duration::from_secs(1));
    let id = live.broker.publish(&t, common::msg("x", "x")).unwrap();
    let a = live.broker.subscription(&t).start().unwrap();
    let late = next(&a, WAIT);
    match a.shutdown(Duration::ZERO) {
        Err(BrokerError::Unsettled { unsettled: 1, .. }) => {}
        other => panic!("shutdown with a delivery held returned {other:?}"),
    }
    let b = live.connect().subscription(&t).start().unwrap();
    let taken = next(&b, WAIT); // once A's lease expires
    assert_eq!((taken.id(), taken.attempt()), (id, 2));
    match late.cancel() {
        Err(BrokerError::LeaseLost { id: lost, .. }) if lost == id => {}
        other => panic!("late cancel: expected LeaseLost, got {other:?}"),
    }
    assert_eq!(
        live.rows_where(&t, "locked_until IS NOT NULL AND attempts = 2"),
        1,
        "the late cancel changed the row"
    );
    taken.cancel().unwrap();
    assert_eq!(live.rows(&t), 0);
    b.shutdown(Duration::from_secs(5)).unwrap();
}
per_db!(late_lease_cancel_is_lease_lost);

/// Counts the settlements the hooks report, by kind.
#[derive(Default)]
struct Hooks(Mutex<Vec<&'static str>>);

impl sqlbroker::Events for Hooks {
    fn acked(&self, _: &sqlbroker::Settled<'_>) {
        self.0.lock().unwrap().push("acked");
    }
    fn retried(&self, _: &sqlbroker::Settled<'_>) {
        self.0.lock().unwrap().push("retried");
    }
    fn dead_lettered(&self, _: &sqlbroker::Settled<'_>) {
        self.0.lock().unwrap().push("dead");
    }
    fn cancelled(&self, _: &sqlbroker::Settled<'_>) {
        self.0.lock().unwrap().push("cancelled");
    }
}

/// A cancel is reported to the `Events` hooks as a cancel, once, and nothing else.
///
/// Fails if it were reported as a dead letter (the hooks saw `["dead"]`).
fn cancel_is_reported_as_such(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let t = live.table(form, LEASE);
    live.broker.publish(&t, common::msg("c", "c")).unwrap();
    let hooks = std::sync::Arc::new(Hooks::default());
    let sub = live
        .broker
        .subscription(&t)
        .events(hooks.clone())
        .start()
        .unwrap();
    next(&sub, WAIT).cancel().unwrap();
    assert_eq!(*hooks.0.lock().unwrap(), ["cancelled"]);
    sub.shutdown(Duration::from_secs(5)).unwrap();
}
per_db_form!(cancel_is_reported_as_such);
