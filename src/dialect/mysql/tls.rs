//! TLS to MySQL and MariaDB: the `mysql` crate's own URL options, plus the MySQL client's
//! `ssl-mode`.
//!
//! The `mysql` crate (with the `tls` feature: rustls, ring provider) encrypts a session when
//! its URL carries any of its TLS options, and then verifies the server's certificate against
//! the Mozilla roots of `webpki-roots` plus `root_cert_path`, and its host name:
//! - `root_cert_path=<file>`: a trusted root, PEM or DER;
//! - `danger_skip_domain_validation=true`: the host name is not checked;
//! - `danger_accept_invalid_certs=true`: the certificate is not checked at all;
//! - `cert_chain_path=<file>&priv_key_path=<file>`: a client certificate;
//! - `cipher_suites=<names>`: rustls' cipher suite names.
//!
//! (The crate's URL has no `require_ssl`, `verify_ca` or `verify_identity`: those are
//! `mysql_async`'s.) On top of them, sqlbroker reads `ssl-mode` (or `ssl_mode`), as the MySQL
//! client spells it, case-insensitive:
//! - `DISABLED`: plain TCP, whatever TLS options the URL has;
//! - `PREFERRED`: TLS without checking the certificate if the server has TLS, plain text if
//!   it has none or the handshake fails;
//! - `REQUIRED`: TLS or no connection, the certificate not checked;
//! - `VERIFY_CA`: TLS, the certificate must chain to a trusted root (`root_cert_path`, or the
//!   built-in roots); the host name is not checked;
//! - `VERIFY_IDENTITY`: `VERIFY_CA`, and the certificate must name the URL's host.
//!
//! Without `ssl-mode` the crate's own rule holds: plain text unless a TLS option is given.
//!
//! An encrypted session never moves to the server's Unix socket: the crate's `prefer_socket`
//! (on by default, for a loopback host) is turned off unless the URL sets it.

use mysql::{OptsBuilder, SslOpts};

use crate::dialect::url::take_params;
use crate::error::BrokerError;

/// The URL's `ssl-mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SslMode {
    Disabled,
    Preferred,
    Required,
    VerifyCa,
    VerifyIdentity,
}

/// Takes `ssl-mode` out of `url`: the rest, for the driver, and the mode if one was given.
pub(super) fn from_url(url: &str) -> Result<(String, Option<SslMode>), BrokerError> {
    let (rest, taken) = take_params(url, &["ssl-mode", "ssl_mode"]);
    let mut mode = None;
    for (_, value) in taken {
        mode = Some(match value.to_ascii_uppercase().as_str() {
            "DISABLED" => SslMode::Disabled,
            "PREFERRED" => SslMode::Preferred,
            "REQUIRED" => SslMode::Required,
            "VERIFY_CA" => SslMode::VerifyCa,
            "VERIFY_IDENTITY" => SslMode::VerifyIdentity,
            other => {
                return Err(BrokerError::InvalidUrl {
                    reason: format!(
                        "unknown ssl-mode {other:?}: expected DISABLED, PREFERRED, REQUIRED, \
                         VERIFY_CA or VERIFY_IDENTITY"
                    ),
                })
            }
        });
    }
    Ok((rest, mode))
}

/// The session's TLS options: the crate's from the URL (`parsed`), as `mode` amends them.
/// `fallback`: the options of a plain-text session, for `PREFERRED`.
pub(super) struct Applied {
    pub builder: OptsBuilder,
    pub fallback: Option<OptsBuilder>,
}

/// Applies `mode` to the options the driver read from the URL. `url` is the URL as the driver
/// read it (to tell whether it set `prefer_socket`).
pub(super) fn apply(
    builder: OptsBuilder,
    parsed: Option<&SslOpts>,
    mode: Option<SslMode>,
    url: &str,
) -> Result<Applied, BrokerError> {
    let base = || parsed.cloned().unwrap_or_default();
    let ssl = match mode {
        None => parsed.cloned(),
        Some(SslMode::Disabled) => None,
        Some(SslMode::Preferred | SslMode::Required) => {
            Some(base().with_danger_accept_invalid_certs(true))
        }
        Some(SslMode::VerifyCa) => Some(
            base()
                .with_danger_accept_invalid_certs(false)
                .with_danger_skip_domain_validation(true),
        ),
        Some(SslMode::VerifyIdentity) => Some(
            base()
                .with_danger_accept_invalid_certs(false)
                .with_danger_skip_domain_validation(false),
        ),
    };
    let fallback = (mode == Some(SslMode::Preferred)).then(|| builder.clone().ssl_opts(None));
    let Some(ssl) = ssl else {
        return Ok(Applied {
            builder: builder.ssl_opts(None),
            fallback: None,
        });
    };
    if cfg!(not(feature = "tls")) {
        if mode == Some(SslMode::Preferred) {
            return Ok(Applied {
                builder: builder.ssl_opts(None),
                fallback: None,
            });
        }
        return Err(BrokerError::InvalidUrl {
            reason: "TLS options need TLS support: enable the cargo feature `tls` of sqlbroker"
                .into(),
        });
    }
    let mut builder = builder.ssl_opts(ssl);
    if !url.contains("prefer_socket=") {
        builder = builder.prefer_socket(false);
    }
    Ok(Applied { builder, fallback })
}

/// The `mysql` crate builds its rustls configuration with the process's default crypto
/// provider: ring, installed here before the first TLS session unless the application
/// installed one already (two providers compiled in and none installed would panic there).
#[cfg(feature = "tls")]
pub(super) fn install_provider() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        if rustls::crypto::CryptoProvider::get_default().is_none() {
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
    });
}

#[cfg(all(test, feature = "tls"))]
mod tests {
    use super::*;
    use mysql::Opts;

    fn applied(url: &str) -> (Opts, Option<Opts>) {
        let (rest, mode) = from_url(url).unwrap();
        let opts = Opts::from_url(&rest).unwrap();
        let parsed = opts.get_ssl_opts().cloned();
        let a = apply(OptsBuilder::from_opts(opts), parsed.as_ref(), mode, &rest).unwrap();
        (a.builder.into(), a.fallback.map(Into::into))
    }

    #[test]
    fn modes_amend_the_crate_options() {
        let (o, fb) = applied("mysql://u@h/db?ssl-mode=VERIFY_CA&root_cert_path=%2Fca.pem");
        let ssl = o.get_ssl_opts().unwrap();
        assert_eq!(ssl.root_cert_path(), Some(std::path::Path::new("/ca.pem")));
        assert!(!ssl.accept_invalid_certs() && ssl.skip_domain_validation());
        assert!(!o.get_prefer_socket() && fb.is_none());

        let (o, _) = applied("mysql://u@h/db?ssl_mode=verify_identity");
        let ssl = o.get_ssl_opts().unwrap();
        assert!(!ssl.accept_invalid_certs() && !ssl.skip_domain_validation());

        let (o, fb) = applied("mysql://u@h/db?ssl-mode=PREFERRED");
        assert!(o.get_ssl_opts().unwrap().accept_invalid_certs());
        assert!(fb.unwrap().get_ssl_opts().is_none());

        let (o, _) = applied("mysql://u@h/db?ssl-mode=REQUIRED&prefer_socket=true");
        assert!(o.get_ssl_opts().unwrap().accept_invalid_certs());
        assert!(o.get_prefer_socket(), "the URL's own prefer_socket is kept");

        // The crate's own options alone: TLS as the crate does it.
        let (o, _) = applied("mysql://u@h/db?root_cert_path=%2Fca.pem");
        assert!(!o.get_ssl_opts().unwrap().skip_domain_validation());
        assert!(!o.get_prefer_socket());

        let (o, _) = applied("mysql://u@h/db?ssl-mode=DISABLED&root_cert_path=%2Fca.pem");
        assert!(o.get_ssl_opts().is_none());
        let (o, _) = applied("mysql://u@h/db");
        assert!(o.get_ssl_opts().is_none() && o.get_prefer_socket());

        assert!(matches!(
            from_url("mysql://u@h/db?ssl-mode=ON"),
            Err(BrokerError::InvalidUrl { .. })
        ));
    }
}
