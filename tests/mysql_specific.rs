//! MySQL / MariaDB only: hashed advisory lock names, READ COMMITTED claim transactions, and
//! deadlocks surfacing as transient errors that lose no row. Direct SQL through the `mysql` crate
//! sets up what the library cannot (old due times, a competing REPEATABLE READ transaction).
#![cfg(feature = "mysql")]

mod common;

use std::time::{Duration, Instant};

use common::{next, Db};
use mysql::prelude::Queryable;
use sha2::{Digest, Sha256};
use sqlbroker::{
    Broker, BrokerError, DbErrorKind, Delivery, Isolation, Message, Subscription, Table,
};

/// A direct session, and the tables to drop when the test ends (whatever its outcome).
struct Raw {
    url: String,
    conn: mysql::Conn,
    tables: Vec<String>,
}

impl Raw {
    fn new(url: &str) -> Raw {
        let opts = mysql::Opts::from_url(url).expect("mysql url");
        Raw {
            url: url.to_string(),
            conn: mysql::Conn::new(opts).expect("direct connection"),
            tables: Vec::new(),
        }
    }

    /// Another direct session on the same server.
    fn session(&self) -> mysql::Conn {
        mysql::Conn::new(mysql::Opts::from_url(&self.url).unwrap()).unwrap()
    }

    /// A table name of the test's own, dropped at the end.
    fn name(&mut self, prefix: &str) -> String {
        let name = common::unique(prefix);
        self.tables.push(name.clone());
        name
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        for t in &self.tables {
            let _ = self.conn.query_drop(format!("DROP TABLE IF EXISTS `{t}`"));
        }
    }
}

/// The first delivery either subscription hands out, and which one did.
fn either(subs: &[Subscription; 2]) -> (Delivery, usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        for (i, s) in subs.iter().enumerate() {
            if let Ok(d) = s.next_delivery_timeout(Duration::from_millis(50)) {
                return (d, i);
            }
        }
        assert!(
            Instant::now() < deadline,
            "no delivery within 10 s: {:?}",
            subs.iter().map(|s| s.last_error()).collect::<Vec<_>>()
        );
    }
}

fn sha256_hex(s: &str) -> String {
    Sha256::digest(s.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A key whose lock name is over 64 characters is taken under its SHA-256, and the lock is still
/// exclusive between two brokers (two pools, two sets of sessions).
#[test]
fn long_keys_are_hashed_and_exclusive_across_brokers() {
    let Some(url) = common::url(Db::Mysql) else {
        return;
    };
    let mut raw = Raw::new(&url);
    let name = raw.name("my_long");
    let t = Table::new(&name)
        .text_column("k")
        .advisory_lock(format!("{name}-{{k}}"));
    let (b1, b2) = (
        Broker::connect(&url).unwrap(),
        Broker::connect(&url).unwrap(),
    );
    b1.create_table(&t).unwrap();
    let key = "k".repeat(100);
    b1.publish_batch(
        &t,
        vec![
            Message::new(b"1".to_vec()).set("k", key.as_str()),
            Message::new(b"2".to_vec()).set("k", key.as_str()),
        ],
    )
    .unwrap();
    let db: String = raw.conn.query_first("SELECT DATABASE()").unwrap().unwrap();
    let lock = sha256_hex(&format!("{db}.{name}-{key}"));

    let subs = [
        b1.subscription(&t).start().unwrap(),
        b2.subscription(&t).start().unwrap(),
    ];
    let (first, holder_sub) = either(&subs);
    assert_eq!(first.key(), Some(format!("{name}-{key}").as_str()));
    // The key is held under its hash, by a session that is not ours.
    let holder: Option<i64> = raw
        .conn
        .exec_first("SELECT IS_USED_LOCK(?)", (&lock,))
        .unwrap()
        .unwrap();
    assert!(holder.is_some(), "lock {lock} is not held");
    let got: Option<i64> = raw
        .conn
        .exec_first("SELECT GET_LOCK(?, 0)", (&lock,))
        .unwrap()
        .unwrap();
    assert_eq!(got, Some(0));
    // Neither broker hands out the other row of that key while the first is in work.
    let other = &subs[1 - holder_sub];
    assert!(
        other
            .next_delivery_timeout(Duration::from_millis(1500))
            .is_err(),
        "equal key delivered twice at once"
    );
    assert!(subs[holder_sub].try_next_delivery().is_err());
    let first_id = first.id();
    first.ack().unwrap();

    let (second, _) = either(&subs);
    assert_ne!(second.id(), first_id);
    second.ack().unwrap();
    for s in subs {
        s.shutdown(Duration::from_secs(5)).unwrap();
    }
    let free: Option<i64> = raw
        .conn
        .exec_first("SELECT IS_FREE_LOCK(?)", (&lock,))
        .unwrap()
        .unwrap();
    assert_eq!(free, Some(1));
}

/// Claims a row-lock table's oldest row (due a day ago), then inserts a row due two days ago,
/// which sorts before it in every index the claim may have scanned. Returns how long the insert
/// waited, or the error it got after waiting a second.
fn insert_beside_a_claim(isolation: Option<Isolation>) -> Option<Result<Duration, mysql::Error>> {
    let url = common::url(Db::Mysql)?;
    let mut raw = Raw::new(&url);
    let name = raw.name("my_iso");
    let mut t = Table::new(&name);
    if let Some(level) = isolation {
        t = t.isolation(level);
    }
    let broker = Broker::connect(&url).unwrap();
    broker.create_table(&t).unwrap();
    raw.conn
        .query_drop(format!(
            "INSERT INTO `{name}` (payload, run_at) VALUES ('a', UTC_TIMESTAMP() - INTERVAL 1 DAY)"
        ))
        .unwrap();
    let sub = broker.subscription(&t).start().unwrap();
    let held = next(&sub, Duration::from_secs(10));

    let mut other = raw.session();
    other
        .query_drop("SET SESSION innodb_lock_wait_timeout = 1")
        .unwrap();
    let started = Instant::now();
    let inserted = other
        .query_drop(format!(
            "INSERT INTO `{name}` (payload, run_at) VALUES ('c', UTC_TIMESTAMP() - INTERVAL 2 DAY)"
        ))
        .map(|_| started.elapsed());
    held.ack().unwrap();
    sub.shutdown(Duration::from_secs(5)).unwrap();
    Some(inserted)
}

/// The claim transaction runs at READ COMMITTED: it locks the row it took and no gap, so a
/// publisher never waits on a claim. At REPEATABLE READ (asked for explicitly) the same insert
/// waits on the claim's gap lock, which shows the level is really set per transaction.
#[test]
fn claims_run_at_read_committed_unless_told_otherwise() {
    let Some(rc) = insert_beside_a_claim(None) else {
        return;
    };
    let waited = rc.expect("the insert waited on a READ COMMITTED claim");
    assert!(
        waited < Duration::from_millis(900),
        "the insert waited {waited:?}"
    );

    match insert_beside_a_claim(Some(Isolation::RepeatableRead)).unwrap() {
        Err(mysql::Error::MySqlError(e)) => assert_eq!(e.code, 1205, "{e}"),
        other => {
            panic!("at REPEATABLE READ the insert should wait on the claim's gap lock: {other:?}")
        }
    }
}

/// A row-lock settlement that deadlocks is reported as a transient database error, and the row
/// is back as it was (the transaction rolled back; no attempt spent).
///
/// The deadlock: the delivery's transaction holds its row; a REPEATABLE READ session locks the
/// index range of a future row (gap included) and has written more than the delivery, so the
/// deadlock detector rolls the delivery back. `retry_after` moves the row into that gap and
/// waits; the session then asks for the delivery's row: a cycle, whichever comes first.
#[test]
fn deadlocked_settlement_is_transient_and_keeps_the_row() {
    let Some(url) = common::url(Db::Mysql) else {
        return;
    };
    let mut raw = Raw::new(&url);
    let name = raw.name("my_dl");
    let weight = raw.name("my_dlw");
    let t = Table::new(&name);
    let broker = Broker::connect(&url).unwrap();
    broker.create_table(&t).unwrap();
    raw.conn
        .query_drop(format!("CREATE TABLE `{weight}` (x INT) ENGINE=InnoDB"))
        .unwrap();
    broker.publish(&t, Message::new(b"now".to_vec())).unwrap();
    broker
        .publish(
            &t,
            Message::new(b"later".to_vec()).deliver_after(Duration::from_secs(1000)),
        )
        .unwrap();

    let sub = broker.subscription(&t).start().unwrap();
    let d = next(&sub, Duration::from_secs(10));
    assert_eq!((d.payload(), d.attempt()), (&b"now"[..], 1));
    let id = d.id();

    let mut other = raw.session();
    other
        .query_drop("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        .unwrap();
    other.query_drop("START TRANSACTION").unwrap();
    other
        .query_drop(format!(
            "INSERT INTO `{weight}` (x) WITH RECURSIVE s(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM s WHERE n < 200) \
             SELECT n FROM s"
        ))
        .unwrap();
    other
        .query_drop(format!(
            "SELECT id FROM `{name}` FORCE INDEX (`{name}_ready`) \
             WHERE dead_at IS NULL AND run_at >= UTC_TIMESTAMP() + INTERVAL 500 SECOND FOR UPDATE"
        ))
        .unwrap();

    let settling = std::thread::spawn(move || d.retry_after(Duration::from_secs(600)));
    std::thread::sleep(Duration::from_millis(500));
    let locked: Vec<i64> = other
        .exec(
            format!("SELECT id FROM `{name}` WHERE id = ? FOR UPDATE"),
            (id,),
        )
        .unwrap();
    assert_eq!(locked, [id]);
    let settled = settling.join().unwrap();
    other.query_drop("ROLLBACK").unwrap();

    match &settled {
        Err(
            e @ BrokerError::Database {
                kind: DbErrorKind::Transient,
                ..
            },
        ) => assert!(e.is_transient()),
        other => panic!("expected a transient error from the deadlocked settlement, got {other:?}"),
    }
    // Back at once, as it was: due now, attempt 1 again.
    let again = next(&sub, Duration::from_secs(10));
    assert_eq!(
        (again.id(), again.attempt(), again.payload()),
        (id, 1, &b"now"[..])
    );
    again.ack().unwrap();
    sub.shutdown(Duration::from_secs(5)).unwrap();
}
