//! A periodic job (feature `cron`): two processes of a service run the same schedule, and each
//! tick is published once. Here two brokers on one SQLite file stand for the two processes.
//!
//! `cargo run --example periodic --features cron [url]` (default: an SQLite file in the temp
//! directory; any server URL works too). Runs for about 7 seconds.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use sqlbroker::{Broker, Message, Table};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let file = std::env::temp_dir().join(format!("sqlbroker-periodic-{}.db", std::process::id()));
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| format!("sqlite:{}", file.display()));
    // Dedup keys are required: the tick is in each row's key, so a tick makes one row.
    let reports = Table::new("example_reports")
        .dedup()
        .lease(Duration::from_secs(30));
    let (a, b) = (Broker::connect(&url)?, Broker::connect(&url)?);
    a.create_table(&reports)?;

    // Every two seconds (six fields: seconds first; five fields start at minutes, e.g.
    // "0 3 * * *" for 03:00 UTC daily). The closure builds the tick's message from the tick.
    let report = |tick: SystemTime| {
        let secs = tick
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        Message::new(format!("report for tick {secs}"))
    };
    let in_a = a
        .periodic(&reports, "*/2 * * * * *", report)
        .name("report")
        .start()?;
    // The other process opens the table by name: its description is recorded in the database.
    let reports_in_b = b.open_table("example_reports")?;
    let in_b = b
        .periodic(&reports_in_b, "*/2 * * * * *", report)
        .name("report")
        .start()?;

    let sub = a.subscription(&reports).start()?;
    let until = Instant::now() + Duration::from_secs(7);
    while Instant::now() < until {
        if let Ok(d) = sub.next_delivery_timeout(Duration::from_millis(200)) {
            println!("{}", String::from_utf8_lossy(d.payload()));
            d.ack()?;
        }
    }
    // Stopping is prompt; the next tick, already published, stays for whoever runs next.
    in_a.stop();
    in_b.stop();
    sub.shutdown(Duration::from_secs(5))?;
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", file.display()));
    }
    Ok(())
}
