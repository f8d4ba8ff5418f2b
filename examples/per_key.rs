//! Per-key serialisation with the advisory lock form: payments of one account run one at a
//! time, different accounts in parallel.
//!
//! `cargo run --example per_key [url]` (default: an SQLite file in the temp directory; try
//! `postgres://postgres@127.0.0.1:5432/test` or `mysql://root@127.0.0.1:3306/test`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use sqlbroker::{Broker, Message, Table};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let default = format!(
        "sqlite:{}",
        std::env::temp_dir().join("sqlbroker-per-key.db").display()
    );
    let url = std::env::args().nth(1).unwrap_or(default);
    let broker = Broker::connect(&url)?;
    let payments = Table::new("example_payments")
        .text_column("account")
        .int_column("cents")
        .advisory_lock("accounts-{account}");
    broker.create_table(&payments)?;
    let accounts = ["a-1", "a-2", "a-3"];
    broker.publish_batch(
        &payments,
        (0..30)
            .map(|i| {
                Message::new(Vec::new())
                    .set("account", accounts[i % 3])
                    .set("cents", i as i64)
            })
            .collect::<Vec<_>>(),
    )?;

    let sub = Arc::new(broker.subscription(&payments).workers(4).start()?);
    let in_work: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
    let handlers: Vec<_> = (0..6)
        .map(|_| {
            let (sub, in_work) = (sub.clone(), in_work.clone());
            std::thread::spawn(move || loop {
                let d = match sub.next_delivery_timeout(Duration::from_secs(1)) {
                    Ok(d) => d,
                    Err(_) => return, // idle, or closed
                };
                let account = d
                    .get("account")
                    .and_then(|v| v.as_str())
                    .unwrap_or_default()
                    .to_string();
                let now = {
                    let mut w = in_work.lock();
                    let n = w.entry(account.clone()).or_default();
                    *n += 1;
                    *n
                };
                assert_eq!(now, 1, "two payments of one account at once");
                std::thread::sleep(Duration::from_millis(20)); // the payment
                *in_work.lock().get_mut(&account).expect("entry") -= 1;
                d.ack().expect("ack");
            })
        })
        .collect();
    for h in handlers {
        h.join().expect("handler");
    }
    println!("30 payments over 3 accounts, never two of one account at once");
    if let Ok(sub) = Arc::try_unwrap(sub) {
        sub.shutdown(Duration::from_secs(5))?;
    }
    Ok(())
}
