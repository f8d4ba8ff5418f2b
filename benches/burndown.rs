//! Burn-down: what users see. For each database x form x claim workers (1, 4, 8) x batch
//! (1, 100), `N` jobs are published, then burned down to the last ack, once through the library
//! and once by a hand-written loop running the same protocol with the same SQL on the same
//! number of connections, alternating (library, raw, library, raw, ..). Each cell prints both
//! rates in jobs/s and their ratio. On PostgreSQL the hand-written pgbench scripts of
//! `benches/pgbench` (the figures the performance targets are measured against) run in the
//! same alternation and are printed beside.
//!
//! ```sh
//! cargo bench --bench burndown                          # everything (~20-25 min on two cores)
//! cargo bench --bench burndown -- postgres/lease        # cells whose id contains a filter
//! BURNDOWN_SECS=5 BURNDOWN_ROUNDS=3 cargo bench --bench burndown -- mariadb/
//! cargo bench --bench burndown --features metrics -- sqlite/   # with a recorder installed
//! ```
//!
//! Cell ids read `<db>/<form>/w<workers>/b<batch>`:
//!
//! - `row_lock`, `lease`, `advisory`: a subscription with `workers(w).batch_size(b)` and `w`
//!   handler threads, each looping `next_delivery_timeout` + `ack`. Row lock and server
//!   advisory deliveries hold a connection each (`max_in_flight` = `w`, the default); they claim
//!   one row per claim whatever the batch, so only batch 1 is run on the servers.
//! - `lease_h32`: the lease headline, `workers(4).batch_size(100)`, 32 handler threads, plain
//!   `ack` (grouped by the library's group commit).
//! - `lease_all`: the explicit batch path, `workers(4).batch_size(100)`, 4 handler threads each
//!   taking `next_batch(100, ..)` and settling it with `Delivery::ack_all`.
//!
//! The raw side: `w` threads, one connection each (opened and prepared before the clock starts),
//! each looping the protocol until the table is empty:
//!
//! - row lock: `BEGIN`; claim 1 `FOR UPDATE SKIP LOCKED`; `DELETE`; `COMMIT`;
//! - lease, batch `b`: the library's lease claim of `b` rows in one statement (MySQL: its claim
//!   transaction), then one token-fenced delete of the rows claimed: the table's single ack for
//!   one row, the library's grouped ack statement (`lease_ack_many`: the token and its ids)
//!   for more;
//! - advisory: candidates (the library's scan, `(batch x 4).max(32)`), try a key, take the row
//!   under it, delete, unlock (SQLite: the keys in a process-wide set, up to `b` rows taken per
//!   claim, then deleted one by one).
//!
//! SQLite writes of both sides are serialised by one in-process mutex per file, as the library
//! does (without it the raw threads would sleep in SQLite's busy handler).
//!
//! Rows are published with `Broker::publish_batch` (500 per call) into tables made by
//! `Broker::create_table`, outside the timed part; each run starts on an emptied table. The
//! library's clock runs from `SubscriptionBuilder::start` to the last ack; the raw clock from
//! the moment all threads are connected to the last thread's end.
//!
//! The job count per run is sized per cell: a short pilot of each side (which also warms up
//! connections and caches) measures both rates; `N` makes the slower side run about
//! `BURNDOWN_SECS` (default 2) and the faster at least a quarter of that (the slower then runs
//! at most four times as long), clamped to 2,000 .. 400,000. `BURNDOWN_JOBS` fixes `N`
//! instead.
//! `BURNDOWN_ROUNDS` (default 2) alternations are run; the table reports the **best** run of
//! each side (the least disturbed by other work on the machine) and every run beside.
//!
//! pgbench (PostgreSQL cells with a matching script, `BURNDOWN_PGBENCH_DIR`, default
//! `benches/pgbench` in this repository): the scripts and their schema are rewritten to a table of their own
//! (`burndown_jobs_<pid>`, so nothing else using `jobs` is disturbed), reloaded (400,000 rows)
//! before every run, `pgbench -n -f <script> -c <w> -j <w> -T <BURNDOWN_PGBENCH_SECS, default 3>`;
//! jobs/s = tps x rows per script. The table is dropped at the end.
//!
//! Scale and memory (PostgreSQL lease, ids `postgres/scale` and `postgres/memory`): the claim
//! rate of the lease headline configuration over the first 10,000 jobs of a table holding
//! 10,000 ready rows against one holding `BURNDOWN_SCALE_ROWS` (default 1,000,000; filled by
//! `INSERT .. SELECT generate_series`), alternating; then a burn-down of the whole large table
//! with the process's RSS (`VmRSS` of `/proc/self/status`) sampled every 100 ms.
//!
//! Servers: `SQLBROKER_PG_URL` (default `postgres://postgres@127.0.0.1:5432/test?sslmode=disable`: the raw side connects without TLS, so the library must too),
//! `SQLBROKER_MYSQL_URL` (default `mysql://root@127.0.0.1:3306/test`); a server that does not
//! answer is skipped with a loud banner. SQLite runs on a file in the temp directory with the
//! library's default pragmas (WAL, `synchronous = FULL`).

use std::collections::HashSet;
use std::hint::black_box;
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use sqlbroker::{Broker, Delivery, Message, NextError, Table};

/// The body of every message.
const PAYLOAD: [u8; 64] = [b'x'; 64];
/// Lease of the lease tables.
const LEASE: Duration = Duration::from_secs(60);
/// Messages per `publish_batch` when filling a table.
const PUBLISH_CHUNK: u64 = 500;
/// How long a run may make no progress before the bench gives up.
const STALL: Duration = Duration::from_secs(30);
/// Raw transactions rolled back and retried after a deadlock or lock wait timeout (MySQL).
static RAW_RETRIES: AtomicU64 = AtomicU64::new(0);
/// Rows per `next_batch` of the last `ack_all` library run, x 100.
static LAST_BATCH_MEAN: AtomicU64 = AtomicU64::new(0);
/// Connections of the library's pool: more than any cell's deliveries that hold one.
const POOL: u32 = 24;

// ---------------------------------------------------------------------------------------------
// Settings and cells

struct Settings {
    filters: Vec<String>,
    secs: f64,
    jobs: Option<u64>,
    rounds: usize,
    pgbench_secs: u64,
    pgbench_dir: String,
    scale_rows: u64,
}

impl Settings {
    fn from_env() -> Settings {
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

    fn wants(&self, id: &str) -> bool {
        self.filters.is_empty() || self.filters.iter().any(|f| id.contains(f.as_str()))
    }

    /// Any filter names the database `db` (or none is given).
    fn wants_db(&self, db: &[&str]) -> bool {
        self.filters.is_empty()
            || self.filters.iter().any(|f| {
                db.iter()
                    .any(|d| f.starts_with(d) || d.starts_with(f.as_str()))
            })
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Form {
    RowLock,
    Lease,
    Advisory,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Settle {
    /// `next_delivery_timeout` + `ack`, one by one.
    Ack,
    /// `next_batch(100, ..)` + `Delivery::ack_all`.
    AckAll,
}

#[derive(Clone, Copy)]
struct Cell {
    label: &'static str,
    form: Form,
    workers: usize,
    batch: usize,
    handlers: usize,
    settle: Settle,
}

impl Cell {
    fn plain(label: &'static str, form: Form, workers: usize, batch: usize) -> Cell {
        Cell {
            label,
            form,
            workers,
            batch,
            handlers: workers,
            settle: Settle::Ack,
        }
    }

    fn id(&self, db: &str) -> String {
        format!("{db}/{}/w{}/b{}", self.label, self.workers, self.batch)
    }

    /// The pgbench script this cell is compared with, and rows per script transaction.
    fn pgbench(&self) -> Option<(&'static str, u64)> {
        match (self.form, self.batch) {
            (Form::RowLock, 1) => Some(("pg-row_lock1.sql", 1)),
            (Form::Lease, 1) => Some(("pg-lease1.sql", 1)),
            (Form::Lease, 100) => Some(("pg-lease100.sql", 100)),
            _ => None,
        }
    }
}

/// Handler threads of the lease headline cells (`BURNDOWN_HEADLINE_HANDLERS`, default 32; the
/// ids keep `h32`, the table's threads column shows the count).
fn headline_handlers() -> usize {
    std::env::var("BURNDOWN_HEADLINE_HANDLERS")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(32usize)
        .clamp(1, 1024)
}

/// The matrix of one database. Row lock and server advisory claim one row per claim whatever
/// the batch: batch 1 only.
fn cells(row_lock: bool, advisory_batches: &[usize]) -> Vec<Cell> {
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
    for &b in advisory_batches {
        for w in [1, 4, 8] {
            out.push(Cell::plain("advisory", Form::Advisory, w, b));
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Time helpers (the library's: seconds are whole)

fn epoch_secs(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// `t` rounded down to a whole second (the library's `claim_now`).
fn floor(t: SystemTime) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(epoch_secs(t) as u64)
}

/// The token a lease claim at `now` writes (the library's `lease_token`: `ceil(now) + lease`).
fn lease_token(now: SystemTime) -> SystemTime {
    let f = floor(now);
    let ceil = if f == now {
        f
    } else {
        f + Duration::from_secs(1)
    };
    ceil + LEASE
}

/// The library's id-list size class.
fn size_class(n: usize) -> usize {
    n.max(1).next_power_of_two()
}

fn unique(prefix: &str) -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!(
        "{prefix}_{}_{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed),
        nanos % 100_000
    )
}

fn skip(db: &str, url: &str, var: &str, why: &dyn std::fmt::Display) {
    let bar = "!".repeat(88);
    eprintln!("\n{bar}\n!!!!! SKIPPED: {db} burn-down: {url} is not reachable ({why})");
    eprintln!("!!!!! set {var} or start the server\n{bar}\n");
}

/// Resident set size of this process, in MiB.
fn rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// Runs its closure when dropped: the tables go even when a run panics.
struct OnDrop<F: FnMut()>(F);

impl<F: FnMut()> Drop for OnDrop<F> {
    fn drop(&mut self) {
        (self.0)()
    }
}

// ---------------------------------------------------------------------------------------------
// The two sides

/// One database: the broker, its three tables, and the raw side's connections.
trait Db: Sync {
    fn name(&self) -> &str;
    fn broker(&self) -> &Broker;
    fn table(&self, form: Form) -> &Table;
    /// Empties `t` (untimed).
    fn clear(&self, t: &Table);
    /// A connection of the raw side running `form`'s protocol on `t` with claims of `batch`
    /// (opened and prepared here, before the clock starts).
    fn raw_on(&self, t: &Table, form: Form, batch: usize) -> Box<dyn RawConn + '_>;
    /// [`raw_on`](Db::raw_on) the form's table.
    fn raw(&self, form: Form, batch: usize) -> Box<dyn RawConn + '_> {
        self.raw_on(self.table(form), form, batch)
    }
    /// Puts `n` due rows into `t` with one statement (scale check; default: publish).
    fn fill_fast(&self, t: &Table, n: u64) {
        publish(self.broker(), t, n, 0);
    }
    /// Ready rows in `t`.
    fn count(&self, _t: &Table) -> u64 {
        0
    }
}

/// One raw connection running a protocol.
trait RawConn {
    /// One claim and its settlement: the rows settled, `None` when nothing was claimable.
    fn round(&mut self) -> Option<u64>;
}

/// Publishes `n` messages (keys `k-<from>` ..) into `t`, [`PUBLISH_CHUNK`] per call.
fn publish(broker: &Broker, t: &Table, n: u64, from: u64) {
    let mut i = 0;
    while i < n {
        let k = PUBLISH_CHUNK.min(n - i);
        let batch: Vec<Message> = (0..k)
            .map(|j| Message::new(PAYLOAD.to_vec()).set("k", format!("k-{}", from + i + j)))
            .collect();
        broker.publish_batch(t, batch).expect("publish batch");
        i += k;
    }
}

/// The library: a subscription as the cell says, `handlers` threads settling until `n` jobs are
/// acked. `acked` counts them (read by the memory sampler). Returns jobs/s from `start` to the
/// last ack, and the share of the handler threads' time spent settling (`ack`, `ack_all`; the
/// rest is waiting for deliveries).
fn library_run(db: &dyn Db, cell: &Cell, n: u64, acked: &AtomicU64) -> (f64, f64) {
    let t = db.table(cell.form);
    acked.store(0, Ordering::Relaxed);
    let builder = db
        .broker()
        .subscription(t)
        .workers(cell.workers)
        .batch_size(cell.batch);
    let start = Instant::now();
    let sub = builder.start().expect("start subscription");
    let last = Mutex::new(start);
    let progress = AtomicU64::new(0);
    let settling = AtomicU64::new(0);
    let batches = AtomicU64::new(0);
    let settled = |since: Instant| {
        settling.fetch_add(since.elapsed().as_nanos() as u64, Ordering::Relaxed);
    };
    std::thread::scope(|s| {
        for _ in 0..cell.handlers {
            s.spawn(|| loop {
                if acked.load(Ordering::Relaxed) >= n {
                    break;
                }
                let got = match cell.settle {
                    Settle::Ack => sub
                        .next_delivery_timeout(Duration::from_millis(20))
                        .map(|d| {
                            black_box(d.payload());
                            let t = Instant::now();
                            d.ack().expect("ack");
                            settled(t);
                            1
                        }),
                    Settle::AckAll => sub.next_batch(100, Duration::from_millis(20)).map(|batch| {
                        for d in &batch {
                            black_box(d.payload());
                        }
                        let k = batch.len() as u64;
                        batches.fetch_add(1, Ordering::Relaxed);
                        let t = Instant::now();
                        for r in Delivery::ack_all(batch) {
                            r.expect("ack_all");
                        }
                        settled(t);
                        k
                    }),
                };
                match got {
                    Ok(k) => {
                        let now = Instant::now();
                        progress.store(
                            now.duration_since(start).as_millis() as u64,
                            Ordering::Relaxed,
                        );
                        if acked.fetch_add(k, Ordering::AcqRel) + k >= n {
                            *last.lock().unwrap() = now;
                        }
                    }
                    Err(NextError::Closed) => panic!("subscription closed: {:?}", sub.last_error()),
                    // Nothing in time (later versions also say `Empty`).
                    Err(_) => {
                        let idle =
                            start.elapsed().as_millis() as u64 - progress.load(Ordering::Relaxed);
                        if idle > STALL.as_millis() as u64 && acked.load(Ordering::Relaxed) < n {
                            panic!(
                                "no delivery for {STALL:?} after {} of {n} acks; last error: {:?}",
                                acked.load(Ordering::Relaxed),
                                sub.last_error()
                            );
                        }
                    }
                }
            });
        }
    });
    let elapsed = last.into_inner().unwrap().duration_since(start);
    let done = acked.load(Ordering::Relaxed);
    sub.shutdown(Duration::from_secs(10)).expect("shutdown");
    let share = settling.load(Ordering::Relaxed) as f64
        / (elapsed.as_nanos() as f64 * cell.handlers as f64);
    if let Some(mean) = (done * 100).checked_div(batches.load(Ordering::Relaxed)) {
        LAST_BATCH_MEAN.store(mean, Ordering::Relaxed);
    }
    (done as f64 / elapsed.as_secs_f64(), share)
}

/// The raw side: `workers` threads, each on a connection of its own, running `form`'s protocol
/// until `n` rows are settled or nothing is claimable. Returns jobs/s.
fn raw_run(db: &dyn Db, form: Form, workers: usize, batch: usize, n: u64) -> f64 {
    let ready = Barrier::new(workers + 1);
    let done = AtomicU64::new(0);
    let stuck = AtomicBool::new(false);
    let start = std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| {
                let mut conn = db.raw(form, batch);
                ready.wait();
                let mut since = Instant::now();
                while done.load(Ordering::Relaxed) < n && !stuck.load(Ordering::Relaxed) {
                    match conn.round() {
                        None => break,
                        Some(0) => {
                            if since.elapsed() > STALL {
                                stuck.store(true, Ordering::Relaxed);
                            }
                        }
                        Some(k) => {
                            done.fetch_add(k, Ordering::Relaxed);
                            since = Instant::now();
                        }
                    }
                }
            });
        }
        ready.wait();
        Instant::now()
    });
    let elapsed = start.elapsed();
    assert!(
        !stuck.load(Ordering::Relaxed),
        "raw {form:?} made no progress"
    );
    let done = done.load(Ordering::Relaxed);
    assert!(done >= n.min(1), "raw {form:?} settled nothing");
    done as f64 / elapsed.as_secs_f64()
}

/// One side's runs of a cell, jobs/s.
#[derive(Default)]
struct Runs(Vec<f64>);

impl Runs {
    fn best(&self) -> f64 {
        self.0.iter().copied().fold(0.0, f64::max)
    }

    fn list(&self) -> String {
        self.0
            .iter()
            .map(|r| format!("{r:.0}"))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// A finished cell, for the summary.
struct Row {
    id: String,
    cell: Cell,
    n: u64,
    library: Runs,
    raw: Runs,
    pgbench: Option<Runs>,
    /// Raw transactions retried after a deadlock (MySQL).
    retries: u64,
    /// Per library run: the share of handler time spent settling.
    settling: Vec<f64>,
}

impl Row {
    /// The settling share of the best library run.
    fn settling(&self) -> f64 {
        let best = self.library.best();
        self.library
            .0
            .iter()
            .position(|r| *r == best)
            .and_then(|i| self.settling.get(i).copied())
            .unwrap_or(0.0)
    }
}

fn print_header() {
    println!(
        "{:<30} {:>7} {:>6} {:>11} {:>7} {:>11} {:>6} {:>11} {:>7}   runs (library | raw | pgbench)",
        "cell", "threads", "jobs", "library/s", "settle", "raw/s", "l/raw", "pgbench/s", "l/pgb"
    );
}

fn print_row(r: &Row) {
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

/// Runs one cell: pilots, then `rounds` alternations of library, raw (and pgbench).
fn run_cell(db: &dyn Db, cell: &Cell, set: &Settings, pgbench: Option<&mut PgBench>) -> Row {
    let t = db.table(cell.form);
    let acked = AtomicU64::new(0);
    let lib = |n: u64| {
        db.clear(t);
        publish(db.broker(), t, n, 0);
        library_run(db, cell, n, &acked)
    };
    let raw = |n: u64| {
        db.clear(t);
        publish(db.broker(), t, n, 0);
        raw_run(db, cell.form, cell.workers, cell.batch, n)
    };
    let n = match set.jobs {
        Some(n) => n,
        None => {
            let pilot = ((cell.workers * cell.batch * 10) as u64).clamp(300, 8_000);
            let (l, r) = (lib(pilot).0, raw(pilot));
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
    };
    RAW_RETRIES.store(0, Ordering::Relaxed);
    let mut pgbench = pgbench.and_then(|p| cell.pgbench().map(|s| (p, s)));
    for _ in 0..set.rounds {
        let (rate, share) = lib(n);
        row.library.0.push(rate);
        row.settling.push(share);
        row.raw.0.push(raw(n));
        if let Some((p, (script, rows))) = pgbench.as_mut() {
            let runs = row.pgbench.get_or_insert_with(Runs::default);
            match p.run(script, cell.workers, set.pgbench_secs, *rows) {
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
fn run_db(db: &dyn Db, cells: &[Cell], set: &Settings, mut pgbench: Option<PgBench>) -> Vec<Row> {
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

/// Scale and memory checks of the lease headline configuration (PostgreSQL): the claim rate
/// over the first 10,000 jobs of a 10,000-row table against a `scale_rows` table, then a
/// burn-down of the whole large table with RSS sampled.
fn scale_checks(db: &dyn Db, big: &Table, set: &Settings) {
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
struct BigTable<'a> {
    db: &'a dyn Db,
    big: &'a Table,
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
}

/// The tables of one database (text column `k`; advisory keys `<table>-{k}`), made by the
/// library.
struct Tables {
    plain: Table,
    lease: Table,
    advisory: Table,
    big: Table,
}

impl Tables {
    fn create(broker: &Broker, prefix: &str) -> Tables {
        let plain = Table::new(unique(&format!("{prefix}_rl"))).text_column("k");
        let lease = Table::new(unique(&format!("{prefix}_ls")))
            .text_column("k")
            .lease(LEASE);
        let big = Table::new(unique(&format!("{prefix}_big")))
            .text_column("k")
            .lease(LEASE);
        let name = unique(&format!("{prefix}_ad"));
        let template = format!("{name}-{{k}}");
        let advisory = Table::new(name).text_column("k").advisory_lock(template);
        for t in [&plain, &lease, &advisory, &big] {
            broker.create_table(t).expect("create table");
        }
        Tables {
            plain,
            lease,
            advisory,
            big,
        }
    }

    fn get(&self, form: Form) -> &Table {
        match form {
            Form::RowLock => &self.plain,
            Form::Lease => &self.lease,
            Form::Advisory => &self.advisory,
        }
    }

    fn names(&self) -> [&str; 4] {
        [
            self.plain.name(),
            self.lease.name(),
            self.advisory.name(),
            self.big.name(),
        ]
    }
}

/// Connects the broker for `url` with the pool the cells need; `None` after a banner.
fn broker(db: &str, var: &str, url: &str) -> Option<Broker> {
    match Broker::builder(url)
        .pool_size(POOL)
        .connection_timeout(Duration::from_secs(5))
        .build()
    {
        Ok(b) => Some(b),
        Err(e) => {
            skip(db, url, var, &e);
            None
        }
    }
}

// ---------------------------------------------------------------------------------------------
// pgbench

/// The pgbench scripts of `BURNDOWN_PGBENCH_DIR`, rewritten to a table of their own.
struct PgBench {
    table: String,
    dir: std::path::PathBuf,
    schema: Vec<String>,
    args: Vec<String>,
    password: Option<String>,
    client: postgres::Client,
}

impl PgBench {
    /// `None` (with a note) when pgbench or the scripts are missing.
    fn new(url: &str, src: &str) -> Option<PgBench> {
        let ok = std::process::Command::new("pgbench")
            .arg("--version")
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false);
        let schema = std::fs::read_to_string(format!("{src}/pg-schema.sql")).ok();
        let (true, Some(schema)) = (ok, schema) else {
            eprintln!("note: pgbench or {src}/pg-schema.sql missing: no pgbench figures");
            return None;
        };
        let table = format!("burndown_jobs_{}", std::process::id());
        let dir = std::env::temp_dir().join(format!("sqlbroker-burndown-{}", std::process::id()));
        std::fs::create_dir_all(&dir).ok()?;
        for script in ["pg-row_lock1.sql", "pg-lease1.sql", "pg-lease100.sql"] {
            let text = std::fs::read_to_string(format!("{src}/{script}")).ok()?;
            std::fs::write(dir.join(script), text.replace("jobs", &table)).ok()?;
        }
        let schema = schema
            .replace("jobs", &table)
            .split(';')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect();
        // postgres://user[:password]@host[:port]/db
        let rest = url.split_once("://").map_or(url, |(_, r)| r);
        let (auth, hostdb) = rest.rsplit_once('@').unwrap_or(("", rest));
        let (user, password) = match auth.split_once(':') {
            Some((u, p)) => (u.to_string(), Some(p.to_string())),
            None => (auth.to_string(), None),
        };
        let (hostport, db) = hostdb.split_once('/').unwrap_or((hostdb, "postgres"));
        let db = db.split('?').next().unwrap_or(db);
        let (host, port) = hostport.split_once(':').unwrap_or((hostport, "5432"));
        let mut args = vec!["-h".into(), host.into(), "-p".into(), port.into()];
        if !user.is_empty() {
            args.extend(["-U".into(), user]);
        }
        args.push(db.into());
        let client = postgres::Client::connect(url, postgres::NoTls).ok()?;
        Some(PgBench {
            table,
            dir,
            schema,
            args,
            password,
            client,
        })
    }

    /// Reloads the table and runs `script` on `clients` clients for `secs`: jobs/s.
    fn run(&mut self, script: &str, clients: usize, secs: u64, rows: u64) -> Result<f64, String> {
        for stmt in &self.schema {
            self.client
                .batch_execute(stmt)
                .map_err(|e| format!("schema: {e}"))?;
        }
        let mut cmd = std::process::Command::new("pgbench");
        cmd.args(["-n", "-f"])
            .arg(self.dir.join(script))
            .args(["-c", &clients.to_string(), "-j", &clients.to_string()])
            .args(["-T", &secs.to_string()])
            .args(&self.args);
        if let Some(p) = &self.password {
            cmd.env("PGPASSWORD", p);
        }
        let out = cmd.output().map_err(|e| e.to_string())?;
        let text = String::from_utf8_lossy(&out.stdout);
        let tps = text
            .lines()
            .find(|l| l.starts_with("tps = "))
            .and_then(|l| l.split_whitespace().nth(2))
            .and_then(|v| v.parse::<f64>().ok());
        match (out.status.success(), tps) {
            (true, Some(tps)) => Ok(tps * rows as f64),
            _ => Err(format!(
                "{}\n{}",
                text,
                String::from_utf8_lossy(&out.stderr)
            )),
        }
    }
}

impl Drop for PgBench {
    fn drop(&mut self) {
        let _ = self
            .client
            .batch_execute(&format!("DROP TABLE IF EXISTS {}", self.table));
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

// ---------------------------------------------------------------------------------------------
// main

fn main() {
    let set = Settings::from_env();
    // With the `metrics` feature, a recorder that keeps every value (atomic counters, lock-free
    // histogram buckets, as exporters do), so the library's reports cost what they would in an
    // application: the feature's price is this build's library / raw against one without it.
    #[cfg(feature = "metrics")]
    {
        metrics_util::debugging::DebuggingRecorder::new()
            .install()
            .expect("the bench's recorder");
        println!("metrics: on, a DebuggingRecorder installed");
    }
    println!(
        "burn-down: best of {} alternating runs per side; jobs per run {}; load average {}",
        set.rounds,
        set.jobs.map_or_else(
            || format!("sized to ~{} s of the slower side", set.secs),
            |n| n.to_string()
        ),
        load_average()
    );
    println!(
        "columns: threads = handler threads; settle = share of the handler threads' time spent in \
         ack/ack_all (best library run; the rest is waiting for deliveries); l/raw = library / raw; \
         l/pgb = library / pgbench"
    );
    print_header();
    let mut all: Vec<Row> = Vec::new();
    #[cfg(feature = "postgres")]
    if set.wants_db(&["postgres"]) {
        all.extend(pg::run(&set));
    }
    #[cfg(feature = "mysql")]
    if set.wants_db(&["mariadb", "mysql"]) {
        all.extend(my::run(&set));
    }
    #[cfg(feature = "sqlite")]
    if set.wants_db(&["sqlite"]) {
        all.extend(sqlite::run(&set));
    }
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
    for r in &all {
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

// ---------------------------------------------------------------------------------------------
// PostgreSQL

#[cfg(feature = "postgres")]
mod pg {
    use super::*;
    use postgres::{Client, NoTls, Statement};

    const VAR: &str = "SQLBROKER_PG_URL";
    const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable";

    struct Pg {
        url: String,
        broker: Broker,
        tables: Tables,
        admin: Mutex<Client>,
        /// Diagnostic: raw lease acks of many rows as one `unnest` of two arrays instead of
        /// the library's token and id list.
        array_ack: AtomicBool,
    }

    impl Db for Pg {
        fn name(&self) -> &str {
            "postgres"
        }

        fn broker(&self) -> &Broker {
            &self.broker
        }

        fn table(&self, form: Form) -> &Table {
            self.tables.get(form)
        }

        fn clear(&self, t: &Table) {
            self.admin
                .lock()
                .unwrap()
                .batch_execute(&format!("TRUNCATE \"{}\"", t.name()))
                .expect("truncate");
        }

        fn fill_fast(&self, t: &Table, n: u64) {
            let sql = format!(
                "INSERT INTO \"{}\" (\"payload\", \"run_at\", \"k\") \
                 SELECT $1, $2, 'k-' || g FROM generate_series(0, $3::bigint - 1) AS g",
                t.name()
            );
            let run_at = floor(SystemTime::now()) - Duration::from_secs(1);
            let mut c = self.admin.lock().unwrap();
            c.execute(&sql, &[&PAYLOAD.as_slice(), &run_at, &(n as i64)])
                .expect("fill");
            c.batch_execute(&format!("VACUUM ANALYZE \"{}\"", t.name()))
                .expect("vacuum");
        }

        fn count(&self, t: &Table) -> u64 {
            let n: i64 = self
                .admin
                .lock()
                .unwrap()
                .query_one(&format!("SELECT count(*) FROM \"{}\"", t.name()), &[])
                .expect("count")
                .get(0);
            n as u64
        }

        fn raw_on(&self, t: &Table, form: Form, batch: usize) -> Box<dyn RawConn + '_> {
            let mut c = Client::connect(&self.url, NoTls).expect("raw connection");
            let q = t.name();
            let mut prep = |s: String| c.prepare(&s).unwrap_or_else(|e| panic!("prepare {s}: {e}"));
            let ready = "\"dead_at\" IS NULL AND \"run_at\" <= $1";
            // The claims' row count behind a sub-select, as the library spells it (so every
            // plan walks the ready index).
            let limit = "LIMIT (SELECT $2::bigint)";
            match form {
                Form::RowLock => {
                    let claim = prep(format!(
                        "SELECT \"id\", \"attempts\", \"payload\", \"k\" FROM \"{q}\" WHERE {ready} \
                         ORDER BY \"run_at\", \"id\" {limit} FOR UPDATE SKIP LOCKED"
                    ));
                    let ack = prep(format!("DELETE FROM \"{q}\" WHERE \"id\" = $1"));
                    Box::new(RowLock { c, claim, ack })
                }
                Form::Lease => {
                    let claim = prep(format!(
                        "UPDATE \"{q}\" AS q SET \"locked_until\" = $3, \"attempts\" = q.\"attempts\" + 1 \
                         WHERE q.\"id\" = ANY(ARRAY(SELECT \"id\" FROM \"{q}\" WHERE {ready} AND \
                         (\"locked_until\" IS NULL OR \"locked_until\" <= $1) ORDER BY \"run_at\", \"id\" \
                         {limit} FOR UPDATE SKIP LOCKED)) \
                         RETURNING q.\"id\", q.\"attempts\", q.\"payload\", q.\"k\""
                    ));
                    let ack = prep(format!(
                        "DELETE FROM \"{q}\" WHERE \"id\" = $1 AND \"locked_until\" = $2"
                    ));
                    // The grouped ack (`ack_many_sql`) of one claim: its token, its ids.
                    let ack_many = prep(format!(
                        "DELETE FROM \"{q}\" WHERE (\"locked_until\" = $1 AND \"id\" = \
                         ANY($2::text::bigint[])) RETURNING \"id\""
                    ));
                    let array_ack = self.array_ack.load(Ordering::Relaxed).then(|| {
                        prep(format!(
                            "DELETE FROM \"{q}\" WHERE (\"id\", \"locked_until\") IN \
                             (SELECT * FROM unnest($1::bigint[], $2::timestamptz[])) RETURNING \"id\""
                        ))
                    });
                    Box::new(Lease {
                        c,
                        claim,
                        ack,
                        ack_many,
                        array_ack,
                        batch,
                    })
                }
                Form::Advisory => {
                    let candidates = prep(format!(
                        "SELECT \"id\", \"run_at\", \"k\" FROM \"{q}\" WHERE {ready} \
                         ORDER BY \"run_at\", \"id\" {limit}"
                    ));
                    let take = prep(format!(
                        "UPDATE \"{q}\" SET \"attempts\" = \"attempts\" + 1 WHERE {ready} AND \"id\" = $2 \
                         RETURNING \"id\", \"attempts\", \"payload\", \"k\""
                    ));
                    let ack = prep(format!("DELETE FROM \"{q}\" WHERE \"id\" = $1"));
                    let lock =
                        prep("SELECT pg_try_advisory_lock(hashtextextended($1, 0))::int".into());
                    let unlock =
                        prep("SELECT pg_advisory_unlock(hashtextextended($1, 0))::int".into());
                    Box::new(Advisory {
                        c,
                        candidates,
                        take,
                        ack,
                        lock,
                        unlock,
                        table: q.to_string(),
                        scan: (batch * 4).max(32),
                    })
                }
            }
        }
    }

    /// `BEGIN`; claim one row `FOR UPDATE SKIP LOCKED`; delete it; `COMMIT`.
    struct RowLock {
        c: Client,
        claim: Statement,
        ack: Statement,
    }

    impl RawConn for RowLock {
        fn round(&mut self) -> Option<u64> {
            let c = &mut self.c;
            c.batch_execute("BEGIN ISOLATION LEVEL READ COMMITTED")
                .unwrap();
            let now = floor(SystemTime::now());
            let rows = c.query(&self.claim, &[&now, &1i64]).unwrap();
            let Some(row) = rows.first() else {
                c.batch_execute("COMMIT").unwrap();
                return None;
            };
            let id: i64 = row.get(0);
            black_box(row.get::<_, &[u8]>(2));
            assert_eq!(c.execute(&self.ack, &[&id]).unwrap(), 1);
            c.batch_execute("COMMIT").unwrap();
            Some(1)
        }
    }

    /// The lease claim of `batch` rows (one statement, one commit), then one token-fenced delete
    /// of the rows claimed.
    struct Lease {
        c: Client,
        claim: Statement,
        ack: Statement,
        ack_many: Statement,
        array_ack: Option<Statement>,
        batch: usize,
    }

    impl RawConn for Lease {
        fn round(&mut self) -> Option<u64> {
            let c = &mut self.c;
            let now = SystemTime::now();
            let token = lease_token(now);
            let rows = c
                .query(&self.claim, &[&floor(now), &(self.batch as i64), &token])
                .unwrap();
            if rows.is_empty() {
                return None;
            }
            let ids: Vec<i64> = rows
                .iter()
                .map(|r| {
                    black_box(r.get::<_, &[u8]>(2));
                    r.get(0)
                })
                .collect();
            if ids.len() == 1 {
                assert_eq!(c.execute(&self.ack, &[&ids[0], &token]).unwrap(), 1);
            } else if let Some(st) = &self.array_ack {
                let tokens = vec![token; ids.len()];
                assert_eq!(c.query(st, &[&ids, &tokens]).unwrap().len(), ids.len());
            } else {
                let list: Vec<String> = ids.iter().map(i64::to_string).collect();
                let list = format!("{{{}}}", list.join(","));
                let rows = c.query(&self.ack_many, &[&token, &list]).unwrap();
                assert_eq!(rows.len(), ids.len());
            }
            Some(ids.len() as u64)
        }
    }

    /// Candidates, try a key, take the row under it, delete, unlock: one row per claim.
    struct Advisory {
        c: Client,
        candidates: Statement,
        take: Statement,
        ack: Statement,
        lock: Statement,
        unlock: Statement,
        table: String,
        scan: usize,
    }

    impl RawConn for Advisory {
        fn round(&mut self) -> Option<u64> {
            let c = &mut self.c;
            let now = floor(SystemTime::now());
            let candidates = c
                .query(&self.candidates, &[&now, &(self.scan as i64)])
                .unwrap();
            if candidates.is_empty() {
                return None;
            }
            for cand in &candidates {
                let id: i64 = cand.get(0);
                let k: Option<String> = cand.get(2);
                let key = format!("{}-{}", self.table, k.unwrap_or_default());
                let locked: i32 = c.query_one(&self.lock, &[&key]).unwrap().get(0);
                if locked != 1 {
                    continue;
                }
                let took = match c.query_opt(&self.take, &[&now, &id]).unwrap() {
                    Some(row) => {
                        black_box(row.get::<_, &[u8]>(2));
                        assert_eq!(c.execute(&self.ack, &[&id]).unwrap(), 1);
                        true
                    }
                    None => false,
                };
                let unlocked: i32 = c.query_one(&self.unlock, &[&key]).unwrap().get(0);
                assert_eq!(unlocked, 1);
                if took {
                    return Some(1);
                }
            }
            Some(0)
        }
    }

    /// `postgres/diag/lease_ack_sql`: the raw lease loop, 4 connections, batch 100, with the
    /// ack of the 100 rows spelled as the library spells it (the claim's token and its ids as a
    /// text array) against one `unnest` of two binary arrays, alternating.
    fn ack_sql_diagnostic(pg: &Pg, set: &Settings) {
        let id = "postgres/diag/lease_ack_sql/w4/b100";
        if !set.wants(id) {
            return;
        }
        let t = pg.table(Form::Lease);
        let n = set.jobs.unwrap_or(20_000);
        let (mut pairs, mut arrays) = (Runs::default(), Runs::default());
        for _ in 0..set.rounds {
            for (array, runs) in [(false, &mut pairs), (true, &mut arrays)] {
                pg.clear(t);
                publish(&pg.broker, t, n, 0);
                pg.array_ack.store(array, Ordering::Relaxed);
                runs.0.push(raw_run(pg, Form::Lease, 4, 100, n));
            }
        }
        pg.array_ack.store(false, Ordering::Relaxed);
        pg.clear(t);
        println!(
            "{id}: raw, {n} jobs: ack as token and id list (library) {:.0} jobs/s ({}), as unnest \
             of two arrays {:.0} jobs/s ({}): {:.2}x",
            pairs.best(),
            pairs.list(),
            arrays.best(),
            arrays.list(),
            arrays.best() / pairs.best()
        );
    }

    pub fn run(set: &Settings) -> Vec<Row> {
        let url = std::env::var(VAR).unwrap_or_else(|_| DEFAULT_URL.to_string());
        let Some(broker) = broker("PostgreSQL", VAR, &url) else {
            return Vec::new();
        };
        let admin = match Client::connect(&url, NoTls) {
            Ok(c) => c,
            Err(e) => {
                skip("PostgreSQL", &url, VAR, &e);
                return Vec::new();
            }
        };
        let tables = Tables::create(&broker, "burn");
        let pg = Pg {
            url: url.clone(),
            broker,
            tables,
            admin: Mutex::new(admin),
            array_ack: AtomicBool::new(false),
        };
        let _cleanup = OnDrop(|| {
            let mut c = pg.admin.lock().unwrap();
            for t in pg.tables.names() {
                let _ = c.batch_execute(&format!(
                    "DROP TABLE IF EXISTS \"{t}\"; DELETE FROM sqlbroker_tables WHERE name = '{t}'"
                ));
            }
        });
        println!("== postgres (load {})", load_average());
        let cells = cells(true, &[1]);
        let wanted = cells.iter().any(|c| set.wants(&c.id("postgres")));
        let pgbench = if wanted {
            PgBench::new(&url, &set.pgbench_dir)
        } else {
            None
        };
        let rows = run_db(&pg, &cells, set, pgbench);
        ack_sql_diagnostic(&pg, set);
        if set.wants("postgres/scale") || set.wants("postgres/memory") {
            scale_checks(&pg, &pg.tables.big, set);
        }
        rows
    }
}

// ---------------------------------------------------------------------------------------------
// MySQL / MariaDB

#[cfg(feature = "mysql")]
mod my {
    use super::*;
    use mysql::prelude::Queryable;
    use mysql::{Conn, Opts, OptsBuilder, Params, Statement};

    const VAR: &str = "SQLBROKER_MYSQL_URL";
    const DEFAULT_URL: &str = "mysql://root@127.0.0.1:3306/test";

    /// A connection with the session the library's connections get.
    fn connect(url: &str) -> mysql::Result<Conn> {
        let opts = OptsBuilder::from_opts(Opts::from_url(url)?)
            .additional_capabilities(mysql::consts::CapabilityFlags::CLIENT_FOUND_ROWS)
            .init(vec![
                "SET time_zone = '+00:00'",
                "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED",
            ])
            .stmt_cache_size(256)
            .tcp_connect_timeout(Some(Duration::from_secs(5)));
        Conn::new(opts)
    }

    /// The `GET_LOCK` name of `<db>.<key>` as the dialect's `lock_name`.
    fn lock_name(name: &str) -> String {
        use sha2::{Digest, Sha256};
        if name.chars().count() <= 64 {
            return name.to_string();
        }
        Sha256::digest(name.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    /// A time as the library binds it: a `DATETIME` in UTC, whole seconds.
    fn datetime(t: SystemTime) -> mysql::Value {
        let secs = epoch_secs(t);
        let z = secs.div_euclid(86_400) + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z - era * 146_097;
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let d = (doy - (153 * mp + 2) / 5 + 1) as u8;
        let m = if mp < 10 { mp + 3 } else { mp - 9 } as u8;
        let y = (yoe + era * 400 + i64::from(m <= 2)) as u16;
        let rem = secs.rem_euclid(86_400);
        mysql::Value::Date(
            y,
            m,
            d,
            (rem / 3600) as u8,
            (rem % 3600 / 60) as u8,
            (rem % 60) as u8,
            0,
        )
    }

    /// `ids` padded to `slots` with the last, after `lead`.
    fn id_params(lead: Vec<mysql::Value>, ids: &[i64], slots: usize) -> Params {
        let mut p = lead;
        for i in 0..slots {
            p.push(mysql::Value::Int(ids[i.min(ids.len() - 1)]));
        }
        Params::Positional(p)
    }

    fn placeholders(n: usize) -> String {
        vec!["?"; n].join(", ")
    }

    struct My {
        url: String,
        name: String,
        db: String,
        broker: Broker,
        tables: Tables,
        admin: Mutex<Conn>,
    }

    type ClaimRow = (i64, i64, Vec<u8>, Option<String>);

    impl Db for My {
        fn name(&self) -> &str {
            &self.name
        }

        fn broker(&self) -> &Broker {
            &self.broker
        }

        fn table(&self, form: Form) -> &Table {
            self.tables.get(form)
        }

        fn clear(&self, t: &Table) {
            self.admin
                .lock()
                .unwrap()
                .query_drop(format!("TRUNCATE TABLE `{}`", t.name()))
                .expect("truncate");
        }

        fn count(&self, t: &Table) -> u64 {
            self.admin
                .lock()
                .unwrap()
                .query_first(format!("SELECT COUNT(*) FROM `{}`", t.name()))
                .expect("count")
                .unwrap_or(0)
        }

        fn raw_on(&self, t: &Table, form: Form, batch: usize) -> Box<dyn RawConn + '_> {
            let mut c = connect(&self.url).expect("raw connection");
            let q = t.name();
            let mut prep = |s: String| c.prep(&s).unwrap_or_else(|e| panic!("prepare {s}: {e}"));
            let row = "`id`, `attempts`, `payload`, `k`";
            let ready = "`dead_at` IS NULL AND `run_at` <= ?";
            let classes = size_class(batch).trailing_zeros() as usize + 1;
            match form {
                Form::RowLock => {
                    let claim = prep(format!(
                        "SELECT {row} FROM `{q}` WHERE {ready} ORDER BY `run_at`, `id` LIMIT ? \
                         FOR UPDATE SKIP LOCKED"
                    ));
                    let ack = prep(format!("DELETE FROM `{q}` WHERE `id` = ?"));
                    Box::new(RowLock { c, claim, ack })
                }
                Form::Lease => {
                    let claim = prep(format!(
                        "SELECT {row} FROM `{q}` WHERE {ready} AND (`locked_until` IS NULL OR \
                         `locked_until` <= ?) ORDER BY `run_at`, `id` LIMIT ? FOR UPDATE SKIP LOCKED"
                    ));
                    let marks = (0..classes)
                        .map(|k| {
                            prep(format!(
                                "UPDATE `{q}` SET `locked_until` = ?, `attempts` = `attempts` + 1 \
                                 WHERE `id` IN ({})",
                                placeholders(1 << k)
                            ))
                        })
                        .collect();
                    let ack = prep(format!(
                        "DELETE FROM `{q}` WHERE `id` = ? AND `locked_until` = ?"
                    ));
                    let ack_lock = (0..classes)
                        .map(|k| {
                            prep(format!(
                                "SELECT `id`, `locked_until` FROM `{q}` WHERE `id` IN ({}) FOR UPDATE",
                                placeholders(1 << k)
                            ))
                        })
                        .collect();
                    let ack_many = (0..classes)
                        .map(|k| {
                            prep(format!(
                                "DELETE FROM `{q}` WHERE `id` IN ({})",
                                placeholders(1 << k)
                            ))
                        })
                        .collect();
                    Box::new(Lease {
                        c,
                        claim,
                        marks,
                        ack,
                        ack_lock,
                        ack_many,
                        batch,
                    })
                }
                Form::Advisory => {
                    let candidates = prep(format!(
                        "SELECT `id`, `run_at`, `k` FROM `{q}` WHERE {ready} ORDER BY `run_at`, `id` LIMIT ?"
                    ));
                    let take = prep(format!(
                        "UPDATE `{q}` SET `attempts` = `attempts` + 1 WHERE {ready} AND `id` = ?"
                    ));
                    let fetch = prep(format!("SELECT {row} FROM `{q}` WHERE `id` = ?"));
                    let ack = prep(format!("DELETE FROM `{q}` WHERE `id` = ?"));
                    let lock = prep("SELECT GET_LOCK(?, 0)".into());
                    let unlock = prep("SELECT RELEASE_LOCK(?)".into());
                    Box::new(Advisory {
                        c,
                        candidates,
                        take,
                        fetch,
                        ack,
                        lock,
                        unlock,
                        prefix: format!("{}.{q}", self.db),
                        scan: (batch * 4).max(32),
                    })
                }
            }
        }
    }

    /// `START TRANSACTION` (the session is READ COMMITTED); claim one row `FOR UPDATE SKIP
    /// LOCKED`; delete it; `COMMIT`.
    struct RowLock {
        c: Conn,
        claim: Statement,
        ack: Statement,
    }

    impl RawConn for RowLock {
        fn round(&mut self) -> Option<u64> {
            let RowLock { c, claim, ack } = self;
            retry(c, |c| {
                c.query_drop("START TRANSACTION")?;
                let now = datetime(SystemTime::now());
                let row: Option<ClaimRow> = c.exec_first(&*claim, (now, 1i64))?;
                let Some((id, _, payload, _)) = row else {
                    c.query_drop("COMMIT")?;
                    return Ok(None);
                };
                black_box(payload);
                c.exec_drop(&*ack, (id,))?;
                assert_eq!(c.affected_rows(), 1);
                c.query_drop("COMMIT")?;
                Ok(Some(1))
            })
        }
    }

    /// The library's lease claim transaction (locking select of `batch` rows, one update of
    /// their ids, commit), then the ack: the fenced delete for one row, the grouped ack
    /// transaction (lock the ids, delete them, commit) for more.
    struct Lease {
        c: Conn,
        claim: Statement,
        marks: Vec<Statement>,
        ack: Statement,
        ack_lock: Vec<Statement>,
        ack_many: Vec<Statement>,
        batch: usize,
    }

    /// A deadlock or a lock wait timeout: the transaction is rolled back and tried again, as
    /// the library retries its claims and acks.
    fn retry<T>(c: &mut Conn, mut f: impl FnMut(&mut Conn) -> mysql::Result<T>) -> T {
        loop {
            match f(c) {
                Ok(v) => return v,
                Err(mysql::Error::MySqlError(e)) if e.code == 1213 || e.code == 1205 => {
                    c.query_drop("ROLLBACK").unwrap();
                    RAW_RETRIES.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => panic!("raw: {e}"),
            }
        }
    }

    impl RawConn for Lease {
        fn round(&mut self) -> Option<u64> {
            let now = SystemTime::now();
            let (now_v, token) = (datetime(now), datetime(lease_token(now)));
            let Lease {
                c,
                claim,
                marks,
                ack,
                ack_lock,
                ack_many,
                batch,
            } = self;
            let mut ids: Vec<i64> = retry(c, |c| {
                c.query_drop("START TRANSACTION")?;
                let rows: Vec<ClaimRow> =
                    c.exec(&*claim, (now_v.clone(), now_v.clone(), *batch as i64))?;
                if rows.is_empty() {
                    c.query_drop("COMMIT")?;
                    return Ok(Vec::new());
                }
                let ids: Vec<i64> = rows
                    .into_iter()
                    .map(|(id, _, payload, _)| {
                        black_box(payload);
                        id
                    })
                    .collect();
                let slots = size_class(ids.len());
                let k = slots.trailing_zeros() as usize;
                c.exec_drop(&marks[k], id_params(vec![token.clone()], &ids, slots))?;
                assert_eq!(c.affected_rows(), ids.len() as u64);
                c.query_drop("COMMIT")?;
                Ok(ids)
            });
            if ids.is_empty() {
                return None;
            }
            if ids.len() == 1 {
                retry(c, |c| c.exec_drop(&*ack, (ids[0], token.clone())));
                assert_eq!(c.affected_rows(), 1);
                return Some(1);
            }
            ids.sort_unstable();
            let slots = size_class(ids.len());
            let k = slots.trailing_zeros() as usize;
            retry(c, |c| {
                c.query_drop("START TRANSACTION")?;
                let held: Vec<(i64, mysql::Value)> =
                    c.exec(&ack_lock[k], id_params(Vec::new(), &ids, slots))?;
                let kept: Vec<i64> = held
                    .into_iter()
                    .filter(|(_, t)| *t == token)
                    .map(|(id, _)| id)
                    .collect();
                assert_eq!(kept.len(), ids.len(), "raw lease ack: tokens differ");
                c.exec_drop(&ack_many[k], id_params(Vec::new(), &kept, slots))?;
                assert_eq!(c.affected_rows(), ids.len() as u64);
                c.query_drop("COMMIT")
            });
            Some(ids.len() as u64)
        }
    }

    /// Candidates, `GET_LOCK` a key, take the row under it (update, fetch), delete,
    /// `RELEASE_LOCK`: one row per claim.
    struct Advisory {
        c: Conn,
        candidates: Statement,
        take: Statement,
        fetch: Statement,
        ack: Statement,
        lock: Statement,
        unlock: Statement,
        /// `<database>.<table>`, which starts every lock name.
        prefix: String,
        scan: usize,
    }

    impl RawConn for Advisory {
        fn round(&mut self) -> Option<u64> {
            let c = &mut self.c;
            let now = datetime(SystemTime::now());
            let candidates: Vec<(i64, mysql::Value, Option<String>)> = c
                .exec(&self.candidates, (now.clone(), self.scan as i64))
                .unwrap();
            if candidates.is_empty() {
                return None;
            }
            for (id, _, k) in candidates {
                let name = lock_name(&format!("{}-{}", self.prefix, k.unwrap_or_default()));
                let locked: Option<Option<i64>> = c.exec_first(&self.lock, (&name,)).unwrap();
                if locked.flatten() != Some(1) {
                    continue;
                }
                retry(c, |c| c.exec_drop(&self.take, (now.clone(), id)));
                let took = c.affected_rows() == 1;
                if took {
                    let row: Option<ClaimRow> = c.exec_first(&self.fetch, (id,)).unwrap();
                    black_box(row.expect("fetch"));
                    retry(c, |c| c.exec_drop(&self.ack, (id,)));
                    assert_eq!(c.affected_rows(), 1);
                }
                let unlocked: Option<Option<i64>> = c.exec_first(&self.unlock, (&name,)).unwrap();
                assert_eq!(unlocked.flatten(), Some(1));
                if took {
                    return Some(1);
                }
            }
            Some(0)
        }
    }

    pub fn run(set: &Settings) -> Vec<Row> {
        let url = std::env::var(VAR).unwrap_or_else(|_| DEFAULT_URL.to_string());
        let Some(broker) = broker("MySQL/MariaDB", VAR, &url) else {
            return Vec::new();
        };
        let mut admin = match connect(&url) {
            Ok(c) => c,
            Err(e) => {
                skip("MySQL/MariaDB", &url, VAR, &e);
                return Vec::new();
            }
        };
        let db: String = admin
            .query_first("SELECT DATABASE()")
            .ok()
            .flatten()
            .unwrap_or_default();
        let version: String = admin
            .query_first("SELECT VERSION()")
            .ok()
            .flatten()
            .unwrap_or_default();
        let name = if version.to_ascii_lowercase().contains("mariadb") {
            "mariadb"
        } else {
            "mysql"
        };
        let tables = Tables::create(&broker, "burn");
        let my = My {
            url,
            name: name.into(),
            db,
            broker,
            tables,
            admin: Mutex::new(admin),
        };
        let _cleanup = OnDrop(|| {
            let mut c = my.admin.lock().unwrap();
            for t in my.tables.names() {
                let _ = c.query_drop(format!("DROP TABLE IF EXISTS `{t}`"));
                // The library recorded the table's description when it made it.
                let _ = c.query_drop(format!("DELETE FROM sqlbroker_tables WHERE name = '{t}'"));
            }
        });
        println!("== {name} {version} (load {})", load_average());
        run_db(&my, &cells(true, &[1]), set, None)
    }
}

// ---------------------------------------------------------------------------------------------
// SQLite

#[cfg(feature = "sqlite")]
mod sqlite {
    use super::*;
    use rusqlite::{params, params_from_iter, Connection};

    /// A connection set up as the library sets up its own (`Sqlite::connect`).
    fn open(path: &std::path::Path) -> Connection {
        let conn = Connection::open(path).expect("open sqlite");
        conn.busy_timeout(Duration::from_secs(30)).unwrap();
        conn.set_prepared_statement_cache_capacity(64);
        conn.query_row("PRAGMA journal_mode = WAL", [], |_| Ok(()))
            .unwrap();
        conn.execute_batch("PRAGMA synchronous = FULL").unwrap();
        conn
    }

    struct Lite {
        path: std::path::PathBuf,
        broker: Broker,
        tables: Tables,
        admin: Mutex<Connection>,
        /// The raw side's writer lock: one write statement at a time in this process.
        writer: Mutex<()>,
        /// The raw side's advisory keys.
        keys: Mutex<HashSet<String>>,
    }

    impl Db for Lite {
        fn name(&self) -> &str {
            "sqlite"
        }

        fn broker(&self) -> &Broker {
            &self.broker
        }

        fn table(&self, form: Form) -> &Table {
            self.tables.get(form)
        }

        fn clear(&self, t: &Table) {
            self.admin
                .lock()
                .unwrap()
                .execute_batch(&format!("DELETE FROM \"{}\"", t.name()))
                .expect("clear");
        }

        fn raw_on(&self, t: &Table, form: Form, batch: usize) -> Box<dyn RawConn + '_> {
            let c = open(&self.path);
            let q = t.name();
            let ready = "\"dead_at\" IS NULL AND \"run_at\" <= ?1";
            let row = "\"id\", \"attempts\", \"payload\", \"k\"";
            match form {
                Form::RowLock => panic!("SQLite has no row lock form"),
                Form::Lease => {
                    let candidates = format!(
                        "SELECT \"id\" FROM \"{q}\" WHERE {ready} AND (\"locked_until\" IS NULL OR \
                         \"locked_until\" <= ?1) ORDER BY \"run_at\", \"id\" LIMIT ?2"
                    );
                    // The library's `claim_one` for one row, `claim` for more.
                    let cmp = if batch == 1 { "=" } else { "IN" };
                    let claim = format!(
                        "UPDATE \"{q}\" SET \"locked_until\" = ?3, \"attempts\" = \"attempts\" + 1 \
                         WHERE \"id\" {cmp} ({candidates}) RETURNING {row}"
                    );
                    let ack =
                        format!("DELETE FROM \"{q}\" WHERE \"id\" = ?1 AND \"locked_until\" = ?2");
                    let mut ack_many = Vec::new();
                    let mut slots = 1;
                    while slots <= size_class(batch) {
                        let tuples: Vec<String> = (0..slots)
                            .map(|i| format!("(?{}, ?{})", 2 * i + 1, 2 * i + 2))
                            .collect();
                        ack_many.push(format!(
                            "DELETE FROM \"{q}\" WHERE (\"id\", \"locked_until\") IN (VALUES {}) \
                             RETURNING \"id\"",
                            tuples.join(", ")
                        ));
                        slots *= 2;
                    }
                    Box::new(Lease {
                        c,
                        writer: &self.writer,
                        claim,
                        ack,
                        ack_many,
                        batch,
                    })
                }
                Form::Advisory => Box::new(Advisory {
                    c,
                    writer: &self.writer,
                    keys: &self.keys,
                    candidates: format!(
                        "SELECT \"id\", \"run_at\", \"k\" FROM \"{q}\" WHERE {ready} \
                         ORDER BY \"run_at\", \"id\" LIMIT ?2"
                    ),
                    take: format!(
                        "UPDATE \"{q}\" SET \"attempts\" = \"attempts\" + 1 WHERE {ready} AND \
                         \"id\" = ?2 RETURNING {row}"
                    ),
                    ack: format!("DELETE FROM \"{q}\" WHERE \"id\" = ?1"),
                    table: q.to_string(),
                    batch,
                    scan: (batch * 4).max(32),
                }),
            }
        }
    }

    /// The lease claim (one statement under the writer lock), then one fenced delete of the
    /// rows claimed (the single ack, or the grouped `DELETE .. IN (VALUES ..)`).
    struct Lease<'a> {
        c: Connection,
        writer: &'a Mutex<()>,
        claim: String,
        ack: String,
        ack_many: Vec<String>,
        batch: usize,
    }

    impl RawConn for Lease<'_> {
        fn round(&mut self) -> Option<u64> {
            let now = SystemTime::now();
            let token = epoch_secs(lease_token(now));
            let ids: Vec<i64> = {
                let _w = self.writer.lock().unwrap();
                let mut st = self.c.prepare_cached(&self.claim).unwrap();
                let rows = st
                    .query_map(params![epoch_secs(now), self.batch as i64, token], |r| {
                        black_box(r.get::<_, Vec<u8>>(2)?);
                        r.get::<_, i64>(0)
                    })
                    .unwrap();
                rows.collect::<rusqlite::Result<_>>().unwrap()
            };
            if ids.is_empty() {
                return None;
            }
            let _w = self.writer.lock().unwrap();
            if ids.len() == 1 {
                let mut st = self.c.prepare_cached(&self.ack).unwrap();
                assert_eq!(st.execute(params![ids[0], token]).unwrap(), 1);
            } else {
                let slots = size_class(ids.len());
                let sql = &self.ack_many[slots.trailing_zeros() as usize];
                let mut st = self.c.prepare_cached(sql).unwrap();
                let params = (0..slots).flat_map(|i| [ids[i.min(ids.len() - 1)], token]);
                let deleted = st
                    .query_map(params_from_iter(params), |r| r.get::<_, i64>(0))
                    .unwrap()
                    .count();
                assert_eq!(deleted, ids.len());
            }
            Some(ids.len() as u64)
        }
    }

    /// Candidates; up to `batch` rows taken whose keys are free (keys in a process-wide set);
    /// each deleted, its key freed.
    struct Advisory<'a> {
        c: Connection,
        writer: &'a Mutex<()>,
        keys: &'a Mutex<HashSet<String>>,
        candidates: String,
        take: String,
        ack: String,
        table: String,
        batch: usize,
        scan: usize,
    }

    impl RawConn for Advisory<'_> {
        fn round(&mut self) -> Option<u64> {
            let now = epoch_secs(SystemTime::now());
            let candidates: Vec<(i64, Option<String>)> = {
                let mut st = self.c.prepare_cached(&self.candidates).unwrap();
                let rows = st
                    .query_map(params![now, self.scan as i64], |r| {
                        Ok((r.get(0)?, r.get(2)?))
                    })
                    .unwrap();
                rows.collect::<rusqlite::Result<_>>().unwrap()
            };
            if candidates.is_empty() {
                return None;
            }
            let mut taken = Vec::with_capacity(self.batch);
            for (id, k) in candidates {
                if taken.len() >= self.batch {
                    break;
                }
                let key = format!("{}-{}", self.table, k.unwrap_or_default());
                if !self.keys.lock().unwrap().insert(key.clone()) {
                    continue;
                }
                let took = {
                    let _w = self.writer.lock().unwrap();
                    let mut st = self.c.prepare_cached(&self.take).unwrap();
                    match st.query_row(params![now, id], |r| r.get::<_, Vec<u8>>(2)) {
                        Ok(payload) => {
                            black_box(payload);
                            true
                        }
                        Err(rusqlite::Error::QueryReturnedNoRows) => false,
                        Err(e) => panic!("take: {e}"),
                    }
                };
                if took {
                    taken.push((id, key));
                } else {
                    self.keys.lock().unwrap().remove(&key);
                }
            }
            let n = taken.len() as u64;
            for (id, key) in taken {
                {
                    let _w = self.writer.lock().unwrap();
                    let mut st = self.c.prepare_cached(&self.ack).unwrap();
                    assert_eq!(st.execute(params![id]).unwrap(), 1);
                }
                self.keys.lock().unwrap().remove(&key);
            }
            Some(n)
        }
    }

    pub fn run(set: &Settings) -> Vec<Row> {
        let dir = std::env::temp_dir().join("sqlbroker-bench");
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join(format!("{}.db", unique("burn")));
        // Declared first, so it runs last: once the broker and the connections are closed.
        let _cleanup = OnDrop(|| {
            for suffix in ["", "-wal", "-shm"] {
                let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
            }
        });
        let broker = Broker::builder(&format!("sqlite:{}", path.display()))
            .pool_size(POOL)
            .build()
            .expect("sqlite broker");
        let tables = Tables::create(&broker, "burn");
        let lite = Lite {
            admin: Mutex::new(open(&path)),
            path: path.clone(),
            broker,
            tables,
            writer: Mutex::new(()),
            keys: Mutex::default(),
        };
        println!("== sqlite (load {})", load_average());
        run_db(&lite, &cells(false, &[1, 100]), set, None)
    }
}
