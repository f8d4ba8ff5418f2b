//! The fleet: every running subscription and worker's heartbeat in `sqlbroker_workers`, read by
//! any broker (`Broker::workers`). Every database.

mod common;

use std::time::Duration;

use common::Db;
use sqlbroker::{Broker, Form, Message, Table, Worker, WorkerInfo};

/// The child of `a_killed_process_drops_out`: `<form>\t<table>\t<url>`.
const CHILD_ENV: &str = "SQLBROKER_FLEET_CHILD";

fn kinds_table(live: &common::Live, prefix: &str) -> Table {
    live.create(
        common::describe(
            &common::unique(prefix),
            Form::Lease,
            Duration::from_secs(30),
        )
        .kinds(),
    )
}

/// The members taking rows of `table` (other tests' members share the database).
fn members_of(broker: &Broker, table: &str) -> Vec<WorkerInfo> {
    broker
        .workers()
        .unwrap()
        .into_iter()
        .filter(|w| w.tables().iter().any(|t| t.name() == table))
        .collect()
}

/// A worker and a subscription of one process are listed by a second broker within a beat,
/// with what they take (tables, kinds, queues), the process, and what they handled; each drops
/// out as soon as it stops, long before its row would expire. Fails (`listed`) without the
/// heartbeats, (`handled`) if a beat did not carry the counts, and (`still listed`) if a
/// shutdown left its row to expire.
fn the_fleet_lists_what_runs(db: Db) {
    let Some(live) = common::live(db) else { return };
    let mail = kinds_table(&live, "fm");
    let plain = kinds_table(&live, "fp");
    // Rows expire three beats after they are written: 6 s here, so a row gone within 2 s
    // of a stop was deleted by it.
    let broker = Broker::builder(&live.url)
        .heartbeat(Duration::from_secs(2))
        .build()
        .unwrap();
    let other = live.connect();
    let worker = Worker::new(&broker)
        .on(&mail, "welcome", |_d| Ok::<(), String>(()))
        .on(&mail, "invoice", |_d| Ok::<(), String>(()))
        .threads(2)
        .start()
        .unwrap();
    let sub = broker.subscription(&plain).start().unwrap();
    assert!(
        common::wait_for(Duration::from_secs(10), || {
            members_of(&other, mail.name()).len() == 1
                && members_of(&other, plain.name()).len() == 1
        }),
        "listed: {:?}",
        other.workers().unwrap()
    );
    let w = members_of(&other, mail.name()).remove(0);
    assert_eq!(w.what(), "worker");
    assert_eq!(w.pid(), u64::from(std::process::id()));
    assert!(!w.host().is_empty());
    assert_eq!(w.tables().len(), 1);
    assert_eq!(
        w.tables()[0].kinds(),
        Some(&["invoice".to_string(), "welcome".to_string()][..])
    );
    assert_eq!(w.tables()[0].queues(), None);
    assert!(w.takes(mail.name(), Some("welcome")));
    assert!(!w.takes(mail.name(), Some("refund")));
    assert!(!w.takes(mail.name(), None));
    assert!(!w.takes(plain.name(), Some("welcome")));
    let s = members_of(&other, plain.name()).remove(0);
    assert_eq!(s.what(), "subscription");
    assert!(s.takes(plain.name(), Some("anything")) && s.takes(plain.name(), None));
    assert!(s.started() <= s.last_seen());

    for i in 0..3 {
        let m = Message::new(b"x".to_vec())
            .set("k", format!("w{i}"))
            .kind("welcome");
        broker.publish(&mail, m).unwrap();
    }
    assert!(
        common::wait_for(Duration::from_secs(10), || {
            members_of(&other, mail.name())
                .first()
                .is_some_and(|w| w.handled() == 3 && w.in_work() == 0)
        }),
        "handled: {:?}",
        members_of(&other, mail.name())
    );

    worker.shutdown(Duration::from_secs(5)).unwrap();
    assert!(
        common::wait_for(Duration::from_secs(2), || members_of(&other, mail.name())
            .is_empty()),
        "still listed after its shutdown"
    );
    assert_eq!(members_of(&other, plain.name()).len(), 1);
    sub.close();
    assert!(
        common::wait_for(Duration::from_secs(2), || members_of(&other, plain.name())
            .is_empty()),
        "still listed after its close"
    );
}
per_db!(the_fleet_lists_what_runs);

/// The child: a subscription on the table named, beating every 300 ms, until killed.
#[test]
fn fleet_child_entry() {
    let Some((_, name, url)) = common::child_spec(CHILD_ENV) else {
        return;
    };
    let broker = Broker::builder(&url)
        .heartbeat(Duration::from_millis(300))
        .build()
        .expect("child: connect");
    let t = common::describe(&name, Form::Lease, Duration::from_secs(30)).kinds();
    let _sub = broker
        .subscription(&t)
        .kinds(["a"])
        .start()
        .expect("child: start");
    println!("\nSTARTED");
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
    std::process::exit(3);
}

/// A process killed with its subscription running drops out of the listing three beats after
/// its last (nothing deleted its row), and its row is deleted by a beat of any broker once it
/// expired long ago: the table holds what runs and what died lately. Fails (`still listed`)
/// if expiry were not read, and (`swept`) if no beat deleted long-expired rows.
fn a_killed_process_drops_out(db: Db) {
    let Some(live) = common::live(db) else { return };
    let t = kinds_table(&live, "fk");
    let child = common::spawn_child(
        "fleet_child_entry",
        CHILD_ENV,
        &format!("lease\t{}\t{}", t.name(), live.url),
    );
    assert!(child
        .line_after("STARTED", Duration::from_secs(60))
        .is_some());
    let pid = u64::from(child.process.id());
    assert!(common::wait_for(Duration::from_secs(10), || {
        members_of(&live.broker, t.name())
            .iter()
            .any(|w| w.pid() == pid)
    }));
    let id = members_of(&live.broker, t.name())[0].id().to_string();
    child.kill();
    // Three beats of 300 ms after its last: gone from the listing, its row still there.
    assert!(
        common::wait_for(Duration::from_secs(5), || members_of(
            &live.broker,
            t.name()
        )
        .is_empty()),
        "still listed after it was killed"
    );
    let rows = |live: &common::Live| {
        live.int(&format!(
            "SELECT COUNT(*) FROM sqlbroker_workers WHERE id = '{id}'"
        ))
    };
    assert_eq!(
        rows(&live),
        1,
        "the killed process's row is kept until swept"
    );
    // Expired long ago (as if a minute had passed): the next beat of a running member
    // deletes it.
    let long_ago = match db {
        Db::Sqlite => "946684800".to_string(),
        _ => "'2000-01-01 00:00:00'".to_string(),
    };
    live.exec(&format!(
        "UPDATE sqlbroker_workers SET expires_at = {long_ago} WHERE id = '{id}'"
    ));
    let beating = Broker::builder(&live.url)
        .heartbeat(Duration::from_millis(200))
        .build()
        .unwrap();
    let sub = beating.subscription(&t).kinds(["b"]).start().unwrap();
    assert!(
        common::wait_for(Duration::from_secs(5), || rows(&live) == 0),
        "swept: the long-expired row is still there"
    );
    sub.close();
}
per_db!(a_killed_process_drops_out);

/// A bad heartbeat is refused before anything connects.
#[test]
fn a_bad_heartbeat_is_refused() {
    for every in [Duration::from_millis(99), Duration::from_secs(301)] {
        let e = Broker::builder("sqlite::memory:")
            .heartbeat(every)
            .build()
            .unwrap_err();
        assert!(
            matches!(
                &e,
                sqlbroker::BrokerError::InvalidOption {
                    option: "heartbeat",
                    ..
                }
            ),
            "{e}"
        );
    }
}

/// A heartbeat faster than a second keeps its member listed: SQLite and MySQL's `DATETIME`
/// keep whole seconds, and an expiry cut down to its second dropped a member beating every
/// 100 ms from three listings in four (a review's probe). Fails (`dropped out`) if the expiry
/// is not rounded up.
fn a_fast_heartbeat_stays_listed(db: Db) {
    let Some(live) = common::live(db) else { return };
    let t = kinds_table(&live, "ff");
    let broker = Broker::builder(&live.url)
        .heartbeat(Duration::from_millis(100))
        .build()
        .unwrap();
    let sub = broker.subscription(&t).start().unwrap();
    assert!(common::wait_for(Duration::from_secs(5), || {
        members_of(&live.broker, t.name()).len() == 1
    }));
    let mut missed = 0;
    for _ in 0..60 {
        if members_of(&live.broker, t.name()).is_empty() {
            missed += 1;
        }
        std::thread::sleep(Duration::from_millis(23));
    }
    assert_eq!(
        missed, 0,
        "dropped out of {missed} listings of 60 while running"
    );
    sub.close();
}
per_db!(a_fast_heartbeat_stays_listed);

/// Deferred acks count as handled, as durable ones do. Fails (`handled`) if the deferred
/// writes are not counted (a review found them never counted).
fn deferred_acks_are_handled(db: Db) {
    let Some(live) = common::live(db) else { return };
    let t = kinds_table(&live, "fd");
    let broker = Broker::builder(&live.url)
        .heartbeat(Duration::from_millis(200))
        .build()
        .unwrap();
    let sub = broker
        .subscription(&t)
        .ack_mode(sqlbroker::AckMode::Deferred {
            within: Duration::from_millis(10),
        })
        .start()
        .unwrap();
    for i in 0..5 {
        broker
            .publish(&t, common::msg("x", &format!("d{i}")))
            .unwrap();
    }
    for _ in 0..5 {
        common::next(&sub, Duration::from_secs(10)).ack().unwrap();
    }
    assert!(
        common::wait_for(Duration::from_secs(10), || members_of(
            &live.broker,
            t.name()
        )
        .first()
        .is_some_and(|w| w.handled() == 5)),
        "handled: {:?}",
        members_of(&live.broker, t.name())
    );
    sub.close();
}
per_db!(deferred_acks_are_handled);

/// Running row lock subscriptions whose deliveries hold the broker's whole pool stay listed:
/// the heartbeat has a connection of its own. Fails (`listed`) if it waits on the pool (a
/// review's probe: none of two listed). Servers (SQLite's row lock form holds no pool).
fn members_holding_the_pool_stay_listed(db: Db) {
    if db == Db::Sqlite {
        return;
    }
    let Some(live) = common::live(db) else { return };
    let broker = Broker::builder(&live.url)
        .pool_size(2)
        .connection_timeout(Duration::from_secs(1))
        .heartbeat(Duration::from_millis(200))
        .build()
        .unwrap();
    let held = common::hold_pool(&live, &broker, 2);
    let holder = held[0].1.table().to_string();
    let ours = || members_of(&live.broker, &holder).len();
    assert!(
        common::wait_for(Duration::from_secs(5), || ours() == 2),
        "listed: {} of 2",
        ours()
    );
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(ours(), 2, "listed after a second of beats");
    drop(held);
}
per_db!(members_holding_the_pool_stay_listed);

/// SQLite, a database of its own: one member whose row the database refuses (a `CHECK` an
/// operator put on the table) does not keep the others' rows from being written, and the
/// table dropped by hand while members run is made again. Fails (`the other member`) if the
/// first failure ends the beat, (`made again`) if the table is made only once per thread.
#[test]
fn one_refused_row_and_a_dropped_table() {
    let Some(live) = common::live(Db::Sqlite) else {
        return;
    };
    live.exec(
        "CREATE TABLE sqlbroker_workers (id TEXT NOT NULL PRIMARY KEY, what TEXT NOT NULL, \
         host TEXT NOT NULL, pid INTEGER NOT NULL, tables TEXT NOT NULL CHECK (length(tables) < 200), \
         started_at INTEGER NOT NULL, seen_at INTEGER NOT NULL, expires_at INTEGER NOT NULL, \
         in_work INTEGER NOT NULL, handled INTEGER NOT NULL, last_error TEXT NULL)",
    );
    let t = kinds_table(&live, "fr");
    let broker = Broker::builder(&live.url)
        .heartbeat(Duration::from_millis(200))
        .build()
        .unwrap();
    let many: Vec<String> = (0..20).map(|i| format!("kind_number_{i}")).collect();
    let long = broker.subscription(&t).kinds(many).start().unwrap();
    let short = broker.subscription(&t).kinds(["a"]).start().unwrap();
    assert!(
        common::wait_for(Duration::from_secs(5), || {
            members_of(&live.broker, t.name())
                .iter()
                .any(|w| w.takes(t.name(), Some("a")))
        }),
        "the other member: {:?}",
        live.broker.workers()
    );
    drop(long);
    live.exec("DROP TABLE sqlbroker_workers");
    assert!(
        common::wait_for(Duration::from_secs(5), || members_of(
            &live.broker,
            t.name()
        )
        .len()
            == 1),
        "made again: {:?}",
        live.broker.workers()
    );
    short.close();
}

/// A handler reported stuck shows in the fleet: its member's `stuck()` is 1 at a beat while the
/// handler runs past `stuck_after`, and 0 again once it is settled. Fails (`not in the fleet`)
/// with a beat that does not write it.
fn a_stuck_handler_shows_in_the_fleet(db: Db) {
    let Some(live) = common::live(db) else { return };
    let t = kinds_table(&live, "fs");
    live.broker
        .publish(&t, sqlbroker::Message::new(b"x".to_vec()).kind("a"))
        .unwrap();
    let broker = Broker::builder(&live.url)
        .heartbeat(Duration::from_millis(200))
        .maintenance(false)
        .build()
        .unwrap();
    let sub = broker
        .subscription(&t)
        .stuck_after(Duration::from_millis(200))
        .start()
        .unwrap();
    let d = common::next(&sub, Duration::from_secs(10));
    let stuck = |n: u64| {
        common::wait_for(Duration::from_secs(5), || {
            members_of(&live.broker, t.name())
                .iter()
                .any(|w| w.stuck() == n)
        })
    };
    assert!(stuck(1), "not in the fleet: {:?}", live.broker.workers());
    d.ack().unwrap();
    assert!(stuck(0), "still stuck: {:?}", live.broker.workers());
    sub.close();
}
per_db!(a_stuck_handler_shows_in_the_fleet);
