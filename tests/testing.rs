//! `sqlbroker::testing` (feature `testing`) on every database x form: `drain` and `drain_all`
//! run jobs on the test's thread with `Subscription::run`'s outcome rules, and the assert
//! helpers check what was published.
//!
//! Each case names the break it was seen to fail with:
//!
//! - A job that fails twice, then succeeds, drained by `drain_all` in well under the retry
//!   policy's first delay. Fails (`took 61s: drain_all waited for the backoff`) with
//!   `drain_all` sleeping until the scheduled jobs are due instead of making them due.
//! - A job that always fails, and one that always snoozes, end dead-lettered after exactly
//!   `max_attempts`. Fails (`attempts of .. (Dead, 4)`) with the attempts limit taken out of
//!   the settlement (`retry_or_dead`): the claim's own check then dead-letters attempt 4.
//! - `drain` leaves a job scheduled for later, and a job it retried, scheduled; `drain_all` then
//!   runs them. Fails (`(3, 1)` run, not `(1, 1)`) with `drain` taking scheduled jobs as due.
//! - A job waiting on another is not made due: it runs after that one is acked. Fails (`ran
//!   the waiting job before ..`) with `run_at < latest` loosened to `<=` in `Syntax::due_statements`.
//! - A job another subscription holds (row lock: its due time moved ahead by a checkpoint) is
//!   neither made due nor run, and `drain_all` does not wait on its lock. Fails (a lock wait
//!   or statement timeout from `drain_all`, after 30 s) with the row lock form's `SKIP LOCKED`
//!   left out of `due_later`.
//! - The bound: a handler that publishes for ever, or snoozes on a table without an attempts
//!   limit, stops with `DrainLimit`, the job found last unspent. Fails (`(Ready, 6)`) with
//!   the bound checked one job late.
//! - A paused table is not run. Fails (`acked: 1`) with the pause check taken out of
//!   `claim_on_caller`.
//! - The assert helpers pass and fail, the failure's message escaped. Fails with `Expect`
//!   ignoring column values (`assert_not_published` panics), and with text and payloads
//!   printed unescaped (the listing's check).
#![cfg(feature = "testing")]

mod common;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use common::{unique, Db, Live};
use sqlbroker::testing::{self, Drain, Expect};
use sqlbroker::{BrokerError, Form, JobState, Message, Outcome, Ran, RetryPolicy, Table, Value};

const LEASE: Duration = Duration::from_secs(30);
/// The retry policy's first delay (then doubling, no jitter): a drain that waited it out
/// would take at least this long.
const BASE: Duration = Duration::from_secs(20);
/// Well under `BASE`: what a drain of a few jobs may take, on a slow machine included.
const FAST: Duration = Duration::from_secs(5);

fn policy() -> RetryPolicy {
    RetryPolicy::exponential(BASE, BASE * 8).without_jitter()
}

/// The standard test table of `form` with these options, created (dropped at the end).
fn table(live: &Live, form: Form, more: impl FnOnce(Table) -> Table) -> Table {
    live.create(more(common::describe(&unique("t"), form, LEASE)))
}

/// The job `id` of `t`, which must be there.
fn job(live: &Live, t: &Table, id: i64) -> sqlbroker::Job {
    live.broker
        .job(t, id)
        .unwrap()
        .unwrap_or_else(|| panic!("job {id} is gone"))
}

/// A job that fails twice, then succeeds: `drain_all` runs its three attempts at once (no
/// backoff slept through), each counted; the row, kept completed, says so.
fn fails_twice_then_succeeds(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let t = table(&live, form, |t| t.keep_completed(Duration::from_secs(3600)));
    let id = live.broker.publish(&t, common::msg("flaky", "a")).unwrap();
    let seen = Mutex::new(Vec::new());
    let started = Instant::now();
    let ran = Drain::new(&live.broker, &t)
        .retry_policy(policy())
        .include_scheduled(true)
        .run(|d| {
            seen.lock().unwrap().push((d.id(), d.attempt()));
            if d.attempt() < 3 {
                Err(format!("attempt {} failed", d.attempt()))
            } else {
                Ok(())
            }
        })
        .unwrap();
    let took = started.elapsed();
    assert!(
        took < FAST,
        "took {took:?}: drain_all waited for the backoff ({BASE:?} first)"
    );
    assert_eq!(*seen.lock().unwrap(), [(id, 1), (id, 2), (id, 3)]);
    assert_eq!((ran.failed, ran.acked, ran.unsettled), (2, 1, 0), "{ran:?}");
    let j = job(&live, &t, id);
    assert_eq!(j.state(), JobState::Completed);
    // Every form counts the three attempts (the row lock form at each settlement, the ack
    // of a kept row included).
    assert_eq!((j.attempts(), j.errors()), (3, 2), "attempts of {j:?}");
    assert_eq!(j.last_error(), Some("attempt 2 failed"));
}
per_db_form!(fails_twice_then_succeeds);

/// A job that always fails and one that always snoozes (`RetryAfter`, an attempt each) end
/// dead-lettered after exactly `max_attempts` attempts, in milliseconds.
fn dead_after_max_attempts(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let t = table(&live, form, |t| t.max_attempts(3));
    let fail = live.broker.publish(&t, common::msg("fail", "f")).unwrap();
    let snooze = live.broker.publish(&t, common::msg("snooze", "s")).unwrap();
    let calls = Mutex::new(Vec::new());
    let started = Instant::now();
    let ran = Drain::new(&live.broker, &t)
        .retry_policy(policy())
        .include_scheduled(true)
        .max_jobs(50)
        .run(|d| {
            calls.lock().unwrap().push((d.id(), d.attempt()));
            if d.id() == snooze {
                Ok(Outcome::RetryAfter(Duration::from_secs(3600)))
            } else {
                Err("always")
            }
        })
        .unwrap();
    let took = started.elapsed();
    assert!(took < FAST, "took {took:?}");
    assert_eq!((ran.failed, ran.retried, ran.acked), (3, 3, 0), "{ran:?}");
    let calls = calls.into_inner().unwrap();
    for id in [fail, snooze] {
        let attempts: Vec<u32> = calls.iter().filter(|c| c.0 == id).map(|c| c.1).collect();
        assert_eq!(attempts, [1, 2, 3], "attempts of job {id}");
        let j = job(&live, &t, id);
        assert_eq!(
            (j.state(), j.attempts()),
            (JobState::Dead, 3),
            "attempts of {j:?}"
        );
    }
    assert_eq!(job(&live, &t, fail).last_error(), Some("always"));
    assert_eq!(live.broker.stats(&t).unwrap().dead, 2);
}
per_db_form!(dead_after_max_attempts);

/// `drain` runs only what is due: a job scheduled for later and a job it retried stay
/// scheduled, untouched. `drain_all` then runs both.
fn drain_leaves_scheduled_jobs(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let t = table(&live, form, |t| t);
    let now = live.broker.publish(&t, common::msg("now", "a")).unwrap();
    let retried = live
        .broker
        .publish(&t, common::msg("retried", "b"))
        .unwrap();
    let later = live
        .broker
        .publish(
            &t,
            common::msg("later", "c").deliver_after(Duration::from_secs(3600)),
        )
        .unwrap();
    let due_later = job(&live, &t, later).due_at();
    let seen = Mutex::new(Vec::new());
    let handler = |d: &sqlbroker::Delivery| {
        seen.lock().unwrap().push((d.id(), d.attempt()));
        if d.id() == retried && d.attempt() == 1 {
            Err("once")
        } else {
            Ok(())
        }
    };
    let ran = Drain::new(&live.broker, &t)
        .retry_policy(policy())
        .run(handler)
        .unwrap();
    assert_eq!((ran.acked, ran.failed), (1, 1), "{ran:?}");
    assert_eq!(*seen.lock().unwrap(), [(now, 1), (retried, 1)]);
    let l = job(&live, &t, later);
    assert_eq!(
        (l.state(), l.attempts(), l.due_at()),
        (JobState::Scheduled, 0, due_later),
        "the job scheduled for later was touched: {l:?}"
    );
    let r = job(&live, &t, retried);
    assert_eq!(r.state(), JobState::Scheduled, "{r:?}");
    assert!(
        r.due_at() >= SystemTime::now() + BASE - Duration::from_secs(2),
        "retried for {:?}, not after the policy's delay",
        r.due_at()
    );

    // Nothing more is due: a second drain runs nothing.
    assert_eq!(
        testing::drain(&live.broker, &t, handler).unwrap(),
        Ran::default()
    );
    let ran = testing::drain_all(&live.broker, &t, handler).unwrap();
    assert_eq!((ran.acked, ran.failed), (2, 0), "{ran:?}");
    assert_eq!(live.rows(&t), 0);
}
per_db_form!(drain_leaves_scheduled_jobs);

/// A job waiting on another is not made due by `drain_all`: it runs once the job it waits on
/// (scheduled for later, then failing once) is acked, after it. Made due with the other, it
/// would run while that one waits out its retry.
fn waiting_jobs_wait(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let t = table(&live, form, |t| t.dependencies());
    let first = live
        .broker
        .publish(
            &t,
            common::msg("first", "a").deliver_after(Duration::from_secs(3600)),
        )
        .unwrap();
    let then = live
        .broker
        .publish(&t, common::msg("then", "b").after(first))
        .unwrap();
    let order = Mutex::new(Vec::new());
    let handler = |d: &sqlbroker::Delivery| {
        order.lock().unwrap().push((d.id(), d.attempt()));
        if d.id() == first && d.attempt() == 1 {
            Err("once")
        } else {
            Ok(())
        }
    };
    assert_eq!(
        testing::drain(&live.broker, &t, handler).unwrap(),
        Ran::default()
    );
    assert_eq!(job(&live, &t, then).state(), JobState::Waiting);
    let ran = Drain::new(&live.broker, &t)
        .retry_policy(policy())
        .include_scheduled(true)
        .run(handler)
        .unwrap();
    assert_eq!((ran.failed, ran.acked), (1, 2), "{ran:?}");
    assert_eq!(
        *order.lock().unwrap(),
        [(first, 1), (first, 2), (then, 1)],
        "ran the waiting job before the job it waits on was acked"
    );
    live.forget_deps(t.name());
}
per_db_form!(waiting_jobs_wait);

/// A job another subscription holds is neither run nor made due, and `drain_all` does not
/// wait for it: in the row lock form a checkpoint moved its due time 10 s ahead while its row
/// stays locked; the lease and advisory forms hold it by lease and key. The holder then acks
/// it as usual.
fn held_jobs_are_left_alone(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let t = table(&live, form, |t| t.checkpoints());
    let held = live.broker.publish(&t, common::msg("held", "a")).unwrap();
    let sub = live.broker.subscription(&t).start().unwrap();
    let d = common::next(&sub, Duration::from_secs(10));
    assert_eq!(d.id(), held);
    d.checkpoint(b"half way").unwrap();
    let started = Instant::now();
    let ran = testing::drain_all(&live.broker, &t, |d| -> Result<(), String> {
        panic!("ran job {} that another subscription holds", d.id())
    })
    .unwrap();
    let took = started.elapsed();
    assert_eq!(ran, Ran::default());
    assert!(took < FAST, "took {took:?}: waited on the held row's lock");
    d.ack().unwrap();
    sub.shutdown(Duration::from_secs(5)).unwrap();
    assert_eq!(live.rows(&t), 0);
}
per_db_form!(held_jobs_are_left_alone);

/// The bound: a handler that publishes a job for every job it runs stops with `DrainLimit`
/// after `max_jobs`; so does one that always snoozes on a table without an attempts limit,
/// and the job it found last goes back unspent.
fn the_bound_stops_endless_drains(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let t = table(&live, form, |t| t);
    live.broker.publish(&t, common::msg("0", "a")).unwrap();
    let err = Drain::new(&live.broker, &t)
        .max_jobs(4)
        .run(|_| live.broker.publish(&t, common::msg("more", "a")).map(drop))
        .unwrap_err();
    assert!(
        matches!(&err, BrokerError::DrainLimit { table, max_jobs: 4 } if table == t.name()),
        "{err:?}"
    );
    // Four run and acked, each publishing the next: the fifth, found and not run, is left.
    assert_eq!(live.rows(&t), 1);

    let forever = table(&live, form, |t| t.max_attempts(u32::MAX));
    let id = live
        .broker
        .publish(&forever, common::msg("snooze", "s"))
        .unwrap();
    let err = Drain::new(&live.broker, &forever)
        .include_scheduled(true)
        .max_jobs(5)
        .run(|_| Ok::<_, String>(Outcome::RetryAfter(Duration::from_secs(60))))
        .unwrap_err();
    assert!(
        matches!(err, BrokerError::DrainLimit { max_jobs: 5, .. }),
        "{err:?}"
    );
    let j = job(&live, &forever, id);
    assert_eq!((j.state(), j.attempts()), (JobState::Ready, 5), "{j:?}");

    let refused = Drain::new(&live.broker, &t)
        .max_jobs(0)
        .run(|_| Ok::<_, String>(()));
    assert!(matches!(
        refused,
        Err(BrokerError::InvalidOption {
            option: "max_jobs",
            ..
        })
    ));
}
per_db_form!(the_bound_stops_endless_drains);

/// A paused table is not drained; resumed, it is.
fn a_paused_table_is_not_drained(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let t = table(&live, form, |t| t);
    live.broker.publish(&t, common::msg("x", "a")).unwrap();
    live.broker.pause(&t).unwrap();
    let ack = |_: &sqlbroker::Delivery| Ok::<_, String>(());
    assert_eq!(
        testing::drain_all(&live.broker, &t, ack).unwrap(),
        Ran::default()
    );
    live.broker.resume(&t).unwrap();
    assert_eq!(testing::drain_all(&live.broker, &t, ack).unwrap().acked, 1);
}
per_db_form!(a_paused_table_is_not_drained);

/// The message of a panic caught by `catch_unwind`.
fn panic_text(p: Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}

/// `assert_published` and `assert_not_published` pass and fail by payload, column values and
/// state; a failure lists what the table holds, control characters escaped.
fn the_assertions_pass_and_fail(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let t = table(&live, form, |t| t.int_column("n"));
    let (b, t2) = (&live.broker, &t);
    let id = b
        .publish(
            t2,
            Message::new(b"hi\n\x1b[31m".to_vec())
                .set("k", "ten\u{7}ant")
                .set("n", 7),
        )
        .unwrap();
    b.publish(
        t2,
        Message::new(b"later".to_vec())
            .set("k", "b")
            .deliver_after(Duration::from_secs(3600)),
    )
    .unwrap();

    let all = testing::published(b, t2).unwrap();
    assert_eq!(all.len(), 2);
    assert_eq!(all[0].id(), id);
    let hi = Expect::new()
        .payload(b"hi\n\x1b[31m")
        .column("k", "ten\u{7}ant")
        .column("n", 7);
    let found = testing::assert_published(b, t2, &hi);
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].id(), id);
    testing::assert_published(b, t2, &Expect::new().state(JobState::Scheduled));
    testing::assert_not_published(b, t2, &Expect::new().column("n", 8));
    testing::assert_not_published(b, t2, &Expect::new().column("no_such_column", 7));

    let missing = catch_unwind(AssertUnwindSafe(|| {
        testing::assert_published(b, t2, &Expect::new().column("k", "other").column("n", 7))
    }))
    .map(drop)
    .expect_err("assert_published passed with no job matching");
    let msg = panic_text(missing);
    assert!(
        msg.starts_with(&format!(
            "no job of table {} matches: k = \"other\", n = 7",
            t.name()
        )),
        "{msg}"
    );
    assert!(msg.contains("the table holds 2 jobs:"), "{msg}");
    assert!(
        msg.contains(&format!(
            "#{id} ready, attempt 0, payload b\"hi\\n\\x1b[31m\", k = \"ten\\u{{7}}ant\", n = 7"
        )),
        "{msg}"
    );
    assert!(
        !msg.contains('\x1b') && !msg.contains('\u{7}'),
        "unescaped control characters: {msg:?}"
    );

    let there = catch_unwind(AssertUnwindSafe(|| {
        testing::assert_not_published(b, t2, &Expect::new().payload("later"))
    }))
    .expect_err("assert_not_published passed with a job matching");
    let msg = panic_text(there);
    assert!(
        msg.starts_with(&format!(
            "1 job of table {} matches, expected none: payload b\"later\"",
            t.name()
        )),
        "{msg}"
    );
    assert!(
        msg.contains("scheduled, attempt 0, payload b\"later\""),
        "{msg}"
    );

    // Drained: the due job is gone, the one scheduled for later is still there.
    let ran = testing::drain(b, t2, |_| Ok::<_, String>(())).unwrap();
    assert_eq!(ran.acked, 1);
    testing::assert_not_published(b, t2, &hi);
    testing::assert_published(b, t2, &Expect::new().column("k", Value::from("b")));
}
per_db_form!(the_assertions_pass_and_fail);

/// On `sqlite::memory:`, as an application's unit test would use it.
#[cfg(feature = "sqlite")]
#[test]
fn works_on_sqlite_memory() {
    let broker = sqlbroker::Broker::connect("sqlite::memory:").unwrap();
    let t = Table::new("emails")
        .text_column("to")
        .lease(LEASE)
        .max_attempts(2);
    broker.create_table(&t).unwrap();
    broker
        .publish(&t, Message::new(b"x".to_vec()).set("to", "a@example.com"))
        .unwrap();
    testing::assert_published(&broker, &t, &Expect::new().column("to", "a@example.com"));
    let ran = Drain::new(&broker, &t)
        .retry_policy(policy())
        .include_scheduled(true)
        .run(|_| Err::<(), _>("down"))
        .unwrap();
    assert_eq!(ran.failed, 2);
    let dead = testing::assert_published(&broker, &t, &Expect::new().state(JobState::Dead));
    assert_eq!(dead[0].attempts(), 2);
}

// ---- The operator's tools (issue 38) ----

/// `Ran::dead_lettered` counts every dead letter: the handler's `Outcome::DeadLetter`, and a
/// failure, a snooze or a panic on the table's last attempt (each also counted by what ended
/// it), as the `sqlbroker_jobs_dead_lettered_total` metric does.
fn dead_lettered_counts_every_dead_letter(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let t = table(&live, form, |t| t.max_attempts(2));
    let b = &live.broker;
    let said = b.publish(&t, common::msg("said", "a")).unwrap();
    let failed = b.publish(&t, common::msg("failed", "b")).unwrap();
    let snoozed = b.publish(&t, common::msg("snoozed", "c")).unwrap();
    let panicked = b.publish(&t, common::msg("panicked", "d")).unwrap();
    let ran = Drain::new(b, &t)
        .retry_policy(policy())
        .include_scheduled(true)
        .run(|d| {
            if d.id() == said {
                Ok(Outcome::DeadLetter("no".into()))
            } else if d.id() == failed {
                Err("always")
            } else if d.id() == snoozed {
                Ok(Outcome::RetryAfter(Duration::from_secs(3600)))
            } else {
                panic!("always")
            }
        })
        .unwrap();
    for id in [said, failed, snoozed, panicked] {
        assert_eq!(job(&live, &t, id).state(), JobState::Dead, "job {id}");
    }
    // Fails while only `Outcome::DeadLetter` is counted (1).
    assert_eq!(ran.dead_lettered, 4, "{ran:?}");
    assert_eq!(
        (ran.failed, ran.retried, ran.panicked),
        (2, 2, 2),
        "{ran:?}"
    );
}
per_db_form!(dead_lettered_counts_every_dead_letter);

/// A drain held back by a rate limit says so: `Ran::limited` counts the due jobs it left
/// (not a silent stop), and `Drain::ignore_limits` runs them all, writing no window slot.
fn a_limited_drain_says_so(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let t = table(&live, form, |t| {
        t.rate_limit("", 2, Duration::from_secs(3600))
    });
    let b = &live.broker;
    for n in 0..5 {
        b.publish(&t, common::msg(&format!("j{n}"), &format!("k{n}")))
            .unwrap();
    }
    let ack = |_: &sqlbroker::Delivery| Ok::<_, String>(());
    let ran = testing::drain(b, &t, ack).unwrap();
    assert_eq!(ran.acked, 2, "the window's two: {ran:?}");
    // Fails while the drain stops silently (nothing says three jobs were held back).
    assert_eq!(ran.limited, 3, "{ran:?}");
    let ran = Drain::new(b, &t).ignore_limits(true).run(ack).unwrap();
    assert_eq!((ran.acked, ran.limited), (3, 0), "{ran:?}");
    assert_eq!(b.stats(&t).unwrap().total(), 0);
    let limits = b.rate_limits(&t).unwrap();
    assert_eq!(
        limits[0].claimed, 2,
        "the ignoring drain took no slot: {limits:?}"
    );
    // The real description still binds the broker's later claims.
    for n in 0..3 {
        b.publish(&t, common::msg(&format!("again{n}"), "x"))
            .unwrap();
    }
    let ran = testing::drain(b, &t, ack).unwrap();
    assert_eq!((ran.acked, ran.limited), (0, 3), "{ran:?}");
}
per_db_form!(a_limited_drain_says_so);
