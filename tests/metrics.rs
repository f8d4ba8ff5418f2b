//! The `metrics` feature: a real flow (publish, claim, ack, retry, fail, dead letter, cancel,
//! lost lease, handler timeout, failed claim) counted exactly, labelled by table, on every
//! database and form.
//!
//! The library's own threads (claim workers, the handler timeout's timer) report too, so the
//! recorder is the process's (this binary's alone); each test reads only its own table's
//! series. Its snapshots reset what they read, so they are taken under one lock and added up.

mod common;

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use common::Db;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use metrics_util::MetricKind;
use sqlbroker::{Delivery, Form, Message, RetryPolicy};

const LIMIT: Duration = Duration::from_secs(2);

/// Every series seen so far: (kind, name, table) to its counter or gauge value, or its
/// histogram's samples.
#[derive(Default)]
struct Totals {
    values: HashMap<(MetricKind, String, String), f64>,
    samples: HashMap<(String, String), Vec<f64>>,
}

fn recorder() -> &'static Mutex<(Snapshotter, Totals)> {
    static R: OnceLock<Mutex<(Snapshotter, Totals)>> = OnceLock::new();
    R.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder
            .install()
            .expect("the only recorder of this binary");
        Mutex::new((snapshotter, Totals::default()))
    })
}

/// One table's view of the recorder.
struct Seen {
    table: String,
}

impl Seen {
    fn new(table: &str) -> Self {
        recorder();
        Seen {
            table: table.to_string(),
        }
    }

    /// Adds the recorder's news to the totals (counters and gauges add: a snapshot swapped
    /// them to zero) and runs `f` on them.
    fn with<T>(&self, f: impl FnOnce(&Totals) -> T) -> T {
        let mut g = recorder().lock().unwrap_or_else(|e| e.into_inner());
        let (snapshotter, totals) = &mut *g;
        for (key, _, _, value) in snapshotter.snapshot().into_vec() {
            let (kind, key) = key.into_parts();
            let labels: Vec<_> = key.labels().collect();
            assert_eq!(labels.len(), 1, "{key:?}: one label, table");
            assert_eq!(labels[0].key(), "table", "{key:?}");
            let (name, table) = (key.name().to_string(), labels[0].value().to_string());
            match value {
                DebugValue::Counter(n) => {
                    *totals.values.entry((kind, name, table)).or_default() += n as f64
                }
                DebugValue::Gauge(v) => {
                    *totals.values.entry((kind, name, table)).or_default() += v.into_inner()
                }
                DebugValue::Histogram(v) => totals
                    .samples
                    .entry((name, table))
                    .or_default()
                    .extend(v.into_iter().map(|x| x.into_inner())),
            }
        }
        f(totals)
    }

    /// A counter of this table; `None` if it was never registered.
    fn counter(&self, name: &str) -> Option<u64> {
        let key = (MetricKind::Counter, name.to_string(), self.table.clone());
        self.with(|t| t.values.get(&key).map(|v| *v as u64))
    }

    fn gauge(&self, name: &str) -> Option<f64> {
        let key = (MetricKind::Gauge, name.to_string(), self.table.clone());
        self.with(|t| t.values.get(&key).copied())
    }

    fn samples(&self, name: &str) -> Vec<f64> {
        let key = (name.to_string(), self.table.clone());
        self.with(|t| t.samples.get(&key).cloned().unwrap_or_default())
    }
}

/// Each outcome once (the lost lease in the lease form only), then a claim that fails: every
/// counter exact, every histogram with a sample per settlement, the gauge back to zero.
fn every_outcome_is_counted(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let t = live.table(form, Duration::from_secs(30));
    let seen = Seen::new(t.name());
    let lease = form == Form::Lease;
    // `all`: two acked together (`Delivery::ack_all`).
    let mut bodies = vec!["ack", "retry", "fail", "dead", "cancel", "all", "all"];
    if lease {
        bodies.push("lost");
    }
    // Two alone and the rest in a batch: both publish paths count.
    live.broker
        .publish(&t, common::msg("timeout", "k0"))
        .unwrap();
    live.broker
        .publish(&t, common::msg(bodies[0], "k1"))
        .unwrap();
    let rest: Vec<Message> = bodies[1..]
        .iter()
        .enumerate()
        .map(|(i, b)| common::msg(b, &format!("k{}", i + 2)))
        .collect();
    live.broker.publish_batch(&t, rest).unwrap();
    let rows = bodies.len() as u64 + 1;
    assert_eq!(seen.counter("sqlbroker_jobs_published_total"), Some(rows));

    // Retries an hour away: no row comes back during the test.
    let hour = Duration::from_secs(3600);
    let sub = live
        .broker
        .subscription(&t)
        .handler_timeout(LIMIT)
        .retry_policy(RetryPolicy::exponential(hour, hour).without_jitter())
        // The row lock and server advisory forms hold a connection per row: room for the one
        // held past its timeout, the two acked together and the next.
        .max_in_flight(4)
        .start()
        .unwrap();
    let mut late: Option<Delivery> = None;
    let mut together = Vec::new();
    for _ in 0..rows {
        let d = common::next(&sub, Duration::from_secs(10));
        match d.payload() {
            b"ack" => d.ack().unwrap(),
            b"retry" => d.retry_after(hour).unwrap(),
            b"fail" => d.fail("boom").unwrap(),
            b"dead" => d.dead_letter("bad input").unwrap(),
            b"cancel" => d.cancel().unwrap(),
            b"lost" => {
                let later = match db {
                    Db::Postgres => "locked_until + interval '1 second'",
                    Db::Mysql => "locked_until + INTERVAL 1 SECOND",
                    Db::Sqlite => "locked_until + 1",
                };
                live.exec(&format!(
                    "UPDATE {} SET locked_until = {later} WHERE id = {}",
                    t.name(),
                    d.id()
                ));
                assert!(d.ack().unwrap_err().is_lease_lost());
            }
            b"timeout" => late = Some(d),
            b"all" => together.push(d),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(seen.gauge("sqlbroker_jobs_in_flight"), Some(3.0));
    for r in Delivery::ack_all(together) {
        r.unwrap();
    }
    // Every other row settled: the one held is the only one in flight.
    assert_eq!(seen.gauge("sqlbroker_jobs_in_flight"), Some(1.0));
    // The timeout counts, then writes its failure (a retry): wait for both.
    let timed_out = common::wait_for(Duration::from_secs(15), || {
        seen.counter("sqlbroker_handler_timeouts_total") == Some(1)
            && seen.counter("sqlbroker_jobs_retried_total") == Some(3)
    });
    assert!(
        timed_out,
        "{:?}",
        seen.counter("sqlbroker_handler_timeouts_total")
    );
    let late = late.expect("the row held past its timeout");
    assert!(late.ack().unwrap_err().is_handler_timeout());
    assert_eq!(seen.gauge("sqlbroker_jobs_in_flight"), Some(0.0));

    let lost = u64::from(lease);
    for (name, want) in [
        ("sqlbroker_jobs_published_total", rows),
        ("sqlbroker_jobs_claimed_total", rows),
        ("sqlbroker_jobs_acked_total", 3),
        // retry, fail, timeout
        ("sqlbroker_jobs_retried_total", 3),
        // fail, timeout
        ("sqlbroker_jobs_failed_total", 2),
        ("sqlbroker_jobs_dead_lettered_total", 1),
        ("sqlbroker_jobs_cancelled_total", 1),
        ("sqlbroker_leases_lost_total", lost),
        ("sqlbroker_handler_timeouts_total", 1),
        ("sqlbroker_claim_errors_total", 0),
        ("sqlbroker_settle_errors_total", 0),
    ] {
        assert_eq!(seen.counter(name), Some(want), "{name}");
    }
    // The handler's time of each handed-out delivery settled (the late ack wrote nothing);
    // the database's time of each settling statement (the lease form acks the two together
    // in one).
    let settled = rows as usize;
    let handler = seen.samples("sqlbroker_handler_duration_seconds");
    assert_eq!(handler.len(), settled, "{handler:?}");
    // The timed-out one was held for its whole limit.
    assert!(
        handler.iter().any(|s| *s >= LIMIT.as_secs_f64()),
        "{handler:?}"
    );
    assert_eq!(
        seen.samples("sqlbroker_settle_duration_seconds").len(),
        settled - usize::from(lease)
    );
    assert!(!seen.samples("sqlbroker_claim_duration_seconds").is_empty());
    // A queue wait per claimed row: each was due at its publish (whole seconds) and claimed
    // within the test, so each waited from 0 to well under a minute.
    let waits = seen.samples("sqlbroker_queue_wait_seconds");
    assert_eq!(waits.len(), rows as usize, "{waits:?}");
    assert!(waits.iter().all(|w| (0.0..60.0).contains(w)), "{waits:?}");
    sub.close();

    // A claim that fails (the table is gone) counts as a claim error.
    let sub = live.broker.subscription(&t).start().unwrap();
    live.exec(&format!("DROP TABLE {}", t.name()));
    let failed = common::wait_for(Duration::from_secs(15), || {
        seen.counter("sqlbroker_claim_errors_total").unwrap_or(0) >= 1
    });
    assert!(failed, "{:?}", seen.counter("sqlbroker_claim_errors_total"));
    sub.close();
}
per_db_form!(every_outcome_is_counted);

/// A publish inside the application's own transaction counts as a publish of its table
/// (one message and a batch of two).
fn a_transactional_publish_is_counted(db: Db) {
    let Some(live) = common::live(db) else { return };
    let t = live.table(Form::Lease, Duration::from_secs(30));
    let seen = Seen::new(t.name());
    let (one, two) = (
        common::msg("x", "a"),
        vec![common::msg("y", "b"), common::msg("z", "c")],
    );
    match db {
        Db::Postgres => {
            let mut client = postgres::Client::connect(&live.url, postgres::NoTls).unwrap();
            let mut tx = client.transaction().unwrap();
            sqlbroker::postgres::publish(&mut tx, &t, one).unwrap();
            sqlbroker::postgres::publish_batch(&mut tx, &t, two).unwrap();
            tx.commit().unwrap();
        }
        Db::Mysql => {
            let mut conn = mysql::Conn::new(mysql::Opts::from_url(&live.url).unwrap()).unwrap();
            let mut tx = conn.start_transaction(mysql::TxOpts::default()).unwrap();
            sqlbroker::mysql::publish(&mut tx, &t, one).unwrap();
            sqlbroker::mysql::publish_batch(&mut tx, &t, two).unwrap();
            tx.commit().unwrap();
        }
        Db::Sqlite => {
            let path = live.url.strip_prefix("sqlite:").unwrap();
            let mut conn = rusqlite::Connection::open(path).unwrap();
            conn.busy_timeout(Duration::from_secs(30)).unwrap();
            let tx = conn.transaction().unwrap();
            sqlbroker::sqlite::publish(&tx, &t, one).unwrap();
            sqlbroker::sqlite::publish_batch(&tx, &t, two).unwrap();
            tx.commit().unwrap();
        }
    }
    assert_eq!(seen.counter("sqlbroker_jobs_published_total"), Some(3));
    assert_eq!(live.rows(&t), 3);
}
per_db!(a_transactional_publish_is_counted);

/// A table with nothing to claim spends no claims on another table's commits. SQLite's change
/// feed wakes every table's idle claim workers on any commit to the file: without the read
/// that asks whether a row may be claimable, each of 200 publishes to the busy table woke an
/// empty claim of the idle one (a write transaction, queued behind the one writer). Fails
/// (`claims of the idle table`) if the idle workers claim on those wake-ups.
fn an_idle_table_claims_nothing_on_others_commits(db: Db) {
    let Some(live) = common::live(db) else { return };
    let idle = live.table(Form::Lease, Duration::from_secs(30));
    let busy = live.table(Form::Lease, Duration::from_secs(30));
    let seen = Seen::new(idle.name());
    let sub = live
        .broker
        .subscription(&idle)
        .workers(2)
        .poll_interval(Duration::from_secs(5))
        .start()
        .unwrap();
    // The workers' first look (a claim, or the read before one), before the commits begin.
    std::thread::sleep(Duration::from_millis(300));
    let before = seen.samples("sqlbroker_claim_duration_seconds").len();
    for i in 0..200 {
        live.broker
            .publish(&busy, common::msg("x", &format!("b{i}")))
            .unwrap();
        std::thread::sleep(Duration::from_millis(2));
    }
    let claims = seen.samples("sqlbroker_claim_duration_seconds").len() - before;
    assert!(
        claims <= 4,
        "claims of the idle table during 200 commits to another: {claims}"
    );
    // A publish to the idle table is still claimed at once.
    live.broker.publish(&idle, common::msg("y", "i0")).unwrap();
    let got = sub.next_delivery_timeout(Duration::from_secs(3)).unwrap();
    got.ack().unwrap();
    sub.shutdown(Duration::from_secs(5)).unwrap();
}
per_db!(an_idle_table_claims_nothing_on_others_commits);
