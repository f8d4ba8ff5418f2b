//! Queues' pauses and counts, and workers: handlers by table and kind on one pool of threads.
//! Every database x form.

mod common;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::Db;
use sqlbroker::{BrokerError, Form, Message, Table, Worker};

fn queued(live: &common::Live, form: Form, kinds: bool) -> Table {
    let name = common::unique("wq");
    let t = common::describe(&name, form, Duration::from_secs(30)).queues();
    live.create(if kinds { t.kinds() } else { t })
}

/// A second broker on the same database (a second service).
fn other(live: &common::Live) -> sqlbroker::Broker {
    sqlbroker::Broker::connect(&live.url).unwrap()
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

/// A paused queue is claimed by no broker (this one and a second one, whole-table and view
/// subscriptions alike) while the table's other queues run; resumed, its rows come. Fails
/// (`a paused queue's row was delivered`) without the claims' `NOT EXISTS` on the paused
/// queues, and (`the resumed queue's rows`) if a resume did not take effect.
fn a_paused_queue_is_claimed_by_no_broker(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let t = queued(&live, form, false);
    let other = other(&live);
    live.broker.pause_queue(&t, "slow").unwrap();
    assert_eq!(live.broker.paused_queues(&t).unwrap(), ["slow"]);
    let slow: BTreeSet<i64> = (0..3)
        .map(|i| publish(&live, &t, "slow", None, &format!("s{i}")))
        .collect();
    let fast: BTreeSet<i64> = (0..3)
        .map(|i| publish(&live, &t, "fast", None, &format!("f{i}")))
        .collect();
    let whole = live.broker.subscription(&t).start().unwrap();
    let view = other
        .subscription(&t)
        .queues(["slow", "fast"])
        .start()
        .unwrap();
    let mut got = BTreeSet::new();
    let until = std::time::Instant::now() + Duration::from_secs(20);
    while got.len() < fast.len() && std::time::Instant::now() < until {
        for sub in [&whole, &view] {
            if let Ok(d) = sub.next_delivery_timeout(Duration::from_millis(200)) {
                assert_eq!(d.queue(), "fast", "a paused queue's row was delivered");
                assert!(got.insert(d.id()), "delivered twice");
                d.ack().unwrap();
            }
        }
    }
    assert_eq!(got, fast);
    for sub in [&whole, &view] {
        assert!(
            sub.next_delivery_timeout(Duration::from_millis(500))
                .is_err(),
            "a paused queue's row was delivered"
        );
    }
    let stats = live.broker.queue_stats(&t).unwrap();
    let slow_stats = &stats.iter().find(|(q, _)| q == "slow").unwrap().1;
    assert!(slow_stats.paused, "queue_stats: the paused queue");
    assert_eq!(slow_stats.ready, 3, "queue_stats: its rows");
    assert!(stats.iter().all(|(q, _)| q != "fast"), "acked rows counted");
    other.resume_queue(&t, "slow").unwrap();
    assert!(live.broker.paused_queues(&t).unwrap().is_empty());
    let mut resumed = BTreeSet::new();
    let until = std::time::Instant::now() + Duration::from_secs(20);
    while resumed.len() < slow.len() && std::time::Instant::now() < until {
        for sub in [&whole, &view] {
            if let Ok(d) = sub.next_delivery_timeout(Duration::from_millis(200)) {
                resumed.insert(d.id());
                d.ack().unwrap();
            }
        }
    }
    assert_eq!(resumed, slow, "the resumed queue's rows");
    whole.close();
    view.close();
}
per_db_form!(a_paused_queue_is_claimed_by_no_broker);

/// Bad calls change nothing: a queue on a table without queues, a bad name.
fn queue_calls_refuse_bad_input(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let plain = live.create(common::describe(
        &common::unique("wp"),
        form,
        Duration::from_secs(30),
    ));
    assert!(matches!(
        live.broker.pause_queue(&plain, "a"),
        Err(BrokerError::InvalidTable { .. })
    ));
    assert!(matches!(
        live.broker.queue_stats(&plain),
        Err(BrokerError::InvalidTable { .. })
    ));
    let t = queued(&live, form, false);
    for bad in ["", "a b", "x'; DROP TABLE y; --", &"q".repeat(65)] {
        assert!(
            matches!(
                live.broker.pause_queue(&t, bad),
                Err(BrokerError::InvalidOption { .. })
            ),
            "{bad:?}"
        );
    }
    assert!(live.broker.paused_queues(&t).unwrap().is_empty());
}
per_db_form!(queue_calls_refuse_bad_input);

/// Three workers with different registries share one table: each runs only the kinds it has
/// handlers for, every job runs once, and a kind nobody handles stays ready, counted by
/// `kind_stats`. Fails (`the jobs ran`, `the orphan stays ready`) if a worker's subscription
/// claimed every kind: the rows of kinds it has no handler for are failed, and run later.
fn workers_take_only_their_kinds(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let t = queued(&live, form, true);
    let kinds = ["a", "b", "c"];
    let mut ids = BTreeSet::new();
    for i in 0..30 {
        let k = kinds[i % 3];
        ids.insert(publish(&live, &t, "default", Some(k), &format!("{k}{i}")));
    }
    let orphan = publish(&live, &t, "default", Some("nobody"), "orphan");
    let seen: Arc<Mutex<Vec<(usize, String, i64)>>> = Arc::default();
    let registries: [&[&str]; 3] = [&["a"], &["b", "c"], &["c"]];
    let brokers = [live.broker.clone(), other(&live), other(&live)];
    let handles: Vec<_> = registries
        .iter()
        .zip(brokers.iter())
        .enumerate()
        .map(|(w, (reg, b))| {
            let mut worker = Worker::new(b).threads(2);
            for k in reg.iter() {
                let seen = seen.clone();
                worker = worker.on(&t, k, move |d| {
                    seen.lock()
                        .unwrap()
                        .push((w, d.kind().unwrap().to_string(), d.id()));
                    Ok::<(), String>(())
                });
            }
            worker.start().unwrap()
        })
        .collect();
    assert!(
        common::wait_for(Duration::from_secs(30), || seen.lock().unwrap().len() >= 30),
        "the jobs ran: {:?}",
        seen.lock().unwrap().len()
    );
    let mut total = 0;
    for h in &handles {
        total += h.shutdown(Duration::from_secs(5)).unwrap().total().acked;
    }
    let seen = seen.lock().unwrap().clone();
    for (w, k, _) in &seen {
        assert!(
            registries[*w].contains(&k.as_str()),
            "worker {w} ran a kind it has no handler for: {k}"
        );
    }
    let ran: BTreeSet<i64> = seen.iter().map(|(_, _, id)| *id).collect();
    assert_eq!(ran.len(), seen.len(), "a job ran twice");
    assert_eq!(ran, ids, "every job ran");
    assert_eq!(total, 30);
    let by_kind = live.broker.kind_stats(&t).unwrap();
    assert_eq!(
        by_kind
            .iter()
            .map(|(k, s)| (k.clone(), s.ready))
            .collect::<Vec<_>>(),
        [(Some("nobody".to_string()), 1)],
        "the orphan stays ready (job {orphan})"
    );
}
per_db_form!(workers_take_only_their_kinds);

/// One worker over two tables: a backlog in one does not starve the other (the threads take
/// from the tables in turn), and shutdown loses nothing and runs nothing twice: every job ran
/// once or is still claimable. Fails (`starved`) if the threads drained one table first.
fn one_worker_over_two_tables(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let big = queued(&live, form, true);
    let small = queued(&live, form, true);
    let big_ids: Vec<i64> = (0..200)
        .map(|i| publish(&live, &big, "default", Some("x"), &format!("b{i}")))
        .collect();
    let small_ids: Vec<i64> = (0..5)
        .map(|i| publish(&live, &small, "default", Some("y"), &format!("s{i}")))
        .collect();
    let order: Arc<Mutex<Vec<(String, i64)>>> = Arc::default();
    let (o1, o2) = (order.clone(), order.clone());
    let worker = Worker::new(&live.broker)
        .on(&big, "x", move |d| {
            o1.lock().unwrap().push(("big".into(), d.id()));
            std::thread::sleep(Duration::from_millis(5));
            Ok::<(), String>(())
        })
        .on(&small, "y", move |d| {
            o2.lock().unwrap().push(("small".into(), d.id()));
            Ok::<(), String>(())
        })
        .threads(2)
        .start()
        .unwrap();
    assert!(common::wait_for(Duration::from_secs(30), || {
        order
            .lock()
            .unwrap()
            .iter()
            .filter(|(t, _)| t == "small")
            .count()
            == 5
    }));
    let ran = worker.shutdown(Duration::from_secs(10)).unwrap();
    let order = order.lock().unwrap().clone();
    let last_small = order.iter().rposition(|(t, _)| t == "small").unwrap();
    assert!(
        last_small < 60,
        "starved: the small table's last job ran after {last_small} jobs"
    );
    let runs: Vec<(String, i64)> = order.clone();
    let once: BTreeSet<(String, i64)> = runs.iter().cloned().collect();
    assert_eq!(once.len(), runs.len(), "a job ran twice");
    assert_eq!(
        ran.get(big.name(), "x").map_or(0, |r| r.acked)
            + ran.get(small.name(), "y").map_or(0, |r| r.acked),
        runs.len()
    );
    // What did not run is still there, claimable at once (the rows claimed ahead went back).
    let stats = live.broker.stats(&big).unwrap();
    let done_big = order.iter().filter(|(t, _)| t == "big").count() as u64;
    assert_eq!(stats.ready, big_ids.len() as u64 - done_big, "{stats:?}");
    assert_eq!(live.broker.stats(&small).unwrap().ready, 0);
    let _ = small_ids;
}
per_db_form!(one_worker_over_two_tables);

/// `queue_threads` caps one queue's rows in work in this worker, and bad registrations are
/// refused before anything runs. Fails (`over the cap`) if the capped queue's rows were taken
/// by the table's other subscription too.
fn a_capped_queue_runs_at_most_its_threads(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let t = queued(&live, form, true);
    for i in 0..12 {
        publish(&live, &t, "capped", Some("x"), &format!("c{i}"));
        publish(&live, &t, "free", Some("x"), &format!("f{i}"));
    }
    let now = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let most = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (n, m) = (now.clone(), most.clone());
    let worker = Worker::new(&live.broker)
        .on(&t, "x", move |d| {
            if d.queue() == "capped" {
                let c = n.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                m.fetch_max(c, std::sync::atomic::Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(30));
                n.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
            }
            Ok::<(), String>(())
        })
        .queues(&t, ["capped", "free"])
        .queue_threads(&t, "capped", 1)
        .threads(4)
        .start()
        .unwrap();
    assert!(common::wait_for(Duration::from_secs(30), || {
        live.broker
            .stats(&t)
            .map(|s| s.ready + s.in_flight.unwrap_or(0))
            .unwrap_or(1)
            == 0
    }));
    let ran = worker.shutdown(Duration::from_secs(10)).unwrap();
    assert_eq!(ran.total().acked, 24);
    assert_eq!(
        most.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "over the cap"
    );
    // Refusals: a cap on a queue not listed, a kind twice, no handler.
    let refused = |w: Worker| matches!(w.start(), Err(BrokerError::InvalidOption { .. }));
    assert!(refused(
        Worker::new(&live.broker)
            .on(&t, "x", |_| Ok::<(), String>(()))
            .queue_threads(&t, "capped", 1)
    ));
    assert!(refused(
        Worker::new(&live.broker)
            .on(&t, "x", |_| Ok::<(), String>(()))
            .on(&t, "x", |_| Ok::<(), String>(()))
    ));
    assert!(refused(Worker::new(&live.broker)));
    assert!(refused(Worker::new(&live.broker).on(
        &t,
        "bad kind",
        |_| Ok::<(), String>(())
    )));
}
per_db_form!(a_capped_queue_runs_at_most_its_threads);

/// A worker with few threads claims few rows ahead (50 per thread, lease form): the rest stay
/// ready for another process's worker. A worker of one thread over one table, its handler held
/// on its first job, leaves at least 150 of 200 rows to a second broker's subscription. Fails
/// with the lane's claims sized for many threads (a review measured 400 rows held by a worker
/// of one thread, and a second worker running none).
fn a_worker_of_few_threads_leaves_rows_to_others(db: Db) {
    let Some(live) = common::live(db) else { return };
    let t = live.create(
        common::describe(&common::unique("wa"), Form::Lease, Duration::from_secs(30)).kinds(),
    );
    let batch: Vec<Message> = (0..200)
        .map(|i| {
            Message::new(b"x".to_vec())
                .set("k", format!("r{i}"))
                .kind("a")
        })
        .collect();
    live.broker.publish_batch(&t, batch).unwrap();
    let (started_tx, started) = crossbeam_channel::bounded::<()>(1);
    let (release_tx, release) = crossbeam_channel::bounded::<()>(0);
    let worker = Worker::new(&live.broker)
        .on(&t, "a", move |_d| {
            let _ = started_tx.try_send(());
            let _ = release.recv_timeout(Duration::from_secs(20));
            Ok::<(), String>(())
        })
        .threads(1)
        .start()
        .unwrap();
    started.recv_timeout(Duration::from_secs(10)).unwrap();
    // The lane's claim workers fill what they may (50, or every row without the cap).
    let locked = || live.rows_where(&t, "locked_until IS NOT NULL");
    assert!(common::wait_for(Duration::from_secs(10), || locked() >= 50));
    let held = locked();
    assert!(held <= 50, "a worker of one thread holds {held} rows");
    let second = other(&live);
    let sub = second.subscription(&t).batch_size(50).start().unwrap();
    let mut ran = 0;
    // Until 150 ran, or no row came for 5 s (a slow machine's gaps are not the end).
    while ran < 150 {
        let Ok(d) = sub.next_delivery_timeout(Duration::from_secs(5)) else {
            break;
        };
        d.ack().unwrap();
        ran += 1;
    }
    assert!(ran >= 150, "the second service ran {ran} of 200");
    sub.close();
    drop(release_tx);
    worker.shutdown(Duration::from_secs(10)).unwrap();
}
per_db!(a_worker_of_few_threads_leaves_rows_to_others);

/// A worker's threads take from its tables in turns: all of them from one table until its turn
/// of 16 rows per thread is over or it has no row queued, then from the next. Two tables of 96
/// rows, two threads (turns of 32): no table runs more than a turn (and the two threads' race
/// at its end) before the other's rows come (`a run of`); lease tables, whose lanes keep rows
/// queued, switch a few times only (`switches`: each thread taking the next table's row in
/// turn switched at nearly every row, and each ack was its own commit on the servers).
fn a_worker_takes_its_tables_in_turns(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let tables = [queued(&live, form, true), queued(&live, form, true)];
    for (n, t) in tables.iter().enumerate() {
        let batch: Vec<Message> = (0..96)
            .map(|i| {
                Message::new(b"x".to_vec())
                    .set("k", format!("t{n}r{i}"))
                    .kind("a")
            })
            .collect();
        live.broker.publish_batch(t, batch).unwrap();
    }
    let order: Arc<Mutex<Vec<usize>>> = Arc::default();
    // Closed (its sender dropped) once both tables' rows are queued: a table whose first claim
    // came late on a loaded machine would not have had rows to take its turn with.
    let (open, gate) = crossbeam_channel::bounded::<()>(0);
    let mut w = Worker::new(&live.broker).threads(2);
    for (n, t) in tables.iter().enumerate() {
        let (order, gate) = (order.clone(), gate.clone());
        w = w.on(t, "a", move |_d| {
            let _ = gate.recv_timeout(Duration::from_secs(30));
            order.lock().unwrap().push(n);
            std::thread::sleep(Duration::from_millis(1));
            Ok::<(), String>(())
        });
    }
    let worker = w.start().unwrap();
    if form == Form::Lease {
        // The lanes claim ahead up to 100 rows each: every row of both tables.
        assert!(common::wait_for(Duration::from_secs(30), || {
            tables
                .iter()
                .all(|t| live.rows_where(t, "locked_until IS NOT NULL") == 96)
        }));
    }
    drop(open);
    assert!(common::wait_for(Duration::from_secs(60), || {
        order.lock().unwrap().len() == 192
    }));
    worker.shutdown(Duration::from_secs(10)).unwrap();
    let order = order.lock().unwrap().clone();
    // Runs of one table while the other still had rows.
    let last_of = |n: usize| order.iter().rposition(|&t| t == n).unwrap();
    let both_until = last_of(0).min(last_of(1));
    let mut longest = 0;
    let mut run = 0;
    let mut switches = 0;
    for (i, t) in order[..=both_until].iter().enumerate() {
        if i > 0 && order[i - 1] != *t {
            switches += 1;
            run = 0;
        }
        run += 1;
        longest = longest.max(run);
    }
    assert!(
        longest <= 36,
        "a run of {longest} rows of one table: {order:?}"
    );
    if form == Form::Lease {
        assert!(switches <= 16, "{switches} switches: {order:?}");
    }
}
per_db_form!(a_worker_takes_its_tables_in_turns);

/// A handler's thread that found nothing, then woken by commits to another table (on SQLite
/// every commit to the file wakes every table), asks whether a row may be claimable and waits
/// on; a row published then is delivered. Fails (`the handler's thread hung`) if that path
/// deadlocks (it took its own lock twice once), (`delivered`) if the row is not claimed.
fn a_handler_thread_waits_through_other_tables_commits(db: Db) {
    let Some(live) = common::live(db) else { return };
    let idle = live.table(Form::Lease, Duration::from_secs(30));
    let busy = live.table(Form::Lease, Duration::from_secs(30));
    let sub = Arc::new(live.broker.subscription(&idle).start().unwrap());
    let (done_tx, done) = crossbeam_channel::bounded::<bool>(1);
    let polling = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let waiter = {
        let (sub, polling) = (sub.clone(), polling.clone());
        std::thread::spawn(move || {
            // Nothing there until the other table's commits end: each call claims (or asks)
            // on this thread, then waits.
            let stopped = std::time::Instant::now() + Duration::from_secs(30);
            while std::time::Instant::now() < stopped {
                if let Ok(d) = sub.next_delivery_timeout(Duration::from_millis(30)) {
                    // The flag is cleared before the row is published.
                    let early = polling.load(std::sync::atomic::Ordering::Acquire);
                    assert!(!early, "a delivery before anything was published");
                    let _ = done_tx.send(d.ack().is_ok());
                    return;
                }
            }
            let _ = done_tx.send(false);
        })
    };
    for i in 0..20 {
        live.broker
            .publish(&busy, common::msg("x", &format!("b{i}")))
            .unwrap();
        std::thread::sleep(Duration::from_millis(20));
    }
    polling.store(false, std::sync::atomic::Ordering::Release);
    live.broker.publish(&idle, common::msg("y", "i0")).unwrap();
    let delivered = done
        .recv_timeout(Duration::from_secs(15))
        .expect("the handler's thread hung");
    assert!(delivered, "delivered");
    waiter.join().unwrap();
    sub.close();
}
per_db!(a_handler_thread_waits_through_other_tables_commits);
