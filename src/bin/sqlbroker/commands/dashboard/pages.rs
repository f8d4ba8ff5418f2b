//! The pages, rendered with `maud`: every `(value)` it inserts is HTML-escaped, so nothing
//! read from the database (payloads, errors, reasons, column values) can become markup. The
//! one `PreEscaped` is the style sheet below, a constant.
//!
//! Escaped for HTML is not enough to show stored text as it is: a bidi control reorders what
//! follows it on the screen, and CR, LF or a line separator forge a line in a cell. Text read
//! from the database or a request goes through [`shown`] (one line: control characters, bidi
//! controls and line separators as visible escapes, as the command line prints them) or, in
//! a `<pre>` of its own, [`shown_lines`] (line feeds and tabs kept).
//!
//! The overview and a table's page carry the live refresh ([`live`]): their counts, charts
//! and job list are marked (`data-t`: a table, `data-k`: a value) for its script to update in
//! place; without the script they are the same server-rendered pages.

use std::time::SystemTime;

use maud::{html, Markup, PreEscaped, DOCTYPE};
use sqlbroker::{ColumnType, Form, Job, JobFilter, JobState, Table, Value};

use super::filters::{bulk_verbs, describe, filter_of, BATCH, BULK_MAX};
use super::http::{state_from, state_slug, Reply, Rq, PAGE};
use super::sampler::Entry;
use super::{chart, script, Ctx, Database};
use crate::commands::{age, escape, escape_keeping_lines, preview, utc};

/// Stored text on one line: see the module's notes.
fn shown(text: &str) -> String {
    escape(text)
}

/// Stored text in a `<pre>` of its own: [`shown`], its line feeds and tabs kept.
fn shown_lines(text: &str) -> String {
    escape_keeping_lines(text)
}

/// The payload bytes a listing reads of each job: enough for the preview's 60 characters of
/// up to 4 bytes each, and one more character to tell that more follows.
const PREVIEW_BYTES: usize = 4 * 61;

/// The most payload bytes a job's page shows.
const PAYLOAD_SHOWN: usize = 4096;

/// The most characters of an error or reason a listing shows (a job's page shows all).
const SNIPPET: usize = 120;

const STYLE: &str = "
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#1d2330;background:#f6f7f9}
header{background:#1d2330;color:#fff;padding:.6em 1.2em;display:flex;gap:1.5em;align-items:baseline}
header a{color:#fff;text-decoration:none;font-weight:600}
header .ro{color:#f5c26b}
main{padding:1em 1.2em;max-width:1200px}
h1{font-size:1.3em;margin:.2em 0 .6em}
h2{font-size:1.1em;margin:1.2em 0 .4em}
table{border-collapse:collapse;background:#fff;margin-bottom:1em}
th,td{padding:.3em .7em;border-bottom:1px solid #e3e6eb;text-align:left;vertical-align:top}
th{background:#eef0f4;font-weight:600}
td.n{text-align:right;font-variant-numeric:tabular-nums}
.err{background:#fde8e8;border:1px solid #f3b4b4;color:#8a1c1c;padding:.5em .8em;margin:.5em 0}
.done{background:#e6f6ea;border:1px solid #a9dcb5;color:#1f5f31;padding:.5em .8em;margin:.5em 0}
.paused{background:#f5c26b;color:#3d2a00;border-radius:3px;padding:0 .4em;font-size:.85em}
.muted{color:#6b7280}
form.inline{display:inline}
button{font:inherit;padding:.1em .6em;cursor:pointer}
button.danger{color:#8a1c1c}
pre{background:#fff;border:1px solid #e3e6eb;padding:.6em;white-space:pre-wrap;word-break:break-all;max-width:100%}
nav.tabs a{margin-right:1em}
nav.tabs a.on{font-weight:700;text-decoration:none;color:#1d2330}
svg text{font:11px system-ui,sans-serif;fill:#6b7280}
nav.pages a{margin-right:1em}
";

/// The frame of every page.
fn layout(ctx: Option<&Ctx>, title: &str, body: Markup) -> Markup {
    frame(ctx, title, body, None)
}

/// [`layout`], with the live refresh's script (allowed by the response's nonce) when `live`
/// says where it reads and how often.
fn frame(ctx: Option<&Ctx>, title: &str, body: Markup, live: Option<&script::Spec>) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " - sqlbroker" }
                style { (PreEscaped(STYLE)) }
            }
            body {
                header {
                    a href="/" { "sqlbroker" }
                    a href="/metrics" { "metrics" }
                    a href="/actions" { "action log" }
                    a href="/periodics" { "schedules" }
                    @if ctx.is_some_and(|c| c.read_only) { span.ro { "read-only" } }
                    @if ctx.is_some_and(|c| c.token.is_some()) {
                        form method="post" action="/logout" { button type="submit" { "log out" } }
                    }
                    @if live.is_some() { span.muted #live data-k="live" { "reload for new counts" } }
                }
                main data-live=[live.map(|l| &l.url)] data-every=[live.map(|l| l.every_ms)] { (body) }
                @if let Some(l) = live {
                    script nonce=(l.nonce) { (PreEscaped(script::SCRIPT)) }
                }
            }
        }
    }
}

/// A page with a heading and one sentence (errors, not found).
pub(crate) fn message(title: &str, text: &str) -> Markup {
    layout(
        None,
        title,
        html! { h1 { (title) } p.err { (shown(text)) } },
    )
}

/// The token form (token mode).
pub(crate) fn login(problem: Option<&str>) -> Markup {
    layout(
        None,
        "Log in",
        html! {
            h1 { "Log in" }
            @if let Some(p) = problem { p.err { (p) } }
            form method="post" action="/login" {
                label { "Your name (for the action log) " input type="text" name="name" maxlength=(super::session::NAME_MAX); }
                " "
                label { "Token " input type="password" name="token" autofocus; }
                " " button type="submit" { "Log in" }
            }
        },
    )
}

/// A POST button for an action on `table`; nothing in read-only mode.
fn action(
    ctx: &Ctx,
    db: &Database,
    table: &str,
    verb: &str,
    label: &str,
    fields: &[(&str, String)],
    back: &str,
) -> Markup {
    if ctx.read_only {
        return html! {};
    }
    let danger = matches!(verb, "purge" | "cancel");
    html! {
        form.inline method="post" action={ (db.prefix) "/tables/" (table) "/" (verb) } {
            input type="hidden" name="csrf" value=(ctx.csrf);
            input type="hidden" name="back" value=(back);
            @for (k, v) in fields { input type="hidden" name=(k) value=(v); }
            button type="submit" class=[danger.then_some("danger")] { (label) }
        }
    }
}

/// A limit's form: a new max (empty lifts the limit), posted as the `limit` action (a rate
/// limit's: `rate`, with its window in milliseconds, since a key may have several) with the
/// page's CSRF token.
fn limit_form(
    ctx: &Ctx,
    db: &Database,
    table: &str,
    key: &str,
    back: &str,
    rate: Option<std::time::Duration>,
) -> Markup {
    let (action, most) = match rate {
        Some(_) => ("rate", sqlbroker::Table::MAX_RATE),
        None => ("limit", sqlbroker::Table::MAX_CONCURRENCY),
    };
    html! {
        form.inline method="post" action={ (db.prefix) "/tables/" (table) "/" (action) } {
            input type="hidden" name="csrf" value=(ctx.csrf);
            input type="hidden" name="back" value=(back);
            input type="hidden" name="key" value=(key);
            @if let Some(per) = rate {
                input type="hidden" name="per_ms" value=(per.as_millis());
            }
            input type="number" name="max" min="1" max=(most) size="5" placeholder="max";
            button type="submit" { "set (empty: lift)" }
        }
    }
}

fn done_note(rq: &Rq) -> Markup {
    html! { @if let Some(d) = rq.param("done") { p.done { (shown(d)) } } }
}

fn ago(t: SystemTime) -> String {
    age(SystemTime::now().duration_since(t).unwrap_or_default())
}

fn opt(n: Option<u64>) -> String {
    n.map_or_else(|| "-".into(), |n| n.to_string())
}

/// The cells of [`count_cells`].
const COUNT_CELLS: u32 = 9;

/// The counts of one table as table cells, linked to its listings: ready, limited (ready rows
/// a limit holds back, not in ready), scheduled, waiting (on other jobs, not in scheduled), in
/// flight, dead, completed, the oldest ready row's age, paused. Limited and waiting are `-`
/// where the table has no limits or dependencies.
fn count_cells(db: &Database, e: &Entry) -> Markup {
    let name = e.table.name();
    if e.missing {
        return html! {
            td colspan=(COUNT_CELLS) .err {
                "missing: the table does not exist (dropped by hand?); "
                code { "sqlbroker forget --table " (name) } " forgets its record"
            }
        };
    }
    let Some(p) = e.last() else {
        return html! { td colspan=(COUNT_CELLS) .muted { "not counted yet" } };
    };
    let s = &p.stats;
    let link = |state: &str, n: String| {
        html! { td.n { a data-k=(state) href={ (db.prefix) "/tables/" (name) "?state=" (state) } { (n) } } }
    };
    let v = count_values(e).unwrap_or_default();
    let get = |k: &str| {
        v.iter()
            .find(|(key, _)| *key == k)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    html! {
        (link("ready", get("ready")))
        td.n.limited data-k="limited" { (get("limited")) }
        (link("scheduled", get("scheduled")))
        td.n.waiting data-k="waiting" { (get("waiting")) }
        (link("in_flight", get("in_flight")))
        (link("dead", get("dead")))
        (link("completed", get("completed")))
        td.n data-k="oldest" { (get("oldest")) }
        td data-k="paused" { @if s.paused { span.paused { "paused" } } @else { "no" } }
    }
}

/// The values of [`count_cells`] by their `data-k` (what the live refresh sets as text), and
/// `counted`; `None` for a table missing or not counted yet.
pub(crate) fn count_values(e: &Entry) -> Option<Vec<(&'static str, String)>> {
    let p = e.last().filter(|_| !e.missing)?;
    let s = &p.stats;
    let waiting = e.table.has_dependencies().then_some(s.waiting);
    let mut v = vec![
        ("ready", s.ready.to_string()),
        ("limited", opt(s.limited)),
        ("scheduled", s.scheduled.to_string()),
        ("waiting", opt(waiting)),
        ("in_flight", opt(s.in_flight)),
        ("dead", s.dead.to_string()),
        ("completed", opt(s.completed)),
        ("oldest", s.oldest_ready_age.map_or_else(|| "-".into(), age)),
        ("paused", if s.paused { "paused" } else { "no" }.into()),
    ];
    if let Some(c) = counted_text(e) {
        v.push(("counted", c));
    }
    Some(v)
}

/// [`counted`] as text.
fn counted_text(e: &Entry) -> Option<String> {
    e.counted
        .map(|(at, took)| format!("{} ago, {} ms", ago(at), took.as_millis()))
}

/// When the counts were read, and how long that took.
fn counted(e: &Entry) -> Markup {
    html! { span.muted data-k="counted" { (counted_text(e).unwrap_or_default()) } }
}

/// Tables a page of the overview shows.
pub(crate) const OVERVIEW_PAGE: usize = 50;

/// The overview's tables, every database's in turn: those whose name holds `?q=` (any case),
/// the `?page=` (from 1) of [`OVERVIEW_PAGE`] of them; with how many matched, the page and
/// the filter as given.
pub(crate) struct Shown<'a> {
    pub sections: Vec<Section<'a>>,
    pub matched: usize,
    pub page: usize,
    pub q: String,
    /// A count or the listing failed, in any table (not only those shown): the overview
    /// answers 503.
    pub failing: bool,
}

/// One database's part of [`Shown`].
pub(crate) struct Section<'a> {
    pub db: &'a Database,
    pub entries: Vec<Entry>,
    pub list_error: Option<String>,
    pub absent: Vec<String>,
}

/// Reads the samplers' memory for the overview's page `rq` asks.
pub(crate) fn overview_tables<'a>(ctx: &'a Ctx, rq: &Rq) -> Shown<'a> {
    let q = shown(rq.param("q").unwrap_or_default().trim());
    let needle = q.to_lowercase();
    let page = rq
        .param("page")
        .and_then(|p| p.parse::<usize>().ok())
        .unwrap_or(1)
        .max(1);
    let (first, end) = ((page - 1) * OVERVIEW_PAGE, page * OVERVIEW_PAGE);
    let (mut failing, mut matched) = (false, 0);
    let mut sections = Vec::new();
    for db in &ctx.dbs {
        let (entries, list_error, absent) = match db.live() {
            Some((_, sampler)) => {
                let s = sampler.snapshot();
                (s.entries, s.list_error, s.absent)
            }
            None => (Vec::new(), Some(down_text(db)), Vec::new()),
        };
        // A missing table (its count found no table) or a named one this database does not
        // record is shown, not failing: a stale record would fail the check for ever.
        failing |= list_error.is_some() || entries.iter().any(|e| e.error.is_some());
        let mut kept = Vec::new();
        for e in entries {
            if !e.table.name().to_lowercase().contains(&needle) {
                continue;
            }
            if (first..end).contains(&matched) {
                kept.push(e);
            }
            matched += 1;
        }
        sections.push(Section {
            db,
            entries: kept,
            list_error,
            absent,
        });
    }
    Shown {
        sections,
        matched,
        page,
        q,
        failing,
    }
}

/// The key of a table in the live refresh's marks (`data-t`).
pub(crate) fn table_key(db: &Database, name: &str) -> String {
    format!("{}/{name}", db.name)
}

/// `/`: every database's tables with their counts, errors and charts; those whose name holds
/// `?q=`, 50 a page (`?page=`).
pub(crate) fn overview(ctx: &Ctx, rq: &Rq) -> Reply {
    let Shown {
        sections,
        matched,
        page,
        q,
        failing,
    } = overview_tables(ctx, rq);
    let pages = matched.div_ceil(OVERVIEW_PAGE).max(1);
    let link = |page: usize| {
        let mut pairs = vec![("page", page.to_string())];
        if !q.is_empty() {
            pairs.insert(0, ("q", q.clone()));
        }
        let pairs: Vec<(&str, &str)> = pairs.iter().map(|(k, v)| (*k, v.as_str())).collect();
        format!("/?{}", query_of(&pairs))
    };
    let from = ((page - 1) * OVERVIEW_PAGE + 1).min(matched);
    let to = (page * OVERVIEW_PAGE).min(matched);
    let body = html! {
        h1 { "Queue tables" }
        (done_note(rq))
        form.overview-filter method="get" action="/" {
            label { "table name contains " input #q type="search" name="q" value=(q) size="24" maxlength="64" autocomplete="off"; }
            " " button type="submit" { "filter" }
            @if !q.is_empty() { " " a href="/" { "clear" } }
            " " span.muted.shown-count {
                @if matched == 0 { "no table" @if !q.is_empty() { " matches" } }
                @else { "tables " (from) "-" (to) " of " (matched) @if !q.is_empty() { " matching" } }
            }
        }
        @if pages > 1 {
            nav.pages {
                @if page > 1 { a.prev href=(link(page - 1)) { "previous page" } }
                span.muted { "page " (page) " of " (pages) } " "
                @if page < pages { a.next href=(link(page + 1)) { "next page" } }
            }
        }
        @for sec in &sections {
            @if ctx.several() {
                h2.db { "Database " (sec.db.name) " " span.muted { (sec.db.shown) } }
            }
            @if let Some(e) = &sec.list_error { p.err { "Listing the tables failed: " (shown(e)) } }
            @if sec.entries.is_empty() && sec.list_error.is_none() && q.is_empty() && page == 1 {
                p.muted { "No recorded tables (create_table or migrate records one), or none of the named ones." }
            }
            @if !sec.absent.is_empty() {
                p.muted { "not recorded in this database: " (sec.absent.join(", ")) }
            }
            table {
                tr {
                    th { "table" } th { "form" } th { "ready" } th { "limited" } th { "scheduled" }
                    th { "waiting" } th { "in flight" } th { "dead" } th { "completed" }
                    th { "oldest ready" } th { "paused" } th { "counted" } th { "" }
                }
                @for e in &sec.entries {
                    tr data-t=(table_key(sec.db, e.table.name())) data-name=(e.table.name()) {
                        td { a href={ (sec.db.prefix) "/tables/" (e.table.name()) } { (e.table.name()) } }
                        td { (e.table.form().name()) }
                        (count_cells(sec.db, e))
                        td { (counted(e)) }
                        td { (pause_button(ctx, sec.db, e, "/")) }
                    }
                    @if let Some(err) = &e.error {
                        tr { td colspan=(COUNT_CELLS + 4) { p.err { "Counting " (e.table.name()) " failed: " (shown(err)) } } }
                    }
                }
            }
        }
        p.muted {
            "Counted every " (ctx.sample.as_secs()) " s in the background (Broker::stats: one \
             scan per table); an action recounts its table at once. With scripts on, this page \
             updates its counts and charts every " (script::every(ctx).as_secs()) " s while it is \
             visible. Row lock and advisory lock \
             tables count rows in work as ready (in flight: -). Limited: ready rows a concurrency \
             or rate limit holds back (not in ready); waiting: rows waiting on other jobs (not in \
             scheduled)."
        }
        h2 { "Throughput and failures" }
        p.muted { (chart::legend()) }
        @for sec in &sections {
            @for e in sec.entries.iter().filter(|e| !e.missing) {
                div.chart data-t=(table_key(sec.db, e.table.name())) data-name=(e.table.name()) {
                    h2 {
                        a href={ (sec.db.prefix) "/tables/" (e.table.name()) } { (e.table.name()) }
                        @if ctx.several() { " " span.muted { "(" (sec.db.name) ")" } }
                    }
                    (chart::svg(e))
                }
            }
        }
    };
    let spec = script::Spec::new(ctx, "/live".into());
    script::reply(
        if failing { 503 } else { 200 },
        frame(Some(ctx), "Tables", body, Some(&spec)),
        spec,
    )
}

/// What a page says of a database that is down.
pub(crate) fn down_text(db: &Database) -> String {
    format!(
        "the database is not reachable (tried again every few seconds): {}",
        db.down().unwrap_or_default()
    )
}

/// `/actions`: each database's action log, newest first.
pub(crate) fn actions(ctx: &Ctx) -> Reply {
    let mut failing = false;
    let logs: Vec<_> = ctx
        .dbs
        .iter()
        .map(|db| {
            // `--table` restricts the log too: another table's entries name its jobs,
            // filters, operators and their addresses.
            let names: Vec<&str> = ctx.tables.iter().map(String::as_str).collect();
            let log = match db.live() {
                Some((broker, _)) if names.is_empty() => broker.actions(ACTIONS_SHOWN),
                Some((broker, _)) => broker.actions_on(&names, ACTIONS_SHOWN),
                None => Ok(Vec::new()),
            };
            let log = match db.live() {
                Some(_) => log.map_err(|e| crate::chain(&e)),
                None => Err(down_text(db)),
            };
            failing |= log.is_err();
            (db, log)
        })
        .collect();
    let body = html! {
        h1 { "Action log" }
        p.muted {
            "What operators did, kept in each database (table sqlbroker_actions); the newest " (ACTIONS_SHOWN) " of each"
            @if !ctx.tables.is_empty() { ", on the tables shown here" }
            "."
        }
        @for (db, log) in &logs {
            @if ctx.several() { h2.db { "Database " (db.name) " " span.muted { (db.shown) } } }
            @match log {
                Err(e) => p.err { "Reading the action log failed: " (shown(e)) },
                Ok(entries) if entries.is_empty() => p.muted { "No action recorded yet." },
                Ok(entries) => table.log {
                    tr { th { "when" } th { "who" } th { "action" } th { "table" } th { "on" } th { "rows" } }
                    @for a in entries {
                        tr {
                            td { (utc(a.at)) }
                            td { (shown(&a.who)) }
                            td { (shown(&a.action)) }
                            td { a href={ (db.prefix) "/tables/" (a.table) } { (shown(&a.table)) } }
                            td { (shown(&a.detail)) }
                            td.n { (a.rows) }
                        }
                    }
                },
            }
        }
    };
    Reply::html(
        if failing { 503 } else { 200 },
        layout(Some(ctx), "Action log", body),
    )
}

/// Entries of each database's action log shown.
const ACTIONS_SHOWN: usize = 100;

/// The periodic schedules recorded on each database (`Broker::periodics`), with the database's
/// maintainer (`Broker::maintainer`), and a pause or resume button per schedule. With
/// `--table`, only the schedules of those tables.
pub(crate) fn periodics(ctx: &Ctx, rq: &Rq) -> Reply {
    let mut failing = false;
    let dbs: Vec<_> = ctx
        .dbs
        .iter()
        .map(|db| {
            let read = match db.live() {
                Some((broker, _)) => broker
                    .periodics()
                    .map(|all| {
                        all.into_iter()
                            .filter(|p| {
                                ctx.tables.is_empty() || ctx.tables.iter().any(|t| t == p.table())
                            })
                            .collect::<Vec<_>>()
                    })
                    .and_then(|p| Ok((p, broker.maintainer()?)))
                    .map_err(|e| crate::chain(&e)),
                None => Err(down_text(db)),
            };
            failing |= read.is_err();
            (db, read)
        })
        .collect();
    let now = SystemTime::now();
    let body = html! {
        h1 { "Periodic schedules" }
        (done_note(rq))
        p.muted {
            "Every schedule a process runs (Broker::periodic), from table sqlbroker_periodics: a \
             paused one publishes nothing on any process; an orphaned one has not been run by \
             any process for a minute."
        }
        @for (db, read) in &dbs {
            @if ctx.several() { h2.db { "Database " (db.name) " " span.muted { (db.shown) } } }
            @match read {
                Err(e) => p.err { "Reading the schedules failed: " (shown(e)) },
                Ok((schedules, maintainer)) => {
                    p {
                        @match maintainer {
                            Some(m) => { "Maintained by " (shown(m.host())) " (pid " (m.pid()) ") since " (utc(m.since())) ", term " (m.term()) "." }
                            None => { "No maintainer holds the lease now." }
                        }
                    }
                    @if schedules.is_empty() {
                        p.muted { "No periodic schedule recorded." }
                    } @else {
                        table.log {
                            tr { th { "table" } th { "name" } th { "schedule" } th { "next" } th { "last" } th { "state" } th { "seen" } th {} }
                            @for p in schedules {
                                tr {
                                    td { a href={ (db.prefix) "/tables/" (p.table()) } { (shown(p.table())) } }
                                    td { (shown(p.name())) }
                                    td { (shown(p.schedule())) " " span.muted { (shown(p.time_zone())) } }
                                    td { (p.next_tick().map_or_else(|| "-".into(), utc)) }
                                    td { (p.last_tick().map_or_else(|| "-".into(), utc)) }
                                    td { @if p.orphaned() { "orphaned" } @else if p.paused() { "paused" } @else { "running" } }
                                    td { (age(now.duration_since(p.last_seen()).unwrap_or_default())) " ago" }
                                    td {
                                        @if !ctx.read_only {
                                            form.inline method="post" action={ (db.prefix) "/periodics/" (if p.paused() { "resume" } else { "pause" }) } {
                                                input type="hidden" name="csrf" value=(ctx.csrf);
                                                input type="hidden" name="name" value=(p.name());
                                                button type="submit" { (if p.paused() { "resume" } else { "pause" }) }
                                            }
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    };
    Reply::html(
        if failing { 503 } else { 200 },
        layout(Some(ctx), "Periodic schedules", body),
    )
}

fn pause_button(ctx: &Ctx, db: &Database, e: &Entry, back: &str) -> Markup {
    let paused = e.last().is_some_and(|p| p.stats.paused);
    let name = e.table.name();
    if paused {
        action(ctx, db, name, "resume", "resume", &[], back)
    } else {
        action(ctx, db, name, "pause", "pause", &[], back)
    }
}

/// The fields of a listing's filter, kept by its links and its bulk forms.
const FILTER_FIELDS: [&str; 5] = ["column", "value", "error", "queue", "kind"];

/// `pairs` as a query string, escaped.
fn query_of(pairs: &[(&str, &str)]) -> String {
    form_urlencoded::Serializer::new(String::new())
        .extend_pairs(pairs)
        .finish()
}

/// A table with queues: each queue's counts (read now, one grouped count) and its pause or
/// resume button.
/// The signals the table's jobs wait for (`Broker::waiting_signals`), each with how many jobs
/// wait; nothing while none is waited for.
fn signals_section(db: &Database, table: &Table) -> Markup {
    match db.broker().waiting_signals(table) {
        Err(e) => {
            html! { p.err { "Reading the waiting signals failed: " (shown(&crate::chain(&e))) } }
        }
        Ok(list) if list.is_empty() => html! {},
        Ok(list) => html! {
            h2 { "Waiting signals" }
            table {
                tr { th { "signal" } th { "jobs waiting" } }
                @for s in &list {
                    tr { td { code { (shown(s.name())) } } td { (s.jobs()) } }
                }
            }
            p.muted { "Sent with " code { "sqlbroker signal --table " (table.name()) " NAME" } "." }
        },
    }
}

fn queues_section(ctx: &Ctx, db: &Database, table: &Table, back: &str) -> Markup {
    let b = db.broker();
    let counted = b.queue_stats(table);
    let paused = b.paused_queues(table).unwrap_or_default();
    let name = table.name();
    html! {
        h2 { "Queues" }
        @match &counted {
            Err(e) => p.err { "Counting the queues failed: " (shown(&crate::chain(e))) },
            Ok(list) => {
                table {
                    tr {
                        th { "queue" } th { "ready" } th { "scheduled" } th { "in flight" }
                        th { "dead" } th { "oldest ready" } th { "paused" } th { "" }
                    }
                    @for (q, s) in list {
                        tr {
                            td { a href={ (db.prefix) "/tables/" (name) "?" (query_of(&[("queue", q)])) } { code { (shown(q)) } } }
                            td { (s.ready) }
                            td { (s.scheduled) }
                            td { (opt(s.in_flight)) }
                            td { (s.dead) }
                            td { (s.oldest_ready_age.map_or_else(|| "-".into(), age)) }
                            td { @if s.paused { span.paused { "paused" } } @else { "no" } }
                            td {
                                @if paused.contains(q) {
                                    (action(ctx, db, name, "resume_queue", "resume", &[("queue", q.clone())], back))
                                } @else {
                                    (action(ctx, db, name, "pause_queue", "pause", &[("queue", q.clone())], back))
                                }
                            }
                        }
                    }
                    // Paused queues with no row (paused ahead of their first jobs).
                    @for q in paused.iter().filter(|q| !list.iter().any(|(n, _)| n == *q)) {
                        tr {
                            td { code { (shown(q)) } } td { "0" } td { "0" } td { "-" } td { "0" } td { "" }
                            td { span.paused { "paused" } }
                            td { (action(ctx, db, name, "resume_queue", "resume", &[("queue", q.clone())], back)) }
                        }
                    }
                }
            }
        }
    }
}

/// What a table's page lists: the state asked (`?state=`), the cursor (`?after=`), the
/// filter, the sampler's entry, when the last count found that state empty (then nothing is
/// read), and the jobs read.
pub(crate) struct Listing {
    pub state: JobState,
    /// Row lock and advisory forms: ready rows and rows in work are listed together.
    pub unprobed: bool,
    pub after: Option<i64>,
    pub filter: Result<JobFilter, String>,
    pub entry: Option<Entry>,
    pub empty_at: Option<SystemTime>,
    pub listed: Result<Vec<Job>, sqlbroker::BrokerError>,
}

/// Reads one page of `table`'s jobs as `rq` asks (the page and its live refresh alike).
pub(crate) fn listing(db: &Database, rq: &Rq, table: &Table) -> Listing {
    // Row lock and advisory forms: a listing does not probe (the probe would take the due
    // rows' locks or keys, which the claimers want), so it cannot tell a due row in work from
    // a ready one: both are listed as due, on the ready page.
    let unprobed = table.form() != Form::Lease;
    let state = match rq.param("state").and_then(state_from) {
        Some(JobState::InFlight) if unprobed => JobState::Ready,
        Some(s) => s,
        None => JobState::Ready,
    };
    let after = rq.param("after").and_then(|a| a.parse::<i64>().ok());
    let filter = filter_of(table, &rq.query);
    let entry = db.sampler().entry(table.name());
    // A state the last count found empty is not listed (unless asked): listing it would scan
    // the table by id for nothing.
    let empty_at = entry.as_ref().and_then(|e| {
        let p = e.last()?;
        let s = &p.stats;
        let n = match state {
            JobState::Scheduled => Some(s.scheduled + s.waiting),
            JobState::Dead => Some(s.dead),
            JobState::Completed => s.completed,
            // Row lock and advisory forms count rows in work as ready.
            JobState::InFlight => s.in_flight.or(Some(s.ready)),
            _ => Some(s.ready),
        };
        (n == Some(0) && rq.param("scan") != Some("1")).then_some(p.at)
    });
    let listed = match (&filter, empty_at) {
        (Err(_), _) | (_, Some(_)) => Ok(Vec::new()),
        (Ok(f), None) if !f.is_empty() => {
            db.broker()
                .jobs_matching(table, state, f, after, PAGE, PREVIEW_BYTES)
        }
        (Ok(_), None) => db
            .broker()
            .jobs_preview(table, state, after, PAGE, PREVIEW_BYTES),
    };
    Listing {
        state,
        unprobed,
        after,
        filter,
        entry,
        empty_at,
        listed,
    }
}

/// The filter's fields as a query's tail (`&column=..`), kept by every link of a listing.
fn kept_filter(rq: &Rq) -> String {
    let kept: String = form_urlencoded::Serializer::new(String::new())
        .extend_pairs(
            FILTER_FIELDS
                .into_iter()
                .filter_map(|k| rq.param(k).filter(|v| !v.is_empty()).map(|v| (k, v))),
        )
        .finish();
    if kept.is_empty() {
        kept
    } else {
        format!("&{kept}")
    }
}

/// `/tables/<name>?state=..&after=..`: the table's counts and one page of its jobs in a
/// state, by id (keyset paging: `after` is the last id of the previous page).
pub(crate) fn table(ctx: &Ctx, db: &Database, rq: &Rq, table: &Table) -> Reply {
    let name = table.name();
    if db.sampler().entry(name).is_some_and(|e| e.missing) {
        return Reply::html(
            404,
            message(
                &format!("Table {name}"),
                &format!(
                    "the table does not exist (dropped by hand?); its record is left: \
                     `sqlbroker forget --table {name}` forgets it"
                ),
            ),
        );
    }
    let Listing {
        state,
        unprobed,
        after,
        filter,
        entry,
        empty_at,
        listed,
    } = listing(db, rq, table);
    let filtered = filter.as_ref().map_or(true, |f| !f.is_empty());
    let kept = kept_filter(rq);
    let base = format!("{}/tables/{name}?state={}", db.prefix, state_slug(state));
    let here = match after {
        Some(a) => format!("{base}&after={a}{kept}"),
        None => format!("{base}{kept}"),
    };
    let states = [
        JobState::Ready,
        JobState::Scheduled,
        JobState::InFlight,
        JobState::Dead,
        JobState::Completed,
    ];
    let failed = listed.is_err() || entry.as_ref().is_some_and(|e| e.error.is_some());
    let body = html! {
        h1 { "Table " (name) }
        (done_note(rq))
        p.muted { (table.form().name()) " form" }
        @if let Some(e) = &entry {
            @if let Some(err) = &e.error { p.err { "Counting failed: " (shown(err)) } }
            table {
                tr {
                    th { "ready" } th { "limited" } th { "scheduled" } th { "waiting" }
                    th { "in flight" } th { "dead" } th { "completed" } th { "oldest ready" }
                    th { "paused" } th { "counted" }
                }
                tr data-t=(table_key(db, name)) { (count_cells(db, e)) td { (counted(e)) } }
            }
            @if let Some(p) = e.last().filter(|_| table.has_dependencies()) {
                p { (p.stats.waiting) " waiting on other jobs (listed with the scheduled ones)" }
            }
            @if table.has_dependencies() {
                (signals_section(db, table))
            }
            p { (pause_button(ctx, db, e, &here)) }
            @if table.has_queues() {
                (queues_section(ctx, db, table, &here))
            }
            @if let Some(p) = e.last().filter(|p| !p.limits.is_empty()) {
                h2 { "Concurrency limits" }
                table {
                    tr {
                        th { "key" } th { "max" } th { "described" } th { "in work" } th { "waiting" }
                        @if !ctx.read_only { th { "set" } }
                    }
                    @for l in &p.limits {
                        tr {
                            td { code { (format!("{:?}", l.key)) } }
                            td { (l.max.map_or_else(|| "lifted".to_string(), |m| m.to_string())) }
                            td { (l.described) }
                            td { (opt(l.in_work)) }
                            td { (opt(l.waiting)) }
                            @if !ctx.read_only { td { (limit_form(ctx, db, name, &l.key, &here, None)) } }
                        }
                    }
                }
                @if let Some(n) = p.stats.limited {
                    p.muted { (n) " ready rows are held back by a limit (not in ready)." }
                }
            }
            @if let Some(p) = e.last().filter(|p| !p.rates.is_empty()) {
                h2 { "Rate limits" }
                table {
                    tr {
                        th { "key" } th { "max" } th { "per" } th { "described" } th { "claimed in the window" } th { "waiting" }
                        @if !ctx.read_only { th { "set" } }
                    }
                    @for r in &p.rates {
                        tr {
                            td { code { (format!("{:?}", r.key)) } }
                            td { (r.max.map_or_else(|| "lifted".to_string(), |m| m.to_string())) }
                            td { (format!("{:?}", r.per)) }
                            td { (r.described) }
                            td { (r.claimed) }
                            td { (r.waiting) }
                            @if !ctx.read_only { td { (limit_form(ctx, db, name, &r.key, &here, Some(r.per))) } }
                        }
                    }
                }
            }
        }
        nav.tabs {
            @for s in states {
                @if !(unprobed && s == JobState::InFlight) {
                    a class=[(s == state).then_some("on")] href={ (db.prefix) "/tables/" (name) "?state=" (state_slug(s)) (kept) } { (state_label(s, unprobed)) }
                }
            }
        }
        @if unprobed && state == JobState::Ready {
            p.muted {
                "A " (table.form().name()) " table's row in work leaves no mark in the row: the due \
                 rows are listed whether ready or in work (telling them apart would lock each \
                 row or key, which the workers want). A job's own page tells its state."
            }
        }
        (filter_form(ctx, db, table, state, rq, &filter, &here))
        @if state == JobState::Dead && !filtered {
            p {
                (action(ctx, db, name, "requeue", "requeue all dead letters", &[("all", "1".into())], &here))
                " "
                (action(ctx, db, name, "purge", "purge all dead letters", &[("all", "1".into())], &here))
            }
        }
        @match &listed {
            Err(e) => p.err { "Listing the jobs failed: " (shown(&crate::chain(e))) },
            Ok(_) if empty_at.is_some() => {
                (job_list(ctx, db, name, state, unprobed, &[], &here, Some(html! {
                    "No " (state.name()) " jobs at the last count, "
                    (empty_at.map(ago).unwrap_or_default()) " ago. "
                    a href={ (base) "&scan=1" (kept) } { "list now" }
                })))
            },
            Ok(jobs) => {
                (job_list(ctx, db, name, state, unprobed, jobs, &here, None))
                p {
                    @if after.is_some() {
                        a href={ (base) (kept) } { "first page" } " "
                    }
                    @if jobs.len() == PAGE {
                        @if let Some(last) = jobs.last() {
                            a href={ (base) "&after=" (last.id()) (kept) } { "next page" }
                        }
                    }
                }
            }
        }
        @if let Some(e) = &entry {
            h2 { "Throughput and failures" }
            p.muted { (chart::legend()) }
            div.chart data-t=(table_key(db, name)) { (chart::svg(e)) }
        }
    };
    let title = format!("Table {name}");
    let spec = script::Spec::new(ctx, format!("{}/tables/{name}/live", db.prefix));
    script::reply(
        if failed { 503 } else { 200 },
        frame(Some(ctx), &title, body, Some(&spec)),
        spec,
    )
}

/// The filter of a listing (a GET form: filtering reads, so it is there read-only too), what
/// it matched, and the bulk actions on every job matching it (POST, not read-only).
fn filter_form(
    ctx: &Ctx,
    db: &Database,
    table: &Table,
    state: JobState,
    rq: &Rq,
    filter: &Result<JobFilter, String>,
    here: &str,
) -> Markup {
    let name = table.name();
    let columns: Vec<&str> = table
        .columns()
        .filter(|(_, t)| matches!(t, ColumnType::Text | ColumnType::Int | ColumnType::Float))
        .map(|(n, _)| n)
        .collect();
    let chosen = rq.param("column").unwrap_or_default();
    let verbs = bulk_verbs(state);
    // Where the last "cancel all matching" stopped, if it stopped early.
    let go_on = rq.param("bulk_after").and_then(|a| a.parse::<i64>().ok());
    html! {
        form.filter method="get" action={ (db.prefix) "/tables/" (name) } {
            input type="hidden" name="state" value=(state_slug(state));
            @if !columns.is_empty() {
                label { "column " select name="column" {
                    option value="" { "-" }
                    @for c in &columns { option value=(c) selected[*c == chosen] { (c) } }
                } }
                " "
                label { "= " input type="text" name="value" value=(rq.param("value").unwrap_or_default()) size="16"; }
                " "
            }
            @if table.has_queues() {
                label { "queue " input type="text" name="queue" value=(rq.param("queue").unwrap_or_default()) size="12" maxlength="64"; }
                " "
            }
            @if table.has_kinds() {
                label { "kind " input type="text" name="kind" value=(rq.param("kind").unwrap_or_default()) size="12" maxlength="64"; }
                " "
            }
            label { "last error contains " input type="text" name="error" value=(rq.param("error").unwrap_or_default()) size="24" maxlength=(sqlbroker::MAX_FILTER_TEXT); }
            " " button type="submit" { "filter" }
            " " a href={ (db.prefix) "/tables/" (name) "?state=" (state_slug(state)) } { "clear" }
        }
        @match filter {
            Err(why) => p.err { "The filter was refused: " (shown(why)) },
            Ok(f) if !f.is_empty() => {
                p.muted { "Showing " (shown(&describe(state, f))) "." }
                @if !ctx.read_only && !verbs.is_empty() {
                    p.bulk {
                        @match db.broker().count_matching(table, &f.clone().in_state(state)) {
                            Ok(n) => { strong { (n) } " matching now. " }
                            Err(e) => { span.err { "Not counted: " (shown(&crate::chain(&e))) } " " }
                        }
                        @for verb in &verbs {
                            form.inline method="post" action={ (db.prefix) "/tables/" (name) "/bulk" } {
                                input type="hidden" name="csrf" value=(ctx.csrf);
                                input type="hidden" name="back" value=(here);
                                input type="hidden" name="verb" value=(verb);
                                input type="hidden" name="state" value=(state_slug(state));
                                @for k in FILTER_FIELDS {
                                    @if let Some(v) = rq.param(k) { input type="hidden" name=(k) value=(v); }
                                }
                                // A cancel that stopped early goes on after the last job it read.
                                @if let Some(a) = go_on.filter(|_| *verb == "cancel") {
                                    input type="hidden" name="after" value=(a);
                                }
                                button type="submit" class=[(*verb != "retry").then_some("danger")] { (verb) " all matching" }
                            }
                            " "
                        }
                        span.muted { "(in batches of " (BATCH) ", at most " (BULK_MAX) " jobs a press)" }
                        @if let Some(a) = go_on {
                            " " span.muted { "The next cancel goes on after job " (a) " (" a href=(here) { "start over" } ")." }
                        }
                    }
                }
            }
            Ok(_) => {}
        }
    }
}

/// A state's name in a listing: "due (ready or in work)" for the ready rows of a table
/// whose listing cannot tell them apart (`unprobed`).
fn state_label(state: JobState, unprobed: bool) -> &'static str {
    match state {
        JobState::Ready if unprobed => "due (ready or in work)",
        s => s.name(),
    }
}

/// One page of jobs, each payload's first characters and its length (read by the database:
/// `Broker::jobs_preview`); `none` (else "No .. jobs") when there are none. The table is there
/// even then (hidden), and its body marked, for the live refresh to fill.
#[allow(clippy::too_many_arguments)]
fn job_list(
    ctx: &Ctx,
    db: &Database,
    name: &str,
    state: JobState,
    unprobed: bool,
    jobs: &[Job],
    back: &str,
    none: Option<Markup>,
) -> Markup {
    let shown: Vec<&Job> = jobs.iter().filter(|j| j.state() == state).collect();
    let none = none.unwrap_or_else(|| html! {
        "No " (state_label(state, unprobed)) " jobs" @if jobs.len() == PAGE { " on this page" } "."
    });
    html! {
        p.muted data-none hidden[!shown.is_empty()] { (none) }
        table.jobs hidden[shown.is_empty()] {
            thead {
                tr {
                    th { "id" } th { "state" } th { "attempts" } th { "errors" } th { "due" }
                    th { @if state == JobState::Dead { "reason / last error" } @else { "last error" } }
                    th { "payload" } th { "" }
                }
            }
            tbody data-jobs=(format!("{}/tables/{name}", db.prefix)) data-back=(back)
                data-csrf=[(!ctx.read_only).then_some(&ctx.csrf)] {
                @for j in shown {
                    tr data-id=(j.id()) {
                        td.n { a href={ (db.prefix) "/tables/" (name) "/jobs/" (j.id()) } { (j.id()) } }
                        td { (state_label(j.state(), unprobed)) }
                        td.n { (j.attempts()) }
                        td.n { (j.errors()) }
                        td { (utc(j.due_at())) }
                        td {
                            @if let Some(r) = j.dead_reason() { strong { (snippet(r)) } br; }
                            @if let Some(e) = j.last_error() { span.muted { (snippet(e)) } }
                        }
                        td { code { (preview(j.payload())) } " " span.muted { "(" (j.payload_len()) " bytes)" } }
                        td { (job_actions(ctx, db, name, j, back)) }
                    }
                }
            }
        }
    }
}

/// One job of a listing as the live refresh draws it (every text as text, escaped for the
/// screen as the page does), with the buttons its row offers: (verb, label).
pub(crate) fn job_json(ctx: &Ctx, j: &Job, unprobed: bool) -> serde_json::Value {
    let actions: &[(&str, &str)] = match j.state() {
        _ if ctx.read_only => &[],
        JobState::Dead => &[("requeue", "requeue"), ("purge", "purge")],
        JobState::Completed => &[],
        JobState::Scheduled => &[("run", "run now"), ("cancel", "cancel")],
        _ => &[("cancel", "cancel")],
    };
    serde_json::json!({
        "id": j.id(),
        "state": state_label(j.state(), unprobed),
        "attempts": j.attempts(),
        "errors": j.errors(),
        "due": utc(j.due_at()),
        "reason": j.dead_reason().map(snippet),
        "error": j.last_error().map(snippet),
        "payload": preview(j.payload()),
        "len": j.payload_len(),
        "actions": actions,
    })
}

/// The first [`SNIPPET`] characters of stored text, [`shown`].
fn snippet(s: &str) -> String {
    shown(&preview_chars(s, SNIPPET))
}

fn preview_chars(s: &str, n: usize) -> String {
    match s.char_indices().nth(n) {
        Some((at, _)) => format!("{}...", &s[..at]),
        None => s.to_string(),
    }
}

fn job_actions(ctx: &Ctx, db: &Database, name: &str, j: &Job, back: &str) -> Markup {
    let id = [("id", j.id().to_string())];
    html! {
        @match j.state() {
            JobState::Dead => {
                (action(ctx, db, name, "requeue", "requeue", &id, back)) " "
                (action(ctx, db, name, "purge", "purge", &id, back))
            }
            JobState::Completed => {}
            JobState::Scheduled => {
                (action(ctx, db, name, "run", "run now", &id, back)) " "
                (action(ctx, db, name, "cancel", "cancel", &id, back))
            }
            _ => (action(ctx, db, name, "cancel", "cancel", &id, back)),
        }
    }
}

/// `/tables/<name>/jobs/<id>`: one job, its payload shown safely, and what its row tells of
/// its history.
pub(crate) fn job(ctx: &Ctx, db: &Database, rq: &Rq, table: &Table, id: i64) -> Reply {
    let name = table.name();
    let here = format!("{}/tables/{name}/jobs/{id}", db.prefix);
    let found = db.broker().job(table, id);
    let (status, body) = match &found {
        Err(e) => (
            503,
            html! { h1 { "Job " (id) " of " (name) } p.err { "Reading the job failed: " (shown(&crate::chain(e))) } },
        ),
        Ok(None) => (
            404,
            html! {
                h1 { "Job " (id) " of " (name) }
                (done_note(rq))
                p { "No row has this id: acked and deleted, purged, cancelled, or never there." }
                p { a href={ (db.prefix) "/tables/" (name) } { "back to " (name) } }
            },
        ),
        Ok(Some(j)) => (200, job_body(ctx, db, rq, name, j, &here)),
    };
    let title = format!("Job {id} of {name}");
    Reply::html(status, layout(Some(ctx), &title, body))
}

fn job_body(ctx: &Ctx, db: &Database, rq: &Rq, name: &str, j: &Job, here: &str) -> Markup {
    let time = |t: Option<SystemTime>| t.map_or_else(|| "-".into(), utc);
    html! {
        h1 { "Job " (j.id()) " of " a href={ (db.prefix) "/tables/" (name) } { (name) } }
        (done_note(rq))
        p { (job_actions(ctx, db, name, j, here)) }
        table {
            tr { th { "state" } td { (j.state().name()) @if j.cancel_requested() { " (cancel requested)" } } }
            tr { th { "attempts" } td { (j.attempts()) } }
            tr { th { "errors" } td { (j.errors()) @if j.abandoned() { " (last claim lost: its lease ran out unsettled)" } } }
            tr { th { "dead reason" } td { (shown(j.dead_reason().unwrap_or("-"))) } }
            tr { th { "last error" } td { pre { (shown_lines(j.last_error().unwrap_or("-"))) } } }
            @if let Some(w) = j.signal_wait() {
                tr { th { "waits for signal" } td { (super::super::jobs::signal_wait(w)) } }
            }
            @if !j.waits_on().is_empty() {
                tr { th { "waits on" } td {
                    @for (i, d) in j.waits_on().iter().enumerate() {
                        @if i > 0 { ", " }
                        a href={ (db.prefix) "/tables/" (d.table) "/jobs/" (d.id) } { (super::super::jobs::job_ref(name, &d.table, d.id)) }
                        " (" (d.outcome.map_or("pending", super::super::jobs::outcome_word))
                        @if d.any_outcome { ", any outcome" } ")"
                    }
                } }
            }
            @if !j.dependents().is_empty() {
                tr { th { "waited on by" } td {
                    @for (i, (t, id)) in j.dependents().iter().enumerate() {
                        @if i > 0 { ", " }
                        a href={ (db.prefix) "/tables/" (t) "/jobs/" (id) } { (super::super::jobs::job_ref(name, t, *id)) }
                    }
                } }
            }
            @if let Some(o) = j.output() {
                tr { th { "output" } td { code { (preview(o)) } " " span.muted { "(" (o.len()) " bytes)" } } }
            }
            @if let Some(c) = j.checkpoint() {
                tr { th { "checkpoint" } td { code { (preview(c)) } " " span.muted { "(" (c.len()) " bytes)" } } }
            }
            @if let Some(tp) = j.traceparent() {
                tr { th { "traceparent" } td { code { (shown(tp)) } } }
            }
            @for (c, v) in j.values() {
                tr { th { (c) } td { (value(v)) } }
            }
        }
        h2 { "History" }
        table {
            tr { th { "published" } td { (time(j.published_at())) } }
            tr { th { "due" } td { (utc(j.due_at())) } }
            @if let Some(t) = j.lease_until() {
                tr { th { "lease until" } td { (utc(t)) } }
            }
            tr {
                th { "tried" }
                td { (j.attempts()) " attempts, " (j.errors()) " failed"
                     @if let Some(e) = j.last_error() { ", last: " (snippet(e)) } }
            }
            tr {
                th { @match j.state() { JobState::Completed => "completed", JobState::Dead => "dead-lettered", _ => "finished" } }
                td { (time(j.finished_at())) @if let Some(r) = j.dead_reason() { " (" (shown(r)) ")" } }
            }
        }
        h2 { "Payload (" (j.payload().len()) " bytes)" }
        (payload(j.payload()))
    }
}

/// A column's value as text.
fn value(v: &Value) -> Markup {
    match v {
        Value::Null => html! { span.muted { "NULL" } },
        Value::Int(n) => html! { (n) },
        Value::Float(f) => html! { (f) },
        Value::Text(s) => html! { (shown(s)) },
        Value::Bytes(b) => payload(b),
        Value::Time(t) => html! { (utc(*t)) },
        #[allow(unreachable_patterns)]
        other => html! { (format!("{other:?}")) },
    }
}

/// A payload: as text when it is UTF-8 without control characters other than line breaks
/// and tabs (its CRs, bidi controls and line separators [`shown_lines`] as escapes), else as
/// a hex dump; at most [`PAYLOAD_SHOWN`] bytes.
fn payload(bytes: &[u8]) -> Markup {
    let shown = &bytes[..bytes.len().min(PAYLOAD_SHOWN)];
    let text = match std::str::from_utf8(shown) {
        Ok(t) => Some(t),
        // A character cut by the limit: the part before it.
        Err(e) if e.error_len().is_none() && shown.len() < bytes.len() => {
            std::str::from_utf8(&shown[..e.valid_up_to()]).ok()
        }
        Err(_) => None,
    }
    .filter(|t| {
        !t.chars()
            .any(|c| c.is_control() && !matches!(c, '\n' | '\r' | '\t'))
    });
    let rest = bytes.len() - shown.len();
    html! {
        @match text {
            Some(t) => pre.payload { (shown_lines(t)) },
            None => pre.payload.hex { (hex_dump(shown)) },
        }
        @if rest > 0 { p.muted { "... " (rest) " more bytes not shown" } }
    }
}

/// 16 bytes a line: offset, hex, printable ASCII.
fn hex_dump(bytes: &[u8]) -> String {
    let mut out = String::new();
    for (i, line) in bytes.chunks(16).enumerate() {
        let hex: Vec<String> = line.iter().map(|b| format!("{b:02x}")).collect();
        let ascii: String = line
            .iter()
            .map(|&b| {
                if b.is_ascii_graphic() || b == b' ' {
                    b as char
                } else {
                    '.'
                }
            })
            .collect();
        out.push_str(&format!("{:08x}  {:<47}  {ascii}\n", i * 16, hex.join(" ")));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_are_escaped_cut_and_hex_when_binary() {
        let html = payload(b"<script>alert(1)</script>").into_string();
        assert!(html.contains("&lt;script&gt;"), "{html}");
        assert!(!html.contains("<script>"), "{html}");
        let html = payload(&[0, 1, 0xff, b'<']).into_string();
        assert!(html.contains("00 01 ff 3c"), "{html}");
        assert!(html.contains("...&lt;"), "{html}");
        let long = "é".repeat(PAYLOAD_SHOWN);
        let html = payload(long.as_bytes()).into_string();
        assert!(
            html.contains(&format!("{} more bytes", PAYLOAD_SHOWN)),
            "{html}"
        );
        assert!(
            !html.contains("hex"),
            "a cut character is not binary: {html}"
        );
    }
}
