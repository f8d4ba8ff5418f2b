//! The first adversarial review's probes of flow control and the operator's tools, kept as
//! regression tests (each module names the README promise it probes, and what it saw broken
//! before the fix): concurrency limits set back to an earlier max or after a lift, a claim
//! that read the record before a lowering, fair keys with a narrower limit or rate inside,
//! a limit added by `migrate` while the old description runs, MariaDB lock names of 4-byte
//! characters, the action log of tables whose names differ in case, and everything at once
//! with an operator changing the maxes.

mod common;
mod review_util;

/// Review 1 probes: concurrency limits changed by operators while rows are in work, counted
/// from each claim's commit (`Events::claimed`).
mod limits {
    #![allow(unused_imports)]
    use super::{common, review_util};
    use crate::per_db_form;

    use std::time::Duration;

    use common::{unique, Db};
    use review_util::*;
    use sqlbroker::{Form, Table};

    /// README, "Lowered, lifted, set again": "Lowering a max stops new claims of that key until
    /// fewer rows than the new max are in work". Described max 4; set to 2 (broker A claims two
    /// rows under it, finding no slot above 2: "clean"); raised to 4 (broker B claims two more:
    /// 4 in work under 4, fine); lowered to 2 again, which writes the very text of the record A
    /// parsed before. A's two acks leave B's two rows in work: 2 in work under max 2, so A must
    /// claim nothing. Seen: A claims two (4 in work under max 2) in the row lock and advisory
    /// forms: the key stays "clean" because the record's text came back the same.
    fn lowered_again_to_the_same_max(db: Db, form: Form) {
        let Some(l) = common::live(db) else { return };
        let t = Table::new(unique("rv_same"))
            .text_column("k")
            .text_column("u")
            .concurrency_limit("{k}", 4);
        let t = create(&l, t, form);
        let c = Counter::default();
        for n in 0..12 {
            let id = l.broker.publish(&t, message("a", n)).unwrap();
            c.key(id, "a");
        }
        let operator = l.connect();
        operator.set_concurrency_limit(&t, "{k}", Some(2)).unwrap();
        let a = roomy(&l, 2);
        let sub_a = sub(&a, &t, 2, Duration::from_millis(100), &c);
        let mut held_a = Vec::new();
        take(&sub_a, &mut held_a, 2, Duration::from_secs(10));
        operator.set_concurrency_limit(&t, "{k}", Some(4)).unwrap();
        let b = roomy(&l, 2);
        let sub_b = sub(&b, &t, 2, Duration::from_millis(100), &c);
        let mut held_b = Vec::new();
        take(&sub_b, &mut held_b, 2, Duration::from_secs(10));
        assert_eq!(c.now("a"), 4);
        operator.set_concurrency_limit(&t, "{k}", Some(2)).unwrap();
        c.reset_most();
        for d in held_a.drain(..) {
            ack(&c, d);
        }
        // B holds 2 under max 2: A may claim nothing.
        drain_for(&sub_a, &mut held_a, Duration::from_secs(2));
        let limits = operator.concurrency_limits(&t).unwrap();
        let most_after = c.now("a");
        eprintln!(
            "after the lowering: A claimed {}, in work {most_after}, operator's view max {:?} in work {:?}",
            held_a.len(),
            limits[0].max,
            limits[0].in_work
        );
        for d in held_a.drain(..).chain(held_b.drain(..)) {
            ack(&c, d);
        }
        sub_a.shutdown(Duration::from_secs(10)).unwrap();
        sub_b.shutdown(Duration::from_secs(10)).unwrap();
        assert!(
            most_after <= 2,
            "{most_after} rows of key a in work under max 2 (lowered again to the same max)"
        );
    }

    /// The same with lifts, an incident's natural steps: set to 2 (A claims under it, the key is
    /// clean), lifted (B claims two more: 4 in work, no max), set to 2 again: the record's text is
    /// the one A parsed at the first setting. A's acks leave B's two rows in work: A must claim
    /// nothing.
    fn set_again_after_a_lift(db: Db, form: Form) {
        let Some(l) = common::live(db) else { return };
        let t = Table::new(unique("rv_lift"))
            .text_column("k")
            .text_column("u")
            .concurrency_limit("{k}", 4);
        let t = create(&l, t, form);
        let c = Counter::default();
        for n in 0..12 {
            let id = l.broker.publish(&t, message("a", n)).unwrap();
            c.key(id, "a");
        }
        let operator = l.connect();
        operator.set_concurrency_limit(&t, "{k}", None).unwrap();
        operator.set_concurrency_limit(&t, "{k}", Some(2)).unwrap();
        let a = roomy(&l, 2);
        let sub_a = sub(&a, &t, 2, Duration::from_millis(100), &c);
        let mut held_a = Vec::new();
        take(&sub_a, &mut held_a, 2, Duration::from_secs(10));
        operator.set_concurrency_limit(&t, "{k}", None).unwrap();
        let b = roomy(&l, 2);
        let sub_b = sub(&b, &t, 2, Duration::from_millis(100), &c);
        let mut held_b = Vec::new();
        take(&sub_b, &mut held_b, 2, Duration::from_secs(10));
        operator.set_concurrency_limit(&t, "{k}", Some(2)).unwrap();
        for d in held_a.drain(..) {
            ack(&c, d);
        }
        drain_for(&sub_a, &mut held_a, Duration::from_secs(2));
        let now = c.now("a");
        eprintln!(
            "{db:?} {form:?}: after the set again, A claimed {}, in work {now}",
            held_a.len()
        );
        for d in held_a.drain(..).chain(held_b.drain(..)) {
            ack(&c, d);
        }
        sub_a.shutdown(Duration::from_secs(10)).unwrap();
        sub_b.shutdown(Duration::from_secs(10)).unwrap();
        assert!(
            now <= 2,
            "{now} rows of key a in work under max 2 (set again after a lift)"
        );
    }

    macro_rules! slot_forms {
        ($body:ident) => {
            mod $body {
                use super::*;
                #[test]
                fn sqlite_advisory() {
                    super::$body(Db::Sqlite, Form::AdvisoryLock)
                }
                #[test]
                fn postgres_row_lock() {
                    super::$body(Db::Postgres, Form::RowLock)
                }
                #[test]
                fn postgres_advisory() {
                    super::$body(Db::Postgres, Form::AdvisoryLock)
                }
                #[test]
                fn mysql_row_lock() {
                    super::$body(Db::Mysql, Form::RowLock)
                }
                #[test]
                fn mysql_advisory() {
                    super::$body(Db::Mysql, Form::AdvisoryLock)
                }
                #[test]
                fn postgres_lease() {
                    super::$body(Db::Postgres, Form::Lease)
                }
            }
        };
    }

    slot_forms!(lowered_again_to_the_same_max);
    slot_forms!(set_again_after_a_lift);

    /// README, "Flow control": a row over a limit "is claimed by the first claim after room
    /// opens: at once in the broker whose settlement opened it, within a poll interval
    /// elsewhere". Limit 1, poll interval 5 s, room for 2 in one subscription: the ack of the row
    /// in work must let the next row in at once (well under the poll interval).
    fn the_settling_broker_claims_at_once(db: Db, form: Form) {
        let Some(l) = common::live(db) else { return };
        let t = Table::new(unique("rv_once"))
            .text_column("k")
            .text_column("u")
            .concurrency_limit("{k}", 1);
        let t = create(&l, t, form);
        let c = Counter::default();
        for n in 0..6 {
            let id = l.broker.publish(&t, message("a", n)).unwrap();
            c.key(id, "a");
        }
        let b = roomy(&l, 2);
        let s = sub(&b, &t, 2, Duration::from_secs(5), &c);
        let mut held = Vec::new();
        take(&s, &mut held, 1, Duration::from_secs(10));
        // Let the other claim worker go idle on the full key.
        std::thread::sleep(Duration::from_millis(700));
        let mut waits = Vec::new();
        for _ in 0..4 {
            let d = held.pop().unwrap();
            let acked = std::time::Instant::now();
            ack(&c, d);
            let next = s.next_delivery_timeout(Duration::from_secs(12));
            waits.push(acked.elapsed());
            match next {
                Ok(d) => held.push(d),
                Err(_) => break,
            }
            std::thread::sleep(Duration::from_millis(300));
        }
        for d in held {
            ack(&c, d);
        }
        s.shutdown(Duration::from_secs(10)).unwrap();
        eprintln!("{db:?} {form:?}: from each ack to the next claim: {waits:?}");
        assert!(c.most("a") <= 1);
        assert!(
            waits.iter().all(|w| *w < Duration::from_millis(1500)),
            "the next row came {waits:?} after the ack that made room, poll interval 5 s"
        );
    }

    per_db_form!(the_settling_broker_claims_at_once);
}

/// Review 1 probe: a claim that read the record before an operator lowered a max takes its
/// row under the old max (allowed by the README), and a broker that already found the key
/// "clean" under the new max then skips the count for good.
mod stale {
    #![allow(unused_imports)]
    use super::{common, review_util};
    use crate::per_db_form;

    use std::sync::mpsc;
    use std::time::Duration;

    use common::{unique, Db};
    use review_util::*;
    use sqlbroker::{Form, Table};

    /// Holds an exclusive lock on `table` in a session of its own until told to let go.
    fn lock_table(
        db: Db,
        url: &str,
        table: &str,
    ) -> (mpsc::Sender<()>, std::thread::JoinHandle<()>) {
        let (go, rx) = mpsc::channel::<()>();
        let (ready_tx, ready) = mpsc::channel::<()>();
        let (url, table) = (url.to_string(), table.to_string());
        let h = std::thread::spawn(move || match db {
            #[cfg(feature = "postgres")]
            Db::Postgres => {
                let mut c = postgres::Client::connect(&url, postgres::NoTls).unwrap();
                c.batch_execute(&format!(
                    "BEGIN; LOCK TABLE \"{table}\" IN ACCESS EXCLUSIVE MODE"
                ))
                .unwrap();
                ready_tx.send(()).unwrap();
                let _ = rx.recv();
                c.batch_execute("COMMIT").unwrap();
            }
            #[cfg(feature = "mysql")]
            Db::Mysql => {
                use mysql::prelude::Queryable;
                let mut c = mysql::Conn::new(mysql::Opts::from_url(&url).unwrap()).unwrap();
                c.query_drop(format!("LOCK TABLES `{table}` WRITE"))
                    .unwrap();
                ready_tx.send(()).unwrap();
                let _ = rx.recv();
                c.query_drop("UNLOCK TABLES").unwrap();
            }
            #[allow(unreachable_patterns)]
            _ => {
                // Named here too: a build with neither server's driver uses them nowhere else.
                let _ = (&rx, &ready_tx, &url, &table);
                unreachable!("a table lock on {db:?}")
            }
        });
        ready.recv().unwrap();
        (go, h)
    }

    /// README, "Lowered, lifted, set again": "Lowering a max stops new claims of that key until
    /// fewer rows than the new max are in work ... A claim that read the record before the change
    /// committed may still take its rows under the old max." Broker B's claim reads the record
    /// (max 4), then waits (its sweep of the rate slots, held up by a lock); the operator lowers
    /// the max to 2; broker A claims a row under max 2 (no slot above 2 is held yet: the key is
    /// noted clean); B's claim goes on and takes its row under max 4, at a slot above 2 (two
    /// chances in three). Now 2 rows are in work under max 2: a second subscription of broker A
    /// must claim nothing. Seen: it claims a third row, and would go on as long as B's row is in
    /// work, since A skips the count of slots above the max until the record changes.
    fn a_stale_claim_then_a_clean_key(db: Db, form: Form) {
        let mut violations = Vec::new();
        let mut runs = 0;
        for _ in 0..4 {
            let Some(l) = common::live(db) else { return };
            runs += 1;
            let t = Table::new(unique("rv_stale"))
                .text_column("k")
                .text_column("u")
                .concurrency_limit("{k}", 4)
                .rate_limit("{k}", 10_000, Duration::from_secs(1));
            let t = create(&l, t, form);
            let rates = format!("{}_rates", t.name());
            let c = Counter::default();
            for n in 0..12 {
                let id = l.broker.publish(&t, message("a", n)).unwrap();
                c.key(id, "a");
            }
            let operator = l.connect();
            // A: one row in work (its first claim sweeps the rate slots: its next ones do not).
            let a = roomy(&l, 4);
            let sub_a = sub(&a, &t, 1, Duration::from_millis(100), &c);
            let mut held_a = Vec::new();
            take(&sub_a, &mut held_a, 1, Duration::from_secs(10));
            // B's first claim reads the record, then waits on its sweep.
            let (release, locker) = lock_table(db, &l.url, &rates);
            let b = roomy(&l, 2);
            let c_b = c.clone();
            let t_b = t.clone();
            let b_thread = std::thread::spawn(move || {
                let s = sub(&b, &t_b, 1, Duration::from_millis(100), &c_b);
                let d = s.next_delivery_timeout(Duration::from_secs(20)).ok();
                (b, s, d)
            });
            std::thread::sleep(Duration::from_millis(800));
            operator.set_concurrency_limit(&t, "{k}", Some(2)).unwrap();
            // A's ack: its next claim reads max 2, finds no slot above it held, then waits on
            // the rate slots too.
            for d in held_a.drain(..) {
                ack(&c, d);
            }
            std::thread::sleep(Duration::from_millis(800));
            release.send(()).unwrap();
            locker.join().unwrap();
            let (b, sub_b, d_b) = b_thread.join().unwrap();
            take(&sub_a, &mut held_a, 1, Duration::from_secs(10));
            let in_work_before = c.now("a");
            // A second subscription of broker A: 2 in work under max 2 (if B's row is), so
            // nothing.
            let sub_a2 = sub(&a, &t, 2, Duration::from_millis(100), &c);
            let mut held_a2 = Vec::new();
            drain_for(&sub_a2, &mut held_a2, Duration::from_secs(2));
            let now = c.now("a");
            let limits = operator.concurrency_limits(&t).unwrap();
            eprintln!(
                "{db:?} {form:?}: B claimed {:?}; in work before A2: {in_work_before}; A2 claimed {}; in work {now}; operator sees {:?} under {:?}",
                d_b.as_ref().map(|d| d.id()),
                held_a2.len(),
                limits[0].in_work,
                limits[0].max
            );
            if now > 2 {
                violations.push(now);
            }
            for d in held_a.drain(..).chain(held_a2.drain(..)).chain(d_b) {
                ack(&c, d);
            }
            sub_a2.shutdown(Duration::from_secs(10)).unwrap();
            sub_a.shutdown(Duration::from_secs(10)).unwrap();
            sub_b.shutdown(Duration::from_secs(10)).unwrap();
            drop(b);
        }
        assert!(
            violations.is_empty(),
            "rows of key a in work under max 2, in {} of {runs} runs: {violations:?}",
            violations.len()
        );
    }

    mod cases {
        use super::*;
        #[test]
        fn postgres_advisory() {
            a_stale_claim_then_a_clean_key(Db::Postgres, Form::AdvisoryLock)
        }
        #[test]
        fn mysql_advisory() {
            a_stale_claim_then_a_clean_key(Db::Mysql, Form::AdvisoryLock)
        }
        #[test]
        fn mysql_row_lock() {
            a_stale_claim_then_a_clean_key(Db::Mysql, Form::RowLock)
        }
    }
}

/// Review 1 probes: fair claims with limits.
mod fair {
    #![allow(unused_imports)]
    use super::{common, review_util};
    use crate::per_db_form;

    use std::time::{Duration, Instant};

    use common::{unique, Db};
    use review_util::*;
    use sqlbroker::{Form, Message, Table};

    fn row(t: &str, a: &str, n: usize) -> Message {
        Message::new(format!("{t}{a}{n}").into_bytes())
            .set("t", t)
            .set("a", a)
            .set("u", format!("{t}-{a}-{n}"))
    }

    /// README, "Flow control": "A row over a limit waits: ... a claim passes it by for rows whose
    /// keys have room (reading up to 10,000 candidates a claim...)"; with fair claims "a key with
    /// room is claimed by that claim however many keys before it are at their limit (within
    /// 10,000 rows read...)". A fair key narrower than... wider than the limit: fair by tenant
    /// `{t}`, at most 1 at once per account `{a}`. Tenant T has 40 rows of account X, then 3 of
    /// account Y. With one X row in work, a Y row (its account has room) must be claimed.
    /// Seen: no Y row is claimed while X's rows are ahead of it in the tenant.
    fn a_narrower_limit_inside_a_fair_key(db: Db, form: Form) {
        narrower(db, form, true)
    }

    /// The same without fair claims (the control): Y's row is claimed.
    fn control_without_fair(db: Db, form: Form) {
        narrower(db, form, false)
    }

    fn narrower(db: Db, form: Form, fair: bool) {
        let Some(l) = common::live(db) else { return };
        let t = Table::new(unique("rv_fnarrow"))
            .text_column("t")
            .text_column("a")
            .text_column("u")
            .concurrency_limit("{a}", 1);
        let t = if fair { t.fair("{t}") } else { t };
        let t = create(&l, t, form);
        let c = Counter::default();
        for n in 0..40 {
            let id = l.broker.publish(&t, row("T", "X", n)).unwrap();
            c.key(id, "X");
        }
        for n in 0..3 {
            let id = l.broker.publish(&t, row("T", "Y", n)).unwrap();
            c.key(id, "Y");
        }
        let b = roomy(&l, 4);
        let s = sub(&b, &t, 4, Duration::from_millis(100), &c);
        let mut held = Vec::new();
        let start = Instant::now();
        drain_for(&s, &mut held, Duration::from_secs(4));
        let keys: Vec<String> = held
            .iter()
            .map(|d| {
                d.get("a")
                    .and_then(|v| v.as_str())
                    .unwrap_or("?")
                    .to_string()
            })
            .collect();
        eprintln!(
            "{db:?} {form:?} fair {fair}: claimed within {:?}: {keys:?}",
            start.elapsed()
        );
        // Read before the acks: rows claimed ahead and handed back at the shutdown are not
        // counted out.
        let most_x = c.most("X");
        for d in held {
            ack(&c, d);
        }
        s.shutdown(Duration::from_secs(10)).unwrap();
        assert_eq!(most_x, 1, "X over its limit");
        assert!(
            keys.iter().any(|k| k == "Y"),
            "no row of account Y (room) was claimed in 4 s while X (limit 1) had one in work: {keys:?}"
        );
    }

    per_db_form!(a_narrower_limit_inside_a_fair_key);
    per_db_form!(control_without_fair);

    /// The same with a rate limit narrower than the fair key: fair by tenant `{t}`, at most 1
    /// claim a minute per account `{a}`. Tenant T has 40 rows of account X, then 3 of account Y:
    /// once X's window is full, a Y row (its window empty) must be claimed. README, "Rate
    /// limits": "A claim that finds a key's window full passes its rows by for other keys".
    fn a_narrower_rate_inside_a_fair_key(db: Db, form: Form) {
        let Some(l) = common::live(db) else { return };
        let t = Table::new(unique("rv_frate"))
            .text_column("t")
            .text_column("a")
            .text_column("u")
            .fair("{t}")
            .rate_limit("{a}", 1, Duration::from_secs(60));
        let t = create(&l, t, form);
        let c = Counter::default();
        for n in 0..40 {
            let id = l.broker.publish(&t, row("T", "X", n)).unwrap();
            c.key(id, "X");
        }
        for n in 0..3 {
            let id = l.broker.publish(&t, row("T", "Y", n)).unwrap();
            c.key(id, "Y");
        }
        let b = roomy(&l, 4);
        let s = sub(&b, &t, 4, Duration::from_millis(100), &c);
        let mut held = Vec::new();
        drain_for(&s, &mut held, Duration::from_secs(4));
        let keys: Vec<String> = held
            .iter()
            .map(|d| {
                d.get("a")
                    .and_then(|v| v.as_str())
                    .unwrap_or("?")
                    .to_string()
            })
            .collect();
        eprintln!("{db:?} {form:?} rate: claimed {keys:?}");
        for d in held {
            ack(&c, d);
        }
        s.shutdown(Duration::from_secs(10)).unwrap();
        assert!(
            keys.iter().any(|k| k == "Y"),
            "no row of account Y (empty window) was claimed in 4 s while X's window was full: {keys:?}"
        );
    }

    per_db_form!(a_narrower_rate_inside_a_fair_key);
}

/// Review 1 probe: a limit added by `migrate` while a subscription of the description without
/// it runs.
mod migrate {
    #![allow(unused_imports)]
    use super::{common, review_util};
    use crate::per_db_form;

    use std::time::Duration;

    use common::{unique, Db};
    use review_util::*;
    use sqlbroker::{Form, Table};

    /// README, "Concurrency limits": "at most `max` rows whose rendered `key` is equal are in work
    /// at once, across every broker and process sharing the table"; "Operating a queue": "A
    /// description in code that disagrees with the record ... is refused by `publish`, `start()`
    /// and the tool with `BrokerError::Schema` ..., so two descriptions of one table can never run
    /// one row twice." A service runs the table without limits; an operator's `migrate` adds
    /// `concurrency_limit("{k}", 1)` (a rolling deploy of the next version). The running
    /// subscription goes on claiming as before: 4 rows of key a in work under max 1, its
    /// publishes under the old description accepted.
    fn a_limit_added_while_the_old_description_runs(db: Db, form: Form) {
        let Some(l) = common::live(db) else { return };
        let name = unique("rv_mig");
        let old = create(
            &l,
            Table::new(&name).text_column("k").text_column("u"),
            form,
        );
        let c = Counter::default();
        for n in 0..3 {
            let id = l.broker.publish(&old, message("a", n)).unwrap();
            c.key(id, "a");
        }
        let v1 = roomy(&l, 4);
        let sub_v1 = sub(&v1, &old, 4, Duration::from_millis(100), &c);
        let mut held = Vec::new();
        take(&sub_v1, &mut held, 3, Duration::from_secs(10));
        for d in held.drain(..) {
            ack(&c, d);
        }
        let new = in_form(
            Table::new(&name)
                .text_column("k")
                .text_column("u")
                .concurrency_limit("{k}", 1),
            form,
        );
        let operator = l.connect();
        operator.migrate(&new).unwrap();
        // The old subscription reads the record with its pause flag, once per poll interval
        // (here 100 ms): it finds the limit it does not enforce and closes.
        let closed = common::wait_for(Duration::from_secs(5), || sub_v1.is_closed());
        assert!(
            closed,
            "the old subscription runs on past a limit migrate added"
        );
        assert!(
            matches!(
                sub_v1.closed_by().as_deref(),
                Some(sqlbroker::BrokerError::Schema { problems, .. })
                    if problems.iter().any(|p| p.contains("concurrency limit \"{k}\""))
            ),
            "closed by {:?}",
            sub_v1.closed_by()
        );
        // The old service's publishes are still taken (its rows carry the limit's column), and
        // the new description's subscription runs them under the limit.
        for n in 10..16 {
            let id = v1.publish(&old, message("a", n)).unwrap();
            c.key(id, "a");
        }
        c.reset_most();
        let v2 = roomy(&l, 4);
        let sub_v2 = sub(&v2, &new, 4, Duration::from_millis(100), &c);
        drain_for(&sub_v2, &mut held, Duration::from_secs(2));
        drain_for(&sub_v1, &mut held, Duration::from_millis(200));
        let most = c.most("a");
        for d in held.drain(..) {
            ack(&c, d);
        }
        sub_v2.shutdown(Duration::from_secs(10)).unwrap();
        assert!(
            most <= 1,
            "{most} rows of key a in work at once, limit 1 (added by migrate)"
        );
    }

    per_db_form!(a_limit_added_while_the_old_description_runs);
}

/// Review 1 probes: advisory and slot key names with odd characters (MariaDB `GET_LOCK`).
mod keys {
    #![allow(unused_imports)]
    use super::{common, review_util};
    use crate::per_db_form;

    use std::time::{Duration, Instant};

    use common::{unique, Db};
    use sqlbroker::{Message, Table};

    /// MariaDB's `GET_LOCK` refuses a name of 64 characters or fewer whose UTF-8 is longer than
    /// 192 bytes ("Identifier name ... is too long"): the library hashes by characters only.
    /// A row whose advisory key is 50 emoji (4 bytes each) is published among ordinary rows.
    /// README: "`GET_LOCK(name, 0)`; names over 64 chars hashed (SHA-256)"; every row runs.
    #[test]
    fn mysql_advisory_key_of_four_byte_characters() {
        let Some(l) = common::live(Db::Mysql) else {
            return;
        };
        let name = unique("rv_emoji");
        let t = l.create(
            Table::new(&name)
                .text_column("k")
                .advisory_lock("{k}")
                .max_attempts(5),
        );
        // Ordinary rows first (claimed ahead of the odd one in the same claim), then the odd one,
        // then more ordinary rows.
        let odd: String = "\u{1F600}".repeat(50);
        let mut ids = Vec::new();
        for n in 0..3 {
            ids.push(
                l.broker
                    .publish(
                        &t,
                        Message::new(b"x".to_vec()).set("k", format!("{name}-a{n}")),
                    )
                    .unwrap(),
            );
        }
        let odd_id = l
            .broker
            .publish(&t, Message::new(b"odd".to_vec()).set("k", odd.clone()))
            .unwrap();
        for n in 0..3 {
            ids.push(
                l.broker
                    .publish(
                        &t,
                        Message::new(b"x".to_vec()).set("k", format!("{name}-b{n}")),
                    )
                    .unwrap(),
            );
        }
        let sub = l
            .broker
            .subscription(&t)
            .workers(1)
            .batch_size(8)
            .max_in_flight(8)
            .poll_interval(Duration::from_millis(100))
            .start()
            .unwrap();
        let mut ran = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(8);
        while Instant::now() < deadline && ran.len() < 7 {
            if let Ok(d) = sub.next_delivery_timeout(Duration::from_millis(200)) {
                ran.push(d.id());
                d.ack().unwrap();
            }
        }
        let _ = sub.shutdown(Duration::from_secs(5));
        let attempts: Vec<(i64, Option<u32>)> = ids
            .iter()
            .map(|id| (*id, l.broker.job(&t, *id).unwrap().map(|j| j.attempts())))
            .collect();
        let odd_job = l.broker.job(&t, odd_id);
        eprintln!("ran {ran:?}; left: {attempts:?}; odd: {odd_job:?}");
        assert!(
            ran.contains(&odd_id),
            "the row with the emoji key never ran"
        );
        assert_eq!(ran.len(), 7, "rows run: {ran:?} of 7");
    }
}

/// Review 1 probes: operators' views (action log, counts, CLI).
mod ops {
    #![allow(unused_imports)]
    use super::{common, review_util};
    use crate::per_db_form;

    use common::{unique, Db};

    /// README, "Dashboard": "The page shows each database's newest 100 entries (with `--table`,
    /// the newest 100 on those tables, `Broker::actions_on`...)". On MariaDB two tables whose
    /// names differ only in case are two tables (Linux, `lower_case_table_names=0`); the log's
    /// `IN (..)` compares in a case-insensitive collation, and the entries of the other table
    /// are dropped after the `LIMIT`: the newest entries of the other table crowd out those of the
    /// table asked for. Expected: `actions_on(["<name>"], 2)` returns the one entry of `<name>`.
    #[test]
    fn mysql_actions_on_a_table_whose_name_differs_in_case() {
        let Some(l) = common::live(Db::Mysql) else {
            return;
        };
        let lower = unique("rv_case");
        let upper = lower.replace("rv_case", "RV1_CASE");
        l.broker
            .record_action("rv1 probe", "pause", &lower, "", 0)
            .unwrap();
        for _ in 0..3 {
            l.broker
                .record_action("rv1 probe", "pause", &upper, "", 0)
                .unwrap();
        }
        let got = l.broker.actions_on(&[lower.as_str()], 2).unwrap();
        let all = l.broker.actions_on(&[lower.as_str()], 100).unwrap();
        l.exec(&format!(
            "DELETE FROM sqlbroker_actions WHERE who = 'rv1 probe' AND table_name IN ('{lower}', '{upper}')"
        ));
        eprintln!(
            "limit 2: {} entries; limit 100: {} entries",
            got.len(),
            all.len()
        );
        assert_eq!(
            got.len(),
            1,
            "the newest 2 entries on {lower}: {} (its one entry crowded out by {upper}'s)",
            got.len()
        );
    }
}

/// Review 1 probe: concurrency limit, rate limit and fair claims together, two brokers, an
/// operator changing the concurrency max while rows are in work.
mod mixed {
    #![allow(unused_imports)]
    use super::{common, review_util};
    use crate::per_db_form;

    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    use common::{unique, Db};
    use review_util::*;
    use sqlbroker::{Form, Table};

    /// README, "Flow control": every limit holds across brokers, a change is followed from the
    /// first claim that reads the record after it committed, and "Lowering a max stops new claims
    /// of that key until fewer rows than the new max are in work". Checked: no claim committed more
    /// than 1 s after a change leaves more rows of its key in work than the max in force; no
    /// window of the rate limit (3 per 2 s per key) holds more than 3 claims.
    fn all_three_with_an_operator(db: Db, form: Form) {
        let Some(l) = common::live(db) else { return };
        let t = Table::new(unique("rv_mix"))
            .text_column("k")
            .text_column("u")
            .fair("{k}")
            .concurrency_limit("{k}", 2)
            .rate_limit("{k}", 3, Duration::from_secs(2));
        let t = create(&l, t, form);
        let c = Counter::default();
        let keys = ["a", "b", "c"];
        for n in 0..14 {
            for k in keys {
                let id = l.broker.publish(&t, message(k, n)).unwrap();
                c.key(id, k);
            }
        }
        let total = 14 * keys.len();
        // (when the change committed, the max from then on)
        type Changes = Arc<Mutex<Vec<(Instant, Option<u32>)>>>;
        let changes: Changes = Arc::new(Mutex::new(vec![(Instant::now(), Some(2))]));
        // (claim time, key, in work after the claim)
        let claims: Arc<Mutex<Vec<(Instant, String, i32)>>> = Arc::default();
        let done = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        struct Log(Counter, Arc<Mutex<Vec<(Instant, String, i32)>>>);
        impl sqlbroker::Events for Log {
            fn claimed(&self, e: &sqlbroker::ClaimedRows<'_>) {
                sqlbroker::Events::claimed(&self.0, e);
                let at = Instant::now();
                let c = self.0 .0.lock().unwrap();
                let mut log = self.1.lock().unwrap();
                for id in e.ids {
                    let k = c.keys.get(id).cloned().unwrap_or_default();
                    let n = c.now.get(&k).copied().unwrap_or(0);
                    log.push((at, k, n));
                }
            }
        }
        std::thread::scope(|s| {
            for _ in 0..2 {
                let broker = roomy(&l, 4);
                let (t, c, claims, done, stop) =
                    (&t, c.clone(), claims.clone(), done.clone(), stop.clone());
                s.spawn(move || {
                    let sub = broker
                        .subscription(t)
                        .workers(2)
                        .max_in_flight(4)
                        .poll_interval(Duration::from_millis(100))
                        .events(Arc::new(Log(c.clone(), claims)))
                        .start()
                        .unwrap();
                    std::thread::scope(|s| {
                        for i in 0..4u64 {
                            let (sub, c, done, stop) =
                                (&sub, c.clone(), done.clone(), stop.clone());
                            s.spawn(move || {
                                while !stop.load(Ordering::Relaxed) {
                                    let Ok(d) =
                                        sub.next_delivery_timeout(Duration::from_millis(100))
                                    else {
                                        continue;
                                    };
                                    std::thread::sleep(Duration::from_millis(60 + 40 * i));
                                    ack(&c, d);
                                    done.fetch_add(1, Ordering::Relaxed);
                                }
                            });
                        }
                    });
                    sub.shutdown(Duration::from_secs(10)).unwrap();
                });
            }
            let operator = l.connect();
            let (t, changes, done, stop) = (&t, changes.clone(), done.clone(), stop.clone());
            s.spawn(move || {
                let deadline = Instant::now() + Duration::from_secs(60);
                for max in [Some(3), Some(1), None, Some(2), Some(4), Some(1)]
                    .iter()
                    .cycle()
                {
                    std::thread::sleep(Duration::from_millis(1500));
                    if done.load(Ordering::Relaxed) >= total || Instant::now() > deadline {
                        break;
                    }
                    operator.set_concurrency_limit(t, "{k}", *max).unwrap();
                    changes.lock().unwrap().push((Instant::now(), *max));
                }
                stop.store(true, Ordering::Relaxed);
            });
        });
        let changes = changes.lock().unwrap();
        let claims = claims.lock().unwrap();
        let mut bad = Vec::new();
        for (at, k, n) in claims.iter() {
            let (since, max) = changes
                .iter()
                .rev()
                .find(|(c, _)| c <= at)
                .copied()
                .unwrap();
            if *at < since + Duration::from_secs(1) {
                continue;
            }
            if let Some(m) = max {
                if *n > m as i32 {
                    bad.push(format!("{k}: {n} in work under {m}"));
                }
            }
        }
        let mut rate_bad = Vec::new();
        for k in keys {
            let at: Vec<Instant> = claims
                .iter()
                .filter(|(_, c, _)| c == k)
                .map(|(t, _, _)| *t)
                .collect();
            for (i, first) in at.iter().enumerate() {
                let within = at[i..]
                    .iter()
                    .take_while(|t| **t - *first < Duration::from_millis(1300))
                    .count();
                if within > 3 {
                    rate_bad.push(format!("{k}: {within} claims within 1.3 s"));
                }
            }
        }
        eprintln!(
            "{db:?} {form:?}: {} claims, {} acked, {} changes; over the max: {bad:?}; rate: {rate_bad:?}",
            claims.len(),
            done.load(Ordering::Relaxed),
            changes.len()
        );
        assert!(bad.is_empty(), "claims over the max in force: {bad:?}");
        assert!(rate_bad.is_empty(), "rate windows exceeded: {rate_bad:?}");
    }

    per_db_form!(all_three_with_an_operator);
}
