//! Jobs that compose (`Table::dependencies`, `Message::after`, `Message::after_settled`), on
//! every database x form.
//!
//! - A job waiting on another is not claimed until it is acked, is then released by the ack
//!   itself, and reads what it waited on. Fails (its state `Ready`, not `Waiting`) with the
//!   waiting due time replaced by the publish time.
//! - A job that did not succeed dead-letters the jobs waiting on it, down a chain, and a
//!   cancel does the same. Fails (`state of`) with the cascade removed.
//! - Batches' callbacks run exactly once each, after the last of their jobs settles, while
//!   three brokers with four handlers each race to settle them. With the lock of the waiting
//!   row taken out of the settlement this fails (`never released`) now and then; the crate's
//!   own race test (`races.rs`) makes that interleaving on cue and fails every time.
//! - A publish that names jobs already settled (acked and gone, dead, cancelled) gives the new
//!   job its meaning at once.
//! - A dependent survives its parent's holder crashing: the parent comes back, and the
//!   dependent runs only after the retry is acked.
//! - Jobs of one table wait on jobs of another (`after_in`): released, dead-lettered and
//!   reported across the two.
//! - Tables with dependencies created at once on a fresh database all succeed.
//! - Bad input is refused and writes nothing.
//! - Every dead letter frees its dedup key, a dependent dead-lettered through its parent too.
//! - `after_in` checks the other table's record, as the broker checks its own tables.
//! - `sqlbroker_deps` holds a row for a job only while something waits on it, or while its
//!   own row can no longer tell its outcome (a cancel that removed it, a purge); the same id
//!   gets the same answer; the broker's sweeper deletes the rest, as fast as they come.
//! - A job whose row went without a settlement (deleted by hand, its table dropped) leaves no
//!   job waiting for ever, and gets one answer.
//! - A requeued parent is live again, and a requeued dependent waits for its parents again: a
//!   failed chain requeued whole runs in order; a dependent of a parent still dead is refused.

mod common;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{next, unique, Db, Live};
use sqlbroker::{BrokerError, ClaimedRows, Events, Form, JobOutcome, JobState, Message, Table};

/// A table with dependencies in `form` (the advisory form's key reads a column unique per
/// message, so it never stands in for what is tested), dropped at the end with its waits.
fn table(l: &Live, form: Form) -> Table {
    let name = unique("dep");
    let t = Table::new(&name).text_column("u").dependencies();
    let t = match form {
        Form::Lease => t.lease(Duration::from_secs(30)),
        Form::AdvisoryLock => t.advisory_lock(format!("{name}-{{u}}")),
        _ => t,
    };
    l.create(t)
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

/// A job waiting on another is claimed only after the other is acked, and reads its outcome.
fn a_dependent_runs_after_its_parent(db: Db, form: Form) {
    let Some(l) = common::live(db) else { return };
    let t = table(&l, form);
    let charge = l.broker.publish(&t, message("charge")).unwrap();
    let ship = l.broker.publish(&t, message("ship").after(charge)).unwrap();
    assert_eq!(state(&l, &t, ship), Some(JobState::Waiting));
    let job = l.broker.job(&t, ship).unwrap().unwrap();
    assert_eq!(job.waits_on().len(), 1);
    assert_eq!(
        (job.waits_on()[0].id, job.waits_on()[0].outcome),
        (charge, None)
    );
    let stats = l.broker.stats(&t).unwrap();
    assert_eq!(
        (stats.ready, stats.waiting, stats.scheduled),
        (1, 1, 0),
        "{stats:?}"
    );

    let sub = l.broker.subscription(&t).max_in_flight(4).start().unwrap();
    let first = next(&sub, Duration::from_secs(10));
    assert_eq!(first.id(), charge);
    assert!(
        sub.next_delivery_timeout(Duration::from_millis(500))
            .is_err(),
        "the dependent was claimed before its parent was acked"
    );
    first.ack().unwrap();
    let second = next(&sub, Duration::from_secs(10));
    assert_eq!(second.id(), ship);
    let waited = second.waited_on().unwrap();
    assert_eq!(waited.len(), 1);
    assert_eq!(
        (waited[0].id, waited[0].outcome),
        (charge, Some(JobOutcome::Acked))
    );
    second.ack().unwrap();
    sub.shutdown(Duration::from_secs(10)).unwrap();
    assert_eq!(l.rows(&t), 0);
    assert_eq!(
        l.int(&format!(
            "SELECT COUNT(*) FROM sqlbroker_deps WHERE child_table = '{}'",
            t.name()
        )),
        0,
        "a settled job's waits are forgotten"
    );
    forget(&l, &t);
}
per_db_form!(a_dependent_runs_after_its_parent);

/// A dead letter dead-letters the jobs waiting on it, down a chain, each naming its parent; a
/// cancel of a queued job does the same; `after_settled` runs whatever the outcome.
fn a_failed_parent_dead_letters_its_dependents(db: Db, form: Form) {
    let Some(l) = common::live(db) else { return };
    let t = table(&l, form);
    let a = l.broker.publish(&t, message("a")).unwrap();
    let b = l.broker.publish(&t, message("b").after(a)).unwrap();
    let c = l.broker.publish(&t, message("c").after(b)).unwrap();
    let cb = l
        .broker
        .publish(&t, message("cb").after_settled(c))
        .unwrap();
    let d = l
        .broker
        .publish(&t, message("d").deliver_after(Duration::from_secs(3600)))
        .unwrap();
    let e = l.broker.publish(&t, message("e").after(d)).unwrap();

    let sub = l.broker.subscription(&t).max_in_flight(4).start().unwrap();
    let first = next(&sub, Duration::from_secs(10));
    assert_eq!(first.id(), a);
    first.dead_letter("no stock").unwrap();
    for (id, parent) in [(b, a), (c, b)] {
        let job = l.broker.job(&t, id).unwrap().unwrap();
        assert_eq!(job.state(), JobState::Dead, "state of {id}");
        let want = format!("job {parent} it waits on was dead-lettered");
        assert_eq!(job.dead_reason(), Some(want.as_str()));
    }
    // The callback waits on `c` whatever its outcome: it runs.
    let callback = next(&sub, Duration::from_secs(10));
    assert_eq!(callback.id(), cb);
    let waited = callback.waited_on().unwrap();
    assert_eq!(waited[0].outcome, Some(JobOutcome::DeadLettered));
    callback.ack().unwrap();

    assert!(l.broker.cancel(&t, d).unwrap());
    let job = l.broker.job(&t, e).unwrap().unwrap();
    assert_eq!(job.state(), JobState::Dead, "state of {e}");
    let want = format!("job {d} it waits on was cancelled");
    assert_eq!(job.dead_reason(), Some(want.as_str()));
    sub.shutdown(Duration::from_secs(10)).unwrap();
    forget(&l, &t);
}
per_db_form!(a_failed_parent_dead_letters_its_dependents);

/// Each row's claim time.
#[derive(Default)]
struct Claims(Mutex<Vec<(i64, Instant)>>);

struct Watch(Arc<Claims>);

impl Events for Watch {
    fn claimed(&self, e: &ClaimedRows<'_>) {
        let now = Instant::now();
        self.0
             .0
            .lock()
            .unwrap()
            .extend(e.ids.iter().map(|id| (*id, now)));
    }
}

/// Batches, each of `JOBS` jobs and a callback, published interleaved: their jobs settle
/// side by side, so each callback's last two are likely settled at the same moment.
const BATCHES: usize = 8;
const JOBS: usize = 6;

/// Three brokers with four handlers each settle the batches' jobs (every fourth
/// dead-lettered); each callback is claimed exactly once, after the last of its jobs settled.
fn a_callback_runs_once_after_its_batch(db: Db, form: Form) {
    let Some(l) = common::live(db) else { return };
    let t = table(&l, form);
    let mut batches = vec![Vec::new(); BATCHES];
    for n in 0..JOBS {
        for (b, jobs) in batches.iter_mut().enumerate() {
            jobs.push(l.broker.publish(&t, message(&format!("b{b}j{n}"))).unwrap());
        }
    }
    let mut callbacks = HashSet::new();
    for jobs in &batches {
        let mut done = message("done");
        for id in jobs {
            done = done.after_settled(*id);
        }
        callbacks.insert(l.broker.publish(&t, done).unwrap());
    }
    let dead: HashSet<i64> = batches.iter().flatten().step_by(4).copied().collect();
    let dead_in = |jobs: &Vec<i64>| jobs.iter().filter(|j| dead.contains(j)).count();
    let mut expected: Vec<(usize, usize)> = batches.iter().map(|j| (JOBS, dead_in(j))).collect();
    expected.sort_unstable();

    let claims = Arc::new(Claims::default());
    // What each callback read of its jobs when it ran: (settled, dead-lettered).
    let seen = Arc::new(Mutex::new(Vec::<(usize, usize)>::new()));
    let brokers: Vec<_> = (0..3).map(|_| l.connect()).collect();
    let subs: Vec<_> = brokers
        .iter()
        .map(|b| {
            b.subscription(&t)
                .max_in_flight(4)
                .events(Arc::new(Watch(claims.clone())))
                .start()
                .unwrap()
        })
        .collect();
    std::thread::scope(|s| {
        for sub in &subs {
            for _ in 0..4 {
                let (seen, dead, callbacks) = (seen.clone(), &dead, &callbacks);
                s.spawn(move || loop {
                    let Ok(d) = sub.next_delivery_timeout(Duration::from_secs(3)) else {
                        return;
                    };
                    let id = d.id();
                    if callbacks.contains(&id) {
                        let waited = d.waited_on().unwrap();
                        let settled = waited.iter().filter(|w| w.outcome.is_some()).count();
                        let failed = waited
                            .iter()
                            .filter(|w| w.outcome == Some(JobOutcome::DeadLettered))
                            .count();
                        seen.lock().unwrap().push((settled, failed));
                        d.ack().unwrap();
                    } else if dead.contains(&id) {
                        d.dead_letter("bad input").unwrap();
                    } else {
                        d.ack().unwrap();
                    }
                });
            }
        }
    });
    for sub in subs {
        sub.shutdown(Duration::from_secs(10)).unwrap();
    }
    let claims = claims.0.lock().unwrap();
    for cb in &callbacks {
        let runs = claims.iter().filter(|(id, _)| id == cb).count();
        assert_eq!(
            runs, 1,
            "callback {cb} was claimed {runs} times (never released?)"
        );
    }
    // Released by the last settlement: every job had settled when each ran.
    let mut seen = seen.lock().unwrap().clone();
    seen.sort_unstable();
    assert_eq!(seen, expected, "a callback ran before all its jobs settled");
    assert_eq!(
        l.rows(&t),
        dead.len() as i64,
        "only the dead letters are left"
    );
    forget(&l, &t);
}
per_db_form!(a_callback_runs_once_after_its_batch);

/// A publish that names jobs already settled: gone (acked) releases at once, dead or
/// cancelled dead-letters an `after` at once, and `after_settled` runs whatever.
fn settled_jobs_named_at_publish(db: Db, form: Form) {
    let Some(l) = common::live(db) else { return };
    let t = table(&l, form);
    let gone = l.broker.publish(&t, message("gone")).unwrap();
    let dead = l.broker.publish(&t, message("dead")).unwrap();
    let sub = l.broker.subscription(&t).max_in_flight(4).start().unwrap();
    for _ in 0..2 {
        let d = next(&sub, Duration::from_secs(10));
        match d.id() == gone {
            true => d.ack().unwrap(),
            false => d.dead_letter("bad").unwrap(),
        }
    }
    sub.shutdown(Duration::from_secs(10)).unwrap();
    let due = l.broker.publish(&t, message("x").after(gone)).unwrap();
    let failed = l
        .broker
        .publish(&t, message("y").after(gone).after(dead))
        .unwrap();
    let runs = l
        .broker
        .publish(&t, message("z").after_settled(dead))
        .unwrap();
    assert_eq!(state(&l, &t, due), Some(JobState::Ready));
    assert_eq!(state(&l, &t, failed), Some(JobState::Dead));
    assert_eq!(state(&l, &t, runs), Some(JobState::Ready));
    let want = format!("job {dead} it waits on was dead-lettered");
    let job = l.broker.job(&t, failed).unwrap().unwrap();
    assert_eq!(job.dead_reason(), Some(want.as_str()));
    forget(&l, &t);
}
per_db_form!(settled_jobs_named_at_publish);

/// A publish naming many jobs of one table reads them many to a statement: each is read as
/// one read alone would, at once, whatever the others are. A job naming one acked and gone and
/// one dead is dead at once; one naming a gone and one deleted by hand is ready at once; one
/// naming 300 live jobs (past the 256 of one read) and a gone one waits for exactly the 300,
/// and runs once they are acked. Fails (`at once`: `Waiting`, until a later publish or the
/// sweeper mends it) with the many-read taking a head with no outcome for a job still waited
/// on, whatever its row says.
fn a_publish_naming_many_reads_each_as_alone(db: Db, form: Form) {
    let Some(l) = common::live(db) else { return };
    let t = table(&l, form);
    let gone = l.broker.publish(&t, message("gone")).unwrap();
    let dead = l.broker.publish(&t, message("dead")).unwrap();
    let by_hand = l.broker.publish(&t, message("by-hand")).unwrap();
    // Deleted by hand before anyone claimed it: no settlement ever ran.
    l.exec(&format!("DELETE FROM {} WHERE id = {by_hand}", t.name()));
    let sub = l.broker.subscription(&t).max_in_flight(4).start().unwrap();
    for _ in 0..2 {
        let d = next(&sub, Duration::from_secs(10));
        match d.id() == dead {
            true => d.dead_letter("bad").unwrap(),
            false => d.ack().unwrap(),
        }
    }
    sub.shutdown(Duration::from_secs(10)).unwrap();
    let failed = l
        .broker
        .publish(&t, message("f").after(gone).after(dead))
        .unwrap();
    assert_eq!(state(&l, &t, failed), Some(JobState::Dead), "at once");
    let due = l
        .broker
        .publish(&t, message("d").after(gone).after(by_hand))
        .unwrap();
    assert_eq!(state(&l, &t, due), Some(JobState::Ready), "at once");
    let live: Vec<i64> = (0..300)
        .map(|i| l.broker.publish(&t, message(&format!("l{i}"))).unwrap())
        .collect();
    let mut m = message("waits").after(gone);
    for id in &live {
        m = m.after(*id);
    }
    let waits = l.broker.publish(&t, m).unwrap();
    assert_eq!(state(&l, &t, waits), Some(JobState::Waiting), "at once");
    let job = l.broker.job(&t, waits).unwrap().unwrap();
    let open = job
        .waits_on()
        .iter()
        .filter(|w| w.outcome.is_none())
        .count();
    assert_eq!(open, 300, "waits on each live job, not the gone one");
    let sub = l.broker.subscription(&t).max_in_flight(4).start().unwrap();
    let mut acked = HashSet::new();
    loop {
        let d = next(&sub, Duration::from_secs(10));
        if d.id() == waits {
            let left = live.iter().filter(|id| !acked.contains(*id)).count();
            assert_eq!(left, 0, "ran before the last of its jobs was acked");
            d.ack().unwrap();
            break;
        }
        acked.insert(d.id());
        d.ack().unwrap();
    }
    sub.shutdown(Duration::from_secs(10)).unwrap();
    forget(&l, &t);
}
per_db_form!(a_publish_naming_many_reads_each_as_alone);

/// Carries `<form>\t<table>\t<url>` to the crash test's child.
const CHILD_ENV: &str = "SQLBROKER_COMPOSE_CHILD";

/// The crash test's table, described alike in both processes.
fn crash_table(name: &str, form: Form) -> Table {
    let t = Table::new(name).text_column("u").dependencies();
    match form {
        Form::Lease => t.lease(Duration::from_secs(1)),
        Form::AdvisoryLock => t.advisory_lock(format!("{name}-{{u}}")),
        _ => t,
    }
}

/// The crash test's child: claims one delivery, prints `CLAIMED <id>`, and holds it until it
/// is killed. Does nothing unless `SQLBROKER_COMPOSE_CHILD` is set.
#[test]
fn compose_crash_child() {
    common::hold_until_killed(CHILD_ENV, crash_table, "CLAIMED", |_| {});
}

/// A parent whose holder is killed mid-attempt (a real crash: SIGKILL) comes back; the job
/// waiting on it stays waiting through the crash and runs once the retry is acked.
fn a_dependent_waits_through_a_crash_of_its_parent(db: Db, form: Form) {
    let Some(l) = common::live(db) else { return };
    let t = l.create(crash_table(&unique("depc"), form));
    let parent = l.broker.publish(&t, message("p")).unwrap();
    let child = l.broker.publish(&t, message("c").after(parent)).unwrap();
    let spec = format!("{}\t{}\t{}", common::form_name(form), t.name(), l.url);
    let holder = common::spawn_child("compose_crash_child", CHILD_ENV, &spec);
    let claimed = holder.line_after("CLAIMED ", Duration::from_secs(60));
    assert_eq!(
        claimed,
        Some(parent.to_string()),
        "the child claimed the parent"
    );
    holder.kill();
    assert_eq!(state(&l, &t, child), Some(JobState::Waiting));
    let sub = l.broker.subscription(&t).max_in_flight(4).start().unwrap();
    let again = next(&sub, Duration::from_secs(20));
    assert_eq!(again.id(), parent, "the parent comes back first");
    assert_eq!(state(&l, &t, child), Some(JobState::Waiting));
    again.ack().unwrap();
    let d = next(&sub, Duration::from_secs(10));
    assert_eq!(d.id(), child);
    d.ack().unwrap();
    sub.shutdown(Duration::from_secs(10)).unwrap();
    forget(&l, &t);
}
per_db_form!(a_dependent_waits_through_a_crash_of_its_parent);

/// `after` on a table without dependencies, or with a delay, is refused and writes nothing;
/// dependencies with FIFO groups or another isolation are refused.
fn bad_dependencies_are_refused(db: Db) {
    let Some(l) = common::live(db) else { return };
    let plain = l.create(
        Table::new(unique("nodep"))
            .text_column("u")
            .lease(Duration::from_secs(30)),
    );
    let e = l.broker.publish(&plain, message("x").after(1)).unwrap_err();
    assert!(matches!(e, BrokerError::InvalidMessage { .. }), "{e:?}");
    let t = table(&l, Form::Lease);
    let a = l.broker.publish(&t, message("a")).unwrap();
    let e = l
        .broker
        .publish(
            &t,
            message("x").after(a).deliver_after(Duration::from_secs(5)),
        )
        .unwrap_err();
    assert!(matches!(e, BrokerError::InvalidMessage { .. }), "{e:?}");
    assert_eq!((l.rows(&plain), l.rows(&t)), (0, 1));
    for bad in [
        Table::new(unique("bad"))
            .text_column("g")
            .group("g")
            .fifo()
            .dependencies(),
        Table::new(unique("bad"))
            .dependencies()
            .isolation(sqlbroker::Isolation::RepeatableRead),
    ] {
        let e = l.broker.create_table(&bad).unwrap_err();
        assert!(matches!(e, BrokerError::InvalidTable { .. }), "{e:?}");
    }
    forget(&l, &t);
}
per_db!(bad_dependencies_are_refused);

/// `publish_group` writes a workflow whole or not at all: a chain published in one group runs
/// in order, and a group whose closure fails leaves no row. Fails (`rows left`) if the
/// group's publishes commit one by one.
fn a_group_is_published_whole(db: Db) {
    let Some(l) = common::live(db) else { return };
    let t = table(&l, Form::Lease);
    let failed: Result<(), BrokerError> = l.broker.publish_group(|g| {
        let a = g.publish(&t, message("a"))?;
        g.publish(&t, message("b").after(a))?;
        Err(BrokerError::InvalidMessage {
            table: t.name().to_string(),
            reason: "the application changed its mind".into(),
        })
    });
    assert!(failed.is_err());
    assert_eq!(l.rows(&t), 0, "rows left by a group that failed");
    let (a, b, c) = l
        .broker
        .publish_group(|g| {
            let a = g.publish(&t, message("a"))?;
            let b = g.publish(&t, message("b").after(a))?;
            let c = g.publish(&t, message("c").after(b))?;
            Ok((a, b, c))
        })
        .unwrap();
    let stats = l.broker.stats(&t).unwrap();
    assert_eq!((stats.ready, stats.waiting), (1, 2), "{stats:?}");
    let sub = l.broker.subscription(&t).start().unwrap();
    for id in [a, b, c] {
        let d = next(&sub, Duration::from_secs(10));
        assert_eq!(d.id(), id);
        d.ack().unwrap();
    }
    sub.shutdown(Duration::from_secs(10)).unwrap();
    forget(&l, &t);
}
per_db!(a_group_is_published_whole);

/// A job waiting on jobs of another table (`after_in`, `after_settled_in`): released by the
/// ack in that table, dead-lettered by a dead letter there (its reason naming the table), and
/// refused when that table has no dependencies. Fails (`state of`) with the settlement
/// releasing only jobs of its own table.
fn dependencies_across_tables(db: Db, form: Form) {
    let Some(l) = common::live(db) else { return };
    let (charges, emails) = (table(&l, form), table(&l, form));
    let paid = l.broker.publish(&charges, message("paid")).unwrap();
    let declined = l.broker.publish(&charges, message("declined")).unwrap();
    let receipt = l
        .broker
        .publish(&emails, message("receipt").after_in(&charges, paid))
        .unwrap();
    let sorry = l
        .broker
        .publish(&emails, message("sorry").after_in(&charges, declined))
        .unwrap();
    let report = l
        .broker
        .publish(
            &emails,
            message("report")
                .after_settled_in(&charges, paid)
                .after_settled_in(&charges, declined),
        )
        .unwrap();
    assert_eq!(state(&l, &emails, receipt), Some(JobState::Waiting));
    let dependents = l.broker.job(&charges, paid).unwrap().unwrap();
    assert!(dependents
        .dependents()
        .contains(&(emails.name().to_string(), receipt)));

    let sub = l
        .broker
        .subscription(&charges)
        .max_in_flight(4)
        .start()
        .unwrap();
    for _ in 0..2 {
        let d = next(&sub, Duration::from_secs(10));
        match d.id() == paid {
            true => d.ack().unwrap(),
            false => d.dead_letter("card declined").unwrap(),
        }
    }
    sub.shutdown(Duration::from_secs(10)).unwrap();
    assert_eq!(
        state(&l, &emails, receipt),
        Some(JobState::Ready),
        "state of {receipt}"
    );
    let job = l.broker.job(&emails, sorry).unwrap().unwrap();
    assert_eq!(job.state(), JobState::Dead, "state of {sorry}");
    let want = format!(
        "job {declined} of table {} it waits on was dead-lettered",
        charges.name()
    );
    assert_eq!(job.dead_reason(), Some(want.as_str()));
    let job = l.broker.job(&emails, report).unwrap().unwrap();
    assert_eq!(job.state(), JobState::Ready, "state of {report}");
    let tables: Vec<_> = job
        .waits_on()
        .iter()
        .map(|d| (d.table.clone(), d.outcome))
        .collect();
    assert_eq!(
        tables,
        [
            (charges.name().to_string(), Some(JobOutcome::Acked)),
            (charges.name().to_string(), Some(JobOutcome::DeadLettered))
        ]
    );

    let plain = l.create(
        Table::new(unique("nodep"))
            .text_column("u")
            .lease(Duration::from_secs(30)),
    );
    let e = l
        .broker
        .publish(&emails, message("x").after_in(&plain, 1))
        .unwrap_err();
    assert!(matches!(e, BrokerError::InvalidMessage { .. }), "{e:?}");
    forget(&l, &charges);
    forget(&l, &emails);
}
per_db_form!(dependencies_across_tables);

/// Several services creating tables with dependencies at once on a database that has no waits'
/// table yet (a schema, or a database, of its own): every creation succeeds. Fails (PostgreSQL:
/// a duplicate `pg_type` row) with the shared table made inside each table's own DDL
/// transaction.
fn tables_with_dependencies_made_at_once(db: Db) {
    let Some(l) = common::live(db) else { return };
    if db == Db::Sqlite {
        return; // one writer: its DDL takes turns (and each test has a file of its own)
    }
    // Five fresh spaces, six creators racing in each: the race is one of timing.
    for _ in 0..5 {
        let space = unique("space");
        let url = match db {
            Db::Postgres => {
                l.exec(&format!("CREATE SCHEMA {space}"));
                common::with_params(&l.url, &format!("options=-c%20search_path%3D{space}"))
            }
            _ => {
                l.exec(&format!("CREATE DATABASE {space}"));
                let base = l.url.rsplit_once('/').map_or(l.url.as_str(), |(b, _)| b);
                format!("{base}/{space}")
            }
        };
        let barrier = std::sync::Barrier::new(6);
        let made: Vec<Result<(), String>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..6)
                .map(|i| {
                    let (url, barrier) = (&url, &barrier);
                    s.spawn(move || {
                        let broker = sqlbroker::Broker::connect(url).map_err(|e| e.to_string())?;
                        let t = Table::new(format!("t{i}"))
                            .dependencies()
                            .lease(Duration::from_secs(30));
                        barrier.wait();
                        broker.create_table(&t).map_err(|e| e.to_string())
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        match db {
            Db::Postgres => l.exec(&format!("DROP SCHEMA {space} CASCADE")),
            _ => l.exec(&format!("DROP DATABASE {space}")),
        }
        for r in made {
            assert_eq!(r, Ok(()));
        }
    }
}
per_db!(tables_with_dependencies_made_at_once);

/// A table with dependencies in `form`, shaped further by `more` (before its form is given).
fn table_with(l: &Live, form: Form, more: impl FnOnce(Table) -> Table) -> Table {
    let name = unique("dep");
    let t = more(Table::new(&name).text_column("u").dependencies());
    let t = match form {
        Form::Lease => t.lease(Duration::from_secs(30)),
        Form::AdvisoryLock => t.advisory_lock(format!("{name}-{{u}}")),
        _ => t,
    };
    l.create(t)
}

/// The rows of the shared `sqlbroker_deps` that name `t` as the job waited on (its heads and
/// the waits on its jobs), counted directly.
fn deps_rows(l: &Live, t: &Table) -> i64 {
    l.int(&format!(
        "SELECT COUNT(*) FROM sqlbroker_deps WHERE parent_table = '{}'",
        t.name()
    ))
}

/// Settles the next delivery of `sub`, which must be `id`, by `settle`.
fn settle_next(sub: &sqlbroker::Subscription, id: i64, settle: impl FnOnce(sqlbroker::Delivery)) {
    let d = next(sub, Duration::from_secs(10));
    assert_eq!(d.id(), id, "the next delivery");
    settle(d);
}

/// Every dead letter frees its dedup key, a dependent dead-lettered through its parent too:
/// at the parent's settlement, and at its own publish when the parent is dead already. Fails
/// (`republished`: `Duplicate` naming the dead row) with the waiting table's dead letter
/// leaving the key on the row.
fn a_dependent_dead_through_its_parent_frees_its_key(db: Db, form: Form) {
    let Some(l) = common::live(db) else { return };
    let t = table_with(&l, form, Table::dedup);
    let (first, second) = (unique("key"), unique("key"));
    let a = l.broker.publish(&t, message("a")).unwrap();
    let b = l
        .broker
        .publish(&t, message("b").dedup_key(&first).after(a))
        .unwrap();
    let sub = l.broker.subscription(&t).max_in_flight(4).start().unwrap();
    settle_next(&sub, a, |d| d.dead_letter("no stock").unwrap());
    sub.shutdown(Duration::from_secs(10)).unwrap();
    assert_eq!(state(&l, &t, b), Some(JobState::Dead), "state of {b}");
    let c = l
        .broker
        .publish(&t, message("c").dedup_key(&second).after(a))
        .unwrap();
    assert_eq!(state(&l, &t, c), Some(JobState::Dead), "state of {c}");
    for (key, dead) in [(&first, b), (&second, c)] {
        let again = l.broker.publish(&t, message("again").dedup_key(key));
        assert!(
            again.as_ref().is_ok_and(|id| *id != dead),
            "republished {key} (dead letter {dead}): {again:?}"
        );
    }
    forget(&l, &t);
}
per_db_form!(a_dependent_dead_through_its_parent_frees_its_key);

/// A parent requeued from the dead letters is live again: a new `after` and a new
/// `after_settled` wait for it, and the dependent dead-lettered through it, requeued too,
/// waits for it again; all run once it is acked, not before. Fails (`state of`: `Dead` and
/// `Ready`) with the parent's recorded outcome left as it was by the dead letter, and
/// (`requeued dependent`: `Ready`) with a requeue that ignores what a job waits on.
fn a_requeued_parent_is_live_again(db: Db, form: Form) {
    let Some(l) = common::live(db) else { return };
    let t = table(&l, form);
    let p = l.broker.publish(&t, message("p")).unwrap();
    let ship = l.broker.publish(&t, message("ship").after(p)).unwrap();
    let sub = l.broker.subscription(&t).max_in_flight(4).start().unwrap();
    settle_next(&sub, p, |d| d.dead_letter("card declined").unwrap());
    assert_eq!(state(&l, &t, ship), Some(JobState::Dead), "state of {ship}");
    assert!(l.broker.requeue_dead(&t, p).unwrap());
    let after = l.broker.publish(&t, message("after").after(p)).unwrap();
    let settled = l
        .broker
        .publish(&t, message("settled").after_settled(p))
        .unwrap();
    for id in [after, settled] {
        assert_eq!(state(&l, &t, id), Some(JobState::Waiting), "state of {id}");
    }
    assert!(l.broker.requeue_dead(&t, ship).unwrap());
    assert_eq!(
        state(&l, &t, ship),
        Some(JobState::Waiting),
        "requeued dependent"
    );
    let d = next(&sub, Duration::from_secs(10));
    assert_eq!(d.id(), p, "the parent runs first");
    assert!(
        sub.next_delivery_timeout(Duration::from_millis(500))
            .is_err(),
        "a dependent ran before its requeued parent was acked"
    );
    d.ack().unwrap();
    let mut ran: Vec<i64> = (0..3)
        .map(|_| {
            let d = next(&sub, Duration::from_secs(10));
            let id = d.id();
            d.ack().unwrap();
            id
        })
        .collect();
    ran.sort_unstable();
    assert_eq!(ran, [ship, after, settled]);
    sub.shutdown(Duration::from_secs(10)).unwrap();
    forget(&l, &t);
}
per_db_form!(a_requeued_parent_is_live_again);

/// A failed chain (charge -> ship -> email) requeued whole runs in order again: the charge is
/// ready, the others wait, and each runs only after the one before it is acked. A dependent
/// whose parent is still dead is refused (`ParentFailed`, nothing changed). Fails (`state of`:
/// all three `Ready`, and in the lease form they were claimed in the same millisecond) with a
/// requeue that ignores what a job waits on.
fn requeue_all_dead_runs_a_chain_in_order(db: Db, form: Form) {
    let Some(l) = common::live(db) else { return };
    let t = table(&l, form);
    let charge = l.broker.publish(&t, message("charge")).unwrap();
    let ship = l.broker.publish(&t, message("ship").after(charge)).unwrap();
    let email = l.broker.publish(&t, message("email").after(ship)).unwrap();
    let sub = l.broker.subscription(&t).max_in_flight(4).start().unwrap();
    settle_next(&sub, charge, |d| d.dead_letter("card declined").unwrap());
    sub.shutdown(Duration::from_secs(10)).unwrap();
    for id in [ship, email] {
        assert_eq!(state(&l, &t, id), Some(JobState::Dead), "state of {id}");
    }
    match l.broker.requeue_dead(&t, ship) {
        Err(BrokerError::ParentFailed { id, parent, .. }) => {
            assert_eq!((id, parent), (ship, charge))
        }
        other => panic!("requeue of a job whose parent is dead: {other:?}"),
    }
    assert_eq!(
        state(&l, &t, ship),
        Some(JobState::Dead),
        "refused, unchanged"
    );

    assert_eq!(l.broker.requeue_all_dead(&t).unwrap(), 3);
    let states: Vec<_> = [charge, ship, email]
        .iter()
        .map(|id| state(&l, &t, *id))
        .collect();
    assert_eq!(
        states,
        [
            Some(JobState::Ready),
            Some(JobState::Waiting),
            Some(JobState::Waiting)
        ],
        "state of charge, ship, email"
    );
    let sub = l.broker.subscription(&t).max_in_flight(4).start().unwrap();
    for id in [charge, ship, email] {
        let d = next(&sub, Duration::from_secs(10));
        assert_eq!(d.id(), id, "the chain runs in order");
        assert!(
            sub.next_delivery_timeout(Duration::from_millis(300))
                .is_err(),
            "a dependent ran before job {id} was acked"
        );
        d.ack().unwrap();
    }
    sub.shutdown(Duration::from_secs(10)).unwrap();
    forget(&l, &t);
}
per_db_form!(requeue_all_dead_runs_a_chain_in_order);

/// A settlement writes no head where nothing waits on the job (acked, dead-lettered, acked
/// with nothing after it) and a publish naming a job that never existed leaves none; yet the
/// same id gets the same answer as before: gone runs, dead and cancelled dead-letter an
/// `after`. The cancelled job's row is gone, so its head stays (the one row left). Fails
/// (`heads left`: one per settled job, and one for the id never published) with a head
/// written at every settlement.
fn no_head_where_nothing_waits(db: Db, form: Form) {
    let Some(l) = common::live(db) else { return };
    let t = table(&l, form);
    let acked = l.broker.publish(&t, message("acked")).unwrap();
    let dead = l.broker.publish(&t, message("dead")).unwrap();
    let queued = l.broker.publish(&t, message("queued")).unwrap();
    let sub = l.broker.subscription(&t).max_in_flight(1).start().unwrap();
    settle_next(&sub, acked, |d| d.ack().unwrap());
    settle_next(&sub, dead, |d| d.dead_letter("bad").unwrap());
    sub.shutdown(Duration::from_secs(10)).unwrap();
    assert!(l.broker.cancel(&t, queued).unwrap());
    let left: Vec<Option<i64>> = l.ints(&format!(
        "SELECT parent FROM sqlbroker_deps WHERE parent_table = '{}' ORDER BY parent",
        t.name()
    ));
    assert_eq!(left, [Some(queued)], "heads left");

    let never = 1_000_000_000 + acked;
    let runs = l.broker.publish(&t, message("x").after(acked)).unwrap();
    let fails = l.broker.publish(&t, message("y").after(dead)).unwrap();
    let cancelled = l.broker.publish(&t, message("z").after(queued)).unwrap();
    let unknown = l.broker.publish(&t, message("w").after(never)).unwrap();
    assert_eq!(state(&l, &t, runs), Some(JobState::Ready), "after an ack");
    assert_eq!(
        state(&l, &t, unknown),
        Some(JobState::Ready),
        "after no job"
    );
    for (id, parent, how) in [
        (fails, dead, "was dead-lettered"),
        (cancelled, queued, "was cancelled"),
    ] {
        let job = l.broker.job(&t, id).unwrap().unwrap();
        assert_eq!(job.state(), JobState::Dead, "after a job that {how}");
        let want = format!("job {parent} it waits on {how}");
        assert_eq!(job.dead_reason(), Some(want.as_str()));
    }
    assert_eq!(
        l.int(&format!(
            "SELECT COUNT(*) FROM sqlbroker_deps WHERE parent_table = '{}' AND parent = {never} \
             AND child_table = ''",
            t.name()
        )),
        0,
        "a head left for a job that never existed"
    );
    forget(&l, &t);
}
per_db_form!(no_head_where_nothing_waits);

/// A job's head is kept while jobs wait on it and goes once they settle, by the broker's
/// sweeper (a thread of its own: no handler runs here once the jobs are acked). Fails
/// (`swept`) with heads kept a day.
fn heads_go_when_their_waiters_settle(db: Db, form: Form) {
    let Some(l) = common::live(db) else { return };
    let t = table(&l, form);
    let p = l.broker.publish(&t, message("p")).unwrap();
    let c = l.broker.publish(&t, message("c").after(p)).unwrap();
    let sub = l.broker.subscription(&t).max_in_flight(1).start().unwrap();
    settle_next(&sub, p, |d| d.ack().unwrap());
    assert!(deps_rows(&l, &t) > 0, "the waiting job's head and wait");
    settle_next(&sub, c, |d| d.ack().unwrap());
    sub.shutdown(Duration::from_secs(10)).unwrap();
    assert!(
        common::wait_for(Duration::from_secs(60), || deps_rows(&l, &t) == 0),
        "swept: {} rows left",
        deps_rows(&l, &t)
    );
    forget(&l, &t);
}
per_db_form!(heads_go_when_their_waiters_settle);

/// Heads written faster than the fastest settling writer measured (280 a second) are swept
/// as fast, by the broker's own thread: 3,000 settled heads nothing waits on, written at once,
/// are gone within 10 s (300 a second or more). Fails (`swept`) with the sweep of 500 a minute
/// at settlements (none run here).
fn the_sweeper_keeps_up(db: Db) {
    let Some(l) = common::live(db) else { return };
    const HEADS: i64 = 3_000;
    let t = table(&l, Form::Lease);
    let name = t.name();
    for chunk in (0..HEADS).collect::<Vec<_>>().chunks(500) {
        let values: Vec<String> = chunk
            .iter()
            .map(|i| format!("('{name}', {i}, '', 0, 0, 'acked', 0)"))
            .collect();
        l.exec(&format!(
            "INSERT INTO sqlbroker_deps (parent_table, parent, child_table, child, \
             settled_only, outcome, at) VALUES {}",
            values.join(", ")
        ));
    }
    let started = Instant::now();
    let swept = common::wait_for(Duration::from_secs(10), || deps_rows(&l, &t) == 0);
    let took = started.elapsed();
    let left = deps_rows(&l, &t);
    eprintln!(
        "{db:?}: {} heads swept in {took:?} ({:.0} a second)",
        HEADS - left,
        (HEADS - left) as f64 / took.as_secs_f64()
    );
    assert!(swept, "swept: {left} of {HEADS} left after {took:?}");
    forget(&l, &t);
}
per_db!(the_sweeper_keeps_up);

/// `after_in` checks the other table's record, as the broker checks its own tables: a
/// description that says `dependencies()` of a table recorded without them is refused
/// (`Schema`, naming that table), and so is a table with no record; nothing is written. Fails
/// (`refused`: `Ok`, and the job waits for ever) with the caller's description trusted.
fn after_in_checks_the_other_tables_record(db: Db) {
    let Some(l) = common::live(db) else { return };
    let emails = table(&l, Form::Lease);
    let name = unique("plain");
    let plain = l.create(
        Table::new(&name)
            .text_column("u")
            .lease(Duration::from_secs(30)),
    );
    let paid = l.broker.publish(&plain, message("paid")).unwrap();
    let claims = Table::new(&name)
        .text_column("u")
        .dependencies()
        .lease(Duration::from_secs(30));
    let e = l
        .broker
        .publish(&emails, message("receipt").after_in(&claims, paid));
    assert!(
        matches!(&e, Err(BrokerError::Schema { table, .. }) if table == &name),
        "refused: {e:?}"
    );
    let missing = Table::new(unique("missing"))
        .text_column("u")
        .dependencies()
        .lease(Duration::from_secs(30));
    let e = l
        .broker
        .publish(&emails, message("receipt").after_in(&missing, 1));
    assert!(
        matches!(&e, Err(BrokerError::InvalidMessage { .. })),
        "refused (no record): {e:?}"
    );
    assert_eq!(l.rows(&emails), 0, "nothing written");
    forget(&l, &emails);
}
per_db!(after_in_checks_the_other_tables_record);

/// A parent deleted by hand: the jobs waiting on it and a later `after` on its id get one
/// answer, the one the rule gives a job no longer in its table (acked). A later publish
/// naming it releases them at once; without one, the broker's sweeper does. Fails (`state of`:
/// still `Waiting`) with dependents left waiting on a row that is gone.
fn a_parent_deleted_by_hand_leaves_none_waiting(db: Db, form: Form) {
    let Some(l) = common::live(db) else { return };
    let t = table(&l, form);
    let (p, q) = (
        l.broker.publish(&t, message("p")).unwrap(),
        l.broker.publish(&t, message("q")).unwrap(),
    );
    let mut waiting = Vec::new();
    for parent in [p, q] {
        waiting.push(l.broker.publish(&t, message("c").after(parent)).unwrap());
        waiting.push(
            l.broker
                .publish(&t, message("s").after_settled(parent))
                .unwrap(),
        );
    }
    l.exec(&format!("DELETE FROM {} WHERE id IN ({p}, {q})", t.name()));
    // Named again: the publish finds the row gone, and gives every job waiting the answer.
    let later = l.broker.publish(&t, message("later").after(p)).unwrap();
    for id in [later, waiting[0], waiting[1]] {
        assert_eq!(state(&l, &t, id), Some(JobState::Ready), "state of {id}");
    }
    // Not named again: the sweeper finds it.
    assert!(
        common::wait_for(Duration::from_secs(60), || waiting[2..]
            .iter()
            .all(|id| state(&l, &t, *id) == Some(JobState::Ready))),
        "state of {:?}: {:?}",
        &waiting[2..],
        waiting[2..]
            .iter()
            .map(|id| state(&l, &t, *id))
            .collect::<Vec<_>>()
    );
    let job = l.broker.job(&t, waiting[3]).unwrap().unwrap();
    assert_eq!(job.waits_on()[0].outcome, Some(JobOutcome::Acked));
    forget(&l, &t);
}
per_db_form!(a_parent_deleted_by_hand_leaves_none_waiting);

/// A table others wait on, dropped: its jobs count as cancelled for the jobs waiting on them,
/// whether `drop_table` dropped it or an operator by hand (the sweeper finds it). Fails
/// (`state of`: still `Waiting`) with the waits deleted with the table, or left.
fn a_dropped_table_leaves_none_waiting(db: Db, form: Form) {
    let Some(l) = common::live(db) else { return };
    let emails = table(&l, form);
    for by_hand in [false, true] {
        let charges = table(&l, form);
        let paid = l.broker.publish(&charges, message("paid")).unwrap();
        let receipt = l
            .broker
            .publish(&emails, message("receipt").after_in(&charges, paid))
            .unwrap();
        let report = l
            .broker
            .publish(&emails, message("report").after_settled_in(&charges, paid))
            .unwrap();
        match by_hand {
            false => l.broker.drop_table(&charges).unwrap(),
            true => l.exec(&format!(
                "DROP TABLE {0}; DELETE FROM sqlbroker_tables WHERE name = '{0}'",
                charges.name()
            )),
        }
        let settled = || {
            state(&l, &emails, receipt) == Some(JobState::Dead)
                && state(&l, &emails, report) == Some(JobState::Ready)
        };
        assert!(
            common::wait_for(Duration::from_secs(60), settled),
            "state of {receipt}, {report} (dropped by hand: {by_hand}): {:?}",
            (state(&l, &emails, receipt), state(&l, &emails, report))
        );
        let job = l.broker.job(&emails, receipt).unwrap().unwrap();
        let want = format!(
            "job {paid} of table {} it waits on was cancelled",
            charges.name()
        );
        assert_eq!(job.dead_reason(), Some(want.as_str()));
        forget(&l, &charges);
    }
    forget(&l, &emails);
}
per_db_form!(a_dropped_table_leaves_none_waiting);

/// A dead letter nothing waits on leaves no head (its row tells its outcome); purged, its row
/// no longer does, so the purge records it (kept a day): a job published after it is
/// dead-lettered as before the purge, one purged alone (`purge_dead`) or with the rest
/// (`purge_all_dead`). Fails (`after a purged dead letter`: `Ready`, read as gone) with
/// purges that record nothing.
fn a_purged_dead_letter_keeps_its_answer(db: Db, form: Form) {
    let Some(l) = common::live(db) else { return };
    let t = table(&l, form);
    let one = l.broker.publish(&t, message("one")).unwrap();
    let all = l.broker.publish(&t, message("all")).unwrap();
    let sub = l.broker.subscription(&t).max_in_flight(1).start().unwrap();
    settle_next(&sub, one, |d| d.dead_letter("bad").unwrap());
    settle_next(&sub, all, |d| d.dead_letter("bad").unwrap());
    sub.shutdown(Duration::from_secs(10)).unwrap();
    assert!(l.broker.purge_dead(&t, one).unwrap());
    assert_eq!(l.broker.purge_all_dead(&t).unwrap(), 1);
    assert_eq!(l.rows(&t), 0);
    for parent in [one, all] {
        let id = l.broker.publish(&t, message("x").after(parent)).unwrap();
        let job = l.broker.job(&t, id).unwrap().unwrap();
        assert_eq!(job.state(), JobState::Dead, "after a purged dead letter");
        let want = format!("job {parent} it waits on was dead-lettered");
        assert_eq!(job.dead_reason(), Some(want.as_str()));
    }
    forget(&l, &t);
}
per_db_form!(a_purged_dead_letter_keeps_its_answer);

/// A chain `a -> b -> c` left waiting while the broker's sweeper reads it: `b` is met twice
/// (its head, waited on by `c`, and its count, waiting on `a`) and must be read as live both
/// times. Fails (`b's waits after the sweeper's round`: `[]`) with the sweeper reading a job
/// met twice as gone the second time (it deleted the waits of every middle link of a chain
/// that waited 7 s, and the chain waited for ever; found by the promise checker, seed 3).
fn a_chain_outlives_the_sweeper(db: Db) {
    let Some(l) = common::live(db) else { return };
    let t = table(&l, Form::Lease);
    let a = l.broker.publish(&t, message("a")).unwrap();
    let b = l.broker.publish(&t, message("b").after(a)).unwrap();
    let c = l.broker.publish(&t, message("c").after_settled(b)).unwrap();
    // Past the age the sweeper checks a count at (2 s) and its round of reading rows (5 s).
    std::thread::sleep(Duration::from_secs(8));
    for (id, parent) in [(b, a), (c, b)] {
        let job = l.broker.job(&t, id).unwrap().unwrap();
        let waits: Vec<i64> = job.waits_on().iter().map(|d| d.id).collect();
        assert_eq!(
            waits,
            vec![parent],
            "{id}'s waits after the sweeper's round"
        );
        assert_eq!(job.state(), JobState::Waiting);
    }
    let sub = l.broker.subscription(&t).max_in_flight(1).start().unwrap();
    for id in [a, b, c] {
        settle_next(&sub, id, |d| d.ack().unwrap());
    }
    sub.shutdown(Duration::from_secs(10)).unwrap();
    assert_eq!(l.rows(&t), 0, "the chain ran to its end");
    forget(&l, &t);
}
per_db!(a_chain_outlives_the_sweeper);

/// `purge_dead` of a job that is not a dead letter changes nothing: a waiting job keeps its
/// waits and runs when they settle. Fails (`purge of a waiting job`: its waits `[]`, then
/// `never released`) with the purge deleting the waits whether or not it purged a row.
fn a_purge_of_a_live_job_changes_nothing(db: Db, form: Form) {
    let Some(l) = common::live(db) else { return };
    let t = table(&l, form);
    let a = l.broker.publish(&t, message("a")).unwrap();
    let b = l.broker.publish(&t, message("b").after(a)).unwrap();
    assert!(!l.broker.purge_dead(&t, b).unwrap());
    let job = l.broker.job(&t, b).unwrap().unwrap();
    let waits: Vec<i64> = job.waits_on().iter().map(|d| d.id).collect();
    assert_eq!(waits, vec![a], "purge of a waiting job");
    let sub = l.broker.subscription(&t).max_in_flight(1).start().unwrap();
    settle_next(&sub, a, |d| d.ack().unwrap());
    settle_next(&sub, b, |d| d.ack().unwrap());
    sub.shutdown(Duration::from_secs(10)).unwrap();
    assert_eq!(l.rows(&t), 0, "never released");
    forget(&l, &t);
}
per_db_form!(a_purge_of_a_live_job_changes_nothing);
