//! Chaos matrix, recovery times: for every database x form the library claims and every fault
//! that applies, worker processes (this test binary, re-executed) consume a table the harness
//! keeps topped up, through four phases:
//!
//! 1. **clean**: [`CLEAN`] of steady work; completions per [`WINDOW`] give the baseline, the
//!    median of the clean windows. Throughput is bounded by the handlers ([`HANDLERS`] per child,
//!    each sleeping [`HANDLER_WORK`]), not by the database, so it is stable and a ratio means
//!    something on a busy machine.
//! 2. **fault**, one of [`Fault`]: a SIGKILL of one worker process (a replacement is started at
//!    once); a server restart (PostgreSQL `pg_ctlcluster .. restart`, MariaDB `mysqladmin
//!    shutdown` and `mariadbd` again: [`common::server`]); the workers' sessions ended from the
//!    outside (`pg_terminate_backend`, `KILL`: [`common::sessions`]); the workers' pools
//!    exhausted for [`HOLD_FOR`] (each worker is told over its stdin to hold every pooled
//!    connection in an open `publish_group` transaction; on SQLite one such transaction holds the
//!    database's write lock, since its `BEGIN IMMEDIATE` is what a connection there holds); and
//!    [`REPEATED`] SIGKILLs [`REPEAT_EVERY`] apart, each victim replaced.
//! 3. **recovery**: the time to full throughput again, from the fault's start and from its end
//!    (the kill; the server up again; the sessions ended; the pool released; the last kill): the
//!    first time from the fault's end, in steps of [`STEP`], that begins [`FULL_RUN`]
//!    consecutive windows each at [`FULL_PERCENT`] % of the baseline or more. Also the dip (the
//!    lowest window, sliding by [`STEP`], from the
//!    fault's start to the end of that first run at full throughput) and, where a worker was
//!    killed, when the rows it had in work were done by another (lease: after the lease
//!    expired). A cell not back at full throughput within [`RECOVERY`] of the fault's end fails.
//! 4. **checks**, after a final drain (publishing stops, the workers empty the table, then stop
//!    gracefully): no job lost (every published id acked, the table empty); no job acked twice;
//!    every extra run of a job explained by the fault (the at-least-once allowance): each run but
//!    one ended unacked because its worker was killed while it was in work (no other worker ran
//!    the job in between), or because its ack failed during the fault or the recovery after it,
//!    in a fault that can fail acks (restart and ended sessions: the session the delivery held
//!    was ended; SQLite's write lock held: a lease ran out meanwhile, the ack reads `LeaseLost`;
//!    a held pool on a server fails none, the renewer renews on a connection of its own);
//!    attempts as the contract says (row lock: every delivery reads 1, a crash spends nothing;
//!    lease and advisory: each run reads more than the run before).
//!
//! Each worker writes a ledger line ([`common::ledger`]) when a handler starts a delivery, begins
//! its ack, and after the ack (or its failure); the harness keeps them all and reads the windows
//! from the `DONE` lines' own timestamps.
//!
//! SQLite has no server to restart and no session to end: those cells are left out (said in the
//! matrix). Row lock is refused on SQLite. SQLite advisory keys belong to the process, so there
//! ONE worker runs at a time (as in `zz_chaos_kill`).
//!
//! The cases run one after another (a static mutex); the binary's `zz_` name runs it after the
//! other test binaries. Runs with `SQLBROKER_SLOW_TESTS=1` or `SQLBROKER_REQUIRE_SERVERS=1`,
//! else skips loudly. `SQLBROKER_MATRIX_CELLS=lease:kill,advisory:pool` runs only those cells
//! (form:fault, either side may be `*`). The matrix is printed and written to
//! `target/tmp/chaos-matrix.md` (and `chaos-matrix-<db>.md`) for RELIABILITY.md.
//!
//! `SQLBROKER_MATRIX_BREAK` breaks the harness on purpose, to see the checks fail:
//! `drop_done` (the ledger loses the first completion after the fault: a lost job),
//! `forget_kills` (the checks do not know which workers were killed: unexplained double runs),
//! `no_replacement` (a killed worker is not replaced: no recovery).

mod common;

use std::collections::{BTreeSet, HashMap};
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::ledger::{emit, now_micros, Event, Kind};
use common::server::{Server, UpGuard, UP};
use common::sessions::Marked;
use common::{form_from, form_name, Db, Live};
use sqlbroker::{Broker, Form, Message, Table};

/// Carries `<form>\t<table>\t<url>` to a worker process.
const CHILD_ENV: &str = "SQLBROKER_CHAOS_MATRIX_CHILD";
const LEASE: Duration = Duration::from_secs(2);
/// Worker processes at once (one on SQLite advisory).
const CHILDREN: usize = 2;
/// Handler threads per worker, and what each delivery costs them.
const HANDLERS: usize = 3;
const HANDLER_WORK: Duration = Duration::from_millis(15);
/// A worker's pool; deliveries in flight and claim workers stay below it.
const POOL: u32 = 8;
const IN_FLIGHT: usize = 4;
/// Rows published first; then more whenever fewer than [`LOW_WATER`] are unfinished.
const ROWS: usize = 200;
const LOW_WATER: usize = 100;
const TOP_UP: usize = 50;
const KEYS: usize = 32;
const WINDOW: Duration = Duration::from_millis(250);
const CLEAN: Duration = Duration::from_millis(1500);
/// Full throughput: this many consecutive windows at [`FULL_PERCENT`] % of the baseline.
const FULL_RUN: usize = 3;
const FULL_PERCENT: u64 = 75;
/// From the fault's end: full throughput within this, or the cell fails.
const RECOVERY: Duration = Duration::from_secs(15);
const HOLD_FOR: Duration = Duration::from_secs(2);
const REPEATED: usize = 5;
const REPEAT_EVERY: Duration = Duration::from_millis(300);
const READY: Duration = Duration::from_secs(20);
const DRAIN: Duration = Duration::from_secs(30);
const STOP: Duration = Duration::from_secs(15);

static SERIAL: Mutex<()> = Mutex::new(());

fn say(msg: &str) {
    // Straight to the process's stderr: the test harness captures `eprintln!`.
    let _ = writeln!(std::io::stderr(), "{msg}");
}

fn broken(what: &str) -> bool {
    std::env::var("SQLBROKER_MATRIX_BREAK").is_ok_and(|v| v == what)
}

// ---------------------------------------------------------------------------------------------
// The worker process.

/// The worker: does nothing unless `SQLBROKER_CHAOS_MATRIX_CHILD` is set. Then a subscription (2
/// claim workers, [`IN_FLIGHT`] in flight) with [`HANDLERS`] handler threads that record each
/// delivery (`START`, `ACKING`, then `DONE` or `ACKERR`), work [`HANDLER_WORK`], and ack. Each
/// `HOLD` line on its stdin holds every connection of its pool (one on SQLite) for [`HOLD_FOR`]
/// (`HELD` when one is held, `FREED` when it is given back); it stops gracefully (close, then
/// shutdown) when its stdin closes.
#[test]
fn matrix_child_entry() {
    let Some((form, name, url)) = common::child_spec(CHILD_ENV) else {
        return;
    };
    let broker = Broker::builder(&url)
        .pool_size(POOL)
        .build()
        .expect("child: connect");
    let t = common::describe(&name, form_from(&form), LEASE);
    let holder = holder_table(&name);
    let sub = broker
        .subscription(&t)
        .workers(2)
        .max_in_flight(IN_FLIGHT)
        .start()
        .expect("child: start");
    emit("READY", 0, 0, "");
    std::thread::scope(|s| {
        for _ in 0..HANDLERS {
            let sub = &sub;
            s.spawn(move || {
                while let Some(d) = sub.next_delivery() {
                    let (id, attempt) = (d.id(), d.attempt());
                    emit("START", id, attempt, "");
                    std::thread::sleep(HANDLER_WORK);
                    emit("ACKING", id, attempt, "");
                    match d.ack() {
                        Ok(()) => emit("DONE", id, attempt, ""),
                        Err(e) => emit("ACKERR", id, attempt, &format!("{e}").replace('\n', " ")),
                    }
                }
            });
        }
        let holders = if url.starts_with("sqlite") { 1 } else { POOL };
        for line in std::io::stdin().lines() {
            let Ok(line) = line else { break };
            if line.trim() != "HOLD" {
                continue;
            }
            for h in 0..holders {
                let (broker, holder) = (broker.clone(), holder.clone());
                std::thread::spawn(move || {
                    let held = broker.publish_group(|g| {
                        g.publish(&holder, Message::new(b"hold".to_vec()))?;
                        emit("HELD", i64::from(h), 0, "");
                        std::thread::sleep(HOLD_FOR);
                        Ok(())
                    });
                    match held {
                        Ok(()) => emit("FREED", i64::from(h), 0, ""),
                        Err(e) => emit("HOLDERR", i64::from(h), 0, &e.to_string()),
                    }
                });
            }
        }
        sub.close();
    });
    sub.shutdown(Duration::from_secs(5))
        .expect("child: shutdown");
    emit("EXIT", 0, 0, "");
}

/// The table a worker's pool holders publish to, inside the transactions that hold the pool
/// (the lease form: SQLite has no row locks).
fn holder_table(name: &str) -> Table {
    Table::new(format!("{name}_h")).lease(LEASE)
}

// ---------------------------------------------------------------------------------------------
// The ledger, read back.

fn parse(child: usize, line: &str) -> Option<Event> {
    common::ledger::event(child, line)
}

// ---------------------------------------------------------------------------------------------
// Faults and the cell's run.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    Kill,
    Restart,
    Backend,
    Pool,
    Repeated,
}

impl Fault {
    const ALL: [Fault; 5] = [
        Fault::Kill,
        Fault::Restart,
        Fault::Backend,
        Fault::Pool,
        Fault::Repeated,
    ];

    fn name(self) -> &'static str {
        match self {
            Fault::Kill => "kill",
            Fault::Restart => "restart",
            Fault::Backend => "backend",
            Fault::Pool => "pool",
            Fault::Repeated => "repeated",
        }
    }

    fn describe(self, db: Db) -> &'static str {
        match (self, db) {
            (Fault::Kill, _) => "SIGKILL of a worker",
            (Fault::Restart, _) => "server restart",
            (Fault::Backend, Db::Postgres) => "backends terminated",
            (Fault::Backend, _) => "sessions KILLed",
            (Fault::Pool, Db::Sqlite) => "write lock held 2 s by each worker in turn",
            (Fault::Pool, _) => "pool exhausted 2 s",
            (Fault::Repeated, _) => "5 SIGKILLs, 300 ms apart",
        }
    }

    /// Whether the fault applies to `db`: SQLite has no server and no sessions.
    fn applies(self, db: Db) -> bool {
        db != Db::Sqlite || !matches!(self, Fault::Restart | Fault::Backend)
    }

    /// Whether the fault may make a live worker's ack fail on `db`: the session it held ended,
    /// or, on SQLite, a lease ran out while the write lock was held. A held pool on a server
    /// fails none: row lock and advisory deliveries settle on their own connections, and the
    /// renewer renews leases on a connection of its own.
    fn fails_acks(self, db: Db) -> bool {
        match self {
            Fault::Restart | Fault::Backend => true,
            Fault::Pool => db == Db::Sqlite,
            _ => false,
        }
    }
}

/// `SQLBROKER_MATRIX_CELLS`: `form:fault` pairs, `*` for any.
fn selected(form: Form, fault: Fault) -> bool {
    let Ok(cells) = std::env::var("SQLBROKER_MATRIX_CELLS") else {
        return true;
    };
    cells.split(',').any(|cell| {
        let (f, x) = cell.trim().split_once(':').unwrap_or((cell.trim(), "*"));
        (f == "*" || f == form_name(form)) && (x == "*" || x == fault.name())
    })
}

/// A worker process and its ledger reader.
struct Worker {
    tag: usize,
    child: common::Child,
    reader: JoinHandle<()>,
}

/// The harness's side of one cell.
struct Run {
    form: Form,
    t: Table,
    /// The URL the workers use (marked on the servers, so their sessions can be found).
    url: String,
    events: Arc<Mutex<Vec<Event>>>,
    done: Arc<AtomicUsize>,
    /// When each worker was killed (parent's clock), by tag: when the kill was sent and when
    /// the child was reaped; `None` while it runs or after a graceful stop.
    killed: Vec<Option<Killed>>,
    readers: Vec<JoinHandle<()>>,
    failures: Vec<String>,
    /// The first completion after this time is dropped from the ledger (`drop_done`).
    drop_after: Arc<Mutex<Option<i64>>>,
}

/// When a worker's kill was sent and when the child was reaped (parent's clock, microseconds).
type Killed = (i64, i64);

impl Run {
    fn spawn(&mut self) -> Worker {
        let tag = self.killed.len();
        self.killed.push(None);
        let child = common::spawn_child(
            "matrix_child_entry",
            CHILD_ENV,
            &format!("{}\t{}\t{}", form_name(self.form), self.t.name(), self.url),
        );
        let (lines, events, done) = (child.lines.clone(), self.events.clone(), self.done.clone());
        let drop_after = self.drop_after.clone();
        let reader = std::thread::spawn(move || {
            for line in lines.iter() {
                let Some(e) = parse(tag, &line) else { continue };
                if e.kind == Kind::Done {
                    let mut d = drop_after.lock().unwrap();
                    if d.is_some_and(|after| e.micros > after) {
                        *d = None;
                        continue;
                    }
                    done.fetch_add(1, Ordering::Relaxed);
                }
                events.lock().unwrap().push(e);
            }
        });
        Worker { tag, child, reader }
    }

    /// Waits for worker `tag`'s `READY` line; false after [`READY`].
    fn ready(&self, tag: usize) -> bool {
        common::wait_for(READY, || {
            self.events
                .lock()
                .unwrap()
                .iter()
                .any(|e| e.child == tag && e.kind == Kind::Ready)
        })
    }

    /// SIGKILLs the worker and reaps it; the parent's clock at the signal. The kill that
    /// explains a run is recorded once the worker is dead: a `START` the worker stamped
    /// between the parent's clock and the signal reaching it is a start before its kill (read
    /// before the signal, such a start was taken for one after it, and its run again after
    /// the lease for a double run nothing explained: seen once on SQLite, 5 kills 300 ms
    /// apart).
    fn kill(&mut self, w: Worker) -> i64 {
        let at = now_micros();
        w.child.kill();
        self.killed[w.tag] = Some((at, now_micros()));
        self.readers.push(w.reader);
        at
    }

    /// Closes the worker's stdin (close, then shutdown) and waits for it, at most [`STOP`].
    fn stop(&mut self, mut w: Worker) {
        drop(w.child.process.stdin.take());
        match common::ledger::wait_exit(&mut w.child.process, STOP) {
            Some(s) if s.success() => {}
            Some(s) => self
                .failures
                .push(format!("worker {} failed its graceful stop: {s:?}", w.tag)),
            None => self.failures.push(format!(
                "worker {} did not stop within {STOP:?} of its stdin closing",
                w.tag
            )),
        }
        drop(w.child);
        self.readers.push(w.reader);
    }

    /// Tells each worker to hold its whole pool for [`HOLD_FOR`].
    fn hold(&mut self, workers: &mut [Worker]) {
        for w in workers {
            let stdin = w.child.process.stdin.as_mut().expect("a worker's stdin");
            stdin.write_all(b"HOLD\n").expect("tell a worker to hold");
            stdin.flush().expect("tell a worker to hold");
        }
    }

    fn events_of(&self, kind: Kind) -> Vec<Event> {
        self.events
            .lock()
            .unwrap()
            .iter()
            .filter(|e| e.kind == kind)
            .cloned()
            .collect()
    }
}

/// Publishes while fewer than [`LOW_WATER`] published rows are unfinished, until `stop`. A
/// publish that fails (the server restarting) is tried again; one whose outcome is unknown may
/// have made a row all the same: `unknown` counts them.
fn keep_topped_up(
    broker: Broker,
    t: Table,
    published: Arc<Mutex<Vec<i64>>>,
    done: Arc<AtomicUsize>,
    unknown: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
) -> JoinHandle<()> {
    std::thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            let outstanding = published.lock().unwrap().len() - done.load(Ordering::Relaxed);
            if outstanding >= LOW_WATER {
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
            for _ in 0..TOP_UP {
                let n = published.lock().unwrap().len();
                match broker.publish(&t, job(n)) {
                    Ok(id) => published.lock().unwrap().push(id),
                    Err(_) => {
                        unknown.fetch_add(1, Ordering::Relaxed);
                        std::thread::sleep(Duration::from_millis(50));
                        break;
                    }
                }
            }
        }
    })
}

/// The `n`th job: keys `k0` .. `k31` in turn (advisory: rows of one key run one at a time).
fn job(n: usize) -> Message {
    common::msg("matrix", &format!("k{}", n % KEYS))
}

/// Completions per [`WINDOW`] from `from` (micros), for `n` windows.
fn windows(done: &[i64], from: i64, n: usize) -> Vec<usize> {
    let w = WINDOW.as_micros() as i64;
    let mut out = vec![0; n];
    for &at in done {
        if at >= from {
            let k = ((at - from) / w) as usize;
            if k < n {
                out[k] += 1;
            }
        }
    }
    out
}

/// The first window that begins [`FULL_RUN`] consecutive windows at [`FULL_PERCENT`] % of
/// `baseline` or more.
fn full_again(counts: &[usize], baseline: f64) -> Option<usize> {
    let full = |c: usize| c as f64 * 100.0 >= baseline * FULL_PERCENT as f64;
    (0..counts.len().saturating_sub(FULL_RUN - 1))
        .find(|&k| counts[k..k + FULL_RUN].iter().all(|&c| full(c)))
}

/// How far the recovery's windows slide: the resolution of the times to full throughput.
const STEP: i64 = 50_000;

/// The completions of every [`WINDOW`] that starts at `from` + k x [`STEP`] and ends by
/// `until` (micros).
fn sliding(done: &[i64], from: i64, until: i64) -> impl Iterator<Item = usize> + '_ {
    let w = WINDOW.as_micros() as i64;
    (0..)
        .map(move |k| from + k * STEP)
        .take_while(move |&at| at + w <= until)
        .map(move |at| windows(done, at, 1)[0])
}

/// The first offset (micros, a multiple of [`STEP`]) from `from` at which [`FULL_RUN`] windows
/// in a row, all ended by `until`, are at full throughput ([`full_again`]).
fn full_from(done: &[i64], from: i64, until: i64, baseline: f64) -> Option<i64> {
    let run = FULL_RUN as i64 * WINDOW.as_micros() as i64;
    (0..)
        .map(|k| k * STEP)
        .take_while(|&o| from + o + run <= until)
        .find(|&o| full_again(&windows(done, from + o, FULL_RUN), baseline) == Some(0))
}

fn median(mut v: Vec<usize>) -> f64 {
    v.sort_unstable();
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2] as f64
    } else {
        (v[n / 2 - 1] + v[n / 2]) as f64 / 2.0
    }
}

/// One cell's figures.
#[derive(Default)]
struct Figures {
    baseline_per_s: f64,
    dip_percent: f64,
    /// Seconds from the fault's start and from its end to full throughput.
    full_from_start: Option<f64>,
    full_from_end: Option<f64>,
    /// The fault's length (start to end), s.
    fault_secs: f64,
    /// Seconds from the fault's start until the rows killed workers had in work were done.
    killed_rows_done: Option<f64>,
    killed_rows: usize,
    /// Sessions ended (backend fault).
    sessions: usize,
    rows: usize,
    lost: usize,
    double: Doubles,
    failed_acks: usize,
    unknown_publishes: usize,
    secs: f64,
}

/// Jobs run twice, and why.
#[derive(Default, Debug, Clone, Copy, PartialEq, Eq)]
struct Doubles {
    /// Later runs of a job whose earlier run was in a killed worker.
    killed_worker: usize,
    /// Later runs of a job whose earlier run's ack failed during the fault.
    failed_ack: usize,
    unexplained: usize,
}

impl Doubles {
    fn total(self) -> usize {
        self.killed_worker + self.failed_ack + self.unexplained
    }
}

fn cell(live: &Live, form: Form, fault: Fault) -> (Figures, Vec<String>) {
    let began = Instant::now();
    let db = live.db;
    let t = live.table(form, LEASE);
    let _holder = live.create(holder_table(t.name()));
    let marked = (db != Db::Sqlite).then(|| Marked::new(db, &live.url));
    let mut run = Run {
        form,
        t: t.clone(),
        url: marked.as_ref().map_or(live.url.clone(), |m| m.url.clone()),
        events: Arc::new(Mutex::new(Vec::new())),
        done: Arc::new(AtomicUsize::new(0)),
        killed: Vec::new(),
        readers: Vec::new(),
        failures: Vec::new(),
        drop_after: Arc::new(Mutex::new(None)),
    };
    let published = Arc::new(Mutex::new(Vec::new()));
    for i in 0..ROWS {
        let id = live.broker.publish(&t, job(i)).expect("publish");
        published.lock().unwrap().push(id);
    }
    let (stop, unknown) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicUsize::new(0)),
    );
    let publisher = keep_topped_up(
        live.broker.clone(),
        t.clone(),
        published.clone(),
        run.done.clone(),
        unknown.clone(),
        stop.clone(),
    );
    let parallel = if db == Db::Sqlite && form == Form::AdvisoryLock {
        1
    } else {
        CHILDREN
    };
    let mut workers: Vec<Worker> = (0..parallel).map(|_| run.spawn()).collect();
    let mut f = Figures::default();
    for w in &workers {
        if !run.ready(w.tag) {
            run.failures
                .push(format!("worker {} not ready within {READY:?}", w.tag));
        }
    }
    // The first completion of every worker, then the clean phase.
    let warm = common::wait_for(READY, || {
        let d = run.events_of(Kind::Done);
        workers.iter().all(|w| d.iter().any(|e| e.child == w.tag))
    });
    if !warm {
        run.failures
            .push("a worker completed nothing before the clean phase".into());
    }
    let clean_start = now_micros();
    std::thread::sleep(CLEAN);

    // The fault.
    let fault_start = now_micros();
    if broken("drop_done") {
        *run.drop_after.lock().unwrap() = Some(fault_start);
    }
    let replace = |run: &mut Run, workers: &mut Vec<Worker>, victim: usize| {
        let w = workers.swap_remove(victim);
        let at = run.kill(w);
        if !broken("no_replacement") {
            workers.push(run.spawn());
        }
        at
    };
    let fault_end = match fault {
        Fault::Kill => replace(&mut run, &mut workers, 0),
        Fault::Repeated => {
            let mut at = fault_start;
            for k in 0..REPEATED {
                if k > 0 {
                    std::thread::sleep(REPEAT_EVERY);
                }
                if workers.is_empty() {
                    break;
                }
                let victim = k % workers.len();
                at = replace(&mut run, &mut workers, victim);
            }
            at
        }
        Fault::Restart => {
            let server = Server(db);
            let _guard = UpGuard(server);
            if !server.restart() {
                run.failures
                    .push(format!("the restart command of {db:?} failed"));
            }
            if !server.wait_up(UP) {
                run.failures
                    .push(format!("{db:?} did not come back within {UP:?}"));
            }
            now_micros()
        }
        Fault::Backend => {
            let m = marked.as_ref().expect("a server");
            f.sessions = m.end_all_once();
            if f.sessions == 0 {
                run.failures
                    .push("no session of the workers was found to end".into());
            }
            now_micros()
        }
        Fault::Pool => {
            run.hold(&mut workers);
            let holders = workers.len() * if db == Db::Sqlite { 1 } else { POOL as usize };
            let freed = common::wait_for(HOLD_FOR * 10, || {
                run.events_of(Kind::Freed).len() + run.events_of(Kind::HoldErr).len() >= holders
            });
            if !freed {
                run.failures.push(format!(
                    "the pools were not given back within {:?}",
                    HOLD_FOR * 10
                ));
            }
            for e in run.events_of(Kind::HoldErr) {
                run.failures.push(format!("a holder failed: {e}"));
            }
            let held = run.events_of(Kind::Held);
            if held.len() < holders {
                run.failures.push(format!(
                    "only {} of {holders} connections were held",
                    held.len()
                ));
            }
            run.events_of(Kind::Freed)
                .iter()
                .map(|e| e.micros)
                .max()
                .unwrap_or_else(now_micros)
        }
    };
    f.fault_secs = (fault_end - fault_start) as f64 / 1e6;

    // Recovery: windows from the fault's end.
    let w = WINDOW.as_micros() as i64;
    let clean_windows = ((fault_start - clean_start) / w) as usize;
    let baseline = median(windows(
        &run.events_of(Kind::Done)
            .iter()
            .map(|e| e.micros)
            .collect::<Vec<_>>(),
        clean_start,
        clean_windows,
    ));
    f.baseline_per_s = baseline * 1e6 / w as f64;
    let deadline = fault_end + RECOVERY.as_micros() as i64;
    let recovered = loop {
        // Windows that ended 200 ms ago or more: their lines are in.
        let now = now_micros();
        let done: Vec<i64> = run.events_of(Kind::Done).iter().map(|e| e.micros).collect();
        if let Some(o) = full_from(&done, fault_end, now - 200_000, baseline) {
            break Some(o);
        }
        if now > deadline + 200_000 {
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let done: Vec<i64> = run.events_of(Kind::Done).iter().map(|e| e.micros).collect();
    match recovered {
        Some(o) => {
            let from_end = o as f64 / 1e6;
            f.full_from_end = Some(from_end);
            f.full_from_start = Some(f.fault_secs + from_end);
            // The dip: the lowest window from the fault's start to the end of the first run
            // at full throughput.
            let until = fault_end + o + FULL_RUN as i64 * w;
            let lowest = sliding(&done, fault_start, until).min().unwrap_or(0);
            f.dip_percent = lowest as f64 * 100.0 / baseline.max(1.0);
        }
        None => {
            f.dip_percent = 0.0;
            run.failures.push(format!(
                "not back at full throughput ({FULL_RUN} windows of {WINDOW:?} at \
                 {FULL_PERCENT}% of {baseline} completions) within {RECOVERY:?} of the fault's \
                 end; windows since: {:?}",
                windows(&done, fault_end, (RECOVERY.as_micros() as i64 / w) as usize)
            ));
        }
    }

    // The final drain: no more publishing; the workers empty the table and stop.
    stop.store(true, Ordering::Relaxed);
    publisher.join().expect("the publisher panicked");
    let published = std::mem::take(&mut *published.lock().unwrap());
    if workers.is_empty() {
        // (`no_replacement` with one worker.) A worker to drain what is left.
        workers.push(run.spawn());
    }
    let drained = common::wait_for(DRAIN, || live.rows(&t) == 0);
    for w in std::mem::take(&mut workers) {
        run.stop(w);
    }
    for r in std::mem::take(&mut run.readers) {
        r.join().expect("a ledger reader panicked");
    }
    if !drained {
        run.failures.push(format!(
            "the table did not drain within {DRAIN:?}: {} rows left",
            live.rows(&t)
        ));
    }
    let events = std::mem::take(&mut *run.events.lock().unwrap());
    let mut failures = std::mem::take(&mut run.failures);
    let killed = if broken("forget_kills") {
        vec![None; run.killed.len()]
    } else {
        run.killed.clone()
    };
    let window = FaultWindow {
        fault,
        db: live.db,
        start: fault_start,
        end: fault_end,
    };
    let c = check(form, window, &published, &events, &killed, &mut failures);
    f.lost = c.lost;
    f.double = c.doubles;
    f.failed_acks = c.failed_acks;
    f.killed_rows = c.killed_rows;
    f.killed_rows_done = c.killed_rows_done.map(|at| (at - fault_start) as f64 / 1e6);
    f.rows = published.len();
    f.unknown_publishes = unknown.load(Ordering::Relaxed);
    let left = live.rows(&t);
    if left != 0 {
        f.lost = f.lost.max(left as usize);
        failures.push(format!("{left} rows left in the table at the end"));
    }
    let unpublished = c.unpublished;
    if unpublished > f.unknown_publishes {
        failures.push(format!(
            "{unpublished} rows done that no publish returned, more than the {} publishes of \
             unknown outcome",
            f.unknown_publishes
        ));
    }
    f.secs = began.elapsed().as_secs_f64();
    (f, failures)
}

/// The fault, in the parent's clock (micros).
#[derive(Clone, Copy)]
struct FaultWindow {
    fault: Fault,
    db: Db,
    start: i64,
    end: i64,
}

struct Checked {
    lost: usize,
    doubles: Doubles,
    failed_acks: usize,
    /// Rows a killed worker had started and not acked, and when the last was done.
    killed_rows: usize,
    killed_rows_done: Option<i64>,
    /// Rows done that no publish returned (a publish whose reply was lost in the fault).
    unpublished: usize,
}

/// The checks of the module docs (4.), on the ledger. Failures name the id and its lines.
fn check(
    form: Form,
    fault: FaultWindow,
    published: &[i64],
    events: &[Event],
    killed: &[Option<Killed>],
    failures: &mut Vec<String>,
) -> Checked {
    let by_id = common::ledger::by_id(events);
    let ledger = |id: i64| -> String {
        by_id.get(&id).map_or("no ledger lines".into(), |v| {
            v.iter()
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
                .join("; ")
        })
    };
    let has =
        |child: usize, kind: Kind, id: i64| common::ledger::first(by_id.get(&id), child, kind);
    // How each run ended: its worker's first ack result of the same job and attempt after the
    // run began, not already the end of an earlier run. One to one: two runs of a job may be
    // in one worker at once (its first session ended and the row claimed again), and the
    // later may be done before the earlier's ack fails.
    let mut ends: HashMap<(i64, usize, i64), &Event> = HashMap::new();
    for v in by_id.values() {
        let mut used = BTreeSet::new();
        for s in v.iter().filter(|e| e.kind == Kind::Start) {
            let end = v.iter().enumerate().find(|(i, e)| {
                e.child == s.child
                    && e.attempt == s.attempt
                    && e.micros >= s.micros
                    && matches!(e.kind, Kind::Done | Kind::AckErr)
                    && !used.contains(i)
            });
            if let Some((i, e)) = end {
                used.insert(i);
                ends.insert((s.id, s.child, s.micros), *e);
            }
        }
    }
    let settled = |s: &Event| ends.get(&(s.id, s.child, s.micros)).copied();
    let killed_at = |child: usize| killed.get(child).copied().flatten();
    // An ack may fail only during the fault, and only in a fault that ends sessions or holds
    // SQLite's write lock (a lease running out meanwhile): from its start to full recovery's
    // deadline.
    let in_fault = |micros: i64| {
        fault.fault.fails_acks(fault.db)
            && micros >= fault.start
            && micros <= fault.end + RECOVERY.as_micros() as i64
    };
    let known: BTreeSet<i64> = published.iter().copied().collect();
    let mut out = Checked {
        lost: 0,
        doubles: Doubles::default(),
        failed_acks: 0,
        killed_rows: 0,
        killed_rows_done: None,
        unpublished: by_id.keys().filter(|id| !known.contains(id)).count(),
    };
    for e in events.iter().filter(|e| e.kind == Kind::AckErr) {
        out.failed_acks += 1;
        if !in_fault(e.micros) {
            failures.push(format!(
                "an ack failed outside the fault ({}): {}",
                fault.fault.name(),
                ledger(e.id)
            ));
        }
    }
    let ids: BTreeSet<i64> = known.iter().chain(by_id.keys()).copied().collect();
    for id in ids {
        let v = by_id.get(&id).map(Vec::as_slice).unwrap_or_default();
        let of = |k: Kind| -> Vec<&Event> { v.iter().copied().filter(|e| e.kind == k).collect() };
        let (starts, done) = (of(Kind::Start), of(Kind::Done));
        // Not lost: acked, or its ack begun by a worker killed before it could say so, or an
        // ack that failed with an unknown outcome (the row is gone at the end: checked apart).
        let unknown_ack = starts.last().is_some_and(|s| {
            (killed_at(s.child).is_some() && has(s.child, Kind::Acking, id).is_some())
                || settled(s).is_some_and(|e| e.kind == Kind::AckErr)
        });
        if done.is_empty() && !unknown_ack {
            out.lost += 1;
            failures.push(format!("job {id} lost (never acked): {}", ledger(id)));
        }
        if done.len() > 1 {
            failures.push(format!(
                "job {id} acked {} times: {}",
                done.len(),
                ledger(id)
            ));
        }
        // Run more than once: each run but one must have ended unacked for a reason the fault
        // gives. (The order of the `START` lines is not the order of the claims: a row claimed
        // ahead waits in its worker's channel, so a run whose session was ended may start
        // after the run that replaced it, and a lease claimed before the fault may have run out
        // during it, its handler starting only after the fault's end.)
        if starts.len() > 1 {
            let (mut by_kill, mut by_ack) = (0, 0);
            for s in &starts {
                let end = settled(s);
                if end.is_some_and(|e| e.kind == Kind::Done) {
                    continue;
                }
                // Its worker was killed while it was in work, and no other worker ran the job
                // between its start and the kill being sent (the child's death frees its row
                // for another before the parent has reaped it).
                let killed_in_work = killed_at(s.child).is_some_and(|(sent, reaped)| {
                    reaped >= s.micros
                        && !starts
                            .iter()
                            .any(|o| o.child != s.child && o.micros >= s.micros && o.micros < sent)
                });
                if killed_in_work {
                    by_kill += 1;
                } else if end.is_some_and(|e| e.kind == Kind::AckErr && in_fault(e.micros)) {
                    by_ack += 1;
                }
            }
            let again = starts.len() - 1;
            let by_kill = by_kill.min(again);
            let by_ack = by_ack.min(again - by_kill);
            out.doubles.killed_worker += by_kill;
            out.doubles.failed_ack += by_ack;
            let unexplained = again - by_kill - by_ack;
            if unexplained > 0 {
                out.doubles.unexplained += unexplained;
                failures.push(format!(
                    "job {id} run {} times with nothing to explain {unexplained} of the extra runs \
                     (no kill of its worker while in work, no failed ack in the fault): {}",
                    starts.len(),
                    ledger(id)
                ));
            }
        }
        // Attempts: row lock reads 1 always; lease and advisory count each run.
        for s in &starts {
            if form == Form::RowLock && s.attempt != 1 {
                failures.push(format!(
                    "job {id}: attempt {} in the row lock form (a crash spends none): {}",
                    s.attempt,
                    ledger(id)
                ));
            }
        }
        // Lease and advisory: each claim spends an attempt, so no two runs of a job read the
        // same one (compared by attempt, not by start: a run claimed ahead may start late).
        if form != Form::RowLock {
            let mut attempts: Vec<u32> = starts.iter().map(|s| s.attempt).collect();
            attempts.sort_unstable();
            if attempts.windows(2).any(|p| p[0] == p[1]) {
                failures.push(format!(
                    "job {id}: two runs read the same attempt (the {} form spends one per \
                     claim): {}",
                    form_name(form),
                    ledger(id)
                ));
            }
        }
        // The rows a killed worker had in work: when another finished them.
        if let Some(first) = starts.first() {
            if killed_at(first.child).is_some() && settled(first).is_none() {
                out.killed_rows += 1;
                if let Some(d) = done.first() {
                    out.killed_rows_done = out.killed_rows_done.max(Some(d.micros));
                }
            }
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// The matrix.

fn db_name(db: Db) -> &'static str {
    match db {
        Db::Postgres => "PostgreSQL 15",
        Db::Mysql => "MariaDB 10.11",
        Db::Sqlite => "SQLite",
    }
}

const HEADER: &str = "| database | form | fault | fault lasted s | baseline jobs/s | dip % | \
     full throughput from the fault's start s (from its end) | killed worker's rows done s | \
     rows | lost | double runs (explained: killed worker / failed ack) | failed acks | cell s |\n\
     |---|---|---|---|---|---|---|---|---|---|---|---|---|\n";

fn row(db: Db, form: Form, fault: Fault, f: &Figures) -> String {
    let secs = |v: Option<f64>| v.map_or("never".into(), |s| format!("{s:.2}"));
    let killed = match (fault, f.killed_rows) {
        (Fault::Kill | Fault::Repeated, 0) => "none in work".to_string(),
        (Fault::Kill | Fault::Repeated, n) => format!("{} ({n} rows)", secs(f.killed_rows_done)),
        _ => "-".into(),
    };
    let fault_text = match fault {
        Fault::Backend => format!("{} ({})", fault.describe(db), f.sessions),
        _ => fault.describe(db).to_string(),
    };
    format!(
        "| {} | {} | {fault_text} | {:.2} | {:.0} | {:.0} | {} ({}) | {killed} | {} | {} | {} \
         ({} / {}{}) | {} | {:.1} |\n",
        db_name(db),
        form_name(form),
        f.fault_secs,
        f.baseline_per_s,
        f.dip_percent,
        secs(f.full_from_start),
        secs(f.full_from_end),
        f.rows,
        f.lost,
        f.double.total(),
        f.double.killed_worker,
        f.double.failed_ack,
        if f.double.unexplained > 0 {
            format!(", {} UNEXPLAINED", f.double.unexplained)
        } else {
            String::new()
        },
        f.failed_acks,
        f.secs
    )
}

fn run_db(db: Db, forms: &[Form]) {
    if !common::slow_suite("the chaos matrix") {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(live) = common::live(db) else {
        say(&format!(
            "\n!!!!! SKIPPED: chaos matrix on {db:?}: the server is not reachable !!!!!\n"
        ));
        return;
    };
    let began = Instant::now();
    let mut report = String::new();
    let mut all = Vec::new();
    for &form in forms {
        for fault in Fault::ALL {
            if !selected(form, fault) {
                continue;
            }
            if !fault.applies(db) {
                report.push_str(&format!(
                    "| {} | {} | {} | not applicable: SQLite has no server to restart and no \
                     session to end |||||||||||\n",
                    db_name(db),
                    form_name(form),
                    fault.describe(db)
                ));
                continue;
            }
            let (f, failures) = cell(&live, form, fault);
            let line = row(db, form, fault, &f);
            say(&format!("chaos matrix: {}", line.trim_end()));
            report.push_str(&line);
            for x in failures {
                say(&format!(
                    "  FAIL {} {} {}: {x}",
                    db_name(db),
                    form_name(form),
                    fault.name()
                ));
                all.push(format!("{} {}: {x}", form_name(form), fault.name()));
            }
            if db != Db::Sqlite {
                // Whatever happened, the next cell (and the next test binary) gets a server.
                assert!(Server(db).wait_up(UP), "{db:?} is not up after a cell");
            }
        }
    }
    say(&format!(
        "chaos matrix: {db:?} took {:.1} s",
        began.elapsed().as_secs_f64()
    ));
    write_report(db, &report);
    let shown: Vec<&str> = all.iter().take(40).map(String::as_str).collect();
    assert!(
        all.is_empty(),
        "{} failures on {db:?} (first {}):\n{}",
        all.len(),
        shown.len(),
        shown.join("\n")
    );
}

/// `chaos-matrix-<db>.md` for this database, then `chaos-matrix.md`: the header and every
/// database's rows there are.
fn write_report(db: Db, rows: &str) {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
    let file = |db: Db| {
        dir.join(format!(
            "chaos-matrix-{}.md",
            format!("{db:?}").to_lowercase()
        ))
    };
    let _ = std::fs::write(file(db), rows);
    let mut all = String::from(HEADER);
    for d in [Db::Postgres, Db::Mysql, Db::Sqlite] {
        all.push_str(&std::fs::read_to_string(file(d)).unwrap_or_default());
    }
    if let Err(e) = std::fs::write(dir.join("chaos-matrix.md"), &all) {
        say(&format!("warning: could not write the matrix: {e}"));
    }
    say(&format!("\n{all}"));
}

#[test]
fn matrix_postgres() {
    run_db(
        Db::Postgres,
        &[Form::RowLock, Form::Lease, Form::AdvisoryLock],
    );
}

#[test]
fn matrix_mysql() {
    run_db(Db::Mysql, &[Form::RowLock, Form::Lease, Form::AdvisoryLock]);
}

#[test]
fn matrix_sqlite() {
    run_db(Db::Sqlite, &[Form::Lease, Form::AdvisoryLock]);
}

/// The checks and the recovery rule themselves, on made-up ledgers: each break must be caught.
#[test]
fn matrix_checks_catch_broken_behaviour() {
    fn ev(child: usize, kind: Kind, id: i64, attempt: u32, micros: i64) -> Event {
        Event {
            child,
            kind,
            id,
            attempt,
            micros,
            extra: String::new(),
        }
    }
    use Kind::{AckErr, Acking, Done, Start};
    let run = |id: i64, child: usize, attempt: u32, at: i64| {
        vec![
            ev(child, Start, id, attempt, at),
            ev(child, Acking, id, attempt, at + 10),
            ev(child, Done, id, attempt, at + 20),
        ]
    };
    let kill = FaultWindow {
        fault: Fault::Kill,
        db: Db::Postgres,
        start: 1_000,
        end: 1_000,
    };
    // Worker 0 killed at 1000 with job 1 in its handler; worker 1 ran it again (attempt 2).
    let killed = [Some((1_000, 1_000)), None];
    let mut clean = vec![ev(0, Start, 1, 1, 900)];
    clean.extend(run(1, 1, 2, 2_000));
    clean.extend(run(2, 1, 1, 100));
    let checked = |form: Form, w: FaultWindow, events: &[Event], killed: &[Option<Killed>]| {
        let mut f = Vec::new();
        let c = check(form, w, &[1, 2], events, killed, &mut f);
        (c, f)
    };
    let (c, f) = checked(Form::Lease, kill, &clean, &killed);
    assert_eq!(f, Vec::<String>::new());
    assert_eq!((c.lost, c.doubles.killed_worker, c.killed_rows), (0, 1, 1));
    // A completion missing from the ledger: lost.
    let lost: Vec<Event> = clean
        .iter()
        .filter(|e| !(e.id == 2 && e.kind == Done))
        .cloned()
        .collect();
    let (c, f) = checked(Form::Lease, kill, &lost, &killed);
    assert_eq!(c.lost, 1);
    assert!(f.iter().any(|x| x.contains("job 2 lost")));
    // The same double run with no kill to explain it.
    let (c, f) = checked(Form::Lease, kill, &clean, &[None, None]);
    assert_eq!(c.doubles.unexplained, 1);
    assert!(f.iter().any(|x| x.contains("nothing to explain")));
    // Row lock: the crash spent an attempt.
    let (_, f) = checked(Form::RowLock, kill, &clean, &killed);
    assert!(f
        .iter()
        .any(|x| x.contains("attempt 2 in the row lock form")));
    // Row lock: the child's death freed its row before the parent had reaped it, and another
    // worker ran the job in between: explained by the kill (sent at 1000, reaped at 1030). A
    // run begun before the kill was sent is not (its row was still held).
    let reaped_late = [Some((1_000, 1_030)), None];
    let mut freed = vec![ev(0, Start, 1, 1, 900)];
    freed.extend(run(1, 1, 1, 1_010));
    freed.extend(run(2, 1, 1, 100));
    let (c, f) = checked(Form::RowLock, kill, &freed, &reaped_late);
    assert_eq!(f, Vec::<String>::new());
    assert_eq!((c.doubles.killed_worker, c.doubles.unexplained), (1, 0));
    let mut early = vec![ev(0, Start, 1, 1, 900)];
    early.extend(run(1, 1, 1, 950));
    early.extend(run(2, 1, 1, 100));
    let (c, _) = checked(Form::RowLock, kill, &early, &reaped_late);
    assert_eq!(c.doubles.unexplained, 1);
    // A failed ack explains a double run in a restart, not in a kill, and not after the fault.
    let mut acked_err = vec![
        ev(1, Start, 1, 1, 900),
        ev(1, Acking, 1, 1, 950),
        ev(1, AckErr, 1, 1, 1_500),
    ];
    acked_err.extend(run(1, 1, 2, 2_000));
    acked_err.extend(run(2, 1, 1, 100));
    let restart = FaultWindow {
        fault: Fault::Restart,
        db: Db::Postgres,
        start: 1_000,
        end: 1_200,
    };
    let (c, f) = checked(Form::AdvisoryLock, restart, &acked_err, &[None, None]);
    assert_eq!(f, Vec::<String>::new());
    assert_eq!(c.doubles.failed_ack, 1);
    let (_, f) = checked(Form::AdvisoryLock, kill, &acked_err, &[None, None]);
    assert!(f.iter().any(|x| x.contains("outside the fault")));
    assert!(f.iter().any(|x| x.contains("nothing to explain")));
    // A held pool explains a lease's failed ack on SQLite (the write lock), not on a server
    // (renewal does not wait on the pool).
    let pool = |db: Db| FaultWindow {
        fault: Fault::Pool,
        db,
        ..restart
    };
    let (c, f) = checked(Form::Lease, pool(Db::Sqlite), &acked_err, &[None, None]);
    assert_eq!((f, c.doubles.failed_ack), (Vec::<String>::new(), 1));
    let (_, f) = checked(Form::Lease, pool(Db::Mysql), &acked_err, &[None, None]);
    assert!(f.iter().any(|x| x.contains("outside the fault")));
    // A run whose session was ended may start after the run that replaced it (it waited,
    // claimed ahead, in its worker's channel): still explained by its failed ack.
    let mut reordered = vec![
        ev(0, Start, 1, 1, 900),
        ev(1, Start, 1, 1, 950),
        ev(0, Acking, 1, 1, 960),
        ev(1, Acking, 1, 1, 970),
        ev(1, AckErr, 1, 1, 1_100),
        ev(0, Done, 1, 1, 1_150),
    ];
    reordered.extend(run(2, 1, 1, 100));
    let (c, f) = checked(Form::RowLock, restart, &reordered, &[None, None]);
    assert_eq!(f, Vec::<String>::new());
    assert_eq!(c.doubles.failed_ack, 1);
    // Two runs in one worker at once (its backend terminated, the row claimed again by the
    // same worker): the second is done before the first's ack fails. Each run's end is its
    // own, so the failed ack explains the double run (CI, 5 December: the second's `DONE`
    // was taken as the end of both).
    let backend = FaultWindow {
        fault: Fault::Backend,
        ..restart
    };
    let mut overlapped = vec![
        ev(1, Start, 1, 1, 1_010),
        ev(1, Start, 1, 2, 1_020),
        ev(1, Acking, 1, 1, 1_030),
        ev(1, Acking, 1, 2, 1_040),
        ev(1, Done, 1, 2, 1_050),
        ev(1, AckErr, 1, 1, 1_060),
    ];
    overlapped.extend(run(2, 1, 1, 100));
    let (c, f) = checked(Form::AdvisoryLock, backend, &overlapped, &[None, None]);
    assert_eq!((f, c.doubles.failed_ack), (Vec::<String>::new(), 1));
    // The row lock form counts no attempt: the same, told apart by order alone.
    overlapped
        .iter_mut()
        .filter(|e| e.id == 1)
        .for_each(|e| e.attempt = 1);
    let (c, f) = checked(Form::RowLock, backend, &overlapped, &[None, None]);
    assert_eq!((f, c.doubles.failed_ack), (Vec::<String>::new(), 1));
    // Lease: a run that spent no attempt.
    let mut same = clean.clone();
    same.iter_mut()
        .filter(|e| e.id == 1)
        .for_each(|e| e.attempt = 1);
    let (_, f) = checked(Form::Lease, kill, &same, &killed);
    assert!(f.iter().any(|x| x.contains("same attempt")));
    // Acked twice.
    let mut twice = clean.clone();
    twice.push(ev(1, Done, 2, 1, 130));
    let (_, f) = checked(Form::Lease, kill, &twice, &killed);
    assert!(f.iter().any(|x| x.contains("acked 2 times")));
    // Full throughput: three windows at 75 % of the baseline in a row.
    assert_eq!(full_again(&[0, 2, 8, 8, 3, 8, 8, 8], 10.0), Some(5));
    assert_eq!(full_again(&[0, 8, 8, 7, 8, 8], 10.0), None);
    assert_eq!(
        windows(&[5, 250_004, 250_005, 900_000], 0, 3),
        vec![1, 2, 0]
    );
    // Sliding by 50 ms: one completion every 10 ms from 120 ms on (a baseline of 25 a window):
    // the window from 50 ms holds 18, under 75 %; the one from 100 ms 23; and three windows in
    // a row must have ended.
    let steady: Vec<i64> = (0..200).map(|i| 120_000 + i * 10_000).collect();
    assert_eq!(full_from(&steady, 0, 2_200_000, 25.0), Some(100_000));
    assert_eq!(full_from(&steady, 0, 800_000, 25.0), None);
    assert_eq!(sliding(&steady, 0, 400_000).min(), Some(13));
}
