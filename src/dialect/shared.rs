//! The statements that read the same on every database but for quoting and placeholders.
//!
//! Each dialect passes its [`Syntax`]; the statements here use every parameter once and in order,
//! so they suit positional (`?`), numbered (`?1`) and dollar (`$1`) placeholders alike. What
//! differs between the databases (claims, locks, DDL, renewal) lives in each dialect's own folder.

use crate::dialect::{except_shapes, ExceptSql, LimitSql, TableSql};
use crate::model::schema::{family, ColumnDef, Family};
use crate::model::table::{ColumnType, Form, TableSpec};

/// A statement of [`ExceptSql`]: the number of its first value's parameter, and the statement
/// made of a condition and the number of the limit's parameter.
type ExceptStatement<'a> = (usize, &'a dyn Fn(&str, usize) -> String);

/// The `dead_reason` of a cancelled job ([`Broker::cancel`](crate::Broker::cancel),
/// [`Delivery::cancel`](crate::Delivery::cancel)): a row kept as completed and cancelled, or a
/// row in work whose retry the request turned into its end.
pub(crate) const CANCELLED: &str = "cancelled";

/// The column types a database's `CREATE TABLE` uses for each role and user column type.
pub(crate) struct ColumnTypes {
    pub id: &'static str,
    pub payload: &'static str,
    pub attempts: &'static str,
    pub run_at: &'static str,
    /// `locked_until` and `dead_at` (nullable).
    pub time: &'static str,
    pub reason: &'static str,
    /// The priority column (tables with priorities).
    pub priority: &'static str,
    /// `created_at` in `CREATE TABLE`: a time column the server's clock fills at insert by
    /// its default, so an insert names no such column.
    pub created_at: &'static str,
    /// `(quoted table, quoted column)` -> the statements by which `migrate` adds `created_at`
    /// to a table made by an earlier release: without a default first, so the rows already
    /// there read `NULL` (their publish time is unknown; the migration's time would be a
    /// wrong one), then with the default for the rows published after, where the database
    /// allows it.
    pub add_created_at: fn(&str, &str) -> Vec<String>,
    pub text: &'static str,
    pub int: &'static str,
    pub float: &'static str,
    pub bytes: &'static str,
}

/// The conditions of the states [`Broker::stats`](crate::Broker::stats) counts. In the lease
/// form every row is in exactly one of them.
pub(crate) struct StatsStates {
    /// Not finished, due (`run_at <= now`), and in the lease form not leased (`locked_until`
    /// empty or past): what a claim may take. A row lock or an advisory lock leaves no mark
    /// in the row, so in those forms rows in work are here too.
    pub ready: String,
    /// Not finished, not yet due, and in the lease form not leased.
    pub scheduled: String,
    /// Lease form only: not finished and leased (`locked_until > now`), in work.
    pub held: Option<String>,
    /// Dead-lettered: finished and not completed.
    pub dead: String,
    /// Tables that keep completed rows only: completed (acked).
    pub completed: Option<String>,
}

/// Id-list size classes of the limited lease claim's take: 1, 2, 4 .. 1024, enough for the
/// largest claim (`batch_size` is at most 1,000).
const LIMIT_TAKE_CLASSES: u32 = 11;

/// How a database spells identifiers and parameters.
pub(crate) struct Syntax {
    /// Quotes a validated identifier.
    pub quote: fn(&str) -> String,
    /// The placeholder of the `n`-th parameter (1-based).
    pub param: fn(usize) -> String,
    /// The server's current time in whole seconds, as the time columns hold it: one value for
    /// the whole statement. Only the ack of a table that keeps completed rows reads it.
    pub now: &'static str,
    /// The `LIMIT` of a claim's scan, given the row count's placeholder.
    pub claim_limit: fn(&str) -> String,
    /// A string literal holding `s` exactly: the registry record in the printed schema
    /// ([`crate::operating::ddl`]), where statements carry their values inline.
    pub literal: fn(&str) -> String,
    /// Inserts write the publish time (`created_at`) as [`Syntax::now`] themselves instead of
    /// leaving it to the column's default: MySQL's `CURRENT_TIMESTAMP` default is in the
    /// session's time zone, and a transactional publish runs on the application's session,
    /// whose zone may not be UTC.
    pub stamps_created: bool,
    /// `haystack` holds the text `needle` (a placeholder), byte for byte, case and all: an
    /// operator's filter on a job's last error ([`Syntax::preview_page`]).
    pub contains: fn(haystack: &str, needle: &str) -> String,
    /// The database plans a row comparison `(run_at, id) > (?, ?)` as a range of an index by
    /// those columns (PostgreSQL, SQLite). MariaDB plans it on `run_at` alone and walks every
    /// entry of the second: there it is spelled as two ranges ([`Syntax::after_cursor`]).
    pub row_compare: bool,
    /// A read of one key's rows names the index it walks (`FORCE INDEX`, MySQL): MariaDB may
    /// plan it over another index, and a locked read (`FOR UPDATE SKIP LOCKED`) then keeps
    /// every row it scanned locked until commit, rows of other keys included, which claims
    /// side by side pass by and their cursors go past.
    pub force_index: bool,
}

/// `s` as a standard SQL string literal: quotes doubled, nothing else special (PostgreSQL
/// with `standard_conforming_strings`, its default since 9.1, and SQLite).
pub(crate) fn standard_literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// A condition an operator's listing adds to a page of jobs ([`Syntax::preview_page`]).
#[derive(Debug, Clone, Copy)]
pub(crate) enum PageFilter<'a> {
    /// The user column of this name equals the parameter.
    Equals(&'a str),
    /// The queue column of this name names the parameter's queue (`NULL`, in a column adopted
    /// from a table's own, is the default queue).
    Queue(&'a str),
    /// The last error holds the parameter's text.
    ErrorContains,
    /// Lease and advisory forms: no cancel was requested for the row (no parameter): what a
    /// bulk cancel has left to do.
    NotCancelRequested,
}

impl Syntax {
    pub fn q(&self, ident: &str) -> String {
        (self.quote)(ident)
    }

    pub fn p(&self, n: usize) -> String {
        (self.param)(n)
    }

    /// The `SET` list of a lease claim: the new lease `value`, an attempt spent, and, for a row
    /// whose previous lease ran out before anyone settled it (a settlement always clears the
    /// lease), a failure recorded: `errors` counted up and `last_error` set to
    /// [`LEASE_RAN_OUT`](crate::LEASE_RAN_OUT). So a job that is claimed again and again and
    /// never settles (it kills or hangs its process each time) shows its failures in `job` and
    /// dead-letters at [`max_attempts`](crate::Table::max_attempts) with a reason, as River's
    /// rescuer records a rescued job. `alias` prefixes the columns read (`q.` or nothing). The
    /// failure's columns come first: MySQL evaluates assignments left to right, each seeing the
    /// ones before it, so the lease's old value must be read before it is written.
    pub fn lease_take_set(&self, spec: &TableSpec, value: &str, alias: &str) -> String {
        let (lu, att) = (self.q(&spec.locked_until), self.q(&spec.attempts));
        format!(
            "{}, {lu} = {value}, {att} = {alias}{att} + 1",
            self.lease_lost_set(spec, alias)
        )
    }

    /// The assignments that record a lease run out unsettled on the row a statement takes over
    /// from it (a claim, or an update in place, which then clears the lease): `errors` and
    /// `last_error` as [`Syntax::lease_take_set`] says, reading the lease before it is
    /// written (put them before the lease's own assignment).
    pub fn lease_lost_set(&self, spec: &TableSpec, alias: &str) -> String {
        let lu = self.q(&spec.locked_until);
        let (errors, last) = (self.q(&spec.errors), self.q(&spec.last_error));
        let lost = format!("{alias}{lu} IS NOT NULL");
        format!(
            "{errors} = {alias}{errors} + CASE WHEN {lost} THEN 1 ELSE 0 END, \
             {last} = CASE WHEN {lost} THEN '{}' ELSE {alias}{last} END",
            crate::error::LEASE_RAN_OUT
        )
    }

    /// `id, attempts, payload, <user columns>[, checkpoint][, traceparent][, cancel_requested],
    /// run_at`, each prefixed by `prefix` (an alias and a dot, or nothing): a claimed row, its
    /// due time last (the queue wait it measures, and the PostgreSQL lease claim's cursor), its
    /// last checkpoint on a table with [`Table::checkpoints`](crate::Table::checkpoints), its
    /// trace context on one with [`Table::traceparent`](crate::Table::traceparent). The lease
    /// and advisory forms read the cancel request too: a claim that finds one ends the row instead of
    /// running it ([`Claimed::cancel_requested`](crate::consuming::form::Claimed::cancel_requested)).
    pub fn row_columns(&self, spec: &TableSpec, prefix: &str) -> String {
        let mut s = format!(
            "{prefix}{}, {prefix}{}, {prefix}{}",
            self.q(&spec.id),
            self.q(&spec.attempts),
            self.q(&spec.payload)
        );
        for c in &spec.columns {
            s.push_str(&format!(", {prefix}{}", self.q(&c.name)));
        }
        for c in [&spec.checkpoint, &spec.traceparent].into_iter().flatten() {
            s.push_str(&format!(", {prefix}{}", self.q(c)));
        }
        if spec.form != Form::RowLock {
            s.push_str(&format!(", {prefix}{}", self.q(&spec.cancel_requested)));
        }
        s.push_str(&format!(", {prefix}{}", self.q(&spec.run_at)));
        s
    }

    /// The advisory claim's candidates, which lock nothing: `claim` `(now, limit)` the first
    /// page, `claim_after` `(now, run_at, id, limit)` the page after the row `(run_at, id)`,
    /// each row `id, run_at, <user columns>` (what a key is rendered from, and the cursor);
    /// `claim_after` reads on after a row, as [`Syntax::after_cursor`] spells it.
    /// `head`: a FIFO table's condition that the row aliased `q` is the head of its group
    /// (it uses no parameter).
    pub fn advisory_candidates(&self, spec: &TableSpec, sql: &mut TableSql, head: Option<&str>) {
        let (t, id, run_at) = (self.q(&spec.name), self.q(&spec.id), self.q(&spec.run_at));
        let mut cols = format!("{id}, {run_at}");
        for c in &spec.columns {
            cols.push_str(&format!(", {}", self.q(&c.name)));
        }
        let ready = self.ready(spec, &self.p(1));
        let head = match head {
            Some(h) => format!("SELECT {cols} FROM {t} q WHERE {ready} AND {h}"),
            None => format!("SELECT {cols} FROM {t} WHERE {ready}"),
        };
        let order = self.order(spec);
        sql.claim = format!("{head} ORDER BY {order} {}", (self.claim_limit)(&self.p(2)));
        // `(now, run_at, id, limit)`, or `(now, run_at, run_at, id, limit)` where the database
        // plans a row comparison poorly ([`Syntax::after_cursor`]).
        let (after, n) = self.after_cursor(spec, 2);
        sql.claim_after = format!(
            "{head} AND {after} ORDER BY {order} {}",
            (self.claim_limit)(&self.p(2 + n))
        );
        // Later pages without the keys found at their max: `claim_after`'s parameters with
        // the values left out before the limit.
        let from = |cond: &str, lim: usize| {
            format!(
                "{head} AND {after} AND {cond} ORDER BY {order} {}",
                (self.claim_limit)(&self.p(lim))
            )
        };
        sql.advisory_except = self.except_sql(spec, None, Some((2 + n, &from)));
    }

    /// The lease claim of a table with concurrency limits ([`LimitSql`]), its transaction
    /// opened by `begin`; `returning`: the database has `UPDATE .. RETURNING` (SQLite; with
    /// `returning` false, MySQL: the candidates locked as read, the take followed by
    /// [`LimitSql::taken`]).
    #[cfg_attr(not(any(feature = "sqlite", feature = "mysql")), allow(dead_code))]
    pub fn limit_sql(&self, spec: &TableSpec, begin: Vec<String>, returning: bool) -> LimitSql {
        self.limit_sql_with(spec, begin, returning, false)
    }

    /// [`Syntax::limit_sql`], for PostgreSQL with `pg`: the candidates locked as read
    /// ([`LimitSql::take_locked`] leases them), and on tables without priorities read after a
    /// claim cursor ([`LimitSql::candidates_from`]).
    pub fn limit_sql_with(
        &self,
        spec: &TableSpec,
        begin: Vec<String>,
        returning: bool,
        pg: bool,
    ) -> LimitSql {
        let (t, id, lu) = (
            self.q(&spec.name),
            self.q(&spec.id),
            self.q(&spec.locked_until),
        );
        let user: Vec<String> = spec.columns.iter().map(|c| self.q(&c.name)).collect();
        let user = user.join(", ");
        let with_user = |lead: &str| {
            if user.is_empty() {
                lead.to_string()
            } else {
                format!("{lead}, {user}")
            }
        };
        let dead = self.q(&spec.dead_at);
        let claimable = |a: usize, b: usize| {
            format!(
                "{} AND ({lu} IS NULL OR {lu} <= {})",
                self.ready(spec, &self.p(a)),
                self.p(b)
            )
        };
        let ids = |first: usize, n: usize| {
            let ids: Vec<String> = (first..first + n).map(|i| self.p(i)).collect();
            ids.join(", ")
        };
        let row = self.row_columns(spec, "");
        // With a cursor, each candidate's `run_at` too: the cursor's key.
        let cursor = pg && spec.priority.is_none();
        let lead = match cursor {
            true => format!("{id}, {}", self.q(&spec.run_at)),
            false => id.clone(),
        };
        let returning_row = |stmt: String| match returning {
            true => format!("{stmt} RETURNING {row}"),
            false => stmt,
        };
        let classes = |on: bool, f: &dyn Fn(u32) -> String| -> Vec<String> {
            match on {
                true => (0..LIMIT_TAKE_CLASSES).map(f).collect(),
                false => Vec::new(),
            }
        };
        let servers = pg || !returning;
        let locking = if servers {
            " FOR UPDATE SKIP LOCKED"
        } else {
            ""
        };
        // SQLite: one statement, which checks each row again.
        let take = classes(!servers, &|k| {
            returning_row(format!(
                "UPDATE {t} SET {} WHERE {} AND {id} IN ({})",
                self.lease_take_set(spec, &self.p(1), ""),
                claimable(2, 3),
                ids(4, 1 << k)
            ))
        });
        // The servers lock the first page of candidates as they read it (`SKIP LOCKED`: rows
        // another claim holds are passed by, so claims run side by side until their turn); rows
        // chosen from later pages (read past keys at their limit, without locks: locking every
        // row passed by would write each one) are locked by primary key, each with whether it
        // is still claimable: with the claimable conditions in its `WHERE`, the generic plan
        // PostgreSQL settles on scans the ready index. Then the chosen are leased by id (MySQL:
        // then read, under the locks).
        let lock = classes(servers, &|k| {
            format!(
                "SELECT {id}, CASE WHEN {} THEN 1 ELSE 0 END FROM {t} WHERE {id} IN ({}) \
                 FOR UPDATE SKIP LOCKED",
                claimable(1, 2),
                ids(3, 1 << k)
            )
        });
        let take_locked = classes(servers, &|k| {
            returning_row(format!(
                "UPDATE {t} SET {} WHERE {id} IN ({})",
                self.lease_take_set(spec, &self.p(1), ""),
                ids(2, 1 << k)
            ))
        });
        let taken = classes(!returning, &|k| {
            format!("SELECT {row} FROM {t} WHERE {id} IN ({})", ids(1, 1 << k))
        });
        // A page of candidates: `(now, now[, run_at, id][, value..], limit)`, with `cond`
        // (nothing, or a later page's keys left out by their column's value, `except`).
        let page = |cond: &str, lim: usize| {
            format!(
                "SELECT {} FROM {t} WHERE {}{cond} ORDER BY {} {}",
                with_user(&lead),
                claimable(1, 2),
                self.order(spec),
                (self.claim_limit)(&self.p(lim))
            )
        };
        let after = format!(
            " AND ({}, {id}) > ({}, {})",
            self.q(&spec.run_at),
            self.p(3),
            self.p(4)
        );
        let candidates = page("", 3);
        let candidates_from = cursor.then(|| page(&after, 5));
        // Later pages without the keys found at their max: a limit whose key reads one
        // column leaves them out by its value.
        let except_first = |cond: &str, lim: usize| page(&format!(" AND {cond}"), lim);
        let except_from = |cond: &str, lim: usize| page(&format!("{after} AND {cond}"), lim);
        let except = self.except_sql(
            spec,
            Some((3, &except_first)),
            cursor.then_some((5, &except_from as &dyn Fn(&str, usize) -> String)),
        );
        // The rows in work counted per key on the server: a row per key, the columns the
        // limits read in their places (`NULL` in the others), not a row per row in work.
        let read: Vec<usize> = spec
            .limits
            .iter()
            .flat_map(|l| l.template.columns())
            .collect();
        let key_cols: Vec<String> = spec
            .columns
            .iter()
            .enumerate()
            .map(|(i, c)| match read.contains(&i) {
                true => self.q(&c.name),
                false => "NULL".to_string(),
            })
            .collect();
        let grouped: Vec<String> = spec
            .columns
            .iter()
            .enumerate()
            .filter(|(i, _)| read.contains(i))
            .map(|(_, c)| self.q(&c.name))
            .collect();
        let in_work = format!(
            "SELECT {} FROM {t} WHERE {dead} IS NULL AND {lu} > {}{}",
            std::iter::once("COUNT(*)".to_string())
                .chain(key_cols)
                .collect::<Vec<_>>()
                .join(", "),
            self.p(1),
            match grouped.is_empty() {
                true => String::new(),
                false => format!(" GROUP BY {}", grouped.join(", ")),
            }
        );
        LimitSql {
            begin,
            in_work,
            candidates: [candidates.clone(), format!("{candidates}{locking}")],
            candidates_from: candidates_from.map(|c| [c.clone(), format!("{c}{locking}")]),
            except,
            lock,
            take,
            take_locked,
            taken,
            turn_at_begin: !servers,
            slot_xact_lock: None,
            slot_bridge: None,
        }
    }

    /// A statement of [`ExceptSql`] in each of its shapes ([`except_shapes`]), in their order:
    /// `stmt(condition, limit)` with the condition leaving the shape's keys out of column `col`
    /// (its values numbered from parameter `first`), and the number of the limit's parameter
    /// after them.
    fn except_variants(
        &self,
        col: &str,
        first: usize,
        stmt: &dyn Fn(&str, usize) -> String,
    ) -> Vec<String> {
        except_shapes()
            .map(|(null, n)| {
                let values: Vec<String> = (first..first + n).map(|i| self.p(i)).collect();
                let values = values.join(", ");
                let cond = match (null, n) {
                    (false, _) => format!("({col} IS NULL OR {col} NOT IN ({values}))"),
                    (true, 0) => format!("{col} IS NOT NULL"),
                    (true, _) => format!("({col} IS NOT NULL AND {col} NOT IN ({values}))"),
                };
                stmt(&cond, first + n)
            })
            .collect()
    }

    /// [`ExceptSql`] for each user column a concurrency limit whose key reads one column reads
    /// (each column once, with the limits that read it): `candidates` and `from`, each the
    /// number of its first value's parameter and its statement of a condition and the
    /// limit's parameter ([`Syntax::except_variants`]).
    fn except_sql(
        &self,
        spec: &TableSpec,
        candidates: Option<ExceptStatement<'_>>,
        from: Option<ExceptStatement<'_>>,
    ) -> Vec<ExceptSql> {
        let mut columns: Vec<usize> = Vec::new();
        for l in &spec.limits {
            let cols: Vec<usize> = l.template.columns().collect();
            if let [c] = cols[..] {
                if !columns.contains(&c) {
                    columns.push(c);
                }
            }
        }
        columns
            .into_iter()
            .map(|c| {
                let col = self.q(&spec.columns[c].name);
                let variants =
                    |(first, stmt): ExceptStatement<'_>| self.except_variants(&col, first, stmt);
                ExceptSql {
                    column: c,
                    limits: spec
                        .limits
                        .iter()
                        .enumerate()
                        .filter(|(_, l)| l.template.columns().eq([c]))
                        .map(|(i, _)| i)
                        .collect(),
                    candidates: candidates.map(variants).unwrap_or_default(),
                    candidates_from: from.map(variants),
                }
            })
            .collect()
    }

    /// The index the lease claim of a table with concurrency limits reads its rows in work by
    /// (`<table>_leased`: `locked_until` over the unfinished rows); `None` for other tables.
    /// PostgreSQL, SQLite (MySQL writes its own in its table definition).
    pub fn leased_index(&self, spec: &TableSpec) -> Option<String> {
        (spec.form == Form::Lease && !spec.limits.is_empty()).then(|| {
            format!(
                "CREATE INDEX IF NOT EXISTS {} ON {} ({}) WHERE {} IS NULL",
                self.q(&format!("{}_leased", spec.name)),
                self.q(&spec.name),
                self.q(&spec.locked_until),
                self.q(&spec.dead_at)
            )
        })
    }

    /// The row lock claim of a table with concurrency limits (PostgreSQL, MySQL): `candidates`
    /// `(now, limit)` -> `id, <user columns>` of ready rows in claim order, locking nothing;
    /// `take` `(id, now)` -> the row, locked `FOR UPDATE SKIP LOCKED`, if it is still
    /// claimable; `begin` the table's claim transaction. `in_work` is unused: the slot keys
    /// count.
    #[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
    pub fn row_lock_limit_sql(&self, spec: &TableSpec, begin: Vec<String>) -> LimitSql {
        let (t, id) = (self.q(&spec.name), self.q(&spec.id));
        let mut cols = id.clone();
        for c in &spec.columns {
            cols.push_str(&format!(", {}", self.q(&c.name)));
        }
        // Later pages without the keys found at their max (`(now, value.., limit)`), as the
        // lease claim's.
        let candidates = |cond: &str, lim: usize| {
            format!(
                "SELECT {cols} FROM {t} WHERE {} AND {cond} ORDER BY {} {}",
                self.ready(spec, &self.p(1)),
                self.order(spec),
                (self.claim_limit)(&self.p(lim))
            )
        };
        let except = self.except_sql(spec, Some((2, &candidates)), None);
        LimitSql {
            begin,
            in_work: String::new(),
            candidates: [
                format!(
                    "SELECT {cols} FROM {t} WHERE {} ORDER BY {} {}",
                    self.ready(spec, &self.p(1)),
                    self.order(spec),
                    (self.claim_limit)(&self.p(2))
                ),
                String::new(),
            ],
            candidates_from: None,
            except,
            lock: Vec::new(),
            take_locked: Vec::new(),
            turn_at_begin: false,
            slot_xact_lock: None,
            slot_bridge: None,
            take: vec![format!(
                "SELECT {} FROM {t} WHERE {id} = {} AND {} FOR UPDATE SKIP LOCKED",
                self.row_columns(spec, ""),
                self.p(1),
                self.ready_checked(spec, &self.p(2))
            )],
            taken: Vec::new(),
        }
    }

    /// `WHERE` conditions of a claimable row, `now` being parameter `now`.
    pub fn ready(&self, spec: &TableSpec, now: &str) -> String {
        format!(
            "{} IS NULL AND {} <= {now}{}{}",
            self.q(&spec.dead_at),
            self.q(&spec.run_at),
            self.only(spec),
            self.not_paused_queue(spec)
        )
    }

    /// A subscription's view ([`TableSpec::only`]): ` AND <column> IN ('a', 'b')` per column it
    /// narrows, the names as literals (each checked by `check_name`: letters, digits and
    /// `_.:-` only), so the statement stays one text per subscription; empty for the whole
    /// table.
    pub fn only(&self, spec: &TableSpec) -> String {
        let mut out = String::new();
        for (col, values) in &spec.only {
            let Some(c) = spec.columns.get(*col) else {
                continue;
            };
            let list = values
                .iter()
                .map(|v| standard_literal(v))
                .collect::<Vec<_>>()
                .join(", ");
            let name = self.q(&c.name);
            // A queue column adopted from a table's own (`rename(Role::Queue, ..)`) may hold
            // `NULL`: such a row is in the default queue, as `Delivery::queue` reads it.
            let default = crate::model::table::DEFAULT_QUEUE;
            if spec.queue == Some(*col) && values.iter().any(|v| v == default) {
                out.push_str(&format!(" AND ({name} IN ({list}) OR {name} IS NULL)"));
            } else {
                out.push_str(&format!(" AND {name} IN ({list})"));
            }
        }
        out
    }

    /// The statements of [`TableSql::stats_by_queue`] and [`TableSql::stats_by_kind`]: `stats`
    /// grouped by the column, which `prefix` qualifies (MySQL's statement aliases the table).
    pub fn grouped_stats(&self, spec: &TableSpec, sql: &mut TableSql, prefix: &str) {
        let by = |col: Option<usize>| {
            let mut c = format!("{prefix}{}", self.q(&spec.columns.get(col?)?.name));
            if col == spec.queue {
                // `NULL` (an adopted column's) is the default queue.
                c = format!(
                    "COALESCE({c}, {})",
                    standard_literal(crate::model::table::DEFAULT_QUEUE)
                );
            }
            Some(format!(
                "{} GROUP BY {c}",
                sql.stats.replacen("SELECT ", &format!("SELECT {c}, "), 1)
            ))
        };
        sql.stats_by_queue = by(spec.queue);
        sql.stats_by_kind = by(spec.kind);
    }

    /// Tables with queues ([`Table::queues`](crate::Table::queues)): `CREATE INDEX IF NOT
    /// EXISTS <table>_queue ON <table> (queue, <claim order>) WHERE dead_at IS NULL`, so a
    /// claim of one queue reads only its rows (PostgreSQL, SQLite).
    #[cfg_attr(not(any(feature = "postgres", feature = "sqlite")), allow(dead_code))]
    pub fn queue_index(&self, spec: &TableSpec) -> Option<String> {
        let c = self.q(&spec.columns.get(spec.queue?)?.name);
        Some(format!(
            "CREATE INDEX IF NOT EXISTS {} ON {} ({c}, {}) WHERE {} IS NULL",
            self.q(&format!("{}_queue", spec.name)),
            self.q(&spec.name),
            self.order(spec),
            self.q(&spec.dead_at)
        ))
    }

    /// [`Syntax::ready`] as a check of a row already found by id, in a form no index can
    /// answer (`(..) IS TRUE`, the same truth: neither side is ever `NULL`). Written plainly,
    /// PostgreSQL may plan `id = $n AND ready` as a range scan of the ready index from its head,
    /// filtering on the id: cheap while its dead entries are pruned, a walk over every row
    /// acked since while a snapshot held elsewhere keeps them (the advisory take at 0.4x of
    /// its plain rate, BENCHMARKS.md, issue 28).
    pub fn ready_checked(&self, spec: &TableSpec, now: &str) -> String {
        format!("({}) IS TRUE", self.ready(spec, now))
    }

    /// `ORDER BY` of the claims: highest priority first (tables with priorities), then due
    /// first, then oldest.
    /// The condition "after the cursor" in claim order `(run_at, id)`, its parameters from
    /// the `first`: `(run_at, id)` where the database plans a row comparison as a range,
    /// else `(run_at, run_at, id)`; and how many parameters it takes.
    pub fn after_cursor(&self, spec: &TableSpec, first: usize) -> (String, usize) {
        let (run_at, id) = (self.q(&spec.run_at), self.q(&spec.id));
        match self.row_compare {
            true => (
                format!(
                    "({run_at}, {id}) > ({}, {})",
                    self.p(first),
                    self.p(first + 1)
                ),
                2,
            ),
            false => (
                format!(
                    "({run_at} > {} OR ({run_at} = {} AND {id} > {}))",
                    self.p(first),
                    self.p(first + 1),
                    self.p(first + 2)
                ),
                3,
            ),
        }
    }

    pub fn order(&self, spec: &TableSpec) -> String {
        let due = format!("{}, {}", self.q(&spec.run_at), self.q(&spec.id));
        match &spec.priority {
            Some(p) => format!("{} DESC, {due}", self.q(p)),
            None => due,
        }
    }

    /// The column list of an insert: payload, run_at, user columns.
    pub fn insert_head(&self, spec: &TableSpec) -> String {
        let mut s = format!(
            "INSERT INTO {} ({}, {}",
            self.q(&spec.name),
            self.q(&spec.payload),
            self.q(&spec.run_at)
        );
        for c in &spec.columns {
            s.push_str(&format!(", {}", self.q(&c.name)));
        }
        for role in [&spec.priority, &spec.dedup_key, &spec.traceparent]
            .into_iter()
            .flatten()
        {
            s.push_str(&format!(", {}", self.q(role)));
        }
        if self.stamps_created {
            s.push_str(&format!(", {}", self.q(&spec.created_at)));
        }
        s.push_str(") VALUES ");
        s
    }

    /// `rows` value tuples of an insert.
    pub fn insert_values(&self, spec: &TableSpec, rows: usize) -> String {
        let width = spec.insert_width();
        let mut s = String::new();
        for r in 0..rows {
            if r > 0 {
                s.push_str(", ");
            }
            s.push('(');
            for c in 0..width {
                if c > 0 {
                    s.push_str(", ");
                }
                s.push_str(&self.p(r * width + c + 1));
            }
            if self.stamps_created {
                s.push_str(", ");
                s.push_str(self.now);
            }
            s.push(')');
        }
        s
    }

    /// An insert of `rows` rows that skips those whose dedup key an unfinished row holds,
    /// returning the ids of the rows it made (`INSERT .. ON CONFLICT DO NOTHING RETURNING`:
    /// PostgreSQL, SQLite). Tables with dedup keys only.
    pub fn insert_dedup(&self, spec: &TableSpec, rows: usize) -> String {
        let key = spec.dedup_key.as_deref().unwrap_or_default();
        format!(
            "{} ON CONFLICT ({}) DO NOTHING RETURNING {}",
            self.insert_many(spec, rows),
            self.q(key),
            self.q(&spec.id)
        )
    }

    /// An insert of `rows` rows: `(payload, run_at, user columns..)` repeated.
    pub fn insert_many(&self, spec: &TableSpec, rows: usize) -> String {
        format!(
            "{}{}",
            self.insert_head(spec),
            self.insert_values(spec, rows)
        )
    }

    /// The column definitions of `CREATE TABLE`: the roles (`locked_until` in the lease form
    /// only), then the user columns.
    pub fn column_defs(&self, spec: &TableSpec, ty: &ColumnTypes) -> Vec<String> {
        self.column_list(spec, ty)
            .into_iter()
            .map(|c| c.ddl)
            .collect()
    }

    /// `ALTER TABLE <table> ADD COLUMN <definition>`, or the column's own statements
    /// ([`ColumnDef::add`]): a migration.
    pub fn add_column(&self, spec: &TableSpec, def: &ColumnDef) -> Vec<String> {
        if !def.add.is_empty() {
            return def.add.clone();
        }
        vec![format!(
            "ALTER TABLE {} ADD COLUMN {}",
            self.q(&spec.name),
            def.ddl
        )]
    }

    /// The columns `spec` needs, in `CREATE TABLE` order, with what the schema check accepts.
    pub fn column_list(&self, spec: &TableSpec, ty: &ColumnTypes) -> Vec<ColumnDef> {
        let def = |name: &str, t: &str| ColumnDef {
            name: name.to_string(),
            ddl: format!("{} {t}", self.q(name)),
            accepts: family(t).into_iter().collect(),
            // `ADD COLUMN` fills existing rows: only a nullable column or one with a default.
            addable: !t.contains("PRIMARY KEY")
                && (!t.contains("NOT NULL") || t.contains("DEFAULT")),
            add: Vec::new(),
            collations: &[],
        };
        let mut payload = def(&spec.payload, ty.payload);
        payload.accepts = vec![Family::Bytes, Family::Text];
        let mut cols = vec![
            def(&spec.id, ty.id),
            payload,
            def(&spec.attempts, ty.attempts),
            def(&spec.run_at, ty.run_at),
        ];
        if spec.form == Form::Lease {
            cols.push(def(&spec.locked_until, ty.time));
        }
        cols.push(def(&spec.dead_at, ty.time));
        cols.push(def(&spec.dead_reason, ty.reason));
        // Error history and cancel requests: nullable or defaulted, so `migrate` adds them.
        cols.push(def(&spec.last_error, ty.reason));
        cols.push(def(&spec.errors, ty.attempts));
        if spec.form != Form::RowLock {
            cols.push(def(&spec.cancel_requested, ty.attempts));
        }
        let mut created = def(&spec.created_at, ty.created_at);
        created.add = (ty.add_created_at)(&self.q(&spec.name), &self.q(&spec.created_at));
        cols.push(created);
        if let Some(p) = &spec.priority {
            cols.push(def(p, ty.priority));
        }
        if let Some(k) = &spec.dedup_key {
            cols.push(def(k, ty.text));
        }
        if let Some(c) = &spec.completed_at {
            cols.push(def(c, ty.time));
        }
        for c in [&spec.output, &spec.checkpoint].into_iter().flatten() {
            cols.push(def(c, ty.bytes));
        }
        if let Some(c) = &spec.traceparent {
            // Text, nullable: publish writes 55 checked characters or `NULL`.
            cols.push(def(c, ty.text));
        }
        let queue = spec.queue.and_then(|i| spec.columns.get(i));
        for c in &spec.columns {
            let t = match c.ty {
                ColumnType::Text => ty.text,
                ColumnType::Int => ty.int,
                ColumnType::Float => ty.float,
                ColumnType::Bytes => ty.bytes,
                ColumnType::Time => ty.time,
            };
            if queue.is_some_and(|q| q.name == c.name) {
                // Rows published by a service that does not describe queues, or inserted by
                // hand, are in the default queue; `migrate` adds the column without rewriting
                // the rows where the database can (a constant default).
                let t = format!(
                    "{} NOT NULL DEFAULT {}",
                    t.strip_suffix(" NULL").unwrap_or(t),
                    standard_literal(crate::model::table::DEFAULT_QUEUE)
                );
                cols.push(def(&c.name, &t));
                continue;
            }
            cols.push(def(&c.name, t));
        }
        cols
    }

    /// `CREATE TABLE IF NOT EXISTS` with every column, then the partial ready index and, for a
    /// FIFO table, the group indexes (PostgreSQL, SQLite).
    // PostgreSQL and SQLite only (MySQL writes its DDL and FIFO heads its own way).
    #[cfg_attr(not(any(feature = "postgres", feature = "sqlite")), allow(dead_code))]
    pub fn create_table(&self, spec: &TableSpec, ty: &ColumnTypes) -> Vec<String> {
        let mut ddl = vec![
            format!(
                "CREATE TABLE IF NOT EXISTS {} ({})",
                self.q(&spec.name),
                self.column_defs(spec, ty).join(", ")
            ),
            self.ready_index(spec),
        ];
        if let Some(k) = &spec.dedup_key {
            ddl.push(format!(
                "CREATE UNIQUE INDEX IF NOT EXISTS {} ON {} ({})",
                self.q(&format!("{}_dedup", spec.name)),
                self.q(&spec.name),
                self.q(k)
            ));
        }
        if let Some(c) = &spec.completed_at {
            // The prune's range.
            let c = self.q(c);
            ddl.push(format!(
                "CREATE INDEX IF NOT EXISTS {} ON {} ({c}) WHERE {c} IS NOT NULL",
                self.q(&format!("{}_completed", spec.name)),
                self.q(&spec.name),
            ));
        }
        if let Some(group) = spec.fifo_group() {
            let (t, g, dead) = (self.q(&spec.name), self.q(group), self.q(&spec.dead_at));
            ddl.push(format!(
                "CREATE INDEX IF NOT EXISTS {} ON {t} ({g}, {}) WHERE {dead} IS NULL",
                self.q(&format!("{}_group", spec.name)),
                self.q(&spec.id)
            ));
            if spec.form == Form::Lease {
                ddl.push(format!(
                    "CREATE INDEX IF NOT EXISTS {} ON {t} ({g}, {}) WHERE {dead} IS NULL",
                    self.q(&format!("{}_group_leased", spec.name)),
                    self.q(&spec.locked_until)
                ));
            }
        }
        ddl.extend(self.leased_index(spec));
        ddl.extend(self.fair_index(spec));
        ddl.extend(self.queue_index(spec));
        // Last, so the statements before keep their places.
        ddl.push(self.dead_index(spec));
        ddl
    }

    /// FIFO: the conditions that the row aliased `q` is the head of its group (no unfinished
    /// row of the group is older) and, in the lease form, that no row of its group is leased
    /// (a row published earlier but committed after a later one may be the head while the later
    /// one is in work). `now` is the claim's time parameter (unused in the other forms). A row
    /// whose group is `NULL` is a group of its own. Reads the indexes `(group, id)` and
    /// `(group, locked_until)` over the unfinished rows.
    ///
    /// Modelled in model/fifo.pml (heads).
    // PostgreSQL and SQLite only (MySQL writes its DDL and FIFO heads its own way).
    #[cfg_attr(not(any(feature = "postgres", feature = "sqlite")), allow(dead_code))]
    pub fn fifo_head(&self, spec: &TableSpec, group: &str, now: &str) -> String {
        let (t, g, id, dead) = (
            self.q(&spec.name),
            self.q(group),
            self.q(&spec.id),
            self.q(&spec.dead_at),
        );
        let same = format!("SELECT 1 FROM {t} p WHERE p.{g} = q.{g} AND p.{dead} IS NULL");
        let mut cond = format!("NOT EXISTS ({same} AND p.{id} < q.{id})");
        if spec.form == Form::Lease {
            let lu = self.q(&spec.locked_until);
            cond.push_str(&format!(" AND NOT EXISTS ({same} AND p.{lu} > {now})"));
        }
        cond
    }

    /// `CREATE INDEX IF NOT EXISTS <table>_ready ON <table> (run_at, id) WHERE dead_at IS NULL`:
    /// the partial index the claims read (PostgreSQL, SQLite).
    // PostgreSQL and SQLite only (MySQL writes its DDL and FIFO heads its own way).
    #[cfg_attr(not(any(feature = "postgres", feature = "sqlite")), allow(dead_code))]
    pub fn ready_index(&self, spec: &TableSpec) -> String {
        format!(
            "CREATE INDEX IF NOT EXISTS {} ON {} ({}) WHERE {} IS NULL",
            self.q(&format!("{}_ready", spec.name)),
            self.q(&spec.name),
            self.order(spec),
            self.q(&spec.dead_at)
        )
    }

    /// `CREATE INDEX IF NOT EXISTS <table>_dead ON <table> (id) WHERE dead_at IS NOT NULL`
    /// (`AND completed_at IS NULL` on a table that keeps completed rows): the dead letters by
    /// id, so their pages (`dead_page`, `jobs_page`) and the batches of requeue and purge
    /// read them without scanning the live rows before them (PostgreSQL, SQLite; MySQL reads
    /// the ready index, which `dead_at` leads).
    #[cfg_attr(not(any(feature = "postgres", feature = "sqlite")), allow(dead_code))]
    pub fn dead_index(&self, spec: &TableSpec) -> String {
        let dead = format!("{} IS NOT NULL", self.q(&spec.dead_at));
        let cond = match &spec.completed_at {
            Some(c) => format!("{dead} AND {} IS NULL", self.q(c)),
            None => dead,
        };
        format!(
            "CREATE INDEX IF NOT EXISTS {} ON {} ({}) WHERE {cond}",
            self.q(&format!("{}_dead", spec.name)),
            self.q(&spec.name),
            self.q(&spec.id)
        )
    }

    /// Tables that keep completed rows: the `SET` list of an ack, which keeps the row,
    /// finished (`dead_at`, so it is out of every claim, its dedup key freed, its lease
    /// cleared) and completed, both at the server's time ([`Syntax::now`], one value per
    /// statement). `None` for a table that deletes the rows it acks. The grouped lease acks of
    /// each dialect use it too.
    pub fn complete_set(&self, spec: &TableSpec) -> Option<String> {
        let c = self.q(spec.completed_at.as_ref()?);
        let now = self.now;
        let mut set = format!("{} = {now}, {c} = {now}", self.q(&spec.dead_at));
        if let Some(k) = &spec.dedup_key {
            set.push_str(&format!(", {} = NULL", self.q(k)));
        }
        if spec.form == Form::Lease {
            set.push_str(&format!(", {} = NULL", self.q(&spec.locked_until)));
        }
        Some(set)
    }

    /// The `SET` items by which a retry of a row whose cancel was requested
    /// ([`TableSql::cancel_mark`]) finishes it instead, at the server's time: dead-lettered
    /// with the reason [`CANCELLED`] and, on a table that keeps completed rows, completed too
    /// (its dedup key freed). A row with no request keeps every value. Lease and advisory
    /// forms (a row lock's row cannot be marked while it is in work).
    ///
    /// Modelled in model/advisory.pml, model/lease.pml.
    pub fn cancelled_case(&self, spec: &TableSpec) -> String {
        let cr = self.q(&spec.cancel_requested);
        let now = self.now;
        let when = |col: &str, then: &str| {
            let col = self.q(col);
            format!("{col} = CASE WHEN {cr} <> 0 THEN {then} ELSE {col} END")
        };
        let mut items = vec![
            when(&spec.dead_at, now),
            when(&spec.dead_reason, &format!("'{CANCELLED}'")),
        ];
        if let Some(c) = &spec.completed_at {
            items.push(when(c, now));
        }
        if let Some(k) = &spec.dedup_key {
            items.push(when(k, "NULL"));
        }
        items.join(", ")
    }

    /// The columns of a job as [`TableSql::job`] returns them: `id, attempts, payload,
    /// run_at, dead_at, dead_reason, last_error, errors, locked_until (NULL outside the lease
    /// form), completed_at (NULL on a table that does not keep completed rows),
    /// cancel_requested (0 in the row lock form), created_at, <user columns>`.
    pub fn job_columns(&self, spec: &TableSpec, prefix: &str) -> String {
        let q = |c: &str| format!("{prefix}{}", self.q(c));
        let mut cols = vec![
            q(&spec.id),
            q(&spec.attempts),
            q(&spec.payload),
            q(&spec.run_at),
            q(&spec.dead_at),
            q(&spec.dead_reason),
            q(&spec.last_error),
            q(&spec.errors),
            if spec.form == Form::Lease {
                q(&spec.locked_until)
            } else {
                "NULL".into()
            },
            spec.completed_at.as_deref().map_or("NULL".into(), q),
            if spec.form == Form::RowLock {
                "0".into()
            } else {
                q(&spec.cancel_requested)
            },
            q(&spec.created_at),
        ];
        cols.extend(spec.columns.iter().map(|c| q(&c.name)));
        cols.join(", ")
    }

    /// The statements of outputs and checkpoints ([`TableSql::output_write`],
    /// [`TableSql::checkpoint_write`], [`TableSql::relock`]), and their columns at the end of
    /// [`TableSql::job`].
    pub fn progress_statements(&self, spec: &TableSpec, sql: &mut TableSql) {
        let (t, id) = (self.q(&spec.name), self.q(&spec.id));
        let p = |n| self.p(n);
        let dead_at = self.q(&spec.dead_at);
        if let Some(o) = &spec.output {
            sql.output_write = Some(format!(
                "UPDATE {t} SET {} = {} WHERE {id} = {}",
                self.q(o),
                p(1),
                p(2)
            ));
        }
        if let Some(c) = &spec.checkpoint {
            let c = self.q(c);
            sql.checkpoint_write = Some(match spec.form {
                Form::Lease => format!(
                    "UPDATE {t} SET {c} = {} WHERE {id} = {} AND {} = {}",
                    p(1),
                    p(2),
                    self.q(&spec.locked_until),
                    p(3)
                ),
                Form::AdvisoryLock => format!(
                    "UPDATE {t} SET {c} = {} WHERE {id} = {} AND {dead_at} IS NULL",
                    p(1),
                    p(2)
                ),
                Form::RowLock => format!(
                    "UPDATE {t} SET {c} = {}, {} = {} WHERE {id} = {}",
                    p(1),
                    self.q(&spec.run_at),
                    p(2),
                    p(3)
                ),
            });
            if spec.form == Form::RowLock {
                sql.relock = Some(format!(
                    "SELECT {id} FROM {t} WHERE {id} = {} AND {dead_at} IS NULL FOR UPDATE",
                    p(1)
                ));
            }
        }
    }

    /// The statements of job lookup and cancel ([`TableSql::job`] .. [`TableSql::cancel_lock`]).
    pub fn cancel_statements(&self, spec: &TableSpec, sql: &mut TableSql) {
        let (t, id) = (self.q(&spec.name), self.q(&spec.id));
        let p = |n| self.p(n);
        // Then, on a table that has them, the output, the checkpoint and the trace context.
        let mut cols = self.job_columns(spec, "");
        for c in [&spec.output, &spec.checkpoint, &spec.traceparent]
            .into_iter()
            .flatten()
        {
            cols.push_str(", ");
            cols.push_str(&self.q(c));
        }
        sql.job = format!("SELECT {cols} FROM {t} WHERE {id} = {}", p(1));
        // Pages by state: `now` is bound once per use (`?` cannot be numbered), then the
        // cursor and the limit.
        let marker = "\u{1}now\u{1}";
        let st = self.stats_states(spec, "", marker);
        let conds = [
            Some(st.scheduled),
            Some(st.ready.clone()),
            Some(st.held.unwrap_or(st.ready)),
            Some(st.dead),
            st.completed,
        ];
        sql.jobs_page = conds
            .into_iter()
            .map(|cond| {
                let cond = cond?;
                let mut out = String::new();
                let mut n = 0;
                for (i, part) in cond.split(marker).enumerate() {
                    if i > 0 {
                        n += 1;
                        out.push_str(&p(n));
                    }
                    out.push_str(part);
                }
                Some((
                    format!(
                        "SELECT {} FROM {t} WHERE {out} AND {id} > {} ORDER BY {id} LIMIT {}",
                        self.job_columns(spec, ""),
                        p(n + 1),
                        p(n + 2)
                    ),
                    n,
                ))
            })
            .collect();
        // Cancel of a row not in work: deleted or, on a table that keeps completed rows, kept
        // as completed and cancelled; never a completed row, never a leased one.
        let lease_free = if spec.form == Form::Lease {
            let lu = self.q(&spec.locked_until);
            format!(" AND ({lu} IS NULL OR {lu} <= {})", p(2))
        } else {
            String::new()
        };
        sql.delete_free = format!("DELETE FROM {t} WHERE {id} = {}{lease_free}", p(1));
        sql.cancel_remove = match (&spec.completed_at, self.complete_set(spec)) {
            (Some(c), Some(finish)) => format!(
                "UPDATE {t} SET {finish}, {} = '{CANCELLED}' WHERE {id} = {} AND {} IS NULL{lease_free}",
                self.q(&spec.dead_reason),
                p(1),
                self.q(c)
            ),
            _ => format!("DELETE FROM {t} WHERE {id} = {}{lease_free}", p(1)),
        };
        let (cr, dead) = (self.q(&spec.cancel_requested), self.q(&spec.dead_at));
        match spec.form {
            Form::RowLock => {
                sql.cancel_lock = format!("SELECT {id} FROM {t} WHERE {id} = {} FOR UPDATE", p(1));
                sql.probe_lock = format!(
                    "SELECT {id} FROM {t} WHERE {id} = {} FOR UPDATE SKIP LOCKED",
                    p(1)
                );
            }
            Form::Lease => {
                let lu = self.q(&spec.locked_until);
                sql.cancel_mark = format!(
                    "UPDATE {t} SET {cr} = 1 WHERE {id} = {} AND {dead} IS NULL AND {lu} > {}",
                    p(1),
                    p(2)
                );
                sql.cancel_mark_first = format!("{} AND {cr} = 0", sql.cancel_mark);
            }
            Form::AdvisoryLock => {
                sql.cancel_mark = format!(
                    "UPDATE {t} SET {cr} = 1 WHERE {id} = {} AND {dead} IS NULL",
                    p(1)
                );
                sql.cancel_mark_first = format!("{} AND {cr} = 0", sql.cancel_mark);
            }
        }
    }

    /// The pages of [`TableSql::jobs_preview`], one per state ([`Syntax::preview_page`]
    /// without a filter).
    pub fn preview_statements(&self, spec: &TableSpec, sql: &mut TableSql) {
        sql.jobs_preview = (0..5).map(|i| self.preview_page(spec, i, &[])).collect();
    }

    /// One page of [`TableSql::jobs_preview`] (`state`: the index of
    /// [`JobState`](crate::JobState) there), or `None` for a state the table has no rows of:
    /// the page of `jobs_page`, each row led by the payload's full length and holding only
    /// its first bytes (`LENGTH` and `SUBSTR`, which PostgreSQL's `bytea`, MySQL's `LONGBLOB`
    /// and SQLite's `BLOB` all count in bytes), so a listing of large payloads reads a few
    /// bytes of each instead of all of them. `filter` narrows it further, each a condition on
    /// a parameter of its own, bound in order after the times.
    ///
    /// Parameters: the prefix length (first in the text, which MySQL's `?` follow), the
    /// statement's time as many times as the returned count, each filter's value, the
    /// cursor, the limit.
    pub fn preview_page(
        &self,
        spec: &TableSpec,
        state: usize,
        filter: &[PageFilter<'_>],
    ) -> Option<(String, usize)> {
        self.preview_states(spec, &[state], filter)
    }

    /// [`preview_page`](Syntax::preview_page) of the rows in any of `states` (indexes as
    /// there): what a bulk verb on every job matching reads, a page at a time.
    pub fn preview_states(
        &self,
        spec: &TableSpec,
        states: &[usize],
        filter: &[PageFilter<'_>],
    ) -> Option<(String, usize)> {
        let (t, id) = (self.q(&spec.name), self.q(&spec.id));
        let p = |n| self.p(n);
        let payload = self.q(&spec.payload);
        let columns = self.job_columns(spec, "").replacen(
            &payload,
            &format!("SUBSTR({payload}, 1, {})", p(1)),
            1,
        );
        let (out, nows, n) = self.matching_where(spec, states, filter, 2)?;
        Some((
            format!(
                "SELECT LENGTH({payload}), {columns} FROM {t} WHERE {out} AND {id} > {} \
                 ORDER BY {id} LIMIT {}",
                p(n + 1),
                p(n + 2)
            ),
            nows,
        ))
    }

    /// How many rows are in any of `states` and meet `filter` (parameters: `nows` times, then
    /// the filter's values): [`Broker::count_matching`](crate::Broker::count_matching).
    pub fn count_states(
        &self,
        spec: &TableSpec,
        states: &[usize],
        filter: &[PageFilter<'_>],
    ) -> Option<(String, usize)> {
        let t = self.q(&spec.name);
        let (out, nows, _) = self.matching_where(spec, states, filter, 1)?;
        Some((format!("SELECT COUNT(*) FROM {t} WHERE {out}"), nows))
    }

    /// The condition of a row in any of `states` (0 scheduled, 1 ready, 2 in flight, 3 dead,
    /// 4 completed) that meets `filter`, its parameters numbered from `first`: the condition,
    /// how many times it takes (first), and the last parameter's number. `None` if no state
    /// can hold a row (completed rows of a table that does not keep them).
    fn matching_where(
        &self,
        spec: &TableSpec,
        states: &[usize],
        filter: &[PageFilter<'_>],
        first: usize,
    ) -> Option<(String, usize, usize)> {
        let p = |n| self.p(n);
        let marker = "\u{1}now\u{1}";
        let st = self.stats_states(spec, "", marker);
        let conds: Vec<String> = states
            .iter()
            .filter_map(|state| match state {
                0 => Some(st.scheduled.clone()),
                1 => Some(st.ready.clone()),
                2 => Some(st.held.clone().unwrap_or_else(|| st.ready.clone())),
                3 => Some(st.dead.clone()),
                _ => st.completed.clone(),
            })
            .collect();
        if conds.is_empty() {
            return None;
        }
        let cond = match conds.len() {
            1 => conds.into_iter().next().unwrap_or_default(),
            _ => format!("(({}))", conds.join(") OR (")),
        };
        let mut out = String::new();
        // The last parameter numbered.
        let mut n = first - 1;
        for (i, part) in cond.split(marker).enumerate() {
            if i > 0 {
                n += 1;
                out.push_str(&p(n));
            }
            out.push_str(part);
        }
        let nows = n + 1 - first;
        for f in filter {
            let more = match f {
                PageFilter::Equals(c) => {
                    n += 1;
                    format!("{} = {}", self.q(c), p(n))
                }
                PageFilter::Queue(c) => {
                    n += 1;
                    format!(
                        "COALESCE({}, {}) = {}",
                        self.q(c),
                        standard_literal(crate::model::table::DEFAULT_QUEUE),
                        p(n)
                    )
                }
                PageFilter::ErrorContains => {
                    n += 1;
                    (self.contains)(&self.q(&spec.last_error), &p(n))
                }
                PageFilter::NotCancelRequested => {
                    format!("{} = 0", self.q(&spec.cancel_requested))
                }
            };
            out.push_str(" AND ");
            out.push_str(&more);
        }
        Some((out, nows, n))
    }

    /// Fills the statements every database spells alike.
    pub fn common(&self, spec: &TableSpec, sql: &mut TableSql) {
        let t = self.q(&spec.name);
        let id = self.q(&spec.id);
        let att = self.q(&spec.attempts);
        let run_at = self.q(&spec.run_at);
        let dead_at = self.q(&spec.dead_at);
        let reason = self.q(&spec.dead_reason);
        let lu = self.q(&spec.locked_until);
        let p = |n| self.p(n);
        sql.insert_one = format!("{}{}", self.insert_head(spec), self.insert_values(spec, 1));
        sql.fetch = format!(
            "SELECT {} FROM {t} WHERE {id} = {}",
            self.row_columns(spec, ""),
            p(1)
        );
        // Dead-lettering frees a dedup key.
        let free_key = spec
            .dedup_key
            .as_ref()
            .map(|k| format!(", {} = NULL", self.q(k)))
            .unwrap_or_default();
        // A dead letter: finished and, on a table that keeps completed rows, not completed
        // (an ack there sets `dead_at` too, so the claims see the row finished).
        let is_dead = match &spec.completed_at {
            Some(c) => format!("{dead_at} IS NOT NULL AND {} IS NULL", self.q(c)),
            None => format!("{dead_at} IS NOT NULL"),
        };
        if let Some(k) = &spec.dedup_key {
            sql.dedup_holder = format!("SELECT {id} FROM {t} WHERE {} = {}", self.q(k), p(1));
            sql.insert_dedup_one = self.insert_dedup(spec, 1);
        }
        // A failure's text and count, written by the statement that retries or dead-letters
        // the row (no round trip of its own): parameters 2 and 3 of a retry, 3 and 4 of a dead
        // letter (the text, `NULL` to keep the last one; 1 to count a failure, else 0).
        let (le, errs) = (self.q(&spec.last_error), self.q(&spec.errors));
        let failed = format!(
            "{le} = COALESCE({}, {le}), {errs} = {errs} + {}",
            p(2),
            p(3)
        );
        let dead_failed = format!(
            "{le} = COALESCE({}, {le}), {errs} = {errs} + {}",
            p(3),
            p(4)
        );
        // A retry of a row whose cancel was requested while it was in work finishes it as
        // cancelled instead ([`Syntax::cancelled_case`]).
        let cancelled = self.cancelled_case(spec);
        match spec.form {
            Form::RowLock => {
                sql.ack = format!("DELETE FROM {t} WHERE {id} = {}", p(1));
                sql.retry = format!(
                    "UPDATE {t} SET {run_at} = {}, {failed}, {att} = {att} + 1 WHERE {id} = {}",
                    p(1),
                    p(4)
                );
                sql.dead = format!(
                    "UPDATE {t} SET {dead_at} = {}, {reason} = {}, {dead_failed}{free_key}, {att} = {att} + 1 WHERE {id} = {}",
                    p(1),
                    p(2),
                    p(5)
                );
            }
            Form::Lease => {
                sql.ack = format!("DELETE FROM {t} WHERE {id} = {} AND {lu} = {}", p(1), p(2));
                sql.retry = format!(
                    "UPDATE {t} SET {run_at} = {}, {failed}, {cancelled}, {lu} = NULL WHERE {id} = {} AND {lu} = {}",
                    p(1),
                    p(4),
                    p(5)
                );
                sql.dead = format!(
                    "UPDATE {t} SET {dead_at} = {}, {reason} = {}, {dead_failed}{free_key}, {lu} = NULL WHERE {id} = {} AND {lu} = {}",
                    p(1),
                    p(2),
                    p(5),
                    p(6)
                );
                // A row handed back whose cancel was requested meanwhile ends as cancelled, as
                // its retry would: no other claim runs it.
                sql.unclaim = format!(
                    "UPDATE {t} SET {lu} = NULL, {att} = {att} - 1, {cancelled} WHERE {id} = {} AND {lu} = {}",
                    p(1),
                    p(2)
                );
                sql.extend = format!(
                    "UPDATE {t} SET {lu} = {} WHERE {id} = {} AND {lu} = {}",
                    p(1),
                    p(2),
                    p(3)
                );
            }
            Form::AdvisoryLock => {
                sql.ack = format!("DELETE FROM {t} WHERE {id} = {}", p(1));
                sql.retry = format!(
                    "UPDATE {t} SET {run_at} = {}, {failed}, {cancelled} WHERE {id} = {}",
                    p(1),
                    p(4)
                );
                sql.dead = format!(
                    "UPDATE {t} SET {dead_at} = {}, {reason} = {}, {dead_failed}{free_key} WHERE {id} = {}",
                    p(1),
                    p(2),
                    p(5)
                );
                sql.unclaim = format!(
                    "UPDATE {t} SET {att} = {att} - 1, {cancelled} WHERE {id} = {}",
                    p(1)
                );
            }
        }
        self.cancel_statements(spec, sql);
        self.preview_statements(spec, sql);
        self.progress_statements(spec, sql);
        // A cancel ends the row as the ack does (deleted, or kept completed), the reason saying
        // why it is finished; the row lock form counts the attempt, as its dead letter does.
        sql.cancel_held = sql.ack.clone();
        if let (Some(c), Some(finish)) = (&spec.completed_at, self.complete_set(spec)) {
            let c = self.q(c);
            let (fence, counted) = match spec.form {
                Form::Lease => (
                    format!("{id} = {} AND {lu} = {}", p(1), p(2)),
                    String::new(),
                ),
                Form::RowLock => (format!("{id} = {}", p(1)), format!(", {att} = {att} + 1")),
                Form::AdvisoryLock => (format!("{id} = {}", p(1)), String::new()),
            };
            sql.ack = format!("UPDATE {t} SET {finish}{counted} WHERE {fence}");
            sql.cancel_held =
                format!("UPDATE {t} SET {finish}, {reason} = '{CANCELLED}'{counted} WHERE {fence}");
            let mut cols = format!("{id}, {att}, {}, {c}", self.q(&spec.payload));
            for col in &spec.columns {
                cols.push_str(&format!(", {}", self.q(&col.name)));
            }
            sql.completed_page = format!(
                "SELECT {cols} FROM {t} WHERE {c} IS NOT NULL AND {id} > {} ORDER BY {id} LIMIT {}",
                p(1),
                p(2)
            );
            sql.completed_bound = format!(
                "SELECT {id} FROM {t} WHERE {c} < {} AND {id} > {} ORDER BY {id} LIMIT 1 OFFSET {}",
                p(1),
                p(2),
                p(3)
            );
            sql.completed_prune_range = format!(
                "DELETE FROM {t} WHERE {c} < {} AND {id} > {} AND {id} <= {}",
                p(1),
                p(2),
                p(3)
            );
        }
        let mut cols = format!(
            "{id}, {att}, {}, {dead_at}, {reason}, {le}, {errs}",
            self.q(&spec.payload)
        );
        for c in &spec.columns {
            cols.push_str(&format!(", {}", self.q(&c.name)));
        }
        sql.dead_list = format!(
            "SELECT {cols} FROM {t} WHERE {is_dead} ORDER BY {dead_at}, {id} LIMIT {}",
            p(1)
        );
        let clear_lease = match spec.form {
            Form::Lease => format!(", {lu} = NULL, {} = 0", self.q(&spec.cancel_requested)),
            Form::AdvisoryLock => format!(", {} = 0", self.q(&spec.cancel_requested)),
            Form::RowLock => String::new(),
        };
        sql.dead_requeue = format!(
            "UPDATE {t} SET {dead_at} = NULL, {reason} = NULL{clear_lease}, {att} = 0, {run_at} = {} \
             WHERE {id} = {} AND {is_dead}",
            p(1),
            p(2)
        );
        // Maintenance by id ranges: every batch a short statement over a primary-key range.
        sql.dead_page = format!(
            "SELECT {cols} FROM {t} WHERE {is_dead} AND {id} > {} ORDER BY {id} LIMIT {}",
            p(1),
            p(2)
        );
        sql.dead_bound = format!(
            "SELECT {id} FROM {t} WHERE {is_dead} AND {id} > {} ORDER BY {id} LIMIT 1 OFFSET {}",
            p(1),
            p(2)
        );
        sql.dead_requeue_range = format!(
            "UPDATE {t} SET {dead_at} = NULL, {reason} = NULL{clear_lease}, {att} = 0, {run_at} = {} \
             WHERE {is_dead} AND {id} > {} AND {id} <= {}",
            p(1),
            p(2),
            p(3)
        );
        sql.dead_purge = format!("DELETE FROM {t} WHERE {id} = {} AND {is_dead}", p(1));
        sql.dead_purge_range = format!(
            "DELETE FROM {t} WHERE {is_dead} AND {id} > {} AND {id} <= {}",
            p(1),
            p(2)
        );
        sql.dead_old_bound = format!(
            "SELECT {id} FROM {t} WHERE {is_dead} AND {dead_at} < {} AND {id} > {} \
             ORDER BY {id} LIMIT 1 OFFSET {}",
            p(1),
            p(2),
            p(3)
        );
        sql.dead_old_prune_range = format!(
            "DELETE FROM {t} WHERE {is_dead} AND {dead_at} < {} AND {id} > {} AND {id} <= {}",
            p(1),
            p(2),
            p(3)
        );
        self.due_statements(spec, sql);
    }

    /// The statements by which `testing::drain_all` makes the jobs scheduled for later due now
    /// ([`TableSql::due_later`], [`TableSql::make_due`]): a live row (`dead_at` empty) due
    /// after `now` and before the latest time the queue writes (a waiting job's due time, see
    /// [`crate::runtime::deps::waiting_due`]: it waits on other jobs, not on the clock). Never
    /// a row in work: in the lease form a leased row (`locked_until` in the future) is left
    /// alone; in the row lock form the rows are read `FOR UPDATE SKIP LOCKED`, so a row a
    /// delivery holds (a checkpoint moves its due time ahead while it is in work) is passed by.
    /// The advisory form's rows in work are due already (the claim takes due rows and moves
    /// nothing). The update checks each condition again, so a row claimed or settled since
    /// the read is left as it is.
    pub fn due_statements(&self, spec: &TableSpec, sql: &mut TableSql) {
        let (t, id, run_at, dead_at) = (
            self.q(&spec.name),
            self.q(&spec.id),
            self.q(&spec.run_at),
            self.q(&spec.dead_at),
        );
        let later = |first: usize| {
            let mut cond = format!(
                "{dead_at} IS NULL AND {run_at} > {} AND {run_at} < {}",
                self.p(first),
                self.p(first + 1)
            );
            if spec.form == Form::Lease {
                let lu = self.q(&spec.locked_until);
                cond.push_str(&format!(
                    " AND ({lu} IS NULL OR {lu} <= {})",
                    self.p(first + 2)
                ));
            }
            cond
        };
        let lock = if spec.form == Form::RowLock {
            " FOR UPDATE SKIP LOCKED"
        } else {
            ""
        };
        sql.due_later = format!(
            "SELECT {id} FROM {t} WHERE {} ORDER BY {id}{lock}",
            later(1)
        );
        sql.make_due = format!(
            "UPDATE {t} SET {run_at} = {} WHERE {id} = {} AND {}",
            self.p(1),
            self.p(2),
            later(3)
        );
    }

    /// [`TableSql::stats`] where aggregates take `FILTER` (PostgreSQL, SQLite): one scan, a
    /// filtered count per state ([`stats_states`](Syntax::stats_states)), the statement's time
    /// as the first parameter.
    #[cfg_attr(not(any(feature = "postgres", feature = "sqlite")), allow(dead_code))]
    pub fn stats_filtered(&self, spec: &TableSpec) -> String {
        let st = self.stats_states(spec, "", &self.p(1));
        let count = |cond: Option<&String>| {
            cond.map_or_else(|| "0".into(), |c| format!("COUNT(*) FILTER (WHERE {c})"))
        };
        format!(
            "SELECT {}, {}, {}, {}, MIN({}) FILTER (WHERE {}), {} FROM {}",
            count(Some(&st.ready)),
            count(Some(&st.scheduled)),
            count(st.held.as_ref()),
            count(Some(&st.dead)),
            self.q(&spec.run_at),
            st.ready,
            count(st.completed.as_ref()),
            self.q(&spec.name)
        )
    }

    /// What [`Broker::stats`](crate::Broker::stats) counts: the conditions of each state,
    /// every column prefixed by `prefix` and `now` standing for the statement's time (each
    /// may appear several times: PostgreSQL and SQLite number their parameter, MySQL reads it
    /// from a joined one-row table). See [`StatsStates`].
    pub fn stats_states(&self, spec: &TableSpec, prefix: &str, now: &str) -> StatsStates {
        let (dead, run_at) = (self.q(&spec.dead_at), self.q(&spec.run_at));
        let live = format!("{prefix}{dead} IS NULL");
        let (free, held) = if spec.form == Form::Lease {
            let lu = format!("{prefix}{}", self.q(&spec.locked_until));
            (
                format!(" AND ({lu} IS NULL OR {lu} <= {now})"),
                Some(format!("{live} AND {lu} > {now}")),
            )
        } else {
            (String::new(), None)
        };
        let completed = spec
            .completed_at
            .as_ref()
            .map(|c| format!("{prefix}{}", self.q(c)));
        StatsStates {
            ready: format!("{live} AND {prefix}{run_at} <= {now}{free}"),
            scheduled: format!("{live} AND {prefix}{run_at} > {now}{free}"),
            held,
            dead: match &completed {
                Some(c) => format!("{prefix}{dead} IS NOT NULL AND {c} IS NULL"),
                None => format!("{prefix}{dead} IS NOT NULL"),
            },
            completed: completed.map(|c| format!("{c} IS NOT NULL")),
        }
    }

    /// The statements of `sqlbroker_unique` for `spec`'s table on `database`
    /// ([`Dialect::database`](crate::dialect::Dialect)): names and keys compared byte for
    /// byte (MySQL: binary strings).
    pub fn unique_sql(&self, spec: &TableSpec, database: &str) -> UniqueSql {
        let (name, key, holder) = match database {
            "MySQL" => ("VARBINARY(64)", "VARBINARY(1020)", "BIGINT"),
            "SQLite" => ("TEXT", "TEXT", "INTEGER"),
            _ => ("TEXT", "TEXT", "BIGINT"),
        };
        let p = |n| self.p(n);
        let u = "sqlbroker_unique";
        UniqueSql {
            create: format!(
                "CREATE TABLE IF NOT EXISTS {u} (table_name {name} NOT NULL, dedup_key {key} \
                 NOT NULL, holder {holder} NOT NULL, PRIMARY KEY (table_name, dedup_key))"
            ),
            holder: format!(
                "SELECT holder FROM {u} WHERE table_name = {} AND dedup_key = {}",
                p(1),
                p(2)
            ),
            forget: format!(
                "DELETE FROM {u} WHERE table_name = {} AND dedup_key = {}",
                p(1),
                p(2)
            ),
            insert: format!(
                "INSERT INTO {u} (table_name, dedup_key, holder) VALUES ({}, {}, {})",
                p(1),
                p(2),
                p(3)
            ),
            sweep: format!(
                "DELETE FROM {u} WHERE table_name = {} AND NOT EXISTS (SELECT 1 FROM {} j \
                 WHERE j.{} = {u}.holder)",
                p(1),
                self.q(&spec.name),
                self.q(&spec.id)
            ),
        }
    }

    /// The update in place of one job ([`Broker::update`](crate::Broker::update), and the
    /// publish that replaces a waiting job): sets what `fields` names on row `id` if it is
    /// live (`dead_at` empty: not dead, not completed) and, in the lease form, not leased (a
    /// lease run out is recorded as a lost one and cleared).
    /// The row lock form takes the row `FOR UPDATE SKIP LOCKED` first and the advisory form
    /// runs it under the row's key: their "not in work" is decided there, not here.
    ///
    /// Parameters, in order: the payload, each user column of `fields.columns`, the priority,
    /// then the due time (on a table with dependencies, the waiting sentinel first: a job
    /// waiting on others keeps waiting), the id, and in the lease form the statement's time.
    pub fn update_job(&self, spec: &TableSpec, fields: &UpdateFields) -> String {
        let (t, id) = (self.q(&spec.name), self.q(&spec.id));
        let mut n = 0;
        let mut p = || {
            n += 1;
            self.p(n)
        };
        let mut set = Vec::new();
        if fields.payload {
            set.push(format!("{} = {}", self.q(&spec.payload), p()));
        }
        for c in &fields.columns {
            set.push(format!("{} = {}", self.q(&spec.columns[*c].name), p()));
        }
        if let (true, Some(pr)) = (fields.priority, &spec.priority) {
            set.push(format!("{} = {}", self.q(pr), p()));
        }
        if fields.run_at {
            let run_at = self.q(&spec.run_at);
            if spec.dependencies {
                let (waiting, value) = (p(), p());
                set.push(format!(
                    "{run_at} = CASE WHEN {run_at} = {waiting} THEN {run_at} ELSE {value} END"
                ));
            } else {
                set.push(format!("{run_at} = {}", p()));
            }
        }
        if spec.form == Form::Lease {
            // A lease run out unsettled is recorded and cleared: the late holder's settlement
            // then fails its fence (`LeaseLost`) instead of finishing the job it no longer
            // holds, whose new version would never run.
            set.push(self.lease_lost_set(spec, ""));
            set.push(format!("{} = NULL", self.q(&spec.locked_until)));
        }
        let mut sql = format!(
            "UPDATE {t} SET {} WHERE {id} = {} AND {} IS NULL",
            set.join(", "),
            p(),
            self.q(&spec.dead_at)
        );
        if spec.form == Form::Lease {
            let lu = self.q(&spec.locked_until);
            sql.push_str(&format!(" AND ({lu} IS NULL OR {lu} <= {})", p()));
        }
        sql
    }
}

/// The statements of a key's unique period ([`Syntax::unique_sql`]): the shared
/// `sqlbroker_unique` (table, key) -> the last job published with a period under that key.
#[derive(Debug, Clone)]
pub(crate) struct UniqueSql {
    /// `CREATE TABLE IF NOT EXISTS`.
    pub create: String,
    /// `(table, key)` -> the holder.
    pub holder: String,
    /// `(table, key)`: forgets the key.
    pub forget: String,
    /// `(table, key, holder)`.
    pub insert: String,
    /// `(table)`: forgets the keys whose job is no longer in the table.
    pub sweep: String,
}

/// What an update in place sets ([`Syntax::update_job`]): the payload, these user columns
/// (indexes into the description's columns), the priority, the due time.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct UpdateFields {
    pub payload: bool,
    pub columns: Vec<usize>,
    pub priority: bool,
    pub run_at: bool,
}
