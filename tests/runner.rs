//! The handler runner and the retry policy: a panicking or failing handler's row is retried
//! by the policy (never lost, the thread survives), and dead-lettered with the error's text
//! once its attempts are spent.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::Db;
use sqlbroker::{Form, Message, RetryPolicy};

/// Four rows; the handler panics on the first attempt of one. Every row ends acked, the
/// panicking one on attempt 2, and the runner's threads lived through it.
fn runner_survives_a_panicking_handler(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let t = live.table(form, Duration::from_secs(30));
    for body in ["boom", "a", "b", "c"] {
        live.broker
            .publish(&t, Message::new(body.as_bytes().to_vec()).set("k", body))
            .unwrap();
    }
    let policy = RetryPolicy::exponential(Duration::from_secs(1), Duration::from_secs(1));
    let sub = live
        .broker
        .subscription(&t)
        .workers(2)
        .retry_policy(policy.without_jitter())
        .start()
        .unwrap();
    let acks = AtomicUsize::new(0);
    let boom_attempts = Mutex::new(Vec::new());
    let deadline = Instant::now() + Duration::from_secs(30);
    let ran = sub
        .run(2, |d| {
            if d.payload() == b"boom" {
                boom_attempts.lock().unwrap().push(d.attempt());
                if d.attempt() == 1 {
                    panic!("boom");
                }
            }
            if acks.fetch_add(1, Ordering::SeqCst) + 1 == 4 || Instant::now() > deadline {
                sub.close();
            }
            Ok::<(), String>(())
        })
        .unwrap();
    assert_eq!((ran.acked, ran.panicked, ran.failed), (4, 1, 0), "{ran:?}");
    assert_eq!(*boom_attempts.lock().unwrap(), [1, 2]);
    assert_eq!(live.rows(&t), 0);
}
per_db_form!(runner_survives_a_panicking_handler);

/// A handler that always fails: retried after 1 s, then 2 s (the policy's delays, growing),
/// then dead-lettered on the last attempt with the error's text.
fn failing_handler_reaches_its_dead_letter(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let name = common::unique("t");
    let t = live.create(common::describe(&name, form, Duration::from_secs(30)).max_attempts(3));
    live.broker
        .publish(&t, Message::new(b"nope".to_vec()).set("k", "a"))
        .unwrap();
    let policy = RetryPolicy::exponential(Duration::from_secs(1), Duration::from_secs(10));
    let sub = live
        .broker
        .subscription(&t)
        .retry_policy(policy.without_jitter())
        .start()
        .unwrap();
    let seen = Mutex::new(Vec::new());
    let ran = std::thread::scope(|s| {
        s.spawn(|| {
            let dead = common::wait_for(Duration::from_secs(20), || {
                !live.broker.dead_letters(&t, 1).unwrap().is_empty()
            });
            sub.close();
            assert!(dead, "the failing row was never dead-lettered");
        });
        sub.run(1, |d| {
            seen.lock().unwrap().push((d.attempt(), Instant::now()));
            // A handler that never returns `Ok` names its `Ok` type (`run` takes any
            // `Into<Outcome>`).
            Err::<(), _>(format!("nope #{}", d.attempt()))
        })
        .unwrap()
    });
    assert_eq!((ran.failed, ran.acked), (3, 0));
    let seen = seen.lock().unwrap();
    let attempts: Vec<u32> = seen.iter().map(|(a, _)| *a).collect();
    assert_eq!(attempts, [1, 2, 3]);
    let gaps: Vec<Duration> = seen.windows(2).map(|w| w[1].1 - w[0].1).collect();
    // Due times are whole seconds, rounded up: at least the delay, less than it plus 1.5 s.
    assert!(
        gaps[0] >= Duration::from_millis(900),
        "first delay {:?}",
        gaps[0]
    );
    assert!(
        gaps[1] >= Duration::from_millis(1900),
        "second delay {:?}",
        gaps[1]
    );
    assert!(gaps[1] > gaps[0], "delays did not grow: {gaps:?}");
    let dead = live.broker.dead_letters(&t, 10).unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].attempts, 3);
    assert!(
        dead[0].reason.contains("failed: nope #3"),
        "{}",
        dead[0].reason
    );
}
per_db_form!(failing_handler_reaches_its_dead_letter);

/// `run` with no threads, or more than 1,024, is refused with `InvalidOption` and handles
/// nothing: the published row stays ready for a run with a sound count.
fn run_refuses_a_bad_thread_count(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let t = live.table(form, Duration::from_secs(30));
    live.broker
        .publish(&t, Message::new(b"x".to_vec()).set("k", "a"))
        .unwrap();
    let sub = live.broker.subscription(&t).start().unwrap();
    for threads in [0, 1025] {
        let err = sub
            .run(threads, |_| Ok::<(), String>(()))
            .expect_err("a bad thread count was run");
        assert!(
            matches!(
                err,
                sqlbroker::BrokerError::InvalidOption { option: "run", .. }
            ),
            "{err}"
        );
    }
    let ran = sub
        .run(1, |_| {
            sub.close();
            Ok::<(), String>(())
        })
        .unwrap();
    assert_eq!(ran.acked, 1, "{ran:?}");
}
per_db_form!(run_refuses_a_bad_thread_count);
