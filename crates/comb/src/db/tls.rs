//! TLS to PostgreSQL, as the `sslmode` of `DATABASE_URL` asks (libpq's meaning):
//!
//! - `disable`: never.
//! - `prefer` (the default): when the server offers it, else in the clear.
//! - `require`: always; a server without TLS is refused.
//!
//! As with libpq, `prefer` and `require` encrypt without checking who answers, unless a
//! certificate authority is given (`COMB_DATABASE_CA_FILE`): then the server's certificate
//! must chain to it and name the host connected to, and `prefer` refuses a server that
//! declines TLS rather than talking to it in the clear.

use std::sync::{Arc, OnceLock};

use tokio_rustls::rustls::crypto::CryptoProvider;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_postgres::config::SslMode;
use tokio_rustls::rustls::client::danger::{
    HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier,
};
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use tokio_rustls::rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};

/// The one cryptography provider of every TLS connection, the listener's included.
pub(crate) fn provider() -> Arc<CryptoProvider> {
    Arc::new(tokio_rustls::rustls::crypto::ring::default_provider())
}

/// The variable naming a PEM file of certificate authorities to verify the database with.
pub(crate) const CA_FILE_VAR: &str = "COMB_DATABASE_CA_FILE";

/// How the database's certificate is checked.
struct Policy {
    config: Arc<ClientConfig>,
    /// A certificate authority was given: the server must present TLS.
    verifies: bool,
}

static POLICY: OnceLock<Result<Policy, String>> = OnceLock::new();

fn policy() -> Result<&'static Policy, std::io::Error> {
    POLICY
        .get_or_init(|| {
            let ca = std::env::var(CA_FILE_VAR).ok().filter(|v| !v.is_empty());
            let builder = ClientConfig::builder_with_provider(provider())
                .with_safe_default_protocol_versions()
                .map_err(|e| e.to_string())?;
            let (config, verifies) = match ca {
                Some(path) => {
                    let mut roots = RootCertStore::empty();
                    for cert in CertificateDer::pem_file_iter(&path)
                        .map_err(|e| format!("reading {CA_FILE_VAR} {path}: {e}"))?
                    {
                        let cert = cert.map_err(|e| format!("reading {path}: {e}"))?;
                        roots
                            .add(cert)
                            .map_err(|e| format!("a certificate of {path}: {e}"))?;
                    }
                    (
                        builder.with_root_certificates(roots).with_no_client_auth(),
                        true,
                    )
                }
                None => (
                    builder
                        .dangerous()
                        .with_custom_certificate_verifier(Arc::new(Unchecked))
                        .with_no_client_auth(),
                    false,
                ),
            };
            Ok(Policy {
                config: Arc::new(config),
                verifies,
            })
        })
        .as_ref()
        .map_err(|e| std::io::Error::other(e.clone()))
}

/// A stream to the database, encrypted or not.
pub(crate) enum Secured<S> {
    Plain(S),
    Tls(Box<tokio_rustls::client::TlsStream<S>>),
}

/// Asks the server on `stream` (at `host`) for TLS as `mode` says, before anything else is
/// sent. Unix sockets are never encrypted (as with libpq).
pub(crate) async fn negotiate<S>(
    mut stream: S,
    mode: SslMode,
    host: &str,
) -> std::io::Result<Secured<S>>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    if mode == SslMode::Disable {
        return Ok(Secured::Plain(stream));
    }
    let policy = policy()?;
    // SSLRequest: length 8, code 80877103.
    stream
        .write_all(&[0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f])
        .await?;
    let mut answer = [0u8; 1];
    stream.read_exact(&mut answer).await?;
    match answer[0] {
        b'S' => {
            let name = ServerName::try_from(host.to_string())
                .map_err(|e| std::io::Error::other(format!("database host {host}: {e}")))?;
            let tls = tokio_rustls::TlsConnector::from(policy.config.clone())
                .connect(name, stream)
                .await?;
            Ok(Secured::Tls(Box::new(tls)))
        }
        b'N' if mode == SslMode::Require || policy.verifies => Err(std::io::Error::other(
            "the database does not offer TLS, which sslmode or COMB_DATABASE_CA_FILE requires",
        )),
        b'N' => Ok(Secured::Plain(stream)),
        other => Err(std::io::Error::other(format!(
            "the database answered the TLS request with {other:#x}"
        ))),
    }
}

/// Accepts any certificate (libpq's `prefer` and `require` without a CA), still checking
/// that the server holds the key of the certificate it showed.
#[derive(Debug)]
struct Unchecked;

impl ServerCertVerifier for Unchecked {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, tokio_rustls::rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, tokio_rustls::rustls::Error> {
        tokio_rustls::rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &provider().signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, tokio_rustls::rustls::Error> {
        tokio_rustls::rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &provider().signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        provider()
            .signature_verification_algorithms
            .supported_schemes()
    }
}

impl<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin> tokio::io::AsyncRead for Secured<S> {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match self.get_mut() {
            Secured::Plain(s) => std::pin::Pin::new(s).poll_read(cx, buf),
            Secured::Tls(s) => std::pin::Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Secured<S> {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Secured::Plain(s) => std::pin::Pin::new(s).poll_write(cx, buf),
            Secured::Tls(s) => std::pin::Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match self.get_mut() {
            Secured::Plain(s) => std::pin::Pin::new(s).poll_flush(cx),
            Secured::Tls(s) => std::pin::Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match self.get_mut() {
            Secured::Plain(s) => std::pin::Pin::new(s).poll_shutdown(cx),
            Secured::Tls(s) => std::pin::Pin::new(s).poll_shutdown(cx),
        }
    }
}
