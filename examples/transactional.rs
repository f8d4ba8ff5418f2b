//! The transactional pattern end to end, on PostgreSQL: the job is enqueued in the same
//! transaction as the application's own write, and its handler's database work commits in the
//! same transaction as its ack.
//!
//! `cargo run --example transactional [postgres-url]` (default
//! `postgres://postgres@127.0.0.1:5432/test`).
//!
//! 1. Sign-up: insert the user and publish a welcome job in one transaction
//!    (`sqlbroker::postgres::publish`): both or neither. A sign-up rolled back leaves no job.
//! 2. Handler: record the welcome in the user's row on the delivery's own connection
//!    (`sqlbroker::postgres::in_delivery`), then ack: the record and the ack commit together.
//!    The first attempt fails after its write, which is rolled back, and is retried.

use std::time::Duration;

use sqlbroker::postgres::driver as postgres; // the driver, at the version sqlbroker takes
use sqlbroker::{Broker, Message, RetryPolicy, Table};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "postgres://postgres@127.0.0.1:5432/test".into());
    if !url.starts_with("postgres://") && !url.starts_with("postgresql://") {
        return Err(format!(
            "this example is PostgreSQL's (its transactions are the postgres crate's): \
             give a postgres:// URL, not {url}"
        )
        .into());
    }
    let mut client = postgres::Client::connect(&url, postgres::NoTls)?;
    client.batch_execute(
        "DROP TABLE IF EXISTS example_users; \
         CREATE TABLE example_users (id BIGINT PRIMARY KEY, welcomed INT NOT NULL DEFAULT 0)",
    )?;
    let broker = Broker::connect(&url)?;
    let welcomes = Table::new("example_welcomes").int_column("user_id");
    broker.create_table(&welcomes)?;

    // 1. Two sign-ups: one commits, one rolls back.
    for (user, commit) in [(1i64, true), (2, false)] {
        let mut tx = client.transaction()?;
        tx.execute("INSERT INTO example_users (id) VALUES ($1)", &[&user])?;
        let job = Message::new(b"welcome".to_vec()).set("user_id", user);
        sqlbroker::postgres::publish(&mut tx, &welcomes, job)?;
        if commit {
            tx.commit()?;
        } // else dropped: rolled back, user and job alike
    }

    // 2. The handler, in the delivery's transaction.
    let sub = broker
        .subscription(&welcomes)
        .retry_policy(RetryPolicy::exponential(
            Duration::from_secs(1),
            Duration::from_secs(1),
        ))
        .start()?;
    loop {
        let mut d = sub.next_delivery_timeout(Duration::from_secs(10))?;
        let user = d
            .get("user_id")
            .and_then(|v| v.as_i64())
            .unwrap_or_default();
        let attempt = d.attempt();
        let work = sqlbroker::postgres::in_delivery(&mut d, |c| {
            c.execute(
                "UPDATE example_users SET welcomed = welcomed + 1 WHERE id = $1",
                &[&user],
            )?;
            if attempt == 1 {
                return Err("the mail server was down".into());
            }
            Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
        })?;
        match work {
            Ok(()) => {
                d.ack()?;
                break;
            }
            Err(e) => {
                println!("attempt {attempt} failed ({e}); its write is rolled back");
                d.fail(e)?;
            }
        }
    }
    sub.shutdown(Duration::from_secs(5))?;

    let rows = client.query("SELECT id, welcomed FROM example_users ORDER BY id", &[])?;
    let users: Vec<(i64, i32)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    println!("users: {users:?}");
    assert_eq!(users, [(1, 1)], "one user, welcomed exactly once");
    Ok(())
}
