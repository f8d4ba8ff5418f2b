//! Chaos, pressure: the library under resource pressure must end every call with a clear error
//! or a bounded wait, never a hang or a dead thread.
//!
//! 1. Pool exhaustion (PostgreSQL, MariaDB): row lock deliveries hold every pooled connection;
//!    a publish fails with `BrokerError::Pool` after the pool's timeout, a lease subscription
//!    delivers nothing and names the pool in `last_error`, and everything recovers once the
//!    deliveries are settled.
//! 2. A handler past its lease (every database): renewal stopped by `shutdown(ZERO)`, the row
//!    is claimed again by another broker, and the late handler's `ack`, `retry` and
//!    `dead_letter` each return `LeaseLost` and change nothing.
//! 3. A server that stops answering: PostgreSQL, the backends serving our broker (found by a
//!    unique `application_name`) are SIGSTOPped; MariaDB, whose sessions are threads of one
//!    process, through the black hole proxy of `common::blackhole`. `shutdown`, `close`, the
//!    drop of a subscription and `next_delivery_timeout` return in bounded time; once the
//!    server answers again no thread of ours is left behind and a fresh subscription works.
//!    A publish made during the pause is printed, not asserted (handed a paused idle
//!    connection it waits for the server at most the round trip timeout, `tests/zz_blackhole.rs`
//!    asserts that); it must return once the server answers again.
//!    The backends are always continued (the proxy always thawed) by a guard's `Drop`, and for
//!    PostgreSQL also by a detached `kill -CONT` a minute later, should this process die.
//!
//! Every call into the library that may block runs on a thread of its own with a hard bound
//! (`bounded`): a hang fails the test instead of hanging CI. The cases run one at a time
//! (`SERIAL`): case 3 counts this process's `sqlbroker-*` threads.

mod common;

use std::collections::BTreeSet;
use std::io::Write;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use common::blackhole::BlackHole;
use common::{msg, Db, Live};
use sqlbroker::{Broker, BrokerError, Delivery, Form, NextError, Subscription, Table};

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn say(msg: &str) {
    // Straight to the process's stderr: the test harness captures `eprintln!`.
    let _ = writeln!(std::io::stderr(), "{msg}");
}

// ---------------------------------------------------------------------------------------------
// Bounded waits

/// A call running on a thread of its own.
struct Pending<T> {
    what: String,
    /// The value and how long the call took, measured on its thread.
    rx: crossbeam_channel::Receiver<(T, Duration)>,
}

/// Runs `f` on a thread of its own.
fn spawn<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> Pending<T> {
    let (tx, rx) = crossbeam_channel::bounded(1);
    let started = Instant::now();
    std::thread::Builder::new()
        .name(format!("test-{what}"))
        .spawn(move || {
            // `f` is consumed by the call: what it captured is dropped before the send.
            let v = f();
            let _ = tx.send((v, started.elapsed()));
        })
        .expect("spawn a test thread");
    Pending {
        what: what.to_string(),
        rx,
    }
}

impl<T> Pending<T> {
    /// The value and how long the call took, or `None` if it has not returned within `limit`
    /// (the thread is left to finish). A panic in the call fails the test.
    fn wait(&self, limit: Duration) -> Option<(T, Duration)> {
        match self.rx.recv_timeout(limit) {
            Ok(v) => Some(v),
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => None,
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
                panic!("{} panicked", self.what)
            }
        }
    }

    /// As `wait`, but a call that does not return within `limit` fails the test.
    fn within(self, limit: Duration) -> (T, Duration) {
        match self.wait(limit) {
            Some(v) => v,
            None => panic!("{} did not return within {limit:?} (a hang)", self.what),
        }
    }
}

/// Runs `f` with a hard bound: the value and how long it took; a hang fails the test.
fn bounded<T: Send + 'static>(
    what: &str,
    limit: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> (T, Duration) {
    spawn(what, f).within(limit)
}

fn publish(broker: &Broker, t: &Table, body: &str, limit: Duration) -> sqlbroker::Result<i64> {
    let (b, t, m) = (broker.clone(), t.clone(), msg(body, body));
    bounded("publish", limit, move || b.publish(&t, m)).0
}

fn start(
    what: &str,
    build: impl FnOnce() -> sqlbroker::Result<Subscription> + Send + 'static,
) -> Arc<Subscription> {
    let (sub, _) = bounded(what, Duration::from_secs(20), build);
    Arc::new(sub.unwrap_or_else(|e| panic!("{what}: {e}")))
}

/// `next_delivery_timeout(wait)`, bounded by `wait` and five seconds more.
fn next_within(sub: &Arc<Subscription>, wait: Duration) -> (Result<Delivery, NextError>, Duration) {
    let s = sub.clone();
    bounded(
        "next_delivery_timeout",
        wait + Duration::from_secs(5),
        move || s.next_delivery_timeout(wait),
    )
}

fn next(sub: &Arc<Subscription>, wait: Duration) -> Delivery {
    match next_within(sub, wait).0 {
        Ok(d) => d,
        Err(e) => panic!(
            "no delivery within {wait:?}: {e} (last error: {:?}, in flight {})",
            sub.last_error(),
            sub.in_flight()
        ),
    }
}

fn settle(
    what: &str,
    d: Delivery,
    f: impl FnOnce(Delivery) -> sqlbroker::Result<()> + Send + 'static,
) -> sqlbroker::Result<()> {
    bounded(what, Duration::from_secs(10), move || f(d)).0
}

/// The subscription itself, once no test thread holds it any more.
fn owned(sub: Arc<Subscription>) -> Subscription {
    Arc::try_unwrap(sub).unwrap_or_else(|_| panic!("a test thread still holds the subscription"))
}

fn shutdown(sub: Arc<Subscription>, grace: Duration) -> (sqlbroker::Result<()>, Duration) {
    let sub = owned(sub);
    bounded("shutdown", grace + Duration::from_secs(40), move || {
        sub.shutdown(grace)
    })
}

/// Threads of this process named by the library (`sqlbroker-claim-..`, `sqlbroker-renew`; the
/// kernel keeps 15 bytes of a name).
fn our_threads() -> usize {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    tasks
        .filter_map(|e| e.ok())
        .filter(|e| {
            std::fs::read_to_string(e.path().join("comm")).is_ok_and(|c| c.starts_with("sqlbroker"))
        })
        .count()
}

// ---------------------------------------------------------------------------------------------
// 1. Pool exhaustion

fn pool_exhaustion(db: Db) {
    if !common::slow_suite("the chaos pressure suite") {
        return;
    }
    let _serial = serial();
    let Some(live) = common::live(db) else {
        return;
    };
    let began = Instant::now();
    let timeout = Duration::from_secs(1);
    let broker = Broker::builder(&live.url)
        .pool_size(3)
        .connection_timeout(timeout)
        .build()
        .unwrap();
    let rows = live.table(Form::RowLock, Duration::ZERO);
    let lease = live.table(Form::Lease, Duration::from_secs(30));
    // A table no subscription reads: the target of the publishes.
    let target = live.table(Form::RowLock, Duration::ZERO);
    // The broker checks a table against its record on first use (one statement): done here,
    // while the pool has connections, so the publishes below meet the exhausted pool itself.
    broker.stats(&target).unwrap();

    // The lease subscription starts while the pool still has connections (its start checks the
    // server on one); its table is empty.
    let lease_sub = {
        let (b, t) = (broker.clone(), lease.clone());
        start("start lease subscription", move || {
            b.subscription(&t)
                .poll_interval(Duration::from_millis(100))
                .start()
        })
    };

    // Three row lock deliveries, one per subscription, each holding a pooled connection.
    let mut held = Vec::new();
    for i in 0..3 {
        publish(&broker, &rows, &format!("r{i}"), Duration::from_secs(10)).unwrap();
        let s = {
            let (b, t) = (broker.clone(), rows.clone());
            start("start row lock subscription", move || {
                b.subscription(&t).max_in_flight(1).start()
            })
        };
        let d = next(&s, Duration::from_secs(10));
        held.push((d, s));
    }

    // A due row in the lease table, written past the pool.
    let insert = match db {
        Db::Postgres => format!(
            "INSERT INTO \"{}\" (payload, run_at, k) VALUES ('\\x6c'::bytea, now() - interval '1 second', 'l')",
            lease.name()
        ),
        _ => format!(
            "INSERT INTO `{}` (payload, run_at, k) VALUES ('l', UTC_TIMESTAMP() - INTERVAL 1 SECOND, 'l')",
            lease.name()
        ),
    };
    live.exec(&insert);

    // Catches: a publish that waits for ever (or the default 30 s) on an exhausted pool, one
    // that fails at once without waiting the pool's timeout, and one that succeeds beyond the
    // pool's size.
    let (published, took) = {
        let (b, t) = (broker.clone(), target.clone());
        bounded(
            "publish on an exhausted pool",
            Duration::from_secs(15),
            move || b.publish(&t, msg("p", "p")),
        )
    };
    match &published {
        Err(BrokerError::Pool { op, timeout: t, .. }) => {
            assert_eq!((*op, *t), ("publish", timeout));
        }
        other => panic!("{db:?}: publish on an exhausted pool returned {other:?} after {took:?}"),
    }
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_millis(2500),
        "{db:?}: publish on an exhausted pool failed after {took:?}, not about its 1 s timeout"
    );
    // Catches: a failed publish that wrote its row anyway.
    assert_eq!(
        live.rows(&target),
        0,
        "{db:?}: the failed publish wrote a row"
    );

    // Catches: a claim beyond the pool's size (the row would be delivered).
    let (got, _) = next_within(&lease_sub, Duration::from_millis(2500));
    assert!(
        matches!(got, Err(NextError::Timeout)),
        "{db:?}: the lease subscription delivered with the pool exhausted: {got:?}"
    );
    // Catches: a claim worker that fails silently (or hangs) instead of reporting the pool.
    let named = common::wait_for(Duration::from_secs(5), || {
        lease_sub
            .last_error()
            .is_some_and(|e| e.to_string().contains("no database connection for claim"))
    });
    assert!(
        named,
        "{db:?}: last_error does not name the pool: {:?}",
        lease_sub.last_error()
    );
    say(&format!(
        "pressure {db:?} pool: publish failed after {took:?} ({}); lease subscription: {}",
        published.unwrap_err(),
        lease_sub
            .last_error()
            .map(|e| e.to_string())
            .unwrap_or_default()
    ));

    // The deliveries are settled on the connections they hold: no pool needed. Catches a
    // settlement that waits for a pooled connection.
    let mut row_subs = Vec::new();
    for (d, s) in held {
        settle("ack of a row lock delivery", d, Delivery::ack).unwrap();
        row_subs.push(s);
    }

    // Everything recovers within a bounded wait. Catches a pool left poisoned or short of
    // connections by the exhaustion, and a claim worker that died of it.
    publish(&broker, &target, "after", Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("{db:?}: publish after the pool recovered: {e}"));
    assert_eq!(live.rows(&target), 1);
    let d = next(&lease_sub, Duration::from_secs(10));
    assert_eq!((common::key_of(&d).as_str(), d.attempt()), ("l", 1));
    settle("ack of the lease delivery", d, Delivery::ack).unwrap();
    // Catches an error that outlives the trouble it reported.
    let stale = lease_sub.last_error();
    assert!(stale.is_none(), "{db:?}: stale last_error {stale:?}");
    assert_eq!(live.rows(&lease), 0);

    let (r, _) = shutdown(lease_sub, Duration::from_secs(5));
    r.unwrap();
    for s in row_subs {
        let (r, _) = shutdown(s, Duration::from_secs(5));
        r.unwrap();
    }
    say(&format!(
        "pressure {db:?} pool exhaustion: {:?}",
        began.elapsed()
    ));
}

#[test]
fn pool_exhaustion_postgres() {
    pool_exhaustion(Db::Postgres);
}

#[cfg(feature = "mysql")]
#[test]
fn pool_exhaustion_mysql() {
    pool_exhaustion(Db::Mysql);
}

// ---------------------------------------------------------------------------------------------
// 2. A handler past its lease

/// The row `id` still belongs to the new holder: attempt 2 counted, leased, not dead.
fn held_by_new_claim(live: &Live, t: &Table, id: i64) -> bool {
    live.rows_where(
        t,
        &format!("id = {id} AND attempts = 2 AND locked_until IS NOT NULL AND dead_at IS NULL"),
    ) == 1
}

fn lease_overrun(db: Db) {
    if !common::slow_suite("the chaos pressure suite") {
        return;
    }
    let _serial = serial();
    let Some(live) = common::live(db) else {
        return;
    };
    let began = Instant::now();
    let t = live.table(Form::Lease, Duration::from_secs(1));
    let mut ids = BTreeSet::new();
    for i in 0..3 {
        ids.insert(publish(&live.broker, &t, &format!("m{i}"), Duration::from_secs(10)).unwrap());
    }
    let first = {
        let (b, t) = (live.broker.clone(), t.clone());
        start("start the first subscription", move || {
            b.subscription(&t).start()
        })
    };
    let mut late = Vec::new();
    for _ in 0..3 {
        let d = next(&first, Duration::from_secs(10));
        assert_eq!(d.attempt(), 1);
        late.push(d);
    }
    // Catches a shutdown that reports success with deliveries unsettled (or waits for them).
    let (r, took) = shutdown(first, Duration::ZERO);
    match r {
        Err(BrokerError::Unsettled { unsettled: 3, .. }) => {}
        other => panic!("{db:?}: shutdown(0) with three deliveries held returned {other:?}"),
    }
    assert!(
        took < Duration::from_secs(3),
        "{db:?}: shutdown(0) took {took:?}"
    );

    // Another broker, as another process would be, gets the rows once their leases expire.
    let other = live.connect();
    let second = {
        let (b, t) = (other.clone(), t.clone());
        start("start the second subscription", move || {
            b.subscription(&t).start()
        })
    };
    let mut fresh = Vec::new();
    for _ in 0..3 {
        // Catches leases still renewed after the shutdown (nothing would come).
        let d = next(&second, Duration::from_secs(10));
        assert_eq!(d.attempt(), 2, "{db:?}: row {} came back", d.id());
        fresh.push(d);
    }
    let got: BTreeSet<i64> = fresh.iter().map(Delivery::id).collect();
    assert_eq!(got, ids);
    late.sort_by_key(Delivery::id);

    // Each late settlement finds the new claim's token: `LeaseLost`, and the row unchanged
    // (catches an unfenced ack that deletes it, a retry that clears the new lease, a dead
    // letter that buries a row in work).
    let mut late = late.into_iter();
    type Settle = fn(Delivery) -> sqlbroker::Result<()>;
    let settlements: [(&str, Settle); 3] = [
        ("ack", Delivery::ack),
        ("retry", Delivery::retry),
        ("dead_letter", |d| d.dead_letter("late")),
    ];
    for (what, how) in settlements {
        let d = late.next().unwrap();
        let id = d.id();
        match settle(what, d, how) {
            Err(BrokerError::LeaseLost { id: lost, .. }) if lost == id => {}
            other => panic!("{db:?}: late {what} of row {id} returned {other:?}"),
        }
        assert!(
            held_by_new_claim(&live, &t, id),
            "{db:?}: the late {what} changed row {id}"
        );
    }
    let dead = {
        let (b, t) = (live.broker.clone(), t.clone());
        bounded("dead_letters", Duration::from_secs(10), move || {
            b.dead_letters(&t, 10)
        })
        .0
        .unwrap()
    };
    assert!(dead.is_empty(), "{db:?}: dead letters: {dead:?}");

    // The new holder settles fine (catches a late settlement that disturbed its token).
    for d in fresh {
        settle("ack by the new holder", d, Delivery::ack).unwrap();
    }
    assert_eq!(live.rows(&t), 0);
    let (r, _) = shutdown(second, Duration::from_secs(5));
    r.unwrap();
    say(&format!(
        "pressure {db:?} lease overrun: {:?}",
        began.elapsed()
    ));
}

#[test]
fn lease_overrun_sqlite() {
    lease_overrun(Db::Sqlite);
}

#[test]
fn lease_overrun_postgres() {
    lease_overrun(Db::Postgres);
}

#[cfg(feature = "mysql")]
#[test]
fn lease_overrun_mysql() {
    lease_overrun(Db::Mysql);
}

// ---------------------------------------------------------------------------------------------
// 3. A server that stops answering

/// What stops the server answering our broker, and starts it again. Dropping it always
/// resumes.
trait Pause {
    /// Stops answering every connection of the broker known now; called again to catch
    /// connections opened since.
    fn pause(&mut self);
    fn resume(&mut self);
}

/// PostgreSQL: the backends serving one `application_name`, SIGSTOPped.
struct StoppedBackends {
    live_url: String,
    app: String,
    stopped: BTreeSet<i32>,
}

impl StoppedBackends {
    fn signal(pid: i32, sig: libc::c_int) -> bool {
        // SAFETY: kill(2) with a pid we read from pg_stat_activity; no memory is involved.
        unsafe { libc::kill(pid, sig) == 0 }
    }
}

impl Pause for StoppedBackends {
    fn pause(&mut self) {
        let pids = common::ints(
            Db::Postgres,
            &self.live_url,
            &format!(
                "SELECT pid FROM pg_stat_activity WHERE application_name = '{}'",
                self.app
            ),
        );
        let fresh: Vec<i32> = pids
            .into_iter()
            .flatten()
            .map(|p| p as i32)
            .filter(|p| !self.stopped.contains(p))
            .collect();
        if fresh.is_empty() {
            return;
        }
        // Should this process die before its guard runs, the backends are continued anyway.
        let list: Vec<String> = fresh.iter().map(i32::to_string).collect();
        let _ = std::process::Command::new("sh")
            .args(["-c", &format!("sleep 60; kill -CONT {}", list.join(" "))])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn();
        for pid in fresh {
            self.stopped.insert(pid);
            assert!(
                Self::signal(pid, libc::SIGSTOP),
                "kill -STOP {pid}: {}",
                std::io::Error::last_os_error()
            );
        }
    }

    fn resume(&mut self) {
        for pid in std::mem::take(&mut self.stopped) {
            Self::signal(pid, libc::SIGCONT);
        }
    }
}

impl Drop for StoppedBackends {
    fn drop(&mut self) {
        self.resume();
    }
}

/// MariaDB: a TCP proxy of ours between the broker and the server that, swallowing, passes
/// no bytes either way (the connections stay open: a server that stopped answering).
impl Pause for BlackHole {
    fn pause(&mut self) {
        self.swallow();
    }

    fn resume(&mut self) {
        self.pass();
    }
}

type Shared = Arc<Mutex<Box<dyn Pause + Send>>>;

fn lock(p: &Shared) -> MutexGuard<'_, Box<dyn Pause + Send>> {
    p.lock().unwrap_or_else(|e| e.into_inner())
}

/// Resumes when dropped.
struct Resume(Shared);

impl Drop for Resume {
    fn drop(&mut self) {
        lock(&self.0).resume();
    }
}

fn with_param(url: &str, param: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{param}")
}

/// True if the subscription's claim worker stays inside one claim throughout a quarter second:
/// a claim that does not end (a claim takes milliseconds; an idle worker is in none).
fn stuck(sub: &Subscription) -> bool {
    (0..6).all(|_| {
        std::thread::sleep(Duration::from_millis(50));
        sub.claiming() > 0
    })
}

const STATEMENT_TIMEOUT: Duration = Duration::from_secs(2);
const GRACE: Duration = Duration::from_secs(1);
/// Scheduling slack on a loaded machine.
const MARGIN: Duration = Duration::from_secs(2);

fn paused_server(db: Db) {
    if !common::slow_suite("the chaos pressure suite") {
        return;
    }
    let _serial = serial();
    let Some(live) = common::live(db) else {
        return;
    };
    let began = Instant::now();
    let threads_before = our_threads();
    let app = common::unique("pause");
    let (url, pause): (String, Box<dyn Pause + Send>) = match db {
        Db::Postgres => (
            with_param(&live.url, &format!("application_name={app}")),
            Box::new(StoppedBackends {
                live_url: live.url.clone(),
                app: app.clone(),
                stopped: BTreeSet::new(),
            }),
        ),
        _ => {
            let (hole, url) = BlackHole::before(db, &live.url);
            (url, Box::new(hole))
        }
    };
    let pause = Arc::new(Mutex::new(pause));
    let broker = Broker::builder(&url)
        .statement_timeout(STATEMENT_TIMEOUT)
        .pool_size(8)
        .build()
        .unwrap();
    // A table per subscription: a broker reads a table's pause flag on one worker while its
    // other workers wait for that read, so each subscription's worker is stuck in its own
    // statement (a claim, or its table's pause read).
    let tables: Vec<_> = (0..3)
        .map(|_| live.table(Form::Lease, Duration::from_secs(30)))
        .collect();
    let t = tables[0].clone();
    // Publishes at once, so the pool holds idle connections beside those the claim workers
    // take: paused too, they are what a publish during the pause may be handed.
    let spare = live.table(Form::RowLock, Duration::ZERO);
    let fill: Vec<_> = (0..6)
        .map(|i| {
            let (b, t) = (broker.clone(), spare.clone());
            spawn("fill the pool", move || {
                b.publish(&t, msg(&format!("f{i}"), "f"))
            })
        })
        .collect();
    for p in fill {
        p.within(Duration::from_secs(20)).0.unwrap();
    }
    let subs: Vec<Arc<Subscription>> = tables
        .iter()
        .map(|t| {
            let (b, t) = (broker.clone(), t.clone());
            start("start a subscription", move || {
                b.subscription(&t)
                    .poll_interval(Duration::from_millis(50))
                    .start()
            })
        })
        .collect();
    // Declared after everything that may block while the server is paused, so dropped (the
    // server answering again) before any of it, should the test fail.
    let _resume = Resume(pause.clone());
    std::thread::sleep(Duration::from_millis(300));

    // Pause until every subscription's claim worker is stuck in a claim (PostgreSQL: a worker
    // that found no stopped connection idle opened a new one, stopped on the next round).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        lock(&pause).pause();
        if subs.iter().all(|s| stuck(s)) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{db:?}: precondition: the claim workers did not get stuck (claiming: {:?})",
            subs.iter().map(|s| s.claiming()).collect::<Vec<_>>()
        );
    }
    let paused_at = Instant::now();
    // Findings, reported together at the end: one does not hide the next.
    let mut failed: Vec<String> = Vec::new();
    let mut check = |ok: bool, what: String| {
        if !ok {
            say(&format!("pressure {db:?} paused: FAILED: {what}"));
            failed.push(what);
        }
    };

    // Catches a `next_delivery_timeout` that waits on the stuck claim instead of its timeout.
    let (got, took) = next_within(&subs[0], Duration::from_millis(500));
    check(
        matches!(got, Err(NextError::Timeout))
            && took >= Duration::from_millis(450)
            && took < Duration::from_millis(1500),
        format!("next_delivery_timeout(500 ms) returned {got:?} after {took:?}"),
    );

    // Not asserted: a publish may need a connection whose backend is stopped.
    let pending_publish = {
        let (b, t) = (broker.clone(), t.clone());
        spawn("publish while paused", move || b.publish(&t, msg("p", "p")))
    };

    // shutdown, close and drop, at once, each on a subscription whose worker is stuck.
    let mut subs = subs.into_iter();
    let a = owned(subs.next().unwrap());
    let b = subs.next().unwrap();
    let c = owned(subs.next().unwrap());
    let shut = spawn("shutdown", move || a.shutdown(GRACE));
    let closed = {
        let b = b.clone();
        spawn("close", move || b.close())
    };
    let dropped = spawn("drop", move || drop(c));
    let hard = Duration::from_secs(40);
    let (shut, shut_took) = shut.within(hard);
    let ((), close_took) = closed.within(hard);
    let ((), drop_took) = dropped.within(hard);
    let publish_while_paused = pending_publish.wait(Duration::ZERO);
    say(&format!(
        "pressure {db:?} paused: shutdown({GRACE:?}) -> {shut:?} in {shut_took:?}; close in \
         {close_took:?}; drop in {drop_took:?}; publish while paused: {}",
        match &publish_while_paused {
            Some((r, t)) => format!("{r:?} in {t:?}"),
            None => format!("still blocked after {:?}", paused_at.elapsed()),
        }
    ));
    // Catches a shutdown that waits for the stuck claim beyond its documented bound (grace +
    // the statement timeout), e.g. for ever or twice over.
    check(
        shut_took < GRACE + STATEMENT_TIMEOUT + MARGIN,
        format!("shutdown({GRACE:?}) took {shut_took:?} with a claim stuck (documented: within grace + statement timeout {STATEMENT_TIMEOUT:?})"),
    );
    // Catches a shutdown that reports the stuck claim's reserved slots as unsettled
    // deliveries: no delivery was ever handed out.
    check(
        shut.is_ok(),
        format!("shutdown with no delivery handed out returned {shut:?}"),
    );
    // Catches a close (or drop) that joins the stuck worker without bound; documented: the
    // statement timeout and a second.
    let join_bound = STATEMENT_TIMEOUT + Duration::from_secs(1) + MARGIN;
    check(
        close_took < join_bound,
        format!("close took {close_took:?}"),
    );
    check(drop_took < join_bound, format!("drop took {drop_took:?}"));
    let (got, _) = next_within(&b, Duration::from_millis(100));
    check(
        matches!(got, Err(NextError::Closed)),
        format!("next_delivery_timeout after close returned {got:?}"),
    );

    lock(&pause).resume();
    let resumed = Instant::now();

    // Catches a publish left blocked for ever on a connection that answers again.
    let publish_while_paused = publish_while_paused
        .or_else(|| pending_publish.wait(Duration::from_secs(20)))
        .map(|(r, t)| (r.map(|_| ()), t));
    check(
        publish_while_paused.is_some(),
        "the publish made while paused did not return 20 s after the server answered again".into(),
    );
    if let Some((r, t)) = &publish_while_paused {
        say(&format!(
            "pressure {db:?} paused: the publish made while paused returned {r:?} after {t:?} \
             ({:?} after resume)",
            resumed.elapsed()
        ));
    }

    // Catches a claim worker left blocked (or spinning) after the server answers again.
    let b = owned(b);
    bounded(
        "drop a closed subscription",
        Duration::from_secs(20),
        move || drop(b),
    );
    // The broker's own threads live on: its lease timer and the thread its rounds run on
    // (`sqlbroker-renew-round`), and on PostgreSQL its change feed (`sqlbroker-listen`) and
    // the thread that sends its publishes' notifications (`sqlbroker-notify`). All of them
    // end with the broker (checked below).
    let broker_threads = if db == Db::Postgres { 4 } else { 2 };
    let gone = common::wait_for(Duration::from_secs(20), || {
        our_threads() <= threads_before + broker_threads
    });
    check(
        gone,
        format!(
            "{} sqlbroker threads 20 s after the server answered again (before: {threads_before})",
            our_threads()
        ),
    );

    // Catches a broker left unusable (a pool full of connections that never answer again).
    publish(&broker, &t, "after", Duration::from_secs(20))
        .unwrap_or_else(|e| panic!("{db:?}: publish after the pause: {e}"));
    let fresh = {
        let (b, t) = (broker.clone(), t.clone());
        start("start a fresh subscription", move || {
            b.subscription(&t).start()
        })
    };
    let d = next(&fresh, Duration::from_secs(15));
    settle("ack after the pause", d, Delivery::ack).unwrap();
    let (r, _) = shutdown(fresh, Duration::from_secs(5));
    r.unwrap();
    let _ = bounded("drop the broker", Duration::from_secs(20), move || {
        drop(broker)
    });
    // Catches a lease timer thread that outlives its broker.
    let gone = common::wait_for(Duration::from_secs(10), || our_threads() <= threads_before);
    check(
        gone,
        format!(
            "{} sqlbroker threads after the broker was dropped (before: {threads_before})",
            our_threads()
        ),
    );
    say(&format!(
        "pressure {db:?} paused server: {:?} ({:?} paused)",
        began.elapsed(),
        resumed - paused_at
    ));
    assert!(failed.is_empty(), "{db:?}, server paused: {failed:#?}");
}

#[test]
fn paused_server_postgres() {
    paused_server(Db::Postgres);
}

#[cfg(feature = "mysql")]
#[test]
fn paused_server_mysql() {
    paused_server(Db::Mysql);
}
