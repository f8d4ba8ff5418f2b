//! # sqlbroker
//!
//! Turns an ordinary SQL table into a job queue / message inbox for **synchronous,
//! thread-based** services, on PostgreSQL, MySQL 8.0.17+ / MariaDB 10.6+ and SQLite (embedded,
//! no server). Blocking API, no async runtime to manage.
//!
//! Producers [`publish`](Broker::publish) rows; a [`Subscription`] claims rows on its own
//! worker threads and hands them out as [`Delivery`]s through a blocking
//! [`next_delivery`](Subscription::next_delivery); the application settles each one
//! ([`ack`](Delivery::ack), [`retry`](Delivery::retry), [`retry_after`](Delivery::retry_after),
//! [`dead_letter`](Delivery::dead_letter), [`fail`](Delivery::fail)), or hands a closure to
//! [`Subscription::run`], which acks, or fails by the [`RetryPolicy`], on threads of its own.
//!
//! ```
//! use sqlbroker::{Broker, Message, Table};
//! use std::time::Duration;
//!
//! let broker = Broker::connect("sqlite::memory:")?;
//! let payments = Table::new("payments")
//!     .text_column("account")
//!     .advisory_lock("accounts-{account}"); // one row per account at a time
//! broker.create_table(&payments)?;
//! broker.publish(&payments, Message::new(b"{\"cents\":100}".to_vec()).set("account", "a-17"))?;
//!
//! let sub = broker.subscription(&payments).workers(4).start()?;
//! if let Some(d) = sub.next_delivery() {
//!     assert_eq!(d.attempt(), 1);
//!     assert_eq!(d.get("account").and_then(|v| v.as_str()), Some("a-17"));
//!     d.ack()?;
//! }
//! sub.shutdown(Duration::from_secs(5))?;
//! # Ok::<(), sqlbroker::BrokerError>(())
//! ```
//!
//! ## Forms: what holds a claimed row
//!
//! The [`Table`] description chooses the form:
//!
//! | form | chosen by | holds the row | a crash | attempt counted |
//! |---|---|---|---|---|
//! | row lock | nothing said | an open transaction, `FOR UPDATE SKIP LOCKED` | rolled back: row back at once | at settlement (a crash spends none) |
//! | lease | [`Table::lease`] | a deadline in `locked_until`, renewed every half lease | row back when the lease expires | at claim |
//! | advisory lock | [`Table::advisory_lock`] | a database advisory lock on the row's key | session ends: row back at once | when the row is taken |
//!
//! The first delivery of a row reads [`attempt`](Delivery::attempt) 1 in every form. A row
//! claimed ahead and handed back unhandled (by [`close`](Subscription::close),
//! [`shutdown`](Subscription::shutdown) or a dropped subscription) spends nothing. A delivery
//! dropped unsettled by a live process (a panicking handler) is a failed attempt in every form,
//! retried after the subscription's [`RetryPolicy`] delay (as [`Delivery::retry`],
//! [`Delivery::fail`], a handler's `Err` and a handler timeout: by default 1 s, doubling, at
//! most 10 minutes, jittered), so [`Table::max_attempts`] (25 unless the table says
//! otherwise) ends a poison row. A [`Subscription::run`] handler says what happened by
//! returning `Ok(())` or an [`Outcome`]: acked, dead-lettered, retried after a delay, or
//! cancelled. A crash of the
//! whole process spends nothing in the row lock form: work that may kill its process belongs
//! in the lease form, where the claim counts the attempt.
//!
//! ## Ordering and identity
//!
//! - [`Table::fifo`]: FIFO groups, one row of a group at a time in publish order, groups in
//!   parallel.
//! - [`Table::priorities`]: higher [`Message::priority`] first.
//! - [`Table::dedup`]: a [`Message::dedup_key`] held by an unfinished row makes no new row
//!   ([`BrokerError::Duplicate`]).
//!
//! ## Queues, job kinds and workers
//!
//! - [`Table::queues`]: named queues in one table ([`Message::queue`], [`Delivery::queue`]);
//!   [`SubscriptionBuilder::queues`] claims only some, through the queue's index;
//!   [`Broker::pause_queue`] stops every claim of one queue from its next statement;
//!   [`Broker::queue_stats`] counts by queue.
//! - [`Table::kinds`]: job kinds ([`Message::kind`], [`Delivery::kind`]); a [`Worker`] runs
//!   handlers by table and kind on one pool of threads, each table's claims taking only the
//!   kinds it handles; [`WorkerHandle::shutdown`] stops them all gracefully. With `serde`,
//!   `TypedJob` kinds publish and run decoded (`Message::job`, `Worker::job`).
//! - [`Broker::workers`]: the fleet, every running subscription and worker of every process on
//!   the database, from the heartbeats their brokers write ([`WorkerInfo`]: host, process,
//!   tables, queues and kinds, in work, handled, last seen).
//!
//! ## Flow control
//!
//! - [`Table::concurrency_limit`]: at most `max` rows of one rendered key in work at once
//!   (`""`: the whole table), across every broker and process, enforced by the database;
//!   changed at run time with [`Broker::set_concurrency_limit`], read with
//!   [`Broker::concurrency_limits`]; the rows a limit holds back are
//!   [`QueueStats::limited`].
//! - [`Table::rate_limit`]: at most `max` rows of one rendered key claimed in any window of
//!   length `per` (a sliding window, counting claims), across every broker and process,
//!   through window slots the database stamps; changed at run time with
//!   [`Broker::set_rate_limit`], read with [`Broker::rate_limits`]; the rows a full window
//!   holds back are [`QueueStats::limited`] too.
//! - [`Table::fair`]: claims rotate across the keys of the ready rows, a row of each key per
//!   round, so a tenant's backlog cannot starve the others.
//!
//! ## Composing jobs
//!
//! On a table described with [`Table::dependencies`], [`Message::after`] makes a job wait until
//! another is acked (one that fails or is cancelled dead-letters it), and
//! [`Message::after_settled`] until another has settled whatever its outcome (a batch's
//! callback, which reads each outcome with [`Delivery::waited_on`]); [`Message::after_in`] waits
//! on a job of another table of the database. A waiting job is released
//! in the very transaction that settles the last job it waits on. [`Broker::publish_group`]
//! publishes related jobs in one transaction; [`JobState::Waiting`], [`Job::waits_on`] and
//! [`QueueStats::waiting`] show them. [`Message::after_signal`] waits for the world: a job
//! released by [`Broker::signal`] (a latch), or past [`Message::wait_timeout`] without it; the
//! handler reads [`Delivery::signal`]. With [`Table::outputs`], [`Delivery::set_output`] records
//! what a job produced, written by the settlement that ends it and read by the jobs that waited
//! on it ([`Dependency::output`]) or from a kept row ([`Job::output`]); with
//! [`Table::checkpoints`], [`Delivery::checkpoint`] saves progress, committed and fenced by the
//! claim, and the next attempt resumes from [`Delivery::last_checkpoint`]. With
//! [`Table::traceparent`], a job carries the W3C trace context of its publish
//! ([`Message::traceparent`], [`Delivery::traceparent`], [`Job::traceparent`]; filled and
//! continued by the `opentelemetry` feature).
//!
//! Keys and group values compare byte for byte on every database (case, trailing spaces and
//! Unicode normalisation make different keys; MySQL's text columns use a binary NO PAD
//! collation), and values mean the same on each: a message is one message everywhere.
//!
//! ## Operating a queue
//!
//! [`Broker::create_table`] and [`Broker::migrate`] record a table's description in the
//! database; [`Broker::open_table`] reads it back by name in any process, and a description
//! that disagrees with the record is refused ([`BrokerError::Schema`]). [`Broker::job`] looks a
//! job up by id ([`Job`]: its [`JobState`], attempts, last error, values, times) and
//! [`Broker::jobs`] pages jobs by state ([`Broker::jobs_preview`]: a payload prefix each, no
//! probe, for listings; [`Broker::jobs_matching`]: only those a [`JobFilter`] matches, by
//! column value and error text); a failed attempt keeps its error text on the row.
//! [`Broker::cancel`] stops a job for good, [`Broker::run_now`] makes a scheduled one due,
//! [`Broker::update`] changes one no one works yet ([`JobUpdate`]; by dedup key,
//! [`Message::replace_waiting`]);
//! [`Broker::pause`] and [`Broker::resume`] stop and restart a table's claims in every
//! process. [`Broker::record_action`] and [`Broker::actions`] keep an operators' action log
//! in the database (the dashboard and the `sqlbroker` tool write every change they make there).
//!
//! ```
//! use sqlbroker::{Broker, JobState, Message, Table};
//! use std::time::Duration;
//!
//! let broker = Broker::connect("sqlite::memory:")?;
//! broker.create_table(&Table::new("mails").lease(Duration::from_secs(30)))?;
//! let mails = broker.open_table("mails")?; // as recorded: the lease form
//! let id = broker.publish(&mails, Message::new(b"hi".to_vec()))?;
//! assert_eq!(broker.job(&mails, id)?.map(|j| j.state()), Some(JobState::Ready));
//! assert!(broker.cancel(&mails, id)?); // queued: removed, never runs
//! assert!(broker.job(&mails, id)?.is_none());
//! # Ok::<(), sqlbroker::BrokerError>(())
//! ```
//!
//! [`Broker::stats`] counts a table's rows by state in one statement ([`QueueStats`]: ready,
//! scheduled, in flight where the form marks it, dead, the oldest ready row's age).
//! [`Broker::dead_letters_after`] pages dead letters by id; [`Broker::requeue_dead`],
//! [`Broker::purge_dead`], [`Broker::requeue_all_dead`] and [`Broker::purge_all_dead`] put
//! them back or delete them, by id or all (in batches of 1,000 rows). A table described with
//! [`Table::keep_completed`] keeps acked rows with their completion time:
//! [`Broker::completed_after`] lists them, and the database's elected maintainer deletes those
//! past the retention by itself ([`BrokerBuilder::maintenance`], on by default:
//! [`Broker::maintainer`] says which process holds it), as it deletes the dead letters past
//! [`Table::keep_dead`] and the action log's old entries; [`Broker::prune_completed`] prunes
//! now. The `sqlbroker` command line tool (cargo feature `cli`) does the same from a
//! shell, naming a table alone: `status` (every recorded table), `job`, `cancel`, `pause`,
//! `resume`, `dead list | requeue | purge`, `completed list | prune`, `create-table`,
//! `migrate`, `publish`, `schema`.
//!
//! ## Schema under the application's migrations
//!
//! [`Table::ddl`] returns the statements [`Broker::create_table`] runs (table, indexes, the
//! registry table and the description's record) for a [`Database`], with no connection;
//! [`Broker::migration_sql`] is a dry run of [`Broker::migrate`]. A migration tool keeps them
//! (`sqlbroker schema` prints them as a script), and a broker built with
//! [`BrokerBuilder::manage_schema(false)`](BrokerBuilder::manage_schema) runs no DDL: its
//! `create_table` and `migrate` are [`BrokerError::DdlRefused`], and a database user with
//! `SELECT, INSERT, UPDATE, DELETE` on the tables and `sqlbroker_tables` is enough.
//!
//! ## Periodic jobs
//!
//! `Broker::periodic` (feature `cron`) publishes a message on a cron schedule, computed in
//! UTC, once per tick however many processes run it: the tick is in each row's dedup key (the
//! table needs [`Table::dedup`]), and each tick's row is published ahead, when the tick before
//! it falls due, so no process can publish a tick whose row was already worked. After a pause
//! at most one missed tick is published late (`PeriodicBuilder::catch_up`); the others are
//! skipped, never a storm.
//!
//! ```
//! # #[cfg(feature = "cron")]
//! # {
//! use sqlbroker::{Broker, Message, Table};
//! use std::time::Duration;
//!
//! let broker = Broker::connect("sqlite::memory:")?;
//! let cleanups = Table::new("cleanups").dedup().lease(Duration::from_secs(30));
//! broker.create_table(&cleanups)?;
//! // Five fields: 03:00 UTC every day; six fields put seconds first ("*/10 * * * * *").
//! let nightly = broker
//!     .periodic(&cleanups, "0 3 * * *", |_tick| Message::new(b"clean up".to_vec()))
//!     .name("nightly-cleanup")
//!     .start()?; // runs until `nightly` is dropped or stopped
//! assert!(nightly.is_running());
//! nightly.stop();
//! # }
//! # Ok::<(), sqlbroker::BrokerError>(())
//! ```
//!
//! ## Inside the application's own transactions
//!
//! [`postgres::publish`], [`mysql::publish`] and [`sqlite::publish`] (each with a
//! `publish_batch`) enqueue inside the application's own driver transaction: the job exists
//! if and only if it commits. [`postgres::in_delivery`] and [`mysql::in_delivery`] run the
//! handler's own SQL inside a row lock delivery's transaction: it commits with the ack; a retry,
//! a dead letter, a drop or a crash undoes it.
//!
//! ## Handler timeouts
//!
//! [`SubscriptionBuilder::handler_timeout`] bounds how long a handler may hold a delivery:
//! past it, the delivery is failed by the retry policy while the handler still runs (lease: the
//! lease is cleared; advisory: the key is let go; row lock: the handler's SQL is rolled back and
//! a statement it runs is cancelled on the server), and the handler is told
//! ([`Delivery::timed_out`], [`BrokerError::HandlerTimeout`] from its settlement).
//!
//! ```
//! use sqlbroker::{Broker, Message, Table};
//! use std::time::Duration;
//!
//! let broker = Broker::connect("sqlite::memory:")?;
//! let jobs = Table::new("jobs").lease(Duration::from_secs(30));
//! broker.create_table(&jobs)?;
//! broker.publish(&jobs, Message::new(b"slow".to_vec()))?;
//! let sub = broker
//!     .subscription(&jobs)
//!     .handler_timeout(Duration::from_millis(200))
//!     .start()?;
//! let d = sub.next_delivery().unwrap();
//! std::thread::sleep(Duration::from_millis(600)); // a handler that takes too long
//! assert!(d.timed_out());
//! assert!(d.ack().unwrap_err().is_handler_timeout());
//! # Ok::<(), sqlbroker::BrokerError>(())
//! ```
//!
//! ## Connecting and TLS
//!
//! [`Broker::connect`] makes one connection before it returns: a refused login, a certificate
//! that does not verify or a server that is not there is [`BrokerError::Connect`] at once,
//! with the server's or the TLS library's reason. TLS is spelled in the URL as each ecosystem
//! spells it (feature `tls`):
//!
//! - PostgreSQL: libpq's `sslmode=disable|prefer|require|verify-ca|verify-full` (default
//!   `prefer`) and `sslrootcert=<file>|system` (without it, `verify-*` trust the Mozilla roots
//!   of `webpki-roots`); e.g.
//!   `postgres://app@db.example.com/jobs?sslmode=verify-full&sslrootcert=/etc/ssl/db-ca.pem`.
//! - MySQL/MariaDB: the `mysql` crate's URL options (`root_cert_path`,
//!   `danger_skip_domain_validation`, `danger_accept_invalid_certs`, `cert_chain_path` and
//!   `priv_key_path`), plus the MySQL client's
//!   `ssl-mode=DISABLED|PREFERRED|REQUIRED|VERIFY_CA|VERIFY_IDENTITY`; e.g.
//!   `mysql://app:pw@db.example.com/jobs?ssl-mode=VERIFY_IDENTITY&root_cert_path=/etc/ssl/db-ca.pem`.
//!
//! ## Cargo features
//!
//! | feature | default | what |
//! |---|---|---|
//! | `postgres` | on | PostgreSQL (`postgres` crate) and [`postgres`] module |
//! | `mysql` | on | MySQL 8.0.17+ / MariaDB 10.6+ (`mysql` crate) and [`mysql`] module |
//! | `sqlite` | on | SQLite, bundled (`rusqlite`) and [`sqlite`] module |
//! | `tls` | on | TLS to the servers through rustls with the ring provider: no OpenSSL to install, the same checks on every platform |
//! | `serde` | off | typed jobs: `Message::json(&value)` and `Delivery::json::<T>()` (JSON through `serde_json`); a payload that does not decode is [`BrokerError::Decode`] and the delivery keeps its row |
//! | `cli` | off | the `sqlbroker` command line tool (`clap`): `status`, `job`, `cancel`, `pause`, `resume`, `dead list \| requeue \| purge`, `completed list \| prune`, `create-table`, `migrate`, `schema`, `publish`; no library API |
//! | `dashboard` | off | `sqlbroker dashboard` (implies `cli`): a web dashboard of the tables (counts, jobs by state, dead letters, actions) and a Prometheus `/metrics` page, on a small bounded HTTP server (`mio` polling, `httparse`, `maud`; no async runtime); no library API |
//! | `tracing` | off | `tracing` spans: `sqlbroker.delivery` (table, id, attempt) around each handler [`Subscription::run`] calls, `sqlbroker.publish` around each publish (both with OpenTelemetry's messaging attributes and span names, `process <table>` and `send <table>`), `sqlbroker.claim` and `sqlbroker.settle` (debug level) |
//! | `opentelemetry` | off | trace context across the queue (implies `tracing`; `opentelemetry` 0.33 API, `tracing-opentelemetry` 0.34, none of their types in this API): on a table with [`Table::traceparent`], a publish fills the row's W3C `traceparent` from its span, and the handler span of [`Subscription::run`] continues the trace (parent and link); README: "Tracing across the queue" |
//! | `cron` | off | periodic jobs: `Broker::periodic` with cron expressions (`croner`, UTC) |
//! | `diesel` | off | publishing inside the application's own Diesel transaction: `sqlbroker::diesel` module; `diesel-postgres`, `diesel-mysql`, `diesel-sqlite` one backend each (the first two link libpq and libmysqlclient) |
//! | `testing` | off | `sqlbroker::testing`, helpers for the application's own tests (turn it on in the dev-dependencies): `testing::drain` runs a table's due jobs on the calling thread with [`Subscription::run`]'s outcome rules, `testing::drain_all` also those scheduled or retried for later without waiting their backoff (still bounded by `max_attempts`), `testing::assert_published` / `assert_not_published` check what was published |
//! | `metrics` | off | counters, histograms and a gauge per table through the `metrics` facade ([Metrics](#metrics)); no library API |
//!
//! `tls` is on by default because most managed databases demand TLS and a URL that asks for it
//! should just work; it costs a build of ring (a C compiler, as the bundled SQLite already
//! needs). Without it, `sslmode=prefer` connects in plain text and a URL that demands TLS is
//! refused with [`BrokerError::InvalidUrl`].
//!
//! ## Observability
//!
//! - [`Events`] (on [`SubscriptionBuilder::events`]): a hook per claim, failed claim, ack,
//!   retry, dead letter, cancel and lost lease, with the handler's time and the database's, to feed
//!   Prometheus or OpenTelemetry.
//! - The `metrics` feature: the same, counted per table with no wiring ([Metrics](#metrics)).
//! - The `tracing` feature: spans per publish and per handled delivery, named and attributed by
//!   OpenTelemetry's messaging conventions; with `opentelemetry`, one trace across the queue.
//! - [`Subscription::last_error`]: the last claim or renewal error, typed;
//!   [`Subscription::claiming`] and [`Subscription::in_flight`].
//! - Logging through `log` (no logger is installed by the library). What each level says:
//!   - `error`: a thread of ours panicked (a renewal round, a timer task, a grouped
//!     settlement) or a runner thread could not start;
//!   - `warn`: what the library handled but the application should hear of: a claim that
//!     keeps failing, a renewal that failed or found no connection, a row dead-lettered at
//!     claim (past `max_attempts`, or unreadable), a handler past its timeout, a delivery
//!     dropped unsettled whose failure could not be written, an advisory unlock that failed
//!     (the session is discarded), a settlement error in the runner;
//!   - `info`: a connection that went on without TLS under `sslmode=prefer`;
//!   - `debug`: routine events: a deadlock or lock timeout retried, a lease not renewed this
//!     round, a statement tried again on a new connection.
//!
//! ## Metrics
//!
//! With the `metrics` feature, every broker and subscription reports through the
//! [`metrics`](https://docs.rs/metrics/0.24) crate's facade, with no wiring: the application
//! installs the recorder of its choice (`metrics-exporter-prometheus`, StatsD, OpenTelemetry,
//! ...); the library installs none, and without a recorder each report is a no-op. Each
//! table's handles are resolved once, when a broker first uses the table (its first publish or
//! subscription), so install the recorder before that; the hot path then adds to a handle (no
//! label formatting, no lookup). Without the feature nothing of it is compiled in. The names
//! follow Prometheus's conventions (base units, `_total` counters), every one labelled with the
//! `table`; the facade's types stay out of this crate's API.
//!
//! | name | type | labels | meaning |
//! |---|---|---|---|
//! | `sqlbroker_jobs_published_total` | counter | `table` | rows written by `publish`, `publish_batch` and the transactional publishes (counted when written: one inside a transaction that then rolls back still counts) |
//! | `sqlbroker_jobs_claimed_total` | counter | `table` | rows claimed (those dead-lettered at claim too) |
//! | `sqlbroker_jobs_acked_total` | counter | `table` | deliveries acked |
//! | `sqlbroker_jobs_retried_total` | counter | `table` | deliveries put back for another attempt: `retry`, `retry_after`, and failed attempts that were not the last |
//! | `sqlbroker_jobs_failed_total` | counter | `table` | failed attempts: `fail`, a handler's `Err` or panic in `run`, a delivery dropped unsettled, a handler timeout (each also counted as retried or dead-lettered) |
//! | `sqlbroker_jobs_dead_lettered_total` | counter | `table` | dead letters: `dead_letter`, a last attempt that failed, a row dead-lettered at claim |
//! | `sqlbroker_jobs_cancelled_total` | counter | `table` | deliveries cancelled (`cancel`, `Outcome::Cancel`) |
//! | `sqlbroker_leases_lost_total` | counter | `table` | lease settlements that found the lease gone (`LeaseLost`: nothing changed) |
//! | `sqlbroker_handler_timeouts_total` | counter | `table` | deliveries failed by the subscription's handler timeout |
//! | `sqlbroker_claim_errors_total` | counter | `table` | claims that failed (the worker tries again with a backoff) |
//! | `sqlbroker_settle_errors_total` | counter | `table` | settlements that failed otherwise (database or pool errors) |
//! | `sqlbroker_pruned_total` | counter | `table`, `what` | rows the elected maintainer deleted past their retention (`what`: `completed`, `dead`, `actions`; the action log's table is `sqlbroker_actions`) |
//! | `sqlbroker_handler_duration_seconds` | histogram | `table` | from handing a delivery out to its settlement, for each settled delivery a handler had |
//! | `sqlbroker_claim_duration_seconds` | histogram | `table` | each claim's time on the database (claims that found nothing included; failed ones are counted above instead) |
//! | `sqlbroker_settle_duration_seconds` | histogram | `table` | each settlement's time on the database (an `ack_all` of lease rows: once per statement) |
//! | `sqlbroker_queue_wait_seconds` | histogram | `table` | from a row's due time to its claim, per claimed row: how long ready work waited (due times are whole seconds, so a row claimed at once reads 0 to 1 s) |
//! | `sqlbroker_jobs_in_flight` | gauge | `table` | rows this process claimed and has not settled or handed back yet (waiting for a handler or in one) |
//! | `sqlbroker_stuck_handlers` | gauge | `table` | handlers reported stuck (`SubscriptionBuilder::stuck_after`) whose deliveries are still alive |
//!
//! ## Support matrix
//!
//! | | PostgreSQL 9.5+ (advisory: 11+) | MySQL 8.0.17+ / MariaDB 10.6+ | SQLite |
//! |---|---|---|---|
//! | row lock | `FOR UPDATE SKIP LOCKED` | `FOR UPDATE SKIP LOCKED`, `READ COMMITTED` | refused: [`BrokerError::Unsupported`] |
//! | lease | one statement: locking CTE + `UPDATE .. RETURNING` | locking select, then one update of the found rows, one transaction | one `UPDATE .. RETURNING` |
//! | advisory | `pg_try_advisory_lock(hashtextextended(key, 0))` | `GET_LOCK(name, 0)` | keys kept in the process |
//! | FIFO groups ([`Table::fifo`]) | row lock, lease: a transaction-scoped advisory lock on the group; advisory: the group's key held with the delivery | row lock, lease: the group's rows locked `NOWAIT`; advisory: the group's `GET_LOCK` held with the delivery | lease: one writer at a time; advisory: the group's key in the process |
//! | concurrency limits ([`Table::concurrency_limit`]) | lease: counted in turn under the table's record; row lock: transaction-scoped slot keys; advisory: slot keys | lease: counted in turn; row lock, advisory: `GET_LOCK` slot keys | lease: counted by the one writer; advisory: slot keys in the process |
//! | rate limits ([`Table::rate_limit`]) | window slots in `<table>_rates`, stamped by a fenced update | the same | the same |
//! | fair claims ([`Table::fair`]) | a `WITH RECURSIVE` skip through the key's index | the same (MySQL 8.0.1+, MariaDB 10.2+) | the same |
//!
//! A server below the floor stops [`start`](SubscriptionBuilder::start) with
//! [`BrokerError::ServerTooOld`].
//!
//! On a MariaDB Galera cluster (detected at [`BrokerBuilder::build`]) the lease form holds with
//! brokers on different nodes (claims of one row conflict at commit, and the loser retries);
//! row locks, `GET_LOCK` keys and the FIFO group guard are node-local, so the row lock form,
//! the advisory lock form, FIFO groups and concurrency limits are refused with
//! [`BrokerError::ClusterUnsafe`]
//! unless every broker writes through one node
//! ([`BrokerBuilder::galera_single_writer`]).
//!
//! ## Guarantees
//!
//! - At-least-once: a row is delivered again if its handler's process dies, its delivery is
//!   dropped unsettled, or (lease) its lease expires. An `ack` whose connection is lost may have
//!   committed before the answer was lost (the error is then
//!   [`DbErrorKind::ConnectionLost`]): a handler whose effect must happen once makes it
//!   idempotent, e.g. keyed by [`Delivery::id`].
//! - Every wait is bounded: statements by
//!   [`BrokerBuilder::statement_timeout`] on the server, every round trip on the client's side
//!   by [`BrokerBuilder::round_trip_timeout`] (a server that accepts and never answers fails
//!   the call, and the session is discarded), connections by the pool's timeout, and
//!   [`Subscription::shutdown`] by its grace plus one statement timeout;
//!   [`Subscription::next_delivery_timeout`] and [`Subscription::next_batch`] return within
//!   their timeout plus a few milliseconds even while another session holds a lock their claim
//!   would wait on (see [`Subscription::next_batch`]).
//! - Concurrent claimers, in one process or many, never hold the same row at once (SQLite
//!   advisory: within one process only).
//! - Lease settlements are fenced by the token: a late settlement after the lease was lost
//!   returns [`BrokerError::LeaseLost`] and changes nothing.
//! - Delivery order is priority ([`Table::priorities`]), then due time, then id, per claim; it
//!   is not a FIFO across workers, except within a FIFO group ([`Table::fifo`]): one row at a
//!   time, in publish order.
//!   Tables without priorities or FIFO groups claim from a cursor past the last row claimed
//!   (PostgreSQL in every form, MySQL/MariaDB in the row lock and lease forms), so a long
//!   backlog's dead index entries are not walked by every claim: a row that becomes claimable
//!   behind it (an expired lease, a row handed back) is claimed by the next pass from the
//!   head, within about a second while claims run (longer only while a walk from the head
//!   takes over a tenth of a second: then ten times that walk).
//! - A publish wakes idle claim workers at once, at most as many as it made rows: on its own
//!   broker always; on other brokers and processes through PostgreSQL `LISTEN/NOTIFY` (one
//!   dedicated session per broker, reconnected with backoff; a reconnection wakes every
//!   worker) and a SQLite file's change probe (`PRAGMA data_version`). MySQL/MariaDB cannot
//!   notify: an idle worker polls every 2 ms for 50 ms once rows were found, then after
//!   5 ms, doubling up to
//!   [`poll_interval`](SubscriptionBuilder::poll_interval). Every subscription still polls at
//!   that interval, so rows inserted by other tools with plain SQL are found.
//!
//! ## Caveats
//!
//! - PostgreSQL advisory locks belong to the session: the advisory form needs a direct
//!   connection or a session-mode pooler; behind PgBouncer's transaction pooling
//!   (`pool_mode=transaction` in the URL) it is refused, and the change feed needs
//!   [`BrokerBuilder::listen_url`] (a direct URL) or `cross_process_wake(false)`.
//! - PostgreSQL failover: give every host with `target_session_attrs=read-write`
//!   (`postgres://app@db1,db2/jobs?target_session_attrs=read-write`, or the key-value form
//!   `host=db1,db2 port=5432,5432 ..`); sessions go to the writable host, and follow a promoted
//!   standby by themselves.
//! - SQLite keeps advisory keys in the process: two processes on one database file do not see
//!   each other's keys, so a row may then be delivered twice.
//! - An advisory claim reads at most 10,000 ready rows: rows of a free key queued behind more
//!   than that many rows of keys in work wait until some of those settle.
//! - Times (due times, lease deadlines) are whole seconds from the host's clock.
//! - TLS defaults follow each driver: a PostgreSQL URL without `sslmode` encrypts when the
//!   server offers TLS but checks no certificate (libpq's `prefer`); a MySQL URL without TLS
//!   options is plain text. Say `sslmode=verify-full` / `ssl-mode=VERIFY_IDENTITY` to be sure
//!   of the server.
//! - The row lock form holds a connection and an open transaction per in-flight delivery; on
//!   PostgreSQL a long one holds back vacuum.

#![forbid(unsafe_code)]
#![warn(missing_docs)]
// docs.rs (nightly, `--cfg docsrs`): label each feature-gated item with the feature it needs.
#![cfg_attr(docsrs, feature(doc_cfg))]

// The README's code blocks compile (and run, unless marked) as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

// The rooms, from the top floor down (ARCHITECTURE.md): the public driver seams, the typed
// jobs and the test helpers; the operator's calls; producing and consuming; the broker handle; the runtime; the
// dialects; the model. A room uses only rooms below it.
#[cfg(any(
    feature = "diesel-postgres",
    feature = "diesel-mysql",
    feature = "diesel-sqlite"
))]
#[cfg_attr(
    docsrs,
    doc(cfg(any(
        feature = "diesel-postgres",
        feature = "diesel-mysql",
        feature = "diesel-sqlite"
    )))
)]
pub mod diesel;
#[cfg(feature = "serde")]
mod json;
#[cfg(feature = "serde")]
pub use json::TypedJob;
#[cfg(feature = "mysql")]
pub mod mysql;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "sqlite")]
pub mod sqlite;
#[cfg(feature = "testing")]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub mod testing;

mod operating;
#[cfg(test)]
mod races;

mod consuming;
mod producing;

mod broker;

mod runtime;

mod dialect;

mod error;
mod model;

pub use broker::{Broker, BrokerBuilder};
pub use consuming::delivery::Delivery;
pub use consuming::health::Health;
pub use consuming::outcome::{Outcome, Ran};
pub use consuming::subscription::{AckMode, Iter, Subscription, SubscriptionBuilder};
pub use consuming::worker::{Worker, WorkerHandle, WorkerRan, MAX_WORKER_THREADS};
pub use error::{
    BrokerError, DbErrorKind, NextError, Result, CHECKPOINT_MAX, LAST_ERROR_MAX, LEASE_RAN_OUT,
    OUTPUT_MAX,
};
pub use model::collect::{COLLECT_KEY_MAX, COLLECT_MAX_BYTES, COLLECT_MAX_EVENTS};
pub use model::retry::RetryPolicy;
pub use model::table::{ColumnType, Form, Isolation, Role, Table, DEFAULT_QUEUE, MAX_NAME_LEN};
pub use model::value::Value;
pub use model::waits::{Dependency, JobOutcome, Signal, SignalWait, WaitingSignal};
pub use operating::actions::{ActionEntry, ACTION_TEXT_MAX};
pub use operating::ddl::Database;
pub use operating::fleet::{WorkerInfo, WorkerTable};
pub use operating::jobs::{Job, JobState};
pub use operating::maintenance::Maintainer;
#[allow(deprecated)]
pub use operating::matching::CancelPass;
pub use operating::matching::{
    BulkOutcome, BulkPass, JobFilter, SkipReason, MAX_BULK_BATCH, MAX_FILTER_TEXT,
};
pub use operating::ops::{Completed, DeadLetter, QueueStats};
pub use operating::periodics::{PeriodicInfo, ORPHANED_AFTER};
pub use operating::tables::{ConcurrencyLimit, RateLimit, RecordedTable};
pub use operating::update::JobUpdate;
pub use producing::group::Group;
pub use producing::message::Message;
#[cfg(feature = "cron")]
pub use producing::periodic::{Periodic, PeriodicBuilder};
pub use producing::publish::Published;
pub use runtime::events::{AckFailed, ClaimFailed, ClaimedRows, Events, Settled, Stuck};
