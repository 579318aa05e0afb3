//! The keys tokens are verified with: a shared secret, a public key, and a JSON Web Key Set
//! fetched from a URL and kept fresh in the background.

use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{Algorithm, DecodingKey};

/// The least time between two fetches of the key set asked for by unknown key ids, so that
/// tokens naming made-up ids cannot make the server hammer the identity provider.
const EARLY_REFRESH_GAP: Duration = Duration::from_secs(30);

/// One key set, as last fetched.
#[derive(Default)]
struct Fetched {
    keys: Vec<(Option<String>, Algorithm, Arc<DecodingKey>)>,
}

/// A key set fetched from `url`, replaced only by a later successful fetch: while the URL does
/// not answer, the keys fetched before stay in use.
pub(crate) struct Jwks {
    url: String,
    http: reqwest::Client,
    current: RwLock<Arc<Fetched>>,
    /// When an unknown key id last asked for an early fetch.
    last_early: std::sync::Mutex<Option<Instant>>,
    early: tokio::sync::Notify,
}

impl Jwks {
    /// A key set at `url`, not fetched yet.
    pub(crate) fn new(url: String, timeout: Duration) -> Result<Arc<Jwks>, String> {
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .build()
            .map_err(|e| format!("JWKS client: {e}"))?;
        Ok(Arc::new(Jwks {
            url,
            http,
            current: RwLock::new(Arc::default()),
            last_early: std::sync::Mutex::new(None),
            early: tokio::sync::Notify::new(),
        }))
    }

    /// Fetches the set and, if it parsed, puts it in use. Keys of kinds the verifier does not
    /// support are skipped.
    pub(crate) async fn refresh(&self) -> Result<usize, String> {
        let set: JwkSet = self
            .http
            .get(&self.url)
            .send()
            .await
            .and_then(|r| r.error_for_status())
            .map_err(|e| format!("fetching {}: {e}", self.url))?
            .json()
            .await
            .map_err(|e| format!("reading the key set of {}: {e}", self.url))?;
        let mut keys = Vec::with_capacity(set.keys.len());
        for jwk in &set.keys {
            let Some(alg) = algorithm_of(jwk) else {
                continue;
            };
            if let Ok(key) = DecodingKey::from_jwk(jwk) {
                keys.push((jwk.common.key_id.clone(), alg, Arc::new(key)));
            }
        }
        let n = keys.len();
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(Fetched { keys });
        Ok(n)
    }

    /// Keeps the set fresh after a first fetch: every `every`, and early when a token names
    /// an unknown key id.
    pub(crate) async fn run(self: Arc<Self>, every: Duration) {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                _ = self.early.notified() => {}
            }
            match self.refresh().await {
                Ok(n) => tracing::debug!(keys = n, "key set refreshed"),
                Err(e) => tracing::warn!(error = %e, "key set not refreshed; keeping the last one"),
            }
        }
    }

    /// The keys that may have signed a token of `alg` naming `kid`. A `kid` the set lacks asks
    /// for an early refresh (a key rotated in at the provider).
    pub(crate) fn candidates(&self, alg: Algorithm, kid: Option<&str>) -> Vec<Arc<DecodingKey>> {
        let fetched = self
            .current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let found: Vec<Arc<DecodingKey>> = fetched
            .keys
            .iter()
            .filter(|(id, a, _)| *a == alg && (kid.is_none() || id.as_deref() == kid))
            .map(|(_, _, k)| k.clone())
            .collect();
        if found.is_empty() && kid.is_some() {
            self.ask_early_refresh();
        }
        found
    }

    fn ask_early_refresh(&self) {
        let mut last = self.last_early.lock().unwrap_or_else(|e| e.into_inner());
        if last.is_none_or(|t| t.elapsed() >= EARLY_REFRESH_GAP) {
            *last = Some(Instant::now());
            self.early.notify_one();
        }
    }
}

/// The algorithm a key of the set is for: its `alg` if given, else what its kind implies.
fn algorithm_of(jwk: &jsonwebtoken::jwk::Jwk) -> Option<Algorithm> {
    use jsonwebtoken::jwk::{AlgorithmParameters, KeyAlgorithm};
    match jwk.common.key_algorithm {
        Some(KeyAlgorithm::RS256) => Some(Algorithm::RS256),
        Some(KeyAlgorithm::EdDSA) => Some(Algorithm::EdDSA),
        Some(_) => None,
        None => match &jwk.algorithm {
            AlgorithmParameters::RSA(_) => Some(Algorithm::RS256),
            AlgorithmParameters::OctetKeyPair(_) => Some(Algorithm::EdDSA),
            _ => None,
        },
    }
}

/// A public key given as PEM text or as the path of a PEM file, for RS256 or EdDSA.
pub(crate) fn public_key(text_or_path: &str) -> Result<(Algorithm, DecodingKey), String> {
    let pem = if text_or_path.trim_start().starts_with("-----BEGIN") {
        text_or_path.to_string()
    } else {
        std::fs::read_to_string(text_or_path)
            .map_err(|e| format!("reading the JWT public key {text_or_path}: {e}"))?
    };
    // Environment variables often carry PEM with escaped line breaks.
    let pem = pem.replace("\\n", "\n");
    if let Ok(key) = DecodingKey::from_rsa_pem(pem.as_bytes()) {
        return Ok((Algorithm::RS256, key));
    }
    DecodingKey::from_ed_pem(pem.as_bytes())
        .map(|key| (Algorithm::EdDSA, key))
        .map_err(|_| "the JWT public key is neither an RSA nor an Ed25519 public key in PEM".into())
}
