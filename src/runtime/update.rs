//! A job changed in place while no one works it: what [`Broker::update`](crate::Broker::update)
//! and a publish that replaces a waiting job ([`Message::replace_waiting`](crate::Message::replace_waiting))
//! share, one floor below both. "Not in work" is decided by the database in the same step as
//! the change, per form: the lease form in the update's own condition (no lease in force), the
//! row lock form by taking the row `FOR UPDATE SKIP LOCKED` in the update's transaction, the
//! advisory form by running the update under the row's key, taken without waiting. So a claim
//! racing the update either takes the row before it (the update changes nothing) or after it
//! (the claim reads the whole new row): never a half-updated job, never a job in work changed.
//!
//! Also the advisory key helpers the operator's calls share ([`with_key`], [`under_xact_key`]).

use std::time::SystemTime;

use crate::dialect::keys::{KeySql, SessionKeys};
use crate::dialect::shared::UpdateFields;
use crate::dialect::DbConn;
use crate::error::{DbError, Result};
use crate::model::schedule::claim_now;
use crate::model::table::Form;
use crate::model::value::Value;
use crate::runtime::{retrying_deadlocks, Queue};

/// What an update in place writes, checked already: the payload, user columns by index, the
/// priority, the due time (whole seconds).
#[derive(Debug, Clone, Default)]
pub(crate) struct Changes {
    pub payload: Option<Vec<u8>>,
    pub columns: Vec<(usize, Value)>,
    pub priority: Option<i16>,
    pub run_at: Option<SystemTime>,
}

impl Changes {
    /// True if it changes nothing.
    pub fn is_empty(&self) -> bool {
        self.payload.is_none()
            && self.columns.is_empty()
            && self.priority.is_none()
            && self.run_at.is_none()
    }

    fn fields(&self) -> UpdateFields {
        UpdateFields {
            payload: self.payload.is_some(),
            columns: self.columns.iter().map(|(i, _)| *i).collect(),
            priority: self.priority.is_some(),
            run_at: self.run_at.is_some(),
        }
    }

    /// The statement's parameters ([`Syntax::update_job`](crate::dialect::shared::Syntax)'s
    /// order).
    fn params(&self, q: &Queue, id: i64, now: SystemTime) -> Vec<Value> {
        let mut out = Vec::new();
        if let Some(p) = &self.payload {
            out.push(Value::Bytes(p.clone()));
        }
        out.extend(self.columns.iter().map(|(_, v)| v.clone()));
        if let Some(p) = self.priority {
            out.push(Value::Int(p.into()));
        }
        if let Some(t) = self.run_at {
            if q.spec.dependencies {
                out.push(Value::Time(crate::runtime::deps::waiting_due()));
            }
            out.push(Value::Time(t));
        }
        out.push(Value::Int(id));
        if q.spec.form == Form::Lease {
            out.push(Value::Time(now));
        }
        out
    }
}

/// What reads user column `i` to decide who may hold a row at once (the advisory key, a
/// concurrency or rate limit, a fair key, the FIFO group), if anything does: such a column
/// is never changed in place. A claim may have read the row before the change and take it
/// under the old key while another takes it under the new one; a row moved into a FIFO group
/// could become its head beside a row of the group in work.
pub(crate) fn keyed_column(spec: &crate::model::table::TableSpec, i: usize) -> Option<String> {
    if spec.required_columns().any(|c| c == i) {
        return Some(spec.reader_of(i));
    }
    (spec.group == Some(i)).then(|| "the FIFO group".to_string())
}

/// What an update in place came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Updated {
    /// Changed, whole.
    Done,
    /// The row is live but in work (leased, its row locked, its key held): unchanged.
    InWork,
    /// No live row has that id (dead, completed, acked, never there): unchanged.
    NotLive,
}

/// Applies `changes` to job `id` of `q`'s table on `conn` (not in a transaction) unless it is
/// in work or finished, deciding that in the database as the module says. Run again while the
/// database ends it as a deadlock's victim ([`retrying_deadlocks`]): MySQL/MariaDB may order
/// it and a claim, which lock the row's index entries in another order, into one, and then
/// rolls it back whole, so nothing of it was written.
pub(crate) fn apply(
    q: &Queue,
    conn: &mut dyn DbConn,
    id: i64,
    changes: &Changes,
) -> Result<Updated> {
    retrying_deadlocks(|| attempt(q, &mut *conn, id, changes))
}

/// One try of [`apply`].
fn attempt(q: &Queue, conn: &mut dyn DbConn, id: i64, changes: &Changes) -> Result<Updated> {
    let err = q.err("update");
    let now = claim_now(SystemTime::now());
    let sql = q.dialect.syntax().update_job(&q.spec, &changes.fields());
    let params = changes.params(q, id, now);
    let changed = match q.spec.form {
        Form::Lease => conn.execute(&sql, &params).map_err(&err)? > 0,
        Form::RowLock => {
            // Broken from `BEGIN` until the transaction ends: never pooled mid-transaction.
            conn.mark_broken();
            let run = |conn: &mut dyn DbConn| -> std::result::Result<Option<u64>, DbError> {
                conn.batch(&q.sql.begin_write)?;
                if conn.query(&q.sql.probe_lock, &[Value::Int(id)])?.is_empty() {
                    return Ok(None);
                }
                conn.execute(&sql, &params).map(Some)
            };
            match run(&mut *conn) {
                Ok(Some(n)) => {
                    // A failed commit leaves the connection marked broken: discarded.
                    conn.batch("COMMIT").map_err(&err)?;
                    conn.set_broken(false);
                    n > 0
                }
                // Locked by a delivery, or gone: told apart below.
                Ok(None) => {
                    conn.rollback_or_discard();
                    false
                }
                Err(e) => {
                    conn.rollback_or_discard();
                    return Err(err(e));
                }
            }
        }
        Form::AdvisoryLock => {
            let Some(template) = &q.spec.key else {
                return Ok(Updated::NotLive);
            };
            let Some(values) = live_values(q, conn, id)? else {
                return Ok(Updated::NotLive);
            };
            // The key columns are never changed in place (refused before any SQL), so the key
            // rendered now is the one a claim of this row takes.
            let key = template.render(&values);
            match with_key_on(q, conn, &key, |conn| conn.execute(&sql, &params)).map_err(&err)? {
                Some(n) => n > 0,
                None => return Ok(Updated::InWork),
            }
        }
    };
    if changed {
        return Ok(Updated::Done);
    }
    Ok(match live_values(q, conn, id)? {
        Some(_) => Updated::InWork,
        None => Updated::NotLive,
    })
}

/// The user columns' values of job `id` if it is live (not dead, not completed), as the
/// description types them.
fn live_values(q: &Queue, conn: &mut dyn DbConn, id: i64) -> Result<Option<Vec<Value>>> {
    let rows = conn
        .query(&q.sql.job, &[Value::Int(id)])
        .map_err(q.err("update"))?;
    let Some(row) = rows.into_iter().next() else {
        return Ok(None);
    };
    // `job`'s layout: dead_at is the fifth column, the user columns start at the thirteenth
    // ([`Syntax::job_columns`](crate::dialect::shared::Syntax::job_columns)).
    if !matches!(row.get(4), Some(Value::Null) | None) {
        return Ok(None);
    }
    let n = q.spec.columns.len();
    Ok(Some(q.spec.typed_values(row.into_iter().skip(12).take(n))))
}

/// Runs `f` holding `key` (servers: on a session of its own; SQLite: in the process's
/// registry) if it is free now; `None` if it is held.
///
/// Modelled in model/advisory.pml (cancel).
pub(crate) fn with_key<T>(
    q: &Queue,
    key: &str,
    f: impl Fn(&mut dyn DbConn) -> Result<T, DbError>,
) -> Result<Option<T>> {
    if q.dialect.process_keys().is_none() && q.held_here.is_held(key) {
        // One of this broker's deliveries has it: the server would refuse.
        return Ok(None);
    }
    let mut conn = q.conn("cancel")?;
    with_key_on(q, &mut *conn, key, f).map_err(q.err("cancel"))
}

/// [`with_key`] on `conn`, a pooled connection not in a transaction.
pub(crate) fn with_key_on<T>(
    q: &Queue,
    conn: &mut dyn DbConn,
    key: &str,
    f: impl Fn(&mut dyn DbConn) -> Result<T, DbError>,
) -> Result<Option<T>, DbError> {
    if let Some(registry) = q.dialect.process_keys() {
        let Some(_held) = registry.try_take(key) else {
            return Ok(None);
        };
        return f(conn).map(Some);
    }
    if q.held_here.is_held(key) {
        // One of this broker's deliveries has it: the server would refuse.
        return Ok(None);
    }
    let name = q.dialect.key_name(key);
    if let Some(xact) = q.dialect.key_xact_lock() {
        return under_xact_key(conn, xact, &name, &f);
    }
    let (Some(lock), Some(unlock)) = (q.sql.key_lock.as_deref(), q.sql.key_unlock.as_deref())
    else {
        return Ok(None);
    };
    let sql = KeySql { lock, unlock };
    let mut keys = SessionKeys::default();
    if !keys.lock(conn, &sql, &name)? {
        return Ok(None);
    }
    let out = f(conn);
    keys.unlock(conn, &sql, &name);
    out.map(Some)
}

/// Transaction pooling (PostgreSQL behind PgBouncer's `pool_mode=transaction`), where a
/// session lock could be taken on one server session and its unlock run on another, leaving
/// the key held for whichever client gets that session next: tries `name` with `xact` (a
/// transaction-scoped lock, [`Dialect::key_xact_lock`](crate::dialect::Dialect)) and runs `f`
/// under it, all in one transaction, so the key is let go with the transaction whatever
/// happens. `None` if the key is held elsewhere (nothing ran, rolled back); else `f`'s writes
/// commit.
pub(crate) fn under_xact_key<T>(
    conn: &mut dyn DbConn,
    xact: &str,
    name: &str,
    f: impl Fn(&mut dyn DbConn) -> Result<T, DbError>,
) -> Result<Option<T>, DbError> {
    // Broken from `BEGIN` until the transaction ends: never pooled mid-transaction.
    conn.mark_broken();
    let run = |conn: &mut dyn DbConn| -> Result<Option<T>, DbError> {
        conn.batch("BEGIN")?;
        let taken = conn.query(xact, &[Value::Text(name.to_string())])?;
        if !matches!(taken.first().and_then(|r| r.first()), Some(Value::Int(1))) {
            return Ok(None);
        }
        f(conn).map(Some)
    };
    match run(conn) {
        Ok(Some(out)) => {
            conn.batch("COMMIT")?;
            conn.set_broken(false);
            Ok(Some(out))
        }
        other => {
            conn.rollback_or_discard();
            other
        }
    }
}

// The statements' text on the servers (SQLite's update is the shared one).
#[cfg(all(test, any(feature = "postgres", feature = "mysql")))]
mod tests {
    use crate::dialect::shared::UpdateFields;
    use crate::model::table::Table;
    use std::time::Duration;

    /// The statement's text per form and database: the lease form's own "not leased"
    /// condition, a waiting job's due time kept, MySQL's `?` in the same order. Fails if the
    /// live-row or lease condition is dropped.
    #[test]
    fn update_statements() {
        let all = UpdateFields {
            payload: true,
            columns: vec![1],
            priority: true,
            run_at: true,
        };
        let lease = Table::new("jobs")
            .text_column("k")
            .int_column("n")
            .priorities()
            .lease(Duration::from_secs(30))
            .validate()
            .unwrap();
        let opts = crate::dialect::test_options();
        #[cfg(feature = "postgres")]
        {
            let pg = crate::dialect::open("postgres://u@h/d?sslmode=disable", &opts).unwrap();
            assert_eq!(
                pg.syntax().update_job(&lease, &all),
                format!(
                    "UPDATE \"jobs\" SET \"payload\" = $1, \"n\" = $2, \"priority\" = $3, \
                     \"run_at\" = $4, \"errors\" = \"errors\" + CASE WHEN \"locked_until\" IS NOT \
                     NULL THEN 1 ELSE 0 END, \"last_error\" = CASE WHEN \"locked_until\" IS NOT \
                     NULL THEN '{}' ELSE \"last_error\" END, \"locked_until\" = NULL WHERE \
                     \"id\" = $5 AND \"dead_at\" IS NULL AND (\"locked_until\" IS NULL OR \
                     \"locked_until\" <= $6)",
                    crate::error::LEASE_RAN_OUT
                )
            );
            let waits = Table::new("jobs").dependencies().validate().unwrap();
            let due = UpdateFields {
                run_at: true,
                ..Default::default()
            };
            assert_eq!(
                pg.syntax().update_job(&waits, &due),
                "UPDATE \"jobs\" SET \"run_at\" = CASE WHEN \"run_at\" = $1 THEN \"run_at\" \
                 ELSE $2 END WHERE \"id\" = $3 AND \"dead_at\" IS NULL"
            );
        }
        #[cfg(feature = "mysql")]
        {
            let my = crate::dialect::open("mysql://u@h/d", &opts).unwrap();
            assert_eq!(
                my.syntax().update_job(&lease, &all),
                format!(
                    "UPDATE `jobs` SET `payload` = ?, `n` = ?, `priority` = ?, `run_at` = ?, \
                     `errors` = `errors` + CASE WHEN `locked_until` IS NOT NULL THEN 1 ELSE 0 \
                     END, `last_error` = CASE WHEN `locked_until` IS NOT NULL THEN '{}' ELSE \
                     `last_error` END, `locked_until` = NULL WHERE `id` = ? AND `dead_at` IS \
                     NULL AND (`locked_until` IS NULL OR `locked_until` <= ?)",
                    crate::error::LEASE_RAN_OUT
                )
            );
            // A key's unique period: names and keys compared byte for byte.
            let u = my.syntax().unique_sql(&lease, my.database());
            assert_eq!(
                u.create,
                "CREATE TABLE IF NOT EXISTS sqlbroker_unique (table_name VARBINARY(64) NOT NULL, \
                 dedup_key VARBINARY(1020) NOT NULL, holder BIGINT NOT NULL, PRIMARY KEY \
                 (table_name, dedup_key))"
            );
            assert_eq!(
                u.sweep,
                "DELETE FROM sqlbroker_unique WHERE table_name = ? AND NOT EXISTS (SELECT 1 \
                 FROM `jobs` j WHERE j.`id` = sqlbroker_unique.holder)"
            );
        }
    }
}
