//! Bearer tokens for a server that requires them: the valid one most cases carry, and broken
//! ones that must all be refused the same way (401) on every route but the public ones.

use serde_json::{Value, json};

/// The HS256 secret of a server fuzzed with tokens.
pub const TOKEN_SECRET: &str = "comb-audit-fuzz-secret-of-more-than-32-bytes";

/// `Authorization` headers for a server that requires tokens: a valid administrator's, and
/// broken ones that must all be refused the same way.
pub struct Tokens {
    /// `Bearer <a valid admin token>`.
    pub valid: Vec<u8>,
    pub broken: Vec<(&'static str, Vec<u8>)>,
}

impl Tokens {
    /// Headers for a server verifying HS256 tokens with [`TOKEN_SECRET`].
    pub fn new() -> Tokens {
        use base64::Engine as _;
        let b64 = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock after 1970")
            .as_secs();
        let sign = |claims: Value, secret: &str| {
            jsonwebtoken::encode(
                &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
                &claims,
                &jsonwebtoken::EncodingKey::from_secret(secret.as_bytes()),
            )
            .expect("token")
        };
        let claims = json!({"sub": "fuzz", "role": "admin", "exp": now + 86_400});
        let valid = sign(claims.clone(), TOKEN_SECRET);
        let bearer = |t: &str| format!("Bearer {t}").into_bytes();
        let mut expired = claims.clone();
        expired["exp"] = json!(now - 3_600);
        let none = format!(
            "{}.{}.",
            b64(br#"{"alg":"none","typ":"JWT"}"#),
            b64(claims.to_string().as_bytes())
        );
        let mut tampered = valid.clone();
        tampered.pop();
        tampered.push(if valid.ends_with('A') { 'B' } else { 'A' });
        Tokens {
            broken: vec![
                ("empty bearer", b"Bearer ".to_vec()),
                ("other scheme", format!("Basic {valid}").into_bytes()),
                ("garbage", bearer("not.a.token")),
                ("expired", bearer(&sign(expired, TOKEN_SECRET))),
                (
                    "wrong key",
                    bearer(&sign(claims, "another-secret-of-more-than-32-bytes!!")),
                ),
                ("alg none", bearer(&none)),
                ("tampered", bearer(&tampered)),
                ("long", bearer(&"x".repeat(6_000))),
                ("not utf-8", b"Bearer \xff\xfe\x80token".to_vec()),
            ],
            valid: bearer(&valid),
        }
    }
}

impl Default for Tokens {
    fn default() -> Tokens {
        Tokens::new()
    }
}

/// Routes that answer without a token.
pub fn is_public(target: &str) -> bool {
    let path = target.split('?').next().unwrap_or(target);
    matches!(path, "/health" | "/ready" | "/metrics")
}
