//! Login sessions (token mode): the login form exchanges the token for a random session id,
//! and the cookie carries the id, never the token itself. A session lasts [`LIFETIME`]; at most
//! [`MAX`] are kept (the oldest goes first), so a flood of logins holds bounded memory.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// How long a login lasts.
pub(crate) const LIFETIME: Duration = Duration::from_secs(12 * 3600);
/// The most sessions kept at once.
const MAX: usize = 1_000;

/// A random id of 128 bits, in hex, from the operating system's generator.
pub(crate) fn random_id() -> String {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).expect("the operating system's random generator");
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The open sessions, by id, with when each started.
#[derive(Default)]
pub(crate) struct Sessions(Mutex<HashMap<String, Instant>>);

impl Sessions {
    /// A new session's id.
    pub fn open(&self) -> String {
        let id = random_id();
        let now = Instant::now();
        let mut open = self.0.lock();
        open.retain(|_, at| now.duration_since(*at) < LIFETIME);
        if open.len() >= MAX {
            if let Some(oldest) = open
                .iter()
                .min_by_key(|(_, at)| **at)
                .map(|(k, _)| k.clone())
            {
                open.remove(&oldest);
            }
        }
        open.insert(id.clone(), now);
        id
    }

    /// True if `id` is an open session that has not expired.
    pub fn valid(&self, id: &str) -> bool {
        self.0
            .lock()
            .get(id)
            .is_some_and(|at| at.elapsed() < LIFETIME)
    }

    /// Ends the session `id` (logout).
    pub fn close(&self, id: &str) {
        self.0.lock().remove(id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_open_check_and_close() {
        let s = Sessions::default();
        let a = s.open();
        assert_eq!(a.len(), 32);
        assert!(s.valid(&a));
        assert!(!s.valid("0123"));
        assert_ne!(a, s.open(), "ids are random");
        s.close(&a);
        assert!(!s.valid(&a));
    }

    #[test]
    fn at_most_max_sessions_are_kept() {
        let s = Sessions::default();
        let first = s.open();
        for _ in 0..MAX {
            s.open();
        }
        assert_eq!(s.0.lock().len(), MAX);
        assert!(!s.valid(&first), "the oldest went first");
    }
}
