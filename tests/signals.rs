//! Jobs that wait for a signal (`Message::after_signal`, `Message::wait_timeout`,
//! `Broker::signal`, `Delivery::signal`), on every database x form.
//!
//! - A signal sent before the publish is a latch: the job runs at once and reads its payload;
//!   a second signal of the name returns 0 and keeps the first payload. Fails (`Waiting`) with
//!   the latch not read at publish.
//! - A job published before its signal waits, is released by it (`signal` returns 1), once,
//!   and reads the payload; operators see what it waits for. Fails (`Ready`, or 0) with the
//!   release taken out of the signal.
//! - A signal and its job's publish at the same instant from two brokers, many rounds: every
//!   job released, delivered exactly once, reading the payload; and the same from another
//!   process, its signal sent at the instant this one publishes (from 6 ms before to 6 ms
//!   after, over the rounds).
//! - A wait with a deadline runs without the signal past it (`Delivery::signal` is `None`);
//!   a signal racing the deadline has exactly one outcome, which the signal's count and the
//!   handler agree on.
//! - `after` and `after_signal` together: the job runs only once both came, in either order.
//! - A requeued job that waited for a signal keeps what it read; a dead letter that waits for
//!   a signal and a job, requeued, waits for both again.
//! - Bad input is refused and writes nothing.
//! - The sweeper deletes a signal's row nothing needs: at once when it holds no signal, a day
//!   after the signal when it does.

mod common;

use std::io::{BufRead, Write};
use std::sync::{Arc, Barrier};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::{next, unique, wait_for, Db, Live};
use sqlbroker::{BrokerError, Form, JobState, Message, Table};

/// A table with dependencies in `form` (the advisory form's key reads a column unique per
/// message), dropped at the end with its waits.
fn table(l: &Live, form: Form) -> Table {
    l.create(describe(&unique("sig"), form))
}

/// The description of the test's table `name` in `form` (also a child process's).
fn describe(name: &str, form: Form) -> Table {
    let t = Table::new(name).text_column("u").dependencies();
    match form {
        Form::Lease => t.lease(Duration::from_secs(30)),
        Form::AdvisoryLock => t.advisory_lock(format!("{name}-{{u}}")),
        _ => t,
    }
}

fn message(body: &str) -> Message {
    Message::new(body.as_bytes().to_vec()).set("u", format!("{body}-{}", unique("u")))
}

fn state(l: &Live, t: &Table, id: i64) -> Option<JobState> {
    l.broker.job(t, id).unwrap().map(|j| j.state())
}

/// Released: ready, or already claimed by the test's running subscription.
fn released(l: &Live, t: &Table, id: i64) -> bool {
    matches!(state(l, t, id), Some(JobState::Ready | JobState::InFlight))
}

/// A signal name of its own (signals of one table share names only within a test).
fn name(what: &str) -> String {
    format!("{what}:{}", unique("s"))
}

/// Deletes the test's rows of the shared `sqlbroker_deps`: its table's waits and heads, and
/// the heads of the signals it used.
fn forget(l: &Live, t: &Table, signals: &[&str]) {
    l.forget_deps(t.name());
    for s in signals {
        l.forget_deps(&format!("!{s}"));
    }
}

/// Rows of `sqlbroker_deps` a signal has (its head and its waits).
fn signal_rows(l: &Live, signal: &str) -> i64 {
    l.int(&format!(
        "SELECT COUNT(*) FROM sqlbroker_deps WHERE parent_table = '!{signal}'"
    ))
}

fn signal_first_then_publish(db: Db, form: Form) {
    let Some(l) = common::live(db) else { return };
    let t = table(&l, form);
    let s = name("paid");
    assert_eq!(l.broker.signal(&t, &s, b"first").unwrap(), 0);
    // A latch: a second signal changes nothing.
    assert_eq!(l.broker.signal(&t, &s, b"second").unwrap(), 0);
    let id = l
        .broker
        .publish(&t, message("ship").after_signal(&s))
        .unwrap();
    assert_eq!(state(&l, &t, id), Some(JobState::Ready));
    let job = l.broker.job(&t, id).unwrap().unwrap();
    let w = job.signal_wait().expect("the job names its signal");
    assert_eq!(
        (w.name(), w.waiting(), w.timed_out()),
        (s.as_str(), false, false)
    );
    let sub = l.broker.subscription(&t).start().unwrap();
    let d = next(&sub, Duration::from_secs(10));
    assert_eq!(d.id(), id);
    let got = d.signal().expect("the signal it waited for");
    assert_eq!((got.name(), got.payload()), (s.as_str(), &b"first"[..]));
    d.ack().unwrap();
    sub.shutdown(Duration::from_secs(10)).unwrap();
    forget(&l, &t, &[&s]);
}
per_db_form!(signal_first_then_publish);

fn publish_then_signal(db: Db, form: Form) {
    let Some(l) = common::live(db) else { return };
    let t = table(&l, form);
    let s = name("approved");
    let other = name("other");
    let id = l
        .broker
        .publish(&t, message("order").after_signal(&s))
        .unwrap();
    let plain = l.broker.publish(&t, message("plain")).unwrap();
    assert_eq!(state(&l, &t, id), Some(JobState::Waiting));
    let job = l.broker.job(&t, id).unwrap().unwrap();
    let w = job.signal_wait().expect("the job names its signal");
    assert_eq!(
        (w.name(), w.waiting(), w.deadline()),
        (s.as_str(), true, None)
    );
    assert!(job.waits_on().is_empty(), "{:?}", job.waits_on());
    let waiting = l.broker.waiting_signals(&t).unwrap();
    assert_eq!(waiting.len(), 1, "{waiting:?}");
    assert_eq!((waiting[0].name(), waiting[0].jobs()), (s.as_str(), 1));
    // Another name releases nothing.
    assert_eq!(l.broker.signal(&t, &other, b"").unwrap(), 0);
    assert_eq!(state(&l, &t, id), Some(JobState::Waiting));
    let sub = l.broker.subscription(&t).start().unwrap();
    let d = next(&sub, Duration::from_secs(10));
    assert_eq!((d.id(), d.signal()), (plain, None));
    d.ack().unwrap();
    assert_eq!(l.broker.signal(&t, &s, b"yes").unwrap(), 1);
    assert_eq!(l.broker.signal(&t, &s, b"again").unwrap(), 0);
    assert!(l.broker.waiting_signals(&t).unwrap().is_empty());
    let d = next(&sub, Duration::from_secs(10));
    assert_eq!(d.id(), id);
    assert_eq!(
        d.signal().map(|s| s.payload().to_vec()),
        Some(b"yes".to_vec())
    );
    d.ack().unwrap();
    // Released once: nothing more comes.
    assert!(sub
        .next_delivery_timeout(Duration::from_millis(500))
        .is_err());
    sub.shutdown(Duration::from_secs(10)).unwrap();
    assert_eq!(l.rows(&t), 0);
    forget(&l, &t, &[&s, &other]);
}
per_db_form!(publish_then_signal);

/// Each round, one broker publishes a job waiting for a signal while another sends it, at
/// the same instant: the job is released every time (never left waiting), delivered once.
fn signal_racing_publish(db: Db, form: Form) {
    let Some(l) = common::live(db) else { return };
    let t = table(&l, form);
    let (a, b) = (l.connect(), l.connect());
    let rounds = 25;
    let names: Vec<String> = (0..rounds).map(|_| name("race")).collect();
    let mut ids = Vec::new();
    let mut released = 0;
    for s in &names {
        let gate = Arc::new(Barrier::new(2));
        let (g, tt, ss) = (gate.clone(), t.clone(), s.clone());
        let sender = std::thread::scope(|scope| {
            let h = scope.spawn(|| {
                g.wait();
                b.signal(&tt, &ss, ss.as_bytes()).unwrap()
            });
            gate.wait();
            ids.push(a.publish(&t, message("r").after_signal(s)).unwrap());
            h.join().unwrap()
        });
        assert!(sender <= 1, "one signal released {sender} jobs");
        released += sender;
    }
    each_released_and_run_once(&l, &t, &ids);
    // Which came first is the database's to say; say it here when the test is run by hand.
    eprintln!("{released} of {rounds} jobs released by their signal");
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    forget(&l, &t, &names);
}
per_db_form!(signal_racing_publish);

/// Every job of `ids` released (ready), then delivered exactly once, reading its signal
/// (whose payload is its name), and nothing more delivered.
fn each_released_and_run_once(l: &Live, t: &Table, ids: &[i64]) {
    for id in ids {
        assert_eq!(state(l, t, *id), Some(JobState::Ready), "job {id}");
    }
    let sub = l.broker.subscription(t).start().unwrap();
    let mut seen = std::collections::HashMap::new();
    for _ in ids {
        let d = next(&sub, Duration::from_secs(10));
        let s = d.signal().expect("each job read its signal");
        assert_eq!(s.name().as_bytes(), s.payload());
        *seen.entry(d.id()).or_insert(0) += 1;
        d.ack().unwrap();
    }
    assert!(sub
        .next_delivery_timeout(Duration::from_millis(500))
        .is_err());
    sub.shutdown(Duration::from_secs(10)).unwrap();
    assert_eq!(seen.len(), ids.len(), "{seen:?}");
    assert!(seen.values().all(|n| *n == 1), "{seen:?}");
}

const CHILD_ENV: &str = "SQLBROKER_SIGNAL_CHILD";

/// Microseconds since the epoch, now.
fn micros_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

/// Sleeps until `at` (microseconds since the epoch) on the wall clock two processes share.
fn sleep_until(at: u64) {
    let now = micros_now();
    if at > now {
        std::thread::sleep(Duration::from_micros(at - now));
    }
}

/// The child half: does nothing unless `SQLBROKER_SIGNAL_CHILD` is set. Then it prints
/// `CHILD <pid>`, and for each line `<unix micros> <name>` on its stdin sends the signal
/// `name` (its payload the name) at that instant and prints `SIGNALED <name> <released>`; it
/// ends when its stdin closes.
#[test]
fn signal_child_entry() {
    let Some((form, name, url)) = common::child_spec(CHILD_ENV) else {
        return;
    };
    let broker = sqlbroker::Broker::connect(&url).expect("child: connect");
    let t = describe(&name, common::form_from(&form));
    let mut out = std::io::stdout();
    writeln!(out, "\nCHILD {}", std::process::id()).unwrap();
    out.flush().unwrap();
    for line in std::io::stdin().lock().lines() {
        let line = line.expect("child: stdin");
        let (at, s) = line.split_once(' ').expect("child: `<at> <name>`");
        sleep_until(at.parse().expect("child: an instant"));
        let n = broker.signal(&t, s, s.as_bytes()).expect("child: signal");
        writeln!(out, "\nSIGNALED {s} {n}").unwrap();
        out.flush().unwrap();
    }
}

/// The signal sent by another process at the instant this one publishes its job (the
/// publish moved from 6 ms before to 6 ms after the signal over the rounds, so either may
/// commit first, or both meet): every job is released, by its signal or by the latch its
/// publish read, never both (`signal` returns at most 1), and each is delivered once,
/// reading the payload.
///
/// Fails (a job left `Waiting`) when a publish does not read a latch committed while it ran,
/// or a signal does not release a wait committed while it ran: the two processes' statements
/// must see each other's commit whichever comes first (seen failing on PostgreSQL, `job ..
/// Waiting`, with the publish's lock on the signal's head taken out; MySQL's read of the head
/// locks it by itself, and SQLite writes one at a time). Fails (`one order only`) where the
/// race was not run: every signal before, or every one after, its publish.
fn signal_from_another_process_racing_publish(db: Db, form: Form) {
    let Some(l) = common::live(db) else { return };
    let t = table(&l, form);
    let mut child =
        common::spawn_table_child("signal_child_entry", CHILD_ENV, form, t.name(), &l.url);
    let rounds: i64 = 28;
    let names: Vec<String> = (0..rounds).map(|_| name("proc")).collect();
    let (mut ids, mut released) = (Vec::new(), 0);
    let mut stdin = child.process.stdin.take().expect("the child's stdin");
    for (i, s) in names.iter().enumerate() {
        let at = micros_now() + 50_000;
        writeln!(stdin, "{at} {s}").unwrap();
        stdin.flush().unwrap();
        // From 6 ms early to 6 ms late, in steps of 4/9 ms.
        let offset = i as i64 * 12_000 / (rounds - 1) - 6_000;
        sleep_until(at.saturating_add_signed(offset));
        ids.push(l.broker.publish(&t, message("p").after_signal(s)).unwrap());
        let said = child
            .line_after(&format!("SIGNALED {s} "), Duration::from_secs(30))
            .expect("the child did not signal");
        let n: u64 = said.trim().parse().unwrap();
        assert!(n <= 1, "one signal released {n} jobs");
        released += n;
    }
    drop(stdin);
    each_released_and_run_once(&l, &t, &ids);
    let _ = child.process.wait();
    assert!(
        released > 0 && released < rounds as u64,
        "{released} of {rounds} jobs released by the signal: one order only, the race not run"
    );
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    forget(&l, &t, &names);
}
per_db_form!(signal_from_another_process_racing_publish);

/// Past its deadline a job runs without the signal; a signal after that releases nothing
/// and the job still reads none.
fn a_wait_times_out(db: Db, form: Form) {
    let Some(l) = common::live(db) else { return };
    let t = table(&l, form);
    let s = name("late");
    let id = l
        .broker
        .publish(
            &t,
            message("order")
                .after_signal(&s)
                .wait_timeout(Duration::from_millis(200)),
        )
        .unwrap();
    let job = l.broker.job(&t, id).unwrap().unwrap();
    assert!(job.signal_wait().unwrap().deadline().is_some());
    assert_eq!(job.state(), JobState::Waiting);
    assert!(
        wait_for(Duration::from_secs(20), || state(&l, &t, id)
            == Some(JobState::Ready)),
        "the wait did not time out"
    );
    let job = l.broker.job(&t, id).unwrap().unwrap();
    assert!(job.signal_wait().unwrap().timed_out());
    assert_eq!(l.broker.signal(&t, &s, b"too late").unwrap(), 0);
    let sub = l.broker.subscription(&t).start().unwrap();
    let d = next(&sub, Duration::from_secs(10));
    assert_eq!((d.id(), d.signal()), (id, None));
    assert_eq!(d.read_signal().unwrap(), None);
    d.ack().unwrap();
    sub.shutdown(Duration::from_secs(10)).unwrap();
    forget(&l, &t, &[&s]);
}
per_db_form!(a_wait_times_out);

/// Jobs whose deadlines fall among their signals (sent 150 ms apart around them): each wait
/// has one outcome: the signal released it (returned 1) and its handler reads the signal, or
/// it timed out (the signal returned 0) and its handler reads none.
fn timeout_racing_signal(db: Db, form: Form) {
    let Some(l) = common::live(db) else { return };
    let t = table(&l, form);
    let n = 16;
    let names: Vec<String> = (0..n).map(|_| name("tr")).collect();
    let mut ids = Vec::new();
    for s in &names {
        let m = message("o")
            .after_signal(s)
            .wait_timeout(Duration::from_millis(300));
        ids.push(l.broker.publish(&t, m).unwrap());
    }
    let mut sent = std::collections::HashMap::new();
    for (s, id) in names.iter().zip(&ids) {
        std::thread::sleep(Duration::from_millis(150));
        sent.insert(*id, l.broker.signal(&t, s, b"came").unwrap());
    }
    let sub = l.broker.subscription(&t).start().unwrap();
    let (mut came, mut timed_out) = (0, 0);
    for _ in 0..n {
        let d = next(&sub, Duration::from_secs(20));
        let read = d.signal();
        let job = l.broker.job(&t, d.id()).unwrap().unwrap();
        let w = job.signal_wait().unwrap().clone();
        match sent[&d.id()] {
            1 => {
                assert_eq!(read.map(|s| s.payload().to_vec()), Some(b"came".to_vec()));
                assert!(!w.timed_out() && w.signal().is_some(), "{w:?}");
                came += 1;
            }
            0 => {
                assert_eq!(
                    read,
                    None,
                    "job {} read a signal that released nothing",
                    d.id()
                );
                assert!(w.timed_out() && w.signal().is_none(), "{w:?}");
                timed_out += 1;
            }
            other => panic!("a signal released {other} jobs"),
        }
        d.ack().unwrap();
    }
    assert!(sub
        .next_delivery_timeout(Duration::from_millis(500))
        .is_err());
    sub.shutdown(Duration::from_secs(10)).unwrap();
    eprintln!("{came} released by their signal, {timed_out} timed out");
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    forget(&l, &t, &names);
}
per_db_form!(timeout_racing_signal);

/// `after` and `after_signal` together: runs once its parent is acked and the signal came,
/// whichever is last.
fn after_and_signal(db: Db, form: Form) {
    let Some(l) = common::live(db) else { return };
    let t = table(&l, form);
    let (s1, s2) = (name("both"), name("both"));
    let sub = l.broker.subscription(&t).start().unwrap();
    // The signal first, then the parent.
    let p = l.broker.publish(&t, message("p1")).unwrap();
    let c = l
        .broker
        .publish(&t, message("c1").after(p).after_signal(&s1))
        .unwrap();
    assert_eq!(l.broker.signal(&t, &s1, b"one").unwrap(), 0);
    assert_eq!(state(&l, &t, c), Some(JobState::Waiting));
    let d = next(&sub, Duration::from_secs(10));
    assert_eq!(d.id(), p);
    d.ack().unwrap();
    assert!(released(&l, &t, c), "{:?}", state(&l, &t, c));
    let d = next(&sub, Duration::from_secs(10));
    assert_eq!(d.id(), c);
    assert_eq!(d.signal().unwrap().payload(), b"one");
    assert_eq!(d.waited_on().unwrap().len(), 1);
    d.ack().unwrap();
    // The parent first, then the signal.
    let p = l.broker.publish(&t, message("p2")).unwrap();
    let c = l
        .broker
        .publish(&t, message("c2").after(p).after_signal(&s2))
        .unwrap();
    let d = next(&sub, Duration::from_secs(10));
    assert_eq!(d.id(), p);
    d.ack().unwrap();
    assert_eq!(state(&l, &t, c), Some(JobState::Waiting));
    assert_eq!(l.broker.signal(&t, &s2, b"two").unwrap(), 1);
    let d = next(&sub, Duration::from_secs(10));
    assert_eq!((d.id(), d.signal().unwrap().payload()), (c, &b"two"[..]));
    d.ack().unwrap();
    sub.shutdown(Duration::from_secs(10)).unwrap();
    forget(&l, &t, &[&s1, &s2]);
}
per_db_form!(after_and_signal);

/// A job released by its signal, dead-lettered and requeued, runs at once and reads the same
/// signal; a dead letter that waited for a job and a signal, requeued, waits for both again.
fn requeued_jobs_keep_their_signal(db: Db, form: Form) {
    let Some(l) = common::live(db) else { return };
    let t = table(&l, form);
    let (s1, s2) = (name("rq"), name("rq"));
    let sub = l.broker.subscription(&t).start().unwrap();
    let id = l
        .broker
        .publish(&t, message("a").after_signal(&s1))
        .unwrap();
    assert_eq!(l.broker.signal(&t, &s1, b"kept").unwrap(), 1);
    next(&sub, Duration::from_secs(10))
        .dead_letter("try again")
        .unwrap();
    assert!(l.broker.requeue_dead(&t, id).unwrap());
    assert!(released(&l, &t, id), "{:?}", state(&l, &t, id));
    let d = next(&sub, Duration::from_secs(10));
    assert_eq!((d.id(), d.signal().unwrap().payload()), (id, &b"kept"[..]));
    d.ack().unwrap();
    // A dead letter through its parent, waiting for a signal not yet sent.
    let p = l.broker.publish(&t, message("p")).unwrap();
    let c = l
        .broker
        .publish(&t, message("c").after(p).after_signal(&s2))
        .unwrap();
    next(&sub, Duration::from_secs(10))
        .dead_letter("no")
        .unwrap();
    assert_eq!(state(&l, &t, c), Some(JobState::Dead));
    assert!(l.broker.requeue_dead(&t, p).unwrap());
    assert!(l.broker.requeue_dead(&t, c).unwrap());
    assert_eq!(state(&l, &t, c), Some(JobState::Waiting));
    let d = next(&sub, Duration::from_secs(10));
    assert_eq!(d.id(), p);
    d.ack().unwrap();
    assert_eq!(state(&l, &t, c), Some(JobState::Waiting));
    assert_eq!(l.broker.signal(&t, &s2, b"now").unwrap(), 1);
    let d = next(&sub, Duration::from_secs(10));
    assert_eq!((d.id(), d.signal().unwrap().payload()), (c, &b"now"[..]));
    d.ack().unwrap();
    sub.shutdown(Duration::from_secs(10)).unwrap();
    forget(&l, &t, &[&s1, &s2]);
}
per_db_form!(requeued_jobs_keep_their_signal);

/// Refused with a clear error, writing nothing: a signal for a table without dependencies,
/// a bad name, a deadline without a signal, a delayed job waiting for a signal.
fn bad_input_is_refused(db: Db) {
    let Some(l) = common::live(db) else { return };
    let t = table(&l, Form::Lease);
    let plain = l.table(Form::Lease, Duration::from_secs(30));
    let invalid = |r: sqlbroker::Result<i64>| {
        assert!(
            matches!(r, Err(BrokerError::InvalidMessage { .. })),
            "{r:?}"
        )
    };
    invalid(
        l.broker
            .publish(&plain, Message::new(b"x".to_vec()).after_signal("a")),
    );
    invalid(l.broker.publish(&t, message("x").after_signal("a b")));
    invalid(l.broker.publish(&t, message("x").after_signal("")));
    invalid(
        l.broker
            .publish(&t, message("x").after_signal("x".repeat(64))),
    );
    invalid(
        l.broker
            .publish(&t, message("x").wait_timeout(Duration::from_secs(1))),
    );
    invalid(
        l.broker.publish(
            &t,
            message("x")
                .after_signal("a")
                .deliver_after(Duration::from_secs(5)),
        ),
    );
    let sent = l.broker.signal(&plain, "a", b"");
    assert!(
        matches!(sent, Err(BrokerError::InvalidMessage { .. })),
        "{sent:?}"
    );
    let sent = l.broker.signal(&t, "no/slash", b"");
    assert!(
        matches!(sent, Err(BrokerError::InvalidMessage { .. })),
        "{sent:?}"
    );
    assert_eq!((l.rows(&t), l.rows(&plain)), (0, 0));
    assert_eq!(signal_rows(&l, "a"), 0);
    assert_eq!(signal_rows(&l, "no/slash"), 0);
}
per_db!(bad_input_is_refused);

/// The sweeper deletes a signal's rows nothing needs: a head holding no signal once no job
/// waits for it (the job cancelled), and a signal sent, a day after it was sent.
fn signals_are_swept(db: Db) {
    let Some(l) = common::live(db) else { return };
    let t = table(&l, Form::Lease);
    let (s1, s2) = (name("swept"), name("kept"));
    let id = l
        .broker
        .publish(&t, message("x").after_signal(&s1))
        .unwrap();
    assert_eq!(signal_rows(&l, &s1), 2);
    assert!(l.broker.cancel(&t, id).unwrap());
    assert!(
        wait_for(Duration::from_secs(20), || signal_rows(&l, &s1) == 0),
        "the head of a signal no job waits for was not swept"
    );
    assert_eq!(l.broker.signal(&t, &s2, b"x").unwrap(), 0);
    // Kept while young: a few rounds of the sweeper leave it.
    std::thread::sleep(Duration::from_secs(5));
    assert_eq!(signal_rows(&l, &s2), 1, "a signal was swept before its day");
    l.exec(&format!(
        "UPDATE sqlbroker_deps SET at = at - 86400001 WHERE parent_table = '!{s2}'"
    ));
    assert!(
        wait_for(Duration::from_secs(20), || signal_rows(&l, &s2) == 0),
        "a signal a day old was not swept"
    );
    forget(&l, &t, &[&s1, &s2]);
}
per_db!(signals_are_swept);

/// A table dropped by `drop_table` and made again under its name waits for its signals
/// afresh: a signal sent to the old table is not the new one's latch. Fails (the new job
/// `Ready` at its publish, and the signal releasing 0) with the signals' heads left by the
/// drop.
fn a_table_made_again_waits_for_its_signals_afresh(db: Db) {
    let Some(l) = common::live(db) else { return };
    let t = table(&l, Form::Lease);
    let s = name("again");
    assert_eq!(l.broker.signal(&t, &s, b"old").unwrap(), 0);
    l.broker.drop_table(&t).unwrap();
    l.broker.create_table(&t).unwrap();
    let id = l.broker.publish(&t, message("n").after_signal(&s)).unwrap();
    assert_eq!(
        state(&l, &t, id),
        Some(JobState::Waiting),
        "read the old latch"
    );
    assert_eq!(l.broker.signal(&t, &s, b"new").unwrap(), 1);
    assert_eq!(state(&l, &t, id), Some(JobState::Ready));
    forget(&l, &t, &[&s]);
}
per_db!(a_table_made_again_waits_for_its_signals_afresh);
