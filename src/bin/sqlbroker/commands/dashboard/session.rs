//! Login sessions (token mode): the login form exchanges the token for a random session id,
//! and the cookie carries the id, never the token itself. A session lasts [`LIFETIME`]; at most
//! [`MAX`] are kept (the oldest goes first), so a flood of logins holds bounded memory.

use std::collections::HashMap;
use std::net::IpAddr;
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

/// The longest name an operator gives at login, in characters.
pub(crate) const NAME_MAX: usize = 64;

/// The open sessions, by id, with when each started and the name its operator gave (the
/// action log's "who").
#[derive(Default)]
pub(crate) struct Sessions(Mutex<HashMap<String, (Instant, String)>>);

impl Sessions {
    /// A new session's id, for the operator named `name` (cut to [`NAME_MAX`] characters,
    /// control characters dropped).
    pub fn open(&self, name: &str) -> String {
        let id = random_id();
        let now = Instant::now();
        let name: String = name
            .trim()
            .chars()
            .filter(|c| !c.is_control())
            .take(NAME_MAX)
            .collect();
        let mut open = self.0.lock();
        open.retain(|_, (at, _)| now.duration_since(*at) < LIFETIME);
        if open.len() >= MAX {
            if let Some(oldest) = open
                .iter()
                .min_by_key(|(_, (at, _))| *at)
                .map(|(k, _)| k.clone())
            {
                open.remove(&oldest);
            }
        }
        open.insert(id.clone(), (now, name));
        id
    }

    /// True if `id` is an open session that has not expired.
    pub fn valid(&self, id: &str) -> bool {
        self.name(id).is_some()
    }

    /// The name given at the login of the open session `id` (empty if none was given).
    pub fn name(&self, id: &str) -> Option<String> {
        self.0
            .lock()
            .get(id)
            .filter(|(at, _)| at.elapsed() < LIFETIME)
            .map(|(_, name)| name.clone())
    }

    /// Ends the session `id` (logout).
    pub fn close(&self, id: &str) {
        self.0.lock().remove(id);
    }
}

/// Wrong tokens an address may send within [`WINDOW`] before its wrong tokens are throttled.
pub(crate) const FAILURES: u32 = 5;
/// How long an address's failures count (from its first).
pub(crate) const WINDOW: Duration = Duration::from_secs(60);
/// How long a throttled failure's answer is held back (by the server's polling thread: no
/// worker waits), so a client that guesses one token after another guesses one a second.
pub(crate) const HOLD: Duration = Duration::from_secs(1);
/// The most addresses whose failures are kept: past it the oldest record goes, so a flood
/// from many addresses holds bounded memory.
const ADDRESSES: usize = 4_096;

/// Wrong tokens by client address (IPv6: by its /64, which one host usually holds whole).
/// Past [`FAILURES`] within [`WINDOW`], an address's wrong tokens are answered 429 with
/// `Retry-After`, [`HOLD`] late. Only wrong tokens: the right token is never refused, from
/// any address, so failures from one client (every client behind one TLS proxy shares its
/// address) lock no one else out, and a scraper's bearer token keeps working. What keeps a
/// token from being guessed is its length (at least
/// [`TOKEN_MIN`](super::TOKEN_MIN) characters off loopback).
#[derive(Default)]
pub(crate) struct Throttle(Mutex<HashMap<IpAddr, (u32, Instant)>>);

fn client(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(std::net::Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
        v4 => v4,
    }
}

impl Throttle {
    /// Counts a wrong token from `ip`: `Some(wait)` if that address is past its
    /// [`FAILURES`] (answer 429: its window ends in `wait`), `None` if not yet.
    pub fn failed(&self, ip: IpAddr) -> Option<Duration> {
        let now = Instant::now();
        let mut failures = self.0.lock();
        if failures.len() >= ADDRESSES {
            failures.retain(|_, (_, first)| now.duration_since(*first) < WINDOW);
        }
        if failures.len() >= ADDRESSES {
            if let Some(oldest) = failures
                .iter()
                .min_by_key(|(_, (_, at))| *at)
                .map(|(k, _)| *k)
            {
                failures.remove(&oldest);
            }
        }
        let entry = failures.entry(client(ip)).or_insert((0, now));
        if now.duration_since(entry.1) >= WINDOW {
            *entry = (0, now);
        }
        entry.0 = entry.0.saturating_add(1);
        (entry.0 > FAILURES).then(|| WINDOW.saturating_sub(now.duration_since(entry.1)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrong_tokens_are_throttled_per_address_and_the_table_is_bounded() {
        let t = Throttle::default();
        let a = IpAddr::from([10, 0, 0, 1]);
        for _ in 0..FAILURES {
            assert_eq!(t.failed(a), None);
        }
        assert!(t.failed(a).is_some_and(|w| w <= WINDOW));
        assert_eq!(
            t.failed(IpAddr::from([10, 0, 0, 2])),
            None,
            "others count apart"
        );
        // One host's /64 is one client.
        let v6 =
            |last: u16| IpAddr::V6(std::net::Ipv6Addr::new(0x2001, 0xdb8, 0, 1, 0, 0, 0, last));
        for n in 0..FAILURES as u16 {
            t.failed(v6(n));
        }
        assert!(t.failed(v6(999)).is_some());
        for n in 0..(ADDRESSES as u32 + 10) {
            t.failed(IpAddr::from(n.wrapping_add(0x0b00_0000).to_be_bytes()));
        }
        assert!(t.0.lock().len() <= ADDRESSES);
    }

    #[test]
    fn sessions_open_check_and_close() {
        let s = Sessions::default();
        let a = s.open(" ana\u{1b}[31m ");
        assert_eq!(
            s.name(&a).as_deref(),
            Some("ana[31m"),
            "trimmed, no control characters"
        );
        assert_eq!(a.len(), 32);
        assert!(s.valid(&a));
        assert!(!s.valid("0123"));
        assert_ne!(a, s.open(""), "ids are random");
        s.close(&a);
        assert!(!s.valid(&a));
    }

    #[test]
    fn at_most_max_sessions_are_kept() {
        let s = Sessions::default();
        let first = s.open("");
        for _ in 0..MAX {
            s.open("");
        }
        assert_eq!(s.0.lock().len(), MAX);
        assert!(!s.valid(&first), "the oldest went first");
    }
}
