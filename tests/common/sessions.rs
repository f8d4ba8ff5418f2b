//! Ending a database session from the outside, as a server's operator or a failover would:
//! PostgreSQL `pg_terminate_backend`, MySQL/MariaDB `KILL`. [`Marked`] gives a broker (or a
//! worker process) a URL whose sessions can be found exactly, without touching anyone else's
//! on the shared servers. Used by `zz_faults` and `zz_chaos_matrix`.

use std::time::Duration;

use super::{ints, try_exec, wait_for, Db};

/// Ends session `id` (a PostgreSQL backend pid, a MariaDB connection id) through `url`, and
/// waits until it is gone; false if it had already ended by itself. Panics if it does not go.
pub fn end_session(db: Db, url: &str, id: i64) -> bool {
    let (ended, gone) = match db {
        Db::Postgres => (
            ints(db, url, &format!("SELECT pg_terminate_backend({id})::int")) == [Some(1)],
            format!("SELECT COUNT(*) FROM pg_stat_activity WHERE pid = {id}"),
        ),
        Db::Mysql => {
            let ended = match try_exec(db, url, &format!("KILL {id}")) {
                Ok(()) => true,
                // 1094: unknown thread id: it ended by itself.
                Err(e) if e.contains("1094") => false,
                Err(e) => panic!("KILL {id}: {e}"),
            };
            let gone =
                format!("SELECT COUNT(*) FROM information_schema.processlist WHERE ID = {id}");
            (ended, gone)
        }
        Db::Sqlite => panic!("SQLite has no sessions to end"),
    };
    let done = wait_for(Duration::from_secs(10), || {
        ints(db, url, &gone).first() == Some(&Some(0))
    });
    assert!(done, "{db:?}: session {id} did not end");
    ended
}

/// Sessions that can be found from the outside, exactly: PostgreSQL by a unique
/// `application_name` in the URL; MariaDB by a user of their own (made here with every
/// privilege on the test database, dropped when this is dropped), since MariaDB keeps no
/// connection attributes without `performance_schema`.
pub struct Marked {
    pub db: Db,
    /// The URL sessions are found and ended through (an ordinary one).
    admin: String,
    /// PostgreSQL: the application name; MariaDB: the user.
    pub mark: String,
    /// The marked URL: connect with it to be found.
    pub url: String,
}

impl Marked {
    /// A mark of its own on the server behind `url` (of `db`, a server).
    pub fn new(db: Db, url: &str) -> Marked {
        let mark = super::unique("mark");
        let marked = match db {
            Db::Postgres => super::with_params(url, &format!("application_name={mark}")),
            Db::Mysql => {
                let database = url
                    .split('?')
                    .next()
                    .and_then(|b| b.rsplit_once('/'))
                    .map(|(_, d)| d.to_string())
                    .expect("a database in the url");
                // The driver may move from TCP to the local socket: both hosts.
                for host in ["localhost", "127.0.0.1"] {
                    super::exec(
                        db,
                        url,
                        &format!(
                            "CREATE USER '{mark}'@'{host}'; \
                             GRANT ALL ON `{database}`.* TO '{mark}'@'{host}'"
                        ),
                    );
                }
                let rest = url
                    .split_once("://")
                    .and_then(|(_, r)| r.split_once('@'))
                    .map(|(_, r)| r)
                    .unwrap_or_else(|| url.split_once("://").expect("a url").1);
                format!("mysql://{mark}@{rest}")
            }
            Db::Sqlite => panic!("SQLite has no sessions to mark"),
        };
        Marked {
            db,
            admin: url.to_string(),
            mark,
            url: marked,
        }
    }

    /// The marked sessions now.
    pub fn sessions(&self) -> Vec<i64> {
        let sql = match self.db {
            Db::Postgres => format!(
                "SELECT pid FROM pg_stat_activity WHERE application_name = '{}'",
                self.mark
            ),
            _ => format!(
                "SELECT ID FROM information_schema.processlist WHERE USER = '{}'",
                self.mark
            ),
        };
        ints(self.db, &self.admin, &sql)
            .into_iter()
            .flatten()
            .collect()
    }

    /// Ends one session and waits until it is gone; false if it had already ended.
    pub fn end(&self, id: i64) -> bool {
        end_session(self.db, &self.admin, id)
    }

    /// Ends every marked session there is now, once (new ones may open meanwhile); how many
    /// it ended.
    pub fn end_all_once(&self) -> usize {
        self.sessions()
            .into_iter()
            .filter(|&id| self.end(id))
            .count()
    }
}

impl Drop for Marked {
    fn drop(&mut self) {
        if self.db == Db::Mysql {
            for host in ["localhost", "127.0.0.1"] {
                let _ = try_exec(
                    self.db,
                    &self.admin,
                    &format!("DROP USER IF EXISTS '{}'@'{host}'", self.mark),
                );
            }
        }
    }
}
