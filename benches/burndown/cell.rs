//! Running a cell (pilot, alternating rounds) and a database's cells.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::args::{Cell, Settings};
use crate::pgbench::PgBench;
use crate::report::{print_row, Row, Runs};
use crate::sides::{library_run, publish, raw_run, Db};
use crate::util::{usage, Usage};
use crate::RAW_RETRIES;

/// Runs one cell: pilots, then `rounds` alternations of library, raw (and pgbench).
pub(crate) fn run_cell(
    db: &dyn Db,
    cell: &Cell,
    set: &Settings,
    pgbench: Option<&mut PgBench>,
) -> Row {
    let t = db.table(cell.form);
    let acked = AtomicU64::new(0);
    // Each side's rate and its client use per job (this process's, over the run).
    let lib = |n: u64| {
        db.clear(t);
        publish(db.broker(), t, n, 0);
        let since = usage();
        let (rate, share) = library_run(db, cell, n, &acked);
        (rate, share, per_job(since, n))
    };
    let raw = |n: u64| {
        db.clear(t);
        publish(db.broker(), t, n, 0);
        let since = usage();
        let rate = raw_run(db, cell.form, cell.workers, cell.batch, n);
        (rate, per_job(since, n))
    };
    let n = match set.jobs {
        Some(n) => n,
        None => {
            let pilot = ((cell.workers * cell.batch * 10) as u64).clamp(300, 8_000);
            let (l, r) = (lib(pilot).0, raw(pilot).0);
            let (slower, faster) = (l.min(r), l.max(r));
            // The slower side runs about `secs`, the faster at least a quarter of it (up to
            // four times `secs` for the slower).
            let n = (slower * set.secs).max((faster * set.secs / 4.0).min(slower * set.secs * 4.0));
            (n as u64).clamp(2_000, 400_000) / 100 * 100
        }
    };
    let mut row = Row {
        id: cell.id(db.name()),
        cell: *cell,
        n,
        library: Runs::default(),
        raw: Runs::default(),
        pgbench: None,
        retries: 0,
        settling: Vec::new(),
        cpu: (Vec::new(), Vec::new()),
        switches: (Vec::new(), Vec::new()),
    };
    RAW_RETRIES.store(0, Ordering::Relaxed);
    let mut pgbench = pgbench.and_then(|p| cell.pgbench().map(|s| (p, s)));
    for _ in 0..set.rounds {
        let (rate, share, (cpu, switches)) = lib(n);
        row.library.0.push(rate);
        row.settling.push(share);
        row.cpu.0.push(cpu);
        row.switches.0.push(switches);
        let (rate, (cpu, switches)) = raw(n);
        row.raw.0.push(rate);
        row.cpu.1.push(cpu);
        row.switches.1.push(switches);
        if let Some((p, (script, rows, clients))) = pgbench.as_mut() {
            let runs = row.pgbench.get_or_insert_with(Runs::default);
            match p.run(script, *clients, set.pgbench_secs, *rows) {
                Ok(rate) => runs.0.push(rate),
                Err(e) => eprintln!("pgbench {script}: {e}"),
            }
        }
    }
    db.clear(t);
    row.retries = RAW_RETRIES.load(Ordering::Relaxed);
    print_row(&row);
    row
}

/// Runs every wanted cell of `db`, then (PostgreSQL) the scale and memory checks.
pub(crate) fn run_db(
    db: &dyn Db,
    cells: &[Cell],
    set: &Settings,
    mut pgbench: Option<PgBench>,
) -> Vec<Row> {
    let mut rows = Vec::new();
    for cell in cells {
        let id = cell.id(db.name());
        if !set.wants(&id) {
            continue;
        }
        rows.push(run_cell(db, cell, set, pgbench.as_mut()));
    }
    rows
}

/// This process's CPU (microseconds) and context switches since `since`, per job of `n`.
fn per_job(since: Usage, n: u64) -> (f64, f64) {
    let now = usage();
    let n = n.max(1) as f64;
    (
        (now.cpu - since.cpu).as_secs_f64() * 1e6 / n,
        now.switches.saturating_sub(since.switches) as f64 / n,
    )
}
