//! HTTPS on the listener: the certificate and key are read at start and again on SIGHUP, so a
//! renewed certificate is taken up without a restart. Handshakes run beside the accept loop,
//! each bounded in time, so a client that stalls its handshake holds no one else up.

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use axum::serve::Listener;
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::server::TlsStream;

use crate::http::limits::{Admitted, LimitedListener};

/// How long a client may take to finish its handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Reads a certificate chain and its private key (PEM) into a server configuration.
pub(crate) fn load(cert: &Path, key: &Path) -> Result<Arc<ServerConfig>, String> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .and_then(|certs| certs.collect())
        .map_err(|e| format!("reading the certificate {}: {e}", cert.display()))?;
    if chain.is_empty() {
        return Err(format!("no certificate in {}", cert.display()));
    }
    let key = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| format!("reading the private key {}: {e}", key.display()))?;
    let mut config = ServerConfig::builder_with_provider(crate::db::tls::provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| format!("the certificate and key do not make a TLS identity: {e}"))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// A listener handing out connections whose TLS handshake is done.
pub(crate) struct TlsListener {
    ready: mpsc::Receiver<(TlsStream<Admitted>, SocketAddr)>,
    local: SocketAddr,
}

impl TlsListener {
    /// Serves TLS on `inner` with the certificate and key at these paths, reloading them on
    /// SIGHUP (a reload that fails keeps the identity in use and says why in the log).
    pub(crate) fn new(
        mut inner: LimitedListener,
        cert: PathBuf,
        key: PathBuf,
    ) -> Result<Self, String> {
        let acceptor = Arc::new(RwLock::new(TlsAcceptor::from(load(&cert, &key)?)));
        let local = inner.local_addr().map_err(|e| e.to_string())?;
        let reloaded = acceptor.clone();
        let mut hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
            .map_err(|e| format!("SIGHUP handler: {e}"))?;
        tokio::spawn(async move {
            while hangup.recv().await.is_some() {
                match load(&cert, &key) {
                    Ok(config) => {
                        *reloaded.write().unwrap_or_else(|e| e.into_inner()) =
                            TlsAcceptor::from(config);
                        tracing::info!(cert = %cert.display(), "TLS certificate reloaded");
                    }
                    Err(e) => tracing::error!(error = %e, "TLS certificate not reloaded"),
                }
            }
        });
        let (tx, ready) = mpsc::channel(256);
        tokio::spawn(async move {
            loop {
                let (io, addr) = inner.accept().await;
                let acceptor = acceptor.read().unwrap_or_else(|e| e.into_inner()).clone();
                let sender = tx.clone();
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(io)).await {
                        Ok(Ok(tls)) => {
                            let _ = sender.send((tls, addr)).await;
                        }
                        Ok(Err(e)) => tracing::debug!(%addr, error = %e, "TLS handshake failed"),
                        Err(_) => tracing::debug!(%addr, "TLS handshake timed out"),
                    }
                });
                if tx.is_closed() {
                    return;
                }
            }
        });
        Ok(TlsListener { ready, local })
    }
}

impl Listener for TlsListener {
    type Io = TlsStream<Admitted>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, SocketAddr) {
        match self.ready.recv().await {
            Some(connection) => connection,
            // The accept loop ended: nothing more will come.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.local)
    }
}
