//! Jobs that compose: an order's steps one after another ("charge, then ship, then email"), a
//! batch of image jobs with one callback that reads how each ended, and a failed step that
//! dead-letters the steps after it.
//!
//! `cargo run --example pipeline [url]` (default: an SQLite file in the temp directory; try
//! `postgres://postgres@127.0.0.1:5432/test` or `mysql://root@127.0.0.1:3306/test`).

use std::time::Duration;

use sqlbroker::{Broker, JobOutcome, JobState, Message, Table};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let default = format!(
        "sqlite:{}",
        std::env::temp_dir().join("sqlbroker-pipeline.db").display()
    );
    let url = std::env::args().nth(1).unwrap_or(default);
    let broker = Broker::connect(&url)?;
    let jobs = Table::new("example_pipeline")
        .dependencies()
        .lease(Duration::from_secs(30));
    broker.create_table(&jobs)?;
    let step = |body: &str| Message::new(body.as_bytes().to_vec());

    // Two orders, each a chain published whole; the second's card is declined.
    let mut orders = Vec::new();
    for order in ["order-1", "order-2-declined"] {
        orders.push(broker.publish_group(|g| {
            let charge = g.publish(&jobs, step(&format!("charge {order}")))?;
            let ship = g.publish(&jobs, step(&format!("ship {order}")).after(charge))?;
            let email = g.publish(&jobs, step(&format!("email {order}")).after(ship))?;
            Ok([charge, ship, email])
        })?);
    }
    // A batch of images and the album built once every image has settled, however.
    let album = broker.publish_group(|g| {
        let mut album = step("build the album");
        for image in ["a.jpg", "b.jpg", "corrupt.jpg", "d.jpg"] {
            album = album.after_settled(g.publish(&jobs, step(&format!("resize {image}")))?);
        }
        g.publish(&jobs, album)
    })?;
    println!("published: {:?}", broker.stats(&jobs)?);

    let sub = broker.subscription(&jobs).start()?;
    let mut ran = Vec::new();
    while let Ok(d) = sub.next_delivery_timeout(Duration::from_secs(2)) {
        let what = String::from_utf8_lossy(d.payload()).into_owned();
        ran.push(what.clone());
        if what.contains("declined") && what.starts_with("charge") {
            println!("{what}: declined, dead-lettered");
            d.dead_letter("card declined")?;
        } else if what.contains("corrupt") {
            println!("{what}: failed, dead-lettered");
            d.dead_letter("corrupt image")?;
        } else if d.id() == album {
            let outcomes: Vec<_> = d.waited_on()?.into_iter().map(|w| w.outcome).collect();
            let resized = outcomes
                .iter()
                .filter(|o| **o == Some(JobOutcome::Acked))
                .count();
            println!("{what}: {resized} of {} images resized", outcomes.len());
            d.ack()?;
        } else {
            println!("{what}");
            d.ack()?;
        }
    }
    sub.shutdown(Duration::from_secs(5))?;

    // The declined order's later steps never ran: dead-lettered, naming the step before.
    for id in &orders[1][1..] {
        let job = broker.job(&jobs, *id)?.expect("kept while dead");
        assert_eq!(job.state(), JobState::Dead);
        println!("job {id}: {}", job.dead_reason().unwrap_or("-"));
    }
    assert!(!ran.iter().any(|r| r == "ship order-2-declined"));
    let at = |what: &str| ran.iter().position(|r| r.starts_with(what));
    assert!(
        at("resize").is_some() && ran.iter().rposition(|r| r.starts_with("resize")) < at("build")
    );
    broker.purge_all_dead(&jobs)?;
    Ok(())
}
