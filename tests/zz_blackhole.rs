//! A database that stops answering (issue 38): every wait on it is bounded on the client's
//! side. The broker reaches the server through a proxy of ours (`common::blackhole`) that,
//! switched to swallow, keeps every connection open and passes nothing: its kernel still
//! acknowledges what the broker sends and answers keepalive probes, so only a deadline on each
//! round trip ends a wait. Per server and form, with a delivery in hand and the claim workers
//! polling:
//!
//! - the delivery's settlement, a publish and an operator call (`stats`) each fail within
//!   their bounds, and the claim workers report the failure;
//! - lease form: `lease_held()` answers at once throughout (it never waits for a renewal in
//!   progress) and is false by the lease's deadline;
//! - `shutdown(grace)` returns within the grace and a statement timeout, and every thread of
//!   the broker has ended within a round trip timeout after the broker is dropped (none is
//!   left waiting on the silent server);
//! - once the proxy passes bytes again, the same broker publishes, counts and delivers at the
//!   first try: the sessions that went unanswered were discarded, not pooled again.
//!
//! PostgreSQL runs it through TLS (the default `prefer`, the server has it) and in plain text
//! (`sslmode=disable`, a different path to the socket: `src/dialect/postgres/deadline.rs`).
//! Every call that may block runs on a thread of its own under a hard limit, so a hang fails
//! the test instead of hanging it. The cases run one at a time: they count this process's
//! `sqlbroker-*` threads.

mod common;

use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use common::blackhole::BlackHole;
use common::{msg, next, Db};
use sqlbroker::{Broker, Form};

/// The statement timeout of the brokers here (the servers count whole seconds).
const STATEMENT: Duration = Duration::from_secs(1);
/// Their round trip timeout.
const ROUND_TRIP: Duration = Duration::from_secs(2);
/// Their pool's checkout timeout.
const POOL: Duration = Duration::from_secs(2);
/// The lease of the lease form's table (renewed every 2 s).
const LEASE: Duration = Duration::from_secs(4);
/// The grace `shutdown` is given.
const GRACE: Duration = Duration::from_secs(1);
/// Scheduling on a loaded 2-core machine.
const SLACK: Duration = Duration::from_millis(1500);

/// The longest a call may take on a silent server: a round trip, and, where it tries again
/// on a new connection (reads, lease settlements), a checkout, which waits at most the pool's
/// timeout for a connection (the silent sessions are condemned at the first unanswered round
/// trip, so none is pinged in turn), and a second round trip.
const CALL: Duration = Duration::from_secs(2 * 2 + 2);

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn say(what: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{what}");
}

/// Runs `f` on a thread of its own; its value and how long it took, or a failure naming
/// `what` if it has not returned within `limit` (the thread is left behind: the test fails).
fn within<T: Send + 'static>(
    what: &str,
    limit: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> (T, Duration) {
    let (tx, rx) = crossbeam_channel::bounded(1);
    let started = Instant::now();
    std::thread::Builder::new()
        .name(format!("test-{what}"))
        .spawn(move || {
            let v = f();
            let _ = tx.send((v, started.elapsed()));
        })
        .expect("spawn a test thread");
    match rx.recv_timeout(limit) {
        Ok(v) => v,
        Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
            panic!("{what}: no return within {limit:?} (a wait the client does not bound)")
        }
        Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
            panic!("{what}: failed (see its thread's panic above)")
        }
    }
}

/// This process's threads named `sqlbroker-*` (the library's).
fn our_threads() -> Vec<String> {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    tasks
        .filter_map(|e| e.ok())
        .filter_map(|e| std::fs::read_to_string(e.path().join("comm")).ok())
        .map(|c| c.trim().to_string())
        .filter(|c| c.starts_with("sqlbroker"))
        .collect()
}

fn broker(url: &str) -> Broker {
    Broker::builder(url)
        .statement_timeout(STATEMENT)
        .round_trip_timeout(ROUND_TRIP)
        .connection_timeout(POOL)
        .pool_size(6)
        .build()
        .unwrap_or_else(|e| panic!("{url}: {e}"))
}

fn stops_answering(db: Db, form: Form, params: &str) {
    if !common::slow_suite("the black hole suite") {
        return;
    }
    let _serial = serial();
    let Some(live) = common::live(db) else {
        return;
    };
    let case = format!("{db:?} {form:?} {params}");
    let t = live.table(form, LEASE);
    let url = match params {
        "" => live.url.clone(),
        p => common::with_params(&live.url, p),
    };
    let (hole, url) = BlackHole::before(db, &url);
    let threads_before = our_threads();
    let b = broker(&url);
    for k in ["a", "b"] {
        b.publish(&t, msg(k, k)).unwrap();
    }
    let sub = b
        .subscription(&t)
        .workers(2)
        .poll_interval(Duration::from_millis(50))
        .start()
        .unwrap();
    let d = next(&sub, Duration::from_secs(10));
    // Should the test fail, the proxy passes again before the broker is dropped.
    let _pass = hole.passes_on_drop();
    if form == Form::Lease {
        // Swallow just before a renewal round, so that it takes a connection the claim
        // workers used a moment ago (not pinged before reuse) and its statement is what
        // waits on the silent server, with the lease's cell held.
        let claimed = d.lease_deadline().unwrap();
        assert!(
            common::wait_for(LEASE, || d.lease_deadline() > Some(claimed)),
            "{case}: precondition: no renewal came through"
        );
        // Meanwhile a few connections are kept in use, so whichever the round takes was used
        // less than a second ago.
        let until = Instant::now() + LEASE / 2 - Duration::from_millis(300);
        std::thread::scope(|s| {
            for _ in 0..3 {
                s.spawn(|| {
                    while Instant::now() < until {
                        b.stats(&t).unwrap();
                        std::thread::sleep(Duration::from_millis(50));
                    }
                });
            }
        });
    }

    hole.swallow();
    let swallowed = Instant::now();
    say(&format!("{case}: swallowing"));

    // Lease form: `lease_held` answers at once throughout, and is false by the deadline the
    // last renewal that answered wrote (the row is claimable elsewhere from then on).
    let d = if form == Form::Lease {
        let named = case.clone();
        let (d, _) = within("lease_held", LEASE + SLACK, move || {
            let case = named;
            let mut deadline = d.lease_deadline().unwrap();
            loop {
                let asked = Instant::now();
                let held = d.lease_held();
                let took = asked.elapsed();
                assert!(
                    took < Duration::from_millis(100),
                    "{case}: lease_held() took {took:?}: it waited (for a renewal in progress?)"
                );
                let now = SystemTime::now();
                if !held {
                    assert!(
                        now <= deadline + Duration::from_millis(100),
                        "{case}: lease_held() false only {:?} after the deadline",
                        now.duration_since(deadline).unwrap_or_default()
                    );
                    break;
                }
                assert!(
                    now < deadline + Duration::from_millis(100),
                    "{case}: lease_held() still true {:?} after the lease's deadline",
                    now.duration_since(deadline).unwrap_or_default()
                );
                // A renewal answered just before the swallow may land now; none after it.
                deadline = deadline.max(d.lease_deadline().unwrap());
                std::thread::sleep(Duration::from_millis(20));
            }
            d
        });
        say(&format!(
            "{case}: lease_held() false {:?} after the swallow",
            swallowed.elapsed()
        ));
        d
    } else {
        d
    };

    // The delivery's settlement fails within its bound: one round trip where the delivery
    // holds its session (row lock, advisory: the rollback after it does not wait again); a
    // lease's waits for its cell (a renewal in progress) and for a connection too.
    let settles = match form {
        Form::Lease => CALL,
        _ => ROUND_TRIP,
    };
    let (acked, took) = within("ack", settles + SLACK, move || {
        d.ack().map_err(|e| e.to_string())
    });
    say(&format!("{case}: ack: {acked:?} after {took:?}"));
    assert!(
        acked.is_err(),
        "{case}: an ack through a silent server succeeded"
    );

    // The claim workers give up and say so.
    let reported = common::wait_for(ROUND_TRIP + POOL + SLACK, || sub.last_error().is_some());
    assert!(
        reported,
        "{case}: the claim workers reported nothing {:?} after the swallow",
        swallowed.elapsed()
    );
    say(&format!(
        "{case}: the claim workers report: {}",
        sub.last_error().unwrap()
    ));

    // A publish and an operator call fail within their bounds.
    let (p, t2, b2) = (b.clone(), t.clone(), b.clone());
    let (published, took) = within("publish", CALL + SLACK, move || {
        p.publish(&t2, msg("c", "c")).map_err(|e| e.to_string())
    });
    say(&format!("{case}: publish: {published:?} after {took:?}"));
    assert!(
        published.is_err(),
        "{case}: a publish through a silent server succeeded"
    );
    let t3 = t.clone();
    let (stats, took) = within("stats", CALL + SLACK, move || {
        b2.stats(&t3).map_err(|e| e.to_string())
    });
    say(&format!("{case}: stats: {stats:?} after {took:?}"));
    assert!(
        stats.is_err(),
        "{case}: stats through a silent server succeeded"
    );

    // The subscription shuts down within its grace (and a claim's statement timeout).
    let (shut, took) = within("shutdown", GRACE + STATEMENT + SLACK, move || {
        let r = sub.shutdown(GRACE).map_err(|e| e.to_string());
        (r, sub)
    });
    say(&format!("{case}: shutdown: {:?} after {took:?}", shut.0));
    let sub = shut.1;

    // The server answers again: the same broker works at once.
    hole.pass();
    say(&format!(
        "{case}: passing again after {:?}",
        swallowed.elapsed()
    ));
    let (p, t2) = (b.clone(), t.clone());
    let (published, _) = within("publish after", CALL + SLACK, move || {
        p.publish(&t2, msg("d", "d")).map_err(|e| e.to_string())
    });
    assert!(
        published.is_ok(),
        "{case}: the first publish after: {published:?}"
    );
    let (p, t2) = (b.clone(), t.clone());
    let (stats, _) = within("stats after", CALL + SLACK, move || {
        p.stats(&t2).map_err(|e| e.to_string())
    });
    assert!(stats.is_ok(), "{case}: the first stats after: {stats:?}");
    let (p, t2) = (b.clone(), t.clone());
    let (delivered, _) = within("a delivery after", Duration::from_secs(30), move || {
        let sub = p
            .subscription(&t2)
            .poll_interval(Duration::from_millis(50))
            .start()
            .map_err(|e| e.to_string())?;
        // Row `a` may still be leased (lease form): any row will do.
        let d = sub
            .next_delivery_timeout(Duration::from_secs(20))
            .map_err(|e| format!("{e} (last error {:?})", sub.last_error()))?;
        d.ack().map_err(|e| e.to_string())?;
        sub.shutdown(Duration::from_secs(5))
            .map_err(|e| e.to_string())
    });
    assert!(delivered.is_ok(), "{case}: a delivery after: {delivered:?}");

    // No thread of the broker is left waiting on the server.
    within("drop the broker", ROUND_TRIP + SLACK, move || {
        drop((sub, b))
    });
    let ended = common::wait_for(2 * ROUND_TRIP + SLACK, || {
        our_threads().len() <= threads_before.len()
    });
    assert!(
        ended,
        "{case}: threads left: {:?} (before: {threads_before:?})",
        our_threads()
    );
    drop(hole);
}

#[test]
fn postgres_row_lock() {
    stops_answering(Db::Postgres, Form::RowLock, "");
}

#[test]
fn postgres_lease() {
    stops_answering(Db::Postgres, Form::Lease, "");
}

#[test]
fn postgres_advisory() {
    stops_answering(Db::Postgres, Form::AdvisoryLock, "");
}

/// Plain text: the driver hands no TLS connector the socket, ours takes it all the same.
#[test]
fn postgres_lease_plain() {
    stops_answering(Db::Postgres, Form::Lease, "sslmode=disable");
}

#[test]
fn postgres_row_lock_plain() {
    stops_answering(Db::Postgres, Form::RowLock, "sslmode=disable");
}

#[test]
fn mysql_row_lock() {
    stops_answering(Db::Mysql, Form::RowLock, "");
}

#[test]
fn mysql_lease() {
    stops_answering(Db::Mysql, Form::Lease, "");
}

#[test]
fn mysql_advisory() {
    stops_answering(Db::Mysql, Form::AdvisoryLock, "");
}

/// A broker that connects through a silent server fails within its bounds (the TCP connect
/// succeeds: the proxy accepts), rather than waiting in the startup exchange for ever.
fn connecting(db: Db) {
    if !common::slow_suite("the black hole suite") {
        return;
    }
    let _serial = serial();
    let Some(live) = common::live(db) else {
        return;
    };
    let (hole, url) = BlackHole::before(db, &live.url);
    hole.swallow();
    let (built, took) = within("connect", ROUND_TRIP + SLACK, move || {
        Broker::builder(&url)
            .statement_timeout(STATEMENT)
            .round_trip_timeout(ROUND_TRIP)
            .build()
            .map(drop)
    });
    say(&format!("{db:?} connect: {built:?} after {took:?}"));
    let e = built.expect_err("connected through a silent server");
    assert!(e.is_transient(), "{db:?}: {e}");
    assert!(hole.accepted() > 0, "precondition: the proxy was reached");
}

#[test]
fn postgres_connecting() {
    connecting(Db::Postgres);
}

#[test]
fn mysql_connecting() {
    connecting(Db::Mysql);
}

/// A pool of idle sessions on a server that stops answering: the first round trip that goes
/// unanswered condemns the others (opened before it), so a checkout does not ping each of
/// them in turn, a round trip timeout apiece (r2d2 tries the idle ones one after another).
fn idle_sessions(db: Db) {
    if !common::slow_suite("the black hole suite") {
        return;
    }
    let _serial = serial();
    let Some(live) = common::live(db) else {
        return;
    };
    let t = live.table(Form::Lease, LEASE);
    let (hole, url) = BlackHole::before(db, &live.url);
    let b = broker(&url);
    // Five sessions in the pool (each held by a row lock delivery at once, then given back),
    // all idle long enough to be pinged before reuse.
    for (sub, d) in common::hold_pool(&live, &b, 5) {
        d.ack().unwrap();
        sub.shutdown(Duration::from_secs(5)).unwrap();
    }
    let opened = hole.accepted();
    assert!(
        opened >= 5,
        "{db:?}: precondition: {opened} sessions opened"
    );
    std::thread::sleep(Duration::from_millis(1200));
    let _pass = hole.passes_on_drop();
    hole.swallow();
    let (p, t2) = (b.clone(), t.clone());
    let (stats, took) = within("stats", ROUND_TRIP + POOL + SLACK, move || {
        p.stats(&t2).map_err(|e| e.to_string())
    });
    say(&format!(
        "{db:?}: stats with {opened} idle sessions: {stats:?} after {took:?}"
    ));
    assert!(
        stats.is_err(),
        "{db:?}: stats through a silent server succeeded"
    );
    hole.pass();
    let (stats, _) = within("stats after", CALL + SLACK, move || {
        b.stats(&t).map_err(|e| e.to_string())
    });
    assert!(stats.is_ok(), "{db:?}: the first stats after: {stats:?}");
}

#[test]
fn postgres_idle_sessions() {
    idle_sessions(Db::Postgres);
}

#[test]
fn mysql_idle_sessions() {
    idle_sessions(Db::Mysql);
}
