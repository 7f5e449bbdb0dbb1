//! Agent keys: the credentials internal clients present to rota (`rk_…`). Only a SHA-256
//! digest is stored; the key itself is shown once, when it is created.

use crate::engine::Millis;
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chacha20poly1305::aead::{OsRng, rand_core::RngCore};
use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

pub const KEY_PREFIX: &str = "rk_";

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Agent {
    pub id: String,
    pub name: String,
    pub admin: bool,
    pub created_at: Millis,
    pub revoked_at: Option<Millis>,
    /// The limits stored with the agent (admin API); a key of `[agents.NAME]` in the config
    /// file wins over the stored value ([`Limits::over`]).
    pub limits: Limits,
    /// The models it may ask for, stored (admin API, CLI); `None`: any. `[agents.NAME] models`
    /// in the config file wins (docs/config.md).
    pub models: Option<Vec<String>>,
}

/// The limits' windows: clock-aligned minutes, and UTC days.
pub const MINUTE: Millis = 60_000;
pub const DAY: Millis = 86_400_000;

/// The start of the clock-aligned minute `t` falls in.
pub fn minute_start(t: Millis) -> Millis {
    t.div_euclid(MINUTE) * MINUTE
}

/// The start (00:00 UTC) of the day `t` falls in.
pub fn day_start(t: Millis) -> Millis {
    t.div_euclid(DAY) * DAY
}

/// An agent's budgets (docs/config.md): `None` = no limit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Limits {
    /// Requests admitted per clock-aligned minute, counted across every server (at least 1).
    pub requests_per_minute: Option<i64>,
    /// Input and output tokens per UTC day (at least 1).
    pub tokens_per_day: Option<i64>,
    /// USD per UTC day (more than 0).
    pub cost_per_day: Option<f64>,
}

impl Limits {
    /// These limits with each key `config` sets replacing the stored one.
    pub fn over(self, config: &Limits) -> Limits {
        Limits {
            requests_per_minute: config.requests_per_minute.or(self.requests_per_minute),
            tokens_per_day: config.tokens_per_day.or(self.tokens_per_day),
            cost_per_day: config.cost_per_day.or(self.cost_per_day),
        }
    }

    /// Each limit that is set and out of range, as `key: why` (`at` prefixes the key).
    pub fn problems(&self, at: &str) -> Vec<String> {
        let mut out = Vec::new();
        if self.requests_per_minute.is_some_and(|n| n < 1) {
            out.push(format!("{at}requests_per_minute: must be an integer of at least 1"));
        }
        if self.tokens_per_day.is_some_and(|n| n < 1) {
            out.push(format!("{at}tokens_per_day: must be an integer of at least 1"));
        }
        if self.cost_per_day.is_some_and(|c| !(c.is_finite() && c > 0.0)) {
            out.push(format!("{at}cost_per_day: must be a number of USD above 0"));
        }
        out
    }

    /// The limits that are set, as people read them (`5 requests/min, 2.5 USD/day`); `None`
    /// when there is none.
    pub fn describe(&self) -> Option<String> {
        let mut text = Vec::new();
        text.extend(self.requests_per_minute.map(|n| format!("{n} requests/min")));
        text.extend(self.tokens_per_day.map(|n| format!("{n} tokens/day")));
        text.extend(self.cost_per_day.map(|c| format!("{c} USD/day")));
        (!text.is_empty()).then(|| text.join(", "))
    }

    /// The names of the limits that are set.
    pub fn keys(&self) -> Vec<&'static str> {
        let mut out = Vec::new();
        if self.requests_per_minute.is_some() {
            out.push("requests_per_minute");
        }
        if self.tokens_per_day.is_some() {
            out.push("tokens_per_day");
        }
        if self.cost_per_day.is_some() {
            out.push("cost_per_day");
        }
        out
    }
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
