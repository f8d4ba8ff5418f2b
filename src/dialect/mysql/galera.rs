//! MariaDB Galera: whether the server is a node of a multi-primary cluster, and which forms
//! and options keep their guarantee across its nodes.
//!
//! Galera replicates each transaction's writes at commit and certifies them against the
//! transactions other nodes committed meanwhile: of two that wrote the same row, the later is
//! rolled back with a deadlock error (1213). Locks, by contrast, live on the node that took
//! them, and `GET_LOCK` is node-local. So, with brokers on different nodes:
//! - the lease form holds: a claim writes its lease into the row, two claims of one row on two
//!   nodes conflict at commit, and the loser's claim is rolled back and retried like any other
//!   deadlock (the claimer and the settlements retry transient errors);
//! - the row lock form's exclusivity does not: the row's `FOR UPDATE` lock holds only on its
//!   node, so a claim on another node can take the same row while the handler runs;
//! - the advisory lock form's keys (`GET_LOCK`) do not: a key held on one node is free on the
//!   others;
//! - FIFO groups' guard does not: it locks the group's rows `FOR UPDATE NOWAIT`, a node-local
//!   lock, and a publish into the group still uncommitted on another node is invisible to it
//!   (and each node hands out interleaved `AUTO_INCREMENT` ids).
//!
//! Those three are refused at [`Subscription`](crate::Subscription) start with
//! [`BrokerError::ClusterUnsafe`] unless the broker declares that every broker writes through
//! one node ([`BrokerBuilder::galera_single_writer`](crate::BrokerBuilder::galera_single_writer)),
//! where the locks are those of one server again.

use crate::dialect::DbConn;
use crate::error::{BrokerError, DbError};
use crate::model::table::{Form, TableSpec};
use crate::model::value::Value;

/// Whether Galera replication is on for the session's server (MariaDB; MySQL has no such
/// variable, and `SHOW` then returns no row).
pub(super) const WSREP_ON: &str = "SHOW GLOBAL VARIABLES LIKE 'wsrep_on'";

/// The nodes in the cluster's primary component (0 without a provider).
pub(super) const CLUSTER_SIZE: &str = "SHOW GLOBAL STATUS LIKE 'wsrep_cluster_size'";

/// What the server is, as far as node-local locks are concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Topology {
    /// One server (or replication that takes writes on one primary).
    Single,
    /// A node of a Galera cluster of this many nodes when the broker started.
    Galera { nodes: u64 },
}

/// Asks the server: Galera when `wsrep_on` is `ON` and a provider reports a cluster (size at
/// least 1). A server without the variables (MySQL) is a single server.
pub(super) fn probe(conn: &mut dyn DbConn) -> Result<Topology, DbError> {
    let on = second_column(conn.query(WSREP_ON, &[])?);
    if !on.is_some_and(|v| v.eq_ignore_ascii_case("ON")) {
        return Ok(Topology::Single);
    }
    let nodes = second_column(conn.query(CLUSTER_SIZE, &[])?)
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(0);
    Ok(if nodes >= 1 {
        Topology::Galera { nodes }
    } else {
        Topology::Single
    })
}

/// The `Value` column of a `SHOW .. LIKE` answer's first row.
fn second_column(rows: Vec<Vec<Value>>) -> Option<String> {
    match rows.into_iter().next()?.into_iter().nth(1)? {
        Value::Text(s) => Some(s),
        Value::Bytes(b) => Some(String::from_utf8_lossy(&b).into_owned()),
        Value::Int(n) => Some(n.to_string()),
        _ => None,
    }
}

/// What a subscription on `spec` would rely on that does not hold across Galera nodes, and
/// why: `None` when it may start. Single writer declared, or not a cluster: always `None`.
pub(super) fn refusal(
    topology: Topology,
    single_writer: bool,
    spec: &TableSpec,
) -> Option<BrokerError> {
    let Topology::Galera { nodes } = topology else {
        return None;
    };
    if single_writer {
        return None;
    }
    let (what, why) = match spec.form {
        Form::RowLock => (
            "the row lock form",
            "its row lock holds only on the node that took it, so a broker on another node \
             can claim the same row while the handler runs (use the lease form, whose claims \
             conflict at commit across nodes)",
        ),
        Form::AdvisoryLock => (
            "the advisory lock form",
            "GET_LOCK keys are node-local, so a key held through one node is free on the \
             others",
        ),
        Form::Lease if spec.fifo_group().is_some() => (
            "FIFO groups",
            "the group guard locks the group's rows FOR UPDATE NOWAIT, which holds only on \
             its own node, and cannot see a publish still uncommitted on another node",
        ),
        Form::Lease if !spec.limits.is_empty() => (
            "concurrency limits",
            "a claim's turn is a row lock on the table's record, which holds only on its own \
             node (it writes nothing to conflict at commit), so claims through two nodes can \
             both take the last room of a key",
        ),
        Form::Lease if spec.dependencies => (
            "dependencies",
            "a settlement orders itself after the other settlements of a waiting job's parents \
             by a row lock on that job, which holds only on its own node (it writes nothing to \
             conflict at commit), so the last two settlements through two nodes can each miss \
             the other's mark and leave the job waiting",
        ),
        Form::Lease => return None,
    };
    Some(BrokerError::ClusterUnsafe {
        database: "MariaDB Galera",
        what: format!("{what} on table {}", spec.name),
        nodes,
        why,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::table::Table;
    use std::time::Duration;

    fn spec(t: Table) -> TableSpec {
        t.validate().unwrap()
    }

    #[test]
    fn only_the_lease_form_without_fifo_or_limits_starts_on_a_multi_writer_cluster() {
        let lease = spec(Table::new("a").lease(Duration::from_secs(30)));
        let fifo_lease = spec(
            Table::new("b")
                .group("g")
                .fifo()
                .lease(Duration::from_secs(30)),
        );
        let row_lock = spec(Table::new("c"));
        let fifo_row_lock = spec(Table::new("c").group("g").fifo());
        let advisory = spec(Table::new("d").text_column("k").advisory_lock("d-{k}"));
        let limited = spec(
            Table::new("e")
                .text_column("k")
                .concurrency_limit("{k}", 2)
                .lease(Duration::from_secs(30)),
        );
        let waits = spec(
            Table::new("f")
                .dependencies()
                .lease(Duration::from_secs(30)),
        );
        let galera = Topology::Galera { nodes: 3 };
        assert!(refusal(galera, false, &lease).is_none());
        for (s, what) in [
            (&waits, "dependencies"),
            (&limited, "concurrency limits"),
            (&fifo_lease, "FIFO groups"),
            (&row_lock, "the row lock form"),
            (&fifo_row_lock, "the row lock form"),
            (&advisory, "the advisory lock form"),
        ] {
            match refusal(galera, false, s) {
                Some(e @ BrokerError::ClusterUnsafe { nodes: 3, .. }) => {
                    assert!(!e.is_transient());
                    let text = e.to_string();
                    assert!(text.contains(what), "{text}");
                    assert!(text.contains("galera_single_writer"), "{text}");
                }
                other => panic!("{}: {other:?}", s.name),
            }
        }
        // Declared single writer, or not a cluster: everything starts.
        for s in [
            &lease,
            &fifo_lease,
            &row_lock,
            &fifo_row_lock,
            &advisory,
            &limited,
        ] {
            assert!(refusal(galera, true, s).is_none());
            assert!(refusal(Topology::Single, false, s).is_none());
        }
    }

    #[test]
    fn show_answers_are_read_as_text_or_bytes() {
        let row = |v: Value| vec![vec![Value::Text("wsrep_on".into()), v]];
        assert_eq!(
            second_column(row(Value::Text("ON".into()))),
            Some("ON".into())
        );
        assert_eq!(
            second_column(row(Value::Bytes(b"3".to_vec()))),
            Some("3".into())
        );
        assert_eq!(second_column(vec![]), None);
    }
}
