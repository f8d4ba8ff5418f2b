//! Periodic jobs (cargo feature `cron`): a cron schedule that publishes one row per tick into a
//! table, however many processes run the same schedule.
//!
//! The policy (publishing ahead, missed ticks, errors) is documented on [`Periodic`].

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::str::FromStr;
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime};

use chrono::{DateTime, Utc};
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};

use crate::broker::Broker;

use crate::dialect::DbConn;

use crate::error::BrokerError;

use crate::producing::message::Message;

use crate::error::Result;

use crate::model::table::Table;

use crate::model::value::Value;

/// The longest a dedup key may be on every database is 255 characters (MySQL); the name takes
/// what `periodic:` and `:<epoch seconds>` leave, with room.
const MAX_NAME: usize = 200;
/// The longest the thread sleeps before it looks at the clock again (a wall clock that jumps
/// is noticed within this).
const MAX_NAP: Duration = Duration::from_secs(10);
const FIRST_BACKOFF: Duration = Duration::from_millis(200);
/// How often a running schedule writes its beat to `sqlbroker_periodics` (when it was last
/// seen, its next tick): a schedule no process has beaten for a while is shown as orphaned.
pub(crate) const BEAT: Duration = Duration::from_secs(10);
/// How soon a paused schedule reads its pause again (with the tick it would publish).
const PAUSED_RECHECK: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(10);

type MakeMessage = Box<dyn Fn(SystemTime) -> Message + Send + 'static>;

impl Broker {
    /// Describes a periodic job (cargo feature `cron`): on `schedule`, publish the message
    /// `make(tick)` into `table`, once per tick across every process that runs the same
    /// schedule on the same table. [`start`](PeriodicBuilder::start) runs it on a thread.
    ///
    /// `schedule` is a cron expression, computed in UTC: five fields
    /// (`minute hour day-of-month month day-of-week`, POSIX/Vixie cron: day of week 0 or 7 is
    /// Sunday) or six with seconds first (`*/5 * * * * *`: every five seconds); names
    /// (`MON`, `JAN`), ranges, steps, lists, `L`, `W`, `#` and `@hourly`-style aliases are
    /// understood (the `croner` crate's syntax).
    ///
    /// `make` is called with the tick (a whole second, UTC) **ahead of it**, when the tick
    /// before it falls due (that is what keeps one row per tick across processes: see
    /// [`Periodic`]); build the message from `tick`, not from the clock. The row is due at the
    /// tick (plus the message's own [`deliver_after`](Message::deliver_after), if it set one).
    /// Its dedup key is the periodic job's, replacing any the closure set.
    ///
    /// The table must be described with [`Table::dedup`]; `start` refuses it otherwise. The
    /// schedule's [`name`](PeriodicBuilder::name), the expression unless one is given, is part
    /// of the key: two different jobs on one table need different names.
    ///
    /// ```
    /// use sqlbroker::{Broker, Message, Table};
    /// use std::time::{Duration, UNIX_EPOCH};
    ///
    /// let broker = Broker::connect("sqlite::memory:")?;
    /// let reports = Table::new("reports").dedup().lease(Duration::from_secs(30));
    /// broker.create_table(&reports)?;
    ///
    /// // Every second (six fields: seconds first). "0 3 * * *" would be 03:00 UTC daily.
    /// let periodic = broker
    ///     .periodic(&reports, "* * * * * *", |tick| {
    ///         let secs = tick.duration_since(UNIX_EPOCH).unwrap().as_secs();
    ///         Message::new(format!("report for {secs}"))
    ///     })
    ///     .name("report")
    ///     .start()?;
    ///
    /// let sub = broker.subscription(&reports).start()?;
    /// let d = sub.next_delivery_timeout(Duration::from_secs(5)).expect("a tick");
    /// assert!(d.payload().starts_with(b"report for "));
    /// d.ack()?;
    /// periodic.stop();
    /// # sub.shutdown(Duration::from_secs(1))?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn periodic<F>(&self, table: &Table, schedule: &str, make: F) -> PeriodicBuilder
    where
        F: Fn(SystemTime) -> Message + Send + 'static,
    {
        PeriodicBuilder {
            broker: self.clone(),
            table: table.clone(),
            expression: schedule.split_whitespace().collect::<Vec<_>>().join(" "),
            name: None,
            catch_up: true,
            make: Box::new(make),
        }
    }
}

/// A periodic job being described ([`Broker::periodic`]); [`start`](PeriodicBuilder::start)
/// validates it and runs it.
#[must_use = "a periodic job runs only once started"]
pub struct PeriodicBuilder {
    broker: Broker,
    table: Table,
    expression: String,
    name: Option<String>,
    catch_up: bool,
    make: MakeMessage,
}

impl std::fmt::Debug for PeriodicBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeriodicBuilder")
            .field("table", &self.table.name())
            .field("expression", &self.expression)
            .field("name", &self.name)
            .field("catch_up", &self.catch_up)
            .finish_non_exhaustive()
    }
}

impl PeriodicBuilder {
    /// The schedule's name in its rows' dedup keys (`periodic:<name>:<tick>`). Default: the
    /// cron expression, its whitespace collapsed. Every process running this job must use the
    /// same name; two different jobs on one table must use different names. At most 200
    /// characters.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Whether a missed tick (see [`Periodic`]) is published late after a pause: at most
    /// one, the latest. Default true. False skips missed ticks: no tick runs late, and none can
    /// run twice (a late tick may, when another process ran it on time).
    pub fn catch_up(mut self, catch_up: bool) -> Self {
        self.catch_up = catch_up;
        self
    }

    /// Validates and starts the thread `sqlbroker-periodic-<table>`, which publishes the first
    /// tick after now at once (due at that tick) and each following tick as the one before it
    /// falls due.
    ///
    /// Errors, with nothing started: [`BrokerError::InvalidOption`] for a cron expression that
    /// does not parse or never fires, or a name that is empty or too long;
    /// [`BrokerError::InvalidTable`] for a table not described with [`Table::dedup`] (or an
    /// invalid description); [`BrokerError::Thread`] if the thread cannot be started.
    pub fn start(self) -> Result<Periodic> {
        let schedule = Schedule::parse(&self.expression)?;
        let name = self.name.unwrap_or_else(|| self.expression.clone());
        if name.is_empty() || name.chars().count() > MAX_NAME {
            return Err(BrokerError::InvalidOption {
                option: "PeriodicBuilder::name",
                reason: format!("{name:?}: a name of 1 to {MAX_NAME} characters"),
            });
        }
        let queue = self.broker.queue(&self.table)?;
        if queue.spec.dedup_key.is_none() {
            return Err(BrokerError::InvalidTable {
                table: self.table.name().to_string(),
                reason: "a periodic job needs dedup keys, which keep one row per tick across \
                         processes: describe the table with Table::dedup()"
                    .into(),
            });
        }
        let (stop, stopped) = crossbeam_channel::bounded(0);
        let recorded = record(&self.broker, &self.table, &name, &self.expression, true);
        let job = Job {
            broker: self.broker,
            table: self.table,
            name: name.clone(),
            schedule,
            catch_up: self.catch_up,
            make: self.make,
            stopped,
            recorded,
            beaten: None,
            expression: self.expression,
        };
        let thread_name = format!("sqlbroker-periodic-{}", job.table.name());
        let thread = std::thread::Builder::new()
            .name(thread_name.clone())
            .spawn(move || job.run())
            .map_err(|source| BrokerError::Thread {
                name: thread_name,
                source,
            })?;
        Ok(Periodic {
            name,
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

/// A running periodic job ([`PeriodicBuilder::start`]). Dropping it stops its thread, as
/// [`stop`](Periodic::stop) does. A tick already published ahead (the next one) stays in the
/// table and runs at its time: every other process running the schedule would publish it too.
///
/// # How one row per tick is kept across processes
///
/// Every process runs the schedule on a thread of its own and publishes each tick's message with
/// the dedup key `periodic:<name>:<tick in epoch seconds>` ([`Table::dedup`] is required). The
/// first insert makes the row; the others get [`BrokerError::Duplicate`], which here means
/// "another process published this tick" and is not an error.
///
/// A dedup key is held only while its row is unfinished: an acked row frees its key at once.
/// A tick published *when it falls due* would race: one process's row could be claimed and acked
/// before a slower process publishes the same tick, which would then make a second row. So each
/// tick is published **ahead**: when a tick falls due, the thread publishes the *next* tick's
/// row at once, due at that next tick ([`Message::deliver_after`]). A row cannot be claimed
/// before it is due, so its key is held from the previous tick until at least its own: every
/// process that publishes a tick before it falls due meets that row and makes none. Host clocks
/// must agree to well within one interval of the schedule.
///
/// # Missed ticks
///
/// A tick this process did not publish before it fell due (the process was paused or
/// suspended, the database unreachable) is *missed*. After such a gap the thread publishes **at
/// most one** missed tick, the latest, due at once, then goes on with the schedule: a pause of
/// an hour on an every-minute schedule makes one late row, not sixty. The ticks before the
/// latest are skipped. Ticks before [`start`](PeriodicBuilder::start) are never caught up.
///
/// A late tick is deduplicated only against an unfinished row: if another process published it
/// on time and that row was acked already, the late tick makes a second row. Where a tick must
/// never run twice, turn catching up off ([`PeriodicBuilder::catch_up`]`(false)`): a tick that
/// no live process published in time is then skipped. (With a single process, a missed tick is
/// only ever published late, so catching up never doubles it.)
///
/// # Errors
///
/// Transient errors ([`BrokerError::is_transient`]: a lost connection, a pool timeout, a
/// deadlock) are retried with backoff (200 ms doubling to 10 s); once the tick falls due while
/// retrying, it is a missed tick, caught up as above. Any other error (the message does not
/// fit the table, the table is gone) is logged and skips the tick, as does a panic of the
/// closure: the schedule goes on.
#[derive(Debug)]
#[must_use = "a periodic job stops when its handle is dropped"]
pub struct Periodic {
    name: String,
    stop: Option<Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Periodic {
    /// The schedule's name, as used in its dedup keys.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// False once the thread has ended: stopped, or the schedule has no tick left.
    pub fn is_running(&self) -> bool {
        self.thread.as_ref().is_some_and(|t| !t.is_finished())
    }

    /// Stops the thread and waits for it: at once when it sleeps; a publish in progress is
    /// finished first (bounded by the broker's statement and connection timeouts).
    pub fn stop(mut self) {
        self.halt();
    }

    fn halt(&mut self) {
        drop(self.stop.take()); // the thread's receiver sees the disconnect at once
        if let Some(t) = self.thread.take() {
            if t.join().is_err() {
                log::error!("periodic job {:?}: its thread panicked", self.name);
            }
        }
    }
}

impl Drop for Periodic {
    fn drop(&mut self) {
        self.halt();
    }
}

/// A parsed cron expression, ticks in UTC, whole seconds.
#[derive(Debug)]
pub(crate) struct Schedule {
    cron: croner::Cron,
}

impl Schedule {
    pub(crate) fn parse(expression: &str) -> Result<Schedule> {
        let bad = |reason: String| BrokerError::InvalidOption {
            option: "Broker::periodic",
            reason: format!("cron expression {expression:?}: {reason}"),
        };
        let cron = croner::Cron::from_str(expression).map_err(|e| bad(e.to_string()))?;
        let schedule = Schedule { cron };
        if schedule.after(SystemTime::now()).is_none() {
            return Err(bad("it never fires".into()));
        }
        Ok(schedule)
    }
}

/// The two questions the tick logic asks of a schedule (a trait so the logic is tested with a
/// schedule of its own).
pub(crate) trait Ticks {
    /// The first tick strictly after `t`, if any.
    fn after(&self, t: SystemTime) -> Option<SystemTime>;
    /// The last tick at or before `t`, if any.
    fn at_or_before(&self, t: SystemTime) -> Option<SystemTime>;
}

impl Ticks for Schedule {
    fn after(&self, t: SystemTime) -> Option<SystemTime> {
        let t: DateTime<Utc> = t.into();
        self.cron
            .find_next_occurrence(&t, false)
            .ok()
            .map(Into::into)
    }

    fn at_or_before(&self, t: SystemTime) -> Option<SystemTime> {
        let t: DateTime<Utc> = t.into();
        self.cron
            .find_previous_occurrence(&t, true)
            .ok()
            .map(Into::into)
    }
}

/// What the thread does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// Publish `tick` (due at it, or now if it is past: `late`).
    Publish { tick: SystemTime, late: bool },
    /// Nothing to publish before `until` (the next tick falls due then).
    Sleep { until: SystemTime },
    /// The schedule has no tick after now.
    Finished,
}

/// The tick logic, pure: `done` is the latest tick this process published (or gave up on),
/// `None` before the first.
///
/// - the first tick after now is published ahead, as soon as the tick before it has fallen due
///   (at start: at once);
/// - ticks after `done` that fell due unpublished were missed: with `catch_up`, the latest of
///   them is published late, once; the others never are.
pub(crate) fn step(
    ticks: &impl Ticks,
    done: Option<SystemTime>,
    now: SystemTime,
    catch_up: bool,
) -> Step {
    let Some(upcoming) = ticks.after(now) else {
        return Step::Finished;
    };
    if let Some(done) = done {
        let missed = ticks.after(done).is_some_and(|t| t <= now);
        if missed && catch_up {
            if let Some(latest) = ticks.at_or_before(now).filter(|&t| t > done) {
                return Step::Publish {
                    tick: latest,
                    late: true,
                };
            }
        }
        if done >= upcoming {
            return Step::Sleep { until: upcoming };
        }
    }
    Step::Publish {
        tick: upcoming,
        late: false,
    }
}

/// The delay that makes a row published a little after `now` due exactly at `tick` (a whole
/// second), or at once if `tick` is not after `now`.
///
/// A publish reads the clock again and makes a delayed row due at `ceil(publish time + delay)`
/// ([`crate::model::schedule::due_at`]): `tick - now` would land on `tick + 1 s` as soon as the publish
/// runs a nanosecond after `now`. Aiming just past `tick - 1 s` lands on `tick` for a publish up
/// to a second after `now` (later: a second late, never early).
pub(crate) fn delay_to(tick: SystemTime, now: SystemTime) -> Duration {
    match tick.duration_since(now) {
        Ok(ahead) if !ahead.is_zero() => {
            ahead
                .saturating_sub(Duration::from_secs(1))
                .max(Duration::from_nanos(1))
                + Duration::from_nanos(1)
        }
        _ => Duration::ZERO,
    }
}

/// The dedup key of `tick` for the schedule `name`.
pub(crate) fn tick_key(name: &str, tick: SystemTime) -> String {
    format!(
        "periodic:{name}:{}",
        crate::model::schedule::epoch_secs(tick)
    )
}

/// Records the schedule in `sqlbroker_periodics` (made if it is not there), keeping a pause an
/// operator set; false if that failed (no rights to make the table, say): the schedule then
/// runs as before, unrecorded, and no pause reaches it.
/// A failure is logged as a warning at the start (`warn`), quietly when tried again.
fn record(broker: &Broker, table: &Table, name: &str, expression: &str, warn: bool) -> bool {
    let Some(sql) = broker.dialect().periodics() else {
        return false;
    };
    let written = broker
        .pooled("periodic", table.name())
        .and_then(|mut conn| {
            if let Err(e) = conn.batch(sql.create) {
                log::debug!("making sqlbroker_periodics: {e}");
            }
            let params = [
                Value::Text(table.name().into()),
                Value::Text(name.into()),
                Value::Text(expression.into()),
                Value::Text("UTC".into()),
                Value::Time(SystemTime::now()),
            ];
            conn.execute(sql.upsert, &params)
                .map_err(|e| e.during("periodic", table.name()))
        });
    match written {
        Ok(_) => true,
        Err(e) if warn => {
            log::warn!(
                "periodic job {name:?} on table {}: not recorded in sqlbroker_periodics ({e}); \
                 it runs, but operators cannot see or pause it until it is (tried again every \
                 {BEAT:?})",
                table.name()
            );
            false
        }
        Err(e) => {
            log::debug!("periodic job {name:?}: recording it again: {e}");
            false
        }
    }
}

/// The thread's state.
struct Job {
    broker: Broker,
    table: Table,
    name: String,
    schedule: Schedule,
    catch_up: bool,
    make: MakeMessage,
    stopped: Receiver<()>,
    /// Recorded in `sqlbroker_periodics`: its publishes read the pause there.
    recorded: bool,
    /// When its last beat was written.
    beaten: Option<std::time::Instant>,
    /// The cron expression, as recorded.
    expression: String,
}

enum Outcome {
    /// The schedule is paused: tried again until it is resumed or the tick is due.
    Paused,
    /// Inserted, or another process had: the tick is done.
    Published,
    /// Worth trying again.
    Transient,
    /// Skipped for good (logged).
    Skipped,
}

impl Job {
    fn run(mut self) {
        let mut done: Option<SystemTime> = None;
        let mut backoff = FIRST_BACKOFF;
        loop {
            self.beat(done);
            let now = SystemTime::now();
            match step(&self.schedule, done, now, self.catch_up) {
                Step::Finished => {
                    log::info!(
                        "periodic job {:?} on table {}: the schedule has no tick left",
                        self.name,
                        self.table.name()
                    );
                    return;
                }
                Step::Sleep { until } => {
                    let wait = until.duration_since(now).unwrap_or_default();
                    if !self.nap(wait) {
                        return;
                    }
                }
                Step::Publish { tick, late } => match self.publish(tick, late, now) {
                    Outcome::Published | Outcome::Skipped => {
                        done = Some(tick);
                        backoff = FIRST_BACKOFF;
                    }
                    // Paused: the same tick again in a moment, until it is due; one that fell
                    // due while paused is skipped, and so is every tick before now (a pause
                    // is not caught up).
                    Outcome::Paused => {
                        let now = SystemTime::now();
                        if now >= tick {
                            let latest = self.schedule.at_or_before(now).unwrap_or(tick);
                            done = Some(latest.max(tick));
                        } else {
                            let wait = tick.duration_since(now).unwrap_or_default();
                            if !self.nap(wait.min(PAUSED_RECHECK)) {
                                return;
                            }
                        }
                    }
                    Outcome::Transient => {
                        if !self.nap(backoff) {
                            return;
                        }
                        backoff = (backoff * 2).min(MAX_BACKOFF);
                    }
                },
            }
        }
    }

    /// Sleeps up to `d` (at most [`MAX_NAP`]); false when asked to stop.
    fn nap(&self, d: Duration) -> bool {
        // A wait of zero still yields, so a clock that reads just before the tick does not spin.
        let d = d.clamp(Duration::from_millis(1), MAX_NAP);
        matches!(self.stopped.recv_timeout(d), Err(RecvTimeoutError::Timeout))
    }

    /// Writes the schedule's beat (seen now, its last and next ticks) once per [`BEAT`].
    fn beat(&mut self, done: Option<SystemTime>) {
        if self.beaten.is_some_and(|at| at.elapsed() < BEAT) {
            return;
        }
        // Not recorded at the start (the database did not answer, the pool was held): tried
        // again at every beat, so a pause reaches it once it is.
        if !self.recorded {
            self.beaten = Some(std::time::Instant::now());
            self.recorded = record(
                &self.broker,
                &self.table,
                &self.name,
                &self.expression,
                false,
            );
            return;
        }
        let Some(sql) = self.broker.dialect().periodics() else {
            return;
        };
        self.beaten = Some(std::time::Instant::now());
        let next = done.map_or_else(
            || self.schedule.after(SystemTime::now()),
            |d| self.schedule.after(d),
        );
        let time = |t: Option<SystemTime>| t.map_or(Value::Null, Value::Time);
        let params = [
            Value::Time(SystemTime::now()),
            time(next),
            time(done),
            Value::Text(self.table.name().into()),
            Value::Text(self.name.clone()),
        ];
        let written = self
            .broker
            .pooled("periodic", self.table.name())
            .and_then(|mut conn| {
                conn.execute(sql.beat, &params)
                    .map_err(|e| e.during("periodic", self.table.name()))
            });
        match written {
            // The row was deleted by hand: written again, its pause lost with it.
            Ok(0) => {
                self.recorded = record(
                    &self.broker,
                    &self.table,
                    &self.name,
                    &self.expression,
                    true,
                );
            }
            Ok(_) => {}
            Err(e) => log::debug!("periodic job {:?}: its beat: {e}", self.name),
        }
    }

    /// Publishes `message` unless the schedule is paused: in one transaction that first reads
    /// the pause with its record's row locked, so a pause either comes before (nothing is
    /// published) or after the commit (the pause then finds the row and cancels it). `None`
    /// when paused.
    fn publish_unless_paused(&self, message: Message) -> Result<Option<i64>> {
        if !self.recorded {
            return self.broker.publish(&self.table, message).map(Some);
        }
        let Some(sql) = self.broker.dialect().periodics() else {
            return self.broker.publish(&self.table, message).map(Some);
        };
        let q = self.broker.queue(&self.table)?;
        let mut conn = q.conn("publish")?;
        let during = |e: crate::error::DbError| e.during("publish", &q.spec.name);
        conn.batch(&q.sql.begin_write).map_err(during)?;
        // Broken until the commit: never pooled mid-transaction.
        conn.mark_broken();
        let key = [
            Value::Text(self.table.name().into()),
            Value::Text(self.name.clone()),
        ];
        let run = |conn: &mut dyn DbConn| -> Result<Option<i64>> {
            let paused = conn
                .query(sql.paused, &key)
                .map_err(during)?
                .first()
                .and_then(|r| r.first()?.as_i64())
                .is_some_and(|p| p != 0);
            if paused {
                return Ok(None);
            }
            let id = crate::producing::publish::one(
                &crate::producing::publish::Target::of(&q),
                conn,
                message,
            )?;
            conn.batch("COMMIT").map_err(during)?;
            Ok(Some(id))
        };
        let out = run(&mut *conn);
        match &out {
            Ok(Some(_)) => {
                conn.set_broken(false);
                drop(conn);
                q.meters.published(1);
                self.broker.announce(&q, 1);
            }
            _ => conn.rollback_or_discard(),
        }
        out
    }

    fn publish(&self, tick: SystemTime, late: bool, now: SystemTime) -> Outcome {
        let key = tick_key(&self.name, tick);
        let made = catch_unwind(AssertUnwindSafe(|| (self.make)(tick)));
        let Ok(message) = made else {
            log::error!(
                "periodic job {:?} on table {}: the message closure panicked; tick {key} skipped",
                self.name,
                self.table.name()
            );
            return Outcome::Skipped;
        };
        let delay = delay_to(tick, now) + message.delay();
        let message = message.deliver_after(delay).dedup_key(key.clone());
        match self.publish_unless_paused(message) {
            Ok(None) => {
                log::debug!(
                    "periodic {key} on table {}: paused, not published",
                    self.table.name()
                );
                Outcome::Paused
            }
            Ok(Some(id)) => {
                if late {
                    log::info!(
                        "periodic job {:?} on table {}: missed tick {key} published late, row {id}",
                        self.name,
                        self.table.name()
                    );
                } else {
                    log::debug!("periodic {key} on table {}: row {id}", self.table.name());
                }
                Outcome::Published
            }
            Err(e) if e.is_duplicate() => {
                log::debug!(
                    "periodic {key} on table {}: another process published it",
                    self.table.name()
                );
                Outcome::Published
            }
            Err(e) if e.is_transient() => {
                log::warn!(
                    "periodic {key} on table {}: {e}; retrying",
                    self.table.name()
                );
                Outcome::Transient
            }
            Err(e) => {
                log::error!(
                    "periodic {key} on table {}: {e}; tick skipped",
                    self.table.name()
                );
                Outcome::Skipped
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::UNIX_EPOCH;

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    fn at_ms(ms: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(ms)
    }

    /// A tick every `0` seconds, from the epoch.
    struct Every(u64);

    impl Ticks for Every {
        fn after(&self, t: SystemTime) -> Option<SystemTime> {
            let s = t.duration_since(UNIX_EPOCH).unwrap().as_secs();
            Some(at((s / self.0 + 1) * self.0))
        }
        fn at_or_before(&self, t: SystemTime) -> Option<SystemTime> {
            let s = t.duration_since(UNIX_EPOCH).unwrap().as_secs();
            Some(at(s / self.0 * self.0))
        }
    }

    fn publish(tick: u64, late: bool) -> Step {
        Step::Publish {
            tick: at(tick),
            late,
        }
    }

    #[test]
    fn ticks_are_published_one_ahead_and_missed_ones_caught_up_once() {
        let every10 = Every(10);
        let cases: &[(&str, Option<u64>, u64, bool, Step)] = &[
            // At start: the first tick after now, ahead; nothing before start is caught up.
            ("start", None, 1_003_000, true, publish(1010, false)),
            (
                "start on a tick",
                None,
                1_000_000,
                true,
                publish(1010, false),
            ),
            // Published ahead: sleep until it falls due.
            (
                "ahead",
                Some(1010),
                1_003_000,
                true,
                Step::Sleep { until: at(1010) },
            ),
            // It fell due: publish the next one, ahead.
            ("due", Some(1010), 1_010_000, true, publish(1020, false)),
            (
                "due, late wake",
                Some(1010),
                1_019_999,
                true,
                publish(1020, false),
            ),
            // A pause past 1020 and 1030: only the latest missed tick, late, then on.
            ("missed", Some(1010), 1_035_000, true, publish(1030, true)),
            (
                "after catch-up",
                Some(1030),
                1_035_000,
                true,
                publish(1040, false),
            ),
            // Without catch-up the missed ticks are skipped.
            (
                "missed, no catch-up",
                Some(1010),
                1_035_000,
                false,
                publish(1040, false),
            ),
            // A tick published ahead is not missed when it falls due.
            (
                "not missed",
                Some(1020),
                1_020_500,
                true,
                publish(1030, false),
            ),
            // The clock went back: nothing again until after the published tick.
            (
                "clock back",
                Some(1040),
                1_001_000,
                true,
                Step::Sleep { until: at(1010) },
            ),
        ];
        for (what, done, now_ms, catch_up, want) in cases {
            let got = step(&every10, done.map(at), at_ms(*now_ms), *catch_up);
            assert_eq!(got, *want, "{what}");
        }
    }

    #[test]
    fn an_hour_paused_makes_one_late_tick() {
        // Every second, paused for an hour: one late tick, then the schedule goes on.
        let every1 = Every(1);
        let mut done = Some(at(1000));
        let now = at_ms(4_600_500);
        let mut published = Vec::new();
        while let Step::Publish { tick, late } = step(&every1, done, now, true) {
            published.push((tick, late));
            done = Some(tick);
        }
        assert_eq!(published, [(at(4600), true), (at(4601), false)]);
    }

    #[test]
    fn cron_expressions_five_or_six_fields_in_utc() {
        // 2026-11-30 17:24:08.5 UTC, a Monday.
        let now = at_ms(1_796_059_448_500);
        let every5s = Schedule::parse("*/5 * * * * *").unwrap();
        assert_eq!(every5s.after(now), Some(at(1_796_059_450)));
        assert_eq!(every5s.at_or_before(now), Some(at(1_796_059_445)));
        assert_eq!(
            every5s.at_or_before(at(1_796_059_445)),
            Some(at(1_796_059_445))
        );
        // Five fields: minutes first, second 0; 03:00 UTC daily.
        let nightly = Schedule::parse("0 3 * * *").unwrap();
        assert_eq!(nightly.after(now), Some(at(1_796_094_000))); // 2026-12-01 03:00 UTC
                                                                 // Day of week 0 is Sunday (POSIX), as is 7: 2026-12-06.
        let sunday = Schedule::parse("0 0 * * 0").unwrap();
        assert_eq!(sunday.after(now), Some(at(1_796_515_200)));
        let sunday7 = Schedule::parse("0 0 * * 7").unwrap();
        assert_eq!(sunday7.after(now), Some(at(1_796_515_200)));
        // A tick is strictly after: on a tick, the next one.
        assert_eq!(every5s.after(at(1_796_059_450)), Some(at(1_796_059_455)));
    }

    #[test]
    fn bad_expressions_are_invalid_options() {
        for bad in [
            "",
            "every minute",
            "61 * * * *",
            "* * * * * * * *",
            "0 0 30 2 *",
        ] {
            match Schedule::parse(bad) {
                Err(BrokerError::InvalidOption { option, reason }) => {
                    assert_eq!(option, "Broker::periodic");
                    assert!(reason.contains("cron expression"), "{bad:?}: {reason}");
                }
                other => panic!("{bad:?} parsed: {other:?}"),
            }
        }
    }

    #[test]
    fn a_row_published_ahead_is_due_at_its_tick() {
        use crate::model::schedule::due_at;
        for (tick, now_ms) in [
            (1010, 1_000_000),
            (1010, 1_009_000),
            (1010, 1_009_999),
            (1001, 1_000_000),
        ] {
            let (tick, now) = (at(tick), at_ms(now_ms));
            let d = delay_to(tick, now);
            // The publish reads the clock again, up to most of a second later: still the tick,
            // unless the publish ran past the tick itself (then a second late).
            for lag_ms in [0, 1, 250, 998] {
                let published = now + Duration::from_millis(lag_ms);
                let want = if published < tick {
                    tick
                } else {
                    tick + Duration::from_secs(1)
                };
                let got = due_at(published, d);
                assert_eq!(got, want, "now {now_ms} ms, lag {lag_ms} ms");
            }
            // Much later: late by a second, never early.
            assert!(due_at(now + Duration::from_millis(1500), d) > tick);
        }
        // A tick already due (caught up late): due at once.
        assert_eq!(delay_to(at(1000), at_ms(1_000_000)), Duration::ZERO);
        assert_eq!(delay_to(at(1000), at_ms(1_000_500)), Duration::ZERO);
    }

    #[test]
    fn keys_name_the_schedule_and_the_tick() {
        assert_eq!(
            tick_key("*/5 * * * * *", at(1_796_059_450)),
            "periodic:*/5 * * * * *:1796059450"
        );
    }
}
