//! Jobs updated in place (`Broker::update`, `JobUpdate`) and a publish that replaces the
//! waiting job holding its dedup key (`Message::replace_waiting`), on every database x form.
//!
//! - An update racing a claim, round after round: the handler reads exactly the last update
//!   that returned `true` (or the published job when none did), whole, and the row does not
//!   change while it is in work. Fails (`handler read`) with the lease condition or the row
//!   lock probe taken out of the update, or its key not taken in the advisory form.
//! - An update changes a scheduled job and nothing in work, dead, completed, acked or absent:
//!   `false`, the row as it was.
//! - Bad input (a column not described, a role column, a column a key reads, a value of the
//!   wrong type, a priority without priorities, an empty update) is refused and changes
//!   nothing.
//! - A job waiting on another is updated and keeps waiting; it runs with the new payload
//!   once its parent is acked.
//! - `replace_waiting` replaces a job not in work and returns its id; a job in work holding
//!   the key is a `Duplicate`, unchanged; a finished one leaves the key to a new row; bad uses
//!   are refused.
//! - `unique_for`: a second publish of the key inside the period is a `Duplicate` after the
//!   job was acked and after it was dead-lettered, and publishes once the period is over.
//!   Fails (`expected a duplicate`) with the finish time's check taken out of the publish.
//!   Eight publishes at once from two brokers, of a key free and of a key whose period just
//!   ended, make exactly one job each time.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use common::Db;
use sqlbroker::{BrokerError, Form, JobState, JobUpdate, Message, Table, Value};

const LONG: Duration = Duration::from_secs(10);

/// The standard table with a text column `v` and an integer column `n` an update may change.
fn describe(form: Form) -> Table {
    common::describe(&common::unique("t"), form, Duration::from_secs(30))
        .text_column("v")
        .int_column("n")
}

fn text(v: Option<&Value>) -> Option<String> {
    v.and_then(|v| v.as_str()).map(str::to_owned)
}

fn int(v: Option<&Value>) -> Option<i64> {
    v.and_then(|v| v.as_i64())
}

fn invalid(r: sqlbroker::Result<bool>) -> String {
    match r {
        Err(BrokerError::InvalidMessage { reason, .. }) => reason,
        other => panic!("expected InvalidMessage, got {other:?}"),
    }
}

/// Sets its flag when dropped: the race's updater stops even when the test fails.
struct Stop<'a>(&'a AtomicBool);

impl Drop for Stop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

/// What a job of the race holds: payload, `v`, `n`.
type Seen = (Vec<u8>, Option<String>, Option<i64>);

fn version(round: usize, i: i64) -> Seen {
    if i == 0 {
        (
            format!("old-{round}").into_bytes(),
            Some("old".into()),
            Some(0),
        )
    } else {
        (
            format!("new-{round}-{i}").into_bytes(),
            Some(format!("v{i}")),
            Some(i),
        )
    }
}

/// Two threads, one job per round: one claims it and holds it a little, the other (on a
/// broker of its own) updates it
/// again and again (every other time by a `replace_waiting` publish) from the moment it is
/// published until it is acked. The handler must read the last version whose update returned
/// `true`, whole, and the row must not change while it is in work.
fn update_racing_a_claim(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let t = live.create(describe(form).dedup());
    let sub = live
        .broker
        .subscription(&t)
        .poll_interval(Duration::from_millis(20))
        .start()
        .unwrap();
    // The updates come from another broker, as from another process: its pool, its keys.
    let other = live.connect();
    let rounds = 12;
    // Rounds whose handler read an update, and rounds whose handler read the job as
    // published (the claim came first): a race either side never wins tests nothing.
    let (mut won, mut lost) = (0, 0);
    for round in 0..rounds {
        let key = format!("r{round}");
        let (payload, v, n) = version(round, 0);
        let published = Message::new(payload)
            .set("k", key.as_str())
            .set("v", v.unwrap())
            .set("n", n.unwrap())
            .dedup_key(key.as_str());
        // Every other round the job is due at the next whole second: the updates win until
        // then, and the claim that comes at that second races them. The others are due at
        // once: the claim races the first updates.
        let published = match round % 2 {
            0 => published,
            _ => published.deliver_after(Duration::from_millis(200)),
        };
        let id = live.broker.publish(&t, published).unwrap();
        let done = AtomicBool::new(false);
        let (w, l) = std::thread::scope(|s| {
            let updater = s.spawn(|| {
                // (version, changed) in order, and rows a replace made after the job finished.
                let mut tries = Vec::new();
                let mut strays = Vec::new();
                let mut i = 0;
                while !done.load(Ordering::Acquire) {
                    i += 1;
                    let (payload, v, n) = version(round, i);
                    let changed = if i % 2 == 0 {
                        let update = JobUpdate::new()
                            .payload(payload)
                            .set("v", v.unwrap())
                            .set("n", n.unwrap());
                        other.update(&t, id, update).unwrap()
                    } else {
                        let m = Message::new(payload)
                            .set("k", key.as_str())
                            .set("v", v.unwrap())
                            .set("n", n.unwrap())
                            .dedup_key(key.as_str())
                            .replace_waiting();
                        match other.publish(&t, m) {
                            Ok(got) if got == id => true,
                            Ok(other) => {
                                strays.push(other);
                                false
                            }
                            Err(BrokerError::Duplicate { id: holder, .. }) => {
                                assert_eq!(holder, id, "round {round}: another holder");
                                false
                            }
                            Err(e) => panic!("round {round}: {e}"),
                        }
                    };
                    tries.push((i, changed));
                    std::thread::sleep(Duration::from_millis(2));
                }
                (tries, strays)
            });
            // Whatever happens below (a failed assertion too), the updater stops.
            let _stop = Stop(&done);
            let d = loop {
                let d = common::next(&sub, LONG);
                if d.id() == id {
                    break d;
                }
                // A row an earlier round's replace made once that round's job was acked.
                d.ack().unwrap();
            };
            let seen: Seen = (d.payload().to_vec(), text(d.get("v")), int(d.get("n")));
            // In work: the updater keeps trying; the row must not move.
            std::thread::sleep(Duration::from_millis(40));
            let job = live.broker.job(&t, id).unwrap().expect("the job in work");
            let now: Seen = (
                job.payload().to_vec(),
                text(job.get("v")),
                int(job.get("n")),
            );
            assert_eq!(now, seen, "round {round}: the job changed while in work");
            d.ack().unwrap();
            done.store(true, Ordering::Release);
            let (tries, strays) = updater.join().unwrap();
            let last = tries.iter().filter(|(_, c)| *c).map(|(i, _)| *i).max();
            assert_eq!(
                seen,
                version(round, last.unwrap_or(0)),
                "round {round}: the handler read {seen:?}, the last update that held was {last:?}"
            );
            // Once an update failed (in work, then gone) no later one holds.
            let first_miss = tries.iter().find(|(_, c)| !*c).map(|(i, _)| *i);
            if let (Some(miss), Some(last)) = (first_miss, last) {
                assert!(last < miss, "round {round}: {tries:?}");
            }
            // Rows a replace made once the job was acked hold the key anew: claimed later.
            assert!(!strays.contains(&id), "round {round}");
            (last.is_some(), last.is_none())
        });
        won += usize::from(w);
        lost += usize::from(l);
    }
    eprintln!(
        "update race {db:?} {form:?}: {won} rounds read an update, {lost} the job as published"
    );
    assert!(won > 0 && lost > 0, "won {won}, lost {lost} of {rounds}");
    sub.shutdown(Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("{e}"));
}
per_db_form!(update_racing_a_claim);

/// An update changes a scheduled job (payload, columns, priority, due time) and returns true;
/// it changes nothing and returns false for a job in work, dead-lettered, completed, acked or
/// never there.
fn updates_only_jobs_not_in_work(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let mut desc = describe(form).keep_completed(Duration::from_secs(3600));
    let priorities = form != Form::AdvisoryLock;
    if priorities {
        desc = desc.priorities();
    }
    let t = live.create(desc);
    let hour = Duration::from_secs(3600);
    let publish = |k: &str| {
        let m = Message::new(b"old".to_vec())
            .set("k", k)
            .set("v", "old")
            .set("n", 1)
            .deliver_after(hour);
        live.broker.publish(&t, m).unwrap()
    };
    let a = publish("a");
    let b = publish("b");
    assert_eq!(
        live.broker.job(&t, a).unwrap().unwrap().state(),
        JobState::Scheduled
    );
    let mut update = JobUpdate::new()
        .payload(b"new".to_vec())
        .set("v", "new")
        .set("n", Value::Null)
        .run_at(SystemTime::now());
    if priorities {
        update = update.priority(7);
    }
    assert!(live.broker.update(&t, a, update).unwrap());
    let job = live.broker.job(&t, a).unwrap().unwrap();
    assert_eq!(job.payload(), b"new");
    assert_eq!(text(job.get("v")).as_deref(), Some("new"));
    assert_eq!(job.get("n"), Some(&Value::Null));
    assert_eq!(job.state(), JobState::Ready, "run_at moved it to now");
    if priorities {
        let p = live.int(&format!("SELECT priority FROM {} WHERE id = {a}", t.name()));
        assert_eq!(p, 7);
    }
    // The other job is untouched.
    let other = live.broker.job(&t, b).unwrap().unwrap();
    assert_eq!(
        (other.payload(), other.state()),
        (&b"old"[..], JobState::Scheduled)
    );
    assert!(!live
        .broker
        .update(&t, b + 1000, JobUpdate::new().payload(b"x".to_vec()))
        .unwrap());

    let later = || JobUpdate::new().payload(b"late".to_vec()).set("v", "late");
    let sub = live.broker.subscription(&t).start().unwrap();
    let d = common::next(&sub, LONG);
    assert_eq!((d.id(), d.payload()), (a, &b"new"[..]));
    assert!(!live.broker.update(&t, a, later()).unwrap(), "in work");
    let in_work = live.broker.job(&t, a).unwrap().unwrap();
    assert_eq!(
        (in_work.payload(), text(in_work.get("v")).as_deref()),
        (&b"new"[..], Some("new"))
    );
    d.dead_letter("done with it").unwrap();
    assert!(!live.broker.update(&t, a, later()).unwrap(), "dead");
    let dead = live.broker.job(&t, a).unwrap().unwrap();
    assert_eq!(
        (dead.state(), dead.payload()),
        (JobState::Dead, &b"new"[..])
    );
    // Requeued, claimed, retried for later: scheduled again, not in work, so updated; made
    // due, its handler reads the update.
    assert!(live.broker.requeue_dead(&t, a).unwrap());
    let d = common::next(&sub, LONG);
    assert_eq!((d.id(), d.payload()), (a, &b"new"[..]));
    d.retry_after(hour).unwrap();
    assert!(live.broker.update(&t, a, later()).unwrap(), "retried");
    assert!(live.broker.run_now(&t, a).unwrap());
    let d = common::next(&sub, LONG);
    assert_eq!((d.id(), d.payload()), (a, &b"late"[..]));
    assert_eq!(text(d.get("v")).as_deref(), Some("late"));
    d.dead_letter("done again").unwrap();

    assert!(live.broker.run_now(&t, b).unwrap());
    let d = common::next(&sub, LONG);
    assert_eq!(d.id(), b);
    d.ack().unwrap();
    assert!(!live.broker.update(&t, b, later()).unwrap(), "completed");
    let completed = live.broker.job(&t, b).unwrap().unwrap();
    assert_eq!(
        (completed.state(), completed.payload()),
        (JobState::Completed, &b"old"[..])
    );
    // Acked on a table that deletes what it acks: gone, false.
    live.exec(&format!("DELETE FROM {} WHERE id = {b}", t.name()));
    assert!(
        !live.broker.update(&t, b, later()).unwrap(),
        "acked and gone"
    );
    sub.shutdown(Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("{e}"));
}
per_db_form!(updates_only_jobs_not_in_work);

/// Bad input is refused with `InvalidMessage` and changes nothing.
fn bad_updates_change_nothing(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let t = live.create(describe(form).text_column("g").group("g").fifo());
    let m = Message::new(b"old".to_vec())
        .set("k", "a")
        .set("v", "old")
        .set("g", "grp")
        .deliver_after(Duration::from_secs(3600));
    let id = live.broker.publish(&t, m).unwrap();
    let before = live.broker.job(&t, id).unwrap().unwrap();
    let u = || JobUpdate::new().payload(b"new".to_vec());
    let cases: Vec<(JobUpdate, &str)> = vec![
        (u().set("nope", 1), "not a column"),
        (u().set("payload", b"x".to_vec()), "not a column"),
        (u().set("attempts", 0), "not a column"),
        (u().set("g", "other"), "FIFO group"),
        (u().set("n", "five"), "text does not fit an integer column"),
        (u().set("v", 5), "an integer does not fit a text column"),
        (u().priority(3), "without priorities"),
        (JobUpdate::new(), "changes nothing"),
    ];
    for (update, why) in cases {
        let reason = invalid(live.broker.update(&t, id, update.clone()));
        assert!(reason.contains(why), "{update:?}: {reason}");
    }
    if form == Form::AdvisoryLock {
        let reason = invalid(live.broker.update(&t, id, u().set("k", "b")));
        assert!(reason.contains("advisory key"), "{reason}");
    }
    assert_eq!(live.broker.job(&t, id).unwrap().unwrap(), before);
}
per_db_form!(bad_updates_change_nothing);

/// A job waiting on another is updated and keeps waiting (its due time is not used); acked,
/// the parent releases it, and it runs with the new payload.
fn a_waiting_job_is_updated_and_keeps_waiting(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let t = live.create(describe(form).dependencies());
    let parent = live
        .broker
        .publish(&t, Message::new(b"parent".to_vec()).set("k", "p"))
        .unwrap();
    let child = live
        .broker
        .publish(
            &t,
            Message::new(b"old".to_vec()).set("k", "c").after(parent),
        )
        .unwrap();
    let update = JobUpdate::new()
        .payload(b"new".to_vec())
        .set("v", "new")
        .run_at(SystemTime::now());
    assert!(live.broker.update(&t, child, update).unwrap());
    let job = live.broker.job(&t, child).unwrap().unwrap();
    assert_eq!(
        (job.state(), job.payload()),
        (JobState::Waiting, &b"new"[..])
    );
    let sub = live.broker.subscription(&t).start().unwrap();
    let d = common::next(&sub, LONG);
    assert_eq!(d.id(), parent, "the child ran before its parent");
    d.ack().unwrap();
    let d = common::next(&sub, LONG);
    assert_eq!((d.id(), d.payload()), (child, &b"new"[..]));
    assert_eq!(text(d.get("v")).as_deref(), Some("new"));
    d.ack().unwrap();
    sub.shutdown(Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("{e}"));
    live.forget_deps(t.name());
}
per_db_form!(a_waiting_job_is_updated_and_keeps_waiting);

/// `replace_waiting`: a job not in work holding the key is replaced (payload, columns, due
/// time; the key's columns kept) and its id returned; one in work is a `Duplicate`, left as
/// it is; once it finished, the key goes to a new row. Without a key, in a batch: refused.
fn replace_waiting(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let t = live.create(describe(form).dedup());
    let keyed = |body: &str, v: &str| {
        Message::new(body.as_bytes().to_vec())
            .set("k", "a")
            .set("v", v)
            .set("n", 1)
            .dedup_key("doc-7")
    };
    let hour = Duration::from_secs(3600);
    let id = live
        .broker
        .publish(&t, keyed("v1", "one").deliver_after(hour))
        .unwrap();
    // Without the option: a duplicate, as ever.
    match live.broker.publish(&t, keyed("x", "x")) {
        Err(BrokerError::Duplicate { id: holder, .. }) => assert_eq!(holder, id),
        other => panic!("{other:?}"),
    }
    // Replaced: same id, the new payload and columns (an unset one NULL), due now; the key's
    // column stays the row's.
    let replacing = Message::new(b"v2".to_vec())
        .set("k", "other")
        .set("v", "two")
        .dedup_key("doc-7")
        .replace_waiting();
    assert_eq!(live.broker.publish(&t, replacing).unwrap(), id);
    let job = live.broker.job(&t, id).unwrap().unwrap();
    assert_eq!(job.payload(), b"v2");
    assert_eq!(text(job.get("v")).as_deref(), Some("two"));
    assert_eq!(job.get("n"), Some(&Value::Null));
    let k = if form == Form::AdvisoryLock {
        "a"
    } else {
        "other"
    };
    assert_eq!(text(job.get("k")).as_deref(), Some(k), "the key's column");
    assert_eq!(job.state(), JobState::Ready);
    assert_eq!(live.rows(&t), 1);

    // Bad uses: refused, nothing written.
    let no_key = Message::new(b"x".to_vec()).set("k", "a").replace_waiting();
    assert!(matches!(
        live.broker.publish(&t, no_key),
        Err(BrokerError::InvalidMessage { .. })
    ));
    assert!(matches!(
        live.broker
            .publish_batch(&t, [keyed("x", "x").replace_waiting()]),
        Err(BrokerError::InvalidMessage { .. })
    ));
    assert_eq!(live.rows(&t), 1);

    // In work: a duplicate, the row as the handler read it.
    let sub = live.broker.subscription(&t).start().unwrap();
    let d = common::next(&sub, LONG);
    assert_eq!((d.id(), d.payload()), (id, &b"v2"[..]));
    match live
        .broker
        .publish(&t, keyed("v3", "three").replace_waiting())
    {
        Err(BrokerError::Duplicate { id: holder, .. }) => assert_eq!(holder, id),
        other => panic!("a job in work was replaced: {other:?}"),
    }
    let job = live.broker.job(&t, id).unwrap().unwrap();
    assert_eq!(
        (job.payload(), text(job.get("v")).as_deref()),
        (&b"v2"[..], Some("two"))
    );
    d.ack().unwrap();
    // Finished: the key is free, a new row takes it.
    let next = live
        .broker
        .publish(&t, keyed("v4", "four").replace_waiting())
        .unwrap();
    assert_ne!(next, id);
    let d = common::next(&sub, LONG);
    assert_eq!((d.id(), d.payload()), (next, &b"v4"[..]));
    d.ack().unwrap();
    sub.shutdown(Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("{e}"));
}
per_db_form!(replace_waiting);

/// `unique_for`: the key stays taken for the period after its job was acked, and after it was
/// dead-lettered; past the period a publish makes a new job. Bad uses are refused.
fn unique_for_keeps_the_key_for_its_period(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let hour = Duration::from_secs(3600);
    let t = live.create(describe(form).dedup().keep_completed(hour));
    let period = Duration::from_secs(2);
    let m = |body: &str| {
        Message::new(body.as_bytes().to_vec())
            .set("k", "a")
            .dedup_key("digest")
            .unique_for(period)
    };
    let duplicate_of = |r: sqlbroker::Result<i64>| match r {
        Err(BrokerError::Duplicate { id, .. }) => id,
        other => panic!("expected a duplicate, got {other:?}"),
    };
    let first = live.broker.publish(&t, m("1")).unwrap();
    assert_eq!(duplicate_of(live.broker.publish(&t, m("2"))), first, "live");
    let sub = live.broker.subscription(&t).start().unwrap();
    // Acked, then dead-lettered: each holds the key for the period after it finished.
    let mut holder = first;
    for (round, body) in ["3", "4"].into_iter().enumerate() {
        let d = common::next(&sub, LONG);
        assert_eq!(d.id(), holder);
        match round {
            0 => d.ack().unwrap(),
            _ => d.dead_letter("no").unwrap(),
        }
        assert_eq!(
            duplicate_of(live.broker.publish(&t, m("again"))),
            holder,
            "round {round}: a publish within the period after its job finished"
        );
        let finished = live
            .broker
            .job(&t, holder)
            .unwrap()
            .and_then(|j| j.finished_at())
            .expect("kept, finished");
        let end = finished + period;
        std::thread::sleep(
            end.duration_since(SystemTime::now()).unwrap_or_default() + Duration::from_millis(100),
        );
        let next = live.broker.publish(&t, m(body)).unwrap();
        assert_ne!(next, holder, "round {round}");
        holder = next;
    }
    // Eight publishes at once from two brokers: one job, seven duplicates naming it; again
    // once that job finished and its period is over.
    let d = common::next(&sub, LONG);
    assert_eq!(d.id(), holder, "the last job of the rounds");
    d.ack().unwrap();
    let other = live.connect();
    for round in 0..2 {
        let made: Vec<sqlbroker::Result<i64>> = std::thread::scope(|s| {
            let threads: Vec<_> = (0..8)
                .map(|i| {
                    let b = if i % 2 == 0 { &live.broker } else { &other };
                    let m = Message::new(b"r".to_vec())
                        .set("k", "r")
                        .dedup_key("race")
                        .unique_for(period);
                    let t = &t;
                    s.spawn(move || b.publish(t, m))
                })
                .collect();
            threads.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let ids: Vec<i64> = made
            .iter()
            .filter_map(|r| r.as_ref().ok().copied())
            .collect();
        assert_eq!(ids.len(), 1, "round {round}: {made:?}");
        for r in &made {
            match r {
                Ok(_) => {}
                Err(e) => assert_eq!(e.duplicate_of(), Some(ids[0]), "round {round}: {e}"),
            }
        }
        let d = common::next(&sub, LONG);
        assert_eq!(d.id(), ids[0]);
        d.ack().unwrap();
        let finished = live
            .broker
            .job(&t, ids[0])
            .unwrap()
            .unwrap()
            .finished_at()
            .unwrap();
        std::thread::sleep(
            (finished + period)
                .duration_since(SystemTime::now())
                .unwrap_or_default()
                + Duration::from_millis(100),
        );
    }
    // Refused, nothing written: a batch; a table that keeps completed rows shorter than the
    // period, or not at all.
    let rows = live.rows(&t);
    assert!(matches!(
        live.broker.publish_batch(&t, [m("x")]),
        Err(BrokerError::InvalidMessage { .. })
    ));
    let long = m("x").unique_for(2 * hour);
    assert!(matches!(
        live.broker.publish(&t, long),
        Err(BrokerError::InvalidMessage { .. })
    ));
    assert_eq!(live.rows(&t), rows);
    let plain = live.create(describe(form).dedup());
    assert!(matches!(
        live.broker.publish(&plain, m("x")),
        Err(BrokerError::InvalidMessage { .. })
    ));
    assert_eq!(live.rows(&plain), 0);
    sub.shutdown(Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("{e}"));
    live.exec(&format!(
        "DELETE FROM sqlbroker_unique WHERE table_name = '{}'",
        t.name()
    ));
}
per_db_form!(unique_for_keeps_the_key_for_its_period);

/// A table dropped by `drop_table` and made again under its name (its ids counted from 1
/// again) holds none of the old table's keys: the old job's id, now another job's, holds no
/// period. Fails (`Duplicate` of the new table's job 1) with the old rows of
/// `sqlbroker_unique` left by the drop.
fn a_table_made_again_holds_no_old_period(db: Db) {
    let Some(live) = common::live(db) else { return };
    let t = live.create(describe(Form::Lease).dedup().keep_completed(LONG));
    let m = |key: &str| {
        Message::new(b"x".to_vec())
            .set("k", "a")
            .dedup_key(key)
            .unique_for(LONG)
    };
    let old = live.broker.publish(&t, m("digest")).unwrap();
    let sub = live.broker.subscription(&t).start().unwrap();
    common::next(&sub, LONG).ack().unwrap();
    sub.shutdown(Duration::from_secs(5)).unwrap();
    live.broker.drop_table(&t).unwrap();
    live.broker.create_table(&t).unwrap();
    // The new table's first job takes the old holder's id.
    let other = live.broker.publish(&t, m("other")).unwrap();
    assert_eq!(
        other, old,
        "the ids did not start again: the test proves nothing"
    );
    let again = live.broker.publish(&t, m("digest"));
    assert!(
        matches!(again, Ok(id) if id != other),
        "a new table's publish of a key read the old table's period: {again:?}"
    );
}
per_db!(a_table_made_again_holds_no_old_period);

/// An update of a lease job whose holder stopped renewing (its lease ran out, unsettled):
/// the update records the lost lease (as a claim would) and clears it, so the late holder's
/// ack is `LeaseLost` and the new version is what the next claim runs.
///
/// Fails (seen in review: the update left the run-out lease in place) with the late ack
/// `Ok(())` completing the job, whose new payload never ran.
fn an_update_takes_over_a_lost_lease(db: Db) {
    let Some(l) = common::live(db) else { return };
    let t = l.create(
        Table::new(common::unique("hu_lost"))
            .text_column("k")
            .lease(Duration::from_secs(1))
            .keep_completed(Duration::from_secs(3600)),
    );
    let id = l.broker.publish(&t, Message::new(b"old".to_vec())).unwrap();
    let a = l.broker.subscription(&t).start().unwrap();
    let held = common::next(&a, Duration::from_secs(10));
    assert!(matches!(
        a.shutdown(Duration::ZERO),
        Err(sqlbroker::BrokerError::Unsettled { .. })
    ));
    // The lease (1 s, in whole seconds) has run out.
    std::thread::sleep(Duration::from_millis(2500));
    let other = l.connect();
    let changed = other.update(&t, id, JobUpdate::new().payload(b"new".to_vec()));
    assert!(matches!(changed, Ok(true)), "{changed:?}");
    let late = held.ack();
    assert!(
        matches!(late, Err(ref e) if e.is_lease_lost()),
        "the late holder's ack: {late:?}"
    );
    let b = other.subscription(&t).start().unwrap();
    let d = common::next(&b, Duration::from_secs(10));
    assert_eq!(d.payload(), b"new");
    let job = l.broker.job(&t, id).unwrap().unwrap();
    assert!(job.abandoned(), "the lost lease went unrecorded: {job:?}");
    d.ack().unwrap();
    b.shutdown(Duration::from_secs(5)).unwrap();
}
per_db!(an_update_takes_over_a_lost_lease);

/// `replace_waiting` with `after_signal` is refused, as with `after`, and changes nothing: the
/// job waiting for its signal keeps its payload and its wait, and the signal releases it.
///
/// Fails (seen in review) with a raw duplicate-key database error from the waits' table and,
/// in the row lock form on the servers, the payload already replaced.
fn replacing_with_a_signal_wait_is_refused(db: Db, form: Form) {
    let Some(l) = common::live(db) else { return };
    let name = common::unique("hu_sig");
    let t = l.create(
        common::describe(&name, form, Duration::from_secs(30))
            .dedup()
            .dependencies(),
    );
    let s = common::unique("sig");
    let m = |b: &str| {
        Message::new(b.as_bytes().to_vec())
            .set("k", "a")
            .dedup_key("order-7")
            .after_signal(&s)
    };
    let id = l.broker.publish(&t, m("v1")).unwrap();
    let again = l.broker.publish(&t, m("v2").replace_waiting());
    assert!(
        matches!(again, Err(sqlbroker::BrokerError::InvalidMessage { .. })),
        "{again:?}"
    );
    let job = l.broker.job(&t, id).unwrap().unwrap();
    assert_eq!(
        (job.payload(), job.state()),
        (&b"v1"[..], JobState::Waiting)
    );
    assert_eq!(l.broker.signal(&t, &s, b"go").unwrap(), 1);
}
per_db_form!(replacing_with_a_signal_wait_is_refused);
