//! PostgreSQL: the raw loops and the database's cells.

use super::*;
use postgres::{Client, NoTls, Statement};
use std::time::Instant;

const VAR: &str = "SQLBROKER_PG_URL";
const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable";

struct Pg {
    url: String,
    broker: Broker,
    tables: Tables,
    admin: Mutex<Client>,
    /// Diagnostic: raw lease acks of many rows as one `unnest` of two arrays instead of
    /// the library's token and id list.
    array_ack: AtomicBool,
}

impl Db for Pg {
    fn name(&self) -> &str {
        "postgres"
    }

    fn broker(&self) -> &Broker {
        &self.broker
    }

    fn table(&self, form: Form) -> &Table {
        self.tables.get(form)
    }

    fn clear(&self, t: &Table) {
        self.admin
            .lock()
            .unwrap()
            .batch_execute(&format!("TRUNCATE \"{}\"", t.name()))
            .expect("truncate");
    }

    fn fill_fast(&self, t: &Table, n: u64) {
        let sql = format!(
            "INSERT INTO \"{}\" (\"payload\", \"run_at\", \"k\") \
             SELECT $1, $2, 'k-' || g FROM generate_series(0, $3::bigint - 1) AS g",
            t.name()
        );
        let run_at = floor(SystemTime::now()) - Duration::from_secs(1);
        let mut c = self.admin.lock().unwrap();
        c.execute(&sql, &[&PAYLOAD.as_slice(), &run_at, &(n as i64)])
            .expect("fill");
        c.batch_execute(&format!("VACUUM ANALYZE \"{}\"", t.name()))
            .expect("vacuum");
    }

    fn count(&self, t: &Table) -> u64 {
        let n: i64 = self
            .admin
            .lock()
            .unwrap()
            .query_one(&format!("SELECT count(*) FROM \"{}\"", t.name()), &[])
            .expect("count")
            .get(0);
        n as u64
    }

    fn index_blocks(&self, t: &Table) -> Option<u64> {
        let mut c = self.admin.lock().unwrap();
        // This session's view of the statistics is a snapshot per transaction: drop it.
        c.batch_execute("SELECT pg_stat_clear_snapshot()").ok()?;
        let row = c
            .query_opt(
                "SELECT (idx_blks_hit + idx_blks_read)::bigint FROM pg_statio_user_indexes \
                 WHERE indexrelname = $1",
                &[&format!("{}_ready", t.name())],
            )
            .ok()??;
        Some(row.get::<_, i64>(0) as u64)
    }

    fn raw_on(&self, t: &Table, form: Form, batch: usize) -> Box<dyn RawConn + '_> {
        let mut c = Client::connect(&self.url, NoTls).expect("raw connection");
        let q = t.name();
        let mut prep = |s: String| c.prepare(&s).unwrap_or_else(|e| panic!("prepare {s}: {e}"));
        let ready = "\"dead_at\" IS NULL AND \"run_at\" <= $1";
        // The claims' row count behind a sub-select, as the library spells it (so every
        // plan walks the ready index).
        let limit = "LIMIT (SELECT $2::bigint)";
        match form {
            Form::RowLock => {
                let claim = prep(format!(
                    "SELECT \"id\", \"attempts\", \"payload\", \"k\" FROM \"{q}\" WHERE {ready} \
                     ORDER BY \"run_at\", \"id\" {limit} FOR UPDATE SKIP LOCKED"
                ));
                let ack = prep(format!("DELETE FROM \"{q}\" WHERE \"id\" = $1"));
                Box::new(RowLock { c, claim, ack })
            }
            Form::Lease => {
                // The library's claims: from the head, and from its cursor (`claim_from`).
                let claim_sql = |from: &str| {
                    format!(
                        "UPDATE \"{q}\" AS q SET \"locked_until\" = $3, \"attempts\" = q.\"attempts\" + 1 \
                         WHERE q.\"id\" = ANY(ARRAY(SELECT \"id\" FROM \"{q}\" WHERE {ready} AND \
                         (\"locked_until\" IS NULL OR \"locked_until\" <= $1){from} ORDER BY \"run_at\", \"id\" \
                         {limit} FOR UPDATE SKIP LOCKED)) \
                         RETURNING q.\"id\", q.\"attempts\", q.\"payload\", q.\"k\", q.\"run_at\""
                    )
                };
                let claim = prep(claim_sql(""));
                let claim_from = prep(claim_sql(" AND (\"run_at\", \"id\") > ($4, $5)"));
                let ack = prep(format!(
                    "DELETE FROM \"{q}\" WHERE \"id\" = $1 AND \"locked_until\" = $2"
                ));
                // The grouped ack (`ack_many_sql`) of one claim: its token, its ids.
                let ack_many = prep(format!(
                    "DELETE FROM \"{q}\" WHERE (\"locked_until\" = $1 AND \"id\" = \
                     ANY($2::text::bigint[])) RETURNING \"id\""
                ));
                let array_ack = self.array_ack.load(Ordering::Relaxed).then(|| {
                    prep(format!(
                        "DELETE FROM \"{q}\" WHERE (\"id\", \"locked_until\") IN \
                         (SELECT * FROM unnest($1::bigint[], $2::timestamptz[])) RETURNING \"id\""
                    ))
                });
                Box::new(Lease {
                    c,
                    claim,
                    claim_from,
                    cursor: RawCursor::default(),
                    ack,
                    ack_many,
                    array_ack,
                    batch,
                })
            }
            Form::Advisory => {
                let candidates = prep(format!(
                    "SELECT \"id\", \"run_at\", \"k\" FROM \"{q}\" WHERE {ready} \
                     ORDER BY \"run_at\", \"id\" {limit}"
                ));
                let take = prep(format!(
                    "UPDATE \"{q}\" SET \"attempts\" = \"attempts\" + 1 WHERE {ready} AND \"id\" = $2 \
                     RETURNING \"id\", \"attempts\", \"payload\", \"k\""
                ));
                let ack = prep(format!("DELETE FROM \"{q}\" WHERE \"id\" = $1"));
                let lock = prep("SELECT pg_try_advisory_lock(hashtextextended($1, 0))::int".into());
                let unlock = prep("SELECT pg_advisory_unlock(hashtextextended($1, 0))::int".into());
                Box::new(Advisory {
                    c,
                    candidates,
                    take,
                    ack,
                    lock,
                    unlock,
                    table: q.to_string(),
                    scan: (batch * 4).max(32),
                })
            }
        }
    }
}

/// `BEGIN`; claim one row `FOR UPDATE SKIP LOCKED`; delete it; `COMMIT`.
struct RowLock {
    c: Client,
    claim: Statement,
    ack: Statement,
}

impl RawConn for RowLock {
    fn round(&mut self) -> Option<u64> {
        let c = &mut self.c;
        c.batch_execute("BEGIN ISOLATION LEVEL READ COMMITTED")
            .unwrap();
        let now = floor(SystemTime::now());
        let rows = c.query(&self.claim, &[&now, &1i64]).unwrap();
        let Some(row) = rows.first() else {
            c.batch_execute("COMMIT").unwrap();
            return None;
        };
        let id: i64 = row.get(0);
        black_box(row.get::<_, &[u8]>(2));
        assert_eq!(c.execute(&self.ack, &[&id]).unwrap(), 1);
        c.batch_execute("COMMIT").unwrap();
        Some(1)
    }
}

/// The lease claim of `batch` rows (one statement, one commit), then one token-fenced delete
/// of the rows claimed.
struct Lease {
    c: Client,
    claim: Statement,
    claim_from: Statement,
    cursor: RawCursor,
    ack: Statement,
    ack_many: Statement,
    array_ack: Option<Statement>,
    batch: usize,
}

impl RawConn for Lease {
    fn round(&mut self) -> Option<u64> {
        let c = &mut self.c;
        let now = SystemTime::now();
        let token = lease_token(now);
        let limit = self.batch as i64;
        let rows = match self.cursor.start() {
            Some((run_at, id)) => c
                .query(
                    &self.claim_from,
                    &[&floor(now), &limit, &token, &run_at, &id],
                )
                .unwrap(),
            None => c
                .query(&self.claim, &[&floor(now), &limit, &token])
                .unwrap(),
        };
        self.cursor.advance(
            self.batch,
            rows.iter()
                .map(|r| (r.get::<_, SystemTime>(4), r.get::<_, i64>(0))),
        );
        if rows.is_empty() {
            return None;
        }
        let ids: Vec<i64> = rows
            .iter()
            .map(|r| {
                black_box(r.get::<_, &[u8]>(2));
                r.get(0)
            })
            .collect();
        if ids.len() == 1 {
            assert_eq!(c.execute(&self.ack, &[&ids[0], &token]).unwrap(), 1);
        } else if let Some(st) = &self.array_ack {
            let tokens = vec![token; ids.len()];
            assert_eq!(c.query(st, &[&ids, &tokens]).unwrap().len(), ids.len());
        } else {
            let list: Vec<String> = ids.iter().map(i64::to_string).collect();
            let list = format!("{{{}}}", list.join(","));
            let rows = c.query(&self.ack_many, &[&token, &list]).unwrap();
            assert_eq!(rows.len(), ids.len());
        }
        Some(ids.len() as u64)
    }
}

/// The library's claim cursor (`src/runtime/cursor.rs`), one per raw connection: claims start
/// after the largest `(run_at, id)` claimed; from the head again after a claim that found fewer
/// rows than asked, and at least once a second.
struct RawCursor {
    after: Option<(SystemTime, i64)>,
    rescan_at: Instant,
}

impl Default for RawCursor {
    fn default() -> Self {
        RawCursor {
            after: None,
            rescan_at: Instant::now() + Duration::from_secs(1),
        }
    }
}

impl RawCursor {
    fn start(&mut self) -> Option<(SystemTime, i64)> {
        if Instant::now() >= self.rescan_at {
            *self = RawCursor::default();
        }
        self.after
    }

    fn advance(&mut self, limit: usize, keys: impl Iterator<Item = (SystemTime, i64)>) {
        let (mut taken, mut last) = (0, None);
        for k in keys {
            taken += 1;
            last = last.max(Some(k));
        }
        if taken < limit {
            *self = RawCursor::default();
        } else {
            self.after = self.after.max(last);
        }
    }
}

/// Candidates, try a key, take the row under it, delete, unlock: one row per claim.
struct Advisory {
    c: Client,
    candidates: Statement,
    take: Statement,
    ack: Statement,
    lock: Statement,
    unlock: Statement,
    table: String,
    scan: usize,
}

impl RawConn for Advisory {
    fn round(&mut self) -> Option<u64> {
        let c = &mut self.c;
        let now = floor(SystemTime::now());
        let candidates = c
            .query(&self.candidates, &[&now, &(self.scan as i64)])
            .unwrap();
        if candidates.is_empty() {
            return None;
        }
        for cand in &candidates {
            let id: i64 = cand.get(0);
            let k: Option<String> = cand.get(2);
            let key = format!("{}-{}", self.table, k.unwrap_or_default());
            let locked: i32 = c.query_one(&self.lock, &[&key]).unwrap().get(0);
            if locked != 1 {
                continue;
            }
            let took = match c.query_opt(&self.take, &[&now, &id]).unwrap() {
                Some(row) => {
                    black_box(row.get::<_, &[u8]>(2));
                    assert_eq!(c.execute(&self.ack, &[&id]).unwrap(), 1);
                    true
                }
                None => false,
            };
            let unlocked: i32 = c.query_one(&self.unlock, &[&key]).unwrap().get(0);
            assert_eq!(unlocked, 1);
            if took {
                return Some(1);
            }
        }
        Some(0)
    }
}

/// `postgres/diag/lease_ack_sql`: the raw lease loop, 4 connections, batch 100, with the
/// ack of the 100 rows spelled as the library spells it (the claim's token and its ids as a
/// text array) against one `unnest` of two binary arrays, alternating.
fn ack_sql_diagnostic(pg: &Pg, set: &Settings) {
    let id = "postgres/diag/lease_ack_sql/w4/b100";
    if !set.wants(id) {
        return;
    }
    let t = pg.table(Form::Lease);
    let n = set.jobs.unwrap_or(20_000);
    let (mut pairs, mut arrays) = (Runs::default(), Runs::default());
    for _ in 0..set.rounds {
        for (array, runs) in [(false, &mut pairs), (true, &mut arrays)] {
            pg.clear(t);
            publish(&pg.broker, t, n, 0);
            pg.array_ack.store(array, Ordering::Relaxed);
            runs.0.push(raw_run(pg, Form::Lease, 4, 100, n));
        }
    }
    pg.array_ack.store(false, Ordering::Relaxed);
    pg.clear(t);
    println!(
        "{id}: raw, {n} jobs: ack as token and id list (library) {:.0} jobs/s ({}), as unnest \
         of two arrays {:.0} jobs/s ({}): {:.2}x",
        pairs.best(),
        pairs.list(),
        arrays.best(),
        arrays.list(),
        arrays.best() / pairs.best()
    );
}

pub fn run(set: &Settings) -> Vec<Row> {
    let url = std::env::var(VAR).unwrap_or_else(|_| DEFAULT_URL.to_string());
    let Some(broker) = broker("PostgreSQL", VAR, &url) else {
        return Vec::new();
    };
    let admin = match Client::connect(&url, NoTls) {
        Ok(c) => c,
        Err(e) => {
            skip("PostgreSQL", &url, VAR, &e);
            return Vec::new();
        }
    };
    let tables = Tables::create(&broker, "burn");
    let pg = Pg {
        url: url.clone(),
        broker,
        tables,
        admin: Mutex::new(admin),
        array_ack: AtomicBool::new(false),
    };
    let _cleanup = OnDrop(|| {
        let mut c = pg.admin.lock().unwrap();
        for t in pg.tables.names() {
            let _ = c.batch_execute(&format!(
                "DROP TABLE IF EXISTS \"{t}\"; DELETE FROM sqlbroker_tables WHERE name = '{t}'"
            ));
        }
    });
    println!("== postgres (load {})", load_average());
    let cells = cells(true, &[1]);
    let wanted = cells.iter().any(|c| set.wants(&c.id("postgres")));
    let pgbench = if wanted {
        PgBench::new(&url, &set.pgbench_dir)
    } else {
        None
    };
    let rows = run_db(&pg, &cells, set, pgbench);
    ack_sql_diagnostic(&pg, set);
    if set.wants("postgres/scale") || set.wants("postgres/memory") {
        scale_checks(&pg, &pg.tables.big, set);
    }
    if backlog::wanted(set, "postgres") {
        backlog::run(&pg, &pg.tables.big, set);
    }
    rows
}
