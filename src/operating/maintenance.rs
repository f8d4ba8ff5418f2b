//! The database's elected maintainer as operators see it: which process holds the lease, since
//! when, in which term (`sqlbroker_maintainer`, written by `runtime/maintainer.rs`).

use std::time::SystemTime;

use crate::broker::Broker;
use crate::error::Result;

/// The table of the maintainer's lease.
const MAINTAINER: &str = "sqlbroker_maintainer";

/// The broker that maintains a database, as its lease row tells ([`Broker::maintainer`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Maintainer {
    id: String,
    host: String,
    pid: u64,
    term: u64,
    since: SystemTime,
    until: SystemTime,
}

impl Maintainer {
    /// The holder's id: its host, process and a number of its own (one process may run
    /// several brokers).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The host the maintainer runs on, as its operating system names it.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The maintainer's process id.
    pub fn pid(&self) -> u64 {
        self.pid
    }

    /// The term: one more at every election, so a deposed maintainer's writes are told from
    /// its successor's (each of its batches first renews the lease by its term, and its id).
    /// The row deleted by hand starts the count again at 1.
    pub fn term(&self) -> u64 {
        self.term
    }

    /// When it was elected.
    pub fn since(&self) -> SystemTime {
        self.since
    }

    /// When its lease runs out unless renewed (whole seconds on SQLite and MySQL).
    pub fn lease_until(&self) -> SystemTime {
        self.until
    }
}

impl Broker {
    /// The broker that holds the maintainer's lease of this database (it has not run out), or
    /// `None`: no broker runs for it (each was built with
    /// [`maintenance(false)`](crate::BrokerBuilder::maintenance)), or the last holder stopped
    /// renewing and no other has taken the lease yet. A holder that was killed is still shown
    /// until its lease runs out; another takes it within a third of a lease after that.
    ///
    /// ```
    /// let broker = sqlbroker::Broker::connect("sqlite::memory:")?;
    /// if let Some(m) = broker.maintainer()? {
    ///     println!("maintained by {} (pid {}) since {:?}, term {}", m.host(), m.pid(), m.since(), m.term());
    /// }
    /// # Ok::<(), sqlbroker::BrokerError>(())
    /// ```
    pub fn maintainer(&self) -> Result<Option<Maintainer>> {
        let Some(sql) = self.dialect().maintainer() else {
            return Ok(None);
        };
        let rows = self.read_own("maintainer", MAINTAINER, sql.read, &[])?;
        let Some(r) = rows.first() else {
            return Ok(None);
        };
        let held = crate::runtime::maintainer::held(r);
        Ok(
            (held.until > SystemTime::now() && !held.holder.is_empty()).then(|| Maintainer {
                id: held.holder,
                host: held.host,
                pid: held.pid,
                term: held.term.max(0) as u64,
                since: held.since,
                until: held.until,
            }),
        )
    }

    /// True while this broker holds the maintainer's lease, as of its last renewal.
    pub fn is_maintainer(&self) -> bool {
        self.maintenance_term().is_some()
    }
}
