//! PostgreSQL. All PostgreSQL SQL and `postgres` driver calls live here.
//!
//! - Row lock: `BEGIN ISOLATION LEVEL ..`, then `SELECT .. FOR UPDATE SKIP LOCKED`; the
//!   transaction stays open on the delivery's connection until it is settled.
//! - Lease claim: one statement, a CTE selecting `FOR UPDATE SKIP LOCKED` and an `UPDATE .. FROM`
//!   of the found rows, `RETURNING` them.
//! - Advisory: `pg_try_advisory_lock(hashtextextended(key, 0))`, session scope: the advisory form
//!   needs a direct connection or a session-mode pooler (a transaction-mode PgBouncer breaks it).
//! - Floors: 9.5 for `SKIP LOCKED`, 11 for `hashtextextended`.
//! - Statements are prepared once per connection and cached with it.

use std::collections::HashMap;
use std::error::Error as StdError;
use std::str::FromStr;
use std::time::SystemTime;

use bytes::BytesMut;
use postgres::error::SqlState;
use postgres::types::{FromSql, IsNull, ToSql, Type};
use postgres::{Client, NoTls, Statement};

use super::shared::Syntax;
use super::{DbConn, Dialect, TableSql};
use crate::error::{BrokerError, DbError, DbErrorKind};
use crate::table::{ColumnType, Form, TableSpec};
use crate::Value;

const SYNTAX: Syntax = Syntax {
    quote: quote_ident,
    param: |n| format!("${n}"),
};

/// A `VALUES` list takes its types from its first row, which would default to text here.
const RENEW_CASTS: (&str, &str) = ("::bigint", "::timestamptz");

fn quote_ident(s: &str) -> String {
    format!("\"{s}\"")
}

/// The PostgreSQL engine for one server and database.
pub(crate) struct Postgres {
    config: postgres::Config,
}

impl Postgres {
    pub fn from_url(url: &str) -> Result<Self, BrokerError> {
        let config = postgres::Config::from_str(url).map_err(|e| BrokerError::InvalidUrl {
            reason: format!("{e}"),
        })?;
        Ok(Postgres { config })
    }
}

/// The oldest `server_version_num` a form needs, and what needs it.
pub(crate) fn floor(form: Form) -> (u32, &'static str, &'static str) {
    match form {
        Form::AdvisoryLock => (110_000, "11", "hashtextextended (advisory lock form)"),
        Form::RowLock | Form::Lease => (90_500, "9.5", "FOR UPDATE SKIP LOCKED"),
    }
}

/// Checks a server's `server_version_num` against the floor of `form`.
pub(crate) fn check_version(num: u32, shown: &str, form: Form) -> Result<(), BrokerError> {
    let (needed, needed_shown, what) = floor(form);
    if num < needed {
        return Err(BrokerError::ServerTooOld {
            database: "PostgreSQL",
            found: shown.to_string(),
            needed: needed_shown.to_string(),
            what,
        });
    }
    Ok(())
}

impl Dialect for Postgres {
    fn database(&self) -> &'static str {
        "PostgreSQL"
    }

    fn connect(&self) -> Result<Box<dyn DbConn>, DbError> {
        let client = self
            .config
            .connect(NoTls)
            .map_err(|e| DbError::new(DbErrorKind::ConnectionLost, PgError(e)))?;
        Ok(Box::new(PgConn {
            client,
            statements: HashMap::new(),
            broken: false,
        }))
    }

    fn check_server(&self, conn: &mut dyn DbConn, form: Form) -> Result<(), BrokerError> {
        let rows = conn
            .query(
                "SELECT current_setting('server_version_num'), current_setting('server_version')",
                &[],
            )
            .map_err(|e| e.during("version check", "-"))?;
        let (num, shown) = match rows.first().map(|r| (&r[0], &r[1])) {
            Some((Value::Text(n), Value::Text(s))) => {
                (n.trim().parse::<u32>().unwrap_or(0), s.clone())
            }
            _ => (0, "unknown".to_string()),
        };
        check_version(num, &shown, form)
    }

    fn compile(&self, spec: &TableSpec) -> TableSql {
        let s = &SYNTAX;
        let mut sql = TableSql {
            begin: vec![format!("BEGIN ISOLATION LEVEL {}", spec.isolation.sql())],
            begin_write: "BEGIN".into(),
            ..TableSql::default()
        };
        s.common(spec, &mut sql);
        let t = s.q(&spec.name);
        let id = s.q(&spec.id);
        let att = s.q(&spec.attempts);
        let lu = s.q(&spec.locked_until);
        let ready = s.ready(spec, "$1");
        let order = s.order(spec);
        let row = s.row_columns(spec, "");
        match spec.form {
            Form::RowLock => {
                sql.claim = format!(
                    "SELECT {row} FROM {t} WHERE {ready} ORDER BY {order} LIMIT $2 FOR UPDATE SKIP LOCKED"
                );
            }
            Form::Lease => {
                sql.claim = format!(
                    "WITH c AS (SELECT {id} FROM {t} WHERE {ready} AND ({lu} IS NULL OR {lu} <= $1) \
                     ORDER BY {order} LIMIT $2 FOR UPDATE SKIP LOCKED) \
                     UPDATE {t} AS q SET {lu} = $3, {att} = q.{att} + 1 FROM c WHERE q.{id} = c.{id} \
                     RETURNING {}",
                    s.row_columns(spec, "q.")
                );
            }
            Form::AdvisoryLock => {
                sql.claim = format!(
                    "SELECT {} FROM {t} WHERE {ready} ORDER BY {order} LIMIT $2",
                    s.key_columns(spec)
                );
                sql.take = format!(
                    "UPDATE {t} SET {att} = {att} + 1 WHERE {ready} AND {id} = $2 RETURNING {row}"
                );
                sql.key_lock =
                    Some("SELECT pg_try_advisory_lock(hashtextextended($1, 0))::int".into());
                sql.key_unlock =
                    Some("SELECT pg_advisory_unlock(hashtextextended($1, 0))::int".into());
            }
        }
        sql
    }

    fn create_table(&self, spec: &TableSpec) -> Vec<String> {
        let s = &SYNTAX;
        let mut cols = vec![
            format!(
                "{} BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY",
                s.q(&spec.id)
            ),
            format!("{} BYTEA NOT NULL", s.q(&spec.payload)),
            format!("{} INTEGER NOT NULL DEFAULT 0", s.q(&spec.attempts)),
            format!(
                "{} TIMESTAMPTZ NOT NULL DEFAULT date_trunc('second', now())",
                s.q(&spec.run_at)
            ),
        ];
        if spec.form == Form::Lease {
            cols.push(format!("{} TIMESTAMPTZ", s.q(&spec.locked_until)));
        }
        cols.push(format!("{} TIMESTAMPTZ", s.q(&spec.dead_at)));
        cols.push(format!("{} TEXT", s.q(&spec.dead_reason)));
        for c in &spec.columns {
            let ty = match c.ty {
                ColumnType::Text => "TEXT",
                ColumnType::Int => "BIGINT",
                ColumnType::Float => "DOUBLE PRECISION",
                ColumnType::Bytes => "BYTEA",
            };
            cols.push(format!("{} {ty}", s.q(&c.name)));
        }
        let t = s.q(&spec.name);
        vec![
            format!("CREATE TABLE IF NOT EXISTS {t} ({})", cols.join(", ")),
            format!(
                "CREATE INDEX IF NOT EXISTS {} ON {t} ({}) WHERE {} IS NULL",
                s.q(&format!("{}_ready", spec.name)),
                s.order(spec),
                s.q(&spec.dead_at)
            ),
        ]
    }

    fn insert_many(&self, spec: &TableSpec, rows: usize) -> String {
        format!(
            "{}{}",
            SYNTAX.insert_head(spec),
            SYNTAX.insert_values(spec, rows)
        )
    }

    fn max_params(&self) -> usize {
        65_535
    }

    fn lease_renew(
        &self,
        conn: &mut dyn DbConn,
        spec: &TableSpec,
        token: SystemTime,
        held: &[(i64, SystemTime)],
    ) -> Result<Vec<i64>, DbError> {
        let (sql, params) = SYNTAX.renew_returning(spec, token, held, RENEW_CASTS);
        let rows = conn.query(&sql, &params)?;
        Ok(rows
            .iter()
            .filter_map(|r| r.first().and_then(Value::as_i64))
            .collect())
    }
}

struct PgConn {
    client: Client,
    statements: HashMap<String, Statement>,
    broken: bool,
}

impl PgConn {
    fn prepared(&mut self, sql: &str) -> Result<Statement, postgres::Error> {
        if let Some(st) = self.statements.get(sql) {
            return Ok(st.clone());
        }
        let st = self.client.prepare(sql)?;
        self.statements.insert(sql.to_string(), st.clone());
        Ok(st)
    }

    fn fail(&mut self, e: postgres::Error) -> DbError {
        let kind = classify(&e, self.client.is_closed());
        if kind == DbErrorKind::ConnectionLost {
            self.broken = true;
        }
        DbError::new(kind, PgError(e))
    }
}

/// A driver error whose message shows the server's own (`postgres::Error` shows only "db
/// error" and keeps the server's message in its source).
#[derive(Debug)]
struct PgError(postgres::Error);

impl std::fmt::Display for PgError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0.as_db_error() {
            Some(db) => write!(f, "{db} (SQLSTATE {})", db.code().code()),
            None => self.0.fmt(f),
        }
    }
}

impl StdError for PgError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(&self.0)
    }
}

fn classify(e: &postgres::Error, closed: bool) -> DbErrorKind {
    if closed || e.is_closed() {
        return DbErrorKind::ConnectionLost;
    }
    match e.code() {
        Some(c)
            if *c == SqlState::T_R_SERIALIZATION_FAILURE
                || *c == SqlState::T_R_DEADLOCK_DETECTED =>
        {
            DbErrorKind::Transient
        }
        Some(c) if *c == SqlState::LOCK_NOT_AVAILABLE => DbErrorKind::Transient,
        Some(c)
            if *c == SqlState::ADMIN_SHUTDOWN
                || *c == SqlState::CRASH_SHUTDOWN
                || *c == SqlState::CANNOT_CONNECT_NOW
                || *c == SqlState::IDLE_IN_TRANSACTION_SESSION_TIMEOUT
                || c.code().starts_with("08") =>
        {
            DbErrorKind::ConnectionLost
        }
        Some(_) => DbErrorKind::Other,
        // No SQLSTATE: an I/O error, or a value that did not convert.
        None if e.source().is_some_and(|s| s.is::<std::io::Error>()) => DbErrorKind::ConnectionLost,
        None => DbErrorKind::Other,
    }
}

fn params(values: &[Value]) -> Vec<&(dyn ToSql + Sync)> {
    values.iter().map(|v| v as &(dyn ToSql + Sync)).collect()
}

impl DbConn for PgConn {
    fn execute(&mut self, sql: &str, values: &[Value]) -> Result<u64, DbError> {
        let r = self
            .prepared(sql)
            .and_then(|st| self.client.execute(&st, &params(values)));
        r.map_err(|e| self.fail(e))
    }

    fn query(&mut self, sql: &str, values: &[Value]) -> Result<Vec<Vec<Value>>, DbError> {
        let r = self
            .prepared(sql)
            .and_then(|st| self.client.query(&st, &params(values)));
        let rows = r.map_err(|e| self.fail(e))?;
        let mut out = Vec::with_capacity(rows.len());
        for row in rows {
            let mut vals = Vec::with_capacity(row.len());
            for i in 0..row.len() {
                vals.push(row.try_get::<_, Value>(i).map_err(|e| self.fail(e))?);
            }
            out.push(vals);
        }
        Ok(out)
    }

    fn batch(&mut self, sql: &str) -> Result<(), DbError> {
        self.client.batch_execute(sql).map_err(|e| self.fail(e))
    }

    fn is_broken(&self) -> bool {
        self.broken || self.client.is_closed()
    }

    fn mark_broken(&mut self) {
        self.broken = true;
    }
}

type BoxError = Box<dyn StdError + Sync + Send>;

impl ToSql for Value {
    fn to_sql(&self, ty: &Type, out: &mut BytesMut) -> Result<IsNull, BoxError> {
        match self {
            Value::Null => Ok(IsNull::Yes),
            Value::Int(i) => match *ty {
                Type::INT2 => i16::try_from(*i)?.to_sql(ty, out),
                Type::INT4 => i32::try_from(*i)?.to_sql(ty, out),
                Type::INT8 => i.to_sql(ty, out),
                Type::FLOAT8 => (*i as f64).to_sql(ty, out),
                _ => Err(format!("an integer does not fit a {ty} column").into()),
            },
            Value::Float(f) => match *ty {
                Type::FLOAT4 => (*f as f32).to_sql(ty, out),
                Type::FLOAT8 => f.to_sql(ty, out),
                _ => Err(format!("a float does not fit a {ty} column").into()),
            },
            // Each delegate writes its own binary format: check it fits before it writes.
            Value::Text(s) if <&str as ToSql>::accepts(ty) => s.as_str().to_sql(ty, out),
            Value::Bytes(b) if <&[u8] as ToSql>::accepts(ty) => b.as_slice().to_sql(ty, out),
            Value::Time(t) if <SystemTime as ToSql>::accepts(ty) => t.to_sql(ty, out),
            Value::Text(_) | Value::Bytes(_) | Value::Time(_) => {
                let kind = match self {
                    Value::Text(_) => "text",
                    Value::Bytes(_) => "bytes",
                    _ => "a time",
                };
                Err(format!("{kind} does not fit a {ty} column").into())
            }
        }
    }

    fn accepts(_ty: &Type) -> bool {
        // Checked per value in `to_sql`, which names the mismatch.
        true
    }

    postgres::types::to_sql_checked!();
}

impl<'a> FromSql<'a> for Value {
    fn from_sql(ty: &Type, raw: &'a [u8]) -> Result<Self, BoxError> {
        Ok(match *ty {
            Type::INT2 => Value::Int(i16::from_sql(ty, raw)?.into()),
            Type::INT4 => Value::Int(i32::from_sql(ty, raw)?.into()),
            Type::INT8 => Value::Int(i64::from_sql(ty, raw)?),
            Type::FLOAT4 => Value::Float(f32::from_sql(ty, raw)?.into()),
            Type::FLOAT8 => Value::Float(f64::from_sql(ty, raw)?),
            Type::BOOL => Value::Int(bool::from_sql(ty, raw)?.into()),
            Type::BYTEA => Value::Bytes(raw.to_vec()),
            Type::TIMESTAMPTZ | Type::TIMESTAMP => Value::Time(SystemTime::from_sql(ty, raw)?),
            _ => Value::Text(<&str>::from_sql(ty, raw)?.to_string()),
        })
    }

    fn from_sql_null(_ty: &Type) -> Result<Self, BoxError> {
        Ok(Value::Null)
    }

    fn accepts(ty: &Type) -> bool {
        matches!(
            *ty,
            Type::INT2
                | Type::INT4
                | Type::INT8
                | Type::FLOAT4
                | Type::FLOAT8
                | Type::BOOL
                | Type::BYTEA
                | Type::TIMESTAMPTZ
                | Type::TIMESTAMP
        ) || <&str as FromSql>::accepts(ty)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Table;
    use std::time::Duration;

    fn compile(t: Table) -> TableSql {
        Postgres::from_url("postgres://u@h/db")
            .unwrap()
            .compile(&t.validate().unwrap())
    }

    #[test]
    fn row_lock_sql() {
        let sql = compile(Table::new("emails").text_column("to"));
        assert_eq!(sql.begin, ["BEGIN ISOLATION LEVEL READ COMMITTED"]);
        assert_eq!(
            sql.claim,
            "SELECT \"id\", \"attempts\", \"payload\", \"to\" FROM \"emails\" WHERE \"dead_at\" IS NULL AND \
             \"run_at\" <= $1 ORDER BY \"run_at\", \"id\" LIMIT $2 FOR UPDATE SKIP LOCKED"
        );
        assert_eq!(sql.ack, "DELETE FROM \"emails\" WHERE \"id\" = $1");
        assert_eq!(sql.retry, "UPDATE \"emails\" SET \"run_at\" = $1, \"attempts\" = \"attempts\" + 1 WHERE \"id\" = $2");
        assert_eq!(
            sql.dead,
            "UPDATE \"emails\" SET \"dead_at\" = $1, \"dead_reason\" = $2, \"attempts\" = \"attempts\" + 1 WHERE \"id\" = $3"
        );
        assert_eq!(
            sql.insert_one,
            "INSERT INTO \"emails\" (\"payload\", \"run_at\", \"to\") VALUES ($1, $2, $3)"
        );
    }

    #[test]
    fn lease_sql() {
        let sql = compile(Table::new("thumbs").lease(Duration::from_secs(30)));
        assert_eq!(
            sql.claim,
            "WITH c AS (SELECT \"id\" FROM \"thumbs\" WHERE \"dead_at\" IS NULL AND \"run_at\" <= $1 AND \
             (\"locked_until\" IS NULL OR \"locked_until\" <= $1) ORDER BY \"run_at\", \"id\" LIMIT $2 FOR UPDATE SKIP LOCKED) \
             UPDATE \"thumbs\" AS q SET \"locked_until\" = $3, \"attempts\" = q.\"attempts\" + 1 FROM c \
             WHERE q.\"id\" = c.\"id\" RETURNING q.\"id\", q.\"attempts\", q.\"payload\""
        );
        assert_eq!(
            sql.ack,
            "DELETE FROM \"thumbs\" WHERE \"id\" = $1 AND \"locked_until\" = $2"
        );
        assert_eq!(sql.release, "UPDATE \"thumbs\" SET \"locked_until\" = NULL WHERE \"id\" = $1 AND \"locked_until\" = $2");
        let spec = Table::new("thumbs")
            .lease(Duration::from_secs(30))
            .validate()
            .unwrap();
        let t = crate::schedule::from_epoch_secs(5);
        let (renew, params) = SYNTAX.renew_returning(&spec, t, &[(1, t), (2, t)], RENEW_CASTS);
        assert_eq!(
            renew,
            "UPDATE \"thumbs\" SET \"locked_until\" = $1 WHERE (\"id\", \"locked_until\") IN (VALUES ($2::bigint, $3::timestamptz), ($4, $5)) RETURNING \"id\""
        );
        assert_eq!(params.len(), 5);
    }

    #[test]
    fn advisory_sql() {
        let sql = compile(
            Table::new("payments")
                .text_column("account")
                .advisory_lock("accounts-{account}"),
        );
        assert_eq!(
            sql.claim,
            "SELECT \"id\", \"account\" FROM \"payments\" WHERE \"dead_at\" IS NULL AND \"run_at\" <= $1 \
             ORDER BY \"run_at\", \"id\" LIMIT $2"
        );
        assert_eq!(
            sql.take,
            "UPDATE \"payments\" SET \"attempts\" = \"attempts\" + 1 WHERE \"dead_at\" IS NULL AND \"run_at\" <= $1 \
             AND \"id\" = $2 RETURNING \"id\", \"attempts\", \"payload\", \"account\""
        );
        assert_eq!(
            sql.key_lock.as_deref(),
            Some("SELECT pg_try_advisory_lock(hashtextextended($1, 0))::int")
        );
        assert_eq!(
            sql.key_unlock.as_deref(),
            Some("SELECT pg_advisory_unlock(hashtextextended($1, 0))::int")
        );
    }

    #[test]
    fn ddl() {
        let d = Postgres::from_url("postgres://u@h/db").unwrap();
        let spec = Table::new("jobs").text_column("k").validate().unwrap();
        assert_eq!(
            d.create_table(&spec),
            [
                "CREATE TABLE IF NOT EXISTS \"jobs\" (\"id\" BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY, \
                 \"payload\" BYTEA NOT NULL, \"attempts\" INTEGER NOT NULL DEFAULT 0, \"run_at\" TIMESTAMPTZ NOT NULL \
                 DEFAULT date_trunc('second', now()), \"dead_at\" TIMESTAMPTZ, \"dead_reason\" TEXT, \"k\" TEXT)",
                "CREATE INDEX IF NOT EXISTS \"jobs_ready\" ON \"jobs\" (\"run_at\", \"id\") WHERE \"dead_at\" IS NULL",
            ]
        );
    }

    #[test]
    fn version_floors() {
        assert!(check_version(150004, "15.4", Form::AdvisoryLock).is_ok());
        assert!(check_version(110000, "11.0", Form::AdvisoryLock).is_ok());
        assert!(check_version(90500, "9.5", Form::RowLock).is_ok());
        match check_version(100023, "10.23", Form::AdvisoryLock) {
            Err(BrokerError::ServerTooOld { found, needed, .. }) => {
                assert_eq!((found.as_str(), needed.as_str()), ("10.23", "11"));
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            check_version(90424, "9.4.24", Form::Lease),
            Err(BrokerError::ServerTooOld { .. })
        ));
        assert!(check_version(100023, "10.23", Form::Lease).is_ok());
    }
}
