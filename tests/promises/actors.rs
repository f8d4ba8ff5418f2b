//! The actors of a run, each on threads of its own and each recording what it did in the
//! ledger: brokers working the table (two in this process, one in a child process that the
//! faults kill and start again), a producer, an operator, and the faults.
//!
//! A handler's behaviour for a delivery is drawn from the seed, the job and the attempt, so the
//! same job at the same attempt behaves alike on whichever broker or process takes it.

use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use sqlbroker::{Broker, BrokerError, ClaimedRows, Delivery, Events, JobState, Table};

use super::history::{
    now_micros, Ev, Fault, How, Ledger, Op, What, Who, FAULTS, OPERATOR, PRODUCER,
};
use super::rng::Rng;
use super::world::{Profile, World, HANDLER_TIMEOUT, LEASE, POLL};
use crate::common::{self, Db};

/// The environment variable that makes this test binary a worker process:
/// `<db>\t<form>\t<url>\t<table>\t<seed>\t<who>`.
pub const CHILD_ENV: &str = "SQLBROKER_PROMISES_CHILD";

/// Where a worker's events go: the run's ledger, or (a child process) its stdout.
#[derive(Clone)]
pub enum Sink {
    Ledger(Ledger),
    Stdout,
}

impl Sink {
    fn push(&self, ev: Ev) {
        match self {
            Sink::Ledger(l) => l.push(ev),
            Sink::Stdout => {
                let line = format!("{}\n", ev.line());
                let mut out = std::io::stdout().lock();
                let _ = out.write_all(line.as_bytes());
                let _ = out.flush();
            }
        }
    }

    fn now(&self, who: Who, what: What) {
        let t = now_micros();
        self.push(Ev {
            t0: t,
            t1: t,
            who,
            what,
        });
    }
}

/// The `claimed` hook: each row of a claim, from the claim's start to just after its commit.
struct Hook {
    sink: Sink,
    who: Who,
}

impl Events for Hook {
    fn claimed(&self, e: &ClaimedRows<'_>) {
        let t1 = now_micros();
        let t0 = t1 - e.took.as_micros() as i64;
        for id in e.ids {
            self.sink.push(Ev {
                t0,
                t1,
                who: self.who,
                what: What::Claimed { id: *id },
            });
        }
    }
}

/// A broker's subscription and its handler threads, until `stop`.
pub struct Worker {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl Worker {
    /// Starts a subscription of `table` on `broker` as broker `who`, with `handlers` threads.
    pub fn start(world: &World, who: Who, broker: Broker, table: Table, sink: Sink) -> Worker {
        let mut r = Rng::new(world.seed).fork(100 + u64::from(who));
        let stop = Arc::new(AtomicBool::new(false));
        let handlers = 3 + r.below(2) as usize;
        let in_flight = 1 + r.below(4) as usize;
        let mut sub = broker.subscription(&table);
        // Broker 1 claims some queues and kinds only (a table that has them).
        if let (1, Some((queues, kinds))) = (who, &world.view) {
            sub = sub.queues(queues.clone()).kinds(kinds.clone());
        }
        let sub = sub
            .workers(2)
            .batch_size(1 + r.below(3) as usize)
            .max_in_flight(in_flight)
            .poll_interval(POLL)
            .handler_timeout(HANDLER_TIMEOUT)
            .retry_policy(World::retry_policy())
            .events(Arc::new(Hook {
                sink: sink.clone(),
                who,
            }))
            .start()
            .expect("start a worker's subscription");
        let sub = Arc::new(sub);
        let mut threads = Vec::new();
        for _ in 0..handlers {
            let (sub, stop, sink, world) = (sub.clone(), stop.clone(), sink.clone(), world.clone());
            threads.push(std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    if let Ok(d) = sub.next_delivery_timeout(Duration::from_millis(100)) {
                        handle(&world, who, d, &sink);
                    }
                }
            }));
        }
        let (sub2, stop2) = (sub.clone(), stop.clone());
        threads.push(std::thread::spawn(move || {
            while !stop2.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(50));
            }
            // Rows claimed ahead go back; the handlers have stopped taking more.
            let _ = sub2.shutdown(Duration::from_secs(10));
        }));
        Worker { stop, threads }
    }

    /// Stops taking rows, settles what is in hand, shuts the subscription down.
    pub fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            let _ = t.join();
        }
    }
}

/// The message a handler panics with (the test's panic hook keeps it quiet).
pub const PANIC: &str = "promise checker: a handler panics";

/// Works one delivery as the seed says, recording its start and its end.
fn handle(world: &World, who: Who, d: Delivery, sink: &Sink) {
    let (id, attempt) = (d.id(), d.attempt());
    sink.now(who, What::Started { id, attempt });
    let mut r = Rng::new(world.seed).fork(((id as u64) << 8) ^ u64::from(attempt));
    let compose = world.profile == Profile::Compose;
    if compose {
        let data = d
            .last_checkpoint()
            .map(|c| String::from_utf8_lossy(&c).into_owned());
        sink.now(who, What::ReadCheckpoint { id, attempt, data });
        if world.signals {
            let signal = d.signal().map(|s| {
                (
                    s.name().to_string(),
                    String::from_utf8_lossy(s.payload()).into_owned(),
                )
            });
            sink.now(
                who,
                What::ReadSignal {
                    id,
                    attempt,
                    signal,
                },
            );
        }
        if let Ok(deps) = d.waited_on() {
            if !deps.is_empty() {
                let deps = deps
                    .iter()
                    .map(|dep| {
                        (
                            dep.id,
                            dep.outcome.map(|o| format!("{o:?}")),
                            dep.output
                                .as_ref()
                                .map(|o| String::from_utf8_lossy(o).into_owned()),
                        )
                    })
                    .collect();
                sink.now(who, What::WaitedOn { id, attempt, deps });
            }
        }
        if r.chance(30) {
            let data = format!("cp{id}.{attempt}");
            let t0 = now_micros();
            let ok = d.checkpoint(data.as_bytes()).is_ok();
            sink.push(Ev {
                t0,
                t1: now_micros(),
                who,
                what: What::Checkpointed {
                    id,
                    attempt,
                    data,
                    ok,
                },
            });
        }
    }
    let how = match r.weighted(&[62, 8, 5, 4, 3, 4, 2, 2]) {
        // The drain acks what is left: a retry would hold a FIFO group until it is due (a
        // second away where due times are whole seconds).
        _ if world.is_draining() => How::Ack,
        0 => How::Ack,
        1 => How::Fail,
        2 => How::RetryAfter,
        3 => How::DeadLetter,
        4 => How::Cancel,
        5 => How::Drop,
        6 => How::Panic,
        // Held past the handler timeout, then acked: the library has failed it meanwhile.
        _ => {
            std::thread::sleep(HANDLER_TIMEOUT + Duration::from_millis(300));
            How::Ack
        }
    };
    // Most deliveries are short; some are held long enough for rows to pile up in work under
    // the limits (still within the handler timeout).
    // The drain runs what is left at once (the draws above are made all the same, so a
    // seed's choices do not shift).
    let hold = match r.chance(25) {
        true => 200 + r.below(900),
        false => r.below(world.hold_max.as_millis() as u64 + 1),
    };
    let hold = if world.is_draining() { 0 } else { hold };
    std::thread::sleep(Duration::from_millis(hold));
    let settle = |call: &dyn Fn() -> Result<(), BrokerError>| {
        let t0 = now_micros();
        let res = call();
        let t1 = now_micros();
        sink.push(Ev {
            t0,
            t1,
            who,
            what: What::Settled {
                id,
                attempt,
                how,
                ok: res.is_ok(),
                err: res.err().map(|e| e.to_string()).unwrap_or_default(),
            },
        });
    };
    // Each settlement consumes the delivery: the cell hands it over once.
    let cell = Mutex::new(Some(d));
    let take = || cell.lock().unwrap().take().expect("one settlement");
    if compose && how == How::Ack && r.chance(70) {
        let data = format!("out{id}.{attempt}");
        if let Some(d) = cell.lock().unwrap().as_ref() {
            if d.set_output(data.as_bytes()).is_ok() {
                sink.now(who, What::Output { id, attempt, data });
            }
        }
    }
    match how {
        How::Ack => settle(&|| take().ack()),
        How::Fail => settle(&|| take().fail("promise checker: a failure")),
        How::RetryAfter => settle(&|| take().retry_after(Duration::from_millis(50))),
        How::DeadLetter => settle(&|| take().dead_letter("promise checker: dead")),
        How::Cancel => settle(&|| take().cancel()),
        How::Drop => settle(&|| {
            drop(take());
            Ok(())
        }),
        How::Panic => settle(&|| {
            let d = take();
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
                let _held = d;
                panic!("{PANIC}");
            }));
            Ok(())
        }),
    }
}

/// A worker process: this test binary run with [`CHILD_ENV`], working the table until a line
/// on its stdin (or its end) says stop; its events on its stdout.
pub struct ChildWorker {
    pub who: Who,
    child: common::Child,
    reader: Option<JoinHandle<()>>,
    ready: Arc<AtomicBool>,
}

impl ChildWorker {
    /// Starts child `who` of `world` on `url`; its events go to `ledger` as they come.
    pub fn start(entry: &str, world: &World, url: &str, who: Who, ledger: &Ledger) -> ChildWorker {
        let spec = format!(
            "{}\t{}\t{url}\t{}\t{}\t{who}",
            db_name(world.db),
            common::form_name(world.form),
            world.name,
            world.seed
        );
        let child = common::spawn_child(entry, CHILD_ENV, &spec);
        let lines = child.lines.clone();
        let ledger = ledger.clone();
        let ready = Arc::new(AtomicBool::new(false));
        let seen = ready.clone();
        let reader = std::thread::spawn(move || {
            for line in lines.iter() {
                if line.contains("@@READY") {
                    seen.store(true, Ordering::Relaxed);
                } else if let Some(ev) = Ev::parse(&line) {
                    ledger.push(ev);
                }
            }
        });
        ChildWorker {
            who,
            child,
            reader: Some(reader),
            ready,
        }
    }

    /// True once the child says it is working (within `wait`).
    pub fn ready(&self, wait: Duration) -> bool {
        common::wait_for(wait, || self.ready.load(Ordering::Relaxed))
    }

    /// Freezes it (SIGSTOP) for `d`, then lets it go on (SIGCONT).
    pub fn freeze(&self, d: Duration) {
        let pid = self.child.process.id().to_string();
        let signal = |s: &str| {
            let _ = std::process::Command::new("kill").args([s, &pid]).status();
        };
        signal("-STOP");
        std::thread::sleep(d);
        signal("-CONT");
    }

    /// Kills it (SIGKILL): what it had in work is lost with it.
    pub fn kill(mut self) {
        let _ = self.child.process.kill();
        let _ = self.child.process.wait();
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
    }

    /// Tells it the run drains: its handlers settle at once from now on.
    pub fn drain(&mut self) {
        if let Some(stdin) = self.child.process.stdin.as_mut() {
            let _ = stdin.write_all(b"drain\n");
            let _ = stdin.flush();
        }
    }

    /// Asks it to stop (graceful: what it has in hand is settled), and waits for it.
    pub fn stop(mut self) {
        if let Some(mut stdin) = self.child.process.stdin.take() {
            let _ = stdin.write_all(b"stop\n");
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.process.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.process.kill();
        let _ = self.child.process.wait();
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
    }
}

fn db_name(db: Db) -> &'static str {
    match db {
        Db::Sqlite => "sqlite",
        Db::Postgres => "postgres",
        Db::Mysql => "mysql",
    }
}

/// The worker process's body, when this process is one: works the table as broker `who`
/// until a line "stop" (or the end) on its stdin.
pub fn child_main() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    super::quiet_handler_panics();
    let f: Vec<&str> = spec.split('\t').collect();
    let db = match f[0] {
        "sqlite" => Db::Sqlite,
        "postgres" => Db::Postgres,
        _ => Db::Mysql,
    };
    let form = common::form_from(f[1]);
    let (url, name) = (f[2], f[3]);
    let seed: u64 = f[4].parse().expect("seed");
    let who: Who = f[5].parse().expect("who");
    let mut world = World::new(db, form, seed);
    world.name = name.to_string();
    let broker = Broker::builder(url)
        .heartbeat(super::BEAT)
        .build()
        .expect("child: connect");
    // The table as recorded: the child describes nothing itself.
    let table = broker.open_table(name).expect("child: open the table");
    let worker = Worker::start(&world, who, broker, table, Sink::Stdout);
    println!("@@READY");
    // "drain" starts the drain; "stop" (or the end of stdin) stops.
    let mut line = String::new();
    loop {
        line.clear();
        match std::io::stdin().read_line(&mut line) {
            Ok(n) if n > 0 && line.trim() == "drain" => world.drain(),
            _ => break,
        }
    }
    worker.stop();
    std::process::exit(0);
}

/// Flags the actors' loops read.
#[derive(Clone, Default)]
pub struct Stop(Arc<AtomicBool>);

impl Stop {
    pub fn set(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    pub fn is_set(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    /// Sleeps `d`, or less if stopped meanwhile; false if stopped.
    pub fn sleep(&self, d: Duration) -> bool {
        let until = Instant::now() + d;
        while Instant::now() < until {
            if self.is_set() {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10).min(until - Instant::now()));
        }
        !self.is_set()
    }
}

/// The ids published so far, for the operator to pick from.
#[derive(Clone, Default)]
pub struct Ids(Arc<Mutex<Vec<i64>>>);

impl Ids {
    pub fn add(&self, id: i64) {
        self.0.lock().unwrap().push(id);
    }

    /// The last `n` ids.
    pub fn recent(&self, n: usize) -> Vec<i64> {
        let ids = self.0.lock().unwrap();
        ids[ids.len().saturating_sub(n)..].to_vec()
    }

    /// One of the ids, the recent ones likelier (they are more often still live).
    pub fn pick(&self, r: &mut Rng) -> Option<i64> {
        let ids = self.0.lock().unwrap();
        if ids.is_empty() {
            return None;
        }
        let n = ids.len() as u64;
        let back = if r.chance(70) {
            r.below(n.min(20))
        } else {
            r.below(n)
        };
        Some(ids[(n - 1 - back) as usize])
    }
}

/// Publishes random messages until `stop`.
pub fn producer(
    world: World,
    broker: Broker,
    ledger: Ledger,
    ids: Ids,
    stop: Stop,
    steps: Option<u64>,
) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let mut r = Rng::new(world.seed).fork(2);
        let mut n = 0;
        while stop.sleep(Duration::from_millis(3 + r.below(30))) {
            if steps.is_some_and(|s| n >= s) {
                // The history's steps are made: its active part ends for every actor.
                stop.set();
                break;
            }
            n += 1;
            let recent = ids.recent(20);
            if world.profile == Profile::Compose && r.chance(10) {
                n = publish_group(&world, &broker, &ledger, &ids, &mut r, n, &recent);
                continue;
            }
            let (m, msg) = world.message(&mut r, n, &recent);
            let t0 = now_micros();
            let res = broker.publish(&world.table, m);
            let t1 = now_micros();
            let what = match res {
                Ok(id) => {
                    ids.add(id);
                    What::Published { id, msg }
                }
                Err(e) => What::Refused {
                    msg,
                    dup_of: e.duplicate_of(),
                    err: e.to_string(),
                },
            };
            ledger.push(Ev {
                t0,
                t1,
                who: PRODUCER,
                what,
            });
        }
    })
}

/// Publishes a group of 2 or 3 jobs in one transaction (`publish_group`), each after the
/// first besides what it drew; all are written or none. Returns the last message number used.
fn publish_group(
    world: &World,
    broker: &Broker,
    ledger: &Ledger,
    ids: &Ids,
    r: &mut Rng,
    mut n: u64,
    recent: &[i64],
) -> u64 {
    let mut drawn = vec![world.message(r, n, recent)];
    for _ in 0..1 + r.below(2) {
        n += 1;
        drawn.push(world.message(r, n, recent));
    }
    // One dedup key at most, so a group refused as a duplicate tells which message was.
    let mut keyed = false;
    drawn.retain(|(_, m)| {
        let keep = !(keyed && m.dedup.is_some());
        keyed |= m.dedup.is_some();
        keep
    });
    let t0 = now_micros();
    let res = broker.publish_group(|g| {
        let mut out: Vec<i64> = Vec::new();
        for (m, _) in &drawn {
            let m = match out.first() {
                Some(&first) => m.clone().after(first),
                None => m.clone(),
            };
            out.push(g.publish(&world.table, m)?);
        }
        Ok(out)
    });
    let t1 = now_micros();
    match res {
        Ok(published) => {
            let first = published[0];
            for (i, (id, (_, mut msg))) in published.into_iter().zip(drawn).enumerate() {
                if i > 0 {
                    msg.after.push(first);
                }
                ids.add(id);
                ledger.push(Ev {
                    t0,
                    t1,
                    who: PRODUCER,
                    what: What::Published { id, msg },
                });
            }
        }
        Err(e) => {
            for (_, msg) in drawn {
                // A duplicate is the one message with a dedup key; the others are refused
                // with it.
                let dup_of = msg.dedup.as_ref().and(e.duplicate_of());
                ledger.push(Ev {
                    t0,
                    t1,
                    who: PRODUCER,
                    what: What::Refused {
                        msg,
                        dup_of,
                        err: e.to_string(),
                    },
                });
            }
        }
    }
    n
}

/// An operator acting at random moments until `stop`: cancel, pause and resume, limits set,
/// raised, lowered and lifted, run now, dead letters requeued and purged, a row deleted by
/// hand. Leaves the table resumed.
pub fn operator(
    world: World,
    broker: Broker,
    url: String,
    ledger: Ledger,
    ids: Ids,
    stop: Stop,
) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let mut r = Rng::new(world.seed).fork(3);
        let mut qr = Rng::new(world.seed).fork(8);
        let t = &world.table;
        let record = |op: Op, res: Result<String, BrokerError>, t0: i64| {
            let t1 = now_micros();
            let (ok, detail) = match res {
                Ok(d) => (true, d),
                Err(e) => (false, e.to_string()),
            };
            ledger.push(Ev {
                t0,
                t1,
                who: OPERATOR,
                what: What::Op { op, ok, detail },
            });
        };
        while stop.sleep(Duration::from_millis(80 + r.below(300))) {
            let flow = world.profile == Profile::Flow;
            let weights = [
                20,                                       // cancel
                8,                                        // pause, then resume
                if flow { 14 } else { 0 },                // a concurrency limit
                if flow { 5 } else { 0 },                 // a limit lifted a moment
                if world.rate.is_some() { 8 } else { 0 }, // the rate limit
                8,                                        // run now
                8,                                        // requeue a dead letter
                2,                                        // requeue every dead letter
                4,                                        // purge a dead letter
                5,                                        // delete a row by hand
                if world.signals { 10 } else { 0 },       // a signal
            ];
            let t0 = now_micros();
            // A queue paused a moment (tables with queues), drawn apart from `r`.
            if world.queues && qr.chance(10) {
                let q = qr.pick(&super::world::QUEUES).to_string();
                let res = broker.pause_queue(t, &q).map(|()| String::new());
                record(Op::PauseQueue(q.clone()), res, t0);
                stop.sleep(Duration::from_millis(300 + qr.below(900)));
                let t0 = now_micros();
                let res = broker.resume_queue(t, &q).map(|()| String::new());
                record(Op::ResumeQueue(q), res, t0);
                continue;
            }
            match r.weighted(&weights) {
                0 => {
                    // Half the time a job in work, as an operator cancels a stuck one from
                    // the dashboard: one claimed ahead, held by a frozen process, or running.
                    let in_work = match r.chance(50) {
                        true => broker
                            .jobs(t, JobState::InFlight, None, 20)
                            .ok()
                            .filter(|page| !page.is_empty())
                            .map(|page| page[r.below(page.len() as u64) as usize].id()),
                        false => None,
                    };
                    let Some(id) = in_work.or_else(|| ids.pick(&mut r)) else {
                        continue;
                    };
                    let res = broker.cancel(t, id).map(|b| b.to_string());
                    let cancelled = matches!(res.as_deref(), Ok("true"));
                    let t1 = now_micros();
                    ledger.push(Ev {
                        t0,
                        t1,
                        who: OPERATOR,
                        what: What::Op {
                            op: Op::Cancel(id),
                            ok: cancelled,
                            detail: format!("{res:?}"),
                        },
                    });
                }
                1 => {
                    record(Op::Pause, broker.pause(t).map(|()| String::new()), t0);
                    // Longer than a poll interval and its slack: the claims after it are checked.
                    stop.sleep(Duration::from_millis(900 + r.below(1200)));
                    let t0 = now_micros();
                    record(Op::Resume, broker.resume(t).map(|()| String::new()), t0);
                }
                2 => {
                    let (key, _) = r.pick(&world.limits).clone();
                    let max = match r.below(5) {
                        0 => None,
                        n => Some(n as u32),
                    };
                    let res = broker.set_concurrency_limit(t, &key, max);
                    record(Op::SetLimit(key, max), res.map(|()| String::new()), t0);
                }
                3 => {
                    // Lifted to let a backlog through, then set again while the rows it let
                    // through are in work: the max set again counts them.
                    let (key, _) = r.pick(&world.limits).clone();
                    let res = broker.set_concurrency_limit(t, &key, None);
                    record(
                        Op::SetLimit(key.clone(), None),
                        res.map(|()| String::new()),
                        t0,
                    );
                    stop.sleep(Duration::from_millis(150 + r.below(300)));
                    let max = Some(1 + r.below(3) as u32);
                    let t0 = now_micros();
                    let res = broker.set_concurrency_limit(t, &key, max);
                    record(Op::SetLimit(key, max), res.map(|()| String::new()), t0);
                }
                4 => {
                    let Some((key, _, per)) = world.rate.clone() else {
                        continue;
                    };
                    let max = match r.below(5) {
                        0 => None,
                        n => Some(n as u32),
                    };
                    let res = broker.set_rate_window(t, &key, per, max);
                    let op = Op::SetRate(key, per.as_millis() as u64, max);
                    record(op, res.map(|()| String::new()), t0);
                }
                5 => {
                    let Some(id) = ids.pick(&mut r) else { continue };
                    record(
                        Op::RunNow(id),
                        broker.run_now(t, id).map(|b| b.to_string()),
                        t0,
                    );
                }
                6 => {
                    let Some(id) = ids.pick(&mut r) else { continue };
                    let res = broker.requeue_dead(t, id);
                    let done = matches!(res, Ok(true));
                    record(
                        Op::Requeue(if done { vec![id] } else { Vec::new() }),
                        res.map(|b| format!("{id}: {b}")),
                        t0,
                    );
                }
                7 => {
                    // Which rows it requeued is not told: the checker takes it as every dead
                    // letter there was.
                    let res = broker.requeue_all_dead(t).map(|n| n.to_string());
                    record(Op::Requeue(Vec::new()), res, t0);
                }
                8 => {
                    let Some(id) = ids.pick(&mut r) else { continue };
                    let res = broker.purge_dead(t, id);
                    let done = matches!(res, Ok(true));
                    record(
                        Op::Purge(if done { vec![id] } else { Vec::new() }),
                        res.map(|b| format!("{id}: {b}")),
                        t0,
                    );
                }
                10 => {
                    let name = r.pick(&super::world::SIGNALS).to_string();
                    signal(&broker, t, &ledger, name, t0);
                }
                _ => {
                    let Some(id) = ids.pick(&mut r) else { continue };
                    let sql = format!("DELETE FROM {} WHERE id = {id}", world.name);
                    let res = common::try_exec(world.db, &url, &sql)
                        .map(|()| String::new())
                        .map_err(|e| BrokerError::InvalidOption {
                            option: "delete by hand",
                            reason: e,
                        });
                    record(Op::Delete(id), res, t0);
                }
            }
        }
        // The run ends with the table resumed, its limits lifted and every signal sent: the
        // drain needs it.
        let t0 = now_micros();
        record(Op::Resume, broker.resume(t).map(|()| String::new()), t0);
        if world.signals {
            for name in super::world::SIGNALS {
                signal(&broker, t, &ledger, name.to_string(), now_micros());
            }
        }
        for (key, _) in &world.limits {
            let t0 = now_micros();
            let res = broker.set_concurrency_limit(t, key, None);
            record(
                Op::SetLimit(key.clone(), None),
                res.map(|()| String::new()),
                t0,
            );
        }
        if let Some((key, _, per)) = &world.rate {
            let t0 = now_micros();
            let res = broker.set_rate_window(t, key, *per, None);
            let op = Op::SetRate(key.clone(), per.as_millis() as u64, None);
            record(op, res.map(|()| String::new()), t0);
        }
    })
}

/// Sends signal `name` (its payload the name and the moment: each call's own), recording it.
fn signal(broker: &Broker, t: &Table, ledger: &Ledger, name: String, t0: i64) {
    let payload = format!("{name}@{t0}");
    let res = broker.signal(t, &name, payload.as_bytes());
    let t1 = now_micros();
    ledger.push(Ev {
        t0,
        t1,
        who: OPERATOR,
        what: What::Op {
            op: Op::Signal {
                name,
                payload,
                released: *res.as_ref().unwrap_or(&0),
            },
            ok: res.is_ok(),
            detail: format!("{res:?}"),
        },
    });
}

/// What the faults act on.
pub struct Targets {
    /// Broker 0's worker, restarted now and then, and what it starts again with.
    pub w0: Mutex<Option<Worker>>,
    pub w0_with: (Broker, Table),
    /// Broker 1's sessions (servers): found by their mark.
    pub marked: Option<common::sessions::Marked>,
    /// The proxy broker 1's connections go through (servers).
    pub hole: Option<common::blackhole::BlackHole>,
    /// The worker process, started again after each kill.
    pub child: Mutex<Option<ChildWorker>>,
    pub next_who: AtomicU32,
    pub entry: String,
    pub url: String,
}

/// Faults at random moments until `stop`: broker 1's sessions ended, the worker process
/// killed (and a new one started) or frozen, a snapshot held open elsewhere, broker 0
/// restarted, broker 1's connections silent a moment (servers).
pub fn faults(world: World, targets: Arc<Targets>, ledger: Ledger, stop: Stop) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let mut r = Rng::new(world.seed).fork(4);
        while stop.sleep(Duration::from_millis(600 + r.below(2000))) {
            let server = world.db != Db::Sqlite;
            // The lease form is where a frozen process matters most (its leases run out under
            // its handlers): freezes come more often there.
            let lease = world.form == sqlbroker::Form::Lease;
            let weights = [
                if server { 3 } else { 0 },
                3,
                if server { 2 } else { 0 },
                if lease { 5 } else { 2 },
                2,
                // A silence longer than a lease, with a settlement sent in it, is where the
                // lease form's fence shows: more of them there.
                match (server, lease) {
                    (false, _) => 0,
                    (true, true) => 4,
                    (true, false) => 2,
                },
            ];
            match r.weighted(&weights) {
                0 => {
                    let Some(marked) = &targets.marked else {
                        continue;
                    };
                    let t0 = now_micros();
                    marked.end_all_once();
                    let t1 = now_micros();
                    ledger.push(Ev {
                        t0,
                        t1,
                        who: FAULTS,
                        what: What::Fault {
                            fault: Fault::SessionsEnded,
                            target: 1,
                        },
                    });
                }
                1 => {
                    let mut child = targets.child.lock().unwrap();
                    if let Some(c) = child.take() {
                        let (who, t0) = (c.who, now_micros());
                        c.kill();
                        ledger.push(Ev {
                            t0,
                            t1: now_micros(),
                            who: FAULTS,
                            what: What::Fault {
                                fault: Fault::Killed,
                                target: who,
                            },
                        });
                    }
                    let who = targets.next_who.fetch_add(1, Ordering::Relaxed);
                    let c = ChildWorker::start(&targets.entry, &world, &targets.url, who, &ledger);
                    c.ready(Duration::from_secs(20));
                    *child = Some(c);
                }
                3 => {
                    // Past the lease, and back: its deliveries must learn they lost it.
                    let child = targets.child.lock().unwrap();
                    let Some(c) = child.as_ref() else { continue };
                    let (who, t0) = (c.who, now_micros());
                    c.freeze(LEASE + Duration::from_millis(500 + r.below(1500)));
                    ledger.push(Ev {
                        t0,
                        t1: now_micros(),
                        who: FAULTS,
                        what: What::Fault {
                            fault: Fault::Stopped,
                            target: who,
                        },
                    });
                }
                4 => {
                    let t0 = now_micros();
                    let mut w0 = targets.w0.lock().unwrap();
                    if let Some(w) = w0.take() {
                        w.stop();
                    }
                    let (broker, table) = targets.w0_with.clone();
                    *w0 = Some(Worker::start(
                        &world,
                        0,
                        broker,
                        table,
                        Sink::Ledger(ledger.clone()),
                    ));
                    ledger.push(Ev {
                        t0,
                        t1: now_micros(),
                        who: FAULTS,
                        what: What::Fault {
                            fault: Fault::Restarted,
                            target: 0,
                        },
                    });
                }
                5 => {
                    let Some(hole) = &targets.hole else { continue };
                    let t0 = now_micros();
                    hole.swallow();
                    std::thread::sleep(Duration::from_millis(800 + r.below(2200)));
                    hole.pass();
                    ledger.push(Ev {
                        t0,
                        t1: now_micros(),
                        who: FAULTS,
                        what: What::Fault {
                            fault: Fault::Silent,
                            target: 1,
                        },
                    });
                }
                _ => {
                    let t0 = now_micros();
                    let hold = Duration::from_millis(500 + r.below(1500));
                    hold_snapshot(world.db, &targets.url, &world.name, hold);
                    ledger.push(Ev {
                        t0,
                        t1: now_micros(),
                        who: FAULTS,
                        what: What::Fault {
                            fault: Fault::Snapshot,
                            target: 0,
                        },
                    });
                }
            }
        }
    })
}

/// Holds a read snapshot of `table` open for `hold` on a session of its own.
fn hold_snapshot(db: Db, url: &str, table: &str, hold: Duration) {
    let sql = match db {
        Db::Postgres => format!(
            "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM {table}; \
             SELECT pg_sleep({}); COMMIT",
            hold.as_secs_f64()
        ),
        Db::Mysql => format!(
            "START TRANSACTION WITH CONSISTENT SNAPSHOT; SELECT count(*) FROM {table}; \
             SELECT SLEEP({}); COMMIT",
            hold.as_secs_f64()
        ),
        Db::Sqlite => {
            // A read transaction: it keeps the WAL from being checkpointed past it.
            std::thread::sleep(hold);
            return;
        }
    };
    let _ = common::try_exec(db, url, &sql);
}
