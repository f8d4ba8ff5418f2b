//! What a [`Subscription::run`](crate::Subscription::run) handler says happened to its delivery.

use std::time::Duration;

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
