//! Throughput: the library against a hand-written loop running the same SQL.
//!
//! The database is the bottleneck; the library's job is to add nothing. Every benchmark here
//! comes in two flavours on the same database and the same table:
//!
//! - `library`: the public API (`Broker::publish`, `Broker::publish_batch`, a subscription with
//!   `workers(1)` and a handler loop `next_delivery` + `ack` on the bench thread);
//! - `raw`: the driver (`postgres`, `rusqlite`, `mysql`) used directly, on one connection, running
//!   the statements the library runs (the exact text `compile()` builds in `src/dialect/<db>/sql.rs`,
//!   pinned by the dialects' unit tests), prepared once.
//!
//! `library / raw` is the library's overhead. Ids read `<db>/<benchmark>/<library|raw>`, where
//! `<db>` is `sqlite`, `postgres`, and `mariadb` or `mysql` as the server reports itself.
//! Diagnostics beside them: `sqlite/lease_batch1/raw_two_conns` (claims on one connection, acks on
//! a second), `sqlite/lease_batch1/raw_eq_select` (the claim spelled `id = (SELECT ..)` instead of
//! `id IN (SELECT ..)`), and `baseline/thread_round_trip/*` (what handing work between two threads
//! costs with no database at all).
//!
//! The claim->ack cycles use `iter_custom`: each sample fills the table with exactly as many rows
//! as it times cycles (outside the timed part), starts the subscription (outside the timed part;
//! its first claim may race the timer's start, at most one claim per sample), times the cycles
//! and shuts the subscription down. Tables have names of their own and are dropped at the end.
//!
//! Servers: `SQLBROKER_PG_URL` (default `postgres://postgres@127.0.0.1:5432/test?sslmode=disable`: the raw side connects without TLS, so the library must too) and
//! `SQLBROKER_MYSQL_URL` (default `mysql://root@127.0.0.1:3306/test`). A server that does not
//! answer is skipped with a loud message. SQLite runs on a file in the temp directory, with the
//! pragmas the library sets by default (WAL, `synchronous = FULL`, a busy timeout).
//!
//! Run: `cargo bench --bench throughput` (about three minutes on two cores, after the build).
//! `BENCHMARKS.md` has the results and what they say.

use std::cell::RefCell;
use std::hint::black_box;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use criterion::measurement::WallTime;
use criterion::{
    criterion_group, criterion_main, BenchmarkGroup, Criterion, SamplingMode, Throughput,
};
use sqlbroker::{Broker, Message, SubscriptionBuilder, Table};

/// The body of every message.
const PAYLOAD: [u8; 64] = [b'x'; 64];
/// Messages per `publish_batch`.
const BATCH: usize = 100;
/// The library's default claim batch (`SubscriptionBuilder::batch_size`), which the raw lease and
/// SQLite advisory loops use too.
const CLAIM_BATCH: usize = 10;
/// Candidate rows an advisory claim reads: the library's `(batch_size * 4).max(32)`.
const ADVISORY_SCAN: usize = 40;
/// Lease of the lease tables; long enough that no renewal round matters.
const LEASE: Duration = Duration::from_secs(60);
/// The busy work each side of the `parked` thread round trip does before it answers.
const PARKED_WORK: Duration = Duration::from_micros(25);
/// How long a handler waits for a delivery before the bench gives up.
const STALL: Duration = Duration::from_secs(30);

fn config() -> Criterion {
    Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(700))
        .measurement_time(Duration::from_secs(4))
        .without_plots()
}

/// A name no other table (or bench process) uses.
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

#[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
fn skip(db: &str, url: &str, var: &str, why: &dyn std::fmt::Display) {
    eprintln!();
    eprintln!(
        "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!"
    );
    eprintln!("!!!!! SKIPPED: {db} benches: {url} is not reachable ({why})");
    eprintln!("!!!!! set {var} or start the server");
    eprintln!(
        "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!"
    );
    eprintln!();
}

/// Seconds since the epoch, rounded down.
fn epoch_secs(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// `t` rounded down to a whole second (the library's `claim_now` and `due_at(now, 0)`).
fn floor(t: SystemTime) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(epoch_secs(t) as u64)
}

/// The lease token a claim at `now` writes (the library's `lease_token`: `ceil(now) + lease`).
fn lease_token(now: SystemTime) -> SystemTime {
    let f = floor(now);
    let ceil = if f == now {
        f
    } else {
        f + Duration::from_secs(1)
    };
    ceil + LEASE
}

/// The three table descriptions of one database (the text column `k` in every one; advisory
/// keys `<table>-{k}`, one key per row), created by the library so the raw loops run on the schema
/// `create_table` makes. `plain` is the row lock table (a lease table on SQLite, which has no row
/// locks), into which the publish benchmarks insert.
struct Tables {
    plain: Table,
    lease: Table,
    advisory: Table,
}

impl Tables {
    fn create(broker: &Broker, prefix: &str) -> Tables {
        let plain = Table::new(unique(&format!("{prefix}_rl"))).text_column("k");
        // SQLite has no row lock form: its publish benchmarks insert into a lease table (the
        // same insert, the library's and the raw loop's alike).
        let plain = if broker.database() == "SQLite" {
            plain.lease(LEASE)
        } else {
            plain
        };
        let lease = Table::new(unique(&format!("{prefix}_ls")))
            .text_column("k")
            .lease(LEASE);
        // Keys belong to the database: named after their table, no other user of the server (a
        // test suite running beside the benches) holds one of them.
        let name = unique(&format!("{prefix}_ad"));
        let template = format!("{name}-{{k}}");
        let advisory = Table::new(name).text_column("k").advisory_lock(template);
        for t in [&plain, &lease, &advisory] {
            broker.create_table(t).expect("create table");
        }
        Tables {
            plain,
            lease,
            advisory,
        }
    }

    #[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
    fn names(&self) -> [&str; 3] {
        [self.plain.name(), self.lease.name(), self.advisory.name()]
    }
}

/// One message of the publish benchmarks.
fn message(i: u64) -> Message {
    Message::new(PAYLOAD.to_vec()).set("k", format!("k-{i}"))
}

/// The library's claim->ack cycle: `n` rows are in the table; the subscription `sub` starts and
/// hands them to this thread, which acks each. Times the `n` cycles only.
fn library_cycles(sub: SubscriptionBuilder<'_>, n: u64) -> Duration {
    let sub = sub.start().expect("start subscription");
    let start = Instant::now();
    for _ in 0..n {
        let d = match sub.next_delivery_timeout(STALL) {
            Ok(d) => d,
            Err(e) => panic!(
                "no delivery within {STALL:?} ({e}); last error: {:?}",
                sub.last_error()
            ),
        };
        black_box(d.payload());
        black_box(d.get("k"));
        d.ack().expect("ack");
    }
    let elapsed = start.elapsed();
    sub.shutdown(Duration::from_secs(5)).expect("shutdown");
    elapsed
}

/// The library's publish of `n` single messages.
fn library_publish(broker: &Broker, table: &Table, n: u64) -> Duration {
    let start = Instant::now();
    for i in 0..n {
        broker.publish(table, message(i)).expect("publish");
    }
    start.elapsed()
}

/// The library's publish of `n` batches of [`BATCH`] messages.
fn library_publish_batch(broker: &Broker, table: &Table, n: u64) -> Duration {
    let start = Instant::now();
    for b in 0..n {
        let batch = (0..BATCH as u64)
            .map(|i| message(b * BATCH as u64 + i))
            .collect::<Vec<_>>();
        broker.publish_batch(table, batch).expect("publish batch");
    }
    start.elapsed()
}

/// A group of benchmarks whose iteration handles `elements` messages.
fn group<'a>(c: &'a mut Criterion, name: &str, elements: u64) -> BenchmarkGroup<'a, WallTime> {
    let mut g = c.benchmark_group(name);
    g.sampling_mode(SamplingMode::Flat)
        .throughput(Throughput::Elements(elements));
    g
}

/// An insert of `rows` rows, as the library's `insert_one` (`rows` = 1) and `insert_many` spell
/// it: `p(n)` spells parameter `n`.
fn insert_sql(t: &str, rows: usize, p: fn(usize) -> String) -> String {
    let tuples: Vec<String> = (0..rows)
        .map(|r| format!("({}, {}, {})", p(3 * r + 1), p(3 * r + 2), p(3 * r + 3)))
        .collect();
    format!(
        "INSERT INTO \"{t}\" (\"payload\", \"run_at\", \"k\") VALUES {}",
        tuples.join(", ")
    )
}

/// Busy-waits `d` (a stand-in for a statement's round trip, during which the other side parks).
fn spin(d: Duration) {
    let until = Instant::now() + d;
    while Instant::now() < until {
        std::hint::spin_loop();
    }
}

/// The floor under a one-worker claim->ack cycle that is not in the raw loop: a round trip
/// between two threads (the handler's settlement wakes the claim worker, whose delivery wakes
/// the handler), through two crossbeam channels and nothing else. `immediate`: each side answers
/// at once, so the waiter usually catches the message while it still spins. `parked`: each side
/// first busy-waits [`PARKED_WORK`] (as a thread running a statement would), so the other has
/// parked and must be woken; subtract 2 x [`PARKED_WORK`] to get the cost of the two wake-ups.
fn baseline(c: &mut Criterion) {
    let mut g = group(c, "baseline/thread_round_trip", 1);
    for (name, work) in [("immediate", Duration::ZERO), ("parked", PARKED_WORK)] {
        let (to_worker, worker_rx) = crossbeam_channel::bounded::<u64>(1);
        let (to_handler, handler_rx) = crossbeam_channel::bounded::<u64>(1);
        let worker = std::thread::spawn(move || {
            for v in worker_rx {
                spin(work);
                if to_handler.send(v).is_err() {
                    break;
                }
            }
        });
        g.bench_function(name, |b| {
            b.iter(|| {
                to_worker.send(1).unwrap();
                let v = handler_rx.recv().unwrap();
                spin(work);
                v
            })
        });
        drop(to_worker);
        worker.join().unwrap();
    }
    g.finish();
}

/// Registers benchmark `id` of `g`, timed by `time(n)` for `n` iterations.
fn timed(g: &mut BenchmarkGroup<'_, WallTime>, id: &str, mut time: impl FnMut(u64) -> Duration) {
    g.bench_function(id, |b| b.iter_custom(&mut time));
}

/// The group `name` (`<db>/<benchmark>`): `library` against `raw`, each timing `n` iterations
/// that handle `elements` messages apiece.
fn compare(
    c: &mut Criterion,
    name: &str,
    elements: u64,
    library: impl FnMut(u64) -> Duration,
    raw: impl FnMut(u64) -> Duration,
) {
    let mut g = group(c, name, elements);
    timed(&mut g, "library", library);
    timed(&mut g, "raw", raw);
    g.finish();
}

/// The raw side of one database: a driver connection and the statements the library runs,
/// prepared on it.
trait Driver {
    /// Empties table `t`.
    fn clear(&mut self, t: &str);
    /// Empties `t` and puts `n` due rows in it, keys `k-0` .. `k-{n-1}` (untimed).
    fn fill(&mut self, t: &str, n: u64);
    /// Times `n` single-row inserts into the plain table: the raw `publish`.
    fn publish(&mut self, n: u64) -> Duration;
    /// Times `n` inserts of [`BATCH`] rows into the plain table: the raw `publish_batch`.
    fn publish_batch(&mut self, n: u64) -> Duration;
}

/// The benchmarks of one database, ids `<db>/<benchmark>/..`: the library through `broker`,
/// the raw loops through `raw`. Both sides of a group empty and fill tables with `raw`, hence
/// the `RefCell`.
struct Bench<'a, D> {
    db: &'a str,
    broker: &'a Broker,
    tables: &'a Tables,
    raw: RefCell<D>,
}

impl<'a, D: Driver> Bench<'a, D> {
    fn new(db: &'a str, broker: &'a Broker, tables: &'a Tables, raw: D) -> Self {
        Bench {
            db,
            broker,
            tables,
            raw: RefCell::new(raw),
        }
    }

    fn id(&self, benchmark: &str) -> String {
        format!("{}/{benchmark}", self.db)
    }

    /// `<db>/publish` and `<db>/publish_batch100`, into the plain table.
    fn publish(&self, c: &mut Criterion) {
        let (broker, plain, raw) = (self.broker, &self.tables.plain, &self.raw);
        compare(
            c,
            &self.id("publish"),
            1,
            self.on_empty(|n| library_publish(broker, plain, n)),
            self.on_empty(|n| raw.borrow_mut().publish(n)),
        );
        compare(
            c,
            &self.id("publish_batch100"),
            BATCH as u64,
            self.on_empty(|n| library_publish_batch(broker, plain, n)),
            self.on_empty(|n| raw.borrow_mut().publish_batch(n)),
        );
    }

    /// Times `time(n)` on an empty plain table.
    fn on_empty<'s>(
        &'s self,
        mut time: impl FnMut(u64) -> Duration + 's,
    ) -> impl FnMut(u64) -> Duration + 's {
        move |n| {
            self.raw.borrow_mut().clear(self.tables.plain.name());
            time(n)
        }
    }

    /// `<db>/<benchmark>`: claim->ack cycles on `table`, the library's one-worker subscription
    /// against the raw loop `raw`.
    fn cycles(
        &self,
        c: &mut Criterion,
        benchmark: &str,
        table: &Table,
        raw: impl FnMut(&mut D, u64) -> Duration,
    ) {
        compare(
            c,
            &self.id(benchmark),
            1,
            self.library_cycles_on(table, |sub| sub),
            self.raw_cycles_on(table, raw),
        );
    }

    /// Times `n` library cycles on `n` fresh rows of `table`, through a one-worker subscription
    /// that `configure` may set up further.
    fn library_cycles_on<'s>(
        &'s self,
        table: &'s Table,
        configure: impl Fn(SubscriptionBuilder<'s>) -> SubscriptionBuilder<'s> + 's,
    ) -> impl FnMut(u64) -> Duration + 's {
        move |n| {
            self.raw.borrow_mut().fill(table.name(), n);
            library_cycles(configure(self.broker.subscription(table).workers(1)), n)
        }
    }

    /// Times the raw loop `raw` over `n` fresh rows of `table`.
    fn raw_cycles_on<'s>(
        &'s self,
        table: &'s Table,
        mut raw: impl FnMut(&mut D, u64) -> Duration + 's,
    ) -> impl FnMut(u64) -> Duration + 's {
        move |n| {
            let driver = &mut *self.raw.borrow_mut();
            driver.fill(table.name(), n);
            raw(driver, n)
        }
    }
}

/// Runs its closure when dropped: the bench tables go even when a benchmark panics.
struct OnDrop<F: FnMut()>(F);

impl<F: FnMut()> Drop for OnDrop<F> {
    fn drop(&mut self) {
        (self.0)()
    }
}

/// The URL in `var` (or `default`), the broker on it and the raw connection `connect` opens;
/// `None`, after a loud banner, when the server does not answer.
#[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
fn server<C, E: std::fmt::Display>(
    db: &str,
    var: &str,
    default: &str,
    connect: impl FnOnce(&str) -> Result<C, E>,
) -> Option<(String, Broker, C)> {
    let url = std::env::var(var).unwrap_or_else(|_| default.to_string());
    let opened = Broker::builder(&url)
        .connection_timeout(Duration::from_secs(5))
        .build()
        .map_err(|e| e.to_string())
        .and_then(|broker| Ok((broker, connect(&url).map_err(|e| e.to_string())?)));
    match opened {
        Ok((broker, conn)) => Some((url, broker, conn)),
        Err(why) => {
            skip(db, &url, var, &why);
            None
        }
    }
}

fn benches(c: &mut Criterion) {
    baseline(c);
    #[cfg(feature = "sqlite")]
    sqlite::benches(c);
    #[cfg(feature = "postgres")]
    pg::benches(c);
    #[cfg(feature = "mysql")]
    my::benches(c);
}

#[cfg(feature = "sqlite")]
mod sqlite {
    use super::*;
    use rusqlite::{params, params_from_iter, Connection};
    use std::collections::HashSet;
    use std::sync::Mutex;

    fn p(n: usize) -> String {
        format!("?{n}")
    }

    /// The statements of `src/dialect/sqlite/sql.rs` for these tables.
    struct Sql {
        /// The advisory table, whose name starts its keys.
        adv_table: String,
        insert_one: String,
        insert_batch: String,
        /// Lease claim as the library spells it: `id IN (SELECT .. LIMIT ?2 + 0)` (SQLite
        /// compiles a statement with a bare `LIMIT ?` again at every execution).
        lease_claim: String,
        /// The same claim with `id = (SELECT .. LIMIT ?2 + 0)`: only right for a limit of 1.
        lease_claim_eq: String,
        lease_ack: String,
        adv_candidates: String,
        adv_take: String,
        adv_ack: String,
    }

    fn sql(t: &Tables) -> Sql {
        let (ls, ad) = (t.lease.name(), t.advisory.name());
        let lease_claim = |cmp: &str| {
            format!(
                "UPDATE \"{ls}\" SET \"locked_until\" = ?3, \"attempts\" = \"attempts\" + 1 WHERE \"id\" {cmp} \
                 (SELECT \"id\" FROM \"{ls}\" WHERE \"dead_at\" IS NULL AND \"run_at\" <= ?1 AND \
                 (\"locked_until\" IS NULL OR \"locked_until\" <= ?1) ORDER BY \"run_at\", \"id\" LIMIT ?2 + 0) \
                 RETURNING \"id\", \"attempts\", \"payload\", \"k\""
            )
        };
        Sql {
            adv_table: t.advisory.name().to_string(),
            insert_one: insert_sql(t.plain.name(), 1, p),
            insert_batch: insert_sql(t.plain.name(), BATCH, p),
            lease_claim: lease_claim("IN"),
            lease_claim_eq: lease_claim("="),
            lease_ack: format!("DELETE FROM \"{ls}\" WHERE \"id\" = ?1 AND \"locked_until\" = ?2"),
            adv_candidates: format!(
                "SELECT \"id\", \"k\" FROM \"{ad}\" WHERE \"dead_at\" IS NULL AND \"run_at\" <= ?1 \
                 ORDER BY \"run_at\", \"id\" LIMIT ?2 + 0"
            ),
            adv_take: format!(
                "UPDATE \"{ad}\" SET \"attempts\" = \"attempts\" + 1 WHERE \"dead_at\" IS NULL AND \"run_at\" <= ?1 \
                 AND \"id\" = ?2 RETURNING \"id\", \"attempts\", \"payload\", \"k\""
            ),
            adv_ack: format!("DELETE FROM \"{ad}\" WHERE \"id\" = ?1"),
        }
    }

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

    /// The raw side: `conn` runs everything but the acks of `raw_two_conns`, which go to `conn2`.
    struct Raw {
        conn: Connection,
        conn2: Connection,
        sql: Sql,
    }

    impl Driver for Raw {
        fn clear(&mut self, t: &str) {
            self.conn
                .execute_batch(&format!("DELETE FROM \"{t}\""))
                .expect("clear table");
        }

        fn fill(&mut self, t: &str, n: u64) {
            self.clear(t);
            let sql = format!(
                "WITH RECURSIVE s(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM s WHERE i + 1 < ?3) \
                 INSERT INTO \"{t}\" (\"payload\", \"run_at\", \"k\") SELECT ?1, ?2, 'k-' || i FROM s"
            );
            let run_at = epoch_secs(SystemTime::now()) - 1;
            self.conn
                .execute(&sql, params![PAYLOAD.to_vec(), run_at, n as i64])
                .expect("fill");
        }

        fn publish(&mut self, n: u64) -> Duration {
            let Raw { conn, sql, .. } = self;
            let start = Instant::now();
            for i in 0..n {
                let run_at = epoch_secs(floor(SystemTime::now()));
                let mut st = conn.prepare_cached(&sql.insert_one).unwrap();
                st.execute(params![PAYLOAD.to_vec(), run_at, format!("k-{i}")])
                    .unwrap();
            }
            start.elapsed()
        }

        fn publish_batch(&mut self, n: u64) -> Duration {
            let Raw { conn, sql, .. } = self;
            let start = Instant::now();
            for batch in 0..n {
                let run_at = epoch_secs(floor(SystemTime::now()));
                let mut values: Vec<rusqlite::types::Value> = Vec::with_capacity(3 * BATCH);
                for i in 0..BATCH as u64 {
                    values.push(PAYLOAD.to_vec().into());
                    values.push(run_at.into());
                    values.push(format!("k-{}", batch * BATCH as u64 + i).into());
                }
                let mut st = conn.prepare_cached(&sql.insert_batch).unwrap();
                st.execute(params_from_iter(values)).unwrap();
            }
            start.elapsed()
        }
    }

    type Row = (i64, i64, Vec<u8>, Option<String>);

    fn read_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<Row> {
        Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?))
    }

    impl Raw {
        /// Raw lease loop: `claim` with `LIMIT batch` on `conn`, then the fenced delete of each row
        /// it took on `ack_conn` (`conn`, or `conn2` as the library's pool may hand out).
        fn lease(&self, claim: &str, ack_conn: &Connection, batch: usize, n: u64) -> Duration {
            let (conn, ack) = (&self.conn, &self.sql.lease_ack);
            let start = Instant::now();
            let mut done = 0u64;
            while done < n {
                let now = SystemTime::now();
                let token = epoch_secs(lease_token(now));
                let rows: Vec<Row> = {
                    let mut st = conn.prepare_cached(claim).unwrap();
                    let rows = st
                        .query_map(params![epoch_secs(now), batch as i64, token], read_row)
                        .unwrap();
                    rows.collect::<rusqlite::Result<_>>().unwrap()
                };
                assert!(!rows.is_empty(), "raw lease claim found no row");
                for row in rows {
                    let (id, ..) = black_box(row);
                    let changed = ack_conn
                        .prepare_cached(ack)
                        .unwrap()
                        .execute(params![id, token])
                        .unwrap();
                    assert_eq!(changed, 1);
                    done += 1;
                }
            }
            start.elapsed()
        }

        /// Raw advisory loop with the keys kept in the process (as the library keeps them on
        /// SQLite: a mutex-guarded set): select candidates, take up to a batch of rows whose keys are
        /// free, then delete each and free its key.
        fn advisory(&mut self, n: u64) -> Duration {
            let Raw { conn, sql, .. } = self;
            let keys: Mutex<HashSet<String>> = Mutex::default();
            let start = Instant::now();
            let mut done = 0u64;
            while done < n {
                let now = epoch_secs(SystemTime::now());
                let candidates: Vec<(i64, Option<String>)> = {
                    let mut st = conn.prepare_cached(&sql.adv_candidates).unwrap();
                    let rows = st
                        .query_map(params![now, ADVISORY_SCAN as i64], |r| {
                            Ok((r.get(0)?, r.get(1)?))
                        })
                        .unwrap();
                    rows.collect::<rusqlite::Result<_>>().unwrap()
                };
                let mut taken = Vec::with_capacity(CLAIM_BATCH);
                for (id, k) in candidates {
                    if taken.len() >= CLAIM_BATCH {
                        break;
                    }
                    let key = format!("{}-{}", sql.adv_table, k.unwrap_or_default());
                    if !keys.lock().unwrap().insert(key.clone()) {
                        continue;
                    }
                    let mut st = conn.prepare_cached(&sql.adv_take).unwrap();
                    match st.query_row(params![now, id], read_row) {
                        Ok(row) => taken.push((black_box(row).0, key)),
                        Err(rusqlite::Error::QueryReturnedNoRows) => {
                            keys.lock().unwrap().remove(&key);
                        }
                        Err(e) => panic!("take: {e}"),
                    }
                }
                assert!(!taken.is_empty(), "raw advisory claim took no row");
                for (id, key) in taken {
                    let changed = conn
                        .prepare_cached(&sql.adv_ack)
                        .unwrap()
                        .execute(params![id])
                        .unwrap();
                    assert_eq!(changed, 1);
                    keys.lock().unwrap().remove(&key);
                    done += 1;
                }
            }
            start.elapsed()
        }
    }

    pub fn benches(c: &mut Criterion) {
        let dir = std::env::temp_dir().join("sqlbroker-bench");
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join(format!("{}.db", unique("bench")));
        // Declared first, so it runs last: once the broker and the raw connections are closed.
        let _cleanup = OnDrop(|| {
            for suffix in ["", "-wal", "-shm"] {
                let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
            }
        });
        let broker = Broker::connect(&format!("sqlite:{}", path.display())).expect("sqlite broker");
        let tables = Tables::create(&broker, "bench");
        let sql = sql(&tables);
        let (conn, conn2) = (open(&path), open(&path));
        let bench = Bench::new("sqlite", &broker, &tables, Raw { conn, conn2, sql });
        let ls = &tables.lease;

        bench.publish(c);
        bench.cycles(c, "lease", ls, |r, n| {
            r.lease(&r.sql.lease_claim, &r.conn, CLAIM_BATCH, n)
        });

        // SQL-NOTES: `id IN (SELECT .. LIMIT n)` against `id = (SELECT ..)` for a batch of 1.
        let mut g = group(c, "sqlite/lease_batch1", 1);
        let library = bench.library_cycles_on(ls, |sub| sub.batch_size(1));
        let raw = |r: &mut Raw, n| r.lease(&r.sql.lease_claim, &r.conn, 1, n);
        let two_conns = |r: &mut Raw, n| r.lease(&r.sql.lease_claim, &r.conn2, 1, n);
        let eq_select = |r: &mut Raw, n| r.lease(&r.sql.lease_claim_eq, &r.conn, 1, n);
        timed(&mut g, "library", library);
        timed(&mut g, "raw", bench.raw_cycles_on(ls, raw));
        timed(&mut g, "raw_two_conns", bench.raw_cycles_on(ls, two_conns));
        timed(&mut g, "raw_eq_select", bench.raw_cycles_on(ls, eq_select));
        g.finish();

        bench.cycles(c, "advisory", &tables.advisory, Raw::advisory);
    }
}

#[cfg(feature = "postgres")]
mod pg {
    use super::*;
    use postgres::types::ToSql;
    use postgres::{Client, NoTls, Row, Statement};

    const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable";

    fn p(n: usize) -> String {
        format!("${n}")
    }

    /// The statements of `src/dialect/postgres/sql.rs` for these tables, prepared on the raw
    /// connection.
    struct Sql {
        /// The advisory table, whose name starts its keys.
        adv_table: String,
        insert_one: Statement,
        insert_batch: Statement,
        /// `BEGIN ISOLATION LEVEL READ COMMITTED`, run as the library runs it (simple query).
        begin: &'static str,
        row_claim: Statement,
        row_ack: Statement,
        lease_claim: Statement,
        lease_ack: Statement,
        adv_candidates: Statement,
        adv_take: Statement,
        adv_ack: Statement,
        key_lock: Statement,
        key_unlock: Statement,
    }

    fn sql(client: &mut Client, t: &Tables) -> Sql {
        let (rl, ls, ad) = (t.plain.name(), t.lease.name(), t.advisory.name());
        let mut prep = |s: String| {
            client
                .prepare(&s)
                .unwrap_or_else(|e| panic!("prepare {s}: {e}"))
        };
        Sql {
            adv_table: t.advisory.name().to_string(),
            insert_one: prep(insert_sql(rl, 1, p)),
            insert_batch: prep(insert_sql(rl, BATCH, p)),
            begin: "BEGIN ISOLATION LEVEL READ COMMITTED",
            row_claim: prep(format!(
                "SELECT \"id\", \"attempts\", \"payload\", \"k\" FROM \"{rl}\" WHERE \"dead_at\" IS NULL AND \
                 \"run_at\" <= $1 ORDER BY \"run_at\", \"id\" LIMIT (SELECT $2::bigint) FOR UPDATE SKIP LOCKED"
            )),
            row_ack: prep(format!("DELETE FROM \"{rl}\" WHERE \"id\" = $1")),
            lease_claim: prep(format!(
                "UPDATE \"{ls}\" AS q SET \"locked_until\" = $3, \"attempts\" = q.\"attempts\" + 1 \
                 WHERE q.\"id\" = ANY(ARRAY(SELECT \"id\" FROM \"{ls}\" WHERE \"dead_at\" IS NULL AND \
                 \"run_at\" <= $1 AND (\"locked_until\" IS NULL OR \"locked_until\" <= $1) ORDER BY \
                 \"run_at\", \"id\" LIMIT (SELECT $2::bigint) FOR UPDATE SKIP LOCKED)) \
                 RETURNING q.\"id\", q.\"attempts\", q.\"payload\", q.\"k\""
            )),
            lease_ack: prep(format!("DELETE FROM \"{ls}\" WHERE \"id\" = $1 AND \"locked_until\" = $2")),
            adv_candidates: prep(format!(
                "SELECT \"id\", \"k\" FROM \"{ad}\" WHERE \"dead_at\" IS NULL AND \"run_at\" <= $1 \
                 ORDER BY \"run_at\", \"id\" LIMIT (SELECT $2::bigint)"
            )),
            adv_take: prep(format!(
                "UPDATE \"{ad}\" SET \"attempts\" = \"attempts\" + 1 WHERE \"dead_at\" IS NULL AND \
                 \"run_at\" <= $1 AND \"id\" = $2 RETURNING \"id\", \"attempts\", \"payload\", \"k\""
            )),
            adv_ack: prep(format!("DELETE FROM \"{ad}\" WHERE \"id\" = $1")),
            key_lock: prep("SELECT pg_try_advisory_lock(hashtextextended($1, 0))::int".into()),
            key_unlock: prep("SELECT pg_advisory_unlock(hashtextextended($1, 0))::int".into()),
        }
    }

    /// The raw side: one client.
    struct Raw {
        client: Client,
        sql: Sql,
    }

    impl Driver for Raw {
        fn clear(&mut self, t: &str) {
            self.client
                .batch_execute(&format!("TRUNCATE \"{t}\""))
                .expect("truncate");
        }

        fn fill(&mut self, t: &str, n: u64) {
            self.clear(t);
            let sql = format!(
                "INSERT INTO \"{t}\" (\"payload\", \"run_at\", \"k\") \
                 SELECT $1, $2, 'k-' || g FROM generate_series(0, $3::bigint - 1) AS g"
            );
            let run_at = floor(SystemTime::now()) - Duration::from_secs(1);
            self.client
                .execute(&sql, &[&PAYLOAD.as_slice(), &run_at, &(n as i64)])
                .expect("fill");
        }

        fn publish(&mut self, n: u64) -> Duration {
            let Raw { client, sql } = self;
            let start = Instant::now();
            for i in 0..n {
                let payload = PAYLOAD.to_vec();
                let run_at = floor(SystemTime::now());
                let k = format!("k-{i}");
                client
                    .execute(&sql.insert_one, &[&payload, &run_at, &k])
                    .unwrap();
            }
            start.elapsed()
        }

        fn publish_batch(&mut self, n: u64) -> Duration {
            let Raw { client, sql } = self;
            let start = Instant::now();
            for batch in 0..n {
                let run_at = floor(SystemTime::now());
                let payloads: Vec<Vec<u8>> = (0..BATCH).map(|_| PAYLOAD.to_vec()).collect();
                let keys: Vec<String> = (0..BATCH as u64)
                    .map(|i| format!("k-{}", batch * BATCH as u64 + i))
                    .collect();
                let mut params: Vec<&(dyn ToSql + Sync)> = Vec::with_capacity(3 * BATCH);
                for (payload, k) in payloads.iter().zip(&keys) {
                    params.push(payload);
                    params.push(&run_at);
                    params.push(k);
                }
                client.execute(&sql.insert_batch, &params).unwrap();
            }
            start.elapsed()
        }
    }

    fn read_row(row: &Row) -> (i64, i32, Vec<u8>, Option<String>) {
        (row.get(0), row.get(1), row.get(2), row.get(3))
    }

    impl Raw {
        /// Raw row lock loop: `BEGIN`; claim one row `FOR UPDATE SKIP LOCKED`; delete it; `COMMIT`.
        fn row_lock(&mut self, n: u64) -> Duration {
            let Raw { client, sql } = self;
            let start = Instant::now();
            for _ in 0..n {
                client.batch_execute(sql.begin).unwrap();
                let now = floor(SystemTime::now());
                let rows = client.query(&sql.row_claim, &[&now, &1i64]).unwrap();
                let (id, ..) = black_box(read_row(
                    rows.first().expect("raw row lock claim found no row"),
                ));
                assert_eq!(client.execute(&sql.row_ack, &[&id]).unwrap(), 1);
                client.batch_execute("COMMIT").unwrap();
            }
            start.elapsed()
        }

        /// Raw lease loop: the claim with `LIMIT 10`, then the fenced delete of each row it took.
        fn lease(&mut self, n: u64) -> Duration {
            let Raw { client, sql } = self;
            let start = Instant::now();
            let mut done = 0u64;
            while done < n {
                let now = SystemTime::now();
                let token = lease_token(now);
                let rows = client
                    .query(
                        &sql.lease_claim,
                        &[&floor(now), &(CLAIM_BATCH as i64), &token],
                    )
                    .unwrap();
                assert!(!rows.is_empty(), "raw lease claim found no row");
                for row in &rows {
                    let (id, ..) = black_box(read_row(row));
                    assert_eq!(client.execute(&sql.lease_ack, &[&id, &token]).unwrap(), 1);
                    done += 1;
                }
            }
            start.elapsed()
        }

        /// Raw advisory loop: select candidates (locking nothing), try the first free key, take the
        /// row under it, delete it, unlock. One row per claim, as the library on a server.
        fn advisory(&mut self, n: u64) -> Duration {
            let Raw { client, sql } = self;
            let start = Instant::now();
            let mut done = 0u64;
            while done < n {
                let now = floor(SystemTime::now());
                let candidates = client
                    .query(&sql.adv_candidates, &[&now, &(ADVISORY_SCAN as i64)])
                    .unwrap();
                let mut took = false;
                for c in &candidates {
                    let id: i64 = c.get(0);
                    let k: Option<String> = c.get(1);
                    let key = format!("{}-{}", sql.adv_table, k.unwrap_or_default());
                    let locked: i32 = client.query_one(&sql.key_lock, &[&key]).unwrap().get(0);
                    if locked != 1 {
                        continue;
                    }
                    let row = client.query_opt(&sql.adv_take, &[&now, &id]).unwrap();
                    if let Some(row) = row {
                        black_box(read_row(&row));
                        assert_eq!(client.execute(&sql.adv_ack, &[&id]).unwrap(), 1);
                        took = true;
                    }
                    let unlocked: i32 = client.query_one(&sql.key_unlock, &[&key]).unwrap().get(0);
                    assert_eq!(unlocked, 1);
                    if took {
                        break;
                    }
                }
                assert!(took, "raw advisory claim took no row");
                done += 1;
            }
            start.elapsed()
        }
    }

    pub fn benches(c: &mut Criterion) {
        let connect = |url: &str| Client::connect(url, NoTls);
        let Some((url, broker, mut client)) =
            server("PostgreSQL", "SQLBROKER_PG_URL", DEFAULT_URL, connect)
        else {
            return;
        };
        let tables = Tables::create(&broker, "bench");
        // Runs once `bench` has closed the raw connection, so it opens one of its own.
        let _cleanup = OnDrop(|| {
            if let Ok(mut client) = connect(&url) {
                for t in tables.names() {
                    let _ = client.batch_execute(&format!(
                        "DROP TABLE IF EXISTS \"{t}\"; DELETE FROM sqlbroker_tables WHERE name = '{t}'"
                    ));
                }
            }
        });
        let sql = sql(&mut client, &tables);
        let bench = Bench::new("postgres", &broker, &tables, Raw { client, sql });

        bench.publish(c);
        bench.cycles(c, "row_lock", &tables.plain, Raw::row_lock);
        bench.cycles(c, "lease", &tables.lease, Raw::lease);
        bench.cycles(c, "advisory", &tables.advisory, Raw::advisory);
    }
}

#[cfg(feature = "mysql")]
mod my {
    use super::*;
    use mysql::prelude::Queryable;
    use mysql::{Conn, Opts, OptsBuilder, Params, Statement};

    const DEFAULT_URL: &str = "mysql://root@127.0.0.1:3306/test";

    /// The statements of `src/dialect/mysql/sql.rs` for these tables, prepared on the raw connection.
    struct Sql {
        /// The advisory table, whose name starts its keys.
        adv_table: String,
        insert_one: Statement,
        insert_batch: Statement,
        /// The claim transaction's opening, run as the library runs it (text protocol).
        begin: [&'static str; 2],
        row_claim: Statement,
        row_ack: Statement,
        lease_claim: Statement,
        /// `lease_mark` over `id IN (..)`, by the power-of-two size class of the ids found.
        lease_mark: Vec<Statement>,
        lease_ack: Statement,
        adv_candidates: Statement,
        adv_take: Statement,
        adv_fetch: Statement,
        adv_ack: Statement,
        key_lock: Statement,
        key_unlock: Statement,
    }

    fn sql(conn: &mut Conn, t: &Tables) -> Sql {
        let (rl, ls, ad) = (t.plain.name(), t.lease.name(), t.advisory.name());
        let mut prep = |s: String| conn.prep(&s).unwrap_or_else(|e| panic!("prepare {s}: {e}"));
        let insert = |rows: usize| insert_sql(rl, rows, |_| "?".into()).replace('"', "`");
        let row = "`id`, `attempts`, `payload`, `k`";
        let ready = "`dead_at` IS NULL AND `run_at` <= ?";
        let mark = |slots: usize| {
            let ids = vec!["?"; slots].join(", ");
            format!("UPDATE `{ls}` SET `locked_until` = ?, `attempts` = `attempts` + 1 WHERE `id` IN ({ids})")
        };
        Sql {
            adv_table: t.advisory.name().to_string(),
            insert_one: prep(insert(1)),
            insert_batch: prep(insert(BATCH)),
            begin: ["SET TRANSACTION ISOLATION LEVEL READ COMMITTED", "START TRANSACTION"],
            row_claim: prep(format!(
                "SELECT {row} FROM `{rl}` WHERE {ready} ORDER BY `run_at`, `id` LIMIT ? FOR UPDATE SKIP LOCKED"
            )),
            row_ack: prep(format!("DELETE FROM `{rl}` WHERE `id` = ?")),
            lease_claim: prep(format!(
                "SELECT {row} FROM `{ls}` WHERE {ready} AND (`locked_until` IS NULL OR `locked_until` <= ?) \
                 ORDER BY `run_at`, `id` LIMIT ? FOR UPDATE SKIP LOCKED"
            )),
            lease_mark: [1, 2, 4, 8, 16].into_iter().map(|n| prep(mark(n))).collect(),
            lease_ack: prep(format!("DELETE FROM `{ls}` WHERE `id` = ? AND `locked_until` = ?")),
            adv_candidates: prep(format!(
                "SELECT `id`, `k` FROM `{ad}` WHERE {ready} ORDER BY `run_at`, `id` LIMIT ?"
            )),
            adv_take: prep(format!("UPDATE `{ad}` SET `attempts` = `attempts` + 1 WHERE {ready} AND `id` = ?")),
            adv_fetch: prep(format!("SELECT {row} FROM `{ad}` WHERE `id` = ?")),
            adv_ack: prep(format!("DELETE FROM `{ad}` WHERE `id` = ?")),
            key_lock: prep("SELECT GET_LOCK(?, 0)".into()),
            key_unlock: prep("SELECT RELEASE_LOCK(?)".into()),
        }
    }

    /// The `GET_LOCK` name of `<db>.<key>` as the dialect's `lock_name`: itself, or its SHA-256
    /// in lowercase hex when longer than 64 characters.
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
        // H. Hinnant's civil_from_days, as the dialect's.
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

    /// The raw connection, with the session the library's connections get.
    fn connect(url: &str) -> mysql::Result<Conn> {
        let opts = Opts::from_url(url)?;
        let opts = OptsBuilder::from_opts(opts)
            .additional_capabilities(mysql::consts::CapabilityFlags::CLIENT_FOUND_ROWS)
            .init(vec!["SET time_zone = '+00:00'"])
            .stmt_cache_size(256)
            .tcp_connect_timeout(Some(Duration::from_secs(5)));
        Conn::new(opts)
    }

    /// The raw side: one connection, and the database its advisory lock names start with.
    struct Raw {
        conn: Conn,
        sql: Sql,
        db: String,
    }

    impl Driver for Raw {
        fn clear(&mut self, t: &str) {
            self.conn
                .query_drop(format!("TRUNCATE TABLE `{t}`"))
                .expect("truncate");
        }

        fn fill(&mut self, t: &str, n: u64) {
            self.clear(t);
            let run_at = datetime(SystemTime::now() - Duration::from_secs(1));
            let mut i = 0u64;
            while i < n {
                let rows = (n - i).min(500) as usize;
                let mut values = Vec::with_capacity(3 * rows);
                for r in 0..rows as u64 {
                    values.push(mysql::Value::Bytes(PAYLOAD.to_vec()));
                    values.push(run_at.clone());
                    values.push(mysql::Value::Bytes(format!("k-{}", i + r).into_bytes()));
                }
                let sql = insert_sql(t, rows, |_| "?".into()).replace('"', "`");
                self.conn
                    .exec_drop(sql, Params::Positional(values))
                    .expect("fill");
                i += rows as u64;
            }
        }

        fn publish(&mut self, n: u64) -> Duration {
            let Raw { conn, sql, .. } = self;
            let start = Instant::now();
            for i in 0..n {
                let params = vec![
                    mysql::Value::Bytes(PAYLOAD.to_vec()),
                    datetime(SystemTime::now()),
                    mysql::Value::Bytes(format!("k-{i}").into_bytes()),
                ];
                conn.exec_drop(&sql.insert_one, Params::Positional(params))
                    .unwrap();
            }
            start.elapsed()
        }

        fn publish_batch(&mut self, n: u64) -> Duration {
            let Raw { conn, sql, .. } = self;
            let start = Instant::now();
            for batch in 0..n {
                let run_at = datetime(SystemTime::now());
                let mut params = Vec::with_capacity(3 * BATCH);
                for i in 0..BATCH as u64 {
                    params.push(mysql::Value::Bytes(PAYLOAD.to_vec()));
                    params.push(run_at.clone());
                    params.push(mysql::Value::Bytes(
                        format!("k-{}", batch * BATCH as u64 + i).into_bytes(),
                    ));
                }
                conn.exec_drop(&sql.insert_batch, Params::Positional(params))
                    .unwrap();
            }
            start.elapsed()
        }
    }

    type Row = (i64, i64, Vec<u8>, Option<String>);

    impl Raw {
        /// Raw row lock loop: `SET TRANSACTION ..`; `START TRANSACTION`; claim one row
        /// `FOR UPDATE SKIP LOCKED`; delete it; `COMMIT`.
        fn row_lock(&mut self, n: u64) -> Duration {
            let Raw { conn, sql, .. } = self;
            let start = Instant::now();
            for _ in 0..n {
                for stmt in sql.begin {
                    conn.query_drop(stmt).unwrap();
                }
                let now = datetime(SystemTime::now());
                let row: Option<Row> = conn.exec_first(&sql.row_claim, (now, 1i64)).unwrap();
                let (id, ..) = black_box(row.expect("raw row lock claim found no row"));
                conn.exec_drop(&sql.row_ack, (id,)).unwrap();
                assert_eq!(conn.affected_rows(), 1);
                conn.query_drop("COMMIT").unwrap();
            }
            start.elapsed()
        }

        /// Raw lease loop: the claim transaction (locking select of up to 10 rows, one update of
        /// their ids padded to a power of two, commit), then the fenced delete of each row.
        fn lease(&mut self, n: u64) -> Duration {
            let Raw { conn, sql, .. } = self;
            let start = Instant::now();
            let mut done = 0u64;
            while done < n {
                let now = SystemTime::now();
                let (now_v, token) = (datetime(now), datetime(lease_token(now)));
                for stmt in sql.begin {
                    conn.query_drop(stmt).unwrap();
                }
                let rows: Vec<Row> = conn
                    .exec(&sql.lease_claim, (now_v.clone(), now_v, CLAIM_BATCH as i64))
                    .unwrap();
                assert!(!rows.is_empty(), "raw lease claim found no row");
                let slots = rows.len().next_power_of_two();
                let mut params = vec![token.clone()];
                params.extend(rows.iter().map(|r| mysql::Value::Int(r.0)));
                params.extend(std::iter::repeat_n(
                    mysql::Value::Int(rows[rows.len() - 1].0),
                    slots - rows.len(),
                ));
                conn.exec_drop(
                    &sql.lease_mark[slots.trailing_zeros() as usize],
                    Params::Positional(params),
                )
                .unwrap();
                assert_eq!(conn.affected_rows(), rows.len() as u64);
                conn.query_drop("COMMIT").unwrap();
                for row in rows {
                    let (id, ..) = black_box(row);
                    conn.exec_drop(&sql.lease_ack, (id, token.clone())).unwrap();
                    assert_eq!(conn.affected_rows(), 1);
                    done += 1;
                }
            }
            start.elapsed()
        }

        /// Raw advisory loop: select candidates, `GET_LOCK` the first free key, take the row under
        /// it (update, then fetch: no `RETURNING`), delete it, `RELEASE_LOCK`.
        fn advisory(&mut self, n: u64) -> Duration {
            let Raw { conn, sql, db } = self;
            let start = Instant::now();
            let mut done = 0u64;
            while done < n {
                let now = datetime(SystemTime::now());
                let candidates: Vec<(i64, Option<String>)> = conn
                    .exec(&sql.adv_candidates, (now.clone(), ADVISORY_SCAN as i64))
                    .unwrap();
                let mut took = false;
                for (id, k) in candidates {
                    let name =
                        lock_name(&format!("{db}.{}-{}", sql.adv_table, k.unwrap_or_default()));
                    let locked: Option<Option<i64>> =
                        conn.exec_first(&sql.key_lock, (&name,)).unwrap();
                    if locked.flatten() != Some(1) {
                        continue;
                    }
                    conn.exec_drop(&sql.adv_take, (now.clone(), id)).unwrap();
                    if conn.affected_rows() == 1 {
                        let row: Option<Row> = conn.exec_first(&sql.adv_fetch, (id,)).unwrap();
                        black_box(row.expect("fetch"));
                        conn.exec_drop(&sql.adv_ack, (id,)).unwrap();
                        assert_eq!(conn.affected_rows(), 1);
                        took = true;
                    }
                    let unlocked: Option<Option<i64>> =
                        conn.exec_first(&sql.key_unlock, (&name,)).unwrap();
                    assert_eq!(unlocked.flatten(), Some(1));
                    if took {
                        break;
                    }
                }
                assert!(took, "raw advisory claim took no row");
                done += 1;
            }
            start.elapsed()
        }
    }

    pub fn benches(c: &mut Criterion) {
        let Some((url, broker, mut conn)) =
            server("MySQL/MariaDB", "SQLBROKER_MYSQL_URL", DEFAULT_URL, connect)
        else {
            return;
        };
        let db: String = conn
            .query_first("SELECT DATABASE()")
            .ok()
            .flatten()
            .unwrap_or_default();
        let version: String = conn
            .query_first("SELECT VERSION()")
            .ok()
            .flatten()
            .unwrap_or_default();
        let flavor = if version.to_ascii_lowercase().contains("mariadb") {
            "mariadb"
        } else {
            "mysql"
        };
        let tables = Tables::create(&broker, "bench");
        // Runs once `bench` has closed the raw connection, so it opens one of its own.
        let _cleanup = OnDrop(|| {
            if let Ok(mut conn) = connect(&url) {
                for t in tables.names() {
                    let _ = conn.query_drop(format!("DROP TABLE IF EXISTS `{t}`"));
                    // The library recorded the table's description when it made it.
                    let _ =
                        conn.query_drop(format!("DELETE FROM sqlbroker_tables WHERE name = '{t}'"));
                }
            }
        });
        let sql = sql(&mut conn, &tables);
        let bench = Bench::new(flavor, &broker, &tables, Raw { conn, sql, db });

        bench.publish(c);
        bench.cycles(c, "row_lock", &tables.plain, Raw::row_lock);
        bench.cycles(c, "lease", &tables.lease, Raw::lease);
        bench.cycles(c, "advisory", &tables.advisory, Raw::advisory);
    }
}

criterion_group! {
    name = throughput;
    config = config();
    targets = benches
}
criterion_main!(throughput);
