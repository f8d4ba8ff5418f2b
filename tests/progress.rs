//! Job output (`Table::outputs`, `Delivery::set_output`) and checkpoints (`Table::checkpoints`,
//! `Delivery::checkpoint`), on every database x form.
//!
//! - The settlement that ends a job writes its output: read back from a kept row
//!   (`Job::output`), and by the job that waited on it from the waits even though its row was
//!   not kept. A retry writes none. Fails (`output of`) with the output write taken out of
//!   the settlement, and (`waited on`) with it left out of the parent's head. A failure
//!   writes none, on the last attempt too, as a drop and a handler timeout on it write none
//!   (`output of a failure on the last attempt` with the output handed to the dead letter).
//! - A checkpoint survives a crash of its process (SIGKILL) and the next attempt reads it.
//!   Fails (`resumed from`) with the checkpoint's write left uncommitted (row lock: without
//!   its commit).
//! - A checkpoint of a claim that was lost changes nothing (`LeaseLost`, `ClaimLost`).
//! - Bad input is refused with a typed error and writes nothing.

mod common;

use std::time::Duration;

use common::{next, unique, Db, Live};
use sqlbroker::{
    BrokerError, Form, JobOutcome, JobState, Message, Table, CHECKPOINT_MAX, OUTPUT_MAX,
};

/// `t` in `form` (the advisory key reads a column unique per message).
fn in_form(t: Table, form: Form, lease: Duration) -> Table {
    let name = t.name().to_string();
    let t = t.text_column("u");
    match form {
        Form::Lease => t.lease(lease),
        Form::AdvisoryLock => t.advisory_lock(format!("{name}-{{u}}")),
        _ => t,
    }
}

fn message(body: &str) -> Message {
    Message::new(body.as_bytes().to_vec()).set("u", format!("{body}-{}", unique("u")))
}

/// Deletes the waits and heads of `t` (the waits' table is shared by every test).
fn forget(l: &Live, t: &Table) {
    l.forget_deps(t.name());
}

/// An ack's output reaches a kept row and the job waiting on it; a dead letter's is kept on
/// its row; a retry writes none.
fn outputs_are_kept_and_passed_on(db: Db, form: Form) {
    let Some(l) = common::live(db) else { return };
    let long = Duration::from_secs(30);
    let kept = l.create(in_form(
        Table::new(unique("outk"))
            .outputs()
            .keep_completed(Duration::from_secs(3600)),
        form,
        long,
    ));
    let waits = l.create(in_form(
        Table::new(unique("outw")).outputs().dependencies(),
        form,
        long,
    ));

    // Kept rows: the ack's output; a retry's is dropped and the next attempt's written.
    let done = l.broker.publish(&kept, message("done")).unwrap();
    let again = l.broker.publish(&kept, message("again")).unwrap();
    let sub = l
        .broker
        .subscription(&kept)
        .max_in_flight(1)
        .start()
        .unwrap();
    for _ in 0..2 {
        let d = next(&sub, Duration::from_secs(10));
        if d.id() == done {
            d.set_output(b"first").unwrap();
            d.set_output(b"result of done").unwrap();
            d.ack().unwrap();
        } else {
            d.set_output(b"not written").unwrap();
            d.retry_after(Duration::ZERO).unwrap();
        }
    }
    let output = |t: &Table, id| {
        let job = l.broker.job(t, id).unwrap().unwrap();
        (job.state(), job.output().map(<[u8]>::to_vec))
    };
    assert_eq!(
        output(&kept, done),
        (JobState::Completed, Some(b"result of done".to_vec())),
        "output of an acked, kept row"
    );
    assert_eq!(output(&kept, again).1, None, "a retry wrote its output");
    let d = next(&sub, Duration::from_secs(10));
    assert_eq!(d.id(), again);
    d.set_output(b"second attempt").unwrap();
    d.ack().unwrap();
    assert_eq!(output(&kept, again).1, Some(b"second attempt".to_vec()));
    sub.shutdown(Duration::from_secs(10)).unwrap();

    // Not kept: the callback reads each parent's output from the waits.
    let a = l.broker.publish(&waits, message("a")).unwrap();
    let b = l.broker.publish(&waits, message("b")).unwrap();
    let c = l.broker.publish(&waits, message("c")).unwrap();
    let cb = l
        .broker
        .publish(
            &waits,
            message("cb")
                .after_settled(a)
                .after_settled(b)
                .after_settled(c),
        )
        .unwrap();
    let sub = l
        .broker
        .subscription(&waits)
        .max_in_flight(3)
        .start()
        .unwrap();
    for _ in 0..3 {
        let d = next(&sub, Duration::from_secs(10));
        match d.id() {
            id if id == a => {
                d.set_output(&[0, 159, 146, 150, 255]).unwrap();
                d.ack().unwrap();
            }
            id if id == b => d.ack().unwrap(),
            _ => {
                d.set_output(b"partial").unwrap();
                d.dead_letter("bad input").unwrap();
            }
        }
    }
    let d = next(&sub, Duration::from_secs(10));
    assert_eq!(d.id(), cb);
    let got: Vec<(i64, Option<JobOutcome>, Option<Vec<u8>>)> = d
        .waited_on()
        .unwrap()
        .into_iter()
        .map(|w| (w.id, w.outcome, w.output))
        .collect();
    assert_eq!(
        got,
        [
            (
                a,
                Some(JobOutcome::Acked),
                Some(vec![0, 159, 146, 150, 255])
            ),
            (b, Some(JobOutcome::Acked), None),
            (c, Some(JobOutcome::DeadLettered), Some(b"partial".to_vec())),
        ],
        "waited on"
    );
    d.ack().unwrap();
    sub.shutdown(Duration::from_secs(10)).unwrap();
    assert_eq!(l.broker.job(&waits, a).unwrap().map(|j| j.id()), None);
    assert_eq!(
        output(&waits, c),
        (JobState::Dead, Some(b"partial".to_vec())),
        "output of a dead letter"
    );
    forget(&l, &waits);
}
per_db_form!(outputs_are_kept_and_passed_on);

/// Carries `<form>\t<table>\t<url>` to the crash test's child.
const CHILD_ENV: &str = "SQLBROKER_PROGRESS_CHILD";

/// The crash test's table, described alike in both processes (a lease of 1 s, so the row
/// comes back soon after the crash).
fn crash_table(name: &str, form: Form) -> Table {
    in_form(Table::new(name).checkpoints(), form, Duration::from_secs(1))
}

/// The crash test's child: claims one delivery, saves two checkpoints, prints `SAVED <id>`,
/// and holds the delivery until it is killed. Does nothing unless the variable is set.
#[test]
fn progress_crash_child() {
    common::hold_until_killed(CHILD_ENV, crash_table, "SAVED", |d| {
        assert_eq!(
            d.last_checkpoint(),
            None,
            "child: the first attempt has none"
        );
        d.checkpoint(b"row 1000").expect("child: checkpoint");
        d.checkpoint(b"row 2000").expect("child: checkpoint");
        assert_eq!(d.last_checkpoint().as_deref(), Some(&b"row 2000"[..]));
    });
}

/// A job whose process is killed (SIGKILL) after a checkpoint resumes from it: the next
/// attempt reads it, and operators see it.
fn a_crashed_job_resumes_from_its_checkpoint(db: Db, form: Form) {
    let Some(l) = common::live(db) else { return };
    let t = l.create(crash_table(&unique("ckpt"), form));
    let id = l.broker.publish(&t, message("import")).unwrap();
    let spec = format!("{}\t{}\t{}", common::form_name(form), t.name(), l.url);
    let holder = common::spawn_child("progress_crash_child", CHILD_ENV, &spec);
    let saved = holder.line_after("SAVED ", Duration::from_secs(60));
    assert_eq!(
        saved,
        Some(id.to_string()),
        "the child saved its checkpoints"
    );
    holder.kill();
    let job = l.broker.job(&t, id).unwrap().unwrap();
    assert_eq!(job.checkpoint(), Some(&b"row 2000"[..]), "Job::checkpoint");
    // Row lock: claimable once the checkpoint's guard (10 s) has passed.
    let sub = l.broker.subscription(&t).start().unwrap();
    let d = next(&sub, Duration::from_secs(30));
    assert_eq!(d.id(), id);
    assert_eq!(
        d.last_checkpoint().as_deref(),
        Some(&b"row 2000"[..]),
        "resumed from"
    );
    d.checkpoint(b"row 3000").unwrap();
    d.ack().unwrap();
    sub.shutdown(Duration::from_secs(10)).unwrap();
    assert_eq!(l.rows(&t), 0);
}
per_db_form!(a_crashed_job_resumes_from_its_checkpoint);

/// A checkpoint after a retry is read by the next attempt, in the same process; one whose
/// claim is lost changes nothing.
fn checkpoints_are_fenced(db: Db, form: Form) {
    let Some(l) = common::live(db) else { return };
    let t = l.create(in_form(
        Table::new(unique("ckf")).checkpoints(),
        form,
        Duration::from_secs(30),
    ));
    let id = l.broker.publish(&t, message("long")).unwrap();
    // One in flight: the row freed below is not claimed again while `d` holds its slot (a
    // claim within the same second could write the same lease token).
    let sub = l.broker.subscription(&t).max_in_flight(1).start().unwrap();
    let d = next(&sub, Duration::from_secs(10));
    d.checkpoint(b"step 1").unwrap();
    d.retry_after(Duration::ZERO).unwrap();
    let d = next(&sub, Duration::from_secs(10));
    assert_eq!(d.last_checkpoint().as_deref(), Some(&b"step 1"[..]));
    match form {
        Form::Lease => {
            // The lease taken from under it: the checkpoint is refused and writes nothing.
            l.exec(&format!("UPDATE {} SET locked_until = NULL", t.name()));
            assert!(matches!(
                d.checkpoint(b"step 2"),
                Err(BrokerError::LeaseLost { .. })
            ));
        }
        Form::AdvisoryLock => {
            l.exec(&format!("DELETE FROM {} WHERE id = {id}", t.name()));
            assert!(matches!(
                d.checkpoint(b"step 2"),
                Err(BrokerError::ClaimLost { .. })
            ));
        }
        _ => {
            // Row lock: the work before a checkpoint commits with it.
            d.checkpoint(b"step 2").unwrap();
        }
    }
    let left = l.broker.job(&t, id).unwrap();
    let expected: Option<&[u8]> = match form {
        Form::AdvisoryLock => None,
        Form::Lease => Some(b"step 1"),
        _ => Some(b"step 2"),
    };
    assert_eq!(
        left.as_ref().and_then(|j| j.checkpoint()),
        expected,
        "what the row holds"
    );
    drop(d);
    sub.shutdown(Duration::from_secs(10)).unwrap();
}
per_db_form!(checkpoints_are_fenced);

/// Only the handler's own end of a job writes its output (an ack, a dead letter, a cancel); a
/// failure writes none, on the last attempt too, as a drop and a handler timeout on it write
/// none. Fails (`output of a failure on the last attempt`: the output written) with the
/// output handed to the dead letter a failure on the last attempt becomes.
fn a_failure_on_the_last_attempt_writes_no_output(db: Db, form: Form) {
    let Some(l) = common::live(db) else { return };
    let t = l.create(in_form(
        Table::new(unique("outf")).outputs().max_attempts(1),
        form,
        Duration::from_secs(30),
    ));
    let ids: Vec<i64> = ["failed", "dropped", "timed out", "dead-lettered"]
        .iter()
        .map(|what| l.broker.publish(&t, message(what)).unwrap())
        .collect();
    let sub = l
        .broker
        .subscription(&t)
        .max_in_flight(1)
        .handler_timeout(Duration::from_millis(500))
        .start()
        .unwrap();
    for _ in 0..4 {
        let d = next(&sub, Duration::from_secs(10));
        d.set_output(b"partial").unwrap();
        match ids.iter().position(|id| *id == d.id()) {
            Some(0) => d.fail("boom").unwrap(),
            Some(1) => drop(d),
            Some(2) => {
                assert!(common::wait_for(Duration::from_secs(10), || d.timed_out()));
                assert!(d.ack().unwrap_err().is_handler_timeout());
            }
            _ => d.dead_letter("given up").unwrap(),
        }
    }
    sub.shutdown(Duration::from_secs(10)).unwrap();
    let output = |id: i64| {
        let mut job = None;
        common::wait_for(Duration::from_secs(10), || {
            job = l.broker.job(&t, id).unwrap();
            job.as_ref().is_some_and(|j| j.state() == JobState::Dead)
        });
        let job = job.expect("the job is kept");
        (job.state(), job.output().map(<[u8]>::to_vec))
    };
    let dead = JobState::Dead;
    assert_eq!(
        output(ids[0]),
        (dead, None),
        "output of a failure on the last attempt"
    );
    assert_eq!(output(ids[1]), (dead, None), "output of a drop");
    assert_eq!(output(ids[2]), (dead, None), "output of a handler timeout");
    assert_eq!(
        output(ids[3]),
        (dead, Some(b"partial".to_vec())),
        "output of a dead letter"
    );
}
per_db_form!(a_failure_on_the_last_attempt_writes_no_output);

/// Outputs and checkpoints over their bounds, or on a table without the option, are refused
/// with a typed error, and nothing is written.
fn bad_progress_is_refused(db: Db, form: Form) {
    let Some(l) = common::live(db) else { return };
    let long = Duration::from_secs(30);
    let plain = l.create(in_form(Table::new(unique("plain")), form, long));
    let both = l.create(in_form(
        Table::new(unique("both"))
            .outputs()
            .checkpoints()
            .keep_completed(Duration::from_secs(3600)),
        form,
        long,
    ));
    l.broker.publish(&plain, message("p")).unwrap();
    let sub = l.broker.subscription(&plain).start().unwrap();
    let d = next(&sub, Duration::from_secs(10));
    assert!(matches!(
        d.set_output(b"x"),
        Err(BrokerError::InvalidTable { .. })
    ));
    assert!(matches!(
        d.checkpoint(b"x"),
        Err(BrokerError::InvalidTable { .. })
    ));
    assert_eq!(d.last_checkpoint(), None);
    d.ack().unwrap();
    sub.shutdown(Duration::from_secs(10)).unwrap();

    let id = l.broker.publish(&both, message("b")).unwrap();
    let sub = l.broker.subscription(&both).start().unwrap();
    let d = next(&sub, Duration::from_secs(10));
    d.set_output(b"fits").unwrap();
    let big = vec![7u8; OUTPUT_MAX.max(CHECKPOINT_MAX) + 1];
    match d.set_output(&big) {
        Err(BrokerError::TooLarge { what, len, max, .. }) => {
            assert_eq!((what, len, max), ("output", big.len(), OUTPUT_MAX))
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        d.checkpoint(&big),
        Err(BrokerError::TooLarge {
            what: "checkpoint",
            ..
        })
    ));
    assert_eq!(d.last_checkpoint(), None);
    d.ack().unwrap();
    sub.shutdown(Duration::from_secs(10)).unwrap();
    let job = l.broker.job(&both, id).unwrap().unwrap();
    assert_eq!(
        (job.output(), job.checkpoint()),
        (Some(&b"fits"[..]), None),
        "a refused output or checkpoint wrote nothing"
    );
}
per_db_form!(bad_progress_is_refused);

/// `migrate` adds the output and checkpoint columns to a table made without them (its rows
/// kept), after which both work; the table is refused until then.
fn migrate_adds_the_columns(db: Db) {
    let Some(l) = common::live(db) else { return };
    let plain = l.create(in_form(
        Table::new(unique("mig")),
        Form::Lease,
        Duration::from_secs(30),
    ));
    let id = l.broker.publish(&plain, message("old")).unwrap();
    let both = Table::new(plain.name())
        .text_column("u")
        .lease(Duration::from_secs(30))
        .outputs()
        .checkpoints()
        .keep_completed(Duration::from_secs(3600));
    assert!(matches!(
        l.broker.subscription(&both).start(),
        Err(BrokerError::Schema { .. } | BrokerError::InvalidTable { .. })
    ));
    let done = l.broker.migrate(&both).unwrap();
    for column in ["output", "checkpoint"] {
        assert!(
            done.iter().any(|d| d.contains(column)),
            "{column} in {done:?}"
        );
    }
    let sub = l.broker.subscription(&both).start().unwrap();
    let d = next(&sub, Duration::from_secs(10));
    assert_eq!((d.id(), d.last_checkpoint()), (id, None));
    d.checkpoint(b"c").unwrap();
    d.set_output(b"o").unwrap();
    d.ack().unwrap();
    sub.shutdown(Duration::from_secs(10)).unwrap();
    let job = l.broker.job(&both, id).unwrap().unwrap();
    assert_eq!(
        (job.output(), job.checkpoint()),
        (Some(&b"o"[..]), Some(&b"c"[..]))
    );
}
per_db!(migrate_adds_the_columns);
