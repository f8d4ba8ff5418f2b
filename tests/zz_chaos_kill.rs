//! Chaos, kill cycles: worker processes (this test binary, re-executed) consume a table while the
//! harness SIGKILLs one of them and starts a replacement, [`KILLS`] times per database x form;
//! then the survivors stop gracefully and a last child drains the table. Every child writes a
//! ledger line to its stdout when a handler starts a delivery, before it acks, after the ack,
//! and when a claim begins and ends (sampled); the harness keeps them all.
//!
//! Where kills land: 20-400 ms after the previous kill (and its replacement's spawn), a kill is
//! aimed at one child chosen at random, at a claim, a handler and a settlement in turn: that
//! child's ledger reader sends the SIGKILL the moment it reads the child's line entering the
//! phase (or after [`AIM_FOR`]). Where each kill landed is then read from the killed child's own
//! last lines, not assumed: a `START` with no `ACKING` after it is a handler, an `ACKING` with no
//! `DONE` a settlement, a last claim mark `CLAIMING` a claim. At least [`MIN_PER_PHASE`] kills
//! must land in each phase. The harness then checks:
//!
//! 1. no row is lost: every published id was acked (a `DONE`, or an ack begun by a child killed
//!    before it could say so), and the table is empty at the end;
//! 2. no row is acked twice (an ack deletes the row) and no ack fails in a live child;
//! 3. a row is started again only after the child that held it was killed without acking it;
//! 4. attempts as the crate docs say: row lock: a crash spends nothing, so every delivery reads 1;
//!    lease and advisory: each redelivery reads more than the previous start of that row, and
//!    no more than one plus the children that had ended by then (each can spend one attempt of
//!    a row at most);
//! 5. advisory: rows of one key never run at once (a start of a key comes after the previous
//!    holder of that key began its ack, or was killed).
//!
//! A row claimed ahead by a child (waiting in its channel, never handed to a handler) spends an
//! attempt in the lease and advisory forms when the child is killed: the contract allows that for a
//! crash, so the harness does not expect `attempt == number of starts`.
//!
//! SQLite advisory keys live in the process (two processes on one file may deliver a row twice,
//! as documented), so on SQLite advisory ONE child runs at a time.
//!
//! The cases run one after another (a static mutex), and the binary's `zz_` name runs it after
//! the other test binaries. The figures (kills per phase, the victims' ages) are printed and
//! written to `target/tmp/chaos-kill-<db>.md` for RELIABILITY.md.

mod common;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::{Db, Live};
use sqlbroker::{Broker, Form, Table};

/// Carries `<form>\t<table>\t<url>` to a child.
const CHILD_ENV: &str = "SQLBROKER_CHAOS_KILL_CHILD";
const LEASE: Duration = Duration::from_secs(2);
/// Kills per database x form, at least.
const KILLS: usize = 20;
/// Rows published at the start; more are published while fewer than [`LOW_WATER`] are left, so
/// kills keep landing on busy children.
const ROWS: usize = 200;
const LOW_WATER: i64 = 150;
const TOP_UP: usize = 50;
const MAX_ROWS: usize = 20_000;
/// Rows of one advisory key: keys are `k0` .. `k31`, so equal keys meet.
const KEYS: usize = 32;
const DRAIN: Duration = Duration::from_secs(60);
/// How often a child samples whether a claim is running.
const CLAIM_SAMPLE: Duration = Duration::from_micros(100);
/// Kills in each phase (claim, handler, settlement) per database x form, at least, by the
/// killed children's own last reports.
const MIN_PER_PHASE: usize = 4;
/// The longest a kill waits for its victim to enter the phase aimed at; then it kills anyway.
const AIM_FOR: Duration = Duration::from_secs(1);
const STOP: Duration = Duration::from_secs(20);

static SERIAL: Mutex<()> = Mutex::new(());

use common::ledger::{emit, now_micros, Event, Kind};

/// xorshift64*: enough randomness for delays, no dependency.
struct Rng(u64);

impl Rng {
    fn seeded(salt: u64) -> Rng {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64;
        let mut x =
            nanos ^ salt.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ u64::from(std::process::id());
        if x == 0 {
            x = 0x2545_F491_4F6C_DD1D;
        }
        Rng(x)
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `lo..=hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }
}

use common::{form_from, form_name};

// ---------------------------------------------------------------------------------------------
// The child.

/// The worker process: does nothing unless `SQLBROKER_CHAOS_KILL_CHILD` is set. Then it runs a
/// subscription (2 claim workers, default batch) with 2 handler threads that record each
/// delivery (`START`, `ACKING`, then `DONE` or `ACKERR`), sometimes sleep a few ms, and ack,
/// and a monitor thread that records when claims begin and end (`CLAIMING` when
/// `Subscription::claiming` rises from zero, `CLAIMED` when it is back to zero, sampled every
/// [`CLAIM_SAMPLE`]). It stops gracefully (close, then shutdown) when its stdin closes.
#[test]
fn chaos_child_entry() {
    let Some((form, name, url)) = common::child_spec(CHILD_ENV) else {
        return;
    };
    let (name, url) = (name.as_str(), url.as_str());
    let broker = Broker::connect(url).expect("child: connect");
    let t = common::describe(name, form_from(&form), LEASE);
    let sub = broker
        .subscription(&t)
        .workers(2)
        .start()
        .expect("child: start");
    emit("READY", 0, 0, "");
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        for h in 0..2u64 {
            let sub = &sub;
            s.spawn(move || {
                let mut rng = Rng::seeded(h + 1);
                while let Some(d) = sub.next_delivery() {
                    let (id, attempt) = (d.id(), d.attempt());
                    emit("START", id, attempt, &common::key_of(&d));
                    // A third of the handlers return at once, the rest take 1-12 ms.
                    if rng.range(0, 2) > 0 {
                        std::thread::sleep(Duration::from_millis(rng.range(1, 12)));
                    }
                    emit("ACKING", id, attempt, "");
                    match d.ack() {
                        Ok(()) => emit("DONE", id, attempt, ""),
                        Err(e) => emit("ACKERR", id, attempt, &format!("{e:?}").replace('\n', " ")),
                    }
                }
            });
        }
        let (sub, stop) = (&sub, &stop);
        let monitor = s.spawn(move || {
            let mut was = false;
            while !stop.load(Ordering::Relaxed) {
                let now = sub.claiming() > 0;
                if now != was {
                    emit(if now { "CLAIMING" } else { "CLAIMED" }, 0, 0, "");
                    was = now;
                }
                std::thread::sleep(CLAIM_SAMPLE);
            }
        });
        // Until the parent closes our stdin (or is gone).
        let mut line = String::new();
        let _ = std::io::stdin().read_line(&mut line);
        stop.store(true, Ordering::Relaxed);
        monitor.join().expect("child: claim monitor");
        sub.close();
    });
    sub.shutdown(Duration::from_secs(5))
        .expect("child: shutdown");
    emit("EXIT", 0, 0, "");
}

// ---------------------------------------------------------------------------------------------
// The parent.

/// Where a kill is aimed, and where a killed child's last reports say it was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Claim,
    Handler,
    Settlement,
}

impl Phase {
    const ALL: [Phase; 3] = [Phase::Claim, Phase::Handler, Phase::Settlement];

    /// The phase a ledger line says its thread just entered.
    fn entered_by(kind: Kind) -> Option<Phase> {
        match kind {
            Kind::Claiming => Some(Phase::Claim),
            Kind::Start => Some(Phase::Handler),
            Kind::Acking => Some(Phase::Settlement),
            _ => None,
        }
    }
}

fn parse(child: usize, line: &str) -> Option<Event> {
    common::ledger::event(child, line)
}

/// How a child ended, in the parent's clock (taken before the signal or the close).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    Running,
    Killed(i64),
    Stopped(i64),
}

struct Worker {
    tag: usize,
    child: Option<Child>,
    stdin: Option<ChildStdin>,
    reader: Option<JoinHandle<()>>,
    trigger: Arc<Trigger>,
}

/// An aimed kill: while `armed`, the child's ledger reader SIGKILLs the child as soon as it
/// reads a line entering that phase (microseconds after the child wrote it), and notes when.
#[derive(Default)]
struct Trigger {
    state: Mutex<Aim>,
    fired: Condvar,
}

#[derive(Default)]
struct Aim {
    armed: Option<Phase>,
    killed_at: Option<i64>,
}

impl Trigger {
    /// SIGKILLs `pid` unless already done; the parent's clock at the signal. The child is not
    /// reaped before the trigger is disarmed, so `pid` is still the child's.
    fn fire(&self, aim: &mut Aim, pid: u32) -> i64 {
        if let Some(at) = aim.killed_at {
            return at;
        }
        let at = now_micros();
        aim.killed_at = Some(at);
        // SAFETY: kill(2) with a pid of our own unreaped child.
        unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
        self.fired.notify_all();
        at
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The harness's side of one database x form run.
struct Run<'a> {
    live: &'a Live,
    t: Table,
    form: Form,
    events: Arc<Mutex<Vec<Event>>>,
    ends: Vec<End>,
    /// When each child was spawned (parent's clock).
    spawned: Vec<i64>,
    /// Each kill: its victim, and the phase aimed at.
    kills: Vec<(usize, Phase)>,
    readers: Vec<JoinHandle<()>>,
    failures: Vec<String>,
}

impl Run<'_> {
    fn spawn(&mut self) -> Worker {
        let tag = self.ends.len();
        self.ends.push(End::Running);
        self.spawned.push(now_micros());
        let exe = std::env::current_exe().expect("current exe");
        let mut child = Command::new(exe)
            .args([
                "chaos_child_entry",
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(
                CHILD_ENV,
                format!(
                    "{}\t{}\t{}",
                    form_name(self.form),
                    self.t.name(),
                    self.live.url
                ),
            )
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn a child");
        let stdout = child.stdout.take().unwrap();
        let stdin = child.stdin.take();
        let events = self.events.clone();
        let trigger = Arc::new(Trigger::default());
        let (aimed, pid) = (trigger.clone(), child.id());
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                if let Some(e) = parse(tag, &line) {
                    if let Some(phase) = Phase::entered_by(e.kind) {
                        let mut aim = aimed.state.lock().unwrap();
                        if aim.armed == Some(phase) {
                            aimed.fire(&mut aim, pid);
                        }
                    }
                    events.lock().unwrap().push(e);
                }
            }
        });
        Worker {
            tag,
            child: Some(child),
            stdin,
            reader: Some(reader),
            trigger,
        }
    }

    /// SIGKILL, aimed at `phase`: as soon as the child reports entering it, or after
    /// [`AIM_FOR`]; then reap, and check it was the signal that ended the child.
    fn kill(&mut self, mut w: Worker, phase: Phase) {
        let mut child = w.child.take().unwrap();
        let pid = child.id();
        let at = {
            let mut aim = w.trigger.state.lock().unwrap();
            aim.armed = Some(phase);
            let deadline = Instant::now() + AIM_FOR;
            while aim.killed_at.is_none() {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                aim = w.trigger.fired.wait_timeout(aim, left).unwrap().0;
            }
            let at = w.trigger.fire(&mut aim, pid);
            aim.armed = None;
            at
        };
        self.ends[w.tag] = End::Killed(at);
        self.kills.push((w.tag, phase));
        let status = child.wait().expect("reap a child");
        use std::os::unix::process::ExitStatusExt;
        if status.signal() != Some(9) {
            self.failures.push(format!(
                "child {} ended by itself before the kill: {status:?}",
                w.tag
            ));
        }
        self.readers.push(w.reader.take().unwrap());
    }

    /// Closes the child's stdin (a graceful stop: close, then shutdown) and waits for it to
    /// exit, at most [`STOP`].
    fn stop(&mut self, mut w: Worker) {
        self.ends[w.tag] = End::Stopped(now_micros());
        drop(w.stdin.take());
        let mut child = w.child.take().unwrap();
        match common::ledger::wait_exit(&mut child, STOP) {
            Some(s) if s.success() => {}
            Some(s) => self
                .failures
                .push(format!("child {} failed its graceful stop: {s:?}", w.tag)),
            None => {
                self.failures.push(format!(
                    "child {} did not stop within {STOP:?} of its stdin closing",
                    w.tag
                ));
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        self.readers.push(w.reader.take().unwrap());
    }
}

struct Figures {
    kills: usize,
    /// Kills whose victim's last reports put it in a claim, a handler, a settlement (one kill
    /// may count in several: a child runs claims and two handlers at once).
    in_phase: [usize; 3],
    /// Kills whose victim's last reports put it in the phase aimed at.
    aimed: usize,
    kills_before_ready: usize,
    /// The victims' ages at their kill (since their spawn), ms: least, median, most.
    ages_ms: [i64; 3],
    rows: usize,
    starts: usize,
    redeliveries: usize,
    max_attempt: u32,
    lost: usize,
    secs: f64,
}

/// Publishes `n` rows, keys `k0` .. `k31` in turn, and records their ids.
fn publish(broker: &Broker, t: &Table, n: usize, published: &Mutex<Vec<i64>>) {
    for _ in 0..n {
        let i = published.lock().unwrap().len();
        let id = broker
            .publish(
                t,
                common::msg(&format!("chaos {i}"), &format!("k{}", i % KEYS)),
            )
            .expect("publish");
        published.lock().unwrap().push(id);
    }
}

/// Keeps at least [`LOW_WATER`] rows in the table until `stop`, so kills land on busy children.
fn keep_topped_up(
    live: &Live,
    t: &Table,
    published: Arc<Mutex<Vec<i64>>>,
    stop: Arc<AtomicBool>,
) -> JoinHandle<()> {
    let (broker, t, db, url) = (live.broker.clone(), t.clone(), live.db, live.url.clone());
    let count = format!("SELECT COUNT(*) FROM {}", t.name());
    std::thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) && published.lock().unwrap().len() < MAX_ROWS {
            if common::ints(db, &url, &count)[0].unwrap_or(0) < LOW_WATER {
                publish(&broker, &t, TOP_UP, &published);
            } else {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    })
}

fn chaos_kill(live: &Live, form: Form) -> (Figures, Vec<String>) {
    let began = Instant::now();
    let t = live.table(form, LEASE);
    let published = Arc::new(Mutex::new(Vec::new()));
    publish(&live.broker, &t, ROWS, &published);
    let stop = Arc::new(AtomicBool::new(false));
    let publisher = keep_topped_up(live, &t, published.clone(), stop.clone());
    // SQLite advisory keys are per process: one child at a time there.
    let parallel = if live.db == Db::Sqlite && form == Form::AdvisoryLock {
        1
    } else {
        2
    };
    let mut run = Run {
        live,
        t: t.clone(),
        form,
        events: Arc::new(Mutex::new(Vec::new())),
        ends: Vec::new(),
        spawned: Vec::new(),
        kills: Vec::new(),
        readers: Vec::new(),
        failures: Vec::new(),
    };
    let mut rng = Rng::seeded(0xC4A05);
    let mut workers: Vec<Worker> = (0..parallel).map(|_| run.spawn()).collect();
    let mut kills = 0;
    while kills < KILLS {
        // 20-400 ms after the last kill (and its replacement's spawn), a kill is aimed at a
        // child chosen at random, at claims, handlers and settlements in turn.
        std::thread::sleep(Duration::from_millis(rng.range(20, 400)));
        let victim = rng.range(0, parallel as u64 - 1) as usize;
        // Kill first, then start the replacement: never more than `parallel` children.
        let w = workers.swap_remove(victim);
        run.kill(w, Phase::ALL[kills % Phase::ALL.len()]);
        workers.push(run.spawn());
        kills += 1;
    }
    stop.store(true, Ordering::Relaxed);
    publisher.join().expect("the publisher panicked");
    let published = std::mem::take(&mut *published.lock().unwrap());
    // The survivors stop gracefully (handing back what they claimed ahead), then one child
    // drains what is left; leased rows of killed children come back after their lease.
    for w in workers {
        run.stop(w);
    }
    let drainer = run.spawn();
    let drained = common::wait_for(DRAIN, || live.rows(&t) == 0);
    run.stop(drainer);
    for r in std::mem::take(&mut run.readers) {
        r.join().expect("a ledger reader panicked");
    }
    let events = std::mem::take(&mut *run.events.lock().unwrap());
    let mut failures = std::mem::take(&mut run.failures);
    if !drained {
        let left = live.ints(&format!("SELECT id FROM {} ORDER BY id LIMIT 20", t.name()));
        failures.push(format!(
            "the table did not drain within {DRAIN:?}: {} rows left, first ids {left:?}",
            live.rows(&t)
        ));
    }
    let left = live.rows(&t);
    if left != 0 {
        failures.push(format!("{left} rows left in the table at the end"));
    }
    let mut figures = check(form, &published, &events, &run.ends, &mut failures);
    figures.kills = kills;
    figures.in_phase = [0; 3];
    let at_kill = phases_at_kill(&events, &run.ends);
    for at in at_kill.values() {
        for (n, p) in figures.in_phase.iter_mut().zip(Phase::ALL) {
            *n += usize::from(at.contains(&p));
        }
    }
    figures.aimed = run
        .kills
        .iter()
        .filter(|(tag, aim)| at_kill[tag].contains(aim))
        .count();
    // Fails when kills do not land where the suite says they do.
    for (n, p) in figures.in_phase.iter().zip(Phase::ALL) {
        if *n < MIN_PER_PHASE {
            failures.push(format!(
                "only {n} of {kills} kills landed in a {p:?} phase by the children's own \
                 reports (at least {MIN_PER_PHASE} wanted)"
            ));
        }
    }
    let mut ages: Vec<i64> = run
        .kills
        .iter()
        .map(|&(tag, _)| match run.ends[tag] {
            End::Killed(at) => (at - run.spawned[tag]) / 1000,
            _ => unreachable!("a killed child ends killed"),
        })
        .collect();
    ages.sort_unstable();
    figures.ages_ms = [ages[0], ages[ages.len() / 2], ages[ages.len() - 1]];
    figures.secs = began.elapsed().as_secs_f64();
    (figures, failures)
}

/// For each killed child, the phases its last ledger lines put it in when it died: a handler
/// (a `START` with no `ACKING` after it), a settlement (an `ACKING` with no `DONE` or `ACKERR`
/// after it), a claim (its last claim mark is `CLAIMING`). A line reaches the pipe whole or
/// not at all, and what a child wrote before the kill is read after it, so these are the
/// child's own account, in the order it wrote them.
fn phases_at_kill(events: &[Event], ends: &[End]) -> BTreeMap<usize, Vec<Phase>> {
    let mut out = BTreeMap::new();
    for (child, end) in ends.iter().enumerate() {
        if !matches!(end, End::Killed(_)) {
            continue;
        }
        let (mut handling, mut settling) = (BTreeSet::new(), BTreeSet::new());
        let mut claiming = false;
        for e in events.iter().filter(|e| e.child == child) {
            match e.kind {
                Kind::Start => {
                    handling.insert(e.id);
                }
                Kind::Acking => {
                    handling.remove(&e.id);
                    settling.insert(e.id);
                }
                Kind::Done | Kind::AckErr => {
                    settling.remove(&e.id);
                }
                Kind::Claiming => claiming = true,
                Kind::Claimed => claiming = false,
                _ => {}
            }
        }
        let at: Vec<Phase> = [
            (claiming, Phase::Claim),
            (!handling.is_empty(), Phase::Handler),
            (!settling.is_empty(), Phase::Settlement),
        ]
        .into_iter()
        .filter_map(|(on, p)| on.then_some(p))
        .collect();
        out.insert(child, at);
    }
    out
}

/// The ledger checks (1-5 of the module docs). Failures name the id and its ledger lines.
fn check(
    form: Form,
    published: &[i64],
    events: &[Event],
    ends: &[End],
    failures: &mut Vec<String>,
) -> Figures {
    let known: BTreeSet<i64> = published.iter().copied().collect();
    for e in events.iter().filter(|e| e.kind == Kind::AckErr) {
        failures.push(format!("an ack failed in a live child: {e}"));
    }
    let by_id = common::ledger::by_id(events);
    let ledger = |id: i64| -> String {
        by_id.get(&id).map_or("no ledger lines".into(), |v| {
            v.iter()
                .map(|e| format!("{e} ({:?})", ends[e.child]))
                .collect::<Vec<_>>()
                .join("; ")
        })
    };
    let has =
        |child: usize, kind: Kind, id: i64| common::ledger::first(by_id.get(&id), child, kind);
    let killed_at = |child: usize| match ends[child] {
        End::Killed(at) => Some(at),
        _ => None,
    };
    // Children that had ended (killed or stopped) before `micros`.
    let ended_before = |micros: i64| {
        ends.iter()
            .filter(|e| matches!(e, End::Killed(at) | End::Stopped(at) if *at < micros))
            .count()
    };

    let mut lost = 0;
    for id in by_id.keys() {
        if !known.contains(id) {
            failures.push(format!("id {id} was never published: {}", ledger(*id)));
        }
    }
    let mut starts = 0;
    let mut max_attempt = 0;
    for &id in published {
        let v = by_id.get(&id).map(Vec::as_slice).unwrap_or_default();
        let st: Vec<&Event> = v
            .iter()
            .copied()
            .filter(|e| e.kind == Kind::Start)
            .collect();
        let done: Vec<&Event> = v.iter().copied().filter(|e| e.kind == Kind::Done).collect();
        starts += st.len();
        max_attempt = max_attempt.max(st.iter().map(|e| e.attempt).max().unwrap_or(0));

        // 1. Not lost: acked, or its ack begun by a child killed before it could say so (the row
        // is gone from the table, checked separately, so that ack committed).
        let acked_by_killed = st.last().is_some_and(|s| {
            killed_at(s.child).is_some() && has(s.child, Kind::Acking, id).is_some()
        });
        if done.is_empty() && !acked_by_killed {
            lost += 1;
            failures.push(format!("row {id} lost (never acked): {}", ledger(id)));
        }
        // 2. One ack at most: an ack deletes the row.
        if done.len() > 1 {
            failures.push(format!(
                "row {id} acked {} times: {}",
                done.len(),
                ledger(id)
            ));
        }
        // 3. Started again only after its holder was killed without acking it.
        for pair in st.windows(2) {
            let (s1, s2) = (pair[0], pair[1]);
            let explained = killed_at(s1.child).is_some_and(|at| at < s2.micros)
                && has(s1.child, Kind::Done, id).is_none();
            if !explained {
                failures.push(format!(
                    "row {id} started again by child {} with no kill of child {} to explain it: {}",
                    s2.child,
                    s1.child,
                    ledger(id)
                ));
            }
        }
        // 4. Attempts.
        for s in &st {
            let ok = match form {
                Form::RowLock => s.attempt == 1,
                _ => s.attempt >= 1 && s.attempt as usize <= 1 + ended_before(s.micros),
            };
            if !ok {
                failures.push(format!(
                    "row {id}: attempt {} read by child {} ({} children had ended by then; \
                     row lock must read 1): {}",
                    s.attempt,
                    s.child,
                    ended_before(s.micros),
                    ledger(id)
                ));
            }
            if let Some(d) = has(s.child, Kind::Done, id) {
                if d.attempt != s.attempt {
                    failures.push(format!("row {id}: DONE and START disagree: {}", ledger(id)));
                }
            }
        }
        if form != Form::RowLock {
            for pair in st.windows(2) {
                if pair[1].attempt <= pair[0].attempt {
                    failures.push(format!(
                        "row {id}: redelivered with attempt {} after a start with attempt {} \
                         (a crash spends an attempt in the {} form): {}",
                        pair[1].attempt,
                        pair[0].attempt,
                        form_name(form),
                        ledger(id)
                    ));
                }
            }
        }
    }

    // 5. Advisory: one row of a key at a time.
    if form == Form::AdvisoryLock {
        let mut by_key: HashMap<&str, Vec<&Event>> = HashMap::new();
        for e in events.iter().filter(|e| e.kind == Kind::Start) {
            by_key.entry(e.extra.as_str()).or_default().push(e);
        }
        for (key, mut st) in by_key {
            st.sort_by_key(|e| e.micros);
            for pair in st.windows(2) {
                let (s1, s2) = (pair[0], pair[1]);
                // The key of s1 was released no earlier than s1's ack began, or its child died.
                let released_after = has(s1.child, Kind::Acking, s1.id)
                    .map(|a| a.micros)
                    .or_else(|| killed_at(s1.child));
                if released_after.is_none_or(|at| at >= s2.micros) {
                    failures.push(format!(
                        "key {key:?} held twice at once: {s1} ({:?}) then {s2} before it was \
                         released",
                        ends[s1.child]
                    ));
                }
            }
        }
    }

    let kills_before_ready = ends
        .iter()
        .enumerate()
        .filter(|(c, e)| {
            matches!(e, End::Killed(_))
                && !events
                    .iter()
                    .any(|r| r.child == *c && r.kind == Kind::Ready)
        })
        .count();
    let distinct = by_id
        .values()
        .filter(|v| v.iter().any(|e| e.kind == Kind::Start))
        .count();
    Figures {
        kills: 0,
        in_phase: [0; 3],
        aimed: 0,
        kills_before_ready,
        ages_ms: [0; 3],
        rows: published.len(),
        starts,
        redeliveries: starts - distinct,
        max_attempt,
        lost,
        secs: 0.0,
    }
}

fn db_name(db: Db) -> &'static str {
    match db {
        Db::Postgres => "PostgreSQL",
        Db::Mysql => "MySQL(MariaDB)",
        Db::Sqlite => "SQLite",
    }
}

fn run_db(db: Db, forms: &[Form]) {
    if !common::slow_suite("the chaos kill suite") {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(live) = common::live(db) else {
        eprintln!("\n!!!!! SKIPPED: chaos kill on {db:?}: the server is not reachable !!!!!\n");
        return;
    };
    let mut all = Vec::new();
    let mut report = String::from(
        "| database | form | kills | in a claim | in a handler | in a settlement | in the phase \
         aimed at | before ready | victim age ms (min/median/max) | rows | deliveries started | \
         redeliveries | highest attempt | lost | seconds |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for &form in forms {
        let (f, failures) = chaos_kill(&live, form);
        let [claim, handler, settlement] = f.in_phase;
        let [young, median, old] = f.ages_ms;
        let line = format!(
            "chaos kill: {} {}: {} kills (by the children's reports: {claim} in a claim, \
             {handler} in a handler, {settlement} in a settlement; {} kills landed in the phase \
             aimed at; {} before the child was ready; victims {young}/{median}/{old} ms old), \
             {} rows, {} starts, {} redeliveries, highest attempt {}, {} lost, {} failures, \
             {:.1} s",
            db_name(db),
            form_name(form),
            f.kills,
            f.aimed,
            f.kills_before_ready,
            f.rows,
            f.starts,
            f.redeliveries,
            f.max_attempt,
            f.lost,
            failures.len(),
            f.secs
        );
        let _ = writeln!(std::io::stderr(), "{line}");
        report.push_str(&format!(
            "| {} | {} | {} | {claim} | {handler} | {settlement} | {} | {} | \
             {young}/{median}/{old} | {} | {} | {} | {} | {} | {:.1} |\n",
            db_name(db),
            form_name(form),
            f.kills,
            f.aimed,
            f.kills_before_ready,
            f.rows,
            f.starts,
            f.redeliveries,
            f.max_attempt,
            f.lost,
            f.secs
        ));
        for fail in &failures {
            let _ = writeln!(
                std::io::stderr(),
                "  FAIL {} {}: {fail}",
                db_name(db),
                form_name(form)
            );
        }
        all.extend(
            failures
                .into_iter()
                .map(|x| format!("{} {}: {x}", db_name(db), form_name(form))),
        );
    }
    let file = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "chaos-kill-{}.md",
        format!("{db:?}").to_lowercase()
    ));
    if let Err(e) = std::fs::write(&file, report) {
        eprintln!("warning: could not write {}: {e}", file.display());
    }
    let shown: Vec<&String> = all.iter().take(40).collect();
    assert!(
        all.is_empty(),
        "{} ledger failures on {db:?} (first {}):\n{}",
        all.len(),
        shown.len(),
        shown
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[test]
fn kill_cycles_postgres() {
    run_db(
        Db::Postgres,
        &[Form::RowLock, Form::Lease, Form::AdvisoryLock],
    );
}

#[cfg(feature = "mysql")]
#[test]
fn kill_cycles_mysql() {
    run_db(Db::Mysql, &[Form::RowLock, Form::Lease, Form::AdvisoryLock]);
}

#[test]
fn kill_cycles_sqlite() {
    run_db(Db::Sqlite, &[Form::Lease, Form::AdvisoryLock]);
}

/// The ledger checks themselves, on made-up ledgers of broken behaviour: each must be caught.
#[test]
fn ledger_checks_catch_broken_behaviour() {
    fn ev(child: usize, kind: Kind, id: i64, attempt: u32, micros: i64, key: &str) -> Event {
        let extra = key.to_string();
        Event {
            child,
            kind,
            id,
            attempt,
            micros,
            extra,
        }
    }
    use Kind::{Acking, Done, Start};
    // Child 0 killed at 50, child 1 stopped at 1000.
    let ends = [End::Killed(50), End::Stopped(1000)];
    let ok = |id, k: &str| {
        vec![
            ev(1, Start, id, 1, 100, k),
            ev(1, Acking, id, 1, 110, k),
            ev(1, Done, id, 1, 120, k),
        ]
    };
    let fails = |form: Form, events: Vec<Event>| {
        let mut f = Vec::new();
        check(form, &[1, 2], &events, &ends, &mut f);
        f
    };
    // A clean ledger passes, including a redelivery after a kill (attempt 2 where it is spent).
    // Row 1: child 0 started it and was killed before its ack; child 1 finished it.
    let mut clean = vec![
        ev(0, Start, 1, 1, 10, "a"),
        ev(1, Start, 1, 2, 200, "a"),
        ev(1, Acking, 1, 2, 210, "a"),
        ev(1, Done, 1, 2, 220, "a"),
    ];
    clean.extend(ok(2, "b"));
    assert_eq!(
        fails(Form::AdvisoryLock, clean.clone()),
        Vec::<String>::new()
    );
    // Row 2 never acked: lost.
    let lost: Vec<Event> = clean
        .iter()
        .filter(|e| e.id != 2 || e.kind == Start)
        .cloned()
        .collect();
    assert!(fails(Form::Lease, lost)
        .iter()
        .any(|f| f.contains("row 2 lost")));
    // Row 2 acked twice.
    let mut twice = clean.clone();
    twice.push(ev(1, Done, 2, 1, 130, "b"));
    assert!(fails(Form::Lease, twice)
        .iter()
        .any(|f| f.contains("acked 2 times")));
    // Row 2 started again with no kill: its first holder lives on.
    let mut dup = clean.clone();
    dup.extend([ev(1, Start, 2, 2, 300, "b")]);
    assert!(fails(Form::Lease, dup)
        .iter()
        .any(|f| f.contains("no kill")));
    // Row lock: a crash spent an attempt.
    assert!(fails(Form::RowLock, clean.clone())
        .iter()
        .any(|f| f.contains("attempt 2")));
    // Lease: a redelivery that did not count the crash.
    let mut same = clean.clone();
    same.iter_mut()
        .filter(|e| e.id == 1)
        .for_each(|e| e.attempt = 1);
    assert!(fails(Form::Lease, same)
        .iter()
        .any(|f| f.contains("redelivered")));
    // Lease: an attempt no crash explains (only one child had ended).
    let mut jump = clean.clone();
    jump.iter_mut()
        .filter(|e| e.id == 1 && e.child == 1)
        .for_each(|e| e.attempt = 3);
    assert!(fails(Form::Lease, jump)
        .iter()
        .any(|f| f.contains("attempt 3")));
    // Advisory: row 2 shares row 1's key and starts while row 1's holder still has it.
    let mut overlap = clean.clone();
    overlap.iter_mut().filter(|e| e.id == 2).for_each(|e| {
        e.extra = "a".into();
        e.micros += 105; // starts at 205, before row 1's ack began at 210
    });
    assert!(fails(Form::AdvisoryLock, overlap)
        .iter()
        .any(|f| f.contains("held twice")));
    // Where kills landed, by the killed child's own last lines (in the order written): child 0
    // killed in a handler (row 1 started, no ACKING); then, with more lines, in a settlement
    // and a claim; with every phase left again, in none. Stopped children are not counted.
    let killed_in = |lines: Vec<Event>| phases_at_kill(&lines, &ends).remove(&0).unwrap();
    let mut ledger = vec![ev(0, Start, 1, 1, 10, "a"), ev(1, Start, 2, 1, 11, "b")];
    assert_eq!(killed_in(ledger.clone()), [Phase::Handler]);
    assert!(!phases_at_kill(&ledger, &ends).contains_key(&1));
    ledger.extend([
        ev(0, Acking, 1, 1, 12, ""),
        ev(0, Kind::Claiming, 0, 0, 13, ""),
    ]);
    assert_eq!(killed_in(ledger.clone()), [Phase::Claim, Phase::Settlement]);
    ledger.extend([
        ev(0, Done, 1, 1, 14, ""),
        ev(0, Kind::Claimed, 0, 0, 15, ""),
    ]);
    assert_eq!(killed_in(ledger), []);
    // An ack that failed in a live child.
    let mut err = clean;
    err.push(ev(1, Kind::AckErr, 2, 1, 125, "LeaseLost"));
    assert!(fails(Form::Lease, err)
        .iter()
        .any(|f| f.contains("ack failed")));
}
