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
use crate::table::{Form, Table, TableSpec};
use crate::Value;

/// What the scripted database does; shared by its connections.
#[derive(Default)]
pub(crate) struct Script {
    /// Connections opened so far.
    pub connects: AtomicUsize,
    /// Every statement run, in order.
    pub log: Mutex<Vec<String>>,
    /// Lease claims so far; the claim numbered `panic_on_claim` (from 1) panics.
    pub claims: AtomicUsize,
    pub panic_on_claim: Option<usize>,
    /// Rows each lease claim returns before that.
    pub rows_per_claim: usize,
    /// Renewals panic.
    pub panic_on_renew: bool,
    /// The row lock claim's query panics.
    pub panic_on_query: bool,
    /// The table has the idle poll's readiness check (`any_ready`, which finds nothing).
    pub any_ready: bool,
    /// The registry's pause flag of the table, as its `paused` query reads it.
    pub paused: std::sync::atomic::AtomicBool,
}

pub(crate) struct Scripted(pub Arc<Script>);

static SYNTAX: Syntax = Syntax {
    quote: |s| s.to_string(),
    param: |_| "?".into(),
    now: "NOW",
    claim_limit: |p| format!("LIMIT {p}"),
};

static REGISTRY: crate::dialect::RegistrySql = crate::dialect::RegistrySql {
    create: "registry create",
    upsert: "registry upsert",
    insert_new: "registry insert",
    read: "registry read",
    paused: "paused",
    list: "registry list",
    set_paused: "registry set paused",
};

impl Dialect for Scripted {
    fn database(&self) -> &'static str {
        "Scripted"
    }
    fn connect(&self) -> Result<Box<dyn DbConn + Send>, DbError> {
        self.0.connects.fetch_add(1, Ordering::SeqCst);
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
            ..TableSql::default()
        }
    }
    fn create_table(&self, _: &TableSpec) -> Vec<String> {
        Vec::new()
    }
    fn column_defs(&self, _: &TableSpec) -> Vec<crate::schema::ColumnDef> {
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
    ) -> Result<Vec<Vec<Value>>, DbError> {
        let n = self.0.claims.fetch_add(1, Ordering::SeqCst) + 1;
        if self.0.panic_on_claim == Some(n) {
            panic!("scripted claim panic");
        }
        let rows = self.0.rows_per_claim.min(limit);
        Ok((0..rows)
            .map(|i| {
                let id = (n * 100 + i) as i64;
                vec![Value::Int(id), Value::Int(1), Value::Bytes(Vec::new())]
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
        self.0.log.lock().push("renew".into());
        Ok(held.iter().map(|(id, _)| *id).collect())
    }
    fn lease_ack_many(
        &self,
        _: &mut dyn DbConn,
        _: &TableSpec,
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
        retry: crate::RetryPolicy::default(),
        handler_timeout: None,
    }
}
