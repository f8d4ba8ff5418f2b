//! Flow control's promises at the edges found by review (issue 41's faster claims), on every
//! database:
//!
//! - A limited lease claim takes the room its own broker's ack opened at once, not a poll
//!   interval later: a claim that chose by the last turn's count (which still held the row
//!   just acked) found the key full and waited for its next poll. Fails (`waited past half a
//!   poll interval`) with the hint trusted where it finds no room.
//! - Fair claims keep the order within a key while two brokers claim side by side, with a
//!   limit of one per key (claims that hand rows back at their turn) and with no limit (claims
//!   of one row at a time: two claims side by side may commit in either order, so a row may
//!   follow the one after it, never more). Fails (`order within a key broken`) with rows read
//!   locked on a limited table (a claim's turn hands back the earlier row another claim's
//!   commit left no room for), with a key's cursor moved past rows handed back, or with a
//!   claim locking more rows of a key than it takes (another claim's cursor passes them).
#![allow(dead_code)]

mod common;
mod review_util;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::takes::{drop_take_log, stood, take_log};
use common::{unique, Db, Live};
use review_util::*;
use sqlbroker::{Broker, Subscription, Table};

fn fair_limited(l: &Live, name: &str, max: u32) -> Table {
    let t = Table::new(unique(name))
        .text_column("k")
        .text_column("u")
        .fair("{k}")
        .concurrency_limit("{k}", max)
        .lease(Duration::from_secs(30));
    l.track(&format!("{}_rates", t.name()));
    l.create(t)
}

/// Waits (a minute at most) until `t` holds no row, then stops the consuming threads and shuts
/// the subscriptions down.
fn drain(
    l: &Live,
    t: &Table,
    stop: &AtomicBool,
    threads: Vec<std::thread::JoinHandle<()>>,
    subs: &[Arc<Subscription>],
) {
    let t0 = Instant::now();
    while l.rows(t) > 0 && t0.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(50));
    }
    stop.store(true, Ordering::Relaxed);
    for th in threads {
        th.join().unwrap();
    }
    for s in subs {
        s.shutdown(Duration::from_secs(5)).unwrap();
    }
}

/// Consumes `sub` on a thread: each delivery held `hold`, counted out, acked; records the order
/// of deliveries per key.
fn consume(
    sub: Arc<Subscription>,
    c: Counter,
    stop: Arc<AtomicBool>,
    hold: Duration,
    seen: Arc<Mutex<Vec<(String, i64)>>>,
    threads: usize,
) -> Vec<std::thread::JoinHandle<()>> {
    (0..threads)
        .map(|_| {
            let sub = sub.clone();
            let c = c.clone();
            let stop = stop.clone();
            let seen = seen.clone();
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    if let Ok(d) = sub.next_delivery_timeout(Duration::from_millis(50)) {
                        let k = d.get("k").map(|v| format!("{v:?}")).unwrap_or_default();
                        seen.lock().unwrap().push((k, d.id()));
                        std::thread::sleep(hold);
                        c.done(d.id());
                        let _ = d.ack();
                    }
                }
            })
        })
        .collect()
}

/// README "Fair claims": "Within a key the order is unchanged: priority, due time, id", with
/// `concurrency_limit("{k}", 1)` (so a key's rows run one at a time, in claim order). Two brokers,
/// two subscriptions each, claim side by side: a claim whose hint said room hands rows back at
/// its turn; the fair cursor moved past them already.
fn fair_limit_one_order(db: Db) {
    let Some(l) = common::live(db) else { return };
    let t = fair_limited(&l, "ffo_lim", 1);
    let c = Counter::default();
    let keys = ["a", "b", "c"];
    for n in 0..40 {
        for k in keys {
            let id = l.broker.publish(&t, message(k, n)).unwrap();
            c.key(id, k);
        }
    }
    let stop = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let brokers: Vec<Broker> = (0..2).map(|_| roomy(&l, 8)).collect();
    let mut subs = Vec::new();
    let mut threads = Vec::new();
    for b in &brokers {
        for _ in 0..2 {
            let s = Arc::new(
                b.subscription(&t)
                    .max_in_flight(4)
                    .poll_interval(Duration::from_millis(20))
                    .events(c.events())
                    .start()
                    .unwrap(),
            );
            threads.extend(consume(
                s.clone(),
                c.clone(),
                stop.clone(),
                Duration::from_millis(3),
                seen.clone(),
                4,
            ));
            subs.push(s);
        }
    }
    let t0 = Instant::now();
    drain(&l, &t, &stop, threads, &subs);
    let left = l.rows(&t);
    // Order of claims per key, from the claim events (commit order).
    let claims = c.0.lock().unwrap().claims.clone();
    let mut per: HashMap<String, Vec<i64>> = HashMap::new();
    for (k, _, id) in &claims {
        per.entry(k.clone()).or_default().push(*id);
    }
    let mut inversions = 0;
    for (k, ids) in &per {
        let inv: Vec<(i64, i64)> = ids
            .windows(2)
            .filter(|w| w[1] < w[0])
            .map(|w| (w[0], w[1]))
            .collect();
        if !inv.is_empty() {
            eprintln!(
                "{db:?} key {k}: {} out of order claims, e.g. {:?}",
                inv.len(),
                &inv[..inv.len().min(5)]
            );
        }
        inversions += inv.len();
        // The most later rows of the key claimed before a row.
        let most_overtaken = ids
            .iter()
            .enumerate()
            .map(|(i, id)| ids[..i].iter().filter(|x| *x > id).count())
            .max()
            .unwrap_or(0);
        eprintln!("{db:?} key {k}: most later rows claimed before one row: {most_overtaken}");
    }
    let most: Vec<(String, i32)> = keys.iter().map(|k| (k.to_string(), c.most(k))).collect();
    eprintln!(
        "{db:?}: {} s, left {left}, claims {}, most per key {most:?}, inversions {inversions}",
        t0.elapsed().as_secs_f32(),
        claims.len()
    );
    assert_eq!(left, 0);
    assert!(
        most.iter().all(|(_, m)| *m <= 1),
        "limit 1 exceeded: {most:?}"
    );
    assert_eq!(inversions, 0, "{db:?}: order within a key broken");
}

/// README "Fair claims": "Within a key the order is unchanged". Fair alone (no limits), one
/// key with 300 rows, two brokers whose subscriptions claim one row at a time: a claim reads a
/// key's first two rows locked (`FOR UPDATE SKIP LOCKED`) and takes one; a claim side by side
/// skips both and takes the third. Measured: rows claimed (committed) after a later row of
/// their key.
fn fair_two_brokers_order(db: Db) {
    two_brokers_order(db, &[("a", 300)], 1, 3);
}

/// As [`fair_two_brokers_order`], with keys of uneven depth and claims of 4 rows (the claim
/// offered every key's share and came back short on the small keys). A row may follow the
/// rows two claims of 4 took side by side, never tens. Fails (MariaDB; PostgreSQL in some
/// runs) with a locked read asking two rows of each key where the claim wants one; a deeper
/// read's overshoot (a few rows, briefly) is below what it sees.
fn fair_uneven_keys_order(db: Db) {
    two_brokers_order(db, &[("a", 200), ("b", 3), ("c", 3), ("d", 120)], 4, 12);
}

/// Two brokers claim `keys` (name, rows) `batch` rows at a time; no row of a key is claimed
/// after more than `bound` later rows of its key.
fn two_brokers_order(db: Db, keys: &[(&str, usize)], batch: usize, bound: usize) {
    let Some(l) = common::live(db) else { return };
    let t = Table::new(unique("ffo_two"))
        .text_column("k")
        .text_column("u")
        .fair("{k}")
        .lease(Duration::from_secs(30));
    l.track(&format!("{}_rates", t.name()));
    let t = l.create(t);
    let log = take_log(&l, t.name());
    let c = Counter::default();
    let mut key_of = HashMap::new();
    let deepest = keys.iter().map(|k| k.1).max().unwrap_or(0);
    for n in 0..deepest {
        for (k, rows) in keys {
            if n < *rows {
                let id = l.broker.publish(&t, message(k, n)).unwrap();
                c.key(id, k);
                key_of.insert(id, *k);
            }
        }
    }
    let stop = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let brokers: Vec<Broker> = (0..2).map(|_| roomy(&l, 4)).collect();
    let mut subs = Vec::new();
    let mut threads = Vec::new();
    for b in &brokers {
        let s = Arc::new(
            b.subscription(&t)
                .max_in_flight(batch)
                .batch_size(batch)
                .poll_interval(Duration::from_millis(20))
                .events(c.events())
                .start()
                .unwrap(),
        );
        threads.extend(consume(
            s.clone(),
            c.clone(),
            stop.clone(),
            Duration::from_millis(0),
            seen.clone(),
            1,
        ));
        subs.push(s);
    }
    let t0 = Instant::now();
    drain(&l, &t, &stop, threads, &subs);
    assert_eq!(l.rows(&t), 0, "{db:?}: rows left");
    // The takes that stood, in the order the database made them (its trigger's clock): a
    // client's record of its claims may be descheduled for tens of ms on a loaded machine.
    let takes = stood(&l, &log);
    drop_take_log(&l, &log);
    for (k, _) in keys {
        let ids: Vec<i64> = takes
            .iter()
            .filter(|x| key_of.get(&x.0) == Some(k))
            .map(|x| x.0)
            .collect();
        let most = ids
            .iter()
            .enumerate()
            .map(|(i, id)| ids[..i].iter().filter(|x| *x > id).count())
            .max()
            .unwrap_or(0);
        eprintln!(
            "{db:?} key {k}: {} s, claims {}, most later rows claimed before one: {most}",
            t0.elapsed().as_secs_f32(),
            ids.len()
        );
        // Two claims side by side (one per broker) update their rows at the same time: a row
        // may follow the rows of the claim beside it, never tens (a cursor past rows another
        // claim held and left: 60-290).
        assert!(most <= bound, "{db:?} key {k}: order within the key broken");
    }
}

/// README "Concurrency limits": a row over a limit "is claimed by the first claim after room
/// opens: at once in the broker whose settlement opened it". `concurrency_limit("{k}", 1)`, 15
/// rows of one key, one subscription polling every 3 s, a handler that acks at once (within
/// the 50 ms the last turn's count is reused). Measured: from each ack to the next claim.
fn limit_room_at_once(db: Db, hold: Duration) {
    limit_room_polled(db, hold, Duration::from_secs(3))
}

fn limit_room_polled(db: Db, hold: Duration, poll: Duration) {
    let Some(l) = common::live(db) else { return };
    let t = Table::new(unique("ffo_room"))
        .text_column("k")
        .text_column("u")
        .concurrency_limit("{k}", 1)
        .lease(Duration::from_secs(30));
    l.track(&format!("{}_rates", t.name()));
    let t = l.create(t);
    for n in 0..15 {
        l.broker.publish(&t, message("a", n)).unwrap();
    }
    let b = roomy(&l, 4);
    let s = b
        .subscription(&t)
        .max_in_flight(4)
        .poll_interval(poll)
        .start()
        .unwrap();
    let mut gaps = Vec::new();
    let mut last_ack: Option<Instant> = None;
    let t0 = Instant::now();
    let mut n = 0;
    while n < 15 && t0.elapsed() < Duration::from_secs(40) {
        let Ok(d) = s.next_delivery_timeout(Duration::from_millis(100)) else {
            continue;
        };
        if let Some(a) = last_ack {
            gaps.push(a.elapsed().as_millis());
        }
        std::thread::sleep(hold);
        d.ack().unwrap();
        last_ack = Some(Instant::now());
        n += 1;
    }
    s.shutdown(Duration::from_secs(5)).unwrap();
    let slow = gaps
        .iter()
        .filter(|g| **g as f64 > poll.as_millis() as f64 * 0.5)
        .count();
    eprintln!("{db:?} hold {hold:?} poll {poll:?}: {n} rows in {:?}; ms from each ack to the next delivery: {gaps:?}", t0.elapsed());
    assert_eq!(
        slow,
        0,
        "{db:?}: {slow} of {} rows waited past half a poll interval after the ack that opened room",
        gaps.len()
    );
}

#[test]
fn fair_limit_one_order_postgres() {
    fair_limit_one_order(Db::Postgres)
}
#[cfg(feature = "mysql")]
#[test]
fn fair_limit_one_order_mysql() {
    fair_limit_one_order(Db::Mysql)
}
#[test]
fn fair_limit_one_order_sqlite() {
    fair_limit_one_order(Db::Sqlite)
}
#[test]
fn fair_two_brokers_order_postgres() {
    fair_two_brokers_order(Db::Postgres)
}
#[cfg(feature = "mysql")]
#[test]
fn fair_two_brokers_order_mysql() {
    fair_two_brokers_order(Db::Mysql)
}
#[test]
fn fair_two_brokers_order_sqlite() {
    fair_two_brokers_order(Db::Sqlite)
}
#[test]
fn fair_uneven_keys_order_postgres() {
    fair_uneven_keys_order(Db::Postgres)
}
#[cfg(feature = "mysql")]
#[test]
fn fair_uneven_keys_order_mysql() {
    fair_uneven_keys_order(Db::Mysql)
}
#[test]
fn fair_uneven_keys_order_sqlite() {
    fair_uneven_keys_order(Db::Sqlite)
}
#[test]
fn limit_room_at_once_postgres() {
    limit_room_at_once(Db::Postgres, Duration::ZERO)
}
#[cfg(feature = "mysql")]
#[test]
fn limit_room_at_once_mysql() {
    limit_room_at_once(Db::Mysql, Duration::ZERO)
}
#[test]
fn limit_room_at_once_sqlite() {
    limit_room_at_once(Db::Sqlite, Duration::ZERO)
}
