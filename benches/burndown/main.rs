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
//!   `ack` (grouped by the library's group commit). Its pgbench figure is `pg-commit1.sql`
//!   from as many clients as handler threads: one row per commit, the floor of any durable
//!   per-job ack.
//! - `lease_all`: the explicit batch path, `workers(4).batch_size(100)`, 4 handler threads each
//!   taking `next_batch(100, ..)` and settling it with `Delivery::ack_all`.
//! - `lease_d32`, `lease_d`: as `lease_h32` and `lease/w4/b100` (32 and 4 handler threads,
//!   plain `ack`), with `AckMode::Deferred { within: BURNDOWN_DEFER_MS, default 10 ms }`: the
//!   clock runs until `Subscription::close` has written the last queued ack.
//!
//! Under each cell a line gives the client CPU per job in microseconds of every run of each
//! side: this process's `getrusage` (user + system, all threads) over the run, divided by its
//! jobs (the library run includes starting and shutting down its subscription); and its
//! context switches per job (voluntary and involuntary, all threads), where hand-offs between
//! threads show.
//!
//! The raw side: `w` threads, one connection each (opened and prepared before the clock starts),
//! each looping the protocol until the table is empty:
//!
//! - row lock: `BEGIN`; claim 1 `FOR UPDATE SKIP LOCKED`; `DELETE`; `COMMIT`;
//! - lease, batch `b`: the library's lease claim of `b` rows in one statement (MySQL: its claim
//!   transaction; PostgreSQL: from a claim cursor as the library's, one per connection), then one token-fenced delete of the rows claimed: the table's single ack for
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
//! Backlog (`<db>/backlog`, run only when a filter names it): the lease headline configuration
//! over a `BURNDOWN_BACKLOG_ROWS` (default 1,000,000) job burn-down, the rate of each tenth,
//! against `BURNDOWN_BACKLOG_SHORT` (default 30,000) jobs, alternating (see `backlog.rs`).
//!
//! Servers: `SQLBROKER_PG_URL` (default `postgres://postgres@127.0.0.1:5432/test?sslmode=disable`: the raw side connects without TLS, so the library must too),
//! `SQLBROKER_MYSQL_URL` (default `mysql://root@127.0.0.1:3306/test`); a server that does not
//! answer is skipped with a loud banner. SQLite runs on a file in the temp directory with the
//! library's default pragmas (WAL, `synchronous = FULL`).

// What the per-database modules (`pg`, `my`, `sqlite`) take with `use super::*`.
use std::collections::HashSet;
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use sqlbroker::{Broker, Table};

mod args;
mod backlog;
mod cell;
#[cfg(feature = "mysql")]
mod my;
#[cfg(feature = "postgres")]
mod pg;
mod pgbench;
mod report;
mod scale;
mod sides;
#[cfg(feature = "sqlite")]
mod sqlite;
mod tables;
mod util;

use args::*;
use cell::*;
use pgbench::*;
use report::*;
use scale::*;
use sides::*;
use tables::*;
use util::*;

/// The body of every message.
pub(crate) const PAYLOAD: [u8; 64] = [b'x'; 64];
/// Lease of the lease tables.
pub(crate) const LEASE: Duration = Duration::from_secs(60);
/// Messages per `publish_batch` when filling a table.
pub(crate) const PUBLISH_CHUNK: u64 = 500;
/// How long a run may make no progress before the bench gives up.
pub(crate) const STALL: Duration = Duration::from_secs(30);
/// Raw transactions rolled back and retried after a deadlock or lock wait timeout (MySQL).
pub(crate) static RAW_RETRIES: AtomicU64 = AtomicU64::new(0);
/// Rows per `next_batch` of the last `ack_all` library run, x 100.
pub(crate) static LAST_BATCH_MEAN: AtomicU64 = AtomicU64::new(0);
/// Connections of the library's pool: more than any cell's deliveries that hold one.
pub(crate) const POOL: u32 = 24;

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
    print_summary(&all);
}
