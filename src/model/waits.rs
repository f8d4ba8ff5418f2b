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

/// A signal a job waited for ([`Message::after_signal`](crate::Message::after_signal)), as
/// [`Broker::signal`](crate::Broker::signal) sent it: what its handler reads with
/// [`Delivery::signal`](crate::Delivery::signal).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Signal {
    name: String,
    payload: Vec<u8>,
}

impl Signal {
    pub(crate) fn new(name: String, payload: Vec<u8>) -> Self {
        Signal { name, payload }
    }

    /// The signal's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The payload the first [`Broker::signal`](crate::Broker::signal) of the name gave (a
    /// signal is a latch: a later one changes nothing).
    pub fn payload(&self) -> &[u8] {
        &self.payload
    }
}

/// What a job waits for besides other jobs: a signal, by name, as operators see it
/// ([`Job::signal_wait`](crate::Job::signal_wait)).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SignalWait {
    name: String,
    deadline: Option<std::time::SystemTime>,
    signal: Option<Signal>,
    timed_out: bool,
}

impl SignalWait {
    pub(crate) fn new(
        name: String,
        deadline: Option<std::time::SystemTime>,
        signal: Option<Signal>,
        timed_out: bool,
    ) -> Self {
        SignalWait {
            name,
            deadline,
            signal,
            timed_out,
        }
    }

    /// The signal's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// When the wait ends without the signal ([`Message::wait_timeout`](crate::Message::wait_timeout)),
    /// if it has a deadline.
    pub fn deadline(&self) -> Option<std::time::SystemTime> {
        self.deadline
    }

    /// The signal, once it came (before the deadline).
    pub fn signal(&self) -> Option<&Signal> {
        self.signal.as_ref()
    }

    /// True once the deadline passed without the signal: the job runs without it.
    pub fn timed_out(&self) -> bool {
        self.timed_out
    }

    /// True while the job still waits for the signal.
    pub fn waiting(&self) -> bool {
        self.signal.is_none() && !self.timed_out
    }
}

/// A signal jobs of a table wait for, as operators see it
/// ([`Broker::waiting_signals`](crate::Broker::waiting_signals)).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct WaitingSignal {
    name: String,
    jobs: u64,
}

impl WaitingSignal {
    pub(crate) fn new(name: String, jobs: u64) -> Self {
        WaitingSignal { name, jobs }
    }

    /// The signal's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How many jobs wait for it.
    pub fn jobs(&self) -> u64 {
        self.jobs
    }
}
