//! Operating: the operator's calls on a broker. Creating and migrating tables and their DDL as
//! text, the registry of tables (open by name, list, pause, resume), job lookup and cancel,
//! counts, dead letters and completed rows, filtered listings and "run now" (`matching.rs`),
//! the operators' action log (`actions.rs`), the fleet of running subscriptions and
//! workers (`fleet.rs`), the database's elected maintainer (`maintenance.rs`), and the periodic
//! schedules recorded on the database (`periodics.rs`), a job changed in place (`update.rs`). The top floor of the library: it may use every room
//! below it, and none of them names it.

pub(crate) mod actions;
pub(crate) mod ddl;
pub(crate) mod fleet;
pub(crate) mod jobs;
pub(crate) mod maintenance;
pub(crate) mod matching;
pub(crate) mod ops;
pub(crate) mod periodics;
pub(crate) mod signals;
pub(crate) mod tables;
pub(crate) mod update;
