//! Periodic schedules as data, as operators see them: every schedule a process runs on this
//! database, recorded in `sqlbroker_periodics` (written by `producing/periodic.rs`), listed,
//! paused and resumed by name from any process.

use std::time::{Duration, SystemTime};

use crate::broker::Broker;
use crate::dialect::DbConn;
use crate::error::{BrokerError, Result};
use crate::model::schedule::from_epoch_secs;
use crate::model::table::Table;
use crate::model::value::Value;

/// The schedules' table.
const PERIODICS: &str = "sqlbroker_periodics";

/// A schedule no process has written its beat for this long is shown as orphaned: removed from
/// the code, or every process that ran it stopped. Six of its beats (every 10 s).
pub const ORPHANED_AFTER: Duration = Duration::from_secs(60);

/// A periodic schedule as its record tells it ([`Broker::periodics`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeriodicInfo {
    table: String,
    name: String,
    schedule: String,
    time_zone: String,
    next_tick: Option<SystemTime>,
    last_tick: Option<SystemTime>,
    paused: bool,
    last_seen: SystemTime,
}

impl PeriodicInfo {
    /// The table its ticks are published into.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// Its name (in its rows' dedup keys; [`PeriodicBuilder::name`](crate::PeriodicBuilder)).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The cron expression.
    pub fn schedule(&self) -> &str {
        &self.schedule
    }

    /// The time zone its ticks are computed in (`UTC`).
    pub fn time_zone(&self) -> &str {
        &self.time_zone
    }

    /// The next tick to publish, as the last beat of a process running it said.
    pub fn next_tick(&self) -> Option<SystemTime> {
        self.next_tick
    }

    /// The last tick a process running it published (or skipped, paused).
    pub fn last_tick(&self) -> Option<SystemTime> {
        self.last_tick
    }

    /// Paused ([`Broker::pause_periodic`]): no process publishes its ticks.
    pub fn paused(&self) -> bool {
        self.paused
    }

    /// When a process running it last wrote its beat.
    pub fn last_seen(&self) -> SystemTime {
        self.last_seen
    }

    /// No process has run it for [`ORPHANED_AFTER`]: it was removed from the code, or every
    /// process that ran it stopped. Shown, not run; the record stays until deleted by hand.
    pub fn orphaned(&self) -> bool {
        SystemTime::now()
            .duration_since(self.last_seen)
            .is_ok_and(|d| d > ORPHANED_AFTER)
    }
}

impl Broker {
    /// Every periodic schedule recorded on this database ([`Broker::periodic`] records each
    /// at its start, every process running it writes a beat every 10 s), by table and name;
    /// empty if none ever ran. One that no process runs any more is
    /// [`orphaned`](PeriodicInfo::orphaned).
    ///
    /// ```
    /// let broker = sqlbroker::Broker::connect("sqlite::memory:")?;
    /// for p in broker.periodics()? {
    ///     println!("{} on {}: {} paused={} orphaned={}", p.name(), p.table(), p.schedule(), p.paused(), p.orphaned());
    /// }
    /// # Ok::<(), sqlbroker::BrokerError>(())
    /// ```
    pub fn periodics(&self) -> Result<Vec<PeriodicInfo>> {
        let Some(sql) = self.dialect().periodics() else {
            return Ok(Vec::new());
        };
        let rows = self.read_own("periodics", PERIODICS, sql.list, &[])?;
        Ok(rows
            .into_iter()
            .map(|r| {
                let text = |i: usize| r.get(i).and_then(Value::as_str).unwrap_or("").to_string();
                PeriodicInfo {
                    table: text(0),
                    name: text(1),
                    schedule: text(2),
                    time_zone: text(3),
                    next_tick: r.get(4).and_then(Value::as_time),
                    last_tick: r.get(5).and_then(Value::as_time),
                    paused: r.get(6).and_then(Value::as_i64).is_some_and(|p| p != 0),
                    last_seen: r
                        .get(7)
                        .and_then(Value::as_time)
                        .unwrap_or(SystemTime::UNIX_EPOCH),
                }
            })
            .collect())
    }

    /// Pauses every schedule named `name` on this database, on every process that runs it: a
    /// publish of a tick reads the pause in its own transaction, with the schedule's record
    /// locked, so once this returns no process publishes a tick of it; and the ticks published
    /// ahead (due at a later tick, so not claimable yet) are **held**: due at the end of time
    /// until [`resume_periodic`](Broker::resume_periodic). A tick already due runs. Only the
    /// rows of this schedule: their dedup key is exactly `periodic:<name>:<tick>`.
    /// [`BrokerError::UnknownPeriodic`] if no schedule of that name was ever recorded here.
    /// (The `sqlbroker periodic pause` command records it in the action log.)
    pub fn pause_periodic(&self, name: &str) -> Result<()> {
        self.set_periodic_paused(name, true)?;
        let now = SystemTime::now();
        for p in self.periodics()?.into_iter().filter(|p| p.name == name) {
            let Some((table, rows)) = self.ticks_of(&p)? else {
                continue;
            };
            let q = self.queue(&table)?;
            // Not due, so no claim can hold it: moved in one statement, checked again there.
            let hold = self.due_update(&q, ">");
            for (id, _, run_at) in rows {
                if run_at.is_some_and(|at| at > now) {
                    let params = [Value::Time(held()), Value::Int(id), Value::Time(now)];
                    q.retrying("pause periodic", |conn| conn.execute(&hold, &params))?;
                }
            }
        }
        Ok(())
    }

    /// Resumes every schedule named `name`: each process publishes its next tick as it falls
    /// due, and each tick held by the pause is due at its time again, or, if that time passed
    /// while paused, cancelled (a pause is not caught up). [`BrokerError::UnknownPeriodic`] if
    /// none was recorded.
    pub fn resume_periodic(&self, name: &str) -> Result<()> {
        self.set_periodic_paused(name, false)?;
        let now = SystemTime::now();
        for p in self.periodics()?.into_iter().filter(|p| p.name == name) {
            let Some((table, rows)) = self.ticks_of(&p)? else {
                continue;
            };
            let q = self.queue(&table)?;
            let restore = self.due_update(&q, "=");
            for (id, tick, run_at) in rows {
                if run_at != Some(held()) {
                    continue;
                }
                if tick > now {
                    let params = [Value::Time(tick), Value::Int(id), Value::Time(held())];
                    q.retrying("resume periodic", |conn| conn.execute(&restore, &params))?;
                } else {
                    self.cancel(&table, id)?;
                }
            }
        }
        Ok(())
    }

    fn set_periodic_paused(&self, name: &str, paused: bool) -> Result<()> {
        let unknown = || BrokerError::UnknownPeriodic {
            name: name.to_string(),
        };
        let Some(sql) = self.dialect().periodics() else {
            return Err(unknown());
        };
        let op = if paused {
            "pause periodic"
        } else {
            "resume periodic"
        };
        let mut conn = self.pooled(op, "")?;
        let params = [Value::Int(i64::from(paused)), Value::Text(name.into())];
        let changed = match conn.execute(sql.set_paused, &params) {
            Ok(n) => n,
            // The table was never made: no schedule ever ran here.
            Err(e) => {
                let names = [Value::Text(PERIODICS.into())];
                match conn.query(self.dialect().columns_query(), &names) {
                    Ok(columns) if columns.is_empty() => 0,
                    _ => return Err(e.during(op, "")),
                }
            }
        };
        drop(conn);
        if changed == 0 {
            return Err(unknown());
        }
        Ok(())
    }

    /// The live rows of `p`'s ticks, `(id, tick, run_at)`, with its table (`None`: the table
    /// is gone or keeps no dedup keys): rows whose dedup key is exactly
    /// `periodic:<name>:<epoch seconds>`, read by a `LIKE` of the prefix and checked here, so
    /// a schedule named `a` never takes `a:b`'s rows, nor, where `LIKE` ignores case, `A`'s.
    fn ticks_of(&self, p: &PeriodicInfo) -> Result<Option<(Table, Vec<Tick>)>> {
        let table = match self.open_table(&p.table) {
            Ok(t) => t,
            Err(BrokerError::UnknownTable { .. }) => return Ok(None),
            Err(e) => return Err(e),
        };
        let q = self.queue(&table)?;
        let Some(key) = &q.spec.dedup_key else {
            return Ok(None);
        };
        let syntax = self.dialect().syntax();
        let sql = format!(
            "SELECT {id}, {key}, {run_at} FROM {t} WHERE {key} LIKE {} ESCAPE '!' AND {dead} IS NULL",
            syntax.p(1),
            id = syntax.q(&q.spec.id),
            t = syntax.q(&q.spec.name),
            key = syntax.q(key),
            run_at = syntax.q(&q.spec.run_at),
            dead = syntax.q(&q.spec.dead_at),
        );
        let escaped: String = p
            .name
            .chars()
            .flat_map(|c| match c {
                '!' | '%' | '_' => vec!['!', c],
                c => vec![c],
            })
            .collect();
        let pattern = [Value::Text(format!("periodic:{escaped}:%"))];
        let prefix = format!("periodic:{}:", p.name);
        let rows = q.retrying("periodic ticks", |conn| conn.query(&sql, &pattern))?;
        let ticks = rows
            .into_iter()
            .filter_map(|r| {
                let id = r.first()?.as_i64()?;
                let secs = r.get(1)?.as_str()?.strip_prefix(prefix.as_str())?;
                if secs.is_empty() || !secs.bytes().all(|b| b.is_ascii_digit()) {
                    return None;
                }
                let tick = from_epoch_secs(secs.parse().ok()?);
                Some((id, tick, r.get(2).and_then(Value::as_time)))
            })
            .collect();
        Ok(Some((table, ticks)))
    }
}

impl Broker {
    /// `(due, id, than)`: moves a live row's due time to `due` if it is `op` `than` now.
    fn due_update(&self, q: &crate::runtime::Queue, op: &str) -> String {
        let syntax = self.dialect().syntax();
        format!(
            "UPDATE {t} SET {run_at} = {} WHERE {id} = {} AND {run_at} {op} {} AND {dead} IS NULL",
            syntax.p(1),
            syntax.p(2),
            syntax.p(3),
            t = syntax.q(&q.spec.name),
            id = syntax.q(&q.spec.id),
            run_at = syntax.q(&q.spec.run_at),
            dead = syntax.q(&q.spec.dead_at),
        )
    }
}

/// A live row of a schedule's tick: `(id, tick, run_at)`.
type Tick = (i64, SystemTime, Option<SystemTime>);

/// The due time of a tick held by a pause: a day before the latest time the queue writes
/// (which a job waiting on others reads), far past every claim's `run_at <= now`.
fn held() -> SystemTime {
    from_epoch_secs(crate::model::schedule::LATEST_SECS - 86_400)
}
