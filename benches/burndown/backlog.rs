//! `<db>/backlog` (issue 18, target 1): does a long backlog drain at an even rate? The lease
//! headline configuration (workers 4, batch 100, `BURNDOWN_HEADLINE_HANDLERS` handlers, plain
//! `ack`) burns down `BURNDOWN_BACKLOG_ROWS` jobs (default 1,000,000) with the jobs acked
//! sampled every 100 ms, and `BURNDOWN_BACKLOG_SHORT` jobs (default 30,000), alternating (short,
//! long, short, ..; `BURNDOWN_ROUNDS` long runs). Prints the rate of each tenth of the long
//! burn-down, last tenth / first tenth, and the long run's overall rate / the best short run's.
//! Runs only when a filter names it (it takes minutes).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sqlbroker::Table;

use crate::args::{headline_handlers, Cell, Form, Settings};
use crate::report::Runs;
use crate::scale::BigTable;
use crate::sides::{library_run, Db};
use crate::util::load_average;

/// Whether a filter names `<db>/backlog` (an empty filter list does not).
pub(crate) fn wanted(set: &Settings, db: &str) -> bool {
    let id = format!("{db}/backlog");
    set.filters.iter().any(|f| id.contains(f.as_str()))
}

pub(crate) fn run(db: &dyn Db, big: &Table, set: &Settings) {
    let var = |name: &str, default: u64| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(default)
    };
    let long = var("BURNDOWN_BACKLOG_ROWS", 1_000_000);
    let short = var("BURNDOWN_BACKLOG_SHORT", 30_000);
    let name = db.name();
    let cell = Cell {
        handlers: headline_handlers(),
        ..Cell::plain("lease_h32", Form::Lease, 4, 100)
    };
    println!(
        "\n{name}/backlog: burn-downs of {short} and {long} jobs, workers 4, batch 100, {} handlers, \
         plain ack (load {})",
        cell.handlers,
        load_average()
    );
    let small = db.table(Form::Lease);
    let acked = AtomicU64::new(0);
    let big_db = BigTable { db, big };
    let mut shorts = Runs::default();
    let short_run = || {
        db.clear(small);
        db.fill_fast(small, short);
        let rate = library_run(db, &cell, short, &acked).0;
        println!("  {short} jobs: {rate:.0} jobs/s (load {})", load_average());
        rate
    };
    shorts.0.push(short_run());
    for _ in 0..set.rounds {
        db.clear(big);
        let filled = Instant::now();
        db.fill_fast(big, long);
        let fill = filled.elapsed();
        let (rate, tenths) = sampled(&big_db, &cell, long, &acked);
        let (first, last) = (
            tenths.first().map_or(0.0, |t| t.0),
            tenths.last().map_or(0.0, |t| t.0),
        );
        let list: Vec<String> = tenths.iter().map(|r| format!("{:.0}", r.0)).collect();
        shorts.0.push(short_run());
        println!(
            "  {long} jobs: {rate:.0} jobs/s overall (filled in {:.1} s); per tenth: {}",
            fill.as_secs_f64(),
            list.join(" ")
        );
        if tenths.iter().all(|t| t.1.is_some()) {
            let blocks: Vec<String> = tenths
                .iter()
                .map(|t| format!("{:.2}", t.1.unwrap_or(0.0)))
                .collect();
            println!(
                "  ready-index blocks read per job, per tenth: {}",
                blocks.join(" ")
            );
        }
        println!(
            "  => last tenth / first tenth {:.2}; {long} / {short} jobs {:.2} (best short run \
             {:.0}; short runs {})",
            last / first,
            rate / shorts.best(),
            shorts.best(),
            shorts.list()
        );
    }
    db.clear(small);
    db.clear(big);
}

/// A library burn-down of `n` jobs with the jobs acked (and the blocks of the ready index
/// read, where the database tells) sampled every 100 ms: the overall rate, and per tenth the
/// rate and the index blocks read per job.
fn sampled(db: &dyn Db, cell: &Cell, n: u64, acked: &AtomicU64) -> (f64, Vec<(f64, Option<f64>)>) {
    let stop = AtomicBool::new(false);
    let t = db.table(cell.form);
    let start = Instant::now();
    let (rate, samples) = std::thread::scope(|s| {
        let sampler = s.spawn(|| {
            let mut samples: Vec<(u64, f64, Option<u64>)> = Vec::new();
            loop {
                let stopped = stop.load(Ordering::Relaxed);
                samples.push((
                    acked.load(Ordering::Relaxed),
                    start.elapsed().as_secs_f64(),
                    db.index_blocks(t),
                ));
                if stopped {
                    break samples;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        let (rate, _) = library_run(db, cell, n, acked);
        stop.store(true, Ordering::Relaxed);
        (rate, sampler.join().unwrap())
    });
    let at = |pct: u64| samples.iter().find(|s| s.0 >= n * pct / 100).copied();
    let mut tenths = Vec::new();
    let mut prev = samples.first().copied().unwrap_or((0, 0.0, None));
    for p in 1..=10u64 {
        if let Some(now) = at(p * 10) {
            let jobs = (now.0 - prev.0) as f64;
            let blocks = now
                .2
                .zip(prev.2)
                .map(|(b, a)| b.saturating_sub(a) as f64 / jobs);
            tenths.push((jobs / (now.1 - prev.1), blocks));
            prev = now;
        }
    }
    (rate, tenths)
}
