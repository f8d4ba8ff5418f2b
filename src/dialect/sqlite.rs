//! SQLite: the embedded default. All SQLite SQL and `rusqlite` calls live here.
//!
//! - No row locks: the row lock form is refused.
//! - Lease claim: one `UPDATE .. RETURNING` (one writer at a time, so no `SKIP LOCKED` is needed);
//!   returned rows carry no order.
//! - Advisory keys are kept in the process, per database file: two processes on one file do not
//!   see each other's keys, so a row may then be delivered twice.
//! - Times are `INTEGER` seconds since the Unix epoch.
//! - Every connection runs in WAL mode with a busy timeout, and multi-statement write
//!   transactions start with `BEGIN IMMEDIATE`, so concurrent workers and producers wait for the
//!   writer instead of failing with `SQLITE_BUSY`.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

use parking_lot::{Mutex, MutexGuard};
use rusqlite::types::{ToSqlOutput, ValueRef};
use rusqlite::{params_from_iter, Connection, ErrorCode};

use super::shared::{ColumnTypes, Syntax};
use super::{ConnOptions, DbConn, Dialect, TableSql};
use crate::error::{BrokerError, DbError, DbErrorKind};
use crate::keys::KeyRegistry;
use crate::schedule::epoch_secs;
use crate::table::{Form, TableSpec};
use crate::Value;

const SYNTAX: Syntax = Syntax {
    quote: quote_ident,
    param: |n| format!("?{n}"),
};

/// Times are integer seconds since the Unix epoch.
const TYPES: ColumnTypes = ColumnTypes {
    id: "INTEGER PRIMARY KEY AUTOINCREMENT",
    payload: "BLOB NOT NULL",
    attempts: "INTEGER NOT NULL DEFAULT 0",
    run_at: "INTEGER NOT NULL",
    time: "INTEGER",
    reason: "TEXT",
    text: "TEXT",
    int: "INTEGER",
    float: "REAL",
    bytes: "BLOB",
};

fn quote_ident(s: &str) -> String {
    format!("\"{s}\"")
}

/// The SQLite engine for one database file (or one in-memory database).
pub(crate) struct Sqlite {
    path: Option<PathBuf>,
    keys: Arc<KeyRegistry>,
    writer: Arc<Mutex<()>>,
    /// How long a statement waits for the writer (ours, then SQLite's busy handler).
    busy: Duration,
    durable: bool,
    /// In memory: set once its one connection is opened. Each connection to `:memory:` is a
    /// database of its own, so a second one would silently be a new, empty database.
    opened: AtomicBool,
}

impl Sqlite {
    /// `sqlite:path`, `sqlite://path`, `sqlite::memory:`.
    pub fn from_url(url: &str, opts: &ConnOptions) -> Result<Self, BrokerError> {
        let rest = url.split_once(':').map(|(_, r)| r).unwrap_or_default();
        let rest = rest.strip_prefix("//").unwrap_or(rest);
        if rest.is_empty() {
            return Err(BrokerError::InvalidUrl {
                reason: format!("no database file in {url:?}"),
            });
        }
        let (path, per_file) = if rest == ":memory:" {
            (None, PerFile::default())
        } else {
            let path = canonical(std::path::Path::new(rest));
            let shared = per_file(&path);
            (Some(path), shared)
        };
        Ok(Sqlite {
            path,
            keys: per_file.keys,
            writer: per_file.writer,
            busy: opts.statement_timeout,
            durable: opts.sqlite_durable,
            opened: AtomicBool::new(false),
        })
    }
}

/// One name per database file, whatever the spelling (relative, `..`, a symbolic link): the
/// file's canonical path, or, for a file not made yet, its directory's canonical path and its
/// name.
fn canonical(path: &std::path::Path) -> PathBuf {
    if let Ok(p) = std::fs::canonicalize(path) {
        return p;
    }
    let abs = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    match (abs.parent(), abs.file_name()) {
        (Some(dir), Some(name)) => std::fs::canonicalize(dir)
            .map(|d| d.join(name))
            .unwrap_or(abs),
        _ => abs,
    }
}

/// What the brokers of one process share per database file.
#[derive(Default, Clone)]
struct PerFile {
    /// Advisory keys belong to the database, not the broker.
    keys: Arc<KeyRegistry>,
    /// One writer at a time within the process. SQLite allows one writer anyway; waiting here
    /// instead of in SQLite's busy handler (which sleeps 1, 2, 5 .. ms for a lock held for
    /// microseconds) keeps a claim and a settlement that collide from costing milliseconds.
    writer: Arc<Mutex<()>>,
}

fn per_file(path: &std::path::Path) -> PerFile {
    static FILES: OnceLock<Mutex<HashMap<PathBuf, PerFile>>> = OnceLock::new();
    let map = FILES.get_or_init(Default::default);
    map.lock().entry(path.to_path_buf()).or_default().clone()
}

impl Dialect for Sqlite {
    fn database(&self) -> &'static str {
        "SQLite"
    }

    fn connect(&self) -> Result<Box<dyn DbConn>, DbError> {
        let conn = match &self.path {
            Some(p) => Connection::open(p),
            None if self.opened.swap(true, Ordering::AcqRel) => {
                return Err(DbError::new(
                    DbErrorKind::ConnectionLost,
                    "the in-memory database's only connection was discarded, and its contents \
                     with it: connect a new broker",
                ));
            }
            None => Connection::open_in_memory(),
        }
        .map_err(classify)?;
        conn.busy_timeout(self.busy).map_err(classify)?;
        conn.set_prepared_statement_cache_capacity(64);
        if self.path.is_some() {
            conn.query_row("PRAGMA journal_mode = WAL", [], |_| Ok(()))
                .map_err(classify)?;
            let sync = if self.durable { "FULL" } else { "NORMAL" };
            conn.execute_batch(&format!("PRAGMA synchronous = {sync}"))
                .map_err(classify)?;
        }
        Ok(Box::new(SqliteConn {
            conn,
            writer: self.writer.clone(),
            busy: self.busy,
            broken: false,
        }))
    }

    fn max_pool_size(&self) -> Option<u32> {
        // Each connection to ":memory:" is a database of its own.
        self.path.is_none().then_some(1)
    }

    fn check_form(&self, form: Form) -> Result<(), BrokerError> {
        if form == Form::RowLock {
            return Err(BrokerError::Unsupported {
                database: "SQLite",
                what: "the row lock form".into(),
                why: "SQLite has no row locks; describe the table with .lease(..) or .advisory_lock(..)",
            });
        }
        Ok(())
    }

    fn check_server(&self, _conn: &mut dyn DbConn, _form: Form) -> Result<(), BrokerError> {
        // UPDATE .. RETURNING arrived in 3.35; the bundled library is newer.
        let v = rusqlite::version_number();
        if v < 3_035_000 {
            return Err(BrokerError::ServerTooOld {
                database: "SQLite",
                found: rusqlite::version().to_string(),
                needed: "3.35.0".into(),
                what: "UPDATE .. RETURNING",
            });
        }
        Ok(())
    }

    fn compile(&self, spec: &TableSpec) -> TableSql {
        let s = &SYNTAX;
        let mut sql = TableSql {
            begin_write: "BEGIN IMMEDIATE".into(),
            ..TableSql::default()
        };
        s.common(spec, &mut sql);
        let t = s.q(&spec.name);
        let id = s.q(&spec.id);
        sql.insert_id = Some(format!("{} RETURNING {id}", sql.insert_one));
        let att = s.q(&spec.attempts);
        let lu = s.q(&spec.locked_until);
        let ready = s.ready(spec, "?1");
        let order = s.order(spec);
        let row = s.row_columns(spec, "");
        match spec.form {
            Form::RowLock => {}
            Form::Lease => {
                sql.claim = format!(
                    "UPDATE {t} SET {lu} = ?3, {att} = {att} + 1 WHERE {id} IN \
                     (SELECT {id} FROM {t} WHERE {ready} AND ({lu} IS NULL OR {lu} <= ?1) ORDER BY {order} LIMIT ?2) \
                     RETURNING {row}"
                );
                // One row: `id = (..)` runs in well under half the time of `id IN (..)` here.
                sql.claim_one = Some(format!(
                    "UPDATE {t} SET {lu} = ?3, {att} = {att} + 1 WHERE {id} = \
                     (SELECT {id} FROM {t} WHERE {ready} AND ({lu} IS NULL OR {lu} <= ?1) ORDER BY {order} LIMIT ?2) \
                     RETURNING {row}"
                ));
            }
            Form::AdvisoryLock => {
                s.advisory_candidates(spec, &mut sql);
                sql.take = format!(
                    "UPDATE {t} SET {att} = {att} + 1 WHERE {ready} AND {id} = ?2 RETURNING {row}"
                );
            }
        }
        sql
    }

    fn create_table(&self, spec: &TableSpec) -> Vec<String> {
        SYNTAX.create_table(spec, &TYPES)
    }

    fn syntax(&self) -> &'static Syntax {
        &SYNTAX
    }

    fn max_params(&self) -> usize {
        32_766
    }

    fn process_keys(&self) -> Option<Arc<KeyRegistry>> {
        Some(self.keys.clone())
    }

    /// One `UPDATE .. RETURNING` of the rows still holding their tokens. SQLite has no row
    /// locks to wait on, and types `VALUES` by the values themselves.
    fn lease_renew(
        &self,
        conn: &mut dyn DbConn,
        spec: &TableSpec,
        token: SystemTime,
        held: &[(i64, SystemTime)],
    ) -> Result<Vec<i64>, DbError> {
        if held.is_empty() {
            return Ok(Vec::new());
        }
        let rows = conn.query(&renew_sql(spec, held.len()), &renew_params(token, held))?;
        Ok(rows
            .iter()
            .filter_map(|r| r.first().and_then(Value::as_i64))
            .collect())
    }
}

/// The renewal of `n` leases: `(token, (id, held token) x n)` -> the ids renewed.
fn renew_sql(spec: &TableSpec, n: usize) -> String {
    let s = &SYNTAX;
    let tuples: Vec<String> = (0..n)
        .map(|i| format!("(?{}, ?{})", 2 * i + 2, 2 * i + 3))
        .collect();
    format!(
        "UPDATE {t} SET {lu} = ?1 WHERE ({id}, {lu}) IN (VALUES {}) RETURNING {id}",
        tuples.join(", "),
        t = s.q(&spec.name),
        lu = s.q(&spec.locked_until),
        id = s.q(&spec.id),
    )
}

fn renew_params(token: SystemTime, held: &[(i64, SystemTime)]) -> Vec<Value> {
    let mut params = vec![Value::Time(token)];
    for (id, tok) in held {
        params.push(Value::Int(*id));
        params.push(Value::Time(*tok));
    }
    params
}

struct SqliteConn {
    conn: Connection,
    writer: Arc<Mutex<()>>,
    busy: Duration,
    broken: bool,
}

impl rusqlite::ToSql for Value {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(match self {
            Value::Null => ToSqlOutput::Owned(rusqlite::types::Value::Null),
            Value::Int(i) => ToSqlOutput::Owned(rusqlite::types::Value::Integer(*i)),
            Value::Float(f) => ToSqlOutput::Owned(rusqlite::types::Value::Real(*f)),
            Value::Text(s) => ToSqlOutput::Borrowed(ValueRef::Text(s.as_bytes())),
            Value::Bytes(b) => ToSqlOutput::Borrowed(ValueRef::Blob(b)),
            Value::Time(t) => ToSqlOutput::Owned(rusqlite::types::Value::Integer(epoch_secs(*t))),
        })
    }
}

fn from_ref(v: ValueRef<'_>) -> Value {
    match v {
        ValueRef::Null => Value::Null,
        ValueRef::Integer(i) => Value::Int(i),
        ValueRef::Real(f) => Value::Float(f),
        ValueRef::Text(t) => Value::Text(String::from_utf8_lossy(t).into_owned()),
        ValueRef::Blob(b) => Value::Bytes(b.to_vec()),
    }
}

fn classify(e: rusqlite::Error) -> DbError {
    let kind = match e.sqlite_error_code() {
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => DbErrorKind::Transient,
        Some(ErrorCode::CannotOpen | ErrorCode::SystemIoFailure | ErrorCode::DatabaseCorrupt) => {
            DbErrorKind::ConnectionLost
        }
        _ => DbErrorKind::Other,
    };
    DbError::new(kind, e)
}

impl SqliteConn {
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

impl DbConn for SqliteConn {
    fn execute(&mut self, sql: &str, params: &[Value]) -> Result<u64, DbError> {
        let r = self.conn.prepare_cached(sql).and_then(|mut st| {
            let _writing = write_guard(&self.conn, &st, &self.writer, self.busy)?;
            st.execute(params_from_iter(params.iter()))
        });
        r.map(|n| n as u64).map_err(|e| self.fail(e))
    }

    fn query(&mut self, sql: &str, params: &[Value]) -> Result<Vec<Vec<Value>>, DbError> {
        let r = (|| {
            let mut st = self.conn.prepare_cached(sql)?;
            let _writing = write_guard(&self.conn, &st, &self.writer, self.busy)?;
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

    /// A file on this host does not go stale.
    fn ping(&mut self) -> Result<(), DbError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Table;

    fn compile(t: Table) -> TableSql {
        Sqlite::from_url("sqlite::memory:", &crate::dialect::test_options())
            .unwrap()
            .compile(&t.validate().unwrap())
    }

    #[test]
    fn lease_sql() {
        let sql = compile(
            Table::new("jobs")
                .text_column("k")
                .lease(Duration::from_secs(30)),
        );
        assert_eq!(
            sql.claim,
            "UPDATE \"jobs\" SET \"locked_until\" = ?3, \"attempts\" = \"attempts\" + 1 WHERE \"id\" IN \
             (SELECT \"id\" FROM \"jobs\" WHERE \"dead_at\" IS NULL AND \"run_at\" <= ?1 AND \
             (\"locked_until\" IS NULL OR \"locked_until\" <= ?1) ORDER BY \"run_at\", \"id\" LIMIT ?2) \
             RETURNING \"id\", \"attempts\", \"payload\", \"k\""
        );
        assert_eq!(
            sql.claim_one.as_deref(),
            Some(
                "UPDATE \"jobs\" SET \"locked_until\" = ?3, \"attempts\" = \"attempts\" + 1 WHERE \"id\" = \
                 (SELECT \"id\" FROM \"jobs\" WHERE \"dead_at\" IS NULL AND \"run_at\" <= ?1 AND \
                 (\"locked_until\" IS NULL OR \"locked_until\" <= ?1) ORDER BY \"run_at\", \"id\" LIMIT ?2) \
                 RETURNING \"id\", \"attempts\", \"payload\", \"k\""
            )
        );
        assert_eq!(
            sql.ack,
            "DELETE FROM \"jobs\" WHERE \"id\" = ?1 AND \"locked_until\" = ?2"
        );
        assert_eq!(
            sql.retry,
            "UPDATE \"jobs\" SET \"run_at\" = ?1, \"locked_until\" = NULL WHERE \"id\" = ?2 AND \"locked_until\" = ?3"
        );
        assert_eq!(
            sql.dead,
            "UPDATE \"jobs\" SET \"dead_at\" = ?1, \"dead_reason\" = ?2, \"locked_until\" = NULL \
             WHERE \"id\" = ?3 AND \"locked_until\" = ?4"
        );
        assert_eq!(sql.unclaim, "UPDATE \"jobs\" SET \"locked_until\" = NULL, \"attempts\" = \"attempts\" - 1 WHERE \"id\" = ?1 AND \"locked_until\" = ?2");
        assert_eq!(
            sql.insert_one,
            "INSERT INTO \"jobs\" (\"payload\", \"run_at\", \"k\") VALUES (?1, ?2, ?3)"
        );
        assert_eq!(
            sql.insert_id.as_deref(),
            Some("INSERT INTO \"jobs\" (\"payload\", \"run_at\", \"k\") VALUES (?1, ?2, ?3) RETURNING \"id\"")
        );
        assert_eq!(
            sql.dead_list,
            "SELECT \"id\", \"attempts\", \"payload\", \"dead_at\", \"dead_reason\", \"k\" FROM \"jobs\" \
             WHERE \"dead_at\" IS NOT NULL ORDER BY \"dead_at\", \"id\" LIMIT ?1"
        );
        assert_eq!(
            sql.dead_requeue,
            "UPDATE \"jobs\" SET \"dead_at\" = NULL, \"dead_reason\" = NULL, \"locked_until\" = NULL, \"attempts\" = 0, \"run_at\" = ?1 \
             WHERE \"id\" = ?2 AND \"dead_at\" IS NOT NULL"
        );
    }

    #[test]
    fn advisory_sql() {
        let sql = compile(
            Table::new("pay")
                .text_column("account")
                .advisory_lock("a-{account}"),
        );
        assert_eq!(
            sql.claim,
            "SELECT \"id\", \"run_at\", \"account\" FROM \"pay\" WHERE \"dead_at\" IS NULL AND \"run_at\" <= ?1 \
             ORDER BY \"run_at\", \"id\" LIMIT ?2"
        );
        assert_eq!(
            sql.take,
            "UPDATE \"pay\" SET \"attempts\" = \"attempts\" + 1 WHERE \"dead_at\" IS NULL AND \"run_at\" <= ?1 \
             AND \"id\" = ?2 RETURNING \"id\", \"attempts\", \"payload\", \"account\""
        );
        assert_eq!(
            sql.retry,
            "UPDATE \"pay\" SET \"run_at\" = ?1 WHERE \"id\" = ?2"
        );
        assert!(sql.key_lock.is_none());
    }

    #[test]
    fn ddl_and_renewal() {
        let d = Sqlite::from_url("sqlite::memory:", &crate::dialect::test_options()).unwrap();
        let spec = Table::new("jobs")
            .int_column("n")
            .lease(Duration::from_secs(5))
            .validate()
            .unwrap();
        assert_eq!(
            d.create_table(&spec),
            [
                "CREATE TABLE IF NOT EXISTS \"jobs\" (\"id\" INTEGER PRIMARY KEY AUTOINCREMENT, \"payload\" BLOB NOT NULL, \
                 \"attempts\" INTEGER NOT NULL DEFAULT 0, \"run_at\" INTEGER NOT NULL, \"locked_until\" INTEGER, \
                 \"dead_at\" INTEGER, \"dead_reason\" TEXT, \"n\" INTEGER)",
                "CREATE INDEX IF NOT EXISTS \"jobs_ready\" ON \"jobs\" (\"run_at\", \"id\") WHERE \"dead_at\" IS NULL",
            ]
        );
        let t = crate::schedule::from_epoch_secs(10);
        let (sql, params) = (renew_sql(&spec, 2), renew_params(t, &[(1, t), (2, t)]));
        assert_eq!(
            sql,
            "UPDATE \"jobs\" SET \"locked_until\" = ?1 WHERE (\"id\", \"locked_until\") IN (VALUES (?2, ?3), (?4, ?5)) RETURNING \"id\""
        );
        assert_eq!(params.len(), 5);
        assert_eq!(d.insert_many(&spec, 2), "INSERT INTO \"jobs\" (\"payload\", \"run_at\", \"n\") VALUES (?1, ?2, ?3), (?4, ?5, ?6)");
    }

    #[test]
    fn row_lock_is_refused_and_urls_parse() {
        let d = Sqlite::from_url("sqlite::memory:", &crate::dialect::test_options()).unwrap();
        assert!(matches!(
            d.check_form(Form::RowLock),
            Err(BrokerError::Unsupported { .. })
        ));
        assert!(d.check_form(Form::Lease).is_ok());
        assert_eq!(d.max_pool_size(), Some(1));
        assert!(Sqlite::from_url("sqlite:", &crate::dialect::test_options()).is_err());
        let f = Sqlite::from_url("sqlite:///tmp/x.db", &crate::dialect::test_options()).unwrap();
        assert_eq!(f.path.as_deref(), Some(std::path::Path::new("/tmp/x.db")));
        // Two engines on one file share one key registry.
        let g = Sqlite::from_url("sqlite:/tmp/x.db", &crate::dialect::test_options()).unwrap();
        assert!(Arc::ptr_eq(&f.keys, &g.keys));
    }
}
