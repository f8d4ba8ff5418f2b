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
//! - **durable** (`<db>/durable`): the cost cell's five sides with the durable plain ack: 32
//!   handler threads, each `next_delivery_timeout` + `ack()` one row at a time (the lease
//!   headline's shape, `benches/burndown`'s `lease_h32`), `workers(4).batch_size(100)`.
//!   Printed as `<db>/durable <side> N jobs/s xR of plain`.
//! - **noisy neighbour** (`<db>/noisy`): one tenant floods `NOISY_FLOOD` (default 100,000)
//!   lease jobs; then, while they drain (the same subscription and handlers as above), nine
//!   small tenants publish 100 jobs each, one job per tenant every 10 ms. Each small job's
//!   wait is from its publish to its handler; reports each small tenant's p50/p99 wait, on a
//!   table with `fair("{tenant}")` and on one without, alternated in one process. A side
//!   ends when every small job is done (the flood's rest is dropped with the table).
//! - **busy tenant** (`<db>/busy`): a per-tenant `concurrency_limit("{tenant}", 16)` that
//!   binds on one tenant of ten and on no other. Nine small tenants have `FLOW_JOBS / 10` jobs
//!   each that take no time; a busy tenant has as many jobs as the nine together (`BUSY_JOBS`),
//!   interleaved with theirs by id, each taking `BUSY_MS` (default 50 ms) in its handler, so it would hold
//!   every handler without its limit. 32 handler threads as in **durable**,
//!   `workers(4).batch_size(16).max_in_flight(64)` (the nine hold about 7 rows each in work,
//!   under the max); with the busy tenant, 16 more of each (its rows in work at its max), so
//!   the nine have what they have alone. Two sides on the same table, alternated: **nine alone** and **nine +
//!   busy**; each reports the nine's jobs/s from the start to their last ack (the busy
//!   tenant's rest is deleted), the ratio of the second to the first, and the most rows
//!   `Broker::stats` counted `limited` (sampled every second): 0 shows the limit never bound
//!   on the nine alone.
//!
//! ```sh
//! cargo bench --bench flow                 # SQLite, PostgreSQL and MariaDB
//! cargo bench --bench flow -- sqlite       # cells whose id contains a filter
//! FLOW_JOBS=50000 FLOW_ROUNDS=5 cargo bench --bench flow -- postgres
//! ```
//!
//! With `FLOW_SIDE_TIMES=1` the cost cells print each side's burn window on the monotonic
//! clock (stderr), for a profiler's time filter: `perf record --clockid=CLOCK_MONOTONIC`, then
//! `perf report --time <from>,<to>`.
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
/// How a burn-down's handlers take and ack rows.
#[derive(Clone, Copy)]
enum Handlers {
    /// 4 threads of `next_batch(100, ..)` + `ack_all`.
    Batches,
    /// 32 threads of `next_delivery_timeout` + `ack()`, one row at a time.
    Durable,
}

fn burn(broker: &Broker, t: &Table, jobs: usize, handlers: Handlers) -> f64 {
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
    let threads = match handlers {
        Handlers::Batches => 4,
        Handlers::Durable => 32,
    };
    std::thread::scope(|s| {
        for _ in 0..threads {
            let (sub, done) = (&sub, &done);
            s.spawn(move || {
                while done.load(std::sync::atomic::Ordering::Relaxed) < jobs {
                    if let Handlers::Durable = handlers {
                        if let Ok(d) = sub.next_delivery_timeout(Duration::from_millis(100)) {
                            d.ack().unwrap();
                            done.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                        continue;
                    }
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

fn cost(db: &str, url: &str, jobs: usize, rounds: usize, handlers: Handlers) {
    let cell = match handlers {
        Handlers::Batches => "cost",
        Handlers::Durable => "durable",
    };
    let Some(broker) = support::connect(&format!("{db}/{cell}"), url) else {
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
        for (i, (name, t)) in sides.iter().enumerate() {
            let began = monotonic();
            let rate = burn(&broker, t, jobs, handlers);
            if std::env::var_os("FLOW_SIDE_TIMES").is_some() {
                // For a profiler's time filter (`perf record --clockid=CLOCK_MONOTONIC`, then
                // `perf report --time <from>,<to>`): each burn's window.
                eprintln!("{db}/{cell} {name}: {began:.6},{:.6}", monotonic());
            }
            runs[i].push(rate);
            best[i] = best[i].max(rate);
        }
    }
    for (i, (name, _)) in sides.iter().enumerate() {
        let all: Vec<String> = runs[i].iter().map(|r| format!("{r:.0}")).collect();
        println!(
            "{db}/{cell} {name:<12} {:>8.0} jobs/s  x{:.2} of plain  (runs: {})",
            best[i],
            best[i] / best[0],
            all.join(", ")
        );
    }
    for (_, t) in &sides {
        drop_table(db, url, t.name());
    }
}

/// The monotonic clock (`CLOCK_MONOTONIC`), in seconds: what `perf` stamps its samples with
/// when asked to.
fn monotonic() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the call's duration.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
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

const BUSY_MAX: u32 = 16;

/// One side of the busy-tenant cell: the nine's jobs/s, the busy tenant's acks and the most
/// rows counted `limited`.
fn busy_side(broker: &Broker, t: &Table, jobs: usize, with_busy: bool) -> (f64, usize, u64) {
    use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
    let per_small = (jobs / TENANTS).max(1);
    let small = per_small * SMALL_TENANTS;
    let busy_ms = env_num("BUSY_MS", 50) as u64;
    let mut batch = Vec::with_capacity(500);
    let busy_jobs = if with_busy {
        env_num("BUSY_JOBS", small)
    } else {
        0
    };
    for i in 0..small {
        for _ in i * busy_jobs / small..(i + 1) * busy_jobs / small {
            batch.push(Message::new(b"busy".to_vec()).set("tenant", "busy"));
        }
        batch.push(
            Message::new(b"small".to_vec()).set("tenant", format!("small{}", i % SMALL_TENANTS)),
        );
        if batch.len() >= 500 || i + 1 == small {
            broker.publish_batch(t, std::mem::take(&mut batch)).unwrap();
        }
    }
    // The busy tenant's rows in work (its max) hold handlers and buffer places of their own:
    // the nine have what they have alone.
    let extra = if with_busy { BUSY_MAX as usize } else { 0 };
    let started = Instant::now();
    let sub = broker
        .subscription(t)
        .workers(4)
        .batch_size(16)
        .max_in_flight(64 + extra)
        .start()
        .unwrap();
    let (small_done, busy_done) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let limited_most = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let deadline = started + Duration::from_secs(600);
    let took = std::thread::scope(|s| {
        let (sub, small_done, busy_done) = (&sub, &small_done, &busy_done);
        let (limited_most, stop) = (&limited_most, &stop);
        s.spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if let Ok(st) = broker.stats(t) {
                    limited_most.fetch_max(st.limited.unwrap_or(0), Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_secs(1));
            }
        });
        let handlers: Vec<_> = (0..32 + extra)
            .map(|_| {
                s.spawn(move || {
                    while small_done.load(Ordering::Relaxed) < small && Instant::now() < deadline {
                        let Ok(d) = sub.next_delivery_timeout(Duration::from_millis(100)) else {
                            continue;
                        };
                        if d.payload() == b"busy" {
                            std::thread::sleep(Duration::from_millis(busy_ms));
                            d.ack().unwrap();
                            busy_done.fetch_add(1, Ordering::Relaxed);
                        } else {
                            d.ack().unwrap();
                            small_done.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                })
            })
            .collect();
        for h in handlers {
            h.join().unwrap();
        }
        let took = started.elapsed();
        stop.store(true, Ordering::Relaxed);
        took
    });
    assert!(
        small_done.load(Ordering::Relaxed) >= small,
        "the nine's jobs did not finish in 600 s"
    );
    sub.shutdown(Duration::from_secs(30)).unwrap();
    (
        small as f64 / took.as_secs_f64(),
        busy_done.into_inner(),
        limited_most.into_inner(),
    )
}

fn busy(db: &str, url: &str, jobs: usize, rounds: usize) {
    let Some(broker) = support::connect(&format!("{db}/busy"), url) else {
        return;
    };
    let prefix = format!("busy_{}", std::process::id());
    let mut best = [0f64; 2];
    let mut runs: [Vec<String>; 2] = [Vec::new(), Vec::new()];
    for round in 0..rounds {
        for (side, with_busy) in [false, true].into_iter().enumerate() {
            // A fresh table a run: the busy tenant's rest must not carry into the next.
            let t = Table::new(format!("{prefix}_{round}_{side}"))
                .text_column("tenant")
                .lease(Duration::from_secs(30))
                .concurrency_limit("{tenant}", BUSY_MAX);
            broker.create_table(&t).unwrap();
            let (rate, busy_acks, limited) = busy_side(&broker, &t, jobs, with_busy);
            drop_table(db, url, t.name());
            best[side] = best[side].max(rate);
            runs[side].push(format!(
                "{rate:.0} (busy acks {busy_acks}, limited <= {limited})"
            ));
        }
    }
    for (side, name) in ["nine alone", "nine + busy"].into_iter().enumerate() {
        println!(
            "{db}/busy {name:<12} {:>8.0} jobs/s  x{:.2} of nine alone  (runs: {})",
            best[side],
            best[side] / best[0],
            runs[side].join(", ")
        );
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
            cost(db, url, jobs, rounds, Handlers::Batches);
        }
        if wanted(&format!("{db}/durable")) {
            cost(db, url, jobs, rounds, Handlers::Durable);
        }
        if wanted(&format!("{db}/busy")) {
            busy(db, url, jobs, rounds);
        }
        if wanted(&format!("{db}/noisy")) {
            noisy(db, url, env_num("NOISY_FLOOD", 100_000));
        }
    }
    support::remove_sqlite("flow");
}
