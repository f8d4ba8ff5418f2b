//! What a job waits on ([`Message::after`](crate::Message::after),
//! [`Message::after_settled`](crate::Message::after_settled)), as deliveries and operators see
//! it.

/// How a job ended, as the jobs waiting on it see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum JobOutcome {
    /// Acked (or gone from its table: an acked job is not kept unless the table keeps
    /// completed rows).
    Acked,
    /// Dead-lettered.
    DeadLettered,
    /// Cancelled.
    Cancelled,
}

impl JobOutcome {
    /// The outcome recorded as `word` (`acked`, `dead`, `cancelled`).
    pub(crate) fn from_recorded(word: &str) -> Option<Self> {
        match word {
            "acked" => Some(JobOutcome::Acked),
            "dead" => Some(JobOutcome::DeadLettered),
            "cancelled" => Some(JobOutcome::Cancelled),
            _ => None,
        }
    }
}

/// A job another waits on: its id, how it is waited on, and its outcome once settled.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Dependency {
    /// The job's table.
    pub table: String,
    /// The job's id.
    pub id: i64,
    /// Waited on with [`Message::after_settled`](crate::Message::after_settled): whatever its
    /// outcome (else with [`Message::after`](crate::Message::after): acked).
    pub any_outcome: bool,
    /// How it ended; `None` while it has not settled.
    pub outcome: Option<JobOutcome>,
    /// What it produced ([`Delivery::set_output`](crate::Delivery::set_output)), written by
    /// its settlement on a table with [`Table::outputs`](crate::Table::outputs): kept for the
    /// jobs waiting on it when it settled, until the last of them settles, whether its row is
    /// kept or not; a job published after it settled reads it from its row where the row is
    /// kept (a dead letter, or a completed row of a table that keeps them), else none.
    pub output: Option<Vec<u8>>,
}
