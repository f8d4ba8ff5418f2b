//! Settings (environment, filters) and the matrix of cells.

pub(crate) struct Settings {
    pub(crate) filters: Vec<String>,
    pub(crate) secs: f64,
    pub(crate) jobs: Option<u64>,
    pub(crate) rounds: usize,
    pub(crate) pgbench_secs: u64,
    pub(crate) pgbench_dir: String,
    pub(crate) scale_rows: u64,
}

impl Settings {
    pub(crate) fn from_env() -> Settings {
        fn var<T: std::str::FromStr>(name: &str) -> Option<T> {
            std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
        }
        Settings {
            filters: std::env::args()
                .skip(1)
                .filter(|a| !a.starts_with('-'))
                .collect(),
            secs: var("BURNDOWN_SECS").unwrap_or(2.0),
            jobs: var("BURNDOWN_JOBS"),
            rounds: var("BURNDOWN_ROUNDS").unwrap_or(2usize).max(1),
            pgbench_secs: var("BURNDOWN_PGBENCH_SECS").unwrap_or(3),
            pgbench_dir: std::env::var("BURNDOWN_PGBENCH_DIR")
                .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/benches/pgbench").into()),
            scale_rows: var("BURNDOWN_SCALE_ROWS").unwrap_or(1_000_000),
        }
    }

    pub(crate) fn wants(&self, id: &str) -> bool {
        self.filters.is_empty() || self.filters.iter().any(|f| id.contains(f.as_str()))
    }

    /// Any filter names the database `db` (or none is given).
    pub(crate) fn wants_db(&self, db: &[&str]) -> bool {
        self.filters.is_empty()
            || self.filters.iter().any(|f| {
                db.iter()
                    .any(|d| f.starts_with(d) || d.starts_with(f.as_str()))
            })
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Form {
    RowLock,
    Lease,
    Advisory,
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Settle {
    /// `next_delivery_timeout` + `ack`, one by one.
    Ack,
    /// `next_batch(100, ..)` + `Delivery::ack_all`.
    AckAll,
    /// `next_delivery_timeout` + `ack`, one by one, with `AckMode::Deferred`
    /// ([`defer_within`]); the clock runs until `close` has written the last ack.
    Deferred,
}

/// The bound of the deferred-ack cells (`BURNDOWN_DEFER_MS`, default 10 ms).
pub(crate) fn defer_within() -> std::time::Duration {
    let ms = std::env::var("BURNDOWN_DEFER_MS")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(10u64)
        .clamp(1, 10_000);
    std::time::Duration::from_millis(ms)
}

#[derive(Clone, Copy)]
pub(crate) struct Cell {
    pub(crate) label: &'static str,
    pub(crate) form: Form,
    pub(crate) workers: usize,
    pub(crate) batch: usize,
    pub(crate) handlers: usize,
    pub(crate) settle: Settle,
}

impl Cell {
    pub(crate) fn plain(label: &'static str, form: Form, workers: usize, batch: usize) -> Cell {
        Cell {
            label,
            form,
            workers,
            batch,
            handlers: workers,
            settle: Settle::Ack,
        }
    }

    pub(crate) fn id(&self, db: &str) -> String {
        format!("{db}/{}/w{}/b{}", self.label, self.workers, self.batch)
    }

    /// The pgbench script this cell is compared with, rows per script transaction, and its
    /// clients. Durable plain acks from more handlers than claim workers (`lease_h32`) are
    /// compared with one row per commit from as many clients (`pg-commit1.sql`): the floor of
    /// any per-job durable ack, whatever the claim; the other cells with their claim protocol
    /// by hand from as many clients as claim workers.
    pub(crate) fn pgbench(&self) -> Option<(&'static str, u64, usize)> {
        if self.form == Form::Lease && self.settle == Settle::Ack && self.handlers > self.workers {
            return Some(("pg-commit1.sql", 1, self.handlers));
        }
        match (self.form, self.batch) {
            (Form::RowLock, 1) => Some(("pg-row_lock1.sql", 1, self.workers)),
            (Form::Lease, 1) => Some(("pg-lease1.sql", 1, self.workers)),
            (Form::Lease, 100) => Some(("pg-lease100.sql", 100, self.workers)),
            _ => None,
        }
    }
}

/// Handler threads of the lease headline cells (`BURNDOWN_HEADLINE_HANDLERS`, default 32; the
/// ids keep `h32`, the table's threads column shows the count).
pub(crate) fn headline_handlers() -> usize {
    std::env::var("BURNDOWN_HEADLINE_HANDLERS")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(32usize)
        .clamp(1, 1024)
}

/// The matrix of one database. Row lock and server advisory claim one row per claim whatever
/// the batch: batch 1 only.
pub(crate) fn cells(row_lock: bool, advisory_batches: &[usize]) -> Vec<Cell> {
    let mut out = Vec::new();
    if row_lock {
        for w in [1, 4, 8] {
            out.push(Cell::plain("row_lock", Form::RowLock, w, 1));
        }
    }
    for b in [1, 100] {
        for w in [1, 4, 8] {
            out.push(Cell::plain("lease", Form::Lease, w, b));
        }
    }
    out.push(Cell {
        handlers: headline_handlers(),
        ..Cell::plain("lease_h32", Form::Lease, 4, 100)
    });
    out.push(Cell {
        settle: Settle::AckAll,
        ..Cell::plain("lease_all", Form::Lease, 4, 100)
    });
    out.push(Cell {
        handlers: headline_handlers(),
        settle: Settle::Deferred,
        ..Cell::plain("lease_d32", Form::Lease, 4, 100)
    });
    out.push(Cell {
        settle: Settle::Deferred,
        ..Cell::plain("lease_d", Form::Lease, 4, 100)
    });
    for &b in advisory_batches {
        for w in [1, 4, 8] {
            out.push(Cell::plain("advisory", Form::Advisory, w, b));
        }
    }
    out
}
