//! FIFO groups: each customer's orders run one at a time in the order they were placed, while
//! different customers run in parallel on the same subscription.
//!
//! `cargo run --example fifo_orders [url]` (default: an SQLite file in the temp directory; try
//! `postgres://postgres@127.0.0.1:5432/test` or `mysql://root@127.0.0.1:3306/test`).

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use sqlbroker::{Broker, Message, Table};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let file = std::env::temp_dir().join(format!("sqlbroker-fifo-{}.db", std::process::id()));
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| format!("sqlite:{}", file.display()));
    let broker = Broker::connect(&url)?;
    // The `customer` column names the group; the lease form works on every database.
    let orders = Table::new("example_orders")
        .group("customer")
        .fifo()
        .int_column("seq")
        .lease(Duration::from_secs(30));
    broker.create_table(&orders)?;

    // Five orders each for three customers, interleaved as they would arrive.
    let customers = ["ann", "bob", "cy"];
    let mut total = 0;
    for seq in 1..=5i64 {
        for c in customers {
            let order = Message::new(format!("{c} order {seq}"))
                .set("customer", c)
                .set("seq", seq);
            broker.publish(&orders, order)?;
            total += 1;
        }
    }

    let sub = broker.subscription(&orders).workers(2).start()?;
    let in_work = Mutex::new(HashSet::new()); // customers with an order in a handler now
    let done: Mutex<BTreeMap<String, Vec<i64>>> = Mutex::default();
    let handled = AtomicUsize::new(0);
    // Four handler threads: without `fifo()`, one customer's orders would overlap and reorder.
    let ran = sub.run(4, |d| {
        let customer = d.get("customer").and_then(|v| v.as_str()).unwrap_or("?");
        let seq = d.get("seq").and_then(|v| v.as_i64()).unwrap_or(0);
        assert!(
            in_work.lock().insert(customer.to_string()),
            "two orders of {customer} at once"
        );
        std::thread::sleep(Duration::from_millis(30)); // the order's work
        done.lock()
            .entry(customer.to_string())
            .or_default()
            .push(seq);
        in_work.lock().remove(customer);
        if handled.fetch_add(1, Ordering::SeqCst) + 1 == total {
            sub.close(); // every order handled
        }
        Ok::<(), std::io::Error>(()) // Ok acks: the customer's next order becomes claimable
    })?;
    sub.shutdown(Duration::from_secs(5))?;

    for (customer, seqs) in done.lock().iter() {
        println!("{customer}: orders {seqs:?}");
        assert!(seqs.windows(2).all(|w| w[0] < w[1]), "out of order");
    }
    println!(
        "{} orders, each customer's in order, never two at once",
        ran.acked
    );
    let _ = std::fs::remove_file(&file);
    Ok(())
}
