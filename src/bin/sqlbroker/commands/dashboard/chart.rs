//! The throughput and failures chart: SVG drawn on the server from the sampler's counts, over
//! the last hour ([`HOUR`]).
//!
//! Per interval between two counts, as a rate per minute:
//! - **finished**: rows that left the queue. A table that keeps completed rows: the growth
//!   of its completed count (acks). Any other table deletes what it acks, so the counts can
//!   only tell the net drain: the fall of its live rows (ready, scheduled, in flight), zero
//!   while publishing outpaces the workers.
//! - **dead-lettered**: the growth of the dead count (a requeue or purge shows as none).
//!   Failed attempts that are retried leave no mark in the counts (`Broker::stats` does not
//!   sum `errors`), so they are not charted.
//!
//! The hour before the recent samples ([`HISTORY`](super::sampler::HISTORY)) comes from the
//! sampler's tallies of one a minute ([`Minutes`](super::sampler::Minutes)); the recent
//! minutes from every sample.

use std::time::SystemTime;

use maud::{html, Markup};

use super::sampler::{Entry, Tally, HOUR};

const W: f64 = 640.0;
const H: f64 = 120.0;
const LEFT: f64 = 44.0;
const BOTTOM: f64 = 18.0;

/// One interval's rates per minute: (finished, dead-lettered).
fn rates(a: &Tally, b: &Tally) -> Option<(f64, f64)> {
    let secs = b.at.duration_since(a.at).ok()?.as_secs_f64();
    if secs <= 0.0 {
        return None;
    }
    let finished = match (a.completed, b.completed) {
        (Some(x), Some(y)) => y.saturating_sub(x),
        _ => a.live.saturating_sub(b.live),
    };
    let dead = b.dead.saturating_sub(a.dead);
    let per_min = 60.0 / secs;
    Some((finished as f64 * per_min, dead as f64 * per_min))
}

/// What the lines mean.
pub(crate) fn legend() -> Markup {
    html! {
        "The last hour: "
        span style="color:#1f8a4c" { "finished/min" }
        " (rows that left the queue: acks where completed rows are kept, else the net fall of \
         the live rows, which publishing hides), "
        span style="color:#c0392b" { "dead-lettered/min" }
        " (growth of the dead count; retried failures are not counted). One point a minute, \
         every count over the last minutes."
    }
}

/// A chart's lines as SVG `points` (numbers only) and its scale.
pub(crate) struct Lines {
    pub finished: String,
    pub dead: String,
    /// The rate at the top of the chart, per minute.
    pub top: f64,
    pub empty: bool,
}

/// The tallies a chart draws, oldest first: the minute ring's before the first recent
/// sample, then every recent sample.
fn tallies(e: &Entry) -> Vec<Tally> {
    let first = e.history.front().map(|p| p.at);
    let mut out: Vec<Tally> = e
        .minutes
        .iter()
        .filter(|t| first.is_none_or(|f| t.at < f))
        .copied()
        .collect();
    out.extend(e.history.iter().map(|p| Tally::of(p.at, &p.stats)));
    out
}

/// The lines of one table's chart, now.
pub(crate) fn lines(e: &Entry) -> Lines {
    let now = SystemTime::now();
    let span = HOUR.as_secs_f64();
    let t = tallies(e);
    let points: Vec<(f64, f64, f64)> = t
        .iter()
        .zip(t.iter().skip(1))
        .filter_map(|(a, b)| {
            let (f, d) = rates(a, b)?;
            let back = now.duration_since(b.at).map_or(0.0, |d| d.as_secs_f64());
            Some((span - back, f, d))
        })
        .filter(|(x, _, _)| *x >= 0.0)
        .collect();
    let top = points
        .iter()
        .map(|(_, f, d)| f.max(*d))
        .fold(1.0_f64, f64::max)
        .ceil();
    let x = |t: f64| LEFT + (t / span) * (W - LEFT - 4.0);
    let y = |v: f64| 4.0 + (1.0 - v / top) * (H - BOTTOM - 4.0);
    let line = |pick: fn(&(f64, f64, f64)) -> f64| -> String {
        points
            .iter()
            .map(|p| format!("{:.1},{:.1}", x(p.0), y(pick(p))))
            .collect::<Vec<_>>()
            .join(" ")
    };
    Lines {
        finished: line(|p| p.1),
        dead: line(|p| p.2),
        top,
        empty: points.is_empty(),
    }
}

/// The chart of one table (the live script redraws its lines, `data-k`, in place).
pub(crate) fn svg(e: &Entry) -> Markup {
    let l = lines(e);
    let minutes = HOUR.as_secs() / 60;
    html! {
        svg xmlns="http://www.w3.org/2000/svg" width=(W) height=(H) viewBox={ "0 0 " (W) " " (H) }
            role="img" aria-label={ "finished and dead-lettered per minute, " (e.table.name()) } {
            rect x=(LEFT) y="4" width=(W - LEFT - 4.0) height=(H - BOTTOM - 4.0) fill="#fff" stroke="#e3e6eb" {}
            text data-k="top" x=(LEFT - 4.0) y="12" text-anchor="end" { (format!("{:.0}", l.top)) }
            text x=(LEFT - 4.0) y=(H - BOTTOM) text-anchor="end" { "0" }
            text x=(LEFT) y=(H - 4.0) { "-" (minutes) " min" }
            text x=(W - 4.0) y=(H - 4.0) text-anchor="end" { "now" }
            text data-k="collecting" x=(W / 2.0) y=(H / 2.0) text-anchor="middle" {
                @if l.empty { "collecting counts..." }
            }
            polyline data-k="line_finished" points=(l.finished) fill="none" stroke="#1f8a4c" stroke-width="2" {}
            polyline data-k="line_dead" points=(l.dead) fill="none" stroke="#c0392b" stroke-width="2" {}
        }
    }
}
