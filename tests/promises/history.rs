//! A history: every event of a run, with when it happened (microseconds since the epoch, the
//! clock the test process and its children share). Calls are recorded as intervals, `t0`
//! before the call and `t1` after it returned, so the moment the database acted lies between:
//! the checks only ever conclude what holds for *every* moment the intervals allow, and so
//! never report a promise broken that the timing could explain.
//!
//! A child process writes its events on its stdout, one line each ([`Ev::line`]); the parent
//! reads them back ([`Ev::parse`]) into the same ledger.

use std::fmt;
use std::sync::{Arc, Mutex};

pub use crate::common::ledger::now_micros;

/// Who acted: a broker (`0`, `1`: in the test process; `2` and up: a child process, a new
/// number for each one started), the operator, the producers, the faults.
pub type Who = u32;
pub const OPERATOR: Who = 900;
pub const PRODUCER: Who = 901;
pub const FAULTS: Who = 902;

/// How a handler ended a delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum How {
    Ack,
    /// `fail(err)`: the retry policy's delay, or a dead letter past `max_attempts`.
    Fail,
    RetryAfter,
    DeadLetter,
    Cancel,
    /// Dropped unsettled (a failed attempt, retried after a short delay).
    Drop,
    /// A panic in the handler (the delivery dropped as the thread unwinds).
    Panic,
}

impl How {
    fn name(self) -> &'static str {
        match self {
            How::Ack => "ack",
            How::Fail => "fail",
            How::RetryAfter => "retry",
            How::DeadLetter => "dead",
            How::Cancel => "cancel",
            How::Drop => "drop",
            How::Panic => "panic",
        }
    }

    fn named(s: &str) -> Option<How> {
        Some(match s {
            "ack" => How::Ack,
            "fail" => How::Fail,
            "retry" => How::RetryAfter,
            "dead" => How::DeadLetter,
            "cancel" => How::Cancel,
            "drop" => How::Drop,
            "panic" => How::Panic,
            _ => return None,
        })
    }

    /// True if the job has no further attempt when this settlement commits.
    pub fn ends(self) -> bool {
        matches!(self, How::Ack | How::DeadLetter | How::Cancel)
    }
}

/// What a published message asked for.
#[derive(Debug, Clone, Default)]
pub struct Msg {
    /// The limits' and fair key's column (`k`), `None` for `NULL`.
    pub key: Option<String>,
    /// The FIFO group (`g`).
    pub group: Option<String>,
    pub dedup: Option<String>,
    pub priority: i16,
    pub delay_ms: u64,
    /// Jobs it waits on to be acked, and to settle (`after`, `after_settled`).
    pub after: Vec<i64>,
    pub after_settled: Vec<i64>,
    /// Tables with queues and kinds: its queue and kind.
    pub queue: Option<String>,
    pub kind: Option<String>,
    /// The signal it waits for (`after_signal`), and the wait's bound in ms (`wait_timeout`).
    pub signal: Option<String>,
    pub signal_timeout_ms: Option<u64>,
}

/// An operator's call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// `cancel(id)`: `ok` is what it returned (true: cancelled).
    Cancel(i64),
    Pause,
    Resume,
    /// `set_concurrency_limit(key, max)` (`None`: lifted).
    SetLimit(String, Option<u32>),
    /// `set_rate_window(key, per_ms, max)`.
    SetRate(String, u64, Option<u32>),
    /// `run_now(id)`.
    RunNow(i64),
    /// `requeue_dead(ids)` (empty: every dead letter).
    Requeue(Vec<i64>),
    /// `purge_dead(ids)`.
    Purge(Vec<i64>),
    /// A row deleted by hand (SQL behind the library's back).
    Delete(i64),
    /// `pause_queue(queue)`, `resume_queue(queue)`.
    PauseQueue(String),
    ResumeQueue(String),
    /// `signal(name, payload)`: how many jobs it released (0 when the call failed).
    Signal {
        name: String,
        payload: String,
        released: u64,
    },
}

/// A fault the run made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The sessions of broker `target` ended from the outside.
    SessionsEnded,
    /// Child process `target` killed (SIGKILL).
    Killed,
    /// Another session held a snapshot open for the interval.
    Snapshot,
    /// Child process `target` stopped (SIGSTOP) for the interval, then let go on (SIGCONT):
    /// a process frozen past its leases, as a long pause of its machine leaves it.
    Stopped,
    /// Broker `target`'s subscription shut down gracefully and started again (a redeploy):
    /// rows it had claimed ahead went back.
    Restarted,
    /// Broker `target`'s connections stopped answering for the interval (a proxy that passed
    /// no byte either way): its calls gave up on their client-side bounds and its sessions
    /// were dropped, ending on the server once bytes passed again.
    Silent,
}

/// One event.
#[derive(Debug, Clone)]
pub struct Ev {
    /// Before the call (or the moment, for a point event).
    pub t0: i64,
    /// After it returned.
    pub t1: i64,
    pub who: Who,
    pub what: What,
}

#[derive(Debug, Clone)]
pub enum What {
    Published {
        id: i64,
        msg: Msg,
    },
    /// A publish that made no row: a duplicate (`dup_of`) or an error.
    Refused {
        msg: Msg,
        dup_of: Option<i64>,
        /// Shown in reports (through `Debug`).
        #[allow(dead_code)]
        err: String,
    },
    /// A claim committed that took `id`: `t1` is the `claimed` hook (after the commit), `t0`
    /// the claim's start (the hook's time less the claim's duration).
    Claimed {
        id: i64,
    },
    /// A handler took delivery `id` reading `attempt`.
    Started {
        id: i64,
        attempt: u32,
    },
    /// A handler settled (or dropped) a delivery: the call's result.
    Settled {
        id: i64,
        attempt: u32,
        how: How,
        ok: bool,
        err: String,
    },
    /// A handler saved a checkpoint (`data`): the call's result.
    Checkpointed {
        id: i64,
        attempt: u32,
        data: String,
        ok: bool,
    },
    /// The checkpoint a delivery read when it started.
    ReadCheckpoint {
        id: i64,
        attempt: u32,
        data: Option<String>,
    },
    /// What a delivery read of the jobs it waited on: (id, outcome, output).
    WaitedOn {
        id: i64,
        attempt: u32,
        deps: Vec<(i64, Option<String>, Option<String>)>,
    },
    /// What a delivery read of the signal it waited for: `(name, payload)`, `None` if its
    /// wait timed out.
    ReadSignal {
        id: i64,
        attempt: u32,
        signal: Option<(String, String)>,
    },
    /// A handler set its output before its ack.
    Output {
        id: i64,
        attempt: u32,
        data: String,
    },
    Op {
        op: Op,
        ok: bool,
        /// What the call returned, shown in reports (through `Debug`).
        #[allow(dead_code)]
        detail: String,
    },
    Fault {
        fault: Fault,
        target: Who,
    },
}

impl Ev {
    /// The job an event concerns, if one.
    pub fn job(&self) -> Option<i64> {
        match &self.what {
            What::Published { id, .. }
            | What::Claimed { id }
            | What::Started { id, .. }
            | What::Settled { id, .. }
            | What::Checkpointed { id, .. }
            | What::ReadCheckpoint { id, .. }
            | What::Output { id, .. }
            | What::WaitedOn { id, .. }
            | What::ReadSignal { id, .. } => Some(*id),
            What::Op {
                op: Op::Cancel(id) | Op::RunNow(id) | Op::Delete(id),
                ..
            } => Some(*id),
            _ => None,
        }
    }

    /// The event as a line a child writes (the kinds a child records).
    pub fn line(&self) -> String {
        let body = match &self.what {
            What::Claimed { id } => format!("claimed\t{id}"),
            What::Started { id, attempt } => format!("started\t{id}\t{attempt}"),
            What::Settled {
                id,
                attempt,
                how,
                ok,
                err,
            } => format!(
                "settled\t{id}\t{attempt}\t{}\t{}\t{}",
                how.name(),
                u8::from(*ok),
                clean(err)
            ),
            What::Checkpointed {
                id,
                attempt,
                data,
                ok,
            } => format!(
                "checkpoint\t{id}\t{attempt}\t{}\t{}",
                u8::from(*ok),
                clean(data)
            ),
            What::ReadCheckpoint { id, attempt, data } => format!(
                "readcp\t{id}\t{attempt}\t{}",
                data.as_deref()
                    .map_or("-".to_string(), |d| format!("={}", clean(d)))
            ),
            What::Output { id, attempt, data } => {
                format!("output\t{id}\t{attempt}\t{}", clean(data))
            }
            What::WaitedOn { id, attempt, deps } => {
                let deps: Vec<String> = deps
                    .iter()
                    .map(|(p, o, out)| {
                        format!(
                            "{p}:{}:{}",
                            o.as_deref().unwrap_or("-"),
                            out.as_deref()
                                .map_or("-".to_string(), |x| format!("={}", clean(x)))
                        )
                    })
                    .collect();
                format!("waited\t{id}\t{attempt}\t{}", deps.join(","))
            }
            What::ReadSignal {
                id,
                attempt,
                signal,
            } => format!(
                "readsig\t{id}\t{attempt}\t{}",
                signal.as_ref().map_or("-".to_string(), |(n, p)| format!(
                    "={}\t{}",
                    clean(n),
                    clean(p)
                ))
            ),
            other => format!("other\t{other:?}"),
        };
        format!("@@EV\t{}\t{}\t{}\t{body}", self.t0, self.t1, self.who)
    }

    /// The event a child's line holds, if it is one.
    pub fn parse(line: &str) -> Option<Ev> {
        let rest = &line[line.find("@@EV\t")? + 5..];
        let f: Vec<&str> = rest.split('\t').collect();
        let num = |i: usize| f.get(i)?.parse::<i64>().ok();
        let (t0, t1, who) = (num(0)?, num(1)?, num(2)? as Who);
        let id = num(4)?;
        let attempt = || num(5).map(|a| a as u32);
        let what = match *f.get(3)? {
            "claimed" => What::Claimed { id },
            "started" => What::Started {
                id,
                attempt: attempt()?,
            },
            "settled" => What::Settled {
                id,
                attempt: attempt()?,
                how: How::named(f.get(6)?)?,
                ok: *f.get(7)? == "1",
                err: f.get(8).unwrap_or(&"").to_string(),
            },
            "checkpoint" => What::Checkpointed {
                id,
                attempt: attempt()?,
                ok: *f.get(6)? == "1",
                data: f.get(7).unwrap_or(&"").to_string(),
            },
            "readcp" => What::ReadCheckpoint {
                id,
                attempt: attempt()?,
                data: f
                    .get(6)
                    .and_then(|d| d.strip_prefix('='))
                    .map(str::to_string),
            },
            "output" => What::Output {
                id,
                attempt: attempt()?,
                data: f.get(6).unwrap_or(&"").to_string(),
            },
            "waited" => What::WaitedOn {
                id,
                attempt: attempt()?,
                deps: f
                    .get(6)
                    .unwrap_or(&"")
                    .split(',')
                    .filter(|d| !d.is_empty())
                    .filter_map(|d| {
                        let mut p = d.splitn(3, ':');
                        let parent = p.next()?.parse().ok()?;
                        let outcome = p.next().filter(|o| *o != "-").map(str::to_string);
                        let output = p
                            .next()
                            .and_then(|o| o.strip_prefix('='))
                            .map(str::to_string);
                        Some((parent, outcome, output))
                    })
                    .collect(),
            },
            "readsig" => What::ReadSignal {
                id,
                attempt: attempt()?,
                signal: match f.get(6)?.strip_prefix('=') {
                    Some(name) => Some((name.to_string(), f.get(7)?.to_string())),
                    None => None,
                },
            },
            _ => return None,
        };
        Some(Ev { t0, t1, who, what })
    }
}

/// Text kept on one line of a child's ledger.
fn clean(s: &str) -> String {
    s.replace(['\t', '\n', '\r'], " ")
}

impl fmt::Display for Ev {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let who = match self.who {
            OPERATOR => "operator".to_string(),
            PRODUCER => "producer".to_string(),
            FAULTS => "faults".to_string(),
            n => format!("broker {n}"),
        };
        write!(
            f,
            "[{:>10.3} .. {:>10.3}] {who}: {:?}",
            self.t0 as f64 / 1e6 % 100_000.0,
            self.t1 as f64 / 1e6 % 100_000.0,
            self.what
        )
    }
}

/// The events of a run, as they were recorded.
#[derive(Clone, Default)]
pub struct Ledger(Arc<Mutex<Vec<Ev>>>);

impl Ledger {
    pub fn push(&self, ev: Ev) {
        self.0.lock().unwrap().push(ev);
    }

    /// Every event so far, in the order recorded.
    pub fn events(&self) -> Vec<Ev> {
        self.0.lock().unwrap().clone()
    }
}
