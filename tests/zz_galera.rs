//! MariaDB Galera, three nodes on this machine, built and torn down by the test itself
//! (`mariadbd` processes of its own, datadirs in a scratch folder, client ports 23321-23323,
//! group communication 24541-24543, IST 24551-24553, SST 24561-24563; rsync SST).
//!
//! 1. Detection and refusals: on the cluster, a subscription in the row lock form, the advisory
//!    lock form or with FIFO groups is refused with `ClusterUnsafe`, the lease form starts; with
//!    `galera_single_writer(true)` everything starts.
//! 2. Node-local guards, seen: with the single-writer declaration falsely made and brokers on
//!    two nodes, the row lock form and the advisory lock form deliver one row on both nodes at
//!    once (what the refusal protects against); the lease form does not (its claims conflict
//!    at commit).
//! 3. Ledgers, one per accepted form: the lease form with brokers on all three nodes; the row
//!    lock form, the advisory lock form and lease FIFO groups with three brokers writing
//!    through node 1 (declared). Mid-run node 3 is killed with SIGKILL and started again (it
//!    rejoins by IST). Then: every job whose publish returned Ok was delivered, and its last
//!    delivery's ack returned Ok, or lost its connection (it may have committed: the table
//!    says it did); a job delivered more than once was delivered again only after a delivery
//!    whose ack did not return success (at-least-once), and never while another delivery of
//!    it was in work; acks through the nodes that stayed up failed only as `LeaseLost`, or with
//!    the transient error of a node out of the primary component (the cluster's refusal, not
//!    the broker's failure); the table is empty on every node; FIFO groups ran one row at a
//!    time in publish order. The recovery times are printed.
//!
//! A slow suite (about two minutes): it runs with `SQLBROKER_SLOW_TESTS=1` or
//! `SQLBROKER_REQUIRE_SERVERS=1`, and says loudly that it was skipped otherwise.
//! Skipped loudly when galera, `mariadbd`, `mariadb-install-db` or `rsync` is missing, unless
//! `SQLBROKER_REQUIRE_SERVERS=1` (then it fails; `.ci/run` installs them).
#![cfg(feature = "mysql")]

use std::collections::{BTreeMap, HashSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mysql::prelude::Queryable;
use sqlbroker::{Broker, BrokerError, DbErrorKind, Message, Subscription, Table};

// Below the kernel's ephemeral range (32768-60999): a port from that range can be held by any
// outgoing connection of the tests before it (one CI run lost node 3's rsync state transfer,
// whose daemon listens on such a port, with both joiners starting at once).
const CLIENT: u16 = 23321;
const GCOMM: u16 = 24541;
const IST: u16 = 24551;
const SST: u16 = 24561;
const UP: Duration = Duration::from_secs(120);
/// Longer than the longest pause a node's death causes (9-14 s measured: the survivors wait
/// for the dead node until they evict it): a lease that ran out during it would let a second
/// broker take a row whose first delivery is still in its handler.
const LEASE: Duration = Duration::from_secs(20);
/// The publisher goes on until this long after node 3 has rejoined (at most `MAX_JOBS`).
const AFTER_REJOIN: Duration = Duration::from_secs(3);
const MAX_JOBS: usize = 20_000;
const GROUPS: usize = 8;

fn say(msg: &str) {
    // Straight to the process's stderr: the test harness captures `eprintln!`.
    let _ = writeln!(std::io::stderr(), "{msg}");
}

fn require() -> bool {
    std::env::var("SQLBROKER_REQUIRE_SERVERS").is_ok_and(|v| v == "1")
}

fn find(candidates: &[&str]) -> Option<PathBuf> {
    candidates.iter().map(PathBuf::from).find(|p| p.exists())
}

/// The programs the cluster needs, or why it cannot be built.
struct Tools {
    mariadbd: PathBuf,
    install_db: PathBuf,
    provider: PathBuf,
}

fn tools() -> Result<Tools, String> {
    let provider = find(&[
        "/usr/lib/galera/libgalera_smm.so",
        "/usr/lib/galera-4/libgalera_smm.so",
        "/usr/lib64/galera-4/libgalera_smm.so",
        "/usr/lib64/galera/libgalera_smm.so",
    ])
    .ok_or("galera (libgalera_smm.so) is not installed: apt-get install galera-4")?;
    let mariadbd = find(&["/usr/sbin/mariadbd", "/usr/bin/mariadbd"]).ok_or("no mariadbd")?;
    let install_db = find(&[
        "/usr/bin/mariadb-install-db",
        "/usr/scripts/mariadb-install-db",
    ])
    .ok_or("no mariadb-install-db")?;
    find(&["/usr/bin/rsync"]).ok_or("rsync (the SST method) is not installed")?;
    Ok(Tools {
        mariadbd,
        install_db,
        provider,
    })
}

/// Three nodes; every process it started is killed and its folder removed when it drops.
struct Cluster {
    root: PathBuf,
    tools: Tools,
    nodes: Vec<Option<Child>>,
}

impl Cluster {
    /// The cluster, up with three synced nodes; `None` when the tools are missing and servers
    /// are not required.
    fn build() -> Option<Cluster> {
        let slow = std::env::var("SQLBROKER_SLOW_TESTS").is_ok_and(|v| v == "1");
        if !slow && !require() {
            say("\n!!!!! SKIPPED: the Galera tests: a slow suite; set SQLBROKER_SLOW_TESTS=1 to run \
                 them (.ci/run runs them) !!!!!\n");
            return None;
        }
        let tools = match tools() {
            Ok(t) => t,
            Err(why) if require() => panic!("SQLBROKER_REQUIRE_SERVERS=1 but {why}"),
            Err(why) => {
                say(&format!("\n!!!!! SKIPPED: the Galera tests: {why} !!!!!\n"));
                return None;
            }
        };
        let root = std::env::temp_dir().join(format!("sqlbroker-galera-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let mut c = Cluster {
            root,
            tools,
            nodes: vec![None, None, None],
        };
        let started = Instant::now();
        for i in 0..3 {
            c.configure(i);
        }
        c.install(0);
        for i in 1..3 {
            copy_dir(&c.data(0), &c.data(i));
        }
        chown(&c.root);
        c.start(0, true);
        c.wait_synced(0, 1);
        // One joiner at a time: each takes its full state transfer from a synced donor.
        c.start(1, false);
        c.wait_synced(1, 2);
        c.start(2, false);
        c.wait_synced(2, 3);
        c.wait_synced(1, 3);
        say(&format!(
            "galera: three nodes up in {:.1}s",
            started.elapsed().as_secs_f64()
        ));
        Some(c)
    }

    fn dir(&self, i: usize) -> PathBuf {
        self.root.join(format!("n{}", i + 1))
    }

    fn data(&self, i: usize) -> PathBuf {
        self.dir(i).join("data")
    }

    fn port(i: usize) -> u16 {
        CLIENT + i as u16
    }

    fn url(&self, i: usize) -> String {
        format!("mysql://root@127.0.0.1:{}/test", Cluster::port(i))
    }

    fn configure(&self, i: usize) {
        let dir = self.dir(i);
        std::fs::create_dir_all(self.data(i)).expect("node dir");
        let peers: Vec<String> = (0..3)
            .map(|j| format!("127.0.0.1:{}", GCOMM + j as u16))
            .collect();
        let n = i as u16;
        let cnf = format!(
            "[mysqld]\nuser=mysql\ndatadir={data}\nsocket={dir}/sock\npid-file={dir}/pid\n\
             port={port}\nbind-address=127.0.0.1\nlog-error={dir}/err.log\nbinlog_format=ROW\n\
             default_storage_engine=InnoDB\ninnodb_autoinc_lock_mode=2\n\
             innodb_buffer_pool_size=64M\ninnodb_log_file_size=32M\nperformance_schema=OFF\n\
             max_connections=300\nwsrep_on=ON\nwsrep_provider={provider}\n\
             wsrep_cluster_name=sqlbroker_test\nwsrep_cluster_address=gcomm://{peers}\n\
             wsrep_node_address=127.0.0.1:{gcomm}\nwsrep_node_name=n{name}\n\
             wsrep_provider_options=\"gmcast.listen_addr=tcp://127.0.0.1:{gcomm};\
             ist.recv_addr=127.0.0.1:{ist};gcache.size=128M\"\n\
             wsrep_sst_receive_address=127.0.0.1:{sst}\nwsrep_sst_method=rsync\n",
            data = self.data(i).display(),
            dir = dir.display(),
            port = Cluster::port(i),
            provider = self.tools.provider.display(),
            peers = peers.join(","),
            gcomm = GCOMM + n,
            name = i + 1,
            ist = IST + n,
            sst = SST + n,
        );
        std::fs::write(dir.join("my.cnf"), cnf).expect("my.cnf");
    }

    fn install(&self, i: usize) {
        chown(&self.root);
        let out = Command::new(&self.tools.install_db)
            .arg("--no-defaults")
            .arg("--user=mysql")
            .arg(format!("--datadir={}", self.data(i).display()))
            .arg("--auth-root-authentication-method=normal")
            .stdin(Stdio::null())
            .output()
            .expect("mariadb-install-db");
        assert!(
            out.status.success(),
            "mariadb-install-db failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Starts node `i` (`new_cluster`: bootstraps the cluster on it).
    fn start(&mut self, i: usize, new_cluster: bool) {
        let mut cmd = Command::new(&self.tools.mariadbd);
        cmd.arg(format!(
            "--defaults-file={}",
            self.dir(i).join("my.cnf").display()
        ));
        if new_cluster {
            cmd.arg("--wsrep-new-cluster");
        }
        let log = std::fs::File::create(self.dir(i).join("out.log")).expect("log");
        let child = cmd
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("start mariadbd");
        self.nodes[i] = Some(child);
    }

    /// Starts node `i` again after a crash the way the packaged service does
    /// (`galera_recovery`): `--wsrep-recover` reads the last committed position from InnoDB,
    /// and the node starts from it, so it rejoins by IST (the writes it missed, from a peer's
    /// cache) instead of a full SST, which would block its donor.
    fn restart(&mut self, i: usize) {
        let log = self.dir(i).join("recover.log");
        let _ = std::fs::remove_file(&log);
        let out = Command::new(&self.tools.mariadbd)
            .arg(format!(
                "--defaults-file={}",
                self.dir(i).join("my.cnf").display()
            ))
            .arg("--wsrep-recover")
            .arg(format!("--log-error={}", log.display()))
            .stdin(Stdio::null())
            .output()
            .expect("mariadbd --wsrep-recover");
        assert!(out.status.success(), "--wsrep-recover failed");
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let position = text
            .lines()
            .filter_map(|l| l.split("Recovered position: ").nth(1))
            .next_back()
            .map(|p| p.trim().to_string());
        let mut cmd = Command::new(&self.tools.mariadbd);
        cmd.arg(format!(
            "--defaults-file={}",
            self.dir(i).join("my.cnf").display()
        ));
        if let Some(p) = position {
            cmd.arg(format!("--wsrep-start-position={p}"));
        }
        let log = std::fs::File::create(self.dir(i).join("out.log")).expect("log");
        let child = cmd
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("start mariadbd");
        self.nodes[i] = Some(child);
    }

    /// How many full state transfers node `i` has received (its error log; an IST logs
    /// "rsync IST completed on joiner").
    fn ssts(&self, i: usize) -> usize {
        std::fs::read_to_string(self.dir(i).join("err.log"))
            .unwrap_or_default()
            .matches("SST completed on joiner")
            .count()
    }

    /// SIGKILL to node `i`'s `mariadbd`, and waits for it to end.
    fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.nodes[i].take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// A status value of node `i`, if it answers.
    fn status(&self, i: usize, name: &str) -> Option<String> {
        let opts = mysql::OptsBuilder::new()
            .ip_or_hostname(Some("127.0.0.1"))
            .tcp_port(Cluster::port(i))
            .user(Some("root"))
            .tcp_connect_timeout(Some(Duration::from_secs(2)));
        let mut c = mysql::Conn::new(opts).ok()?;
        let row: Option<(String, String)> = c
            .query_first(format!("SHOW GLOBAL STATUS LIKE '{name}'"))
            .ok()?;
        row.map(|r| r.1)
    }

    /// Waits until node `i` is synced in a primary component of `size` nodes.
    fn wait_synced(&self, i: usize, size: usize) -> Duration {
        let t = Instant::now();
        while t.elapsed() < UP {
            let synced = self.status(i, "wsrep_local_state_comment").as_deref() == Some("Synced");
            let n = self.status(i, "wsrep_cluster_size");
            if synced && n == Some(size.to_string()) {
                return t.elapsed();
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        let log = std::fs::read_to_string(self.dir(i).join("err.log")).unwrap_or_default();
        let errors: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("[ERROR]") || l.contains("WSREP_SST"))
            .take(40)
            .collect();
        let tail: Vec<&str> = log.lines().rev().take(30).collect();
        panic!(
            "galera node {} not synced in a cluster of {size} within {UP:?}; its errors:\n{}\n\
             its log ends:\n{}",
            i + 1,
            errors.join("\n"),
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    }

    /// The lines of node `i`'s error log.
    fn log_lines(&self, i: usize) -> Vec<String> {
        std::fs::read_to_string(self.dir(i).join("err.log"))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// Certification failures plus brute-force aborts on node `i` since it started.
    fn conflicts(&self, i: usize) -> u64 {
        ["wsrep_local_cert_failures", "wsrep_local_bf_aborts"]
            .iter()
            .map(|v| {
                self.status(i, v)
                    .and_then(|s| s.parse::<u64>().ok())
                    .unwrap_or(0)
            })
            .sum()
    }

    /// The rows of `jobs` (by payload) as node `i` has them: id, attempts, lease, dead.
    fn dump(&self, i: usize, table: &str, jobs: &[usize]) -> String {
        let Ok(opts) = mysql::Opts::from_url(&self.url(i)) else {
            return String::new();
        };
        let Ok(mut c) = mysql::Conn::new(opts) else {
            return format!("node {} down", i + 1);
        };
        let list: Vec<String> = jobs.iter().map(|j| format!("'{j}'")).collect();
        type Row = (i64, i64, Option<String>, Option<String>, Option<String>);
        let rows: Vec<Row> = c
            .query(format!(
                "SELECT id, attempts, CAST(locked_until AS CHAR), CAST(dead_at AS CHAR), \
                 CAST(run_at AS CHAR) FROM `{table}` WHERE payload IN ({})",
                list.join(",")
            ))
            .unwrap_or_default();
        format!(
            "node {}: {rows:?} (now {:?})",
            i + 1,
            std::time::SystemTime::now()
        )
    }

    /// Rows of `table` seen by node `i` once it has applied everything committed before.
    fn rows(&self, i: usize, table: &str) -> i64 {
        let opts = mysql::Opts::from_url(&self.url(i)).expect("url");
        let mut c = mysql::Conn::new(opts).expect("connect to node");
        c.query_drop("SET SESSION wsrep_sync_wait = 1")
            .expect("sync wait");
        c.query_first::<i64, _>(format!("SELECT COUNT(*) FROM `{table}`"))
            .expect("count")
            .unwrap_or(-1)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for i in 0..3 {
            self.kill(i);
        }
        if std::thread::panicking() {
            // The nodes' logs, for the failure's reader.
            say(&format!(
                "galera: the nodes' folders are kept in {}",
                self.root.display()
            ));
        } else {
            let _ = std::fs::remove_dir_all(&self.root);
        }
    }
}

fn chown(p: &Path) {
    let _ = Command::new("chown")
        .arg("-R")
        .arg("mysql:mysql")
        .arg(p)
        .status();
}

fn copy_dir(from: &Path, to: &Path) {
    let _ = std::fs::remove_dir_all(to);
    let ok = Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .expect("cp")
        .success();
    assert!(ok, "copying the datadir failed");
}

fn broker(url: &str, single_writer: bool) -> Broker {
    Broker::builder(url)
        .pool_size(12)
        .connection_timeout(Duration::from_secs(3))
        .statement_timeout(Duration::from_secs(5))
        .galera_single_writer(single_writer)
        .build()
        .expect("broker on a galera node")
}

static N: AtomicUsize = AtomicUsize::new(0);

fn name(prefix: &str) -> String {
    format!(
        "{prefix}_{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// The forms a test runs, as tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Lease,
    RowLock,
    Advisory,
    FifoLease,
}

fn describe(kind: Kind) -> Table {
    let n = name(match kind {
        Kind::Lease => "gl",
        Kind::RowLock => "gr",
        Kind::Advisory => "ga",
        Kind::FifoLease => "gf",
    });
    let t = Table::new(n.as_str()).text_column("k").text_column("g");
    match kind {
        Kind::Lease => t.lease(LEASE),
        Kind::RowLock => t,
        Kind::Advisory => t.advisory_lock(format!("{n}-{{k}}")),
        Kind::FifoLease => t.group("g").fifo().lease(LEASE),
    }
}

#[test]
fn galera_three_nodes() {
    let Some(mut cluster) = Cluster::build() else {
        return;
    };
    let started = Instant::now();
    refusals(&cluster);
    node_local_guards(&cluster);
    let mut report = Vec::new();
    for (kind, nodes) in [
        (Kind::Lease, [0, 1, 2]),
        (Kind::RowLock, [0, 0, 0]),
        (Kind::Advisory, [0, 0, 0]),
        (Kind::FifoLease, [0, 0, 0]),
    ] {
        let line = ledger(&mut cluster, kind, nodes);
        say(&line);
        report.push(line);
    }
    say(&format!(
        "galera: tests took {:.0}s after the cluster was up",
        started.elapsed().as_secs_f64()
    ));
    for line in report {
        say(&line);
    }
}

/// Detection: what is refused on the cluster without the declaration, and that nothing is
/// with it.
fn refusals(cluster: &Cluster) {
    let plain = broker(&cluster.url(1), false);
    let declared = broker(&cluster.url(1), true);
    for kind in [Kind::Lease, Kind::RowLock, Kind::Advisory, Kind::FifoLease] {
        let t = describe(kind);
        plain.create_table(&t).expect("create table");
        match plain.subscription(&t).start() {
            Ok(sub) => {
                assert_eq!(
                    kind,
                    Kind::Lease,
                    "{kind:?} started on a multi-writer cluster"
                );
                sub.close();
            }
            Err(e @ BrokerError::ClusterUnsafe { nodes: 3, .. }) => {
                assert_ne!(kind, Kind::Lease, "the lease form was refused: {e}");
                assert!(!e.is_transient(), "{e}");
                assert!(e.to_string().contains("galera_single_writer"), "{e}");
            }
            Err(e) => panic!("{kind:?}: {e}"),
        }
        let sub = declared
            .subscription(&t)
            .start()
            .unwrap_or_else(|e| panic!("{kind:?} with the declaration: {e}"));
        sub.close();
    }
    say("galera: refusals as documented");
}

/// One row, one delivery held through node 1: can a broker on node 2 take the same row? With
/// the single-writer declaration falsely made, the row lock and advisory forms say yes (their
/// guards are node-local); the lease form says no.
fn node_local_guards(cluster: &Cluster) {
    for kind in [Kind::RowLock, Kind::Advisory, Kind::Lease] {
        let a = broker(&cluster.url(0), true);
        let b = broker(&cluster.url(1), true);
        let t = describe(kind);
        a.create_table(&t).expect("create table");
        a.publish(&t, Message::new(b"only".to_vec()).set("k", "one"))
            .expect("publish");
        let sa = a
            .subscription(&t)
            .workers(1)
            .start()
            .expect("start on node 1");
        let held = sa
            .next_delivery_timeout(Duration::from_secs(10))
            .expect("node 1 takes the row");
        // Let the claim's writes reach node 2 (the row lock form commits none yet).
        std::thread::sleep(Duration::from_millis(500));
        let sb = b
            .subscription(&t)
            .workers(1)
            .start()
            .expect("start on node 2");
        let twice = sb.next_delivery_timeout(Duration::from_secs(2));
        match kind {
            Kind::Lease => assert!(
                twice.is_err(),
                "the lease form delivered a leased row again on another node"
            ),
            _ => {
                let d = twice.unwrap_or_else(|e| {
                    panic!("{kind:?}: node 2 did not take the row node 1 holds: {e:?}")
                });
                assert_eq!(d.id(), held.id());
                drop(d);
            }
        }
        let _ = held.ack();
        sb.close();
        sa.close();
    }
    say("galera: row locks and GET_LOCK keys are node-local; a lease holds across nodes");
}

/// One delivery: which job, on which broker, when it started, whether its ack returned Ok.
struct Rec {
    job: usize,
    broker: usize,
    started: Instant,
    acked: bool,
    /// The ack failed with a lost connection: it may have committed before its answer was
    /// lost (the row is then gone, and the job was done).
    maybe: bool,
    /// The ack's error, if it failed, and whether it was `LeaseLost`.
    error: Option<(String, bool)>,
    /// The ack failed because its node was out of the primary component (a transient error
    /// naming it): the cluster refused the write, the broker did not fail it.
    out_of_primary: bool,
}

/// A transient error that says the node was not in the primary component: 1047 ("WSREP has
/// not yet prepared node for application use"), or a commit refused with "Not connected to
/// Primary Component". Anything else, a certification conflict included, is not.
fn out_of_primary(e: &BrokerError) -> bool {
    let text = e.to_string();
    e.is_transient()
        && (text.contains("Primary Component") || text.contains("WSREP has not yet prepared"))
}

#[derive(Default)]
struct Ledger {
    recs: Mutex<Vec<Rec>>,
    in_work: Mutex<HashSet<usize>>,
    groups_in_work: Mutex<HashSet<usize>>,
    /// Deliveries that began while another delivery of their job was in work: (job, broker,
    /// attempt).
    overlaps: Mutex<Vec<(usize, usize, u32)>>,
    group_overlaps: AtomicUsize,
    /// Acks with success per group, in the order they returned: (job, group).
    group_acks: Mutex<BTreeMap<usize, Vec<usize>>>,
}

fn handle(ledger: &Ledger, sub: &Subscription, who: usize, stop: &AtomicBool, fifo: bool) {
    while !stop.load(Ordering::Relaxed) {
        let Ok(d) = sub.next_delivery_timeout(Duration::from_millis(200)) else {
            continue;
        };
        let started = Instant::now();
        let job: usize = std::str::from_utf8(d.payload())
            .ok()
            .and_then(|s| s.parse().ok())
            .expect("payload is a job number");
        let group = job % GROUPS;
        if !ledger.in_work.lock().unwrap().insert(job) {
            ledger
                .overlaps
                .lock()
                .unwrap()
                .push((job, who, d.attempt()));
        }
        if fifo && !ledger.groups_in_work.lock().unwrap().insert(group) {
            ledger.group_overlaps.fetch_add(1, Ordering::Relaxed);
        }
        std::thread::sleep(Duration::from_millis(20));
        if fifo {
            ledger.groups_in_work.lock().unwrap().remove(&group);
        }
        ledger.in_work.lock().unwrap().remove(&job);
        // The group is free once the ack is written: recorded before it returns would race
        // the next head's delivery.
        let result = d.ack();
        let acked = result.is_ok();
        if acked && fifo {
            ledger
                .group_acks
                .lock()
                .unwrap()
                .entry(group)
                .or_default()
                .push(job);
        }
        ledger.recs.lock().unwrap().push(Rec {
            job,
            broker: who,
            started,
            acked,
            maybe: matches!(
                &result,
                Err(BrokerError::Database {
                    kind: DbErrorKind::ConnectionLost,
                    ..
                })
            ),
            out_of_primary: result.as_ref().err().is_some_and(out_of_primary),
            error: result.err().map(|e| (e.to_string(), e.is_lease_lost())),
        });
    }
}

/// A ledger run of `kind` with brokers on `nodes`; node 3 is killed and started again
/// mid-run. Returns the line of measurements to print.
fn ledger(cluster: &mut Cluster, kind: Kind, nodes: [usize; 3]) -> String {
    let single_writer = kind != Kind::Lease;
    let fifo = kind == Kind::FifoLease;
    let t = describe(kind);
    let brokers: Vec<Broker> = nodes
        .iter()
        .map(|&i| broker(&cluster.url(i), single_writer))
        .collect();
    brokers[0].create_table(&t).expect("create table");
    let conflicts_before: u64 = (0..2).map(|i| cluster.conflicts(i)).sum();
    let logged_before: Vec<usize> = (0..2).map(|i| cluster.log_lines(i).len()).collect();
    let ledger = Arc::new(Ledger::default());
    let stop = Arc::new(AtomicBool::new(false));
    let subs: Vec<Arc<Subscription>> = brokers
        .iter()
        .map(|b| {
            let s = b.subscription(&t).workers(2);
            let s = if single_writer && kind != Kind::FifoLease {
                s.max_in_flight(4)
            } else {
                s
            };
            Arc::new(s.start().expect("start"))
        })
        .collect();
    let mut threads = Vec::new();
    for (who, sub) in subs.iter().enumerate() {
        for _ in 0..2 {
            let (ledger, sub, stop) = (ledger.clone(), sub.clone(), stop.clone());
            threads.push(std::thread::spawn(move || {
                handle(&ledger, &sub, who, &stop, fifo)
            }));
        }
    }
    // The publisher: round-robin over the brokers (single writer: all on node 1), a pause
    // every 20 jobs so the run spans the kill. Ok publishes must be delivered; failed ones
    // may or may not have committed.
    let published = Arc::new(Mutex::new((Vec::new(), Vec::new())));
    let enough = Arc::new(AtomicBool::new(false));
    let publisher = {
        let (brokers, t, published) = (brokers.clone(), t.clone(), published.clone());
        let enough = enough.clone();
        std::thread::spawn(move || {
            for job in 0..MAX_JOBS {
                if enough.load(Ordering::Relaxed) {
                    break;
                }
                let b = &brokers[job % brokers.len()];
                let m = Message::new(job.to_string().into_bytes())
                    .set("k", format!("k{job}"))
                    .set("g", format!("g{}", job % GROUPS));
                let ok = b.publish(&t, m).is_ok();
                let mut p = published.lock().unwrap();
                if ok { &mut p.0 } else { &mut p.1 }.push(job);
                drop(p);
                if job % 10 == 9 {
                    std::thread::sleep(Duration::from_millis(150));
                }
            }
        })
    };
    std::thread::sleep(Duration::from_secs(2));
    let acked_before_kill = ledger
        .recs
        .lock()
        .unwrap()
        .iter()
        .filter(|r| r.acked)
        .count();
    let killed_at = Instant::now();
    cluster.kill(2);
    std::thread::sleep(Duration::from_secs(2));
    let ssts = cluster.ssts(2);
    let restarted_at = Instant::now();
    cluster.restart(2);
    let rejoin = cluster.wait_synced(2, 3);
    let transfer = if cluster.ssts(2) > ssts { "SST" } else { "IST" };
    std::thread::sleep(AFTER_REJOIN);
    enough.store(true, Ordering::Relaxed);
    publisher.join().expect("publisher");
    let (ok, uncertain) = published.lock().unwrap().clone();
    let ok_set: HashSet<usize> = ok.iter().copied().collect();
    // Every job published with success done (acked, or its ack's answer lost with its
    // connection) and the table empty, within a bound.
    let finish = Instant::now();
    let all_done = || {
        let recs = ledger.recs.lock().unwrap();
        let done: HashSet<usize> = recs
            .iter()
            .filter(|r| r.acked || r.maybe)
            .map(|r| r.job)
            .collect();
        ok_set.is_subset(&done)
    };
    while !(all_done() && cluster.rows(0, t.name()) == 0)
        && finish.elapsed() < Duration::from_secs(90)
    {
        std::thread::sleep(Duration::from_millis(200));
    }
    // A delivery claimed but not yet handled would show up now.
    std::thread::sleep(Duration::from_secs(2));
    stop.store(true, Ordering::Relaxed);
    for th in threads {
        th.join().expect("handler thread");
    }
    for s in &subs {
        s.close();
    }
    let recs = std::mem::take(&mut *ledger.recs.lock().unwrap());
    let label = format!("{kind:?} on nodes {nodes:?}");

    // Nothing lost: every job published with success was delivered, and its last delivery's
    // ack returned Ok or lost its connection (maybe committed: the empty table below says
    // it did).
    let done: HashSet<usize> = recs
        .iter()
        .filter(|r| r.acked || r.maybe)
        .map(|r| r.job)
        .collect();
    let lost: Vec<usize> = ok.iter().copied().filter(|j| !done.contains(j)).collect();
    if !lost.is_empty() {
        let seen: Vec<String> = recs
            .iter()
            .filter(|r| lost.contains(&r.job))
            .map(|r| format!("job {} on broker {}, ack {:?}", r.job, r.broker, r.error))
            .collect();
        let rows: Vec<String> = (0..3).map(|i| cluster.dump(i, t.name(), &lost)).collect();
        panic!("{label}: jobs lost: {lost:?}; deliveries {seen:?}; rows per node {rows:?}");
    }
    // Every duplicate explained: per job, in the order the deliveries started, every delivery
    // but the last has an ack that did not return success, and the last one's did (or lost
    // its connection, maybe committed).
    let mut by_job: BTreeMap<usize, Vec<&Rec>> = BTreeMap::new();
    for r in &recs {
        by_job.entry(r.job).or_default().push(r);
    }
    let mut duplicates = 0;
    for (job, mut ds) in by_job {
        ds.sort_by_key(|r| r.started);
        duplicates += ds.len() - 1;
        let acks: Vec<bool> = ds.iter().map(|r| r.acked).collect();
        let last = ds[ds.len() - 1];
        let explained = acks[..acks.len() - 1].iter().all(|a| !a) && (last.acked || last.maybe);
        assert!(
            explained || (!acks.contains(&true) && !ok_set.contains(&job)),
            "{label}: job {job} delivered {} times, ack results in order {acks:?} (brokers {:?}): \
             a delivery after a successful ack",
            ds.len(),
            ds.iter().map(|r| r.broker).collect::<Vec<_>>()
        );
    }
    let overlaps = ledger.overlaps.lock().unwrap().clone();
    assert!(
        overlaps.is_empty(),
        "{label}: a job was in work twice at once (job, broker, attempt): {overlaps:?}"
    );
    // Acks through nodes that stayed up failed only as lease losses (a lease that ran out
    // during a stall of the cluster), or as the transient error of a node the cluster had put
    // out of its primary component for a moment (seen in CI: as node 3 rejoined, the two
    // survivors fell into one-member components for about 2 s, refusing every write):
    // a certification conflict is retried, not reported.
    let refused = recs
        .iter()
        .filter(|r| nodes[r.broker] != 2 && r.out_of_primary)
        .count();
    let survivors_failed: Vec<&str> = recs
        .iter()
        .filter(|r| nodes[r.broker] != 2 && !r.out_of_primary)
        .filter_map(|r| r.error.as_ref())
        .filter(|(_, lease_lost)| !lease_lost)
        .map(|(e, _)| e.as_str())
        .collect();
    let maybe_committed = recs.iter().filter(|r| r.maybe).count();
    let lease_losses = recs
        .iter()
        .filter(|r| r.error.as_ref().is_some_and(|e| e.1))
        .count();
    assert!(
        survivors_failed.is_empty(),
        "{label}: acks through nodes that stayed up failed: {survivors_failed:?}"
    );
    if fifo {
        assert_eq!(
            ledger.group_overlaps.load(Ordering::Relaxed),
            0,
            "{label}: two rows of one group in work at once"
        );
        for (g, jobs) in ledger.group_acks.lock().unwrap().iter() {
            assert!(
                jobs.windows(2).all(|w| w[0] < w[1]),
                "{label}: group {g} acked out of publish order: {jobs:?}"
            );
        }
    }
    for i in 0..3 {
        assert_eq!(
            cluster.rows(i, t.name()),
            0,
            "{label}: rows left on node {}",
            i + 1
        );
    }
    // The run spanned the kill.
    let after: Vec<&Rec> = recs
        .iter()
        .filter(|r| r.acked && r.started > restarted_at + rejoin)
        .collect();
    assert!(
        acked_before_kill > 0 && !after.is_empty(),
        "{label}: the run did not span the kill ({acked_before_kill} acked before, {} after)",
        after.len()
    );
    // Recovery: from the kill to the first successful ack through node 3 (brokers on all
    // nodes), and the longest pause between successful acks anywhere.
    let mut ack_times: Vec<Instant> = recs.iter().filter(|r| r.acked).map(|r| r.started).collect();
    ack_times.sort();
    let gap = ack_times
        .windows(2)
        .filter(|w| w[1] > killed_at)
        .map(|w| w[1] - w[0])
        .max()
        .unwrap_or_default();
    let node3_back = recs
        .iter()
        .filter(|r| r.acked && nodes[r.broker] == 2 && r.started > restarted_at)
        .map(|r| r.started - killed_at)
        .min();
    if nodes.contains(&2) {
        assert!(
            node3_back.is_some(),
            "{label}: the broker on node 3 never acked after it rejoined"
        );
    }
    let conflicts: u64 = (0..2).map(|i| cluster.conflicts(i)).sum::<u64>() - conflicts_before;
    // What the surviving nodes said of their membership during the run: a view that is not
    // primary means the pair lost quorum (seen in CI; why is what these lines are for).
    let membership: Vec<String> = (0..2)
        .flat_map(|i| {
            cluster
                .log_lines(i)
                .into_iter()
                .skip(logged_before[i])
                .filter(|l| {
                    [
                        "primary = ",
                        "NON-PRIMARY",
                        "NON_PRIM",
                        "suspect",
                        "inactive",
                        "evict",
                        "partitioned",
                    ]
                    .iter()
                    .any(|m| l.contains(m))
                })
                .map(move |l| format!("node {}: {l}", i + 1))
        })
        .collect();
    let non_primary = membership
        .iter()
        .filter(|l| l.contains("primary = no") || l.contains("Received NON-PRIMARY"))
        .count();
    if non_primary > 0 {
        say(&format!(
            "galera {label}: the surviving nodes logged {non_primary} non-primary views:\n{}",
            membership
                .iter()
                .take(40)
                .cloned()
                .collect::<Vec<_>>()
                .join("\n")
        ));
    }
    format!(
        "galera ledger {label}: {} jobs ({} publishes uncertain), {} deliveries, {duplicates} \
         duplicates (all after an ack that failed; {lease_losses} acks found their lease lost, {maybe_committed} lost their \
         connection, {refused} were refused by a surviving node out of the primary \
         component), rejoin (restart to synced) {:.1}s by {transfer}, node 3's \
         broker acking again {} after the kill, longest pause between acks after the kill \
         {:.2}s, certification conflicts on nodes 1-2: {conflicts}, non-primary views logged by \
         nodes 1-2: {non_primary}",
        ok.len(),
        uncertain.len(),
        recs.len(),
        rejoin.as_secs_f64(),
        node3_back.map_or("n/a".to_string(), |d| format!("{:.1}s", d.as_secs_f64())),
        gap.as_secs_f64(),
    )
}
