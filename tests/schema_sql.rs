//! Schema for migration tools: the SQL `sqlbroker schema` prints, applied by the databases' own
//! command line clients (`psql`, `mysql`, `sqlite3`), makes a table that a broker built with
//! `manage_schema(false)` uses without running any DDL: as a database user with DML rights
//! only on the servers (a role granted `SELECT, INSERT, UPDATE, DELETE`, dropped at the end),
//! with SQLite's schema version unchanged. `--migrate` output brings a table made by an older
//! description up to date. Cargo feature `cli` (the tool is run as a process).

mod common;

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{live, msg, unique, Db, Live};
use sqlbroker::{Broker, BrokerError, Delivery, Table};

const BIN: &str = env!("CARGO_BIN_EXE_sqlbroker");

/// Runs `program` with `args` and `stdin`, at most a minute; its standard output, or a
/// failure naming its standard error.
fn run(program: &str, args: &[&str], stdin: &str) -> String {
    let mut child = Command::new(program)
        .args(args)
        .env_remove("DATABASE_URL")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{program}: {e} (is it installed?)"));
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("{program} {args:?} ran longer than a minute");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{program} {args:?} failed: {}\ninput:\n{stdin}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// `(user, password, host, port, database)` of a `mysql://` URL.
fn mysql_parts(url: &str) -> (String, String, String, String, String) {
    let rest = url.split_once("://").unwrap().1;
    let rest = rest.split('?').next().unwrap();
    let (auth, rest) = rest.rsplit_once('@').unwrap_or(("root", rest));
    let (user, pw) = auth.split_once(':').unwrap_or((auth, ""));
    let (hostport, db) = rest.split_once('/').unwrap();
    let (host, port) = hostport.split_once(':').unwrap_or((hostport, "3306"));
    let s = |x: &str| x.to_string();
    (s(user), s(pw), s(host), s(port), s(db))
}

/// Applies `sql` with the database's own command line client, stopping at the first error.
fn apply(db: Db, url: &str, sql: &str) -> String {
    match db {
        Db::Postgres => run("psql", &[url, "-X", "-q", "-v", "ON_ERROR_STOP=1"], sql),
        Db::Mysql => {
            let (user, pw, host, port, name) = mysql_parts(url);
            let pw = format!("--password={pw}");
            run(
                "mysql",
                &[
                    "--protocol=tcp",
                    "-h",
                    &host,
                    "-P",
                    &port,
                    "-u",
                    &user,
                    &pw,
                    "-N",
                    &name,
                ],
                sql,
            )
        }
        Db::Sqlite => run(
            "sqlite3",
            &["-bail", url.strip_prefix("sqlite:").unwrap()],
            sql,
        ),
    }
}

/// The `--dialect` of the server under test (the MySQL URL may be MySQL 8 or MariaDB).
fn dialect(live: &Live) -> &'static str {
    match live.db {
        Db::Postgres => "postgres",
        Db::Sqlite => "sqlite",
        Db::Mysql if apply(Db::Mysql, &live.url, "SELECT VERSION();").contains("MariaDB") => {
            "mariadb"
        }
        Db::Mysql => "mysql",
    }
}

/// A database user with DML rights only (`SELECT, INSERT, UPDATE, DELETE` on `tables`), no
/// DDL: a PostgreSQL role (PostgreSQL 15 gives no one `CREATE` on `public`), a MySQL user.
/// Dropped with its grants at the end. SQLite has no users: `None`.
struct DmlUser {
    db: Db,
    admin_url: String,
    name: String,
    url: String,
}

impl DmlUser {
    fn new(live: &Live, tables: &[&str]) -> Option<DmlUser> {
        if live.db == Db::Sqlite {
            return None;
        }
        let name = unique("dml");
        let (scheme, rest) = live.url.split_once("://").unwrap();
        let host = rest.rsplit_once('@').map_or(rest, |(_, h)| h);
        let (url, create, grant) = match live.db {
            Db::Sqlite => return None,
            Db::Postgres => (
                format!("{scheme}://{name}@{host}"),
                format!("CREATE ROLE {name} LOGIN"),
                format!("GRANT SELECT, INSERT, UPDATE, DELETE ON {{}} TO {name}"),
            ),
            Db::Mysql => (
                format!("{scheme}://{name}:dml-pw@{host}"),
                format!("CREATE USER '{name}'@'%' IDENTIFIED BY 'dml-pw'"),
                format!("GRANT SELECT, INSERT, UPDATE, DELETE ON {{}} TO '{name}'@'%'"),
            ),
        };
        live.exec(&create);
        let user = DmlUser {
            db: live.db,
            admin_url: live.url.clone(),
            name,
            url,
        };
        for t in tables.iter().chain(&["sqlbroker_tables"]) {
            live.exec(&grant.replace("{}", t));
        }
        Some(user)
    }
}

impl Drop for DmlUser {
    fn drop(&mut self) {
        let n = &self.name;
        let drop = match self.db {
            Db::Postgres => format!("DROP OWNED BY {n}; DROP ROLE {n}"),
            _ => format!("DROP USER '{n}'@'%'"),
        };
        common::exec(self.db, &self.admin_url, &drop);
    }
}

fn payload(d: &Delivery) -> String {
    String::from_utf8_lossy(d.payload()).into_owned()
}

fn sqlite_schema_version(live: &Live) -> Option<i64> {
    (live.db == Db::Sqlite).then(|| live.int("PRAGMA schema_version"))
}

/// The printed SQL, applied by the database's client, makes a FIFO, dedup, lease table that
/// a broker which runs no DDL (a DML-only user) publishes to, claims from in group order,
/// acks and deduplicates on; its `create_table` and `migrate` are refused with the typed
/// error.
fn printed_sql_makes_a_table_the_ddl_less_broker_uses(db: Db) {
    let Some(live) = live(db) else { return };
    let name = unique("s");
    live.track(&name);
    let t = Table::new(&name)
        .text_column("k")
        .group("k")
        .fifo()
        .dedup()
        .lease(Duration::from_secs(30));
    let sql = run(
        BIN,
        &[
            "schema",
            "--dialect",
            dialect(&live),
            "--table",
            &name,
            "--lease",
            "30",
            "--column",
            "k",
            "--fifo",
            "k",
            "--dedup",
        ],
        "",
    );
    assert!(sql.starts_with("-- sqlbroker "), "{sql}");
    apply(db, &live.url, &sql);

    let user = DmlUser::new(&live, &[&name]);
    let url = user.as_ref().map_or(live.url.clone(), |u| u.url.clone());
    if user.is_some() {
        // The user really has no DDL rights: a broker that manages the schema fails as it.
        let free = Broker::connect(&url).unwrap();
        let other = Table::new(unique("s")).lease(Duration::from_secs(30));
        live.track(other.name());
        match free.create_table(&other) {
            Err(BrokerError::Database { .. }) => {}
            other => panic!("a DML-only user made a table: {other:?}"),
        }
    }
    let schema_version = sqlite_schema_version(&live);

    let broker = Broker::builder(&url).manage_schema(false).build().unwrap();
    for r in [broker.create_table(&t), broker.migrate(&t).map(drop)] {
        match r {
            Err(BrokerError::DdlRefused { table, .. }) => assert_eq!(table, name),
            other => panic!("expected DdlRefused, got {other:?}"),
        }
    }
    assert_eq!(broker.open_table(&name).unwrap(), t, "the printed record");
    let a1 = broker.publish(&t, msg("a1", "a").dedup_key("d1")).unwrap();
    broker.publish(&t, msg("a2", "a").dedup_key("d2")).unwrap();
    broker.publish(&t, msg("b1", "b").dedup_key("d3")).unwrap();
    match broker.publish(&t, msg("dup", "b").dedup_key("d1")) {
        Err(BrokerError::Duplicate { id, .. }) => assert_eq!(id, a1),
        other => panic!("expected a duplicate, got {other:?}"),
    }

    let sub = broker
        .subscription(&t)
        .max_in_flight(4)
        .poll_interval(Duration::from_millis(50))
        .start()
        .unwrap();
    let wait = Duration::from_secs(10);
    let first = sub.next_delivery_timeout(wait).unwrap();
    let second = sub.next_delivery_timeout(wait).unwrap();
    let mut heads = [payload(&first), payload(&second)];
    heads.sort();
    assert_eq!(heads, ["a1", "b1"], "one head per group");
    assert!(
        sub.next_delivery_timeout(Duration::from_millis(500))
            .is_err(),
        "a2 waits for a1"
    );
    let (a, b) = if payload(&first) == "a1" {
        (first, second)
    } else {
        (second, first)
    };
    a.ack().unwrap();
    let next = sub.next_delivery_timeout(wait).unwrap();
    assert_eq!(payload(&next), "a2");
    next.ack().unwrap();
    b.ack().unwrap();
    sub.shutdown(Duration::from_secs(5)).unwrap();
    assert_eq!(live.rows(&t), 0);
    assert_eq!(
        sqlite_schema_version(&live),
        schema_version,
        "SQLite's schema changed"
    );
    drop(broker);
    drop(user);
}

/// A table made by an older description's printed SQL is refused by the new description
/// until the `--migrate` output (read from the table as it is) is applied; then the broker
/// that runs no DDL uses the added columns and index (priorities, dedup keys), and nothing
/// more is left to migrate.
fn migrate_output_brings_an_older_table_up(db: Db) {
    let Some(live) = live(db) else { return };
    let name = unique("s");
    live.track(&name);
    let flags = ["--table", &name, "--lease", "30", "--column", "k"];
    let old = run(
        BIN,
        &[&["schema", "--dialect", dialect(&live)][..], &flags].concat(),
        "",
    );
    apply(db, &live.url, &old);
    let user = DmlUser::new(&live, &[&name]);
    let url = user.as_ref().map_or(live.url.clone(), |u| u.url.clone());
    let new = Table::new(&name)
        .text_column("k")
        .priorities()
        .dedup()
        .lease(Duration::from_secs(30));
    let broker = Broker::builder(&url).manage_schema(false).build().unwrap();
    match broker.publish(&new, msg("early", "a")) {
        Err(BrokerError::Schema { problems, .. }) => {
            // The record's difference ("priorities is recorded as false") or, with no
            // record, the missing column ("column priority is missing").
            assert!(
                problems.iter().any(|p| p.contains("priorit")),
                "{problems:?}"
            )
        }
        other => panic!("expected a schema error, got {other:?}"),
    }

    // Read through the DML-only user: a dry run needs no DDL rights.
    let migration = Command::new(BIN)
        .args(
            [
                &["schema", "--migrate", "--url", &url][..],
                &flags,
                &["--priorities", "--dedup"],
            ]
            .concat(),
        )
        .env_remove("DATABASE_URL")
        .output()
        .unwrap();
    assert!(
        migration.status.success(),
        "{}",
        String::from_utf8_lossy(&migration.stderr)
    );
    let migration = String::from_utf8(migration.stdout).unwrap();
    assert!(migration.contains("priority"), "{migration}");
    assert!(
        !migration.contains("CREATE TABLE IF NOT EXISTS \""),
        "{migration}"
    );
    apply(db, &live.url, &migration);

    // A broker of its own: the first one remembers nothing of the refusal, but start clean.
    let broker = Broker::builder(&url).manage_schema(false).build().unwrap();
    assert!(broker.migration_sql(&new).unwrap().is_empty());
    // The recorded table by name alone: the new description's whole DDL.
    let recorded = run(BIN, &["schema", "--url", &url, "--table", &name], "");
    assert_eq!(
        recorded
            .lines()
            .filter(|l| !l.starts_with("--"))
            .collect::<Vec<_>>(),
        broker
            .create_table_sql(&new)
            .unwrap()
            .iter()
            .map(|s| format!("{s};"))
            .collect::<Vec<_>>()
    );
    assert!(recorded.contains("_dedup"), "{recorded}");
    assert_eq!(broker.open_table(&name).unwrap(), new);
    broker
        .publish(&new, msg("low", "a").dedup_key("x"))
        .unwrap();
    broker
        .publish(&new, msg("high", "a").dedup_key("y").priority(5))
        .unwrap();
    assert!(matches!(
        broker.publish(&new, msg("again", "a").dedup_key("x")),
        Err(BrokerError::Duplicate { .. })
    ));
    // One row a claim: the rows of one claim come in no set order.
    let sub = broker
        .subscription(&new)
        .batch_size(1)
        .max_in_flight(1)
        .start()
        .unwrap();
    let d = sub.next_delivery_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(payload(&d), "high");
    d.ack().unwrap();
    let d = sub.next_delivery_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(payload(&d), "low");
    d.ack().unwrap();
    sub.shutdown(Duration::from_secs(5)).unwrap();
    drop(broker);
    drop(user);
}

macro_rules! on_every_database {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(#[test] fn $name() { super::$name(super::Db::Sqlite) })*
        }
        mod postgres {
            $(#[test] fn $name() { super::$name(super::Db::Postgres) })*
        }
        mod mysql {
            $(#[test] fn $name() { super::$name(super::Db::Mysql) })*
        }
    };
}

on_every_database!(
    printed_sql_makes_a_table_the_ddl_less_broker_uses,
    migrate_output_brings_an_older_table_up,
);

/// Runs the tool with no `DATABASE_URL`: (exit code, stdout, stderr).
fn run_status(args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(BIN)
        .args(args)
        .env_remove("DATABASE_URL")
        .stdin(Stdio::null())
        .output()
        .expect("run sqlbroker");
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.code(), text(&out.stdout), text(&out.stderr))
}

/// The statements of a script, without its comments.
fn statements(script: &str) -> Vec<String> {
    script
        .lines()
        .filter(|l| !l.starts_with("--"))
        .map(String::from)
        .collect()
}

/// `schema --dialect D --table NAME` with a URL prints the recorded table's DDL (its columns,
/// its form), in D's SQL, the server's own when D is the URL's database; with no URL and no
/// flags it says, in the script and on stderr, that it prints a bare description; flags that
/// disagree with the record are refused.
///
/// Fails (`the recorded table`) when `--dialect` ignores the URL and prints the bare row lock
/// table (tried: the old `schema`), and (`says bare`) without the note.
fn schema_with_a_dialect_prints_the_recorded_table(db: Db) {
    let Some(live) = live(db) else { return };
    let name = unique("nu_orders");
    let recorded = live.create(
        Table::new(name.as_str())
            .text_column("k")
            .lease(Duration::from_secs(30))
            .dedup(),
    );
    let url = live.url.clone();
    let own = dialect(&live);
    let broker = Broker::builder(&url).manage_schema(false).build().unwrap();
    let out = run(
        BIN,
        &["schema", "--url", &url, "--dialect", own, "--table", &name],
        "",
    );
    let want: Vec<String> = broker
        .create_table_sql(&recorded)
        .unwrap()
        .iter()
        .map(|s| format!("{s};"))
        .collect();
    assert_eq!(statements(&out), want, "the recorded table: {out}");
    assert!(
        out.contains("-- The table as recorded in the database."),
        "{out}"
    );
    // Another database's SQL of the same recorded table.
    let other = if db == Db::Postgres {
        "sqlite"
    } else {
        "postgres"
    };
    let out = run(
        BIN,
        &[
            "schema",
            "--url",
            &url,
            "--dialect",
            other,
            "--table",
            &name,
        ],
        "",
    );
    let want: Vec<String> = recorded
        .ddl(other.parse().unwrap())
        .unwrap()
        .iter()
        .map(|s| format!("{s};"))
        .collect();
    assert_eq!(
        statements(&out),
        want,
        "the recorded table in {other}: {out}"
    );

    // No URL, no flags: a bare description, said so.
    let (code, out, err) = run_status(&["schema", "--dialect", own, "--table", &name]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.lines()
            .nth(1)
            .unwrap_or_default()
            .contains("bare description"),
        "says bare: {out}"
    );
    assert!(err.contains("bare description"), "says bare: {err}");
    assert_eq!(
        statements(&out),
        Table::new(name.as_str())
            .ddl(own.parse().unwrap())
            .unwrap()
            .iter()
            .map(|s| format!("{s};"))
            .collect::<Vec<_>>()
    );
    // No URL, flags: the flags' table, said so in the script, nothing on stderr.
    let (code, out, err) = run_status(&[
        "schema",
        "--dialect",
        own,
        "--table",
        &name,
        "--lease",
        "30",
    ]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains("the table as the flags describe it, not as recorded"),
        "{out}"
    );
    assert_eq!(err, "");
    // A URL and flags that disagree with the record: refused.
    let (code, _, err) = run_status(&[
        "schema",
        "--url",
        &url,
        "--dialect",
        own,
        "--table",
        &name,
        "--lease",
        "30",
    ]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("recorded with another description"), "{err}");
}
per_db!(schema_with_a_dialect_prints_the_recorded_table);

/// Drops a space made by [`fresh_space`] when dropped, a failed test's too.
struct Space<'a> {
    live: &'a Live,
    url: String,
    drop: Option<String>,
}

impl Drop for Space<'_> {
    fn drop(&mut self) {
        if let Some(sql) = &self.drop {
            self.live.exec(sql);
        }
    }
}

/// A database of its own for `live`'s server (a schema on PostgreSQL, a database on MariaDB, a
/// new file on SQLite), dropped with the guard.
fn space(live: &Live) -> Space<'_> {
    let (url, drop) = fresh_space(live);
    Space { live, url, drop }
}

/// A database of its own for `live`'s server: its URL and the statement that drops it (`None`
/// on SQLite).
fn fresh_space(live: &Live) -> (String, Option<String>) {
    let space = unique("hl_space");
    match live.db {
        Db::Postgres => {
            live.exec(&format!("CREATE SCHEMA {space}"));
            let url =
                common::with_params(&live.url, &format!("options=-c%20search_path%3D{space}"));
            (url, Some(format!("DROP SCHEMA {space} CASCADE")))
        }
        Db::Mysql => {
            live.exec(&format!("CREATE DATABASE {space}"));
            let base = live
                .url
                .rsplit_once('/')
                .map_or(live.url.as_str(), |(b, _)| b);
            (
                format!("{base}/{space}"),
                Some(format!("DROP DATABASE {space}")),
            )
        }
        Db::Sqlite => (common::url(Db::Sqlite).unwrap(), None),
    }
}

/// Whether a broker built with `manage_schema(false)` on `url` is elected the database's
/// maintainer within 5 s (its lease of 3 s, the shortest: it tries every second).
fn elected_without_ddl(url: &str) -> bool {
    let broker = Broker::builder(url)
        .manage_schema(false)
        .maintainer_lease(Duration::from_secs(3))
        .build()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if broker.is_maintainer() {
            let m = broker.maintainer().unwrap().expect("the holder, read back");
            assert_eq!(m.pid(), u64::from(std::process::id()));
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

/// `sqlbroker library-schema --dialect D`, applied by the database's own client to a fresh
/// database, makes what a broker that runs no DDL needs to elect its maintainer (and to record
/// actions, heartbeats and schedules); without it, no maintainer is elected (the library's own
/// tables are missing and the broker makes none).
///
/// Fails (seen, with the maintainer's statements left out of `Database::library_ddl`) with
/// "no maintainer elected after library-schema".
fn library_schema_lets_a_broker_without_ddl_maintain(db: Db) {
    let Some(live) = live(db) else { return };
    let (bare, made) = (space(&live), space(&live));
    let script = run(BIN, &["library-schema", "--dialect", dialect(&live)], "");
    assert!(script.contains("sqlbroker_maintainer"), "{script}");
    apply(db, &made.url, &script);
    // Twice: each statement is idempotent.
    apply(db, &made.url, &script);
    let elected = elected_without_ddl(&made.url);
    let elected_bare = elected_without_ddl(&bare.url);
    assert!(elected, "no maintainer elected after library-schema");
    assert!(
        !elected_bare,
        "elected with no library tables: the test proves nothing"
    );
}
per_db!(library_schema_lets_a_broker_without_ddl_maintain);
