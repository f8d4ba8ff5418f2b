//! Debounce-and-collect (`Message::collect`): the events of a key published while their job
//! has not been claimed (nor become due) are one job, read in publish order with
//! `Delivery::collected`; exact across threads and brokers; the quiet, max_wait and cap rules;
//! bad input refused with nothing written; the keys' table swept.

mod common;

use std::collections::{HashMap, HashSet};
use std::time::{Duration, SystemTime};

use common::Db;
use sqlbroker::{BrokerError, Form, Message, Table, COLLECT_MAX_BYTES, COLLECT_MAX_EVENTS};

const LONG: Duration = Duration::from_secs(600);

fn event(key: &str, body: &str, quiet: Duration, max_wait: Duration) -> Message {
    Message::new(body.as_bytes().to_vec())
        .set("k", key)
        .collect(key, quiet, max_wait)
}

fn text(events: Vec<Vec<u8>>) -> Vec<String> {
    events
        .into_iter()
        .map(|e| String::from_utf8(e).unwrap())
        .collect()
}

/// Deletes the test table's keys' rows from the shared `sqlbroker_collect`.
fn forget_keys(live: &common::Live, t: &Table) {
    live.exec(&format!(
        "DELETE FROM sqlbroker_collect WHERE tbl = '{}'",
        t.name()
    ));
}

fn due_at(live: &common::Live, t: &Table, id: i64) -> SystemTime {
    live.broker.job(t, id).unwrap().expect("the job").due_at()
}

/// Four threads over two brokers publish 40 events each over three keys while nothing
/// claims: each key is one job (every publish of a key returned the same id), and its
/// handler reads exactly the events published to it, each once, each thread's in the order
/// it published them. Fails (more than one job per key, or events lost) without the key's
/// row lock that orders a key's publishes.
fn a_burst_is_one_job_in_publish_order(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let t = live.table(form, Duration::from_secs(30));
    let other = live.connect();
    let keys = ["a", "b", "c"];
    let quiet = Duration::from_secs(4);
    let published: Vec<(String, String, i64)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|w| {
                let (broker, t) = (if w % 2 == 0 { &live.broker } else { &other }, &t);
                s.spawn(move || {
                    let mut out = Vec::new();
                    for i in 0..40 {
                        let key = keys[(i + w) % keys.len()];
                        let body = format!("{w}-{i:03}");
                        let id = broker.publish(t, event(key, &body, quiet, LONG)).unwrap();
                        out.push((key.to_string(), body, id));
                    }
                    out
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    let mut job_of: HashMap<String, i64> = HashMap::new();
    for (key, _, id) in &published {
        assert_eq!(
            *job_of.entry(key.clone()).or_insert(*id),
            *id,
            "key {key} went into two jobs while nothing claimed"
        );
    }
    assert_eq!(live.rows(&t), 3, "one job per key");
    let sub = live.broker.subscription(&t).start().unwrap();
    let mut seen = HashSet::new();
    for _ in 0..3 {
        let d = common::next(&sub, Duration::from_secs(30));
        let events = text(d.collected().unwrap());
        let key = job_of
            .iter()
            .find(|(_, id)| **id == d.id())
            .map(|(k, _)| k.clone())
            .expect("a job some publish returned");
        let mut want: Vec<&str> = published
            .iter()
            .filter(|(k, _, _)| *k == key)
            .map(|(_, b, _)| b.as_str())
            .collect();
        let mut got: Vec<&str> = events.iter().map(String::as_str).collect();
        // Each thread's events in the order it published them.
        for w in 0..4 {
            let mine: Vec<&&str> = got
                .iter()
                .filter(|b| b.starts_with(&format!("{w}-")))
                .collect();
            assert!(
                mine.windows(2).all(|p| p[0] < p[1]),
                "thread {w}'s events out of order in key {key}: {mine:?}"
            );
        }
        got.sort_unstable();
        want.sort_unstable();
        assert_eq!(
            got, want,
            "key {key}: every event once, none of another key"
        );
        assert!(seen.insert(key));
        d.ack().unwrap();
    }
    assert_eq!(live.rows(&t), 0);
    sub.shutdown(Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("{e}"));
    forget_keys(&live, &t);
}
per_db_form!(a_burst_is_one_job_in_publish_order);

/// An event published while its key's job is claimed starts the next job, and so does one
/// published after the job's retry (requeued for later, never collecting again): the claimed
/// job reads the events before its claim only, each later event is in exactly one later job.
/// Fails (the later event joins the claimed or the retried job, and is lost to its handler)
/// without the append's "never claimed" check under the row's lock.
fn a_claim_mid_burst_starts_the_next_job(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let t = live.table(form, Duration::from_secs(30));
    let quiet = Duration::from_secs(1);
    let publish = |body: &str| {
        live.broker
            .publish(&t, event("k", body, quiet, LONG))
            .unwrap()
    };
    let first = publish("1");
    assert_eq!(publish("2"), first);
    let sub = live
        .broker
        .subscription(&t)
        .max_in_flight(1)
        .start()
        .unwrap();
    let d = common::next(&sub, Duration::from_secs(15));
    assert_eq!(d.id(), first);
    // Claimed, in work: the next events are the next job.
    let second = publish("3");
    assert_ne!(second, first, "an event joined a claimed job");
    assert_eq!(publish("4"), second);
    assert_eq!(text(d.collected().unwrap()), ["1", "2"]);
    // Retried for later: the job in work meanwhile is the second one.
    d.retry_after(Duration::from_secs(5)).unwrap();
    let d = common::next(&sub, Duration::from_secs(15));
    assert_eq!(
        (d.id(), text(d.collected().unwrap())),
        (second, vec!["3".into(), "4".into()])
    );
    d.ack().unwrap();
    let third = publish("5");
    assert_ne!(third, second);
    let mut left: HashMap<i64, Vec<String>> = HashMap::new();
    for _ in 0..2 {
        let d = common::next(&sub, Duration::from_secs(15));
        left.insert(d.id(), text(d.collected().unwrap()));
        d.ack().unwrap();
    }
    assert_eq!(left.remove(&first), Some(vec!["1".into(), "2".into()]));
    assert_eq!(left.remove(&third), Some(vec!["5".into()]));
    assert_eq!(live.rows(&t), 0);
    sub.shutdown(Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("{e}"));
    forget_keys(&live, &t);
}
per_db_form!(a_claim_mid_burst_starts_the_next_job);

/// A job whose retry put it back for later, claimed before the next event came: that event
/// starts a job of its own even though the retried job is not yet due. Fails (the event
/// joins the retried job) without `attempts = 0` in the append's check.
fn a_retried_job_collects_no_more(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let t = live.table(form, Duration::from_secs(30));
    let quiet = Duration::from_secs(1);
    let first = live
        .broker
        .publish(&t, event("k", "1", quiet, LONG))
        .unwrap();
    let sub = live
        .broker
        .subscription(&t)
        .max_in_flight(1)
        .start()
        .unwrap();
    let d = common::next(&sub, Duration::from_secs(15));
    d.retry_after(Duration::from_secs(30)).unwrap();
    assert!(
        due_at(&live, &t, first) > SystemTime::now(),
        "retried for later"
    );
    let next = live
        .broker
        .publish(&t, event("k", "2", quiet, LONG))
        .unwrap();
    assert_ne!(
        next, first,
        "an event joined a job already claimed and retried"
    );
    let d = common::next(&sub, Duration::from_secs(15));
    assert_eq!(
        (d.id(), text(d.collected().unwrap())),
        (next, vec!["2".to_string()])
    );
    d.ack().unwrap();
    sub.shutdown(Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("{e}"));
    forget_keys(&live, &t);
}
per_db_form!(a_retried_job_collects_no_more);

/// The quiet rule: each event moves the due time to `quiet` after it (whole seconds, rounded
/// up). The max_wait rule: never past `max_wait` after the first event; once due, the job
/// collects no more and the next event starts the next job. Fails (due times off by the
/// rule) if either bound is dropped from the due time an append writes.
fn quiet_and_max_wait_set_the_due_time(db: Db) {
    let Some(live) = common::live(db) else { return };
    let t = live.table(Form::Lease, Duration::from_secs(30));
    let (quiet, max) = (Duration::from_secs(3), Duration::from_secs(4));
    let publish = |body: &str| {
        let before = SystemTime::now();
        let id = live
            .broker
            .publish(&t, event("k", body, quiet, max))
            .unwrap();
        (id, before, SystemTime::now())
    };
    let (job, t0, t0_after) = publish("1");
    let due = due_at(&live, &t, job);
    assert!(
        due >= common::ceil_secs(t0 + quiet) && due <= common::ceil_secs(t0_after + quiet),
        "first event: due {due:?}, not quiet after it"
    );
    std::thread::sleep(Duration::from_millis(600));
    let (again, t1, t1_after) = publish("2");
    assert_eq!(again, job);
    let due = due_at(&live, &t, job);
    assert!(
        due >= common::ceil_secs(t1 + quiet) && due <= common::ceil_secs(t1_after + quiet),
        "second event: due {due:?}, not quiet after it"
    );
    // Past a second after the first event, quiet after the event is past max_wait after the
    // first: max_wait wins.
    std::thread::sleep(Duration::from_millis(1_600));
    let (again, t2, _) = publish("3");
    assert_eq!(again, job);
    assert!(common::ceil_secs(t2 + quiet) > common::ceil_secs(t0_after + max));
    let due = due_at(&live, &t, job);
    assert!(
        due >= common::ceil_secs(t0 + max) && due <= common::ceil_secs(t0_after + max),
        "third event: due {due:?}, not max_wait after the first"
    );
    // Once due (nothing claims here), the next event starts the next job.
    assert!(common::wait_for(
        Duration::from_secs(10),
        || SystemTime::now() > due + Duration::from_millis(1_100)
    ));
    let (next, _, _) = publish("4");
    assert_ne!(next, job, "an event joined a job already due");
    let sub = live.broker.subscription(&t).start().unwrap();
    let mut got = HashMap::new();
    for _ in 0..2 {
        let d = common::next(&sub, Duration::from_secs(15));
        got.insert(d.id(), text(d.collected().unwrap()));
        d.ack().unwrap();
    }
    assert_eq!(got[&job], ["1", "2", "3"]);
    assert_eq!(got[&next], ["4"]);
    sub.shutdown(Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("{e}"));
    forget_keys(&live, &t);
}
per_db!(quiet_and_max_wait_set_the_due_time);

/// A job holds at most COLLECT_MAX_EVENTS events: the one that fills it makes it due at
/// once, the next starts the next job. And at most COLLECT_MAX_BYTES: an event that would
/// not fit starts the next job and makes the full one due. Fails (one job of 1,001 events,
/// or a full job still waiting its quiet) without the cap.
fn the_cap_starts_the_next_job(db: Db) {
    let Some(live) = common::live(db) else { return };
    let t = live.table(Form::Lease, Duration::from_secs(30));
    let publish = |key: &str, body: Vec<u8>| {
        live.broker
            .publish(
                &t,
                Message::new(body).set("k", key).collect(key, LONG, LONG),
            )
            .unwrap()
    };
    let first = publish("n", b"0".to_vec());
    for i in 1..COLLECT_MAX_EVENTS {
        assert_eq!(publish("n", i.to_string().into_bytes()), first, "event {i}");
    }
    assert!(
        due_at(&live, &t, first) <= SystemTime::now(),
        "a full job waits"
    );
    let next = publish("n", b"last".to_vec());
    assert_ne!(next, first);
    assert!(due_at(&live, &t, next) > SystemTime::now() + Duration::from_secs(60));
    // Bytes: three events of a third of the bound fit, the fourth does not.
    let big = |c: u8| vec![c; COLLECT_MAX_BYTES / 3 - 8];
    let b1 = publish("b", big(1));
    assert_eq!(publish("b", big(2)), b1);
    assert_eq!(publish("b", big(3)), b1);
    let b2 = publish("b", big(4));
    assert_ne!(b2, b1);
    assert!(
        due_at(&live, &t, b1) <= SystemTime::now(),
        "a full job waits"
    );
    let sub = live.broker.subscription(&t).start().unwrap();
    let mut got = HashMap::new();
    while got.len() < 2 {
        let d = common::next(&sub, Duration::from_secs(15));
        got.insert(d.id(), d.collected().unwrap());
        d.ack().unwrap();
    }
    let n = &got[&first];
    assert_eq!(n.len(), COLLECT_MAX_EVENTS);
    assert!(n
        .iter()
        .enumerate()
        .all(|(i, e)| *e == i.to_string().into_bytes()));
    assert_eq!(got[&b1], [big(1), big(2), big(3)]);
    sub.shutdown(Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("{e}"));
    forget_keys(&live, &t);
}
per_db!(the_cap_starts_the_next_job);

/// Bad input is refused with InvalidMessage before anything is written: an empty key, a key
/// over 255 characters or with a NUL, a zero quiet, a max_wait shorter than the quiet, an
/// event over the bound, a delay, a dedup key, a job to wait on, and a collected message in
/// a batch. Fails (a row or a key's row made) if a check is dropped.
fn bad_input_changes_nothing(db: Db) {
    let Some(live) = common::live(db) else { return };
    let t = live.table(Form::Lease, Duration::from_secs(30));
    let s = Duration::from_secs(1);
    // One good event, so the keys' table exists and holds this table's one key.
    live.broker.publish(&t, event("good", "1", s, s)).unwrap();
    let m = || Message::new(b"x".to_vec()).set("k", "k");
    let bad = [
        m().collect("", s, s),
        m().collect("k".repeat(256), s, s),
        m().collect("a\0b", s, s),
        m().collect("k", Duration::ZERO, s),
        m().collect("k", s * 2, s),
        Message::new(vec![0; COLLECT_MAX_BYTES])
            .set("k", "k")
            .collect("k", s, s),
        m().collect("k", s, s).deliver_after(s),
        m().collect("k", s, s).deliver_at(SystemTime::now() + s),
        m().collect("k", s, s).after(1),
    ];
    for (i, msg) in bad.into_iter().enumerate() {
        match live.broker.publish(&t, msg) {
            Err(BrokerError::InvalidMessage { .. }) => {}
            other => panic!("bad message {i} was {other:?}"),
        }
    }
    let dedup = live.create(
        common::describe(&common::unique("t"), Form::Lease, Duration::from_secs(30)).dedup(),
    );
    match live
        .broker
        .publish(&dedup, m().dedup_key("d").collect("k", s, s))
    {
        Err(BrokerError::InvalidMessage { reason, .. }) => assert!(reason.contains("dedup")),
        other => panic!("a collected message with a dedup key was {other:?}"),
    }
    match live.broker.publish_batch(&t, [m().collect("k", s, s)]) {
        Err(BrokerError::InvalidMessage { reason, .. }) => {
            assert!(reason.contains("Broker::publish alone"))
        }
        other => panic!("a collected message in a batch was {other:?}"),
    }
    assert_eq!(live.rows(&t), 1);
    assert_eq!(live.rows(&dedup), 0);
    let keys = live.int(&format!(
        "SELECT COUNT(*) FROM sqlbroker_collect WHERE tbl = '{}'",
        t.name()
    ));
    assert_eq!(keys, 1, "a refused message made a key's row");
    forget_keys(&live, &t);
}
per_db!(bad_input_changes_nothing);

/// A key's row due over a minute ago is deleted by the sweep a broker's collect publish runs;
/// the key's row of a job still collecting stays. Fails (the stale row stays) without the
/// sweep.
fn the_keys_table_is_swept(db: Db) {
    let Some(live) = common::live(db) else { return };
    let t = live.table(Form::Lease, Duration::from_secs(30));
    let s = Duration::from_secs(30);
    live.broker.publish(&t, event("live", "1", s, s)).unwrap();
    let stale = format!(
        "INSERT INTO sqlbroker_collect (tbl, ckey, job, first_ms, due) VALUES ('{}', 'stale', \
         1, 0, 1)",
        t.name()
    );
    live.exec(&stale);
    let count = |key: &str| {
        live.int(&format!(
            "SELECT COUNT(*) FROM sqlbroker_collect WHERE tbl = '{}' AND ckey = '{key}'",
            t.name()
        ))
    };
    assert_eq!(count("stale"), 1);
    // A broker of its own sweeps on its first collect publish.
    let other = live.connect();
    other.publish(&t, event("live", "2", s, s)).unwrap();
    assert_eq!(count("stale"), 0, "a stale key's row stayed");
    assert_eq!(count("live"), 1);
    forget_keys(&live, &t);
}
per_db!(the_keys_table_is_swept);

/// Events published over four seconds (longer than max_wait, rounded up to whole seconds) by three threads on two
/// brokers while a worker claims and acks the jobs as they come due: every event is
/// delivered exactly once, in the job its publish returned, each thread's events in order
/// within a job and its jobs in publish order; a key's burst is several jobs (max_wait), so
/// events came while its jobs were claimed. Fails (an event lost, twice, or in another job
/// than its publish said) if the append can pass a claim.
fn a_worker_claims_mid_burst(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let t = live.table(form, Duration::from_secs(30));
    let other = live.connect();
    let (quiet, max) = (Duration::from_secs(1), Duration::from_secs(2));
    let sub = live.broker.subscription(&t).start().unwrap();
    let delivered: std::sync::Mutex<Vec<(i64, Vec<String>)>> = Default::default();
    let done = std::sync::atomic::AtomicBool::new(false);
    let published: Vec<(usize, String, i64)> = std::thread::scope(|s| {
        let (sub, delivered, done) = (&sub, &delivered, &done);
        s.spawn(move || loop {
            match sub.next_delivery_timeout(Duration::from_millis(200)) {
                Ok(d) => {
                    std::thread::sleep(Duration::from_millis(50)); // held while events come
                    let events = text(d.collected().unwrap());
                    let id = d.id();
                    d.ack().unwrap();
                    delivered.lock().unwrap().push((id, events));
                }
                Err(_) if done.load(std::sync::atomic::Ordering::SeqCst) => return,
                Err(_) => {}
            }
        });
        // The worker stops when this scope ends, a failed assertion's unwinding included.
        let _stop = Stop(done);
        let handles: Vec<_> = (0..3)
            .map(|w| {
                let (broker, t) = (if w == 1 { &other } else { &live.broker }, &t);
                s.spawn(move || {
                    let mut out = Vec::new();
                    for i in 0..40 {
                        let key = ["x", "y"][i % 2];
                        let body = format!("{w}-{key}-{i:03}");
                        let id = broker.publish(t, event(key, &body, quiet, max)).unwrap();
                        out.push((w, body, id));
                        std::thread::sleep(Duration::from_millis(100));
                    }
                    out
                })
            })
            .collect();
        let published: Vec<_> = handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect();
        assert!(
            common::wait_for(Duration::from_secs(30), || {
                delivered
                    .lock()
                    .unwrap()
                    .iter()
                    .map(|(_, e)| e.len())
                    .sum::<usize>()
                    >= published.len()
            }),
            "not every event was delivered"
        );
        std::thread::sleep(Duration::from_millis(500)); // a delivery too many would show
        published
    });
    let delivered = delivered.into_inner().unwrap();
    let mut job_of_event: HashMap<String, i64> = HashMap::new();
    for (id, events) in &delivered {
        for w in 0..3 {
            let mine: Vec<&String> = events
                .iter()
                .filter(|e| e.starts_with(&format!("{w}-")))
                .collect();
            assert!(
                mine.windows(2).all(|p| p[0] < p[1]),
                "job {id}: {mine:?} out of order"
            );
        }
        for e in events {
            assert!(
                job_of_event.insert(e.clone(), *id).is_none(),
                "{e} delivered twice"
            );
        }
    }
    assert_eq!(
        job_of_event.len(),
        published.len(),
        "an event lost or unknown"
    );
    for (_, body, id) in &published {
        assert_eq!(
            job_of_event.get(body),
            Some(id),
            "{body} not in the job its publish named"
        );
    }
    for w in 0..3 {
        for key in ["x", "y"] {
            let ids: Vec<i64> = published
                .iter()
                .filter(|(pw, b, _)| *pw == w && b.contains(&format!("-{key}-")))
                .map(|(_, _, id)| *id)
                .collect();
            assert!(
                ids.windows(2).all(|p| p[0] <= p[1]),
                "thread {w} key {key}: {ids:?}"
            );
        }
    }
    let jobs: HashSet<i64> = published.iter().map(|(_, _, id)| *id).collect();
    assert!(
        jobs.len() >= 4,
        "4 s of events in 2 keys with a max_wait of 2 s made {} jobs",
        jobs.len()
    );
    sub.shutdown(Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("{e}"));
    forget_keys(&live, &t);
}
per_db_form!(a_worker_claims_mid_burst);

/// Sets its flag when dropped.
struct Stop<'a>(&'a std::sync::atomic::AtomicBool);

impl Drop for Stop<'_> {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}
