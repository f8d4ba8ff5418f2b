//! Each form's burn-down while another session holds a snapshot open (issue 28, item 1): an
//! analytics query, a `pg_dump` or a forgotten `BEGIN` holds back what vacuum (PostgreSQL) or
//! purge (MariaDB) may remove, and a claim that reads the ready index from its head walks every
//! row acked since.
//!
//! Per database (PostgreSQL, MariaDB) x form (row lock, lease, advisory): `SNAPSHOT_JOBS`
//! (default 60,000) jobs published, then burned down by a subscription of `SNAPSHOT_WORKERS`
//! (default 8) claim workers and as many handler threads, each looping
//! `next_delivery_timeout` + `ack`; once **plain**, once **held**: before the clock starts,
//! another session opens a `REPEATABLE READ` transaction and reads the table (PostgreSQL:
//! `BEGIN ISOLATION LEVEL REPEATABLE READ`; MariaDB: `START TRANSACTION WITH CONSISTENT
//! SNAPSHOT`), and keeps it open to the last ack. The sides alternate, `SNAPSHOT_ROUNDS`
//! (default 2) times; PostgreSQL's table is vacuumed before each run. Prints each run's rate
//! and the rate of each tenth of its jobs, then the best held rate as a ratio of the best
//! plain one, and the held runs' last tenth against their first.
//!
//! ```sh
//! cargo bench --bench snapshot                       # both servers, every form
//! cargo bench --bench snapshot -- postgres/row_lock  # cells whose id contains a filter
//! SNAPSHOT_JOBS=20000 SNAPSHOT_ROUNDS=3 cargo bench --bench snapshot -- mariadb
//! ```

// What the other benches share; this one uses part of it.
#[allow(dead_code)]
#[path = "support/mod.rs"]
mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlbroker::{Broker, Form, Message, Table};
use support::{drop_table, env_num, hold};

fn vacuum(db: &str, url: &str, table: &str) {
    if db == "postgres" {
        let mut c = postgres::Client::connect(url, postgres::NoTls).expect("connect");
        c.batch_execute(&format!("VACUUM {table}")).expect("vacuum");
    }
}

/// One burn-down of `jobs` jobs: the seconds it took and the rate of each tenth (jobs/s).
fn burn(broker: &Broker, t: &Table, jobs: usize, workers: usize) -> (f64, Vec<f64>) {
    for chunk in (0..jobs).collect::<Vec<_>>().chunks(500) {
        let msgs: Vec<Message> = chunk
            .iter()
            .map(|i| Message::new(b"x".to_vec()).set("k", format!("k{i}")))
            .collect();
        broker.publish_batch(t, msgs).expect("publish");
    }
    let acked = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let sub = broker
        .subscription(t)
        .workers(workers)
        .max_in_flight(workers)
        .start()
        .expect("start");
    let sub = Arc::new(sub);
    let handlers: Vec<_> = (0..workers)
        .map(|_| {
            let (sub, acked) = (sub.clone(), acked.clone());
            std::thread::spawn(move || {
                while acked.load(Ordering::Relaxed) < jobs {
                    if let Ok(d) = sub.next_delivery_timeout(Duration::from_millis(200)) {
                        d.ack().expect("ack");
                        acked.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    let mut marks = Vec::with_capacity(10);
    let mut next = 1;
    while next <= 10 {
        if acked.load(Ordering::Relaxed) * 10 >= jobs * next {
            marks.push(start.elapsed().as_secs_f64());
            next += 1;
        } else {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    for h in handlers {
        h.join().expect("handler");
    }
    let took = start.elapsed().as_secs_f64();
    if let Ok(sub) = Arc::try_unwrap(sub) {
        let _ = sub.shutdown(Duration::from_secs(10));
    }
    let tenth = jobs as f64 / 10.0;
    let mut prev = 0.0;
    let tenths = marks
        .iter()
        .map(|m| {
            let r = tenth / (m - prev).max(1e-6);
            prev = *m;
            r
        })
        .collect();
    (took, tenths)
}

fn main() {
    let filters = support::filters();
    let jobs = env_num("SNAPSHOT_JOBS", 60_000);
    let workers = env_num("SNAPSHOT_WORKERS", 8);
    let rounds = env_num("SNAPSHOT_ROUNDS", 2).max(1);
    let [_, pg, my] = support::databases("snapshot");
    for (db, url) in [pg, my] {
        for form in [Form::RowLock, Form::Lease, Form::AdvisoryLock] {
            let id = format!("{db}/{}", form.name().replace(' ', "_"));
            if !support::wanted(&filters, &id) {
                continue;
            }
            let broker = match Broker::builder(&url)
                .pool_size(2 * workers as u32 + 4)
                .build()
            {
                Ok(b) => b,
                Err(e) => {
                    println!("{id}: skipped, {db} does not answer: {e}");
                    break;
                }
            };
            let name = format!("bench_snap_{}_{}", std::process::id(), id.replace('/', "_"));
            let t = Table::new(&name).text_column("k");
            let t = match form {
                Form::Lease => t.lease(Duration::from_secs(30)),
                Form::AdvisoryLock => t.advisory_lock(format!("{name}-{{k}}")),
                _ => t,
            };
            broker.create_table(&t).expect("create table");
            let (mut best_plain, mut best_held) = (0f64, 0f64);
            let mut drift = Vec::new();
            for _ in 0..rounds {
                for held in [false, true] {
                    vacuum(db, &url, &name);
                    let snapshot = held.then(|| hold(db, &url, &name));
                    let (took, tenths) = burn(&broker, &t, jobs, workers);
                    drop(snapshot);
                    let rate = jobs as f64 / took;
                    let side = if held { "held" } else { "plain" };
                    let shown: Vec<String> = tenths.iter().map(|r| format!("{r:.0}")).collect();
                    println!("{id} {side}: {rate:.0} jobs/s; tenths {}", shown.join(" "));
                    if held {
                        best_held = best_held.max(rate);
                        if let (Some(first), Some(last)) = (tenths.first(), tenths.last()) {
                            drift.push(last / first);
                        }
                    } else {
                        best_plain = best_plain.max(rate);
                    }
                }
            }
            let drift: Vec<String> = drift.iter().map(|d| format!("{d:.2}")).collect();
            println!(
                "{id}: held x{:.2} of plain (best of {rounds} each); held last/first tenth {}",
                best_held / best_plain,
                drift.join(", ")
            );
            drop(broker);
            drop_table(db, &url, &name);
        }
    }
}
