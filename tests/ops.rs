//! The operator's view: `Broker::stats` counts rows by state, and the dead-letter maintenance
//! (paging, requeue and purge, by id and all, in batches) touches exactly the dead rows.

mod common;

use std::time::Duration;

use common::{live, msg, next, Db, Live};
use sqlbroker::{Form, QueueStats, Table};

const HOUR: Duration = Duration::from_secs(3600);

/// `run_at` of every row of `t` moved `secs` seconds into the past, directly.
fn age_rows(l: &Live, t: &Table, secs: i64) {
    let set = match l.db {
        Db::Postgres => format!("run_at = run_at - interval '{secs} seconds'"),
        Db::Mysql => format!("run_at = run_at - INTERVAL {secs} SECOND"),
        Db::Sqlite => format!("run_at = run_at - {secs}"),
    };
    l.exec(&format!(
        "UPDATE {} SET {set} WHERE dead_at IS NULL",
        t.name()
    ));
}

/// Dead-letters the rows of `t` whose `k` is `k`, directly (as a handler's `dead_letter`
/// would leave them).
fn kill_rows(l: &Live, t: &Table, k: &str) {
    let now = match l.db {
        Db::Postgres => "date_trunc('second', now())",
        Db::Mysql => "UTC_TIMESTAMP()",
        Db::Sqlite => "CAST(strftime('%s', 'now') AS INTEGER)",
    };
    l.exec(&format!(
        "UPDATE {} SET dead_at = {now}, dead_reason = 'test' WHERE k = '{k}'",
        t.name()
    ));
}

fn counts(s: &QueueStats) -> (u64, u64, Option<u64>, u64) {
    (s.ready, s.scheduled, s.in_flight, s.dead)
}

/// Rows in each state are counted in their state: a dead-lettered row is dead (not ready), a
/// delayed or retried-later row is scheduled, and a claimed row is in flight where the form
/// marks it (lease), else counted as ready (`in_flight` is `None`).
fn stats_count_each_state(db: Db, form: Form) {
    let Some(l) = live(db) else { return };
    let t = l.table(form, Duration::from_secs(60));
    let b = &l.broker;
    let empty = b.stats(&t).unwrap();
    let no_lease = (form == Form::Lease).then_some(0);
    assert_eq!(counts(&empty), (0, 0, no_lease, 0));
    assert_eq!(empty.oldest_ready_age, None);
    assert_eq!(empty.form, form);

    // One dead row, through a real dead letter.
    b.publish(&t, msg("dead", "d")).unwrap();
    let sub = b.subscription(&t).start().unwrap();
    next(&sub, Duration::from_secs(10))
        .dead_letter("poison")
        .unwrap();
    sub.shutdown(Duration::from_secs(5)).unwrap();

    // Three ready (distinct keys, so the advisory form may hold them at once), two delayed.
    for k in ["a", "b", "c"] {
        b.publish(&t, msg("ready", k)).unwrap();
    }
    for k in ["x", "y"] {
        b.publish(&t, msg("later", k).deliver_after(HOUR)).unwrap();
    }
    let s = b.stats(&t).unwrap();
    assert_eq!(counts(&s), (3, 2, no_lease, 1), "{s:?}");
    let age = s.oldest_ready_age.expect("rows are ready");
    assert!(age < Duration::from_secs(60), "{age:?}");

    // Two claimed and held.
    let sub = b.subscription(&t).max_in_flight(2).start().unwrap();
    let d1 = next(&sub, Duration::from_secs(10));
    let d2 = next(&sub, Duration::from_secs(10));
    let s = b.stats(&t).unwrap();
    match form {
        Form::Lease => assert_eq!(counts(&s), (1, 2, Some(2), 1), "{s:?}"),
        _ => assert_eq!(counts(&s), (3, 2, None, 1), "{s:?}"),
    }
    assert_eq!(s.total(), 6);

    // One retried an hour later (scheduled, no longer held), one acked (gone).
    d1.retry_after(HOUR).unwrap();
    d2.ack().unwrap();
    sub.shutdown(Duration::from_secs(5)).unwrap();
    let s = b.stats(&t).unwrap();
    assert_eq!(counts(&s), (1, 3, no_lease, 1), "{s:?}");

    // The age is the oldest ready row's: an hour old now.
    age_rows(&l, &t, 3600);
    let s = b.stats(&t).unwrap();
    let age = s.oldest_ready_age.expect("a row is ready");
    assert!(
        (Duration::from_secs(3600)..Duration::from_secs(3660)).contains(&age),
        "{age:?}"
    );
}
per_db_form!(stats_count_each_state);

/// Paging lists every dead row once, in id order; requeue and purge by id touch only a dead
/// row; requeue and purge of all work through more rows than one batch and touch only the dead
/// rows.
fn dead_letter_maintenance(db: Db) {
    let Some(l) = live(db) else { return };
    let t = l.table(Form::Lease, Duration::from_secs(60));
    let b = &l.broker;
    // 2,101 dead rows (three batches of 1,000) among 6 live ones.
    let total = 2_107;
    let is_live = |i: usize| i % 400 == 7;
    let messages: Vec<_> = (0..total)
        .map(|i| msg(&format!("m{i}"), if is_live(i) { "live" } else { "dead" }))
        .collect();
    b.publish_batch(&t, messages).unwrap();
    kill_rows(&l, &t, "dead");
    let n_live = (0..total).filter(|i| is_live(*i)).count() as u64;
    let n_dead = total as u64 - n_live;
    assert_eq!((n_live, n_dead), (6, 2_101));
    let s = b.stats(&t).unwrap();
    assert_eq!(counts(&s), (n_live, 0, Some(0), n_dead));

    // Pages of 1,000: every dead row once, by id, and no live row.
    let dead_ids: Vec<i64> = l
        .ints(&format!(
            "SELECT id FROM {} WHERE dead_at IS NOT NULL ORDER BY id",
            t.name()
        ))
        .into_iter()
        .map(Option::unwrap)
        .collect();
    let (mut seen, mut after, mut pages) = (Vec::new(), None, 0);
    loop {
        let page = b.dead_letters_after(&t, after, 1_000).unwrap();
        pages += 1;
        assert!(page.iter().all(|d| d.reason == "test"));
        assert!(page
            .iter()
            .all(|d| d.get("k").and_then(|v| v.as_str()) == Some("dead")));
        seen.extend(page.iter().map(|d| d.id));
        match page.last() {
            Some(last) if page.len() == 1_000 => after = Some(last.id),
            _ => break,
        }
    }
    assert_eq!(seen, dead_ids);
    assert_eq!(pages, 3);

    // By id: only a dead row.
    let live_id = l.int(&format!(
        "SELECT MIN(id) FROM {} WHERE k = 'live'",
        t.name()
    ));
    assert!(
        !b.purge_dead(&t, live_id).unwrap(),
        "a live row is not purged"
    );
    assert!(!b.requeue_dead(&t, live_id).unwrap());
    assert_eq!(l.rows_where(&t, &format!("id = {live_id}")), 1);
    assert!(b.purge_dead(&t, dead_ids[0]).unwrap());
    assert!(!b.purge_dead(&t, dead_ids[0]).unwrap(), "already gone");
    assert_eq!(l.rows_where(&t, &format!("id = {}", dead_ids[0])), 0);

    // All, requeued: every dead row live again with a fresh attempt count.
    assert_eq!(b.requeue_all_dead(&t).unwrap(), n_dead - 1);
    assert_eq!(l.rows_where(&t, "dead_at IS NOT NULL"), 0);
    assert_eq!(
        l.rows_where(&t, "attempts <> 0 OR dead_reason IS NOT NULL"),
        0
    );
    let s = b.stats(&t).unwrap();
    assert_eq!(counts(&s), (n_live + n_dead - 1, 0, Some(0), 0));

    // All, purged: the dead rows gone, the live ones all there.
    kill_rows(&l, &t, "dead");
    assert_eq!(b.purge_all_dead(&t).unwrap(), n_dead - 1);
    assert_eq!(l.rows(&t), n_live as i64);
    assert_eq!(
        l.rows_where(&t, "k = 'live' AND dead_at IS NULL"),
        n_live as i64
    );
    assert_eq!(b.purge_all_dead(&t).unwrap(), 0);
    assert_eq!(b.requeue_all_dead(&t).unwrap(), 0);
}
per_db!(dead_letter_maintenance);

/// `completed_at` (and `dead_at`) of every completed row of `t` moved `secs` seconds into the
/// past, directly.
fn age_completed(l: &Live, t: &Table, secs: i64) {
    let back = |c: &str| match l.db {
        Db::Postgres => format!("{c} = {c} - interval '{secs} seconds'"),
        Db::Mysql => format!("{c} = {c} - INTERVAL {secs} SECOND"),
        Db::Sqlite => format!("{c} = {c} - {secs}"),
    };
    l.exec(&format!(
        "UPDATE {} SET {}, {} WHERE completed_at IS NOT NULL",
        t.name(),
        back("completed_at"),
        back("dead_at")
    ));
}

/// A table that keeps completed rows: an ack keeps the row, completed, out of every claim, of
/// the dead letters and of the dedup keys; the prune deletes only rows completed longer ago
/// than the retention.
fn completed_rows_are_kept_and_pruned(db: Db, form: Form) {
    let Some(l) = live(db) else { return };
    let t = common::describe(&common::unique("t"), form, Duration::from_secs(60))
        .dedup()
        .keep_completed(Duration::from_secs(60));
    let t = l.create(t);
    let b = &l.broker;
    let a = b.publish(&t, msg("done", "a").dedup_key("key-a")).unwrap();
    for k in ["b", "c"] {
        b.publish(&t, msg(k, k)).unwrap();
    }
    let sub = b.subscription(&t).max_in_flight(3).start().unwrap();
    let mut ds: Vec<_> = (0..3)
        .map(|_| next(&sub, Duration::from_secs(10)))
        .collect();
    ds.sort_by_key(|d| d.id());
    let ids: Vec<i64> = ds.iter().map(|d| d.id()).collect();
    assert_eq!(ids[0], a);
    let mut ds = ds.into_iter();
    ds.next().unwrap().ack().unwrap();
    ds.next().unwrap().dead_letter("poison").unwrap();
    ds.next().unwrap().retry_after(HOUR).unwrap();
    sub.shutdown(Duration::from_secs(5)).unwrap();

    // The acked row is there, completed; the dead letter is not completed.
    assert_eq!(
        l.rows_where(
            &t,
            &format!("id = {a} AND completed_at IS NOT NULL AND dead_at IS NOT NULL")
        ),
        1
    );
    assert_eq!(
        l.rows_where(
            &t,
            &format!(
                "id = {} AND completed_at IS NULL AND dead_at IS NOT NULL",
                ids[1]
            )
        ),
        1
    );
    let s = b.stats(&t).unwrap();
    let no_lease = (form == Form::Lease).then_some(0);
    assert_eq!(counts(&s), (0, 1, no_lease, 1), "{s:?}");
    assert_eq!(s.completed, Some(1), "{s:?}");

    // Listed as completed, not as dead; dead-letter operations leave it alone.
    let kept = b.completed_after(&t, None, 10).unwrap();
    assert_eq!(kept.len(), 1);
    assert_eq!((kept[0].id, &kept[0].payload[..]), (a, &b"done"[..]));
    assert_eq!(kept[0].get("k").and_then(|v| v.as_str()), Some("a"));
    let dead: Vec<i64> = b
        .dead_letters(&t, 10)
        .unwrap()
        .iter()
        .map(|d| d.id)
        .collect();
    assert_eq!(dead, [ids[1]]);
    let paged: Vec<i64> = b
        .dead_letters_after(&t, None, 10)
        .unwrap()
        .iter()
        .map(|d| d.id)
        .collect();
    assert_eq!(paged, [ids[1]]);
    assert!(!b.requeue_dead(&t, a).unwrap());
    assert!(!b.purge_dead(&t, a).unwrap());
    assert_eq!(b.requeue_all_dead(&t).unwrap(), 1);
    assert_eq!(
        l.rows_where(&t, &format!("id = {a} AND completed_at IS NOT NULL")),
        1
    );

    // The ack freed its dedup key.
    b.publish(&t, msg("again", "a2").dedup_key("key-a"))
        .unwrap();

    // Never claimed again: the requeued dead letter and the new row come, the completed row
    // does not.
    let sub = b.subscription(&t).max_in_flight(3).start().unwrap();
    let mut got = vec![
        next(&sub, Duration::from_secs(10)),
        next(&sub, Duration::from_secs(10)),
    ];
    got.sort_by_key(|d| d.id());
    assert_eq!(got[0].id(), ids[1]);
    assert_eq!(got[1].payload(), b"again");
    assert!(sub
        .next_delivery_timeout(Duration::from_millis(500))
        .is_err());
    for d in got {
        d.ack().unwrap();
    }
    sub.shutdown(Duration::from_secs(5)).unwrap();
    assert_eq!(b.stats(&t).unwrap().completed, Some(3));

    // The prune: nothing is older than the retention yet; then the rows aged past it go, and
    // only they.
    assert_eq!(b.prune_completed(&t).unwrap(), 0);
    assert_eq!(l.rows(&t), 4);
    age_completed(&l, &t, 120);
    b.publish(&t, msg("live", "z")).unwrap();
    assert_eq!(b.prune_completed(&t).unwrap(), 3);
    assert_eq!(l.rows(&t), 2, "the scheduled row and the new one stay");
    assert_eq!(l.rows_where(&t, "completed_at IS NOT NULL"), 0);

    // A table that deletes acked rows has nothing to list or prune.
    let plain = l.table(form, Duration::from_secs(60));
    assert!(matches!(
        b.prune_completed(&plain),
        Err(sqlbroker::BrokerError::InvalidTable { .. })
    ));
    assert_eq!(b.stats(&plain).unwrap().completed, None);
}
per_db_form!(completed_rows_are_kept_and_pruned);

/// `drop_table` drops the table, its rate limits' slots table, its record in
/// `sqlbroker_tables` and the waits in `sqlbroker_deps` that name it; a second call (no such
/// table) is not an error; the same name can then be created anew with another description.
///
/// Fails (`dropped`) when the DROP is left out: tried with the statement skipped.
fn drop_table_removes_the_table_and_its_records(db: Db) {
    let Some(l) = live(db) else { return };
    let name = common::unique("drop");
    l.track(&name);
    l.track(&format!("{name}_rates"));
    let described = Table::new(name.as_str())
        .lease(HOUR)
        .text_column("k")
        .dependencies()
        .rate_limit("{k}", 5, Duration::from_secs(1));
    let t = l.create(described);
    let parent = l.broker.publish(&t, msg("parent", "a")).unwrap();
    l.broker
        .publish(&t, msg("child", "a").after(parent))
        .unwrap();
    let lit = name.replace('\'', "''");
    let waits = format!(
        "SELECT COUNT(*) FROM sqlbroker_deps WHERE parent_table = '{lit}' OR child_table = '{lit}'"
    );
    let records = format!("SELECT COUNT(*) FROM sqlbroker_tables WHERE name = '{lit}'");
    assert!(l.table_exists(&name));
    assert!(l.table_exists(&format!("{name}_rates")));
    assert!(l.int(&waits) > 0, "the child's wait is recorded");
    assert_eq!(l.int(&records), 1);

    // A broker that does not manage the schema refuses, before anything is sent.
    let ddl_less = sqlbroker::Broker::builder(&l.url)
        .manage_schema(false)
        .build()
        .unwrap();
    let refused = ddl_less.drop_table(&t).unwrap_err();
    assert!(
        matches!(refused, sqlbroker::BrokerError::DdlRefused { .. }),
        "{refused:?}"
    );
    assert!(l.table_exists(&name));
    l.broker.drop_table(&t).unwrap();
    assert!(!l.table_exists(&name), "dropped");
    assert!(!l.table_exists(&format!("{name}_rates")), "rates dropped");
    assert_eq!(l.int(&records), 0, "record removed");
    assert_eq!(l.int(&waits), 0, "waits removed");
    assert!(l.broker.open_table(&name).is_err(), "no record to open");
    // Idempotent.
    l.broker.drop_table(&t).unwrap();
    // The name is free for another description, on the same broker.
    let again = Table::new(name.as_str())
        .advisory_lock("k-{k}")
        .text_column("k");
    l.broker.create_table(&again).unwrap();
    l.broker.publish(&again, msg("x", "b")).unwrap();
    assert_eq!(l.rows(&again), 1);
    l.broker.drop_table(&again).unwrap();
    assert!(!l.table_exists(&name));
}
per_db!(drop_table_removes_the_table_and_its_records);
