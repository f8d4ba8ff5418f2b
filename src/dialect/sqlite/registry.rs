//! SQLite statements of the table registry (`sqlbroker_tables`, see
//! [`RegistrySql`]). `name` is `TEXT` in SQLite's default
//! `BINARY` collation: compared byte for byte.

use crate::dialect::{ActionLogSql, FleetSql, MaintainerSql, PeriodicSql, RegistrySql};

pub(super) const REGISTRY: RegistrySql = RegistrySql {
    create: "CREATE TABLE IF NOT EXISTS sqlbroker_tables (\
             name TEXT NOT NULL PRIMARY KEY, \
             format INTEGER NOT NULL, \
             description TEXT NOT NULL, \
             paused INTEGER NOT NULL DEFAULT 0, \
             updated_at INTEGER NOT NULL)",
    upsert: "INSERT INTO sqlbroker_tables (name, format, description, updated_at) \
             VALUES (?1, ?2, ?3, ?4) ON CONFLICT (name) DO UPDATE SET \
             format = excluded.format, description = excluded.description, \
             updated_at = excluded.updated_at",
    insert_new: "INSERT INTO sqlbroker_tables (name, format, description, updated_at) \
                 VALUES (?1, ?2, ?3, ?4) ON CONFLICT (name) DO NOTHING",
    read: "SELECT format, description, paused, updated_at FROM sqlbroker_tables WHERE name = ?1",
    replace_stale: "UPDATE sqlbroker_tables SET format = ?1, description = ?2, updated_at = ?3 \
                    WHERE name = ?4 AND description = ?5 AND updated_at = ?6",
    paused: "SELECT paused, description FROM sqlbroker_tables WHERE name = ?1",
    limits: "SELECT description FROM sqlbroker_tables WHERE name = ?1",
    limits_locked: "SELECT description FROM sqlbroker_tables WHERE name = ?1",
    list: "SELECT name, format, description, paused FROM sqlbroker_tables ORDER BY name",
    set_paused: "UPDATE sqlbroker_tables SET paused = ?1, updated_at = ?2 WHERE name = ?3",
};

/// The operators' action log (`sqlbroker_actions`, see [`ActionLogSql`]).
pub(super) const ACTION_LOG: ActionLogSql = ActionLogSql {
    create: "CREATE TABLE IF NOT EXISTS sqlbroker_actions (\
             id INTEGER PRIMARY KEY AUTOINCREMENT, \
             acted_at INTEGER NOT NULL, \
             who TEXT NOT NULL, \
             action TEXT NOT NULL, \
             table_name TEXT NOT NULL, \
             detail TEXT NOT NULL, \
             row_count INTEGER NOT NULL)",
    insert: "INSERT INTO sqlbroker_actions (acted_at, who, action, table_name, detail, row_count) \
             VALUES (?, ?, ?, ?, ?, ?)",
    list: "SELECT id, acted_at, who, action, table_name, detail, row_count \
           FROM sqlbroker_actions ORDER BY id DESC LIMIT ?",
    table_exact: "table_name",
    sweep_bound:
        "SELECT id FROM sqlbroker_actions WHERE acted_at < ?1 ORDER BY id LIMIT 1 OFFSET ?2",
    sweep: "DELETE FROM sqlbroker_actions WHERE acted_at < ?1 AND id <= ?2",
};

/// The fleet's heartbeats (`sqlbroker_workers`, see [`FleetSql`]).
pub(super) const FLEET: FleetSql = FleetSql {
    create: "CREATE TABLE IF NOT EXISTS sqlbroker_workers (\
             id TEXT NOT NULL PRIMARY KEY, \
             what TEXT NOT NULL, \
             host TEXT NOT NULL, \
             pid INTEGER NOT NULL, \
             tables TEXT NOT NULL, \
             started_at INTEGER NOT NULL, \
             seen_at INTEGER NOT NULL, \
             expires_at INTEGER NOT NULL, \
             in_work INTEGER NOT NULL, \
             handled INTEGER NOT NULL, \
             stuck INTEGER NOT NULL DEFAULT 0, \
             last_error TEXT NULL)",
    add_stuck: "ALTER TABLE sqlbroker_workers ADD COLUMN stuck INTEGER NOT NULL DEFAULT 0",
    beat: "INSERT INTO sqlbroker_workers (id, what, host, pid, tables, started_at, seen_at, expires_at, in_work, handled, stuck, last_error) \
           VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12) \
           ON CONFLICT (id) DO UPDATE SET tables = excluded.tables, seen_at = excluded.seen_at, expires_at = excluded.expires_at, in_work = excluded.in_work, handled = excluded.handled, stuck = excluded.stuck, last_error = excluded.last_error",
    leave: "DELETE FROM sqlbroker_workers WHERE id = ?1",
    list: "SELECT id, what, host, pid, tables, started_at, seen_at, in_work, handled, last_error, stuck \
           FROM sqlbroker_workers WHERE expires_at > ?1 ORDER BY started_at, id",
    list_before_stuck: "SELECT id, what, host, pid, tables, started_at, seen_at, in_work, handled, last_error \
           FROM sqlbroker_workers WHERE expires_at > ?1 ORDER BY started_at, id",
    sweep: "DELETE FROM sqlbroker_workers WHERE expires_at < ?1",
};

/// The periodic schedules' records (`sqlbroker_periodics`, see [`PeriodicSql`]).
pub(super) const PERIODICS: PeriodicSql = PeriodicSql {
    create: "CREATE TABLE IF NOT EXISTS sqlbroker_periodics (\
             table_name TEXT NOT NULL, \
             name TEXT NOT NULL, \
             schedule TEXT NOT NULL, \
             time_zone TEXT NOT NULL, \
             next_tick INTEGER NULL, \
             last_tick INTEGER NULL, \
             paused INTEGER NOT NULL DEFAULT 0, \
             seen_at INTEGER NOT NULL, \
             PRIMARY KEY (table_name, name))",
    upsert: "INSERT INTO sqlbroker_periodics (table_name, name, schedule, time_zone, seen_at) \
             VALUES (?1, ?2, ?3, ?4, ?5) \
             ON CONFLICT (table_name, name) DO UPDATE SET schedule = excluded.schedule, time_zone = excluded.time_zone, seen_at = excluded.seen_at",
    beat: "UPDATE sqlbroker_periodics SET seen_at = ?1, next_tick = ?2, \
           last_tick = COALESCE(?3, last_tick) WHERE table_name = ?4 AND name = ?5",
    paused: "SELECT paused FROM sqlbroker_periodics WHERE table_name = ?1 AND name = ?2",
    list: "SELECT table_name, name, schedule, time_zone, next_tick, last_tick, paused, seen_at \
           FROM sqlbroker_periodics ORDER BY table_name, name",
    set_paused: "UPDATE sqlbroker_periodics SET paused = ?1 WHERE name = ?2",
};

/// The maintainer's election (`sqlbroker_maintainer`, see [`MaintainerSql`]).
pub(super) const MAINTAINER: MaintainerSql = MaintainerSql {
    create: "CREATE TABLE IF NOT EXISTS sqlbroker_maintainer (\
             name TEXT NOT NULL PRIMARY KEY, \
             holder TEXT NOT NULL, \
             host TEXT NOT NULL, \
             pid INTEGER NOT NULL, \
             term INTEGER NOT NULL, \
             since INTEGER NOT NULL, \
             expires_at INTEGER NOT NULL)",
    seed: "INSERT INTO sqlbroker_maintainer (name, holder, host, pid, term, since, expires_at) \
           VALUES ('maintainer', '', '', 0, 0, 0, 0) ON CONFLICT (name) DO NOTHING",
    take: "UPDATE sqlbroker_maintainer SET holder = ?1, host = ?2, pid = ?3, term = term + 1, \
           since = ?4, expires_at = ?5 WHERE name = 'maintainer' AND expires_at < ?6",
    renew: "UPDATE sqlbroker_maintainer SET expires_at = ?1 \
            WHERE name = 'maintainer' AND holder = ?2 AND term = ?3 AND expires_at >= ?4",
    resign: "UPDATE sqlbroker_maintainer SET expires_at = ?1 \
             WHERE name = 'maintainer' AND holder = ?2 AND term = ?3",
    read: "SELECT holder, host, pid, term, since, expires_at FROM sqlbroker_maintainer \
           WHERE name = 'maintainer'",
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_sql() {
        assert!(REGISTRY.create.starts_with(
            "CREATE TABLE IF NOT EXISTS sqlbroker_tables (name TEXT NOT NULL PRIMARY KEY, "
        ));
        assert!(REGISTRY.upsert.ends_with(
            "ON CONFLICT (name) DO UPDATE SET format = excluded.format, \
             description = excluded.description, updated_at = excluded.updated_at"
        ));
        assert!(
            !REGISTRY.upsert.contains("paused ="),
            "a migrate must keep a pause"
        );
        assert!(REGISTRY
            .insert_new
            .ends_with("ON CONFLICT (name) DO NOTHING"));
        assert_eq!(
            REGISTRY.set_paused,
            "UPDATE sqlbroker_tables SET paused = ?1, updated_at = ?2 WHERE name = ?3"
        );
        assert_eq!(
            REGISTRY.paused,
            "SELECT paused, description FROM sqlbroker_tables WHERE name = ?1"
        );
    }
}
