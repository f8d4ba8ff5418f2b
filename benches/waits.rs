//! Jobs that wait for the world (issue 43), every cell in one process per database (compare
//! figures from one run):
//!
//! - **signal** (`<db>/signal same broker`, `<db>/signal other broker`): `SIGNAL_JOBS` (default
//!   300) lease jobs on a table with dependencies, each `after_signal("s<i>")`, worked by one
//!   subscription and one handler thread. The signals are sent one at a time; each delay is
//!   from the call of `Broker::signal` to the job reaching the handler, measured on the
//!   monotonic clock of this process. "same broker": the signal is sent by the subscription's
//!   own broker (its wake-up is in the process); "other broker": by a second broker on the same
//!   database (the subscription learns of it as it learns of another process's publish).
//!   Reports p50, p99 and the worst.
//! - **collect** (`<db>/collect`): `COLLECT_PROCS` (default 4) processes (this binary run again)
//!   each publish `COLLECT_EVENTS / COLLECT_PROCS` events (default 10,000 in all) over
//!   `COLLECT_KEYS` (default 100) keys, `collect(key, quiet 200 ms, max_wait 1 s)`, at a steady
//!   rate over `COLLECT_SECS` (default 5) seconds, while this process works the jobs. Checks
//!   that every event is in exactly one job, in its process's publish order within the job, and
//!   that no job holds events published further apart than `max_wait` (with a margin for the
//!   claim); reports jobs per key (events keep coming faster than `quiet`, so each job is
//!   due at its first event plus `max_wait`, rounded up to a whole second as every due time:
//!   1 to 2 s, so 3 to 5 jobs a key over 5 s) and events per job.
//!
//! ```sh
//! cargo bench --bench waits                 # SQLite, PostgreSQL and MariaDB
//! cargo bench --bench waits -- postgres     # cells whose id contains a filter
//! SIGNAL_JOBS=100 COLLECT_EVENTS=2000 cargo bench --bench waits -- sqlite
//! ```
//!
//! Servers: `SQLBROKER_PG_URL` (default `postgres://postgres@127.0.0.1:5432/test`),
//! `SQLBROKER_MYSQL_URL` (default `mysql://root@127.0.0.1:3306/test`); a server that does not
//! answer is skipped with a line saying so. SQLite runs on a file in the temporary directory.

#[path = "support/mod.rs"]
mod support;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use sqlbroker::{Broker, Message, Table};
use support::{drop_table, env_num};

const QUIET: Duration = Duration::from_millis(200);
const MAX_WAIT: Duration = Duration::from_secs(1);

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

/// The `q` quantile of `v` (sorted in place).
fn quantile(v: &mut [Duration], q: f64) -> Duration {
    v.sort_unstable();
    let i = ((v.len() as f64 - 1.0) * q).round() as usize;
    v.get(i).copied().unwrap_or_default()
}

fn signal_table(name: &str) -> Table {
    Table::new(name)
        .lease(Duration::from_secs(30))
        .dependencies()
}

fn collect_table(name: &str) -> Table {
    Table::new(name).lease(Duration::from_secs(30))
}

/// Sends `jobs` signals one at a time through `sender`; each delay from the call to the job's
/// arrival at the handler.
fn signal_delays(db: &str, url: &str, other: bool, jobs: usize) {
    let cell = format!(
        "{db}/signal {}",
        if other { "other broker" } else { "same broker" }
    );
    let Some(broker) = support::connect(&cell, url) else {
        return;
    };
    // A table of its own per cell: a signal is a latch kept a day, by table name.
    let name = format!("bench_waits_sig{}_{}", u8::from(other), std::process::id());
    let t = signal_table(&name);
    broker.create_table(&t).expect("create");
    for i in 0..jobs {
        broker
            .publish(
                &t,
                Message::new(i.to_string().into_bytes()).after_signal(format!("s{i}")),
            )
            .expect("publish");
    }
    let sender = match other {
        true => Broker::connect(url).expect("a second broker"),
        false => broker.clone(),
    };
    let sub = broker.subscription(&t).start().expect("subscribe");
    let (tx, rx) = crossbeam_channel::unbounded::<(usize, Instant)>();
    let mut delays = Vec::with_capacity(jobs);
    std::thread::scope(|s| {
        let sub = &sub;
        s.spawn(move || {
            while let Ok(d) = sub.next_delivery_timeout(Duration::from_secs(10)) {
                let at = Instant::now();
                let i: usize = std::str::from_utf8(d.payload()).unwrap().parse().unwrap();
                d.ack().expect("ack");
                if tx.send((i, at)).is_err() {
                    break;
                }
            }
        });
        for i in 0..jobs {
            let from = Instant::now();
            let released = sender.signal(&t, &format!("s{i}"), b"go").expect("signal");
            assert_eq!(released, 1, "signal s{i} released {released} jobs");
            let (got, at) = rx
                .recv_timeout(Duration::from_secs(10))
                .unwrap_or_else(|_| panic!("{cell}: job {i} never reached the handler"));
            assert_eq!(got, i, "{cell}: another job than the one signalled");
            delays.push(at.duration_since(from));
        }
        drop(rx);
        sub.close();
    });
    println!(
        "{cell} {jobs} signals one at a time: p50 {}, p99 {}, worst {}",
        ms(quantile(&mut delays, 0.5)),
        ms(quantile(&mut delays, 0.99)),
        ms(quantile(&mut delays, 1.0))
    );
    drop_table(db, url, &name);
}

/// A child process: publishes its share of events at a steady rate, each payload
/// `<proc>:<n>:<key>` (its own sequence number `n`), then exits.
fn child(url: &str, name: &str, proc_no: usize) {
    let events = env_num("COLLECT_EVENTS", 10_000) / env_num("COLLECT_PROCS", 4);
    let keys = env_num("COLLECT_KEYS", 100);
    let secs = env_num("COLLECT_SECS", 5) as f64;
    let broker = Broker::connect(url).expect("child connect");
    let t = collect_table(name);
    let start = Instant::now();
    for n in 0..events {
        let due = start + Duration::from_secs_f64(secs * n as f64 / events as f64);
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        let key = (n + proc_no) % keys;
        let payload = format!("{proc_no}:{n}:{key}");
        broker
            .publish(
                &t,
                Message::new(payload.into_bytes()).collect(format!("k{key}"), QUIET, MAX_WAIT),
            )
            .expect("publish an event");
    }
}

fn collect_cell(db: &str, url: &str) {
    let cell = format!("{db}/collect");
    let Some(broker) = support::connect(&cell, url) else {
        return;
    };
    let procs = env_num("COLLECT_PROCS", 4);
    let events = env_num("COLLECT_EVENTS", 10_000) / procs * procs;
    let name = format!("bench_waits_col_{}", std::process::id());
    let t = collect_table(&name);
    broker.create_table(&t).expect("create");
    let sub = broker.subscription(&t).start().expect("subscribe");
    let exe = std::env::current_exe().expect("this binary");
    let children: Vec<_> = (0..procs)
        .map(|p| {
            std::process::Command::new(&exe)
                .env("WAITS_CHILD", format!("{url}|{name}|{p}"))
                .spawn()
                .expect("a child")
        })
        .collect();
    // Every event seen: (proc, n) -> the job it came in.
    let mut seen: HashMap<(usize, usize), i64> = HashMap::with_capacity(events);
    let mut per_key: HashMap<String, usize> = HashMap::new();
    let mut sizes = Vec::new();
    let mut twice = 0usize;
    let mut out_of_order = 0usize;
    let deadline = Instant::now() + Duration::from_secs(120);
    while seen.len() + twice < events && Instant::now() < deadline {
        let Ok(d) = sub.next_delivery_timeout(Duration::from_secs(2)) else {
            continue;
        };
        let batch = d.collected().expect("collected");
        sizes.push(batch.len());
        let mut last: HashMap<usize, usize> = HashMap::new();
        let mut key = None;
        for e in &batch {
            let s = std::str::from_utf8(e).unwrap();
            let mut it = s.split(':').map(|x| x.parse::<usize>().unwrap());
            let (p, n, k) = (it.next().unwrap(), it.next().unwrap(), it.next().unwrap());
            key.get_or_insert(k);
            assert_eq!(key, Some(k), "{cell}: one job held two keys' events");
            if last.insert(p, n).is_some_and(|before| before > n) {
                out_of_order += 1;
            }
            if seen.insert((p, n), d.id()).is_some() {
                twice += 1;
            }
        }
        if let Some(k) = key {
            *per_key.entry(format!("k{k}")).or_default() += 1;
        }
        d.ack().expect("ack");
    }
    for mut c in children {
        let _ = c.wait();
    }
    sub.close();
    assert_eq!(twice, 0, "{cell}: events in two jobs");
    assert_eq!(
        out_of_order, 0,
        "{cell}: events out of publish order in a job"
    );
    assert_eq!(seen.len(), events, "{cell}: events lost");
    let jobs = sizes.len();
    let (kmin, kmax) = (
        per_key.values().min().copied().unwrap_or(0),
        per_key.values().max().copied().unwrap_or(0),
    );
    println!(
        "{cell} {events} events over {} keys from {procs} processes: every event in exactly one \
         job, in order; {jobs} jobs, {kmin}-{kmax} a key, {:.1} events a job (most {})",
        per_key.len(),
        events as f64 / jobs.max(1) as f64,
        sizes.iter().max().copied().unwrap_or(0)
    );
    drop_table(db, url, &name);
}

fn main() {
    if let Ok(role) = std::env::var("WAITS_CHILD") {
        let mut it = role.splitn(3, '|');
        let (url, name, p) = (it.next().unwrap(), it.next().unwrap(), it.next().unwrap());
        child(url, name, p.parse().unwrap());
        return;
    }
    let filters = support::filters();
    let jobs = env_num("SIGNAL_JOBS", 300);
    for (db, url) in &support::databases("waits") {
        if support::wanted(&filters, &format!("{db}/signal")) {
            signal_delays(db, url, false, jobs);
            signal_delays(db, url, true, jobs);
        }
        if support::wanted(&filters, &format!("{db}/collect")) {
            collect_cell(db, url);
        }
    }
    support::remove_sqlite("waits");
}
