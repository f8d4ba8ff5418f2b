//! Jobs that compose (README "Composing jobs"): promises an adversarial review found broken,
//! one test each, on every database x form.
//!
//! - A handler's dead letter whose reason is the text `cancelled` is a dead letter, for the
//!   jobs waiting on it and for later publishes naming it: a cancel is told apart by the row
//!   (completed and cancelled, or a cancel requested in work), never by the reason text.
//! - A settled job's answer does not change: an operator's cancel of a dead letter leaves
//!   later publishes naming it reading it dead-lettered.
//! - A callback its settlement released keeps what the job produced through an operator's
//!   cancel or requeue of the job.
//! - `after_in` naming a job of a table dropped by hand reads it cancelled, and so does a
//!   requeue of a dead letter waiting on one.
//! - A settlement skips (and forgets) the waits of jobs whose table was dropped by hand.
//! - A purged dead letter's answer is kept a day from the purge, however long ago it settled.
//! - A cancel kept completed reads cancelled after a prune deletes its row.
//! - `drop_table` leaves the waits of other tables' dead letters on its jobs: their requeue
//!   is refused.
//! - Publishes naming one job from many threads at once all succeed; one the server ends as a
//!   deadlock's victim (made on cue) runs again.
//! - A callback reads the settlement that released it (outcome and output), even after that
//!   job was requeued and settled again.
//! - Jobs waiting on a job whose table was dropped by hand are settled: by a later publish
//!   naming it, or by the sweeper.

mod common;

use std::time::Duration;

use common::{next, unique, Db, Live};
use sqlbroker::{BrokerError, Form, JobOutcome, JobState, Message, Table};

/// A table with dependencies in `form` (the advisory form's key reads a column unique per
/// message), shaped further by `more`; dropped at the end.
fn table_with(l: &Live, form: Form, more: impl FnOnce(Table) -> Table) -> Table {
    let name = unique("r2_dep");
    let t = more(Table::new(&name).text_column("u").dependencies());
    let t = match form {
        Form::Lease => t.lease(Duration::from_secs(30)),
        Form::AdvisoryLock => t.advisory_lock(format!("{name}-{{u}}")),
        _ => t,
    };
    l.create(t)
}

fn table(l: &Live, form: Form) -> Table {
    table_with(l, form, |t| t)
}

/// Deletes the waits and heads of `t` (the waits' table is shared by every test).
fn forget(l: &Live, t: &Table) {
    l.forget_deps(t.name());
}

fn message(body: &str) -> Message {
    Message::new(body.as_bytes().to_vec()).set("u", format!("{body}-{}", unique("u")))
}

fn state(l: &Live, t: &Table, id: i64) -> Option<JobState> {
    l.broker.job(t, id).unwrap().map(|j| j.state())
}

fn reason(l: &Live, t: &Table, id: i64) -> Option<String> {
    l.broker
        .job(t, id)
        .unwrap()
        .and_then(|j| j.dead_reason().map(str::to_string))
}

/// Settles the next delivery of `sub`, which must be `id`, by `settle`.
fn settle_next(sub: &sqlbroker::Subscription, id: i64, settle: impl FnOnce(sqlbroker::Delivery)) {
    let d = next(sub, Duration::from_secs(10));
    assert_eq!(d.id(), id, "the next delivery");
    settle(d);
}

/// A handler's dead letter whose reason is the text `cancelled` reads as dead-lettered: to
/// the job waiting on it, to a later `after` naming it (dead-lettered `.. was dead-lettered`)
/// and a later `after_settled` (`DeadLettered`). Fails (`a later publish naming it`: `was
/// cancelled`) with the outcome read from the reason text.
fn a_dead_letter_reading_cancelled_is_dead(db: Db, form: Form) {
    let Some(l) = common::live(db) else { return };
    let t = table(&l, form);
    let p = l.broker.publish(&t, message("p")).unwrap();
    let q = l.broker.publish(&t, message("q")).unwrap();
    let c = l.broker.publish(&t, message("c").after(p)).unwrap();
    let sub = l.broker.subscription(&t).max_in_flight(1).start().unwrap();
    settle_next(&sub, p, |d| d.dead_letter("cancelled").unwrap());
    settle_next(&sub, q, |d| d.dead_letter("cancelled").unwrap());
    sub.shutdown(Duration::from_secs(10)).unwrap();
    assert_eq!(state(&l, &t, c), Some(JobState::Dead));
    let want = format!("job {p} it waits on was dead-lettered");
    assert_eq!(reason(&l, &t, c), Some(want), "a job waiting on it");
    let later = l.broker.publish(&t, message("x").after(q)).unwrap();
    let want = format!("job {q} it waits on was dead-lettered");
    assert_eq!(
        reason(&l, &t, later),
        Some(want),
        "a later publish naming it"
    );
    let s = l.broker.publish(&t, message("s").after_settled(q)).unwrap();
    let job = l.broker.job(&t, s).unwrap().unwrap();
    assert_eq!(job.waits_on()[0].outcome, Some(JobOutcome::DeadLettered));
    forget(&l, &t);
}
per_db_form!(a_dead_letter_reading_cancelled_is_dead);

/// An operator's cancel of a dead letter removes it (or keeps it completed and cancelled)
/// but leaves its answer: a later `after` naming it is dead-lettered `.. was dead-lettered`,
/// on a table that keeps completed rows too. Fails (`keep completed: false`: `was
/// cancelled`) with the cancel settling the dead letter again as cancelled.
fn cancelling_a_dead_letter_keeps_its_answer(db: Db, form: Form) {
    let Some(l) = common::live(db) else { return };
    for keep in [false, true] {
        let t = table_with(&l, form, |t| match keep {
            true => t.keep_completed(Duration::from_secs(3600)),
            false => t,
        });
        let p = l.broker.publish(&t, message("p")).unwrap();
        let sub = l.broker.subscription(&t).max_in_flight(1).start().unwrap();
        settle_next(&sub, p, |d| d.dead_letter("bad").unwrap());
        sub.shutdown(Duration::from_secs(10)).unwrap();
        assert!(l.broker.cancel(&t, p).unwrap());
        let later = l.broker.publish(&t, message("x").after(p)).unwrap();
        let want = format!("job {p} it waits on was dead-lettered");
        assert_eq!(reason(&l, &t, later), Some(want), "keep completed: {keep}");
        forget(&l, &t);
    }
}
per_db_form!(cancelling_a_dead_letter_keeps_its_answer);

/// An operator's cancel or requeue of a dead letter leaves what it produced to the
/// `after_settled` callback its settlement released: the callback, run after the cancel or
/// requeue, reads the dead letter's outcome and output. Fails (`requeued: false`: output
/// `None`) with the cancel writing the head's output again (as `NULL`), and (`requeued:
/// true`) with the requeue's reset of the head taking it.
fn a_released_callback_keeps_its_output(db: Db, form: Form) {
    let Some(l) = common::live(db) else { return };
    let t = table_with(&l, form, Table::outputs);
    for requeue in [false, true] {
        let p = l.broker.publish(&t, message("p")).unwrap();
        let s = l.broker.publish(&t, message("s").after_settled(p)).unwrap();
        let sub = l.broker.subscription(&t).max_in_flight(1).start().unwrap();
        settle_next(&sub, p, |d| {
            d.set_output(b"partial").unwrap();
            d.dead_letter("bad").unwrap()
        });
        sub.shutdown(Duration::from_secs(10)).unwrap();
        assert_eq!(state(&l, &t, s), Some(JobState::Ready));
        match requeue {
            true => assert!(l.broker.requeue_dead(&t, p).unwrap()),
            false => assert!(l.broker.cancel(&t, p).unwrap()),
        }
        let sub = l.broker.subscription(&t).max_in_flight(1).start().unwrap();
        let d = next(&sub, Duration::from_secs(10));
        let d = match d.id() == s {
            true => d,
            false => {
                d.ack().unwrap();
                next(&sub, Duration::from_secs(10))
            }
        };
        assert_eq!(d.id(), s);
        let waited = d.waited_on().unwrap();
        assert_eq!(
            (waited[0].outcome, waited[0].output.as_deref()),
            (Some(JobOutcome::DeadLettered), Some(&b"partial"[..])),
            "requeued: {requeue}"
        );
        d.ack().unwrap();
        sub.shutdown(Duration::from_secs(10)).unwrap();
    }
    forget(&l, &t);
}
per_db_form!(a_released_callback_keeps_its_output);

/// `after_in` naming a job of a table dropped by hand (its record left) reads it cancelled, as
/// README says of a job whose table is dropped: the new job is dead-lettered (`after`,
/// `.. was cancelled`) or waits on nothing (`after_settled`, reading `Cancelled`), named
/// before the drop or not. One `drop_table` dropped has no record: refused as a table never
/// made (`InvalidMessage`), nothing written. Fails (`after_in a dropped table`: a database
/// error, the table missing) with the job's row read in a table that is gone.
fn after_in_a_dropped_table_reads_cancelled(db: Db) {
    let Some(l) = common::live(db) else { return };
    let emails = table(&l, Form::Lease);
    let charges = table(&l, Form::Lease);
    let paid = l.broker.publish(&charges, message("paid")).unwrap();
    // Named once while it exists: its record checked (and remembered).
    l.broker
        .publish(&emails, message("r").after_in(&charges, paid))
        .unwrap();
    l.exec(&format!("DROP TABLE {}", charges.name()));
    let later = l
        .broker
        .publish(&emails, message("r").after_in(&charges, paid))
        .unwrap_or_else(|e| panic!("after_in a dropped table: {e}"));
    let want = format!(
        "job {paid} of table {} it waits on was cancelled",
        charges.name()
    );
    assert_eq!(state(&l, &emails, later), Some(JobState::Dead));
    assert_eq!(reason(&l, &emails, later), Some(want));
    let s = l
        .broker
        .publish(&emails, message("s").after_settled_in(&charges, paid + 1))
        .unwrap_or_else(|e| panic!("after_settled_in a dropped table: {e}"));
    assert_eq!(state(&l, &emails, s), Some(JobState::Ready));
    let job = l.broker.job(&emails, s).unwrap().unwrap();
    assert_eq!(job.waits_on()[0].outcome, Some(JobOutcome::Cancelled));

    let refunds = table(&l, Form::Lease);
    let refund = l.broker.publish(&refunds, message("refund")).unwrap();
    l.broker
        .publish(&emails, message("r").after_in(&refunds, refund))
        .unwrap();
    l.broker.drop_table(&refunds).unwrap();
    let before = l.rows(&emails);
    let e = l
        .broker
        .publish(&emails, message("r").after_in(&refunds, refund));
    assert!(
        matches!(&e, Err(BrokerError::InvalidMessage { .. })),
        "after_in a table drop_table dropped: {e:?}"
    );
    assert_eq!(l.rows(&emails), before, "nothing written");
    l.exec(&format!(
        "DELETE FROM sqlbroker_tables WHERE name = '{}'",
        charges.name()
    ));
    for t in [&charges, &refunds, &emails] {
        forget(&l, t);
    }
}
per_db!(after_in_a_dropped_table_reads_cancelled);

/// A job waiting on another from a table dropped by hand (its record left): the other's
/// settlement skips it and forgets its waits, and releases the rest. Fails (the parent's
/// `ack().unwrap()`: a database error, the table missing; the job of its own table waiting on
/// it is never released) with the release run on a table that is gone.
fn a_dependents_table_dropped_by_hand(db: Db, form: Form) {
    let Some(l) = common::live(db) else { return };
    let charges = table(&l, form);
    let emails = table(&l, form);
    let paid = l.broker.publish(&charges, message("paid")).unwrap();
    let c = l
        .broker
        .publish(&charges, message("c").after(paid))
        .unwrap();
    l.broker
        .publish(&emails, message("r").after_in(&charges, paid))
        .unwrap();
    l.exec(&format!("DROP TABLE {}", emails.name()));
    let sub = l
        .broker
        .subscription(&charges)
        .max_in_flight(1)
        .start()
        .unwrap();
    settle_next(&sub, paid, |d| d.ack().unwrap());
    settle_next(&sub, c, |d| d.ack().unwrap());
    sub.shutdown(Duration::from_secs(10)).unwrap();
    assert_eq!(l.rows(&charges), 0, "both acked");
    let waits = format!(
        "SELECT COUNT(*) FROM sqlbroker_deps WHERE child_table = '{}'",
        emails.name()
    );
    assert_eq!(l.int(&waits), 0, "the gone job's waits");
    l.exec(&format!(
        "DELETE FROM sqlbroker_tables WHERE name = '{}'",
        emails.name()
    ));
    forget(&l, &charges);
    forget(&l, &emails);
}
per_db_form!(a_dependents_table_dropped_by_hand);

/// A purged dead letter's head is kept a day from the purge, however long ago the job
/// settled: here it settled (by its head's time) two days ago while a callback waited on it,
/// which the sweeper lets go once the callback settles. A later `after` naming it is still
/// dead-lettered. Fails (`after a purged dead letter`: `None`, the job ran as after an ack) with
/// the purge leaving the head's time as it was.
fn a_purged_dead_letters_head_is_kept_a_day(db: Db, form: Form) {
    let Some(l) = common::live(db) else { return };
    let t = table(&l, form);
    let p = l.broker.publish(&t, message("p")).unwrap();
    let s = l.broker.publish(&t, message("s").after_settled(p)).unwrap();
    let sub = l.broker.subscription(&t).max_in_flight(1).start().unwrap();
    settle_next(&sub, p, |d| d.dead_letter("bad").unwrap());
    let two_days_ago = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
        - 2 * 86_400_000;
    l.exec(&format!(
        "UPDATE sqlbroker_deps SET at = {two_days_ago} WHERE parent_table = '{}' AND parent = \
         {p} AND child_table = ''",
        t.name()
    ));
    assert!(l.broker.purge_dead(&t, p).unwrap());
    settle_next(&sub, s, |d| d.ack().unwrap());
    sub.shutdown(Duration::from_secs(10)).unwrap();
    // The sweeper's rounds (one in 2 s when idle) have passed the head.
    std::thread::sleep(Duration::from_secs(5));
    let later = l.broker.publish(&t, message("x").after(p)).unwrap();
    let want = format!("job {p} it waits on was dead-lettered");
    assert_eq!(
        reason(&l, &t, later),
        Some(want),
        "after a purged dead letter"
    );
    forget(&l, &t);
}
per_db_form!(a_purged_dead_letters_head_is_kept_a_day);

/// A cancelled job of a table that keeps completed rows reads cancelled after a prune deletes
/// its row (which told it until then): the prune records it in its head, kept a day, as a
/// purge does a dead letter. Fails (`after a pruned cancel`: `None`, the job ran as after an
/// ack) with a prune that records nothing.
fn a_pruned_cancel_reads_cancelled(db: Db, form: Form) {
    let Some(l) = common::live(db) else { return };
    let t = table_with(&l, form, |t| t.keep_completed(Duration::from_secs(1)));
    let p = l.broker.publish(&t, message("p")).unwrap();
    let acked = l.broker.publish(&t, message("acked")).unwrap();
    assert!(l.broker.cancel(&t, p).unwrap());
    let sub = l.broker.subscription(&t).max_in_flight(1).start().unwrap();
    settle_next(&sub, acked, |d| d.ack().unwrap());
    sub.shutdown(Duration::from_secs(10)).unwrap();
    std::thread::sleep(Duration::from_millis(2100));
    assert_eq!(l.broker.prune_completed(&t).unwrap(), 2);
    let later = l.broker.publish(&t, message("x").after(p)).unwrap();
    let want = format!("job {p} it waits on was cancelled");
    assert_eq!(reason(&l, &t, later), Some(want), "after a pruned cancel");
    let runs = l.broker.publish(&t, message("y").after(acked)).unwrap();
    assert_eq!(
        state(&l, &t, runs),
        Some(JobState::Ready),
        "after a pruned ack"
    );
    forget(&l, &t);
}
per_db_form!(a_pruned_cancel_reads_cancelled);

/// `drop_table` of a table whose job a dead letter of another table waits on (`after`) leaves
/// that dead letter its waits: its requeue is refused (`ParentFailed`: the job it waits on
/// is gone, cancelled), not run. Fails (`requeue of a job whose parent's table is gone`:
/// `Ok(true)`, the job requeued with no wait) with the drop deleting every wait on its jobs.
fn a_dead_dependent_of_a_dropped_table_stays_refused(db: Db, form: Form) {
    let Some(l) = common::live(db) else { return };
    let charges = table(&l, form);
    let emails = table(&l, form);
    let paid = l.broker.publish(&charges, message("paid")).unwrap();
    let r = l
        .broker
        .publish(&emails, message("r").after_in(&charges, paid))
        .unwrap();
    let sub = l
        .broker
        .subscription(&charges)
        .max_in_flight(1)
        .start()
        .unwrap();
    settle_next(&sub, paid, |d| d.dead_letter("bad").unwrap());
    sub.shutdown(Duration::from_secs(10)).unwrap();
    assert_eq!(state(&l, &emails, r), Some(JobState::Dead));
    l.broker.drop_table(&charges).unwrap();
    match l.broker.requeue_dead(&emails, r) {
        Err(BrokerError::ParentFailed { parent, .. }) => assert_eq!(parent, paid),
        other => panic!("requeue of a job whose parent's table is gone: {other:?}"),
    }
    assert_eq!(
        state(&l, &emails, r),
        Some(JobState::Dead),
        "refused, unchanged"
    );
    assert!(l.broker.purge_dead(&emails, r).unwrap());
    let left = format!(
        "SELECT COUNT(*) FROM sqlbroker_deps WHERE parent_table = '{}' AND child_table <> ''",
        charges.name()
    );
    assert_eq!(l.int(&left), 0, "its waits go with its purge");
    forget(&l, &charges);
    forget(&l, &emails);
}
per_db_form!(a_dead_dependent_of_a_dropped_table_stays_refused);

/// Publishes naming one job, from many threads at once (`after` and `after_settled`, the job
/// in its table, acked, and dead-lettered), all succeed.
fn concurrent_publishes_naming_one_job(db: Db) {
    let Some(l) = common::live(db) else { return };
    let t = table(&l, Form::Lease);
    let live = l.broker.publish(&t, message("live")).unwrap();
    let acked = l.broker.publish(&t, message("acked")).unwrap();
    let dead = l.broker.publish(&t, message("dead")).unwrap();
    let sub = l.broker.subscription(&t).max_in_flight(1).start().unwrap();
    settle_next(&sub, live, |d| {
        d.retry_after(Duration::from_secs(3600)).unwrap()
    });
    settle_next(&sub, acked, |d| d.ack().unwrap());
    settle_next(&sub, dead, |d| d.dead_letter("bad").unwrap());
    sub.shutdown(Duration::from_secs(10)).unwrap();
    for p in [live, acked, dead] {
        let errors: Vec<String> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..8)
                .map(|i| {
                    let (b, t) = (l.connect(), &t);
                    s.spawn(move || {
                        (0..20)
                            .filter_map(|j| {
                                let m = match (i + j) % 2 {
                                    0 => message("c").after(p),
                                    _ => message("c").after_settled(p),
                                };
                                b.publish(t, m).err()
                            })
                            .map(|e| e.to_string())
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
        });
        assert!(errors.is_empty(), "publishes naming {p} failed: {errors:?}");
    }
    assert_eq!(
        l.broker.stats(&t).unwrap().waiting,
        160,
        "waiting on {live}"
    );
    forget(&l, &t);
}
per_db!(concurrent_publishes_naming_one_job);

/// A publish naming a job, ended by the server as a deadlock's victim, runs again and
/// succeeds. The deadlock is made on cue: a session of its own blocks the publish's insert
/// into the table (PostgreSQL: a share lock of the table; MariaDB: a range lock in
/// `REPEATABLE READ`, after writes that make the publish the lighter transaction, the one
/// rolled back) and then asks for the named job's row in `sqlbroker_deps`, which the publish
/// holds. Fails (`publish`: `Database { kind: Transient, .. }`, deadlock) with a publish that
/// does not run again.
// The session that makes the deadlock drives a server's own crate: built with its feature.
#[cfg_attr(
    not(all(feature = "postgres", feature = "mysql")),
    allow(unused_variables)
)]
fn a_publish_a_deadlock_ended_runs_again(db: Db) {
    let Some(l) = common::live(db) else { return };
    let t = table(&l, Form::Lease);
    let heavy = unique("r2_heavy");
    l.track(&heavy);
    l.exec(&format!("CREATE TABLE {heavy} (n INT)"));
    let p = l.broker.publish(&t, message("p")).unwrap();
    // A job waits on it: its head is there to be locked.
    l.broker.publish(&t, message("c").after(p)).unwrap();
    let (locked_tx, locked) = std::sync::mpsc::channel::<()>();
    let (go_tx, go) = std::sync::mpsc::channel::<()>();
    let (url, name) = (l.url.clone(), t.name().to_string());
    let head = format!(
        "SELECT parent FROM sqlbroker_deps WHERE parent_table = '{name}' AND parent = {p} AND \
         child_table = '' AND child = 0 FOR UPDATE"
    );
    let holder = std::thread::spawn(move || match db {
        #[cfg(feature = "postgres")]
        Db::Postgres => {
            let mut c = postgres::Client::connect(&url, postgres::NoTls).unwrap();
            c.batch_execute(&format!("BEGIN; LOCK TABLE {name} IN SHARE MODE"))
                .unwrap();
            locked_tx.send(()).unwrap();
            go.recv().unwrap();
            c.batch_execute(&head).unwrap();
            c.batch_execute("COMMIT").unwrap();
        }
        #[cfg(feature = "mysql")]
        Db::Mysql => {
            use mysql::prelude::Queryable;
            let mut c = mysql::Conn::new(mysql::Opts::from_url(&url).unwrap()).unwrap();
            c.query_drop("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                .unwrap();
            c.query_drop("START TRANSACTION").unwrap();
            let rows: Vec<String> = (0..500).map(|n| format!("({n})")).collect();
            c.query_drop(format!(
                "INSERT INTO {heavy} (n) VALUES {}",
                rows.join(", ")
            ))
            .unwrap();
            c.query_drop(format!("SELECT id FROM {name} WHERE id > 0 FOR UPDATE"))
                .unwrap();
            locked_tx.send(()).unwrap();
            go.recv().unwrap();
            c.query_drop(&head).unwrap();
            c.query_drop("COMMIT").unwrap();
        }
        #[allow(unreachable_patterns)]
        _ => unreachable!("a deadlock on {db:?}"),
    });
    locked.recv().unwrap();
    let published = std::thread::scope(|s| {
        let publish = s.spawn(|| l.broker.publish(&t, message("c").after(p)));
        // The publish holds the head and waits for the insert; then the cycle closes (within
        // PostgreSQL's deadlock_timeout of the publish's wait, 1 s, so the publish finds it).
        std::thread::sleep(Duration::from_millis(300));
        go_tx.send(()).unwrap();
        publish.join().unwrap()
    });
    holder.join().unwrap();
    published.unwrap_or_else(|e| panic!("publish: {e:?}"));
    assert_eq!(l.broker.stats(&t).unwrap().waiting, 2);
    forget(&l, &t);
}
per_server!(a_publish_a_deadlock_ended_runs_again);

/// A requeue of a dead letter waiting on a job of a table dropped by hand (its record left)
/// reads that job as cancelled, as a publish does: refused (`ParentFailed`) for `after`. The
/// dead letter was dead-lettered through its other parent (requeued first), so the job of
/// the dropped table never settled and its row would be read. Fails (`requeue ..`: a
/// database error, the table missing) with the job's row read in a table that is gone.
fn a_requeue_reads_a_dropped_tables_job_cancelled(db: Db, form: Form) {
    let Some(l) = common::live(db) else { return };
    let charges = table(&l, form);
    let emails = table(&l, form);
    let paid = l.broker.publish(&charges, message("paid")).unwrap();
    let x = l.broker.publish(&emails, message("x")).unwrap();
    let r = l
        .broker
        .publish(&emails, message("r").after(x).after_in(&charges, paid))
        .unwrap();
    let sub = l
        .broker
        .subscription(&emails)
        .max_in_flight(1)
        .start()
        .unwrap();
    settle_next(&sub, x, |d| d.dead_letter("bad").unwrap());
    sub.shutdown(Duration::from_secs(10)).unwrap();
    assert_eq!(state(&l, &emails, r), Some(JobState::Dead));
    l.exec(&format!("DROP TABLE {}", charges.name()));
    assert!(l.broker.requeue_dead(&emails, x).unwrap());
    match l.broker.requeue_dead(&emails, r) {
        Err(BrokerError::ParentFailed { parent, .. }) => assert_eq!(parent, paid),
        other => panic!("requeue of a job whose parent's table is gone: {other:?}"),
    }
    assert_eq!(
        state(&l, &emails, r),
        Some(JobState::Dead),
        "refused, unchanged"
    );
    l.exec(&format!(
        "DELETE FROM sqlbroker_tables WHERE name = '{}'",
        charges.name()
    ));
    forget(&l, &charges);
    forget(&l, &emails);
}
per_db_form!(a_requeue_reads_a_dropped_tables_job_cancelled);

/// A callback released by a job's dead letter reads that dead letter, output and all, even
/// after the job was requeued and acked with an output before the callback ran (while another
/// job waited on it, so its head kept that output): the pair it reads is one settlement's. Fails (`the dead letter's output`: `Some("late")`, the later
/// ack's) with the head's output read whatever outcome it now holds (found by the promise
/// checker, seed 17, SQLite advisory).
fn a_callback_reads_the_settlement_that_released_it(db: Db, form: Form) {
    let Some(l) = common::live(db) else { return };
    let t = table_with(&l, form, Table::outputs);
    let p = l.broker.publish(&t, message("p")).unwrap();
    // Due later: the callback is released only after `p` ran again.
    let q = message("q").deliver_after(Duration::from_secs(2));
    let q = l.broker.publish(&t, q).unwrap();
    let c = l
        .broker
        .publish(&t, message("c").after_settled(p).after_settled(q))
        .unwrap();
    let sub = l.broker.subscription(&t).max_in_flight(1).start().unwrap();
    settle_next(&sub, p, |d| d.dead_letter("bad").unwrap());
    assert!(l.broker.requeue_dead(&t, p).unwrap());
    // A job waiting on `p` at its ack keeps `p`'s head, with the ack's output in it.
    l.broker.publish(&t, message("d").after(p)).unwrap();
    let callback = loop {
        let d = next(&sub, Duration::from_secs(10));
        match d.id() {
            id if id == c => break d,
            id if id == p => {
                d.set_output(b"late").unwrap();
                d.ack().unwrap()
            }
            _ => d.ack().unwrap(),
        }
    };
    let waited = callback.waited_on().unwrap();
    let of_p = waited.iter().find(|w| w.id == p).unwrap();
    assert_eq!(
        (of_p.outcome, of_p.output.as_deref()),
        (Some(JobOutcome::DeadLettered), None),
        "the dead letter's output"
    );
    callback.ack().unwrap();
    sub.shutdown(Duration::from_secs(10)).unwrap();
    forget(&l, &t);
}
per_db_form!(a_callback_reads_the_settlement_that_released_it);

/// Jobs already waiting on a job whose table was dropped by hand (its record left) get the
/// answer a later publish gets (cancelled: an `after` dead-lettered, an `after_settled`
/// released): the later publish settles them, and, with none, the sweeper does. Fails
/// (`waiting before the drop, after a later publish`: still `Waiting`) with the publish
/// answering for itself alone, and on PostgreSQL (`left waiting by the sweeper`) with the
/// sweeper reading the gone table inside its transaction, which the failed read aborts.
fn jobs_waiting_on_a_table_dropped_by_hand_are_settled(db: Db) {
    let Some(l) = common::live(db) else { return };
    let waiting = table(&l, Form::Lease);
    let charges = table(&l, Form::Lease);
    let a = l.broker.publish(&charges, message("a")).unwrap();
    let b = l.broker.publish(&charges, message("b")).unwrap();
    let on_a = l
        .broker
        .publish(&waiting, message("x").after_in(&charges, a))
        .unwrap();
    let on_b = l
        .broker
        .publish(&waiting, message("y").after_settled_in(&charges, b))
        .unwrap();
    l.exec(&format!("DROP TABLE {}", charges.name()));
    // A later publish naming `a` settles what waits on it.
    l.broker
        .publish(&waiting, message("z").after_in(&charges, a))
        .unwrap();
    assert_eq!(
        state(&l, &waiting, on_a),
        Some(JobState::Dead),
        "waiting before the drop, after a later publish"
    );
    // Nothing names `b` again: the sweeper settles it (a round in 5 s, checked after 2 s).
    let settled = common::wait_for(Duration::from_secs(30), || {
        state(&l, &waiting, on_b) == Some(JobState::Ready)
    });
    assert!(settled, "left waiting by the sweeper");
    l.exec(&format!(
        "DELETE FROM sqlbroker_tables WHERE name = '{}'",
        charges.name()
    ));
    for t in [&charges, &waiting] {
        forget(&l, t);
    }
}
per_db!(jobs_waiting_on_a_table_dropped_by_hand_are_settled);
