//! The MySQL statement text of a table, built once when the table is first used: the claims,
//! settlements and DDL ([`compile`], [`create_table`]), the renewal statements per id-list size
//! class, and the `GET_LOCK` name of a key ([`lock_name`]).

use sha2::{Digest, Sha256};

use super::version::BYTE_EXACT;
use crate::dialect::shared::{ColumnTypes, Syntax};
use crate::dialect::{FifoSql, TableSql};
use crate::model::table::{Form, Isolation, TableSpec};

pub(super) const SYNTAX: Syntax = Syntax {
    quote: quote_ident,
    param: |_| "?".to_string(),
    // The session's time zone is UTC (+00:00), like the times the library writes.
    now: "UTC_TIMESTAMP()",
    claim_limit: |p| format!("LIMIT {p}"),
    literal: text_literal,
    stamps_created: true,
    // A binary needle makes the search byte for byte whatever the column's collation.
    contains: |h, n| format!("LOCATE(CAST({n} AS BINARY), {h}) > 0"),
    row_compare: false,
    force_index: true,
};

/// `s` as a MySQL string literal that reads the same whatever the session's `sql_mode`: a
/// backslash is an escape unless `NO_BACKSLASH_ESCAPES` is set, so text holding one is written
/// in hexadecimal (`CONVERT(X'..' USING utf8mb4)`); other text with its quotes doubled.
fn text_literal(s: &str) -> String {
    if !s.contains('\\') {
        return crate::dialect::shared::standard_literal(s);
    }
    let hex: String = s.bytes().map(|b| format!("{b:02X}")).collect();
    format!("CONVERT(X'{hex}' USING utf8mb4)")
}

/// The longest name `GET_LOCK` accepts.
const MAX_LOCK_NAME: usize = 64;

/// The most bytes a `GET_LOCK` name may take: 64 characters of 3 bytes (MariaDB checks the
/// name as an identifier of `utf8mb3`, 192 bytes). A name of fewer characters and more bytes
/// (4-byte characters) is hashed as a long one is.
const MAX_LOCK_BYTES: usize = 192;

/// MariaDB's column types. A dead-letter reason may be a long error report: `TEXT` stops at
/// 64 KiB. Text columns are `VARCHAR(255)` so they can be indexed (1,020 bytes, under InnoDB's
/// 3,072-byte key limit), in a binary NO PAD collation so they compare byte for byte
/// ([`BYTE_EXACT`]): every text column, not only the dedup key and the group, so a column
/// that later becomes a group needs no table copy, and the user's own SQL on them means what
/// it means on PostgreSQL and SQLite.
const MARIADB_TYPES: ColumnTypes = ColumnTypes {
    id: "BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY",
    payload: "LONGBLOB NOT NULL",
    attempts: "INT NOT NULL DEFAULT 0",
    run_at: "DATETIME NOT NULL DEFAULT CURRENT_TIMESTAMP",
    time: "DATETIME NULL",
    reason: "MEDIUMTEXT NULL",
    priority: "SMALLINT NOT NULL DEFAULT 0",
    // UTC: sessions run with `time_zone = '+00:00'`, as for `run_at`.
    created_at: "DATETIME NULL DEFAULT CURRENT_TIMESTAMP",
    add_created_at,
    text: "VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin NULL",
    int: "BIGINT NULL",
    float: "DOUBLE NULL",
    bytes: "LONGBLOB NULL",
};

/// MySQL 8's column types: MariaDB's, text in MySQL's spelling of the collation.
const MYSQL_TYPES: ColumnTypes = ColumnTypes {
    text: "VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_0900_bin NULL",
    ..MARIADB_TYPES
};

/// The column types of a server whose byte-exact collation is `collation`
/// ([`text_collation`](super::version::text_collation)).
fn types(collation: &str) -> &'static ColumnTypes {
    if collation == BYTE_EXACT[0] {
        &MARIADB_TYPES
    } else {
        &MYSQL_TYPES
    }
}

/// `migrate`'s `created_at`: added without a default, so the rows already there read `NULL`,
/// then given it (`MODIFY COLUMN` changes the default only, leaving the values; `ALTER COLUMN
/// .. SET DEFAULT` takes no `CURRENT_TIMESTAMP` on MySQL). MySQL cannot name a column in the
/// statement that adds it: two statements.
fn add_created_at(t: &str, c: &str) -> Vec<String> {
    vec![
        format!("ALTER TABLE {t} ADD COLUMN {c} DATETIME NULL"),
        format!(
            "ALTER TABLE {t} MODIFY COLUMN {c} {}",
            MARIADB_TYPES.created_at
        ),
    ]
}

pub(super) fn quote_ident(s: &str) -> String {
    format!("`{s}`")
}

/// The `GET_LOCK` name of `key` in database `db`: `<db>.<key>`, or its SHA-256 in lowercase
/// hex (64 characters) when longer than `GET_LOCK` allows: more than 64 characters, or more
/// than [`MAX_LOCK_BYTES`] bytes of UTF-8 (MariaDB refuses 64 characters of 4-byte ones with
/// error 1059, and the claim would then fail on that row for ever).
pub(super) fn lock_name(db: &str, key: &str) -> String {
    let name = format!("{db}.{key}");
    if name.chars().count() <= MAX_LOCK_NAME && name.len() <= MAX_LOCK_BYTES {
        return name;
    }
    let digest = Sha256::digest(name.as_bytes());
    let mut hex = String::with_capacity(64);
    for b in digest {
        hex.push_str(&format!("{b:02x}"));
    }
    hex
}

/// `(from, to, <db>.<prefix> x keys)` -> `i, held` for each `i`-th prefix (from 0) of which
/// some session holds any of the keys `<prefix>{from}` .. `<prefix>{to - 1}`: their `GET_LOCK`
/// names made as [`lock_name`] makes them (hashed past [`MAX_LOCK_NAME`] characters), each
/// asked with `IS_USED_LOCK`. At most 999 recursion steps (a limit's slots are at most 1,000):
/// within MySQL 8's default `cte_max_recursion_depth`.
pub(super) fn slots_held(keys: usize) -> String {
    let values: Vec<String> = (0..keys)
        .map(|i| format!("SELECT {i} AS i, ? AS p"))
        .collect();
    format!(
        "WITH RECURSIVE sqlbroker_s (n) AS (SELECT CAST(? AS SIGNED) UNION ALL SELECT n + 1 FROM \
         sqlbroker_s WHERE n + 1 < ?) SELECT x.i, count(*) FROM (SELECT v.i, concat(v.p, s.n) AS name \
         FROM sqlbroker_s AS s, ({}) AS v) AS x WHERE IS_USED_LOCK(IF(char_length(x.name) <= \
         {MAX_LOCK_NAME} AND length(x.name) <= {MAX_LOCK_BYTES}, x.name, sha2(x.name, 256))) IS \
         NOT NULL GROUP BY x.i",
        values.join(" UNION ALL ")
    )
}

/// `?, ?, ..` for `n` parameters.
fn placeholders(n: usize) -> String {
    vec!["?"; n].join(", ")
}

/// Id-list size classes whose lease-claim update is built with the table: 1, 2, 4 .. 1024,
/// enough for the largest claim (`batch_size` is at most 1,000).
const MARK_CLASSES: u32 = 11;

/// Renewal, step 1: `(id x slots)` -> `id, locked_until` of the held rows, locked; rows another
/// transaction has locked are skipped (renewed next round), never waited for.
pub(super) fn renew_lock_sql(spec: &TableSpec, slots: usize) -> String {
    locking_read(spec, slots, "FOR UPDATE SKIP LOCKED")
}

/// `(id x slots)` -> `id, locked_until` of those rows, read with `lock`.
fn locking_read(spec: &TableSpec, slots: usize, lock: &str) -> String {
    let s = &SYNTAX;
    format!(
        "SELECT {id}, {lu} FROM {t} WHERE {id} IN ({}) {lock}",
        placeholders(slots),
        id = s.q(&spec.id),
        lu = s.q(&spec.locked_until),
        t = s.q(&spec.name)
    )
}

/// Renewal, step 2: `(token, id x slots)` writes the new token into the rows kept.
pub(super) fn renew_set_sql(spec: &TableSpec, slots: usize) -> String {
    let s = &SYNTAX;
    format!(
        "UPDATE {t} SET {lu} = ? WHERE {id} IN ({})",
        placeholders(slots),
        id = s.q(&spec.id),
        lu = s.q(&spec.locked_until),
        t = s.q(&spec.name)
    )
}

/// Grouped ack, step 1: `(id x slots)` -> `id, locked_until` of the rows, locked (waiting for
/// a lock, as a single ack would).
pub(super) fn ack_lock_sql(spec: &TableSpec, slots: usize) -> String {
    locking_read(spec, slots, "FOR UPDATE")
}

/// Grouped ack, step 2: `(id x slots)` deletes the rows kept (a table that keeps completed
/// rows keeps them, as a single ack does).
pub(super) fn ack_many_sql(spec: &TableSpec, slots: usize) -> String {
    let s = &SYNTAX;
    let (t, id) = (s.q(&spec.name), s.q(&spec.id));
    match s.complete_set(spec) {
        Some(set) => format!(
            "UPDATE {t} SET {set} WHERE {id} IN ({})",
            placeholders(slots)
        ),
        None => format!("DELETE FROM {t} WHERE {id} IN ({})", placeholders(slots)),
    }
}

/// Every session of ours runs at READ COMMITTED, set once when it connects, so a transaction
/// at that level costs no `SET TRANSACTION` round trip: a locking read then locks the rows it
/// takes, not the gaps between them (the gap after the highest id is where every publish
/// inserts).
pub(super) const SESSION_ISOLATION: &str = "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED";

/// Renewal and grouped acks run at the session's READ COMMITTED.
pub(super) const RENEW_BEGIN: [&str; 1] = ["START TRANSACTION"];

/// The id the session's last insert assigned, where the client library does not report it
/// (Diesel's connection).
#[cfg(feature = "diesel-mysql")]
pub(super) const LAST_INSERT_ID: &str = "SELECT LAST_INSERT_ID()";

/// Opens a claim transaction at `level`: the session's own level needs no `SET TRANSACTION`.
fn begin(level: Isolation) -> Vec<String> {
    let start = "START TRANSACTION".to_string();
    match level {
        Isolation::ReadCommitted => vec![start],
        _ => vec![
            format!("SET TRANSACTION ISOLATION LEVEL {}", level.sql()),
            start,
        ],
    }
}

/// Cancels the statement connection `id` runs (its transaction stays open).
pub(super) fn cancel(id: u64) -> String {
    format!("KILL QUERY {id}")
}

/// The statements of `spec` (see [`TableSql`] for each one's parameters).
pub(super) fn compile(spec: &TableSpec) -> TableSql {
    let s = &SYNTAX;
    let mut sql = TableSql {
        begin: begin(spec.isolation),
        begin_write: "START TRANSACTION".into(),
        ..TableSql::default()
    };
    s.common(spec, &mut sql);
    let t = s.q(&spec.name);
    let id = s.q(&spec.id);
    let att = s.q(&spec.attempts);
    let lu = s.q(&spec.locked_until);
    let ready = s.ready(spec, "?");
    let order = s.order(spec);
    let row = s.row_columns(spec, "");
    sql.fifo = spec.fifo_group().map(|g| fifo(spec, g));
    // `? IS NOT NULL` takes the second `now` where no lease is checked.
    let free = match spec.form {
        Form::Lease => format!("({lu} IS NULL OR {lu} <= ?)"),
        _ => "? IS NOT NULL".into(),
    };
    sql.any_ready = Some(format!(
        "SELECT 1 FROM {t} WHERE {ready} AND {free} LIMIT 1"
    ));
    sql.stats = stats_sql(spec);
    sql.paused_queues = spec
        .queue
        .map(|_| SYNTAX.paused_queues_sql(&DEPS, "DATETIME"));
    SYNTAX.grouped_stats(spec, &mut sql, "q.");
    if spec.dedup_key.is_some() {
        // A locking read: it reads the latest committed holder. A plain one, inside an
        // application's REPEATABLE READ transaction (`sqlbroker::mysql::publish`), reads the
        // transaction's snapshot, taken perhaps before the holder's insert committed (which
        // the insert itself saw): the key would seem free and then held, again and again.
        // `LOCK IN SHARE MODE` is spelled the same on MySQL 8 and MariaDB; the shared lock is
        // the one the failed insert already took on the holder's index entry.
        sql.dedup_holder.push_str(" LOCK IN SHARE MODE");
    }
    // The cursor, as PostgreSQL's (runtime/cursor.rs): a claim reads on past the rows claimed
    // before, whose delete-marked entries a snapshot held elsewhere keeps from purge. Spelled
    // as two ranges, not `(run_at, id) > (?, ?)`: MariaDB plans the row comparison on
    // `run_at` alone and walks every entry of the cursor's second. On the ready index by
    // force: on a small table MariaDB chose to scan the primary key and sort, which locks
    // every claimable row it reads (`SKIP LOCKED` claims then skip rows no one works on).
    let run_at = s.q(&spec.run_at);
    let cursor = (spec.priority.is_none() && spec.fifo_group().is_none())
        .then(|| format!(" AND ({run_at} > ? OR ({run_at} = ? AND {id} > ?))"));
    // A view of some queues reads their index, which the queue leads after `dead_at`.
    let by_queue = spec
        .queue
        .is_some_and(|q| spec.only.iter().any(|(c, _)| *c == q));
    let index = format!("{}_{}", spec.name, if by_queue { "queue" } else { "ready" });
    let on_ready = |from: &str| match from {
        "" => t.clone(),
        _ => format!("{t} FORCE INDEX ({})", s.q(&index)),
    };
    match spec.form {
        Form::RowLock => {
            let claim = |from: &str| {
                format!(
                    "SELECT {row} FROM {} WHERE {ready}{from} ORDER BY {order} LIMIT ? FOR UPDATE \
                     SKIP LOCKED",
                    on_ready(from)
                )
            };
            sql.claim_from = cursor.as_deref().map(&claim);
            sql.claim = claim("");
            if spec.queue.is_some() || !spec.only.is_empty() {
                // Rows the `WHERE` refuses would stay locked by the delivery (TableSql's
                // `row_lock_by_id`): candidates first, then each locked by id.
                let from = match by_queue {
                    true => format!("{t} FORCE INDEX ({})", s.q(&index)),
                    false => t.clone(),
                };
                sql.row_lock_by_id = Some((
                    format!("SELECT {id} FROM {from} WHERE {ready} ORDER BY {order} LIMIT ?"),
                    format!(
                        "SELECT {row} FROM {t} WHERE {id} = ? AND {} FOR UPDATE SKIP LOCKED",
                        s.ready_checked(spec, "?")
                    ),
                ));
                sql.claim_from = None;
            }
        }
        Form::Lease => {
            let claim = |from: &str| {
                format!(
                    "SELECT {row} FROM {} WHERE {ready} AND ({lu} IS NULL OR {lu} <= ?){from} \
                     ORDER BY {order} LIMIT ? FOR UPDATE SKIP LOCKED",
                    on_ready(from)
                )
            };
            sql.claim_from = cursor.as_deref().map(&claim);
            sql.claim = claim("");
            let mark = format!(
                "UPDATE {t} SET {} WHERE {id} IN (",
                s.lease_take_set(spec, "?", "")
            );
            sql.lease_marks = (0..MARK_CLASSES)
                .map(|k| format!("{mark}{})", placeholders(1 << k)))
                .collect();
        }
        Form::AdvisoryLock => {
            // FIFO: only heads are candidates, and the take checks again, under the keys,
            // that the row is still its group's head (see form/advisory.rs).
            let group = spec.fifo_group();
            let head = group.map(|g| advisory_head(spec, g));
            s.advisory_candidates(spec, &mut sql, head.as_deref());
            // The cursor, as PostgreSQL's: a claim's first page reads on past the rows taken
            // before, whose delete-marked entries a snapshot held elsewhere keeps from purge
            // (x0.70 of plain under one, BENCHMARKS.md). Not with FIFO groups or priorities.
            sql.advisory_cursor = group.is_none() && spec.priority.is_none();
            sql.take = format!("UPDATE {t} SET {att} = {att} + 1 WHERE {ready} AND {id} = ?");
            if let Some(g) = group {
                sql.take.push_str(&advisory_take_head(spec, g));
            }
            sql.key_lock = Some("SELECT GET_LOCK(?, 0)".into());
            sql.key_unlock = Some("SELECT RELEASE_LOCK(?)".into());
        }
    }
    dead_by_ready_index(spec, &mut sql);
    sql.rates = rate_sql(spec);
    sql.fair = SYNTAX.fair_sql(spec);
    sql.flow_ready = SYNTAX.flow_ready(spec);
    if spec.dependencies {
        sql.deps = Some(deps_sql().clone());
        sql.waiting = SYNTAX.waiting_sql(spec, &DEPS);
    }
    if spec.form == Form::Lease && spec.flow_controlled() {
        sql.limited = Some(SYNTAX.limit_sql(spec, begin(Isolation::ReadCommitted), false));
    }
    if spec.form == Form::RowLock && spec.flow_controlled() {
        // The slot keys are session locks held by the delivery's connection.
        sql.limited = Some(SYNTAX.row_lock_limit_sql(spec, sql.begin.clone()));
        sql.key_lock = Some("SELECT GET_LOCK(?, 0)".into());
        sql.key_unlock = Some("SELECT RELEASE_LOCK(?)".into());
    }
    // The idle poll's check reads where the claims do (flow-controlled claims do not use the
    // cursor).
    if let (Some(from), Some(_), None) = (&cursor, &sql.claim_from, &sql.limited) {
        sql.any_ready_from = Some(format!(
            "SELECT 1 FROM {} WHERE {ready} AND {free}{from} LIMIT 1",
            on_ready(from)
        ));
    }
    sql
}

/// The pages of dead letters by id read them through the ready index, which `dead_at` leads
/// (MySQL has no partial index): one range of the dead rows, sorted by id. Left to itself the
/// optimizer walks the primary key for `ORDER BY id LIMIT n`, through every live row before
/// the first dead one (a second on a million ready rows).
fn dead_by_ready_index(spec: &TableSpec, sql: &mut TableSql) {
    let s = &SYNTAX;
    let t = s.q(&spec.name);
    let from = format!("FROM {t} WHERE");
    let forced = format!(
        "FROM {t} FORCE INDEX ({}) WHERE",
        s.q(&format!("{}_ready", spec.name))
    );
    sql.dead_page = sql.dead_page.replacen(&from, &forced, 1);
    if let Some(Some((page, _))) = sql.jobs_page.get_mut(3) {
        *page = page.replacen(&from, &forced, 1);
    }
    if let Some(Some((page, _))) = sql.jobs_preview.get_mut(3) {
        *page = page.replacen(&from, &forced, 1);
    }
}

/// [`TableSql::stats`]: one scan, a conditional count per state
/// ([`Syntax::stats_states`](crate::dialect::shared::Syntax::stats_states)). `?` placeholders
/// cannot be reused, so the time is bound once into a joined one-row table.
fn stats_sql(spec: &TableSpec) -> String {
    let s = &SYNTAX;
    let st = s.stats_states(spec, "q.", "n.now_");
    let count = |cond: Option<&String>| {
        cond.map_or_else(
            || "0".into(),
            |c| format!("COUNT(CASE WHEN {c} THEN 1 END)"),
        )
    };
    format!(
        "SELECT {}, {}, {}, {}, MIN(CASE WHEN {} THEN q.{} END), {} \
         FROM {} q CROSS JOIN (SELECT CAST(? AS DATETIME) AS now_) n",
        count(Some(&st.ready)),
        count(Some(&st.scheduled)),
        count(st.held.as_ref()),
        count(Some(&st.dead)),
        st.ready,
        s.q(&spec.run_at),
        count(st.completed.as_ref()),
        s.q(&spec.name)
    )
}

/// The FIFO statements of a row lock or lease table grouped by `group` ([`FifoSql`]). A head
/// is `id = (the group's smallest unfinished id)`: unlike `NOT EXISTS (.. older ..)`, a row
/// committed after the statement's snapshot is never taken for a head, and it costs one probe
/// of the `(group, dead_at, id)` index.
fn fifo(spec: &TableSpec, group: &str) -> FifoSql {
    let s = &SYNTAX;
    let (t, id, g, dead) = (
        s.q(&spec.name),
        s.q(&spec.id),
        s.q(group),
        s.q(&spec.dead_at),
    );
    let lu = s.q(&spec.locked_until);
    let lease = spec.form == Form::Lease;
    let ready = s.ready(spec, "?");
    let free = if lease {
        format!(" AND ({lu} IS NULL OR {lu} <= ?)")
    } else {
        String::new()
    };
    let heads = format!(
        "SELECT {id} FROM {t} h WHERE {ready}{free} AND (h.{g} IS NULL OR h.{id} = \
         (SELECT p.{id} FROM {t} p WHERE p.{g} = h.{g} AND p.{dead} IS NULL ORDER BY p.{id} LIMIT 1)) \
         ORDER BY {} LIMIT ?",
        s.order(spec)
    );
    let row = s.row_columns(spec, "");
    // The heads to lease first: by id (a primary-key scan locks only the rows it returns), or
    // with priorities by priority (then the candidates' locks last until the claim commits).
    let by = match &spec.priority {
        Some(p) => format!("{} DESC, {id}", s.q(p)),
        None => id.clone(),
    };
    let lock_many = if lease {
        (0..MARK_CLASSES)
            .map(|k| {
                format!(
                    "SELECT {row} FROM {t} WHERE {id} IN ({}) AND {ready}{free} ORDER BY {by} LIMIT ? \
                     FOR UPDATE SKIP LOCKED",
                    placeholders(1 << k)
                )
            })
            .collect()
    } else {
        Vec::new()
    };
    let guarded = if lease {
        format!("{id}, {lu}")
    } else {
        id.clone()
    };
    FifoSql {
        heads,
        lock_one: format!("SELECT {row} FROM {t} WHERE {id} = ? AND {ready} FOR UPDATE SKIP LOCKED"),
        lock_many,
        guard: format!(
            "SELECT {guarded} FROM {t} WHERE {g} = ? AND {dead} IS NULL ORDER BY {id} FOR UPDATE NOWAIT"
        ),
        group_at: crate::dialect::ROW_USER_COLUMNS + spec.group.unwrap_or_default(),
    }
}

/// Advisory FIFO candidates: the row aliased `q` is its group's head (its smallest unfinished
/// id, as [`fifo`] reads it), or has no group.
fn advisory_head(spec: &TableSpec, group: &str) -> String {
    let s = &SYNTAX;
    let (t, id, g, dead) = (
        s.q(&spec.name),
        s.q(&spec.id),
        s.q(group),
        s.q(&spec.dead_at),
    );
    format!(
        "(q.{g} IS NULL OR q.{id} = (SELECT p.{id} FROM {t} p WHERE p.{g} = q.{g} \
         AND p.{dead} IS NULL ORDER BY p.{id} LIMIT 1))"
    )
}

/// Advisory FIFO take, appended to `take`: `(group, group)`, the row is its group's head. MySQL
/// refuses a subquery on the table an `UPDATE` changes (error 1093) unless it reads a derived
/// table that is materialised, which its `LIMIT` makes sure of; the group comes as a parameter
/// since MariaDB and MySQL before 8.0.14 have no correlated derived tables.
fn advisory_take_head(spec: &TableSpec, group: &str) -> String {
    let s = &SYNTAX;
    let (t, id, g, dead) = (
        s.q(&spec.name),
        s.q(&spec.id),
        s.q(group),
        s.q(&spec.dead_at),
    );
    format!(
        " AND (? IS NULL OR {id} = (SELECT h.{id} FROM (SELECT p.{id} FROM {t} p \
         WHERE p.{g} = ? AND p.{dead} IS NULL ORDER BY p.{id} LIMIT 1) h))"
    )
}

/// `(table name)` -> `(column name, type)` of the table's columns (the schema check). A text
/// column's type carries its collation (`varchar collate utf8mb4_general_ci`), which the
/// check compares with [`crate::model::schema::ColumnDef::collations`].
pub(super) const COLUMNS: &str = "SELECT CAST(column_name AS CHAR), CAST(CONCAT(data_type, \
     IFNULL(CONCAT(' collate ', collation_name), '')) AS CHAR) FROM information_schema.columns \
     WHERE table_schema = DATABASE() AND table_name = ?";

/// The columns a table needs (the schema check and `migrate`), text in `collation`. The
/// columns whose values the library compares in SQL, the dedup key, the group, the queue and
/// the kind, must compare byte for byte (a case-insensitive queue column would give queue `a`'s
/// claims, listings and bulk cancels queue `A`'s rows): the check refuses them in any other
/// collation and `migrate` converts them ([`convert_columns`]). Other text columns are left as a table has them (the
/// library never compares them; converting one copies the table).
pub(super) fn column_defs(
    spec: &TableSpec,
    collation: &str,
) -> Vec<crate::model::schema::ColumnDef> {
    let mut defs = SYNTAX.column_list(spec, types(collation));
    let text = |i: Option<usize>| {
        i.and_then(|i| spec.columns.get(i))
            .filter(|c| c.ty == crate::model::table::ColumnType::Text)
            .map(|c| c.name.as_str())
    };
    let compared = [text(spec.group), text(spec.queue), text(spec.kind)];
    for d in &mut defs {
        if Some(d.name.as_str()) == spec.dedup_key.as_deref()
            || compared.contains(&Some(d.name.as_str()))
        {
            d.collations = BYTE_EXACT;
        }
    }
    defs
}

/// `ALTER TABLE .. MODIFY COLUMN ..` of `defs`, one statement (one table copy) for them all:
/// brings text columns made by an earlier release, in the database's default collation, to
/// their byte-exact definition. Their indexes are rebuilt with them.
pub(super) fn convert_columns(
    spec: &TableSpec,
    defs: &[&crate::model::schema::ColumnDef],
) -> String {
    let modify: Vec<String> = defs
        .iter()
        .map(|d| format!("MODIFY COLUMN {}", d.ddl))
        .collect();
    format!("ALTER TABLE {} {}", SYNTAX.q(&spec.name), modify.join(", "))
}

/// `(table name)` -> the names of the table's indexes (`migrate`).
pub(super) const INDEXES: &str = "SELECT DISTINCT CAST(index_name AS CHAR) FROM \
     information_schema.statistics WHERE table_schema = DATABASE() AND table_name = ?";

/// The indexes of `spec`: `(name, definition)`, the definition as `CREATE TABLE` lists it and
/// `ALTER TABLE .. ADD` takes it. Inline in `CREATE TABLE`, since MySQL 8 has no
/// `CREATE INDEX IF NOT EXISTS`.
pub(super) fn index_defs(spec: &TableSpec) -> Vec<(String, String)> {
    let s = &SYNTAX;
    // No partial indexes: `dead_at` leads, so the claims' `dead_at IS NULL AND run_at <= ?`
    // is one index range already in `ORDER BY run_at, id` order.
    // With priorities: `dead_at, priority DESC, run_at, id`, the claims' order.
    let ready = format!("{}_ready", spec.name);
    let mut out = vec![(
        ready.clone(),
        format!(
            "INDEX {} ({}, {})",
            s.q(&ready),
            s.q(&spec.dead_at),
            s.order(spec)
        ),
    )];
    if let Some(k) = &spec.dedup_key {
        // Dedup keys: dead-lettering clears a key, so a plain unique key leaves it to the
        // unfinished rows (NULLs never collide).
        let name = format!("{}_dedup", spec.name);
        out.push((
            name.clone(),
            format!("UNIQUE KEY {} ({})", s.q(&name), s.q(k)),
        ));
    }
    if let Some(c) = &spec.completed_at {
        // The prune's range.
        let name = format!("{}_completed", spec.name);
        out.push((name.clone(), format!("INDEX {} ({})", s.q(&name), s.q(c))));
    }
    if let Some(g) = spec.fifo_group() {
        // FIFO: the head probe and the group guard read the group's unfinished rows in order.
        let name = format!("{}_group", spec.name);
        out.push((
            name.clone(),
            format!(
                "INDEX {} ({}, {}, {})",
                s.q(&name),
                s.q(g),
                s.q(&spec.dead_at),
                s.q(&spec.id)
            ),
        ));
    }
    if let Some(c) = spec.fair.as_ref().and_then(|f| spec.columns.get(f.column)) {
        // Fair claims: the key skip and each key's first rows.
        let name = format!("{}_fair", spec.name);
        out.push((
            name.clone(),
            format!(
                "INDEX {} ({}, {}, {})",
                s.q(&name),
                s.q(&spec.dead_at),
                s.q(&c.name),
                s.order(spec)
            ),
        ));
    }
    if let Some(c) = spec.queue.and_then(|q| spec.columns.get(q)) {
        // Queues: a claim of one queue reads only its rows, in claim order.
        let name = format!("{}_queue", spec.name);
        out.push((
            name.clone(),
            format!(
                "INDEX {} ({}, {}, {})",
                s.q(&name),
                s.q(&spec.dead_at),
                s.q(&c.name),
                s.order(spec)
            ),
        ));
    }
    if spec.form == Form::Lease && !spec.limits.is_empty() {
        // Concurrency limits: the claim reads the rows in work by their lease.
        let name = format!("{}_leased", spec.name);
        out.push((
            name.clone(),
            format!(
                "INDEX {} ({}, {})",
                s.q(&name),
                s.q(&spec.dead_at),
                s.q(&spec.locked_until)
            ),
        ));
    }
    out
}

/// Drops the ready index and adds it again as [`index_defs`] defines it now.
pub(super) fn rebuild_ready_index(spec: &TableSpec) -> String {
    let ready = format!("{}_ready", spec.name);
    let definition = index_defs(spec)
        .into_iter()
        .find(|(name, _)| *name == ready)
        .map(|(_, d)| d)
        .unwrap_or_default();
    format!(
        "ALTER TABLE {} DROP INDEX {}, ADD {definition}",
        SYNTAX.q(&spec.name),
        SYNTAX.q(&ready)
    )
}

/// `ALTER TABLE .. ADD <definition>` of one index of [`index_defs`].
pub(super) fn add_index(spec: &TableSpec, definition: &str) -> String {
    format!("ALTER TABLE {} ADD {definition}", SYNTAX.q(&spec.name))
}

/// `CREATE TABLE IF NOT EXISTS`, its indexes inline, text in `collation`.
pub(super) fn create_table(spec: &TableSpec, collation: &str) -> Vec<String> {
    let s = &SYNTAX;
    let mut cols = s.column_defs(spec, types(collation));
    cols.extend(
        index_defs(spec)
            .into_iter()
            .map(|(_, definition)| definition),
    );
    let mut ddl = vec![format!(
        "CREATE TABLE IF NOT EXISTS {} ({}) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4",
        s.q(&spec.name),
        cols.join(", ")
    )];
    ddl.extend(rate_sql(spec).map(|r| r.create));
    if spec.dependencies {
        ddl.extend(deps_sql().create.iter().cloned());
    }
    ddl
}

/// How MySQL and MariaDB spell the waits' statements (table names are identifiers: ASCII;
/// the cursor of the sweeper's window spelled out, for the range optimizer).
pub(super) static DEPS: crate::dialect::deps::Spelling = crate::dialect::deps::Spelling {
    key_type: "VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin",
    bytes: "LONGBLOB NULL",
    table_tail: " ENGINE=InnoDB",
    index_inline: true,
    locking: " FOR UPDATE",
    upsert: crate::dialect::deps::Upsert::DuplicateKey,
    greatest: "GREATEST",
    row_values: false,
    begin_write: "START TRANSACTION",
};

/// The waits' statements of jobs that wait on others, made once.
pub(super) fn deps_sql() -> &'static crate::dialect::deps::DepsSql {
    static SQL: std::sync::OnceLock<crate::dialect::deps::DepsSql> = std::sync::OnceLock::new();
    SQL.get_or_init(|| SYNTAX.deps_sql(&DEPS))
}

/// The rate limits' statements of a table that has them. Keys are compared in a binary
/// collation; one that pads spaces may merge two keys that differ only by trailing spaces
/// into one window, never more claims than a limit allows.
fn rate_sql(spec: &TableSpec) -> Option<crate::dialect::flow::RateSql> {
    (!spec.rates.is_empty()).then(|| {
        SYNTAX.rate_sql(
            spec,
            "VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin",
            " ENGINE=InnoDB",
            " FOR UPDATE SKIP LOCKED",
            crate::dialect::flow::InsertIgnore::Ignore,
        )
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    /// A signal's statements: the wait read under a lock (the servers' current read, never
    /// InnoDB's snapshot), the head deleted only as read, the listing by the child index.
    #[test]
    fn signal_statements() {
        let s = &super::deps_sql().signals;
        assert!(s.wait_read.ends_with(" FOR UPDATE"), "{}", s.wait_read);
        assert!(
            !s.wait_deadline.contains("FOR UPDATE"),
            "{}",
            s.wait_deadline
        );
        assert!(
            s.unhead_unsent.contains("outcome IS NULL AND at = ?"),
            "{}",
            s.unhead_unsent
        );
        assert!(
            s.waited
                .contains("WHERE child_table = ? AND parent = ? AND outcome IS NULL")
                && s.waited.ends_with("LIMIT 100"),
            "{}",
            s.waited
        );
    }

    /// The ready index rebuilt for priorities: one `ALTER TABLE`, the new claim order after
    /// `dead_at` (the same text on MySQL 8 as on MariaDB, where it runs live).
    #[test]
    fn the_ready_index_is_rebuilt_in_priority_order() {
        let spec = crate::model::table::Table::new("jobs")
            .priorities()
            .validate()
            .unwrap();
        assert_eq!(
            super::rebuild_ready_index(&spec),
            "ALTER TABLE `jobs` DROP INDEX `jobs_ready`, ADD INDEX `jobs_ready` \
             (`dead_at`, `priority` DESC, `run_at`, `id`)"
        );
    }

    use super::*;
    use crate::dialect::mysql::Mysql;
    use crate::dialect::shared::PageFilter;
    use crate::dialect::Dialect;
    use crate::model::table::Isolation;
    use crate::model::table::Table;
    use crate::model::value::Value;

    /// `migrate` adds `created_at` with no value for the rows there, the default after.
    #[test]
    fn migrate_adds_created_at() {
        let spec = Table::new("jobs").validate().unwrap();
        let defs = column_defs(&spec, BYTE_EXACT[0]);
        let d = defs.iter().find(|d| d.name == "created_at").unwrap();
        assert_eq!(
            SYNTAX.add_column(&spec, d),
            [
                "ALTER TABLE `jobs` ADD COLUMN `created_at` DATETIME NULL",
                "ALTER TABLE `jobs` MODIFY COLUMN `created_at` DATETIME NULL DEFAULT CURRENT_TIMESTAMP"
            ]
        );
    }

    fn dialect() -> Mysql {
        Mysql::from_url("mysql://u@h/db", &crate::dialect::test_options()).unwrap()
    }

    fn compile(t: Table) -> TableSql {
        dialect().compile(&t.validate().unwrap())
    }

    /// Fair claims and rate limits on MySQL 8 (MariaDB runs them live; no MySQL 8 server
    /// here): the key skip is one recursive CTE whose recursive part names the CTE once, in
    /// its `FROM` (MySQL 8's rule), with a correlated `min()` per step; each key's first rows
    /// are derived tables in a `UNION ALL`; a slot is picked `FOR UPDATE SKIP LOCKED`, stamped
    /// fenced by its free condition, and made with `INSERT IGNORE`.
    /// The waits' statements as MySQL 8 and MariaDB run them (MySQL 8 has no server here: its
    /// text is checked): the child index inside the table definition (MySQL 8 has no `CREATE
    /// INDEX IF NOT EXISTS`), heads upserted with `ON DUPLICATE KEY UPDATE` (which locks the
    /// row it meets) and read `FOR UPDATE` (a current read), a waiting job counted down by an
    /// update (which locks its count).
    #[test]
    fn dependency_statements() {
        let sql = dialect().compile(
            &Table::new("steps")
                .dependencies()
                .lease(std::time::Duration::from_secs(30))
                .validate()
                .unwrap(),
        );
        let deps = sql.deps.as_ref().unwrap();
        assert_eq!(deps.create.len(), 1);
        assert!(
            deps.create[0]
                .contains(", INDEX `sqlbroker_deps_child` (child_table, child)) ENGINE=InnoDB"),
            "{}",
            deps.create[0]
        );
        assert!(deps.create[0]
            .contains("parent_table VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL"));
        // A head named again moves its `at` on (the sweeper's delete compares it).
        assert_eq!(
            deps.head_touch,
            "INSERT INTO `sqlbroker_deps` (parent_table, parent, child_table, child, settled_only, \
             outcome, at) VALUES (?, ?, '', 0, 0, NULL, ?) ON DUPLICATE KEY UPDATE at = \
             GREATEST(at + 1, VALUES(at))"
        );
        assert!(deps.head_settle.ends_with(
            "(parent_table, parent, child_table, child, outcome, at, output, settled_only) VALUES \
             (?, ?, '', 0, ?, ?, ?, ?) ON DUPLICATE KEY UPDATE settled_only = \
             VALUES(settled_only), outcome = VALUES(outcome), at = GREATEST(at + 1, VALUES(at)), \
             output = COALESCE(VALUES(output), output)"
        ));
        // The sweeper's cursor spelled out (7 parameters), for the range optimizer.
        assert!(deps.window_spelled);
        assert_eq!(
            deps.window,
            "SELECT parent_table, parent, child_table, child, outcome, at, settled_only FROM \
             `sqlbroker_deps` WHERE (parent_table > ? OR (parent_table = ? AND (parent > ? OR (parent = ? AND \
             (child_table > ? OR (child_table = ? AND child > ?)))))) ORDER BY parent_table, \
             parent, child_table, child LIMIT 500"
        );
        assert_eq!(deps.window.matches('?').count(), 7);
        assert_eq!(
            deps.sweep_many.matches('?').count(),
            3 * crate::dialect::deps::SWEEP_BATCH
        );
        assert!(deps.sweep_many.starts_with(
            "DELETE FROM `sqlbroker_deps` WHERE LENGTH(child_table) = 0 AND outcome IS NOT NULL \
             AND ((parent_table = ? AND parent = ? AND at = ?) OR (parent_table = ?"
        ));
        assert_eq!(
            deps.forget_all,
            "DELETE FROM `sqlbroker_deps` WHERE (child_table = ? AND child = ?) OR (parent_table \
             = ? AND parent = ? AND LENGTH(child_table) = 0)"
        );
        // A job dead-lettered through the job it waits on frees its dedup key, as every dead
        // letter does.
        let keyed = dialect().compile(
            &Table::new("steps")
                .dependencies()
                .dedup()
                .lease(std::time::Duration::from_secs(30))
                .validate()
                .unwrap(),
        );
        assert_eq!(
            keyed.waiting.as_ref().unwrap().dead,
            "UPDATE `steps` SET `dead_at` = ?, `dead_reason` = ?, `dedup_key` = NULL WHERE `id` = \
             ? AND `run_at` = ? AND `dead_at` IS NULL"
        );
        assert!(keyed.waiting.as_ref().unwrap().heads_dead.ends_with(
            "FROM `steps` WHERE `dead_at` IS NOT NULL AND `id` > ? AND `id` <= ? ON DUPLICATE KEY \
             UPDATE settled_only = 1, at = GREATEST(at + 1, VALUES(at))"
        ));
        assert!(deps.create[0].contains("output LONGBLOB NULL, PRIMARY KEY"));
        assert_eq!(
            deps.add_output,
            "ALTER TABLE `sqlbroker_deps` ADD COLUMN output LONGBLOB NULL"
        );
        assert!(deps
            .head_read
            .ends_with("child_table = '' AND child = 0 FOR UPDATE"));
        assert_eq!(
            deps.count_down,
            "UPDATE `sqlbroker_deps` SET pending = pending - 1 WHERE parent_table = '' AND \
             parent = 0 AND child_table = ? AND child = ?"
        );
        let plain = Table::new("plain").validate().unwrap();
        assert!(dialect().compile(&plain).deps.is_none());
    }

    #[test]
    fn fair_and_rate_statements() {
        let spec = Table::new("jobs")
            .text_column("tenant")
            .fair("{tenant}")
            .rate_limit("{tenant}", 5, std::time::Duration::from_secs(1))
            .lease(std::time::Duration::from_secs(30))
            .validate()
            .unwrap();
        let sql = dialect().compile(&spec);
        let fair = sql.fair.as_ref().unwrap();
        assert_eq!(
            fair.keys[1],
            "WITH RECURSIVE sqlbroker_k (sqlbroker_v, sqlbroker_n) AS (SELECT (SELECT \
             `tenant` FROM `jobs` WHERE `dead_at` IS NULL AND `run_at` <= ? AND `tenant` > ? \
             ORDER BY `tenant` LIMIT 1), 1 UNION ALL SELECT (SELECT sqlbroker_f.`tenant` FROM \
             `jobs` AS sqlbroker_f WHERE `dead_at` IS NULL AND `run_at` <= ? AND \
             sqlbroker_f.`tenant` > sqlbroker_k.sqlbroker_v ORDER BY sqlbroker_f.`tenant` \
             LIMIT 1), sqlbroker_n + 1 FROM sqlbroker_k WHERE sqlbroker_k.sqlbroker_v IS NOT NULL AND \
             sqlbroker_k.sqlbroker_n < ?) SELECT sqlbroker_v FROM sqlbroker_k WHERE \
             sqlbroker_v IS NOT NULL"
        );
        assert!(!fair.keys[0].contains("`tenant` > ?"));
        assert_eq!(
            SYNTAX.fair_heads(&spec, 1, true, false),
            "SELECT * FROM (SELECT `id`, `run_at`, `tenant` FROM `jobs` FORCE INDEX (`jobs_fair`) WHERE `tenant` = ? AND \
             `dead_at` IS NULL AND `run_at` <= ? AND (`locked_until` IS NULL OR `locked_until` \
             <= ?) ORDER BY `run_at`, `id` LIMIT ?) AS sqlbroker_h0 UNION ALL SELECT * FROM \
             (SELECT `id`, `run_at`, `tenant` FROM `jobs` FORCE INDEX (`jobs_fair`) WHERE `tenant` IS NULL AND `dead_at` \
             IS NULL AND `run_at` <= ? AND (`locked_until` IS NULL OR `locked_until` <= ?) \
             ORDER BY `run_at`, `id` LIMIT ?) AS sqlbroker_h1"
        );
        // The lease claim's: each key's rows locked inside its derived table (MySQL 8 is
        // covered by this text only; MariaDB runs it in the live tests); with rate limits,
        // which pass rows by, from the head of the key's range.
        assert_eq!(
            SYNTAX.fair_heads(&spec, 1, false, true),
            "SELECT * FROM (SELECT `id`, `run_at`, `tenant` FROM `jobs` FORCE INDEX (`jobs_fair`) WHERE `tenant` = ? AND \
             `dead_at` IS NULL AND `run_at` <= ? AND (`locked_until` IS NULL OR `locked_until` \
             <= ?) ORDER BY `run_at`, `id` LIMIT ? FOR UPDATE SKIP LOCKED) AS sqlbroker_h0"
        );
        // Fair alone: after each key's cursor (two ranges: MariaDB plans a row comparison on
        // its first column alone).
        let fair_only = Table::new("jobs")
            .text_column("tenant")
            .fair("{tenant}")
            .lease(std::time::Duration::from_secs(30))
            .validate()
            .unwrap();
        assert_eq!(
            SYNTAX.fair_heads(&fair_only, 1, false, true),
            "SELECT * FROM (SELECT `id`, `run_at`, `tenant` FROM `jobs` FORCE INDEX (`jobs_fair`) WHERE `tenant` = ? AND \
             (`run_at` > ? OR (`run_at` = ? AND `id` > ?)) AND `dead_at` IS NULL AND `run_at` \
             <= ? AND (`locked_until` IS NULL OR `locked_until` <= ?) ORDER BY `run_at`, `id` \
             LIMIT ? FOR UPDATE SKIP LOCKED) AS sqlbroker_h0"
        );
        let rates = sql.rates.as_ref().unwrap();
        // MySQL 8 and MariaDB alike (MariaDB runs them live): the oldest free slots by the
        // index of stamps, locked, then stamped by list; free slots made from a recursive
        // series in a derived table; no `RETURNING`.
        assert_eq!(
            rates.pick,
            "SELECT slot FROM `jobs_rates` WHERE lim = ? AND rkey = ? AND at <= ? AND slot < ? \
             ORDER BY at LIMIT ? FOR UPDATE SKIP LOCKED"
        );
        assert_eq!(
            rates.stamp_in[1],
            "UPDATE `jobs_rates` SET at = ? WHERE lim = ? AND rkey = ? AND at <= ? AND slot IN (?, ?)"
        );
        assert!(rates.take_oldest.is_none() && rates.index.is_none());
        assert_eq!(
            rates.make_free,
            "INSERT IGNORE INTO `jobs_rates` (lim, rkey, slot, at) SELECT ?, ?, n, 0 FROM (WITH \
             RECURSIVE s (n) AS (SELECT ? UNION ALL SELECT n + 1 FROM s WHERE n < ?) SELECT n FROM \
             s) AS r"
        );
        assert_eq!(
            rates.add_index.as_deref(),
            Some("ALTER TABLE `jobs_rates` ADD INDEX `jobs_rates_at` (lim, rkey, at)")
        );
        assert_eq!(rates.free_in.len(), 7);
        assert!(rates.free_in[6].matches('?').count() == 3 + 64);
        let ddl = create_table(&spec, "utf8mb4_bin");
        assert!(ddl[0].contains("INDEX `jobs_fair` (`dead_at`, `tenant`, `run_at`, `id`)"));
        assert!(ddl[1].starts_with(
            "CREATE TABLE IF NOT EXISTS `jobs_rates` (lim INTEGER NOT \
             NULL, rkey VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL"
        ));
        // A table without them compiles none of it.
        let plain = compile(Table::new("p").lease(std::time::Duration::from_secs(30)));
        assert!(plain.fair.is_none() && plain.rates.is_none() && plain.limited.is_none());
    }

    #[test]
    fn dead_pages_read_the_ready_index() {
        let sql = compile(Table::new("jobs").text_column("k"));
        let forced =
            "FROM `jobs` FORCE INDEX (`jobs_ready`) WHERE `dead_at` IS NOT NULL AND `id` > ? \
                      ORDER BY `id` LIMIT ?";
        assert!(sql.dead_page.ends_with(forced), "{}", sql.dead_page);
        let page = &sql.jobs_page[3].as_ref().unwrap().0;
        assert!(page.ends_with(forced), "{page}");
        // The other states are left to the optimizer.
        assert!(!sql.jobs_page[1].as_ref().unwrap().0.contains("FORCE INDEX"));
    }

    #[test]
    fn row_lock_sql() {
        let sql = compile(Table::new("emails").text_column("to"));
        // The session's own level (set once per connection): no `SET TRANSACTION` round trip.
        assert_eq!(sql.begin, ["START TRANSACTION"]);
        assert_eq!(sql.begin_write, "START TRANSACTION");
        assert_eq!(
            sql.claim,
            "SELECT `id`, `attempts`, `payload`, `to`, `run_at` FROM `emails` WHERE `dead_at` IS NULL AND `run_at` <= ? \
             ORDER BY `run_at`, `id` LIMIT ? FOR UPDATE SKIP LOCKED"
        );
        // The cursor: `(now, run_at, run_at, id, limit)`; none in a FIFO table.
        assert_eq!(
            sql.claim_from.as_deref(),
            Some(
                "SELECT `id`, `attempts`, `payload`, `to`, `run_at` FROM `emails` FORCE INDEX (`emails_ready`) WHERE \
                 `dead_at` IS NULL AND `run_at` <= ? AND (`run_at` > ? OR (`run_at` = ? AND `id` > ?)) ORDER BY `run_at`, `id` LIMIT ? FOR UPDATE SKIP LOCKED"
            )
        );
        let fifo = compile(Table::new("emails").text_column("to").group("to").fifo());
        assert!(fifo.claim_from.is_none() && fifo.any_ready_from.is_none());
        assert_eq!(sql.ack, "DELETE FROM `emails` WHERE `id` = ?");
        assert_eq!(
            sql.any_ready.as_deref(),
            Some("SELECT 1 FROM `emails` WHERE `dead_at` IS NULL AND `run_at` <= ? AND ? IS NOT NULL LIMIT 1")
        );
        assert_eq!(
            sql.any_ready_from.as_deref(),
            Some(
                "SELECT 1 FROM `emails` FORCE INDEX (`emails_ready`) WHERE `dead_at` IS NULL AND \
                 `run_at` <= ? AND ? IS NOT NULL AND (`run_at` > ? OR (`run_at` = ? AND `id` > ?)) \
                 LIMIT 1"
            )
        );
        let limited = Table::new("emails").concurrency_limit("", 2);
        assert!(compile(limited).any_ready_from.is_none());
        assert_eq!(
            compile(Table::new("jobs").lease(std::time::Duration::from_secs(30)))
                .any_ready
                .as_deref(),
            Some(
                "SELECT 1 FROM `jobs` WHERE `dead_at` IS NULL AND `run_at` <= ? AND \
                 (`locked_until` IS NULL OR `locked_until` <= ?) LIMIT 1"
            )
        );
        assert_eq!(
            sql.retry,
            "UPDATE `emails` SET `run_at` = ?, `last_error` = COALESCE(?, `last_error`), `errors` = `errors` + ?, `attempts` = `attempts` + 1 WHERE `id` = ?"
        );
        assert_eq!(
            sql.dead,
            "UPDATE `emails` SET `dead_at` = ?, `dead_reason` = ?, `last_error` = COALESCE(?, `last_error`), `errors` = `errors` + ?, `attempts` = `attempts` + 1 WHERE `id` = ?"
        );
        assert_eq!(
            sql.insert_one,
            "INSERT INTO `emails` (`payload`, `run_at`, `to`, `created_at`) VALUES (?, ?, ?, UTC_TIMESTAMP())"
        );
        assert_eq!(
            sql.insert_id, None,
            "MySQL 8 has no INSERT .. RETURNING: the driver's last insert id"
        );
        assert_eq!(
            sql.fetch,
            "SELECT `id`, `attempts`, `payload`, `to`, `run_at` FROM `emails` WHERE `id` = ?"
        );
        assert_eq!(
            sql.dead_list,
            "SELECT `id`, `attempts`, `payload`, `dead_at`, `dead_reason`, `last_error`, `errors`, `to` FROM `emails` \
             WHERE `dead_at` IS NOT NULL ORDER BY `dead_at`, `id` LIMIT ?"
        );
        assert_eq!(
            sql.dead_requeue,
            "UPDATE `emails` SET `dead_at` = NULL, `dead_reason` = NULL, `attempts` = 0, `run_at` = ? WHERE `id` = ? AND `dead_at` IS NOT NULL"
        );
        assert_eq!(
            sql.stats,
            "SELECT COUNT(CASE WHEN q.`dead_at` IS NULL AND q.`run_at` <= n.now_ THEN 1 END), COUNT(CASE WHEN \
             q.`dead_at` IS NULL AND q.`run_at` > n.now_ THEN 1 END), 0, COUNT(CASE WHEN q.`dead_at` IS NOT NULL \
             THEN 1 END), MIN(CASE WHEN q.`dead_at` IS NULL AND q.`run_at` <= n.now_ THEN q.`run_at` END), 0 FROM \
             `emails` q CROSS JOIN (SELECT CAST(? AS DATETIME) AS now_) n"
        );
        assert_eq!(
            sql.dead_requeue_range,
            "UPDATE `emails` SET `dead_at` = NULL, `dead_reason` = NULL, `attempts` = 0, `run_at` = ? \
             WHERE `dead_at` IS NOT NULL AND `id` > ? AND `id` <= ?"
        );
        assert!(sql.key_lock.is_none() && sql.lease_marks.is_empty() && sql.take.is_empty());
        let sql = compile(Table::new("emails").isolation(Isolation::RepeatableRead));
        assert_eq!(
            sql.begin,
            [
                "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ",
                "START TRANSACTION"
            ]
        );
    }

    #[test]
    fn lease_sql() {
        let sql = compile(
            Table::new("thumbs")
                .int_column("n")
                .lease(Duration::from_secs(30)),
        );
        // The session's own level (set once per connection): no `SET TRANSACTION` round trip.
        assert_eq!(sql.begin, ["START TRANSACTION"]);
        assert_eq!(
            sql.claim,
            "SELECT `id`, `attempts`, `payload`, `n`, `cancel_requested`, `run_at` FROM `thumbs` WHERE `dead_at` IS NULL AND `run_at` <= ? \
             AND (`locked_until` IS NULL OR `locked_until` <= ?) ORDER BY `run_at`, `id` LIMIT ? FOR UPDATE SKIP LOCKED"
        );
        // The cursor: `(now, now, run_at, run_at, id, limit)`; none with priorities.
        assert_eq!(
            sql.claim_from.as_deref(),
            Some(
                "SELECT `id`, `attempts`, `payload`, `n`, `cancel_requested`, `run_at` FROM `thumbs` FORCE INDEX \
                 (`thumbs_ready`) WHERE `dead_at` IS NULL AND `run_at` <= ? AND (`locked_until` IS NULL OR `locked_until` <= ?) AND (`run_at` > ? OR (`run_at` = ? \
                 AND `id` > ?)) ORDER BY `run_at`, `id` LIMIT ? FOR UPDATE SKIP LOCKED"
            )
        );
        let urgent = Table::new("thumbs")
            .priorities()
            .lease(Duration::from_secs(30));
        assert!(compile(urgent).claim_from.is_none());
        assert_eq!(sql.lease_marks.len(), 11);
        assert_eq!(
            sql.lease_marks[0],
            "UPDATE `thumbs` SET `errors` = `errors` + CASE WHEN `locked_until` IS NOT NULL THEN 1 ELSE 0 END, `last_error` = CASE WHEN `locked_until` IS NOT NULL THEN 'lease ran out: claimed and never settled in time (its process stopped, hung, or could not renew the lease)' ELSE `last_error` END, `locked_until` = ?, `attempts` = `attempts` + 1 WHERE `id` IN (?)"
        );
        assert_eq!(
            sql.lease_marks[2],
            "UPDATE `thumbs` SET `errors` = `errors` + CASE WHEN `locked_until` IS NOT NULL THEN 1 ELSE 0 END, `last_error` = CASE WHEN `locked_until` IS NOT NULL THEN 'lease ran out: claimed and never settled in time (its process stopped, hung, or could not renew the lease)' ELSE `last_error` END, `locked_until` = ?, `attempts` = `attempts` + 1 WHERE `id` IN (?, ?, ?, ?)"
        );
        assert!(sql.lease_marks[10].ends_with(&format!("IN ({})", placeholders(1024))));
        assert_eq!(
            sql.ack,
            "DELETE FROM `thumbs` WHERE `id` = ? AND `locked_until` = ?"
        );
        assert_eq!(
            sql.retry,
            "UPDATE `thumbs` SET `run_at` = ?, `last_error` = COALESCE(?, `last_error`), `errors` = `errors` + ?, `dead_at` = CASE WHEN `cancel_requested` <> 0 THEN UTC_TIMESTAMP() ELSE `dead_at` END, `dead_reason` = CASE WHEN `cancel_requested` <> 0 THEN 'cancelled' ELSE `dead_reason` END, `locked_until` = NULL WHERE `id` = ? AND `locked_until` = ?"
        );
        assert_eq!(
            sql.dead,
            "UPDATE `thumbs` SET `dead_at` = ?, `dead_reason` = ?, `last_error` = COALESCE(?, `last_error`), `errors` = `errors` + ?, `locked_until` = NULL WHERE `id` = ? AND `locked_until` = ?"
        );
        assert_eq!(
            sql.unclaim,
            "UPDATE `thumbs` SET `locked_until` = NULL, `attempts` = `attempts` - 1, `dead_at` = CASE WHEN `cancel_requested` <> 0 THEN UTC_TIMESTAMP() ELSE `dead_at` END, `dead_reason` = CASE WHEN `cancel_requested` <> 0 THEN 'cancelled' ELSE `dead_reason` END WHERE `id` = ? AND `locked_until` = ?"
        );
        assert_eq!(
            sql.dead_requeue,
            "UPDATE `thumbs` SET `dead_at` = NULL, `dead_reason` = NULL, `locked_until` = NULL, `cancel_requested` = 0, `attempts` = 0, `run_at` = ? \
             WHERE `id` = ? AND `dead_at` IS NOT NULL"
        );
        let spec = Table::new("thumbs")
            .lease(Duration::from_secs(30))
            .validate()
            .unwrap();
        assert_eq!(
            renew_lock_sql(&spec, 2),
            "SELECT `id`, `locked_until` FROM `thumbs` WHERE `id` IN (?, ?) FOR UPDATE SKIP LOCKED"
        );
        assert_eq!(
            renew_set_sql(&spec, 1),
            "UPDATE `thumbs` SET `locked_until` = ? WHERE `id` IN (?)"
        );
        assert_eq!(
            ack_lock_sql(&spec, 2),
            "SELECT `id`, `locked_until` FROM `thumbs` WHERE `id` IN (?, ?) FOR UPDATE"
        );
        assert_eq!(
            ack_many_sql(&spec, 2),
            "DELETE FROM `thumbs` WHERE `id` IN (?, ?)"
        );
    }

    /// Advisory FIFO: candidates are heads (the group's smallest unfinished id, or no group);
    /// the take checks the head again through a derived table that its `LIMIT` materialises
    /// (MySQL 8 refuses a subquery on the updated table otherwise: error 1093), the group
    /// bound twice after `(now, id)`.
    #[test]
    fn advisory_fifo_sql() {
        let sql = compile(
            Table::new("orders")
                .group("customer")
                .fifo()
                .advisory_lock("orders-{customer}"),
        );
        let head = "(q.`customer` IS NULL OR q.`id` = (SELECT p.`id` FROM `orders` p \
                    WHERE p.`customer` = q.`customer` AND p.`dead_at` IS NULL ORDER BY p.`id` LIMIT 1))";
        assert_eq!(
            sql.claim,
            format!(
                "SELECT `id`, `run_at`, `customer` FROM `orders` q WHERE `dead_at` IS NULL AND `run_at` <= ? \
                 AND {head} ORDER BY `run_at`, `id` LIMIT ?"
            )
        );
        assert_eq!(
            sql.claim_after,
            format!(
                "SELECT `id`, `run_at`, `customer` FROM `orders` q WHERE `dead_at` IS NULL AND `run_at` <= ? \
                 AND {head} AND (`run_at` > ? OR (`run_at` = ? AND `id` > ?)) ORDER BY `run_at`, `id` LIMIT ?"
            )
        );
        assert_eq!(
            sql.take,
            "UPDATE `orders` SET `attempts` = `attempts` + 1 WHERE `dead_at` IS NULL AND `run_at` <= ? AND `id` = ? \
             AND (? IS NULL OR `id` = (SELECT h.`id` FROM (SELECT p.`id` FROM `orders` p \
             WHERE p.`customer` = ? AND p.`dead_at` IS NULL ORDER BY p.`id` LIMIT 1) h))"
        );
        // The statements without FIFO stay as they were.
        let plain = compile(
            Table::new("orders")
                .text_column("customer")
                .advisory_lock("{customer}"),
        );
        assert!(!plain.claim.contains(" q ") && !plain.take.contains("SELECT"));
    }

    #[test]
    fn advisory_sql() {
        let sql = compile(
            Table::new("payments")
                .text_column("account")
                .advisory_lock("accounts-{account}"),
        );
        assert_eq!(
            sql.claim,
            "SELECT `id`, `run_at`, `account` FROM `payments` WHERE `dead_at` IS NULL AND `run_at` <= ? \
             ORDER BY `run_at`, `id` LIMIT ?"
        );
        // Positional parameters in the order the claim passes them: now, run_at, run_at, id,
        // limit (two ranges: MariaDB plans a row comparison on its first column alone). The
        // subscription's cursor reads it too.
        assert_eq!(
            sql.claim_after,
            "SELECT `id`, `run_at`, `account` FROM `payments` WHERE `dead_at` IS NULL AND `run_at` <= ? \
             AND (`run_at` > ? OR (`run_at` = ? AND `id` > ?)) ORDER BY `run_at`, `id` LIMIT ?"
        );
        assert!(sql.advisory_cursor);
        assert_eq!(
            sql.take,
            "UPDATE `payments` SET `attempts` = `attempts` + 1 WHERE `dead_at` IS NULL AND `run_at` <= ? AND `id` = ?"
        );
        assert_eq!(
            sql.fetch,
            "SELECT `id`, `attempts`, `payload`, `account`, `cancel_requested`, `run_at` FROM `payments` WHERE `id` = ?"
        );
        assert_eq!(sql.ack, "DELETE FROM `payments` WHERE `id` = ?");
        assert_eq!(
            sql.retry,
            "UPDATE `payments` SET `run_at` = ?, `last_error` = COALESCE(?, `last_error`), `errors` = `errors` + ?, `dead_at` = CASE WHEN `cancel_requested` <> 0 THEN UTC_TIMESTAMP() ELSE `dead_at` END, `dead_reason` = CASE WHEN `cancel_requested` <> 0 THEN 'cancelled' ELSE `dead_reason` END WHERE `id` = ?"
        );
        assert_eq!(
            sql.dead,
            "UPDATE `payments` SET `dead_at` = ?, `dead_reason` = ?, `last_error` = COALESCE(?, `last_error`), `errors` = `errors` + ? WHERE `id` = ?"
        );
        assert_eq!(sql.key_lock.as_deref(), Some("SELECT GET_LOCK(?, 0)"));
        assert_eq!(sql.key_unlock.as_deref(), Some("SELECT RELEASE_LOCK(?)"));
    }

    #[test]
    fn ddl_and_inserts() {
        let d = dialect();
        let spec = Table::new("jobs")
            .text_column("k")
            .int_column("n")
            .float_column("f")
            .bytes_column("b")
            .lease(Duration::from_secs(5))
            .validate()
            .unwrap();
        assert_eq!(
            d.create_table(&spec),
            [
                "CREATE TABLE IF NOT EXISTS `jobs` (`id` BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY, \
                 `payload` LONGBLOB NOT NULL, `attempts` INT NOT NULL DEFAULT 0, \
                 `run_at` DATETIME NOT NULL DEFAULT CURRENT_TIMESTAMP, `locked_until` DATETIME NULL, \
                 `dead_at` DATETIME NULL, `dead_reason` MEDIUMTEXT NULL, \
                 `last_error` MEDIUMTEXT NULL, `errors` INT NOT NULL DEFAULT 0, \
                 `cancel_requested` INT NOT NULL DEFAULT 0, \
                 `created_at` DATETIME NULL DEFAULT CURRENT_TIMESTAMP, \
                 `k` VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_0900_bin NULL, `n` BIGINT NULL, \
                 `f` DOUBLE NULL, `b` LONGBLOB NULL, INDEX `jobs_ready` (`dead_at`, `run_at`, `id`)) \
                 ENGINE=InnoDB DEFAULT CHARSET=utf8mb4"
            ]
        );
        let row_lock = Table::new("jobs").validate().unwrap();
        assert!(!d.create_table(&row_lock)[0].contains("locked_until"));
        assert_eq!(
            d.insert_many(&spec, 2),
            "INSERT INTO `jobs` (`payload`, `run_at`, `k`, `n`, `f`, `b`, `created_at`) VALUES (?, ?, ?, ?, ?, ?, UTC_TIMESTAMP()), (?, ?, ?, ?, ?, ?, UTC_TIMESTAMP())"
        );
        assert_eq!(d.max_params(), 65_535);
    }

    #[test]
    fn id_lists_are_padded_to_size_classes() {
        assert_eq!(
            [0, 1, 2, 3, 5, 8, 9, 500].map(crate::dialect::size_class),
            [1, 1, 2, 4, 8, 8, 16, 512]
        );
        let mut p = vec![Value::Null];
        crate::dialect::id_params(&[7, 9, 4], crate::dialect::size_class(3), &mut p);
        assert_eq!(
            p,
            [
                Value::Null,
                Value::Int(7),
                Value::Int(9),
                Value::Int(4),
                Value::Int(4)
            ]
        );
    }

    #[test]
    fn lock_names() {
        let d = dialect();
        assert_eq!(d.key_name("accounts-a-17"), "db.accounts-a-17");
        // Exactly 64 characters stay as they are.
        let key = "k".repeat(61);
        assert_eq!(d.key_name(&key), format!("db.{key}"));
        // 65 are hashed: SHA-256 of the whole name, lowercase hex.
        let long = "k".repeat(62);
        let name = d.key_name(&long);
        assert_eq!(name.len(), 64);
        assert!(name
            .chars()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
        assert_eq!(lock_name("db", &long), name);
        assert_ne!(lock_name("other", &long), name);
        // Known vector: SHA-256("abc").
        assert_eq!(
            format!("{:x}", Sha256::digest(b"abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        let hashed = lock_name("", &"x".repeat(64));
        assert_eq!(
            hashed,
            format!(
                "{:x}",
                Sha256::digest(format!(".{}", "x".repeat(64)).as_bytes())
            )
        );
        // Characters, not bytes: 63 two-byte characters fit (127 bytes).
        assert_eq!(
            lock_name("", &"é".repeat(63)),
            format!(".{}", "é".repeat(63))
        );
        // But 48 four-byte characters (193 bytes with the dot) are past what MariaDB takes.
        let emoji = "😀".repeat(48);
        assert_eq!(
            lock_name("", &emoji),
            format!("{:x}", Sha256::digest(format!(".{emoji}").as_bytes()))
        );
        assert_eq!(
            lock_name("", &"😀".repeat(47)),
            format!(".{}", "😀".repeat(47))
        );
    }

    #[test]
    fn fifo_sql() {
        let t = Table::new("orders").group("customer").fifo();
        let head = "(h.`customer` IS NULL OR h.`id` = (SELECT p.`id` FROM `orders` p WHERE \
             p.`customer` = h.`customer` AND p.`dead_at` IS NULL ORDER BY p.`id` LIMIT 1)) \
             ORDER BY `run_at`, `id` LIMIT ?";
        let f = compile(t.clone()).fifo.unwrap();
        assert_eq!(
            f.heads,
            format!(
                "SELECT `id` FROM `orders` h WHERE `dead_at` IS NULL AND `run_at` <= ? AND {head}"
            )
        );
        assert_eq!(
            f.lock_one,
            "SELECT `id`, `attempts`, `payload`, `customer`, `run_at` FROM `orders` WHERE `id` = ? AND \
             `dead_at` IS NULL AND `run_at` <= ? FOR UPDATE SKIP LOCKED"
        );
        assert_eq!(
            f.guard,
            "SELECT `id` FROM `orders` WHERE `customer` = ? AND `dead_at` IS NULL ORDER BY `id` FOR UPDATE NOWAIT"
        );
        assert_eq!(f.group_at, 3);
        assert!(f.lock_many.is_empty());
        let lease = t.lease(Duration::from_secs(30));
        let f = compile(lease.clone()).fifo.unwrap();
        let free = "(`locked_until` IS NULL OR `locked_until` <= ?)";
        assert_eq!(
            f.heads,
            format!("SELECT `id` FROM `orders` h WHERE `dead_at` IS NULL AND `run_at` <= ? AND {free} AND {head}")
        );
        assert_eq!(f.lock_many.len(), 11);
        assert_eq!(
            f.lock_many[1],
            format!(
                "SELECT `id`, `attempts`, `payload`, `customer`, `cancel_requested`, `run_at` FROM `orders` WHERE `id` IN (?, ?) AND \
                 `dead_at` IS NULL AND `run_at` <= ? AND {free} ORDER BY `id` LIMIT ? FOR UPDATE SKIP LOCKED"
            )
        );
        assert_eq!(
            f.guard,
            "SELECT `id`, `locked_until` FROM `orders` WHERE `customer` = ? AND `dead_at` IS NULL \
             ORDER BY `id` FOR UPDATE NOWAIT"
        );
        let ddl = dialect().create_table(&lease.validate().unwrap());
        assert!(ddl[0].contains(
            "INDEX `orders_ready` (`dead_at`, `run_at`, `id`), INDEX `orders_group` (`customer`, `dead_at`, `id`))"
        ));
        assert!(compile(Table::new("x")).fifo.is_none());
    }

    #[test]
    fn completed_rows_kept() {
        let t = Table::new("jobs").keep_completed(Duration::from_secs(60));
        let sql = compile(t.clone());
        assert_eq!(
            sql.ack,
            "UPDATE `jobs` SET `dead_at` = UTC_TIMESTAMP(), `completed_at` = UTC_TIMESTAMP(), \
             `attempts` = `attempts` + 1 WHERE `id` = ?"
        );
        let lease = t.clone().lease(Duration::from_secs(30)).validate().unwrap();
        assert_eq!(
            ack_many_sql(&lease, 2),
            "UPDATE `jobs` SET `dead_at` = UTC_TIMESTAMP(), `completed_at` = UTC_TIMESTAMP(), \
             `locked_until` = NULL WHERE `id` IN (?, ?)"
        );
        let ddl = create_table(&t.validate().unwrap(), BYTE_EXACT[0]);
        assert!(
            ddl[0].contains("`completed_at` DATETIME NULL, INDEX `jobs_ready`"),
            "{}",
            ddl[0]
        );
        assert!(
            ddl[0].contains("INDEX `jobs_completed` (`completed_at`)"),
            "{}",
            ddl[0]
        );
    }

    #[test]
    fn dedup_holder_is_a_locking_read() {
        let sql = compile(Table::new("mails").dedup());
        assert_eq!(
            sql.dedup_holder,
            "SELECT `id` FROM `mails` WHERE `dedup_key` = ? LOCK IN SHARE MODE"
        );
    }

    #[test]
    fn dedup_ddl() {
        let spec = Table::new("mails").dedup().validate().unwrap();
        // Byte-exact keys: a binary NO PAD collation, in each flavor's spelling (MariaDB's
        // `utf8mb4_bin` still pads spaces; MySQL 8.0.17+ spells it `utf8mb4_0900_bin`).
        for (collation, ddl) in [
            (
                "utf8mb4_nopad_bin",
                create_table(&spec, "utf8mb4_nopad_bin"),
            ),
            ("utf8mb4_0900_bin", create_table(&spec, "utf8mb4_0900_bin")),
            ("utf8mb4_0900_bin", dialect().create_table(&spec)),
        ] {
            assert_eq!(
                ddl,
                [format!(
                    "CREATE TABLE IF NOT EXISTS `mails` (`id` BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY, \
                     `payload` LONGBLOB NOT NULL, `attempts` INT NOT NULL DEFAULT 0, \
                     `run_at` DATETIME NOT NULL DEFAULT CURRENT_TIMESTAMP, `dead_at` DATETIME NULL, \
                     `dead_reason` MEDIUMTEXT NULL, `last_error` MEDIUMTEXT NULL, \
                     `errors` INT NOT NULL DEFAULT 0, \
                     `created_at` DATETIME NULL DEFAULT CURRENT_TIMESTAMP, \
                     `dedup_key` VARCHAR(255) CHARACTER SET utf8mb4 COLLATE {collation} NULL, \
                     INDEX `mails_ready` (`dead_at`, `run_at`, `id`), UNIQUE KEY `mails_dedup` (`dedup_key`)) \
                     ENGINE=InnoDB DEFAULT CHARSET=utf8mb4"
                )]
            );
        }
        let sql = compile(Table::new("mails").dedup());
        assert_eq!(
            sql.insert_one,
            "INSERT INTO `mails` (`payload`, `run_at`, `dedup_key`, `created_at`) VALUES (?, ?, ?, UTC_TIMESTAMP())"
        );
    }

    #[test]
    fn compared_text_columns_and_their_conversion() {
        let spec = Table::new("orders")
            .text_column("note")
            .int_column("n")
            .group("customer")
            .fifo()
            .dedup()
            .lease(Duration::from_secs(30))
            .validate()
            .unwrap();
        let defs = column_defs(&spec, "utf8mb4_nopad_bin");
        let exact: Vec<&str> = defs
            .iter()
            .filter(|d| !d.collations.is_empty())
            .map(|d| d.name.as_str())
            .collect();
        // The columns the library compares: the dedup key and the group, not other text.
        assert_eq!(exact, ["dedup_key", "customer"]);
        assert!(defs
            .iter()
            .filter(|d| !d.collations.is_empty())
            .all(|d| d.collations == ["utf8mb4_nopad_bin", "utf8mb4_0900_bin"]));
        let note = defs.iter().find(|d| d.name == "note").unwrap();
        assert_eq!(
            note.ddl,
            "`note` VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin NULL"
        );
        let convert: Vec<_> = defs.iter().filter(|d| !d.collations.is_empty()).collect();
        assert_eq!(
            convert_columns(&spec, &convert),
            "ALTER TABLE `orders` MODIFY COLUMN `dedup_key` VARCHAR(255) CHARACTER SET utf8mb4 \
             COLLATE utf8mb4_nopad_bin NULL, MODIFY COLUMN `customer` VARCHAR(255) CHARACTER SET \
             utf8mb4 COLLATE utf8mb4_nopad_bin NULL"
        );
        // A group column of another type has no collation to keep.
        let ints = Table::new("o")
            .int_column("g")
            .group("g")
            .fifo()
            .validate()
            .unwrap();
        assert!(column_defs(&ints, "utf8mb4_0900_bin")
            .iter()
            .all(|d| d.collations.is_empty()));
        // The schema check reads each column's collation with its type.
        assert!(COLUMNS.contains("CONCAT(' collate ', collation_name)"));
    }

    /// The trace context column (`Table::traceparent`): last of the insert's columns, after the
    /// checkpoint in the claimed row, last of the job's lookup; `VARCHAR(255)` text in `CREATE
    /// TABLE` and added by `migrate` as a nullable column. Nothing for a table without it.
    #[test]
    fn traceparent_sql() {
        let spec = Table::new("jobs")
            .checkpoints()
            .traceparent()
            .lease(Duration::from_secs(30))
            .validate()
            .unwrap();
        let sql = compile(
            Table::new("jobs")
                .checkpoints()
                .traceparent()
                .lease(Duration::from_secs(30)),
        );
        assert_eq!(
            sql.insert_one,
            "INSERT INTO `jobs` (`payload`, `run_at`, `traceparent`, `created_at`) VALUES (?, ?, ?, UTC_TIMESTAMP())"
        );
        assert!(
            sql.claim.starts_with("SELECT `id`, `attempts`, `payload`, `checkpoint`, `traceparent`, `cancel_requested`, `run_at` FROM"),
            "{}",
            sql.claim
        );
        assert!(sql
            .job
            .contains("`created_at`, `checkpoint`, `traceparent` FROM"));
        let collation = BYTE_EXACT[0];
        let ddl = create_table(&spec, collation);
        assert!(
            ddl[0].contains(&format!(
                "`checkpoint` LONGBLOB NULL, `traceparent` VARCHAR(255) CHARACTER SET utf8mb4 COLLATE {collation} NULL, INDEX"
            )),
            "{}",
            ddl[0]
        );
        let d = column_defs(&spec, collation)
            .into_iter()
            .find(|d| d.name == "traceparent")
            .unwrap();
        assert_eq!(
            SYNTAX.add_column(&spec, &d),
            [format!("ALTER TABLE `jobs` ADD COLUMN `traceparent` VARCHAR(255) CHARACTER SET utf8mb4 COLLATE {collation} NULL")]
        );
        let plain = compile(Table::new("jobs"));
        assert!(!plain.insert_one.contains("traceparent") && !plain.claim.contains("traceparent"));
    }

    #[test]
    fn priority_ddl() {
        let spec = Table::new("jobs").priorities().validate().unwrap();
        let ddl = dialect().create_table(&spec);
        assert!(ddl[0].contains(
            "`priority` SMALLINT NOT NULL DEFAULT 0, INDEX `jobs_ready` (`dead_at`, `priority` DESC, `run_at`, `id`)"
        ));
        assert!(compile(Table::new("jobs").priorities())
            .claim
            .contains("ORDER BY `priority` DESC, `run_at`, `id` LIMIT ? FOR UPDATE SKIP LOCKED"));
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
                "SELECT `id`, `attempts`, `payload`, `run_at`, `dead_at`, `dead_reason`, `last_error`, `errors`, `locked_until`, NULL, `cancel_requested`, `created_at`, `k` FROM `jobs` WHERE `id` = ?",
                "SELECT `id`, `attempts`, `payload`, `run_at`, `dead_at`, `dead_reason`, `last_error`, `errors`, `locked_until`, NULL, `cancel_requested`, `created_at`, `k` FROM `jobs` WHERE `dead_at` IS NULL AND `locked_until` > ? AND `id` > ? ORDER BY `id` LIMIT ?",
                "DELETE FROM `jobs` WHERE `id` = ? AND (`locked_until` IS NULL OR `locked_until` <= ?)",
                "UPDATE `jobs` SET `cancel_requested` = 1 WHERE `id` = ? AND `dead_at` IS NULL AND `locked_until` > ?",
                "",
                "",
                "UPDATE `jobs` SET `run_at` = ?, `last_error` = COALESCE(?, `last_error`), `errors` = `errors` + ?, `dead_at` = CASE WHEN `cancel_requested` <> 0 THEN UTC_TIMESTAMP() ELSE `dead_at` END, `dead_reason` = CASE WHEN `cancel_requested` <> 0 THEN 'cancelled' ELSE `dead_reason` END, `locked_until` = NULL WHERE `id` = ? AND `locked_until` = ?",
            ],
            [
                "SELECT `id`, `attempts`, `payload`, `run_at`, `dead_at`, `dead_reason`, `last_error`, `errors`, NULL, NULL, `cancel_requested`, `created_at`, `k` FROM `pay` WHERE `id` = ?",
                "SELECT `id`, `attempts`, `payload`, `run_at`, `dead_at`, `dead_reason`, `last_error`, `errors`, NULL, NULL, `cancel_requested`, `created_at`, `k` FROM `pay` WHERE `dead_at` IS NULL AND `run_at` <= ? AND `id` > ? ORDER BY `id` LIMIT ?",
                "DELETE FROM `pay` WHERE `id` = ?",
                "UPDATE `pay` SET `cancel_requested` = 1 WHERE `id` = ? AND `dead_at` IS NULL",
                "",
                "",
                "UPDATE `pay` SET `run_at` = ?, `last_error` = COALESCE(?, `last_error`), `errors` = `errors` + ?, `dead_at` = CASE WHEN `cancel_requested` <> 0 THEN UTC_TIMESTAMP() ELSE `dead_at` END, `dead_reason` = CASE WHEN `cancel_requested` <> 0 THEN 'cancelled' ELSE `dead_reason` END WHERE `id` = ?",
            ],
            [
                "SELECT `id`, `attempts`, `payload`, `run_at`, `dead_at`, `dead_reason`, `last_error`, `errors`, NULL, `completed_at`, 0, `created_at`, `k` FROM `rows` WHERE `id` = ?",
                "SELECT `id`, `attempts`, `payload`, `run_at`, `dead_at`, `dead_reason`, `last_error`, `errors`, NULL, `completed_at`, 0, `created_at`, `k` FROM `rows` WHERE `dead_at` IS NULL AND `run_at` <= ? AND `id` > ? ORDER BY `id` LIMIT ?",
                "UPDATE `rows` SET `dead_at` = UTC_TIMESTAMP(), `completed_at` = UTC_TIMESTAMP(), `dead_reason` = 'cancelled' WHERE `id` = ? AND `completed_at` IS NULL",
                "",
                "SELECT `id` FROM `rows` WHERE `id` = ? FOR UPDATE",
                "SELECT `id` FROM `rows` WHERE `id` = ? FOR UPDATE SKIP LOCKED",
                "UPDATE `rows` SET `run_at` = ?, `last_error` = COALESCE(?, `last_error`), `errors` = `errors` + ?, `attempts` = `attempts` + 1 WHERE `id` = ?",
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
            "DELETE FROM `jobs` WHERE `id` = ?"
        );
        assert_eq!(
            compile(lease(Table::new("jobs"))).cancel_held,
            "DELETE FROM `jobs` WHERE `id` = ? AND `locked_until` = ?"
        );
        assert_eq!(
            compile(advisory(Table::new("jobs"))).cancel_held,
            "DELETE FROM `jobs` WHERE `id` = ?"
        );
        let now = "UTC_TIMESTAMP()";
        let set = format!("`dead_at` = {now}, `completed_at` = {now}, `dedup_key` = NULL");
        assert_eq!(
            compile(keep(Table::new("jobs"))).cancel_held,
            format!(
                "UPDATE `jobs` SET {set}, `dead_reason` = 'cancelled', `attempts` = `attempts` + 1 \
                 WHERE `id` = ?"
            )
        );
        assert_eq!(
            compile(keep(lease(Table::new("jobs")))).cancel_held,
            format!(
                "UPDATE `jobs` SET {set}, `locked_until` = NULL, `dead_reason` = 'cancelled' \
                 WHERE `id` = ? AND `locked_until` = ?"
            )
        );
        assert_eq!(
            compile(keep(advisory(Table::new("jobs")))).cancel_held,
            format!("UPDATE `jobs` SET {set}, `dead_reason` = 'cancelled' WHERE `id` = ?")
        );
    }

    /// An operator's filtered listing (`Broker::jobs_matching`): the page's conditions, then
    /// each filter's, each on a parameter of its own bound after the times; the error text
    /// searched byte for byte (MySQL 8 and MariaDB alike: a binary needle makes `LOCATE` compare bytes whatever the
    /// column's collation; the same text serves MySQL 8, which this machine cannot run).
    #[test]
    fn filtered_previews_add_their_conditions_in_order() {
        let spec = Table::new("jobs").text_column("k").validate().unwrap();
        let filter = [PageFilter::Equals("k"), PageFilter::ErrorContains];
        let (sql, nows) = SYNTAX.preview_page(&spec, 1, &filter).unwrap();
        assert_eq!(
            sql,
            "SELECT LENGTH(`payload`), `id`, `attempts`, SUBSTR(`payload`, 1, ?), `run_at`, `dead_at`, `dead_reason`, `last_error`, `errors`, NULL, NULL, 0, `created_at`, `k` FROM `jobs` WHERE `dead_at` IS NULL AND `run_at` <= ? AND `k` = ? AND LOCATE(CAST(? AS BINARY), `last_error`) > 0 AND `id` > ? ORDER BY `id` LIMIT ?"
        );
        assert_eq!(nows, 1);
        assert_eq!(
            SYNTAX.preview_page(&spec, 4, &filter),
            None,
            "no completed rows kept"
        );
        assert_eq!(
            SYNTAX.preview_page(&spec, 1, &[]).unwrap().0,
            compile(Table::new("jobs").text_column("k")).jobs_preview[1]
                .as_ref()
                .unwrap()
                .0,
            "without a filter, the table's own statement"
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
            "SELECT LENGTH(`payload`), `id`, `attempts`, SUBSTR(`payload`, 1, ?), `run_at`, `dead_at`, `dead_reason`, `last_error`, `errors`, NULL, NULL, 0, `created_at`, `k` FROM `jobs` WHERE `dead_at` IS NULL AND `run_at` <= ? AND `id` > ? ORDER BY `id` LIMIT ?"
        );
        assert_eq!(ready.1, 1);
        let dead = &sql.jobs_preview[3].as_ref().unwrap().0;
        assert_eq!(
            dead,
            "SELECT LENGTH(`payload`), `id`, `attempts`, SUBSTR(`payload`, 1, ?), `run_at`, `dead_at`, `dead_reason`, `last_error`, `errors`, NULL, NULL, 0, `created_at`, `k` FROM `jobs` FORCE INDEX (`jobs_ready`) WHERE `dead_at` IS NOT NULL AND `id` > ? ORDER BY `id` LIMIT ?"
        );
        for page in sql.jobs_preview.iter().flatten() {
            assert!(!page.0.contains("FOR UPDATE"), "{}", page.0);
            assert_eq!(page.0.matches("`payload`").count(), 2, "{}", page.0);
        }
        assert!(sql.jobs_preview[4].is_none(), "no completed rows kept");
    }

    /// `testing::drain_all`'s statements: the jobs scheduled for later (not a waiting job, due
    /// at the latest time; lease: not leased; row lock: not locked by a delivery), each moved
    /// to now if it still qualifies.
    #[test]
    fn drain_all_statements() {
        let row_lock = compile(Table::new("jobs"));
        assert_eq!(
            row_lock.due_later,
            "SELECT `id` FROM `jobs` WHERE `dead_at` IS NULL AND `run_at` > ? AND `run_at` < ? ORDER BY `id` \
             FOR UPDATE SKIP LOCKED"
        );
        assert_eq!(
            row_lock.make_due,
            "UPDATE `jobs` SET `run_at` = ? WHERE `id` = ? AND `dead_at` IS NULL AND `run_at` > ? AND `run_at` < ?"
        );
        let lease = compile(Table::new("jobs").lease(Duration::from_secs(30)));
        assert_eq!(
            lease.due_later,
            "SELECT `id` FROM `jobs` WHERE `dead_at` IS NULL AND `run_at` > ? AND `run_at` < ? AND \
             (`locked_until` IS NULL OR `locked_until` <= ?) ORDER BY `id`"
        );
        assert_eq!(
            lease.make_due,
            "UPDATE `jobs` SET `run_at` = ? WHERE `id` = ? AND `dead_at` IS NULL AND `run_at` > ? AND `run_at` < ? \
             AND (`locked_until` IS NULL OR `locked_until` <= ?)"
        );
        let advisory = compile(Table::new("jobs").text_column("k").advisory_lock("k-{k}"));
        assert_eq!(
            advisory.due_later,
            "SELECT `id` FROM `jobs` WHERE `dead_at` IS NULL AND `run_at` > ? AND `run_at` < ? ORDER BY `id`"
        );
        assert_eq!(advisory.make_due, row_lock.make_due);
    }
}
