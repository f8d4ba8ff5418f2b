//! The payload of a collected job ([`Message::collect`](crate::Message::collect)): the events
//! of one burst framed in the job's own payload, so they live and die with its row (an ack,
//! a dead letter's purge, a cancel or a delete removes them with it) and need no bookkeeping
//! of their own. A header, then each event as a 4-byte big-endian length and its bytes, in
//! publish order.

use std::time::Duration;

/// The most events one collected job holds. The event that fills a job makes it due at once;
/// the next event of its key starts the next job.
pub const COLLECT_MAX_EVENTS: usize = 1_000;

/// The most bytes of events one collected job holds (each event counted with its 4-byte
/// length): an event that would take a job past it starts the next job and makes the full one
/// due at once. One event longer than this is refused by the publish. The bound keeps what
/// each event rewrites (the job's payload so far) small.
pub const COLLECT_MAX_BYTES: usize = 1 << 20;

/// The longest collect key, in characters (as MySQL's text columns).
pub const COLLECT_KEY_MAX: usize = 255;

/// How a collected job's payload starts: a NUL, then a name a person reading the row knows.
pub(crate) const HEADER: &[u8] = b"\0sqlbroker-collect\0";

/// How a message is collected: its key, and the quiet and the longest wait of its job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Collect {
    pub key: String,
    pub quiet: Duration,
    pub max_wait: Duration,
}

impl Collect {
    /// What is wrong with it, if anything (checked before any SQL runs).
    pub fn problem(&self, event_len: usize) -> Option<String> {
        if self.key.is_empty() {
            return Some("Message::collect with an empty key".into());
        }
        if self.key.chars().count() > COLLECT_KEY_MAX {
            return Some(format!(
                "a collect key is at most {COLLECT_KEY_MAX} characters"
            ));
        }
        if self.key.contains('\0') {
            return Some("a collect key holds no NUL character (PostgreSQL text cannot)".into());
        }
        if self.quiet.is_zero() {
            return Some("Message::collect with a quiet of zero (it is more than zero)".into());
        }
        if self.max_wait < self.quiet {
            return Some(format!(
                "Message::collect with a max_wait ({:?}) shorter than its quiet ({:?})",
                self.max_wait, self.quiet
            ));
        }
        if event_len + 4 > COLLECT_MAX_BYTES {
            return Some(format!(
                "a collected event is at most {} bytes (COLLECT_MAX_BYTES less its length)",
                COLLECT_MAX_BYTES - 4
            ));
        }
        None
    }
}

/// The payload of a job whose first event is `event`.
pub(crate) fn first(event: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER.len() + 4 + event.len());
    out.extend_from_slice(HEADER);
    push(&mut out, event);
    out
}

/// Appends `event` to a collected job's payload.
pub(crate) fn push(payload: &mut Vec<u8>, event: &[u8]) {
    let len = u32::try_from(event.len()).unwrap_or(u32::MAX);
    payload.extend_from_slice(&len.to_be_bytes());
    payload.extend_from_slice(event);
}

/// The bytes of events a collected payload holds (the header left out).
pub(crate) fn event_bytes(payload: &[u8]) -> usize {
    payload.len().saturating_sub(HEADER.len())
}

/// True if a collected payload takes no further event: not even an empty one (its 4-byte
/// length) fits in [`COLLECT_MAX_BYTES`]. The event that fills a job makes it due at once.
pub(crate) fn full(payload: &[u8]) -> bool {
    event_bytes(payload) + 4 > COLLECT_MAX_BYTES
}

/// True if a job whose first event is `event_len` bytes is full with it ([`full`]).
pub(crate) fn fills_alone(event_len: usize) -> bool {
    4 + event_len + 4 > COLLECT_MAX_BYTES
}

/// How many events a collected payload holds, walking its frames without copying them:
/// `None` if it is not one (no header, or frames that do not add up).
pub(crate) fn count(payload: &[u8]) -> Option<usize> {
    let mut rest = payload.strip_prefix(HEADER)?;
    let mut n = 0;
    while !rest.is_empty() {
        let (len, tail) = rest.split_first_chunk::<4>()?;
        rest = tail.get(u32::from_be_bytes(*len) as usize..)?;
        n += 1;
    }
    Some(n)
}

/// The events of a payload: `None` if it is not a collected job's (no header), an error if
/// it has the header and its frames do not add up.
pub(crate) fn decode(payload: &[u8]) -> Option<std::result::Result<Vec<Vec<u8>>, String>> {
    let mut rest = payload.strip_prefix(HEADER)?;
    let mut out = Vec::new();
    while !rest.is_empty() {
        let Some((len, tail)) = rest.split_first_chunk::<4>() else {
            return Some(Err(format!(
                "a collected payload ends in {} bytes, not a length",
                rest.len()
            )));
        };
        let len = u32::from_be_bytes(*len) as usize;
        if tail.len() < len {
            return Some(Err(format!(
                "a collected event of {len} bytes where {} are left",
                tail.len()
            )));
        }
        out.push(tail[..len].to_vec());
        rest = &tail[len..];
    }
    Some(Ok(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A job is full once not even an empty event fits, and a first event alone says so as its
    /// framed payload does. Fails if `fills_alone` and `full` disagree at the bound.
    #[test]
    fn full_at_the_bound() {
        for len in [
            0,
            10,
            COLLECT_MAX_BYTES - 9,
            COLLECT_MAX_BYTES - 8,
            COLLECT_MAX_BYTES - 4,
        ] {
            assert_eq!(fills_alone(len), full(&first(&vec![7; len])), "{len}");
        }
        assert!(!fills_alone(COLLECT_MAX_BYTES - 8));
        assert!(fills_alone(COLLECT_MAX_BYTES - 7));
    }

    /// Events framed and read back in order, empty ones included; a payload without the
    /// header is none of ours; a cut one is an error. Fails if `push` or `decode` lose a frame.
    #[test]
    fn frames_round_trip() {
        let mut p = first(b"a");
        push(&mut p, b"");
        push(&mut p, &[0, 0, 0, 9]);
        assert_eq!(
            decode(&p),
            Some(Ok(vec![b"a".to_vec(), Vec::new(), vec![0, 0, 0, 9]]))
        );
        assert_eq!(event_bytes(&p), 4 + 1 + 4 + 4 + 4);
        assert_eq!(count(&p), Some(3));
        assert_eq!(count(&p[..p.len() - 1]), None);
        assert_eq!(count(b"plain"), None);
        assert_eq!(decode(b"plain"), None);
        assert!(matches!(decode(&p[..p.len() - 1]), Some(Err(_))));
    }

    /// Every rule of a collect's options refuses alone. Fails if a check is dropped.
    #[test]
    fn options_are_checked() {
        let c = |key: &str, q: u64, m: u64| Collect {
            key: key.into(),
            quiet: Duration::from_millis(q),
            max_wait: Duration::from_millis(m),
        };
        assert_eq!(c("k", 1, 1).problem(0), None);
        assert!(c("", 1, 1).problem(0).unwrap().contains("empty key"));
        assert!(c(&"x".repeat(256), 1, 1)
            .problem(0)
            .unwrap()
            .contains("255"));
        assert_eq!(c(&"é".repeat(255), 1, 1).problem(0), None);
        assert!(c("a\0", 1, 1).problem(0).unwrap().contains("NUL"));
        assert!(c("k", 0, 1).problem(0).unwrap().contains("quiet of zero"));
        assert!(c("k", 2, 1).problem(0).unwrap().contains("shorter"));
        assert!(c("k", 1, 1).problem(COLLECT_MAX_BYTES).is_some());
        assert_eq!(c("k", 1, 1).problem(COLLECT_MAX_BYTES - 4), None);
    }
}
