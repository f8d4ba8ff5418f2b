//! The floor of the linked SQLite library.

use crate::error::BrokerError;

/// Checks the linked library against the floor of every form.
pub(super) fn check_version() -> Result<(), BrokerError> {
    // UPDATE .. RETURNING arrived in 3.35; the bundled library is newer.
    let v = rusqlite::version_number();
    if v < 3_035_000 {
        return Err(BrokerError::ServerTooOld {
            database: "SQLite",
            found: rusqlite::version().to_string(),
            needed: "3.35.0".into(),
            what: "UPDATE .. RETURNING",
        });
    }
    Ok(())
}
