//! What a broker keeps between claims of a table with rate limits or fair claims: where its
//! fair rotation stands, when a full rate window next has room, when the window slots were
//! last swept.

use std::time::{Duration, Instant, SystemTime};

use parking_lot::Mutex;

use crate::model::value::Value;
use crate::runtime::cursor::{Key, RESCAN};
use crate::runtime::limits::LimitsInForce;

/// How often a broker deletes a table's window slots that are free (an idle key's slots).
const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// A table's flow control state in one broker.
pub(crate) struct FlowState {
    /// Fair claims: the key column's value of the last key served (`None`: start from the
    /// first key).
    fair_after: Mutex<Option<Value>>,
    /// Rate limits: the earliest moment a window a claim found full has room again.
    rate_room: Mutex<Option<SystemTime>>,
    /// When this broker last swept the free window slots.
    swept: Mutex<Option<Instant>>,
    /// Rate limits: the maxes in force, by the record's text.
    pub rate_maxes: LimitsInForce,
    /// Fair claims: every key with due rows, as last read whole (when they fit one read), and
    /// when.
    fair_keys: Mutex<Option<(Instant, Vec<Value>)>>,
    /// When a claim of this broker began to read the fair keys again, until it is done.
    fair_keys_reading: Mutex<Option<Instant>>,
    /// Fair claims: the first rows' statement by key count and whether it reads the `NULL`
    /// key, and whether it locks them, built once each (the same text, the same prepared
    /// statement).
    fair_heads: Mutex<std::collections::HashMap<(usize, bool, bool), std::sync::Arc<str>>>,
    /// Fair claims read after a cursor per key (the servers' lease claims): each key's claim
    /// order position `(run_at, id)` past the rows taken of it, and when the cursors were all
    /// last dropped ([`FlowState::fair_cursor`]).
    fair_cursors: Mutex<(Option<Instant>, std::collections::HashMap<String, Key>)>,
    /// Rate limits: the keys a claim found without a free slot and with fewer than their
    /// max, by limit and key: the key's max and how many slots the claim wanted, made before
    /// this broker's next claim begins ([`FlowState::rate_needs`]). At most [`NEEDS_KEPT`].
    rate_needs: Mutex<std::collections::BTreeMap<(i64, String), (u32, usize)>>,
}

/// The most keys [`FlowState::rate_need`] keeps between two claims (more are found short again
/// by a later claim).
const NEEDS_KEPT: usize = 256;

impl Default for FlowState {
    fn default() -> Self {
        FlowState {
            fair_after: Mutex::default(),
            rate_room: Mutex::default(),
            swept: Mutex::default(),
            rate_maxes: LimitsInForce::rates(),
            fair_keys: Mutex::default(),
            fair_keys_reading: Mutex::default(),
            fair_heads: Mutex::default(),
            fair_cursors: Mutex::default(),
            rate_needs: Mutex::default(),
        }
    }
}

impl FlowState {
    /// The key the fair rotation goes on after.
    pub fn fair_after(&self) -> Option<Value> {
        self.fair_after.lock().clone()
    }

    /// The rotation served `key` last (`None`: it ended a round).
    pub fn served(&self, key: Option<Value>) {
        *self.fair_after.lock() = key;
    }

    /// Every fair key, if read whole less than `fresh` ago, or while another claim of this
    /// broker reads them again (begun less than [`RESCAN`] ago): claims running side by side
    /// go on with the keys of a moment ago rather than each read them (on MariaDB a read walks
    /// the delete-marked entries at the head of every key's range, 20 ms over a burn-down).
    /// `None`: this claim reads them, and says so with [`FlowState::fair_keys_read`].
    pub fn fair_keys(&self, fresh: Duration) -> Option<Vec<Value>> {
        let keys = self.fair_keys.lock();
        let (at, list) = keys.as_ref()?;
        if at.elapsed() < fresh {
            return Some(list.clone());
        }
        let mut reading = self.fair_keys_reading.lock();
        match *reading {
            Some(since) if since.elapsed() < RESCAN => Some(list.clone()),
            _ => {
                *reading = Some(Instant::now());
                None
            }
        }
    }

    /// A claim's read of the keys is over (whether or not it read them whole).
    pub fn fair_keys_read(&self) {
        *self.fair_keys_reading.lock() = None;
    }

    /// Notes every fair key, as just read whole, ascending.
    pub fn all_fair_keys(&self, keys: Vec<Value>) {
        *self.fair_keys.lock() = Some((Instant::now(), keys));
    }

    /// The first rows' statement for `keys` keys (and the `NULL` key, with `null`; locking
    /// them, with `locked`), built by `build` the first time.
    pub fn fair_heads(
        &self,
        keys: usize,
        null: bool,
        locked: bool,
        build: impl FnOnce() -> String,
    ) -> std::sync::Arc<str> {
        self.fair_heads
            .lock()
            .entry((keys, null, locked))
            .or_insert_with(|| build().into())
            .clone()
    }

    /// Where fair key `key`'s next read starts: after the rows taken of it, or `None`, from
    /// the head of its range. Every cursor is dropped once every [`RESCAN`], and a key's own
    /// when a read from it comes back short ([`FlowState::fair_short`]): a row that becomes
    /// claimable behind a cursor (a lease expired, a row handed back, a publish that committed
    /// after later ids were taken) is read by the next claim from the head, within that time,
    /// as with a subscription's claim cursor (`runtime/cursor.rs`).
    pub fn fair_cursor(&self, key: &str) -> Option<Key> {
        let mut cursors = self.fair_cursors.lock();
        if cursors.0.is_none_or(|at| at.elapsed() >= RESCAN) {
            cursors.0 = Some(Instant::now());
            cursors.1.clear();
            return None;
        }
        cursors.1.get(key).copied()
    }

    /// A claim took fair key `key`'s rows up to `to` (with none passed by before it).
    pub fn fair_moved(&self, key: String, to: Key) {
        let mut cursors = self.fair_cursors.lock();
        let at = cursors.1.entry(key).or_insert(to);
        *at = (*at).max(to);
    }

    /// A read of fair key `key` came back short of the rows it asked for: the key's next read
    /// starts from the head of its range.
    pub fn fair_short(&self, key: &str) {
        self.fair_cursors.lock().1.remove(key);
    }

    /// A claim found a rate window full until `at`.
    pub fn full_until(&self, at: SystemTime) {
        let mut room = self.rate_room.lock();
        if room.is_none_or(|r| at < r) {
            *room = Some(at);
        }
    }

    /// A claim found rate limit `lim`'s `key` (its max `max`) without a free slot and wanted
    /// `n`.
    pub fn rate_need(&self, lim: i64, key: &str, max: u32, n: usize) {
        let mut needs = self.rate_needs.lock();
        if needs.len() < NEEDS_KEPT || needs.contains_key(&(lim, key.to_string())) {
            let e = needs.entry((lim, key.to_string())).or_insert((max, 0));
            *e = (max, e.1.max(n));
        }
    }

    /// True if a claim found a key short of slots since they were last made.
    pub fn has_rate_needs(&self) -> bool {
        !self.rate_needs.lock().is_empty()
    }

    /// The slots claims found missing, by limit and key in order (a key's max and how many),
    /// forgotten as given.
    pub fn rate_needs(&self) -> Vec<((i64, String), (u32, usize))> {
        std::mem::take(&mut *self.rate_needs.lock())
            .into_iter()
            .collect()
    }

    /// How long until a window a claim found full has room, if one did (once that moment
    /// has passed it is forgotten: the next claim that finds a window full notes it again).
    pub fn room_wait(&self) -> Option<Duration> {
        let mut room = self.rate_room.lock();
        let at = (*room)?;
        match at.duration_since(SystemTime::now()) {
            Ok(wait) => Some(wait),
            Err(_) => {
                *room = None;
                Some(Duration::ZERO)
            }
        }
    }

    /// True (once a minute) if the caller should sweep the free slots now.
    pub fn sweep_due(&self) -> bool {
        once_a_minute(&self.swept)
    }
}

/// True if [`SWEEP_EVERY`] has passed since `last` (or it is unset), which is then set to now.
fn once_a_minute(last: &Mutex<Option<Instant>>) -> bool {
    let mut last = last.lock();
    let due = last.is_none_or(|at| at.elapsed() >= SWEEP_EVERY);
    if due {
        *last = Some(Instant::now());
    }
    due
}

/// A key as the rate slots' table holds it: long keys (past 200 bytes) are cut and given a hash
/// of the whole, so they fit every database's key column. Two long keys that collide share a
/// window: never more claims than a limit allows. Every key ends with `|`, so no trailing
/// space is the last character a collation sees: MySQL's `PAD SPACE` collations (the rate
/// slots' `utf8mb4_bin` on MariaDB) would make `"a"` and `"a "` one key, where every other
/// database, and the dedup keys, tell them apart.
pub(crate) fn slot_key(key: &str) -> String {
    let mut out = cut_key(key);
    out.push('|');
    out
}

/// `key`, or, past 200 bytes, its first 180 and a hash of the whole.
fn cut_key(key: &str) -> String {
    if key.len() <= 200 {
        return key.to_string();
    }
    let mut cut = 180;
    while !key.is_char_boundary(cut) {
        cut -= 1;
    }
    // FNV-1a, 64 bits: stable across releases and platforms.
    let hash = key.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    format!("{}#{hash:016x}", &key[..cut])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keys past 200 bytes are cut at a character boundary and hashed whole: two keys equal
    /// for their first 180 bytes stay apart.
    #[test]
    fn long_keys_fit_the_key_column() {
        assert_eq!(slot_key("acme"), "acme|");
        assert_ne!(slot_key("a"), slot_key("a "));
        let a = format!("{}a", "é".repeat(150));
        let b = format!("{}b", "é".repeat(150));
        let (ka, kb) = (slot_key(&a), slot_key(&b));
        assert!(ka.len() <= 200, "{}", ka.len());
        assert_ne!(ka, kb);
        assert_eq!(ka, slot_key(&a));
    }
}
