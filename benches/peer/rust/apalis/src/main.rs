//! apalis 1.0.0 with `apalis-postgres` 1.0.0 (the current Postgres backend; `apalis-sql`
//! 1.0 is only the shared SQL utilities): `JOBS` no-op jobs published with `push_bulk`
//! (batches of 5,000, one `UNNEST` insert each, untimed), then worked by `APALIS_WORKERS`
//! apalis workers on one queue until every row of `apalis.jobs` is `Done`. Prints
//! `apalis <jobs> <jobs/s> <settings>`.
//!
//! Settings (each can be overridden from the environment). apalis documents no throughput
//! recipe beyond `Config::batch_size` ("larger batches can improve throughput by reducing
//! the number of queue operations"); these are the best of a sweep on this machine (60,000
//! jobs, one run each, load 10-15: workers 1/2/4/8 x batch 100/500/2000 gave 3,194-10,143 /
//! 5,132-15,988 / 14,649-24,217 / 17,610-21,198 jobs/s; locking on, 4 x 500: 14,446 against
//! 21,543 off):
//!
//! - `APALIS_BATCH=2000`: `Config::batch_size`, jobs fetched (and marked `Queued`) per fetch.
//! - `APALIS_WORKERS=4`: workers, each a backend clone with its own fetch loop (one apalis
//!   worker fetches, settles and heartbeats in sequence, so several run side by side, as the
//!   library runs 4 claim workers). A worker runs every fetched job at once (no
//!   `concurrency` limit: the handler is a no-op).
//! - `APALIS_LOCK=0`: `Config::lock_tasks(false)`, as the crate's own tests: no extra
//!   `Running` update per job before it runs (the fetch has already taken it for this worker).
//! - `persist_results` stays on (the default): without it nothing marks a job done.
//!
//! The clock runs from the workers' start until the handlers have seen every job and
//! `apalis.jobs` holds none not `Done` (polled every 2 ms from then on).
#[path = "../../common.rs"]
mod common;

use std::time::{Duration, Instant};

use apalis::prelude::*;
use apalis_postgres::{Config, PostgresStorage};
use serde::{Deserialize, Serialize};
use sqlx::{AssertSqlSafe, Executor, PgPool};

#[derive(Clone, Debug, Deserialize, Serialize)]
struct Noop {
    n: u64,
}

async fn noop(_job: Noop) -> Result<(), BoxDynError> {
    common::seen();
    Ok(())
}

#[tokio::main]
async fn main() {
    let admin = PgPool::connect(&common::server_url())
        .await
        .expect("connect to the server");
    let exec = |sql: String| {
        let admin = admin.clone();
        async move {
            admin
                .execute(AssertSqlSafe(sql.clone()))
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}"));
        }
    };
    common::on_scratch_db("apalis", exec, |url| async move { run(&url).await }).await;
}

async fn run(url: &str) -> Result<(), BoxDynError> {
    let jobs = common::jobs();
    common::expect_jobs(jobs);
    let workers: usize = common::env_or("APALIS_WORKERS", 4);
    let batch: usize = common::env_or("APALIS_BATCH", 2000);
    let lock = common::env_or::<u8>("APALIS_LOCK", 0) != 0;
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(workers as u32 * 2 + 2)
        .connect(url)
        .await?;
    PostgresStorage::setup(&pool).await?;
    let config = Config::default()
        .queue("noop")
        .batch_size(batch)
        .lock_tasks(lock);

    // Published untimed, by apalis's own bulk push.
    let mut producer = PostgresStorage::<Noop>::new(&pool).with_config(config.clone());
    let mut n = 0u64;
    while n < jobs {
        let chunk = (jobs - n).min(5_000);
        producer
            .push_bulk((n..n + chunk).map(|n| Noop { n }).collect())
            .await?;
        n += chunk;
    }

    let started = Instant::now();
    let mut contexts = Vec::new();
    let mut running = Vec::new();
    for i in 0..workers {
        let ctx = WorkerContext::new(&format!("peer-{i}"));
        let backend = PostgresStorage::<Noop>::new(&pool).with_config(config.clone());
        let worker = WorkerBuilder::new(&ctx).backend(backend).build(noop);
        contexts.push(ctx);
        running.push(tokio::spawn(worker.run()));
    }
    common::all_seen().await;
    let handled = started.elapsed();
    common::wait_until_done(
        || {
            let pool = pool.clone();
            async move {
                sqlx::query_scalar::<_, i64>(
                    "SELECT count(*) FROM apalis.jobs WHERE status <> 'Done'",
                )
                .fetch_one(&pool)
                .await
                .expect("count unfinished jobs")
            }
        },
        Duration::from_secs(30),
    )
    .await?;
    let elapsed = started.elapsed();
    eprintln!(
        "{}: handlers saw every job at {:.3} s, all finished in the database at {:.3} s",
        "apalis",
        handled.as_secs_f64(),
        elapsed.as_secs_f64()
    );
    for ctx in &contexts {
        let _ = ctx.stop();
    }
    for r in running {
        let _ = tokio::time::timeout(Duration::from_secs(10), r).await;
    }
    common::report(
        "apalis",
        jobs,
        elapsed,
        &format!("workers={workers},batch_size={batch},lock_tasks={lock}"),
    );
    Ok(())
}
