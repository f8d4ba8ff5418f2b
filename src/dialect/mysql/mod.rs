//! MySQL 8.0.17+ and MariaDB 10.6+. All MySQL-protocol SQL and `mysql` driver calls live here.
//!
//! - Row lock: `START TRANSACTION` at the session's READ COMMITTED, set once per connection (a
//!   table naming another level adds a `SET TRANSACTION`): a locking read then locks the rows
//!   it takes, not the gaps between them, so publishers never wait on a claim; then
//!   `SELECT .. FOR UPDATE SKIP LOCKED`; the transaction stays open on the delivery's connection.
//! - Lease claim: no `UPDATE .. RETURNING` (MySQL has none, MariaDB 10.x none for `UPDATE`), so
//!   one transaction at the claim isolation: a locking select `FOR UPDATE SKIP LOCKED` of the
//!   ready rows, one update of the found ids, commit ([`protocol::lease_claim`]).
//! - Lease renewal: a locking select of the held ids, one update of those still holding their
//!   token, commit; the ids kept are exactly those renewed ([`protocol::lease_renew`]).
//! - Advisory: `GET_LOCK(name, 0)` on `<database>.<key>`, a name over 64 characters replaced by
//!   its SHA-256 (lowercase hex). Locks belong to the session and end with it. MariaDB 10.11
//!   compares names byte for byte (measured: `Abc`, `abc` and `Abc ` are three locks); MySQL
//!   documents them as case-insensitive, so there keys differing only in case wait for each
//!   other (less parallel, never less exclusive).
//! - Text columns are `VARCHAR(255)` in a binary NO PAD collation (`utf8mb4_nopad_bin` on
//!   MariaDB, `utf8mb4_0900_bin` on MySQL 8.0.17+, told apart by the first session's
//!   `VERSION()`): dedup keys and group values compare byte for byte, as on PostgreSQL and
//!   SQLite, not by the default collation (case-insensitive, padding trailing spaces). The
//!   schema check refuses a dedup key or group column in another collation; `migrate`
//!   converts it (`ALTER TABLE .. MODIFY COLUMN`, which copies the table).
//! - Times are `DATETIME` in UTC, whole seconds, so a lease token compared by equality
//!   survives the column exactly. Sessions run with `time_zone = '+00:00'` so the column's
//!   `DEFAULT CURRENT_TIMESTAMP` is UTC too.
//! - Affected rows: connections set `CLIENT_FOUND_ROWS`, so an `UPDATE` reports the rows its
//!   `WHERE` matched, as PostgreSQL and SQLite do, not only those whose values changed. A fenced
//!   settlement that matched its row is then never mistaken for a lost lease, whatever it writes.
//! - MariaDB Galera: the broker's first session asks whether the server is a cluster node
//!   (`wsrep_on`, `wsrep_cluster_size`); there the forms whose guard is a node-local lock are
//!   refused unless one writer node is declared (`galera.rs`). Certification failures arrive
//!   as deadlocks (1213), a node not ready for queries answers 1047, and a commit on a node that
//!   left the primary component meanwhile fails with 1180 naming it: all transient.
//! - Floors: MySQL 8.0.17 (its first byte-exact NO PAD collation; `SKIP LOCKED` came in 8.0.1),
//!   MariaDB 10.6 (its first `SKIP LOCKED`), for every form.
//! - Statements are prepared once per connection and kept in the driver's per-connection cache.
//!   Statements over a variable number of ids round the count up to a power of two (padding with
//!   the last id), so few distinct texts reach the cache.
//!
//! Files, one concern each (the PostgreSQL and SQLite dialects are laid out alike):
//! - `mod.rs`: the engine ([`Mysql`]), its URL and session settings, and the [`Dialect`] impl,
//!   which delegates to the files below;
//! - `sql.rs`: the statement text of a table, built once, and the `GET_LOCK` names;
//! - `protocol.rs`: the lease claim, lease renewal and advisory take, each more than one
//!   statement;
//! - `conn.rs`: one session ([`DbConn`]) and the classification of driver errors;
//! - `diesel.rs`: the application's Diesel `MysqlConnection` as a [`DbConn`], for
//!   publishing in its transaction (feature `diesel-mysql`);
//! - `galera.rs`: Galera detection and the forms refused across its nodes;
//! - `tls.rs`: the URL's `ssl-mode` on top of the driver's own TLS options;
//! - `values.rs`: [`Value`]s to and from the driver's values (`DATETIME` in UTC);
//! - `version.rs`: the server's flavor and version, and the floors;
//! - `live_tests.rs`: checks against a live server.

mod conn;
#[cfg(feature = "diesel-mysql")]
pub(crate) mod diesel;
mod galera;
#[cfg(test)]
mod live_tests;
mod protocol;
mod registry;
mod sql;
mod tls;
mod values;
mod version;

use std::sync::OnceLock;
use std::time::{Duration, SystemTime};

use mysql::consts::CapabilityFlags;
use mysql::{Opts, OptsBuilder};

use super::shared::Syntax;
use super::{ConnOptions, DbConn, Dialect, TableSql};
use crate::error::{BrokerError, DbError};
use crate::model::table::{Form, TableSpec};
use crate::model::value::Value;

/// Prepared statements kept per connection: a table uses about a dozen, plus the insert and
/// id-list variants of each size class.
const STMT_CACHE: usize = 256;

/// Connect timeout unless the URL sets `tcp_connect_timeout_ms`: an unreachable host fails the
/// pool's checkout instead of hanging on the operating system's TCP timeout.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Idle time before the first TCP keepalive probe, unless the URL sets
/// `tcp_keepalive_time_ms`: a dead peer (a host gone, a cable cut) under an idle session is
/// noticed in about a minute, not hours.
const KEEPALIVE_IDLE_MS: u32 = 30_000;
/// Between keepalive probes, unless the URL sets `tcp_keepalive_probe_interval_secs`.
#[cfg(any(target_os = "linux", target_os = "macos"))]
const KEEPALIVE_INTERVAL_SECS: u32 = 10;
/// Unanswered probes before the peer is dead, unless the URL sets `tcp_keepalive_probe_count`.
#[cfg(any(target_os = "linux", target_os = "macos"))]
const KEEPALIVE_PROBES: u32 = 3;

pub(crate) use conn::TxConn;

/// True if the URL's query names `param` (a driver option the URL sets itself).
fn url_sets(url: &str, param: &str) -> bool {
    let query = url.split_once('?').map_or("", |(_, q)| q);
    query
        .split('&')
        .any(|pair| pair.split('=').next() == Some(param))
}

/// The engine with no server of its own: the SQL text and protocols, for publishing on the
/// application's own transactions.
pub(crate) fn sql_only() -> &'static dyn Dialect {
    static ENGINE: OnceLock<Mysql> = OnceLock::new();
    ENGINE.get_or_init(|| Mysql {
        opts: Opts::default(),
        plain: None,
        db: String::new(),
        collation: OnceLock::new(),
        single_writer: false,
        topology: OnceLock::new(),
    })
}

/// The engine with no server, for the printed schema ([`crate::operating::ddl`]): text in MariaDB's
/// byte-exact collation if `mariadb`, else MySQL 8's.
pub(crate) fn offline(mariadb: bool) -> &'static dyn Dialect {
    static MARIADB: OnceLock<Mysql> = OnceLock::new();
    if !mariadb {
        return sql_only();
    }
    MARIADB.get_or_init(|| Mysql {
        opts: Opts::default(),
        plain: None,
        db: String::new(),
        collation: OnceLock::from(version::BYTE_EXACT[0]),
        single_writer: false,
        topology: OnceLock::new(),
    })
}

/// The MySQL-protocol engine for one server and database.
pub(super) struct Mysql {
    opts: Opts,
    /// `ssl-mode=PREFERRED`: the plain-text options a session falls back to when it cannot
    /// be encrypted.
    plain: Option<Opts>,
    /// The URL's database: advisory lock names start with it, since `GET_LOCK` names are
    /// server-wide and keys belong to the database.
    db: String,
    /// The server's byte-exact text collation, learned from the first session's `VERSION()`
    /// (every DDL runs after a session was opened): MySQL and MariaDB spell it differently.
    collation: OnceLock<&'static str>,
    /// Every broker writes through one node ([`ConnOptions::galera_single_writer`]).
    single_writer: bool,
    /// A single server or a Galera node, learned from the broker's first session.
    topology: OnceLock<galera::Topology>,
}

impl Mysql {
    /// `mysql://user:pass@host:3306/db?opts` (the driver's URL options apply); `mariadb://` is
    /// read as `mysql://`.
    /// Every session runs in UTC with `lock_wait_timeout` (metadata locks, which DDL takes;
    /// default a year) and `innodb_lock_wait_timeout` set to the statement timeout, and the
    /// socket's read and write timeouts at the round trip timeout (longer), so a server that
    /// stops answering fails the statement instead of hanging it; TCP keepalive and
    /// `TCP_USER_TIMEOUT` notice a dead peer. TLS from the driver's URL options and `ssl-mode`
    /// (see `tls.rs`).
    pub(super) fn from_url(url: &str, conn: &ConnOptions) -> Result<Self, BrokerError> {
        let normalized = match url.split_once("://") {
            Some((scheme, rest))
                if scheme.eq_ignore_ascii_case("mariadb")
                    || scheme.eq_ignore_ascii_case("mysql") =>
            {
                format!("mysql://{rest}")
            }
            _ => url.to_string(),
        };
        let (normalized, ssl_mode) = tls::from_url(&normalized)?;
        let opts = Opts::from_url(&normalized).map_err(|e| BrokerError::InvalidUrl {
            reason: format!("{e}"),
        })?;
        let ssl = opts.get_ssl_opts().cloned();
        let db = opts.get_db_name().unwrap_or_default().to_string();
        let secs = conn.statement_timeout.as_secs().max(1);
        let mut builder = OptsBuilder::from_opts(opts)
            .additional_capabilities(CapabilityFlags::CLIENT_FOUND_ROWS)
            .init(vec![
                format!(
                    "SET time_zone = '+00:00', lock_wait_timeout = {secs}, innodb_lock_wait_timeout = {secs}"
                ),
                sql::SESSION_ISOLATION.to_string(),
            ]);
        // The driver's socket timeouts bound each read and write: a round trip that has its
        // answer's first bytes within the bound is not cut short.
        let socket = Some(conn.round_trip_timeout);
        let ms = |d: Duration| u32::try_from(d.as_millis()).unwrap_or(u32::MAX);
        if !url_sets(&normalized, "tcp_keepalive_time_ms") {
            builder = builder.tcp_keepalive_time_ms(Some(KEEPALIVE_IDLE_MS));
        }
        #[cfg(any(target_os = "linux", target_os = "macos"))]
        {
            if !url_sets(&normalized, "tcp_keepalive_probe_interval_secs") {
                builder = builder.tcp_keepalive_probe_interval_secs(Some(KEEPALIVE_INTERVAL_SECS));
            }
            if !url_sets(&normalized, "tcp_keepalive_probe_count") {
                builder = builder.tcp_keepalive_probe_count(Some(KEEPALIVE_PROBES));
            }
        }
        #[cfg(target_os = "linux")]
        if !url_sets(&normalized, "tcp_user_timeout_ms") {
            builder = builder.tcp_user_timeout_ms(Some(ms(conn.round_trip_timeout)));
        }
        #[cfg(not(target_os = "linux"))]
        let _ = ms;
        if !normalized.contains("read_timeout=") {
            builder = builder.read_timeout(socket);
        }
        if !normalized.contains("write_timeout=") {
            builder = builder.write_timeout(socket);
        }
        if !normalized.contains("stmt_cache_size=") {
            builder = builder.stmt_cache_size(STMT_CACHE);
        }
        if !normalized.contains("tcp_connect_timeout_ms=") {
            builder = builder.tcp_connect_timeout(Some(CONNECT_TIMEOUT));
        }
        let tls = tls::apply(builder, ssl.as_ref(), ssl_mode, &normalized)?;
        Ok(Mysql {
            opts: tls.builder.into(),
            plain: tls.fallback.map(Into::into),
            db,
            collation: OnceLock::new(),
            single_writer: conn.galera_single_writer,
            topology: OnceLock::new(),
        })
    }
}

impl Mysql {
    /// The byte-exact text collation of the server; MySQL's spelling until a session has told
    /// the flavor (DDL always runs after one has).
    fn text_collation(&self) -> &'static str {
        self.collation
            .get()
            .copied()
            .unwrap_or(version::BYTE_EXACT[1])
    }
}

impl Dialect for Mysql {
    fn database(&self) -> &'static str {
        "MySQL"
    }

    fn server_name(&self) -> &'static str {
        // The collation is learned from the first session's `VERSION()`: MariaDB's is its own.
        match self.collation.get() {
            Some(c) if *c == version::BYTE_EXACT[0] => "MariaDB",
            _ => "MySQL",
        }
    }

    fn cancel_statement(&self, session: u64) -> Option<String> {
        Some(sql::cancel(session))
    }

    fn connect(&self) -> Result<Box<dyn DbConn + Send>, DbError> {
        #[cfg(feature = "tls")]
        if self.opts.get_ssl_opts().is_some() {
            tls::install_provider();
        }
        let (conn, version) = match (conn::connect(&self.opts), &self.plain) {
            // `PREFERRED`: a session that cannot be encrypted is made in plain text.
            (Err(e), Some(plain)) if conn::is_tls_failure(&e) => {
                log::info!("MySQL: no TLS session ({e}); ssl-mode=PREFERRED goes on without TLS");
                conn::connect(plain)
            }
            (r, _) => r,
        }?;
        self.collation
            .get_or_init(|| version::text_collation(&version));
        Ok(conn)
    }

    fn check_server(&self, conn: &mut dyn DbConn, form: Form) -> Result<(), BrokerError> {
        version::check_server(conn, form)
    }

    fn inspect(&self, conn: &mut dyn DbConn) -> Result<(), DbError> {
        let found = galera::probe(conn)?;
        if let galera::Topology::Galera { nodes } = found {
            log::info!(
                "MariaDB Galera cluster of {nodes} nodes (single writer declared: {})",
                self.single_writer
            );
        }
        self.topology.get_or_init(|| found);
        Ok(())
    }

    fn check_cluster(&self, spec: &TableSpec) -> Result<(), BrokerError> {
        let topology = self
            .topology
            .get()
            .copied()
            .unwrap_or(galera::Topology::Single);
        match galera::refusal(topology, self.single_writer, spec) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn compile(&self, spec: &TableSpec) -> TableSql {
        sql::compile(spec)
    }

    fn create_table(&self, spec: &TableSpec) -> Vec<String> {
        sql::create_table(spec, self.text_collation())
    }

    fn column_defs(&self, spec: &TableSpec) -> Vec<crate::model::schema::ColumnDef> {
        sql::column_defs(spec, self.text_collation())
    }

    fn convert_columns(
        &self,
        spec: &TableSpec,
        defs: &[&crate::model::schema::ColumnDef],
    ) -> Option<String> {
        Some(sql::convert_columns(spec, defs))
    }

    fn columns_query(&self) -> &'static str {
        sql::COLUMNS
    }

    fn index_names_query(&self) -> Option<&'static str> {
        Some(sql::INDEXES)
    }

    /// MySQL has no `CREATE INDEX IF NOT EXISTS` (MySQL 8): only the missing ones are made,
    /// each with `ALTER TABLE .. ADD INDEX`. Index names compare without case, as MySQL does.
    fn missing_indexes(&self, spec: &TableSpec, have: &[String]) -> Vec<String> {
        sql::index_defs(spec)
            .into_iter()
            .filter(|(name, _)| !have.iter().any(|h| h.eq_ignore_ascii_case(name)))
            .map(|(_, definition)| sql::add_index(spec, &definition))
            .collect()
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

    /// One `ALTER TABLE`: the index is dropped and added again with the table's claim order.
    fn rebuild_ready_index(&self, spec: &TableSpec) -> Vec<String> {
        vec![sql::rebuild_ready_index(spec)]
    }

    fn syntax(&self) -> &'static Syntax {
        &sql::SYNTAX
    }

    fn max_params(&self) -> usize {
        65_535
    }

    fn lease_claim(
        &self,
        conn: &mut dyn DbConn,
        sql: &TableSql,
        now: SystemTime,
        limit: usize,
        token: SystemTime,
        after: Option<(SystemTime, i64)>,
    ) -> Result<Vec<Vec<Value>>, DbError> {
        match &sql.fifo {
            Some(fifo) => protocol::fifo_lease_claim(conn, sql, fifo, now, limit, token),
            None => protocol::lease_claim(conn, sql, now, limit, token, after),
        }
    }

    /// No `ON CONFLICT` here: one insert per row; a row whose key an unfinished row holds
    /// fails with a duplicate-key error (1062), which rolls back that statement only.
    fn insert_dedup(
        &self,
        conn: &mut dyn DbConn,
        sql: &TableSql,
        spec: &TableSpec,
        rows: usize,
        params: &[Value],
    ) -> Result<Vec<i64>, DbError> {
        let width = spec.insert_width();
        let mut made = Vec::with_capacity(rows);
        for row in params.chunks(width).take(rows) {
            match conn.execute(&sql.insert_one, row) {
                Ok(_) => made.extend(conn.last_insert_id()),
                Err(e) if conn::is_duplicate_key(&e) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(made)
    }

    fn row_lock_claim(
        &self,
        conn: &mut dyn DbConn,
        sql: &TableSql,
        now: SystemTime,
        after: Option<(SystemTime, i64)>,
    ) -> Result<Option<Vec<Value>>, DbError> {
        match (&sql.fifo, &sql.claim_from, after) {
            (Some(fifo), _, _) => protocol::fifo_row_lock_claim(conn, sql, fifo, now),
            (None, Some(from), Some((run_at, id))) => {
                let params = [
                    Value::Time(now),
                    Value::Time(run_at),
                    Value::Time(run_at),
                    Value::Int(id),
                    Value::Int(1),
                ];
                Ok(conn.query(from, &params)?.into_iter().next())
            }
            _ => crate::dialect::claim_one_row(conn, sql, now),
        }
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

    fn lease_ack_many(
        &self,
        conn: &mut dyn DbConn,
        spec: &TableSpec,
        sql: &TableSql,
        held: &[(i64, SystemTime)],
    ) -> Result<Vec<i64>, DbError> {
        protocol::lease_ack_many(conn, spec, &sql.ack_many, held)
    }

    fn advisory_take(
        &self,
        conn: &mut dyn DbConn,
        sql: &TableSql,
        now: SystemTime,
        id: i64,
        group: Option<&Value>,
    ) -> Result<Option<Vec<Value>>, DbError> {
        protocol::advisory_take(conn, sql, now, id, group)
    }

    fn key_name(&self, key: &str) -> String {
        sql::lock_name(&self.db, key)
    }

    fn slots_held(
        &self,
        conn: &mut dyn DbConn,
        prefixes: &[String],
        from: u32,
        to: u32,
    ) -> Result<Vec<u32>, DbError> {
        super::slots_held_in_runs(conn, prefixes, (from, to), sql::slots_held, |p| {
            format!("{}.{p}", self.db)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let d = Mysql::from_url(
            "mariadb://root@127.0.0.1:3306/test",
            &crate::dialect::test_options(),
        )
        .unwrap();
        assert_eq!(d.db, "test");
        assert_eq!(d.opts.get_stmt_cache_size(), STMT_CACHE);
        assert!(d
            .opts
            .get_additional_capabilities()
            .contains(CapabilityFlags::CLIENT_FOUND_ROWS));
        let d = Mysql::from_url(
            "mysql://root@h/q?stmt_cache_size=7",
            &crate::dialect::test_options(),
        )
        .unwrap();
        assert_eq!(d.opts.get_stmt_cache_size(), 7);
        assert!(matches!(
            Mysql::from_url("mysql://", &crate::dialect::test_options()),
            Err(BrokerError::InvalidUrl { .. })
        ));
    }
}
