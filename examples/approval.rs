//! An order that waits for an approval signal, with a deadline: the webhook (or the operator's
//! `sqlbroker signal --table example_approvals approved:ORDER --payload ...`) sends
//! `approved:<order>`, and the job runs with the approver's note; past the deadline it runs
//! without one, and the handler cancels the order.
//!
//! `cargo run --example approval [url]` (default: an SQLite file in the temp directory; try
//! `postgres://postgres@127.0.0.1:5432/test` or `mysql://root@127.0.0.1:3306/test`).

use std::time::{Duration, Instant};

use sqlbroker::{Broker, Message, Table};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let file = std::env::temp_dir().join(format!("sqlbroker-approval-{}.db", std::process::id()));
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| format!("sqlite:{}", file.display()));
    let broker = Broker::connect(&url)?;
    // Signals ride on the dependencies' machinery: the table is described with them.
    let orders = Table::new("example_approvals")
        .dependencies()
        .lease(Duration::from_secs(30));
    broker.create_table(&orders)?;

    // Two orders, each fulfilled once approved; a signal name per order (this run's own).
    let run = std::process::id();
    let deadline = Duration::from_secs(3);
    let mut orders_placed = Vec::new();
    for n in 1..=2 {
        let order = format!("order-{run}-{n}");
        let job = Message::new(order.clone())
            .after_signal(format!("approved:{order}"))
            .wait_timeout(deadline);
        orders_placed.push((broker.publish(&orders, job)?, order));
    }

    // The approval of the first order comes in (a webhook's handler would call this).
    let (_, first) = &orders_placed[0];
    let released = broker.signal(&orders, &format!("approved:{first}"), b"approved by ann")?;
    println!("approval of {first} released {released} job");

    // The worker: an approved order is fulfilled; one whose approval did not come in time is
    // cancelled.
    let sub = broker.subscription(&orders).start()?;
    let started = Instant::now();
    for _ in 0..orders_placed.len() {
        let d = sub.next_delivery_timeout(deadline + Duration::from_secs(15))?;
        let order = String::from_utf8_lossy(d.payload()).into_owned();
        match d.signal() {
            Some(s) => println!(
                "{order}: fulfilled ({}, {:.1}s)",
                String::from_utf8_lossy(s.payload()),
                started.elapsed().as_secs_f64()
            ),
            None => println!(
                "{order}: no approval within {deadline:?}, cancelled ({:.1}s)",
                started.elapsed().as_secs_f64()
            ),
        }
        d.ack()?;
    }
    sub.shutdown(Duration::from_secs(5))?;
    broker.drop_table(&orders)?;
    Ok(())
}
