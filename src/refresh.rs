//! OAuth access tokens kept fresh (docs/api.md): refreshed `refresh.lead` before they expire (on
//! the request path and by a background sweep) and after a 401. One refresh at a time per
//! profile; callers that waited get the refreshed token. The new tokens are written with a
//! compare-and-swap, and a refused refresh token (`invalid_grant`) first re-reads the store,
//! since a sibling instance may have rotated it, before the profile is disabled as
//! `auth_permanent` ("needs re-login").
//!
//! Across instances sharing a database, a refresh claim in the database (`refresh_claims`) lets
//! one of them call the identity provider; the others wait for its tokens to land in the store
//! and use them (docs/scale.md). A claim lapses after `CLAIM_FOR`, so a holder that dies
//! mid-refresh holds nobody up for longer.

use crate::book::{Book, Credential, Exchange};
use crate::config::Config;
use crate::engine::{Clock, Failure, Millis, ProfileId, ProfileType, Reason};
use crate::oauth::{self, OAuthError};
use crate::secrets::{MasterKey, Sealed, SecretField};
use crate::settings::Live;
use crate::store::{Store, StoredProfile};
use parking_lot::Mutex;
use secrecy::{ExposeSecret, SecretString};
use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Why no fresh credential could be had: the failure as the walk records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefreshFailure {
    pub reason: Reason,
    pub message: String,
}

pub struct Refresher {
    book: Arc<Book>,
    store: Arc<dyn Store>,
    key: Arc<MasterKey>,
    http: oauth::Http,
    clock: Arc<dyn Clock>,
    locks: Mutex<HashMap<ProfileId, Arc<tokio::sync::Mutex<()>>>>,
    /// When each profile's tokens were last refreshed here: a token whose whole lifetime is
    /// shorter than `refresh.lead` is refreshed again only `refresh.lead / 2` later.
    refreshed: Mutex<HashMap<ProfileId, Millis>>,
    /// This instance, as the holder of refresh claims.
    holder: String,
}

/// How long a refresh claim holds: longer than a token request may take.
const CLAIM_FOR: Millis = 30_000;
/// How often a waiting instance looks for the claim holder's tokens.
const CLAIM_POLL: Duration = Duration::from_millis(50);

pub fn access_of(c: &Credential) -> Option<String> {
    match c {
        Credential::OAuth { access, .. } | Credential::Client { access, .. } => {
            access.as_ref().map(|a| a.expose_secret().to_string())
        }
        _ => None,
    }
}

impl Refresher {
    pub fn new(book: Arc<Book>, store: Arc<dyn Store>, key: Arc<MasterKey>, clock: Arc<dyn Clock>) -> Refresher {
        Refresher {
            book,
            store,
            key,
            http: oauth::Http::default(),
            clock,
            locks: Mutex::new(HashMap::new()),
            refreshed: Mutex::new(HashMap::new()),
            holder: uuid::Uuid::new_v4().to_string(),
        }
    }

    /// Refreshes, every few seconds, the tokens of profiles about to expire, so that idle
    /// profiles are fresh when traffic comes; until `tasks` is cancelled.
    pub fn sweep(self: &Arc<Self>, settings: Live, tasks: CancellationToken) {
        let weak: Weak<Refresher> = Arc::downgrade(self);
        tokio::spawn(tasks.run_until_cancelled_owned(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(5)).await;
                let Some(me) = weak.upgrade() else { return };
                let settings = settings.get();
                let now = me.clock.now();
                let lead = settings.config.refresh.lead.as_millis() as Millis;
                for id in me.book.expiring(now + lead) {
                    if me.book.stats(&id).is_some_and(|s| s.cooling_every_model(now)) {
                        continue; // a failed refresh cools the profile; the next one waits for it
                    }
                    if me.lately(&id, lead, now) {
                        continue;
                    }
                    if let Some((cred, _, _)) = me.book.tokens(&id)
                        && let Err(f) = me.refresh(&settings.config, &id, access_of(&cred).as_deref()).await
                    {
                        let failure = Failure {
                            reason: f.reason,
                            model: String::new(),
                            hint_ms: None,
                            account_wide: true,
                            started_at: now,
                            claim: false,
                        };
                        me.book.record_failure(&id, &failure, me.clock.now());
                    }
                }
            }
        }));
    }

    /// A refreshed credential when `cred` is an OAuth (or client-credentials) access token
    /// inside the lead window, or missing; `None` when `cred` is good to call with as it is.
    pub async fn fresh(
        &self,
        config: &Config,
        id: &ProfileId,
        cred: &Credential,
    ) -> Result<Option<Credential>, RefreshFailure> {
        let (Credential::OAuth { access, .. } | Credential::Client { access, .. }) = cred else { return Ok(None) };
        let expires = self.book.tokens(id).and_then(|t| t.1);
        let now = self.clock.now();
        if access.is_some() && expires.is_none_or(|e| !config.refresh.window(e).active(now)) {
            return Ok(None);
        }
        let lead = config.refresh.lead.as_millis() as Millis;
        if access.is_some() && expires.is_some_and(|e| e > now) && self.lately(id, lead, now) {
            return Ok(None);
        }
        self.refresh(config, id, access_of(cred).as_deref()).await.map(Some)
    }

    /// Whether this instance refreshed the profile's unexpired tokens less than `lead / 2` ago:
    /// a token that lives less than `refresh.lead` is inside its lead window from the start, and
    /// would otherwise be exchanged again at every request.
    fn lately(&self, id: &ProfileId, lead: Millis, now: Millis) -> bool {
        self.refreshed.lock().get(id).is_some_and(|at| now >= *at && now - at < lead / 2)
    }

    fn lock_for(&self, id: &ProfileId) -> Arc<tokio::sync::Mutex<()>> {
        self.locks.lock().entry(id.clone()).or_default().clone()
    }

    /// Refreshes the profile's tokens, unless another caller did since `seen` (the access token
    /// the caller holds) was read: then that caller's result is returned. A failure is for the
    /// caller to record (the walk records it as the attempt's failure).
    pub async fn refresh(
        &self,
        config: &Config,
        id: &ProfileId,
        seen: Option<&str>,
    ) -> Result<Credential, RefreshFailure> {
        let lock = self.lock_for(id);
        let _one_at_a_time = lock.lock().await;
        let fail = |reason: Reason, message: String| RefreshFailure { reason, message };
        let (mut cred, mut expires, mut version) =
            self.book.tokens(id).ok_or_else(|| fail(Reason::NoProfile, format!("{id} is not an OAuth profile")))?;
        if access_of(&cred).as_deref() != seen {
            return Ok(cred); // refreshed while this caller waited
        }
        // A sibling instance sharing the database may have refreshed already: use its tokens
        // rather than send the provider a spent refresh token (which many providers answer by
        // revoking the whole grant).
        if let Some(stored) = self.reread(id, version.as_deref()).await {
            (cred, expires, version) = self.book.tokens(id).unwrap_or((stored, expires, version));
            let fresh = expires.is_some_and(|e| !config.refresh.window(e).active(self.clock.now()));
            if fresh && access_of(&cred).as_deref() != seen {
                tracing::info!(profile = %id, "a sibling had refreshed the tokens: using the stored ones");
                return Ok(cred);
            }
        }
        let provider = config.providers.get(id.provider());
        let grant = match &cred {
            Credential::Client { secret, how, .. } => {
                let cfg = provider.and_then(|p| p.client_credentials.as_ref()).ok_or_else(|| {
                    fail(
                        Reason::AuthPermanent,
                        format!("provider {} has no client_credentials token_url", id.provider()),
                    )
                })?;
                Grant::Client(cfg, secret, *how)
            }
            Credential::OAuth { refresh: Some(refresh_token), .. } => {
                let cfg = provider.and_then(|p| p.oauth.as_ref()).ok_or_else(|| {
                    fail(Reason::AuthPermanent, format!("provider {} has no OAuth settings", id.provider()))
                })?;
                Grant::Refresh(cfg, refresh_token)
            }
            _ => return Err(self.needs_relogin(id, "it has no refresh token")),
        };
        let result = match self.claim(id, version.as_deref()).await {
            Some(cred) => {
                tracing::info!(profile = %id, "a sibling refreshed the tokens while this instance waited: using them");
                Ok(cred)
            }
            None => match grant {
                Grant::Refresh(cfg, refresh_token) => self.call_idp(id, cfg, refresh_token, version).await,
                Grant::Client(cfg, secret, how) => self.exchange_client(id, cfg, (secret, how), version).await,
            },
        };
        if let Err(e) = self.store.release_refresh(id, &self.holder).await {
            tracing::warn!(profile = %id, error = %e, "releasing the refresh claim failed; it lapses by itself");
        }
        if result.is_ok() {
            self.refreshed.lock().insert(id.clone(), self.clock.now());
        }
        result
    }

    /// Waits until this instance holds the profile's refresh claim (`None`), or until the
    /// holder's new tokens are in the store (`Some`, adopted into the book; the claim may be
    /// this instance's then, for the caller to release). A database that
    /// cannot be asked does not stop the refresh: at worst two instances refresh, and the
    /// compare-and-swap keeps one result.
    async fn claim(&self, id: &ProfileId, version: Option<&[u8]>) -> Option<Credential> {
        loop {
            let now = self.clock.now();
            match self.store.claim_refresh(id, &self.holder, now, now + CLAIM_FOR).await {
                // The holder before may have stored its tokens and let go just now.
                Ok(true) => return self.reread(id, version).await,
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(profile = %id, error = %e, "claiming the refresh failed; refreshing anyway");
                    return None;
                }
            }
            tokio::time::sleep(CLAIM_POLL).await;
            if let Some(cred) = self.reread(id, version).await {
                return Some(cred);
            }
        }
    }

    async fn call_idp(
        &self,
        id: &ProfileId,
        cfg: &crate::config::OAuth,
        refresh_token: &SecretString,
        version: Option<Vec<u8>>,
    ) -> Result<Credential, RefreshFailure> {
        let provider = id.provider();
        let now = self.clock.now();
        match oauth::refresh(&self.http, provider, cfg, refresh_token, now).await {
            Ok(granted) => {
                let refresh = granted.refresh.unwrap_or_else(|| refresh_token.clone());
                let sealed = [
                    self.key.seal(id, SecretField::AccessToken, &granted.access),
                    self.key.seal(id, SecretField::RefreshToken, &refresh),
                ];
                let cred = Credential::OAuth { access: Some(granted.access), refresh: Some(refresh) };
                self.store_tokens(id, (ProfileType::OAuth, cred), sealed, granted.expires_at, version).await
            }
            Err(OAuthError::InvalidGrant(_)) => match self.reread(id, version.as_deref()).await {
                Some(cred) => {
                    tracing::info!(profile = %id, "refresh token refused; a sibling had rotated it: using the stored tokens");
                    Ok(cred)
                }
                None => Err(self.needs_relogin(id, "the provider refused its refresh token (invalid_grant)")),
            },
            Err(e) => {
                let reason = if matches!(e, OAuthError::Transport(_)) { Reason::Network } else { Reason::Auth };
                let message = format!("token refresh failed: {e}");
                tracing::warn!(profile = %id, %reason, "{message}");
                Err(RefreshFailure { reason, message })
            }
        }
    }

    /// A `client_credentials` profile's client id (its name) and secret exchanged for an access
    /// token, or a service account's signed assertion (`how`). The provider refusing the client
    /// (`invalid_client`, `unauthorized_client`: a wrong, expired or revoked secret, Entra's
    /// AADSTS7000215 and 7000222) or the key (`invalid_grant` for its signature or account: a
    /// deleted key or service account) puts the profile in the disabled lane until it gets a new
    /// secret; anything else cools it.
    async fn exchange_client(
        &self,
        id: &ProfileId,
        cfg: &crate::config::ClientCredentials,
        (secret, how): (&SecretString, Exchange),
        version: Option<Vec<u8>>,
    ) -> Result<Credential, RefreshFailure> {
        let now = self.clock.now();
        let granted = match how {
            Exchange::ClientSecret => oauth::client_credentials(&self.http, cfg, id.name(), secret, now).await,
            Exchange::ServiceAccount => oauth::service_account::exchange(&self.http, secret, cfg, now).await,
        };
        let refused = |what: &str, said: String| {
            let message = format!("{id} needs a new {what}: the provider refused it ({said})");
            tracing::warn!(profile = %id, "{message}");
            Err(RefreshFailure { reason: Reason::AuthPermanent, message })
        };
        match granted {
            Ok(granted) => {
                let sealed = [
                    self.key.seal(id, SecretField::AccessToken, &granted.access),
                    self.key.seal(id, how.field(), secret),
                ];
                let cred = Credential::Client { access: Some(granted.access), secret: secret.clone(), how };
                self.store_tokens(id, (how.kind(), cred), sealed, granted.expires_at, version).await
            }
            Err(OAuthError::Refused { code, detail })
                if matches!(code.as_str(), "invalid_client" | "unauthorized_client") =>
            {
                let said = detail.as_deref().and_then(oauth::aadsts).map(|c| format!(", {c}")).unwrap_or_default();
                refused(if how == Exchange::ClientSecret { "client secret" } else { "key" }, format!("{code}{said}"))
            }
            Err(OAuthError::InvalidGrant(Some(detail)))
                if how == Exchange::ServiceAccount
                    && (detail.contains("Invalid JWT Signature") || detail.contains("account not found")) =>
            {
                refused("key", format!("invalid_grant: {}", detail.chars().take(80).collect::<String>()))
            }
            Err(e) => {
                let reason = if matches!(e, OAuthError::Transport(_)) { Reason::Network } else { Reason::Auth };
                let message = format!("client credentials exchange failed: {e}");
                tracing::warn!(profile = %id, %reason, "{message}");
                Err(RefreshFailure { reason, message })
            }
        }
    }

    fn needs_relogin(&self, id: &ProfileId, why: &str) -> RefreshFailure {
        let message = format!("{id} needs re-login: {why}");
        tracing::warn!(profile = %id, "{message}");
        RefreshFailure { reason: Reason::AuthPermanent, message }
    }

    /// Seals and stores new tokens if nobody changed them since `version` (the nonce of the
    /// second secret sealed, `SecretField::versions_tokens`); else adopts what the store holds now.
    async fn store_tokens(
        &self,
        id: &ProfileId,
        (kind, cred): (ProfileType, Credential),
        sealed: [Sealed; 2],
        expires_at: Option<Millis>,
        version: Option<Vec<u8>>,
    ) -> Result<Credential, RefreshFailure> {
        let new_version = sealed[1].nonce.clone();
        match self.store.swap_tokens(id, version.as_deref(), &sealed, expires_at).await {
            Ok(true) => {
                let profile = StoredProfile::stored(id.clone(), kind, expires_at, 0);
                self.book.set_tokens(&profile, cred.clone(), Some(new_version));
                tracing::info!(profile = %id, "new access token stored");
                Ok(cred)
            }
            Ok(false) => self.reread(id, version.as_deref()).await.ok_or_else(|| RefreshFailure {
                reason: Reason::Auth,
                message: format!("{id}: the stored tokens changed meanwhile and could not be read"),
            }),
            Err(e) => {
                Err(RefreshFailure { reason: Reason::ServerError, message: format!("storing new tokens failed: {e}") })
            }
        }
    }

    /// The tokens as stored now, adopted into the book, if they differ from `version`.
    async fn reread(&self, id: &ProfileId, version: Option<&[u8]>) -> Option<Credential> {
        let (sealed, expires_at) = self.store.profile_secrets(id).await.ok()?;
        let versioned = sealed.iter().find(|s| s.field.versions_tokens())?;
        if Some(versioned.nonce.as_slice()) == version {
            return None;
        }
        let open = |f: SecretField| sealed.iter().find(|s| s.field == f).and_then(|s| self.key.open(id, s).ok());
        let client = |how: Exchange| {
            let cred = Credential::Client { access: open(SecretField::AccessToken), secret: open(how.field())?, how };
            Some((how.kind(), cred))
        };
        let (kind, cred) = match versioned.field {
            SecretField::ClientSecret => client(Exchange::ClientSecret)?,
            SecretField::ServiceAccountKey => client(Exchange::ServiceAccount)?,
            _ => (
                ProfileType::OAuth,
                Credential::OAuth { access: open(SecretField::AccessToken), refresh: open(SecretField::RefreshToken) },
            ),
        };
        let profile = StoredProfile::stored(id.clone(), kind, expires_at, 0);
        self.book.set_tokens(&profile, cred.clone(), Some(versioned.nonce.clone()));
        Some(cred)
    }
}

/// How a profile gets new tokens: its refresh token, or its client id and secret.
enum Grant<'a> {
    Refresh(&'a crate::config::OAuth, &'a SecretString),
    Client(&'a crate::config::ClientCredentials, &'a SecretString, Exchange),
}
