//! FIFO groups: a claim takes only the head of a group and nothing from a group while one of
//! its rows is in work, across brokers; one subscription works all groups in parallel. Every
//! form the database has: row lock, lease, and the advisory lock form with a key template that
//! reads only the group column (the key is the group's lock) and with one that reads another
//! column too (a per-group key is held beside the row's).
//!
//! A row is timed from its **claim**: an [`Events`] hook records the rows each claim took, as
//! the claim returns and before any handler sees them; each handler records when it asked to
//! settle. Per group, sorted by claim, the rows must come in publish order (a retried row may
//! repeat) and no row may be claimed before the previous one of its group began to settle. A
//! claim that took two rows of one group at once fails this even when one handler runs them
//! one after the other. A group's next row follows its head's ack at once, not at the next poll.

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::Db;
use sqlbroker::{Broker, ClaimedRows, Events, Message, NextError, Table};

const LEASE: Duration = Duration::from_secs(30);

/// How a FIFO table holds its rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    RowLock,
    Lease,
    /// Advisory lock on `"<table>-{customer}"`: the key is the group's lock.
    AdvisoryByGroup,
    /// Advisory lock on `"<table>-{customer}-{seq}"`: a key per row, and a group key beside it.
    AdvisoryByRow,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::RowLock => "row_lock",
            Kind::Lease => "lease",
            Kind::AdvisoryByGroup => "advisory_by_group",
            Kind::AdvisoryByRow => "advisory_by_row",
        }
    }

    fn from_name(name: &str) -> Kind {
        [
            Kind::RowLock,
            Kind::Lease,
            Kind::AdvisoryByGroup,
            Kind::AdvisoryByRow,
        ]
        .into_iter()
        .find(|k| k.name() == name)
        .unwrap()
    }
}

/// Runs a test body for each database x [`Kind`] the database has, named `<name>::<db>_<kind>`.
/// With `one_process_sqlite_keys`, without SQLite's advisory kinds: for a test of two
/// processes, since SQLite's keys live in one process (documented: one process per file).
macro_rules! per_db_fifo {
    ($body:ident) => {
        per_db_fifo!(@ $body, sqlite_advisory_by_group, sqlite_advisory_by_row);
    };
    ($body:ident, one_process_sqlite_keys) => {
        per_db_fifo!(@ $body,);
    };
    (@ $body:ident, $($sqlite_advisory:ident),*) => {
        mod $body {
            use super::*;
            #[test]
            fn sqlite_lease() {
                super::$body(Db::Sqlite, Kind::Lease)
            }
            $(
                #[test]
                fn $sqlite_advisory() {
                    let kind = stringify!($sqlite_advisory).trim_start_matches("sqlite_");
                    super::$body(Db::Sqlite, Kind::from_name(kind))
                }
            )*
            #[test]
            fn postgres_row_lock() {
                super::$body(Db::Postgres, Kind::RowLock)
            }
            #[test]
            fn postgres_lease() {
                super::$body(Db::Postgres, Kind::Lease)
            }
            #[test]
            fn postgres_advisory_by_group() {
                super::$body(Db::Postgres, Kind::AdvisoryByGroup)
            }
            #[test]
            fn postgres_advisory_by_row() {
                super::$body(Db::Postgres, Kind::AdvisoryByRow)
            }
            #[cfg(feature = "mysql")]
            #[test]
            fn mysql_row_lock() {
                super::$body(Db::Mysql, Kind::RowLock)
            }
            #[cfg(feature = "mysql")]
            #[test]
            fn mysql_lease() {
                super::$body(Db::Mysql, Kind::Lease)
            }
            #[cfg(feature = "mysql")]
            #[test]
            fn mysql_advisory_by_group() {
                super::$body(Db::Mysql, Kind::AdvisoryByGroup)
            }
            #[cfg(feature = "mysql")]
            #[test]
            fn mysql_advisory_by_row() {
                super::$body(Db::Mysql, Kind::AdvisoryByRow)
            }
        }
    };
}

/// `orders` grouped by `customer`, with the row's place in its group in `seq`.
fn fifo_table(live: &common::Live, kind: Kind) -> Table {
    live.create(describe(&common::unique("t"), kind, LEASE))
}

/// Advisory keys carry the table's name: keys belong to the database, and parallel tests must
/// not wait for each other's.
fn describe(name: &str, kind: Kind, lease: Duration) -> Table {
    let t = Table::new(name).group("customer").int_column("seq").fifo();
    match kind {
        Kind::RowLock => t,
        Kind::Lease => t.lease(lease),
        Kind::AdvisoryByGroup => t.advisory_lock(format!("{name}-{{customer}}")),
        Kind::AdvisoryByRow => t.advisory_lock(format!("{name}-{{customer}}-{{seq}}")),
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
    /// When the claim that took this attempt returned ([`Claims`]).
    claimed: Instant,
    /// When the handler took it.
    start: Instant,
    /// When the handler asked to settle it: the next row of its group may be claimed from then.
    end: Instant,
}

/// The rows each claim took, and when: the claim hook runs before the rows reach a handler.
#[derive(Default)]
struct Claims(Mutex<Vec<(Instant, Vec<i64>)>>);

impl Events for Claims {
    fn claimed(&self, e: &ClaimedRows<'_>) {
        self.0
            .lock()
            .unwrap()
            .push((Instant::now(), e.ids.to_vec()));
    }
}

impl Claims {
    /// The claim of the attempt of row `id` a handler took at `start`: the last claim of the
    /// row up to then.
    fn of(&self, id: i64, start: Instant) -> Instant {
        let claims = self.0.lock().unwrap();
        claims
            .iter()
            .filter(|(at, ids)| *at <= start && ids.contains(&id))
            .map(|(at, _)| *at)
            .max()
            .unwrap_or_else(|| panic!("row {id} was handled with no claim hook before it"))
    }
}

/// Per group, in claim order: seqs never go back, and no row is claimed before the previous
/// one began to settle. Returns (order violations, overlaps).
fn check_order(runs: &[Run]) -> (usize, usize) {
    let mut by_group: BTreeMap<&str, Vec<&Run>> = BTreeMap::new();
    for r in runs {
        by_group.entry(&r.group).or_default().push(r);
    }
    let (mut order, mut overlap) = (0, 0);
    for (g, mut rs) in by_group {
        rs.sort_by_key(|r| (r.claimed, r.start));
        for w in rs.windows(2) {
            if w[1].seq < w[0].seq {
                eprintln!("group {g}: seq {} after {}", w[1].seq, w[0].seq);
                order += 1;
            }
            if w[1].claimed < w[0].end {
                eprintln!(
                    "group {g}: row {} was claimed before row {} settled",
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

/// How many brokers, handler threads and rows per claim burn a table down.
#[derive(Clone, Copy)]
struct Crew {
    brokers: usize,
    /// Handler threads per broker, and claim workers per subscription.
    workers: usize,
    batch: usize,
}

/// `crew` burns the table down; returns every run, and how long it took.
fn burn_down(
    live: &common::Live,
    t: &Table,
    crew: Crew,
    expected_acks: usize,
    work: Duration,
    policy: Policy,
) -> (Vec<Run>, Duration) {
    let runs = Arc::new(Mutex::new(Vec::new()));
    let claims = Arc::new(Claims::default());
    let acked = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let started = Instant::now();
    let deadline = started + Duration::from_secs(60);
    let mut handles = Vec::new();
    for _ in 0..crew.brokers {
        let broker = live.connect();
        let sub = Arc::new(
            broker
                .subscription(t)
                .workers(crew.workers)
                .batch_size(crew.batch)
                .poll_interval(Duration::from_millis(20))
                .events(claims.clone())
                .start()
                .unwrap(),
        );
        let workers = crew.workers;
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
                        claimed: start,
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
    let mut runs = runs.lock().unwrap().clone();
    for r in &mut runs {
        r.claimed = claims.of(r.id, r.start);
    }
    (runs, took)
}

/// 3 brokers x 4 workers over 20 groups x 15 rows: every row once, in order, no overlaps; a
/// row retried mid-group keeps its group waiting; a dead-lettered head frees its group.
fn fifo_order_across_brokers(db: Db, kind: Kind) {
    let Some(live) = common::live(db) else { return };
    let t = fifo_table(&live, kind);
    let (groups, rows) = (20, 15);
    publish_groups(&live.broker, &t, groups, rows);
    // c0: seq 5 fails once (retried after a second); c1: its head is dead-lettered.
    let policy: Policy = Arc::new(|g, seq, attempt| match (g, seq) {
        ("c0", 5) if attempt == 1 => Outcome::Retry,
        ("c1", 0) => Outcome::Dead,
        _ => Outcome::Ack,
    });
    let expected = groups * rows - 1;
    let crew = Crew {
        brokers: 3,
        workers: 4,
        batch: 10,
    };
    let (runs, took) = burn_down(&live, &t, crew, expected, Duration::from_millis(2), policy);
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
    eprintln!("{db:?} {}: {} runs in {took:?}", kind.name(), runs.len());
}

/// 8 handlers over 8 groups of 5 rows, each run 50 ms: the groups run in parallel. Measured as
/// the most groups in work at one moment (serial groups would never pass 1), which a loaded
/// machine bends less than the burn-down's time (about one group's 250 ms, not 2 s serial).
fn fifo_groups_run_in_parallel(db: Db, kind: Kind) {
    let Some(live) = common::live(db) else { return };
    let t = fifo_table(&live, kind);
    publish_groups(&live.broker, &t, 8, 5);
    let policy: Policy = Arc::new(|_, _, _| Outcome::Ack);
    let crew = Crew {
        brokers: 1,
        workers: 8,
        batch: 10,
    };
    let (runs, took) = burn_down(&live, &t, crew, 40, Duration::from_millis(50), policy);
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
        kind.name()
    );
}

/// A head that is not yet due (retried with a delay) blocks its group; another group's rows
/// run meanwhile.
fn fifo_head_not_due_blocks_its_group(db: Db, kind: Kind) {
    let Some(live) = common::live(db) else { return };
    let t = fifo_table(&live, kind);
    publish_groups(&live.broker, &t, 1, 2);
    let sub = live.broker.subscription(&t).workers(2).start().unwrap();
    let head = common::next(&sub, Duration::from_secs(10));
    assert_eq!(head.get("seq").and_then(|v| v.as_i64()), Some(0));
    // Nothing else of the group while the head is in work, on this broker or another.
    let other = live.connect();
    let elsewhere = other.subscription(&t).workers(2).start().unwrap();
    assert_eq!(
        sub.next_delivery_timeout(Duration::from_millis(700)).err(),
        Some(NextError::Timeout),
        "the second row of the group was delivered while its head was in work"
    );
    assert_eq!(
        elsewhere
            .next_delivery_timeout(Duration::from_millis(300))
            .err(),
        Some(NextError::Timeout),
        "another broker took the second row of the group while its head was in work"
    );
    elsewhere.shutdown(Duration::from_secs(5)).unwrap();
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

/// One handler thread, claims of up to 8 rows, 6 groups x 4 rows: the handler runs every row
/// one after the other, so only the claim-time check sees a claim that took two rows of one
/// group at once (it fails `check_order`'s overlap count when the claim's head condition is
/// dropped).
fn fifo_one_handler_never_holds_two_rows_of_a_group(db: Db, kind: Kind) {
    let Some(live) = common::live(db) else { return };
    let t = fifo_table(&live, kind);
    let (groups, rows) = (6, 4);
    publish_groups(&live.broker, &t, groups, rows);
    let crew = Crew {
        brokers: 1,
        workers: 1,
        batch: 8,
    };
    let policy: Policy = Arc::new(|_, _, _| Outcome::Ack);
    let (runs, _) = burn_down(&live, &t, crew, groups * rows, Duration::ZERO, policy);
    assert_eq!(runs.len(), groups * rows);
    assert_eq!(check_order(&runs), (0, 0), "order violations, overlaps");
    assert_eq!(live.rows(&t), 0);
}

/// A row that becomes its group's head while a later row of the group is in work (as a publish
/// committed out of id order does) waits for that row to settle, then runs before the rest.
/// Made here by moving a parked row (smaller id, not due) into the group and making it due.
fn fifo_row_committed_behind_one_in_work_waits(db: Db, kind: Kind) {
    let Some(live) = common::live(db) else { return };
    let t = fifo_table(&live, kind);
    let late = live
        .broker
        .publish(
            &t,
            Message::new(b"late".to_vec())
                .set("customer", "parked")
                .set("seq", -1i64)
                .deliver_after(Duration::from_secs(7200)),
        )
        .unwrap();
    publish_groups(&live.broker, &t, 1, 2);
    let sub = live.broker.subscription(&t).workers(2).start().unwrap();
    let head = common::next(&sub, Duration::from_secs(10));
    assert_eq!(seq(&head), 0);
    let back = match db {
        Db::Postgres => "run_at - interval '3 hours'",
        Db::Mysql => "run_at - INTERVAL 3 HOUR",
        Db::Sqlite => "run_at - 10800",
    };
    live.exec(&format!(
        "UPDATE {} SET customer = 'c0', run_at = {back} WHERE id = {late}",
        t.name()
    ));
    let other = live.connect();
    let elsewhere = other.subscription(&t).start().unwrap();
    // The moved row is the head now, but a row of its group is in work.
    for s in [&sub, &elsewhere] {
        if let Ok(d) = s.next_delivery_timeout(Duration::from_millis(600)) {
            panic!(
                "row {} (seq {}) was delivered while seq 0 of its group was in work",
                d.id(),
                seq(&d)
            );
        }
    }
    elsewhere.shutdown(Duration::from_secs(5)).unwrap();
    head.ack().unwrap();
    let mut order = Vec::new();
    for _ in 0..2 {
        let d = common::next(&sub, Duration::from_secs(10));
        order.push(seq(&d));
        d.ack().unwrap();
    }
    assert_eq!(
        order,
        [-1, 1],
        "the moved row (now the head) first, then the rest"
    );
    sub.shutdown(Duration::from_secs(5)).unwrap();
}

/// Carries `<kind>\t<table>\t<url>` to the crash child.
const CHILD_ENV: &str = "SQLBROKER_FIFO_CRASH_CHILD";
const CRASH_LEASE: Duration = Duration::from_secs(2);

/// The child of `fifo_crash_keeps_order`: does nothing unless `SQLBROKER_FIFO_CRASH_CHILD` is
/// set; then claims one delivery, prints `CLAIMED <id> <seq>` and holds it until killed.
#[test]
fn fifo_crash_child_entry() {
    use std::io::Write;
    let Some((kind, name, url)) = common::child_spec(CHILD_ENV) else {
        return;
    };
    let (name, url) = (name.as_str(), url.as_str());
    let kind = Kind::from_name(kind.as_str());
    let broker = Broker::connect(url).expect("child: connect");
    let sub = broker
        .subscription(&describe(name, kind, CRASH_LEASE))
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
/// it lives nothing else of the group runs; after it, the head comes back first (advisory
/// form: the session ends and the database frees its keys, so the group is not stuck). Not on
/// SQLite's advisory form, whose keys live in one process (documented: one process per file).
fn fifo_crash_keeps_order(db: Db, kind: Kind) {
    let Some(live) = common::live(db) else { return };
    let name = common::unique("t");
    let t = live.create(describe(&name, kind, CRASH_LEASE));
    publish_groups(&live.broker, &t, 1, 3);
    let mut child = common::spawn_child(
        "fifo_crash_child_entry",
        CHILD_ENV,
        &format!("{}\t{name}\t{}", kind.name(), live.url),
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

per_db_fifo!(fifo_order_across_brokers);
per_db_fifo!(fifo_groups_run_in_parallel);
per_db_fifo!(fifo_head_not_due_blocks_its_group);
per_db_fifo!(fifo_crash_keeps_order, one_process_sqlite_keys);
per_db_fifo!(fifo_one_handler_never_holds_two_rows_of_a_group);
per_db_fifo!(fifo_row_committed_behind_one_in_work_waits);

/// A group's next row is claimed as soon as its head is acked, not at the next poll: one group
/// of 6 rows, one subscription polling every 3 s, runs in well under one poll interval, acked
/// one by one, through `Delivery::ack_all`, and (lease) deferred. Fails (`6 rows of one group
/// took ..`: about 15 s, a poll per row) with the ack of a FIFO table waking no claimer
/// (PostgreSQL lease), and (`.. ack_all` / `.. deferred`) with the batch's and the deferred
/// writer's commits waking none.
fn fifo_next_row_of_a_group_follows_its_ack(db: Db, kind: Kind) {
    let Some(live) = common::live(db) else { return };
    let mut ways = vec!["ack", "ack_all"];
    if kind == Kind::Lease {
        ways.push("deferred");
    }
    for way in ways {
        let t = fifo_table(&live, kind);
        publish_groups(&live.broker, &t, 1, 6);
        let sub = live
            .broker
            .subscription(&t)
            .poll_interval(Duration::from_secs(3));
        let sub = match way {
            "deferred" => sub.ack_mode(sqlbroker::AckMode::Deferred {
                within: Duration::from_millis(20),
            }),
            _ => sub,
        };
        let sub = sub.start().unwrap();
        let start = Instant::now();
        for want in 0..6 {
            let d = sub.next_delivery_timeout(Duration::from_secs(20)).unwrap();
            assert_eq!(seq(&d), want, "publish order");
            match way {
                "ack_all" => {
                    for r in sqlbroker::Delivery::ack_all(vec![d]) {
                        r.unwrap();
                    }
                }
                _ => d.ack().unwrap(),
            }
        }
        let took = start.elapsed();
        sub.shutdown(Duration::from_secs(10)).unwrap();
        assert!(
            took < Duration::from_millis(2_500),
            "6 rows of one group took {took:?} under a 3 s poll, acked by {way}"
        );
    }
}
per_db_fifo!(fifo_next_row_of_a_group_follows_its_ack);
