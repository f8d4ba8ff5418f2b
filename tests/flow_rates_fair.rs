//! Rate limits (`Table::rate_limit`) and fair claims (`Table::fair`), on every database x
//! form.
//!
//! - Rate windows are never exceeded across three brokers, timed from each row's claim (the
//!   `claimed` hook, which runs after the claim commits and before any row reaches a
//!   handler); rows over the limit spend no attempt; and a full window is claimed again as it
//!   opens, not a poll interval (here 30 s) later. Fails (`claims of tenant .. within`) with
//!   the slot's free condition made always true, and (`took`) with the claimer's wait for a
//!   window's room removed (tried: lease and advisory on SQLite, every form on PostgreSQL).
//! - An operator's change of a rate limit's max is followed by running subscriptions.
//! - Fair claims reach the small tenants' rows while a big tenant's 200 wait. Fails
//!   (`the last small tenant's row was claim`) with the fair candidates replaced by the
//!   table's order.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{unique, Db, Live};
use sqlbroker::{BrokerError, ClaimedRows, Events, Form, Message, Table};

/// `t` in `form`: the advisory form's own key reads a column unique per message (`u`), so its
/// one-row-per-key lock never stands in for what is tested.
fn in_form(l: &Live, t: Table, form: Form) -> Table {
    let name = t.name().to_string();
    l.track(&format!("{name}_rates"));
    let t = match form {
        Form::Lease => t.lease(Duration::from_secs(30)),
        Form::AdvisoryLock => t.advisory_lock(format!("{name}-{{u}}")),
        _ => t,
    };
    l.create(t)
}

fn message(k: &str, n: usize) -> Message {
    Message::new(format!("{k}{n}").into_bytes())
        .set("k", k)
        .set("u", format!("{k}{n}"))
}

/// Each row's claim time, and the order rows were claimed in.
#[derive(Default)]
struct Claims {
    at: Vec<(i64, Instant)>,
}

struct Watch(Arc<Mutex<Claims>>);

impl Events for Watch {
    fn claimed(&self, e: &ClaimedRows<'_>) {
        let now = Instant::now();
        let mut c = self.0.lock().unwrap();
        c.at.extend(e.ids.iter().map(|id| (*id, now)));
    }
}

const RATE_MAX: u32 = 3;
const WINDOW: Duration = Duration::from_secs(3);
/// How much later than its claim's commit a claim's hook may run, at most, on a loaded
/// machine: the windows checked are this much shorter than the limit's.
const HOOK_SLACK: Duration = Duration::from_secs(1);
const RATE_TENANTS: [&str; 2] = ["a", "b"];
const RATE_ROWS: usize = 7;

fn rate_windows_are_never_exceeded(db: Db, form: Form) {
    let Some(l) = common::live(db) else { return };
    let t = Table::new(unique("rl"))
        .text_column("k")
        .text_column("u")
        .rate_limit("{k}", RATE_MAX, WINDOW);
    let t = in_form(&l, t, form);
    let mut tenant = HashMap::new();
    for k in RATE_TENANTS {
        for n in 0..RATE_ROWS {
            tenant.insert(l.broker.publish(&t, message(k, n)).unwrap(), k);
        }
    }
    let total = RATE_TENANTS.len() * RATE_ROWS;
    let claims = Arc::new(Mutex::new(Claims::default()));
    let done = Arc::new(Mutex::new(Vec::new()));
    let started = Instant::now();
    let deadline = started + Duration::from_secs(60);
    std::thread::scope(|s| {
        for _ in 0..3 {
            let broker = l.connect();
            let (t, claims, done) = (&t, claims.clone(), done.clone());
            s.spawn(move || {
                let sub = broker
                    .subscription(t)
                    .workers(2)
                    .poll_interval(Duration::from_secs(30))
                    .events(Arc::new(Watch(claims)))
                    .start()
                    .unwrap();
                while done.lock().unwrap().len() < total && Instant::now() < deadline {
                    let Ok(d) = sub.next_delivery_timeout(Duration::from_millis(200)) else {
                        continue;
                    };
                    done.lock().unwrap().push((d.id(), d.attempt()));
                    d.ack().unwrap();
                }
                sub.shutdown(Duration::from_secs(10)).unwrap();
            });
        }
    });
    let took = started.elapsed();
    let done = done.lock().unwrap();
    assert_eq!(done.len(), total, "rows acked within a minute");
    for (id, attempt) in done.iter() {
        assert_eq!(
            *attempt, 1,
            "row {id}: a wait on the window spent an attempt"
        );
    }
    let claims = claims.lock().unwrap();
    for k in RATE_TENANTS {
        let mut at: Vec<Instant> = claims
            .at
            .iter()
            .filter(|(id, _)| tenant.get(id) == Some(&k))
            .map(|(_, at)| *at)
            .collect();
        at.sort();
        assert_eq!(at.len(), RATE_ROWS, "tenant {k}: each row claimed once");
        let window = WINDOW - HOOK_SLACK;
        for (i, first) in at.iter().enumerate() {
            let within = at[i..].iter().take_while(|t| **t - *first < window).count();
            assert!(
                within <= RATE_MAX as usize,
                "{within} claims of tenant {k} within {window:?}, limit {RATE_MAX} per {WINDOW:?}"
            );
        }
    }
    // 7 rows at 3 per window: the third window opens 2 windows in. Woken by the window's
    // room, not by the 30 s poll.
    let least = WINDOW * ((RATE_ROWS as u32).div_ceil(RATE_MAX) - 1);
    assert!(
        took >= least - HOOK_SLACK,
        "took {took:?}, at least {least:?}"
    );
    assert!(
        took < least + Duration::from_secs(10),
        "took {took:?}: a full window was not claimed again as it opened"
    );
}

/// An operator's change of a rate limit's max, from another broker, is followed by the
/// running subscription: raised, the rows waiting on the window are claimed; lifted, the rest.
/// Fails (`no delivery within`) with the record's settings ignored by the claim.
fn a_rate_max_changed_at_run_time_is_followed(db: Db, form: Form) {
    let Some(l) = common::live(db) else { return };
    let t = Table::new(unique("rlset"))
        .text_column("k")
        .text_column("u")
        .rate_limit("{k}", 1, Duration::from_secs(600));
    let t = in_form(&l, t, form);
    for n in 0..4 {
        l.broker.publish(&t, message("a", n)).unwrap();
    }
    // Room for all four in hand at once: only the window holds them back.
    let sub = l.broker.subscription(&t).max_in_flight(4).start().unwrap();
    let mut held = vec![common::next(&sub, Duration::from_secs(10))];
    assert!(
        sub.next_delivery_timeout(Duration::from_millis(700))
            .is_err(),
        "a second claim within the window of one"
    );
    let operator = l.connect();
    let limit = &l.broker.rate_limits(&t).unwrap()[0];
    assert_eq!((limit.max, limit.described, limit.claimed), (Some(1), 1, 1));
    // Three ready rows wait on the full window (row lock and advisory: the one in work is
    // counted as ready too).
    let in_work_ready = u64::from(form != Form::Lease);
    assert_eq!(limit.waiting, 3 + in_work_ready);
    // `stats` counts them apart from the ready rows.
    let stats = l.broker.stats(&t).unwrap();
    assert_eq!(
        (stats.ready, stats.limited),
        (0, Some(3 + in_work_ready)),
        "{stats:?}"
    );
    operator.set_rate_limit(&t, "{k}", Some(3)).unwrap();
    // The running subscription may already have claimed the two rows the raise lets in, so
    // only the max is read here; the counts are checked once the window is full again.
    assert_eq!(l.broker.rate_limits(&t).unwrap()[0].max, Some(3));
    held.push(common::next(&sub, Duration::from_secs(10)));
    held.push(common::next(&sub, Duration::from_secs(10)));
    assert!(
        sub.next_delivery_timeout(Duration::from_millis(700))
            .is_err(),
        "a fourth claim within a window of three"
    );
    let limit = &l.broker.rate_limits(&t).unwrap()[0];
    assert_eq!(
        (limit.max, limit.claimed, limit.waiting),
        (Some(3), 3, 1 + 3 * in_work_ready)
    );
    operator.set_rate_limit(&t, "{k}", None).unwrap();
    held.push(common::next(&sub, Duration::from_secs(10)));
    for d in held {
        d.ack().unwrap();
    }
    sub.shutdown(Duration::from_secs(10)).unwrap();
}

const BIG: usize = 200;
const SMALL: [&str; 4] = ["s1", "s2", "s3", "s4"];
const PER_SMALL: usize = 3;

fn fair_claims_reach_every_tenant(db: Db, form: Form) {
    let Some(l) = common::live(db) else { return };
    let t = Table::new(unique("fair"))
        .text_column("k")
        .text_column("u")
        .fair("{k}");
    let t = in_form(&l, t, form);
    let mut small = std::collections::HashSet::new();
    let big: Vec<Message> = (0..BIG).map(|n| message("big", n)).collect();
    l.broker.publish_batch(&t, big).unwrap();
    for k in SMALL {
        for n in 0..PER_SMALL {
            small.insert(l.broker.publish(&t, message(k, n)).unwrap());
        }
    }
    let claims = Arc::new(Mutex::new(Claims::default()));
    let sub = l
        .broker
        .subscription(&t)
        .workers(1)
        .batch_size(2)
        .max_in_flight(2)
        .events(Arc::new(Watch(claims.clone())))
        .start()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut seen = 0;
    while seen < small.len() && Instant::now() < deadline {
        let Ok(d) = sub.next_delivery_timeout(Duration::from_millis(200)) else {
            continue;
        };
        if small.contains(&d.id()) {
            seen += 1;
        }
        d.ack().unwrap();
    }
    sub.shutdown(Duration::from_secs(10)).unwrap();
    assert_eq!(
        seen,
        small.len(),
        "every small tenant's row ran within a minute"
    );
    let claims = claims.lock().unwrap();
    let last = claims
        .at
        .iter()
        .rposition(|(id, _)| small.contains(id))
        .unwrap();
    // Five keys, a row of each per round: the small tenants' three rows each are claimed in
    // the first three rounds (15 rows), give or take the rows claimed ahead.
    let bound = (SMALL.len() + 1) * PER_SMALL + 5;
    assert!(
        last < bound,
        "the last small tenant's row was claim {} of {}; with fair claims within {bound}",
        last + 1,
        claims.at.len()
    );
}

per_db_form!(rate_windows_are_never_exceeded);
per_db_form!(fair_claims_reach_every_tenant);
per_db_form!(a_rate_max_changed_at_run_time_is_followed);

/// `migrate` of a table that gains a rate limit and a fair key makes its slots' table and the
/// fair index, then has nothing left to do; the migrated table claims under both.
fn migrate_adds_what_they_read(db: Db) {
    let Some(l) = common::live(db) else { return };
    let name = unique("rlmig");
    l.track(&format!("{name}_rates"));
    let plain = l.create(
        Table::new(&name)
            .text_column("k")
            .lease(Duration::from_secs(30)),
    );
    let both = plain
        .clone()
        .rate_limit("{k}", 1, Duration::from_secs(600))
        .fair("{k}");
    let done = l.broker.migrate(&both).unwrap();
    assert!(
        done.iter()
            .any(|d| d == &format!("created table {name}_rates")),
        "{done:?}"
    );
    // The fair index too: nothing is missing.
    assert!(l.broker.migration_sql(&both).unwrap().is_empty());
    for k in ["a", "a", "b"] {
        l.broker
            .publish(&both, Message::new(b"x".to_vec()).set("k", k))
            .unwrap();
    }
    let sub = l
        .broker
        .subscription(&both)
        .max_in_flight(3)
        .start()
        .unwrap();
    let first = common::next(&sub, Duration::from_secs(10));
    let second = common::next(&sub, Duration::from_secs(10));
    // One of each key; the second "a" waits on its window.
    assert!(sub
        .next_delivery_timeout(Duration::from_millis(700))
        .is_err());
    first.ack().unwrap();
    second.ack().unwrap();
    sub.shutdown(Duration::from_secs(10)).unwrap();
}

per_db!(migrate_adds_what_they_read);

/// Descriptions rate limits and fair claims refuse, with a typed error, before any SQL.
#[test]
fn bad_rates_and_fair_keys_are_refused() {
    let b = sqlbroker::Broker::connect("sqlite::memory:").unwrap();
    let lease = || {
        Table::new("t")
            .text_column("k")
            .text_column("j")
            .lease(Duration::from_secs(30))
    };
    let second = Duration::from_secs(1);
    for t in [
        lease().rate_limit("{k}", 0, second),
        lease().rate_limit("{k}", Table::MAX_RATE + 1, second),
        lease().rate_limit("{k}", 2, Duration::ZERO),
        lease().rate_limit("{k}", 2, Table::MAX_RATE_WINDOW + second),
        lease().rate_limit("{nope}", 2, second),
        lease()
            .rate_limit("{k}", 2, second)
            .rate_limit("{k}", 3, second),
        lease().group("k").fifo().rate_limit("{k}", 2, second),
        lease().fair(""),
        lease().fair("{k}-{j}"),
        lease().fair("{nope}"),
        lease().group("k").fifo().fair("{j}"),
    ] {
        assert!(
            matches!(b.create_table(&t), Err(BrokerError::InvalidTable { .. })),
            "{t:?}"
        );
    }
    // A message without the column a rate limit or the fair key reads is refused.
    for t in [
        lease().rate_limit("{k}", 2, second),
        Table::new("f")
            .text_column("k")
            .fair("{k}")
            .lease(Duration::from_secs(30)),
    ] {
        b.create_table(&t).unwrap();
        assert!(matches!(
            b.publish(&t, Message::new(b"x".to_vec())),
            Err(BrokerError::InvalidMessage { .. })
        ));
    }
}
