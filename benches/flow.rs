//! Flow control's cost and effect, every run alternating its sides in one process (compare
//! ratios from one run, never figures across runs):
//!
//! - **cost** (`<db>/cost`): a burn-down of `FLOW_JOBS` (default 20,000) lease jobs spread over
//!   10 tenants, `workers(4).batch_size(100)`, 4 handler threads looping
//!   `next_batch(100, ..)` + `ack_all`, from `SubscriptionBuilder::start` to the last ack,
//!   against three tables alike but for their options: **plain**; **limited**, a per-tenant
//!   `concurrency_limit("{tenant}", 1000)` that never binds; **both limits**, that and a
//!   table-wide `concurrency_limit("", 1000)`. Reports the best of `FLOW_ROUNDS` (default 3)
//!   runs of each side, and each limited side's rate as a ratio of plain. **fair** is a
//!   fourth side: `fair("{tenant}")`, claims rotating over the 10 tenants; **rate limited** a
//!   fifth: `rate_limit("{tenant}", 10_000, 1 s)`, which never binds (2,000 jobs a tenant).
//! - **noisy neighbour** (`<db>/noisy`): one tenant floods `NOISY_FLOOD` (default 100,000)
//!   lease jobs; then, while they drain (the same subscription and handlers as above), nine
//!   small tenants publish 100 jobs each, one job per tenant every 10 ms. Each small job's
//!   wait is from its publish to its handler; reports each small tenant's p50/p99 wait, on a
//!   table with `fair("{tenant}")` and on one without, alternated in one process. A side
//!   ends when every small job is done (the flood's rest is dropped with the table).
//!
//! ```sh
//! cargo bench --bench flow                 # SQLite, PostgreSQL and MariaDB
//! cargo bench --bench flow -- sqlite       # cells whose id contains a filter
//! FLOW_JOBS=50000 FLOW_ROUNDS=5 cargo bench --bench flow -- postgres
//! ```
//!
//! Servers: `SQLBROKER_PG_URL` (default `postgres://postgres@127.0.0.1:5432/test`),
//! `SQLBROKER_MYSQL_URL` (default `mysql://root@127.0.0.1:3306/test`); a server that does not
//! answer is skipped with a line saying so. SQLite runs on a file in the temporary directory.

#[path = "support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use sqlbroker::{Broker, Message, Table};
use support::{drop_table, env_num};

const TENANTS: usize = 10;

/// The three sides of the cost cell: their names and tables.
fn sides(prefix: &str) -> Vec<(&'static str, Table)> {
    let base = |suffix: &str| {
        Table::new(format!("{prefix}_{suffix}"))
            .text_column("tenant")
            .lease(Duration::from_secs(30))
    };
    vec![
        ("plain", base("plain")),
        (
            "limited",
            base("limited").concurrency_limit("{tenant}", 1000),
        ),
        (
            "both limits",
            base("both")
                .concurrency_limit("{tenant}", 1000)
                .concurrency_limit("", 1000),
        ),
        ("fair", base("fair").fair("{tenant}")),
        (
            "rate limited",
            base("rated").rate_limit("{tenant}", 10_000, Duration::from_secs(1)),
        ),
    ]
}

/// Publishes `jobs` rows over the tenants, then burns them down; jobs/s.
fn burn(broker: &Broker, t: &Table, jobs: usize) -> f64 {
    let mut batch = Vec::with_capacity(500);
    for i in 0..jobs {
        batch.push(Message::new(b"job".to_vec()).set("tenant", format!("t{}", i % TENANTS)));
        if batch.len() == 500 || i + 1 == jobs {
            broker.publish_batch(t, std::mem::take(&mut batch)).unwrap();
        }
    }
    let started = Instant::now();
    let sub = broker
        .subscription(t)
        .workers(4)
        .batch_size(100)
        .start()
        .unwrap();
    let done = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..4 {
            let (sub, done) = (&sub, &done);
            s.spawn(move || {
                while done.load(std::sync::atomic::Ordering::Relaxed) < jobs {
                    if let Ok(b) = sub.next_batch(100, Duration::from_millis(100)) {
                        let n = b.len();
                        for r in sqlbroker::Delivery::ack_all(b) {
                            r.unwrap();
                        }
                        done.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
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
    let prefix = format!("flow_{}", std::process::id());
    let sides = sides(&prefix);
    for (_, t) in &sides {
        broker.create_table(t).unwrap();
    }
    let mut best = vec![0f64; sides.len()];
    let mut runs: Vec<Vec<f64>> = vec![Vec::new(); sides.len()];
    for _ in 0..rounds {
        for (i, (_, t)) in sides.iter().enumerate() {
            let rate = burn(&broker, t, jobs);
            runs[i].push(rate);
            best[i] = best[i].max(rate);
        }
    }
    for (i, (name, _)) in sides.iter().enumerate() {
        let all: Vec<String> = runs[i].iter().map(|r| format!("{r:.0}")).collect();
        println!(
            "{db}/cost {name:<12} {:>8.0} jobs/s  x{:.2} of plain  (runs: {})",
            best[i],
            best[i] / best[0],
            all.join(", ")
        );
    }
    for (_, t) in &sides {
        drop_table(db, url, t.name());
    }
}

const SMALL_TENANTS: usize = 9;
const SMALL_JOBS: usize = 100;

/// One side of the noisy-neighbour cell: each small tenant's waits, sorted.
fn noisy_side(broker: &Broker, t: &Table, flood: usize) -> Vec<Vec<Duration>> {
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;
    let mut batch = Vec::with_capacity(1000);
    for i in 0..flood {
        batch.push(Message::new(b"flood".to_vec()).set("tenant", "flood"));
        if batch.len() == 1000 || i + 1 == flood {
            broker.publish_batch(t, std::mem::take(&mut batch)).unwrap();
        }
    }
    // id -> (small tenant, publish time)
    let published: Mutex<HashMap<i64, (usize, Instant)>> = Mutex::new(HashMap::new());
    let waits: Mutex<Vec<Vec<Duration>>> = Mutex::new(vec![Vec::new(); SMALL_TENANTS]);
    let small_done = AtomicUsize::new(0);
    let all_small = SMALL_TENANTS * SMALL_JOBS;
    let sub = broker
        .subscription(t)
        .workers(4)
        .batch_size(100)
        .start()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(600);
    std::thread::scope(|s| {
        for _ in 0..4 {
            let (sub, published, waits, small_done) = (&sub, &published, &waits, &small_done);
            s.spawn(move || {
                while small_done.load(Ordering::Relaxed) < all_small && Instant::now() < deadline {
                    let Ok(b) = sub.next_batch(100, Duration::from_millis(100)) else {
                        continue;
                    };
                    let now = Instant::now();
                    {
                        let published = published.lock().unwrap();
                        let mut waits = waits.lock().unwrap();
                        for d in &b {
                            if let Some((tenant, at)) = published.get(&d.id()) {
                                waits[*tenant].push(now - *at);
                                small_done.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                    for r in sqlbroker::Delivery::ack_all(b) {
                        r.unwrap();
                    }
                }
            });
        }
        // The small tenants, one job each every 10 ms while the flood drains. The publish
        // time is noted before the publish, so a job claimed at once still has its wait.
        for _ in 0..SMALL_JOBS {
            for tenant in 0..SMALL_TENANTS {
                let at = Instant::now();
                let msg = Message::new(b"small".to_vec()).set("tenant", format!("small{tenant}"));
                let mut published = published.lock().unwrap();
                let id = broker.publish(t, msg).unwrap();
                published.insert(id, (tenant, at));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    });
    sub.shutdown(Duration::from_secs(30)).unwrap();
    let mut waits = waits.into_inner().unwrap();
    for w in &mut waits {
        w.sort();
    }
    waits
}

/// The `q` quantile of sorted `waits`, in milliseconds.
fn quantile_ms(waits: &[Duration], q: f64) -> f64 {
    if waits.is_empty() {
        return f64::NAN;
    }
    let i = ((waits.len() as f64 * q).ceil() as usize).clamp(1, waits.len()) - 1;
    waits[i].as_secs_f64() * 1000.0
}

fn noisy(db: &str, url: &str, flood: usize) {
    let Some(broker) = support::connect(&format!("{db}/noisy"), url) else {
        return;
    };
    let prefix = format!("noisy_{}", std::process::id());
    let base = |suffix: &str| {
        Table::new(format!("{prefix}_{suffix}"))
            .text_column("tenant")
            .lease(Duration::from_secs(30))
    };
    for (name, t) in [
        ("without fair", base("plain")),
        ("fair", base("fair").fair("{tenant}")),
        (
            "rate limited",
            base("rated").rate_limit("{tenant}", 10_000, Duration::from_secs(1)),
        ),
    ] {
        broker.create_table(&t).unwrap();
        let started = Instant::now();
        let waits = noisy_side(&broker, &t, flood);
        let took = started.elapsed();
        let cells: Vec<String> = waits
            .iter()
            .enumerate()
            .map(|(i, w)| {
                format!(
                    "small{i} {:.0}/{:.0}",
                    quantile_ms(w, 0.5),
                    quantile_ms(w, 0.99)
                )
            })
            .collect();
        let all: Vec<Duration> = {
            let mut all: Vec<Duration> = waits.iter().flatten().copied().collect();
            all.sort();
            all
        };
        println!(
            "{db}/noisy {name:<12} small tenants' wait p50/p99 ms: all {:.0}/{:.0}; {}  ({:.1} s)",
            quantile_ms(&all, 0.5),
            quantile_ms(&all, 0.99),
            cells.join(", "),
            took.as_secs_f64()
        );
        drop_table(db, url, t.name());
    }
}

/// Drops a bench table and its record through the database's own crate (SQLite's file goes
/// at the end): a record left behind would be listed by `sqlbroker status` as a broken table.
fn main() {
    let filters = support::filters();
    let wanted = |id: &str| support::wanted(&filters, id);
    let jobs = env_num("FLOW_JOBS", 20_000);
    let rounds = env_num("FLOW_ROUNDS", 3);
    for (db, url) in &support::databases("flow") {
        if wanted(&format!("{db}/cost")) {
            cost(db, url, jobs, rounds);
        }
        if wanted(&format!("{db}/noisy")) {
            noisy(db, url, env_num("NOISY_FLOOD", 100_000));
        }
    }
    support::remove_sqlite("flow");
}
