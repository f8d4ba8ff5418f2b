//! The statements of jobs that wait on other jobs ([`Table::dependencies`]), the same on every
//! database but for quoting, placeholders, the locking clause and how an insert meets a row
//! already there.
//!
//! One table per database, `sqlbroker_deps`, holds two kinds of rows:
//! - a job's **head** (`child_table = ''`, `child = 0`): made by the first publish that names
//!   the job or by its settlement, it holds the job's outcome once settled (`NULL` before).
//!   Publishers and the settlement lock it, so a publish that names a job and that job's
//!   settlement never pass each other unseen;
//!   With [`Table::outputs`], the head also holds what the job produced (`output`), for the
//!   jobs waiting on it;
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
use crate::model::table::TableSpec;

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
    /// `(table, id, at)` makes the job's head if there is none, and locks it (the servers).
    pub head_touch: String,
    /// `(table, id)` -> the job's recorded outcome (`NULL`: not settled), its head locked (the
    /// servers: `FOR UPDATE`, a current read).
    pub head_read: String,
    /// `(table, id, outcome, at, output)` records the job's outcome and output in its head,
    /// made if missing.
    pub head_settle: String,
    /// `(parent table, parent, child table, child, settled_only, outcome, at)` makes a wait.
    pub wait_insert: String,
    /// `(table, id)` -> `child_table, child, settled_only` of the jobs waiting on it whose wait
    /// has no outcome yet, in `(child_table, child)` order (the order their counts are locked
    /// in).
    pub dependents: String,
    /// `(table, id)` -> `child_table, child` of every job waiting on it (operators' view).
    pub all_dependents: String,
    /// `(outcome, table, id)` records a parent's outcome in its waits that have none.
    pub mark: String,
    /// `(table, id, at, pending)` makes a waiting job's count.
    pub count_insert: String,
    /// `(table, id)` counts a waiting job down by one, locking its count.
    pub count_down: String,
    /// `(table, id)` -> the waiting job's count (after this transaction's own count down).
    pub count_read: String,
    /// `(table, id)` -> `parent_table, parent, settled_only, outcome, output` of the job's
    /// waits, by parent (the output from the parent's head).
    pub parents: String,
    /// `(table, id)` deletes the job's waits and count (it settled: nothing holds it any more).
    pub forget_waits: String,
    /// `(before)` -> `parent_table, parent` of up to 500 heads of jobs settled before `before`
    /// (milliseconds since the epoch) that no job waits on any more, read without locking: a
    /// delete that scanned the table locked what settlements held, and deadlocked with them
    /// (MariaDB). A head some job still waits on stays: it holds the output that job reads.
    /// A later publish that names a swept job finds it gone from its table, as an acked job
    /// that was not kept.
    pub sweep_pick: String,
    /// `(table, id, before)` deletes one of those heads, if it is still that old.
    pub sweep_one: String,
}

/// A waiting table's own statements, parameters listed as `(..)`.
#[derive(Debug, Clone, Default)]
pub(crate) struct WaitingSql {
    /// `(now, id, latest)` makes a waiting job due now.
    pub release: String,
    /// `(now, reason, id, latest)` dead-letters a waiting job, freeing its dedup key as every
    /// dead letter does.
    pub dead: String,
    /// `(id)` -> `dead_at, dead_reason[, completed_at]` of the job, if it is in the table.
    pub state: String,
    /// `(latest)` -> the count of the jobs that wait.
    pub count_waiting: String,
}

impl Syntax {
    /// The waits' statements. `key_type` is the table name columns' type, `table_tail` what
    /// follows the table definition (MySQL: its engine), `index_inline`: MySQL writes the
    /// child index in the table definition; `locking` the servers' `FOR UPDATE`; `bytes` the
    /// outputs' type.
    #[allow(clippy::too_many_arguments)]
    pub fn deps_sql(
        &self,
        key_type: &str,
        bytes: &str,
        table_tail: &str,
        index_inline: bool,
        locking: &str,
        upsert: Upsert,
    ) -> DepsSql {
        let t = self.q(DEPS_TABLE);
        let index = self.q(&format!("{DEPS_TABLE}_child"));
        let cols = "(parent_table, parent, child_table, child, settled_only, outcome, at)";
        let pk = "parent_table, parent, child_table, child";
        let mut create = vec![format!(
            "CREATE TABLE IF NOT EXISTS {t} (parent_table {key_type} NOT NULL, parent BIGINT NOT \
             NULL, child_table {key_type} NOT NULL, child BIGINT NOT NULL, settled_only \
             SMALLINT NOT NULL, outcome VARCHAR(16) NULL, at BIGINT NOT NULL, pending BIGINT NULL, \
             output {bytes}, PRIMARY KEY ({pk}){}){table_tail}",
            if index_inline {
                format!(", INDEX {index} (child_table, child)")
            } else {
                String::new()
            }
        )];
        if !index_inline {
            create.push(format!(
                "CREATE INDEX IF NOT EXISTS {index} ON {t} (child_table, child)"
            ));
        }
        let head = |first: usize| {
            format!(
                "parent_table = {} AND parent = {} AND child_table = '' AND child = 0",
                self.p(first),
                self.p(first + 1)
            )
        };
        let head_values = |outcome: &str, at: usize| {
            format!(
                "INSERT INTO {t} {cols} VALUES ({}, {}, '', 0, 0, {outcome}, {})",
                self.p(1),
                self.p(2),
                self.p(at)
            )
        };
        let settled_head = format!(
            "INSERT INTO {t} (parent_table, parent, child_table, child, settled_only, outcome, \
             at, output) VALUES ({}, {}, '', 0, 0, {}, {}, {})",
            self.p(1),
            self.p(2),
            self.p(3),
            self.p(4),
            self.p(5)
        );
        let (touch, settle) = match upsert {
            Upsert::OnConflict => (
                format!(
                    "{} ON CONFLICT ({pk}) DO UPDATE SET at = {t}.at",
                    head_values("NULL", 3)
                ),
                format!(
                    "{settled_head} ON CONFLICT ({pk}) DO UPDATE SET outcome = excluded.outcome, \
                     at = excluded.at, output = excluded.output"
                ),
            ),
            Upsert::DuplicateKey => (
                format!("{} ON DUPLICATE KEY UPDATE at = at", head_values("NULL", 3)),
                format!(
                    "{settled_head} ON DUPLICATE KEY UPDATE outcome = VALUES(outcome), at = \
                     VALUES(at), output = VALUES(output)"
                ),
            ),
        };
        let of = |first: usize| {
            format!(
                "parent_table = {} AND parent = {} AND child_table <> ''",
                self.p(first),
                self.p(first + 1)
            )
        };
        let child = format!("child_table = {} AND child = {}", self.p(1), self.p(2));
        let count = format!("parent_table = '' AND parent = 0 AND {child}");
        DepsSql {
            create,
            add_output: format!("ALTER TABLE {t} ADD COLUMN output {bytes}"),
            head_touch: touch,
            head_read: format!("SELECT outcome FROM {t} WHERE {}{locking}", head(1)),
            head_settle: settle,
            wait_insert: format!(
                "INSERT INTO {t} {cols} VALUES ({}, {}, {}, {}, {}, {}, {})",
                self.p(1),
                self.p(2),
                self.p(3),
                self.p(4),
                self.p(5),
                self.p(6),
                self.p(7)
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
            mark: format!(
                "UPDATE {t} SET outcome = {} WHERE {} AND outcome IS NULL",
                self.p(1),
                of(2)
            ),
            count_insert: format!(
                "INSERT INTO {t} (parent_table, parent, child_table, child, settled_only, \
                 outcome, at, pending) VALUES ('', 0, {}, {}, 0, NULL, {}, {})",
                self.p(1),
                self.p(2),
                self.p(3),
                self.p(4)
            ),
            count_down: format!("UPDATE {t} SET pending = pending - 1 WHERE {count}"),
            count_read: format!("SELECT pending FROM {t} WHERE {count}"),
            parents: format!(
                "SELECT w.parent_table, w.parent, w.settled_only, w.outcome, h.output FROM {t} w \
                 LEFT JOIN {t} h ON h.parent_table = w.parent_table AND h.parent = w.parent AND \
                 h.child_table = '' AND h.child = 0 WHERE w.child_table = {} AND w.child = {} \
                 AND w.parent_table <> '' ORDER BY w.parent_table, w.parent",
                self.p(1),
                self.p(2)
            ),
            forget_waits: format!("DELETE FROM {t} WHERE {child}"),
            sweep_pick: format!(
                "SELECT h.parent_table, h.parent FROM {t} h WHERE h.child_table = '' AND \
                 h.outcome IS NOT NULL AND h.at < {} AND NOT EXISTS (SELECT 1 FROM {t} w WHERE \
                 w.parent_table = h.parent_table AND w.parent = h.parent AND w.child_table <> '') \
                 {}",
                self.p(1),
                (self.claim_limit)("500")
            ),
            sweep_one: format!("DELETE FROM {t} WHERE {} AND at < {}", head(1), self.p(3)),
        }
    }

    /// A table's own statements for its waiting jobs; `None` without
    /// [`Table::dependencies`](crate::Table::dependencies).
    pub fn waiting_sql(&self, spec: &TableSpec) -> Option<WaitingSql> {
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
        let completed = spec
            .completed_at
            .as_ref()
            .map(|c| format!(", {}", self.q(c)))
            .unwrap_or_default();
        // Every dead letter frees its dedup key, a job's dead-lettered through one it waits
        // on too.
        let free_key = spec
            .dedup_key
            .as_ref()
            .map(|k| format!(", {} = NULL", self.q(k)))
            .unwrap_or_default();
        Some(WaitingSql {
            release: format!(
                "UPDATE {t} SET {run_at} = {} WHERE {id} = {} AND {run_at} = {} AND {dead_at} IS NULL",
                self.p(1),
                self.p(2),
                self.p(3)
            ),
            dead: format!(
                "UPDATE {t} SET {dead_at} = {}, {reason} = {}{free_key} WHERE {id} = {} AND \
                 {run_at} = {} AND {dead_at} IS NULL",
                self.p(1),
                self.p(2),
                self.p(3),
                self.p(4)
            ),
            state: format!(
                "SELECT {dead_at}, {reason}{completed} FROM {t} WHERE {id} = {}",
                self.p(1)
            ),
            count_waiting: format!(
                "SELECT count(*) FROM {t} WHERE {dead_at} IS NULL AND {run_at} = {}",
                self.p(1)
            ),
        })
    }
}
