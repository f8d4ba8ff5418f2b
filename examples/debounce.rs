//! Debounce-and-collect: the keystrokes of three users, typed side by side, become one job per
//! user's burst; each job's handler reads every keystroke of its burst, in the order typed.
//!
//! `cargo run --example debounce [url]` (default: an SQLite file in the temp directory; try
//! `postgres://postgres@127.0.0.1:5432/test` or `mysql://root@127.0.0.1:3306/test`).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use sqlbroker::{Broker, Message, Table};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let file = std::env::temp_dir().join(format!("sqlbroker-debounce-{}.db", std::process::id()));
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| format!("sqlite:{}", file.display()));
    let broker = Broker::connect(&url)?;
    let jobs = Table::new("example_debounce")
        .text_column("user")
        .lease(Duration::from_secs(30));
    let _ = broker.drop_table(&jobs); // a run before left it
    broker.create_table(&jobs)?;

    // A job runs once its user has typed nothing for a second, and at most 5 s after the
    // burst's first keystroke however fast they type.
    let (quiet, max_wait) = (Duration::from_secs(1), Duration::from_secs(5));
    let users = ["ann", "bob", "cy"];
    let words = ["hel", "hello", "hello wor", "hello world"];
    let sent = AtomicUsize::new(0);
    std::thread::scope(|s| {
        // One thread per user, as their requests would arrive, side by side.
        for user in users {
            let (broker, jobs, sent) = (&broker, &jobs, &sent);
            s.spawn(move || {
                for word in words {
                    let keystroke = Message::new(format!("{user}: {word}"))
                        .set("user", user)
                        .collect(user, quiet, max_wait);
                    broker.publish(jobs, keystroke).expect("publish");
                    sent.fetch_add(1, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(100)); // typing
                }
            });
        }
    });
    let sent = sent.into_inner();

    let sub = broker.subscription(&jobs).start()?;
    let seen = AtomicUsize::new(0);
    let runs: Mutex<BTreeMap<String, Vec<Vec<String>>>> = Mutex::default();
    let ran = sub.run(2, |d| {
        let user = d
            .get("user")
            .and_then(|v| v.as_str())
            .unwrap_or("?")
            .to_string();
        let burst: Vec<String> = d
            .collected()?
            .into_iter()
            .map(|e| String::from_utf8_lossy(&e).into_owned())
            .collect();
        println!(
            "job {} for {user}: {} keystrokes: {burst:?}",
            d.id(),
            burst.len()
        );
        if seen.fetch_add(burst.len(), Ordering::SeqCst) + burst.len() == sent {
            sub.close(); // every keystroke handled
        }
        runs.lock().entry(user).or_default().push(burst);
        Ok::<(), sqlbroker::BrokerError>(())
    })?;
    sub.shutdown(Duration::from_secs(5))?;

    let runs = runs.into_inner();
    for (user, bursts) in &runs {
        let all: Vec<&String> = bursts.iter().flatten().collect();
        assert_eq!(
            all.len(),
            words.len(),
            "{user}: a keystroke lost or doubled"
        );
        println!(
            "{user}: {} job(s) for {} keystrokes",
            bursts.len(),
            all.len()
        );
    }
    println!(
        "{sent} keystrokes, {} jobs, every keystroke in exactly one",
        ran.acked
    );
    broker.drop_table(&jobs)?;
    let _ = std::fs::remove_file(&file);
    Ok(())
}
