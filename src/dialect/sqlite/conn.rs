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
        writing: None,
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
    /// The process's writer lock, held from a `BEGIN IMMEDIATE` of ours to the end of its
    /// transaction ([`SqliteConn::batch`]).
    writing: Option<parking_lot::ArcMutexGuard<parking_lot::RawMutex, ()>>,
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

    /// Lets the process's writer lock go once our write transaction has ended (a `COMMIT`, a
    /// `ROLLBACK`, or SQLite's own rollback after an error).
    fn transaction_ended(&mut self) {
        if self.writing.is_some() && self.conn.is_autocommit() {
            self.writing = None;
        }
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

/// `sql` opens a write transaction: `BEGIN IMMEDIATE` or `BEGIN EXCLUSIVE` (what the library
/// writes; a deferred `BEGIN` takes SQLite's write lock only at its first write, so it is left
/// to SQLite's busy handler).
fn opens_write(sql: &str) -> bool {
    let mut words = sql.split_ascii_whitespace();
    words
        .next()
        .is_some_and(|w| w.eq_ignore_ascii_case("BEGIN"))
        && words.next().is_some_and(|w| {
            let w = w.trim_end_matches(';');
            w.eq_ignore_ascii_case("IMMEDIATE") || w.eq_ignore_ascii_case("EXCLUSIVE")
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
        self.transaction_ended();
        r.map(|n| n as u64).map_err(|e| self.fail(e))
    }

    fn query(&mut self, sql: &str, params: &[Value]) -> Result<Vec<Vec<Value>>, DbError> {
        let wait = self.wait();
        let r = (|| {
            let mut st = self.conn.prepare_cached(sql)?;
            let _writing = write_guard(&self.conn, &st, &self.writer, wait)?;
            read_rows(&mut st, params)
        })();
        self.transaction_ended();
        r.map_err(|e| self.fail(e))
    }

    /// A write transaction we open (`BEGIN IMMEDIATE`) takes the process's writer lock first
    /// and holds it to its end, as a write outside a transaction holds it for its statement:
    /// this process's writers then queue on one lock and each goes as the one before it ends,
    /// rather than find SQLite's lock taken and sleep in its busy handler (1 to 100 ms steps:
    /// a claim's transaction beside other tables' acks used to cost more in sleeps than in
    /// work). Other processes still meet SQLite's lock and its busy timeout.
    fn batch(&mut self, sql: &str) -> Result<(), DbError> {
        if self.writing.is_none() && self.conn.is_autocommit() && opens_write(sql) {
            let wait = self.wait();
            match self.writer.try_lock_arc_for(wait) {
                Some(g) => self.writing = Some(g),
                None => {
                    let e = rusqlite::Error::SqliteFailure(
                        rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_BUSY),
                        Some(format!(
                            "another writer of this process held the database for {wait:?}"
                        )),
                    );
                    return Err(self.fail(e));
                }
            }
        }
        let r = self.conn.execute_batch(sql).map_err(|e| self.fail(e));
        self.transaction_ended();
        r
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dialect::Dialect;

    fn engine(dir: &std::path::Path) -> Sqlite {
        let url = format!("sqlite:{}", dir.join("w.db").display());
        Sqlite::from_url(&url, &crate::dialect::test_options()).unwrap()
    }

    #[test]
    fn only_immediate_and_exclusive_begins_open_a_write() {
        assert!(opens_write("BEGIN IMMEDIATE"));
        assert!(opens_write("  begin exclusive;"));
        assert!(!opens_write("BEGIN"));
        assert!(!opens_write("BEGIN DEFERRED"));
        assert!(!opens_write("COMMIT"));
        assert!(!opens_write("SELECT 1"));
    }

    /// A write transaction of ours holds the process's writer lock from its `BEGIN IMMEDIATE`
    /// to its end, whichever way it ends (commit, rollback, a statement that fails and leaves
    /// it open, then the rollback), and a deferred one does not take it. Fails if the lock is
    /// not taken (writers of this process would meet SQLite's lock and sleep in its busy
    /// handler) or not let go (every later writer would wait the busy timeout).
    #[test]
    fn a_write_transaction_holds_the_writer_lock_to_its_end() {
        let dir = std::env::temp_dir().join(format!("sqlbroker-writer-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let e = engine(&dir);
        let mut c = e.connect().unwrap();
        c.batch("CREATE TABLE t (x INTEGER PRIMARY KEY)").unwrap();
        assert!(!e.writer.is_locked());

        c.batch("BEGIN IMMEDIATE").unwrap();
        assert!(
            e.writer.is_locked(),
            "BEGIN IMMEDIATE did not take the lock"
        );
        c.execute("INSERT INTO t VALUES (1)", &[]).unwrap();
        assert!(
            e.writer.is_locked(),
            "a statement let the transaction's lock go"
        );
        c.batch("COMMIT").unwrap();
        assert!(!e.writer.is_locked(), "COMMIT did not let the lock go");

        c.batch("BEGIN IMMEDIATE").unwrap();
        // A failed statement leaves the transaction open, and the lock held.
        assert!(c.execute("INSERT INTO t VALUES (1)", &[]).is_err());
        assert!(e.writer.is_locked());
        c.rollback_or_discard();
        assert!(!e.writer.is_locked(), "ROLLBACK did not let the lock go");

        c.batch("BEGIN").unwrap();
        assert!(!e.writer.is_locked(), "a deferred BEGIN took the lock");
        c.batch("COMMIT").unwrap();

        // Another connection of the process waits on the lock, bounded by its busy timeout,
        // and writes once the transaction ends.
        let mut other = e.connect().unwrap();
        c.batch("BEGIN IMMEDIATE").unwrap();
        let (ready_tx, ready) = crossbeam_channel::bounded::<()>(1);
        let waited = std::thread::scope(|s| {
            let w = s.spawn(|| {
                let t0 = Instant::now();
                ready_tx.send(()).unwrap();
                other.execute("INSERT INTO t VALUES (2)", &[]).unwrap();
                t0.elapsed()
            });
            // From the writer's start: its write cannot end before this commit, however late
            // a loaded machine runs either thread.
            ready.recv().unwrap();
            std::thread::sleep(Duration::from_millis(50));
            c.batch("COMMIT").unwrap();
            w.join().unwrap()
        });
        assert!(
            waited >= Duration::from_millis(40),
            "it wrote inside the transaction"
        );
        drop(c);
        assert!(!e.writer.is_locked());
        drop((other, e));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
