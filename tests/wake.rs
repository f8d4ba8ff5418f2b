//! Wake-ups across brokers: a publish on one broker reaches an idle subscription on another
//! (as in another process) within milliseconds, not at its next poll. PostgreSQL through
//! `LISTEN/NOTIFY`, SQLite through its change probe, MySQL/MariaDB through the adaptive poll.
//! Each subscription here polls every 30 s, so a row that waits for the poll fails its test.

mod common;

use std::time::{Duration, Instant};

use common::{live, wait_for, Db, Live};
use sqlbroker::{Form, Message, Subscription, Table};

/// Longer than any test waits: a row seen only at the poll fails.
const SLOW_POLL: Duration = Duration::from_secs(30);

fn msg(body: &str) -> Message {
    Message::new(body.as_bytes().to_vec()).set("k", body)
}

/// A subscription on a broker of its own, idle: its first claim has found nothing.
fn idle_subscription(live: &Live, t: &Table) -> (sqlbroker::Broker, Subscription) {
    let other = live.connect();
    let sub = other
        .subscription(t)
        .poll_interval(SLOW_POLL)
        .start()
        .expect("start");
    std::thread::sleep(Duration::from_millis(200));
    (other, sub)
}

/// Waits for a delivery of `body` at most `within`; how long it took.
fn received(sub: &Subscription, body: &str, within: Duration, why: &str) -> Duration {
    let start = Instant::now();
    let d = sub
        .next_delivery_timeout(within)
        .unwrap_or_else(|e| panic!("no delivery within {within:?} ({e}): {why}"));
    let took = start.elapsed();
    assert_eq!(d.payload(), body.as_bytes());
    d.ack().expect("ack");
    took
}

fn another_broker_wakes(db: Db, form: Form) {
    let Some(live) = live(db) else { return };
    let t = live.table(form, Duration::from_secs(30));
    let (_other, sub) = idle_subscription(&live, &t);
    for i in 0..3 {
        let body = format!("row-{i}");
        live.broker.publish(&t, msg(&body)).expect("publish");
        received(
            &sub,
            &body,
            Duration::from_secs(2),
            "a publish on another broker did not wake the idle subscription (its poll is 30 s)",
        );
        // Idle again between rows.
        std::thread::sleep(Duration::from_millis(50));
    }
    let batch: Vec<_> = (0..5).map(|i| msg(&format!("b{i}"))).collect();
    live.broker.publish_batch(&t, batch).expect("batch");
    let mut got = 0;
    while got < 5 {
        let d = sub
            .next_delivery_timeout(Duration::from_secs(2))
            .expect("a batch published on another broker was not delivered within 2 s");
        d.ack().unwrap();
        got += 1;
    }
    sub.shutdown(Duration::from_secs(5)).unwrap();
}

#[test]
fn postgres_row_lock_another_broker_wakes() {
    another_broker_wakes(Db::Postgres, Form::RowLock);
}

#[test]
fn postgres_lease_another_broker_wakes() {
    another_broker_wakes(Db::Postgres, Form::Lease);
}

#[test]
fn postgres_advisory_another_broker_wakes() {
    another_broker_wakes(Db::Postgres, Form::AdvisoryLock);
}

#[test]
fn sqlite_lease_another_broker_wakes() {
    another_broker_wakes(Db::Sqlite, Form::Lease);
}

#[test]
fn sqlite_advisory_another_broker_wakes() {
    another_broker_wakes(Db::Sqlite, Form::AdvisoryLock);
}

/// The transactional publish notifies at the application's commit, not before, and not at all
/// on a rollback.
#[cfg(feature = "postgres")]
#[test]
fn postgres_transactional_publish_wakes_at_commit() {
    let Some(live) = live(Db::Postgres) else {
        return;
    };
    let t = live.table(Form::Lease, Duration::from_secs(30));
    let (_other, sub) = idle_subscription(&live, &t);
    let mut client = postgres::Client::connect(&live.url, postgres::NoTls).unwrap();
    let mut tx = client.transaction().unwrap();
    sqlbroker::postgres::publish(&mut tx, &t, msg("in-tx")).unwrap();
    assert!(
        sub.next_delivery_timeout(Duration::from_millis(300))
            .is_err(),
        "a row was delivered before its transaction committed"
    );
    tx.commit().unwrap();
    received(
        &sub,
        "in-tx",
        Duration::from_secs(2),
        "the commit of a transactional publish did not wake the other broker",
    );
}

/// The listener's session is killed: it reconnects, wakes every worker (a row published
/// while nobody listened is found), and listens again.
#[test]
fn postgres_listener_reconnects_after_its_backend_is_killed() {
    let Some(live) = live(Db::Postgres) else {
        return;
    };
    let t = live.table(Form::Lease, Duration::from_secs(30));
    let (_other, sub) = idle_subscription(&live, &t);
    let listening = format!(
        "SELECT pid FROM pg_stat_activity WHERE query = 'LISTEN \"sqlbroker_{}\"'",
        t.name()
    );
    let pids = live.ints(&listening);
    assert_eq!(pids.len(), 1, "no listening session found: {pids:?}");
    live.exec(&format!(
        "SELECT pg_terminate_backend({})",
        pids[0].unwrap()
    ));
    live.broker.publish(&t, msg("while-down")).unwrap();
    received(
        &sub,
        "while-down",
        Duration::from_secs(3),
        "a row published as the listener died was not found once it reconnected",
    );
    assert!(
        wait_for(Duration::from_secs(5), || {
            let now = live.ints(&listening);
            now.len() == 1 && now[0] != pids[0]
        }),
        "the listener did not come back on a new session"
    );
    live.broker.publish(&t, msg("after")).unwrap();
    received(
        &sub,
        "after",
        Duration::from_secs(2),
        "the reconnected listener does not listen",
    );
}

/// Rows inserted with plain SQL by another tool announce nothing: the poll finds them.
fn plain_insert_found_by_poll(db: Db) {
    let Some(live) = live(db) else { return };
    let t = live.table(Form::Lease, Duration::from_secs(30));
    let other = live.connect();
    let sub = other
        .subscription(&t)
        .poll_interval(Duration::from_millis(100))
        .start()
        .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let payload = match db {
        Db::Postgres => "'\\x706c61696e'::bytea",
        Db::Mysql | Db::Sqlite => "X'706c61696e'",
    };
    let run_at = match db {
        Db::Sqlite => ", run_at",
        _ => "",
    };
    let now = match db {
        Db::Sqlite => ", unixepoch()",
        _ => "",
    };
    live.exec(&format!(
        "INSERT INTO {} (payload, k{run_at}) VALUES ({payload}, 'x'{now})",
        t.name()
    ));
    received(
        &sub,
        "plain",
        Duration::from_secs(3),
        "a row inserted by another tool was not found by the poll",
    );
}

#[test]
fn postgres_plain_insert_found_by_poll() {
    plain_insert_found_by_poll(Db::Postgres);
}

#[test]
fn mysql_plain_insert_found_by_poll() {
    plain_insert_found_by_poll(Db::Mysql);
}

#[test]
fn sqlite_plain_insert_found_by_poll() {
    plain_insert_found_by_poll(Db::Sqlite);
}

/// MySQL/MariaDB cannot notify: right after a claim found rows an idle worker polls within
/// milliseconds, so rows that keep arriving from another broker are seen at once although the
/// poll interval is 30 s.
#[test]
fn mysql_adaptive_poll_sees_rows_that_keep_arriving() {
    let Some(live) = live(Db::Mysql) else {
        return;
    };
    let t = live.table(Form::Lease, Duration::from_secs(30));
    let (other, sub) = idle_subscription(&live, &t);
    // A publish on the subscription's own broker wakes it at once: rows were found.
    other.publish(&t, msg("first")).unwrap();
    received(
        &sub,
        "first",
        Duration::from_secs(2),
        "an in-process publish did not wake",
    );
    for i in 0..3 {
        std::thread::sleep(Duration::from_millis(30));
        let body = format!("next-{i}");
        live.broker.publish(&t, msg(&body)).unwrap();
        let took = received(
            &sub,
            &body,
            Duration::from_secs(5),
            "rows arriving from another broker waited for the 30 s poll",
        );
        assert!(
            took < Duration::from_secs(1),
            "the adaptive poll took {took:?} to see a row arriving right after others"
        );
    }
}

/// A burst of single publishes from several threads of one broker (debounced into few
/// notifications) all reach an idle subscription on another broker: the last notification is
/// never skipped for good. Repeated bursts, each ending with the subscription idle again.
#[test]
fn postgres_a_debounced_burst_is_delivered_in_full() {
    let Some(live) = live(Db::Postgres) else {
        return;
    };
    let t = live.table(Form::Lease, Duration::from_secs(30));
    // The publishing broker listens on the table too, so its publishes debounce; its own
    // subscription holds one row and, full, claims no more.
    let own = live
        .broker
        .subscription(&t)
        .poll_interval(SLOW_POLL)
        .max_in_flight(1)
        .start()
        .unwrap();
    live.broker.publish(&t, msg("held")).unwrap();
    let _held = own
        .next_delivery_timeout(Duration::from_secs(2))
        .expect("the publisher's own subscription");
    let (_other, sub) = idle_subscription(&live, &t);
    for round in 0..5 {
        std::thread::scope(|s| {
            for w in 0..4 {
                let (b, t) = (&live.broker, &t);
                s.spawn(move || {
                    for i in 0..10 {
                        b.publish(t, msg(&format!("{round}-{w}-{i}"))).unwrap();
                    }
                });
            }
        });
        let mut seen = 0;
        while seen < 40 {
            let Ok(d) = sub.next_delivery_timeout(Duration::from_secs(3)) else {
                panic!(
                    "round {round}: {seen} of 40 rows reached the other broker; the rest wait \
                     for its poll (a skipped notification was never sent)"
                );
            };
            d.ack().unwrap();
            seen += 1;
        }
    }
}

/// `cross_process_wake(false)`: the broker's publishes send no notification (a session listening
/// on the table's channel hears nothing), while a default broker's do (the control, so the
/// check can fail); its own subscriptions are still woken in the process at once.
#[cfg(feature = "postgres")]
#[test]
fn postgres_cross_process_wake_can_be_turned_off() {
    let Some(live) = live(Db::Postgres) else {
        return;
    };
    let t = live.table(Form::Lease, Duration::from_secs(30));
    let mut ear = postgres::Client::connect(&live.url, postgres::NoTls).unwrap();
    ear.batch_execute(&format!("LISTEN \"sqlbroker_{}\"", t.name()))
        .unwrap();
    let heard = |ear: &mut postgres::Client| {
        use postgres::fallible_iterator::FallibleIterator;
        let mut n = ear.notifications();
        let got = n.timeout_iter(Duration::from_secs(1)).next().unwrap();
        got.is_some()
    };

    let quiet = sqlbroker::Broker::builder(&live.url)
        .cross_process_wake(false)
        .build()
        .unwrap();
    let sub = quiet
        .subscription(&t)
        .poll_interval(SLOW_POLL)
        .start()
        .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    quiet.publish(&t, msg("quiet")).unwrap();
    received(
        &sub,
        "quiet",
        Duration::from_secs(2),
        "not woken in its own process",
    );
    assert!(!heard(&mut ear), "a quiet broker's publish was announced");

    live.broker.publish(&t, msg("loud")).unwrap();
    assert!(
        heard(&mut ear),
        "the default broker's publish was not announced"
    );
    sub.close();
}
