//! The counts behind the pages: one background thread reads `Broker::stats` of every table
//! every few seconds (at most a fifth of the time: a round whose counts took 2 s waits 8 s
//! before the next) and keeps the last [`HISTORY`] samples per table, and beyond them an
//! hour of [`Tally`]s, one a minute at most ([`Minutes`], at most [`HOUR_POINTS`] of them:
//! the charts' last hour in a few kilobytes per table, whatever the interval). Pages and `/metrics`
//! read this memory, so they answer in the same time whatever the size of a table, and a
//! table of millions of rows is counted once per interval, not once per request; an action
//! recounts its table at once ([`Sampler::refresh`]).
//!
//! Only counts that succeeded stretch the interval: a count that failed was waiting on a
//! database that did not answer (at most the broker's round trip timeout, after which it reads
//! as failing), not counting a big table, and the database may be back by the next round.
//! Stretched by it, the counts of a database back after a 7-minute silence came back 21
//! minutes later.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use sqlbroker::{Broker, ConcurrencyLimit, QueueStats, RateLimit, Table};

/// Samples kept per table (with the default 5 s interval, ten minutes).
pub(crate) const HISTORY: usize = 120;

/// How far back the charts go.
pub(crate) const HOUR: Duration = Duration::from_secs(3600);

/// The least time between two tallies of [`Minutes`].
pub(crate) const MINUTE: Duration = Duration::from_secs(60);

/// Tallies kept per table in [`Minutes`]: one a minute over [`HOUR`], and the one before
/// the hour began (the first interval's start). 61 tallies of 48 bytes: under 3 KiB a table.
pub(crate) const HOUR_POINTS: usize = 61;

/// The counts a chart needs of one sample: what finished and what failed is told by how these
/// moved between two tallies.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Tally {
    pub at: SystemTime,
    /// Completed rows kept (`None`: the table deletes the rows it acks).
    pub completed: Option<u64>,
    /// Live rows: ready, scheduled, in flight (where counted).
    pub live: u64,
    pub dead: u64,
}

impl Tally {
    pub fn of(at: SystemTime, s: &QueueStats) -> Tally {
        Tally {
            at,
            completed: s.completed,
            live: s.ready + s.scheduled + s.in_flight.unwrap_or(0),
            dead: s.dead,
        }
    }
}

/// A table's last hour at one tally a minute: a ring of at most [`HOUR_POINTS`], bounded
/// whatever the interval between counts (a tally less than [`MINUTE`] after the last one
/// kept is not kept; the samples of [`HISTORY`] hold the recent minutes finely).
#[derive(Clone, Debug, Default)]
pub(crate) struct Minutes {
    ring: VecDeque<Tally>,
}

impl Minutes {
    /// Keeps `t` if a minute has passed since the last tally kept, then forgets the tallies
    /// the hour no longer needs (older than [`HOUR`] before `t`, but for the one that starts
    /// the hour's first interval) and any past [`HOUR_POINTS`].
    pub fn push(&mut self, t: Tally) {
        let due = self
            .ring
            .back()
            .is_none_or(|last| t.at.duration_since(last.at).map_or(true, |d| d >= MINUTE));
        if !due {
            return;
        }
        self.ring.push_back(t);
        let start = t.at.checked_sub(HOUR);
        while self.ring.len() > HOUR_POINTS
            || (self.ring.len() > 1 && start.is_some_and(|s| self.ring[1].at <= s))
        {
            self.ring.pop_front();
        }
    }

    /// The tallies kept, oldest first.
    pub fn iter(&self) -> impl Iterator<Item = &Tally> {
        self.ring.iter()
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.ring.len()
    }
}

/// One count of a table's rows.
#[derive(Clone, Debug)]
pub(crate) struct Point {
    pub at: SystemTime,
    pub stats: QueueStats,
    /// The table's concurrency limits as counted with the stats (empty: none, or their read
    /// failed).
    pub limits: Vec<ConcurrencyLimit>,
    /// Its rate limits likewise.
    pub rates: Vec<RateLimit>,
    /// A table with queues: each queue's counts, by name (empty: none, or their count
    /// failed).
    pub queues: Vec<(String, QueueStats)>,
}

/// What the dashboard knows of one table.
#[derive(Clone, Debug)]
pub(crate) struct Entry {
    pub table: Table,
    /// The last successful counts, oldest first.
    pub history: VecDeque<Point>,
    /// The last hour of counts, one a minute ([`Minutes`]).
    pub minutes: Minutes,
    /// The last count's error, if the last count failed (cleared by the next success); not
    /// for a table that does not exist ([`Entry::missing`]).
    pub error: Option<String>,
    /// The last count found no table: a record left by a table dropped by hand, shown as
    /// such and not as a failure (it would fail every count for ever, and a monitor of the
    /// overview would see the dashboard down until the record is forgotten).
    pub missing: bool,
    /// When the table was last counted (successfully or not), and how long it took.
    pub counted: Option<(SystemTime, Duration)>,
}

impl Entry {
    /// The latest successful counts.
    pub fn last(&self) -> Option<&Point> {
        self.history.back()
    }
}

/// The wait after a round that took `took` in all, `counted` of it in counts that succeeded:
/// the interval, stretched so that counting takes a fifth of the time at most; nothing more
/// for the time failed counts waited.
fn pause(every: Duration, counted: Duration, took: Duration) -> Duration {
    every.max(counted * 4).saturating_sub(took)
}

#[derive(Default)]
struct Inner {
    tables: BTreeMap<String, Entry>,
    /// Listing the recorded tables (or opening the named ones) failed.
    list_error: Option<String>,
    /// Tables named by `--table` that this database does not record (with several
    /// databases, a table may be in some of them only: not a failure).
    absent: Vec<String>,
    rounds: u64,
    /// When the database last answered a listing or a count (`/readyz`).
    answered: Option<Instant>,
}

/// What the pages and `/metrics` read of one database ([`Sampler::snapshot`]).
pub(crate) struct Snapshot {
    /// Every table's entry, by name.
    pub entries: Vec<Entry>,
    /// Why listing the tables failed, if it did.
    pub list_error: Option<String>,
    /// Tables named by `--table` that are not recorded here.
    pub absent: Vec<String>,
}

/// The shared sample store and its thread's controls.
pub(crate) struct Sampler {
    broker: Broker,
    /// Tables named on the command line; empty: every recorded table.
    named: Vec<String>,
    every: Duration,
    inner: Mutex<Inner>,
    round_done: Condvar,
}

impl Sampler {
    pub fn new(broker: Broker, named: Vec<String>, every: Duration) -> Arc<Self> {
        Arc::new(Sampler {
            broker,
            named,
            every,
            inner: Mutex::new(Inner::default()),
            round_done: Condvar::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts the sampling thread (it runs for the life of the process).
    pub fn start(self: &Arc<Self>) -> std::io::Result<()> {
        let me = Arc::clone(self);
        std::thread::Builder::new()
            .name("sqlbroker-dashboard-sampler".into())
            .spawn(move || loop {
                let started = Instant::now();
                let counted = me.round();
                std::thread::sleep(pause(me.every, counted, started.elapsed()));
            })
            .map(drop)
    }

    /// When the database last answered a listing or a count.
    pub fn answered(&self) -> Option<Instant> {
        self.lock().answered
    }

    /// Waits until the first round is done, at most `limit`.
    pub fn wait_first(&self, limit: Duration) {
        let guard = self.lock();
        let _ = self
            .round_done
            .wait_timeout_while(guard, limit, |i| i.rounds == 0);
    }

    /// One round: the table list, then each table's counts (no lock held across SQL). Returns
    /// how long the counts that succeeded took.
    fn round(&self) -> Duration {
        let (tables, list_error, absent, complete) = self.list();
        let names: Vec<String> = tables.iter().map(|t| t.name().to_string()).collect();
        let mut counted = Duration::ZERO;
        for table in tables {
            counted += self.count(table).unwrap_or_default();
        }
        let mut inner = self.lock();
        if complete {
            inner.tables.retain(|name, _| names.contains(name));
        }
        // A listing of every recorded table asked the database (the named tables are known
        // from memory after the first round): an answer, even with no table to count.
        if self.named.is_empty() && list_error.is_none() {
            inner.answered = Some(Instant::now());
        }
        inner.list_error = list_error;
        inner.absent = absent;
        inner.rounds += 1;
        drop(inner);
        self.round_done.notify_all();
        counted
    }

    /// The tables to show (the named ones, or every recorded table), the error that kept
    /// some from the list, the named tables not recorded here, and whether the list is
    /// complete (a failed listing keeps the tables known so far).
    fn list(&self) -> (Vec<Table>, Option<String>, Vec<String>, bool) {
        if self.named.is_empty() {
            return match self.broker.tables() {
                Ok(all) => (
                    all.into_iter().map(|r| r.table).collect(),
                    None,
                    Vec::new(),
                    true,
                ),
                Err(e) => {
                    let known = self
                        .lock()
                        .tables
                        .values()
                        .map(|e| e.table.clone())
                        .collect();
                    (known, Some(crate::chain(&e)), Vec::new(), false)
                }
            };
        }
        let mut out = Vec::new();
        let mut errors = Vec::new();
        let mut absent = Vec::new();
        for name in &self.named {
            match self
                .known(name)
                .map_or_else(|| self.broker.open_table(name), Ok)
            {
                Ok(t) => out.push(t),
                // Not recorded here: shown as such, not as this database failing (it answered).
                Err(sqlbroker::BrokerError::UnknownTable { .. }) => {
                    self.lock().answered = Some(Instant::now());
                    absent.push(name.clone());
                }
                Err(e) => errors.push(crate::chain(&e)),
            }
        }
        let error = (!errors.is_empty()).then(|| errors.join("; "));
        (out, error, absent, true)
    }

    /// Counts one table now and records the result; how long it took, if it succeeded.
    pub fn count(&self, table: Table) -> Option<Duration> {
        let started = Instant::now();
        let stats = self.broker.stats(&table);
        // A table without limits answers from its record alone.
        let (limits, rates) = match &stats {
            Ok(_) => (
                self.broker.concurrency_limits(&table).unwrap_or_default(),
                self.broker.rate_limits(&table).unwrap_or_default(),
            ),
            Err(_) => (Vec::new(), Vec::new()),
        };
        let queues = match (&stats, table.has_queues()) {
            (Ok(_), true) => self.broker.queue_stats(&table).unwrap_or_default(),
            _ => Vec::new(),
        };
        let took = started.elapsed();
        let now = SystemTime::now();
        let mut inner = self.lock();
        if stats.is_ok() {
            inner.answered = Some(Instant::now());
        }
        let entry = inner
            .tables
            .entry(table.name().to_string())
            .or_insert_with(|| Entry {
                table: table.clone(),
                history: VecDeque::new(),
                minutes: Minutes::default(),
                error: None,
                missing: false,
                counted: None,
            });
        entry.table = table;
        entry.counted = Some((now, took));
        entry.missing = false;
        let ok = stats.is_ok().then_some(took);
        match stats {
            Ok(stats) => {
                entry.error = None;
                entry.minutes.push(Tally::of(now, &stats));
                if entry.history.len() == HISTORY {
                    entry.history.pop_front();
                }
                entry.history.push_back(Point {
                    at: now,
                    stats,
                    limits,
                    rates,
                    queues,
                });
            }
            Err(e) if e.is_missing_table() => {
                entry.error = None;
                entry.missing = true;
            }
            Err(e) => entry.error = Some(crate::chain(&e)),
        }
        ok
    }

    /// Recounts `name` now (after an action), if it is a table the dashboard shows.
    pub fn refresh(&self, table: &Table) {
        self.count(table.clone());
    }

    /// The description of a table the dashboard shows.
    pub fn known(&self, name: &str) -> Option<Table> {
        self.lock().tables.get(name).map(|e| e.table.clone())
    }

    /// A copy of every table's entry, by name, the listing's error and the named tables not
    /// recorded here.
    pub fn snapshot(&self) -> Snapshot {
        let inner = self.lock();
        Snapshot {
            entries: inner.tables.values().cloned().collect(),
            list_error: inner.list_error.clone(),
            absent: inner.absent.clone(),
        }
    }

    /// A copy of one table's entry.
    pub fn entry(&self, name: &str) -> Option<Entry> {
        self.lock().tables.get(name).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tally(at: SystemTime, n: u64) -> Tally {
        Tally {
            at,
            completed: Some(n),
            live: 0,
            dead: n / 10,
        }
    }

    /// Issue 42: the hour's ring stays bounded whatever the interval: three hours of counts a
    /// second leave at most [`HOUR_POINTS`] tallies, a minute apart at least, the newest the
    /// last count and the oldest starting the hour's first interval (no more than an hour
    /// and a minute back). Seen failing with `push` forgetting nothing (62 tallies after
    /// 3,660 s); it fails too if a tally is kept more often than a minute or too few cover
    /// the hour.
    #[test]
    fn the_hour_is_a_bounded_ring() {
        let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let mut m = Minutes::default();
        let mut last = start;
        for s in 0..3 * 3600 {
            last = start + Duration::from_secs(s);
            m.push(tally(last, s));
            assert!(m.len() <= HOUR_POINTS, "{} tallies after {s} s", m.len());
        }
        let kept: Vec<&Tally> = m.iter().collect();
        assert!(
            kept.len() >= HOUR_POINTS - 1,
            "the hour is covered: {}",
            kept.len()
        );
        assert!(kept
            .windows(2)
            .all(|w| w[1].at.duration_since(w[0].at).unwrap() >= MINUTE));
        let oldest = last.duration_since(kept[0].at).unwrap();
        assert!(
            oldest >= HOUR - MINUTE && oldest <= HOUR + MINUTE,
            "{oldest:?}"
        );
        // A sample every 10 minutes: each kept, and only the hour's.
        let mut m = Minutes::default();
        for k in 0..30u64 {
            m.push(tally(start + Duration::from_secs(600 * k), k));
        }
        assert_eq!(
            m.len(),
            7,
            "an hour of 10-minute samples and the one before"
        );
    }

    /// Issue 38: a round that waited on a silent database (its counts failed after the round
    /// trip timeout) is followed by the next one at once, not three times its length later;
    /// a round of slow counts still stretches the interval.
    #[test]
    fn only_counts_that_succeeded_stretch_the_interval() {
        let s = Duration::from_secs;
        assert_eq!(
            pause(s(5), s(0), s(420)),
            s(0),
            "after 7 minutes of silence"
        );
        assert_eq!(
            pause(s(5), s(2), s(2)),
            s(6),
            "2 s of counting: 8 s a round"
        );
        assert_eq!(pause(s(5), s(0), s(1)), s(4));
        assert_eq!(
            pause(s(5), s(1), s(11)),
            s(0),
            "a count failed beside one that took 1 s"
        );
    }
}
