//! Claims timed by the database itself: a trigger on a lease or advisory table logs each row's
//! take (its `attempts` counted up) and hand-back (counted down) with the database's clock, in
//! microseconds. Tests that ask when or in which order rows were claimed read this log rather
//! than hooks on the client, whose threads may be descheduled between a claim and its record.

use super::{Db, Live};

/// Makes the log `<name>_log` (`id`, `us`, `d`: 1 a take, -1 a hand-back) and its trigger on
/// table `name`; the log is dropped with the test's tables. Returns the log's name.
pub fn take_log(l: &Live, name: &str) -> String {
    let log = format!("{name}_log");
    l.track(&log);
    match l.db {
        Db::Sqlite => {
            l.exec(&format!(
                "CREATE TABLE {log} (n INTEGER PRIMARY KEY, id INTEGER, us INTEGER, d INTEGER)"
            ));
            for (when, d) in [(">", 1), ("<", -1)] {
                l.exec(&format!(
                    "CREATE TRIGGER {log}_{} AFTER UPDATE OF attempts ON {name} WHEN NEW.attempts \
                     {when} OLD.attempts BEGIN INSERT INTO {log} (id, us, d) VALUES (NEW.id, CAST((julianday('now') \
                     - 2440587.5) * 86400000000.0 AS INTEGER), {d}); END",
                    if d > 0 { "up" } else { "down" }
                ));
            }
        }
        Db::Postgres => {
            l.exec(&format!(
                "CREATE TABLE {log} (n bigserial, id bigint, us bigint, d int)"
            ));
            l.exec(&format!(
                "CREATE FUNCTION {log}_f() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN IF \
                 NEW.attempts <> OLD.attempts THEN INSERT INTO {log} (id, us, d) VALUES (NEW.id, \
                 (extract(epoch from clock_timestamp()) * 1000000)::bigint, sign(NEW.attempts - \
                 OLD.attempts)); END IF; RETURN NEW; END $$"
            ));
            l.exec(&format!(
                "CREATE TRIGGER {log}_tr AFTER UPDATE ON {name} FOR EACH ROW EXECUTE FUNCTION {log}_f()"
            ));
        }
        Db::Mysql => {
            l.exec(&format!("CREATE TABLE {log} (n BIGINT AUTO_INCREMENT PRIMARY KEY, id BIGINT, us BIGINT, d INT)"));
            l.exec(&format!(
                "CREATE TRIGGER {log}_tr AFTER UPDATE ON {name} FOR EACH ROW BEGIN IF NEW.attempts \
                 <> OLD.attempts THEN INSERT INTO {log} (id, us, d) VALUES (NEW.id, \
                 ROUND(UNIX_TIMESTAMP(SYSDATE(6)) * 1000000), SIGN(NEW.attempts - OLD.attempts)); \
                 END IF; END"
            ));
        }
    }
    log
}

/// The log's entries `(id, us, d)` in the order they happened: by time, then as inserted
/// (SQLite's clock reads whole milliseconds; its writers take turns, so the insert order is
/// the order of takes).
pub fn logged(l: &Live, log: &str) -> Vec<(i64, i64, i64)> {
    let order = "ORDER BY us, n";
    let ids = l.ints(&format!("SELECT id FROM {log} {order}"));
    let us = l.ints(&format!("SELECT us FROM {log} {order}"));
    let d = l.ints(&format!("SELECT d FROM {log} {order}"));
    ids.into_iter()
        .zip(us)
        .zip(d)
        .filter_map(|((id, us), d)| Some((id?, us?, d?)))
        .collect()
}

/// The takes that stood, `(id, us)` in the order they happened: a take followed by its row's
/// hand-back is dropped.
pub fn stood(l: &Live, log: &str) -> Vec<(i64, i64)> {
    let mut takes: Vec<Option<(i64, i64)>> = Vec::new();
    // Per row, its open take (an index into `takes`) until handed back.
    let mut open = std::collections::HashMap::new();
    for (id, us, d) in logged(l, log) {
        if d > 0 {
            open.insert(id, takes.len());
            takes.push(Some((id, us)));
        } else if let Some(at) = open.remove(&id) {
            takes[at] = None;
        }
    }
    takes.into_iter().flatten().collect()
}

/// Drops what [`take_log`] made that the test's tables do not take with them (PostgreSQL's
/// trigger function).
pub fn drop_take_log(l: &Live, log: &str) {
    if l.db == Db::Postgres {
        l.exec(&format!("DROP TABLE IF EXISTS {log}"));
        l.exec(&format!("DROP FUNCTION IF EXISTS {log}_f() CASCADE"));
    }
}
