//! The statements of collected jobs ([`Message::collect`](crate::Message::collect)), the same
//! on every database but for quoting, placeholders, the locking clause and how an insert meets
//! a row already there.
//!
//! One table per database, `sqlbroker_collect`, holds a row per table and collect key: the
//! key's last job (`job`, 0 for none yet), when its first event came (`first_ms`, epoch
//! milliseconds) and when it is due (`due`, epoch seconds). Every publish of a key locks its
//! row first, so the publishes of one key take turns and each sees what the one before
//! committed. The events themselves are in the job's payload ([`crate::model::collect`]).
//!
//! A key's row is of no use once its job is due (an event then starts the next job and
//! rewrites the row): [`CollectSql::sweep`] deletes such rows a minute after, database-wide.

use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::OnceLock;

use crate::dialect::Dialect;
use crate::model::table::{Form, TableSpec};

/// The name of the keys' table.
pub(crate) const COLLECT_TABLE: &str = "sqlbroker_collect";

/// The most rows one [`CollectSql::sweep`] deletes.
pub(crate) const SWEEP_ROWS: usize = 100;

/// A table's collect statements, parameters listed as `(..)`.
#[derive(Debug, Clone)]
pub(crate) struct CollectSql {
    /// Makes the keys' table and its index by due time, if they do not exist.
    pub create: Vec<String>,
    /// `(table, key)` makes the key's row (no job) if there is none, and locks it (the
    /// servers).
    pub key_lock: String,
    /// `(table, key)` -> `job, first_ms` of the key's row, locked.
    pub key_read: String,
    /// `(job, first_ms, due, table, key)` points the key's row at its job.
    pub key_set: String,
    /// `(id)` -> the job's payload if it still collects, its row locked: not finished, never
    /// claimed (no attempt spent, no checkpoint, no lease), and not yet due by the
    /// database's clock, the clock claims read. A row another transaction holds (a row lock
    /// claim) is skipped, not waited for: it collects no more.
    pub open: String,
    /// `(payload, run_at, id)` writes an event appended and the job's new due time.
    pub append: String,
    /// `(id)` makes the job due now (it is full).
    pub close: String,
    /// `(cutoff)` deletes at most [`SWEEP_ROWS`] keys' rows due before `cutoff` (epoch
    /// seconds), skipping (the servers) or waiting for (SQLite's one writer) those a publish
    /// holds.
    pub sweep: String,
    /// Reads nothing from the keys' table: an error says it is missing.
    pub exists: String,
}

/// A broker's collect state of one table: its statements, built once, whether this broker
/// has made (or found) the keys' table, and when it last swept it.
#[derive(Debug, Default)]
pub(crate) struct Collects {
    pub sql: OnceLock<CollectSql>,
    pub made: AtomicBool,
    /// Epoch seconds of the last sweep.
    pub swept: AtomicU64,
    /// The broker runs no DDL ([`manage_schema(false)`](crate::BrokerBuilder::manage_schema)):
    /// a missing keys' table is an error, never made.
    pub no_ddl: bool,
}

/// The collect statements of `spec` on `dialect`.
pub(crate) fn statements(dialect: &dyn Dialect, spec: &TableSpec) -> CollectSql {
    let s = dialect.syntax();
    let database = dialect.database();
    let (mysql, sqlite) = (database == "MySQL", database == "SQLite");
    let c = s.q(COLLECT_TABLE);
    let p = |n| s.p(n);
    let (tbl_type, key_type, tail) = match (mysql, sqlite) {
        (true, _) => (
            "VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin",
            // Bytes compare byte for byte: no collation pads or folds a key.
            "VARBINARY(1020)",
            " ENGINE=InnoDB",
        ),
        _ => ("TEXT", "TEXT", ""),
    };
    let index = s.q(&format!("{COLLECT_TABLE}_due"));
    let mut create = vec![format!(
        "CREATE TABLE IF NOT EXISTS {c} (tbl {tbl_type} NOT NULL, ckey {key_type} NOT NULL, \
         job BIGINT NOT NULL, first_ms BIGINT NOT NULL, due BIGINT NOT NULL, PRIMARY KEY \
         (tbl, ckey){}){tail}",
        if mysql {
            format!(", INDEX {index} (due)")
        } else {
            String::new()
        }
    )];
    if !mysql {
        create.push(format!("CREATE INDEX IF NOT EXISTS {index} ON {c} (due)"));
    }
    let locking = if sqlite { "" } else { " FOR UPDATE" };
    let key_lock = match mysql {
        true => format!(
            "INSERT INTO {c} (tbl, ckey, job, first_ms, due) VALUES ({}, {}, 0, 0, 0) ON \
             DUPLICATE KEY UPDATE job = job",
            p(1),
            p(2)
        ),
        false => format!(
            "INSERT INTO {c} (tbl, ckey, job, first_ms, due) VALUES ({}, {}, 0, 0, 0) ON \
             CONFLICT (tbl, ckey) DO UPDATE SET job = {c}.job",
            p(1),
            p(2)
        ),
    };
    let key_read = format!(
        "SELECT job, first_ms FROM {c} WHERE tbl = {} AND ckey = {}{locking}",
        p(1),
        p(2)
    );
    let key_set = format!(
        "UPDATE {c} SET job = {}, first_ms = {}, due = {} WHERE tbl = {} AND ckey = {}",
        p(1),
        p(2),
        p(3),
        p(4),
        p(5)
    );
    let t = s.q(&spec.name);
    let (id, run_at, now) = (s.q(&spec.id), s.q(&spec.run_at), s.now);
    let mut never_claimed = format!(
        "{} IS NULL AND {} = 0 AND {run_at} > {now}",
        s.q(&spec.dead_at),
        s.q(&spec.attempts)
    );
    if let Some(cp) = &spec.checkpoint {
        never_claimed.push_str(&format!(" AND {} IS NULL", s.q(cp)));
    }
    if spec.form == Form::Lease {
        never_claimed.push_str(&format!(" AND {} IS NULL", s.q(&spec.locked_until)));
    }
    let skip = if sqlite {
        ""
    } else {
        " FOR UPDATE SKIP LOCKED"
    };
    let open = format!(
        "SELECT {} FROM {t} WHERE {id} = {} AND {never_claimed}{skip}",
        s.q(&spec.payload),
        p(1)
    );
    let append = format!(
        "UPDATE {t} SET {} = {}, {run_at} = {} WHERE {id} = {}",
        s.q(&spec.payload),
        p(1),
        p(2),
        p(3)
    );
    let close = format!("UPDATE {t} SET {run_at} = {now} WHERE {id} = {}", p(1));
    let sweep = match (mysql, sqlite) {
        // A publish holding a key's row is passed by, not waited for.
        (false, false) => format!(
            "DELETE FROM {c} WHERE ctid IN (SELECT ctid FROM {c} WHERE due < {} LIMIT \
             {SWEEP_ROWS} FOR UPDATE SKIP LOCKED)",
            p(1)
        ),
        (true, _) => format!("DELETE FROM {c} WHERE due < {} LIMIT {SWEEP_ROWS}", p(1)),
        (false, true) => format!(
            "DELETE FROM {c} WHERE rowid IN (SELECT rowid FROM {c} WHERE due < {} LIMIT \
             {SWEEP_ROWS})",
            p(1)
        ),
    };
    CollectSql {
        create,
        key_lock,
        key_read,
        key_set,
        open,
        append,
        close,
        sweep,
        exists: format!("SELECT job FROM {c} WHERE 1 = 0"),
    }
}

#[cfg(all(test, feature = "postgres", feature = "mysql", feature = "sqlite"))]
mod tests {
    use super::*;
    use crate::model::table::Table;

    fn sql(url: &str, t: Table) -> CollectSql {
        let dialect = crate::dialect::open(url, &crate::dialect::test_options()).unwrap();
        statements(&*dialect, &t.validate().unwrap())
    }

    /// The text of each database's statements, MySQL 8's among them (only MariaDB runs
    /// here): the key's row locked by its upsert, keys compared byte for byte, the job's row
    /// read as still collecting (never claimed in any form, not due by the server's clock) and
    /// passed by when another transaction holds it, the sweep bounded. Fails if a condition or
    /// the locking clause is dropped from a statement.
    #[test]
    fn statements_per_database() {
        let my = sql(
            "mysql://root@127.0.0.1:3306/test",
            Table::new("jobs").lease(std::time::Duration::from_secs(30)),
        );
        assert!(my.create[0].contains("ckey VARBINARY(1020) NOT NULL"));
        assert!(my.create[0].ends_with("INDEX `sqlbroker_collect_due` (due)) ENGINE=InnoDB"));
        assert_eq!(
            my.key_lock,
            "INSERT INTO `sqlbroker_collect` (tbl, ckey, job, first_ms, due) VALUES (?, ?, 0, 0, \
             0) ON DUPLICATE KEY UPDATE job = job"
        );
        assert!(my
            .key_read
            .ends_with("WHERE tbl = ? AND ckey = ? FOR UPDATE"));
        assert_eq!(
            my.open,
            "SELECT `payload` FROM `jobs` WHERE `id` = ? AND `dead_at` IS NULL AND `attempts` = \
             0 AND `run_at` > UTC_TIMESTAMP() AND `locked_until` IS NULL FOR UPDATE SKIP LOCKED"
        );
        assert_eq!(
            my.sweep,
            "DELETE FROM `sqlbroker_collect` WHERE due < ? LIMIT 100"
        );
        let pg = sql(
            "postgres://postgres@127.0.0.1:5432/test",
            Table::new("jobs").checkpoints(),
        );
        assert_eq!(
            pg.open,
            "SELECT \"payload\" FROM \"jobs\" WHERE \"id\" = $1 AND \"dead_at\" IS NULL AND \
             \"attempts\" = 0 AND \"run_at\" > date_trunc('second', statement_timestamp()) AND \
             \"checkpoint\" IS NULL FOR UPDATE SKIP LOCKED"
        );
        assert!(pg
            .key_lock
            .ends_with("ON CONFLICT (tbl, ckey) DO UPDATE SET job = \"sqlbroker_collect\".job"));
        assert!(pg.sweep.contains("LIMIT 100 FOR UPDATE SKIP LOCKED)"));
        let lite = sql(
            "sqlite::memory:",
            Table::new("jobs")
                .text_column("k")
                .advisory_lock("jobs-{k}"),
        );
        assert!(!lite.open.contains("FOR UPDATE"));
        assert!(!lite.open.contains("locked_until"));
        assert!(lite.sweep.contains("rowid IN (SELECT rowid"));
    }
}
