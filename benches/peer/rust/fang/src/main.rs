//! fang 0.11.0 on Postgres: `JOBS` no-op tasks inserted with `insert_task` (fang has no bulk
//! insert: one statement per task, 32 at a time, untimed) into `fang_tasks` (made by fang's
//! own Diesel migrations), then worked by a worker pool until the table is empty. Prints
//! `fang <jobs> <jobs/s> <settings>`.
//!
//! `FANG_MODE=blocking` (the default): fang's blocking queue (Diesel, an r2d2 pool, one
//! thread per worker), whose fetch-and-mark runs in one transaction. `FANG_MODE=async`: its
//! async queue (SQLx), whose fetch (`FOR UPDATE SKIP LOCKED`) runs outside a transaction, so
//! the lock ends before the task is marked and workers take the same oldest task and wait on
//! each other's updates: 61-87 jobs/s here against 770-880 blocking (5,000 tasks, 4 and 32
//! workers), so the blocking queue is fang's best.
//!
//! Settings (each can be overridden from the environment):
//!
//! - `FANG_WORKERS=32`: `number_of_workers`, and at least as many pool connections, as
//!   fang's README builds its pools (`.number_of_workers(max_pool_size)`): each worker is a
//!   loop of fetch-one (`... ORDER BY created_at LIMIT 1 FOR UPDATE SKIP LOCKED`, no index on
//!   `created_at`, so every fetch sorts the waiting tasks), run, delete, so workers are fang's
//!   only parallelism; 32 as the library's 32 handlers (4 gave 770 jobs/s, 32 gave 879).
//! - `RetentionMode::RemoveFinished` (fang's default): a finished task is one `DELETE`.
//! - `SleepParams` of 10 ms (its default is 5 s): a worker sleeps only when it finds nothing,
//!   which with every task queued before the start happens only at the end.
//!
//! The clock runs from the pool's start until the handlers have seen every task and
//! `fang_tasks` is empty (polled every 2 ms from then on).
#[path = "../../common.rs"]
mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use diesel::Connection;
use fang::asynk::async_queue::{AsyncQueue, AsyncQueueable};
use fang::asynk::async_worker_pool::AsyncWorkerPool;
use fang::serde::{Deserialize, Serialize};
use fang::{typetag, AsyncRunnable, FangError, RetentionMode, SleepParams};
use sqlx::{Executor, PgPool};

#[derive(Serialize, Deserialize)]
#[serde(crate = "fang::serde")]
struct Noop {
    n: u64,
}

// The blocking queue's task trait (`FANG_MODE=blocking`).
#[typetag::serde]
impl fang::Runnable for Noop {
    fn run(&self, _queue: &dyn fang::Queueable) -> Result<(), FangError> {
        common::seen();
        Ok(())
    }
}

#[typetag::serde]
#[fang::async_trait]
impl AsyncRunnable for Noop {
    async fn run(&self, _queue: &dyn AsyncQueueable) -> Result<(), FangError> {
        common::seen();
        Ok(())
    }
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
    common::on_scratch_db("fang", exec, |url| async move { run(&url).await }).await;
}

async fn run(url: &str) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let jobs = common::jobs();
    common::expect_jobs(jobs);
    let workers: u32 = common::env_or("FANG_WORKERS", 32);
    let sleep = Duration::from_millis(common::env_or("FANG_SLEEP_MS", 10));

    // fang's own migrations (Diesel).
    {
        let url = url.to_string();
        tokio::task::spawn_blocking(move || {
            let mut conn = diesel::PgConnection::establish(&url)?;
            fang::run_migrations_postgres(&mut conn)
        })
        .await??;
    }

    let mode: String = common::env_or("FANG_MODE", "blocking".to_string());
    if mode == "blocking" {
        return run_blocking(url, jobs, workers, sleep).await;
    }
    let mut queue = AsyncQueue::builder()
        .uri(url.to_string())
        .max_pool_size(workers)
        .build();
    queue.connect().await?;

    // Published untimed: fang inserts one task per call; 32 calls at a time.
    let next = std::sync::Arc::new(AtomicU64::new(0));
    let mut inserters = Vec::new();
    for _ in 0..32 {
        let queue = queue.clone();
        let next = next.clone();
        inserters.push(tokio::spawn(async move {
            loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= jobs {
                    return Ok::<_, fang::AsyncQueueError>(());
                }
                queue.insert_task(&Noop { n } as &dyn AsyncRunnable).await?;
            }
        }));
    }
    for i in inserters {
        i.await??;
    }

    let pool = PgPool::connect(url).await?;
    let started = Instant::now();
    let mut workers_pool: AsyncWorkerPool<AsyncQueue> = AsyncWorkerPool::builder()
        .number_of_workers(workers)
        .queue(queue.clone())
        .retention_mode(RetentionMode::RemoveFinished)
        .sleep_params(fixed_sleep(sleep))
        .build();
    workers_pool.start().await;
    let elapsed = finished(&pool, started).await?;
    // fang's pool has no stop: its connections end with the process (the database is
    // dropped WITH (FORCE) by main).
    pool.close().await;
    common::report(
        "fang",
        jobs,
        elapsed,
        &format!(
            "async,workers={workers},pool={workers},retention=RemoveFinished,sleep={}ms",
            sleep.as_millis()
        ),
    );
    Ok(())
}

/// fang's blocking queue (Diesel, an r2d2 pool, one thread per worker): the same tasks,
/// inserted with `Queueable::insert_task` (32 threads), worked by a `WorkerPool`.
async fn run_blocking(
    url: &str,
    jobs: u64,
    workers: u32,
    sleep: Duration,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    use fang::{Queue, Queueable, Runnable, WorkerPool};
    let manager = diesel::r2d2::ConnectionManager::<diesel::PgConnection>::new(url);
    let connections = diesel::r2d2::Pool::builder()
        .max_size(workers.max(32))
        .build(manager)?;
    let queue = Queue::builder().connection_pool(connections).build();

    // Published untimed: one task per call; 32 threads.
    let next = std::sync::Arc::new(AtomicU64::new(0));
    let inserters: Vec<_> = (0..32)
        .map(|_| {
            let queue = queue.clone();
            let next = next.clone();
            std::thread::spawn(move || loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= jobs {
                    return;
                }
                queue
                    .insert_task(&Noop { n } as &dyn Runnable)
                    .expect("insert a task");
            })
        })
        .collect();
    for i in inserters {
        i.join().expect("an inserter");
    }

    let pool = PgPool::connect(url).await?;
    let started = Instant::now();
    let mut worker_pool = WorkerPool::<Queue>::builder()
        .queue(queue)
        .number_of_workers(workers)
        .retention_mode(RetentionMode::RemoveFinished)
        .sleep_params(fixed_sleep(sleep))
        .build();
    worker_pool
        .start()
        .map_err(|e| format!("start the worker pool: {}", e.description))?;
    let elapsed = finished(&pool, started).await?;
    pool.close().await;
    common::report(
        "fang",
        jobs,
        elapsed,
        &format!(
            "blocking,workers={workers},pool={},retention=RemoveFinished,sleep={}ms",
            workers.max(32),
            sleep.as_millis()
        ),
    );
    // The worker threads have no stop: the process ends here (main drops the database).
    Ok(())
}

/// A fixed sleep of `sleep` between polls, no back-off (the module docs say why).
fn fixed_sleep(sleep: Duration) -> SleepParams {
    SleepParams {
        sleep_period: sleep,
        max_sleep_period: sleep,
        min_sleep_period: sleep,
        sleep_step: Duration::ZERO,
    }
}

/// Waits until the handlers have seen every job and `fang_tasks` is empty (a task is
/// removed once finished); the time since `started`, and says when each happened.
async fn finished(
    pool: &PgPool,
    started: Instant,
) -> Result<Duration, Box<dyn std::error::Error + Send + Sync>> {
    common::all_seen().await;
    let handled = started.elapsed();
    common::wait_until_done(
        || {
            let pool = pool.clone();
            async move {
                sqlx::query_scalar::<_, i64>("SELECT count(*) FROM fang_tasks")
                    .fetch_one(&pool)
                    .await
                    .expect("count unfinished tasks")
            }
        },
        Duration::from_secs(30),
    )
    .await?;
    let elapsed = started.elapsed();
    eprintln!(
        "fang: handlers saw every job at {:.3} s, all finished in the database at {:.3} s",
        handled.as_secs_f64(),
        elapsed.as_secs_f64()
    );
    Ok(elapsed)
}
