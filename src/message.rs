//! What a producer publishes.

use std::time::Duration;

use crate::table::TableSpec;
use crate::{BrokerError, Result, Value};

/// A message to publish: a binary payload, values for the table's own columns, and an optional
/// delay before it becomes due.
///
/// ```
/// use sqlbroker::Message;
/// use std::time::Duration;
///
/// let m = Message::new(b"{\"cents\":100}".to_vec())
///     .set("account", "a-17")
///     .deliver_after(Duration::from_secs(60));
/// assert_eq!(m.payload(), b"{\"cents\":100}");
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    payload: Vec<u8>,
    values: Vec<(String, Value)>,
    delay: Duration,
}

impl Message {
    /// A message with `payload` as its body.
    pub fn new(payload: impl Into<Vec<u8>>) -> Self {
        Message {
            payload: payload.into(),
            values: Vec::new(),
            delay: Duration::ZERO,
        }
    }

    /// Sets the column `column` (a column the table describes) to `value`; unset columns are
    /// `NULL`. Setting a column twice keeps the last value.
    pub fn set(mut self, column: impl Into<String>, value: impl Into<Value>) -> Self {
        let column = column.into();
        let value = value.into();
        match self.values.iter_mut().find(|(c, _)| *c == column) {
            Some(slot) => slot.1 = value,
            None => self.values.push((column, value)),
        }
        self
    }

    /// Makes the message due `delay` from now (rounded up to the next whole second); it is not
    /// claimed before then.
    pub fn deliver_after(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }

    /// The body.
    pub fn payload(&self) -> &[u8] {
        &self.payload
    }

    /// The delay set with [`Message::deliver_after`].
    pub fn delay(&self) -> Duration {
        self.delay
    }

    /// The insert parameters in the order of the dialects' insert statements:
    /// payload, run_at, then every user column in description order.
    pub(crate) fn params_into(
        self,
        spec: &TableSpec,
        now: std::time::SystemTime,
        out: &mut Vec<Value>,
    ) -> Result<()> {
        for (c, _) in &self.values {
            if spec.column_index(c).is_none() {
                return Err(BrokerError::InvalidMessage {
                    table: spec.name.clone(),
                    reason: format!("{c:?} is not a column of the table description"),
                });
            }
        }
        out.push(Value::Bytes(self.payload));
        out.push(Value::Time(crate::schedule::due_at(now, self.delay)));
        let mut values = self.values;
        for col in &spec.columns {
            let v = values
                .iter()
                .position(|(c, _)| *c == col.name)
                .map(|i| values.swap_remove(i).1);
            out.push(v.unwrap_or(Value::Null));
        }
        Ok(())
    }
}
