//! Periodic schedules and the maintainer from the terminal: `periodic list` shows every
//! schedule recorded on the database (`Broker::periodics`), `periodic pause NAME` and
//! `periodic resume NAME` pause and resume one on every process that runs it, and
//! `maintainer` says which process maintains the database (`Broker::maintainer`).

use std::time::SystemTime;

use serde::Serialize;
use sqlbroker::Broker;

use super::{actions, age, columns, escape, json, say, utc, Result};
use crate::{PeriodicArgs, PeriodicCommand};

/// One schedule of `periodic list --json`.
#[derive(Serialize)]
struct PeriodicJson<'a> {
    table: &'a str,
    name: &'a str,
    schedule: &'a str,
    time_zone: &'a str,
    next_tick: Option<String>,
    last_tick: Option<String>,
    paused: bool,
    orphaned: bool,
    last_seen: String,
}

/// `maintainer`: which process maintains the database now (`Broker::maintainer`).
pub(super) fn maintainer(broker: &Broker) -> Result {
    match broker.maintainer()? {
        Some(m) => say(format_args!(
            "maintained by {} (pid {}, {}) since {}, term {}, lease until {}\n",
            escape(m.host()),
            m.pid(),
            escape(m.id()),
            utc(m.since()),
            m.term(),
            utc(m.lease_until())
        )),
        None => say(format_args!(
            "no maintainer holds the lease (no broker runs maintenance, or the last holder \
             stopped and its lease has not been taken yet)\n"
        )),
    }
}

pub(super) fn run(broker: &Broker, args: &PeriodicArgs) -> Result {
    match &args.command {
        PeriodicCommand::List { json: as_json } => list(broker, *as_json),
        PeriodicCommand::Pause { name } => {
            broker.pause_periodic(name)?;
            actions::logged(broker, "pause periodic", "", name, 1);
            say(format_args!("paused periodic schedule {}\n", escape(name)))
        }
        PeriodicCommand::Resume { name } => {
            broker.resume_periodic(name)?;
            actions::logged(broker, "resume periodic", "", name, 1);
            say(format_args!("resumed periodic schedule {}\n", escape(name)))
        }
    }
}

fn list(broker: &Broker, as_json: bool) -> Result {
    let all = broker.periodics()?;
    if as_json {
        let items: Vec<PeriodicJson<'_>> = all
            .iter()
            .map(|p| PeriodicJson {
                table: p.table(),
                name: p.name(),
                schedule: p.schedule(),
                time_zone: p.time_zone(),
                next_tick: p.next_tick().map(utc),
                last_tick: p.last_tick().map(utc),
                paused: p.paused(),
                orphaned: p.orphaned(),
                last_seen: utc(p.last_seen()),
            })
            .collect();
        return say(format_args!("{}\n", json(&items)));
    }
    if all.is_empty() {
        return say(format_args!("no periodic schedule recorded\n"));
    }
    let now = SystemTime::now();
    let mut rows = vec![[
        "TABLE", "NAME", "SCHEDULE", "TZ", "NEXT", "LAST", "STATE", "SEEN",
    ]
    .map(String::from)
    .to_vec()];
    for p in &all {
        let state = match (p.paused(), p.orphaned()) {
            (_, true) => "orphaned",
            (true, false) => "paused",
            (false, false) => "running",
        };
        rows.push(vec![
            escape(p.table()),
            escape(p.name()),
            escape(p.schedule()),
            escape(p.time_zone()),
            p.next_tick().map_or_else(|| "-".into(), utc),
            p.last_tick().map_or_else(|| "-".into(), utc),
            state.into(),
            format!(
                "{} ago",
                age(now.duration_since(p.last_seen()).unwrap_or_default())
            ),
        ]);
    }
    say(format_args!("{}", columns(&rows)))
}
