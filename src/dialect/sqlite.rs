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
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use parking_lot::{Mutex, MutexGuard};
use rusqlite::types::{ToSqlOutput, ValueRef};
use rusqlite::{params_from_iter, Connection, ErrorCode};

use super::shared::{ColumnTypes, Syntax};
use super::{DbConn, Dialect, TableSql};
use crate::error::{BrokerError, DbError, DbErrorKind};
use crate::form::advisory::KeyRegistry;
use crate::schedule::epoch_secs;
use crate::table::{Form, TableSpec};
use crate::Value;

/// How long a statement waits for the writer before it fails with `SQLITE_BUSY`.
const BUSY_TIMEOUT: Duration = Duration::from_secs(30);

const SYNTAX: Syntax = Syntax {
    quote: quote_ident,
    param: |n| format!("?{n}"),
    values_casts: ("", ""),
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
}

impl Sqlite {
    /// `sqlite:path`, `sqlite://path`, `sqlite::memory:`.
    pub fn from_url(url: &str) -> Result<Self, BrokerError> {
        let rest = url.split_once(':').map(|(_, r)| r).unwrap_or_default();
        let rest = rest.strip_prefix("//").unwrap_or(rest);
        if rest.is_empty() {
            return Err(BrokerError::InvalidUrl {
                reason: format!("no database file in {url:?}"),
            });
        }
        if rest == ":memory:" {
            return Ok(Sqlite {
                path: None,
                keys: Arc::default(),
                writer: Arc::default(),
            });
        }
        let path = PathBuf::from(rest);
        let abs = std::path::absolute(&path).unwrap_or(path);
        let PerFile { keys, writer } = per_file(&abs);
        Ok(Sqlite {
            path: Some(abs),
            keys,
            writer,
        })
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
            None => Connection::open_in_memory(),
        }
        .map_err(classify)?;
        conn.busy_timeout(BUSY_TIMEOUT).map_err(classify)?;
        conn.set_prepared_statement_cache_capacity(64);
        if self.path.is_some() {
            conn.query_row("PRAGMA journal_mode = WAL", [], |_| Ok(()))
                .map_err(classify)?;
            conn.execute_batch("PRAGMA synchronous = NORMAL")
                .map_err(classify)?;
        }
        Ok(Box::new(SqliteConn {
            conn,
            writer: self.writer.clone(),
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
}

struct SqliteConn {
    conn: Connection,
    writer: Arc<Mutex<()>>,
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
/// transaction. Inside one (which holds SQLite's write lock already) it is not taken: a writer
/// waiting on the lock in SQLite's busy handler would otherwise wait for us while we wait for it.
fn write_guard<'a>(
    conn: &Connection,
    st: &rusqlite::CachedStatement<'_>,
    writer: &'a Mutex<()>,
) -> Option<MutexGuard<'a, ()>> {
    (!st.readonly() && conn.is_autocommit()).then(|| writer.lock())
}

impl DbConn for SqliteConn {
    fn execute(&mut self, sql: &str, params: &[Value]) -> Result<u64, DbError> {
        let r = self.conn.prepare_cached(sql).and_then(|mut st| {
            let _writing = write_guard(&self.conn, &st, &self.writer);
            st.execute(params_from_iter(params.iter()))
        });
        r.map(|n| n as u64).map_err(|e| self.fail(e))
    }

    fn query(&mut self, sql: &str, params: &[Value]) -> Result<Vec<Vec<Value>>, DbError> {
        let r = (|| {
            let mut st = self.conn.prepare_cached(sql)?;
            let _writing = write_guard(&self.conn, &st, &self.writer);
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Table;

    fn compile(t: Table) -> TableSql {
        Sqlite::from_url("sqlite::memory:")
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
        assert_eq!(sql.release, "UPDATE \"jobs\" SET \"locked_until\" = NULL WHERE \"id\" = ?1 AND \"locked_until\" = ?2");
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
        let d = Sqlite::from_url("sqlite::memory:").unwrap();
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
        let (sql, params) = SYNTAX.renew_returning(&spec, t, &[(1, t), (2, t)]);
        assert_eq!(
            sql,
            "UPDATE \"jobs\" SET \"locked_until\" = ?1 WHERE (\"id\", \"locked_until\") IN (VALUES (?2, ?3), (?4, ?5)) RETURNING \"id\""
        );
        assert_eq!(params.len(), 5);
        assert_eq!(d.insert_many(&spec, 2), "INSERT INTO \"jobs\" (\"payload\", \"run_at\", \"n\") VALUES (?1, ?2, ?3), (?4, ?5, ?6)");
    }

    #[test]
    fn row_lock_is_refused_and_urls_parse() {
        let d = Sqlite::from_url("sqlite::memory:").unwrap();
        assert!(matches!(
            d.check_form(Form::RowLock),
            Err(BrokerError::Unsupported { .. })
        ));
        assert!(d.check_form(Form::Lease).is_ok());
        assert_eq!(d.max_pool_size(), Some(1));
        assert!(Sqlite::from_url("sqlite:").is_err());
        let f = Sqlite::from_url("sqlite:///tmp/x.db").unwrap();
        assert_eq!(f.path.as_deref(), Some(std::path::Path::new("/tmp/x.db")));
        // Two engines on one file share one key registry.
        let g = Sqlite::from_url("sqlite:/tmp/x.db").unwrap();
        assert!(Arc::ptr_eq(&f.keys, &g.keys));
    }
}
