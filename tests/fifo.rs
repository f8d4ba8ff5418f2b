//! FIFO groups: a claim takes only the head of a group and nothing from a group while one of
//! its rows is in work, across brokers; one subscription works all groups in parallel.
//!
//! Every handler records when it started and ended each delivery (one clock, this process);
//! per group, sorted by start, the rows must come in publish order (a retried row may repeat)
//! and no delivery may start before the previous one of its group ended.

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::Db;
use sqlbroker::{Broker, BrokerError, Form, Message, NextError, Table};

const LEASE: Duration = Duration::from_secs(30);

/// `orders` grouped by `customer`, with the row's place in its group in `seq`.
fn fifo_table(live: &common::Live, form: Form) -> Table {
    live.create(describe(&common::unique("t"), form, LEASE))
}

fn describe(name: &str, form: Form, lease: Duration) -> Table {
    let t = Table::new(name).group("customer").int_column("seq").fifo();
    match form {
        Form::Lease => t.lease(lease),
        _ => t,
    }
}

fn seq(d: &sqlbroker::Delivery) -> i64 {
    d.get("seq").and_then(|v| v.as_i64()).unwrap_or(-1)
}

fn text(d: &sqlbroker::Delivery, column: &str) -> String {
    d.get(column)
        .and_then(|v| v.as_str())
        .unwrap_or_default()
        .to_string()
}

fn publish_groups(broker: &Broker, t: &Table, groups: usize, rows: usize) {
    // Round-robin over the groups, so each group's rows are spread over the table.
    let mut batch = Vec::new();
    for seq in 0..rows {
        for g in 0..groups {
            batch.push(
                Message::new(format!("{g}/{seq}").into_bytes())
                    .set("customer", format!("c{g}"))
                    .set("seq", seq as i64),
            );
        }
    }
    broker.publish_batch(t, batch).unwrap();
}

/// One handled delivery.
#[derive(Debug, Clone)]
struct Run {
    group: String,
    seq: i64,
    id: i64,
    start: Instant,
    end: Instant,
}

/// Per group, in start order: seqs never go back, and no run starts before the previous ended.
fn check_order(runs: &[Run]) -> (usize, usize) {
    let mut by_group: BTreeMap<&str, Vec<&Run>> = BTreeMap::new();
    for r in runs {
        by_group.entry(&r.group).or_default().push(r);
    }
    let (mut order, mut overlap) = (0, 0);
    for (g, mut rs) in by_group {
        rs.sort_by_key(|r| r.start);
        for w in rs.windows(2) {
            if w[1].seq < w[0].seq {
                eprintln!("group {g}: seq {} after {}", w[1].seq, w[0].seq);
                order += 1;
            }
            if w[1].start < w[0].end {
                eprintln!(
                    "group {g}: row {} started before row {} ended",
                    w[1].id, w[0].id
                );
                overlap += 1;
            }
        }
    }
    (order, overlap)
}

/// What a handler does with a delivery of (group, seq, attempt).
type Policy = Arc<dyn Fn(&str, i64, u32) -> Outcome + Send + Sync>;

#[derive(Debug, Clone, Copy, PartialEq)]
enum Outcome {
    Ack,
    Retry,
    Dead,
}

/// `brokers` brokers x `workers` handler threads (each subscription `workers` claim workers)
/// burn the table down; returns every run, and how long it took.
fn burn_down(
    live: &common::Live,
    t: &Table,
    brokers: usize,
    workers: usize,
    expected_acks: usize,
    work: Duration,
    policy: Policy,
) -> (Vec<Run>, Duration) {
    let runs = Arc::new(Mutex::new(Vec::new()));
    let acked = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let started = Instant::now();
    let deadline = started + Duration::from_secs(60);
    let mut handles = Vec::new();
    for _ in 0..brokers {
        let broker = live.connect();
        let sub = Arc::new(
            broker
                .subscription(t)
                .workers(workers)
                .poll_interval(Duration::from_millis(20))
                .start()
                .unwrap(),
        );
        for _ in 0..workers {
            let (sub, runs, acked, policy) =
                (sub.clone(), runs.clone(), acked.clone(), policy.clone());
            handles.push(std::thread::spawn(move || {
                while acked.load(std::sync::atomic::Ordering::SeqCst) < expected_acks
                    && Instant::now() < deadline
                {
                    let Ok(d) = sub.next_delivery_timeout(Duration::from_millis(50)) else {
                        continue;
                    };
                    let start = Instant::now();
                    let group = text(&d, "customer");
                    let seq = d.get("seq").and_then(|v| v.as_i64()).unwrap();
                    let id = d.id();
                    let attempt = d.attempt();
                    std::thread::sleep(work);
                    let outcome = policy(&group, seq, attempt);
                    let end = Instant::now();
                    let settled = match outcome {
                        Outcome::Ack => d.ack(),
                        Outcome::Retry => d.retry_after(Duration::from_secs(1)),
                        Outcome::Dead => d.dead_letter("test"),
                    };
                    settled.unwrap();
                    runs.lock().unwrap().push(Run {
                        group,
                        seq,
                        id,
                        start,
                        end,
                    });
                    if outcome == Outcome::Ack {
                        acked.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    }
                }
            }));
        }
        // The broker lives as long as its subscription (which keeps what it needs).
        drop(broker);
    }
    for h in handles {
        h.join().unwrap();
    }
    let took = started.elapsed();
    let runs = runs.lock().unwrap().clone();
    (runs, took)
}

/// 3 brokers x 4 workers over 20 groups x 15 rows: every row once, in order, no overlaps; a
/// row retried mid-group keeps its group waiting; a dead-lettered head frees its group.
fn fifo_order_across_brokers(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let t = fifo_table(&live, form);
    let (groups, rows) = (20, 15);
    publish_groups(&live.broker, &t, groups, rows);
    // c0: seq 5 fails once (retried after a second); c1: its head is dead-lettered.
    let policy: Policy = Arc::new(|g, seq, attempt| match (g, seq) {
        ("c0", 5) if attempt == 1 => Outcome::Retry,
        ("c1", 0) => Outcome::Dead,
        _ => Outcome::Ack,
    });
    let expected = groups * rows - 1;
    let (runs, took) = burn_down(&live, &t, 3, 4, expected, Duration::from_millis(2), policy);
    assert_eq!(live.rows(&t), 1, "only the dead-lettered head is left");
    assert_eq!(live.broker.dead_letters(&t, 10).unwrap().len(), 1);
    let mut ids: Vec<i64> = runs.iter().map(|r| r.id).collect();
    ids.sort_unstable();
    let before = ids.len();
    ids.dedup();
    assert_eq!(
        before - ids.len(),
        1,
        "exactly one row (the retried one) ran twice"
    );
    assert_eq!(ids.len(), groups * rows);
    let (order, overlap) = check_order(&runs);
    assert_eq!((order, overlap), (0, 0), "order violations, overlaps");
    // The retried row held its group: c0's seq 6 started after seq 5's second run.
    let c0: Vec<&Run> = runs.iter().filter(|r| r.group == "c0").collect();
    let retried_last = c0
        .iter()
        .filter(|r| r.seq == 5)
        .map(|r| r.start)
        .max()
        .unwrap();
    let six = c0.iter().find(|r| r.seq == 6).unwrap();
    assert!(six.start > retried_last);
    eprintln!("{db:?} {}: {} runs in {took:?}", form.name(), runs.len());
}

/// 8 handlers over 8 groups of 5 rows, each run 50 ms: the groups run in parallel. Measured as
/// the most groups in work at one moment (serial groups would never pass 1), which a loaded
/// machine bends less than the burn-down's time (about one group's 250 ms, not 2 s serial).
fn fifo_groups_run_in_parallel(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let t = fifo_table(&live, form);
    publish_groups(&live.broker, &t, 8, 5);
    let policy: Policy = Arc::new(|_, _, _| Outcome::Ack);
    let (runs, took) = burn_down(&live, &t, 1, 8, 40, Duration::from_millis(50), policy);
    assert_eq!(runs.len(), 40);
    assert_eq!(check_order(&runs), (0, 0));
    let most = runs
        .iter()
        .map(|r| {
            runs.iter()
                .filter(|o| o.start <= r.start && r.start < o.end)
                .count()
        })
        .max()
        .unwrap_or(0);
    assert!(
        most >= 4,
        "at most {most} of 8 groups were in work at once (8 groups took {took:?})"
    );
    eprintln!(
        "{db:?} {}: 8 groups x 5 rows x 50 ms in {took:?}, up to {most} at once",
        form.name()
    );
}

/// A head that is not yet due (retried with a delay) blocks its group; another group's rows
/// run meanwhile.
fn fifo_head_not_due_blocks_its_group(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let t = fifo_table(&live, form);
    publish_groups(&live.broker, &t, 1, 2);
    let sub = live.broker.subscription(&t).workers(2).start().unwrap();
    let head = common::next(&sub, Duration::from_secs(10));
    assert_eq!(head.get("seq").and_then(|v| v.as_i64()), Some(0));
    // Nothing else of the group while the head is in work.
    assert_eq!(
        sub.next_delivery_timeout(Duration::from_millis(700)).err(),
        Some(NextError::Timeout),
        "the second row of the group was delivered while its head was in work"
    );
    head.retry_after(Duration::from_secs(2)).unwrap();
    live.broker
        .publish(
            &t,
            Message::new(b"other".to_vec())
                .set("customer", "other")
                .set("seq", 0i64),
        )
        .unwrap();
    let other = common::next(&sub, Duration::from_secs(5));
    assert_eq!(text(&other, "customer"), "other", "the blocked group ran");
    other.ack().unwrap();
    // The retried head comes back first, with its next attempt, then the second row.
    let again = common::next(&sub, Duration::from_secs(10));
    assert_eq!(
        (again.get("seq").and_then(|v| v.as_i64()), again.attempt()),
        (Some(0), 2)
    );
    again.ack().unwrap();
    let second = common::next(&sub, Duration::from_secs(10));
    assert_eq!(second.get("seq").and_then(|v| v.as_i64()), Some(1));
    second.ack().unwrap();
    sub.shutdown(Duration::from_secs(5)).unwrap();
}

/// Carries `<form>\t<table>\t<url>` to the crash child.
const CHILD_ENV: &str = "SQLBROKER_FIFO_CRASH_CHILD";
const CRASH_LEASE: Duration = Duration::from_secs(2);

/// The child of `fifo_crash_keeps_order`: does nothing unless `SQLBROKER_FIFO_CRASH_CHILD` is
/// set; then claims one delivery, prints `CLAIMED <id> <seq>` and holds it until killed.
#[test]
fn fifo_crash_child_entry() {
    use std::io::Write;
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let mut parts = spec.splitn(3, '\t');
    let (form, name, url) = (
        parts.next().unwrap(),
        parts.next().unwrap(),
        parts.next().unwrap(),
    );
    let form = if form == "lease" {
        Form::Lease
    } else {
        Form::RowLock
    };
    let broker = Broker::connect(url).expect("child: connect");
    let sub = broker
        .subscription(&describe(name, form, CRASH_LEASE))
        .start()
        .expect("child: start");
    let d = sub
        .next_delivery_timeout(Duration::from_secs(30))
        .expect("child: no delivery");
    let mut out = std::io::stdout();
    writeln!(out, "\nCLAIMED {} {}", d.id(), seq(&d)).unwrap();
    out.flush().unwrap();
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
    std::process::exit(3);
}

/// A crash (SIGKILL of a real process) of the holder of a group's head keeps the order: while
/// it lives nothing else of the group runs; after it, the head comes back first.
fn fifo_crash_keeps_order(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let name = common::unique("t");
    let t = live.create(describe(&name, form, CRASH_LEASE));
    publish_groups(&live.broker, &t, 1, 3);
    let form_name = if form == Form::Lease {
        "lease"
    } else {
        "row_lock"
    };
    let mut child = common::spawn_child(
        "fifo_crash_child_entry",
        CHILD_ENV,
        &format!("{form_name}\t{name}\t{}", live.url),
    );
    let claimed = child
        .line_after("CLAIMED ", Duration::from_secs(60))
        .expect("the child did not claim");
    assert!(
        claimed.ends_with(" 0"),
        "the child's first delivery was not the head: {claimed}"
    );
    let sub = live.broker.subscription(&t).start().unwrap();
    // The child lives and holds the head: nothing of the group here.
    assert_eq!(
        sub.next_delivery_timeout(Duration::from_millis(800)).err(),
        Some(NextError::Timeout),
        "a row of the group ran while the child held its head"
    );
    assert!(child.alive(), "the child died early");
    child.kill();
    let mut seqs = Vec::new();
    for _ in 0..3 {
        let d = common::next(&sub, Duration::from_secs(15));
        seqs.push(seq(&d));
        d.ack().unwrap();
    }
    assert_eq!(seqs, [0, 1, 2], "the order after the crash");
    sub.shutdown(Duration::from_secs(5)).unwrap();
}

per_db_claim_form!(fifo_order_across_brokers);
per_db_claim_form!(fifo_groups_run_in_parallel);
per_db_claim_form!(fifo_head_not_due_blocks_its_group);
per_db_claim_form!(fifo_crash_keeps_order);

/// FIFO in the advisory lock form is refused, with the reason.
#[test]
fn fifo_advisory_is_unsupported() {
    let broker = Broker::connect("sqlite::memory:").unwrap();
    let t = Table::new("jobs")
        .group("customer")
        .fifo()
        .advisory_lock("{customer}");
    broker.create_table(&t).unwrap();
    match broker.subscription(&t).start() {
        Err(BrokerError::Unsupported { what, .. }) => assert!(what.contains("advisory")),
        other => panic!("{other:?}"),
    }
}
