//! Flow control where operators, a second service and odd rows act on it, on every database x
//! form: a max lowered, lifted and set again while rows are in work; a max raised by another
//! process while the limit is full; the same limits described in another order by a second
//! broker; two rate windows on one key; rate keys that differ only by trailing spaces; a fair
//! key that is `NULL`; a fair key's rows in work past the first few it reads; a key with room
//! behind many keys at their limit.
//!
//! Each test names, at its top, the assertion that fails without its fix.

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{next, unique, Db, Live};
use sqlbroker::{
    Broker, BrokerError, ClaimedRows, Delivery, Events, Form, Message, Subscription, Table,
};

/// `t` in `form`: the advisory form's own key reads a column unique per message (`u`), so its
/// one-row-per-key lock never stands in for the limits tested.
fn in_form(t: Table, form: Form) -> Table {
    let name = t.name().to_string();
    match form {
        Form::Lease => t.lease(Duration::from_secs(30)),
        Form::AdvisoryLock => t.advisory_lock(format!("{name}-{{u}}")),
        _ => t,
    }
}

fn create(l: &Live, t: Table, form: Form) -> Table {
    l.track(&format!("{}_rates", t.name()));
    l.create(in_form(t, form))
}

fn message(k: &str, n: usize) -> Message {
    Message::new(format!("{k}{n}").into_bytes())
        .set("k", k)
        .set("u", format!("{k}{n}"))
}

/// A subscription with room for `n` rows in work at once (the server advisory form holds a
/// connection per delivery and claims one row per claim per worker), polling every 200 ms.
fn sub_with_room(broker: &Broker, t: &Table, n: usize) -> Subscription {
    broker
        .subscription(t)
        .workers(n)
        .max_in_flight(n)
        .poll_interval(Duration::from_millis(200))
        .start()
        .unwrap()
}

/// A broker with room in its pool for `n` rows in work (the server forms but the lease hold a
/// connection per delivery).
fn roomy(l: &Live, n: u32) -> Broker {
    Broker::builder(&l.url).pool_size(n + 8).build().unwrap()
}

/// Asserts no delivery comes within `wait`: `why` says what would have been broken.
fn none_within(sub: &Subscription, wait: Duration, why: &str) {
    if let Ok(d) = sub.next_delivery_timeout(wait) {
        panic!("row {} was claimed: {why}", d.id());
    }
}

/// Takes deliveries until `n` are held (or panics after 10 s).
fn take(sub: &Subscription, held: &mut Vec<Delivery>, n: usize) {
    while held.len() < n {
        held.push(next(sub, Duration::from_secs(10)));
    }
}

/// Item 1. A max of 4 with four rows in work, lowered to 2 by another broker: acks of two of
/// them start nothing (3, then 2 in work); the third's ack lets exactly one in. Lifted, the
/// key takes every row there is room for (6); set again to 2, nothing starts until fewer than 2
/// are in work, and the operator's count reports the 6 in work. Without the fix (slots looked
/// up below the new max only; a lifted limit taking no slot) `a row was claimed: 3 in work
/// under max 2` fails in the row lock and advisory forms.
fn a_lowered_max_is_followed_with_rows_in_work(db: Db, form: Form) {
    let Some(l) = common::live(db) else { return };
    let t = Table::new(unique("low"))
        .text_column("k")
        .text_column("u")
        .concurrency_limit("{k}", 4);
    let t = create(&l, t, form);
    for n in 0..20 {
        l.broker.publish(&t, message("a", n)).unwrap();
    }
    let operator = l.connect();
    let sub = sub_with_room(&l.broker, &t, 6);
    let mut held = Vec::new();
    take(&sub, &mut held, 4);
    none_within(
        &sub,
        Duration::from_millis(600),
        "a fifth row in work, max 4",
    );
    operator.set_concurrency_limit(&t, "{k}", Some(2)).unwrap();
    // The earliest claimed first: in the slot forms they hold the lowest slots.
    held.remove(0).ack().unwrap();
    none_within(&sub, Duration::from_millis(700), "3 in work under max 2");
    held.remove(0).ack().unwrap();
    none_within(&sub, Duration::from_millis(700), "2 in work under max 2");
    held.remove(0).ack().unwrap();
    take(&sub, &mut held, 2);
    none_within(
        &sub,
        Duration::from_millis(700),
        "a third in work under max 2",
    );
    // Lifted: every row there is room for.
    operator.set_concurrency_limit(&t, "{k}", None).unwrap();
    take(&sub, &mut held, 6);
    let limits = operator.concurrency_limits(&t).unwrap();
    assert_eq!(
        (limits[0].max, limits[0].in_work),
        (None, Some(6)),
        "a lifted limit's rows in work are counted"
    );
    operator.set_concurrency_limit(&t, "{k}", Some(2)).unwrap();
    let limits = operator.concurrency_limits(&t).unwrap();
    assert_eq!(
        (limits[0].max, limits[0].in_work),
        (Some(2), Some(6)),
        "the rows in work when the limit was set again are counted"
    );
    for left in [5, 4, 3, 2] {
        held.remove(0).ack().unwrap();
        none_within(
            &sub,
            Duration::from_millis(500),
            &format!("{left} in work under max 2, set again after a lift"),
        );
    }
    held.remove(0).ack().unwrap();
    take(&sub, &mut held, 2);
    for d in held {
        d.ack().unwrap();
    }
    sub.shutdown(Duration::from_secs(10)).unwrap();
}

/// Item 2. With the limit full (max 1, its row held), another broker raises the max to 3 and
/// later lifts it: the running subscription takes the rows the change lets in within a poll
/// interval, with the first row still in work. Without the fix (the lease claim choosing by the
/// maxes it read last, reading them again only at a turn that never comes) `next` times out
/// in the lease form.
fn a_raise_by_another_broker_is_followed_while_full(db: Db, form: Form) {
    let Some(l) = common::live(db) else { return };
    let t = Table::new(unique("raise"))
        .text_column("k")
        .text_column("u")
        .concurrency_limit("{k}", 1);
    let t = create(&l, t, form);
    for n in 0..6 {
        l.broker.publish(&t, message("a", n)).unwrap();
    }
    let operator = l.connect();
    let sub = sub_with_room(&l.broker, &t, 6);
    let mut held = vec![next(&sub, Duration::from_secs(10))];
    none_within(
        &sub,
        Duration::from_millis(600),
        "a second row in work, max 1",
    );
    operator.set_concurrency_limit(&t, "{k}", Some(3)).unwrap();
    let raised = Instant::now();
    take(&sub, &mut held, 3);
    assert!(
        raised.elapsed() < Duration::from_secs(3),
        "the raise was followed after {:?}, poll interval 200 ms",
        raised.elapsed()
    );
    none_within(
        &sub,
        Duration::from_millis(600),
        "a fourth row in work, max 3",
    );
    operator.set_concurrency_limit(&t, "{k}", None).unwrap();
    take(&sub, &mut held, 6);
    for d in held {
        d.ack().unwrap();
    }
    sub.shutdown(Duration::from_secs(10)).unwrap();
}

/// Rows in work per key from the claims (the `claimed` hook runs after the claim commits and
/// before any row of it reaches a handler), and the most seen at once.
#[derive(Default)]
struct Count {
    keys: HashMap<i64, String>,
    now: HashMap<String, u32>,
    most: HashMap<String, u32>,
    claims: Vec<(String, Instant)>,
}

struct Watch(Arc<Mutex<Count>>);

impl Events for Watch {
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
            c.claims.push((k, at));
        }
    }
}

/// Runs `brokers` (each with its own description of one table) with two handlers each until
/// `total` rows are acked (a minute at most), each handler holding a row `hold` long; the
/// count is taken down just before each ack.
fn run_brokers(
    brokers: &[(Broker, Table)],
    count: &Arc<Mutex<Count>>,
    total: usize,
    hold: Duration,
) {
    let done = Arc::new(Mutex::new(0usize));
    let deadline = Instant::now() + Duration::from_secs(60);
    std::thread::scope(|s| {
        for (broker, t) in brokers {
            let (count, done) = (count.clone(), done.clone());
            s.spawn(move || {
                let sub = broker
                    .subscription(t)
                    .workers(2)
                    .max_in_flight(2)
                    .poll_interval(Duration::from_millis(100))
                    .events(Arc::new(Watch(count.clone())))
                    .start()
                    .unwrap();
                std::thread::scope(|s| {
                    for _ in 0..2 {
                        let (sub, count, done) = (&sub, count.clone(), done.clone());
                        s.spawn(move || loop {
                            if *done.lock().unwrap() >= total || Instant::now() >= deadline {
                                return;
                            }
                            let Ok(d) = sub.next_delivery_timeout(Duration::from_millis(100))
                            else {
                                continue;
                            };
                            std::thread::sleep(hold);
                            {
                                let mut c = count.lock().unwrap();
                                let k = c.keys.get(&d.id()).cloned().unwrap_or_default();
                                if let Some(n) = c.now.get_mut(&k) {
                                    *n -= 1;
                                }
                            }
                            d.ack().unwrap();
                            *done.lock().unwrap() += 1;
                        });
                    }
                });
                sub.shutdown(Duration::from_secs(10)).unwrap();
            });
        }
    });
    assert_eq!(*done.lock().unwrap(), total, "rows acked within a minute");
}

/// Item 3. Two brokers describe one table's limits in opposite orders (the record check takes
/// them as one description): a key's limit of 1 holds across both. Without the fix (slot keys
/// named by the limit's position) `2 rows of key a in work at once` fails in the row lock and
/// advisory forms.
fn limits_in_another_order_are_shared(db: Db, form: Form) {
    let Some(l) = common::live(db) else { return };
    let name = unique("order");
    let base = || Table::new(&name).text_column("k").text_column("u");
    let first = create(
        &l,
        base().concurrency_limit("{k}", 1).concurrency_limit("", 8),
        form,
    );
    let second = in_form(
        base().concurrency_limit("", 8).concurrency_limit("{k}", 1),
        form,
    );
    let count = Arc::new(Mutex::new(Count::default()));
    for k in ["a", "b"] {
        for n in 0..6 {
            let id = l.broker.publish(&first, message(k, n)).unwrap();
            count.lock().unwrap().keys.insert(id, k.to_string());
        }
    }
    // The second description is accepted as the same table (the subscription's check).
    let brokers = [(l.connect(), first.clone()), (l.connect(), second)];
    run_brokers(&brokers, &count, 12, Duration::from_millis(30));
    let c = count.lock().unwrap();
    for k in ["a", "b"] {
        let most = c.most.get(k).copied().unwrap_or(0);
        assert_eq!(most, 1, "{most} rows of key {k} in work at once, limit 1");
    }
}

/// Item 3, rate limits. Two brokers describe two rate limits in opposite orders: each key's
/// window of 2 claims per 2 s holds across both. Without the fix (window slots named by the
/// limit's position) `claims of key a within` fails in every form.
fn rates_in_another_order_are_shared(db: Db, form: Form) {
    let Some(l) = common::live(db) else { return };
    let name = unique("rorder");
    let base = || Table::new(&name).text_column("k").text_column("u");
    let window = Duration::from_secs(2);
    let first = create(
        &l,
        base()
            .rate_limit("{k}", 2, window)
            .rate_limit("", 100, Duration::from_secs(1)),
        form,
    );
    let second = in_form(
        base()
            .rate_limit("", 100, Duration::from_secs(1))
            .rate_limit("{k}", 2, window),
        form,
    );
    let count = Arc::new(Mutex::new(Count::default()));
    for n in 0..6 {
        let id = l.broker.publish(&first, message("a", n)).unwrap();
        count.lock().unwrap().keys.insert(id, "a".into());
    }
    let brokers = [(l.connect(), first), (l.connect(), second)];
    run_brokers(&brokers, &count, 6, Duration::ZERO);
    let c = count.lock().unwrap();
    assert_windows(&c.claims, "a", 2, window);
}

/// Asserts no `window` (less a second of slack for the hook's delay after its commit) holds
/// more than `max` claims of key `k`.
fn assert_windows(claims: &[(String, Instant)], k: &str, max: usize, window: Duration) {
    let at: Vec<Instant> = claims
        .iter()
        .filter(|(c, _)| c == k)
        .map(|(_, t)| *t)
        .collect();
    let checked = window - Duration::from_millis(700);
    for (i, start) in at.iter().enumerate() {
        let within = at[i..]
            .iter()
            .take_while(|t| **t - *start < checked)
            .count();
        assert!(
            within <= max,
            "claims of key {k:?} within {checked:?}: {within}, limit {max} per {window:?}"
        );
    }
}

/// Item 7. Two windows on one key ("2 a second and 3 in 4 seconds"): both hold. Without the fix
/// the description is refused (`given twice`).
fn two_rate_windows_on_one_key(db: Db, form: Form) {
    let Some(l) = common::live(db) else { return };
    let short = Duration::from_secs(1);
    let long = Duration::from_secs(4);
    let t = Table::new(unique("twowin"))
        .text_column("k")
        .text_column("u")
        .rate_limit("{k}", 2, short)
        .rate_limit("{k}", 3, long);
    let t = create(&l, t, form);
    let count = Arc::new(Mutex::new(Count::default()));
    for n in 0..5 {
        let id = l.broker.publish(&t, message("a", n)).unwrap();
        count.lock().unwrap().keys.insert(id, "a".into());
    }
    let brokers = [(l.connect(), t.clone())];
    run_brokers(&brokers, &count, 5, Duration::ZERO);
    let c = count.lock().unwrap();
    assert_windows(&c.claims, "a", 2, short);
    assert_windows(&c.claims, "a", 3, long);
    // Each window is listed, and set apart by its window.
    let rates = l.broker.rate_limits(&t).unwrap();
    let windows: Vec<(Duration, Option<u32>)> = rates.iter().map(|r| (r.per, r.max)).collect();
    assert_eq!(windows, [(short, Some(2)), (long, Some(3))]);
    assert!(matches!(
        l.broker.set_rate_limit(&t, "{k}", Some(5)),
        Err(BrokerError::InvalidOption { .. })
    ));
    l.broker.set_rate_window(&t, "{k}", long, Some(5)).unwrap();
    let rates = l.broker.rate_limits(&t).unwrap();
    let windows: Vec<(Duration, Option<u32>)> = rates.iter().map(|r| (r.per, r.max)).collect();
    assert_eq!(windows, [(short, Some(2)), (long, Some(5))]);
}

/// Item 7. Rate keys that differ only by trailing spaces are different keys, as dedup keys are:
/// a window of 1 in a minute lets one row of each in at once. Without the fix MariaDB's PAD
/// SPACE collation makes them one window: `the key with a trailing space` times out.
fn rate_keys_compare_byte_for_byte(db: Db, form: Form) {
    let Some(l) = common::live(db) else { return };
    let t = Table::new(unique("pad"))
        .text_column("k")
        .text_column("u")
        .rate_limit("{k}", 1, Duration::from_secs(60));
    let t = create(&l, t, form);
    l.broker.publish(&t, message("a", 0)).unwrap();
    l.broker.publish(&t, message("a ", 1)).unwrap();
    let sub = sub_with_room(&l.broker, &t, 2);
    let mut keys = HashSet::new();
    for _ in 0..2 {
        let d = sub
            .next_delivery_timeout(Duration::from_secs(5))
            .expect("the key with a trailing space has a window of its own");
        keys.insert(common::key_of(&d));
        d.ack().unwrap();
    }
    assert_eq!(keys, HashSet::from(["a".to_string(), "a ".to_string()]));
    sub.shutdown(Duration::from_secs(10)).unwrap();
}

/// Item 4. A `NULL` fair key is one key of its own: with 20 rows of it published first, the
/// first round serves a, b and c too. Without the fix MariaDB's and SQLite's key read stops at
/// the `NULL` it finds first: `the first four rows claimed` holds only `NULL` keys there.
fn a_null_fair_key_is_one_key_of_its_own(db: Db, form: Form) {
    let Some(l) = common::live(db) else { return };
    let t = Table::new(unique("fnull"))
        .text_column("k")
        .text_column("u")
        .fair("{k}");
    let t = create(&l, t, form);
    for n in 0..20 {
        let m = Message::new(b"null".to_vec())
            .set("k", sqlbroker::Value::Null)
            .set("u", format!("n{n}"));
        l.broker.publish(&t, m).unwrap();
    }
    for k in ["a", "b", "c"] {
        l.broker.publish(&t, message(k, 0)).unwrap();
    }
    let sub = sub_with_room(&l.broker, &t, 1);
    let mut first = Vec::new();
    for _ in 0..4 {
        let d = next(&sub, Duration::from_secs(10));
        first.push(d.get("k").and_then(|v| v.as_str()).map(str::to_string));
        d.ack().unwrap();
    }
    sub.shutdown(Duration::from_secs(10)).unwrap();
    let named: HashSet<String> = first.iter().flatten().cloned().collect();
    assert_eq!(
        named,
        HashSet::from(["a".to_string(), "b".to_string(), "c".to_string()]),
        "the first four rows claimed: {first:?}"
    );
}

/// Item 5. A fair key with a limit of 12 and room for 16 handlers: 12 of its rows are in work
/// at once, not the few a claim first reads of it. Without the fix `rows of key a in work`
/// stops at 8 or fewer in the row lock and advisory forms.
fn a_fair_key_fills_its_limit(db: Db, form: Form) {
    let Some(l) = common::live(db) else { return };
    let t = Table::new(unique("ffill"))
        .text_column("k")
        .text_column("u")
        .fair("{k}")
        .concurrency_limit("{k}", 12);
    let t = create(&l, t, form);
    for n in 0..40 {
        l.broker.publish(&t, message("a", n)).unwrap();
    }
    let broker = roomy(&l, 16);
    let sub = sub_with_room(&broker, &t, 16);
    let mut held = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while held.len() < 12 && Instant::now() < deadline {
        if let Ok(d) = sub.next_delivery_timeout(Duration::from_millis(200)) {
            held.push(d);
        }
    }
    assert_eq!(
        held.len(),
        12,
        "rows of key a in work, limit 12, room for 16"
    );
    none_within(
        &sub,
        Duration::from_millis(600),
        "a 13th row of key a, limit 12",
    );
    for d in held {
        d.ack().unwrap();
    }
    sub.shutdown(Duration::from_secs(10)).unwrap();
}

/// Item 6. With 30 keys at their limit (1 each, their rows held by another broker), a row of a
/// key with room is claimed by the claims its publish wakes, at a batch of 1 and a poll interval
/// of 5 s. Its key sorts among the full ones, away from where the rotation stands. Without the
/// fix (a claim stops after its first read of keys: one key at a batch of 1 in the lease form,
/// 16 in the others) the claims step through the full keys a poll apart: `the free key's row
/// was claimed after` 5 s or more on PostgreSQL (every form) and SQLite's lease form. (MariaDB
/// claims again quickly after a wake-up, and SQLite advisory reads 16 keys a claim: 30 full
/// keys do not hold them back even without it.)
fn a_key_with_room_is_not_held_behind_full_keys(db: Db, form: Form) {
    let Some(l) = common::live(db) else { return };
    let t = Table::new(unique("fbehind"))
        .text_column("k")
        .text_column("u")
        .fair("{k}")
        .concurrency_limit("{k}", 1);
    let t = create(&l, t, form);
    let keys: Vec<String> = (0..30).map(|i| format!("k{i:02}")).collect();
    for k in &keys {
        for n in 0..3 {
            l.broker.publish(&t, message(k, n)).unwrap();
        }
    }
    // Another broker holds one row of every key: each key is at its limit.
    let holder = roomy(&l, 30);
    let hold = sub_with_room(&holder, &t, 30);
    let mut held = Vec::new();
    take(&hold, &mut held, 30);
    hold.close();
    let sub = l
        .broker
        .subscription(&t)
        .workers(1)
        .batch_size(1)
        .max_in_flight(1)
        .poll_interval(Duration::from_secs(5))
        .start()
        .unwrap();
    // The first claim reads the first keys, all at their limit.
    none_within(&sub, Duration::from_secs(1), "a row of a key at its limit");
    let free = l.broker.publish(&t, message("k10-free", 0)).unwrap();
    let published = Instant::now();
    let d = next(&sub, Duration::from_secs(30));
    let took = published.elapsed();
    assert_eq!(d.id(), free);
    assert!(
        took < Duration::from_millis(2500),
        "the free key's row was claimed after {took:?}, poll interval 5 s"
    );
    d.ack().unwrap();
    sub.shutdown(Duration::from_secs(10)).unwrap();
    for d in held {
        d.ack().unwrap();
    }
    hold.shutdown(Duration::from_secs(10)).unwrap();
}

per_db_form!(a_lowered_max_is_followed_with_rows_in_work);
per_db_form!(a_raise_by_another_broker_is_followed_while_full);
per_db_form!(limits_in_another_order_are_shared);
per_db_form!(rates_in_another_order_are_shared);
per_db_form!(two_rate_windows_on_one_key);
per_db_form!(rate_keys_compare_byte_for_byte);
per_db_form!(a_null_fair_key_is_one_key_of_its_own);
per_db_form!(a_fair_key_fills_its_limit);
per_db_form!(a_key_with_room_is_not_held_behind_full_keys);

/// Item 7. A message that leaves out a column a limit reads is refused naming the limit, not
/// "the advisory key template" (a lease table has none).
#[test]
fn a_missing_limit_column_is_named_for_the_limit() {
    let broker = Broker::connect("sqlite::memory:").unwrap();
    let t = Table::new("calls")
        .text_column("account")
        .concurrency_limit("{account}", 2)
        .lease(Duration::from_secs(30));
    broker.create_table(&t).unwrap();
    let e = broker
        .publish(&t, Message::new(b"x".to_vec()))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("concurrency limit \"{account}\"") && !e.contains("advisory"),
        "{e}"
    );
}
