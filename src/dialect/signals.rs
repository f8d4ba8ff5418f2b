//! The statements of jobs that wait for a signal ([`Message::after_signal`]), kept in
//! `sqlbroker_deps` beside the waits on other jobs, so a signal takes the same locks and
//! counts as a job waited on does:
//! - a signal's **head** (`parent_table` = `!` + its name, `parent` = its table's scope, see
//!   [`scope`]; `child_table = ''`, `child = 0`): made by the first publish that waits for it
//!   or by the signal, it holds `acked` and the payload once the signal came (`NULL` before).
//!   The publish and the signal both lock it first, so neither passes the other unseen;
//! - a **wait** (head -> job): as a wait on a job, its `outcome` set by the signal (`acked`)
//!   or by the sweeper past the job's deadline ([`TIMED_OUT`]), whichever locks the head
//!   first; its `at` is the deadline in milliseconds ([`NO_DEADLINE`] without one).
//!
//! A table name is an identifier, so a `parent_table` that starts with `!` is a signal's.
//!
//! [`Message::after_signal`]: crate::Message::after_signal

use crate::dialect::shared::Syntax;

/// What a signal's `parent_table` starts with (never a table name's first character).
pub(crate) const PREFIX: &str = "!";

/// A wait's outcome once its deadline passed without the signal.
pub(crate) const TIMED_OUT: &str = "timeout";

/// The longest signal name: with [`PREFIX`], the 64 characters MySQL's key column holds.
pub(crate) const NAME_MAX: usize = 63;

/// The `at` of a wait without a deadline.
pub(crate) const NO_DEADLINE: i64 = i64::MAX;

/// Signals waited on a dashboard lists at most, per table.
pub(crate) const LISTED: usize = 100;

/// True if `parent_table` names a signal, not a table.
pub(crate) fn is_signal(parent_table: &str) -> bool {
    parent_table.starts_with(PREFIX)
}

/// A signal's `parent_table`.
pub(crate) fn head_name(name: &str) -> String {
    format!("{PREFIX}{name}")
}

/// The signal name a `parent_table` holds.
pub(crate) fn name_of(parent_table: &str) -> &str {
    parent_table.strip_prefix(PREFIX).unwrap_or(parent_table)
}

/// The scope of a table's signals (a head's `parent`): a stable 64-bit FNV-1a hash of the
/// table's name, positive, so a signal of one table releases no job of another.
pub(crate) fn scope(table: &str) -> i64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in table.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    ((h >> 1) as i64).max(1)
}

/// A signal name's check: 1 to [`NAME_MAX`] characters of `A-Z a-z 0-9 _ . : -`.
pub(crate) fn check_name(name: &str) -> Result<(), String> {
    let ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | ':' | '-');
    if name.is_empty() || name.len() > NAME_MAX || !name.chars().all(ok) {
        return Err(format!(
            "signal name {name:?}: 1 to {NAME_MAX} characters of A-Z a-z 0-9 _ . : -"
        ));
    }
    Ok(())
}

/// The signals' own statements, parameters listed as `(..)`.
#[derive(Debug, Clone, Default)]
pub(crate) struct SignalSql {
    /// `(parent_table, parent, child_table, child)` -> `outcome, at` of one wait, locked.
    pub wait_read: String,
    /// `(parent_table, parent, child_table, child)` -> `at` of one wait (its deadline), not
    /// locked: what operators and handlers read.
    pub wait_deadline: String,
    /// `(parent_table, parent, at)` deletes a signal's head that holds no signal, if its `at`
    /// is still as read (a publish that waits for it moves it on).
    pub unhead_unsent: String,
    /// `(table, scope)` -> `parent_table, jobs` of the signals the table's jobs wait for (no
    /// outcome yet), by name, [`LISTED`] at most.
    pub waited: String,
}

impl Syntax {
    /// The signals' statements on the waits' table `table`, `locking` the database's row lock
    /// clause (` FOR UPDATE`, or nothing on SQLite): the waits' statements pass both, so this
    /// module names nothing of theirs.
    pub fn signal_sql(&self, table: &str, locking: &str) -> SignalSql {
        let t = self.q(table);
        let p = |n| self.p(n);
        SignalSql {
            wait_read: format!(
                "SELECT outcome, at FROM {t} WHERE parent_table = {} AND parent = {} AND \
                 child_table = {} AND child = {}{}",
                p(1),
                p(2),
                p(3),
                p(4),
                locking
            ),
            wait_deadline: format!(
                "SELECT at FROM {t} WHERE parent_table = {} AND parent = {} AND child_table = {} \
                 AND child = {}",
                p(1),
                p(2),
                p(3),
                p(4)
            ),
            unhead_unsent: format!(
                "DELETE FROM {t} WHERE parent_table = {} AND parent = {} AND child_table = '' \
                 AND child = 0 AND outcome IS NULL AND at = {}",
                p(1),
                p(2),
                p(3)
            ),
            waited: format!(
                "SELECT parent_table, COUNT(*) FROM {t} WHERE child_table = {} AND parent = {} \
                 AND outcome IS NULL AND SUBSTR(parent_table, 1, 1) = '{PREFIX}' GROUP BY \
                 parent_table ORDER BY parent_table {}",
                p(1),
                p(2),
                (self.claim_limit)(&LISTED.to_string())
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked_and_never_a_table() {
        assert!(check_name("approved:order-7").is_ok());
        assert!(check_name("").is_err());
        assert!(check_name("a b").is_err());
        assert!(check_name(&"x".repeat(NAME_MAX + 1)).is_err());
        assert!(check_name(&"x".repeat(NAME_MAX)).is_ok());
        assert!(is_signal(&head_name("a")));
        assert_eq!(name_of(&head_name("a")), "a");
        assert_ne!(scope("orders"), scope("orders2"));
        assert!(scope("orders") > 0);
    }
}
