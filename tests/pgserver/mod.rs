//! PostgreSQL clusters and PgBouncers of a test's own, in a scratch folder, on ports of their
//! own: Debian's PostgreSQL binaries (`initdb`, `pg_ctl`, `pg_basebackup`) and `pgbouncer`,
//! run as the `postgres` user when the test runs as root (both refuse root). Everything a
//! [`Scratch`] started is stopped (SIGKILL if need be) and its folder removed when it drops.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// Where Debian installs a PostgreSQL major's binaries, newest first.
fn pg_bin() -> Option<PathBuf> {
    if let Ok(dir) = std::env::var("SQLBROKER_PG_BIN") {
        return Some(PathBuf::from(dir));
    }
    let mut majors: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| Some(e.ok()?.path().join("bin")))
        .filter(|p| p.join("initdb").is_file() && p.join("pg_basebackup").is_file())
        .collect();
    majors.sort();
    majors.pop()
}

fn pgbouncer_bin() -> Option<PathBuf> {
    ["/usr/sbin/pgbouncer", "/usr/bin/pgbouncer"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// A scratch folder and the servers started in it.
pub struct Scratch {
    pub dir: PathBuf,
    bin: PathBuf,
    root: bool,
    /// Data dirs of clusters that may be running.
    clusters: Vec<PathBuf>,
    /// Pid files of PgBouncers that may be running.
    bouncers: Vec<PathBuf>,
    /// Clusters killed: their pid files are stale, never to be signalled again.
    killed: Vec<PathBuf>,
}

/// One cluster.
#[derive(Clone)]
pub struct Cluster {
    pub data: PathBuf,
    pub port: u16,
}

impl Cluster {
    /// A URL to this cluster's `postgres` database.
    pub fn url(&self) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{}/postgres?sslmode=disable",
            self.port
        )
    }
}

impl Scratch {
    /// A scratch folder, or `None` when the binaries are missing (the caller skips, or fails
    /// under `SQLBROKER_REQUIRE_SERVERS=1`: see `common::unmet`).
    pub fn new(name: &str, need_bouncer: bool) -> Result<Scratch, String> {
        let bin = pg_bin().ok_or("PostgreSQL's server binaries (initdb) are not installed")?;
        if need_bouncer && pgbouncer_bin().is_none() {
            return Err("pgbouncer is not installed (apt-get install pgbouncer)".into());
        }
        let dir = std::env::temp_dir().join(format!("sqlbroker-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let root = is_root();
        let s = Scratch {
            dir,
            bin,
            root,
            clusters: Vec::new(),
            bouncers: Vec::new(),
            killed: Vec::new(),
        };
        if root {
            s.must(Command::new("chown").arg("postgres:postgres").arg(&s.dir));
        }
        Ok(s)
    }

    /// A command run as the servers' user.
    fn cmd(&self, program: &Path) -> Command {
        if self.root {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(program);
            c
        } else {
            Command::new(program)
        }
    }

    fn must(&self, c: &mut Command) -> Output {
        let out = c.output().unwrap_or_else(|e| panic!("{c:?}: {e}"));
        assert!(
            out.status.success(),
            "{c:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    fn write(&self, path: &Path, text: &str) {
        std::fs::write(path, text).unwrap();
        if self.root {
            self.must(Command::new("chown").arg("postgres:postgres").arg(path));
        }
    }

    /// A new primary on `port`, started; `conf` is added to its `postgresql.conf`.
    pub fn primary(&mut self, name: &str, port: u16, conf: &str) -> Cluster {
        let data = self.dir.join(name);
        self.must(
            self.cmd(&self.bin.join("initdb"))
                .args(["-A", "trust", "-U", "postgres", "--no-sync", "-D"])
                .arg(&data),
        );
        let c = Cluster { data, port };
        self.configure(&c, conf);
        self.start(&c);
        c
    }

    fn configure(&self, c: &Cluster, conf: &str) {
        let base = format!(
            "port = {}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{}'\n\
             max_connections = 60\nfsync = off\nwal_level = replica\nmax_wal_senders = 5\n\
             hot_standby = on\nwal_sender_timeout = 5s\nwal_receiver_timeout = 5s\n\
             log_min_messages = warning\n{conf}\n",
            c.port,
            self.dir.display()
        );
        let path = c.data.join("postgresql.conf");
        let old = std::fs::read_to_string(&path).unwrap_or_default();
        self.write(&path, &format!("{old}\n{base}"));
    }

    /// A streaming standby of `primary` (`pg_basebackup -R`) on `port`, started.
    pub fn standby(&mut self, primary: &Cluster, name: &str, port: u16) -> Cluster {
        let data = self.dir.join(name);
        self.must(
            self.cmd(&self.bin.join("pg_basebackup"))
                .args([
                    "-h",
                    "127.0.0.1",
                    "-U",
                    "postgres",
                    "-X",
                    "stream",
                    "-R",
                    "-p",
                ])
                .arg(primary.port.to_string())
                .arg("-D")
                .arg(&data),
        );
        let c = Cluster { data, port };
        // The primary's configuration came along; the port is the standby's own.
        self.configure(&c, "");
        self.start(&c);
        c
    }

    pub fn start(&mut self, c: &Cluster) {
        self.must(
            self.cmd(&self.bin.join("pg_ctl"))
                .args(["-w", "-t", "60", "-l"])
                .arg(c.data.join("log"))
                .arg("-D")
                .arg(&c.data)
                .arg("start"),
        );
        if !self.clusters.contains(&c.data) {
            self.clusters.push(c.data.clone());
        }
    }

    /// The postmaster's pid.
    pub fn pid(&self, c: &Cluster) -> Option<i32> {
        std::fs::read_to_string(c.data.join("postmaster.pid"))
            .ok()?
            .lines()
            .next()?
            .trim()
            .parse()
            .ok()
    }

    /// SIGKILL to the postmaster and every backend of the cluster (a machine lost).
    pub fn kill9(&mut self, c: &Cluster) {
        if self.killed.contains(&c.data) {
            return;
        }
        self.killed.push(c.data.clone());
        if let Some(pid) = self.pid(c) {
            // The children first (they would otherwise go on serving their sessions).
            let _ = Command::new("pkill")
                .args(["-9", "-P"])
                .arg(pid.to_string())
                .status();
            let _ = Command::new("kill")
                .args(["-9"])
                .arg(pid.to_string())
                .status();
        }
    }

    pub fn promote(&self, c: &Cluster) {
        self.must(
            self.cmd(&self.bin.join("pg_ctl"))
                .args(["-w", "-t", "60", "-D"])
                .arg(&c.data)
                .arg("promote"),
        );
    }

    /// `sql` through psql on the cluster.
    pub fn psql(&self, c: &Cluster, sql: &str) -> String {
        let out = self.must(
            Command::new(self.bin.join("psql"))
                .args([
                    "-h",
                    "127.0.0.1",
                    "-U",
                    "postgres",
                    "-d",
                    "postgres",
                    "-Atqc",
                    sql,
                    "-p",
                ])
                .arg(c.port.to_string()),
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// A PgBouncer on `port` in front of `c`, in `mode` (`session`, `transaction`), with
    /// `extra` lines in its `[pgbouncer]` section; otherwise its defaults.
    pub fn bouncer(&mut self, name: &str, port: u16, c: &Cluster, mode: &str, extra: &str) {
        let users = self.dir.join(format!("{name}.users"));
        self.write(&users, "\"postgres\" \"\"\n");
        let pidfile = self.dir.join(format!("{name}.pid"));
        let ini = self.dir.join(format!("{name}.ini"));
        self.write(
            &ini,
            &format!(
                "[databases]\n* = host=127.0.0.1 port={}\n[pgbouncer]\nlisten_addr = 127.0.0.1\n\
                 listen_port = {port}\nunix_socket_dir =\nauth_type = trust\nauth_file = {}\n\
                 pool_mode = {mode}\nlogfile = {}\npidfile = {}\nmax_client_conn = 200\n\
                 default_pool_size = 20\n{extra}\n",
                c.port,
                users.display(),
                self.dir.join(format!("{name}.log")).display(),
                pidfile.display()
            ),
        );
        self.must(self.cmd(&pgbouncer_bin().unwrap()).arg("-d").arg(&ini));
        self.bouncers.push(pidfile);
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "pgbouncer did not listen on {port}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        for pidfile in &self.bouncers {
            if let Some(pid) = std::fs::read_to_string(pidfile)
                .ok()
                .and_then(|p| p.trim().parse::<i32>().ok())
            {
                let _ = Command::new("kill")
                    .args(["-9"])
                    .arg(pid.to_string())
                    .status();
            }
        }
        let live: Vec<PathBuf> = self
            .clusters
            .iter()
            .filter(|d| !self.killed.contains(d))
            .cloned()
            .collect();
        for data in &live {
            let _ = self
                .cmd(&self.bin.join("pg_ctl"))
                .args(["-m", "immediate", "-w", "-t", "20", "-D"])
                .arg(data)
                .arg("stop")
                .output();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
