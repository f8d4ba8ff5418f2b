//! `sqlbroker dashboard`: a web dashboard of the queue tables and a Prometheus `/metrics`
//! page (cargo feature `dashboard`), of one database or several (`--url` repeated: each is
//! named, and its pages live under `/d/<name>/`; with one, at the root).
//!
//! Operators filter a table's jobs by a column's value and by error text, and act on one job
//! or on every job matching a filter (retry, cancel, delete), in bounded batches
//! ([`web::bulk`]). Every action is written to the database's action log
//! (`Broker::record_action`: who, what, when, how many rows), shown at `/actions`.
//!
//! A small bounded HTTP server ([`server`]: one polling thread holds every connection, a
//! small pool of worker threads answers complete requests, and two more answer the pages read
//! from memory alone, `/metrics` and the overview, so a slow listing never holds them up); pages
//! are rendered on the server with `maud`, which escapes every value it inserts unless told
//! otherwise (nothing from the database is ever inserted unescaped); the chart is SVG drawn
//! on the server; no external resource, and no script but the live refresh's ([`live`]: an
//! inline script allowed by a nonce per response, which sets what it reads as text), which
//! the pages do without.
//!
//! Safety model:
//! - it binds loopback unless told otherwise; a non-loopback `--listen` needs a token
//!   (`--token` or `SQLBROKER_DASHBOARD_TOKEN`) and refuses to start without one;
//! - with a token, every request needs it: `Authorization: Bearer <token>`, or the cookie the
//!   login form sets;
//! - on loopback, a request whose `Host` is not a loopback name is refused (a DNS rebinding
//!   page cannot drive it);
//! - state changes only on POST, each carrying the process's CSRF token and, when the browser
//!   sends one, a same-origin `Origin`; a GET never changes anything;
//! - a page of another site cannot make the browser fetch a page (`Sec-Fetch-Site:
//!   cross-site` is refused), and listings read each payload's first bytes only
//!   (`Broker::jobs_preview`) and take no row lock or key;
//! - `--table` restricts: any other table is not found, by GET or POST;
//! - a non-loopback address needs a token of at least [`TOKEN_MIN`] characters;
//! - wrong tokens are throttled per client address ([`session::Throttle`]), the right one
//!   never is (a client's failures lock no one else out);
//! - `--read-only` hides the actions and refuses their POSTs;
//! - a slow client holds no thread: the server's one polling thread reads every request
//!   whole (head at most 16 KiB within 10 s of the connection, body at most 8 KiB with a
//!   `Content-Length`) before a worker sees it, and writes the answers; at most 512
//!   connections are open (a new one closes the oldest still sending), so the workers only
//!   ever wait for the database (each statement bounded by the broker's statement timeout,
//!   each connection checkout by its connect timeout).

mod chart;
mod filters;
mod http;
mod live;
mod metrics;
mod pages;
mod sampler;
mod script;
mod server;
mod session;
mod web;

use std::collections::HashSet;
use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use sqlbroker::Broker;

use super::Result;
use crate::Cli;
use sampler::Sampler;

/// The environment variable that may hold the token.
pub(crate) const TOKEN_ENV: &str = "SQLBROKER_DASHBOARD_TOKEN";

/// The fewest characters of a token for a non-loopback address: the right token is never
/// refused ([`session::Throttle`] only slows wrong ones down), so the token's length is what
/// keeps it from being guessed. 16 characters of `openssl rand -hex 16` are 64 bits.
pub(crate) const TOKEN_MIN: usize = 16;

/// Serve a web dashboard of the tables and a Prometheus /metrics page.
#[derive(Debug, clap::Args)]
pub(crate) struct DashboardArgs {
    /// The address to listen on (port 0: any free port; the address is printed). A
    /// non-loopback address needs a token.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8640")]
    listen: String,

    /// Require this token: `Authorization: Bearer <token>`, or the cookie the login page
    /// sets. Required to listen on a non-loopback address. Give it in the environment
    /// variable: a token on the command line shows in the process list (a warning says so).
    #[arg(long, env = TOKEN_ENV, hide_env_values = true, value_name = "TOKEN")]
    token: Option<String>,

    /// Show only: no actions (requeue, purge, cancel, pause, resume) are offered or accepted.
    #[arg(long)]
    read_only: bool,

    /// A table to show; repeat for several. None: every recorded table. Any other table is
    /// not found (not listed, not shown, no action, not in /metrics).
    #[arg(long = "table", short, value_name = "NAME")]
    tables: Vec<String>,

    /// Seconds between two counts of every table (the chart's resolution; the pages and
    /// /metrics show the last count).
    #[arg(long, value_name = "SECS", default_value_t = 5,
          value_parser = clap::value_parser!(u64).range(1..=3_600))]
    sample: u64,

    /// Worker threads answering requests (they wait only for the database: a slow client
    /// holds none). Two more answer `/metrics` and the overview, which read memory only, so
    /// slow listings never hold those up.
    #[arg(long, value_name = "N", default_value_t = 4,
          value_parser = clap::value_parser!(u64).range(1..=64))]
    threads: u64,
}

/// One database the dashboard shows.
pub(crate) struct Database {
    /// Its name in pages and paths (`NAME=URL`, or made from the URL).
    pub name: String,
    /// The URL as shown: no user, password or parameters.
    pub shown: String,
    /// What its pages' paths start with: empty with one database, else `/d/<name>`.
    pub prefix: String,
    /// Its broker and sampler, once connected.
    live: OnceLock<(Broker, Arc<Sampler>)>,
    /// Why it is not connected yet (several databases: one that did not answer at the start
    /// is tried again every [`RECONNECT`]).
    down: Mutex<Option<String>>,
}

/// The longest one statement of the dashboard may take on the server (a count of a big table).
const STATEMENT: Duration = Duration::from_secs(10);
/// The longest the dashboard waits for the answer to one round trip: a database that stops
/// answering (a hung host behind a live proxy) reads as failing this soon.
const ROUND_TRIP: Duration = Duration::from_secs(15);

/// How often a database that did not answer at the start is tried again.
const RECONNECT: Duration = Duration::from_secs(5);

impl Database {
    /// Its broker and sampler, or `None` while it is down.
    pub fn live(&self) -> Option<(&Broker, &Arc<Sampler>)> {
        self.live.get().map(|(b, s)| (b, s))
    }

    /// Why it is not connected yet.
    pub fn down(&self) -> Option<String> {
        self.down.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Its broker: only for a database the route found connected ([`web`] answers 503 for
    /// one that is down before any page or action runs).
    pub fn broker(&self) -> &Broker {
        &self
            .live
            .get()
            .expect("a connected database (checked by the route)")
            .0
    }

    /// Its sampler, likewise.
    pub fn sampler(&self) -> &Sampler {
        &self
            .live
            .get()
            .expect("a connected database (checked by the route)")
            .1
    }
}

/// A broker on `url` with the dashboard's short waits (a page on a database that went away
/// says so in seconds; one that stops answering, within [`ROUND_TRIP`]), and its sampler,
/// started; or why not, and whether trying again may help.
fn connect(
    url: &str,
    threads: usize,
    connect_timeout: u64,
    tables: &[String],
    sample: u64,
) -> std::result::Result<(Broker, Arc<Sampler>), (String, bool)> {
    let broker = Broker::builder(url)
        .pool_size(u32::try_from(threads).unwrap_or(4) + 2)
        .connection_timeout(Duration::from_secs(connect_timeout.clamp(1, 5)))
        .statement_timeout(STATEMENT)
        .round_trip_timeout(ROUND_TRIP)
        // A view of the databases: it maintains none (their applications' brokers do).
        .maintenance(false)
        .build()
        .map_err(|e| (crate::chain(&e), e.is_transient()))?;
    let sampler = Sampler::new(broker.clone(), tables.to_vec(), Duration::from_secs(sample));
    sampler
        .start()
        .map_err(|e| (format!("starting its sampler: {e}"), false))?;
    Ok((broker, sampler))
}

/// What every request handler shares.
pub(crate) struct Ctx {
    /// The databases, in the order of `--url`; requests without `/d/<name>` go to the first.
    pub dbs: Vec<Arc<Database>>,
    /// The interval between two counts of every table (every database's sampler's; the
    /// pages read it here, a database that is down has no sampler).
    pub sample: Duration,
    pub token: Option<String>,
    /// Logins of the token mode: the cookie carries a session id, not the token.
    pub sessions: session::Sessions,
    /// The session cookie's name: [`web::SESSION_COOKIE`] and the port listened on. Cookies
    /// do not tell ports apart, so two dashboards on one host would otherwise overwrite (and
    /// be sent) each other's.
    pub cookie: String,
    /// Wrong tokens by client address (throttled past a few a minute; the right token never
    /// is).
    pub logins: session::Throttle,
    /// The tables `--table` named (empty: every recorded table): no other is shown or acted
    /// on.
    pub tables: Vec<String>,
    pub read_only: bool,
    /// The token every form carries (random per process).
    pub csrf: String,
    /// Listening on loopback: only loopback `Host` names are served.
    pub loopback: bool,
}

pub(crate) fn run(cli: &Cli, args: &DashboardArgs) -> Result {
    let addr = listen_addr(&args.listen)?;
    let token = args.token.clone().filter(|t| !t.is_empty());
    if token_on_command_line(args.token.as_deref()) {
        eprintln!(
            "sqlbroker dashboard: warning: a token given with --token shows in the process \
             list (ps, /proc/<pid>/cmdline) to every user of this host: set {TOKEN_ENV} instead"
        );
    }
    if !addr.ip().is_loopback() && token.is_none() {
        return Err(format!(
            "refusing to listen on {addr}, which is not a loopback address, without a token: \
             give --token or set {TOKEN_ENV}"
        )
        .into());
    }
    if let Some(short) = token.as_ref().filter(|t| t.chars().count() < TOKEN_MIN) {
        if !addr.ip().is_loopback() {
            return Err(format!(
                "refusing to listen on {addr}, which is not a loopback address, with a token of \
                 {} characters: it needs at least {TOKEN_MIN} (openssl rand -hex 16 makes one)",
                short.chars().count()
            )
            .into());
        }
    }
    let threads = usize::try_from(args.threads).unwrap_or(4);
    let named = named_urls(&cli.url)?;
    let several = named.len() > 1;
    let mut dbs = Vec::new();
    for (name, url) in named {
        super::existing_database(&url).map_err(|e| format!("database {name}: {e}"))?;
        let db = Arc::new(Database {
            prefix: if several {
                format!("/d/{name}")
            } else {
                String::new()
            },
            shown: shown_url(&url),
            name,
            live: OnceLock::new(),
            down: Mutex::new(None),
        });
        let connect = {
            let (tables, sample, timeout) = (args.tables.clone(), args.sample, cli.connect_timeout);
            move || connect(&url, threads, timeout, &tables, sample)
        };
        match connect() {
            Ok(live) => drop(db.live.set(live)),
            // With several databases, one that does not answer yet is shown as down and
            // tried again in the background; an error trying again cannot mend ends the
            // start (or, with one database, any error).
            Err((why, true)) if several => {
                eprintln!(
                    "sqlbroker dashboard: database {}: {} (shown as down; trying again every {} s)",
                    db.name,
                    super::escape(&why),
                    RECONNECT.as_secs()
                );
                *db.down.lock().unwrap_or_else(|e| e.into_inner()) = Some(why);
                let db = Arc::clone(&db);
                std::thread::Builder::new()
                    .name("sqlbroker-dashboard-reconnect".into())
                    .spawn(move || loop {
                        std::thread::sleep(RECONNECT);
                        let tried = connect();
                        let mut down = db.down.lock().unwrap_or_else(|e| e.into_inner());
                        match tried {
                            Ok(live) => {
                                drop(db.live.set(live));
                                *down = None;
                                break;
                            }
                            Err((why, _)) => *down = Some(why),
                        }
                    })?;
            }
            Err((why, _)) => return Err(format!("database {}: {why}", db.name).into()),
        }
        dbs.push(db);
    }
    for db in &dbs {
        if let Some((_, sampler)) = db.live() {
            sampler.wait_first(Duration::from_secs(cli.connect_timeout.max(1) + 5));
        }
    }

    let listener = bind(addr).map_err(|e| format!("listening on {addr}: {e}"))?;
    let bound = listener.local_addr()?;
    let ctx = Arc::new(Ctx {
        dbs,
        sample: Duration::from_secs(args.sample),
        token,
        read_only: args.read_only,
        sessions: session::Sessions::default(),
        cookie: format!("{}_{}", web::SESSION_COOKIE, bound.port()),
        logins: session::Throttle::default(),
        tables: args.tables.clone(),
        csrf: session::random_id(),
        loopback: addr.ip().is_loopback(),
    });
    crate::commands::say(format_args!(
        "sqlbroker dashboard: listening on http://{bound}/{}\n",
        if args.read_only { " (read-only)" } else { "" }
    ))?;
    let handler: Arc<server::Handler> = Arc::new(move |rq| web::handle(&ctx, rq));
    let e = server::serve(listener, threads, handler, web::quick);
    Err(format!(
        "the dashboard stopped serving: {}",
        e.err()
            .map_or_else(|| "no reason".into(), |e| e.to_string())
    )
    .into())
}

impl Ctx {
    /// The database a path names (`/d/<name>/rest`) and the rest of the path, or the first
    /// database and the whole path; `None` for a name no database has.
    pub fn database<'a>(&self, path: &'a str) -> Option<(&Database, &'a str)> {
        match path.strip_prefix("/d/") {
            Some(rest) => {
                let (name, rest) = rest.split_once('/').map_or((rest, ""), |(n, r)| (n, r));
                let db = &**self.dbs.iter().find(|d| d.name == name)?;
                Some((db, rest))
            }
            None => Some((&*self.dbs[0], path)),
        }
    }

    /// True if the dashboard shows several databases.
    pub fn several(&self) -> bool {
        self.dbs.len() > 1
    }
}

/// The longest name of a database.
const NAME_MAX: usize = 40;

/// Each `--url` with its name: `NAME=URL` names it (NAME of letters, digits, `_`, `-` and
/// `.`, before any `:` or `/`), else the name is made from the URL (its database or file
/// name); a name taken already gets `-2`, `-3`, ...
fn named_urls(urls: &[String]) -> Result<Vec<(String, String)>> {
    let mut taken = HashSet::new();
    let mut out = Vec::new();
    for given in urls {
        let (name, url) = match given.split_once('=') {
            Some((n, u)) if !n.is_empty() && !n.contains([':', '/', '?', '@']) => {
                if n.len() > NAME_MAX || !n.bytes().all(name_byte) {
                    return Err(format!(
                        "--url {}=...: a database's name is at most {NAME_MAX} letters, digits,                          '_', '-' or '.'",
                        super::escape(n)
                    )
                    .into());
                }
                if !taken.insert(n.to_string()) {
                    return Err(format!("--url: two databases are named {n}").into());
                }
                (n.to_string(), u.to_string())
            }
            _ => (made_name(given, &mut taken), given.clone()),
        };
        out.push((name, url));
    }
    Ok(out)
}

fn name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.')
}

/// A name for `url`: the database (or SQLite file) it names, cut to the bytes a name may
/// hold, made unique among `taken`.
fn made_name(url: &str, taken: &mut HashSet<String>) -> String {
    let path = url.split(['?', '#']).next().unwrap_or(url);
    let last = path
        .rsplit(['/', ':'])
        .find(|p| !p.is_empty())
        .unwrap_or("db");
    let stem = last.strip_suffix(".db").unwrap_or(last);
    let mut base: String = stem
        .bytes()
        .map(|b| if name_byte(b) { b as char } else { '-' })
        .take(NAME_MAX - 4)
        .collect();
    if base.is_empty() {
        base = "db".into();
    }
    let mut name = base.clone();
    let mut n = 2;
    while !taken.insert(name.clone()) {
        name = format!("{base}-{n}");
        n += 1;
    }
    name
}

/// `url` as a page may show it: no user or password, no parameters (they may carry a
/// password or a key file's path).
fn shown_url(url: &str) -> String {
    let url = url.split(['?', '#']).next().unwrap_or(url);
    match url.split_once("://") {
        Some((scheme, rest)) => {
            let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
            let host = host.rsplit_once('@').map_or(host, |(_, h)| h);
            format!("{scheme}://{host}/{path}")
        }
        None => url.to_string(),
    }
}

/// True if `token` came from `--token` rather than [`TOKEN_ENV`] (clap takes the command
/// line's value over the environment's).
fn token_on_command_line(token: Option<&str>) -> bool {
    token.is_some_and(|t| std::env::var(TOKEN_ENV).map_or(true, |env| env != t))
}

/// `--listen` as one socket address (a name resolves to its first address).
fn listen_addr(listen: &str) -> Result<SocketAddr> {
    listen
        .to_socket_addrs()
        .map_err(|e| format!("--listen {listen}: {e}"))?
        .next()
        .ok_or_else(|| format!("--listen {listen}: no address").into())
}

/// The listening socket, with `TCP_NODELAY`, which the connections it accepts inherit (the
/// server sets it on each as well): Nagle's algorithm would hold an answer's last segment
/// back for the client's delayed acknowledgement (40 ms a page).
fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    use socket2::{Domain, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    socket.set_reuse_address(true)?;
    socket.set_tcp_nodelay(true)?;
    socket.bind(&addr.into())?;
    socket.listen(128)?;
    Ok(socket.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn databases_are_named() {
        let urls: Vec<String> = [
            "postgres://u:secret@db1:5432/billing?sslmode=require",
            "mysql://root@127.0.0.1:3306/billing",
            "sqlite:/var/lib/app/jobs.db",
            "ops=postgres://h/x",
            "sqlite::memory:",
        ]
        .map(String::from)
        .into();
        let named = named_urls(&urls).unwrap();
        let names: Vec<&str> = named.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["billing", "billing-2", "jobs", "ops", "memory"]);
        assert_eq!(named[3].1, "postgres://h/x");
        assert_eq!(named[0].1, urls[0], "a URL without a name is kept whole");
        assert!(
            named_urls(&["a b=sqlite:x".into()]).is_err(),
            "a space in a name"
        );
        assert!(named_urls(&["x=sqlite:a".into(), "x=sqlite:b".into()]).is_err());
        assert!(named_urls(&[format!("{}=sqlite:a", "n".repeat(41))]).is_err());
        assert!(named_urls(&["n<x=sqlite:a".into()]).is_err());
    }

    #[test]
    fn urls_are_shown_without_secrets() {
        assert_eq!(
            shown_url("postgres://u:secret@db1:5432/billing?sslmode=require&password=p"),
            "postgres://db1:5432/billing"
        );
        assert_eq!(shown_url("sqlite:jobs.db"), "sqlite:jobs.db");
        assert_eq!(shown_url("mysql://root@h"), "mysql://h/");
    }
}
