//! The change feed: `PRAGMA data_version` on a connection of its own, which changes whenever
//! another connection (of this process or another) commits to the file. SQLite cannot push, so
//! the probe polls, on the schedule of [`probe_every`]: every
//! millisecond while changes keep coming, backing off to every few milliseconds when idle. A
//! probe reads the WAL index in shared memory and touches no page: a few microseconds each.

use std::path::Path;
use std::time::{Duration, Instant};

use rusqlite::{Connection, OpenFlags};

use super::conn::classify;
use crate::dialect::{Change, Watcher};
use crate::error::DbError;
use crate::model::schedule::probe_every;

/// Opens the probing connection on the database file.
pub(super) fn open(path: &Path, busy: Duration) -> Result<Box<dyn Watcher>, DbError> {
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(path, flags).map_err(classify)?;
    conn.busy_timeout(busy.min(Duration::from_secs(1)))
        .map_err(classify)?;
    let mut probe = Probe {
        conn,
        version: 0,
        changed: Instant::now(),
    };
    probe.version = probe.read()?;
    Ok(Box::new(probe))
}

struct Probe {
    conn: Connection,
    version: i64,
    /// When the last change was seen.
    changed: Instant,
}

impl Probe {
    fn read(&self) -> Result<i64, DbError> {
        let mut st = self
            .conn
            .prepare_cached("PRAGMA data_version")
            .map_err(classify)?;
        st.query_row([], |r| r.get(0)).map_err(classify)
    }
}

impl Watcher for Probe {
    /// The version is the database's: every table changes with it.
    fn watch(&mut self, _table: &str) -> Result<(), DbError> {
        Ok(())
    }

    fn wait(&mut self, timeout: Duration, out: &mut Vec<Change>) -> Result<(), DbError> {
        let deadline = Instant::now() + timeout;
        loop {
            let version = self.read()?;
            let now = Instant::now();
            if version != self.version {
                self.version = version;
                self.changed = now;
                out.push(Change {
                    table: None,
                    rows: 1,
                    from: None,
                });
                return Ok(());
            }
            if now >= deadline {
                return Ok(());
            }
            let idle = now.saturating_duration_since(self.changed);
            std::thread::sleep(probe_every(idle).min(deadline - now));
        }
    }
}
