//! The checks: each promise of PROMISES.md that a history can show broken, read over the
//! ledger and the table as the run left it.
//!
//! Every check concludes only what holds for every moment the recorded intervals allow (a
//! claim committed somewhere between its start and its hook; a settlement between the call and
//! its return), so a report is a promise broken, never a timing the ledger cannot order.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use sqlbroker::Form;

use super::history::{Ev, Fault, How, Msg, Op, What, Who};
use super::world::{Profile, World, HANDLER_TIMEOUT, LEASE, POLL};

/// How late, on a loaded machine, a broker may act on what the promise lets it take a poll
/// interval for (a pause read, a limit read): added to the bounds the promises give.
const SLACK: i64 = 400_000;

/// The resolution of the times the database stamps (rate windows' slots), micros.
const STAMP_RESOLUTION: i64 = 2_000;

/// A promise the history shows broken.
#[derive(Debug, Clone)]
pub struct Broken {
    /// The promise's number in PROMISES.md.
    pub promise: &'static str,
    pub what: String,
    /// The jobs involved.
    pub jobs: Vec<i64>,
    /// The stretch of time (micros) the breach lies in.
    pub from: i64,
    pub to: i64,
}

/// The table as the run left it: each row's id and whether it is dead.
pub type Final = HashMap<i64, bool>;

/// One delivery of a job by one broker: its claim, its handler's start, its end.
#[derive(Debug, Clone, Default)]
struct Run {
    who: Who,
    /// The claim: its start and its hook (the commit lies between).
    claim: Option<(i64, i64)>,
    start: Option<(i64, u32)>,
    /// The settlement: its call, how, whether it returned `Ok`, its error.
    settle: Option<(i64, i64, How, bool, String)>,
    /// The broker's process was killed while the run had not ended.
    killed: Option<i64>,
}

impl Run {
    /// Until when the run was certainly in work (its settlement's call, or its process's
    /// death); `None` if its end is not known (a row claimed ahead and handed back).
    fn surely_until(&self) -> Option<i64> {
        let end = match (&self.settle, self.killed) {
            (Some((t0, ..)), _) => *t0,
            (None, Some(k)) => k,
            _ => return None,
        };
        // Held past the handler timeout, the delivery was failed (and its row freed) then.
        let timeout = self.start.map_or(i64::MAX, |(s, _)| {
            s + HANDLER_TIMEOUT.as_micros() as i64 - SLACK
        });
        Some(end.min(timeout))
    }

    /// True if the run may have lost its hold before it ended, as the library tells its holder:
    /// its settlement failed (a lost lease or claim, a handler timeout, a connection gone). A
    /// settlement that returned `Ok` held the row to its end, however long it took (a handler
    /// timeout that fired first would have made it fail).
    fn may_have_lost(&self) -> bool {
        matches!(&self.settle, Some((_, _, _, false, _)))
    }
}

/// How long after a silence its broker's sessions may still end (micros): the server learns
/// the client dropped them once bytes pass again.
const SILENT_TAIL: i64 = 1_000_000;

/// What the checks read, indexed once.
struct Index<'a> {
    world: &'a World,
    evs: &'a [Ev],
    published: BTreeMap<i64, (i64, i64, Msg)>,
    runs: HashMap<i64, Vec<Run>>,
    ops: Vec<&'a Ev>,
    faults: Vec<&'a Ev>,
}

impl<'a> Index<'a> {
    fn new(world: &'a World, evs: &'a [Ev]) -> Index<'a> {
        let mut published = BTreeMap::new();
        let mut ops = Vec::new();
        let mut faults = Vec::new();
        // Per job and broker, the events in the order they happened.
        let mut per: HashMap<(i64, Who), Vec<&Ev>> = HashMap::new();
        for e in evs {
            match &e.what {
                What::Published { id, msg } => {
                    published.insert(*id, (e.t0, e.t1, msg.clone()));
                }
                What::Claimed { id } | What::Started { id, .. } | What::Settled { id, .. } => {
                    per.entry((*id, e.who)).or_default().push(e);
                }
                What::Op { .. } => ops.push(e),
                What::Fault { .. } => faults.push(e),
                _ => {}
            }
        }
        let kills: HashMap<Who, i64> = faults
            .iter()
            .filter_map(|e| match e.what {
                What::Fault {
                    fault: Fault::Killed,
                    target,
                } => Some((target, e.t0)),
                _ => None,
            })
            .collect();
        let mut runs: HashMap<i64, Vec<Run>> = HashMap::new();
        for ((id, who), mut list) in per {
            list.sort_by_key(|e| (e.t1, e.t0));
            let mut mine: Vec<Run> = Vec::new();
            for e in list {
                match &e.what {
                    What::Claimed { .. } => mine.push(Run {
                        who,
                        claim: Some((e.t0, e.t1)),
                        ..Run::default()
                    }),
                    What::Started { attempt, .. } => {
                        match mine.iter_mut().rev().find(|r| r.start.is_none()) {
                            Some(r) => r.start = Some((e.t0, *attempt)),
                            None => mine.push(Run {
                                who,
                                start: Some((e.t0, *attempt)),
                                ..Run::default()
                            }),
                        }
                    }
                    What::Settled {
                        how,
                        ok,
                        err,
                        attempt,
                        ..
                    } => {
                        // The earliest unsettled start of this attempt: two deliveries of one
                        // attempt in one broker (a row lock claim lost with its session, the row
                        // claimed again while the first handler runs) settle in the order they
                        // started, as their handlers mostly end.
                        let open = |r: &Run| r.start.is_some() && r.settle.is_none();
                        let same = mine
                            .iter()
                            .position(|r| open(r) && r.start.is_some_and(|s| s.1 == *attempt));
                        let at = same.or_else(|| mine.iter().rposition(open));
                        if let Some(r) = at.map(|i| &mut mine[i]) {
                            r.settle = Some((e.t0, e.t1, *how, *ok, err.clone()));
                        }
                    }
                    _ => {}
                }
            }
            if let Some(k) = kills.get(&who) {
                for r in &mut mine {
                    if r.settle.is_none() {
                        r.killed = Some(*k);
                    }
                }
            }
            runs.entry(id).or_default().extend(mine);
        }
        for list in runs.values_mut() {
            list.sort_by_key(|r| r.claim.map_or(r.start.map_or(0, |s| s.0), |c| c.1));
        }
        Index {
            world,
            evs,
            published,
            runs,
            ops,
            faults,
        }
    }

    /// The earliest moment a claim by `who` that the hooks timed from `c0` may have begun: a
    /// process frozen (SIGSTOP) between its claim's decision and the statement the hook times
    /// ran that claim when it woke, and its decision was made before the freeze (the soak's
    /// seed 839770630 on MariaDB advisory: a claim decided before a pause, frozen through it,
    /// committed just after).
    fn claim_start(&self, who: Who, c0: i64) -> i64 {
        self.faults
            .iter()
            .filter_map(|e| match e.what {
                What::Fault {
                    target,
                    fault: Fault::Stopped,
                } if target == who && e.t0 <= c0 && e.t1 >= c0 - SLACK => Some(e.t0),
                _ => None,
            })
            .fold(c0, i64::min)
    }

    /// True if broker `who`'s sessions were ended, or its process killed, or (the forms that
    /// hold a row by a session) its connections silent (their sessions end a little after the
    /// silence), within `[from, to]`. A lease outlives a silence: its holder keeps it until
    /// it runs out, and a settlement after that must fail, which is what the lease form is
    /// checked on.
    fn faulted(&self, who: Who, from: i64, to: i64) -> bool {
        let sessions = self.world.form != Form::Lease;
        self.faults.iter().any(|e| match e.what {
            What::Fault { target, fault } => {
                let (counts, end) = match fault {
                    Fault::SessionsEnded | Fault::Killed => (true, e.t1),
                    Fault::Silent => (sessions, e.t1 + SILENT_TAIL),
                    _ => (false, e.t1),
                };
                target == who && counts && end >= from && e.t0 <= to
            }
            _ => false,
        })
    }

    /// True if run `r` may have lost its row unseen: it ended by a drop or a panic (whose
    /// settlement reports nothing) while its process was frozen past its lease meanwhile, or
    /// its connections silent.
    fn lost_unseen(&self, r: &Run) -> bool {
        let (Some((_, c1)), Some((t0, _, how, _, _))) = (r.claim, &r.settle) else {
            return false;
        };
        matches!(how, How::Drop | How::Panic)
            && self.faults.iter().any(|e| {
                let tail = match e.what {
                    What::Fault {
                        fault: Fault::Silent,
                        ..
                    } => SILENT_TAIL,
                    _ => 0,
                };
                matches!(e.what, What::Fault { target, fault: Fault::Stopped | Fault::Silent } if target == r.who)
                    && e.t1 + tail >= c1
                    && e.t0 <= *t0
            })
    }

    /// The operators' calls of kind `pick` that returned `ok`, as `(t0, t1)`.
    fn ops_where(&self, pick: impl Fn(&Op) -> bool) -> Vec<(i64, i64)> {
        self.ops
            .iter()
            .filter_map(|e| match &e.what {
                What::Op { op, ok: true, .. } if pick(op) => Some((e.t0, e.t1)),
                _ => None,
            })
            .collect()
    }

    /// True if job `id`'s row was deleted by hand by a call that began before `t`.
    fn deleted_before(&self, id: i64, t: i64) -> bool {
        self.ops_where(|op| matches!(op, Op::Delete(j) if *j == id))
            .iter()
            .any(|(t0, _)| *t0 < t)
    }

    /// True if job `id` may have been requeued from the dead letters within `[from, to]`.
    fn requeued(&self, id: i64, from: i64, to: i64) -> bool {
        self.ops_where(|op| matches!(op, Op::Requeue(ids) if ids.is_empty() || ids.contains(&id)))
            .iter()
            .any(|(t0, t1)| *t1 >= from && *t0 <= to)
    }

    /// The earliest moment job `id` may have finished, its `after` parents' ends included
    /// (one dead-lettered or cancelled dead-letters it, with no event of its own).
    fn may_have_finished(&self, id: i64) -> i64 {
        let mut at = self.own_end(id);
        let mut todo: Vec<(i64, usize)> = vec![(id, 0)];
        let mut seen = HashSet::new();
        while let Some((job, depth)) = todo.pop() {
            if !seen.insert(job) || depth > 50 {
                continue;
            }
            if let Some((_, _, msg)) = self.published.get(&job) {
                for p in &msg.after {
                    at = at.min(self.own_end(*p));
                    todo.push((*p, depth + 1));
                }
            }
        }
        at
    }

    /// The earliest moment job `id` may have finished by its own events (acked, dead,
    /// cancelled, deleted): no promise that holds while it is unfinished can be held to past
    /// it. `i64::MAX` if nothing in the history could have finished it.
    fn own_end(&self, id: i64) -> i64 {
        let max = self.world.table_max_attempts();
        let mut at = i64::MAX;
        for r in self.runs.get(&id).into_iter().flatten() {
            if let (Some((t0, _, how, _, _)), Some((s, attempt))) = (&r.settle, r.start) {
                if how.ends() || attempt >= max || r.may_have_lost() {
                    at = at.min(*t0);
                }
                // Held past its timeout: the library failed it then (its last attempt: dead).
                if attempt >= max && *t0 - s > HANDLER_TIMEOUT.as_micros() as i64 - SLACK {
                    at = at.min(s + HANDLER_TIMEOUT.as_micros() as i64 - SLACK);
                }
            }
            // Killed mid-run: its settlement may have committed before its line was written
            // (the soak's seed 839770609 on MariaDB advisory: a FIFO head acked, its process
            // killed, the next of its group claimed).
            if let (None, Some((s, _)), Some(_)) = (&r.settle, r.start, r.killed) {
                at = at.min(s);
            }
        }
        for e in &self.ops {
            if let What::Op { op, .. } = &e.what {
                let hits = match op {
                    Op::Cancel(j) | Op::Delete(j) => *j == id,
                    Op::Purge(ids) => ids.contains(&id),
                    _ => false,
                };
                if hits {
                    at = at.min(e.t0);
                }
            }
        }
        at
    }
}

impl World {
    /// The attempts a job has ([`World`]'s tables say 4).
    pub fn table_max_attempts(&self) -> u32 {
        4
    }
}

/// Every promise the history shows broken.
pub fn check(world: &World, evs: &[Ev], fin: &Final, waiting: &[i64]) -> Vec<Broken> {
    let ix = Index::new(world, evs);
    let mut out = Vec::new();
    one_holder(&ix, &mut out);
    fenced(&ix, &mut out);
    attempts(&ix, &mut out);
    finished_stays_finished(&ix, &mut out);
    nothing_lost(&ix, fin, &mut out);
    paused(&ix, &mut out);
    dedup(&ix, &mut out);
    if world.queues {
        views(&ix, &mut out);
        queue_paused(&ix, &mut out);
    }
    if world.profile == Profile::Fifo {
        fifo(&ix, &mut out);
    }
    if world.profile == Profile::Flow {
        concurrency(&ix, &mut out);
        rates(&ix, &mut out);
    }
    if world.profile == Profile::Compose {
        waits(&ix, &mut out);
        none_waits_for_ever(&ix, fin, waiting, &mut out);
        if world.signals {
            signals(&ix, &mut out);
        }
        outputs(&ix, &mut out);
        checkpoints(&ix, &mut out);
    }
    out
}

/// P17, P18: jobs that wait. A job published `after(p)` is claimed to run only after `p`'s ack
/// (or its row's deletion by hand, which counts as one) may have committed; one published
/// `after_settled(p)` only after `p` may have ended, however it ended.
fn waits(ix: &Index<'_>, out: &mut Vec<Broken>) {
    for (id, (_, _, msg)) in &ix.published {
        for r in ix.runs.get(id).into_iter().flatten() {
            let (Some((_, c1)), Some(_)) = (r.claim, r.start) else {
                continue;
            };
            for p in &msg.after {
                if !acked_by(ix, *p, c1) {
                    out.push(Broken {
                        promise: "P17",
                        what: format!(
                            "job {id} (after {p}) claimed by broker {} before job {p}'s ack",
                            r.who
                        ),
                        jobs: vec![*p, *id],
                        from: ix.published.get(p).map_or(c1, |x| x.0),
                        to: c1,
                    });
                }
            }
            for p in &msg.after_settled {
                if ix.may_have_finished(*p) >= c1 {
                    out.push(Broken {
                        promise: "P18",
                        what: format!(
                            "job {id} (after_settled {p}) claimed by broker {} before job {p} \
                             ended",
                            r.who
                        ),
                        jobs: vec![*p, *id],
                        from: ix.published.get(p).map_or(c1, |x| x.0),
                        to: c1,
                    });
                }
            }
        }
    }
}

/// True if job `p`'s ack (or a delete by hand) may have committed before `t`.
fn acked_by(ix: &Index<'_>, p: i64, t: i64) -> bool {
    let runs = ix.runs.get(&p).map(Vec::as_slice).unwrap_or_default();
    let acked = runs.iter().any(|r| match (&r.settle, r.start) {
        (Some((t0, _, How::Ack, _, _)), _) => *t0 < t,
        // Killed mid-run: its ack may have committed before its line was written.
        (None, Some((s, _))) => r.killed.is_some() && s < t,
        _ => false,
    });
    let deleted = ix
        .ops
        .iter()
        .any(|e| matches!(&e.what, What::Op { op: Op::Delete(j), .. } if *j == p) && e.t0 < t);
    // Not a job of this run's history (published before it, or by another path): unknown.
    acked || deleted || !ix.published.contains_key(&p)
}

/// P18 (and P17): nothing waits for ever. After the drain, no job still waits whose every job
/// it waits on has ended (is no longer live: acked, dead, cancelled, purged or deleted): its
/// last parent's settlement, or the sweeper, should have released it or dead-lettered it.
/// `waiting`: the jobs the table calls waiting after the drain.
fn none_waits_for_ever(ix: &Index<'_>, fin: &Final, waiting: &[i64], out: &mut Vec<Broken>) {
    let end = ix.evs.iter().map(|e| e.t1).max().unwrap_or_default();
    for id in waiting {
        let Some((t0, _, msg)) = ix.published.get(id) else {
            continue;
        };
        let parents: Vec<i64> = msg
            .after
            .iter()
            .chain(&msg.after_settled)
            .copied()
            .collect();
        // A parent still live (ready, in work, waiting itself) may yet settle.
        if parents.iter().any(|p| fin.get(p) == Some(&false)) {
            continue;
        }
        // Its signal may not have been sent (the end's signals failed).
        if let Some(name) = &msg.signal {
            if signal_ops(ix, name).iter().all(|(_, _, _, ok)| !ok) {
                continue;
            }
        }
        let mut jobs = vec![*id];
        jobs.extend(&parents);
        out.push(Broken {
            promise: if msg.signal.is_some() { "P38" } else { "P18" },
            what: format!(
                "job {id} still waits after the drain, though every job it waits on \
                 ({parents:?}) has ended{}",
                msg.signal
                    .as_ref()
                    .map_or(String::new(), |s| format!(" and its signal {s:?} was sent"))
            ),
            jobs,
            from: *t0,
            to: end,
        });
    }
}

/// The calls that sent signal `name`: `(t0, t1, payload, ok)`, in the order made.
fn signal_ops<'a>(ix: &Index<'a>, name: &str) -> Vec<(i64, i64, &'a str, bool)> {
    ix.ops
        .iter()
        .filter_map(|e| match &e.what {
            What::Op {
                op: Op::Signal {
                    name: n, payload, ..
                },
                ok,
                ..
            } if n == name => Some((e.t0, e.t1, payload.as_str(), *ok)),
            _ => None,
        })
        .collect()
}

/// P38: signals. A job that waits for signal `s` is claimed to run only once a call sending
/// `s` may have committed, or, with a bound, once its deadline may have passed; a delivery
/// reads the payload of the call that sent `s` first (a latch: later calls change nothing and
/// release nothing), never none without a bound, and never none when it was published after
/// `s` had been sent. Calls made after the first one returned release no job.
fn signals(ix: &Index<'_>, out: &mut Vec<Broken>) {
    let mut calls = HashMap::new();
    for name in super::world::SIGNALS {
        calls.insert(name.to_string(), signal_ops(ix, name));
    }
    // Per signal: when its first call began; when the first that returned `Ok` ended; the
    // payloads that may have been first (calls begun before that end).
    let first_start = |name: &str| calls[name].iter().map(|c| c.0).min();
    let first_ok_end = |name: &str| calls[name].iter().filter(|c| c.3).map(|c| c.1).min();
    let may_be_first = |name: &str, payload: &str| {
        let end = first_ok_end(name).unwrap_or(i64::MAX);
        calls[name].iter().any(|c| c.0 < end && c.2 == payload)
    };
    for e in &ix.ops {
        if let What::Op {
            op: Op::Signal { name, released, .. },
            ok: true,
            ..
        } = &e.what
        {
            if first_ok_end(name).is_some_and(|end| e.t0 > end) && *released > 0 {
                out.push(Broken {
                    promise: "P38",
                    what: format!(
                        "signal {name:?} sent again after a first call had returned, and \
                         released {released} jobs"
                    ),
                    jobs: Vec::new(),
                    from: e.t0,
                    to: e.t1,
                });
            }
        }
    }
    let mut reads: HashMap<i64, Vec<&Ev>> = HashMap::new();
    for e in ix.evs {
        if let What::ReadSignal { id, .. } = &e.what {
            reads.entry(*id).or_default().push(e);
        }
    }
    for (id, (p0, _, msg)) in &ix.published {
        let Some(name) = &msg.signal else { continue };
        let deadline = msg
            .signal_timeout_ms
            .map(|ms| p0 + ms as i64 * 1000 - SLACK);
        let sent_before_publish = calls[name.as_str()].iter().any(|c| c.3 && c.1 < *p0);
        for r in ix.runs.get(id).into_iter().flatten() {
            // A run its handler started (a claim may take a cancelled job only to end it).
            let (Some((_, c1)), Some(_)) = (r.claim, r.start) else {
                continue;
            };
            let too_soon =
                first_start(name).is_none_or(|s| c1 < s) && deadline.is_none_or(|d| c1 < d);
            if too_soon {
                out.push(Broken {
                    promise: "P38",
                    what: format!(
                        "job {id} claimed before its signal {name:?} was sent{}",
                        match msg.signal_timeout_ms {
                            Some(ms) => format!(" and before its {ms} ms deadline"),
                            None => String::new(),
                        }
                    ),
                    jobs: vec![*id],
                    from: *p0,
                    to: c1,
                });
            }
        }
        for e in reads.get(id).into_iter().flatten() {
            let What::ReadSignal {
                attempt, signal, ..
            } = &e.what
            else {
                continue;
            };
            let wrong = match signal {
                Some((n, _)) if n != name => Some(format!("read signal {n:?}, not {name:?}")),
                Some((_, p)) if !may_be_first(name, p) => {
                    Some(format!("read payload {p:?}, not the first call's"))
                }
                Some(_) => None,
                None if msg.signal_timeout_ms.is_none() => {
                    Some("ran without its signal, with no deadline".to_string())
                }
                None if sent_before_publish => Some(
                    "ran without its signal, though it was sent before the publish".to_string(),
                ),
                None => None,
            };
            if let Some(w) = wrong {
                out.push(Broken {
                    promise: "P38",
                    what: format!("job {id} (attempt {attempt}) waiting for {name:?}: {w}"),
                    jobs: vec![*id],
                    from: *p0,
                    to: e.t1,
                });
            }
        }
    }
}

/// P19, outputs: what a waiting job reads of a job it waited on is what that job's acked run
/// set (none if it set none), and nothing for a job that ended otherwise (a failure writes no
/// output).
fn outputs(ix: &Index<'_>, out: &mut Vec<Broken>) {
    // Per job: the outputs its runs set (by attempt).
    let mut set: HashMap<i64, Vec<(u32, String)>> = HashMap::new();
    for e in ix.evs {
        if let What::Output { id, attempt, data } = &e.what {
            set.entry(*id).or_default().push((*attempt, data.clone()));
        }
    }
    for e in ix.evs {
        let What::WaitedOn { id, deps, .. } = &e.what else {
            continue;
        };
        for (p, outcome, output) in deps {
            let Some(outcome) = outcome else { continue };
            let outputs = set.get(p).map(Vec::as_slice).unwrap_or_default();
            let fine = match outcome.as_str() {
                // Whatever a run of it set (the run whose ack committed: a run's output is
                // written by its ack only), or none.
                "Acked" => match output {
                    Some(o) => outputs.iter().any(|(_, x)| x == o),
                    None => true,
                },
                _ => output.is_none(),
            };
            if !fine {
                out.push(Broken {
                    promise: "P19",
                    what: format!(
                        "job {id} read job {p}'s output as {output:?} ({outcome}); its runs \
                         set {outputs:?}"
                    ),
                    jobs: vec![*p, *id],
                    from: e.t0,
                    to: e.t1,
                });
            }
        }
    }
}

/// P19, checkpoints: a delivery reads a checkpoint some earlier run of its job wrote, and not
/// one older than the last that surely committed before its claim.
fn checkpoints(ix: &Index<'_>, out: &mut Vec<Broken>) {
    let mut writes: HashMap<i64, Vec<(i64, i64, String, bool)>> = HashMap::new();
    for e in ix.evs {
        if let What::Checkpointed { id, data, ok, .. } = &e.what {
            writes
                .entry(*id)
                .or_default()
                .push((e.t0, e.t1, data.clone(), *ok));
        }
    }
    for e in ix.evs {
        let What::ReadCheckpoint { id, data, .. } = &e.what else {
            continue;
        };
        let mine = writes.get(id).map(Vec::as_slice).unwrap_or_default();
        let broke = |what: String| Broken {
            promise: "P19",
            what,
            jobs: vec![*id],
            from: e.t0,
            to: e.t1,
        };
        // A run whose process was killed may have committed a checkpoint and died before
        // writing its line (the soak's seeds 38800878 and 38800881, PostgreSQL row lock): what
        // it would have written, `cp<id>.<attempt>`, may be read.
        let killed_wrote = |d: &str| {
            ix.runs.get(id).into_iter().flatten().any(|r| {
                r.killed.is_some()
                    && r.settle.is_none()
                    && r.start
                        .is_some_and(|(s, a)| s < e.t0 && d == format!("cp{id}.{a}"))
            })
        };
        if let Some(d) = data {
            if killed_wrote(d) {
                continue;
            }
            if !mine.iter().any(|w| w.2 == *d && w.0 < e.t0) {
                out.push(broke(format!(
                    "job {id} read a checkpoint {d:?} no run of it wrote"
                )));
                continue;
            }
        }
        // The last write that surely committed before this read, and whether a later one may
        // have committed too.
        let Some(last) = mine
            .iter()
            .filter(|w| w.3 && w.1 < e.t0)
            .max_by_key(|w| w.1)
        else {
            continue;
        };
        let later = mine
            .iter()
            .any(|w| w.1 > last.0 && w.0 < e.t0 && w.2 != last.2);
        if !later && data.as_deref() != Some(last.2.as_str()) {
            out.push(broke(format!(
                "job {id} read checkpoint {data:?}, its last committed was {:?}",
                last.2
            )));
        }
    }
}

/// P1: a job is in work with one holder at a time. A second claim committed while the first
/// holder was certainly still holding it (claimed before, settling only after) breaks it,
/// unless the first holder lost it and was told (its settlement failed), was held past the
/// handler timeout, or its broker's sessions were ended or its process killed meanwhile.
fn one_holder(ix: &Index<'_>, out: &mut Vec<Broken>) {
    for (id, runs) in &ix.runs {
        for (i, a) in runs.iter().enumerate() {
            let (Some((_, a1)), Some(until)) = (a.claim, a.surely_until()) else {
                continue;
            };
            if a.start.is_none() || a.may_have_lost() || a.killed.is_some() || ix.lost_unseen(a) {
                continue;
            }
            for b in &runs[i + 1..] {
                let Some((b0, b1)) = b.claim else { continue };
                if a1 < b0 && b1 < until && !ix.faulted(a.who, a1, b1) {
                    // A lease holder whose renewals fell behind on a loaded machine learns it
                    // at its settlement: that failure is `may_have_lost` above.
                    out.push(Broken {
                        promise: "P1",
                        what: format!(
                            "job {id} claimed by broker {} while broker {} held it (claimed \
                             before, settled after)",
                            b.who, a.who
                        ),
                        jobs: vec![*id],
                        from: a1,
                        to: until,
                    });
                }
            }
        }
    }
}

/// P1 and P11, the fence: a settlement that returned `Ok` was made while its run still held
/// the row. Another claim of the job that committed after this run's claim and before its
/// settlement began means the row was no longer this run's (its lease ran out or was cleared
/// by a handler timeout, its session ended), and the settlement must fail (`LeaseLost`,
/// `HandlerTimeout`, a lost connection). In the forms that hold a row by a session, a run whose
/// sessions a fault ended is left out (its settlement may be retried on a new session).
fn fenced(ix: &Index<'_>, out: &mut Vec<Broken>) {
    for (id, runs) in &ix.runs {
        for a in runs {
            let (Some((_, a1)), Some(_), Some((s0, _, how, true, _))) =
                (a.claim, a.start, &a.settle)
            else {
                continue;
            };
            if matches!(how, How::Drop | How::Panic) {
                continue;
            }
            if ix.world.form != Form::Lease && ix.faulted(a.who, a1, *s0) {
                continue;
            }
            for b in runs {
                let Some((b0, b1)) = b.claim else { continue };
                if std::ptr::eq(a, b) || b0 <= a1 || b1 >= *s0 {
                    continue;
                }
                out.push(Broken {
                    promise: "P1",
                    what: format!(
                        "job {id}: broker {}'s {how:?} returned Ok after broker {} claimed the \
                         job (after its own claim, before its settlement)",
                        a.who, b.who
                    ),
                    jobs: vec![*id],
                    from: a1,
                    to: *s0,
                });
                break;
            }
        }
    }
}

/// P2: attempts. A job's first delivery reads 1 (and the first after it was requeued from the
/// dead letters); in the lease and advisory lock forms every later delivery reads more than
/// the one before; in the row lock form one more after a committed retry or failure, the same
/// or one more otherwise (a crash spends none).
fn attempts(ix: &Index<'_>, out: &mut Vec<Broken>) {
    for (id, runs) in &ix.runs {
        let mut starts: Vec<&Run> = runs.iter().filter(|r| r.start.is_some()).collect();
        starts.sort_by_key(|r| r.start.map(|s| s.0));
        let mut prev: Option<&Run> = None;
        for r in starts {
            let (t, a) = r.start.unwrap_or_default();
            let broke = |what: String| Broken {
                promise: "P2",
                what,
                jobs: vec![*id],
                from: prev.and_then(|p| p.start).map_or(t, |s| s.0),
                to: t,
            };
            match prev {
                None => {
                    // Rows claimed before it and never started (claimed ahead by a process
                    // that died, or whose hand-back failed) may each have spent an attempt.
                    let unstarted = runs
                        .iter()
                        .filter(|r| r.start.is_none() && r.claim.is_some_and(|c| c.1 < t))
                        .count() as u32;
                    // And a claim whose answer a fault lost (its session ended, its process
                    // killed, its connection silent while the take committed) spent one
                    // unseen: the soak's seed 355868076 on MariaDB advisory, a take committed
                    // while broker 1's connection was silent.
                    let published = ix.published.get(id).map_or(0, |p| p.0);
                    let lost = ix
                        .faults
                        .iter()
                        .filter(|e| {
                            matches!(
                                e.what,
                                What::Fault {
                                    fault: Fault::Silent | Fault::SessionsEnded | Fault::Killed,
                                    ..
                                }
                            ) && e.t0 < t
                                && e.t1 + SILENT_TAIL > published
                        })
                        .count() as u32;
                    let spent = if ix.world.form == Form::RowLock {
                        0
                    } else {
                        unstarted + lost
                    };
                    if (a < 1 || a > 1 + spent) && !ix.requeued(*id, 0, t) {
                        out.push(broke(format!(
                            "job {id}'s first delivery read attempt {a} ({unstarted} claims of \
                             it before were never started, {lost} faults may have lost one)"
                        )));
                    }
                }
                Some(p) => {
                    let (pt, pa) = p.start.unwrap_or_default();
                    if ix.requeued(*id, pt, t) {
                        // Requeued meanwhile: attempts start again (checked loosely: the
                        // requeue may have come before or after the last attempt's end).
                    } else if ix.world.form == Form::RowLock {
                        let committed_retry =
                            matches!(p.settle, Some((_, _, How::Fail | How::RetryAfter, true, _)))
                                && !p.may_have_lost();
                        let ok = match committed_retry {
                            true => a == pa + 1,
                            false => a == pa || a == pa + 1,
                        };
                        if !ok {
                            out.push(broke(format!(
                                "job {id} read attempt {a} after attempt {pa} ({:?})",
                                p.settle.as_ref().map(|s| (s.2, s.3))
                            )));
                        }
                    } else if a <= pa {
                        out.push(broke(format!(
                            "job {id} read attempt {a} after attempt {pa}"
                        )));
                    }
                }
            }
            prev = Some(r);
        }
    }
}

/// P3: a finished job stays finished. After its ack returned `Ok`, a job is never claimed
/// again; after a dead letter or a cancel by its handler, never again unless requeued from the
/// dead letters meanwhile; after the operator's cancel returned `true`, no handler starts it
/// from a claim made afterwards (a claim may still take the row to end it as cancelled, the
/// advisory lock form's way when its key was held) unless requeued meanwhile.
fn finished_stays_finished(ix: &Index<'_>, out: &mut Vec<Broken>) {
    for (id, runs) in &ix.runs {
        // When (returned, and called: it committed in between), by what, whether an ack,
        // whether only a handler's start counts.
        let mut ends: Vec<(i64, i64, String, bool, bool)> = Vec::new();
        for r in runs {
            if let Some((t0, t1, how, true, _)) = &r.settle {
                if how.ends() {
                    let by = format!("{how:?} by broker {}", r.who);
                    ends.push((*t1, *t0, by, *how == How::Ack, false));
                }
            }
        }
        for e in &ix.ops {
            if let What::Op {
                op: Op::Cancel(j),
                ok: true,
                ..
            } = &e.what
            {
                if j == id {
                    ends.push((e.t1, e.t0, "the operator's cancel".into(), false, true));
                }
            }
        }
        for (end, called, how, acked, starts_only) in ends {
            for r in runs {
                let Some((c0, c1)) = r.claim else { continue };
                if starts_only && r.start.is_none() {
                    continue;
                }
                // A requeue of every dead letter that returned before the dead letter's call
                // did may still have come after its commit (the soak's seed 54939493 on
                // PostgreSQL lease): the window opens at the call.
                if c0 > end && (acked || !ix.requeued(*id, called, c1)) {
                    out.push(Broken {
                        promise: "P3",
                        what: format!("job {id} claimed by broker {} after {how}", r.who),
                        jobs: vec![*id],
                        from: end,
                        to: c1,
                    });
                }
            }
        }
    }
}

/// P4: nothing is lost. At the end every published job is live (ready or scheduled), dead, or
/// gone because something ended it: an ack, a cancel, a purge, a delete by hand. A live job
/// whose ack returned `Ok` is a lost ack.
fn nothing_lost(ix: &Index<'_>, fin: &Final, out: &mut Vec<Broken>) {
    for (id, (t0, t1, _)) in &ix.published {
        let runs = ix.runs.get(id).map(Vec::as_slice).unwrap_or_default();
        let acked_ok = runs
            .iter()
            .any(|r| matches!(r.settle, Some((_, _, How::Ack, true, _))));
        let op_ended = ix.ops.iter().any(|e| match &e.what {
            What::Op { op, .. } => match op {
                Op::Cancel(j) | Op::Delete(j) => j == id,
                Op::Purge(ids) => ids.contains(id),
                _ => false,
            },
            _ => false,
        });
        // A settlement that says it ended the job, or one whose answer never came back: the
        // handler of a process killed after its ack committed, before it wrote its line.
        let could_end = runs.iter().any(|r| match &r.settle {
            Some((_, _, how, _, _)) => matches!(how, How::Ack | How::Cancel),
            None => r.start.is_some() && r.killed.is_some(),
        });
        match fin.get(id) {
            None if !(acked_ok || op_ended || could_end) => out.push(Broken {
                promise: "P4",
                what: format!("job {id} is gone, and nothing in the history ended it"),
                jobs: vec![*id],
                from: *t0,
                to: *t1,
            }),
            Some(false) if acked_ok => out.push(Broken {
                promise: "P4",
                what: format!("job {id}'s ack returned Ok, and it is still live"),
                jobs: vec![*id],
                from: *t0,
                to: runs
                    .last()
                    .and_then(|r| r.settle.as_ref().map(|s| s.1))
                    .unwrap_or(*t1),
            }),
            _ => {}
        }
    }
}

/// P5: a pause stops claims. No claim starts later than a poll interval (and a little slack)
/// after `pause` returned, until `resume` was called.
fn paused(ix: &Index<'_>, out: &mut Vec<Broken>) {
    let mut calls: Vec<(i64, i64, bool)> = ix
        .ops
        .iter()
        .filter_map(|e| match &e.what {
            What::Op {
                op: Op::Pause,
                ok: true,
                ..
            } => Some((e.t0, e.t1, true)),
            What::Op { op: Op::Resume, .. } => Some((e.t0, e.t1, false)),
            _ => None,
        })
        .collect();
    calls.sort();
    for (i, (_, p1, pause)) in calls.iter().enumerate() {
        if !pause {
            continue;
        }
        let until = calls[i + 1..]
            .iter()
            .find(|c| !c.2)
            .map_or(i64::MAX, |c| c.0);
        let from = p1 + POLL.as_micros() as i64 + SLACK;
        for (id, runs) in &ix.runs {
            for r in runs {
                if let Some((c0, c1)) = r.claim {
                    if ix.claim_start(r.who, c0) > from && c1 < until {
                        out.push(Broken {
                            promise: "P5",
                            what: format!(
                                "job {id} claimed by broker {} while the table was paused",
                                r.who
                            ),
                            jobs: vec![*id],
                            from: *p1,
                            to: c1,
                        });
                    }
                }
            }
        }
    }
}

/// P23: queues and kinds. Broker 1, which claims some queues and kinds only, never claims a
/// row of another queue or kind.
fn views(ix: &Index<'_>, out: &mut Vec<Broken>) {
    let Some((queues, kinds)) = &ix.world.view else {
        return;
    };
    for (id, runs) in &ix.runs {
        let Some((t0, _, msg)) = ix.published.get(id) else {
            continue;
        };
        for r in runs.iter().filter(|r| r.who == 1) {
            let Some((_, c1)) = r.claim else { continue };
            let q_ok = msg.queue.as_ref().is_some_and(|q| queues.contains(q));
            let k_ok = msg.kind.as_ref().is_some_and(|k| kinds.contains(k));
            if !q_ok || !k_ok {
                out.push(Broken {
                    promise: "P23",
                    what: format!(
                        "job {id} of queue {:?} and kind {:?} claimed by broker 1, which claims \
                         {queues:?} and {kinds:?} only",
                        msg.queue, msg.kind
                    ),
                    jobs: vec![*id],
                    from: *t0,
                    to: c1,
                });
            }
        }
    }
}

/// P24: a queue's pause. No claim that starts after `pause_queue(q)` returned takes a row of
/// `q` until `resume_queue(q)` is called (every claim reads the paused queues: no poll).
fn queue_paused(ix: &Index<'_>, out: &mut Vec<Broken>) {
    let mut calls: Vec<(i64, i64, bool, &str)> = ix
        .ops
        .iter()
        .filter_map(|e| match &e.what {
            What::Op {
                op: Op::PauseQueue(q),
                ok: true,
                ..
            } => Some((e.t0, e.t1, true, q.as_str())),
            What::Op {
                op: Op::ResumeQueue(q),
                ..
            } => Some((e.t0, e.t1, false, q.as_str())),
            _ => None,
        })
        .collect();
    calls.sort();
    for (i, (_, p1, pause, q)) in calls.iter().enumerate() {
        if !pause {
            continue;
        }
        let until = calls[i + 1..]
            .iter()
            .find(|c| !c.2 && c.3 == *q)
            .map_or(i64::MAX, |c| c.0);
        for (id, runs) in &ix.runs {
            let Some((_, _, msg)) = ix.published.get(id) else {
                continue;
            };
            if msg.queue.as_deref() != Some(*q) {
                continue;
            }
            for r in runs {
                let Some((c0, c1)) = r.claim else { continue };
                if ix.claim_start(r.who, c0) > *p1 && c1 < until {
                    out.push(Broken {
                        promise: "P24",
                        what: format!(
                            "job {id} of queue {q} claimed by broker {} while the queue was paused",
                            r.who
                        ),
                        jobs: vec![*id],
                        from: *p1,
                        to: c1,
                    });
                }
            }
        }
    }
}

/// P6: dedup keys. A publish refused as a duplicate names a job of that key; a publish that
/// made a row with a key made it while no earlier job of the key was certainly unfinished.
fn dedup(ix: &Index<'_>, out: &mut Vec<Broken>) {
    let mut by_key: HashMap<&str, Vec<(i64, i64, i64)>> = HashMap::new();
    for (id, (t0, t1, msg)) in &ix.published {
        if let Some(d) = &msg.dedup {
            by_key.entry(d).or_default().push((*id, *t0, *t1));
        }
    }
    for e in ix.evs {
        if let What::Refused {
            msg,
            dup_of: Some(of),
            ..
        } = &e.what
        {
            if let Some((_, _, held)) = ix.published.get(of) {
                if held.dedup != msg.dedup {
                    out.push(Broken {
                        promise: "P6",
                        what: format!(
                            "a publish with key {:?} was refused as a duplicate of job {of}, \
                             whose key is {:?}",
                            msg.dedup, held.dedup
                        ),
                        jobs: vec![*of],
                        from: e.t0,
                        to: e.t1,
                    });
                }
            }
        }
    }
    for (key, jobs) in by_key {
        for (i, (a, _, a1)) in jobs.iter().enumerate() {
            let finished = ix.may_have_finished(*a);
            for (b, b0, b1) in &jobs[i + 1..] {
                if a1 < b0 && *b1 < finished {
                    out.push(Broken {
                        promise: "P6",
                        what: format!(
                            "job {b} was published with dedup key {key:?} while job {a} held it"
                        ),
                        jobs: vec![*a, *b],
                        from: *a1,
                        to: *b1,
                    });
                }
            }
        }
    }
}

/// P7: FIFO groups. A job of a group is not claimed while an earlier job of the group
/// (published before it began publishing) is certainly unfinished; two jobs of one group are
/// never in work at once.
fn fifo(ix: &Index<'_>, out: &mut Vec<Broken>) {
    let mut groups: HashMap<&str, Vec<i64>> = HashMap::new();
    for (id, (_, _, msg)) in &ix.published {
        if let Some(g) = &msg.group {
            groups.entry(g).or_default().push(*id);
        }
    }
    for (g, jobs) in groups {
        for (i, a) in jobs.iter().enumerate() {
            let (_, a1, _) = &ix.published[a];
            let finished = ix.may_have_finished(*a);
            for b in &jobs[i + 1..] {
                let (b0, _, _) = &ix.published[b];
                if a1 >= b0 {
                    continue;
                }
                for r in ix.runs.get(b).into_iter().flatten() {
                    let Some((_, c1)) = r.claim else { continue };
                    if c1 < finished {
                        out.push(Broken {
                            promise: "P7",
                            what: format!(
                                "job {b} of group {g} claimed by broker {} while job {a}, \
                                 published before it, was unfinished",
                                r.who
                            ),
                            jobs: vec![*a, *b],
                            from: *a1,
                            to: c1,
                        });
                    }
                }
            }
        }
    }
}

/// The maxes a limit may have had in force at some moment of `[from, to]`: the described
/// one, then each operator's setting (an operator's call is in force somewhere within it).
/// `None` among them: lifted at some moment.
fn maxes_within(
    ix: &Index<'_>,
    described: Option<u32>,
    is: impl Fn(&Op) -> Option<Option<u32>>,
    from: i64,
    to: i64,
) -> Vec<Option<u32>> {
    let mut set: Vec<(i64, i64, Option<u32>)> = ix
        .ops
        .iter()
        .filter_map(|e| match &e.what {
            What::Op { op, ok: true, .. } => is(op).map(|m| (e.t0, e.t1, m)),
            _ => None,
        })
        .collect();
    set.sort_by_key(|s| s.0);
    let mut out = Vec::new();
    let mut current = described;
    for (t0, t1, max) in set {
        if t1 < from {
            current = max;
            continue;
        }
        if t0 > to {
            break;
        }
        out.push(current);
        current = max;
    }
    out.push(current);
    out
}

/// P8: concurrency limits. No claim of a key commits while `max` other rows of that key are
/// certainly in work, for the largest max that may have been in force while it ran.
///
/// For claim C (called at `c0`, returned at `c1`), the others are the rows whose claims
/// returned before `c1` and that are surely in work past it: claims side by side with C
/// included, which is how two claims that each counted before the other took its row show.
/// All of them and C are in work at `c1`, so the last of them to commit did so while the rest
/// were in work; it committed at or after C's start (C committed after it) and by `c1`, and
/// read the maxes within its own call: the largest max of `[start - SLACK, c1]`, with `start`
/// the earliest call among C and the claims that returned after `c0`, bounds what it saw.
fn concurrency(ix: &Index<'_>, out: &mut Vec<Broken>) {
    let w = ix.world;
    for (li, (template, described)) in w.limits.iter().enumerate() {
        // Per rendered key: every run with its job.
        let mut by_key: HashMap<String, Vec<(i64, &Run)>> = HashMap::new();
        for (id, runs) in &ix.runs {
            let Some((_, _, msg)) = ix.published.get(id) else {
                continue;
            };
            let key = w.limit_keys(msg.key.as_deref())[li].clone();
            for r in runs {
                by_key.entry(key.clone()).or_default().push((*id, r));
            }
        }
        for (key, runs) in &by_key {
            for (id, c) in runs {
                let Some((c0, c1)) = c.claim else { continue };
                let others: Vec<&(i64, &Run)> = runs
                    .iter()
                    .filter(|(j, r)| {
                        j != id
                            && r.start.is_some()
                            && !r.may_have_lost()
                            && !ix.lost_unseen(r)
                            && r.claim.is_some_and(|(_, r1)| r1 < c1)
                            && r.surely_until().is_some_and(|u| u > c1)
                            && !ix.faulted(r.who, r.claim.map_or(0, |x| x.1), c1)
                            // A row deleted by hand holds no lease, whatever its handler does
                            // (the soak's seed 945635451 on SQLite lease).
                            && !ix.deleted_before(*j, c1)
                    })
                    .collect();
                let start = others
                    .iter()
                    .filter_map(|(_, r)| r.claim)
                    .filter(|(_, r1)| *r1 >= c0)
                    .fold(c0, |s, (r0, _)| s.min(r0));
                let held: Vec<i64> = others.iter().map(|(j, _)| *j).collect();
                let maxes = maxes_within(
                    ix,
                    Some(*described),
                    |op| match op {
                        Op::SetLimit(k, m) if k == template => Some(*m),
                        _ => None,
                    },
                    start - SLACK,
                    c1,
                );
                let Some(allowed) = maxes
                    .iter()
                    .copied()
                    .try_fold(0u32, |a, m| m.map(|m| a.max(m)))
                else {
                    continue;
                };
                if held.len() as u32 >= allowed {
                    let mut jobs = held.clone();
                    jobs.push(*id);
                    out.push(Broken {
                        promise: "P8",
                        what: format!(
                            "job {id} of key {key:?} of limit {template:?} claimed by broker {} \
                             while {} others of the key were in work ({held:?}), max {allowed}",
                            c.who,
                            held.len()
                        ),
                        jobs,
                        from: c0,
                        to: c1,
                    });
                }
            }
        }
    }
}

/// P9: a rate limit's window slots are bounded: at the run's end no key keeps more slots than
/// the largest max ever in force (`slots`: each key's count in `<table>_rates`, read then).
pub fn rate_slots(world: &World, evs: &[Ev], slots: &[i64]) -> Vec<Broken> {
    let Some((template, described, _)) = &world.rate else {
        return Vec::new();
    };
    let ix = Index::new(world, evs);
    // Lifted at some point: any max may have been set around it (an operator's ops only).
    let largest = maxes_within(
        &ix,
        Some(*described),
        |op| match op {
            Op::SetRate(k, _, m) if k == template => Some(*m),
            _ => None,
        },
        i64::MIN,
        i64::MAX,
    )
    .into_iter()
    .flatten()
    .max()
    .unwrap_or(*described);
    slots
        .iter()
        .filter(|n| **n > i64::from(largest))
        .map(|n| Broken {
            promise: "P9",
            what: format!("a key keeps {n} window slots; the largest max in force was {largest}"),
            jobs: Vec::new(),
            from: 0,
            to: 0,
        })
        .collect()
}

/// P9: rate limits. No window of `per` holds more than `max` claims of a key, for the largest
/// max that may have been in force in it or a window before it.
fn rates(ix: &Index<'_>, out: &mut Vec<Broken>) {
    let w = ix.world;
    let Some((template, described, per)) = &w.rate else {
        return;
    };
    let per_us = per.as_micros() as i64;
    let mut by_key: HashMap<String, Vec<(i64, i64, i64)>> = HashMap::new();
    for (id, runs) in &ix.runs {
        let Some((_, _, msg)) = ix.published.get(id) else {
            continue;
        };
        let key = msg.key.clone().unwrap_or_default();
        for r in runs {
            if let Some((c0, c1)) = r.claim {
                let c0 = ix.claim_start(r.who, c0);
                by_key.entry(key.clone()).or_default().push((c0, c1, *id));
            }
        }
    }
    for (key, mut claims) in by_key {
        claims.sort_by_key(|c| c.1);
        for i in 0..claims.len() {
            let maxes = maxes_within(
                ix,
                Some(*described),
                |op| match op {
                    Op::SetRate(k, _, m) if k == template => Some(*m),
                    _ => None,
                },
                claims[i].0 - per_us - SLACK,
                claims[i].1 + per_us,
            );
            let Some(allowed) = maxes
                .iter()
                .copied()
                .try_fold(0u32, |a, m| m.map(|m| a.max(m)))
            else {
                continue;
            };
            let j = i + allowed as usize;
            let Some(last) = claims.get(j) else { continue };
            // The earliest any of them may have taken its slot: claims sorted by commit
            // may have started in another order (the soak's seed 839770618 on MariaDB
            // advisory: a claim of 90 ms, committed after one that started after it).
            let first = claims[i..=j]
                .iter()
                .map(|c| c.0)
                .min()
                .unwrap_or(claims[i].0);
            // Window slots are stamped to the millisecond: a window a few hundred microseconds
            // short of `per` by the hooks' clock is one by the stamps' (the soak's seed
            // 945635459 on SQLite lease, 999.2 ms).
            if last.1 - first + STAMP_RESOLUTION < per_us {
                out.push(Broken {
                    promise: "P9",
                    what: format!(
                        "{} claims of key {key:?} within {:?}, max {allowed} per {per:?}",
                        allowed + 1,
                        Duration::from_micros((last.1 - first) as u64)
                    ),
                    jobs: claims[i..=j].iter().map(|c| c.2).collect(),
                    from: first,
                    to: last.1,
                });
            }
        }
    }
}

/// The shortest stretch of the history that shows `b`: the events of its jobs, and the
/// operators' calls and faults, from a little before to a little after it.
pub fn stretch(evs: &[Ev], b: &Broken) -> Vec<Ev> {
    let jobs: HashSet<i64> = b.jobs.iter().copied().collect();
    let margin = (LEASE.as_micros() as i64).max(500_000);
    let mut out: Vec<Ev> = evs
        .iter()
        .filter(|e| {
            let near = e.t1 >= b.from - margin && e.t0 <= b.to + margin;
            let mine = e.job().is_some_and(|j| jobs.contains(&j));
            let general = matches!(e.what, What::Fault { .. })
                || matches!(&e.what, What::Op { op, .. } if e.job().is_none()
                    && !matches!(op, Op::Requeue(ids) | Op::Purge(ids)
                        if !ids.is_empty() && !ids.iter().any(|i| jobs.contains(i))));
            (mine && (near || matches!(e.what, What::Published { .. }))) || (general && near)
        })
        .cloned()
        .collect();
    out.sort_by_key(|e| (e.t0, e.t1));
    out
}
