//! What the flow and compose benches share: their settings from the environment, and dropping
//! the tables they made (with their records and waits) on the servers.

/// The number in environment variable `name`, or `default`.
pub fn env_num(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Drops table `name` on `db`'s server at `url`, with its record and any waits naming it
/// (SQLite: nothing, its file goes).
pub fn drop_table(db: &str, url: &str, name: &str) {
    let sql = format!(
        "DROP TABLE IF EXISTS {name}; DELETE FROM sqlbroker_tables WHERE name = '{name}'; \
         DELETE FROM sqlbroker_deps WHERE parent_table = '{name}' OR child_table = '{name}'"
    );
    let done = match db {
        "postgres" => postgres::Client::connect(url, postgres::NoTls)
            .and_then(|mut c| {
                for stmt in sql.split("; ") {
                    // The waits' table exists only where a table had dependencies.
                    if let Err(e) = c.batch_execute(stmt) {
                        if !stmt.contains("sqlbroker_deps") {
                            return Err(e);
                        }
                    }
                }
                Ok(())
            })
            .map_err(|e| e.to_string()),
        "mariadb" => {
            use mysql::prelude::Queryable;
            mysql::Conn::new(mysql::Opts::from_url(url).unwrap())
                .and_then(|mut c| {
                    for stmt in sql.split("; ") {
                        if let Err(e) = c.query_drop(stmt) {
                            if !stmt.contains("sqlbroker_deps") {
                                return Err(e);
                            }
                        }
                    }
                    Ok(())
                })
                .map_err(|e| e.to_string())
        }
        _ => Ok(()),
    };
    if let Err(e) = done {
        eprintln!("{db}: dropping {name}: {e}");
    }
}

/// The command line's filters (arguments not starting with `--`).
pub fn filters() -> Vec<String> {
    std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect()
}

/// True if cell `id` is wanted: no filter, or one it contains.
pub fn wanted(filters: &[String], id: &str) -> bool {
    filters.is_empty() || filters.iter().any(|f| id.contains(f.as_str()))
}

/// The databases a bench runs on, `(name, url)`: an SQLite file in the temporary directory
/// named after `bench` (the caller removes it: [`remove_sqlite`]), and the servers at
/// `SQLBROKER_PG_URL` and `SQLBROKER_MYSQL_URL` (or the defaults).
pub fn databases(bench: &str) -> [(&'static str, String); 3] {
    let pg = std::env::var("SQLBROKER_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let my = std::env::var("SQLBROKER_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into());
    [
        ("sqlite", format!("sqlite:{}", sqlite_file(bench).display())),
        ("postgres", pg),
        ("mariadb", my),
    ]
}

fn sqlite_file(bench: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("sqlbroker-{bench}-{}.db", std::process::id()))
}

/// Removes the SQLite file of [`databases`].
pub fn remove_sqlite(bench: &str) {
    let _ = std::fs::remove_file(sqlite_file(bench));
}

/// A broker on `url`, or `None` after a line saying cell `cell` is skipped (a server that
/// does not answer).
pub fn connect(cell: &str, url: &str) -> Option<sqlbroker::Broker> {
    match sqlbroker::Broker::connect(url) {
        Ok(b) => Some(b),
        Err(e) => {
            println!("{cell}: skipped ({e})");
            None
        }
    }
}

/// A session holding a snapshot of `table` until dropped (its connection is only kept open).
#[allow(dead_code)]
pub enum Held {
    Pg(Box<postgres::Client>),
    My(mysql::Conn),
}

#[allow(dead_code)]
pub fn hold(db: &str, url: &str, table: &str) -> Held {
    use mysql::prelude::Queryable;
    match db {
        "postgres" => {
            let mut c = postgres::Client::connect(url, postgres::NoTls).expect("connect");
            c.batch_execute(&format!(
                "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM {table}"
            ))
            .expect("hold a snapshot");
            Held::Pg(Box::new(c))
        }
        _ => {
            let mut c = mysql::Conn::new(mysql::Opts::from_url(url).unwrap()).expect("connect");
            c.query_drop("START TRANSACTION WITH CONSISTENT SNAPSHOT")
                .expect("hold a snapshot");
            c.query_drop(format!("SELECT count(*) FROM {table}"))
                .expect("read in the snapshot");
            Held::My(c)
        }
    }
}
