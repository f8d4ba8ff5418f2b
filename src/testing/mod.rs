//! Helpers for an application's own tests (cargo feature `testing`; turn it on in the
//! `[dev-dependencies]`, as tokio's `test-util`): run a table's jobs on the test's thread and
//! assert what was published. They work on every database and form, `sqlite::memory:`
//! included.
//!
//! - [`drain`] runs every job that is due with [`Subscription::run`]'s outcome rules (the same
//!   implementation), one at a time on the calling thread, until none is due, and returns the
//!   counts ([`Ran`]);
//! - [`drain_all`] also takes the jobs scheduled or retried for later as due at once: no
//!   backoff is slept through, while every attempt still counts, so "fails twice, then
//!   succeeds" and "dead-lettered after `max_attempts`" run in milliseconds; [`Drain`] sets a
//!   retry policy and a bound on the jobs run;
//! - [`published`] lists a table's jobs ([`Job`]), and [`assert_published`] /
//!   [`assert_not_published`] check them against an [`Expect`] (payload, column values,
//!   state), panicking with what the table holds.
//!
//! ```
//! use sqlbroker::testing::{self, Expect};
//! use sqlbroker::{Broker, JobState, Message, Table};
//! use std::time::Duration;
//!
//! let broker = Broker::connect("sqlite::memory:")?;
//! let emails = Table::new("emails")
//!     .text_column("to")
//!     .lease(Duration::from_secs(30))
//!     .max_attempts(3);
//! broker.create_table(&emails)?;
//! broker.publish(&emails, Message::new(b"welcome".to_vec()).set("to", "ada@example.com"))?;
//! testing::assert_published(&broker, &emails, &Expect::new().column("to", "ada@example.com"));
//!
//! // Fails twice, then succeeds: the retries' backoff (1 s, then 2 s) is not waited.
//! let ran = testing::drain_all(&broker, &emails, |d| {
//!     if d.attempt() < 3 {
//!         Err("smtp: 421 try again later")
//!     } else {
//!         Ok(())
//!     }
//! })?;
//! assert_eq!((ran.failed, ran.acked), (2, 1));
//! testing::assert_not_published(&broker, &emails, &Expect::new()); // acked: gone
//!
//! // Always fails: dead-lettered after max_attempts (3).
//! broker.publish(&emails, Message::new(b"bounce".to_vec()).set("to", "nobody@example.com"))?;
//! testing::drain_all(&broker, &emails, |_| Err::<(), _>("550 no such user"))?;
//! let dead = testing::assert_published(&broker, &emails, &Expect::new().state(JobState::Dead));
//! assert_eq!(dead[0].attempts(), 3);
//! # Ok::<(), sqlbroker::BrokerError>(())
//! ```
//!
//! [`Subscription::run`]: crate::Subscription::run
//! [`Ran`]: crate::Ran
//! [`Job`]: crate::Job

mod drains;
mod expect;

pub use drains::{drain, drain_all, Drain, DEFAULT_MAX_JOBS};
pub use expect::{assert_not_published, assert_published, published, Expect};
