//! Retention while claims run: what the elected maintainer's pruning costs the claims of the
//! same table, and how fast it prunes, in one process (compare ratios from one run, never
//! figures across runs):
//!
//! - A lease table keeping completed rows (`keep_completed`, an hour) gets `RETENTION_ROWS`
//!   (default 1,000,000) completed rows two hours old (published, then marked completed and
//!   aged by one `UPDATE`), and `RETENTION_JOBS` (default 20,000) ready rows.
//! - **quiet** (`<db>/retention quiet`, after one uncounted warm-up round): the ready rows burnt down by `workers(2)` claiming
//!   batches of 100 and 2 handler threads acking each batch (`next_batch` + `ack_all`), no
//!   maintainer running. Then the ready rows again and
//! - **pruning** (`<db>/retention pruning`): the same burn-down while a broker elected
//!   maintainer (`maintenance_every(10 s)`: its pass is paced for 10 s, then goes at full
//!   speed) prunes the old rows; the burn-down starts once the
//!   first batch is gone, and the cell says whether pruning still ran when it ended (the ratio
//!   means something only then). Then quiet once more; the ratio is to the mean of the quiet
//!   rounds.
//! - **prune** (`<db>/retention prune`): how long the maintainer took to delete every old row,
//!   and rows per second, claims running for part of it.
//!
//! ```sh
//! cargo bench --bench retention                      # SQLite, PostgreSQL and MariaDB
//! cargo bench --bench retention -- postgres          # one database
//! RETENTION_ROWS=200000 cargo bench --bench retention
//! ```
//!
//! The maintainer's lease row is one per database: the bench expires it by hand before its
//! maintainer runs (run it on a database no other maintainer uses). Servers as in the other
//! benches (`SQLBROKER_PG_URL`, `SQLBROKER_MYSQL_URL`); a server that does not answer is
//! skipped with a line saying so.

#[path = "support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use sqlbroker::{Broker, Delivery, Message, Table};
use support::{drop_table, env_num};

/// Runs `sql` on `db` at `url` with the database's own crate.
fn exec(db: &str, url: &str, sql: &str) {
    let done = match db {
        "postgres" => postgres::Client::connect(url, postgres::NoTls)
            .and_then(|mut c| c.batch_execute(sql))
            .map_err(|e| e.to_string()),
        "mariadb" => {
            use mysql::prelude::Queryable;
            mysql::Conn::new(mysql::Opts::from_url(url).unwrap())
                .and_then(|mut c| c.query_drop(sql))
                .map_err(|e| e.to_string())
        }
        _ => rusqlite::Connection::open(url.trim_start_matches("sqlite:"))
            .and_then(|c| c.execute_batch(sql))
            .map_err(|e| e.to_string()),
    };
    if let Err(e) = done {
        panic!("{db}: {sql}: {e}");
    }
}

/// MariaDB: waits (at most two minutes) until InnoDB's purge has caught up with the fill's
/// `UPDATE` of every row (its history list short again), else the first quiet round runs
/// beside that purge at a fraction of the later rounds' rate.
fn purged(db: &str, url: &str) {
    if db != "mariadb" {
        return;
    }
    use mysql::prelude::Queryable;
    let Ok(mut c) = mysql::Conn::new(mysql::Opts::from_url(url).unwrap()) else {
        return;
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    while Instant::now() < deadline {
        let len: Option<i64> = c
            .query_first(
                "SELECT `count` FROM information_schema.INNODB_METRICS \
                 WHERE name = 'trx_rseg_history_len'",
            )
            .ok()
            .flatten();
        match len {
            Some(n) if n > 1_000 => std::thread::sleep(Duration::from_millis(500)),
            _ => return,
        }
    }
}

/// The completed rows of `t` (`completed`), or its ready rows.
fn count(broker: &Broker, t: &Table, completed: bool) -> u64 {
    let stats = broker.stats(t).expect("stats");
    if completed {
        stats.completed.unwrap_or(0)
    } else {
        stats.ready
    }
}

fn two_hours_ago(db: &str) -> &'static str {
    match db {
        "postgres" => "now() - interval '2 hours'",
        "mariadb" => "UTC_TIMESTAMP() - INTERVAL 2 HOUR",
        _ => "CAST(strftime('%s','now') AS INTEGER) - 7200",
    }
}

fn publish(broker: &Broker, t: &Table, rows: usize) {
    let mut left = rows;
    while left > 0 {
        let n = left.min(1000);
        let batch: Vec<Message> = (0..n).map(|_| Message::new(b"x".to_vec())).collect();
        broker.publish_batch(t, batch).expect("publish");
        left -= n;
    }
}

/// Burns `jobs` ready rows down; jobs per second.
fn burn(broker: &Broker, t: &Table, jobs: usize) -> f64 {
    let sub = broker
        .subscription(t)
        .workers(2)
        .batch_size(100)
        .max_in_flight(400)
        .start()
        .expect("subscription");
    let started = Instant::now();
    let done = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                while done.load(std::sync::atomic::Ordering::Relaxed) < jobs {
                    let Ok(batch) = sub.next_batch(100, Duration::from_millis(200)) else {
                        continue;
                    };
                    let n = batch.len();
                    for r in Delivery::ack_all(batch) {
                        r.expect("ack");
                    }
                    done.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
                }
            });
        }
    });
    let rate = jobs as f64 / started.elapsed().as_secs_f64();
    sub.shutdown(Duration::from_secs(10)).expect("shutdown");
    rate
}

fn run(db: &str, url: &str) {
    let rows = env_num("RETENTION_ROWS", 1_000_000);
    let jobs = env_num("RETENTION_JOBS", 20_000);
    let Some(_probe) = support::connect(&format!("{db}/retention"), url) else {
        return;
    };
    let broker = Broker::builder(url)
        .maintenance(false)
        .build()
        .expect("connect");
    let name = format!("bench_retention_{}", std::process::id());
    let t = Table::new(name.as_str())
        .lease(Duration::from_secs(30))
        .keep_completed(Duration::from_secs(3600));
    broker.create_table(&t).expect("create");

    let fill = Instant::now();
    publish(&broker, &t, rows);
    let at = two_hours_ago(db);
    exec(
        db,
        url,
        &format!("UPDATE {name} SET dead_at = {at}, completed_at = {at}"),
    );
    println!(
        "{db}/retention fill {rows} completed rows, two hours old, in {:.1} s",
        fill.elapsed().as_secs_f64()
    );
    purged(db, url);

    // A first burn-down warms the caches and the pools up: not counted (the first round ran
    // at half the later ones' rate on the servers).
    publish(&broker, &t, jobs);
    burn(&broker, &t, jobs);
    publish(&broker, &t, jobs);
    let quiet1 = burn(&broker, &t, jobs);
    println!("{db}/retention quiet {quiet1:.0} jobs/s");

    publish(&broker, &t, jobs);
    let old = count(&broker, &t, true);
    // The maintainer: the lease expired by hand, so it takes it within a renewal.
    let m = Broker::builder(url)
        .maintainer_lease(Duration::from_secs(3))
        .maintenance_every(Duration::from_secs(10))
        .build()
        .expect("connect the maintainer");
    let expire = match db {
        "postgres" => "UPDATE sqlbroker_maintainer SET expires_at = '1970-01-01 00:00:01+00'",
        "mariadb" => "UPDATE sqlbroker_maintainer SET expires_at = '1970-01-01 00:00:01'",
        _ => "UPDATE sqlbroker_maintainer SET expires_at = 1",
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while count(&broker, &t, true) == old {
        if Instant::now() > deadline {
            println!("{db}/retention pruning: the maintainer never started; skipped");
            drop_table(db, url, &name);
            return;
        }
        // Made by the maintainer's first round; expired until it holds the lease.
        if !m.is_maintainer() {
            let _ = std::panic::catch_unwind(|| exec(db, url, expire));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    // The prune's clock starts at its first batch, not at the election and the period before it.
    let prune_from = Instant::now();
    let pruning = burn(&broker, &t, jobs);
    // The rows acked by the three burn-downs are young: completed, kept.
    let young = 3 * jobs as u64;
    let still = count(&broker, &t, true) > young;
    while count(&broker, &t, true) > young {
        std::thread::sleep(Duration::from_millis(100));
    }
    let pruned = prune_from.elapsed();
    drop(m);
    publish(&broker, &t, jobs);
    let quiet2 = burn(&broker, &t, jobs);
    let quiet = (quiet1 + quiet2) / 2.0;
    println!(
        "{db}/retention pruning {pruning:.0} jobs/s x{:.2} of quiet ({quiet2:.0} jobs/s the \
         second quiet round){}",
        pruning / quiet,
        if still {
            ""
        } else {
            " (pruning ended before the burn-down did: not comparable)"
        }
    );
    println!(
        "{db}/retention prune {rows} rows in {:.1} s ({:.0} rows/s), claims running",
        pruned.as_secs_f64(),
        rows as f64 / pruned.as_secs_f64()
    );
    drop_table(db, url, &name);
}

fn main() {
    let filters = support::filters();
    for (db, url) in &support::databases("retention") {
        if support::wanted(&filters, db) {
            run(db, url);
        }
    }
    support::remove_sqlite("retention");
}
