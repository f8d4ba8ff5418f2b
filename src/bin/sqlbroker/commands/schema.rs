//! `schema`: the SQL of a table for a migration tool, from the library's own DDL builders
//! (`Table::ddl`, `Broker::create_table_sql`, `Broker::migration_sql`), each statement ended
//! by `;`, ready for `psql`, `mysql` or `sqlite3`. Runs nothing.

use std::fmt::Write as _;
use std::time::Duration;

use clap::Args;
use sqlbroker::{Broker, Database};

use super::{say, Result};
use crate::{Cli, Command, TableArgs};

/// The table, and which SQL to print.
#[derive(Debug, Args)]
pub(crate) struct SchemaArgs {
    #[command(flatten)]
    table: TableArgs,

    /// Write this database's SQL: postgres, mysql (MySQL 8.0.17+), mariadb or sqlite. With a
    /// URL (--url or DATABASE_URL) the table is read from there as below; with none, nothing
    /// is connected to and the table is the one the flags describe (with no flags a bare row
    /// lock table, which the output says). Without --dialect, the database of the URL.
    /// Either way, with a URL: the table as the flags describe it or, with none, as recorded.
    #[arg(long, value_name = "DATABASE", value_parser = parse_database)]
    dialect: Option<Database>,

    /// Print what `migrate` would run on the table as it is now (needs --url): the missing
    /// columns and indexes and the new record; the whole table if there is none; nothing if
    /// it is up to date.
    #[arg(long, conflicts_with = "dialect")]
    migrate: bool,
}

/// Which database's SQL `library-schema` prints.
#[derive(Debug, Args)]
pub(crate) struct LibrarySchemaArgs {
    /// Write this database's SQL: postgres, mysql (MySQL 8.0.17+), mariadb or sqlite; without
    /// it, the database of the URL (--url or DATABASE_URL), connected to but not written.
    #[arg(long, value_name = "DATABASE", value_parser = parse_database)]
    dialect: Option<Database>,
}

fn parse_database(s: &str) -> Result<Database, String> {
    s.parse().map_err(|e: sqlbroker::BrokerError| e.to_string())
}

/// An empty URL for `schema --dialect`, which needs no database; `None` otherwise.
pub(crate) fn offline(command: &Command) -> Option<String> {
    match command {
        Command::Schema(args) if args.dialect.is_some() => Some(String::new()),
        Command::LibrarySchema(args) if args.dialect.is_some() => Some(String::new()),
        _ => None,
    }
}

pub(crate) fn run(cli: &Cli, url: &str, args: &SchemaArgs) -> Result {
    let name = &args.table.table;
    let flags = !args.table.desc.is_empty();
    if url.is_empty() {
        // `--dialect` and no URL: nothing to read a record from.
        let database = args
            .dialect
            .ok_or("no database: give --url or set DATABASE_URL")?;
        let sql = args.table.table().ddl(database)?;
        let source = if flags {
            "No database was given (--url or DATABASE_URL): the table as the flags describe it, \
             not as recorded."
        } else {
            eprintln!(
                "sqlbroker: no database was given (--url or DATABASE_URL) and no flags describe \
                 table {name}: printing a bare description (row lock, no columns of its own), \
                 not the recorded table"
            );
            "No database was given (--url or DATABASE_URL) and no flags: a bare description \
             (row lock, no columns of its own), not the recorded table."
        };
        let script = script(name, "create-table", &database.to_string(), source, &sql);
        return say(format_args!("{script}"));
    }
    let broker = Broker::builder(url)
        .pool_size(2)
        .connection_timeout(Duration::from_secs(cli.connect_timeout.max(1)))
        .manage_schema(false)
        // A command's process is short-lived: the database's maintainer is a long-running one.
        .maintenance(false)
        .build()?;
    // The record, unless flags describe the table (then `open` uses them). Flags that
    // disagree with a record would print a table `create-table` refuses to make there.
    let table = args.table.open(&broker)?;
    if flags && !args.migrate {
        if let Ok(recorded) = broker.open_table(name) {
            if recorded != table {
                return Err(format!(
                    "table {name} is recorded with another description than the flags make: \
                     give no flags to print the recorded table's SQL, or --migrate for what \
                     migrate would run to bring it to the flags' description"
                )
                .into());
            }
        }
    }
    let source = if flags {
        "The table as the flags describe it."
    } else {
        "The table as recorded in the database."
    };
    let (what, database, sql) = match args.dialect {
        _ if args.migrate => (
            "migrate",
            broker.database().to_string(),
            broker.migration_sql(&table)?,
        ),
        // Another database than the URL's: the same table in that database's SQL.
        Some(database) if database.to_string() != broker.database() => {
            ("create-table", database.to_string(), table.ddl(database)?)
        }
        _ => (
            "create-table",
            broker.database().to_string(),
            broker.create_table_sql(&table)?,
        ),
    };
    say(format_args!(
        "{}",
        script(name, what, &database, source, &sql)
    ))
}

/// `library-schema`: the library's own tables on the database of `--dialect` or, without it,
/// of the URL (connected to only to tell MySQL from MariaDB; nothing is run).
pub(crate) fn library(cli: &Cli, url: &str, args: &LibrarySchemaArgs) -> Result {
    let database = match args.dialect {
        Some(d) => d,
        None => Broker::builder(url)
            .pool_size(1)
            .connection_timeout(Duration::from_secs(cli.connect_timeout.max(1)))
            .manage_schema(false)
            .maintenance(false)
            .build()?
            .database()
            .parse()?,
    };
    let mut out = format!(
        "-- sqlbroker {}: the tables the library writes for itself on {database} (registry, \
         action log, fleet, periodic schedules, maintainer).\n-- Apply once per database for \
         brokers built with manage_schema(false); each statement is idempotent.\n",
        env!("CARGO_PKG_VERSION")
    );
    for sql in database.library_ddl()? {
        let _ = writeln!(out, "{sql};");
    }
    say(format_args!("{out}"))
}

/// The statements as a script: a header comment (what, where, which description), each
/// statement ended by `;`, the registry's statements under a comment of their own.
fn script(table: &str, what: &str, database: &str, source: &str, statements: &[String]) -> String {
    let mut out = format!(
        "-- sqlbroker {}: what `{what}` runs for table {table} on {database}.\n-- {source}\n",
        env!("CARGO_PKG_VERSION")
    );
    if statements.is_empty() {
        let _ = writeln!(out, "-- The table is up to date: nothing to run.");
        return out;
    }
    for sql in statements {
        if sql.contains("sqlbroker_tables") && !out.contains("-- The registry") {
            let _ = writeln!(
                out,
                "-- The registry: the table's description, which brokers check and \
                 `open_table` reads."
            );
        }
        let _ = writeln!(out, "{sql};");
    }
    out
}
