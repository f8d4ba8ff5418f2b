//! TLS to PostgreSQL, spelled as libpq spells it in the URL, through rustls.
//!
//! - `sslmode=disable`: plain TCP.
//! - `sslmode=prefer` (the default, as in libpq): TLS when the server offers it, else plain; a
//!   failed handshake falls back to plain too. The certificate is not verified (unless
//!   `sslrootcert` is given: then as `verify-ca`).
//! - `sslmode=require`: TLS or no connection; the certificate is not verified (unless
//!   `sslrootcert` is given: then as `verify-ca`, as libpq does).
//! - `sslmode=verify-ca`: TLS, and the server's certificate must chain to a trusted root; its
//!   host name is not checked.
//! - `sslmode=verify-full`: `verify-ca`, and the certificate must name the host of the URL
//!   (a DNS name, or an IP address in its subject alternative names).
//! - `sslrootcert=<file>`: the trusted roots, PEM (one or more certificates) or DER;
//!   `sslrootcert=system`: the operating system's roots. Without it, `verify-ca` and
//!   `verify-full` trust the Mozilla roots built into the `webpki-roots` crate (libpq would read
//!   `~/.postgresql/root.crt`; name the file instead).
//!
//! Not supported: client certificates (`sslcert`, `sslkey`), `sslmode=allow`, and channel
//! binding (`channel_binding=require`): SCRAM authentication runs without it.
//!
//! Without the `tls` cargo feature, `prefer` connects in plain text and the modes that demand
//! TLS are refused when the URL is read.

use std::path::PathBuf;

use crate::dialect::url::{is_key_value, take_kv_params, take_params};
use crate::error::BrokerError;

/// The URL's `sslmode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SslMode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

/// Where trusted roots come from.
#[cfg_attr(not(feature = "tls"), allow(dead_code))]
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Roots {
    /// `webpki-roots`' Mozilla bundle.
    BuiltIn,
    /// The operating system's (`sslrootcert=system`).
    System,
    /// A PEM or DER file (`sslrootcert=<file>`).
    File(PathBuf),
}

/// The TLS settings of a URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Settings {
    pub mode: SslMode,
    /// `sslrootcert`, if given.
    pub roots: Option<Roots>,
}

impl Settings {
    /// The mode `tokio-postgres` runs: it knows no `verify-*`, which are `require` plus our
    /// certificate checks.
    pub fn driver_mode(&self) -> postgres::config::SslMode {
        match self.mode {
            SslMode::Disable => postgres::config::SslMode::Disable,
            SslMode::Prefer => postgres::config::SslMode::Prefer,
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => {
                postgres::config::SslMode::Require
            }
        }
    }

    /// Whether the certificate's chain is checked, and its name.
    #[cfg_attr(not(feature = "tls"), allow(dead_code))]
    pub fn verify(&self) -> (bool, bool) {
        match self.mode {
            SslMode::VerifyFull => (true, true),
            SslMode::VerifyCa => (true, false),
            SslMode::Disable | SslMode::Prefer | SslMode::Require => (self.roots.is_some(), false),
        }
    }
}

/// Takes the TLS parameters out of `url`: the rest of the URL, for the driver, and the settings.
pub(super) fn from_url(url: &str) -> Result<(String, Settings), BrokerError> {
    let bad = |reason: String| BrokerError::InvalidUrl { reason };
    let names = ["sslmode", "sslrootcert", "sslcert", "sslkey"];
    let (rest, taken) = if is_key_value(url) {
        take_kv_params(url, &names)
    } else {
        take_params(url, &names)
    };
    let mut settings = Settings {
        mode: SslMode::Prefer,
        roots: None,
    };
    for (name, value) in taken {
        match name.as_str() {
            "sslmode" => {
                settings.mode = match value.as_str() {
                    "disable" => SslMode::Disable,
                    "prefer" => SslMode::Prefer,
                    "require" => SslMode::Require,
                    "verify-ca" => SslMode::VerifyCa,
                    "verify-full" => SslMode::VerifyFull,
                    "allow" => {
                        return Err(bad(
                            "sslmode=allow is not supported: use prefer or disable".into()
                        ))
                    }
                    other => {
                        return Err(bad(format!(
                            "unknown sslmode {other:?}: expected disable, prefer, require, \
                             verify-ca or verify-full"
                        )))
                    }
                }
            }
            "sslrootcert" if value == "system" => settings.roots = Some(Roots::System),
            "sslrootcert" if value.is_empty() => {
                return Err(bad("sslrootcert is empty: name a file, or system".into()))
            }
            "sslrootcert" => settings.roots = Some(Roots::File(value.into())),
            _ => {
                return Err(bad(format!(
                    "{name}: client certificates are not supported; authenticate with a \
                     password over TLS instead"
                )))
            }
        }
    }
    if cfg!(not(feature = "tls")) && !matches!(settings.mode, SslMode::Disable | SslMode::Prefer) {
        return Err(bad(format!(
            "sslmode={} needs TLS support: enable the cargo feature `tls` of sqlbroker",
            match settings.mode {
                SslMode::Require => "require",
                SslMode::VerifyCa => "verify-ca",
                _ => "verify-full",
            }
        )));
    }
    Ok((rest, settings))
}

#[cfg(feature = "tls")]
pub(super) use connector::{is_tls_failure, MakeRustls, RustlsConnect, RustlsStream};

#[cfg(feature = "tls")]
mod connector {
    //! The rustls connector `tokio-postgres` runs its handshake through, and the certificate
    //! checks of each mode.

    use std::future::Future;
    use std::io;
    use std::pin::Pin;
    use std::sync::Arc;
    use std::task::{Context, Poll};

    use postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect, TlsStream};
    use postgres::Socket;
    use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
    use rustls::client::WebPkiServerVerifier;
    use rustls::crypto::CryptoProvider;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
    use rustls::{CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore};
    use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

    use super::{Roots, Settings};
    use crate::error::BrokerError;

    /// Makes one TLS connection per new session, with one client configuration built when
    /// the URL was read (its roots loaded then, so a missing file fails at once).
    #[derive(Clone)]
    pub(in crate::dialect::postgres) struct MakeRustls {
        config: Arc<ClientConfig>,
    }

    impl MakeRustls {
        pub fn new(settings: &Settings) -> Result<Self, BrokerError> {
            let bad = |reason: String| BrokerError::InvalidUrl { reason };
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let (chain, name) = settings.verify();
            let webpki = if chain {
                let roots = Arc::new(root_store(
                    settings.roots.as_ref().unwrap_or(&Roots::BuiltIn),
                )?);
                let v = WebPkiServerVerifier::builder_with_provider(roots, provider.clone())
                    .build()
                    .map_err(|e| bad(format!("sslrootcert: {e}")))?;
                Some(v)
            } else {
                None
            };
            let verifier = Arc::new(Verifier {
                webpki,
                check_name: name,
                provider: provider.clone(),
            });
            let config = ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .map_err(|e| bad(format!("TLS: {e}")))?
                .dangerous()
                .with_custom_certificate_verifier(verifier)
                .with_no_client_auth();
            Ok(MakeRustls {
                config: Arc::new(config),
            })
        }
    }

    /// The trusted roots of `roots`.
    fn root_store(roots: &Roots) -> Result<RootCertStore, BrokerError> {
        let bad = |reason: String| BrokerError::InvalidUrl { reason };
        let mut store = RootCertStore::empty();
        match roots {
            Roots::BuiltIn => store.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
            Roots::System => {
                let found = rustls_native_certs::load_native_certs();
                let (added, _) = store.add_parsable_certificates(found.certs);
                if added == 0 {
                    let why = found.errors.first().map(|e| format!(": {e}"));
                    return Err(bad(format!(
                        "sslrootcert=system: no usable root certificate in the operating \
                         system's store{}",
                        why.unwrap_or_default()
                    )));
                }
            }
            Roots::File(path) => {
                let shown = path.display();
                let bytes =
                    std::fs::read(path).map_err(|e| bad(format!("sslrootcert {shown}: {e}")))?;
                let mut certs = CertificateDer::pem_slice_iter(&bytes)
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| bad(format!("sslrootcert {shown}: {e}")))?;
                if certs.is_empty() && !bytes.starts_with(b"-----") && !bytes.is_empty() {
                    certs.push(CertificateDer::from(bytes)); // DER
                }
                if certs.is_empty() {
                    return Err(bad(format!(
                        "sslrootcert {shown}: no certificate in the file"
                    )));
                }
                for cert in certs {
                    store
                        .add(cert)
                        .map_err(|e| bad(format!("sslrootcert {shown}: {e}")))?;
                }
            }
        }
        Ok(store)
    }

    /// The checks of each mode. No chain check (`prefer`, `require`): any certificate, but
    /// the handshake's signatures are still verified against it, so the session is encrypted
    /// to whoever holds its key. Chain check without name (`verify-ca`): every error of the
    /// WebPKI verifier but a name mismatch fails. Both (`verify-full`): the WebPKI verifier
    /// as it is.
    #[derive(Debug)]
    struct Verifier {
        webpki: Option<Arc<WebPkiServerVerifier>>,
        check_name: bool,
        provider: Arc<CryptoProvider>,
    }

    impl ServerCertVerifier for Verifier {
        fn verify_server_cert(
            &self,
            end_entity: &CertificateDer<'_>,
            intermediates: &[CertificateDer<'_>],
            server_name: &ServerName<'_>,
            ocsp: &[u8],
            now: UnixTime,
        ) -> Result<ServerCertVerified, rustls::Error> {
            let Some(webpki) = &self.webpki else {
                return Ok(ServerCertVerified::assertion());
            };
            match webpki.verify_server_cert(end_entity, intermediates, server_name, ocsp, now) {
                Err(rustls::Error::InvalidCertificate(
                    CertificateError::NotValidForName
                    | CertificateError::NotValidForNameContext { .. },
                )) if !self.check_name => Ok(ServerCertVerified::assertion()),
                other => other,
            }
        }

        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls12_signature(
                message,
                cert,
                dss,
                &self.provider.signature_verification_algorithms,
            )
        }

        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls13_signature(
                message,
                cert,
                dss,
                &self.provider.signature_verification_algorithms,
            )
        }

        fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
            self.provider
                .signature_verification_algorithms
                .supported_schemes()
        }
    }

    /// A TLS failure of ours (the handshake, or a host name rustls cannot use), told apart
    /// from the driver's other errors so `prefer` can fall back to plain text.
    #[derive(Debug)]
    pub(in crate::dialect::postgres) struct TlsFailure(io::Error);

    impl std::fmt::Display for TlsFailure {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            self.0.fmt(f)
        }
    }

    /// No source: the I/O error's text already is the TLS library's reason.
    impl std::error::Error for TlsFailure {}

    /// True if the driver's error is a failed TLS handshake.
    pub(in crate::dialect::postgres) fn is_tls_failure(e: &postgres::Error) -> bool {
        std::error::Error::source(e).is_some_and(|s| s.is::<TlsFailure>())
    }

    impl MakeRustls {
        /// The handshake with `domain`, the URL's host; empty for a Unix socket, where the
        /// server offers no TLS and `prefer` goes on in plain text.
        pub fn connector(&self, domain: &str) -> Result<RustlsConnect, TlsFailure> {
            let name = if domain.is_empty() {
                None
            } else {
                Some(ServerName::try_from(domain.to_string()).map_err(|e| {
                    TlsFailure(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!("host {domain:?} cannot be checked against a certificate: {e}"),
                    ))
                })?)
            };
            Ok(RustlsConnect {
                config: self.config.clone(),
                name,
            })
        }
    }

    /// The driver's own negotiation, for sessions whose round trips are not bounded (a Unix
    /// socket: see `deadline.rs`).
    impl MakeTlsConnect<Socket> for MakeRustls {
        type Stream = RustlsStream<Socket>;
        type TlsConnect = RustlsConnect;
        type Error = TlsFailure;

        fn make_tls_connect(&mut self, domain: &str) -> Result<RustlsConnect, TlsFailure> {
            self.connector(domain)
        }
    }

    /// One handshake.
    pub(in crate::dialect::postgres) struct RustlsConnect {
        config: Arc<ClientConfig>,
        name: Option<ServerName<'static>>,
    }

    type Handshake<S> = Pin<Box<dyn Future<Output = Result<RustlsStream<S>, TlsFailure>> + Send>>;

    impl<S> TlsConnect<S> for RustlsConnect
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        type Stream = RustlsStream<S>;
        type Error = TlsFailure;
        type Future = Handshake<S>;

        fn connect(self, stream: S) -> Handshake<S> {
            Box::pin(async move {
                let name = self.name.ok_or_else(|| {
                    TlsFailure(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        "no host name for the TLS handshake",
                    ))
                })?;
                tokio_rustls::TlsConnector::from(self.config)
                    .connect(name, stream)
                    .await
                    .map(|s| RustlsStream(Box::new(s)))
                    .map_err(TlsFailure)
            })
        }
    }

    impl RustlsConnect {
        /// The handshake over a stream whose round trips are bounded: an I/O error of the
        /// stream itself (no answer, a reset) is the connection's failure, not TLS's, so
        /// `prefer` does not fall back to plain text for it and it reads as transient.
        pub(in crate::dialect::postgres) async fn connect_over<S>(
            self,
            stream: S,
        ) -> Result<RustlsStream<S>, Box<dyn std::error::Error + Send + Sync>>
        where
            S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
        {
            match TlsConnect::connect(self, stream).await {
                Ok(s) => Ok(s),
                Err(TlsFailure(io))
                    if !rustls_failed(&io) && io.kind() != io::ErrorKind::InvalidInput =>
                {
                    Err(Box::new(io))
                }
                Err(e) => Err(Box::new(e)),
            }
        }
    }

    /// An I/O error that rustls raised (a certificate, a protocol), not the socket.
    fn rustls_failed(io: &io::Error) -> bool {
        io.get_ref().is_some_and(|e| e.is::<rustls::Error>())
    }

    /// An encrypted session's stream.
    pub(in crate::dialect::postgres) struct RustlsStream<S>(
        Box<tokio_rustls::client::TlsStream<S>>,
    );

    impl<S: AsyncRead + AsyncWrite + Unpin> TlsStream for RustlsStream<S> {
        /// None: SCRAM runs without channel binding (`tls-server-end-point` would need the
        /// hash of the certificate's own signature algorithm).
        fn channel_binding(&self) -> ChannelBinding {
            ChannelBinding::none()
        }
    }

    impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for RustlsStream<S> {
        fn poll_read(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            Pin::new(&mut *self.0).poll_read(cx, buf)
        }
    }

    impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for RustlsStream<S> {
        fn poll_write(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            Pin::new(&mut *self.0).poll_write(cx, buf)
        }

        fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut *self.0).poll_flush(cx)
        }

        fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut *self.0).poll_shutdown(cx)
        }

        fn poll_write_vectored(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            bufs: &[io::IoSlice<'_>],
        ) -> Poll<io::Result<usize>> {
            Pin::new(&mut *self.0).poll_write_vectored(cx, bufs)
        }

        fn is_write_vectored(&self) -> bool {
            self.0.is_write_vectored()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_and_roots_from_the_url() {
        let (rest, s) =
            from_url("postgres://u@h/db?sslmode=verify-full&sslrootcert=%2Fca.pem").unwrap();
        assert_eq!(rest, "postgres://u@h/db");
        assert_eq!(s.mode, SslMode::VerifyFull);
        assert_eq!(s.roots, Some(Roots::File("/ca.pem".into())));
        assert_eq!(s.verify(), (true, true));
        let (_, s) = from_url("postgres://u@h/db?sslmode=verify-ca").unwrap();
        assert_eq!(s.verify(), (true, false));
        let (_, s) = from_url("postgres://u@h/db").unwrap();
        assert_eq!((s.mode, s.verify()), (SslMode::Prefer, (false, false)));
        // libpq: `require` with a root file checks the chain, as verify-ca.
        let (_, s) = from_url("postgres://u@h/db?sslmode=require&sslrootcert=system").unwrap();
        assert_eq!(
            (s.roots.clone(), s.verify()),
            (Some(Roots::System), (true, false))
        );
        for bad in [
            "sslmode=allow",
            "sslmode=on",
            "sslcert=/c.pem",
            "sslrootcert=",
        ] {
            assert!(
                matches!(
                    from_url(&format!("postgres://u@h/db?{bad}")),
                    Err(BrokerError::InvalidUrl { .. })
                ),
                "{bad}"
            );
        }
    }
}
