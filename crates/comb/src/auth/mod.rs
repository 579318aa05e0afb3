//! Bearer tokens: who calls (the token's subject and role), whether the route allows that
//! role, and which queues the token may touch. Off unless configured; when off, requests
//! pass untouched. The HTTP edge applies it as one layer (`http::guard`) and turns a
//! [`Denied`] into its answer.
//!
//! Every token is verified by `jsonwebtoken`: the signature first, then the claims, and every
//! failure takes the same path to the same answer, so an answer tells nothing about why a
//! token was refused.

mod access;
mod keys;

use std::sync::Arc;
use std::time::Duration;

use axum::http::Method;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::{Map, Value};

use access::{Access, Role};
use access::{QueueOf, queue_of, required};

use crate::config::AuthConfig;

/// Who made a request, as its verified token says. Handlers find it among the request's
/// extensions when tokens are required.
#[derive(Debug, Clone)]
pub(crate) struct Principal {
    /// The token's `sub`, stored with pushed messages as their producer.
    pub(crate) sub: Option<Arc<str>>,
    /// Prefixes of the queues the token may touch; `None`: every queue.
    pub(crate) queues: Option<Arc<[String]>>,
    /// The most trusted role the token carries.
    role: Role,
}

impl Principal {
    /// Whether the token's role may use `method path` (its queue scope aside): the same
    /// table the API's routes are guarded by, so pages can show only what would pass.
    pub(crate) fn may(&self, method: &Method, path: &str) -> bool {
        self.role.allows(required(method, path, true))
    }

    /// Whether the token may touch queue `name`.
    pub(crate) fn may_use(&self, name: &str) -> bool {
        self.queues
            .as_ref()
            .is_none_or(|prefixes| prefixes.iter().any(|p| name.starts_with(p.as_str())))
    }

    /// Whether every queue of `names` is within the token's scope.
    pub(crate) fn may_use_all<'a>(&self, mut names: impl Iterator<Item = &'a str>) -> bool {
        self.queues.is_none() || names.all(|n| self.may_use(n))
    }
}

/// The settings of token verification, resolved from flags, `COMB_*` and Queen's variables.
pub(crate) struct Auth {
    algorithms: Vec<Algorithm>,
    secret: Option<DecodingKey>,
    public_key: Option<(Algorithm, DecodingKey)>,
    jwks: Option<Arc<keys::Jwks>>,
    jwks_every: Duration,
    validation: Validation,
    role_claim: String,
    roles_claim: String,
    role_names: [(String, Role); 4],
    queues_claim: Option<String>,
    protect_metrics: bool,
    /// Paths answered without a token, beside the public ones (Queen's `JWT_SKIP_PATHS`).
    skip_paths: Vec<String>,
}

/// The paths of a skip list (`/a,/b`): each must be a path; `/metrics` stays protected when
/// asked to be.
fn skip_paths(list: Option<String>, protect_metrics: bool) -> Result<Vec<String>, String> {
    let mut paths = Vec::new();
    for p in list.iter().flat_map(|l| l.split(',')).map(str::trim) {
        if p.is_empty() {
            continue;
        }
        if !p.starts_with('/') || p.contains(['?', '#', ' ']) {
            return Err(format!(
                "JWT skip path {p:?} is not a path (it must start with `/`, without a query)"
            ));
        }
        if p == "/metrics" && protect_metrics {
            tracing::warn!(
                "/metrics is in the skip paths but --jwt-protect-metrics keeps it protected"
            );
            continue;
        }
        paths.push(p.to_string());
    }
    Ok(paths)
}

/// Queen's variable for a setting, read when neither the flag nor its `COMB_*` variable
/// gave one.
fn queen(value: &Option<String>, name: &str) -> Option<String> {
    value
        .clone()
        .or_else(|| std::env::var(name).ok())
        .filter(|v| !v.is_empty())
}

fn queen_bool(value: Option<bool>, name: &str) -> Result<bool, String> {
    match value {
        Some(v) => Ok(v),
        None => match std::env::var(name).ok().as_deref().map(str::trim) {
            None | Some("") => Ok(false),
            Some(v) if v.eq_ignore_ascii_case("true") || v == "1" => Ok(true),
            Some(v) if v.eq_ignore_ascii_case("false") || v == "0" => Ok(false),
            Some(v) => Err(format!("{name} must be true or false, not {v:?}")),
        },
    }
}

fn queen_number(value: Option<u64>, name: &str, default: u64) -> Result<u64, String> {
    match value {
        Some(v) => Ok(v),
        None => match std::env::var(name).ok().filter(|v| !v.trim().is_empty()) {
            None => Ok(default),
            Some(v) => v
                .trim()
                .parse()
                .map_err(|_| format!("{name} must be a whole number, not {v:?}")),
        },
    }
}

impl Auth {
    /// The verifier `config` asks for, or `None` when tokens are not required. Fails on
    /// settings that cannot work (no key for the algorithm, an unreadable public key).
    pub(crate) fn from_config(config: &AuthConfig) -> Result<Option<Arc<Auth>>, String> {
        if !queen_bool(config.jwt_enabled, "JWT_ENABLED")? {
            return Ok(None);
        }
        let secret = queen(&config.jwt_secret, "JWT_SECRET");
        let public_key = queen(&config.jwt_public_key, "JWT_PUBLIC_KEY")
            .map(|k| keys::public_key(&k))
            .transpose()?;
        let jwks_url = queen(&config.jwt_jwks_url, "JWT_JWKS_URL");
        let algorithm = queen(&config.jwt_algorithm, "JWT_ALGORITHM").unwrap_or("HS256".into());
        let algorithms = match algorithm.to_ascii_lowercase().as_str() {
            "hs256" => vec![Algorithm::HS256],
            "rs256" => vec![Algorithm::RS256],
            "eddsa" => vec![Algorithm::EdDSA],
            "auto" => {
                let mut a = Vec::new();
                if secret.is_some() {
                    a.push(Algorithm::HS256);
                }
                if let Some((alg, _)) = &public_key {
                    a.push(*alg);
                }
                if jwks_url.is_some() {
                    a.extend([Algorithm::RS256, Algorithm::EdDSA]);
                }
                a.dedup();
                a
            }
            other => {
                return Err(format!(
                    "JWT algorithm {other:?} is not one of HS256, RS256, EdDSA, auto"
                ));
            }
        };
        for alg in &algorithms {
            let keyed = match alg {
                Algorithm::HS256 => secret.is_some(),
                _ => jwks_url.is_some() || public_key.as_ref().is_some_and(|(a, _)| a == alg),
            };
            if !keyed {
                return Err(format!(
                    "JWT algorithm {alg:?} has no key: give {}",
                    if *alg == Algorithm::HS256 {
                        "a secret (JWT_SECRET / --jwt-secret)"
                    } else {
                        "a matching public key (JWT_PUBLIC_KEY) or a key set URL (JWT_JWKS_URL)"
                    }
                ));
            }
        }
        if algorithms.is_empty() {
            return Err("JWT algorithm auto needs a secret, a public key or a key set URL".into());
        }
        if secret.as_ref().is_some_and(|s| s.len() < 32) && algorithms.contains(&Algorithm::HS256) {
            tracing::warn!("the HS256 secret is shorter than 32 bytes; it can be guessed");
        }
        let jwks_timeout = queen_number(config.jwt_jwks_timeout_ms, "JWT_JWKS_TIMEOUT_MS", 5_000)?;
        let jwks = jwks_url
            .map(|url| keys::Jwks::new(url, Duration::from_millis(jwks_timeout)))
            .transpose()?;
        let mut validation = Validation::new(algorithms[0]);
        validation.algorithms = algorithms.clone();
        validation.leeway = queen_number(config.jwt_clock_skew, "JWT_CLOCK_SKEW", 30)?;
        validation.validate_nbf = true;
        validation.validate_aud = false;
        if let Some(iss) = queen(&config.jwt_issuer, "JWT_ISSUER") {
            validation.set_issuer(&[iss]);
            validation.required_spec_claims.insert("iss".into());
        }
        if let Some(aud) = queen(&config.jwt_audience, "JWT_AUDIENCE") {
            validation.set_audience(&[aud]);
            validation.validate_aud = true;
            validation.required_spec_claims.insert("aud".into());
        }
        let protect_metrics = config.jwt_protect_metrics.unwrap_or(false);
        let name = |v: &Option<String>, var: &str, default: &str| {
            queen(v, var).unwrap_or_else(|| default.to_string())
        };
        Ok(Some(Arc::new(Auth {
            secret: secret.map(|s| DecodingKey::from_secret(s.as_bytes())),
            public_key,
            jwks,
            jwks_every: Duration::from_secs(
                queen_number(
                    config.jwt_jwks_refresh_seconds,
                    "JWT_JWKS_REFRESH_INTERVAL",
                    3_600,
                )?
                .max(1),
            ),
            validation,
            algorithms,
            role_claim: name(&config.jwt_roles_claim, "JWT_ROLES_CLAIM", "role"),
            roles_claim: name(
                &config.jwt_roles_array_claim,
                "JWT_ROLES_ARRAY_CLAIM",
                "roles",
            ),
            role_names: [
                (
                    name(&config.jwt_role_admin, "JWT_ROLE_ADMIN", "admin"),
                    Role::Admin,
                ),
                (
                    name(
                        &config.jwt_role_read_write,
                        "JWT_ROLE_READ_WRITE",
                        "read-write",
                    ),
                    Role::ReadWrite,
                ),
                (
                    name(
                        &config.jwt_role_read_only,
                        "JWT_ROLE_READ_ONLY",
                        "read-only",
                    ),
                    Role::ReadOnly,
                ),
                (
                    name(
                        &config.jwt_role_write_only,
                        "JWT_ROLE_WRITE_ONLY",
                        "write-only",
                    ),
                    Role::WriteOnly,
                ),
            ],
            queues_claim: config.jwt_queues_claim.clone().filter(|c| !c.is_empty()),
            protect_metrics,
            skip_paths: skip_paths(
                queen(&config.jwt_skip_paths, "JWT_SKIP_PATHS"),
                protect_metrics,
            )?,
        })))
    }

    /// Fetches the key set once (so tokens verify from the first request when the provider
    /// answers) and keeps it fresh in the background. A provider down at start is not fatal:
    /// the refresh goes on trying.
    pub(crate) async fn start(&self) {
        if let Some(jwks) = &self.jwks {
            if let Err(e) = jwks.refresh().await {
                tracing::warn!(error = %e, "key set not fetched at start; retrying in the background");
            }
            tokio::spawn(jwks.clone().run(self.jwks_every));
        }
    }

    /// The claims of a token whose signature and claims are valid, or `None`. Whatever was
    /// wrong, the answer is the same.
    fn verify(&self, token: &str) -> Option<Map<String, Value>> {
        let header = jsonwebtoken::decode_header(token).ok()?;
        if !self.algorithms.contains(&header.alg) {
            return None;
        }
        let mut validation = self.validation.clone();
        validation.algorithms = vec![header.alg];
        let decode = |key: &DecodingKey| {
            jsonwebtoken::decode::<Map<String, Value>>(token, key, &validation)
                .ok()
                .map(|t| t.claims)
        };
        if header.alg == Algorithm::HS256 {
            return decode(self.secret.as_ref()?);
        }
        if let Some((alg, key)) = &self.public_key
            && *alg == header.alg
            && let Some(claims) = decode(key)
        {
            return Some(claims);
        }
        let jwks = self.jwks.as_ref()?;
        jwks.candidates(header.alg, header.kid.as_deref())
            .iter()
            .find_map(|k| decode(k))
    }

    /// The most trusted role the claims name.
    fn role(&self, claims: &Map<String, Value>) -> Option<Role> {
        let mut names: Vec<&str> = Vec::new();
        if let Some(Value::String(r)) = claims.get(&self.role_claim) {
            names.push(r);
        }
        match claims.get(&self.roles_claim) {
            Some(Value::Array(rs)) => names.extend(rs.iter().filter_map(Value::as_str)),
            Some(Value::String(r)) => names.extend(r.split([' ', ','])),
            _ => {}
        }
        names
            .iter()
            .filter_map(|n| {
                self.role_names
                    .iter()
                    .find(|(name, _)| name == n)
                    .map(|r| r.1)
            })
            .max()
    }

    /// The queue prefixes the claims limit the token to, if the scoping claim is set.
    fn queues(&self, claims: &Map<String, Value>) -> Result<Option<Arc<[String]>>, ()> {
        let Some(name) = &self.queues_claim else {
            return Ok(None);
        };
        match claims.get(name) {
            None => Ok(None),
            Some(Value::String(p)) => Ok(Some(Arc::from([p.clone()]))),
            Some(Value::Array(ps)) => ps
                .iter()
                .map(|p| p.as_str().map(str::to_string).ok_or(()))
                .collect::<Result<Vec<_>, ()>>()
                .map(|v| Some(Arc::from(v))),
            // Present but unreadable: the token is limited to nothing.
            Some(_) => Err(()),
        }
    }
}

/// Why a request may not pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Denied {
    /// No bearer token (401).
    MissingToken,
    /// A token that is not valid, whatever the reason (401).
    InvalidToken,
    /// A valid token without a role this server knows (403).
    NoRole,
    /// A role that may not use the route (403).
    RoleTooLow,
    /// A queue outside the token's scope, or a route spanning queues (403).
    OutOfScope,
}

impl Auth {
    /// Whether a request for `method path` with this `Authorization` header may pass, and
    /// as whom (`None` for public routes and skipped paths).
    pub(crate) fn admit(
        &self,
        method: &Method,
        path: &str,
        authorization: Option<&[u8]>,
    ) -> Result<Option<Principal>, Denied> {
        if required(method, path, self.protect_metrics) == Access::Public
            || self.skip_paths.iter().any(|p| p == path)
        {
            return Ok(None);
        }
        let token = bearer(authorization).ok_or(Denied::MissingToken)?;
        self.check(method, path, token).map(Some)
    }

    /// Whether `token` may use `method path` (which needs a token), and as whom: its role
    /// must allow the route and its queue scope the queue the path names.
    pub(crate) fn check(
        &self,
        method: &Method,
        path: &str,
        token: &str,
    ) -> Result<Principal, Denied> {
        let principal = self.identify(token)?;
        if !principal.may(method, path) {
            return Err(Denied::RoleTooLow);
        }
        if let Some(prefixes) = &principal.queues {
            let allowed = match queue_of(method, path) {
                QueueOf::Path(raw) => {
                    let name = percent_encoding::percent_decode_str(raw).decode_utf8_lossy();
                    prefixes.iter().any(|p| name.starts_with(p.as_str()))
                }
                QueueOf::Body => true,
                QueueOf::Unknown => false,
            };
            if !allowed {
                return Err(Denied::OutOfScope);
            }
        }
        Ok(principal)
    }

    /// Who a valid token speaks for, whatever the route: the dashboard's sign-in asks this
    /// before keeping a token.
    pub(crate) fn identify(&self, token: &str) -> Result<Principal, Denied> {
        let claims = self.verify(token).ok_or(Denied::InvalidToken)?;
        let role = self.role(&claims).ok_or(Denied::NoRole)?;
        let queues = self.queues(&claims).map_err(|()| Denied::OutOfScope)?;
        let sub = claims
            .get("sub")
            .and_then(Value::as_str)
            .map(Arc::<str>::from);
        Ok(Principal { sub, queues, role })
    }
}

/// The token of an `Authorization: Bearer …` header.
pub(crate) fn bearer(authorization: Option<&[u8]>) -> Option<&str> {
    let v = std::str::from_utf8(authorization?).ok()?;
    let (scheme, token) = v.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issuer_and_audience_become_required() {
        let config = AuthConfig {
            jwt_enabled: Some(true),
            jwt_secret: Some("0123456789abcdef0123456789abcdef".into()),
            jwt_issuer: Some("https://idp".into()),
            jwt_audience: Some("comb".into()),
            ..Default::default()
        };
        let auth = Auth::from_config(&config).unwrap().unwrap();
        for c in ["exp", "iss", "aud"] {
            assert!(
                auth.validation.required_spec_claims.contains(c),
                "{c} required"
            );
        }
    }

    #[test]
    fn skip_paths_are_paths_and_never_open_protected_metrics() {
        let list = Some(" /a , /b/c,,/metrics".to_string());
        assert_eq!(
            skip_paths(list.clone(), false).unwrap(),
            ["/a", "/b/c", "/metrics"]
        );
        assert_eq!(skip_paths(list, true).unwrap(), ["/a", "/b/c"]);
        assert!(skip_paths(Some("health".into()), false).is_err());
        assert!(skip_paths(Some("/x?y=1".into()), false).is_err());
        assert!(skip_paths(None, false).unwrap().is_empty());
    }

    #[test]
    fn a_bearer_header_yields_its_token() {
        assert_eq!(bearer(Some(b"Bearer abc ")), Some("abc"));
        assert_eq!(bearer(Some(b"bearer abc")), Some("abc"));
        assert_eq!(bearer(Some(b"Basic abc")), None);
        assert_eq!(bearer(Some(b"Bearer ")), None);
        assert_eq!(bearer(None), None);
    }

    #[test]
    fn an_algorithm_without_a_key_is_refused_at_start() {
        let config = AuthConfig {
            jwt_enabled: Some(true),
            jwt_algorithm: Some("RS256".into()),
            ..Default::default()
        };
        assert!(Auth::from_config(&config).is_err());
    }
}
