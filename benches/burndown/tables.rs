//! The tables of one database and its broker.

use std::time::Duration;

use sqlbroker::{Broker, Table};

use crate::args::Form;
use crate::util::{skip, unique};
use crate::{LEASE, POOL};

/// The tables of one database (text column `k`; advisory keys `<table>-{k}`), made by the
/// library.
pub(crate) struct Tables {
    pub(crate) plain: Table,
    pub(crate) lease: Table,
    pub(crate) advisory: Table,
    pub(crate) big: Table,
}

impl Tables {
    pub(crate) fn create(broker: &Broker, prefix: &str) -> Tables {
        let plain = Table::new(unique(&format!("{prefix}_rl"))).text_column("k");
        // SQLite has no row lock form: its row lock cells never run, the table is a lease one.
        let plain = if broker.database() == "SQLite" {
            plain.lease(LEASE)
        } else {
            plain
        };
        let lease = Table::new(unique(&format!("{prefix}_ls")))
            .text_column("k")
            .lease(LEASE);
        let big = Table::new(unique(&format!("{prefix}_big")))
            .text_column("k")
            .lease(LEASE);
        let name = unique(&format!("{prefix}_ad"));
        let template = format!("{name}-{{k}}");
        let advisory = Table::new(name).text_column("k").advisory_lock(template);
        for t in [&plain, &lease, &advisory, &big] {
            broker.create_table(t).expect("create table");
        }
        Tables {
            plain,
            lease,
            advisory,
            big,
        }
    }

    pub(crate) fn get(&self, form: Form) -> &Table {
        match form {
            Form::RowLock => &self.plain,
            Form::Lease => &self.lease,
            Form::Advisory => &self.advisory,
        }
    }

    pub(crate) fn names(&self) -> [&str; 4] {
        [
            self.plain.name(),
            self.lease.name(),
            self.advisory.name(),
            self.big.name(),
        ]
    }
}

/// Connects the broker for `url` with the pool the cells need; `None` after a banner.
pub(crate) fn broker(db: &str, var: &str, url: &str) -> Option<Broker> {
    match Broker::builder(url)
        .pool_size(POOL)
        .connection_timeout(Duration::from_secs(5))
        .build()
    {
        Ok(b) => Some(b),
        Err(e) => {
            skip(db, url, var, &e);
            None
        }
    }
}
