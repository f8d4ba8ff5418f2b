//! The seam between the queue logic and each database. Uses only the model and the errors:
//! it knows nothing of the runtime, the broker, subscriptions or operator calls.
//!
//! Everything database-specific lives below this module, one folder per database and one file
//! per concern (`sql`, `protocol`, `conn`, `values`, `version`): the SQL text, the driver
//! calls, the version floors and the error classification. The queue logic above sees only
//! [`Dialect`] (per database), [`DbConn`] (per connection, `conn`) and the advisory key
//! bookkeeping (`keys`), never a driver type.
//!
//! SQL is built once per table, when the table is first used, from a validated
//! [`TableSpec`]: identifiers are checked against
//! `[A-Za-z_][A-Za-z0-9_]*` before they are quoted here, and every value travels as a bound
//! parameter.
//!
//! Row layout: every statement that returns a claimed row returns, in order,
//! `id, attempts, payload, <user columns in description order>, run_at` ([`ROW_USER_COLUMNS`] is where
//! the user columns start).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::error::{BrokerError, DbError};
use crate::model::table::{Form, TableSpec};
use crate::model::value::Value;
pub(crate) use conn::DbConn;

pub(crate) mod collect;
pub(crate) mod conn;
pub(crate) mod deps;
#[cfg(any(
    feature = "diesel-postgres",
    feature = "diesel-mysql",
    feature = "diesel-sqlite"
))]
pub(crate) mod diesel;
pub(crate) mod flow;
pub(crate) mod keys;
#[cfg(feature = "mysql")]
pub(crate) mod mysql;
#[cfg(feature = "postgres")]
pub(crate) mod postgres;
pub(crate) mod queues;
pub(crate) mod shared;
pub(crate) mod signals;
#[cfg(feature = "sqlite")]
pub(crate) mod sqlite;
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) mod url;

/// Where the user columns start in a claimed row.
pub(crate) const ROW_USER_COLUMNS: usize = 3;

/// Savepoints of a row lock delivery's transaction, the same on both servers: `WORK` marks
/// where the handler's own SQL begins (every outcome but the ack rolls back to it), `HANDLER`
/// brackets one `in_delivery` call (rolled back if it fails).
// Used by the servers' row lock form only.
#[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
pub(crate) mod savepoint {
    pub const WORK: &str = "SAVEPOINT sqlbroker_work";
    pub const UNDO_WORK: &str = "ROLLBACK TO SAVEPOINT sqlbroker_work";
    pub const HANDLER: &str = "SAVEPOINT sqlbroker_handler";
    pub const KEEP_HANDLER: &str = "RELEASE SAVEPOINT sqlbroker_handler";
    pub const UNDO_HANDLER: &str = "ROLLBACK TO SAVEPOINT sqlbroker_handler";
}

#[derive(Debug, Clone, Default)]
/// [`LimitSql::except`]: the candidates without the rows whose `column` holds one of the
/// values given (and, in some shapes, without those whose `column` is `NULL`), one statement
/// per shape ([`except_shapes`], indexed by [`except_index`]): `2^k` values, the last
/// repeated to fill a class.
pub(crate) struct ExceptSql {
    /// The user column the limit's key reads.
    pub column: usize,
    /// The limits (their places in the table's) whose key reads `column` alone.
    pub limits: Vec<usize>,
    /// `(now, now, value.., limit)` -> as [`LimitSql::candidates`]`[0]`.
    pub candidates: Vec<String>,
    /// `(now, now, run_at, id, value.., limit)` -> as [`LimitSql::candidates_from`]`[0]`
    /// (advisory: [`TableSql::advisory_except`]).
    pub candidates_from: Option<Vec<String>>,
}

/// How many size classes of values [`ExceptSql`] has: up to `2^(EXCEPT_CLASSES - 1)` (128)
/// keys left out a claim.
pub(crate) const EXCEPT_CLASSES: u32 = 8;

/// The shapes of [`ExceptSql`]'s statements, in order: `(null, n)`, leaving `n` values out,
/// and the `NULL` key too with `null`. `n` is a power of two; 0 only with `null`.
pub(crate) fn except_shapes() -> impl Iterator<Item = (bool, usize)> {
    let classes = (0..EXCEPT_CLASSES).map(|k| 1usize << k);
    classes
        .clone()
        .map(|n| (false, n))
        .chain(std::iter::once((true, 0)))
        .chain(classes.map(|n| (true, n)))
}

/// The place in [`except_shapes`] of the shape leaving out `values` values (padded up to a
/// power of two) and, with `null`, the `NULL` key: the place and the padded count; `None`
/// when it leaves out nothing.
pub(crate) fn except_index(null: bool, values: usize) -> Option<(usize, usize)> {
    let padded = match values {
        0 => 0,
        n => n.next_power_of_two(),
    };
    let k = padded.trailing_zeros() as usize;
    match (null, padded) {
        (false, 0) => None,
        (false, _) => Some((k, padded)),
        (true, 0) => Some((EXCEPT_CLASSES as usize, 0)),
        (true, _) => Some((EXCEPT_CLASSES as usize + 1 + k, padded)),
    }
}

/// The lease claim of a table with concurrency limits ([`Table::concurrency_limit`]), in
/// several statements run in one transaction that first locks the table's record
/// ([`RegistrySql::limits_locked`]), so claims of the table take turns and each counts what the
/// last committed. Parameters are listed as `(..)`.
///
/// [`Table::concurrency_limit`]: crate::Table::concurrency_limit
#[derive(Debug, Clone, Default)]
pub(crate) struct LimitSql {
    /// Opens the claim's transaction: READ COMMITTED, so each statement after the lock reads
    /// what was committed before it was granted (SQLite: `BEGIN IMMEDIATE`, the one writer).
    ///
    /// Modelled in model/limits.pml (count_and_choose).
    pub begin: Vec<String>,
    /// Row lock form, PostgreSQL: `(name)` -> 1 if the slot key was taken until the
    /// transaction ends, 0 if held elsewhere. The slots are then taken inside the claim's
    /// transaction and end with it. `None`: session keys ([`TableSql::key_lock`]), unlocked
    /// after the transaction (MySQL).
    pub slot_xact_lock: Option<String>,
    /// With `slot_xact_lock`: `(name)` takes the slot key for the session (at once, as the
    /// session holds it for the transaction), and `(name)` lets that go: what holds a slot
    /// across a row lock checkpoint's commit, until the chained transaction takes it again.
    pub slot_bridge: Option<[String; 2]>,
    /// SQLite: `begin` takes the one writer's lock, so the claim's turn comes with its
    /// transaction and its first count decides (no turn to wait for later).
    pub turn_at_begin: bool,
    /// `(now)` -> `count, <user columns>`: how many unfinished rows are leased (in work) per
    /// key, the columns the limits read in their places and `NULL` in the others.
    ///
    /// Modelled in model/limits.pml (count_and_choose).
    pub in_work: String,
    /// `(now, now, limit)` -> `id, <user columns>` of up to `limit` claimable rows in claim
    /// order: `[0]` locking nothing, `[1]` (a claim's first page) on the servers locked `FOR
    /// UPDATE SKIP LOCKED` (rows another claim holds are passed by). Row lock form: `[0]`,
    /// `(now, limit)`.
    ///
    /// Modelled in model/limits.pml (count_and_choose).
    pub candidates: [String; 2],
    /// PostgreSQL lease tables without priorities: `(now, now, run_at, id, limit)` -> `id,
    /// run_at, <user columns>` of the candidates after the row `(run_at, id)`, read from the
    /// subscription's claim [cursor](crate::runtime::cursor) past the dead index entries of
    /// rows already claimed (`candidates` then also starts each row with `id, run_at`).
    pub candidates_from: Option<[String; 2]>,
    /// Lease tables, one per concurrency limit whose key reads one column: a later page's
    /// candidates with the rows of keys found at their max left out by that column's value,
    /// so a key at its max with a long backlog ahead in claim order does not hide the other
    /// keys' rows from every claim (a claim reads at most 10,000 rows, `SCAN_MAX`).
    pub except: Vec<ExceptSql>,
    /// The servers, per size class: `(now, now, id x 2^k)` -> `id, claimable (1 or 0)` of those
    /// rows not locked elsewhere, locked `FOR UPDATE SKIP LOCKED` by primary key: the rows a
    /// claim chose past its first page.
    pub lock: Vec<String>,
    /// SQLite, per id-list size class `k` (padded by repeating the last id): `(token, now,
    /// now, id x 2^k)` leases those of the rows still claimable, counting their attempts,
    /// returning them. Row lock form: one statement, `(id, now)` -> the row, locked `FOR
    /// UPDATE SKIP LOCKED`, if it is still claimable.
    pub take: Vec<String>,
    /// The servers, per size class: `(token, id x 2^k)` leases the rows chosen, counting their
    /// attempts (this claim holds their locks), returning them where the database has
    /// `RETURNING`. Empty (SQLite): [`LimitSql::take`].
    ///
    /// Modelled in model/limits.pml (count_and_choose).
    pub take_locked: Vec<String>,
    /// Without `RETURNING` (MySQL), per size class: `(id x 2^k)` -> the rows the take leased,
    /// read under the locks.
    pub taken: Vec<String>,
}

/// How many keys' slots one statement of [`Dialect::slots_held`] probes.
pub(crate) const SLOT_PROBE_KEYS: usize = 100;

/// Runs `sql(n)` `(from, to, name(prefix) x n)` for each run of at most [`SLOT_PROBE_KEYS`]
/// of `prefixes`, each returning `(index in the run, held)` rows of the keys holding any: the
/// held counts in `prefixes`' order (the servers' [`Dialect::slots_held`]).
#[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
pub(crate) fn slots_held_in_runs(
    conn: &mut dyn DbConn,
    prefixes: &[String],
    (from, to): (u32, u32),
    sql: impl Fn(usize) -> String,
    name: impl Fn(&str) -> String,
) -> Result<Vec<u32>, DbError> {
    let mut out = vec![0; prefixes.len()];
    if from >= to {
        return Ok(out);
    }
    for (run, chunk) in prefixes.chunks(SLOT_PROBE_KEYS).enumerate() {
        let mut params = vec![Value::Int(i64::from(from)), Value::Int(i64::from(to))];
        params.extend(chunk.iter().map(|p| Value::Text(name(p))));
        for row in conn.query(&sql(chunk.len()), &params)? {
            let i = row.first().and_then(Value::as_i64).unwrap_or(-1);
            let n = row.get(1).and_then(Value::as_i64).unwrap_or(0);
            if let Some(slot) = usize::try_from(i)
                .ok()
                .filter(|i| *i < chunk.len())
                .and_then(|i| out.get_mut(run * SLOT_PROBE_KEYS + i))
            {
                *slot = n.clamp(0, i64::from(u32::MAX)) as u32;
            }
        }
    }
    Ok(out)
}

/// Statements of one table for one database, built once. Parameters are listed as `(..)`.
#[derive(Debug, Clone, Default)]
pub(crate) struct TableSql {
    /// Lease and row lock tables with flow control (concurrency or rate limits, fair claims):
    /// their claim ([`LimitSql`]).
    pub limited: Option<LimitSql>,
    /// Tables with rate limits: their window slots ([`flow::RateSql`]).
    pub rates: Option<flow::RateSql>,
    /// Tables with fair claims: the next keys to serve ([`flow::FairSql`]).
    pub fair: Option<flow::FairSql>,
    /// Tables with dependencies: the waits' statements ([`deps::DepsSql`]).
    pub deps: Option<deps::DepsSql>,
    /// Tables with dependencies: their waiting jobs' statements ([`deps::WaitingSql`]).
    pub waiting: Option<deps::WaitingSql>,
    /// Tables with concurrency or rate limits: `(now[, now])` -> `<the columns the limits
    /// read>, count` of the claimable rows per distinct value of those columns
    /// ([`TableSpec::flow_columns`] order; `now` twice in the lease form): what waits on a
    /// limit (operators' counts).
    pub flow_ready: Option<String>,
    /// Opens a claim transaction at the table's isolation level.
    ///
    /// Modelled in model/fifo.pml (heads), model/row_lock.pml (claim).
    pub begin: Vec<String>,
    /// Opens a write transaction (batch publish, renewal loops). On PostgreSQL read committed
    /// by name: the statements' locks are reasoned at that level, and a database whose
    /// default is stricter would fail concurrent writers of one row (40001) instead of
    /// queueing them.
    pub begin_write: String,
    /// `(payload, run_at, user columns..)`: one row.
    pub insert_one: String,
    /// `insert_one` returning the new row's id, where the database has `RETURNING`.
    pub insert_id: Option<String>,
    /// The claim.
    /// - row lock: `(now, limit)` -> rows, locked `FOR UPDATE SKIP LOCKED`;
    /// - lease: see [`Dialect::lease_claim`];
    /// - advisory: `(now, limit)` -> `id, run_at, <user columns>` of claimable rows, locking
    ///   nothing.
    ///
    /// Modelled in model/advisory.pml (candidates), model/fifo.pml (heads), model/lease.pml
    /// (claim), model/limits.pml (candidates), model/row_lock.pml (claim).
    pub claim: String,
    /// Advisory: `(now, run_at, id, limit)` (MySQL: `(now, run_at, run_at, id, limit)`,
    /// [`Syntax::after_cursor`](crate::dialect::shared::Syntax::after_cursor)), the candidates
    /// after the row `(run_at, id)`.
    ///
    /// Modelled in model/advisory.pml (candidates).
    pub claim_after: String,
    /// Advisory: `claim_after` without the keys a claim found at the max of a limit whose key
    /// reads one column ([`LimitSql::except`]'s `candidates_from`: `claim_after`'s parameters
    /// with the values left out before the limit).
    pub advisory_except: Vec<ExceptSql>,
    /// Advisory, tables without FIFO groups or priorities on the servers: a claim's first page is
    /// read with `claim_after` from the subscription's [cursor](crate::runtime::cursor).
    ///
    /// Modelled in model/advisory.pml (candidates).
    pub advisory_cursor: bool,
    /// Tables without priorities or FIFO groups on the servers, the claim of the rows after
    /// `(run_at, id)` in claim order (the subscription's [cursor](crate::runtime::cursor)):
    /// PostgreSQL lease `(now, limit, token, run_at, id)`, row lock `(now, limit, run_at,
    /// id)`; MySQL (`?` cannot be numbered) lease `(now, now, run_at, run_at, id, limit)`, row
    /// lock `(now, run_at, run_at, id, limit)`. Where it is set, `claim` and this claim return
    /// each row's `run_at` after its columns.
    ///
    /// Modelled in model/lease.pml (claim), model/row_lock.pml (claim).
    pub claim_from: Option<String>,
    /// Lease: the claim of at most one row, where the database runs another spelling faster
    /// (same parameters as `claim`).
    ///
    /// Modelled in model/lease.pml (claim).
    pub claim_one: Option<String>,
    /// Lease form where the claim is a locking select (MySQL): `(token, id x 2^k)` leases the
    /// found rows, one statement per id-list size class `k`, built with the table so no claim
    /// formats SQL.
    #[cfg_attr(not(feature = "mysql"), allow(dead_code))]
    pub lease_marks: Vec<String>,
    /// FIFO lease claims in two statements (PostgreSQL): `claim` `(now, limit)` finds heads
    /// and takes their groups' transaction-scoped locks; then `(now, token, id x 2^k)`, under a
    /// snapshot taken while the locks are held, re-checks those heads and leases them,
    /// returning the rows (one statement per id-list size class). Empty: the claim is one
    /// statement.
    ///
    /// Modelled in model/fifo.pml (fifo_take).
    pub fifo_takes: Vec<String>,
    /// FIFO claims in several statements (MySQL): see [`FifoSql`].
    #[cfg_attr(not(feature = "mysql"), allow(dead_code))]
    pub fifo: Option<FifoSql>,
    /// Advisory: `(now, id)` takes the row if it is still claimable, counting its attempt; in a
    /// FIFO table only if it is still its group's head (MySQL: `(now, id, group, group)`).
    /// Returns the row where the database has `RETURNING`, else only changes it (then `fetch`).
    ///
    /// Modelled in model/advisory.pml (take), model/limits.pml (take).
    pub take: String,
    /// `(id)` -> the row.
    ///
    /// Modelled in model/advisory.pml (take).
    pub fetch: String,
    /// Row lock, advisory: `(id)`; lease: `(id, token)`. Deletes the row.
    ///
    /// Modelled in model/advisory.pml (settle), model/fifo.pml (settle), model/lease.pml (settle),
    /// model/limits.pml (settle), model/row_lock.pml (settle).
    pub ack: String,
    /// Row lock: `(run_at, error, failures, id)`, counting the attempt; advisory: `(run_at,
    /// error, failures, id)`; lease: `(run_at, error, failures, id, token)`, clearing the
    /// lease. `error` (text, or `NULL` to keep the last one) goes to `last_error`, `failures`
    /// (0 or 1) is added to `errors`. Lease and advisory: a row whose cancel was requested is
    /// finished as cancelled instead ([`shared::Syntax::cancelled_case`]).
    ///
    /// Modelled in model/advisory.pml (settle), model/fifo.pml (settle), model/lease.pml (settle),
    /// model/limits.pml (settle), model/row_lock.pml (settle).
    pub retry: String,
    /// Row lock: `(now, reason, error, failures, id)`, counting the attempt; advisory: `(now,
    /// reason, error, failures, id)`; lease: `(now, reason, error, failures, id, token)`,
    /// clearing the lease.
    ///
    /// Modelled in model/advisory.pml (settle), model/fifo.pml (settle), model/lease.pml (settle),
    /// model/limits.pml (settle), model/row_lock.pml (settle).
    pub dead: String,
    /// Cancels a held row for good (a delivery's [`cancel`](crate::Delivery::cancel)): deletes
    /// it, or on a table that keeps completed rows marks it completed and finished with the
    /// reason [`CANCELLED`](shared::CANCELLED) (row lock: counting the attempt). Row lock,
    /// advisory: `(id)`; lease: `(id, token)`.
    ///
    /// Modelled in model/advisory.pml (settle), model/lease.pml (settle), model/row_lock.pml
    /// (settle).
    pub cancel_held: String,
    /// Hands back a row no handler saw, giving back the attempt its claim counted. Lease:
    /// `(id, token)`, clearing the lease; advisory: `(id)`, run under the row's key.
    ///
    /// Modelled in model/advisory.pml (settle), model/fifo.pml (hand_back), model/lease.pml
    /// (settle), model/limits.pml (turn).
    pub unclaim: String,
    /// Lease: `(deadline, id, token)` moves the lease's deadline (the delivery's new token).
    ///
    /// Modelled in model/lease.pml (extend).
    pub extend: String,
    /// Advisory with server-side keys: `(name)` -> one row, one value: 1 if taken, 0 if held
    /// elsewhere. `None`: keys are kept in the process ([`Dialect::process_keys`]).
    ///
    /// Modelled in model/advisory.pml (key_lock, cancel_under_key), model/limits.pml (take_slots).
    pub key_lock: Option<String>,
    /// `(name)` -> 1 if this session held the key.
    ///
    /// Modelled in model/advisory.pml (take_missed, settle, cancel_under_key), model/limits.pml
    /// (settle).
    pub key_unlock: Option<String>,
    /// Tables with dedup keys: `(key)` -> the id of the unfinished row holding it.
    pub dedup_holder: String,
    /// Tables with dedup keys, where the database has `ON CONFLICT`: `insert_one` that skips a
    /// row whose key is held, returning the new id if it made one.
    pub insert_dedup_one: String,
    /// `(limit)` -> `id, attempts, payload, dead_at, dead_reason, last_error, errors, <user
    /// columns>`, oldest first.
    pub dead_list: String,
    /// `(now, id)`: puts a dead-lettered row back in the queue.
    pub dead_requeue: String,
    /// Databases with no change feed (MySQL), or one woken by every commit (SQLite,
    /// [`Dialect::wakes_on_every_commit`]): `(now, now)` -> a row if any row may be
    /// claimable, locking nothing. An idle claim worker asks this one statement instead of
    /// running a whole claim transaction; a superset of the claimable rows (rows locked or
    /// keyed elsewhere count), so a "no" is always right.
    #[cfg_attr(not(any(feature = "mysql", feature = "sqlite")), allow(dead_code))]
    pub any_ready: Option<String>,
    /// `(now, now, run_at, run_at, id)`: [`any_ready`](Self::any_ready) past the claim
    /// cursor, where the claims read on from it. From the head, every idle poll would walk
    /// the entries a snapshot held elsewhere keeps from purge.
    #[cfg_attr(not(feature = "mysql"), allow(dead_code))]
    pub any_ready_from: Option<String>,
    /// PostgreSQL: `(payload)` notifies the table's channel (see [`Dialect::announce`]).
    pub notify: Option<String>,
    /// `(after, limit)` -> the `dead_list` columns of the dead-lettered rows with ids above
    /// `after`, by id (keyset paging).
    pub dead_page: String,
    /// `(after, offset)` -> the id of the dead-lettered row `offset` places past the first with
    /// an id above `after`: the upper bound of a batch of `offset + 1` rows.
    pub dead_bound: String,
    /// `(now, after, upto)`: `dead_requeue` of every dead-lettered row with an id in
    /// `(after, upto]`.
    pub dead_requeue_range: String,
    /// `(id)`: deletes the row if it is dead-lettered.
    pub dead_purge: String,
    /// `(after, upto)`: deletes the dead-lettered rows with ids in `(after, upto]`.
    pub dead_purge_range: String,
    /// `(before, after, offset)` -> as `dead_bound`, of the rows dead-lettered before `before`
    /// (the maintainer's dead-letter retention, [`crate::model::table::Table::keep_dead`]).
    pub dead_old_bound: String,
    /// `(before, after, upto)`: deletes the rows dead-lettered before `before` with ids in
    /// `(after, upto]`.
    pub dead_old_prune_range: String,
    /// `(now)` -> one row: ready, scheduled, held (lease form; `0` in the others), dead, the
    /// earliest `run_at` of the ready rows (`NULL` if none), completed (tables that keep
    /// completed rows; `0` in the others). See [`shared::StatsStates`] for what each count
    /// holds.
    pub stats: String,
    /// Tables with queues: [`stats`](TableSql::stats) per queue, the queue first in each row.
    pub stats_by_queue: Option<String>,
    /// Tables with kinds: [`stats`](TableSql::stats) per kind, the kind (or `NULL`) first.
    pub stats_by_kind: Option<String>,
    /// Tables with queues: the paused queues' statements ([`queues::PausedQueuesSql`]).
    pub paused_queues: Option<queues::PausedQueuesSql>,
    /// MySQL row lock tables with queues, or a subscription's view of some queues or kinds:
    /// the claim in two steps, `(now, limit)` -> ids of ready rows in claim order, locking
    /// nothing, then `(id, now)` -> the row, locked `FOR UPDATE SKIP LOCKED` if it is still
    /// claimable, each in a transaction of its own. InnoDB keeps the lock of every row a
    /// locking read reads, a row the `WHERE` then refuses (another queue's, another kind's, a
    /// paused queue's) included, for the rest of the transaction, which in the row lock form
    /// is the delivery's: a view would hold rows no one else could claim.
    #[cfg_attr(not(feature = "mysql"), allow(dead_code))]
    pub row_lock_by_id: Option<(String, String)>,
    /// Tables that keep completed rows: `(after, limit)` -> `id, attempts, payload,
    /// completed_at, <user columns>` of the completed rows with ids above `after`, by id.
    pub completed_page: String,
    /// Tables that keep completed rows: `(cutoff, after, offset)` -> the id of the row
    /// completed before `cutoff` that is `offset` places past the first with an id above
    /// `after` (the upper bound of a prune batch).
    pub completed_bound: String,
    /// Tables that keep completed rows: `(cutoff, after, upto)` deletes the rows completed
    /// before `cutoff` with ids in `(after, upto]`.
    pub completed_prune_range: String,
    /// `(id)` -> the row in the [`shared::Syntax::job_columns`] layout, then, on a table that
    /// has them, its output and its checkpoint.
    ///
    /// Modelled in model/advisory.pml (cancel_mark), model/lease.pml (cancel_lookup).
    pub job: String,
    /// Tables with outputs: `(output, id)` writes the row's output (in the transaction of the
    /// settlement that ends it).
    pub output_write: Option<String>,
    /// Tables with checkpoints: the form's checkpoint write. Lease `(data, id, token)`, fenced
    /// by the token; advisory lock `(data, id)`, under the key, of a live row; row lock
    /// `(data, guard, id)`, in the delivery's transaction, moving `run_at` to `guard` (a
    /// crash's row stays unclaimed until then, while the transaction is chained).
    ///
    /// Modelled in model/lease.pml (checkpoint), model/row_lock.pml (checkpoint).
    pub checkpoint_write: Option<String>,
    /// Row lock tables with checkpoints: `(id)` locks the row again after the checkpoint's
    /// commit, if it is still live -> its id.
    ///
    /// Modelled in model/row_lock.pml (relock).
    pub relock: Option<String>,
    /// Per job state (scheduled, ready, in flight, dead, completed; `None`: no such rows in
    /// this table), `(now x n, after, limit)` -> the `job` columns of the rows in that state
    /// with ids above `after`, by id; and `n`. Row lock and advisory forms: in flight reads
    /// the ready rows (their work leaves no mark in the row).
    pub jobs_page: Vec<Option<(String, usize)>>,
    /// The pages of `jobs_page` for a listing ([`Broker::jobs_preview`](crate::Broker::jobs_preview)):
    /// `(prefix, now x n, after, limit)` -> the payload's length in bytes, then the `job`
    /// columns with only the payload's first `prefix` bytes; and `n`.
    pub jobs_preview: Vec<Option<(String, usize)>>,
    /// Cancel of a row not in work: `(id)`, lease `(id, now)`: deletes it or, on a table that
    /// keeps completed rows, keeps it completed and cancelled; a completed row, or a leased
    /// one, is left alone.
    ///
    /// Modelled in model/advisory.pml (cancel_remove_dead, cancel_under_key), model/lease.pml
    /// (cancel_remove), model/row_lock.pml (cancel_remove).
    pub cancel_remove: String,
    /// Delete of a row not in work, whatever its state: `(id)`, lease `(id, now)`; a leased
    /// row is left alone ([`Broker::delete_matching`](crate::Broker::delete_matching)).
    pub delete_free: String,
    /// Lease `(id, now)`: marks a live, leased row's cancel request; advisory `(id)`: a live
    /// row's. Empty in the row lock form.
    ///
    /// Modelled in model/advisory.pml (cancel_mark), model/lease.pml (cancel_mark).
    pub cancel_mark: String,
    /// [`cancel_mark`](TableSql::cancel_mark) of a row not marked yet (same parameters): 0
    /// rows for one whose cancel was requested already, so a bulk cancel counts only the
    /// rows it changed ([`Broker::cancel_matching`](crate::Broker::cancel_matching)). Empty in
    /// the row lock form.
    pub cancel_mark_first: String,
    /// Row lock `(id)` -> the row, locked, waiting for the delivery that holds it.
    ///
    /// Modelled in model/row_lock.pml (cancel_lock).
    pub cancel_lock: String,
    /// Row lock `(id)` -> the row if no other session has it locked, locked (a probe, rolled
    /// back at once).
    pub probe_lock: String,
    /// `testing::drain_all`: `(now, latest[, now])` (the second `now` in the lease form) ->
    /// ids of the jobs scheduled for later that it makes due ([`shared::Syntax::due_statements`]),
    /// by id; in the row lock form locked `FOR UPDATE SKIP LOCKED`.
    #[cfg_attr(not(feature = "testing"), allow(dead_code))]
    pub due_later: String,
    /// `testing::drain_all`: `(now, id, now, latest[, now])` moves the row's `run_at` to `now`
    /// if it is still one of [`TableSql::due_later`]'s.
    #[cfg_attr(not(feature = "testing"), allow(dead_code))]
    pub make_due: String,
    /// The grouped lease ack ([`Dialect::lease_ack_many`]) by size class, built on first use.
    pub ack_many: BySize,
}

/// Statement texts by size class, each built once and kept: a grouped statement of a
/// hundred rows takes tens of thousands of instructions to format, which a batch ack paid
/// on every call.
#[derive(Default)]
pub(crate) struct BySize(parking_lot::Mutex<Vec<(usize, Arc<str>)>>);

impl BySize {
    /// The text for `size`, built by `build` the first time it is asked for.
    pub fn get(&self, size: usize, build: impl FnOnce() -> String) -> Arc<str> {
        let mut texts = self.0.lock();
        if let Some((_, sql)) = texts.iter().find(|(n, _)| *n == size) {
            return sql.clone();
        }
        let sql: Arc<str> = build().into();
        texts.push((size, sql.clone()));
        sql
    }
}

/// A copy starts empty: the texts are rebuilt on demand.
impl Clone for BySize {
    fn clone(&self) -> Self {
        BySize::default()
    }
}

impl std::fmt::Debug for BySize {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BySize")
    }
}

/// The statements of the table registry, `sqlbroker_tables`: one row per table that
/// `create_table` or `migrate` described, with its description as JSON
/// ([`crate::runtime::registry`]). The same for every table, so constants of each dialect.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RegistrySql {
    /// Makes the registry if it does not exist: `name` (primary key, byte-exact), `format`
    /// (the record's format version), `description` (JSON), `paused` (0 or 1), `updated_at`.
    pub create: &'static str,
    /// `(name, format, description, now)`: records a description, replacing the table's
    /// record if it has one (its `paused` flag is kept).
    pub upsert: &'static str,
    /// `(name, format, description, now)`: records a description unless the table has one.
    pub insert_new: &'static str,
    /// `(name)` -> `format, description, paused, updated_at` of the table's record.
    pub read: &'static str,
    /// `(format, description, now, name, stale description, stale updated_at)`: replaces a
    /// record left by a dropped table, only if it is still exactly the one read (a creator
    /// of the new table that replaced it first wins; see [`crate::runtime::registry`]).
    pub replace_stale: &'static str,
    /// `(name)` -> `paused, description` of the table's record (a subscription's pause
    /// check, which also follows a description that changed under it).
    pub paused: &'static str,
    /// `(name)` -> `description` of the table's record: the concurrency limits in force.
    pub limits: &'static str,
    /// `(name)` -> `description`, the record's row locked until the transaction ends (`FOR
    /// UPDATE`; SQLite: plain, inside the one writer's transaction): the turn of a lease
    /// claim of a table with concurrency limits.
    ///
    /// Modelled in model/limits.pml (turn).
    pub limits_locked: &'static str,
    /// `()` -> `name, format, description, paused` of every record, by name.
    pub list: &'static str,
    /// `(paused, now, name)`: sets the pause flag; changes no row if there is no record.
    pub set_paused: &'static str,
}

/// The statements of the operators' action log, `sqlbroker_actions`: one row per action an
/// operator took (who, what, on which table, how many rows, when), kept in the database the
/// action changed ([`Broker::record_action`](crate::Broker::record_action)). Constants of
/// each dialect, as the registry's.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ActionLogSql {
    /// Makes the log if it does not exist: `id` (ascending), `acted_at`, `who`, `action`,
    /// `table_name`, `detail`, `row_count`.
    pub create: &'static str,
    /// `(acted_at, who, action, table_name, detail, row_count)`: one entry.
    pub insert: &'static str,
    /// `(limit)` -> `id, acted_at, who, action, table_name, detail, row_count`, newest first.
    pub list: &'static str,
    /// The `table_name` column compared byte for byte (MySQL compares the log's text in a
    /// case-insensitive collation: `CAST(.. AS BINARY)` there).
    pub table_exact: &'static str,
    /// `(before, offset)` -> the id of the entry `offset` places past the first written
    /// before `before`, by id: the upper bound of the maintainer's next batch.
    pub sweep_bound: &'static str,
    /// `(before, upto)`: deletes the entries written before `before` with ids up to `upto`.
    pub sweep: &'static str,
}

/// The statements of the periodic schedules' records (`sqlbroker_periodics`: a row per
/// schedule and table, written by every process that runs it; `producing/periodic.rs`, and
/// read and paused by operators, `operating/periodics.rs`).
#[derive(Debug)]
pub(crate) struct PeriodicSql {
    /// Makes the table if it does not exist.
    pub create: &'static str,
    /// `(table_name, name, schedule, time_zone, seen_at)`: the schedule's row, made or brought
    /// up to date; its pause is kept.
    // Written by the schedules' thread (`cron` feature) only.
    #[cfg_attr(not(feature = "cron"), allow(dead_code))]
    pub upsert: &'static str,
    /// `(seen_at, next_tick, last_tick, table_name, name)`: a running process's beat
    /// (`last_tick` `NULL` keeps the one written).
    // Written by the schedules' thread (`cron` feature) only.
    #[cfg_attr(not(feature = "cron"), allow(dead_code))]
    pub beat: &'static str,
    /// `(table_name, name)` -> `paused`, the row locked until the transaction ends (servers:
    /// `FOR UPDATE`; SQLite's write transaction holds the database): a publish that reads it
    /// and a pause that writes it are ordered.
    // Written by the schedules' thread (`cron` feature) only.
    #[cfg_attr(not(feature = "cron"), allow(dead_code))]
    pub paused: &'static str,
    /// -> `table_name, name, schedule, time_zone, next_tick, last_tick, paused, seen_at`, by
    /// table and name.
    pub list: &'static str,
    /// `(paused, name)`: pauses or resumes every schedule of that name.
    pub set_paused: &'static str,
}

/// The statements of the maintainer's election (`sqlbroker_maintainer`: one row, the lease
/// that says which broker maintains the database and in which term; `runtime/maintainer.rs`).
#[derive(Debug)]
pub(crate) struct MaintainerSql {
    /// Makes the table if it does not exist.
    pub create: &'static str,
    /// Writes the one row, expired and of term 0, unless it is there.
    pub seed: &'static str,
    /// `(holder, host, pid, since, expires_at, now)`: takes the lease if it expired before
    /// `now`, in the next term; one row changed when taken.
    pub take: &'static str,
    /// `(expires_at, holder, term, now)`: renews the lease held in `term`, if it has not
    /// expired; one row changed when still held.
    pub renew: &'static str,
    /// `(past, holder, term)`: gives the lease up at once (a broker that is dropped).
    pub resign: &'static str,
    /// -> `holder, host, pid, term, since, expires_at`.
    pub read: &'static str,
}

/// The statements of the fleet's heartbeats (`sqlbroker_workers`: a row per running
/// subscription or worker, written by its broker every few seconds; `runtime/fleet.rs`).
#[derive(Debug)]
pub(crate) struct FleetSql {
    /// Makes the table if it does not exist.
    pub create: &'static str,
    /// Adds the `stuck` column to a table an earlier release made (an error where it is there
    /// and the database has no `IF NOT EXISTS` for it: ignored).
    pub add_stuck: &'static str,
    /// `(id, what, host, pid, tables, started_at, seen_at, expires_at, in_work, handled, stuck,
    /// last_error)`: a member's row, written or brought up to date.
    pub beat: &'static str,
    /// `(id)`: a member that stopped.
    pub leave: &'static str,
    /// `(now)` -> `id, what, host, pid, tables, started_at, seen_at, in_work, handled,
    /// last_error, stuck` of the members whose rows have not expired, oldest first.
    pub list: &'static str,
    /// `list` without `stuck`, for a table an earlier release made that no broker of this one
    /// has written yet.
    pub list_before_stuck: &'static str,
    /// `(before)`: deletes the rows that expired before then (members that stopped beating).
    pub sweep: &'static str,
}

impl ActionLogSql {
    /// `(name x tables, limit)` -> the entries on those tables (names compared byte for byte),
    /// as [`list`](Self::list) gives them.
    pub fn list_on(&self, syntax: &shared::Syntax, tables: usize) -> String {
        let marks: Vec<String> = (1..=tables).map(|n| syntax.p(n)).collect();
        format!(
            "SELECT id, acted_at, who, action, table_name, detail, row_count \
             FROM sqlbroker_actions WHERE {} IN ({}) ORDER BY id DESC LIMIT {}",
            self.table_exact,
            marks.join(", "),
            syntax.p(tables + 1)
        )
    }
}

/// FIFO claims where one statement cannot both pick group heads and guard their groups
/// (MySQL/MariaDB: a locking scan reads newer rows than its own subquery, and keeps locks on
/// rows it rejects through a secondary index). Heads are read without locks, locked by
/// primary key, then their groups are guarded by a locking read that fails at once
/// (`NOWAIT`) if any unfinished row of the group is locked, or uncommitted.
#[derive(Debug, Clone, Default)]
#[cfg_attr(not(feature = "mysql"), allow(dead_code))]
pub(crate) struct FifoSql {
    /// Row lock `(now, k)`, lease `(now, now, k)` -> ids of up to `k` claimable group heads,
    /// in claim order, locking nothing.
    pub heads: String,
    /// Row lock: `(id, now)` -> the row, locked, if it is still claimable.
    pub lock_one: String,
    /// Lease, per id-list size class `k`: `(id x 2^k, now, now, n)` -> up to `n` of the rows,
    /// locked, those still claimable.
    pub lock_many: Vec<String>,
    /// `(group)` -> `id[, locked_until]` of every unfinished row of the group, locked, oldest
    /// first; fails at once if one is locked elsewhere.
    pub guard: String,
    /// Where the group column's value is in a claimed row.
    pub group_at: usize,
}

/// How a publish by another process (or another broker) reaches a broker's idle claim workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ChangeFeed {
    /// Nothing outside the broker can write (an in-memory SQLite database): its own wake-ups
    /// are enough.
    #[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
    Nothing,
    /// A [`Watcher`] on a dedicated connection ([`Dialect::watcher`]).
    Watcher,
    /// The database has none: idle claim workers poll, fast right after rows were found
    /// ([`crate::model::schedule::idle_poll`]).
    Poll,
}

/// What a [`Watcher`] saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Change {
    /// The table, or `None` for "something in the database changed" (SQLite).
    pub table: Option<String>,
    /// Rows that may have arrived (1 when unknown).
    pub rows: usize,
    /// The broker that announced them, if it said ([`Dialect::announce`]).
    pub from: Option<u64>,
}

/// A change feed on a dedicated connection (never pooled), driven by one listener thread per
/// broker. Every call is bounded in time.
pub(crate) trait Watcher: Send {
    /// Starts watching `table` (PostgreSQL: `LISTEN` on its channel).
    fn watch(&mut self, table: &str) -> Result<(), DbError>;
    /// Waits at most `timeout` for changes and appends them to `out`. An error means the
    /// connection is gone: the listener opens a new watcher.
    fn wait(&mut self, timeout: Duration, out: &mut Vec<Change>) -> Result<(), DbError>;
    /// True if publishes announce themselves on this feed ([`Dialect::announce`]) and the
    /// announcements come back to their own broker's watcher: then a broker debounces them.
    fn echoes(&self) -> bool {
        false
    }
    /// Announces `rows` rows of `table` from broker `from` on this connection (the debounced
    /// notifications the listener sends for publishes that skipped their own).
    fn announce(&mut self, _table: &str, _rows: usize, _from: u64) -> Result<(), DbError> {
        Ok(())
    }
}

/// One database engine: how to connect, what it can do, and its SQL.
pub(crate) trait Dialect: Send + Sync + 'static {
    /// `PostgreSQL`, `MySQL` (also for MariaDB) or `SQLite`.
    fn database(&self) -> &'static str;

    /// The server as it names itself: [`database`](Dialect::database), but `MariaDB` for a
    /// MariaDB server once a session has told (its `VERSION()`).
    fn server_name(&self) -> &'static str {
        self.database()
    }

    /// Opens a new connection.
    fn connect(&self) -> Result<Box<dyn DbConn + Send>, DbError>;

    /// A cap on the pool size (an in-memory SQLite database lives in one connection).
    fn max_pool_size(&self) -> Option<u32> {
        None
    }

    /// Lease acks of different tables may share one transaction (one commit): the group
    /// commit then serves every table of a broker ([`AckGroup`](crate::runtime::AckGroup)), and
    /// this begins such a transaction (a failure leaves none open). Where a commit is the cost
    /// (SQLite's one writer and its sync of the log), a worker over many tables commits as
    /// seldom as one over one table.
    /// `None` (the default): each table groups its own. PostgreSQL: concurrent commits share
    /// the server's log flushes already, and one flush at a time across tables serialised
    /// what ran in parallel (a worker over ten tables: 0.49-0.51 of one subscription shared,
    /// 0.64-0.70 apart); written as one statement instead (a data-modifying `WITH` part per
    /// table, sent unnamed since its text changes with each flush), a flush of 4-5 tables took
    /// 1.1-1.4 ms, most of it planning, and ten tables fell to 0.32-0.45. MySQL: its grouped
    /// ack is a transaction of its own (a locking read, then the delete).
    fn shared_acks_begin(&self) -> Option<&'static str> {
        None
    }

    /// Lease acks of a table with dependencies are settled in groups, several in one
    /// transaction ([`Queue::settles`](crate::runtime::Queue)): where writers take turns
    /// anyway (SQLite), a group's one commit replaces each ack's own, and a 10,000-job fan-in
    /// acked one by one went from 0.55 of a plain table's rate to 1.3. Default false: on the
    /// servers one flush at a time ran every ack's statements in turn, where acks apart run
    /// side by side up to the count they take down (PostgreSQL 0.25 -> 0.19, MariaDB 0.30 ->
    /// 0.18 of plain, BENCHMARKS.md).
    fn groups_settlements(&self) -> bool {
        false
    }

    /// Refuses a form the engine cannot do, before any connection is made.
    fn check_form(&self, _form: Form) -> Result<(), BrokerError> {
        Ok(())
    }

    /// The row lock claim, inside the claim transaction the form has opened: the one row it
    /// took, locked. `after`: the subscription's cursor `(run_at, id)`, read on from where the
    /// table has [`TableSql::claim_from`]. Default: `claim_from` `(now, 1, run_at, id)`, else
    /// `claim` `(now, 1)`.
    ///
    /// Modelled in model/row_lock.pml (claim).
    fn row_lock_claim(
        &self,
        conn: &mut dyn DbConn,
        sql: &TableSql,
        now: SystemTime,
        after: Option<(SystemTime, i64)>,
    ) -> Result<Option<Vec<Value>>, DbError> {
        if let (Some(from), Some((run_at, id))) = (&sql.claim_from, after) {
            let params = [
                Value::Time(now),
                Value::Int(1),
                Value::Time(run_at),
                Value::Int(id),
            ];
            return Ok(conn.query(from, &params)?.into_iter().next());
        }
        claim_one_row(conn, sql, now)
    }

    /// Checks the server's version against the floors of `form` (`ServerTooOld`).
    fn check_server(&self, conn: &mut dyn DbConn, form: Form) -> Result<(), BrokerError>;

    /// Learns, on the broker's first connection, what the server is part of (MySQL: a
    /// MariaDB Galera cluster), for [`Dialect::check_cluster`].
    fn inspect(&self, _conn: &mut dyn DbConn) -> Result<(), DbError> {
        Ok(())
    }

    /// Refuses a subscription on `spec` whose guarantee would not hold across the nodes of
    /// the cluster [`Dialect::inspect`] found (`ClusterUnsafe`).
    fn check_cluster(&self, _spec: &TableSpec) -> Result<(), BrokerError> {
        Ok(())
    }

    /// Builds the statements of a table.
    fn compile(&self, spec: &TableSpec) -> TableSql;

    /// `CREATE TABLE IF NOT EXISTS` and its indexes.
    fn create_table(&self, spec: &TableSpec) -> Vec<String>;

    /// The columns `spec` needs, with their definitions and the types that work.
    fn column_defs(&self, spec: &TableSpec) -> Vec<crate::model::schema::ColumnDef>;

    /// `(table name)` -> `(column name, type)` of each column of the table in the connection's
    /// database (or schema); no rows if there is no such table.
    fn columns_query(&self) -> &'static str;

    /// The statement that converts `defs`, columns of a table made by an earlier release
    /// whose text compares by a collation instead of byte for byte, to their definitions
    /// (`migrate`). Only MySQL has such columns ([`ColumnDef::collations`]).
    ///
    /// [`ColumnDef::collations`]: crate::model::schema::ColumnDef::collations
    fn convert_columns(
        &self,
        _spec: &TableSpec,
        _defs: &[&crate::model::schema::ColumnDef],
    ) -> Option<String> {
        None
    }

    /// `(table name)` -> the names of the table's indexes, for [`Dialect::index_names`].
    /// Default: none.
    fn index_names_query(&self) -> Option<&'static str> {
        None
    }

    /// The names of the indexes table `name` has (a migration makes those it lacks, and
    /// rebuilds the ready index it has when priorities are added). Default: from
    /// [`Dialect::index_names_query`]; none without one.
    fn index_names(&self, conn: &mut dyn DbConn, name: &str) -> Result<Vec<String>, DbError> {
        let Some(sql) = self.index_names_query() else {
            return Ok(Vec::new());
        };
        Ok(conn
            .query(sql, &[Value::Text(name.to_string())])?
            .into_iter()
            .filter_map(|r| r.into_iter().next()?.as_str().map(str::to_string))
            .collect())
    }

    /// The statements that create the indexes of `spec` a table with the indexes `have`
    /// ([`Dialect::index_names`]) lacks (a migration runs them after adding its columns).
    /// Default: the `CREATE .. INDEX IF NOT EXISTS <name> ON` statements `create_table` makes
    /// after the table, less those of indexes in `have`, and its other statements (checks of
    /// the names) if any index is left to make.
    fn missing_indexes(&self, spec: &TableSpec, have: &[String]) -> Vec<String> {
        let have: Vec<String> = have
            .iter()
            .map(|name| format!("INDEX IF NOT EXISTS {} ON ", self.syntax().q(name)))
            .collect();
        let after_table: Vec<String> = self.create_table(spec).into_iter().skip(1).collect();
        // (The rate slots' index is the migration's to look for on that table.)
        let rates = format!(" ON {} (", self.syntax().q(&flow::rates_table(spec)));
        let is_index = |stmt: &str| {
            stmt.starts_with("CREATE ")
                && stmt.contains(" INDEX IF NOT EXISTS ")
                && !stmt.contains(&rates)
        };
        let missing: Vec<String> = after_table
            .iter()
            .filter(|stmt| is_index(stmt) && !have.iter().any(|h| stmt.contains(h.as_str())))
            .cloned()
            .collect();
        if missing.is_empty() {
            return missing;
        }
        after_table
            .into_iter()
            .filter(|stmt| !is_index(stmt) || missing.contains(stmt))
            .collect()
    }

    /// Drops the ready index and creates it again in the table's claim order: a migration
    /// that adds priorities changes that order, and an index by name alone would stay
    /// `(run_at, id)`, so every claim would sort the whole backlog. PostgreSQL, SQLite.
    fn rebuild_ready_index(&self, spec: &TableSpec) -> Vec<String> {
        let s = self.syntax();
        vec![
            format!(
                "DROP INDEX IF EXISTS {}",
                s.q(&format!("{}_ready", spec.name))
            ),
            s.ready_index(spec),
        ]
    }

    /// How the database spells identifiers and parameters.
    fn syntax(&self) -> &'static shared::Syntax;

    /// The statements of the table registry.
    fn registry(&self) -> &'static RegistrySql;

    /// The statements of the operators' action log.
    fn action_log(&self) -> &'static ActionLogSql;

    /// The statements of the fleet's heartbeats; `None` where the database has none (the unit
    /// tests' scripted one).
    fn fleet(&self) -> Option<&'static FleetSql> {
        None
    }

    /// The statements of the periodic schedules' records; `None` where the database has none
    /// (the unit tests' scripted one).
    fn periodics(&self) -> Option<&'static PeriodicSql> {
        None
    }

    /// The statements of the maintainer's election; `None` where the database has none (the
    /// unit tests' scripted one).
    fn maintainer(&self) -> Option<&'static MaintainerSql> {
        None
    }

    /// The statements of the waits' table `sqlbroker_deps`, database-wide (the sweeper's,
    /// which serves no one table); `None` where the database has none (the unit tests'
    /// scripted one).
    fn deps(&self) -> Option<&'static deps::DepsSql> {
        None
    }

    /// Inserts `rows` rows in one statement, parameters as `insert_one` repeated.
    fn insert_many(&self, spec: &TableSpec, rows: usize) -> String {
        self.syntax().insert_many(spec, rows)
    }

    /// The most bound parameters one statement may carry.
    fn max_params(&self) -> usize;

    /// Claims up to `limit` lease rows: writes `token` into `locked_until`, counts the attempt
    /// and commits. Returns the rows with their attempts after the count. `after`: the
    /// subscription's cursor `(run_at, id)`, read on from where the table has
    /// [`TableSql::claim_from`].
    /// Default: one statement `(now, limit, token)` returning the rows (`claim_from`: `(now,
    /// limit, token, run_at, id)`), or, where the table has [`TableSql::fifo_takes`], that
    /// protocol in one transaction (`begin`).
    ///
    /// Modelled in model/fifo.pml (heads, fifo_take), model/lease.pml (claim).
    fn lease_claim(
        &self,
        conn: &mut dyn DbConn,
        sql: &TableSql,
        now: SystemTime,
        limit: usize,
        token: SystemTime,
        after: Option<(SystemTime, i64)>,
    ) -> Result<Vec<Vec<Value>>, DbError> {
        if let (Some(from), Some((run_at, id))) = (&sql.claim_from, after) {
            let params = [
                Value::Time(now),
                Value::Int(limit as i64),
                Value::Time(token),
                Value::Time(run_at),
                Value::Int(id),
            ];
            return conn.query(from, &params);
        }
        if !sql.fifo_takes.is_empty() {
            return in_transaction(conn, &sql.begin, |conn| {
                let found =
                    conn.query(&sql.claim, &[Value::Time(now), Value::Int(limit as i64)])?;
                let ids: Vec<i64> = found.iter().filter_map(|r| r.first()?.as_i64()).collect();
                if ids.is_empty() {
                    return Ok(Vec::new());
                }
                let leading = vec![Value::Time(now), Value::Time(token)];
                let (take, params) = for_ids(&sql.fifo_takes, leading, &ids)?;
                conn.query(take, &params)
            });
        }
        let claim = match &sql.claim_one {
            Some(one) if limit == 1 => one,
            _ => &sql.claim,
        };
        conn.query(
            claim,
            &[
                Value::Time(now),
                Value::Int(limit as i64),
                Value::Time(token),
            ],
        )
    }

    /// Renews the leases `held` (`(id, token)` pairs) to `token`; returns the ids renewed.
    /// Those missing have lost their lease, or (servers) were skipped because another
    /// transaction had them locked: renewal never waits on a row lock.
    ///
    /// Modelled in model/fifo.pml (renew), model/lease.pml (renew), model/limits.pml (renew).
    fn lease_renew(
        &self,
        conn: &mut dyn DbConn,
        spec: &TableSpec,
        token: SystemTime,
        held: &[(i64, SystemTime)],
    ) -> Result<Vec<i64>, DbError>;

    /// Acks the leases `held` (`(id, token)` pairs; a row may come with several tokens, of
    /// which it holds at most one) in one commit: deletes the rows still holding one of their
    /// tokens and returns their ids. Those missing have lost their lease.
    ///
    /// Modelled in model/lease.pml (settle).
    fn lease_ack_many(
        &self,
        conn: &mut dyn DbConn,
        spec: &TableSpec,
        sql: &TableSql,
        held: &[(i64, SystemTime)],
    ) -> Result<Vec<i64>, DbError>;

    /// Inserts one row (`insert_one` parameters) and returns its id: `insert_id` where the
    /// database has `RETURNING`, else the driver's last insert id.
    fn insert_returning_id(
        &self,
        conn: &mut dyn DbConn,
        sql: &TableSql,
        params: &[Value],
    ) -> Result<i64, DbError> {
        let id = match &sql.insert_id {
            Some(insert_id) => conn
                .query(insert_id, params)?
                .first()
                .and_then(|r| r.first()?.as_i64()),
            None => {
                conn.execute(&sql.insert_one, params)?;
                conn.last_insert_id()
            }
        };
        id.ok_or_else(|| DbError::other("the insert reported no id"))
    }

    /// Tables with dedup keys: inserts `rows` rows (`insert_one` parameters repeated), skipping
    /// those whose key an unfinished row holds; returns the ids of the rows made, in no order.
    /// Default: one `INSERT .. ON CONFLICT DO NOTHING RETURNING` statement.
    fn insert_dedup(
        &self,
        conn: &mut dyn DbConn,
        sql: &TableSql,
        spec: &TableSpec,
        rows: usize,
        params: &[Value],
    ) -> Result<Vec<i64>, DbError> {
        let made = if rows == 1 {
            conn.query(&sql.insert_dedup_one, params)?
        } else {
            // A batch: its text is built for its size (a batch amortises it).
            conn.query(&self.syntax().insert_dedup(spec, rows), params)?
        };
        Ok(made.iter().filter_map(|r| r.first()?.as_i64()).collect())
    }

    /// Advisory: takes row `id` if it is still claimable (in a FIFO table: still the head of
    /// its group, whose value is `group`), counting its attempt; returns it.
    /// Default: `take` `(now, id)` returns the row.
    ///
    /// Modelled in model/advisory.pml (take).
    fn advisory_take(
        &self,
        conn: &mut dyn DbConn,
        sql: &TableSql,
        now: SystemTime,
        id: i64,
        _group: Option<&Value>,
    ) -> Result<Option<Vec<Value>>, DbError> {
        Ok(conn
            .query(&sql.take, &[Value::Time(now), Value::Int(id)])?
            .into_iter()
            .next())
    }

    /// The lock name a key is taken under.
    fn key_name(&self, key: &str) -> String {
        key.to_string()
    }

    /// Where a session's keys would not outlive one transaction's server session (PostgreSQL
    /// behind transaction pooling): `(name)` -> 1 if taken until the transaction ends, 0 if
    /// held elsewhere. The operator calls then probe and take keys with it inside one
    /// transaction, so no key is left held on a server session another client gets. Default:
    /// none (keys are taken for the session, [`TableSql::key_lock`]).
    fn key_xact_lock(&self) -> Option<&'static str> {
        None
    }

    /// The statement that cancels what the session `session` ([`DbConn::session_id`]) is
    /// running, run on another connection. Default: none.
    fn cancel_statement(&self, _session: u64) -> Option<String> {
        None
    }

    /// The in-process key registry, for engines with no server-side advisory locks.
    fn process_keys(&self) -> Option<Arc<crate::dialect::keys::KeyRegistry>> {
        None
    }

    /// For each of `prefixes` (a concurrency limit's slot keys of one key each, named before
    /// [`Dialect::key_name`]), how many of the keys `<prefix>{from}` .. `<prefix>{to - 1}` are
    /// held now, by any session, the one asking included (operators' counts, and a claim's
    /// count past a lowered max; taking none). Default: those held through the in-process
    /// registry; none without one.
    ///
    /// Modelled in model/limits.pml (take_slots).
    fn slots_held(
        &self,
        _conn: &mut dyn DbConn,
        prefixes: &[String],
        from: u32,
        to: u32,
    ) -> Result<Vec<u32>, DbError> {
        let keys = self.process_keys();
        Ok(prefixes
            .iter()
            .map(|prefix| match &keys {
                None => 0,
                Some(keys) => (from..to)
                    .filter(|slot| keys.is_held(&format!("{prefix}{slot}")))
                    .count() as u32,
            })
            .collect())
    }

    /// Whether a claim's lock waits can be bounded per claim at no cost
    /// ([`DbConn::limit_waits`]): then a handler's thread with a timeout claims for itself
    /// within the time left. Default false (the servers: a lock timeout per claim costs a
    /// round trip), and such a thread claims only if its timeout covers the statement timeout.
    fn bounds_claim_waits(&self) -> bool {
        false
    }

    /// True where the change feed wakes every table's idle claim workers on any commit to the
    /// database, the process's own acks and claims included (SQLite's `data_version` names no
    /// table): an idle worker woken then asks the table's cheap readiness check
    /// ([`TableSql::any_ready`]) before it spends a claim, a write transaction, on it.
    /// Default false: the servers' feeds name the table and the publishing broker.
    fn wakes_on_every_commit(&self) -> bool {
        false
    }

    /// How another process's publish reaches idle claim workers. Default: polling.
    fn change_feed(&self) -> ChangeFeed {
        ChangeFeed::Poll
    }

    /// Opens a change feed on a connection of its own ([`ChangeFeed::Watcher`] only).
    fn watcher(&self) -> Result<Box<dyn Watcher>, DbError> {
        Err(DbError::other(format!(
            "{} has no change feed",
            self.database()
        )))
    }

    /// Tells other brokers, on `conn` (in its transaction, if one is open: then at commit),
    /// that `rows` rows of the table arrived; `from` names this broker, so its own listener
    /// does not wake its workers twice. Default: nothing (no notifications on this database).
    fn announce(
        &self,
        _conn: &mut dyn DbConn,
        _sql: &TableSql,
        _rows: usize,
        _from: Option<u64>,
    ) -> Result<(), DbError> {
        Ok(())
    }

    /// Tells other brokers' change feeds, on `conn`, that the table's pause flag changed, so
    /// their workers read it again at once ([`crate::runtime::registry`]). Default: nothing (they read
    /// it within their poll interval).
    fn announce_pause(&self, _conn: &mut dyn DbConn, _sql: &TableSql) -> Result<(), DbError> {
        Ok(())
    }
}

/// Runs `body` in a transaction opened by `begin` and commits; on error rolls back, or marks the
/// connection broken if even that fails.
pub(crate) fn in_transaction<T, S: AsRef<str>>(
    conn: &mut dyn DbConn,
    begin: &[S],
    body: impl FnOnce(&mut dyn DbConn) -> Result<T, DbError>,
) -> Result<T, DbError> {
    for stmt in begin {
        if let Err(e) = conn.batch(stmt.as_ref()) {
            // `SET TRANSACTION` applies to the session's next transaction: never pool a session
            // whose transaction half opened.
            conn.mark_broken();
            return Err(e);
        }
    }
    let run = |conn: &mut dyn DbConn| {
        let out = body(conn)?;
        conn.batch("COMMIT")?;
        Ok(out)
    };
    let r = run(conn);
    if r.is_err() {
        conn.rollback_or_discard();
    }
    r
}

/// The size class of a list of `n` ids or rows: the next power of two. Statements over a
/// variable number of ids are built for a handful of sizes (padded by repeating the last), so
/// few texts are prepared per connection.
pub(crate) fn size_class(n: usize) -> usize {
    n.max(1).next_power_of_two()
}

/// The statement of `list` (one per size class: 1, 2, 4 .. ids) for as many ids as `ids`, and
/// its parameters: `leading`, then `ids` padded to the class ([`id_params`]).
pub(crate) fn for_ids<'a>(
    list: &'a [String],
    mut leading: Vec<Value>,
    ids: &[i64],
) -> Result<(&'a str, Vec<Value>), DbError> {
    let slots = size_class(ids.len());
    let sql = list
        .get(slots.trailing_zeros() as usize)
        .ok_or_else(|| DbError::other(format!("no statement for a list of {slots} ids")))?;
    leading.reserve(slots);
    id_params(ids, slots, &mut leading);
    Ok((sql, leading))
}

/// `ids` as parameters, padded to `slots` with the last id (a repeated id in `IN` or an `OR`
/// list changes nothing).
pub(crate) fn id_params(ids: &[i64], slots: usize, out: &mut Vec<Value>) {
    let last = ids.last().copied().unwrap_or_default();
    out.extend(ids.iter().map(|id| Value::Int(*id)));
    out.extend(std::iter::repeat_n(
        Value::Int(last),
        slots.saturating_sub(ids.len()),
    ));
}

/// Runs the statement `sql(slots)` over `held` `(id, token)` pairs as parameters, padded to a
/// size class with the last pair (a repeated pair changes nothing), and returns the ids of its
/// rows: a grouped, token-fenced statement with `RETURNING` (SQLite).
#[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
pub(crate) fn fenced_pairs(
    conn: &mut dyn DbConn,
    held: &[(i64, SystemTime)],
    sql: impl Fn(usize) -> Arc<str>,
) -> Result<Vec<i64>, DbError> {
    let Some(last) = held.last() else {
        return Ok(Vec::new());
    };
    let slots = size_class(held.len());
    let mut params = Vec::with_capacity(2 * slots);
    for (id, tok) in held.iter().chain(std::iter::repeat(last)).take(slots) {
        params.push(Value::Int(*id));
        params.push(Value::Time(*tok));
    }
    let rows = conn.query(&sql(slots), &params)?;
    Ok(rows
        .iter()
        .filter_map(|r| r.first().and_then(Value::as_i64))
        .collect())
}

/// The row lock claim in one statement: `claim` `(now, 1)`, the row it took.
///
/// Modelled in model/row_lock.pml (claim).
pub(crate) fn claim_one_row(
    conn: &mut dyn DbConn,
    sql: &TableSql,
    now: SystemTime,
) -> Result<Option<Vec<Value>>, DbError> {
    let rows = conn.query(&sql.claim, &[Value::Time(now), Value::Int(1)])?;
    Ok(rows.into_iter().next())
}

/// How every connection of a broker is set up.
#[derive(Debug, Clone)]
pub(crate) struct ConnOptions {
    /// The longest a statement may wait on the server, locks included: PostgreSQL
    /// `lock_timeout` and `statement_timeout`; MySQL `lock_wait_timeout`,
    /// `innodb_lock_wait_timeout` and the socket's read and write timeouts; SQLite's busy
    /// timeout and the process's writer lock.
    pub statement_timeout: Duration,
    /// The longest the client waits for the answer to one round trip (the servers; the
    /// statement timeout and a margin unless the builder says): PostgreSQL through its
    /// connector's deadline, MySQL the socket's read and write timeouts; also each server's
    /// `TCP_USER_TIMEOUT`.
    pub round_trip_timeout: Duration,
    /// SQLite: `synchronous = FULL` (a commit survives power loss) rather than `NORMAL`.
    pub sqlite_durable: bool,
    /// Whether the broker listens for other brokers' publishes (`cross_process_wake`).
    pub cross_process: bool,
    /// PostgreSQL: where the change feed's `LISTEN` session connects, when not through the
    /// broker's URL (a transaction-pooling PgBouncer has no sessions to listen on).
    pub listen_url: Option<String>,
    /// MariaDB Galera: every broker writes through one node, so node-local locks hold.
    pub galera_single_writer: bool,
}

/// Picks the engine from the URL's scheme.
pub(crate) fn open(url: &str, opts: &ConnOptions) -> Result<Arc<dyn Dialect>, BrokerError> {
    let bad = |reason: String| BrokerError::InvalidUrl { reason };
    let scheme = url
        .split(':')
        .next()
        .unwrap_or_default()
        .to_ascii_lowercase();
    #[cfg(any(feature = "postgres", feature = "mysql"))]
    let scheme = if url::is_key_value(url) {
        // PostgreSQL's key-value form (`host=a,b port=5432,5433 dbname=jobs`).
        "postgres".to_string()
    } else {
        scheme
    };
    if opts.listen_url.is_some() && !matches!(scheme.as_str(), "postgres" | "postgresql") {
        return Err(BrokerError::InvalidOption {
            option: "listen_url",
            reason: "PostgreSQL only: the other databases have no LISTEN session".into(),
        });
    }
    match scheme.as_str() {
        #[cfg(feature = "postgres")]
        "postgres" | "postgresql" => Ok(Arc::new(postgres::Postgres::from_url(url, opts)?)),
        #[cfg(feature = "mysql")]
        "mysql" | "mariadb" => Ok(Arc::new(mysql::Mysql::from_url(url, opts)?)),
        #[cfg(feature = "sqlite")]
        "sqlite" => Ok(Arc::new(sqlite::Sqlite::from_url(url, opts)?)),
        #[allow(unreachable_patterns)]
        "postgres" | "postgresql" | "mysql" | "mariadb" | "sqlite" => Err(bad(format!(
            "support for {scheme} is not compiled in (cargo feature)"
        ))),
        _ => Err(bad(format!(
            "unknown scheme in {url:?}: expected postgres://, mysql:// or sqlite:"
        ))),
    }
}

/// Parses a `major.minor.patch` prefix of a version string (`15.4 (Debian ..)`,
/// `10.11.6-MariaDB-0+deb12u1`, `8.0.1`). Missing parts read 0.
#[cfg_attr(not(feature = "mysql"), allow(dead_code))]
pub(crate) fn parse_version(s: &str) -> Option<(u32, u32, u32)> {
    let head: String = s
        .trim()
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    let mut it = head
        .split('.')
        .filter(|p| !p.is_empty())
        .map(|p| p.parse::<u32>());
    let major = it.next()?.ok()?;
    let minor = it.next().and_then(|r| r.ok()).unwrap_or(0);
    let patch = it.next().and_then(|r| r.ok()).unwrap_or(0);
    Some((major, minor, patch))
}

#[cfg(test)]
pub(crate) fn test_options() -> ConnOptions {
    ConnOptions {
        statement_timeout: Duration::from_secs(30),
        round_trip_timeout: Duration::from_secs(40),
        sqlite_durable: true,
        cross_process: true,
        listen_url: None,
        galera_single_writer: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions() {
        assert_eq!(parse_version("15.4 (Debian 15.4-1)"), Some((15, 4, 0)));
        assert_eq!(parse_version("9.5.25"), Some((9, 5, 25)));
        assert_eq!(
            parse_version("10.11.6-MariaDB-0+deb12u1"),
            Some((10, 11, 6))
        );
        assert_eq!(parse_version("16devel"), Some((16, 0, 0)));
        assert_eq!(parse_version("garbage"), None);
    }

    #[test]
    fn urls() {
        let o = test_options();
        assert!(matches!(
            open("redis://x", &o),
            Err(BrokerError::InvalidUrl { .. })
        ));
        assert!(matches!(open("", &o), Err(BrokerError::InvalidUrl { .. })));
        #[cfg(feature = "postgres")]
        {
            // The key-value form is PostgreSQL's, and its `pool_mode` is read (nothing connects).
            let kv = "host=a,b port=1,2 user=u dbname=d sslmode=disable pool_mode=transaction";
            assert!(matches!(
                open(kv, &o),
                Err(BrokerError::InvalidOption {
                    option: "listen_url",
                    ..
                })
            ));
            let quiet = ConnOptions {
                cross_process: false,
                ..test_options()
            };
            assert!(open(kv, &quiet).is_ok());
            assert!(matches!(
                open("postgres://u@h/d?pool_mode=statement", &o),
                Err(BrokerError::InvalidUrl { .. })
            ));
            let direct = ConnOptions {
                listen_url: Some("postgres://u@h/d".into()),
                ..test_options()
            };
            assert!(open("postgres://u@h:6432/d?pool_mode=transaction", &direct).is_ok());
            let pooled = ConnOptions {
                listen_url: Some("postgres://u@h/d?pool_mode=transaction".into()),
                ..test_options()
            };
            assert!(matches!(
                open("postgres://u@h:6432/d?pool_mode=transaction", &pooled),
                Err(BrokerError::InvalidOption { .. })
            ));
        }
        #[cfg(feature = "sqlite")]
        {
            let direct = ConnOptions {
                listen_url: Some("postgres://u@h/d".into()),
                ..test_options()
            };
            assert!(matches!(
                open("sqlite::memory:", &direct),
                Err(BrokerError::InvalidOption {
                    option: "listen_url",
                    ..
                })
            ));
        }
    }

    /// The session settings every connection gets from [`ConnOptions`], read back from live
    /// sessions (a server that is not reachable is skipped).
    mod session_settings {
        use super::*;

        fn opts(secs: u64, durable: bool) -> ConnOptions {
            ConnOptions {
                statement_timeout: Duration::from_secs(secs),
                round_trip_timeout: Duration::from_secs(secs + 10),
                sqlite_durable: durable,
                cross_process: true,
                listen_url: None,
                galera_single_writer: false,
            }
        }

        /// A server that is not reachable skips the test, loudly, unless CI requires servers.
        #[cfg(any(feature = "postgres", feature = "mysql"))]
        fn skip(db: &str, url: &str) {
            if std::env::var("SQLBROKER_REQUIRE_SERVERS").is_ok_and(|v| v == "1") {
                panic!("SQLBROKER_REQUIRE_SERVERS=1 but {db} at {url} is not reachable");
            }
            eprintln!("SKIPPED: {db} at {url} is not reachable");
        }

        fn first(conn: &mut dyn DbConn, sql: &str) -> Vec<Value> {
            conn.query(sql, &[]).unwrap().remove(0)
        }

        #[test]
        fn sqlite_is_durable_unless_told_and_memory_is_never_silently_replaced() {
            let dir = std::env::temp_dir().join(format!("sqlbroker-sync-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            for (durable, expected) in [(true, 2), (false, 1)] {
                let url = format!("sqlite:{}/{durable}.db", dir.display());
                let mut conn = open(&url, &opts(3, durable)).unwrap().connect().unwrap();
                // 2 = FULL: a commit survives power loss; 1 = NORMAL.
                assert_eq!(
                    first(&mut *conn, "PRAGMA synchronous"),
                    [Value::Int(expected)]
                );
            }
            let _ = std::fs::remove_dir_all(&dir);

            let memory = open("sqlite::memory:", &opts(3, true)).unwrap();
            let mut conn = memory.connect().unwrap();
            conn.batch("CREATE TABLE t (x INTEGER)").unwrap();
            // Its one connection discarded, the database is gone: say so, never hand out a
            // new, empty database in its place.
            drop(conn);
            let e = memory
                .connect()
                .err()
                .expect("a second in-memory connection");
            assert_eq!(e.kind, crate::error::DbErrorKind::ConnectionLost);
            assert!(e.to_string().contains("in-memory"), "{e}");
        }

        #[cfg(feature = "postgres")]
        #[test]
        fn postgres_sessions_bound_lock_and_statement_waits() {
            let url = std::env::var("SQLBROKER_PG_URL")
                .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
            let Ok(mut conn) = open(&url, &opts(7, true)).unwrap().connect() else {
                return skip("PostgreSQL", &url);
            };
            let got = first(
                &mut *conn,
                "SELECT current_setting('lock_timeout'), current_setting('statement_timeout')",
            );
            assert_eq!(got, [Value::Text("7s".into()), Value::Text("7s".into())]);
            // A URL that sets one keeps its own.
            let sep = if url.contains('?') { '&' } else { '?' };
            let own = format!("{url}{sep}options=-c%20lock_timeout%3D1234");
            let mut conn = open(&own, &opts(7, true)).unwrap().connect().unwrap();
            let got = first(
                &mut *conn,
                "SELECT current_setting('lock_timeout'), current_setting('statement_timeout')",
            );
            assert_eq!(
                got,
                [Value::Text("1234ms".into()), Value::Text("7s".into())]
            );
        }

        #[cfg(feature = "mysql")]
        #[test]
        fn mysql_sessions_bound_lock_waits() {
            let url = std::env::var("SQLBROKER_MYSQL_URL")
                .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into());
            let Ok(mut conn) = open(&url, &opts(7, true)).unwrap().connect() else {
                return skip("MySQL", &url);
            };
            let got = first(
                &mut *conn,
                "SELECT @@session.lock_wait_timeout, @@session.innodb_lock_wait_timeout, @@session.time_zone",
            );
            assert_eq!(got[..2], [Value::Int(7), Value::Int(7)]);
            assert_eq!(got[2], Value::Text("+00:00".into()));
        }
    }
}

#[cfg(test)]
mod except_tests {
    use super::{except_index, except_shapes, EXCEPT_CLASSES};

    /// Each shape's place is where `except_index` finds it, and a count between classes is
    /// padded up to the next.
    #[test]
    fn except_shapes_are_found_where_built() {
        let shapes: Vec<(bool, usize)> = except_shapes().collect();
        assert_eq!(shapes.len(), 2 * EXCEPT_CLASSES as usize + 1);
        for (i, (null, n)) in shapes.iter().enumerate() {
            assert_eq!(except_index(*null, *n), Some((i, *n)), "shape {i}");
        }
        assert_eq!(except_index(false, 0), None);
        assert_eq!(except_index(false, 3), Some((2, 4)));
        assert_eq!(
            except_index(true, 5),
            Some((EXCEPT_CLASSES as usize + 1 + 3, 8))
        );
    }
}
