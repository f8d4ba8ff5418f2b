//! One PostgreSQL session as a [`DbConn`], its per-connection statement cache, and how a
//! driver error is classified.
//!
//! Poolers (PgBouncer): the session settings (`lock_timeout`, `statement_timeout`) travel in
//! the startup packet's `options`, which PgBouncer refuses by default ("unsupported startup
//! parameter: options") or drops (`ignore_startup_parameters = options`). Either is noticed
//! on the first session, and sessions are then opened without them and `SET` after connecting
//! (session pooling keeps a server session per client). With `pool_mode=transaction` in the
//! URL, a client's statements may run on a different server session per transaction: nothing
//! is set for a session, the settings are made by `SET LOCAL` in each transaction (a statement
//! outside one runs in one of its own: three round trips instead of one), and statements are
//! sent unnamed (`query_typed`, parameters as text the server types), never prepared by name.
//!
//! Transaction pooling the URL does not declare shows itself when a statement prepared on one
//! server session is run on another ("prepared statement .. does not exist"): from then on the
//! engine is used as if it were declared (a warning says so, once), the statement is run again
//! unnamed where no transaction of ours was open (it did nothing), and sessions opened before
//! are discarded.
//!
//! A server that takes no writes (SQLSTATE 25006: a standby, or a primary set read-only by a
//! switchover; "cannot execute .. during recovery") ends the session as a lost connection
//! ([`DbError::refused_writes`]): `target_session_attrs` is read only at connect, so only a new
//! session finds the new primary.

use std::collections::HashMap;
use std::error::Error as StdError;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use postgres::error::SqlState;
use postgres::types::{ToSql, Type};
use postgres::{Client, NoTls, Statement};

use crate::dialect::DbConn;
use crate::error::{DbError, DbErrorKind};
use crate::model::value::Value;

/// Prepared statements kept per connection before the cache is emptied: a table uses about a
/// dozen, plus the insert and renewal variants of each size class.
const STMT_CACHE: usize = 256;

/// How sessions are opened.
pub(super) enum Connector {
    /// TCP hosts (every host of the URL): our connector sees each socket, bounds every round
    /// trip on it, and negotiates TLS as the URL's `sslmode` says (`deadline.rs`).
    Bounded(super::deadline::MakeBounded),
    /// A Unix socket, or addresses without host names (`hostaddr` alone): the driver's own
    /// negotiation, and no bound on a round trip. `sslmode=disable`, or `prefer` without the
    /// `tls` feature.
    Plain,
    /// As [`Connector::Plain`], through TLS where the mode allows; `prefer` (`fallback`) goes
    /// on in plain text if the handshake fails.
    #[cfg(feature = "tls")]
    Rustls {
        make: super::tls::MakeRustls,
        fallback: bool,
    },
}

impl Connector {
    /// The connector of `settings`, and the driver's TLS settings in `config` to match; every
    /// round trip of a TCP session is bounded by `within`.
    pub(super) fn new(
        settings: &super::tls::Settings,
        config: &mut postgres::Config,
        within: Duration,
    ) -> Result<Self, crate::error::BrokerError> {
        use postgres::config::{Host, SslMode, SslNegotiation};
        let hosts = config.get_hosts();
        if !hosts.is_empty() && hosts.iter().all(|h| matches!(h, Host::Tcp(_))) {
            // The driver hands the socket to its connector only to start TLS: told to start
            // it at once, it hands every socket over, and ours negotiates as the URL says.
            let direct = config.get_ssl_negotiation() == SslNegotiation::Direct;
            config
                .ssl_mode(SslMode::Require)
                .ssl_negotiation(SslNegotiation::Direct);
            if settings.mode == super::tls::SslMode::Disable {
                return Ok(Connector::Bounded(super::deadline::MakeBounded::plain(
                    within,
                )));
            }
            #[cfg(feature = "tls")]
            return Ok(Connector::Bounded(super::deadline::MakeBounded::tls(
                super::tls::MakeRustls::new(settings)?,
                settings.mode != super::tls::SslMode::Prefer,
                direct,
                within,
            )));
            #[cfg(not(feature = "tls"))]
            {
                let _ = direct;
                return Ok(Connector::Bounded(super::deadline::MakeBounded::plain(
                    within,
                )));
            }
        }
        config.ssl_mode(settings.driver_mode());
        if settings.mode == super::tls::SslMode::Disable {
            return Ok(Connector::Plain);
        }
        #[cfg(feature = "tls")]
        return Ok(Connector::Rustls {
            make: super::tls::MakeRustls::new(settings)?,
            fallback: settings.mode == super::tls::SslMode::Prefer,
        });
        #[cfg(not(feature = "tls"))]
        Ok(Connector::Plain)
    }
}

/// How long a session that is closed may take to say goodbye (the driver sends a terminate
/// message and shuts the socket down when its client is dropped): a server that stopped
/// answering must not hold up the thread that drops it.
const CLOSE_WITHIN: Duration = Duration::from_secs(1);

/// A driver session and the deadline of its round trips ([`Connector::Bounded`]; none for a
/// session the driver negotiated itself).
pub(super) struct Session {
    pub client: Client,
    deadline: Option<Arc<super::deadline::Deadline>>,
    /// The bound of one round trip.
    within: Duration,
    /// The unanswered round trip was reported: the calls after it fail at once (the driver
    /// has closed the connection) as a plain lost connection.
    reported: bool,
}

impl Session {
    /// The next round trips must be answered within the bound, from now.
    pub fn arm(&self) {
        if let Some(d) = &self.deadline {
            d.arm(self.within);
        }
    }

    /// No bound until the next [`arm`](Session::arm): between calls the session may sit idle
    /// (a row lock delivery's transaction while its handler runs, the change feed waiting for
    /// notifications) as long as it likes.
    pub fn disarm(&self) {
        if let Some(d) = &self.deadline {
            d.disarm();
        }
    }

    /// `f`'s round trips, bounded.
    pub fn bounded<T>(&mut self, f: impl FnOnce(&mut Client) -> T) -> T {
        self.arm();
        let r = f(&mut self.client);
        self.disarm();
        r
    }

    /// An error of the session's setup (the settings' check, their `SET`), classified as a
    /// failed connection attempt: [`DbError::no_answer`] if the setup's deadline passed.
    fn setup_error(&self, e: postgres::Error) -> DbError {
        match &self.deadline {
            Some(d) if d.fired() => DbError::no_answer(PgError(e), d.within()),
            _ => DbError::new(classify_connect(&e), PgError(e)),
        }
    }

    /// A driver error as ours: the round trip that passed its deadline is
    /// [`DbError::no_answer`] (once: the pool condemns the sessions opened before it).
    pub fn error(&mut self, e: postgres::Error) -> DbError {
        match &self.deadline {
            Some(d) if d.fired() && !self.reported => {
                self.reported = true;
                DbError::no_answer(PgError(e), d.within())
            }
            _ => db_error(e, self.client.is_closed()),
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        // Armed for the goodbye the client's own drop sends, just after this.
        if let Some(d) = &self.deadline {
            d.arm(self.within.min(CLOSE_WITHIN));
        }
    }
}

/// How the broker's sessions reach the server (the URL's `pool_mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Pooling {
    /// A direct connection, or a pooler that keeps a server session per client session
    /// (PgBouncer's session pooling).
    Session,
    /// PgBouncer's transaction pooling: a server session per transaction.
    Transaction,
}

/// How sessions are set up, shared by all of an engine's sessions.
pub(super) struct Setup {
    /// The URL's `pool_mode`.
    declared: Pooling,
    /// Transaction pooling the URL did not declare was noticed: the engine is used as if it
    /// were declared.
    detected: AtomicBool,
    /// The startup packet's `options` (`-c name=value ..`).
    options: String,
    /// `SET name = 'value'; ..`: the startup options' settings, for a session opened without
    /// them.
    set: String,
    /// `SET LOCAL name = 'value'; ..`: the same, for one transaction.
    set_local: String,
    /// The startup options were refused or ignored (a pooler): sessions are opened without
    /// them and `set` after connecting.
    options_refused: AtomicBool,
    /// The first session has shown whether the startup options take effect.
    options_checked: AtomicBool,
}

impl Setup {
    /// The setup of sessions whose startup `options` are `options` (`-c name=value ..`).
    pub(super) fn new(pooling: Pooling, options: &str) -> Self {
        let settings = settings(options);
        let statements = |set: &str| {
            settings
                .iter()
                .map(|(n, v)| format!("{set} {n} = '{}'", v.replace('\'', "''")))
                .collect::<Vec<_>>()
                .join("; ")
        };
        Setup {
            declared: pooling,
            detected: AtomicBool::new(false),
            options: options.to_string(),
            set: statements("SET"),
            set_local: statements("SET LOCAL"),
            options_refused: AtomicBool::new(false),
            options_checked: AtomicBool::new(false),
        }
    }
}

impl Setup {
    /// The pooling sessions are opened for: the URL's, or transaction pooling once noticed.
    pub(super) fn pooling(&self) -> Pooling {
        if self.detected.load(Ordering::Relaxed) {
            Pooling::Transaction
        } else {
            self.declared
        }
    }

    /// Transaction pooling was noticed (a statement of ours missing on the server session):
    /// warns once, and sessions are opened for it from now on.
    fn detect(&self, e: &postgres::Error) {
        if self.declared == Pooling::Transaction || self.detected.swap(true, Ordering::Relaxed) {
            return;
        }
        log::warn!(
            "PostgreSQL: {}: the server session changed under a connection, as behind a \
             PgBouncer in transaction pooling; this broker now uses it as declared transaction \
             pooling (statements unnamed, settings by SET LOCAL in each transaction, the \
             advisory form refused). Say pool_mode=transaction in the URL to start so, and give \
             BrokerBuilder::listen_url a direct URL: the change feed's LISTEN needs a session of \
             its own, and through this pooler other brokers' publishes are found only at the \
             poll interval",
            PgError::text(e)
        );
    }
}

/// The `(name, value)` settings of startup options: `-c name=value`, `-cname=value` and
/// `--name=value`. Anything else is left out (and logged): it cannot be `SET`.
fn settings(options: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut words = options.split_whitespace();
    while let Some(w) = words.next() {
        let pair = match w {
            "-c" => words.next(),
            _ => w.strip_prefix("--").or_else(|| w.strip_prefix("-c")),
        };
        let parsed = pair.and_then(|p| p.split_once('=')).filter(|(n, _)| {
            !n.is_empty()
                && n.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
        });
        match parsed {
            Some((n, v)) => out.push((n.replace('-', "_"), v.to_string())),
            None => log::warn!("PostgreSQL: startup option {w:?} cannot be SET through a pooler"),
        }
    }
    out
}

/// Opens a session with the engine's settings.
pub(super) fn connect(
    config: &postgres::Config,
    tls: &Connector,
    setup: &std::sync::Arc<Setup>,
) -> Result<Box<dyn DbConn + Send>, DbError> {
    let mode = setup.pooling();
    let session = client(config, tls, setup)?;
    // Armed while it was set up.
    session.disarm();
    Ok(Box::new(PgConn {
        session,
        statements: HashMap::new(),
        broken: false,
        unreadable: Vec::new(),
        pid: None,
        setup: setup.clone(),
        mode,
        in_tx: false,
    }))
}

/// Opens a driver session with the engine's TLS and session settings (the pool's sessions
/// and the change feed's): through the startup options, or, where they are refused or
/// ignored, by `SET` after connecting (session pooling); in transaction pooling, neither.
/// Its deadline is still armed with the one the connection's setup began with: the caller
/// disarms it.
pub(super) fn client(
    config: &postgres::Config,
    tls: &Connector,
    setup: &Setup,
) -> Result<Session, DbError> {
    let options = setup.options.as_str();
    if setup.pooling() == Pooling::Transaction || options.is_empty() {
        // A transaction pooler shares server sessions between clients: the settings are made
        // per transaction (`SET LOCAL`), never for a session.
        return connect_tls(config, tls);
    }
    if !setup.options_refused.load(Ordering::Relaxed) {
        let mut with_options = config.clone();
        with_options.options(options);
        match connect_tls(&with_options, tls) {
            Ok(mut session) => {
                if setup.options_checked.swap(true, Ordering::Relaxed) {
                    return Ok(session);
                }
                // Once: a pooler may drop the options without a word
                // (`ignore_startup_parameters = options`).
                let from_client = session
                    .client
                    .query(super::sql::CLIENT_SETTINGS, &[])
                    .map_err(|e| session.setup_error(e))?
                    .iter()
                    .filter_map(|r| r.try_get::<_, String>(0).ok())
                    .collect::<Vec<_>>();
                let applied = settings(options)
                    .iter()
                    .all(|(n, _)| from_client.iter().any(|c| c == n));
                if applied {
                    return Ok(session);
                }
                log::info!(
                    "PostgreSQL: the startup options were ignored (a pooler?); sessions are \
                     set up by SET after connecting"
                );
                setup.options_refused.store(true, Ordering::Relaxed);
                return set(session, setup);
            }
            Err(e) if options_refused(&e) => {
                log::info!(
                    "PostgreSQL: the startup options were refused ({}); sessions are set up \
                     by SET after connecting",
                    e
                );
                setup.options_refused.store(true, Ordering::Relaxed);
            }
            Err(e) => return Err(e),
        }
    }
    set(connect_tls(config, tls)?, setup)
}

/// The session settings by `SET`.
fn set(mut session: Session, setup: &Setup) -> Result<Session, DbError> {
    if !setup.set.is_empty() {
        if let Err(e) = session.client.batch_execute(&setup.set) {
            return Err(session.setup_error(e));
        }
    }
    Ok(session)
}

/// A pooler's refusal of the startup packet's `options` (PgBouncer: "unsupported startup
/// parameter: options").
fn options_refused(e: &DbError) -> bool {
    e.to_string()
        .contains("unsupported startup parameter: options")
}

/// Opens a driver session with the engine's TLS settings.
fn connect_tls(config: &postgres::Config, tls: &Connector) -> Result<Session, DbError> {
    let unbounded = |client| Session {
        client,
        deadline: None,
        within: Duration::ZERO,
        reported: false,
    };
    let failed = |e: postgres::Error, made: &super::deadline::MakeBounded| match made.made() {
        Some(d) if d.fired() => DbError::no_answer(PgError(e), d.within()),
        _ => DbError::new(classify_connect(&e), PgError(e)),
    };
    match tls {
        Connector::Bounded(make) => {
            let attempt = make.for_attempt();
            match config.connect(attempt.clone()) {
                Ok(client) => Ok(Session {
                    client,
                    deadline: attempt.made(),
                    within: make.within,
                    reported: false,
                }),
                // libpq's `prefer`: a connection that cannot be encrypted is made in plain
                // text.
                #[cfg(feature = "tls")]
                Err(e) if make.falls_back() && super::tls::is_tls_failure(&e) => {
                    log::info!(
                        "PostgreSQL: TLS handshake failed ({}); sslmode=prefer goes on without TLS",
                        PgError(e)
                    );
                    let plain = make.without_tls();
                    match config.connect(plain.clone()) {
                        Ok(client) => Ok(Session {
                            client,
                            deadline: plain.made(),
                            within: make.within,
                            reported: false,
                        }),
                        Err(e) => Err(failed(e, &plain)),
                    }
                }
                Err(e) => Err(failed(e, &attempt)),
            }
        }
        Connector::Plain => config
            .connect(NoTls)
            .map(unbounded)
            .map_err(|e| DbError::new(classify_connect(&e), PgError(e))),
        #[cfg(feature = "tls")]
        Connector::Rustls { make, fallback } => match config.connect(make.clone()) {
            // libpq's `prefer`: a connection that cannot be encrypted is made in plain text.
            Err(e) if *fallback && super::tls::is_tls_failure(&e) => {
                log::info!(
                    "PostgreSQL: TLS handshake failed ({}); sslmode=prefer goes on without TLS",
                    PgError(e)
                );
                let mut plain = config.clone();
                plain.ssl_mode(postgres::config::SslMode::Disable);
                plain.connect(NoTls)
            }
            other => other,
        }
        .map(unbounded)
        .map_err(|e| DbError::new(classify_connect(&e), PgError(e))),
    }
}

/// One PostgreSQL session. Each call's round trips are bounded ([`Session::bounded`]); the
/// driver's client handed to the application (`driver`) is not.
struct PgConn {
    session: Session,
    statements: HashMap<String, Statement>,
    broken: bool,
    /// Cells of the last query that no [`Value`] can hold: `(row, reason)`.
    unreadable: Vec<(usize, String)>,
    /// The backend's pid, once asked.
    pid: Option<u64>,
    setup: std::sync::Arc<Setup>,
    /// The pooling this session runs its statements for: the engine's when it was opened, or
    /// transaction pooling once that was noticed on it.
    mode: Pooling,
    /// A transaction this session opened is open.
    in_tx: bool,
}

impl PgConn {
    fn prepared(&mut self, sql: &str) -> Result<Statement, postgres::Error> {
        if let Some(st) = self.statements.get(sql) {
            return Ok(st.clone());
        }
        let st = self.session.client.prepare(sql)?;
        if self.statements.len() >= STMT_CACHE {
            // Dropping a statement closes it on the server.
            self.statements.clear();
        }
        self.statements.insert(sql.to_string(), st.clone());
        Ok(st)
    }

    fn pooled(&self) -> bool {
        self.mode == Pooling::Transaction
    }

    /// Session pooling, and a statement of ours missing on the server (or its name taken):
    /// the server session changed under this connection, as behind a transaction pooler the URL
    /// did not declare. The engine is used as if it were declared from now on. Outside a
    /// transaction of ours the statement did nothing: `Ok` means run it again unnamed (this
    /// session runs as in transaction pooling from now on). In one, the transaction is lost
    /// with the server session: a lost connection (the session is discarded).
    fn undeclared_pooler(&mut self, e: postgres::Error) -> Result<(), DbError> {
        self.setup.detect(&e);
        if self.in_tx {
            self.broken = true;
            return Err(DbError::new(
                DbErrorKind::ConnectionLost,
                UndeclaredPooler(PgError(e)),
            ));
        }
        self.mode = Pooling::Transaction;
        // Prepared on server sessions this connection no longer has: closed when dropped.
        self.statements.clear();
        Ok(())
    }

    fn execute_unnamed(&mut self, sql: &str, values: &[Value]) -> Result<u64, DbError> {
        // `query_typed` returns rows, not the count: a statement without `RETURNING` would
        // read 0 rows changed through the count of its rows.
        self.in_transaction(|c| {
            let typed: Vec<(&(dyn ToSql + Sync), Type)> = values
                .iter()
                .map(|v| (v as &(dyn ToSql + Sync), Type::UNKNOWN))
                .collect();
            let mut it = c.query_typed_raw(sql, typed)?;
            while postgres::fallible_iterator::FallibleIterator::next(&mut it)?.is_some() {}
            Ok(it.rows_affected().unwrap_or(0))
        })
        .map_err(|e| self.fail(e))
    }

    /// Transaction pooling: runs `f` in the open transaction, or in one of its own with the
    /// session settings made for it.
    fn in_transaction<T>(
        &mut self,
        f: impl FnOnce(&mut Client) -> Result<T, postgres::Error>,
    ) -> Result<T, postgres::Error> {
        if self.in_tx {
            return f(&mut self.session.client);
        }
        self.session
            .client
            .batch_execute(&begin_local(&self.setup))?;
        match f(&mut self.session.client) {
            Ok(v) => self.session.client.batch_execute("COMMIT").map(|()| v),
            Err(e) => {
                let _ = self.session.client.batch_execute("ROLLBACK");
                Err(e)
            }
        }
    }

    /// Transaction pooling: one statement, unnamed, its parameters as text the server types
    /// (a named statement would live on a server session the next transaction may not get).
    fn unnamed(
        &mut self,
        sql: &str,
        values: &[Value],
    ) -> Result<Vec<postgres::Row>, postgres::Error> {
        let typed: Vec<(&(dyn ToSql + Sync), Type)> = values
            .iter()
            .map(|v| (v as &(dyn ToSql + Sync), Type::UNKNOWN))
            .collect();
        self.in_transaction(|c| c.query_typed(sql, &typed))
    }

    fn fail(&mut self, e: postgres::Error) -> DbError {
        let e = self.session.error(e);
        if e.kind == DbErrorKind::ConnectionLost {
            self.broken = true;
        }
        e
    }
}

/// A driver error as ours, classified; a server that takes no writes is named as such.
fn db_error(e: postgres::Error, closed: bool) -> DbError {
    if refuses_writes(&e) {
        return DbError::refused_writes(PgError(e));
    }
    DbError::new(classify(&e, closed), PgError(e))
}

/// The server takes no writes: a read-only transaction (SQLSTATE 25006, which a standby and a
/// primary set read-only both give; the broker never asks for a read-only transaction), or a
/// command a standby refuses ("cannot execute .. during recovery").
fn refuses_writes(e: &postgres::Error) -> bool {
    e.as_db_error()
        .is_some_and(|db| refuses_writes_state(db.code(), db.message()))
}

fn refuses_writes_state(c: &SqlState, message: &str) -> bool {
    *c == SqlState::READ_ONLY_SQL_TRANSACTION || message.contains("during recovery")
}

/// A prepared statement of ours missing, or its name taken, on the server.
fn lost_statement(e: &postgres::Error) -> bool {
    e.code().is_some_and(|c| {
        *c == SqlState::INVALID_SQL_STATEMENT_NAME || *c == SqlState::DUPLICATE_PSTATEMENT
    })
}

/// A lost prepared statement, with its likely cause named.
#[derive(Debug)]
struct UndeclaredPooler(PgError);

impl std::fmt::Display for UndeclaredPooler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: the server session changed under this connection's transaction, as behind a \
             PgBouncer in transaction pooling; the broker uses it as such from now on (say \
             pool_mode=transaction in the URL to start so)",
            self.0
        )
    }
}

impl StdError for UndeclaredPooler {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(&self.0)
    }
}

/// A driver error whose message shows the server's own (`postgres::Error` shows only "db
/// error" and keeps the server's message in its source).
#[derive(Debug)]
pub(super) struct PgError(pub postgres::Error);

impl PgError {
    /// The text of a driver error, as [`PgError`] shows it.
    fn text(e: &postgres::Error) -> String {
        match e.as_db_error() {
            Some(db) => format!("{db} (SQLSTATE {})", db.code().code()),
            None => e.to_string(),
        }
    }
}

impl std::fmt::Display for PgError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0.as_db_error() {
            Some(db) => write!(f, "{db} (SQLSTATE {})", db.code().code()),
            None => {
                // The driver's own text names only the kind ("error performing TLS
                // handshake"); the reason is in its sources.
                self.0.fmt(f)?;
                let mut source = StdError::source(&self.0);
                while let Some(s) = source {
                    write!(f, ": {s}")?;
                    source = s.source();
                }
                Ok(())
            }
        }
    }
}

impl StdError for PgError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(&self.0)
    }
}

/// How a failed connection attempt should be treated: the server's refusal (authentication, an
/// unknown database) and a failed TLS handshake (a certificate that does not verify) will fail
/// the same way again; an unreachable or starting server, or one out of connections, may not.
fn classify_connect(e: &postgres::Error) -> DbErrorKind {
    if let Some(db) = e.as_db_error() {
        let code = db.code();
        // A pooler refusing a startup parameter refuses it at every attempt.
        if db.message().starts_with("unsupported startup parameter") {
            return DbErrorKind::Other;
        }
        return if *code == SqlState::CANNOT_CONNECT_NOW
            || *code == SqlState::TOO_MANY_CONNECTIONS
            || *code == SqlState::ADMIN_SHUTDOWN
            || code.code().starts_with("08")
        {
            DbErrorKind::ConnectionLost
        } else {
            DbErrorKind::Other
        };
    }
    // The socket failed: the driver's own I/O, or our connector's, which the driver reports
    // as a TLS error (`deadline.rs` asks for TLS itself: a server that closes the connection
    // before it answers the `SSLRequest` is gone, not refusing).
    if e.source().is_some_and(|s| s.is::<std::io::Error>()) {
        return DbErrorKind::ConnectionLost;
    }
    // The driver has no public error kind: its message names a TLS failure.
    if e.to_string().starts_with("error performing TLS handshake") {
        return DbErrorKind::Other;
    }
    DbErrorKind::ConnectionLost
}

fn classify(e: &postgres::Error, closed: bool) -> DbErrorKind {
    if closed || e.is_closed() {
        return DbErrorKind::ConnectionLost;
    }
    match e.as_db_error() {
        Some(db) => classify_state(db.code(), db.message()),
        // No SQLSTATE: an I/O error, or a value that did not convert.
        None if e.source().is_some_and(|s| s.is::<std::io::Error>()) => DbErrorKind::ConnectionLost,
        None => DbErrorKind::Other,
    }
}

/// How the server's error `c` (with its message) should be treated.
fn classify_state(c: &SqlState, message: &str) -> DbErrorKind {
    if refuses_writes_state(c, message) {
        return DbErrorKind::ConnectionLost;
    }
    match c {
        c if *c == SqlState::T_R_SERIALIZATION_FAILURE || *c == SqlState::T_R_DEADLOCK_DETECTED => {
            DbErrorKind::Transient
        }
        // `lock_timeout`, and `statement_timeout` (or a cancel): the statement was rolled back.
        c if *c == SqlState::LOCK_NOT_AVAILABLE || *c == SqlState::QUERY_CANCELED => {
            DbErrorKind::Transient
        }
        // The server ends the session: shutdown, crash, not yet accepting, an idle timeout (in
        // a transaction, or PostgreSQL 14's idle_session_timeout), its database dropped (also a
        // standby's recovery conflict with a dropped database).
        c if *c == SqlState::ADMIN_SHUTDOWN
            || *c == SqlState::CRASH_SHUTDOWN
            || *c == SqlState::CANNOT_CONNECT_NOW
            || *c == SqlState::IDLE_IN_TRANSACTION_SESSION_TIMEOUT
            || *c == SqlState::IDLE_SESSION_TIMEOUT
            || *c == SqlState::DATABASE_DROPPED
            || c.code().starts_with("08") =>
        {
            DbErrorKind::ConnectionLost
        }
        // Undefined column, a type the statement cannot compare or assign, undefined function
        // (an operator over a column of another type).
        c if *c == SqlState::UNDEFINED_COLUMN
            || *c == SqlState::DATATYPE_MISMATCH
            || *c == SqlState::UNDEFINED_FUNCTION =>
        {
            DbErrorKind::Schema
        }
        _ => DbErrorKind::Other,
    }
}

/// `BEGIN` with the session settings made for the transaction.
fn begin_local(setup: &Setup) -> String {
    if setup.set_local.is_empty() {
        "BEGIN".into()
    } else {
        format!("BEGIN; {}", setup.set_local)
    }
}

/// What a batch does to the transaction (transaction pooling tracks it).
#[derive(Debug, PartialEq, Eq)]
enum TxControl {
    Begin,
    End,
    Other,
}

fn tx_control(sql: &str) -> TxControl {
    let words: Vec<String> = sql
        .split_whitespace()
        .take(2)
        .map(|w| w.trim_end_matches(';').to_ascii_uppercase())
        .collect();
    match (
        words.first().map(String::as_str),
        words.get(1).map(String::as_str),
    ) {
        (Some("BEGIN"), _) | (Some("START"), Some("TRANSACTION")) => TxControl::Begin,
        (Some("ROLLBACK" | "ABORT"), Some("TO")) => TxControl::Other,
        (Some("COMMIT" | "END" | "ROLLBACK" | "ABORT"), _) => TxControl::End,
        _ => TxControl::Other,
    }
}

/// Rows as [`Value`]s. A column type no `Value` holds fails its cell, not the query: a claim
/// has already counted the row's attempt, and the row must reach a dead letter with the reason
/// rather than fail every claim for ever. Such cells read `NULL`; `unreadable` gets
/// `(row, reason)`.
fn decode(rows: Vec<postgres::Row>, unreadable: &mut Vec<(usize, String)>) -> Vec<Vec<Value>> {
    let mut out = Vec::with_capacity(rows.len());
    for (n, row) in rows.into_iter().enumerate() {
        let mut vals = Vec::with_capacity(row.len());
        for i in 0..row.len() {
            vals.push(row.try_get::<_, Value>(i).unwrap_or_else(|e| {
                let col = &row.columns()[i];
                unreadable.push((n, format!("column {} ({}): {e}", col.name(), col.type_())));
                Value::Null
            }));
        }
        out.push(vals);
    }
    out
}

/// The application's own transaction as a [`DbConn`], for the transactional publish. It is
/// never pooled: broken or not is the application's business.
pub(crate) struct TxConn<'a, 'b>(pub &'a mut postgres::Transaction<'b>);

fn wrap(e: postgres::Error) -> DbError {
    db_error(e, false)
}

impl DbConn for TxConn<'_, '_> {
    fn execute(&mut self, sql: &str, values: &[Value]) -> Result<u64, DbError> {
        self.0.execute(sql, &params(values)).map_err(wrap)
    }

    fn query(&mut self, sql: &str, values: &[Value]) -> Result<Vec<Vec<Value>>, DbError> {
        let rows = self.0.query(sql, &params(values)).map_err(wrap)?;
        Ok(decode(rows, &mut Vec::new()))
    }

    fn batch(&mut self, sql: &str) -> Result<(), DbError> {
        self.0.batch_execute(sql).map_err(wrap)
    }

    fn is_broken(&self) -> bool {
        false
    }

    fn set_broken(&mut self, _: bool) {}
}

fn params(values: &[Value]) -> Vec<&(dyn ToSql + Sync)> {
    values.iter().map(|v| v as &(dyn ToSql + Sync)).collect()
}

impl PgConn {
    /// The calls of [`DbConn`], unbounded: the trait's methods bound them.
    fn pid(&mut self) -> Option<u64> {
        if self.pooled() {
            // The server session changes with each transaction: its pid is ours to cancel only
            // while our transaction holds it (a row lock delivery's), asked afresh each time.
            if !self.in_tx {
                return None;
            }
            let rows = self
                .session
                .client
                .simple_query(super::sql::BACKEND_PID)
                .ok()?;
            return rows.iter().find_map(|m| match m {
                postgres::SimpleQueryMessage::Row(r) => r.get(0)?.parse().ok(),
                _ => None,
            });
        }
        if self.pid.is_none() {
            let row = self
                .session
                .client
                .query_one(super::sql::BACKEND_PID, &[])
                .ok()?;
            self.pid = u64::try_from(row.get::<_, i32>(0)).ok();
        }
        self.pid
    }

    fn run_execute(&mut self, sql: &str, values: &[Value]) -> Result<u64, DbError> {
        if self.pooled() {
            return self.execute_unnamed(sql, values);
        }
        let r = self
            .prepared(sql)
            .and_then(|st| self.session.client.execute(&st, &params(values)));
        match r {
            Err(e) if lost_statement(&e) => {
                self.undeclared_pooler(e)?;
                self.execute_unnamed(sql, values)
            }
            r => r.map_err(|e| self.fail(e)),
        }
    }

    fn run_query(&mut self, sql: &str, values: &[Value]) -> Result<Vec<Vec<Value>>, DbError> {
        let r = if self.pooled() {
            self.unnamed(sql, values)
        } else {
            match self
                .prepared(sql)
                .and_then(|st| self.session.client.query(&st, &params(values)))
            {
                Err(e) if lost_statement(&e) => {
                    self.undeclared_pooler(e)?;
                    self.unnamed(sql, values)
                }
                r => r,
            }
        };
        let rows = r.map_err(|e| self.fail(e))?;
        self.unreadable.clear();
        Ok(decode(rows, &mut self.unreadable))
    }

    fn run_batch(&mut self, sql: &str) -> Result<(), DbError> {
        if !self.pooled() {
            let r = self.session.client.batch_execute(sql);
            match tx_control(sql) {
                TxControl::Begin => self.in_tx = r.is_ok(),
                TxControl::End => self.in_tx = false,
                TxControl::Other => {}
            }
            return r.map_err(|e| self.fail(e));
        }
        let r = match tx_control(sql) {
            TxControl::Begin => {
                let r = self
                    .session
                    .client
                    .batch_execute(&format!("{sql}; {}", self.setup.set_local));
                self.in_tx = r.is_ok();
                r
            }
            TxControl::End => {
                self.in_tx = false;
                self.session.client.batch_execute(sql)
            }
            TxControl::Other if self.in_tx => self.session.client.batch_execute(sql),
            // One round trip: the simple protocol runs the whole text, and stops at an error
            // (the transaction is then rolled back).
            TxControl::Other => {
                let r = self
                    .session
                    .client
                    .batch_execute(&format!("{}; {sql}; COMMIT", begin_local(&self.setup)));
                if r.is_err() {
                    let _ = self.session.client.batch_execute("ROLLBACK");
                }
                r
            }
        };
        r.map_err(|e| self.fail(e))
    }
}

impl DbConn for PgConn {
    fn driver(&mut self) -> Option<&mut dyn std::any::Any> {
        Some(&mut self.session.client)
    }

    fn session_id(&mut self) -> Option<u64> {
        self.session.arm();
        let pid = self.pid();
        self.session.disarm();
        pid
    }

    fn execute(&mut self, sql: &str, values: &[Value]) -> Result<u64, DbError> {
        self.session.arm();
        let r = self.run_execute(sql, values);
        self.session.disarm();
        r
    }

    fn query(&mut self, sql: &str, values: &[Value]) -> Result<Vec<Vec<Value>>, DbError> {
        self.session.arm();
        let r = self.run_query(sql, values);
        self.session.disarm();
        r
    }

    fn batch(&mut self, sql: &str) -> Result<(), DbError> {
        self.session.arm();
        let r = self.run_batch(sql);
        self.session.disarm();
        r
    }

    fn is_broken(&self) -> bool {
        // A session opened for session pooling where transaction pooling was since noticed:
        // its statement cache and settings belong to server sessions it may not have.
        self.broken
            || self.session.client.is_closed()
            || (self.mode == Pooling::Session && self.setup.pooling() == Pooling::Transaction)
    }

    fn set_broken(&mut self, broken: bool) {
        self.broken = broken;
    }

    fn take_unreadable(&mut self) -> Vec<(usize, String)> {
        std::mem::take(&mut self.unreadable)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn startup_options_as_settings() {
        assert_eq!(
            settings("-c lock_timeout=5000 -cstatement_timeout=5000 --search-path=a,b"),
            [
                ("lock_timeout".to_string(), "5000".to_string()),
                ("statement_timeout".to_string(), "5000".to_string()),
                ("search_path".to_string(), "a,b".to_string())
            ]
        );
        assert!(settings("-x -c bad;name=1").is_empty());
        let setup = Setup::new(Pooling::Transaction, "-c lock_timeout=5000 -c a.b=it's");
        assert_eq!(setup.set, "SET lock_timeout = '5000'; SET a.b = 'it''s'");
        assert_eq!(
            begin_local(&setup),
            "BEGIN; SET LOCAL lock_timeout = '5000'; SET LOCAL a.b = 'it''s'"
        );
    }

    /// Issue 24 item 6: a server that takes no writes is a lost connection (transient, the
    /// session discarded), not a permanent error; other errors keep their kinds.
    #[test]
    fn a_server_that_takes_no_writes_is_a_lost_connection() {
        let read_only = "cannot execute INSERT in a read-only transaction";
        assert_eq!(
            classify_state(&SqlState::READ_ONLY_SQL_TRANSACTION, read_only),
            DbErrorKind::ConnectionLost
        );
        assert!(refuses_writes_state(
            &SqlState::READ_ONLY_SQL_TRANSACTION,
            read_only
        ));
        // A standby's refusals of commands it cannot run (PreventCommandDuringRecovery).
        let recovery = "cannot execute pg_notify() during recovery";
        assert!(refuses_writes_state(
            &SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE,
            recovery
        ));
        assert_eq!(
            classify_state(&SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE, recovery),
            DbErrorKind::ConnectionLost
        );
        for (c, kind) in [
            (SqlState::IDLE_SESSION_TIMEOUT, DbErrorKind::ConnectionLost),
            (SqlState::DATABASE_DROPPED, DbErrorKind::ConnectionLost),
            (SqlState::ADMIN_SHUTDOWN, DbErrorKind::ConnectionLost),
            // A recovery conflict cancels the statement: tried again, on the same session.
            (SqlState::T_R_SERIALIZATION_FAILURE, DbErrorKind::Transient),
            (SqlState::UNIQUE_VIOLATION, DbErrorKind::Other),
            (SqlState::UNDEFINED_COLUMN, DbErrorKind::Schema),
        ] {
            assert_eq!(classify_state(&c, "x"), kind, "{}", c.code());
            assert!(!refuses_writes_state(&c, "x"), "{}", c.code());
        }
        let e = DbError::refused_writes("cannot execute INSERT in a read-only transaction");
        assert!(e.is_refused_writes() && e.kind == DbErrorKind::ConnectionLost);
        assert!(e.during("publish", "jobs").is_transient());
        assert!(!DbError::new(DbErrorKind::ConnectionLost, "gone").is_refused_writes());
    }

    #[test]
    fn transaction_control_is_tracked() {
        assert_eq!(
            tx_control("BEGIN ISOLATION LEVEL READ COMMITTED"),
            TxControl::Begin
        );
        assert_eq!(tx_control("begin"), TxControl::Begin);
        assert_eq!(tx_control("START TRANSACTION"), TxControl::Begin);
        assert_eq!(tx_control("COMMIT"), TxControl::End);
        assert_eq!(tx_control("ROLLBACK"), TxControl::End);
        assert_eq!(
            tx_control("ROLLBACK TO SAVEPOINT sqlbroker_work"),
            TxControl::Other
        );
        assert_eq!(tx_control("SAVEPOINT sqlbroker_work"), TxControl::Other);
        assert_eq!(tx_control("SELECT 1"), TxControl::Other);
    }
}
