//! `sqlbroker`: the operator's command line tool (cargo feature `cli`).
//!
//! ```text
//! sqlbroker create-table --table jobs --lease 30 --column kind
//! sqlbroker --url postgres://postgres@127.0.0.1/app status
//! sqlbroker status --table jobs --json
//! sqlbroker pause --table jobs
//! sqlbroker resume --table jobs
//! sqlbroker dead list --table jobs --limit 20
//! sqlbroker dead requeue --table jobs --id 17 --id 18
//! sqlbroker dead purge --table jobs --all
//! sqlbroker completed prune --table jobs
//! printf 'a\nb\n' | sqlbroker publish --table jobs --set kind=import
//! sqlbroker job --table jobs 17 --json
//! sqlbroker cancel --table jobs 17
//! sqlbroker schema --dialect postgres --table jobs --lease 30 --dedup > V1__jobs.sql
//! sqlbroker schema --table jobs --lease 30 --dedup --priorities --migrate > V2__jobs.sql
//! sqlbroker dashboard --listen 127.0.0.1:8640      # cargo feature `dashboard`
//! ```
//!
//! The URL comes from `--url` or `DATABASE_URL`. `create-table` (and `migrate`) describe a
//! table by flags that mirror [`sqlbroker::Table`]'s builder (`--lease`, `--advisory-lock`,
//! `--column`, `--fifo`, `--priorities`, `--dedup`, `--keep-completed`), and record the
//! description in the database; every other command takes the table's name only and reads
//! its description from there (`Broker::open_table`). Those flags are still accepted by the
//! other commands: the description they make is checked against the record, and refused if
//! it differs. `status` with no `--table` lists every recorded table.
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
    /// sqlite:path/to/file.db.
    #[arg(long, env = "DATABASE_URL", global = true, hide_env_values = true)]
    url: Option<String>,

    /// Seconds to wait for a database connection before giving up.
    #[arg(long, value_name = "SECS", default_value_t = 10, global = true)]
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
    /// One job by id: its state, attempts, failures and last error, times and values.
    Job(JobArgs),
    /// Cancel a job: one not in work is removed (kept completed and cancelled on a table that
    /// keeps completed rows); one in work finishes its attempt and is not retried. Exit 1 if
    /// no live or dead job has that id.
    Cancel(CancelArgs),
    /// Pause a table: its subscriptions, in every process, stop claiming within a poll
    /// interval (deliveries in hand finish), until `resume`.
    Pause(NameArgs),
    /// Resume a paused table: its subscriptions claim again.
    Resume(NameArgs),
    /// Print the SQL of a table for a migration tool, running nothing: what create-table
    /// runs (with --dialect, no database needed), or with --migrate what migrate would run
    /// on the table as it is now.
    Schema(commands::schema::SchemaArgs),
    /// Serve a web dashboard of the tables (counts, jobs, dead letters, actions) and a
    /// Prometheus `/metrics` page (cargo feature `dashboard`).
    #[cfg(feature = "dashboard")]
    Dashboard(commands::dashboard::DashboardArgs),
}

/// A job of a table, by id.
#[derive(Debug, Args)]
struct JobArgs {
    #[command(flatten)]
    table: TableArgs,

    /// The job's id.
    id: i64,

    /// Print JSON (one object) instead of text.
    #[arg(long)]
    json: bool,
}

/// A job to cancel.
#[derive(Debug, Args)]
struct CancelArgs {
    #[command(flatten)]
    table: TableArgs,

    /// The job's id.
    id: i64,
}

/// A recorded table, by name.
#[derive(Debug, Args)]
struct NameArgs {
    /// The table's name.
    #[arg(long, short, value_name = "NAME")]
    table: String,
}

#[derive(Debug, Subcommand)]
enum DeadCommand {
    /// List dead-lettered rows by id, one page at a time.
    List(PageArgs),
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
    /// Lease form: the lease in whole seconds (the table has a locked_until column).
    #[arg(long, value_name = "SECS", conflicts_with = "advisory_lock")]
    lease: Option<u64>,

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

    /// The table keeps acked rows for this many seconds (a completed_at column).
    #[arg(long, value_name = "SECS")]
    keep_completed: Option<u64>,
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
        if let Some(secs) = self.lease {
            t = t.lease(Duration::from_secs(secs));
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
        if let Some(secs) = self.keep_completed {
            t = t.keep_completed(Duration::from_secs(secs));
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

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("which").required(true).args(["ids", "all"])))]
struct DeadPick {
    #[command(flatten)]
    table: TableArgs,

    /// A dead-lettered row's id; repeat for several.
    #[arg(long = "id", value_name = "ID")]
    ids: Vec<i64>,

    /// Every dead-lettered row of the table (in batches of 1,000).
    #[arg(long)]
    all: bool,
}

#[derive(Debug, Args)]
struct PublishArgs {
    #[command(flatten)]
    table: TableArgs,

    /// A column's value for every message, COLUMN=VALUE, typed as the column is described.
    /// Repeat for several.
    #[arg(long = "set", value_name = "COLUMN=VALUE", value_parser = parse_set)]
    set: Vec<(String, String)>,

    /// Due this many seconds from now instead of at once.
    #[arg(long, value_name = "SECS")]
    delay: Option<u64>,
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
    let url = cli.url.clone();
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
            eprintln!("sqlbroker: {}", chain(&*e));
            ExitCode::from(1)
        }
    }
}

/// The error and the causes its message does not already tell (a driver's "error connecting
/// to server" says why only in its source).
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let more = c.to_string();
        if !text.contains(&more) {
            text = format!("{text}: {more}");
        }
        cause = c.source();
    }
    text
}
