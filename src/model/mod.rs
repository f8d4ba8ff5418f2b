//! The model: what a table is (its description and the record's format), the values a row
//! holds, the time rules, retry policies and the column checks. Pure data and rules, no I/O;
//! it uses only the errors, and names no room above it.

pub(crate) mod collect;
pub(crate) mod retry;
pub(crate) mod schedule;
pub(crate) mod schema;
pub(crate) mod table;
pub(crate) mod trace;
pub(crate) mod value;
pub(crate) mod waits;
