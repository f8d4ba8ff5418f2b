//! Faults: the database ends the session that holds a delivery (`pg_terminate_backend`,
//! MySQL/MariaDB `KILL`), or the one running a lease delivery's settlement (see
//! `killed_during_lease_settlement`). The settlement then fails with a transient error (connection lost),
//! and the database has returned the row: row lock with no attempt spent (the transaction was
//! rolled back), advisory with its key released by the session's end.
//!
//! Stale pooled connections: every session of a broker's pool is ended from the outside while
//! it sits idle; after the pool's idle check (1 s) the next publishes, `dead_letters`,
//! `requeue_dead` and a lease subscription's start, claim and ack all succeed: the pool pings a
//! connection idle that long and replaces a dead one (before, each dead one failed one use).
//!
//! Tests running their cases one after another (`SERIAL`), in a test binary of its own, so
//! nothing else of ours shares its moment (the sessions it looks for are the only ones of their
//! kind). Cargo runs test binaries one at a time in name order: the `zz_` prefix runs this one
//! after the rest.

mod common;

use std::sync::{Arc, Barrier, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use common::{next, Db, Live};
use sqlbroker::{Broker, BrokerError, DbErrorKind, Form, Message, Table};

/// The tests of this binary kill sessions they find from the outside: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// The session holding the delivery of a row of `t`, found from the outside. `before`: the
/// sessions that held row locks before the claim.
fn holder(live: &Live, t: &Table, form: Form, before: &[Option<i64>]) -> i64 {
    let name = t.name();
    let sql = match (live.db, form) {
        // The row lock claim's transaction stays open: the only session idle in one whose last
        // statement named this table.
        (Db::Postgres, Form::RowLock) => format!(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() \
             AND state = 'idle in transaction' AND query LIKE '%{name}%'"
        ),
        // The session holding the row's advisory key (the 64-bit key is classid:objid).
        (Db::Postgres, _) => format!(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted \
             AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
             AND ((classid::bigint << 32) | objid::bigint) = hashtextextended('{name}-a', 0)"
        ),
        // The session that opened a locking transaction since the claim began (InnoDB shows
        // a transaction's row locks by table only while another session waits for them).
        (Db::Mysql, Form::RowLock) => MYSQL_LOCKING_SESSIONS.to_string(),
        // The session holding the row's GET_LOCK name (`<database>.<key>`).
        (Db::Mysql, _) => format!(
            "SELECT p.ID FROM information_schema.processlist p \
             WHERE p.ID = IS_USED_LOCK(CONCAT(DATABASE(), '.', '{name}-a'))"
        ),
        (Db::Sqlite, _) => unreachable!("SQLite has no sessions to kill"),
    };
    // InnoDB's information_schema tables are a cache refreshed only when it was last read more
    // than 100 ms ago: poll more slowly than that, or it never refreshes.
    let mut ids = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while ids.is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(250));
        ids = live.ints(&sql);
        ids.retain(|id| !before.contains(id));
    }
    assert_eq!(
        ids.len(),
        1,
        "expected one session holding the delivery, found {ids:?}"
    );
    ids[0].expect("a session id")
}

/// Sessions of the test database with an open InnoDB transaction holding row locks.
const MYSQL_LOCKING_SESSIONS: &str = "SELECT p.ID FROM information_schema.processlist p \
     JOIN information_schema.innodb_trx x ON x.trx_mysql_thread_id = p.ID \
     WHERE p.DB = DATABASE() AND x.trx_rows_locked > 0";

fn kill_session(live: &Live, id: i64) {
    let ended = common::sessions::end_session(live.db, &live.url, id);
    assert!(ended, "session {id} had ended before it was killed");
}

/// A delivery whose session is killed: the settlement fails as a lost connection, and the row is
/// claimable again at once (row lock: attempt 1; advisory: attempt 2).
fn killed_session(live: &Live, form: Form) {
    let t = live.table(form, Duration::ZERO);
    live.broker
        .publish(&t, Message::new(b"fault".to_vec()).set("k", "a"))
        .unwrap();
    let before = if live.db == Db::Mysql {
        live.ints(MYSQL_LOCKING_SESSIONS)
    } else {
        Vec::new()
    };
    let sub = live.broker.subscription(&t).start().unwrap();
    let d = next(&sub, Duration::from_secs(10));
    let id = d.id();
    assert_eq!(d.attempt(), 1);
    let session = holder(live, &t, form, &before);
    kill_session(live, session);

    // Row lock: a retry, whose attempt count would be committed with it; advisory: an ack.
    let settled = if form == Form::RowLock {
        d.retry()
    } else {
        d.ack()
    };
    let e = settled.expect_err("a settlement on a killed session succeeded");
    assert!(
        e.is_transient(),
        "{:?} {}: not transient: {e:?}",
        live.db,
        form.name()
    );
    assert!(
        matches!(
            e,
            BrokerError::Database {
                kind: DbErrorKind::ConnectionLost,
                ..
            }
        ),
        "{:?} {}: expected a lost connection: {e:?}",
        live.db,
        form.name()
    );

    let d = next(&sub, Duration::from_secs(3));
    let expected = if form == Form::RowLock { 1 } else { 2 };
    assert_eq!(
        (d.id(), d.attempt()),
        (id, expected),
        "{:?} {}",
        live.db,
        form.name()
    );
    d.ack().unwrap();
    assert_eq!(live.rows(&t), 0);
    sub.shutdown(Duration::from_secs(5)).unwrap();
    eprintln!(
        "{:?} {}: killed session {session}, settlement failed with {e}, row back",
        live.db,
        form.name()
    );
}

#[test]
fn killed_sessions_return_their_rows() {
    if !common::slow_suite("the fault suite") {
        return;
    }
    let _serial = serial();
    let mut dbs = vec![Db::Postgres];
    if cfg!(feature = "mysql") {
        dbs.push(Db::Mysql);
    }
    for db in dbs {
        let Some(live) = common::live(db) else {
            continue;
        };
        for form in [Form::RowLock, Form::AdvisoryLock] {
            killed_session(&live, form);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// A lease settlement whose session is killed

/// The sessions of the test database running a `DELETE` on table `name` right now.
fn deleting(live: &Live, name: &str) -> Vec<i64> {
    let sql = match live.db {
        Db::Postgres => format!(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() \
             AND state = 'active' AND query LIKE 'DELETE FROM \"{name}\"%'"
        ),
        _ => format!(
            "SELECT ID FROM information_schema.processlist WHERE DB = DATABASE() \
             AND INFO LIKE 'DELETE FROM `{name}`%'"
        ),
    };
    live.ints(&sql).into_iter().flatten().collect()
}

/// A transaction of the test's own holding row `id` of `t` locked: a settlement's statement
/// on it waits, in its session, until the test kills that session or rolls this back.
enum RowLocked {
    Pg(Box<postgres::Client>),
    My(mysql::Conn),
}

impl RowLocked {
    fn new(live: &Live, t: &Table, id: i64) -> RowLocked {
        let lock = format!("SELECT id FROM {} WHERE id = {id} FOR UPDATE", t.name());
        match live.db {
            Db::Postgres => {
                let mut c = postgres::Client::connect(&live.url, postgres::NoTls).unwrap();
                c.batch_execute(&format!("BEGIN; {lock}")).unwrap();
                RowLocked::Pg(Box::new(c))
            }
            _ => {
                use mysql::prelude::Queryable;
                let mut c = mysql::Conn::new(mysql::Opts::from_url(&live.url).unwrap()).unwrap();
                c.query_drop("START TRANSACTION").unwrap();
                c.query_drop(&lock).unwrap();
                RowLocked::My(c)
            }
        }
    }

    fn release(self) {
        match self {
            RowLocked::Pg(mut c) => c.batch_execute("ROLLBACK").unwrap(),
            RowLocked::My(mut c) => {
                mysql::prelude::Queryable::query_drop(&mut c, "ROLLBACK").unwrap()
            }
        }
    }
}

/// A lease delivery's ack whose session is killed while its `DELETE` runs (waiting on a row
/// lock the test holds, so the kill lands inside the statement, not before or after it).
///
/// `kills = 1`: the ack is tried once more on a new session (fenced by the token, so running
/// it twice is safe), which succeeds once the lock is released: `Ok`, and the row is gone.
/// Every session killed (the grouped statement's, then the fenced retry's two): the ack
/// fails as a lost connection (it may have committed, as far as the library can tell); the
/// state says it did not: the row is still there, leased, and comes back once its lease ends
/// (attempt 2). Break the ack's retry alone on a new session after its grouped statement lost
/// its connection (`lease::ack_alone`), and the first case's assertion "the ack failed after
/// one killed session" fails; have a settlement whose sessions were all lost report the lease
/// lost, and the second case's "expected a lost connection" fails.
fn killed_during_lease_settlement(live: &Live, kill_every_session: bool) {
    // Long enough that the row cannot be claimed again before its state is read.
    let lease = Duration::from_secs(5);
    let t = live.table(Form::Lease, lease);
    let id = live
        .broker
        .publish(&t, Message::new(b"fault".to_vec()).set("k", "a"))
        .unwrap();
    let sub = live.broker.subscription(&t).start().unwrap();
    let d = next(&sub, Duration::from_secs(10));
    assert_eq!((d.id(), d.attempt()), (id, 1));
    let locked = RowLocked::new(live, &t, id);
    let (tx, acked) = crossbeam_channel::bounded(1);
    std::thread::spawn(move || {
        let _ = tx.send(d.ack());
    });
    let mut killed = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut locked = Some(locked);
    let outcome = loop {
        if let Ok(r) = acked.try_recv() {
            break r;
        }
        assert!(
            Instant::now() < deadline,
            "{:?}: the ack neither ended nor waited on the row (killed {killed:?})",
            live.db
        );
        let sessions = deleting(live, t.name());
        match sessions.first() {
            Some(&session) if kill_every_session || killed.is_empty() => {
                kill_session(live, session);
                killed.push(session);
                if !kill_every_session {
                    locked.take().unwrap().release();
                }
            }
            _ => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    if let Some(locked) = locked.take() {
        locked.release();
    }
    let db = live.db;
    if kill_every_session {
        let e = outcome.expect_err("an ack whose every session was killed succeeded");
        assert!(
            matches!(
                e,
                BrokerError::Database {
                    kind: DbErrorKind::ConnectionLost,
                    ..
                }
            ),
            "{db:?}: expected a lost connection: {e:?}"
        );
        assert_eq!(killed.len(), 3, "{db:?}: sessions killed {killed:?}");
        // It did not commit: the row is there, leased, its attempt spent.
        assert_eq!(
            live.rows_where(
                &t,
                &format!("id = {id} AND locked_until IS NOT NULL AND attempts = 1")
            ),
            1,
            "{db:?}: the row is not there, leased"
        );
        // Back once its lease ends.
        let again = next(&sub, lease + Duration::from_secs(5));
        assert_eq!((again.id(), again.attempt()), (id, 2), "{db:?}");
        again.ack().unwrap();
    } else {
        assert!(
            outcome.is_ok(),
            "{db:?}: the ack failed after one killed session: {outcome:?}"
        );
        assert_eq!(killed.len(), 1, "{db:?}");
    }
    assert_eq!(live.rows(&t), 0, "{db:?}");
    sub.shutdown(Duration::from_secs(5)).unwrap();
    eprintln!(
        "{db:?} lease: killed {} session(s) of an ack during its DELETE: {}",
        killed.len(),
        if kill_every_session {
            "lost connection, row back after its lease"
        } else {
            "acked on a new session"
        }
    );
}

/// SQLite has no server session to kill: its lease settlements are covered by the injected
/// lost answers of the crate's own tests (`races`).
#[test]
fn lease_settlements_survive_or_report_killed_sessions() {
    if !common::slow_suite("the fault suite") {
        return;
    }
    let _serial = serial();
    let mut dbs = vec![Db::Postgres];
    if cfg!(feature = "mysql") {
        dbs.push(Db::Mysql);
    }
    for db in dbs {
        let Some(live) = common::live(db) else {
            continue;
        };
        killed_during_lease_settlement(&live, false);
        killed_during_lease_settlement(&live, true);
    }
}

// ---------------------------------------------------------------------------------------------
// Stale pooled connections

/// Runs `f` on a thread of its own; a call that does not return within `limit` fails the test.
fn bounded<T: Send + 'static>(
    what: &str,
    limit: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = crossbeam_channel::bounded(1);
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(limit) {
        Ok(v) => v,
        Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
            panic!("{what} did not return within {limit:?}")
        }
        Err(crossbeam_channel::RecvTimeoutError::Disconnected) => panic!("{what} panicked"),
    }
}

/// A broker whose sessions can be found from the outside, exactly
/// ([`common::sessions::Marked`]: PostgreSQL by a unique `application_name`; MariaDB by a user
/// of its own).
struct Marked {
    live: Live,
    broker: Broker,
    marked: common::sessions::Marked,
}

impl Marked {
    fn new(live: Live) -> Marked {
        let marked = common::sessions::Marked::new(live.db, &live.url);
        let broker = Broker::connect(&marked.url).expect("connect");
        Marked {
            live,
            broker,
            marked,
        }
    }

    /// The broker's sessions now.
    fn sessions(&self) -> Vec<i64> {
        self.marked.sessions()
    }

    /// Rows in `t`, counted directly.
    fn rows(&self, t: &Table) -> i64 {
        self.live.rows(t)
    }

    /// A table created through the broker, dropped at the end.
    fn table(&self, t: Table) -> Table {
        self.live.track(t.name());
        let (b, t2) = (self.broker.clone(), t.clone());
        bounded("create table", Duration::from_secs(30), move || {
            b.create_table(&t2)
        })
        .expect("create table");
        t
    }

    /// Publishes from several threads at once until the pool holds at least three
    /// connections (each thread's publish needs one while the others hold theirs).
    fn fill(&self, t: &Table) {
        for _ in 0..20 {
            let threads = 6;
            let barrier = Arc::new(Barrier::new(threads));
            let handles: Vec<_> = (0..threads)
                .map(|i| {
                    let (b, t, barrier) = (self.broker.clone(), t.clone(), barrier.clone());
                    std::thread::spawn(move || {
                        barrier.wait();
                        for j in 0..3 {
                            b.publish(&t, Message::new(format!("fill {i} {j}")).set("k", "f"))?;
                        }
                        Ok::<_, BrokerError>(())
                    })
                })
                .collect();
            for h in handles {
                h.join().expect("a publishing thread").expect("publish");
            }
            if self.sessions().len() >= 3 {
                return;
            }
        }
        panic!(
            "{:?}: precondition: the pool never held three connections ({:?})",
            self.live.db,
            self.sessions()
        );
    }

    /// Ends every session of the broker from the outside, until none is left for a moment
    /// (the pool may be opening one in the background; and the MySQL driver, connecting over
    /// TCP to a local server, moves to its Unix socket, closing the first session itself);
    /// how many it ended.
    fn kill_all(&self) -> usize {
        let mut killed = 0;
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let ids = self.sessions();
            if ids.is_empty() {
                std::thread::sleep(Duration::from_millis(300));
                if self.sessions().is_empty() {
                    return killed;
                }
                continue;
            }
            assert!(
                Instant::now() < deadline,
                "{:?}: sessions {ids:?} still there",
                self.live.db
            );
            for id in ids {
                if self.end_session(id) {
                    killed += 1;
                }
            }
        }
    }

    /// Ends one session and waits until it is gone; false if it had already ended.
    fn end_session(&self, id: i64) -> bool {
        self.marked.end(id)
    }
}

/// Fills the pool with idle connections, kills them all from the outside, waits past the
/// pool's idle check (1 s), then runs `op`, which must succeed: the pool pings a connection
/// idle that long before it hands it out, and replaces a dead one. Catches (before the fix)
/// each dead pooled connection failing one publish, settlement or claim with `ConnectionLost`;
/// `fill` leaves at least three dead, more than the one retry of `dead_letters` and
/// `requeue_dead` absorbs.
fn after_killing_idle<T: Send + 'static>(
    m: &Marked,
    fill: &Table,
    what: &str,
    op: impl FnOnce() -> Result<T, String> + Send + 'static,
) -> T {
    m.fill(fill);
    let killed = m.kill_all();
    assert!(killed >= 3, "precondition: {killed} sessions killed");
    std::thread::sleep(Duration::from_millis(1500));
    let started = Instant::now();
    let r = bounded(what, Duration::from_secs(60), op);
    match r {
        Ok(v) => {
            eprintln!(
                "{:?} stale pool: {killed} sessions killed; {what} ok in {:?}",
                m.live.db,
                started.elapsed()
            );
            v
        }
        Err(e) => panic!(
            "{:?}: {what} after {killed} pooled sessions were killed: {e}",
            m.live.db
        ),
    }
}

fn stale_pool(db: Db) {
    let Some(live) = common::live(db) else {
        return;
    };
    let began = Instant::now();
    let m = Marked::new(live);
    let target = m.table(common::describe(
        &common::unique("t"),
        Form::RowLock,
        Duration::ZERO,
    ));
    let lease = m.table(common::describe(
        &common::unique("t"),
        Form::Lease,
        Duration::from_secs(30),
    ));

    // A dead letter, for `dead_letters` and `requeue_dead` to find.
    let dead_id = {
        let (b, t) = (m.broker.clone(), lease.clone());
        bounded("dead-letter a row", Duration::from_secs(30), move || {
            let id = b.publish(&t, Message::new("dead").set("k", "d"))?;
            let sub = b.subscription(&t).start()?;
            let d = sub
                .next_delivery_timeout(Duration::from_secs(10))
                .expect("the row to dead-letter");
            assert_eq!(d.id(), id);
            d.dead_letter("stale pool test")?;
            sub.shutdown(Duration::from_secs(5))?;
            Ok::<_, BrokerError>(id)
        })
        .unwrap()
    };

    let rows_before = m.rows(&target);
    let (b, t) = (m.broker.clone(), target.clone());
    after_killing_idle(&m, &target, "10 publishes", move || {
        let failed: Vec<String> = (0..10)
            .filter_map(|i| {
                b.publish(&t, Message::new(format!("after {i}")).set("k", "a"))
                    .err()
                    .map(|e| format!("publish {i}: {e}"))
            })
            .collect();
        if failed.is_empty() {
            Ok(())
        } else {
            Err(failed.join("; "))
        }
    });
    // The fill's publishes and the ten.
    assert!(m.rows(&target) >= rows_before + 10);

    let (b, t) = (m.broker.clone(), lease.clone());
    let dead = after_killing_idle(&m, &target, "dead_letters", move || {
        b.dead_letters(&t, 10).map_err(|e| e.to_string())
    });
    assert_eq!(dead.iter().map(|d| d.id).collect::<Vec<_>>(), [dead_id]);

    let (b, t) = (m.broker.clone(), lease.clone());
    let requeued = after_killing_idle(&m, &target, "requeue_dead", move || {
        b.requeue_dead(&t, dead_id).map_err(|e| e.to_string())
    });
    assert!(requeued, "{db:?}: requeue_dead found no dead row {dead_id}");

    let (b, t) = (m.broker.clone(), lease.clone());
    after_killing_idle(
        &m,
        &target,
        "a lease subscription's start, claim and ack",
        move || {
            let sub = b
                .subscription(&t)
                .start()
                .map_err(|e| format!("start: {e}"))?;
            let d = sub
                .next_delivery_timeout(Duration::from_secs(10))
                .map_err(|e| format!("claim: {e} (last error {:?})", sub.last_error()))?;
            if (d.id(), d.attempt()) != (dead_id, 1) {
                return Err(format!("delivered row {} attempt {}", d.id(), d.attempt()));
            }
            d.ack().map_err(|e| format!("ack: {e}"))?;
            // The claim itself must not have failed on a dead connection either.
            if let Some(e) = sub.last_error() {
                return Err(format!("claim failed on the way: {e}"));
            }
            sub.shutdown(Duration::from_secs(5))
                .map_err(|e| format!("shutdown: {e}"))
        },
    );
    assert_eq!(m.rows(&lease), 0);
    eprintln!("{db:?} stale pool: {:?}", began.elapsed());
}

#[test]
fn stale_pooled_connections_are_replaced() {
    if !common::slow_suite("the fault suite") {
        return;
    }
    let _serial = serial();
    let mut dbs = vec![Db::Postgres];
    if cfg!(feature = "mysql") {
        dbs.push(Db::Mysql);
    }
    for db in dbs {
        stale_pool(db);
    }
}
