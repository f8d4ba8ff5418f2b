//! What named queues, job kinds and workers cost, every run alternating its sides in one
//! process (compare ratios from one run, never figures across runs):
//!
//! - **cost** (`<db>/cost`): a burn-down of `QUEUES_JOBS` (default 20,000) lease jobs,
//!   `workers(4).batch_size(100)`, 4 handler threads looping `next_batch(100, ..)` +
//!   `ack_all`, against a **plain** table and a table with **queues and kinds** whose jobs are
//!   in one queue and of one kind, claimed by a subscription of that queue and kind (the
//!   queue's index, the paused queues' probe, the kind's filter). Best of `QUEUES_ROUNDS`
//!   (default 3) runs of each side; the second as a ratio of plain.
//! - **worker** (`<db>/worker`): the same number of jobs, handled by a handler that acks at
//!   once, as **one subscription** over one plain table (`Subscription::run`, 8 threads), a
//!   **worker over 20 kinds** of one table, and a **worker over 10 tables** (2 kinds each),
//!   each worker with 8 threads on a broker whose pool is 12 connections. Jobs/s from start to
//!   the last ack (the one subscription with four claim workers and batches of 100, more than
//!   any lane of a worker gets), the workers as a ratio of the one subscription; on the
//!   servers, the most connections the broker held at once, counted on the server
//!   (`pg_stat_activity`, `information_schema.processlist`) while it ran, against its pool's
//!   12.
//!
//! ```sh
//! cargo bench --bench queues                 # SQLite, PostgreSQL and MariaDB
//! cargo bench --bench queues -- postgres     # cells whose id contains a filter
//! QUEUES_JOBS=50000 QUEUES_ROUNDS=5 cargo bench --bench queues -- cost
//! ```

#[path = "support/mod.rs"]
mod support;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use sqlbroker::{Broker, Message, Table, Worker};
use support::{drop_table, env_num};

/// Publishes `jobs` rows made by `make` in batches of 500.
fn fill(broker: &Broker, t: &Table, jobs: usize, make: impl Fn(usize) -> Message) {
    let mut batch = Vec::with_capacity(500);
    for i in 0..jobs {
        batch.push(make(i));
        if batch.len() == 500 || i + 1 == jobs {
            broker.publish_batch(t, std::mem::take(&mut batch)).unwrap();
        }
    }
}

/// Burns `jobs` rows of `t` down through `sub`; jobs/s from `started`.
fn burn(sub: sqlbroker::Subscription, jobs: usize, started: Instant) -> f64 {
    let done = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..4 {
            let (sub, done) = (&sub, &done);
            s.spawn(move || {
                while done.load(Ordering::Relaxed) < jobs {
                    if let Ok(b) = sub.next_batch(100, Duration::from_millis(100)) {
                        let n = b.len();
                        for r in sqlbroker::Delivery::ack_all(b) {
                            r.unwrap();
                        }
                        done.fetch_add(n, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    let took = started.elapsed();
    sub.shutdown(Duration::from_secs(30)).unwrap();
    jobs as f64 / took.as_secs_f64()
}

fn cost(db: &str, url: &str, jobs: usize, rounds: usize) {
    let Some(broker) = support::connect(&format!("{db}/cost"), url) else {
        return;
    };
    let prefix = format!("queues_{}", std::process::id());
    let lease = Duration::from_secs(30);
    let plain = Table::new(format!("{prefix}_plain")).lease(lease);
    let named = Table::new(format!("{prefix}_named"))
        .queues()
        .kinds()
        .lease(lease);
    broker.create_table(&plain).unwrap();
    broker.create_table(&named).unwrap();
    let (mut best, mut runs) = ([0f64; 2], [Vec::new(), Vec::new()]);
    for _ in 0..rounds {
        fill(&broker, &plain, jobs, |_| Message::new(b"job".to_vec()));
        let started = Instant::now();
        let sub = broker.subscription(&plain).workers(4).batch_size(100);
        let rate = burn(sub.start().unwrap(), jobs, started);
        runs[0].push(rate);
        best[0] = f64::max(best[0], rate);
        fill(&broker, &named, jobs, |_| {
            Message::new(b"job".to_vec()).queue("mail").kind("welcome")
        });
        let started = Instant::now();
        let sub = broker
            .subscription(&named)
            .queues(["mail"])
            .kinds(["welcome"])
            .workers(4)
            .batch_size(100);
        let rate = burn(sub.start().unwrap(), jobs, started);
        runs[1].push(rate);
        best[1] = f64::max(best[1], rate);
    }
    for (i, name) in ["plain", "queues and kinds"].iter().enumerate() {
        let all: Vec<String> = runs[i].iter().map(|r| format!("{r:.0}")).collect();
        println!(
            "{db}/cost {name:<17} {:>8.0} jobs/s  x{:.2} of plain  (runs: {})",
            best[i],
            best[i] / best[0],
            all.join(", ")
        );
    }
    drop_table(db, url, plain.name());
    drop_table(db, url, named.name());
}

/// The connections the server has open from clients now (this process's broker and the
/// counter's own, which is taken off).
fn server_connections(db: &str, url: &str) -> Option<usize> {
    match db {
        "postgres" => {
            let mut c = postgres::Client::connect(url, postgres::NoTls).ok()?;
            let row = c
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
                     AND pid <> pg_backend_pid() AND backend_type = 'client backend'",
                    &[],
                )
                .ok()?;
            Some(row.get::<_, i64>(0) as usize)
        }
        "mariadb" => {
            use mysql::prelude::Queryable;
            let mut c = mysql::Conn::new(mysql::Opts::from_url(url).ok()?).ok()?;
            let n: Option<i64> = c
                .query_first(
                    "SELECT COUNT(*) FROM information_schema.processlist WHERE db = DATABASE() \
                     AND id <> CONNECTION_ID()",
                )
                .ok()?;
            n.map(|n| n as usize)
        }
        _ => None,
    }
}

/// While it runs, the most connections counted on the server, less `before` (those open
/// before the broker was made).
fn watch_connections<T>(
    db: &str,
    url: &str,
    before: Option<usize>,
    run: impl FnOnce() -> T,
) -> (T, Option<usize>) {
    let stop = AtomicBool::new(false);
    let most = AtomicUsize::new(0);
    let out = std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                if let Some(n) = server_connections(db, url) {
                    most.fetch_max(n, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        let out = run();
        stop.store(true, Ordering::Relaxed);
        out
    });
    let held = before.map(|b| most.load(Ordering::Relaxed).saturating_sub(b));
    (out, held)
}

/// A worker of `THREADS` threads with a handler that acks at once for each `(table, kind)`,
/// from its start until it has handled `jobs`; jobs/s.
fn run_worker(broker: &Broker, kinds: &[(&Table, String)], jobs: usize) -> f64 {
    let started = Instant::now();
    let done = std::sync::Arc::new(AtomicUsize::new(0));
    let mut w = Worker::new(broker).threads(THREADS);
    for (t, k) in kinds {
        let done = done.clone();
        w = w.on(t, k, move |_d| {
            done.fetch_add(1, Ordering::Relaxed);
            Ok::<(), String>(())
        });
    }
    let h = w.start().unwrap();
    while done.load(Ordering::Relaxed) < jobs {
        std::thread::sleep(Duration::from_millis(2));
    }
    let took = started.elapsed();
    h.shutdown(Duration::from_secs(30)).unwrap();
    jobs as f64 / took.as_secs_f64()
}

const POOL: u32 = 12;
const THREADS: usize = 8;

fn worker(db: &str, url: &str, jobs: usize, rounds: usize) {
    let before = server_connections(db, url);
    let Ok(broker) = Broker::builder(url).pool_size(POOL).build() else {
        println!("{db}/worker: skipped (no server)");
        return;
    };
    let prefix = format!("queuesw_{}", std::process::id());
    let lease = Duration::from_secs(30);
    let plain = Table::new(format!("{prefix}_plain")).lease(lease);
    let kinds20 = Table::new(format!("{prefix}_k20")).kinds().lease(lease);
    let tables10: Vec<Table> = (0..10)
        .map(|i| Table::new(format!("{prefix}_t{i}")).kinds().lease(lease))
        .collect();
    for t in [&plain, &kinds20].into_iter().chain(&tables10) {
        broker.create_table(t).unwrap();
    }
    let mut results: [Vec<(f64, Option<usize>)>; 3] = Default::default();
    for _ in 0..rounds {
        // One subscription over one table.
        fill(&broker, &plain, jobs, |_| Message::new(b"job".to_vec()));
        let (rate, held) = watch_connections(db, url, before, || {
            let started = Instant::now();
            let sub = broker
                .subscription(&plain)
                .workers(4)
                .batch_size(100)
                .start()
                .unwrap();
            let done = AtomicUsize::new(0);
            sub.run(THREADS, |_d| {
                if done.fetch_add(1, Ordering::Relaxed) + 1 >= jobs {
                    sub.close();
                }
                Ok::<(), String>(())
            })
            .unwrap();
            let took = started.elapsed();
            sub.shutdown(Duration::from_secs(30)).unwrap();
            jobs as f64 / took.as_secs_f64()
        });
        results[0].push((rate, held));
        // A worker over 20 kinds of one table.
        fill(&broker, &kinds20, jobs, |i| {
            Message::new(b"job".to_vec()).kind(format!("k{}", i % 20))
        });
        let kinds: Vec<(&Table, String)> = (0..20).map(|k| (&kinds20, format!("k{k}"))).collect();
        results[1].push(watch_connections(db, url, before, || {
            run_worker(&broker, &kinds, jobs)
        }));
        // A worker over 10 tables, 2 kinds each.
        for (n, t) in tables10.iter().enumerate() {
            let share = jobs / 10 + usize::from(n < jobs % 10);
            fill(&broker, t, share, |i| {
                Message::new(b"job".to_vec()).kind(format!("k{}", i % 2))
            });
        }
        let kinds: Vec<(&Table, String)> = tables10
            .iter()
            .flat_map(|t| (0..2).map(move |k| (t, format!("k{k}"))))
            .collect();
        results[2].push(watch_connections(db, url, before, || {
            run_worker(&broker, &kinds, jobs)
        }));
    }
    let best = |r: &[(f64, Option<usize>)]| r.iter().map(|x| x.0).fold(0f64, f64::max);
    let base = best(&results[0]);
    for (i, name) in ["one subscription", "worker, 20 kinds", "worker, 10 tables"]
        .iter()
        .enumerate()
    {
        let held = results[i].iter().filter_map(|x| x.1).max();
        let all: Vec<String> = results[i].iter().map(|x| format!("{:.0}", x.0)).collect();
        println!(
            "{db}/worker {name:<18} {:>8.0} jobs/s  x{:.2} of one subscription  connections \
             {} of a pool of {POOL}  (runs: {})",
            best(&results[i]),
            best(&results[i]) / base,
            held.map_or_else(|| "-".to_string(), |n| n.to_string()),
            all.join(", ")
        );
    }
    for t in [&plain, &kinds20].into_iter().chain(&tables10) {
        drop_table(db, url, t.name());
    }
}

fn main() {
    let filters = support::filters();
    let wanted = |id: &str| support::wanted(&filters, id);
    let jobs = env_num("QUEUES_JOBS", 20_000);
    let rounds = env_num("QUEUES_ROUNDS", 3);
    for (db, url) in &support::databases("queues") {
        if wanted(&format!("{db}/cost")) {
            cost(db, url, jobs, rounds);
        }
        if wanted(&format!("{db}/worker")) {
            worker(db, url, jobs, rounds);
        }
    }
    support::remove_sqlite("queues");
}
