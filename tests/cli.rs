//! The `sqlbroker` command line tool, end to end: the built binary run as a process against the
//! live databases (cargo feature `cli`).

mod common;

use std::io::{Read, Write};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{live, next, unique, Db, Live};
use sqlbroker::Table;

const BIN: &str = env!("CARGO_BIN_EXE_sqlbroker");

/// Runs the tool with `args`, `DATABASE_URL` set to `url` (or unset), `stdin` as its input;
/// fails the test if it runs longer than `limit`.
fn run_within(url: Option<&str>, args: &[&str], stdin: &str, limit: Duration) -> Output {
    run_with_env(url, args, stdin, limit, &[])
}

/// [`run_within`] with `env` set besides.
fn run_with_env(
    url: Option<&str>,
    args: &[&str],
    stdin: &str,
    limit: Duration,
    env: &[(&str, &str)],
) -> Output {
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .envs(env.iter().copied())
        .env_remove("DATABASE_URL")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(url) = url {
        cmd.env("DATABASE_URL", url);
    }
    let mut child = cmd.spawn().expect("run sqlbroker");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    ended_within(
        child,
        limit,
        &format!("sqlbroker {args:?} ran longer than {limit:?}"),
    )
}

/// The child's output once it has ended, read while it runs: output past the pipe's buffer
/// (64 KiB) would block the child's writes until it was read, and the wait would end in the
/// limit. Past `limit` the child is killed and `what` fails the test.
fn ended_within(mut child: std::process::Child, limit: Duration, what: &str) -> Output {
    let start = Instant::now();
    let drain = |mut pipe: Box<dyn std::io::Read + Send>| {
        std::thread::spawn(move || {
            let mut out = Vec::new();
            pipe.read_to_end(&mut out).expect("read the child's output");
            out
        })
    };
    let stdout = drain(Box::new(child.stdout.take().unwrap()));
    let stderr = drain(Box::new(child.stderr.take().unwrap()));
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            panic!("{what}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output {
        status,
        stdout: stdout.join().unwrap(),
        stderr: stderr.join().unwrap(),
    }
}

fn run(url: Option<&str>, args: &[&str], stdin: &str) -> Output {
    run_within(url, args, stdin, Duration::from_secs(60))
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Runs and requires exit code 0.
fn ok(url: &str, args: &[&str], stdin: &str) -> String {
    let o = run(Some(url), args, stdin);
    assert_eq!(
        o.status.code(),
        Some(0),
        "sqlbroker {args:?}: {}{}",
        stdout(&o),
        stderr(&o)
    );
    stdout(&o)
}

/// `--help` of every command exits 0 and names the command's options.
#[test]
fn every_command_has_help_naming_its_options() {
    let cases: [(&[&str], &[&str]); 21] = [
        (
            &[],
            &[
                "--url",
                "DATABASE_URL",
                "--connect-timeout",
                "status",
                "dead",
                "create-table",
                "migrate",
                "publish",
                "pause",
                "resume",
            ],
        ),
        (&["pause"], &["--table"]),
        (&["signal"], &["--table", "--payload", "NAME"]),
        (&["resume"], &["--table"]),
        (&["forget"], &["--table"]),
        (&["limits"], &["--table", "--json"]),
        (&["limit"], &["--table", "--key", "--max", "--lift"]),
        (&["actions"], &["--limit", "--json"]),
        (&["library-schema"], &["--dialect"]),
        (
            &["migrate"],
            &["--table", "--lease", "--column", "--priorities", "--dedup"],
        ),
        (
            &["status"],
            &[
                "--table",
                "--json",
                "--lease",
                "--advisory-lock",
                "--column",
            ],
        ),
        (&["dead"], &["list", "requeue", "purge"]),
        (&["dead", "list"], &["--table", "--after", "--limit"]),
        (&["dead", "requeue"], &["--table", "--id", "--all"]),
        (&["dead", "purge"], &["--table", "--id", "--all"]),
        (
            &["create-table"],
            &[
                "--table",
                "--lease",
                "--column",
                "--fifo",
                "--priorities",
                "--dedup",
            ],
        ),
        (&["publish"], &["--table", "--set", "--delay"]),
        (&["completed"], &["list", "prune"]),
        (
            &["completed", "list"],
            &["--table", "--keep-completed", "--after", "--limit"],
        ),
        (&["completed", "prune"], &["--table", "--keep-completed"]),
        (
            &["bench"],
            &[
                "--jobs",
                "--form",
                "--ack",
                "--workers",
                "--handlers",
                "--mode",
                "--rate",
                "--secs",
                "--json",
            ],
        ),
    ];
    for (command, options) in cases {
        let mut args = command.to_vec();
        args.push("--help");
        let o = run(None, &args, "");
        assert_eq!(o.status.code(), Some(0), "{args:?}: {}", stderr(&o));
        let help = stdout(&o);
        for option in options {
            assert!(
                help.contains(option),
                "{args:?} does not name {option}:\n{help}"
            );
        }
    }
}

/// Usage errors exit 2 with clap's message; no database is touched.
#[test]
fn usage_errors_exit_2() {
    // No URL anywhere.
    let o = run(None, &["status", "--table", "jobs"], "");
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("DATABASE_URL"), "{}", stderr(&o));
    // Neither --id nor --all.
    let o = run(
        Some("sqlite::memory:"),
        &["dead", "purge", "--table", "jobs"],
        "",
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--all"), "{}", stderr(&o));
    // Both.
    let o = run(
        Some("sqlite::memory:"),
        &["dead", "requeue", "--table", "jobs", "--id", "1", "--all"],
        "",
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    // A column type that does not exist.
    let o = run(
        Some("sqlite::memory:"),
        &["create-table", "--table", "jobs", "--column", "n:decimal"],
        "",
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("unknown type"), "{}", stderr(&o));
    // Several databases, to a command that takes one (only the dashboard takes several).
    let o = run(
        None,
        &[
            "--url",
            "sqlite::memory:",
            "--url",
            "sqlite::memory:",
            "status",
        ],
        "",
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("only the dashboard takes several --url"),
        "{}",
        stderr(&o)
    );
}

/// A URL that cannot work exits 1 with `sqlbroker: <why>`, and a server that does not answer
/// costs the connect timeout, not more.
#[test]
fn bad_urls_exit_1_with_a_clear_message_in_time() {
    let o = run_within(
        None,
        &["--url", "redis://localhost/0", "status", "--table", "jobs"],
        "",
        Duration::from_secs(10),
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).starts_with("sqlbroker: invalid database url"),
        "{}",
        stderr(&o)
    );
    // Nothing listens on port 1.
    for url in [
        "postgres://postgres@127.0.0.1:1/test",
        "mysql://root@127.0.0.1:1/test",
    ] {
        let o = run_within(
            None,
            &[
                "--url",
                url,
                "--connect-timeout",
                "1",
                "status",
                "--table",
                "jobs",
            ],
            "",
            Duration::from_secs(10),
        );
        assert_eq!(o.status.code(), Some(1), "{url}");
        let err = stderr(&o);
        assert!(err.starts_with("sqlbroker: could not connect"), "{err}");
        assert!(
            err.to_lowercase().contains("refused"),
            "the cause is named: {err}"
        );
    }
}

/// Marks row `id` dead-lettered, directly.
fn kill_row(l: &Live, t: &str, id: i64) {
    let now = match l.db {
        Db::Postgres => "date_trunc('second', now())",
        Db::Mysql => "UTC_TIMESTAMP()",
        Db::Sqlite => "CAST(strftime('%s', 'now') AS INTEGER)",
    };
    l.exec(&format!(
        "UPDATE {t} SET dead_at = {now}, dead_reason = 'again' WHERE id = {id}"
    ));
}

/// create-table, publish from stdin, status, dead list / requeue / purge against a live
/// database, each checked in the table itself.
fn create_publish_and_dead_letters(db: Db) {
    let Some(l) = live(db) else { return };
    let url = l.url.clone();
    let name = unique("cli");
    l.track(&name);
    let desc = ["--table", name.as_str(), "--lease", "30", "--column", "k"];
    let with = |args: &[&str]| -> Vec<String> {
        args.iter()
            .chain(desc.iter())
            .map(|s| s.to_string())
            .collect()
    };
    let ok_with = |args: &[&str], stdin: &str| {
        let args = with(args);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        ok(&url, &args, stdin)
    };

    ok_with(&["create-table"], "");
    assert!(l.table_exists(&name));
    // Twice is fine: IF NOT EXISTS.
    ok_with(&["create-table"], "");
    // A later description with priorities: create-table refuses it (the column is missing),
    // migrate adds it, once.
    let args = with(&["create-table", "--priorities"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let refused = run(Some(&url), &args, "");
    assert_eq!(refused.status.code(), Some(1), "{}", stderr(&refused));
    assert!(
        stderr(&refused).contains("column priority is missing"),
        "{}",
        stderr(&refused)
    );
    let out = ok_with(&["migrate", "--priorities"], "");
    assert_eq!(
        out.trim(),
        format!("added column priority\nrebuilt index {name}_ready in priority order")
    );
    let out = ok_with(&["migrate", "--priorities"], "");
    assert!(out.contains("up to date"), "{out}");

    // From here the table's name alone: its recorded description (with priorities now).
    let only = |args: &[&str], stdin: &str| {
        let mut args = args.to_vec();
        args.extend(["--table", name.as_str()]);
        ok(&url, &args, stdin)
    };
    let out = only(&["publish", "--set", "k=cli"], "alpha\nbeta\n\ngamma\r\n");
    assert_eq!(out.trim(), "published 4 messages");

    // The rows, read through the library: one per line, in order, with the column set.
    let table = l.broker.open_table(&name).unwrap();
    assert_eq!(
        table,
        Table::new(name.as_str())
            .text_column("k")
            .lease(Duration::from_secs(30))
            .priorities()
    );
    let sub = l
        .broker
        .subscription(&table)
        .max_in_flight(4)
        .start()
        .unwrap();
    let mut got: Vec<_> = (0..4)
        .map(|_| next(&sub, Duration::from_secs(10)))
        .collect();
    got.sort_by_key(|d| d.id());
    let payloads: Vec<&[u8]> = got.iter().map(|d| d.payload()).collect();
    assert_eq!(payloads, [&b"alpha"[..], b"beta", b"", b"gamma"]);
    assert!(got
        .iter()
        .all(|d| d.get("k").and_then(|v| v.as_str()) == Some("cli")));
    let ids: Vec<i64> = got.iter().map(|d| d.id()).collect();
    let dead = ids[1];
    for d in got {
        if d.id() == dead {
            d.dead_letter("bad beta").unwrap();
        } else {
            // Due at once (`retry` waits the retry policy): `status` counts them ready.
            d.retry_after(Duration::ZERO).unwrap();
        }
    }
    sub.shutdown(Duration::from_secs(5)).unwrap();

    let json = only(&["status", "--json"], "");
    let head = format!(
        "[{{\"table\":\"{name}\",\"form\":\"lease\",\"ready\":3,\"scheduled\":0,\"in_flight\":0,\
         \"dead\":1,\"completed\":null,\"oldest_ready_secs\":"
    );
    let secs = json
        .trim()
        .strip_prefix(&head)
        .and_then(|r| r.strip_suffix(",\"paused\":false}]"));
    let secs: u64 = secs
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("{json}"));
    assert!(secs < 60, "{json}");
    let text = only(&["status"], "");
    let row: Vec<&str> = text.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(
        row[..9],
        [name.as_str(), "lease", "3", "-", "0", "-", "0", "1", "-"],
        "{text}"
    );

    // dead list: the dead row, and only it.
    let list = only(&["dead", "list"], "");
    let listed: Vec<i64> = list
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().next().unwrap().parse().unwrap())
        .collect();
    assert_eq!(listed, [dead], "{list}");
    assert!(list.contains("bad beta") && list.contains("beta"), "{list}");

    // requeue by id: live again, attempts reset; a second time finds no dead row: exit 1.
    let out = only(&["dead", "requeue", "--id", &dead.to_string()], "");
    assert_eq!(out.trim(), "requeued 1 dead-lettered row");
    assert_eq!(
        l.rows_where(
            &table,
            &format!("id = {dead} AND dead_at IS NULL AND attempts = 0")
        ),
        1
    );
    let dead_id = dead.to_string();
    let args = ["dead", "requeue", "--id", &dead_id, "--table", &name];
    let again = run(Some(&url), &args, "");
    assert_eq!(again.status.code(), Some(1));
    assert_eq!(
        stderr(&again).trim(),
        format!("sqlbroker: no dead-lettered row with id {dead} in table {name}")
    );

    // purge --all: the dead rows go, the live ones stay.
    kill_row(&l, &name, ids[3]);
    let out = only(&["dead", "purge", "--all"], "");
    assert_eq!(out.trim(), "purged 1 dead-lettered row");
    let left: Vec<i64> = l
        .ints(&format!(
            "SELECT id FROM {name} WHERE dead_at IS NULL ORDER BY id"
        ))
        .into_iter()
        .map(Option::unwrap)
        .collect();
    assert_eq!(left, [ids[0], ids[1], ids[2]]);
    assert_eq!(l.rows(&table), 3);
}
per_db!(create_publish_and_dead_letters);

/// `status` with only a URL lists every recorded table with its pause flag; `pause` and
/// `resume` take a name only; a description by flags that disagrees with the record, and a
/// name with no record, exit 1 with the library's error; `publish` says "1 message".
///
/// Fails (`status lists`) when `status` needs `--table` or ignores the registry, and
/// (`paused`) when the flag is not shown: tried with `"paused": false` written always.
/// `limits` lists a table's concurrency limits with what they count; `limit` sets a max or
/// lifts it, and every later read sees it; an unknown key fails (exit 1) and changes nothing;
/// neither --max nor --lift is a usage error (exit 2).
fn limits_listed_and_set(db: Db) {
    let Some(l) = live(db) else { return };
    let url = l.url.clone();
    let name = unique("cll");
    l.track(&format!("{name}_rates"));
    let t = l.create(
        sqlbroker::Table::new(&name)
            .text_column("k")
            .concurrency_limit("{k}", 2)
            .rate_limit("{k}", 10, Duration::from_secs(1))
            .lease(Duration::from_secs(30)),
    );
    l.broker
        .publish(&t, sqlbroker::Message::new(b"x".to_vec()).set("k", "a"))
        .unwrap();
    let text = ok(&url, &["limits", "--table", &name], "");
    let row: Vec<&str> = text.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(row, ["\"{k}\"", "2", "2", "0", "0"], "{text}");
    let rate: Vec<&str> = text.lines().nth(4).unwrap().split_whitespace().collect();
    assert_eq!(rate, ["\"{k}\"", "10", "1s", "10", "0", "0"], "{text}");
    let said = ok(
        &url,
        &["limit", "--table", &name, "--key", "{k}", "--max", "5"],
        "",
    );
    assert!(said.contains("limit \"{k}\" is now 5"), "{said}");
    let said = ok(
        &url,
        &[
            "limit", "--table", &name, "--key", "{k}", "--max", "3", "--rate",
        ],
        "",
    );
    assert!(said.contains("rate limit \"{k}\" is now 3"), "{said}");
    assert_eq!(
        ok(&url, &["limits", "--table", &name, "--json"], "").trim(),
        "[{\"kind\":\"concurrency\",\"key\":\"{k}\",\"max\":5,\"described\":2,\"in_work\":0,\"waiting\":0},\
         {\"kind\":\"rate\",\"key\":\"{k}\",\"max\":3,\"described\":10,\"in_work\":null,\"waiting\":0,\
         \"per_ms\":1000,\"claimed\":0}]"
    );
    ok(
        &url,
        &["limit", "--table", &name, "--key", "{k}", "--lift"],
        "",
    );
    assert_eq!(l.broker.concurrency_limits(&t).unwrap()[0].max, None);
    assert_eq!(l.broker.rate_limits(&t).unwrap()[0].max, Some(3));
    let o = run(
        Some(&url),
        &["limit", "--table", &name, "--key", "{x}", "--max", "1"],
        "",
    );
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("no concurrency limit"),
        "{}",
        stderr(&o)
    );
    let o = run(
        Some(&url),
        &[
            "limit", "--table", &name, "--key", "{k}", "--max", "0", "--rate",
        ],
        "",
    );
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert_eq!(l.broker.concurrency_limits(&t).unwrap()[0].max, None);
    assert_eq!(l.broker.rate_limits(&t).unwrap()[0].max, Some(3));
    let o = run(Some(&url), &["limit", "--table", &name, "--key", "{k}"], "");
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
}

per_db!(limits_listed_and_set);

fn status_pause_and_recorded_tables(db: Db) {
    let Some(l) = live(db) else { return };
    let url = l.url.clone();
    let (a, b) = (unique("cla"), unique("clb"));
    l.track(&a);
    l.track(&b);
    ok(
        &url,
        &[
            "create-table",
            "--table",
            &a,
            "--lease",
            "30",
            "--column",
            "k",
        ],
        "",
    );
    ok(
        &url,
        &[
            "create-table",
            "--table",
            &b,
            "--column",
            "k",
            "--advisory-lock",
            "b-{k}",
        ],
        "",
    );
    let out = ok(&url, &["publish", "--table", &a, "--set", "k=x"], "one\n");
    assert_eq!(out.trim(), "published 1 message");
    assert_eq!(
        ok(&url, &["pause", "--table", &a], "").trim(),
        format!("table {a} is paused")
    );

    let text = ok(&url, &["status"], "");
    let row = |name: &str| -> Vec<String> {
        text.lines()
            .find(|line| line.split_whitespace().next() == Some(name))
            .unwrap_or_else(|| panic!("status lists no {name}:\n{text}"))
            .split_whitespace()
            .map(String::from)
            .collect()
    };
    assert_eq!(
        row(&a)[..3],
        [a.clone(), "lease".into(), "1".into()],
        "{text}"
    );
    assert_eq!(
        row(&a).last().map(String::as_str),
        Some("yes"),
        "paused: {text}"
    );
    assert_eq!(
        row(&b)[1..3],
        ["advisory".to_string(), "lock".into()],
        "{text}"
    );
    assert_eq!(row(&b).last().map(String::as_str), Some("no"), "{text}");

    let json = ok(&url, &["status", "--json"], "");
    let all: serde_json::Value = serde_json::from_str(&json).unwrap();
    let find = |name: &str| {
        all.as_array()
            .unwrap()
            .iter()
            .find(|t| t["table"] == name)
            .unwrap_or_else(|| panic!("status --json lists no {name}: {json}"))
            .clone()
    };
    assert_eq!(find(&a)["paused"], true, "paused: {json}");
    assert_eq!(find(&a)["ready"], 1);
    assert_eq!(find(&b)["paused"], false);
    assert_eq!(find(&b)["form"], "advisory lock");

    // A recorded table dropped by hand: listed without counts, exit 0 (a shared server's
    // listing must not fail for a table someone else dropped); named, it is the error.
    // Fails (`ok` panics on exit 1) when one failed table fails the whole listing.
    let c = unique("clc");
    l.track(&c);
    ok(&url, &["create-table", "--table", &c, "--lease", "30"], "");
    l.exec(&format!("DROP TABLE {c}"));
    let text = ok(&url, &["status"], "");
    let gone = text
        .lines()
        .find(|line| line.split_whitespace().next() == Some(c.as_str()))
        .unwrap_or_else(|| panic!("status lists no {c}:\n{text}"));
    assert_eq!(
        gone.split_whitespace().skip(1).collect::<Vec<_>>(),
        ["lease", "-", "-", "-", "-", "-", "-", "-", "-", "-"],
        "{text}"
    );
    let json = ok(&url, &["status", "--json"], "");
    assert!(json.contains(&format!("\"table\":\"{c}\"")), "{json}");
    assert_eq!(
        run(Some(&url), &["status", "--table", &c], "")
            .status
            .code(),
        Some(1)
    );

    ok(&url, &["resume", "--table", &a], "");
    let json = ok(&url, &["status", "--table", &a, "--json"], "");
    assert!(json.contains("\"paused\":false"), "{json}");

    // Another description than the record: refused, naming the difference.
    let o = run(Some(&url), &["status", "--table", &a, "--column", "k"], "");
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("recorded as lease 30s, described as row lock"),
        "{}",
        stderr(&o)
    );
    // No record: exit 1, nothing paused.
    let nope = unique("nope");
    let o = run(Some(&url), &["pause", "--table", &nope], "");
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains(&format!("no description of table {nope} is recorded")),
        "{}",
        stderr(&o)
    );
}
per_db!(status_pause_and_recorded_tables);

/// A table that keeps completed rows: `completed list` shows them, `completed prune` deletes
/// only those past the retention; a table that does not keep them is refused (exit 1).
fn completed_list_and_prune(db: Db) {
    let Some(l) = live(db) else { return };
    let url = l.url.clone();
    let name = unique("cli");
    l.track(&name);
    let desc = [
        "--table",
        name.as_str(),
        "--lease",
        "30",
        "--keep-completed",
        "60",
    ];
    let with = |args: &[&str]| -> Vec<String> {
        args.iter()
            .chain(desc.iter())
            .map(|s| s.to_string())
            .collect()
    };
    let ok_with = |args: &[&str], stdin: &str| {
        let args = with(args);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        ok(&url, &args, stdin)
    };
    ok_with(&["create-table"], "");
    ok_with(&["publish"], "one\ntwo\nthree\n");
    let table = Table::new(name.as_str())
        .lease(Duration::from_secs(30))
        .keep_completed(Duration::from_secs(60));
    let sub = l
        .broker
        .subscription(&table)
        .max_in_flight(2)
        .start()
        .unwrap();
    let mut done: Vec<i64> = Vec::new();
    for _ in 0..2 {
        let d = next(&sub, Duration::from_secs(10));
        done.push(d.id());
        d.ack().unwrap();
    }
    sub.shutdown(Duration::from_secs(5)).unwrap();
    done.sort();

    let list = ok_with(&["completed", "list"], "");
    let listed: Vec<i64> = list
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().next().unwrap().parse().unwrap())
        .collect();
    assert_eq!(listed, done, "{list}");
    let text = ok_with(&["status"], "");
    let row: Vec<&str> = text.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(
        row[..9],
        [name.as_str(), "lease", "1", "-", "0", "-", "0", "0", "2"],
        "{text}"
    );

    // Nothing past the retention yet; then one row aged past it goes, and only it.
    assert_eq!(
        ok_with(&["completed", "prune"], "").trim(),
        "pruned 0 completed rows"
    );
    let back = match db {
        Db::Postgres => "completed_at - interval '120 seconds'",
        Db::Mysql => "completed_at - INTERVAL 120 SECOND",
        Db::Sqlite => "completed_at - 120",
    };
    l.exec(&format!(
        "UPDATE {name} SET completed_at = {back} WHERE id = {}",
        done[0]
    ));
    assert_eq!(
        ok_with(&["completed", "prune"], "").trim(),
        "pruned 1 completed row"
    );
    let left: Vec<i64> = l
        .ints(&format!(
            "SELECT id FROM {name} WHERE completed_at IS NOT NULL"
        ))
        .into_iter()
        .map(Option::unwrap)
        .collect();
    assert_eq!(left, [done[1]]);
    assert_eq!(l.rows(&table), 2, "the live row stays");

    // Described without --keep-completed: refused by the table's record, exit 1.
    let o = run(
        Some(&url),
        &["completed", "list", "--table", &name, "--lease", "30"],
        "",
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("keep_completed is recorded as 60s, described as unset"),
        "{}",
        stderr(&o)
    );
}
per_db!(completed_list_and_prune);

/// A publish from the command line is announced to other processes before the tool exits: the
/// broker's notify thread sends what it owes when the broker drops. A session listening on
/// the table's channel hears it (a notify thread cut short by the exit would stay silent).
#[cfg(feature = "postgres")]
#[test]
fn postgres_cli_publish_is_announced_before_exit() {
    use postgres::fallible_iterator::FallibleIterator;
    let Some(l) = live(Db::Postgres) else { return };
    let name = unique("cli_notify");
    l.track(&name);
    let desc = ["--table", name.as_str(), "--lease", "30"];
    ok(&l.url, &[&["create-table"][..], &desc].concat(), "");
    let mut ear = postgres::Client::connect(&l.url, postgres::NoTls).unwrap();
    ear.batch_execute(&format!("LISTEN \"sqlbroker_{name}\""))
        .unwrap();
    ok(&l.url, &[&["publish"][..], &desc].concat(), "one\n");
    let mut heard = ear.notifications();
    let got = heard
        .timeout_iter(Duration::from_secs(2))
        .next()
        .unwrap()
        .expect("no notification of the tool's publish");
    assert_eq!(got.channel(), format!("sqlbroker_{name}"));
}

/// `job` prints a job's state, failures and last error (text and `--json`), `cancel` removes
/// a queued job (exit 1 for one already gone), and `dead list` shows the last error.
fn job_cancel_and_last_errors(db: Db) {
    let Some(l) = live(db) else { return };
    let url = l.url.clone();
    let name = unique("cli");
    let table = l.create(
        Table::new(name.as_str())
            .text_column("k")
            .lease(Duration::from_secs(30)),
    );
    let desc = ["--table", name.as_str(), "--lease", "30", "--column", "k"];
    let args = |head: &[&str], tail: &[&str]| -> Vec<String> {
        head.iter()
            .chain(desc.iter())
            .chain(tail.iter())
            .map(|s| s.to_string())
            .collect()
    };
    let run_args = |head: &[&str], tail: &[&str]| {
        let a = args(head, tail);
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        run(Some(&url), &a, "")
    };
    let failing = l
        .broker
        .publish(&table, common::msg("failing", "x"))
        .unwrap();
    let queued = l
        .broker
        .publish(&table, common::msg("queued", "y"))
        .unwrap();
    let sub = l
        .broker
        .subscription(&table)
        .batch_size(1)
        .max_in_flight(1)
        .start()
        .unwrap();
    let d = next(&sub, Duration::from_secs(10));
    assert_eq!(d.id(), failing);
    d.fail("disk full").unwrap();
    sub.shutdown(Duration::from_secs(5)).unwrap();

    let id = failing.to_string();
    let o = run_args(&["job"], &[&id]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = stdout(&o);
    // Fails if `job` does not show the error history.
    for line in [
        "state: scheduled",
        "errors: 1",
        "last_error: disk full",
        "k: x",
    ] {
        assert!(text.lines().any(|l| l == line), "{line:?} in {text}");
    }
    // Fails if `job` leaves out the publish time (or shows none for a new table's row).
    assert!(
        text.lines()
            .any(|l| l.starts_with("published_at: ") && l != "published_at: -"),
        "{text}"
    );
    let o = run_args(&["job"], &[&id, "--json"]);
    let json: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("JSON");
    assert_eq!(json["id"], failing);
    assert_eq!(json["state"], "scheduled");
    assert_eq!(json["errors"], 1);
    assert_eq!(json["last_error"], "disk full");
    assert!(json["published_at"].is_string(), "{json}");
    assert_eq!(json["values"]["k"], "x");

    let q = queued.to_string();
    let o = run_args(&["cancel"], &[&q]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(stdout(&o).trim(), format!("cancelled job {queued}"));
    assert!(l.broker.job(&table, queued).unwrap().is_none());
    // Gone now: exit 1, with the reason.
    let o = run_args(&["cancel"], &[&q]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("no live or dead job"), "{}", stderr(&o));
    let o = run_args(&["job"], &[&q]);
    assert_eq!(o.status.code(), Some(1));

    // Dead-lettered after its failure: `dead list` shows the reason and the last error.
    l.exec(&format!(
        "UPDATE {name} SET dead_at = run_at, dead_reason = 'gave up' WHERE id = {failing}"
    ));
    let o = run_args(&["dead", "list"], &[]);
    let text = stdout(&o);
    assert!(text.contains("LAST_ERROR"), "{text}");
    let row = text
        .lines()
        .find(|r| r.starts_with(&id))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        row.contains("gave up") && row.contains("disk full"),
        "{row}"
    );
}
per_db!(job_cancel_and_last_errors);

/// A job waiting on another: `job` names what it waits on and what waits on a job (text and
/// `--json`), `status --json` counts it as waiting; fails if either is left out.
fn jobs_waiting_on_others(db: Db) {
    let Some(l) = live(db) else { return };
    let name = unique("clidep");
    let desc = ["--table", name.as_str(), "--lease", "30", "--dependencies"];
    ok(&l.url, &[&["create-table"][..], &desc].concat(), "");
    l.track(&name);
    let table = l.broker.open_table(&name).unwrap();
    let parent = l
        .broker
        .publish(&table, sqlbroker::Message::new(b"p".to_vec()))
        .unwrap();
    let child = l
        .broker
        .publish(&table, sqlbroker::Message::new(b"c".to_vec()).after(parent))
        .unwrap();
    let (p, c) = (parent.to_string(), child.to_string());
    let text = ok(&l.url, &["job", "--table", &name, &c], "");
    for line in [
        "state: waiting".to_string(),
        format!("waits_on: {p} (pending)"),
    ] {
        assert!(text.lines().any(|l| l == line), "{line:?} in {text}");
    }
    let text = ok(&l.url, &["job", "--table", &name, &p], "");
    let line = format!("dependents: {c}");
    assert!(text.lines().any(|l| l == line), "{line:?} in {text}");
    let json: serde_json::Value =
        serde_json::from_str(&ok(&l.url, &["job", "--table", &name, &c, "--json"], ""))
            .expect("JSON");
    assert_eq!(json["state"], "waiting");
    assert_eq!(json["waits_on"][0]["id"], parent);
    assert!(json["waits_on"][0]["outcome"].is_null(), "{json}");
    let status: serde_json::Value =
        serde_json::from_str(&ok(&l.url, &["status", "--table", &name, "--json"], ""))
            .expect("JSON");
    assert_eq!(
        (status[0]["waiting"].as_u64(), status[0]["ready"].as_u64()),
        (Some(1), Some(1))
    );
    l.forget_deps(&name);
}
per_db!(jobs_waiting_on_others);

/// `signal` releases the jobs waiting for it and says how many; `job` names the signal a job
/// waits for and whether it came (text and `--json`); a second `signal` releases none and
/// the payload the job reads is the first. Fails if the command releases nothing or `job`
/// leaves the wait out.
fn signal_command(db: Db) {
    let Some(l) = live(db) else { return };
    let name = unique("clisig");
    let desc = ["--table", name.as_str(), "--lease", "30", "--dependencies"];
    ok(&l.url, &[&["create-table"][..], &desc].concat(), "");
    l.track(&name);
    let table = l.broker.open_table(&name).unwrap();
    let signal = format!("approved:{}", unique("s"));
    let id = l
        .broker
        .publish(
            &table,
            sqlbroker::Message::new(b"order".to_vec()).after_signal(&signal),
        )
        .unwrap();
    let text = ok(&l.url, &["job", "--table", &name, &id.to_string()], "");
    let line = format!("waits_for_signal: {signal} (waiting)");
    assert!(text.lines().any(|l| l == line), "{line:?} in {text}");
    let out = ok(
        &l.url,
        &["signal", "--table", &name, &signal, "--payload", "yes"],
        "",
    );
    assert!(out.contains("1 job(s) released"), "{out}");
    let out = ok(
        &l.url,
        &["signal", "--table", &name, &signal, "--payload", "no"],
        "",
    );
    assert!(out.contains("0 job(s) released"), "{out}");
    let json: serde_json::Value = serde_json::from_str(&ok(
        &l.url,
        &["job", "--table", &name, &id.to_string(), "--json"],
        "",
    ))
    .expect("JSON");
    assert_eq!(json["state"], "ready");
    assert_eq!(json["waits_for_signal"]["name"], signal.as_str());
    assert_eq!(json["waits_for_signal"]["state"], "came");
    let sub = l.broker.subscription(&table).start().unwrap();
    let d = common::next(&sub, Duration::from_secs(10));
    assert_eq!(d.signal().unwrap().payload(), b"yes");
    d.ack().unwrap();
    sub.shutdown(Duration::from_secs(10)).unwrap();
    let o = run(Some(&l.url), &["signal", "--table", &name, "bad name"], "");
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    l.forget_deps(&name);
    l.forget_deps(&format!("!{signal}"));
}
per_db!(signal_command);

/// The commands that change jobs or a table's settings write the action log, naming the
/// login from `USER` as the command line's; `actions` lists it, newest first, escaped as text
/// and whole as JSON. A failing requeue is recorded for none of its ids.
///
/// The listing is longer than a pipe holds (200 older entries of 400 characters), so the
/// harness must read it while the tool runs.
///
/// Fails (the entries missing) when the commands do not record (tried), (`actions prints
/// "\u{1b}" raw`) when the text table prints `who` as stored, and (`ran longer than 60s`)
/// when the harness reads the output only once the tool has ended (tried: CI's shared log
/// had grown past 64 KiB and the tool blocked on its write).
fn the_cli_writes_the_action_log(db: Db) {
    let Some(l) = live(db) else { return };
    let name = unique("cli_log");
    let table = l.create(
        Table::new(name.as_str())
            .text_column("k")
            .concurrency_limit("{k}", 2)
            .lease(Duration::from_secs(30)),
    );
    let ids: Vec<i64> = (0..2)
        .map(|i| {
            l.broker
                .publish(&table, common::msg(&format!("j{i}"), "x"))
                .unwrap()
        })
        .collect();
    kill_row(&l, &name, ids[1]);
    // Older entries enough to make a listing longer than a pipe holds (64 KiB).
    let filler = "x".repeat(400);
    for _ in 0..200 {
        l.broker
            .record_action("filler", "note", "elsewhere", &filler, 0)
            .unwrap();
    }
    let user = format!("ana\x1b]0;pwned\x07-{}", unique("u"));
    let desc = ["--table", name.as_str()];
    let as_user = |args: &[&str], desc: &[&str]| {
        let args: Vec<&str> = args.iter().chain(desc.iter()).copied().collect();
        let env = [("USER", user.as_str()), ("LOGNAME", "")];
        let o = run_with_env(Some(&l.url), &args, "", Duration::from_secs(60), &env);
        assert_eq!(o.status.code(), Some(0), "{args:?}: {}", stderr(&o));
        assert!(!stderr(&o).contains("action log"), "{}", stderr(&o));
    };
    as_user(&["cancel", &ids[0].to_string()], &desc);
    as_user(&["dead", "requeue", "--id", &ids[1].to_string()], &desc);
    as_user(&["pause"], &desc);
    as_user(&["resume"], &desc);
    as_user(&["limit", "--key", "{k}", "--max", "5"], &desc);
    let missing: Vec<&str> = ["dead", "requeue", "--id", "999999999"]
        .iter()
        .chain(desc.iter())
        .copied()
        .collect();
    let missing = run(Some(&l.url), &missing, "");
    assert_eq!(missing.status.code(), Some(1), "{}", stderr(&missing));
    let json: serde_json::Value =
        serde_json::from_str(&ok(&l.url, &["actions", "--json", "--limit", "500"], ""))
            .expect("JSON");
    let mine: Vec<(String, String, u64)> = json
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["table"] == name.as_str())
        .map(|a| {
            assert_eq!(a["who"], format!("{user} with the CLI").as_str(), "{a}");
            assert!(a["at"].as_str().unwrap().ends_with('Z'), "{a}");
            let text = |k: &str| a[k].as_str().unwrap().to_string();
            (text("action"), text("detail"), a["rows"].as_u64().unwrap())
        })
        .collect();
    let expect = |action: &str, detail: String, rows: u64| (action.to_string(), detail, rows);
    assert_eq!(
        mine,
        [
            expect("limit", r#"key "{k}" now 5"#.into(), 0),
            expect("resume", String::new(), 0),
            expect("pause", String::new(), 0),
            expect("requeue", format!("jobs {}", ids[1]), 1),
            expect("cancel", format!("job {}", ids[0]), 1),
        ]
    );
    let text = run(Some(&l.url), &["actions", "--limit", "500"], "");
    assert_eq!(text.status.code(), Some(0), "{}", stderr(&text));
    assert_no_raw_controls("actions", &text.stdout);
    let out = stdout(&text);
    assert!(out.len() > 64 * 1024, "{} bytes", out.len());
    assert!(out.starts_with("AT"), "{out}");
    assert!(out.contains("ana\\u{1b}]0;pwned\\u{7}-"), "{out}");
}
per_db!(the_cli_writes_the_action_log);

/// `create-table --outputs --checkpoints --traceparent` makes the columns; `job` shows the
/// output, the checkpoint and the trace context (text, escaped, and `--json`); fails if any
/// is left out.
fn job_output_and_checkpoint(db: Db) {
    let Some(l) = live(db) else { return };
    let name = unique("cliout");
    let desc = [
        "--table",
        name.as_str(),
        "--lease",
        "30",
        "--outputs",
        "--checkpoints",
        "--traceparent",
        "--keep-completed",
        "1h",
    ];
    ok(&l.url, &[&["create-table"][..], &desc].concat(), "");
    l.track(&name);
    let table = l.broker.open_table(&name).unwrap();
    assert!(table.has_outputs() && table.has_checkpoints() && table.has_traceparent());
    let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let id = l
        .broker
        .publish(
            &table,
            sqlbroker::Message::new(b"p".to_vec()).traceparent(tp),
        )
        .unwrap();
    let sub = l.broker.subscription(&table).start().unwrap();
    let d = sub
        .next_delivery_timeout(std::time::Duration::from_secs(10))
        .unwrap();
    d.checkpoint(b"page 7").unwrap();
    d.set_output(b"42 rows\x1b]0;t\x07").unwrap();
    d.ack().unwrap();
    sub.close();
    let text = ok(&l.url, &["job", "--table", &name, &id.to_string()], "");
    let traced = format!("traceparent: {tp}");
    for line in [
        "output: 42 rows\\u{1b}]0;t\\u{7}",
        "checkpoint: page 7",
        traced.as_str(),
    ] {
        assert!(text.lines().any(|l| l == line), "{line:?} in {text}");
    }
    let json: serde_json::Value = serde_json::from_str(&ok(
        &l.url,
        &["job", "--table", &name, &id.to_string(), "--json"],
        "",
    ))
    .expect("JSON");
    assert_eq!(
        (json["output"].as_str(), json["checkpoint"].as_str()),
        (Some("42 rows\x1b]0;t\x07"), Some("page 7"))
    );
    assert_eq!(json["traceparent"].as_str(), Some(tp));
    // `publish --trace` stores it on every message; a malformed one is refused and
    // publishes nothing.
    let other = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    ok(
        &l.url,
        &["publish", "--table", &name, "--trace", other],
        "a\nb\n",
    );
    let jobs = l
        .broker
        .jobs(&table, sqlbroker::JobState::Ready, None, 10)
        .unwrap();
    assert_eq!(jobs.len(), 2);
    for j in &jobs {
        let j = l.broker.job(&table, j.id()).unwrap().unwrap();
        assert_eq!(j.traceparent(), Some(other), "{j:?}");
    }
    let o = run(
        Some(&l.url),
        &["publish", "--table", &name, "--trace", "00-xyz"],
        "c\n",
    );
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("traceparent"), "{}", stderr(&o));
    assert_eq!(
        l.broker
            .jobs(&table, sqlbroker::JobState::Ready, None, 10)
            .unwrap()
            .len(),
        2
    );
}
per_db!(job_output_and_checkpoint);

/// Text a remote party can write (a handler's error made of an SMTP reply, a payload, a text
/// column): it sets the terminal title (OSC), forges a line (CR LF), reorders the line (a
/// bidi override) and breaks it (U+2028, NEL), with DEL besides.
const HOSTILE: &str = "\x1b]0;pwned\x07\r\nstate: completed\u{202e}x\u{2028}y\u{85}z\x7f";

/// What must not reach the terminal raw: ESC, BEL, CR, DEL, and the UTF-8 of U+202E, U+2028,
/// U+0085.
fn assert_no_raw_controls(what: &str, out: &[u8]) {
    let text = String::from_utf8_lossy(out);
    for bad in [
        "\x1b", "\x07", "\r", "\x7f", "\u{202e}", "\u{2028}", "\u{85}",
    ] {
        assert!(!text.contains(bad), "{what} prints {bad:?} raw: {text:?}");
    }
    assert!(
        !text.lines().any(|l| l.trim() == "state: completed"),
        "{what} prints a forged line: {text}"
    );
}

/// `job`, `job --json`, `dead list` and `dead list --json` print stored text escaped: the
/// last error, the dead reason, the payload and a text column holding [`HOSTILE`]; the JSON
/// still reads back as the very text.
///
/// Fails (`job prints "\u{1b}" raw`) when `job` prints `last_error` as stored (tried), and
/// (`job --json prints "\u{202e}" raw`) when JSON is serde_json's alone (tried).
fn stored_text_is_printed_escaped(db: Db) {
    let Some(l) = live(db) else { return };
    let url = l.url.clone();
    let name = unique("cli_esc");
    let table = l.create(
        Table::new(name.as_str())
            .text_column("k")
            .lease(Duration::from_secs(30)),
    );
    let id = l
        .broker
        .publish(&table, common::msg(HOSTILE, HOSTILE))
        .unwrap();
    l.exec(&format!(
        "UPDATE {name} SET last_error = '{HOSTILE}', dead_reason = '{HOSTILE}', errors = 1, \
         dead_at = run_at WHERE id = {id}"
    ));
    let id = id.to_string();
    let base = ["--table", name.as_str()];
    for (what, args) in [
        ("job", vec!["job", &id]),
        ("job --json", vec!["job", &id, "--json"]),
        ("dead list", vec!["dead", "list"]),
        ("dead list --json", vec!["dead", "list", "--json"]),
    ] {
        let args: Vec<&str> = args.into_iter().chain(base).collect();
        let o = run(Some(&url), &args, "");
        assert_eq!(o.status.code(), Some(0), "{what}: {}", stderr(&o));
        assert_no_raw_controls(what, &o.stdout);
        assert_no_raw_controls(what, &o.stderr);
        if what.ends_with("--json") {
            let json: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
            let one = if json.is_array() { &json[0] } else { &json };
            assert_eq!(one["last_error"], HOSTILE, "{json}");
            assert_eq!(one["dead_reason"], HOSTILE, "{json}");
            assert_eq!(one["payload"], HOSTILE, "{json}");
            assert_eq!(one["values"]["k"], HOSTILE, "{json}");
        } else {
            // Escaped, not dropped: the text is there, as Rust writes escapes.
            let text = stdout(&o);
            assert!(
                text.contains(r"\u{1b}]0;pwned\u{7}\r\nstate: completed\u{202e}x"),
                "{text}"
            );
        }
    }
    // `job` on its own lines: one `state:` line, the job's own.
    let o = run(Some(&url), &["job", &id, "--table", &name], "");
    let states: Vec<&str> = std::str::from_utf8(&o.stdout)
        .unwrap()
        .lines()
        .filter(|l| l.starts_with("state:"))
        .collect();
    assert_eq!(states, ["state: dead"]);
}
per_db!(stored_text_is_printed_escaped);

/// A mistyped SQLite path: every command that only reads (and the ones that act on a table,
/// which needs a record) says the file does not exist, exit 1, and makes no file; only
/// `create-table` and `migrate` make one.
///
/// Fails (the exit code: `left: Some(0)` for `status`) when the tool opens the path as it is
/// (tried: `status` made the file and printed nothing, exit 0); `made typo.db` guards the rest.
#[test]
fn a_missing_sqlite_file_is_refused_not_made() {
    let dir = std::env::temp_dir()
        .join("sqlbroker-tests")
        .join(unique("typo"));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("typo.db");
    let path = file.display().to_string();
    for url in [
        format!("sqlite:{path}"),
        format!("sqlite://{path}"),
        format!("SQLITE:{path}"),
    ] {
        for args in [
            &["status"][..],
            &["status", "--table", "jobs"],
            &["job", "--table", "jobs", "1"],
            &["dead", "list", "--table", "jobs"],
            &["completed", "list", "--table", "jobs"],
            &["cancel", "--table", "jobs", "1"],
            &["pause", "--table", "jobs"],
            &["publish", "--table", "jobs"],
            &["schema", "--table", "jobs"],
            &["schema", "--dialect", "sqlite", "--table", "jobs"],
            &["dashboard", "--listen", "127.0.0.1:0"],
        ] {
            // A build without the dashboard refuses the command itself (exit 2).
            if args[0] == "dashboard" && !cfg!(feature = "dashboard") {
                continue;
            }
            let o = run_within(Some(&url), args, "", Duration::from_secs(20));
            assert_eq!(o.status.code(), Some(1), "{url} {args:?}: {}", stderr(&o));
            assert_eq!(
                stderr(&o).lines().last().unwrap_or_default(),
                format!(
                    "sqlbroker: the SQLite database file {path} does not exist (check the path \
                     in --url or DATABASE_URL; create-table or migrate makes a new one)"
                ),
                "{url} {args:?}"
            );
            assert!(!file.exists(), "{url} {args:?} made typo.db");
        }
    }
    // In memory: nothing to look for.
    let o = run(Some("sqlite::memory:"), &["status"], "");
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    // The commands that make tables make the file.
    let url = format!("sqlite:{path}");
    ok(
        &url,
        &["create-table", "--table", "jobs", "--lease", "30"],
        "",
    );
    assert!(file.exists());
    ok(&url, &["status"], "");
    let other = dir.join("other.db");
    ok(
        &format!("sqlite:{}", other.display()),
        &["migrate", "--table", "jobs", "--lease", "30"],
        "",
    );
    assert!(other.exists());
    let _ = std::fs::remove_dir_all(&dir);
}

/// Durations as `humantime` spells them (and plain seconds), ids positionally or as `--id`
/// alike, counts in the singular for one.
///
/// Fails (`--lease 30s`) when durations are parsed as integers (tried: "invalid digit"),
/// (`dead requeue 17`) when only `--id` is taken, (`requeued 1 dead-lettered row`) with the
/// old plural.
fn durations_ids_and_counts(db: Db) {
    let Some(l) = live(db) else { return };
    let url = l.url.clone();
    let name = unique("cli_dur");
    l.track(&name);
    let t = ["--table", name.as_str()];
    ok(
        &url,
        &[
            &[
                "create-table",
                "--lease",
                "1m 30s",
                "--keep-completed",
                "2h",
            ][..],
            &t,
        ]
        .concat(),
        "",
    );
    let table = l.broker.open_table(&name).unwrap();
    assert_eq!(
        table,
        Table::new(name.as_str())
            .lease(Duration::from_secs(90))
            .keep_completed(Duration::from_secs(7_200)),
        "--lease 1m 30s, --keep-completed 2h"
    );
    // Plain seconds still work, and mean the same.
    ok(
        &url,
        &[
            &["status", "--lease", "90", "--keep-completed", "7200"][..],
            &t,
        ]
        .concat(),
        "",
    );
    let out = ok(
        &url,
        &[&["publish", "--delay", "10m"][..], &t].concat(),
        "a\nb\nc\n",
    );
    assert_eq!(out.trim(), "published 3 messages");
    let json: serde_json::Value =
        serde_json::from_str(&ok(&url, &[&["status", "--json"][..], &t].concat(), "")).unwrap();
    assert_eq!(json[0]["scheduled"], 3, "--delay 10m: {json}");
    let ids: Vec<i64> = l
        .ints(&format!("SELECT id FROM {name} ORDER BY id"))
        .into_iter()
        .map(Option::unwrap)
        .collect();
    let [a, b, c] = [ids[0], ids[1], ids[2]].map(|i| i.to_string());
    // job: positionally and as --id, the same; both at once is a usage error.
    let positional = ok(&url, &[&["job", a.as_str()][..], &t].concat(), "");
    let flag = ok(&url, &[&["job", "--id", a.as_str()][..], &t].concat(), "");
    assert_eq!(positional, flag);
    let o = run(
        Some(&url),
        &[&["job", a.as_str(), "--id", a.as_str()][..], &t].concat(),
        "",
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let out = ok(
        &url,
        &[&["cancel", "--id", c.as_str()][..], &t].concat(),
        "",
    );
    assert_eq!(out.trim(), format!("cancelled job {c}"));
    // dead requeue/purge: positionally, as --id, or both; one row is "1 ... row".
    kill_row(&l, &name, ids[0]);
    kill_row(&l, &name, ids[1]);
    let out = ok(
        &url,
        &[&["dead", "requeue", a.as_str()][..], &t].concat(),
        "",
    );
    assert_eq!(out.trim(), "requeued 1 dead-lettered row");
    kill_row(&l, &name, ids[0]);
    let out = ok(
        &url,
        &[&["dead", "purge", a.as_str(), "--id", b.as_str()][..], &t].concat(),
        "",
    );
    assert_eq!(out.trim(), "purged 2 dead-lettered rows");
    let o = run(
        Some(&url),
        &[&["dead", "list", "--json"][..], &t].concat(),
        "",
    );
    assert_eq!(stdout(&o).trim(), "[]");
    assert_eq!(stderr(&o).trim(), "0 dead-lettered rows listed");
}
per_db!(durations_ids_and_counts);

/// Each cause of an error is told once: MySQL's driver error is not repeated in its
/// `MySqlError { .. }` wrapping, PostgreSQL's server message is not followed by "db error".
///
/// Fails (`told once`) with the old chain (tried: "..: ERROR 1049 (42000): Unknown database
/// 'nodb': MySqlError { ERROR 1049 (42000): Unknown database 'nodb' }").
#[test]
fn errors_tell_each_cause_once() {
    for (db, told) in [
        (Db::Mysql, "Unknown database"),
        (Db::Postgres, "does not exist"),
    ] {
        let Some(l) = live(db) else { continue };
        let missing = unique("nodb");
        let url = match l.url.rsplit_once('/') {
            Some((server, _)) => format!("{server}/{missing}"),
            None => unreachable!("{}", l.url),
        };
        let o = run(Some(&url), &["status"], "");
        assert_eq!(o.status.code(), Some(1));
        let err = stderr(&o);
        assert_eq!(err.matches(told).count(), 1, "{db:?}: told once: {err}");
        assert!(err.contains(&missing), "{err}");
        assert!(
            !err.contains("MySqlError") && !err.contains("db error"),
            "{err}"
        );
    }
}

/// `dashboard` in a build without the `dashboard` feature names the feature and how to build
/// it, instead of clap's "unrecognized subcommand" (exit 2, a usage error). Run with
/// `cargo test --no-default-features --features cli,sqlite --test cli dashboard_`.
///
/// Fails (`names the feature`) without the hidden subcommand (tried).
#[cfg(not(feature = "dashboard"))]
#[test]
fn dashboard_without_the_feature_says_how_to_get_it() {
    let o = run(
        Some("sqlite::memory:"),
        &["dashboard", "--listen", "127.0.0.1:0"],
        "",
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("built without the `dashboard` feature")
            && err.contains("--features dashboard"),
        "names the feature: {err}"
    );
}

/// With the feature, `dashboard` is a command of its own (its help names its options).
#[cfg(feature = "dashboard")]
#[test]
fn dashboard_with_the_feature_is_a_command() {
    let o = run(None, &["dashboard", "--help"], "");
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).contains("--listen"), "{}", stdout(&o));
}

/// The value after `label` on its line of `bench`'s output, as a number.
fn figure(out: &str, label: &str) -> f64 {
    let line = out
        .lines()
        .find(|l| l.starts_with(label))
        .unwrap_or_else(|| panic!("no {label:?} line in:\n{out}"));
    let value = line[label.len()..].split_whitespace().next().unwrap_or("");
    value
        .parse()
        .unwrap_or_else(|e| panic!("{label:?}: {value:?} is not a number ({e}):\n{out}"))
}

/// `bench` runs a burn-down and a steady run on a scratch table of the form asked, prints
/// jobs/s, publish-to-start p50/p99 and client CPU per job (positive numbers), works every
/// job the steady run published, and leaves neither the table nor its record behind.
///
/// Fails (`table gone`) when the scratch table is not dropped: tried with `Scratch`'s drop
/// skipped.
fn bench_runs_and_drops_its_table(db: Db, form: sqlbroker::Form) {
    let Some(l) = live(db) else { return };
    let form = match form {
        sqlbroker::Form::Lease => "lease",
        sqlbroker::Form::RowLock => "row-lock",
        _ => "advisory",
    };
    let args = [
        "bench", "--jobs", "300", "--mode", "both", "--secs", "2", "--rate", "100", "--form", form,
    ];
    let o = run_within(Some(&l.url), &args, "", Duration::from_secs(120));
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(0), "{args:?}: {out}{}", stderr(&o));
    // Not a terminal: no progress line.
    assert_eq!(stderr(&o), "", "{out}");
    for label in [
        "burn-down jobs/s:",
        "burn-down client CPU us/job:",
        "steady publish-to-start p50 ms:",
        "steady publish-to-start p99 ms:",
        "steady client CPU us/job:",
    ] {
        let n = figure(&out, label);
        assert!(n > 0.0, "{label} {n}:\n{out}");
    }
    assert!(
        figure(&out, "steady publish-to-start p99 ms:")
            >= figure(&out, "steady publish-to-start p50 ms:")
    );
    let published = figure(&out, "steady published:");
    assert_eq!(published, 200.0, "{out}");
    assert_eq!(figure(&out, "steady worked:"), published, "{out}");
    assert_eq!(figure(&out, "burn-down:"), 300.0, "{out}");
    // The scratch table, by the name the output gives.
    let name = out
        .split("scratch table ")
        .nth(1)
        .and_then(|rest| rest.split(',').next())
        .unwrap_or_else(|| panic!("no scratch table named in:\n{out}"))
        .to_string();
    assert!(name.starts_with("sqlbroker_bench_"), "{name}");
    // The server by its own name: MariaDB is not "MySQL".
    // Fails while bench calls MariaDB "MySQL".
    assert!(
        out.starts_with(&format!("bench on {}:", server_name(&l))),
        "{out}"
    );
    assert!(!l.table_exists(&name), "table gone: {name} is still there");
    assert_eq!(
        l.int(&format!(
            "SELECT COUNT(*) FROM sqlbroker_tables WHERE name = '{name}'"
        )),
        0,
        "its record is gone"
    );
    if db == Db::Sqlite {
        // The test's own file: nothing of the run's is left, indexes included.
        let left = "SELECT COUNT(*) FROM sqlite_master WHERE name LIKE 'sqlbroker_bench%'";
        assert_eq!(l.int(left), 0);
    }
}
per_db_form!(bench_runs_and_drops_its_table);

/// `bench --json`: one object with both runs' figures.
#[test]
fn bench_json_on_sqlite() {
    let Some(l) = live(Db::Sqlite) else { return };
    let args = [
        "bench",
        "--jobs",
        "200",
        "--mode",
        "burn-down",
        "--ack",
        "batch",
        "--json",
    ];
    let out = ok(&l.url, &args, "");
    let v: serde_json::Value = serde_json::from_str(out.trim()).expect(&out);
    assert_eq!(v["form"], "lease");
    assert_eq!(v["ack"], "batch");
    assert_eq!(v["burn_down"]["jobs"], 200);
    assert!(
        v["burn_down"]["jobs_per_sec"].as_f64().unwrap() > 0.0,
        "{out}"
    );
    assert!(v.get("steady").is_none(), "{out}");
    let name = v["table"].as_str().unwrap();
    assert!(!l.table_exists(name));
}

/// `bench --mode steady` with no `--rate` measures the rate with a 2,000-job burn-down (said
/// on stderr, not reported) and publishes at half of it.
#[test]
fn bench_steady_alone_measures_its_rate() {
    let Some(l) = live(Db::Sqlite) else { return };
    let args = [
        "bench", "--mode", "steady", "--secs", "1", "--ack", "deferred",
    ];
    let o = run_within(Some(&l.url), &args, "", Duration::from_secs(120));
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(0), "{out}{}", stderr(&o));
    assert!(
        stderr(&o).contains("a 2000-job burn-down measured"),
        "{}",
        stderr(&o)
    );
    assert!(!out.contains("burn-down"), "{out}");
    let asked = figure(&out, "steady:");
    assert!(asked >= 1.0, "{out}");
    assert_eq!(figure(&out, "steady published:"), asked, "{out}");
    assert_eq!(figure(&out, "steady worked:"), asked, "{out}");
    assert!(
        figure(&out, "steady publish-to-start p99 ms:") > 0.0,
        "{out}"
    );
}

/// Ctrl-C during a run ends it with an error (exit 1) and still drops the scratch table: the
/// error path's drop.
///
/// Fails (exit code `None`: killed by the signal, the table left) when the signal is left to
/// end the process: tried with the handler not installed.
#[cfg(unix)]
#[test]
fn bench_interrupted_drops_its_table() {
    let Some(l) = live(Db::Sqlite) else { return };
    let mut child = spawn_bench(&l, "200000", &[]);
    let made =
        "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name LIKE 'sqlbroker_bench%'";
    let start = Instant::now();
    while l.int(made) == 0 {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no scratch table made"
        );
        assert!(
            child.try_wait().unwrap().is_none(),
            "ended before its table"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // SAFETY: a signal to the child this test started.
    assert_eq!(
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) },
        0
    );
    let o = ended(child, "bench did not end on Ctrl-C");
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("interrupted"), "{}", stderr(&o));
    assert_eq!(l.int(made), 0, "dropped on Ctrl-C");
}

/// A run where no job is done for `--stall` seconds (its table paused by an operator) ends
/// with an error (exit 1) saying so, and drops its table.
#[test]
fn bench_gives_up_when_nothing_is_done() {
    let Some(l) = live(Db::Sqlite) else { return };
    let mut child = spawn_bench(&l, "100000", &["--stall", "2"]);
    let start = Instant::now();
    let scratch = loop {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no scratch table made"
        );
        assert!(
            child.try_wait().unwrap().is_none(),
            "ended before its table"
        );
        let made = l.broker.tables().unwrap_or_default();
        if let Some(t) = made
            .into_iter()
            .find(|r| r.table.name().starts_with("sqlbroker_bench_"))
        {
            break t.table;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    l.broker.pause(&scratch).unwrap();
    let o = ended(child, "bench did not give up");
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("no job done for 2 s"), "{}", stderr(&o));
    assert!(!l.table_exists(scratch.name()), "dropped");
}

/// `bench --mode burn-down` of `jobs` jobs (and `more` options) on `l`, its output piped.
fn spawn_bench(l: &common::Live, jobs: &str, more: &[&str]) -> std::process::Child {
    Command::new(BIN)
        .args([
            "--url",
            &l.url,
            "bench",
            "--jobs",
            jobs,
            "--mode",
            "burn-down",
        ])
        .args(more)
        .env_remove("DATABASE_URL")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run sqlbroker")
}

/// The child's output once it has ended, within a minute (else killed: `what` failed).
fn ended(child: std::process::Child, what: &str) -> Output {
    ended_within(child, Duration::from_secs(60), what)
}

/// `bench --ack deferred` with another form than lease is a usage error (exit 2) before
/// anything is made: no scratch table, not even the registry.
#[test]
fn bench_refuses_deferred_acks_off_the_lease_form() {
    let Some(l) = live(Db::Sqlite) else { return };
    let before = l.table_count();
    for form in ["row-lock", "advisory"] {
        let o = run(
            Some(&l.url),
            &["bench", "--ack", "deferred", "--form", form, "--jobs", "10"],
            "",
        );
        assert_eq!(o.status.code(), Some(2), "{form}: {}", stderr(&o));
        assert!(
            stderr(&o).contains("--ack deferred needs --form lease"),
            "{}",
            stderr(&o)
        );
        assert_eq!(stdout(&o), "");
    }
    assert_eq!(l.table_count(), before, "nothing made");
    // Neither is a form that does not exist.
    let o = run(Some(&l.url), &["bench", "--form", "queue"], "");
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    // An option the mode does not use is refused, not ignored.
    for (args, why) in [
        (
            &["--mode", "burn-down", "--rate", "10"][..],
            "--rate and --secs are the steady run's",
        ),
        (
            &["--mode", "burn-down", "--secs", "5"][..],
            "--rate and --secs are the steady run's",
        ),
        (
            &["--mode", "steady", "--jobs", "10"][..],
            "--jobs is the burn-down's",
        ),
    ] {
        let o = run(Some(&l.url), &[&["bench"][..], args].concat(), "");
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(why), "{args:?}: {}", stderr(&o));
    }
    assert_eq!(l.table_count(), before, "nothing made");
}

// ---- The operator's tools (issue 38) ----

/// A lease table with a concurrency limit of one per `{k}` and dependencies, mid-run: one job
/// of key "a" in a handler's hands, two more of "a" held back by the limit, one of "b" ready,
/// and one waiting on that "b" job. Returns the table and the delivery in hand (drop the
/// subscription to let it go).
fn held_back(l: &Live) -> (Table, sqlbroker::Subscription, sqlbroker::Delivery) {
    let t = l.create(
        Table::new(unique("held"))
            .text_column("k")
            .lease(Duration::from_secs(30))
            .concurrency_limit("{k}", 1)
            .dependencies(),
    );
    let b = &l.broker;
    let first = b
        .publish(&t, sqlbroker::Message::new(b"a0".to_vec()).set("k", "a"))
        .unwrap();
    let sub = b.subscription(&t).max_in_flight(1).start().unwrap();
    let d = next(&sub, Duration::from_secs(20));
    assert_eq!(d.id(), first);
    for body in ["a1", "a2"] {
        b.publish(
            &t,
            sqlbroker::Message::new(body.as_bytes().to_vec()).set("k", "a"),
        )
        .unwrap();
    }
    let parent = b
        .publish(&t, sqlbroker::Message::new(b"b".to_vec()).set("k", "b"))
        .unwrap();
    b.publish(
        &t,
        sqlbroker::Message::new(b"c".to_vec())
            .set("k", "c")
            .after(parent),
    )
    .unwrap();
    let s = b.stats(&t).unwrap();
    assert_eq!(
        (s.ready, s.limited, s.in_flight, s.waiting),
        (1, Some(2), Some(1), 1),
        "{s:?}"
    );
    (t, sub, d)
}

/// `status` shows the rows a limit holds back and the rows waiting on other jobs, in text as
/// in JSON: mid-run, READY alone (1 of 5 live rows) hid the other three.
fn status_shows_rows_held_back(db: Db) {
    let Some(l) = live(db) else { return };
    let (t, sub, d) = held_back(&l);
    let text = ok(&l.url, &["status", "--table", t.name()], "");
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    let row: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    let cell = |name: &str| {
        // Fails while the columns are not there.
        let i = header
            .iter()
            .position(|h| *h == name)
            .unwrap_or_else(|| panic!("no {name} column:\n{text}"));
        row[i].to_string()
    };
    assert_eq!(cell("READY"), "1", "{text}");
    assert_eq!(cell("LIMITED"), "2", "{text}");
    assert_eq!(cell("WAITING"), "1", "{text}");
    assert_eq!(cell("IN_FLIGHT"), "1", "{text}");
    let json = ok(&l.url, &["status", "--table", t.name(), "--json"], "");
    assert!(json.contains("\"limited\":2"), "{json}");
    assert!(json.contains("\"waiting\":1"), "{json}");
    d.ack().unwrap();
    sub.shutdown(Duration::from_secs(10)).unwrap();
}
per_db!(status_shows_rows_held_back);

/// `forget` removes the record of a table dropped by hand (a stale record the listings
/// would show for ever), logs it, and refuses a table that exists (exit 1, nothing changed)
/// or a name never recorded (exit 1).
fn forget_a_stale_record(db: Db) {
    let Some(l) = live(db) else { return };
    let url = l.url.clone();
    let (kept, dropped) = (unique("fkept"), unique("fdrop"));
    l.track(&kept);
    l.track(&dropped);
    for name in [&kept, &dropped] {
        ok(
            &url,
            &["create-table", "--table", name, "--lease", "30"],
            "",
        );
    }
    l.exec(&format!("DROP TABLE {dropped}"));
    // A table that exists: refused, its record kept.
    let o = run(Some(&url), &["forget", "--table", &kept], "");
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("still exists"), "{}", stderr(&o));
    assert!(l.broker.open_table(&kept).is_ok(), "kept");
    // The stale record: forgotten.
    let out = ok(&url, &["forget", "--table", &dropped], "");
    assert_eq!(out.trim(), format!("forgot the record of table {dropped}"));
    assert!(matches!(
        l.broker.open_table(&dropped),
        Err(sqlbroker::BrokerError::UnknownTable { .. })
    ));
    let listed: Vec<String> = l
        .broker
        .tables()
        .unwrap()
        .into_iter()
        .map(|r| r.table.name().to_string())
        .collect();
    assert!(
        listed.contains(&kept) && !listed.contains(&dropped),
        "{listed:?}"
    );
    let log = l.broker.actions_on(&[dropped.as_str()], 5).unwrap();
    assert_eq!(
        (log[0].action.as_str(), log[0].rows),
        ("forget", 0),
        "{log:?}"
    );
    // Again: no record.
    let o = run(Some(&url), &["forget", "--table", &dropped], "");
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("is recorded"), "{}", stderr(&o));
    // Status says what to do about a missing table.
    let c = unique("fgone");
    l.track(&c);
    ok(&url, &["create-table", "--table", &c, "--lease", "30"], "");
    l.exec(&format!("DROP TABLE {c}"));
    let o = run(Some(&url), &["status"], "");
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stderr(&o).contains(&format!("sqlbroker forget --table {c}")),
        "{}",
        stderr(&o)
    );
}
per_db!(forget_a_stale_record);

/// The server's kind as it names itself: `PostgreSQL`, `SQLite`, and `MariaDB` or `MySQL` by
/// its `VERSION()`.
fn server_name(l: &Live) -> &'static str {
    match l.db {
        Db::Postgres => "PostgreSQL",
        Db::Sqlite => "SQLite",
        Db::Mysql => {
            use mysql::prelude::Queryable;
            let mut c = mysql::Conn::new(mysql::Opts::from_url(&l.url).unwrap()).unwrap();
            let v: String = c.query_first("SELECT VERSION()").unwrap().unwrap();
            if v.to_ascii_lowercase().contains("mariadb") {
                "MariaDB"
            } else {
                "MySQL"
            }
        }
    }
}

/// `bench --mode steady` prints what it measured: asked more than it can publish (the
/// publisher takes at most 500 jobs a 10 ms tick), it publishes for `--secs` and no longer,
/// reports the count and rate it reached, and says that it fell behind. Run on an SQLite
/// file that does not exist yet: a benchmark makes its database where `create-table` would.
#[test]
fn bench_steady_says_when_the_publisher_fell_behind() {
    let dir = std::env::temp_dir().join("sqlbroker-tests");
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join(format!("{}.db", unique("newbench")));
    let url = format!("sqlite:{}", file.display());
    let args = [
        "bench", "--mode", "steady", "--rate", "200000", "--secs", "1", "--ack", "batch", "--json",
    ];
    let started = Instant::now();
    let o = run_within(Some(&url), &args, "", Duration::from_secs(180));
    let took = started.elapsed();
    let out = stdout(&o);
    // Fails while bench refuses a new SQLite file ("does not exist").
    assert_eq!(o.status.code(), Some(0), "{out}{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(out.trim()).expect(&out);
    let s = &v["steady"];
    let published = s["published"].as_u64().unwrap();
    // Fails while the publisher goes on past --secs until the whole 200,000 are out, and
    // prints the rate asked for as reached.
    assert!(published < 200_000, "{out}");
    assert_eq!(s["fell_behind"], true, "{out}");
    let secs = s["publish_seconds"].as_f64().unwrap();
    let rate = s["published_per_sec"].as_f64().unwrap();
    assert!((1.0..3.0).contains(&secs), "published for {secs} s: {out}");
    assert!(
        (rate - published as f64 / secs).abs() <= 1.0,
        "the rate is the one measured: {out}"
    );
    assert!(rate < 200_000.0, "{out}");
    assert_eq!(s["worked"].as_u64(), Some(published), "{out}");
    assert!(took < Duration::from_secs(120), "{took:?}");
    // In text: said.
    let text_args = &args[..args.len() - 1];
    let o = run_within(Some(&url), text_args, "", Duration::from_secs(180));
    let text = stdout(&o);
    assert_eq!(o.status.code(), Some(0), "{text}{}", stderr(&o));
    assert!(text.contains("the publisher fell behind"), "{text}");
    let published = figure(&text, "steady published:");
    assert!(published < 200_000.0, "{text}");
    for f in [
        file.clone(),
        file.with_extension("db-wal"),
        file.with_extension("db-shm"),
    ] {
        let _ = std::fs::remove_file(f);
    }
}

/// Queues and kinds from the command line: `create-table --queues --kinds`, `publish --queue
/// --kind`, `pause --queue` (a library subscription then takes only the other queue's rows),
/// `status --queue`, `resume --queue`. Fails (`the paused queue's row`) if `pause --queue`
/// paused nothing, and (the counts' assertions) if `status --queue` counted another queue's
/// rows.
fn queues_and_kinds(db: Db) {
    let Some(l) = live(db) else { return };
    let url = l.url.clone();
    let name = unique("clq");
    l.track(&name);
    ok(
        &url,
        &[
            "create-table",
            "--table",
            &name,
            "--lease",
            "30",
            "--queues",
            "--kinds",
        ],
        "",
    );
    let out = ok(
        &url,
        &[
            "publish", "--table", &name, "--queue", "mail", "--kind", "welcome",
        ],
        "a\nb\n",
    );
    assert_eq!(out.trim(), "published 2 messages");
    ok(
        &url,
        &["publish", "--table", &name, "--queue", "img"],
        "c\n",
    );
    let bad = run(
        Some(&url),
        &["publish", "--table", &name, "--queue", "a b"],
        "x\n",
    );
    assert_eq!(
        bad.status.code(),
        Some(1),
        "a bad queue name: {}",
        stderr(&bad)
    );
    assert_eq!(
        ok(&url, &["pause", "--table", &name, "--queue", "mail"], "").trim(),
        format!("queue mail of table {name} is paused")
    );
    let status = ok(&url, &["status", "--table", &name, "--queue", "all"], "");
    let line = |q: &str| {
        status
            .lines()
            .find(|l| l.split_whitespace().nth(1) == Some(q))
            .unwrap_or_else(|| panic!("no line for {q}: {status}"))
            .split_whitespace()
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    assert_eq!(
        (line("mail")[2].as_str(), line("mail")[8].as_str()),
        ("2", "yes"),
        "{status}"
    );
    assert_eq!(
        (line("img")[2].as_str(), line("img")[8].as_str()),
        ("1", "no"),
        "{status}"
    );
    let json = ok(
        &url,
        &["status", "--table", &name, "--queue", "mail", "--json"],
        "",
    );
    assert!(
        json.contains("\"queue\":\"mail\"") && json.contains("\"paused\":true"),
        "{json}"
    );
    let table = l.broker.open_table(&name).unwrap();
    assert!(table.has_queues() && table.has_kinds());
    let sub = l.broker.subscription(&table).start().unwrap();
    let d = next(&sub, Duration::from_secs(10));
    assert_eq!((d.queue(), d.kind()), ("img", None));
    d.ack().unwrap();
    assert!(
        sub.next_delivery_timeout(Duration::from_millis(500))
            .is_err(),
        "the paused queue's row was delivered"
    );
    ok(&url, &["resume", "--table", &name, "--queue", "mail"], "");
    let d = next(&sub, Duration::from_secs(10));
    assert_eq!((d.queue(), d.kind()), ("mail", Some("welcome")));
    d.ack().unwrap();
    sub.close();
}
per_db!(queues_and_kinds);

/// `jobs`: a page of one state narrowed by `--queue`, `--kind` and `--where`, as columns and as
/// JSON; a queue with no rows lists none (exit 0); a table without queues, or a bad name, is
/// refused (exit 1). `status --kind` counts by kind. Fails (the id lists) if a flag is not passed to the filter, or another
/// queue's or kind's rows are listed.
fn jobs_by_queue_and_kind(db: Db) {
    let Some(l) = live(db) else { return };
    let url = l.url.clone();
    let name = unique("clj");
    l.track(&name);
    ok(
        &url,
        &[
            "create-table",
            "--table",
            &name,
            "--lease",
            "30",
            "--queues",
            "--kinds",
            "--column",
            "who",
        ],
        "",
    );
    let publish = |args: &[&str], body: &str| {
        let mut all = vec!["publish", "--table", &name];
        all.extend_from_slice(args);
        ok(&url, &all, body);
    };
    publish(
        &["--queue", "mail", "--kind", "welcome", "--set", "who=ann"],
        "a\nb\n",
    );
    publish(&["--queue", "img", "--set", "who=bob"], "c\n");
    publish(&["--kind", "welcome", "--set", "who=bob"], "d\n");
    let ids = |args: &[&str]| -> Vec<i64> {
        let mut all = vec!["jobs", "--table", &name, "--json"];
        all.extend_from_slice(args);
        let out = ok(&url, &all, "");
        let v: serde_json::Value = serde_json::from_str(out.trim()).expect("JSON");
        v.as_array()
            .expect("an array")
            .iter()
            .map(|j| j["id"].as_i64().unwrap())
            .collect()
    };
    let all = ids(&[]);
    assert_eq!(all.len(), 4, "{all:?}");
    let (a, b, c, d) = (all[0], all[1], all[2], all[3]);
    assert_eq!(ids(&["--queue", "mail"]), [a, b]);
    assert_eq!(ids(&["--queue", "default"]), [d]);
    assert_eq!(ids(&["--kind", "welcome"]), [a, b, d]);
    assert_eq!(ids(&["--kind", "welcome", "--where", "who=bob"]), [d]);
    assert_eq!(ids(&["--queue", "nothing"]), Vec::<i64>::new());
    assert_eq!(ids(&["--state", "dead"]), Vec::<i64>::new());
    assert_eq!(ids(&["--limit", "1", "--after", &a.to_string()]), [b]);

    let text = ok(&url, &["jobs", "--table", &name, "--queue", "img"], "");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    let head: Vec<&str> = lines[0].split_whitespace().collect();
    assert_eq!(&head[..4], ["ID", "STATE", "QUEUE", "KIND"], "{text}");
    let row: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(
        &row[..4],
        [c.to_string().as_str(), "ready", "img", "-"],
        "{text}"
    );

    // `status --kind`: counts by kind, `(none)` for rows without one (the kind named `-` is
    // another); a kind asked for by name with no rows counts zeros.
    publish(&["--kind", "-"], "e\n");
    let status = ok(&url, &["status", "--table", &name, "--kind", "all"], "");
    let ready = |k: &str| -> Option<String> {
        status
            .lines()
            .find(|l| l.split_whitespace().nth(1) == Some(k))
            .map(|l| l.split_whitespace().nth(2).unwrap().to_string())
    };
    assert_eq!(
        status.lines().next().unwrap().split_whitespace().nth(1),
        Some("KIND")
    );
    assert_eq!(ready("welcome").as_deref(), Some("3"), "{status}");
    assert_eq!(ready("(none)").as_deref(), Some("1"), "{status}");
    assert_eq!(ready("-").as_deref(), Some("1"), "{status}");
    let by_kind = ok(
        &url,
        &["status", "--table", &name, "--kind", "all", "--json"],
        "",
    );
    let by_kind: serde_json::Value = serde_json::from_str(by_kind.trim()).expect("JSON");
    let mut kinds: Vec<(Option<String>, u64)> = by_kind
        .as_array()
        .unwrap()
        .iter()
        .map(|o| {
            (
                o["kind"].as_str().map(String::from),
                o["ready"].as_u64().unwrap(),
            )
        })
        .collect();
    kinds.sort();
    assert_eq!(
        kinds,
        [
            (None, 1),
            (Some("-".into()), 1),
            (Some("welcome".into()), 3)
        ]
    );
    // A queue written by hand with control and bidi characters: escaped on the terminal, the
    // same value in JSON (as `jobs --json` has it).
    let evil = "ev\u{1b}[31mil\u{202e}x";
    l.exec(&format!(
        "UPDATE {name} SET queue = '{evil}' WHERE id = {c}"
    ));
    let shown = ok(&url, &["status", "--table", &name, "--queue", "all"], "");
    assert!(
        !shown.contains('\u{1b}') && !shown.contains('\u{202e}'),
        "{shown:?}"
    );
    let raw = ok(
        &url,
        &["status", "--table", &name, "--queue", "all", "--json"],
        "",
    );
    assert!(
        !raw.contains('\u{1b}') && !raw.contains('\u{202e}'),
        "{raw:?}"
    );
    let raw: serde_json::Value = serde_json::from_str(raw.trim()).expect("JSON");
    assert!(
        raw.as_array().unwrap().iter().any(|o| o["queue"] == evil),
        "{raw}"
    );
    l.exec(&format!("UPDATE {name} SET queue = 'img' WHERE id = {c}"));
    let json = ok(
        &url,
        &["status", "--table", &name, "--kind", "sms", "--json"],
        "",
    );
    assert!(
        json.contains("\"kind\":\"sms\"") && json.contains("\"ready\":0"),
        "{json}"
    );

    let plain = unique("clj");
    l.track(&plain);
    ok(
        &url,
        &["create-table", "--table", &plain, "--lease", "30"],
        "",
    );
    for args in [
        vec!["jobs", "--table", plain.as_str(), "--queue", "mail"],
        vec!["jobs", "--table", name.as_str(), "--queue", "a b"],
        vec!["jobs", "--table", name.as_str(), "--where", "nope=1"],
        vec!["status", "--table", plain.as_str(), "--kind", "all"],
    ] {
        let out = run(Some(&url), &args, "");
        assert_eq!(out.status.code(), Some(1), "{args:?}: {}", stderr(&out));
    }
}
per_db!(jobs_by_queue_and_kind);

/// `workers` lists the running subscriptions and workers from their heartbeats, and
/// `status --kind` counts the workers taking each kind and names a kind with ready rows that
/// none takes. Fails (`workers`) without the listing, (`no worker for kind`) if the orphan
/// kind is not named, or named while a worker takes it.
fn workers_and_kinds_no_worker_takes(db: Db) {
    let Some(l) = live(db) else { return };
    let url = l.url.clone();
    let t = l.create(
        common::describe(
            &unique("clw"),
            sqlbroker::Form::Lease,
            Duration::from_secs(30),
        )
        .kinds(),
    );
    let name = t.name().to_string();
    for (kind, n) in [("orphan", 2), ("held", 1)] {
        for i in 0..n {
            let m = sqlbroker::Message::new(b"x".to_vec())
                .set("k", format!("{kind}{i}"))
                .kind(kind);
            l.broker.publish(&t, m).unwrap();
        }
    }
    // A worker that takes kind `held` and holds it: its row stays in work.
    let (release_tx, release) = crossbeam_channel::bounded::<()>(0);
    let worker = sqlbroker::Worker::new(&l.broker)
        .on(&t, "held", move |_d| {
            let _ = release.recv_timeout(Duration::from_secs(30));
            Ok::<(), String>(())
        })
        .threads(1)
        .start()
        .unwrap();
    let listed = || ok(&url, &["workers", "--table", &name], "");
    assert!(
        common::wait_for(Duration::from_secs(10), || listed()
            .contains(&format!("{name}[held]"))),
        "workers: {}",
        listed()
    );
    let text = listed();
    let row: Vec<&str> = text.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(row[0], "worker", "{text}");
    assert_eq!(row[2], std::process::id().to_string(), "{text}");
    let json: serde_json::Value =
        serde_json::from_str(ok(&url, &["workers", "--table", &name, "--json"], "").trim())
            .expect("JSON");
    assert_eq!(json[0]["tables"][0]["kinds"], serde_json::json!(["held"]));
    assert_eq!(json[0]["pid"], serde_json::json!(std::process::id()));

    let status = ok(
        &url,
        &[
            "status", "--table", &name, "--kind", "orphan", "--kind", "held",
        ],
        "",
    );
    assert!(
        status.contains(&format!(
            "no worker for kind orphan of table {name} (2 ready)"
        )),
        "no worker for kind: {status}"
    );
    assert!(!status.contains("no worker for kind held"), "{status}");
    let head: Vec<&str> = status.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(head.last(), Some(&"WORKERS"), "{status}");
    let workers_of = |k: &str| {
        status
            .lines()
            .find(|l| l.split_whitespace().nth(1) == Some(k))
            .and_then(|l| l.split_whitespace().last().map(str::to_string))
    };
    assert_eq!(workers_of("orphan").as_deref(), Some("0"), "{status}");
    assert_eq!(workers_of("held").as_deref(), Some("1"), "{status}");
    let json: serde_json::Value = serde_json::from_str(
        ok(
            &url,
            &["status", "--table", &name, "--kind", "all", "--json"],
            "",
        )
        .trim(),
    )
    .expect("JSON");
    let of = |k: &str| {
        json.as_array()
            .unwrap()
            .iter()
            .find(|j| j["kind"] == k)
            .map(|j| j["workers"].clone())
    };
    assert_eq!(of("orphan"), Some(serde_json::json!(0)));
    assert_eq!(of("held"), Some(serde_json::json!(1)));

    drop(release_tx);
    worker.shutdown(Duration::from_secs(10)).unwrap();
    assert!(
        common::wait_for(Duration::from_secs(5), || ok(
            &url,
            &["workers", "--table", &name],
            ""
        )
        .contains("no subscription or worker running")),
        "still listed after its shutdown"
    );
}
per_db!(workers_and_kinds_no_worker_takes);

/// `status --kind` names a queue whose ready rows of a kind no member takes, when every
/// member taking the kind names its queues (a review found WORKERS 1 and no note for a row
/// in a queue the one member does not take). Fails (`in queue`) without it, and if a queue
/// a member takes is named.
fn a_kind_taken_in_other_queues_only(db: Db) {
    let Some(l) = live(db) else { return };
    let url = l.url.clone();
    let t = l.create(
        common::describe(
            &unique("clq"),
            sqlbroker::Form::Lease,
            Duration::from_secs(30),
        )
        .queues()
        .kinds(),
    );
    let name = t.name().to_string();
    for (queue, key) in [("q1", "a"), ("q2", "b")] {
        let m = sqlbroker::Message::new(b"x".to_vec())
            .set("k", key)
            .queue(queue)
            .kind("b");
        l.broker.publish(&t, m).unwrap();
    }
    // Takes kind b of queue q1 only, and holds what it takes.
    let sub = l
        .broker
        .subscription(&t)
        .queues(["q1"])
        .kinds(["b"])
        .start()
        .unwrap();
    let held = next(&sub, Duration::from_secs(10));
    let q2 = format!("no worker for kind b in queue q2 of table {name}");
    let status = || ok(&url, &["status", "--table", &name, "--kind", "all"], "");
    assert!(
        common::wait_for(Duration::from_secs(10), || status().contains(&q2)),
        "in queue: {}",
        status()
    );
    assert!(!status().contains("queue q1"), "{}", status());
    let json: serde_json::Value = serde_json::from_str(
        ok(
            &url,
            &["status", "--table", &name, "--kind", "b", "--json"],
            "",
        )
        .trim(),
    )
    .expect("JSON");
    assert_eq!(json[0]["queues_without_worker"], serde_json::json!(["q2"]));
    assert_eq!(json[0]["workers"], serde_json::json!(1));
    held.ack().unwrap();
    sub.close();
}
per_db!(a_kind_taken_in_other_queues_only);

/// `jobs cancel|requeue|delete`: the count first, nothing done without `--yes`; with it,
/// every matching job (1,500: more than one batch of 1,000, no cap) acted on with a progress
/// line per batch, the others untouched, one action log entry by the command line's user;
/// stored and given text printed escaped; a state the verb does not act on refused.
///
/// Fails (seen: acting without `--yes`) on `nothing done`; (seen: `JobFilter`'s `Display`
/// writing text raw, unquoted and unescaped) on the count line. The command's own `escape`
/// of that line is a second guard the test cannot tell apart (the `Display` escapes already).
fn jobs_bulk_verbs_count_first(db: Db) {
    let Some(l) = live(db) else { return };
    let url = l.url.clone();
    let name = unique("hb_cli");
    let table = l.create(
        Table::new(name.as_str())
            .text_column("k")
            .lease(Duration::from_secs(30)),
    );
    let b = &l.broker;
    for _ in 0..3 {
        b.publish_batch(&table, (0..500).map(|_| common::msg("x", "x")))
            .unwrap();
    }
    b.publish_batch(&table, (0..3).map(|_| common::msg("y", "y")))
        .unwrap();
    let base = ["jobs", "cancel", "--table", name.as_str(), "--where", "k=x"];
    let out = ok(&url, &base, "");
    assert!(out.contains("1500 jobs, k = \"x\" of table"), "{out}");
    assert!(out.contains("nothing done"), "{out}");
    assert_eq!(l.rows_where(&table, "k = 'x'"), 1500);
    // Given text with a control character: printed escaped.
    let hostile = "k=x\u{1b}]0;pwned\u{7}";
    let out = ok(
        &url,
        &[
            "jobs",
            "delete",
            "--table",
            name.as_str(),
            "--where",
            hostile,
        ],
        "",
    );
    assert!(!out.contains('\u{1b}'), "{out:?}");
    assert!(out.starts_with("0 jobs"), "{out}");
    let mut yes = base.to_vec();
    yes.push("--yes");
    let out = ok(&url, &yes, "");
    assert_eq!(out.matches("batch: ").count(), 2, "{out}");
    assert!(out.contains("cancelled 1500 of 1500 read"), "{out}");
    assert_eq!(l.rows_where(&table, "k = 'x'"), 0);
    assert_eq!(l.rows_where(&table, "k = 'y'"), 3);
    let log = b.actions_on(&[table.name()], 1).unwrap();
    assert_eq!(
        (log[0].action.as_str(), log[0].rows),
        ("cancel all matching", 1500)
    );
    assert!(log[0].who.ends_with("with the CLI"), "{:?}", log[0].who);
    let o = run(
        Some(&url),
        &[
            "jobs", "requeue", "--table", &name, "--state", "ready", "--yes",
        ],
        "",
    );
    assert_ne!(o.status.code(), Some(0), "{}", stdout(&o));
    assert_eq!(l.rows_where(&table, "k = 'y'"), 3);
}
per_db!(jobs_bulk_verbs_count_first);
