//! The dashboard in a real browser: headless Chromium, driven over WebDriver by
//! `chromedriver`, loads `sqlbroker dashboard` over a live database, reads the rendered
//! counts and a dead letter's reason, clicks the button that requeues it, sees the result,
//! and saves a screenshot (`$CARGO_TARGET_TMPDIR/dashboard-<db>.png`; the README's is the
//! PostgreSQL one). Skips when `chromium` or `chromedriver` is missing, unless
//! `SQLBROKER_REQUIRE_SERVERS=1` (`.ci/run` installs both).

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use base64::Engine;
use common::{live, next, wait_for, Db};
use serde_json::{json, Value};
use sqlbroker::{JobState, Message, Table};

const BIN: &str = env!("CARGO_BIN_EXE_sqlbroker");

/// chromedriver's port (the dashboard's own port is ephemeral).
const DRIVER_PORT_BASE: u16 = 18641;

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The path of `program` on `PATH`.
fn which(program: &str) -> Option<std::path::PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| std::path::Path::new(d).join(program))
        .find(|p| p.is_file())
}

/// Chromium and chromedriver, or `None` (skip) when either is missing.
fn browser() -> Option<(std::path::PathBuf, std::path::PathBuf)> {
    match (which("chromium"), which("chromedriver")) {
        (Some(c), Some(d)) => Some((c, d)),
        _ if std::env::var("SQLBROKER_REQUIRE_SERVERS").is_ok_and(|v| v == "1") => {
            panic!("SQLBROKER_REQUIRE_SERVERS=1 but chromium or chromedriver is missing (apt-get install chromium chromium-driver)")
        }
        _ => {
            eprintln!(
                "\n!!!!! SKIPPED: the browser test: chromium or chromedriver is missing !!!!!\n"
            );
            None
        }
    }
}

/// A WebDriver session.
struct Session {
    base: String,
    agent: ureq::Agent,
}

impl Session {
    fn call(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let url = format!("{}{path}", self.base);
        let rq = self.agent.request(method, &url);
        let r = match body {
            Some(b) => rq.send_json(b),
            None => rq.call(),
        };
        let r = match r {
            Ok(r) => r,
            Err(ureq::Error::Status(code, r)) => {
                panic!(
                    "WebDriver {method} {path}: {code} {}",
                    r.into_string().unwrap_or_default()
                )
            }
            Err(e) => panic!("WebDriver {method} {path}: {e}"),
        };
        let v: Value = r.into_json().unwrap();
        v["value"].clone()
    }

    fn go(&self, url: &str) {
        self.call("POST", "/url", Some(json!({ "url": url })));
    }

    fn url(&self) -> String {
        self.call("GET", "/url", None)
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    /// The element `css` selects (its WebDriver id).
    fn find(&self, using: &str, selector: &str) -> String {
        let v = self.call(
            "POST",
            "/element",
            Some(json!({ "using": using, "value": selector })),
        );
        v.as_object()
            .and_then(|o| o.values().next())
            .and_then(Value::as_str)
            .unwrap_or_else(|| panic!("no element {selector}: {v}"))
            .to_string()
    }

    /// Every element `selector` selects (their WebDriver ids).
    fn find_all(&self, using: &str, selector: &str) -> Vec<String> {
        let v = self.call(
            "POST",
            "/elements",
            Some(json!({ "using": using, "value": selector })),
        );
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|e| e.as_object()?.values().next()?.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Types `text` into a field.
    fn type_into(&self, element: &str, text: &str) {
        self.call(
            "POST",
            &format!("/element/{element}/value"),
            Some(json!({ "text": text })),
        );
    }

    fn text(&self, element: &str) -> String {
        self.call("GET", &format!("/element/{element}/text"), None)
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    fn body_text(&self) -> String {
        let body = self.find("css selector", "body");
        self.text(&body)
    }

    /// A property of an element (`value` of a field).
    fn property(&self, element: &str, name: &str) -> Value {
        self.call("GET", &format!("/element/{element}/property/{name}"), None)
    }

    fn attribute(&self, element: &str, name: &str) -> String {
        self.call("GET", &format!("/element/{element}/attribute/{name}"), None)
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    fn displayed(&self, element: &str) -> bool {
        self.call("GET", &format!("/element/{element}/displayed"), None)
            .as_bool()
            .unwrap_or(false)
    }

    fn click(&self, element: &str) {
        self.call(
            "POST",
            &format!("/element/{element}/click"),
            Some(json!({})),
        );
    }

    fn screenshot(&self) -> Vec<u8> {
        let b64 = self.call("GET", "/screenshot", None);
        base64::engine::general_purpose::STANDARD
            .decode(b64.as_str().unwrap())
            .unwrap()
    }
}

/// chromedriver on `port` and a headless Chromium session through it; the session and
/// driver end when the returned guards drop.
fn open_browser(
    chromium: &std::path::Path,
    chromedriver: &std::path::Path,
    port: u16,
) -> (Killed, Session, std::path::PathBuf) {
    let driver_proc = Killed(
        Command::new(chromedriver)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let driver = format!("http://127.0.0.1:{port}");
    let agent = ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(60))
        .build();
    assert!(
        wait_for(Duration::from_secs(20), || agent
            .get(&format!("{driver}/status"))
            .call()
            .is_ok()),
        "chromedriver did not start"
    );
    let profile = std::env::temp_dir().join(common::unique("chromium-profile"));
    std::fs::create_dir_all(&profile).unwrap();
    let caps = json!({ "capabilities": { "alwaysMatch": {
        "browserName": "chrome",
        "goog:chromeOptions": {
            "binary": chromium,
            "args": [
                "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--disable-dev-shm-usage", "--window-size=1100,900",
                format!("--user-data-dir={}", profile.display()),
            ]
        }
    }}});
    let created: Value = agent
        .post(&format!("{driver}/session"))
        .send_json(caps)
        .unwrap()
        .into_json()
        .unwrap();
    let id = created["value"]["sessionId"]
        .as_str()
        .expect("a session")
        .to_string();
    let s = Session {
        base: format!("{driver}/session/{id}"),
        agent,
    };
    (driver_proc, s, profile)
}

/// Starts `sqlbroker dashboard` with `args`; its base URL.
fn dashboard(args: &[&str]) -> (Killed, String) {
    let mut dash = Command::new(BIN)
        .arg("dashboard")
        .args(args)
        .env_remove("DATABASE_URL")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(dash.stdout.take().unwrap());
    let dash = Killed(dash);
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let base = line
        .split("listening on ")
        .nth(1)
        .expect("the dashboard's address")
        .split(' ')
        .next()
        .unwrap()
        .trim()
        .trim_end_matches('/')
        .to_string();
    std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
    (dash, base)
}

fn browse(db: Db, driver_port: u16) {
    let Some((chromium, chromedriver)) = browser() else {
        return;
    };
    let Some(l) = live(db) else { return };
    let b = &l.broker;
    let t = l.create(
        Table::new(common::unique("orders"))
            .text_column("customer")
            .lease(Duration::from_secs(30))
            .keep_completed(Duration::from_secs(3600)),
    );
    let name = t.name().to_string();
    let publish = |body: &str, customer: &str| {
        b.publish(
            &t,
            Message::new(body.as_bytes().to_vec()).set("customer", customer),
        )
        .unwrap()
    };
    // Two dead letters first (the lowest ids), then work to do.
    let dead = publish("{\"order\":17,\"email\":\"ann@example.com\"}", "ann");
    let other = publish("{\"order\":18,\"email\":\"bob@example.com\"}", "bob");
    let sub = b.subscription(&t).max_in_flight(2).start().unwrap();
    for _ in 0..2 {
        let d = next(&sub, Duration::from_secs(20));
        if d.id() == dead {
            d.dead_letter("smtp: 550 mailbox unavailable").unwrap();
        } else {
            d.dead_letter("invalid address").unwrap();
        }
    }
    sub.shutdown(Duration::from_secs(10)).unwrap();
    for i in 0..40 {
        publish(
            &format!("{{\"order\":{}}}", 100 + i),
            ["ann", "bob", "eve"][i % 3],
        );
    }
    b.publish(
        &t,
        Message::new(b"{\"order\":99}".to_vec())
            .set("customer", "zed")
            .deliver_after(Duration::from_secs(3600)),
    )
    .unwrap();

    let (_dash, base) = dashboard(&[
        "--listen",
        "127.0.0.1:0",
        "--sample",
        "1",
        "--table",
        &name,
        "--url",
        &l.url,
    ]);

    // Some work done while the dashboard counts, for the chart: 30 acks over ~4 s.
    let sub = b.subscription(&t).max_in_flight(1).start().unwrap();
    for _ in 0..30 {
        next(&sub, Duration::from_secs(20)).ack().unwrap();
        std::thread::sleep(Duration::from_millis(130));
    }
    sub.shutdown(Duration::from_secs(10)).unwrap();
    // The sampler has counted the 30 acks (it counts every second) and the row the
    // subscription had claimed ahead and handed back at its shutdown: the overview below shows
    // the sampler's last count, which may have been taken while that row was in flight.
    let completed = format!("sqlbroker_queue_jobs{{table=\"{name}\",state=\"completed\"}} 30");
    let ready = format!("sqlbroker_queue_jobs{{table=\"{name}\",state=\"ready\"}} 10");
    let metrics = format!("{base}/metrics");
    assert!(
        wait_for(Duration::from_secs(20), || ureq::get(&metrics)
            .call()
            .ok()
            .and_then(|r| r.into_string().ok())
            .is_some_and(
                |body| body.lines().any(|l| l == completed) && body.lines().any(|l| l == ready)
            )),
        "the dashboard never counted the acks and the handed-back row"
    );

    let (_driver, s, profile) = open_browser(&chromium, &chromedriver, driver_port);

    // The overview, as rendered: counts by state.
    s.go(&format!("{base}/"));
    let cell = |state: &str| {
        let e = s.find(
            "css selector",
            &format!("a[href='/tables/{name}?state={state}']"),
        );
        s.text(&e)
    };
    assert_eq!(cell("ready"), "10");
    assert_eq!(cell("scheduled"), "1");
    assert_eq!(cell("dead"), "2");
    assert_eq!(cell("completed"), "30");
    assert!(s.body_text().contains("Throughput and failures"));
    let shot = s.screenshot();
    assert_eq!(&shot[1..4], b"PNG");
    let file = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "dashboard-{}.png",
        format!("{db:?}").to_lowercase()
    ));
    std::fs::write(&file, &shot).unwrap();
    eprintln!("screenshot: {}", file.display());

    // The dead letters, with their reasons; requeue one by its button.
    let link = s.find(
        "css selector",
        &format!("a[href='/tables/{name}?state=dead']"),
    );
    s.click(&link);
    let text = s.body_text();
    assert!(text.contains("smtp: 550 mailbox unavailable"), "{text}");
    assert!(text.contains("invalid address"), "{text}");
    let button = s.find(
        "xpath",
        &format!("//form[@action='/tables/{name}/requeue'][input[@name='id' and @value='{dead}']]/button"),
    );
    s.click(&button);
    assert!(
        wait_for(Duration::from_secs(10), || s.url().contains("done=")),
        "the action's redirect: {}",
        s.url()
    );
    let text = s.body_text();
    assert!(text.contains(&format!("requeued job {dead}")), "{text}");
    assert!(!text.contains("smtp: 550 mailbox unavailable"), "{text}");
    assert!(text.contains("invalid address"), "{text}");
    assert_eq!(
        b.job(&t, dead).unwrap().map(|j| j.state()),
        Some(JobState::Ready)
    );
    assert_eq!(
        b.job(&t, other).unwrap().map(|j| j.state()),
        Some(JobState::Dead)
    );
    // The overview shows it at once (the action recounted the table).
    s.go(&format!("{base}/"));
    assert_eq!(cell("dead"), "1");
    assert_eq!(cell("ready"), "11");

    // Issue 42, live: rows published after the page loaded show in its count without a
    // reload, while a half-typed filter stays in its field; what is typed hides the tables
    // whose name does not hold it; the chart is SVG with its lines drawn. Seen failing with
    // the script's nonce left out of the CSP (the script is blocked: the count stays 11),
    // and with the refresh emptying the filter field (the typed text is lost).
    let field = s.find("css selector", "input#q");
    let typed = &name[..6];
    s.type_into(&field, typed);
    let url = s.url();
    for i in 0..3 {
        publish(&format!("{{\"order\":{}}}", 200 + i), "live");
    }
    // The sampler counts every second, the page refreshes every 2 s.
    assert!(
        wait_for(Duration::from_secs(10), || cell("ready") == "14"),
        "the count did not change without a reload: {}",
        cell("ready")
    );
    assert_eq!(s.url(), url, "no navigation");
    assert_eq!(
        s.property(&field, "value"),
        json!(typed),
        "the typed filter survives"
    );
    let status = s.find("css selector", "#live");
    assert!(
        s.text(&status).starts_with("live: updated"),
        "{}",
        s.text(&status)
    );
    let row = s.find("css selector", "tr[data-name]");
    assert!(s.displayed(&row));
    s.type_into(&field, "zz");
    assert!(
        !s.displayed(&row),
        "a name without \"{typed}zz\" is hidden as typed"
    );
    let line = s.find(
        "css selector",
        "div.chart svg polyline[data-k='line_finished']",
    );
    assert!(
        s.attribute(&line, "points").contains(','),
        "the chart's line is drawn"
    );

    // A table's page: its job list takes a job published after it loaded.
    s.go(&format!("{base}/tables/{name}?state=ready"));
    let rows = || {
        s.find_all("css selector", "tbody[data-jobs] tr[data-id]")
            .len()
    };
    assert_eq!(rows(), 14);
    let late = publish("{\"order\":300}", "late");
    assert!(
        wait_for(Duration::from_secs(10), || rows() == 15),
        "the job list did not take the new job: {} rows",
        rows()
    );
    let link = s.find(
        "css selector",
        &format!("tbody[data-jobs] a[href='/tables/{name}/jobs/{late}']"),
    );
    assert_eq!(s.text(&link), late.to_string());

    s.call("DELETE", "", None);
    let _ = std::fs::remove_dir_all(&profile);
}

#[test]
fn postgres() {
    browse(Db::Postgres, DRIVER_PORT_BASE);
}

#[test]
fn mysql() {
    browse(Db::Mysql, DRIVER_PORT_BASE + 1);
}

#[test]
fn sqlite() {
    browse(Db::Sqlite, DRIVER_PORT_BASE + 2);
}

/// One dashboard over the three databases, each holding a table of the same name: the
/// overview names each database; in one, the filter form narrows the listing to a
/// customer's jobs and "cancel all matching" cancels those, in that database only; the
/// action log shows it. Then a read-only dashboard over the same databases shows the
/// filtered listing and no form that posts.
#[test]
fn several_databases() {
    let Some((chromium, chromedriver)) = browser() else {
        return;
    };
    let lives: Vec<(&str, common::Live)> = [
        ("lite", Db::Sqlite),
        ("pg", Db::Postgres),
        ("my", Db::Mysql),
    ]
    .into_iter()
    .filter_map(|(n, db)| Some((n, live(db)?)))
    .collect();
    if lives.len() < 3 {
        return;
    }
    let name = common::unique("shops");
    let tables: Vec<Table> = lives
        .iter()
        .map(|(n, l)| {
            let t = l.create(
                Table::new(&name)
                    .text_column("customer")
                    .lease(Duration::from_secs(30)),
            );
            for (i, who) in ["ann", "bob", "ann", "ann", "bob"].iter().enumerate() {
                l.broker
                    .publish(
                        &t,
                        Message::new(format!("{{\"shop\":\"{n}\",\"order\":{i}}}").into_bytes())
                            .set("customer", *who),
                    )
                    .unwrap();
            }
            t
        })
        .collect();
    let urls: Vec<String> = lives
        .iter()
        .map(|(n, l)| format!("{n}={}", l.url))
        .collect();
    let mut args = vec!["--listen", "127.0.0.1:0", "--sample", "1", "--table", &name];
    for u in &urls {
        args.extend(["--url", u.as_str()]);
    }
    let (_dash, base) = dashboard(&args);
    let (_driver, s, profile) = open_browser(&chromium, &chromedriver, DRIVER_PORT_BASE + 3);

    s.go(&format!("{base}/"));
    let text = s.body_text();
    for (n, _) in &lives {
        assert!(text.contains(&format!("Database {n} ")), "{n}: {text}");
        let cell = s.find(
            "css selector",
            &format!("a[href='/d/{n}/tables/{name}?state=ready']"),
        );
        assert_eq!(s.text(&cell), "5", "{n}");
    }
    let shot = s.screenshot();
    std::fs::write(
        std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard-several.png"),
        &shot,
    )
    .unwrap();

    // In PostgreSQL's table: filter ann's jobs, cancel them all.
    let link = s.find("css selector", &format!("a[href='/d/pg/tables/{name}']"));
    s.click(&link);
    let column = s.find(
        "css selector",
        "select[name='column'] option[value='customer']",
    );
    s.click(&column);
    let value = s.find("css selector", "input[name='value']");
    s.type_into(&value, "ann");
    let filter = s.find("xpath", "//form[contains(@class,'filter')]//button");
    s.click(&filter);
    assert!(
        wait_for(Duration::from_secs(10), || s.url().contains("value=ann")),
        "{}",
        s.url()
    );
    let text = s.body_text();
    assert!(
        text.contains("Showing ready jobs, customer = \"ann\""),
        "{text}"
    );
    assert_eq!(
        s.find_all("css selector", "td.n a[href*='/jobs/']").len(),
        3,
        "{text}"
    );
    let cancel = s.find("xpath", "//button[contains(., 'cancel all matching')]");
    s.click(&cancel);
    assert!(
        wait_for(Duration::from_secs(20), || s.url().contains("done=")),
        "the action's redirect: {}",
        s.url()
    );
    let text = s.body_text();
    assert!(
        text.contains("cancelled 3 of 3 ready jobs, customer = \"ann\""),
        "{text}"
    );
    for ((n, l), t) in lives.iter().zip(&tables) {
        let ann = l
            .broker
            .jobs_matching(
                t,
                JobState::Ready,
                &sqlbroker::JobFilter::new().column("customer", "ann"),
                None,
                10,
                0,
            )
            .unwrap()
            .len();
        assert_eq!(ann, if *n == "pg" { 0 } else { 3 }, "{n}");
    }
    s.go(&format!("{base}/actions"));
    let text = s.body_text();
    assert!(text.contains("Database pg"), "{text}");
    assert!(text.contains("cancel all matching"), "{text}");
    assert!(text.contains("ready jobs, customer = \"ann\""), "{text}");

    // Read-only, same databases: the filtered listing, and nothing that posts.
    let mut ro_args = args.clone();
    ro_args.push("--read-only");
    let (_ro, ro_base) = dashboard(&ro_args);
    s.go(&format!(
        "{ro_base}/d/my/tables/{name}?state=ready&column=customer&value=ann"
    ));
    let text = s.body_text();
    assert!(text.contains("read-only"), "{text}");
    assert_eq!(
        s.find_all("css selector", "td.n a[href*='/jobs/']").len(),
        3,
        "{text}"
    );
    assert!(
        s.find_all("css selector", "form[method='post']").is_empty(),
        "{text}"
    );
    assert!(!text.contains("all matching"), "{text}");

    s.call("DELETE", "", None);
    let _ = std::fs::remove_dir_all(&profile);
}
