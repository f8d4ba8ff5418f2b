//! A scripted database for unit tests of the runtime's failure paths: panics in claims and
//! renewal rounds, which no live database can be made to cause on cue.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use parking_lot::Mutex;

use super::{pool, Ctx, Queue, SubOptions};
use crate::dialect::shared::Syntax;
use crate::dialect::{DbConn, Dialect, TableSql};
use crate::error::{BrokerError, DbError};
use crate::model::table::{Form, Table, TableSpec};
use crate::model::value::Value;

/// What the scripted database does; shared by its connections.
#[derive(Default)]
pub(crate) struct Script {
    /// Connections opened so far.
    pub connects: AtomicUsize,
    /// Connections past this many are refused (a server at its connection limit).
    pub max_connects: Option<usize>,
    /// Every statement run, in order.
    pub log: Mutex<Vec<String>>,
    /// Lease claims so far; the claim numbered `panic_on_claim` (from 1) panics.
    pub claims: AtomicUsize,
    pub panic_on_claim: Option<usize>,
    /// Rows each lease claim returns before that.
    pub rows_per_claim: usize,
    /// Renewals panic.
    pub panic_on_renew: bool,
    /// Renewals log `stall`, then answer only this much later (a server that does not
    /// answer, until the round trip timeout).
    pub renew_stall: Option<Duration>,
    /// The row lock claim's query panics.
    pub panic_on_query: bool,
    /// The table has the idle poll's readiness check (`any_ready`, and `any_ready_from` past
    /// the cursor; both find nothing).
    pub any_ready: bool,
    /// Lease claims read on from the cursor (`claim_from`), and log where each read: `claim
    /// head` or `claim from`.
    pub cursor: bool,
    /// The registry's pause flag of the table, as its `paused` query reads it.
    pub paused: std::sync::atomic::AtomicBool,
}

pub(crate) struct Scripted(pub Arc<Script>);

static SYNTAX: Syntax = Syntax {
    quote: |s| s.to_string(),
    param: |_| "?".into(),
    now: "NOW",
    claim_limit: |p| format!("LIMIT {p}"),
    literal: crate::dialect::shared::standard_literal,
    stamps_created: false,
    contains: |h, n| format!("contains({h}, {n})"),
    row_compare: true,
    force_index: false,
};

static ACTION_LOG: crate::dialect::ActionLogSql = crate::dialect::ActionLogSql {
    create: "action log create",
    insert: "action log insert",
    list: "action log list",
    table_exact: "table_name",
    sweep_bound: "action log sweep bound",
    sweep: "action log sweep",
};

static REGISTRY: crate::dialect::RegistrySql = crate::dialect::RegistrySql {
    create: "registry create",
    upsert: "registry upsert",
    insert_new: "registry insert",
    read: "registry read",
    replace_stale: "registry replace stale",
    paused: "paused",
    limits: "limits",
    limits_locked: "limits locked",
    list: "registry list",
    set_paused: "registry set paused",
};

impl Dialect for Scripted {
    fn database(&self) -> &'static str {
        "Scripted"
    }
    fn action_log(&self) -> &'static crate::dialect::ActionLogSql {
        &ACTION_LOG
    }
    fn connect(&self) -> Result<Box<dyn DbConn + Send>, DbError> {
        let n = self.0.connects.fetch_add(1, Ordering::SeqCst) + 1;
        if self.0.max_connects.is_some_and(|max| n > max) {
            return Err(DbError::new(
                crate::error::DbErrorKind::Other,
                "too many connections",
            ));
        }
        Ok(Box::new(Conn {
            script: self.0.clone(),
            broken: false,
        }))
    }
    fn check_server(&self, _: &mut dyn DbConn, _: Form) -> Result<(), BrokerError> {
        Ok(())
    }
    fn compile(&self, _: &TableSpec) -> TableSql {
        TableSql {
            begin: vec!["BEGIN".into()],
            claim: "claim".into(),
            unclaim: "unclaim".into(),
            any_ready: self.0.any_ready.then(|| "any_ready".into()),
            any_ready_from: self.0.any_ready.then(|| "any_ready_from".into()),
            claim_from: self.0.cursor.then(|| "claim_from".into()),
            ..TableSql::default()
        }
    }
    fn create_table(&self, _: &TableSpec) -> Vec<String> {
        Vec::new()
    }
    fn column_defs(&self, _: &TableSpec) -> Vec<crate::model::schema::ColumnDef> {
        Vec::new()
    }
    fn columns_query(&self) -> &'static str {
        "columns"
    }
    fn syntax(&self) -> &'static Syntax {
        &SYNTAX
    }
    fn registry(&self) -> &'static crate::dialect::RegistrySql {
        &REGISTRY
    }
    fn max_params(&self) -> usize {
        100
    }
    fn lease_claim(
        &self,
        _: &mut dyn DbConn,
        _: &TableSql,
        _: SystemTime,
        limit: usize,
        _: SystemTime,
        after: Option<(SystemTime, i64)>,
    ) -> Result<Vec<Vec<Value>>, DbError> {
        if self.0.cursor {
            let from = if after.is_some() { "from" } else { "head" };
            self.0.log.lock().push(format!("claim {from}"));
        }
        let n = self.0.claims.fetch_add(1, Ordering::SeqCst) + 1;
        if self.0.panic_on_claim == Some(n) {
            panic!("scripted claim panic");
        }
        let rows = self.0.rows_per_claim.min(limit);
        Ok((0..rows)
            .map(|i| {
                let id = (n * 100 + i) as i64;
                vec![
                    Value::Int(id),
                    Value::Int(1),
                    Value::Bytes(Vec::new()),
                    // The cancel request (lease rows carry it before the due time).
                    Value::Int(0),
                    Value::Time(SystemTime::UNIX_EPOCH),
                ]
            })
            .collect())
    }
    fn lease_renew(
        &self,
        _: &mut dyn DbConn,
        _: &TableSpec,
        _: SystemTime,
        held: &[(i64, SystemTime)],
    ) -> Result<Vec<i64>, DbError> {
        if self.0.panic_on_renew {
            panic!("scripted renewal panic");
        }
        if let Some(stall) = self.0.renew_stall {
            self.0.log.lock().push("stall".into());
            std::thread::sleep(stall);
        }
        self.0.log.lock().push("renew".into());
        Ok(held.iter().map(|(id, _)| *id).collect())
    }
    fn lease_ack_many(
        &self,
        _: &mut dyn DbConn,
        _: &TableSpec,
        _: &TableSql,
        held: &[(i64, SystemTime)],
    ) -> Result<Vec<i64>, DbError> {
        self.0.log.lock().push(format!("ack {}", held.len()));
        Ok(held.iter().map(|(id, _)| *id).collect())
    }
}

struct Conn {
    script: Arc<Script>,
    broken: bool,
}

impl DbConn for Conn {
    fn execute(&mut self, sql: &str, _: &[Value]) -> Result<u64, DbError> {
        self.script.log.lock().push(sql.to_string());
        Ok(1)
    }
    fn query(&mut self, sql: &str, _: &[Value]) -> Result<Vec<Vec<Value>>, DbError> {
        self.script.log.lock().push(sql.to_string());
        if self.script.panic_on_query {
            panic!("scripted query panic");
        }
        if sql == REGISTRY.paused {
            let paused = self.script.paused.load(Ordering::SeqCst);
            return Ok(vec![vec![Value::Int(paused.into())]]);
        }
        Ok(Vec::new())
    }
    fn batch(&mut self, sql: &str) -> Result<(), DbError> {
        self.script.log.lock().push(sql.to_string());
        Ok(())
    }
    fn is_broken(&self) -> bool {
        self.broken
    }
    fn set_broken(&mut self, broken: bool) {
        self.broken = broken;
    }
    fn ping(&mut self) -> Result<(), DbError> {
        Ok(())
    }
}

/// A subscription context over the scripted database for a table of `form`.
pub(crate) fn ctx(script: &Arc<Script>, form: Form, opts: SubOptions) -> Arc<Ctx> {
    let dialect: Arc<dyn Dialect> = Arc::new(Scripted(script.clone()));
    let table = match form {
        Form::Lease => Table::new("t").lease(Duration::from_secs(30)),
        _ => Table::new("t"),
    };
    let spec = table.validate().unwrap();
    let sql = dialect.compile(&spec);
    let pool = pool::build(dialect.clone(), 4, Duration::from_secs(1), None);
    let wake = Arc::default();
    let queue = Queue::new(spec, sql, dialect, pool, wake, Duration::from_secs(1));
    Arc::new(Ctx::new(Arc::new(queue), opts, None, None))
}

pub(crate) fn options(batch: usize) -> SubOptions {
    SubOptions {
        workers: 1,
        batch,
        max_in_flight: batch,
        poll_interval: Duration::from_millis(10),
        advisory_scan: 32,
        retry: crate::model::retry::RetryPolicy::default(),
        handler_timeout: None,
        stuck_after: None,
    }
}

// ---------------------------------------------------------------------------------------------
// Fault injection for the crate's live tests (`races`): one-shot faults and pauses at
// named points of the runtime, armed per table so tests running in parallel do not meet each
// other's. Outside `cfg(test)` the points are no-ops (`runtime::faults`).

/// What an armed point does to the statement it wraps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fault {
    /// The statement does not run; the caller sees a lost connection.
    Fail,
    /// The statement runs (and commits); its answer is lost: the caller sees a lost connection.
    LoseAnswer,
}

type Armed = Vec<(&'static str, String, Fault)>;
static FAULTS: Mutex<Armed> = Mutex::new(Vec::new());

type Pauses = Vec<(
    &'static str,
    String,
    crossbeam_channel::Sender<()>,
    crossbeam_channel::Receiver<()>,
)>;
static PAUSES: Mutex<Pauses> = Mutex::new(Vec::new());

/// The next statement at `point` on `table` meets `fault` (once).
pub(crate) fn arm(point: &'static str, table: &str, fault: Fault) {
    FAULTS.lock().push((point, table.to_string(), fault));
}

/// Runs `run` unless a fault is armed at `point` for `table` (see [`Fault`]).
pub(crate) fn injected<T>(
    point: &'static str,
    table: &str,
    run: impl FnOnce() -> Result<T, DbError>,
) -> Result<T, DbError> {
    let fault = {
        let mut armed = FAULTS.lock();
        let at = armed.iter().position(|(p, t, _)| *p == point && t == table);
        at.map(|i| armed.remove(i).2)
    };
    let lost = || {
        Err(DbError::new(
            crate::error::DbErrorKind::ConnectionLost,
            format!("injected: the connection was lost at {point}"),
        ))
    };
    match fault {
        None => run(),
        Some(Fault::Fail) => lost(),
        Some(Fault::LoseAnswer) => {
            let _ = run();
            lost()
        }
    }
}

/// A pause armed at a point: the runtime reaching it is announced on `reached`, and it waits
/// there (at most 20 s) until `resume` is sent or dropped.
#[cfg_attr(not(all(feature = "postgres", feature = "mysql")), allow(dead_code))]
pub(crate) struct Paused {
    pub reached: crossbeam_channel::Receiver<()>,
    pub resume: crossbeam_channel::Sender<()>,
}

/// The next time the runtime reaches `point` on `table`, it stops there (once).
#[cfg_attr(not(all(feature = "postgres", feature = "mysql")), allow(dead_code))]
pub(crate) fn pause_at(point: &'static str, table: &str) -> Paused {
    let (reached_tx, reached) = crossbeam_channel::bounded(1);
    let (resume, resume_rx) = crossbeam_channel::bounded(1);
    PAUSES
        .lock()
        .push((point, table.to_string(), reached_tx, resume_rx));
    Paused { reached, resume }
}

/// Where the runtime stops if a pause is armed at `point` for `table`.
pub(crate) fn pause_point(point: &'static str, table: &str) {
    let armed = {
        let mut pauses = PAUSES.lock();
        let at = pauses
            .iter()
            .position(|(p, t, ..)| *p == point && t == table);
        at.map(|i| pauses.remove(i))
    };
    if let Some((_, _, reached, resume)) = armed {
        let _ = reached.send(());
        let _ = resume.recv_timeout(Duration::from_secs(20));
    }
}

/// The URL of a live database for the crate's own live tests (`"sqlite"`: a fresh file), or
/// `None` (after a loud message) when its server is not reachable and
/// `SQLBROKER_REQUIRE_SERVERS=1` is not set.
pub(crate) fn live_url(db: &str) -> Option<String> {
    let url = match db {
        "sqlite" => {
            static N: AtomicUsize = AtomicUsize::new(0);
            let dir = std::env::temp_dir().join("sqlbroker-unit");
            std::fs::create_dir_all(&dir).expect("temp dir");
            let n = N.fetch_add(1, Ordering::Relaxed);
            let file = dir.join(format!("races-{}-{n}.db", std::process::id()));
            for suffix in ["", "-wal", "-shm"] {
                let _ = std::fs::remove_file(format!("{}{suffix}", file.display()));
            }
            return Some(format!("sqlite:{}", file.display()));
        }
        "postgres" => std::env::var("SQLBROKER_PG_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into()),
        _ => std::env::var("SQLBROKER_MYSQL_URL")
            .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into()),
    };
    let opts = crate::dialect::ConnOptions {
        statement_timeout: Duration::from_secs(5),
        round_trip_timeout: Duration::from_secs(15),
        sqlite_durable: false,
        cross_process: false,
        listen_url: None,
        galera_single_writer: false,
    };
    let reached = crate::dialect::open(&url, &opts)
        .and_then(|d| d.connect().map(drop).map_err(|e| e.during("connect", "")));
    match reached {
        Ok(()) => Some(url),
        Err(e) if std::env::var("SQLBROKER_REQUIRE_SERVERS").is_ok_and(|v| v == "1") => {
            panic!("SQLBROKER_REQUIRE_SERVERS=1 but {db} at {url} is not reachable: {e}")
        }
        Err(e) => {
            eprintln!("\n!!!!! SKIPPED: {db} at {url} is not reachable ({e}) !!!!!\n");
            None
        }
    }
}
