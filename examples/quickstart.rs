//! The quickstart: a job queue on SQLite, no server needed.
//!
//! Publishes a batch of jobs, works them on four handler threads, retries the one that fails
//! once, dead-letters the one that can never succeed, and prints what happened.
//!
//! Run it with `cargo run --example quickstart`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use sqlbroker::{Broker, Message, Outcome, Table};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join(format!("sqlbroker-quickstart-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    // An SQLite file (`sqlite::memory:` keeps the queue in memory, for tests).
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

    let sub = broker.subscription(&jobs).start()?;
    let log = Mutex::new(Vec::new());
    let finished = AtomicUsize::new(0);
    // Four handler threads. `Ok` acks; `Err` fails the job (retried by the retry policy, one
    // second first); an `Outcome` says what else to do.
    let ran = sub.run(4, |d| {
        let kind = d.get("kind").and_then(|v| v.as_str()).unwrap_or("?");
        let body = String::from_utf8_lossy(d.payload());
        log.lock()
            .unwrap()
            .push(format!("{body} ({kind}), attempt {}", d.attempt()));
        let outcome = match (kind, d.attempt()) {
            ("poison", _) => Outcome::DeadLetter("cannot be processed".into()),
            ("flaky", 1) => return Err("the first attempt fails"),
            _ => Outcome::Ack,
        };
        if finished.fetch_add(1, Ordering::SeqCst) + 1 == kinds.len() {
            sub.close(); // every job acked or dead-lettered: the example is done
        }
        Ok(outcome)
    })?;
    sub.shutdown(Duration::from_secs(5))?;

    for line in log.lock().unwrap().iter() {
        println!("{line}");
    }
    println!(
        "{} acked, {} failed and retried, {} dead-lettered",
        ran.acked, ran.failed, ran.dead_lettered
    );
    for dead in broker.dead_letters(&jobs, 10)? {
        println!(
            "dead letter: row {} ({}) after {} attempt(s)",
            dead.id, dead.reason, dead.attempts
        );
    }
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
