//! Concurrent claimers never share a row: independent brokers (separate pools, as separate
//! processes would have), several claim workers each, 8 handler threads, 2,000 rows. Its own
//! test binary, so its load does not disturb the timing-sensitive suites.

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::Db;
use sqlbroker::{Form, Message, NextError, Subscription};

const ROWS: usize = 2000;
const BROKERS: usize = 4;
const WORKERS: usize = 2;
const HANDLERS_PER_BROKER: usize = 2;
const DEADLINE: Duration = Duration::from_secs(120);

fn concurrent_claimers_never_share_a_row(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    // A lease long enough that none expires: every redelivery would be a bug.
    let t = live.table(form, Duration::from_secs(600));
    let msgs: Vec<Message> = (0..ROWS)
        .map(|i| Message::new(format!("{i}").into_bytes()).set("k", format!("k{i}")))
        .collect();
    live.broker.publish_batch(&t, msgs).unwrap();
    assert_eq!(live.rows(&t), ROWS as i64);

    let brokers: Vec<_> = (0..BROKERS).map(|_| live.connect()).collect();
    let subs: Vec<Subscription> = brokers
        .iter()
        .map(|b| b.subscription(&t).workers(WORKERS).start().unwrap())
        .collect();

    let in_work = Mutex::new(HashSet::new());
    let delivered = Mutex::new(HashMap::<i64, u32>::new());
    let acked = AtomicUsize::new(0);
    let problems = Mutex::new(Vec::<String>::new());
    let started = Instant::now();
    std::thread::scope(|s| {
        for sub in &subs {
            for _ in 0..HANDLERS_PER_BROKER {
                s.spawn(|| {
                    while acked.load(Ordering::SeqCst) < ROWS && started.elapsed() < DEADLINE {
                        let d = match sub.next_delivery_timeout(Duration::from_millis(200)) {
                            Ok(d) => d,
                            Err(NextError::Timeout | NextError::Empty) => continue,
                            Err(_) => {
                                problems
                                    .lock()
                                    .unwrap()
                                    .push(format!("closed: {:?}", sub.last_error()));
                                return;
                            }
                        };
                        let id = d.id();
                        if !in_work.lock().unwrap().insert(id) {
                            problems
                                .lock()
                                .unwrap()
                                .push(format!("row {id} delivered while in work"));
                        }
                        *delivered.lock().unwrap().entry(id).or_default() += 1;
                        if d.attempt() != 1 {
                            problems
                                .lock()
                                .unwrap()
                                .push(format!("row {id} attempt {}", d.attempt()));
                        }
                        if d.payload() != id_payload(&d).as_bytes() {
                            problems
                                .lock()
                                .unwrap()
                                .push(format!("row {id}: payload and values mixed up"));
                        }
                        if id % 7 == 0 {
                            // Hold some rows a little so claims overlap with work in progress.
                            std::thread::sleep(Duration::from_millis(1));
                        }
                        match d.ack() {
                            Ok(()) => {
                                acked.fetch_add(1, Ordering::SeqCst);
                            }
                            Err(e) => problems
                                .lock()
                                .unwrap()
                                .push(format!("ack of row {id}: {e}")),
                        }
                        in_work.lock().unwrap().remove(&id);
                    }
                });
            }
        }
    });
    let took = started.elapsed();
    for sub in subs {
        sub.shutdown(Duration::from_secs(5)).unwrap();
    }
    eprintln!(
        "{db:?} {}: {ROWS} rows through {BROKERS} brokers in {took:?}",
        form.name()
    );
    let problems = problems.into_inner().unwrap();
    assert!(
        problems.is_empty(),
        "{} problems, first: {:?}",
        problems.len(),
        &problems[..problems.len().min(10)]
    );
    let delivered = delivered.into_inner().unwrap();
    assert_eq!(
        acked.load(Ordering::SeqCst),
        ROWS,
        "not every row was acked within {DEADLINE:?}"
    );
    assert_eq!(delivered.len(), ROWS, "rows delivered: {}", delivered.len());
    let twice: Vec<_> = delivered.iter().filter(|(_, n)| **n != 1).collect();
    assert!(twice.is_empty(), "rows delivered more than once: {twice:?}");
    assert_eq!(live.rows(&t), 0, "rows left in the table");
    assert!(live.broker.dead_letters(&t, 10).unwrap().is_empty());
}

/// The payload each row was published with: its `k` without the leading `k`.
fn id_payload(d: &sqlbroker::Delivery) -> String {
    d.get("k")
        .and_then(|v| v.as_str())
        .unwrap_or_default()
        .trim_start_matches('k')
        .to_string()
}
per_db_form!(concurrent_claimers_never_share_a_row);
