//! The scale and memory checks of the lease headline configuration.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sqlbroker::{Broker, Table};

use crate::args::{headline_handlers, Cell, Form, Settings};
use crate::report::Runs;
use crate::sides::{library_run, raw_run, Db, RawConn};
use crate::util::{load_average, rss_mib};

/// Scale and memory checks of the lease headline configuration (PostgreSQL): the claim rate
/// over the first 10,000 jobs of a 10,000-row table against a `scale_rows` table, then a
/// burn-down of the whole large table with RSS sampled.
pub(crate) fn scale_checks(db: &dyn Db, big: &Table, set: &Settings) {
    let name = db.name();
    let cell = Cell {
        handlers: headline_handlers(),
        ..Cell::plain("lease_h32", Form::Lease, 4, 100)
    };
    let small = db.table(Form::Lease);
    let k = 10_000u64;
    if set.wants(&format!("{name}/scale")) {
        println!(
            "\n{name}/scale: claim rate over the first {k} jobs, workers 4, batch 100, {} handlers \
             (load {})",
            cell.handlers,
            load_average()
        );
        db.clear(big);
        db.fill_fast(big, set.scale_rows);
        let acked = AtomicU64::new(0);
        let big_db = BigTable { db, big };
        let (mut l_small, mut l_big, mut r_small, mut r_big) = (
            Runs::default(),
            Runs::default(),
            Runs::default(),
            Runs::default(),
        );
        for _ in 0..set.rounds {
            db.clear(small);
            db.fill_fast(small, k);
            l_small.0.push(library_run(db, &cell, k, &acked).0);
            let before = db.count(big);
            l_big.0.push(library_run(&big_db, &cell, k, &acked).0);
            db.clear(small);
            db.fill_fast(small, k);
            r_small.0.push(raw_run(db, Form::Lease, 4, 100, k));
            r_big.0.push(raw_run(&big_db, Form::Lease, 4, 100, k));
            // Top the large table up again.
            let after = db.count(big);
            db.fill_fast(big, before.saturating_sub(after));
        }
        db.clear(small);
        let rows = db.count(big);
        println!(
            "  library: {:>8.0} jobs/s with {k} ready, {:>8.0} with {rows} ready: ratio {:.2}   ({} | {})",
            l_small.best(),
            l_big.best(),
            l_big.best() / l_small.best(),
            l_small.list(),
            l_big.list()
        );
        println!(
            "  raw:     {:>8.0} jobs/s with {k} ready, {:>8.0} with {rows} ready: ratio {:.2}   ({} | {})",
            r_small.best(),
            r_big.best(),
            r_big.best() / r_small.best(),
            r_small.list(),
            r_big.list()
        );
    }
    if set.wants(&format!("{name}/memory")) {
        let rows = db.count(big);
        let n = if rows == 0 {
            db.fill_fast(big, set.scale_rows);
            set.scale_rows
        } else {
            rows.min(set.scale_rows)
        };
        println!(
            "\n{name}/memory: burn-down of {n} jobs, workers 4, batch 100, {} handlers, plain ack \
             (load {})",
            cell.handlers,
            load_average()
        );
        let acked = AtomicU64::new(0);
        let stop = AtomicBool::new(false);
        let big_db = BigTable { db, big };
        let before = rss_mib();
        let start = Instant::now();
        // (jobs acked, RSS MiB, seconds since start), every 100 ms.
        let (rate, samples) = std::thread::scope(|s| {
            let sampler = s.spawn(|| {
                let mut samples: Vec<(u64, f64, f64)> = Vec::new();
                loop {
                    let stopped = stop.load(Ordering::Relaxed);
                    let t = start.elapsed().as_secs_f64();
                    samples.push((acked.load(Ordering::Relaxed), rss_mib(), t));
                    if stopped {
                        break samples;
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            });
            let (rate, _) = library_run(&big_db, &cell, n, &acked);
            stop.store(true, Ordering::Relaxed);
            (rate, sampler.join().unwrap())
        });
        let peak = samples.iter().map(|s| s.1).fold(0.0, f64::max);
        let at = |pct: u64| samples.iter().find(|s| s.0 >= n * pct / 100).copied();
        let rss: Vec<String> = [10, 25, 50, 75, 90]
            .iter()
            .map(|&p| format!("{p}% {:.1}", at(p).map_or(0.0, |s| s.1)))
            .collect();
        println!(
            "  {rate:.0} jobs/s overall; RSS MiB: before {before:.1}, {}, after {:.1}; peak {peak:.1} \
             ({} samples)",
            rss.join(", "),
            rss_mib(),
            samples.len()
        );
        let mut deciles = Vec::new();
        let mut prev = (0u64, 0.0f64);
        for p in 1..=10u64 {
            if let Some((done, _, t)) = at(p * 10) {
                deciles.push(format!("{:.0}", (done - prev.0) as f64 / (t - prev.1)));
                prev = (done, t);
            }
        }
        println!("  jobs/s per tenth of the burn-down: {}", deciles.join(" "));
    }
    db.clear(big);
}

/// `db` with its lease table replaced by `big` (the scale checks).
pub(crate) struct BigTable<'a> {
    pub(crate) db: &'a dyn Db,
    pub(crate) big: &'a Table,
}

impl Db for BigTable<'_> {
    fn name(&self) -> &str {
        self.db.name()
    }
    fn broker(&self) -> &Broker {
        self.db.broker()
    }
    fn table(&self, form: Form) -> &Table {
        match form {
            Form::Lease => self.big,
            f => self.db.table(f),
        }
    }
    fn clear(&self, t: &Table) {
        self.db.clear(t)
    }
    fn raw_on(&self, t: &Table, form: Form, batch: usize) -> Box<dyn RawConn + '_> {
        self.db.raw_on(t, form, batch)
    }
    fn count(&self, t: &Table) -> u64 {
        self.db.count(t)
    }
    fn index_blocks(&self, t: &Table) -> Option<u64> {
        self.db.index_blocks(t)
    }
}
