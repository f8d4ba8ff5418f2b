//! The `metrics` feature: counters, histograms and a gauge per table, reported through the
//! `metrics` crate's facade to whatever recorder the application installed (the library never
//! installs one). The names are listed in the crate docs and the README ("Metrics").
//!
//! A leaf module: it imports nothing of the crate, so every layer may count.
//!
//! One [`Meters`] per table and broker (the runtime's `Queue`) resolves its handles once,
//! with the `table` label, when the table is first used: the hot path then only adds to an
//! atomic (or whatever the recorder's handle does), with no label formatting or lookup. A
//! recorder installed after that is not seen by the handles already made: install it first.
//!
//! Without the feature, [`Meters`] is an empty struct whose methods do nothing, so the call
//! sites need no `cfg` and nothing is compiled in.

use std::time::Duration;

/// How a settlement ended, as the meters count it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Settle {
    Ack,
    /// Back into the queue; `failed`: a failed attempt (a handler error, a drop, a timeout).
    Retry {
        failed: bool,
    },
    /// Dead-lettered; `failed` as for `Retry`.
    Dead {
        failed: bool,
    },
    Cancel,
}

#[cfg(feature = "metrics")]
pub(crate) use on::{pruned, Meters};

#[cfg(not(feature = "metrics"))]
pub(crate) use off::{pruned, Meters};

#[cfg(not(feature = "metrics"))]
mod off {
    use super::*;

    /// Nothing: the `metrics` feature is off.
    #[derive(Default)]
    pub(crate) struct Meters;

    /// Nothing: the `metrics` feature is off.
    #[inline(always)]
    pub(crate) fn pruned(_table: &str, _what: &'static str, _rows: u64) {}

    #[allow(clippy::unused_self)]
    impl Meters {
        #[inline(always)]
        pub fn new(_table: &str) -> Self {
            Meters
        }
        #[inline(always)]
        pub fn published(&self, _rows: usize) {}
        #[inline(always)]
        pub fn claimed(&self, _rows: usize, _took: Duration) {}
        #[inline(always)]
        pub fn waited(&self, _due: Option<std::time::SystemTime>, _now: std::time::SystemTime) {}
        #[inline(always)]
        pub fn claim_failed(&self) {}
        #[inline(always)]
        pub fn settled(
            &self,
            _how: Settle,
            _handled_for: Option<Duration>,
            _ok: bool,
            _lost: bool,
        ) {
        }
        #[inline(always)]
        pub fn settle_took(&self, _took: Duration) {}
        #[inline(always)]
        pub fn handler_timeout(&self) {}
        #[inline(always)]
        pub fn opened(&self) {}
        #[inline(always)]
        pub fn closed(&self) {}
        #[inline(always)]
        pub fn stuck(&self, _now: bool) {}
    }
}

#[cfg(feature = "metrics")]
mod on {
    use super::*;
    use ::metrics::{
        counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram, Counter,
        Gauge, Histogram, Unit,
    };

    /// Every metric's name, kind and meaning: the crate docs and the README list the same.
    pub(crate) const PUBLISHED: &str = "sqlbroker_jobs_published_total";
    pub(crate) const CLAIMED: &str = "sqlbroker_jobs_claimed_total";
    pub(crate) const ACKED: &str = "sqlbroker_jobs_acked_total";
    pub(crate) const RETRIED: &str = "sqlbroker_jobs_retried_total";
    pub(crate) const FAILED: &str = "sqlbroker_jobs_failed_total";
    pub(crate) const DEAD: &str = "sqlbroker_jobs_dead_lettered_total";
    pub(crate) const CANCELLED: &str = "sqlbroker_jobs_cancelled_total";
    pub(crate) const LEASE_LOST: &str = "sqlbroker_leases_lost_total";
    pub(crate) const TIMEOUTS: &str = "sqlbroker_handler_timeouts_total";
    pub(crate) const CLAIM_ERRORS: &str = "sqlbroker_claim_errors_total";
    pub(crate) const SETTLE_ERRORS: &str = "sqlbroker_settle_errors_total";
    pub(crate) const HANDLER: &str = "sqlbroker_handler_duration_seconds";
    pub(crate) const CLAIM: &str = "sqlbroker_claim_duration_seconds";
    pub(crate) const SETTLE: &str = "sqlbroker_settle_duration_seconds";
    pub(crate) const IN_FLIGHT: &str = "sqlbroker_jobs_in_flight";
    pub(crate) const QUEUE_WAIT: &str = "sqlbroker_queue_wait_seconds";
    pub(crate) const PRUNED: &str = "sqlbroker_pruned_total";
    pub(crate) const STUCK: &str = "sqlbroker_stuck_handlers";

    /// `rows` rows of `table` deleted by the maintainer, `what`: `completed`, `dead` or
    /// `actions` (the table is then `sqlbroker_actions`).
    pub(crate) fn pruned(table: &str, what: &'static str, rows: u64) {
        describe();
        counter!(PRUNED, "table" => table.to_string(), "what" => what).increment(rows);
    }

    /// One table's handles, labelled `table`.
    pub(crate) struct Meters {
        published: Counter,
        claimed: Counter,
        acked: Counter,
        retried: Counter,
        failed: Counter,
        dead: Counter,
        cancelled: Counter,
        lease_lost: Counter,
        timeouts: Counter,
        claim_errors: Counter,
        settle_errors: Counter,
        handler: Histogram,
        claim: Histogram,
        settle: Histogram,
        queue_wait: Histogram,
        in_flight: Gauge,
        stuck: Gauge,
    }

    impl Meters {
        /// Resolves `table`'s handles in the recorder installed now (and describes the metrics
        /// to it: cheap, once per table).
        pub fn new(table: &str) -> Self {
            describe();
            let t = table.to_string();
            let c = |name: &'static str| counter!(name, "table" => t.clone());
            let h = |name: &'static str| histogram!(name, "table" => t.clone());
            Meters {
                published: c(PUBLISHED),
                claimed: c(CLAIMED),
                acked: c(ACKED),
                retried: c(RETRIED),
                failed: c(FAILED),
                dead: c(DEAD),
                cancelled: c(CANCELLED),
                lease_lost: c(LEASE_LOST),
                timeouts: c(TIMEOUTS),
                claim_errors: c(CLAIM_ERRORS),
                settle_errors: c(SETTLE_ERRORS),
                handler: h(HANDLER),
                claim: h(CLAIM),
                settle: h(SETTLE),
                queue_wait: h(QUEUE_WAIT),
                in_flight: gauge!(IN_FLIGHT, "table" => t.clone()),
                stuck: gauge!(STUCK, "table" => t.clone()),
            }
        }

        /// `rows` rows written by a publish.
        #[inline]
        pub fn published(&self, rows: usize) {
            self.published.increment(rows as u64);
        }

        /// A claim that answered, with `rows` rows (perhaps none) after `took`.
        #[inline]
        pub fn claimed(&self, rows: usize, took: Duration) {
            self.claim.record(took);
            if rows > 0 {
                self.claimed.increment(rows as u64);
            }
        }

        /// A claimed row's wait from its due time (whole seconds) to `now`, the claim; none
        /// for a row whose due time did not read.
        #[inline]
        pub fn waited(&self, due: Option<std::time::SystemTime>, now: std::time::SystemTime) {
            if let Some(due) = due {
                self.queue_wait
                    .record(now.duration_since(due).unwrap_or(Duration::ZERO));
            }
        }

        /// A claim that failed.
        #[inline]
        pub fn claim_failed(&self) {
            self.claim_errors.increment(1);
        }

        /// A settlement `how`, its result (`ok`, or an error that is a lost lease or not), and
        /// the handler's time if the delivery was handed out.
        #[inline]
        pub fn settled(&self, how: Settle, handled_for: Option<Duration>, ok: bool, lost: bool) {
            if let Some(d) = handled_for {
                self.handler.record(d);
            }
            if !ok {
                match lost {
                    true => self.lease_lost.increment(1),
                    false => self.settle_errors.increment(1),
                }
                return;
            }
            match how {
                Settle::Ack => self.acked.increment(1),
                Settle::Retry { failed } => {
                    self.retried.increment(1);
                    if failed {
                        self.failed.increment(1);
                    }
                }
                Settle::Dead { failed } => {
                    self.dead.increment(1);
                    if failed {
                        self.failed.increment(1);
                    }
                }
                Settle::Cancel => self.cancelled.increment(1),
            }
        }

        /// A settling statement's time on the database.
        #[inline]
        pub fn settle_took(&self, took: Duration) {
            self.settle.record(took);
        }

        /// The handler timeout failed a delivery.
        #[inline]
        pub fn handler_timeout(&self) {
            self.timeouts.increment(1);
        }

        /// A claimed row became a delivery of this process.
        #[inline]
        pub fn opened(&self) {
            self.in_flight.increment(1.0);
        }

        /// A delivery is gone (settled, or handed back unconsumed).
        #[inline]
        pub fn closed(&self) {
            self.in_flight.decrement(1.0);
        }

        /// A handler reported stuck (`true`), or a stuck one's delivery gone (`false`).
        pub fn stuck(&self, now: bool) {
            if now {
                self.stuck.increment(1.0);
            } else {
                self.stuck.decrement(1.0);
            }
        }
    }

    /// Units and help texts, for exporters that show them.
    fn describe() {
        let counters: [(&'static str, &'static str); 12] = [
            (
                PRUNED,
                "Rows the elected maintainer deleted past their retention, by what they were.",
            ),
            (PUBLISHED, "Rows written by publishes."),
            (CLAIMED, "Rows claimed."),
            (ACKED, "Deliveries acked."),
            (
                RETRIED,
                "Deliveries put back for another attempt (failed or retried).",
            ),
            (
                FAILED,
                "Failed attempts: handler errors, drops, handler timeouts.",
            ),
            (DEAD, "Deliveries dead-lettered."),
            (CANCELLED, "Deliveries cancelled."),
            (LEASE_LOST, "Settlements that found their lease lost."),
            (TIMEOUTS, "Deliveries failed by the handler timeout."),
            (CLAIM_ERRORS, "Claims that failed."),
            (
                SETTLE_ERRORS,
                "Settlements that failed, other than a lost lease.",
            ),
        ];
        for (name, help) in counters {
            describe_counter!(name, Unit::Count, help);
        }
        let histograms: [(&'static str, &'static str); 4] = [
            (
                QUEUE_WAIT,
                "From a row's due time (whole seconds) to its claim: how long it waited ready.",
            ),
            (HANDLER, "From handing a delivery out to its settlement."),
            (
                CLAIM,
                "A claim's time on the database (claims that found nothing too).",
            ),
            (SETTLE, "A settlement's time on the database."),
        ];
        for (name, help) in histograms {
            describe_histogram!(name, Unit::Seconds, help);
        }
        describe_gauge!(
            STUCK,
            Unit::Count,
            "Handlers reported stuck (still running past stuck_after) whose deliveries live."
        );
        describe_gauge!(
            IN_FLIGHT,
            Unit::Count,
            "Rows claimed by this process and not yet settled or handed back."
        );
    }
}
