//! MySQL 8.0.1+ and MariaDB 10.6+. All MySQL-protocol SQL and `mysql` driver calls live here.
//!
//! - Row lock: `SET TRANSACTION ISOLATION LEVEL ..` (READ COMMITTED unless the table names
//!   another level: a locking read then locks the rows it takes, not the gaps between them, so
//!   publishers never wait on a claim), `START TRANSACTION`, then
//!   `SELECT .. FOR UPDATE SKIP LOCKED`; the transaction stays open on the delivery's connection.
//! - Lease claim: no `UPDATE .. RETURNING` (MySQL has none, MariaDB 10.x none for `UPDATE`), so
//!   one transaction at the claim isolation: a locking select `FOR UPDATE SKIP LOCKED` of the
//!   ready rows, one update of the found ids, commit ([`Mysql::lease_claim`]).
//! - Lease renewal: a locking select of the held ids, one update of those still holding their
//!   token, commit; the ids kept are exactly those renewed ([`Mysql::lease_renew`]).
//! - Advisory: `GET_LOCK(name, 0)` on `<database>.<key>`, a name over 64 characters replaced by
//!   its SHA-256 (lowercase hex). Locks belong to the session and end with it. The server
//!   compares names case-insensitively, so keys differing only in case wait for each other.
//! - Times are `DATETIME` in UTC, whole seconds, so a lease token compared by equality
//!   survives the column exactly. Sessions run with `time_zone = '+00:00'` so the column's
//!   `DEFAULT CURRENT_TIMESTAMP` is UTC too.
//! - Affected rows: connections set `CLIENT_FOUND_ROWS`, so an `UPDATE` reports the rows its
//!   `WHERE` matched, as PostgreSQL and SQLite do, not only those whose values changed. A fenced
//!   settlement that matched its row is then never mistaken for a lost lease, whatever it writes.
//! - Floors: MySQL 8.0.1, MariaDB 10.6 (the first releases with `SKIP LOCKED`), for every form.
//! - Statements are prepared once per connection and kept in the driver's per-connection cache.
//!   Statements over a variable number of ids round the count up to a power of two (padding with
//!   the last id), so few distinct texts reach the cache.

use std::time::{Duration, SystemTime};

use mysql::consts::{CapabilityFlags, ColumnType as MyType};
use mysql::prelude::Queryable;
use mysql::{Conn, Opts, OptsBuilder, Params};
use sha2::{Digest, Sha256};

use super::shared::{ColumnTypes, Syntax};
use super::{parse_version, ConnOptions, DbConn, Dialect, TableSql};
use crate::error::{BrokerError, DbError, DbErrorKind};
use crate::schedule::{epoch_secs, from_epoch_secs};
use crate::table::{Form, TableSpec};
use crate::Value;

const SYNTAX: Syntax = Syntax {
    quote: quote_ident,
    param: |_| "?".to_string(),
};

/// Prepared statements kept per connection: a table uses about a dozen, plus the insert and
/// id-list variants of each size class.
const STMT_CACHE: usize = 256;

/// Connect timeout unless the URL sets `tcp_connect_timeout_ms`: an unreachable host fails the
/// pool's checkout instead of hanging on the operating system's TCP timeout.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How much longer than the statement timeout the socket waits for an answer: a lock wait
/// ends on the server first, with its own error.
const SOCKET_MARGIN: Duration = Duration::from_secs(10);

/// The longest name `GET_LOCK` accepts.
const MAX_LOCK_NAME: usize = 64;

/// The character set number MySQL reports for binary strings (`BLOB`, `VARBINARY`).
const BINARY_CHARSET: u16 = 63;

/// A dead-letter reason may be a long error report: `TEXT` stops at 64 KiB. Text columns are
/// `VARCHAR(255)` so they can be indexed.
const TYPES: ColumnTypes = ColumnTypes {
    id: "BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY",
    payload: "LONGBLOB NOT NULL",
    attempts: "INT NOT NULL DEFAULT 0",
    run_at: "DATETIME NOT NULL DEFAULT CURRENT_TIMESTAMP",
    time: "DATETIME NULL",
    reason: "MEDIUMTEXT NULL",
    text: "VARCHAR(255) NULL",
    int: "BIGINT NULL",
    float: "DOUBLE NULL",
    bytes: "LONGBLOB NULL",
};

fn quote_ident(s: &str) -> String {
    format!("`{s}`")
}

/// The MySQL-protocol engine for one server and database.
pub(crate) struct Mysql {
    opts: Opts,
    /// The URL's database: advisory lock names start with it, since `GET_LOCK` names are
    /// server-wide and keys belong to the database.
    db: String,
}

impl Mysql {
    /// `mysql://user:pass@host:3306/db?opts` (the driver's URL options apply); `mariadb://` is
    /// read as `mysql://`.
    /// Every session runs in UTC with `lock_wait_timeout` (metadata locks, which DDL takes;
    /// default a year) and `innodb_lock_wait_timeout` set to the statement timeout, and the
    /// socket's read and write timeouts a little longer, so a server that stops answering
    /// fails the statement instead of hanging it.
    pub fn from_url(url: &str, conn: &ConnOptions) -> Result<Self, BrokerError> {
        let normalized = match url.split_once("://") {
            Some((scheme, rest))
                if scheme.eq_ignore_ascii_case("mariadb")
                    || scheme.eq_ignore_ascii_case("mysql") =>
            {
                format!("mysql://{rest}")
            }
            _ => url.to_string(),
        };
        let opts = Opts::from_url(&normalized).map_err(|e| BrokerError::InvalidUrl {
            reason: format!("{e}"),
        })?;
        let db = opts.get_db_name().unwrap_or_default().to_string();
        let secs = conn.statement_timeout.as_secs().max(1);
        let mut builder = OptsBuilder::from_opts(opts)
            .additional_capabilities(CapabilityFlags::CLIENT_FOUND_ROWS)
            .init(vec![format!(
                "SET time_zone = '+00:00', lock_wait_timeout = {secs}, innodb_lock_wait_timeout = {secs}"
            )]);
        let socket = Some(conn.statement_timeout + SOCKET_MARGIN);
        if !normalized.contains("read_timeout=") {
            builder = builder.read_timeout(socket);
        }
        if !normalized.contains("write_timeout=") {
            builder = builder.write_timeout(socket);
        }
        if !normalized.contains("stmt_cache_size=") {
            builder = builder.stmt_cache_size(STMT_CACHE);
        }
        if !normalized.contains("tcp_connect_timeout_ms=") {
            builder = builder.tcp_connect_timeout(Some(CONNECT_TIMEOUT));
        }
        Ok(Mysql {
            opts: builder.into(),
            db,
        })
    }
}

/// MySQL or MariaDB: they share the protocol, not the version numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Flavor {
    Mysql,
    Mariadb,
}

impl Flavor {
    fn name(self) -> &'static str {
        match self {
            Flavor::Mysql => "MySQL",
            Flavor::Mariadb => "MariaDB",
        }
    }

    /// The oldest supported release: the first that skips locked rows.
    fn floor(self) -> ((u32, u32, u32), &'static str) {
        match self {
            Flavor::Mysql => ((8, 0, 1), "8.0.1"),
            Flavor::Mariadb => ((10, 6, 0), "10.6"),
        }
    }
}

/// Reads `SELECT VERSION()` (or a handshake's version): the flavor and `major.minor.patch`.
/// MariaDB before 11 may prefix its version with `5.5.5-` for old replication clients; the real
/// version follows it.
pub(crate) fn server_version(s: &str) -> Option<(Flavor, (u32, u32, u32))> {
    let s = s.trim();
    let flavor = if s.to_ascii_lowercase().contains("mariadb") {
        Flavor::Mariadb
    } else {
        Flavor::Mysql
    };
    let s = match (flavor, s.strip_prefix("5.5.5-")) {
        (Flavor::Mariadb, Some(rest)) => rest,
        _ => s,
    };
    Some((flavor, parse_version(s)?))
}

/// Checks a server's version string against the floor. Every form gets the same floor: the
/// support range is one, and the claims of row lock and lease need `SKIP LOCKED`.
pub(crate) fn check_version(shown: &str, form: Form) -> Result<(), BrokerError> {
    let what = match form {
        Form::AdvisoryLock => {
            "the advisory lock form (supported from the first release with SKIP LOCKED)"
        }
        _ => "FOR UPDATE SKIP LOCKED",
    };
    let (flavor, version) = match server_version(shown) {
        Some(v) => v,
        None => (Flavor::Mysql, (0, 0, 0)),
    };
    let (floor, needed) = flavor.floor();
    if version < floor {
        return Err(BrokerError::ServerTooOld {
            database: flavor.name(),
            found: shown.to_string(),
            needed: needed.to_string(),
            what,
        });
    }
    Ok(())
}

/// The `GET_LOCK` name of `key` in database `db`: `<db>.<key>`, or its SHA-256 in lowercase
/// hex (64 characters) when longer than `GET_LOCK` allows.
pub(crate) fn lock_name(db: &str, key: &str) -> String {
    let name = format!("{db}.{key}");
    if name.chars().count() <= MAX_LOCK_NAME {
        return name;
    }
    let digest = Sha256::digest(name.as_bytes());
    let mut hex = String::with_capacity(64);
    for b in digest {
        hex.push_str(&format!("{b:02x}"));
    }
    hex
}

/// The size class of an id list: the next power of two, so a table prepares a handful of
/// id-list statements rather than one per count.
fn id_slots(n: usize) -> usize {
    n.max(1).next_power_of_two()
}

/// `?, ?, ..` for `n` parameters.
fn placeholders(n: usize) -> String {
    vec!["?"; n].join(", ")
}

/// `ids` as parameters, padded to `slots` with the last id (a repeated id in `IN` changes
/// nothing).
fn id_params(ids: &[i64], slots: usize, out: &mut Vec<Value>) {
    let last = ids.last().copied().unwrap_or_default();
    out.extend(ids.iter().map(|id| Value::Int(*id)));
    out.extend(std::iter::repeat(Value::Int(last)).take(slots - ids.len()));
}

/// Id-list size classes whose lease-claim update is built with the table: 1, 2, 4 .. 1024,
/// enough for the largest claim (`batch_size` is at most 1,000).
const MARK_CLASSES: u32 = 11;

/// Renewal, step 1: `(id x slots)` -> `id, locked_until` of the held rows, locked; rows another
/// transaction has locked are skipped (renewed next round), never waited for.
fn renew_lock_sql(spec: &TableSpec, slots: usize) -> String {
    let s = &SYNTAX;
    format!(
        "SELECT {id}, {lu} FROM {t} WHERE {id} IN ({}) FOR UPDATE SKIP LOCKED",
        placeholders(slots),
        id = s.q(&spec.id),
        lu = s.q(&spec.locked_until),
        t = s.q(&spec.name)
    )
}

/// Renewal, step 2: `(token, id x slots)` writes the new token into the rows kept.
fn renew_set_sql(spec: &TableSpec, slots: usize) -> String {
    let s = &SYNTAX;
    format!(
        "UPDATE {t} SET {lu} = ? WHERE {id} IN ({})",
        placeholders(slots),
        id = s.q(&spec.id),
        lu = s.q(&spec.locked_until),
        t = s.q(&spec.name)
    )
}

/// Renewal always runs at READ COMMITTED: a locking read of ids that are gone would otherwise
/// lock gaps, and the gap after the highest id is where every publish inserts.
const RENEW_BEGIN: [&str; 2] = [
    "SET TRANSACTION ISOLATION LEVEL READ COMMITTED",
    "START TRANSACTION",
];

/// Runs `body` in a transaction opened by `begin` and commits; on error rolls back, or marks the
/// connection broken if even that fails.
fn in_transaction<T, S: AsRef<str>>(
    conn: &mut dyn DbConn,
    begin: &[S],
    body: impl FnOnce(&mut dyn DbConn) -> Result<T, DbError>,
) -> Result<T, DbError> {
    for stmt in begin {
        if let Err(e) = conn.batch(stmt.as_ref()) {
            // `SET TRANSACTION` applies to the session's next transaction: never pool a session
            // whose transaction half opened.
            conn.mark_broken();
            return Err(e);
        }
    }
    let run = |conn: &mut dyn DbConn| {
        let out = body(conn)?;
        conn.batch("COMMIT")?;
        Ok(out)
    };
    let r = run(conn);
    if r.is_err() {
        conn.rollback_or_discard();
    }
    r
}

impl Dialect for Mysql {
    fn database(&self) -> &'static str {
        "MySQL"
    }

    fn connect(&self) -> Result<Box<dyn DbConn>, DbError> {
        let conn = Conn::new(self.opts.clone()).map_err(|e| DbError::new(classify(&e), e))?;
        Ok(Box::new(MyConn {
            conn,
            broken: false,
        }))
    }

    fn check_server(&self, conn: &mut dyn DbConn, form: Form) -> Result<(), BrokerError> {
        let rows = conn
            .query("SELECT VERSION()", &[])
            .map_err(|e| e.during("version check", ""))?;
        let shown = match rows.first().and_then(|r| r.first()) {
            Some(Value::Text(s)) => s.clone(),
            Some(Value::Bytes(b)) => String::from_utf8_lossy(b).into_owned(),
            _ => "unknown".to_string(),
        };
        check_version(&shown, form)
    }

    fn compile(&self, spec: &TableSpec) -> TableSql {
        let s = &SYNTAX;
        let mut sql = TableSql {
            begin: vec![
                format!("SET TRANSACTION ISOLATION LEVEL {}", spec.isolation.sql()),
                "START TRANSACTION".into(),
            ],
            begin_write: "START TRANSACTION".into(),
            ..TableSql::default()
        };
        s.common(spec, &mut sql);
        let t = s.q(&spec.name);
        let id = s.q(&spec.id);
        let att = s.q(&spec.attempts);
        let lu = s.q(&spec.locked_until);
        let ready = s.ready(spec, "?");
        let order = s.order(spec);
        let row = s.row_columns(spec, "");
        match spec.form {
            Form::RowLock => {
                sql.claim =
                    format!("SELECT {row} FROM {t} WHERE {ready} ORDER BY {order} LIMIT ? FOR UPDATE SKIP LOCKED");
            }
            Form::Lease => {
                sql.claim = format!(
                    "SELECT {row} FROM {t} WHERE {ready} AND ({lu} IS NULL OR {lu} <= ?) \
                     ORDER BY {order} LIMIT ? FOR UPDATE SKIP LOCKED"
                );
                let mark = format!("UPDATE {t} SET {lu} = ?, {att} = {att} + 1 WHERE {id} IN (");
                sql.lease_marks = (0..MARK_CLASSES)
                    .map(|k| format!("{mark}{})", placeholders(1 << k)))
                    .collect();
            }
            Form::AdvisoryLock => {
                s.advisory_candidates(spec, &mut sql);
                sql.take = format!("UPDATE {t} SET {att} = {att} + 1 WHERE {ready} AND {id} = ?");
                sql.key_lock = Some("SELECT GET_LOCK(?, 0)".into());
                sql.key_unlock = Some("SELECT RELEASE_LOCK(?)".into());
            }
        }
        sql
    }

    fn create_table(&self, spec: &TableSpec) -> Vec<String> {
        let s = &SYNTAX;
        let mut cols = s.column_defs(spec, &TYPES);
        // No partial indexes: `dead_at` leads, so the claims' `dead_at IS NULL AND run_at <= ?`
        // is one index range already in `ORDER BY run_at, id` order. Inline, since MySQL 8 has no
        // `CREATE INDEX IF NOT EXISTS`.
        cols.push(format!(
            "INDEX {} ({}, {}, {})",
            s.q(&format!("{}_ready", spec.name)),
            s.q(&spec.dead_at),
            s.q(&spec.run_at),
            s.q(&spec.id)
        ));
        vec![format!(
            "CREATE TABLE IF NOT EXISTS {} ({}) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4",
            s.q(&spec.name),
            cols.join(", ")
        )]
    }

    fn syntax(&self) -> &'static Syntax {
        &SYNTAX
    }

    fn max_params(&self) -> usize {
        65_535
    }

    /// One transaction at the claim isolation: the locking select takes up to `limit` ready rows
    /// (`now, now, limit`), one `UPDATE .. WHERE id IN (..)` leases them all, commit. The found
    /// rows are locked until the commit, so the update changes exactly them; the rows are
    /// returned with their attempts counted.
    ///
    /// One update of all found ids, not one per row: on MariaDB 10.11 here (claims alternating
    /// between the two, the update step alone) one update per row cost 2.3-2.8 ms for 10 rows
    /// and 7.7-9.2 ms for 50, the single update 1.0-1.4 ms and 1.5-1.6 ms; equal for one row.
    fn lease_claim(
        &self,
        conn: &mut dyn DbConn,
        sql: &TableSql,
        now: SystemTime,
        limit: usize,
        token: SystemTime,
    ) -> Result<Vec<Vec<Value>>, DbError> {
        in_transaction(conn, &sql.begin, |conn| {
            let mut rows = conn.query(
                &sql.claim,
                &[Value::Time(now), Value::Time(now), Value::Int(limit as i64)],
            )?;
            if rows.is_empty() {
                return Ok(rows);
            }
            let mut ids = Vec::with_capacity(rows.len());
            for row in &mut rows {
                ids.push(
                    row.first()
                        .and_then(Value::as_i64)
                        .ok_or_else(|| DbError::other("the id is not an integer"))?,
                );
                if let Some(Value::Int(a)) = row.get_mut(1) {
                    *a += 1;
                }
            }
            let slots = id_slots(ids.len());
            let mut params = Vec::with_capacity(slots + 1);
            params.push(Value::Time(token));
            id_params(&ids, slots, &mut params);
            let mark = sql
                .lease_marks
                .get(slots.trailing_zeros() as usize)
                .ok_or_else(|| DbError::other(format!("a lease claim of {slots} rows")))?;
            let marked = conn.execute(mark, &params)?;
            if marked != ids.len() as u64 {
                return Err(DbError::other(format!(
                    "the lease claim locked {} rows but marked {marked}",
                    ids.len()
                )));
            }
            Ok(rows)
        })
    }

    /// Locks the held rows by id, keeps those still holding the token this process holds
    /// (compared here, so an unchanged value or another claim's equal token cannot fool a row
    /// count), writes `token` into them and commits. Returns exactly the ids renewed.
    fn lease_renew(
        &self,
        conn: &mut dyn DbConn,
        spec: &TableSpec,
        token: SystemTime,
        held: &[(i64, SystemTime)],
    ) -> Result<Vec<i64>, DbError> {
        let mut ids: Vec<i64> = held.iter().map(|(id, _)| *id).collect();
        ids.sort_unstable();
        ids.dedup();
        if ids.is_empty() {
            return Ok(ids);
        }
        in_transaction(conn, &RENEW_BEGIN, |conn| {
            let slots = id_slots(ids.len());
            let mut params = Vec::with_capacity(slots);
            id_params(&ids, slots, &mut params);
            let rows = conn.query(&renew_lock_sql(spec, slots), &params)?;
            let mut kept = Vec::with_capacity(rows.len());
            for row in rows {
                let (Some(id), Some(current)) = (
                    row.first().and_then(Value::as_i64),
                    row.get(1).and_then(Value::as_time),
                ) else {
                    continue;
                };
                if held
                    .iter()
                    .any(|(h, tok)| *h == id && epoch_secs(*tok) == epoch_secs(current))
                {
                    kept.push(id);
                }
            }
            if !kept.is_empty() {
                let slots = id_slots(kept.len());
                let mut params = Vec::with_capacity(slots + 1);
                params.push(Value::Time(token));
                id_params(&kept, slots, &mut params);
                conn.execute(&renew_set_sql(spec, slots), &params)?;
            }
            Ok(kept)
        })
    }

    /// `take` has no `RETURNING` here: run it `(now, id)`, and if it matched the row (it always
    /// changes it, counting the attempt), fetch the row as it now is.
    fn advisory_take(
        &self,
        conn: &mut dyn DbConn,
        sql: &TableSql,
        now: SystemTime,
        id: i64,
    ) -> Result<Option<Vec<Value>>, DbError> {
        if conn.execute(&sql.take, &[Value::Time(now), Value::Int(id)])? == 0 {
            return Ok(None);
        }
        Ok(conn
            .query(&sql.fetch, &[Value::Int(id)])?
            .into_iter()
            .next())
    }

    fn key_name(&self, key: &str) -> String {
        lock_name(&self.db, key)
    }
}

/// One MySQL-protocol session.
struct MyConn {
    conn: Conn,
    broken: bool,
}

/// How a driver error should be treated.
fn classify(e: &mysql::Error) -> DbErrorKind {
    match e {
        mysql::Error::MySqlError(se) => match se.code {
            // Deadlock (the transaction was rolled back), lock wait timeout (the statement was).
            1213 | 1205 => DbErrorKind::Transient,
            // Server shutdown, connection killed (MariaDB), session killed (MySQL), server gone,
            // lost connection, idle session ended by the server (MySQL 8.0.24+).
            1053 | 1927 | 3169 | 2006 | 2013 | 4031 => DbErrorKind::ConnectionLost,
            _ => DbErrorKind::Other,
        },
        mysql::Error::IoError(_) | mysql::Error::CodecError(_) => DbErrorKind::ConnectionLost,
        mysql::Error::DriverError(d) => match d {
            // Our parameters did not fit the statement: the session is intact.
            mysql::DriverError::MismatchedStmtParams(..)
            | mysql::DriverError::Params(_)
            | mysql::DriverError::MixedParams => DbErrorKind::Other,
            _ => DbErrorKind::ConnectionLost,
        },
        _ => DbErrorKind::Other,
    }
}

impl MyConn {
    fn fail(&mut self, e: mysql::Error) -> DbError {
        let kind = classify(&e);
        if kind == DbErrorKind::ConnectionLost {
            self.broken = true;
        }
        DbError::new(kind, e)
    }
}

fn params(values: &[Value]) -> Result<Params, DbError> {
    if values.is_empty() {
        return Ok(Params::Empty);
    }
    values
        .iter()
        .map(to_mysql)
        .collect::<Result<Vec<_>, _>>()
        .map(Params::Positional)
}

fn run_query(conn: &mut Conn, sql: &str, params: Params) -> mysql::Result<Vec<Vec<Value>>> {
    let mut out = Vec::new();
    for row in conn.exec_iter(sql, params)? {
        let row = row?;
        let columns = row.columns();
        out.push(
            row.unwrap()
                .into_iter()
                .zip(columns.iter())
                .map(|(v, c)| from_mysql(v, c))
                .collect(),
        );
    }
    Ok(out)
}

impl DbConn for MyConn {
    fn execute(&mut self, sql: &str, values: &[Value]) -> Result<u64, DbError> {
        let p = params(values)?;
        match self.conn.exec_drop(sql, p) {
            Ok(()) => Ok(self.conn.affected_rows()),
            Err(e) => Err(self.fail(e)),
        }
    }

    fn query(&mut self, sql: &str, values: &[Value]) -> Result<Vec<Vec<Value>>, DbError> {
        let p = params(values)?;
        run_query(&mut self.conn, sql, p).map_err(|e| self.fail(e))
    }

    fn batch(&mut self, sql: &str) -> Result<(), DbError> {
        self.conn.query_drop(sql).map_err(|e| self.fail(e))
    }

    fn last_insert_id(&self) -> Option<i64> {
        i64::try_from(self.conn.last_insert_id())
            .ok()
            .filter(|id| *id > 0)
    }

    fn is_broken(&self) -> bool {
        self.broken
    }

    fn set_broken(&mut self, broken: bool) {
        self.broken = broken;
    }
}

fn to_mysql(v: &Value) -> Result<mysql::Value, DbError> {
    Ok(match v {
        Value::Null => mysql::Value::NULL,
        Value::Int(i) => mysql::Value::Int(*i),
        Value::Float(f) => mysql::Value::Double(*f),
        Value::Text(s) => mysql::Value::Bytes(s.as_bytes().to_vec()),
        Value::Bytes(b) => mysql::Value::Bytes(b.clone()),
        Value::Time(t) => datetime_value(*t)?,
    })
}

/// A time as a `DATETIME` parameter in UTC, whole seconds (rounded down, as the queue's times
/// already are).
fn datetime_value(t: SystemTime) -> Result<mysql::Value, DbError> {
    let secs = epoch_secs(t);
    let (y, m, d) = civil_from_days(secs.div_euclid(86_400));
    let rem = secs.rem_euclid(86_400);
    let year = u16::try_from(y)
        .ok()
        .filter(|y| (1..=9999).contains(y))
        .ok_or_else(|| {
            DbError::other(format!(
                "{secs} s from the epoch is outside DATETIME's years 1..9999"
            ))
        })?;
    Ok(mysql::Value::Date(
        year,
        m as u8,
        d as u8,
        (rem / 3600) as u8,
        (rem % 3600 / 60) as u8,
        (rem % 60) as u8,
        0,
    ))
}

/// A `DATETIME` (UTC) back to a time; `None` for MySQL's zero date.
fn datetime_time(y: u16, m: u8, d: u8, h: u8, mi: u8, s: u8, micros: u32) -> Option<SystemTime> {
    if m == 0 || d == 0 {
        return None;
    }
    let days = days_from_civil(i64::from(y), u32::from(m), u32::from(d));
    let secs = days * 86_400 + i64::from(h) * 3600 + i64::from(mi) * 60 + i64::from(s);
    Some(from_epoch_secs(secs) + Duration::from_micros(u64::from(micros)))
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's `days_from_civil`).
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400; // [0, 399]
    let mp = i64::from((m + 9) % 12); // March = 0
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1; // [0, 365]
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy; // [0, 146096]
    era * 146_097 + doe - 719_468
}

/// The proleptic Gregorian date `z` days after 1970-01-01 (H. Hinnant's `civil_from_days`).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097; // [0, 146096]
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365; // [0, 399]
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100); // [0, 365]
    let mp = (5 * doy + 2) / 153; // [0, 11]
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32; // [1, 31]
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32; // [1, 12]
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// A result value, typed by its column: the binary protocol returns text and blobs alike as
/// bytes, told apart by the column's character set (63 is binary).
fn from_mysql(v: mysql::Value, col: &mysql::Column) -> Value {
    match v {
        mysql::Value::NULL => Value::Null,
        mysql::Value::Int(i) => Value::Int(i),
        mysql::Value::UInt(u) => i64::try_from(u)
            .map(Value::Int)
            .unwrap_or(Value::Float(u as f64)),
        mysql::Value::Float(f) => Value::Float(f.into()),
        mysql::Value::Double(f) => Value::Float(f),
        mysql::Value::Date(y, m, d, h, mi, s, us) => {
            datetime_time(y, m, d, h, mi, s, us).map_or(Value::Null, Value::Time)
        }
        mysql::Value::Time(neg, days, h, m, s, us) => {
            // A TIME column (none of ours): its value as text, as MySQL shows it.
            let hours = days * 24 + u32::from(h);
            let frac = if us > 0 {
                format!(".{us:06}")
            } else {
                String::new()
            };
            Value::Text(format!(
                "{}{hours:02}:{m:02}:{s:02}{frac}",
                if neg { "-" } else { "" }
            ))
        }
        mysql::Value::Bytes(b) => match col.column_type() {
            MyType::MYSQL_TYPE_DECIMAL | MyType::MYSQL_TYPE_NEWDECIMAL => {
                match std::str::from_utf8(&b)
                    .ok()
                    .and_then(|s| s.parse::<f64>().ok())
                {
                    Some(f) => Value::Float(f),
                    None => Value::Text(String::from_utf8_lossy(&b).into_owned()),
                }
            }
            MyType::MYSQL_TYPE_JSON => Value::Text(String::from_utf8_lossy(&b).into_owned()),
            _ if col.character_set() == BINARY_CHARSET => Value::Bytes(b),
            _ => match String::from_utf8(b) {
                Ok(s) => Value::Text(s),
                Err(e) => Value::Bytes(e.into_bytes()),
            },
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::Isolation;
    use crate::Table;

    fn dialect() -> Mysql {
        Mysql::from_url("mysql://u@h/db", &crate::dialect::test_options()).unwrap()
    }

    fn compile(t: Table) -> TableSql {
        dialect().compile(&t.validate().unwrap())
    }

    #[test]
    fn row_lock_sql() {
        let sql = compile(Table::new("emails").text_column("to"));
        assert_eq!(
            sql.begin,
            [
                "SET TRANSACTION ISOLATION LEVEL READ COMMITTED",
                "START TRANSACTION"
            ]
        );
        assert_eq!(sql.begin_write, "START TRANSACTION");
        assert_eq!(
            sql.claim,
            "SELECT `id`, `attempts`, `payload`, `to` FROM `emails` WHERE `dead_at` IS NULL AND `run_at` <= ? \
             ORDER BY `run_at`, `id` LIMIT ? FOR UPDATE SKIP LOCKED"
        );
        assert_eq!(sql.ack, "DELETE FROM `emails` WHERE `id` = ?");
        assert_eq!(
            sql.retry,
            "UPDATE `emails` SET `run_at` = ?, `attempts` = `attempts` + 1 WHERE `id` = ?"
        );
        assert_eq!(
            sql.dead,
            "UPDATE `emails` SET `dead_at` = ?, `dead_reason` = ?, `attempts` = `attempts` + 1 WHERE `id` = ?"
        );
        assert_eq!(
            sql.insert_one,
            "INSERT INTO `emails` (`payload`, `run_at`, `to`) VALUES (?, ?, ?)"
        );
        assert_eq!(
            sql.insert_id, None,
            "MySQL 8 has no INSERT .. RETURNING: the driver's last insert id"
        );
        assert_eq!(
            sql.fetch,
            "SELECT `id`, `attempts`, `payload`, `to` FROM `emails` WHERE `id` = ?"
        );
        assert_eq!(
            sql.dead_list,
            "SELECT `id`, `attempts`, `payload`, `dead_at`, `dead_reason`, `to` FROM `emails` \
             WHERE `dead_at` IS NOT NULL ORDER BY `dead_at`, `id` LIMIT ?"
        );
        assert_eq!(
            sql.dead_requeue,
            "UPDATE `emails` SET `dead_at` = NULL, `dead_reason` = NULL, `attempts` = 0, `run_at` = ? WHERE `id` = ? AND `dead_at` IS NOT NULL"
        );
        assert!(sql.key_lock.is_none() && sql.lease_marks.is_empty() && sql.take.is_empty());
        let sql = compile(Table::new("emails").isolation(Isolation::RepeatableRead));
        assert_eq!(
            sql.begin,
            [
                "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ",
                "START TRANSACTION"
            ]
        );
    }

    #[test]
    fn lease_sql() {
        let sql = compile(
            Table::new("thumbs")
                .int_column("n")
                .lease(Duration::from_secs(30)),
        );
        assert_eq!(
            sql.begin,
            [
                "SET TRANSACTION ISOLATION LEVEL READ COMMITTED",
                "START TRANSACTION"
            ]
        );
        assert_eq!(
            sql.claim,
            "SELECT `id`, `attempts`, `payload`, `n` FROM `thumbs` WHERE `dead_at` IS NULL AND `run_at` <= ? \
             AND (`locked_until` IS NULL OR `locked_until` <= ?) ORDER BY `run_at`, `id` LIMIT ? FOR UPDATE SKIP LOCKED"
        );
        assert_eq!(sql.lease_marks.len(), 11);
        assert_eq!(
            sql.lease_marks[0],
            "UPDATE `thumbs` SET `locked_until` = ?, `attempts` = `attempts` + 1 WHERE `id` IN (?)"
        );
        assert_eq!(
            sql.lease_marks[2],
            "UPDATE `thumbs` SET `locked_until` = ?, `attempts` = `attempts` + 1 WHERE `id` IN (?, ?, ?, ?)"
        );
        assert!(sql.lease_marks[10].ends_with(&format!("IN ({})", placeholders(1024))));
        assert_eq!(
            sql.ack,
            "DELETE FROM `thumbs` WHERE `id` = ? AND `locked_until` = ?"
        );
        assert_eq!(
            sql.retry,
            "UPDATE `thumbs` SET `run_at` = ?, `locked_until` = NULL WHERE `id` = ? AND `locked_until` = ?"
        );
        assert_eq!(
            sql.dead,
            "UPDATE `thumbs` SET `dead_at` = ?, `dead_reason` = ?, `locked_until` = NULL WHERE `id` = ? AND `locked_until` = ?"
        );
        assert_eq!(
            sql.unclaim,
            "UPDATE `thumbs` SET `locked_until` = NULL, `attempts` = `attempts` - 1 WHERE `id` = ? AND `locked_until` = ?"
        );
        assert_eq!(
            sql.dead_requeue,
            "UPDATE `thumbs` SET `dead_at` = NULL, `dead_reason` = NULL, `locked_until` = NULL, `attempts` = 0, `run_at` = ? \
             WHERE `id` = ? AND `dead_at` IS NOT NULL"
        );
        let spec = Table::new("thumbs")
            .lease(Duration::from_secs(30))
            .validate()
            .unwrap();
        assert_eq!(
            renew_lock_sql(&spec, 2),
            "SELECT `id`, `locked_until` FROM `thumbs` WHERE `id` IN (?, ?) FOR UPDATE SKIP LOCKED"
        );
        assert_eq!(
            renew_set_sql(&spec, 1),
            "UPDATE `thumbs` SET `locked_until` = ? WHERE `id` IN (?)"
        );
    }

    #[test]
    fn advisory_sql() {
        let sql = compile(
            Table::new("payments")
                .text_column("account")
                .advisory_lock("accounts-{account}"),
        );
        assert_eq!(
            sql.claim,
            "SELECT `id`, `run_at`, `account` FROM `payments` WHERE `dead_at` IS NULL AND `run_at` <= ? \
             ORDER BY `run_at`, `id` LIMIT ?"
        );
        // Positional parameters in the order the claim passes them: now, run_at, id, limit.
        assert_eq!(
            sql.claim_after,
            "SELECT `id`, `run_at`, `account` FROM `payments` WHERE `dead_at` IS NULL AND `run_at` <= ? \
             AND (`run_at`, `id`) > (?, ?) ORDER BY `run_at`, `id` LIMIT ?"
        );
        assert_eq!(
            sql.take,
            "UPDATE `payments` SET `attempts` = `attempts` + 1 WHERE `dead_at` IS NULL AND `run_at` <= ? AND `id` = ?"
        );
        assert_eq!(
            sql.fetch,
            "SELECT `id`, `attempts`, `payload`, `account` FROM `payments` WHERE `id` = ?"
        );
        assert_eq!(sql.ack, "DELETE FROM `payments` WHERE `id` = ?");
        assert_eq!(
            sql.retry,
            "UPDATE `payments` SET `run_at` = ? WHERE `id` = ?"
        );
        assert_eq!(
            sql.dead,
            "UPDATE `payments` SET `dead_at` = ?, `dead_reason` = ? WHERE `id` = ?"
        );
        assert_eq!(sql.key_lock.as_deref(), Some("SELECT GET_LOCK(?, 0)"));
        assert_eq!(sql.key_unlock.as_deref(), Some("SELECT RELEASE_LOCK(?)"));
    }

    #[test]
    fn ddl_and_inserts() {
        let d = dialect();
        let spec = Table::new("jobs")
            .text_column("k")
            .int_column("n")
            .float_column("f")
            .bytes_column("b")
            .lease(Duration::from_secs(5))
            .validate()
            .unwrap();
        assert_eq!(
            d.create_table(&spec),
            [
                "CREATE TABLE IF NOT EXISTS `jobs` (`id` BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY, \
                 `payload` LONGBLOB NOT NULL, `attempts` INT NOT NULL DEFAULT 0, \
                 `run_at` DATETIME NOT NULL DEFAULT CURRENT_TIMESTAMP, `locked_until` DATETIME NULL, \
                 `dead_at` DATETIME NULL, `dead_reason` MEDIUMTEXT NULL, `k` VARCHAR(255) NULL, `n` BIGINT NULL, \
                 `f` DOUBLE NULL, `b` LONGBLOB NULL, INDEX `jobs_ready` (`dead_at`, `run_at`, `id`)) \
                 ENGINE=InnoDB DEFAULT CHARSET=utf8mb4"
            ]
        );
        let row_lock = Table::new("jobs").validate().unwrap();
        assert!(!d.create_table(&row_lock)[0].contains("locked_until"));
        assert_eq!(
            d.insert_many(&spec, 2),
            "INSERT INTO `jobs` (`payload`, `run_at`, `k`, `n`, `f`, `b`) VALUES (?, ?, ?, ?, ?, ?), (?, ?, ?, ?, ?, ?)"
        );
        assert_eq!(d.max_params(), 65_535);
    }

    #[test]
    fn id_lists_are_padded_to_size_classes() {
        assert_eq!(
            [0, 1, 2, 3, 5, 8, 9, 500].map(id_slots),
            [1, 1, 2, 4, 8, 8, 16, 512]
        );
        let mut p = vec![Value::Null];
        id_params(&[7, 9, 4], id_slots(3), &mut p);
        assert_eq!(
            p,
            [
                Value::Null,
                Value::Int(7),
                Value::Int(9),
                Value::Int(4),
                Value::Int(4)
            ]
        );
    }

    #[test]
    fn versions_and_floors() {
        use Flavor::*;
        assert_eq!(server_version("8.0.0"), Some((Mysql, (8, 0, 0))));
        assert_eq!(server_version("8.4.3"), Some((Mysql, (8, 4, 3))));
        assert_eq!(server_version("5.7.44-log"), Some((Mysql, (5, 7, 44))));
        assert_eq!(
            server_version("10.5.22-MariaDB"),
            Some((Mariadb, (10, 5, 22)))
        );
        assert_eq!(
            server_version("10.6.0-MariaDB-1:10.6.0+maria~focal"),
            Some((Mariadb, (10, 6, 0)))
        );
        assert_eq!(
            server_version("10.11.6-MariaDB-0+deb12u1"),
            Some((Mariadb, (10, 11, 6)))
        );
        assert_eq!(
            server_version("5.5.5-10.11.6-MariaDB"),
            Some((Mariadb, (10, 11, 6)))
        );
        assert_eq!(
            server_version("5.5.5-10.5.8-MariaDB-log"),
            Some((Mariadb, (10, 5, 8)))
        );
        assert_eq!(server_version("nonsense"), None);

        for ok in [
            "8.0.1",
            "8.4.3",
            "9.1.0",
            "10.6.0-MariaDB-1:10.6.0+maria~focal",
            "10.11.6-MariaDB-0+deb12u1",
            "5.5.5-10.11.6-MariaDB",
        ] {
            for form in [Form::RowLock, Form::Lease, Form::AdvisoryLock] {
                assert!(check_version(ok, form).is_ok(), "{ok} {form:?}");
            }
        }
        for (old, db, needed) in [
            ("8.0.0", "MySQL", "8.0.1"),
            ("5.7.44-log", "MySQL", "8.0.1"),
            ("10.5.22-MariaDB", "MariaDB", "10.6"),
            ("5.5.5-10.5.8-MariaDB-log", "MariaDB", "10.6"),
            ("garbage", "MySQL", "8.0.1"),
        ] {
            match check_version(old, Form::Lease) {
                Err(BrokerError::ServerTooOld {
                    database,
                    found,
                    needed: n,
                    ..
                }) => {
                    assert_eq!((database, found.as_str(), n.as_str()), (db, old, needed));
                }
                other => panic!("{old}: {other:?}"),
            }
        }
    }

    #[test]
    fn lock_names() {
        let d = dialect();
        assert_eq!(d.key_name("accounts-a-17"), "db.accounts-a-17");
        // Exactly 64 characters stay as they are.
        let key = "k".repeat(61);
        assert_eq!(d.key_name(&key), format!("db.{key}"));
        // 65 are hashed: SHA-256 of the whole name, lowercase hex.
        let long = "k".repeat(62);
        let name = d.key_name(&long);
        assert_eq!(name.len(), 64);
        assert!(name
            .chars()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
        assert_eq!(lock_name("db", &long), name);
        assert_ne!(lock_name("other", &long), name);
        // Known vector: SHA-256("abc").
        assert_eq!(
            format!("{:x}", Sha256::digest(b"abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        let hashed = lock_name("", &"x".repeat(64));
        assert_eq!(
            hashed,
            format!(
                "{:x}",
                Sha256::digest(format!(".{}", "x".repeat(64)).as_bytes())
            )
        );
        // Characters, not bytes: 63 two-byte characters fit.
        assert_eq!(
            lock_name("", &"é".repeat(63)),
            format!(".{}", "é".repeat(63))
        );
    }

    #[test]
    fn urls() {
        let d = Mysql::from_url(
            "mariadb://root@127.0.0.1:3306/test",
            &crate::dialect::test_options(),
        )
        .unwrap();
        assert_eq!(d.db, "test");
        assert_eq!(d.opts.get_stmt_cache_size(), STMT_CACHE);
        assert!(d
            .opts
            .get_additional_capabilities()
            .contains(CapabilityFlags::CLIENT_FOUND_ROWS));
        let d = Mysql::from_url(
            "mysql://root@h/q?stmt_cache_size=7",
            &crate::dialect::test_options(),
        )
        .unwrap();
        assert_eq!(d.opts.get_stmt_cache_size(), 7);
        assert!(matches!(
            Mysql::from_url("mysql://", &crate::dialect::test_options()),
            Err(BrokerError::InvalidUrl { .. })
        ));
    }

    #[test]
    fn civil_dates() {
        let cases: [(i64, (i64, u32, u32)); 9] = [
            (0, (1970, 1, 1)),
            (31, (1970, 2, 1)),
            (59, (1970, 3, 1)),
            (365, (1971, 1, 1)),
            (10_956, (1999, 12, 31)),
            (11_016, (2000, 2, 29)),
            (19_782, (2024, 2, 29)),
            (47_540, (2100, 2, 28)),
            (47_541, (2100, 3, 1)),
        ];
        for (days, ymd) in cases {
            assert_eq!(civil_from_days(days), ymd, "{days}");
            assert_eq!(days_from_civil(ymd.0, ymd.1, ymd.2), days, "{ymd:?}");
        }
        // Every day from 1970 to 2100 round-trips and follows the previous one.
        let mut prev = civil_from_days(-1);
        for z in 0..=days_from_civil(2100, 12, 31) {
            let (y, m, d) = civil_from_days(z);
            assert_eq!(days_from_civil(y, m, d), z);
            assert!((y, m, d) > prev);
            prev = (y, m, d);
        }
    }

    #[test]
    fn datetime_values() {
        // 2024-02-29 13:45:07 UTC.
        let t = from_epoch_secs(1_709_214_307);
        assert_eq!(
            datetime_value(t).unwrap(),
            mysql::Value::Date(2024, 2, 29, 13, 45, 7, 0)
        );
        assert_eq!(datetime_time(2024, 2, 29, 13, 45, 7, 0), Some(t));
        // Sub-second parts are dropped on the way in, kept on the way out.
        assert_eq!(
            datetime_value(t + Duration::from_millis(999)).unwrap(),
            mysql::Value::Date(2024, 2, 29, 13, 45, 7, 0)
        );
        assert_eq!(
            datetime_time(2024, 2, 29, 13, 45, 7, 5),
            Some(t + Duration::from_micros(5))
        );
        assert_eq!(
            datetime_value(from_epoch_secs(0)).unwrap(),
            mysql::Value::Date(1970, 1, 1, 0, 0, 0, 0)
        );
        assert_eq!(
            datetime_value(from_epoch_secs(4_102_444_799)).unwrap(),
            mysql::Value::Date(2099, 12, 31, 23, 59, 59, 0)
        );
        assert_eq!(datetime_time(0, 0, 0, 0, 0, 0, 0), None);
        assert!(datetime_value(from_epoch_secs(253_402_300_800)).is_err()); // year 10000
        for secs in (0..4_102_444_800i64).step_by(86_399 * 7 + 3_601) {
            let t = from_epoch_secs(secs);
            let mysql::Value::Date(y, mo, d, h, mi, s, us) = datetime_value(t).unwrap() else {
                panic!()
            };
            assert_eq!(datetime_time(y, mo, d, h, mi, s, us), Some(t));
        }
    }

    #[test]
    fn errors() {
        let server = |code| {
            mysql::Error::MySqlError(mysql::MySqlError {
                state: "HY000".into(),
                message: String::new(),
                code,
            })
        };
        assert_eq!(classify(&server(1213)), DbErrorKind::Transient);
        assert_eq!(classify(&server(1205)), DbErrorKind::Transient);
        for code in [2006, 2013, 1927, 1053, 3169, 4031] {
            assert_eq!(
                classify(&server(code)),
                DbErrorKind::ConnectionLost,
                "{code}"
            );
        }
        assert_eq!(classify(&server(1062)), DbErrorKind::Other);
        let io = mysql::Error::IoError(std::io::Error::new(std::io::ErrorKind::BrokenPipe, "gone"));
        assert_eq!(classify(&io), DbErrorKind::ConnectionLost);
        assert_eq!(
            classify(&mysql::Error::DriverError(
                mysql::DriverError::MismatchedStmtParams(2, 3)
            )),
            DbErrorKind::Other
        );
        assert_eq!(
            classify(&mysql::Error::DriverError(
                mysql::DriverError::PacketOutOfSync
            )),
            DbErrorKind::ConnectionLost
        );
    }

    /// Live checks of the session layer against the server at `SQLBROKER_MYSQL_URL` (default
    /// `mysql://root@127.0.0.1:3306/test`); skipped loudly when it is not reachable, unless
    /// `SQLBROKER_REQUIRE_SERVERS=1`.
    mod live {
        use super::*;
        use std::sync::atomic::{AtomicUsize, Ordering};

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
            assert_eq!(row[3..], vals[2..]);
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
                    Value::Null
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
            let now = crate::schedule::floor(SystemTime::now());
            let ids: Vec<i64> = (0..3)
                .map(|_| {
                    insert(
                        &mut *c,
                        &sql,
                        &[Value::Bytes(b"x".to_vec()), Value::Time(now)],
                    )
                })
                .collect();
            let token = now + Duration::from_secs(5);
            let rows = d.lease_claim(&mut *c, &sql, now, 2, token).unwrap();
            assert_eq!(
                rows.iter()
                    .map(|r| (r[0].clone(), r[1].clone()))
                    .collect::<Vec<_>>(),
                [
                    (Value::Int(ids[0]), Value::Int(1)),
                    (Value::Int(ids[1]), Value::Int(1))
                ]
            );
            let rows = d.lease_claim(&mut *c, &sql, now, 5, token).unwrap();
            assert_eq!(rows.len(), 1);
            assert!(d
                .lease_claim(&mut *c, &sql, now, 5, token)
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

            let now = crate::schedule::floor(SystemTime::now());
            let id = insert(
                &mut *a,
                &sql,
                &[
                    Value::Bytes(b"p".to_vec()),
                    Value::Time(now),
                    Value::Text("k1".into()),
                ],
            );
            let row = d.advisory_take(&mut *a, &sql, now, id).unwrap().unwrap();
            assert_eq!(
                row,
                [
                    Value::Int(id),
                    Value::Int(1),
                    Value::Bytes(b"p".to_vec()),
                    Value::Text("k1".into())
                ]
            );
            // Dead rows are not taken.
            a.execute(
                &sql.dead,
                &[Value::Time(now), Value::Text("r".into()), Value::Int(id)],
            )
            .unwrap();
            assert_eq!(d.advisory_take(&mut *a, &sql, now, id).unwrap(), None);
        }

        #[test]
        fn server_passes_its_floor() {
            let Some(d) = dialect() else { return };
            let mut c = d.connect().unwrap();
            for form in [Form::RowLock, Form::Lease, Form::AdvisoryLock] {
                d.check_server(&mut *c, form).unwrap();
            }
        }
    }
}
