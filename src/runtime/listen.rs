//! The change feed's thread: one per broker (`sqlbroker-listen`), started with the broker's
//! first subscription where the database has a feed ([`ChangeFeed::Watcher`]): PostgreSQL
//! `LISTEN`, SQLite's `data_version` probe. It wakes the idle claim workers of a table when
//! another broker or process publishes to it, so their poll is only a safety net (rows
//! inserted by other tools, a lost notification).
//!
//! - Each watched table's [`Wake`] is held by a weak link; the thread ends within one
//!   [`TICK`] (or one connection attempt) after the last [`Listener`] handle is dropped (the
//!   broker's and its subscriptions').
//! - A lost connection is opened again with a doubling backoff (10 ms to 2 s); once it is back,
//!   every waiter of every table is woken, since rows may have arrived while nobody listened.
//! - The thread also sends the notifications the publishes of its broker skipped ([`Gate`]):
//!   when the one they waited for comes back, or when it has not within [`Gate::STALE`].
//! - A change announced by this broker itself wakes nobody here: its publish already did.
//! - A change of zero rows is a pause or resume: every worker of the table reads the pause
//!   flag again.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::wake::{Gate, Wake};
use crate::dialect::{Change, ChangeFeed, Dialect, Watcher};
use crate::error::DbError;
use crate::model::schedule::backoff;

/// The longest one wait of the feed: how soon the thread sees a stop, a new table to watch,
/// and a stale notification to send.
pub(crate) const TICK: Duration = Duration::from_millis(50);

const RECONNECT_BASE: Duration = Duration::from_millis(10);
const RECONNECT_CAP: Duration = Duration::from_secs(2);

/// A broker's handle on its listener thread. The thread stops when the last handle drops.
pub(crate) struct Listener {
    shared: Arc<Shared>,
}

struct Shared {
    dialect: Arc<dyn Dialect>,
    /// This broker, in the notifications it sends.
    me: u64,
    tables: Mutex<Tables>,
    /// Signalled when a table is first watched (or the thread gives up on a connection).
    watched: Condvar,
    stop: AtomicBool,
}

#[derive(Default)]
struct Tables {
    by_name: HashMap<String, Weak<Wake>>,
    /// Tables the feed watches on its current connection.
    live: HashSet<String>,
    started: bool,
    /// Connection attempts failed in a row.
    failures: u32,
}

impl Listener {
    /// A handle for a broker on `dialect`, or `None` where the database has no change feed.
    pub fn new(dialect: &Arc<dyn Dialect>, me: u64) -> Option<Arc<Listener>> {
        (dialect.change_feed() == ChangeFeed::Watcher).then(|| {
            Arc::new(Listener {
                shared: Arc::new(Shared {
                    dialect: dialect.clone(),
                    me,
                    tables: Mutex::default(),
                    watched: Condvar::new(),
                    stop: AtomicBool::new(false),
                }),
            })
        })
    }

    /// Watches `table` from now on, starting the thread on first use, and waits (at most
    /// `within`) until the feed watches it, so a publish right after a subscription starts is
    /// not left to the poll. A feed that cannot connect is reported by the thread's log; the
    /// subscription then relies on its poll.
    pub fn watch(&self, table: &str, wake: &Arc<Wake>, within: Duration) -> std::io::Result<()> {
        let deadline = Instant::now() + within;
        let mut t = self.shared.tables.lock();
        t.by_name
            .entry(table.to_string())
            .or_insert_with(|| Arc::downgrade(wake));
        if !t.started {
            let shared = self.shared.clone();
            std::thread::Builder::new()
                .name("sqlbroker-listen".into())
                .spawn(move || run(&shared))?;
            t.started = true;
        }
        while !t.live.contains(table) && t.failures == 0 {
            if self.shared.watched.wait_until(&mut t, deadline).timed_out() {
                break;
            }
        }
        Ok(())
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        // Under the lock the reconnect backoff waits with, then signalled: it ends at once.
        let _tables = self.shared.tables.lock();
        self.shared.stop.store(true, Ordering::Release);
        self.shared.watched.notify_all();
    }
}

impl Shared {
    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    /// Every table still alive, with its wake-up.
    fn wakes(&self) -> Vec<(String, Arc<Wake>)> {
        let mut t = self.tables.lock();
        t.by_name.retain(|_, w| w.strong_count() > 0);
        t.by_name
            .iter()
            .filter_map(|(name, w)| Some((name.clone(), w.upgrade()?)))
            .collect()
    }

    fn arm(&self, armed: bool) {
        for (_, wake) in self.wakes() {
            wake.gate.arm(armed);
        }
    }
}

fn run(shared: &Shared) {
    let mut lost = false;
    while !shared.stopped() {
        let served = shared
            .dialect
            .watcher()
            .and_then(|mut w| serve(shared, &mut *w, lost));
        let Err(e) = served else {
            return;
        };
        shared.arm(false);
        let failures = {
            let mut t = shared.tables.lock();
            t.live.clear();
            t.failures += 1;
            shared.watched.notify_all();
            t.failures
        };
        if failures == 1 {
            log::warn!(
                "{} change feed: {e}; reconnecting",
                shared.dialect.database()
            );
        } else {
            log::debug!("{} change feed: {e}", shared.dialect.database());
        }
        lost = true;
        // Waits out the backoff on the condvar a dropped `Listener` signals, so a stop ends it
        // at once; the flag is read under the lock it is set under (no lost wake-up).
        let until = Instant::now() + backoff(failures, RECONNECT_BASE, RECONNECT_CAP);
        let mut t = shared.tables.lock();
        while !shared.stopped() && !shared.watched.wait_until(&mut t, until).timed_out() {}
    }
}

/// Serves one connection until it fails (`Err`) or the broker is gone (`Ok`).
fn serve(shared: &Shared, w: &mut dyn Watcher, reconnected: bool) -> Result<(), DbError> {
    let mut first = true;
    let mut changes = Vec::new();
    while !shared.stopped() {
        let tables = shared.wakes();
        let new: Vec<&String> = {
            let t = shared.tables.lock();
            tables
                .iter()
                .map(|(name, _)| name)
                .filter(|n| !t.live.contains(*n))
                .collect()
        };
        for name in &new {
            w.watch(name)?;
        }
        if !new.is_empty() || first {
            let mut t = shared.tables.lock();
            t.live.extend(new.iter().map(|n| n.to_string()));
            t.failures = 0;
            shared.watched.notify_all();
        }
        for (name, wake) in &tables {
            if new.contains(&name) && w.echoes() {
                wake.gate.arm(true);
            }
        }
        if first && reconnected {
            log::info!("{} change feed: reconnected", shared.dialect.database());
            for (name, wake) in &tables {
                // Rows may have arrived unannounced while nobody listened.
                wake.notify_all();
                owed(shared, w, name, &wake.gate, Instant::now(), false)?;
            }
        }
        first = false;
        changes.clear();
        w.wait(TICK, &mut changes)?;
        let now = Instant::now();
        for Change { table, rows, from } in changes.drain(..) {
            for (name, wake) in &tables {
                if table.as_ref().is_some_and(|t| t != name) {
                    continue;
                }
                if table.is_some() {
                    owed(shared, w, name, &wake.gate, now, false)?;
                }
                if rows == 0 {
                    // A pause or resume (`Broker::pause`): the workers read the flag again.
                    wake.pause.stale();
                    wake.notify_all();
                } else if from != Some(shared.me) {
                    wake.notify(rows);
                }
            }
        }
        for (name, wake) in &tables {
            owed(shared, w, name, &wake.gate, now, true)?;
        }
    }
    Ok(())
}

/// Sends the notification the gate owes for rows whose publishes skipped theirs.
fn owed(
    shared: &Shared,
    w: &mut dyn Watcher,
    table: &str,
    gate: &Gate,
    now: Instant,
    stale_only: bool,
) -> Result<(), DbError> {
    let rows = gate.arrived(now, stale_only);
    if rows > 0 {
        if let Err(e) = w.announce(table, rows, shared.me) {
            // Owed again: sent once the feed is back.
            gate.restore(rows);
            return Err(e);
        }
    }
    Ok(())
}
