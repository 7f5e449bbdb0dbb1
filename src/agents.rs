//! Agent keys: the credentials internal clients present to rota (`rk_…`). Only a SHA-256
//! digest is stored; the key itself is shown once, when it is created.

use crate::engine::Millis;
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chacha20poly1305::aead::{OsRng, rand_core::RngCore};
use secrecy::{ExposeSecret, SecretString};
use serde::Serialize;
use sha2::{Digest, Sha256};

pub const KEY_PREFIX: &str = "rk_";

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Agent {
    pub id: String,
    pub name: String,
    pub admin: bool,
    pub created_at: Millis,
    pub revoked_at: Option<Millis>,
}

/// A new random agent key: `rk_` and 32 random bytes in URL-safe base64.
pub fn new_key() -> SecretString {
    let mut bytes = [0u8; 32];
    OsRng.fill_bytes(&mut bytes);
    SecretString::from(format!("{KEY_PREFIX}{}", URL_SAFE_NO_PAD.encode(bytes)))
}

/// The stored form of a key.
pub fn digest(key: &SecretString) -> String {
    digest_of(key.expose_secret())
}

/// [`digest`] of a key as presented (borrowed from the request's headers): SHA-256 in
/// lower-case hex.
pub fn digest_of(key: &str) -> String {
    format!("{:x}", Sha256::digest(key.as_bytes()))
}

/// Agent names: a-z, 0-9, `-`, `_`, at most 64 (they name `[agents.NAME]` config sections).
pub fn valid_name(name: &str) -> bool {
    crate::engine::profile::valid_provider_name(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_random_prefixed_and_digested_stably() {
        let (a, b) = (new_key(), new_key());
        assert!(a.expose_secret().starts_with("rk_"));
        assert_eq!(a.expose_secret().len(), 46);
        assert_ne!(a.expose_secret(), b.expose_secret());
        assert_eq!(digest(&a), digest(&SecretString::from(a.expose_secret().to_string())));
        assert_eq!(digest(&a).len(), 64);
    }

    #[test]
    fn agent_names_are_config_section_safe() {
        assert!(valid_name("planner") && valid_name("ci-bot_2"));
        assert!(!valid_name("Planner") && !valid_name("a b") && !valid_name(""));
    }
}
