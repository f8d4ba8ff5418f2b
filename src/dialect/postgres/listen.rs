//! The change feed: `LISTEN` on a dedicated session, one channel per watched table
//! ([`sql::channel`]). A publish notifies the channel (`pg_notify`, delivered at commit, so a
//! woken claimer finds the row); the payload is `<rows>` or `<rows>:<broker>`.
//!
//! The broker's publish notifies in a statement of its own after its insert committed, not in
//! the insert's transaction: a notifying transaction holds the server's notification queue
//! lock through its commit's WAL flush, which made 4 concurrent publishers 2.4-5x slower in
//! pgbench here, while a notification on its own costs one round trip and no flush
//! (BENCHMARKS.md). The transactional publish must notify inside the application's
//! transaction (at its commit, or never) and pays that lock.
//!
//! The session has TCP keepalives tighter than the pool's, so a listener whose server vanished
//! without closing the socket is noticed in about 15 s, not minutes; a closed one at once.
//!
//! With `target_session_attrs=read-write` the session asks every [`WRITABLE_CHECK`] whether its
//! server still takes writes: after a switchover that leaves the old primary up read-only it
//! would go on listening there while the publishes notify the new primary. It then ends as a
//! lost connection, and the feed connects again through the URL's hosts.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use postgres::fallible_iterator::FallibleIterator;

use super::{conn, sql};
use crate::dialect::{Change, Watcher};
use crate::error::{DbError, DbErrorKind};

const KEEPALIVE_IDLE: Duration = Duration::from_secs(5);
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(2);
const KEEPALIVE_RETRIES: u32 = 5;
/// How often a listener that needs a primary asks whether its server still is one.
const WRITABLE_CHECK: Duration = Duration::from_secs(5);

/// Opens the listening session (with the pool's TLS settings).
pub(super) fn open(
    config: &postgres::Config,
    tls: &conn::Connector,
    setup: &conn::Setup,
) -> Result<Box<dyn Watcher>, DbError> {
    let mut config = config.clone();
    config
        .keepalives(true)
        .keepalives_idle(KEEPALIVE_IDLE)
        .keepalives_interval(KEEPALIVE_INTERVAL)
        .keepalives_retries(KEEPALIVE_RETRIES);
    // Named apart from the pool's sessions (the URL's name, with " listen" after it), so an
    // operator, or a script ending the application's sessions, can tell the feed from them.
    let name = match config.get_application_name() {
        Some(app) => format!("{} listen", app.chars().take(55).collect::<String>()),
        None => "sqlbroker-listen".to_string(),
    };
    config.application_name(&name);
    let session = conn::client(&config, tls, setup)?;
    // Armed while it was set up; from now on, only while a statement is out.
    session.disarm();
    let primary =
        config.get_target_session_attrs() == postgres::config::TargetSessionAttrs::ReadWrite;
    Ok(Box::new(PgWatcher {
        session,
        tables: HashMap::new(),
        writable_checked: primary.then(Instant::now),
    }))
}

fn lost(e: postgres::Error) -> DbError {
    DbError::new(DbErrorKind::ConnectionLost, conn::PgError(e))
}

/// The `<rows>[:<broker>]` payload of a notification.
pub(super) fn payload(rows: usize, from: Option<u64>) -> String {
    match from {
        Some(from) => format!("{rows}:{from}"),
        None => rows.to_string(),
    }
}

/// The payload `Broker::pause` and `resume` send: the table's pause flag changed (read as
/// zero rows, which the listener takes as "read the flag again").
pub(super) const PAUSE: &str = "pause";

/// Reads a payload; anything else (a bare `NOTIFY` by another tool) reads one row.
pub(super) fn parse(payload: &str) -> (usize, Option<u64>) {
    if payload == PAUSE {
        return (0, None);
    }
    let (rows, from) = match payload.split_once(':') {
        Some((rows, from)) => (rows, from.parse().ok()),
        None => (payload, None),
    };
    (rows.parse().unwrap_or(1).max(1), from)
}

/// The listening session. Its statements are bounded as the pool's are ([`conn::Session`]);
/// its wait for notifications is not (that is the feed's own timeout).
struct PgWatcher {
    session: conn::Session,
    /// Table by channel.
    tables: HashMap<String, String>,
    /// `target_session_attrs=read-write`: when the server last said it takes writes.
    writable_checked: Option<Instant>,
}

impl PgWatcher {
    /// Every [`WRITABLE_CHECK`], where the URL asks for a primary: an error if the server no
    /// longer takes writes (`transaction_read_only`, as the driver asks at connect).
    fn check_writable(&mut self) -> Result<(), DbError> {
        let Some(at) = self.writable_checked else {
            return Ok(());
        };
        if at.elapsed() < WRITABLE_CHECK {
            return Ok(());
        }
        let read_only = self
            .session
            .bounded(|c| c.simple_query("SHOW transaction_read_only"))
            .map_err(lost)?
            .iter()
            .any(|m| matches!(m, postgres::SimpleQueryMessage::Row(r) if r.get(0) == Some("on")));
        if read_only {
            return Err(DbError::new(
                DbErrorKind::ConnectionLost,
                "the listening session's server no longer takes writes (a switchover?): \
                 listening again through the URL's hosts",
            ));
        }
        self.writable_checked = Some(Instant::now());
        Ok(())
    }
}

impl Watcher for PgWatcher {
    fn watch(&mut self, table: &str) -> Result<(), DbError> {
        let channel = sql::channel(table);
        self.session
            .bounded(|c| c.batch_execute(&sql::listen(&channel)))
            .map_err(lost)?;
        self.tables.insert(channel, table.to_string());
        Ok(())
    }

    fn wait(&mut self, timeout: Duration, out: &mut Vec<Change>) -> Result<(), DbError> {
        let mut got = Vec::new();
        {
            let mut notifications = self.session.client.notifications();
            let first = notifications.timeout_iter(timeout).next().map_err(lost)?;
            if let Some(n) = first {
                got.push(n);
                // The rest already received, without waiting.
                let mut more = notifications.iter();
                while let Some(n) = more.next().map_err(lost)? {
                    got.push(n);
                }
            }
        }
        for n in got {
            // Only channels this session listens on are delivered; anything else is ignored
            // rather than read as "every table changed".
            let Some(table) = self.tables.get(n.channel()) else {
                continue;
            };
            let (rows, from) = parse(n.payload());
            out.push(Change {
                table: Some(table.clone()),
                rows,
                from,
            });
        }
        if self.session.client.is_closed() {
            return Err(DbError::new(
                DbErrorKind::ConnectionLost,
                "the listening session was closed",
            ));
        }
        self.check_writable()
    }

    fn echoes(&self) -> bool {
        true
    }

    fn announce(&mut self, table: &str, rows: usize, from: u64) -> Result<(), DbError> {
        self.session
            .bounded(|c| {
                c.execute(
                    "SELECT pg_notify($1, $2)",
                    &[&sql::channel(table), &payload(rows, Some(from))],
                )
            })
            .map(drop)
            .map_err(lost)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads() {
        assert_eq!(parse(&payload(3, Some(42))), (3, Some(42)));
        assert_eq!(parse(&payload(1, None)), (1, None));
        assert_eq!(
            parse(""),
            (1, None),
            "a bare NOTIFY by another tool is one row"
        );
        assert_eq!(parse("x:y"), (1, None));
        assert_eq!(parse("0"), (1, None));
        // Only the pause payload reads zero rows.
        assert_eq!(parse(PAUSE), (0, None));
        assert_eq!(parse("Pause"), (1, None));
    }
}
