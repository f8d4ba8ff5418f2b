//! The statements of jobs that wait on other jobs ([`Table::dependencies`]), the same on every
//! database but for quoting, placeholders, the locking clause and how an insert meets a row
//! already there.
//!
//! One table per database, `sqlbroker_deps`, holds two kinds of rows:
//! - a job's **head** (`child_table = ''`, `child = 0`): made by the first publish that names
//!   the job or by its settlement, it holds the job's outcome once settled (`NULL` before).
//!   Publishers and the settlement lock it, so a publish that names a job and that job's
//!   settlement never pass each other unseen. With [`Table::outputs`], the head also holds
//!   what the job produced (`output`), for the jobs waiting on it. Its `settled_only` is 1
//!   where the job's row can no longer tell its outcome (a queued job cancelled, which removes
//!   it; a purged dead letter): the head alone tells it, and is kept a day for that;
//! - a **wait** (`parent` -> `child`): the child waits on the parent, `settled_only` for
//!   [`Message::after_settled`]; `outcome` is the parent's once it settled;
//! - a waiting job's **count** (`parent_table = ''`, `parent = 0`): `pending`, the jobs it
//!   waits on that have not settled. Each settlement of one of them counts it down under the
//!   row's lock, so the settlement that takes it to 0 is the last, and releases the job.
//!
//! [`Table::dependencies`]: crate::Table::dependencies
//! [`Message::after_settled`]: crate::Message::after_settled
//! [`Table::outputs`]: crate::Table::outputs

use crate::dialect::shared::Syntax;
use crate::dialect::signals::SignalSql;
use crate::model::table::{Form, TableSpec};

/// The name of the waits' table.
pub(crate) const DEPS_TABLE: &str = "sqlbroker_deps";

/// What a settled job's outcome is recorded as.
pub(crate) const ACKED: &str = "acked";
pub(crate) const DEAD: &str = "dead";
pub(crate) const CANCELLED: &str = "cancelled";

/// How a database writes an insert that meets a row already there.
#[cfg_attr(
    not(all(feature = "postgres", feature = "mysql", feature = "sqlite")),
    allow(dead_code)
)]
pub(crate) enum Upsert {
    /// `ON CONFLICT (..) DO UPDATE SET c = EXCLUDED.c` (PostgreSQL, SQLite).
    OnConflict,
    /// `ON DUPLICATE KEY UPDATE c = VALUES(c)` (MySQL/MariaDB).
    DuplicateKey,
}

/// The waits' statements (database-wide), parameters listed as `(..)`.
#[derive(Debug, Clone, Default)]
pub(crate) struct DepsSql {
    /// Makes the waits' table and its index by child, if they do not exist.
    pub create: Vec<String>,
    /// Adds the `output` column to a waits' table made before it (an earlier build).
    pub add_output: String,
    /// Opens a write transaction (the sweeper's settlement of a job found gone).
    pub begin_write: String,
    /// `(table, id, at)` makes the job's head if there is none, and locks it (the servers);
    /// a head already there has its `at` moved on (to `at` or one past its own, whichever is
    /// later), so a sweep that read it before can tell it was named since ([`DepsSql::sweep_many`]).
    pub head_touch: String,
    /// `(table, id)` -> the job's recorded outcome (`NULL`: not settled), its head locked (the
    /// servers: `FOR UPDATE`, a current read).
    pub head_read: String,
    /// `(table, id, outcome, at, output, kept)` records the job's outcome and output in its
    /// head, made if missing (its `at` moved on as [`DepsSql::head_touch`] does); `kept` 1: its
    /// row can no longer tell the outcome (the head is kept a day).
    pub head_settle: String,
    /// `(at, table, id)` makes a requeued job's head unsettled again (no outcome, no output),
    /// locking it, if it has one.
    pub head_reset: String,
    /// `(table, id)` deletes the job's head.
    pub unhead: String,
    /// `(table, id)` -> the output its head holds (a requeue keeps it for the jobs already
    /// released).
    pub head_output: String,
    /// `(output, table, id)` writes `output` to the job's waits that have an outcome and no
    /// output of their own: the jobs its settlement released read what it produced then,
    /// whatever its head holds after a requeue.
    pub waits_keep_output: String,
    /// `(parent table, parent, child table, child, settled_only, outcome, at, output)` makes a
    /// wait (`output`: the parent's, read from its row, for a parent settled before the wait).
    pub wait_insert: String,
    /// A publish naming many jobs ([`NAMED_MANY`] at a time): `[k]` is [`DepsSql::head_touch`]
    /// of `2^k` jobs in one statement, `(table, id, at) x 2^k` (the heads met in the order
    /// listed, as one by one), returning `parent, outcome` of each where the database's
    /// upsert returns rows (PostgreSQL, SQLite; `head_read_many` empty).
    pub head_touch_many: Vec<String>,
    /// MySQL: `(table, id x NAMED_MANY)` -> `parent, outcome` of those jobs' heads, locked,
    /// fewer ids with the last repeated.
    pub head_read_many: String,
    /// `[k]`: [`DepsSql::wait_insert`] of `2^k` waits in one statement.
    pub wait_insert_many: Vec<String>,
    /// `(outcome, parent table, parent, child table, child)` sets one wait's outcome (a
    /// requeued job's waits, read again).
    pub wait_set: String,
    /// `(table, id)` -> `child_table, child, settled_only` of the jobs waiting on it whose wait
    /// has no outcome yet, in `(child_table, child)` order (the order their counts are locked
    /// in).
    pub dependents: String,
    /// `(table, id)` -> `child_table, child` of every job waiting on it (operators' view).
    pub all_dependents: String,
    /// `(table, id)` -> a row if any job waits on it (the sweeper).
    pub has_waits: String,
    /// `(outcome, table, id)` records a parent's outcome in its waits that have none.
    pub mark: String,
    /// `(table, id, at, pending)` makes a job's count: every job that waits has one (0 once
    /// nothing it waits on is pending), the sweeper's handle on the waits of a job gone.
    pub count_insert: String,
    /// `(table, id)` counts a waiting job down by one, locking its count.
    pub count_down: String,
    /// `(table, id)` -> the waiting job's count (after this transaction's own count down).
    pub count_read: String,
    /// `(table, id)` deletes a job's count (a requeued job's, made again).
    pub count_forget: String,
    /// `(table, id)` -> `parent_table, parent, settled_only, outcome, output` of the job's
    /// waits, by parent (the wait's own output, else the one in the parent's head if the head
    /// holds the outcome the wait does: a parent requeued and settled again since it released
    /// the job tells it neither its new outcome nor the output that came with it).
    pub parents: String,
    /// `(table, id)` deletes the job's waits and count (it settled: nothing holds it any more).
    pub forget_waits: String,
    /// `(table, id)` deletes the job's waits and count and its head: one statement for a job
    /// settled with nothing waiting on it.
    pub forget_all: String,
    /// `(table)` -> the jobs of the table that jobs wait on and that have not settled
    /// (a dropped table's).
    pub pending_of_table: String,
    /// `(table, table)` deletes the rows of a dropped table's jobs: their heads, counts and
    /// waits, and the waits on them that have no outcome; the waits on them that have one
    /// stay with their jobs (a dead letter's, which its requeue reads: refused, the job it
    /// waits on being gone).
    pub forget_table: String,
    /// `(scope)`: deletes the heads of the signals of a table that is gone (sent or not), so a
    /// table made again under its name waits for its signals afresh.
    pub forget_signals: String,
    /// The sweeper's window: the first [`SWEEP_WINDOW`] rows in key order. Columns
    /// `parent_table, parent, child_table, child, outcome, at, settled_only`.
    pub window_first: String,
    /// The sweeper's window past a cursor `(parent_table, parent, child_table, child)`, as
    /// [`DepsSql::window_first`]; the cursor is passed as [`DepsSql::window_spelled`] says.
    pub window: String,
    /// True where [`DepsSql::window`] spells the cursor out (`a > ? OR (a = ? AND ..)`: MySQL,
    /// whose range optimizer does not read row values), taking 7 parameters
    /// (`pt, pt, p, p, ct, ct, c`); false for the 4 of a row value (PostgreSQL, SQLite).
    pub window_spelled: bool,
    /// `((table, id, at) x SWEEP_BATCH)` deletes settled heads the sweeper read, those still
    /// as read: their outcome set (a requeue clears it) and their `at` unchanged (every publish
    /// that names one moves it on), so a head a new wait has just named stays. One statement
    /// for up to [`SWEEP_BATCH`] heads (fewer: the last repeated).
    pub sweep_many: String,
    /// The statements of jobs that wait for a signal.
    pub signals: SignalSql,
}

/// Jobs of one table the sweeper reads in one statement at most.
pub(crate) const STATES_BATCH: usize = 100;

/// How many jobs named by one publish have their heads touched and read in one statement
/// ([`DepsSql::head_touch_many`]): a power of two.
pub(crate) const NAMED_MANY: usize = 256;

/// Heads one statement of the sweeper deletes at most.
pub(crate) const SWEEP_BATCH: usize = 50;

/// Rows of `sqlbroker_deps` one pass of the sweeper reads: its bound on the work of a pass.
pub(crate) const SWEEP_WINDOW: usize = 500;

/// A waiting table's own statements, parameters listed as `(..)`.
#[derive(Debug, Clone, Default)]
pub(crate) struct WaitingSql {
    /// `(now, id, latest)` makes a waiting job due now.
    pub release: String,
    /// `(now, reason, id, latest)` dead-letters a waiting job, freeing its dedup key as
    /// every dead letter does.
    pub dead: String,
    /// `(latest, id)` makes a live job wait again (a requeued job whose parents have not
    /// settled).
    pub wait_again: String,
    /// `(id)` -> `dead_at, cancelled (1 for a cancel, 0 else), completed_at (NULL without),
    /// output (NULL without)` of the job, if it is in the table.
    pub state: String,
    /// `(id x STATES_BATCH)` -> `id, dead_at, cancelled, completed_at (NULL without)` of
    /// those of the jobs in the table (the sweeper's look for jobs gone: one statement for up to
    /// [`STATES_BATCH`], fewer with the last repeated).
    pub states: String,
    /// `(latest)` -> the count of the jobs that wait.
    pub count_waiting: String,
    /// `(after, limit)` -> the ids of dead letters above `after`, in id order (a requeue of
    /// them all, one by one).
    pub dead_after: String,
    /// `(table, after, upto)` deletes the waits and counts of jobs of the table with an id in
    /// `(after, upto]` that are no longer in it (purged dead letters).
    pub forget_gone: String,
    /// `(outcome, at, after, upto)` records, for each dead letter with an id in `(after,
    /// upto]`, that it was dead-lettered, in its head, kept a day (before a purge deletes its
    /// row, which told it until then).
    pub heads_dead: String,
    /// `(at, cutoff, after, upto)` records, for each completed row cancelled with an id in
    /// `(after, upto]` completed before `cutoff`, that it was cancelled, in its head, kept a
    /// day (before a prune deletes its row, which told it until then); `None` on a table that
    /// does not keep completed rows.
    pub heads_cancelled: Option<String>,
}

/// How a database spells the waits' statements where they differ.
pub(crate) struct Spelling {
    /// The table name columns' type.
    pub key_type: &'static str,
    /// The outputs' type.
    pub bytes: &'static str,
    /// What follows the table definition (MySQL: its engine).
    pub table_tail: &'static str,
    /// MySQL writes the child index in the table definition (it has no `CREATE INDEX IF NOT
    /// EXISTS`).
    pub index_inline: bool,
    /// The servers' `FOR UPDATE` (SQLite: none, one writer).
    pub locking: &'static str,
    /// How an insert meets a row already there.
    pub upsert: Upsert,
    /// The larger of two values (`GREATEST`; SQLite's two-argument `MAX`).
    pub greatest: &'static str,
    /// The sweeper's cursor as a row value (`(a, b) > (?, ?)`), which PostgreSQL and SQLite
    /// read as a range of the primary key; false: spelled out.
    pub row_values: bool,
    /// Opens a write transaction.
    pub begin_write: &'static str,
}

impl Upsert {
    /// The value an insert meeting a row would have written to `col`.
    fn new_value(&self, col: &str) -> String {
        match self {
            Upsert::OnConflict => format!("excluded.{col}"),
            Upsert::DuplicateKey => format!("VALUES({col})"),
        }
    }

    /// The tail of an insert that updates the row it meets with `set`.
    fn update(&self, pk: &str, set: &str) -> String {
        match self {
            Upsert::OnConflict => format!("ON CONFLICT ({pk}) DO UPDATE SET {set}"),
            Upsert::DuplicateKey => format!("ON DUPLICATE KEY UPDATE {set}"),
        }
    }
}

/// The waits' table's primary key.
const PK: &str = "parent_table, parent, child_table, child";

impl Syntax {
    /// The waits' statements, as the database spells them (`how`).
    pub fn deps_sql(&self, how: &Spelling) -> DepsSql {
        let t = self.q(DEPS_TABLE);
        let (key_type, bytes) = (how.key_type, how.bytes);
        let index = self.q(&format!("{DEPS_TABLE}_child"));
        let cols = "(parent_table, parent, child_table, child, settled_only, outcome, at, output)";
        // MySQL writes the child index inside the table's definition.
        let inline = match how.index_inline {
            true => format!(", INDEX {index} (child_table, child)"),
            false => String::new(),
        };
        let mut create = vec![format!(
            "CREATE TABLE IF NOT EXISTS {t} (parent_table {key_type} NOT NULL, parent BIGINT NOT \
             NULL, child_table {key_type} NOT NULL, child BIGINT NOT NULL, settled_only SMALLINT \
             NOT NULL, outcome VARCHAR(16) NULL, at BIGINT NOT NULL, pending BIGINT NULL, output \
             {bytes}, PRIMARY KEY ({PK}){inline}){}",
            how.table_tail
        )];
        if !how.index_inline {
            create.push(format!(
                "CREATE INDEX IF NOT EXISTS {index} ON {t} (child_table, child)"
            ));
        }
        let p = |n| self.p(n);
        let head = |first: usize| {
            format!(
                "parent_table = {} AND parent = {} AND child_table = '' AND child = 0",
                p(first),
                p(first + 1)
            )
        };
        // A head named or settled again moves its `at` on, always: the sweeper's delete
        // compares it with what it read.
        let existing_at = match how.upsert {
            Upsert::OnConflict => format!("{t}.at"),
            Upsert::DuplicateKey => "at".to_string(),
        };
        let moved_at = |new: &str| format!("at = {}({existing_at} + 1, {new})", how.greatest);
        // A head's output, once written, stays until a requeue resets the head: a settlement
        // that writes none (an operator's cancel of a dead letter) leaves it.
        let existing_output = match how.upsert {
            Upsert::OnConflict => format!("{t}.output"),
            Upsert::DuplicateKey => "output".to_string(),
        };
        let upsert = &how.upsert;
        let touch = format!(
            "INSERT INTO {t} (parent_table, parent, child_table, child, settled_only, outcome, at) \
             VALUES ({}, {}, '', 0, 0, NULL, {}) {}",
            p(1),
            p(2),
            p(3),
            upsert.update(PK, &moved_at(&upsert.new_value("at")))
        );
        // Parameters in the order they are written: MySQL's are positional.
        let settle = format!(
            "INSERT INTO {t} (parent_table, parent, child_table, child, outcome, at, output, \
             settled_only) VALUES ({}, {}, '', 0, {}, {}, {}, {}) {}",
            p(1),
            p(2),
            p(3),
            p(4),
            p(5),
            p(6),
            upsert.update(
                PK,
                &format!(
                    "settled_only = {}, outcome = {}, {}, output = COALESCE({}, {existing_output})",
                    upsert.new_value("settled_only"),
                    upsert.new_value("outcome"),
                    moved_at(&upsert.new_value("at")),
                    upsert.new_value("output")
                )
            )
        );
        let of = |first: usize| {
            format!(
                "parent_table = {} AND parent = {} AND child_table <> ''",
                p(first),
                p(first + 1)
            )
        };
        let child = format!("child_table = {} AND child = {}", p(1), p(2));
        let count = format!("parent_table = '' AND parent = 0 AND {child}");
        let window_cols =
            "SELECT parent_table, parent, child_table, child, outcome, at, settled_only FROM";
        let order = format!(
            "ORDER BY {PK} {}",
            (self.claim_limit)(&SWEEP_WINDOW.to_string())
        );
        let past = match how.row_values {
            true => format!("({PK}) > ({}, {}, {}, {})", p(1), p(2), p(3), p(4)),
            false => format!(
                "(parent_table > {} OR (parent_table = {} AND (parent > {} OR (parent = {} AND \
                 (child_table > {} OR (child_table = {} AND child > {}))))))",
                p(1),
                p(2),
                p(3),
                p(4),
                p(5),
                p(6),
                p(7)
            ),
        };
        let classes = NAMED_MANY.trailing_zeros() as usize + 1;
        let head_touch_many = (0..classes)
            .map(|k| {
                let rows: Vec<String> = (0..1usize << k)
                    .map(|i| {
                        format!(
                            "({}, {}, '', 0, 0, NULL, {})",
                            p(3 * i + 1),
                            p(3 * i + 2),
                            p(3 * i + 3)
                        )
                    })
                    .collect();
                // Where the upsert returns its rows (PostgreSQL, SQLite), what each head
                // holds comes back with it; MySQL reads them next (`head_read_many`).
                let returning = match upsert {
                    Upsert::OnConflict => " RETURNING parent, outcome",
                    Upsert::DuplicateKey => "",
                };
                format!(
                    "INSERT INTO {t} (parent_table, parent, child_table, child, settled_only, \
                     outcome, at) VALUES {} {}{returning}",
                    rows.join(", "),
                    upsert.update(PK, &moved_at(&upsert.new_value("at")))
                )
            })
            .collect();
        // MySQL: each head by its whole primary key, a point of the key's range each.
        let head_read_many = match upsert {
            Upsert::OnConflict => String::new(),
            Upsert::DuplicateKey => format!(
                "SELECT parent, outcome FROM {t} WHERE parent_table = {} AND parent IN ({}) AND \
                 child_table = '' AND child = 0{}",
                p(1),
                (2..NAMED_MANY + 2).map(p).collect::<Vec<_>>().join(", "),
                how.locking
            ),
        };
        let wait_insert_many = (0..classes)
            .map(|k| {
                let rows: Vec<String> = (0..1usize << k)
                    .map(|i| {
                        let v: Vec<String> = (1..=8).map(|c| p(8 * i + c)).collect();
                        format!("({})", v.join(", "))
                    })
                    .collect();
                format!("INSERT INTO {t} {cols} VALUES {}", rows.join(", "))
            })
            .collect();
        DepsSql {
            signals: self.signal_sql(DEPS_TABLE, how.locking),
            create,
            head_touch_many,
            head_read_many,
            wait_insert_many,
            add_output: format!("ALTER TABLE {t} ADD COLUMN output {bytes}"),
            begin_write: how.begin_write.to_string(),
            head_touch: touch,
            head_read: format!("SELECT outcome FROM {t} WHERE {}{}", head(1), how.locking),
            head_settle: settle,
            head_reset: format!(
                "UPDATE {t} SET outcome = NULL, output = NULL, settled_only = 0, {} WHERE {}",
                moved_at(&p(1)),
                head(2)
            ),
            unhead: format!("DELETE FROM {t} WHERE {}", head(1)),
            head_output: format!("SELECT output FROM {t} WHERE {}", head(1)),
            waits_keep_output: format!(
                "UPDATE {t} SET output = {} WHERE {} AND outcome IS NOT NULL AND output IS NULL",
                p(1),
                of(2)
            ),
            wait_insert: format!(
                "INSERT INTO {t} {cols} VALUES ({}, {}, {}, {}, {}, {}, {}, {})",
                p(1),
                p(2),
                p(3),
                p(4),
                p(5),
                p(6),
                p(7),
                p(8)
            ),
            wait_set: format!(
                "UPDATE {t} SET outcome = {} WHERE parent_table = {} AND parent = {} AND \
                 child_table = {} AND child = {}",
                p(1),
                p(2),
                p(3),
                p(4),
                p(5)
            ),
            dependents: format!(
                "SELECT child_table, child, settled_only FROM {t} WHERE {} AND outcome IS NULL \
                 ORDER BY child_table, child",
                of(1)
            ),
            all_dependents: format!(
                "SELECT child_table, child FROM {t} WHERE {} ORDER BY child_table, child",
                of(1)
            ),
            has_waits: format!(
                "SELECT 1 FROM {t} WHERE {} {}",
                of(1),
                (self.claim_limit)("1")
            ),
            mark: format!(
                "UPDATE {t} SET outcome = {} WHERE {} AND outcome IS NULL",
                p(1),
                of(2)
            ),
            count_insert: format!(
                "INSERT INTO {t} (parent_table, parent, child_table, child, settled_only, \
                 outcome, at, pending) VALUES ('', 0, {}, {}, 0, NULL, {}, {})",
                p(1),
                p(2),
                p(3),
                p(4)
            ),
            count_down: format!("UPDATE {t} SET pending = pending - 1 WHERE {count}"),
            count_read: format!("SELECT pending FROM {t} WHERE {count}"),
            count_forget: format!("DELETE FROM {t} WHERE {count}"),
            parents: format!(
                "SELECT w.parent_table, w.parent, w.settled_only, w.outcome, COALESCE(w.output, \
                 CASE WHEN h.outcome = w.outcome THEN h.output END) FROM {t} w LEFT JOIN {t} h \
                 ON h.parent_table = w.parent_table AND \
                 h.parent = w.parent AND h.child_table = '' AND h.child = 0 WHERE w.child_table \
                 = {} AND w.child = {} AND w.parent_table <> '' ORDER BY w.parent_table, w.parent",
                p(1),
                p(2)
            ),
            forget_waits: format!("DELETE FROM {t} WHERE {child}"),
            // The head read by the primary key: `child_table = ''` would let a planner read
            // it through the child index, which holds every head under that one key.
            forget_all: format!(
                "DELETE FROM {t} WHERE ({child}) OR (parent_table = {} AND parent = {} AND \
                 LENGTH(child_table) = 0)",
                p(3),
                p(4)
            ),
            pending_of_table: format!(
                "SELECT DISTINCT parent FROM {t} WHERE parent_table = {} AND child_table <> '' \
                 AND outcome IS NULL ORDER BY parent",
                p(1)
            ),
            forget_table: format!(
                "DELETE FROM {t} WHERE child_table = {} OR (parent_table = {} AND \
                 (LENGTH(child_table) = 0 OR outcome IS NULL))",
                p(1),
                p(2)
            ),
            forget_signals: format!(
                "DELETE FROM {t} WHERE parent = {} AND parent_table LIKE '!%'",
                p(1)
            ),
            window_first: format!("{window_cols} {t} {order}"),
            window: format!("{window_cols} {t} WHERE {past} {order}"),
            window_spelled: !how.row_values,
            sweep_many: {
                // Spelled as equalities on the primary key's first columns, which every
                // database reads as that many index lookups (with `child_table = ''`, a
                // planner may read every head through the child index instead).
                let heads: Vec<String> = (0..SWEEP_BATCH)
                    .map(|i| {
                        format!(
                            "(parent_table = {} AND parent = {} AND at = {})",
                            p(3 * i + 1),
                            p(3 * i + 2),
                            p(3 * i + 3)
                        )
                    })
                    .collect();
                format!(
                    "DELETE FROM {t} WHERE LENGTH(child_table) = 0 AND outcome IS NOT NULL AND \
                     ({})",
                    heads.join(" OR ")
                )
            },
        }
    }

    /// A table's own statements for its waiting jobs; `None` without
    /// [`Table::dependencies`](crate::Table::dependencies). `how` spells the head a purge
    /// records.
    pub fn waiting_sql(&self, spec: &TableSpec, how: &Spelling) -> Option<WaitingSql> {
        if !spec.dependencies {
            return None;
        }
        let t = self.q(&spec.name);
        let (id, run_at, dead_at) = (
            self.q(&spec.id),
            self.q(&spec.run_at),
            self.q(&spec.dead_at),
        );
        let reason = self.q(&spec.dead_reason);
        let p = |n| self.p(n);
        let completed = spec.completed_at.as_ref().map(|c| self.q(c));
        let output = spec.output.as_ref().map(|c| self.q(c));
        // Every dead letter frees its dedup key.
        let free_key = spec
            .dedup_key
            .as_ref()
            .map(|k| format!(", {} = NULL", self.q(k)))
            .unwrap_or_default();
        let is_dead = match &completed {
            Some(c) => format!("{dead_at} IS NOT NULL AND {c} IS NULL"),
            None => format!("{dead_at} IS NOT NULL"),
        };
        // A cancel, told apart from a dead letter whose reason reads the same: a row completed
        // and cancelled (a table that keeps completed rows), or a dead letter whose cancel was
        // requested in work (lease and advisory forms); never the reason text alone.
        let cancelled = {
            let said = format!("{reason} = '{CANCELLED}'");
            let requested = (spec.form != Form::RowLock)
                .then(|| format!("{} <> 0", self.q(&spec.cancel_requested)));
            let how: Vec<String> = completed
                .iter()
                .map(|c| format!("{c} IS NOT NULL"))
                .chain(requested)
                .collect();
            match how.is_empty() {
                true => "0".to_string(),
                false => format!(
                    "CASE WHEN {said} AND ({}) THEN 1 ELSE 0 END",
                    how.join(" OR ")
                ),
            }
        };
        let deps = self.q(DEPS_TABLE);
        // A head kept a day from now: made, or (jobs wait on the job) its `at` moved on.
        let kept_a_day = |insert: String| match how.upsert {
            Upsert::OnConflict => format!(
                "{insert} ON CONFLICT ({PK}) DO UPDATE SET settled_only = 1, at = \
                 {}({deps}.at + 1, excluded.at)",
                how.greatest
            ),
            Upsert::DuplicateKey => format!(
                "{insert} ON DUPLICATE KEY UPDATE settled_only = 1, at = {}(at + 1, \
                 VALUES(at))",
                how.greatest
            ),
        };
        let heads_dead = {
            // Kept a day (`settled_only` 1) from the purge; a head there already (jobs wait on
            // the job) keeps its outcome and output, its `at` moved on to the purge's (the
            // job may have settled long before), and is kept a day from then once they have
            // settled.
            let insert = format!(
                "INSERT INTO {deps} (parent_table, parent, child_table, child, settled_only, \
                 outcome, at) SELECT {}, {id}, '', 0, 1, {}, {} FROM {t} WHERE {is_dead} AND {id} \
                 > {} AND {id} <= {}",
                (self.literal)(&spec.name),
                p(1),
                p(2),
                p(3),
                p(4)
            );
            kept_a_day(insert)
        };
        // A prune's counterpart of `heads_dead`, for the cancels a table keeps completed.
        let heads_cancelled = completed.as_ref().map(|c| {
            let insert = format!(
                "INSERT INTO {deps} (parent_table, parent, child_table, child, settled_only, \
                 outcome, at) SELECT {}, {id}, '', 0, 1, '{CANCELLED}', {} FROM {t} WHERE {c} IS \
                 NOT NULL AND {c} < {} AND {reason} = '{CANCELLED}' AND {id} > {} AND {id} <= {}",
                (self.literal)(&spec.name),
                p(1),
                p(2),
                p(3),
                p(4)
            );
            kept_a_day(insert)
        });
        Some(WaitingSql {
            release: format!(
                "UPDATE {t} SET {run_at} = {} WHERE {id} = {} AND {run_at} = {} AND {dead_at} IS NULL",
                p(1),
                p(2),
                p(3)
            ),
            dead: format!(
                "UPDATE {t} SET {dead_at} = {}, {reason} = {}{free_key} WHERE {id} = {} AND \
                 {run_at} = {} AND {dead_at} IS NULL",
                p(1),
                p(2),
                p(3),
                p(4)
            ),
            wait_again: format!(
                "UPDATE {t} SET {run_at} = {} WHERE {id} = {} AND {dead_at} IS NULL",
                p(1),
                p(2)
            ),
            state: format!(
                "SELECT {dead_at}, {cancelled}, {}, {} FROM {t} WHERE {id} = {}",
                completed.as_deref().unwrap_or("NULL"),
                output.as_deref().unwrap_or("NULL"),
                p(1)
            ),
            states: format!(
                "SELECT {id}, {dead_at}, {cancelled}, {} FROM {t} WHERE {id} IN ({})",
                completed.as_deref().unwrap_or("NULL"),
                (1..=STATES_BATCH).map(p).collect::<Vec<_>>().join(", ")
            ),
            count_waiting: format!(
                "SELECT count(*) FROM {t} WHERE {dead_at} IS NULL AND {run_at} = {}",
                p(1)
            ),
            dead_after: format!(
                "SELECT {id} FROM {t} WHERE {is_dead} AND {id} > {} ORDER BY {id} LIMIT {}",
                p(1),
                p(2)
            ),
            forget_gone: format!(
                "DELETE FROM {deps} WHERE child_table = {} AND child > {} AND child <= {} AND NOT \
                 EXISTS (SELECT 1 FROM {t} WHERE {t}.{id} = {deps}.child)",
                p(1),
                p(2),
                p(3)
            ),
            heads_dead,
            heads_cancelled,
        })
    }
}
