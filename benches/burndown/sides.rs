//! The two sides of every cell: the library's run and the raw loop's run.

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};

use sqlbroker::{AckMode, Broker, Delivery, Message, NextError, Table};

use crate::args::{defer_within, Cell, Form, Settle};
use crate::{LAST_BATCH_MEAN, PAYLOAD, PUBLISH_CHUNK, STALL};

/// One database: the broker, its three tables, and the raw side's connections.
pub(crate) trait Db: Sync {
    fn name(&self) -> &str;
    fn broker(&self) -> &Broker;
    fn table(&self, form: Form) -> &Table;
    /// Empties `t` (untimed).
    fn clear(&self, t: &Table);
    /// A connection of the raw side running `form`'s protocol on `t` with claims of `batch`
    /// (opened and prepared here, before the clock starts).
    fn raw_on(&self, t: &Table, form: Form, batch: usize) -> Box<dyn RawConn + '_>;
    /// [`raw_on`](Db::raw_on) the form's table.
    fn raw(&self, form: Form, batch: usize) -> Box<dyn RawConn + '_> {
        self.raw_on(self.table(form), form, batch)
    }
    /// Puts `n` due rows into `t` with one statement (scale check; default: publish).
    fn fill_fast(&self, t: &Table, n: u64) {
        publish(self.broker(), t, n, 0);
    }
    /// Ready rows in `t`.
    fn count(&self, _t: &Table) -> u64 {
        0
    }
    /// Blocks of `t`'s ready index read so far (the server's statistics, PostgreSQL), if known.
    fn index_blocks(&self, _t: &Table) -> Option<u64> {
        None
    }
}

/// One raw connection running a protocol.
pub(crate) trait RawConn {
    /// One claim and its settlement: the rows settled, `None` when nothing was claimable.
    fn round(&mut self) -> Option<u64>;
}

/// Publishes `n` messages (keys `k-<from>` ..) into `t`, [`PUBLISH_CHUNK`] per call.
pub(crate) fn publish(broker: &Broker, t: &Table, n: u64, from: u64) {
    let mut i = 0;
    while i < n {
        let k = PUBLISH_CHUNK.min(n - i);
        let batch: Vec<Message> = (0..k)
            .map(|j| Message::new(PAYLOAD.to_vec()).set("k", format!("k-{}", from + i + j)))
            .collect();
        broker.publish_batch(t, batch).expect("publish batch");
        i += k;
    }
}

/// The library: a subscription as the cell says, `handlers` threads settling until `n` jobs are
/// acked. `acked` counts them (read by the memory sampler). Returns jobs/s from `start` to the
/// last ack, and the share of the handler threads' time spent settling (`ack`, `ack_all`; the
/// rest is waiting for deliveries).
pub(crate) fn library_run(db: &dyn Db, cell: &Cell, n: u64, acked: &AtomicU64) -> (f64, f64) {
    let t = db.table(cell.form);
    acked.store(0, Ordering::Relaxed);
    let mut builder = db
        .broker()
        .subscription(t)
        .workers(cell.workers)
        .batch_size(cell.batch);
    if cell.settle == Settle::Deferred {
        builder = builder.ack_mode(AckMode::Deferred {
            within: defer_within(),
        });
    }
    let start = Instant::now();
    let sub = builder.start().expect("start subscription");
    let last = Mutex::new(start);
    let progress = AtomicU64::new(0);
    let settling = AtomicU64::new(0);
    let batches = AtomicU64::new(0);
    let settled = |since: Instant| {
        settling.fetch_add(since.elapsed().as_nanos() as u64, Ordering::Relaxed);
    };
    std::thread::scope(|s| {
        for _ in 0..cell.handlers {
            // Named, as the raw side's threads are, so a profile tells the sides apart.
            let handler = std::thread::Builder::new().name("lib-handler".into());
            handler
                .spawn_scoped(s, || loop {
                    if acked.load(Ordering::Relaxed) >= n {
                        break;
                    }
                    let got = match cell.settle {
                        Settle::Ack | Settle::Deferred => sub
                            .next_delivery_timeout(Duration::from_millis(20))
                            .map(|d| {
                                black_box(d.payload());
                                let t = Instant::now();
                                d.ack().expect("ack");
                                settled(t);
                                1
                            }),
                        Settle::AckAll => {
                            sub.next_batch(100, Duration::from_millis(20)).map(|batch| {
                                for d in &batch {
                                    black_box(d.payload());
                                }
                                let k = batch.len() as u64;
                                batches.fetch_add(1, Ordering::Relaxed);
                                let t = Instant::now();
                                for r in Delivery::ack_all(batch) {
                                    r.expect("ack_all");
                                }
                                settled(t);
                                k
                            })
                        }
                    };
                    match got {
                        Ok(k) => {
                            let now = Instant::now();
                            progress.store(
                                now.duration_since(start).as_millis() as u64,
                                Ordering::Relaxed,
                            );
                            if acked.fetch_add(k, Ordering::AcqRel) + k >= n {
                                *last.lock().unwrap() = now;
                            }
                        }
                        Err(NextError::Closed) => {
                            panic!("subscription closed: {:?}", sub.last_error())
                        }
                        // Nothing in time (later versions also say `Empty`).
                        Err(_) => {
                            let idle = start.elapsed().as_millis() as u64
                                - progress.load(Ordering::Relaxed);
                            if idle > STALL.as_millis() as u64 && acked.load(Ordering::Relaxed) < n
                            {
                                panic!(
                                "no delivery for {STALL:?} after {} of {n} acks; last error: {:?}",
                                acked.load(Ordering::Relaxed),
                                sub.last_error()
                            );
                            }
                        }
                    }
                })
                .expect("spawn a handler");
        }
    });
    let mut elapsed = last.into_inner().unwrap().duration_since(start);
    if cell.settle == Settle::Deferred {
        // Deferred acks: the run ends when the last of them is written.
        sub.close();
        elapsed = start.elapsed();
    }
    let done = acked.load(Ordering::Relaxed);
    sub.shutdown(Duration::from_secs(10)).expect("shutdown");
    let share = settling.load(Ordering::Relaxed) as f64
        / (elapsed.as_nanos() as f64 * cell.handlers as f64);
    if let Some(mean) = (done * 100).checked_div(batches.load(Ordering::Relaxed)) {
        LAST_BATCH_MEAN.store(mean, Ordering::Relaxed);
    }
    (done as f64 / elapsed.as_secs_f64(), share)
}

/// The raw side: `workers` threads, each on a connection of its own, running `form`'s protocol
/// until `n` rows are settled or nothing is claimable. Returns jobs/s.
pub(crate) fn raw_run(db: &dyn Db, form: Form, workers: usize, batch: usize, n: u64) -> f64 {
    let ready = Barrier::new(workers + 1);
    let done = AtomicU64::new(0);
    let stuck = AtomicBool::new(false);
    let start = std::thread::scope(|s| {
        for _ in 0..workers {
            let raw = std::thread::Builder::new().name("raw".into());
            raw.spawn_scoped(s, || {
                let mut conn = db.raw(form, batch);
                ready.wait();
                let mut since = Instant::now();
                while done.load(Ordering::Relaxed) < n && !stuck.load(Ordering::Relaxed) {
                    match conn.round() {
                        None => break,
                        Some(0) => {
                            if since.elapsed() > STALL {
                                stuck.store(true, Ordering::Relaxed);
                            }
                        }
                        Some(k) => {
                            done.fetch_add(k, Ordering::Relaxed);
                            since = Instant::now();
                        }
                    }
                }
            })
            .expect("spawn a raw thread");
        }
        ready.wait();
        Instant::now()
    });
    let elapsed = start.elapsed();
    assert!(
        !stuck.load(Ordering::Relaxed),
        "raw {form:?} made no progress"
    );
    let done = done.load(Ordering::Relaxed);
    assert!(done >= n.min(1), "raw {form:?} settled nothing");
    done as f64 / elapsed.as_secs_f64()
}
