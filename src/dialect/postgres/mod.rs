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
//!
//! Files, one concern each (the MySQL and SQLite dialects are laid out alike):
//! - `mod.rs`: the engine ([`Postgres`]), its URL and session settings, and the [`Dialect`]
//!   impl, which delegates to the files below;
//! - `sql.rs`: the statement text of a table, built once;
//! - `protocol.rs`: the lease renewal, one statement over a variable number of leases;
//! - `listen.rs`: the change feed (`LISTEN` on a dedicated session) that wakes claimers when
//!   another broker publishes;
//! - `conn.rs`: one session ([`DbConn`]), its statement cache, and the classification of driver
//!   errors;
//! - `diesel.rs`: the application's Diesel `PgConnection` as a [`DbConn`], for
//!   publishing in its transaction (feature `diesel-postgres`);
//! - `live_tests.rs`: checks of the SQL against a live server (the claims' plans);
//! - `tls.rs`: the URL's `sslmode` and `sslrootcert`, and the rustls connector (feature `tls`);
//! - `values.rs`: [`Value`](crate::Value) to and from PostgreSQL's types;
//! - `version.rs`: the version floors of each form.

mod conn;
#[cfg(feature = "diesel-postgres")]
pub(crate) mod diesel;
mod listen;
#[cfg(test)]
mod live_tests;
mod protocol;
mod registry;
mod sql;
mod tls;
mod values;
mod version;

use std::str::FromStr;
use std::time::{Duration, SystemTime};

use super::shared::Syntax;
use super::{ChangeFeed, ConnOptions, DbConn, Dialect, TableSql, Watcher};
use crate::error::{BrokerError, DbError};
use crate::table::{Form, TableSpec};
use crate::Value;

pub(crate) use conn::TxConn;

/// The engine with no server of its own: the SQL text and protocols, for publishing on the
/// application's own transactions.
pub(crate) fn sql_only() -> &'static dyn Dialect {
    static ENGINE: std::sync::OnceLock<Postgres> = std::sync::OnceLock::new();
    ENGINE.get_or_init(|| Postgres {
        config: postgres::Config::new(),
        tls: conn::Connector::Plain,
    })
}

/// The PostgreSQL engine for one server and database.
pub(super) struct Postgres {
    config: postgres::Config,
    tls: conn::Connector,
}

impl Postgres {
    /// The URL's settings, plus `lock_timeout` and `statement_timeout` in the startup options
    /// (no round trip) unless the URL's `options` set them. TLS as the URL's `sslmode` says
    /// (see `tls.rs`; default `prefer`, as libpq).
    pub(super) fn from_url(url: &str, opts: &ConnOptions) -> Result<Self, BrokerError> {
        let (url, tls) = tls::from_url(url)?;
        let mut config = postgres::Config::from_str(&url).map_err(|e| BrokerError::InvalidUrl {
            reason: format!("{e}"),
        })?;
        config.ssl_mode(tls.driver_mode());
        let ms = opts.statement_timeout.as_millis();
        let mut options = config.get_options().unwrap_or_default().to_string();
        for name in ["lock_timeout", "statement_timeout"] {
            if !options.contains(name) {
                options.push_str(&format!(" -c {name}={ms}"));
            }
        }
        config.options(options.trim());
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        // A dead peer (a host gone, a cable cut) is noticed in about a minute, not hours.
        config.keepalives(true).keepalives_idle(KEEPALIVE_IDLE);
        Ok(Postgres {
            config,
            tls: conn::Connector::new(&tls)?,
        })
    }
}

/// Connect timeout unless the URL sets `connect_timeout`.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// TCP keepalive idle time.
const KEEPALIVE_IDLE: Duration = Duration::from_secs(30);

impl Dialect for Postgres {
    fn database(&self) -> &'static str {
        "PostgreSQL"
    }

    fn cancel_statement(&self, session: u64) -> Option<String> {
        Some(sql::cancel(session))
    }

    fn connect(&self) -> Result<Box<dyn DbConn + Send>, DbError> {
        conn::connect(&self.config, &self.tls)
    }

    fn check_server(&self, conn: &mut dyn DbConn, form: Form) -> Result<(), BrokerError> {
        version::check_server(conn, form)
    }

    fn compile(&self, spec: &TableSpec) -> TableSql {
        sql::compile(spec)
    }

    fn create_table(&self, spec: &TableSpec) -> Vec<String> {
        sql::create_table(spec)
    }

    fn column_defs(&self, spec: &TableSpec) -> Vec<crate::schema::ColumnDef> {
        sql::column_defs(spec)
    }

    fn columns_query(&self) -> &'static str {
        sql::COLUMNS
    }

    fn index_names_query(&self) -> Option<&'static str> {
        Some(sql::INDEXES)
    }

    fn registry(&self) -> &'static crate::dialect::RegistrySql {
        &registry::REGISTRY
    }

    fn syntax(&self) -> &'static Syntax {
        &sql::SYNTAX
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
        protocol::lease_renew(conn, spec, token, held)
    }

    fn change_feed(&self) -> ChangeFeed {
        ChangeFeed::Watcher
    }

    fn watcher(&self) -> Result<Box<dyn Watcher>, DbError> {
        listen::open(&self.config, &self.tls)
    }

    fn announce(
        &self,
        conn: &mut dyn DbConn,
        sql: &TableSql,
        rows: usize,
        from: Option<u64>,
    ) -> Result<(), DbError> {
        match &sql.notify {
            Some(notify) => conn
                .execute(notify, &[Value::Text(listen::payload(rows, from))])
                .map(drop),
            None => Ok(()),
        }
    }

    fn announce_pause(&self, conn: &mut dyn DbConn, sql: &TableSql) -> Result<(), DbError> {
        match &sql.notify {
            Some(notify) => conn
                .execute(notify, &[Value::Text(listen::PAUSE.into())])
                .map(drop),
            None => Ok(()),
        }
    }

    fn lease_ack_many(
        &self,
        conn: &mut dyn DbConn,
        spec: &TableSpec,
        held: &[(i64, SystemTime)],
    ) -> Result<Vec<i64>, DbError> {
        protocol::lease_ack_many(conn, spec, held)
    }
}
