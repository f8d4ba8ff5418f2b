//! One logical queue spread over several databases for throughput: a broker per shard, each
//! message routed by a stable hash of its routing key, a subscription on every shard.
//!
//! `cargo run --example sharded [url ...]` (default: three SQLite files in the temp directory;
//! give two or more URLs, of any databases, to shard over servers, e.g.
//! `postgres://postgres@127.0.0.1:5432/test mysql://root@127.0.0.1:3306/test`).
//!
//! What holds, per shard, because everything that needs a guarantee is routed by one key:
//! - FIFO groups: a group's rows all land on the shard its group value hashes to, so they run
//!   one at a time in publish order;
//! - dedup keys: a key is routed with its group (here the key starts with the customer), so
//!   two publishes of one key meet on one shard and the second reports `Duplicate`;
//! - at-least-once and the form's exclusivity, as on one database.
//!
//! What no longer holds globally: order across groups (it never did) and across shards;
//! a priority or due time orders rows only within their shard; counts (`Broker::stats`) are
//! sums of snapshots taken at different moments, not one consistent count; a publish of
//! several messages (`publish_batch`) is atomic per shard only; changing the number of
//! shards moves keys to other shards (drain the queue first, or route new keys only).

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use sqlbroker::{Broker, BrokerError, Message, Subscription, Table};

/// The shards of one logical queue: one broker each, the same table description on each.
struct Sharded {
    shards: Vec<Broker>,
    table: Table,
}

impl Sharded {
    /// FNV-1a, 64 bits: a hash that every process and every release computes alike (the
    /// standard library's `DefaultHasher` promises neither), so a key always finds its shard.
    fn shard_of(&self, routing_key: &str) -> usize {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in routing_key.as_bytes() {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        // The high bits pick the shard (FNV's low bits mix poorly modulo small numbers).
        ((u128::from(h) * self.shards.len() as u128) >> 64) as usize
    }

    /// Publishes `m` on the shard of `routing_key` (the FIFO group; messages with a dedup
    /// key must route by a key the dedup key determines). Returns the shard and the row id.
    fn publish(&self, routing_key: &str, m: Message) -> Result<(usize, i64), BrokerError> {
        let shard = self.shard_of(routing_key);
        let id = self.shards[shard].publish(&self.table, m)?;
        Ok((shard, id))
    }

    /// A subscription on every shard: no row is claimed from a shard without one.
    fn subscribe(&self, workers: usize) -> Result<Vec<Arc<Subscription>>, BrokerError> {
        self.shards
            .iter()
            .map(|b| {
                Ok(Arc::new(
                    b.subscription(&self.table).workers(workers).start()?,
                ))
            })
            .collect()
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut urls: Vec<String> = std::env::args().skip(1).collect();
    if urls.is_empty() {
        let dir = std::env::temp_dir().join(format!("sqlbroker-sharded-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        urls = (0..3)
            .map(|i| format!("sqlite:{}", dir.join(format!("shard{i}.db")).display()))
            .collect();
    }
    // The same description on every shard: FIFO groups by customer, dedup keys, leases.
    let table = Table::new("example_sharded_orders")
        .group("customer")
        .fifo()
        .int_column("seq")
        .dedup()
        .lease(Duration::from_secs(30));
    let shards = urls
        .iter()
        .map(|u| Broker::connect(u))
        .collect::<Result<Vec<_>, _>>()?;
    for b in &shards {
        b.create_table(&table)?;
    }
    let queue = Sharded { shards, table };

    // Nine customers, four orders each, interleaved. The dedup key starts with the customer,
    // so it is routed with the group: a repeated order meets the first on its shard.
    let customers = [
        "alice", "bruno", "chen", "dana", "emil", "farah", "gita", "hugo", "ines",
    ];
    let mut published = 0;
    for seq in 1..=4i64 {
        for c in customers {
            let order = || {
                Message::new(format!("{c} order {seq}"))
                    .set("customer", c)
                    .set("seq", seq)
                    .dedup_key(format!("{c}/{seq}"))
            };
            let (shard, _) = queue.publish(c, order())?;
            published += 1;
            if seq == 2 {
                // The same order again (a client's retry): refused on the same shard.
                match queue.publish(c, order()) {
                    Err(e) if e.is_duplicate() => {}
                    other => panic!("a repeated dedup key on shard {shard}: {other:?}"),
                }
            }
        }
    }
    for c in customers {
        println!("customer {c} -> shard {}", queue.shard_of(c));
    }

    // Counts are per shard; their sum is not one snapshot.
    let ready: u64 = queue
        .shards
        .iter()
        .map(|b| b.stats(&queue.table).map(|s| s.ready))
        .sum::<Result<u64, _>>()?;
    println!(
        "published {published} orders over {} shards; ready (summed): {ready}",
        urls.len()
    );

    // Two claim workers and two handler threads per shard.
    let subs = queue.subscribe(2)?;
    let done = Arc::new(Mutex::new(BTreeMap::<String, Vec<i64>>::new()));
    let handlers: Vec<_> = subs
        .iter()
        .flat_map(|sub| (0..2).map(move |_| sub.clone()))
        .map(|sub| {
            let done = done.clone();
            std::thread::spawn(move || -> Result<(), BrokerError> {
                while let Ok(d) = sub.next_delivery_timeout(Duration::from_millis(1500)) {
                    let customer = d.get("customer").and_then(|v| v.as_str()).unwrap_or("?");
                    let customer = customer.to_string();
                    let seq = d.get("seq").and_then(|v| v.as_i64()).unwrap_or(0);
                    std::thread::sleep(Duration::from_millis(10));
                    d.ack()?;
                    done.lock().entry(customer).or_default().push(seq);
                }
                Ok(())
            })
        })
        .collect();
    for h in handlers {
        h.join().expect("handler thread")?;
    }
    for s in &subs {
        s.shutdown(Duration::from_secs(5))?;
    }

    let done = done.lock();
    let mut seen = HashSet::new();
    for (customer, seqs) in done.iter() {
        println!("{customer}: {seqs:?}");
        // FIFO per group holds: each customer's orders in publish order.
        assert_eq!(seqs, &[1, 2, 3, 4], "{customer}'s orders out of order");
        seen.insert(customer.clone());
    }
    assert_eq!(
        seen.len(),
        customers.len(),
        "a customer's orders were not all worked"
    );
    println!("every customer's orders ran in order on its own shard");
    Ok(())
}
