//! One request: the checks every request passes (host, token), the routes, and the actions
//! (POST only, with the CSRF token and a same-origin `Origin`).

use std::time::Instant;

use sqlbroker::Table;

use super::super::actions::limit_detail;
use super::filters::{
    bulk_verb, describe, filter_of, BATCH, BULK_MAX, BULK_TIME, BUSY_NAMED, ROW_WAIT,
};
use super::http::{field, state_from, Reply, Rq};
use super::server::{self, Method, Request};
use super::{live, metrics, pages, Ctx, Database};

/// The name the login form's cookie starts with: a session id
/// ([`session`](super::session)); the dashboard's port follows ([`Ctx::cookie`]).
pub(crate) const SESSION_COOKIE: &str = "sqlbroker_dashboard_session";

/// True if the request came over TLS to a proxy in front: `X-Forwarded-Proto: https`,
/// `Forwarded: ..proto=https`, or an `https` origin (a browser's login POST carries it). The
/// session cookie then carries `Secure`, so the browser never sends it over plain HTTP. A
/// client that sends these headers itself only makes its own cookie stricter.
fn over_tls(rq: &Rq) -> bool {
    let https = |v: &str| v.trim().eq_ignore_ascii_case("https");
    rq.header("x-forwarded-proto").is_some_and(https)
        || rq.header("forwarded").is_some_and(|f| {
            f.split([';', ','])
                .filter_map(|p| p.trim().split_once('='))
                .any(|(k, v)| k.trim().eq_ignore_ascii_case("proto") && https(v.trim_matches('"')))
        })
        || rq
            .header("origin")
            .is_some_and(|o| o.trim().to_ascii_lowercase().starts_with("https://"))
}

/// The session cookie's attributes: `Secure` behind TLS ([`over_tls`]).
fn cookie_attributes(rq: &Rq) -> &'static str {
    match over_tls(rq) {
        true => "Path=/; HttpOnly; SameSite=Strict; Secure",
        false => "Path=/; HttpOnly; SameSite=Strict",
    }
}

/// Equal without an early exit (a token compare must not tell how much matched).
fn same(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

/// Answers one complete request (the server read it whole, its body at most
/// [`server::MAX_BODY`] bytes): the response's bytes.
pub(crate) fn handle(ctx: &Ctx, request: Request) -> server::Answer {
    let started = Instant::now();
    let (path, query) = match request.target.split_once('?') {
        Some((p, q)) => (p.to_string(), q.to_string()),
        None => (request.target.clone(), String::new()),
    };
    let rq = Rq {
        method: request.method,
        path,
        query: form_urlencoded::parse(query.as_bytes())
            .into_owned()
            .collect(),
        headers: request.headers,
        peer: request.peer,
    };
    let reply = route(ctx, &rq, &request.body);
    log::debug!(
        "{} {} -> {} in {:?}",
        rq.method,
        rq.path,
        reply.status,
        started.elapsed()
    );
    let hold = reply.hold;
    server::Answer {
        bytes: send(reply, rq.method == Method::Head),
        hold,
    }
}

/// True for a request answered from memory alone, never the database: the overview (what a
/// monitor checks), `/metrics` and the login form, of any database (`/d/<name>/...`). The
/// server gives these workers of their own ([`server::Quick`]), so listings that wait on a
/// slow database cannot hold them up.
pub(crate) fn quick(request: &Request) -> bool {
    if !matches!(request.method, Method::Get | Method::Head) {
        return false;
    }
    let path = request.target.split('?').next().unwrap_or("");
    if matches!(path, "/healthz" | "/readyz") {
        return true;
    }
    let rest = match path.strip_prefix("/d/") {
        Some(rest) => rest.split_once('/').map_or("", |(_, r)| r),
        None => path.trim_start_matches('/'),
    };
    matches!(
        rest.trim_end_matches('/'),
        "" | "metrics" | "login" | "live"
    )
}

/// The response's bytes, with the headers every answer carries.
fn send(reply: Reply, head_only: bool) -> Vec<u8> {
    let mut headers = vec![
        ("Content-Type", reply.content_type.to_string()),
        ("Cache-Control", "no-store".into()),
        ("X-Content-Type-Options", "nosniff".into()),
        ("X-Frame-Options", "DENY".into()),
        ("Referrer-Policy", "same-origin".into()),
        ("Content-Security-Policy", csp(reply.nonce.as_deref())),
    ];
    headers.extend(reply.headers);
    server::response(reply.status, &headers, &reply.body, head_only)
}

/// The Content-Security-Policy: no script and nothing from elsewhere; a page with the live
/// refresh allows its one inline script by the response's nonce (no `unsafe-inline` for
/// scripts) and its fetches of this origin.
fn csp(nonce: Option<&str>) -> String {
    let script = nonce.map_or_else(String::new, |n| {
        format!("script-src 'nonce-{n}'; connect-src 'self'; ")
    });
    format!(
        "default-src 'none'; {script}style-src 'unsafe-inline'; img-src 'self' data:; \
         form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    )
}

fn forbidden(why: &str) -> Reply {
    Reply::text(
        403,
        "text/plain; charset=utf-8",
        format!("forbidden: {why}\n"),
    )
}

fn not_found(what: &str) -> Reply {
    Reply::html(404, pages::message("Not found", what))
}

/// The host part of a `Host` header (`[::1]:80` -> `[::1]`, `localhost:8640` -> `localhost`).
fn host_name(host: &str) -> &str {
    if host.starts_with('[') {
        return host
            .split_once(']')
            .map_or(host, |(h, _)| &host[..=h.len()]);
    }
    host.rsplit_once(':').map_or(host, |(h, _)| h)
}

fn route(ctx: &Ctx, rq: &Rq, body: &[u8]) -> Reply {
    // DNS rebinding: a page of another site resolving its name to 127.0.0.1 sends its own
    // name as Host.
    if ctx.loopback {
        let host = rq.header("host").map(host_name);
        let ok = host.is_some_and(|h| {
            h.eq_ignore_ascii_case("localhost")
                || h.parse::<std::net::IpAddr>()
                    .is_ok_and(|ip| ip.is_loopback())
                || h == "[::1]"
        });
        if !ok {
            return forbidden("the Host header is not a loopback name");
        }
    }
    // A page of another site may make the browser fetch any URL (`<img src>`, a link): every
    // page reads the database or what was counted of it, so a cross-site fetch is refused
    // before any of that (the token mode's login form alone reads nothing; without a token
    // there is no form, and `/login` is refused like the rest). Browsers send the header;
    // tools that send none pass.
    // A probe's checks: no session (a load balancer has none), nothing read but memory.
    if matches!(rq.method, Method::Get | Method::Head) {
        match rq.path.as_str() {
            "/healthz" => return Reply::text(200, "text/plain; charset=utf-8", "ok\n".into()),
            "/readyz" => return ready(ctx),
            _ => {}
        }
    }
    let login_form = ctx.token.is_some() && rq.path == "/login";
    if !login_form
        && rq
            .header("sec-fetch-site")
            .is_some_and(|s| s.trim().eq_ignore_ascii_case("cross-site"))
    {
        return forbidden(
            "the request comes from a page of another site: open the dashboard's address \
             directly (or from a bookmark)",
        );
    }
    let form: Vec<(String, String)> = form_urlencoded::parse(body).into_owned().collect();
    if let Some(token) = &ctx.token {
        if rq.path == "/login" {
            return login(ctx, rq, &form, token);
        }
        if rq.path == "/logout" {
            return logout(ctx, rq);
        }
        let session = rq
            .cookie(&ctx.cookie)
            .is_some_and(|id| ctx.sessions.valid(id.trim()));
        let bearer = rq
            .header("authorization")
            .and_then(|a| a.strip_prefix("Bearer "));
        // The right token always passes; a wrong bearer token counts as a wrong login (no
        // second way to guess), throttled alike.
        let authorized = session
            || match bearer {
                None => false,
                Some(g) if same(g.trim(), token) => true,
                Some(_) => {
                    if let Some(wait) = ctx.logins.failed(rq.peer) {
                        return too_many_logins(wait);
                    }
                    false
                }
            };
        if !authorized {
            return Reply::html(401, pages::login(None))
                .with("WWW-Authenticate", "Bearer realm=\"sqlbroker\"".into());
        }
    }
    let Some((db, rest)) = ctx.database(&rq.path) else {
        return not_found("no database of that name is shown here");
    };
    let parts: Vec<&str> = rest.split('/').filter(|p| !p.is_empty()).collect();
    // A table's pages and actions need its database connected.
    if parts.first() == Some(&"tables") && db.live().is_none() {
        return Reply::html(
            503,
            pages::message(&format!("Database {}", db.name), &pages::down_text(db)),
        );
    }
    match (&rq.method, parts.as_slice()) {
        (Method::Get | Method::Head, []) => pages::overview(ctx, rq),
        (Method::Get | Method::Head, ["live"]) => live::overview(ctx, rq),
        (Method::Get | Method::Head, ["metrics"]) => Reply::text(
            200,
            "text/plain; version=0.0.4; charset=utf-8",
            metrics::render(ctx),
        ),
        (Method::Get | Method::Head, ["actions"]) => pages::actions(ctx),
        (Method::Get | Method::Head, ["periodics"]) => pages::periodics(ctx, rq),
        (Method::Post, ["periodics", verb @ ("pause" | "resume")]) => {
            if let Err(r) = post_allowed(ctx, rq, &form) {
                return r;
            }
            periodic(ctx, db, rq, verb, &form)
        }
        (Method::Get | Method::Head, ["tables", name]) => match table(ctx, db, name) {
            Ok(t) => pages::table(ctx, db, rq, &t),
            Err(r) => r,
        },
        (Method::Get | Method::Head, ["tables", name, "jobs", id]) => {
            match (table(ctx, db, name), id.parse::<i64>()) {
                (Ok(t), Ok(id)) => pages::job(ctx, db, rq, &t, id),
                (Err(r), _) => r,
                (_, Err(_)) => not_found("a job id is a number"),
            }
        }
        (Method::Get | Method::Head, ["tables", name, "live"]) => match table(ctx, db, name) {
            Ok(t) => live::table(ctx, db, rq, &t),
            Err(r) => r,
        },
        (Method::Post, ["tables", name, action]) => {
            if let Err(r) = post_allowed(ctx, rq, &form) {
                return r;
            }
            match table(ctx, db, name) {
                Ok(t) if *action == "bulk" => bulk(ctx, db, rq, &t, &form),
                Ok(t) => act(ctx, db, rq, &t, action, &form),
                Err(r) => r,
            }
        }
        (_, ["tables", _, _]) => Reply::text(
            405,
            "text/plain; charset=utf-8",
            "actions are POST only\n".into(),
        )
        .with("Allow", "POST".into()),
        // No token, no login: the overview, without a note a link could have put there.
        (Method::Get | Method::Head, ["login"]) => Reply::redirect(format!("{}/", db.prefix)),
        _ => not_found("no such page"),
    }
}

/// `/readyz`: 200 when every database answered a listing or a count within the last three
/// sampling intervals (at least [`READY_WITHIN`]); else 503, naming each database that did
/// not and why. From the samplers' memory: a database that stops answering is named once
/// its counts stop coming, and the probe itself never waits on it.
fn ready(ctx: &Ctx) -> Reply {
    let within = (ctx.sample * 3).max(READY_WITHIN);
    let mut failing = Vec::new();
    let mut lines = String::new();
    for db in &ctx.dbs {
        let name = crate::commands::escape(&db.name);
        let why = match db.live() {
            None => Some("not connected".to_string()),
            Some((_, sampler)) => match sampler.answered() {
                Some(at) if at.elapsed() <= within => None,
                Some(at) => Some(format!(
                    "no count answered for {} s",
                    at.elapsed().as_secs()
                )),
                None => Some("no count answered yet".into()),
            },
        };
        match why {
            None => lines.push_str(&format!("{name}: ok\n")),
            Some(why) => {
                lines.push_str(&format!("{name}: {why}\n"));
                failing.push(name);
            }
        }
    }
    if failing.is_empty() {
        Reply::text(200, "text/plain; charset=utf-8", format!("ready\n{lines}"))
    } else {
        let head = format!("not ready: {}\n", failing.join(", "));
        Reply::text(503, "text/plain; charset=utf-8", head + &lines)
    }
}

/// The least `/readyz` allows since a database's last answer.
const READY_WITHIN: std::time::Duration = std::time::Duration::from_secs(10);

/// The login form (token mode): a POST with the right token opens a session, whose id the
/// cookie carries.
fn login(ctx: &Ctx, rq: &Rq, form: &[(String, String)], token: &str) -> Reply {
    if rq.method != Method::Post {
        return Reply::html(200, pages::login(None));
    }
    if let Err(r) = same_origin(rq) {
        return r;
    }
    match field(form, "token") {
        Some(given) if same(given.trim(), token) => Reply::redirect("/".into()).with(
            "Set-Cookie",
            format!(
                "{}={}; {}; Max-Age={}",
                ctx.cookie,
                ctx.sessions.open(field(form, "name").unwrap_or_default()),
                cookie_attributes(rq),
                super::session::LIFETIME.as_secs()
            ),
        ),
        _ => match ctx.logins.failed(rq.peer) {
            Some(wait) => too_many_logins(wait),
            None => Reply::html(401, pages::login(Some("wrong token"))),
        },
    }
}

/// 429 for a wrong token from an address past its failures ([`super::session::Throttle`]),
/// held back [`HOLD`](super::session::HOLD): its window ends in `wait`. The right token is
/// never answered so.
fn too_many_logins(wait: std::time::Duration) -> Reply {
    let wait = wait.as_secs().max(1);
    let mut reply = Reply::html(
        429,
        pages::login(Some(&format!(
            "wrong token, and too many wrong tokens from this address: slow down (the right \
             token is always let in); the count starts again in {wait} s"
        ))),
    )
    .with("Retry-After", wait.to_string());
    reply.hold = super::session::HOLD;
    reply
}

/// Ends the session (POST only, same origin) and clears the cookie.
fn logout(ctx: &Ctx, rq: &Rq) -> Reply {
    if rq.method != Method::Post {
        return Reply::text(
            405,
            "text/plain; charset=utf-8",
            "logout is POST only\n".into(),
        )
        .with("Allow", "POST".into());
    }
    if let Err(r) = same_origin(rq) {
        return r;
    }
    if let Some(id) = rq.cookie(&ctx.cookie) {
        ctx.sessions.close(id.trim());
    }
    Reply::redirect("/login".into()).with(
        "Set-Cookie",
        format!("{}=; {}; Max-Age=0", ctx.cookie, cookie_attributes(rq)),
    )
}

/// A POST from a page of another origin is refused: browsers send `Origin` on every POST
/// (and `Sec-Fetch-Site`); tools that send neither pass on to the CSRF token check.
fn same_origin(rq: &Rq) -> Result<(), Reply> {
    let host = rq.header("host").unwrap_or("");
    if let Some(origin) = rq.header("origin") {
        let ok = origin
            .strip_prefix("http://")
            .or_else(|| origin.strip_prefix("https://"))
            .is_some_and(|o| o.eq_ignore_ascii_case(host));
        if !ok {
            return Err(forbidden("the request comes from another origin"));
        }
    }
    if rq
        .header("sec-fetch-site")
        .is_some_and(|s| s == "cross-site" || s == "same-site")
    {
        return Err(forbidden("the request comes from another site"));
    }
    Ok(())
}

/// An action may run: not read-only, same origin, the CSRF token given.
fn post_allowed(ctx: &Ctx, rq: &Rq, form: &[(String, String)]) -> Result<(), Reply> {
    if ctx.read_only {
        return Err(forbidden("the dashboard is read-only"));
    }
    same_origin(rq)?;
    if !field(form, "csrf").is_some_and(|c| same(c, &ctx.csrf)) {
        return Err(forbidden(
            "the form's CSRF token is missing or wrong (reload the page)",
        ));
    }
    Ok(())
}

/// The table `name`: one the dashboard shows, or a recorded one; with `--table`, only those
/// named (any other is not found, as if it did not exist).
fn table(ctx: &Ctx, db: &Database, name: &str) -> Result<Table, Reply> {
    if !ctx.tables.is_empty() && !ctx.tables.iter().any(|t| t == name) {
        return Err(not_found("no table of that name is shown here"));
    }
    if let Some(t) = db.sampler().known(name) {
        return Ok(t);
    }
    match db.broker().open_table(name) {
        Ok(t) => Ok(t),
        Err(sqlbroker::BrokerError::UnknownTable { .. }) => {
            Err(not_found("no recorded table has that name"))
        }
        Err(e @ sqlbroker::BrokerError::InvalidTable { .. }) => Err(not_found(&crate::chain(&e))),
        Err(e) => Err(Reply::html(
            503,
            pages::message("Database error", &crate::chain(&e)),
        )),
    }
}

/// Who sent the request, for the action log: the name given at login (token mode) or how
/// the request was let in, and the client's address.
fn who(ctx: &Ctx, rq: &Rq) -> String {
    let peer = rq.peer;
    if ctx.token.is_none() {
        return format!("{peer} (no token)");
    }
    match rq
        .cookie(&ctx.cookie)
        .and_then(|id| ctx.sessions.name(id.trim()))
    {
        Some(name) if !name.is_empty() => format!("{name} from {peer}"),
        Some(_) => format!("a login from {peer}"),
        None => format!("a bearer token from {peer}"),
    }
}

/// Pauses or resumes the periodic schedule the form names (with `--table`, one of a table shown
/// here), and goes back to the schedules' page saying so.
fn periodic(ctx: &Ctx, db: &Database, rq: &Rq, verb: &str, form: &[(String, String)]) -> Reply {
    let name = field(form, "name").unwrap_or_default();
    let b = db.broker();
    if !ctx.tables.is_empty() {
        let shown = b.periodics().is_ok_and(|all| {
            all.iter()
                .any(|p| p.name() == name && ctx.tables.iter().any(|t| t == p.table()))
        });
        if !shown {
            return not_found("no schedule of that name is shown here");
        }
    }
    let done = match verb {
        "pause" => b.pause_periodic(name),
        _ => b.resume_periodic(name),
    };
    let message = match done {
        Ok(()) => format!("{verb}d schedule {name}"),
        Err(e @ sqlbroker::BrokerError::UnknownPeriodic { .. }) => {
            return not_found(&crate::chain(&e))
        }
        Err(e) => return Reply::html(503, pages::message("The action failed", &crate::chain(&e))),
    };
    let action = format!("{verb} periodic");
    let note = match b.record_action(&who(ctx, rq), &action, "", name, 1) {
        Ok(()) => String::new(),
        Err(e) => format!(" (not written to the action log: {})", crate::chain(&e)),
    };
    let text: String =
        form_urlencoded::byte_serialize(format!("{message}{note}").as_bytes()).collect();
    Reply::redirect(format!("{}/periodics?done={text}", db.prefix))
}

/// Records an action in the database's log; the note to show if that failed (the action
/// itself was done).
fn logged(
    db: &Database,
    who: &str,
    action: &str,
    table: &Table,
    detail: &str,
    rows: u64,
) -> String {
    match db
        .broker()
        .record_action(who, action, table.name(), detail, rows)
    {
        Ok(()) => String::new(),
        Err(e) => format!(" (not written to the action log: {})", crate::chain(&e)),
    }
}

/// Sends the browser back where the form came from (a path of this dashboard), with what
/// happened.
fn back_to(db: &Database, table: &Table, form: &[(String, String)], message: &str) -> Reply {
    back_with(db, table, form, message, None)
}

/// [`back_to`], and for a bulk cancel that stopped before the end, where the next press
/// goes on (`bulk_after`: the page's cancel form carries it as `after`).
fn back_with(
    db: &Database,
    table: &Table,
    form: &[(String, String)],
    message: &str,
    go_on_after: Option<i64>,
) -> Reply {
    let back = field(form, "back")
        .filter(|b| safe_back(b))
        .map(str::to_string)
        .unwrap_or_else(|| format!("{}/tables/{}", db.prefix, table.name()));
    let sep = if back.contains('?') { '&' } else { '?' };
    let note: String = form_urlencoded::byte_serialize(message.as_bytes()).collect();
    let after = go_on_after.map_or_else(String::new, |id| format!("&bulk_after={id}"));
    Reply::redirect(format!("{back}{sep}done={note}{after}"))
}

/// Runs an action, records it, recounts the table, and sends the browser back where it came
/// from with what happened.
fn act(
    ctx: &Ctx,
    db: &Database,
    rq: &Rq,
    table: &Table,
    action: &str,
    form: &[(String, String)],
) -> Reply {
    let b = &db.broker();
    let id = field(form, "id").and_then(|s| s.trim().parse::<i64>().ok());
    let all = field(form, "all") == Some("1");
    let one = |found: bool, yes: String, no: String| match found {
        true => (yes, 1),
        false => (no, 0),
    };
    let mut detail = match (id, all) {
        (_, true) => "every dead letter".to_string(),
        (Some(id), _) => format!("job {id}"),
        _ => String::new(),
    };
    let done: Result<(String, u64), sqlbroker::BrokerError> = match (action, id, all) {
        ("pause", _, _) => b.pause(table).map(|()| ("paused".into(), 0)),
        ("resume", _, _) => b.resume(table).map(|()| ("resumed".into(), 0)),
        (verb @ ("pause_queue" | "resume_queue"), _, _) => {
            let queue = field(form, "queue").unwrap_or_default();
            detail = format!("queue {queue}");
            let (set, done) = match verb {
                "pause_queue" => (b.pause_queue(table, queue), "paused"),
                _ => (b.resume_queue(table, queue), "resumed"),
            };
            set.map(|()| (format!("queue {queue} {done}"), 0))
        }
        ("requeue", _, true) => b
            .requeue_all_dead(table)
            .map(|n| (format!("requeued {n} dead letters"), n)),
        ("purge", _, true) => b
            .purge_all_dead(table)
            .map(|n| (format!("purged {n} dead letters"), n)),
        ("requeue", Some(id), false) => b.requeue_dead(table, id).map(|found| {
            let no = format!("job {id} is not a dead letter");
            one(found, format!("requeued job {id}"), no)
        }),
        ("purge", Some(id), false) => b.purge_dead(table, id).map(|found| {
            let no = format!("job {id} is not a dead letter");
            one(found, format!("purged job {id}"), no)
        }),
        ("cancel", Some(id), _) => b.cancel(table, id).map(|found| {
            let no = format!("no live or dead job {id} to cancel");
            one(found, format!("cancelled job {id}"), no)
        }),
        ("run", Some(id), _) => b.run_now(table, id).map(|found| {
            let no = format!("job {id} is not scheduled for later (or is in work)");
            one(found, format!("job {id} is due now"), no)
        }),
        (action @ ("limit" | "rate"), _, _) => {
            let key = field(form, "key").unwrap_or_default();
            let max = match field(form, "max").map(str::trim) {
                None | Some("") | Some("lift") => None,
                Some(n) => match n.parse::<u32>() {
                    Ok(n) => Some(n),
                    Err(_) => {
                        return Reply::text(
                            400,
                            "text/plain; charset=utf-8",
                            "max is a whole number (empty lifts the limit)\n".into(),
                        )
                    }
                },
            };
            // A rate limit's window, where the form names one (a key may have several).
            let per = field(form, "per_ms")
                .and_then(|ms| ms.trim().parse::<u64>().ok())
                .map(std::time::Duration::from_millis);
            let (set, what) = match (action, per) {
                ("rate", Some(per)) => (b.set_rate_window(table, key, per, max), "rate limit"),
                ("rate", None) => (b.set_rate_limit(table, key, max), "rate limit"),
                _ => (b.set_concurrency_limit(table, key, max), "limit"),
            };
            detail = limit_detail(key, max);
            set.map(|()| match max {
                Some(n) => (format!("{what} {key:?} set to {n}"), 0),
                None => (format!("{what} {key:?} lifted"), 0),
            })
        }
        ("requeue" | "purge" | "cancel" | "run", _, _) => {
            return Reply::text(
                400,
                "text/plain; charset=utf-8",
                "the action needs a job id (id=N) or all=1\n".into(),
            )
        }
        _ => return not_found("no such action"),
    };
    db.sampler().refresh(table);
    let (message, rows) = match done {
        Ok(m) => m,
        // A max out of range or a key the table has no limit of: the operator's mistake.
        Err(
            e @ (sqlbroker::BrokerError::InvalidOption { .. }
            | sqlbroker::BrokerError::InvalidTable { .. }),
        ) => {
            return Reply::html(
                400,
                pages::message("The action was refused", &crate::chain(&e)),
            )
        }
        Err(e) => return Reply::html(503, pages::message("The action failed", &crate::chain(&e))),
    };
    let note = logged(db, &who(ctx, rq), action, table, &detail, rows);
    back_to(db, table, form, &format!("{message}{note}"))
}

/// Acts on every job of a state matching a filter. Cancel, retry (of dead letters) and delete
/// are one bounded pass of the library's ([`bulk_pass`]); "run now" of scheduled jobs pages
/// through `Broker::jobs_matching` by [`BATCH`], each job by its own `run_now`, at most
/// [`BULK_MAX`] jobs or [`BULK_TIME`] per request, then one entry in the action log.
pub(crate) fn bulk(
    ctx: &Ctx,
    db: &Database,
    rq: &Rq,
    table: &Table,
    form: &[(String, String)],
) -> Reply {
    let refuse = |why: String| Reply::html(400, pages::message("The action was refused", &why));
    let Some(state) = field(form, "state").and_then(state_from) else {
        return refuse("a bulk action names the state of the jobs it acts on".into());
    };
    let verb = field(form, "verb").unwrap_or_default();
    let Some((call, done)) = bulk_verb(verb, state) else {
        return refuse(format!("no bulk action {verb:?} on {} jobs", state.name()));
    };
    let filter =
        match filter_of(table, form) {
            Ok(f) if f.is_empty() => return refuse(
                "an action on every job matching needs a filter (a column's value or error text)"
                    .into(),
            ),
            Ok(f) => f,
            Err(why) => return refuse(why),
        };
    // Made due now (scheduled jobs) is the one verb without a pass of the library's.
    if verb != "retry" || state == sqlbroker::JobState::Dead {
        return bulk_pass(ctx, db, rq, table, form, state, &filter, verb);
    }
    let started = std::time::Instant::now();
    let (mut acted, mut seen, mut after, mut more) = (0u64, 0u64, None, false);
    let failed = loop {
        let page = match db
            .broker()
            .jobs_matching(table, state, &filter, after, BATCH, 0)
        {
            Ok(page) => page,
            Err(e) => break Some(e),
        };
        let mut error = None;
        for job in &page {
            // A row lock cancel waits for a delivery to settle: the time is checked per job.
            if seen >= BULK_MAX || started.elapsed() >= BULK_TIME {
                more = true;
                break;
            }
            match call(db.broker(), table, job.id()) {
                Ok(found) => acted += u64::from(found),
                Err(e) => {
                    error = Some(e);
                    break;
                }
            }
            seen += 1;
        }
        if error.is_some() || more {
            break error;
        }
        match page.last().filter(|_| page.len() == BATCH) {
            Some(last) => after = Some(last.id()),
            None => break None,
        }
    };
    db.sampler().refresh(table);
    let what = describe(state, &filter);
    let mut message = format!("{done} {acted} of {seen} {what}");
    if more {
        message.push_str(": more may match, send it again for the next ones");
    }
    if let Some(e) = &failed {
        message.push_str(&format!("; then it failed: {}", crate::chain(e)));
    }
    let note = logged(
        db,
        &who(ctx, rq),
        &format!("{verb} all matching"),
        table,
        &what,
        acted,
    );
    if failed.is_some() && acted == 0 {
        return Reply::html(
            503,
            pages::message("The action failed", &format!("{message}{note}")),
        );
    }
    back_to(db, table, form, &format!("{message}{note}"))
}

/// "Cancel / retry / delete all matching": one pass of `Broker::cancel_matching`,
/// `requeue_matching` (dead letters) or `delete_matching` (at most [`BULK_MAX`] jobs or
/// [`BULK_TIME`], a job in work of the row lock form waited for [`ROW_WAIT`] at most), from
/// where the last press stopped (the form's `after`). The note says what changed and only that
/// (the log's rows likewise), which jobs in work were left, and whether more may match; a
/// press that stopped early sends the browser back with where the next one goes on.
#[allow(clippy::too_many_arguments)]
fn bulk_pass(
    ctx: &Ctx,
    db: &Database,
    rq: &Rq,
    table: &Table,
    form: &[(String, String)],
    state: sqlbroker::JobState,
    filter: &sqlbroker::JobFilter,
    verb: &str,
) -> Reply {
    type Pass = fn(
        &sqlbroker::Broker,
        &Table,
        &sqlbroker::JobFilter,
        &sqlbroker::BulkPass,
    ) -> sqlbroker::Result<sqlbroker::BulkOutcome>;
    let (call, done): (Pass, &str) = match verb {
        "retry" => (sqlbroker::Broker::requeue_matching, "requeued"),
        "delete" => (sqlbroker::Broker::delete_matching, "deleted"),
        _ => (sqlbroker::Broker::cancel_matching, "cancelled"),
    };
    let after = field(form, "after").and_then(|a| a.trim().parse::<i64>().ok());
    let pass = sqlbroker::BulkPass::new()
        .after(after)
        .limit(usize::try_from(BULK_MAX).unwrap_or(usize::MAX))
        .batch(BATCH)
        .row_wait(ROW_WAIT)
        .time(BULK_TIME)
        .by(&who(ctx, rq));
    let matching = filter.clone().in_state(state);
    // The library writes the action log's entry (`cancel all matching`, the filter, the count).
    let r = match call(db.broker(), table, &matching, &pass) {
        Ok(r) => r,
        Err(e @ sqlbroker::BrokerError::InvalidOption { .. }) => {
            return Reply::html(
                400,
                pages::message("The action was refused", &crate::chain(&e)),
            )
        }
        Err(e) => return Reply::html(503, pages::message("The action failed", &crate::chain(&e))),
    };
    db.sampler().refresh(table);
    let what = describe(state, filter);
    let mut message = format!("{done} {} of {} {what}", r.changed(), r.seen());
    let skipped = |why: sqlbroker::SkipReason| -> Vec<i64> {
        r.skipped()
            .iter()
            .filter(|(_, w)| *w == why)
            .map(|(id, _)| *id)
            .collect()
    };
    let already = skipped(sqlbroker::SkipReason::AlreadyCancelling).len();
    if already > 0 {
        message.push_str(&format!("; {already} had been asked to cancel already"));
    }
    let busy = skipped(sqlbroker::SkipReason::InWork);
    if !busy.is_empty() {
        let mut ids: Vec<String> = busy.iter().take(BUSY_NAMED).map(i64::to_string).collect();
        if busy.len() > BUSY_NAMED {
            ids.push("...".into());
        }
        message.push_str(&format!(
            "; {} in work not {done} (a delivery held the row {} s): jobs {} (act on each \
             on its page, or press again once they are done)",
            busy.len(),
            ROW_WAIT.as_secs(),
            ids.join(", ")
        ));
    }
    if r.more() {
        message.push_str(": more may match, send it again for the next ones");
    }
    if let Some(e) = r.error() {
        message.push_str(&format!("; then it failed: {}", crate::chain(e)));
    }
    if r.error().is_some() && r.changed() == 0 {
        return Reply::html(503, pages::message("The action failed", &message));
    }
    let go_on = r.last().filter(|_| r.more() || r.error().is_some());
    back_with(db, table, form, &message, go_on)
}

/// A path of this dashboard to send the browser back to: `/` and then only printable ASCII
/// (no space, no control character: browsers drop a TAB or a line break from a URL, so
/// `/<TAB>/evil.example` would become `//evil.example`, another site), not `//` (another
/// host) and no backslash (which browsers read as `/`).
fn safe_back(b: &str) -> bool {
    b.starts_with('/')
        && !b.starts_with("//")
        && b.bytes().all(|c| c.is_ascii_graphic() && c != b'\\')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_and_tokens() {
        assert_eq!(host_name("localhost:8640"), "localhost");
        assert_eq!(host_name("[::1]:8640"), "[::1]");
        assert_eq!(host_name("127.0.0.1"), "127.0.0.1");
        assert!(same("abc", "abc"));
        assert!(!same("abc", "abd"));
        assert!(!same("abc", "abcd"));
    }

    #[test]
    fn memory_pages_are_quick() {
        let rq = |method: Method, target: &str| Request {
            method,
            target: target.into(),
            headers: Vec::new(),
            body: Vec::new(),
            peer: std::net::IpAddr::from([127, 0, 0, 1]),
        };
        for t in [
            "/",
            "/metrics",
            "/login?x=1",
            "/d/a/",
            "/d/a",
            "/d/a/metrics",
            "/?done=x",
            "/live?q=x&page=2",
            "/d/a/live",
        ] {
            assert!(quick(&rq(Method::Get, t)), "{t}");
        }
        assert!(quick(&rq(Method::Head, "/metrics")));
        assert!(quick(&rq(Method::Get, "/healthz")));
        assert!(quick(&rq(Method::Get, "/readyz")));
        for t in ["/tables/x", "/actions", "/d/a/tables/x", "/metrics/x"] {
            assert!(!quick(&rq(Method::Get, t)), "{t}");
        }
        assert!(
            !quick(&rq(Method::Post, "/login")),
            "a login writes a session"
        );
    }

    #[test]
    fn back_is_a_path_of_this_site() {
        assert!(safe_back("/tables/jobs?state=dead&after=3"));
        assert!(safe_back("/"));
        for bad in [
            "//evil.example",
            "/\t/evil.example",
            "/\n/evil.example",
            "/\r/x",
            "/\\evil.example",
            "/a b",
            "/\u{7f}",
            "/é",
            "https://evil.example",
            "evil",
            "",
        ] {
            assert!(!safe_back(bad), "{bad:?}");
        }
    }
}
