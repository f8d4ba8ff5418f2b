//! What each command does, on the library's public API only.

use std::error::Error;
use std::fmt::Write as _;
use std::io::{BufRead, Write};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use sqlbroker::{Broker, ColumnType, Message, QueueStats, Table, Value};

use crate::{
    Cli, Command, CompletedCommand, DeadCommand, DeadListArgs, DeadPick, PageArgs, PublishArgs,
    StatusArgs,
};

mod actions;
pub(crate) mod bench;
#[cfg(feature = "dashboard")]
pub(crate) mod dashboard;
mod jobs;
mod periodic;
pub(crate) mod schema;
mod workers;

use actions::logged;
use jobs::{cancel, job, jobs_list, json_value};

type Result<T = (), E = Box<dyn Error>> = std::result::Result<T, E>;

/// Messages per `publish_batch` (one statement, or a few, each).
const PUBLISH_BATCH: usize = 1_000;

/// The longest payload or reason shown by `dead list`, in characters.
const PREVIEW: usize = 60;

pub(crate) fn run(cli: &Cli, url: &str) -> Result {
    // Only the commands that make tables may make the database file: to any other, a
    // mistyped SQLite path would be an empty queue (the dashboard included). A benchmark
    // makes its own table, so it makes its database where `create-table` would.
    if !matches!(
        cli.command,
        Command::CreateTable(_) | Command::Migrate(_) | Command::Bench(_)
    ) {
        existing_database(url)?;
    }
    // `schema` may need no database: it connects, if at all, on its own.
    if let Command::Schema(args) = &cli.command {
        return schema::run(cli, url, args);
    }
    if let Command::LibrarySchema(args) = &cli.command {
        return schema::library(cli, url, args);
    }
    #[cfg(feature = "dashboard")]
    if let Command::Dashboard(args) = &cli.command {
        return dashboard::run(cli, args);
    }
    if let Command::Bench(args) = &cli.command {
        return bench::run(cli, url, args);
    }
    let broker = Broker::builder(url)
        .pool_size(2)
        .connection_timeout(Duration::from_secs(cli.connect_timeout.max(1)))
        // A command's process is short-lived: the database's maintainer is a long-running one.
        .maintenance(false)
        .build()?;
    let done = match &cli.command {
        Command::Status(args) => status(&broker, args),
        Command::Dead(DeadCommand::List(args)) => dead_list(&broker, args),
        Command::Dead(DeadCommand::Requeue(args)) => dead_pick(&broker, args, Pick::Requeue),
        Command::Dead(DeadCommand::Purge(args)) => dead_pick(&broker, args, Pick::Purge),
        Command::CreateTable(args) => {
            let table = args.table();
            broker.create_table(&table)?;
            say(format_args!("table {} is there\n", table.name()))
        }
        Command::Migrate(args) => {
            let table = args.open(&broker)?;
            let done = broker.migrate(&table)?;
            if done.is_empty() {
                say(format_args!("table {} is up to date\n", table.name()))
            } else {
                let done: Vec<String> = done.iter().map(|d| escape(d)).collect();
                say(format_args!("{}\n", done.join("\n")))
            }
        }
        Command::Publish(args) => publish(&broker, args),
        Command::Jobs(args) => jobs_list(&broker, args),
        Command::Job(args) => job(&broker, args),
        Command::Cancel(args) => cancel(&broker, args),
        Command::Signal(args) => jobs::signal(&broker, args),
        Command::Completed(CompletedCommand::List(args)) => completed_list(&broker, args),
        Command::Completed(CompletedCommand::Prune(args)) => {
            let table = args.open(&broker)?;
            let n = broker.prune_completed(&table)?;
            logged(&broker, "prune", table.name(), "completed rows", n);
            say(format_args!("pruned {}\n", count(n, "completed row")))
        }
        Command::Forget(args) => {
            broker.forget_table(&args.table)?;
            logged(
                &broker,
                "forget",
                &args.table,
                "the record of a table that no longer exists",
                0,
            );
            say(format_args!("forgot the record of table {}\n", args.table))
        }
        Command::Pause(args) => pause(&broker, args, true),
        Command::Resume(args) => pause(&broker, args, false),
        Command::Limits(args) => limits(&broker, args),
        Command::Actions(args) => actions::list(&broker, args),
        Command::Workers(args) => workers::list(&broker, args),
        Command::Periodic(args) => periodic::run(&broker, args),
        Command::Maintainer => periodic::maintainer(&broker),
        Command::Limit(args) => {
            let table = broker.open_table(&args.table)?;
            let max = if args.lift { None } else { args.max };
            match (args.rate, args.per) {
                (true, Some(per)) => broker.set_rate_window(&table, &args.key, per, max)?,
                (true, None) => broker.set_rate_limit(&table, &args.key, max)?,
                (false, _) => broker.set_concurrency_limit(&table, &args.key, max)?,
            }
            let now = actions::limit_now(max);
            let action = if args.rate { "rate" } else { "limit" };
            logged(
                &broker,
                action,
                table.name(),
                &actions::limit_detail(&args.key, max),
                0,
            );
            say(format_args!(
                "table {}: {}limit {} is {now}\n",
                table.name(),
                if args.rate { "rate " } else { "" },
                escape(&format!("{:?}", args.key))
            ))
        }
        Command::Schema(_) => unreachable!("schema returned above"),
        Command::LibrarySchema(_) => unreachable!("library-schema returned above"),
        Command::Bench(_) => unreachable!("bench returned above"),
        Command::Dashboard(_) => unreachable!("served above, or refused by main"),
    };
    match done {
        // A reader that went away (`| head`) is not a failure.
        Err(e) if is_broken_pipe(&*e) => Ok(()),
        r => r,
    }
}

/// The SQLite database file a URL names, as the library reads it (`sqlite:PATH`,
/// `sqlite://PATH`, the scheme in any case; the rest is the file's path, taken literally);
/// `None` for an in-memory database or another database.
fn sqlite_file(url: &str) -> Option<&str> {
    let (scheme, rest) = url.split_once(':')?;
    if !scheme.eq_ignore_ascii_case("sqlite") {
        return None;
    }
    let rest = rest.strip_prefix("//").unwrap_or(rest);
    (!rest.is_empty() && rest != ":memory:").then_some(rest)
}

/// Refuses an SQLite URL whose file does not exist (opening it would create it, empty).
fn existing_database(url: &str) -> Result {
    match sqlite_file(url) {
        Some(path) if !std::path::Path::new(path).exists() => Err(format!(
            "the SQLite database file {} does not exist (check the path in --url or \
             DATABASE_URL; create-table or migrate makes a new one)",
            escape(path)
        )
        .into()),
        _ => Ok(()),
    }
}

/// `n` and `what`, plural unless `n` is 1: "1 dead-lettered row", "2 dead-lettered rows".
fn count(n: impl std::fmt::Display, what: &str) -> String {
    let n = n.to_string();
    if n == "1" {
        format!("{n} {what}")
    } else {
        format!("{n} {what}s")
    }
}

fn is_broken_pipe(e: &(dyn Error + 'static)) -> bool {
    e.downcast_ref::<std::io::Error>()
        .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
}

fn say(args: std::fmt::Arguments<'_>) -> Result {
    std::io::stdout().lock().write_fmt(args)?;
    Ok(())
}

/// `pause` (`on`) or `resume` a recorded table, or one queue of it.
fn pause(broker: &Broker, args: &crate::PauseArgs, on: bool) -> Result {
    let table = broker.open_table(&args.table)?;
    if let Some(q) = &args.queue {
        let (verb, done) = if on {
            broker.pause_queue(&table, q)?;
            ("pause queue", "paused")
        } else {
            broker.resume_queue(&table, q)?;
            ("resume queue", "resumed")
        };
        logged(broker, verb, table.name(), q, 0);
        return say(format_args!(
            "queue {} of table {} is {done}\n",
            escape(q),
            table.name()
        ));
    }
    if on {
        broker.pause(&table)?;
        logged(broker, "pause", table.name(), "", 0);
        say(format_args!("table {} is paused\n", table.name()))
    } else {
        broker.resume(&table)?;
        logged(broker, "resume", table.name(), "", 0);
        say(format_args!("table {} is resumed\n", table.name()))
    }
}

/// One limit of `limits --json`; `null` where the form does not count.
#[derive(Serialize)]
struct LimitJson<'a> {
    /// `concurrency` or `rate`.
    kind: &'static str,
    key: &'a str,
    max: Option<u32>,
    described: u32,
    in_work: Option<u64>,
    waiting: Option<u64>,
    /// Rate limits: the window, in milliseconds, and the claims in the window ending now.
    #[serde(skip_serializing_if = "Option::is_none")]
    per_ms: Option<u128>,
    #[serde(skip_serializing_if = "Option::is_none")]
    claimed: Option<u64>,
}

fn limits(broker: &Broker, args: &crate::LimitsArgs) -> Result {
    let table = broker.open_table(&args.table)?;
    let limits = broker.concurrency_limits(&table)?;
    let rates = broker.rate_limits(&table)?;
    if args.json {
        let mut objects: Vec<LimitJson<'_>> = limits
            .iter()
            .map(|l| LimitJson {
                kind: "concurrency",
                key: &l.key,
                max: l.max,
                described: l.described,
                in_work: l.in_work,
                waiting: l.waiting,
                per_ms: None,
                claimed: None,
            })
            .collect();
        objects.extend(rates.iter().map(|r| LimitJson {
            kind: "rate",
            key: &r.key,
            max: r.max,
            described: r.described,
            in_work: None,
            waiting: Some(r.waiting),
            per_ms: Some(r.per.as_millis()),
            claimed: Some(r.claimed),
        }));
        return say(format_args!("{}\n", json(&objects)));
    }
    if limits.is_empty() && rates.is_empty() {
        return say(format_args!(
            "table {} has no concurrency limits\n",
            table.name()
        ));
    }
    let dash = || "-".to_string();
    let max = |m: Option<u32>| m.map_or_else(|| "lifted".to_string(), |n| n.to_string());
    let mut out = String::new();
    if !limits.is_empty() {
        let mut rows = vec![["KEY", "MAX", "DESCRIBED", "IN_WORK", "WAITING"]
            .map(String::from)
            .to_vec()];
        for l in &limits {
            rows.push(vec![
                escape(&format!("{:?}", l.key)),
                max(l.max),
                l.described.to_string(),
                l.in_work.map_or_else(dash, |n| n.to_string()),
                l.waiting.map_or_else(dash, |n| n.to_string()),
            ]);
        }
        out.push_str(&columns(&rows));
    }
    if !rates.is_empty() {
        if !out.is_empty() {
            out.push('\n');
        }
        let mut rows = vec![[
            "RATE_KEY",
            "MAX",
            "PER",
            "DESCRIBED",
            "CLAIMED_IN_WINDOW",
            "WAITING",
        ]
        .map(String::from)
        .to_vec()];
        for r in &rates {
            rows.push(vec![
                escape(&format!("{:?}", r.key)),
                max(r.max),
                humantime::format_duration(r.per).to_string(),
                r.described.to_string(),
                r.claimed.to_string(),
                r.waiting.to_string(),
            ]);
        }
        out.push_str(&columns(&rows));
    }
    say(format_args!("{out}"))
}

fn status(broker: &Broker, args: &StatusArgs) -> Result {
    if !args.only_queues.is_empty() {
        return grouped_status(broker, args, Grouped::Queue);
    }
    if !args.only_kinds.is_empty() {
        return grouped_status(broker, args, Grouped::Kind);
    }
    let every = args.tables.is_empty();
    let tables: Vec<Table> = if every {
        broker.tables()?.into_iter().map(|r| r.table).collect()
    } else {
        let open = |name: &String| args.desc.open(broker, name);
        args.tables.iter().map(open).collect::<Result<_, _>>()?
    };
    // Listing every table: one whose counts fail (a table dropped by hand since it was
    // recorded, say) is listed without counts and its error told on stderr; the listing
    // itself succeeded. A table named on the command line that fails is the command's error.
    let mut all = Vec::new();
    for table in &tables {
        match broker.stats(table) {
            Ok(stats) => all.push((table, Ok(stats))),
            Err(e) if every => {
                let missing = e.is_missing_table();
                let e = crate::chain(&e);
                eprintln!("sqlbroker: {}", escape(&e));
                if missing {
                    eprintln!(
                        "sqlbroker: table {0} is recorded but does not exist (dropped by hand?): \
                         `sqlbroker forget --table {0}` forgets its record",
                        table.name()
                    );
                }
                all.push((table, Err(e)));
            }
            Err(e) => return Err(e.into()),
        }
    }
    let out = if args.json {
        status_json(&all)
    } else {
        // LIMITED: ready rows a concurrency or rate limit holds back (not in READY);
        // WAITING: rows waiting on other jobs (not in SCHEDULED). Both "-" where the table
        // has no limits or dependencies: rows that neither READY nor IN_FLIGHT shows would
        // otherwise be nowhere.
        let mut rows = vec![[
            "TABLE",
            "FORM",
            "READY",
            "LIMITED",
            "SCHEDULED",
            "WAITING",
            "IN_FLIGHT",
            "DEAD",
            "COMPLETED",
            "OLDEST_READY",
            "PAUSED",
        ]
        .map(String::from)
        .to_vec()];
        let dash = || "-".to_string();
        for (table, stats) in &all {
            let mut row = vec![escape(table.name()), table.form().name().to_string()];
            row.extend(match stats {
                Ok(s) => [
                    s.ready.to_string(),
                    s.limited.map_or_else(dash, |n| n.to_string()),
                    s.scheduled.to_string(),
                    match table.has_dependencies() {
                        true => s.waiting.to_string(),
                        false => dash(),
                    },
                    s.in_flight.map_or_else(dash, |n| n.to_string()),
                    s.dead.to_string(),
                    s.completed.map_or_else(dash, |n| n.to_string()),
                    s.oldest_ready_age.map_or_else(dash, age),
                    if s.paused { "yes" } else { "no" }.to_string(),
                ],
                Err(_) => std::array::from_fn(|_| dash()),
            });
            rows.push(row);
        }
        columns(&rows)
    };
    say(format_args!("{out}"))
}

/// What `status` groups a table's counts by.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Grouped {
    Queue,
    Kind,
}

/// The queues of `table` holding ready rows of `kind` that none of the running members taking
/// the kind takes: empty if one of them takes every queue, or none takes the kind (that is
/// said apart), or the table has no queues.
fn unserved_queues(
    broker: &Broker,
    table: &Table,
    kind: &str,
    fleet: &[sqlbroker::WorkerInfo],
) -> Result<Vec<String>> {
    let takers: Vec<_> = fleet
        .iter()
        .flat_map(|w| w.tables())
        .filter(|t| t.name() == table.name() && t.takes_kind(Some(kind)))
        .collect();
    if takers.is_empty() || takers.iter().any(|t| t.queues().is_none()) {
        return Ok(Vec::new());
    }
    let taken: Vec<&String> = takers
        .iter()
        .flat_map(|t| t.queues().unwrap_or(&[]))
        .collect();
    let mut out = Vec::new();
    for (queue, s) in broker.queue_stats(table)? {
        if s.ready == 0 || taken.contains(&&queue) {
            continue;
        }
        let filter = sqlbroker::JobFilter::new().in_queue(&queue).of_kind(kind);
        if !broker
            .jobs_matching(table, sqlbroker::JobState::Ready, &filter, None, 1, 0)?
            .is_empty()
        {
            out.push(queue);
        }
    }
    Ok(out)
}

/// What `status --kind` calls rows published without a kind (no kind's name: a name has no
/// parentheses), and how it is asked for; `null` in JSON.
const NO_KIND: &str = "(none)";

/// `status --queue Q` / `--kind K`: the counts of the named queues or kinds (`all`: every one
/// with rows) of each table named, one line (or JSON object) per queue or kind. Rows without a
/// kind are [`NO_KIND`].
fn grouped_status(broker: &Broker, args: &StatusArgs, by: Grouped) -> Result {
    let (word, wanted) = match by {
        Grouped::Queue => ("queue", &args.only_queues),
        Grouped::Kind => ("kind", &args.only_kinds),
    };
    if args.tables.is_empty() {
        return Err(format!("status --{word} needs --table").into());
    }
    // (table, queue or kind: `None` for rows without a kind, counts)
    let mut out: Vec<(String, Option<String>, QueueStats)> = Vec::new();
    // By kind: the running subscriptions and workers that take each kind (their heartbeats);
    // `None` if they could not be read.
    let fleet = (by == Grouped::Kind)
        .then(|| broker.workers().ok())
        .flatten();
    let takers = |t: &str, k: &Option<String>| {
        fleet
            .as_ref()
            .map(|f| f.iter().filter(|w| w.takes(t, k.as_deref())).count())
    };
    // (table, kind) -> the queues with ready rows of the kind that no member taking the kind
    // takes (each such member names its queues).
    let mut unserved: Vec<(String, Option<String>, Vec<String>)> = Vec::new();
    for name in &args.tables {
        let table = args.desc.open(broker, name)?;
        let (all, paused) = match by {
            Grouped::Queue => {
                let all = broker.queue_stats(&table)?;
                let all = all.into_iter().map(|(q, s)| (Some(q), s)).collect();
                (all, broker.paused_queues(&table)?)
            }
            Grouped::Kind => (broker.kind_stats(&table)?, Vec::new()),
        };
        let asked = |w: &String, q: &Option<String>| match q {
            Some(q) => w == q,
            None => w == NO_KIND,
        };
        let want = |q: &Option<String>| wanted.iter().any(|w| w == "all" || asked(w, q));
        for (q, s) in all.into_iter().filter(|(q, _)| want(q)) {
            if let (Some(fleet), Some(kind), true) = (&fleet, &q, s.ready > 0) {
                let queues = unserved_queues(broker, &table, kind, fleet)?;
                if !queues.is_empty() {
                    unserved.push((table.name().to_string(), q.clone(), queues));
                }
            }
            out.push((table.name().to_string(), q, s));
        }
        // A queue or kind asked for by name that has no rows: zeros (paused or not).
        for w in wanted.iter().filter(|w| *w != "all") {
            let q = (w != NO_KIND || by == Grouped::Queue).then(|| w.clone());
            if !out.iter().any(|(t, n, _)| t == table.name() && *n == q) {
                let mut s = broker.stats(&table)?;
                s.ready = 0;
                s.scheduled = 0;
                s.waiting = 0;
                s.limited = None;
                s.in_flight = s.in_flight.map(|_| 0);
                s.dead = 0;
                s.completed = s.completed.map(|_| 0);
                s.oldest_ready_age = None;
                s.paused = s.paused || paused.contains(w);
                out.push((table.name().to_string(), q, s));
            }
        }
    }
    let unserved_of = |t: &str, k: &Option<String>| {
        unserved
            .iter()
            .find(|(ut, uk, _)| ut == t && uk == k)
            .map(|(_, _, q)| q.clone())
            .unwrap_or_default()
    };
    if args.json {
        let items: Vec<serde_json::Value> = out
            .iter()
            .map(|(t, q, s)| {
                let mut item = serde_json::json!({
                    "table": t,
                    word: q,
                    "ready": s.ready,
                    "scheduled": s.scheduled,
                    "in_flight": s.in_flight,
                    "dead": s.dead,
                    "completed": s.completed,
                    "oldest_ready_secs": s.oldest_ready_age.map(|d| d.as_secs()),
                    "paused": s.paused,
                });
                if by == Grouped::Kind {
                    item["workers"] = serde_json::json!(takers(t, q));
                    item["queues_without_worker"] = serde_json::json!(unserved_of(t, q));
                }
                // Values as they are (`json` escapes for the terminal within the strings).
                item
            })
            .collect();
        return say(format_args!("{}\n", json(&items)));
    }
    let dash = || "-".to_string();
    let mut rows = vec![[
        "TABLE",
        if by == Grouped::Queue {
            "QUEUE"
        } else {
            "KIND"
        },
        "READY",
        "SCHEDULED",
        "IN_FLIGHT",
        "DEAD",
        "COMPLETED",
        "OLDEST_READY",
        "PAUSED",
    ]
    .map(String::from)
    .to_vec()];
    if by == Grouped::Kind {
        rows[0].push("WORKERS".into());
    }
    let mut orphans = Vec::new();
    for (t, q, s) in &out {
        let n = takers(t, q);
        let kind = q.as_deref().map_or_else(|| NO_KIND.to_string(), escape);
        if by == Grouped::Kind && s.ready > 0 && n == Some(0) {
            orphans.push(format!(
                "no worker for kind {kind} of table {} ({} ready)",
                escape(t),
                s.ready
            ));
        }
        for queue in unserved_of(t, q) {
            orphans.push(format!(
                "no worker for kind {kind} in queue {} of table {}",
                escape(&queue),
                escape(t)
            ));
        }
        rows.push(vec![
            escape(t),
            kind,
            s.ready.to_string(),
            s.scheduled.to_string(),
            s.in_flight.map_or_else(dash, |n| n.to_string()),
            s.dead.to_string(),
            s.completed.map_or_else(dash, |n| n.to_string()),
            s.oldest_ready_age.map_or_else(dash, age),
            if s.paused { "yes" } else { "no" }.to_string(),
        ]);
        if by == Grouped::Kind {
            rows.last_mut()
                .expect("just pushed")
                .push(n.map_or_else(dash, |n| n.to_string()));
        }
    }
    let notes: String = orphans.iter().map(|o| format!("{o}\n")).collect();
    say(format_args!("{}{notes}", columns(&rows)))
}

/// One table of `status --json`; fields in this order, `null` where the form does not count
/// (or, with `error`, where the counts failed).
#[derive(Serialize)]
struct StatusJson<'a> {
    table: &'a str,
    form: &'static str,
    ready: Option<u64>,
    /// Lease tables with concurrency limits: ready rows a limit holds back.
    #[serde(skip_serializing_if = "Option::is_none")]
    limited: Option<u64>,
    scheduled: Option<u64>,
    /// Tables with dependencies: rows waiting on other jobs.
    #[serde(skip_serializing_if = "Option::is_none")]
    waiting: Option<u64>,
    in_flight: Option<u64>,
    dead: Option<u64>,
    completed: Option<u64>,
    oldest_ready_secs: Option<u64>,
    paused: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'a str>,
}

/// One JSON object per table, in an array, on one line.
fn status_json(all: &[(&Table, std::result::Result<QueueStats, String>)]) -> String {
    let objects: Vec<StatusJson<'_>> = all
        .iter()
        .map(|(table, stats)| {
            let s = stats.as_ref().ok();
            StatusJson {
                table: table.name(),
                form: table.form().name(),
                ready: s.map(|s| s.ready),
                limited: s.and_then(|s| s.limited),
                scheduled: s.map(|s| s.scheduled),
                waiting: s.filter(|_| table.has_dependencies()).map(|s| s.waiting),
                in_flight: s.and_then(|s| s.in_flight),
                dead: s.map(|s| s.dead),
                completed: s.and_then(|s| s.completed),
                oldest_ready_secs: s.and_then(|s| s.oldest_ready_age.map(|d| d.as_secs())),
                paused: s.map(|s| s.paused),
                error: stats.as_ref().err().map(String::as_str),
            }
        })
        .collect();
    format!("{}\n", json(&objects))
}

/// Compact JSON that is safe on a terminal: serde_json escapes C0 controls, and this also
/// escapes what it leaves raw, DEL, C1 controls, bidi overrides and U+2028/U+2029, as
/// `\uXXXX`. Outside strings compact JSON is ASCII punctuation, so every such character is
/// inside a string, where the escape means the same character.
pub(crate) fn json(value: &impl Serialize) -> String {
    // Strings, numbers, nulls and maps with string keys always serialise.
    let text = serde_json::to_string(value).unwrap_or_default();
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if unsafe_char(c) {
            let _ = write!(out, "\\u{:04x}", u32::from(c));
        } else {
            out.push(c);
        }
    }
    out
}

/// One row of `dead list --json`: the fields of `job --json` a dead letter has.
#[derive(Serialize)]
struct DeadJson<'a> {
    table: &'a str,
    id: i64,
    attempts: u32,
    errors: u32,
    last_error: Option<&'a str>,
    dead_reason: &'a str,
    dead_at: String,
    payload: String,
    values: serde_json::Map<String, serde_json::Value>,
}

fn dead_list(broker: &Broker, args: &DeadListArgs) -> Result {
    let DeadListArgs {
        page: args,
        json: as_json,
    } = args;
    let table = args.table.open(broker)?;
    let limit = usize::try_from(args.limit).unwrap_or(usize::MAX);
    let page = broker.dead_letters_after(&table, args.after, limit)?;
    if *as_json {
        let rows: Vec<DeadJson<'_>> = page
            .iter()
            .map(|d| DeadJson {
                table: table.name(),
                id: d.id,
                attempts: d.attempts,
                errors: d.errors,
                last_error: d.last_error(),
                dead_reason: &d.reason,
                dead_at: utc(d.dead_at),
                payload: String::from_utf8_lossy(&d.payload).into_owned(),
                values: d
                    .values
                    .iter()
                    .map(|(c, v)| (c.clone(), json_value(v)))
                    .collect(),
            })
            .collect();
        say(format_args!("{}\n", json(&rows)))?;
        page_end(
            page.len(),
            limit,
            page.last().map(|d| d.id),
            "dead-lettered",
        );
        return Ok(());
    }
    let mut rows = vec![[
        "ID",
        "ATTEMPTS",
        "DEAD_AT",
        "REASON",
        "ERRORS",
        "LAST_ERROR",
        "PAYLOAD",
    ]
    .map(String::from)
    .to_vec()];
    for d in &page {
        rows.push(vec![
            d.id.to_string(),
            d.attempts.to_string(),
            utc(d.dead_at),
            preview(d.reason.as_bytes()),
            d.errors.to_string(),
            d.last_error().map_or("-".into(), |e| preview(e.as_bytes())),
            preview(&d.payload),
        ]);
    }
    say(format_args!("{}", columns(&rows)))?;
    page_end(
        page.len(),
        limit,
        page.last().map(|d| d.id),
        "dead-lettered",
    );
    Ok(())
}

fn completed_list(broker: &Broker, args: &PageArgs) -> Result {
    let table = args.table.open(broker)?;
    let limit = usize::try_from(args.limit).unwrap_or(usize::MAX);
    let page = broker.completed_after(&table, args.after, limit)?;
    let mut rows = vec![["ID", "ATTEMPTS", "COMPLETED_AT", "PAYLOAD"]
        .map(String::from)
        .to_vec()];
    for c in &page {
        rows.push(vec![
            c.id.to_string(),
            c.attempts.to_string(),
            utc(c.completed_at),
            preview(&c.payload),
        ]);
    }
    say(format_args!("{}", columns(&rows)))?;
    page_end(page.len(), limit, page.last().map(|c| c.id), "completed");
    Ok(())
}

/// Tells on stderr where the next page starts, or that this was the last.
fn page_end(listed: usize, limit: usize, last: Option<i64>, what: &str) {
    match last {
        Some(last) if listed == limit => eprintln!("more rows may follow: --after {last}"),
        _ => eprintln!("{} listed", count(listed, &format!("{what} row"))),
    }
}

#[derive(Clone, Copy)]
enum Pick {
    Requeue,
    Purge,
}

fn dead_pick(broker: &Broker, args: &DeadPick, pick: Pick) -> Result {
    let table = args.table.open(broker)?;
    let (verb, action) = match pick {
        Pick::Requeue => ("requeued", "requeue"),
        Pick::Purge => ("purged", "purge"),
    };
    if args.all {
        let n = match pick {
            Pick::Requeue => broker.requeue_all_dead(&table)?,
            Pick::Purge => broker.purge_all_dead(&table)?,
        };
        logged(broker, action, table.name(), "every dead letter", n);
        return say(format_args!("{verb} {}\n", count(n, "dead-lettered row")));
    }
    let mut missing = Vec::new();
    let mut done = Vec::new();
    let mut failed = None;
    for id in args.ids() {
        let found = match pick {
            Pick::Requeue => broker.requeue_dead(&table, id),
            Pick::Purge => broker.purge_dead(&table, id),
        };
        match found {
            Ok(true) => done.push(id.to_string()),
            Ok(false) => missing.push(id.to_string()),
            Err(e) => {
                failed = Some(e);
                break;
            }
        }
    }
    // What was done is recorded even when a later id failed.
    if !done.is_empty() {
        let detail = format!("jobs {}", done.join(", "));
        logged(broker, action, table.name(), &detail, done.len() as u64);
    }
    if let Some(e) = failed {
        return Err(e.into());
    }
    let done = done.len();
    say(format_args!(
        "{verb} {}\n",
        count(done, "dead-lettered row")
    ))?;
    if missing.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "no dead-lettered row with id {} in table {}",
            missing.join(", "),
            table.name()
        )
        .into())
    }
}

fn publish(broker: &Broker, args: &PublishArgs) -> Result {
    let table = args.table.open(broker)?;
    let mut values = Vec::new();
    for (column, text) in &args.set {
        // Typed as the table's recorded column; a column it does not have is refused by
        // publish (as text here).
        let ty = table
            .columns()
            .find(|(c, _)| c == column)
            .map_or(ColumnType::Text, |(_, ty)| ty);
        values.push((column.clone(), typed(column, text, ty)?));
    }
    let message = |payload: Vec<u8>| {
        let mut m = Message::new(payload);
        for (c, v) in &values {
            m = m.set(c.clone(), v.clone());
        }
        if let Some(delay) = args.delay {
            m = m.deliver_after(delay);
        }
        if let Some(tp) = &args.trace {
            m = m.traceparent(tp);
        }
        if let Some(q) = &args.queue {
            m = m.queue(q.clone());
        }
        if let Some(k) = &args.kind {
            m = m.kind(k.clone());
        }
        m
    };
    let (mut rows, mut duplicates) = (0, 0);
    let mut flush = |batch: &mut Vec<Message>| -> Result {
        let done = broker.publish_batch(&table, std::mem::take(batch))?;
        rows += done.rows;
        duplicates += done.duplicates;
        Ok(())
    };
    let mut batch = Vec::new();
    let mut input = std::io::stdin().lock();
    let mut line = Vec::new();
    loop {
        line.clear();
        if input.read_until(b'\n', &mut line)? == 0 {
            break;
        }
        if line.last() == Some(&b'\n') {
            line.pop();
            if line.last() == Some(&b'\r') {
                line.pop();
            }
        }
        batch.push(message(line.clone()));
        if batch.len() == PUBLISH_BATCH {
            flush(&mut batch)?;
        }
    }
    if !batch.is_empty() {
        flush(&mut batch)?;
    }
    let messages = if rows == 1 { "message" } else { "messages" };
    if duplicates > 0 {
        say(format_args!(
            "published {rows} {messages}; {duplicates} skipped as duplicates\n"
        ))
    } else {
        say(format_args!("published {rows} {messages}\n"))
    }
}

/// `text` as a value of a column of type `ty`.
fn typed(column: &str, text: &str, ty: ColumnType) -> Result<Value> {
    let bad = |what: &str| format!("--set {column}={text}: not {what}");
    Ok(match ty {
        ColumnType::Int => Value::Int(text.parse().map_err(|_| bad("an integer"))?),
        ColumnType::Float => Value::Float(text.parse().map_err(|_| bad("a number"))?),
        ColumnType::Bytes => Value::Bytes(text.as_bytes().to_vec()),
        ColumnType::Time => Value::Time(
            humantime::parse_rfc3339_weak(text)
                .map_err(|_| bad("a time (2026-12-01T09:30:00Z)"))?,
        ),
        _ => Value::Text(text.to_string()),
    })
}

/// Rows as left-aligned columns two spaces apart.
pub(crate) fn columns(rows: &[Vec<String>]) -> String {
    let mut widths = Vec::new();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            let w = cell.chars().count();
            match widths.get_mut(i) {
                Some(max) if *max < w => *max = w,
                Some(_) => {}
                None => widths.push(w),
            }
        }
    }
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            if i + 1 == row.len() {
                line.push_str(cell);
            } else {
                line.push_str(&format!("{cell:<w$}  ", w = widths[i]));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// Bytes as text on one line: invalid UTF-8 replaced, escaped as [`escape`] does, cut at
/// [`PREVIEW`] characters.
pub(crate) fn preview(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let mut out = String::new();
    for (n, c) in text.chars().enumerate() {
        if n == PREVIEW {
            out.push_str("...");
            break;
        }
        push_escaped(&mut out, c);
    }
    out
}

/// Stored text made safe to print on a terminal, on one line: control characters (C0, DEL,
/// C1: ESC starts the sequences that set a title or erase lines, CR and LF forge lines), bidi
/// overrides and isolates (which reorder what follows) and the line and paragraph separators
/// U+2028/U+2029 are written as Rust escapes (`\u{1b}`, `\r`, `\n`, `\u{202e}`). Every
/// command prints stored text (errors, reasons, payloads, values, names) through this.
pub(crate) fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        push_escaped(&mut out, c);
    }
    out
}

/// [`escape`], keeping line feeds and tabs: text shown on several lines (a payload's or an
/// error's, in a page's `<pre>`), where a line break is the text's own. CR is still escaped:
/// it breaks a line as well, where the text would not show one.
pub(crate) fn escape_keeping_lines(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\n' | '\t' => out.push(c),
            c => push_escaped(&mut out, c),
        }
    }
    out
}

fn push_escaped(out: &mut String, c: char) {
    if unsafe_char(c) {
        out.extend(c.escape_default());
    } else {
        out.push(c);
    }
}

/// A character a terminal acts on or that reorders or breaks the line: see [`escape`].
fn unsafe_char(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}'
                | '\u{2028}' | '\u{2029}'
        )
}

/// `3s`, `2m05s`, `1h02m03s`, `3d04h`.
pub(crate) fn age(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..=59 => format!("{s}s"),
        60..=3_599 => format!("{}m{:02}s", s / 60, s % 60),
        3_600..=86_399 => format!("{}h{:02}m{:02}s", s / 3_600, s / 60 % 60, s % 60),
        _ => format!("{}d{:02}h", s / 86_400, s / 3_600 % 24),
    }
}

/// A time as `YYYY-MM-DDTHH:MM:SSZ` (seconds since the epoch for a time before 1970 or after
/// 9999, which only a hand-edited row holds).
pub(crate) fn utc(t: SystemTime) -> String {
    let secs = match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_secs() as i64,
        Err(e) => -(e.duration().as_secs() as i64),
    };
    if (0..=253_402_300_799).contains(&secs) {
        humantime::format_rfc3339_seconds(t).to_string()
    } else {
        format!("{secs}s since 1970")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        assert_eq!(utc(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        assert_eq!(
            utc(UNIX_EPOCH + Duration::from_secs(1_709_214_307)),
            "2024-02-29T13:45:07Z"
        );
        assert_eq!(age(Duration::from_secs(5)), "5s");
        assert_eq!(age(Duration::from_secs(125)), "2m05s");
        assert_eq!(age(Duration::from_secs(3_723)), "1h02m03s");
        assert_eq!(age(Duration::from_secs(273_600)), "3d04h");
        assert_eq!(preview(b"a\nb\xff"), "a\\nb\u{fffd}");
        assert_eq!(preview("x".repeat(70).as_bytes()).len(), PREVIEW + 3);
        assert_eq!(
            escape("\x1b]0;t\x07\r\n\u{202e}\u{2028}\u{85}\x7f ok"),
            "\\u{1b}]0;t\\u{7}\\r\\n\\u{202e}\\u{2028}\\u{85}\\u{7f} ok"
        );
        assert_eq!(
            escape_keeping_lines("a\n\tb\r\n\u{202e}"),
            "a\n\tb\\r\n\\u{202e}"
        );
        assert_eq!(
            json(&["\x1b\u{7f}\u{9b}\u{202e}\u{2066}\u{2029}é"]),
            r#"["\u001b\u007f\u009b\u202e\u2066\u2029é"]"#
        );
        assert_eq!(
            columns(&[
                vec!["A".into(), "BB".into(), "C".into()],
                vec!["long".into(), "x".into(), "".into()]
            ]),
            "A     BB  C\nlong  x\n"
        );
    }
}
