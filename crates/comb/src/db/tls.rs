//! TLS to PostgreSQL, as the `sslmode` of `DATABASE_URL` asks, with libpq's meaning:
//!
//! - `disable`: never.
//! - `prefer` (the default): when the server offers it, else in the clear.
//! - `require`: always; a server without TLS is refused.
//! - `verify-ca`: always, and the server's certificate must chain to a trusted authority.
//! - `verify-full`: as `verify-ca`, and the certificate must also name the host connected to.
//!
//! `prefer` and `require` encrypt without checking who answers: any certificate is taken,
//! even one no verifier could parse (PostgreSQL clusters often serve a self-signed X.509
//! version 1 certificate, as Citus makes when it turns TLS on), and only the handshake's
//! proof that the server holds the certificate's key is checked. As with libpq, a trusted
//! authority given for them (`sslrootcert` in the URL, or `COMB_DATABASE_CA_FILE`) makes them
//! verify as `verify-ca` does; `prefer` then refuses a server that declines TLS rather than
//! talking to it in the clear. `verify-ca` and `verify-full` need such an authority (or
//! libpq's `~/.postgresql/root.crt`); without one the connection is refused at start.

use std::path::PathBuf;
use std::sync::Arc;

use tokio_rustls::rustls::crypto::CryptoProvider;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::rustls::client::WebPkiServerVerifier;
use tokio_rustls::rustls::client::danger::{
    HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier,
};
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use tokio_rustls::rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};

/// The one cryptography provider of every TLS connection, the listener's included.
pub(crate) fn provider() -> Arc<CryptoProvider> {
    Arc::new(tokio_rustls::rustls::crypto::ring::default_provider())
}

/// The variable naming a PEM file of certificate authorities to verify the database with.
pub(crate) const CA_FILE_VAR: &str = "COMB_DATABASE_CA_FILE";

/// libpq's `sslmode`, all five values (tokio-postgres knows only the first three).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl Mode {
    fn parse(value: &str) -> Option<Mode> {
        Some(match value {
            "disable" => Mode::Disable,
            // libpq's `allow` tries without TLS first; the nearest Comb does is `prefer`.
            "allow" | "prefer" => Mode::Prefer,
            "require" => Mode::Require,
            "verify-ca" => Mode::VerifyCa,
            "verify-full" => Mode::VerifyFull,
            _ => return None,
        })
    }

    fn name(self) -> &'static str {
        match self {
            Mode::Disable => "disable",
            Mode::Prefer => "prefer",
            Mode::Require => "require",
            Mode::VerifyCa => "verify-ca",
            Mode::VerifyFull => "verify-full",
        }
    }
}

/// How connections of one database URL are encrypted and what of the server is checked.
pub(crate) struct Tls {
    mode: Mode,
    /// `None` with `disable`.
    config: Option<Arc<ClientConfig>>,
    /// The certificate is verified: the server must present TLS.
    verifies: bool,
}

/// Takes libpq's TLS options out of a database URL (URI or `key=value` form), which
/// tokio-postgres would refuse or misread: `sslmode` (put back as `require` when it is one
/// of the verifying modes, so that the rest of the URL still parses) and `sslrootcert`.
/// Returns the URL for tokio-postgres, the mode and the trusted authorities' file, if any.
fn split(url: &str) -> Result<(String, Mode, Option<String>), String> {
    let mut mode = Mode::Prefer;
    let mut root = None;
    let mut take = |key: &str, value: &str| -> Result<Option<String>, String> {
        match key {
            "sslmode" => {
                mode = Mode::parse(value)
                    .ok_or_else(|| format!("invalid database URL: sslmode={value}"))?;
                Ok(Some(format!(
                    "sslmode={}",
                    match mode {
                        Mode::Disable => "disable",
                        Mode::Prefer => "prefer",
                        _ => "require",
                    }
                )))
            }
            "sslrootcert" => {
                root = Some(value.to_string());
                Ok(None)
            }
            _ => Ok(Some(String::new())),
        }
    };
    let out = if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        match url.split_once('?') {
            None => url.to_string(),
            Some((base, query)) => {
                let mut kept = Vec::new();
                for pair in query.split('&').filter(|p| !p.is_empty()) {
                    let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
                    match take(k, &percent_decode(v))? {
                        Some(r) if r.is_empty() => kept.push(pair.to_string()),
                        Some(r) => kept.push(r),
                        None => {}
                    }
                }
                if kept.is_empty() {
                    base.to_string()
                } else {
                    format!("{base}?{}", kept.join("&"))
                }
            }
        }
    } else {
        let mut kept = Vec::new();
        for word in url.split_whitespace() {
            let (k, v) = word.split_once('=').unwrap_or((word, ""));
            let v = v.trim_matches('\'');
            match take(k.trim(), v)? {
                Some(r) if r.is_empty() => kept.push(word.to_string()),
                Some(r) => kept.push(r),
                None => {}
            }
        }
        kept.join(" ")
    };
    Ok((out, mode, root))
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && i + 2 < b.len()
            && let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16)
        {
            out.push(v);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

impl Tls {
    /// Reads the TLS options of `url`; returns what tokio-postgres should parse of it and how
    /// to encrypt. Fails when a verifying mode has no authority to verify with, or the
    /// authorities' file cannot be read.
    pub(crate) fn from_url(url: &str) -> Result<(String, Tls), String> {
        let (rest, mode, root) = split(url)?;
        let env = std::env::var(CA_FILE_VAR).ok().filter(|v| !v.is_empty());
        let ca = root.or(env).map(PathBuf::from).or_else(|| {
            // libpq's default place for the authorities, used only when it exists.
            let home = std::env::var_os("HOME")?;
            let path = PathBuf::from(home).join(".postgresql/root.crt");
            path.exists().then_some(path)
        });
        let tls = Tls::new(mode, ca)?;
        Ok((rest, tls))
    }

    fn new(mode: Mode, ca: Option<PathBuf>) -> Result<Tls, String> {
        if mode == Mode::Disable {
            return Ok(Tls {
                mode,
                config: None,
                verifies: false,
            });
        }
        let builder = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?;
        let verifies = ca.is_some();
        let verifier: Arc<dyn ServerCertVerifier> = match ca {
            Some(path) => {
                let mut roots = RootCertStore::empty();
                for cert in CertificateDer::pem_file_iter(&path).map_err(|e| {
                    format!("reading the database's authorities {}: {e}", path.display())
                })? {
                    let cert = cert.map_err(|e| format!("reading {}: {e}", path.display()))?;
                    roots
                        .add(cert)
                        .map_err(|e| format!("a certificate of {}: {e}", path.display()))?;
                }
                let inner =
                    WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider())
                        .build()
                        .map_err(|e| {
                            format!("the database's authorities {}: {e}", path.display())
                        })?;
                Arc::new(Verified {
                    inner,
                    names: mode == Mode::VerifyFull,
                })
            }
            None if matches!(mode, Mode::VerifyCa | Mode::VerifyFull) => {
                return Err(format!(
                    "sslmode={} needs a certificate authority to verify the database with: \
                     sslrootcert in the database URL or {CA_FILE_VAR}",
                    mode.name()
                ));
            }
            None => Arc::new(Unchecked),
        };
        Ok(Tls {
            mode,
            config: Some(Arc::new(
                builder
                    .dangerous()
                    .with_custom_certificate_verifier(verifier)
                    .with_no_client_auth(),
            )),
            verifies,
        })
    }
}

/// A stream to the database, encrypted or not.
pub(crate) enum Secured<S> {
    Plain(S),
    Tls(Box<tokio_rustls::client::TlsStream<S>>),
}

/// Asks the server on `stream` (at `host`) for TLS as `tls` says, before anything else is
/// sent. Unix sockets are never encrypted (as with libpq).
pub(crate) async fn negotiate<S>(
    mut stream: S,
    tls: &Tls,
    host: &str,
) -> std::io::Result<Secured<S>>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let Some(config) = &tls.config else {
        return Ok(Secured::Plain(stream));
    };
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
            let tls_stream = tokio_rustls::TlsConnector::from(config.clone())
                .connect(name, stream)
                .await
                .map_err(|e| refused(e, tls.mode))?;
            Ok(Secured::Tls(Box::new(tls_stream)))
        }
        b'N' if tls.mode != Mode::Prefer || tls.verifies => Err(std::io::Error::other(format!(
            "the database does not offer TLS, which sslmode={} requires",
            if tls.mode == Mode::Prefer {
                "prefer with a certificate authority"
            } else {
                tls.mode.name()
            }
        ))),
        b'N' => Ok(Secured::Plain(stream)),
        other => Err(std::io::Error::other(format!(
            "the database answered the TLS request with {other:#x}"
        ))),
    }
}

/// A failed handshake, said so that an operator knows which setting to change.
fn refused(e: std::io::Error, mode: Mode) -> std::io::Error {
    let text = e.to_string();
    let hint = if text.contains("UnsupportedCertVersion") {
        " (the database's certificate is X.509 version 1, which cannot be verified: give the \
         database a version 3 certificate, or use sslmode=require to encrypt without verifying)"
    } else if text.contains("UnknownIssuer") {
        " (the certificate is not signed by a trusted authority)"
    } else if text.contains("NotValidForName") {
        " (the certificate does not name the host connected to)"
    } else {
        ""
    };
    std::io::Error::new(
        e.kind(),
        format!(
            "TLS with the database failed (sslmode={}): {text}{hint}",
            mode.name()
        ),
    )
}

/// Verifies the chain to the given authorities; with `names`, also that the certificate names
/// the host (`verify-full`), otherwise not (`verify-ca`, and `prefer`/`require` with an
/// authority, as libpq does).
#[derive(Debug)]
struct Verified {
    inner: Arc<WebPkiServerVerifier>,
    names: bool,
}

impl ServerCertVerifier for Verified {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, tokio_rustls::rustls::Error> {
        match self
            .inner
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
        {
            Err(tokio_rustls::rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) if !self.names => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, tokio_rustls::rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, tokio_rustls::rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// Accepts any certificate (libpq's `prefer` and `require` without an authority), still
/// checking that the server holds the key of the certificate it showed. webpki parses only
/// X.509 version 3; for a certificate it refuses (version 1, self-signed by `initdb` scripts
/// and by Citus), the key is read from the certificate here and the signature checked with it.
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
        .or_else(|e| signed_by_key_of(cert, message, dss, false).ok_or(e))
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
        .or_else(|e| signed_by_key_of(cert, message, dss, true).ok_or(e))
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        provider()
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// Whether `dss` is a signature of `message` by the public key of `cert`, read from the
/// certificate's DER whatever its version. `None` when it is not (or cannot be read).
fn signed_by_key_of(
    cert: &CertificateDer<'_>,
    message: &[u8],
    dss: &DigitallySignedStruct,
    tls13: bool,
) -> Option<HandshakeSignatureValid> {
    let (alg_id, key) = public_key(cert.as_ref())?;
    let algs = provider().signature_verification_algorithms;
    let (_, candidates) = algs.mapping.iter().find(|(s, _)| *s == dss.scheme)?;
    // TLS 1.3 names one algorithm per scheme (the first); TLS 1.2 may mean any of them.
    let candidates = if tls13 {
        &candidates[..candidates.len().min(1)]
    } else {
        &candidates[..]
    };
    candidates
        .iter()
        .filter(|a| a.public_key_alg_id().as_ref() == alg_id)
        .any(|a| a.verify_signature(key, message, dss.signature()).is_ok())
        .then(HandshakeSignatureValid::assertion)
}

/// One DER element at the start of `input`: its tag, its contents and what follows it.
fn der(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (first as usize, rest)
    } else {
        let n = (first & 0x7f) as usize;
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n].iter().fold(0usize, |a, &b| (a << 8) | b as usize);
        (len, &rest[n..])
    };
    if rest.len() < len {
        return None;
    }
    Some((tag, &rest[..len], &rest[len..]))
}

/// The subject public key of an X.509 certificate (any version): its algorithm identifier's
/// contents and the key's bits.
fn public_key(cert: &[u8]) -> Option<(&[u8], &[u8])> {
    const SEQUENCE: u8 = 0x30;
    let (SEQUENCE, certificate, _) = der(cert)? else {
        return None;
    };
    let (SEQUENCE, mut tbs, _) = der(certificate)? else {
        return None;
    };
    // An explicit version ([0]) is absent from version 1 certificates.
    if tbs.first() == Some(&0xa0) {
        tbs = der(tbs)?.2;
    }
    // Serial number, signature algorithm, issuer, validity, subject.
    for _ in 0..5 {
        tbs = der(tbs)?.2;
    }
    let (SEQUENCE, spki, _) = der(tbs)? else {
        return None;
    };
    let (SEQUENCE, alg_id, rest) = der(spki)? else {
        return None;
    };
    let (0x03, bits, _) = der(rest)? else {
        return None;
    };
    let (&0, key) = bits.split_first()? else {
        return None;
    };
    Some((alg_id, key))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libpq_options_are_taken_out_of_both_url_forms() {
        let (rest, mode, root) =
            split("postgres://u@h:5/db?sslmode=verify-full&sslrootcert=%2Ftmp%2Fca.pem&x=1")
                .unwrap();
        assert_eq!(rest, "postgres://u@h:5/db?sslmode=require&x=1");
        assert_eq!(mode, Mode::VerifyFull);
        assert_eq!(root.as_deref(), Some("/tmp/ca.pem"));
        let (rest, mode, root) =
            split("host=h sslmode=verify-ca sslrootcert=/ca dbname=d").unwrap();
        assert_eq!(rest, "host=h sslmode=require dbname=d");
        assert_eq!(mode, Mode::VerifyCa);
        assert_eq!(root.as_deref(), Some("/ca"));
        let (rest, mode, _) = split("postgres://h/db").unwrap();
        assert_eq!((rest.as_str(), mode), ("postgres://h/db", Mode::Prefer));
        assert!(split("postgres://h/db?sslmode=sometimes").is_err());
    }
}
