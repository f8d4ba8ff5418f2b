//! `sqlbroker`: the operator's command line tool (cargo feature `cli`).
//!
//! ```text
//! sqlbroker create-table --table jobs --lease 30s --column kind
//! sqlbroker --url postgres://postgres@127.0.0.1/app status
//! sqlbroker status --table jobs --json
//! sqlbroker pause --table jobs
//! sqlbroker pause --table jobs --queue emails       # one queue of a table made with --queues
//! sqlbroker resume --table jobs
//! sqlbroker status --table jobs --queue all         # counts by queue
//! sqlbroker forget --table gone                   # the record of a table dropped by hand
//! sqlbroker dead list --table jobs --limit 20
//! sqlbroker dead list --table jobs --json
//! sqlbroker dead requeue --table jobs 17 18       # or --id 17 --id 18
//! sqlbroker dead purge --table jobs --all
//! sqlbroker completed prune --table jobs
//! printf 'a\nb\n' | sqlbroker publish --table jobs --set kind=import
//! sqlbroker job --table jobs 17 --json            # or --id 17
//! sqlbroker cancel --table jobs 17
//! sqlbroker schema --dialect postgres --table jobs --lease 30 --dedup > V1__jobs.sql
//! sqlbroker schema --table jobs --lease 30 --dedup --priorities --migrate > V2__jobs.sql
//! sqlbroker --url sqlite:app.db schema --table jobs   # the recorded table's DDL
//! sqlbroker dashboard --listen 127.0.0.1:8640      # cargo feature `dashboard`
//! sqlbroker bench --jobs 10000 --form lease --ack batch --mode both
//! ```
//!
//! The URL comes from `--url` or `DATABASE_URL`. `create-table` (and `migrate`) describe a
//! table by flags that mirror [`sqlbroker::Table`]'s builder (`--lease`, `--advisory-lock`,
//! `--column`, `--fifo`, `--priorities`, `--dedup`, `--keep-completed`, `--dependencies`,
//! `--outputs`, `--checkpoints`, `--traceparent`, `--queues`, `--kinds`), and record the description in the database; every other
//! command takes the table's name only and reads its description from there
//! (`Broker::open_table`). Those flags are still accepted by the
//! other commands: the description they make is checked against the record, and refused if
//! it differs. `status` with no `--table` lists every recorded table.
//!
//! Durations (`--lease`, `--keep-completed`, `--delay`, `--connect-timeout`) are whole
//! seconds (`30`) or as `humantime` spells them (`30s`, `1m 30s`, `2h`). An id is given
//! positionally or as `--id` alike. Only `create-table`, `migrate` and `bench` create an
//! SQLite database file; every other command refuses a file that does not exist (a mistyped
//! path would otherwise be an empty queue). Stored text (errors, reasons, payloads, values) is
//! printed with control characters, bidi overrides and line separators escaped, in JSON too.
//!
//! Exit codes: 0 done; 1 the operation failed (database, connection, a row not found);
//! 2 usage (a bad or missing argument). Errors are printed as `sqlbroker: <error>` on stderr.

mod commands;

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, CommandFactory, Parser, Subcommand};
use sqlbroker::{ColumnType, Table};

/// Operate sqlbroker queue tables on PostgreSQL, MySQL/MariaDB and SQLite: counts by state,
/// pause and resume, dead letters, table creation and publishing.
///
/// Exit codes: 0 done, 1 the operation failed, 2 usage error.
#[derive(Debug, Parser)]
#[command(name = "sqlbroker", version, propagate_version = true)]
struct Cli {
    /// The database: postgres://user@host:5432/db, mysql://user:pass@host:3306/db,
    /// sqlite:path/to/file.db. The dashboard takes several (repeat --url; NAME=URL names
    /// one), every other command one.
    #[arg(long, env = "DATABASE_URL", global = true, hide_env_values = true)]
    url: Vec<String>,

    /// How long to wait for a database connection before giving up: seconds (10) or a
    /// duration (10s, 1m), rounded up to whole seconds.
    #[arg(long, value_name = "DURATION", default_value_t = 10, global = true,
          value_parser = parse_secs)]
    connect_timeout: u64,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Rows by state per table: ready, scheduled, in flight (lease tables), dead, and the age
    /// of the oldest ready row.
    Status(StatusArgs),
    /// Dead-lettered rows: list them, requeue them, purge them.
    #[command(subcommand)]
    Dead(DeadCommand),
    /// Completed rows a table keeps (--keep-completed): list them, prune them.
    #[command(subcommand)]
    Completed(CompletedCommand),
    /// Create the table and its indexes if it does not exist (an existing table is left as
    /// it is).
    CreateTable(TableArgs),
    /// Bring a table made by an earlier version up to its description: add the missing
    /// columns and indexes (create the table if there is none); prints what it did.
    Migrate(TableArgs),
    /// Publish one message per line of standard input (the line without its line ending is
    /// the payload; empty lines are empty payloads).
    Publish(PublishArgs),
    /// A page of a table's jobs in one state, by id (ready by default), narrowed to a queue,
    /// a kind or a column's value: id, state, queue and kind, attempts, due time, last error
    /// and the payload's first bytes. Row lock and advisory tables cannot tell a due row in
    /// work from a ready one without taking its lock: there `ready` lists both.
    Jobs(JobsArgs),
    /// One job by id: its state, attempts, failures and last error, times and values.
    Job(JobArgs),
    /// Cancel a job: one not in work is removed (kept completed and cancelled on a table that
    /// keeps completed rows); one in work finishes its attempt and is not retried. Exit 1 if
    /// no live or dead job has that id.
    Cancel(CancelArgs),
    /// Send a signal on a table made with dependencies: release the jobs waiting for it
    /// (published with after_signal), and keep it a day for the jobs published later. Says how
    /// many jobs it released; a signal sent before changes nothing (its first payload stays).
    Signal(SignalArgs),
    /// Pause a table: its subscriptions, in every process, stop claiming within a poll
    /// interval (deliveries in hand finish), until `resume`. With --queue, one queue of a
    /// table with queues: no claim takes its rows from its next statement on.
    Pause(PauseArgs),
    /// Resume a paused table (with --queue, a paused queue): its subscriptions claim again.
    Resume(PauseArgs),
    /// Forget the recorded description of a table that no longer exists (dropped by hand): its
    /// record, its rate limits' slots and the dependency rows naming it. A table that exists
    /// is refused (exit 1).
    Forget(NameArgs),
    /// A table's concurrency limits: each key template, the max in force and the described
    /// one, and (lease tables) the rows in work and the ready rows waiting on it; then its
    /// rate limits: each key template, max, window and the claims in the window ending now.
    Limits(LimitsArgs),
    /// Set a concurrency limit's max at run time (--max N), or lift it (--lift); with
    /// --rate, a rate limit's: every subscription, in any process, follows from its next
    /// claim.
    Limit(LimitArgs),
    /// The action log, newest first: who changed what (dashboard actions and this
    /// command's cancel, dead requeue and purge, completed prune, pause, resume, limit).
    Actions(ActionsArgs),
    /// The subscriptions and workers running on the database, in every process, from their
    /// heartbeats: host and process, the tables with the queues {..} and kinds [..] each
    /// takes (none named: every one), rows in work, deliveries handled, when last seen, the
    /// last error. One whose process stopped drops out three heartbeats after its last.
    Workers(WorkersArgs),
    /// The periodic schedules recorded on the database (`list`: table, name, cron, next and
    /// last tick, running, paused or orphaned), and `pause NAME` / `resume NAME`, on every
    /// process that runs it.
    Periodic(PeriodicArgs),
    /// Which process maintains the database (the elected broker that prunes what the tables
    /// keep past their retention): host, pid, since, term.
    Maintainer,
    /// Print the SQL of a table for a migration tool, running nothing: what create-table
    /// runs (with --dialect, no database needed), or with --migrate what migrate would run
    /// on the table as it is now.
    Schema(commands::schema::SchemaArgs),
    /// Print the SQL of the tables the library writes for itself (registry, action log,
    /// fleet, periodic schedules, maintainer), running nothing: for a service whose broker
    /// runs no DDL (`manage_schema(false)`). With --dialect, no database needed.
    LibrarySchema(commands::schema::LibrarySchemaArgs),
    /// Measure the database in hand: a burn-down (--jobs published, then worked) and a steady
    /// run (published at --rate for --secs while worked), on a scratch table made for the
    /// run and dropped at its end: jobs/s, publish-to-start p50/p99, client CPU per job.
    Bench(commands::bench::BenchArgs),
    /// Serve a web dashboard of the tables (counts, jobs, dead letters, actions) and a
    /// Prometheus `/metrics` page (cargo feature `dashboard`).
    #[cfg(feature = "dashboard")]
    Dashboard(commands::dashboard::DashboardArgs),
    /// Built without the `dashboard` feature: says so instead of "unrecognized subcommand".
    #[cfg(not(feature = "dashboard"))]
    #[command(hide = true, disable_help_flag = true)]
    Dashboard(NoDashboard),
}

/// Whatever `dashboard` was given, in a build without the feature.
#[cfg(not(feature = "dashboard"))]
#[derive(Debug, Args)]
struct NoDashboard {
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, hide = true)]
    _rest: Vec<String>,
}

/// What a build without the `dashboard` feature says to `sqlbroker dashboard`.
#[cfg(not(feature = "dashboard"))]
const NO_DASHBOARD: &str = "this sqlbroker was built without the `dashboard` feature; \
    build it with `cargo install sqlbroker --features dashboard` \
    (or `cargo run --features dashboard --bin sqlbroker -- dashboard`)";

/// A job's id: positionally (`job --table jobs 17`) or as `--id 17`, not both.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("job_id").required(true).args(["id", "id_flag"])))]
struct JobId {
    /// The job's id (or --id ID).
    #[arg(value_name = "ID")]
    id: Option<i64>,

    /// The job's id, as an option.
    #[arg(long = "id", id = "id_flag", value_name = "ID")]
    id_flag: Option<i64>,
}

impl JobId {
    fn get(&self) -> i64 {
        // clap requires exactly one of the two.
        self.id.or(self.id_flag).unwrap_or_default()
    }
}

/// A job of a table, by id.
#[derive(Debug, Args)]
struct JobArgs {
    #[command(flatten)]
    table: TableArgs,

    #[command(flatten)]
    id: JobId,

    /// Print JSON (one object) instead of text.
    #[arg(long)]
    json: bool,
}

/// A job to cancel.
#[derive(Debug, Args)]
struct CancelArgs {
    #[command(flatten)]
    table: TableArgs,

    #[command(flatten)]
    id: JobId,
}

/// A signal to send.
#[derive(Debug, Args)]
struct SignalArgs {
    #[command(flatten)]
    table: TableArgs,

    /// The signal's name (1 to 63 characters of A-Z a-z 0-9 _ . : -).
    #[arg(value_name = "NAME")]
    name: String,

    /// The payload the jobs waiting for it read (UTF-8 text; none: empty).
    #[arg(long, value_name = "TEXT", default_value = "")]
    payload: String,
}

/// A recorded table, by name.
#[derive(Debug, Args)]
struct NameArgs {
    /// The table's name.
    #[arg(long, short, value_name = "NAME")]
    table: String,
}

/// A recorded table, or one queue of it.
#[derive(Debug, Args)]
struct PauseArgs {
    /// The table's name.
    #[arg(long, short, value_name = "NAME")]
    table: String,

    /// One queue of the table (a table made with --queues), not the whole table.
    #[arg(long, value_name = "QUEUE")]
    queue: Option<String>,
}

#[derive(Debug, Args)]
struct LimitsArgs {
    /// The table's name.
    #[arg(long, short, value_name = "NAME")]
    table: String,
    /// One JSON array on one line instead of columns.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("setting").required(true).args(["max", "lift"])))]
struct LimitArgs {
    /// The table's name.
    #[arg(long, short, value_name = "NAME")]
    table: String,
    /// The limit's key template as described (`{tenant}`; `""` for the table-wide one).
    #[arg(long, value_name = "TEMPLATE")]
    key: String,
    /// The new max: at most this many rows of one key in work at once.
    #[arg(long, value_name = "N")]
    max: Option<u32>,
    /// Lift the limit (no max) until it is set again.
    #[arg(long)]
    lift: bool,
    /// The rate limit of that key (`Table::rate_limit`), not the concurrency limit: --max
    /// is then the most claims of one key in a window.
    #[arg(long)]
    rate: bool,
    /// With --rate: the window of the rate limit meant (`1s`, `1m`), for a key with several
    /// ("10 a second and 100 a minute"); a key with one window needs none.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, requires = "rate")]
    per: Option<std::time::Duration>,
}

#[derive(Debug, Subcommand)]
enum DeadCommand {
    /// List dead-lettered rows by id, one page at a time.
    List(DeadListArgs),
    /// Put dead-lettered rows back in the queue: due now, attempts reset.
    Requeue(DeadPick),
    /// Delete dead-lettered rows (a live row is never deleted).
    Purge(DeadPick),
}

#[derive(Debug, Subcommand)]
enum CompletedCommand {
    /// List the completed rows the table keeps, by id, one page at a time.
    List(PageArgs),
    /// Delete the completed rows kept longer than --keep-completed seconds.
    Prune(TableArgs),
}

/// How the table is described: the flags mirror the library's `Table` builder.
#[derive(Debug, Clone, Args)]
struct Description {
    /// Lease form: the lease, seconds (30) or a duration (30s, 1m 30s), rounded up to whole
    /// seconds (the table has a locked_until column).
    #[arg(long, value_name = "DURATION", conflicts_with = "advisory_lock",
          value_parser = parse_duration)]
    lease: Option<Duration>,

    /// Advisory lock form: the key template, e.g. 'accounts-{account}'.
    #[arg(long, value_name = "TEMPLATE")]
    advisory_lock: Option<String>,

    /// A column of the application's, NAME or NAME:TYPE with TYPE text (the default), int,
    /// float or bytes. Repeat for several, in the application's order.
    #[arg(long = "column", value_name = "NAME[:TYPE]", value_parser = parse_column)]
    columns: Vec<(String, ColumnType)>,

    /// FIFO groups on this text column.
    #[arg(long, value_name = "COLUMN")]
    fifo: Option<String>,

    /// The table has a priority column.
    #[arg(long)]
    priorities: bool,

    /// The table has a dedup_key column.
    #[arg(long)]
    dedup: bool,

    /// The table keeps acked rows this long (a completed_at column): seconds (3600) or a
    /// duration (1h, 7days).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    keep_completed: Option<Duration>,

    /// The table's jobs may wait on other jobs (`Table::dependencies`).
    #[arg(long)]
    dependencies: bool,

    /// The table's jobs record what they produced (an output column, `Table::outputs`).
    #[arg(long)]
    outputs: bool,

    /// The table's jobs save their progress (a checkpoint column, `Table::checkpoints`).
    #[arg(long)]
    checkpoints: bool,

    /// The table's rows carry the W3C trace context of their publish (a traceparent column,
    /// `Table::traceparent`).
    #[arg(long)]
    traceparent: bool,

    /// Named queues in the table (a queue column, `Table::queues`).
    #[arg(long)]
    queues: bool,

    /// Job kinds in the table (a kind column, `Table::kinds`).
    #[arg(long)]
    kinds: bool,
}

impl Description {
    /// True if no flag describes the table: commands then read its recorded description.
    fn is_empty(&self) -> bool {
        self.lease.is_none()
            && self.advisory_lock.is_none()
            && self.columns.is_empty()
            && self.fifo.is_none()
            && !self.priorities
            && !self.dedup
            && self.keep_completed.is_none()
            && !self.dependencies
            && !self.outputs
            && !self.checkpoints
            && !self.traceparent
            && !self.queues
            && !self.kinds
    }

    /// The table named `name`: the one the flags describe, or, with none, its record.
    fn open(&self, broker: &sqlbroker::Broker, name: &str) -> sqlbroker::Result<Table> {
        if self.is_empty() {
            broker.open_table(name)
        } else {
            Ok(self.table(name))
        }
    }

    fn table(&self, name: &str) -> Table {
        let mut t = Table::new(name);
        for (c, ty) in &self.columns {
            t = t.column(c.clone(), *ty);
        }
        if let Some(g) = &self.fifo {
            t = t.group(g.clone()).fifo();
        }
        if let Some(lease) = self.lease {
            t = t.lease(lease);
        }
        if let Some(template) = &self.advisory_lock {
            t = t.advisory_lock(template.clone());
        }
        if self.priorities {
            t = t.priorities();
        }
        if self.dedup {
            t = t.dedup();
        }
        if let Some(retention) = self.keep_completed {
            t = t.keep_completed(retention);
        }
        if self.dependencies {
            t = t.dependencies();
        }
        if self.outputs {
            t = t.outputs();
        }
        if self.checkpoints {
            t = t.checkpoints();
        }
        if self.traceparent {
            t = t.traceparent();
        }
        if self.queues {
            t = t.queues();
        }
        if self.kinds {
            t = t.kinds();
        }
        t
    }
}

/// One table and its description.
#[derive(Debug, Args)]
struct TableArgs {
    /// The table's name.
    #[arg(long, short, value_name = "NAME")]
    table: String,

    #[command(flatten)]
    desc: Description,
}

impl TableArgs {
    /// The table as the flags describe it (`create-table`).
    fn table(&self) -> Table {
        self.desc.table(&self.table)
    }

    /// The table as the flags describe it, or, with none, as recorded.
    fn open(&self, broker: &sqlbroker::Broker) -> sqlbroker::Result<Table> {
        self.desc.open(broker, &self.table)
    }
}

#[derive(Debug, Args)]
struct StatusArgs {
    /// A table's name; repeat for several. None: every recorded table.
    #[arg(long = "table", short, value_name = "NAME")]
    tables: Vec<String>,

    #[command(flatten)]
    desc: Description,

    /// Print JSON (an array with one object per table) instead of a text table.
    #[arg(long)]
    json: bool,

    /// The counts of these queues of the table (a table made with --queues), one line
    /// each; repeat for several. `--queue all`: every queue with rows.
    #[arg(long = "queue", id = "only_queue", value_name = "QUEUE")]
    only_queues: Vec<String>,

    /// The counts of these job kinds of the table (a table made with --kinds), one line each
    /// (`(none)`: rows published without a kind; `null` in JSON); repeat for several. `--kind all`: every kind
    /// with rows. WORKERS counts the running subscriptions and workers that take the kind
    /// (their heartbeats), and a kind with ready rows that none takes is named after the
    /// table (`no worker for kind K of table T (N ready)`; `workers` in JSON).
    #[arg(
        long = "kind",
        id = "only_kind",
        value_name = "KIND",
        conflicts_with = "only_queue"
    )]
    only_kinds: Vec<String>,
}

/// A table and a page of its rows by id.
#[derive(Debug, Args)]
struct PageArgs {
    #[command(flatten)]
    table: TableArgs,

    /// List rows with ids above this one (the id a previous page ended with).
    #[arg(long, value_name = "ID")]
    after: Option<i64>,

    /// The most rows to list.
    #[arg(long, value_name = "N", default_value_t = 50,
          value_parser = clap::value_parser!(u64).range(1..=100_000))]
    limit: u64,
}

/// `actions`: the newest entries of the action log.
#[derive(Debug, Args)]
struct ActionsArgs {
    /// The most entries to list.
    #[arg(long, value_name = "N", default_value_t = 50,
          value_parser = clap::value_parser!(u64).range(1..=10_000))]
    limit: u64,

    /// Print JSON (an array with one object per entry) instead of a text table.
    #[arg(long)]
    json: bool,
}

/// `workers`: the fleet.
#[derive(Debug, Args)]
struct WorkersArgs {
    /// Only those taking rows of this table; repeat for several.
    #[arg(long = "table", value_name = "NAME")]
    tables: Vec<String>,

    /// Print JSON (an array with one object per subscription or worker) instead of a text
    /// table.
    #[arg(long)]
    json: bool,
}

/// `periodic`: the recorded schedules.
#[derive(Debug, Args)]
struct PeriodicArgs {
    #[command(subcommand)]
    command: PeriodicCommand,
}

#[derive(Debug, clap::Subcommand)]
enum PeriodicCommand {
    /// Every schedule recorded on the database.
    List {
        /// Print JSON (an array with one object per schedule) instead of a text table.
        #[arg(long)]
        json: bool,
    },
    /// Pause a schedule (every table's of that name): no process publishes its ticks, and
    /// the ticks published ahead are cancelled.
    Pause {
        /// The schedule's name.
        name: String,
    },
    /// Resume a paused schedule.
    Resume {
        /// The schedule's name.
        name: String,
    },
}

/// `jobs`: a page of one state, filtered; or a bulk verb on every job matching.
#[derive(Debug, Args)]
struct JobsArgs {
    /// Act on every job matching the filter instead of listing a page: prints how many match
    /// first, and acts only with --yes, in batches by id (progress per batch), with no cap.
    /// cancel: as `cancel` does each (every state but completed); requeue: dead letters back
    /// to ready with attempts reset, scheduled jobs due now; delete: every state, jobs in
    /// work skipped and reported. --after goes on after a job id (where a run stopped).
    #[arg(value_enum, value_name = "VERB")]
    verb: Option<BulkVerbArg>,

    #[command(flatten)]
    page: PageArgs,

    /// The state listed (ready by default); with a VERB, the state acted on (by default,
    /// every state the verb acts on).
    #[arg(long, value_enum)]
    state: Option<StateArg>,

    /// Only jobs whose last error contains this text (byte for byte).
    #[arg(long = "error", value_name = "TEXT")]
    error: Option<String>,

    /// With a VERB: act (without it, only the count is printed).
    #[arg(long)]
    yes: bool,

    /// With a VERB, row lock tables: how long to wait for one job in work before skipping it.
    #[arg(long, value_name = "SECS", default_value_t = 2, value_parser = parse_secs)]
    row_wait: u64,

    /// Only jobs of this queue (a table made with --queues).
    #[arg(long = "queue", id = "jobs_queue", value_name = "QUEUE")]
    queue: Option<String>,

    /// Only jobs of this kind (a table made with --kinds).
    #[arg(long = "kind", id = "jobs_kind", value_name = "KIND")]
    kind: Option<String>,

    /// Only jobs whose column equals the value (COLUMN=VALUE; a text, int or float column).
    #[arg(long = "where", value_name = "COLUMN=VALUE", value_parser = parse_set)]
    equals: Option<(String, String)>,

    /// Print JSON (an array with one object per job) instead of a text table.
    #[arg(long)]
    json: bool,
}

/// A bulk verb of `jobs`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum BulkVerbArg {
    Cancel,
    Requeue,
    Delete,
}

/// A state of `jobs`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum StateArg {
    Ready,
    Scheduled,
    InFlight,
    Dead,
    Completed,
}

/// `dead list`: a page, as text or JSON.
#[derive(Debug, Args)]
struct DeadListArgs {
    #[command(flatten)]
    page: PageArgs,

    /// Print JSON (an array with one object per row) instead of a text table.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("which").required(true).multiple(true)
    .args(["ids", "id_flags", "all"])))]
struct DeadPick {
    #[command(flatten)]
    table: TableArgs,

    /// Dead-lettered rows' ids (or --id ID, repeated).
    #[arg(value_name = "ID")]
    ids: Vec<i64>,

    /// A dead-lettered row's id; repeat for several.
    #[arg(long = "id", id = "id_flags", value_name = "ID")]
    id_flags: Vec<i64>,

    /// Every dead-lettered row of the table (in batches of 1,000).
    #[arg(long, conflicts_with_all = ["ids", "id_flags"])]
    all: bool,
}

impl DeadPick {
    /// The ids given, either way, in the order given (positional ones first).
    fn ids(&self) -> impl Iterator<Item = i64> + '_ {
        self.ids.iter().chain(&self.id_flags).copied()
    }
}

#[derive(Debug, Args)]
struct PublishArgs {
    #[command(flatten)]
    table: TableArgs,

    /// A column's value for every message, COLUMN=VALUE, typed as the column is described.
    /// Repeat for several.
    #[arg(long = "set", value_name = "COLUMN=VALUE", value_parser = parse_set)]
    set: Vec<(String, String)>,

    /// Due this long from now instead of at once: seconds (90) or a duration (1m 30s).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    delay: Option<Duration>,

    /// A W3C trace context for every message (`00-<trace id>-<parent id>-<flags>`), so the
    /// handlers' spans continue that trace (a table made with --traceparent).
    #[arg(long = "trace", value_name = "TRACEPARENT")]
    trace: Option<String>,

    /// The named queue of every message (a table made with --queues).
    #[arg(long, value_name = "QUEUE")]
    queue: Option<String>,

    /// The job kind of every message (a table made with --kinds).
    #[arg(long, value_name = "KIND")]
    kind: Option<String>,
}

/// A duration as whole seconds (`30`, what these options took before) or as `humantime`
/// spells it (`30s`, `1m 30s`, `500ms`).
fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
        return s
            .parse()
            .map(Duration::from_secs)
            .map_err(|e| format!("{s:?}: {e}"));
    }
    humantime::parse_duration(s)
        .map_err(|e| format!("{s:?} is not a duration ({e}): give seconds (30) or 30s, 1m 30s, 2h"))
}

/// [`parse_duration`] in whole seconds, rounded up.
fn parse_secs(s: &str) -> Result<u64, String> {
    let d = parse_duration(s)?;
    Ok(d.as_secs() + u64::from(d.subsec_nanos() > 0))
}

fn parse_column(s: &str) -> Result<(String, ColumnType), String> {
    let (name, ty) = s.split_once(':').unwrap_or((s, "text"));
    let ty = match ty {
        "text" => ColumnType::Text,
        "int" => ColumnType::Int,
        "float" => ColumnType::Float,
        "bytes" => ColumnType::Bytes,
        "time" => ColumnType::Time,
        other => return Err(format!("unknown type {other:?}: text, int, float or bytes")),
    };
    if name.is_empty() {
        return Err("the column name is empty".into());
    }
    Ok((name.to_string(), ty))
}

fn parse_set(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((c, v)) if !c.is_empty() => Ok((c.to_string(), v.to_string())),
        _ => Err(format!("{s:?} is not COLUMN=VALUE")),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    #[cfg(not(feature = "dashboard"))]
    if let Command::Dashboard(_) = &cli.command {
        Cli::command()
            .error(clap::error::ErrorKind::InvalidSubcommand, NO_DASHBOARD)
            .exit();
    }
    if let Command::Bench(args) = &cli.command {
        if let Some(why) = args.usage_error() {
            Cli::command()
                .error(clap::error::ErrorKind::ArgumentConflict, why)
                .exit();
        }
    }
    #[cfg(feature = "dashboard")]
    let several = matches!(cli.command, Command::Dashboard(_));
    #[cfg(not(feature = "dashboard"))]
    let several = false;
    if cli.url.len() > 1 && !several {
        Cli::command()
            .error(
                clap::error::ErrorKind::TooManyValues,
                "only the dashboard takes several --url: give this command one",
            )
            .exit();
    }
    let url = cli.url.first().cloned();
    let Some(url) = url.or_else(|| commands::schema::offline(&cli.command)) else {
        Cli::command()
            .error(
                clap::error::ErrorKind::MissingRequiredArgument,
                "no database: give --url or set DATABASE_URL",
            )
            .exit();
    };
    match commands::run(&cli, &url) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // An error may quote the database's text (a value, a name): escaped like the rest.
            eprintln!("sqlbroker: {}", commands::escape(&chain(&*e)));
            ExitCode::from(1)
        }
    }
}

/// The error and the causes its message does not already tell (a driver's "error connecting
/// to server" says why only in its source), each once. A cause is left out when the text has
/// it, when it only wraps the cause before it (MySQL's `MySqlError { ERROR 1049 .. }` around
/// the `ERROR 1049 ..` already told), or when it is a label whose own source the text
/// already tells (PostgreSQL's "db error" around the server's message).
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut before = text.clone();
    let mut cause = e.source();
    while let Some(c) = cause {
        let more = c.to_string();
        let told = text.contains(&more)
            || (!before.is_empty() && more.contains(&before))
            || c.source().is_some_and(|s| text.contains(&s.to_string()));
        if !told {
            text = format!("{text}: {more}");
        }
        before = more;
        cause = c.source();
    }
    text
}
