//! The lease timer: one thread per lease subscription (`sqlbroker-renew-<table>`) renews every
//! in-flight lease once per half lease, one statement per table per round where the database
//! allows it.
//!
//! Each in-flight lease has a cell holding its token. A round `try_lock`s the cells (a cell
//! being settled is skipped: it needs no renewal), renews the held tokens, writes the new token
//! into the cells it renewed and releases them. A settlement takes its cell's lock, so it never
//! runs between the database's renewal and the cell's update, and always names the token the
//! row holds. Only one delivery's settlement ever waits on a round, and for one statement.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::SystemTime;

use crossbeam_channel::{Receiver, RecvTimeoutError};
use parking_lot::{Mutex, MutexGuard};

use super::Ctx;
use crate::schedule::{lease_token, renew_every};

/// Rows renewed per statement (two parameters each).
const RENEW_CHUNK: usize = 500;

/// The token of one in-flight lease.
pub(crate) struct LeaseCell {
    pub id: i64,
    serial: u64,
    state: Mutex<LeaseState>,
}

pub(crate) struct LeaseState {
    pub token: SystemTime,
    /// Settled or abandoned: the renewer leaves it alone.
    pub done: bool,
}

impl LeaseCell {
    pub fn lock(&self) -> MutexGuard<'_, LeaseState> {
        self.state.lock()
    }
}

/// Every in-flight lease of a subscription.
#[derive(Default)]
pub(crate) struct LeaseBook {
    cells: Mutex<HashMap<u64, Arc<LeaseCell>>>,
    next: AtomicU64,
}

impl LeaseBook {
    pub fn insert(&self, id: i64, token: SystemTime) -> Arc<LeaseCell> {
        let serial = self.next.fetch_add(1, Ordering::Relaxed);
        let cell = Arc::new(LeaseCell { id, serial, state: Mutex::new(LeaseState { token, done: false }) });
        self.cells.lock().insert(serial, cell.clone());
        cell
    }

    pub fn remove(&self, cell: &LeaseCell) {
        self.cells.lock().remove(&cell.serial);
    }

    fn snapshot(&self) -> Vec<Arc<LeaseCell>> {
        self.cells.lock().values().cloned().collect()
    }
}

/// The renewer's loop: runs until `stop` fires or disconnects (the subscription's context is
/// gone), or the context can no longer be reached.
pub(crate) fn run(ctx: Weak<Ctx>, stop: Receiver<()>) {
    let Some(secs) = ctx.upgrade().map(|c| c.spec().lease_secs) else { return };
    let every = renew_every(secs);
    loop {
        match stop.recv_timeout(every) {
            Err(RecvTimeoutError::Timeout) => {}
            _ => return,
        }
        let Some(ctx) = ctx.upgrade() else { return };
        round(&ctx);
    }
}

/// One renewal round over every in-flight lease.
pub(crate) fn round(ctx: &Ctx) {
    let cells = ctx.leases.snapshot();
    let mut held: Vec<(&Arc<LeaseCell>, MutexGuard<'_, LeaseState>)> = Vec::new();
    for cell in &cells {
        if let Some(state) = cell.state.try_lock() {
            if !state.done {
                held.push((cell, state));
            }
        }
    }
    for chunk in held.chunks_mut(RENEW_CHUNK) {
        renew_chunk(ctx, chunk);
    }
}

fn renew_chunk(ctx: &Ctx, chunk: &mut [(&Arc<LeaseCell>, MutexGuard<'_, LeaseState>)]) {
    let q = &ctx.queue;
    let pairs: Vec<(i64, SystemTime)> = chunk.iter().map(|(c, s)| (c.id, s.token)).collect();
    let token = lease_token(SystemTime::now(), q.spec.lease_secs);
    let renewed = q
        .conn("renew")
        .and_then(|mut conn| q.dialect.lease_renew(&mut **conn, &q.spec, token, &pairs).map_err(q.err("renew")));
    match renewed {
        Ok(ids) => {
            for (cell, state) in chunk.iter_mut() {
                if ids.contains(&cell.id) {
                    state.token = token;
                } else {
                    log::warn!("table {}: lease of row {} was lost before renewal", q.spec.name, cell.id);
                }
            }
        }
        Err(e) => {
            // The leases keep their tokens; the next round tries again.
            log::warn!("{e}");
            ctx.set_error(e.to_string());
        }
    }
}
