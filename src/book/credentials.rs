//! The profiles' decrypted secrets, and the OAuth tokens a login or a refresh puts in force.

use super::Book;
use crate::engine::{Millis, ProfileId, ProfileType, ProfileView};
use crate::store::StoredProfile;
use secrecy::{ExposeSecret, SecretString};

/// The secret of one profile, decrypted. `SecretString` never prints its content.
#[derive(Clone, Debug)]
pub enum Credential {
    ApiKey(SecretString),
    Token(SecretString),
    OAuth {
        access: Option<SecretString>,
        refresh: Option<SecretString>,
    },
    /// A service identity rota exchanges for access tokens itself (docs/providers.md): an OAuth
    /// client's secret (the client id is the profile's name), or a service account's JSON key.
    Client {
        access: Option<SecretString>,
        secret: SecretString,
        how: Exchange,
    },
}

/// How a service identity gets its access tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exchange {
    /// OAuth 2.0 client credentials (RFC 6749 §4.4): the client id and secret.
    ClientSecret,
    /// A JWT assertion signed with a service account's key (RFC 7523), Google's way.
    ServiceAccount,
}

impl Exchange {
    pub fn kind(self) -> ProfileType {
        match self {
            Exchange::ClientSecret => ProfileType::ClientCredentials,
            Exchange::ServiceAccount => ProfileType::ServiceAccount,
        }
    }

    /// The field its secret is sealed as.
    pub fn field(self) -> crate::secrets::SecretField {
        match self {
            Exchange::ClientSecret => crate::secrets::SecretField::ClientSecret,
            Exchange::ServiceAccount => crate::secrets::SecretField::ServiceAccountKey,
        }
    }
}

impl Credential {
    /// The credential of a profile added with one secret: an API key, a token, or a client's
    /// secret (exchanged for an access token at its first use).
    pub fn new(kind: ProfileType, secret: SecretString) -> Credential {
        match kind {
            ProfileType::Token => Credential::Token(secret),
            ProfileType::ClientCredentials => Credential::Client { access: None, secret, how: Exchange::ClientSecret },
            ProfileType::ServiceAccount => Credential::Client { access: None, secret, how: Exchange::ServiceAccount },
            _ => Credential::ApiKey(secret),
        }
    }

    /// The secrets an upstream could echo back: the ones rota sends.
    pub fn secrets(&self) -> Vec<&str> {
        match self {
            Credential::ApiKey(s) | Credential::Token(s) => vec![s.expose_secret()],
            Credential::OAuth { access, refresh } => {
                access.iter().chain(refresh.iter()).map(|s| s.expose_secret()).collect()
            }
            Credential::Client { access, secret, .. } => {
                access.iter().chain([secret]).map(|s| s.expose_secret()).collect()
            }
        }
    }
}

impl Book {
    pub fn credential(&self, id: &ProfileId) -> Option<Credential> {
        self.lock().credentials.get(id).cloned()
    }
    /// When the profile's credential stops working, if known.
    pub fn expires_at(&self, id: &ProfileId) -> Option<Millis> {
        self.lock().roster.views.get(id).and_then(|v| v.expires_at)
    }
    /// An OAuth login or refresh: the profile (added if new) gets these tokens; a known profile
    /// keeps its enabled flag and stats. `version` is the nonce of the sealed refresh token now
    /// stored.
    pub fn set_tokens(&self, profile: &StoredProfile, credential: Credential, version: Option<Vec<u8>>) {
        let mut inner = self.lock();
        inner.local_edits += 1;
        inner.forget_order();
        let stats = inner.roster.views.get(&profile.id).map(|v| v.stats.clone()).unwrap_or_default();
        let enabled = inner.roster.views.get(&profile.id).map_or(profile.enabled, |v| v.enabled);
        let view = ProfileView {
            id: profile.id.clone(),
            kind: ProfileType::OAuth,
            enabled,
            has_secret: true,
            expires_at: profile.expires_at,
            stats,
        };
        inner.roster.views.insert(profile.id.clone(), view);
        if let Some(email) = &profile.email {
            inner.roster.emails.insert(profile.id.clone(), email.clone());
        }
        let ids = inner.roster.stored_ids.entry(profile.id.provider().to_string()).or_default();
        if !ids.contains(&profile.id) {
            ids.push(profile.id.clone());
        }
        inner.credentials.insert(profile.id.clone(), credential);
        match version {
            Some(v) => inner.token_versions.insert(profile.id.clone(), v),
            None => inner.token_versions.remove(&profile.id),
        };
    }
    /// An OAuth or client-credentials profile's credential, expiry and token version.
    pub fn tokens(&self, id: &ProfileId) -> Option<(Credential, Option<Millis>, Option<Vec<u8>>)> {
        let inner = self.lock();
        let cred = inner
            .credentials
            .get(id)
            .filter(|c| matches!(c, Credential::OAuth { .. } | Credential::Client { .. }))?
            .clone();
        let expires = inner.roster.views.get(id).and_then(|v| v.expires_at);
        Some((cred, expires, inner.token_versions.get(id).cloned()))
    }
    /// OAuth profiles in use whose access token expires before `until`.
    pub fn expiring(&self, until: Millis) -> Vec<ProfileId> {
        let inner = self.lock();
        inner
            .roster
            .views
            .values()
            .filter(|v| {
                matches!(v.kind, ProfileType::OAuth | ProfileType::ClientCredentials | ProfileType::ServiceAccount)
            })
            .filter(|v| v.enabled && v.expires_at.is_some_and(|e| e < until))
            .filter(|v| v.stats.disabled.is_none())
            .map(|v| v.id.clone())
            .collect()
    }
}
