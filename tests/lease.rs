//! The lease form's promises: a lease is renewed while its handler runs, however long; a lease
//! that really expired and was claimed again fences the late holder out (`LeaseLost`, nothing
//! changed) while the new holder settles normally.

mod common;

use std::time::{Duration, Instant};

use common::{next, Db};
use sqlbroker::{BrokerError, Delivery, Form, Message, NextError, Subscription};

/// Subscription A claims three rows with a 1 s lease and stops renewing them
/// (`shutdown(Duration::ZERO)` with the deliveries held: `Unsettled`); once the leases expire,
/// subscription B on another broker claims them (attempt 2). Returns the table, A's late
/// deliveries and B's, in id order, and B.
fn lost_to_another(
    live: &common::Live,
) -> (sqlbroker::Table, Vec<Delivery>, Vec<Delivery>, Subscription) {
    let t = live.table(Form::Lease, Duration::from_secs(1));
    let msgs = (0..3)
        .map(|i| Message::new(format!("{i}").into_bytes()).set("k", format!("k{i}")))
        .collect::<Vec<_>>();
    live.broker.publish_batch(&t, msgs).unwrap();

    let a = live.broker.subscription(&t).batch_size(10).start().unwrap();
    let mut held: Vec<Delivery> = (0..3).map(|_| next(&a, Duration::from_secs(10))).collect();
    assert!(held.iter().all(|d| d.attempt() == 1));
    held.sort_by_key(Delivery::id);
    match a.shutdown(Duration::ZERO) {
        Err(BrokerError::Unsettled { unsettled, .. }) => assert_eq!(unsettled, 3),
        other => panic!("shutdown with three deliveries held returned {other:?}"),
    }

    let b = live
        .connect()
        .subscription(&t)
        .batch_size(10)
        .start()
        .unwrap();
    // The leases expire within ceil(now) + 1 s; B polls until then.
    let mut taken: Vec<Delivery> = (0..3).map(|_| next(&b, Duration::from_secs(10))).collect();
    taken.sort_by_key(Delivery::id);
    for (old, new) in held.iter().zip(&taken) {
        assert_eq!((new.id(), new.attempt()), (old.id(), 2));
    }
    (t, held, taken, b)
}

/// Subscription A claims three rows with a 1 s lease and stops renewing them
/// (`shutdown(Duration::ZERO)` with the deliveries still held). Once the leases expire,
/// subscription B on another broker claims them (attempt 2). A's late ack, dead letter and drop
/// then change nothing (`LeaseLost`), and B settles all three.
fn late_settlement_is_lease_lost(db: Db) {
    let Some(live) = common::live(db) else { return };
    let (t, held, taken, b) = lost_to_another(&live);
    let mut held = held.into_iter();
    let e = held
        .next()
        .unwrap()
        .ack()
        .expect_err("a late ack succeeded");
    assert!(e.is_lease_lost(), "{e:?}");
    assert!(matches!(e, BrokerError::LeaseLost { .. }));
    let e = held
        .next()
        .unwrap()
        .dead_letter("late")
        .expect_err("a late dead letter succeeded");
    assert!(matches!(e, BrokerError::LeaseLost { .. }), "{e:?}");
    drop(held.next().unwrap()); // a late drop: its retry is fenced out too
    assert_eq!(live.rows(&t), 3, "a late settlement changed the table");
    assert_eq!(
        live.rows_where(&t, "locked_until IS NOT NULL AND dead_at IS NULL"),
        3,
        "B's leases were touched"
    );
    assert!(live.broker.dead_letters(&t, 10).unwrap().is_empty());

    // B still holds all three: nobody else can claim them meanwhile.
    let c = live.connect().subscription(&t).start().unwrap();
    assert_eq!(
        c.next_delivery_timeout(Duration::from_millis(700)).err(),
        Some(NextError::Timeout)
    );
    for d in taken {
        d.ack().unwrap();
    }
    assert_eq!(live.rows(&t), 0);
    b.shutdown(Duration::from_secs(5)).unwrap();
    c.shutdown(Duration::from_secs(5)).unwrap();
}
per_db!(late_settlement_is_lease_lost);

/// Each row's state apart from the lease token itself (which B's renewals move): attempts,
/// due time, whether it is leased, whether it is dead. In id order.
fn row_states(live: &common::Live, t: &sqlbroker::Table) -> Vec<(Option<i64>, Option<i64>, bool)> {
    let name = t.name();
    let run_at = match live.db {
        Db::Postgres => "EXTRACT(EPOCH FROM run_at)::bigint",
        Db::Mysql => "UNIX_TIMESTAMP(run_at)",
        Db::Sqlite => "run_at",
    };
    let attempts = live.ints(&format!("SELECT attempts FROM {name} ORDER BY id"));
    let due = live.ints(&format!("SELECT {run_at} FROM {name} ORDER BY id"));
    let held = live.ints(&format!(
        "SELECT CASE WHEN locked_until IS NOT NULL AND dead_at IS NULL AND dead_reason IS NULL \
         THEN 1 ELSE 0 END FROM {name} ORDER BY id"
    ));
    attempts
        .into_iter()
        .zip(due)
        .zip(held)
        .map(|((a, d), h)| (a, d, h == Some(1)))
        .collect()
}

/// `retry`, `retry_after` and `dead_letter` of a lost lease are fenced like `ack`: A claims
/// three rows with a 1 s lease and stops renewing (`shutdown(Duration::ZERO)` with the
/// deliveries held); B claims them again once the leases expire. A's late `retry`,
/// `retry_after` and `dead_letter` each return `LeaseLost` naming the row, and change nothing:
/// the rows keep B's claim (attempt 2, still leased, due time unchanged, not dead, no dead
/// letter). B's token is intact too, so B's own settlements then take effect (a late retry that
/// had cleared the lease would make them `LeaseLost`).
fn late_retry_is_lease_lost(db: Db) {
    let Some(live) = common::live(db) else { return };
    let (t, held, taken, b) = lost_to_another(&live);
    let before = row_states(&live, &t);
    assert_eq!(before.len(), 3);
    assert!(
        before.iter().all(|(a, _, held)| *a == Some(2) && *held),
        "{before:?}"
    );

    let lost = |what: &str, id: i64, r: sqlbroker::Result<()>| match r {
        Err(BrokerError::LeaseLost { id: lost, .. }) if lost == id => {}
        other => panic!("late {what} of row {id}: expected LeaseLost, got {other:?}"),
    };
    let mut late = held.into_iter();
    let d = late.next().unwrap();
    lost("retry", d.id(), d.retry());
    let d = late.next().unwrap();
    lost(
        "retry_after",
        d.id(),
        d.retry_after(Duration::from_secs(60)),
    );
    let d = late.next().unwrap();
    lost("dead_letter", d.id(), d.dead_letter("late"));
    assert_eq!(
        row_states(&live, &t),
        before,
        "a late settlement changed a row"
    );
    assert!(live.broker.dead_letters(&t, 10).unwrap().is_empty());

    let mut taken = taken.into_iter();
    let retried = taken.next().unwrap();
    let retried_id = retried.id();
    retried.retry().unwrap();
    taken.next().unwrap().dead_letter("by b").unwrap();
    taken.next().unwrap().ack().unwrap();
    assert_eq!(live.rows(&t), 2);
    assert_eq!(live.broker.dead_letters(&t, 10).unwrap().len(), 1);
    let again = next(&b, Duration::from_secs(10));
    assert_eq!((again.id(), again.attempt()), (retried_id, 3));
    again.ack().unwrap();
    b.shutdown(Duration::from_secs(5)).unwrap();
}
per_db!(late_retry_is_lease_lost);

/// A subscription of another broker on `t`, polling every 100 ms, which claims nothing for
/// `wait` (the lease in hand was not lost while `what`).
fn another_gets_nothing(
    live: &common::Live,
    t: &sqlbroker::Table,
    wait: Duration,
    what: &str,
) -> Subscription {
    let b = live
        .connect()
        .subscription(t)
        .poll_interval(Duration::from_millis(100))
        .start()
        .unwrap();
    assert_eq!(
        b.next_delivery_timeout(wait).err(),
        Some(NextError::Timeout),
        "the lease was lost while {what}"
    );
    b
}

/// A handler holding a 2 s lease for 5 s keeps it: a second subscription polling meanwhile gets
/// nothing, the row's attempt is not spent again, and the ack succeeds.
fn renewal_keeps_a_long_handler_lease(db: Db) {
    let Some(live) = common::live(db) else { return };
    let t = live.table(Form::Lease, Duration::from_secs(2));
    live.broker
        .publish(&t, Message::new(b"long".to_vec()).set("k", "a"))
        .unwrap();
    let a = live.broker.subscription(&t).start().unwrap();
    let d = next(&a, Duration::from_secs(10));
    let held_since = Instant::now();
    assert_eq!(d.attempt(), 1);

    let b = another_gets_nothing(&live, &t, Duration::from_secs(5), "its handler ran");
    assert!(held_since.elapsed() >= Duration::from_secs(5));
    assert_eq!(
        live.rows_where(&t, "attempts = 1"),
        1,
        "the row was claimed again"
    );
    d.ack().unwrap();
    assert_eq!(live.rows(&t), 0);
    a.shutdown(Duration::from_secs(5)).unwrap();
    b.shutdown(Duration::from_secs(5)).unwrap();
}
per_db!(renewal_keeps_a_long_handler_lease);

/// Many leases held at once (more than one renewal statement carries) are all renewed: 600 rows
/// held for twice their 2 s lease, a second subscription polling meanwhile gets none, and every
/// ack succeeds.
fn renewal_of_many_leases(db: Db) {
    const N: usize = 600;
    let Some(live) = common::live(db) else { return };
    let t = live.table(Form::Lease, Duration::from_secs(2));
    let msgs = (0..N)
        .map(|i| Message::new(format!("{i}").into_bytes()).set("k", format!("k{i}")))
        .collect::<Vec<_>>();
    live.broker.publish_batch(&t, msgs).unwrap();
    let a = live
        .broker
        .subscription(&t)
        .batch_size(100)
        .max_in_flight(N)
        .start()
        .unwrap();
    let held: Vec<Delivery> = (0..N).map(|_| next(&a, Duration::from_secs(10))).collect();
    assert!(held.iter().all(|d| d.attempt() == 1));
    let other = live.connect();
    let b = other.subscription(&t).batch_size(100).start().unwrap();
    assert_eq!(
        b.next_delivery_timeout(Duration::from_secs(4)).err(),
        Some(NextError::Timeout),
        "a lease was lost while held"
    );
    let lost: Vec<String> = held
        .into_iter()
        .filter_map(|d| d.ack().err())
        .map(|e| e.to_string())
        .collect();
    assert!(
        lost.is_empty(),
        "{} acks failed, first: {:?}",
        lost.len(),
        lost.first()
    );
    assert_eq!(live.rows(&t), 0);
    a.shutdown(Duration::from_secs(5)).unwrap();
    b.shutdown(Duration::from_secs(5)).unwrap();
}
per_db!(renewal_of_many_leases);

/// `extend` pushes a lease's deadline by hand: with renewal stopped, the row stays the
/// handler's past its lease; after the lease was lost, `extend` is `LeaseLost` and changes
/// nothing, and `lease_held` says so.
fn extend_and_lease_check(db: Db) {
    let Some(live) = common::live(db) else { return };
    let t = live.table(Form::Lease, Duration::from_secs(2));
    live.broker.publish(&t, common::msg("long", "a")).unwrap();
    let a = live.broker.subscription(&t).start().unwrap();
    let d = next(&a, Duration::from_secs(10));
    assert!(d.lease_held());
    let until = d.extend(Duration::from_secs(8)).unwrap().expect("a lease");
    assert_eq!(d.lease_deadline(), Some(until));
    // No renewals from here on: only the extension holds the row.
    assert!(matches!(
        a.shutdown(Duration::ZERO),
        Err(BrokerError::Unsettled { unsettled: 1, .. })
    ));
    let other = live.connect();
    let b = other.subscription(&t).start().unwrap();
    assert_eq!(
        b.next_delivery_timeout(Duration::from_secs(4)).err(),
        Some(NextError::Timeout),
        "the row came back within its extension"
    );
    assert!(d.lease_held());
    d.ack().expect("the extended lease was lost");
    assert_eq!(live.rows(&t), 0);

    // A lost lease: extend changes nothing. (B stops first, so that C, not B, claims the row.)
    b.close();
    live.broker.publish(&t, common::msg("lost", "a")).unwrap();
    let c = live.broker.subscription(&t).start().unwrap();
    let old = next(&c, Duration::from_secs(10));
    let _ = c.shutdown(Duration::ZERO);
    let b = other.subscription(&t).start().unwrap();
    let new = next(&b, Duration::from_secs(10));
    assert_eq!((new.id(), new.attempt()), (old.id(), 2));
    assert!(!old.lease_held(), "a lease past its deadline reads held");
    let e = old.extend(Duration::from_secs(30)).unwrap_err();
    assert!(e.is_lease_lost(), "{e:?}");
    assert_eq!(
        live.rows_where(&t, &format!("id = {} AND attempts = 2", new.id())),
        1
    );
    new.ack()
        .expect("the new holder's lease was moved by the old one's extend");
    b.shutdown(Duration::from_secs(5)).unwrap();
}
per_db!(extend_and_lease_check);

/// A row that becomes claimable behind where a draining backlog's claims have got to (its
/// lease expired: the holder stopped renewing) is delivered within about a second, not after
/// the backlog. (PostgreSQL claims from a cursor past the last row claimed, and from the head
/// at least once a second; the other databases always read from the head.)
fn expired_row_behind_a_backlog_is_not_starved(db: Db) {
    let Some(live) = common::live(db) else { return };
    let t = live.table(Form::Lease, Duration::from_secs(1));
    live.broker.publish(&t, common::msg("first", "x")).unwrap();
    // A holds the first row and stops renewing it: its lease expires within 2 s.
    let a = live.connect();
    let a_sub = a.subscription(&t).start().unwrap();
    let held = next(&a_sub, Duration::from_secs(10));
    let _ = a_sub.shutdown(Duration::ZERO);
    let expires = Instant::now() + Duration::from_secs(2);
    const BACKLOG: usize = 800;
    let msgs: Vec<Message> = (0..BACKLOG)
        .map(|i| common::msg("backlog", &format!("b{i}")))
        .collect();
    live.broker.publish_batch(&t, msgs).unwrap();
    // B drains the backlog at about 100 rows a second, in claims of 10.
    let b = live
        .broker
        .subscription(&t)
        .workers(1)
        .batch_size(10)
        .start()
        .unwrap();
    let mut before = 0;
    let back = loop {
        let d = next(&b, Duration::from_secs(30));
        if d.id() == held.id() {
            break d;
        }
        before += 1;
        std::thread::sleep(Duration::from_millis(10));
        d.ack().unwrap();
    };
    let late = Instant::now().saturating_duration_since(expires);
    assert_eq!(back.attempt(), 2);
    back.ack().unwrap();
    assert!(
        BACKLOG - before >= 200,
        "the expired row came back after {before} of {BACKLOG} backlog rows, {late:?} after \
         its lease expired: starved behind the backlog"
    );
    drop(held);
    b.shutdown(Duration::from_secs(10)).unwrap();
}
per_db!(expired_row_behind_a_backlog_is_not_starved);

/// Advisory form: a row whose key another holder held when a draining backlog's claims passed
/// it is delivered within about a second of the key's release, not after the backlog (the
/// servers claim from a cursor past the last row taken, and from the head at least once a
/// second; MariaDB too since issue 41). Fails (`starved behind the backlog`) with the cursor
/// never read from the head again.
fn a_row_passed_for_its_key_is_not_starved(db: Db) {
    let Some(live) = common::live(db) else { return };
    let t = live.table(Form::AdvisoryLock, Duration::from_secs(30));
    live.broker.publish(&t, common::msg("holder", "K")).unwrap();
    // A holds key K through the first row.
    let a = live.connect();
    let a_sub = a.subscription(&t).max_in_flight(1).start().unwrap();
    let held = next(&a_sub, Duration::from_secs(10));
    let passed = live.broker.publish(&t, common::msg("passed", "K")).unwrap();
    const BACKLOG: usize = 800;
    let msgs: Vec<Message> = (0..BACKLOG)
        .map(|i| common::msg("backlog", &format!("b{i}")))
        .collect();
    live.broker.publish_batch(&t, msgs).unwrap();
    // B drains the backlog at about 100 rows a second, in claims of 10, passing the row of K.
    let b = live
        .broker
        .subscription(&t)
        .workers(1)
        .batch_size(10)
        .start()
        .unwrap();
    let mut before = 0;
    let mut released = None;
    loop {
        let d = next(&b, Duration::from_secs(30));
        if d.id() == passed {
            d.ack().unwrap();
            break;
        }
        before += 1;
        if before == 100 {
            // K is free from now on: its row lies behind B's cursor.
            released = Some(Instant::now());
        }
        std::thread::sleep(Duration::from_millis(10));
        d.ack().unwrap();
        if before == 100 {
            break;
        }
    }
    held.ack().unwrap();
    a_sub.shutdown(Duration::from_secs(5)).unwrap();
    let mut after_release = 0;
    loop {
        let d = next(&b, Duration::from_secs(30));
        if d.id() == passed {
            d.ack().unwrap();
            break;
        }
        after_release += 1;
        std::thread::sleep(Duration::from_millis(10));
        d.ack().unwrap();
    }
    let late = released.map(|r| r.elapsed());
    assert!(
        BACKLOG - before - after_release >= 200,
        "the row passed for its key came {after_release} backlog rows ({late:?}) after the key's \
         release, {} of {BACKLOG} left: starved behind the backlog",
        BACKLOG - before - after_release
    );
    b.shutdown(Duration::from_secs(10)).unwrap();
}
per_db!(a_row_passed_for_its_key_is_not_starved);

/// A lease outlives a pool the application holds whole: with both pooled connections held by
/// row lock deliveries for three 2 s leases, the renewer renews on a connection of its own, so
/// a second broker polling meanwhile gets nothing, the attempt is not spent again, and the
/// held delivery's ack succeeds once the pool is given back.
///
/// Fails (the second broker claims the row, attempt 2) when renewal waits on the pool alone
/// (tried). Servers only: on SQLite the one way to hold a pooled connection is an open write
/// transaction, whose lock no renewal gets past on any connection.
fn renewal_outlives_a_held_pool(db: Db) {
    let Some(live) = common::live(db) else { return };
    let broker = sqlbroker::Broker::builder(&live.url)
        .pool_size(2)
        .connection_timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    let t = live.table(Form::Lease, Duration::from_secs(2));
    broker
        .publish(&t, Message::new(b"long".to_vec()).set("k", "a"))
        .unwrap();
    let a = broker.subscription(&t).max_in_flight(1).start().unwrap();
    let d = next(&a, Duration::from_secs(10));
    assert_eq!(d.attempt(), 1);

    let held = common::hold_pool(&live, &broker, 2);
    assert!(
        broker.publish(&t, Message::new(b"x".to_vec())).is_err(),
        "the pool is not held whole"
    );

    let b = another_gets_nothing(&live, &t, Duration::from_secs(6), "the pool was held");
    assert_eq!(live.rows_where(&t, "attempts = 1"), 1, "claimed again");
    for (sub, h) in held {
        h.ack().unwrap();
        sub.shutdown(Duration::from_secs(5)).unwrap();
    }
    d.ack().unwrap();
    assert_eq!(live.rows(&t), 0);
    a.shutdown(Duration::from_secs(5)).unwrap();
    b.shutdown(Duration::from_secs(5)).unwrap();
}
per_server!(renewal_outlives_a_held_pool);

/// A settlement or an extension that waits for a pool the application holds whole keeps its
/// lease meanwhile: an ack (grouped), a batch ack, a retry and an extension each wait for a
/// pooled connection for three 2 s leases, while a second broker polls and gets nothing; each
/// succeeds once the pool is given back, and no row is claimed again.
///
/// Fails (the second broker claims a row; `LeaseLost`) when a settlement locks its lease's cell
/// before it has a connection, since the renewer passes a locked cell by (tried: the chaos
/// matrix's pool cell found it). Servers only, as the test above.
fn a_settlement_waiting_for_the_pool_keeps_its_lease(db: Db) {
    let Some(live) = common::live(db) else { return };
    let broker = sqlbroker::Broker::builder(&live.url)
        .pool_size(2)
        .connection_timeout(Duration::from_secs(20))
        .build()
        .unwrap();
    let t = live.table(Form::Lease, Duration::from_secs(2));
    for i in 0..4 {
        broker
            .publish(&t, Message::new(format!("{i}").into_bytes()))
            .unwrap();
    }
    let a = broker
        .subscription(&t)
        .batch_size(4)
        .max_in_flight(4)
        .start()
        .unwrap();
    let mut ds: Vec<Delivery> = (0..4).map(|_| next(&a, Duration::from_secs(10))).collect();
    let held = common::hold_pool(&live, &broker, 2);
    let (d4, d3, d2, d1) = (
        ds.pop().unwrap(),
        ds.pop().unwrap(),
        ds.pop().unwrap(),
        ds.pop().unwrap(),
    );
    let waiting = vec![
        std::thread::spawn(move || d1.ack().map_err(|e| format!("ack: {e}"))),
        std::thread::spawn(move || {
            Delivery::ack_all([d2])
                .remove(0)
                .map_err(|e| format!("ack_all: {e}"))
        }),
        std::thread::spawn(move || {
            d3.retry_after(Duration::from_secs(600))
                .map_err(|e| format!("retry: {e}"))
        }),
        std::thread::spawn(move || {
            d4.extend(Duration::from_secs(1))
                .map_err(|e| format!("extend: {e}"))?;
            d4.ack().map_err(|e| format!("ack after extend: {e}"))
        }),
    ];
    let b = another_gets_nothing(
        &live,
        &t,
        Duration::from_secs(6),
        "settlements waited for the pool",
    );
    b.shutdown(Duration::from_secs(5)).unwrap();
    for (sub, h) in held {
        h.ack().unwrap();
        sub.shutdown(Duration::from_secs(5)).unwrap();
    }
    for w in waiting {
        w.join().unwrap().unwrap();
    }
    // The retried row is back in the queue, not due for ten minutes; the others are gone.
    assert_eq!(live.rows(&t), 1, "acked rows left, or the retried one gone");
    assert_eq!(live.rows_where(&t, "attempts = 1"), 1, "claimed again");
    a.shutdown(Duration::from_secs(5)).unwrap();
}
per_server!(a_settlement_waiting_for_the_pool_keeps_its_lease);

/// A delivery claimed ahead whose lease runs out while it waits in the subscription's buffer
/// (here its renewals are held off by another session's row lock, as a process frozen past its
/// lease would miss them) is not handed to a handler: the row may be another holder's by then,
/// even finished. The handler gets the row again under a lease of its own instead. Fails
/// (`a delivery handed out with its lease already gone`) with the buffered delivery handed out
/// as it was.
fn an_expired_buffered_delivery_is_not_handed_out(db: Db) {
    let Some(live) = common::live(db) else { return };
    let t = live.table(Form::Lease, Duration::from_secs(1));
    for i in 0..2 {
        live.broker
            .publish(&t, Message::new(format!("{i}").into_bytes()).set("k", "k"))
            .unwrap();
    }
    let sub = live
        .broker
        .subscription(&t)
        .workers(1)
        .batch_size(2)
        .max_in_flight(2)
        .start()
        .unwrap();
    let first = next(&sub, Duration::from_secs(10));
    let other = live.ints(&format!(
        "SELECT id FROM {} WHERE id <> {}",
        t.name(),
        first.id()
    ))[0]
        .unwrap();
    assert!(
        common::wait_for(Duration::from_secs(5), || sub.in_flight() == 2),
        "the second row was claimed ahead into the buffer"
    );
    // Another session locks the buffered row for longer than its lease: no renewal gets it.
    let lock = match db {
        Db::Postgres => format!(
            "BEGIN; SELECT id FROM {name} WHERE id = {other} FOR UPDATE; SELECT pg_sleep(2.6); \
             COMMIT",
            name = t.name()
        ),
        _ => format!(
            "START TRANSACTION; SELECT id FROM {name} WHERE id = {other} FOR UPDATE; \
             SELECT SLEEP(2.6); COMMIT",
            name = t.name()
        ),
    };
    common::exec(db, &live.url, &lock);
    let d = next(&sub, Duration::from_secs(10));
    assert_eq!(d.id(), other);
    assert!(
        d.lease_held(),
        "a delivery handed out with its lease already gone (attempt {})",
        d.attempt()
    );
    d.ack().unwrap();
    first.ack().unwrap();
    sub.shutdown(Duration::from_secs(10)).unwrap();
}

per_server!(an_expired_buffered_delivery_is_not_handed_out);

/// A lease that runs out unsettled (the holder stopped renewing and never settled: a crash)
/// is a failure the next claim records: `errors` counted up, `last_error` the
/// `LEASE_RAN_OUT` text, `Job::abandoned`. A row put back by a settlement (a retry, which
/// clears the lease) is claimed again without one.
fn a_lease_lost_unsettled_is_recorded_as_a_failure(db: Db) {
    let Some(live) = common::live(db) else { return };
    let (t, held, taken, b) = lost_to_another(&live);
    let ids: Vec<i64> = taken.iter().map(Delivery::id).collect();
    for id in &ids {
        let job = live.broker.job(&t, *id).unwrap().expect("the row is there");
        assert_eq!(
            (job.attempts(), job.errors(), job.abandoned()),
            (2, 1, true),
            "the second claim of a lease that ran out unsettled recorded no failure: {job:?}"
        );
        assert_eq!(job.last_error(), Some(sqlbroker::LEASE_RAN_OUT));
    }
    drop(held);
    // B puts the rows back by a plain retry, due at once: the next claim finds the lease
    // cleared and records nothing.
    for d in taken {
        d.retry_after(Duration::ZERO).unwrap();
    }
    b.shutdown(Duration::from_secs(5)).unwrap();
    let c = live
        .connect()
        .subscription(&t)
        .batch_size(10)
        .start()
        .unwrap();
    let again: Vec<Delivery> = (0..3).map(|_| next(&c, Duration::from_secs(10))).collect();
    for d in &again {
        let job = live
            .broker
            .job(&t, d.id())
            .unwrap()
            .expect("the row is there");
        assert_eq!(
            (job.attempts(), job.errors()),
            (3, 1),
            "a claim after a retry recorded a failure: {job:?}"
        );
    }
    for d in again {
        d.ack().unwrap();
    }
    c.shutdown(Duration::from_secs(5)).unwrap();
}
per_db!(a_lease_lost_unsettled_is_recorded_as_a_failure);

/// `Job::abandoned` reads the lost lease while it is the job's last word: true once a claim
/// recorded it (live, and dead-lettered after), false once the job completed (kept) or was
/// requeued (no attempt spent since).
///
/// Fails (seen: `abandoned` read the text alone) with `true` for the completed job.
fn abandoned_ends_with_completion_or_requeue(db: Db) {
    let Some(live) = common::live(db) else { return };
    let t = live.create(
        sqlbroker::Table::new(common::unique("la"))
            .text_column("k")
            .lease(Duration::from_secs(1))
            .keep_completed(Duration::from_secs(3600)),
    );
    let done = live
        .broker
        .publish(&t, Message::new(b"a".to_vec()))
        .unwrap();
    let dead = live
        .broker
        .publish(&t, Message::new(b"b".to_vec()))
        .unwrap();
    let a = live.broker.subscription(&t).batch_size(10).start().unwrap();
    let held: Vec<Delivery> = (0..2).map(|_| next(&a, Duration::from_secs(10))).collect();
    assert!(matches!(
        a.shutdown(Duration::ZERO),
        Err(BrokerError::Unsettled { .. })
    ));
    let b = live
        .connect()
        .subscription(&t)
        .batch_size(10)
        .start()
        .unwrap();
    let again: Vec<Delivery> = (0..2).map(|_| next(&b, Duration::from_secs(10))).collect();
    drop(held);
    let job = |id| live.broker.job(&t, id).unwrap().expect("kept");
    assert!(job(done).abandoned() && job(dead).abandoned());
    for d in again {
        match d.id() == done {
            true => d.ack().unwrap(),
            false => d.dead_letter("gave up").unwrap(),
        }
    }
    assert_eq!(job(done).state(), sqlbroker::JobState::Completed);
    assert!(!job(done).abandoned(), "a completed job reads abandoned");
    assert!(
        job(dead).abandoned(),
        "the dead letter's last word was the lost lease"
    );
    assert!(live.broker.requeue_dead(&t, dead).unwrap());
    assert!(!job(dead).abandoned(), "a requeued job reads abandoned");
    b.shutdown(Duration::from_secs(5)).unwrap();
}
per_db!(abandoned_ends_with_completion_or_requeue);
