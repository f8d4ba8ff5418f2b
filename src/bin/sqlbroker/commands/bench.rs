//! `bench`: a burn-down and a steady publish-and-work run against the database of `--url`, on
//! a scratch table made for the run (`create_table`) and always dropped at its end
//! (`drop_table`), on error too. Measures jobs/s, publish-to-start latency and the client's
//! CPU time per job, on the library's public API only.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::{Args, ValueEnum};
use serde::Serialize;
use sqlbroker::{AckMode, Broker, Delivery, Message, NextError, Subscription, Table};

use super::{escape, json, say, Result};
use crate::Cli;

/// Messages per `publish_batch` while the burn-down's jobs are published (not timed).
const CHUNK: usize = 500;

/// With `--mode steady` alone and no `--rate`, the burn-down that measures the rate.
const MEASURE_JOBS: u64 = 2_000;

/// The progress line is rewritten at most this often.
const PROGRESS_EVERY: Duration = Duration::from_millis(250);

/// How often the steady publisher publishes what its schedule asks.
const TICK: Duration = Duration::from_millis(10);

/// How the scratch table holds a claimed row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum BenchForm {
    /// `Table::lease` (30 s).
    Lease,
    /// The default form: a row lock held by the delivery's transaction (not on SQLite).
    RowLock,
    /// `Table::advisory_lock`, a key per job.
    Advisory,
}

/// How handlers settle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum BenchAck {
    /// `Delivery::ack`, returning once committed.
    Durable,
    /// `AckMode::Deferred { within: 10ms }` (lease form only).
    Deferred,
    /// `next_batch(100)` settled by `Delivery::ack_all`.
    Batch,
}

/// Which runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum BenchMode {
    /// Publish --jobs jobs, then time their work.
    BurnDown,
    /// Publish at --rate jobs/s for --secs while they are worked.
    Steady,
    /// The burn-down, then the steady run at --rate (default half the burn-down's rate).
    Both,
}

/// `sqlbroker bench`'s options.
#[derive(Debug, Args)]
pub(crate) struct BenchArgs {
    /// Jobs of the burn-down (default 10,000; not with `--mode steady`, whose measuring
    /// burn-down, when it needs one, has 2,000).
    #[arg(long, value_name = "N",
          value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    jobs: Option<u64>,

    /// The scratch table's form.
    #[arg(long, value_enum, default_value_t = BenchForm::Lease)]
    form: BenchForm,

    /// How handlers ack: durable (`ack`), deferred (`AckMode::Deferred`, 10 ms; lease form
    /// only) or batch (`next_batch(100)` and `Delivery::ack_all`).
    #[arg(long, value_enum, default_value_t = BenchAck::Durable)]
    ack: BenchAck,

    /// Claim worker threads of the subscription.
    #[arg(long, value_name = "W", default_value_t = 4,
          value_parser = clap::value_parser!(u64).range(1..=256))]
    workers: u64,

    /// Handler threads taking deliveries.
    #[arg(long, value_name = "H", default_value_t = 8,
          value_parser = clap::value_parser!(u64).range(1..=256))]
    handlers: u64,

    /// burn-down, steady, or both (the burn-down first).
    #[arg(long, value_enum, default_value_t = BenchMode::Both)]
    mode: BenchMode,

    /// Steady run: jobs published per second. Default: half the burn-down's rate (with
    /// `--mode steady`, a 2,000-job burn-down measures it first).
    #[arg(long, value_name = "R", value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    rate: Option<u64>,

    /// Steady run: how long to publish, seconds (default 20).
    #[arg(long, value_name = "S",
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    secs: Option<u64>,

    /// Give up (exit 1, the scratch table dropped) when no job is done for this long,
    /// seconds.
    #[arg(long, value_name = "SECS", default_value_t = 60,
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    stall: u64,

    /// Print the results as one JSON object.
    #[arg(long)]
    json: bool,
}

impl BenchArgs {
    /// A combination the options cannot run (a usage error: nothing is made).
    pub(crate) fn usage_error(&self) -> Option<String> {
        // An option the mode asked for does not use would be ignored: refused instead.
        match self.mode {
            BenchMode::BurnDown if self.rate.is_some() || self.secs.is_some() => {
                return Some(
                    "--rate and --secs are the steady run's: --mode burn-down takes --jobs".into(),
                )
            }
            BenchMode::Steady if self.jobs.is_some() => {
                return Some(
                    "--jobs is the burn-down's: --mode steady takes --rate and --secs".into(),
                )
            }
            _ => {}
        }
        if self.ack == BenchAck::Deferred && self.form != BenchForm::Lease {
            return Some(format!(
                "--ack deferred needs --form lease (deferred acks are a lease form feature), \
                 not --form {}",
                self.form
                    .to_possible_value()
                    .map_or_else(String::new, |v| v.get_name().into())
            ));
        }
        None
    }
}

impl BenchArgs {
    /// The steady run's length, seconds.
    fn secs(&self) -> u64 {
        self.secs.unwrap_or(20)
    }
}

/// The scratch table, dropped when this goes out of scope (on every path out of `run`).
struct Scratch<'a> {
    broker: &'a Broker,
    table: Table,
    dropped: bool,
}

impl Scratch<'_> {
    /// Drops the table now (the end of a run that went well): an error is the run's.
    fn finish(&mut self) -> sqlbroker::Result<()> {
        self.dropped = true;
        self.broker.drop_table(&self.table)
    }
}

impl Drop for Scratch<'_> {
    fn drop(&mut self) {
        if self.dropped {
            return;
        }
        if let Err(e) = self.broker.drop_table(&self.table) {
            eprintln!(
                "sqlbroker: could not drop the scratch table {}: {}",
                self.table.name(),
                escape(&e.to_string())
            );
        }
    }
}

/// What the handler threads share.
#[derive(Default)]
struct Shared {
    /// Jobs acked.
    done: AtomicU64,
    /// Publish-to-start latencies, microseconds (recorded while `record` is set).
    latencies: Mutex<Vec<u64>>,
    record: AtomicBool,
    /// The first error of a handler or the publisher.
    error: Mutex<Option<String>>,
    stop: AtomicBool,
}

impl Shared {
    fn fail(&self, e: impl std::fmt::Display) {
        let mut slot = self.error.lock().unwrap_or_else(|e| e.into_inner());
        slot.get_or_insert_with(|| e.to_string());
        self.stop.store(true, Ordering::Release);
    }

    fn error(&self) -> Option<String> {
        self.error.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

#[derive(Debug, Serialize)]
struct BurnDown {
    jobs: u64,
    seconds: f64,
    jobs_per_sec: f64,
    /// Client CPU (user + system) per job, microseconds; `None` where not measured.
    cpu_us_per_job: Option<f64>,
}

#[derive(Debug, Serialize)]
struct Steady {
    rate_asked: u64,
    seconds: u64,
    published: u64,
    /// How long publishing took, measured: `--secs`, and the last batch after it.
    publish_seconds: f64,
    /// `published` over `publish_seconds`: the rate reached, not the one asked.
    published_per_sec: f64,
    /// Published fewer than `rate_asked` x `seconds`: the publisher (this client, or the
    /// database taking its inserts) could not keep the rate, and stopped at `--secs`
    /// anyway.
    fell_behind: bool,
    /// Jobs worked while publishing.
    worked_in_time: u64,
    /// `worked_in_time` over `publish_seconds`.
    worked_per_sec: f64,
    /// Jobs worked in all, after the backlog was worked off.
    worked: u64,
    p50_ms: f64,
    p99_ms: f64,
    /// Published and not yet worked when publishing stopped.
    backlog_at_end: u64,
    cpu_us_per_job: Option<f64>,
}

#[derive(Debug, Serialize)]
struct Report {
    database: &'static str,
    table: String,
    form: BenchForm,
    ack: BenchAck,
    workers: u64,
    handlers: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    burn_down: Option<BurnDown>,
    #[serde(skip_serializing_if = "Option::is_none")]
    steady: Option<Steady>,
}

/// A name no other run uses: `sqlbroker_bench_<pid>_<random>`.
fn scratch_name() -> String {
    let mut h = RandomState::new().build_hasher();
    h.write_u128(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos(),
    );
    format!(
        "sqlbroker_bench_{}_{:08x}",
        std::process::id(),
        h.finish() as u32
    )
}

fn now_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_micros() as u64
}

/// Set by Ctrl-C (SIGINT) or SIGTERM during a run: the run ends with an error, and the
/// scratch table is dropped on the way out. A second signal ends the process at once.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

#[cfg(unix)]
extern "C" fn on_signal(_: libc::c_int) {
    if INTERRUPTED.swap(true, Ordering::SeqCst) {
        // SAFETY: `_exit` is async-signal-safe.
        unsafe { libc::_exit(130) };
    }
}

/// Routes Ctrl-C and SIGTERM to [`INTERRUPTED`] (Unix; elsewhere they end the process and
/// leave the table, whose name the output's first line on stderr gives).
fn catch_signals() {
    #[cfg(unix)]
    {
        let handler = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
        // SAFETY: the handler only touches an atomic and calls `_exit`.
        unsafe {
            libc::signal(libc::SIGINT, handler);
            libc::signal(libc::SIGTERM, handler);
        }
    }
}

/// An error if a signal asked the run to end.
fn interrupted() -> Result {
    if INTERRUPTED.load(Ordering::SeqCst) {
        return Err("interrupted; the scratch table is dropped".into());
    }
    Ok(())
}

/// This process's CPU time so far (user + system), where it can be read.
#[cfg(unix)]
fn cpu_time() -> Option<Duration> {
    // SAFETY: getrusage writes the struct it is given, zeroed here, and reads nothing else.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return None;
    }
    let tv = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec.max(0) as u64) + Duration::from_micros(t.tv_usec.max(0) as u64)
    };
    Some(tv(usage.ru_utime) + tv(usage.ru_stime))
}

#[cfg(not(unix))]
fn cpu_time() -> Option<Duration> {
    None
}

fn cpu_per_job(before: Option<Duration>, jobs: u64) -> Option<f64> {
    let used = cpu_time()?.checked_sub(before?)?;
    (jobs > 0).then(|| used.as_secs_f64() * 1e6 / jobs as f64)
}

fn message(form: BenchForm, i: u64) -> Message {
    let m = Message::new(now_micros().to_string().into_bytes());
    match form {
        BenchForm::Advisory => m.set("k", i.to_string()),
        _ => m,
    }
}

pub(crate) fn run(cli: &Cli, url: &str, args: &BenchArgs) -> Result {
    let in_flight = (args.workers.max(args.handlers) as usize).max(1);
    let broker = Broker::builder(url)
        // Claim workers, the handlers' settlements, the held rows of the session forms, the
        // publisher and the drop.
        .pool_size((args.workers as usize + in_flight + args.handlers as usize + 4) as u32)
        .connection_timeout(Duration::from_secs(cli.connect_timeout.max(1)))
        .maintenance(false)
        .build()?;
    let name = scratch_name();
    let table = {
        let t = Table::new(name.as_str());
        match args.form {
            BenchForm::Lease => t.lease(Duration::from_secs(30)),
            BenchForm::RowLock => t,
            BenchForm::Advisory => t.text_column("k").advisory_lock(format!("{name}-{{k}}")),
        }
    };
    catch_signals();
    broker.create_table(&table)?;
    let mut scratch = Scratch {
        broker: &broker,
        table,
        dropped: false,
    };
    let table = &scratch.table.clone();
    let progress = std::io::stderr().is_terminal();
    let mut report = Report {
        database: broker.server_name(),
        table: name.clone(),
        form: args.form,
        ack: args.ack,
        workers: args.workers,
        handlers: args.handlers,
        burn_down: None,
        steady: None,
    };

    let burn_jobs = match (args.mode, args.rate) {
        (BenchMode::Steady, Some(_)) => None,
        (BenchMode::Steady, None) => Some(MEASURE_JOBS),
        _ => Some(args.jobs.unwrap_or(10_000)),
    };
    let measured = match burn_jobs {
        Some(jobs) => Some(burn_down(&broker, table, args, jobs, progress)?),
        None => None,
    };
    let half = measured
        .as_ref()
        .map_or(1, |b| ((b.jobs_per_sec / 2.0) as u64).max(1));
    if args.mode == BenchMode::Steady {
        if let Some(b) = &measured {
            // Measured only for the rate: said, not reported.
            eprintln!(
                "sqlbroker: a {}-job burn-down measured {:.1} jobs/s; steady rate {half} jobs/s",
                b.jobs, b.jobs_per_sec
            );
        }
    } else {
        report.burn_down = measured;
    }
    if args.mode != BenchMode::BurnDown {
        let rate = args.rate.unwrap_or(half);
        report.steady = Some(steady(&broker, table, args, rate, progress)?);
    }
    scratch.finish()?;
    if args.json {
        return say(format_args!("{}\n", json(&report)));
    }
    say(format_args!("{}", text(&report)))
}

fn text(r: &Report) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let name = |v: Option<clap::builder::PossibleValue>| {
        v.map_or_else(String::new, |v| v.get_name().to_string())
    };
    let cpu = |c: Option<f64>| c.map_or_else(|| "n/a".to_string(), |c| format!("{c:.1}"));
    let _ = writeln!(
        out,
        "bench on {}: form {}, ack {}, {} workers, {} handlers (scratch table {}, dropped)",
        r.database,
        name(r.form.to_possible_value()),
        name(r.ack.to_possible_value()),
        r.workers,
        r.handlers,
        r.table
    );
    if let Some(b) = &r.burn_down {
        let _ = writeln!(out, "burn-down: {} jobs in {:.3} s", b.jobs, b.seconds);
        let _ = writeln!(out, "burn-down jobs/s: {:.1}", b.jobs_per_sec);
        let _ = writeln!(
            out,
            "burn-down client CPU us/job: {}",
            cpu(b.cpu_us_per_job)
        );
    }
    if let Some(s) = &r.steady {
        let _ = writeln!(
            out,
            "steady: {} jobs/s asked for {} s",
            s.rate_asked, s.seconds
        );
        let _ = writeln!(
            out,
            "steady published: {} ({:.1} jobs/s over {:.3} s)",
            s.published, s.published_per_sec, s.publish_seconds
        );
        if s.fell_behind {
            let _ = writeln!(
                out,
                "steady: the publisher fell behind: {} of the {} asked ({:.1} of {} jobs/s): \
                 this client or the database took no more, so the figures are for that rate",
                s.published,
                s.rate_asked.saturating_mul(s.seconds),
                s.published_per_sec,
                s.rate_asked
            );
        }
        let _ = writeln!(
            out,
            "steady worked while publishing: {} ({:.1} jobs/s)",
            s.worked_in_time, s.worked_per_sec
        );
        let _ = writeln!(out, "steady worked: {}", s.worked);
        let _ = writeln!(out, "steady publish-to-start p50 ms: {:.3}", s.p50_ms);
        let _ = writeln!(out, "steady publish-to-start p99 ms: {:.3}", s.p99_ms);
        let _ = writeln!(out, "steady backlog at the end: {}", s.backlog_at_end);
        let _ = writeln!(out, "steady client CPU us/job: {}", cpu(s.cpu_us_per_job));
    }
    out
}

/// A subscription of `--workers` claim workers as `--form` and `--ack` ask.
fn subscribe(broker: &Broker, table: &Table, args: &BenchArgs) -> Result<Subscription> {
    let mut b = broker
        .subscription(table)
        .workers(args.workers as usize)
        .poll_interval(Duration::from_millis(50));
    match args.form {
        // Each row in work holds a connection: one per handler thread.
        BenchForm::RowLock | BenchForm::Advisory if broker.database() != "SQLite" => {
            b = b.max_in_flight(args.workers.max(args.handlers) as usize);
        }
        _ if args.ack == BenchAck::Batch => {
            b = b
                .batch_size(100)
                .max_in_flight(100 * args.workers.max(2) as usize);
        }
        _ => {}
    }
    if args.ack == BenchAck::Deferred {
        b = b.ack_mode(AckMode::Deferred {
            within: Duration::from_millis(10),
        });
    }
    Ok(b.start()?)
}

/// A handler thread: takes deliveries until told to stop, recording each one's
/// publish-to-start latency, and acks them as `--ack` asks.
fn handle(sub: &Subscription, ack: BenchAck, shared: &Shared) {
    let record = |d: &Delivery, at: u64, into: &mut Vec<u64>| {
        if let Some(t) = std::str::from_utf8(d.payload())
            .ok()
            .and_then(|s| s.parse::<u64>().ok())
        {
            into.push(at.saturating_sub(t).max(1));
        }
    };
    let mut mine = Vec::new();
    let wait = Duration::from_millis(200);
    while !shared.stop.load(Ordering::Acquire) {
        let batch = match ack {
            BenchAck::Batch => sub.next_batch(100, wait),
            _ => sub.next_delivery_timeout(wait).map(|d| vec![d]),
        };
        let batch = match batch {
            Ok(b) => b,
            Err(NextError::Timeout | NextError::Empty) => continue,
            Err(e) => {
                let why = sub
                    .closed_by()
                    .map_or_else(|| e.to_string(), |c| c.to_string());
                shared.fail(format!("the subscription ended: {why}"));
                break;
            }
        };
        let at = now_micros();
        if shared.record.load(Ordering::Acquire) {
            for d in &batch {
                record(d, at, &mut mine);
            }
        }
        let n = batch.len() as u64;
        let failed = match ack {
            BenchAck::Batch => Delivery::ack_all(batch).into_iter().find_map(Result::err),
            _ => batch.into_iter().find_map(|d| d.ack().err()),
        };
        if let Some(e) = failed {
            shared.fail(format!("ack: {e}"));
            break;
        }
        shared.done.fetch_add(n, Ordering::AcqRel);
    }
    shared
        .latencies
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .extend(mine);
}

/// Waits until `done` reaches `target()`, while `running()` or until then; rewrites the
/// progress line; an error of the handlers or no job done for `stall` ends the wait with
/// an error.
fn wait_for(
    stall: Duration,
    shared: &Shared,
    label: &str,
    progress: bool,
    mut target: impl FnMut() -> u64,
    mut running: impl FnMut() -> bool,
) -> Result {
    let start = Instant::now();
    let mut last = shared.done.load(Ordering::Acquire);
    let mut last_change = Instant::now();
    let mut shown = Instant::now();
    loop {
        interrupted()?;
        if let Some(e) = shared.error() {
            return Err(e.into());
        }
        let done = shared.done.load(Ordering::Acquire);
        let total = target();
        if done >= total && !running() {
            break;
        }
        if done != last {
            last = done;
            last_change = Instant::now();
        } else if last_change.elapsed() > stall && !running() {
            return Err(format!(
                "{label}: no job done for {} s ({done} of {total} done); giving up",
                stall.as_secs()
            )
            .into());
        }
        if progress && shown.elapsed() >= PROGRESS_EVERY {
            shown = Instant::now();
            let rate = done as f64 / start.elapsed().as_secs_f64().max(1e-9);
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r{label}: {done}/{total} jobs, {rate:.0} jobs/s   ");
            let _ = err.flush();
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    if progress {
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "\r{:60}\r", "");
        let _ = err.flush();
    }
    Ok(())
}

/// Publishes `jobs` (untimed), then times a subscription working them to the last ack.
fn burn_down(
    broker: &Broker,
    table: &Table,
    args: &BenchArgs,
    jobs: u64,
    progress: bool,
) -> Result<BurnDown> {
    let mut i = 0;
    while i < jobs {
        interrupted()?;
        let n = (jobs - i).min(CHUNK as u64);
        broker.publish_batch(table, (i..i + n).map(|j| message(args.form, j)))?;
        i += n;
    }
    let shared = Shared::default();
    let cpu = cpu_time();
    let start = Instant::now();
    let sub = subscribe(broker, table, args)?;
    let waited = std::thread::scope(|s| {
        for _ in 0..args.handlers {
            s.spawn(|| handle(&sub, args.ack, &shared));
        }
        let waited = wait_for(
            Duration::from_secs(args.stall),
            &shared,
            "burn-down",
            progress,
            || jobs,
            || false,
        );
        shared.stop.store(true, Ordering::Release);
        waited
    });
    // Deferred acks are written by the time this returns: their writes are timed too.
    let shut = sub.shutdown(Duration::from_secs(30));
    let seconds = start.elapsed().as_secs_f64();
    waited?;
    shut?;
    Ok(BurnDown {
        jobs,
        seconds,
        jobs_per_sec: jobs as f64 / seconds.max(1e-9),
        cpu_us_per_job: cpu_per_job(cpu, jobs),
    })
}

/// A publisher thread at `rate` jobs/s for `--secs` while the subscription works; then the
/// backlog is worked off. The publisher stops at `--secs` whatever it has published (one more
/// batch at most tops the count up to the schedule's): a rate it cannot keep is reported as
/// the rate it reached and said to have fallen behind, not caught up on for as long as that
/// takes (at 40,000 jobs/s asked for 2 s, that was 100 s of publishing reported as 2).
fn steady(
    broker: &Broker,
    table: &Table,
    args: &BenchArgs,
    rate: u64,
    progress: bool,
) -> Result<Steady> {
    let shared = Shared::default();
    shared.record.store(true, Ordering::Release);
    let published = AtomicU64::new(0);
    let publishing = AtomicBool::new(true);
    let secs = Duration::from_secs(args.secs());
    let sub = subscribe(broker, table, args)?;
    let cpu = cpu_time();
    let start = Instant::now();
    let mut at_end = None;
    // When the publisher stopped (its last batch written).
    let stopped = Mutex::new(None::<Instant>);
    let waited = std::thread::scope(|s| {
        s.spawn(|| {
            let mut next = start;
            let total = rate.saturating_mul(args.secs());
            loop {
                if shared.stop.load(Ordering::Acquire) {
                    break;
                }
                // The first tick at or past --secs tops the count up to the schedule's, one
                // batch at most, and is the last: a publisher behind stays behind.
                let ended = start.elapsed() >= secs;
                let due = match ended {
                    true => total,
                    false => (rate as f64 * start.elapsed().as_secs_f64()) as u64,
                };
                let from = published.load(Ordering::Acquire);
                let n = due.saturating_sub(from).min(CHUNK as u64);
                if n > 0 {
                    let batch = (from..from + n).map(|j| message(args.form, j));
                    if let Err(e) = broker.publish_batch(table, batch) {
                        shared.fail(format!("publish: {e}"));
                        break;
                    }
                    published.fetch_add(n, Ordering::AcqRel);
                }
                if ended {
                    break;
                }
                next += TICK;
                if let Some(pause) = next.checked_duration_since(Instant::now()) {
                    std::thread::sleep(pause);
                }
            }
            *stopped.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
            publishing.store(false, Ordering::Release);
        });
        for _ in 0..args.handlers {
            s.spawn(|| handle(&sub, args.ack, &shared));
        }
        // While publishing: the progress line; then the backlog worked off.
        let waited = wait_for(
            Duration::from_secs(args.stall),
            &shared,
            "steady",
            progress,
            || published.load(Ordering::Acquire),
            || {
                let on = publishing.load(Ordering::Acquire);
                if !on && at_end.is_none() {
                    // Publishing just stopped: what was worked of what was published.
                    at_end = Some((
                        shared.done.load(Ordering::Acquire),
                        published.load(Ordering::Acquire),
                    ));
                }
                on
            },
        );
        shared.stop.store(true, Ordering::Release);
        waited
    });
    let shut = sub.shutdown(Duration::from_secs(30));
    waited?;
    shut?;
    let published = published.load(Ordering::Acquire);
    let worked = shared.done.load(Ordering::Acquire);
    let mut lat = std::mem::take(&mut *shared.latencies.lock().unwrap_or_else(|e| e.into_inner()));
    lat.sort_unstable();
    let pct = |p: usize| -> f64 {
        if lat.is_empty() {
            return 0.0;
        }
        lat[(lat.len() * p / 100).min(lat.len() - 1)] as f64 / 1000.0
    };
    let (worked_in_time, published_in_time) = at_end.unwrap_or((worked, published));
    let took = stopped
        .into_inner()
        .unwrap_or_else(|e| e.into_inner())
        .map_or(secs, |at| at.duration_since(start))
        .as_secs_f64()
        .max(1e-9);
    Ok(Steady {
        rate_asked: rate,
        seconds: args.secs(),
        published,
        publish_seconds: took,
        published_per_sec: published_in_time as f64 / took,
        fell_behind: published < rate.saturating_mul(args.secs()),
        worked_in_time,
        worked_per_sec: worked_in_time as f64 / took,
        worked,
        p50_ms: pct(50),
        p99_ms: pct(99),
        backlog_at_end: published_in_time.saturating_sub(worked_in_time),
        cpu_us_per_job: cpu_per_job(cpu, worked),
    })
}
