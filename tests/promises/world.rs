//! What a run is made of: its database and form, and the table family its seed describes (a
//! profile of options that combine: flow control, or FIFO groups), with the choices the actors
//! draw from (keys, groups, dedup keys) and the limits in force as the run began.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sqlbroker::{Form, Message, RetryPolicy, Table};

use super::history::Msg;
use super::rng::Rng;
use crate::common::{unique, Db};

/// A lease short enough that a lost holder's row comes back within the run.
pub const LEASE: Duration = Duration::from_secs(2);
/// How long a handler may hold a delivery before the library fails it.
pub const HANDLER_TIMEOUT: Duration = Duration::from_millis(1500);
/// The subscriptions' poll interval.
pub const POLL: Duration = Duration::from_millis(200);

/// The options a run's table combines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Profile {
    /// Concurrency limits (per key, maybe table-wide), maybe a rate limit, maybe fair claims,
    /// maybe dedup keys and priorities.
    Flow,
    /// FIFO groups, maybe dedup keys and priorities.
    Fifo,
    /// Jobs that wait on others (`after`, `after_settled`), with outputs and checkpoints, maybe
    /// dedup keys.
    Compose,
}

/// A run's world: what every actor reads.
#[derive(Debug, Clone)]
pub struct World {
    pub db: Db,
    pub form: Form,
    pub seed: u64,
    pub profile: Profile,
    pub name: String,
    /// The table as the first service describes it.
    pub table: Table,
    /// The table as a second service describes it (its limits in another order): broker 1's.
    pub other: Table,
    /// Concurrency limits as described: (template, max).
    pub limits: Vec<(String, u32)>,
    /// A rate limit as described: (template, max, window).
    pub rate: Option<(String, u32, Duration)>,
    pub fair: bool,
    pub dedup: bool,
    pub priorities: bool,
    /// The values of the key column (`k`), and of the group column (`g`).
    pub keys: Vec<String>,
    pub groups: Vec<String>,
    /// The advisory form's template reads the group (FIFO): one key per group.
    pub key_is_group: bool,
    /// The longest a handler holds a row (most of them far less).
    pub hold_max: Duration,
    /// Set once the run drains: handlers then settle at once (shared by the world's clones).
    pub draining: Arc<AtomicBool>,
    /// The table has named queues and job kinds ([`QUEUES`], [`KINDS`]): broker 1 claims only
    /// some of each (`view`), and the operator pauses queues.
    pub queues: bool,
    /// Broker 1's queues and kinds.
    pub view: Option<(Vec<String>, Vec<String>)>,
    /// Some jobs wait for a signal of [`SIGNALS`] (compose tables, drawn apart), which the
    /// operator sends now and then, and every one of at the end.
    pub signals: bool,
}

/// The signals a run's jobs may wait for.
pub const SIGNALS: [&str; 3] = ["s0", "s1", "s2"];

/// The queues and the kinds of a table that has them.
pub const QUEUES: [&str; 3] = ["q0", "q1", "q2"];
pub const KINDS: [&str; 3] = ["k0", "k1", "k2"];

impl World {
    /// The world of `seed` on `db` in `form`.
    pub fn new(db: Db, form: Form, seed: u64) -> World {
        let mut r = Rng::new(seed).fork(1);
        let profile = match r.weighted(&[50, 25, 25]) {
            0 => Profile::Flow,
            1 => Profile::Fifo,
            _ => Profile::Compose,
        };
        let name = unique("pr");
        let keys: Vec<String> = (0..2 + r.below(4)).map(|i| format!("t{i}")).collect();
        let groups: Vec<String> = (0..2 + r.below(4)).map(|i| format!("g{i}")).collect();
        // Priorities are claimed in order in the row lock and lease forms only.
        let priorities = form != Form::AdvisoryLock && r.chance(30);
        let dedup = r.chance(40);
        let mut limits = Vec::new();
        let mut rate = None;
        let mut fair = false;
        let mut key_is_group = false;
        let mut base = Table::new(&name).text_column("k").text_column("u");
        match profile {
            Profile::Flow => {
                limits.push(("{k}".to_string(), 1 + r.below(3) as u32));
                if r.chance(50) {
                    limits.push((String::new(), 2 + r.below(4) as u32));
                }
                if r.chance(40) {
                    let per = Duration::from_millis(500 + 250 * r.below(4));
                    rate = Some(("{k}".to_string(), 2 + r.below(3) as u32, per));
                }
                fair = r.chance(50);
            }
            Profile::Fifo => {
                base = base.group("g").fifo();
                key_is_group = r.chance(50);
            }
            Profile::Compose => {
                base = base.dependencies().outputs().checkpoints();
            }
        }
        if dedup {
            base = base.dedup();
        }
        if priorities {
            base = base.priorities();
        }
        if fair {
            base = base.fair("{k}");
        }
        let with_limits = |mut t: Table, order: &[usize]| {
            for i in order {
                let (key, max) = &limits[*i];
                t = t.concurrency_limit(key.clone(), *max);
            }
            if let Some((key, max, per)) = &rate {
                t = t.rate_limit(key.clone(), *max, *per);
            }
            t
        };
        // Queues and kinds, drawn apart from the rest so a seed's other choices stay as they
        // were before queues came.
        let mut qr = Rng::new(seed).fork(7);
        let queues = qr.chance(50);
        let mut view = None;
        if queues {
            base = base.queues().kinds();
            let some = |qr: &mut Rng, all: &[&str]| -> Vec<String> {
                let skip = qr.below(all.len() as u64) as usize;
                all.iter()
                    .enumerate()
                    .filter(|(i, _)| *i != skip || qr.chance(30))
                    .map(|(_, n)| n.to_string())
                    .collect()
            };
            view = Some((some(&mut qr, &QUEUES), some(&mut qr, &KINDS)));
        }
        // Signals, drawn apart from the rest too.
        let signals = profile == Profile::Compose && Rng::new(seed).fork(11).chance(60);
        let forward: Vec<usize> = (0..limits.len()).collect();
        let backward: Vec<usize> = forward.iter().rev().copied().collect();
        let in_form = |t: Table| match form {
            Form::Lease => t.lease(LEASE),
            Form::AdvisoryLock if key_is_group => t.advisory_lock(format!("{name}-{{g}}")),
            Form::AdvisoryLock => t.advisory_lock(format!("{name}-{{u}}")),
            _ => t,
        };
        let table = in_form(with_limits(base.clone(), &forward)).max_attempts(4);
        let other = in_form(with_limits(base, &backward)).max_attempts(4);
        World {
            db,
            form,
            seed,
            profile,
            name,
            table,
            other,
            limits,
            rate,
            fair,
            dedup,
            priorities,
            keys,
            groups,
            key_is_group,
            hold_max: Duration::from_millis(10 + r.below(60)),
            draining: Arc::default(),
            queues,
            view,
            signals,
        }
    }

    /// True once the run drains: handlers ack at once.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    /// Starts the drain in this process (its clones see it).
    pub fn drain(&self) {
        self.draining.store(true, Ordering::Relaxed);
    }

    /// A message `n` (unique per run) drawn by `r`, and what it asked for; `recent`: jobs
    /// published before it, which it may wait on.
    pub fn message(&self, r: &mut Rng, n: u64, recent: &[i64]) -> (Message, Msg) {
        let mut msg = Msg::default();
        let mut m = Message::new(format!("job {n}").into_bytes()).set("u", format!("u{n}"));
        if self.queues {
            // Drawn apart from `r`, so the other choices of a seed stay as they were.
            let mut qr = Rng::new(self.seed ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15)).fork(9);
            let (q, k) = (*qr.pick(&QUEUES), *qr.pick(&KINDS));
            m = m.queue(q).kind(k);
            msg.queue = Some(q.to_string());
            msg.kind = Some(k.to_string());
        }
        // A `NULL` key now and then: one key of its own for limits and fair claims.
        let key = if r.chance(8) {
            None
        } else {
            Some(r.pick(&self.keys).clone())
        };
        m = match &key {
            Some(k) => m.set("k", k.as_str()),
            None => m.set("k", sqlbroker::Value::Null),
        };
        msg.key = key;
        if self.profile == Profile::Fifo {
            let g = r.pick(&self.groups).clone();
            m = m.set("g", g.as_str());
            msg.group = Some(g);
        }
        if self.dedup && r.chance(30) {
            let d = format!("d{}", r.below(4));
            m = m.dedup_key(d.clone());
            msg.dedup = Some(d);
        }
        if self.priorities {
            let p = r.below(5) as i16 - 2;
            m = m.priority(p);
            msg.priority = p;
        }
        if self.signals {
            // Drawn apart from `r`, so the other choices of a seed stay as they were.
            let mut sr = Rng::new(self.seed ^ n.wrapping_mul(0xD6E8_FEB8_6659_FD93)).fork(12);
            if sr.chance(30) {
                let s = sr.pick(&SIGNALS).to_string();
                m = m.after_signal(s.clone());
                if sr.chance(40) {
                    let ms = 100 + sr.below(1500);
                    m = m.wait_timeout(Duration::from_millis(ms));
                    msg.signal_timeout_ms = Some(ms);
                }
                msg.signal = Some(s);
            }
        }
        if self.profile == Profile::Compose && !recent.is_empty() && r.chance(40) {
            // A job that waits is due when released: no delay of its own.
            for _ in 0..1 + r.below(3) {
                let parent = *r.pick(recent);
                if msg.after.contains(&parent) || msg.after_settled.contains(&parent) {
                    continue;
                }
                if r.chance(50) {
                    m = m.after(parent);
                    msg.after.push(parent);
                } else {
                    m = m.after_settled(parent);
                    msg.after_settled.push(parent);
                }
            }
            return (m, msg);
        }
        if r.chance(10) && msg.signal.is_none() {
            let ms = r.below(600);
            m = m.deliver_after(Duration::from_millis(ms));
            msg.delay_ms = ms;
        }
        (m, msg)
    }

    /// The retry policy every subscription runs with: short, so retried jobs come back within
    /// the run.
    pub fn retry_policy() -> RetryPolicy {
        RetryPolicy::exponential(Duration::from_millis(20), Duration::from_millis(300))
    }

    /// The rendered key of each described concurrency limit for a job of key `key`.
    pub fn limit_keys(&self, key: Option<&str>) -> Vec<String> {
        self.limits
            .iter()
            .map(|(template, _)| match template.as_str() {
                "" => String::new(),
                _ => key.unwrap_or("").to_string(),
            })
            .collect()
    }

    /// Words for the run, for a report.
    pub fn describe(&self) -> String {
        format!(
            "{:?} {:?}, table {}, profile {:?}: limits {:?}, rate {:?}, fair {}, dedup {}, \
             priorities {}, keys {:?}, groups {:?}{}, handlers hold up to {:?}{}{}",
            self.db,
            self.form,
            self.name,
            self.profile,
            self.limits,
            self.rate,
            self.fair,
            self.dedup,
            self.priorities,
            self.keys,
            self.groups,
            if self.key_is_group {
                " (advisory key = group)"
            } else {
                ""
            },
            self.hold_max,
            match &self.view {
                Some((q, k)) => format!(", queues and kinds (broker 1 claims {q:?} {k:?})"),
                None => String::new(),
            },
            if self.signals { ", signals" } else { "" }
        )
    }
}
