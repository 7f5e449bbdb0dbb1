//! Profile identity and the facts about a profile that ordering needs.

use super::{Millis, UsageStats};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// Every profile's view by id, as ordering reads it. foldhash rather than SipHash: the keys are
/// operator-chosen profile ids, and lookups are most of an ordering's cost.
pub type Views = std::collections::HashMap<ProfileId, ProfileView, foldhash::fast::RandomState>;

/// `provider:name`, e.g. `openai:work` or `corp:ana@example.com`. Shared, so that a clone (each
/// ordering hands out many) does not allocate.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ProfileId(std::sync::Arc<str>);

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BadProfileId {
    #[error("malformed profile id `{0}`: expected `provider:name`, e.g. `openai:work`")]
    Shape(String),
    #[error("malformed profile id `{0}`: the provider part may only hold a-z, 0-9, `-` and `_`")]
    Provider(String),
    #[error("malformed profile id `{0}`: the name may not contain whitespace or control characters")]
    Name(String),
}

/// Provider names: lower-case letters, digits, `-` and `_` (they appear in URLs and env names).
pub fn valid_provider_name(p: &str) -> bool {
    !p.is_empty()
        && p.len() <= 64
        && p.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
}

impl ProfileId {
    pub fn new(provider: &str, name: &str) -> Result<Self, BadProfileId> {
        format!("{provider}:{name}").parse()
    }

    pub fn provider(&self) -> &str {
        self.0.split_once(':').map_or("", |(p, _)| p)
    }

    pub fn name(&self) -> &str {
        self.0.split_once(':').map_or("", |(_, n)| n)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl FromStr for ProfileId {
    type Err = BadProfileId;
    fn from_str(s: &str) -> Result<Self, BadProfileId> {
        let (provider, name) = s.split_once(':').ok_or_else(|| BadProfileId::Shape(s.to_string()))?;
        if name.is_empty() || name.len() > 256 {
            return Err(BadProfileId::Shape(s.to_string()));
        }
        if !valid_provider_name(provider) {
            return Err(BadProfileId::Provider(s.to_string()));
        }
        if name.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(BadProfileId::Name(s.to_string()));
        }
        Ok(ProfileId(s.into()))
    }
}

impl TryFrom<String> for ProfileId {
    type Error = BadProfileId;
    fn try_from(s: String) -> Result<Self, BadProfileId> {
        s.parse()
    }
}

impl From<ProfileId> for String {
    fn from(id: ProfileId) -> String {
        id.0.to_string()
    }
}

impl fmt::Display for ProfileId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The kind of credential. The declaration order is the round-robin secondary key:
/// subscription accounts (OAuth) before static tokens before pay-per-use API keys and service
/// identities (client credentials).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProfileType {
    #[serde(rename = "oauth")]
    OAuth,
    Token,
    ApiKey,
    /// An OAuth client (id and secret) that rota exchanges for access tokens itself.
    ClientCredentials,
    /// A Google service account: its key signs the assertion rota exchanges for access tokens.
    ServiceAccount,
}

impl ProfileType {
    pub fn as_str(self) -> &'static str {
        match self {
            ProfileType::OAuth => "oauth",
            ProfileType::Token => "token",
            ProfileType::ApiKey => "api_key",
            ProfileType::ClientCredentials => "client_credentials",
            ProfileType::ServiceAccount => "service_account",
        }
    }
}

impl FromStr for ProfileType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "oauth" => Ok(ProfileType::OAuth),
            "token" => Ok(ProfileType::Token),
            "api_key" => Ok(ProfileType::ApiKey),
            "client_credentials" => Ok(ProfileType::ClientCredentials),
            "service_account" => Ok(ProfileType::ServiceAccount),
            other => Err(format!(
                "unknown profile type `{other}` (expected api_key, token, oauth, client_credentials or service_account)"
            )),
        }
    }
}

impl fmt::Display for ProfileType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What ordering needs to know about one profile: no secret, only whether one is usable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProfileView {
    pub id: ProfileId,
    pub kind: ProfileType,
    /// An admin has not disabled it.
    pub enabled: bool,
    /// It holds a usable secret: an API key, a token, or an OAuth access or refresh token.
    pub has_secret: bool,
    /// Static tokens: when the token stops working.
    pub expires_at: Option<Millis>,
    pub stats: UsageStats,
}

/// Why a profile cannot be used at all (not a cooldown: these never pass by themselves).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unusable {
    DisabledByAdmin,
    NoSecret,
    TokenExpired,
}

impl fmt::Display for Unusable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Unusable::DisabledByAdmin => "disabled by an admin",
            Unusable::NoSecret => "no usable secret",
            Unusable::TokenExpired => "token expired",
        })
    }
}

impl ProfileView {
    pub fn unusable(&self, now: Millis) -> Option<Unusable> {
        if !self.enabled {
            Some(Unusable::DisabledByAdmin)
        } else if !self.has_secret {
            Some(Unusable::NoSecret)
        } else if self.kind == ProfileType::Token && self.expires_at.is_some_and(|e| e <= now) {
            Some(Unusable::TokenExpired)
        } else {
            None
        }
    }

    /// Whether the profile can serve `model` at `now`: usable, and no window over the model.
    pub fn serves(&self, model: &str, now: Millis) -> bool {
        self.unusable(now).is_none() && self.stats.blocked_until(model, now).is_none()
    }
}

/// An OAuth access token's refresh window (`refresh.lead`, docs/api.md): from `lead` before it
/// expires on. A token inside it is refreshed before it is used; one before it is fresh.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RefreshWindow {
    /// When the access token expires.
    pub expires_at: Millis,
    /// How long before `expires_at` the window opens.
    pub lead: Millis,
}

impl RefreshWindow {
    /// Whether the token is due for a refresh at `now`: `lead` or less is left of it (or it
    /// has expired).
    pub fn active(&self, now: Millis) -> bool {
        self.expires_at - now <= self.lead
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_due_for_refresh_from_lead_before_it_expires() {
        let w = RefreshWindow { expires_at: 1_000_000, lead: 300_000 };
        assert!(!w.active(699_999), "more than the lead left: fresh");
        assert!(w.active(700_000), "exactly the lead left: due");
        assert!(w.active(1_000_000) && w.active(2_000_000), "expired: due");
        assert!(RefreshWindow { lead: 0, ..w }.active(1_000_000));
    }

    #[test]
    fn profile_id_splits_at_the_first_colon() {
        let id: ProfileId = "corp:ana@example.com".parse().unwrap();
        assert_eq!((id.provider(), id.name()), ("corp", "ana@example.com"));
        let id: ProfileId = "x:a:b".parse().unwrap();
        assert_eq!((id.provider(), id.name()), ("x", "a:b"));
    }

    #[test]
    fn malformed_profile_ids_are_refused_with_the_reason() {
        assert!(matches!("openai".parse::<ProfileId>(), Err(BadProfileId::Shape(_))));
        assert!(matches!("openai:".parse::<ProfileId>(), Err(BadProfileId::Shape(_))));
        assert!(matches!(":work".parse::<ProfileId>(), Err(BadProfileId::Provider(_))));
        assert!(matches!("Open AI:work".parse::<ProfileId>(), Err(BadProfileId::Provider(_))));
        assert!(matches!("openai:my key".parse::<ProfileId>(), Err(BadProfileId::Name(_))));
    }

    #[test]
    fn profile_types_sort_oauth_token_api_key() {
        let mut v = vec![ProfileType::ApiKey, ProfileType::OAuth, ProfileType::Token];
        v.sort();
        assert_eq!(v, [ProfileType::OAuth, ProfileType::Token, ProfileType::ApiKey]);
        assert_eq!("api_key".parse::<ProfileType>(), Ok(ProfileType::ApiKey));
        assert!("key".parse::<ProfileType>().is_err());
    }
}
