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

    /// Write this database's SQL without connecting: postgres, mysql (MySQL 8.0.17+),
    /// mariadb or sqlite; the table is the one the flags describe. Without it, the database
    /// of --url, and the table as the flags describe it or, with none, as recorded there.
    #[arg(long, value_name = "DATABASE", value_parser = parse_database)]
    dialect: Option<Database>,

    /// Print what `migrate` would run on the table as it is now (needs --url): the missing
    /// columns and indexes and the new record; the whole table if there is none; nothing if
    /// it is up to date.
    #[arg(long, conflicts_with = "dialect")]
    migrate: bool,
}

fn parse_database(s: &str) -> Result<Database, String> {
    s.parse().map_err(|e: sqlbroker::BrokerError| e.to_string())
}

/// An empty URL for `schema --dialect`, which needs no database; `None` otherwise.
pub(crate) fn offline(command: &Command) -> Option<String> {
    match command {
        Command::Schema(args) if args.dialect.is_some() => Some(String::new()),
        _ => None,
    }
}

pub(crate) fn run(cli: &Cli, url: &str, args: &SchemaArgs) -> Result {
    let name = &args.table.table;
    let (what, database, statements) = match args.dialect {
        Some(database) => {
            let sql = args.table.table().ddl(database)?;
            ("create-table", database.to_string(), sql)
        }
        None => {
            let broker = Broker::builder(url)
                .pool_size(2)
                .connection_timeout(Duration::from_secs(cli.connect_timeout.max(1)))
                .manage_schema(false)
                .build()?;
            let table = args.table.open(&broker)?;
            let sql = if args.migrate {
                broker.migration_sql(&table)?
            } else {
                broker.create_table_sql(&table)?
            };
            let what = if args.migrate {
                "migrate"
            } else {
                "create-table"
            };
            (what, broker.database().to_string(), sql)
        }
    };
    say(format_args!(
        "{}",
        script(name, what, &database, &statements)
    ))
}

/// The statements as a script: a header comment, each statement ended by `;`, the registry's
/// statements under a comment of their own.
fn script(table: &str, what: &str, database: &str, statements: &[String]) -> String {
    let mut out = format!(
        "-- sqlbroker {}: what `{what}` runs for table {table} on {database}.\n",
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
