//! The connection pool and its hygiene: which connections it may hand out again.
//!
//! - A connection the driver reports lost, or that our code marked broken (a half-opened
//!   transaction, a session that may hold an advisory key), is discarded, never reused.
//! - A connection that sat idle for [`IDLE_CHECK`] or longer is pinged before it is handed
//!   out: after a failover, a server restart or MySQL's `wait_timeout`, the dead ones are
//!   replaced instead of failing the next publish, settlement or renewal. A connection in
//!   steady use is not pinged, so the hot path pays nothing.
//! - Connections are recycled after [`IDLE_TIMEOUT`] idle and [`MAX_LIFETIME`] in all.
//! - A server that refuses a write because it takes none ([`DbError::is_refused_writes`]: a
//!   primary left up read-only by a switchover) condemns every connection opened before: the
//!   others most likely reach the same server, where each write would fail in turn for up to
//!   [`MAX_LIFETIME`]. They are discarded as they come back, the idle ones at the next checkout
//!   (all at once), so the pool connects again (PostgreSQL: through the URL's hosts).
//! - So does a round trip the server did not answer within the round trip timeout
//!   ([`DbError::is_no_answer`]): the others most likely reach the same silent server, and
//!   each would cost the checkout that pings it one more bound (r2d2 tries the idle ones in
//!   turn). Condemned, they fail the check at once, and the checkout waits only for a new
//!   connection, within the pool's timeout.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::dialect::{DbConn, Dialect};
use crate::error::DbError;
use crate::model::value::Value;

/// A connection idle this long is pinged before reuse.
pub(crate) const IDLE_CHECK: Duration = Duration::from_secs(1);
/// A connection idle this long is closed.
pub(crate) const IDLE_TIMEOUT: Duration = Duration::from_secs(600);
/// A connection this old is closed once it is back in the pool.
pub(crate) const MAX_LIFETIME: Duration = Duration::from_secs(1800);

/// The r2d2 manager of every engine: connections are the dialect's, behind [`DbConn`].
pub(crate) struct Manager {
    pub dialect: Arc<dyn Dialect>,
    /// The connection the broker opened itself before the pool existed (to fail at once with
    /// the server's reason rather than retry until the pool's timeout): the pool's first.
    seed: Mutex<Option<Box<dyn DbConn + Send>>>,
    refusals: Arc<Refusals>,
}

/// Writes refused by a server that takes none, and round trips it did not answer, counted: a
/// connection opened before the last is condemned.
#[derive(Default)]
struct Refusals {
    /// Refusals and unanswered round trips so far.
    epoch: AtomicU64,
    /// The epoch whose idle connections were drained.
    drained: AtomicU64,
}

impl r2d2::ManageConnection for Manager {
    type Connection = Tracked;
    type Error = DbError;

    fn connect(&self) -> Result<Tracked, DbError> {
        let conn = match self.seed.lock().take() {
            Some(conn) => conn,
            None => self.dialect.connect()?,
        };
        Ok(Tracked::new(conn, &self.refusals))
    }

    fn is_valid(&self, conn: &mut Tracked) -> Result<(), DbError> {
        if conn.condemned() {
            return Err(DbError::new(
                crate::error::DbErrorKind::ConnectionLost,
                "discarded: opened before a server refused a write because it takes none, or \
                 left a round trip unanswered",
            ));
        }
        if conn.used.elapsed() < IDLE_CHECK {
            return Ok(());
        }
        conn.ping()
    }

    fn has_broken(&self, conn: &mut Tracked) -> bool {
        conn.is_broken()
    }
}

/// Builds the pool: `size` connections at most, none kept open idle for long; `first`, a
/// connection already open, is the first it hands out.
pub(crate) fn build(
    dialect: Arc<dyn Dialect>,
    size: u32,
    timeout: Duration,
    first: Option<Box<dyn DbConn + Send>>,
) -> Pool {
    let refusals = Arc::new(Refusals::default());
    let inner = r2d2::Pool::builder()
        .max_size(size)
        .min_idle(Some(0))
        .test_on_check_out(true)
        .idle_timeout(Some(IDLE_TIMEOUT))
        .max_lifetime(Some(MAX_LIFETIME))
        .connection_timeout(timeout)
        .build_unchecked(Manager {
            dialect: dialect.clone(),
            seed: Mutex::new(first),
            refusals: refusals.clone(),
        });
    Pool {
        inner,
        refusals,
        dialect,
    }
}

/// The broker's pool: r2d2's, which drains the condemned idle connections at checkout.
#[derive(Clone)]
pub(crate) struct Pool {
    inner: r2d2::Pool<Manager>,
    refusals: Arc<Refusals>,
    dialect: Arc<dyn Dialect>,
}

impl Pool {
    /// A connection within the pool's timeout.
    pub fn get(&self) -> Result<PooledConn, r2d2::Error> {
        self.drain();
        self.inner.get()
    }

    /// A connection within `timeout`.
    pub fn get_timeout(&self, timeout: Duration) -> Result<PooledConn, r2d2::Error> {
        self.drain();
        self.inner.get_timeout(timeout)
    }

    /// A connection of its own, outside the pool and beyond its size, closed when dropped:
    /// for the lease renewer while the application holds every pooled one (a renewal that
    /// waits for the pool lets leases run out, and their jobs run twice).
    pub fn spare(&self) -> Result<Tracked, DbError> {
        Ok(Tracked::new(self.dialect.connect()?, &self.refusals))
    }

    pub fn connection_timeout(&self) -> Duration {
        self.inner.connection_timeout()
    }

    pub fn max_size(&self) -> u32 {
        self.inner.max_size()
    }

    pub fn state(&self) -> r2d2::State {
        self.inner.state()
    }

    /// After a refused write or an unanswered round trip, once: every idle connection is
    /// checked out (the condemned ones fail the check and are closed) and the others are given
    /// back. One atomic load when nothing was refused.
    fn drain(&self) {
        let epoch = self.refusals.epoch.load(Ordering::Acquire);
        if self.refusals.drained.load(Ordering::Acquire) >= epoch
            || self.refusals.drained.fetch_max(epoch, Ordering::AcqRel) >= epoch
        {
            return;
        }
        let mut kept = Vec::new();
        while let Some(conn) = self.inner.try_get() {
            kept.push(conn);
        }
        log::debug!(
            "a server refused a write or left a round trip unanswered: connections opened \
             before were discarded ({} kept)",
            kept.len()
        );
    }
}

pub(crate) type PooledConn = r2d2::PooledConnection<Manager>;

/// A connection, when it last ran a statement, and the refusals counted when it was opened.
pub(crate) struct Tracked {
    conn: Box<dyn DbConn + Send>,
    used: Instant,
    born: u64,
    refusals: Arc<Refusals>,
}

impl Tracked {
    fn new(conn: Box<dyn DbConn + Send>, refusals: &Arc<Refusals>) -> Self {
        Tracked {
            conn,
            used: Instant::now(),
            born: refusals.epoch.load(Ordering::Acquire),
            refusals: refusals.clone(),
        }
    }

    /// Opened before a server refused a write: most likely to the same server.
    fn condemned(&self) -> bool {
        self.born < self.refusals.epoch.load(Ordering::Acquire)
    }

    /// Counts a refused write or an unanswered round trip (condemning every connection opened
    /// so far, this one too).
    fn watch<T>(&mut self, r: Result<T, DbError>) -> Result<T, DbError> {
        if let Err(e) = &r {
            if e.is_refused_writes() || e.is_no_answer() {
                self.refusals.epoch.fetch_add(1, Ordering::AcqRel);
                self.conn.mark_broken();
            }
        }
        r
    }
}

impl DbConn for Tracked {
    fn execute(&mut self, sql: &str, params: &[Value]) -> Result<u64, DbError> {
        self.used = Instant::now();
        let r = self.conn.execute(sql, params);
        self.watch(r)
    }
    fn query(&mut self, sql: &str, params: &[Value]) -> Result<Vec<Vec<Value>>, DbError> {
        self.used = Instant::now();
        let r = self.conn.query(sql, params);
        self.watch(r)
    }
    fn batch(&mut self, sql: &str) -> Result<(), DbError> {
        self.used = Instant::now();
        let r = self.conn.batch(sql);
        self.watch(r)
    }
    fn is_broken(&self) -> bool {
        self.conn.is_broken() || self.condemned()
    }
    fn set_broken(&mut self, broken: bool) {
        self.conn.set_broken(broken)
    }
    fn last_insert_id(&self) -> Option<i64> {
        self.conn.last_insert_id()
    }
    fn ping(&mut self) -> Result<(), DbError> {
        self.used = Instant::now();
        let r = self.conn.ping();
        self.watch(r)
    }
    fn take_unreadable(&mut self) -> Vec<(usize, String)> {
        self.conn.take_unreadable()
    }
    fn driver(&mut self) -> Option<&mut dyn std::any::Any> {
        self.conn.driver()
    }
    fn session_id(&mut self) -> Option<u64> {
        self.conn.session_id()
    }
    fn limit_waits(&mut self, until: Option<Instant>) -> bool {
        self.conn.limit_waits(until)
    }
}
