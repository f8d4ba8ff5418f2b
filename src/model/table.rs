//! The table description: its columns and their roles, the form that holds a claimed row, and
//! the validation that turns a description into something the dialects may put into SQL.

use std::time::Duration;

use crate::error::{BrokerError, Result};
use crate::model::value::Value;

pub(crate) mod record;

/// How a claimed row is held while its handler runs. Chosen by the [`Table`] description.
///
/// ```
/// use sqlbroker::{Form, Table};
/// use std::time::Duration;
///
/// assert_eq!(Table::new("a").form(), Form::RowLock);
/// assert_eq!(Table::new("b").lease(Duration::from_secs(30)).form(), Form::Lease);
/// assert_eq!(Table::new("c").text_column("k").advisory_lock("k-{k}").form(), Form::AdvisoryLock);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Form {
    /// An open transaction holding the row `FOR UPDATE` (the default).
    RowLock,
    /// A deadline in the `locked_until` column, renewed while the handler runs
    /// ([`Table::lease`]).
    Lease,
    /// A database advisory lock on a key rendered from the row ([`Table::advisory_lock`]).
    AdvisoryLock,
}

impl Form {
    /// A short lowercase name (`row lock`, `lease`, `advisory lock`).
    pub fn name(self) -> &'static str {
        match self {
            Form::RowLock => "row lock",
            Form::Lease => "lease",
            Form::AdvisoryLock => "advisory lock",
        }
    }
}

/// The columns the queue itself uses. Each has a default name; [`Table::rename`] points a role at
/// a column of an existing table.
///
/// ```
/// use sqlbroker::{Role, Table};
///
/// // An existing table whose body column is called `body`.
/// let t = Table::new("inbox").rename(Role::Payload, "body");
/// # let _ = t;
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Role {
    /// Integer primary key, assigned by the database (`id`).
    Id,
    /// The message body, binary (`payload`).
    Payload,
    /// How many attempts the row has used (`attempts`).
    Attempts,
    /// When the row becomes due (`run_at`).
    RunAt,
    /// The lease deadline and delivery token, lease form only (`locked_until`).
    LockedUntil,
    /// When the row finished, `NULL` while it is live (`dead_at`): when it was dead-lettered,
    /// or, on a table that keeps completed rows ([`Table::keep_completed`]), when it was acked.
    DeadAt,
    /// Why the row was dead-lettered (`dead_reason`).
    DeadReason,
    /// The dedup key of an unfinished row, tables with [`Table::dedup`] only (`dedup_key`).
    DedupKey,
    /// The row's priority, higher first, tables with [`Table::priorities`] only (`priority`).
    Priority,
    /// When the row was acked, tables with [`Table::keep_completed`] only (`completed_at`).
    CompletedAt,
    /// The text of the row's last failure (`last_error`, `NULL` until one): what
    /// [`Delivery::fail`](crate::Delivery::fail), a handler timeout or a dropped delivery
    /// reported, or (lease form) [`LEASE_RAN_OUT`](crate::LEASE_RAN_OUT) for a lease that ran
    /// out unsettled, at most [`LAST_ERROR_MAX`](crate::LAST_ERROR_MAX) characters.
    LastError,
    /// How many failures the row has recorded (`errors`, integer, 0 at first).
    Errors,
    /// Lease and advisory forms: [`Broker::cancel`](crate::Broker::cancel) asked for the row
    /// in work not to run again (`cancel_requested`, integer, 0 or 1).
    CancelRequested,
    /// When the row was published (`created_at`): filled by the database with the server's
    /// clock at insert (a column default, so inserts name no such column), whole seconds.
    CreatedAt,
    /// What the job produced, binary, `NULL` until its settlement writes one, tables with
    /// [`Table::outputs`] only (`output`).
    Output,
    /// The progress the job saved last, binary, tables with [`Table::checkpoints`] only
    /// (`checkpoint`).
    Checkpoint,
    /// The W3C trace context of the publish (`traceparent`, text, `NULL` when the publish gave
    /// none), tables with [`Table::traceparent`] only.
    Traceparent,
    /// The named queue a row belongs to (`queue`, text, `'default'` unless the publish named
    /// one), tables with [`Table::queues`] only.
    Queue,
    /// The row's job kind (`kind`, text, `NULL` when the publish named none), tables with
    /// [`Table::kinds`] only.
    Kind,
}

const ROLES: [Role; 19] = [
    Role::Id,
    Role::Payload,
    Role::Attempts,
    Role::RunAt,
    Role::LockedUntil,
    Role::DeadAt,
    Role::DeadReason,
    Role::DedupKey,
    Role::Priority,
    Role::CompletedAt,
    Role::LastError,
    Role::Errors,
    Role::CancelRequested,
    Role::CreatedAt,
    Role::Output,
    Role::Checkpoint,
    Role::Traceparent,
    Role::Queue,
    Role::Kind,
];

impl Role {
    /// The column name used unless renamed.
    pub fn default_name(self) -> &'static str {
        match self {
            Role::Id => "id",
            Role::Payload => "payload",
            Role::Attempts => "attempts",
            Role::RunAt => "run_at",
            Role::LockedUntil => "locked_until",
            Role::DeadAt => "dead_at",
            Role::DeadReason => "dead_reason",
            Role::DedupKey => "dedup_key",
            Role::Priority => "priority",
            Role::CompletedAt => "completed_at",
            Role::LastError => "last_error",
            Role::Errors => "errors",
            Role::CancelRequested => "cancel_requested",
            Role::CreatedAt => "created_at",
            Role::Output => "output",
            Role::Checkpoint => "checkpoint",
            Role::Traceparent => "traceparent",
            Role::Queue => "queue",
            Role::Kind => "kind",
        }
    }

    fn index(self) -> usize {
        ROLES.iter().position(|r| *r == self).unwrap_or(0)
    }
}

/// The type of a column of the user's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ColumnType {
    /// Text (`TEXT`; on MySQL/MariaDB `VARCHAR(255)` so it can be indexed, in a binary NO PAD
    /// collation, so it compares byte for byte as on PostgreSQL and SQLite: values differing
    /// in case, trailing spaces or Unicode normalisation are different values).
    Text,
    /// 64-bit integer.
    Int,
    /// Double precision float.
    Float,
    /// Binary.
    Bytes,
    /// A point in time, to the whole second (a published [`Value::Time`]
    /// is truncated to its second), from 1970-01-01 to 9999-12-31 UTC: `TIMESTAMPTZ` on
    /// PostgreSQL, `DATETIME` holding UTC on MySQL/MariaDB, `INTEGER` seconds since the Unix
    /// epoch on SQLite. Read back as a [`Value::Time`] on every database.
    Time,
}

/// Transaction isolation for the claim transactions of the row lock form (and the MySQL lease
/// claim). Unset: `READ COMMITTED`, so a MySQL locking read locks the rows it takes and not the
/// gaps between them.
///
/// ```
/// use sqlbroker::{Isolation, Table};
///
/// let t = Table::new("ledger_jobs").isolation(Isolation::RepeatableRead);
/// # let _ = t;
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Isolation {
    /// `READ COMMITTED` (the default).
    ReadCommitted,
    /// `REPEATABLE READ`.
    RepeatableRead,
    /// `SERIALIZABLE`.
    Serializable,
}

impl Isolation {
    #[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
    pub(crate) fn sql(self) -> &'static str {
        match self {
            Isolation::ReadCommitted => "READ COMMITTED",
            Isolation::RepeatableRead => "REPEATABLE READ",
            Isolation::Serializable => "SERIALIZABLE",
        }
    }
}

/// A description of a queue table. Builder by value; validated when it is first used
/// (`create_table`, `publish`, `subscription(..).start()`), before any SQL runs.
///
/// The description chooses the form: nothing said is the row lock form, [`Table::lease`] the
/// lease form, [`Table::advisory_lock`] the advisory lock form.
///
/// ```
/// use sqlbroker::{Form, Role, Table};
/// use std::time::Duration;
///
/// let emails = Table::new("emails");
/// assert_eq!(emails.form(), Form::RowLock);
/// let thumbs = Table::new("thumbs").lease(Duration::from_secs(30));
/// assert_eq!(thumbs.form(), Form::Lease);
/// let payments = Table::new("payments").text_column("account").advisory_lock("accounts-{account}");
/// assert_eq!(payments.form(), Form::AdvisoryLock);
/// // An existing table whose body column is called `body`:
/// let legacy = Table::new("legacy_jobs").rename(Role::Payload, "body");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[must_use = "a table description does nothing until it is used"]
pub struct Table {
    name: String,
    columns: Vec<(String, ColumnType)>,
    renames: [Option<String>; 19],
    lease: Option<Duration>,
    advisory: Option<String>,
    group: Option<String>,
    fifo: bool,
    isolation: Option<Isolation>,
    max_attempts: Option<u32>,
    dedup: bool,
    priorities: bool,
    keep_completed: Option<Duration>,
    /// Dead letters deleted by the maintainer once this old ([`Table::keep_dead`]).
    keep_dead: Option<Duration>,
    /// Concurrency limits: key template and the most rows of one key in work at once.
    limits: Vec<(String, u32)>,
    /// Rate limits: key template, the most claims of one key in any window, the window.
    rates: Vec<(String, u32, Duration)>,
    /// Fair claims: the key template claims rotate across.
    fair: Option<String>,
    /// Rows may wait on other jobs and be waited on ([`Table::dependencies`]).
    dependencies: bool,
    /// Jobs record what they produced ([`Table::outputs`]).
    outputs: bool,
    /// Jobs save their progress ([`Table::checkpoints`]).
    checkpoints: bool,
    /// Rows carry the trace context of their publish ([`Table::traceparent`]).
    traceparent: bool,
    /// Rows belong to named queues ([`Table::queues`]).
    queues: bool,
    /// Rows carry a job kind ([`Table::kinds`]).
    kinds: bool,
    /// A subscription's view: the queues and kinds its claims take (`None`: all). Never
    /// recorded; two views of one table are one table to everything but the claims.
    only: Option<Box<ClaimOnly>>,
}

/// The rows a subscription's claims take: of these queues, of these kinds (`None`: any).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub(crate) struct ClaimOnly {
    pub queues: Option<std::collections::BTreeSet<String>>,
    pub kinds: Option<std::collections::BTreeSet<String>>,
}

/// The queue of a row whose publish named none ([`Table::queues`]).
pub const DEFAULT_QUEUE: &str = "default";

/// The longest name of a queue or a job kind.
pub const MAX_NAME_LEN: usize = 64;

/// Checks a queue's or a kind's name: 1 to [`MAX_NAME_LEN`] characters of `A-Z a-z 0-9 _ . : -`.
/// Such a name is written into the claims' SQL as a literal, so nothing else may pass.
pub(crate) fn check_name(what: &str, name: &str) -> std::result::Result<(), String> {
    if name.is_empty() || name.len() > MAX_NAME_LEN {
        return Err(format!(
            "a {what} name has 1 to {MAX_NAME_LEN} characters, not {}",
            name.chars().count()
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | ':' | '-')))
    {
        return Err(format!(
            "a {what} name is made of A-Z, a-z, 0-9, '_', '.', ':' and '-', not {c:?}"
        ));
    }
    Ok(())
}

impl Table {
    /// The attempts a row gets when the description does not say
    /// ([`max_attempts`](Table::max_attempts)): 25, as River's, about three days of the
    /// default [`RetryPolicy`](crate::RetryPolicy) (1 s doubling to 10 minutes).
    pub const DEFAULT_MAX_ATTEMPTS: u32 = 25;

    /// The largest `max` of a [`concurrency_limit`](Table::concurrency_limit): a claim may try
    /// each of a key's slots in turn.
    pub const MAX_CONCURRENCY: u32 = 1000;

    /// The largest `max` of a [`rate_limit`](Table::rate_limit): a key keeps up to `max`
    /// claim times.
    pub const MAX_RATE: u32 = 10_000;

    /// The longest window of a [`rate_limit`](Table::rate_limit): a day.
    pub const MAX_RATE_WINDOW: Duration = Duration::from_secs(86_400);

    /// A table named `name` with the default role columns and no columns of the user's.
    /// The name is an identifier (`[A-Za-z_][A-Za-z0-9_]*`, at most 48 characters), quoted in SQL,
    /// so it is case-sensitive.
    pub fn new(name: impl Into<String>) -> Self {
        Table {
            name: name.into(),
            columns: Vec::new(),
            renames: Default::default(),
            lease: None,
            advisory: None,
            group: None,
            fifo: false,
            isolation: None,
            max_attempts: None,
            dedup: false,
            priorities: false,
            keep_completed: None,
            keep_dead: None,
            limits: Vec::new(),
            rates: Vec::new(),
            fair: None,
            dependencies: false,
            outputs: false,
            checkpoints: false,
            traceparent: false,
            queues: false,
            kinds: false,
            only: None,
        }
    }

    /// Priorities ([`Message::priority`](crate::Message::priority)): claims take the highest
    /// priority first, then the earliest due, then the oldest. A `priority` column
    /// (`SMALLINT NOT NULL DEFAULT 0`; renamable, [`Role::Priority`]) is made by
    /// [`Broker::create_table`](crate::Broker::create_table), and the claims' index leads with
    /// it. Within a FIFO group the order stays publish order: priority orders the groups'
    /// heads, never the rows of one group. Not in the advisory lock form (its claim pages by
    /// due time; [`BrokerError::InvalidTable`]).
    ///
    /// A claim takes the highest rows, but the rows of one claim reach the channel in the order
    /// the database returns them (`UPDATE .. RETURNING` promises none): for a strict order
    /// across every delivery, use `batch_size(1)`, as below.
    ///
    /// ```
    /// use sqlbroker::{Broker, Message, Table};
    ///
    /// let broker = Broker::connect("sqlite::memory:")?;
    /// let jobs = Table::new("jobs").priorities().lease(std::time::Duration::from_secs(30));
    /// broker.create_table(&jobs)?;
    /// broker.publish(&jobs, Message::new(b"later".to_vec()))?;
    /// broker.publish(&jobs, Message::new(b"urgent".to_vec()).priority(10))?;
    /// let sub = broker.subscription(&jobs).batch_size(1).start()?;
    /// let d = sub.next_delivery().unwrap();
    /// assert_eq!(d.payload(), b"urgent");
    /// d.ack()?;
    /// # Ok::<(), sqlbroker::BrokerError>(())
    /// ```
    pub fn priorities(mut self) -> Self {
        self.priorities = true;
        self
    }

    /// Dedup keys ([`Message::dedup_key`](crate::Message::dedup_key)): while an unfinished row
    /// holds a key, a message with the same key creates no row, and
    /// [`Broker::publish`](crate::Broker::publish) returns
    /// [`BrokerError::Duplicate`] with the id of the row that holds it
    /// ([`Broker::publish_batch`](crate::Broker::publish_batch) skips such messages and counts
    /// them). Race-free across producers and processes: a unique index on the key column
    /// (`dedup_key`, text, `NULL` for messages without a key), never a read-then-insert.
    ///
    /// A key is freed when its row finishes: an acked row is deleted, and dead-lettering a row
    /// clears its key (a dead letter no longer blocks new work; its key is gone from
    /// [`Broker::dead_letters`](crate::Broker::dead_letters) and from a requeued row). On
    /// MySQL a key is at most 255 characters.
    ///
    /// Keys compare byte for byte on every database: `"order-1"` and `"Order-1"`, `"k"` and
    /// `"k "`, or `"é"` precomposed and decomposed are different keys (on MySQL/MariaDB the key
    /// column has a binary NO PAD collation; a table made by an earlier release is converted
    /// by [`Broker::migrate`](crate::Broker::migrate)).
    ///
    /// ```
    /// use sqlbroker::{Broker, Message, Table};
    ///
    /// let broker = Broker::connect("sqlite::memory:")?;
    /// let mails = Table::new("mails").dedup().lease(std::time::Duration::from_secs(30));
    /// broker.create_table(&mails)?;
    /// let id = broker.publish(&mails, Message::new(b"hi".to_vec()).dedup_key("welcome-42"))?;
    /// let again = broker.publish(&mails, Message::new(b"hi".to_vec()).dedup_key("welcome-42"));
    /// assert!(matches!(again, Err(e) if e.is_duplicate() && e.duplicate_of() == Some(id)));
    /// # Ok::<(), sqlbroker::BrokerError>(())
    /// ```
    pub fn dedup(mut self) -> Self {
        self.dedup = true;
        self
    }

    /// Completed-job retention: an ack keeps the row, with its completion time in a
    /// `completed_at` column (renamable, [`Role::CompletedAt`]), instead of deleting it, and
    /// [`Broker::prune_completed`](crate::Broker::prune_completed) deletes the rows completed
    /// more than `retention` ago (whole seconds, rounded up). Pruning runs when it is called
    /// (the `sqlbroker completed prune` command, from a timer): subscriptions do not prune.
    /// [`Broker::completed_after`](crate::Broker::completed_after) lists the kept rows.
    ///
    /// A completed row is finished the way a dead letter is: the ack sets `dead_at` too (to
    /// the completion time), so every claim, FIFO group head and dedup key treats it as gone
    /// (its dedup key is cleared), and `completed_at` tells it from a dead letter, whose
    /// `completed_at` stays `NULL`. Dead-letter listings, requeues, purges and
    /// [`QueueStats::dead`](crate::QueueStats::dead) leave completed rows out. The completion
    /// time is the database server's clock (the ack statement reads it), in whole seconds.
    ///
    /// ```
    /// use sqlbroker::{Broker, Message, Table};
    /// use std::time::Duration;
    ///
    /// let broker = Broker::connect("sqlite::memory:")?;
    /// let jobs = Table::new("jobs")
    ///     .lease(Duration::from_secs(30))
    ///     .keep_completed(Duration::from_secs(7 * 86_400));
    /// broker.create_table(&jobs)?;
    /// broker.publish(&jobs, Message::new(b"done soon".to_vec()))?;
    /// let sub = broker.subscription(&jobs).start()?;
    /// sub.next_delivery().unwrap().ack()?;
    /// sub.shutdown(Duration::from_secs(5))?;
    ///
    /// let kept = broker.completed_after(&jobs, None, 10)?;
    /// assert_eq!(kept[0].payload, b"done soon");
    /// assert_eq!(broker.stats(&jobs)?.completed, Some(1));
    /// assert_eq!(broker.prune_completed(&jobs)?, 0); // not a week old yet
    /// # Ok::<(), sqlbroker::BrokerError>(())
    /// ```
    pub fn keep_completed(mut self, retention: Duration) -> Self {
        self.keep_completed = Some(retention);
        self
    }

    /// Dead-letter retention: the database's elected maintainer
    /// ([`BrokerBuilder::maintenance`](crate::BrokerBuilder::maintenance)) deletes the dead
    /// letters that were dead-lettered more than `retention` ago (whole seconds, rounded up;
    /// the time `dead_at` holds). Without it (the default) a dead letter stays until an
    /// operator requeues or purges it. Recorded with the table, so a maintainer that does not
    /// have this description in its code prunes by it too, and two services that describe the
    /// table with different retentions are refused as for any other option.
    ///
    /// On a table with [`dependencies`](Table::dependencies) each pruned dead letter's outcome
    /// is kept in its head (a day), as [`Broker::purge_all_dead`](crate::Broker::purge_all_dead)
    /// keeps it: a job published later that waits on it is dead-lettered as before.
    ///
    /// ```
    /// use sqlbroker::Table;
    /// use std::time::Duration;
    ///
    /// let jobs = Table::new("jobs")
    ///     .lease(Duration::from_secs(30))
    ///     .keep_dead(Duration::from_secs(30 * 86_400));
    /// # let _ = jobs;
    /// ```
    pub fn keep_dead(mut self, retention: Duration) -> Self {
        self.keep_dead = Some(retention);
        self
    }

    /// Lease form: a claim writes a deadline `lease` from now (whole seconds, rounded up, at least
    /// one; 30 s is a good default) into `locked_until`, renewed every half lease while the
    /// handler runs.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = Some(lease);
        self
    }

    /// Advisory lock form: rows are held by a database advisory lock on the key `template`
    /// renders from the row, `{column}` standing for a column's value (`{{` and `}}` for braces).
    /// Rows with equal keys are worked one at a time. With [`Table::fifo`], a template that
    /// reads only the group column makes the key the group's lock; see there for other
    /// templates.
    ///
    /// A message must set every column the template reads: publish refuses one that leaves
    /// such a column out ([`BrokerError::InvalidMessage`]),
    /// since every such row would share one key and run one at a time. A column set to
    /// [`Value::Null`] on purpose renders as empty text.
    pub fn advisory_lock(mut self, template: impl Into<String>) -> Self {
        self.advisory = Some(template.into());
        self
    }

    /// This description without its concurrency and rate limits: what `testing`'s drain
    /// that ignores limits claims with (only after the description itself was checked
    /// against the table's record).
    #[cfg_attr(not(feature = "testing"), allow(dead_code))]
    pub(crate) fn without_limits(mut self) -> Self {
        self.limits.clear();
        self.rates.clear();
        self
    }

    /// A concurrency limit: at most `max` rows whose rendered `key` is equal are **in work**
    /// at once (claimed and not yet settled, rows claimed ahead into a subscription's buffer
    /// included), across every broker and process sharing the table. `key` is a template over
    /// the table's columns as in [`Table::advisory_lock`] (`"{tenant}"`, `"api-{account}"`);
    /// the empty template `""` is one key for the whole table. Several limits combine: a row
    /// is claimed only when every limit has room for it. A row over a limit waits, ready,
    /// spending no attempt, and a claim passes it by for rows whose keys have room.
    ///
    /// The database enforces it, not each broker's count (see the README's "Flow control"):
    /// lease form, claims of the table take turns under its record's row lock and count the
    /// leased rows per key; advisory lock form, each key has `max` slot keys
    /// (`sqlbroker-limit:<table>:<limit>:<key>#<slot>`, `<limit>` named by the template, so
    /// the order limits are listed in changes nothing) and a row runs holding one besides its
    /// own key (SQLite: keys of the process, so the limit holds within one process); row lock
    /// form (PostgreSQL, MySQL/MariaDB), the same slot keys, held by the delivery's session. A
    /// crash frees the slots with the rows: the lease's expiry, or the session's end. A max
    /// lowered, or set after a lift, binds in every form: no row starts until fewer than the
    /// new max are in work.
    ///
    /// `max` is `1..=`[`Table::MAX_CONCURRENCY`]; an operator changes it at run time with
    /// [`Broker::set_concurrency_limit`](crate::Broker::set_concurrency_limit). A message must
    /// set every column a limit's template reads (publish refuses it otherwise). Not with
    /// [`Table::fifo`] yet ([`BrokerError::InvalidTable`]).
    ///
    /// ```
    /// use sqlbroker::{Broker, Message, Table};
    /// use std::time::Duration;
    ///
    /// let broker = Broker::connect("sqlite::memory:")?;
    /// // At most 2 calls per account at once, and 10 in all.
    /// let calls = Table::new("partner_calls")
    ///     .text_column("account")
    ///     .concurrency_limit("{account}", 2)
    ///     .concurrency_limit("", 10)
    ///     .lease(Duration::from_secs(30));
    /// broker.create_table(&calls)?;
    /// for _ in 0..3 {
    ///     broker.publish(&calls, Message::new(b"call".to_vec()).set("account", "acme"))?;
    /// }
    /// let sub = broker.subscription(&calls).start()?;
    /// let (a, b) = (sub.next_delivery().unwrap(), sub.next_delivery().unwrap());
    /// // The third waits for one of the two to settle.
    /// assert!(sub.next_delivery_timeout(Duration::from_millis(300)).is_err());
    /// a.ack()?;
    /// let c = sub.next_delivery_timeout(Duration::from_secs(5)).unwrap();
    /// b.ack()?;
    /// c.ack()?;
    /// # Ok::<(), sqlbroker::BrokerError>(())
    /// ```
    pub fn concurrency_limit(mut self, key: impl Into<String>, max: u32) -> Self {
        self.limits.push((key.into(), max));
        self
    }

    /// A rate limit: at most `max` rows whose rendered `key` is equal are **claimed** in any
    /// window of length `per`, across every broker and process sharing the table. The window
    /// slides (any `per`-long stretch of time, not calendar buckets), and it counts claims:
    /// the moment a row is taken for work, whether its handler then succeeds, fails or never
    /// finishes (a retry is claimed, and counted, again). `key` is a template as in
    /// [`Table::concurrency_limit`]; `""` is one key for the whole table. Several limits
    /// combine with each other and with concurrency limits: a row is claimed only when every
    /// one has room. A key may have several windows ("10 a second and 100 a minute"): each is
    /// a limit of its own, set apart by its window
    /// ([`Broker::set_rate_window`](crate::Broker::set_rate_window)); the same key and
    /// window twice is refused.
    ///
    /// A row over the limit waits, ready: it spends no attempt and is not a failure. A claim
    /// that found a key full learns when its window next has room and claims again then
    /// (at most a poll interval later), rather than a poll interval later.
    ///
    /// The database enforces it: each key has up to `max` slots in the table `<table>_rates`
    /// (made with the table; a key's slots as its claims need them, an idle key's deleted),
    /// each holding the time it was last claimed; a claim takes a slot last claimed at least
    /// `per` ago, stamping it with its own time, in one atomic statement, so no two claims in
    /// `per` share a slot and no window holds more than `max`. A lease claim stamps the slots
    /// of a key's rows it has in view in one statement. Times are
    /// the hosts' clocks in milliseconds: hosts sharing a table keep them in step (NTP).
    /// Lease form: the stamp is written in the claim's transaction. Advisory lock and row
    /// lock forms: it commits before the row's take; a take that then finds its row gone
    /// gives the slot back.
    ///
    /// `max` is `1..=`[`Table::MAX_RATE`], `per` at least a millisecond and at most
    /// [`Table::MAX_RATE_WINDOW`]. A message must set every column the template reads. Not
    /// with [`Table::fifo`] yet ([`BrokerError::InvalidTable`]).
    ///
    /// ```
    /// use sqlbroker::{Broker, Message, Table};
    /// use std::time::Duration;
    ///
    /// let broker = Broker::connect("sqlite::memory:")?;
    /// // At most 2 calls a second per account.
    /// let calls = Table::new("partner_calls")
    ///     .text_column("account")
    ///     .rate_limit("{account}", 2, Duration::from_secs(1))
    ///     .lease(Duration::from_secs(30));
    /// broker.create_table(&calls)?;
    /// for _ in 0..3 {
    ///     broker.publish(&calls, Message::new(b"call".to_vec()).set("account", "acme"))?;
    /// }
    /// let sub = broker.subscription(&calls).start()?;
    /// let (a, b) = (sub.next_delivery().unwrap(), sub.next_delivery().unwrap());
    /// a.ack()?;
    /// b.ack()?;
    /// // The third is claimed once the first claim is a second old.
    /// let c = sub.next_delivery_timeout(Duration::from_secs(5)).unwrap();
    /// c.ack()?;
    /// # Ok::<(), sqlbroker::BrokerError>(())
    /// ```
    pub fn rate_limit(mut self, key: impl Into<String>, max: u32, per: Duration) -> Self {
        self.rates.push((key.into(), max, per));
        self
    }

    /// Fair claims: claims rotate across the rendered `key`s of the ready rows, a key at a
    /// time in key order, starting after the key served last, so a key with a deep backlog
    /// cannot starve the others: each key with ready rows gets a row per round. Within one
    /// key the order is the table's (priority, due time, id). `key` reads exactly one column
    /// (`"{tenant}"`, `"t-{tenant}"`); rows whose column is `NULL` are one key, served once
    /// per round, after the others.
    ///
    /// With priorities, the rotation comes first: a key's highest-priority row waits for its
    /// key's turn, not for other keys' lower-priority rows to drain. With concurrency and
    /// rate limits, a key at its limit is passed by in the rotation and keeps its place for
    /// the next round. Each broker rotates on its own, from where its last claim ended. An
    /// index over the column and the claim order (`<table>_fair`) is made with the table:
    /// a claim finds the next keys with due rows by skipping through it (one probe per key;
    /// when every key fits one claim, the keys read are reused for 100 ms), then reads each
    /// key's first rows.
    ///
    /// Not with [`Table::fifo`] yet ([`BrokerError::InvalidTable`]).
    ///
    /// ```
    /// use sqlbroker::{Broker, Message, Table};
    /// use std::time::Duration;
    ///
    /// let broker = Broker::connect("sqlite::memory:")?;
    /// let jobs = Table::new("tenant_jobs")
    ///     .text_column("tenant")
    ///     .fair("{tenant}")
    ///     .lease(Duration::from_secs(30));
    /// broker.create_table(&jobs)?;
    /// for _ in 0..100 {
    ///     broker.publish(&jobs, Message::new(b"big".to_vec()).set("tenant", "big"))?;
    /// }
    /// broker.publish(&jobs, Message::new(b"small".to_vec()).set("tenant", "small"))?;
    /// let sub = broker.subscription(&jobs).batch_size(1).start()?;
    /// let mut tenants = Vec::new();
    /// for _ in 0..2 {
    ///     let d = sub.next_delivery().unwrap();
    ///     tenants.push(d.payload().to_vec());
    ///     d.ack()?;
    /// }
    /// // The small tenant's one row is among the first two, not behind the 100.
    /// assert!(tenants.contains(&b"small".to_vec()));
    /// # Ok::<(), sqlbroker::BrokerError>(())
    /// ```
    pub fn fair(mut self, key: impl Into<String>) -> Self {
        self.fair = Some(key.into());
        self
    }

    /// Jobs that compose: a row of this table can wait on other jobs
    /// ([`Message::after`](crate::Message::after),
    /// [`Message::after_settled`](crate::Message::after_settled)) and be waited on. A waiting
    /// row is published at once but claimed only once the jobs it names have settled; it is
    /// released (or, after a job that did not succeed, dead-lettered) in the very transaction
    /// that settles the last of them, in every form. Each settlement of such a table also
    /// records its outcome in the database's `sqlbroker_deps` table (made by
    /// [`create_table`](crate::Broker::create_table) and
    /// [`migrate`](crate::Broker::migrate)), where waiting rows find it: a table without this
    /// option pays nothing. Claim transactions must be `READ COMMITTED` (the default), and
    /// FIFO groups do not combine with it yet ([`BrokerError::InvalidTable`]).
    ///
    /// ```
    /// use sqlbroker::{Broker, Message, Table};
    /// use std::time::Duration;
    ///
    /// let broker = Broker::connect("sqlite::memory:")?;
    /// let jobs = Table::new("steps").dependencies().lease(Duration::from_secs(30));
    /// broker.create_table(&jobs)?;
    /// let charge = broker.publish(&jobs, Message::new(b"charge".to_vec()))?;
    /// broker.publish(&jobs, Message::new(b"ship".to_vec()).after(charge))?;
    /// let sub = broker.subscription(&jobs).start()?;
    /// let first = sub.next_delivery().unwrap();
    /// assert_eq!(first.payload(), b"charge");
    /// assert_eq!(broker.stats(&jobs)?.waiting, 1);
    /// first.ack()?; // releases "ship" in the same transaction
    /// assert_eq!(sub.next_delivery().unwrap().payload(), b"ship");
    /// # Ok::<(), sqlbroker::BrokerError>(())
    /// ```
    pub fn dependencies(mut self) -> Self {
        self.dependencies = true;
        self
    }

    /// Jobs record what they produced: [`Delivery::set_output`](crate::Delivery::set_output)
    /// gives the bytes (at most [`OUTPUT_MAX`](crate::OUTPUT_MAX)), and the settlement that
    /// ends the job (an ack, a dead letter or a cancel, not a retry) writes them to the row's
    /// `output` column (binary, nullable; renamable, [`Role::Output`]) in its own transaction,
    /// fenced as the settlement is. [`Job::output`](crate::Job::output) reads them where the
    /// row is kept (a dead letter, or an ack with [`keep_completed`](Table::keep_completed)).
    /// On a table with [`dependencies`](Table::dependencies), the output also goes to the jobs
    /// waiting on this one, in the same transaction, whether the row is kept or not:
    /// [`Dependency::output`](crate::Dependency::output). The column is made by
    /// [`create_table`](crate::Broker::create_table) and added by
    /// [`migrate`](crate::Broker::migrate); a table without this option pays nothing.
    ///
    /// ```
    /// use sqlbroker::{Broker, JobState, Message, Table};
    /// use std::time::Duration;
    ///
    /// let broker = Broker::connect("sqlite::memory:")?;
    /// let jobs = Table::new("thumbs")
    ///     .outputs()
    ///     .keep_completed(Duration::from_secs(3600))
    ///     .lease(Duration::from_secs(30));
    /// broker.create_table(&jobs)?;
    /// let id = broker.publish(&jobs, Message::new(b"cat.png".to_vec()))?;
    /// let sub = broker.subscription(&jobs).start()?;
    /// let d = sub.next_delivery().unwrap();
    /// d.set_output(b"thumbs/cat.png")?;
    /// d.ack()?;
    /// let job = broker.job(&jobs, id)?.unwrap();
    /// assert_eq!((job.state(), job.output()), (JobState::Completed, Some(&b"thumbs/cat.png"[..])));
    /// # Ok::<(), sqlbroker::BrokerError>(())
    /// ```
    pub fn outputs(mut self) -> Self {
        self.outputs = true;
        self
    }

    /// Jobs save their progress: [`Delivery::checkpoint`](crate::Delivery::checkpoint)
    /// writes the bytes (at most [`CHECKPOINT_MAX`](crate::CHECKPOINT_MAX)) to the row's
    /// `checkpoint` column (binary, nullable; renamable, [`Role::Checkpoint`]) at once,
    /// committed and fenced by the claim, and a later attempt of the job reads them with
    /// [`Delivery::last_checkpoint`](crate::Delivery::last_checkpoint): a job that crashed
    /// half way resumes from its last checkpoint. Operators see it as
    /// [`Job::checkpoint`](crate::Job::checkpoint). Made by
    /// [`create_table`](crate::Broker::create_table), added by
    /// [`migrate`](crate::Broker::migrate); a table without this option pays nothing.
    ///
    /// ```
    /// use sqlbroker::{Broker, Message, Table};
    /// use std::time::Duration;
    ///
    /// let broker = Broker::connect("sqlite::memory:")?;
    /// let jobs = Table::new("imports").checkpoints().lease(Duration::from_secs(30));
    /// broker.create_table(&jobs)?;
    /// broker.publish(&jobs, Message::new(b"customers.csv".to_vec()))?;
    /// let sub = broker.subscription(&jobs).start()?;
    /// let d = sub.next_delivery().unwrap();
    /// assert_eq!(d.last_checkpoint(), None); // the first attempt starts at the top
    /// d.checkpoint(b"line 5000")?;
    /// d.retry_after(Duration::ZERO)?; // or a crash: the next attempt resumes
    /// let again = sub.next_delivery().unwrap();
    /// assert_eq!(again.last_checkpoint().as_deref(), Some(&b"line 5000"[..]));
    /// again.ack()?;
    /// # Ok::<(), sqlbroker::BrokerError>(())
    /// ```
    pub fn checkpoints(mut self) -> Self {
        self.checkpoints = true;
        self
    }

    /// Rows carry the trace context of their publish: a `traceparent` column (text, nullable,
    /// a [W3C `traceparent`](https://www.w3.org/TR/trace-context/#traceparent-header) of 55
    /// characters; renamable, [`Role::Traceparent`]) that
    /// [`Message::traceparent`](crate::Message::traceparent) writes and
    /// [`Delivery::traceparent`](crate::Delivery::traceparent) and
    /// [`Job::traceparent`](crate::Job::traceparent) read. With the `opentelemetry` feature a
    /// publish fills it from the current span and the handler's span of
    /// [`Subscription::run`](crate::Subscription::run) continues the trace from it (the
    /// README's "Tracing across the queue"). Made by
    /// [`create_table`](crate::Broker::create_table), added by
    /// [`migrate`](crate::Broker::migrate); a table without this option pays nothing, and a
    /// message that gives a trace context to it is refused
    /// ([`BrokerError::InvalidMessage`]).
    ///
    /// ```
    /// use sqlbroker::{Broker, Message, Table};
    /// use std::time::Duration;
    ///
    /// let broker = Broker::connect("sqlite::memory:")?;
    /// let jobs = Table::new("mails").traceparent().lease(Duration::from_secs(30));
    /// broker.create_table(&jobs)?;
    /// let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    /// broker.publish(&jobs, Message::new(b"hi".to_vec()).traceparent(tp))?;
    /// let sub = broker.subscription(&jobs).start()?;
    /// let d = sub.next_delivery().unwrap();
    /// assert_eq!(d.traceparent(), Some(tp));
    /// d.ack()?;
    /// # Ok::<(), sqlbroker::BrokerError>(())
    /// ```
    pub fn traceparent(mut self) -> Self {
        self.traceparent = true;
        self
    }

    /// Named queues in one table: a text column `queue` (renamable, [`Role::Queue`]; `NOT
    /// NULL DEFAULT 'default'`), which [`Message::queue`](crate::Message::queue) sets
    /// ([`DEFAULT_QUEUE`] when the publish names none) and
    /// [`Delivery::queue`](crate::Delivery::queue) reads. A subscription claims the rows of
    /// the queues it names ([`SubscriptionBuilder::queues`](crate::SubscriptionBuilder::queues);
    /// all without it), through an index led by the queue; FIFO groups, priorities, limits,
    /// fairness and dependencies work as in any table, over all its queues (a limit per queue
    /// is a limit keyed by it: `concurrency_limit("{queue}", 4)`). Made by
    /// [`create_table`](crate::Broker::create_table), added by
    /// [`migrate`](crate::Broker::migrate) with its index; an existing column is adopted with
    /// [`Table::rename`]`(Role::Queue, "group")`.
    ///
    /// ```
    /// use sqlbroker::{Broker, Message, Table};
    ///
    /// let broker = Broker::connect("sqlite::memory:")?;
    /// let jobs = Table::new("jobs").queues().lease(std::time::Duration::from_secs(30));
    /// broker.create_table(&jobs)?;
    /// broker.publish(&jobs, Message::new(b"hi".to_vec()).queue("emails"))?;
    /// broker.publish(&jobs, Message::new(b"resize".to_vec()).queue("images"))?;
    /// let emails = broker.subscription(&jobs).queues(["emails"]).start()?;
    /// let d = emails.next_delivery().unwrap();
    /// assert_eq!((d.queue(), d.payload()), ("emails", &b"hi"[..]));
    /// d.ack()?;
    /// # Ok::<(), sqlbroker::BrokerError>(())
    /// ```
    pub fn queues(mut self) -> Self {
        self.queues = true;
        self
    }

    /// Job kinds in one table: a text column `kind` (renamable, [`Role::Kind`]; nullable),
    /// which [`Message::kind`](crate::Message::kind) sets and
    /// [`Delivery::kind`](crate::Delivery::kind) reads. A [`Worker`](crate::Worker) claims only
    /// the kinds it has handlers for, so services with different handlers share the table; a
    /// row of a kind no running worker handles stays ready (and
    /// [`Broker::kind_stats`](crate::Broker::kind_stats) counts it). A row published with no
    /// kind is claimed only by subscriptions that name no kinds.
    ///
    /// ```
    /// use sqlbroker::{Broker, Message, Table};
    ///
    /// let broker = Broker::connect("sqlite::memory:")?;
    /// let jobs = Table::new("jobs").kinds().lease(std::time::Duration::from_secs(30));
    /// broker.create_table(&jobs)?;
    /// broker.publish(&jobs, Message::new(b"a@example.com".to_vec()).kind("welcome_email"))?;
    /// let sub = broker.subscription(&jobs).kinds(["welcome_email"]).start()?;
    /// assert_eq!(sub.next_delivery().unwrap().kind(), Some("welcome_email"));
    /// # Ok::<(), sqlbroker::BrokerError>(())
    /// ```
    pub fn kinds(mut self) -> Self {
        self.kinds = true;
        self
    }

    /// This description as a subscription's view: its claims take only rows of `only`'s
    /// queues and kinds. Everything else (the record, the cache of wake-ups) sees the table.
    pub(crate) fn claiming_only(mut self, only: ClaimOnly) -> Self {
        self.only = (only != ClaimOnly::default()).then(|| Box::new(only));
        self
    }

    /// The view's queues and kinds ([`Table::claiming_only`]), if it has any.
    pub(crate) fn claim_only(&self) -> Option<&ClaimOnly> {
        self.only.as_deref()
    }

    /// This description without a subscription's view.
    pub(crate) fn whole(&self) -> std::borrow::Cow<'_, Table> {
        match self.only {
            None => std::borrow::Cow::Borrowed(self),
            Some(_) => {
                let mut t = self.clone();
                t.only = None;
                std::borrow::Cow::Owned(t)
            }
        }
    }

    /// Adds a column of the user's, of type `ty`, which messages set and deliveries read.
    pub fn column(mut self, name: impl Into<String>, ty: ColumnType) -> Self {
        self.columns.push((name.into(), ty));
        self
    }

    /// Adds a text column of the user's.
    pub fn text_column(self, name: impl Into<String>) -> Self {
        self.column(name, ColumnType::Text)
    }

    /// Adds an integer column of the user's.
    pub fn int_column(self, name: impl Into<String>) -> Self {
        self.column(name, ColumnType::Int)
    }

    /// Adds a float column of the user's.
    pub fn float_column(self, name: impl Into<String>) -> Self {
        self.column(name, ColumnType::Float)
    }

    /// Adds a binary column of the user's.
    pub fn bytes_column(self, name: impl Into<String>) -> Self {
        self.column(name, ColumnType::Bytes)
    }

    /// Adds a time column of the user's ([`ColumnType::Time`]).
    pub fn time_column(self, name: impl Into<String>) -> Self {
        self.column(name, ColumnType::Time)
    }

    /// Uses the column `name` for `role`, so an existing table can be used as it is.
    pub fn rename(mut self, role: Role, name: impl Into<String>) -> Self {
        self.renames[role.index()] = Some(name.into());
        self
    }

    /// Names the group column (a text column, added if not described yet) for
    /// [`Table::fifo`], which it needs: a group column without `fifo()` is refused by
    /// validation (it would be a plain column that groups nothing).
    pub fn group(mut self, column: impl Into<String>) -> Self {
        let column = column.into();
        if !self.columns.iter().any(|(c, _)| *c == column) {
            self.columns.push((column.clone(), ColumnType::Text));
        }
        self.group = Some(column);
        self
    }

    /// FIFO groups: the rows of one group (equal values of the [`Table::group`] column) are
    /// worked one at a time, in publish order, while the groups run in parallel: one
    /// subscription works every group.
    ///
    /// The rules:
    /// - a claim takes only the **head** of a group: its oldest unfinished row (smallest id, not
    ///   acked, not dead-lettered), and only when no row of the group is in work;
    /// - a retried head stays the head: its group waits for it, through a
    ///   [`retry_after`](crate::Delivery::retry_after) delay too; a head that is not yet due
    ///   ([`Message::deliver_after`](crate::Message::deliver_after)) blocks its group likewise;
    /// - a dead-lettered head frees its group (the next row becomes the head);
    /// - a row whose group value is `NULL` (a message that does not set the group column) is a
    ///   group of its own: it runs beside every other row, in no order (where the advisory
    ///   key template reads the group column, publish refuses such a message instead, see
    ///   [`Table::advisory_lock`]);
    /// - publish order is id order: two producers publishing to one group at once are ordered
    ///   by the ids the database gives them, and a row committed after a later one is not run
    ///   beside it (the group waits) but may run after it.
    ///
    /// The group guard holds across brokers and processes:
    /// - PostgreSQL takes a transaction-scoped advisory lock on the table and group in the
    ///   claim (row lock form: held until the delivery settles; lease form: the lease is
    ///   written in a second statement, under a snapshot taken while the lock is held);
    /// - MySQL/MariaDB reads the heads without locks, locks them by primary key, then locks
    ///   every unfinished row of the group `FOR UPDATE NOWAIT`: a group with a row in work, or
    ///   with a publish into it not yet committed, is skipped this round;
    /// - SQLite's one writer makes each claim atomic.
    ///
    /// - in the advisory lock form, the row's key is held for the delivery and a claim takes
    ///   only heads: a key rendered from the group column alone (`"orders-{customer}"`, the
    ///   natural choice) is the group's lock; any other template gets a second, per-group
    ///   key (`sqlbroker-fifo:<table>:<group>`) held with the row's, so the key template
    ///   still serialises what it names while the group keeps its order. A crash ends the
    ///   session and frees both: the head is claimable again at once.
    ///
    /// Forms: every form the database has (row lock, lease and advisory lock on PostgreSQL and
    /// MySQL/MariaDB; lease and advisory lock on SQLite, whose keys live in the process: one
    /// process per database file).
    ///
    /// [`Broker::create_table`](crate::Broker::create_table) adds the index the head check
    /// reads: `<table>_group (group, id)` over unfinished rows on PostgreSQL and SQLite (and,
    /// for a lease table, `<table>_group_leased (group, locked_until)`), `(group, dead_at, id)`
    /// on MySQL, so a claim stays index scans as the table grows.
    ///
    /// ```
    /// use sqlbroker::{Broker, Message, Table};
    /// use std::time::Duration;
    ///
    /// let broker = Broker::connect("sqlite::memory:")?;
    /// let orders = Table::new("orders").group("customer").fifo().lease(Duration::from_secs(30));
    /// broker.create_table(&orders)?;
    /// for (customer, n) in [("ann", 1), ("bob", 1), ("ann", 2)] {
    ///     let m = Message::new(format!("{customer} #{n}").into_bytes()).set("customer", customer);
    ///     broker.publish(&orders, m)?;
    /// }
    /// let sub = broker.subscription(&orders).start()?;
    /// // The heads of both groups, in parallel (in either order).
    /// let mut heads = vec![sub.next_delivery().unwrap(), sub.next_delivery().unwrap()];
    /// heads.sort_by_key(|d| d.id());
    /// assert_eq!(heads[0].payload(), b"ann #1");
    /// assert_eq!(heads[1].payload(), b"bob #1");
    /// // ann #2 waits for ann #1.
    /// assert!(sub.next_delivery_timeout(Duration::from_millis(300)).is_err());
    /// for d in heads {
    ///     d.ack()?;
    /// }
    /// let next = sub.next_delivery().unwrap();
    /// assert_eq!(next.payload(), b"ann #2");
    /// next.ack()?;
    /// # Ok::<(), sqlbroker::BrokerError>(())
    /// ```
    pub fn fifo(mut self) -> Self {
        self.fifo = true;
        self
    }

    /// The isolation level of claim transactions (row lock form; MySQL lease claims).
    /// Default: `READ COMMITTED`.
    pub fn isolation(mut self, level: Isolation) -> Self {
        self.isolation = Some(level);
        self
    }

    /// The most attempts a row gets: [`DEFAULT_MAX_ATTEMPTS`](Table::DEFAULT_MAX_ATTEMPTS)
    /// (25) unless set here. A retry or failure of the last attempt (a handler's `retry`,
    /// `fail`, an `Err` or a panic in [`Subscription::run`](crate::Subscription::run), a
    /// dropped delivery, a handler timeout) dead-letters the row instead, with a reason that
    /// names the attempt ("attempt 25 of max_attempts 25 failed: ..."); and a row claimed past
    /// the cap (its attempts spent by crashes or dropped deliveries, in the lease and advisory
    /// forms) is dead-lettered by the claim instead of delivered, so a message that kills its
    /// process cannot do so forever. At least 1; `u32::MAX` means no limit (the row retries
    /// until it succeeds, as every table did before the default was finite).
    ///
    /// ```
    /// use sqlbroker::Table;
    ///
    /// let default = Table::new("jobs"); // 25 attempts
    /// let patient = Table::new("imports").max_attempts(100);
    /// let forever = Table::new("pings").max_attempts(u32::MAX); // no limit
    /// # let _ = (default, patient, forever);
    /// ```
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = Some(n);
        self
    }

    /// The table's name as given.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The columns of the user's, in description order, with their types: what a tool needs
    /// to type the values it is given for a table it opened by name
    /// ([`Broker::open_table`](crate::Broker::open_table)).
    ///
    /// ```
    /// use sqlbroker::{ColumnType, Table};
    ///
    /// let t = Table::new("jobs").text_column("kind").int_column("tries");
    /// let cols: Vec<_> = t.columns().collect();
    /// assert_eq!(cols, [("kind", ColumnType::Text), ("tries", ColumnType::Int)]);
    /// ```
    pub fn columns(&self) -> impl Iterator<Item = (&str, ColumnType)> + '_ {
        self.columns.iter().map(|(n, t)| (n.as_str(), *t))
    }

    /// True if described with [`dependencies`](Table::dependencies): its jobs may wait on
    /// others.
    pub fn has_dependencies(&self) -> bool {
        self.dependencies
    }

    /// True if described with [`outputs`](Table::outputs).
    pub fn has_outputs(&self) -> bool {
        self.outputs
    }

    /// True if described with [`checkpoints`](Table::checkpoints).
    pub fn has_checkpoints(&self) -> bool {
        self.checkpoints
    }

    /// True if described with [`traceparent`](Table::traceparent).
    pub fn has_traceparent(&self) -> bool {
        self.traceparent
    }

    /// True if described with [`queues`](Table::queues).
    pub fn has_queues(&self) -> bool {
        self.queues
    }

    /// True if described with [`kinds`](Table::kinds).
    pub fn has_kinds(&self) -> bool {
        self.kinds
    }

    /// The form the description chooses.
    pub fn form(&self) -> Form {
        if self.advisory.is_some() {
            Form::AdvisoryLock
        } else if self.lease.is_some() {
            Form::Lease
        } else {
            Form::RowLock
        }
    }

    fn role_name(&self, role: Role) -> String {
        self.renames[role.index()]
            .clone()
            .unwrap_or_else(|| role.default_name().to_string())
    }

    /// Checks every identifier and the template, and resolves the roles. Runs no SQL.
    pub(crate) fn validate(&self) -> Result<TableSpec> {
        let bad = |reason: String| BrokerError::InvalidTable {
            table: self.name.clone(),
            reason,
        };
        if self.queues || self.kinds || self.only.is_some() {
            return self.validate_named(bad);
        }
        check_ident(&self.name, 48).map_err(|e| bad(format!("table name: {e}")))?;
        if self.lease.is_some() && self.advisory.is_some() {
            return Err(bad(
                "a table is either leased or advisory-locked, not both".into()
            ));
        }
        let form = self.form();
        let roles: Vec<String> = ROLES.iter().map(|r| self.role_name(*r)).collect();
        let mut seen: Vec<&str> = Vec::new();
        for (role, name) in ROLES.iter().zip(&roles) {
            if (*role == Role::LockedUntil && form != Form::Lease)
                || (*role == Role::DedupKey && !self.dedup)
                || (*role == Role::Priority && !self.priorities)
                || (*role == Role::CompletedAt && self.keep_completed.is_none())
                || (*role == Role::CancelRequested && form == Form::RowLock)
                || (*role == Role::Output && !self.outputs)
                || (*role == Role::Checkpoint && !self.checkpoints)
                || (*role == Role::Traceparent && !self.traceparent)
                || matches!(role, Role::Queue | Role::Kind)
            {
                continue;
            }
            check_ident(name, 63).map_err(|e| bad(format!("{:?} column: {e}", role)))?;
            if seen.iter().any(|s| s.eq_ignore_ascii_case(name)) {
                return Err(bad(format!("column {name:?} is named twice")));
            }
            seen.push(name);
        }
        for (name, _) in &self.columns {
            check_ident(name, 63).map_err(|e| bad(format!("column: {e}")))?;
            if seen.iter().any(|s| s.eq_ignore_ascii_case(name)) {
                return Err(bad(format!("column {name:?} is named twice")));
            }
            seen.push(name);
        }
        let key = match &self.advisory {
            Some(t) => Some(KeyTemplate::parse(t, &self.columns).map_err(bad)?),
            None => None,
        };
        let group =
            match &self.group {
                Some(g) => Some(self.columns.iter().position(|(c, _)| c == g).ok_or_else(
                    || bad(format!("group column {g:?} is not a column of the table")),
                )?),
                None => None,
            };
        if self.priorities && form == Form::AdvisoryLock {
            return Err(bad(
                "priorities are not supported in the advisory lock form (its claim pages by due \
                 time); use the lease or row lock form"
                    .into(),
            ));
        }
        let limits = self.validate_limits().map_err(bad)?;
        let rates = self.validate_rates().map_err(bad)?;
        let fair = self.validate_fair().map_err(bad)?;
        if self.max_attempts == Some(0) {
            return Err(bad("max_attempts must be at least 1".into()));
        }
        if self.fifo && group.is_none() {
            return Err(bad(
                "a FIFO table needs a group column (Table::group)".into()
            ));
        }
        if group.is_some() && !self.fifo {
            return Err(bad(
                "a group column does nothing without fifo(): add .fifo() for \
                 FIFO groups, or describe a plain column with .text_column()"
                    .into(),
            ));
        }
        if self.dependencies && self.fifo {
            return Err(bad(
                "dependencies do not combine with FIFO groups yet (a waiting row would hold \
                 its group)"
                    .into(),
            ));
        }
        if self.dependencies
            && self
                .isolation
                .is_some_and(|i| i != Isolation::ReadCommitted)
        {
            return Err(bad(
                "dependencies need READ COMMITTED claim transactions: a settlement reads the \
                 marks of others' settlements as they commit"
                    .into(),
            ));
        }
        let lease_secs = self
            .lease
            .map(crate::model::schedule::lease_secs)
            .unwrap_or(0);
        Ok(TableSpec {
            name: self.name.clone(),
            id: roles[0].clone(),
            payload: roles[1].clone(),
            attempts: roles[2].clone(),
            run_at: roles[3].clone(),
            locked_until: roles[4].clone(),
            dead_at: roles[5].clone(),
            dead_reason: roles[6].clone(),
            dedup_key: self.dedup.then(|| roles[7].clone()),
            priority: self.priorities.then(|| roles[8].clone()),
            completed_at: self.keep_completed.map(|_| roles[9].clone()),
            last_error: roles[10].clone(),
            errors: roles[11].clone(),
            cancel_requested: roles[12].clone(),
            created_at: roles[13].clone(),
            output: self.outputs.then(|| roles[14].clone()),
            checkpoint: self.checkpoints.then(|| roles[15].clone()),
            traceparent: self.traceparent.then(|| roles[16].clone()),
            retention_secs: self
                .keep_completed
                .map_or(0, |d| d.as_secs() + u64::from(d.subsec_nanos() > 0)),
            dead_retention_secs: self
                .keep_dead
                .map(|d| (d.as_secs() + u64::from(d.subsec_nanos() > 0)).max(1)),
            columns: self
                .columns
                .iter()
                .map(|(n, t)| Column {
                    name: n.clone(),
                    ty: *t,
                })
                .collect(),
            form,
            lease_secs,
            key,
            group,
            fifo: self.fifo,
            isolation: self.isolation.unwrap_or(Isolation::ReadCommitted),
            max_attempts: match self.max_attempts.unwrap_or(Table::DEFAULT_MAX_ATTEMPTS) {
                u32::MAX => None,
                n => Some(n),
            },
            limits,
            rates,
            fair,
            dependencies: self.dependencies,
            queue: None,
            kind: None,
            only: Vec::new(),
        })
    }

    /// [`Table::validate`] of a table with queues or kinds: they are text columns of the
    /// user's to everything but the claims' view (so a key template, a FIFO group or a limit
    /// may read them), appended after the user's own, or the user's own column of that name.
    fn validate_named(&self, bad: impl Fn(String) -> BrokerError) -> Result<TableSpec> {
        let mut plain = self.clone();
        plain.queues = false;
        plain.kinds = false;
        plain.only = None;
        let mut named = |on: bool, role: Role| -> Result<Option<String>> {
            let Some(name) = on.then(|| self.role_name(role)) else {
                return Ok(None);
            };
            match plain.columns.iter().find(|(c, _)| *c == name) {
                None => plain.columns.push((name.clone(), ColumnType::Text)),
                // A column of the user's is adopted only if it holds names (text).
                Some((_, ty)) if *ty != ColumnType::Text => {
                    return Err(bad(format!(
                        "column {name:?} holds the {}: a text column, not {ty:?}",
                        role.default_name()
                    )))
                }
                Some(_) => {}
            }
            Ok(Some(name))
        };
        let queue = named(self.queues, Role::Queue)?;
        let kind = named(self.kinds, Role::Kind)?;
        if let (Some(q), Some(k)) = (&queue, &kind) {
            if q == k {
                return Err(bad(format!(
                    "the queue and the kind are one column {q:?}: name them apart"
                )));
            }
        }
        let mut spec = plain.validate()?;
        let index = |spec: &TableSpec, name: &Option<String>| {
            name.as_ref().and_then(|n| spec.column_index(n))
        };
        spec.queue = index(&spec, &queue);
        spec.kind = index(&spec, &kind);
        if let Some(only) = self.only.as_deref() {
            for (what, set, col, on) in [
                ("queue", &only.queues, spec.queue, self.queues),
                ("kind", &only.kinds, spec.kind, self.kinds),
            ] {
                let Some(set) = set else { continue };
                let Some(col) = col.filter(|_| on) else {
                    return Err(bad(format!(
                        "a subscription of some {what}s on a table without them (describe it \
                         with Table::{what}s)"
                    )));
                };
                if set.is_empty() {
                    return Err(bad(format!("a subscription of no {what} at all")));
                }
                for n in set {
                    check_name(what, n).map_err(&bad)?;
                }
                spec.only.push((col, set.iter().cloned().collect()));
            }
        }
        Ok(spec)
    }

    /// The rate limits, checked as the concurrency limits are, each window within bounds.
    fn validate_rates(&self) -> std::result::Result<Vec<RateSpec>, String> {
        if self.rates.is_empty() {
            return Ok(Vec::new());
        }
        if self.fifo {
            return Err("rate limits do not combine with FIFO groups yet".into());
        }
        let mut out: Vec<RateSpec> = Vec::with_capacity(self.rates.len());
        for (key, max, per) in &self.rates {
            check_rate(*max).map_err(|e| format!("rate limit {key:?}: {e}"))?;
            if *per < Duration::from_millis(1) || *per > Table::MAX_RATE_WINDOW {
                return Err(format!(
                    "rate limit {key:?}: the window must be 1 ms..=1 day, not {per:?}"
                ));
            }
            let per_ms = per.as_millis().max(1) as i64;
            // Two windows of one key ("10 a second and 100 a minute") are two limits; the
            // same window twice is one given twice.
            if out.iter().any(|l| l.key == *key && l.per_ms == per_ms) {
                return Err(format!("rate limit {key:?} per {per:?} is given twice"));
            }
            let template = KeyTemplate::parse_limit(key, &self.columns)?;
            let lim = RateSpec::lim_of(key, per_ms);
            if let Some(other) = out.iter().find(|l| l.lim == lim) {
                return Err(format!(
                    "rate limits {key:?} and {:?} share the number their window slots are kept under (a hash collision): change either template",
                    other.key
                ));
            }
            out.push(RateSpec {
                key: key.clone(),
                template,
                max: *max,
                per_ms,
                lim,
            });
        }
        Ok(out)
    }

    /// The fair key, checked: a template that reads exactly one column, no FIFO groups.
    fn validate_fair(&self) -> std::result::Result<Option<FairSpec>, String> {
        let Some(key) = &self.fair else {
            return Ok(None);
        };
        if self.fifo {
            return Err("fair claims do not combine with FIFO groups yet".into());
        }
        let template = KeyTemplate::parse_limit(key, &self.columns)?;
        let mut cols: Vec<usize> = template.columns().collect();
        cols.dedup();
        match cols.as_slice() {
            [c] => Ok(Some(FairSpec {
                key: key.clone(),
                template,
                column: *c,
            })),
            [] => Err(format!(
                "fair key {key:?} reads no column: it must read exactly one (\"{{tenant}}\")"
            )),
            _ => Err(format!(
                "fair key {key:?} reads {} columns: it must read exactly one (\"{{tenant}}\")",
                cols.len()
            )),
        }
    }

    /// The concurrency limits, checked: templates over the table's columns, each once, `max`
    /// within bounds, no FIFO groups.
    fn validate_limits(&self) -> std::result::Result<Vec<LimitSpec>, String> {
        if self.limits.is_empty() {
            return Ok(Vec::new());
        }
        if self.fifo {
            return Err("concurrency limits do not combine with FIFO groups yet".into());
        }
        let mut out: Vec<LimitSpec> = Vec::with_capacity(self.limits.len());
        for (key, max) in &self.limits {
            check_concurrency(*max).map_err(|e| format!("concurrency limit {key:?}: {e}"))?;
            if out.iter().any(|l| l.key == *key) {
                return Err(format!("concurrency limit {key:?} is given twice"));
            }
            let template = KeyTemplate::parse_limit(key, &self.columns)?;
            let id = LimitSpec::id_of(key);
            if let Some(other) = out.iter().find(|l| l.id == id) {
                return Err(format!(
                    "concurrency limits {key:?} and {:?} share the name their slot keys are taken under (a hash collision): change either template",
                    other.key
                ));
            }
            out.push(LimitSpec {
                key: key.clone(),
                template,
                max: *max,
                id,
            });
        }
        Ok(out)
    }
}

/// A validated concurrency limit.
#[derive(Debug, Clone)]
pub(crate) struct LimitSpec {
    /// The template as given (the limit's name in the record and the operator's calls).
    pub key: String,
    pub template: KeyTemplate,
    /// The described `max` (an operator's setting in the record overrides it).
    pub max: u32,
    /// What the limit's slot keys are named by ([`LimitSpec::id_of`]).
    pub id: String,
}

impl LimitSpec {
    /// The name of a limit in its slot keys: a hash of what the limit is (its template), never
    /// of where it stands among the table's limits, so two services that list a table's limits
    /// in another order (one description to the record check) share every slot. Eight hex
    /// digits keep the slot keys short (MySQL's lock names are at most 64 characters before
    /// they are hashed); two limits of one table that collide are refused.
    pub fn id_of(key: &str) -> String {
        let h = stable_hash(&["concurrency", key]);
        format!("{:08x}", (h >> 32) ^ (h & 0xffff_ffff))
    }
}

/// A validated rate limit.
#[derive(Debug, Clone)]
pub(crate) struct RateSpec {
    /// The template as given (the limit's name in the record).
    pub key: String,
    pub template: KeyTemplate,
    /// The most claims of one key in any window.
    pub max: u32,
    /// The window, in milliseconds (at least 1).
    pub per_ms: i64,
    /// What the limit's window slots are kept under in `<table>_rates` ([`RateSpec::lim_of`]).
    pub lim: i64,
}

impl RateSpec {
    /// The number a rate limit's window slots are kept under: a hash of what the limit is (its
    /// template and window), never of its place among the table's limits, so two services that
    /// list them in another order share every window. 31 bits: the `lim` column is a 32-bit
    /// integer on every database; two limits of one table that collide are refused.
    pub fn lim_of(key: &str, per_ms: i64) -> i64 {
        let h = stable_hash(&["rate", key, &per_ms.to_string()]);
        ((h >> 33) ^ (h & 0x7fff_ffff)) as i64 & 0x7fff_ffff
    }

    /// The key of the rate limit's setting in the table's record (an operator's max):
    /// `<template> per <window in ms> ms`, so two windows of one key are set apart.
    pub fn setting_key(key: &str, per_ms: i64) -> String {
        format!("{key} per {per_ms} ms")
    }
}

/// FNV-1a over `parts` (each followed by a NUL, so no two lists of parts run together), 64
/// bits: the same on every platform and release, for names that every broker of a table must
/// compute alike.
pub(crate) fn stable_hash(parts: &[&str]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for part in parts {
        for b in part.bytes().chain([0]) {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

/// A validated fair key.
#[derive(Debug, Clone)]
pub(crate) struct FairSpec {
    /// The template as given.
    #[allow(dead_code)]
    pub key: String,
    pub template: KeyTemplate,
    /// The one column it reads (index into `columns`).
    pub column: usize,
}

/// Checks a rate limit's `max` is in `1..=`[`Table::MAX_RATE`].
pub(crate) fn check_rate(max: u32) -> std::result::Result<(), String> {
    if (1..=Table::MAX_RATE).contains(&max) {
        return Ok(());
    }
    Err(format!(
        "max must be 1..={} (pause a table to stop it), not {max}",
        Table::MAX_RATE
    ))
}

/// Checks a concurrency limit's `max` (described, or set at run time) is in
/// `1..=`[`Table::MAX_CONCURRENCY`].
pub(crate) fn check_concurrency(max: u32) -> std::result::Result<(), String> {
    if (1..=Table::MAX_CONCURRENCY).contains(&max) {
        return Ok(());
    }
    Err(format!(
        "max must be 1..={} (pause a table to stop it), not {max}",
        Table::MAX_CONCURRENCY
    ))
}

/// Checks `s` against `[A-Za-z_][A-Za-z0-9_]*` and a length limit.
pub(crate) fn check_ident(s: &str, max: usize) -> std::result::Result<(), String> {
    let mut chars = s.chars();
    let ok_first = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    if !ok_first || !chars.all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(format!(
            "{s:?} is not an identifier ([A-Za-z_][A-Za-z0-9_]*)"
        ));
    }
    if s.len() > max {
        return Err(format!("{s:?} is longer than {max} characters"));
    }
    Ok(())
}

/// A column of the user's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Column {
    pub name: String,
    pub ty: ColumnType,
}

/// A validated description: every identifier here may be quoted into SQL.
#[derive(Debug, Clone)]
pub(crate) struct TableSpec {
    pub name: String,
    pub id: String,
    pub payload: String,
    pub attempts: String,
    pub run_at: String,
    /// Only meaningful in the lease form.
    pub locked_until: String,
    pub dead_at: String,
    pub dead_reason: String,
    /// The dedup key column, tables with [`Table::dedup`] only.
    pub dedup_key: Option<String>,
    /// The priority column, tables with [`Table::priorities`] only.
    pub priority: Option<String>,
    /// The completion time column, tables with [`Table::keep_completed`] only.
    pub completed_at: Option<String>,
    /// The last failure's text.
    pub last_error: String,
    /// The count of failures.
    pub errors: String,
    /// The cancel request of a row in work (lease, advisory lock).
    pub cancel_requested: String,
    /// The publish time, the server's clock (every table).
    pub created_at: String,
    /// How long completed rows are kept (tables with [`Table::keep_completed`]).
    pub retention_secs: u64,
    /// How long dead letters are kept ([`Table::keep_dead`]; `None`: until an operator acts).
    pub dead_retention_secs: Option<u64>,
    pub columns: Vec<Column>,
    pub form: Form,
    pub lease_secs: u64,
    pub key: Option<KeyTemplate>,
    /// Index into `columns`: the group column ([`TableSpec::fifo_group`]).
    pub group: Option<usize>,
    pub fifo: bool,
    #[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
    pub isolation: Isolation,
    /// `None`: no limit (asked for with `max_attempts(u32::MAX)`); unset is the default.
    pub max_attempts: Option<u32>,
    /// The concurrency limits, in the order described.
    pub limits: Vec<LimitSpec>,
    /// The rate limits, in the order described.
    pub rates: Vec<RateSpec>,
    /// The fair key, if claims rotate across keys.
    pub fair: Option<FairSpec>,
    /// Rows may wait on other jobs and be waited on ([`Table::dependencies`]).
    pub dependencies: bool,
    /// The output column ([`Table::outputs`]).
    pub output: Option<String>,
    /// The checkpoint column ([`Table::checkpoints`]).
    pub checkpoint: Option<String>,
    /// The trace context column ([`Table::traceparent`]).
    pub traceparent: Option<String>,
    /// Index into `columns`: the queue column ([`Table::queues`]).
    pub queue: Option<usize>,
    /// Index into `columns`: the kind column ([`Table::kinds`]).
    pub kind: Option<usize>,
    /// A subscription's view: its claims take only rows whose column (an index into
    /// `columns`) holds one of the values, each a checked name ([`check_name`]).
    pub only: Vec<(usize, Vec<String>)>,
}

impl TableSpec {
    pub fn column_index(&self, name: &str) -> Option<usize> {
        self.columns.iter().position(|c| c.name == name)
    }

    /// The user columns' values of a row as the description types them: SQLite keeps a time
    /// as integer seconds, which reads back as a time here, as it does on the others.
    pub fn typed_values(&self, values: impl IntoIterator<Item = Value>) -> Vec<Value> {
        values
            .into_iter()
            .enumerate()
            .map(|(i, v)| match (self.columns.get(i).map(|c| c.ty), v) {
                (Some(ColumnType::Time), Value::Int(secs)) => {
                    Value::Time(crate::model::schedule::from_epoch_secs(secs))
                }
                (_, v) => v,
            })
            .collect()
    }

    /// Values an insert binds per row: payload, run_at, the user columns, the priority, the
    /// dedup key, the trace context.
    pub fn insert_width(&self) -> usize {
        2 + self.columns.len()
            + usize::from(self.priority.is_some())
            + usize::from(self.dedup_key.is_some())
            + usize::from(self.traceparent.is_some())
    }

    /// The user columns every message must set (indexes into `columns`): those the key
    /// template reads. A message that left one out would share the key its literal parts make
    /// (`accounts-`) with every other such message, and they would all run one at a time.
    /// No allocation: publish asks it for every message (a column the template reads twice
    /// comes twice).
    pub fn required_columns(&self) -> impl Iterator<Item = usize> + '_ {
        self.key
            .iter()
            .chain(self.limits.iter().map(|l| &l.template))
            .chain(self.rates.iter().map(|l| &l.template))
            .chain(self.fair.iter().map(|f| &f.template))
            .flat_map(KeyTemplate::columns)
    }

    /// What `recorded` (the table's record, as validated) holds that this description does not
    /// enforce when it claims: a concurrency limit or rate window it lacks, a fair key, FIFO
    /// groups, dependencies, another form. One line each; empty when it enforces all of it.
    pub fn unenforced(&self, recorded: &TableSpec) -> Vec<String> {
        let mut out = Vec::new();
        if recorded.form != self.form {
            out.push(format!(
                "the table's record now says the {} form, this description the {} form",
                recorded.form.name(),
                self.form.name()
            ));
        }
        for l in &recorded.limits {
            if !self.limits.iter().any(|m| m.key == l.key) {
                out.push(format!(
                    "the table's record now has the concurrency limit {:?}, which this \
                     description lacks",
                    l.key
                ));
            }
        }
        for r in &recorded.rates {
            if !self
                .rates
                .iter()
                .any(|m| m.key == r.key && m.per_ms == r.per_ms)
            {
                out.push(format!(
                    "the table's record now has the rate limit {:?} per {} ms, which this \
                     description lacks",
                    r.key, r.per_ms
                ));
            }
        }
        if recorded.fair.as_ref().map(|f| &f.key) != self.fair.as_ref().map(|f| &f.key)
            && recorded.fair.is_some()
        {
            out.push("the table's record now has fair claims this description lacks".into());
        }
        if recorded.fifo_group().is_some() && self.fifo_group().is_none() {
            out.push("the table's record now has FIFO groups, which this description lacks".into());
        }
        if recorded.dependencies && !self.dependencies {
            out.push(
                "the table's record now has dependencies, which this description lacks".into(),
            );
        }
        out
    }

    /// What reads user column `col` among the templates a message must fill
    /// ([`required_columns`](Self::required_columns)), in words: the first that does.
    pub fn reader_of(&self, col: usize) -> String {
        let reads = |t: &KeyTemplate| t.columns().any(|c| c == col);
        if self.key.as_ref().is_some_and(reads) {
            return "the advisory key template".into();
        }
        if let Some(l) = self.limits.iter().find(|l| reads(&l.template)) {
            return format!("the concurrency limit {:?}", l.key);
        }
        if let Some(r) = self.rates.iter().find(|r| reads(&r.template)) {
            return format!("the rate limit {:?}", r.key);
        }
        match &self.fair {
            Some(f) if reads(&f.template) => format!("the fair key {:?}", f.key),
            _ => "a key template".into(),
        }
    }

    /// True if a claim decides more than the form's own hold: concurrency or rate limits, or
    /// fair claims (the claims that read candidates and choose among them).
    pub fn flow_controlled(&self) -> bool {
        !self.limits.is_empty() || !self.rates.is_empty() || self.fair.is_some()
    }

    /// The user columns the concurrency and rate limits read (indexes into `columns`,
    /// ascending, each once).
    pub fn flow_columns(&self) -> Vec<usize> {
        columns_read(
            self.limits
                .iter()
                .map(|l| &l.template)
                .chain(self.rates.iter().map(|r| &r.template)),
        )
    }

    /// The group column of a FIFO table.
    pub fn fifo_group(&self) -> Option<&str> {
        self.group
            .filter(|_| self.fifo)
            .and_then(|i| self.columns.get(i))
            .map(|c| c.name.as_str())
    }
}

/// The user columns `templates` read (indexes into `columns`, ascending, each once).
fn columns_read<'a>(templates: impl Iterator<Item = &'a KeyTemplate>) -> Vec<usize> {
    let mut cols: Vec<usize> = templates.flat_map(KeyTemplate::columns).collect();
    cols.sort_unstable();
    cols.dedup();
    cols
}

/// An advisory key template, parsed and checked against the columns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KeyTemplate {
    parts: Vec<KeyPart>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum KeyPart {
    Lit(String),
    /// Index into the user columns.
    Col(usize),
}

impl KeyTemplate {
    fn parse(t: &str, columns: &[(String, ColumnType)]) -> std::result::Result<Self, String> {
        if t.is_empty() {
            return Err("the advisory lock template is empty".into());
        }
        Self::parse_limit(t, columns)
    }

    /// A concurrency limit's template: as [`KeyTemplate::parse`], and the empty template is
    /// one key for the whole table.
    fn parse_limit(t: &str, columns: &[(String, ColumnType)]) -> std::result::Result<Self, String> {
        // A key is text on every database, and PostgreSQL text cannot hold a NUL: such a key
        // would fail every claim of the table, so the template is refused here instead.
        if t.contains('\0') {
            return Err(format!(
                "template {t:?} contains a NUL character, which a key cannot hold"
            ));
        }
        let mut parts = Vec::new();
        let mut lit = String::new();
        let mut chars = t.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '{' if chars.peek() == Some(&'{') => {
                    chars.next();
                    lit.push('{');
                }
                '}' if chars.peek() == Some(&'}') => {
                    chars.next();
                    lit.push('}');
                }
                '{' => {
                    // The placeholder runs to the next '}', which must be there: it is not
                    // enough that the same `{name}` is closed elsewhere in the template.
                    let mut name = String::new();
                    let mut closed = false;
                    for c in chars.by_ref() {
                        if c == '}' {
                            closed = true;
                            break;
                        }
                        name.push(c);
                    }
                    if !closed {
                        return Err(format!("unclosed '{{' in template {t:?}"));
                    }
                    let idx = columns
                        .iter()
                        .position(|(c, _)| *c == name)
                        .ok_or_else(|| {
                            format!(
                                "template {t:?} names {name:?}, which is not a column of the table"
                            )
                        })?;
                    if !lit.is_empty() {
                        parts.push(KeyPart::Lit(std::mem::take(&mut lit)));
                    }
                    parts.push(KeyPart::Col(idx));
                }
                '}' => return Err(format!("unmatched '}}' in template {t:?}")),
                c => lit.push(c),
            }
        }
        if !lit.is_empty() {
            parts.push(KeyPart::Lit(lit));
        }
        Ok(KeyTemplate { parts })
    }

    /// True if rows with equal values in user column `col` always render equal keys: the
    /// template reads no other column. A FIFO group column with this property needs no key
    /// of its own (form/advisory.rs).
    pub fn reads_only(&self, col: usize) -> bool {
        self.parts
            .iter()
            .all(|p| !matches!(p, KeyPart::Col(c) if *c != col))
    }

    /// The user columns the template reads (indexes into `columns`).
    pub fn columns(&self) -> impl Iterator<Item = usize> + '_ {
        self.parts.iter().filter_map(|p| match p {
            KeyPart::Col(i) => Some(*i),
            KeyPart::Lit(_) => None,
        })
    }

    /// The key of a row whose user columns hold `values`.
    pub fn render(&self, values: &[crate::model::value::Value]) -> String {
        let mut out = String::new();
        for p in &self.parts {
            match p {
                KeyPart::Lit(s) => out.push_str(s),
                KeyPart::Col(i) => {
                    if let Some(v) = values.get(*i) {
                        v.render_into(&mut out)
                    }
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::value::Value;

    fn invalid(t: &Table) -> String {
        match t.validate() {
            Err(BrokerError::InvalidTable { reason, .. }) => reason,
            other => panic!("expected InvalidTable, got {other:?}"),
        }
    }

    #[test]
    fn forms() {
        assert_eq!(Table::new("a").form(), Form::RowLock);
        assert_eq!(
            Table::new("a").lease(Duration::from_secs(1)).form(),
            Form::Lease
        );
        assert_eq!(
            Table::new("a").text_column("k").advisory_lock("{k}").form(),
            Form::AdvisoryLock
        );
        let s = Table::new("a")
            .lease(Duration::from_millis(1500))
            .validate()
            .unwrap();
        assert_eq!(s.lease_secs, 2);
    }

    #[test]
    fn identifiers_carrying_sql_are_refused() {
        assert!(invalid(&Table::new("jobs; DROP TABLE x")).contains("not an identifier"));
        assert!(invalid(&Table::new("jobs\"")).contains("not an identifier"));
        assert!(invalid(&Table::new("")).contains("not an identifier"));
        assert!(invalid(&Table::new("1jobs")).contains("not an identifier"));
        assert!(invalid(&Table::new("a".repeat(49))).contains("longer than 48"));
        assert!(invalid(&Table::new("jobs").text_column("a b")).contains("not an identifier"));
        assert!(
            invalid(&Table::new("jobs").rename(Role::Payload, "x`y")).contains("not an identifier")
        );
        assert!(invalid(&Table::new("jobs").text_column("payload")).contains("named twice"));
        assert!(invalid(&Table::new("jobs").rename(Role::Id, "attempts")).contains("named twice"));
    }

    #[test]
    fn templates() {
        let t = Table::new("p").text_column("account").int_column("n");
        assert!(invalid(&t.clone().advisory_lock("accounts-{acount}")).contains("not a column"));
        assert!(invalid(&t.clone().advisory_lock("accounts-{account")).contains("unclosed"));
        assert!(invalid(&t.clone().advisory_lock("a}")).contains("unmatched"));
        assert!(invalid(&t.clone().advisory_lock("")).contains("empty"));
        assert!(
            invalid(&t.clone().lease(Duration::from_secs(1)).advisory_lock("x"))
                .contains("not both")
        );
        let s = t.advisory_lock("acc-{account}/{n}{{}}").validate().unwrap();
        let key = s.key.unwrap();
        assert_eq!(
            key.render(&[Value::from("a-17"), Value::Int(4)]),
            "acc-a-17/4{}"
        );
        assert_eq!(key.render(&[Value::Null, Value::Int(-1)]), "acc-/-1{}");
    }

    #[test]
    fn roles_and_groups() {
        let s = Table::new("orders")
            .group("customer")
            .fifo()
            .rename(Role::Payload, "body")
            .validate()
            .unwrap();
        assert_eq!(s.payload, "body");
        assert_eq!(s.group, Some(0));
        assert_eq!(s.columns[0].name, "customer");
        assert!(invalid(&Table::new("o").fifo()).contains("group column"));
        assert!(invalid(&Table::new("o").group("customer")).contains("without fifo()"));
        // A template that reads the group column alone (or no column) covers the group.
        let reads = |t: &str| {
            let spec = Table::new("o")
                .group("customer")
                .fifo()
                .text_column("k")
                .advisory_lock(t)
                .validate()
                .unwrap();
            spec.key.unwrap().reads_only(spec.group.unwrap())
        };
        assert!(reads("o-{customer}") && reads("{customer}/{customer}") && reads("all"));
        assert!(!reads("o-{k}") && !reads("{customer}-{k}"));
        assert!(invalid(&Table::new("o").max_attempts(0)).contains("at least 1"));
        assert_eq!(
            Table::new("o")
                .max_attempts(3)
                .validate()
                .unwrap()
                .max_attempts,
            Some(3)
        );
        // Unset: the finite default; `u32::MAX`: no limit.
        let max = |t: Table| t.validate().unwrap().max_attempts;
        assert_eq!(max(Table::new("o")), Some(Table::DEFAULT_MAX_ATTEMPTS));
        assert_eq!(Table::DEFAULT_MAX_ATTEMPTS, 25);
        assert_eq!(max(Table::new("o").max_attempts(u32::MAX)), None);
        // locked_until is only checked in the lease form.
        Table::new("o")
            .rename(Role::LockedUntil, "bad name")
            .validate()
            .unwrap();
    }

    /// Regressions found by the property tests below.
    #[test]
    fn template_regressions() {
        let t = Table::new("p").text_column("k");
        // A placeholder left open was accepted when the same `{k}` was closed earlier in the
        // template (the parser looked for `{k}` anywhere in the string): `"{k}-{k"` rendered
        // as if it were `"{k}-{k}"`.
        assert!(invalid(&t.clone().advisory_lock("{k}-{k")).contains("unclosed"));
        assert!(invalid(&t.clone().advisory_lock("a{k}b{k")).contains("unclosed"));
        // A NUL in the template was accepted, and then failed every claim on PostgreSQL
        // ("invalid byte sequence for encoding UTF8: 0x00") while the subscription stayed up
        // delivering nothing.
        assert!(invalid(&t.clone().advisory_lock("a\0{k}")).contains("NUL"));
        assert!(invalid(&t.clone().advisory_lock("\0")).contains("NUL"));
        // Braces, quotes and SQL in the literal parts are only text.
        let s = t
            .advisory_lock("'; DROP TABLE x; --{{\"`}}{k}\u{1F980}")
            .validate()
            .unwrap();
        assert_eq!(
            s.key.unwrap().render(&[Value::from("\u{e9}'")]),
            "'; DROP TABLE x; --{\"`}\u{e9}'\u{1F980}"
        );
    }

    /// Property tests: arbitrary strings as the table name, column names, role renames and
    /// templates never make `validate` panic, and it accepts exactly the identifiers
    /// `[A-Za-z_][A-Za-z0-9_]*` within the documented limits (48 characters for the table, 63
    /// for columns), named once each (ASCII case ignored), and exactly the templates a reference
    /// parser accepts, rendering the same keys.
    mod fuzz {
        use super::*;
        use proptest::prelude::*;

        /// The oracle for identifiers, written over bytes (the implementation works on chars).
        fn is_ident(s: &str, max: usize) -> bool {
            let b = s.as_bytes();
            !b.is_empty()
                && b.len() <= max
                && (b[0].is_ascii_alphabetic() || b[0] == b'_')
                && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'_')
        }

        /// Arbitrary strings, identifiers around the length limits, and near misses (quotes,
        /// SQL punctuation, NUL, non-ASCII letters that case-fold oddly: `\u{130}`, `\u{212A}`).
        fn names() -> impl Strategy<Value = String> {
            prop_oneof![
                any::<String>(),
                "[A-Za-z_][A-Za-z0-9_]{0,70}",
                "[A-Za-z0-9_ ;'\"`.\\-\\x00\u{e9}\u{df}\u{130}\u{212A}\u{1F980}]{0,70}",
                // Role names in other cases, to collide with.
                "(id|ID|Id|payload|PAYLOAD|attempts|run_at|RUN_AT|locked_until|dead_at|dead_reason|k|K)",
            ]
        }

        fn column_type() -> impl Strategy<Value = ColumnType> {
            prop_oneof![
                Just(ColumnType::Text),
                Just(ColumnType::Int),
                Just(ColumnType::Float),
                Just(ColumnType::Bytes),
                Just(ColumnType::Time),
            ]
        }

        /// The oracle for a whole description: what `validate` must accept.
        #[allow(clippy::too_many_arguments)]
        fn model_accepts(
            name: &str,
            renames: &[(usize, String)],
            columns: &[(String, ColumnType)],
            group: &Option<String>,
            lease: bool,
            fifo: bool,
            max_attempts: Option<u32>,
        ) -> bool {
            if !is_ident(name, 48) {
                return false;
            }
            let mut roles: Vec<String> = ROLES.iter().map(|r| r.default_name().into()).collect();
            for (i, n) in renames {
                roles[*i] = n.clone();
            }
            let mut names: Vec<String> = roles
                .into_iter()
                .enumerate()
                .filter(|(i, _)| {
                    lease || !matches!(ROLES[*i], Role::LockedUntil | Role::CancelRequested)
                })
                // No table here has dedup keys, priorities, kept completed rows, outputs,
                // checkpoints, a trace context, queues or kinds: their roles are not checked.
                .filter(|(i, _)| {
                    !matches!(
                        ROLES[*i],
                        Role::DedupKey
                            | Role::Priority
                            | Role::CompletedAt
                            | Role::Output
                            | Role::Checkpoint
                            | Role::Traceparent
                            | Role::Queue
                            | Role::Kind
                    )
                })
                .map(|(_, n)| n)
                .collect();
            names.extend(columns.iter().map(|(c, _)| c.clone()));
            if let Some(g) = group {
                if !columns.iter().any(|(c, _)| c == g) {
                    names.push(g.clone());
                }
            }
            for (i, n) in names.iter().enumerate() {
                if !is_ident(n, 63) {
                    return false;
                }
                // ASCII case folded by setting bit 5: exact over identifier bytes (digits have
                // it already, `_` becomes DEL, which no other identifier byte becomes).
                if names[..i]
                    .iter()
                    .any(|m| m.bytes().map(|b| b | 0x20).eq(n.bytes().map(|b| b | 0x20)))
                {
                    return false;
                }
            }
            fifo == group.is_some() && max_attempts != Some(0)
        }

        #[derive(Debug, Clone, PartialEq)]
        enum Part {
            Lit(String),
            Col(usize),
        }

        /// The oracle for templates: an index-walking parser over chars.
        fn model_template(t: &str, cols: &[&str]) -> Option<Vec<Part>> {
            if t.is_empty() || t.contains('\0') {
                return None;
            }
            let c: Vec<char> = t.chars().collect();
            let (mut i, mut out, mut lit) = (0, Vec::new(), String::new());
            while i < c.len() {
                match (c[i], c.get(i + 1)) {
                    ('{', Some('{')) | ('}', Some('}')) => {
                        lit.push(c[i]);
                        i += 2;
                    }
                    ('{', _) => {
                        let end = i + 1 + c[i + 1..].iter().position(|x| *x == '}')?;
                        let name: String = c[i + 1..end].iter().collect();
                        let idx = cols.iter().position(|x| *x == name)?;
                        if !lit.is_empty() {
                            out.push(Part::Lit(std::mem::take(&mut lit)));
                        }
                        out.push(Part::Col(idx));
                        i = end + 1;
                    }
                    ('}', _) => return None,
                    (x, _) => {
                        lit.push(x);
                        i += 1;
                    }
                }
            }
            if !lit.is_empty() {
                out.push(Part::Lit(lit));
            }
            Some(out)
        }

        /// Templates built from the pieces that matter: placeholders of known and unknown
        /// columns, escaped and stray braces, NUL, quotes and SQL.
        fn templates() -> impl Strategy<Value = String> {
            let piece = prop_oneof![
                Just("{a}".to_string()),
                Just("{b_2}".to_string()),
                Just("{a".to_string()),
                Just("{b_2".to_string()),
                Just("{{".to_string()),
                Just("}}".to_string()),
                Just("{".to_string()),
                Just("}".to_string()),
                Just("{zz}".to_string()),
                Just("{}".to_string()),
                Just("{A}".to_string()),
                Just("\0".to_string()),
                "[a-z'\";\\ \u{e9}\u{1F980}-]{1,3}",
            ];
            prop_oneof![
                3 => prop::collection::vec(piece, 0..8).prop_map(|v| v.concat()),
                1 => any::<String>(),
            ]
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(256))]

            #[test]
            fn table_names(name in names()) {
                let r = Table::new(name.as_str()).validate();
                prop_assert_eq!(r.is_ok(), is_ident(&name, 48), "{:?}: {:?}", name, r.err());
                if let Err(e) = r {
                    prop_assert!(
                        matches!(&e, BrokerError::InvalidTable { table, .. } if *table == name),
                        "{:?}", e
                    );
                }
            }

            #[test]
            fn descriptions(
                name in prop_oneof![Just("jobs".to_string()), names()],
                renames in prop::collection::vec((0..ROLES.len(), names()), 0..3),
                columns in prop::collection::vec((names(), column_type()), 0..3),
                group in prop::option::of(names()),
                lease in any::<bool>(),
                fifo in any::<bool>(),
                max_attempts in prop::option::of(0u32..3),
            ) {
                let mut t = Table::new(name.as_str());
                for (i, n) in &renames {
                    t = t.rename(ROLES[*i], n.as_str());
                }
                for (c, ty) in &columns {
                    t = t.column(c.as_str(), *ty);
                }
                if let Some(g) = &group {
                    t = t.group(g.as_str());
                }
                if lease {
                    t = t.lease(Duration::from_secs(1));
                }
                if fifo {
                    t = t.fifo();
                }
                if let Some(n) = max_attempts {
                    t = t.max_attempts(n);
                }
                let expected =
                    model_accepts(&name, &renames, &columns, &group, lease, fifo, max_attempts);
                let r = t.validate();
                prop_assert_eq!(r.is_ok(), expected, "{:?}: {:?}", t, r.err());
                match r {
                    Ok(spec) => {
                        // Every identifier the dialects will quote is one.
                        let mut all = vec![
                            &spec.name, &spec.id, &spec.payload, &spec.attempts, &spec.run_at,
                            &spec.dead_at, &spec.dead_reason,
                        ];
                        if lease {
                            all.push(&spec.locked_until);
                        }
                        all.extend(spec.columns.iter().map(|c| &c.name));
                        for n in all {
                            prop_assert!(is_ident(n, 63), "{:?}", n);
                        }
                    }
                    Err(e) => prop_assert!(matches!(e, BrokerError::InvalidTable { .. }), "{:?}", e),
                }
            }

            #[test]
            fn advisory_templates(template in templates(), text in any::<String>(), n in any::<i64>()) {
                let t = Table::new("t").text_column("a").int_column("b_2");
                let expected = model_template(&template, &["a", "b_2"]);
                let r = t.clone().advisory_lock(template.as_str()).validate();
                prop_assert_eq!(r.is_ok(), expected.is_some(), "{:?}: {:?}", template, r.err());
                match (r, expected) {
                    (Ok(spec), Some(parts)) => {
                        let values = [Value::Text(text.clone()), Value::Int(n)];
                        let mut key = String::new();
                        for p in parts {
                            match p {
                                Part::Lit(s) => key.push_str(&s),
                                Part::Col(0) => key.push_str(&text),
                                Part::Col(_) => key.push_str(&n.to_string()),
                            }
                        }
                        prop_assert_eq!(spec.key.unwrap().render(&values), key);
                    }
                    (Err(e), None) => {
                        prop_assert!(matches!(e, BrokerError::InvalidTable { .. }), "{:?}", e)
                    }
                    _ => unreachable!(),
                }
                // Never both forms.
                prop_assert!(t.lease(Duration::from_secs(1)).advisory_lock(template).validate().is_err());
            }
        }
    }
}
