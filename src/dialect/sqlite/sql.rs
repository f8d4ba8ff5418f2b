//! The SQLite statement text of a table, built once when the table is first used: the claims,
//! settlements and DDL ([`compile`], [`create_table`]) and the lease renewal ([`renew_sql`]).

use std::time::SystemTime;

use crate::dialect::shared::{ColumnTypes, Syntax};
use crate::dialect::TableSql;
use crate::model::table::{Form, TableSpec};
use crate::model::value::Value;

pub(super) const SYNTAX: Syntax = Syntax {
    quote: quote_ident,
    param: |n| format!("?{n}"),
    // 'now' is one value for the whole statement.
    now: "CAST(strftime('%s', 'now') AS INTEGER)",
    // Not a bare parameter: SQLite (3.50 measured) reads a bare `LIMIT ?` while planning and
    // so compiles the statement again at every execution (5-10% of a claim's instructions;
    // one compilation per row on the plain path); `+ 0` makes it an expression the planner
    // leaves alone, and the plan is the same.
    claim_limit: |p| format!("LIMIT {p} + 0"),
    literal: crate::dialect::shared::standard_literal,
    stamps_created: false,
    contains: |h, n| format!("instr({h}, {n}) > 0"),
    row_compare: true,
    force_index: false,
};

/// Times are integer seconds since the Unix epoch.
const TYPES: ColumnTypes = ColumnTypes {
    id: "INTEGER PRIMARY KEY AUTOINCREMENT",
    payload: "BLOB NOT NULL",
    attempts: "INTEGER NOT NULL DEFAULT 0",
    run_at: "INTEGER NOT NULL",
    time: "INTEGER",
    reason: "TEXT",
    priority: "INTEGER NOT NULL DEFAULT 0",
    // Unix seconds, as every time column here holds them.
    created_at: "INTEGER DEFAULT (CAST(strftime('%s', 'now') AS INTEGER))",
    add_created_at,
    text: "TEXT",
    int: "INTEGER",
    float: "REAL",
    bytes: "BLOB",
};

/// `migrate`'s `created_at`: nullable and without a default, since SQLite's `ADD COLUMN` refuses
/// a default that is not a constant. Rows published into such a table have no publish time
/// (`NULL`, [`Job::published_at`](crate::Job::published_at) `None`); a table made by
/// `create_table` has the default.
fn add_created_at(t: &str, c: &str) -> Vec<String> {
    vec![format!("ALTER TABLE {t} ADD COLUMN {c} INTEGER")]
}

fn quote_ident(s: &str) -> String {
    format!("\"{s}\"")
}

/// The statements of `spec` (see [`TableSql`] for each one's parameters).
pub(super) fn compile(spec: &TableSpec) -> TableSql {
    let s = &SYNTAX;
    let mut sql = TableSql {
        begin_write: "BEGIN IMMEDIATE".into(),
        ..TableSql::default()
    };
    s.common(spec, &mut sql);
    let t = s.q(&spec.name);
    let id = s.q(&spec.id);
    sql.insert_id = Some(format!("{} RETURNING {id}", sql.insert_one));
    let att = s.q(&spec.attempts);
    let lu = s.q(&spec.locked_until);
    let ready = s.ready(spec, "?1");
    let order = s.order(spec);
    let row = s.row_columns(spec, "");
    sql.stats = s.stats_filtered(spec);
    // The idle worker's check after a wake-up (`Dialect::wakes_on_every_commit`): a read in
    // WAL mode, beside the writer rather than queued behind it as a claim is. `?2 IS NOT
    // NULL` takes the second `now` where no lease is checked.
    let free = match spec.form {
        Form::Lease => format!("({lu} IS NULL OR {lu} <= ?2)"),
        _ => "?2 IS NOT NULL".into(),
    };
    sql.any_ready = Some(format!(
        "SELECT 1 FROM {t} WHERE {ready} AND {free} LIMIT 1"
    ));
    sql.paused_queues = spec.queue.map(|_| s.paused_queues_sql(&DEPS, "INTEGER"));
    s.grouped_stats(spec, &mut sql, "");
    match spec.form {
        Form::RowLock => {}
        Form::Lease => {
            // FIFO: only heads of groups none of whose rows is leased; one writer at a time
            // makes the statement the group guard.
            let (from, head) = match spec.fifo_group() {
                Some(g) => (
                    format!("{t} q"),
                    format!(" AND {}", s.fifo_head(spec, g, "?1")),
                ),
                None => (t.clone(), String::new()),
            };
            let candidates = format!(
                "SELECT {id} FROM {from} WHERE {ready} AND ({lu} IS NULL OR {lu} <= ?1){head} \
                 ORDER BY {order} {}",
                (s.claim_limit)("?2")
            );
            let take = s.lease_take_set(spec, "?3", "");
            sql.claim =
                format!("UPDATE {t} SET {take} WHERE {id} IN ({candidates}) RETURNING {row}");
            // One row: `id = (..)` runs in well under half the time of `id IN (..)` here.
            sql.claim_one = Some(format!(
                "UPDATE {t} SET {take} WHERE {id} = ({candidates}) RETURNING {row}"
            ));
        }
        Form::AdvisoryLock => {
            // FIFO: only heads are candidates, and the take checks again, under the keys,
            // that the row is still its group's head (see form/advisory.rs).
            let head = spec.fifo_group().map(|g| s.fifo_head(spec, g, "?1"));
            s.advisory_candidates(spec, &mut sql, head.as_deref());
            sql.take = match &head {
                Some(head) => format!(
                    "UPDATE {t} AS q SET {att} = q.{att} + 1 WHERE {ready} AND q.{id} = ?2 \
                     AND {head} RETURNING {row}"
                ),
                None => format!(
                    "UPDATE {t} SET {att} = {att} + 1 WHERE {ready} AND {id} = ?2 RETURNING {row}"
                ),
            };
        }
    }
    sql.rates = rate_sql(spec);
    sql.fair = SYNTAX.fair_sql(spec);
    sql.flow_ready = SYNTAX.flow_ready(spec);
    if spec.dependencies {
        sql.deps = Some(deps_sql().clone());
        sql.waiting = SYNTAX.waiting_sql(spec, &DEPS);
    }
    if spec.form == Form::Lease && spec.flow_controlled() {
        sql.limited = Some(SYNTAX.limit_sql(spec, vec!["BEGIN IMMEDIATE".into()], true));
    }
    sql
}

/// `CREATE TABLE IF NOT EXISTS` and its partial index.
/// `(table name)` -> `(column name, type)` of the table's columns (the schema check).
pub(super) const COLUMNS: &str = "SELECT name, type FROM pragma_table_info(?1)";

/// `(table name)` -> the names of the table's indexes (`migrate`).
pub(super) const INDEXES: &str = "SELECT name FROM pragma_index_list(?1)";

/// The columns a table needs (the schema check and `migrate`).
pub(super) fn column_defs(spec: &TableSpec) -> Vec<crate::model::schema::ColumnDef> {
    SYNTAX.column_list(spec, &TYPES)
}

pub(super) fn create_table(spec: &TableSpec) -> Vec<String> {
    let mut ddl = SYNTAX.create_table(spec, &TYPES);
    if let Some(r) = rate_sql(spec) {
        ddl.extend([r.create].into_iter().chain(r.index));
    }
    if spec.dependencies {
        ddl.extend(deps_sql().create.iter().cloned());
    }
    ddl
}

/// How SQLite spells the waits' statements (one writer: no row locks).
pub(super) static DEPS: crate::dialect::deps::Spelling = crate::dialect::deps::Spelling {
    key_type: "TEXT",
    bytes: "BLOB",
    table_tail: "",
    index_inline: false,
    locking: "",
    upsert: crate::dialect::deps::Upsert::OnConflict,
    greatest: "MAX",
    row_values: true,
    begin_write: "BEGIN IMMEDIATE",
};

/// The waits' statements of jobs that wait on others, made once.
pub(super) fn deps_sql() -> &'static crate::dialect::deps::DepsSql {
    static SQL: std::sync::OnceLock<crate::dialect::deps::DepsSql> = std::sync::OnceLock::new();
    SQL.get_or_init(|| SYNTAX.deps_sql(&DEPS))
}

/// The rate limits' statements of a table that has them (the one writer: no row locks).
fn rate_sql(spec: &TableSpec) -> Option<crate::dialect::flow::RateSql> {
    use crate::dialect::flow::InsertIgnore;
    (!spec.rates.is_empty()).then(|| SYNTAX.rate_sql(spec, "TEXT", "", "", InsertIgnore::OrIgnore))
}

/// The renewal of `n` leases: `(token, (id, held token) x n)` -> the ids renewed.
pub(super) fn renew_sql(spec: &TableSpec, n: usize) -> String {
    let s = &SYNTAX;
    let tuples: Vec<String> = (0..n)
        .map(|i| format!("(?{}, ?{})", 2 * i + 2, 2 * i + 3))
        .collect();
    format!(
        "UPDATE {t} SET {lu} = ?1 WHERE ({id}, {lu}) IN (VALUES {}) RETURNING {id}",
        tuples.join(", "),
        t = s.q(&spec.name),
        lu = s.q(&spec.locked_until),
        id = s.q(&spec.id),
    )
}

pub(super) fn renew_params(token: SystemTime, held: &[(i64, SystemTime)]) -> Vec<Value> {
    let mut params = vec![Value::Time(token)];
    for (id, tok) in held {
        params.push(Value::Int(*id));
        params.push(Value::Time(*tok));
    }
    params
}

/// The grouped lease ack of `n` leases: `((id, held token) x n)` -> the ids deleted.
pub(super) fn ack_many_sql(spec: &TableSpec, n: usize) -> String {
    let s = &SYNTAX;
    let tuples: Vec<String> = (0..n)
        .map(|i| format!("(?{}, ?{})", 2 * i + 1, 2 * i + 2))
        .collect();
    let (t, lu, id) = (s.q(&spec.name), s.q(&spec.locked_until), s.q(&spec.id));
    // A table that keeps completed rows keeps them (as a single ack does).
    let head = match s.complete_set(spec) {
        Some(set) => format!("UPDATE {t} SET {set}"),
        None => format!("DELETE FROM {t}"),
    };
    format!(
        "{head} WHERE ({id}, {lu}) IN (VALUES {}) RETURNING {id}",
        tuples.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::dialect::sqlite::Sqlite;
    use crate::dialect::Dialect;
    use crate::model::table::Table;

    /// `migrate` adds `created_at` without its default (`ADD COLUMN` takes only constants).
    #[test]
    fn migrate_adds_created_at() {
        let spec = Table::new("jobs").validate().unwrap();
        let defs = column_defs(&spec);
        let d = defs.iter().find(|d| d.name == "created_at").unwrap();
        assert_eq!(
            SYNTAX.add_column(&spec, d),
            ["ALTER TABLE \"jobs\" ADD COLUMN \"created_at\" INTEGER"]
        );
    }

    fn compile(t: Table) -> TableSql {
        Sqlite::from_url("sqlite::memory:", &crate::dialect::test_options())
            .unwrap()
            .compile(&t.validate().unwrap())
    }

    /// Each claim runs as prepared, whatever its limit: a statement SQLite compiles again at
    /// every execution costs the claim more than its rows (a bare `LIMIT ?` did that; see
    /// `SYNTAX.claim_limit`).
    #[test]
    fn claims_are_not_compiled_again_per_execution() {
        let lease = Table::new("jobs")
            .text_column("k")
            .lease(Duration::from_secs(30));
        let fifo = lease.clone().group("k").fifo();
        let advisory = Table::new("pay").text_column("k").advisory_lock("a-{k}");
        for t in [lease, fifo, advisory] {
            let spec = t.validate().unwrap();
            let sql = compile(t);
            let c = rusqlite::Connection::open_in_memory().unwrap();
            for stmt in create_table(&spec) {
                c.execute_batch(&stmt).unwrap();
            }
            let mut statements = vec![sql.claim.clone()];
            statements.extend(sql.claim_one.clone());
            if spec.form == Form::AdvisoryLock {
                statements.push(sql.claim_after.clone());
            }
            for text in statements {
                let mut st = c.prepare_cached(&text).unwrap();
                let params = st.parameter_count();
                for run in 0..4i64 {
                    // A different limit (and time) each run, as claims have.
                    let values: Vec<i64> = (0..params).map(|p| 1 + p as i64 + run).collect();
                    let mut rows = st.query(rusqlite::params_from_iter(values)).unwrap();
                    while rows.next().unwrap().is_some() {}
                }
                assert_eq!(
                    st.get_status(rusqlite::StatementStatus::RePrepare),
                    0,
                    "compiled again per execution: {text}"
                );
            }
        }
    }

    #[test]
    fn lease_sql() {
        let sql = compile(
            Table::new("jobs")
                .text_column("k")
                .lease(Duration::from_secs(30)),
        );
        assert_eq!(
            sql.claim,
            "UPDATE \"jobs\" SET \"errors\" = \"errors\" + CASE WHEN \"locked_until\" IS NOT NULL THEN 1 ELSE 0 END, \"last_error\" = CASE WHEN \"locked_until\" IS NOT NULL THEN 'lease ran out: claimed and never settled in time (its process stopped, hung, or could not renew the lease)' ELSE \"last_error\" END, \"locked_until\" = ?3, \"attempts\" = \"attempts\" + 1 WHERE \"id\" IN \
             (SELECT \"id\" FROM \"jobs\" WHERE \"dead_at\" IS NULL AND \"run_at\" <= ?1 AND \
             (\"locked_until\" IS NULL OR \"locked_until\" <= ?1) ORDER BY \"run_at\", \"id\" LIMIT ?2 + 0) \
             RETURNING \"id\", \"attempts\", \"payload\", \"k\", \"cancel_requested\", \"run_at\""
        );
        assert_eq!(
            sql.claim_one.as_deref(),
            Some(
                "UPDATE \"jobs\" SET \"errors\" = \"errors\" + CASE WHEN \"locked_until\" IS NOT NULL THEN 1 ELSE 0 END, \"last_error\" = CASE WHEN \"locked_until\" IS NOT NULL THEN 'lease ran out: claimed and never settled in time (its process stopped, hung, or could not renew the lease)' ELSE \"last_error\" END, \"locked_until\" = ?3, \"attempts\" = \"attempts\" + 1 WHERE \"id\" = \
                 (SELECT \"id\" FROM \"jobs\" WHERE \"dead_at\" IS NULL AND \"run_at\" <= ?1 AND \
                 (\"locked_until\" IS NULL OR \"locked_until\" <= ?1) ORDER BY \"run_at\", \"id\" LIMIT ?2 + 0) \
                 RETURNING \"id\", \"attempts\", \"payload\", \"k\", \"cancel_requested\", \"run_at\""
            )
        );
        assert_eq!(
            sql.ack,
            "DELETE FROM \"jobs\" WHERE \"id\" = ?1 AND \"locked_until\" = ?2"
        );
        assert_eq!(
            sql.retry,
            "UPDATE \"jobs\" SET \"run_at\" = ?1, \"last_error\" = COALESCE(?2, \"last_error\"), \"errors\" = \"errors\" + ?3, \"dead_at\" = CASE WHEN \"cancel_requested\" <> 0 THEN CAST(strftime('%s', 'now') AS INTEGER) ELSE \"dead_at\" END, \"dead_reason\" = CASE WHEN \"cancel_requested\" <> 0 THEN 'cancelled' ELSE \"dead_reason\" END, \"locked_until\" = NULL WHERE \"id\" = ?4 AND \"locked_until\" = ?5"
        );
        assert_eq!(
            sql.dead,
            "UPDATE \"jobs\" SET \"dead_at\" = ?1, \"dead_reason\" = ?2, \"last_error\" = COALESCE(?3, \"last_error\"), \"errors\" = \"errors\" + ?4, \"locked_until\" = NULL \
             WHERE \"id\" = ?5 AND \"locked_until\" = ?6"
        );
        assert_eq!(
            sql.extend,
            "UPDATE \"jobs\" SET \"locked_until\" = ?1 WHERE \"id\" = ?2 AND \"locked_until\" = ?3"
        );
        assert_eq!(sql.unclaim, "UPDATE \"jobs\" SET \"locked_until\" = NULL, \"attempts\" = \"attempts\" - 1, \"dead_at\" = CASE WHEN \"cancel_requested\" <> 0 THEN CAST(strftime('%s', 'now') AS INTEGER) ELSE \"dead_at\" END, \"dead_reason\" = CASE WHEN \"cancel_requested\" <> 0 THEN 'cancelled' ELSE \"dead_reason\" END WHERE \"id\" = ?1 AND \"locked_until\" = ?2");
        assert_eq!(
            sql.insert_one,
            "INSERT INTO \"jobs\" (\"payload\", \"run_at\", \"k\") VALUES (?1, ?2, ?3)"
        );
        assert_eq!(
            sql.insert_id.as_deref(),
            Some("INSERT INTO \"jobs\" (\"payload\", \"run_at\", \"k\") VALUES (?1, ?2, ?3) RETURNING \"id\"")
        );
        assert_eq!(
            sql.dead_list,
            "SELECT \"id\", \"attempts\", \"payload\", \"dead_at\", \"dead_reason\", \"last_error\", \"errors\", \"k\" FROM \"jobs\" \
             WHERE \"dead_at\" IS NOT NULL ORDER BY \"dead_at\", \"id\" LIMIT ?1"
        );
        assert_eq!(
            sql.dead_requeue,
            "UPDATE \"jobs\" SET \"dead_at\" = NULL, \"dead_reason\" = NULL, \"locked_until\" = NULL, \"cancel_requested\" = 0, \"attempts\" = 0, \"run_at\" = ?1 \
             WHERE \"id\" = ?2 AND \"dead_at\" IS NOT NULL"
        );
        assert_eq!(
            sql.dead_page,
            "SELECT \"id\", \"attempts\", \"payload\", \"dead_at\", \"dead_reason\", \"last_error\", \"errors\", \"k\" FROM \"jobs\" \
             WHERE \"dead_at\" IS NOT NULL AND \"id\" > ?1 ORDER BY \"id\" LIMIT ?2"
        );
        assert_eq!(
            sql.dead_bound,
            "SELECT \"id\" FROM \"jobs\" WHERE \"dead_at\" IS NOT NULL AND \"id\" > ?1 ORDER BY \"id\" LIMIT 1 OFFSET ?2"
        );
        assert_eq!(
            sql.dead_requeue_range,
            "UPDATE \"jobs\" SET \"dead_at\" = NULL, \"dead_reason\" = NULL, \"locked_until\" = NULL, \"cancel_requested\" = 0, \"attempts\" = 0, \
             \"run_at\" = ?1 WHERE \"dead_at\" IS NOT NULL AND \"id\" > ?2 AND \"id\" <= ?3"
        );
        assert_eq!(
            sql.dead_purge,
            "DELETE FROM \"jobs\" WHERE \"id\" = ?1 AND \"dead_at\" IS NOT NULL"
        );
        assert_eq!(
            sql.dead_purge_range,
            "DELETE FROM \"jobs\" WHERE \"dead_at\" IS NOT NULL AND \"id\" > ?1 AND \"id\" <= ?2"
        );
        let ready = "\"dead_at\" IS NULL AND \"run_at\" <= ?1 AND (\"locked_until\" IS NULL OR \"locked_until\" <= ?1)";
        assert_eq!(
            sql.stats,
            format!(
                "SELECT COUNT(*) FILTER (WHERE {ready}), COUNT(*) FILTER (WHERE \"dead_at\" IS NULL AND \"run_at\" > ?1 \
                 AND (\"locked_until\" IS NULL OR \"locked_until\" <= ?1)), COUNT(*) FILTER (WHERE \"dead_at\" IS NULL \
                 AND \"locked_until\" > ?1), COUNT(*) FILTER (WHERE \"dead_at\" IS NOT NULL), MIN(\"run_at\") FILTER \
                 (WHERE {ready}), 0 FROM \"jobs\""
            )
        );
    }

    #[test]
    fn advisory_sql() {
        let sql = compile(
            Table::new("pay")
                .text_column("account")
                .advisory_lock("a-{account}"),
        );
        assert_eq!(
            sql.claim,
            "SELECT \"id\", \"run_at\", \"account\" FROM \"pay\" WHERE \"dead_at\" IS NULL AND \"run_at\" <= ?1 \
             ORDER BY \"run_at\", \"id\" LIMIT ?2 + 0"
        );
        assert_eq!(
            sql.take,
            "UPDATE \"pay\" SET \"attempts\" = \"attempts\" + 1 WHERE \"dead_at\" IS NULL AND \"run_at\" <= ?1 \
             AND \"id\" = ?2 RETURNING \"id\", \"attempts\", \"payload\", \"account\", \"cancel_requested\", \"run_at\""
        );
        assert_eq!(
            sql.retry,
            "UPDATE \"pay\" SET \"run_at\" = ?1, \"last_error\" = COALESCE(?2, \"last_error\"), \"errors\" = \"errors\" + ?3, \"dead_at\" = CASE WHEN \"cancel_requested\" <> 0 THEN CAST(strftime('%s', 'now') AS INTEGER) ELSE \"dead_at\" END, \"dead_reason\" = CASE WHEN \"cancel_requested\" <> 0 THEN 'cancelled' ELSE \"dead_reason\" END WHERE \"id\" = ?4"
        );
        assert!(sql.key_lock.is_none());
    }

    #[test]
    fn completed_rows_kept() {
        let t = Table::new("jobs")
            .dedup()
            .lease(Duration::from_secs(30))
            .keep_completed(Duration::from_secs(60));
        let now = "CAST(strftime('%s', 'now') AS INTEGER)";
        let set = format!(
            "\"dead_at\" = {now}, \"completed_at\" = {now}, \"dedup_key\" = NULL, \"locked_until\" = NULL"
        );
        assert_eq!(
            compile(t.clone()).ack,
            format!("UPDATE \"jobs\" SET {set} WHERE \"id\" = ?1 AND \"locked_until\" = ?2")
        );
        assert_eq!(
            ack_many_sql(&t.validate().unwrap(), 1),
            format!(
                "UPDATE \"jobs\" SET {set} WHERE (\"id\", \"locked_until\") IN (VALUES (?1, ?2)) RETURNING \"id\""
            )
        );
    }

    #[test]
    fn ddl_and_renewal() {
        let d = Sqlite::from_url("sqlite::memory:", &crate::dialect::test_options()).unwrap();
        let spec = Table::new("jobs")
            .int_column("n")
            .lease(Duration::from_secs(5))
            .validate()
            .unwrap();
        assert_eq!(
            d.create_table(&spec),
            [
                "CREATE TABLE IF NOT EXISTS \"jobs\" (\"id\" INTEGER PRIMARY KEY AUTOINCREMENT, \"payload\" BLOB NOT NULL, \
                 \"attempts\" INTEGER NOT NULL DEFAULT 0, \"run_at\" INTEGER NOT NULL, \"locked_until\" INTEGER, \
                 \"dead_at\" INTEGER, \"dead_reason\" TEXT, \"last_error\" TEXT, \"errors\" INTEGER NOT NULL DEFAULT 0, \"cancel_requested\" INTEGER NOT NULL DEFAULT 0, \
                 \"created_at\" INTEGER DEFAULT (CAST(strftime('%s', 'now') AS INTEGER)), \"n\" INTEGER)",
                "CREATE INDEX IF NOT EXISTS \"jobs_ready\" ON \"jobs\" (\"run_at\", \"id\") WHERE \"dead_at\" IS NULL",
                "CREATE INDEX IF NOT EXISTS \"jobs_dead\" ON \"jobs\" (\"id\") WHERE \"dead_at\" IS NOT NULL",
            ]
        );
        let t = crate::model::schedule::from_epoch_secs(10);
        let (sql, params) = (renew_sql(&spec, 2), renew_params(t, &[(1, t), (2, t)]));
        assert_eq!(
            sql,
            "UPDATE \"jobs\" SET \"locked_until\" = ?1 WHERE (\"id\", \"locked_until\") IN (VALUES (?2, ?3), (?4, ?5)) RETURNING \"id\""
        );
        assert_eq!(params.len(), 5);
        assert_eq!(
            ack_many_sql(&spec, 2),
            "DELETE FROM \"jobs\" WHERE (\"id\", \"locked_until\") IN (VALUES (?1, ?2), (?3, ?4)) RETURNING \"id\""
        );
        assert_eq!(d.insert_many(&spec, 2), "INSERT INTO \"jobs\" (\"payload\", \"run_at\", \"n\") VALUES (?1, ?2, ?3), (?4, ?5, ?6)");
    }

    #[test]
    fn fifo_sql() {
        let sql = compile(
            Table::new("orders")
                .group("customer")
                .fifo()
                .lease(Duration::from_secs(30)),
        );
        let candidates = "SELECT \"id\" FROM \"orders\" q WHERE \"dead_at\" IS NULL AND \"run_at\" <= ?1 AND \
             (\"locked_until\" IS NULL OR \"locked_until\" <= ?1) AND NOT EXISTS (SELECT 1 FROM \"orders\" p \
             WHERE p.\"customer\" = q.\"customer\" AND p.\"dead_at\" IS NULL AND p.\"id\" < q.\"id\") AND NOT EXISTS \
             (SELECT 1 FROM \"orders\" p WHERE p.\"customer\" = q.\"customer\" AND p.\"dead_at\" IS NULL AND \
             p.\"locked_until\" > ?1) ORDER BY \"run_at\", \"id\" LIMIT ?2 + 0";
        let set = "UPDATE \"orders\" SET \"errors\" = \"errors\" + CASE WHEN \"locked_until\" IS NOT NULL THEN 1 ELSE 0 END, \"last_error\" = CASE WHEN \"locked_until\" IS NOT NULL THEN 'lease ran out: claimed and never settled in time (its process stopped, hung, or could not renew the lease)' ELSE \"last_error\" END, \"locked_until\" = ?3, \"attempts\" = \"attempts\" + 1 WHERE \"id\"";
        let row = "RETURNING \"id\", \"attempts\", \"payload\", \"customer\", \"cancel_requested\", \"run_at\"";
        assert_eq!(sql.claim, format!("{set} IN ({candidates}) {row}"));
        assert_eq!(sql.claim_one, Some(format!("{set} = ({candidates}) {row}")));
    }

    #[test]
    fn dedup_sql() {
        let spec = Table::new("mails")
            .lease(Duration::from_secs(30))
            .dedup()
            .validate()
            .unwrap();
        let sql = super::compile(&spec);
        assert_eq!(
            sql.insert_dedup_one,
            "INSERT INTO \"mails\" (\"payload\", \"run_at\", \"dedup_key\") VALUES (?1, ?2, ?3) \
             ON CONFLICT (\"dedup_key\") DO NOTHING RETURNING \"id\""
        );
        assert_eq!(
            sql.dedup_holder,
            "SELECT \"id\" FROM \"mails\" WHERE \"dedup_key\" = ?1"
        );
        // Dead-lettering frees the key.
        assert_eq!(
            sql.dead,
            "UPDATE \"mails\" SET \"dead_at\" = ?1, \"dead_reason\" = ?2, \"last_error\" = COALESCE(?3, \"last_error\"), \"errors\" = \"errors\" + ?4, \"dedup_key\" = NULL, \
             \"locked_until\" = NULL WHERE \"id\" = ?5 AND \"locked_until\" = ?6"
        );
        let ddl = create_table(&spec);
        assert!(ddl[0].ends_with("\"dead_reason\" TEXT, \"last_error\" TEXT, \"errors\" INTEGER NOT NULL DEFAULT 0, \"cancel_requested\" INTEGER NOT NULL DEFAULT 0, \"created_at\" INTEGER DEFAULT (CAST(strftime('%s', 'now') AS INTEGER)), \"dedup_key\" TEXT)"));
        assert_eq!(
            ddl[2],
            "CREATE UNIQUE INDEX IF NOT EXISTS \"mails_dedup\" ON \"mails\" (\"dedup_key\")"
        );
    }

    /// The trace context column (`Table::traceparent`): last of the insert's columns, after the
    /// checkpoint in the claimed row, last of the job's lookup; text in `CREATE TABLE`, and
    /// added by `migrate` as a plain nullable column. Nothing for a table without it.
    #[test]
    fn traceparent_sql() {
        let spec = Table::new("jobs")
            .text_column("k")
            .checkpoints()
            .traceparent()
            .lease(Duration::from_secs(30))
            .validate()
            .unwrap();
        let sql = super::compile(&spec);
        assert_eq!(
            sql.insert_one,
            "INSERT INTO \"jobs\" (\"payload\", \"run_at\", \"k\", \"traceparent\") VALUES (?1, ?2, ?3, ?4)"
        );
        assert!(
            sql.claim.contains(
                "\"k\", \"checkpoint\", \"traceparent\", \"cancel_requested\", \"run_at\""
            ),
            "{}",
            sql.claim
        );
        assert!(sql
            .job
            .contains("\"k\", \"checkpoint\", \"traceparent\" FROM \"jobs\""));
        let ddl = create_table(&spec);
        assert!(
            ddl[0].ends_with("\"checkpoint\" BLOB, \"traceparent\" TEXT, \"k\" TEXT)"),
            "{}",
            ddl[0]
        );
        let defs = SYNTAX.column_list(&spec, &TYPES);
        let d = defs.iter().find(|d| d.name == "traceparent").unwrap();
        assert_eq!(
            SYNTAX.add_column(&spec, d),
            ["ALTER TABLE \"jobs\" ADD COLUMN \"traceparent\" TEXT"]
        );
        let plain = super::compile(&Table::new("jobs").validate().unwrap());
        assert!(!plain.insert_one.contains("traceparent") && !plain.claim.contains("traceparent"));
        assert!(!plain.job.contains("traceparent"));
    }

    #[test]
    fn priority_sql() {
        let spec = Table::new("jobs")
            .lease(Duration::from_secs(30))
            .priorities()
            .validate()
            .unwrap();
        let sql = super::compile(&spec);
        assert!(sql
            .claim
            .contains("ORDER BY \"priority\" DESC, \"run_at\", \"id\" LIMIT ?2 + 0"));
        assert_eq!(
            sql.insert_one,
            "INSERT INTO \"jobs\" (\"payload\", \"run_at\", \"priority\") VALUES (?1, ?2, ?3)"
        );
        let ddl = create_table(&spec);
        assert!(ddl[0].contains("\"priority\" INTEGER NOT NULL DEFAULT 0"));
        assert_eq!(
            ddl[1],
            "CREATE INDEX IF NOT EXISTS \"jobs_ready\" ON \"jobs\" (\"priority\" DESC, \"run_at\", \"id\") \
             WHERE \"dead_at\" IS NULL"
        );
    }

    /// Job lookup and cancel, pinned per form: the lookup's columns, the in-flight page, the
    /// removal (deleted, or kept completed and cancelled), the lease and advisory requests,
    /// the row lock's wait and probe, and a retry that ends a cancelled row.
    #[test]
    fn jobs_and_cancel_sql() {
        let tables = [
            Table::new("jobs")
                .text_column("k")
                .lease(Duration::from_secs(30)),
            Table::new("pay").text_column("k").advisory_lock("a-{k}"),
            Table::new("rows")
                .text_column("k")
                .keep_completed(Duration::from_secs(60)),
        ];
        let want: [[&str; 7]; 3] = [
            [
                "SELECT \"id\", \"attempts\", \"payload\", \"run_at\", \"dead_at\", \"dead_reason\", \"last_error\", \"errors\", \"locked_until\", NULL, \"cancel_requested\", \"created_at\", \"k\" FROM \"jobs\" WHERE \"id\" = ?1",
                "SELECT \"id\", \"attempts\", \"payload\", \"run_at\", \"dead_at\", \"dead_reason\", \"last_error\", \"errors\", \"locked_until\", NULL, \"cancel_requested\", \"created_at\", \"k\" FROM \"jobs\" WHERE \"dead_at\" IS NULL AND \"locked_until\" > ?1 AND \"id\" > ?2 ORDER BY \"id\" LIMIT ?3",
                "DELETE FROM \"jobs\" WHERE \"id\" = ?1 AND (\"locked_until\" IS NULL OR \"locked_until\" <= ?2)",
                "UPDATE \"jobs\" SET \"cancel_requested\" = 1 WHERE \"id\" = ?1 AND \"dead_at\" IS NULL AND \"locked_until\" > ?2",
                "",
                "",
                "UPDATE \"jobs\" SET \"run_at\" = ?1, \"last_error\" = COALESCE(?2, \"last_error\"), \"errors\" = \"errors\" + ?3, \"dead_at\" = CASE WHEN \"cancel_requested\" <> 0 THEN CAST(strftime('%s', 'now') AS INTEGER) ELSE \"dead_at\" END, \"dead_reason\" = CASE WHEN \"cancel_requested\" <> 0 THEN 'cancelled' ELSE \"dead_reason\" END, \"locked_until\" = NULL WHERE \"id\" = ?4 AND \"locked_until\" = ?5",
            ],
            [
                "SELECT \"id\", \"attempts\", \"payload\", \"run_at\", \"dead_at\", \"dead_reason\", \"last_error\", \"errors\", NULL, NULL, \"cancel_requested\", \"created_at\", \"k\" FROM \"pay\" WHERE \"id\" = ?1",
                "SELECT \"id\", \"attempts\", \"payload\", \"run_at\", \"dead_at\", \"dead_reason\", \"last_error\", \"errors\", NULL, NULL, \"cancel_requested\", \"created_at\", \"k\" FROM \"pay\" WHERE \"dead_at\" IS NULL AND \"run_at\" <= ?1 AND \"id\" > ?2 ORDER BY \"id\" LIMIT ?3",
                "DELETE FROM \"pay\" WHERE \"id\" = ?1",
                "UPDATE \"pay\" SET \"cancel_requested\" = 1 WHERE \"id\" = ?1 AND \"dead_at\" IS NULL",
                "",
                "",
                "UPDATE \"pay\" SET \"run_at\" = ?1, \"last_error\" = COALESCE(?2, \"last_error\"), \"errors\" = \"errors\" + ?3, \"dead_at\" = CASE WHEN \"cancel_requested\" <> 0 THEN CAST(strftime('%s', 'now') AS INTEGER) ELSE \"dead_at\" END, \"dead_reason\" = CASE WHEN \"cancel_requested\" <> 0 THEN 'cancelled' ELSE \"dead_reason\" END WHERE \"id\" = ?4",
            ],
            [
                "SELECT \"id\", \"attempts\", \"payload\", \"run_at\", \"dead_at\", \"dead_reason\", \"last_error\", \"errors\", NULL, \"completed_at\", 0, \"created_at\", \"k\" FROM \"rows\" WHERE \"id\" = ?1",
                "SELECT \"id\", \"attempts\", \"payload\", \"run_at\", \"dead_at\", \"dead_reason\", \"last_error\", \"errors\", NULL, \"completed_at\", 0, \"created_at\", \"k\" FROM \"rows\" WHERE \"dead_at\" IS NULL AND \"run_at\" <= ?1 AND \"id\" > ?2 ORDER BY \"id\" LIMIT ?3",
                "UPDATE \"rows\" SET \"dead_at\" = CAST(strftime('%s', 'now') AS INTEGER), \"completed_at\" = CAST(strftime('%s', 'now') AS INTEGER), \"dead_reason\" = 'cancelled' WHERE \"id\" = ?1 AND \"completed_at\" IS NULL",
                "",
                "SELECT \"id\" FROM \"rows\" WHERE \"id\" = ?1 FOR UPDATE",
                "SELECT \"id\" FROM \"rows\" WHERE \"id\" = ?1 FOR UPDATE SKIP LOCKED",
                "UPDATE \"rows\" SET \"run_at\" = ?1, \"last_error\" = COALESCE(?2, \"last_error\"), \"errors\" = \"errors\" + ?3, \"attempts\" = \"attempts\" + 1 WHERE \"id\" = ?4",
            ],
        ];
        for (t, want) in tables.into_iter().zip(want) {
            let sql = compile(t);
            let page = sql.jobs_page[2]
                .as_ref()
                .map(|p| p.0.clone())
                .unwrap_or_default();
            let got = [
                sql.job.as_str(),
                page.as_str(),
                &sql.cancel_remove,
                &sql.cancel_mark,
                &sql.cancel_lock,
                &sql.probe_lock,
                &sql.retry,
            ];
            assert_eq!(got, want);
        }
    }

    /// The cancel settlement of each form: deleted as the ack deletes; on a table that keeps
    /// completed rows, completed and finished with the reason "cancelled" (row lock: the
    /// attempt counted, as its dead letter counts it), fenced by the token in the lease form.
    #[test]
    fn cancel_sql() {
        let keep = |t: Table| t.dedup().keep_completed(Duration::from_secs(60));
        let lease = |t: Table| t.lease(Duration::from_secs(30));
        let advisory = |t: Table| t.text_column("k").advisory_lock("k-{k}");
        assert_eq!(
            compile(Table::new("jobs")).cancel_held,
            "DELETE FROM \"jobs\" WHERE \"id\" = ?1"
        );
        assert_eq!(
            compile(lease(Table::new("jobs"))).cancel_held,
            "DELETE FROM \"jobs\" WHERE \"id\" = ?1 AND \"locked_until\" = ?2"
        );
        assert_eq!(
            compile(advisory(Table::new("jobs"))).cancel_held,
            "DELETE FROM \"jobs\" WHERE \"id\" = ?1"
        );
        let now = "CAST(strftime('%s', 'now') AS INTEGER)";
        let set = format!("\"dead_at\" = {now}, \"completed_at\" = {now}, \"dedup_key\" = NULL");
        assert_eq!(
            compile(keep(Table::new("jobs"))).cancel_held,
            format!(
                "UPDATE \"jobs\" SET {set}, \"dead_reason\" = 'cancelled', \"attempts\" = \"attempts\" + 1 \
                 WHERE \"id\" = ?1"
            )
        );
        assert_eq!(
            compile(keep(lease(Table::new("jobs")))).cancel_held,
            format!(
                "UPDATE \"jobs\" SET {set}, \"locked_until\" = NULL, \"dead_reason\" = 'cancelled' \
                 WHERE \"id\" = ?1 AND \"locked_until\" = ?2"
            )
        );
        assert_eq!(
            compile(keep(advisory(Table::new("jobs")))).cancel_held,
            format!("UPDATE \"jobs\" SET {set}, \"dead_reason\" = 'cancelled' WHERE \"id\" = ?1")
        );
    }

    /// A listing reads the payload's length and first bytes, never the payload itself, and
    /// takes no lock (no `FOR UPDATE`).
    #[test]
    fn job_previews_read_a_prefix_and_the_length() {
        let sql = compile(Table::new("jobs").text_column("k"));
        let ready = &sql.jobs_preview[1].as_ref().unwrap();
        assert_eq!(
            ready.0,
            "SELECT LENGTH(\"payload\"), \"id\", \"attempts\", SUBSTR(\"payload\", 1, ?1), \"run_at\", \"dead_at\", \"dead_reason\", \"last_error\", \"errors\", NULL, NULL, 0, \"created_at\", \"k\" FROM \"jobs\" WHERE \"dead_at\" IS NULL AND \"run_at\" <= ?2 AND \"id\" > ?3 ORDER BY \"id\" LIMIT ?4"
        );
        assert_eq!(ready.1, 1);
        let dead = &sql.jobs_preview[3].as_ref().unwrap().0;
        assert_eq!(
            dead,
            "SELECT LENGTH(\"payload\"), \"id\", \"attempts\", SUBSTR(\"payload\", 1, ?1), \"run_at\", \"dead_at\", \"dead_reason\", \"last_error\", \"errors\", NULL, NULL, 0, \"created_at\", \"k\" FROM \"jobs\" WHERE \"dead_at\" IS NOT NULL AND \"id\" > ?2 ORDER BY \"id\" LIMIT ?3"
        );
        for page in sql.jobs_preview.iter().flatten() {
            assert!(!page.0.contains("FOR UPDATE"), "{}", page.0);
            assert_eq!(page.0.matches("\"payload\"").count(), 2, "{}", page.0);
        }
        assert!(sql.jobs_preview[4].is_none(), "no completed rows kept");
    }

    /// `testing::drain_all`'s statements: the jobs scheduled for later (not a waiting job, due
    /// at the latest time; lease: not leased), each moved to now if it still qualifies. No row
    /// lock form on SQLite.
    #[test]
    fn drain_all_statements() {
        let lease = compile(Table::new("jobs").lease(Duration::from_secs(30)));
        assert_eq!(
            lease.due_later,
            "SELECT \"id\" FROM \"jobs\" WHERE \"dead_at\" IS NULL AND \"run_at\" > ?1 AND \"run_at\" < ?2 \
             AND (\"locked_until\" IS NULL OR \"locked_until\" <= ?3) ORDER BY \"id\""
        );
        assert_eq!(
            lease.make_due,
            "UPDATE \"jobs\" SET \"run_at\" = ?1 WHERE \"id\" = ?2 AND \"dead_at\" IS NULL AND \"run_at\" > ?3 \
             AND \"run_at\" < ?4 AND (\"locked_until\" IS NULL OR \"locked_until\" <= ?5)"
        );
        let advisory = compile(Table::new("jobs").text_column("k").advisory_lock("k-{k}"));
        assert_eq!(
            advisory.due_later,
            "SELECT \"id\" FROM \"jobs\" WHERE \"dead_at\" IS NULL AND \"run_at\" > ?1 AND \"run_at\" < ?2 \
             ORDER BY \"id\""
        );
        assert_eq!(
            advisory.make_due,
            "UPDATE \"jobs\" SET \"run_at\" = ?1 WHERE \"id\" = ?2 AND \"dead_at\" IS NULL AND \"run_at\" > ?3 \
             AND \"run_at\" < ?4"
        );
    }
}
