//! Producing: messages, publishing them (on the broker's pool, or inside the application's own
//! transaction for the driver modules), and periodic jobs. Uses the broker, the runtime, the
//! dialects and the model; knows nothing of subscriptions or the operator's calls.

pub(crate) mod collect;
pub(crate) mod group;
pub(crate) mod message;
#[cfg(feature = "cron")]
pub(crate) mod periodic;
pub(crate) mod publish;
pub(crate) mod publish_one;
