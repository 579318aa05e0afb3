//! TLS with rustls (ring): on the HTTP listener for deployments without a proxy in front, and
//! to PostgreSQL as the `sslmode` of `DATABASE_URL` asks.

pub mod database;
pub mod listener;

use std::sync::Arc;

use tokio_rustls::rustls::crypto::CryptoProvider;

/// The one cryptography provider used everywhere.
fn provider() -> Arc<CryptoProvider> {
    Arc::new(tokio_rustls::rustls::crypto::ring::default_provider())
}
