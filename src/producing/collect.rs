//! Publishing a collected event ([`Message::collect`]): it joins its key's job if that job
//! still collects, else it starts the next one, in one transaction that holds the key's row
//! in `sqlbroker_collect` and the job's row ([`crate::dialect::collect`]).

use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::dialect::collect::{CollectSql, SWEEP_ROWS};
use crate::dialect::DbConn;
use crate::error::{BrokerError, DbError, Result};
use crate::model::collect::{self, COLLECT_MAX_BYTES, COLLECT_MAX_EVENTS};
use crate::model::value::Value;
use crate::producing::message::Message;
use crate::producing::publish::{self, Target};
use crate::runtime::Queue;

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
    let sql = q
        .collects
        .sql
        .get_or_init(|| crate::dialect::collect::statements(&*q.dialect, &q.spec));
    let t = Target::of(q);
    let mut conn = q.conn("publish")?;
    let made = q.collects.made.load(Ordering::Acquire);
    if !made {
        create(sql, &mut *conn).map_err(|e| t.err(e))?;
        q.collects.made.store(true, Ordering::Release);
    }
    let id = publish::retrying_deadlocks(|| {
        publish::in_own_transaction(&t, &mut *conn, |conn| {
            join_or_start(&t, sql, conn, &message)
        })
    })
    .map_err(|e| {
        // The keys' table dropped by hand: made again by the next publish.
        q.collects.made.store(false, Ordering::Release);
        q.explain_failure(&mut *conn, e)
    })?;
    sweep(q, sql, &mut *conn);
    Ok(id)
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
            // A payload that does not read as events (written by hand) takes no more.
            let events = collect::count(&payload).unwrap_or(COLLECT_MAX_EVENTS);
            let fits =
                collect::event_bytes(&payload) + 4 + message.payload().len() <= COLLECT_MAX_BYTES;
            if events < COLLECT_MAX_EVENTS && fits {
                let mut payload = payload;
                collect::push(&mut payload, message.payload());
                let due_ms = if events + 1 >= COLLECT_MAX_EVENTS {
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
    let first = message.clone().into_first_event();
    let id = publish::one(t, conn, first)?;
    let due = ceil_secs(add_ms(now_ms, c.quiet));
    set_key(conn, sql, &key, id, now_ms, due).map_err(err)?;
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
