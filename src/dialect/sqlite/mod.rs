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
//!
//! Files, one concern each (the PostgreSQL and MySQL dialects are laid out alike):
//! - `mod.rs`: the engine ([`Sqlite`]), its URL, what the brokers of a process share per
//!   database file, and the [`Dialect`] impl, which delegates to the files below;
//! - `sql.rs`: the statement text of a table, built once;
//! - `protocol.rs`: the lease renewal, one statement over a variable number of leases;
//! - `probe.rs`: the change feed (`PRAGMA data_version` on a connection of its own) that wakes
//!   claimers when another broker or process commits;
//! - `conn.rs`: one connection ([`DbConn`]), the process's writer lock, and the classification
//!   of driver errors;
//! - `diesel.rs`: the application's Diesel `SqliteConnection` as a [`DbConn`], for
//!   publishing in its transaction (feature `diesel-sqlite`);
//! - `values.rs`: [`Value`](crate::Value) to and from SQLite's values;
//! - `version.rs`: the floor of the linked library.

mod conn;
#[cfg(feature = "diesel-sqlite")]
pub(crate) mod diesel;
mod probe;
mod protocol;
mod registry;
mod sql;
mod values;
mod version;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

use parking_lot::Mutex;

use super::shared::Syntax;
use super::{ChangeFeed, ConnOptions, DbConn, Dialect, TableSql, Watcher};
use crate::dialect::keys::KeyRegistry;
use crate::error::{BrokerError, DbError};
use crate::model::table::{Form, TableSpec};

pub(crate) use conn::TxConn;

/// The engine with no database of its own: the SQL text, for publishing on the application's
/// own transactions.
pub(crate) fn sql_only() -> &'static dyn Dialect {
    static ENGINE: std::sync::OnceLock<Sqlite> = std::sync::OnceLock::new();
    ENGINE.get_or_init(|| Sqlite {
        path: None,
        keys: Arc::default(),
        writer: Arc::default(),
        busy: Duration::from_secs(30),
        durable: true,
        opened: AtomicBool::new(true),
    })
}

/// The SQLite engine for one database file (or one in-memory database).
pub(super) struct Sqlite {
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
    pub(super) fn from_url(url: &str, opts: &ConnOptions) -> Result<Self, BrokerError> {
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
    /// One writer at a time within the process: held for a write statement outside a
    /// transaction, and from a `BEGIN IMMEDIATE` to the transaction's end. SQLite allows one
    /// writer anyway; waiting here instead of in SQLite's busy handler (which sleeps 1, 2, 5 ..
    /// ms for a lock held for microseconds) keeps a claim and a settlement that collide from
    /// costing milliseconds.
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

    fn connect(&self) -> Result<Box<dyn DbConn + Send>, DbError> {
        conn::connect(self)
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
                why: "SQLite has no row locks; its forms are lease and advisory lock: describe \
                      the table with Table::lease(..) (or Table::advisory_lock(..) for per-key \
                      order)",
            });
        }
        Ok(())
    }

    fn check_server(&self, _conn: &mut dyn DbConn, _form: Form) -> Result<(), BrokerError> {
        version::check_version()
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
        32_766
    }

    fn process_keys(&self) -> Option<Arc<KeyRegistry>> {
        Some(self.keys.clone())
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

    /// The busy timeout is a field of the connection: set for one claim without I/O.
    fn bounds_claim_waits(&self) -> bool {
        true
    }

    /// `PRAGMA data_version` changes with every commit to the file, this process's acks and
    /// claims included.
    fn wakes_on_every_commit(&self) -> bool {
        self.path.is_some()
    }

    fn change_feed(&self) -> ChangeFeed {
        // Nobody else can reach an in-memory database.
        match self.path {
            Some(_) => ChangeFeed::Watcher,
            None => ChangeFeed::Nothing,
        }
    }

    fn watcher(&self) -> Result<Box<dyn Watcher>, DbError> {
        match &self.path {
            Some(path) => probe::open(path, self.busy),
            None => Err(DbError::other("an in-memory database has no change feed")),
        }
    }

    /// The one writer's transaction: a commit (a sync of the log) is the cost.
    fn shared_acks_begin(&self) -> Option<&'static str> {
        Some("BEGIN IMMEDIATE")
    }

    fn groups_settlements(&self) -> bool {
        true
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

#[cfg(test)]
mod tests {
    use super::*;

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
