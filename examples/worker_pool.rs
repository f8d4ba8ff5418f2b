//! A worker pool on PostgreSQL: the row lock form, many handler threads, several claim workers.
//!
//! `cargo run --example worker_pool [postgres-url]` (default
//! `postgres://postgres@127.0.0.1:5432/test`). Each email row is locked by an open transaction
//! while its handler runs; a handler that panics drops its delivery, which counts a failed
//! attempt (committed with a short delay), and a crash of the process rolls the row back with
//! no attempt spent.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlbroker::{Broker, Message, Table};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "postgres://postgres@127.0.0.1:5432/test".into());
    // Row lock deliveries hold a connection each: size the pool for workers + handlers.
    let broker = Broker::builder(&url).pool_size(24).build()?;
    let emails = Table::new("example_emails").text_column("to_addr");
    broker.create_table(&emails)?;
    let n = 500;
    broker.publish_batch(
        &emails,
        (0..n)
            .map(|i| {
                Message::new(format!("hello #{i}")).set("to_addr", format!("user{i}@example.com"))
            })
            .collect::<Vec<_>>(),
    )?;

    let started = Instant::now();
    let sub = Arc::new(
        broker
            .subscription(&emails)
            .workers(4)
            .max_in_flight(16)
            .start()?,
    );
    let done = Arc::new(AtomicUsize::new(0));
    let handlers: Vec<_> = (0..16)
        .map(|_| {
            let (sub, done) = (sub.clone(), done.clone());
            std::thread::spawn(move || loop {
                match sub.next_delivery_timeout(Duration::from_secs(1)) {
                    Ok(d) => {
                        // "Send" the email here; on error, d.retry_after(..) instead.
                        d.ack().expect("ack");
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(_) => return, // idle, or closed
                }
            })
        })
        .collect();
    for h in handlers {
        h.join().expect("handler");
    }
    println!(
        "{} emails sent in {:?} by 16 handlers",
        done.load(Ordering::Relaxed),
        started.elapsed()
    );
    if let Ok(sub) = Arc::try_unwrap(sub) {
        sub.shutdown(Duration::from_secs(5))?;
    }
    Ok(())
}
