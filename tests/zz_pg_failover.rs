//! PostgreSQL failover: a primary and a streaming standby of the test's own (`pg_basebackup
//! -R`, ports 25421-25424), the broker given both hosts with `target_session_attrs=read-write`
//! (the URL form in one run, the key-value form in the other). Publishers and consumers run
//! in every form (lease, row lock, advisory) at once; replication is cut (the walsender
//! stopped) [`CUT`] before the primary is killed (SIGKILL, its backends first) and, [`DETECT`]
//! later, the standby promoted (`pg_ctl promote`).
//!
//! A ledger records each publish (returned or failed), each delivery and each ack, with its
//! time. Asserted, per form:
//!
//! 1. the broker finds the new primary by itself: a publish and an ack succeed within
//!    [`BOUND`] of the promotion (measured times are printed);
//! 2. every row is finished: the consumers drain the table to empty on the new primary;
//! 3. synchronous replication (`synchronous_standby_names = '*'`): nothing published is lost
//!    (every publish that returned is delivered and acked) and nothing acked comes back (no
//!    delivery of a job after an ack of it returned); jobs whose publish or ack failed during
//!    the outage may be delivered (at-least-once);
//! 4. asynchronous replication: only the window is lost: a published job never delivered, or
//!    an acked job delivered again, had its publish or ack return less than [`WINDOW`] before
//!    the kill; and something was lost (else the cut proved nothing);
//! 5. the change feed moved: the broker's listening session is on the new primary, and
//!    another broker's publish wakes an idle subscription (poll interval 60 s) within 5 s.
//!
//! A switchover (ports 25425-25426) leaves the old primary up, read-only
//! (`default_transaction_read_only = on`, reloaded), and then promotes the standby: every
//! pooled session still reaches the old primary, where each write is refused (SQLSTATE 25006).
//! Asserted: publishes and acks resume on the new primary within [`BOUND`] of the promotion,
//! no publish or ack fails with a permanent error, the old primary is left with none of the
//! broker's sessions (the pool's and the change feed's), and every table drains.
//!
//! Skipped (loudly) without the PostgreSQL server binaries, unless
//! `SQLBROKER_REQUIRE_SERVERS=1`.

mod common;
mod pgserver;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sqlbroker::{Broker, Form, Table};

/// The longest the broker may take to publish and ack again after the promotion.
const BOUND: Duration = Duration::from_secs(15);
/// How long after the kill the standby is promoted (a failover manager's detection time).
const DETECT: Duration = Duration::from_secs(1);
/// Asynchronous replication: how far before the kill a publish or ack may have returned and
/// still be lost: the replication lag at the kill, which the test makes [`CUT`] (without the
/// cut it is a few milliseconds here, and nothing was lost in our runs), plus a margin for a
/// loaded machine.
const WINDOW: Duration = Duration::from_millis(1500);
/// How long before the kill the replication stops.
const CUT: Duration = Duration::from_millis(500);
const FORMS: [Form; 3] = [Form::Lease, Form::RowLock, Form::AdvisoryLock];

static SERIAL: Mutex<()> = Mutex::new(());

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ev {
    PubOk,
    PubErr,
    Delivered,
    AckOk,
    AckErr,
}

/// `(form index, job, event, when it returned, when its call began)`. Whether a job was
/// published or acked in the window before the kill is told by when its call began: the
/// thread may record a return that came before the kill only after it (a loaded machine
/// schedules it late).
type Ledger = Arc<Mutex<Vec<(usize, u64, Ev, Instant, Instant)>>>;

fn record(ledger: &Ledger, form: usize, job: u64, ev: Ev, began: Instant) {
    ledger
        .lock()
        .unwrap()
        .push((form, job, ev, Instant::now(), began));
}

fn run(sync: bool, primary_port: u16, standby_port: u16, key_value: bool) {
    if !common::slow_suite("the PostgreSQL failover suite") {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let what = if sync { "synchronous" } else { "asynchronous" };
    let mut s = match pgserver::Scratch::new(&format!("failover-{what}"), false) {
        Ok(s) => s,
        Err(why) => return common::unmet(&why),
    };
    let started = Instant::now();
    let primary = s.primary("primary", primary_port, "");
    let standby = s.standby(&primary, "standby", standby_port);
    if sync {
        // Set after the base backup: the standby, once promoted, has no standby to wait for.
        s.psql(&primary, "ALTER SYSTEM SET synchronous_standby_names = '*'");
        s.psql(&primary, "SELECT pg_reload_conf()");
    }
    let expected = if sync { "sync" } else { "async" };
    assert!(
        common::wait_for(Duration::from_secs(30), || s
            .psql(&primary, "SELECT sync_state FROM pg_stat_replication")
            == expected),
        "{what}: the standby never streamed as {expected}"
    );
    let url = if key_value {
        format!(
            "host=127.0.0.1,127.0.0.1 port={primary_port},{standby_port} user=postgres \
             dbname=postgres sslmode=disable target_session_attrs=read-write"
        )
    } else {
        format!(
            "postgres://postgres@127.0.0.1:{primary_port},127.0.0.1:{standby_port}/postgres\
             ?sslmode=disable&target_session_attrs=read-write"
        )
    };
    let broker = Broker::builder(&url)
        .statement_timeout(Duration::from_secs(5))
        .connection_timeout(Duration::from_secs(30))
        .build()
        .unwrap_or_else(|e| panic!("{what}: connect to {url}: {e}"));
    let tables: Vec<Table> = FORMS
        .iter()
        .map(|f| {
            let t = common::describe(&common::unique("fo"), *f, Duration::from_secs(5));
            broker.create_table(&t).unwrap();
            t
        })
        .collect();

    let ledger: Ledger = Arc::default();
    let publishing = Arc::new(AtomicBool::new(true));
    let consuming = Arc::new(AtomicBool::new(true));
    let holding = Arc::new(AtomicBool::new(false));
    let mut threads = Vec::new();
    let mut subs = Vec::new();
    for (i, t) in tables.iter().enumerate() {
        let (b, t2, l, on) = (
            broker.clone(),
            t.clone(),
            ledger.clone(),
            publishing.clone(),
        );
        threads.push(std::thread::spawn(move || {
            let mut n = 0u64;
            while on.load(Ordering::Relaxed) {
                n += 1;
                let m = common::msg(&n.to_string(), &format!("k{}", n % 7));
                let began = Instant::now();
                let ev = match b.publish(&t2, m) {
                    Ok(_) => Ev::PubOk,
                    Err(_) => Ev::PubErr,
                };
                record(&l, i, n, ev, began);
                std::thread::sleep(Duration::from_millis(5));
            }
        }));
        let sub = Arc::new(broker.subscription(t).workers(2).start().unwrap());
        subs.push(sub.clone());
        for _ in 0..2 {
            let (sub, l, on) = (sub.clone(), ledger.clone(), consuming.clone());
            let hold = holding.clone();
            threads.push(std::thread::spawn(move || {
                while on.load(Ordering::Relaxed) {
                    if hold.load(Ordering::Relaxed) {
                        std::thread::sleep(Duration::from_millis(10));
                        continue;
                    }
                    let Ok(d) = sub.next_delivery_timeout(Duration::from_millis(200)) else {
                        continue;
                    };
                    let n: u64 = std::str::from_utf8(d.payload()).unwrap().parse().unwrap();
                    record(&l, i, n, Ev::Delivered, Instant::now());
                    let began = Instant::now();
                    let ev = match d.ack() {
                        Ok(()) => Ev::AckOk,
                        Err(_) => Ev::AckErr,
                    };
                    record(&l, i, n, ev, began);
                }
            }));
        }
    }

    std::thread::sleep(Duration::from_secs(3));
    // The replication stops [`CUT`] before the kill (the walsender frozen): what the primary
    // commits meanwhile never reaches the standby, as when a network or a standby falls
    // behind. Synchronous commits wait for it (and fail with the kill); asynchronous ones
    // return, and are the window that is lost.
    // The consumers stop meanwhile: what is published in the window stays unacked (else it
    // would be taken and acked within milliseconds, and its loss would be invisible).
    holding.store(true, Ordering::Relaxed);
    let walsender = s.psql(&primary, "SELECT pid FROM pg_stat_replication");
    let frozen = std::process::Command::new("kill")
        .args(["-STOP", &walsender])
        .status()
        .unwrap();
    assert!(
        frozen.success(),
        "{what}: could not stop the walsender {walsender}"
    );
    std::thread::sleep(CUT);
    let killed = Instant::now();
    s.kill9(&primary);
    // The backends die one by one: a commit may return until the last is gone.
    let dead = Instant::now();
    std::thread::sleep(DETECT);
    s.promote(&standby);
    let promoted = Instant::now();
    holding.store(false, Ordering::Relaxed);
    std::thread::sleep(Duration::from_secs(8));
    publishing.store(false, Ordering::Relaxed);

    // Drain: every table empty on the new primary (rows whose publish failed but committed
    // are finished too).
    let mut direct = postgres::Client::connect(&standby.url(), postgres::NoTls).unwrap();
    let drained = common::wait_for(Duration::from_secs(60), || {
        tables.iter().all(|t| {
            direct
                .query_one(&format!("SELECT count(*) FROM {}", t.name()), &[])
                .is_ok_and(|r| r.get::<_, i64>(0) == 0)
        })
    });
    consuming.store(false, Ordering::Relaxed);
    for th in threads {
        th.join().unwrap();
    }
    for sub in &subs {
        assert!(!sub.is_closed(), "{what}: a subscription closed itself");
        sub.close();
    }
    assert!(drained, "{what}: rows left on the new primary after 60 s");

    let ledger = ledger.lock().unwrap().clone();
    for (i, form) in FORMS.iter().enumerate() {
        let evs: Vec<_> = ledger.iter().filter(|e| e.0 == i).collect();
        let after = |ev: Ev| {
            evs.iter()
                .filter(|e| e.2 == ev && e.3 > promoted)
                .map(|e| e.3 - promoted)
                .min()
        };
        let (publish, ack) = (after(Ev::PubOk), after(Ev::AckOk));
        eprintln!(
            "{what}, {form:?}: first publish {publish:?} and first ack {ack:?} after the \
             promotion ({:?} after the kill)",
            promoted - killed
        );
        for (name, took) in [("publish", publish), ("ack", ack)] {
            let took =
                took.unwrap_or_else(|| panic!("{what}, {form:?}: no {name} after the failover"));
            assert!(
                took <= BOUND,
                "{what}, {form:?}: the first {name} took {took:?}"
            );
        }
        let published: BTreeMap<u64, Instant> = evs
            .iter()
            .filter(|e| e.2 == Ev::PubOk)
            .map(|e| (e.1, e.4))
            .collect();
        let acked: BTreeSet<u64> = evs
            .iter()
            .filter(|e| e.2 == Ev::AckOk)
            .map(|e| e.1)
            .collect();
        assert!(
            evs.iter().any(|e| e.2 == Ev::AckOk && e.3 < killed),
            "{what}, {form:?}: nothing was acked before the kill: the test proved nothing"
        );
        let lost: Vec<(u64, Instant)> = published
            .iter()
            .filter(|(n, _)| !acked.contains(n))
            .map(|(n, at)| (*n, *at))
            .collect();
        // A delivery after an ack of the same job returned.
        let mut came_back = Vec::new();
        let mut last_ack: BTreeMap<u64, Instant> = BTreeMap::new();
        for e in &evs {
            match e.2 {
                Ev::AckOk => {
                    last_ack.insert(e.1, e.4);
                }
                Ev::Delivered => {
                    if let Some(at) = last_ack.get(&e.1) {
                        came_back.push((e.1, *at));
                    }
                }
                _ => {}
            }
        }
        let failed = evs
            .iter()
            .filter(|e| matches!(e.2, Ev::PubErr | Ev::AckErr))
            .count();
        eprintln!(
            "{what}, {form:?}: {} published, {} acked, {failed} publishes or acks failed in \
             the outage, {} lost, {} acked jobs delivered again",
            published.len(),
            acked.len(),
            lost.len(),
            came_back.len()
        );
        if sync {
            let ids = |v: &[(u64, Instant)]| v.iter().take(5).map(|j| j.0).collect::<Vec<_>>();
            assert!(
                lost.is_empty(),
                "{what}, {form:?}: {} published and lost (first: {:?})",
                lost.len(),
                ids(&lost)
            );
            assert!(
                came_back.is_empty(),
                "{what}, {form:?}: {} acked, then delivered again (first: {:?})",
                came_back.len(),
                ids(&came_back)
            );
        } else {
            assert!(
                !lost.is_empty() || !came_back.is_empty(),
                "{what}, {form:?}: nothing in the window was lost: the cut did not cut"
            );
            for (n, at) in lost.iter().chain(&came_back) {
                assert!(
                    *at < dead && killed.saturating_duration_since(*at) < WINDOW,
                    "{what}, {form:?}: job {n} lost, its call began {:?} before the kill \
                     (window {WINDOW:?}; the kill took {:?})",
                    killed.saturating_duration_since(*at),
                    dead - killed
                );
            }
        }
    }

    // 5: the change feed of the broker that lived through the failover listens on the new
    // primary (its session is named `sqlbroker-listen`; a feed that did not come back would
    // leave the workers polling quickly, which a wake-up alone does not tell apart).
    let listening = |c: &mut postgres::Client| {
        c.query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'sqlbroker-listen'",
            &[],
        )
        .map(|r| r.get::<_, i64>(0))
        .unwrap_or(0)
    };
    assert!(
        common::wait_for(BOUND, || listening(&mut direct) == 1),
        "{what}: the change feed is not listening on the new primary"
    );
    let t = common::describe(&common::unique("fo"), Form::Lease, Duration::from_secs(5));
    broker.create_table(&t).unwrap();
    let sub = broker
        .subscription(&t)
        .poll_interval(Duration::from_secs(60))
        .start()
        .unwrap();
    std::thread::sleep(Duration::from_secs(2));
    let other = Broker::connect(&url).unwrap();
    let at = Instant::now();
    other.publish(&t, common::msg("w", "k")).unwrap();
    let d = sub
        .next_delivery_timeout(Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("{what}: no wake-up after the failover: {e}"));
    d.ack().unwrap();
    eprintln!(
        "{what}: woken {:?} after another broker's publish; run took {:?}",
        at.elapsed(),
        started.elapsed()
    );
    sub.close();
}

#[test]
fn failover_with_synchronous_replication_loses_nothing() {
    run(true, 25421, 25422, false);
}

#[test]
fn failover_with_asynchronous_replication_loses_only_the_window() {
    run(false, 25423, 25424, true);
}

/// The switchover: the old primary stays up read-only, the standby is promoted.
#[test]
fn switchover_leaving_the_old_primary_read_only() {
    if !common::slow_suite("the PostgreSQL failover suite") {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let what = "switchover";
    let mut s = match pgserver::Scratch::new("switchover", false) {
        Ok(s) => s,
        Err(why) => return common::unmet(&why),
    };
    let (primary_port, standby_port) = (25425, 25426);
    let primary = s.primary("primary", primary_port, "");
    let standby = s.standby(&primary, "standby", standby_port);
    assert!(
        common::wait_for(Duration::from_secs(30), || s
            .psql(&primary, "SELECT count(*) FROM pg_stat_replication")
            == "1"),
        "{what}: the standby never streamed"
    );
    let url = format!(
        "postgres://postgres@127.0.0.1:{primary_port},127.0.0.1:{standby_port}/postgres\
         ?sslmode=disable&target_session_attrs=read-write"
    );
    let broker = Broker::builder(&url)
        .statement_timeout(Duration::from_secs(5))
        .connection_timeout(Duration::from_secs(30))
        .build()
        .unwrap_or_else(|e| panic!("{what}: connect to {url}: {e}"));
    let tables: Vec<Table> = FORMS
        .iter()
        .map(|f| {
            let t = common::describe(&common::unique("so"), *f, Duration::from_secs(5));
            broker.create_table(&t).unwrap();
            t
        })
        .collect();
    let ledger: Ledger = Arc::default();
    // Errors that are neither transient nor a lease lost to the outage.
    let permanent: Arc<Mutex<Vec<String>>> = Arc::default();
    let publishing = Arc::new(AtomicBool::new(true));
    let consuming = Arc::new(AtomicBool::new(true));
    let mut threads = Vec::new();
    let mut subs = Vec::new();
    let permanent_of = |e: &sqlbroker::BrokerError| !e.is_transient() && !e.is_lease_lost();
    for (i, t) in tables.iter().enumerate() {
        let (b, t2, l, on, bad) = (
            broker.clone(),
            t.clone(),
            ledger.clone(),
            publishing.clone(),
            permanent.clone(),
        );
        threads.push(std::thread::spawn(move || {
            let mut n = 0u64;
            while on.load(Ordering::Relaxed) {
                n += 1;
                let m = common::msg(&n.to_string(), &format!("k{}", n % 7));
                let began = Instant::now();
                let ev = match b.publish(&t2, m) {
                    Ok(_) => Ev::PubOk,
                    Err(e) => {
                        if permanent_of(&e) {
                            bad.lock().unwrap().push(format!("publish: {e}"));
                        }
                        Ev::PubErr
                    }
                };
                record(&l, i, n, ev, began);
                std::thread::sleep(Duration::from_millis(5));
            }
        }));
        let sub = Arc::new(broker.subscription(t).workers(2).start().unwrap());
        subs.push(sub.clone());
        for _ in 0..2 {
            let (sub, l, on, bad) = (
                sub.clone(),
                ledger.clone(),
                consuming.clone(),
                permanent.clone(),
            );
            threads.push(std::thread::spawn(move || {
                while on.load(Ordering::Relaxed) {
                    let Ok(d) = sub.next_delivery_timeout(Duration::from_millis(200)) else {
                        continue;
                    };
                    let n: u64 = std::str::from_utf8(d.payload()).unwrap().parse().unwrap();
                    record(&l, i, n, Ev::Delivered, Instant::now());
                    let began = Instant::now();
                    let ev = match d.ack() {
                        Ok(()) => Ev::AckOk,
                        Err(e) => {
                            if permanent_of(&e) {
                                bad.lock().unwrap().push(format!("ack: {e}"));
                            }
                            Ev::AckErr
                        }
                    };
                    record(&l, i, n, ev, began);
                }
            }));
        }
    }

    std::thread::sleep(Duration::from_secs(3));
    // The old primary takes no more writes (its sessions' next transactions are read-only)
    // and stays up; once the standby has replayed all it wrote, it is promoted.
    s.psql(
        &primary,
        "ALTER SYSTEM SET default_transaction_read_only = on",
    );
    s.psql(&primary, "SELECT pg_reload_conf()");
    let demoted = Instant::now();
    std::thread::sleep(Duration::from_millis(500));
    let written = s.psql(&primary, "SELECT pg_current_wal_lsn()");
    assert!(
        common::wait_for(Duration::from_secs(30), || s.psql(
            &standby,
            &format!("SELECT pg_last_wal_replay_lsn() >= '{written}'::pg_lsn")
        ) == "t"),
        "{what}: the standby did not catch up"
    );
    s.promote(&standby);
    let promoted = Instant::now();
    std::thread::sleep(Duration::from_secs(8));
    publishing.store(false, Ordering::Relaxed);

    let mut direct = postgres::Client::connect(&standby.url(), postgres::NoTls).unwrap();
    let drained = common::wait_for(Duration::from_secs(60), || {
        tables.iter().all(|t| {
            direct
                .query_one(&format!("SELECT count(*) FROM {}", t.name()), &[])
                .is_ok_and(|r| r.get::<_, i64>(0) == 0)
        })
    });
    consuming.store(false, Ordering::Relaxed);
    for th in threads {
        th.join().unwrap();
    }
    for sub in &subs {
        assert!(!sub.is_closed(), "{what}: a subscription closed itself");
    }
    assert!(drained, "{what}: rows left on the new primary after 60 s");

    let ledger = ledger.lock().unwrap().clone();
    for (i, form) in FORMS.iter().enumerate() {
        let first = |ev: Ev| {
            ledger
                .iter()
                .filter(|e| e.0 == i && e.2 == ev && e.3 > promoted)
                .map(|e| e.3 - promoted)
                .min()
        };
        let failed = ledger
            .iter()
            .filter(|e| e.0 == i && matches!(e.2, Ev::PubErr | Ev::AckErr) && e.3 > demoted)
            .count();
        eprintln!(
            "{what}, {form:?}: first publish {:?} and first ack {:?} after the promotion \
             ({:?} after the old primary turned read-only); {failed} publishes or acks failed",
            first(Ev::PubOk),
            first(Ev::AckOk),
            promoted - demoted
        );
        for (name, ev) in [("publish", Ev::PubOk), ("ack", Ev::AckOk)] {
            let took = first(ev)
                .unwrap_or_else(|| panic!("{what}, {form:?}: no {name} after the switchover"));
            assert!(
                took <= BOUND,
                "{what}, {form:?}: the first {name} took {took:?}"
            );
        }
    }
    let permanent = permanent.lock().unwrap().clone();
    assert!(
        permanent.is_empty(),
        "{what}: {} permanent errors, first: {:?}",
        permanent.len(),
        permanent.first()
    );
    // None of the broker's sessions is left on the old primary: the pool's were discarded
    // (the refusing ones, and with them the idle ones), the change feed moved.
    let on_old = || {
        s.psql(
            &primary,
            "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' \
             AND pid <> pg_backend_pid()",
        )
    };
    assert!(
        common::wait_for(BOUND, || on_old() == "0"),
        "{what}: {} of the broker's sessions still on the old primary",
        on_old()
    );
    for sub in &subs {
        sub.close();
    }
}
