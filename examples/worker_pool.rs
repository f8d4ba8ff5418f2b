//! A worker pool on PostgreSQL that runs until Ctrl-C (or SIGTERM), then shuts down gracefully:
//! the emails in progress finish and are acked, the rows claimed ahead go back to the queue
//! unspent, and nothing is lost.
//!
//! `cargo run --example worker_pool [postgres-url] [--once]` (default
//! `postgres://postgres@127.0.0.1:5432/test`). It publishes 500 emails, then one every 50 ms,
//! and sends them on 16 handler threads until Ctrl-C. With `--once` it publishes the 500 only
//! and exits when they are sent, no Ctrl-C needed.
//!
//! The row lock form: each email row is locked by an open transaction while its handler runs;
//! a handler that fails or panics has its delivery retried later, and a crash of the process
//! rolls the row back with no attempt spent.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlbroker::{Broker, Message, Table};

fn email(i: usize) -> Message {
    Message::new(format!("hello #{i}")).set("to_addr", format!("user{i}@example.com"))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let once = args.iter().any(|a| a == "--once");
    let url = args
        .iter()
        .find(|a| !a.starts_with("--"))
        .cloned()
        .unwrap_or_else(|| "postgres://postgres@127.0.0.1:5432/test".into());

    // Row lock deliveries hold a connection each: size the pool for workers + handlers.
    let broker = Broker::builder(&url).pool_size(24).build()?;
    let emails = Table::new("example_emails").text_column("to_addr");
    broker.create_table(&emails)?;
    let n = 500;
    broker.publish_batch(&emails, (0..n).map(email))?;

    let sub = Arc::new(
        broker
            .subscription(&emails)
            .workers(4)
            .max_in_flight(16)
            .start()?,
    );

    // Ctrl-C or SIGTERM: stop claiming; `run` below returns once the handlers in progress have
    // settled their deliveries. The handler holds a weak link, so the subscription can still
    // be shut down by its owner.
    let stopping = Arc::new(AtomicBool::new(false));
    {
        let (weak, stopping) = (Arc::downgrade(&sub), stopping.clone());
        ctrlc::set_handler(move || {
            if !stopping.swap(true, Ordering::SeqCst) {
                eprintln!("stopping: finishing the emails in progress");
                if let Some(sub) = weak.upgrade() {
                    sub.close();
                }
            }
        })?;
    }

    // A producer that keeps the pool busy until the stop (not with --once).
    let producer = (!once).then(|| {
        let (broker, emails, stopping) = (broker.clone(), emails.clone(), stopping.clone());
        std::thread::spawn(move || {
            for i in n.. {
                if stopping.load(Ordering::SeqCst) {
                    return;
                }
                if let Err(e) = broker.publish(&emails, email(i)) {
                    eprintln!("publish failed: {e}");
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        })
    });

    println!(
        "sending emails; {}",
        if once {
            "exits when 500 are sent"
        } else {
            "Ctrl-C to stop"
        }
    );
    let started = Instant::now();
    let sent = AtomicUsize::new(0);
    let ran = sub.run(16, |d| {
        // "Send" the email here: an `Err` returned (or a panic) retries it later.
        let _to = d.get("to_addr").and_then(|v| v.as_str());
        std::thread::sleep(Duration::from_millis(2));
        if sent.fetch_add(1, Ordering::Relaxed) + 1 == n && once {
            sub.close(); // --once: the 500 are sent
        }
        Ok::<(), std::io::Error>(())
    })?;
    stopping.store(true, Ordering::SeqCst);
    if let Some(p) = producer {
        p.join().expect("producer");
    }
    println!(
        "{} emails sent in {:?} ({} failed, {} panicked)",
        ran.acked,
        started.elapsed(),
        ran.failed,
        ran.panicked
    );

    // Every delivery is settled: shutdown returns at once, and the rows claimed ahead are
    // claimable again by the next run.
    match Arc::try_unwrap(sub) {
        Ok(sub) => sub.shutdown(Duration::from_secs(10))?,
        Err(sub) => sub.close(),
    }
    println!("stopped cleanly");
    Ok(())
}
