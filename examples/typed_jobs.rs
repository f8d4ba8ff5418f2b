//! Typed jobs with the handler runner (feature `serde`): jobs published as JSON from a struct,
//! read back into it by `Delivery::json`, on handler threads run by `Subscription::run`. A
//! payload that does not decode is retried, then dead-lettered with the reason.
//!
//! `cargo run --example typed_jobs --features serde` (SQLite, no server needed).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sqlbroker::{Broker, BrokerError, Message, RetryPolicy, Table};

#[derive(Debug, Serialize, Deserialize)]
struct Resize {
    image: String,
    width: u32,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let broker = Broker::connect("sqlite::memory:")?;
    // Two attempts at most: a job that fails twice is dead-lettered.
    let jobs = Table::new("resizes")
        .lease(Duration::from_secs(30))
        .max_attempts(2);
    broker.create_table(&jobs)?;

    for (image, width) in [("cat.png", 320), ("dog.png", 640), ("owl.png", 1024)] {
        let job = Resize {
            image: image.into(),
            width,
        };
        broker.publish(&jobs, Message::json(&job)?)?;
    }
    // A payload some older producer wrote: it is not a `Resize`.
    broker.publish(&jobs, Message::new(b"resize everything".to_vec()))?;

    let sub = broker
        .subscription(&jobs)
        .retry_policy(RetryPolicy::exponential(
            Duration::from_millis(200),
            Duration::from_millis(200),
        ))
        .start()?;
    let settled = AtomicUsize::new(0); // 3 resizes + 2 attempts of the bad payload
    let ran = sub.run(2, |d| -> Result<(), BrokerError> {
        let outcome = d.json::<Resize>().map(|job| {
            println!("resizing {} to {} px", job.image, job.width);
        });
        if let Err(e) = &outcome {
            println!("row {} attempt {}: {e}", d.id(), d.attempt());
        }
        if settled.fetch_add(1, Ordering::SeqCst) + 1 == 5 {
            sub.close();
        }
        outcome // Ok acks; Err fails the delivery by the retry policy
    })?;
    println!("{} acked, {} failed", ran.acked, ran.failed);
    sub.shutdown(Duration::from_secs(5))?;

    for dead in broker.dead_letters(&jobs, 10)? {
        println!(
            "dead letter: row {} after {} attempts: {}",
            dead.id, dead.attempts, dead.reason
        );
    }
    Ok(())
}
