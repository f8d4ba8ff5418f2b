//! Live-server test harness: URLs from the environment, a loud skip (or a failure with
//! `SQLBROKER_REQUIRE_SERVERS=1`) when a server is not reachable, and tables of their own per
//! test so tests run in parallel.
#![allow(dead_code)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use sqlbroker::{Broker, Form, Table};

/// The databases a behaviour suite runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Db {
    Sqlite,
    Postgres,
    Mysql,
}

pub const PG_DEFAULT: &str = "postgres://postgres@127.0.0.1:5432/test";
pub const MYSQL_DEFAULT: &str = "mysql://root@127.0.0.1:3306/test";

fn require_servers() -> bool {
    std::env::var("SQLBROKER_REQUIRE_SERVERS").is_ok_and(|v| v == "1")
}

/// The URL of a live server, or `None` (after a loud message) when it is not reachable and
/// servers are not required. SQLite: a fresh database file of its own.
pub fn url(db: Db) -> Option<String> {
    let (var, default) = match db {
        Db::Sqlite => {
            let dir = std::env::temp_dir().join("sqlbroker-tests");
            std::fs::create_dir_all(&dir).expect("temp dir");
            let file = dir.join(format!("{}.db", unique("t")));
            return Some(format!("sqlite:{}", file.display()));
        }
        Db::Postgres => ("SQLBROKER_PG_URL", PG_DEFAULT),
        Db::Mysql => ("SQLBROKER_MYSQL_URL", MYSQL_DEFAULT),
    };
    let url = std::env::var(var).unwrap_or_else(|_| default.to_string());
    match Broker::builder(&url).connection_timeout(Duration::from_secs(5)).build() {
        Ok(_) => Some(url),
        Err(e) => {
            if require_servers() {
                panic!("SQLBROKER_REQUIRE_SERVERS=1 but {db:?} at {url} is not reachable: {e}");
            }
            eprintln!("\n!!!!! SKIPPED: {db:?} at {url} is not reachable ({e}); set {var} or start the server !!!!!\n");
            None
        }
    }
}

/// A broker on `db`, or `None` when the test must be skipped.
pub fn broker(db: Db) -> Option<Broker> {
    url(db).map(|u| Broker::connect(&u).expect("connect"))
}

/// A name no other test (or test process) uses.
pub fn unique(prefix: &str) -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
    format!("{prefix}_{}_{}_{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed), nanos % 100_000)
}

/// A table of `form` with a text column `k`, a name of its own, created on `broker`.
/// Lease tables get `lease`.
pub fn table(broker: &Broker, form: Form, lease: Duration) -> Table {
    let name = unique("t");
    let t = Table::new(name).text_column("k");
    let t = match form {
        Form::Lease => t.lease(lease),
        Form::AdvisoryLock => t.advisory_lock("key-{k}"),
        _ => t,
    };
    broker.create_table(&t).expect("create table");
    t
}

/// Waits for `cond` up to `timeout`; true if it held.
pub fn wait_for(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    cond()
}

/// Runs a test body for each database x form, named `<name>_<db>_<form>`. Unsupported pairs
/// (row lock on SQLite) are left out.
#[macro_export]
macro_rules! per_db_form {
    ($body:ident) => {
        mod $body {
            use super::*;
            #[test]
            fn sqlite_lease() { super::$body(common::Db::Sqlite, sqlbroker::Form::Lease) }
            #[test]
            fn sqlite_advisory() { super::$body(common::Db::Sqlite, sqlbroker::Form::AdvisoryLock) }
            #[test]
            fn postgres_row_lock() { super::$body(common::Db::Postgres, sqlbroker::Form::RowLock) }
            #[test]
            fn postgres_lease() { super::$body(common::Db::Postgres, sqlbroker::Form::Lease) }
            #[test]
            fn postgres_advisory() { super::$body(common::Db::Postgres, sqlbroker::Form::AdvisoryLock) }
            #[cfg(feature = "mysql")]
            #[test]
            fn mysql_row_lock() { super::$body(common::Db::Mysql, sqlbroker::Form::RowLock) }
            #[cfg(feature = "mysql")]
            #[test]
            fn mysql_lease() { super::$body(common::Db::Mysql, sqlbroker::Form::Lease) }
            #[cfg(feature = "mysql")]
            #[test]
            fn mysql_advisory() { super::$body(common::Db::Mysql, sqlbroker::Form::AdvisoryLock) }
        }
    };
}
