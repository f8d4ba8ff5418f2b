//! The one error type of the crate, and the bound on the error text a failure keeps on its
//! row.

use std::time::Duration;

/// What a check of a table that does not exist says (the one problem of its
/// [`BrokerError::Schema`]: [`BrokerError::is_missing_table`]).
pub(crate) const NO_TABLE: &str =
    "the table does not exist (Broker::create_table makes it, or the SQL of Table::ddl)";

/// What went wrong, named so the caller can decide what to do.
///
/// Messages are lowercase with no trailing period. Driver and pool errors are wrapped with the
/// operation and the table they happened on; [`BrokerError::is_transient`] tells whether trying
/// again later may succeed.
///
/// ```
/// use sqlbroker::{Broker, BrokerError, Table};
///
/// let broker = Broker::connect("sqlite::memory:")?;
/// // SQLite has no row locks: the row lock form is refused, with what to use instead.
/// match broker.subscription(&Table::new("jobs")).start() {
///     Err(BrokerError::Unsupported { why, .. }) => assert!(why.contains("lease")),
///     other => panic!("{other:?}"),
/// }
/// # Ok::<(), BrokerError>(())
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BrokerError {
    /// A lease settlement found another claim's token in the row (or no row): the lease expired
    /// and the row was, or may be, delivered again. The settlement changed nothing.
    #[error(
        "lease lost on table {table}, row {id}: the row no longer holds this delivery's token"
    )]
    LeaseLost {
        /// The table.
        table: String,
        /// The row id.
        id: i64,
    },
    /// The delivery no longer holds its row, in a form without a lease (row lock: the row was
    /// cancelled or finished while a [`checkpoint`](crate::Delivery::checkpoint) committed;
    /// advisory lock: the row is gone). What was asked changed nothing: stop the work.
    #[error("claim lost on table {table}, row {id}: {why}")]
    ClaimLost {
        /// The table.
        table: String,
        /// The row id.
        id: i64,
        /// What was found.
        why: &'static str,
    },
    /// Bytes over their bound ([`OUTPUT_MAX`], [`CHECKPOINT_MAX`]): nothing was written, and
    /// the delivery still holds its row.
    #[error("{what} of row {id} on table {table} is {len} bytes, over the bound of {max}")]
    TooLarge {
        /// The table.
        table: String,
        /// The row id.
        id: i64,
        /// `output` or `checkpoint`.
        what: &'static str,
        /// The length given.
        len: usize,
        /// The bound.
        max: usize,
    },
    /// The server is older than the first release that has a primitive the form needs.
    #[error("{database} {found} is too old: {needed} or newer is needed for {what}")]
    ServerTooOld {
        /// `PostgreSQL`, `MySQL` or `MariaDB`.
        database: &'static str,
        /// The version the server reported.
        found: String,
        /// The oldest version that works.
        needed: String,
        /// What needs it.
        what: &'static str,
    },
    /// The database cannot do what the table asks (row lock on SQLite, for one).
    #[error("{what} is not supported on {database}: {why}")]
    Unsupported {
        /// The database.
        database: &'static str,
        /// The form or feature asked for.
        what: String,
        /// Why not, and what to use instead.
        why: &'static str,
    },
    /// A form or option whose guarantee would silently not hold across the nodes of a
    /// multi-primary cluster (MariaDB Galera: node-local row locks, `GET_LOCK` keys and the
    /// FIFO group guard), refused at [`Subscription`](crate::Subscription) start; nothing was
    /// started. Permanent: the lease form holds across nodes, and
    /// [`BrokerBuilder::galera_single_writer`](crate::BrokerBuilder::galera_single_writer)
    /// declares that every broker writes through one node, where the others hold too.
    #[error(
        "{what} is refused on a {database} cluster of {nodes} nodes: {why}; if every broker \
         writes through one node, declare it with BrokerBuilder::galera_single_writer(true)"
    )]
    ClusterUnsafe {
        /// The cluster's kind (`MariaDB Galera`).
        database: &'static str,
        /// The form or option refused, and the table.
        what: String,
        /// The nodes in the cluster when the broker started.
        nodes: u64,
        /// What would not hold, and what holds instead.
        why: &'static str,
    },
    /// The table description is invalid; nothing was sent to the database.
    #[error("invalid table description {table:?}: {reason}")]
    InvalidTable {
        /// The table name as given.
        table: String,
        /// What is wrong.
        reason: String,
    },
    /// A message does not fit the table (a value for a column the table does not describe);
    /// nothing was written.
    #[error("invalid message for table {table}: {reason}")]
    InvalidMessage {
        /// The table.
        table: String,
        /// What is wrong.
        reason: String,
    },
    /// The message's dedup key is held by an unfinished row ([`Table::dedup`]): no row was
    /// made. `id` is the row that holds the key.
    ///
    /// [`Table::dedup`]: crate::Table::dedup
    #[error("duplicate on table {table}: row {id} holds the message's dedup key")]
    Duplicate {
        /// The table.
        table: String,
        /// The unfinished row that holds the key.
        id: i64,
    },
    /// [`Broker::requeue_dead`](crate::Broker::requeue_dead) of a job that waits
    /// ([`Message::after`](crate::Message::after)) on a job that is still dead-lettered or
    /// was cancelled: requeued, it would be dead-lettered again at once, as a new job waiting
    /// on that one is. Nothing was changed: requeue the job it waits on first
    /// ([`Broker::requeue_all_dead`](crate::Broker::requeue_all_dead) requeues a table's
    /// dead letters in id order, parents before the jobs that wait on them, and leaves this
    /// one dead).
    #[error(
        "job {id} of table {table} waits on job {parent} of table {parent_table}, which {outcome}: \
         requeue that one first"
    )]
    ParentFailed {
        /// The table of the job asked for.
        table: String,
        /// The job asked for.
        id: i64,
        /// The table of the job it waits on.
        parent_table: String,
        /// The job it waits on.
        parent: i64,
        /// How that one ended (`was dead-lettered`, `was cancelled`).
        outcome: String,
    },
    /// A value could not be written as a payload (`Message::json`, cargo feature `serde`):
    /// nothing was published.
    #[error("could not encode the payload: {source}")]
    Encode {
        /// The serializer's error (`serde_json::Error`).
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A delivery's payload did not decode into the type asked for (`Delivery::json`, cargo
    /// feature `serde`). The delivery still holds its row: settle it (a dead letter keeps the
    /// payload for inspection).
    #[error("payload of row {id} on table {table} does not decode: {source}")]
    Decode {
        /// The table.
        table: String,
        /// The row id.
        id: i64,
        /// The deserializer's error (`serde_json::Error`).
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The URL given to [`Broker::connect`](crate::Broker::connect) is not one we understand.
    #[error("invalid database url: {reason}")]
    InvalidUrl {
        /// What is wrong.
        reason: String,
    },
    /// A statement failed on the database.
    #[error("{op}{} failed ({kind}): {source}", on_table(.table))]
    Database {
        /// What we were doing (`claim`, `ack`, `publish`, ...).
        op: &'static str,
        /// The table (empty for the server checks).
        table: String,
        /// How to treat it.
        kind: DbErrorKind,
        /// The driver's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The first connection, made by [`BrokerBuilder::build`](crate::BrokerBuilder::build)
    /// before anything else, failed: `source` is the server's or the TLS library's reason (a
    /// password refused, an unknown database, a certificate that does not verify, a server
    /// that does not answer). It fails at once, without waiting for the pool's timeout.
    /// [`is_transient`](BrokerError::is_transient) tells whether the same attempt may succeed
    /// later ([`DbErrorKind::ConnectionLost`]: the server could not be reached, is starting,
    /// or has no free connection) or not ([`DbErrorKind::Other`]: refused, or TLS failed).
    #[error("could not connect to {database}: {source}")]
    Connect {
        /// `PostgreSQL`, `MySQL` or `SQLite`.
        database: &'static str,
        /// Whether trying again may help.
        kind: DbErrorKind,
        /// The driver's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// No pooled connection could be had in time; carries the pool's last connection error.
    #[error("no database connection for {op}{} within {timeout:?}: {source}", on_table(.table))]
    Pool {
        /// What we were doing.
        op: &'static str,
        /// The table (empty when connecting).
        table: String,
        /// The pool's checkout timeout.
        timeout: Duration,
        /// The pool's error, which names the last connection failure.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A thread of ours could not be started (the system is out of threads or memory).
    #[error("could not start thread {name}: {source}")]
    Thread {
        /// The thread's name.
        name: String,
        /// The system's error.
        #[source]
        source: std::io::Error,
    },
    /// [`Subscription::shutdown`](crate::Subscription::shutdown) ran out of its grace with
    /// deliveries still unsettled. The subscription is stopped all the same.
    #[error("shutdown of the subscription on table {table} left {unsettled} deliveries unsettled after its grace")]
    Unsettled {
        /// The table.
        table: String,
        /// Deliveries claimed and not settled when the grace ran out.
        unsettled: usize,
    },
    /// A subscription whose deliveries each hold a pooled connection (row lock form, advisory
    /// form on a server) could hold every connection of the pool, leaving none for publishes
    /// and settlements. Nothing was started.
    #[error(
        "a subscription on table {table} may hold {holds} connections but the pool has {pool_size}: \
         raise the broker's pool_size above max_in_flight, or lower workers / max_in_flight"
    )]
    PoolTooSmall {
        /// The table.
        table: String,
        /// The subscription's `max_in_flight`.
        holds: usize,
        /// The broker's pool size.
        pool_size: u32,
    },
    /// The delivery's handler ran past the subscription's
    /// [`handler_timeout`](crate::SubscriptionBuilder::handler_timeout): the delivery was failed
    /// (retried by the retry policy, or dead-lettered on its last attempt) and its row is
    /// another claim's now. The settlement asked for changed nothing.
    #[error("handler timeout on table {table}, row {id}: the handler ran past {after:?} and the delivery was failed")]
    HandlerTimeout {
        /// The table.
        table: String,
        /// The row id.
        id: i64,
        /// The subscription's handler timeout.
        after: Duration,
    },
    /// A thread of ours panicked (a claim worker, which closes its subscription; a renewal
    /// round, which is tried again). Reported by
    /// [`Subscription::last_error`](crate::Subscription::last_error).
    #[error("{thread} panicked: {message}")]
    Panic {
        /// Which thread, and for which table.
        thread: String,
        /// The panic's message.
        message: String,
    },
    /// The table in the database does not match its description: columns missing, or of a
    /// type the statements cannot use. Nothing was started.
    /// [`Broker::migrate`](crate::Broker::migrate) adds what is missing.
    #[error("table {table} does not match its description: {}", problems.join("; "))]
    Schema {
        /// The table.
        table: String,
        /// What is wrong, one line each ("column priority is missing").
        problems: Vec<String>,
    },
    /// No description of the table is recorded in the database: [`Broker::open_table`] of a
    /// name that [`Broker::create_table`] or [`Broker::migrate`] never described (a table
    /// made by an earlier release gets its record from `migrate`), or
    /// [`Broker::pause`] / [`Broker::resume`] of such a table. Nothing was changed.
    ///
    /// [`Broker::open_table`]: crate::Broker::open_table
    /// [`Broker::create_table`]: crate::Broker::create_table
    /// [`Broker::migrate`]: crate::Broker::migrate
    /// [`Broker::pause`]: crate::Broker::pause
    /// [`Broker::resume`]: crate::Broker::resume
    #[error("no description of table {table} is recorded (Broker::create_table or Broker::migrate records one)")]
    UnknownTable {
        /// The table's name.
        table: String,
    },
    /// [`Broker::pause_periodic`] or [`Broker::resume_periodic`] of a name no periodic schedule
    /// has recorded (no process ever ran it on this database). Nothing was changed.
    ///
    /// [`Broker::pause_periodic`]: crate::Broker::pause_periodic
    /// [`Broker::resume_periodic`]: crate::Broker::resume_periodic
    #[error("no periodic schedule named {name:?} is recorded on this database")]
    UnknownPeriodic {
        /// The schedule's name.
        name: String,
    },
    /// [`Broker::create_table`] or [`Broker::migrate`] on a broker built with
    /// [`BrokerBuilder::manage_schema(false)`](crate::BrokerBuilder::manage_schema): it runs no
    /// DDL. Nothing was sent to the database. [`Table::ddl`] and [`Broker::migration_sql`]
    /// give the statements to apply instead (the command line: `sqlbroker schema`).
    ///
    /// [`Broker::create_table`]: crate::Broker::create_table
    /// [`Broker::migrate`]: crate::Broker::migrate
    /// [`Broker::migration_sql`]: crate::Broker::migration_sql
    /// [`Table::ddl`]: crate::Table::ddl
    #[error(
        "{op} of table {table} refused: this broker does not manage the schema \
         (manage_schema(false)) and runs no DDL; apply the SQL of Table::ddl or \
         Broker::migration_sql (`sqlbroker schema`) with your migration tool"
    )]
    DdlRefused {
        /// `create_table` or `migrate`.
        op: &'static str,
        /// The table.
        table: String,
    },
    /// An option given to a builder is out of its range; nothing was started.
    #[error("invalid option {option}: {reason}")]
    InvalidOption {
        /// The builder method.
        option: &'static str,
        /// What is wrong, and the range that works.
        reason: String,
    },
    /// A drain of `testing` (feature `testing`) ran its bound of jobs
    /// ([`Drain::max_jobs`](crate::testing::Drain::max_jobs)) and still found one to run: a
    /// handler that publishes a job for every job it runs, or one that retries on a table
    /// without an attempts limit. The jobs run so far were settled as their handlers said;
    /// the one found last is back in the table, its attempt unspent.
    #[cfg(feature = "testing")]
    #[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
    #[error(
        "draining table {table} ran {max_jobs} jobs and found another: a handler that \
         publishes or retries without end? (Drain::max_jobs raises the bound)"
    )]
    DrainLimit {
        /// The table.
        table: String,
        /// The bound it ran.
        max_jobs: usize,
    },
    /// The subscription is closed (after `close`, `shutdown`, or a failure of its threads).
    #[error("subscription on table {table} is closed")]
    Closed {
        /// The table.
        table: String,
    },
}

fn on_table(table: &str) -> String {
    if table.is_empty() {
        String::new()
    } else {
        format!(" on table {table}")
    }
}

/// How a database error should be treated.
///
/// ```
/// use sqlbroker::{BrokerError, DbErrorKind};
///
/// fn should_retry(e: &BrokerError) -> bool {
///     matches!(
///         e,
///         BrokerError::Database { kind: DbErrorKind::Transient | DbErrorKind::ConnectionLost, .. }
///     )
/// }
/// # let _ = should_retry;
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DbErrorKind {
    /// Deadlock, serialization failure, lock-wait or statement timeout: the statement (or its
    /// transaction) was rolled back and may be tried again.
    Transient,
    /// The connection is gone (server shut down, session killed, network): the connection was
    /// discarded; a row-lock or advisory delivery on it has been returned by the database.
    ///
    /// Also a server that no longer takes writes: a primary turned standby or read-only by a
    /// switchover (PostgreSQL SQLSTATE 25006 and "cannot execute .. during recovery"; MySQL and
    /// MariaDB errors 1290 for `--read-only` / `--super-read-only`, 1792, 1836 and 1874). The
    /// statement did nothing; the session is discarded, and with it every pooled session
    /// opened before it, so the next ones connect again (PostgreSQL: through the URL's hosts,
    /// where `target_session_attrs=read-write` picks the new primary).
    ConnectionLost,
    /// The table does not have what the statements need (a column missing, or of a type they
    /// cannot use): trying again will not help until the table is migrated
    /// ([`Broker::migrate`](crate::Broker::migrate)).
    Schema,
    /// Anything else (bad SQL for this table, constraint violation, ...).
    Other,
}

/// Words, not the variant's name: an error's message reads as a sentence
/// ("ack on table jobs failed (connection lost): ..").
impl std::fmt::Display for DbErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DbErrorKind::Transient => "transient: try again",
            DbErrorKind::ConnectionLost => "connection lost",
            DbErrorKind::Schema => "the table does not match",
            DbErrorKind::Other => "database error",
        })
    }
}

impl BrokerError {
    /// True when trying the same thing again later may succeed: transient database errors,
    /// lost connections, a first connection that could not reach the server, and pool
    /// timeouts.
    pub fn is_transient(&self) -> bool {
        match self {
            BrokerError::Database { kind, .. } | BrokerError::Connect { kind, .. } => {
                matches!(kind, DbErrorKind::Transient | DbErrorKind::ConnectionLost)
            }
            BrokerError::Pool { .. } => true,
            _ => false,
        }
    }

    /// True for the [`BrokerError::Schema`] of a table that does not exist: one never made,
    /// or dropped since its description was recorded (a stale record: the listings of every
    /// recorded table show it missing, and
    /// [`Broker::forget_table`](crate::Broker::forget_table) removes the record).
    ///
    /// ```
    /// use sqlbroker::{Broker, Table};
    ///
    /// let broker = Broker::connect("sqlite::memory:")?;
    /// let jobs = Table::new("never_made").lease(std::time::Duration::from_secs(30));
    /// let err = broker.stats(&jobs).unwrap_err(); // never made, or dropped since
    /// assert!(matches!(err, sqlbroker::BrokerError::Schema { .. }));
    /// assert!(err.is_missing_table(), "{err}");
    /// # Ok::<(), sqlbroker::BrokerError>(())
    /// ```
    pub fn is_missing_table(&self) -> bool {
        matches!(self, BrokerError::Schema { problems, .. } if problems.len() == 1 && problems[0] == NO_TABLE)
    }

    /// True for [`BrokerError::LeaseLost`].
    pub fn is_lease_lost(&self) -> bool {
        matches!(self, BrokerError::LeaseLost { .. })
    }

    /// True for [`BrokerError::HandlerTimeout`].
    pub fn is_handler_timeout(&self) -> bool {
        matches!(self, BrokerError::HandlerTimeout { .. })
    }

    /// True for [`BrokerError::Duplicate`].
    pub fn is_duplicate(&self) -> bool {
        matches!(self, BrokerError::Duplicate { .. })
    }

    /// The row holding the key, for [`BrokerError::Duplicate`].
    pub fn duplicate_of(&self) -> Option<i64> {
        match self {
            BrokerError::Duplicate { id, .. } => Some(*id),
            _ => None,
        }
    }
}

/// `Result` with [`BrokerError`].
pub type Result<T, E = BrokerError> = std::result::Result<T, E>;

/// A driver error with its classification, before the operation and table are known.
#[derive(Debug)]
pub(crate) struct DbError {
    pub kind: DbErrorKind,
    pub source: Box<dyn std::error::Error + Send + Sync>,
}

impl DbError {
    pub fn new(
        kind: DbErrorKind,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        DbError {
            kind,
            source: source.into(),
        }
    }

    /// An error of ours (a value that does not fit, an unexpected result shape).
    pub fn other(msg: impl Into<String>) -> Self {
        DbError::new(DbErrorKind::Other, msg.into())
    }

    /// The server refused a write because it no longer takes any (a standby, or a primary set
    /// read-only by a switchover): a lost connection, whose session and every pooled session
    /// opened before it are to be discarded (see the pool). Only the servers refuse so.
    #[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
    pub fn refused_writes(source: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        DbError::new(DbErrorKind::ConnectionLost, RefusedWrites(source.into()))
    }

    /// True for [`DbError::refused_writes`].
    pub fn is_refused_writes(&self) -> bool {
        self.source.is::<RefusedWrites>()
    }

    /// A round trip the server did not answer within `within`
    /// ([`BrokerBuilder::round_trip_timeout`](crate::BrokerBuilder::round_trip_timeout)): a
    /// lost connection (the statement may or may not have run), whose session is in an unknown
    /// state and is discarded, and with it every pooled session opened before it, which most
    /// likely reach the same silent server (see the pool). Only the servers have round trips.
    #[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
    pub fn no_answer(
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
        within: std::time::Duration,
    ) -> Self {
        DbError::new(
            DbErrorKind::ConnectionLost,
            NoAnswer {
                source: source.into(),
                within,
            },
        )
    }

    /// True for [`DbError::no_answer`].
    pub fn is_no_answer(&self) -> bool {
        self.source.is::<NoAnswer>()
    }

    /// Wrap with what we were doing and on which table.
    pub fn during(self, op: &'static str, table: &str) -> BrokerError {
        BrokerError::Database {
            op,
            table: table.to_string(),
            kind: self.kind,
            source: self.source,
        }
    }
}

impl std::fmt::Display for DbError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.source.fmt(f)
    }
}

impl std::error::Error for DbError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.source)
    }
}

/// A driver error meaning the server takes no writes, with what the broker does about it.
#[derive(Debug)]
struct RefusedWrites(Box<dyn std::error::Error + Send + Sync>);

impl std::fmt::Display for RefusedWrites {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: the server takes no writes (a standby, or a primary set read-only); its \
             sessions are discarded and new ones connected",
            self.0
        )
    }
}

/// A round trip past its deadline, as [`DbError::no_answer`] names it.
#[derive(Debug)]
struct NoAnswer {
    source: Box<dyn std::error::Error + Send + Sync>,
    within: std::time::Duration,
}

impl std::fmt::Display for NoAnswer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: no answer from the server within {:?} (the round trip timeout); the session \
             is discarded",
            self.source, self.within
        )
    }
}

impl std::error::Error for NoAnswer {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.source)
    }
}

impl std::error::Error for RefusedWrites {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.0)
    }
}

/// Errors of the `next_delivery` family that did not yield a delivery.
///
/// ```
/// use sqlbroker::{Broker, NextError, Table};
/// use std::time::Duration;
///
/// let broker = Broker::connect("sqlite::memory:")?;
/// let t = Table::new("jobs").lease(Duration::from_secs(30));
/// broker.create_table(&t)?;
/// let sub = broker.subscription(&t).start()?;
/// assert_eq!(sub.next_delivery_timeout(Duration::from_millis(10)).err(), Some(NextError::Timeout));
/// sub.close();
/// assert_eq!(sub.try_next_delivery().err(), Some(NextError::Closed));
/// # Ok::<(), sqlbroker::BrokerError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NextError {
    /// Nothing arrived in time (`next_delivery_timeout`, `next_batch`); the subscription is
    /// still open.
    #[error("no delivery ready in time")]
    Timeout,
    /// Nothing is ready now (`try_next_delivery`, which does not wait); the subscription is
    /// still open.
    #[error("no delivery ready now")]
    Empty,
    /// The subscription is closed and every delivery it claimed has been handed out.
    /// [`Subscription::closed_by`](crate::Subscription::closed_by) gives the error that closed
    /// it, if one did.
    #[error("subscription closed")]
    Closed,
}

/// The most bytes of a job's output ([`Delivery::set_output`](crate::Delivery::set_output)):
/// 1 MiB, well inside every database's packet and column limits.
pub const OUTPUT_MAX: usize = 1 << 20;

/// The most bytes of a checkpoint ([`Delivery::checkpoint`](crate::Delivery::checkpoint)): 1 MiB.
pub const CHECKPOINT_MAX: usize = 1 << 20;

/// The most characters of an error a failure keeps on its row (`last_error`): longer texts are
/// cut there, on a character boundary. NUL characters, which PostgreSQL text cannot hold, are
/// kept as U+FFFD.
pub const LAST_ERROR_MAX: usize = 1_000;

/// The failure a lease claim records on a row whose previous lease ran out before anyone
/// settled it (its process was killed, stopped or hung past the lease, or could not reach the
/// database to renew it: a live process whose renewals failed gets it too, and its late
/// settlement is `LeaseLost`): the row's `last_error`
/// ([`Job::last_error`](crate::Job::last_error)), with its `errors` counted up, so a job that
/// takes its process down each time it runs shows it ([`Job::abandoned`](crate::Job::abandoned))
/// and is dead-lettered at its [`max_attempts`](crate::Table::max_attempts).
pub const LEASE_RAN_OUT: &str =
    "lease ran out: claimed and never settled in time (its process stopped, hung, or could not renew the lease)";

/// `error` as a row keeps it: at most [`LAST_ERROR_MAX`] characters, no NUL.
pub(crate) fn bound_error(error: &str) -> String {
    let cut = match error.char_indices().nth(LAST_ERROR_MAX) {
        Some((at, _)) => &error[..at],
        None => error,
    };
    cut.replace('\0', "\u{FFFD}")
}

#[cfg(test)]
mod display_tests {
    use super::*;

    /// A message written over several source lines reads as one sentence: no run of spaces
    /// where a line was continued without its `\`.
    #[test]
    fn a_refused_ddl_reads_as_one_sentence() {
        let e = BrokerError::DdlRefused {
            op: "create_table",
            table: "jobs".into(),
        };
        let msg = e.to_string();
        assert!(!msg.contains("  "), "{msg}");
        assert!(msg.contains("schema (manage_schema(false))"), "{msg}");
    }

    #[test]
    fn errors_are_bounded_on_a_char_boundary() {
        assert_eq!(bound_error("short"), "short");
        let long = "é".repeat(LAST_ERROR_MAX + 5);
        let cut = bound_error(&long);
        assert_eq!(cut.chars().count(), LAST_ERROR_MAX);
        assert_eq!(cut.len(), 2 * LAST_ERROR_MAX);
        assert_eq!(bound_error("a\0b"), "a\u{FFFD}b");
        let exact = "x".repeat(LAST_ERROR_MAX);
        assert_eq!(bound_error(&exact), exact);
    }

    /// A database error reads as a sentence: the kind in words, not its variant's name.
    #[test]
    fn a_database_error_reads_as_a_sentence() {
        let e = BrokerError::Database {
            op: "ack",
            table: "jobs".into(),
            kind: DbErrorKind::ConnectionLost,
            source: "server closed the connection".into(),
        };
        assert_eq!(
            e.to_string(),
            "ack on table jobs failed (connection lost): server closed the connection"
        );
    }
}
