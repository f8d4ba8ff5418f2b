//! The throughput and failures chart: SVG drawn on the server from the sampler's counts.
//!
//! Per interval between two counts, as a rate per minute:
//! - **finished**: rows that left the queue. A table that keeps completed rows: the growth
//!   of its completed count (acks). Any other table deletes what it acks, so the counts can
//!   only tell the net drain: the fall of its live rows (ready, scheduled, in flight), zero
//!   while publishing outpaces the workers.
//! - **dead-lettered**: the growth of the dead count (a requeue or purge shows as none).
//!
//! A minute of 5 s samples is 12 points; the chart spans the samples kept
//! ([`HISTORY`](super::sampler::HISTORY)).

use std::time::SystemTime;

use maud::{html, Markup};

use super::sampler::{Entry, Point, HISTORY};

const W: f64 = 640.0;
const H: f64 = 120.0;
const LEFT: f64 = 44.0;
const BOTTOM: f64 = 18.0;

/// One interval's rates per minute: (finished, dead-lettered).
fn rates(a: &Point, b: &Point) -> Option<(f64, f64)> {
    let secs = b.at.duration_since(a.at).ok()?.as_secs_f64();
    if secs <= 0.0 {
        return None;
    }
    let live = |p: &Point| p.stats.ready + p.stats.scheduled + p.stats.in_flight.unwrap_or(0);
    let finished = match (a.stats.completed, b.stats.completed) {
        (Some(x), Some(y)) => y.saturating_sub(x),
        _ => live(a).saturating_sub(live(b)),
    };
    let dead = b.stats.dead.saturating_sub(a.stats.dead);
    let per_min = 60.0 / secs;
    Some((finished as f64 * per_min, dead as f64 * per_min))
}

/// What the lines mean.
pub(crate) fn legend() -> Markup {
    html! {
        span style="color:#1f8a4c" { "finished/min" }
        " (acks where completed rows are kept, else the net fall of live rows), "
        span style="color:#c0392b" { "dead-lettered/min" }
        "; one point per count."
    }
}

/// The chart of one table.
pub(crate) fn svg(e: &Entry, every: std::time::Duration) -> Markup {
    let now = SystemTime::now();
    let span = every.as_secs_f64() * HISTORY as f64;
    let points: Vec<(f64, f64, f64)> = e
        .history
        .iter()
        .zip(e.history.iter().skip(1))
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
    let minutes = span / 60.0;
    html! {
        svg xmlns="http://www.w3.org/2000/svg" width=(W) height=(H) viewBox={ "0 0 " (W) " " (H) }
            role="img" aria-label={ "finished and dead-lettered per minute, " (e.table.name()) } {
            rect x=(LEFT) y="4" width=(W - LEFT - 4.0) height=(H - BOTTOM - 4.0) fill="#fff" stroke="#e3e6eb" {}
            text x=(LEFT - 4.0) y="12" text-anchor="end" { (format!("{top:.0}")) }
            text x=(LEFT - 4.0) y=(H - BOTTOM) text-anchor="end" { "0" }
            text x=(LEFT) y=(H - 4.0) { "-" (format!("{minutes:.0}")) " min" }
            text x=(W - 4.0) y=(H - 4.0) text-anchor="end" { "now" }
            @if points.is_empty() {
                text x=(W / 2.0) y=(H / 2.0) text-anchor="middle" { "collecting counts..." }
            } @else {
                polyline points=(line(|p| p.1)) fill="none" stroke="#1f8a4c" stroke-width="2" {}
                polyline points=(line(|p| p.2)) fill="none" stroke="#c0392b" stroke-width="2" {}
            }
        }
    }
}
