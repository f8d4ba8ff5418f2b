//! Small helpers: the library's time rounding, unique names, banners, RSS and load.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::LEASE;

pub(crate) fn epoch_secs(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// `t` rounded down to a whole second (the library's `claim_now`).
pub(crate) fn floor(t: SystemTime) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(epoch_secs(t) as u64)
}

/// The token a lease claim at `now` writes (the library's `lease_token`: `ceil(now) + lease`).
pub(crate) fn lease_token(now: SystemTime) -> SystemTime {
    let f = floor(now);
    let ceil = if f == now {
        f
    } else {
        f + Duration::from_secs(1)
    };
    ceil + LEASE
}

/// The library's id-list size class.
pub(crate) fn size_class(n: usize) -> usize {
    n.max(1).next_power_of_two()
}

pub(crate) fn unique(prefix: &str) -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!(
        "{prefix}_{}_{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed),
        nanos % 100_000
    )
}

pub(crate) fn skip(db: &str, url: &str, var: &str, why: &dyn std::fmt::Display) {
    let bar = "!".repeat(88);
    eprintln!("\n{bar}\n!!!!! SKIPPED: {db} burn-down: {url} is not reachable ({why})");
    eprintln!("!!!!! set {var} or start the server\n{bar}\n");
}

/// Resident set size of this process, in MiB.
pub(crate) fn rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

pub(crate) fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// Runs its closure when dropped: the tables go even when a run panics.
pub(crate) struct OnDrop<F: FnMut()>(pub(crate) F);

impl<F: FnMut()> Drop for OnDrop<F> {
    fn drop(&mut self) {
        (self.0)()
    }
}

/// What this process has used so far, every thread summed: `getrusage`.
#[derive(Clone, Copy)]
pub(crate) struct Usage {
    /// CPU time, user + system.
    pub(crate) cpu: Duration,
    /// Context switches, voluntary (a thread that blocks: a wake-up to come) and involuntary
    /// (preempted). Hand-offs between threads show here; callgrind cannot see them.
    pub(crate) switches: u64,
}

pub(crate) fn usage() -> Usage {
    // SAFETY: `getrusage` writes into the zeroed struct it is given.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1_000);
    Usage {
        cpu: tv(u.ru_utime) + tv(u.ru_stime),
        switches: (u.ru_nvcsw + u.ru_nivcsw) as u64,
    }
}
