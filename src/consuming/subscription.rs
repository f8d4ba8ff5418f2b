//! A running subscription: its options, the `next_delivery` family, and shutdown.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, TryRecvError};

use crate::broker::Broker;
use crate::consuming::claimer;
use crate::consuming::delivery::Delivery;
use crate::consuming::form;
use crate::consuming::outcome::{self, Outcome, Ran};
use crate::error::{BrokerError, NextError, Result};
use crate::model::retry::RetryPolicy;
use crate::model::table::{ClaimOnly, Form, Table};
use crate::runtime::deferred::DeferredAcks;
use crate::runtime::fleet::{Member, Membership, Report};
use crate::runtime::listen::Listener;
use crate::runtime::renewer::Renewer;
use crate::runtime::timer::Timer;
use crate::runtime::{Ctx, Queue, SubOptions};

/// How long `close` and drop wait for a claim worker beyond the statement timeout before they
/// leave it to finish on its own.
const JOIN_MARGIN: Duration = Duration::from_secs(1);

/// How long `next_batch` waits, after its first delivery, for the rest of a claim on its way.
const BATCH_FILL: Duration = Duration::from_millis(10);

/// How long `start` waits for the change feed to watch the table (a feed that cannot connect
/// leaves the subscription to its poll).
const FEED_START: Duration = Duration::from_secs(2);

/// Options of a subscription; [`SubscriptionBuilder::start`] starts it.
///
/// ```
/// use sqlbroker::{Broker, RetryPolicy, Table};
/// use std::time::Duration;
///
/// let broker = Broker::connect("sqlite::memory:")?;
/// let t = Table::new("jobs").lease(Duration::from_secs(30));
/// broker.create_table(&t)?;
/// let sub = broker
///     .subscription(&t)
///     .workers(2)
///     .batch_size(50)
///     .retry_policy(RetryPolicy::exponential(Duration::from_secs(5), Duration::from_secs(300)))
///     .handler_timeout(Duration::from_secs(120))
///     .start()?;
/// # sub.close();
/// # Ok::<(), sqlbroker::BrokerError>(())
/// ```
#[must_use = "a subscription does nothing until it is started"]
pub struct SubscriptionBuilder<'a> {
    /// The table's queue, or why its description is invalid (reported by `start`).
    queue: Result<Arc<Queue>>,
    renewer: Arc<Renewer>,
    listener: Option<Arc<Listener>>,
    /// The broker and the table, to compile a view of some queues or kinds at `start`.
    view: Option<(&'a Broker, Table)>,
    /// The queues and kinds the claims take ([`SubscriptionBuilder::queues`],
    /// [`SubscriptionBuilder::kinds`]).
    only: ClaimOnly,
    workers: usize,
    batch: usize,
    max_in_flight: Option<usize>,
    poll_interval: Duration,
    retry: RetryPolicy,
    handler_timeout: Option<Duration>,
    stuck_after: Option<Duration>,
    events: Option<Arc<dyn crate::runtime::events::Events>>,
    ack_mode: AckMode,
    /// False: no claim worker is started, and only [`Subscription::claim_on_caller`] claims
    /// (`testing::drain`).
    claim_workers: bool,
    /// The subscription writes its own heartbeat (`sqlbroker_workers`); false for a worker's
    /// lanes, whose worker writes one for them all.
    in_fleet: bool,
}

/// When [`Delivery::ack`] returns: after its commit (the default), or at once, its row written
/// by the subscription shortly after ([`SubscriptionBuilder::ack_mode`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum AckMode {
    /// `ack()` returns once the row's delete (or completion) has committed: `Ok` means the job
    /// is done for good. Concurrent acks of a table share statements (group commit), but each
    /// handler waits for its commit.
    #[default]
    Durable,
    /// Lease form only. `ack()` queues the row and returns at once; a thread of the
    /// subscription writes the queued rows, up to 256 per statement and commit, as soon as
    /// 256 are queued or the oldest has waited `within` (from 1 ms to 10 s), plus the time of
    /// the statement. Until then the row keeps its lease, renewed as usual.
    ///
    /// - A crash (or a lost connection) before the write: the row is delivered again when its
    ///   lease ends, exactly as if the handler had crashed before its ack (at-least-once, as
    ///   always: handlers must be idempotent).
    /// - A write that fails: reported to [`Events::ack_failed`](crate::Events::ack_failed)
    ///   and the log; the row is failed with that error as its
    ///   `last_error` (delivered again after the retry policy's delay), or, if the database
    ///   refuses that too, when its lease ends.
    /// - A lease lost before the write: [`Events::lease_lost`](crate::Events::lease_lost), and
    ///   the row is the other claim's.
    /// - [`Subscription::close`], [`Subscription::shutdown`] and dropping the subscription
    ///   write what is queued before they return (bounded by the statement timeout).
    ///
    /// `ack()` waits only while 1,024 acks are queued unwritten (the database is behind).
    /// [`Delivery::ack_all`] and the other settlements stay durable.
    Deferred {
        /// The longest an ack waits in the queue before its write starts.
        within: Duration,
    },
}

impl std::fmt::Debug for SubscriptionBuilder<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let table = match &self.queue {
            Ok(q) => q.spec.name.as_str(),
            Err(_) => "(invalid)",
        };
        f.debug_struct("SubscriptionBuilder")
            .field("table", &table)
            .field("workers", &self.workers)
            .field("batch_size", &self.batch)
            .field("max_in_flight", &self.max_in_flight)
            .field("poll_interval", &self.poll_interval)
            .field("retry_policy", &self.retry)
            .field("handler_timeout", &self.handler_timeout)
            .field("stuck_after", &self.stuck_after)
            .field("events", &self.events.is_some())
            .field("ack_mode", &self.ack_mode)
            .finish()
    }
}

impl<'a> SubscriptionBuilder<'a> {
    pub(crate) fn new(
        queue: Result<Arc<Queue>>,
        renewer: Arc<Renewer>,
        listener: Option<Arc<Listener>>,
    ) -> Self {
        SubscriptionBuilder {
            queue,
            renewer,
            listener,
            view: None,
            only: ClaimOnly::default(),
            workers: 1,
            batch: 10,
            max_in_flight: None,
            poll_interval: Duration::from_millis(250),
            retry: RetryPolicy::default(),
            handler_timeout: None,
            stuck_after: None,
            events: None,
            ack_mode: AckMode::Durable,
            claim_workers: true,
            in_fleet: true,
        }
    }

    /// Writes no heartbeat of its own: a [`Worker`](crate::Worker)'s lane, the worker writing
    /// one for all of its lanes.
    pub(crate) fn outside_fleet(mut self) -> Self {
        self.in_fleet = false;
        self
    }

    /// Starts no claim worker: the subscription claims only when its owner calls
    /// [`Subscription::claim_on_caller`], on the calling thread, so what it holds is exactly
    /// what those calls took (`testing::drain`).
    #[cfg_attr(not(feature = "testing"), allow(dead_code))]
    pub(crate) fn without_claim_workers(mut self) -> Self {
        self.claim_workers = false;
        self.in_fleet = false;
        self
    }

    /// Claims only rows of the named queues, on a table described with
    /// [`Table::queues`](crate::Table::queues) (without it: every queue). Each name is checked
    /// as [`Message::queue`](crate::Message::queue)'s; a table without queues, an empty list
    /// or a bad name is refused by [`start`](SubscriptionBuilder::start)
    /// ([`BrokerError::InvalidTable`]). The claims read the queue's index, in the table's
    /// order (priority, due time, id) across the queues named; FIFO groups, limits and
    /// fairness stay the table's, across its queues.
    pub fn queues<I, S>(mut self, names: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.only.queues = Some(names.into_iter().map(Into::into).collect());
        self
    }

    /// Claims only rows of the named job kinds, on a table described with
    /// [`Table::kinds`](crate::Table::kinds) (without it: every kind, and rows of none), as
    /// [`queues`](SubscriptionBuilder::queues) does for queues. A [`Worker`](crate::Worker)
    /// names the kinds it has handlers for.
    pub fn kinds<I, S>(mut self, names: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.only.kinds = Some(names.into_iter().map(Into::into).collect());
        self
    }

    /// Claim worker threads, each claiming on its own pooled connection. Default 1; from 1 to
    /// 256 ([`start`](SubscriptionBuilder::start) refuses others with
    /// [`BrokerError::InvalidOption`]).
    pub fn workers(mut self, n: usize) -> Self {
        self.workers = n;
        self
    }

    /// The most rows one claim takes. Default 10; from 1 to 1,000. The row lock form, and the
    /// advisory form on a server, take one row per claim, since each such row holds a
    /// connection of its own.
    pub fn batch_size(mut self, n: usize) -> Self {
        self.batch = n;
        self
    }

    /// The most rows claimed and not yet settled (handler slots), counting rows waiting in the
    /// channel. Default: `workers` in the row lock form and the server advisory form,
    /// `workers x batch_size` otherwise. In the row lock and server advisory forms every such row
    /// holds a pooled connection, so keep it below the pool size. From 1 to 100,000.
    pub fn max_in_flight(mut self, n: usize) -> Self {
        self.max_in_flight = Some(n);
        self
    }

    /// How long an idle worker waits before it claims again when no wake-up arrives. Default
    /// 250 ms; from 1 ms to an hour. Publishes through the same [`Broker`] wake
    /// idle workers at once; so do publishes by other brokers and processes on PostgreSQL
    /// (`LISTEN/NOTIFY`) and on a SQLite file (a change probe), within milliseconds. On
    /// MySQL/MariaDB, which cannot notify, an idle worker polls every 2 ms for 50 ms once a
    /// claim found rows (or a publish in this process woke it), then after 5 ms, doubling up
    /// to this interval. Rows inserted by other tools with plain SQL are
    /// always found within it.
    pub fn poll_interval(mut self, d: Duration) -> Self {
        self.poll_interval = d;
        self
    }

    /// How a delivery retried without a delay of its own waits before its next attempt:
    /// [`Delivery::retry`], [`Delivery::fail`], the errors and panics of
    /// [`Subscription::run`], a delivery dropped unsettled, a handler timeout. Default:
    /// [`RetryPolicy::default`] (1 s, doubling, at most 10 minutes, with jitter).
    /// [`Delivery::retry_after`] and [`Outcome::RetryAfter`] keep their own delay.
    pub fn retry_policy(mut self, policy: RetryPolicy) -> Self {
        self.retry = policy;
        self
    }

    /// The longest a handler may hold a delivery, from the moment it is handed out. Past it
    /// the delivery is failed as by [`Delivery::fail`] (retried after the
    /// [`retry_policy`](SubscriptionBuilder::retry_policy) delay, or dead-lettered on the last
    /// attempt, with "the handler timed out" as the reason), so the row is another claim's
    /// while the handler still runs:
    ///
    /// - lease form: the row's lease is cleared (fenced by its token) and the renewer lets go;
    /// - advisory form: the row is retried on the session that holds its key, then the key is
    ///   unlocked (SQLite: the in-process key is given back);
    /// - row lock form: the handler's own SQL ([`postgres::in_delivery`] and
    ///   [`mysql::in_delivery`]) is rolled back, the retry is committed on the delivery's
    ///   transaction, and a statement the handler is running on it is cancelled on the server
    ///   (`pg_cancel_backend`, `KILL QUERY`).
    ///
    /// The handler is told: [`Delivery::timed_out`] turns true, [`Delivery::lease_held`] false,
    /// and its settlement (or `in_delivery`, or `extend`) returns
    /// [`BrokerError::HandlerTimeout`], changing nothing. Default: none. The timeout is checked
    /// by a thread of the subscription's own (`sqlbroker-timer-<table>`), within milliseconds
    /// of the deadline; a handler busy in `in_delivery` is failed once its statement is
    /// cancelled and its closure returns. A zero duration is refused by
    /// [`start`](SubscriptionBuilder::start) with [`BrokerError::InvalidOption`].
    ///
    /// [`postgres::in_delivery`]: crate::postgres::in_delivery
    /// [`mysql::in_delivery`]: crate::mysql::in_delivery
    pub fn handler_timeout(mut self, limit: Duration) -> Self {
        self.handler_timeout = Some(limit);
        self
    }

    /// Reports a handler **stuck** when it still runs `after` its delivery was handed out: once
    /// per delivery, by a log warning, [`Events::stuck`](crate::Events::stuck), the gauge
    /// `sqlbroker_stuck_handlers{table}` (feature `metrics`: up while it runs, down when its
    /// delivery is settled or dropped) and [`Subscription::health`]. "Still runs" means its
    /// [`Delivery`] is alive: a handler that its [`handler_timeout`](Self::handler_timeout)
    /// already failed but that has not returned is still reported, since it still holds a
    /// thread (and perhaps a connection). It changes nothing of the row: set a handler timeout
    /// to free it. Default: none. From 10 ms; checked by the subscription's timer thread
    /// (`sqlbroker-timer-<table>`).
    pub fn stuck_after(mut self, after: Duration) -> Self {
        self.stuck_after = Some(after);
        self
    }

    /// Hooks the application's metrics to this subscription: claims, settlements and their
    /// durations ([`Events`](crate::Events)). Default: none.
    pub fn events(mut self, events: Arc<dyn crate::runtime::events::Events>) -> Self {
        self.events = Some(events);
        self
    }

    /// When [`Delivery::ack`] returns: [`AckMode::Durable`] (the default) after its commit;
    /// [`AckMode::Deferred`] at once, the row written by the subscription within the mode's
    /// bound, many rows per commit (lease form only; `start` refuses it on other forms with
    /// [`BrokerError::InvalidOption`]).
    ///
    /// Pick `Deferred` for many handlers acking one job each where throughput matters and a
    /// job run again after a crash costs nothing extra (handlers are idempotent anyway); keep
    /// `Durable` where `Ok` from `ack()` must mean the row is gone (a reply sent after the ack,
    /// a count of finished jobs). `next_batch` + [`Delivery::ack_all`] is durable and as fast.
    ///
    /// ```
    /// use sqlbroker::{AckMode, Broker, Message, Table};
    /// use std::time::Duration;
    ///
    /// let broker = Broker::connect("sqlite::memory:")?;
    /// let t = Table::new("jobs").lease(Duration::from_secs(30));
    /// broker.create_table(&t)?;
    /// broker.publish(&t, Message::new(b"x".to_vec()))?;
    /// let sub = broker
    ///     .subscription(&t)
    ///     .ack_mode(AckMode::Deferred { within: Duration::from_millis(20) })
    ///     .start()?;
    /// sub.next_delivery().unwrap().ack()?; // queued: returns before its commit
    /// sub.shutdown(Duration::from_secs(5))?; // writes it
    /// assert_eq!(broker.stats(&t)?.total(), 0);
    /// # Ok::<(), sqlbroker::BrokerError>(())
    /// ```
    pub fn ack_mode(mut self, mode: AckMode) -> Self {
        self.ack_mode = mode;
        self
    }

    /// Every option in its range.
    fn check(&self) -> Result<()> {
        let invalid = |option, reason: &str| {
            Err(BrokerError::InvalidOption {
                option,
                reason: reason.into(),
            })
        };
        if !(1..=256).contains(&self.workers) {
            return invalid("workers", "from 1 to 256 claim workers");
        }
        if !(1..=1_000).contains(&self.batch) {
            return invalid("batch_size", "from 1 to 1,000 rows per claim");
        }
        if self
            .max_in_flight
            .is_some_and(|n| !(1..=100_000).contains(&n))
        {
            return invalid("max_in_flight", "from 1 to 100,000 deliveries");
        }
        if !(Duration::from_millis(1)..=Duration::from_secs(3_600)).contains(&self.poll_interval) {
            return invalid(
                "poll_interval",
                "from 1 ms (shorter spins a core) to an hour",
            );
        }
        if let AckMode::Deferred { within } = self.ack_mode {
            if !(Duration::from_millis(1)..=Duration::from_secs(10)).contains(&within) {
                return invalid("ack_mode", "a deferred ack's bound is from 1 ms to 10 s");
            }
        }
        if self.handler_timeout == Some(Duration::ZERO) {
            return invalid(
                "handler_timeout",
                "a handler timeout must be longer than zero",
            );
        }
        if self
            .stuck_after
            .is_some_and(|d| d < Duration::from_millis(10))
        {
            return invalid("stuck_after", "from 10 ms");
        }
        Ok(())
    }

    /// Validates the table, checks the form against the database (`Unsupported`), the server's
    /// version (`ServerTooOld`), on a MariaDB Galera cluster whether the form's guard holds
    /// across nodes (`ClusterUnsafe`, see
    /// [`BrokerBuilder::galera_single_writer`](crate::BrokerBuilder::galera_single_writer))
    /// and, in the forms whose deliveries hold a connection, that the
    /// pool has one to spare beyond `max_in_flight` (`PoolTooSmall`), then starts the claim
    /// workers (and, for a lease table, the renewer).
    ///
    /// # Errors
    ///
    /// [`BrokerError::InvalidOption`] for an option out of its range,
    /// [`BrokerError::InvalidTable`] for an invalid description, and the errors named above;
    /// nothing is started then.
    pub fn start(self) -> Result<Subscription> {
        self.check()?;
        let queue = match (&self.view, self.only != ClaimOnly::default()) {
            (Some((broker, table)), true) => {
                broker.queue(&table.clone().claiming_only(self.only.clone()))
            }
            _ => self.queue,
        }?;
        let form = queue.spec.form;
        let fleet = self
            .view
            .as_ref()
            .filter(|_| self.in_fleet)
            .map(|(broker, _)| (*broker).clone());
        let only = self.only.clone();
        if form != Form::Lease && self.ack_mode != AckMode::Durable {
            return Err(BrokerError::InvalidOption {
                option: "ack_mode",
                reason: "deferred acks need a lease table: the row lock and advisory forms \
                         hold their rows until the ack commits"
                    .into(),
            });
        }
        queue.dialect.check_form(form)?;
        // Connection-holding forms: every delivery in flight holds a pooled connection, so
        // `max_in_flight` of them must leave one for publishes, settlements and claims, or a
        // handler that publishes waits out the pool's timeout.
        let one_per_claim =
            form == Form::RowLock || (form == Form::AdvisoryLock && queue.sql.key_lock.is_some());
        let batch = if one_per_claim { 1 } else { self.batch };
        let max_in_flight = self
            .max_in_flight
            .unwrap_or((self.workers * batch).min(100_000));
        let pool_size = queue.pool.max_size();
        if one_per_claim && max_in_flight >= pool_size as usize {
            return Err(BrokerError::PoolTooSmall {
                table: queue.spec.name.clone(),
                holds: max_in_flight,
                pool_size,
            });
        }
        {
            let mut conn = queue.conn("start")?;
            queue.dialect.check_server(&mut *conn, form)?;
            queue.dialect.check_cluster(&queue.spec)?;
            queue.check_schema(&mut *conn)?;
        }
        // The change feed watches the table before the first claim, so a publish by another
        // broker right after `start` wakes a worker instead of waiting for the poll.
        if let Some(listener) = &self.listener {
            let within = queue.pool.connection_timeout().min(FEED_START);
            if let Err(source) = listener.watch(&queue.spec.name, &queue.wake, within) {
                let name = "sqlbroker-listen".into();
                return Err(BrokerError::Thread { name, source });
            }
        }
        let opts = SubOptions {
            workers: self.workers,
            batch,
            max_in_flight,
            poll_interval: self.poll_interval,
            advisory_scan: (self.batch * 4).max(32),
            retry: self.retry,
            handler_timeout: self.handler_timeout,
            stuck_after: self.stuck_after,
        };
        let name = queue.spec.name.clone();
        let renewer = (form == Form::Lease).then_some(self.renewer);
        let mut ctx =
            Ctx::new(queue, opts, renewer.clone(), self.listener).with_events(self.events);
        if ctx.opts.handler_timeout.is_some() || ctx.opts.stuck_after.is_some() {
            let name = format!("sqlbroker-timer-{name}");
            match Timer::start(name.clone()) {
                Ok(timer) => ctx = ctx.with_timer(timer),
                Err(source) => return Err(BrokerError::Thread { name, source }),
            }
        }
        if let AckMode::Deferred { within } = self.ack_mode {
            let flush = crate::consuming::delivery::write_deferred;
            match DeferredAcks::start(&name, within, flush) {
                Ok(d) => ctx = ctx.with_deferred(d),
                Err(source) => {
                    let name = format!("sqlbroker-ack-{name}");
                    return Err(BrokerError::Thread { name, source });
                }
            }
        }
        let ctx = Arc::new(ctx);
        let (tx, rx) = crossbeam_channel::bounded(ctx.opts.max_in_flight);
        // Each worker holds a sender of `exited` until it ends: `close` waits for them all
        // with one bounded receive.
        let (alive, exited) = crossbeam_channel::bounded::<()>(0);
        let sub = Subscription {
            rx: rx.clone(),
            tx: tx.clone(),
            idle_here: parking_lot::Mutex::new(None),
            filling: parking_lot::Mutex::new(()),
            ctx: ctx.clone(),
            exited,
            waited: AtomicBool::new(false),
            membership: parking_lot::Mutex::new(None),
            claim_workers: if self.claim_workers {
                ctx.opts.workers
            } else {
                0
            },
        };
        let workers = sub.claim_workers;
        for i in 0..workers {
            let worker = (ctx.clone(), tx.clone(), rx.clone(), alive.clone());
            let thread = format!("sqlbroker-claim-{name}-{i}");
            ctx.marks.worker_starting();
            let spawned = std::thread::Builder::new()
                .name(thread.clone())
                .spawn(move || claimer::run(worker.0, worker.1, worker.2, worker.3));
            if let Err(source) = spawned {
                ctx.marks.worker_not_started();
                // The workers started so far end as `sub` drops.
                drop(alive);
                let name = thread;
                return Err(BrokerError::Thread { name, source });
            }
        }
        drop(alive);
        if let Some(renewer) = renewer {
            // No lease held yet: on time until the timer's first round says otherwise.
            ctx.marks.renewed();
            if let Err(source) = renewer.register(&ctx) {
                let name = "sqlbroker-renew".into();
                return Err(BrokerError::Thread { name, source });
            }
        }
        if let Some(broker) = fleet {
            let member = Member {
                what: "subscription",
                tables: fleet_tables([(name.as_str(), &only)]),
                report: report_of(vec![Arc::downgrade(&ctx)]),
            };
            *sub.membership.lock() = Some(broker.join_fleet(member));
        }
        Ok(sub)
    }
}

/// A running subscription. Share it between handler threads by reference (or in an `Arc`);
/// each calls [`next_delivery`](Subscription::next_delivery) and settles what it gets.
///
/// It ends with [`close`](Subscription::close), [`shutdown`](Subscription::shutdown), or when it
/// is dropped; the `next_delivery` family then hands out nothing more (rows already claimed and
/// not handed out are returned to the table).
///
/// ```
/// use sqlbroker::{Broker, Message, Table};
/// use std::sync::Arc;
/// use std::time::Duration;
///
/// let broker = Broker::connect("sqlite::memory:")?;
/// let t = Table::new("jobs").lease(Duration::from_secs(30));
/// broker.create_table(&t)?;
/// broker.publish_batch(&t, (0..4u8).map(|i| Message::new(vec![i])))?;
/// let sub = Arc::new(broker.subscription(&t).start()?);
/// let handlers: Vec<_> = (0..2)
///     .map(|_| {
///         let sub = sub.clone();
///         std::thread::spawn(move || {
///             while let Ok(d) = sub.next_delivery_timeout(Duration::from_millis(200)) {
///                 d.ack().unwrap();
///             }
///         })
///     })
///     .collect();
/// for h in handlers {
///     h.join().unwrap();
/// }
/// sub.shutdown(Duration::from_secs(5))?;
/// # Ok::<(), sqlbroker::BrokerError>(())
/// ```
pub struct Subscription {
    rx: Receiver<Delivery>,
    /// For the rest of a claim run on a handler's thread ([`Subscription::claim_here`]).
    tx: Sender<Delivery>,
    /// When a claim on a handler's thread last found nothing, and the wake-up count then: no
    /// other is tried before a publish or the poll interval (the workers poll meanwhile).
    idle_here: parking_lot::Mutex<Option<(Instant, u64)>>,
    /// Held by the `next_batch` call filling its batch from the channel: one fills at a time,
    /// so a claim's rows (sent one by one) make one batch rather than a part for every thread
    /// waiting, each part settled by a statement of its own and freeing a part of a claim.
    filling: parking_lot::Mutex<()>,
    ctx: Arc<Ctx>,
    /// Disconnected once every claim worker has ended.
    exited: Receiver<()>,
    /// `close` or `shutdown` already waited for the workers: a drop after them does not wait
    /// again for one stuck on a server that stopped answering.
    waited: AtomicBool,
    /// Its heartbeat (`sqlbroker_workers`), until it stops.
    membership: parking_lot::Mutex<Option<Membership>>,
    /// The claim workers it started (none for `testing::drain`'s).
    claim_workers: usize,
}

impl Subscription {
    /// Blocks until a delivery arrives; `None` once the subscription is closed, by
    /// [`close`](Subscription::close) or by an error: [`closed_by`](Subscription::closed_by)
    /// tells which.
    pub fn next_delivery(&self) -> Option<Delivery> {
        if self.ctx.stopped() {
            return None;
        }
        if let Some(d) = self.claim_here(1, None).pop() {
            return Some(d);
        }
        let _waiting = Waiting::new(&self.ctx);
        loop {
            match self.rx.recv_timeout(Duration::from_millis(100)) {
                Ok(d) => match self.fresh(d) {
                    Fresh::Ready(d) => return Some(d),
                    Fresh::Stale => {}
                    Fresh::Closed => return None,
                },
                Err(RecvTimeoutError::Disconnected) => return None,
                Err(RecvTimeoutError::Timeout) if self.ctx.stopped() => return None,
                Err(RecvTimeoutError::Timeout) => {}
            }
        }
    }

    /// Waits up to `timeout`: [`NextError::Timeout`] if nothing arrived,
    /// [`NextError::Closed`] once the subscription is closed.
    ///
    /// Returns within `timeout` plus a few milliseconds (the statement that got its lock just
    /// in time, and thread scheduling), even while another session or process holds a lock a
    /// claim waits on: see [`next_batch`](Subscription::next_batch) for how.
    pub fn next_delivery_timeout(&self, timeout: Duration) -> Result<Delivery, NextError> {
        if self.ctx.stopped() {
            return Err(NextError::Closed);
        }
        let bound = Bound::of(timeout);
        if let Some(d) = self.claim_here(1, bound).pop() {
            return Ok(d);
        }
        self.wait_one(Bound::left(bound, timeout))
    }

    /// Waits up to `timeout` for a delivery from the channel.
    fn wait_one(&self, timeout: Duration) -> Result<Delivery, NextError> {
        let _waiting = Waiting::new(&self.ctx);
        let by = Instant::now().checked_add(timeout);
        loop {
            let left = by.map_or(timeout, |b| b.saturating_duration_since(Instant::now()));
            match self.rx.recv_timeout(left) {
                Ok(d) => match self.fresh(d) {
                    Fresh::Ready(d) => return Ok(d),
                    Fresh::Stale => {}
                    Fresh::Closed => return Err(NextError::Closed),
                },
                Err(RecvTimeoutError::Timeout) if self.ctx.stopped() => {
                    return Err(NextError::Closed)
                }
                Err(RecvTimeoutError::Timeout) => return Err(NextError::Timeout),
                Err(RecvTimeoutError::Disconnected) => return Err(NextError::Closed),
            }
        }
    }

    /// The channel the claim workers fill: a [`Worker`](crate::Worker)'s idle threads wait
    /// on several subscriptions' at once (and then take with `try_next_delivery`).
    pub(crate) fn receiver(&self) -> &Receiver<Delivery> {
        &self.rx
    }

    /// A delivery that is ready now, without waiting: [`NextError::Empty`] if none is,
    /// [`NextError::Closed`] once the subscription is closed. It never claims (so never waits
    /// on the database, or on a lock another session holds): it takes what the claim workers
    /// have queued.
    pub fn try_next_delivery(&self) -> Result<Delivery, NextError> {
        if self.ctx.stopped() {
            return Err(NextError::Closed);
        }
        loop {
            return match self.rx.try_recv() {
                Ok(d) => match self.fresh(d) {
                    Fresh::Ready(d) => Ok(d),
                    Fresh::Stale => continue,
                    Fresh::Closed => Err(NextError::Closed),
                },
                Err(TryRecvError::Empty) => Err(NextError::Empty),
                Err(TryRecvError::Disconnected) => Err(NextError::Closed),
            };
        }
    }

    /// Up to `max` deliveries. With nothing queued, it claims on the calling thread (no
    /// hand-off between threads); otherwise it waits up to `timeout` for the first. Then it
    /// takes those ready now, and, while a claim is in progress or its rows are on their way,
    /// waits for them up to 10 ms more (so a batch is one claim's rows, settled in one
    /// statement, rather than part of one). Calls on several threads fill their batches one
    /// at a time, so a claim's rows reach one caller together rather than a few to each.
    /// [`NextError::Timeout`] if none arrived,
    /// [`NextError::Closed`] once the subscription is closed. Settle them one by one, or together with
    /// [`Delivery::ack_all`] (one statement for a lease table). A claim takes up to
    /// [`batch_size`](SubscriptionBuilder::batch_size) rows, so a batch this large needs a
    /// batch size (and `max_in_flight`) at least as large.
    ///
    /// Returns within `timeout` plus a few milliseconds (the statement that got its lock just
    /// in time, and thread scheduling), even while another session or process holds a lock a
    /// claim waits on (SQLite's write lock, a table lock on a server), and the 10 ms above
    /// never extend it. The claim on the calling thread is bounded by the time left:
    ///
    /// - SQLite: it waits for the write lock (SQLite's busy timeout, and this process's
    ///   writer lock) only until the timeout, then gives up, having taken nothing, and wakes a
    ///   claim worker to wait for the lock instead;
    /// - PostgreSQL and MySQL/MariaDB: a lock timeout per claim would cost a round trip, so
    ///   the calling thread claims only when `timeout` is at least the broker's
    ///   [`statement_timeout`](crate::BrokerBuilder::statement_timeout), which bounds every
    ///   claim (one round trip more is the slack then); with a shorter timeout it wakes a claim
    ///   worker instead and waits for its rows (a URL whose `options` set a longer
    ///   `lock_timeout` than the statement timeout loosens this bound).
    pub fn next_batch(&self, max: usize, timeout: Duration) -> Result<Vec<Delivery>, NextError> {
        if self.ctx.stopped() {
            return Err(NextError::Closed);
        }
        // At least one, as ever.
        let max = max.max(1);
        let bound = Bound::of(timeout);
        // With nothing queued, a claim of this thread's own starts the batch: no row waits for
        // a hand-off.
        let mut batch = self.claim_here(max, bound);
        if batch.len() >= max {
            return Ok(batch);
        }
        // One call fills from the channel at a time. A call that claimed rows itself does not
        // wait for another's fill: it tops its batch up only if no other call is filling.
        let filling = match (batch.is_empty(), bound) {
            (false, _) => self.filling.try_lock(),
            (true, Some(b)) => self.filling.try_lock_until(b.by),
            (true, None) => Some(self.filling.lock()),
        };
        let Some(_filling) = filling else {
            if !batch.is_empty() {
                return Ok(batch);
            }
            // Another call was filling its batch for all of the time given.
            return Err(if self.ctx.stopped() {
                NextError::Closed
            } else {
                NextError::Timeout
            });
        };
        if batch.is_empty() {
            batch.push(self.wait_one(Bound::left(bound, timeout))?);
        }
        let filled_by = match bound {
            Some(b) => b.by.min(Instant::now() + BATCH_FILL),
            None => Instant::now() + BATCH_FILL,
        };
        // The rest of the batch is taken off the channel first and handed out together (one
        // update of the handler slots for all of them, not one per row).
        let mut taken = Vec::with_capacity(max.saturating_sub(batch.len()));
        while batch.len() + taken.len() < max && !self.ctx.stopped() {
            match self.rx.try_recv() {
                Ok(d) => taken.push(d),
                Err(TryRecvError::Empty) => {
                    // A claim in progress, or one whose rows are still being sent, is most of
                    // a batch on its way: wait for it briefly rather than settle a part.
                    let ctx = &self.ctx;
                    let coming = ctx.claiming.load(Ordering::Acquire) > 0
                        || ctx.sending.load(Ordering::Acquire) > 0;
                    let left = filled_by.saturating_duration_since(Instant::now());
                    if !coming || left.is_zero() {
                        break;
                    }
                    match self.rx.recv_timeout(left.min(Duration::from_millis(1))) {
                        Ok(d) => taken.push(d),
                        Err(RecvTimeoutError::Timeout) => {}
                        Err(RecvTimeoutError::Disconnected) => break,
                    }
                }
                Err(TryRecvError::Disconnected) => break,
            }
        }
        self.ctx.slots.dequeue_many(taken.len());
        if self.ctx.stopped() {
            // Not handed out: dropping them hands their rows back unspent.
            drop(taken);
            self.drain();
        } else {
            // A row whose lease ran out while it waited here is another holder's by now.
            let (stale, live): (Vec<Delivery>, Vec<Delivery>) =
                taken.into_iter().partition(Delivery::lease_expired);
            drop(stale);
            batch.extend(live.into_iter().map(Delivery::hand_out));
        }
        Ok(batch)
    }

    /// Runs `handler` on `threads` threads of its own (`sqlbroker-run-<table>-<n>`) over every
    /// delivery until the subscription is closed, then returns once every handler in progress
    /// has finished; what it did, counted. For the common loop: [`next_delivery`] stays for a
    /// loop of one's own.
    ///
    /// Each delivery is settled by what `handler` returns: `Ok(())` (or `Ok(Outcome::Ack)`)
    /// acks it; `Ok(`[`Outcome`]`)` dead-letters, retries after a delay or cancels it as the
    /// outcome says; `Err` or a panic fails it ([`Delivery::fail`]: the
    /// [`retry_policy`](SubscriptionBuilder::retry_policy), then a dead letter with the
    /// error's text once the attempts are spent). A panic never ends the thread, and the row is
    /// never lost. (A closure that only ever returns `Err` names its `Ok` type:
    /// `Err::<(), _>(e)`.)
    ///
    /// Stop it with [`close`](Subscription::close) from another thread, or from a handler (it
    /// may capture a reference to the subscription); then [`shutdown`](Subscription::shutdown)
    /// as usual.
    ///
    /// `threads` is the number of handlers running at once, from 1 to 1,024; another count is
    /// refused with [`BrokerError::InvalidOption`] and nothing runs. It is independent of the
    /// builder's [`workers`](SubscriptionBuilder::workers), the threads that claim rows and
    /// hand them over: run threads also claim for themselves when nothing is waiting, so a
    /// few workers serve many run threads (how many rows wait in between is
    /// [`max_in_flight`](SubscriptionBuilder::max_in_flight)).
    ///
    /// [`next_delivery`]: Subscription::next_delivery
    ///
    /// ```
    /// use sqlbroker::{Broker, Message, Table};
    /// use std::time::Duration;
    ///
    /// let broker = Broker::connect("sqlite::memory:")?;
    /// let jobs = Table::new("jobs").lease(Duration::from_secs(30));
    /// broker.create_table(&jobs)?;
    /// broker.publish(&jobs, Message::new(b"hello".to_vec()))?;
    /// let sub = broker.subscription(&jobs).start()?;
    /// let ran = sub.run(4, |d| {
    ///     assert_eq!(d.payload(), b"hello");
    ///     sub.close(); // one job is all this example has
    ///     Ok::<(), std::io::Error>(())
    /// })?;
    /// assert_eq!(ran.acked, 1);
    /// # Ok::<(), sqlbroker::BrokerError>(())
    /// ```
    pub fn run<O, E, F>(&self, threads: usize, handler: F) -> Result<Ran>
    where
        O: Into<Outcome>,
        E: std::fmt::Display,
        F: Fn(&Delivery) -> std::result::Result<O, E> + Sync,
    {
        if !(1..=MAX_RUN_THREADS).contains(&threads) {
            return Err(BrokerError::InvalidOption {
                option: "run",
                reason: format!("from 1 to {MAX_RUN_THREADS} threads, not {threads}"),
            });
        }
        let ran = parking_lot::Mutex::new(Ran::default());
        let (handler, ran_ref) = (&handler, &ran);
        std::thread::scope(|scope| {
            for i in 0..threads {
                let name = format!("sqlbroker-run-{}-{i}", self.ctx.spec().name);
                let spawned = std::thread::Builder::new()
                    .name(name)
                    .spawn_scoped(scope, move || self.run_one(handler, ran_ref));
                if let Err(e) = spawned {
                    log::error!(
                        "table {}: a runner thread could not start: {e}",
                        self.ctx.spec().name
                    );
                    break;
                }
            }
        });
        Ok(ran.into_inner())
    }

    /// One runner thread: handle and settle until the subscription is closed.
    fn run_one<O, E, F>(&self, handler: &F, ran: &parking_lot::Mutex<Ran>)
    where
        O: Into<Outcome>,
        E: std::fmt::Display,
        F: Fn(&Delivery) -> std::result::Result<O, E>,
    {
        while let Some(d) = self.next_delivery() {
            outcome::handle(d, handler, ran, &self.ctx.spec().name);
        }
    }

    /// A blocking iterator over deliveries; it ends when the subscription is closed.
    pub fn iter(&self) -> Iter<'_> {
        Iter { sub: self }
    }

    /// Claim workers inside a claim right now (or, on MySQL, its idle readiness check). A claim
    /// takes milliseconds: a count that stays up points at a database that does not answer (or
    /// a lock a claim waits on).
    pub fn claiming(&self) -> usize {
        self.ctx.claiming.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Its context.
    pub(crate) fn ctx(&self) -> &Arc<Ctx> {
        &self.ctx
    }

    /// The claim workers it started.
    pub(crate) fn claim_workers(&self) -> usize {
        self.claim_workers
    }

    /// Its context, for a worker's heartbeat (which must not keep it alive).
    pub(crate) fn ctx_weak(&self) -> std::sync::Weak<Ctx> {
        Arc::downgrade(&self.ctx)
    }

    /// Rows claimed and not yet settled, counting those waiting to be handed out.
    pub fn in_flight(&self) -> usize {
        self.ctx.slots.in_flight()
    }

    /// Lease acks of this table on this broker written by group commit so far: (statements,
    /// acks). For tests that check acks arriving together share a statement; not a stable API.
    #[doc(hidden)]
    pub fn grouped_acks(&self) -> (u64, u64) {
        self.ctx.queue.acks.stats()
    }

    /// The error that closed the subscription, if an error did: a table whose columns no
    /// longer match, a claim worker that panicked. `None` while it is open and after a plain
    /// [`close`](Subscription::close) or [`shutdown`](Subscription::shutdown). Ask it when
    /// [`next_delivery`](Subscription::next_delivery) returns `None` (or the others return
    /// [`NextError::Closed`]) to tell a failure from a close: unlike
    /// [`last_error`](Subscription::last_error), it is never cleared.
    pub fn closed_by(&self) -> Option<Arc<BrokerError>> {
        self.ctx.closed_by()
    }

    /// The last error the claim workers or the renewer met, until a claim succeeds again
    /// (a server that is down, a panic that closed the subscription), typed: match on it, or
    /// ask [`is_transient`](BrokerError::is_transient). Shared (`Arc`), since the subscription
    /// keeps it too.
    pub fn last_error(&self) -> Option<Arc<BrokerError>> {
        self.ctx.last_error()
    }

    /// True once the subscription is closed.
    pub fn is_closed(&self) -> bool {
        self.ctx.stopped()
    }

    /// Stops claiming and hands back the rows claimed but not handed out: they are claimable
    /// again at once, their attempts unspent. Waiters get `None`. Deliveries already handed out
    /// stay valid and should still be settled.
    ///
    /// Waits for the claim workers (each ends within one statement) at most the broker's
    /// statement timeout and a second; one stuck on a server that stopped answering is left to
    /// end on its own, and hands back what it claims then.
    ///
    /// With [`AckMode::Deferred`], also writes the acks queued so far (waiting at most the
    /// statement timeout for them); acks of deliveries settled later are written by the
    /// subscription's ack thread as usual.
    pub fn close(&self) {
        self.stop_until(Instant::now() + self.ctx.queue.statement_timeout + JOIN_MARGIN);
        self.write_acks();
    }

    /// Writes the deferred acks queued so far, at most the statement timeout.
    fn write_acks(&self) {
        if !self.ctx.flush_acks(self.ctx.queue.statement_timeout) {
            log::warn!(
                "table {}: deferred acks still unwritten after the statement timeout; their \
                 rows return when their leases end",
                self.ctx.spec().name
            );
        }
    }

    /// Stops claiming, hands back the rows not handed out (as [`close`](Subscription::close)),
    /// waits up to `grace` for the deliveries handed out to be settled, writes the deferred
    /// acks queued ([`AckMode::Deferred`]), then stops renewing this subscription's leases.
    /// Returns within `grace` plus the broker's statement timeout (deferred acks: plus one
    /// more statement timeout for their write).
    ///
    /// [`BrokerError::Unsettled`] if deliveries were still unsettled after `grace`: their
    /// leases are no longer renewed (the rows return when they expire, and a late settlement
    /// may get `LeaseLost`); row lock and advisory deliveries keep their rows until settled or
    /// dropped.
    pub fn shutdown(&self, grace: Duration) -> Result<()> {
        let start = Instant::now();
        let deadline = start.checked_add(grace);
        let workers_by = deadline
            .and_then(|d| d.checked_add(self.ctx.queue.statement_timeout))
            .unwrap_or(start + Duration::from_secs(86_400));
        self.stop_until(workers_by);
        let idle = match deadline {
            Some(d) => self
                .ctx
                .slots
                .wait_idle(d.saturating_duration_since(Instant::now())),
            None => self.ctx.slots.wait_idle(grace),
        };
        // Deferred acks of the deliveries settled in the grace, written while their leases
        // are still renewed.
        self.write_acks();
        self.ctx.stop_renewing();
        if idle {
            return Ok(());
        }
        Err(BrokerError::Unsettled {
            table: self.ctx.spec().name.clone(),
            unsettled: self.ctx.slots.in_flight(),
        })
    }

    /// Stops the workers, waits for them until `deadline`, and hands back what is queued.
    fn stop_until(&self, deadline: Instant) {
        self.ctx.stop();
        drop(self.membership.lock().take());
        self.drain();
        if !self.waited.swap(true, Ordering::AcqRel) {
            // Disconnected once every worker has ended; nothing is ever sent.
            let _ = self.exited.recv_deadline(deadline);
        }
        // Whatever a worker sent before it ended.
        self.drain();
    }

    /// With nothing queued, claims on the calling thread instead of waiting for a worker to
    /// claim and send: two thread hand-offs less per delivery (the row to the handler, its slot
    /// back to the worker), which are most of a cycle's cost on SQLite and with one-row claims.
    /// The first `take` rows are this caller's, handed out; the rest are queued for the others.
    /// Skipped while the claims in progress may bring enough rows for every caller waiting
    /// (this one included), when no connection is idle, and after an empty claim until a
    /// publish or the poll interval; an error is left to the workers, which retry and report
    /// it.
    ///
    /// `bound`, the caller's timeout: the claim gives up at its deadline where the database
    /// lets a claim's lock waits be limited at no cost (SQLite), having taken nothing, and
    /// a worker waits for the lock instead; where it
    /// does not (the servers), a timeout shorter than the statement timeout hands the claim
    /// to a worker instead (a wake-up), since a blocked statement could outlast it.
    fn claim_here(&self, take: usize, bound: Option<Bound>) -> Vec<Delivery> {
        let ctx = &self.ctx;
        let take = take.clamp(1, ctx.opts.batch);
        let coming = ctx.claiming.load(Ordering::Acquire) * ctx.opts.batch;
        let wanted = (ctx.waiting.load(Ordering::Acquire) + 1) * take;
        if !self.rx.is_empty() || coming >= wanted || ctx.queue.pool.state().idle_connections == 0 {
            return Vec::new();
        }
        // A paused table, or a pause flag due for a read: left to the workers.
        if !ctx.queue.wake.pause.running(ctx.opts.poll_interval) {
            return Vec::new();
        }
        let seq = ctx.queue.wake.seq();
        // Copied out: the lock is taken again below.
        let idle_here = *self.idle_here.lock();
        if let Some((at, seen)) = idle_here {
            if seen == seq && at.elapsed() < ctx.opts.poll_interval {
                return Vec::new();
            }
            // Woken by any commit (SQLite): a read says whether a claim, a write, is worth it.
            if ctx.queue.dialect.wakes_on_every_commit() && claimer::nothing_ready(ctx) {
                *self.idle_here.lock() = Some((Instant::now(), seq));
                return Vec::new();
            }
        }
        let by = match bound {
            Some(b)
                if b.timeout < ctx.queue.statement_timeout
                    && !ctx.queue.dialect.bounds_claim_waits() =>
            {
                // A worker claims instead; no other hand-off before a publish or the poll
                // interval (a worker that finds rows claims again until it finds none).
                ctx.queue.wake.notify(1);
                *self.idle_here.lock() = Some((Instant::now(), ctx.queue.wake.seq()));
                return Vec::new();
            }
            Some(b) => Some(b.by),
            None => None,
        };
        let Some(slots) = ctx.slots.try_take(ctx.opts.batch) else {
            return Vec::new();
        };
        ctx.claiming.fetch_add(1, Ordering::AcqRel);
        let started = Instant::now();
        let claimed = form::claim(ctx, slots.count(), by);
        ctx.claiming.fetch_sub(1, Ordering::AcqRel);
        let gave_up = by.is_some()
            && ctx.queue.dialect.bounds_claim_waits()
            && claimed.as_ref().is_err_and(|e| e.is_transient());
        if gave_up {
            // No failure: a worker waits for the lock instead (and reports what it meets).
            ctx.queue.wake.notify(1);
        } else {
            claimer::report(ctx, &claimed, started.elapsed());
        }
        let Ok(claimed) = claimed else {
            return Vec::new();
        };
        let (mut fresh, dead) = claimer::sort(ctx, claimed, slots);
        *self.idle_here.lock() = fresh.is_empty().then(|| (Instant::now(), seq));
        let rest = fresh.split_off(take.min(fresh.len()));
        ctx.slots.enqueue(rest.len());
        ctx.sending.fetch_add(1, Ordering::AcqRel);
        for d in rest {
            // The slot is the delivery's; a failed send drops it, which hands the row back.
            let _ = self.tx.send(d);
        }
        ctx.sending.fetch_sub(1, Ordering::AcqRel);
        claimer::bury(ctx, dead);
        if ctx.stopped() {
            // Dropped before they were handed out: the rows go back unspent.
            return Vec::new();
        }
        fresh.into_iter().map(Delivery::hand_out).collect()
    }

    /// Claims up to `max` rows (at most the batch size) on the calling thread now, whatever
    /// else is queued or claiming: `testing::drain`, on a subscription started
    /// [`without_claim_workers`](SubscriptionBuilder::without_claim_workers), where nothing
    /// else claims. Each claim reads from the head of the claim order (the cursor rewound), so
    /// a row made due behind the cursor is not passed by: a claim that takes nothing means no
    /// row is claimable now. A paused table claims nothing.
    ///
    /// Returns how many rows the claim took, and the deliveries of those to be handled, not yet
    /// handed out (dropping one hands its row back, its attempt unspent); the rest were
    /// dead-lettered at claim (past `max_attempts`, unreadable) or ended as cancelled, as a
    /// claim worker does.
    #[cfg_attr(not(feature = "testing"), allow(dead_code))]
    pub(crate) fn claim_on_caller(&self, max: usize) -> Result<(usize, Vec<Delivery>)> {
        let ctx = &self.ctx;
        let closed = || BrokerError::Closed {
            table: ctx.spec().name.clone(),
        };
        if ctx.stopped() {
            return Err(closed());
        }
        if claimer::paused_now(ctx)? {
            return Ok((0, Vec::new()));
        }
        let Some(slots) = ctx.slots.try_take(max.clamp(1, ctx.opts.batch)) else {
            // Every slot is held by a delivery not yet settled: nothing more may be claimed.
            return Err(closed());
        };
        ctx.cursor.rewind();
        ctx.claiming.fetch_add(1, Ordering::AcqRel);
        let started = Instant::now();
        let claimed = form::claim(ctx, slots.count(), None);
        ctx.claiming.fetch_sub(1, Ordering::AcqRel);
        claimer::report(ctx, &claimed, started.elapsed());
        let claimed = claimed?;
        let rows = claimed.len();
        let (fresh, dead) = claimer::sort(ctx, claimed, slots);
        claimer::bury(ctx, dead);
        Ok((rows, fresh))
    }

    /// Hands a delivery out, unless the subscription closed meanwhile (then the row goes back).
    /// A delivery taken off the channel, handed out: unless the subscription is closed (then
    /// it and the rest go back), or (lease form) its lease ran out while it waited there (a
    /// process frozen past it, a handler pool far behind): the row may be another holder's,
    /// maybe finished by now, so no handler starts it; it is dropped unhanded, which gives the
    /// row back if it is still this holder's.
    fn fresh(&self, d: Delivery) -> Fresh {
        self.ctx.slots.dequeue();
        if self.ctx.stopped() {
            drop(d);
            self.drain();
            return Fresh::Closed;
        }
        if d.lease_expired() {
            drop(d);
            return Fresh::Stale;
        }
        Fresh::Ready(d.hand_out())
    }

    fn drain(&self) {
        while let Ok(d) = self.rx.try_recv() {
            // Not handed out: dropping it hands the row back unspent.
            drop(d);
        }
    }
}

/// What [`Subscription::fresh`] made of a delivery taken off the channel. (Returned at once
/// and matched: the size of the delivery it carries costs nothing worth a box.)
#[allow(clippy::large_enum_variant)]
enum Fresh {
    Ready(Delivery),
    /// Its lease ran out while it waited: dropped, take the next.
    Stale,
    Closed,
}

/// A caller's timeout and its deadline (`None` where the deadline overflows: unbounded).
#[derive(Clone, Copy)]
struct Bound {
    by: Instant,
    timeout: Duration,
}

impl Bound {
    fn of(timeout: Duration) -> Option<Bound> {
        let by = Instant::now().checked_add(timeout)?;
        Some(Bound { by, timeout })
    }

    /// The time left of `bound`, or all of `timeout` without one.
    fn left(bound: Option<Bound>, timeout: Duration) -> Duration {
        bound.map_or(timeout, |b| b.by.saturating_duration_since(Instant::now()))
    }
}

/// A handler thread waiting for a delivery, counted while it waits ([`Ctx::waiting`]).
struct Waiting<'a>(&'a Ctx);

impl<'a> Waiting<'a> {
    fn new(ctx: &'a Ctx) -> Self {
        ctx.waiting.fetch_add(1, Ordering::AcqRel);
        Waiting(ctx)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        // As `close`: no claim starts after the drop.
        self.close();
    }
}

impl std::fmt::Debug for Subscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscription")
            .field("table", &self.ctx.spec().name)
            .field("in_flight", &self.in_flight())
            .field("closed", &self.is_closed())
            .finish()
    }
}

/// The most threads [`Subscription::run`] starts.
const MAX_RUN_THREADS: usize = 1024;

/// Blocking iterator over a subscription's deliveries ([`Subscription::iter`]).
///
/// ```
/// use sqlbroker::{Broker, Message, Table};
///
/// let broker = Broker::connect("sqlite::memory:")?;
/// let t = Table::new("jobs").lease(std::time::Duration::from_secs(30));
/// broker.create_table(&t)?;
/// broker.publish(&t, Message::new(b"last".to_vec()))?;
/// let sub = broker.subscription(&t).start()?;
/// for d in &sub {
///     let last = d.payload() == b"last";
///     d.ack()?;
///     if last {
///         sub.close(); // the iterator ends
///     }
/// }
/// # Ok::<(), sqlbroker::BrokerError>(())
/// ```
#[derive(Debug)]
pub struct Iter<'a> {
    sub: &'a Subscription,
}

impl Iterator for Iter<'_> {
    type Item = Delivery;

    fn next(&mut self) -> Option<Delivery> {
        self.sub.next_delivery()
    }
}

impl<'a> IntoIterator for &'a Subscription {
    type Item = Delivery;
    type IntoIter = Iter<'a>;

    fn into_iter(self) -> Iter<'a> {
        self.iter()
    }
}

/// The tables of a heartbeat (`sqlbroker_workers`), as JSON: each table's name and the
/// queues and kinds it takes (`null`: every one).
pub(crate) fn fleet_tables<'x>(
    tables: impl IntoIterator<Item = (&'x str, &'x ClaimOnly)>,
) -> String {
    let list: Vec<serde_json::Value> = tables
        .into_iter()
        .map(|(name, only)| {
            serde_json::json!({
                "table": name,
                "queues": only.queues,
                "kinds": only.kinds,
            })
        })
        .collect();
    serde_json::Value::Array(list).to_string()
}

/// What a heartbeat reports of these subscriptions: their rows in work, their settlements and
/// the last error one of them met (those that ended count no more).
pub(crate) fn report_of(ctxs: Vec<std::sync::Weak<Ctx>>) -> Box<dyn Fn() -> Report + Send + Sync> {
    Box::new(move || {
        let mut r = Report::default();
        for ctx in ctxs.iter().filter_map(std::sync::Weak::upgrade) {
            r.in_work += ctx.slots.in_flight() as u64;
            r.handled += ctx.settled.load(Ordering::Relaxed);
            r.stuck += ctx.marks.stuck_now();
            if let Some(e) = ctx.last_error() {
                r.last_error = Some(e.to_string());
            }
        }
        r
    })
}

impl Broker {
    /// Starts describing a subscription to `table`.
    pub fn subscription(&self, table: &Table) -> SubscriptionBuilder<'_> {
        let mut b = SubscriptionBuilder::new(self.queue(table), self.renewer(), self.listener());
        b.view = Some((self, table.clone()));
        b
    }
}
