//! Making and migrating tables ([`Broker::create_table`], [`Broker::migrate`]), and the schema
//! as SQL text, for migration tools and for database users without DDL rights:
//! [`Table::ddl`] (no database needed), [`Broker::create_table_sql`] and
//! [`Broker::migration_sql`] return the statements [`Broker::create_table`] and
//! [`Broker::migrate`] run, built by the same code, with the registry record's values written
//! inline. A broker built with [`BrokerBuilder::manage_schema(false)`] then uses the table
//! without running any DDL of its own.
//!
//! [`BrokerBuilder::manage_schema(false)`]: crate::BrokerBuilder::manage_schema

use std::fmt;
use std::str::FromStr;

use crate::broker::Broker;
use crate::dialect::shared::Syntax;
use crate::dialect::{DbConn, Dialect};
use crate::error::{BrokerError, DbError, Result};
use crate::model::table::Table;
use crate::model::value::Value;
use crate::runtime::Queue;

/// A database (and flavour) whose SQL [`Table::ddl`] writes, without connecting.
///
/// Parsed from `postgres` (or `postgresql`), `mysql`, `mariadb` and `sqlite`. MySQL and
/// MariaDB differ in the byte-exact collation of text columns (`utf8mb4_0900_bin`, MySQL
/// 8.0.17+, against `utf8mb4_nopad_bin`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Database {
    /// PostgreSQL.
    Postgres,
    /// MySQL 8.0.17 or newer.
    Mysql,
    /// MariaDB 10.6 or newer.
    Mariadb,
    /// SQLite.
    Sqlite,
}

impl Database {
    /// The engine that writes this database's SQL, if its cargo feature is built.
    fn engine(self) -> Result<&'static dyn Dialect> {
        match self {
            #[cfg(feature = "postgres")]
            Database::Postgres => Ok(crate::dialect::postgres::sql_only()),
            #[cfg(feature = "mysql")]
            Database::Mysql => Ok(crate::dialect::mysql::offline(false)),
            #[cfg(feature = "mysql")]
            Database::Mariadb => Ok(crate::dialect::mysql::offline(true)),
            #[cfg(feature = "sqlite")]
            Database::Sqlite => Ok(crate::dialect::sqlite::sql_only()),
            #[allow(unreachable_patterns)]
            other => Err(BrokerError::InvalidOption {
                option: "database",
                reason: format!("support for {other} is not compiled in (cargo feature)"),
            }),
        }
    }
}

impl fmt::Display for Database {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Database::Postgres => "PostgreSQL",
            Database::Mysql => "MySQL",
            Database::Mariadb => "MariaDB",
            Database::Sqlite => "SQLite",
        })
    }
}

impl FromStr for Database {
    type Err = BrokerError;

    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "postgres" | "postgresql" => Ok(Database::Postgres),
            "mysql" => Ok(Database::Mysql),
            "mariadb" => Ok(Database::Mariadb),
            "sqlite" => Ok(Database::Sqlite),
            _ => Err(BrokerError::InvalidOption {
                option: "database",
                reason: format!("unknown database {s:?}: postgres, mysql, mariadb or sqlite"),
            }),
        }
    }
}

impl Database {
    /// The statements that make the tables the library writes for itself on this database,
    /// beside the queue tables ([`Table::ddl`] makes those, with the dependencies' and the
    /// registry's tables they need): the registry `sqlbroker_tables`, the operators' action
    /// log `sqlbroker_actions`, the fleet's heartbeats `sqlbroker_workers`, the periodic
    /// schedules' records `sqlbroker_periodics` and the maintainer's election
    /// `sqlbroker_maintainer` (with its one row). A broker built with
    /// [`manage_schema(false)`](crate::BrokerBuilder::manage_schema) makes none of them: without
    /// them it records no action, no heartbeat, no schedule, elects no maintainer (so
    /// nothing is pruned by itself), and refuses collected and unique-period publishes. Each statement is idempotent; `sqlbroker library-schema`
    /// prints them as a script.
    ///
    /// # Errors
    ///
    /// [`BrokerError::InvalidOption`] for a database whose cargo feature is not built.
    ///
    /// ```
    /// use sqlbroker::Database;
    ///
    /// let sql = Database::Sqlite.library_ddl()?;
    /// assert!(sql.iter().any(|s| s.contains("sqlbroker_maintainer")));
    /// # Ok::<(), sqlbroker::BrokerError>(())
    /// ```
    pub fn library_ddl(self) -> Result<Vec<String>> {
        let dialect = self.engine()?;
        let mut out = vec![
            dialect.registry().create.to_string(),
            dialect.action_log().create.to_string(),
        ];
        out.extend(dialect.fleet().map(|f| f.create.to_string()));
        out.extend(dialect.periodics().map(|p| p.create.to_string()));
        if let Some(m) = dialect.maintainer() {
            out.extend([m.create.to_string(), m.seed.to_string()]);
        }
        // The tables of collected bursts' keys and of unique periods' holders: the same for
        // every queue table (any description gives them).
        let any = Table::new("sqlbroker").validate()?;
        out.extend(crate::dialect::collect::statements(dialect, &any).create);
        out.push(dialect.syntax().unique_sql(&any, dialect.database()).create);
        Ok(out)
    }
}

impl Table {
    /// The statements [`Broker::create_table`] runs for this table on `database`: the table
    /// and its indexes, then the registry table `sqlbroker_tables` and this description's
    /// record (values inline), in order and without terminating `;`. Every statement is
    /// idempotent (`IF NOT EXISTS`, an upsert of the record), so a migration tool may keep
    /// them as they are; applied, they make a table that a broker built with
    /// [`manage_schema(false)`](crate::BrokerBuilder::manage_schema) uses as it is.
    ///
    /// # Errors
    ///
    /// [`BrokerError::InvalidTable`] for an invalid description;
    /// [`BrokerError::InvalidOption`] for a database whose cargo feature is not built.
    ///
    /// ```
    /// use sqlbroker::{Database, Table};
    /// use std::time::Duration;
    ///
    /// let jobs = Table::new("jobs").dedup().lease(Duration::from_secs(30));
    /// let sql = jobs.ddl(Database::Sqlite)?;
    /// assert!(sql[0].starts_with("CREATE TABLE IF NOT EXISTS \"jobs\""));
    /// assert!(sql.iter().any(|s| s.starts_with("CREATE UNIQUE INDEX IF NOT EXISTS \"jobs_dedup\"")));
    /// assert!(sql.last().unwrap().starts_with("INSERT INTO sqlbroker_tables"));
    /// # Ok::<(), sqlbroker::BrokerError>(())
    /// ```
    pub fn ddl(&self, database: Database) -> Result<Vec<String>> {
        create_sql(database.engine()?, self)
    }
}

/// `create_table`'s statements on `dialect`, then the registry and the record.
fn create_sql(dialect: &dyn Dialect, table: &Table) -> Result<Vec<String>> {
    let spec = table.validate()?;
    let mut out = dialect.create_table(&spec);
    out.extend(record_sql(dialect, table));
    Ok(out)
}

/// The registry table if it is missing, and `table`'s record (replacing one it had; the pause
/// flag is kept): the statements [`crate::runtime::registry::record`] runs, its parameters written
/// inline.
fn record_sql(dialect: &dyn Dialect, table: &Table) -> [String; 2] {
    let registry = dialect.registry();
    let syntax = dialect.syntax();
    let values = [
        (syntax.literal)(table.name()),
        table.record_format().to_string(),
        (syntax.literal)(&table.to_record()),
        syntax.now.to_string(),
    ];
    [
        registry.create.to_string(),
        inline(syntax, registry.upsert, &values),
    ]
}

/// `sql` with its placeholders, each used once and in order, replaced by `values`. Only the
/// statement's own text is searched: a value holding a placeholder's spelling stays as it is.
fn inline(syntax: &Syntax, sql: &str, values: &[String]) -> String {
    let mut out = String::with_capacity(sql.len() + values.iter().map(String::len).sum::<usize>());
    let mut rest = sql;
    for (i, value) in values.iter().enumerate() {
        let p = syntax.p(i + 1);
        let Some(at) = rest.find(&p) else { break };
        out.push_str(&rest[..at]);
        out.push_str(value);
        rest = &rest[at + p.len()..];
    }
    out.push_str(rest);
    out
}

/// What a migration of an existing table runs (`statements`, in order) and what it tells
/// (`done`, one line each).
pub(crate) struct Migration {
    pub statements: Vec<String>,
    pub done: Vec<String>,
}

/// The migration of `q`'s table, whose columns are `found` (not empty): the missing columns,
/// the MySQL text columns to convert to byte-exact collations, then the missing indexes.
/// [`BrokerError::Schema`] for what a migration cannot fix (a column existing rows cannot be
/// given, a column of a type the statements cannot use); nothing runs then.
pub(crate) fn plan(
    q: &Queue,
    conn: &mut dyn DbConn,
    found: &[(String, String)],
) -> Result<Migration> {
    let defs = q.dialect.column_defs(&q.spec);
    let missing: Vec<_> = defs
        .iter()
        .filter(|d| !found.iter().any(|(name, _)| name == &d.name))
        .collect();
    let convert = crate::model::schema::to_convert(&defs, found);
    let mut problems: Vec<String> = crate::model::schema::problems(&defs, found)
        .into_iter()
        .filter(|p| !p.ends_with("is missing") && !p.ends_with(crate::model::schema::CONVERTIBLE))
        .collect();
    problems.extend(missing.iter().filter(|d| !d.addable).map(|d| {
        format!(
            "column {} is missing and existing rows cannot be given a value for it",
            d.name
        )
    }));
    if !problems.is_empty() {
        return Err(BrokerError::Schema {
            table: q.spec.name.clone(),
            problems,
        });
    }
    let adds_priority = missing
        .iter()
        .any(|d| q.spec.priority.as_deref() == Some(d.name.as_str()));
    let mut m = Migration {
        statements: Vec::new(),
        done: Vec::new(),
    };
    for d in missing {
        m.statements
            .extend(q.dialect.syntax().add_column(&q.spec, d));
        m.done.push(format!("added column {}", d.name));
    }
    if !convert.is_empty() {
        if let Some(sql) = q.dialect.convert_columns(&q.spec, &convert) {
            m.statements.push(sql);
            m.done.extend(
                convert
                    .iter()
                    .map(|d| format!("converted column {} to byte-exact text", d.name)),
            );
        }
    }
    let have = q
        .dialect
        .index_names(conn, &q.spec.name)
        .map_err(q.err("migrate"))?;
    let ready = format!("{}_ready", q.spec.name);
    // Priorities added: a ready index the table has (found by name, so not made again) is in
    // the old claim order. (Names compare without case: MySQL's do, and the others' are ours.)
    if adds_priority && have.iter().any(|h| h.eq_ignore_ascii_case(&ready)) {
        m.statements.extend(q.dialect.rebuild_ready_index(&q.spec));
        m.done
            .push(format!("rebuilt index {ready} in priority order"));
    }
    m.statements
        .extend(q.dialect.missing_indexes(&q.spec, &have));
    if let Some(rates) = &q.sql.rates {
        // Rate limits added: their slots' table.
        let name = crate::dialect::flow::rates_table(&q.spec);
        let found = conn
            .query(q.dialect.columns_query(), &[Value::Text(name.clone())])
            .map_err(q.err("migrate"))?;
        if found.is_empty() {
            // (Already among the table's statements when an index was missing too.)
            for stmt in [&rates.create].into_iter().chain(&rates.index) {
                if !m.statements.contains(stmt) {
                    m.statements.push(stmt.clone());
                }
            }
            m.done.push(format!("created table {name}"));
        } else if let Some(add) = rates.add_index.as_ref().or(rates.index.as_ref()) {
            // The slots' index of free slots, on a slots' table made before it.
            let index = format!("{name}_at");
            let have = q
                .dialect
                .index_names(conn, &name)
                .map_err(q.err("migrate"))?;
            if !have.iter().any(|h| h.eq_ignore_ascii_case(&index)) {
                m.statements.push(add.clone());
                m.done.push(format!("added index {index}"));
            }
        }
    }
    if let Some(pq) = &q.sql.paused_queues {
        // Queues added: the database's paused queues' table (one for every table).
        let name = crate::dialect::queues::PAUSED_QUEUES;
        let found = conn
            .query(q.dialect.columns_query(), &[Value::Text(name.to_string())])
            .map_err(q.err("migrate"))?;
        if found.is_empty() {
            m.statements.push(pq.create.clone());
            m.done.push(format!("created table {name}"));
        }
    }
    if let Some(deps) = &q.sql.deps {
        // Dependencies added: the database's waits' table (one for every table).
        let name = crate::dialect::deps::DEPS_TABLE;
        let found = conn
            .query(q.dialect.columns_query(), &[Value::Text(name.to_string())])
            .map_err(q.err("migrate"))?;
        if found.is_empty() {
            for stmt in &deps.create {
                if !m.statements.contains(stmt) {
                    m.statements.push(stmt.clone());
                }
            }
            m.done.push(format!("created table {name}"));
        } else if !has_column(&found, "output") {
            m.statements.push(deps.add_output.clone());
            m.done.push(format!("added column output to table {name}"));
        }
    }
    Ok(m)
}

/// Runs `create` (the shared waits' table and its index, `IF NOT EXISTS`) statement by
/// statement; a statement that fails while the table exists (made by another creator at the
/// same moment: PostgreSQL's duplicate `pg_type` row) is let pass. A waits' table without the
/// outputs' column (made by an earlier build) gets it.
/// Makes the paused queues' table ([`crate::dialect::queues`]) if it is not there; another
/// creator making it at the same moment is as good.
fn make_paused_queues(
    columns_query: &str,
    pq: &crate::dialect::queues::PausedQueuesSql,
    conn: &mut dyn DbConn,
) -> Result<(), DbError> {
    let name = [Value::Text(
        crate::dialect::queues::PAUSED_QUEUES.to_string(),
    )];
    match conn.batch(&pq.create) {
        Err(e)
            if !conn
                .query(columns_query, &name)
                .is_ok_and(|r| !r.is_empty()) =>
        {
            Err(e)
        }
        _ => Ok(()),
    }
}

fn make_shared(
    columns_query: &str,
    deps: &crate::dialect::deps::DepsSql,
    conn: &mut dyn DbConn,
) -> Result<(), DbError> {
    let name = [Value::Text(crate::dialect::deps::DEPS_TABLE.to_string())];
    for stmt in &deps.create {
        if let Err(e) = conn.batch(stmt) {
            if !conn
                .query(columns_query, &name)
                .is_ok_and(|rows| !rows.is_empty())
            {
                return Err(e);
            }
        }
    }
    let has_output = |conn: &mut dyn DbConn| -> Result<bool, DbError> {
        Ok(has_column(&conn.query(columns_query, &name)?, "output"))
    };
    if !has_output(conn)? {
        // Another creator may add it at the same moment: then it is there all the same.
        if let Err(e) = conn.batch(&deps.add_output) {
            if !has_output(conn)? {
                return Err(e);
            }
        }
    }
    Ok(())
}

/// True if `columns` (rows of the dialect's columns query: name first) name `column`.
fn has_column(columns: &[Vec<Value>], column: &str) -> bool {
    columns.iter().any(|r| match r.first() {
        Some(Value::Text(n)) => n.eq_ignore_ascii_case(column),
        Some(Value::Bytes(n)) => n.eq_ignore_ascii_case(column.as_bytes()),
        _ => false,
    })
}

impl Broker {
    /// Creates the table with every column described, and the index the claims use, if it
    /// does not exist (`CREATE TABLE IF NOT EXISTS`). An existing table is left as it is.
    /// All or nothing where the database's DDL is transactional (PostgreSQL, SQLite); MySQL
    /// makes the table and its index in one statement.
    ///
    /// A table of that name that already exists is left as it is, and checked: if it lacks a
    /// described column, or has one of a type the statements cannot use,
    /// [`BrokerError::Schema`] names each problem ([`Broker::migrate`] adds missing columns).
    ///
    /// The description is recorded in the database (the registry table `sqlbroker_tables`,
    /// made on first use), where [`Broker::open_table`] reads it back in any process. A new
    /// table replaces the record of a table of that name dropped earlier; an existing table
    /// whose record disagrees with `table` is refused with [`BrokerError::Schema`] naming
    /// each difference ([`Broker::migrate`] records a changed description), and an existing
    /// table with no record is given `table` as its record. An existing table is given the
    /// indexes `table` names that it lacks (MySQL writes them inside its `CREATE TABLE`, which
    /// does nothing on a table that is there). A table keeps one description:
    /// of several services that create one new table at the same moment with different
    /// descriptions, one records its own and the others get [`BrokerError::Schema`].
    ///
    /// # Errors
    ///
    /// [`BrokerError::DdlRefused`] on a broker built with
    /// [`manage_schema(false)`](crate::BrokerBuilder::manage_schema), before anything is sent
    /// ([`Table::ddl`] gives the statements to apply instead);
    /// [`BrokerError::Unsupported`] for a form the database does not have, before anything is
    /// sent: SQLite has no row locks (the default form), so a SQLite table is described with
    /// [`Table::lease`] or [`Table::advisory_lock`].
    pub fn create_table(&self, table: &Table) -> Result<()> {
        self.may_run_ddl("create_table", table)?;
        let q = self.compiled(table)?;
        if q.spec.dependencies {
            self.sweep();
        }
        // A form the database cannot run (row lock on SQLite) is refused before anything is
        // made or recorded, rather than at the first subscription's start.
        q.dialect.check_form(q.spec.form)?;
        // The record before the table: one found while the table is missing is a dropped
        // table's (see `registry::record_created`).
        let before = crate::runtime::registry::before_create(&q)?;
        let existed = {
            // A table that exists is checked before any DDL: an index over a column it lacks
            // would fail half-way (and, on SQLite, a rolled-back index build was seen to leave
            // the next one incomplete).
            let mut conn = q.conn("schema check")?;
            let existed = !q.columns(&mut *conn)?.is_empty();
            if existed {
                q.check_schema(&mut *conn)?;
            }
            existed
        };
        if existed {
            // Checked against its record, or given this description as its first.
            crate::runtime::registry::verify(&q, table, true)?;
        }
        let mut statements = q.dialect.create_table(&q.spec);
        if let Some(pq) = &q.sql.paused_queues {
            // The paused queues' table is the database's, as the waits' table is: made on its
            // own, a creator racing this one making it is as good.
            q.retrying("create table", |conn| {
                make_paused_queues(q.dialect.columns_query(), pq, conn)
            })?;
        }
        if let Some(deps) = &q.sql.deps {
            // The waits' table is the database's, shared by every table with dependencies:
            // made on its own, before this table's DDL, so two services creating two such
            // tables at once do not fail each other's (only one can make it).
            statements.retain(|stmt| !deps.create.contains(stmt));
            q.retrying("create table", |conn| {
                make_shared(q.dialect.columns_query(), deps, conn)
            })?;
        }
        q.retrying("create table", |conn| {
            // Another broker making the same table at the same moment can make this one's DDL
            // fail (PostgreSQL: a duplicate `pg_type` row); the table is then there, and the
            // record decides whose description it is.
            let made_elsewhere = |conn: &mut dyn DbConn| {
                let name = [Value::Text(q.spec.name.clone())];
                conn.query(q.dialect.columns_query(), &name)
                    .is_ok_and(|rows| !rows.is_empty())
            };
            if let [one] = &statements[..] {
                return match conn.batch(one) {
                    Err(_) if made_elsewhere(conn) => Ok(()),
                    done => done,
                };
            }
            conn.batch(&q.sql.begin_write)?;
            let done = statements
                .iter()
                .try_for_each(|stmt| conn.batch(stmt))
                .and_then(|()| conn.batch("COMMIT"));
            if done.is_err() {
                conn.rollback_or_discard();
                if made_elsewhere(conn) {
                    return Ok(());
                }
            }
            done
        })?;
        if existed {
            // An existing table gets the indexes the description names that it lacks: MySQL
            // writes them inside its `CREATE TABLE`, which does nothing on a table that is
            // there, and a claim may name one by force (a fair key's read names `<table>_fair`:
            // without it every claim failed).
            // Another broker adding the same index at the same moment fails this one's
            // statement; the index is then there.
            q.retrying("create table", |conn| {
                let missing = |conn: &mut dyn DbConn| {
                    let have = q.dialect.index_names(conn, &q.spec.name)?;
                    Ok::<_, DbError>(q.dialect.missing_indexes(&q.spec, &have))
                };
                match missing(conn)?.iter().try_for_each(|stmt| conn.batch(stmt)) {
                    Err(_) if missing(conn)?.is_empty() => Ok(()),
                    done => done,
                }
            })?;
        }
        {
            let mut conn = q.conn("schema check")?;
            q.check_schema(&mut *conn)?;
        }
        if existed {
            return Ok(());
        }
        crate::runtime::registry::record_created(&q, table, before)
    }

    /// Drops the table (`DROP TABLE IF EXISTS`) with every job in it, its rate limits' slots
    /// table if it has rate limits, its record in the registry `sqlbroker_tables`, and the
    /// rows of `sqlbroker_deps` that name it (jobs of other tables waiting on its jobs, or
    /// its jobs' waits). A table that does not exist is not an error; the call is idempotent.
    ///
    /// Its jobs count as cancelled for the jobs of other tables waiting on them
    /// ([`Message::after_in`](crate::Message::after_in)): those are dead-lettered (`after`,
    /// reason `job 7 of table charges it waits on was cancelled`) or released
    /// (`after_settled`, reading [`JobOutcome::Cancelled`](crate::JobOutcome::Cancelled)),
    /// in one transaction after the drop; none is left waiting on a job that is gone. A table
    /// dropped by other means is found by the brokers' sweepers and settled alike.
    ///
    /// Meant for scratch tables (`sqlbroker bench` makes one and drops it) and tests: stop
    /// the table's subscriptions first, in every process (a running one fails its next
    /// claim). On MySQL each statement commits on its own.
    ///
    /// # Errors
    ///
    /// [`BrokerError::DdlRefused`] on a broker built with
    /// [`manage_schema(false)`](crate::BrokerBuilder::manage_schema), before anything is sent;
    /// [`BrokerError::InvalidTable`] for an invalid description.
    pub fn drop_table(&self, table: &Table) -> Result<()> {
        self.may_run_ddl("drop_table", table)?;
        self.remove_table(table, true)
    }

    /// What [`drop_table`](Broker::drop_table) does; with `drop_main` false, all but dropping
    /// the table itself ([`forget_table`](Broker::forget_table): the table is gone already).
    pub(crate) fn remove_table(&self, table: &Table, drop_main: bool) -> Result<()> {
        let q = self.compiled(table)?;
        let syntax = q.dialect.syntax();
        let mut statements = Vec::new();
        if drop_main {
            statements.push(format!("DROP TABLE IF EXISTS {}", syntax.q(&q.spec.name)));
        }
        if q.sql.rates.is_some() {
            let rates = crate::dialect::flow::rates_table(&q.spec);
            statements.push(format!("DROP TABLE IF EXISTS {}", syntax.q(&rates)));
        }
        let name = Value::Text(q.spec.name.clone());
        let exists = |conn: &mut dyn DbConn, t: &str| -> Result<bool, DbError> {
            let rows = conn.query(q.dialect.columns_query(), &[Value::Text(t.to_string())])?;
            Ok(!rows.is_empty())
        };
        q.retrying("drop table", |conn| {
            for stmt in &statements {
                conn.batch(stmt)?;
            }
            if let Some(pq) = &q.sql.paused_queues {
                // Its queues' pauses go with it (a table made again starts unpaused).
                if exists(conn, crate::dialect::queues::PAUSED_QUEUES)? {
                    conn.execute(&pq.forget, std::slice::from_ref(&name))?;
                }
            }
            if exists(conn, "sqlbroker_tables")? {
                conn.execute(
                    &format!("DELETE FROM sqlbroker_tables WHERE name = {}", syntax.p(1)),
                    std::slice::from_ref(&name),
                )?;
            }
            // What the library keeps of the table in its own tables by its name and its jobs'
            // ids: a table made again under the name (its ids counted from 1 again) would
            // read it as its own (a key's collecting job, a key's unique period).
            for (library, column) in [
                (crate::dialect::collect::COLLECT_TABLE, "tbl"),
                ("sqlbroker_unique", "table_name"),
            ] {
                if exists(conn, library)? {
                    conn.execute(
                        &format!("DELETE FROM {library} WHERE {column} = {}", syntax.p(1)),
                        std::slice::from_ref(&name),
                    )?;
                }
            }
            Ok(())
        })?;
        // The table is gone, and with it every job in it: the jobs of other tables waiting on
        // them are settled as a cancel would settle them (they will never run), in one
        // transaction with the deletion of every row naming the table. After the drop, so no
        // publish can name one of its jobs meanwhile (a publish that read the table holds it
        // until its commit, and the drop waited for that).
        let deps_table = crate::dialect::deps::DEPS_TABLE;
        if let Some(deps) = q.dialect.deps() {
            q.retrying("drop table", |conn| {
                if !exists(conn, deps_table)? {
                    return Ok(());
                }
                conn.batch(&deps.begin_write)?;
                let done = crate::runtime::deps::dropped(deps, &*q, conn, &q.spec.name)
                    .and_then(|()| conn.batch("COMMIT"));
                if done.is_err() {
                    conn.rollback_or_discard();
                }
                done
            })?;
        }
        self.forget(&q.spec.name);
        Ok(())
    }

    /// Brings a table made by an earlier version (or described with fewer options) up to its
    /// description: creates it if it does not exist, adds the missing columns (`ALTER TABLE ..
    /// ADD COLUMN`) and indexes, then checks it as [`create_table`](Broker::create_table)
    /// does. Returns what it did, one line each (nothing for a table already up to date).
    ///
    /// A missing column that existing rows cannot be given (`NOT NULL` with no default, such
    /// as the payload) and a column of a type the statements cannot use are
    /// [`BrokerError::Schema`], and nothing is changed. Each step is idempotent: a migration
    /// cut short is finished by running it again. DDL takes locks: run it when the queue is
    /// quiet (on MySQL every statement also commits on its own).
    ///
    /// MySQL/MariaDB: a dedup key or group column made by an earlier release, in the
    /// database's default collation (case-insensitive, padding trailing spaces), is converted
    /// to byte-exact text (`ALTER TABLE .. MODIFY COLUMN`, one statement for the table). That
    /// **copies the table** and blocks its writes while it runs: on a large table, plan for
    /// it. Until then the schema check refuses the table.
    ///
    /// Priorities added to a table change its claim order, so the ready index (`<table>_ready`)
    /// is dropped and built again in the new order (`priority DESC, run_at, id`): without it
    /// every claim would sort the whole backlog. Building it reads the table and blocks its
    /// writes meanwhile (PostgreSQL, SQLite; MySQL/MariaDB rebuild it in place), so on a large
    /// table run it while the queue is quiet.
    ///
    /// The publish time (`created_at`, [`Job::published_at`](crate::Job::published_at)) is
    /// added with no value for the rows already there (their publish time is unknown, and the
    /// migration's would be a wrong one), then given its server-clock default on PostgreSQL
    /// and MySQL/MariaDB (on MySQL a second statement: a migration cut between the two leaves
    /// the column without it). SQLite cannot add a column with that default: rows published
    /// into a table it migrated read no publish time either.
    ///
    /// ```
    /// use sqlbroker::{Broker, Table};
    /// use std::time::Duration;
    ///
    /// let broker = Broker::connect("sqlite::memory:")?;
    /// let lease = Duration::from_secs(30);
    /// broker.create_table(&Table::new("jobs").lease(lease))?;
    /// // A later version of the service wants priorities and dedup keys on the same table.
    /// let jobs = Table::new("jobs").lease(lease).priorities().dedup();
    /// let done = broker.migrate(&jobs)?;
    /// assert_eq!(
    ///     done,
    ///     ["added column priority", "added column dedup_key", "rebuilt index jobs_ready in priority order"]
    /// );
    /// assert!(broker.migrate(&jobs)?.is_empty());
    /// # Ok::<(), sqlbroker::BrokerError>(())
    /// ```
    ///
    /// The description given is recorded as the table's ([`Broker::open_table`]), replacing
    /// the record it had, or giving a table made by an earlier release its first; the pause
    /// flag is kept. Brokers that checked the old description keep it until they are made
    /// again: stop the workers of the old description first. A description in another form
    /// than the record (or, for a table with no record, its columns: a `locked_until` column
    /// is a lease table) is refused with [`BrokerError::Schema`]: a table keeps its form (to
    /// change it, create a table of another name and move the work there, or drop an empty
    /// table and create it again). A form the database does not have is
    /// [`BrokerError::Unsupported`], as in [`create_table`](Broker::create_table).
    ///
    /// [`BrokerError::DdlRefused`] on a broker built with
    /// [`manage_schema(false)`](crate::BrokerBuilder::manage_schema), before anything is sent;
    /// [`Broker::migration_sql`] gives the statements this would run, for a migration tool.
    pub fn migrate(&self, table: &Table) -> Result<Vec<String>> {
        self.may_run_ddl("migrate", table)?;
        let q = self.compiled(table)?;
        q.dialect.check_form(q.spec.form)?;
        let mut conn = q.conn("migrate")?;
        let found = q.columns(&mut *conn)?;
        if found.is_empty() {
            drop(conn);
            self.create_table(table)?;
            return Ok(vec![format!("created table {}", q.spec.name)]);
        }
        drop(conn);
        crate::runtime::registry::check_migration(&q, table)?;
        let mut conn = q.conn("migrate")?;
        let plan = crate::operating::ddl::plan(&q, &mut *conn, &found)?;
        for sql in &plan.statements {
            conn.batch(sql).map_err(q.err("migrate"))?;
        }
        q.check_schema(&mut *conn)?;
        drop(conn);
        crate::runtime::registry::record(&q, table)?;
        Ok(plan.done)
    }

    /// The statements [`create_table`](Broker::create_table) runs for `table` on this
    /// broker's database, as [`Table::ddl`] writes them (on MySQL/MariaDB in the server's
    /// own byte-exact collation). Runs nothing.
    ///
    /// # Errors
    ///
    /// [`BrokerError::InvalidTable`] for an invalid description.
    pub fn create_table_sql(&self, table: &Table) -> Result<Vec<String>> {
        create_sql(self.dialect(), table)
    }

    /// What [`migrate`](Broker::migrate) would run on `table` now, without running it: a
    /// dry run, reading the table's columns, indexes and record. For a table that does not
    /// exist, [`create_table_sql`](Broker::create_table_sql); for one that lacks columns or
    /// indexes, the statements that add them (and, on MySQL/MariaDB, convert compared text
    /// to byte-exact collations), then the registry and the new record; for a table whose
    /// record differs only, the record; nothing for a table up to date. Works on a broker
    /// that does not [manage the schema](crate::BrokerBuilder::manage_schema).
    ///
    /// # Errors
    ///
    /// As [`migrate`](Broker::migrate): [`BrokerError::Schema`] for what a migration cannot
    /// fix (another form than the record's, a missing column existing rows cannot be given, a
    /// column of a type the statements cannot use).
    ///
    /// ```
    /// use sqlbroker::{Broker, Table};
    /// use std::time::Duration;
    ///
    /// let broker = Broker::connect("sqlite::memory:")?;
    /// let jobs = Table::new("jobs").lease(Duration::from_secs(30));
    /// broker.create_table(&jobs)?;
    /// let sql = broker.migration_sql(&jobs.clone().priorities())?;
    /// assert_eq!(sql[0], "ALTER TABLE \"jobs\" ADD COLUMN \"priority\" INTEGER NOT NULL DEFAULT 0");
    /// assert!(broker.migration_sql(&jobs)?.is_empty());
    /// # Ok::<(), sqlbroker::BrokerError>(())
    /// ```
    pub fn migration_sql(&self, table: &Table) -> Result<Vec<String>> {
        let q = self.compiled(table)?;
        q.dialect.check_form(q.spec.form)?;
        let found = {
            let mut conn = q.conn("migration sql")?;
            q.columns(&mut *conn)?
        };
        if found.is_empty() {
            return self.create_table_sql(table);
        }
        crate::runtime::registry::check_migration(&q, table)?;
        let mut conn = q.conn("migration sql")?;
        let mut out = plan(&q, &mut *conn, &found)?.statements;
        drop(conn);
        if !out.is_empty() || !crate::runtime::registry::is_recorded(&q, table)? {
            out.extend(record_sql(self.dialect(), table));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn syntax(param: fn(usize) -> String) -> Syntax {
        Syntax {
            quote: |s| s.to_string(),
            param,
            now: "NOW()",
            claim_limit: |p| p.to_string(),
            literal: crate::dialect::shared::standard_literal,
            stamps_created: false,
            contains: |h, n| format!("instr({h}, {n}) > 0"),
            row_compare: true,
            force_index: false,
        }
    }

    /// Values go where their placeholders are, and a value that spells a later placeholder
    /// is not mistaken for it.
    #[test]
    fn placeholders_are_replaced_in_order_in_the_statement_only() {
        let values = ["'a?$2?2'".to_string(), "7".into(), "NOW()".into()];
        for (param, sql) in [
            (
                (|_| "?".to_string()) as fn(usize) -> String,
                "INSERT INTO r VALUES (?, ?, ?) ON DUPLICATE KEY UPDATE x = VALUES(x)",
            ),
            (
                |n| format!("${n}"),
                "INSERT INTO r VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
            ),
            (
                |n| format!("?{n}"),
                "INSERT INTO r VALUES (?1, ?2, ?3) ON CONFLICT DO NOTHING",
            ),
        ] {
            let out = inline(&syntax(param), sql, &values);
            assert!(
                out.starts_with("INSERT INTO r VALUES ('a?$2?2', 7, NOW()) ON "),
                "{out}"
            );
        }
    }

    #[test]
    fn databases_by_name() {
        assert_eq!(
            "PostgreSQL".parse::<Database>().unwrap(),
            Database::Postgres
        );
        assert_eq!("mariadb".parse::<Database>().unwrap(), Database::Mariadb);
        assert!(matches!(
            "oracle".parse::<Database>(),
            Err(BrokerError::InvalidOption { .. })
        ));
    }

    /// The record a printed schema inserts reads back as the description, quotes and
    /// backslashes included (MySQL's hexadecimal form; standard quoting elsewhere).
    #[cfg(feature = "mysql")]
    #[test]
    fn mysql_literals_survive_any_sql_mode() {
        let t = Table::new("t").advisory_lock("a'b\\c-{k}").text_column("k");
        let sql = t.ddl(Database::Mariadb).unwrap();
        let insert = sql.last().unwrap();
        assert!(!insert.contains('\\'), "{insert}");
        let hex = insert
            .split_once("CONVERT(X'")
            .and_then(|(_, rest)| rest.split_once('\''))
            .map(|(hex, _)| hex)
            .expect(insert);
        let bytes: Vec<u8> = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
            .collect();
        assert_eq!(String::from_utf8(bytes).unwrap(), t.to_record());
        assert!(sql[0].contains("utf8mb4_nopad_bin"), "{}", sql[0]);
        let mysql = Table::new("t").text_column("k").ddl(Database::Mysql);
        assert!(mysql.unwrap()[0].contains("utf8mb4_0900_bin"));
        // Without a backslash: quotes doubled.
        let quoted = Table::new("t").advisory_lock("a'b-{k}").text_column("k");
        let insert = quoted.ddl(Database::Mysql).unwrap().pop().unwrap();
        assert!(insert.contains(r#""advisory_lock":"a''b-{k}""#), "{insert}");
        let plain = Table::new("it's").ddl(Database::Mysql);
        assert!(plain.is_err(), "not an identifier");
    }
}
