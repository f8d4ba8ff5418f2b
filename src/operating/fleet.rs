//! The fleet as operators see it: the running subscriptions and workers of every process on a
//! database, from their heartbeats in `sqlbroker_workers` (written by `runtime/fleet.rs`).

use std::time::SystemTime;

use serde::Deserialize;

use crate::broker::Broker;
use crate::error::Result;
use crate::model::value::Value;

/// The heartbeats' table.
const FLEET: &str = "sqlbroker_workers";

/// One running subscription or worker, as its last heartbeat told ([`Broker::workers`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerInfo {
    id: String,
    what: String,
    host: String,
    pid: u64,
    tables: Vec<WorkerTable>,
    started: SystemTime,
    last_seen: SystemTime,
    in_work: u64,
    handled: u64,
    stuck: u64,
    last_error: Option<String>,
}

/// A table a running subscription or worker takes rows of, and which of its queues and kinds.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct WorkerTable {
    #[serde(rename = "table")]
    name: String,
    queues: Option<Vec<String>>,
    kinds: Option<Vec<String>>,
}

impl WorkerTable {
    /// The table's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The queues it takes (`None`: every queue).
    pub fn queues(&self) -> Option<&[String]> {
        self.queues.as_deref()
    }

    /// The job kinds it takes (`None`: every kind, and rows of none).
    pub fn kinds(&self) -> Option<&[String]> {
        self.kinds.as_deref()
    }

    /// True if it takes rows of `kind` (`None`: rows published without a kind).
    pub fn takes_kind(&self, kind: Option<&str>) -> bool {
        match (&self.kinds, kind) {
            (None, _) => true,
            (Some(kinds), Some(k)) => kinds.iter().any(|x| x == k),
            (Some(_), None) => false,
        }
    }
}

impl WorkerInfo {
    /// Its id in `sqlbroker_workers`: host, process and a number of its own.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// `"worker"` ([`Worker`](crate::Worker)) or `"subscription"`.
    pub fn what(&self) -> &str {
        &self.what
    }

    /// The host its process runs on, as the operating system names it.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// Its process's id on that host.
    pub fn pid(&self) -> u64 {
        self.pid
    }

    /// The tables it takes rows of (a worker: each of its tables, a table once per capped
    /// queue).
    pub fn tables(&self) -> &[WorkerTable] {
        &self.tables
    }

    /// True if it takes rows of `kind` (`None`: rows published without a kind) of `table`.
    pub fn takes(&self, table: &str, kind: Option<&str>) -> bool {
        self.tables
            .iter()
            .any(|t| t.name == table && t.takes_kind(kind))
    }

    /// When it started, to the second.
    pub fn started(&self) -> SystemTime {
        self.started
    }

    /// When its last heartbeat was written, to the second, by its host's clock.
    pub fn last_seen(&self) -> SystemTime {
        self.last_seen
    }

    /// Rows it had claimed and not settled at its last heartbeat.
    pub fn in_work(&self) -> u64 {
        self.in_work
    }

    /// Deliveries it had settled by its last heartbeat.
    pub fn handled(&self) -> u64 {
        self.handled
    }

    /// Its handlers reported stuck whose deliveries are still alive
    /// ([`SubscriptionBuilder::stuck_after`](crate::SubscriptionBuilder::stuck_after)), at its
    /// last beat.
    pub fn stuck(&self) -> u64 {
        self.stuck
    }

    /// The last error its claims or renewals met, until one succeeded again.
    pub fn last_error(&self) -> Option<&str> {
        self.last_error.as_deref()
    }
}

impl Broker {
    /// The subscriptions and workers running on this database, in every process, as their
    /// heartbeats in `sqlbroker_workers` tell (written every few seconds by each broker,
    /// [`BrokerBuilder::heartbeat`](crate::BrokerBuilder::heartbeat)), oldest first. One whose
    /// process stopped (killed, or cut off from the database) is left out three beats after its
    /// last; one that was closed or shut down, at once. Empty if none ever ran.
    ///
    /// # Errors
    ///
    /// A database error other than the table's absence.
    ///
    /// ```
    /// use sqlbroker::{Broker, Table};
    /// use std::time::Duration;
    ///
    /// let file = std::env::temp_dir().join(format!("fleet-doc-{}.db", std::process::id()));
    /// let broker = Broker::connect(&format!("sqlite:{}", file.display()))?;
    /// let jobs = Table::new("jobs").kinds().lease(Duration::from_secs(30));
    /// broker.create_table(&jobs)?;
    /// let sub = broker.subscription(&jobs).kinds(["welcome"]).start()?;
    /// # let t0 = std::time::Instant::now();
    /// # while broker.workers()?.is_empty() && t0.elapsed() < Duration::from_secs(10) {
    /// #     std::thread::sleep(Duration::from_millis(20));
    /// # }
    /// let fleet = broker.workers()?;
    /// assert!(fleet[0].takes("jobs", Some("welcome")));
    /// assert!(!fleet[0].takes("jobs", Some("invoice")));
    /// sub.close();
    /// # drop(sub); drop(broker);
    /// # let _ = std::fs::remove_file(&file);
    /// # Ok::<(), sqlbroker::BrokerError>(())
    /// ```
    pub fn workers(&self) -> Result<Vec<WorkerInfo>> {
        let Some(sql) = self.dialect().fleet() else {
            return Ok(Vec::new());
        };
        let now = [Value::Time(SystemTime::now())];
        let rows = match self.read_own("workers", FLEET, sql.list, &now) {
            Ok(rows) => rows,
            // A table an earlier release made, not yet given its `stuck` column.
            Err(e) => self
                .read_own("workers", FLEET, sql.list_before_stuck, &now)
                .map_err(|_| e)?,
        };
        Ok(rows
            .into_iter()
            .map(|r| {
                let text = |i: usize| r.get(i).and_then(Value::as_str).unwrap_or("").to_string();
                let count = |i: usize| {
                    r.get(i)
                        .and_then(Value::as_i64)
                        .map_or(0, |n| n.max(0) as u64)
                };
                WorkerInfo {
                    id: text(0),
                    what: text(1),
                    host: text(2),
                    pid: count(3),
                    // A row written by hand that does not read is shown with no table.
                    tables: serde_json::from_str(&text(4)).unwrap_or_default(),
                    started: r
                        .get(5)
                        .and_then(Value::as_time)
                        .unwrap_or(SystemTime::UNIX_EPOCH),
                    last_seen: r
                        .get(6)
                        .and_then(Value::as_time)
                        .unwrap_or(SystemTime::UNIX_EPOCH),
                    in_work: count(7),
                    handled: count(8),
                    last_error: r.get(9).and_then(Value::as_str).map(str::to_string),
                    stuck: count(10),
                }
            })
            .collect())
    }
}
