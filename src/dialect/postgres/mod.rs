//! PostgreSQL. All PostgreSQL SQL and `postgres` driver calls live here.
//!
//! - Row lock: `BEGIN ISOLATION LEVEL ..`, then `SELECT .. FOR UPDATE SKIP LOCKED`; the
//!   transaction stays open on the delivery's connection until it is settled.
//! - Lease claim: one statement, a CTE selecting `FOR UPDATE SKIP LOCKED` and an `UPDATE .. FROM`
//!   of the found rows, `RETURNING` them.
//! - Advisory: `pg_try_advisory_lock(hashtextextended(key, 0))`, session scope: the advisory form
//!   needs a direct connection or a session-mode pooler (a transaction-mode PgBouncer breaks it).
//! - Floors: 9.5 for `SKIP LOCKED`, 11 for `hashtextextended`.
//! - Statements are prepared once per connection and cached with it; behind a transaction
//!   pooler (`pool_mode=transaction` in the URL) they are sent unnamed instead (`conn.rs`).
//! - The URL may name several hosts (`target_session_attrs=read-write` picks the primary) and
//!   may be in the key-value form (`host=a,b port=1,2 ..`): the driver reads both.
//!
//! Files, one concern each (the MySQL and SQLite dialects are laid out alike):
//! - `mod.rs`: the engine ([`Postgres`]), its URL and session settings, and the [`Dialect`]
//!   impl, which delegates to the files below;
//! - `sql.rs`: the statement text of a table, built once;
//! - `protocol.rs`: the lease renewal, one statement over a variable number of leases;
//! - `listen.rs`: the change feed (`LISTEN` on a dedicated session) that wakes claimers when
//!   another broker publishes;
//! - `conn.rs`: one session ([`DbConn`]), its statement cache, how its settings reach a server
//!   behind a pooler, and the classification of driver errors;
//! - `deadline.rs`: the bound on every round trip (the driver has none), through the stream
//!   our connector wraps every TCP socket in, and the TLS negotiation that connector makes;
//! - `diesel.rs`: the application's Diesel `PgConnection` as a [`DbConn`], for
//!   publishing in its transaction (feature `diesel-postgres`);
//! - `live_tests.rs`: checks of the SQL against a live server (the claims' plans);
//! - `tls.rs`: the URL's `sslmode` and `sslrootcert`, and the rustls connector (feature `tls`);
//! - `values.rs`: [`Value`] to and from PostgreSQL's types;
//! - `version.rs`: the version floors of each form.

mod conn;
mod deadline;
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
use crate::model::table::{Form, TableSpec};
use crate::model::value::Value;

pub(crate) use conn::TxConn;

/// The engine with no server of its own: the SQL text and protocols, for publishing on the
/// application's own transactions.
pub(crate) fn sql_only() -> &'static dyn Dialect {
    static ENGINE: std::sync::OnceLock<Postgres> = std::sync::OnceLock::new();
    ENGINE.get_or_init(|| Postgres {
        config: postgres::Config::new(),
        tls: conn::Connector::Plain,
        setup: std::sync::Arc::new(conn::Setup::new(conn::Pooling::Session, "")),
        listen: None,
    })
}

/// The PostgreSQL engine for one server and database.
pub(super) struct Postgres {
    /// The URL's settings but its `options` (the session settings, in `setup`).
    config: postgres::Config,
    tls: conn::Connector,
    /// How sessions are set up: the pooling, and the settings to `SET` where the startup
    /// options are refused.
    setup: std::sync::Arc<conn::Setup>,
    /// The change feed's own server (`listen_url`), when not the URL's.
    listen: Option<(
        postgres::Config,
        conn::Connector,
        std::sync::Arc<conn::Setup>,
    )>,
}

/// The URL parameter naming the pooling between the broker and the server.
const POOL_MODE: &str = "pool_mode";

impl Postgres {
    /// The URL's settings, plus `lock_timeout` and `statement_timeout` in the startup options
    /// (no round trip) unless the URL's `options` set them. TLS as the URL's `sslmode` says
    /// (see `tls.rs`; default `prefer`, as libpq). `pool_mode=transaction` (a PgBouncer in
    /// transaction pooling) is read here: see `conn.rs`.
    pub(super) fn from_url(url: &str, opts: &ConnOptions) -> Result<Self, BrokerError> {
        let (mut config, tls, pooling, options) = parse(url, opts)?;
        let setup = conn::Setup::new(pooling, &options);
        let connector = conn::Connector::new(&tls, &mut config, opts.round_trip_timeout)?;
        let listen = match &opts.listen_url {
            Some(listen) => {
                let (mut config, tls, pooling, options) = parse(listen, opts)?;
                if pooling == conn::Pooling::Transaction {
                    return Err(BrokerError::InvalidOption {
                        option: "listen_url",
                        reason: "LISTEN needs a session of its own: give a direct URL (or one \
                                 through session pooling), not pool_mode=transaction"
                            .into(),
                    });
                }
                let setup = conn::Setup::new(pooling, &options);
                let connector = conn::Connector::new(&tls, &mut config, opts.round_trip_timeout)?;
                Some((config, connector, std::sync::Arc::new(setup)))
            }
            None if pooling == conn::Pooling::Transaction && opts.cross_process => {
                return Err(BrokerError::InvalidOption {
                    option: "listen_url",
                    reason: "pool_mode=transaction: the change feed's LISTEN needs a session, \
                             which transaction pooling does not keep; give a direct URL to the \
                             server with BrokerBuilder::listen_url, or turn the feed off with \
                             cross_process_wake(false) (other brokers' rows are then found at \
                             the poll interval)"
                        .into(),
                });
            }
            None => None,
        };
        Ok(Postgres {
            config,
            tls: connector,
            setup: std::sync::Arc::new(setup),
            listen,
        })
    }
}

/// One URL (`postgres://..` or the key-value form) as the driver's settings, its TLS
/// settings, its pooling, and the startup options: the URL's `options` with the broker's
/// session settings added (kept apart from the driver's settings, which cannot unset them,
/// for a session opened without them).
fn parse(
    url: &str,
    opts: &ConnOptions,
) -> Result<(postgres::Config, tls::Settings, conn::Pooling, String), BrokerError> {
    let (url, tls) = tls::from_url(url)?;
    let names = [POOL_MODE, "options"];
    let (url, taken) = if super::url::is_key_value(&url) {
        super::url::take_kv_params(&url, &names)
    } else {
        super::url::take_params(&url, &names)
    };
    let mut pooling = conn::Pooling::Session;
    let mut options = String::new();
    for (name, value) in taken {
        if name == "options" {
            options = value;
            continue;
        }
        pooling = match value.as_str() {
            "session" => conn::Pooling::Session,
            "transaction" => conn::Pooling::Transaction,
            other => {
                return Err(BrokerError::InvalidUrl {
                    reason: format!(
                        "unknown pool_mode {other:?}: expected session (a direct connection or \
                         session pooling) or transaction (PgBouncer's transaction pooling)"
                    ),
                })
            }
        };
    }
    let mut config = postgres::Config::from_str(&url).map_err(|e| BrokerError::InvalidUrl {
        reason: format!("{e}"),
    })?;
    if let Some(quoted) = config.get_options() {
        // The key-value form's quoted `options='..'`, which only the driver reads.
        options = quoted.to_string();
    }
    let ms = opts.statement_timeout.as_millis();
    for name in ["lock_timeout", "statement_timeout"] {
        if !options.contains(name) {
            options.push_str(&format!(" -c {name}={ms}"));
        }
    }
    let options = options.trim().to_string();
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(CONNECT_TIMEOUT);
    }
    // A dead peer (a host gone, a cable cut) is noticed in about a minute, not hours: an idle
    // session by keepalive probes, one with bytes unacknowledged by `TCP_USER_TIMEOUT`. A
    // server whose kernel still answers but which does not (a stopped process, a proxy in
    // front of a hung host) is caught by the bound on each round trip (`deadline.rs`).
    config.keepalives(true).keepalives_idle(KEEPALIVE_IDLE);
    if config.get_keepalives_interval().is_none() {
        config.keepalives_interval(KEEPALIVE_INTERVAL);
    }
    if config.get_keepalives_retries().is_none() {
        config.keepalives_retries(KEEPALIVE_RETRIES);
    }
    if config.get_tcp_user_timeout().is_none() {
        config.tcp_user_timeout(opts.round_trip_timeout);
    }
    Ok((config, tls, pooling, options))
}

/// Connect timeout unless the URL sets `connect_timeout`.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// TCP keepalive idle time.
const KEEPALIVE_IDLE: Duration = Duration::from_secs(30);
/// Between keepalive probes, unless the URL sets `keepalives_interval`.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
/// Unanswered probes before the peer is dead, unless the URL sets `keepalives_retries`.
const KEEPALIVE_RETRIES: u32 = 3;

impl Dialect for Postgres {
    fn database(&self) -> &'static str {
        "PostgreSQL"
    }

    fn cancel_statement(&self, session: u64) -> Option<String> {
        Some(sql::cancel(session))
    }

    fn slots_held(
        &self,
        conn: &mut dyn DbConn,
        prefixes: &[String],
        from: u32,
        to: u32,
    ) -> Result<Vec<u32>, DbError> {
        let range = (from, to);
        super::slots_held_in_runs(conn, prefixes, range, sql::slots_held, |p| p.to_string())
    }

    fn key_xact_lock(&self) -> Option<&'static str> {
        (self.setup.pooling() == conn::Pooling::Transaction).then_some(sql::KEY_XACT_LOCK)
    }

    fn connect(&self) -> Result<Box<dyn DbConn + Send>, DbError> {
        conn::connect(&self.config, &self.tls, &self.setup)
    }

    fn check_server(&self, conn: &mut dyn DbConn, form: Form) -> Result<(), BrokerError> {
        if form == Form::AdvisoryLock && self.setup.pooling() == conn::Pooling::Transaction {
            return Err(BrokerError::Unsupported {
                database: "PostgreSQL",
                what: "the advisory lock form through transaction pooling (pool_mode=transaction, \
                       or noticed)"
                    .into(),
                why: "its locks belong to a server session, which transaction pooling shares \
                      between clients: connect this broker directly or through session \
                      pooling, or use the lease or row lock form",
            });
        }
        version::check_server(conn, form)
    }

    fn compile(&self, spec: &TableSpec) -> TableSql {
        sql::compile(spec)
    }

    fn create_table(&self, spec: &TableSpec) -> Vec<String> {
        sql::create_table(spec)
    }

    fn column_defs(&self, spec: &TableSpec) -> Vec<crate::model::schema::ColumnDef> {
        sql::column_defs(spec)
    }

    fn columns_query(&self) -> &'static str {
        sql::COLUMNS
    }

    fn index_names_query(&self) -> Option<&'static str> {
        Some(sql::INDEXES)
    }

    fn deps(&self) -> Option<&'static crate::dialect::deps::DepsSql> {
        Some(sql::deps_sql())
    }
    fn registry(&self) -> &'static crate::dialect::RegistrySql {
        &registry::REGISTRY
    }

    fn action_log(&self) -> &'static crate::dialect::ActionLogSql {
        &registry::ACTION_LOG
    }

    fn fleet(&self) -> Option<&'static crate::dialect::FleetSql> {
        Some(&registry::FLEET)
    }

    fn maintainer(&self) -> Option<&'static crate::dialect::MaintainerSql> {
        Some(&registry::MAINTAINER)
    }

    fn periodics(&self) -> Option<&'static crate::dialect::PeriodicSql> {
        Some(&registry::PERIODICS)
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
        match &self.listen {
            Some((config, tls, setup)) => listen::open(config, tls, setup),
            None => listen::open(&self.config, &self.tls, &self.setup),
        }
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
        sql: &TableSql,
        held: &[(i64, SystemTime)],
    ) -> Result<Vec<i64>, DbError> {
        protocol::lease_ack_many(conn, spec, &sql.ack_many, held)
    }
}
