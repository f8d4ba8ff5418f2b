//! Steady load, not only burn-downs (issue 28, item 3): a queue published to at a fixed rate
//! while it works, as users run one.
//!
//! Per database (SQLite, PostgreSQL, MariaDB) and form (`STEADY_FORMS`, default `lease`):
//! 1. **calibrate**: `STEADY_CALIBRATE` jobs (default 20,000) published, then burned down by
//!    the subscription below; its rate is the burn-down rate `R`;
//! 2. **phases**, each `STEADY_SECS` seconds (default 60): another process (this binary again,
//!    `--publisher`) publishes at a fixed rate, 50% of `R`, then 90% of `R`, then (servers) 90%
//!    of `R` while a third session holds a `REPEATABLE READ` snapshot open for the whole phase
//!    (item 1's held snapshot). The publisher sends a batch every 10 ms, as many rows as keep
//!    it on its schedule, each payload its publish time.
//!
//! The subscription: `STEADY_WORKERS` (default 8) claim workers and as many handler threads
//! looping `next_delivery_timeout` + `ack` (durable), `max_in_flight` the same; the handler
//! reads the publish time from the payload the moment it gets the delivery: **publish to
//! start** (the publisher's clock and this one are the same host's). Each phase prints the
//! backlog (rows not yet acked, `Broker::stats`) every `STEADY_EVERY` seconds (default 10),
//! then the publish rate reached, the rate worked, p50/p99/p999/max publish to start, and the
//! largest and last backlog. A phase whose publisher fell behind its schedule says so.
//!
//! ```sh
//! cargo bench --bench steady                               # every database, lease form
//! STEADY_SECS=120 STEADY_FORMS=lease,row_lock,advisory cargo bench --bench steady -- postgres
//! ```

// What the other benches share; this one uses part of it.
#[allow(dead_code)]
#[path = "support/mod.rs"]
mod support;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use sqlbroker::{Broker, Message, Table};
use support::{drop_table, env_num, hold};

fn now_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// The table of one cell; the publisher process builds the same description from the name.
fn table(name: &str, form: &str) -> Table {
    let t = Table::new(name);
    match form {
        "lease" => t.lease(Duration::from_secs(30)),
        "advisory" => t.text_column("k").advisory_lock(format!("{name}-{{k}}")),
        _ => t,
    }
}

fn message(form: &str, seq: u64) -> Message {
    let m = Message::new(now_micros().to_string().into_bytes());
    match form {
        "advisory" => m.set("k", format!("k{seq}")),
        _ => m,
    }
}

/// The publisher process: `rate` rows a second for `secs` seconds, a batch every 10 ms; prints
/// `published <rows> behind_ms <most behind schedule>` when done.
fn publisher(args: &[String]) {
    let [url, name, form, rate, secs] = args else {
        panic!("--publisher <url> <table> <form> <rate> <secs>");
    };
    let (rate, secs): (f64, f64) = (rate.parse().unwrap(), secs.parse().unwrap());
    let broker = Broker::connect(url).expect("connect");
    let t = table(name, form);
    let start = Instant::now();
    let (mut sent, mut behind) = (0u64, 0f64);
    while start.elapsed().as_secs_f64() < secs {
        let due = (start.elapsed().as_secs_f64() * rate) as u64;
        if due > sent {
            let msgs: Vec<Message> = (sent..due).map(|i| message(form, i)).collect();
            broker.publish_batch(&t, msgs).expect("publish");
            sent = due;
        }
        // How far behind its schedule the publisher was once this batch was in.
        let lag = start.elapsed().as_secs_f64() - sent as f64 / rate;
        behind = behind.max(lag * 1000.0);
        std::thread::sleep(Duration::from_millis(10));
    }
    println!("published {sent} behind_ms {behind:.0}");
}

/// One phase's figures.
struct Phase {
    published: u64,
    behind_ms: f64,
    acked: usize,
    latencies: Vec<u64>,
    backlog: Vec<(f64, u64)>,
}

/// Runs the subscription while `publish` (a child process, or nothing) runs for `secs`; then
/// works off what is left for at most `secs` more.
fn work(
    broker: &Broker,
    t: &Table,
    workers: usize,
    secs: f64,
    every: f64,
    expect: Option<usize>,
    publish: Option<std::process::Child>,
) -> Phase {
    let sub = Arc::new(
        broker
            .subscription(t)
            .workers(workers)
            .max_in_flight(workers)
            .start()
            .expect("start"),
    );
    let acked = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let latencies = Arc::new(Mutex::new(Vec::with_capacity(1 << 16)));
    let handlers: Vec<_> = (0..workers)
        .map(|_| {
            let (sub, acked, stop, lat) =
                (sub.clone(), acked.clone(), stop.clone(), latencies.clone());
            std::thread::spawn(move || {
                let mut mine = Vec::with_capacity(1 << 14);
                while !stop.load(Ordering::Relaxed) {
                    if let Ok(d) = sub.next_delivery_timeout(Duration::from_millis(100)) {
                        let at = now_micros();
                        let sent: u64 = std::str::from_utf8(d.payload())
                            .ok()
                            .and_then(|s| s.parse().ok())
                            .unwrap_or(at);
                        mine.push(at.saturating_sub(sent));
                        d.ack().expect("ack");
                        acked.fetch_add(1, Ordering::Relaxed);
                    }
                }
                lat.lock().unwrap().extend(mine);
            })
        })
        .collect();
    let start = Instant::now();
    let mut backlog = Vec::new();
    let mut next_sample = every;
    let (mut published, mut behind_ms) = (0, 0.0);
    let mut child = publish;
    loop {
        let t_s = start.elapsed().as_secs_f64();
        if t_s >= next_sample {
            let s = broker.stats(t).expect("stats");
            let left = s.ready + s.scheduled + s.in_flight.unwrap_or(0);
            println!("    t={t_s:>5.0}s backlog {left}");
            backlog.push((t_s, left));
            next_sample += every;
        }
        if let Some(c) = child.as_mut() {
            if c.try_wait().expect("publisher").is_some() {
                let out = child.take().unwrap().wait_with_output().expect("publisher");
                let text = String::from_utf8_lossy(&out.stdout);
                let mut words = text.split_whitespace();
                while let Some(w) = words.next() {
                    match w {
                        "published" => published = words.next().unwrap().parse().unwrap(),
                        "behind_ms" => behind_ms = words.next().unwrap().parse().unwrap(),
                        _ => {}
                    }
                }
                assert!(out.status.success(), "the publisher failed: {text}");
            }
        }
        let target = expect.unwrap_or(published as usize);
        let published_all = child.is_none() && (expect.is_some() || published > 0);
        if published_all && acked.load(Ordering::Relaxed) >= target {
            break;
        }
        if t_s > 2.0 * secs + 30.0 {
            println!(
                "    stopped: {} of {target} worked",
                acked.load(Ordering::Relaxed)
            );
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    stop.store(true, Ordering::Relaxed);
    for h in handlers {
        h.join().expect("handler");
    }
    if let Ok(sub) = Arc::try_unwrap(sub) {
        let _ = sub.shutdown(Duration::from_secs(10));
    }
    let mut latencies = std::mem::take(&mut *latencies.lock().unwrap());
    latencies.sort_unstable();
    Phase {
        published,
        behind_ms,
        acked: acked.load(Ordering::Relaxed),
        latencies,
        backlog,
    }
}

fn pct(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i] as f64 / 1000.0
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--publisher") {
        return publisher(&args[i + 1..]);
    }
    let filters = support::filters();
    let workers = env_num("STEADY_WORKERS", 8);
    let calibrate = env_num("STEADY_CALIBRATE", 20_000);
    let secs = env_num("STEADY_SECS", 60) as f64;
    let every = env_num("STEADY_EVERY", 10) as f64;
    let forms = std::env::var("STEADY_FORMS").unwrap_or_else(|_| "lease".into());
    for form in forms.split(',').map(str::trim) {
        assert!(
            ["lease", "row_lock", "advisory"].contains(&form),
            "STEADY_FORMS: unknown form {form:?} (lease, row_lock, advisory)"
        );
    }
    let exe = std::env::current_exe().expect("this binary");
    for (db, url) in support::databases("steady") {
        for form in forms.split(',').map(str::trim) {
            let id = format!("{db}/{form}");
            if !support::wanted(&filters, &id) {
                continue;
            }
            let Ok(broker) = Broker::builder(&url)
                .pool_size(2 * workers as u32 + 4)
                .build()
            else {
                println!("{id}: skipped, {db} does not answer");
                continue;
            };
            let name = format!("bench_steady_{}_{db}_{form}", std::process::id());
            let t = table(&name, form);
            broker.create_table(&t).expect("create table");
            // 1. The burn-down rate.
            for chunk in (0..calibrate as u64).collect::<Vec<_>>().chunks(500) {
                let msgs: Vec<Message> = chunk.iter().map(|i| message(form, *i)).collect();
                broker.publish_batch(&t, msgs).expect("publish");
            }
            let began = Instant::now();
            work(&broker, &t, workers, secs, 1e9, Some(calibrate), None);
            let rate = calibrate as f64 / began.elapsed().as_secs_f64();
            println!("{id}: burn-down {rate:.0} jobs/s ({calibrate} jobs, {workers} workers)");
            // 2. The phases.
            let mut phases = vec![("50%", 0.5, false), ("90%", 0.9, false)];
            if db != "sqlite" {
                phases.push(("90% held", 0.9, true));
            }
            for (label, share, held) in phases {
                let target = rate * share;
                println!("{id} {label}: publishing {target:.0} jobs/s for {secs:.0} s");
                let snapshot = held.then(|| hold(db, &url, &name));
                let child = std::process::Command::new(&exe)
                    .args(["--publisher", &url, &name, form])
                    .arg(format!("{target}"))
                    .arg(format!("{secs}"))
                    .stdout(std::process::Stdio::piped())
                    .spawn()
                    .expect("spawn the publisher");
                let p = work(&broker, &t, workers, secs, every, None, Some(child));
                drop(snapshot);
                let l = &p.latencies;
                let peak = p.backlog.iter().map(|b| b.1).max().unwrap_or(0);
                let last = p.backlog.last().map_or(0, |b| b.1);
                println!(
                    "{id} {label}: published {:.0} jobs/s (asked {target:.0}{}), worked {} rows; \
                     publish to start p50 {:.1} ms p99 {:.1} ms p999 {:.1} ms max {:.1} ms; \
                     backlog peak {peak} last sampled {last}",
                    p.published as f64 / secs,
                    if p.behind_ms > 1000.0 {
                        format!(", publisher up to {:.0} ms behind", p.behind_ms)
                    } else {
                        String::new()
                    },
                    p.acked,
                    pct(l, 0.50),
                    pct(l, 0.99),
                    pct(l, 0.999),
                    pct(l, 1.0),
                );
            }
            drop(broker);
            drop_table(db, &url, &name);
        }
    }
    support::remove_sqlite("steady");
}
