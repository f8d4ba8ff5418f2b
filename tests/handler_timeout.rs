//! The handler timeout: a delivery held past the subscription's `handler_timeout` is failed
//! while its handler still runs, so its row is another claim's; the handler is told
//! (`timed_out`, and `HandlerTimeout` from its settlement). Each test would see the row only
//! after its lease (30 s) or never (row lock, advisory) without the timeout.

mod common;

use std::time::{Duration, Instant};

use common::Db;
use sqlbroker::{BrokerError, Form, NextError, RetryPolicy, Table};

const LIMIT: Duration = Duration::from_secs(1);

/// Retries due within a second, so another subscription sees the row at once.
fn quick_retry() -> RetryPolicy {
    RetryPolicy::exponential(Duration::from_millis(1), Duration::from_millis(1)).without_jitter()
}

/// A delivery held past its timeout is failed: another subscription gets the row (attempt 2)
/// long before the 30 s lease would have let it go, and the late ack is refused.
fn the_row_returns_while_the_handler_runs(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let t = live.table(form, Duration::from_secs(30));
    let id = live.broker.publish(&t, common::msg("slow", "a")).unwrap();
    let slow = live
        .broker
        .subscription(&t)
        .handler_timeout(LIMIT)
        .retry_policy(quick_retry())
        .start()
        .unwrap();
    let d = common::next(&slow, Duration::from_secs(10));
    let handed_out = Instant::now();
    // Its own worker would claim the returned row too: leave it to `other`.
    slow.close();
    assert!(d.deadline().is_some_and(|at| at >= handed_out));
    assert!(!d.timed_out() && d.lease_held());

    let other = live.broker.subscription(&t).start().unwrap();
    let again = common::next(&other, Duration::from_secs(10));
    assert!(
        handed_out.elapsed() >= LIMIT - Duration::from_millis(100),
        "the row returned before the handler's time was up ({:?})",
        handed_out.elapsed()
    );
    assert_eq!((again.id(), again.attempt()), (id, 2));
    assert!(d.timed_out(), "the handler is not told");
    assert!(!d.lease_held());

    let late = d.ack().expect_err("a timed-out delivery was acked");
    assert!(late.is_handler_timeout(), "{late}");
    assert_eq!(live.rows(&t), 1, "the late ack removed the row");
    again.ack().unwrap();
    assert_eq!(live.rows(&t), 0);
    slow.shutdown(Duration::from_secs(5)).unwrap();
    other.shutdown(Duration::from_secs(5)).unwrap();
}
per_db_form!(the_row_returns_while_the_handler_runs);

/// On the last attempt the timeout dead-letters the row, saying why, in every form: a table
/// of `max_attempts(2)` whose handler overruns both attempts. Attempt 1 is retried (no dead
/// letter), attempt 2 is dead with "attempt 2 of max_attempts 2 failed: the handler timed out
/// after 1s", the late settlement is refused and changes nothing, and the row is not
/// delivered again (to the same subscription or a new one).
///
/// Fails if the timeout retried the last attempt instead (tried by ignoring `max_attempts` in
/// the timeout's failure: every variant failed, row lock and advisory at `was not
/// dead-lettered`, lease at the `(count, id, attempts)` check, as the next claim buried the
/// row at attempt 3), or wrote another reason (`reason`).
fn the_last_attempt_times_out_into_a_dead_letter(db: Db, form: Form) {
    const MAX: u32 = 2;
    let Some(live) = common::live(db) else { return };
    let name = common::unique("t");
    let t = live.create(common::describe(&name, form, Duration::from_secs(30)).max_attempts(MAX));
    let id = live.broker.publish(&t, common::msg("slow", "a")).unwrap();
    let sub = live
        .broker
        .subscription(&t)
        .handler_timeout(LIMIT)
        .retry_policy(quick_retry())
        .start()
        .unwrap();
    for attempt in 1..MAX {
        let d = common::next(&sub, Duration::from_secs(10));
        assert_eq!((d.id(), d.attempt()), (id, attempt));
        // The handler overruns: the timeout takes the delivery, and retries the row.
        assert!(
            common::wait_for(Duration::from_secs(10), || d.timed_out()),
            "attempt {attempt} never timed out"
        );
        assert!(d.ack().unwrap_err().is_handler_timeout());
        assert!(
            live.broker.dead_letters(&t, 10).unwrap().is_empty(),
            "attempt {attempt} of {MAX} was dead-lettered"
        );
    }
    let d = common::next(&sub, Duration::from_secs(10));
    assert_eq!((d.id(), d.attempt()), (id, MAX));
    let dead = common::wait_for(Duration::from_secs(10), || {
        !live.broker.dead_letters(&t, 10).unwrap().is_empty()
    });
    assert!(dead, "the timed-out last attempt was not dead-lettered");
    assert!(d.timed_out());
    let letters = live.broker.dead_letters(&t, 10).unwrap();
    assert_eq!(
        (letters.len(), letters[0].id, letters[0].attempts),
        (1, id, MAX)
    );
    assert_eq!(
        letters[0].reason,
        format!(
            "attempt {MAX} of max_attempts {MAX} failed: the handler timed out after {LIMIT:?}"
        ),
        "reason"
    );
    assert!(d.dead_letter("late").unwrap_err().is_handler_timeout());
    assert_eq!(
        live.broker.dead_letters(&t, 10).unwrap()[0].reason,
        letters[0].reason
    );
    // Dead: not delivered again, by several polls of this subscription or a new one.
    let other = live.broker.subscription(&t).start().unwrap();
    for s in [&sub, &other] {
        match s.next_delivery_timeout(Duration::from_millis(1500)) {
            Err(NextError::Timeout) => {}
            Ok(d) => panic!(
                "the dead row was delivered again: {:?}, attempt {}",
                d.id(),
                d.attempt()
            ),
            Err(e) => panic!("the subscription ended: {e}"),
        }
    }
    assert_eq!(live.rows_where(&t, "dead_at IS NOT NULL"), 1);
    assert_eq!(live.rows(&t), 1);
    sub.shutdown(Duration::from_secs(5)).unwrap();
    other.shutdown(Duration::from_secs(5)).unwrap();
}
per_db_form!(the_last_attempt_times_out_into_a_dead_letter);

#[cfg(any(feature = "postgres", feature = "mysql"))]
fn ledger(live: &common::Live) -> String {
    let name = common::unique("ledger");
    live.track(&name);
    live.exec(&format!(
        "CREATE TABLE {name} (delivery BIGINT PRIMARY KEY)"
    ));
    name
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
/// Row lock form: the handler's own write is undone with the failure, and a statement it runs
/// past the deadline is cancelled on the server (it would sleep 30 s).
fn the_timeout_undoes_and_cancels_the_handlers_sql(db: Db) {
    let Some(live) = common::live(db) else { return };
    let led = ledger(&live);
    let t = live.table(Form::RowLock, Duration::ZERO);
    let id = live.broker.publish(&t, common::msg("slow", "a")).unwrap();
    let slow = live
        .broker
        .subscription(&t)
        .handler_timeout(LIMIT)
        .retry_policy(quick_retry())
        .start()
        .unwrap();
    let mut d = common::next(&slow, Duration::from_secs(10));
    slow.close();
    let started = Instant::now();
    let (insert, sleep) = match db {
        Db::Postgres => (
            "INSERT INTO {led} (delivery) VALUES (1)",
            "SELECT pg_sleep(30)",
        ),
        _ => (
            "INSERT INTO {led} (delivery) VALUES (1)",
            "SELECT SLEEP(30)",
        ),
    };
    let insert = insert.replace("{led}", &led);
    let slept = match db {
        #[cfg(feature = "postgres")]
        Db::Postgres => {
            sqlbroker::postgres::in_delivery(&mut d, |c| c.batch_execute(&insert))
                .unwrap()
                .unwrap();
            sqlbroker::postgres::in_delivery(&mut d, |c| c.batch_execute(sleep)).map(|_| ())
        }
        #[cfg(feature = "mysql")]
        Db::Mysql => {
            use mysql::prelude::Queryable;
            sqlbroker::mysql::in_delivery(&mut d, |c| c.query_drop(&insert))
                .unwrap()
                .unwrap();
            sqlbroker::mysql::in_delivery(&mut d, |c| c.query_drop(sleep)).map(|_| ())
        }
        other => unreachable!("{other:?}: row lock deliveries are the servers'"),
    };
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the handler's statement was not cancelled ({:?})",
        started.elapsed()
    );
    match slept {
        Err(BrokerError::HandlerTimeout { id: got, .. }) => assert_eq!(got, id),
        other => panic!("in_delivery past the deadline gave {other:?}"),
    }
    assert!(d.timed_out());

    let other = live.broker.subscription(&t).start().unwrap();
    let again = common::next(&other, Duration::from_secs(10));
    assert_eq!((again.id(), again.attempt()), (id, 2));
    assert_eq!(
        live.int(&format!("SELECT COUNT(*) FROM {led}")),
        0,
        "the timed-out handler's write was committed"
    );
    assert!(d.ack().unwrap_err().is_handler_timeout());
    again.ack().unwrap();
    assert_eq!(live.rows(&t), 0);
    slow.shutdown(Duration::from_secs(5)).unwrap();
    other.shutdown(Duration::from_secs(5)).unwrap();
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
mod the_timeout_undoes_and_cancels_the_handlers_sql {
    #[cfg(feature = "postgres")]
    #[test]
    fn postgres() {
        super::the_timeout_undoes_and_cancels_the_handlers_sql(super::Db::Postgres)
    }
    #[cfg(feature = "mysql")]
    #[test]
    fn mysql() {
        super::the_timeout_undoes_and_cancels_the_handlers_sql(super::Db::Mysql)
    }
}

/// The runner counts a handler that returned after its timeout, and the row is not acked by it.
#[test]
fn the_runner_counts_timed_out_handlers() {
    let Some(live) = common::live(Db::Sqlite) else {
        return;
    };
    let t = live.table(Form::Lease, Duration::from_secs(30));
    live.broker.publish(&t, common::msg("slow", "a")).unwrap();
    let sub = live
        .broker
        .subscription(&t)
        .handler_timeout(LIMIT)
        .retry_policy(RetryPolicy::exponential(
            Duration::from_secs(60),
            Duration::from_secs(60),
        ))
        .start()
        .unwrap();
    let ran = sub
        .run(1, |d| {
            let told = common::wait_for(Duration::from_secs(10), || d.timed_out());
            sub.close();
            if told {
                Ok(())
            } else {
                Err("never told of the timeout")
            }
        })
        .unwrap();
    assert_eq!((ran.acked, ran.timed_out, ran.failed), (1, 1, 0), "{ran:?}");
    assert_eq!(live.rows(&t), 1, "the late ack removed the row");
}

/// A zero timeout is refused before anything starts.
#[test]
fn a_zero_timeout_is_refused() {
    let broker = sqlbroker::Broker::connect("sqlite::memory:").unwrap();
    let t = Table::new("jobs").lease(Duration::from_secs(30));
    broker.create_table(&t).unwrap();
    let e = broker
        .subscription(&t)
        .handler_timeout(Duration::ZERO)
        .start()
        .unwrap_err();
    assert!(
        matches!(
            e,
            BrokerError::InvalidOption {
                option: "handler_timeout",
                ..
            }
        ),
        "{e}"
    );
}
