//! The ledger a chaos suite's worker process writes on its stdout, one line per event:
//! `@@ <KIND> <id> <attempt> <unix micros> <extra>`, each written and flushed in one `write`
//! (a line shorter than the pipe buffer reaches the parent whole or not at all, so a SIGKILL
//! leaves no half line). Used by `zz_chaos_kill` and `zz_chaos_matrix`.

use std::io::Write;
use std::time::{SystemTime, UNIX_EPOCH};

/// Now, in microseconds since the Unix epoch: the clock children and parent share.
pub fn now_micros() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as i64
}

/// Writes one ledger line on stdout (a child's).
pub fn emit(kind: &str, id: i64, attempt: u32, extra: &str) {
    let line = format!("@@ {kind} {id} {attempt} {} {extra}\n", now_micros());
    let mut out = std::io::stdout().lock();
    out.write_all(line.as_bytes()).expect("child: stdout");
    out.flush().expect("child: flush");
}

/// One ledger line read back: kind, id, attempt, micros, extra (trimmed).
pub struct Line<'a> {
    pub kind: &'a str,
    pub id: i64,
    pub attempt: u32,
    pub micros: i64,
    pub extra: &'a str,
}

/// The ledger line in `line` (anything before `@@ ` is ignored), if it is one.
pub fn parse(line: &str) -> Option<Line<'_>> {
    let rest = &line[line.find("@@ ")? + 3..];
    let mut f = rest.splitn(5, ' ');
    Some(Line {
        kind: f.next()?,
        id: f.next()?.parse().ok()?,
        attempt: f.next()?.parse().ok()?,
        micros: f.next()?.parse().ok()?,
        extra: f.next().unwrap_or("").trim(),
    })
}

/// A ledger line as the parent keeps it: which child wrote it, and its fields, `K` being the
/// suite's own kinds.
#[derive(Debug, Clone)]
pub struct Event<K> {
    pub child: usize,
    pub kind: K,
    pub id: i64,
    pub attempt: u32,
    pub micros: i64,
    pub extra: String,
}

impl<K: std::fmt::Debug> std::fmt::Display for Event<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "[child {} @{}] {:?} id {} attempt {} {}",
            self.child, self.micros, self.kind, self.id, self.attempt, self.extra
        )
    }
}

/// The ledger line in `line`, written by `child`, if it is one of the kinds `kind` knows.
pub fn event<K>(
    child: usize,
    line: &str,
    kind: impl FnOnce(&str) -> Option<K>,
) -> Option<Event<K>> {
    let l = parse(line)?;
    Some(Event {
        child,
        kind: kind(l.kind)?,
        id: l.id,
        attempt: l.attempt,
        micros: l.micros,
        extra: l.extra.to_string(),
    })
}

/// Waits for a child process to exit (its stdin closed by the caller), at most `limit`; its
/// status, or `None` if it is still running.
pub fn wait_exit(
    child: &mut std::process::Child,
    limit: std::time::Duration,
) -> Option<std::process::ExitStatus> {
    let deadline = std::time::Instant::now() + limit;
    loop {
        if let Some(s) = child.try_wait().expect("wait for a child") {
            return Some(s);
        }
        if std::time::Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}
