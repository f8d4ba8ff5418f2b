//! One PostgreSQL session as a [`DbConn`], its per-connection statement cache, and how a
//! driver error is classified.

use std::collections::HashMap;
use std::error::Error as StdError;

use postgres::error::SqlState;
use postgres::types::ToSql;
use postgres::{Client, NoTls, Statement};

use crate::dialect::DbConn;
use crate::error::{DbError, DbErrorKind};
use crate::Value;

/// Prepared statements kept per connection before the cache is emptied: a table uses about a
/// dozen, plus the insert and renewal variants of each size class.
const STMT_CACHE: usize = 256;

/// How sessions are opened: in plain text, or through TLS where the mode allows.
pub(super) enum Connector {
    /// `sslmode=disable`, or `prefer` without the `tls` feature.
    Plain,
    /// TLS through rustls; `prefer` (`fallback`) goes on in plain text if the handshake fails.
    #[cfg(feature = "tls")]
    Rustls {
        make: super::tls::MakeRustls,
        fallback: bool,
    },
}

impl Connector {
    pub(super) fn new(settings: &super::tls::Settings) -> Result<Self, crate::BrokerError> {
        if settings.mode == super::tls::SslMode::Disable {
            return Ok(Connector::Plain);
        }
        #[cfg(feature = "tls")]
        return Ok(Connector::Rustls {
            make: super::tls::MakeRustls::new(settings)?,
            fallback: settings.mode == super::tls::SslMode::Prefer,
        });
        #[cfg(not(feature = "tls"))]
        Ok(Connector::Plain)
    }
}

/// Opens a session with the engine's settings.
pub(super) fn connect(
    config: &postgres::Config,
    tls: &Connector,
) -> Result<Box<dyn DbConn + Send>, DbError> {
    let client = client(config, tls)?;
    Ok(Box::new(PgConn {
        client,
        statements: HashMap::new(),
        broken: false,
        unreadable: Vec::new(),
        pid: None,
    }))
}

/// Opens a driver session with the engine's TLS settings (the pool's sessions and the change
/// feed's).
pub(super) fn client(config: &postgres::Config, tls: &Connector) -> Result<Client, DbError> {
    match tls {
        Connector::Plain => config.connect(NoTls),
        #[cfg(feature = "tls")]
        Connector::Rustls { make, fallback } => match config.connect(make.clone()) {
            // libpq's `prefer`: a connection that cannot be encrypted is made in plain text.
            Err(e) if *fallback && super::tls::is_tls_failure(&e) => {
                log::info!(
                    "PostgreSQL: TLS handshake failed ({}); sslmode=prefer goes on without TLS",
                    PgError(e)
                );
                let mut plain = config.clone();
                plain.ssl_mode(postgres::config::SslMode::Disable);
                plain.connect(NoTls)
            }
            other => other,
        },
    }
    .map_err(|e| DbError::new(classify_connect(&e), PgError(e)))
}

/// One PostgreSQL session.
struct PgConn {
    client: Client,
    statements: HashMap<String, Statement>,
    broken: bool,
    /// Cells of the last query that no [`Value`] can hold: `(row, reason)`.
    unreadable: Vec<(usize, String)>,
    /// The backend's pid, once asked.
    pid: Option<u64>,
}

impl PgConn {
    fn prepared(&mut self, sql: &str) -> Result<Statement, postgres::Error> {
        if let Some(st) = self.statements.get(sql) {
            return Ok(st.clone());
        }
        let st = self.client.prepare(sql)?;
        if self.statements.len() >= STMT_CACHE {
            // Dropping a statement closes it on the server.
            self.statements.clear();
        }
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
pub(super) struct PgError(pub postgres::Error);

impl std::fmt::Display for PgError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0.as_db_error() {
            Some(db) => write!(f, "{db} (SQLSTATE {})", db.code().code()),
            None => {
                // The driver's own text names only the kind ("error performing TLS
                // handshake"); the reason is in its sources.
                self.0.fmt(f)?;
                let mut source = StdError::source(&self.0);
                while let Some(s) = source {
                    write!(f, ": {s}")?;
                    source = s.source();
                }
                Ok(())
            }
        }
    }
}

impl StdError for PgError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(&self.0)
    }
}

/// How a failed connection attempt should be treated: the server's refusal (authentication, an
/// unknown database) and a failed TLS handshake (a certificate that does not verify) will fail
/// the same way again; an unreachable or starting server, or one out of connections, may not.
fn classify_connect(e: &postgres::Error) -> DbErrorKind {
    if let Some(db) = e.as_db_error() {
        let code = db.code();
        return if *code == SqlState::CANNOT_CONNECT_NOW
            || *code == SqlState::TOO_MANY_CONNECTIONS
            || *code == SqlState::ADMIN_SHUTDOWN
            || code.code().starts_with("08")
        {
            DbErrorKind::ConnectionLost
        } else {
            DbErrorKind::Other
        };
    }
    // The driver has no public error kind: its message names a TLS failure.
    if e.to_string().starts_with("error performing TLS handshake") {
        return DbErrorKind::Other;
    }
    DbErrorKind::ConnectionLost
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
        // `lock_timeout`, and `statement_timeout` (or a cancel): the statement was rolled back.
        Some(c) if *c == SqlState::LOCK_NOT_AVAILABLE || *c == SqlState::QUERY_CANCELED => {
            DbErrorKind::Transient
        }
        Some(c)
            if *c == SqlState::ADMIN_SHUTDOWN
                || *c == SqlState::CRASH_SHUTDOWN
                || *c == SqlState::CANNOT_CONNECT_NOW
                || *c == SqlState::IDLE_IN_TRANSACTION_SESSION_TIMEOUT
                || c.code().starts_with("08") =>
        {
            DbErrorKind::ConnectionLost
        }
        // Undefined column, a type the statement cannot compare or assign, undefined function
        // (an operator over a column of another type).
        Some(c)
            if *c == SqlState::UNDEFINED_COLUMN
                || *c == SqlState::DATATYPE_MISMATCH
                || *c == SqlState::UNDEFINED_FUNCTION =>
        {
            DbErrorKind::Schema
        }
        Some(_) => DbErrorKind::Other,
        // No SQLSTATE: an I/O error, or a value that did not convert.
        None if e.source().is_some_and(|s| s.is::<std::io::Error>()) => DbErrorKind::ConnectionLost,
        None => DbErrorKind::Other,
    }
}

/// Rows as [`Value`]s. A column type no `Value` holds fails its cell, not the query: a claim
/// has already counted the row's attempt, and the row must reach a dead letter with the reason
/// rather than fail every claim for ever. Such cells read `NULL`; `unreadable` gets
/// `(row, reason)`.
fn decode(rows: Vec<postgres::Row>, unreadable: &mut Vec<(usize, String)>) -> Vec<Vec<Value>> {
    let mut out = Vec::with_capacity(rows.len());
    for (n, row) in rows.into_iter().enumerate() {
        let mut vals = Vec::with_capacity(row.len());
        for i in 0..row.len() {
            vals.push(row.try_get::<_, Value>(i).unwrap_or_else(|e| {
                let col = &row.columns()[i];
                unreadable.push((n, format!("column {} ({}): {e}", col.name(), col.type_())));
                Value::Null
            }));
        }
        out.push(vals);
    }
    out
}

/// The application's own transaction as a [`DbConn`], for the transactional publish. It is
/// never pooled: broken or not is the application's business.
pub(crate) struct TxConn<'a, 'b>(pub &'a mut postgres::Transaction<'b>);

fn wrap(e: postgres::Error) -> DbError {
    DbError::new(classify(&e, false), PgError(e))
}

impl DbConn for TxConn<'_, '_> {
    fn execute(&mut self, sql: &str, values: &[Value]) -> Result<u64, DbError> {
        self.0.execute(sql, &params(values)).map_err(wrap)
    }

    fn query(&mut self, sql: &str, values: &[Value]) -> Result<Vec<Vec<Value>>, DbError> {
        let rows = self.0.query(sql, &params(values)).map_err(wrap)?;
        Ok(decode(rows, &mut Vec::new()))
    }

    fn batch(&mut self, sql: &str) -> Result<(), DbError> {
        self.0.batch_execute(sql).map_err(wrap)
    }

    fn is_broken(&self) -> bool {
        false
    }

    fn set_broken(&mut self, _: bool) {}
}

fn params(values: &[Value]) -> Vec<&(dyn ToSql + Sync)> {
    values.iter().map(|v| v as &(dyn ToSql + Sync)).collect()
}

impl DbConn for PgConn {
    fn driver(&mut self) -> Option<&mut dyn std::any::Any> {
        Some(&mut self.client)
    }

    fn session_id(&mut self) -> Option<u64> {
        if self.pid.is_none() {
            let row = self.client.query_one(super::sql::BACKEND_PID, &[]).ok()?;
            self.pid = u64::try_from(row.get::<_, i32>(0)).ok();
        }
        self.pid
    }

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
        self.unreadable.clear();
        Ok(decode(rows, &mut self.unreadable))
    }

    fn batch(&mut self, sql: &str) -> Result<(), DbError> {
        self.client.batch_execute(sql).map_err(|e| self.fail(e))
    }

    fn is_broken(&self) -> bool {
        self.broken || self.client.is_closed()
    }

    fn set_broken(&mut self, broken: bool) {
        self.broken = broken;
    }

    fn take_unreadable(&mut self) -> Vec<(usize, String)> {
        std::mem::take(&mut self.unreadable)
    }
}
