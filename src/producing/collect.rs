//! Publishing a collected event ([`Message::collect`]): it joins its key's job if that job
//! still collects, else it starts the next one, in one transaction that holds the key's row
//! in `sqlbroker_collect` and the job's row ([`crate::dialect::collect`]).

use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::dialect::collect::{CollectSql, SWEEP_ROWS};
use crate::dialect::DbConn;
use crate::error::{BrokerError, DbError, DbErrorKind, Result};
use crate::model::collect::{self, COLLECT_MAX_BYTES, COLLECT_MAX_EVENTS};
use crate::model::value::Value;
use crate::producing::message::Message;
use crate::producing::publish::{self, Target};
use crate::runtime::{retrying_deadlocks, Queue};

/// How long past its due time a key's row is kept before a sweep may delete it: clocks of
/// the brokers may differ by this much before a sweep deletes a row a publish still needs
/// (which would cost a burst split in two, never an event).
const SWEEP_AFTER_SECS: u64 = 60;

/// How often (seconds) a broker sweeps the keys' table while it publishes collected events.
const SWEEP_EVERY_SECS: u64 = 1;

/// The most sweeps of [`SWEEP_ROWS`] rows one publish runs (each following a full one).
const SWEEP_ROUNDS: usize = 10;

/// Publishes `message`, collected, on `q`'s table: the id of the job it went into.
pub(crate) fn publish(q: &Queue, message: Message) -> Result<i64> {
    let bad = |reason: String| BrokerError::InvalidMessage {
        table: q.spec.name.clone(),
        reason,
    };
    let Some(c) = message.collecting() else {
        return Err(bad("not a collected message".into()));
    };
    if let Some(why) = c.problem(message.payload().len()) {
        return Err(bad(why));
    }
    if !message.parents().is_empty() {
        return Err(bad(
            "a collected message waits on no other job (Message::after): its job is due as \
             its burst ends"
                .into(),
        ));
    }
    if message.delay() != Duration::ZERO || message.due().is_some() {
        return Err(bad(
            "a collected message takes no delay: its job is due as its burst ends".into(),
        ));
    }
    if message.dedup_value().is_some() {
        return Err(bad(
            "a collected message takes no dedup key: its key is the collect key".into(),
        ));
    }
    if message.unique_period().is_some() {
        return Err(bad(
            "a collected message takes no unique_for: its key is the collect key".into(),
        ));
    }
    if message.replaces() {
        return Err(bad(
            "a collected message replaces no job (Message::replace_waiting): it joins its \
             key's job"
                .into(),
        ));
    }
    if message.signal_wait() != (None, None) {
        return Err(bad(
            "a collected message waits for no signal (Message::after_signal, wait_timeout): \
             its job is due as its burst ends"
                .into(),
        ));
    }
    // Every event is checked as a first one is (its columns, priority, queue, kind, trace
    // context), whether it starts a job or joins one: refused or taken alike, whatever its
    // key's job is doing.
    message.clone().into_first_event(false).params_into(
        &q.spec,
        SystemTime::now(),
        &mut Vec::new(),
    )?;
    let sql = q
        .collects
        .sql
        .get_or_init(|| crate::dialect::collect::statements(&*q.dialect, &q.spec));
    let t = Target::of(q);
    let mut conn = q.conn("publish")?;
    if !q.collects.made.load(Ordering::Acquire) {
        create(sql, &mut *conn).map_err(|e| t.err(e))?;
        q.collects.made.store(true, Ordering::Release);
    }
    let run = |conn: &mut dyn DbConn| {
        retrying_deadlocks(|| {
            publish::in_own_transaction(&t, conn, |conn| join_or_start(&t, sql, conn, &message))
        })
    };
    let id = match run(&mut *conn) {
        Ok(id) => id,
        Err(e) if !keys_table_there(sql, &mut *conn) => {
            if q.collects.no_ddl {
                return Err(BrokerError::Schema {
                    table: crate::dialect::collect::COLLECT_TABLE.into(),
                    problems: vec![format!(
                        "missing (made by the migrations Database::library_ddl lists, or \
                         `sqlbroker library-schema`; this broker runs no DDL): {e}"
                    )],
                });
            }
            // Dropped by hand: made again, and the publish run once more.
            create(sql, &mut *conn).map_err(|e| t.err(e))?;
            run(&mut *conn).map_err(|e| q.explain_failure(&mut *conn, e))?
        }
        Err(e) => return Err(q.explain_failure(&mut *conn, e)),
    };
    sweep(q, sql, &mut *conn);
    Ok(id)
}

/// True unless the keys' table is surely missing: a read of it fails with neither a lost
/// connection nor a transient error.
fn keys_table_there(sql: &CollectSql, conn: &mut dyn DbConn) -> bool {
    match conn.query(&sql.exists, &[]) {
        Ok(_) => true,
        Err(e) => !matches!(e.kind, DbErrorKind::Other | DbErrorKind::Schema),
    }
}

/// Makes the keys' table (two brokers making it at once on PostgreSQL may meet in its
/// catalog: the second try finds it made).
fn create(sql: &CollectSql, conn: &mut dyn DbConn) -> std::result::Result<(), DbError> {
    let mut tried = false;
    loop {
        match sql.create.iter().try_for_each(|s| conn.batch(s)) {
            Err(_) if !tried => {
                tried = true;
                std::thread::sleep(Duration::from_millis(20));
            }
            done => return done,
        }
    }
}

/// In the publish's transaction: locks the key's row, appends the event to the key's job if
/// that job still collects, else starts the next job.
fn join_or_start(
    t: &Target<'_>,
    sql: &CollectSql,
    conn: &mut dyn DbConn,
    message: &Message,
) -> Result<i64> {
    let c = message.collecting().expect("a collected message");
    let now = SystemTime::now();
    let now_ms = epoch_ms(now);
    let key = [Value::Text(t.spec.name.clone()), Value::Text(c.key.clone())];
    let err = |e: DbError| t.err(e);
    conn.execute(&sql.key_lock, &key).map_err(err)?;
    let row = conn.query(&sql.key_read, &key).map_err(err)?;
    let (job, first_ms) = match row.first() {
        Some(r) => (
            r.first().and_then(Value::as_i64).unwrap_or(0),
            r.get(1).and_then(Value::as_i64).unwrap_or(0),
        ),
        None => (0, 0),
    };
    if job != 0 {
        let open = conn.query(&sql.open, &[Value::Int(job)]).map_err(err)?;
        if let Some(Value::Bytes(payload)) =
            open.into_iter().next().and_then(|r| r.into_iter().next())
        {
            // A payload that does not read as events (written by hand, or a job of a table
            // made again under the name that took a stale key's id) is left as it is: this
            // event starts the next job.
            let Some(events) = collect::count(&payload) else {
                return start(t, sql, conn, message, &key, now_ms);
            };
            let fits =
                collect::event_bytes(&payload) + 4 + message.payload().len() <= COLLECT_MAX_BYTES;
            if events < COLLECT_MAX_EVENTS && fits {
                let mut payload = payload;
                collect::push(&mut payload, message.payload());
                let due_ms = if events + 1 >= COLLECT_MAX_EVENTS || collect::full(&payload) {
                    // Full: due now (the database's second may be a little behind ours, so
                    // a second early, which a claim takes at once all the same).
                    now_ms.saturating_sub(1_000)
                } else {
                    add_ms(now_ms, c.quiet).min(add_ms(first_ms, c.max_wait))
                };
                let due = ceil_secs(due_ms);
                conn.execute(
                    &sql.append,
                    &[
                        Value::Bytes(payload),
                        Value::Time(UNIX_EPOCH + Duration::from_secs(due)),
                        Value::Int(job),
                    ],
                )
                .map_err(err)?;
                set_key(conn, sql, &key, job, first_ms, due).map_err(err)?;
                return Ok(job);
            }
            // Full: it runs now, and this event starts the next job.
            conn.execute(&sql.close, &[Value::Int(job)]).map_err(err)?;
        }
    }
    start(t, sql, conn, message, &key, now_ms)
}

/// Starts the key's next job with `message`, its first event, and points the key's row at it.
/// A first event that fills a job on its own makes it due at once.
fn start(
    t: &Target<'_>,
    sql: &CollectSql,
    conn: &mut dyn DbConn,
    message: &Message,
    key: &[Value; 2],
    now_ms: i64,
) -> Result<i64> {
    let c = message.collecting().expect("a collected message");
    let full = collect::fills_alone(message.payload().len());
    let due = match full {
        true => ceil_secs(now_ms),
        false => ceil_secs(add_ms(now_ms, c.quiet)),
    };
    let id = publish::one(t, conn, message.clone().into_first_event(full))?;
    set_key(conn, sql, key, id, now_ms, due).map_err(|e| t.err(e))?;
    Ok(id)
}

fn set_key(
    conn: &mut dyn DbConn,
    sql: &CollectSql,
    key: &[Value; 2],
    job: i64,
    first_ms: i64,
    due: u64,
) -> std::result::Result<(), DbError> {
    conn.execute(
        &sql.key_set,
        &[
            Value::Int(job),
            Value::Int(first_ms),
            Value::Int(i64::try_from(due).unwrap_or(i64::MAX)),
            key[0].clone(),
            key[1].clone(),
        ],
    )
    .map(drop)
}

/// Deletes the keys' rows due over a minute ago, at most once a second per broker and table,
/// a few hundred rows at most. Best effort: a sweep that fails (a lock wait, a deadlock on
/// MySQL with a publish) deletes nothing and the next one tries again.
fn sweep(q: &Queue, sql: &CollectSql, conn: &mut dyn DbConn) {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let last = q.collects.swept.load(Ordering::Relaxed);
    if now < last + SWEEP_EVERY_SECS
        || q.collects
            .swept
            .compare_exchange(last, now, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
    {
        return;
    }
    let cutoff = Value::Int(i64::try_from(now.saturating_sub(SWEEP_AFTER_SECS)).unwrap_or(0));
    for _ in 0..SWEEP_ROUNDS {
        match conn.execute(&sql.sweep, std::slice::from_ref(&cutoff)) {
            Ok(n) if n >= SWEEP_ROWS as u64 => continue,
            Ok(_) => return,
            Err(e) => {
                log::debug!("sweep of {}: {e}", crate::dialect::collect::COLLECT_TABLE);
                return;
            }
        }
    }
}

fn epoch_ms(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// `ms` plus `d`, saturating (a `max_wait` of years is no error).
fn add_ms(ms: i64, d: Duration) -> i64 {
    ms.saturating_add(i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Epoch milliseconds rounded up to whole seconds (due times are whole seconds), within the
/// latest time a row holds.
fn ceil_secs(ms: i64) -> u64 {
    let secs = u64::try_from(ms.max(0)).unwrap_or(0).div_ceil(1_000);
    secs.min(crate::model::schedule::LATEST_SECS as u64)
}
