//! `sqlbroker dashboard` on a database that stops answering (issue 38): through a proxy that
//! accepts and passes nothing (`common::blackhole`), its counts froze for minutes with
//! `sqlbroker_queue_count_ok 1`, and after the outage came back three times its length later
//! (the sampler stretched its interval by the time the hung count took).
//!
//! Here, per server: within the dashboard's round trip timeout (15 s), a pool checkout and a
//! sample interval, `/metrics` says the count failed (`count_ok 0`) and the overview answers
//! 503; after a 30 s outage the counts are back (with a row published meanwhile) within the
//! same bound of the proxy passing bytes again, whatever the outage's length.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::blackhole::BlackHole;
use common::{live, wait_for, Db};
use sqlbroker::{Message, Table};

const BIN: &str = env!("CARGO_BIN_EXE_sqlbroker");

/// The dashboard's round trip timeout (`commands/dashboard/mod.rs`).
const ROUND_TRIP: Duration = Duration::from_secs(15);
/// `--sample 1`.
const SAMPLE: Duration = Duration::from_secs(1);
/// `--connect-timeout 2`: the pool's checkout timeout (a count tries once more on a new
/// connection after a lost one).
const POOL: Duration = Duration::from_secs(2);
/// Scheduling and a pool checkout on a loaded machine.
const SLACK: Duration = Duration::from_secs(4);
/// How long the database stays silent.
const OUTAGE: Duration = Duration::from_secs(30);

/// A running dashboard, killed when dropped.
struct Dash {
    child: Child,
    base: String,
    agent: ureq::Agent,
}

impl Drop for Dash {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Dash {
    fn start(url: &str, table: &str) -> Dash {
        let mut child = Command::new(BIN)
            .args(["dashboard", "--listen", "127.0.0.1:0", "--table", table])
            .args(["--sample", "1", "--connect-timeout", "2"])
            .env("DATABASE_URL", url)
            .env_remove("SQLBROKER_DASHBOARD_TOKEN")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("run sqlbroker dashboard");
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line)
            .expect("the dashboard's first line");
        let Some(addr) = line
            .split("listening on http://")
            .nth(1)
            .and_then(|r| r.split('/').next())
        else {
            let _ = child.kill();
            panic!("the dashboard did not say where it listens: {line:?}");
        };
        std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
        Dash {
            base: format!("http://{addr}"),
            child,
            agent: ureq::AgentBuilder::new()
                .redirects(0)
                .timeout(Duration::from_secs(10))
                .build(),
        }
    }

    /// The status and body of `path` (the pages read the sampler's memory: they answer at
    /// once whatever the database does).
    fn get(&self, path: &str) -> (u16, String) {
        match self.agent.get(&format!("{}{path}", self.base)).call() {
            Ok(r) => (r.status(), r.into_string().unwrap()),
            Err(ureq::Error::Status(s, r)) => (s, r.into_string().unwrap()),
            Err(e) => panic!("GET {path}: {e}"),
        }
    }

    /// `count_ok` and the ready rows of `table` on `/metrics`.
    fn counts(&self, table: &str) -> (Option<String>, Option<String>) {
        let (_, m) = self.get("/metrics");
        let value = |series: &str| {
            m.lines()
                .find_map(|l| l.strip_prefix(series))
                .map(|v| v.trim().to_string())
        };
        (
            value(&format!("sqlbroker_queue_count_ok{{table=\"{table}\"}}")),
            value(&format!(
                "sqlbroker_queue_jobs{{table=\"{table}\",state=\"ready\"}}"
            )),
        )
    }
}

fn silent_database(db: Db) {
    if !common::slow_suite("the dashboard's black hole suite") {
        return;
    }
    let Some(l) = live(db) else { return };
    let t = l.create(
        Table::new(common::unique("dsilent"))
            .text_column("k")
            .lease(Duration::from_secs(30)),
    );
    let name = t.name().to_string();
    let publish = |k: &str| {
        l.broker
            .publish(&t, Message::new(b"x".to_vec()).set("k", k))
            .unwrap();
    };
    publish("a");
    let (hole, url) = BlackHole::before(db, &l.url);
    let dash = Dash::start(&url, &name);
    let one = (Some("1".to_string()), Some("1".to_string()));
    assert!(
        wait_for(Duration::from_secs(20), || dash.counts(&name) == one),
        "{db:?}: precondition: the first count: {:?}",
        dash.counts(&name)
    );

    hole.swallow();
    let swallowed = Instant::now();
    let bound = ROUND_TRIP + POOL + SAMPLE + SLACK;
    let failing = wait_for(bound, || dash.counts(&name).0.as_deref() == Some("0"));
    assert!(
        failing,
        "{db:?}: {:?} after the database stopped answering, /metrics still says {:?} \
         (count_ok, ready)",
        swallowed.elapsed(),
        dash.counts(&name)
    );
    let seen = swallowed.elapsed();
    let (status, page) = dash.get("/");
    assert_eq!(status, 503, "{db:?}: the overview while failing: {page}");
    assert!(page.contains(&format!("Counting {name} failed")), "{page}");
    eprintln!("{db:?}: count_ok 0 {seen:?} after the database stopped answering");

    // Meanwhile the table changes; the dashboard must show it once the database is back.
    publish("b");
    std::thread::sleep(OUTAGE.saturating_sub(swallowed.elapsed()));
    hole.pass();
    let passed = Instant::now();
    let two = (Some("1".to_string()), Some("2".to_string()));
    let back = wait_for(bound, || dash.counts(&name) == two);
    assert!(
        back,
        "{db:?}: {:?} after a {OUTAGE:?} outage ended, /metrics says {:?} (count_ok, ready)",
        passed.elapsed(),
        dash.counts(&name)
    );
    eprintln!(
        "{db:?}: counts back {:?} after the outage ended",
        passed.elapsed()
    );
    assert_eq!(dash.get("/").0, 200);
}

#[cfg(feature = "postgres")]
#[test]
fn postgres_stops_answering() {
    silent_database(Db::Postgres);
}

#[cfg(feature = "mysql")]
#[test]
fn mysql_stops_answering() {
    silent_database(Db::Mysql);
}
