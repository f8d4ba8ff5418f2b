//! PgBouncer in front of a PostgreSQL cluster of the test's own (ports 25401-25413), in three
//! configurations: session pooling with PgBouncer's defaults (which refuse the startup
//! parameter `options`), session pooling with `ignore_startup_parameters = options` (which
//! drops it without a word), and transaction pooling (`pool_mode=transaction` in the URL).
//! In each:
//!
//! 1. the broker connects, and every form the pooling allows runs: `create_table`,
//!    `publish_batch` and `publish`, a subscription that takes and acks every row (the table
//!    is empty at the end, read directly on the server);
//! 2. the statement timeout holds: a publish into a table another session has locked fails
//!    within a few seconds with a transient error (no timeout would wait for the lock);
//! 3. a publish by another broker wakes an idle subscription (poll interval 60 s) within 5 s:
//!    the change feed listens, through the pooler in session pooling and on the direct
//!    `listen_url` in transaction pooling;
//! 4. transaction pooling refuses, with permanent errors, what needs a session: the advisory
//!    form (`Unsupported`) and a change feed without `listen_url` (`InvalidOption`);
//! 5. transaction pooling the URL does not declare is used as if declared once noticed (a
//!    statement prepared on one server session run on another): that publish succeeds, the
//!    lease and row lock forms run, and the advisory form is refused from then on;
//! 6. transaction pooling: a row lock handler's statement past its `handler_timeout` is
//!    cancelled on the server session the delivery's transaction holds;
//! 7. transaction pooling, advisory table (its subscription on a direct broker): `job`, `jobs`
//!    and `cancel` leave no advisory lock held on any server session (`pg_locks`, read on the
//!    server), tell a row whose key a subscription holds as in flight, and the subscription
//!    then gets every row of the key promptly. A PgBouncer of its own hands server sessions
//!    round robin (`server_round_robin`), so consecutive transactions run on different ones.
//!
//! Skipped (loudly) without the PostgreSQL server binaries or pgbouncer, unless
//! `SQLBROKER_REQUIRE_SERVERS=1`.

mod common;
mod pgserver;

use std::time::{Duration, Instant};

use sqlbroker::{Broker, BrokerError, Form, Message, Table};

const PG_PORT: u16 = 25401;
const SESSION: u16 = 25411;
const SESSION_IGNORING: u16 = 25412;
const TRANSACTION: u16 = 25413;
const TRANSACTION_ROUND_ROBIN: u16 = 25414;
const ROWS: usize = 25;

fn through(port: u16, params: &str) -> String {
    format!("postgres://postgres@127.0.0.1:{port}/postgres?sslmode=disable{params}")
}

fn table(form: Form) -> Table {
    common::describe(&common::unique("pgb"), form, Duration::from_secs(30))
}

/// 1: every row published through the pooler is taken and acked; the table ends empty.
fn runs(broker: &Broker, direct: &mut postgres::Client, form: Form, what: &str) {
    let t = table(form);
    broker
        .create_table(&t)
        .unwrap_or_else(|e| panic!("{what}: create_table: {e}"));
    let batch: Vec<Message> = (0..ROWS - 5)
        .map(|i| common::msg(&format!("b{i}"), &format!("k{i}")))
        .collect();
    broker
        .publish_batch(&t, batch)
        .unwrap_or_else(|e| panic!("{what}: publish_batch: {e}"));
    for i in 0..5 {
        broker
            .publish(&t, common::msg(&format!("p{i}"), &format!("q{i}")))
            .unwrap_or_else(|e| panic!("{what}: publish: {e}"));
    }
    let sub = broker
        .subscription(&t)
        .workers(2)
        .start()
        .unwrap_or_else(|e| panic!("{what}: subscription: {e}"));
    for _ in 0..ROWS {
        common::next(&sub, Duration::from_secs(20))
            .ack()
            .unwrap_or_else(|e| panic!("{what}: ack: {e}"));
    }
    sub.shutdown(Duration::from_secs(10)).unwrap();
    let left: i64 = direct
        .query_one(&format!("SELECT count(*) FROM {}", t.name()), &[])
        .unwrap()
        .get(0);
    assert_eq!(left, 0, "{what}: rows left after every delivery was acked");
    direct
        .batch_execute(&format!("DROP TABLE {}", t.name()))
        .unwrap();
}

/// 2: a publish into a locked table ends by the statement timeout (1 s), not by the lock's
/// release (at the publish's return, or 15 s later).
fn timeout_holds(broker: &Broker, direct_url: &str, what: &str) {
    let t = table(Form::Lease);
    broker.create_table(&t).unwrap();
    let mut locker = postgres::Client::connect(direct_url, postgres::NoTls).unwrap();
    let name = t.name().to_string();
    let (locked_tx, locked_rx) = std::sync::mpsc::channel();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let holder = std::thread::spawn(move || {
        let mut tx = locker.transaction().unwrap();
        tx.batch_execute(&format!("LOCK TABLE {name} IN ACCESS EXCLUSIVE MODE"))
            .unwrap();
        locked_tx.send(()).unwrap();
        let _ = done_rx.recv_timeout(Duration::from_secs(15));
        tx.rollback().unwrap();
        locker
    });
    locked_rx.recv().unwrap();
    let start = Instant::now();
    let r = broker.publish(&t, common::msg("x", "k"));
    let took = start.elapsed();
    drop(done_tx);
    let err = r.err().unwrap_or_else(|| {
        panic!("{what}: a publish into a locked table waited {took:?} for the lock and succeeded")
    });
    assert!(
        took < Duration::from_secs(6),
        "{what}: the publish waited {took:?} for a lock: the statement timeout (1 s) is not set"
    );
    assert!(
        err.is_transient(),
        "{what}: a lock timeout is transient: {err}"
    );
    let mut locker = holder.join().unwrap();
    locker
        .batch_execute(&format!("DROP TABLE {}", t.name()))
        .unwrap();
}

/// 3: another broker's publish wakes an idle subscription of `broker` long before its poll.
fn wakes(broker: &Broker, other: &Broker, what: &str) {
    let t = table(Form::Lease);
    broker.create_table(&t).unwrap();
    let sub = broker
        .subscription(&t)
        .poll_interval(Duration::from_secs(60))
        .start()
        .unwrap();
    // The first claim finds nothing, and the listener watches the table.
    std::thread::sleep(Duration::from_secs(2));
    let start = Instant::now();
    other.publish(&t, common::msg("w", "k")).unwrap();
    let d = sub
        .next_delivery_timeout(Duration::from_secs(5))
        .unwrap_or_else(|e| {
            panic!(
                "{what}: no wake-up within 5 s of another broker's publish: {e} ({:?})",
                sub.last_error()
            )
        });
    d.ack().unwrap();
    eprintln!("{what}: woken in {:?}", start.elapsed());
    sub.shutdown(Duration::from_secs(10)).unwrap();
}

/// 6 (transaction pooling): a row lock handler's statement past its `handler_timeout` (1 s) is
/// cancelled on the server session its transaction holds (the statement timeout is 30 s here).
fn handler_timeout_cancels(url: &str, direct_url: &str) {
    let broker = Broker::builder(url).listen_url(direct_url).build().unwrap();
    let t = table(Form::RowLock);
    broker.create_table(&t).unwrap();
    broker.publish(&t, common::msg("slow", "k")).unwrap();
    let sub = broker
        .subscription(&t)
        .handler_timeout(Duration::from_secs(1))
        .start()
        .unwrap();
    let mut d = common::next(&sub, Duration::from_secs(10));
    sub.close();
    let start = Instant::now();
    let slept =
        sqlbroker::postgres::in_delivery(&mut d, |c| c.batch_execute("SELECT pg_sleep(30)"));
    let took = start.elapsed();
    assert!(
        took < Duration::from_secs(10),
        "transaction pooling: the handler's statement ran {took:?} past its 1 s timeout"
    );
    assert!(
        matches!(slept, Err(BrokerError::HandlerTimeout { .. })),
        "transaction pooling: in_delivery past the deadline gave {slept:?}"
    );
}

/// Advisory locks held on the server, by any session.
fn advisory_locks(direct: &mut postgres::Client) -> i64 {
    direct
        .query_one(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'",
            &[],
        )
        .unwrap()
        .get(0)
}

/// 7: the operator calls on an advisory table through transaction pooling leave no key held.
fn advisory_operator_calls(url: &str, direct_url: &str, direct: &mut postgres::Client) {
    let what = "transaction pooling, advisory job/jobs/cancel";
    // Several server sessions in PgBouncer's pool, each used in turn.
    let mut warm: Vec<postgres::Client> = (0..4)
        .map(|_| postgres::Client::connect(url, postgres::NoTls).unwrap())
        .collect();
    let mut held: Vec<postgres::Transaction<'_>> =
        warm.iter_mut().map(|c| c.transaction().unwrap()).collect();
    for tx in &mut held {
        tx.batch_execute("SELECT 1").unwrap();
    }
    drop(held);
    let broker = Broker::builder(&format!("{url}&pool_mode=transaction"))
        .cross_process_wake(false)
        .statement_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let direct_broker = Broker::builder(direct_url)
        .cross_process_wake(false)
        .build()
        .unwrap();
    let t = table(Form::AdvisoryLock);
    broker.create_table(&t).unwrap();
    let ids: Vec<i64> = (0..6)
        .map(|i| {
            broker
                .publish(&t, common::msg(&format!("a{i}"), &format!("k{}", i % 2)))
                .unwrap()
        })
        .collect();
    assert_eq!(advisory_locks(direct), 0, "{what}: a lock before any call");
    for id in &ids {
        let job = broker.job(&t, *id).unwrap().expect("published");
        assert_eq!(job.state(), sqlbroker::JobState::Ready, "{what}");
    }
    let page = broker
        .jobs(&t, sqlbroker::JobState::Ready, None, 100)
        .unwrap();
    assert_eq!(page.len(), ids.len(), "{what}: a ready job is missing");
    assert_eq!(
        advisory_locks(direct),
        0,
        "{what}: job/jobs left advisory locks held on a server session"
    );
    assert!(broker.cancel(&t, ids[0]).unwrap(), "{what}: cancel");
    assert!(
        broker.job(&t, ids[0]).unwrap().is_none(),
        "{what}: cancelled"
    );
    assert_eq!(
        advisory_locks(direct),
        0,
        "{what}: cancel left an advisory lock held on a server session"
    );
    // A key a subscription holds: the probe sees it (the two scopes of one lock conflict).
    let sub = direct_broker
        .subscription(&t)
        .workers(1)
        .max_in_flight(1)
        .start()
        .unwrap();
    let d = common::next(&sub, Duration::from_secs(10));
    let job = broker.job(&t, d.id()).unwrap().expect("in work");
    assert_eq!(
        job.state(),
        sqlbroker::JobState::InFlight,
        "{what}: a job whose key is held"
    );
    d.ack().unwrap();
    // The rest of both keys, promptly: no key is left held by a server session.
    for _ in 0..ids.len() - 2 {
        common::next(&sub, Duration::from_secs(5)).ack().unwrap();
    }
    sub.shutdown(Duration::from_secs(10)).unwrap();
    assert_eq!(advisory_locks(direct), 0, "{what}: a lock left at the end");
    let left: i64 = direct
        .query_one(&format!("SELECT count(*) FROM {}", t.name()), &[])
        .unwrap()
        .get(0);
    assert_eq!(left, 0, "{what}: rows left");
}

fn build(url: &str, listen: Option<&str>) -> Result<Broker, BrokerError> {
    let mut b = Broker::builder(url)
        .statement_timeout(Duration::from_secs(1))
        .connection_timeout(Duration::from_secs(20));
    if let Some(l) = listen {
        b = b.listen_url(l);
    }
    b.build()
}

#[test]
fn pgbouncer_session_and_transaction_pooling() {
    if !common::slow_suite("the PgBouncer suite") {
        return;
    }
    let started = Instant::now();
    let mut s = match pgserver::Scratch::new("pgbouncer", true) {
        Ok(s) => s,
        Err(why) => return common::unmet(&why),
    };
    let pg = s.primary("pg", PG_PORT, "");
    s.bouncer("session", SESSION, &pg, "session", "");
    s.bouncer(
        "ignoring",
        SESSION_IGNORING,
        &pg,
        "session",
        "ignore_startup_parameters = options",
    );
    s.bouncer("transaction", TRANSACTION, &pg, "transaction", "");
    s.bouncer(
        "round-robin",
        TRANSACTION_ROUND_ROBIN,
        &pg,
        "transaction",
        "server_round_robin = 1",
    );
    let direct_url = pg.url();
    let mut direct = postgres::Client::connect(&direct_url, postgres::NoTls).unwrap();

    for (port, what) in [
        (SESSION, "session pooling, PgBouncer's defaults"),
        (SESSION_IGNORING, "session pooling, options ignored"),
    ] {
        let url = through(port, "");
        let broker = build(&url, None).unwrap_or_else(|e| panic!("{what}: connect: {e}"));
        for form in [Form::Lease, Form::RowLock, Form::AdvisoryLock] {
            runs(&broker, &mut direct, form, &format!("{what}, {form:?}"));
        }
        timeout_holds(&broker, &direct_url, what);
        let other = build(&url, None).unwrap();
        wakes(&broker, &other, what);
    }

    // 5: transaction pooling the URL does not declare: a broker's statements are prepared on
    // one server session; another client's open transaction then holds that session, and the
    // broker's next statement runs on another, which does not have them. Noticed, the pooler
    // is used as if declared: that statement runs again unnamed, and succeeds.
    let what = "undeclared transaction pooling";
    let undeclared = Broker::builder(&through(TRANSACTION, ""))
        .cross_process_wake(false)
        .build()
        .unwrap();
    let t = table(Form::Lease);
    undeclared.create_table(&t).unwrap();
    undeclared.publish(&t, common::msg("u", "k")).unwrap();
    let mut holder = postgres::Client::connect(&through(TRANSACTION, ""), postgres::NoTls).unwrap();
    let mut held = holder.transaction().unwrap();
    held.batch_execute("SELECT 1").unwrap();
    undeclared
        .publish(&t, common::msg("u", "k"))
        .unwrap_or_else(|e| panic!("{what}: noticed, and not used as declared: {e}"));
    held.rollback().unwrap();
    let n: i64 = direct
        .query_one(&format!("SELECT count(*) FROM {}", t.name()), &[])
        .unwrap()
        .get(0);
    assert_eq!(n, 2, "{what}: a publish is missing");
    direct
        .batch_execute(&format!("DROP TABLE {}", t.name()))
        .unwrap();
    for form in [Form::Lease, Form::RowLock] {
        runs(&undeclared, &mut direct, form, &format!("{what}, {form:?}"));
    }
    let t = table(Form::AdvisoryLock);
    undeclared.create_table(&t).unwrap();
    match undeclared.subscription(&t).start() {
        Err(e @ BrokerError::Unsupported { .. }) => assert!(!e.is_transient()),
        other => panic!("{what}: the advisory form: {:?}", other.map(drop)),
    }

    let what = "transaction pooling";
    let url = through(TRANSACTION, "&pool_mode=transaction");
    match build(&url, None) {
        Err(
            e @ BrokerError::InvalidOption {
                option: "listen_url",
                ..
            },
        ) => {
            assert!(!e.is_transient());
        }
        other => panic!(
            "{what}: a change feed without listen_url: {:?}",
            other.map(drop)
        ),
    }
    let broker = build(&url, Some(&direct_url)).unwrap_or_else(|e| panic!("{what}: connect: {e}"));
    for form in [Form::Lease, Form::RowLock] {
        runs(&broker, &mut direct, form, &format!("{what}, {form:?}"));
    }
    let t = table(Form::AdvisoryLock);
    broker.create_table(&t).unwrap();
    match broker.subscription(&t).start() {
        Err(e @ BrokerError::Unsupported { .. }) => assert!(!e.is_transient()),
        other => panic!("{what}: the advisory form: {:?}", other.map(drop)),
    }
    timeout_holds(&broker, &direct_url, what);
    handler_timeout_cancels(&url, &direct_url);
    advisory_operator_calls(
        &through(TRANSACTION_ROUND_ROBIN, ""),
        &direct_url,
        &mut direct,
    );
    let other = build(&url, Some(&direct_url)).unwrap();
    wakes(&broker, &other, what);
    // No wake-up: the feed off, the rest runs.
    let quiet = Broker::builder(&url)
        .cross_process_wake(false)
        .build()
        .unwrap_or_else(|e| panic!("{what}: cross_process_wake(false): {e}"));
    runs(
        &quiet,
        &mut direct,
        Form::Lease,
        "transaction pooling, no feed",
    );
    eprintln!("zz_pgbouncer took {:?}", started.elapsed());
}
