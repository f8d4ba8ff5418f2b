//! The database's elected maintainer (`BrokerBuilder::maintenance`): one broker of those that
//! run for it holds the lease; a dropped one gives it up at once, a killed one is replaced once
//! its lease runs out, each election in a higher term; and the maintainer deletes, by itself,
//! the completed rows and dead letters past their tables' retention and the action log's old
//! entries, and nothing younger.
//!
//! The lease row is one per database: the cases run one after another (a static mutex), and
//! each first expires the lease by hand, as an operator may (a lease a test process before
//! this one left behind would otherwise hold for its length).

mod common;

use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::{next, Db, Live};
use sqlbroker::{Broker, Form, Message, Table};

static SERIAL: Mutex<()> = Mutex::new(());

const CHILD_ENV: &str = "SQLBROKER_MAINTAINER_CHILD";
const LEASE: Duration = Duration::from_secs(3);

fn maintaining(url: &str) -> Broker {
    Broker::builder(url)
        .maintainer_lease(LEASE)
        .maintenance_every(Duration::from_secs(1))
        .build()
        .unwrap()
}

/// Expires the lease by hand, once its table is there (made by `b`'s first round).
fn expire_by_hand(live: &Live) {
    let made = common::wait_for(Duration::from_secs(10), || {
        live.ints(&match live.db {
            Db::Sqlite => {
                "SELECT COUNT(*) FROM sqlite_master WHERE name = 'sqlbroker_maintainer'".to_string()
            }
            // This database's (another schema's or database's is not the one the URL reads).
            Db::Postgres => "SELECT COUNT(*) FROM information_schema.tables \
                  WHERE table_name = 'sqlbroker_maintainer' AND table_schema = current_schema()"
                .to_string(),
            Db::Mysql => "SELECT COUNT(*) FROM information_schema.tables \
                  WHERE table_name = 'sqlbroker_maintainer' AND table_schema = DATABASE()"
                .to_string(),
        })[0]
            == Some(1)
    });
    assert!(made, "no broker made sqlbroker_maintainer");
    live.exec(match live.db {
        Db::Postgres => "UPDATE sqlbroker_maintainer SET expires_at = '1970-01-01 00:00:01+00'",
        Db::Mysql => "UPDATE sqlbroker_maintainer SET expires_at = '1970-01-01 00:00:01'",
        Db::Sqlite => "UPDATE sqlbroker_maintainer SET expires_at = 1",
    });
}

/// The child: a broker that runs for the maintainer, prints `MAINTAINER <term>` once elected,
/// and holds on until it is killed.
#[test]
fn maintainer_child() {
    let Ok(url) = std::env::var(CHILD_ENV) else {
        return;
    };
    let b = maintaining(&url);
    assert!(common::wait_for(Duration::from_secs(30), || b.is_maintainer()));
    let term = b.maintainer().unwrap().unwrap().term();
    println!("\nMAINTAINER {term}");
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
    std::process::exit(3);
}

/// One broker of two is elected (and stays the one, the other never maintaining at once);
/// dropped, the other takes over within a third of a lease, in a higher term; a maintainer in
/// another process killed by SIGKILL is replaced once its lease has run out, and not before.
///
/// Fails (`both maintain`, `not replaced`, `the term did not grow`) with a take that does not
/// check the lease has expired, a dropped broker that keeps the lease, or a term not counted.
fn one_maintainer_elected_and_replaced(db: Db) {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(live) = common::live(db) else { return };
    let a = maintaining(&live.url);
    expire_by_hand(&live);
    let b = maintaining(&live.url);
    // `a` may have held the lease expired by hand: it learns at its next renewal.
    std::thread::sleep(LEASE / 3 + Duration::from_millis(500));
    assert!(
        common::wait_for(Duration::from_secs(10), || a.is_maintainer()
            ^ b.is_maintainer()),
        "no maintainer elected"
    );
    // It stays one: over two rounds of renewals, never both.
    let until = Instant::now() + LEASE;
    while Instant::now() < until {
        assert!(!(a.is_maintainer() && b.is_maintainer()), "both maintain");
        std::thread::sleep(Duration::from_millis(20));
    }
    let first = live.broker.maintainer().unwrap().expect("a maintainer");
    assert_eq!(first.pid(), u64::from(std::process::id()));
    // The operator's view from the command line.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sqlbroker"))
        .arg("maintainer")
        .env("DATABASE_URL", &live.url)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.starts_with("maintained by ") && text.contains(&format!("term {}", first.term())),
        "{text}"
    );
    let (holder, other) = if a.is_maintainer() { (a, b) } else { (b, a) };
    assert!(holder.is_maintainer() && !other.is_maintainer());

    // Dropped: given up at once, taken by the other within a third of a lease (and slack).
    let dropped = Instant::now();
    drop(holder);
    assert!(
        common::wait_for(LEASE, || other.is_maintainer()),
        "not replaced after the maintainer was dropped"
    );
    assert!(dropped.elapsed() < LEASE, "{:?}", dropped.elapsed());
    let second = live.broker.maintainer().unwrap().expect("a maintainer");
    assert!(second.term() > first.term(), "the term did not grow");
    assert_ne!(second.id(), first.id());

    // Killed: the child takes it once `other` is dropped, then is killed; a third broker of
    // this process waits, and takes it only once the child's lease has run out.
    let mut child = common::spawn_child("maintainer_child", CHILD_ENV, &live.url);
    std::thread::sleep(Duration::from_millis(300));
    drop(other);
    let term: u64 = child
        .line_after("MAINTAINER ", Duration::from_secs(20))
        .expect("the child was elected")
        .trim()
        .parse()
        .unwrap();
    assert!(term > second.term());
    let c = maintaining(&live.url);
    let lease_until = live.broker.maintainer().unwrap().unwrap().lease_until();
    child.process.kill().unwrap();
    child.process.wait().unwrap();
    let killed = Instant::now();
    assert!(
        common::wait_for(LEASE * 2 + Duration::from_secs(2), || c.is_maintainer()),
        "not replaced after the maintainer was killed"
    );
    let taken = std::time::SystemTime::now();
    assert!(
        taken + Duration::from_millis(50) >= lease_until,
        "taken {:?} before the killed one's lease ran out",
        lease_until.duration_since(taken).unwrap_or_default()
    );
    assert!(killed.elapsed() <= LEASE + LEASE / 3 + Duration::from_secs(2));
    let third = live.broker.maintainer().unwrap().expect("a maintainer");
    assert!(third.term() > term, "the term did not grow");
}
per_db!(one_maintainer_elected_and_replaced);

/// `UPDATE .. SET <c> = <c> - secs` for the rows matching `cond`.
fn age(l: &Live, t: &Table, cond: &str, cols: &[&str], secs: i64) {
    let back = |c: &str| match l.db {
        Db::Postgres => format!("{c} = {c} - interval '{secs} seconds'"),
        Db::Mysql => format!("{c} = {c} - INTERVAL {secs} SECOND"),
        Db::Sqlite => format!("{c} = {c} - {secs}"),
    };
    let set: Vec<String> = cols.iter().map(|c| back(c)).collect();
    l.exec(&format!(
        "UPDATE {} SET {} WHERE {cond}",
        t.name(),
        set.join(", ")
    ));
}

/// The maintainer prunes by itself, no one calling `prune_completed`: the completed rows older
/// than `keep_completed`, the dead letters older than `keep_dead`, the action log's entries
/// older than `keep_actions`; a younger completed row or dead letter, a ready row and a
/// table without retention are left alone. On a table with dependencies too (the dead
/// letter's outcome kept for a job published after its prune).
///
/// Fails (`not pruned`) with no maintainer duties, and (`pruned too much`) with a cutoff that
/// ignores the retention.
fn the_maintainer_prunes_by_itself(db: Db, form: Form) {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(live) = common::live(db) else { return };
    for deps in [false, true] {
        let mut t = common::describe(&common::unique("mt"), form, Duration::from_secs(30))
            .keep_completed(Duration::from_secs(3600))
            .keep_dead(Duration::from_secs(3600));
        if deps {
            t = t.dependencies();
        }
        let t = live.create(t);
        let plain = live.create(common::describe(
            &common::unique("mp"),
            form,
            Duration::from_secs(30),
        ));
        for i in 0..5 {
            let m = || Message::new(format!("{i}").into_bytes()).set("k", format!("k{i}"));
            live.broker.publish(&t, m()).unwrap();
            live.broker.publish(&plain, m()).unwrap();
        }
        let sub = live
            .broker
            .subscription(&t)
            .max_in_flight(1)
            .start()
            .unwrap();
        let mut ids = Vec::new();
        for i in 0..4 {
            let d = next(&sub, Duration::from_secs(10));
            ids.push(d.id());
            if i < 2 {
                d.ack().unwrap();
            } else {
                d.dead_letter("bad").unwrap();
            }
        }
        sub.shutdown(Duration::from_secs(10)).unwrap();
        let psub = live
            .broker
            .subscription(&plain)
            .max_in_flight(1)
            .start()
            .unwrap();
        let d = next(&psub, Duration::from_secs(10));
        d.dead_letter("bad").unwrap();
        psub.shutdown(Duration::from_secs(10)).unwrap();
        // One completed row and one dead letter two hours old; the others just now.
        age(
            &live,
            &t,
            &format!("id IN ({}, {})", ids[0], ids[2]),
            &["dead_at", "completed_at"],
            7200,
        );
        age(&live, &plain, "dead_at IS NOT NULL", &["dead_at"], 7200);
        live.broker
            .record_action("test", "maintenance test", t.name(), "old", 0)
            .unwrap();
        std::thread::sleep(Duration::from_millis(1100));

        let m = Broker::builder(&live.url)
            .maintainer_lease(LEASE)
            .maintenance_every(Duration::from_secs(1))
            .keep_actions(Duration::from_secs(1))
            .build()
            .unwrap();
        expire_by_hand(&live);
        let pruned = common::wait_for(Duration::from_secs(15), || {
            live.rows_where(&t, &format!("id IN ({}, {})", ids[0], ids[2])) == 0
        });
        assert!(pruned, "not pruned (dependencies: {deps})");
        assert!(
            common::wait_for(Duration::from_secs(5), || live
                .ints("SELECT COUNT(*) FROM sqlbroker_actions WHERE detail = 'old'")[0]
                == Some(0)),
            "the action log's old entry not swept"
        );
        // Two more rounds: the young rows stay.
        std::thread::sleep(Duration::from_secs(2));
        assert_eq!(
            live.rows_where(&t, &format!("id IN ({}, {})", ids[1], ids[3])),
            2,
            "pruned too much (dependencies: {deps})"
        );
        assert_eq!(live.rows(&t), 3, "the ready row and the young ones stay");
        assert_eq!(live.rows(&plain), 5, "a table without retention pruned");
        if deps {
            // The pruned dead letter's outcome is kept: a job waiting on it is dead-lettered.
            let later = live
                .broker
                .publish(&t, Message::new(b"x".to_vec()).set("k", "x").after(ids[2]))
                .unwrap();
            let job = live.broker.job(&t, later).unwrap().expect("the job");
            assert_eq!(
                job.state(),
                sqlbroker::JobState::Dead,
                "after a pruned dead letter"
            );
        }
        drop(m);
    }
}
per_db_form!(the_maintainer_prunes_by_itself);

/// Rows of `t`, completed two hours ago: `n` published then aged by one `UPDATE`.
fn old_completed(live: &Live, t: &Table, n: usize) {
    for chunk in (0..n).collect::<Vec<_>>().chunks(1000) {
        let msgs = chunk.iter().map(|_| Message::new(b"x".to_vec()));
        live.broker.publish_batch(t, msgs).unwrap();
    }
    let at = match live.db {
        Db::Postgres => "now() - interval '2 hours'",
        Db::Mysql => "UTC_TIMESTAMP() - INTERVAL 2 HOUR",
        Db::Sqlite => "CAST(strftime('%s','now') AS INTEGER) - 7200",
    };
    live.exec(&format!(
        "UPDATE {} SET dead_at = {at}, completed_at = {at}",
        t.name()
    ));
}

/// A maintainer whose batch is held past its lease (another session holds a row lock its
/// delete waits on for 24 s; lease 3 s) stops saying it maintains once its lease has run out
/// on its own clock, while a second broker is elected: never both at once.
///
/// The lock is held before `a` runs, so `a`'s first pass waits on it whenever it starts; and
/// `a` is watched only once a renewal has followed the lease expired by hand (which may have
/// been `a`'s own: until its next renewal it rightly says it maintains, and `b` could take
/// the expired row at once).
///
/// Fails (seen: `is_maintainer` read the term alone, held until the next renewal said
/// otherwise) with `both maintain` (about 40 samples of 100 ms on PostgreSQL).
fn a_held_up_maintainer_stops_saying_it_maintains(db: Db) {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(live) = common::live(db) else { return };
    let t = live.create(
        Table::new(common::unique("mh"))
            .lease(Duration::from_secs(30))
            .keep_completed(Duration::from_secs(3600)),
    );
    old_completed(&live, &t, 3000);
    // The first row any batch deletes, locked for 24 s (the `SELECT`'s alias names the table,
    // so the wait below finds this session and no other run's).
    let lock = match db {
        Db::Postgres => format!(
            "BEGIN; SELECT id FROM {0} WHERE id = (SELECT MIN(id) FROM {0}) FOR UPDATE; \
             SELECT pg_sleep(24) AS {0}; COMMIT",
            t.name()
        ),
        _ => format!(
            "START TRANSACTION; SELECT id FROM {0} WHERE id = (SELECT MIN(id) FROM {0}) \
             FOR UPDATE; SELECT SLEEP(24) AS {0}; COMMIT",
            t.name()
        ),
    };
    let url = live.url.clone();
    let locked_at = Instant::now();
    let locker = std::thread::spawn(move || common::exec(db, &url, &lock));
    let sleeping = match db {
        Db::Postgres => format!(
            "SELECT COUNT(*) FROM pg_stat_activity WHERE pid <> pg_backend_pid() \
             AND query LIKE '%pg_sleep(24) AS {}%'",
            t.name()
        ),
        _ => format!(
            "SELECT COUNT(*) FROM information_schema.processlist WHERE id <> CONNECTION_ID() \
             AND info LIKE '%SLEEP(24) AS {}%'",
            t.name()
        ),
    };
    assert!(
        common::wait_for(Duration::from_secs(5), || live.ints(&sleeping)[0]
            == Some(1)),
        "the lock was never taken"
    );
    let a = maintaining(&live.url);
    expire_by_hand(&live);
    std::thread::sleep(LEASE / 3 + Duration::from_millis(500));
    assert!(
        common::wait_for(Duration::from_secs(10), || a.is_maintainer()),
        "a was never elected"
    );
    let b = maintaining(&live.url);
    let start = Instant::now();
    let (mut both, mut b_elected) = (0, false);
    while start.elapsed() < Duration::from_secs(12) {
        let (ia, ib) = (a.is_maintainer(), b.is_maintainer());
        both += usize::from(ia && ib);
        b_elected |= ib;
        std::thread::sleep(Duration::from_millis(100));
    }
    let held = locked_at.elapsed();
    locker.join().unwrap();
    assert_eq!(both, 0, "both maintain");
    assert!(
        b_elected,
        "the held-up maintainer was never replaced: the test proves nothing"
    );
    assert!(
        held < Duration::from_secs(24),
        "the lock was let go ({held:?}) before the watch ended: the test proves less"
    );
}
per_server!(a_held_up_maintainer_stops_saying_it_maintains);

/// The maintainer's deletes take at most a tenth of the time while its interval lasts, even
/// when each batch is slow: on PostgreSQL a trigger makes each 1,000-row delete take about a
/// second (timed by hand first), so batches come about ten of those apart; in 10 s at most
/// `10 s / (5 x batch) + 1` batches (a fifth of the time, room for a loaded machine).
/// (PostgreSQL only: the slow batch is a trigger sleeping per row. The pacing's arithmetic is
/// the unit test's, on every database.)
///
/// Fails (seen: the rest capped at a quarter of the lease, 0.75 s) with about five batches
/// in the 10 s where two are allowed.
fn slow_batches_are_paced_too(db: Db) {
    if db != Db::Postgres {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(live) = common::live(db) else { return };
    let t = live.create(
        Table::new(common::unique("ms"))
            .lease(Duration::from_secs(30))
            .keep_completed(Duration::from_secs(3600)),
    );
    old_completed(&live, &t, 11_000);
    let f = format!("{}_slow", t.name());
    live.exec(&format!(
        "CREATE FUNCTION {f}() RETURNS trigger AS $$ BEGIN PERFORM pg_sleep(0.0005); \
         RETURN OLD; END $$ LANGUAGE plpgsql"
    ));
    live.exec(&format!(
        "CREATE TRIGGER {f} BEFORE DELETE ON {} FOR EACH ROW EXECUTE FUNCTION {f}()",
        t.name()
    ));
    let count = || live.ints(&format!("SELECT COUNT(*) FROM {}", t.name()))[0].unwrap();
    // One batch's time, by hand: the first 1,000 rows.
    let timed = Instant::now();
    live.exec(&format!(
        "DELETE FROM {0} WHERE id <= (SELECT MIN(id) + 999 FROM {0})",
        t.name()
    ));
    let batch = timed.elapsed();
    let m = Broker::builder(&live.url)
        .maintainer_lease(LEASE)
        .maintenance_every(Duration::from_secs(30))
        .build()
        .unwrap();
    expire_by_hand(&live);
    let full = count();
    assert!(
        common::wait_for(Duration::from_secs(60), || count() < full),
        "the maintainer never pruned"
    );
    let first = count();
    let window = Duration::from_secs(10);
    std::thread::sleep(window);
    let batches = (first - count()) / 1000;
    let allowed = (window.as_secs_f64() / (5.0 * batch.as_secs_f64())) as i64 + 1;
    assert!(m.is_maintainer(), "the lease was lost while resting");
    drop(m);
    live.exec(&format!("DROP TABLE {}", t.name()));
    live.exec(&format!("DROP FUNCTION {f}()"));
    assert!(
        batches <= allowed,
        "{batches} batches of 1,000 in {window:?} (each {batch:?} by hand; at most {allowed}): \
         not paced"
    );
}
per_db!(slow_batches_are_paced_too);
