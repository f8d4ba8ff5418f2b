//! The fleet's heartbeats: every running subscription and worker of a broker is a member, and
//! the broker's heartbeat thread (`sqlbroker-heartbeat`, started with its first member, ended
//! after its last leaves) writes each member's row in `sqlbroker_workers` every beat (what it
//! is, its host and process, the tables, queues and kinds it takes, when it started and was
//! last seen, its rows in work, what it handled, its last error), so any process on the
//! database can tell who works which table and kind (`Broker::workers`, `sqlbroker workers`,
//! `sqlbroker status --kind`).
//!
//! Each row says when it expires, three beats after it was written: a process that stops
//! beating (killed, its database unreachable) drops out of every listing then, without anyone
//! deleting anything. The rows are bounded: a member that stops deletes its own row (the
//! thread does it at once), and every beat of every broker deletes the rows that expired more
//! than [`SWEEP_AFTER`] ago (a process that died), so the table holds the members running now
//! and those that died in the last minute.
//!
//! Nothing here waits on a handler's thread: joining and leaving only change the member list
//! under a lock; the thread does every statement, on a connection of its own (an in-memory
//! SQLite database: its one pooled connection, waited for at most the pool's connection
//! timeout), each statement bounded by the broker's statement timeout.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use parking_lot::{Condvar, Mutex};

use crate::dialect::{DbConn, Dialect};
use crate::model::schedule::ceil;
use crate::model::value::Value;
use crate::runtime::Pool;

/// How often a member's row is written, unless the broker says otherwise
/// (`BrokerBuilder::heartbeat`).
pub(crate) const BEAT: Duration = Duration::from_secs(5);

/// A row expires this many beats after it was written.
pub(crate) const EXPIRES_AFTER_BEATS: u32 = 3;

/// Rows expired longer ago than this are deleted by any broker's beat.
pub(crate) const SWEEP_AFTER: Duration = Duration::from_secs(60);

/// The thread's name.
pub(crate) const THREAD: &str = "sqlbroker-heartbeat";

/// What a member reports at each beat.
#[derive(Debug, Clone, Default)]
pub(crate) struct Report {
    pub in_work: u64,
    pub handled: u64,
    /// Handlers reported stuck whose deliveries live (`SubscriptionBuilder::stuck_after`).
    pub stuck: u64,
    pub last_error: Option<String>,
}

/// A running subscription or worker, as its row tells it.
pub(crate) struct Member {
    pub what: &'static str,
    /// `[{"table": .., "queues": [..] | null, "kinds": [..] | null}]`.
    pub tables: String,
    pub report: Box<dyn Fn() -> Report + Send + Sync>,
}

struct Joined {
    id: String,
    started: SystemTime,
    member: Member,
}

/// A broker's members and its heartbeat thread.
pub(crate) struct Fleet {
    shared: Arc<Shared>,
}

struct Shared {
    state: Mutex<State>,
    cv: Condvar,
    every: Duration,
    /// The broker manages the schema: the thread makes the table if it is not there.
    create: bool,
}

#[derive(Default)]
struct State {
    members: Vec<Arc<Joined>>,
    /// Members that left, whose rows the thread deletes next.
    gone: Vec<String>,
    running: bool,
}

/// A member's place in the fleet: dropping it removes the member and, soon after, its row.
pub(crate) struct Membership {
    shared: Arc<Shared>,
    id: String,
}

impl Drop for Membership {
    fn drop(&mut self) {
        let mut st = self.shared.state.lock();
        st.members.retain(|m| m.id != self.id);
        // No thread, no row written (a database without the table's statements, a thread
        // that could not start): nothing to delete.
        if st.running {
            st.gone.push(std::mem::take(&mut self.id));
            self.shared.cv.notify_all();
        }
    }
}

impl Fleet {
    /// A fleet whose rows are written every `every`; `create`: the table is made if it is not
    /// there (a broker that does not manage the schema writes to the table made by others).
    pub fn new(every: Duration, create: bool) -> Self {
        Fleet {
            shared: Arc::new(Shared {
                state: Mutex::new(State::default()),
                cv: Condvar::new(),
                every,
                create,
            }),
        }
    }

    /// Adds `member`, its row written by the heartbeat thread (started if it is not running)
    /// at once and every beat until the membership is dropped. A database without the
    /// statements (the unit tests' scripted one), or a thread that cannot start, writes no row
    /// (logged).
    pub fn join(&self, dialect: &Arc<dyn Dialect>, pool: &Pool, member: Member) -> Membership {
        let id = member_id();
        let joined = Arc::new(Joined {
            id: id.clone(),
            started: SystemTime::now(),
            member,
        });
        let mut st = self.shared.state.lock();
        st.members.push(joined);
        self.shared.cv.notify_all();
        if !st.running && dialect.fleet().is_some() {
            let (shared, dialect, pool) = (self.shared.clone(), dialect.clone(), pool.clone());
            let spawned = std::thread::Builder::new()
                .name(THREAD.into())
                .spawn(move || run(&shared, &*dialect, &pool));
            match spawned {
                Ok(_) => st.running = true,
                Err(e) => log::warn!("starting the heartbeat thread: {e}"),
            }
        }
        Membership {
            shared: self.shared.clone(),
            id,
        }
    }
}

/// A member's id: host, process and a number no other member of this process had.
pub(crate) fn member_id() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!(
        "{}-{}-{:x}-{}",
        host_id(),
        std::process::id(),
        nanos,
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// The host's name cut to what an id holds (the id column is ASCII on MySQL).
fn host_id() -> String {
    host()
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .take(40)
        .collect()
}

/// The host's name as the operating system gives it.
fn host() -> String {
    gethostname::gethostname().to_string_lossy().into_owned()
}

/// The thread: a beat at once, then every `every`, and the rows of members that left at once;
/// it ends when no member is left and their rows are deleted.
fn run(shared: &Shared, dialect: &dyn Dialect, pool: &Pool) {
    let Some(sql) = dialect.fleet() else { return };
    let mut made = !shared.create;
    let mut next = Instant::now();
    let mut failing = false;
    // A connection of its own: members whose rows in work hold the whole pool (the row lock
    // form) are running, and must not drop out of the listing for want of a connection. An
    // in-memory SQLite database lives in the pool's one connection: that one, then.
    let pooled = dialect.max_pool_size() == Some(1);
    let mut own: Option<Box<dyn DbConn + Send>> = None;
    loop {
        let (gone, members) = {
            let mut st = shared.state.lock();
            loop {
                if st.members.is_empty() && st.gone.is_empty() {
                    st.running = false;
                    return;
                }
                if !st.gone.is_empty() || Instant::now() >= next {
                    break;
                }
                shared.cv.wait_until(&mut st, next);
            }
            let gone = std::mem::take(&mut st.gone);
            let beat = Instant::now() >= next;
            (gone, beat.then(|| st.members.clone()))
        };
        let result = with_conn(pooled, &mut own, dialect, pool, |conn| {
            if !made {
                conn.batch(sql.create).map_err(|e| e.to_string())?;
                // A table an earlier release made lacks the stuck handlers' column; a second
                // add fails, which is what "it is there" looks like where `IF NOT EXISTS` is
                // not understood (SQLite, MySQL).
                if let Err(e) = conn.batch(sql.add_stuck) {
                    log::debug!("sqlbroker_workers.stuck: {e}");
                }
                made = true;
            }
            for id in &gone {
                conn.execute(sql.leave, &[Value::Text(id.clone())])
                    .map_err(|e| e.to_string())?;
            }
            if let Some(members) = &members {
                beat(&mut *conn, sql, shared.every, members)?;
            }
            Ok(())
        });
        if members.is_some() {
            next = Instant::now() + shared.every;
        }
        match result {
            Ok(()) => failing = false,
            Err(e) => {
                if !failing {
                    log::warn!("heartbeat to sqlbroker_workers: {e}");
                }
                failing = true;
                // The table may have been dropped by hand: made again at the next beat.
                made = !shared.create;
                // The rows of members that left are not tried again: they expire three beats
                // after their last (a database that does not answer, or a table nobody made,
                // would otherwise keep this thread retrying for ever).
                drop(gone);
            }
        }
    }
}

/// Runs `f` on the thread's own connection (opened again if it broke), or on a pooled one.
fn with_conn(
    pooled: bool,
    own: &mut Option<Box<dyn DbConn + Send>>,
    dialect: &dyn Dialect,
    pool: &Pool,
    f: impl FnOnce(&mut dyn DbConn) -> Result<(), String>,
) -> Result<(), String> {
    if pooled {
        let mut conn = pool.get().map_err(|e| e.to_string())?;
        return f(&mut *conn);
    }
    if own.as_ref().is_none_or(|c| c.is_broken()) {
        *own = Some(dialect.connect().map_err(|e| e.to_string())?);
    }
    let conn = own.as_mut().expect("just opened");
    f(&mut **conn)
}

/// Writes every member's row, and deletes the rows that expired long ago.
fn beat(
    conn: &mut dyn DbConn,
    sql: &crate::dialect::FleetSql,
    every: Duration,
    members: &[Arc<Joined>],
) -> Result<(), String> {
    let now = SystemTime::now();
    // Up to a whole second: SQLite and MySQL's `DATETIME` keep seconds, and a time cut down
    // to its second would expire a member beating faster than a second before its next beat.
    let expires = ceil(now + every * EXPIRES_AFTER_BEATS);
    let (host, pid) = (host(), i64::from(std::process::id()));
    // A member whose row cannot be written (too long for its column, say) does not keep the
    // others' rows or the sweep from being written: the first error is returned after them.
    let mut failed = Ok(());
    for m in members {
        let r = (m.member.report)();
        let params = [
            Value::Text(m.id.clone()),
            Value::Text(m.member.what.to_string()),
            Value::Text(host.clone()),
            Value::Int(pid),
            Value::Text(m.member.tables.clone()),
            Value::Time(m.started),
            Value::Time(now),
            Value::Time(expires),
            Value::Int(i64::try_from(r.in_work).unwrap_or(i64::MAX)),
            Value::Int(i64::try_from(r.handled).unwrap_or(i64::MAX)),
            Value::Int(i64::try_from(r.stuck).unwrap_or(i64::MAX)),
            r.last_error.map_or(Value::Null, Value::Text),
        ];
        if let Err(e) = conn.execute(sql.beat, &params) {
            if conn.is_broken() {
                return Err(e.to_string());
            }
            if failed.is_ok() {
                failed = Err(format!("the row of {}: {e}", m.id));
            }
        }
    }
    let before = now
        .checked_sub(SWEEP_AFTER)
        .unwrap_or(SystemTime::UNIX_EPOCH);
    conn.execute(sql.sweep, &[Value::Time(before)])
        .map_err(|e| e.to_string())?;
    failed
}
