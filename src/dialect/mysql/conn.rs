//! One MySQL-protocol session as a [`DbConn`], and how a driver error is classified.
//!
//! A server that takes no writes (`--read-only` / `--super-read-only`: error 1290; a read-only
//! transaction: 1792; InnoDB read-only: 1836, 1874) ends the session as a lost connection
//! ([`DbError::refused_writes`]): after a switchover that leaves the old primary up read-only,
//! only a new session reaches the new one (a moved address, a proxy).

use mysql::prelude::Queryable;
use mysql::{Conn, Opts, Params};

use super::values::{from_mysql, to_mysql};
use crate::dialect::DbConn;
use crate::error::{DbError, DbErrorKind};
use crate::model::value::Value;

/// Opens a session with the engine's options; also returns the server's `VERSION()` (read
/// with `max_allowed_packet`, in the same round trip), which tells MySQL from MariaDB.
pub(super) fn connect(opts: &Opts) -> Result<(Box<dyn DbConn + Send>, String), DbError> {
    let within = opts.get_read_timeout().copied().unwrap_or_default();
    let conn = Conn::new(opts.clone()).map_err(|e| match timed_out(&e) {
        true => DbError::no_answer(Driver(e), within),
        false => DbError::new(classify_connect(&e), Driver(e)),
    })?;
    let mut conn = MyConn {
        conn,
        broken: false,
        max_packet: u64::MAX,
        within,
        unanswered: false,
    };
    let first = conn
        .conn
        .query_first::<(u64, String), _>("SELECT @@max_allowed_packet, VERSION()");
    let (max_packet, version) = first
        .map_err(|e| conn.fail(e))?
        .unwrap_or((u64::MAX, String::new()));
    conn.max_packet = max_packet;
    Ok((Box::new(conn), version))
}

/// The driver's error, shown as the server or the socket said it: the driver's own `Display`
/// wraps each kind in its variant's name (`MySqlError { ERROR 1146 .. }`). The driver's error
/// stays reachable as the `source()`.
#[derive(Debug)]
pub(super) struct Driver(pub mysql::Error);

impl std::fmt::Display for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            mysql::Error::IoError(e) => write!(f, "{e}"),
            mysql::Error::CodecError(e) => write!(f, "{e}"),
            mysql::Error::MySqlError(e) => write!(f, "{e}"),
            mysql::Error::DriverError(e) => write!(f, "{e}"),
            mysql::Error::UrlError(e) => write!(f, "{e}"),
            #[cfg(feature = "tls")]
            mysql::Error::TlsError(e) => write!(f, "{e}"),
            other => write!(f, "{other}"),
        }
    }
}

impl std::error::Error for Driver {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}

/// The driver's error inside one of ours, if it is one.
fn driver(e: &DbError) -> Option<&mysql::Error> {
    e.source.downcast_ref::<Driver>().map(|d| &d.0)
}

/// One MySQL-protocol session.
struct MyConn {
    conn: Conn,
    broken: bool,
    /// The server's `max_allowed_packet`: a statement whose values are larger is refused here,
    /// with a clear error, instead of being sent (the server would end the session, which reads
    /// as a lost connection and invites a retry that can never succeed).
    max_packet: u64,
    /// The socket's read timeout: a read that waited this long had no answer.
    within: std::time::Duration,
    /// A round trip went unanswered: the session is in an unknown state, and every call fails
    /// at once (a rollback after a failed settlement would wait the timeout once more).
    unanswered: bool,
}

/// Bytes a statement's values take on the wire, roughly (a value's length and a little).
fn wire_size(values: &[Value]) -> u64 {
    values
        .iter()
        .map(|v| match v {
            Value::Text(s) => s.len() as u64 + 9,
            Value::Bytes(b) => b.len() as u64 + 9,
            _ => 9,
        })
        .sum()
}

/// True for a duplicate-key error (1062): a unique index refused the row.
pub(super) fn is_duplicate_key(e: &DbError) -> bool {
    #[cfg(feature = "diesel-mysql")]
    if crate::dialect::diesel::is_unique_violation(e) {
        return true;
    }
    matches!(driver(e), Some(mysql::Error::MySqlError(se)) if se.code == 1062)
}

/// True if a connection attempt failed for want of TLS: the server has none, or the handshake
/// (a certificate that did not verify, no common protocol) failed.
pub(super) fn is_tls_failure(e: &DbError) -> bool {
    driver(e).is_some_and(tls_failed)
}

fn tls_failed(e: &mysql::Error) -> bool {
    match e {
        mysql::Error::DriverError(mysql::DriverError::TlsNotSupported) => true,
        #[cfg(feature = "tls")]
        mysql::Error::TlsError(_) => true,
        // The handshake runs on the first read or write of the rustls stream: its error
        // comes back as an I/O error, perhaps inside the packet codec's.
        #[cfg(feature = "tls")]
        mysql::Error::IoError(io) => rustls_failed(io),
        #[cfg(feature = "tls")]
        mysql::Error::CodecError(codec) => std::error::Error::source(codec)
            .and_then(|s| s.downcast_ref::<std::io::Error>())
            .is_some_and(rustls_failed),
        _ => false,
    }
}

/// An I/O error that is a failed TLS handshake.
#[cfg(feature = "tls")]
fn rustls_failed(io: &std::io::Error) -> bool {
    io.get_ref().is_some_and(|e| e.is::<rustls::Error>())
}

/// How a failed connection attempt should be treated: the server's refusal (a password, an
/// unknown database) and a failed TLS handshake will fail the same way again; an unreachable
/// server, or one out of connections, may not.
fn classify_connect(e: &mysql::Error) -> DbErrorKind {
    match e {
        _ if tls_failed(e) => DbErrorKind::Other,
        // Too many connections, server shutting down, lost during the handshake.
        mysql::Error::MySqlError(se) if matches!(se.code, 1040 | 1053 | 2006 | 2013) => {
            DbErrorKind::ConnectionLost
        }
        mysql::Error::MySqlError(_) => DbErrorKind::Other,
        _ => classify(e),
    }
}

/// A driver error as ours, classified; a server that takes no writes is named as such.
fn db_error(e: mysql::Error) -> DbError {
    if refuses_writes(&e) {
        return DbError::refused_writes(Driver(e));
    }
    DbError::new(classify(&e), Driver(e))
}

/// The server takes no writes: 1290 (ER_OPTION_PREVENTS_STATEMENT) for `--read-only` or
/// `--super-read-only` (other options give it too: those are left as they are), 1792
/// (ER_CANT_EXECUTE_IN_READ_ONLY_TRANSACTION: the broker never asks for a read-only
/// transaction, so its session, or every session, was made read-only), 1836
/// (ER_READ_ONLY_MODE) and 1874 (ER_INNODB_READ_ONLY).
fn refuses_writes(e: &mysql::Error) -> bool {
    match e {
        mysql::Error::MySqlError(se) => match se.code {
            1290 => se.message.contains("read-only") || se.message.contains("read_only"),
            1792 | 1836 | 1874 => true,
            _ => false,
        },
        _ => false,
    }
}

/// How a driver error should be treated.
fn classify(e: &mysql::Error) -> DbErrorKind {
    if refuses_writes(e) {
        return DbErrorKind::ConnectionLost;
    }
    match e {
        mysql::Error::MySqlError(se) => match se.code {
            // Deadlock (the transaction was rolled back), lock wait timeout (the statement was),
            // a `NOWAIT` read that met a lock (MySQL 8; MariaDB says 1205).
            1213 | 1205 | 3572 => DbErrorKind::Transient,
            // A Galera node not (yet, or no longer) in the primary component: "WSREP has not
            // yet prepared node for application use". The statement did nothing.
            1047 => DbErrorKind::Transient,
            // A commit on a Galera node that left the primary component while the statement
            // ran ("Got error during COMMIT ... provider status: Not connected to Primary
            // Component"): the node rolled the transaction back; it may be tried again once the
            // node is back in a primary component. Other 1180s are left as they are.
            1180 if se.message.contains("Primary Component") => DbErrorKind::Transient,
            // A packet or value over `max_allowed_packet`: it will never fit.
            1153 | 1301 => DbErrorKind::Other,
            // Unknown column.
            1054 => DbErrorKind::Schema,
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
            | mysql::DriverError::MixedParams
            | mysql::DriverError::PacketTooLarge => DbErrorKind::Other,
            _ => DbErrorKind::ConnectionLost,
        },
        _ => DbErrorKind::Other,
    }
}

/// A statement on a session whose round trip went unanswered.
fn given_up() -> DbError {
    DbError::new(
        DbErrorKind::ConnectionLost,
        "the session was given up: a round trip went unanswered",
    )
}

/// A socket read or write that passed its timeout (the driver's `read_timeout`,
/// `write_timeout`): the round trip had no answer in time, and the session is in an unknown
/// state.
fn timed_out(e: &mysql::Error) -> bool {
    let io = match e {
        mysql::Error::IoError(io) => Some(io),
        mysql::Error::CodecError(codec) => {
            std::error::Error::source(codec).and_then(|s| s.downcast_ref::<std::io::Error>())
        }
        _ => None,
    };
    io.is_some_and(|io| {
        matches!(
            io.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        )
    })
}

impl MyConn {
    fn fail(&mut self, e: mysql::Error) -> DbError {
        if timed_out(&e) {
            self.broken = true;
            self.unanswered = true;
            return DbError::no_answer(Driver(e), self.within);
        }
        let e = db_error(e);
        if e.kind == DbErrorKind::ConnectionLost {
            self.broken = true;
        }
        e
    }
}

impl MyConn {
    /// Refuses values that cannot fit the server's packet limit, before anything is sent, and
    /// every statement on a session given up.
    fn fits(&self, sql: &str, values: &[Value]) -> Result<(), DbError> {
        if self.unanswered {
            return Err(given_up());
        }
        let size = wire_size(values) + sql.len() as u64;
        if size >= self.max_packet {
            return Err(DbError::other(format!(
                "a statement of about {size} bytes is over the server's max_allowed_packet \
                 ({} bytes): raise it on the server, or publish smaller payloads",
                self.max_packet
            )));
        }
        Ok(())
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

fn run_query(
    conn: &mut impl Queryable,
    sql: &str,
    params: Params,
) -> mysql::Result<Vec<Vec<Value>>> {
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

/// The application's own transaction as a [`DbConn`], for the transactional publish. It is
/// never pooled: broken or not is the application's business.
pub(crate) struct TxConn<'a, 'b>(pub &'a mut mysql::Transaction<'b>);

impl DbConn for TxConn<'_, '_> {
    fn execute(&mut self, sql: &str, values: &[Value]) -> Result<u64, DbError> {
        let p = params(values)?;
        match self.0.exec_drop(sql, p) {
            Ok(()) => Ok(self.0.affected_rows()),
            Err(e) => Err(db_error(e)),
        }
    }

    fn query(&mut self, sql: &str, values: &[Value]) -> Result<Vec<Vec<Value>>, DbError> {
        let p = params(values)?;
        run_query(self.0, sql, p).map_err(db_error)
    }

    fn batch(&mut self, sql: &str) -> Result<(), DbError> {
        self.0.query_drop(sql).map_err(db_error)
    }

    fn last_insert_id(&self) -> Option<i64> {
        self.0
            .last_insert_id()
            .and_then(|id| i64::try_from(id).ok())
    }

    fn is_broken(&self) -> bool {
        false
    }

    fn set_broken(&mut self, _: bool) {}
}

impl DbConn for MyConn {
    fn driver(&mut self) -> Option<&mut dyn std::any::Any> {
        Some(&mut self.conn)
    }

    fn session_id(&mut self) -> Option<u64> {
        Some(self.conn.connection_id().into())
    }

    fn execute(&mut self, sql: &str, values: &[Value]) -> Result<u64, DbError> {
        self.fits(sql, values)?;
        let p = params(values)?;
        match self.conn.exec_drop(sql, p) {
            Ok(()) => Ok(self.conn.affected_rows()),
            Err(e) => Err(self.fail(e)),
        }
    }

    fn query(&mut self, sql: &str, values: &[Value]) -> Result<Vec<Vec<Value>>, DbError> {
        self.fits(sql, values)?;
        let p = params(values)?;
        run_query(&mut self.conn, sql, p).map_err(|e| self.fail(e))
    }

    fn batch(&mut self, sql: &str) -> Result<(), DbError> {
        if self.unanswered {
            return Err(given_up());
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A server's error reads as the server said it, without the driver's variant name, and
    /// the driver's error is still the source.
    #[test]
    fn a_server_error_reads_as_the_server_said_it() {
        let e = DbError::new(
            DbErrorKind::Other,
            Driver(mysql::Error::MySqlError(mysql::MySqlError {
                state: "42S02".into(),
                message: "Table 'test.nope' doesn't exist".into(),
                code: 1146,
            })),
        );
        assert_eq!(
            e.to_string(),
            "ERROR 1146 (42S02): Table 'test.nope' doesn't exist"
        );
        assert!(driver(&e).is_some());
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
        assert_eq!(classify(&server(1047)), DbErrorKind::Transient);
        let commit = |message: &str| {
            mysql::Error::MySqlError(mysql::MySqlError {
                state: "HY000".into(),
                message: message.into(),
                code: 1180,
            })
        };
        assert_eq!(
            classify(&commit(
                "Error while appending streaming replication fragment(provider status: Not \
                 connected to Primary Component)"
            )),
            DbErrorKind::Transient
        );
        assert_eq!(
            classify(&commit("Got error 5 during COMMIT")),
            DbErrorKind::Other
        );
        for code in [2006, 2013, 1927, 1053, 3169, 4031] {
            assert_eq!(
                classify(&server(code)),
                DbErrorKind::ConnectionLost,
                "{code}"
            );
        }
        assert_eq!(classify(&server(1062)), DbErrorKind::Other);
        // Issue 24 item 6: a server (or session) that takes no writes is a lost connection.
        let said = |code, message: &str| {
            mysql::Error::MySqlError(mysql::MySqlError {
                state: "HY000".into(),
                message: message.into(),
                code,
            })
        };
        for e in [
            said(
                1290,
                "The MariaDB server is running with the --read-only option so it cannot \
                 execute this statement",
            ),
            said(
                1290,
                "The MySQL server is running with the --super-read-only option so it cannot \
                 execute this statement",
            ),
            said(1792, "Cannot execute statement in a READ ONLY transaction."),
            said(1836, "Running in read-only mode"),
            said(1874, "InnoDB is in read only mode."),
        ] {
            assert_eq!(classify(&e), DbErrorKind::ConnectionLost, "{e}");
            let e = db_error(e);
            assert!(e.is_refused_writes(), "{e}");
            assert!(e.to_string().contains("takes no writes"), "{e}");
        }
        // 1290 for another option is the statement's own problem.
        let secure = said(
            1290,
            "The MySQL server is running with the --secure-file-priv option so it cannot \
             execute this statement",
        );
        assert_eq!(classify(&secure), DbErrorKind::Other);
        assert!(!db_error(secure).is_refused_writes());
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
}
