//! What a [`Subscription::run`](crate::Subscription::run) handler says happened to its delivery,
//! how the delivery is settled by it ([`handle`]: the one place of those rules, which `run` and
//! `testing::drain` share), and the counts of what was done ([`Ran`]).

use std::time::Duration;

use crate::consuming::delivery::Delivery;
use crate::error::Result;

/// What a [`Subscription::run`](crate::Subscription::run) handler says happened, returned as
/// `Ok(outcome)`; the runner settles the delivery by it. `Ok(())` converts into
/// [`Outcome::Ack`], so a handler that only acks or fails keeps returning `Ok(())`, and an
/// `Err` (or a panic) is still a failure retried by the subscription's
/// [`RetryPolicy`](crate::RetryPolicy).
///
/// Each variant is the runner calling one of the delivery's settlements, with its semantics in
/// every form (lease: fenced by the token; row lock: on the delivery's transaction; advisory:
/// under the row's key):
///
/// | variant | settlement | the row afterwards |
/// |---|---|---|
/// | `Ack` | [`Delivery::ack`](crate::Delivery::ack) | deleted (or kept completed) |
/// | `DeadLetter(reason)` | [`Delivery::dead_letter`](crate::Delivery::dead_letter) | dead, with `reason`, for the dead-letter tools |
/// | `RetryAfter(delay)` | [`Delivery::retry_after`](crate::Delivery::retry_after) | back after `delay` (whole seconds, rounded up), its attempt counted; dead-lettered instead on the table's last attempt |
/// | `Cancel` | [`Delivery::cancel`](crate::Delivery::cancel) | deleted (or kept completed and cancelled): no further attempts |
///
/// `RetryAfter` is a snooze that counts as an attempt, like every retry: a handler that
/// snoozes for ever still reaches [`Table::max_attempts`](crate::Table::max_attempts), which
/// is what keeps a poison row from circling unseen. Lift `max_attempts` for work that waits on
/// something for long.
///
/// ```
/// use sqlbroker::{Broker, Message, Outcome, Table};
/// use std::sync::atomic::{AtomicUsize, Ordering};
/// use std::time::Duration;
///
/// let broker = Broker::connect("sqlite::memory:")?;
/// let jobs = Table::new("jobs").text_column("kind").lease(Duration::from_secs(30));
/// broker.create_table(&jobs)?;
/// for kind in ["send", "malformed", "rate-limited", "obsolete"] {
///     broker.publish(&jobs, Message::new(Vec::new()).set("kind", kind))?;
/// }
/// let sub = broker.subscription(&jobs).start()?;
/// let handled = AtomicUsize::new(0);
/// let ran = sub.run(1, |d| {
///     if handled.fetch_add(1, Ordering::SeqCst) + 1 == 4 {
///         sub.close(); // four jobs are all this example has
///     }
///     Ok::<_, std::io::Error>(match d.get("kind").and_then(|v| v.as_str()) {
///         Some("malformed") => Outcome::DeadLetter("cannot parse".into()),
///         Some("rate-limited") => Outcome::RetryAfter(Duration::from_secs(60)),
///         Some("obsolete") => Outcome::Cancel,
///         _ => ().into(), // or Outcome::Ack
///     })
/// })?;
/// assert_eq!(
///     (ran.acked, ran.dead_lettered, ran.retried, ran.cancelled),
///     (1, 1, 1, 1)
/// );
/// # Ok::<(), sqlbroker::BrokerError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome {
    /// Done: acked.
    Ack,
    /// Out of the queue for good, with this reason: dead-lettered.
    DeadLetter(String),
    /// Back into the queue, not claimed before this delay from now; counted as an attempt.
    RetryAfter(Duration),
    /// No further attempts: the row is deleted (kept completed and cancelled on a table that
    /// keeps completed rows).
    Cancel,
}

impl From<()> for Outcome {
    /// `Ok(())` from a handler: [`Outcome::Ack`].
    fn from((): ()) -> Self {
        Outcome::Ack
    }
}

/// What [`Subscription::run`](crate::Subscription::run) did (and `testing::drain`, feature
/// `testing`): each delivery counted by how its handler ended it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Ran {
    /// Deliveries whose handler returned `Ok(())` or `Ok(Outcome::Ack)`, acked.
    pub acked: usize,
    /// Deliveries dead-lettered: the handler returned `Ok(Outcome::DeadLetter(..))`, or its
    /// attempt was the table's last and ended in a retry or a failure (then also counted by
    /// what ended it: `retried`, `failed`, `panicked`, `timed_out`). Every dead letter the
    /// settlements wrote, as the `sqlbroker_jobs_dead_lettered_total` metric counts them. (A
    /// retry or failure that an operator's earlier cancel of the job in work ends as cancelled
    /// is counted as the retry or failure: its statement does not say which it became.)
    pub dead_lettered: usize,
    /// Deliveries whose handler returned `Ok(Outcome::RetryAfter(..))`, retried after the
    /// delay (dead-lettered instead on the last attempt).
    pub retried: usize,
    /// Deliveries whose handler returned `Ok(Outcome::Cancel)`, cancelled.
    pub cancelled: usize,
    /// Deliveries whose handler returned `Err`, failed by the retry policy.
    pub failed: usize,
    /// Deliveries whose handler panicked, failed by the retry policy.
    pub panicked: usize,
    /// Settlements that returned an error (`LeaseLost`, a lost connection): logged.
    pub unsettled: usize,
    /// Deliveries whose handler ran past the
    /// [`handler_timeout`](crate::SubscriptionBuilder::handler_timeout): failed by the timeout (also
    /// counted by what the handler returned late).
    pub timed_out: usize,
    /// `testing::drain` only (feature `testing`): due jobs that a concurrency or rate limit
    /// held back when the drain ended, left unrun (`Drain::ignore_limits` runs them too); 0
    /// from [`Subscription::run`](crate::Subscription::run).
    pub limited: usize,
}

impl Ran {
    /// Adds `other`'s counts to these (a worker's counts by table and kind).
    pub(crate) fn add(&mut self, other: &Ran) {
        self.acked += other.acked;
        self.dead_lettered += other.dead_lettered;
        self.retried += other.retried;
        self.cancelled += other.cancelled;
        self.failed += other.failed;
        self.panicked += other.panicked;
        self.unsettled += other.unsettled;
        self.timed_out += other.timed_out;
        self.limited += other.limited;
    }
}

/// Runs `handler` on `d` and settles the delivery by what it returned, counted in `ran`: the
/// outcome rules of [`Subscription::run`](crate::Subscription::run), for each of its threads
/// and for `testing::drain` on the calling thread.
///
/// `Ok(outcome)` settles as [`Outcome`] says; `Err(e)` fails the delivery with `e`'s text
/// ([`Delivery::fail`]: the retry policy, or a dead letter once the attempts are spent); a
/// panic is caught and fails it likewise (the thread goes on). A settlement that returns an
/// error is counted as `unsettled` and logged (a handler timeout's as `timed_out`).
pub(crate) fn handle<O, E>(
    d: Delivery,
    handler: impl FnOnce(&Delivery) -> std::result::Result<O, E>,
    ran: &parking_lot::Mutex<Ran>,
    table: &str,
) where
    O: Into<Outcome>,
    E: std::fmt::Display,
{
    #[cfg(feature = "tracing")]
    let _span =
        crate::runtime::trace::process_span(table, d.id(), d.attempt(), d.traceparent()).entered();
    // On the last attempt a retry or a failure is a dead letter: counted as one once written.
    let last = d.last_attempt();
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| handler(&d)));
    let (settled, retried) = match outcome {
        Ok(Ok(said)) => {
            let said = said.into();
            let retried = matches!(said, Outcome::RetryAfter(_));
            (settle_as(d, said, ran), retried)
        }
        Ok(Err(e)) => {
            ran.lock().failed += 1;
            (d.fail(e), true)
        }
        Err(panic) => {
            ran.lock().panicked += 1;
            let msg = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".into());
            (d.fail(format!("the handler panicked: {msg}")), true)
        }
    };
    match settled {
        Ok(()) if retried && last => ran.lock().dead_lettered += 1,
        Ok(()) => {}
        // The timeout failed the delivery: on the last attempt, a dead letter.
        Err(e) if e.is_handler_timeout() => {
            let mut ran = ran.lock();
            ran.timed_out += 1;
            if last {
                ran.dead_lettered += 1;
            }
        }
        Err(e) => {
            ran.lock().unsettled += 1;
            log::warn!("table {table}: {e}");
        }
    }
}

/// Settles `d` as its handler said, counting the outcome.
fn settle_as(d: Delivery, said: Outcome, ran: &parking_lot::Mutex<Ran>) -> Result<()> {
    match said {
        Outcome::Ack => {
            ran.lock().acked += 1;
            d.ack()
        }
        Outcome::DeadLetter(reason) => {
            ran.lock().dead_lettered += 1;
            d.dead_letter(reason)
        }
        Outcome::RetryAfter(delay) => {
            ran.lock().retried += 1;
            d.retry_after(delay)
        }
        Outcome::Cancel => {
            ran.lock().cancelled += 1;
            d.cancel()
        }
    }
}
