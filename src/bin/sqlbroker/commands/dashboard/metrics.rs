//! `/metrics`: the last counts of every table in the Prometheus text exposition format
//! (version 0.0.4), for a scraper outside the application's process. Gauges only: the
//! values are counts of rows as the database holds them. With several databases, every
//! series carries a `database` label (its name) before `table`.

use std::fmt::Write;
use std::time::UNIX_EPOCH;

use super::Ctx;

/// A label value as the format wants it: backslash, double quote and line feed escaped.
fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

pub(crate) fn render(ctx: &Ctx) -> String {
    let mut out = String::new();
    let mut family = |name: &str, help: &str, rows: Vec<(String, String)>| {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} gauge");
        for (labels, value) in rows {
            if labels.is_empty() {
                let _ = writeln!(out, "{name} {value}");
            } else {
                let _ = writeln!(out, "{name}{{{labels}}} {value}");
            }
        }
    };
    let mut jobs = Vec::new();
    let (mut by_queue, mut queue_paused) = (Vec::new(), Vec::new());
    let (mut limit_max, mut limit_work, mut limit_wait) = (Vec::new(), Vec::new(), Vec::new());
    let (mut rate_max, mut rate_claimed, mut rate_wait) = (Vec::new(), Vec::new(), Vec::new());
    let (mut paused, mut oldest, mut up, mut at, mut took) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut listed = Vec::new();
    let mut missing = Vec::new();
    for db in &ctx.dbs {
        let (entries, list_error) = match db.live() {
            Some((_, sampler)) => {
                let s = sampler.snapshot();
                (s.entries, s.list_error)
            }
            None => (Vec::new(), Some(String::new())),
        };
        let d = match ctx.several() {
            true => format!("database=\"{}\"", label(&db.name)),
            false => String::new(),
        };
        listed.push((d.clone(), u8::from(list_error.is_none()).to_string()));
        for e in &entries {
            let t = match ctx.several() {
                true => format!("{d},table=\"{}\"", label(e.table.name())),
                false => format!("table=\"{}\"", label(e.table.name())),
            };
            up.push((t.clone(), u8::from(e.error.is_none()).to_string()));
            missing.push((t.clone(), u8::from(e.missing).to_string()));
            if let Some((when, d)) = e.counted {
                let secs = when.duration_since(UNIX_EPOCH).unwrap_or_default();
                at.push((t.clone(), format!("{:.3}", secs.as_secs_f64())));
                took.push((t.clone(), format!("{:.6}", d.as_secs_f64())));
            }
            // A missing table's last counts are of a table that is gone.
            let Some(p) = e.last().filter(|_| !e.missing) else {
                continue;
            };
            let s = &p.stats;
            for l in &p.limits {
                let k = format!("{t},key=\"{}\"", label(&l.key));
                if let Some(m) = l.max {
                    limit_max.push((k.clone(), m.to_string()));
                }
                if let Some(n) = l.in_work {
                    limit_work.push((k.clone(), n.to_string()));
                }
                if let Some(n) = l.waiting {
                    limit_wait.push((k, n.to_string()));
                }
            }
            for r in &p.rates {
                let k = format!(
                    "{t},key=\"{}\",per_seconds=\"{}\"",
                    label(&r.key),
                    r.per.as_secs_f64()
                );
                if let Some(m) = r.max {
                    rate_max.push((k.clone(), m.to_string()));
                }
                rate_claimed.push((k.clone(), r.claimed.to_string()));
                rate_wait.push((k, r.waiting.to_string()));
            }
            let states = [
                ("ready", Some(s.ready)),
                ("limited", s.limited),
                ("scheduled", Some(s.scheduled)),
                ("waiting", e.table.has_dependencies().then_some(s.waiting)),
                ("in_flight", s.in_flight),
                ("dead", Some(s.dead)),
                ("completed", s.completed),
            ];
            for (state, n) in states {
                if let Some(n) = n {
                    jobs.push((format!("{t},state=\"{state}\""), n.to_string()));
                }
            }
            for (q, qs) in &p.queues {
                let k = format!("{t},queue=\"{}\"", label(q));
                let states = [
                    ("ready", Some(qs.ready)),
                    ("scheduled", Some(qs.scheduled)),
                    ("in_flight", qs.in_flight),
                    ("dead", Some(qs.dead)),
                    ("completed", qs.completed),
                ];
                for (state, n) in states {
                    if let Some(n) = n {
                        by_queue.push((format!("{k},state=\"{state}\""), n.to_string()));
                    }
                }
                queue_paused.push((k, u8::from(qs.paused).to_string()));
            }
            paused.push((t.clone(), u8::from(s.paused).to_string()));
            oldest.push((t, s.oldest_ready_age.map_or(0, |d| d.as_secs()).to_string()));
        }
    }
    family(
        "sqlbroker_queue_jobs",
        "Rows of a queue table by state (ready, limited: ready rows a concurrency limit holds back, lease tables with limits, scheduled, waiting: tables with dependencies, rows waiting on other jobs, in_flight: lease tables only, dead, completed: tables that keep them), as last counted.",
        jobs,
    );
    family(
        "sqlbroker_queue_jobs_by_queue",
        "Tables with named queues: each queue's rows by state (ready, scheduled, in_flight: lease tables only, dead, completed: tables that keep them), as last counted; a queue with no row is left out.",
        by_queue,
    );
    family(
        "sqlbroker_queue_paused_by_queue",
        "Tables with named queues: 1 if the queue (or its table) is paused, else 0, for each queue with rows.",
        queue_paused,
    );
    family(
        "sqlbroker_limit_max",
        "The max in force of a concurrency limit (key: its template; a lifted limit is left out).",
        limit_max,
    );
    family(
        "sqlbroker_limit_in_work",
        "Rows in work a concurrency limit counts, every key (lease tables).",
        limit_work,
    );
    family(
        "sqlbroker_limit_waiting",
        "Ready rows whose key of a concurrency limit is at its max (lease tables).",
        limit_wait,
    );
    family(
        "sqlbroker_rate_limit_max",
        "The max in force of a rate limit: claims of one key per window (key: its template, per_seconds: its window; a lifted limit is left out).",
        rate_max,
    );
    family(
        "sqlbroker_rate_limit_claimed",
        "Claims a rate limit counts in the window ending at the count, every key.",
        rate_claimed,
    );
    family(
        "sqlbroker_rate_limit_waiting",
        "Ready rows whose key's window of a rate limit is full, as last counted.",
        rate_wait,
    );
    family(
        "sqlbroker_queue_paused",
        "1 if the table is paused, else 0.",
        paused,
    );
    family(
        "sqlbroker_queue_oldest_ready_age_seconds",
        "How long the oldest ready row has been due (0: none ready).",
        oldest,
    );
    family(
        "sqlbroker_queue_count_ok",
        "1 if the last count of the table succeeded (or found it missing), 0 if it failed (the other values are then the last good count).",
        up,
    );
    family(
        "sqlbroker_queue_missing",
        "1 if the table is recorded but does not exist (dropped by hand: `sqlbroker forget` removes the record), else 0; its count is then not a failure.",
        missing,
    );
    family(
        "sqlbroker_queue_counted_timestamp_seconds",
        "When the table was last counted (Unix time).",
        at,
    );
    family(
        "sqlbroker_queue_count_duration_seconds",
        "How long the last count of the table took.",
        took,
    );
    family(
        "sqlbroker_dashboard_list_ok",
        "1 if the last listing of the tables succeeded, else 0.",
        listed,
    );
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn labels_are_escaped() {
        assert_eq!(super::label("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
