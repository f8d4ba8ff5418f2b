//! The promise checker: a seeded history of producers, brokers (two in this process, one in a
//! child process), an operator and faults, run against one table on a real database, then
//! every applicable promise of PROMISES.md checked over what happened ([`check`]).
//!
//! - [`world`]: what a seed makes of a run (the table's options, the actors' choices);
//! - [`actors`]: the brokers' handlers, the producer, the operator, the faults;
//! - [`history`]: the ledger every actor writes, with when each thing happened;
//! - [`check`]: the promises, read over the ledger and the table as the run left it.

pub mod actors;
pub mod check;
pub mod history;
pub mod rng;
pub mod world;

use std::sync::atomic::AtomicU32;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sqlbroker::{Broker, Form};

use crate::common::{self, blackhole::BlackHole, sessions::Marked, Db};
use actors::{ChildWorker, Ids, Sink, Stop, Targets, Worker};
use history::Ledger;
use world::World;

/// What a run found.
pub struct Outcome {
    pub broken: Vec<check::Broken>,
    pub jobs: usize,
    /// The report: the run, then each broken promise with the stretch of history that shows it.
    pub report: String,
}

/// The test that, run alone in a child process, is a worker ([`actors::child_main`]).
pub const CHILD_ENTRY: &str = "promise_worker_process";

/// How long a history's active part lasts: `secs`, or until the producer has made `steps`
/// publishes if that comes first.
#[derive(Clone, Copy, Debug)]
pub struct Budget {
    pub secs: Duration,
    pub steps: Option<u64>,
}

/// Runs seed `seed` on `db` in `form` within `budget` (then drains the table), and checks it.
/// `None` if the database is not there (and not required).
pub fn run(db: Db, form: Form, seed: u64, budget: Budget) -> Option<Outcome> {
    let live = common::live(db)?;
    let world = World::new(db, form, seed);
    live.track(&format!("{}_rates", world.name));
    let table = live.create(world.table.clone());
    let ledger = Ledger::default();
    let ids = Ids::default();
    let stop = Stop::default();

    // Broker 1 is the second service: the table's limits described in another order, and, on
    // the servers, sessions the faults can find and end.
    // Its connections go through a proxy the faults can make stop answering; its calls give up
    // on their client-side bound.
    let marked = (db != Db::Sqlite).then(|| Marked::new(db, &live.url));
    let hole = marked.as_ref().map(|m| BlackHole::before(db, &m.url));
    let b0 = Broker::builder(&live.url)
        .heartbeat(BEAT)
        .build()
        .expect("broker 0");
    let b1 = Broker::builder(hole.as_ref().map_or(&live.url, |(_, url)| url))
        .heartbeat(BEAT)
        .statement_timeout(Duration::from_secs(1))
        .round_trip_timeout(SILENT_BOUND)
        .connection_timeout(SILENT_BOUND)
        .build()
        .expect("broker 1");
    let hole = hole.map(|(h, _)| h);
    let _passes = hole.as_ref().map(BlackHole::passes_on_drop);
    let w0 = Worker::start(
        &world,
        0,
        b0.clone(),
        table.clone(),
        Sink::Ledger(ledger.clone()),
    );
    let w1 = Worker::start(
        &world,
        1,
        b1,
        world.other.clone(),
        Sink::Ledger(ledger.clone()),
    );
    // SQLite's advisory keys live in the process: a second process would run a job twice, as
    // the README says. No worker process there.
    let with_child = !(db == Db::Sqlite && form == Form::AdvisoryLock);
    let w0_with = (b0.clone(), table.clone());
    let targets = Arc::new(Targets {
        w0: Mutex::new(Some(w0)),
        w0_with,
        marked,
        hole,
        child: Mutex::new(None),
        next_who: AtomicU32::new(3),
        entry: CHILD_ENTRY.to_string(),
        url: live.url.clone(),
    });
    if with_child {
        let c = ChildWorker::start(CHILD_ENTRY, &world, &live.url, 2, &ledger);
        assert!(
            c.ready(Duration::from_secs(30)),
            "the worker process started"
        );
        *targets.child.lock().unwrap() = Some(c);
    }
    let actors = vec![
        actors::producer(
            world.clone(),
            b0.clone(),
            ledger.clone(),
            ids.clone(),
            stop.clone(),
            budget.steps,
        ),
        actors::operator(
            world.clone(),
            Broker::connect(&live.url).expect("operator"),
            live.url.clone(),
            ledger.clone(),
            ids.clone(),
            stop.clone(),
        ),
    ];
    let faults = with_child
        .then(|| actors::faults(world.clone(), targets.clone(), ledger.clone(), stop.clone()));
    // The producer sets `stop` itself once it has made its steps.
    stop.sleep(budget.secs);
    stop.set();
    for a in actors {
        let _ = a.join();
    }
    if let Some(f) = faults {
        let _ = f.join();
    }
    // The drain: every live job run to its end, or a minute, the handlers holding nothing.
    world.drain();
    if let Some(c) = targets.child.lock().unwrap().as_mut() {
        c.drain();
    }
    let drain_start = Instant::now();
    let deadline = drain_start + Duration::from_secs(60);
    let mut left = String::from("nothing");
    while Instant::now() < deadline {
        match b0.stats(&table) {
            Ok(s) if s.ready + s.scheduled + s.in_flight.unwrap_or(0) + s.waiting == 0 => {
                left.clear();
                break;
            }
            Ok(s) => {
                left = format!(
                    "ready {}, scheduled {}, in work {:?}, waiting {}{}",
                    s.ready,
                    s.scheduled,
                    s.in_flight,
                    s.waiting,
                    waiting_on(&b0, &table)
                )
            }
            Err(e) => left = e.to_string(),
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let drained = match left.is_empty() {
        true => format!("drained in {:.1} s", drain_start.elapsed().as_secs_f64()),
        false => format!("not drained in a minute: {left}"),
    };
    if let Some(w0) = targets.w0.lock().unwrap().take() {
        w0.stop();
    }
    w1.stop();
    if let Some(c) = targets.child.lock().unwrap().take() {
        c.stop();
    }
    let rows = live.ints(&format!(
        "SELECT id * 10 + CASE WHEN dead_at IS NULL THEN 0 ELSE 1 END FROM {}",
        world.name
    ));
    let fin: check::Final = rows
        .into_iter()
        .flatten()
        .map(|v| (v.div_euclid(10), v.rem_euclid(10) == 1))
        .collect();
    let events = ledger.events();
    // `PROMISES_DUMP=<dir>`: the whole history, one event a line, in `<dir>/<table>.log`.
    if let Ok(dir) = std::env::var("PROMISES_DUMP") {
        let text: String = events.iter().map(|e| format!("{e}\n")).collect();
        let _ = std::fs::write(format!("{dir}/{}.log", world.name), text);
    }
    // The jobs still waiting (a run without dependencies has none).
    let waiting: Vec<i64> = b0
        .jobs(&table, sqlbroker::JobState::Waiting, None, 1_000)
        .map(|jobs| jobs.iter().map(|j| j.id()).collect())
        .unwrap_or_default();
    let mut broken = check::check(&world, &events, &fin, &waiting);
    broken.extend(fleet_after_stop(&b0, &world));
    if world.rate.is_some() {
        let slots = live.ints(&format!(
            "SELECT count(*) FROM {}_rates GROUP BY lim, rkey",
            world.name
        ));
        let slots: Vec<i64> = slots.into_iter().flatten().collect();
        broken.extend(check::rate_slots(&world, &events, &slots));
    }
    let jobs = events
        .iter()
        .filter(|e| matches!(e.what, history::What::Published { .. }))
        .count();
    let mut report = format!(
        "seed {seed}: {}\n{} events, {jobs} jobs published, {drained}, {} promises broken\n",
        world.describe(),
        events.len(),
        broken.len()
    );
    for b in broken.iter().take(5) {
        report.push_str(&format!(
            "\n{} broken: {}\n  replay: PROMISES_SEED={seed} (on {:?} {:?})\n",
            b.promise, b.what, db, form
        ));
        for e in check::stretch(&events, b) {
            report.push_str(&format!("    {e}\n"));
        }
    }
    Some(Outcome {
        broken,
        jobs,
        report,
    })
}

/// The heartbeat of the run's brokers (the worker process's too): short, so a killed process's
/// row expires within the run's end.
pub const BEAT: Duration = Duration::from_millis(500);

/// P27: once every worker stopped (broker 1's perhaps behind a silent connection, the worker
/// process perhaps killed by the faults), no subscription of the run's tables is listed by
/// `Broker::workers` after three heartbeats and a margin: the stopped ones deleted their rows,
/// the others' expired.
fn fleet_after_stop(b0: &Broker, world: &World) -> Option<check::Broken> {
    let ours = |w: &sqlbroker::WorkerInfo| w.tables().iter().any(|t| t.name() == world.name);
    let bound = BEAT * 3 + Duration::from_secs(3);
    let deadline = Instant::now() + bound;
    let mut listed = Vec::new();
    while Instant::now() < deadline {
        // A read that fails is asked again.
        if let Ok(all) = b0.workers() {
            listed = all.into_iter().filter(|w| ours(w)).collect();
            if listed.is_empty() {
                return None;
            }
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    Some(check::Broken {
        promise: "P27",
        what: format!(
            "{bound:?} after every worker stopped, still listed: {:?}",
            listed
                .iter()
                .map(|w| (w.what().to_string(), w.pid(), w.last_seen()))
                .collect::<Vec<_>>()
        ),
        jobs: Vec::new(),
        from: 0,
        to: 0,
    })
}

/// Broker 1's bound on a round trip and a connection: a silence of its connections fails its
/// calls within it (its statements' own bound is a second).
const SILENT_BOUND: Duration = Duration::from_secs(2);

/// What the first jobs still waiting wait on (the drain's report when it does not end).
fn waiting_on(broker: &Broker, table: &sqlbroker::Table) -> String {
    let Ok(jobs) = broker.jobs(table, sqlbroker::JobState::Waiting, None, 3) else {
        return String::new();
    };
    let mut out = String::new();
    for j in jobs {
        if let Ok(Some(j)) = broker.job(table, j.id()) {
            let waits: Vec<String> = j
                .waits_on()
                .iter()
                .map(|d| {
                    format!(
                        "{}{}: {:?}",
                        d.id,
                        if d.any_outcome { " (settled)" } else { "" },
                        d.outcome
                    )
                })
                .collect();
            out.push_str(&format!("; job {} waits on [{}]", j.id(), waits.join(", ")));
        }
    }
    out
}

/// Quiets the panics the handlers make on purpose; every other panic is reported as usual.
pub fn quiet_handler_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let text = info
                .payload()
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| info.payload().downcast_ref::<&str>().copied())
                .unwrap_or("");
            if !text.contains(actors::PANIC) {
                default(info);
            }
        }));
    });
}
