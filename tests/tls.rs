//! TLS against the live servers, and connections that fail at once with the server's reason.
//!
//! PostgreSQL runs with `ssl = on` and Debian's snakeoil certificate (self-signed, DNS name
//! `localhost`); MariaDB with a certificate for `localhost` signed by a test CA that `.ci/run`
//! makes in `/etc/mysql/sqlbroker-tls/`. Whether a session is encrypted is read on the very
//! session a delivery holds (row lock form: `in_delivery` runs on the delivery's connection):
//! `pg_stat_ssl` on PostgreSQL, `Ssl_cipher` on MariaDB. Each check has a plain-text control
//! that reads the other answer, so the check can tell the two apart.
#![cfg(feature = "tls")]

mod common;

use std::time::{Duration, Instant};

use common::{with_params, Db};
use sqlbroker::{Broker, BrokerError, DbErrorKind, Form};

/// Longest a failing `build` may take: well under the pool timeout the tests set.
const FAST: Duration = Duration::from_secs(5);
/// The pool timeout of every broker here: a failure that waited for it would show.
const POOL_TIMEOUT: Duration = Duration::from_secs(30);

fn build(url: &str) -> (Result<Broker, BrokerError>, Duration) {
    let started = Instant::now();
    let r = Broker::builder(url)
        .connection_timeout(POOL_TIMEOUT)
        .build();
    (r, started.elapsed())
}

/// `build` must fail fast with a `Connect` error whose text contains every one of `words`.
fn fails_fast(url: &str, kind: DbErrorKind, words: &[&str]) -> String {
    let (r, took) = build(url);
    let e = match r {
        Err(e) => e,
        Ok(_) => panic!("{url}: connected"),
    };
    assert!(took < FAST, "{url}: failed only after {took:?}: {e}");
    let text = e.to_string();
    match &e {
        BrokerError::Connect { kind: k, .. } => assert_eq!(*k, kind, "{text}"),
        other => panic!("{url}: expected a Connect error, got {other:?}"),
    }
    assert_eq!(e.is_transient(), kind != DbErrorKind::Other, "{text}");
    for w in words {
        assert!(text.contains(w), "{url}: {text:?} does not say {w:?}");
    }
    text
}

/// Publishes a job through `url`'s broker on a row lock table of `live` and asks, on the
/// session its delivery holds, whether it is encrypted.
fn roundtrip_encrypted(live: &common::Live, url: &str) -> bool {
    let t = live.table(Form::RowLock, Duration::from_secs(30));
    let broker = Broker::builder(url)
        .connection_timeout(POOL_TIMEOUT)
        .build()
        .unwrap_or_else(|e| panic!("{url}: {e}"));
    broker.publish(&t, common::msg("secret", "k")).unwrap();
    let sub = broker.subscription(&t).workers(1).start().unwrap();
    let mut d = common::next(&sub, Duration::from_secs(10));
    assert_eq!(d.payload(), b"secret");
    let encrypted = match live.db {
        Db::Postgres => sqlbroker::postgres::in_delivery(&mut d, |c| {
            c.query_one(
                "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
                &[],
            )
            .map(|row| row.get::<_, bool>(0))
        })
        .unwrap()
        .unwrap(),
        Db::Mysql => {
            use mysql::prelude::Queryable;
            let cipher = sqlbroker::mysql::in_delivery(&mut d, |c| {
                c.query_first::<(String, String), _>("SHOW SESSION STATUS LIKE 'Ssl_cipher'")
            })
            .unwrap()
            .unwrap()
            .expect("an Ssl_cipher row");
            !cipher.1.is_empty()
        }
        Db::Sqlite => unreachable!(),
    };
    d.ack().unwrap();
    sub.shutdown(Duration::from_secs(5)).unwrap();
    assert_eq!(live.rows(&t), 0, "the ack went through");
    encrypted
}

// ---- PostgreSQL ------------------------------------------------------------------------------

#[test]
fn postgres_require_and_the_default_encrypt_and_disable_does_not() {
    let Some(live) = common::live(Db::Postgres) else {
        return;
    };
    assert!(
        roundtrip_encrypted(&live, &with_params(&live.url, "sslmode=require")),
        "sslmode=require ran a job on a session pg_stat_ssl calls unencrypted"
    );
    // libpq's default is `prefer`: TLS, since this server offers it.
    assert!(
        roundtrip_encrypted(&live, &live.url),
        "the default (prefer) did not encrypt"
    );
    // The control: the same check reads false on a plain session.
    assert!(!roundtrip_encrypted(
        &live,
        &with_params(&live.url, "sslmode=disable")
    ));
}

#[test]
fn postgres_verify_ca_with_the_servers_root() {
    let (Some(live), Some(root)) = (common::live(Db::Postgres), common::pg_root_cert()) else {
        return;
    };
    let url = with_params(&live.url, &format!("sslmode=verify-ca&sslrootcert={root}"));
    // 127.0.0.1 is not the certificate's name: verify-ca does not check it.
    assert!(roundtrip_encrypted(&live, &url));
}

#[test]
fn postgres_verify_ca_with_a_wrong_root_fails_fast_naming_the_certificate() {
    let Some(live) = common::live(Db::Postgres) else {
        return;
    };
    let url = with_params(
        &live.url,
        &format!("sslmode=verify-ca&sslrootcert={}", common::other_ca()),
    );
    fails_fast(
        &url,
        DbErrorKind::Other,
        &["TLS", "invalid peer certificate", "UnknownIssuer"],
    );
    // `require` with a root file verifies the chain too, as libpq does.
    let url = with_params(
        &live.url,
        &format!("sslmode=require&sslrootcert={}", common::other_ca()),
    );
    fails_fast(&url, DbErrorKind::Other, &["UnknownIssuer"]);
    // Built-in (Mozilla) roots do not include a self-signed test certificate either.
    fails_fast(
        &with_params(&live.url, "sslmode=verify-ca"),
        DbErrorKind::Other,
        &["UnknownIssuer"],
    );
}

#[test]
fn postgres_verify_full_checks_the_host_name() {
    let (Some(live), Some(root)) = (common::live(Db::Postgres), common::pg_root_cert()) else {
        return;
    };
    let params = format!("sslmode=verify-full&sslrootcert={root}");
    // The snakeoil certificate names `localhost` only: an IP address host is a mismatch.
    assert!(
        live.url.contains("@127.0.0.1"),
        "the test expects an IP host: {}",
        live.url
    );
    fails_fast(
        &with_params(&live.url, &params),
        DbErrorKind::Other,
        &["not valid for name", "127.0.0.1", "localhost"],
    );
    let by_name = live.url.replacen("@127.0.0.1", "@localhost", 1);
    assert!(roundtrip_encrypted(&live, &with_params(&by_name, &params)));
}

#[test]
fn postgres_prefer_goes_plain_where_the_server_has_no_tls_and_require_fails_fast() {
    let Some(live) = common::live(Db::Postgres) else {
        return;
    };
    // The server offers no TLS on its Unix socket. Missing: a failure with
    // SQLBROKER_REQUIRE_SERVERS=1 (tried with a directory that has none), else a loud skip.
    let dir = "/var/run/postgresql";
    let socket_file = format!("{dir}/.s.PGSQL.5432");
    if !std::path::Path::new(&socket_file).exists() {
        common::unmet(&format!("the PostgreSQL socket {socket_file} is missing"));
        return;
    }
    let socket = "postgres://postgres@%2Fvar%2Frun%2Fpostgresql/test";
    assert!(!roundtrip_encrypted(
        &live,
        &with_params(socket, "sslmode=prefer")
    ));
    fails_fast(
        &with_params(socket, "sslmode=require"),
        DbErrorKind::Other,
        &["server does not support TLS"],
    );
}

/// A PostgreSQL server of ours on TCP, for `sessions` connections: it reads the first message
/// and, if it is an `SSLRequest`, answers `answer` (nothing: it closes at once); after an `N`
/// it reads the next message (the startup packet, plain text) and sends on `seen` its
/// protocol version, then closes.
fn fake_postgres(
    answer: Option<u8>,
    sessions: usize,
) -> (String, crossbeam_channel::Receiver<u32>) {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (tx, seen) = crossbeam_channel::unbounded();
    std::thread::spawn(move || {
        for _ in 0..sessions {
            let Ok((mut s, _)) = listener.accept() else {
                return;
            };
            let mut head = [0u8; 8];
            if s.read_exact(&mut head).is_err() || head != [0, 0, 0, 8, 4, 210, 22, 47] {
                continue; // not an SSLRequest
            }
            let Some(answer) = answer else { continue };
            let _ = s.write_all(&[answer]);
            if answer == b'N' && s.read_exact(&mut head).is_ok() {
                let _ = tx.send(u32::from_be_bytes([head[4], head[5], head[6], head[7]]));
            }
        }
    });
    (addr, seen)
}

/// Issue 38: our connector asks for TLS itself on TCP (`src/dialect/postgres/deadline.rs`).
/// A server that closes the connection before it answers is gone, not refusing: a transient
/// failure in every mode (it read as a permanent TLS failure, and the dashboard gave up on a
/// database that was only down). A server without TLS: `prefer` goes on in plain text on the
/// same connection (the startup packet follows the `N`), `require` fails at once, permanent.
#[test]
fn postgres_a_server_that_closes_or_has_no_tls_over_tcp() {
    for mode in ["disable", "prefer", "require"] {
        let (addr, _) = fake_postgres(None, 1);
        let url = format!("postgres://u@{addr}/db?sslmode={mode}");
        fails_fast(&url, DbErrorKind::ConnectionLost, &[]);
    }
    let (addr, seen) = fake_postgres(Some(b'N'), 2);
    let url = format!("postgres://u@{addr}/db?sslmode=require");
    fails_fast(&url, DbErrorKind::Other, &["server does not support TLS"]);
    let url = format!("postgres://u@{addr}/db?sslmode=prefer");
    fails_fast(&url, DbErrorKind::ConnectionLost, &[]);
    assert_eq!(
        seen.recv_timeout(Duration::from_secs(5)),
        Ok(196_608),
        "prefer: no startup packet (protocol 3.0) after the server's N"
    );
}

#[test]
fn postgres_unreadable_root_file_is_an_invalid_url() {
    match Broker::connect(
        "postgres://postgres@127.0.0.1/test?sslmode=verify-ca&sslrootcert=/nonexistent/ca.pem",
    ) {
        Err(BrokerError::InvalidUrl { reason }) => {
            assert!(reason.contains("/nonexistent/ca.pem"), "{reason}")
        }
        other => panic!("expected InvalidUrl, got {other:?}"),
    }
}

// ---- MariaDB / MySQL -------------------------------------------------------------------------

#[test]
fn mysql_verify_identity_encrypts_and_plain_does_not() {
    let (Some(live), Some(root)) = (common::live(Db::Mysql), common::mysql_root_cert()) else {
        return;
    };
    let by_name = live.url.replacen("@127.0.0.1", "@localhost", 1);
    let url = with_params(
        &by_name,
        &format!("ssl-mode=VERIFY_IDENTITY&root_cert_path={root}"),
    );
    assert!(
        roundtrip_encrypted(&live, &url),
        "VERIFY_IDENTITY ran a job on a session with no Ssl_cipher"
    );
    // The control: the same check reads an empty cipher on a plain session.
    assert!(!roundtrip_encrypted(&live, &live.url));
}

#[test]
fn mysql_required_and_verify_ca_encrypt_on_an_ip_host() {
    let (Some(live), Some(root)) = (common::live(Db::Mysql), common::mysql_root_cert()) else {
        return;
    };
    assert!(roundtrip_encrypted(
        &live,
        &with_params(&live.url, "ssl-mode=REQUIRED")
    ));
    assert!(roundtrip_encrypted(
        &live,
        &with_params(&live.url, "ssl-mode=PREFERRED")
    ));
    // 127.0.0.1 is not the certificate's name: VERIFY_CA does not check it.
    let url = with_params(
        &live.url,
        &format!("ssl-mode=VERIFY_CA&root_cert_path={root}"),
    );
    assert!(roundtrip_encrypted(&live, &url));
}

#[test]
fn mysql_wrong_root_or_wrong_name_fails_fast_naming_the_certificate() {
    let (Some(live), Some(root)) = (common::live(Db::Mysql), common::mysql_root_cert()) else {
        return;
    };
    let url = with_params(
        &live.url,
        &format!("ssl-mode=VERIFY_CA&root_cert_path={}", common::other_ca()),
    );
    fails_fast(
        &url,
        DbErrorKind::Other,
        &["invalid peer certificate", "UnknownIssuer"],
    );
    // The driver's own option alone verifies the chain and the name.
    let url = with_params(&live.url, &format!("root_cert_path={}", common::other_ca()));
    fails_fast(&url, DbErrorKind::Other, &["UnknownIssuer"]);
    let url = with_params(
        &live.url,
        &format!("ssl-mode=VERIFY_IDENTITY&root_cert_path={root}"),
    );
    fails_fast(
        &url,
        DbErrorKind::Other,
        &["not valid for name", "127.0.0.1"],
    );
}

// ---- Both: the server's refusal, at once -------------------------------------------------------

#[test]
fn a_refused_login_fails_fast_with_the_servers_reason() {
    if let Some(url) = common::url(Db::Postgres) {
        let url = url.replacen("postgres@", "sqlbroker_no_such_role@", 1);
        fails_fast(
            &url,
            DbErrorKind::Other,
            &["sqlbroker_no_such_role", "28000"],
        );
    }
    if let Some(url) = common::url(Db::Mysql) {
        let url = url.replacen("root@", "sqlbroker_no_such_user@", 1);
        fails_fast(
            &url,
            DbErrorKind::Other,
            &["Access denied", "sqlbroker_no_such_user"],
        );
    }
}

#[test]
fn unknown_ssl_modes_are_invalid_urls() {
    for url in [
        "postgres://postgres@127.0.0.1/test?sslmode=verify",
        "postgres://postgres@127.0.0.1/test?sslcert=/c.pem&sslkey=/k.pem",
        "mysql://root@127.0.0.1/test?ssl-mode=VERIFY",
    ] {
        assert!(
            matches!(Broker::connect(url), Err(BrokerError::InvalidUrl { .. })),
            "{url}"
        );
    }
}
