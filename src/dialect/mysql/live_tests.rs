//! Live checks of the session layer against the server at `SQLBROKER_MYSQL_URL` (default
//! `mysql://root@127.0.0.1:3306/test`); skipped loudly when it is not reachable, unless
//! `SQLBROKER_REQUIRE_SERVERS=1`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use super::sql::quote_ident;
use super::Mysql;
use crate::dialect::{DbConn, Dialect, TableSql};
use crate::error::DbErrorKind;
use crate::model::schedule::from_epoch_secs;
use crate::model::table::Table;
use crate::model::table::{Form, TableSpec};
use crate::model::value::Value;

fn dialect() -> Option<Mysql> {
    let url = std::env::var("SQLBROKER_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into());
    let d = Mysql::from_url(&url, &crate::dialect::test_options()).expect("url");
    match d.connect() {
        Ok(_) => Some(d),
        Err(e) if std::env::var("SQLBROKER_REQUIRE_SERVERS").is_ok_and(|v| v == "1") => {
            panic!("SQLBROKER_REQUIRE_SERVERS=1 but MySQL at {url} is not reachable: {e}")
        }
        Err(e) => {
            eprintln!("\n!!!!! SKIPPED: MySQL at {url} is not reachable ({e}) !!!!!\n");
            None
        }
    }
}

/// A table of its own, dropped at the end.
struct Scratch<'a> {
    d: &'a Mysql,
    spec: TableSpec,
}

impl<'a> Scratch<'a> {
    fn new(d: &'a Mysql, t: impl FnOnce(String) -> Table) -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let name = format!(
            "unit_{}_{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        let spec = t(name).validate().unwrap();
        let mut c = d.connect().unwrap();
        for stmt in d.create_table(&spec) {
            c.batch(&stmt).unwrap();
        }
        Scratch { d, spec }
    }
}

impl Drop for Scratch<'_> {
    fn drop(&mut self) {
        if let Ok(mut c) = self.d.connect() {
            let _ = c.batch(&format!(
                "DROP TABLE IF EXISTS {}",
                quote_ident(&self.spec.name)
            ));
        }
    }
}

fn insert(c: &mut dyn DbConn, sql: &TableSql, values: &[Value]) -> i64 {
    assert_eq!(c.execute(&sql.insert_one, values).unwrap(), 1);
    c.query("SELECT LAST_INSERT_ID()", &[]).unwrap()[0][0]
        .as_i64()
        .unwrap()
}

/// `n` rows of a plain table (payload and due time), due at `now`; their ids.
fn insert_due(c: &mut dyn DbConn, sql: &TableSql, now: SystemTime, n: usize) -> Vec<i64> {
    (0..n)
        .map(|_| insert(c, sql, &[Value::Bytes(b"x".to_vec()), Value::Time(now)]))
        .collect()
}

#[test]
fn values_survive_the_columns() {
    let Some(d) = dialect() else { return };
    let s = Scratch::new(&d, |n| {
        Table::new(n)
            .text_column("t")
            .bytes_column("b")
            .int_column("i")
            .float_column("f")
            .lease(Duration::from_secs(5))
    });
    let sql = d.compile(&s.spec);
    let mut c = d.connect().unwrap();
    let due = from_epoch_secs(1_700_000_000);
    let vals = [
        Value::Bytes(vec![0, 159, 146, 150]),
        Value::Time(due),
        Value::Text("grüße ✓".into()),
        Value::Bytes(vec![255, 0, 1]),
        Value::Int(-9_007_199_254_740_993),
        Value::Float(0.1),
    ];
    let id = insert(&mut *c, &sql, &vals);
    let row = &c.query(&sql.fetch, &[Value::Int(id)]).unwrap()[0];
    assert_eq!(row[..3], [Value::Int(id), Value::Int(0), vals[0].clone()]);
    // The user columns, the cancel request, then the due time (last, `row_columns`).
    assert_eq!(
        row[3..],
        [&vals[2..], &[Value::Int(0)], &vals[1..2]].concat()[..]
    );
    let nulls = insert(
        &mut *c,
        &sql,
        &[
            Value::Bytes(vec![]),
            Value::Time(due),
            Value::Null,
            Value::Null,
            Value::Null,
            Value::Null,
        ],
    );
    let row = &c.query(&sql.fetch, &[Value::Int(nulls)]).unwrap()[0];
    assert_eq!(
        row[2..],
        [
            Value::Bytes(vec![]),
            Value::Null,
            Value::Null,
            Value::Null,
            Value::Null,
            Value::Int(0),
            Value::Time(due),
        ]
    );
    let at = c.query(
        &format!(
            "SELECT `run_at` FROM {} WHERE `id` = ?",
            quote_ident(&s.spec.name)
        ),
        &[Value::Int(id)],
    );
    assert_eq!(at.unwrap()[0][0], Value::Time(due));
}

#[test]
fn lease_claim_renew_and_fence() {
    let Some(d) = dialect() else { return };
    let s = Scratch::new(&d, |n| Table::new(n).lease(Duration::from_secs(5)));
    let sql = d.compile(&s.spec);
    let mut c = d.connect().unwrap();
    let now = crate::model::schedule::floor(SystemTime::now());
    let ids = insert_due(&mut *c, &sql, now, 3);
    let token = now + Duration::from_secs(5);
    let rows = d.lease_claim(&mut *c, &sql, now, 2, token, None).unwrap();
    assert_eq!(
        rows.iter()
            .map(|r| (r[0].clone(), r[1].clone()))
            .collect::<Vec<_>>(),
        [
            (Value::Int(ids[0]), Value::Int(1)),
            (Value::Int(ids[1]), Value::Int(1))
        ]
    );
    let rows = d.lease_claim(&mut *c, &sql, now, 5, token, None).unwrap();
    assert_eq!(rows.len(), 1);
    assert!(d
        .lease_claim(&mut *c, &sql, now, 5, token, None)
        .unwrap()
        .is_empty());
    // Renewing to the value the row already holds still renews (no row count involved).
    assert_eq!(
        d.lease_renew(&mut *c, &s.spec, token, &[(ids[0], token)])
            .unwrap(),
        [ids[0]]
    );
    let later = token + Duration::from_secs(3);
    let wrong = token - Duration::from_secs(1);
    let mut renewed = d
        .lease_renew(
            &mut *c,
            &s.spec,
            later,
            &[(ids[1], token), (ids[2], wrong), (999_999, token)],
        )
        .unwrap();
    renewed.sort_unstable();
    assert_eq!(renewed, [ids[1]]);
    // Fenced settlements: the right token matches one row, a stale one none.
    assert_eq!(
        c.execute(&sql.unclaim, &[Value::Int(ids[1]), Value::Time(token)])
            .unwrap(),
        0
    );
    assert_eq!(
        c.execute(&sql.unclaim, &[Value::Int(ids[1]), Value::Time(later)])
            .unwrap(),
        1
    );
    assert_eq!(
        c.execute(&sql.ack, &[Value::Int(ids[0]), Value::Time(token)])
            .unwrap(),
        1
    );
    assert!(!c.is_broken());
}

#[test]
fn deadlock_and_lock_wait_are_transient() {
    let Some(d) = dialect() else { return };
    let s = Scratch::new(&d, Table::new);
    let sql = d.compile(&s.spec);
    let (mut a, mut b, mut w) = (
        d.connect().unwrap(),
        d.connect().unwrap(),
        d.connect().unwrap(),
    );
    let now = Value::Time(from_epoch_secs(1_700_000_000));
    let one = insert(&mut *a, &sql, &[Value::Bytes(vec![1]), now.clone()]);
    let two = insert(&mut *a, &sql, &[Value::Bytes(vec![2]), now]);
    let lock = format!(
        "SELECT `id` FROM {} WHERE `id` = ? FOR UPDATE",
        quote_ident(&s.spec.name)
    );
    a.batch("START TRANSACTION").unwrap();
    a.query(&lock, &[Value::Int(one)]).unwrap();
    b.batch("START TRANSACTION").unwrap();
    b.query(&lock, &[Value::Int(two)]).unwrap();

    // A lock wait timeout (this session only).
    w.batch("SET SESSION innodb_lock_wait_timeout = 1").unwrap();
    w.batch("START TRANSACTION").unwrap();
    let e = w.query(&lock, &[Value::Int(one)]).unwrap_err();
    assert_eq!(e.kind, DbErrorKind::Transient, "{e}");
    assert!(!w.is_broken());
    w.batch("ROLLBACK").unwrap();

    // A deadlock: each waits for the other, whichever asks first; one is rolled back.
    let lock2 = lock.clone();
    let waiter = std::thread::spawn(move || {
        let r = a.query(&lock2, &[Value::Int(two)]).map(|_| ());
        (r, a)
    });
    std::thread::sleep(Duration::from_millis(300));
    let mine = b.query(&lock, &[Value::Int(one)]).map(|_| ());
    let (theirs, mut a) = waiter.join().unwrap();
    let failed: Vec<_> = [&mine, &theirs]
        .into_iter()
        .filter_map(|r| r.as_ref().err())
        .collect();
    assert_eq!(failed.len(), 1, "{mine:?} {theirs:?}");
    assert_eq!(failed[0].kind, DbErrorKind::Transient, "{}", failed[0]);
    a.batch("ROLLBACK").unwrap();
    b.batch("ROLLBACK").unwrap();
    assert!(!a.is_broken() && !b.is_broken());
}

#[test]
fn killed_session_is_connection_lost() {
    let Some(d) = dialect() else { return };
    let (mut victim, mut killer) = (d.connect().unwrap(), d.connect().unwrap());
    let id = victim.query("SELECT CONNECTION_ID()", &[]).unwrap()[0][0]
        .as_i64()
        .unwrap();
    killer.batch(&format!("KILL {id}")).unwrap();
    let e = victim.query("SELECT 1", &[]).unwrap_err();
    assert_eq!(e.kind, DbErrorKind::ConnectionLost, "{e}");
    assert!(victim.is_broken());
}

#[test]
fn advisory_keys_are_per_session_and_take_fetches() {
    let Some(d) = dialect() else { return };
    let s = Scratch::new(&d, |n| Table::new(n).text_column("k").advisory_lock("{k}"));
    let sql = d.compile(&s.spec);
    let (mut a, mut b) = (d.connect().unwrap(), d.connect().unwrap());
    let name = Value::Text(d.key_name(&format!("{}-{}", s.spec.name, "x".repeat(80))));
    let lock = sql.key_lock.as_deref().unwrap();
    let unlock = sql.key_unlock.as_deref().unwrap();
    assert_eq!(
        a.query(lock, std::slice::from_ref(&name)).unwrap(),
        [[Value::Int(1)]]
    );
    assert_eq!(
        b.query(lock, std::slice::from_ref(&name)).unwrap(),
        [[Value::Int(0)]]
    );
    assert_eq!(
        b.query(unlock, std::slice::from_ref(&name)).unwrap(),
        [[Value::Int(0)]]
    );
    assert_eq!(
        a.query(unlock, std::slice::from_ref(&name)).unwrap(),
        [[Value::Int(1)]]
    );
    assert_eq!(
        b.query(unlock, std::slice::from_ref(&name)).unwrap(),
        [[Value::Null]]
    );

    let now = crate::model::schedule::floor(SystemTime::now());
    let id = insert(
        &mut *a,
        &sql,
        &[
            Value::Bytes(b"p".to_vec()),
            Value::Time(now),
            Value::Text("k1".into()),
        ],
    );
    let row = d
        .advisory_take(&mut *a, &sql, now, id, None)
        .unwrap()
        .unwrap();
    assert_eq!(
        row,
        [
            Value::Int(id),
            Value::Int(1),
            Value::Bytes(b"p".to_vec()),
            Value::Text("k1".into()),
            Value::Int(0),
            Value::Time(now),
        ]
    );
    // Dead rows are not taken.
    a.execute(
        &sql.dead,
        &[
            Value::Time(now),
            Value::Text("r".into()),
            Value::Null,
            Value::Int(0),
            Value::Int(id),
        ],
    )
    .unwrap();
    assert_eq!(d.advisory_take(&mut *a, &sql, now, id, None).unwrap(), None);
}

#[test]
fn server_passes_its_floor() {
    let Some(d) = dialect() else { return };
    let mut c = d.connect().unwrap();
    for form in [Form::RowLock, Form::Lease, Form::AdvisoryLock] {
        d.check_server(&mut *c, form).unwrap();
    }
}

/// The shared server is one MariaDB without Galera: the probe says so, and every form may
/// start there whatever the single-writer declaration.
#[test]
fn a_server_without_galera_is_a_single_server() {
    let Some(d) = dialect() else { return };
    let mut c = d.connect().unwrap();
    assert_eq!(
        super::galera::probe(&mut *c).unwrap(),
        super::galera::Topology::Single
    );
    d.inspect(&mut *c).unwrap();
    for t in [
        Table::new("g1"),
        Table::new("g2").text_column("k").advisory_lock("g2-{k}"),
        Table::new("g3")
            .group("g")
            .fifo()
            .lease(Duration::from_secs(30)),
    ] {
        d.check_cluster(&t.validate().unwrap()).unwrap();
    }
}

/// Operators' counts probe a limit's slot keys by name: a slot another session holds is
/// counted, under a short name and under one hashed past `GET_LOCK`'s bound alike; fails if
/// the probe names a key otherwise than the lock does.
#[test]
fn slots_held_are_counted_by_name() {
    let Some(d) = dialect() else { return };
    let (mut a, mut b) = (d.connect().unwrap(), d.connect().unwrap());
    let tag = format!("unit-slots-{}", std::process::id());
    let short = format!("{tag}#");
    let long = format!("{tag}-{}#", "x".repeat(80));
    for name in [format!("{short}0"), format!("{short}2"), format!("{long}3")] {
        let name = Value::Text(d.key_name(&name));
        assert_eq!(
            a.query("SELECT GET_LOCK(?, 0)", &[name]).unwrap(),
            [[Value::Int(1)]]
        );
    }
    let none = format!("{tag}-none#");
    let keys = [short.clone(), none, long];
    assert_eq!(d.slots_held(&mut *b, &keys, 0, 5).unwrap(), [2, 0, 1]);
    assert_eq!(
        d.slots_held(&mut *b, &keys, 0, 2).unwrap(),
        [1, 0, 0],
        "slots 2 and 3 are past a max of 2"
    );
    assert_eq!(
        d.slots_held(&mut *b, &keys, 2, 5).unwrap(),
        [1, 0, 1],
        "slots 2 and 3 are past a max of 2"
    );
    // Past one statement's run of keys: each is still counted in its place.
    let many: Vec<String> = (0..250).map(|i| format!("{tag}-{i}#")).collect();
    let mut with_short = many.clone();
    with_short[217] = short;
    let held = d.slots_held(&mut *b, &with_short, 0, 5).unwrap();
    assert_eq!(
        (held.len(), held[217], held.iter().sum::<u32>()),
        (250, 2, 2)
    );
    a.query("SELECT RELEASE_ALL_LOCKS()", &[]).unwrap();
    assert_eq!(d.slots_held(&mut *b, &keys, 0, 5).unwrap(), [0, 0, 0]);
}

/// The idle poll's check past the cursor runs on the server and binds `(now, now, run_at,
/// run_at, id)` in that order: a ready row past the cursor is found, none once the cursor is
/// at the last row, and rows under a live lease are not counted. (The claimer treats an error
/// as "unsure" and claims, so a statement the server refused would pass unseen elsewhere.)
#[test]
fn the_idle_check_reads_past_the_cursor() {
    let Some(d) = dialect() else { return };
    let s = Scratch::new(&d, |n| Table::new(n).lease(Duration::from_secs(5)));
    let sql = d.compile(&s.spec);
    let check = sql
        .any_ready_from
        .as_deref()
        .expect("a lease table's check");
    let mut c = d.connect().unwrap();
    let now = crate::model::schedule::floor(SystemTime::now());
    let ids = insert_due(&mut *c, &sql, now, 2);
    let found = |c: &mut dyn DbConn, after: i64| {
        let mut args = vec![Value::Time(now); 4];
        args.push(Value::Int(after));
        c.query(check, &args).expect("the check runs").len()
    };
    assert_eq!(found(&mut *c, ids[0] - 1), 1);
    assert_eq!(found(&mut *c, ids[0]), 1);
    assert_eq!(found(&mut *c, ids[1]), 0, "nothing past the last row");
    let token = now + Duration::from_secs(5);
    let leased = d.lease_claim(&mut *c, &sql, now, 2, token, None).unwrap();
    assert_eq!(leased.len(), 2);
    assert_eq!(found(&mut *c, ids[0] - 1), 0, "rows under a live lease");
}

/// A fair claim's locked read of a key locks that key's rows alone. Found by
/// `tests/flow_fair_order.rs` (a row claimed after 20-50 later rows of its key, one run in
/// eight): with a key's range emptied (its rows claimed and deleted, their entries kept from
/// purge by a snapshot held elsewhere), MariaDB planned the key's read over the ready index
/// and kept every row it walked, of the other keys, locked until commit; a claim beside it
/// passed them by and its key cursor went past them. The read names the key's index
/// (`Syntax::force_index`). Fails without it: 49 rows locked where 1 was read.
#[test]
fn a_fair_read_locks_its_keys_rows_alone() {
    let Some(d) = dialect() else { return };
    let s = Scratch::new(&d, |n| {
        Table::new(n)
            .text_column("k")
            .fair("{k}")
            .lease(Duration::from_secs(5))
    });
    let sql = d.compile(&s.spec);
    let t = quote_ident(&s.spec.name);
    let mut c = d.connect().unwrap();
    let now = crate::model::schedule::floor(SystemTime::now());
    for i in 0..320 {
        let k = if i % 2 == 0 { "d" } else { "a" };
        let row = [
            Value::Bytes(b"x".to_vec()),
            Value::Time(now),
            Value::Text(k.into()),
        ];
        insert(&mut *c, &sql, &row);
    }
    // A snapshot held elsewhere keeps the deleted rows' entries from purge.
    let mut snapshot = d.connect().unwrap();
    snapshot
        .batch("START TRANSACTION WITH CONSISTENT SNAPSHOT")
        .unwrap();
    snapshot
        .query(&format!("SELECT COUNT(*) FROM {t}"), &[])
        .unwrap();
    c.batch(&format!("DELETE FROM {t} WHERE `k` = 'd' OR `id` < (SELECT m FROM (SELECT MAX(`id`) - 47 AS m FROM {t}) AS x)"))
        .unwrap();
    // Key `d` (2 rows asked, none left), key `a` (1), the `NULL` key (1), locked, from the
    // head of each key's range.
    let heads = super::sql::SYNTAX.fair_heads(&s.spec, 2, true, true);
    let mut params = Vec::new();
    for (k, n) in [
        (Value::Text("d".into()), 2),
        (Value::Text("a".into()), 1),
        (Value::Null, 1),
    ] {
        if k != Value::Null {
            params.push(k);
        }
        params.extend([
            Value::Time(std::time::UNIX_EPOCH),
            Value::Time(std::time::UNIX_EPOCH),
            Value::Int(i64::MIN),
            Value::Time(now),
            Value::Time(now),
            Value::Int(n),
        ]);
    }
    c.batch("START TRANSACTION").unwrap();
    let rows = c.query(&heads, &params).unwrap();
    let locked = c
        .query(
            "SELECT trx_rows_locked FROM information_schema.INNODB_TRX WHERE \
             trx_mysql_thread_id = CONNECTION_ID()",
            &[],
        )
        .unwrap();
    c.batch("ROLLBACK").unwrap();
    snapshot.batch("ROLLBACK").unwrap();
    assert_eq!(rows.len(), 1, "key a's first row");
    let locked = locked[0][0].as_i64().unwrap();
    assert!(locked <= 2, "{locked} rows locked for 1 read");
}
