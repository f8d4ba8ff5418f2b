//! River's Rust client (`riverqueue` 0.5.0, Postgres through SQLx): `JOBS` no-op jobs
//! published with `Client::insert_many` (batches of 5,000, untimed), then worked by one client
//! until every job is `completed` in `river_job`. Prints `river <jobs> <jobs/s> <settings>`.
//!
//! Settings (each can be overridden from the environment): those of River's own benchmark,
//! `riverqueue bench` in the `riverqueue-cli` crate, which the client's README names as the
//! way to measure it, i.e. what River's authors run for throughput:
//!
//! - `RIVER_WORKERS=2000`: `QueueConfig::new(2000)`, its `--max-workers` default. A fetch
//!   claims up to the free worker slots, so this is also River's claim batch.
//! - `RIVER_COOLDOWN_MS=2`: `QueueConfig::with_fetch_cooldown` (River's default is 100 ms and
//!   "throughput is limited by this value"; the bench sets 2 ms).
//! - `RIVER_POLL_MS=20`: `with_fetch_poll_interval` (default 1 s; the bench sets 20 ms).
//! - `RIVER_POOL=50`: SQLx pool size, its `--max-connections` default.
//!
//! Completions are River's own batched completer (10 ms batches of up to 5,000, fixed).
//! The clock runs from `Client::start` until the handlers have seen every job and
//! `river_job` holds none not yet `completed` (polled every 2 ms from then on).
#[path = "../../common.rs"]
mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use riverqueue::migrate::PostgresMigrator;
use riverqueue::sqlx::{self, AssertSqlSafe, Executor, PgPool, postgres::PgPoolOptions};
use riverqueue::{
    BoxError, Client, InsertOpts, Job, JobArgs, QueueConfig, WorkContext, WorkOutcome, Workers,
};
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;

#[derive(Clone, Debug, Deserialize, JobArgs, Serialize)]
#[river(kind = "noop")]
struct Noop {
    n: u64,
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
    common::on_scratch_db("river", exec, |url| async move { run(&url).await }).await;
}

async fn run(url: &str) -> Result<(), BoxError> {
    let jobs = common::jobs();
    let workers: usize = common::env_or("RIVER_WORKERS", 2000);
    let cooldown = Duration::from_millis(common::env_or("RIVER_COOLDOWN_MS", 2));
    let poll = Duration::from_millis(common::env_or("RIVER_POLL_MS", 20));
    let pool_size: u32 = common::env_or("RIVER_POOL", 50);
    let pool = PgPoolOptions::new()
        .max_connections(pool_size)
        .connect(url)
        .await?;
    PostgresMigrator::new(pool.clone()).migrate_up().await?;

    let seen = Arc::new(AtomicU64::new(0));
    let all_seen = Arc::new(Notify::new());
    let mut registry = Workers::new();
    {
        let seen = seen.clone();
        let all_seen = all_seen.clone();
        registry.add_fn(move |_ctx: WorkContext, _job: Job<Noop>| {
            let seen = seen.clone();
            let all_seen = all_seen.clone();
            async move {
                if seen.fetch_add(1, Ordering::Relaxed) + 1 == jobs {
                    all_seen.notify_one();
                }
                Ok::<_, BoxError>(WorkOutcome::Complete)
            }
        })?;
    }
    let client = Client::builder(pool.clone())
        .workers(registry)
        .queue(
            riverqueue::QUEUE_DEFAULT,
            QueueConfig::new(workers)
                .with_fetch_cooldown(cooldown)
                .with_fetch_poll_interval(poll),
        )
        .build()?;

    // Published untimed, by River's own bulk insert (the bench's 5,000 per call).
    let mut n = 0u64;
    while n < jobs {
        let chunk = (jobs - n).min(5_000);
        client
            .insert_many((n..n + chunk).map(|n| (Noop { n }, InsertOpts::default())))
            .await?;
        n += chunk;
    }

    let started = Instant::now();
    let mut run = client.start()?;
    all_seen.notified().await;
    let handled = started.elapsed();
    common::wait_until_done(
        || {
            let pool = pool.clone();
            async move {
                sqlx::query_scalar::<_, i64>(
                    "SELECT count(*) FROM river_job WHERE state <> 'completed'",
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
        "river",
        handled.as_secs_f64(),
        elapsed.as_secs_f64()
    );
    run.stop().await?;
    common::report(
        "river",
        jobs,
        elapsed,
        &format!(
            "workers={workers},fetch_cooldown={}ms,fetch_poll={}ms,pool={pool_size}",
            cooldown.as_millis(),
            poll.as_millis()
        ),
    );
    Ok(())
}
