//! Encryption at rest for queues with `encryptionEnabled`: payloads are sealed with
//! AES-256-GCM (the `aes-gcm` crate) before they are stored, and opened wherever they are
//! read back (pops, dead-letter listings).
//!
//! The key comes from `COMB_ENCRYPTION_KEY` (64 hex characters; Queen's
//! `QUEEN_ENCRYPTION_KEY` is read when it is absent). For rotation, the previous key may be
//! given as `COMB_ENCRYPTION_KEY_OLD`: payloads are opened with either, new ones sealed with
//! the current one.
//!
//! A sealed payload is `0x00 0x01 nonce(12) ciphertext+tag`. Stored JSON never starts with a
//! NUL byte, so a payload says by itself whether it is sealed: a queue whose encryption is
//! switched on or off later still reads every message it holds, and reading a payload that
//! is not sealed costs one byte comparison.

use std::borrow::Cow;

use aes_gcm::aead::{Aead, AeadCore, KeyInit, OsRng};
use aes_gcm::{Aes256Gcm, Key, Nonce};
use serde_json::value::RawValue;

/// First bytes of a sealed payload: a NUL (never the start of JSON text) and the format.
const SEALED: [u8; 2] = [0x00, 0x01];
const NONCE_LEN: usize = 12;

/// The server's encryption keys: the current one seals and opens, the old one only opens.
#[derive(Default)]
pub(crate) struct Keys {
    current: Option<Aes256Gcm>,
    old: Option<Aes256Gcm>,
}

/// A stored payload that could not be read back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OpenError {
    /// Sealed, but no key of this server opens it (or it was altered).
    NoKey,
    /// Not valid JSON text once opened.
    NotJson,
}

impl Keys {
    /// Keys from the environment; an error names the variable that holds a malformed key.
    pub(crate) fn from_env() -> Result<Keys, String> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let current = match var("COMB_ENCRYPTION_KEY") {
            Some(k) => Some(("COMB_ENCRYPTION_KEY", k)),
            None => var("QUEEN_ENCRYPTION_KEY").map(|k| ("QUEEN_ENCRYPTION_KEY", k)),
        };
        let old = var("COMB_ENCRYPTION_KEY_OLD").map(|k| ("COMB_ENCRYPTION_KEY_OLD", k));
        let parse = |k: Option<(&str, String)>| -> Result<Option<Aes256Gcm>, String> {
            k.map(|(name, hex)| cipher(&hex).map_err(|e| format!("{name}: {e}")))
                .transpose()
        };
        Ok(Keys {
            current: parse(current)?,
            old: parse(old)?,
        })
    }

    /// Keys from hex text, for tests.
    #[cfg(test)]
    fn from_hex(current: Option<&str>, old: Option<&str>) -> Result<Keys, String> {
        Ok(Keys {
            current: current.map(cipher).transpose()?,
            old: old.map(cipher).transpose()?,
        })
    }

    /// Whether this server can seal payloads (it has a current key).
    pub(crate) fn can_seal(&self) -> bool {
        self.current.is_some()
    }

    /// Seals a payload with the current key; `None` without one.
    pub(crate) fn seal(&self, plain: &[u8]) -> Option<Vec<u8>> {
        let cipher = self.current.as_ref()?;
        let nonce = Aes256Gcm::generate_nonce(&mut OsRng);
        let sealed = cipher
            .encrypt(&nonce, plain)
            .expect("AES-GCM encryption of an in-memory buffer does not fail");
        let mut out = Vec::with_capacity(SEALED.len() + NONCE_LEN + sealed.len());
        out.extend_from_slice(&SEALED);
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&sealed);
        Some(out)
    }

    /// The plain payload: the stored bytes themselves unless they are sealed.
    pub(crate) fn open<'a>(&self, stored: &'a [u8]) -> Result<Cow<'a, [u8]>, OpenError> {
        if !stored.starts_with(&SEALED) {
            return Ok(Cow::Borrowed(stored));
        }
        let rest = &stored[SEALED.len()..];
        if rest.len() < NONCE_LEN {
            return Err(OpenError::NoKey);
        }
        let (nonce, sealed) = rest.split_at(NONCE_LEN);
        let nonce = Nonce::from_slice(nonce);
        [&self.current, &self.old]
            .into_iter()
            .flatten()
            .find_map(|c| c.decrypt(nonce, sealed).ok())
            .map(Cow::Owned)
            .ok_or(OpenError::NoKey)
    }

    /// The plain payload as JSON text.
    pub(crate) fn open_json(&self, stored: &[u8]) -> Result<Box<RawValue>, OpenError> {
        let plain = self.open(stored)?;
        let text = String::from_utf8(plain.into_owned()).map_err(|_| OpenError::NotJson)?;
        RawValue::from_string(text).map_err(|_| OpenError::NotJson)
    }
}

/// An AES-256-GCM cipher from 64 hex characters.
fn cipher(hex: &str) -> Result<Aes256Gcm, String> {
    let hex = hex.trim();
    if hex.len() != 64 {
        return Err(format!(
            "an encryption key must be 64 hex characters (32 bytes), got {} characters",
            hex.len()
        ));
    }
    let mut key = [0u8; 32];
    for (i, byte) in key.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16)
            .map_err(|_| "an encryption key must be hex characters (0-9, a-f)".to_string())?;
    }
    Ok(Aes256Gcm::new(Key::<Aes256Gcm>::from_slice(&key)))
}

#[cfg(test)]
mod tests {
    use super::*;

    const K1: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
    const K2: &str = "ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100";

    #[test]
    fn sealed_payloads_open_with_the_current_or_the_old_key() {
        let keys = Keys::from_hex(Some(K1), None).unwrap();
        let sealed = keys.seal(br#"{"secret":1}"#).unwrap();
        assert!(sealed.starts_with(&SEALED));
        assert!(!sealed.windows(6).any(|w| w == b"secret"));
        assert_eq!(keys.open_json(&sealed).unwrap().get(), r#"{"secret":1}"#);
        // Rotated: K2 current, K1 old.
        let rotated = Keys::from_hex(Some(K2), Some(K1)).unwrap();
        assert_eq!(&*rotated.open(&sealed).unwrap(), br#"{"secret":1}"#);
        // Without the key that sealed it, nothing opens.
        let other = Keys::from_hex(Some(K2), None).unwrap();
        assert_eq!(other.open(&sealed), Err(OpenError::NoKey));
        assert_eq!(Keys::default().open(&sealed), Err(OpenError::NoKey));
        // A payload altered in storage does not open.
        let mut altered = sealed.clone();
        *altered.last_mut().unwrap() ^= 1;
        assert_eq!(keys.open(&altered), Err(OpenError::NoKey));
    }

    #[test]
    fn plain_payloads_read_as_they_are() {
        let keys = Keys::default();
        assert!(matches!(keys.open(b"[1,2]").unwrap(), Cow::Borrowed(_)));
        assert!(keys.seal(b"1").is_none());
    }

    #[test]
    fn malformed_keys_are_refused() {
        assert!(Keys::from_hex(Some("abc"), None).is_err());
        assert!(Keys::from_hex(Some(&"zz".repeat(32)), None).is_err());
        assert!(Keys::from_hex(None, Some(&"0".repeat(63))).is_err());
        assert!(Keys::from_hex(Some(&K1.to_uppercase()), None).is_ok());
    }
}
