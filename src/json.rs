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

/// A job type with a kind of its own: its value is the payload (JSON), its `KIND` the row's
/// kind ([`Table::kinds`](crate::Table::kinds)). [`Message::job`] publishes one and
/// [`Worker::job`](crate::Worker::job) registers its handler, which receives it decoded.
///
/// ```
/// use serde::{Deserialize, Serialize};
/// use sqlbroker::{Broker, Message, Table, TypedJob, Worker};
/// use std::time::Duration;
///
/// #[derive(Serialize, Deserialize)]
/// struct Welcome {
///     email: String,
/// }
///
/// impl TypedJob for Welcome {
///     const KIND: &'static str = "welcome";
/// }
///
/// let broker = Broker::connect("sqlite::memory:")?;
/// let jobs = Table::new("jobs").kinds().lease(Duration::from_secs(30));
/// broker.create_table(&jobs)?;
/// broker.publish(&jobs, Message::job(&Welcome { email: "a@example.com".into() })?)?;
/// let worker = Worker::new(&broker)
///     .job(&jobs, |w: Welcome, _d| {
///         assert_eq!(w.email, "a@example.com");
///         Ok::<(), std::io::Error>(())
///     })
///     .start()?;
/// # let t0 = std::time::Instant::now();
/// # while worker.ran().total().acked < 1 && t0.elapsed() < Duration::from_secs(10) {
/// #     std::thread::sleep(Duration::from_millis(20));
/// # }
/// let ran = worker.shutdown(Duration::from_secs(5))?;
/// assert_eq!(ran.get("jobs", "welcome").map(|r| r.acked), Some(1));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub trait TypedJob: Serialize + DeserializeOwned {
    /// The kind its rows carry (a name as [`Message::kind`] takes).
    const KIND: &'static str;
}

impl Message {
    /// A message of `job`'s kind ([`TypedJob::KIND`]) whose payload is `job` as JSON.
    ///
    /// [`BrokerError::Encode`] if `job` cannot be written as JSON.
    pub fn job<T: TypedJob>(job: &T) -> Result<Message> {
        Ok(Message::json(job)?.kind(T::KIND))
    }
}

impl crate::consuming::worker::Worker {
    /// Runs `handler` for the jobs of kind [`T::KIND`](TypedJob::KIND) in `table`, each
    /// decoded from its payload first. A payload that does not decode is a failure of the
    /// job, as `Err(`[`BrokerError::Decode`]`)` from a handler calling [`Delivery::json`]:
    /// the retry policy retries it (a service of a newer release may read it), then it is
    /// dead-lettered with the decode error, its payload kept.
    pub fn job<T, O, E, F>(self, table: &crate::model::table::Table, handler: F) -> Self
    where
        T: TypedJob,
        O: Into<crate::consuming::outcome::Outcome>,
        E: std::fmt::Display,
        F: Fn(T, &Delivery) -> std::result::Result<O, E> + Send + Sync + 'static,
    {
        self.on(table, T::KIND, move |d: &Delivery| {
            let job = d.json::<T>().map_err(|e| e.to_string())?;
            handler(job, d).map(Into::into).map_err(|e| e.to_string())
        })
    }
}
