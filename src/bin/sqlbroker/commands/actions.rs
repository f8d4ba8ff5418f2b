//! The action log from the terminal: every command that changes jobs or a table's settings
//! records what it did (as the dashboard does, in the database's `sqlbroker_actions`), and
//! `actions` lists the log.

use serde::Serialize;
use sqlbroker::Broker;

use super::{columns, escape, json, say, utc, Result};
use crate::ActionsArgs;

/// Records a change this command made in the database's action log. A failure to record is
/// a warning on standard error, not the command's failure: the change itself was made.
pub(super) fn logged(broker: &Broker, action: &str, table: &str, detail: &str, rows: u64) {
    if let Err(e) = broker.record_action(&who(), action, table, detail, rows) {
        eprintln!(
            "warning: not written to the action log: {}",
            escape(&crate::chain(&e))
        );
    }
}

/// A limit's max as said and logged: `now 5`, or `lifted`.
pub(crate) fn limit_now(max: Option<u32>) -> String {
    max.map_or_else(|| "lifted".to_string(), |n| format!("now {n}"))
}

/// What the log records of a limit set or lifted (by the dashboard and the `limit` command
/// alike): `key "{account}" now 5`.
pub(crate) fn limit_detail(key: &str, max: Option<u32>) -> String {
    format!("key {key:?} {}", limit_now(max))
}

/// Who the log names for a command: the login name the environment gives (`USER`,
/// `LOGNAME`), marked as the command line's.
pub(super) fn who() -> String {
    let name = ["USER", "LOGNAME", "USERNAME"]
        .iter()
        .find_map(|k| std::env::var(k).ok().filter(|v| !v.trim().is_empty()));
    format!("{} with the CLI", name.as_deref().unwrap_or("someone"))
}

/// One entry of `actions --json`.
#[derive(Serialize)]
struct ActionJson<'a> {
    id: i64,
    at: String,
    who: &'a str,
    action: &'a str,
    table: &'a str,
    detail: &'a str,
    rows: u64,
}

/// `actions`: the newest entries of the log, newest first, as text or JSON.
pub(super) fn list(broker: &Broker, args: &ActionsArgs) -> Result {
    let limit = usize::try_from(args.limit).unwrap_or(usize::MAX);
    let log = broker.actions(limit)?;
    if args.json {
        let rows: Vec<ActionJson<'_>> = log
            .iter()
            .map(|a| ActionJson {
                id: a.id,
                at: utc(a.at),
                who: &a.who,
                action: &a.action,
                table: &a.table,
                detail: &a.detail,
                rows: a.rows,
            })
            .collect();
        return say(format_args!("{}\n", json(&rows)));
    }
    if log.is_empty() {
        return say(format_args!("no action recorded\n"));
    }
    let mut rows = vec![["AT", "WHO", "ACTION", "TABLE", "ROWS", "DETAIL"]
        .map(String::from)
        .to_vec()];
    for a in &log {
        rows.push(vec![
            utc(a.at),
            escape(&a.who),
            escape(&a.action),
            escape(&a.table),
            a.rows.to_string(),
            escape(&a.detail),
        ]);
    }
    say(format_args!("{}", columns(&rows)))
}
