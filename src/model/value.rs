//! Column values: what a message sets and what a delivery reads.

use std::time::SystemTime;

/// A value of a column, as published with [`Message::set`](crate::Message::set) and read with
/// [`Delivery::get`](crate::Delivery::get).
///
/// ```
/// use sqlbroker::{Message, Value};
///
/// let m = Message::new(b"x".to_vec()).set("account", "a-17").set("cents", 250i64);
/// assert_eq!(Value::from("a-17").as_str(), Some("a-17"));
/// assert_eq!(Value::from(250i64).as_i64(), Some(250));
/// assert!(Value::from(None::<i64>).is_null());
/// # let _ = m;
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Value {
    /// SQL `NULL`.
    Null,
    /// An integer column (`BIGINT`, or any integer type of an existing table).
    Int(i64),
    /// A floating point column.
    Float(f64),
    /// A text column.
    Text(String),
    /// A binary column.
    Bytes(Vec<u8>),
    /// A timestamp (whole seconds; read from the time columns of the roles).
    Time(SystemTime),
}

impl Value {
    /// The text, if this is a text value.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Text(s) => Some(s),
            _ => None,
        }
    }

    /// The integer, if this is an integer value.
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            Value::Int(i) => Some(*i),
            _ => None,
        }
    }

    /// The bytes of a binary or text value.
    pub fn as_bytes(&self) -> Option<&[u8]> {
        match self {
            Value::Bytes(b) => Some(b),
            Value::Text(s) => Some(s.as_bytes()),
            _ => None,
        }
    }

    /// A row's payload column as bytes (text is taken as its UTF-8 bytes; anything else is
    /// empty).
    pub(crate) fn into_payload(self) -> Vec<u8> {
        match self {
            Value::Bytes(b) => b,
            Value::Text(s) => s.into_bytes(),
            _ => Vec::new(),
        }
    }

    /// True for [`Value::Null`].
    pub fn is_null(&self) -> bool {
        matches!(self, Value::Null)
    }

    /// The number, if this is a floating point value (or an integer, widened).
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Value::Float(f) => Some(*f),
            Value::Int(i) => Some(*i as f64),
            _ => None,
        }
    }

    /// The time, if this is a time value.
    pub fn as_system_time(&self) -> Option<SystemTime> {
        match self {
            Value::Time(t) => Some(*t),
            _ => None,
        }
    }

    /// A time of the role columns (SQLite keeps them as integer seconds).
    pub(crate) fn as_time(&self) -> Option<SystemTime> {
        match self {
            Value::Time(t) => Some(*t),
            Value::Int(i) => Some(crate::model::schedule::from_epoch_secs(*i)),
            _ => None,
        }
    }

    /// The text an advisory key template puts in place of this value: text as is, numbers in
    /// decimal, bytes as lowercase hex, `NULL` as the empty string.
    pub(crate) fn render_into(&self, out: &mut String) {
        use std::fmt::Write;
        match self {
            Value::Null => {}
            Value::Int(i) => {
                let _ = write!(out, "{i}");
            }
            Value::Float(f) => {
                let _ = write!(out, "{f}");
            }
            Value::Text(s) => out.push_str(s),
            Value::Bytes(b) => {
                for byte in b {
                    let _ = write!(out, "{byte:02x}");
                }
            }
            Value::Time(t) => {
                let _ = write!(out, "{}", crate::model::schedule::epoch_secs(*t));
            }
        }
    }
}

/// A payload in `Debug` output: a byte string as Rust writes one (`b"hello\n"`), cut after
/// [`Payload::SHOWN`] bytes with the full length, rather than a list of numbers.
pub(crate) struct Payload<'a>(pub &'a [u8]);

impl Payload<'_> {
    /// Bytes shown before the cut.
    const SHOWN: usize = 64;
}

impl std::fmt::Debug for Payload<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let shown = &self.0[..self.0.len().min(Self::SHOWN)];
        write!(f, "b\"{}\"", shown.escape_ascii())?;
        if shown.len() < self.0.len() {
            write!(f, "... ({} bytes)", self.0.len())?;
        }
        Ok(())
    }
}

impl From<&str> for Value {
    fn from(v: &str) -> Self {
        Value::Text(v.to_string())
    }
}
impl From<&String> for Value {
    fn from(v: &String) -> Self {
        Value::Text(v.clone())
    }
}

impl From<bool> for Value {
    /// `1` or `0`: an integer column holds it on every database.
    fn from(v: bool) -> Self {
        Value::Int(i64::from(v))
    }
}

impl From<i16> for Value {
    fn from(v: i16) -> Self {
        Value::Int(v.into())
    }
}

impl From<f32> for Value {
    fn from(v: f32) -> Self {
        Value::Float(v.into())
    }
}

impl From<&Vec<u8>> for Value {
    fn from(v: &Vec<u8>) -> Self {
        Value::Bytes(v.clone())
    }
}

impl From<String> for Value {
    fn from(v: String) -> Self {
        Value::Text(v)
    }
}
impl From<i64> for Value {
    fn from(v: i64) -> Self {
        Value::Int(v)
    }
}
impl From<i32> for Value {
    fn from(v: i32) -> Self {
        Value::Int(v.into())
    }
}
impl From<u32> for Value {
    fn from(v: u32) -> Self {
        Value::Int(v.into())
    }
}
impl From<f64> for Value {
    fn from(v: f64) -> Self {
        Value::Float(v)
    }
}
impl From<Vec<u8>> for Value {
    fn from(v: Vec<u8>) -> Self {
        Value::Bytes(v)
    }
}
impl From<&[u8]> for Value {
    fn from(v: &[u8]) -> Self {
        Value::Bytes(v.to_vec())
    }
}
impl From<SystemTime> for Value {
    fn from(v: SystemTime) -> Self {
        Value::Time(v)
    }
}
impl<T: Into<Value>> From<Option<T>> for Value {
    fn from(v: Option<T>) -> Self {
        v.map_or(Value::Null, Into::into)
    }
}

/// Sets `column` to `value` in a list of column values, replacing the value it had (setting a
/// column twice keeps the last): what a message's and an update's `set` share.
pub(crate) fn set_in(values: &mut Vec<(String, Value)>, column: String, value: Value) {
    match values.iter_mut().find(|(c, _)| *c == column) {
        Some(slot) => slot.1 = value,
        None => values.push((column, value)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A payload shows as a byte string, escaped, and a long one is cut with its length.
    #[test]
    fn a_payload_shows_as_a_byte_string() {
        assert_eq!(
            format!("{:?}", Payload(b"hi \"x\"\n\xff")),
            r#"b"hi \"x\"\n\xff""#
        );
        let long = vec![b'a'; 100];
        assert_eq!(
            format!("{:?}", Payload(&long)),
            format!("b\"{}\"... (100 bytes)", "a".repeat(64))
        );
    }
}
