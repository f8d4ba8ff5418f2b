//! The page side of the live refresh ([`super::live`] answers its reads): the inline script,
//! how often it reads, and the nonce that lets it run. Apart from `live.rs` so the pages, which
//! carry the script, and the JSON endpoints, which are built from the pages' own pieces, do not
//! name each other.

use std::time::Duration;

use maud::Markup;

use super::http::Reply;
use super::{session, Ctx};

/// The fewest seconds between two refreshes (the counts change only as often as the sampler
/// counts, `--sample`).
const FASTEST: Duration = Duration::from_secs(2);

/// How often a page refreshes: the sampler's interval, at least [`FASTEST`].
pub(crate) fn every(ctx: &Ctx) -> Duration {
    ctx.sample.max(FASTEST)
}

/// What a page with the live refresh needs: the script's nonce, where it reads, how often.
pub(crate) struct Spec {
    pub nonce: String,
    pub url: String,
    pub every_ms: u128,
}

impl Spec {
    pub fn new(ctx: &Ctx, url: String) -> Spec {
        Spec {
            nonce: session::random_id(),
            url,
            every_ms: every(ctx).as_millis(),
        }
    }
}

/// A page carrying the script: its nonce goes in the Content-Security-Policy.
pub(crate) fn reply(status: u16, page: Markup, spec: Spec) -> Reply {
    let mut r = Reply::html(status, page);
    r.nonce = Some(spec.nonce);
    r
}

/// The script (inline; the nonce allows it). It reads `main[data-live]` every
/// `data-every` ms while the page is visible, and:
/// - sets each `[data-k]` inside the `[data-t]` element of every table in the answer as text
///   (a chart's polylines: their `points`, numbers only);
/// - on a table's page, rebuilds the job rows (`tbody[data-jobs]`) when they changed, each
///   text a text node and each button a form like the server's (its CSRF token and `back`
///   read from the page);
/// - on the overview, hides the tables whose name does not hold what is typed in the filter
///   (as it is typed; pressing the button filters on the server), and never touches the field.
///
/// It stops while the tab is hidden (`visibilitychange`), and after an answer other than 200
/// or 503 (a session ended: reloading shows the login).
pub(crate) const SCRIPT: &str = r#"
(function () {
  "use strict";
  var main = document.querySelector("main[data-live]");
  var status = document.getElementById("live");
  if (!main) { return; }
  var every = Math.max(1000, Number(main.getAttribute("data-every")) || 5000);
  var timer = null, stopped = false, lastJobs = null;
  function say(text) { if (status) { status.textContent = text; } }
  function marks(t) {
    var out = [];
    document.querySelectorAll("[data-t]").forEach(function (el) {
      if (el.getAttribute("data-t") === t) { out.push(el); }
    });
    return out;
  }
  function setTable(t) {
    var k = t.k || {};
    marks(t.t).forEach(function (el) {
      el.querySelectorAll("[data-k]").forEach(function (m) {
        var key = m.getAttribute("data-k");
        if (!Object.prototype.hasOwnProperty.call(k, key)) { return; }
        var text = String(k[key]);
        if (m.tagName.toLowerCase() === "polyline") {
          if (/^[0-9., -]*$/.test(text)) { m.setAttribute("points", text); }
          return;
        }
        if (key === "paused") {
          var span = document.createElement("span");
          if (text === "paused") { span.className = "paused"; }
          span.textContent = text;
          m.replaceChildren(span);
        } else if (m.textContent !== text) {
          m.textContent = text;
        }
      });
    });
  }
  function cell(tr, content, cls) {
    var td = document.createElement("td");
    if (cls) { td.className = cls; }
    if (content !== null) { td.append(content); }
    tr.appendChild(td);
    return td;
  }
  function hidden(form, name, value) {
    var i = document.createElement("input");
    i.type = "hidden"; i.name = name; i.value = value;
    form.appendChild(i);
  }
  function setJobs(jobs) {
    var body = document.querySelector("tbody[data-jobs]");
    if (!body || !Array.isArray(jobs)) { return; }
    var sig = JSON.stringify(jobs);
    if (sig === lastJobs) { return; }
    var first = lastJobs === null;
    lastJobs = sig;
    var ids = jobs.map(function (j) { return String(j.id); }).join(",");
    var had = Array.prototype.map.call(body.querySelectorAll("tr[data-id]"),
      function (tr) { return tr.getAttribute("data-id"); }).join(",");
    if (first && ids === had) { return; }
    var base = body.getAttribute("data-jobs");
    var back = body.getAttribute("data-back") || "";
    var csrf = body.getAttribute("data-csrf");
    var rows = jobs.map(function (j) {
      var tr = document.createElement("tr");
      tr.setAttribute("data-id", String(j.id));
      var a = document.createElement("a");
      a.href = base + "/jobs/" + encodeURIComponent(String(j.id));
      a.textContent = String(j.id);
      cell(tr, a, "n");
      cell(tr, String(j.state));
      cell(tr, String(j.attempts), "n");
      cell(tr, String(j.errors), "n");
      cell(tr, String(j.due));
      var why = cell(tr, null);
      if (j.reason !== null) {
        var s = document.createElement("strong"); s.textContent = j.reason;
        why.append(s, document.createElement("br"));
      }
      if (j.error !== null) {
        var e = document.createElement("span"); e.className = "muted"; e.textContent = j.error;
        why.append(e);
      }
      var code = document.createElement("code"); code.textContent = j.payload;
      var len = document.createElement("span"); len.className = "muted";
      len.textContent = "(" + j.len + " bytes)";
      var p = cell(tr, code); p.append(" ", len);
      var acts = cell(tr, null);
      if (csrf !== null) {
        (j.actions || []).forEach(function (v) {
          var f = document.createElement("form");
          f.className = "inline"; f.method = "post";
          f.action = base + "/" + encodeURIComponent(v[0]);
          hidden(f, "csrf", csrf); hidden(f, "back", back); hidden(f, "id", String(j.id));
          var b = document.createElement("button");
          b.type = "submit"; b.textContent = v[1];
          if (v[0] === "purge" || v[0] === "cancel") { b.className = "danger"; }
          f.appendChild(b);
          acts.append(f, " ");
        });
      }
      return tr;
    });
    body.replaceChildren.apply(body, rows);
    var table = body.closest("table");
    if (table) { table.hidden = rows.length === 0; }
    document.querySelectorAll("[data-none]").forEach(function (n) { n.hidden = rows.length > 0; });
  }
  function tick() {
    timer = null;
    if (stopped || document.visibilityState !== "visible") { say("paused while hidden"); return; }
    var url = main.getAttribute("data-live") + window.location.search;
    fetch(url, { credentials: "same-origin", headers: { "Accept": "application/json" } })
      .then(function (r) {
        if (r.status !== 200 && r.status !== 503) { throw new Error("answered " + r.status); }
        return r.json();
      })
      .then(function (d) {
        (d.tables || []).forEach(setTable);
        if (d.jobs !== undefined) { setJobs(d.jobs); }
        say("live: updated " + new Date().toLocaleTimeString());
        schedule();
      })
      .catch(function (e) {
        stopped = true;
        say("live refresh stopped (" + e.message + "): reload the page");
      });
  }
  function schedule() {
    if (timer === null && !stopped && document.visibilityState === "visible") {
      timer = window.setTimeout(tick, every);
    }
  }
  document.addEventListener("visibilitychange", function () {
    if (document.visibilityState === "visible") {
      if (timer === null) { tick(); }
    } else if (timer !== null) {
      window.clearTimeout(timer); timer = null; say("paused while hidden");
    }
  });
  var q = document.getElementById("q");
  if (q) {
    var narrow = function () {
      var want = q.value.trim().toLowerCase();
      document.querySelectorAll("[data-name]").forEach(function (el) {
        el.hidden = want !== "" && el.getAttribute("data-name").toLowerCase().indexOf(want) < 0;
      });
    };
    q.addEventListener("input", narrow);
    narrow();
  }
  say("live: every " + Math.round(every / 1000) + " s");
  schedule();
})();
"#;
