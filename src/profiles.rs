//! Profile changes, shared by the CLI and the admin API: the rules that check their input (so
//! that both refuse the same input with the same words), and `Changes`, the one place each
//! change is carried out.

use crate::book::{Book, Credential, Roster};
use crate::config::Config;
use crate::engine::{Change, Millis, ProfileId, ProfileType};
use crate::secrets::{Sealed, SecretField};
use crate::store::{ProfileFlag, Store, StoreError, StoredProfile};
use secrecy::SecretString;

/// Where a profile change goes: the store, then the running book when there is one (a server's;
/// the CLI has none, and servers take its changes from the change feed), then a flush where the
/// book's own writes must reach the store first.
pub struct Changes<'a> {
    store: &'a dyn Store,
    book: Option<&'a Book>,
}

impl<'a> Changes<'a> {
    pub fn new(store: &'a dyn Store, book: Option<&'a Book>) -> Changes<'a> {
        Changes { store, book }
    }

    /// Adds a stored profile with its sealed secret; it rotates at once.
    pub async fn add(
        &self,
        profile: &StoredProfile,
        sealed: &[Sealed],
        credential: Credential,
    ) -> Result<(), StoreError> {
        self.store.add_profile(profile, sealed).await?;
        if let Some(book) = self.book {
            book.add_profile(profile, credential);
        }
        Ok(())
    }

    /// Removes a stored profile and its secret: out of rotation first, then its pending stats
    /// written, then out of its provider's stored order, then the rows deleted.
    pub async fn remove(&self, id: &ProfileId) -> Result<(), StoreError> {
        let order = match self.book {
            Some(book) => {
                let order = book.roster().orders.get(id.provider()).cloned();
                book.remove_profile(id);
                book.flush().await;
                order
            }
            None => self.store.snapshot().await?.orders.remove(id.provider()),
        };
        if let Some(order) = order.filter(|o| o.contains(id)) {
            let rest: Vec<ProfileId> = order.into_iter().filter(|p| p != id).collect();
            self.store.set_order(id.provider(), (!rest.is_empty()).then_some(rest.as_slice())).await?;
        }
        self.store.remove_profile(id).await
    }

    pub async fn set_enabled(&self, id: &ProfileId, enabled: bool) -> Result<(), StoreError> {
        self.store.set_flag(id, ProfileFlag::Enabled, enabled).await?;
        if let Some(book) = self.book {
            book.set_enabled(id, enabled);
        }
        Ok(())
    }

    /// Marks the profile as costing money per call, or not (the `paid` alert).
    pub async fn set_paid(&self, id: &ProfileId, paid: bool) -> Result<(), StoreError> {
        self.store.set_flag(id, ProfileFlag::Paid, paid).await?;
        if let Some(book) = self.book {
            book.set_paid(id, paid);
        }
        Ok(())
    }

    /// Ends the profile's cooldowns and disabled windows.
    pub async fn clear(&self, config: &Config, id: &ProfileId, now: Millis) -> Result<(), StoreError> {
        let found = match self.book {
            Some(book) => {
                let found = book.clear(id, now);
                book.flush().await;
                found
            }
            None => {
                let cleared = [(id.clone(), vec![Change::Cleared(now)])];
                !self.store.apply(&cleared, &[], &[], &config.cooldown_policy()).await?.stats.is_empty()
            }
        };
        if found { Ok(()) } else { Err(StoreError::NotFound(id.clone())) }
    }

    /// Sets (`None`: removes) a provider's stored order.
    pub async fn set_order(&self, provider: &str, ids: Option<Vec<ProfileId>>) -> Result<(), StoreError> {
        self.store.set_order(provider, ids.as_deref()).await?;
        if let Some(book) = self.book {
            book.set_order(provider, ids);
        }
        Ok(())
    }
}

/// A profile that may be added: its id, type, the field its secret goes in, and its expiry.
#[derive(Debug)]
pub struct NewProfile {
    pub id: ProfileId,
    pub kind: ProfileType,
    pub field: SecretField,
    pub expires_at: Option<Millis>,
}

pub fn known_provider(config: &Config, provider: &str) -> Result<(), String> {
    if config.has_provider(provider) {
        return Ok(());
    }
    let known: Vec<&str> = config.providers.keys().map(String::as_str).collect();
    Err(format!(
        "unknown provider `{provider}`: configure [providers.{provider}] first (configured: {})",
        if known.is_empty() { "none".to_string() } else { known.join(", ") }
    ))
}

/// Checks a new API key or token profile. `expires` is RFC 3339 and only for tokens.
pub fn check_new(
    config: &Config,
    provider: &str,
    name: &str,
    kind: &str,
    expires: Option<&str>,
    now: Millis,
) -> Result<NewProfile, String> {
    known_provider(config, provider)?;
    let id = ProfileId::new(provider, name).map_err(|e| e.to_string())?;
    let kind: ProfileType = kind.parse()?;
    let field = match kind {
        ProfileType::ApiKey => SecretField::ApiKey,
        ProfileType::Token => SecretField::Token,
        ProfileType::OAuth => return Err(format!("OAuth profiles are added by logging in (`rota login {provider}`)")),
        ProfileType::ClientCredentials | ProfileType::ServiceAccount
            if config.providers[provider].client_credentials.is_none() =>
        {
            return Err(format!(
                "provider {provider} has no token endpoint for {kind} profiles: set \
                 [providers.{provider}.client_credentials] (token_url, scopes), or a preset that does (docs/providers.md)"
            ));
        }
        ProfileType::ClientCredentials => SecretField::ClientSecret,
        ProfileType::ServiceAccount => SecretField::ServiceAccountKey,
    };
    let expires_at = match expires {
        None => None,
        Some(_) if kind != ProfileType::Token => return Err("an expiry applies to token profiles only".into()),
        Some(raw) => {
            let at = chrono::DateTime::parse_from_rfc3339(raw)
                .map_err(|_| format!("expiry `{raw}` is not an RFC 3339 time (e.g. 2026-12-31T23:59:59Z)"))?
                .timestamp_millis();
            if at <= now {
                return Err(format!("expiry {raw} is in the past: the token would never be used"));
            }
            Some(at)
        }
    };
    if config.auth.profiles.contains_key(&id) {
        return Err(format!("profile {id} is declared in the config file; choose another name"));
    }
    Ok(NewProfile { id, kind, field, expires_at })
}

/// Checks a pasted secret: surrounding whitespace is trimmed; what remains must be visible
/// ASCII (`!` to `~`): inner whitespace, control or non-ASCII characters mean a paste went wrong,
/// and no provider issues such keys (they could not travel in an HTTP header either).
pub fn check_secret(
    raw: &str,
    kind: ProfileType,
    name: &str,
    allow_token_uri: Option<&str>,
) -> Result<SecretString, String> {
    if kind == ProfileType::ServiceAccount {
        let key = crate::oauth::service_account::Key::parse(raw).map_err(|e| format!("{e}: nothing was added"))?;
        key.check_token_uri(allow_token_uri).map_err(|e| format!("{e}: nothing was added"))?;
        if key.client_email != name {
            return Err(format!(
                "a service_account profile is named after its key's client_email: name it `{}`",
                key.client_email.escape_default()
            ));
        }
        return Ok(SecretString::from(raw.trim().to_string()));
    }
    let what = match kind {
        ProfileType::Token => "token",
        ProfileType::ClientCredentials => "client secret",
        _ => "API key",
    };
    let trimmed = raw.trim();
    if trimmed.is_empty() {
        return Err(format!("empty {what}: nothing was added"));
    }
    if let Some(bad) = crate::secrets::invisible(trimmed) {
        return Err(format!("the {what} contains {bad}: nothing was added (a secret is visible ASCII)"));
    }
    Ok(SecretString::from(trimmed.to_string()))
}

/// Checks an explicit order: known profiles of this provider, each once.
pub fn check_order(config: &Config, roster: &Roster, provider: &str, raw: &[String]) -> Result<Vec<ProfileId>, String> {
    known_provider(config, provider)?;
    if raw.is_empty() {
        return Err("an order names at least one profile (remove the order to go back to round robin)".into());
    }
    let mut ids = Vec::with_capacity(raw.len());
    for r in raw {
        let id: ProfileId = r.parse().map_err(|e: crate::engine::profile::BadProfileId| e.to_string())?;
        if id.provider() != provider {
            return Err(format!("{id} belongs to provider {}, not {provider}", id.provider()));
        }
        if !roster.views.contains_key(&id) {
            return Err(format!("profile {id} does not exist"));
        }
        if ids.contains(&id) {
            return Err(format!("{id} is listed twice"));
        }
        ids.push(id);
    }
    Ok(ids)
}

/// Where the order of a provider comes from, and the ids it names (empty for round robin).
pub fn order_in_force(config: &Config, roster: &Roster, provider: &str) -> (&'static str, Vec<ProfileId>) {
    match (roster.orders.get(provider), config.auth.order.get(provider)) {
        (Some(o), _) if !o.is_empty() => ("stored", o.clone()),
        (_, Some(o)) if !o.is_empty() => ("config", o.clone()),
        _ => ("round_robin", vec![]),
    }
}

/// A provider's profiles in the order the engine would try them now (`GET /api/v1/providers`,
/// `rota profiles list`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rotation {
    /// The model the order is for: the provider's first model in the default chain
    /// (`models.primary`, then `models.fallbacks`), as `provider/model`; `None` when the chain
    /// never reaches the provider (then only profile-wide windows count).
    pub model: Option<String>,
    /// Usable profiles first (as a request would try them), then the blocked ones (soonest end
    /// first), then those rotation never uses (disabled by an admin, no secret, an expired
    /// token, left out of an explicit order), sorted by id.
    pub order: Vec<ProfileId>,
    /// The first usable profile: the one the next request would use. `None` when every profile
    /// is blocked or unusable.
    pub next: Option<ProfileId>,
}

impl Rotation {
    /// The rotation of `provider` at `now`, without a session or a pin. `Book::pick` orders the
    /// same way (its fast path, `RotationIndex::first`, keeps the same keys).
    pub fn of(config: &Config, roster: &Roster, provider: &str, now: Millis) -> Rotation {
        let model = config
            .chain(&crate::engine::chain::ChainRequest { failover: true, ..Default::default() })
            .ok()
            .and_then(|chain| chain.into_iter().find(|c| c.provider == provider));
        let bare = model.as_ref().map_or("", |c| c.model.as_str());
        let slots = roster.order(config, provider, bare, None, None, now).map(|o| o.slots).unwrap_or_default();
        let next = slots.iter().find(|s| s.blocked.is_none()).map(|s| s.id.clone());
        let mut order: Vec<ProfileId> = slots.into_iter().map(|s| s.id).collect();
        let listed: std::collections::HashSet<&ProfileId> = order.iter().collect();
        let mut rest: Vec<&ProfileId> =
            roster.views.keys().filter(|id| id.provider() == provider && !listed.contains(id)).collect();
        rest.sort();
        let rest: Vec<ProfileId> = rest.into_iter().cloned().collect();
        order.extend(rest);
        Rotation { model: model.map(|c| c.label()), order, next }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_is_visible_ascii_and_the_error_never_echoes_it() {
        assert!(check_secret("  sk-live-abc123~!  \n", ProfileType::ApiKey, "k", None).is_ok());
        for (raw, why) in [
            ("sk-live abc", "whitespace"),
            ("sk-live\u{7}abc", "a control character"),
            ("sk-clé-abc", "a non-ASCII character"),
            ("sk-\u{200b}zero-width", "a non-ASCII character"),
        ] {
            let err = check_secret(raw, ProfileType::ApiKey, "k", None).unwrap_err();
            assert!(err.contains(why) && !err.contains("sk-"), "{raw:?}: {err}");
        }
        assert!(check_secret(" \n", ProfileType::Token, "k", None).unwrap_err().starts_with("empty token"));
    }
}
