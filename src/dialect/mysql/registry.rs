//! MySQL/MariaDB statements of the table registry (`sqlbroker_tables`, see
//! [`RegistrySql`]). The name is ASCII in a binary collation
//! (`ascii_bin`): table names are ASCII identifiers, compared byte for byte, in every MySQL
//! 8 and MariaDB version alike (no NO PAD collation needed: an identifier has no spaces).

use crate::dialect::{ActionLogSql, FleetSql, MaintainerSql, PeriodicSql, RegistrySql};

pub(super) const REGISTRY: RegistrySql = RegistrySql {
    create: "CREATE TABLE IF NOT EXISTS sqlbroker_tables (\
             name VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY, \
             format INT NOT NULL, \
             description MEDIUMTEXT CHARACTER SET utf8mb4 NOT NULL, \
             paused SMALLINT NOT NULL DEFAULT 0, \
             updated_at DATETIME NOT NULL) ENGINE=InnoDB",
    // `VALUES(col)`: MariaDB's spelling, and MySQL 8's (deprecated there since 8.0.20, still
    // served); the row alias MySQL prefers instead is not MariaDB syntax.
    upsert: "INSERT INTO sqlbroker_tables (name, format, description, updated_at) \
             VALUES (?, ?, ?, ?) ON DUPLICATE KEY UPDATE \
             format = VALUES(format), description = VALUES(description), \
             updated_at = VALUES(updated_at)",
    insert_new: "INSERT IGNORE INTO sqlbroker_tables (name, format, description, updated_at) \
                 VALUES (?, ?, ?, ?)",
    read: "SELECT format, description, paused, updated_at FROM sqlbroker_tables WHERE name = ?",
    replace_stale: "UPDATE sqlbroker_tables SET format = ?, description = ?, updated_at = ? \
                    WHERE name = ? AND description = ? AND updated_at = ?",
    paused: "SELECT paused, description FROM sqlbroker_tables WHERE name = ?",
    limits: "SELECT description FROM sqlbroker_tables WHERE name = ?",
    limits_locked: "SELECT description FROM sqlbroker_tables WHERE name = ? FOR UPDATE",
    list: "SELECT name, format, description, paused FROM sqlbroker_tables ORDER BY name",
    set_paused: "UPDATE sqlbroker_tables SET paused = ?, updated_at = ? WHERE name = ?",
};

/// The operators' action log (`sqlbroker_actions`, see [`ActionLogSql`]).
pub(super) const ACTION_LOG: ActionLogSql = ActionLogSql {
    create: "CREATE TABLE IF NOT EXISTS sqlbroker_actions (\
             id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY, \
             acted_at DATETIME NOT NULL, \
             who TEXT CHARACTER SET utf8mb4 NOT NULL, \
             action TEXT CHARACTER SET utf8mb4 NOT NULL, \
             table_name TEXT CHARACTER SET utf8mb4 NOT NULL, \
             detail TEXT CHARACTER SET utf8mb4 NOT NULL, \
             row_count BIGINT NOT NULL) ENGINE=InnoDB",
    insert: "INSERT INTO sqlbroker_actions (acted_at, who, action, table_name, detail, row_count) \
             VALUES (?, ?, ?, ?, ?, ?)",
    list: "SELECT id, acted_at, who, action, table_name, detail, row_count \
           FROM sqlbroker_actions ORDER BY id DESC LIMIT ?",
    table_exact: "CAST(table_name AS BINARY)",
    sweep_bound: "SELECT id FROM sqlbroker_actions WHERE acted_at < ? ORDER BY id LIMIT 1 OFFSET ?",
    sweep: "DELETE FROM sqlbroker_actions WHERE acted_at < ? AND id <= ?",
};

/// The fleet's heartbeats (`sqlbroker_workers`, see [`FleetSql`]).
pub(super) const FLEET: FleetSql = FleetSql {
    create: "CREATE TABLE IF NOT EXISTS sqlbroker_workers (\
             id VARCHAR(100) CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY, \
             what TEXT CHARACTER SET utf8mb4 NOT NULL, \
             host TEXT CHARACTER SET utf8mb4 NOT NULL, \
             pid BIGINT NOT NULL, \
             tables MEDIUMTEXT CHARACTER SET utf8mb4 NOT NULL, \
             started_at DATETIME NOT NULL, \
             seen_at DATETIME NOT NULL, \
             expires_at DATETIME NOT NULL, \
             in_work BIGINT NOT NULL, \
             handled BIGINT NOT NULL, \
             stuck BIGINT NOT NULL DEFAULT 0, \
             last_error MEDIUMTEXT CHARACTER SET utf8mb4 NULL) ENGINE=InnoDB",
    add_stuck: "ALTER TABLE sqlbroker_workers ADD COLUMN stuck BIGINT NOT NULL DEFAULT 0",
    beat: "INSERT INTO sqlbroker_workers (id, what, host, pid, tables, started_at, seen_at, expires_at, in_work, handled, stuck, last_error) \
           VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) \
           ON DUPLICATE KEY UPDATE tables = VALUES(tables), seen_at = VALUES(seen_at), expires_at = VALUES(expires_at), in_work = VALUES(in_work), handled = VALUES(handled), stuck = VALUES(stuck), last_error = VALUES(last_error)",
    leave: "DELETE FROM sqlbroker_workers WHERE id = ?",
    list: "SELECT id, what, host, pid, tables, started_at, seen_at, in_work, handled, last_error, stuck \
           FROM sqlbroker_workers WHERE expires_at > ? ORDER BY started_at, id",
    list_before_stuck: "SELECT id, what, host, pid, tables, started_at, seen_at, in_work, handled, last_error \
           FROM sqlbroker_workers WHERE expires_at > ? ORDER BY started_at, id",
    sweep: "DELETE FROM sqlbroker_workers WHERE expires_at < ?",
};

/// The periodic schedules' records (`sqlbroker_periodics`, see [`PeriodicSql`]).
pub(super) const PERIODICS: PeriodicSql = PeriodicSql {
    create: "CREATE TABLE IF NOT EXISTS sqlbroker_periodics (\
             table_name VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL, \
             name VARCHAR(200) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL, \
             schedule VARCHAR(200) CHARACTER SET utf8mb4 NOT NULL, \
             time_zone VARCHAR(64) CHARACTER SET utf8mb4 NOT NULL, \
             next_tick DATETIME NULL, \
             last_tick DATETIME NULL, \
             paused SMALLINT NOT NULL DEFAULT 0, \
             seen_at DATETIME NOT NULL, \
             PRIMARY KEY (table_name, name)) ENGINE=InnoDB",
    upsert: "INSERT INTO sqlbroker_periodics (table_name, name, schedule, time_zone, seen_at) \
             VALUES (?, ?, ?, ?, ?) \
             ON DUPLICATE KEY UPDATE schedule = VALUES(schedule), time_zone = VALUES(time_zone), seen_at = VALUES(seen_at)",
    beat: "UPDATE sqlbroker_periodics SET seen_at = ?, next_tick = ?, \
           last_tick = COALESCE(?, last_tick) WHERE table_name = ? AND name = ?",
    paused: "SELECT paused FROM sqlbroker_periodics WHERE table_name = ? AND name = ? FOR UPDATE",
    list: "SELECT table_name, name, schedule, time_zone, next_tick, last_tick, paused, seen_at \
           FROM sqlbroker_periodics ORDER BY table_name, name",
    set_paused: "UPDATE sqlbroker_periodics SET paused = ? WHERE name = ?",
};

/// The maintainer's election (`sqlbroker_maintainer`, see [`MaintainerSql`]).
pub(super) const MAINTAINER: MaintainerSql = MaintainerSql {
    create: "CREATE TABLE IF NOT EXISTS sqlbroker_maintainer (\
             name VARCHAR(20) CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY, \
             holder VARCHAR(200) CHARACTER SET utf8mb4 NOT NULL, \
             host VARCHAR(200) CHARACTER SET utf8mb4 NOT NULL, \
             pid BIGINT NOT NULL, \
             term BIGINT NOT NULL, \
             since DATETIME NOT NULL, \
             expires_at DATETIME NOT NULL) ENGINE=InnoDB",
    seed: "INSERT IGNORE INTO sqlbroker_maintainer (name, holder, host, pid, term, since, expires_at) \
           VALUES ('maintainer', '', '', 0, 0, '1970-01-01 00:00:01', '1970-01-01 00:00:01')",
    take: "UPDATE sqlbroker_maintainer SET holder = ?, host = ?, pid = ?, term = term + 1, \
           since = ?, expires_at = ? WHERE name = 'maintainer' AND expires_at < ?",
    renew: "UPDATE sqlbroker_maintainer SET expires_at = ? \
            WHERE name = 'maintainer' AND holder = ? AND term = ? AND expires_at >= ?",
    resign: "UPDATE sqlbroker_maintainer SET expires_at = ? \
             WHERE name = 'maintainer' AND holder = ? AND term = ?",
    read: "SELECT holder, host, pid, term, since, expires_at FROM sqlbroker_maintainer \
           WHERE name = 'maintainer'",
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_sql() {
        assert!(REGISTRY.create.starts_with(
            "CREATE TABLE IF NOT EXISTS sqlbroker_tables (name VARCHAR(64) CHARACTER SET ascii \
             COLLATE ascii_bin NOT NULL PRIMARY KEY, "
        ));
        assert!(REGISTRY.create.ends_with("ENGINE=InnoDB"));
        assert!(REGISTRY.upsert.ends_with(
            "ON DUPLICATE KEY UPDATE format = VALUES(format), description = VALUES(description), \
             updated_at = VALUES(updated_at)"
        ));
        assert!(
            !REGISTRY.upsert.contains("paused ="),
            "a migrate must keep a pause"
        );
        assert!(REGISTRY
            .insert_new
            .starts_with("INSERT IGNORE INTO sqlbroker_tables"));
        assert_eq!(
            REGISTRY.set_paused,
            "UPDATE sqlbroker_tables SET paused = ?, updated_at = ? WHERE name = ?"
        );
        assert_eq!(
            REGISTRY.paused,
            "SELECT paused, description FROM sqlbroker_tables WHERE name = ?"
        );
    }
}
