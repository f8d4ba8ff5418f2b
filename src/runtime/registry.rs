//! Self-describing tables: the registry table `sqlbroker_tables` holds, per queue table, the
//! description its creation or migration was given (as JSON, with a format version) and its
//! pause flag. Here is how the record is read, checked and written, on a connection and a
//! dialect; the operator's calls over it (open a table by name, list, pause) sit above.
//!
//! - Every use of a table but its creation and migration (publish, subscriptions, stats, dead
//!   letters) is checked against the record once per broker and description (the broker's
//!   per-table cache): a description that disagrees is refused with [`BrokerError::Schema`]
//!   naming each difference, so two descriptions of one table never run one row twice. A table
//!   with no record (made from `Table::ddl` by a tool that skipped the record, by an earlier
//!   release, or whose record was deleted) is checked against its columns (a `locked_until`
//!   column means a lease table, a `cancel_requested` column without it an advisory lock
//!   table), then given the description as its record, so the first description used is the
//!   one kept. Every first record is written only where the row read is still as read (an
//!   insert where there is none, an update of a dropped table's record that matches it
//!   exactly), then read back: of brokers recording at once, exactly one description wins.
//! - A pause or resume sets the flag; subscriptions read it at most once per poll interval
//!   ([`PauseFlag`](crate::runtime::wake::PauseFlag)), and PostgreSQL tells other brokers at
//!   once on the table's notification channel.

use std::sync::atomic::Ordering;
use std::time::SystemTime;

use crate::dialect::{DbConn, Dialect};
use crate::error::{BrokerError, DbError, DbErrorKind, Result};
use crate::model::table::{record::FORMAT, Form, Table};
use crate::model::value::Value;
use crate::runtime::Queue;

/// The registry table's name.
pub(crate) const REGISTRY_TABLE: &str = "sqlbroker_tables";

/// A table's row in the registry.
struct Row {
    format: i64,
    description: String,
    paused: bool,
    /// As read (the stale-record replacement matches it exactly); `Null` where not read.
    updated_at: Value,
}

/// True if the registry table exists (a read of it failed: was it missing?).
fn exists(dialect: &dyn Dialect, conn: &mut dyn DbConn) -> Result<bool, DbError> {
    let name = [Value::Text(REGISTRY_TABLE.into())];
    Ok(!conn.query(dialect.columns_query(), &name)?.is_empty())
}

/// Runs a read of the registry; a registry that does not exist reads as no rows.
fn read_rows(
    dialect: &dyn Dialect,
    conn: &mut dyn DbConn,
    sql: &str,
    params: &[Value],
) -> Result<Vec<Vec<Value>>, DbError> {
    match conn.query(sql, params) {
        Ok(rows) => Ok(rows),
        Err(e) => match exists(dialect, conn) {
            Ok(false) => Ok(Vec::new()),
            _ => Err(e),
        },
    }
}

fn flag(v: Option<&Value>) -> bool {
    v.and_then(Value::as_i64).unwrap_or(0) != 0
}

fn read(dialect: &dyn Dialect, conn: &mut dyn DbConn, name: &str) -> Result<Option<Row>, DbError> {
    let sql = dialect.registry().read;
    let rows = read_rows(dialect, conn, sql, &[Value::Text(name.into())])?;
    Ok(rows.into_iter().next().map(|r| Row {
        format: r.first().and_then(Value::as_i64).unwrap_or(0),
        description: match r.get(1) {
            Some(Value::Text(s)) => s.clone(),
            Some(Value::Bytes(b)) => String::from_utf8_lossy(b).into_owned(),
            _ => String::new(),
        },
        paused: flag(r.get(2)),
        updated_at: r.get(3).cloned().unwrap_or(Value::Null),
    }))
}

/// The table's pause flag in the registry (false with no record): a subscription's check.
pub(crate) fn read_paused(q: &Queue, conn: &mut dyn DbConn) -> Result<bool, DbError> {
    read_pause_and_record(q, conn).map(|(paused, _)| paused)
}

/// The table's pause flag and its record's text (empty with no record).
pub(crate) fn read_pause_and_record(
    q: &Queue,
    conn: &mut dyn DbConn,
) -> Result<(bool, String), DbError> {
    let sql = q.dialect.registry().paused;
    let rows = read_rows(&*q.dialect, conn, sql, &[Value::Text(q.spec.name.clone())])?;
    let row = rows.first();
    let text = match row.and_then(|r| r.get(1)) {
        Some(Value::Text(s)) => s.clone(),
        Some(Value::Bytes(b)) => String::from_utf8_lossy(b).into_owned(),
        _ => String::new(),
    };
    Ok((flag(row.and_then(|r| r.first())), text))
}

/// What the table's record (`text`, read now) holds that this broker's description does not
/// enforce: a limit, a rate window, a fair key, FIFO groups or dependencies a `migrate` added
/// (or another form) while this broker ran with its description. Empty if the text is the one
/// checked last, or holds nothing it leaves out. A subscription that finds something closes
/// with [`BrokerError::Schema`]: run on, it would claim past the limits the table now has.
/// (Maxes an operator sets are followed by every claim, and a limit the record no longer
/// holds is only enforced more strictly here: neither counts.)
pub(crate) fn unenforced(q: &Queue, text: &str) -> Vec<String> {
    {
        let mut seen = q.record_seen.lock();
        if seen.as_deref() == Some(text) || text.is_empty() {
            return Vec::new();
        }
        *seen = Some(text.to_string());
    }
    let Ok(recorded) =
        Table::from_record(text).and_then(|t| t.validate().map_err(|e| e.to_string()))
    else {
        return Vec::new();
    };
    q.spec.unenforced(&recorded)
}

/// The description a row holds, or [`BrokerError::Schema`] for a record this release cannot
/// read (a newer format, or not its JSON).
fn described(name: &str, row: &Row) -> Result<Table> {
    let bad = |problem: String| BrokerError::Schema {
        table: name.to_string(),
        problems: vec![problem],
    };
    if row.format > FORMAT {
        return Err(bad(format!(
            "the table's record was written by a newer sqlbroker (record format {}; this \
             release reads format {FORMAT} and older): upgrade sqlbroker",
            row.format
        )));
    }
    let table = Table::from_record(&row.description).map_err(|e| bad(format!("record: {e}")))?;
    if table.name() != name {
        return Err(bad(format!(
            "the record describes table {:?}",
            table.name()
        )));
    }
    Ok(table)
}

/// Checks `table` against its record, then its columns against the description: a table made
/// by an earlier release, or by the application's own migrations, that lacks a column is
/// refused by every use alike, naming it, on every database, rather than at the first
/// statement that needs it. On success the queue remembers it (no more checks for this
/// description on this broker).
///
/// A table with no record (made from [`Table::ddl`] by a tool that skipped the record, by an
/// earlier release, or whose record was deleted) is checked against what its columns say of
/// its form, then **given this description as its record** ([`adopt`]): the first description
/// used is the one every other broker is held to, so two descriptions of one table never run
/// one row twice. `may_make_registry`: the broker may create the registry table (it manages
/// the schema); without it a missing registry is refused with what to apply.
pub(crate) fn verify(q: &Queue, table: &Table, may_make_registry: bool) -> Result<()> {
    let mut conn = q.conn("table check")?;
    let found = read(&*q.dialect, &mut *conn, &q.spec.name).map_err(q.err("table check"))?;
    let problems = match found {
        Some(row) => table.differences(&described(&q.spec.name, &row)?),
        None => match unrecorded(q, &mut *conn, table)? {
            // No table yet: passes unremembered, and the statements report it (a publish
            // as "the table does not exist", a pause as an unknown table).
            None => return Ok(()),
            Some(problems) if !problems.is_empty() => problems,
            Some(_) => {
                // Columns first: a table that cannot run this description is not given it.
                q.check_schema(&mut *conn)?;
                adopt(q, &mut *conn, table, None, may_make_registry)?
            }
        },
    };
    refuse(q, problems)?;
    q.check_schema(&mut *conn)?;
    q.described.store(true, Ordering::Release);
    Ok(())
}

fn refuse(q: &Queue, problems: Vec<String>) -> Result<()> {
    if problems.is_empty() {
        return Ok(());
    }
    Err(BrokerError::Schema {
        table: q.spec.name.clone(),
        problems,
    })
}

/// Records `table` as the description of its table, which has none (`stale`: `None`), or
/// whose record was left by a dropped table of that name (`stale`: that record, as read
/// before the table was found missing), then reads the record back: the problems of `table`
/// against whichever description won. Every writer of a first record goes through here, and
/// the write succeeds only where the row read is still there unchanged (an insert where there
/// is none, an update matching the stale row's text and time), so of any number of brokers
/// recording at once exactly one description is kept and the others are told the
/// differences.
fn adopt(
    q: &Queue,
    conn: &mut dyn DbConn,
    table: &Table,
    stale: Option<&Row>,
    may_make_registry: bool,
) -> Result<Vec<String>> {
    let registry = q.dialect.registry();
    let now = SystemTime::now();
    let write = |conn: &mut dyn DbConn| -> Result<u64, DbError> {
        match stale {
            None => conn.execute(
                registry.insert_new,
                &[
                    Value::Text(q.spec.name.clone()),
                    Value::Int(table.record_format()),
                    Value::Text(table.to_record()),
                    Value::Time(now),
                ],
            ),
            Some(row) => {
                // A later time than the stale row's, so a replacement never leaves the very
                // row another creator's update still matches (whole seconds on MySQL and
                // SQLite).
                let at = match row.updated_at.as_time() {
                    Some(t) => now.max(t + std::time::Duration::from_secs(1)),
                    None => now,
                };
                conn.execute(
                    registry.replace_stale,
                    &[
                        Value::Int(table.record_format()),
                        Value::Text(table.to_record()),
                        Value::Time(at),
                        Value::Text(q.spec.name.clone()),
                        Value::Text(row.description.clone()),
                        row.updated_at.clone(),
                    ],
                )
            }
        }
    };
    let written = match write(conn) {
        Ok(n) => n,
        Err(e) => match exists(&*q.dialect, conn) {
            Ok(false) if may_make_registry => {
                ensure(q, conn).map_err(q.err("record table"))?;
                write(conn).map_err(q.err("record table"))?
            }
            Ok(false) => {
                return Err(BrokerError::Schema {
                    table: q.spec.name.clone(),
                    problems: vec![format!(
                        "the table has no record, and there is no registry table {REGISTRY_TABLE} \
                         to give it one: apply the record statements of Table::ddl (or \
                         Broker::migration_sql) with your migration tool"
                    )],
                })
            }
            _ => return Err(q.err("record table")(e)),
        },
    };
    let found = read(&*q.dialect, conn, &q.spec.name).map_err(q.err("table check"))?;
    let Some(row) = found else {
        // Recorded and gone at once: a record deleted by hand meanwhile.
        return Ok(vec![
            "the table's record was deleted while it was being written: try again".into(),
        ]);
    };
    let recorded = described(&q.spec.name, &row)?;
    let problems = table.differences(&recorded);
    if written == 0 && !problems.is_empty() {
        log::info!(
            "table {}: another broker recorded its description first",
            q.spec.name
        );
    }
    Ok(problems)
}

/// The problems of `table` as the description of a table with no record, by its columns: a
/// `locked_until` column means a lease table, a `cancel_requested` column without one an
/// advisory lock table; `None` if the table does not exist.
fn unrecorded(q: &Queue, conn: &mut dyn DbConn, table: &Table) -> Result<Option<Vec<String>>> {
    let columns = q.columns(conn)?;
    if columns.is_empty() {
        return Ok(None);
    }
    let has = |name: &str| columns.iter().any(|(c, _)| c == name);
    let leased = table.locked_until_column();
    let marked = table.cancel_requested_column();
    let made_as = if has(&leased) {
        Some((Form::Lease, leased))
    } else if has(&marked) {
        Some((Form::AdvisoryLock, marked))
    } else {
        None
    };
    Ok(Some(match made_as {
        Some((form, column)) if form != q.spec.form => vec![format!(
            "the table has no record, and its {column} column makes it {} {} table, \
             described as {}",
            if form == Form::Lease { "a" } else { "an" },
            form.name(),
            q.spec.form.name()
        )],
        _ => Vec::new(),
    }))
}

/// The problems of `table` against its record, read on `conn` inside a caller's own
/// transaction (the transactional publishes): `None` if there is nothing to check against (no
/// registry, or no record: nothing is written inside the caller's transaction, so such a
/// table is checked again at the next publish). The registry's existence is asked first, so
/// a missing registry never aborts the caller's transaction (PostgreSQL).
pub(crate) fn problems_in_transaction(
    dialect: &dyn Dialect,
    conn: &mut dyn DbConn,
    table: &Table,
) -> Result<Option<Vec<String>>> {
    let name = table.name();
    let during = |e: DbError| e.during("table check", name);
    if !exists(dialect, conn).map_err(during)? {
        return Ok(None);
    }
    let Some(row) = read(dialect, conn, name).map_err(during)? else {
        return Ok(None);
    };
    Ok(Some(table.differences(&described(name, &row)?)))
}

/// Refuses a migration that would change the table's form: against its record, or, with
/// none, its columns. Another form's description of a table with rows in work would run
/// them twice; a form is chosen when a table is made.
pub(crate) fn check_migration(q: &Queue, table: &Table) -> Result<()> {
    let mut conn = q.conn("migrate")?;
    let found = read(&*q.dialect, &mut *conn, &q.spec.name).map_err(q.err("migrate"))?;
    let problems = match found {
        Some(row) => {
            let recorded = described(&q.spec.name, &row)?;
            if recorded.form() == table.form() {
                return Ok(());
            }
            vec![format!(
                "recorded as {}, described as {}: migrate does not change a table's form \
                 ({CHANGE_FORM})",
                recorded.form_words(),
                table.form_words()
            )]
        }
        None => unrecorded(q, &mut *conn, table)?.unwrap_or_default(),
    };
    if problems.is_empty() {
        return Ok(());
    }
    Err(BrokerError::Schema {
        table: q.spec.name.clone(),
        problems,
    })
}

/// How out of a refused change of form.
const CHANGE_FORM: &str = "to change it, create a table of another name with the new \
                           description and move the work there, or drop this one once it is \
                           empty and create it again";

/// True if `table` is, exactly, its table's recorded description (a dry-run migration then
/// has no record to write).
pub(crate) fn is_recorded(q: &Queue, table: &Table) -> Result<bool> {
    let mut conn = q.conn("table check")?;
    let found = read(&*q.dialect, &mut *conn, &q.spec.name).map_err(q.err("table check"))?;
    match found {
        Some(row) => Ok(described(&q.spec.name, &row)? == *table),
        None => Ok(false),
    }
}

/// Makes the registry if it is not there. Two brokers making it at once may collide on
/// PostgreSQL (`CREATE TABLE IF NOT EXISTS` is not atomic there): then it is there.
fn ensure(q: &Queue, conn: &mut dyn DbConn) -> Result<(), DbError> {
    match conn.batch(q.dialect.registry().create) {
        Ok(()) => Ok(()),
        Err(e) => match exists(&*q.dialect, conn) {
            Ok(true) => Ok(()),
            _ => Err(e),
        },
    }
}

/// Records `table` as the description of its table (`migrate`), replacing the record it had;
/// the pause flag is kept, and so are the concurrency limits' slot spaces (rows in work under
/// the maxes the old record held may hold slots the new maxes do not reach:
/// [`with_slots_kept`](crate::model::table::record::with_slots_kept)). The old record is read
/// first and replaced only as read (read again if another writer came first).
pub(crate) fn record(q: &Queue, table: &Table) -> Result<()> {
    use crate::model::table::record::with_slots_kept;
    let text = table.to_record();
    let mut written = false;
    for _ in 0..10 {
        let old = q.retrying("record table", |conn| {
            ensure(q, conn)?;
            read(&*q.dialect, conn, &q.spec.name)
        })?;
        let Some(old) = old else {
            // No record: the upsert makes one (or, should one appear meanwhile, replaces it:
            // a record written by a broker that found none, with no operator's settings).
            let params = [
                Value::Text(q.spec.name.clone()),
                Value::Int(table.record_format()),
                Value::Text(text.clone()),
                Value::Time(SystemTime::now()),
            ];
            let upsert = q.dialect.registry().upsert;
            q.retrying("record table", |conn| {
                conn.execute(upsert, &params).map(drop)
            })?;
            written = true;
            break;
        };
        let now = SystemTime::now();
        let at = match old.updated_at.as_time() {
            Some(t) => now.max(t + std::time::Duration::from_secs(1)),
            None => now,
        };
        let params = [
            Value::Int(table.record_format()),
            Value::Text(with_slots_kept(&old.description, &text)),
            Value::Time(at),
            Value::Text(q.spec.name.clone()),
            Value::Text(old.description.clone()),
            old.updated_at.clone(),
        ];
        let sql = q.dialect.registry().replace_stale;
        if q.retrying("record table", |conn| conn.execute(sql, &params))? > 0 {
            written = true;
            break;
        }
    }
    if !written {
        return Err(q.err("record table")(DbError::new(
            DbErrorKind::Transient,
            "the record kept changing under ten tries",
        )));
    }
    q.described.store(true, Ordering::Release);
    Ok(())
}

/// What `create_table` read of the registry before it looked for the table: the record a
/// table of that name has, if any. Read first, so that a record found while the table is
/// missing is known to be a dropped table's: every writer of a first record writes it only
/// once the table exists.
pub(crate) struct BeforeCreate(Option<Row>);

/// Makes the registry if it is missing and reads the table's record (`create_table`, before
/// it looks for the table).
pub(crate) fn before_create(q: &Queue) -> Result<BeforeCreate> {
    q.retrying("record table", |conn| {
        ensure(q, conn)?;
        read(&*q.dialect, conn, &q.spec.name)
    })
    .map(BeforeCreate)
}

/// Records `table` as the description of the table `create_table` just made (it was missing
/// when looked for after `before`): its first record, or in place of a dropped table's. If
/// another broker made the table at the same moment with another description and recorded it
/// first, [`BrokerError::Schema`] names the differences, and this broker does not use it.
pub(crate) fn record_created(q: &Queue, table: &Table, before: BeforeCreate) -> Result<()> {
    let mut conn = q.conn("record table")?;
    let problems = adopt(q, &mut *conn, table, before.0.as_ref(), true)?;
    refuse(q, problems)?;
    q.described.store(true, Ordering::Release);
    Ok(())
}

/// The description recorded for table `name` (see [`described`]); `None` without a record.
pub(crate) fn open(
    dialect: &dyn Dialect,
    conn: &mut dyn DbConn,
    name: &str,
) -> Result<Option<Table>> {
    let row = read(dialect, conn, name).map_err(|e| e.during("open table", name))?;
    row.map(|row| described(name, &row)).transpose()
}

/// Every record, by name: its description and pause flag. Records this release cannot read
/// are left out, with a warning in the log.
pub(crate) fn list(dialect: &dyn Dialect, conn: &mut dyn DbConn) -> Result<Vec<(Table, bool)>> {
    let sql = dialect.registry().list;
    let rows = read_rows(dialect, conn, sql, &[]).map_err(|e| e.during("list tables", ""))?;
    let mut out = Vec::new();
    for r in rows {
        let Some(name) = r.first().and_then(|v| v.as_str()).map(str::to_owned) else {
            continue;
        };
        let row = Row {
            format: r.get(1).and_then(Value::as_i64).unwrap_or(0),
            description: r.get(2).and_then(|v| v.as_str()).unwrap_or("").to_owned(),
            paused: flag(r.get(3)),
            updated_at: Value::Null,
        };
        match described(&name, &row) {
            Ok(table) => out.push((table, row.paused)),
            Err(e) => log::warn!("{e}"),
        }
    }
    Ok(out)
}

/// Sets the table's pause flag in its record, then tells this broker's claimers at once and
/// other brokers through the change feed (PostgreSQL); [`BrokerError::UnknownTable`] without
/// a record.
pub(crate) fn set_paused(q: &Queue, paused: bool) -> Result<()> {
    let sql = q.dialect.registry().set_paused;
    let params = [
        Value::Int(paused.into()),
        Value::Time(SystemTime::now()),
        Value::Text(q.spec.name.clone()),
    ];
    let op = if paused { "pause" } else { "resume" };
    let changed = q.retrying(op, |conn| match conn.execute(sql, &params) {
        Ok(n) => Ok(n),
        // No registry at all: no record either.
        Err(e) => match exists(&*q.dialect, conn) {
            Ok(false) => Ok(0),
            _ => Err(e),
        },
    })?;
    if changed == 0 {
        return Err(BrokerError::UnknownTable {
            table: q.spec.name.clone(),
        });
    }
    q.wake.pause.own(paused);
    announce(q, op);
    Ok(())
}

/// After a pause or a resume (of the table or of one of its queues): wakes this broker's
/// claimers at once and other brokers through the change feed (PostgreSQL); a notification
/// lost here is made up by their poll.
pub(crate) fn announce(q: &Queue, op: &'static str) {
    q.wake.notify_all();
    if let Err(e) = q
        .conn(op)
        .and_then(|mut c| q.dialect.announce_pause(&mut *c, &q.sql).map_err(q.err(op)))
    {
        log::warn!(
            "table {}: telling other brokers of the {op}: {e}",
            q.spec.name
        );
    }
}

/// Records an operator's setting of the concurrency limit `key` of the table (`None`: lifted)
/// in its record, which every claim of the table reads: followed by each broker's next claim.
/// The record is rewritten only where it is still the one read (a compare and swap on its
/// text and time), and read again if another writer came first.
///
/// Modelled in model/limits.pml (change).
pub(crate) fn set_limit(q: &Queue, key: &str, max: Option<u32>) -> Result<()> {
    use crate::model::table::{check_concurrency, record::with_limit_set};
    let bad = |reason: String| BrokerError::InvalidOption {
        option: "set_concurrency_limit",
        reason,
    };
    if let Some(m) = max {
        check_concurrency(m).map_err(bad)?;
    }
    set_in_record(q, |text| with_limit_set(text, key, max).map_err(bad))
}

/// Records an operator's setting of the rate limit `key` of the table, the one of window
/// `per` where given (a key with two windows must name one; `None`: lifted), as [`set_limit`]
/// does.
pub(crate) fn set_rate(
    q: &Queue,
    key: &str,
    per: Option<std::time::Duration>,
    max: Option<u32>,
) -> Result<()> {
    use crate::model::table::{check_rate, record::with_rate_set};
    let bad = |reason: String| BrokerError::InvalidOption {
        option: if per.is_some() {
            "set_rate_window"
        } else {
            "set_rate_limit"
        },
        reason,
    };
    if let Some(m) = max {
        check_rate(m).map_err(bad)?;
    }
    set_in_record(q, |text| with_rate_set(text, key, per, max).map_err(bad))
}

/// Rewrites the table's record as `change` makes it from its text, where it is still the one
/// read (a compare and swap on its text and time; read again if another writer came first),
/// and wakes this broker's claimers.
fn set_in_record(q: &Queue, change: impl Fn(&str) -> Result<String>) -> Result<()> {
    for _ in 0..10 {
        let Some(row) = q.retrying("set limit", |conn| read(&*q.dialect, conn, &q.spec.name))?
        else {
            return Err(BrokerError::UnknownTable {
                table: q.spec.name.clone(),
            });
        };
        // A record this release cannot read is refused, not rewritten.
        let _ = described(&q.spec.name, &row)?;
        let text = change(&row.description)?;
        // A later time than the row's, as `adopt` writes: whole seconds on MySQL and SQLite.
        let now = SystemTime::now();
        let at = match row.updated_at.as_time() {
            Some(t) => now.max(t + std::time::Duration::from_secs(1)),
            None => now,
        };
        let params = [
            Value::Int(row.format.max(FORMAT)),
            Value::Text(text),
            Value::Time(at),
            Value::Text(q.spec.name.clone()),
            Value::Text(row.description.clone()),
            row.updated_at.clone(),
        ];
        let sql = q.dialect.registry().replace_stale;
        if q.retrying("set limit", |conn| conn.execute(sql, &params))? > 0 {
            q.wake.notify_all();
            return Ok(());
        }
    }
    Err(q.err("set limit")(DbError::new(
        DbErrorKind::Transient,
        "the record kept changing under ten tries",
    )))
}

/// The table's pause flag as recorded (false with no record), for stats.
pub(crate) fn recorded_pause(q: &Queue) -> Result<bool> {
    q.retrying("stats", |conn| read_paused(q, conn))
}
