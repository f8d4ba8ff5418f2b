//! Review probes (review 2) of queues' pauses, counts and workers: each test passes when the
//! promise holds and fails when it is broken. Two found defects, since fixed: an empty list of
//! queues started a worker with no subscription whose threads panicked
//! (`an_empty_queue_list_is_refused`), and a table with queues but no handler was refused by
//! its subscription rather than by `Worker::start` (`a_worker_without_handlers_is_refused`).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::Db;
use sqlbroker::{BrokerError, Form, Message, Table, Worker};

const BIN: &str = env!("CARGO_BIN_EXE_sqlbroker");

fn queued(live: &common::Live, form: Form, kinds: bool) -> Table {
    let t = common::describe(&common::unique("rv2"), form, Duration::from_secs(30)).queues();
    live.create(if kinds { t.kinds() } else { t })
}

fn publish(live: &common::Live, t: &Table, queue: &str, kind: Option<&str>, body: &str) -> i64 {
    let mut m = Message::new(body.as_bytes().to_vec())
        .set("k", body)
        .queue(queue);
    if let Some(k) = kind {
        m = m.kind(k);
    }
    live.broker.publish(t, m).unwrap()
}

/// CPU ticks (utime + stime) of this process's threads named `sqlbroker-worke*`, by tid.
fn worker_ticks() -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for e in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let p = e.path();
        let comm = std::fs::read_to_string(p.join("comm")).unwrap_or_default();
        if !comm.starts_with("sqlbroker-worke") {
            continue;
        }
        let stat = std::fs::read_to_string(p.join("stat")).unwrap_or_default();
        let Some(rest) = stat.rsplit(')').next() else {
            continue;
        };
        let f: Vec<&str> = rest.split_whitespace().collect();
        // After ")": state is field 3; utime 14 and stime 15 are at 11 and 12 here.
        if f.len() > 12 {
            let t = f[11].parse::<u64>().unwrap_or(0) + f[12].parse::<u64>().unwrap_or(0);
            out.insert(e.file_name().to_string_lossy().to_string(), t);
        }
    }
    out
}

/// The most CPU ticks (1/100 s) any of `tids` spent during `span`.
fn busiest(tids: &BTreeSet<String>, span: Duration) -> u64 {
    let a = worker_ticks();
    std::thread::sleep(span);
    let b = worker_ticks();
    tids.iter()
        .filter_map(|t| Some(b.get(t)?.saturating_sub(*a.get(t)?)))
        .max()
        .unwrap_or(0)
}

// ---------------------------------------------------------------------------------------
// Queue pauses
// ---------------------------------------------------------------------------------------

/// Queue names differ by case (`A-Z a-z` are both allowed): pausing `mail` must not stop
/// `Mail`, a view of `mail` must not claim `Mail`'s rows, and the counts keep them apart.
fn queue_names_are_case_sensitive(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let t = queued(&live, form, false);
    let lower = publish(&live, &t, "mail", None, "l");
    let upper = publish(&live, &t, "Mail", None, "u");
    live.broker.pause_queue(&t, "mail").unwrap();
    assert_eq!(live.broker.paused_queues(&t).unwrap(), ["mail"]);
    let stats = live.broker.queue_stats(&t).unwrap();
    let names: Vec<_> = stats
        .iter()
        .map(|(q, s)| (q.clone(), s.ready, s.paused))
        .collect();
    assert_eq!(
        names,
        [
            ("Mail".to_string(), 1, false),
            ("mail".to_string(), 1, true)
        ],
        "queue_stats keeps the two queues apart"
    );
    let sub = live.broker.subscription(&t).start().unwrap();
    let d = common::next(&sub, Duration::from_secs(10));
    assert_eq!(d.id(), upper, "the unpaused queue Mail runs");
    d.ack().unwrap();
    assert!(
        sub.next_delivery_timeout(Duration::from_millis(700))
            .is_err(),
        "the paused queue mail's row {lower} was delivered"
    );
    sub.close();
    live.broker.resume_queue(&t, "mail").unwrap();
    let upper2 = publish(&live, &t, "Mail", None, "u2");
    let view = live
        .broker
        .subscription(&t)
        .queues(["mail"])
        .start()
        .unwrap();
    let d = common::next(&view, Duration::from_secs(10));
    assert_eq!(d.id(), lower, "a view of mail takes mail's row");
    d.ack().unwrap();
    assert!(
        view.next_delivery_timeout(Duration::from_millis(700))
            .is_err(),
        "a view of `mail` claimed `Mail`'s row {upper2}"
    );
    view.close();
}
per_db_form!(queue_names_are_case_sensitive);

/// `drop_table` then `create_table` of the same name: the pause does not survive.
fn a_pause_does_not_survive_drop_table(db: Db) {
    let Some(live) = common::live(db) else { return };
    let t = queued(&live, Form::Lease, false);
    live.broker.pause_queue(&t, "q").unwrap();
    live.broker.drop_table(&t).unwrap();
    live.broker.create_table(&t).unwrap();
    assert!(
        live.broker.paused_queues(&t).unwrap().is_empty(),
        "pause survived drop"
    );
    let id = publish(&live, &t, "q", None, "x");
    let sub = live.broker.subscription(&t).start().unwrap();
    let d = common::next(&sub, Duration::from_secs(10));
    assert_eq!(d.id(), id);
    d.ack().unwrap();
    sub.close();
}
per_db!(a_pause_does_not_survive_drop_table);

/// A paused queue's row in a FIFO group does not let the group's next row (in another
/// queue) run ahead of it... nor is it claimed; a running subscription (claims already
/// polling) follows a pause from its next claim.
fn a_pause_is_followed_by_a_running_subscription(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let t = queued(&live, form, false);
    let sub = live.broker.subscription(&t).start().unwrap();
    let other = live.connect();
    // The subscription is running and idle; another broker pauses.
    std::thread::sleep(Duration::from_millis(300));
    other.pause_queue(&t, "p").unwrap();
    let paused = publish(&live, &t, "p", None, "p1");
    let free = publish(&live, &t, "f", None, "f1");
    let d = common::next(&sub, Duration::from_secs(10));
    assert_eq!(
        d.id(),
        free,
        "the paused queue's row {paused} was delivered"
    );
    d.ack().unwrap();
    assert!(
        sub.next_delivery_timeout(Duration::from_millis(1500))
            .is_err(),
        "the paused queue's row was delivered"
    );
    other.resume_queue(&t, "p").unwrap();
    let d = common::next(&sub, Duration::from_secs(10));
    assert_eq!(d.id(), paused);
    d.ack().unwrap();
    sub.close();
}
per_db_form!(a_pause_is_followed_by_a_running_subscription);

/// The operator's `run_now` of a paused queue's job does not run it while paused.
fn run_now_of_a_paused_queues_job(db: Db) {
    let Some(live) = common::live(db) else { return };
    let t = queued(&live, Form::Lease, false);
    let id = live
        .broker
        .publish(
            &t,
            Message::new(b"x".to_vec())
                .set("k", "x")
                .queue("p")
                .deliver_after(Duration::from_secs(3600)),
        )
        .unwrap();
    live.broker.pause_queue(&t, "p").unwrap();
    let _ = live.broker.run_now(&t, id);
    let sub = live.broker.subscription(&t).start().unwrap();
    assert!(
        sub.next_delivery_timeout(Duration::from_millis(1000))
            .is_err(),
        "run_now ran a paused queue's job"
    );
    let stats = live.broker.queue_stats(&t).unwrap();
    assert!(stats.iter().any(|(q, s)| q == "p" && s.paused));
    sub.close();
}
per_db!(run_now_of_a_paused_queues_job);

// ---------------------------------------------------------------------------------------
// Workers
// ---------------------------------------------------------------------------------------

/// A handler that panics: caught, the job failed by the retry policy (`panicked` counted),
/// the worker's threads go on with the next job.
fn a_panicking_handler_is_failed(db: Db) {
    let Some(live) = common::live(db) else { return };
    let t = live.create(
        common::describe(&common::unique("rv2"), Form::Lease, Duration::from_secs(30))
            .kinds()
            .max_attempts(1),
    );
    for i in 0..3 {
        live.broker
            .publish(
                &t,
                Message::new(b"x".to_vec())
                    .set("k", format!("b{i}"))
                    .kind("boom"),
            )
            .unwrap();
    }
    live.broker
        .publish(&t, Message::new(b"x".to_vec()).set("k", "ok").kind("fine"))
        .unwrap();
    let w = Worker::new(&live.broker)
        .on(&t, "boom", |_d| -> Result<(), String> {
            panic!("probe panic")
        })
        .on(&t, "fine", |_d| Ok::<(), String>(()))
        .threads(1)
        .start()
        .unwrap();
    assert!(
        common::wait_for(Duration::from_secs(20), || {
            let r = w.ran().total();
            r.panicked >= 3 && r.acked >= 1
        }),
        "ran: {:?}",
        w.ran()
    );
    let ran = w.shutdown(Duration::from_secs(5)).unwrap();
    let boom = ran.get(t.name(), "boom").unwrap();
    assert_eq!(boom.panicked, 3);
    assert_eq!(boom.dead_lettered, 3, "max_attempts 1: dead-lettered");
    assert_eq!(live.broker.stats(&t).unwrap().ready, 0);
}
per_db!(a_panicking_handler_is_failed);

/// A handler blocking past the grace: `shutdown` returns within the grace plus a statement
/// timeout, with `Unsettled`; the rows claimed ahead go back at once, attempts unspent.
fn shutdown_with_a_handler_blocking_past_grace(db: Db) {
    let Some(live) = common::live(db) else { return };
    let t = queued(&live, Form::Lease, true);
    for i in 0..6 {
        publish(&live, &t, "default", Some("slow"), &format!("s{i}"));
    }
    let started = Arc::new(AtomicUsize::new(0));
    let release = Arc::new(AtomicBool::new(false));
    let (s2, r2) = (started.clone(), release.clone());
    let w = Worker::new(&live.broker)
        .on(&t, "slow", move |_d| {
            s2.fetch_add(1, Ordering::SeqCst);
            let t0 = Instant::now();
            while !r2.load(Ordering::SeqCst) && t0.elapsed() < Duration::from_secs(20) {
                std::thread::sleep(Duration::from_millis(10));
            }
            Ok::<(), String>(())
        })
        .threads(1)
        .start()
        .unwrap();
    assert!(common::wait_for(Duration::from_secs(10), || started
        .load(Ordering::SeqCst)
        == 1));
    std::thread::sleep(Duration::from_millis(300));
    let t0 = Instant::now();
    let r = w.shutdown(Duration::from_millis(500));
    let took = t0.elapsed();
    assert!(took < Duration::from_secs(8), "shutdown took {took:?}");
    assert!(matches!(r, Err(BrokerError::Unsettled { .. })), "{r:?}");
    // The five rows not started are claimable at once by another broker.
    let other = live.connect();
    let sub = other.subscription(&t).start().unwrap();
    let mut got = 0;
    while let Ok(d) = sub.next_delivery_timeout(Duration::from_secs(2)) {
        assert_eq!(d.attempt(), 1, "attempt spent by a row claimed ahead");
        d.ack().unwrap();
        got += 1;
    }
    assert_eq!(got, 5, "rows claimed ahead handed back");
    release.store(true, Ordering::SeqCst);
    sub.close();
}
per_db!(shutdown_with_a_handler_blocking_past_grace);

/// A worker dropped without `shutdown`: its rows claimed ahead go back (the subscriptions
/// closed), claimable by another broker at once.
fn a_dropped_worker_hands_back_its_rows(db: Db) {
    let Some(live) = common::live(db) else { return };
    let t = queued(&live, Form::Lease, true);
    for i in 0..8 {
        publish(&live, &t, "default", Some("k"), &format!("x{i}"));
    }
    let gate = Arc::new(AtomicBool::new(false));
    let started = Arc::new(AtomicUsize::new(0));
    let (g, s) = (gate.clone(), started.clone());
    let w = Worker::new(&live.broker)
        .on(&t, "k", move |_d| {
            s.fetch_add(1, Ordering::SeqCst);
            while !g.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(10));
            }
            Ok::<(), String>(())
        })
        .threads(1)
        .start()
        .unwrap();
    assert!(common::wait_for(Duration::from_secs(10), || started
        .load(Ordering::SeqCst)
        == 1));
    std::thread::sleep(Duration::from_millis(300));
    drop(w);
    let other = live.connect();
    let sub = other.subscription(&t).start().unwrap();
    let mut got = 0;
    while let Ok(d) = sub.next_delivery_timeout(Duration::from_secs(2)) {
        d.ack().unwrap();
        got += 1;
    }
    gate.store(true, Ordering::SeqCst);
    assert_eq!(got, 7, "rows claimed ahead by a dropped worker");
    assert_eq!(
        started.load(Ordering::SeqCst),
        1,
        "a dropped worker ran more jobs"
    );
    sub.close();
}
per_db!(a_dropped_worker_hands_back_its_rows);

/// An idle worker does not burn CPU.
#[test]
fn an_idle_worker_does_not_spin() {
    let Some(live) = common::live(Db::Sqlite) else {
        return;
    };
    let t = queued(&live, Form::Lease, true);
    let before: BTreeSet<String> = worker_ticks().into_keys().collect();
    let w = Worker::new(&live.broker)
        .on(&t, "k", |_d| Ok::<(), String>(()))
        .threads(4)
        .start()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let mine: BTreeSet<String> = worker_ticks()
        .into_keys()
        .filter(|k| !before.contains(k))
        .collect();
    let ticks = busiest(&mine, Duration::from_secs(2));
    assert!(
        ticks < 30,
        "an idle worker's thread used {ticks}/200 ticks in 2 s"
    );
    w.shutdown(Duration::from_secs(5)).unwrap();
}

/// A capped queue at its cap: the other threads wait, they do not spin on the capped lane.
#[test]
fn a_capped_queue_at_its_cap_does_not_spin() {
    let Some(live) = common::live(Db::Sqlite) else {
        return;
    };
    let t = queued(&live, Form::Lease, true);
    for i in 0..4 {
        publish(&live, &t, "capped", Some("k"), &format!("c{i}"));
    }
    let gate = Arc::new(AtomicBool::new(false));
    let in_work = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let (g, iw, m) = (gate.clone(), in_work.clone(), most.clone());
    let before: BTreeSet<String> = worker_ticks().into_keys().collect();
    let w = Worker::new(&live.broker)
        .on(&t, "k", move |_d| {
            let n = iw.fetch_add(1, Ordering::SeqCst) + 1;
            m.fetch_max(n, Ordering::SeqCst);
            while !g.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(10));
            }
            iw.fetch_sub(1, Ordering::SeqCst);
            Ok::<(), String>(())
        })
        .queues(&t, ["capped", "other"])
        .queue_threads(&t, "capped", 1)
        .threads(4)
        .start()
        .unwrap();
    assert!(common::wait_for(Duration::from_secs(10), || in_work
        .load(Ordering::SeqCst)
        == 1));
    std::thread::sleep(Duration::from_millis(500));
    let mine: BTreeSet<String> = worker_ticks()
        .into_keys()
        .filter(|k| !before.contains(k))
        .collect();
    let ticks = busiest(&mine, Duration::from_secs(2));
    gate.store(true, Ordering::SeqCst);
    assert!(
        common::wait_for(Duration::from_secs(20), || w.ran().total().acked == 4),
        "{:?}",
        w.ran()
    );
    w.shutdown(Duration::from_secs(5)).unwrap();
    assert_eq!(most.load(Ordering::SeqCst), 1, "the cap held");
    assert!(
        ticks < 30,
        "a worker thread used {ticks}/200 ticks in 2 s at a cap"
    );
}

/// One table of a worker's dropped by hand: its subscription fails (or closes); the worker's
/// other table goes on, and the threads do not spin on the closed lane.
fn a_table_dropped_under_a_worker(db: Db) {
    let Some(live) = common::live(db) else { return };
    let a = queued(&live, Form::Lease, true);
    let b = queued(&live, Form::Lease, true);
    let before: BTreeSet<String> = worker_ticks().into_keys().collect();
    let w = Worker::new(&live.broker)
        .on(&a, "k", |_d| Ok::<(), String>(()))
        .on(&b, "k", |_d| Ok::<(), String>(()))
        .threads(2)
        .start()
        .unwrap();
    publish(&live, &a, "default", Some("k"), "a1");
    publish(&live, &b, "default", Some("k"), "b1");
    assert!(common::wait_for(Duration::from_secs(10), || w
        .ran()
        .total()
        .acked
        == 2));
    live.exec(&format!("DROP TABLE {}", a.name()));
    std::thread::sleep(Duration::from_secs(3));
    publish(&live, &b, "default", Some("k"), "b2");
    assert!(
        common::wait_for(Duration::from_secs(15), || w.ran().total().acked == 3),
        "the other table stopped: {:?}",
        w.ran()
    );
    let mine: BTreeSet<String> = worker_ticks()
        .into_keys()
        .filter(|k| !before.contains(k))
        .collect();
    let ticks = busiest(&mine, Duration::from_secs(2));
    let _ = w.shutdown(Duration::from_secs(5));
    assert!(ticks < 30, "a worker thread used {ticks}/200 ticks in 2 s");
    let _ = live.broker.create_table(&a);
}
per_db!(a_table_dropped_under_a_worker);

/// Bad registrations are refused by `start` and nothing runs.
fn bad_registrations_are_refused(db: Db) {
    let Some(live) = common::live(db) else { return };
    let t = queued(&live, Form::Lease, true);
    let plain = live.create(common::describe(
        &common::unique("rv2"),
        Form::Lease,
        Duration::from_secs(30),
    ));
    let id = publish(&live, &t, "q", Some("k"), "x");
    let ran = Arc::new(AtomicUsize::new(0));
    let h = |r: Arc<AtomicUsize>| {
        move |_d: &sqlbroker::Delivery| {
            r.fetch_add(1, Ordering::SeqCst);
            Ok::<(), String>(())
        }
    };
    // A cap over the threads.
    let r = Worker::new(&live.broker)
        .on(&t, "k", h(ran.clone()))
        .queues(&t, ["q"])
        .queue_threads(&t, "q", 5)
        .threads(2)
        .start();
    assert!(
        matches!(r, Err(BrokerError::InvalidOption { .. })),
        "cap > threads"
    );
    // A bad queue name in `queues`.
    let r = Worker::new(&live.broker)
        .on(&t, "k", h(ran.clone()))
        .queues(&t, ["bad name"])
        .start();
    assert!(r.is_err(), "bad queue name");
    // A table without kinds, next to a good one: nothing runs.
    let r = Worker::new(&live.broker)
        .on(&t, "k", h(ran.clone()))
        .on(&plain, "k", h(ran.clone()))
        .start();
    assert!(
        matches!(
            r,
            Err(BrokerError::InvalidTable { .. } | BrokerError::InvalidOption { .. })
        ),
        "table without kinds"
    );
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(ran.load(Ordering::SeqCst), 0, "a refused worker ran a job");
    assert_eq!(
        live.broker.stats(&t).unwrap().ready,
        1,
        "row {id} still ready"
    );
}
per_db!(bad_registrations_are_refused);

// ---------------------------------------------------------------------------------------
// CLI
// ---------------------------------------------------------------------------------------

fn cli(url: &str, args: &[&str]) -> std::process::Output {
    Command::new(BIN)
        .args(args)
        .env("DATABASE_URL", url)
        .output()
        .expect("run sqlbroker")
}

/// `status --queue all` of a queue value written by hand with control characters: escaped.
#[test]
fn cli_status_escapes_a_hand_written_queue() {
    let Some(live) = common::live(Db::Sqlite) else {
        return;
    };
    let t = queued(&live, Form::Lease, false);
    let id = publish(&live, &t, "q", None, "x");
    live.exec(&format!(
        "UPDATE {} SET queue = 'a' || char(27) || '[2J' || char(8238) || 'b' WHERE id = {id}",
        t.name()
    ));
    for args in [
        vec!["status", "--table", t.name(), "--queue", "all"],
        vec!["status", "--table", t.name(), "--queue", "all", "--json"],
    ] {
        let o = cli(&live.url, &args);
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(o.status.success(), "{args:?}: {o:?}");
        assert!(!out.contains('\u{1b}'), "{args:?}: raw ESC in {out:?}");
        assert!(
            !out.contains('\u{202e}'),
            "{args:?}: raw bidi override in {out:?}"
        );
    }
}

/// `pause --queue` with a bad name, or on a table without queues: exit 1 or 2, nothing
/// paused.
#[test]
fn cli_pause_refuses_bad_queue() {
    let Some(live) = common::live(Db::Sqlite) else {
        return;
    };
    let t = queued(&live, Form::Lease, false);
    for bad in ["a b", "", "x'--", &"q".repeat(65)] {
        let o = cli(&live.url, &["pause", "--table", t.name(), "--queue", bad]);
        let code = o.status.code();
        assert!(matches!(code, Some(1 | 2)), "{bad:?}: {o:?}");
        assert!(!o.stderr.is_empty(), "{bad:?}: no message");
    }
    assert!(live.broker.paused_queues(&t).unwrap().is_empty());
    let o = cli(&live.url, &["pause", "--table", t.name(), "--queue", "ok"]);
    assert!(o.status.success(), "{o:?}");
    assert_eq!(live.broker.paused_queues(&t).unwrap(), ["ok"]);
    let o = cli(&live.url, &["resume", "--table", t.name(), "--queue", "ok"]);
    assert!(o.status.success(), "{o:?}");
    assert!(live.broker.paused_queues(&t).unwrap().is_empty());
}

/// `Worker::queues(&t, [])`: an empty queue list must be refused by `start` (InvalidOption),
/// or run nothing harmlessly. Today `start` plans no subscription for the table, returns
/// `Ok` with zero lanes, and every handler thread panics at `first % n` (n = 0, division by
/// zero, src/consuming/worker.rs `Shared::run`).
fn an_empty_queue_list_is_refused(db: Db) {
    let Some(live) = common::live(db) else { return };
    let t = queued(&live, Form::Lease, true);
    publish(&live, &t, "q", Some("k"), "x");
    let r = Worker::new(&live.broker)
        .on(&t, "k", |_d| Ok::<(), String>(()))
        .queues(&t, Vec::<String>::new())
        .start();
    match r {
        Err(BrokerError::InvalidOption { .. }) => {}
        Err(e) => panic!("refused, but not as InvalidOption: {e}"),
        Ok(w) => {
            std::thread::sleep(Duration::from_millis(500));
            let r = w.shutdown(Duration::from_secs(2));
            panic!("an empty queue list was accepted (a worker with no subscription): {r:?}");
        }
    }
}
mod an_empty_queue_list_is_refused {
    use super::*;
    #[test]
    fn sqlite() {
        super::an_empty_queue_list_is_refused(common::Db::Sqlite)
    }
}

/// A row lock worker over two tables on a pool too small for its claim workers and rows in
/// work (pool 2, 2 tables, 4 threads): every job still runs (slowly) and shutdown returns
/// within its grace plus a statement timeout; nothing deadlocks.
fn row_lock_worker_on_a_small_pool(db: Db) {
    let Some(live) = common::live(db) else { return };
    let small = sqlbroker::Broker::builder(&live.url)
        .pool_size(2)
        .build()
        .unwrap();
    let a = queued(&live, Form::RowLock, true);
    let b = queued(&live, Form::RowLock, true);
    for i in 0..6 {
        publish(&live, &a, "default", Some("k"), &format!("a{i}"));
        publish(&live, &b, "default", Some("k"), &format!("b{i}"));
    }
    let w = Worker::new(&small)
        .on(&a, "k", |_d| Ok::<(), String>(()))
        .on(&b, "k", |_d| Ok::<(), String>(()))
        .threads(4)
        .start()
        .unwrap();
    let done = common::wait_for(Duration::from_secs(40), || w.ran().total().acked == 12);
    let t0 = Instant::now();
    let r = w.shutdown(Duration::from_secs(2));
    let took = t0.elapsed();
    assert!(done, "jobs stuck on a small pool: {:?}", w.ran());
    assert!(
        took < Duration::from_secs(40),
        "shutdown took {took:?}: {r:?}"
    );
}
per_server!(row_lock_worker_on_a_small_pool);

/// `queue_stats` and `kind_stats` against the rows: ready, scheduled, in flight (lease)
/// counted per queue and kind; a paused queue with no rows is not required to show, but a
/// paused queue with rows shows `paused`.
fn stats_match_the_rows(db: Db) {
    let Some(live) = common::live(db) else { return };
    let t = queued(&live, Form::Lease, true);
    publish(&live, &t, "q1", Some("a"), "1");
    publish(&live, &t, "q1", Some("b"), "2");
    publish(&live, &t, "q2", Some("a"), "3");
    live.broker
        .publish(
            &t,
            Message::new(b"4".to_vec())
                .set("k", "4")
                .queue("q2")
                .kind("b")
                .deliver_after(Duration::from_secs(3600)),
        )
        .unwrap();
    live.broker.pause_queue(&t, "q2").unwrap();
    let sub = live
        .broker
        .subscription(&t)
        .queues(["q1"])
        .kinds(["a"])
        .start()
        .unwrap();
    let d = common::next(&sub, Duration::from_secs(10));
    let q: BTreeMap<String, (u64, u64, Option<u64>, bool)> = live
        .broker
        .queue_stats(&t)
        .unwrap()
        .into_iter()
        .map(|(n, s)| (n, (s.ready, s.scheduled, s.in_flight, s.paused)))
        .collect();
    assert_eq!(q["q1"], (1, 0, Some(1), false), "{q:?}");
    assert_eq!(q["q2"], (1, 1, Some(0), true), "{q:?}");
    let k: BTreeMap<Option<String>, (u64, u64, Option<u64>)> = live
        .broker
        .kind_stats(&t)
        .unwrap()
        .into_iter()
        .map(|(n, s)| (n, (s.ready, s.scheduled, s.in_flight)))
        .collect();
    assert_eq!(k[&Some("a".to_string())], (1, 0, Some(1)), "{k:?}");
    assert_eq!(k[&Some("b".to_string())], (1, 1, Some(0)), "{k:?}");
    d.ack().unwrap();
    sub.close();
}
per_db!(stats_match_the_rows);

// ---------------------------------------------------------------------------------------
// Dashboard
// ---------------------------------------------------------------------------------------

struct Dash {
    child: std::process::Child,
    base: String,
    agent: ureq::Agent,
}

impl Drop for Dash {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn dash(url: &str) -> Dash {
    use std::io::BufRead;
    let mut child = Command::new(BIN)
        .args(["dashboard", "--listen", "127.0.0.1:0"])
        .env("DATABASE_URL", url)
        .env_remove("SQLBROKER_DASHBOARD_TOKEN")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let addr = line
        .split("listening on http://")
        .nth(1)
        .and_then(|r| r.split('/').next())
        .unwrap_or_else(|| panic!("{line:?}"))
        .trim()
        .to_string();
    std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
    Dash {
        base: format!("http://{addr}"),
        child,
        agent: ureq::AgentBuilder::new()
            .redirects(0)
            .timeout(Duration::from_secs(30))
            .build(),
    }
}

fn call(r: Result<ureq::Response, ureq::Error>) -> (u16, String) {
    let r = match r {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("{e}"),
    };
    (r.status(), r.into_string().unwrap())
}

/// The table page's Queues section and `/metrics` escape a queue value written by hand;
/// `pause_queue` needs the CSRF token and refuses a bad name with 400, changing nothing.
#[test]
fn dashboard_queues_section_and_actions() {
    let Some(live) = common::live(Db::Sqlite) else {
        return;
    };
    let t = queued(&live, Form::Lease, false);
    let id = publish(&live, &t, "q", None, "x");
    live.exec(&format!(
        "UPDATE {} SET queue = '<script>alert(1)</script>\"' || char(10) || 'x' || char(8238) \
         || char(27) WHERE id = {id}",
        t.name()
    ));
    publish(&live, &t, "good", None, "y");
    let d = dash(&live.url);
    let page_path = format!("/tables/{}", t.name());
    let (st, page) = call(d.agent.get(&format!("{}{page_path}", d.base)).call());
    assert_eq!(st, 200, "{page}");
    assert!(
        !page.contains("<script>alert"),
        "raw <script> on the table page"
    );
    for (i, _) in page.match_indices(['\u{202e}', '\u{1b}']) {
        let lo = page.floor_char_boundary(i.saturating_sub(120));
        let ctx = &page[lo..i];
        // In a hidden input's value (the form's queue field) it is not shown.
        assert!(
            ctx.contains("type=\"hidden\"")
                && ctx
                    .rfind('>')
                    .is_none_or(|g| g < ctx.rfind("<input").unwrap_or(0)),
            "raw bidi override shown on the table page: {ctx:?}"
        );
    }
    let (st, metrics) = call(d.agent.get(&format!("{}/metrics", d.base)).call());
    assert_eq!(st, 200);
    for l in metrics.lines().filter(|l| l.contains(t.name())) {
        assert!(
            l.starts_with('#') || l.starts_with("sqlbroker_"),
            "a /metrics line broken by a queue label: {l:?}"
        );
    }
    assert!(
        !metrics.contains("</script>\"\n"),
        "unescaped quote/newline in a label"
    );
    let csrf = page
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .expect("a CSRF token")
        .to_string();
    let path = format!("{}/tables/{}/pause_queue", d.base, t.name());
    let post =
        |form: &[(&str, &str)]| call(d.agent.post(&path).set("Origin", &d.base).send_form(form));
    let (st, _) = post(&[("queue", "good"), ("back", "/")]);
    assert!(st >= 400, "pause_queue without CSRF: {st}");
    let (st, _) = post(&[("queue", "good"), ("csrf", "0123"), ("back", "/")]);
    assert!(st >= 400, "pause_queue with a wrong CSRF: {st}");
    assert!(live.broker.paused_queues(&t).unwrap().is_empty());
    for bad in ["a b", "", "<b>", &"q".repeat(65)] {
        let (st, body) = post(&[("queue", bad), ("csrf", &csrf), ("back", "/")]);
        assert_eq!(st, 400, "bad queue {bad:?}: {body}");
        assert!(!body.contains("<b>"), "the refused name echoed raw");
    }
    assert!(
        live.broker.paused_queues(&t).unwrap().is_empty(),
        "a refused post paused"
    );
    let (st, body) = post(&[("queue", "good"), ("csrf", &csrf), ("back", "/")]);
    assert!(st < 400, "{st}: {body}");
    assert_eq!(live.broker.paused_queues(&t).unwrap(), ["good"]);
}

/// A worker with `queues` (or `queue_threads`) but no handler for the table: refused by
/// `start` ("a worker with no handler"), and no row of the table is claimed.
fn a_worker_without_handlers_is_refused(db: Db) {
    let Some(live) = common::live(db) else { return };
    let t = queued(&live, Form::Lease, true);
    publish(&live, &t, "q", Some("k"), "x");
    publish(&live, &t, "q", None, "y");
    let r = Worker::new(&live.broker).queues(&t, ["q"]).start();
    let ok = matches!(r, Err(BrokerError::InvalidOption { .. }));
    if let Ok(w) = r {
        std::thread::sleep(Duration::from_millis(700));
        let ran = w.shutdown(Duration::from_secs(2));
        let stats = live.broker.stats(&t).unwrap();
        panic!(
            "a worker with no handler started: {ran:?}; ready now {}",
            stats.ready
        );
    }
    assert!(
        ok,
        "refused, but not as InvalidOption: {:?}",
        Worker::new(&live.broker).queues(&t, ["q"]).start().err()
    );
}
mod a_worker_without_handlers_is_refused {
    use super::*;
    #[test]
    fn sqlite() {
        super::a_worker_without_handlers_is_refused(common::Db::Sqlite)
    }
}
