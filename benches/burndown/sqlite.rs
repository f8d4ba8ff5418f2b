//! SQLite: the raw loops and the database's cells.

use super::*;
use rusqlite::{params, params_from_iter, Connection};

/// A connection set up as the library sets up its own (`Sqlite::connect`).
fn open(path: &std::path::Path) -> Connection {
    let conn = Connection::open(path).expect("open sqlite");
    conn.busy_timeout(Duration::from_secs(30)).unwrap();
    conn.set_prepared_statement_cache_capacity(64);
    conn.query_row("PRAGMA journal_mode = WAL", [], |_| Ok(()))
        .unwrap();
    conn.execute_batch("PRAGMA synchronous = FULL").unwrap();
    conn
}

struct Lite {
    path: std::path::PathBuf,
    broker: Broker,
    tables: Tables,
    admin: Mutex<Connection>,
    /// The raw side's writer lock: one write statement at a time in this process.
    writer: Mutex<()>,
    /// The raw side's advisory keys.
    keys: Mutex<HashSet<String>>,
}

impl Db for Lite {
    fn name(&self) -> &str {
        "sqlite"
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
            .execute_batch(&format!("DELETE FROM \"{}\"", t.name()))
            .expect("clear");
    }

    fn raw_on(&self, t: &Table, form: Form, batch: usize) -> Box<dyn RawConn + '_> {
        let c = open(&self.path);
        let q = t.name();
        let ready = "\"dead_at\" IS NULL AND \"run_at\" <= ?1";
        // `LIMIT ?2 + 0`, as the library writes it: SQLite compiles a statement with a bare
        // `LIMIT ?` again at every execution.
        let row = "\"id\", \"attempts\", \"payload\", \"k\"";
        match form {
            Form::RowLock => panic!("SQLite has no row lock form"),
            Form::Lease => {
                let candidates = format!(
                    "SELECT \"id\" FROM \"{q}\" WHERE {ready} AND (\"locked_until\" IS NULL OR \
                     \"locked_until\" <= ?1) ORDER BY \"run_at\", \"id\" LIMIT ?2 + 0"
                );
                // The library's `claim_one` for one row, `claim` for more.
                let cmp = if batch == 1 { "=" } else { "IN" };
                let claim = format!(
                    "UPDATE \"{q}\" SET \"locked_until\" = ?3, \"attempts\" = \"attempts\" + 1 \
                     WHERE \"id\" {cmp} ({candidates}) RETURNING {row}"
                );
                let ack =
                    format!("DELETE FROM \"{q}\" WHERE \"id\" = ?1 AND \"locked_until\" = ?2");
                let mut ack_many = Vec::new();
                let mut slots = 1;
                while slots <= size_class(batch) {
                    let tuples: Vec<String> = (0..slots)
                        .map(|i| format!("(?{}, ?{})", 2 * i + 1, 2 * i + 2))
                        .collect();
                    ack_many.push(format!(
                        "DELETE FROM \"{q}\" WHERE (\"id\", \"locked_until\") IN (VALUES {}) \
                         RETURNING \"id\"",
                        tuples.join(", ")
                    ));
                    slots *= 2;
                }
                Box::new(Lease {
                    c,
                    writer: &self.writer,
                    claim,
                    ack,
                    ack_many,
                    batch,
                })
            }
            Form::Advisory => Box::new(Advisory {
                c,
                writer: &self.writer,
                keys: &self.keys,
                candidates: format!(
                    "SELECT \"id\", \"run_at\", \"k\" FROM \"{q}\" WHERE {ready} \
                     ORDER BY \"run_at\", \"id\" LIMIT ?2 + 0"
                ),
                take: format!(
                    "UPDATE \"{q}\" SET \"attempts\" = \"attempts\" + 1 WHERE {ready} AND \
                     \"id\" = ?2 RETURNING {row}"
                ),
                ack: format!("DELETE FROM \"{q}\" WHERE \"id\" = ?1"),
                table: q.to_string(),
                batch,
                scan: (batch * 4).max(32),
            }),
        }
    }
}

/// The lease claim (one statement under the writer lock), then one fenced delete of the
/// rows claimed (the single ack, or the grouped `DELETE .. IN (VALUES ..)`).
struct Lease<'a> {
    c: Connection,
    writer: &'a Mutex<()>,
    claim: String,
    ack: String,
    ack_many: Vec<String>,
    batch: usize,
}

impl RawConn for Lease<'_> {
    fn round(&mut self) -> Option<u64> {
        let now = SystemTime::now();
        let token = epoch_secs(lease_token(now));
        let ids: Vec<i64> = {
            let _w = self.writer.lock().unwrap();
            let mut st = self.c.prepare_cached(&self.claim).unwrap();
            let rows = st
                .query_map(params![epoch_secs(now), self.batch as i64, token], |r| {
                    black_box(r.get::<_, Vec<u8>>(2)?);
                    r.get::<_, i64>(0)
                })
                .unwrap();
            rows.collect::<rusqlite::Result<_>>().unwrap()
        };
        if ids.is_empty() {
            return None;
        }
        let _w = self.writer.lock().unwrap();
        if ids.len() == 1 {
            let mut st = self.c.prepare_cached(&self.ack).unwrap();
            assert_eq!(st.execute(params![ids[0], token]).unwrap(), 1);
        } else {
            let slots = size_class(ids.len());
            let sql = &self.ack_many[slots.trailing_zeros() as usize];
            let mut st = self.c.prepare_cached(sql).unwrap();
            let params = (0..slots).flat_map(|i| [ids[i.min(ids.len() - 1)], token]);
            let deleted = st
                .query_map(params_from_iter(params), |r| r.get::<_, i64>(0))
                .unwrap()
                .count();
            assert_eq!(deleted, ids.len());
        }
        Some(ids.len() as u64)
    }
}

/// Candidates; up to `batch` rows taken whose keys are free (keys in a process-wide set);
/// each deleted, its key freed.
struct Advisory<'a> {
    c: Connection,
    writer: &'a Mutex<()>,
    keys: &'a Mutex<HashSet<String>>,
    candidates: String,
    take: String,
    ack: String,
    table: String,
    batch: usize,
    scan: usize,
}

impl RawConn for Advisory<'_> {
    fn round(&mut self) -> Option<u64> {
        let now = epoch_secs(SystemTime::now());
        let candidates: Vec<(i64, Option<String>)> = {
            let mut st = self.c.prepare_cached(&self.candidates).unwrap();
            let rows = st
                .query_map(params![now, self.scan as i64], |r| {
                    Ok((r.get(0)?, r.get(2)?))
                })
                .unwrap();
            rows.collect::<rusqlite::Result<_>>().unwrap()
        };
        if candidates.is_empty() {
            return None;
        }
        let mut taken = Vec::with_capacity(self.batch);
        for (id, k) in candidates {
            if taken.len() >= self.batch {
                break;
            }
            let key = format!("{}-{}", self.table, k.unwrap_or_default());
            if !self.keys.lock().unwrap().insert(key.clone()) {
                continue;
            }
            let took = {
                let _w = self.writer.lock().unwrap();
                let mut st = self.c.prepare_cached(&self.take).unwrap();
                match st.query_row(params![now, id], |r| r.get::<_, Vec<u8>>(2)) {
                    Ok(payload) => {
                        black_box(payload);
                        true
                    }
                    Err(rusqlite::Error::QueryReturnedNoRows) => false,
                    Err(e) => panic!("take: {e}"),
                }
            };
            if took {
                taken.push((id, key));
            } else {
                self.keys.lock().unwrap().remove(&key);
            }
        }
        let n = taken.len() as u64;
        for (id, key) in taken {
            {
                let _w = self.writer.lock().unwrap();
                let mut st = self.c.prepare_cached(&self.ack).unwrap();
                assert_eq!(st.execute(params![id]).unwrap(), 1);
            }
            self.keys.lock().unwrap().remove(&key);
        }
        Some(n)
    }
}

pub fn run(set: &Settings) -> Vec<Row> {
    let dir = std::env::temp_dir().join("sqlbroker-bench");
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join(format!("{}.db", unique("burn")));
    // Declared first, so it runs last: once the broker and the connections are closed.
    let _cleanup = OnDrop(|| {
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
        }
    });
    let broker = Broker::builder(&format!("sqlite:{}", path.display()))
        .pool_size(POOL)
        .build()
        .expect("sqlite broker");
    let tables = Tables::create(&broker, "burn");
    let lite = Lite {
        admin: Mutex::new(open(&path)),
        path: path.clone(),
        broker,
        tables,
        writer: Mutex::new(()),
        keys: Mutex::default(),
    };
    println!("== sqlite (load {})", load_average());
    let rows = run_db(&lite, &cells(false, &[1, 100]), set, None);
    if backlog::wanted(set, "sqlite") {
        backlog::run(&lite, &lite.tables.big, set);
    }
    rows
}
