//! Runs, rows and their printing.

use std::io::Write;
use std::sync::atomic::Ordering;

use crate::args::{Cell, Settle};
use crate::util::load_average;
use crate::LAST_BATCH_MEAN;

/// One side's runs of a cell, jobs/s.
#[derive(Default)]
pub(crate) struct Runs(pub(crate) Vec<f64>);

impl Runs {
    pub(crate) fn best(&self) -> f64 {
        self.0.iter().copied().fold(0.0, f64::max)
    }

    pub(crate) fn list(&self) -> String {
        self.0
            .iter()
            .map(|r| format!("{r:.0}"))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// A finished cell, for the summary.
pub(crate) struct Row {
    pub(crate) id: String,
    pub(crate) cell: Cell,
    pub(crate) n: u64,
    pub(crate) library: Runs,
    pub(crate) raw: Runs,
    pub(crate) pgbench: Option<Runs>,
    /// Raw transactions retried after a deadlock (MySQL).
    pub(crate) retries: u64,
    /// Per library run: the share of handler time spent settling.
    pub(crate) settling: Vec<f64>,
    /// Client CPU per job (us) of each library run and each raw run: this process's
    /// `getrusage` over the run divided by its jobs.
    pub(crate) cpu: (Vec<f64>, Vec<f64>),
    /// Context switches per job of each library run and each raw run (the same `getrusage`).
    pub(crate) switches: (Vec<f64>, Vec<f64>),
}

impl Row {
    /// The settling share of the best library run.
    pub(crate) fn settling(&self) -> f64 {
        let best = self.library.best();
        self.library
            .0
            .iter()
            .position(|r| *r == best)
            .and_then(|i| self.settling.get(i).copied())
            .unwrap_or(0.0)
    }
}

pub(crate) fn print_header() {
    println!(
        "{:<30} {:>7} {:>6} {:>11} {:>7} {:>11} {:>6} {:>11} {:>7}   runs (library | raw | pgbench)",
        "cell", "threads", "jobs", "library/s", "settle", "raw/s", "l/raw", "pgbench/s", "l/pgb"
    );
}

pub(crate) fn print_row(r: &Row) {
    let (pgb, lp, pgruns) = match &r.pgbench {
        Some(p) if p.best() > 0.0 => (
            format!("{:.0}", p.best()),
            format!("{:.2}", r.library.best() / p.best()),
            format!(" | {}", p.list()),
        ),
        _ => ("-".into(), "-".into(), String::new()),
    };
    println!(
        "{:<30} {:>7} {:>6} {:>11.0} {:>6.0}% {:>11.0} {:>6.2} {:>11} {:>7}   {} | {}{}",
        r.id,
        r.cell.handlers,
        r.n,
        r.library.best(),
        r.settling() * 100.0,
        r.raw.best(),
        r.library.best() / r.raw.best(),
        pgb,
        lp,
        r.library.list(),
        r.raw.list(),
        pgruns
    );
    let us = |v: &[f64]| {
        v.iter()
            .map(|c| format!("{c:.2}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    println!(
        "{:<30} (client CPU per job, us: library {} | raw {}; context switches per job: \
         library {} | raw {})",
        "",
        us(&r.cpu.0),
        us(&r.cpu.1),
        us(&r.switches.0),
        us(&r.switches.1)
    );
    if r.retries > 0 {
        println!("{:<30} (raw: {} deadlocks retried)", "", r.retries);
    }
    if r.cell.settle == Settle::AckAll {
        println!(
            "{:<30} (library: {:.1} deliveries per next_batch(100) in the last run)",
            "",
            LAST_BATCH_MEAN.load(Ordering::Relaxed) as f64 / 100.0
        );
    }
    let _ = std::io::stdout().flush();
}

/// The summary of every row, as a markdown table.
pub(crate) fn print_summary(all: &[Row]) {
    if all.is_empty() {
        return;
    }
    println!(
        "\nSummary (markdown), load average now {}:\n",
        load_average()
    );
    println!(
        "| cell | handler threads | jobs per run | library jobs/s | in settle | raw jobs/s | **library / raw** | pgbench jobs/s | library / pgbench |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in all {
        let (p, lp) = match &r.pgbench {
            Some(p) if p.best() > 0.0 => (
                format!("{:.0}", p.best()),
                format!("{:.2}", r.library.best() / p.best()),
            ),
            _ => ("".into(), "".into()),
        };
        println!(
            "| {} | {} | {} | {:.0} | {:.0}% | {:.0} | **{:.2}** | {} | {} |",
            r.id,
            r.cell.handlers,
            r.n,
            r.library.best(),
            r.settling() * 100.0,
            r.raw.best(),
            r.library.best() / r.raw.best(),
            p,
            lp
        );
    }
}
