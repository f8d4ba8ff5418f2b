//! Consuming: subscriptions, their claim workers, the deliveries they hand out, the three forms
//! that hold a claimed row, and the handler's outcomes. Uses the broker,
//! the runtime, the dialects and the model; knows nothing of publishing or the operator's calls.

pub(crate) mod claimer;
pub(crate) mod delivery;
pub(crate) mod form;
pub(crate) mod health;
pub(crate) mod outcome;
pub(crate) mod subscription;
pub(crate) mod worker;
