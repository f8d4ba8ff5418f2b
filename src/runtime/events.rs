//! Hooks for metrics: what a subscription does, as it happens, with durations, for
//! Prometheus, OpenTelemetry or a log of one's own.

use std::time::Duration;

use crate::error::BrokerError;

/// What a subscription reports as it works ([`SubscriptionBuilder::events`]). Every method
/// has a no-op default: implement those you need.
///
/// They run on the library's threads (claim workers, the handler timeout's timer, the deferred
/// acks' writer) and on the
/// handler's own thread inside a settlement, after the database answered: keep them quick
/// (count, observe a histogram) and never block on I/O.
///
/// ```
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use std::sync::Arc;
/// use sqlbroker::{Broker, Events, Message, Settled, Table};
///
/// #[derive(Default)]
/// struct Counts {
///     acked: AtomicU64,
/// }
///
/// impl Events for Counts {
///     fn acked(&self, e: &Settled<'_>) {
///         self.acked.fetch_add(1, Ordering::Relaxed);
///         let _handler_time = e.handled_for; // a histogram, say
///     }
/// }
///
/// let broker = Broker::connect("sqlite::memory:")?;
/// let jobs = Table::new("jobs").lease(std::time::Duration::from_secs(30));
/// broker.create_table(&jobs)?;
/// broker.publish(&jobs, Message::new(b"x".to_vec()))?;
/// let counts = Arc::new(Counts::default());
/// let sub = broker.subscription(&jobs).events(counts.clone()).start()?;
/// sub.next_delivery().unwrap().ack()?;
/// assert_eq!(counts.acked.load(Ordering::Relaxed), 1);
/// # Ok::<(), sqlbroker::BrokerError>(())
/// ```
///
/// [`SubscriptionBuilder::events`]: crate::SubscriptionBuilder::events
pub trait Events: Send + Sync {
    /// A claim took rows (not called for a claim that found none).
    fn claimed(&self, _event: &ClaimedRows<'_>) {}
    /// A claim failed; the worker tries again with a backoff.
    fn claim_failed(&self, _event: &ClaimFailed<'_>) {}
    /// A delivery was acked.
    fn acked(&self, _event: &Settled<'_>) {}
    /// A delivery went back for another attempt (a retry, a failure by the retry policy, a
    /// drop, a handler timeout).
    fn retried(&self, _event: &Settled<'_>) {}
    /// A delivery was dead-lettered (`reason` says why).
    fn dead_lettered(&self, _event: &Settled<'_>) {}
    /// A delivery was cancelled ([`Delivery::cancel`](crate::Delivery::cancel), or a handler's
    /// [`Outcome::Cancel`](crate::Outcome::Cancel)): no further attempts.
    fn cancelled(&self, _event: &Settled<'_>) {}
    /// A lease settlement found the lease gone (`LeaseLost`).
    fn lease_lost(&self, _event: &Settled<'_>) {}
    /// A deferred ack ([`AckMode::Deferred`](crate::AckMode::Deferred)) could not be written:
    /// its `ack()` had returned `Ok`, the row is delivered again (see the event).
    fn ack_failed(&self, _event: &AckFailed<'_>) {}
    /// A handler still runs [`stuck_after`](crate::SubscriptionBuilder::stuck_after) after its
    /// delivery was handed out: reported once per delivery, whether or not its handler timeout
    /// already freed the row.
    fn stuck(&self, _event: &Stuck<'_>) {}
}

/// A handler reported stuck ([`Events::stuck`]).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Stuck<'a> {
    /// The table.
    pub table: &'a str,
    /// The row.
    pub id: i64,
    /// The delivery's attempt.
    pub attempt: u32,
    /// How long the handler has run (from handing the delivery out).
    pub running_for: Duration,
    /// Its handler timeout already failed it (the row is free, or another's).
    pub timed_out: bool,
}

/// A deferred ack that its flush could not write. The row keeps its last error (when the
/// database takes that write) and is delivered again: after the retry policy's delay if that
/// write went through, else once its lease ends.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct AckFailed<'a> {
    /// The table.
    pub table: &'a str,
    /// The row.
    pub id: i64,
    /// The delivery's attempt.
    pub attempt: u32,
    /// Why the flush failed.
    pub error: &'a BrokerError,
}

/// A claim that took rows.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ClaimedRows<'a> {
    /// The table.
    pub table: &'a str,
    /// Rows taken.
    pub rows: usize,
    /// Their ids, as the claim returned them: the hook runs before any of them reaches a
    /// handler, so it can time each row from its claim.
    pub ids: &'a [i64],
    /// How long the claim took.
    pub took: Duration,
}

/// A claim that failed.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ClaimFailed<'a> {
    /// The table.
    pub table: &'a str,
    /// Why.
    pub error: &'a BrokerError,
    /// How long the claim took before it failed.
    pub took: Duration,
}

/// A delivery settled.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Settled<'a> {
    /// The table.
    pub table: &'a str,
    /// The row.
    pub id: i64,
    /// The delivery's attempt (1 on the first).
    pub attempt: u32,
    /// From handing the delivery out to the settlement: the handler's time (zero for a row
    /// settled before any handler saw it, such as a dead letter at claim).
    pub handled_for: Duration,
    /// How long the settlement took on the database.
    pub took: Duration,
    /// The dead letter's reason.
    pub reason: Option<&'a str>,
}
