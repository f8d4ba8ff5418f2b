//! The promise checker (PROMISES.md): for every database x form, seeded random histories of a
//! producer, three brokers (two in this process, describing the table's limits in opposite
//! orders; one in a child process the faults kill and start again), an operator (cancel,
//! pause and resume, limits set, raised, lowered and lifted, run now, dead letters requeued and
//! purged, a row deleted by hand) and faults (sessions ended, the worker process killed, a
//! snapshot held open), then every promise a history can show broken checked over what
//! happened (`promises/check.rs`). A failure prints the seed, the promise and the stretch of
//! history that breaks it.
//!
//! - `PROMISES_SEED=<n>`: run that seed only (on every database x form, or those named by
//!   `PROMISES_ONLY=postgres_lease,mysql_advisory`).
//! - `PROMISES_SEEDS=<n>`: seeds per database x form besides the fixed ones (default 1, a random
//!   seed, printed); `PROMISES_SECS=<s>`: each history's active time (default 4, or 600 with
//!   `PROMISES_STEPS`); `PROMISES_STEPS=<n>`: each history ends its active part once the producer
//!   has made `n` publishes (or its seconds are up); they make a soak on a quiet machine
//!   (RELIABILITY.md).
//!
//! The binary's `zz_` name runs it after the other test binaries; it runs with
//! `SQLBROKER_SLOW_TESTS=1` or `SQLBROKER_REQUIRE_SERVERS=1` (as in `.ci/run`), else skips
//! loudly.

mod common;
mod promises;

use std::time::Duration;

use common::Db;
use sqlbroker::Form;

/// Seeds every run checks: one of each profile (1: FIFO groups, 2: flow control, 3: jobs that
/// compose; seed 3 also found a frozen worker starting a job another had acked).
const FIXED: &[u64] = &[1, 2, 3];

/// Seeds a soak found something with, kept for the cell it was found on (a history is not
/// replayed exactly, its timing being the machine's, but its table, choices and faults are).
/// PostgreSQL advisory 32228726: a claim decided before a silence ran after a pause made in it
/// (fixed: `runtime::wake`'s `a_failed_read_elsewhere_does_not_make_an_old_decision_fresh`);
/// MariaDB advisory 839770630: a process frozen between its claim's decision and its statement
/// (the checker's claim start); MariaDB advisory 355868076: an attempt spent by a take whose
/// answer a silence lost (the checker's P2); PostgreSQL lease 54939493: a requeue of every
/// dead letter between a dead letter's commit and its return (the checker's P3); PostgreSQL
/// row lock 38800878: a checkpoint committed by a worker killed before it wrote its line (the
/// checker's P19).
const FOUND: &[(&str, u64)] = &[
    ("postgres_advisory", 32228726),
    ("mysql_advisory", 839770630),
    ("mysql_advisory", 355868076),
    ("postgres_lease", 54939493),
    ("postgres_row_lock", 38800878),
];

/// The child process's entry: a worker when this process is one ([`promises::actors`]).
#[test]
fn promise_worker_process() {
    promises::actors::child_main();
}

/// `PROMISES_SECS` and `PROMISES_STEPS`.
fn budget() -> promises::Budget {
    let steps = std::env::var("PROMISES_STEPS")
        .ok()
        .and_then(|s| s.parse::<u64>().ok());
    let s = std::env::var("PROMISES_SECS")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .unwrap_or(if steps.is_some() { 600.0 } else { 4.0 });
    promises::Budget {
        secs: Duration::from_secs_f64(s),
        steps,
    }
}

/// The seeds to run on cell `name`: `PROMISES_SEED` alone, or the fixed ones, those a soak
/// found something with on it, and `PROMISES_SEEDS` random ones.
fn seeds(name: &str) -> Vec<u64> {
    if let Some(s) = std::env::var("PROMISES_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        return vec![s];
    }
    let extra = std::env::var("PROMISES_SEEDS")
        .ok()
        .and_then(|s| s.parse::<usize>().ok())
        .unwrap_or(1);
    let mut out = FIXED.to_vec();
    out.extend(FOUND.iter().filter(|(c, _)| *c == name).map(|(_, s)| *s));
    let base = common::ledger::now_micros() as u64;
    for i in 0..extra {
        out.push(
            base.wrapping_mul(6364136223846793005)
                .wrapping_add(i as u64)
                % 1_000_000_000,
        );
    }
    out
}

fn cell(db: Db, form: Form) {
    if !common::slow_suite("the promise checker") {
        return;
    }
    let name = format!(
        "{}_{}",
        format!("{db:?}").to_lowercase(),
        common::form_name(form)
    );
    if let Ok(only) = std::env::var("PROMISES_ONLY") {
        if !only.split(',').any(|o| o.trim() == name) {
            return;
        }
    }
    promises::quiet_handler_panics();
    let mut failed = Vec::new();
    for seed in seeds(&name) {
        let Some(out) = promises::run(db, form, seed, budget()) else {
            return;
        };
        println!(
            "{name}: {}",
            out.report.lines().take(2).collect::<Vec<_>>().join("; ")
        );
        assert!(out.jobs > 0, "seed {seed}: no job was published");
        if !out.broken.is_empty() {
            eprintln!("\n===== {name}: {}", out.report);
            failed.push(seed);
        }
    }
    assert!(
        failed.is_empty(),
        "{name}: seeds {failed:?} broke promises (reports above)"
    );
}

#[test]
fn sqlite_lease() {
    cell(Db::Sqlite, Form::Lease);
}

#[test]
fn sqlite_advisory() {
    cell(Db::Sqlite, Form::AdvisoryLock);
}

#[test]
fn postgres_row_lock() {
    cell(Db::Postgres, Form::RowLock);
}

#[test]
fn postgres_lease() {
    cell(Db::Postgres, Form::Lease);
}

#[test]
fn postgres_advisory() {
    cell(Db::Postgres, Form::AdvisoryLock);
}

#[cfg(feature = "mysql")]
#[test]
fn mysql_row_lock() {
    cell(Db::Mysql, Form::RowLock);
}

#[cfg(feature = "mysql")]
#[test]
fn mysql_lease() {
    cell(Db::Mysql, Form::Lease);
}

#[cfg(feature = "mysql")]
#[test]
fn mysql_advisory() {
    cell(Db::Mysql, Form::AdvisoryLock);
}
