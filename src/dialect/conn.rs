//! One database connection as the queue logic sees it: the trait each dialect implements.
//!
//! Below both `dialect` (which implements it) and the mechanisms that only run statements on a
//! connection they are given (`keys`), so neither imports the other for it.

use crate::error::DbError;
use crate::model::value::Value;

/// One connection, as the queue logic sees it. Implementations mark themselves broken when the
/// driver reports a lost connection, so the pool discards them.
pub(crate) trait DbConn {
    /// Runs a statement (prepared once per connection and cached); returns the rows it changed.
    fn execute(&mut self, sql: &str, params: &[Value]) -> Result<u64, DbError>;
    /// Runs a query (prepared once per connection and cached); returns its rows.
    fn query(&mut self, sql: &str, params: &[Value]) -> Result<Vec<Vec<Value>>, DbError>;
    /// Runs parameterless statements (transaction control, DDL) as they are.
    fn batch(&mut self, sql: &str) -> Result<(), DbError>;
    /// True once the connection is known to be unusable or in an unknown state.
    fn is_broken(&self) -> bool;
    /// Whether the pool discards this connection instead of reusing it (a connection the driver
    /// reports closed is discarded either way).
    fn set_broken(&mut self, broken: bool);
    /// Makes the pool discard this connection instead of reusing it.
    fn mark_broken(&mut self) {
        self.set_broken(true);
    }
    /// The id the last insert on this connection assigned, where the driver reports it
    /// (MySQL, whose inserts return no rows).
    fn last_insert_id(&self) -> Option<i64> {
        None
    }
    /// The driver's own client of this session, for the application's SQL inside a row lock
    /// delivery's transaction (`postgres::Client`, `mysql::Conn`). Default: none.
    #[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
    fn driver(&mut self) -> Option<&mut dyn std::any::Any> {
        None
    }
    /// The server's id of this session, for cancelling its running statement from another
    /// session (a handler timeout): PostgreSQL's backend pid (asked once, then kept), MySQL's
    /// connection id. Default: none (SQLite has no sessions to cancel).
    #[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
    fn session_id(&mut self) -> Option<u64> {
        None
    }
    /// Proves the session still answers (the pool asks before it hands out a connection that
    /// sat idle). Default: `SELECT 1`.
    fn ping(&mut self) -> Result<(), DbError> {
        self.batch("SELECT 1")
    }
    /// No lock wait of the next statements past `until` (`None`: the statement timeout again),
    /// where the connection can bound it at no cost (SQLite: its busy timeout and the
    /// process's writer lock, set locally). True if it did; false where it would cost a round
    /// trip (the servers), and then nothing changed.
    fn limit_waits(&mut self, _until: Option<std::time::Instant>) -> bool {
        false
    }
    /// Values the last `query` could not read, as `(row, reason)`; those cells read `NULL`.
    /// Only PostgreSQL has column types a [`Value`] cannot hold.
    fn take_unreadable(&mut self) -> Vec<(usize, String)> {
        Vec::new()
    }
    /// Ends the open transaction: rolls back, or marks the connection broken if even that
    /// fails, so the pool never hands out a session in an unknown state. A session whose
    /// rollback succeeded is in a known state again and may be pooled.
    fn rollback_or_discard(&mut self) {
        match self.batch("ROLLBACK") {
            Ok(()) => self.set_broken(false),
            Err(_) => self.mark_broken(),
        }
    }
}
