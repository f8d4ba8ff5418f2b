//! Shared by the peers' binaries (each includes it with `#[path]`): settings from the
//! environment, the scratch database each run makes and drops, and the line it prints.
//!
//! Every run works in a database of its own, `sqlbroker_peer_<peer>_<pid>`, created on the
//! server of `PEER_PG_URL` before the jobs are published and dropped (`WITH (FORCE)`) after:
//! some peers hard-code their schema (`apalis`, `awa`) or table names (`fang_tasks`), so a
//! database of their own is the one isolation that fits all of them, and nothing of the
//! project's database (or another engineer's) is touched.
#![allow(dead_code)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

static SEEN: AtomicU64 = AtomicU64::new(0);
static JOBS: AtomicU64 = AtomicU64::new(0);
static ALL_SEEN: tokio::sync::Notify = tokio::sync::Notify::const_new();

/// Counts the handlers' jobs against `jobs` ([`seen`], [`all_seen`]).
pub fn expect_jobs(jobs: u64) {
    JOBS.store(jobs, Ordering::Relaxed);
}

/// A handler saw one more job (the last of them wakes [`all_seen`]).
pub fn seen() {
    if SEEN.fetch_add(1, Ordering::Relaxed) + 1 == JOBS.load(Ordering::Relaxed) {
        ALL_SEEN.notify_one();
    }
}

/// Returns once the handlers have seen every job [`expect_jobs`] named.
pub async fn all_seen() {
    ALL_SEEN.notified().await;
}

pub fn env_or<T: std::str::FromStr>(key: &str, default: T) -> T {
    match std::env::var(key) {
        Ok(v) if !v.is_empty() => v
            .parse()
            .unwrap_or_else(|_| panic!("{key}={v}: not a valid value")),
        _ => default,
    }
}

/// The server the run is on (`PEER_PG_URL`, default the project's test database).
pub fn admin_url() -> String {
    env_or(
        "PEER_PG_URL",
        "postgres://postgres@127.0.0.1:5432/test".to_string(),
    )
}

/// Jobs per run (`JOBS`, default 60,000).
pub fn jobs() -> u64 {
    env_or("JOBS", 60_000u64)
}

/// `url` with its database replaced by `db` and TLS off (the library's side runs without it).
pub fn url_with_db(url: &str, db: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let scheme_end = base.find("://").map_or(0, |i| i + 3);
    let base = match base[scheme_end..].find('/') {
        Some(i) => &base[..scheme_end + i],
        None => base,
    };
    let mut params: Vec<&str> = query
        .map(|q| {
            q.split('&')
                .filter(|p| !p.starts_with("sslmode="))
                .collect()
        })
        .unwrap_or_default();
    params.push("sslmode=disable");
    format!("{base}/{db}?{}", params.join("&"))
}

/// The scratch database's name for `peer` in this process.
pub fn scratch_db(peer: &str) -> String {
    format!("sqlbroker_peer_{peer}_{}", std::process::id())
}

/// Runs `run` on the URL of a scratch database of its own ([`scratch_db`]), made before
/// and dropped after (`WITH (FORCE)`, also when the run failed), each statement run by `exec`
/// on the server's `postgres` database with the peer's own client (the peers pin different
/// `sqlx` versions, so the statement is the one thing shared). A failed run exits 1 with its
/// error.
pub async fn on_scratch_db<X, XF, R, RF, E>(peer: &str, exec: X, run: R)
where
    X: Fn(String) -> XF,
    XF: std::future::Future<Output = ()>,
    R: FnOnce(String) -> RF,
    RF: std::future::Future<Output = Result<(), E>>,
    E: std::fmt::Display,
{
    let db = scratch_db(peer);
    exec(format!("CREATE DATABASE {db}")).await;
    let result = run(url_with_db(&admin_url(), &db)).await;
    exec(format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)")).await;
    if let Err(e) = result {
        eprintln!("{peer}: {e}");
        std::process::exit(1);
    }
}

/// The URL of the server's `postgres` database, where the scratch databases are made.
pub fn server_url() -> String {
    url_with_db(&admin_url(), "postgres")
}

/// Waits (polling every 2 ms) until `remaining()` reports no unfinished job, failing after
/// `stall` without progress.
pub async fn wait_until_done<F, Fut>(mut remaining: F, stall: Duration) -> Result<(), String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = i64>,
{
    let mut last = i64::MAX;
    let mut since = Instant::now();
    loop {
        let left = remaining().await;
        if left == 0 {
            return Ok(());
        }
        if left < last {
            last = left;
            since = Instant::now();
        } else if since.elapsed() > stall {
            return Err(format!(
                "{left} jobs left unfinished after {stall:?} without progress"
            ));
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// The one line a run prints: `<peer> <jobs> <jobs/s> <settings>`.
pub fn report(peer: &str, jobs: u64, elapsed: Duration, settings: &str) {
    println!(
        "{peer} {jobs} {:.0} {settings}",
        jobs as f64 / elapsed.as_secs_f64()
    );
}
