//! A worker: handlers registered by table and job kind, run on one pool of threads over one
//! subscription per table (or per table and capped queue), each claiming only the kinds this
//! worker handles ([`SubscriptionBuilder::kinds`](crate::SubscriptionBuilder::kinds)).
//!
//! Why one subscription per table and not one claim loop over all tables: a table's claim is
//! one statement over one table (its form, its limits, its FIFO heads), and a subscription is
//! already the tested unit of claiming, handing back and shutting down. What the worker adds is
//! the dispatch by kind and the one pool of handler threads, which take from the tables in
//! turns ([`TURN_ROWS`]), so no table's backlog starves another's rows.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::Select;

use crate::broker::Broker;
use crate::consuming::delivery::Delivery;
use crate::consuming::outcome::{self, Outcome, Ran};
use crate::consuming::subscription::{fleet_tables, report_of, Subscription};
use crate::error::{BrokerError, NextError, Result};
use crate::model::table::{ClaimOnly, Table};
use crate::runtime::fleet::{Member, Membership};

/// A registered handler, its outcome and error made uniform.
type Handler = Arc<dyn Fn(&Delivery) -> std::result::Result<Outcome, String> + Send + Sync>;

/// The most handler threads one worker runs.
pub const MAX_WORKER_THREADS: usize = 1024;

/// How long an idle handler thread waits for any table before it looks again (a closed
/// subscription, a shutdown).
const IDLE_WAIT: Duration = Duration::from_millis(100);

/// A lease table's lane's claim workers and the rows one claim takes, where the worker has
/// several lanes: two claim loops keep a lane's channel filled while the other waits on the
/// database, and a batch of 50 claims ahead what the pool of threads takes in a few
/// milliseconds.
const LANE_CLAIM_WORKERS: usize = 2;
const LANE_BATCH: usize = 50;
/// The same for a worker's only lane (one table, no capped queue): what one subscription
/// feeding 8 threads does best (PostgreSQL, 20 kinds: 0.72-0.77 of such a subscription with two
/// claim workers and batches of 50, 0.88-0.89 with these and [`AHEAD_PER_THREAD`];
/// BENCHMARKS.md).
const SOLE_LANE_CLAIM_WORKERS: usize = 4;
const SOLE_LANE_BATCH: usize = 100;

/// The most rows a lease lane claims ahead, per handler thread of the worker: enough to keep
/// the threads fed across a claim's round trip (PostgreSQL, 8 threads, 20 kinds: 0.74 of one
/// subscription at 16 a thread, 0.88-0.89 at 50), and no more, so a worker with few threads
/// does not hold hundreds of rows another process's worker could run (a review found a worker
/// of one thread holding 400 while a second worker ran none).
const AHEAD_PER_THREAD: usize = 50;

/// Rows a lane's turn lasts, per handler thread: the threads take from one lane at a time,
/// so their acks of it meet in one group commit (each table has its own on the servers), and
/// the turn passes on, so no table waits behind another's backlog for more than a turn.
/// PostgreSQL, a worker of 8 threads over 10 tables against one subscription: each thread
/// taking the next table's row in turn, x0.64-0.75 (nearly every ack its own commit); turns of
/// 1, 4, 16 and 32 rows per thread, x0.63, x0.80, x0.88-0.95, x0.95 (BENCHMARKS.md).
const TURN_ROWS: usize = 16;

/// The shortest an idle handler thread waits on one lane before it looks at the next.
const LANE_WAIT_MIN: Duration = Duration::from_millis(10);

/// What a worker was told about one table.
struct TableReg {
    table: Table,
    handlers: BTreeMap<String, Handler>,
    queues: Option<Vec<String>>,
    /// Queues capped by [`Worker::queue_threads`]: the most of their rows in work at once here.
    caps: BTreeMap<String, usize>,
}

/// Handlers by table and job kind, on one pool of threads: a service with many kinds of job in
/// one table (or several tables) runs them all with one worker. Build it with [`Worker::on`]
/// (and `Worker::job`, feature `serde`), then [`start`](Worker::start) it.
///
/// Each table gets one subscription that claims only the kinds this worker has handlers for
/// (a row of another kind stays ready for the worker that has one), and, for each queue capped
/// with [`queue_threads`](Worker::queue_threads), one more of that queue alone. Connections:
/// each subscription's claim worker holds one pooled connection while it claims, and the row
/// lock and advisory forms hold one per row in work; the broker's pool bounds them all.
///
/// The handler threads take from the tables in turns: all of them from one table until it has
/// no row queued or its turn is over (16 rows per thread), then from the next table that has
/// rows, round the tables; a table with a backlog gets one turn in each round, never all the
/// threads for longer. A handler's result is settled by [`Subscription::run`]'s rules.
///
/// ```
/// use sqlbroker::{Broker, Message, Table, Worker};
/// use std::time::Duration;
///
/// let broker = Broker::connect("sqlite::memory:")?;
/// let jobs = Table::new("jobs").kinds().lease(Duration::from_secs(30));
/// broker.create_table(&jobs)?;
/// broker.publish(&jobs, Message::new(b"a@example.com".to_vec()).kind("welcome"))?;
/// broker.publish(&jobs, Message::new(b"42".to_vec()).kind("invoice"))?;
/// let worker = Worker::new(&broker)
///     .on(&jobs, "welcome", |d| {
///         println!("mail to {}", String::from_utf8_lossy(d.payload()));
///         Ok::<(), std::io::Error>(())
///     })
///     .on(&jobs, "invoice", |_d| Ok::<(), std::io::Error>(()))
///     .threads(4)
///     .start()?;
/// # let t0 = std::time::Instant::now();
/// # while worker.ran().total().acked < 2 && t0.elapsed() < Duration::from_secs(10) {
/// #     std::thread::sleep(Duration::from_millis(20));
/// # }
/// let ran = worker.shutdown(Duration::from_secs(5))?;
/// assert_eq!(ran.total().acked, 2);
/// # Ok::<(), sqlbroker::BrokerError>(())
/// ```
#[must_use = "a worker does nothing until it is started"]
pub struct Worker {
    broker: Broker,
    tables: Vec<TableReg>,
    threads: usize,
    /// The first bad registration, reported by `start`.
    error: Option<BrokerError>,
}

impl Worker {
    /// A worker of `broker`'s tables, with no handler yet and 4 handler threads.
    pub fn new(broker: &Broker) -> Worker {
        Worker {
            broker: broker.clone(),
            tables: Vec::new(),
            threads: 4,
            error: None,
        }
    }

    fn reg(&mut self, table: &Table) -> &mut TableReg {
        let at = match self.tables.iter().position(|r| r.table == *table) {
            Some(i) => i,
            None => {
                self.tables.push(TableReg {
                    table: table.clone(),
                    handlers: BTreeMap::new(),
                    queues: None,
                    caps: BTreeMap::new(),
                });
                self.tables.len() - 1
            }
        };
        &mut self.tables[at]
    }

    fn refuse(&mut self, option: &'static str, reason: String) {
        if self.error.is_none() {
            self.error = Some(BrokerError::InvalidOption { option, reason });
        }
    }

    /// Runs `handler` for the jobs of kind `kind` in `table` (a table described with
    /// [`Table::kinds`]). The handler's type and outcome rules are [`Subscription::run`]'s.
    /// A kind registered twice for one table, or a bad name, is refused by
    /// [`start`](Worker::start).
    pub fn on<O, E, F>(mut self, table: &Table, kind: &str, handler: F) -> Worker
    where
        O: Into<Outcome>,
        E: std::fmt::Display,
        F: Fn(&Delivery) -> std::result::Result<O, E> + Send + Sync + 'static,
    {
        if let Err(reason) = crate::model::table::check_name("kind", kind) {
            self.refuse("on", reason);
            return self;
        }
        let h: Handler =
            Arc::new(move |d: &Delivery| handler(d).map(Into::into).map_err(|e| e.to_string()));
        let name = table.name().to_string();
        if self
            .reg(table)
            .handlers
            .insert(kind.to_string(), h)
            .is_some()
        {
            self.refuse(
                "on",
                format!("kind {kind:?} of table {name} has two handlers"),
            );
        }
        self
    }

    /// Takes only the rows of these queues of `table` (a table described with
    /// [`Table::queues`]); without it, every queue's.
    pub fn queues<I, S>(mut self, table: &Table, names: I) -> Worker
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.reg(table).queues = Some(names.into_iter().map(Into::into).collect());
        self
    }

    /// At most `n` rows of `queue` of `table` in work at once in this worker (a local cap, as
    /// River's per-queue `MaxWorkers`; a cap across processes is a concurrency limit keyed by
    /// the queue, [`Table::concurrency_limit`]`("{queue}", n)`). The queue gets a subscription
    /// of its own, which claims at most `n` rows ahead; the table must list its queues with
    /// [`queues`](Worker::queues), `queue` among them, so the table's other subscription can
    /// leave it out. From 1 to the worker's [`threads`](Worker::threads).
    pub fn queue_threads(mut self, table: &Table, queue: &str, n: usize) -> Worker {
        self.reg(table).caps.insert(queue.to_string(), n);
        self
    }

    /// The handler threads: one pool for every table and kind. Default 4; from 1 to
    /// [`MAX_WORKER_THREADS`].
    pub fn threads(mut self, n: usize) -> Worker {
        self.threads = n;
        self
    }

    /// Starts a subscription per table (and per capped queue) and the handler threads.
    ///
    /// # Errors
    ///
    /// [`BrokerError::InvalidOption`] for a bad registration (no handler at all, a table with
    /// queues listed but no handler, an empty list of queues, a kind twice, a bad name, a cap
    /// out of range or on a queue not listed), and what
    /// [`SubscriptionBuilder::start`](crate::SubscriptionBuilder::start) refuses (a table
    /// without kinds, [`BrokerError::InvalidTable`]); nothing runs then.
    pub fn start(mut self) -> Result<WorkerHandle> {
        if self.tables.is_empty() {
            self.refuse("start", "a worker with no handler".into());
        }
        if !(1..=MAX_WORKER_THREADS).contains(&self.threads) {
            let reason = format!(
                "from 1 to {MAX_WORKER_THREADS} threads, not {}",
                self.threads
            );
            self.refuse("threads", reason);
        }
        let mut plan: Vec<(usize, Option<Vec<String>>, Option<usize>)> = Vec::new();
        let mut bad: Option<(&'static str, String)> = None;
        for r in &self.tables {
            let name = r.table.name();
            if r.handlers.is_empty() {
                bad.get_or_insert(("start", format!("table {name} has no handler")));
            }
            if r.queues.as_ref().is_some_and(Vec::is_empty) {
                bad.get_or_insert(("queues", format!("table {name}: an empty list of queues")));
            }
        }
        for (i, r) in self.tables.iter().enumerate() {
            let mut rest = r.queues.clone();
            for (q, n) in &r.caps {
                let listed = r.queues.as_ref().is_some_and(|l| l.contains(q));
                if !listed || !(1..=self.threads).contains(n) {
                    bad.get_or_insert((
                        "queue_threads",
                        format!(
                            "queue {q:?} of table {}: a cap from 1 to {} on a queue listed \
                             with Worker::queues, not {n}",
                            r.table.name(),
                            self.threads
                        ),
                    ));
                    continue;
                }
                if let Some(rest) = &mut rest {
                    rest.retain(|x| x != q);
                }
                plan.push((i, Some(vec![q.clone()]), Some(*n)));
            }
            if rest.as_ref().is_none_or(|l| !l.is_empty()) {
                plan.push((i, rest, None));
            }
        }
        if let Some((option, reason)) = bad {
            self.refuse(option, reason);
        }
        if let Some(e) = self.error {
            return Err(e);
        }
        let (claim_workers, batch) = match plan.len() {
            1 => (SOLE_LANE_CLAIM_WORKERS, SOLE_LANE_BATCH),
            _ => (LANE_CLAIM_WORKERS, LANE_BATCH),
        };
        let ahead = self.threads.saturating_mul(AHEAD_PER_THREAD);
        let batch = batch.min(ahead);
        let ahead = ahead.min(claim_workers * batch);
        let mut lanes = Vec::new();
        let mut member_tables: Vec<(String, ClaimOnly)> = Vec::new();
        for (i, queues, cap) in plan {
            let r = &self.tables[i];
            let kinds: BTreeSet<&String> = r.handlers.keys().collect();
            let mut b = self
                .broker
                .subscription(&r.table)
                .outside_fleet()
                .kinds(kinds.into_iter().cloned());
            if r.table.form() == crate::model::table::Form::Lease {
                // The forms whose rows in work hold connections keep the subscription's
                // defaults: one claim worker, so a small pool is not outgrown.
                b = b
                    .workers(claim_workers)
                    .batch_size(batch)
                    .max_in_flight(ahead);
            }
            if let Some(q) = &queues {
                b = b.queues(q.iter().cloned());
            }
            if let Some(n) = cap {
                b = b.max_in_flight(n).batch_size(n.min(10));
            }
            let sub = match b.start() {
                Ok(s) => s,
                Err(e) => {
                    for l in &lanes {
                        let l: &Lane = l;
                        l.sub.close();
                    }
                    return Err(e);
                }
            };
            let only = ClaimOnly {
                queues: queues.as_ref().map(|q| q.iter().cloned().collect()),
                kinds: Some(r.handlers.keys().cloned().collect()),
            };
            member_tables.push((r.table.name().to_string(), only));
            lanes.push(Lane {
                table: r.table.name().to_string(),
                handlers: r.handlers.clone(),
                sub,
                cap,
                busy: AtomicUsize::new(0),
            });
        }
        let shared = Arc::new(Shared {
            lanes,
            turn: AtomicUsize::new(0),
            in_turn: AtomicUsize::new(0),
            turn_rows: self.threads.saturating_mul(TURN_ROWS),
            stop: AtomicBool::new(false),
            ran: parking_lot::Mutex::new(BTreeMap::new()),
        });
        // Each handler thread holds a sender of `exited` until it ends: `shutdown` waits for
        // them all with one bounded receive.
        let (alive, exited) = crossbeam_channel::bounded::<()>(0);
        let mut threads = Vec::new();
        for i in 0..self.threads {
            let (s, alive) = (shared.clone(), alive.clone());
            let spawned = std::thread::Builder::new()
                .name(format!("sqlbroker-worker-{i}"))
                .spawn(move || {
                    s.run(i);
                    drop(alive);
                });
            match spawned {
                Ok(t) => threads.push(t),
                Err(source) => {
                    shared.stop.store(true, Ordering::Release);
                    for l in &shared.lanes {
                        l.sub.close();
                    }
                    let name = format!("sqlbroker-worker-{i}");
                    return Err(BrokerError::Thread { name, source });
                }
            }
        }
        let member = Member {
            what: "worker",
            tables: fleet_tables(member_tables.iter().map(|(t, o)| (t.as_str(), o))),
            report: report_of(shared.lanes.iter().map(|l| l.sub.ctx_weak()).collect()),
        };
        let membership = self.broker.join_fleet(member);
        Ok(WorkerHandle {
            shared,
            threads: parking_lot::Mutex::new(threads),
            exited,
            membership: parking_lot::Mutex::new(Some(membership)),
        })
    }
}

/// One subscription of a running worker.
struct Lane {
    table: String,
    handlers: BTreeMap<String, Handler>,
    sub: Subscription,
    cap: Option<usize>,
    /// Its rows in a handler now (capped lanes take no more beyond the cap).
    busy: AtomicUsize,
}

impl Lane {
    /// A capped lane with its cap of rows in a handler: it takes no more now.
    fn full(&self) -> bool {
        self.cap
            .is_some_and(|c| self.busy.load(Ordering::Acquire) >= c)
    }
}

struct Shared {
    lanes: Vec<Lane>,
    /// The lane whose turn it is, and the rows taken in this turn (of `turn_rows`).
    turn: AtomicUsize,
    in_turn: AtomicUsize,
    turn_rows: usize,
    stop: AtomicBool,
    ran: parking_lot::Mutex<BTreeMap<(String, String), Ran>>,
}

impl Shared {
    /// One handler thread: take from the lane whose turn it is, else from the next one with
    /// rows queued (its turn begins), until the worker stops or every lane is closed.
    fn run(&self, first: usize) {
        let n = self.lanes.len();
        if n == 0 {
            return;
        }
        let mut next = first % n;
        while !self.stop.load(Ordering::Acquire) {
            let mut closed = 0;
            let mut took = false;
            let turn = self.turn.load(Ordering::Acquire) % n;
            for k in 0..n {
                let i = (turn + k) % n;
                let lane = &self.lanes[i];
                if lane.full() {
                    continue;
                }
                match lane.sub.try_next_delivery() {
                    Ok(d) => {
                        self.served(i, k == 0, n);
                        next = (i + 1) % n;
                        self.handle(lane, d);
                        took = true;
                        break;
                    }
                    Err(NextError::Closed) => closed += 1,
                    Err(_) => {}
                }
            }
            if closed == n {
                return;
            }
            if took {
                continue;
            }
            // Nothing queued anywhere: claim for the next lane on this thread (as
            // `Subscription::run`'s threads do: no hand-off, and a claim worker per table is
            // not the whole table's speed), waiting on it a share of the idle wait, then the
            // lane after it; rows queued meanwhile on other lanes are taken by the next pass.
            let lane = &self.lanes[next];
            next = (next + 1) % n;
            if lane.full() {
                let mut sel = Select::new();
                for l in &self.lanes {
                    sel.recv(l.sub.receiver());
                }
                let _ = sel.ready_timeout(IDLE_WAIT / n as u32);
                continue;
            }
            let wait = (IDLE_WAIT / n as u32).max(LANE_WAIT_MIN);
            if let Ok(d) = lane.sub.next_delivery_timeout(wait) {
                self.handle(lane, d);
            }
        }
    }

    /// Counts a row taken from lane `i`: the lane whose turn it is, or (`on_turn` false) the
    /// next one with rows, whose turn begins. A turn ends after [`TURN_ROWS`] per thread.
    fn served(&self, i: usize, on_turn: bool, n: usize) {
        if n == 1 {
            return;
        }
        if !on_turn {
            self.turn.store(i, Ordering::Release);
            self.in_turn.store(1, Ordering::Release);
            return;
        }
        if self.in_turn.fetch_add(1, Ordering::AcqRel) + 1 >= self.turn_rows {
            self.in_turn.store(0, Ordering::Release);
            let _ = self
                .turn
                .compare_exchange(i, (i + 1) % n, Ordering::AcqRel, Ordering::Acquire);
        }
    }

    fn handle(&self, lane: &Lane, d: Delivery) {
        lane.busy.fetch_add(1, Ordering::AcqRel);
        let kind = d.kind().unwrap_or_default().to_string();
        let cell = parking_lot::Mutex::new(Ran::default());
        match lane.handlers.get(&kind) {
            Some(h) => outcome::handle(d, |d| h(d), &cell, &lane.table),
            // The subscription claims only the kinds handled here: a row of another kind
            // (a description edited by hand) is failed by the retry policy, not run.
            None => outcome::handle(
                d,
                |_| Err::<Outcome, _>(format!("no handler for kind {kind:?} in this worker")),
                &cell,
                &lane.table,
            ),
        }
        self.ran
            .lock()
            .entry((lane.table.clone(), kind))
            .or_default()
            .add(&cell.into_inner());
        lane.busy.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A running [`Worker`].
pub struct WorkerHandle {
    shared: Arc<Shared>,
    threads: parking_lot::Mutex<Vec<JoinHandle<()>>>,
    /// Disconnected once every handler thread has ended.
    exited: crossbeam_channel::Receiver<()>,
    /// Its heartbeat (`sqlbroker_workers`), until it stops.
    membership: parking_lot::Mutex<Option<Membership>>,
}

impl WorkerHandle {
    /// What the worker ran so far.
    pub fn ran(&self) -> WorkerRan {
        WorkerRan {
            by: self.shared.ran.lock().clone(),
        }
    }

    /// Stops taking rows, hands back the rows claimed ahead (claimable again at once, their
    /// attempts unspent), and waits up to `grace` for the jobs in progress to finish, on every
    /// table at once ([`Subscription::shutdown`] for each). Returns within `grace` plus the
    /// broker's statement timeout.
    ///
    /// # Errors
    ///
    /// [`BrokerError::Unsettled`] if jobs were still running after `grace` (as
    /// [`Subscription::shutdown`] says of their rows); what the worker ran is then still
    /// read with [`ran`](WorkerHandle::ran).
    pub fn shutdown(&self, grace: Duration) -> Result<WorkerRan> {
        let deadline = Instant::now().checked_add(grace);
        self.shared.stop.store(true, Ordering::Release);
        drop(self.membership.lock().take());
        let results: Vec<Result<()>> = std::thread::scope(|scope| {
            let waits: Vec<_> = self
                .shared
                .lanes
                .iter()
                .map(|l| scope.spawn(move || l.sub.shutdown(grace)))
                .collect();
            waits
                .into_iter()
                .map(|w| w.join().unwrap_or(Ok(())))
                .collect()
        });
        // The handler threads end with their job; wait for them within the grace.
        let ended = match deadline {
            Some(d) => matches!(
                self.exited.recv_deadline(d),
                Err(crossbeam_channel::RecvTimeoutError::Disconnected)
            ),
            None => self.exited.recv().is_err(),
        };
        if ended {
            for t in self.threads.lock().drain(..) {
                let _ = t.join();
            }
        }
        results.into_iter().collect::<Result<Vec<()>>>()?;
        Ok(self.ran())
    }
}

impl Drop for WorkerHandle {
    /// Stops taking rows and closes the subscriptions (rows claimed ahead go back); jobs in
    /// progress run to their end on their threads.
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        for l in &self.shared.lanes {
            l.sub.close();
        }
    }
}

/// What a worker ran, by table and kind ([`WorkerHandle::shutdown`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WorkerRan {
    by: BTreeMap<(String, String), Ran>,
}

impl WorkerRan {
    /// What the handler of `kind` in table `table` ran (`None` if it ran nothing).
    pub fn get(&self, table: &str, kind: &str) -> Option<&Ran> {
        self.by.get(&(table.to_string(), kind.to_string()))
    }

    /// Every table and kind that ran something, with what it ran.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str, &Ran)> + '_ {
        self.by
            .iter()
            .map(|((t, k), r)| (t.as_str(), k.as_str(), r))
    }

    /// Everything the worker ran, added up.
    pub fn total(&self) -> Ran {
        let mut out = Ran::default();
        for r in self.by.values() {
            out.add(r);
        }
        out
    }
}
