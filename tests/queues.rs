//! Named queues and job kinds in one table ([`Table::queues`], [`Table::kinds`]): a
//! subscription's view ([`sqlbroker::SubscriptionBuilder::queues`] / `kinds`) claims only its
//! queues' and kinds' rows, across brokers and beside other views; FIFO groups, limits and the
//! pause stay the table's, across its queues; publish and `start` refuse bad names; `migrate`
//! adds the columns and the index to an existing table. Every database x form.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{Db, Live};
use sqlbroker::{
    Broker, BrokerError, Delivery, Form, JobFilter, JobState, Message, Role, Subscription, Table,
    Value,
};

const LEASE: Duration = Duration::from_secs(30);
const WAIT: Duration = Duration::from_secs(10);
/// How long a claim that must take nothing is given.
const QUIET: Duration = Duration::from_millis(1200);

/// A table of `form` with queues and kinds, each row's advisory key its own `k`.
fn queued(live: &Live, form: Form) -> Table {
    let name = common::unique("t");
    live.create(common::describe(&name, form, LEASE).queues().kinds())
}

/// A message of queue `queue` (none: the default) and kind `kind`, its `k` unique in the test.
fn job(body: &str, queue: Option<&str>, kind: Option<&str>) -> Message {
    let mut m = common::msg(body, body);
    if let Some(q) = queue {
        m = m.queue(q);
    }
    if let Some(k) = kind {
        m = m.kind(k);
    }
    m
}

/// The ids of the ready jobs `filter` lists, by id.
fn listed(b: &Broker, t: &Table, filter: JobFilter) -> Vec<i64> {
    b.jobs_matching(t, JobState::Ready, &filter, None, 100, 10)
        .unwrap()
        .iter()
        .map(|j| j.id())
        .collect()
}

/// Takes exactly `n` deliveries, acking each after `check`, then asserts that no other comes
/// within [`QUIET`]. Returns their ids.
fn drain(sub: &Subscription, n: usize, check: impl Fn(&Delivery)) -> BTreeSet<i64> {
    let mut ids = BTreeSet::new();
    for _ in 0..n {
        let d = common::next(sub, WAIT);
        check(&d);
        assert!(ids.insert(d.id()), "row {} delivered twice", d.id());
        d.ack().unwrap();
    }
    if let Ok(d) = sub.next_delivery_timeout(QUIET) {
        panic!(
            "a delivery past the {n} expected: row {} of queue {:?}, kind {:?} (had {ids:?})",
            d.id(),
            d.queue(),
            d.kind()
        );
    }
    ids
}

/// The next delivery of any of `subs` (each asked in turn), within [`WAIT`].
fn next_of(subs: &[&Subscription]) -> Delivery {
    let deadline = Instant::now() + WAIT;
    while Instant::now() < deadline {
        for sub in subs {
            if let Ok(d) = sub.next_delivery_timeout(Duration::from_millis(50)) {
                return d;
            }
        }
    }
    panic!("no delivery within {WAIT:?}")
}

/// Nothing is delivered within [`QUIET`].
fn none_within(sub: &Subscription, why: &str) {
    if let Ok(d) = sub.next_delivery_timeout(QUIET) {
        panic!(
            "{why}: row {} of queue {:?} (payload {:?})",
            d.id(),
            d.queue(),
            String::from_utf8_lossy(d.payload())
        );
    }
}

/// Rows published to A, B and the default queue in turn: a view of `["A"]` drains exactly A's
/// ids, a view of `["B", "default"]` exactly the rest. Fails (A's view takes a B row) with the
/// view's condition dropped from the claims.
fn a_view_claims_only_its_queues(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let t = queued(&live, form);
    let mut by_queue: BTreeMap<&str, BTreeSet<i64>> = BTreeMap::new();
    for i in 0..30 {
        let q = ["A", "B", "default"][i % 3];
        // The default queue's rows name none.
        let named = (q != "default").then_some(q);
        let id = live
            .broker
            .publish(&t, job(&format!("r{i}"), named, None))
            .unwrap();
        by_queue.entry(q).or_default().insert(id);
    }
    let a = live
        .broker
        .subscription(&t)
        .queues(["A"])
        .batch_size(4)
        .start()
        .unwrap();
    let got = drain(&a, 10, |d| assert_eq!(d.queue(), "A", "row {}", d.id()));
    assert_eq!(got, by_queue["A"], "A's view took other rows");
    a.close();
    let rest = live
        .broker
        .subscription(&t)
        .queues(["B", "default"])
        .batch_size(3)
        .start()
        .unwrap();
    let got = drain(&rest, 20, |d| {
        assert!(matches!(d.queue(), "B" | "default"), "row {}", d.id())
    });
    let expected: BTreeSet<i64> = by_queue["B"].union(&by_queue["default"]).copied().collect();
    assert_eq!(got, expected);
    rest.close();
    assert_eq!(live.rows_where(&t, "dead_at IS NULL"), 0, "rows left");
}
per_db_form!(a_view_claims_only_its_queues);

/// A delivery as a view saw it: the row's id, its queue, the view's queue.
type Seen = (i64, String, &'static str);

/// Views of different queues run at once, two in one broker (one of them with two claim
/// workers and batches) and one in another broker, while rows are published to every queue:
/// each delivery is of its view's queue and no row is delivered twice.
fn views_running_together_never_cross(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let t = queued(&live, form);
    let other = live.connect();
    let per_queue = 40usize;
    let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
    let start = |broker: &Broker, queues: &[&str], workers: usize| {
        broker
            .subscription(&t)
            .queues(queues.iter().copied())
            .workers(workers)
            .batch_size(5)
            .max_in_flight(8)
            .start()
            .unwrap()
    };
    let subs = [
        (start(&live.broker, &["A"], 2), "A"),
        (start(&live.broker, &["B"], 1), "B"),
        (start(&other, &["default"], 2), "default"),
    ];
    std::thread::scope(|s| {
        for (sub, queue) in &subs {
            let seen = seen.clone();
            s.spawn(move || {
                let deadline = Instant::now() + Duration::from_secs(60);
                let mut n = 0;
                while n < per_queue && Instant::now() < deadline {
                    let Ok(d) = sub.next_delivery_timeout(Duration::from_millis(500)) else {
                        continue;
                    };
                    seen.lock()
                        .unwrap()
                        .push((d.id(), d.queue().to_string(), *queue));
                    std::thread::sleep(Duration::from_millis(2));
                    d.ack().unwrap();
                    n += 1;
                }
            });
        }
        for i in 0..per_queue * 3 {
            let q = ["A", "B", "default"][i % 3];
            live.broker
                .publish(&t, job(&format!("r{i}"), Some(q), None))
                .unwrap();
        }
    });
    for (sub, _) in &subs {
        none_within(sub, "a row past its queue's");
    }
    let seen = seen.lock().unwrap();
    let mut ids = BTreeSet::new();
    for (id, queue, view) in seen.iter() {
        assert_eq!(
            queue, view,
            "row {id} of queue {queue} went to the view of {view}"
        );
        assert!(ids.insert(*id), "row {id} delivered twice");
    }
    assert_eq!(ids.len(), per_queue * 3, "rows missing");
    for (sub, _) in subs {
        sub.close();
    }
}
per_db_form!(views_running_together_never_cross);

/// A view of kind `x` takes x's rows only, never kind y's nor the rows of no kind; a view of
/// queue A and kind x only A's x rows; a subscription without a kinds filter takes the rest,
/// kind-less rows too.
fn a_kind_view_claims_only_its_kinds(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let t = queued(&live, form);
    let mut x = BTreeSet::new();
    let mut ax = BTreeSet::new();
    let mut rest = BTreeSet::new();
    for i in 0..24 {
        let kind = [Some("x"), Some("y"), None][i % 3];
        let queue = ["A", "B"][i / 3 % 2];
        let id = live
            .broker
            .publish(&t, job(&format!("r{i}"), Some(queue), kind))
            .unwrap();
        match (kind, queue) {
            (Some("x"), "A") => ax.insert(id),
            (Some("x"), _) => x.insert(id),
            _ => rest.insert(id),
        };
    }
    let both = live
        .broker
        .subscription(&t)
        .queues(["A"])
        .kinds(["x"])
        .start()
        .unwrap();
    let got = drain(&both, ax.len(), |d| {
        assert_eq!((d.queue(), d.kind()), ("A", Some("x")), "row {}", d.id())
    });
    assert_eq!(got, ax);
    both.close();
    let xs = live.broker.subscription(&t).kinds(["x"]).start().unwrap();
    let got = drain(&xs, x.len(), |d| {
        assert_eq!(d.kind(), Some("x"), "row {}", d.id())
    });
    assert_eq!(got, x);
    xs.close();
    let all = live.broker.subscription(&t).start().unwrap();
    let got = drain(&all, rest.len(), |d| {
        assert_ne!(d.kind(), Some("x"), "row {}", d.id())
    });
    assert_eq!(got, rest);
    all.close();
}
per_db_form!(a_kind_view_claims_only_its_kinds);

/// A FIFO group spans two queues: while the group's first row (queue A) is in work, a view of
/// queue B takes B's rows of other groups but not the group's next row, which comes once the
/// first is acked. Fails if a view's claims judge a group's head among its own queues only.
fn a_fifo_group_spans_queues(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let name = common::unique("t");
    let t = Table::new(&name)
        .queues()
        .text_column("g")
        .group("g")
        .fifo();
    let t = live.create(match form {
        Form::Lease => t.lease(LEASE),
        Form::AdvisoryLock => t.advisory_lock(format!("{name}-{{g}}")),
        _ => t,
    });
    let m = |body: &str, queue: &str, g: &str| {
        Message::new(body.as_bytes().to_vec())
            .queue(queue)
            .set("g", g)
    };
    let a1 = live.broker.publish(&t, m("a1", "A", "one")).unwrap();
    let b1 = live.broker.publish(&t, m("b1", "B", "one")).unwrap();
    let b2 = live.broker.publish(&t, m("b2", "B", "two")).unwrap();
    let a = live.broker.subscription(&t).queues(["A"]).start().unwrap();
    let first = common::next(&a, WAIT);
    assert_eq!(first.id(), a1);
    let other = live.connect();
    let b = other.subscription(&t).queues(["B"]).start().unwrap();
    let d = common::next(&b, WAIT);
    assert_eq!(
        d.id(),
        b2,
        "B's view took the group's second row past its head"
    );
    d.ack().unwrap();
    none_within(
        &b,
        "B's view took a row of a group whose head is in work in A",
    );
    first.ack().unwrap();
    let d = common::next(&b, WAIT);
    assert_eq!(d.id(), b1);
    d.ack().unwrap();
    a.close();
    b.close();
}
per_db_form!(a_fifo_group_spans_queues);

/// The same, the group being the queue itself (`group("queue")`): one row of each queue at a
/// time, in publish order, whichever views claim.
fn the_queue_as_the_fifo_group(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let name = common::unique("t");
    let t = Table::new(&name).queues().group("queue").fifo();
    let t = live.create(match form {
        Form::Lease => t.lease(LEASE),
        Form::AdvisoryLock => t.advisory_lock(format!("{name}-{{queue}}")),
        _ => t,
    });
    let m = |body: &str, queue: &str| Message::new(body.as_bytes().to_vec()).queue(queue);
    let a1 = live.broker.publish(&t, m("a1", "A")).unwrap();
    let a2 = live.broker.publish(&t, m("a2", "A")).unwrap();
    let b1 = live.broker.publish(&t, m("b1", "B")).unwrap();
    let all = live
        .broker
        .subscription(&t)
        .max_in_flight(10)
        .start()
        .unwrap();
    let got = [common::next(&all, WAIT), common::next(&all, WAIT)];
    let ids: BTreeSet<i64> = got.iter().map(|d| d.id()).collect();
    assert_eq!(ids, BTreeSet::from([a1, b1]));
    let a_view = live.connect();
    let a = a_view.subscription(&t).queues(["A"]).start().unwrap();
    none_within(&a, "A's second row while its first is in work");
    none_within(&all, "a second row of one queue");
    for d in got {
        d.ack().unwrap();
    }
    let d = next_of(&[&a, &all]);
    assert_eq!(d.id(), a2);
    d.ack().unwrap();
    all.close();
    a.close();
}

per_db_form!(the_queue_as_the_fifo_group);

/// A concurrency limit keyed by the queue (`"{queue}"`, 1) holds per queue: one row of A and
/// one of B in work at once, not two of either, across the table's views and brokers.
fn a_limit_per_queue(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let name = common::unique("t");
    let t = live.create(
        common::describe(&name, form, LEASE)
            .queues()
            .concurrency_limit("{queue}", 1),
    );
    for i in 0..3 {
        for q in ["A", "B"] {
            live.broker
                .publish(&t, job(&format!("{q}{i}"), Some(q), None))
                .unwrap();
        }
    }
    let all = live
        .broker
        .subscription(&t)
        .max_in_flight(10)
        .batch_size(10)
        .start()
        .unwrap();
    let one = common::next(&all, WAIT);
    let two = common::next(&all, WAIT);
    let mut queues = [one.queue().to_string(), two.queue().to_string()];
    queues.sort();
    assert_eq!(
        queues,
        ["A", "B"],
        "the limit per queue let two of one queue in"
    );
    none_within(&all, "a third row past both queues' limits");
    let other = live.connect();
    let a = other.subscription(&t).queues(["A"]).start().unwrap();
    none_within(&a, "A's view past A's limit");
    let (first_a, first_b) = if one.queue() == "A" {
        (one, two)
    } else {
        (two, one)
    };
    first_a.ack().unwrap();
    let d = next_of(&[&a, &all]);
    assert_eq!(d.queue(), "A");
    none_within(&all, "a second row of B, or of A, past the limit");
    none_within(&a, "a second row of A past the limit");
    d.ack().unwrap();
    first_b.ack().unwrap();
    all.close();
    a.close();
}
per_db_form!(a_limit_per_queue);

fn invalid_message(r: sqlbroker::Result<i64>, what: &str) {
    match r {
        Err(BrokerError::InvalidMessage { .. }) => {}
        other => panic!("{what}: {other:?}, not InvalidMessage"),
    }
}

/// Bad names, a queue or a kind for a table without them, a queue set to `NULL` or to a
/// number: `InvalidMessage`, and nothing written. A name of 64 characters, and the queue set
/// as a column, are taken.
fn publish_validation(db: Db) {
    let Some(live) = common::live(db) else { return };
    let t = queued(&live, Form::Lease);
    let plain = live.table(Form::Lease, LEASE);
    let long = "q".repeat(65);
    for bad in [
        "",
        "a b",
        "a'b",
        "a\"b",
        "é",
        "a;b",
        "a/b",
        long.as_str(),
        "x') OR 1=1 --",
    ] {
        invalid_message(
            live.broker.publish(&t, job("q", Some(bad), None)),
            &format!("queue {bad:?}"),
        );
        invalid_message(
            live.broker.publish(&t, job("k", None, Some(bad))),
            &format!("kind {bad:?}"),
        );
        invalid_message(
            live.broker
                .publish(&t, common::msg("s", "s").set("queue", bad)),
            &format!("set(queue, {bad:?})"),
        );
    }
    invalid_message(
        live.broker.publish(&plain, job("p", Some("A"), None)),
        "a queue for a table without queues",
    );
    invalid_message(
        live.broker.publish(&plain, job("p", None, Some("x"))),
        "a kind for a table without kinds",
    );
    invalid_message(
        live.broker
            .publish(&t, common::msg("n", "n").set("queue", Value::Null)),
        "queue set to NULL",
    );
    invalid_message(
        live.broker
            .publish(&t, common::msg("n", "n").set("queue", 5i64)),
        "queue set to a number",
    );
    invalid_message(
        live.broker
            .publish(&t, common::msg("n", "n").set("kind", 5i64)),
        "kind set to a number",
    );
    // One bad message in a batch: nothing of the batch is written.
    let batch = live.broker.publish_batch(
        &t,
        vec![job("ok", Some("A"), None), job("bad", Some("a b"), None)],
    );
    assert!(
        matches!(batch, Err(BrokerError::InvalidMessage { .. })),
        "{batch:?}"
    );
    assert_eq!(live.rows(&t), 0, "a refused publish wrote rows");
    assert_eq!(live.rows(&plain), 0, "a refused publish wrote rows");

    let max = "Az09_.:-".repeat(8);
    assert_eq!(max.len(), sqlbroker::MAX_NAME_LEN);
    let id = live
        .broker
        .publish(&t, job("max", Some(&max), Some(&max)))
        .unwrap();
    let set = live
        .broker
        .publish(
            &t,
            common::msg("set", "set").set("queue", "S").set("kind", "k"),
        )
        .unwrap();
    let sub = live.broker.subscription(&t).start().unwrap();
    let d = common::next(&sub, WAIT);
    assert_eq!(
        (d.id(), d.queue(), d.kind()),
        (id, max.as_str(), Some(max.as_str()))
    );
    d.ack().unwrap();
    let d = common::next(&sub, WAIT);
    assert_eq!((d.id(), d.queue(), d.kind()), (set, "S", Some("k")));
    d.ack().unwrap();
    sub.close();
}
per_db!(publish_validation);

/// `start` refuses a view with no queue, a bad name, or of queues or kinds the table does not
/// have (`InvalidTable`).
fn start_refuses_bad_views(db: Db) {
    let Some(live) = common::live(db) else { return };
    let t = queued(&live, Form::Lease);
    let plain = live.table(Form::Lease, LEASE);
    let only_queues =
        live.create(common::describe(&common::unique("t"), Form::Lease, LEASE).queues());
    let refused = |r: sqlbroker::Result<Subscription>, what: &str| match r {
        Err(BrokerError::InvalidTable { .. }) => {}
        Err(e) => panic!("{what}: {e:?}, not InvalidTable"),
        Ok(_) => panic!("{what}: started"),
    };
    let b = &live.broker;
    refused(
        b.subscription(&t).queues(Vec::<String>::new()).start(),
        "no queue",
    );
    refused(
        b.subscription(&t).kinds(Vec::<String>::new()).start(),
        "no kind",
    );
    for bad in ["", "a b", "x') OR 1=1 --", "a'b", &"q".repeat(65)] {
        refused(
            b.subscription(&t).queues([bad]).start(),
            &format!("queue {bad:?}"),
        );
        refused(
            b.subscription(&t).queues(["A", bad]).start(),
            &format!("queues A, {bad:?}"),
        );
        refused(
            b.subscription(&t).kinds([bad]).start(),
            &format!("kind {bad:?}"),
        );
    }
    refused(
        b.subscription(&plain).queues(["A"]).start(),
        "queues of a table without",
    );
    refused(
        b.subscription(&plain).kinds(["x"]).start(),
        "kinds of a table without",
    );
    refused(
        b.subscription(&only_queues).kinds(["x"]).start(),
        "kinds of a table of queues only",
    );
    // A table without queues: its rows are of the default queue, its deliveries say so.
    b.publish(&plain, common::msg("p", "p")).unwrap();
    let sub = b.subscription(&plain).start().unwrap();
    let d = common::next(&sub, WAIT);
    assert_eq!((d.queue(), d.kind()), (sqlbroker::DEFAULT_QUEUE, None));
    d.ack().unwrap();
    sub.close();
}
per_db!(start_refuses_bad_views);

/// The queue index's name exists on the table.
fn queue_index_exists(live: &Live, t: &Table) -> bool {
    let index = format!("{}_queue", t.name());
    let sql = match live.db {
        Db::Postgres => format!(
            "SELECT COUNT(*) FROM pg_indexes WHERE schemaname = current_schema() AND indexname = '{index}'"
        ),
        Db::Mysql => format!(
            "SELECT COUNT(*) FROM information_schema.statistics WHERE table_schema = database() \
             AND table_name = '{}' AND index_name = '{index}'",
            t.name()
        ),
        Db::Sqlite => {
            format!("SELECT COUNT(*) FROM sqlite_master WHERE type = 'index' AND name = '{index}'")
        }
    };
    live.int(&sql) > 0
}

/// `migrate` of a plain table with rows to one with queues and kinds: the old rows are of the
/// default queue and of no kind, views claim by queue, and the queue index is made.
fn migrate_adds_queues_and_kinds(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let name = common::unique("t");
    let plain = live.create(common::describe(&name, form, LEASE));
    let mut old = BTreeSet::new();
    for i in 0..3 {
        old.insert(
            live.broker
                .publish(&plain, common::msg("old", &format!("o{i}")))
                .unwrap(),
        );
    }
    let t = plain.clone().queues().kinds();
    let done = live.broker.migrate(&t).unwrap();
    assert!(!done.is_empty(), "migrate did nothing");
    assert!(
        queue_index_exists(&live, &t),
        "no queue index after migrate ({done:?})"
    );
    assert!(
        live.broker.migration_sql(&t).unwrap().is_empty(),
        "migrate left work: {:?}",
        live.broker.migration_sql(&t).unwrap()
    );
    assert_eq!(live.rows_where(&t, "queue = 'default' AND kind IS NULL"), 3);
    let new = live
        .broker
        .publish(&t, job("new", Some("A"), Some("x")))
        .unwrap();
    let a = live.broker.subscription(&t).queues(["A"]).start().unwrap();
    let got = drain(&a, 1, |d| {
        assert_eq!((d.queue(), d.kind()), ("A", Some("x")))
    });
    assert_eq!(got, BTreeSet::from([new]));
    a.close();
    let d = live
        .broker
        .subscription(&t)
        .queues(["default"])
        .start()
        .unwrap();
    let got = drain(&d, 3, |d| {
        assert_eq!((d.queue(), d.kind()), ("default", None))
    });
    assert_eq!(got, old);
    d.close();
}
per_db_form!(migrate_adds_queues_and_kinds);

/// A table made with queues and kinds, then described by another service without kinds: that
/// service is refused (its publishes would write rows of no kind, its subscriptions take
/// every kind's rows), at its first use of the table.
fn a_description_without_kinds_is_refused(db: Db) {
    let Some(live) = common::live(db) else { return };
    let name = common::unique("t");
    let t = live.create(common::describe(&name, Form::Lease, LEASE).queues().kinds());
    live.broker
        .publish(&t, job("x", Some("A"), Some("x")))
        .unwrap();
    let other = live.connect();
    let without = common::describe(&name, Form::Lease, LEASE).queues();
    let publish = other.publish(&without, job("y", Some("A"), None));
    assert!(
        matches!(publish, Err(BrokerError::Schema { .. })),
        "a publish by a description without kinds: {publish:?}"
    );
    let start = other.subscription(&without).start();
    assert!(
        matches!(start, Err(BrokerError::Schema { .. })),
        "a subscription by a description without kinds: {:?}",
        start.err()
    );
    assert_eq!(live.rows(&t), 1);
}
per_db!(a_description_without_kinds_is_refused);

/// Pausing the table stops its views too, in this broker and another; resuming starts them.
fn a_pause_stops_views(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let t = queued(&live, form);
    live.broker.pause(&t).unwrap();
    let a = live.broker.subscription(&t).queues(["A"]).start().unwrap();
    let other = live.connect();
    let x = other.subscription(&t).kinds(["x"]).start().unwrap();
    let ida = live.broker.publish(&t, job("a", Some("A"), None)).unwrap();
    let idx = live
        .broker
        .publish(&t, job("x", Some("B"), Some("x")))
        .unwrap();
    none_within(&a, "A's view claimed on a paused table");
    none_within(&x, "x's view claimed on a paused table");
    live.broker.resume(&t).unwrap();
    let d = common::next(&a, Duration::from_secs(15));
    assert_eq!(d.id(), ida);
    d.ack().unwrap();
    let d = common::next(&x, Duration::from_secs(15));
    assert_eq!(d.id(), idx);
    d.ack().unwrap();
    a.close();
    x.close();
}
per_db_form!(a_pause_stops_views);

/// The advisory form, two views of one table in ONE broker, their rows' keys equal (the key
/// reads a column both queues' rows share): the broker's sessions hold a key once, so the
/// second view does not take its row while the first view's delivery holds the key (a
/// session's advisory lock is re-entrant on PostgreSQL and MariaDB: views that did not share
/// the table's held keys would both run).
fn advisory_views_share_held_keys(db: Db) {
    let Some(live) = common::live(db) else { return };
    let name = common::unique("t");
    let t = live.create(
        Table::new(&name)
            .queues()
            .text_column("k")
            .advisory_lock(format!("{name}-{{k}}")),
    );
    // One connection: both views' claims run on the session that holds the key.
    let one = Broker::builder(&live.url).pool_size(2).build().unwrap();
    let ida = live
        .broker
        .publish(&t, common::msg("a", "same").queue("A"))
        .unwrap();
    let idb = live
        .broker
        .publish(&t, common::msg("b", "same").queue("B"))
        .unwrap();
    let a = one.subscription(&t).queues(["A"]).start().unwrap();
    let d = common::next(&a, WAIT);
    assert_eq!(d.id(), ida);
    let b = one.subscription(&t).queues(["B"]).start().unwrap();
    none_within(&b, "B's view took a row whose key A's view holds");
    let whole = one.subscription(&t).start().unwrap();
    none_within(
        &whole,
        "the whole table's subscription took a row whose key a view holds",
    );
    d.ack().unwrap();
    let d = next_of(&[&b, &whole]);
    assert_eq!(d.id(), idb);
    d.ack().unwrap();
    a.close();
    b.close();
    whole.close();
}
per_db!(advisory_views_share_held_keys);

/// Listing by queue and kind (`JobFilter::in_queue` / `of_kind`, what `sqlbroker jobs --queue
/// --kind` and the dashboard's filter call): each filter returns exactly its rows, a row whose
/// adopted queue column was set to `NULL` by hand is listed in the default queue (and says so,
/// `Job::queue`), and a filter a table cannot answer, or a bad name, is refused. Fails if the
/// queue filter compared the column alone (the `NULL` row would be missing from `default`).
fn listing_by_queue_and_kind(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let name = common::unique("t");
    // A table of the user's whose column `lane` is adopted as the queue column by `migrate`:
    // its rows written before keep their `NULL`.
    let own = live.create(common::describe(&name, form, LEASE).text_column("lane"));
    let b = &live.broker;
    let d = b.publish(&own, common::msg("d", "d")).unwrap();
    let t = own.clone().rename(Role::Queue, "lane").queues().kinds();
    b.migrate(&t).unwrap();
    live.exec(&format!("UPDATE {name} SET kind = 'x' WHERE id = {d}"));
    let a = b.publish(&t, job("a", Some("A"), Some("x"))).unwrap();
    let bb = b.publish(&t, job("b", Some("B"), None)).unwrap();
    assert_eq!(live.rows_where(&t, "lane IS NULL"), 1);
    let ids = |f: JobFilter| listed(b, &t, f);
    assert_eq!(ids(JobFilter::new().in_queue("A")), [a]);
    assert_eq!(ids(JobFilter::new().in_queue("B")), [bb]);
    assert_eq!(
        ids(JobFilter::new().in_queue("default")),
        [d],
        "the NULL row"
    );
    assert_eq!(ids(JobFilter::new().of_kind("x")), [d, a]);
    assert_eq!(
        ids(JobFilter::new().in_queue("B").of_kind("x")),
        Vec::<i64>::new()
    );
    let page = b
        .jobs_matching(&t, JobState::Ready, &JobFilter::new(), None, 100, 10)
        .unwrap();
    let said: Vec<(&str, Option<&str>)> = page.iter().map(|j| (j.queue(), j.kind())).collect();
    assert_eq!(
        said,
        [("default", Some("x")), ("A", Some("x")), ("B", None)]
    );

    let refused = |r: sqlbroker::Result<Vec<sqlbroker::Job>>, what: &str| {
        assert!(
            matches!(r, Err(BrokerError::InvalidOption { .. })),
            "{what}: {r:?}"
        );
    };
    refused(
        b.jobs_matching(
            &t,
            JobState::Ready,
            &JobFilter::new().in_queue("a b"),
            None,
            9,
            0,
        ),
        "a bad queue name",
    );
    let plain = live.create(common::describe(&common::unique("t"), form, LEASE));
    refused(
        b.jobs_matching(
            &plain,
            JobState::Ready,
            &JobFilter::new().in_queue("A"),
            None,
            9,
            0,
        ),
        "a queue of a table without queues",
    );
    refused(
        b.jobs_matching(
            &plain,
            JobState::Ready,
            &JobFilter::new().of_kind("x"),
            None,
            9,
            0,
        ),
        "a kind of a table without kinds",
    );
}
per_db_form!(listing_by_queue_and_kind);

/// MySQL/MariaDB: a queue and a kind column adopted from a table's own in a case-insensitive
/// collation (`utf8mb4_general_ci`, the server's default) is converted by `migrate` to the
/// byte-exact one, as the dedup key and group columns are: queue `a` and queue `A`, kind `x`
/// and kind `X`, stay apart for views, listings and bulk cancels. (PostgreSQL and SQLite compare
/// text byte for byte unless a column is given a nondeterministic collation by hand.)
///
/// Fails without the conversion (found by review: `in_queue("a")` listed queue `A`'s row, a
/// view of `a` claimed it, and a bulk cancel of `a` cancelled it).
#[cfg(feature = "mysql")]
#[test]
fn mysql_adopted_case_insensitive_columns_are_made_exact() {
    let Some(live) = common::live(Db::Mysql) else {
        return;
    };
    let name = common::unique("t");
    let own = live.create(
        common::describe(&name, Form::Lease, LEASE)
            .text_column("lane")
            .text_column("sort"),
    );
    for c in ["lane", "sort"] {
        live.exec(&format!(
            "ALTER TABLE {name} MODIFY {c} VARCHAR(255) CHARACTER SET utf8mb4 \
             COLLATE utf8mb4_general_ci NULL"
        ));
    }
    let t = own
        .clone()
        .rename(Role::Queue, "lane")
        .queues()
        .rename(Role::Kind, "sort")
        .kinds();
    let done = live.broker.migrate(&t).unwrap();
    for c in ["lane", "sort"] {
        assert!(
            done.iter()
                .any(|d| d.contains(&format!("converted column {c}"))),
            "migrate did not convert {c}: {done:?}"
        );
    }
    let b = live.connect();
    let big = b.publish(&t, job("A", Some("A"), Some("X"))).unwrap();
    let small = b.publish(&t, job("a", Some("a"), Some("x"))).unwrap();
    let ids = |f: JobFilter| listed(&b, &t, f);
    assert_eq!(ids(JobFilter::new().in_queue("a")), [small]);
    assert_eq!(ids(JobFilter::new().of_kind("X")), [big]);
    let sub = b
        .subscription(&t)
        .queues(["a"])
        .kinds(["x"])
        .start()
        .unwrap();
    assert_eq!(drain(&sub, 1, |_| {}), BTreeSet::from([small]));
    sub.close();
    let cancelled = b
        .cancel_matching(
            &t,
            &JobFilter::new().in_queue("A").in_state(JobState::Ready),
            &sqlbroker::BulkPass::new(),
        )
        .unwrap();
    assert_eq!(cancelled.changed(), 1);
    assert_eq!(live.rows(&t), 0, "queue A's row or queue a's was left");
}

/// The queue column adopted from a column of the user's with `rename(Role::Queue, ..)`, here
/// one named like an SQL keyword (`group`): publish and views use it, `get` reads it.
fn a_renamed_queue_column(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let name = common::unique("t");
    let t = live.create(
        common::describe(&name, form, LEASE)
            .text_column("group")
            .rename(Role::Queue, "group")
            .queues()
            .rename(Role::Kind, "sort")
            .kinds(),
    );
    let a = live
        .broker
        .publish(&t, job("a", Some("A"), Some("x")))
        .unwrap();
    let b = live
        .broker
        .publish(&t, common::msg("b", "b").set("group", "B"))
        .unwrap();
    let d = live.broker.publish(&t, common::msg("d", "d")).unwrap();
    assert_eq!(live.rows_where(&t, "sort = 'x'"), 1);
    let sub = live
        .broker
        .subscription(&t)
        .queues(["A", "B"])
        .start()
        .unwrap();
    let got = drain(&sub, 2, |d| {
        assert_eq!(d.get("group").and_then(|v| v.as_str()), Some(d.queue()));
    });
    assert_eq!(got, BTreeSet::from([a, b]));
    sub.close();
    let sub = live
        .broker
        .subscription(&t)
        .queues(["default"])
        .start()
        .unwrap();
    assert_eq!(drain(&sub, 1, |_| {}), BTreeSet::from([d]));
    sub.close();
}
per_db_form!(a_renamed_queue_column);

/// A view's claim leaves the rows of other queues and kinds free: while a view of kind x holds
/// a delivery (a row lock form's transaction stays open), a view of kind y in another broker
/// takes every y row, also the one published before the x row the first claim took, and acks
/// them. Failed on MariaDB's row lock form before its claims of views locked rows by id
/// (`y1` skipped: the x view's claim, reading the ready index in order, locked y1 as it
/// passed it and kept the lock with its transaction; acks of rows whose index entries such a
/// claim locked waited out `innodb_lock_wait_timeout`).
fn a_view_leaves_other_rows_free(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let t = queued(&live, form);
    let y1 = live
        .broker
        .publish(&t, job("y1", Some("A"), Some("y")))
        .unwrap();
    let x1 = live
        .broker
        .publish(&t, job("x1", Some("B"), Some("x")))
        .unwrap();
    let y2 = live
        .broker
        .publish(&t, job("y2", Some("A"), Some("y")))
        .unwrap();
    let x = live
        .broker
        .subscription(&t)
        .kinds(["x"])
        .batch_size(1)
        .max_in_flight(1)
        .start()
        .unwrap();
    let held = common::next(&x, WAIT);
    assert_eq!(held.id(), x1);
    let other = live.connect();
    let y = other.subscription(&t).kinds(["y"]).start().unwrap();
    let got = drain(&y, 2, |d| assert_eq!(d.kind(), Some("y")));
    assert_eq!(
        got,
        BTreeSet::from([y1, y2]),
        "a y row stayed locked by the x view"
    );
    held.ack().unwrap();
    x.close();
    y.close();
}
per_db_form!(a_view_leaves_other_rows_free);

/// Descriptions whose queue or kind column cannot hold names are refused: a user's column of
/// that name that is not text, the queue and the kind renamed to one column, a role's name.
#[test]
fn odd_named_columns_are_refused() {
    let broker = Broker::connect("sqlite::memory:").unwrap();
    let lease = |t: Table| t.lease(LEASE);
    for (what, t) in [
        (
            "an int queue column",
            Table::new("p1").int_column("queue").queues(),
        ),
        (
            "a bytes kind column",
            Table::new("p2").bytes_column("kind").kinds(),
        ),
        (
            "a renamed queue on an int column",
            Table::new("p3")
                .int_column("n")
                .rename(Role::Queue, "n")
                .queues(),
        ),
        (
            "the kind renamed to the queue",
            Table::new("p4")
                .queues()
                .kinds()
                .rename(Role::Kind, "queue"),
        ),
        (
            "the queue renamed to the payload",
            Table::new("p5").queues().rename(Role::Queue, "payload"),
        ),
    ] {
        match broker.create_table(&lease(t)) {
            Err(BrokerError::InvalidTable { .. }) => {}
            other => panic!("{what}: {other:?}, not InvalidTable"),
        }
    }
    // A text column of the user's is adopted.
    let t = lease(Table::new("ok").text_column("queue").queues());
    broker.create_table(&t).unwrap();
    broker
        .publish(&t, Message::new(b"x".to_vec()).queue("A"))
        .unwrap();
    let sub = broker.subscription(&t).queues(["A"]).start().unwrap();
    let d = common::next(&sub, WAIT);
    assert_eq!(d.queue(), "A");
    d.ack().unwrap();
}

/// A column adopted as the queue (`rename(Role::Queue, ..)` on an existing table) keeps its
/// `NULL`s: `migrate` neither fills them nor makes the column `NOT NULL DEFAULT 'default'`.
/// Such a row is of the default queue everywhere: its delivery says so, a view of the default
/// queue claims it, a pause of the default queue holds it, `queue_stats` counts it there.
/// Fails (`a view of the default queue`) if the view's condition were `queue IN ('default')`
/// alone, which never matches `NULL` (found by the review: only whole-table subscriptions took
/// the row), and (`paused`) if the pause's probe compared the `NULL`.
fn an_adopted_queue_columns_nulls_are_in_the_default_queue(db: Db) {
    let Some(live) = common::live(db) else {
        return;
    };
    let name = common::unique("t");
    let plain = live.create(Table::new(&name).text_column("grp").lease(LEASE));
    let id = live
        .broker
        .publish(&plain, Message::new(b"x".to_vec()))
        .unwrap();
    let t = plain.clone().rename(Role::Queue, "grp").queues();
    live.broker.migrate(&t).unwrap();
    let stats = live.broker.queue_stats(&t).unwrap();
    assert_eq!(
        stats
            .iter()
            .map(|(q, s)| (q.as_str(), s.ready))
            .collect::<Vec<_>>(),
        [(sqlbroker::DEFAULT_QUEUE, 1)]
    );
    live.broker
        .pause_queue(&t, sqlbroker::DEFAULT_QUEUE)
        .unwrap();
    let whole = live.broker.subscription(&t).start().unwrap();
    assert!(
        whole
            .next_delivery_timeout(Duration::from_millis(500))
            .is_err(),
        "paused: the row of a NULL queue was claimed"
    );
    whole.close();
    live.broker
        .resume_queue(&t, sqlbroker::DEFAULT_QUEUE)
        .unwrap();
    let sub = live
        .broker
        .subscription(&t)
        .queues([sqlbroker::DEFAULT_QUEUE])
        .start()
        .unwrap();
    let d = sub
        .next_delivery_timeout(WAIT)
        .expect("a view of the default queue claims a NULL queue's row");
    assert_eq!((d.id(), d.queue()), (id, sqlbroker::DEFAULT_QUEUE));
    d.ack().unwrap();
}
per_db!(an_adopted_queue_columns_nulls_are_in_the_default_queue);
