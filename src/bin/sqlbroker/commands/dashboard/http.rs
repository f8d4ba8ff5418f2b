//! A request as the routes and pages see it, the reply they give, and the spellings in URLs
//! both use. Below both `web` (the routes) and `pages` (what they render).

use std::net::IpAddr;

use maud::Markup;
use sqlbroker::JobState;

use super::server::Method;

/// Jobs per page of a table's listing.
pub(crate) const PAGE: usize = 50;

/// A response on its way out.
pub(crate) struct Reply {
    pub status: u16,
    pub content_type: &'static str,
    pub body: Vec<u8>,
    pub headers: Vec<(&'static str, String)>,
    /// How long the server holds the answer back (a throttled failure).
    pub hold: std::time::Duration,
    /// The nonce of the page's one inline script (the live refresh), random per response:
    /// the Content-Security-Policy allows that script alone.
    pub nonce: Option<String>,
}

impl Reply {
    pub fn html(status: u16, page: Markup) -> Reply {
        Reply {
            status,
            content_type: "text/html; charset=utf-8",
            body: page.into_string().into_bytes(),
            headers: Vec::new(),
            hold: std::time::Duration::ZERO,
            nonce: None,
        }
    }

    pub fn text(status: u16, content_type: &'static str, body: String) -> Reply {
        Reply {
            status,
            content_type,
            body: body.into_bytes(),
            headers: Vec::new(),
            hold: std::time::Duration::ZERO,
            nonce: None,
        }
    }

    /// A JSON document (the live refresh's): text in it is text, never markup (the script
    /// sets it as `textContent`).
    pub fn json(status: u16, value: &serde_json::Value) -> Reply {
        Reply::text(status, "application/json", value.to_string())
    }

    pub fn redirect(to: String) -> Reply {
        let mut r = Reply::text(303, "text/plain; charset=utf-8", format!("see {to}\n"));
        r.headers.push(("Location", to));
        r
    }

    pub fn with(mut self, name: &'static str, value: String) -> Reply {
        self.headers.push((name, value));
        self
    }
}

/// What a handler knows of the request.
pub(crate) struct Rq {
    pub method: Method,
    pub path: String,
    pub query: Vec<(String, String)>,
    pub headers: Vec<(String, String)>,
    /// The client's address (the login attempts are counted by it).
    pub peer: IpAddr,
}

impl Rq {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn param(&self, name: &str) -> Option<&str> {
        field(&self.query, name)
    }

    pub fn cookie(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .filter(|(k, _)| k.eq_ignore_ascii_case("cookie"))
            .flat_map(|(_, v)| v.split(';'))
            .filter_map(|c| c.trim().split_once('='))
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v)
    }
}

/// The first value of a form or query field.
pub(crate) fn field<'a>(fields: &'a [(String, String)], name: &str) -> Option<&'a str> {
    fields
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// A state's name in URLs (`in_flight`), and back.
pub(crate) fn state_slug(s: JobState) -> &'static str {
    match s {
        JobState::Scheduled => "scheduled",
        JobState::InFlight => "in_flight",
        JobState::Dead => "dead",
        JobState::Completed => "completed",
        _ => "ready",
    }
}

pub(crate) fn state_from(slug: &str) -> Option<JobState> {
    Some(match slug {
        "ready" => JobState::Ready,
        "scheduled" => JobState::Scheduled,
        "in_flight" => JobState::InFlight,
        "dead" => JobState::Dead,
        "completed" => JobState::Completed,
        _ => return None,
    })
}
