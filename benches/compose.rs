//! Jobs that compose: how soon a waiting job starts once what it waits on is done, and what a
//! table with dependencies costs, every cell in one process (compare ratios from one run,
//! never figures across runs):
//!
//! - **fan-out** (`<db>/fanout`): `COMPOSE_FAN` (default 10,000) lease jobs published with one
//!   callback (`after_settled` each), burnt down by `workers(4).batch_size(100)` and 4 handler
//!   threads acking one by one; the callback's delay is from the return of the last job's
//!   `ack()` (its commit, which releases the callback) to the callback reaching a handler.
//!   `COMPOSE_ROUNDS` (default 5) rounds: reports each round's delay, their median and worst.
//!   The same rounds time the callback's publish (`<db>/publish`): one job naming all
//!   `COMPOSE_FAN` jobs, each of its waits and their heads written in its transaction.
//! - **chain** (`<db>/chain`): `COMPOSE_CHAIN` (default 1,000) lease jobs, each `after` the one
//!   before, worked by one handler thread; each link's delay is from the return of the ack of
//!   the link before to the link reaching the handler. Reports p50 and p99 over the links.
//! - **cost** (`<db>/cost`): the fan-out's burn-down rate (jobs/s, the callback aside) against
//!   the same burn-down of a plain table (no dependencies, grouped acks), alternated, best of
//!   the rounds.
//!
//! ```sh
//! cargo bench --bench compose                 # SQLite, PostgreSQL and MariaDB
//! cargo bench --bench compose -- postgres     # cells whose id contains a filter
//! COMPOSE_FAN=2000 COMPOSE_ROUNDS=3 cargo bench --bench compose -- sqlite
//! ```
//!
//! Servers: `SQLBROKER_PG_URL` (default `postgres://postgres@127.0.0.1:5432/test`),
//! `SQLBROKER_MYSQL_URL` (default `mysql://root@127.0.0.1:3306/test`); a server that does not
//! answer is skipped with a line saying so. SQLite runs on a file in the temporary directory.

#[path = "support/mod.rs"]
mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sqlbroker::{Broker, Delivery, Message, Table};
use support::{drop_table, env_num};

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

/// The `q` quantile of `v` (sorted in place).
fn quantile(v: &mut [Duration], q: f64) -> Duration {
    v.sort_unstable();
    let i = ((v.len() as f64 - 1.0) * q).round() as usize;
    v.get(i).copied().unwrap_or_default()
}

/// Publishes `jobs` jobs into `t` (and, with dependencies, a callback after each settles);
/// burns them down acking one by one; the rate (jobs/s, from the start to the last job's ack)
/// and, with a callback, its delay from the last job's ack.
fn fan_out(
    broker: &Broker,
    t: &Table,
    jobs: usize,
    callback: bool,
) -> (f64, Option<Duration>, Option<Duration>) {
    let mut ids = Vec::with_capacity(jobs);
    let mut batch = Vec::with_capacity(500);
    for i in 0..jobs {
        batch.push(Message::new(b"job".to_vec()));
        if batch.len() == 500 || i + 1 == jobs {
            // Ids come from single publishes only: a group of 500 in one transaction.
            let made = broker
                .publish_group(|g| {
                    std::mem::take(&mut batch)
                        .into_iter()
                        .map(|m| g.publish(t, m))
                        .collect::<sqlbroker::Result<Vec<i64>>>()
                })
                .unwrap();
            ids.extend(made);
        }
    }
    let mut published_in = None;
    let cb = callback.then(|| {
        let mut m = Message::new(b"callback".to_vec());
        for id in &ids {
            m = m.after_settled(*id);
        }
        let at = Instant::now();
        let id = broker.publish(t, m).unwrap();
        published_in = Some(at.elapsed());
        id
    });
    let started = Instant::now();
    let sub = broker
        .subscription(t)
        .workers(4)
        .batch_size(100)
        .start()
        .unwrap();
    let done = AtomicUsize::new(0);
    let last_ack = Mutex::new(None::<Instant>);
    let cb_at = Mutex::new(None::<Instant>);
    std::thread::scope(|s| {
        for _ in 0..4 {
            let (sub, done, last_ack, cb_at) = (&sub, &done, &last_ack, &cb_at);
            s.spawn(move || loop {
                let finished = done.load(Ordering::Relaxed) >= jobs;
                if finished && (cb.is_none() || cb_at.lock().unwrap().is_some()) {
                    return;
                }
                // A callback that never comes ends the round (reported as missing).
                let waited = last_ack.lock().unwrap().map(|l| l.elapsed());
                if finished && waited.is_some_and(|w| w > Duration::from_secs(30)) {
                    return;
                }
                let Ok(d) = sub.next_delivery_timeout(Duration::from_millis(100)) else {
                    continue;
                };
                if Some(d.id()) == cb {
                    *cb_at.lock().unwrap() = Some(Instant::now());
                    d.ack().unwrap();
                    continue;
                }
                d.ack().unwrap();
                let at = Instant::now();
                let mut last = last_ack.lock().unwrap();
                *last = Some(last.map_or(at, |l: Instant| l.max(at)));
                drop(last);
                done.fetch_add(1, Ordering::Relaxed);
            });
        }
    });
    let last = last_ack.lock().unwrap().unwrap();
    let rate = jobs as f64 / (last - started).as_secs_f64();
    sub.shutdown(Duration::from_secs(30)).unwrap();
    let delay = cb_at
        .lock()
        .unwrap()
        .map(|at| at.saturating_duration_since(last));
    (rate, delay, published_in)
}

/// A chain of `links` jobs, each after the one before, worked by one handler; each link's
/// delay from the ack of the one before.
fn chain(broker: &Broker, t: &Table, links: usize) -> Vec<Duration> {
    broker
        .publish_group(|g| {
            let mut prev = g.publish(t, Message::new(b"link".to_vec()))?;
            for _ in 1..links {
                prev = g.publish(t, Message::new(b"link".to_vec()).after(prev))?;
            }
            Ok(())
        })
        .unwrap();
    let sub = broker.subscription(t).start().unwrap();
    let mut delays = Vec::with_capacity(links);
    let mut acked: Option<Instant> = None;
    for _ in 0..links {
        let d: Delivery = sub.next_delivery_timeout(Duration::from_secs(30)).unwrap();
        if let Some(at) = acked {
            delays.push(at.elapsed());
        }
        d.ack().unwrap();
        acked = Some(Instant::now());
    }
    sub.shutdown(Duration::from_secs(30)).unwrap();
    delays
}

fn table(name: String, dependencies: bool) -> Table {
    let t = Table::new(name).lease(Duration::from_secs(30));
    match dependencies {
        true => t.dependencies(),
        false => t,
    }
}

fn run(db: &str, url: &str, wanted: &dyn Fn(&str) -> bool) {
    let Some(broker) = support::connect(db, url) else {
        return;
    };
    let prefix = format!("compose_{}", std::process::id());
    let (fan, rounds) = (env_num("COMPOSE_FAN", 10_000), env_num("COMPOSE_ROUNDS", 5));
    let waits = table(format!("{prefix}_waits"), true);
    let plain = table(format!("{prefix}_plain"), false);
    let mut made = Vec::new();
    for t in [&waits, &plain] {
        broker.create_table(t).unwrap();
        made.push(t.name().to_string());
    }
    if wanted(&format!("{db}/fanout")) || wanted(&format!("{db}/cost")) {
        let (mut delays, mut rates, mut plain_rates) = (Vec::new(), Vec::new(), Vec::new());
        let mut publishes = Vec::new();
        for _ in 0..rounds {
            let (rate, delay, published) = fan_out(&broker, &waits, fan, true);
            rates.push(rate);
            delays.push(delay.expect("the callback did not run within 30 s"));
            publishes.extend(published);
            plain_rates.push(fan_out(&broker, &plain, fan, false).0);
        }
        let each: Vec<String> = publishes.iter().map(|d| ms(*d)).collect();
        println!(
            "{db}/publish 1 callback after {fan} jobs: p50 {}, worst {} (rounds: {})",
            ms(quantile(&mut publishes, 0.5)),
            ms(quantile(&mut publishes, 1.0)),
            each.join(", ")
        );
        let each: Vec<String> = delays.iter().map(|d| ms(*d)).collect();
        let worst = delays.iter().max().copied().unwrap_or_default();
        println!(
            "{db}/fanout {fan} jobs, 1 callback: delay p50 {}, worst {} (rounds: {})",
            ms(quantile(&mut delays, 0.5)),
            ms(worst),
            each.join(", ")
        );
        let best = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
        println!(
            "{db}/cost burn-down with dependencies {:.0} jobs/s, plain {:.0} jobs/s: x{:.2} of \
             plain (runs: {:?} / {:?})",
            best(&rates),
            best(&plain_rates),
            best(&rates) / best(&plain_rates),
            rates.iter().map(|r| r.round()).collect::<Vec<_>>(),
            plain_rates.iter().map(|r| r.round()).collect::<Vec<_>>(),
        );
    }
    if wanted(&format!("{db}/chain")) {
        let links = env_num("COMPOSE_CHAIN", 1_000);
        let mut delays = chain(&broker, &waits, links);
        println!(
            "{db}/chain {links} links: delay p50 {}, p99 {}, max {}",
            ms(quantile(&mut delays, 0.5)),
            ms(quantile(&mut delays, 0.99)),
            ms(quantile(&mut delays, 1.0))
        );
    }
    for name in made {
        drop_table(db, url, &name);
    }
}

fn main() {
    let filters = support::filters();
    let wanted = |id: &str| support::wanted(&filters, id);
    for (db, url) in &support::databases("compose") {
        if wanted(db) || filters.iter().any(|f| f.starts_with(&format!("{db}/"))) {
            run(db, url, &wanted);
        }
    }
    support::remove_sqlite("compose");
}
