//! Jobs that compose: an order's steps one after another ("charge, then ship, then email"), a
//! batch of image jobs with one callback that reads how each ended and what each produced, a
//! failed step that dead-letters the steps after it, and a long step that saves checkpoints.
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
        .outputs()
        .checkpoints()
        .lease(Duration::from_secs(30));
    // Creates the table, or brings one an earlier run made up to this description.
    broker.migrate(&jobs)?;
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
        } else if let Some(image) = what.strip_prefix("resize ") {
            // What the callback reads, whether or not this row is kept.
            d.set_output(format!("thumbs/{image}").as_bytes())?;
            println!("{what}");
            d.ack()?;
        } else if d.id() == album {
            let waited = d.waited_on()?;
            let thumbs: Vec<String> = waited
                .iter()
                .filter(|w| w.outcome == Some(JobOutcome::Acked))
                .filter_map(|w| w.output.as_deref())
                .map(|o| String::from_utf8_lossy(o).into_owned())
                .collect();
            println!(
                "{what}: {} of {} images resized",
                thumbs.len(),
                waited.len()
            );
            // A long step: each page saved as it is done, so a crash resumes at the next one.
            let from = d.last_checkpoint().map_or(0, |c| c.len());
            for (page, thumb) in thumbs.iter().enumerate().skip(from) {
                println!("  album page {}: {thumb}", page + 1);
                d.checkpoint(&vec![b'#'; page + 1])?;
            }
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
