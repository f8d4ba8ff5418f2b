//! The live refresh: a small inline script on the overview and a table's page reads a JSON
//! document every few seconds ([`every`]) while the tab is visible, and sets the counts, the
//! charts' lines and the job list in place. The pages work whole without it (every value is
//! rendered on the server, as before); with it, nothing else changes: it never submits a form
//! and never touches a field being typed in.
//!
//! - `GET <db>/live?q=&page=`: the overview's tables as the page shows them, from the
//!   samplers' memory alone (answered by the workers of `/metrics`, never the database).
//! - `GET <db>/tables/<name>/live?state=..&after=..&<filter>`: that table's counts and chart
//!   (memory) and the page's jobs (one listing, as the page reads it).
//!
//! Both pass the checks every page passes (loopback `Host`, no cross-site fetch, the token or
//! session). Their text is text: names, payload previews, reasons and errors are escaped for
//! the screen as the pages show them (control and bidi characters as visible escapes), never
//! as HTML; the script sets each as `textContent` (an attribute value for a link or a
//! chart's numbers), builds rows with `createElement`, and never parses server text as HTML.
//!
//! The script is allowed by a nonce random per response (`script-src 'nonce-..'`, and
//! `connect-src 'self'` for its fetches), never `unsafe-inline`.

use serde_json::{json, Map, Value};
use sqlbroker::Table;

use super::http::{Reply, Rq};
use super::pages::{self, count_values, job_json, listing, table_key, Listing};
use super::sampler::Entry;
use super::{chart, Ctx, Database};

/// The values of one table's marks (`data-k`): its counts, when they were read, its chart.
fn table_values(db: &Database, e: &Entry) -> Value {
    let mut k = Map::new();
    for (key, v) in count_values(e).unwrap_or_default() {
        k.insert(key.into(), v.into());
    }
    let l = chart::lines(e);
    k.insert("line_finished".into(), l.finished.into());
    k.insert("line_dead".into(), l.dead.into());
    k.insert("top".into(), format!("{:.0}", l.top).into());
    let collecting = if l.empty { "collecting counts..." } else { "" };
    k.insert("collecting".into(), collecting.into());
    json!({ "t": table_key(db, e.table.name()), "k": k })
}

/// `/live`: the overview's tables (the page `?q=` and `?page=` ask), from memory.
pub(crate) fn overview(ctx: &Ctx, rq: &Rq) -> Reply {
    let shown = pages::overview_tables(ctx, rq);
    let tables: Vec<Value> = shown
        .sections
        .iter()
        .flat_map(|s| s.entries.iter().map(|e| table_values(s.db, e)))
        .collect();
    Reply::json(
        200,
        &json!({ "tables": tables, "matched": shown.matched, "failing": shown.failing }),
    )
}

/// `/tables/<name>/live`: the table's counts and chart, and the jobs its page lists.
pub(crate) fn table(ctx: &Ctx, db: &Database, rq: &Rq, table: &Table) -> Reply {
    let Listing {
        state,
        unprobed,
        entry,
        listed,
        ..
    } = listing(db, rq, table);
    let tables: Vec<Value> = entry.iter().map(|e| table_values(db, e)).collect();
    match listed {
        Ok(jobs) => {
            let jobs: Vec<Value> = jobs
                .iter()
                .filter(|j| j.state() == state)
                .map(|j| job_json(ctx, j, unprobed))
                .collect();
            Reply::json(200, &json!({ "tables": tables, "jobs": jobs }))
        }
        // The counts still; the list is left as it is.
        Err(e) => Reply::json(
            503,
            &json!({ "tables": tables, "error": crate::commands::escape(&crate::chain(&e)) }),
        ),
    }
}
