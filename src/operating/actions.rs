//! The operators' action log: who did what to which table's jobs, when, and how many rows
//! it changed, kept in the database the action changed (`sqlbroker_actions`), so every
//! dashboard and tool on that database sees one history.

use std::time::SystemTime;

use crate::broker::Broker;
use crate::dialect::DbConn;
use crate::error::Result;
use crate::model::schedule::from_epoch_secs;
use crate::model::value::Value;

/// The table of the log.
const ACTION_LOG: &str = "sqlbroker_actions";

/// The longest `who`, `action` and `detail` an entry keeps, in characters (longer text is
/// cut, marked with `...`).
pub const ACTION_TEXT_MAX: usize = 500;

/// One entry of the action log ([`Broker::record_action`], [`Broker::actions`]).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct ActionEntry {
    /// Ascending in the order the entries were written.
    pub id: i64,
    /// When the action was recorded, to the second.
    pub at: SystemTime,
    /// Who acted, as the recording tool names them (the dashboard: the name given at its
    /// login, and the client's address).
    pub who: String,
    /// What was done (`cancel`, `requeue`, `pause`, ...).
    pub action: String,
    /// The table acted on.
    pub table: String,
    /// What it was done to (a job id, or the filter of "every job matching").
    pub detail: String,
    /// How many rows it changed.
    pub rows: u64,
}

/// `s` cut to [`ACTION_TEXT_MAX`] characters.
fn cut(s: &str) -> String {
    match s.char_indices().nth(ACTION_TEXT_MAX) {
        Some((at, _)) => format!("{}...", &s[..at]),
        None => s.to_string(),
    }
}

impl Broker {
    /// Records an operator's action in the database's action log (`sqlbroker_actions`, made
    /// on first use): `who` did `action` to `detail` of `table`, changing `rows` rows. Text
    /// longer than [`ACTION_TEXT_MAX`] characters is cut. The dashboard and the `sqlbroker`
    /// tool record each change they make; a tool of the application's own can record its own.
    ///
    /// # Errors
    ///
    /// A database error writing the entry, or making the log (the database user needs
    /// `CREATE` rights once).
    ///
    /// ```
    /// use sqlbroker::Broker;
    ///
    /// let broker = Broker::connect("sqlite::memory:")?;
    /// broker.record_action("ops@10.0.0.7", "cancel", "emails", "customer = \"acme\"", 12)?;
    /// let log = broker.actions(10)?;
    /// assert_eq!((log[0].action.as_str(), log[0].rows), ("cancel", 12));
    /// # Ok::<(), sqlbroker::BrokerError>(())
    /// ```
    pub fn record_action(
        &self,
        who: &str,
        action: &str,
        table: &str,
        detail: &str,
        rows: u64,
    ) -> Result<()> {
        let sql = self.dialect().action_log();
        let params = [
            Value::Time(SystemTime::now()),
            Value::Text(cut(who)),
            Value::Text(cut(action)),
            Value::Text(cut(table)),
            Value::Text(cut(detail)),
            Value::Int(i64::try_from(rows).unwrap_or(i64::MAX)),
        ];
        let mut conn = self.pooled("record action", table)?;
        let err = |e: crate::error::DbError| e.during("record action", table);
        match conn.execute(sql.insert, &params) {
            Ok(_) => Ok(()),
            // No log yet: make it, then write.
            Err(_) => {
                conn.batch(sql.create).map_err(err)?;
                conn.execute(sql.insert, &params).map(drop).map_err(err)
            }
        }
    }

    /// The newest `limit` entries of the action log, newest first (none if nothing was
    /// ever recorded).
    ///
    /// # Errors
    ///
    /// A database error other than the log's absence.
    pub fn actions(&self, limit: usize) -> Result<Vec<ActionEntry>> {
        let sql = self.dialect().action_log();
        self.read_actions(sql.list.to_string(), Vec::new(), limit, &[])
    }

    /// The newest `limit` entries of the action log on the tables `tables` (their names, as
    /// recorded), newest first: what a tool restricted to some tables shows, so entries on
    /// every other table (their job ids, filters, operators' names and addresses) stay out of
    /// it. No table: no entry.
    ///
    /// # Errors
    ///
    /// As [`Broker::actions`].
    ///
    /// ```
    /// use sqlbroker::Broker;
    ///
    /// let broker = Broker::connect("sqlite::memory:")?;
    /// broker.record_action("ana", "cancel", "emails", "job 7", 1)?;
    /// broker.record_action("bo", "purge", "payroll", "every dead letter", 3)?;
    /// let log = broker.actions_on(&["emails"], 10)?;
    /// assert_eq!(log.len(), 1);
    /// assert_eq!(log[0].table, "emails");
    /// # Ok::<(), sqlbroker::BrokerError>(())
    /// ```
    pub fn actions_on(&self, tables: &[&str], limit: usize) -> Result<Vec<ActionEntry>> {
        if tables.is_empty() {
            return Ok(Vec::new());
        }
        let sql = self
            .dialect()
            .action_log()
            .list_on(self.dialect().syntax(), tables.len());
        let names = tables.iter().map(|t| Value::Text(t.to_string())).collect();
        self.read_actions(sql, names, limit, tables)
    }

    /// Runs `sql` on a table the library makes on first use (`table`: the action log, the
    /// fleet's heartbeats): its rows, or none if the table was never made (a read writes
    /// nothing). `op` names the call in an error.
    pub(crate) fn read_own(
        &self,
        op: &'static str,
        table: &str,
        sql: &str,
        params: &[Value],
    ) -> Result<Vec<Vec<Value>>> {
        let mut conn = self.pooled(op, "")?;
        match conn.query(sql, params) {
            Ok(rows) => Ok(rows),
            Err(e) => {
                // Absent, or failing.
                let name = [Value::Text(table.into())];
                match conn.query(self.dialect().columns_query(), &name) {
                    Ok(columns) if columns.is_empty() => Ok(Vec::new()),
                    _ => Err(e.during(op, "")),
                }
            }
        }
    }

    /// Runs a listing of the log (`sql`: its `params`, then the limit): the entries, or none
    /// if the log was never made. With `only`, an entry of another table is left out (MySQL
    /// compares the log's text in the database's collation, not byte for byte).
    fn read_actions(
        &self,
        sql: String,
        mut params: Vec<Value>,
        limit: usize,
        only: &[&str],
    ) -> Result<Vec<ActionEntry>> {
        params.push(Value::Int(i64::try_from(limit).unwrap_or(i64::MAX)));
        let rows = self.read_own("action log", ACTION_LOG, &sql, &params)?;
        Ok(rows
            .into_iter()
            .map(|r| {
                let text = |i: usize| r.get(i).and_then(Value::as_str).unwrap_or("").to_string();
                ActionEntry {
                    id: r.first().and_then(Value::as_i64).unwrap_or(0),
                    at: match r.get(1) {
                        Some(Value::Time(t)) => *t,
                        Some(Value::Int(secs)) => from_epoch_secs(*secs),
                        _ => SystemTime::UNIX_EPOCH,
                    },
                    who: text(2),
                    action: text(3),
                    table: text(4),
                    detail: text(5),
                    rows: r
                        .get(6)
                        .and_then(Value::as_i64)
                        .map_or(0, |n| n.max(0) as u64),
                }
            })
            .filter(|a| only.is_empty() || only.contains(&a.table.as_str()))
            .collect())
    }
}
