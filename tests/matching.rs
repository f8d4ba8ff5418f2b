//! The operator's calls behind "act on every job matching": `Broker::jobs_matching` (a
//! filtered listing), `Broker::run_now` (a scheduled job due now) and the action log
//! (`Broker::record_action`, `Broker::actions`), on every database and form.

mod common;

use std::time::{Duration, SystemTime};

use common::{live, next, Db};
use sqlbroker::{BrokerError, Form, JobFilter, JobState, Message, Table, Value, ACTION_TEXT_MAX};

fn ids(jobs: &[sqlbroker::Job]) -> Vec<i64> {
    jobs.iter().map(|j| j.id()).collect()
}

/// Filters by column (text, integer, float) and by error text, byte for byte, with SQL's
/// wildcards taken as text; bad filters are typed errors.
fn filters(db: Db) {
    let Some(l) = live(db) else { return };
    let b = &l.broker;
    let t = l.create(
        Table::new(common::unique("match"))
            .text_column("who")
            .int_column("n")
            .column("score", sqlbroker::ColumnType::Float)
            .lease(Duration::from_secs(30))
            .max_attempts(1),
    );
    let msg = |who: &str, n: i64| {
        Message::new(format!("{who}{n}").into_bytes())
            .set("who", who)
            .set("n", n)
            .set("score", n as f64 / 2.0)
    };
    let failing: Vec<i64> = ["100%_done", "100 done", "Timeout"]
        .iter()
        .enumerate()
        .map(|(i, _)| b.publish(&t, msg("f", i as i64)).unwrap())
        .collect();
    let sub = b.subscription(&t).max_in_flight(3).start().unwrap();
    for _ in 0..3 {
        let d = next(&sub, Duration::from_secs(20));
        let i = failing.iter().position(|id| *id == d.id()).unwrap();
        d.fail(["100%_done", "100 done", "Timeout"][i]).unwrap();
    }
    sub.shutdown(Duration::from_secs(10)).unwrap();
    let a: Vec<i64> = (0..3)
        .map(|n| b.publish(&t, msg("a", n)).unwrap())
        .collect();
    let bb: Vec<i64> = (0..3)
        .map(|n| b.publish(&t, msg("b", n)).unwrap())
        .collect();
    let find = |state, f: &JobFilter| ids(&b.jobs_matching(&t, state, f, None, 100, 0).unwrap());

    assert_eq!(
        find(JobState::Ready, &JobFilter::new().column("who", "a")),
        a
    );
    assert_eq!(
        find(JobState::Ready, &JobFilter::new().column("who", "A")),
        Vec::<i64>::new()
    );
    assert_eq!(
        find(JobState::Ready, &JobFilter::new().column("n", 1i64)),
        vec![a[1], bb[1]]
    );
    assert_eq!(
        find(
            JobState::Ready,
            &JobFilter::new().column("n", 1i64).column("who", "b")
        ),
        vec![bb[1]]
    );
    assert_eq!(
        find(JobState::Ready, &JobFilter::new().column("score", 1.0)),
        vec![a[2], bb[2]]
    );
    assert_eq!(
        find(JobState::Ready, &JobFilter::new().column("score", 1i64)),
        vec![a[2], bb[2]]
    );
    assert_eq!(find(JobState::Ready, &JobFilter::new()).len(), 6);
    // Error text: contained, byte for byte; `%` and `_` are text.
    assert_eq!(
        find(JobState::Dead, &JobFilter::new().error_contains("%_")),
        vec![failing[0]]
    );
    assert_eq!(
        find(JobState::Dead, &JobFilter::new().error_contains("100")),
        failing[..2].to_vec()
    );
    assert_eq!(
        find(JobState::Dead, &JobFilter::new().error_contains("timeout")),
        Vec::<i64>::new()
    );
    assert_eq!(
        find(JobState::Ready, &JobFilter::new().error_contains("1")),
        Vec::<i64>::new(),
        "never failed"
    );
    // Paging with the cursor.
    let f = JobFilter::new().column("who", "a");
    let page = b
        .jobs_matching(&t, JobState::Ready, &f, Some(a[0]), 1, 0)
        .unwrap();
    assert_eq!(ids(&page), vec![a[1]]);
    // Payload prefixes as in jobs_preview.
    let page = b
        .jobs_matching(&t, JobState::Ready, &f, None, 1, 1)
        .unwrap();
    assert_eq!((page[0].payload(), page[0].payload_len()), (&b"a"[..], 2));

    for (f, what) in [
        (JobFilter::new().column("nope", "x"), "no column"),
        (
            JobFilter::new().column("n", "1"),
            "not a value of that type",
        ),
        (
            JobFilter::new().column("who", 1i64),
            "not a value of that type",
        ),
        (
            JobFilter::new().column("who", Value::Null),
            "not a value of that type",
        ),
        (
            JobFilter::new().error_contains(&"x".repeat(1_001)),
            "more than 1000",
        ),
    ] {
        match b.jobs_matching(&t, JobState::Ready, &f, None, 10, 0) {
            Err(BrokerError::InvalidOption { option, reason }) => {
                assert_eq!(option, "JobFilter");
                assert!(reason.contains(what), "{what}: {reason}");
            }
            other => panic!("{f:?}: {other:?}"),
        }
    }
}

/// `run_now` makes a job scheduled for later (a delay, a retry's backoff) due, and leaves
/// every other alone: ready, in work, dead, gone. Per form.
fn run_now(db: Db, form: Form) {
    let Some(l) = live(db) else { return };
    let b = &l.broker;
    let t = l.table(form, Duration::from_secs(30));
    let later = b
        .publish(
            &t,
            Message::new(b"later".to_vec())
                .set("k", "1")
                .deliver_after(Duration::from_secs(3600)),
        )
        .unwrap();
    let ready = b
        .publish(&t, Message::new(b"ready".to_vec()).set("k", "2"))
        .unwrap();
    assert_eq!(
        b.job(&t, later).unwrap().unwrap().state(),
        JobState::Scheduled
    );
    assert!(!b.run_now(&t, ready).unwrap(), "a ready job");
    assert!(!b.run_now(&t, i64::MAX).unwrap(), "no such job");
    assert!(b.run_now(&t, later).unwrap());
    assert_eq!(b.job(&t, later).unwrap().unwrap().state(), JobState::Ready);
    // A retry waiting out its backoff runs now, its attempt counted.
    let sub = b.subscription(&t).max_in_flight(1).start().unwrap();
    let mut seen = Vec::new();
    for _ in 0..2 {
        let d = next(&sub, Duration::from_secs(20));
        seen.push(d.id());
        d.retry_after(Duration::from_secs(3600)).unwrap();
    }
    seen.sort();
    assert_eq!(seen, vec![later, ready]);
    assert_eq!(
        b.job(&t, ready).unwrap().unwrap().state(),
        JobState::Scheduled
    );
    assert!(b.run_now(&t, ready).unwrap());
    let d = next(&sub, Duration::from_secs(20));
    assert_eq!(d.id(), ready);
    // In work now: left alone (lease: leased; row lock: locked; advisory: due already).
    assert!(!b.run_now(&t, ready).unwrap(), "a job in work");
    d.dead_letter("done").unwrap();
    assert!(!b.run_now(&t, ready).unwrap(), "a dead letter");
    assert_eq!(b.job(&t, ready).unwrap().unwrap().state(), JobState::Dead);
    sub.shutdown(Duration::from_secs(10)).unwrap();
}

/// The action log: written and read newest first, text cut at its bound; a database that
/// never logged reads as empty, and reading does not make the log.
fn action_log(db: Db) {
    let Some(l) = live(db) else { return };
    let b = &l.broker;
    let fresh = db == Db::Sqlite;
    if fresh {
        assert!(b.actions(10).unwrap().is_empty());
        assert!(!l.table_exists("sqlbroker_actions"), "a read made the log");
    }
    let table = common::unique("logged");
    let long = "é".repeat(ACTION_TEXT_MAX + 10);
    b.record_action("ana from 10.0.0.7", "cancel", &table, "job 7", 1)
        .unwrap();
    b.record_action(
        &long,
        "retry all matching",
        &table,
        "dead jobs, who = \"x\"",
        12,
    )
    .unwrap();
    let mine: Vec<_> = b
        .actions(1_000)
        .unwrap()
        .into_iter()
        .filter(|a| a.table == table)
        .collect();
    assert_eq!(mine.len(), 2);
    assert_eq!(
        (mine[0].action.as_str(), mine[0].rows),
        ("retry all matching", 12)
    );
    assert_eq!(mine[0].who, format!("{}...", "é".repeat(ACTION_TEXT_MAX)));
    assert_eq!(mine[0].detail, "dead jobs, who = \"x\"");
    assert_eq!(
        (
            mine[1].who.as_str(),
            mine[1].action.as_str(),
            mine[1].detail.as_str(),
            mine[1].rows
        ),
        ("ana from 10.0.0.7", "cancel", "job 7", 1)
    );
    assert!(mine[0].id > mine[1].id);
    let age = SystemTime::now()
        .duration_since(mine[1].at)
        .unwrap_or_default();
    assert!(age < Duration::from_secs(120), "{age:?}");
    assert_eq!(b.actions(1).unwrap().len(), 1);
}

macro_rules! per_database {
    ($name:ident) => {
        mod $name {
            use super::*;
            #[test]
            fn postgres() {
                super::$name(Db::Postgres)
            }
            #[test]
            fn mysql() {
                super::$name(Db::Mysql)
            }
            #[test]
            fn sqlite() {
                super::$name(Db::Sqlite)
            }
        }
    };
}

per_database!(filters);
per_database!(action_log);

mod run_now {
    use super::*;
    #[test]
    fn postgres() {
        for form in [Form::RowLock, Form::Lease, Form::AdvisoryLock] {
            super::run_now(Db::Postgres, form)
        }
    }
    #[test]
    fn mysql() {
        for form in [Form::RowLock, Form::Lease, Form::AdvisoryLock] {
            super::run_now(Db::Mysql, form)
        }
    }
    #[test]
    fn sqlite() {
        for form in [Form::Lease, Form::AdvisoryLock] {
            super::run_now(Db::Sqlite, form)
        }
    }
}

/// A row lock job in work whose checkpoint moved its due time ahead (so it reads as scheduled)
/// is passed by at once: `run_now` returns `false` without waiting for the delivery's row
/// lock, and its due time stays. Servers only: the row lock form is theirs alone.
///
/// Fails (`run_now` answers only once the delivery is acked, seconds later) when the update is
/// sent without the `SKIP LOCKED` probe first (tried).
fn run_now_passes_a_locked_row(db: Db) {
    let Some(l) = live(db) else { return };
    let b = &l.broker;
    let t = l.create(
        Table::new(common::unique("runlock"))
            .text_column("k")
            .checkpoints(),
    );
    let id = b
        .publish(&t, Message::new(b"x".to_vec()).set("k", "1"))
        .unwrap();
    let sub = b.subscription(&t).max_in_flight(1).start().unwrap();
    let d = next(&sub, Duration::from_secs(10));
    d.checkpoint(b"half way").unwrap();
    assert_eq!(b.job(&t, id).unwrap().unwrap().state(), JobState::Scheduled);
    let due = || b.job(&t, id).unwrap().unwrap().due_at();
    let before = due();
    let other = l.connect();
    let (tx, rx) = crossbeam_channel::bounded(1);
    let t2 = t.clone();
    std::thread::spawn(move || {
        let _ = tx.send(other.run_now(&t2, id).map_err(|e| e.to_string()));
    });
    let answer = rx.recv_timeout(Duration::from_secs(3));
    let after = due();
    d.ack().unwrap();
    assert_eq!(answer, Ok(Ok(false)), "run_now waited for the row lock");
    assert_eq!(after, before, "the due time moved");
    sub.shutdown(Duration::from_secs(10)).unwrap();
}
per_server!(run_now_passes_a_locked_row);
