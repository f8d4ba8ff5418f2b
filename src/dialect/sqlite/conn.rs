//! One SQLite connection as a [`DbConn`], the process's writer lock it takes, and how a driver
//! error is classified.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, MutexGuard};
use rusqlite::config::DbConfig;
use rusqlite::{params_from_iter, Connection, ErrorCode};

use super::values::from_ref;
use super::Sqlite;
use crate::dialect::DbConn;
use crate::error::{DbError, DbErrorKind};
use crate::model::value::Value;

/// Opens a connection to the engine's database: WAL mode and the durability it asks for on a
/// file, a busy timeout everywhere.
pub(super) fn connect(engine: &Sqlite) -> Result<Box<dyn DbConn + Send>, DbError> {
    let conn = match &engine.path {
        Some(p) => Connection::open(p).map_err(|e| opening(p, e))?,
        None if engine.opened.swap(true, Ordering::AcqRel) => {
            return Err(DbError::new(
                DbErrorKind::ConnectionLost,
                "the in-memory database's only connection was discarded, and its contents \
                 with it: connect a new broker",
            ));
        }
        None => Connection::open_in_memory().map_err(classify)?,
    };
    conn.busy_timeout(engine.busy).map_err(classify)?;
    // No double-quoted string literals: every identifier we write is double-quoted, and with
    // SQLite's legacy default a column that is gone reads as a string of its own name instead
    // of failing ("k" becomes 'k'), so a dropped column would be delivered as text for ever.
    for dqs in [
        DbConfig::SQLITE_DBCONFIG_DQS_DML,
        DbConfig::SQLITE_DBCONFIG_DQS_DDL,
    ] {
        conn.set_db_config(dqs, false).map_err(classify)?;
    }
    conn.set_prepared_statement_cache_capacity(64);
    if engine.path.is_some() {
        conn.query_row("PRAGMA journal_mode = WAL", [], |_| Ok(()))
            .map_err(classify)?;
        let sync = if engine.durable { "FULL" } else { "NORMAL" };
        conn.execute_batch(&format!("PRAGMA synchronous = {sync}"))
            .map_err(classify)?;
    }
    Ok(Box::new(SqliteConn {
        conn,
        writer: engine.writer.clone(),
        busy: engine.busy,
        until: None,
        broken: false,
    }))
}

/// A database file that cannot be opened (a folder that does not exist, no permission) will
/// not open on a retry either: a permanent error, naming the file, not a transient one.
fn opening(path: &std::path::Path, e: rusqlite::Error) -> DbError {
    let mut failed = classify(e);
    if failed.kind == DbErrorKind::ConnectionLost {
        failed.kind = DbErrorKind::Other;
    }
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() && !dir.is_dir() => DbError::new(
            DbErrorKind::Other,
            format!(
                "cannot open the database file {}: the folder {} does not exist",
                path.display(),
                dir.display()
            ),
        ),
        _ => failed,
    }
}

/// One SQLite connection.
struct SqliteConn {
    conn: Connection,
    writer: Arc<Mutex<()>>,
    /// The broker's statement timeout: the longest a statement waits for the write lock.
    busy: Duration,
    /// No lock wait past this (a claim bounded by its caller's timeout,
    /// [`DbConn::limit_waits`]): each statement's busy timeout is the time left.
    until: Option<Instant>,
    broken: bool,
}

pub(super) fn classify(e: rusqlite::Error) -> DbError {
    let kind = match e.sqlite_error_code() {
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => DbErrorKind::Transient,
        Some(ErrorCode::CannotOpen | ErrorCode::SystemIoFailure | ErrorCode::DatabaseCorrupt) => {
            DbErrorKind::ConnectionLost
        }
        // No other code tells a missing column: the message does ("no such column: x").
        _ if e.to_string().contains("no such column") => DbErrorKind::Schema,
        _ => DbErrorKind::Other,
    };
    DbError::new(kind, e)
}

impl SqliteConn {
    /// How long the next statement may wait for the write lock: the statement timeout, or
    /// the time left before `until` (then SQLite's busy timeout is set to it, no I/O).
    fn wait(&mut self) -> Duration {
        let Some(until) = self.until else {
            return self.busy;
        };
        let left = until
            .saturating_duration_since(Instant::now())
            .min(self.busy);
        if let Err(e) = self.conn.busy_timeout(left) {
            // Cannot fail on an open connection; the longer wait would stand.
            log::debug!("setting the busy timeout: {e}");
        }
        left
    }

    fn fail(&mut self, e: rusqlite::Error) -> DbError {
        let e = classify(e);
        self.broken |= e.kind == DbErrorKind::ConnectionLost;
        e
    }
}

/// Takes the process's writer lock for a statement that writes outside an explicit
/// transaction, waiting at most `busy` (then `SQLITE_BUSY`, as SQLite's own wait would end).
/// Inside a transaction (which holds SQLite's write lock already) it is not taken: a writer
/// waiting on the lock in SQLite's busy handler would otherwise wait for us while we wait for it.
fn write_guard<'a>(
    conn: &Connection,
    st: &rusqlite::CachedStatement<'_>,
    writer: &'a Mutex<()>,
    busy: Duration,
) -> rusqlite::Result<Option<MutexGuard<'a, ()>>> {
    if st.readonly() || !conn.is_autocommit() {
        return Ok(None);
    }
    writer.try_lock_for(busy).map(Some).ok_or_else(|| {
        rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_BUSY),
            Some(format!(
                "another writer of this process held the database for {busy:?}"
            )),
        )
    })
}

/// Runs a prepared query and reads its rows as [`Value`]s.
fn read_rows(
    st: &mut rusqlite::CachedStatement<'_>,
    params: &[Value],
) -> rusqlite::Result<Vec<Vec<Value>>> {
    let width = st.column_count();
    let mut rows = st.query(params_from_iter(params.iter()))?;
    let mut out = Vec::new();
    while let Some(row) = rows.next()? {
        let mut vals = Vec::with_capacity(width);
        for i in 0..width {
            vals.push(from_ref(row.get_ref(i)?));
        }
        out.push(vals);
    }
    Ok(out)
}

/// The application's own transaction as a [`DbConn`], for the transactional publish. Inside
/// it, SQLite's write lock is the transaction's: the process's writer lock is not taken.
pub(crate) struct TxConn<'a, 'b>(pub &'a rusqlite::Transaction<'b>);

impl DbConn for TxConn<'_, '_> {
    fn execute(&mut self, sql: &str, params: &[Value]) -> Result<u64, DbError> {
        let r = self
            .0
            .prepare_cached(sql)
            .and_then(|mut st| st.execute(params_from_iter(params.iter())));
        r.map(|n| n as u64).map_err(classify)
    }

    fn query(&mut self, sql: &str, params: &[Value]) -> Result<Vec<Vec<Value>>, DbError> {
        let r = self
            .0
            .prepare_cached(sql)
            .and_then(|mut st| read_rows(&mut st, params));
        r.map_err(classify)
    }

    fn batch(&mut self, sql: &str) -> Result<(), DbError> {
        self.0.execute_batch(sql).map_err(classify)
    }

    fn is_broken(&self) -> bool {
        false
    }

    fn set_broken(&mut self, _: bool) {}
}

impl DbConn for SqliteConn {
    fn execute(&mut self, sql: &str, params: &[Value]) -> Result<u64, DbError> {
        let wait = self.wait();
        let r = self.conn.prepare_cached(sql).and_then(|mut st| {
            let _writing = write_guard(&self.conn, &st, &self.writer, wait)?;
            st.execute(params_from_iter(params.iter()))
        });
        r.map(|n| n as u64).map_err(|e| self.fail(e))
    }

    fn query(&mut self, sql: &str, params: &[Value]) -> Result<Vec<Vec<Value>>, DbError> {
        let wait = self.wait();
        let r = (|| {
            let mut st = self.conn.prepare_cached(sql)?;
            let _writing = write_guard(&self.conn, &st, &self.writer, wait)?;
            read_rows(&mut st, params)
        })();
        r.map_err(|e| self.fail(e))
    }

    fn batch(&mut self, sql: &str) -> Result<(), DbError> {
        self.conn.execute_batch(sql).map_err(|e| self.fail(e))
    }

    fn is_broken(&self) -> bool {
        self.broken
    }

    fn set_broken(&mut self, broken: bool) {
        self.broken = broken;
    }

    /// Each statement until then waits only the time left ([`SqliteConn::wait`]); `None`
    /// gives SQLite its busy timeout back. No I/O either way.
    fn limit_waits(&mut self, until: Option<Instant>) -> bool {
        if until.is_none() && self.until.is_some() {
            if let Err(e) = self.conn.busy_timeout(self.busy) {
                log::debug!("restoring the busy timeout: {e}");
            }
        }
        self.until = until;
        true
    }

    /// A file on this host does not go stale.
    fn ping(&mut self) -> Result<(), DbError> {
        Ok(())
    }
}
