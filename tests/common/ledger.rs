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

/// What a ledger line says happened, for every chaos suite's workers (each writes the kinds it
/// needs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The worker's subscription started.
    Ready,
    /// A handler started a delivery; `extra` may carry its key.
    Start,
    /// The handler is about to ack it.
    Acking,
    /// The ack returned `Ok`.
    Done,
    /// The ack returned an error (in `extra`).
    AckErr,
    /// The worker stopped gracefully.
    Exit,
    /// A claim began, and the claims in progress are back to none (sampled).
    Claiming,
    Claimed,
    /// A pooled connection was taken and held, given back, or could not be taken.
    Held,
    Freed,
    HoldErr,
}

impl Kind {
    fn named(name: &str) -> Option<Kind> {
        Some(match name {
            "READY" => Kind::Ready,
            "START" => Kind::Start,
            "ACKING" => Kind::Acking,
            "DONE" => Kind::Done,
            "ACKERR" => Kind::AckErr,
            "EXIT" => Kind::Exit,
            "CLAIMING" => Kind::Claiming,
            "CLAIMED" => Kind::Claimed,
            "HELD" => Kind::Held,
            "FREED" => Kind::Freed,
            "HOLDERR" => Kind::HoldErr,
            _ => return None,
        })
    }
}

/// A ledger line as the parent keeps it: which child wrote it, and its fields.
#[derive(Debug, Clone)]
pub struct Event {
    pub child: usize,
    pub kind: Kind,
    pub id: i64,
    pub attempt: u32,
    pub micros: i64,
    pub extra: String,
}

impl std::fmt::Display for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "[child {} @{}] {:?} id {} attempt {} {}",
            self.child, self.micros, self.kind, self.id, self.attempt, self.extra
        )
    }
}

/// The ledger line in `line`, written by `child`, if it is one.
pub fn event(child: usize, line: &str) -> Option<Event> {
    let l = parse(line)?;
    Some(Event {
        child,
        kind: Kind::named(l.kind)?,
        id: l.id,
        attempt: l.attempt,
        micros: l.micros,
        extra: l.extra.to_string(),
    })
}

/// The lines about each job (`START`, `ACKING`, `DONE`, `ACKERR`), in the order written.
pub fn by_id(events: &[Event]) -> std::collections::BTreeMap<i64, Vec<&Event>> {
    let mut by_id: std::collections::BTreeMap<i64, Vec<&Event>> = Default::default();
    for e in events {
        if matches!(
            e.kind,
            Kind::Start | Kind::Acking | Kind::Done | Kind::AckErr
        ) {
            by_id.entry(e.id).or_default().push(e);
        }
    }
    for v in by_id.values_mut() {
        v.sort_by_key(|e| e.micros);
    }
    by_id
}

/// The first line of `kind` written by `child` among a job's lines.
pub fn first<'a>(lines: Option<&Vec<&'a Event>>, child: usize, kind: Kind) -> Option<&'a Event> {
    lines.and_then(|v| {
        v.iter()
            .copied()
            .find(|e| e.child == child && e.kind == kind)
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
