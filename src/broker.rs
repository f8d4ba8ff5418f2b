//! The broker: one database, its connection pool, and the tables used through it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use parking_lot::Mutex;

use crate::dialect::{self, ConnOptions, DbConn, Dialect};
use crate::error::{BrokerError, Result};
use crate::message::Message;
use crate::publish::{self, Within};
use crate::runtime::listen::Listener;
use crate::runtime::notifier::Notifier;
use crate::runtime::renewer::Renewer;
use crate::runtime::wake::Wake;
use crate::runtime::{pool, Pool, Queue};
use crate::subscription::SubscriptionBuilder;
use crate::table::Table;
use crate::Value;

/// A handle on one database: a pool of blocking connections, publishing, subscriptions.
/// Cheap to clone; clones share the pool.
///
/// ```
/// use sqlbroker::{Broker, Message, Table};
/// use std::time::Duration;
///
/// let broker = Broker::connect("sqlite::memory:")?;
/// let jobs = Table::new("jobs").text_column("kind").lease(Duration::from_secs(30));
/// broker.create_table(&jobs)?;
/// broker.publish(&jobs, Message::new(b"hello".to_vec()).set("kind", "greeting"))?;
///
/// let sub = broker.subscription(&jobs).workers(2).start()?;
/// let d = sub.next_delivery().expect("one job");
/// assert_eq!(d.payload(), b"hello");
/// assert_eq!(d.attempt(), 1);
/// assert_eq!(d.get("kind").and_then(|v| v.as_str()), Some("greeting"));
/// d.ack()?;
/// sub.shutdown(Duration::from_secs(1))?;
/// # Ok::<(), sqlbroker::BrokerError>(())
/// ```
#[derive(Clone)]
pub struct Broker {
    inner: Arc<Inner>,
}

struct Inner {
    dialect: Arc<dyn Dialect>,
    pool: Pool,
    queues: Mutex<HashMap<Table, Arc<Queue>>>,
    wakes: Mutex<HashMap<String, Arc<Wake>>>,
    renewer: Arc<Renewer>,
    /// The change feed, where the database has one (started with the first subscription).
    listener: Option<Arc<Listener>>,
    /// Sends the publishes' notifications after their commits (PostgreSQL), naming this
    /// broker in them (its own listener skips them).
    notifier: Notifier,
    /// Publishes notify other brokers ([`BrokerBuilder::cross_process_wake`]).
    cross_process: bool,
    statement_timeout: Duration,
    /// `create_table` and `migrate` run DDL ([`BrokerBuilder::manage_schema`]).
    manage_schema: bool,
}

/// Options of a [`Broker`]; [`BrokerBuilder::build`] connects.
///
/// ```
/// use std::time::Duration;
///
/// let broker = sqlbroker::Broker::builder("sqlite::memory:")
///     .connection_timeout(Duration::from_secs(5))
///     .statement_timeout(Duration::from_secs(10))
///     .build()?;
/// # Ok::<(), sqlbroker::BrokerError>(())
/// ```
#[must_use = "a broker builder does nothing until it is built"]
pub struct BrokerBuilder {
    url: String,
    pool_size: u32,
    connection_timeout: Duration,
    options: ConnOptions,
    cross_process: bool,
    manage_schema: bool,
}

impl std::fmt::Debug for BrokerBuilder {
    /// The URL without its password.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BrokerBuilder")
            .field("url", &redact(&self.url))
            .field("pool_size", &self.pool_size)
            .field("connection_timeout", &self.connection_timeout)
            .field("statement_timeout", &self.options.statement_timeout)
            .field("sqlite_durable", &self.options.sqlite_durable)
            .field("galera_single_writer", &self.options.galera_single_writer)
            .field("cross_process_wake", &self.cross_process)
            .field("manage_schema", &self.manage_schema)
            .field(
                "listen_url",
                &self.options.listen_url.as_deref().map(redact),
            )
            .finish()
    }
}

/// `url` with the password of its user info (`user:password@`) replaced by `***`.
fn redact(url: &str) -> String {
    let (head, query) = match url.split_once('?') {
        Some((head, query)) => (head, Some(query)),
        None => (url, None),
    };
    let mut out = match head.split_once("://") {
        Some((scheme, rest)) => {
            let authority_end = rest.find('/').unwrap_or(rest.len());
            match rest[..authority_end].rfind('@') {
                Some(at) => match rest[..at].split_once(':') {
                    Some((user, _)) => format!("{scheme}://{user}:***{}", &rest[at..]),
                    None => head.to_string(),
                },
                None => head.to_string(),
            }
        }
        None => head.to_string(),
    };
    // A password may come as a parameter too (`?password=..`, as libpq reads it).
    if let Some(query) = query {
        let pairs: Vec<String> = query
            .split('&')
            .map(|pair| match pair.split_once('=') {
                Some((key, _)) if key.eq_ignore_ascii_case("password") => format!("{key}=***"),
                _ => pair.to_string(),
            })
            .collect();
        out.push('?');
        out.push_str(&pairs.join("&"));
    }
    out
}

impl BrokerBuilder {
    /// Every option in its range: a zero would panic in the pool (a zero timeout) or leave
    /// nothing to work with (no connection), and a huge one overflows a deadline.
    fn check(&self) -> Result<()> {
        let day = Duration::from_secs(86_400);
        let invalid = |option, reason: &str| {
            Err(BrokerError::InvalidOption {
                option,
                reason: reason.into(),
            })
        };
        if !(1..=10_000).contains(&self.pool_size) {
            return invalid("pool_size", "from 1 to 10,000 connections");
        }
        if !(Duration::from_millis(1)..=day).contains(&self.connection_timeout) {
            return invalid("connection_timeout", "from 1 ms to a day");
        }
        if !(Duration::from_secs(1)..=day).contains(&self.options.statement_timeout) {
            return invalid(
                "statement_timeout",
                "from 1 s (the servers count whole seconds) to a day",
            );
        }
        Ok(())
    }

    /// Most pooled connections. Default 16; from 1 to 10,000. A row lock delivery, and an
    /// advisory delivery on a server, holds a connection until it is settled; each claim
    /// worker needs one while it claims. An in-memory SQLite database always has exactly one.
    pub fn pool_size(mut self, n: u32) -> Self {
        self.pool_size = n;
        self
    }

    /// How long an operation waits for a pooled connection before it fails with
    /// [`BrokerError::Pool`]. Default 30 s; from 1 ms to a day.
    pub fn connection_timeout(mut self, d: Duration) -> Self {
        self.connection_timeout = d;
        self
    }

    /// The longest one statement may wait on the database, lock waits included. Default 30 s,
    /// from 1 s to a day. Every wait is bounded by it: PostgreSQL sessions run with
    /// `lock_timeout` and `statement_timeout` (unless the URL's `options` set them), sent at
    /// connect, or `SET` after connecting where a pooler refuses or drops them, or `SET LOCAL`
    /// in each transaction with `pool_mode=transaction`; MySQL and
    /// MariaDB sessions with `lock_wait_timeout` and `innodb_lock_wait_timeout`, and their
    /// sockets time out 10 s later; SQLite waits this long for the write lock.
    /// [`Subscription::close`](crate::Subscription::close) and
    /// [`shutdown`](crate::Subscription::shutdown) wait for a claim in progress at most this
    /// long.
    ///
    /// The row lock form runs no statement while its handler works, so the timeout does not
    /// limit the handler; a DDL waiting on a table whose rows a handler holds is what it ends.
    pub fn statement_timeout(mut self, d: Duration) -> Self {
        self.options.statement_timeout = d;
        self
    }

    /// Whether this broker's publishes wake subscriptions of other brokers and processes at
    /// once, and its subscriptions are woken by theirs. Default true: PostgreSQL sends a
    /// `pg_notify` after each publish's commit from a thread of its own (the publish does not
    /// wait for it; at most one a millisecond) and listens on a session of its own; SQLite
    /// probes `data_version`. False, for a process whose publishers and subscribers share this
    /// broker: no notification, no listener; its own subscriptions are still woken in the
    /// process, and rows from elsewhere are found at the poll interval.
    pub fn cross_process_wake(mut self, on: bool) -> Self {
        self.cross_process = on;
        self.options.cross_process = on;
        self
    }

    /// PostgreSQL only: where the change feed's `LISTEN` session connects, when the broker's
    /// URL goes through a pooler that has no sessions to listen on (a PgBouncer in transaction
    /// pooling, `pool_mode=transaction` in the URL): a direct URL to the same database, for
    /// one long-lived session. Default: the broker's URL. The publishes still notify through
    /// the broker's URL (a notification is delivered at commit, whatever the pooling).
    pub fn listen_url(mut self, url: &str) -> Self {
        self.options.listen_url = Some(url.to_string());
        self
    }

    /// Whether this broker makes and migrates tables (default true), or leaves the schema to
    /// the application's migration tool and runs no DDL at all (false): for a database user
    /// without DDL rights, or a schema kept under migrations.
    ///
    /// With false, [`Broker::create_table`] and [`Broker::migrate`] are refused with
    /// [`BrokerError::DdlRefused`] before anything is sent; apply the statements of
    /// [`Table::ddl`] (or `sqlbroker schema`) instead, and of [`Broker::migration_sql`] for a
    /// change. Every other use of a table checks it once per description, as always against
    /// its record in `sqlbroker_tables` (which those statements write) and also against its
    /// columns ([`BrokerError::Schema`] names what is missing). Nothing else the library does
    /// runs DDL: publishes, claims, settlements, pause and resume (an `UPDATE` of the
    /// registry row), and the PostgreSQL wake-ups (`pg_notify` and `LISTEN`, no trigger) are
    /// plain statements; SQLite's `PRAGMA`s set the connection, not the schema.
    ///
    /// ```
    /// use sqlbroker::{Broker, BrokerError, Database, Message, Table};
    /// use std::time::Duration;
    ///
    /// let file = std::env::temp_dir().join(format!("sqlbroker-ddl-doc-{}.db", std::process::id()));
    /// let url = format!("sqlite:{}", file.display());
    /// let jobs = Table::new("jobs").lease(Duration::from_secs(30));
    /// // The migration tool's part (here by hand), as a user that may run DDL:
    /// let migrations = jobs.ddl(Database::Sqlite)?.join(";\n");
    /// rusqlite::Connection::open(&file).unwrap().execute_batch(&migrations).unwrap();
    ///
    /// // The service's part:
    /// let broker = Broker::builder(&url).manage_schema(false).build()?;
    /// assert!(matches!(broker.create_table(&jobs), Err(BrokerError::DdlRefused { .. })));
    /// broker.publish(&jobs, Message::new(b"hi".to_vec()))?;
    /// # drop(broker);
    /// # let _ = std::fs::remove_file(&file);
    /// # Ok::<(), sqlbroker::BrokerError>(())
    /// ```
    pub fn manage_schema(mut self, on: bool) -> Self {
        self.manage_schema = on;
        self
    }

    /// SQLite only: whether a commit is durable on power loss (`PRAGMA synchronous = FULL`,
    /// the default) or only on a crash of the process (`NORMAL`: faster commits in WAL mode;
    /// the database is never corrupted, but the last commits before a power cut may be lost,
    /// and a publish that returned may vanish).
    pub fn sqlite_durable(mut self, durable: bool) -> Self {
        self.options.sqlite_durable = durable;
        self
    }

    /// MariaDB Galera only: declares that every broker using this cluster (in every process)
    /// sends its statements through one node, for instance a proxy's single-writer routing
    /// or one node's address in every URL. Default false.
    ///
    /// At [`build`](BrokerBuilder::build) the broker asks a MySQL-protocol server whether it
    /// is a Galera node (`wsrep_on`, `wsrep_cluster_size`). On a cluster, certification makes
    /// two claims of one row on two nodes conflict at commit (the loser is rolled back with a
    /// deadlock error and retried), so the lease form holds across nodes. Locks do not
    /// replicate: a row lock, a `FOR UPDATE NOWAIT` group guard and a `GET_LOCK` key hold only
    /// on the node that took them. So, unless this is declared, starting a subscription in
    /// the row lock form, the advisory lock form or with [`Table::fifo`] groups fails with
    /// [`BrokerError::ClusterUnsafe`]. Declare it only if it is true: brokers writing through
    /// different nodes would then run one row, one key or one group twice at once. If the
    /// writer node fails, point the brokers at another node only once the old one's sessions
    /// are gone (it is down or out of the cluster), as with any failover. Elsewhere (a single
    /// server, PostgreSQL, SQLite) it changes nothing.
    ///
    /// ```no_run
    /// let broker = sqlbroker::Broker::builder("mysql://app:pw@galera-writer.example.com/jobs")
    ///     .galera_single_writer(true)
    ///     .build()?;
    /// # Ok::<(), sqlbroker::BrokerError>(())
    /// ```
    pub fn galera_single_writer(mut self, declared: bool) -> Self {
        self.options.galera_single_writer = declared;
        self
    }

    /// Parses the URL, opens one connection to prove the database is there, and builds the
    /// pool around it.
    ///
    /// The first connection is made once, not retried: a server that refuses it (a password,
    /// an unknown database), a TLS handshake that fails (a certificate that does not verify)
    /// or a server that cannot be reached returns [`BrokerError::Connect`] at once with the
    /// server's or the TLS library's reason, rather than after the pool's
    /// [`connection_timeout`](BrokerBuilder::connection_timeout). Its
    /// [`is_transient`](BrokerError::is_transient) tells whether trying again may help.
    ///
    /// # Errors
    ///
    /// [`BrokerError::InvalidOption`] for an option out of its range and
    /// [`BrokerError::InvalidUrl`] for a URL we do not understand (nothing is connected then),
    /// [`BrokerError::Connect`] when the first connection fails.
    pub fn build(self) -> Result<Broker> {
        self.check()?;
        let dialect = dialect::open(&self.url, &self.options)?;
        let size = dialect
            .max_pool_size()
            .map_or(self.pool_size, |cap| cap.min(self.pool_size));
        let mut first = dialect.connect().map_err(|e| BrokerError::Connect {
            database: dialect.database(),
            kind: e.kind,
            source: e.source,
        })?;
        dialect
            .inspect(&mut *first)
            .map_err(|e| e.during("cluster check", ""))?;
        let pool = pool::build(dialect.clone(), size, self.connection_timeout, Some(first));
        let me = broker_id();
        let listener = if self.cross_process {
            Listener::new(&dialect, me)
        } else {
            None
        };
        let broker = Broker {
            inner: Arc::new(Inner {
                dialect,
                pool,
                queues: Default::default(),
                wakes: Default::default(),
                renewer: Arc::default(),
                listener,
                notifier: Notifier::new(me),
                cross_process: self.cross_process,
                statement_timeout: self.options.statement_timeout,
                manage_schema: self.manage_schema,
            }),
        };
        broker
            .inner
            .pool
            .get()
            .map_err(|source| BrokerError::Pool {
                op: "connect",
                table: String::new(),
                timeout: self.connection_timeout,
                source: source.into(),
            })?;
        Ok(broker)
    }
}

impl Broker {
    /// Connects with default options. The URL picks the database:
    /// `postgres://user@host:5432/db`, `mysql://user:pass@host:3306/db` (MySQL 8.0.17+ or
    /// MariaDB 10.6+), `sqlite:path/to/file.db`, or `sqlite::memory:`.
    ///
    /// TLS (feature `tls`) as each ecosystem spells it: PostgreSQL's
    /// `sslmode=disable|prefer|require|verify-ca|verify-full` (default `prefer`) and
    /// `sslrootcert=<file>|system`; MySQL's `ssl-mode=DISABLED|PREFERRED|REQUIRED|VERIFY_CA|VERIFY_IDENTITY`
    /// and the `mysql` crate's options (`root_cert_path`, ...). See the crate docs.
    ///
    /// PostgreSQL, more than one server: every host of a primary and its standbys, with
    /// `target_session_attrs=read-write` so that sessions go to the writable one and follow a
    /// promoted standby (`postgres://app@db1:5432,db2:5432/jobs?target_session_attrs=read-write`,
    /// or the key-value form `host=db1,db2 port=5432,5432 dbname=jobs ..`). Behind PgBouncer's
    /// transaction pooling, say `pool_mode=transaction` (default `session`): statements are
    /// then sent unnamed and the timeouts set per transaction; the advisory form is refused, and
    /// the change feed needs [`BrokerBuilder::listen_url`].
    ///
    /// ```no_run
    /// use sqlbroker::Broker;
    ///
    /// let pg = Broker::connect(
    ///     "postgres://app@db.example.com/jobs?sslmode=verify-full&sslrootcert=/etc/ssl/db-ca.pem",
    /// )?;
    /// let failover = Broker::connect(
    ///     "postgres://app@db1:5432,db2:5432/jobs?target_session_attrs=read-write",
    /// )?;
    /// let pooled = Broker::builder("postgres://app@pgbouncer:6432/jobs?pool_mode=transaction")
    ///     .listen_url("postgres://app@db1:5432/jobs")
    ///     .build()?;
    /// let my = Broker::connect(
    ///     "mysql://app:pw@db.example.com/jobs?ssl-mode=VERIFY_IDENTITY&root_cert_path=/etc/ssl/db-ca.pem",
    /// )?;
    /// # Ok::<(), sqlbroker::BrokerError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`BrokerError::InvalidUrl`] for a URL we do not understand; [`BrokerError::Connect`], at
    /// once, if the first connection cannot be made (see [`BrokerBuilder::build`]).
    pub fn connect(url: &str) -> Result<Broker> {
        Broker::builder(url).build()
    }

    /// A builder for options such as the pool size.
    pub fn builder(url: &str) -> BrokerBuilder {
        BrokerBuilder {
            url: url.to_string(),
            pool_size: 16,
            connection_timeout: Duration::from_secs(30),
            options: ConnOptions {
                statement_timeout: Duration::from_secs(30),
                sqlite_durable: true,
                cross_process: true,
                listen_url: None,
                galera_single_writer: false,
            },
            cross_process: true,
            manage_schema: true,
        }
    }

    /// `PostgreSQL`, `MySQL` or `SQLite`.
    pub fn database(&self) -> &'static str {
        self.inner.dialect.database()
    }

    /// The table's validated description and SQL, built once per description, and checked
    /// against the table's record (or, with none, its columns) once per description
    /// ([`registry::verify`](crate::registry::verify)): every use of a table but its
    /// creation and migration comes through here.
    pub(crate) fn queue(&self, table: &Table) -> Result<Arc<Queue>> {
        let q = self.compiled(table)?;
        if !q.described.load(std::sync::atomic::Ordering::Acquire) {
            crate::registry::verify(&q, table, self.inner.manage_schema)?;
        }
        Ok(q)
    }

    /// [`BrokerError::DdlRefused`] on a broker that does not manage the schema.
    fn may_run_ddl(&self, op: &'static str, table: &Table) -> Result<()> {
        if self.inner.manage_schema {
            return Ok(());
        }
        Err(BrokerError::DdlRefused {
            op,
            table: table.name().to_string(),
        })
    }

    /// The database's dialect.
    pub(crate) fn dialect(&self) -> &dyn Dialect {
        &*self.inner.dialect
    }

    /// A pooled connection for `op`, not tied to one table's queue (`table` names the table
    /// in its error, if any).
    pub(crate) fn pooled(&self, op: &'static str, table: &str) -> Result<pool::PooledConn> {
        self.inner.pool.get().map_err(|source| BrokerError::Pool {
            op,
            table: table.to_string(),
            timeout: self.inner.pool.connection_timeout(),
            source: source.into(),
        })
    }

    /// The table's validated description and SQL, built once per description, unchecked
    /// against its record (`create_table`, `migrate`).
    pub(crate) fn compiled(&self, table: &Table) -> Result<Arc<Queue>> {
        if let Some(q) = self.inner.queues.lock().get(table) {
            return Ok(q.clone());
        }
        let spec = table.validate()?;
        let sql = self.inner.dialect.compile(&spec);
        let wake = self
            .inner
            .wakes
            .lock()
            .entry(spec.name.clone())
            .or_default()
            .clone();
        let q = Arc::new(Queue::new(
            spec,
            sql,
            self.inner.dialect.clone(),
            self.inner.pool.clone(),
            wake,
            self.inner.statement_timeout,
        ));
        Ok(self
            .inner
            .queues
            .lock()
            .entry(table.clone())
            .or_insert(q)
            .clone())
    }

    /// Creates the table with every column described, and the index the claims use, if it
    /// does not exist (`CREATE TABLE IF NOT EXISTS`). An existing table is left as it is.
    /// All or nothing where the database's DDL is transactional (PostgreSQL, SQLite); MySQL
    /// makes the table and its index in one statement.
    ///
    /// A table of that name that already exists is left as it is, and checked: if it lacks a
    /// described column, or has one of a type the statements cannot use,
    /// [`BrokerError::Schema`] names each problem ([`Broker::migrate`] adds missing columns).
    ///
    /// The description is recorded in the database (the registry table `sqlbroker_tables`,
    /// made on first use), where [`Broker::open_table`] reads it back in any process. A new
    /// table replaces the record of a table of that name dropped earlier; an existing table
    /// whose record disagrees with `table` is refused with [`BrokerError::Schema`] naming
    /// each difference ([`Broker::migrate`] records a changed description), and an existing
    /// table with no record is given `table` as its record. A table keeps one description:
    /// of several services that create one new table at the same moment with different
    /// descriptions, one records its own and the others get [`BrokerError::Schema`].
    ///
    /// # Errors
    ///
    /// [`BrokerError::DdlRefused`] on a broker built with
    /// [`manage_schema(false)`](BrokerBuilder::manage_schema), before anything is sent
    /// ([`Table::ddl`] gives the statements to apply instead);
    /// [`BrokerError::Unsupported`] for a form the database does not have, before anything is
    /// sent: SQLite has no row locks (the default form), so a SQLite table is described with
    /// [`Table::lease`] or [`Table::advisory_lock`].
    pub fn create_table(&self, table: &Table) -> Result<()> {
        self.may_run_ddl("create_table", table)?;
        let q = self.compiled(table)?;
        // A form the database cannot run (row lock on SQLite) is refused before anything is
        // made or recorded, rather than at the first subscription's start.
        q.dialect.check_form(q.spec.form)?;
        // The record before the table: one found while the table is missing is a dropped
        // table's (see `registry::record_created`).
        let before = crate::registry::before_create(&q)?;
        let existed = {
            // A table that exists is checked before any DDL: an index over a column it lacks
            // would fail half-way (and, on SQLite, a rolled-back index build was seen to leave
            // the next one incomplete).
            let mut conn = q.conn("schema check")?;
            let existed = !q.columns(&mut *conn)?.is_empty();
            if existed {
                q.check_schema(&mut *conn)?;
            }
            existed
        };
        if existed {
            // Checked against its record, or given this description as its first.
            crate::registry::verify(&q, table, true)?;
        }
        let statements = q.dialect.create_table(&q.spec);
        q.retrying("create table", |conn| {
            // Another broker making the same table at the same moment can make this one's DDL
            // fail (PostgreSQL: a duplicate `pg_type` row); the table is then there, and the
            // record decides whose description it is.
            let made_elsewhere = |conn: &mut dyn DbConn| {
                let name = [Value::Text(q.spec.name.clone())];
                conn.query(q.dialect.columns_query(), &name)
                    .is_ok_and(|rows| !rows.is_empty())
            };
            if let [one] = &statements[..] {
                return match conn.batch(one) {
                    Err(_) if made_elsewhere(conn) => Ok(()),
                    done => done,
                };
            }
            conn.batch(&q.sql.begin_write)?;
            let done = statements
                .iter()
                .try_for_each(|stmt| conn.batch(stmt))
                .and_then(|()| conn.batch("COMMIT"));
            if done.is_err() {
                conn.rollback_or_discard();
                if made_elsewhere(conn) {
                    return Ok(());
                }
            }
            done
        })?;
        {
            let mut conn = q.conn("schema check")?;
            q.check_schema(&mut *conn)?;
        }
        if existed {
            return Ok(());
        }
        crate::registry::record_created(&q, table, before)
    }

    /// Brings a table made by an earlier version (or described with fewer options) up to its
    /// description: creates it if it does not exist, adds the missing columns (`ALTER TABLE ..
    /// ADD COLUMN`) and indexes, then checks it as [`create_table`](Broker::create_table)
    /// does. Returns what it did, one line each (nothing for a table already up to date).
    ///
    /// A missing column that existing rows cannot be given (`NOT NULL` with no default, such
    /// as the payload) and a column of a type the statements cannot use are
    /// [`BrokerError::Schema`], and nothing is changed. Each step is idempotent: a migration
    /// cut short is finished by running it again. DDL takes locks: run it when the queue is
    /// quiet (on MySQL every statement also commits on its own).
    ///
    /// MySQL/MariaDB: a dedup key or group column made by an earlier release, in the
    /// database's default collation (case-insensitive, padding trailing spaces), is converted
    /// to byte-exact text (`ALTER TABLE .. MODIFY COLUMN`, one statement for the table). That
    /// **copies the table** and blocks its writes while it runs: on a large table, plan for
    /// it. Until then the schema check refuses the table.
    ///
    /// Priorities added to a table change its claim order, so the ready index (`<table>_ready`)
    /// is dropped and built again in the new order (`priority DESC, run_at, id`): without it
    /// every claim would sort the whole backlog. Building it reads the table and blocks its
    /// writes meanwhile (PostgreSQL, SQLite; MySQL/MariaDB rebuild it in place), so on a large
    /// table run it while the queue is quiet.
    ///
    /// The publish time (`created_at`, [`Job::published_at`](crate::Job::published_at)) is
    /// added with no value for the rows already there (their publish time is unknown, and the
    /// migration's would be a wrong one), then given its server-clock default on PostgreSQL
    /// and MySQL/MariaDB (on MySQL a second statement: a migration cut between the two leaves
    /// the column without it). SQLite cannot add a column with that default: rows published
    /// into a table it migrated read no publish time either.
    ///
    /// ```
    /// use sqlbroker::{Broker, Table};
    /// use std::time::Duration;
    ///
    /// let broker = Broker::connect("sqlite::memory:")?;
    /// let lease = Duration::from_secs(30);
    /// broker.create_table(&Table::new("jobs").lease(lease))?;
    /// // A later version of the service wants priorities and dedup keys on the same table.
    /// let jobs = Table::new("jobs").lease(lease).priorities().dedup();
    /// let done = broker.migrate(&jobs)?;
    /// assert_eq!(
    ///     done,
    ///     ["added column priority", "added column dedup_key", "rebuilt index jobs_ready in priority order"]
    /// );
    /// assert!(broker.migrate(&jobs)?.is_empty());
    /// # Ok::<(), sqlbroker::BrokerError>(())
    /// ```
    ///
    /// The description given is recorded as the table's ([`Broker::open_table`]), replacing
    /// the record it had, or giving a table made by an earlier release its first; the pause
    /// flag is kept. Brokers that checked the old description keep it until they are made
    /// again: stop the workers of the old description first. A description in another form
    /// than the record (or, for a table with no record, its columns: a `locked_until` column
    /// is a lease table) is refused with [`BrokerError::Schema`]: a table keeps its form (to
    /// change it, create a table of another name and move the work there, or drop an empty
    /// table and create it again). A form the database does not have is
    /// [`BrokerError::Unsupported`], as in [`create_table`](Broker::create_table).
    ///
    /// [`BrokerError::DdlRefused`] on a broker built with
    /// [`manage_schema(false)`](BrokerBuilder::manage_schema), before anything is sent;
    /// [`Broker::migration_sql`] gives the statements this would run, for a migration tool.
    pub fn migrate(&self, table: &Table) -> Result<Vec<String>> {
        self.may_run_ddl("migrate", table)?;
        let q = self.compiled(table)?;
        q.dialect.check_form(q.spec.form)?;
        let mut conn = q.conn("migrate")?;
        let found = q.columns(&mut *conn)?;
        if found.is_empty() {
            drop(conn);
            self.create_table(table)?;
            return Ok(vec![format!("created table {}", q.spec.name)]);
        }
        drop(conn);
        crate::registry::check_migration(&q, table)?;
        let mut conn = q.conn("migrate")?;
        let plan = crate::ddl::plan(&q, &mut *conn, &found)?;
        for sql in &plan.statements {
            conn.batch(sql).map_err(q.err("migrate"))?;
        }
        q.check_schema(&mut *conn)?;
        drop(conn);
        crate::registry::record(&q, table)?;
        Ok(plan.done)
    }

    /// Publishes one message and returns the new row's id; it is due at once unless it was
    /// given a delay.
    ///
    /// # Errors
    ///
    /// Nothing is written on any error:
    /// - [`BrokerError::InvalidTable`] / [`BrokerError::InvalidMessage`]: the description or the
    ///   message is invalid (a value for a column the table does not describe);
    /// - [`BrokerError::Duplicate`], with a dedup key ([`Message::dedup_key`], on a table
    ///   described with [`Table::dedup`]): the id of the unfinished row that holds the key;
    /// - [`BrokerError::Schema`]: the table does not exist (or its columns do not match the
    ///   description);
    /// - [`BrokerError::Database`] / [`BrokerError::Pool`]: the database failed or could not be
    ///   reached ([`BrokerError::is_transient`] tells whether to try again). A lost connection
    ///   cannot tell whether the insert committed: publish is not retried for you.
    pub fn publish(&self, table: &Table, message: Message) -> Result<i64> {
        let q = self.queue(table)?;
        let mut conn = q.conn("publish")?;
        let id = publish::one(&q.target(), &mut *conn, message)
            .map_err(|e| q.explain_failure(&mut *conn, e))?;
        drop(conn);
        q.meters.published(1);
        self.announce(&q, 1);
        Ok(id)
    }

    /// Publishes many messages with multi-row inserts (one statement unless the batch exceeds
    /// the database's parameter limit; then several, in one transaction). All or nothing.
    ///
    /// On a table with dedup keys, a message whose key an unfinished row (or an earlier
    /// message of the batch) holds is skipped: [`Published::duplicates`] counts them.
    pub fn publish_batch(
        &self,
        table: &Table,
        messages: impl IntoIterator<Item = Message>,
    ) -> Result<Published> {
        let messages: Vec<Message> = messages.into_iter().collect();
        if messages.is_empty() {
            return Ok(Published::default());
        }
        let q = self.queue(table)?;
        let mut conn = q.conn("publish")?;
        let done = publish::many(&q.target(), &mut *conn, messages, Within::Own, |rows| {
            q.insert_sql(rows)
        })
        .map_err(|e| q.explain_failure(&mut *conn, e))?;
        drop(conn);
        q.meters.published(done.rows);
        if done.rows > 0 {
            self.announce(&q, done.rows);
        }
        Ok(done)
    }

    /// Starts describing a subscription to `table`.
    pub fn subscription(&self, table: &Table) -> SubscriptionBuilder<'_> {
        SubscriptionBuilder::new(
            self.queue(table),
            self.inner.renewer.clone(),
            self.inner.listener.clone(),
        )
    }

    /// `rows` rows of `q` committed: wakes that many idle workers of this broker, and tells
    /// other brokers (PostgreSQL: a notification on the table's channel, sent by the notify
    /// thread so the publish does not wait for it, and skipped while an earlier one of this
    /// broker's is on its way; see [`Gate`](crate::runtime::wake::Gate)). The rows are in: a
    /// notification that fails is logged, and the poll finds them.
    pub(crate) fn announce(&self, q: &Arc<Queue>, rows: usize) {
        q.wake.notify(rows);
        if !self.inner.cross_process
            || q.sql.notify.is_none()
            || q.wake.gate.defer(rows, Instant::now())
        {
            return;
        }
        self.inner.notifier.send(q, rows);
    }

    /// Dead-lettered rows of `table`, oldest first, at most `limit`.
    pub fn dead_letters(&self, table: &Table, limit: usize) -> Result<Vec<DeadLetter>> {
        let q = self.queue(table)?;
        let limit = [Value::Int(limit.min(i64::MAX as usize) as i64)];
        let rows = q.retrying("dead letters", |conn| conn.query(&q.sql.dead_list, &limit))?;
        Ok(dead_letter_rows(&q, rows))
    }

    /// Puts a dead-lettered row back in the queue, due now, with a fresh attempt count (its next
    /// delivery reads attempt 1), so a row that ran out of [`Table::max_attempts`] gets them all
    /// again. Returns false if no dead-lettered row has that id.
    pub fn requeue_dead(&self, table: &Table, id: i64) -> Result<bool> {
        let q = self.queue(table)?;
        let now = crate::schedule::due_at(SystemTime::now(), Duration::ZERO);
        // Only a dead row matches: running it twice changes nothing more.
        let params = [Value::Time(now), Value::Int(id)];
        let n = q.retrying("requeue", |conn| conn.execute(&q.sql.dead_requeue, &params))?;
        if n > 0 {
            self.announce(&q, 1);
        }
        Ok(n > 0)
    }
}

/// A number no other broker of this process, nor (with high probability) of another process,
/// uses: how a listener tells its own broker's notifications from others'.
fn broker_id() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    // Process id, start time and a counter, mixed; kept to 53 bits so it reads the same
    // anywhere a payload is parsed as a number.
    let mixed =
        (u64::from(std::process::id()) << 32 ^ nanos ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15))
            .wrapping_mul(0xff51_afd7_ed55_8ccd);
    mixed >> 11
}

/// What [`Broker::publish_batch`] did.
///
/// ```
/// use sqlbroker::{Broker, Message, Table};
///
/// let broker = Broker::connect("sqlite::memory:")?;
/// let t = Table::new("jobs").lease(std::time::Duration::from_secs(30)).dedup();
/// broker.create_table(&t)?;
/// let msgs = ["a", "b", "a"].map(|k| Message::new(k.as_bytes().to_vec()).dedup_key(k));
/// let done = broker.publish_batch(&t, msgs)?;
/// assert_eq!((done.rows, done.duplicates), (2, 1));
/// # Ok::<(), sqlbroker::BrokerError>(())
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Published {
    /// Rows made.
    pub rows: usize,
    /// Messages skipped because an unfinished row, or an earlier message of the batch, held
    /// their dedup key (tables with [`Table::dedup`] only).
    pub duplicates: usize,
}

impl std::fmt::Debug for Broker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Broker")
            .field("database", &self.database())
            .finish()
    }
}

/// A dead-lettered row ([`Broker::dead_letters`]).
///
/// ```
/// use sqlbroker::{Broker, Message, Table};
///
/// let broker = Broker::connect("sqlite::memory:")?;
/// let t = Table::new("jobs").lease(std::time::Duration::from_secs(30));
/// broker.create_table(&t)?;
/// broker.publish(&t, Message::new(b"bad".to_vec()))?;
/// let sub = broker.subscription(&t).start()?;
/// sub.next_delivery().unwrap().dead_letter("cannot parse")?;
/// let dead = broker.dead_letters(&t, 10)?;
/// assert_eq!((dead[0].payload.as_slice(), dead[0].reason.as_str()), (&b"bad"[..], "cannot parse"));
/// # Ok::<(), sqlbroker::BrokerError>(())
/// ```
#[derive(Clone, PartialEq)]
#[non_exhaustive]
pub struct DeadLetter {
    /// The row's id.
    pub id: i64,
    /// Attempts the row used.
    pub attempts: u32,
    /// The body.
    pub payload: Vec<u8>,
    /// When it was dead-lettered (whole seconds).
    pub dead_at: SystemTime,
    /// The reason given to [`Delivery::dead_letter`](crate::Delivery::dead_letter).
    pub reason: String,
    /// The text of the row's last failure, if it had one ([`Job::last_error`](crate::Job::last_error)).
    pub last_error: Option<String>,
    /// Failures the row recorded ([`Job::errors`](crate::Job::errors)).
    pub errors: u32,
    /// The table's own columns, by name.
    pub values: Vec<(String, Value)>,
}

impl std::fmt::Debug for DeadLetter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeadLetter")
            .field("id", &self.id)
            .field("attempts", &self.attempts)
            .field("payload", &crate::value::Payload(&self.payload))
            .field("dead_at", &self.dead_at)
            .field("reason", &self.reason)
            .field("last_error", &self.last_error)
            .field("errors", &self.errors)
            .field("values", &self.values)
            .finish()
    }
}

/// Dead letters from rows of the `dead_list` layout.
pub(crate) fn dead_letter_rows(q: &Queue, rows: Vec<Vec<Value>>) -> Vec<DeadLetter> {
    let names: Vec<String> = q.spec.columns.iter().map(|c| c.name.clone()).collect();
    rows.into_iter()
        .map(|row| {
            let mut it = row.into_iter();
            let id = it.next().and_then(|v| v.as_i64()).unwrap_or_default();
            let attempts = it
                .next()
                .and_then(|v| v.as_i64())
                .unwrap_or_default()
                .clamp(0, u32::MAX as i64) as u32;
            let payload = it.next().map(Value::into_payload).unwrap_or_default();
            let dead_at = it
                .next()
                .and_then(|v| v.as_time())
                .unwrap_or(SystemTime::UNIX_EPOCH);
            let reason = match it.next() {
                Some(Value::Text(s)) => s,
                _ => String::new(),
            };
            let last_error = match it.next() {
                Some(Value::Text(s)) => Some(s),
                _ => None,
            };
            let errors = it
                .next()
                .and_then(|v| v.as_i64())
                .unwrap_or_default()
                .clamp(0, u32::MAX as i64) as u32;
            let values = names.iter().cloned().zip(q.spec.typed_values(it)).collect();
            DeadLetter {
                id,
                attempts,
                payload,
                dead_at,
                reason,
                last_error,
                errors,
                values,
            }
        })
        .collect()
}

impl DeadLetter {
    /// The text of the row's last failure (at most [`LAST_ERROR_MAX`](crate::LAST_ERROR_MAX)
    /// characters), if it failed before it was dead-lettered: the reason says why it ended,
    /// this what went wrong last.
    pub fn last_error(&self) -> Option<&str> {
        self.last_error.as_deref()
    }

    /// The value of a column of the table's description.
    pub fn get(&self, column: &str) -> Option<&Value> {
        self.values
            .iter()
            .find(|(c, _)| c == column)
            .map(|(_, v)| v)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn debug_hides_the_password() {
        assert_eq!(
            super::redact("postgres://app:s3cret@db:5432/q?sslmode=require"),
            "postgres://app:***@db:5432/q?sslmode=require"
        );
        assert_eq!(super::redact("mysql://root@h/test"), "mysql://root@h/test");
        assert_eq!(super::redact("sqlite:/tmp/a@b.db"), "sqlite:/tmp/a@b.db");
        assert_eq!(
            super::redact("postgres://app@db/q?sslmode=require&password=s3cret"),
            "postgres://app@db/q?sslmode=require&password=***"
        );
        assert_eq!(
            super::redact("postgres://app:pw@h1:5432,h2:5433/q?target_session_attrs=read-write"),
            "postgres://app:***@h1:5432,h2:5433/q?target_session_attrs=read-write"
        );
        let b = crate::Broker::builder("postgres://u:pw@h/db");
        assert!(!format!("{b:?}").contains("pw"));
    }

    /// A dead letter's payload shows as a byte string, not a list of numbers.
    #[test]
    fn a_dead_letter_shows_its_payload_as_bytes() {
        let d = super::DeadLetter {
            id: 7,
            attempts: 1,
            payload: b"{\"a\":1}".to_vec(),
            dead_at: std::time::UNIX_EPOCH,
            reason: "bad".into(),
            last_error: None,
            errors: 0,
            values: Vec::new(),
        };
        assert!(
            format!("{d:?}").contains(r#"payload: b"{\"a\":1}""#),
            "{d:?}"
        );
    }
}
