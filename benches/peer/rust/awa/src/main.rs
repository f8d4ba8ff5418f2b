//! awa 0.6.9 (its default 0.6 queue storage): `JOBS` no-op jobs published with
//! `insert_many_copy_from_pool` (awa's bulk `COPY` insert, 5,000 per call, untimed), then
//! worked by one client until every job of the queue is `completed`. Prints
//! `awa <jobs> <jobs/s> <settings>`.
//!
//! Settings (each can be overridden from the environment): those of awa's own throughput
//! bench (`tests/benchmark_test.rs` of the crate, the queue-storage runtime test) with its
//! configuration guide's advice for one hot queue ("a larger claim batch usually helps
//! before extra claimers"):
//!
//! - `AWA_WORKERS=100`: `QueueConfig::max_workers` (the bench's 100; awa's default is 50).
//! - `AWA_CLAIM_BATCH=512`: `claim_batch_size`, awa's default and the bench's.
//! - `AWA_CLAIMERS=1`: `claimers`, the default ("benchmark 2 or 4 only when a single
//!   claimer cannot keep worker permits full").
//! - `AWA_POLL_MS=50`: `poll_interval` (the bench's; default 200 ms).
//! - `deadline_duration` zero, as the bench: no per-attempt deadline bookkeeping.
//!
//! The clock runs from `Client::start` until the handlers have seen every job and awa's
//! admin overview of the queue shows none left unfinished (polled every 2 ms from then on).
#[path = "../../common.rs"]
mod common;

use std::time::{Duration, Instant};

use awa::{Client, InsertOpts, JobArgs, JobContext, JobError, JobResult, QueueConfig};
use serde::{Deserialize, Serialize};
use sqlx::{Executor, PgPool};

const QUEUE: &str = "noop";

#[derive(Serialize, Deserialize, JobArgs)]
struct Noop {
    n: u64,
}

fn noop(
    _job: Noop,
    _ctx: &JobContext,
) -> impl std::future::Future<Output = Result<JobResult, JobError>> + Send + 'static {
    common::seen();
    std::future::ready(Ok(JobResult::Completed))
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
                .execute(sql.as_str())
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}"));
        }
    };
    common::on_scratch_db("awa", exec, |url| async move { run(&url).await }).await;
}

async fn run(url: &str) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let jobs = common::jobs();
    common::expect_jobs(jobs);
    let workers: u32 = common::env_or("AWA_WORKERS", 100);
    let claim_batch: usize = common::env_or("AWA_CLAIM_BATCH", 512);
    let claimers: u16 = common::env_or("AWA_CLAIMERS", 1);
    let poll = Duration::from_millis(common::env_or("AWA_POLL_MS", 50));
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(common::env_or("AWA_POOL", 20))
        .connect(url)
        .await?;
    awa::migrations::run(&pool).await?;

    let client = Client::builder(pool.clone())
        .queue(
            QUEUE,
            QueueConfig {
                max_workers: workers,
                claim_batch_size: claim_batch,
                claimers,
                poll_interval: poll,
                deadline_duration: Duration::ZERO,
                ..QueueConfig::default()
            },
        )
        .register::<Noop, _, _>(noop)
        .build()?;

    // Published untimed, by awa's own bulk COPY insert.
    let mut n = 0u64;
    while n < jobs {
        let chunk = (jobs - n).min(5_000);
        let params = (n..n + chunk)
            .map(|n| {
                awa::model::insert::params_with(
                    &Noop { n },
                    InsertOpts {
                        queue: QUEUE.into(),
                        ..Default::default()
                    },
                )
            })
            .collect::<Result<Vec<_>, _>>()?;
        awa::insert_many_copy_from_pool(&pool, &params).await?;
        n += chunk;
    }

    let started = Instant::now();
    client.start().await?;
    common::all_seen().await;
    let handled = started.elapsed();
    common::wait_until_done(
        || {
            let pool = pool.clone();
            async move {
                let o = awa::admin::queue_overview(&pool, QUEUE)
                    .await
                    .expect("queue overview")
                    .expect("the queue");
                o.total_queued
            }
        },
        Duration::from_secs(30),
    )
    .await?;
    let elapsed = started.elapsed();
    eprintln!(
        "{}: handlers saw every job at {:.3} s, all finished in the database at {:.3} s",
        "awa",
        handled.as_secs_f64(),
        elapsed.as_secs_f64()
    );
    client.shutdown(Duration::from_secs(5)).await;
    common::report(
        "awa",
        jobs,
        elapsed,
        &format!(
            "max_workers={workers},claim_batch_size={claim_batch},claimers={claimers},poll={}ms",
            poll.as_millis()
        ),
    );
    Ok(())
}
