//! Transactional completion (row lock form): the handler's own SQL runs in the delivery's
//! transaction, so it commits with the ack and is undone by a failure, a retry or a crash,
//! checked against a ledger table the handler writes.

mod common;

use std::io::Write;
use std::time::Duration;

use common::{Db, Live};
use sqlbroker::{Broker, Delivery, Form, Table};

/// Writes `id` into the ledger on the delivery's own connection; `fail_after` makes the
/// handler fail after its write (a duplicate key).
fn write_ledger(db: Db, d: &mut Delivery, ledger: &str, fail_after: bool) -> Result<(), String> {
    let id = d.id();
    match db {
        Db::Postgres => {
            let insert = format!("INSERT INTO {ledger} (delivery) VALUES ($1)");
            let r = sqlbroker::postgres::in_delivery(d, |c| {
                c.execute(&insert, &[&id])?;
                if fail_after {
                    c.execute(&insert, &[&id])?;
                }
                Ok::<(), postgres::Error>(())
            });
            r.map_err(|e| e.to_string())?.map_err(|e| e.to_string())
        }
        _ => {
            use mysql::prelude::Queryable;
            let insert = format!("INSERT INTO {ledger} (delivery) VALUES (?)");
            let r = sqlbroker::mysql::in_delivery(d, |c| {
                c.exec_drop(&insert, (id,))?;
                if fail_after {
                    c.exec_drop(&insert, (id,))?;
                }
                Ok::<(), mysql::Error>(())
            });
            r.map_err(|e| e.to_string())?.map_err(|e| e.to_string())
        }
    }
}

fn ledger(live: &Live) -> String {
    let name = common::unique("ledger");
    live.track(&name);
    live.exec(&format!(
        "CREATE TABLE {name} (delivery BIGINT PRIMARY KEY)"
    ));
    name
}

fn table(live: &Live, name: &str) -> Table {
    live.track(name);
    let t = common::describe(name, Form::RowLock, Duration::ZERO);
    live.broker.create_table(&t).unwrap();
    t
}

/// The handler's write and the ack commit together; a failing handler's write is undone and
/// the delivery can still be failed (its attempt counted); a lease delivery is refused.
fn completion_commits_with_the_ack(db: Db) {
    let Some(live) = common::live(db) else { return };
    let led = ledger(&live);
    let t = table(&live, &common::unique("t"));
    let id = live.broker.publish(&t, common::msg("pay", "a")).unwrap();
    let sub = live.broker.subscription(&t).start().unwrap();

    let mut d = common::next(&sub, Duration::from_secs(10));
    let e = write_ledger(db, &mut d, &led, true).expect_err("the second insert must fail");
    assert!(!e.is_empty());
    assert_eq!(
        live.int(&format!("SELECT COUNT(*) FROM {led}")),
        0,
        "the failed write is visible"
    );
    d.fail("ledger write failed").unwrap();
    assert_eq!(
        live.int(&format!("SELECT COUNT(*) FROM {led}")),
        0,
        "the failed write survived"
    );

    let mut d = common::next(&sub, Duration::from_secs(10));
    assert_eq!((d.id(), d.attempt()), (id, 2));
    write_ledger(db, &mut d, &led, false).unwrap();
    assert_eq!(
        live.int(&format!("SELECT COUNT(*) FROM {led}")),
        0,
        "the write committed before the ack"
    );
    d.ack().unwrap();
    assert_eq!(
        live.ints(&format!("SELECT delivery FROM {led}")),
        [Some(id)]
    );
    assert_eq!(live.rows(&t), 0);
    sub.shutdown(Duration::from_secs(5)).unwrap();

    let lease = live.table(Form::Lease, Duration::from_secs(30));
    live.broker.publish(&lease, common::msg("l", "a")).unwrap();
    let sub = live.broker.subscription(&lease).start().unwrap();
    let mut d = common::next(&sub, Duration::from_secs(10));
    let refused = match db {
        Db::Postgres => sqlbroker::postgres::in_delivery(&mut d, |_| Ok::<(), ()>(())).is_err(),
        _ => sqlbroker::mysql::in_delivery(&mut d, |_| Ok::<(), ()>(())).is_err(),
    };
    assert!(
        refused,
        "a lease delivery ran SQL in a transaction it does not have"
    );
    d.ack().unwrap();
    sub.shutdown(Duration::from_secs(5)).unwrap();
}
/// Row lock deliveries exist on the servers only (SQLite refuses the form).
macro_rules! servers {
    ($body:ident) => {
        mod $body {
            #[test]
            fn postgres() {
                super::$body(super::Db::Postgres)
            }
            #[cfg(feature = "mysql")]
            #[test]
            fn mysql() {
                super::$body(super::Db::Mysql)
            }
        }
    };
}

servers!(completion_commits_with_the_ack);

/// A handler whose write succeeded, then retries (or dead-letters) the delivery: the write is
/// undone with the retry, never committed by it.
fn a_retry_undoes_the_write(db: Db) {
    let Some(live) = common::live(db) else { return };
    let led = ledger(&live);
    let t = table(&live, &common::unique("t"));
    let id = live.broker.publish(&t, common::msg("pay", "a")).unwrap();
    let sub = live.broker.subscription(&t).start().unwrap();

    let mut d = common::next(&sub, Duration::from_secs(10));
    write_ledger(db, &mut d, &led, false).unwrap();
    d.retry().unwrap();
    assert_eq!(
        live.int(&format!("SELECT COUNT(*) FROM {led}")),
        0,
        "the retry committed the handler's write"
    );
    let mut d = common::next(&sub, Duration::from_secs(10));
    assert_eq!((d.id(), d.attempt()), (id, 2));
    write_ledger(db, &mut d, &led, false).unwrap();
    d.dead_letter("no").unwrap();
    assert_eq!(
        live.int(&format!("SELECT COUNT(*) FROM {led}")),
        0,
        "the dead letter committed the handler's write"
    );
    assert_eq!(live.broker.dead_letters(&t, 10).unwrap().len(), 1);
    sub.shutdown(Duration::from_secs(5)).unwrap();
}
servers!(a_retry_undoes_the_write);

const CHILD_ENV: &str = "SQLBROKER_TX_COMPLETE_CHILD";

/// The child: claims the row, writes the ledger in the delivery's transaction, says so, and
/// holds it until killed.
#[test]
fn tx_complete_child_entry() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let mut parts = spec.splitn(4, '\t');
    let (db, name, led, url) = (
        parts.next().unwrap(),
        parts.next().unwrap(),
        parts.next().unwrap(),
        parts.next().unwrap(),
    );
    let db = if db == "postgres" {
        Db::Postgres
    } else {
        Db::Mysql
    };
    let broker = Broker::connect(url).unwrap();
    let t = common::describe(name, Form::RowLock, Duration::ZERO);
    let sub = broker.subscription(&t).start().unwrap();
    let mut d = sub.next_delivery_timeout(Duration::from_secs(30)).unwrap();
    write_ledger(db, &mut d, led, false).unwrap();
    let mut out = std::io::stdout();
    writeln!(out, "\nWRITTEN {}", d.id()).unwrap();
    out.flush().unwrap();
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
    std::process::exit(3);
}

/// A process killed after its handler's write, before the ack: neither survives, and the row
/// is back at once, its attempt unspent.
fn a_crash_undoes_the_write(db: Db) {
    let Some(live) = common::live(db) else { return };
    let led = ledger(&live);
    let name = common::unique("t");
    let t = table(&live, &name);
    let id = live.broker.publish(&t, common::msg("pay", "a")).unwrap();
    let db_name = if db == Db::Postgres {
        "postgres"
    } else {
        "mysql"
    };
    let mut child = common::spawn_child(
        "tx_complete_child_entry",
        CHILD_ENV,
        &format!("{db_name}\t{name}\t{led}\t{}", live.url),
    );
    let written = child.line_after("WRITTEN ", Duration::from_secs(60));
    assert!(child.alive(), "the child died before the kill");
    child.kill();
    assert_eq!(written.expect("the child did not write"), id.to_string());
    assert_eq!(
        live.int(&format!("SELECT COUNT(*) FROM {led}")),
        0,
        "the killed handler's write survived"
    );
    let sub = live.broker.subscription(&t).start().unwrap();
    let mut d = common::next(&sub, Duration::from_secs(10));
    assert_eq!(
        (d.id(), d.attempt()),
        (id, 1),
        "a crash spends no attempt in the row lock form"
    );
    write_ledger(db, &mut d, &led, false).unwrap();
    d.ack().unwrap();
    assert_eq!(
        live.ints(&format!("SELECT delivery FROM {led}")),
        [Some(id)]
    );
    sub.shutdown(Duration::from_secs(5)).unwrap();
}
servers!(a_crash_undoes_the_write);
