//! Publish -> delivery latency: how long a row takes from the start of `Broker::publish` to
//! `next_delivery` returning it on an idle subscription (and from `publish` returning, after
//! its commit, to the delivery), (a) when the subscription is on the same broker (in-process
//! wake-up) and (b) on another broker (another process's view: the PostgreSQL listener, the
//! SQLite change probe, the MySQL/MariaDB adaptive poll).
//!
//! ```sh
//! cargo run --release --example latency                  # every database, 300 rows per case
//! cargo run --release --example latency -- --rows 1000 --gap-ms 20 sqlite postgres
//! ```
//!
//! Options: `--rows N` per case (default 300), `--gap-ms G` between publishes (default 20: the
//! subscription is idle when each row arrives; on MySQL the adaptive poll is then in its fast
//! phase, so try `--gap-ms 1000` for a subscription that has been idle for a while),
//! `--poll-ms P` the subscription's poll interval (default 250, the library's default),
//! `--idle-secs S` to measure instead the CPU an idle subscription costs this process over `S`
//! seconds (Linux: `/proc/self/stat`), with the change feed's thread and the polls, then
//! the databases (`sqlite`, `postgres`, `mysql`; default all). URLs: `SQLBROKER_PG_URL`
//! (default `postgres://postgres@127.0.0.1:5432/test`), `SQLBROKER_MYSQL_URL` (default
//! `mysql://root@127.0.0.1:3306/test`); SQLite uses a fresh file in the temp directory. A
//! server that does not answer is skipped. The lease form; each case's table is dropped after.
//!
//! (c) "another process": the subscription runs in a child process (this example started
//! again with `--child`), which prints the wall-clock time of each delivery; the latency is
//! that time minus the wall-clock time the parent started the row's `publish` (one machine,
//! one clock). This is what two services see: no state of the publisher's process is shared.

use std::time::{Duration, Instant};

use sqlbroker::{Broker, Message, Table};

struct Args {
    rows: usize,
    gap: Duration,
    poll: Duration,
    idle: Option<Duration>,
    dbs: Vec<String>,
}

fn args() -> Args {
    let mut a = Args {
        rows: 300,
        gap: Duration::from_millis(20),
        poll: Duration::from_millis(250),
        idle: None,
        dbs: Vec::new(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut num = || -> u64 {
            it.next()
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{arg} needs a number"))
        };
        match arg.as_str() {
            "--rows" => a.rows = num() as usize,
            "--gap-ms" => a.gap = Duration::from_millis(num()),
            "--poll-ms" => a.poll = Duration::from_millis(num()),
            "--idle-secs" => a.idle = Some(Duration::from_secs(num())),
            "--bench" => {} // passed by `cargo bench`
            db => a.dbs.push(db.to_string()),
        }
    }
    if a.dbs.is_empty() {
        a.dbs = ["sqlite", "postgres", "mysql"].map(String::from).to_vec();
    }
    a
}

fn main() {
    let argv: Vec<String> = std::env::args().collect();
    if argv.get(1).map(String::as_str) == Some("--child") {
        return child(&argv[2], &argv[3], argv[4].parse().expect("poll ms"));
    }
    let a = args();
    if a.idle.is_some() {
        println!("| database | idle subscription: process CPU |\n|---|---|");
    } else {
        println!(
            "{} rows per case, {:?} between publishes, poll interval {:?}, lease form",
            a.rows, a.gap, a.poll
        );
        println!(
        "| database | subscription on | publish p50 | latency p50 | p90 | p99 | max | after the commit: p50 | p99 |\n|---|---|---|---|---|---|---|---|---|"
    );
    }
    for db in &a.dbs {
        let (url, file) = match db.as_str() {
            "sqlite" => {
                let f = std::env::temp_dir()
                    .join(format!("sqlbroker-latency-{}.db", std::process::id()));
                (format!("sqlite:{}", f.display()), Some(f))
            }
            "postgres" => (
                std::env::var("SQLBROKER_PG_URL")
                    .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into()),
                None,
            ),
            "mysql" => (
                std::env::var("SQLBROKER_MYSQL_URL")
                    .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into()),
                None,
            ),
            other => panic!("unknown database {other:?}: sqlite, postgres or mysql"),
        };
        let publisher = match Broker::builder(&url)
            .connection_timeout(Duration::from_secs(5))
            .build()
        {
            Ok(b) => b,
            Err(e) => {
                println!("| {db} | SKIPPED: {e} | | | | | | | |");
                continue;
            }
        };
        if let Some(idle) = a.idle {
            let name = format!("latency_{}_idle", std::process::id());
            let table = Table::new(&name).lease(Duration::from_secs(30));
            publisher.create_table(&table).expect("create table");
            let subscriber = Broker::connect(&url).expect("second broker");
            let sub = subscriber
                .subscription(&table)
                .poll_interval(a.poll)
                .start()
                .expect("start");
            std::thread::sleep(Duration::from_secs(1));
            let (cpu0, t0) = (cpu(), Instant::now());
            std::thread::sleep(idle);
            let used = cpu() - cpu0;
            let per_sec = used.as_secs_f64() * 1e3 / t0.elapsed().as_secs_f64();
            println!(
                "| {} | {per_sec:.2} ms per second ({:.2}% of a core) |",
                publisher.database(),
                per_sec / 10.0
            );
            sub.close();
            drop_table(db, &url, &name);
        }
        for case in 0..3u8 {
            if a.idle.is_some() {
                break;
            }
            let name = format!("latency_{}_{case}", std::process::id());
            let table = Table::new(&name).lease(Duration::from_secs(30));
            publisher.create_table(&table).expect("create table");
            let (publish, latency) = match case {
                0 => measure(&publisher, &publisher, &table, &a),
                1 => measure(
                    &publisher,
                    &Broker::connect(&url).expect("second broker"),
                    &table,
                    &a,
                ),
                _ => measure_process(&publisher, &url, &table, &a),
            };
            let after: Vec<Duration> = latency
                .iter()
                .zip(&publish)
                .map(|(l, p)| l.saturating_sub(*p))
                .collect();
            let label = ["the same broker", "another broker", "another process"][case as usize];
            println!(
                "| {} | {label} | {} | {} | {} | {} | {} | {} | {} |",
                publisher.database(),
                ms(pct(&publish, 50)),
                ms(pct(&latency, 50)),
                ms(pct(&latency, 90)),
                ms(pct(&latency, 99)),
                ms(pct(&latency, 100)),
                ms(pct(&after, 50)),
                ms(pct(&after, 99)),
            );
            drop_table(db, &url, &name);
        }
        if let Some(f) = file {
            for suffix in ["", "-wal", "-shm"] {
                let _ = std::fs::remove_file(format!("{}{suffix}", f.display()));
            }
        }
    }
}

/// Publishes `a.rows` rows one at a time on `publisher`, each once the subscription on
/// `subscriber` has handed out the one before and `a.gap` has passed; the publish calls'
/// durations and the publish -> delivery latencies.
fn measure(
    publisher: &Broker,
    subscriber: &Broker,
    table: &Table,
    a: &Args,
) -> (Vec<Duration>, Vec<Duration>) {
    let sub = subscriber
        .subscription(table)
        .poll_interval(a.poll)
        .start()
        .expect("start");
    let (tx, rx) = crossbeam_channel::bounded::<Instant>(1);
    std::thread::scope(|s| {
        s.spawn(|| {
            while let Some(d) = sub.next_delivery() {
                let at = Instant::now();
                d.ack().expect("ack");
                if tx.send(at).is_err() {
                    break;
                }
            }
        });
        let mut publish = Vec::with_capacity(a.rows);
        let mut latency = Vec::with_capacity(a.rows);
        std::thread::sleep(Duration::from_millis(300));
        for i in 0..a.rows {
            std::thread::sleep(a.gap);
            let start = Instant::now();
            publisher
                .publish(table, Message::new(format!("{i}")))
                .expect("publish");
            publish.push(start.elapsed());
            let at = rx
                .recv_timeout(Duration::from_secs(10))
                .expect("no delivery within 10 s");
            latency.push(at - start);
        }
        sub.close();
        (publish, latency)
    })
}

/// As [`measure`], with the subscription in a child process (`--child`): the latency runs from
/// the wall-clock time `publish` started to the wall-clock time the child printed for it.
fn measure_process(
    publisher: &Broker,
    url: &str,
    table: &Table,
    a: &Args,
) -> (Vec<Duration>, Vec<Duration>) {
    use std::io::BufRead;
    let mut child = std::process::Command::new(std::env::current_exe().expect("current exe"))
        .args([
            "--child",
            url,
            table.name(),
            &a.poll.as_millis().to_string(),
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start the child process");
    let (tx, rx) = crossbeam_channel::unbounded::<String>();
    let out = child.stdout.take().expect("child stdout");
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let line = rx.recv_timeout(Duration::from_secs(30));
    assert_eq!(line.as_deref(), Ok("READY"), "the child did not start");
    std::thread::sleep(Duration::from_millis(300));
    let mut publish = Vec::with_capacity(a.rows);
    let mut latency = Vec::with_capacity(a.rows);
    for i in 0..a.rows {
        std::thread::sleep(a.gap);
        let (wall, start) = (unix_nanos(), Instant::now());
        publisher
            .publish(table, Message::new(format!("{i}")))
            .expect("publish");
        publish.push(start.elapsed());
        let line = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("no delivery within 10 s");
        let (id, at) = line.split_once(' ').expect("`<payload> <nanos>`");
        assert_eq!(id, i.to_string(), "the child delivered another row");
        let at: u128 = at.parse().expect("nanos");
        latency.push(Duration::from_nanos(at.saturating_sub(wall) as u64));
    }
    let _ = child.kill();
    let _ = child.wait();
    (publish, latency)
}

/// The child of [`measure_process`]: subscribes to `table` on its own broker, prints `READY`,
/// then `<payload> <unix nanos>` as each delivery arrives (and acks it), until killed.
fn child(url: &str, table: &str, poll_ms: u64) {
    use std::io::Write;
    let broker = Broker::connect(url).expect("child: connect");
    let table = Table::new(table).lease(Duration::from_secs(30));
    let sub = broker
        .subscription(&table)
        .poll_interval(Duration::from_millis(poll_ms))
        .start()
        .expect("child: start");
    let mut out = std::io::stdout();
    writeln!(out, "READY").unwrap();
    out.flush().unwrap();
    while let Some(d) = sub.next_delivery() {
        let at = unix_nanos();
        writeln!(out, "{} {at}", String::from_utf8_lossy(d.payload())).unwrap();
        out.flush().unwrap();
        d.ack().expect("child: ack");
    }
}

fn unix_nanos() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

/// CPU time this process used so far, user and system (Linux; zero elsewhere).
fn cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which may hold spaces) in parentheses.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<u64> = rest
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name; in ticks of
    // 1/100 s on Linux.
    let ticks = f.get(11).copied().unwrap_or(0) + f.get(12).copied().unwrap_or(0);
    Duration::from_millis(ticks * 10)
}

fn pct(v: &[Duration], p: usize) -> Duration {
    let mut v = v.to_vec();
    v.sort();
    v[((v.len() * p).div_ceil(100)).clamp(1, v.len()) - 1]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

fn drop_table(db: &str, url: &str, name: &str) {
    let sql = format!("DROP TABLE IF EXISTS {name}");
    let r: Result<(), Box<dyn std::error::Error>> = match db {
        "postgres" => postgres::Client::connect(url, postgres::NoTls)
            .and_then(|mut c| c.batch_execute(&sql))
            .map_err(Into::into),
        "mysql" => mysql::Opts::from_url(url)
            .map_err(Into::into)
            .and_then(|o| mysql::Conn::new(o).map_err(Into::into))
            .and_then(|mut c| {
                use mysql::prelude::Queryable;
                c.query_drop(&sql).map_err(Into::into)
            }),
        _ => Ok(()),
    };
    if let Err(e) = r {
        eprintln!("dropping {name}: {e}");
    }
}
