//! The statements of named queues' pauses ([`Table::queues`](crate::Table::queues)): one table
//! per database, `sqlbroker_paused_queues`, a row per paused queue of a table, which every
//! claim of a table with queues reads (`NOT EXISTS`, a probe of its primary key): a queue's
//! pause is followed by the next claim of every broker, and costs the claims of tables without
//! queues nothing (their statements do not name it).
//!
//! Its columns are named `paused_table_name` and `paused_queue_name`, names no table of the
//! library's has, so the claim's condition can name the claimed table's queue column
//! unqualified (claims alias their table, or not) and it still means the outer row's.

use crate::dialect::deps::{Spelling, Upsert};
use crate::dialect::shared::{standard_literal, Syntax};
use crate::model::table::TableSpec;

/// The name of the paused queues' table.
pub(crate) const PAUSED_QUEUES: &str = "sqlbroker_paused_queues";

/// The statements of the paused queues' table, made once per database.
#[derive(Debug, Clone)]
pub(crate) struct PausedQueuesSql {
    /// Makes the table if it is not there.
    pub create: String,
    /// `(table, queue, now)`: the queue is paused (again: nothing changes).
    pub pause: String,
    /// `(table, queue)`: the queue is not paused.
    pub resume: String,
    /// `(table)` -> the table's paused queues, by name.
    pub list: String,
    /// `(table)`: forgets the table's paused queues (the table dropped).
    pub forget: String,
}

impl Syntax {
    /// [`PausedQueuesSql`] in this database's spelling (`time`: its time column type).
    pub fn paused_queues_sql(&self, s: &Spelling, time: &str) -> PausedQueuesSql {
        let t = self.q(PAUSED_QUEUES);
        let (tn, qn, at) = (
            self.q("paused_table_name"),
            self.q("paused_queue_name"),
            self.q("paused_at"),
        );
        let insert = format!(
            "INSERT INTO {t} ({tn}, {qn}, {at}) VALUES ({}, {}, {})",
            self.p(1),
            self.p(2),
            self.p(3)
        );
        PausedQueuesSql {
            create: format!(
                "CREATE TABLE IF NOT EXISTS {t} ({tn} {k} NOT NULL, {qn} {k} NOT NULL, {at} {time} \
                 NOT NULL, PRIMARY KEY ({tn}, {qn})){}",
                s.table_tail,
                k = s.key_type
            ),
            pause: match s.upsert {
                Upsert::OnConflict => format!("{insert} ON CONFLICT DO NOTHING"),
                Upsert::DuplicateKey => format!("{insert} ON DUPLICATE KEY UPDATE {at} = {at}"),
            },
            resume: format!(
                "DELETE FROM {t} WHERE {tn} = {} AND {qn} = {}",
                self.p(1),
                self.p(2)
            ),
            list: format!(
                "SELECT {qn} FROM {t} WHERE {tn} = {} ORDER BY {qn}",
                self.p(1)
            ),
            forget: format!("DELETE FROM {t} WHERE {tn} = {}", self.p(1)),
        }
    }

    /// Tables with queues: ` AND NOT EXISTS (..)`, the claimed row's queue is not paused;
    /// empty for other tables. The table's name is a checked identifier, written as a
    /// literal so the claim's parameters stay as they are.
    pub fn not_paused_queue(&self, spec: &TableSpec) -> String {
        let Some(c) = spec.queue.and_then(|i| spec.columns.get(i)) else {
            return String::new();
        };
        // `NULL` (a column adopted from the table's own) is the default queue.
        format!(
            " AND NOT EXISTS (SELECT 1 FROM {} WHERE {} = {} AND {} = COALESCE({}, {}))",
            self.q(PAUSED_QUEUES),
            self.q("paused_table_name"),
            standard_literal(&spec.name),
            self.q("paused_queue_name"),
            self.q(&c.name),
            standard_literal(crate::model::table::DEFAULT_QUEUE)
        )
    }
}
