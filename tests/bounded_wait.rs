//! The caller's timeout is a real bound, on every database x form: while another session holds
//! the lock a claim waits on (SQLite: `BEGIN IMMEDIATE` on another connection; PostgreSQL:
//! `LOCK TABLE .. IN ACCESS EXCLUSIVE MODE`; MariaDB: `LOCK TABLES .. WRITE`) and rows are
//! ready, `try_next_delivery` returns at once and `next_delivery_timeout(100 ms)` /
//! `next_batch(10, 100 ms)` within 100 ms and [`SLACK`], though the broker's statement
//! timeout (how long a claim may wait for the lock) is 5 s. Once the lock is released, every
//! row is delivered exactly once.
//!
//! Each subscription's one worker sleeps (poll interval an hour, no cross-process wake-ups),
//! so nothing is claiming when the calls start: each call claims on its own thread. Fails
//! (`returned after`, about 5 s) with the bound removed from `Subscription::claim_here`
//! (tried: the deadline not passed to the claim, and the servers' hand-off to a worker
//! removed: every database x form, `next_batch` and, with only its own bound removed,
//! `next_delivery_timeout`), and when `try_next_delivery` claims (tried: every database x
//! form).

mod common;

use std::sync::{Arc, Mutex};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use common::Db;
use sqlbroker::{Broker, ClaimedRows, Events, Form, NextError, Subscription};

const TIMEOUT: Duration = Duration::from_millis(100);
/// What the calls may take beyond their timeout. The docs state "a few milliseconds"; on the
/// servers the call is a `recv_timeout` on a channel, so anything past that is the scheduler:
/// a CI run on two cores shared by many test binaries saw 64 ms past the timeout. The breakage
/// this suite catches costs the statement timeout (5 s), far past this slack.
const SLACK: Duration = Duration::from_millis(400);
/// The broker's statement timeout: what a claim blocked on the lock would wait unbounded.
const STATEMENT_TIMEOUT: Duration = Duration::from_secs(5);
const ROWS: usize = 3;

/// A session of its own, bypassing the library, holding the lock a claim waits on.
enum Locker {
    #[cfg(feature = "postgres")]
    Postgres(postgres::Client),
    #[cfg(feature = "mysql")]
    Mysql(mysql::Conn),
    #[cfg(feature = "sqlite")]
    Sqlite(rusqlite::Connection),
}

impl Locker {
    // `table` is the servers' (SQLite's lock is on the whole file).
    #[cfg_attr(
        not(any(feature = "postgres", feature = "mysql")),
        allow(unused_variables)
    )]
    fn lock(db: Db, url: &str, table: &str) -> Locker {
        match db {
            #[cfg(feature = "postgres")]
            Db::Postgres => {
                let mut c = postgres::Client::connect(url, postgres::NoTls).unwrap();
                c.batch_execute(&format!(
                    "BEGIN; LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE"
                ))
                .unwrap();
                Locker::Postgres(c)
            }
            #[cfg(feature = "mysql")]
            Db::Mysql => {
                use mysql::prelude::Queryable;
                let mut c = mysql::Conn::new(mysql::Opts::from_url(url).unwrap()).unwrap();
                c.query_drop(format!("LOCK TABLES {table} WRITE")).unwrap();
                Locker::Mysql(c)
            }
            #[cfg(feature = "sqlite")]
            Db::Sqlite => {
                let c = rusqlite::Connection::open(url.strip_prefix("sqlite:").unwrap()).unwrap();
                c.execute_batch("BEGIN IMMEDIATE").unwrap();
                Locker::Sqlite(c)
            }
            #[allow(unreachable_patterns)]
            _ => panic!("{db:?} is not compiled in"),
        }
    }

    fn release(self) {
        match self {
            #[cfg(feature = "postgres")]
            Locker::Postgres(mut c) => c.batch_execute("COMMIT").unwrap(),
            #[cfg(feature = "mysql")]
            Locker::Mysql(mut c) => {
                use mysql::prelude::Queryable;
                c.query_drop("UNLOCK TABLES").unwrap()
            }
            #[cfg(feature = "sqlite")]
            Locker::Sqlite(c) => c.execute_batch("COMMIT").unwrap(),
        }
    }
}

/// Asserts `took` is within `limit`, naming the call.
fn within(call: &str, took: Duration, limit: Duration) {
    println!("{call}: {took:?}");
    assert!(
        took <= limit,
        "{call} returned after {took:?}, past its bound {limit:?}"
    );
}

/// A broker of its own (statement timeout [`STATEMENT_TIMEOUT`], no cross-process wake-ups)
/// and a subscription whose one worker sleeps (poll interval an hour) once its first claim
/// found nothing. A broker each: their wake-ups stay apart.
fn idle_subscription(live: &common::Live, t: &sqlbroker::Table) -> (Broker, Subscription) {
    idle_subscription_with(live, t, None)
}

fn idle_subscription_with(
    live: &common::Live,
    t: &sqlbroker::Table,
    events: Option<Arc<dyn Events>>,
) -> (Broker, Subscription) {
    let broker = Broker::builder(&live.url)
        .statement_timeout(STATEMENT_TIMEOUT)
        .cross_process_wake(false)
        .build()
        .unwrap();
    let mut sub = broker
        .subscription(t)
        .workers(1)
        .poll_interval(Duration::from_secs(3600));
    if let Some(events) = events {
        sub = sub.events(events);
    }
    let sub = sub.start().unwrap();
    assert!(common::wait_for(Duration::from_secs(5), || sub.claiming() == 0));
    // A sleep, not a condition: `claiming() == 0` also holds before the worker's first claim
    // has begun, and an empty claim reports nothing (no event, no count) when it ends. Rows
    // inserted before that claim would be the worker's.
    std::thread::sleep(Duration::from_millis(200));
    (broker, sub)
}

/// `ROWS` ready rows (keys `a`, `b`, `c`), inserted behind the library's back: no wake-up.
fn insert_ready(live: &common::Live, db: Db, t: &sqlbroker::Table) {
    let now = match db {
        // Due a second ago: claims compare with whole seconds.
        Db::Postgres => "now() - interval '1 second'",
        Db::Mysql => "UTC_TIMESTAMP()",
        Db::Sqlite => "0",
    };
    for (k, hex) in [("a", "61"), ("b", "62"), ("c", "63")] {
        let payload = match db {
            Db::Postgres => format!("'\\x{hex}'::bytea"),
            _ => format!("x'{hex}'"),
        };
        live.exec(&format!(
            "INSERT INTO {} (payload, run_at, k) VALUES ({payload}, {now}, '{k}')",
            t.name()
        ));
    }
}

fn a_claim_blocked_on_a_lock_does_not_outlast_the_timeout(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let t = live.table(form, Duration::from_secs(30));
    // One subscription per bounded call, so each call finds its subscription idle (no claim
    // in progress, no empty claim of its own remembered).
    let (_b1, batched) = idle_subscription(&live, &t);
    let (_b2, single) = idle_subscription(&live, &t);
    // Ready rows, then the lock.
    insert_ready(&live, db, &t);
    let locker = Locker::lock(db, &live.url, t.name());

    let started = Instant::now();
    let tried = single.try_next_delivery();
    within("try_next_delivery", started.elapsed(), SLACK);
    assert!(matches!(tried, Err(NextError::Empty)), "{tried:?}");

    let started = Instant::now();
    let batch = batched.next_batch(10, TIMEOUT);
    within("next_batch(10, 100 ms)", started.elapsed(), TIMEOUT + SLACK);
    assert!(matches!(batch, Err(NextError::Timeout)), "{batch:?}");

    let started = Instant::now();
    let one = single.next_delivery_timeout(TIMEOUT);
    within(
        "next_delivery_timeout(100 ms)",
        started.elapsed(),
        TIMEOUT + SLACK,
    );
    assert!(matches!(one, Err(NextError::Timeout)), "{one:?}");

    locker.release();
    // Both subscriptions take what they can: every row exactly once between them.
    let got = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for sub in [&batched, &single] {
            let got = &got;
            s.spawn(move || {
                let deadline = Instant::now() + Duration::from_secs(20);
                while got.lock().unwrap().len() < ROWS && Instant::now() < deadline {
                    if let Ok(batch) = sub.next_batch(10, Duration::from_millis(200)) {
                        for d in batch {
                            got.lock().unwrap().push(d.payload().to_vec());
                            d.ack().unwrap();
                        }
                    }
                }
            });
        }
    });
    // Nothing more: no row was claimed twice.
    for sub in [&batched, &single] {
        if let Ok(d) = sub.next_delivery_timeout(Duration::from_millis(300)) {
            panic!("delivered again: {:?}", d.payload());
        }
    }
    let mut got = got.into_inner().unwrap();
    got.sort();
    assert_eq!(got, [b"a".to_vec(), b"b".to_vec(), b"c".to_vec()]);
    assert_eq!(live.rows(&t), 0, "every row acked");
    for sub in [&batched, &single] {
        sub.shutdown(Duration::from_secs(5)).unwrap();
    }
}
per_db_form!(a_claim_blocked_on_a_lock_does_not_outlast_the_timeout);

/// Records the thread of every claim that took rows.
#[derive(Default)]
struct ClaimThreads(Mutex<Vec<ThreadId>>);

impl Events for ClaimThreads {
    fn claimed(&self, _: &ClaimedRows<'_>) {
        self.0.lock().unwrap().push(std::thread::current().id());
    }
}

/// Where the claim can be bounded at no cost, a call with a timeout shorter than the statement
/// timeout claims on its own thread (no hand-off to a worker): SQLite (its busy timeout). On
/// the servers a blocked statement could outlast the timeout, so a claim worker claims. Fails
/// if either side changes: the handler's thread must (or must not) be the one that claimed.
fn a_short_timeout_claims_on_the_calling_thread_where_the_claim_is_bounded(db: Db, form: Form) {
    let Some(live) = common::live(db) else { return };
    let t = live.table(form, Duration::from_secs(30));
    let threads = Arc::new(ClaimThreads::default());
    let (_b, sub) = idle_subscription_with(&live, &t, Some(threads.clone()));
    insert_ready(&live, db, &t);
    let d = sub
        .next_delivery_timeout(TIMEOUT)
        .unwrap_or_else(|e| panic!("no delivery within {TIMEOUT:?}: {e}"));
    let here = std::thread::current().id();
    let claimers = threads.0.lock().unwrap().clone();
    let bounded = db == Db::Sqlite;
    assert_eq!(
        claimers.first() == Some(&here),
        bounded,
        "{db:?} {form:?}: the first claim ran on {} thread (claims on {claimers:?}, the handler's \
         is {here:?})",
        if claimers.first() == Some(&here) {
            "the handler's"
        } else {
            "a worker's"
        },
    );
    d.ack().unwrap();
    sub.shutdown(Duration::from_secs(5)).unwrap();
}
per_db_form!(a_short_timeout_claims_on_the_calling_thread_where_the_claim_is_bounded);
