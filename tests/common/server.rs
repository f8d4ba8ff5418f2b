//! The local database servers, from the outside: restarting one (PostgreSQL:
//! `pg_ctlcluster .. restart`; MariaDB: `mysqladmin shutdown`, then `mariadbd` started again)
//! and bringing it back up whatever happened ([`UpGuard`]). Used by the chaos suites that
//! restart a server (`zz_chaos_restart`, `zz_chaos_matrix`).

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::Db;

/// How long a server may take to come back up (or a MariaDB server to go away).
pub const UP: Duration = Duration::from_secs(90);

const MARIADBD: &str = "/usr/sbin/mariadbd";

fn say(msg: &str) {
    // Straight to the process's stderr: the test harness captures `eprintln!`.
    let _ = writeln!(std::io::stderr(), "{msg}");
}

/// Runs a command with no stdio of ours: a daemon it starts must not hold our pipes open.
pub fn run(cmd: &str, args: &[&str]) -> bool {
    match Command::new(cmd)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
    {
        Ok(s) => s.success(),
        Err(e) => {
            say(&format!("server: could not run {cmd}: {e}"));
            false
        }
    }
}

/// The version of the local PostgreSQL cluster (`/etc/postgresql/<version>`).
pub fn pg_version() -> String {
    std::fs::read_dir("/etc/postgresql")
        .ok()
        .and_then(|mut d| d.next())
        .and_then(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .unwrap_or_else(|| "15".into())
}

/// The local server of `db`: up?, start, restart.
#[derive(Debug, Clone, Copy)]
pub struct Server(pub Db);

impl Server {
    pub fn up(self) -> bool {
        match self.0 {
            Db::Postgres => run("pg_isready", &["-q", "-h", "127.0.0.1", "-p", "5432"]),
            _ => run(
                "mysqladmin",
                &["--protocol=tcp", "-h127.0.0.1", "-uroot", "ping"],
            ),
        }
    }

    pub fn wait_up(self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if self.up() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        self.up()
    }

    pub fn start(self) -> bool {
        match self.0 {
            Db::Postgres => run(
                "pg_ctlcluster",
                &["--skip-systemctl-redirect", &pg_version(), "main", "start"],
            ),
            _ => run(
                "start-stop-daemon",
                &[
                    "--start",
                    "--oknodo",
                    "--background",
                    "--exec",
                    MARIADBD,
                    "--",
                    "--user=mysql",
                ],
            ),
        }
    }

    /// True once no `mariadbd` process is left (always true for PostgreSQL).
    fn gone(self, timeout: Duration) -> bool {
        self.0 != Db::Mysql
            || super::wait_for(timeout, || {
                !run("start-stop-daemon", &["--status", "--exec", MARIADBD])
            })
    }

    /// Restarts the server; true once the restart command has done its part (not yet up).
    pub fn restart(self) -> bool {
        match self.0 {
            Db::Postgres => run(
                "pg_ctlcluster",
                &[
                    "--skip-systemctl-redirect",
                    &pg_version(),
                    "main",
                    "restart",
                ],
            ),
            _ => {
                if !run(
                    "mysqladmin",
                    &["--protocol=tcp", "-h127.0.0.1", "-uroot", "shutdown"],
                ) {
                    return false;
                }
                // Over TCP mysqladmin does not wait for the process: a second mariadbd started
                // while the first still holds the data files would fail.
                self.gone(UP) && self.start()
            }
        }
    }
}

/// Brings the server back up when dropped, whatever happened.
pub struct UpGuard(pub Server);

impl Drop for UpGuard {
    fn drop(&mut self) {
        if self.0.up() {
            return;
        }
        say(&format!(
            "server: {:?} is down, starting it again",
            self.0 .0
        ));
        // MariaDB may still be shutting down: start once the old process is gone.
        self.0.gone(UP);
        self.0.start();
        if !self.0.wait_up(UP) {
            say(&format!(
                "\n!!!!! server: {:?} did not come back up within {UP:?}: start it by hand !!!!!\n",
                self.0 .0
            ));
        }
    }
}
