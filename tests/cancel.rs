//! `Broker::cancel`: a job not in work (ready, scheduled, dead) is removed or kept completed
//! and cancelled; a job in work finishes its attempt: a failure does not retry it, an ack
//! completes it; unknown and finished jobs answer `false` and change nothing.

mod common;

use std::time::Duration;

use common::{live, msg, next, wait_for, Db, Live};
use sqlbroker::{Delivery, Form, JobState, RetryPolicy, Subscription, Table};

const WAIT: Duration = Duration::from_secs(10);

fn subscribe(l: &Live, t: &Table) -> Subscription {
    l.broker
        .subscription(t)
        .batch_size(1)
        .max_in_flight(1)
        .retry_policy(RetryPolicy::exponential(
            Duration::from_millis(1),
            Duration::from_millis(1),
        ))
        .start()
        .unwrap()
}

/// Ready, scheduled and dead jobs are removed; unknown ids and acked jobs are `false`.
fn cancel_jobs_not_in_work(db: Db, form: Form) {
    let Some(l) = live(db) else { return };
    let t = l.table(form, Duration::from_secs(30));
    let b = &l.broker;
    let dead = b.publish(&t, msg("dead", "d")).unwrap();
    let sub = subscribe(&l, &t);
    next(&sub, WAIT).dead_letter("bad").unwrap();
    let acked = b.publish(&t, msg("acked", "e")).unwrap();
    next(&sub, WAIT).ack().unwrap();
    sub.shutdown(Duration::from_secs(5)).unwrap();
    let ready = b.publish(&t, msg("ready", "a")).unwrap();
    let later = b
        .publish(
            &t,
            msg("later", "b").deliver_after(Duration::from_secs(3600)),
        )
        .unwrap();
    let keep = b.publish(&t, msg("keep", "c")).unwrap();
    for id in [ready, later, dead] {
        // Fails if a job not in work is not removed.
        assert!(b.cancel(&t, id).unwrap(), "job {id}");
        assert!(b.job(&t, id).unwrap().is_none(), "job {id}");
    }
    for id in [ready, acked, keep + 1000] {
        assert!(!b.cancel(&t, id).unwrap(), "job {id}");
    }
    // Nothing else changed.
    assert_eq!(l.rows(&t), 1);
    assert_eq!(b.job(&t, keep).unwrap().unwrap().state(), JobState::Ready);
    let sub = subscribe(&l, &t);
    let d = next(&sub, WAIT);
    assert_eq!(d.id(), keep);
    d.ack().unwrap();
    sub.shutdown(Duration::from_secs(5)).unwrap();
}
per_db_form!(cancel_jobs_not_in_work);

/// On a table that keeps completed rows, a cancelled job is kept completed and cancelled; a
/// completed one is `false` and stays as it was.
fn cancel_keeps_completed_rows(db: Db, form: Form) {
    let Some(l) = live(db) else { return };
    let t = l.create(
        common::describe(&common::unique("t"), form, Duration::from_secs(30))
            .keep_completed(Duration::from_secs(3600)),
    );
    let b = &l.broker;
    let done = b.publish(&t, msg("done", "a")).unwrap();
    let sub = subscribe(&l, &t);
    next(&sub, WAIT).ack().unwrap();
    sub.shutdown(Duration::from_secs(5)).unwrap();
    let queued = b.publish(&t, msg("queued", "b")).unwrap();
    assert!(b.cancel(&t, queued).unwrap());
    let j = b.job(&t, queued).unwrap().unwrap();
    // Fails if the cancelled row is deleted (or left live) on a table that keeps completed rows.
    assert_eq!(j.state(), JobState::Completed);
    assert_eq!(j.dead_reason(), Some("cancelled"));
    assert!(!b.cancel(&t, done).unwrap());
    let j = b.job(&t, done).unwrap().unwrap();
    assert_eq!((j.state(), j.dead_reason()), (JobState::Completed, None));
}
per_db_form!(cancel_keeps_completed_rows);

/// Cancels `d`'s job from another thread while `d` is in work, then settles `d` with
/// `settle`; returns what cancel said. Lease and advisory: the request is seen by the handler
/// before it settles; row lock: cancel waits for the row, so the settlement comes first or
/// while it waits, either way before it answers.
fn cancel_in_work(l: &Live, t: &Table, d: Delivery, settle: impl FnOnce(Delivery)) -> bool {
    let (b, t2, id) = (l.broker.clone(), t.clone(), d.id());
    let cancel = std::thread::spawn(move || b.cancel(&t2, id));
    // (An advisory row in work reads as ready: its state is not waited on, its mark is.)
    if t.form() != Form::RowLock {
        // Fails if the handler cannot see the request.
        assert!(
            wait_for(WAIT, || d.cancel_requested().unwrap()),
            "the request never reached the handler"
        );
    } else {
        std::thread::sleep(Duration::from_millis(300));
    }
    settle(d);
    cancel.join().unwrap().unwrap()
}

/// A job cancelled in work whose handler then fails is not retried.
fn cancel_in_work_then_fail(db: Db, form: Form) {
    let Some(l) = live(db) else { return };
    let t = l.table(form, Duration::from_secs(30));
    let id = l.broker.publish(&t, msg("work", "a")).unwrap();
    let sub = subscribe(&l, &t);
    let d = next(&sub, WAIT);
    assert_eq!(d.id(), id);
    let said = cancel_in_work(&l, &t, d, |d| d.fail("boom").unwrap());
    assert!(said, "cancel of a job in work that then failed said false");
    // Fails if the failure retried the row: it would be delivered again within a second.
    assert!(
        sub.next_delivery_timeout(Duration::from_secs(3)).is_err(),
        "the cancelled job ran again"
    );
    match l.broker.job(&t, id).unwrap() {
        // Lease and advisory: the retry statement ended it as a dead letter "cancelled".
        Some(j) => {
            assert_ne!(form, Form::RowLock, "{j:?}");
            assert_eq!(
                (j.state(), j.dead_reason()),
                (JobState::Dead, Some("cancelled"))
            );
            assert_eq!(j.last_error(), Some("boom"));
        }
        // Row lock: cancel removed it once the delivery let it go.
        None => assert_eq!(form, Form::RowLock),
    }
    sub.shutdown(Duration::from_secs(5)).unwrap();
}
per_db_form!(cancel_in_work_then_fail);

/// A job cancelled in work whose handler then acks is completed (here: deleted), never run
/// again.
fn cancel_in_work_then_ack(db: Db, form: Form) {
    let Some(l) = live(db) else { return };
    let t = l.table(form, Duration::from_secs(30));
    let id = l.broker.publish(&t, msg("work", "a")).unwrap();
    let sub = subscribe(&l, &t);
    let d = next(&sub, WAIT);
    let said = cancel_in_work(&l, &t, d, |d| d.ack().unwrap());
    // Lease and advisory: the request was written while it was in work (true: it will not
    // run again); row lock: cancel found it acked (false: finished, nothing to cancel).
    assert_eq!(said, form != Form::RowLock);
    assert!(l.broker.job(&t, id).unwrap().is_none());
    assert!(sub.next_delivery_timeout(Duration::from_secs(2)).is_err());
    sub.shutdown(Duration::from_secs(5)).unwrap();
}
per_db_form!(cancel_in_work_then_ack);

/// A row claimed ahead into a subscription's buffer, cancelled there, then handed back
/// unhandled (the subscription shuts down): no other subscription runs it, and cancel said
/// `true`. Lease and advisory: the mark is honoured by the hand-back, which ends the row as
/// cancelled; row lock: cancel waits for the row's lock, which the hand-back lets go, and
/// removes it.
///
/// Fails (`the hand-back left the cancelled row claimable`) on the lease and advisory forms
/// when the unclaim statement ignores the mark (tried: the old lease unclaim, `SET
/// locked_until = NULL, attempts = attempts - 1`); the claim that then takes it ends it too
/// (the next test), so no handler runs it even then.
fn cancel_holds_for_a_row_handed_back(db: Db, form: Form) {
    let Some(l) = live(db) else { return };
    let t = l.table(form, Duration::from_secs(30));
    let first = l.broker.publish(&t, msg("first", "a")).unwrap();
    let ahead = l.broker.publish(&t, msg("ahead", "b")).unwrap();
    // Two rows in one claim: the second waits in the buffer while the first is in hand.
    let other = l.connect();
    let sub = other
        .subscription(&t)
        .batch_size(2)
        .max_in_flight(2)
        .start()
        .unwrap();
    let d = next(&sub, WAIT);
    assert_eq!(d.id(), first);
    assert!(
        wait_for(WAIT, || l.broker.job(&t, ahead).unwrap().unwrap().state()
            == JobState::InFlight),
        "the second row was not claimed ahead"
    );
    let broker = l.connect();
    let table = t.clone();
    let cancel = std::thread::spawn(move || broker.cancel(&table, ahead));
    if form != Form::RowLock {
        // The lease and advisory forms' cancel marks the row and returns at once.
        assert!(cancel.join().unwrap().unwrap(), "cancel said false");
        d.ack().unwrap();
        sub.shutdown(Duration::from_secs(5)).unwrap();
    } else {
        // Row lock: cancel waits for the buffer to let the row go.
        std::thread::sleep(Duration::from_millis(300));
        d.ack().unwrap();
        sub.shutdown(Duration::from_secs(5)).unwrap();
        assert!(cancel.join().unwrap().unwrap(), "cancel said false");
    }
    // Ended by the hand-back itself (lease, advisory) or removed by cancel (row lock), before
    // any other claim could look at it.
    match l.broker.job(&t, ahead).unwrap() {
        Some(j) => {
            assert_ne!(form, Form::RowLock, "{j:?}");
            assert_eq!(
                (j.state(), j.dead_reason()),
                (JobState::Dead, Some("cancelled")),
                "the hand-back left the cancelled row claimable"
            );
        }
        None => assert_eq!(
            form,
            Form::RowLock,
            "the hand-back deleted the cancelled row"
        ),
    }
    let next_sub = subscribe(&l, &t);
    assert!(
        next_sub
            .next_delivery_timeout(Duration::from_secs(3))
            .is_err(),
        "the handed-back cancelled job ran"
    );
    next_sub.shutdown(Duration::from_secs(5)).unwrap();
}
per_db_form!(cancel_holds_for_a_row_handed_back);

/// A row whose cancel was requested while a claim held it, and whose holder never settled
/// (its process died: the lease expired, the key's session ended), is never delivered by
/// the next claim: the claim ends it as cancelled. The mark is written by hand here, as a
/// cancel of the held row wrote it, and the lease cleared, as its expiry would.
///
/// Fails (`a claim delivered a cancelled job`) when claims ignore the mark (tried: `sort`
/// without the `cancel_requested` branch).
fn a_claim_never_runs_a_cancelled_row(l: &Live, form: Form) {
    let t = l.table(form, Duration::from_secs(30));
    let marked = l.broker.publish(&t, msg("cancelled", "a")).unwrap();
    let lease = if form == Form::Lease {
        ", locked_until = NULL, attempts = 1"
    } else {
        ""
    };
    l.exec(&format!(
        "UPDATE {} SET cancel_requested = 1{lease} WHERE id = {marked}",
        t.name()
    ));
    let plain = l.broker.publish(&t, msg("plain", "b")).unwrap();
    let sub = subscribe(l, &t);
    let d = next(&sub, WAIT);
    assert_eq!(d.id(), plain, "a claim delivered a cancelled job");
    d.ack().unwrap();
    assert!(
        sub.next_delivery_timeout(Duration::from_secs(2)).is_err(),
        "a claim delivered a cancelled job"
    );
    assert!(
        wait_for(WAIT, || l
            .broker
            .job(&t, marked)
            .unwrap()
            .is_some_and(|j| j.state() == JobState::Dead)),
        "the cancelled row was not ended"
    );
    let j = l.broker.job(&t, marked).unwrap().unwrap();
    assert_eq!(j.dead_reason(), Some("cancelled"));
    sub.shutdown(Duration::from_secs(5)).unwrap();
}

mod a_claim_never_runs_a_cancelled_row {
    use super::*;
    fn run(db: Db, form: Form) {
        if let Some(l) = live(db) {
            super::a_claim_never_runs_a_cancelled_row(&l, form);
        }
    }
    #[test]
    fn sqlite_lease() {
        run(Db::Sqlite, Form::Lease)
    }
    #[test]
    fn sqlite_advisory() {
        run(Db::Sqlite, Form::AdvisoryLock)
    }
    #[test]
    fn postgres_lease() {
        run(Db::Postgres, Form::Lease)
    }
    #[test]
    fn postgres_advisory() {
        run(Db::Postgres, Form::AdvisoryLock)
    }
    #[cfg(feature = "mysql")]
    #[test]
    fn mysql_lease() {
        run(Db::Mysql, Form::Lease)
    }
    #[cfg(feature = "mysql")]
    #[test]
    fn mysql_advisory() {
        run(Db::Mysql, Form::AdvisoryLock)
    }
}

/// Advisory: a queued row whose key another row in work holds is cancelled at once (`true`,
/// well within the statement timeout) and never runs: once the holder settles, the claim that
/// finds the request ends the row as cancelled.
///
/// Fails (`cancel waited for another row's key`) when cancel waits for the key (tried: the
/// old wait, which ran out the statement timeout and then failed blaming the delivery).
fn cancel_of_a_row_whose_key_another_row_holds(l: &Live) {
    let t = l.table(Form::AdvisoryLock, Duration::from_secs(30));
    let holder = l.broker.publish(&t, msg("holder", "a")).unwrap();
    let queued = l.broker.publish(&t, msg("queued", "a")).unwrap();
    let sub = subscribe(l, &t);
    let d = next(&sub, WAIT);
    assert_eq!(d.id(), holder);
    let started = std::time::Instant::now();
    let said = l.connect().cancel(&t, queued).unwrap();
    // Well under the statement timeout (30 s) the old cancel waited out, with room for a
    // loaded machine.
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "cancel waited for another row's key: {:?}",
        started.elapsed()
    );
    assert!(said, "cancel of a queued row said false");
    d.ack().unwrap();
    assert!(
        sub.next_delivery_timeout(Duration::from_secs(3)).is_err(),
        "the cancelled job ran"
    );
    // The claim that finds the mark ends the row; on a loaded machine it may come late.
    assert!(
        wait_for(WAIT, || l
            .broker
            .job(&t, queued)
            .unwrap()
            .is_some_and(|j| j.state() == JobState::Dead)),
        "the cancelled row was not ended"
    );
    let j = l
        .broker
        .job(&t, queued)
        .unwrap()
        .expect("the cancelled row");
    assert_eq!(
        (j.state(), j.dead_reason()),
        (JobState::Dead, Some("cancelled"))
    );
    sub.shutdown(Duration::from_secs(5)).unwrap();
}

mod cancel_of_a_row_whose_key_another_row_holds {
    use super::*;
    fn run(db: Db) {
        if let Some(l) = live(db) {
            super::cancel_of_a_row_whose_key_another_row_holds(&l);
        }
    }
    #[test]
    fn sqlite() {
        run(Db::Sqlite)
    }
    #[test]
    fn postgres() {
        run(Db::Postgres)
    }
    #[cfg(feature = "mysql")]
    #[test]
    fn mysql() {
        run(Db::Mysql)
    }
}

// ---- Cancel every job matching (issue 38, item 14) ----

/// The states a form's jobs of key "x" are cancelled in, as an operator's "cancel all
/// matching" presses them: the lease form lists its rows in work in flight; the others list
/// every due row as ready.
fn states_of(form: Form) -> &'static [JobState] {
    match form {
        Form::Lease => &[JobState::InFlight, JobState::Ready],
        _ => &[JobState::Ready],
    }
}

/// `cancel_matching` counts only what it changed and reads only what is left to do: a job in
/// work (held by a delivery) and five more of key "x", two of key "y" untouched. Passes of
/// at most three jobs go on after the last id each acted on. Lease and advisory: the jobs in
/// work (lease: the five leased by another process too; advisory: the five wait on the held
/// key) are asked to cancel once, and a press after that does not read, mark or count them
/// again. Row lock: the job in work keeps its row; the pass waits for it `row_wait` at most,
/// reports it busy and cancels the others. Then the held job, failed, never runs again.
///
/// Seen to fail with the listing's "not asked to cancel yet" left out (the second press of
/// the lease and advisory forms reads the marked jobs again: three passes, not one), and with
/// the row lock form's cancel waiting for the row (the pass ends in the statement timeout).
fn cancel_matching_counts_what_it_changed(db: Db, form: Form) {
    let Some(l) = live(db) else { return };
    let t = l.table(form, Duration::from_secs(30));
    let b = &l.broker;
    let held = b.publish(&t, msg("held", "x")).unwrap();
    let sub = subscribe(&l, &t);
    let d = next(&sub, WAIT);
    assert_eq!(d.id(), held);
    let more: Vec<i64> = (0..5)
        .map(|n| b.publish(&t, msg(&format!("x{n}"), "x")).unwrap())
        .collect();
    let others: Vec<i64> = (0..2)
        .map(|n| b.publish(&t, msg(&format!("y{n}"), "y")).unwrap())
        .collect();
    if form == Form::Lease {
        // The five in work too, leased by another process: more jobs in flight than a pass
        // takes.
        let later = match db {
            Db::Postgres => "now() + interval '1 hour'",
            Db::Mysql => "UTC_TIMESTAMP() + INTERVAL 1 HOUR",
            Db::Sqlite => "CAST(strftime('%s','now') AS INTEGER) + 3600",
        };
        let ids: Vec<String> = more.iter().map(i64::to_string).collect();
        l.exec(&format!(
            "UPDATE {} SET locked_until = {later}, attempts = attempts + 1 WHERE id IN ({})",
            t.name(),
            ids.join(", ")
        ));
    }
    let x = sqlbroker::JobFilter::new().column("k", "x");
    let wait = Duration::from_millis(300);
    let press = |state: JobState| -> (u64, Vec<i64>, u32) {
        // Passes of three until one says no more: what they changed, what they left busy.
        let (mut cancelled, mut busy, mut passes, mut after) = (0, Vec::new(), 0, None);
        loop {
            let pass = sqlbroker::BulkPass::new()
                .after(after)
                .limit(3)
                .row_wait(wait)
                .time(Duration::from_secs(20));
            let started = std::time::Instant::now();
            let r = b
                .cancel_matching(&t, &x.clone().in_state(state), &pass)
                .unwrap();
            let in_work: Vec<i64> = r
                .skipped()
                .iter()
                .filter(|(_, why)| *why == sqlbroker::SkipReason::InWork)
                .map(|(id, _)| *id)
                .collect();
            assert!(r.error().is_none(), "{r:?}");
            assert!(r.seen() <= 3, "{r:?}");
            // Fails while one job in work makes the pass wait out the statement timeout.
            assert!(
                started.elapsed() < wait * (in_work.len() as u32 + 1) + Duration::from_secs(3),
                "a pass took {:?}: {r:?}",
                started.elapsed()
            );
            cancelled += r.changed();
            busy.extend(in_work);
            passes += 1;
            assert!(passes < 20, "{r:?}");
            after = r.last();
            if !r.more() {
                return (cancelled, busy, passes);
            }
        }
    };
    let mut total = 0;
    let mut busy = Vec::new();
    for state in states_of(form) {
        let (n, b, _) = press(*state);
        total += n;
        busy.extend(b);
    }
    match form {
        Form::RowLock => {
            assert_eq!(total, 5, "the five not in work");
            assert_eq!(busy, [held], "the job in work, reported");
        }
        _ => {
            assert_eq!(total, 6, "the five, and the one in work asked to cancel");
            assert!(busy.is_empty());
        }
    }
    // Again, from the first: nothing left but (row lock) the job in work, still busy.
    let mut again = 0;
    let mut busy_again = Vec::new();
    for state in states_of(form) {
        let (n, b, passes) = press(*state);
        again += n;
        busy_again.extend(b);
        // Fails while the marked jobs are read, marked and counted again.
        assert_eq!(passes, 1, "one pass finds nothing more to do");
    }
    assert_eq!(
        again, 0,
        "a second press changes nothing and counts nothing"
    );
    if form == Form::RowLock {
        assert_eq!(busy_again, [held]);
    }
    for id in &more {
        let j = b.job(&t, *id).unwrap();
        // Removed, or (advisory: their key is held by the job in work) asked to cancel.
        assert!(j.as_ref().is_none_or(|j| j.cancel_requested()), "{j:?}");
    }
    for id in &others {
        assert!(
            b.job(&t, *id).unwrap().is_some(),
            "another key is untouched"
        );
    }
    // Bad input: refused, typed, nothing changed.
    let nope = sqlbroker::JobFilter::new().column("nope", "x");
    let pass = sqlbroker::BulkPass::new();
    assert!(matches!(
        b.cancel_matching(&t, &nope.in_state(JobState::Ready), &pass),
        Err(sqlbroker::BrokerError::InvalidOption { .. })
    ));
    assert!(matches!(
        b.cancel_matching(&t, &x.clone().in_state(JobState::Completed), &pass),
        Err(sqlbroker::BrokerError::InvalidOption { .. })
    ));
    for bad in [pass.clone().limit(0), pass.clone().time(Duration::ZERO)] {
        assert!(matches!(
            b.cancel_matching(&t, &x.clone().in_state(JobState::Scheduled), &bad),
            Err(sqlbroker::BrokerError::InvalidOption { .. })
        ));
    }
    assert_eq!(
        b.job(&t, others[0]).unwrap().unwrap().state(),
        JobState::Ready
    );
    // The job in work fails; it never runs again (row lock: a pass cancels it once free).
    d.fail("boom").unwrap();
    if form == Form::RowLock {
        let r = b
            .cancel_matching(
                &t,
                &x.clone().in_state(JobState::Scheduled),
                &pass.row_wait(wait),
            )
            .unwrap();
        assert_eq!((r.changed(), r.skipped().len()), (1, 0), "{r:?}");
    }
    let d = next(&sub, WAIT);
    assert!(others.contains(&d.id()), "only y jobs run: {}", d.id());
    d.ack().unwrap();
    let d = next(&sub, WAIT);
    assert!(others.contains(&d.id()), "only y jobs run: {}", d.id());
    d.ack().unwrap();
    assert!(
        sub.next_delivery_timeout(Duration::from_secs(2)).is_err(),
        "a cancelled job ran"
    );
    sub.shutdown(Duration::from_secs(5)).unwrap();
}
per_db_form!(cancel_matching_counts_what_it_changed);
