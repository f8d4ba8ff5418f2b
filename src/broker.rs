//! The broker: one database, its connection pool, and the tables used through it. Uses the
//! runtime, the dialects and the model. Its methods of each concern live with that concern,
//! above it: publishing in `producing`, subscriptions in `consuming`, the operator's calls in
//! `operating`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use parking_lot::Mutex;

use crate::dialect::{self, ConnOptions, Dialect};
use crate::error::{BrokerError, Result};
use crate::model::table::Table;
use crate::runtime::fleet::{Fleet, Member, Membership};
use crate::runtime::listen::Listener;
use crate::runtime::maintainer::{self, Maintenance};
use crate::runtime::notifier::Notifier;
use crate::runtime::renewer::Renewer;
use crate::runtime::sweep::Sweeper;
use crate::runtime::wake::Wake;
use crate::runtime::{pool, Pool, Queue};

/// How much longer than the statement timeout the client waits for an answer by default
/// ([`BrokerBuilder::round_trip_timeout`]): the server ends a statement's lock waits first,
/// with its own error, and its answer has time to arrive.
pub(crate) const ROUND_TRIP_MARGIN: Duration = Duration::from_secs(10);

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
    /// Lease acks of all the broker's tables, grouped into shared commits where the dialect
    /// allows ([`Dialect::shared_acks_begin`]).
    acks: Arc<crate::runtime::AckGroup>,
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
    /// The sweeper of `sqlbroker_deps` (started with the first table with dependencies).
    sweeper: Sweeper,
    /// The running subscriptions and workers, and their heartbeats in `sqlbroker_workers`.
    fleet: Fleet,
    /// This broker's run for the database's maintainer, and its duties while it holds it
    /// ([`BrokerBuilder::maintenance`]).
    maintenance: Maintenance,
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
    /// Set by [`BrokerBuilder::round_trip_timeout`]; else the statement timeout and
    /// [`ROUND_TRIP_MARGIN`].
    round_trip_timeout: Option<Duration>,
    options: ConnOptions,
    cross_process: bool,
    manage_schema: bool,
    /// [`BrokerBuilder::heartbeat`].
    heartbeat: Duration,
    /// [`BrokerBuilder::maintenance`] and its settings.
    maintenance: bool,
    maintainer_lease: Duration,
    maintenance_every: Duration,
    keep_actions: Option<Duration>,
}

impl std::fmt::Debug for BrokerBuilder {
    /// The URL without its password.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BrokerBuilder")
            .field("url", &redact(&self.url))
            .field("pool_size", &self.pool_size)
            .field("connection_timeout", &self.connection_timeout)
            .field("statement_timeout", &self.options.statement_timeout)
            .field("round_trip_timeout", &self.resolved_round_trip())
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
        if !(Duration::from_millis(100)..=Duration::from_secs(300)).contains(&self.heartbeat) {
            return invalid("heartbeat", "from 100 ms to 5 minutes");
        }
        if !(Duration::from_secs(3)..=Duration::from_secs(3600)).contains(&self.maintainer_lease) {
            return invalid("maintainer_lease", "from 3 s to an hour");
        }
        if !(Duration::from_secs(1)..=day).contains(&self.maintenance_every) {
            return invalid("maintenance_every", "from 1 s to a day");
        }
        if self
            .keep_actions
            .is_some_and(|d| d < Duration::from_secs(1))
        {
            return invalid("keep_actions", "at least 1 s");
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
        if let Some(within) = self.round_trip_timeout {
            if !(Duration::from_secs(1)..=day + ROUND_TRIP_MARGIN).contains(&within) {
                return invalid("round_trip_timeout", "from 1 s to a day");
            }
            if within <= self.options.statement_timeout {
                return invalid(
                    "round_trip_timeout",
                    "longer than the statement timeout: a statement may wait that long on the \
                     server (a lock), and the client would give its answer up before it came",
                );
            }
        }
        Ok(())
    }

    /// The round trip bound in force: the one set, or the statement timeout and the margin.
    fn resolved_round_trip(&self) -> Duration {
        self.round_trip_timeout
            .unwrap_or(self.options.statement_timeout + ROUND_TRIP_MARGIN)
    }

    /// Most pooled connections. Default 16; from 1 to 10,000. A row lock delivery, and an
    /// advisory delivery on a server, holds a connection until it is settled; each claim
    /// worker needs one while it claims. An in-memory SQLite database always has exactly one.
    /// The lease renewer opens one connection beyond the pool, for a round and no longer, when
    /// no pooled one comes within 100 ms (the application holds them all), so a held pool
    /// does not let leases run out: leave the server room for it.
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
    /// from 1 s to a day. Every wait on the server is bounded by it: PostgreSQL sessions run
    /// with `lock_timeout` and `statement_timeout` (unless the URL's `options` set them), sent
    /// at connect, or `SET` after connecting where a pooler refuses or drops them, or `SET
    /// LOCAL` in each transaction with `pool_mode=transaction`; MySQL and MariaDB sessions
    /// with `lock_wait_timeout` and `innodb_lock_wait_timeout`; SQLite waits this long for the
    /// write lock. A server that does not answer at all is given up on the client's side
    /// after the [`round_trip_timeout`](BrokerBuilder::round_trip_timeout), 10 s later by
    /// default.
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

    /// The longest the client waits for the server's answer to one round trip (a statement,
    /// a commit, a ping, and connecting's exchange after the TCP connect) before it gives the
    /// session up. Default: the [`statement_timeout`](BrokerBuilder::statement_timeout) and
    /// 10 s (40 s with the defaults); from 1 s to a day, and longer than the statement
    /// timeout.
    ///
    /// A server, or a proxy in front of one, that accepts the connection and stops answering
    /// (a stopped process, a hung host behind a live load balancer, a firewall that drops a
    /// flow) is not noticed by TCP: its kernel acknowledges every byte. Only this bound ends
    /// the wait. The call then fails with a lost connection
    /// ([`DbErrorKind::ConnectionLost`](crate::DbErrorKind::ConnectionLost): the statement may
    /// or may not have run), the session is discarded (it is in an unknown state), and so is
    /// every pooled session opened before it, which most likely reaches the same silent server:
    /// each would otherwise cost one more bound. A claim worker reports the error and claims
    /// again; a lease whose renewals do not come through reads
    /// [`Delivery::lease_held`](crate::Delivery::lease_held) `false` from its deadline on.
    ///
    /// Nothing legitimate waits longer: a statement's lock waits (a claim behind another's
    /// transaction, a `FOR UPDATE` behind a slow settlement, `create_table` and `migrate`
    /// waiting for a table's lock) end on the server at the statement timeout, and the bound
    /// is armed only while a statement is out, so a row lock delivery's transaction idles for
    /// as long as its handler runs. One exception: MySQL and MariaDB bound lock waits, not
    /// execution, so a `migrate` whose `ALTER TABLE` copies a large table for longer than this
    /// needs a broker with a longer bound.
    ///
    /// A PostgreSQL URL whose `options` set a longer `statement_timeout` or `lock_timeout`
    /// than the builder's needs a longer bound too.
    ///
    /// PostgreSQL: every TCP session (a Unix socket's are not bounded), armed for the broker's
    /// own calls (not the application's inside `sqlbroker::postgres::in_delivery`);
    /// `TCP_USER_TIMEOUT` is set to it too, unless the URL sets `tcp_user_timeout`. MySQL and
    /// MariaDB: the socket's read and write timeouts, and `TCP_USER_TIMEOUT` (Linux) unless the
    /// URL sets `tcp_user_timeout_ms`. SQLite has no round trips: no effect. README:
    /// "A server that stops answering".
    pub fn round_trip_timeout(mut self, d: Duration) -> Self {
        self.round_trip_timeout = Some(d);
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

    /// How often this broker writes the heartbeat of each of its running subscriptions and
    /// workers to `sqlbroker_workers` ([`Broker::workers`](crate::Broker::workers)); a row
    /// not written again within three beats drops out of every listing (its process stopped
    /// or lost the database). Default 5 s; from 100 ms to 5 minutes.
    pub fn heartbeat(mut self, every: Duration) -> Self {
        self.heartbeat = every;
        self
    }

    /// Whether this broker runs for the database's **maintainer** (default: on). Of all the
    /// brokers on a database that do, one is elected through a lease row with a term
    /// (`sqlbroker_maintainer`; [`Broker::maintainer`](crate::Broker::maintainer) says which
    /// process holds it, since when, in which term), and on a thread of its own
    /// (`sqlbroker-maintain`, never a handler's) it deletes, every
    /// [`maintenance_every`](Self::maintenance_every), the completed rows past
    /// [`Table::keep_completed`](crate::Table::keep_completed), the dead letters past
    /// [`Table::keep_dead`](crate::Table::keep_dead) of every table recorded on the database,
    /// and the action log's entries past [`keep_actions`](Self::keep_actions), in batches of
    /// at most 1,000 rows, each batch fenced by its term. A maintainer that dies is replaced
    /// once its lease ([`maintainer_lease`](Self::maintainer_lease)) runs out; a broker that
    /// is dropped gives it up at once. Turn it off for short-lived processes (the `sqlbroker`
    /// commands do) or where maintenance runs elsewhere.
    pub fn maintenance(mut self, on: bool) -> Self {
        self.maintenance = on;
        self
    }

    /// The maintainer's lease: a maintainer that stops renewing it (killed, cut off from the
    /// database) is replaced within this and a third of it. Renewed every third. Default
    /// 30 s; from 3 s to an hour. The brokers of a database may differ: each holds the lease
    /// for its own length.
    pub fn maintainer_lease(mut self, lease: Duration) -> Self {
        self.maintainer_lease = lease;
        self
    }

    /// How often the maintainer's duties run (the first a whole interval after its election,
    /// so a short-lived process does none). Default a minute; from 1 s to a day.
    pub fn maintenance_every(mut self, every: Duration) -> Self {
        self.maintenance_every = every;
        self
    }

    /// How long the operators' action log (`sqlbroker_actions`, written by
    /// [`Broker::record_action`](crate::Broker::record_action) and the dashboard) keeps an
    /// entry before the maintainer deletes it. Default 90 days; at least 1 s.
    pub fn keep_actions(mut self, keep: Duration) -> Self {
        self.keep_actions = Some(keep);
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
    pub fn build(mut self) -> Result<Broker> {
        self.check()?;
        self.options.round_trip_timeout = self.resolved_round_trip();
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
                acks: Arc::new(crate::runtime::AckGroup::new(crate::runtime::ACK_GROUP_MAX)),
                renewer: Arc::default(),
                listener,
                notifier: Notifier::new(me),
                cross_process: self.cross_process,
                statement_timeout: self.options.statement_timeout,
                manage_schema: self.manage_schema,
                sweeper: Sweeper::default(),
                fleet: Fleet::new(self.heartbeat, self.manage_schema),
                maintenance: Maintenance::default(),
            }),
        };
        if self.maintenance {
            let settings = maintainer::Settings {
                lease: self.maintainer_lease,
                every: self.maintenance_every,
                keep_actions: self.keep_actions,
                create: self.manage_schema,
                statement_timeout: self.options.statement_timeout,
            };
            let inner = &broker.inner;
            inner
                .maintenance
                .start(&inner.dialect, &inner.pool, settings);
        }
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
            round_trip_timeout: None,
            options: ConnOptions {
                statement_timeout: Duration::from_secs(30),
                round_trip_timeout: Duration::from_secs(30) + ROUND_TRIP_MARGIN,
                sqlite_durable: true,
                cross_process: true,
                listen_url: None,
                galera_single_writer: false,
            },
            cross_process: true,
            manage_schema: true,
            heartbeat: crate::runtime::fleet::BEAT,
            maintenance: true,
            maintainer_lease: maintainer::LEASE,
            maintenance_every: maintainer::EVERY,
            keep_actions: Some(maintainer::KEEP_ACTIONS),
        }
    }

    /// `PostgreSQL`, `MySQL` or `SQLite`: the dialect (MySQL and MariaDB share one).
    pub fn database(&self) -> &'static str {
        self.inner.dialect.database()
    }

    /// The server as it names itself: `PostgreSQL`, `MySQL`, `MariaDB` or `SQLite`
    /// ([`database`](Broker::database) says `MySQL` for MariaDB too, whose SQL is the same):
    /// what a report of the server in hand should say. Known once a connection was made, as
    /// [`Broker::connect`] makes one; before that a MariaDB server reads `MySQL`.
    pub fn server_name(&self) -> &'static str {
        self.inner.dialect.server_name()
    }

    /// The table's validated description and SQL, built once per description, and checked
    /// against the table's record (or, with none, its columns) once per description
    /// ([`registry::verify`](crate::runtime::registry::verify)): every use of a table but its
    /// creation and migration comes through here.
    pub(crate) fn queue(&self, table: &Table) -> Result<Arc<Queue>> {
        let q = self.compiled(table)?;
        if q.spec.dependencies {
            self.sweep();
        }
        if !q.described.load(std::sync::atomic::Ordering::Acquire) {
            crate::runtime::registry::verify(&q, table, self.inner.manage_schema)?;
        }
        Ok(q)
    }

    /// Starts this broker's sweeper of `sqlbroker_deps`, if it has not started: a table with
    /// dependencies is used ([`crate::runtime::sweep`]).
    /// Adds a running subscription or worker to the fleet: its heartbeat is written until the
    /// membership is dropped.
    pub(crate) fn join_fleet(&self, member: Member) -> Membership {
        self.inner
            .fleet
            .join(&self.inner.dialect, &self.inner.pool, member)
    }

    /// The term this broker holds the maintainer's lease in, if it does.
    pub(crate) fn maintenance_term(&self) -> Option<i64> {
        self.inner.maintenance.term()
    }

    pub(crate) fn sweep(&self) {
        self.inner
            .sweeper
            .start(&self.inner.dialect, &self.inner.pool);
    }

    /// This broker's sweeper.
    #[cfg(test)]
    pub(crate) fn sweeper(&self) -> &Sweeper {
        &self.inner.sweeper
    }

    /// Forgets every description of the table `name` this broker compiled and checked (after
    /// the table is dropped: a later use checks its record again).
    pub(crate) fn forget(&self, name: &str) {
        self.inner.queues.lock().retain(|t, _| t.name() != name);
    }

    /// [`BrokerError::DdlRefused`] on a broker that does not manage the schema.
    pub(crate) fn may_run_ddl(&self, op: &'static str, table: &Table) -> Result<()> {
        if self.inner.manage_schema {
            return Ok(());
        }
        Err(BrokerError::DdlRefused {
            op,
            table: table.name().to_string(),
        })
    }

    /// The broker's lease timer (subscriptions of lease tables renew through it).
    pub(crate) fn renewer(&self) -> Arc<Renewer> {
        self.inner.renewer.clone()
    }

    /// The change feed, where the database has one.
    pub(crate) fn listener(&self) -> Option<Arc<Listener>> {
        self.inner.listener.clone()
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
        // A subscription's view of some queues or kinds compiles its own claims, and shares
        // with the table the keys this broker's sessions hold (a session's advisory lock is
        // its own again, so a view that did not know the table's would take a key twice).
        let held_here = match table.claim_only() {
            Some(_) => Some(self.compiled(&table.whole())?.held_here.clone()),
            None => None,
        };
        let sql = self.inner.dialect.compile(&spec);
        let wake = self
            .inner
            .wakes
            .lock()
            .entry(spec.name.clone())
            .or_default()
            .clone();
        let mut q = Queue::new(
            spec,
            sql,
            self.inner.dialect.clone(),
            self.inner.pool.clone(),
            wake,
            self.inner.statement_timeout,
        );
        if let Some(h) = held_here {
            q.held_here = h;
        }
        if !self.inner.manage_schema {
            // The tables made on first use are the migrations' (`Database::library_ddl`).
            q.collects.made = true.into();
            q.collects.no_ddl = true;
            q.unique_made = true.into();
        }
        if self.inner.dialect.shared_acks_begin().is_some() {
            q.acks = self.inner.acks.clone();
        }
        let q = Arc::new(q);
        Ok(self
            .inner
            .queues
            .lock()
            .entry(table.clone())
            .or_insert(q)
            .clone())
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

impl std::fmt::Debug for Broker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Broker")
            .field("database", &self.database())
            .finish()
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
        let b = crate::broker::Broker::builder("postgres://u:pw@h/db");
        assert!(!format!("{b:?}").contains("pw"));
    }

    /// A broker's sweeper of `sqlbroker_deps` runs on a thread of its own, named, from its
    /// first table with dependencies, and stops when the broker is dropped. Fails (`not
    /// started`) with the sweep left to the handlers' settlements.
    #[test]
    fn the_sweeper_is_the_brokers_own_thread() {
        use crate::runtime::sweep::THREAD;
        use std::time::Duration;
        let dir = std::env::temp_dir().join("sqlbroker-unit");
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join(format!("sweeper-{}.db", std::process::id()));
        let url = format!("sqlite:{}", file.display());
        let broker = crate::broker::Broker::connect(&url).unwrap();
        let plain = crate::model::table::Table::new("plain").lease(Duration::from_secs(30));
        broker.create_table(&plain).unwrap();
        let running = broker.sweeper().running();
        assert!(!running(), "started without dependencies");
        let t = crate::model::table::Table::new("waits")
            .dependencies()
            .lease(Duration::from_secs(30));
        broker.create_table(&t).unwrap();
        assert!(running(), "not started");
        // Linux names the thread where `ps` and debuggers see it (the new thread names itself
        // as it starts: looked for a while).
        let named = || {
            std::fs::read_dir("/proc/self/task").map(|tasks| {
                tasks.filter_map(|t| t.ok()).any(|t| {
                    std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == THREAD)
                })
            })
        };
        let looking = std::time::Instant::now();
        while named().is_ok_and(|n| !n) && looking.elapsed() < Duration::from_secs(2) {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(named().unwrap_or(true), "no thread named {THREAD}");
        let started = std::time::Instant::now();
        drop(broker);
        assert!(!running(), "still running once the broker is dropped");
        assert!(started.elapsed() < Duration::from_secs(2));
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", file.display()));
        }
    }
}
