//! Advisory keys in work, below both the dialects (which own a registry per SQLite file) and the
//! forms (which take and give back keys).
//!
//! - [`KeyRegistry`]: the keys in work in this process, for databases with no server-side
//!   advisory locks (SQLite). A key is held through a [`ProcessKey`], which gives it back when
//!   dropped, so no path (an error, a panic, a claim cut short) can leave a key held for the
//!   life of the process.
//!   On the servers a registry per table also records the keys this broker's sessions hold, so
//!   a claim spends no lock round trip on a key it would be refused.
//! - [`SessionKeys`]: the keys a server session holds (PostgreSQL, MySQL). It keeps its
//!   connection marked broken while any key is held or any unlock went wrong, so the pool never
//!   hands out a session that may still hold a key: ending the session releases its keys.

use std::collections::HashSet;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::dialect::conn::DbConn;
use crate::error::DbError;
use crate::model::value::Value;

/// Keys in work in this process, for databases without server-side advisory locks.
#[derive(Default)]
pub(crate) struct KeyRegistry {
    held: Mutex<HashSet<String>>,
}

impl KeyRegistry {
    /// Takes `key` unless it is in work; the guard gives it back when dropped.
    pub fn try_take(self: &Arc<Self>, key: &str) -> Option<ProcessKey> {
        let mut held = self.held.lock();
        if held.contains(key) {
            return None;
        }
        held.insert(key.to_string());
        Some(ProcessKey {
            registry: self.clone(),
            key: key.to_string(),
        })
    }

    /// True while `key` is held through this registry.
    pub fn is_held(&self, key: &str) -> bool {
        self.held.lock().contains(key)
    }
}

/// A key held in a [`KeyRegistry`]; given back on drop.
pub(crate) struct ProcessKey {
    registry: Arc<KeyRegistry>,
    key: String,
}

impl Drop for ProcessKey {
    fn drop(&mut self) {
        self.registry.held.lock().remove(&self.key);
    }
}

/// The lock and unlock statements of a server's advisory locks, `(name)` -> 1 on success.
pub(crate) struct KeySql<'a> {
    pub lock: &'a str,
    pub unlock: &'a str,
}

/// The keys one server session holds. Every lock and unlock goes through it, and after each the
/// connection is marked broken exactly while a key may be held: a key whose lock or unlock
/// failed counts as held for good (only ending the session frees it).
#[derive(Default)]
pub(crate) struct SessionKeys {
    held: HashSet<String>,
    /// A lock or unlock failed: the session's keys are unknown.
    unknown: bool,
}

impl SessionKeys {
    /// Tries `name` without waiting: `Ok(true)` if taken, `Ok(false)` if another session has it.
    ///
    /// Modelled in model/advisory.pml (key_lock).
    pub fn lock(
        &mut self,
        conn: &mut dyn DbConn,
        sql: &KeySql<'_>,
        name: &str,
    ) -> Result<bool, DbError> {
        // Broken before the statement: should anything unwind meanwhile, the session goes.
        conn.mark_broken();
        let r = key_query(conn, sql.lock, name);
        match &r {
            Ok(true) => {
                self.held.insert(name.to_string());
            }
            Ok(false) => {}
            Err(_) => self.unknown = true,
        }
        self.sync(conn);
        r
    }

    /// Unlocks `name`; false if the session may still hold it (then it is never pooled again).
    pub fn unlock(&mut self, conn: &mut dyn DbConn, sql: &KeySql<'_>, name: &str) -> bool {
        let ok = matches!(key_query(conn, sql.unlock, name), Ok(true));
        if ok {
            self.held.remove(name);
        } else {
            self.unknown = true;
        }
        self.sync(conn);
        ok
    }

    /// True while a key may be held.
    pub fn any(&self) -> bool {
        self.unknown || !self.held.is_empty()
    }

    fn sync(&self, conn: &mut dyn DbConn) {
        conn.set_broken(self.any());
    }
}

/// Runs a key lock or unlock statement; true if it reports success (1).
fn key_query(conn: &mut dyn DbConn, sql: &str, name: &str) -> Result<bool, DbError> {
    let rows = conn.query(sql, &[Value::Text(name.to_string())])?;
    Ok(matches!(
        rows.first().and_then(|r| r.first()),
        Some(Value::Int(1))
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::DbErrorKind;

    #[test]
    fn process_keys_are_given_back_on_every_path() {
        let r = Arc::new(KeyRegistry::default());
        let a = r.try_take("a").expect("free");
        assert!(r.try_take("a").is_none(), "taken twice");
        // An error path that drops what it took (the old leak: a `Vec` of claims dropped on `?`).
        let taken: Vec<ProcessKey> = vec![a, r.try_take("b").unwrap()];
        let failed: Result<(), ()> = Err(());
        if failed.is_err() {
            drop(taken);
        }
        assert!(!r.is_held("a") && !r.is_held("b"), "a key leaked");
        assert!(r.try_take("a").is_some());
    }

    /// A connection answering lock and unlock statements from a script.
    struct Scripted {
        answers: Vec<Result<i64, ()>>,
        broken: bool,
    }

    impl DbConn for Scripted {
        fn execute(&mut self, _: &str, _: &[Value]) -> Result<u64, DbError> {
            unreachable!()
        }
        fn query(&mut self, _: &str, _: &[Value]) -> Result<Vec<Vec<Value>>, DbError> {
            match self.answers.remove(0) {
                Ok(n) => Ok(vec![vec![Value::Int(n)]]),
                Err(()) => Err(DbError::new(DbErrorKind::Other, "statement failed")),
            }
        }
        fn batch(&mut self, _: &str) -> Result<(), DbError> {
            Ok(())
        }
        fn is_broken(&self) -> bool {
            self.broken
        }
        fn set_broken(&mut self, broken: bool) {
            self.broken = broken;
        }
    }

    const SQL: KeySql<'static> = KeySql {
        lock: "lock",
        unlock: "unlock",
    };

    #[test]
    fn a_session_is_poolable_only_while_it_holds_nothing() {
        let mut conn = Scripted {
            answers: vec![Ok(1), Ok(1)],
            broken: false,
        };
        let mut keys = SessionKeys::default();
        assert!(keys.lock(&mut conn, &SQL, "a").unwrap());
        assert!(conn.broken, "pooled while holding a key");
        assert!(keys.unlock(&mut conn, &SQL, "a"));
        assert!(!conn.broken, "discarded though it holds nothing");
    }

    #[test]
    fn a_failed_unlock_is_never_forgotten_by_a_later_good_one() {
        // Claim 1: lock a, take fails, unlock a fails (statement error on a live session).
        // Then lock b, unlock b succeeds. The session may still hold a: never pool it.
        let mut conn = Scripted {
            answers: vec![Ok(1), Err(()), Ok(1), Ok(1)],
            broken: false,
        };
        let mut keys = SessionKeys::default();
        assert!(keys.lock(&mut conn, &SQL, "a").unwrap());
        assert!(!keys.unlock(&mut conn, &SQL, "a"));
        assert!(keys.lock(&mut conn, &SQL, "b").unwrap());
        assert!(keys.unlock(&mut conn, &SQL, "b"));
        assert!(
            conn.broken,
            "a session that may hold key a was made poolable"
        );
        // An unlock reporting 0 (not held) leaves the session's keys unknown too.
        let mut conn = Scripted {
            answers: vec![Ok(1), Ok(0)],
            broken: false,
        };
        let mut keys = SessionKeys::default();
        keys.lock(&mut conn, &SQL, "a").unwrap();
        assert!(!keys.unlock(&mut conn, &SQL, "a"));
        assert!(conn.broken);
    }
}
