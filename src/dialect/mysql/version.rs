//! The server's flavor (MySQL or MariaDB) and version, and the floors every form needs.

use crate::dialect::{parse_version, DbConn};
use crate::error::BrokerError;
use crate::model::table::Form;
use crate::model::value::Value;

/// Reads the server's version and checks it against the floor of `form`.
pub(super) fn check_server(conn: &mut dyn DbConn, form: Form) -> Result<(), BrokerError> {
    let rows = conn
        .query("SELECT VERSION()", &[])
        .map_err(|e| e.during("version check", ""))?;
    let shown = match rows.first().and_then(|r| r.first()) {
        Some(Value::Text(s)) => s.clone(),
        Some(Value::Bytes(b)) => String::from_utf8_lossy(b).into_owned(),
        _ => "unknown".to_string(),
    };
    check_version(&shown, form)
}

/// The collations under which text compares byte for byte: binary and NO PAD, so keys that
/// differ in case, accents, Unicode normalisation or trailing spaces are different keys, as on
/// PostgreSQL and SQLite. The default utf8mb4 collations are case-insensitive, and
/// `utf8mb4_bin` still pads trailing spaces.
pub(super) const BYTE_EXACT: &[&str] = &["utf8mb4_nopad_bin", "utf8mb4_0900_bin"];

/// The byte-exact collation the server at `shown` (its `VERSION()`) spells: MariaDB's
/// `utf8mb4_nopad_bin` (10.2+), MySQL's `utf8mb4_0900_bin` (8.0.17+: an older MySQL 8 refuses
/// the DDL with "Unknown collation", and has no byte-exact NO PAD text collation to offer).
pub(super) fn text_collation(shown: &str) -> &'static str {
    match server_version(shown) {
        Some((Flavor::Mariadb, _)) => BYTE_EXACT[0],
        _ => BYTE_EXACT[1],
    }
}

/// MySQL or MariaDB: they share the protocol, not the version numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flavor {
    Mysql,
    Mariadb,
}

impl Flavor {
    fn name(self) -> &'static str {
        match self {
            Flavor::Mysql => "MySQL",
            Flavor::Mariadb => "MariaDB",
        }
    }

    /// The oldest supported release. MariaDB: the first that skips locked rows. MySQL: the
    /// first with a byte-exact NO PAD text collation (`utf8mb4_0900_bin`, 8.0.17), which every
    /// text column is made in (SKIP LOCKED came in 8.0.1).
    fn floor(self) -> ((u32, u32, u32), &'static str) {
        match self {
            Flavor::Mysql => ((8, 0, 17), "8.0.17"),
            Flavor::Mariadb => ((10, 6, 0), "10.6"),
        }
    }
}

/// Reads `SELECT VERSION()` (or a handshake's version): the flavor and `major.minor.patch`.
/// MariaDB before 11 may prefix its version with `5.5.5-` for old replication clients; the real
/// version follows it.
fn server_version(s: &str) -> Option<(Flavor, (u32, u32, u32))> {
    let s = s.trim();
    let flavor = if s.to_ascii_lowercase().contains("mariadb") {
        Flavor::Mariadb
    } else {
        Flavor::Mysql
    };
    let s = match (flavor, s.strip_prefix("5.5.5-")) {
        (Flavor::Mariadb, Some(rest)) => rest,
        _ => s,
    };
    Some((flavor, parse_version(s)?))
}

/// Checks a server's version string against the floor. Every form gets the same floor: the
/// support range is one, and the claims of row lock and lease need `SKIP LOCKED`.
fn check_version(shown: &str, form: Form) -> Result<(), BrokerError> {
    let what = match form {
        Form::AdvisoryLock => "the advisory lock form (SKIP LOCKED and byte-exact text)",
        _ => "SKIP LOCKED and byte-exact text",
    };
    let (flavor, version) = match server_version(shown) {
        Some(v) => v,
        None => (Flavor::Mysql, (0, 0, 0)),
    };
    let (floor, needed) = flavor.floor();
    if version < floor {
        return Err(BrokerError::ServerTooOld {
            database: flavor.name(),
            found: shown.to_string(),
            needed: needed.to_string(),
            what,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_and_floors() {
        use Flavor::*;
        assert_eq!(server_version("8.0.0"), Some((Mysql, (8, 0, 0))));
        assert_eq!(server_version("8.4.3"), Some((Mysql, (8, 4, 3))));
        assert_eq!(server_version("5.7.44-log"), Some((Mysql, (5, 7, 44))));
        assert_eq!(
            server_version("10.5.22-MariaDB"),
            Some((Mariadb, (10, 5, 22)))
        );
        assert_eq!(
            server_version("10.6.0-MariaDB-1:10.6.0+maria~focal"),
            Some((Mariadb, (10, 6, 0)))
        );
        assert_eq!(
            server_version("10.11.6-MariaDB-0+deb12u1"),
            Some((Mariadb, (10, 11, 6)))
        );
        assert_eq!(
            server_version("5.5.5-10.11.6-MariaDB"),
            Some((Mariadb, (10, 11, 6)))
        );
        assert_eq!(
            server_version("5.5.5-10.5.8-MariaDB-log"),
            Some((Mariadb, (10, 5, 8)))
        );
        assert_eq!(server_version("nonsense"), None);
        // Byte-exact text: each flavor's own spelling.
        assert_eq!(
            text_collation("10.11.6-MariaDB-0+deb12u1"),
            "utf8mb4_nopad_bin"
        );
        assert_eq!(text_collation("5.5.5-10.6.0-MariaDB"), "utf8mb4_nopad_bin");
        assert_eq!(text_collation("8.0.36"), "utf8mb4_0900_bin");
        assert_eq!(text_collation("8.4.3"), "utf8mb4_0900_bin");

        for ok in [
            "8.0.17",
            "8.4.3",
            "9.1.0",
            "10.6.0-MariaDB-1:10.6.0+maria~focal",
            "10.11.6-MariaDB-0+deb12u1",
            "5.5.5-10.11.6-MariaDB",
        ] {
            for form in [Form::RowLock, Form::Lease, Form::AdvisoryLock] {
                assert!(check_version(ok, form).is_ok(), "{ok} {form:?}");
            }
        }
        for (old, db, needed) in [
            ("8.0.0", "MySQL", "8.0.17"),
            ("8.0.1", "MySQL", "8.0.17"),
            ("8.0.16", "MySQL", "8.0.17"),
            ("5.7.44-log", "MySQL", "8.0.17"),
            ("10.5.22-MariaDB", "MariaDB", "10.6"),
            ("5.5.5-10.5.8-MariaDB-log", "MariaDB", "10.6"),
            ("garbage", "MySQL", "8.0.17"),
        ] {
            match check_version(old, Form::Lease) {
                Err(BrokerError::ServerTooOld {
                    database,
                    found,
                    needed: n,
                    ..
                }) => {
                    assert_eq!((database, found.as_str(), n.as_str()), (db, old, needed));
                }
                other => panic!("{old}: {other:?}"),
            }
        }
    }
}
