//! The connection pool and its hygiene: which connections it may hand out again.
//!
//! - A connection the driver reports lost, or that our code marked broken (a half-opened
//!   transaction, a session that may hold an advisory key), is discarded, never reused.
//! - A connection that sat idle for [`IDLE_CHECK`] or longer is pinged before it is handed
//!   out: after a failover, a server restart or MySQL's `wait_timeout`, the dead ones are
//!   replaced instead of failing the next publish, settlement or renewal. A connection in
//!   steady use is not pinged, so the hot path pays nothing.
//! - Connections are recycled after [`IDLE_TIMEOUT`] idle and [`MAX_LIFETIME`] in all.

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::dialect::{DbConn, Dialect};
use crate::error::DbError;
use crate::Value;

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
}

impl r2d2::ManageConnection for Manager {
    type Connection = Tracked;
    type Error = DbError;

    fn connect(&self) -> Result<Tracked, DbError> {
        let conn = match self.seed.lock().take() {
            Some(conn) => conn,
            None => self.dialect.connect()?,
        };
        Ok(Tracked {
            conn,
            used: Instant::now(),
        })
    }

    fn is_valid(&self, conn: &mut Tracked) -> Result<(), DbError> {
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
    r2d2::Pool::builder()
        .max_size(size)
        .min_idle(Some(0))
        .test_on_check_out(true)
        .idle_timeout(Some(IDLE_TIMEOUT))
        .max_lifetime(Some(MAX_LIFETIME))
        .connection_timeout(timeout)
        .build_unchecked(Manager {
            dialect,
            seed: Mutex::new(first),
        })
}

pub(crate) type Pool = r2d2::Pool<Manager>;
pub(crate) type PooledConn = r2d2::PooledConnection<Manager>;

/// A connection and when it last ran a statement.
pub(crate) struct Tracked {
    conn: Box<dyn DbConn + Send>,
    used: Instant,
}

impl DbConn for Tracked {
    fn execute(&mut self, sql: &str, params: &[Value]) -> Result<u64, DbError> {
        self.used = Instant::now();
        self.conn.execute(sql, params)
    }
    fn query(&mut self, sql: &str, params: &[Value]) -> Result<Vec<Vec<Value>>, DbError> {
        self.used = Instant::now();
        self.conn.query(sql, params)
    }
    fn batch(&mut self, sql: &str) -> Result<(), DbError> {
        self.used = Instant::now();
        self.conn.batch(sql)
    }
    fn is_broken(&self) -> bool {
        self.conn.is_broken()
    }
    fn set_broken(&mut self, broken: bool) {
        self.conn.set_broken(broken)
    }
    fn last_insert_id(&self) -> Option<i64> {
        self.conn.last_insert_id()
    }
    fn ping(&mut self) -> Result<(), DbError> {
        self.used = Instant::now();
        self.conn.ping()
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
