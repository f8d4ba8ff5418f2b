//! The runtime: the threads a broker owns and the state they share, per table and per
//! subscription. Uses the dialects, the model and the errors; knows nothing of the broker,
//! publishing, the forms or deliveries.
//!
//! - [`Queue`]: one table on one broker: its validated description, its SQL, the pool, and the
//!   wake-up its publishers ring; `registry`: the table's record, checked on first use.
//! - [`Ctx`]: one subscription: options, handler slots, the stop flag, the lease book.
//! - `renewer`: the broker's lease timer thread; `listen`: the broker's change feed thread;
//!   `notifier`: the thread that sends its publishes' notifications; `sweep`: the thread
//!   that keeps `sqlbroker_deps` as small as the jobs that wait; `wake`: the wake-ups they
//!   ring; `timer`, `deferred`: the handler timeouts and deferred acks.
//! - `meters` and `events`: what happens, counted and reported.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::dialect::keys::KeyRegistry;
use crate::dialect::{DbConn, Dialect, TableSql};
use crate::error::{BrokerError, DbError, DbErrorKind, Result, NO_TABLE};
use crate::model::table::TableSpec;

pub(crate) mod cursor;
pub(crate) mod deferred;
pub(crate) mod deps;
pub(crate) mod events;
pub(crate) mod fleet;
pub(crate) mod flow;
pub(crate) mod group;
pub(crate) mod health;
pub(crate) mod limits;
pub(crate) mod listen;
pub(crate) mod maintainer;
pub(crate) mod meters;
pub(crate) mod notifier;
pub(crate) mod pool;
pub(crate) mod registry;
pub(crate) mod renewer;
pub(crate) mod retention;
pub(crate) mod signals;
pub(crate) mod slots;
pub(crate) mod sweep;
#[cfg(test)]
pub(crate) mod testing;
pub(crate) mod timer;
#[cfg(feature = "tracing")]
pub(crate) mod trace;
pub(crate) mod update;
pub(crate) mod usage;
pub(crate) mod wake;

pub(crate) use pool::{Pool, PooledConn};

/// Fault-injection points of the crate's live tests (`testing`): the statement a point wraps
/// runs as is outside `cfg(test)`.
#[cfg(not(test))]
mod faults {
    #[inline(always)]
    pub(crate) fn injected<T>(_point: &'static str, _table: &str, run: impl FnOnce() -> T) -> T {
        run()
    }

    #[inline(always)]
    pub(crate) fn pause_point(_point: &'static str, _table: &str) {}
}
pub(crate) use faults::{injected, pause_point};
#[cfg(test)]
use testing as faults;

use renewer::LeaseBook;
use slots::Slots;
use wake::Wake;

/// One table on one broker.
pub(crate) struct Queue {
    pub spec: TableSpec,
    pub sql: TableSql,
    pub dialect: Arc<dyn Dialect>,
    pub pool: Pool,
    pub wake: Arc<Wake>,
    /// The longest one statement may wait on the server (locks included): bounds the joins of
    /// `close` and `shutdown`.
    pub statement_timeout: Duration,
    /// Multi-row inserts by row count: a batch publish reuses the text (and so the prepared
    /// statement) of an earlier batch of the same size.
    inserts: Mutex<HashMap<usize, Arc<str>>>,
    /// Lease acks written together (group commit): this table's own group, or the broker's
    /// for all its tables ([`Dialect::shared_acks_begin`]).
    pub acks: Arc<AckGroup>,
    /// Tables with dependencies: lease acks settled together, each with what it does for the
    /// jobs waiting on it, in one transaction (this table's own group, one flush at a time).
    pub settles: AckGroup,
    /// Server advisory form: the keys this broker's sessions hold on this table (a claim
    /// skips them without asking the server).
    pub held_here: Arc<KeyRegistry>,
    /// The description was checked against the table's record (or columns): done once.
    pub described: AtomicBool,
    /// The table's metrics (the `metrics` feature; nothing without it).
    pub meters: crate::runtime::meters::Meters,
    /// Tables with concurrency limits: the maxes in force, by the record's text.
    pub limits: crate::runtime::limits::LimitsInForce,
    /// Tables with rate limits or fair claims: this broker's state between claims.
    pub flow: crate::runtime::flow::FlowState,
    /// Tables with dependencies: other tables whose jobs wait on this one's.
    pub others: crate::runtime::deps::Others,
    /// The record's text as a subscription's pause check last compared it with this
    /// description ([`registry::unenforced`]).
    pub record_seen: Mutex<Option<String>>,
    /// Collected jobs ([`Message::collect`](crate::Message::collect)): their statements and
    /// this broker's state of the keys' table, made on the first collect publish.
    pub collects: crate::dialect::collect::Collects,
    /// `sqlbroker_unique` ([`Message::unique_for`](crate::Message::unique_for)) is made (or
    /// is not this broker's to make: [`BrokerBuilder::manage_schema`](crate::BrokerBuilder::manage_schema)
    /// off), so a publish runs no DDL.
    pub unique_made: AtomicBool,
    /// The statements of `sqlbroker_unique` for this table, built by its first unique publish.
    pub unique_sql: std::sync::OnceLock<crate::dialect::shared::UniqueSql>,
}

/// Lease acks grouped into one commit: each item is a row of a table and the tokens it may
/// hold. Where the dialect allows ([`Dialect::shared_acks_begin`]) one group serves every
/// table of the broker, and a flush of several tables' acks writes them in one transaction: a
/// worker over ten tables then commits as often as one over one table.
pub(crate) type AckGroup = group::GroupCommit<AckItem, AckResults>;
/// One table's part of a flush: the set of ids deleted, or the kind of error its statement (or
/// the flush's transaction) met.
pub(crate) type AckBatch = std::result::Result<Arc<HashSet<i64>>, DbErrorKind>;
/// A flush's result: each table's part, by [`Queue::key`].
pub(crate) type AckResults = Arc<Vec<(usize, AckBatch)>>;

/// A lease ack waiting in an [`AckGroup`].
pub(crate) struct AckItem {
    pub queue: Arc<Queue>,
    pub id: i64,
    /// Locked by the flush once it holds a connection, so the lease is renewed while the ack
    /// waits for one.
    pub cell: Arc<renewer::LeaseCell>,
}

/// The most leases one grouped ack writes.
pub(crate) const ACK_GROUP_MAX: usize = 256;

/// The most acks one grouped settlement of a table with dependencies writes: each runs the
/// statements of its jobs waiting, so a flush is a transaction of several statements per ack,
/// holding the counts it took down until it commits.
pub(crate) const SETTLE_GROUP_MAX: usize = 64;

impl Queue {
    pub fn new(
        spec: TableSpec,
        sql: TableSql,
        dialect: Arc<dyn Dialect>,
        pool: Pool,
        wake: Arc<Wake>,
        statement_timeout: Duration,
    ) -> Self {
        Queue {
            meters: crate::runtime::meters::Meters::new(&spec.name),
            spec,
            sql,
            dialect,
            pool,
            wake,
            statement_timeout,
            inserts: Mutex::default(),
            acks: Arc::new(AckGroup::new(ACK_GROUP_MAX)),
            settles: AckGroup::one_at_a_time(SETTLE_GROUP_MAX),
            held_here: Arc::default(),
            described: AtomicBool::new(false),
            limits: Default::default(),
            flow: Default::default(),
            others: Default::default(),
            record_seen: Mutex::new(None),
            collects: Default::default(),
            unique_made: AtomicBool::new(false),
            unique_sql: std::sync::OnceLock::new(),
        }
    }

    /// The insert of `rows` rows, built once per size (the last few sizes are kept).
    pub fn insert_sql(&self, rows: usize) -> Arc<str> {
        let mut cache = self.inserts.lock();
        if let Some(sql) = cache.get(&rows) {
            return sql.clone();
        }
        if cache.len() >= 16 {
            cache.clear();
        }
        let sql: Arc<str> = self.dialect.insert_many(&self.spec, rows).into();
        cache.insert(rows, sql.clone());
        sql
    }

    /// This queue's key in a flush's [`AckResults`] (its address: an item holds the queue
    /// while the flush runs, so no other queue has it meanwhile).
    pub fn key(self: &Arc<Self>) -> usize {
        Arc::as_ptr(self) as usize
    }

    /// A pooled connection, or the pool's error (which carries the last connection failure).
    pub fn conn(&self, op: &'static str) -> Result<PooledConn> {
        self.pool.get().map_err(|source| BrokerError::Pool {
            op,
            table: self.spec.name.clone(),
            timeout: self.pool.connection_timeout(),
            source: source.into(),
        })
    }

    /// A pooled connection within `timeout` (at most the pool's own timeout): for the drop
    /// paths, which must not block a handler thread for long.
    pub fn conn_within(&self, op: &'static str, timeout: Duration) -> Result<PooledConn> {
        let timeout = timeout.min(self.pool.connection_timeout());
        self.pool
            .get_timeout(timeout)
            .map_err(|source| BrokerError::Pool {
                op,
                table: self.spec.name.clone(),
                timeout,
                source: source.into(),
            })
    }

    /// Runs `f` on a pooled connection, and once more on a fresh one if the connection was
    /// lost. Only for statements that may safely run twice (reads, fenced or conditional
    /// updates): a lost connection cannot tell whether the statement committed.
    pub fn retrying<T>(
        &self,
        op: &'static str,
        mut f: impl FnMut(&mut dyn DbConn) -> Result<T, DbError>,
    ) -> Result<T> {
        let mut conn = self.conn(op)?;
        match f(&mut *conn) {
            Err(e) if e.kind == DbErrorKind::ConnectionLost => {
                log::debug!(
                    "{op} on table {}: {e}; once more on a new connection",
                    self.spec.name
                );
                drop(conn);
                let mut conn = self.conn(op)?;
                f(&mut *conn).map_err(self.err(op))
            }
            r => r.map_err(self.err(op)),
        }
    }

    /// The table's columns as the database reports them, `(name, type)`; none if the table
    /// does not exist.
    pub fn columns(&self, conn: &mut dyn DbConn) -> Result<Vec<(String, String)>> {
        let name = crate::model::value::Value::Text(self.spec.name.clone());
        let rows = conn
            .query(self.dialect.columns_query(), &[name])
            .map_err(self.err("schema check"))?;
        Ok(rows
            .into_iter()
            .filter_map(|r| {
                let mut it = r.into_iter();
                let name = it.next()?.as_str()?.to_string();
                let ty = it.next()?.as_str()?.to_string();
                Some((name, ty))
            })
            .collect())
    }

    /// [`BrokerError::Schema`] unless the table has every column its description names, of a
    /// type the statements can use.
    pub fn check_schema(&self, conn: &mut dyn DbConn) -> Result<()> {
        let found = self.columns(conn)?;
        let problems = if found.is_empty() {
            vec![NO_TABLE.to_string()]
        } else {
            crate::model::schema::problems(&self.dialect.column_defs(&self.spec), &found)
        };
        if problems.is_empty() {
            return Ok(());
        }
        Err(BrokerError::Schema {
            table: self.spec.name.clone(),
            problems,
        })
    }

    /// `e`, a statement's failure, as [`BrokerError::Schema`] if the table does not exist (a
    /// publish before `create_table`): the driver's own words ("relation does not exist",
    /// error 1146, "no such table") differ by database and do not say what to do. Asked only
    /// after a failure the database reported, on the same connection.
    pub fn explain_failure(&self, conn: &mut dyn DbConn, e: BrokerError) -> BrokerError {
        let reported = matches!(
            e,
            BrokerError::Database {
                kind: DbErrorKind::Other | DbErrorKind::Schema,
                ..
            }
        );
        if reported && self.columns(conn).is_ok_and(|found| found.is_empty()) {
            return BrokerError::Schema {
                table: self.spec.name.clone(),
                problems: vec![NO_TABLE.to_string()],
            };
        }
        e
    }

    /// Wraps a driver error with the operation and this table.
    pub fn err(&self, op: &'static str) -> impl Fn(DbError) -> BrokerError + '_ {
        move |e| e.during(op, &self.spec.name)
    }
}

/// How many times a transaction of its own runs at most when the database ends it as a
/// deadlock's victim.
const DEADLOCK_TRIES: u32 = 4;

/// True if `e` is the database ending the transaction as a deadlock's victim (MySQL/MariaDB
/// 1213, PostgreSQL 40P01), or as a serialization failure (PostgreSQL 40001, which the
/// library's own transactions, read committed by name, should not meet): rolled back whole,
/// it may run again.
fn deadlocked(e: &BrokerError) -> bool {
    match e {
        BrokerError::Database {
            kind: DbErrorKind::Transient,
            source,
            ..
        } => {
            let text = source.to_string().to_ascii_lowercase();
            text.contains("deadlock") || text.contains("could not serialize")
        }
        _ => false,
    }
}

/// Runs `run`, a transaction of its own (a publish that names other jobs, a signal, an
/// update in place), again (a few times at most, a little later each time) while the
/// database ends it as a deadlock's victim (or a serialization failure's). Publishes that name one job lock its row in
/// `sqlbroker_deps` and then insert around it; MySQL/MariaDB's locks for those inserts can
/// order two such publishes (or a publish and a settlement) into a deadlock, which rolls one
/// back whole: nothing of it was written, so it runs again rather than failing.
pub(crate) fn retrying_deadlocks<T>(mut run: impl FnMut() -> Result<T>) -> Result<T> {
    let mut tries = 1;
    loop {
        match run() {
            Err(e) if tries < DEADLOCK_TRIES && deadlocked(&e) => {
                log::debug!("publish: {e}; tried again");
                std::thread::sleep(std::time::Duration::from_millis(5 * u64::from(tries)));
                tries += 1;
            }
            done => return done,
        }
    }
}

/// Options of a subscription, defaults resolved.
#[derive(Debug, Clone)]
pub(crate) struct SubOptions {
    pub workers: usize,
    pub batch: usize,
    pub max_in_flight: usize,
    pub poll_interval: Duration,
    /// Candidate rows an advisory claim reads to find keys that are free.
    pub advisory_scan: usize,
    /// The delay of a failed delivery ([`Delivery::fail`](crate::Delivery::fail)).
    pub retry: crate::model::retry::RetryPolicy,
    /// How long a handler may hold a delivery before it is failed for it.
    pub handler_timeout: Option<Duration>,
    /// How long a handler may run before it is reported stuck, once.
    pub stuck_after: Option<Duration>,
}

/// A claim's pooled connection. One whose lock waits were limited for a bounded claim
/// ([`Ctx::claim_conn`]) gets the statement timeout back when it is dropped or taken, before
/// anything else runs on it.
pub(crate) struct ClaimConn {
    /// `None` only once taken by [`ClaimConn::into_inner`].
    conn: Option<PooledConn>,
    limited: bool,
}

impl ClaimConn {
    /// The connection itself, its waits restored (the row lock form keeps it for the delivery).
    pub fn into_inner(mut self) -> PooledConn {
        let mut conn = self.conn.take().expect("a claim connection is taken once");
        if self.limited {
            conn.limit_waits(None);
        }
        conn
    }
}

impl std::ops::Deref for ClaimConn {
    type Target = pool::Tracked;
    fn deref(&self) -> &pool::Tracked {
        self.conn
            .as_ref()
            .expect("a claim connection is taken once")
    }
}

impl std::ops::DerefMut for ClaimConn {
    fn deref_mut(&mut self) -> &mut pool::Tracked {
        self.conn
            .as_mut()
            .expect("a claim connection is taken once")
    }
}

impl Drop for ClaimConn {
    fn drop(&mut self) {
        if let (true, Some(conn)) = (self.limited, self.conn.as_mut()) {
            conn.limit_waits(None);
        }
    }
}

/// What one subscription's threads and deliveries share.
pub(crate) struct Ctx {
    pub queue: Arc<Queue>,
    pub opts: SubOptions,
    pub slots: Slots,
    stop: AtomicBool,
    pub leases: LeaseBook,
    pub keys: Option<Arc<KeyRegistry>>,
    /// Where the lease and row lock claims start reading (tables whose dialect gives a
    /// `claim_from`).
    pub cursor: cursor::ClaimCursor,
    /// Claim workers inside a claim right now.
    pub claiming: AtomicUsize,
    /// Claims whose rows are being sent into the channel right now (`next_batch` waits for
    /// them, to settle a claim's rows in one statement).
    pub sending: AtomicUsize,
    /// Handler threads waiting in the `next_delivery` family right now.
    pub waiting: AtomicUsize,
    /// Deliveries settled (acked, retried, failed, dead-lettered, cancelled): what the
    /// subscription's heartbeat reports as handled.
    pub settled: std::sync::atomic::AtomicU64,
    /// Runs the handler timeouts and the stuck handlers' reports (only with either).
    pub timer: Option<timer::Timer>,
    /// What the subscription's threads say of themselves ([`health::Marks`]).
    pub marks: health::Marks,
    /// The application's hooks.
    pub events: Option<Arc<dyn crate::runtime::events::Events>>,
    /// Deferred acks ([`AckMode::Deferred`](crate::AckMode::Deferred)): queued, written by
    /// a thread of the subscription.
    pub deferred: Option<deferred::DeferredAcks>,
    last_error: Mutex<Option<Arc<BrokerError>>>,
    /// The error that closed the subscription, if one did (kept, unlike `last_error`).
    closed_by: std::sync::OnceLock<Arc<BrokerError>>,
    /// Cleared by `shutdown` after its grace: the renewer leaves this subscription.
    renewing: AtomicBool,
    /// Keeps the broker's lease timer alive while this subscription or its deliveries live,
    /// even if the broker handle is dropped first.
    _renewer: Option<Arc<renewer::Renewer>>,
    /// Keeps the broker's change feed alive likewise.
    _listener: Option<Arc<listen::Listener>>,
}

impl Ctx {
    pub fn new(
        queue: Arc<Queue>,
        opts: SubOptions,
        renewer: Option<Arc<renewer::Renewer>>,
        listener: Option<Arc<listen::Listener>>,
    ) -> Self {
        let keys = queue.dialect.process_keys();
        Ctx {
            slots: Slots::new(opts.max_in_flight),
            queue,
            opts,
            stop: AtomicBool::new(false),
            leases: LeaseBook::default(),
            keys,
            cursor: Default::default(),
            claiming: AtomicUsize::new(0),
            sending: AtomicUsize::new(0),
            waiting: AtomicUsize::new(0),
            settled: std::sync::atomic::AtomicU64::new(0),
            timer: None,
            marks: health::Marks::default(),
            events: None,
            deferred: None,
            last_error: Mutex::new(None),
            closed_by: std::sync::OnceLock::new(),
            renewing: AtomicBool::new(true),
            _renewer: renewer,
            _listener: listener,
        }
    }

    /// With the application's hooks.
    pub fn with_events(mut self, events: Option<Arc<dyn crate::runtime::events::Events>>) -> Self {
        self.events = events;
        self
    }

    /// With deferred acks.
    pub fn with_deferred(mut self, deferred: deferred::DeferredAcks) -> Self {
        self.deferred = Some(deferred);
        self
    }

    /// Writes the deferred acks queued so far, waiting at most `timeout`; false if some were
    /// still unwritten then. True at once without deferred acks.
    pub fn flush_acks(&self, timeout: Duration) -> bool {
        self.deferred
            .as_ref()
            .is_none_or(|d| d.flush_within(timeout))
    }

    /// With the timer that runs handler timeouts.
    pub fn with_timer(mut self, timer: timer::Timer) -> Self {
        self.timer = Some(timer);
        self
    }

    pub fn spec(&self) -> &TableSpec {
        &self.queue.spec
    }

    pub fn stopped(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    /// Stops claiming: wakes every worker so it sees the flag.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        self.slots.close();
        self.queue.wake.notify_all();
    }

    /// False once the subscription's leases are no longer renewed.
    pub fn renewing(&self) -> bool {
        self.renewing.load(Ordering::Acquire)
    }

    pub fn stop_renewing(&self) {
        self.renewing.store(false, Ordering::Release);
    }

    /// [`Ctx::claim_conn`] for a claim worker's claim (`by` `None`), which read the pause flag
    /// before it waited for the connection: if that read is now older than a poll interval (a
    /// connection slow to come, a database that stopped answering a moment), the flag is read
    /// again on the connection itself, and the claim runs only if the table is not paused
    /// (`None` otherwise, and if the read fails: the worker's loop reads it again). So no claim
    /// starts on a flag older than a poll interval, and a claim whose connection is always
    /// slow to come (a pool run dry) still runs. A claim on a handler's thread (`by`) has
    /// checked the flag itself.
    pub fn claim_conn_checked(&self, by: Option<Instant>) -> Result<Option<ClaimConn>> {
        let conn = self.claim_conn(by)?;
        if by.is_some() || !self.queue.wake.pause.too_old(self.opts.poll_interval) {
            return Ok(conn);
        }
        let Some(mut conn) = conn else {
            return Ok(None);
        };
        match crate::runtime::registry::read_paused(&self.queue, &mut *conn) {
            Ok(false) => Ok(Some(conn)),
            _ => Ok(None),
        }
    }

    /// A connection for a claim, or `None` once the subscription stops: waits in short steps so
    /// a stopped subscription never starts a claim (which would spend an attempt on rows it
    /// then returns), and `close` or drop joins its workers promptly.
    ///
    /// With a deadline `by` (a handler's thread, bounded by its caller's timeout), it waits for
    /// a connection only until then (`None` past it), and no statement of the claim waits for
    /// a lock past it where the connection can bound that at no cost ([`DbConn::limit_waits`]).
    pub fn claim_conn(&self, by: Option<Instant>) -> Result<Option<ClaimConn>> {
        let pool = &self.queue.pool;
        if let Some(by) = by {
            if self.stopped() {
                return Ok(None);
            }
            let Ok(mut conn) = pool.get_timeout(by.saturating_duration_since(Instant::now()))
            else {
                return Ok(None);
            };
            // A deadline past the statement timeout changes nothing (the common case of a
            // long timeout pays nothing).
            let left = by.saturating_duration_since(Instant::now());
            let limited = left < self.queue.statement_timeout && conn.limit_waits(Some(by));
            return Ok(Some(ClaimConn {
                conn: Some(conn),
                limited,
            }));
        }
        let deadline = Instant::now() + pool.connection_timeout();
        loop {
            if self.stopped() {
                return Ok(None);
            }
            match pool.get_timeout(Duration::from_millis(100)) {
                Ok(conn) if self.stopped() => {
                    drop(conn);
                    return Ok(None);
                }
                Ok(conn) => {
                    return Ok(Some(ClaimConn {
                        conn: Some(conn),
                        limited: false,
                    }))
                }
                Err(e) if Instant::now() >= deadline => {
                    return Err(BrokerError::Pool {
                        op: "claim",
                        table: self.spec().name.clone(),
                        timeout: pool.connection_timeout(),
                        source: e.into(),
                    })
                }
                Err(_) => {}
            }
        }
    }

    pub fn set_error(&self, e: BrokerError) {
        *self.last_error.lock() = Some(Arc::new(e));
    }

    /// Closes the subscription because of `e`: it stays the [`Ctx::closed_by`] reason.
    pub fn fail(&self, e: BrokerError) {
        let e = Arc::new(e);
        *self.last_error.lock() = Some(e.clone());
        let _ = self.closed_by.set(e);
        self.stop();
    }

    /// The error that closed the subscription; `None` while open or after a plain close.
    pub fn closed_by(&self) -> Option<Arc<BrokerError>> {
        self.closed_by.get().cloned()
    }

    pub fn clear_error(&self) {
        let mut g = self.last_error.lock();
        if g.is_some() {
            *g = None;
        }
    }

    pub fn last_error(&self) -> Option<Arc<BrokerError>> {
        self.last_error.lock().clone()
    }
}
