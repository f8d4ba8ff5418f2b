//! Live-server test harness: URLs from the environment, a loud skip (or a failure with
//! `SQLBROKER_REQUIRE_SERVERS=1`) when a server is not reachable, and tables of their own per
//! test so tests run in parallel.
//!
//! [`Live`] is what a test holds: a broker on one database, the tables the test made (dropped
//! when it goes out of scope: `DROP TABLE` on the servers, the database file on SQLite), and
//! direct SQL that bypasses the library (the `postgres` / `rusqlite` / `mysql` crates) so a test
//! can check the table itself.
#![allow(dead_code)]

use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use sqlbroker::{Broker, Delivery, Form, Message, Subscription, Table};

pub mod blackhole;
pub mod ledger;
pub mod server;
pub mod sessions;
pub mod takes;

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
    // Asked once per test process: a missing server then costs one connect timeout, not one
    // per test.
    static POSTGRES: OnceLock<Result<(), String>> = OnceLock::new();
    static MYSQL: OnceLock<Result<(), String>> = OnceLock::new();
    let reachable = if db == Db::Postgres {
        &POSTGRES
    } else {
        &MYSQL
    };
    let reachable = reachable.get_or_init(|| {
        let r = Broker::builder(&url)
            .connection_timeout(Duration::from_secs(5))
            .build();
        let r = r.map(drop).map_err(|e| e.to_string());
        if let Err(e) = &r {
            if !require_servers() {
                // Straight to the process's stderr: the test harness captures `eprintln!`.
                let _ = writeln!(
                    std::io::stderr(),
                    "\n!!!!! SKIPPED: every {db:?} test: {url} is not reachable ({e}); \
                     set {var} or start the server !!!!!\n"
                );
            }
        }
        r
    });
    match reachable {
        Ok(()) => Some(url),
        Err(e) if require_servers() => {
            panic!("SQLBROKER_REQUIRE_SERVERS=1 but {db:?} at {url} is not reachable: {e}")
        }
        Err(_) => None,
    }
}

/// A broker on `db`, or `None` when the test must be skipped. Prefer [`live`], which also drops
/// the test's tables.
pub fn broker(db: Db) -> Option<Broker> {
    url(db).map(|u| quiet_broker(&u))
}

/// A broker that does not run for the database's maintainer: a test that counts what a table
/// keeps must not see another test's broker prune it meanwhile. `tests/maintenance.rs` tests
/// the maintainer; the brokers other tests connect by themselves run for it, as by default.
pub fn quiet_broker(url: &str) -> Broker {
    Broker::builder(url)
        .maintenance(false)
        .build()
        .expect("connect")
}

/// A name no other test (or test process) uses.
pub fn unique(prefix: &str) -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!(
        "{prefix}_{}_{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed),
        nanos % 100_000
    )
}

/// The standard test table description: a text column `k`; lease tables get `lease`; advisory
/// tables lock `"<name>-{k}"`, a key no other test uses (keys belong to the database, so a
/// shared template would make parallel tests wait for each other).
pub fn describe(name: &str, form: Form, lease: Duration) -> Table {
    let t = Table::new(name).text_column("k");
    match form {
        Form::Lease => t.lease(lease),
        Form::AdvisoryLock => t.advisory_lock(format!("{name}-{{k}}")),
        _ => t,
    }
}

/// A table of `form` ([`describe`]) with a name of its own, created on `broker`. Not dropped at
/// the end: prefer [`Live::table`].
pub fn table(broker: &Broker, form: Form, lease: Duration) -> Table {
    let t = describe(&unique("t"), form, lease);
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

/// `t` rounded up to a whole second (the library's time rules, for exact lower bounds).
pub fn ceil_secs(t: SystemTime) -> SystemTime {
    let d = t.duration_since(UNIX_EPOCH).unwrap();
    UNIX_EPOCH + Duration::from_secs(d.as_secs() + u64::from(d.subsec_nanos() > 0))
}

/// One test's hold on a live database: a broker, the tables it made, and direct SQL.
/// Dropping it drops the tables (servers) or removes the database file (SQLite).
pub struct Live {
    pub db: Db,
    pub url: String,
    pub broker: Broker,
    tables: Mutex<Vec<String>>,
}

/// A [`Live`] on `db`, or `None` when the test must be skipped.
pub fn live(db: Db) -> Option<Live> {
    let url = url(db)?;
    let broker = quiet_broker(&url);
    Some(Live {
        db,
        url,
        broker,
        tables: Mutex::new(Vec::new()),
    })
}

impl Live {
    /// A table of `form` ([`describe`]) with a name of its own, created, dropped at the end.
    pub fn table(&self, form: Form, lease: Duration) -> Table {
        self.create(describe(&unique("t"), form, lease))
    }

    /// Creates `t` with the library and drops it at the end.
    pub fn create(&self, t: Table) -> Table {
        self.track(t.name());
        self.broker.create_table(&t).expect("create table");
        t
    }

    /// Creates `t` in `form` with its window slots' table dropped at the end: the advisory
    /// form's own key reads a column unique per message (`u`), so its one-row-per-key lock
    /// never stands in for a rate limit tested.
    pub fn create_in_form(&self, t: Table, form: Form) -> Table {
        let name = t.name().to_string();
        self.track(&format!("{name}_rates"));
        let t = match form {
            Form::Lease => t.lease(Duration::from_secs(30)),
            Form::AdvisoryLock => t.advisory_lock(format!("{name}-{{u}}")),
            _ => t,
        };
        self.create(t)
    }

    /// Drops the table `name` at the end (one created some other way).
    pub fn track(&self, name: &str) {
        self.tables.lock().unwrap().push(name.to_string());
    }

    /// Another broker on the same database, with a pool of its own (as another process would
    /// have).
    pub fn connect(&self) -> Broker {
        quiet_broker(&self.url)
    }

    /// Runs `sql` directly, bypassing the library.
    pub fn exec(&self, sql: &str) {
        exec(self.db, &self.url, sql)
    }

    /// Deletes the rows of the shared `sqlbroker_deps` that name table `name` (its jobs' waits
    /// and heads). Every test that waits shares that table, so two tests' deletes may
    /// deadlock on MySQL: one statement per index, tried again on a deadlock.
    pub fn forget_deps(&self, name: &str) {
        for column in ["parent_table", "child_table"] {
            let sql = format!("DELETE FROM sqlbroker_deps WHERE {column} = '{name}'");
            let mut tries = 0;
            while let Err(e) = try_exec(self.db, &self.url, &sql) {
                tries += 1;
                let deadlock = e.contains("1213") || e.contains("40P01") || e.contains("locked");
                assert!(deadlock && tries < 10, "{sql:?} failed: {e}");
                std::thread::sleep(Duration::from_millis(20 * tries));
            }
        }
    }

    /// The first column of every row `sql` returns, as integers, bypassing the library.
    pub fn ints(&self, sql: &str) -> Vec<Option<i64>> {
        ints(self.db, &self.url, sql)
    }

    /// The integer `sql` returns in its first row and column (`SELECT COUNT(*) ..`).
    pub fn int(&self, sql: &str) -> i64 {
        match self.ints(sql).first() {
            Some(Some(n)) => *n,
            other => panic!("{sql:?} returned {other:?}, not an integer"),
        }
    }

    /// Rows in the table (live, in work, and dead-lettered), counted directly.
    pub fn rows(&self, t: &Table) -> i64 {
        self.int(&format!("SELECT COUNT(*) FROM {}", t.name()))
    }

    /// Rows of the table matching `cond`, counted directly.
    pub fn rows_where(&self, t: &Table, cond: &str) -> i64 {
        self.int(&format!("SELECT COUNT(*) FROM {} WHERE {cond}", t.name()))
    }

    /// True if a table named exactly `name` exists in the test database.
    pub fn table_exists(&self, name: &str) -> bool {
        let lit = name.replace('\'', "''");
        let sql = match self.db {
            Db::Postgres => format!(
                "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = current_schema() AND table_name = '{lit}'"
            ),
            Db::Mysql => format!(
                "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = database() AND table_name = '{lit}'"
            ),
            Db::Sqlite => format!("SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = '{lit}'"),
        };
        self.int(&sql) > 0
    }

    /// Every table in the test database (on SQLite, the test's own file).
    pub fn table_count(&self) -> i64 {
        let sql = match self.db {
            Db::Postgres => "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = current_schema()",
            Db::Mysql => "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = database()",
            Db::Sqlite => "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table'",
        };
        self.int(sql)
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        let tables = std::mem::take(&mut *self.tables.lock().unwrap_or_else(|e| e.into_inner()));
        match self.db {
            Db::Sqlite => {
                if let Some(path) = self.url.strip_prefix("sqlite:") {
                    for suffix in ["", "-wal", "-shm"] {
                        let _ = std::fs::remove_file(format!("{path}{suffix}"));
                    }
                }
            }
            Db::Postgres | Db::Mysql => {
                for t in tables {
                    let sql = match self.db {
                        Db::Postgres => {
                            format!("SET lock_timeout = '10s'; DROP TABLE IF EXISTS \"{t}\"")
                        }
                        _ => format!(
                            "SET SESSION lock_wait_timeout = 10; DROP TABLE IF EXISTS `{t}`"
                        ),
                    };
                    if let Err(e) = try_exec(self.db, &self.url, &sql) {
                        eprintln!("warning: could not drop test table {t}: {e}");
                    }
                    // Its record in the shared registry (if the registry is there at all).
                    let record = format!("DELETE FROM sqlbroker_tables WHERE name = '{t}'");
                    let _ = try_exec(self.db, &self.url, &record);
                }
            }
        }
    }
}

/// A child process: this test binary re-executed to run the test `entry` alone, with `env`
/// set to `value`. Killed and reaped when dropped (should the parent's test fail first).
pub struct Child {
    pub process: std::process::Child,
    /// The child's stdout, line by line.
    pub lines: crossbeam_channel::Receiver<String>,
}

/// The `<kind>\t<table>\t<url>` a child process was started with (in `env`); `None` when
/// this process is not that child.
pub fn child_spec(env: &str) -> Option<(String, String, String)> {
    let spec = std::env::var(env).ok()?;
    let mut parts = spec.splitn(3, '\t').map(str::to_owned);
    Some((parts.next()?, parts.next()?, parts.next()?))
}

/// A crash test's child, if this process is one (`env` set to `<form>\t<table>\t<url>`):
/// claims one delivery of the table `describe` makes of the name and form, runs `work` on
/// it, prints `<marker> <id>` on a line of its own, and holds the delivery until it is killed.
pub fn hold_until_killed(
    env: &str,
    describe: impl Fn(&str, Form) -> Table,
    marker: &str,
    work: impl FnOnce(&Delivery),
) {
    let Some((form, name, url)) = child_spec(env) else {
        return;
    };
    let broker = Broker::connect(&url).expect("child: connect");
    let t = describe(&name, form_from(&form));
    let sub = broker.subscription(&t).start().expect("child: start");
    let d = next(&sub, Duration::from_secs(30));
    work(&d);
    let mut out = std::io::stdout();
    writeln!(out, "\n{marker} {}", d.id()).unwrap();
    out.flush().unwrap();
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
    std::process::exit(3);
}

/// A form's name as a child process reads it back ([`form_from`]).
pub fn form_name(form: Form) -> &'static str {
    match form {
        Form::RowLock => "row_lock",
        Form::Lease => "lease",
        _ => "advisory",
    }
}

/// The form [`form_name`] named.
pub fn form_from(name: &str) -> Form {
    match name {
        "row_lock" => Form::RowLock,
        "lease" => Form::Lease,
        "advisory" => Form::AdvisoryLock,
        other => panic!("unknown form {other:?}"),
    }
}

/// Starts [`Child`] `entry`; its stdin stays open (a child blocking on it holds on until it is
/// killed or the parent goes).
pub fn spawn_child(entry: &str, env: &str, value: &str) -> Child {
    use std::io::BufRead;
    use std::process::{Command, Stdio};
    let mut process = Command::new(std::env::current_exe().expect("current exe"))
        .args([entry, "--exact", "--nocapture", "--test-threads=1"])
        .env(env, value)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn the child");
    let stdout = process.stdout.take().expect("the child's stdout");
    let (tx, lines) = crossbeam_channel::unbounded();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    Child { process, lines }
}

/// Starts child `entry` with `env` set to `<form>\t<table>\t<url>` ([`child_spec`]), and
/// waits (a minute at most) for its `CHILD <pid>` line: another process than this one.
pub fn spawn_table_child(entry: &str, env: &str, form: Form, table: &str, url: &str) -> Child {
    let child = spawn_child(entry, env, &format!("{}\t{table}\t{url}", form_name(form)));
    let pid: u32 = child
        .line_after("CHILD ", Duration::from_secs(60))
        .expect("the child did not start")
        .trim()
        .parse()
        .unwrap();
    assert_ne!(pid, std::process::id(), "the child is this process");
    child
}

impl Child {
    /// The rest of the first line the child prints after `marker`, within `wait`.
    pub fn line_after(&self, marker: &str, wait: Duration) -> Option<String> {
        let deadline = Instant::now() + wait;
        while let Ok(line) = self.lines.recv_deadline(deadline) {
            if let Some(rest) = line.split(marker).nth(1) {
                return Some(rest.to_string());
            }
        }
        None
    }

    /// True while the process runs.
    pub fn alive(&mut self) -> bool {
        self.process.try_wait().expect("try_wait").is_none()
    }

    /// SIGKILLs the child and reaps it.
    pub fn kill(mut self) {
        self.process.kill().expect("kill the child");
        self.process.wait().expect("reap the child");
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

/// A broker on `live`'s server whose pool (two connections, 1 s checkout timeout) is held
/// whole by row lock deliveries, one per subscription (one subscription may not hold the whole
/// pool): any statement it tries fails with `BrokerError::Pool`, so a test sees that an
/// operation ran no SQL. Settle the deliveries to free it. Servers only.
pub fn held_pool(live: &Live) -> (Broker, Vec<(Subscription, Delivery)>) {
    let broker = Broker::builder(&live.url)
        .pool_size(2)
        .connection_timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    let held = hold_pool(live, &broker, 2);
    (broker, held)
}

/// Holds `n` of `broker`'s pooled connections, one row lock delivery each, on a table of
/// their own. Servers only.
pub fn hold_pool(live: &Live, broker: &Broker, n: usize) -> Vec<(Subscription, Delivery)> {
    let holder = live.create(Table::new(unique("hold")));
    let mut held = Vec::new();
    for _ in 0..n {
        broker
            .publish(&holder, Message::new(b"hold".to_vec()))
            .unwrap();
        let sub = broker
            .subscription(&holder)
            .max_in_flight(1)
            .start()
            .unwrap();
        let d = next(&sub, Duration::from_secs(10));
        held.push((sub, d));
    }
    held
}

/// Runs `sql` (one or more statements) directly on the database behind `url`.
pub fn exec(db: Db, url: &str, sql: &str) {
    if let Err(e) = try_exec(db, url, sql) {
        panic!("{sql:?} failed: {e}");
    }
}

pub fn try_exec(db: Db, url: &str, sql: &str) -> Result<(), String> {
    match db {
        #[cfg(feature = "postgres")]
        Db::Postgres => {
            let mut c =
                postgres::Client::connect(url, postgres::NoTls).map_err(|e| e.to_string())?;
            c.batch_execute(sql).map_err(|e| e.to_string())
        }
        #[cfg(feature = "mysql")]
        Db::Mysql => {
            use mysql::prelude::Queryable;
            let mut c = mysql::Conn::new(mysql::Opts::from_url(url).map_err(|e| e.to_string())?)
                .map_err(|e| e.to_string())?;
            c.query_drop(sql).map_err(|e| e.to_string())
        }
        #[cfg(feature = "sqlite")]
        Db::Sqlite => {
            let c = sqlite_conn(url)?;
            c.execute_batch(sql).map_err(|e| e.to_string())
        }
        #[allow(unreachable_patterns)]
        _ => Err(format!("{db:?} is not compiled in")),
    }
}

/// The first column of every row `sql` returns, as integers (NULL as `None`).
pub fn ints(db: Db, url: &str, sql: &str) -> Vec<Option<i64>> {
    match try_ints(db, url, sql) {
        Ok(v) => v,
        Err(e) => panic!("{sql:?} failed: {e}"),
    }
}

fn try_ints(db: Db, url: &str, sql: &str) -> Result<Vec<Option<i64>>, String> {
    match db {
        #[cfg(feature = "postgres")]
        Db::Postgres => {
            let mut c =
                postgres::Client::connect(url, postgres::NoTls).map_err(|e| e.to_string())?;
            let rows = c.query(sql, &[]).map_err(|e| e.to_string())?;
            rows.iter()
                .map(|r| {
                    r.try_get::<_, Option<i64>>(0)
                        .or_else(|_| r.try_get::<_, Option<i32>>(0).map(|v| v.map(i64::from)))
                        .or_else(|_| r.try_get::<_, Option<i16>>(0).map(|v| v.map(i64::from)))
                        .map_err(|e| e.to_string())
                })
                .collect()
        }
        #[cfg(feature = "mysql")]
        Db::Mysql => {
            use mysql::prelude::Queryable;
            let mut c = mysql::Conn::new(mysql::Opts::from_url(url).map_err(|e| e.to_string())?)
                .map_err(|e| e.to_string())?;
            c.query::<Option<i64>, _>(sql).map_err(|e| e.to_string())
        }
        #[cfg(feature = "sqlite")]
        Db::Sqlite => {
            let c = sqlite_conn(url)?;
            let mut st = c.prepare(sql).map_err(|e| e.to_string())?;
            let rows = st
                .query_map([], |r| r.get::<_, Option<i64>>(0))
                .map_err(|e| e.to_string())?;
            rows.map(|r| r.map_err(|e| e.to_string())).collect()
        }
        #[allow(unreachable_patterns)]
        _ => Err(format!("{db:?} is not compiled in")),
    }
}

#[cfg(feature = "sqlite")]
fn sqlite_conn(url: &str) -> Result<rusqlite::Connection, String> {
    let path = url.strip_prefix("sqlite:").ok_or("not a sqlite url")?;
    let c = rusqlite::Connection::open(path).map_err(|e| e.to_string())?;
    c.busy_timeout(Duration::from_secs(30))
        .map_err(|e| e.to_string())?;
    Ok(c)
}

/// Runs a test body for each database x form, named `<name>::<db>_<form>`. Unsupported pairs
/// (row lock on SQLite) are left out.
#[macro_export]
macro_rules! per_db_form {
    ($body:ident) => {
        mod $body {
            use super::*;
            #[test]
            fn sqlite_lease() {
                super::$body(common::Db::Sqlite, sqlbroker::Form::Lease)
            }
            #[test]
            fn sqlite_advisory() {
                super::$body(common::Db::Sqlite, sqlbroker::Form::AdvisoryLock)
            }
            #[test]
            fn postgres_row_lock() {
                super::$body(common::Db::Postgres, sqlbroker::Form::RowLock)
            }
            #[test]
            fn postgres_lease() {
                super::$body(common::Db::Postgres, sqlbroker::Form::Lease)
            }
            #[test]
            fn postgres_advisory() {
                super::$body(common::Db::Postgres, sqlbroker::Form::AdvisoryLock)
            }
            #[cfg(feature = "mysql")]
            #[test]
            fn mysql_row_lock() {
                super::$body(common::Db::Mysql, sqlbroker::Form::RowLock)
            }
            #[cfg(feature = "mysql")]
            #[test]
            fn mysql_lease() {
                super::$body(common::Db::Mysql, sqlbroker::Form::Lease)
            }
            #[cfg(feature = "mysql")]
            #[test]
            fn mysql_advisory() {
                super::$body(common::Db::Mysql, sqlbroker::Form::AdvisoryLock)
            }
        }
    };
}

/// The `postgres` and `mysql` tests of `per_server!` and `per_db!`, inside their module.
#[macro_export]
macro_rules! server_tests {
    ($body:ident) => {
        #[test]
        fn postgres() {
            super::$body(common::Db::Postgres)
        }
        #[cfg(feature = "mysql")]
        #[test]
        fn mysql() {
            super::$body(common::Db::Mysql)
        }
    };
}

/// Runs a test body for each server (PostgreSQL, MySQL), named `<name>::<db>`: for what only
/// a server has (the row lock form, sessions, a pool the application can hold).
#[macro_export]
macro_rules! per_server {
    ($body:ident) => {
        mod $body {
            use super::*;
            server_tests!($body);
        }
    };
}

/// Runs a test body for each database, named `<name>::<db>`.
#[macro_export]
macro_rules! per_db {
    ($body:ident) => {
        mod $body {
            use super::*;
            #[test]
            fn sqlite() {
                super::$body(common::Db::Sqlite)
            }
            server_tests!($body);
        }
    };
}

/// Runs a test body for each database x form that claims by row lock or lease (the forms of
/// FIFO groups and priorities), named `<name>::<db>_<form>`.
#[macro_export]
macro_rules! per_db_claim_form {
    ($body:ident) => {
        mod $body {
            use super::*;
            #[test]
            fn sqlite_lease() {
                super::$body(common::Db::Sqlite, sqlbroker::Form::Lease)
            }
            #[test]
            fn postgres_lease() {
                super::$body(common::Db::Postgres, sqlbroker::Form::Lease)
            }
            #[test]
            fn postgres_row_lock() {
                super::$body(common::Db::Postgres, sqlbroker::Form::RowLock)
            }
            #[cfg(feature = "mysql")]
            #[test]
            fn mysql_lease() {
                super::$body(common::Db::Mysql, sqlbroker::Form::Lease)
            }
            #[cfg(feature = "mysql")]
            #[test]
            fn mysql_row_lock() {
                super::$body(common::Db::Mysql, sqlbroker::Form::RowLock)
            }
        }
    };
}

/// A message with body `body` and the column `k` the tables here describe set to `k`.
pub fn msg(body: &str, k: &str) -> Message {
    Message::new(body.as_bytes().to_vec()).set("k", k)
}

/// The `k` column of a delivery (the advisory key's part of it).
pub fn key_of(d: &Delivery) -> String {
    d.get("k")
        .and_then(|v| v.as_str())
        .unwrap_or_default()
        .to_string()
}

/// The next delivery within `wait`, or a panic that says why none came.
pub fn next(sub: &Subscription, wait: Duration) -> Delivery {
    match sub.next_delivery_timeout(wait) {
        Ok(d) => d,
        Err(e) => panic!(
            "no delivery within {wait:?}: {e} (last error: {:?}, in flight {})",
            sub.last_error(),
            sub.in_flight()
        ),
    }
}

/// `url` with `params` (`name=value&..`) added to its query.
pub fn with_params(url: &str, params: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{params}")
}

/// A certificate file the TLS tests need, from `var` or its default path; `None` (after a loud
/// message) when it is missing and servers are not required.
pub fn cert_file(var: &str, default: &str) -> Option<String> {
    let path = std::env::var(var).unwrap_or_else(|_| default.to_string());
    if std::path::Path::new(&path).is_file() {
        return Some(path);
    }
    if require_servers() {
        panic!("SQLBROKER_REQUIRE_SERVERS=1 but {path} ({var}) is missing: run .ci/run once");
    }
    let _ = writeln!(
        std::io::stderr(),
        "\n!!!!! SKIPPED: {path} is missing; set {var} or run .ci/run once !!!!!\n"
    );
    None
}

/// Whether a slow suite runs (one that kills or restarts servers, or builds clusters of its
/// own: minutes each): with `SQLBROKER_SLOW_TESTS=1` or `SQLBROKER_REQUIRE_SERVERS=1`
/// (`.ci/run` sets it), so a plain `cargo test` stays short. Otherwise a loud skip naming
/// `what`; the caller then returns.
pub fn slow_suite(what: &str) -> bool {
    let on = |var: &str| std::env::var(var).is_ok_and(|v| v == "1");
    if on("SQLBROKER_SLOW_TESTS") || require_servers() {
        return true;
    }
    let _ = writeln!(
        std::io::stderr(),
        "\n!!!!! SKIPPED: {what}: a slow suite; set SQLBROKER_SLOW_TESTS=1 to run it \
         (.ci/run runs it) !!!!!\n"
    );
    false
}

/// A test's precondition that the machine does not meet (`what` says which): a failure with
/// `SQLBROKER_REQUIRE_SERVERS=1`, else a loud skip (the caller then returns).
pub fn unmet(what: &str) {
    if require_servers() {
        panic!("SQLBROKER_REQUIRE_SERVERS=1 but {what}");
    }
    let _ = writeln!(std::io::stderr(), "\n!!!!! SKIPPED: {what} !!!!!\n");
}

/// The root that verifies the PostgreSQL server's certificate: Debian's snakeoil certificate,
/// which the packaged server uses with `ssl = on` (CN and DNS name `localhost`).
pub fn pg_root_cert() -> Option<String> {
    cert_file(
        "SQLBROKER_PG_ROOT_CERT",
        "/etc/ssl/certs/ssl-cert-snakeoil.pem",
    )
}

/// The test CA that signed the MariaDB server's certificate (DNS name `localhost`), made by
/// `.ci/run`.
pub fn mysql_root_cert() -> Option<String> {
    cert_file(
        "SQLBROKER_MYSQL_ROOT_CERT",
        "/etc/mysql/sqlbroker-tls/ca.pem",
    )
}

/// A CA certificate no server uses (its key was thrown away): a wrong root.
pub fn other_ca() -> String {
    format!("{}/tests/tls/other-ca.pem", env!("CARGO_MANIFEST_DIR"))
}
