//! The quickstart: a job queue on SQLite, no server needed.
//!
//! Publishes a batch of jobs, works them on four handler threads, retries the ones that fail
//! once, dead-letters the one that always fails, and prints what happened.
//!
//! Run it with `cargo run --example quickstart`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use sqlbroker::{Broker, Message, Table};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join(format!("sqlbroker-quickstart-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let url = format!("sqlite:{}", dir.join("jobs.db").display());
    let broker = Broker::connect(&url)?;

    // A lease table: a worker that dies loses its rows after 30 s, then they run again.
    let jobs = Table::new("jobs")
        .text_column("kind")
        .lease(Duration::from_secs(30));
    broker.create_table(&jobs)?;

    let kinds = [
        "resize", "email", "flaky", "resize", "email", "poison", "resize", "email",
    ];
    let messages = kinds
        .iter()
        .enumerate()
        .map(|(i, kind)| Message::new(format!("job #{i}").into_bytes()).set("kind", *kind));
    broker.publish_batch(&jobs, messages)?;
    println!("published {} jobs to {url}", kinds.len());

    let sub = Arc::new(broker.subscription(&jobs).workers(2).start()?);
    let log = Arc::new(Mutex::new(BTreeMap::<String, Vec<String>>::new()));

    let handlers: Vec<_> = (0..4)
        .map(|h| {
            let (sub, log) = (sub.clone(), log.clone());
            std::thread::spawn(move || -> sqlbroker::Result<()> {
                loop {
                    let d = match sub.next_delivery_timeout(Duration::from_millis(1500)) {
                        Ok(d) => d,
                        Err(_) => return Ok(()), // idle for 1.5 s, or closed
                    };
                    let body = String::from_utf8_lossy(d.payload()).into_owned();
                    let kind = d
                        .get("kind")
                        .and_then(|v| v.as_str())
                        .unwrap_or("?")
                        .to_string();
                    let outcome = match (kind.as_str(), d.attempt()) {
                        ("poison", _) => {
                            d.dead_letter("cannot be processed")?;
                            "dead-lettered".to_string()
                        }
                        ("flaky", 1) => {
                            d.retry()?;
                            "failed, retrying".to_string()
                        }
                        (_, n) => {
                            d.ack()?;
                            format!("done on attempt {n}")
                        }
                    };
                    log.lock()
                        .entry(body)
                        .or_default()
                        .push(format!("{kind}: {outcome} (handler {h})"));
                }
            })
        })
        .collect();
    for h in handlers {
        h.join().expect("handler thread")?;
    }
    if let Ok(sub) = Arc::try_unwrap(sub) {
        sub.shutdown(Duration::from_secs(5))?;
    }

    for (job, events) in log.lock().iter() {
        println!("{job}: {}", events.join("; "));
    }
    for dead in broker.dead_letters(&jobs, 10)? {
        println!(
            "dead letter: row {} ({}) after {} attempt(s)",
            dead.id, dead.reason, dead.attempts
        );
    }
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
