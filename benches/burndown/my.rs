//! MySQL / MariaDB: the raw loops and the database's cells.

use super::*;
use mysql::prelude::Queryable;
use mysql::{Conn, Opts, OptsBuilder, Params, Statement};

const VAR: &str = "SQLBROKER_MYSQL_URL";
const DEFAULT_URL: &str = "mysql://root@127.0.0.1:3306/test";

/// A connection with the session the library's connections get.
fn connect(url: &str) -> mysql::Result<Conn> {
    let opts = OptsBuilder::from_opts(Opts::from_url(url)?)
        .additional_capabilities(mysql::consts::CapabilityFlags::CLIENT_FOUND_ROWS)
        .init(vec![
            "SET time_zone = '+00:00'",
            "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED",
        ])
        .stmt_cache_size(256)
        .tcp_connect_timeout(Some(Duration::from_secs(5)));
    Conn::new(opts)
}

/// The `GET_LOCK` name of `<db>.<key>` as the dialect's `lock_name`.
fn lock_name(name: &str) -> String {
    use sha2::{Digest, Sha256};
    if name.chars().count() <= 64 {
        return name.to_string();
    }
    Sha256::digest(name.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A time as the library binds it: a `DATETIME` in UTC, whole seconds.
fn datetime(t: SystemTime) -> mysql::Value {
    let secs = epoch_secs(t);
    let z = secs.div_euclid(86_400) + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u8;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u8;
    let y = (yoe + era * 400 + i64::from(m <= 2)) as u16;
    let rem = secs.rem_euclid(86_400);
    mysql::Value::Date(
        y,
        m,
        d,
        (rem / 3600) as u8,
        (rem % 3600 / 60) as u8,
        (rem % 60) as u8,
        0,
    )
}

/// `ids` padded to `slots` with the last, after `lead`.
fn id_params(lead: Vec<mysql::Value>, ids: &[i64], slots: usize) -> Params {
    let mut p = lead;
    for i in 0..slots {
        p.push(mysql::Value::Int(ids[i.min(ids.len() - 1)]));
    }
    Params::Positional(p)
}

fn placeholders(n: usize) -> String {
    vec!["?"; n].join(", ")
}

struct My {
    url: String,
    name: String,
    db: String,
    broker: Broker,
    tables: Tables,
    admin: Mutex<Conn>,
}

type ClaimRow = (i64, i64, Vec<u8>, Option<String>);

impl Db for My {
    fn name(&self) -> &str {
        &self.name
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
            .query_drop(format!("TRUNCATE TABLE `{}`", t.name()))
            .expect("truncate");
    }

    fn count(&self, t: &Table) -> u64 {
        self.admin
            .lock()
            .unwrap()
            .query_first(format!("SELECT COUNT(*) FROM `{}`", t.name()))
            .expect("count")
            .unwrap_or(0)
    }

    fn raw_on(&self, t: &Table, form: Form, batch: usize) -> Box<dyn RawConn + '_> {
        let mut c = connect(&self.url).expect("raw connection");
        let q = t.name();
        let mut prep = |s: String| c.prep(&s).unwrap_or_else(|e| panic!("prepare {s}: {e}"));
        let row = "`id`, `attempts`, `payload`, `k`";
        let ready = "`dead_at` IS NULL AND `run_at` <= ?";
        let classes = size_class(batch).trailing_zeros() as usize + 1;
        match form {
            Form::RowLock => {
                let claim = prep(format!(
                    "SELECT {row} FROM `{q}` WHERE {ready} ORDER BY `run_at`, `id` LIMIT ? \
                     FOR UPDATE SKIP LOCKED"
                ));
                let ack = prep(format!("DELETE FROM `{q}` WHERE `id` = ?"));
                Box::new(RowLock { c, claim, ack })
            }
            Form::Lease => {
                let claim = prep(format!(
                    "SELECT {row} FROM `{q}` WHERE {ready} AND (`locked_until` IS NULL OR \
                     `locked_until` <= ?) ORDER BY `run_at`, `id` LIMIT ? FOR UPDATE SKIP LOCKED"
                ));
                let marks = (0..classes)
                    .map(|k| {
                        prep(format!(
                            "UPDATE `{q}` SET `locked_until` = ?, `attempts` = `attempts` + 1 \
                             WHERE `id` IN ({})",
                            placeholders(1 << k)
                        ))
                    })
                    .collect();
                let ack = prep(format!(
                    "DELETE FROM `{q}` WHERE `id` = ? AND `locked_until` = ?"
                ));
                let ack_lock = (0..classes)
                    .map(|k| {
                        prep(format!(
                            "SELECT `id`, `locked_until` FROM `{q}` WHERE `id` IN ({}) FOR UPDATE",
                            placeholders(1 << k)
                        ))
                    })
                    .collect();
                let ack_many = (0..classes)
                    .map(|k| {
                        prep(format!(
                            "DELETE FROM `{q}` WHERE `id` IN ({})",
                            placeholders(1 << k)
                        ))
                    })
                    .collect();
                Box::new(Lease {
                    c,
                    claim,
                    marks,
                    ack,
                    ack_lock,
                    ack_many,
                    batch,
                })
            }
            Form::Advisory => {
                let candidates = prep(format!(
                    "SELECT `id`, `run_at`, `k` FROM `{q}` WHERE {ready} ORDER BY `run_at`, `id` LIMIT ?"
                ));
                let take = prep(format!(
                    "UPDATE `{q}` SET `attempts` = `attempts` + 1 WHERE {ready} AND `id` = ?"
                ));
                let fetch = prep(format!("SELECT {row} FROM `{q}` WHERE `id` = ?"));
                let ack = prep(format!("DELETE FROM `{q}` WHERE `id` = ?"));
                let lock = prep("SELECT GET_LOCK(?, 0)".into());
                let unlock = prep("SELECT RELEASE_LOCK(?)".into());
                Box::new(Advisory {
                    c,
                    candidates,
                    take,
                    fetch,
                    ack,
                    lock,
                    unlock,
                    prefix: format!("{}.{q}", self.db),
                    scan: (batch * 4).max(32),
                })
            }
        }
    }
}

/// `START TRANSACTION` (the session is READ COMMITTED); claim one row `FOR UPDATE SKIP
/// LOCKED`; delete it; `COMMIT`.
struct RowLock {
    c: Conn,
    claim: Statement,
    ack: Statement,
}

impl RawConn for RowLock {
    fn round(&mut self) -> Option<u64> {
        let RowLock { c, claim, ack } = self;
        retry(c, |c| {
            c.query_drop("START TRANSACTION")?;
            let now = datetime(SystemTime::now());
            let row: Option<ClaimRow> = c.exec_first(&*claim, (now, 1i64))?;
            let Some((id, _, payload, _)) = row else {
                c.query_drop("COMMIT")?;
                return Ok(None);
            };
            black_box(payload);
            c.exec_drop(&*ack, (id,))?;
            assert_eq!(c.affected_rows(), 1);
            c.query_drop("COMMIT")?;
            Ok(Some(1))
        })
    }
}

/// The library's lease claim transaction (locking select of `batch` rows, one update of
/// their ids, commit), then the ack: the fenced delete for one row, the grouped ack
/// transaction (lock the ids, delete them, commit) for more.
struct Lease {
    c: Conn,
    claim: Statement,
    marks: Vec<Statement>,
    ack: Statement,
    ack_lock: Vec<Statement>,
    ack_many: Vec<Statement>,
    batch: usize,
}

/// A deadlock or a lock wait timeout: the transaction is rolled back and tried again, as
/// the library retries its claims and acks.
fn retry<T>(c: &mut Conn, mut f: impl FnMut(&mut Conn) -> mysql::Result<T>) -> T {
    loop {
        match f(c) {
            Ok(v) => return v,
            Err(mysql::Error::MySqlError(e)) if e.code == 1213 || e.code == 1205 => {
                c.query_drop("ROLLBACK").unwrap();
                RAW_RETRIES.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => panic!("raw: {e}"),
        }
    }
}

impl RawConn for Lease {
    fn round(&mut self) -> Option<u64> {
        let now = SystemTime::now();
        let (now_v, token) = (datetime(now), datetime(lease_token(now)));
        let Lease {
            c,
            claim,
            marks,
            ack,
            ack_lock,
            ack_many,
            batch,
        } = self;
        let mut ids: Vec<i64> = retry(c, |c| {
            c.query_drop("START TRANSACTION")?;
            let rows: Vec<ClaimRow> =
                c.exec(&*claim, (now_v.clone(), now_v.clone(), *batch as i64))?;
            if rows.is_empty() {
                c.query_drop("COMMIT")?;
                return Ok(Vec::new());
            }
            let ids: Vec<i64> = rows
                .into_iter()
                .map(|(id, _, payload, _)| {
                    black_box(payload);
                    id
                })
                .collect();
            let slots = size_class(ids.len());
            let k = slots.trailing_zeros() as usize;
            c.exec_drop(&marks[k], id_params(vec![token.clone()], &ids, slots))?;
            assert_eq!(c.affected_rows(), ids.len() as u64);
            c.query_drop("COMMIT")?;
            Ok(ids)
        });
        if ids.is_empty() {
            return None;
        }
        if ids.len() == 1 {
            retry(c, |c| c.exec_drop(&*ack, (ids[0], token.clone())));
            assert_eq!(c.affected_rows(), 1);
            return Some(1);
        }
        ids.sort_unstable();
        let slots = size_class(ids.len());
        let k = slots.trailing_zeros() as usize;
        retry(c, |c| {
            c.query_drop("START TRANSACTION")?;
            let held: Vec<(i64, mysql::Value)> =
                c.exec(&ack_lock[k], id_params(Vec::new(), &ids, slots))?;
            let kept: Vec<i64> = held
                .into_iter()
                .filter(|(_, t)| *t == token)
                .map(|(id, _)| id)
                .collect();
            assert_eq!(kept.len(), ids.len(), "raw lease ack: tokens differ");
            c.exec_drop(&ack_many[k], id_params(Vec::new(), &kept, slots))?;
            assert_eq!(c.affected_rows(), ids.len() as u64);
            c.query_drop("COMMIT")
        });
        Some(ids.len() as u64)
    }
}

/// Candidates, `GET_LOCK` a key, take the row under it (update, fetch), delete,
/// `RELEASE_LOCK`: one row per claim.
struct Advisory {
    c: Conn,
    candidates: Statement,
    take: Statement,
    fetch: Statement,
    ack: Statement,
    lock: Statement,
    unlock: Statement,
    /// `<database>.<table>`, which starts every lock name.
    prefix: String,
    scan: usize,
}

impl RawConn for Advisory {
    fn round(&mut self) -> Option<u64> {
        let c = &mut self.c;
        let now = datetime(SystemTime::now());
        let candidates: Vec<(i64, mysql::Value, Option<String>)> = c
            .exec(&self.candidates, (now.clone(), self.scan as i64))
            .unwrap();
        if candidates.is_empty() {
            return None;
        }
        for (id, _, k) in candidates {
            let name = lock_name(&format!("{}-{}", self.prefix, k.unwrap_or_default()));
            let locked: Option<Option<i64>> = c.exec_first(&self.lock, (&name,)).unwrap();
            if locked.flatten() != Some(1) {
                continue;
            }
            retry(c, |c| c.exec_drop(&self.take, (now.clone(), id)));
            let took = c.affected_rows() == 1;
            if took {
                let row: Option<ClaimRow> = c.exec_first(&self.fetch, (id,)).unwrap();
                black_box(row.expect("fetch"));
                retry(c, |c| c.exec_drop(&self.ack, (id,)));
                assert_eq!(c.affected_rows(), 1);
            }
            let unlocked: Option<Option<i64>> = c.exec_first(&self.unlock, (&name,)).unwrap();
            assert_eq!(unlocked.flatten(), Some(1));
            if took {
                return Some(1);
            }
        }
        Some(0)
    }
}

pub fn run(set: &Settings) -> Vec<Row> {
    let url = std::env::var(VAR).unwrap_or_else(|_| DEFAULT_URL.to_string());
    let Some(broker) = broker("MySQL/MariaDB", VAR, &url) else {
        return Vec::new();
    };
    let mut admin = match connect(&url) {
        Ok(c) => c,
        Err(e) => {
            skip("MySQL/MariaDB", &url, VAR, &e);
            return Vec::new();
        }
    };
    let db: String = admin
        .query_first("SELECT DATABASE()")
        .ok()
        .flatten()
        .unwrap_or_default();
    let version: String = admin
        .query_first("SELECT VERSION()")
        .ok()
        .flatten()
        .unwrap_or_default();
    let name = if version.to_ascii_lowercase().contains("mariadb") {
        "mariadb"
    } else {
        "mysql"
    };
    let tables = Tables::create(&broker, "burn");
    let my = My {
        url,
        name: name.into(),
        db,
        broker,
        tables,
        admin: Mutex::new(admin),
    };
    let _cleanup = OnDrop(|| {
        let mut c = my.admin.lock().unwrap();
        for t in my.tables.names() {
            let _ = c.query_drop(format!("DROP TABLE IF EXISTS `{t}`"));
            // The library recorded the table's description when it made it.
            let _ = c.query_drop(format!("DELETE FROM sqlbroker_tables WHERE name = '{t}'"));
        }
    });
    println!("== {name} {version} (load {})", load_average());
    let rows = run_db(&my, &cells(true, &[1]), set, None);
    if backlog::wanted(set, name) {
        backlog::run(&my, &my.tables.big, set);
    }
    rows
}
