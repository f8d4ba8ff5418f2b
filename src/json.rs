//! Typed jobs (cargo feature `serde`): a payload as JSON, written from a `Serialize` value and
//! read back into a `Deserialize` one.

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::error::BrokerError;

use crate::consuming::delivery::Delivery;

use crate::producing::message::Message;

use crate::error::Result;

impl Message {
    /// A message whose payload is `value` as JSON (`serde_json`, compact).
    ///
    /// [`BrokerError::Encode`] if `value` cannot be written as JSON (a map whose keys are not
    /// strings, a `Serialize` impl that fails); nothing is published then.
    ///
    /// ```
    /// let m = sqlbroker::Message::json(&serde_json::json!({"account": "a-17", "cents": 100}))?;
    /// assert_eq!(m.payload(), br#"{"account":"a-17","cents":100}"#);
    /// # Ok::<(), sqlbroker::BrokerError>(())
    /// ```
    pub fn json<T: Serialize + ?Sized>(value: &T) -> Result<Message> {
        serde_json::to_vec(value)
            .map(Message::new)
            .map_err(|e| BrokerError::Encode { source: e.into() })
    }
}

impl Delivery {
    /// The payload read as JSON into a `T`.
    ///
    /// [`BrokerError::Decode`] if it is not JSON or not a `T`. The delivery is untouched: it
    /// still holds its row, to be settled like any other (a
    /// [`dead_letter`](Delivery::dead_letter) keeps the payload for inspection; a
    /// [`fail`](Delivery::fail) or a drop retries it, up to the table's
    /// [`max_attempts`](crate::Table::max_attempts)).
    ///
    /// ```
    /// use serde::{Deserialize, Serialize};
    /// use sqlbroker::{Broker, Message, Table};
    /// use std::time::Duration;
    ///
    /// #[derive(Serialize, Deserialize, Debug, PartialEq)]
    /// struct Charge {
    ///     account: String,
    ///     cents: u64,
    /// }
    ///
    /// let broker = Broker::connect("sqlite::memory:")?;
    /// let charges = Table::new("charges").lease(Duration::from_secs(30));
    /// broker.create_table(&charges)?;
    /// broker.publish(&charges, Message::json(&Charge { account: "a-17".into(), cents: 100 })?)?;
    ///
    /// let sub = broker.subscription(&charges).start()?;
    /// let d = sub.next_delivery().expect("one job");
    /// match d.json::<Charge>() {
    ///     Ok(charge) => {
    ///         assert_eq!(charge.cents, 100);
    ///         d.ack()?;
    ///     }
    ///     // The row is still held: settle it as the job's failure says.
    ///     Err(e) => d.dead_letter(e.to_string())?,
    /// }
    /// sub.shutdown(Duration::from_secs(1))?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn json<T: DeserializeOwned>(&self) -> Result<T> {
        serde_json::from_slice(self.payload()).map_err(|e| BrokerError::Decode {
            table: self.table().to_string(),
            id: self.id(),
            source: e.into(),
        })
    }
}
