//! Review 1 probes' shared helpers: rows in work per key counted from each claim's commit (the
//! `Events::claimed` hook, which runs after the claim committed and before any of its rows
//! reaches a handler), tables in each form, subscriptions with room.
#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sqlbroker::{Broker, ClaimedRows, Delivery, Events, Form, Message, Subscription, Table};

use crate::common::Live;

/// `t` in `form`; the advisory form's own key reads a column unique per message (`u`).
pub fn in_form(t: Table, form: Form) -> Table {
    let name = t.name().to_string();
    match form {
        Form::Lease => t.lease(Duration::from_secs(30)),
        Form::AdvisoryLock => t.advisory_lock(format!("{name}-{{u}}")),
        _ => t,
    }
}

pub fn create(l: &Live, t: Table, form: Form) -> Table {
    l.track(&format!("{}_rates", t.name()));
    l.create(in_form(t, form))
}

pub fn message(k: &str, n: usize) -> Message {
    Message::new(format!("{k}{n}").into_bytes())
        .set("k", k)
        .set("u", format!("{k}{n}"))
}

/// Rows in work per key, counted from the claims' commits; the most seen at once.
#[derive(Default)]
pub struct Count {
    pub keys: HashMap<i64, String>,
    pub now: HashMap<String, i32>,
    pub most: HashMap<String, i32>,
    pub claims: Vec<(String, Instant, i64)>,
    pub total_now: i32,
    pub total_most: i32,
}

#[derive(Clone, Default)]
pub struct Counter(pub Arc<Mutex<Count>>);

impl Counter {
    pub fn key(&self, id: i64, k: &str) {
        self.0.lock().unwrap().keys.insert(id, k.to_string());
    }
    /// A row leaves work: call just before its settlement.
    pub fn done(&self, id: i64) {
        let mut c = self.0.lock().unwrap();
        let k = c.keys.get(&id).cloned().unwrap_or_default();
        *c.now.entry(k).or_insert(0) -= 1;
        c.total_now -= 1;
    }
    pub fn now(&self, k: &str) -> i32 {
        self.0.lock().unwrap().now.get(k).copied().unwrap_or(0)
    }
    pub fn most(&self, k: &str) -> i32 {
        self.0.lock().unwrap().most.get(k).copied().unwrap_or(0)
    }
    pub fn reset_most(&self) {
        let mut c = self.0.lock().unwrap();
        let now = c.now.clone();
        c.most = now;
        c.total_most = c.total_now;
    }
    pub fn claims_of(&self, k: &str) -> Vec<Instant> {
        self.0
            .lock()
            .unwrap()
            .claims
            .iter()
            .filter(|(c, _, _)| c == k)
            .map(|(_, t, _)| *t)
            .collect()
    }
    pub fn events(&self) -> Arc<dyn Events> {
        Arc::new(self.clone())
    }
}

impl Events for Counter {
    fn claimed(&self, e: &ClaimedRows<'_>) {
        let at = Instant::now();
        let mut c = self.0.lock().unwrap();
        for id in e.ids {
            let k = c.keys.get(id).cloned().unwrap_or_default();
            let n = {
                let n = c.now.entry(k.clone()).or_insert(0);
                *n += 1;
                *n
            };
            let most = c.most.entry(k.clone()).or_insert(0);
            *most = (*most).max(n);
            c.total_now += 1;
            c.total_most = c.total_most.max(c.total_now);
            c.claims.push((k, at, *id));
        }
    }
}

/// A broker with room in its pool for `n` rows in work.
pub fn roomy(l: &Live, n: u32) -> Broker {
    Broker::builder(&l.url).pool_size(n + 6).build().unwrap()
}

/// A subscription with room for `n` rows in work, polling every `poll`, counted by `c`.
pub fn sub(broker: &Broker, t: &Table, n: usize, poll: Duration, c: &Counter) -> Subscription {
    broker
        .subscription(t)
        .workers(n.min(4))
        .max_in_flight(n)
        .poll_interval(poll)
        .events(c.events())
        .start()
        .unwrap()
}

/// Takes deliveries until `n` are held (panics after `wait`).
pub fn take(sub: &Subscription, held: &mut Vec<Delivery>, n: usize, wait: Duration) {
    let deadline = Instant::now() + wait;
    while held.len() < n {
        let left = deadline.saturating_duration_since(Instant::now());
        match sub.next_delivery_timeout(left.max(Duration::from_millis(1))) {
            Ok(d) => held.push(d),
            Err(_) => panic!("only {} of {n} deliveries within {wait:?}", held.len()),
        }
    }
}

/// Acks `d`, counted out first.
pub fn ack(c: &Counter, d: Delivery) {
    c.done(d.id());
    d.ack().unwrap();
}

/// Takes whatever comes within `wait`.
pub fn drain_for(sub: &Subscription, held: &mut Vec<Delivery>, wait: Duration) {
    let deadline = Instant::now() + wait;
    while Instant::now() < deadline {
        if let Ok(d) = sub.next_delivery_timeout(Duration::from_millis(50)) {
            held.push(d);
        }
    }
}
