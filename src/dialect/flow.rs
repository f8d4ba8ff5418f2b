//! The statements of rate limits and fair claims ([`Table::rate_limit`], [`Table::fair`]),
//! the same on every database but for quoting, placeholders, the locking clause and how an
//! insert ignores a row already there.
//!
//! [`Table::rate_limit`]: crate::Table::rate_limit
//! [`Table::fair`]: crate::Table::fair

use crate::dialect::shared::Syntax;
use crate::model::table::{Form, TableSpec};

/// A rate-limited table's window slots, in the table `<table>_rates`: one row per slot of a
/// limit's key, `(lim, rkey, slot)` its key (`lim` names the limit by its template and window,
/// [`RateSpec::lim_of`](crate::model::table::RateSpec::lim_of)), `at` the milliseconds since the epoch of the
/// claim that took it last (0: never, or given back). A slot is free when `at` is at least a
/// window old; a claim takes one by stamping it, fenced by that condition, so two claims
/// never take one slot within a window, and a key has at most `max` slots (`slot < max`).
/// Parameters are listed as `(..)`.
#[derive(Debug, Clone, Default)]
pub(crate) struct RateSql {
    /// Makes the slots' table if it does not exist, with its index of free slots (MySQL: in
    /// the table's definition).
    pub create: String,
    /// PostgreSQL, SQLite: `(lim, rkey)`'s index by stamp, `(lim, rkey, at)`: a claim finds a
    /// key's oldest free slots without reading the slots stamped within the window
    /// (`CREATE INDEX IF NOT EXISTS`, also run by a migration of a table made before it).
    pub index: Option<String>,
    /// MySQL: adds that index to a slots' table made before it (a migration, where
    /// [`Dialect::index_names`](crate::dialect::Dialect::index_names) finds it missing).
    pub add_index: Option<String>,
    /// PostgreSQL, SQLite: `(at, lim, rkey, free_before, max, n)` stamps up to `n` of the
    /// key's free slots, the oldest first, in one statement (PostgreSQL passing by slots
    /// another claim is stamping, `SKIP LOCKED`) -> each slot stamped.
    pub take_oldest: Option<String>,
    /// PostgreSQL: `(at, lim, keys, counts, free_before, max)` stamps up to `counts[i]` of
    /// `keys[i]`'s free slots, for every key at once (`keys` and `counts` as array literals,
    /// `{"a|","b|"}` and `{3,1}`) -> `(rkey, slot)` of each slot stamped: a claim's page of
    /// rows takes its slots in one statement.
    pub take_keys: Option<String>,
    /// MySQL: `(lim, rkey, free_before, max, n)` -> up to `n` free slots, the oldest first,
    /// locked (`SKIP LOCKED`), for [`RateSql::stamp_in`].
    pub pick: String,
    /// MySQL: `[k]` `(at, lim, rkey, free_before, slot x 2^k)` stamps the slots listed (the
    /// list padded by repeating its last slot) if still free.
    pub stamp_in: Vec<String>,
    /// `(lim, rkey, max)` -> the key's highest slot below `max` (-1: none): new slots take
    /// the numbers above it.
    pub top: String,
    /// `(lim, rkey, from, to)` makes the key's slots `from..=to` that do not exist, free
    /// (`at` = 0): run outside any claim's transaction (it may wait on another maker's insert
    /// of the same slot, and a claim holding locks meanwhile could wait in a circle).
    pub make_free: String,
    /// `[k]` `(lim, rkey, at, slot x 2^k)` gives the slots listed back (`at` = 0) where they
    /// still hold the stamp `at` -> how many.
    pub free_in: Vec<String>,
    /// `[k]` `(new, lim, rkey, at, slot x 2^k)` stamps the slots listed again with `new` where
    /// they still hold the stamp `at` -> how many.
    pub restamp_in: Vec<String>,
    /// `(lim, rkey, max)` -> `count(*), min(at)` of the key's slots: full when the count is
    /// `max`; the oldest stamp is when the window next has room.
    pub usage: String,
    /// `(lim, rkey, max)` -> the key's slot numbers, ascending (once the numbers up to `max`
    /// were made, a new slot takes the first one missing: slots the sweep deleted).
    pub slots: String,
    /// `(lim, rkey, slot, at)` makes a slot (free: `at` = 0); 0 rows if it exists.
    pub insert: String,
    /// `(lim, since)` -> `count(*)` of a limit's slots stamped after `since`: the claims in
    /// the window (operators' counts).
    pub claimed: String,
    /// `(lim, since, max, max)` -> `rkey` of each key with `max` slots stamped after `since`:
    /// the keys whose window is full (operators' counts).
    pub full: String,
    /// `(lim, before, lim, before)` deletes the slots of a limit's keys whose slots are all free since
    /// `before`: an idle key keeps none, and a busy key's slots stay numbered without gaps
    /// (new ones take the numbers above the highest).
    pub sweep: String,
    /// `(before)` deletes every slot stamped before `before` (a day ago: free under any
    /// window), of whichever limit: those of a limit no longer described too.
    pub sweep_any: String,
}

/// Fair claims' reads: the next keys with claimable rows, found by skipping through the index
/// `<table>_fair` (the key column, then the claim order), one probe per key.
#[derive(Debug, Clone, Default)]
pub(crate) struct FairSql {
    /// `[0]` `(now, now, max)` the first keys; `[1]` `(now, after, now, max)` the keys after
    /// `after`; each at most `max` keys with a due unfinished row, ascending.
    pub keys: [String; 2],
}

/// The longest slot list of one statement is `2^IN_LIST_POW` slots (longer lists go in parts).
pub(crate) const IN_LIST_POW: u32 = 6;

/// The name of a table's rate slots' table.
pub(crate) fn rates_table(spec: &TableSpec) -> String {
    format!("{}_rates", spec.name)
}

/// How a database writes an insert that skips a row whose key exists.
#[cfg_attr(
    not(all(feature = "postgres", feature = "mysql", feature = "sqlite")),
    allow(dead_code)
)]
pub(crate) enum InsertIgnore {
    /// `INSERT .. ON CONFLICT DO NOTHING` (PostgreSQL).
    OnConflict,
    /// `INSERT IGNORE INTO` (MySQL/MariaDB).
    Ignore,
    /// `INSERT OR IGNORE INTO` (SQLite).
    OrIgnore,
}

impl Syntax {
    /// The rate slots' statements. `key_type` is the `rkey` column's type, `table_tail` what
    /// follows the table definition (MySQL: its engine), `locking` the servers' `FOR UPDATE
    /// SKIP LOCKED`.
    pub fn rate_sql(
        &self,
        spec: &TableSpec,
        key_type: &str,
        table_tail: &str,
        locking: &str,
        ignore: InsertIgnore,
    ) -> RateSql {
        let t = self.q(&rates_table(spec));
        let key =
            |first: usize| format!("lim = {} AND rkey = {}", self.p(first), self.p(first + 1));
        let insert = format!(
            "INTO {t} (lim, rkey, slot, at) VALUES ({}, {}, {}, {})",
            self.p(1),
            self.p(2),
            self.p(3),
            self.p(4)
        );
        let pg = matches!(ignore, InsertIgnore::OnConflict);
        let mysql = matches!(ignore, InsertIgnore::Ignore);
        let index_name = self.q(&format!("{}_rates_at", spec.name));
        let limit = (self.claim_limit)(&self.p(6));
        // Lists padded to a power of two: a handful of statement texts, whatever the count.
        let listed = |k: u32, first: usize| -> String {
            (0..1usize << k)
                .map(|i| self.p(first + i))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let lists = |make: &dyn Fn(u32) -> String| (0..=IN_LIST_POW).map(make).collect();
        // Slots `from..=to` (parameters 3 and 4) as a column `n`.
        let series = match pg {
            true => format!(
                "generate_series({}::integer, {}::integer) AS r (n)",
                self.p(3),
                self.p(4)
            ),
            false => format!(
                "(WITH RECURSIVE s (n) AS (SELECT {} UNION ALL SELECT n + 1 FROM s WHERE n < {}) \
                 SELECT n FROM s) AS r",
                self.p(3),
                self.p(4)
            ),
        };
        let made = format!(
            "INTO {t} (lim, rkey, slot, at) SELECT {}, {}, n, 0 FROM {series}",
            self.p(1),
            self.p(2),
        );
        RateSql {
            create: format!(
                "CREATE TABLE IF NOT EXISTS {t} (lim INTEGER NOT NULL, rkey {key_type} NOT NULL, \
                 slot INTEGER NOT NULL, at BIGINT NOT NULL, PRIMARY KEY (lim, rkey, slot){}){table_tail}",
                match mysql {
                    true => format!(", INDEX {index_name} (lim, rkey, at)"),
                    false => String::new(),
                }
            ),
            index: (!mysql).then(|| {
                format!("CREATE INDEX IF NOT EXISTS {index_name} ON {t} (lim, rkey, at)")
            }),
            add_index: mysql.then(|| format!("ALTER TABLE {t} ADD INDEX {index_name} (lim, rkey, at)")),
            // PostgreSQL: the rows picked as an array of their row addresses, computed once
            // (a subquery in `IN` may be run again for each row the update reads, locking
            // each time), then stamped by address (a TID scan: an index of the key would
            // read every slot it has). The pick locks them as it reads them free, so the
            // update needs no fence of its own, and no one moves a row this claim holds.
            take_oldest: (!mysql).then(|| {
                let picked = |col: &str| {
                    format!(
                        "SELECT {col} FROM {t} WHERE {} AND at <= {} AND slot < {} ORDER BY at \
                         {limit}{locking}",
                        key(2),
                        self.p(4),
                        self.p(5),
                    )
                };
                match pg {
                    true => format!(
                        "UPDATE {t} SET at = {} WHERE ctid = ANY(ARRAY({})) RETURNING slot",
                        self.p(1),
                        picked("ctid")
                    ),
                    false => format!(
                        "UPDATE {t} SET at = {} WHERE {} AND at <= {} AND slot IN ({}) RETURNING slot",
                        self.p(1),
                        key(2),
                        self.p(4),
                        picked("slot")
                    ),
                }
            }),
            take_keys: pg.then(|| {
                format!(
                    "UPDATE {t} SET at = $1 WHERE ctid = ANY(ARRAY(SELECT s.ctid FROM \
                     unnest($3::text::text[], $4::text::integer[]) AS k (rkey, n) CROSS JOIN LATERAL \
                     (SELECT ctid FROM {t} WHERE lim = $2 AND rkey = k.rkey AND at <= $5 AND slot < $6 \
                     ORDER BY at LIMIT k.n{locking}) AS s)) RETURNING rkey, slot"
                )
            }),
            pick: format!(
                "SELECT slot FROM {t} WHERE {} AND at <= {} AND slot < {} ORDER BY at {}{locking}",
                key(1),
                self.p(3),
                self.p(4),
                (self.claim_limit)(&self.p(5))
            ),
            stamp_in: lists(&|k| {
                format!(
                    "UPDATE {t} SET at = {} WHERE {} AND at <= {} AND slot IN ({})",
                    self.p(1),
                    key(2),
                    self.p(4),
                    listed(k, 5)
                )
            }),
            top: format!(
                "SELECT COALESCE(MAX(slot), -1) FROM {t} WHERE {} AND slot < {}",
                key(1),
                self.p(3)
            ),
            make_free: match ignore {
                InsertIgnore::OnConflict => format!("INSERT {made} ON CONFLICT DO NOTHING"),
                InsertIgnore::Ignore => format!("INSERT IGNORE {made}"),
                InsertIgnore::OrIgnore => format!("INSERT OR IGNORE {made}"),
            },
            usage: format!(
                "SELECT count(*), min(at) FROM {t} WHERE {} AND slot < {}",
                key(1),
                self.p(3)
            ),
            slots: format!(
                "SELECT slot FROM {t} WHERE {} AND slot < {} ORDER BY slot",
                key(1),
                self.p(3)
            ),
            insert: match ignore {
                InsertIgnore::OnConflict => format!("INSERT {insert} ON CONFLICT DO NOTHING"),
                InsertIgnore::Ignore => format!("INSERT IGNORE {insert}"),
                InsertIgnore::OrIgnore => format!("INSERT OR IGNORE {insert}"),
            },
            free_in: lists(&|k| {
                format!(
                    "UPDATE {t} SET at = 0 WHERE {} AND at = {} AND slot IN ({})",
                    key(1),
                    self.p(3),
                    listed(k, 4)
                )
            }),
            restamp_in: lists(&|k| {
                format!(
                    "UPDATE {t} SET at = {} WHERE {} AND at = {} AND slot IN ({})",
                    self.p(1),
                    key(2),
                    self.p(4),
                    listed(k, 5)
                )
            }),
            claimed: format!(
                "SELECT count(*) FROM {t} WHERE lim = {} AND at > {}",
                self.p(1),
                self.p(2)
            ),
            full: format!(
                "SELECT rkey FROM {t} WHERE lim = {} AND at > {} AND slot < {} GROUP BY rkey \
                 HAVING count(*) >= {}",
                self.p(1),
                self.p(2),
                self.p(3),
                self.p(4)
            ),
            // The fence on each row as well as the key's: a claim may stamp one of an idle
            // key's slots while the delete runs (PostgreSQL checks again only the row's own
            // conditions of a row it waited for), and a stamped slot deleted would let the
            // window hold one claim more.
            sweep: format!(
                "DELETE FROM {t} WHERE lim = {} AND at <= {} AND rkey IN (SELECT rkey FROM (SELECT \
                 rkey FROM {t} WHERE lim = {} GROUP BY rkey HAVING MAX(at) <= {}) AS idle)",
                self.p(1),
                self.p(2),
                self.p(3),
                self.p(4)
            ),
            sweep_any: format!("DELETE FROM {t} WHERE at <= {}", self.p(1)),
        }
    }

    /// The claimable rows of a table with concurrency or rate limits per distinct value of the
    /// columns the limits read ([`TableSql::flow_ready`](crate::dialect::TableSql)); `None`
    /// for other tables.
    pub fn flow_ready(&self, spec: &TableSpec) -> Option<String> {
        if spec.limits.is_empty() && spec.rates.is_empty() {
            return None;
        }
        let (cond, _) = self.fair_claimable(spec, 1);
        let table = self.q(&spec.name);
        let grouped: Vec<String> = spec
            .flow_columns()
            .iter()
            .filter_map(|i| spec.columns.get(*i))
            .map(|c| self.q(&c.name))
            .collect();
        Some(match grouped.is_empty() {
            true => format!("SELECT count(*) FROM {table} WHERE {cond}"),
            false => format!(
                "SELECT {g}, count(*) FROM {table} WHERE {cond} GROUP BY {g}",
                g = grouped.join(", ")
            ),
        })
    }

    /// The claimable condition of a fair read, its parameters from `first`, and how many it
    /// takes: lease rows whose lease is empty or past, due and unfinished rows otherwise.
    fn fair_claimable(&self, spec: &TableSpec, first: usize) -> (String, usize) {
        let ready = self.ready(spec, &self.p(first));
        match spec.form {
            Form::Lease => {
                let lu = self.q(&spec.locked_until);
                let cond = format!(
                    "{ready} AND ({lu} IS NULL OR {lu} <= {})",
                    self.p(first + 1)
                );
                (cond, 2)
            }
            _ => (ready, 1),
        }
    }

    /// The fair key reads ([`FairSql`]): a recursive skip through the key column, each step
    /// the least key above the one before with a claimable row.
    pub fn fair_sql(&self, spec: &TableSpec) -> Option<FairSql> {
        let fair = spec.fair.as_ref()?;
        let c = self.q(&spec.columns.get(fair.column)?.name);
        let t = self.q(&spec.name);
        // The keys of due unfinished rows, leased or not: a condition on `locked_until`, which
        // the index does not hold, made MariaDB read each skip's range from its start (30 ms a
        // claim over 5,000 rows). A key whose due rows are all in work reads no first rows.
        let build = |after: bool| {
            let cond = self.ready(spec, &self.p(1));
            let mut next = 2;
            // The keys read are never `NULL`: the rows whose key is `NULL` are one key of their
            // own, read apart at the end of each round. (MySQL and SQLite sort `NULL` first: a
            // first step that found it would end the skip before any other key.)
            let lower = if after {
                next += 1;
                format!(" AND {c} > {}", self.p(next - 1))
            } else {
                format!(" AND {c} IS NOT NULL")
            };
            let step = self.ready(spec, &self.p(next));
            next += 1;
            // Each step is the first key in index order (`ORDER BY .. LIMIT 1`), not `min()`:
            // MariaDB computes a `min()` under conditions the index does not hold by reading
            // the whole range above the key (53 ms a skip of 10 keys over 20,000 rows, against
            // 0.6 ms this way); PostgreSQL plans both alike.
            format!(
                "WITH RECURSIVE sqlbroker_k (sqlbroker_v, sqlbroker_n) AS (\
                 SELECT (SELECT {c} FROM {t} WHERE {cond}{lower} ORDER BY {c} LIMIT 1), 1 \
                 UNION ALL SELECT (SELECT sqlbroker_f.{c} FROM {t} AS sqlbroker_f WHERE \
                 {step} AND sqlbroker_f.{c} > sqlbroker_k.sqlbroker_v ORDER BY sqlbroker_f.{c} \
                 LIMIT 1), sqlbroker_n + 1 \
                 FROM sqlbroker_k WHERE sqlbroker_k.sqlbroker_v IS NOT NULL AND \
                 sqlbroker_k.sqlbroker_n < {}) \
                 SELECT sqlbroker_v FROM sqlbroker_k WHERE sqlbroker_v IS NOT NULL",
                self.p(next)
            )
        };
        Some(FairSql {
            keys: [build(false), build(true)],
        })
    }

    /// The first rows of each of `keys` fair keys (and, with `null`, of the rows whose key
    /// column is `NULL`), in claim order within each: `(key, now.., rows) x keys[, (now..,
    /// rows)]` -> `id, run_at, <user columns>`, key after key. Each key's read is a derived
    /// table (SQLite's compound members take no `ORDER BY`, and MySQL 8 has long accepted
    /// this form). With `locked` (the servers' lease claims), each key's rows are locked as
    /// read, `FOR UPDATE SKIP LOCKED` inside its derived table: claims running side by side
    /// read the same keys in the same order, and unlocked they chose the same first rows, so
    /// all but one came back nearly empty from the lock that followed. Then, where
    /// [`Syntax::fair_cursor`] says so, each key's condition has its cursor's parameters
    /// after the key's (`(run_at, id)`, or `(run_at, run_at, id)`, [`Syntax::after_cursor`]).
    pub fn fair_heads(&self, spec: &TableSpec, keys: usize, null: bool, locked: bool) -> String {
        let Some(c) = spec
            .fair
            .as_ref()
            .and_then(|f| spec.columns.get(f.column))
            .map(|col| self.q(&col.name))
        else {
            return String::new();
        };
        // The key's index, by force where the planner may choose another ([`Syntax::force_index`]:
        // on MariaDB a read of an emptied key planned over the ready index held every row of
        // the other keys it walked locked until commit, 49 of 50).
        let t = match self.force_index {
            true => format!(
                "{} FORCE INDEX ({})",
                self.q(&spec.name),
                self.q(&format!("{}_fair", spec.name))
            ),
            false => self.q(&spec.name),
        };
        let mut cols = format!("{}, {}", self.q(&spec.id), self.q(&spec.run_at));
        for col in &spec.columns {
            cols.push_str(&format!(", {}", self.q(&col.name)));
        }
        let mut next = 1;
        let mut parts = Vec::with_capacity(keys + 1);
        for i in 0..keys + usize::from(null) {
            let which = if i < keys {
                next += 1;
                format!("{c} = {}", self.p(next - 1))
            } else {
                format!("{c} IS NULL")
            };
            // After the key's cursor, a claim order position (the lease claims of the servers,
            // on tables ordered by `(run_at, id)`; [`Syntax::fair_cursor`]).
            let after = match Self::fair_cursor(spec, locked) {
                true => {
                    let (cond, n) = self.after_cursor(spec, next);
                    next += n;
                    format!(" AND {cond}")
                }
                false => String::new(),
            };
            let which = format!("{which}{after}");
            let (cond, n) = self.fair_claimable(spec, next);
            next += n;
            parts.push(format!(
                "SELECT * FROM (SELECT {cols} FROM {t} WHERE {which} AND {cond} ORDER BY {} {}{}) \
                 AS sqlbroker_h{i}",
                self.order(spec),
                (self.claim_limit)(&self.p(next)),
                if locked {
                    " FOR UPDATE SKIP LOCKED"
                } else {
                    ""
                }
            ));
            next += 1;
        }
        parts.join(" UNION ALL ")
    }

    /// True if a fair claim's first rows of each key are read after the key's cursor: the
    /// servers' lease claims (`locked`), on tables ordered by `(run_at, id)` alone (no
    /// priorities, no FIFO groups) whose claims take every row they lock (no concurrency or
    /// rate limit passes one by: another claim's cursor, which `SKIP LOCKED` hid it from,
    /// would go past it). Each key's read then starts past the rows claimed of it before,
    /// whose dead index entries (PostgreSQL until vacuum, MariaDB until purge) it would
    /// otherwise walk from the head of the key's range on every claim.
    pub fn fair_cursor(spec: &TableSpec, locked: bool) -> bool {
        locked
            && spec.priority.is_none()
            && spec.fifo_group().is_none()
            && spec.limits.is_empty()
            && spec.rates.is_empty()
    }

    /// The index fair claims read (`<table>_fair`: the key column, then the claim order, over
    /// the unfinished rows); PostgreSQL, SQLite (MySQL writes its own in its table definition).
    pub fn fair_index(&self, spec: &TableSpec) -> Option<String> {
        let fair = spec.fair.as_ref()?;
        let c = self.q(&spec.columns.get(fair.column)?.name);
        Some(format!(
            "CREATE INDEX IF NOT EXISTS {} ON {} ({c}, {}) WHERE {} IS NULL",
            self.q(&format!("{}_fair", spec.name)),
            self.q(&spec.name),
            self.order(spec),
            self.q(&spec.dead_at)
        ))
    }
}
