//! The maintainer: one broker per database, elected, that looks after what the tables keep
//! (`sqlbroker-maintain`, one thread per broker built with maintenance on, the default;
//! stopped when the broker is dropped).
//!
//! **The election is a lease row with a term**, `sqlbroker_maintainer` (one row): a broker
//! takes the lease when it has expired, in a new term (`term + 1`, one `UPDATE` whose `WHERE`
//! says "expired", so of two brokers trying at once one wins: the row's lock orders them and
//! the second finds it held); the holder renews it every third of the lease, fenced by its
//! term; a holder that stops renewing (killed, cut off from the database) is replaced once
//! its lease has run out, within one lease and a third. A dropped broker gives the lease up at
//! once. Not the database's advisory lock: SQLite has none between processes, and on the
//! servers it would need a session held for ever (no pgbouncer transaction pooling, and a
//! restart of the server or a killed session would lose it silently); a lease row reads the
//! same on every database and says who holds it and since when (`Broker::maintainer`).
//!
//! **The term fences a deposed maintainer**: before each batch of each duty the maintainer
//! renews its lease by its term; if that fails (another broker took it, the row was edited by
//! hand) it stops at once and goes back to trying. A batch already running when the lease
//! passes finishes: every duty is a delete of rows past their retention, the same whoever
//! runs it, so two maintainers' batches at once delete nothing the other would not.
//!
//! **The duties**, every `every` (first one `every` after the election, so a short-lived
//! process does none), each table from its record in `sqlbroker_tables` (so the maintainer
//! needs none of the tables in its code): the completed rows past [`Table::keep_completed`]
//! and the dead letters past [`Table::keep_dead`] ([`crate::runtime::retention`], in batches
//! of 1,000 rows), then the action log's entries past the broker's `keep_actions`. What each
//! deletes is counted (`sqlbroker_pruned_total{table, what}`, the `metrics` feature). The
//! other tables the library writes for itself are kept small by every broker as it goes: the
//! dependency heads by its sweeper ([`crate::runtime::sweep`]), the fleet's heartbeats by its
//! heartbeat thread ([`crate::runtime::fleet`]), rate slots by the claims that use them.
//!
//! Nothing here runs on a handler's thread; each statement is bounded by the broker's
//! statement timeout, and the thread takes a pooled connection for a statement at a time.
//!
//! [`Table::keep_completed`]: crate::model::table::Table::keep_completed
//! [`Table::keep_dead`]: crate::model::table::Table::keep_dead

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use parking_lot::{Condvar, Mutex};

use crate::dialect::{DbConn, Dialect, MaintainerSql};
use crate::model::schedule::ceil;
use crate::model::value::Value;
use crate::runtime::wake::Wake;
use crate::runtime::{Pool, Queue};

/// The lease a maintainer holds unless the broker says otherwise
/// (`BrokerBuilder::maintainer_lease`).
pub(crate) const LEASE: Duration = Duration::from_secs(30);

/// How often the duties run unless the broker says otherwise
/// (`BrokerBuilder::maintenance_every`).
pub(crate) const EVERY: Duration = Duration::from_secs(60);

/// The action log's entries are kept this long unless the broker says otherwise
/// (`BrokerBuilder::keep_actions`).
pub(crate) const KEEP_ACTIONS: Duration = Duration::from_secs(90 * 86_400);

/// The thread's name.
pub(crate) const THREAD: &str = "sqlbroker-maintain";

/// What a broker's maintenance does.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub lease: Duration,
    pub every: Duration,
    pub keep_actions: Option<Duration>,
    /// May make `sqlbroker_maintainer` (the broker manages the schema).
    pub create: bool,
    pub statement_timeout: Duration,
}

/// A broker's maintainer thread, started at most once.
#[derive(Default)]
pub(crate) struct Maintenance {
    shared: Arc<Shared>,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    cv: Condvar,
}

#[derive(Default)]
struct State {
    started: bool,
    stop: bool,
    /// The thread has ended (or never started).
    ended: bool,
    /// The term this broker holds, if it holds the lease.
    term: Option<i64>,
    /// Until when, on this process's clock, the lease is surely held: a lease's length from the
    /// start of its last renewal (or its taking) that succeeded. Past it this broker does not
    /// say it maintains, even while a batch of its duties still runs and no renewal has told it
    /// yet that another broker took over.
    until: Option<Instant>,
}

impl State {
    /// A renewal (or a taking) of `term` that began at `at` succeeded.
    fn held(&mut self, term: i64, at: Instant, lease: Duration) {
        self.term = Some(term);
        self.until = Some(at + lease);
    }
}

/// Who holds the lease, as its row says.
#[derive(Debug, Clone)]
pub(crate) struct Held {
    pub holder: String,
    pub host: String,
    pub pid: u64,
    pub term: i64,
    pub since: SystemTime,
    pub until: SystemTime,
}

impl Maintenance {
    /// Starts the thread, once. A thread that cannot be started is logged (another broker
    /// maintains the database then).
    pub fn start(&self, dialect: &Arc<dyn Dialect>, pool: &Pool, settings: Settings) {
        let mut st = self.shared.state.lock();
        if st.started || st.stop || dialect.maintainer().is_none() {
            return;
        }
        let (shared, dialect, pool) = (self.shared.clone(), dialect.clone(), pool.clone());
        let spawned = std::thread::Builder::new()
            .name(THREAD.into())
            .spawn(move || run(&shared, &dialect, &pool, &settings));
        match spawned {
            Ok(_) => st.started = true,
            Err(e) => log::warn!("starting the maintainer thread: {e}"),
        }
    }

    /// The term this broker holds the lease in, if it does (and its lease has not run out
    /// since its last renewal, on this process's clock).
    pub fn term(&self) -> Option<i64> {
        let st = self.shared.state.lock();
        st.term
            .filter(|_| st.until.is_some_and(|u| Instant::now() < u))
    }
}

/// A dropped broker's thread is told to stop and not waited for: it gives the lease up and
/// ends by itself (at once, or after the statement it is in, which its timeouts bound), so
/// dropping a broker never waits on a database that does not answer.
impl Drop for Maintenance {
    fn drop(&mut self) {
        self.shared.state.lock().stop = true;
        self.shared.cv.notify_all();
    }
}

/// This process's id for the lease: host, process, and a number no other broker of this
/// process had.
fn holder_id() -> String {
    crate::runtime::fleet::member_id()
}

/// Reads who holds the lease (`None`: nobody ever did).
fn read(sql: &MaintainerSql, conn: &mut dyn DbConn) -> Result<Option<Held>, String> {
    let rows = conn.query(sql.read, &[]).map_err(|e| e.to_string())?;
    Ok(rows.first().map(|r| held(r)))
}

/// The lease as a row of [`MaintainerSql::read`] tells it.
pub(crate) fn held(r: &[Value]) -> Held {
    Held {
        holder: r.first().and_then(Value::as_str).unwrap_or("").into(),
        host: r.get(1).and_then(Value::as_str).unwrap_or("").into(),
        pid: r
            .get(2)
            .and_then(Value::as_i64)
            .map_or(0, |n| n.max(0) as u64),
        term: r.get(3).and_then(Value::as_i64).unwrap_or(0),
        since: r
            .get(4)
            .and_then(Value::as_time)
            .unwrap_or(SystemTime::UNIX_EPOCH),
        until: r
            .get(5)
            .and_then(Value::as_time)
            .unwrap_or(SystemTime::UNIX_EPOCH),
    }
}

fn run(shared: &Shared, dialect: &Arc<dyn Dialect>, pool: &Pool, settings: &Settings) {
    if let Some(sql) = dialect.maintainer() {
        let mut me = Candidate {
            sql,
            id: holder_id(),
            host: gethostname::gethostname().to_string_lossy().into_owned(),
            made: !settings.create,
            lease: settings.lease.max(Duration::from_secs(3)),
            every: settings.every,
            next_duties: None,
        };
        let stopped = || shared.state.lock().stop;
        while !stopped() {
            let term = me.round(shared, pool);
            if let (Some(term), Some(at)) = (term, me.next_duties) {
                if Instant::now() >= at {
                    duties(shared, dialect, pool, settings, &mut me, term, &stopped);
                    me.next_duties = Some(Instant::now() + settings.every);
                }
            }
            let mut wait = me.lease / 3;
            if let Some(at) = me.next_duties.filter(|_| term.is_some()) {
                wait = wait.min(at.saturating_duration_since(Instant::now()));
            }
            let mut st = shared.state.lock();
            if !st.stop {
                shared
                    .cv
                    .wait_for(&mut st, wait.max(Duration::from_millis(10)));
            }
        }
        me.resign(shared, pool);
    }
    let mut st = shared.state.lock();
    st.ended = true;
    shared.cv.notify_all();
}

/// A broker running for the lease.
struct Candidate {
    sql: &'static MaintainerSql,
    id: String,
    host: String,
    made: bool,
    lease: Duration,
    /// How often the duties run; the first a whole interval after the election.
    every: Duration,
    /// When the duties run next, while the lease is held.
    next_duties: Option<Instant>,
}

impl Candidate {
    /// Renews the lease held, or tries to take it; the term held after, if any.
    fn round(&mut self, shared: &Shared, pool: &Pool) -> Option<i64> {
        let held = shared.state.lock().term;
        let began = Instant::now();
        let got = match pool.get_timeout(self.lease / 3) {
            Ok(mut conn) => self.hold(&mut *conn, held),
            Err(e) => Err(format!("no pooled connection: {e}")),
        };
        let term = match got {
            Ok(term) => term,
            Err(e) => {
                log::debug!("maintainer election: {e}");
                // Not known to be held: the duties wait until a renewal says so.
                None
            }
        };
        if held.is_some() && term.is_none() {
            log::info!("this broker no longer maintains the database (term {held:?} ended)");
            self.next_duties = None;
        }
        if let (None, Some(t)) = (held, term) {
            log::info!("this broker maintains the database, term {t}");
            self.next_duties = Some(Instant::now() + self.every);
        }
        let mut st = shared.state.lock();
        match term {
            Some(t) => st.held(t, began, self.lease),
            None => (st.term, st.until) = (None, None),
        }
        term
    }

    fn hold(&mut self, conn: &mut dyn DbConn, held: Option<i64>) -> Result<Option<i64>, String> {
        if !self.made {
            conn.batch(self.sql.create).map_err(|e| e.to_string())?;
            self.made = true;
        }
        if let Some(term) = held {
            return Ok(self.renew(conn, term)?.then_some(term));
        }
        let now = SystemTime::now();
        let params = [
            Value::Text(self.id.clone()),
            Value::Text(self.host.clone()),
            Value::Int(i64::from(std::process::id())),
            Value::Time(now),
            Value::Time(ceil(now + self.lease)),
            Value::Time(now),
        ];
        let mut taken = conn.execute(self.sql.take, &params);
        if matches!(taken, Ok(0)) {
            // The row may not be there yet: written once, expired, then taken.
            conn.execute(self.sql.seed, &[])
                .map_err(|e| e.to_string())?;
            taken = conn.execute(self.sql.take, &params);
        }
        if taken.map_err(|e| e.to_string())? == 0 {
            return Ok(None);
        }
        let row = read(self.sql, conn)?;
        Ok(row.filter(|r| r.holder == self.id).map(|r| r.term))
    }

    /// Renews the lease of `term`: false if it is no longer this broker's.
    fn renew(&self, conn: &mut dyn DbConn, term: i64) -> Result<bool, String> {
        let now = SystemTime::now();
        let params = [
            Value::Time(ceil(now + self.lease)),
            Value::Text(self.id.clone()),
            Value::Int(term),
            Value::Time(now),
        ];
        let n = conn
            .execute(self.sql.renew, &params)
            .map_err(|e| e.to_string())?;
        Ok(n > 0)
    }

    /// Gives the lease up, if held, so another broker takes it at once.
    fn resign(&self, shared: &Shared, pool: &Pool) {
        let Some(term) = shared.state.lock().term.take() else {
            return;
        };
        let Ok(mut conn) = pool.get_timeout(Duration::from_millis(500)) else {
            return;
        };
        let params = [
            Value::Time(SystemTime::UNIX_EPOCH + Duration::from_secs(1)),
            Value::Text(self.id.clone()),
            Value::Int(term),
        ];
        if let Err(e) = conn.execute(self.sql.resign, &params) {
            log::debug!("giving the maintainer's lease up: {e}");
        }
    }
}

/// How much of the time the maintainer's deletes may run: after a batch that took `t` it
/// rests `t * (REST - 1)` (so at most a tenth of the time; a long rest is cut in pieces of a
/// quarter of its lease, each followed by a renewal), which leaves the database to
/// the claims of the same tables (measured in `benches/retention.rs`: BENCHMARKS.md). A pass
/// still running when its period (`every`) is over goes on at full speed: its backlog is more
/// than a paced pass deletes in a period, so pacing would let it grow without bound. A prune
/// by an operator's call runs at full speed.
const REST: u32 = 10;

/// The maintainer's pacing between batches ([`REST`]).
struct Pace {
    /// When the batch now ending began (the last time the fence let one go).
    began: Option<Instant>,
    /// Past this, no rest: the pass's period is over.
    paced_until: Instant,
}

impl Pace {
    fn new(period: Duration) -> Pace {
        Pace {
            began: None,
            paced_until: Instant::now() + period,
        }
    }

    /// The rest owed for the batch that just ended: `REST - 1` times its time while the
    /// period lasts, nothing before the first batch or past the period.
    fn owed(&self) -> Duration {
        match self.began {
            Some(began) if Instant::now() < self.paced_until => began.elapsed() * (REST - 1),
            _ => Duration::ZERO,
        }
    }

    /// The next batch starts now.
    fn begin(&mut self) {
        self.began = Some(Instant::now());
    }
}

/// Sleeps `d` in slices, so a dropped broker stops within one; false if it was stopped.
fn rest_for(d: Duration, stopped: &dyn Fn() -> bool) -> bool {
    let until = Instant::now() + d;
    while !stopped() {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return true;
        }
        std::thread::sleep(left.min(Duration::from_millis(50)));
    }
    false
}

/// One round of the duties, in `term`, stopped between batches once the term is lost or the
/// broker is dropped.
fn duties(
    shared: &Shared,
    dialect: &Arc<dyn Dialect>,
    pool: &Pool,
    settings: &Settings,
    me: &mut Candidate,
    term: i64,
    stopped: &dyn Fn() -> bool,
) {
    let mut still = true;
    let mut pace = Pace::new(settings.every);
    let mut fence = || {
        if !still || stopped() {
            return false;
        }
        // The rest owed, in pieces the lease outlasts, each followed by the renewal that
        // fences the next batch.
        let mut owed = pace.owed();
        loop {
            let piece = owed.min(me.lease / 4);
            if !rest_for(piece, stopped) {
                return false;
            }
            owed -= piece;
            let began = Instant::now();
            still = match pool.get_timeout(me.lease / 3) {
                Ok(mut conn) => me.renew(&mut *conn, term).unwrap_or(false),
                Err(_) => false,
            };
            let mut st = shared.state.lock();
            match still {
                true => st.held(term, began, me.lease),
                false => st.until = None,
            }
            if !still || owed.is_zero() {
                break;
            }
        }
        pace.begin();
        still
    };
    let tables = match pool.get_timeout(me.lease / 3) {
        Ok(mut conn) => crate::runtime::registry::list(&**dialect, &mut *conn),
        Err(e) => {
            log::debug!("maintenance: no pooled connection: {e}");
            return;
        }
    };
    let tables = match tables {
        Ok(t) => t,
        Err(e) => {
            log::warn!("maintenance: reading the tables: {e}");
            return;
        }
    };
    let now = SystemTime::now();
    for (table, _) in tables {
        let Ok(spec) = table.validate() else { continue };
        let keeps_completed = spec.completed_at.is_some();
        let keep_dead = spec.dead_retention_secs.map(Duration::from_secs);
        if !keeps_completed && keep_dead.is_none() {
            continue;
        }
        let name = spec.name.clone();
        let sql = dialect.compile(&spec);
        let q = Queue::new(
            spec,
            sql,
            dialect.clone(),
            pool.clone(),
            Arc::new(Wake::default()),
            settings.statement_timeout,
        );
        if keeps_completed {
            match crate::runtime::retention::prune_completed(&q, now, &mut fence) {
                Ok(n) => pruned(&name, "completed", n),
                Err(e) => log::warn!("maintenance: pruning the completed rows of {name}: {e}"),
            }
        }
        if let Some(keep) = keep_dead {
            match crate::runtime::retention::prune_dead(&q, keep, now, &mut fence) {
                Ok(n) => pruned(&name, "dead", n),
                Err(e) => log::warn!("maintenance: pruning the dead letters of {name}: {e}"),
            }
        }
    }
    if let Some(keep) = settings.keep_actions {
        match sweep_actions(dialect, pool, keep, now, &mut fence) {
            Ok(n) => pruned("sqlbroker_actions", "actions", n),
            Err(e) => log::debug!("maintenance: the action log: {e}"),
        }
    }
}

/// Deletes the action log's entries written more than `keep` before `now`, in batches.
fn sweep_actions(
    dialect: &Arc<dyn Dialect>,
    pool: &Pool,
    keep: Duration,
    now: SystemTime,
    fence: &mut dyn FnMut() -> bool,
) -> Result<u64, String> {
    let sql = dialect.action_log();
    let before = Value::Time(now.checked_sub(keep).unwrap_or(SystemTime::UNIX_EPOCH));
    let mut total = 0;
    while fence() {
        let mut conn = pool.get().map_err(|e| e.to_string())?;
        let batch = crate::runtime::retention::BATCH as i64;
        let bound = conn
            .query(sql.sweep_bound, &[before.clone(), Value::Int(batch - 1)])
            .map_err(|e| e.to_string())?
            .first()
            .and_then(|r| r.first()?.as_i64());
        let upto = bound.unwrap_or(i64::MAX);
        total += conn
            .execute(sql.sweep, &[before.clone(), Value::Int(upto)])
            .map_err(|e| e.to_string())?;
        if bound.is_none() {
            break;
        }
    }
    Ok(total)
}

/// Counts what a duty deleted, and logs it.
fn pruned(table: &str, what: &'static str, n: u64) {
    if n > 0 {
        log::info!("maintenance: {n} {what} rows of {table} deleted");
    }
    crate::runtime::meters::pruned(table, what, n);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// After a batch of 30 ms the rest owed is nine times as long while the period lasts;
    /// none before the first batch or past the period. `rest_for` returns at once once the
    /// broker stopped.
    #[test]
    fn owes_a_rest_in_proportion_while_its_period_lasts() {
        let hour = Duration::from_secs(3600);
        let batch = Duration::from_millis(30);
        let mut pace = Pace::new(hour);
        assert_eq!(pace.owed(), Duration::ZERO, "before the first batch");
        pace.begin();
        std::thread::sleep(batch);
        let owed = pace.owed();
        assert!(
            owed >= batch * (REST - 1) && owed < Duration::from_secs(2),
            "{owed:?}"
        );
        let mut past = Pace::new(Duration::ZERO);
        past.begin();
        std::thread::sleep(batch);
        assert_eq!(past.owed(), Duration::ZERO, "past the period");
        let t = Instant::now();
        assert!(!rest_for(hour, &|| true));
        assert!(t.elapsed() < Duration::from_millis(20));
        let t = Instant::now();
        assert!(rest_for(Duration::from_millis(120), &|| false));
        assert!(t.elapsed() >= Duration::from_millis(120));
    }
}
