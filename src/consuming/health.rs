//! A subscription's health as its own threads tell it ([`Subscription::health`]): for a
//! process's liveness and readiness checks, and for the operator asking why a service claims
//! nothing.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::consuming::subscription::Subscription;
use crate::error::BrokerError;

/// What a subscription says of itself ([`Subscription::health`]): read from marks its threads
/// leave as they go, without a round trip, so asking is free and never waits on a database.
#[derive(Debug, Clone)]
pub struct Health {
    open: bool,
    workers: usize,
    workers_running: usize,
    last_claim: Option<SystemTime>,
    last_error: Option<Arc<BrokerError>>,
    lease: Option<Duration>,
    last_renewal: Option<SystemTime>,
    stuck: u64,
    in_flight: usize,
}

impl Health {
    /// Not closed, and every claim worker it started still runs (none ended by a panic).
    pub fn claim_loop_alive(&self) -> bool {
        self.open && self.workers_running >= self.workers
    }

    /// The claim workers started, and how many run now.
    pub fn workers(&self) -> (usize, usize) {
        (self.workers, self.workers_running)
    }

    /// When a claim (or the cheap check before one) last answered, rows or none; `None`
    /// before the first.
    pub fn last_claim(&self) -> Option<SystemTime> {
        self.last_claim
    }

    /// The last error the claim workers or the renewer met, until a claim succeeded again.
    pub fn last_error(&self) -> Option<&Arc<BrokerError>> {
        self.last_error.as_ref()
    }

    /// Lease form: whether the lease timer renewed every lease it had to within the last three
    /// quarters of a lease (it renews every half lease, so a late round puts the leases at
    /// risk before they run out). `None` in the other forms.
    pub fn renewals_on_time(&self) -> Option<bool> {
        let lease = self.lease?;
        let late = lease * 3 / 4;
        Some(self.last_renewal.is_some_and(|at| {
            SystemTime::now()
                .duration_since(at)
                .map_or(true, |d| d <= late)
        }))
    }

    /// Handlers reported stuck ([`SubscriptionBuilder::stuck_after`]) whose deliveries are
    /// still alive.
    ///
    /// [`SubscriptionBuilder::stuck_after`]: crate::SubscriptionBuilder::stuck_after
    pub fn stuck(&self) -> u64 {
        self.stuck
    }

    /// Rows claimed and not yet settled, counting those waiting to be handed out.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// The claim loop is alive, the renewals (lease form) are on time, no error stands and no
    /// handler is stuck: what a readiness check wants.
    pub fn is_healthy(&self) -> bool {
        self.claim_loop_alive()
            && self.renewals_on_time() != Some(false)
            && self.last_error.is_none()
            && self.stuck == 0
    }
}

impl Subscription {
    /// How this subscription is doing, from what its threads last did: claim loop alive, last
    /// claim, last error, lease renewals on time, stuck handlers ([`Health`]). Reads no
    /// database.
    ///
    /// ```
    /// use sqlbroker::{Broker, Table};
    /// use std::time::Duration;
    ///
    /// let broker = Broker::connect("sqlite::memory:")?;
    /// let t = Table::new("jobs").lease(Duration::from_secs(30));
    /// broker.create_table(&t)?;
    /// let sub = broker.subscription(&t).start()?;
    /// let health = sub.health();
    /// assert!(health.claim_loop_alive());
    /// assert_eq!(health.stuck(), 0);
    /// # Ok::<(), sqlbroker::BrokerError>(())
    /// ```
    pub fn health(&self) -> Health {
        let ctx = self.ctx();
        let marks = &ctx.marks;
        Health {
            open: !ctx.stopped(),
            workers: self.claim_workers(),
            workers_running: marks.workers_running(),
            last_claim: marks.last_claim(),
            last_error: ctx.last_error(),
            lease: (ctx.spec().lease_secs > 0).then(|| Duration::from_secs(ctx.spec().lease_secs)),
            last_renewal: marks.last_renewal(),
            stuck: marks.stuck_now(),
            in_flight: ctx.slots.in_flight(),
        }
    }
}
