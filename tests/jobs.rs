//! Error history and job lookup: a failure keeps its text (bounded) and count on the row, shown
//! by `Broker::job`, `Broker::jobs` and the dead letters; a job's state as each form can tell
//! it; the publish time, the server's; and a table made before these columns existed is
//! migrated and then keeps errors.

mod common;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::{live, msg, next, Db};
use sqlbroker::{BrokerError, Form, JobState, RetryPolicy, LAST_ERROR_MAX};

const WAIT: Duration = Duration::from_secs(10);

fn quick_retries() -> RetryPolicy {
    RetryPolicy::exponential(Duration::from_millis(1), Duration::from_millis(1))
}

/// `fail` keeps its text and counts it; a plain `retry` keeps both; a long error is cut to
/// `LAST_ERROR_MAX` characters on a character boundary; a dropped delivery leaves its own
/// text; a dead letter keeps its reason and the last error.
fn failures_keep_their_last_error(db: Db, form: Form) {
    let Some(l) = live(db) else { return };
    let t = l.table(form, Duration::from_secs(30));
    let b = &l.broker;
    let id = b.publish(&t, msg("poison", "a")).unwrap();
    let fresh = b.job(&t, id).unwrap().expect("published");
    assert_eq!((fresh.errors(), fresh.last_error()), (0, None));
    let sub = b
        .subscription(&t)
        .batch_size(1)
        .max_in_flight(1)
        .retry_policy(quick_retries())
        .start()
        .unwrap();

    next(&sub, WAIT).fail("smtp: 421 try later").unwrap();
    let j = b.job(&t, id).unwrap().unwrap();
    // Fails if the retry statement does not write the error (or count it).
    assert_eq!(
        (j.errors(), j.last_error()),
        (1, Some("smtp: 421 try later"))
    );

    next(&sub, WAIT).retry().unwrap();
    let j = b.job(&t, id).unwrap().unwrap();
    // Fails if a plain retry clears or counts the last error.
    assert_eq!(
        (j.errors(), j.last_error()),
        (1, Some("smtp: 421 try later"))
    );

    let long = "é".repeat(LAST_ERROR_MAX + 7);
    next(&sub, WAIT).fail(&long).unwrap();
    let j = b.job(&t, id).unwrap().unwrap();
    let kept = j.last_error().unwrap();
    // Fails if the error is not bounded (or is cut inside a character).
    assert_eq!(kept.chars().count(), LAST_ERROR_MAX);
    assert!(long.starts_with(kept));
    assert_eq!(j.errors(), 2);

    drop(next(&sub, WAIT));
    let j = b.job(&t, id).unwrap().unwrap();
    assert_eq!(j.errors(), 3);
    assert!(
        j.last_error().unwrap().contains("dropped unsettled"),
        "{:?}",
        j.last_error()
    );

    // The drop's delay is a second; the dead letter keeps the last error beside its reason.
    next(&sub, WAIT).dead_letter("gave up").unwrap();
    let dead = b.dead_letters(&t, 10).unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].reason, "gave up");
    assert!(dead[0].last_error().unwrap().contains("dropped unsettled"));
    assert_eq!(dead[0].errors, 3);
    let j = b.job(&t, id).unwrap().unwrap();
    assert_eq!(j.state(), JobState::Dead);
    assert_eq!(j.dead_reason(), Some("gave up"));
    sub.shutdown(Duration::from_secs(5)).unwrap();
}
per_db_form!(failures_keep_their_last_error);

/// A job's state as the form tells it: scheduled, ready, in flight (lease: leased; row lock:
/// its row locked by the delivery; advisory: its key held), dead; unknown ids are `None`; pages
/// by state page by id.
fn job_states_and_pages(db: Db, form: Form) {
    let Some(l) = live(db) else { return };
    let t = l.table(form, Duration::from_secs(30));
    let b = &l.broker;
    let busy = b.publish(&t, msg("busy", "a")).unwrap();
    let sub = b
        .subscription(&t)
        .batch_size(1)
        .max_in_flight(1)
        .start()
        .unwrap();
    let d = next(&sub, WAIT);
    assert_eq!(d.id(), busy);
    let ready = b.publish(&t, msg("ready", "b")).unwrap();
    let later = b
        .publish(
            &t,
            msg("later", "c").deliver_after(Duration::from_secs(3600)),
        )
        .unwrap();
    // Looked up from another broker, as an operator's tool in another process would: the
    // server's locks (and SQLite's process keys) are what it sees.
    let other = l.connect();
    let state = |id| other.job(&t, id).unwrap().map(|j| j.state());
    // Fails if the form's probe does not see the row in work.
    assert_eq!(state(busy), Some(JobState::InFlight));
    // Fails if the probe takes a free row (or key) for one in work.
    assert_eq!(state(ready), Some(JobState::Ready));
    assert_eq!(state(later), Some(JobState::Scheduled));
    assert_eq!(state(later + 1000), None);
    let job = b.job(&t, ready).unwrap().unwrap();
    assert_eq!(job.payload(), b"ready");
    assert_eq!(job.get("k").and_then(|v| v.as_str()), Some("b"));

    let page = |s| -> Vec<(i64, JobState)> {
        other
            .jobs(&t, s, None, 10)
            .unwrap()
            .iter()
            .map(|j| (j.id(), j.state()))
            .collect()
    };
    assert_eq!(page(JobState::Scheduled), [(later, JobState::Scheduled)]);
    let due = [(busy, JobState::InFlight), (ready, JobState::Ready)];
    if form == Form::Lease {
        assert_eq!(page(JobState::InFlight), [due[0]]);
        assert_eq!(page(JobState::Ready), [due[1]]);
    } else {
        // Row lock and advisory: both pages read the due rows, each with its probed state.
        assert_eq!(page(JobState::InFlight), due);
        assert_eq!(page(JobState::Ready), due);
    }
    assert!(page(JobState::Completed).is_empty());
    // Keyset paging: after the first due row, the second.
    let rest = b.jobs(&t, JobState::Ready, Some(busy), 10).unwrap();
    assert_eq!(rest.iter().map(|j| j.id()).collect::<Vec<_>>(), [ready]);

    d.dead_letter("no").unwrap();
    assert_eq!(state(busy), Some(JobState::Dead));
    assert_eq!(page(JobState::Dead), [(busy, JobState::Dead)]);
    sub.shutdown(Duration::from_secs(5)).unwrap();
}
per_db_form!(job_states_and_pages);

/// A listing's preview: each payload cut by the database to its first bytes, its full length
/// beside it, the other columns as `jobs` reads them; and no probe: in the row lock and
/// advisory forms a due row in work is listed `Ready` ("due"), while `jobs` probes it
/// `InFlight` (lease: its lease tells, as in `jobs`).
fn job_previews_read_a_prefix_and_probe_nothing(db: Db, form: Form) {
    let Some(l) = live(db) else { return };
    let t = l.table(form, Duration::from_secs(30));
    let b = &l.broker;
    let big: Vec<u8> = (0..300_000u32).map(|i| b'a' + (i % 26) as u8).collect();
    let busy = b
        .publish(&t, sqlbroker::Message::new(big.clone()).set("k", "a"))
        .unwrap();
    let sub = b
        .subscription(&t)
        .batch_size(1)
        .max_in_flight(1)
        .start()
        .unwrap();
    let d = next(&sub, WAIT);
    assert_eq!(d.id(), busy);
    let small = b.publish(&t, msg("héllo", "b")).unwrap();
    let other = l.connect();
    let state = if form == Form::Lease {
        JobState::InFlight
    } else {
        JobState::Ready
    };
    let page = other.jobs_preview(&t, state, None, 10, 60).unwrap();
    let got = page.iter().find(|j| j.id() == busy).expect("the busy row");
    // Fails if the whole payload is read (or the length is the prefix's).
    assert_eq!(got.payload(), &big[..60]);
    assert_eq!(got.payload_len(), big.len() as u64);
    assert_eq!(got.get("k").and_then(|v| v.as_str()), Some("a"));
    if form == Form::Lease {
        assert_eq!(got.state(), JobState::InFlight);
    } else {
        // Fails if the listing probes: the probe sees the row (or its key) held.
        assert_eq!(got.state(), JobState::Ready);
        assert_eq!(
            other.jobs(&t, JobState::Ready, None, 10).unwrap()[0].state(),
            JobState::InFlight,
            "the probe of `jobs` sees the delivery"
        );
    }
    // A prefix longer than the payload is the payload; in bytes, not characters.
    let ready = other
        .jobs_preview(&t, JobState::Ready, Some(busy), 10, 2)
        .unwrap();
    assert_eq!(ready.len(), 1);
    assert_eq!(ready[0].id(), small);
    assert_eq!(ready[0].payload(), &"héllo".as_bytes()[..2]);
    assert_eq!(ready[0].payload_len(), "héllo".len() as u64);
    let whole = other
        .jobs_preview(&t, JobState::Ready, Some(busy), 10, 1000)
        .unwrap();
    assert_eq!(whole[0].payload(), "héllo".as_bytes());
    // The single job's page reads it whole.
    let one = other.job(&t, busy).unwrap().unwrap();
    assert_eq!(
        (one.payload().len() as u64, one.payload_len()),
        (big.len() as u64, big.len() as u64)
    );
    d.ack().unwrap();
    sub.shutdown(Duration::from_secs(5)).unwrap();
}
per_db_form!(job_previews_read_a_prefix_and_probe_nothing);

/// The publish time: the server's clock at the insert, by the column's default, whole seconds.
/// A delayed job is due after it was published.
fn jobs_know_when_they_were_published(db: Db, form: Form) {
    let Some(l) = live(db) else { return };
    let t = l.table(form, Duration::from_secs(30));
    let b = &l.broker;
    let secs = |t: SystemTime| t.duration_since(UNIX_EPOCH).unwrap().as_secs();
    let before = secs(SystemTime::now());
    let now = b.publish(&t, msg("now", "a")).unwrap();
    let later = b
        .publish(
            &t,
            msg("later", "b").deliver_after(Duration::from_secs(3600)),
        )
        .unwrap();
    let after = secs(SystemTime::now());
    for id in [now, later] {
        let j = b.job(&t, id).unwrap().unwrap();
        // Fails if the column has no default (`created_at` stays NULL): "published at the
        // server's clock".
        let p = j.published_at().expect("published at the server's clock");
        // The servers share this host's clock; a few seconds allow for rounding.
        let p = secs(p);
        assert!(
            p + 5 >= before && p <= after + 5,
            "published at {p}, between {before} and {after} on this host"
        );
    }
    let j = b.job(&t, later).unwrap().unwrap();
    assert!(
        j.due_at() > j.published_at().unwrap() + Duration::from_secs(3000),
        "{j:?}"
    );
}
per_db_form!(jobs_know_when_they_were_published);

/// A table made by the previous release (the same table without `last_error`, `errors`,
/// `created_at` and, outside the row lock form, `cancel_requested`) is refused with the missing
/// columns named, migrated with its rows, and then keeps errors. A row published before the
/// migration has no publish time; one published after has the server's, except on SQLite,
/// whose `ADD COLUMN` cannot carry the default.
fn migrate_adds_the_error_history(db: Db, form: Form) {
    let Some(l) = live(db) else { return };
    let t = l.table(form, Duration::from_secs(30));
    let mut gone = vec!["last_error", "errors"];
    if form != Form::RowLock {
        gone.push("cancel_requested");
    }
    gone.push("created_at");
    for c in &gone {
        l.exec(&format!("ALTER TABLE {} DROP COLUMN {c}", t.name()));
    }
    // The broker of the test compiled the table before: a new one, as a new process would.
    let b = l.connect();
    let want: Vec<String> = gone
        .iter()
        .map(|c| format!("column {c} is missing"))
        .collect();
    // Fails if a table without the columns is accepted, by a publish or a subscription.
    for refused in [
        b.publish(&t, msg("new", "a")).map(drop),
        b.subscription(&t).start().map(drop),
    ] {
        match refused {
            Err(BrokerError::Schema { problems, .. }) => assert_eq!(problems, want),
            other => panic!("the old table was accepted: {other:?}"),
        }
    }
    // A row the previous release published (by hand: this release refuses the old table).
    let (payload, now) = match db {
        Db::Postgres => ("'\\x00'::bytea", "now()"),
        Db::Mysql => ("x'00'", "UTC_TIMESTAMP()"),
        Db::Sqlite => ("x'00'", "0"),
    };
    l.exec(&format!(
        "INSERT INTO {} (payload, run_at, k) VALUES ({payload}, {now}, 'a')",
        t.name()
    ));
    let id = l.int(&format!("SELECT MAX(id) FROM {}", t.name()));
    assert!(matches!(b.job(&t, id), Err(BrokerError::Schema { .. })));
    let done = b.migrate(&t).unwrap();
    let want: Vec<String> = gone.iter().map(|c| format!("added column {c}")).collect();
    assert_eq!(done, want);
    let sub = b
        .subscription(&t)
        .retry_policy(quick_retries())
        .start()
        .unwrap();
    let d = next(&sub, WAIT);
    assert_eq!(d.id(), id);
    d.fail("after migrate").unwrap();
    let j = b.job(&t, id).unwrap().unwrap();
    assert_eq!((j.errors(), j.last_error()), (1, Some("after migrate")));
    // Fails if the migration dates the rows already there (with its own time).
    assert_eq!(j.published_at(), None);
    let new = b.publish(&t, msg("new", "b")).unwrap();
    let j = b.job(&t, new).unwrap().unwrap();
    // Fails if the migrated column has no default on PostgreSQL or MySQL.
    assert_eq!(j.published_at().is_some(), db != Db::Sqlite, "{j:?}");
    sub.shutdown(Duration::from_secs(5)).unwrap();
}
per_db_form!(migrate_adds_the_error_history);

/// An unknown table is a schema error, not a driver error about a missing relation.
fn an_unknown_table_is_a_clear_error(db: Db) {
    let Some(l) = live(db) else { return };
    let t = common::describe(
        &common::unique("nope"),
        Form::Lease,
        Duration::from_secs(30),
    );
    for r in [
        l.broker.job(&t, 1).map(drop),
        l.broker.cancel(&t, 1).map(drop),
        l.broker.jobs(&t, JobState::Ready, None, 1).map(drop),
    ] {
        match r {
            Err(BrokerError::Schema { problems, .. }) => {
                assert!(problems[0].contains("does not exist"), "{problems:?}")
            }
            other => panic!("expected a schema error, got {other:?}"),
        }
    }
}
per_db!(an_unknown_table_is_a_clear_error);
