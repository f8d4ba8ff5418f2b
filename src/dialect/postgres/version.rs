//! The PostgreSQL version floors of each form.

use crate::dialect::DbConn;
use crate::error::BrokerError;
use crate::model::table::Form;
use crate::model::value::Value;

/// Reads the server's version and checks it against the floor of `form`.
pub(super) fn check_server(conn: &mut dyn DbConn, form: Form) -> Result<(), BrokerError> {
    let rows = conn
        .query(
            "SELECT current_setting('server_version_num'), current_setting('server_version')",
            &[],
        )
        .map_err(|e| e.during("version check", ""))?;
    let (num, shown) = match rows.first().map(|r| (&r[0], &r[1])) {
        Some((Value::Text(n), Value::Text(s))) => (n.trim().parse::<u32>().unwrap_or(0), s.clone()),
        _ => (0, "unknown".to_string()),
    };
    check_version(num, &shown, form)
}

/// The oldest `server_version_num` a form needs, and what needs it.
fn floor(form: Form) -> (u32, &'static str, &'static str) {
    match form {
        Form::AdvisoryLock => (110_000, "11", "hashtextextended (advisory lock form)"),
        Form::RowLock | Form::Lease => (90_500, "9.5", "FOR UPDATE SKIP LOCKED"),
    }
}

/// Checks a server's `server_version_num` against the floor of `form`.
fn check_version(num: u32, shown: &str, form: Form) -> Result<(), BrokerError> {
    let (needed, needed_shown, what) = floor(form);
    if num < needed {
        return Err(BrokerError::ServerTooOld {
            database: "PostgreSQL",
            found: shown.to_string(),
            needed: needed_shown.to_string(),
            what,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_floors() {
        assert!(check_version(150004, "15.4", Form::AdvisoryLock).is_ok());
        assert!(check_version(110000, "11.0", Form::AdvisoryLock).is_ok());
        assert!(check_version(90500, "9.5", Form::RowLock).is_ok());
        match check_version(100023, "10.23", Form::AdvisoryLock) {
            Err(BrokerError::ServerTooOld { found, needed, .. }) => {
                assert_eq!((found.as_str(), needed.as_str()), ("10.23", "11"));
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            check_version(90424, "9.4.24", Form::Lease),
            Err(BrokerError::ServerTooOld { .. })
        ));
        assert!(check_version(100023, "10.23", Form::Lease).is_ok());
    }
}
