//! Debounce-and-collect (`Message::collect`): the events of a key published while their job
//! has not been claimed (nor become due) are one job, read in publish order with
//! `Delivery::collected`; exact across threads and brokers; the quiet, max_wait and cap rules;
//! bad input refused with nothing written; the keys' table swept.

mod common;

use std::collections::{HashMap, HashSet};
use std::time::{Duration, SystemTime};

use common::Db;
use sqlbroker::{
    Broker, BrokerError, Database, Form, JobUpdate, Message, Table, COLLECT_MAX_BYTES,
    COLLECT_MAX_EVENTS,
};

const LONG: Duration = Duration::from_secs(600);

fn event(key: &str, body: &str, quiet: Duration, max_wait: Duration) -> Message {
    Message::new(body.as_bytes().to_vec())
        .set("k", key)
        .collect(key, quiet, max_wait)
}

/// Publishes `body` as an event of `key` (quiet and max_wait long): the job it went into.
fn publish_bytes(live: &common::Live, t: &Table, key: &str, body: Vec<u8>) -> i64 {
    live.broker
        .publish(t, Message::new(body).set("k", key).collect(key, LONG, LONG))
        .unwrap()
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
    let publish = |key: &str, body: Vec<u8>| publish_bytes(&live, &t, key, body);
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

// The edges a review found (7 December): each seen failing before its fix.

/// P39/README "Where the events are ... The job takes its first event's column values, queue,
/// kind and priority; a later event adds its payload only" and Broker::publish: "Nothing is
/// written on any error: InvalidMessage: ... a value for a column the table does not
/// describe". The options a first event is refused for must be refused for a later event
/// too (or be documented as ignored): a message invalid on its own must not be accepted
/// because its key's job exists. Fails (the later event is accepted and appended) for each
/// option the append path never checks.
fn later_event_is_validated_as_the_first(db: Db) {
    let Some(live) = common::live(db) else { return };
    let t = live.table(Form::Lease, Duration::from_secs(30));
    let s = Duration::from_secs(30);
    let m = |key: &str| Message::new(b"x".to_vec()).set("k", key);
    type Bad = (&'static str, Box<dyn Fn(Message) -> Message>);
    let bad: Vec<Bad> = vec![
        ("unknown column", Box::new(|m: Message| m.set("nope", 1i64))),
        (
            "int in a text column",
            Box::new(|m: Message| m.set("k", 5i64)),
        ),
        (
            "priority on a table without priorities",
            Box::new(|m: Message| m.priority(3)),
        ),
        (
            "unique_for without dedup key",
            Box::new(|m: Message| m.unique_for(Duration::from_secs(5))),
        ),
        (
            "replace_waiting without dedup key",
            Box::new(|m: Message| m.replace_waiting()),
        ),
        (
            "after_signal on a table without dependencies",
            Box::new(|m: Message| m.after_signal("sig")),
        ),
        (
            "wait_timeout without after_signal",
            Box::new(|m: Message| m.wait_timeout(Duration::from_secs(1))),
        ),
        (
            "invalid traceparent",
            Box::new(|m: Message| m.traceparent("not-a-traceparent")),
        ),
        (
            "queue on a table without queues",
            Box::new(|m: Message| m.queue("q1")),
        ),
        (
            "kind on a table without kinds",
            Box::new(|m: Message| m.kind("kind1")),
        ),
    ];
    let mut accepted = Vec::new();
    for (i, (what, f)) in bad.iter().enumerate() {
        // As a first event: refused?
        let fresh = format!("first{i}");
        let first = live
            .broker
            .publish(&t, f(m(&fresh)).collect(fresh.as_str(), s, s));
        let first_refused = matches!(first, Err(BrokerError::InvalidMessage { .. }));
        // As a later event of a key whose job collects.
        let key = format!("later{i}");
        let job = live
            .broker
            .publish(&t, m(&key).collect(key.as_str(), s, s))
            .unwrap();
        let before = live
            .broker
            .job(&t, job)
            .unwrap()
            .unwrap()
            .payload()
            .to_vec();
        let later = live
            .broker
            .publish(&t, f(m(&key)).collect(key.as_str(), s, s));
        let after = live
            .broker
            .job(&t, job)
            .unwrap()
            .unwrap()
            .payload()
            .to_vec();
        if first_refused && !matches!(later, Err(BrokerError::InvalidMessage { .. })) {
            accepted.push(format!(
                "{what}: first event refused, later event {later:?} (payload {} -> {} bytes)",
                before.len(),
                after.len()
            ));
        }
    }
    forget_keys(&live, &t);
    assert!(
        accepted.is_empty(),
        "{db:?}: refused as a first event, accepted as a later one:\n{}",
        accepted.join("\n")
    );
}
per_db!(later_event_is_validated_as_the_first);

/// "Refused with InvalidMessage, nothing written ... with a delay, a dedup key or `after`":
/// and `after_signal` (a wait of its own) on a table with dependencies must either work or be
/// refused; as a first event it is refused, but a *later* event with after_signal must not
/// join silently. Also checks the error is typed and the key's job unchanged.
fn after_signal_on_a_dependencies_table(db: Db) {
    let Some(live) = common::live(db) else { return };
    let t = live.create(
        common::describe(&common::unique("rvc"), Form::Lease, Duration::from_secs(30))
            .dependencies(),
    );
    let s = Duration::from_secs(30);
    let first = live
        .broker
        .publish(&t, event("k0", "1", s, s).after_signal("go"));
    let job = live.broker.publish(&t, event("k", "1", s, s)).unwrap();
    let later = live
        .broker
        .publish(&t, event("k", "2", s, s).after_signal("go"));
    let n = live.broker.job(&t, job).unwrap().unwrap().payload().len();
    live.forget_deps(t.name());
    forget_keys(&live, &t);
    assert!(
        matches!(first, Err(BrokerError::InvalidMessage { .. })),
        "first: {first:?}"
    );
    assert!(
        matches!(later, Err(BrokerError::InvalidMessage { .. })),
        "{db:?}: collect+after_signal refused as a first event ({first:?}) but a later one was \
         {later:?} (job payload now {n} bytes): its signal wait silently dropped"
    );
}
per_db!(after_signal_on_a_dependencies_table);

/// README: "at most COLLECT_MAX_EVENTS (1,000) events and COLLECT_MAX_BYTES (1 MiB) of them,
/// each counted with its 4-byte length. The event that fills a job makes it due at once".
/// An event that brings the bytes exactly to the bound fills the job (no event, not even an
/// empty one, fits any more): the job must be due at once, not wait its quiet. Fails (due a
/// quiet later) if only the count bound makes a full job due.
fn the_event_that_fills_the_bytes_makes_it_due(db: Db) {
    let Some(live) = common::live(db) else { return };
    let t = live.table(Form::Lease, Duration::from_secs(30));
    let publish = |key: &str, body: Vec<u8>| publish_bytes(&live, &t, key, body);
    // One event as big as allowed: the job is full on its first event.
    let one = publish("one", vec![7; COLLECT_MAX_BYTES - 4]);
    // Two events that together fill the bound exactly.
    let two = publish("two", vec![1; COLLECT_MAX_BYTES / 2 - 4]);
    assert_eq!(publish("two", vec![2; COLLECT_MAX_BYTES / 2 - 4]), two);
    let now = SystemTime::now();
    let (d1, d2) = (due_at(&live, &t, one), due_at(&live, &t, two));
    forget_keys(&live, &t);
    assert!(
        d1 <= now && d2 <= now,
        "{db:?}: a job holding COLLECT_MAX_BYTES of events waits its quiet: single-event \
         job due in {:?}, two-event job due in {:?}",
        d1.duration_since(now).unwrap_or_default(),
        d2.duration_since(now).unwrap_or_default()
    );
}
per_db!(the_event_that_fills_the_bytes_makes_it_due);

/// Broker::builder().manage_schema(false): "Nothing else the library does runs DDL:
/// publishes, claims, ...". A collected publish that fails (here: the keys' table is not
/// there, the migrations not applied) must not make the next publish run `CREATE TABLE`.
/// Fails (`sqlbroker_collect` made by a manage_schema(false) broker) because any failed
/// collected publish resets the broker's "made" flag.
#[test]
fn manage_schema_false_never_creates_the_keys_table() {
    let Some(url) = common::url(Db::Sqlite) else {
        return;
    };
    let path = url.strip_prefix("sqlite:").unwrap().to_string();
    let t = Table::new(common::unique("rvc").as_str())
        .text_column("k")
        .lease(Duration::from_secs(30));
    let ddl = t.ddl(Database::Sqlite).unwrap().join(";\n");
    common::exec(Db::Sqlite, &url, &ddl);
    let has_keys_table = || {
        common::ints(
            Db::Sqlite,
            &url,
            "SELECT COUNT(*) FROM sqlite_master WHERE name = 'sqlbroker_collect'",
        )[0]
        .unwrap()
    };
    let broker = Broker::builder(&url)
        .maintenance(false)
        .manage_schema(false)
        .build()
        .unwrap();
    let s = Duration::from_secs(5);
    let first = broker.publish(&t, event("k", "1", s, s));
    assert!(
        matches!(first, Err(BrokerError::Schema { .. })),
        "no keys' table, yet {first:?}"
    );
    assert_eq!(has_keys_table(), 0);
    let second = broker.publish(&t, event("k", "2", s, s));
    let made = has_keys_table();
    drop(broker);
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{path}{suffix}"));
    }
    assert_eq!(
        made, 0,
        "a manage_schema(false) broker ran CREATE TABLE sqlbroker_collect on its second \
         collected publish (first {first:?}, second {second:?})"
    );
}

/// SQLite: the keys' table dropped by hand mid-burst ("The keys' table dropped by hand: made
/// again by the next publish", src/producing/collect.rs): is the next publish an error?
#[test]
fn keys_table_dropped_by_hand() {
    let Some(live) = common::live(Db::Sqlite) else {
        return;
    };
    let t = live.table(Form::Lease, Duration::from_secs(30));
    let s = Duration::from_secs(60);
    let a = live.broker.publish(&t, event("k", "1", s, LONG)).unwrap();
    live.exec("DROP TABLE sqlbroker_collect");
    let next = live.broker.publish(&t, event("k", "2", s, LONG));
    let after = live.broker.publish(&t, event("k", "3", s, LONG));
    assert!(
        next.is_ok(),
        "the publish right after the keys' table was dropped failed: {next:?} (then {after:?}, \
         first job {a})"
    );
}

/// PostgreSQL database whose default isolation is SERIALIZABLE (`ALTER DATABASE .. SET
/// default_transaction_isolation`): a collected publish's transaction is a plain `BEGIN`, so
/// two brokers publishing one key meet in the key's row as a serialization failure (40001),
/// which is not retried as a deadlock is. README: "Exact across brokers and processes ...
/// run again on a deadlock". Fails (publishes of one key fail) if the collected publish
/// does not pin its isolation.
#[test]
fn postgres_serializable_default_isolation() {
    let Some(url) = common::url(Db::Postgres) else {
        return;
    };
    let db = common::unique("rvc");
    common::exec(Db::Postgres, &url, &format!("CREATE DATABASE {db}"));
    common::exec(
        Db::Postgres,
        &url,
        &format!("ALTER DATABASE {db} SET default_transaction_isolation = 'serializable'"),
    );
    let db_url = format!("{}/{db}", url.rsplit_once('/').unwrap().0);
    let errors: Vec<String> = {
        let brokers: Vec<Broker> = (0..4).map(|_| common::quiet_broker(&db_url)).collect();
        let t = Table::new("jobs")
            .text_column("k")
            .lease(Duration::from_secs(30));
        brokers[0].create_table(&t).unwrap();
        std::thread::scope(|s| {
            let hs: Vec<_> = brokers
                .iter()
                .enumerate()
                .map(|(w, b)| {
                    let t = &t;
                    s.spawn(move || {
                        (0..30)
                            .filter_map(|i| {
                                b.publish(t, event("k", &format!("{w}-{i}"), LONG, LONG))
                                    .err()
                                    .map(|e| e.to_string())
                            })
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
        })
    };
    let _ = common::try_exec(
        Db::Postgres,
        &url,
        &format!("DROP DATABASE {db} WITH (FORCE)"),
    );
    assert!(
        errors.is_empty(),
        "{} of 120 collected publishes of one key failed, e.g. {:?}",
        errors.len(),
        errors.first()
    );
}

/// `Broker::drop_table` then `create_table` of the same name (a scratch table, a reset): the
/// new table's ids start again, but `sqlbroker_collect` still holds the old table's keys,
/// pointing at old job ids. P39: a job's handler reads the events of *its* key only; "no
/// event is ... in two jobs". Fails (key "ana"'s event appended to key "bob"'s job, which
/// took the old job's id) because drop_table leaves the keys' rows.
fn drop_and_recreate_mixes_keys(db: Db) {
    let Some(live) = common::live(db) else { return };
    let t = live.table(Form::Lease, Duration::from_secs(30));
    let s = Duration::from_secs(60);
    let ana = live
        .broker
        .publish(&t, event("ana", "ana-1", s, LONG))
        .unwrap();
    live.broker.drop_table(&t).unwrap();
    live.broker.create_table(&t).unwrap();
    let bob = live
        .broker
        .publish(&t, event("bob", "bob-1", s, LONG))
        .unwrap();
    let ana2 = live
        .broker
        .publish(&t, event("ana", "ana-2", s, LONG))
        .unwrap();
    let payload = live
        .broker
        .job(&t, bob)
        .unwrap()
        .unwrap()
        .payload()
        .to_vec();
    forget_keys(&live, &t);
    assert_ne!(
        ana2,
        bob,
        "{db:?}: after drop_table + create_table, key ana's event (old job {ana}) went into \
         key bob's job {bob}; bob's payload is now {:?}",
        String::from_utf8_lossy(&payload)
    );
}
per_db!(drop_and_recreate_mixes_keys);

/// As [`drop_and_recreate_mixes_keys`], the old id taken by a plain job scheduled for later:
/// a collected event of the old key must not touch it. Fails (the plain job's due time moved
/// to now: it runs an hour early, and the event starts a job of its own) because the stale
/// key's row names its id and a payload that is not a burst's is taken as "full".
fn drop_and_recreate_runs_a_scheduled_job_early(db: Db) {
    let Some(live) = common::live(db) else { return };
    let t = live.table(Form::Lease, Duration::from_secs(30));
    let s = Duration::from_secs(60);
    live.broker
        .publish(&t, event("ana", "ana-1", s, LONG))
        .unwrap();
    live.broker.drop_table(&t).unwrap();
    live.broker.create_table(&t).unwrap();
    let plain = live
        .broker
        .publish(
            &t,
            Message::new(b"report".to_vec())
                .set("k", "x")
                .deliver_after(Duration::from_secs(3600)),
        )
        .unwrap();
    live.broker
        .publish(&t, event("ana", "ana-2", s, LONG))
        .unwrap();
    let due = due_at(&live, &t, plain);
    forget_keys(&live, &t);
    assert!(
        due > SystemTime::now() + Duration::from_secs(3000),
        "{db:?}: a plain job scheduled an hour out is due {:?} after another key's collected \
         publish",
        due
    );
}
per_db!(drop_and_recreate_runs_a_scheduled_job_early);

/// PostgreSQL, a service role that may not run DDL (no CREATE on the schema) and a broker
/// with manage_schema(false), the library's tables made by the migrations
/// (`Database::library_ddl`), as README's "manage_schema(false)" section describes. One
/// collected publish refused (a first event naming a column the table lacks) must not
/// break the next ones. Fails (every later collected publish: "permission denied for schema
/// public") because a failed collected publish resets the broker's "keys' table made" flag
/// and the next publish runs `CREATE TABLE IF NOT EXISTS`.
#[test]
fn postgres_dml_only_role_survives_a_refused_publish() {
    let Some(url) = common::url(Db::Postgres) else {
        return;
    };
    let name = common::unique("rvc");
    let base = url.rsplit_once('/').unwrap().0.to_string();
    common::exec(Db::Postgres, &url, &format!("CREATE DATABASE {name}"));
    let admin_url = format!("{base}/{name}");
    let t = Table::new("jobs")
        .text_column("k")
        .lease(Duration::from_secs(30));
    let mut ddl = t.ddl(Database::Postgres).unwrap();
    ddl.extend(Database::Postgres.library_ddl().unwrap());
    for s in &ddl {
        common::exec(Db::Postgres, &admin_url, s);
    }
    for s in [
        format!("CREATE ROLE {name} LOGIN"),
        format!("GRANT USAGE ON SCHEMA public TO {name}"),
        format!("GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {name}"),
        format!("GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO {name}"),
    ] {
        common::exec(Db::Postgres, &admin_url, &s);
    }
    let user_url = admin_url.replacen("postgres@", &format!("{name}@"), 1);
    let outcome = {
        let b = Broker::builder(&user_url)
            .maintenance(false)
            .manage_schema(false)
            .build()
            .unwrap();
        let s = Duration::from_secs(30);
        let ok1 = b
            .publish(&t, event("a", "1", s, s))
            .map_err(|e| e.to_string());
        let refused = b
            .publish(&t, event("b", "1", s, s).set("nope", 1i64))
            .map_err(|e| e.to_string());
        let after: Vec<_> = (0..3)
            .map(|i| {
                b.publish(&t, event("a", &format!("{}", i + 2), s, s))
                    .map_err(|e| e.to_string())
            })
            .collect();
        (ok1, refused, after)
    };
    let _ = common::try_exec(
        Db::Postgres,
        &url,
        &format!("DROP DATABASE {name} WITH (FORCE)"),
    );
    let _ = common::try_exec(Db::Postgres, &url, &format!("DROP ROLE {name}"));
    let (ok1, refused, after) = outcome;
    assert!(ok1.is_ok(), "the first publish: {ok1:?}");
    assert!(refused.is_err());
    assert!(
        after.iter().all(Result::is_ok),
        "after one refused collected publish ({refused:?}), the next ones: {after:?}"
    );
}

/// P39: no event lost or in two jobs; README: operators may cancel or delete a job, make it
/// due (run_now), change it (update), and a key's row may go. While the key's events still
/// come, each event is in exactly one job, the job its publish returned, and the next event
/// after an operator's act starts a new job where the old one collects no more. Fails (an
/// event lost: in a dead or removed row, or read by no handler) otherwise.
fn operators_mid_burst(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let t = live.table(form, Duration::from_secs(30));
    let quiet = Duration::from_secs(60);
    let publish = |body: &str| {
        live.broker
            .publish(&t, event("k", body, quiet, LONG))
            .unwrap()
    };
    // Cancel: the cancelled job's events go with it (documented); the next event starts a job.
    let a = publish("a1");
    assert_eq!(publish("a2"), a);
    assert!(live.broker.cancel(&t, a).unwrap());
    let b = publish("b1");
    assert_ne!(b, a, "an event joined a cancelled job");
    assert!(live.broker.job(&t, b).unwrap().is_some());
    // Delete by hand.
    live.exec(&format!("DELETE FROM {} WHERE id = {b}", t.name()));
    let c = publish("c1");
    assert_ne!(c, b);
    assert_eq!(publish("c2"), c);
    // run_now: due, collects no more.
    assert!(live.broker.run_now(&t, c).unwrap());
    std::thread::sleep(Duration::from_millis(1100));
    let d = publish("d1");
    assert_ne!(d, c, "an event joined a job made due by run_now");
    // Update of the due time (later) keeps it collecting; an update of the payload to one
    // that is not a burst's makes it take no more.
    assert!(live
        .broker
        .update(&t, d, JobUpdate::new().run_at(SystemTime::now() + LONG))
        .unwrap());
    assert_eq!(publish("d2"), d, "a job moved later stopped collecting");
    assert!(live
        .broker
        .update(&t, d, JobUpdate::new().payload(b"plain".to_vec()))
        .unwrap());
    let e = publish("e1");
    assert_ne!(e, d);
    // The key's row deleted by hand: the next event starts another job (a split, not a loss).
    live.exec(&format!(
        "DELETE FROM sqlbroker_collect WHERE tbl = '{}'",
        t.name()
    ));
    let f = publish("f1");
    assert_ne!(f, e);
    // Make every live job due and read them (`d`, no longer a burst's, is left at the due
    // time its update gave it: an event does not touch a job it cannot read).
    for id in [d, e, f] {
        assert!(live.broker.run_now(&t, id).unwrap());
    }
    let sub = live.broker.subscription(&t).start().unwrap();
    let mut got = HashMap::new();
    for _ in 0..4 {
        let dl = common::next(&sub, Duration::from_secs(20));
        got.insert(dl.id(), text(dl.collected().unwrap()));
        dl.ack().unwrap();
    }
    let _ = sub.shutdown(Duration::from_secs(5));
    forget_keys(&live, &t);
    assert_eq!(got.get(&c), Some(&vec!["c1".to_string(), "c2".to_string()]));
    assert_eq!(got.get(&d), Some(&vec!["plain".to_string()]));
    assert_eq!(got.get(&e), Some(&vec!["e1".to_string()]));
    assert_eq!(got.get(&f), Some(&vec!["f1".to_string()]));
}
per_db_form!(operators_mid_burst);

/// The `sqlbroker` CLI acting on a collecting job while its events still come: `job` shows
/// it, `cancel` removes it (its events go with it, as documented) and the next event starts a
/// new job, delivered with its events only. Fails (an event joins the cancelled job, or is
/// lost).
fn cli_cancel_mid_burst(db: Db) {
    let Some(live) = common::live(db) else { return };
    let name = common::unique("rvc");
    let t = live.create(
        Table::new(name.as_str())
            .text_column("k")
            .lease(Duration::from_secs(30)),
    );
    let s = Duration::from_secs(60);
    let publish = |body: &str| live.broker.publish(&t, event("k", body, s, LONG)).unwrap();
    let a = publish("1");
    assert_eq!(publish("2"), a);
    let cli = |args: &[&str]| {
        let mut all: Vec<&str> = args.to_vec();
        all.extend(["--table", name.as_str(), "--lease", "30", "--column", "k"]);
        std::process::Command::new(env!("CARGO_BIN_EXE_sqlbroker"))
            .args(&all)
            .env("DATABASE_URL", &live.url)
            .output()
            .unwrap()
    };
    let a_s = a.to_string();
    let o = cli(&["job", &a_s]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let o = cli(&["cancel", &a_s]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let b = publish("3");
    assert_ne!(b, a, "an event joined a job cancelled by the CLI");
    assert!(live.broker.run_now(&t, b).unwrap());
    let sub = live.broker.subscription(&t).start().unwrap();
    let d = common::next(&sub, Duration::from_secs(15));
    assert_eq!(
        (d.id(), text(d.collected().unwrap())),
        (b, vec!["3".to_string()])
    );
    d.ack().unwrap();
    let _ = sub.shutdown(Duration::from_secs(5));
    forget_keys(&live, &t);
}
per_db!(cli_cancel_mid_burst);

/// A dead-lettered collected job keeps its events: requeued, its handler reads them all;
/// an event published while it was dead is in another job. Fails (events lost or merged).
fn dead_letter_and_requeue_keep_events(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let t = live.table(form, Duration::from_secs(30));
    let s = Duration::from_secs(1);
    let publish = |body: &str| live.broker.publish(&t, event("k", body, s, LONG)).unwrap();
    let a = publish("1");
    assert_eq!(publish("2"), a);
    let sub = live
        .broker
        .subscription(&t)
        .max_in_flight(1)
        .start()
        .unwrap();
    let d = common::next(&sub, Duration::from_secs(15));
    assert_eq!(d.id(), a);
    d.dead_letter("nope").unwrap();
    let b = publish("3");
    assert_ne!(b, a, "an event joined a dead letter");
    assert!(live.broker.requeue_dead(&t, a).unwrap());
    let c = publish("4");
    let mut got = HashMap::new();
    while got.values().map(Vec::len).sum::<usize>() < 4 {
        let d = common::next(&sub, Duration::from_secs(15));
        got.insert(d.id(), text(d.collected().unwrap()));
        d.ack().unwrap();
    }
    let _ = sub.shutdown(Duration::from_secs(5));
    forget_keys(&live, &t);
    assert_eq!(got[&a], ["1", "2"], "requeued job: {got:?}");
    let mut rest: Vec<String> = got
        .iter()
        .filter(|(id, _)| **id != a)
        .flat_map(|(_, e)| e.clone())
        .collect();
    rest.sort();
    assert_eq!(rest, ["3", "4"], "b={b} c={c}: {got:?}");
}
per_db_form!(dead_letter_and_requeue_keep_events);

/// "Refused with InvalidMessage, nothing written: ... in publish_batch, publish_group or
/// your own transaction": a batch and a group mixing a plain message and a collected one
/// write nothing. Fails (the plain message written) otherwise.
fn mixed_batch_and_group_write_nothing(db: Db) {
    let Some(live) = common::live(db) else { return };
    let t = live.table(Form::Lease, Duration::from_secs(30));
    let s = Duration::from_secs(30);
    let plain = || Message::new(b"plain".to_vec()).set("k", "p");
    let batch = live
        .broker
        .publish_batch(&t, [plain(), event("k", "1", s, s)]);
    assert!(
        matches!(batch, Err(BrokerError::InvalidMessage { .. })),
        "batch: {batch:?}"
    );
    let group = live.broker.publish_group(|g| {
        g.publish(&t, plain())?;
        g.publish(&t, event("k", "1", s, s))
    });
    assert!(
        matches!(group, Err(BrokerError::InvalidMessage { .. })),
        "group: {group:?}"
    );
    assert_eq!(
        live.rows(&t),
        0,
        "{db:?}: a refused batch or group wrote rows"
    );
}
per_db!(mixed_batch_and_group_write_nothing);
