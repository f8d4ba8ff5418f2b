//! A service with several kinds of job in two tables, run by one worker: typed kinds
//! (`TypedJob`), named queues, a queue capped to one job at a time, and a graceful shutdown
//! that lets the jobs in progress finish and hands the rest back.
//!
//! Run it with `cargo run --example worker --features serde` (SQLite, no server needed).

use std::time::Duration;

use serde::{Deserialize, Serialize};
use sqlbroker::{Broker, Delivery, Message, Outcome, Table, TypedJob, Worker};

#[derive(Serialize, Deserialize)]
struct Welcome {
    email: String,
}

impl TypedJob for Welcome {
    const KIND: &'static str = "welcome_email";
}

#[derive(Serialize, Deserialize)]
struct Invoice {
    account: String,
    cents: u64,
}

impl TypedJob for Invoice {
    const KIND: &'static str = "invoice";
}

#[derive(Serialize, Deserialize)]
struct Thumbnail {
    image: String,
}

impl TypedJob for Thumbnail {
    const KIND: &'static str = "thumbnail";
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join(format!("sqlbroker-worker-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let url = format!("sqlite:{}", dir.join("jobs.db").display());
    let broker = Broker::connect(&url)?;

    // One table for the business jobs, in two named queues; one for the media jobs.
    let jobs = Table::new("jobs")
        .queues()
        .kinds()
        .lease(Duration::from_secs(30));
    let media = Table::new("media").kinds().lease(Duration::from_secs(60));
    broker.create_table(&jobs)?;
    broker.create_table(&media)?;

    for i in 0..5 {
        let welcome = Welcome {
            email: format!("user{i}@example.com"),
        };
        broker.publish(&jobs, Message::job(&welcome)?.queue("mail"))?;
        let invoice = Invoice {
            account: format!("a-{i}"),
            cents: 100 * (i + 1),
        };
        broker.publish(&jobs, Message::job(&invoice)?.queue("billing"))?;
        let thumb = Thumbnail {
            image: format!("img{i}.png"),
        };
        broker.publish(&media, Message::job(&thumb)?)?;
    }

    let worker = Worker::new(&broker)
        .job(&jobs, |w: Welcome, _d: &Delivery| {
            println!("mail: welcome {}", w.email);
            Ok::<(), std::io::Error>(())
        })
        .job(&jobs, |inv: Invoice, d: &Delivery| {
            if inv.cents > 400 {
                // Too large to bill automatically: kept for a person to look at.
                return Ok(Outcome::DeadLetter(format!(
                    "{} cents needs a review",
                    inv.cents
                )));
            }
            println!(
                "billing ({}): {} cents to {}",
                d.queue(),
                inv.cents,
                inv.account
            );
            Ok::<_, std::io::Error>(Outcome::Ack)
        })
        .job(&media, |t: Thumbnail, _d: &Delivery| {
            std::thread::sleep(Duration::from_millis(20));
            println!("media: thumbnail of {}", t.image);
            Ok::<(), std::io::Error>(())
        })
        // Billing talks to a provider that takes one call at a time from this process.
        .queues(&jobs, ["mail", "billing"])
        .queue_threads(&jobs, "billing", 1)
        .threads(4)
        .start()?;

    // A service runs until it is told to stop; this one stops once the queues are empty.
    let empty = |t: &Table| {
        broker
            .stats(t)
            .map(|s| s.ready + s.scheduled + s.in_flight.unwrap_or(0) == 0)
            .unwrap_or(false)
    };
    let started = std::time::Instant::now();
    while !(empty(&jobs) && empty(&media)) && started.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let ran = worker.shutdown(Duration::from_secs(10))?;
    for (table, kind, r) in ran.iter() {
        println!(
            "{table}/{kind}: {} acked, {} dead-lettered",
            r.acked, r.dead_lettered
        );
    }
    for (queue, s) in broker.queue_stats(&jobs)? {
        println!("queue {queue}: {} ready, {} dead", s.ready, s.dead);
    }
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
