//! The profile book: every profile's state in memory, for the request hot path, with each
//! change written through to the store by one background writer.
//!
//! Changes are made under one short lock and queued in the same critical section, so the
//! writer sees them in the order they happened; it coalesces a burst into one transaction
//! per batch, keeping only the latest stats of each profile. Nothing is lost: `flush` waits
//! until everything queued so far is on disk.

use crate::config::Config;
use crate::engine::gate::{self, Availability, Gate, Position, ProbeThrottle};
use crate::engine::order::{self, OrderRequest, Ordered, PinError};
use crate::engine::recent::Recent;
use crate::engine::{
    CooldownPolicy, Failure, Millis, ModelCooldown, ProfileId, ProfileType, ProfileView, Reason, Until, UsageStats,
    Views,
};
use crate::secrets::{MasterKey, OpenError, SecretField};
use crate::store::{Origin, Snapshot, Store, StoreError, StoredProfile};
use secrecy::SecretString;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::{mpsc, oneshot};

/// How long a session stays stuck to its profile without traffic, and how many are kept.
const SESSION_TTL: Millis = 6 * 3_600_000;
const SESSION_KEYS: usize = 10_000;

/// The secret of one profile, decrypted. `SecretString` never prints its content.
#[derive(Clone, Debug)]
pub enum Credential {
    ApiKey(SecretString),
    Token(SecretString),
    OAuth { access: Option<SecretString>, refresh: Option<SecretString> },
}

/// Builds the profile views ordering works on, from what is stored plus the config file.
/// A stored profile has a usable secret when the right sealed field exists (decryption is
/// checked at load); a declared one when its environment variable is set.
pub fn views(snapshot: &Snapshot, config: &Config) -> Views {
    let mut out = Views::default();
    for p in &snapshot.profiles {
        let declared = config.auth.profiles.get(&p.id);
        if p.origin == Origin::Config && declared.is_none() {
            continue; // removed from the config file: its row stays for the audit trail only
        }
        let has_secret = match declared {
            Some(d) => d.secret().is_some(),
            None => stored_secret_usable(p.kind, snapshot.secrets.get(&p.id).map(Vec::as_slice).unwrap_or(&[])),
        };
        let view = ProfileView {
            id: p.id.clone(),
            kind: declared.map_or(p.kind, |d| d.kind),
            enabled: p.enabled,
            has_secret,
            expires_at: declared.map_or(p.expires_at, |d| d.expires.map(|e| e.timestamp_millis())),
            stats: snapshot.stats.get(&p.id).cloned().unwrap_or_default(),
        };
        out.insert(p.id.clone(), view);
    }
    for (id, d) in &config.auth.profiles {
        out.entry(id.clone()).or_insert_with(|| ProfileView {
            id: id.clone(),
            kind: d.kind,
            enabled: true,
            has_secret: d.secret().is_some(),
            expires_at: d.expires.map(|e| e.timestamp_millis()),
            stats: UsageStats::default(),
        });
    }
    out
}

fn stored_secret_usable(kind: ProfileType, sealed: &[crate::secrets::Sealed]) -> bool {
    let has = |f| sealed.iter().any(|s| s.field == f);
    match kind {
        ProfileType::ApiKey => has(SecretField::ApiKey),
        ProfileType::Token => has(SecretField::Token),
        // An OAuth profile with only a refresh token is kept: it will be refreshed.
        ProfileType::OAuth => has(SecretField::AccessToken) || has(SecretField::RefreshToken),
    }
}

/// The profiles the config file declares, as rows for the store.
pub fn config_rows(config: &Config, now: Millis) -> Vec<StoredProfile> {
    config
        .auth
        .profiles
        .iter()
        .map(|(id, p)| StoredProfile {
            id: id.clone(),
            kind: p.kind,
            origin: Origin::Config,
            enabled: true,
            email: None,
            expires_at: p.expires.map(|e| e.timestamp_millis()),
            created_at: now,
        })
        .collect()
}

enum Write {
    Stats(ProfileId, UsageStats),
    Model((String, String), ModelCooldown),
    Flush(oneshot::Sender<()>),
}

/// What ordering reads: the profile views, the stored profiles per provider and the stored
/// explicit orders. Shared by the book and by read-only reports (`doctor`, `profiles list`).
#[derive(Clone, Debug, Default)]
pub struct Roster {
    pub views: Views,
    /// The account's email, for OAuth profiles.
    pub emails: HashMap<ProfileId, String>,
    pub stored_ids: BTreeMap<String, Vec<ProfileId>>,
    pub orders: BTreeMap<String, Vec<ProfileId>>,
}

impl Roster {
    pub fn new(snapshot: &Snapshot, config: &Config) -> Roster {
        let mut stored_ids: BTreeMap<String, Vec<ProfileId>> = BTreeMap::new();
        for p in snapshot.profiles.iter().filter(|p| p.origin == Origin::Stored) {
            stored_ids.entry(p.id.provider().to_string()).or_default().push(p.id.clone());
        }
        let emails = snapshot.profiles.iter().filter_map(|p| Some((p.id.clone(), p.email.clone()?))).collect();
        Roster { views: views(snapshot, config), emails, stored_ids, orders: snapshot.orders.clone() }
    }

    pub fn order(
        &self,
        config: &Config,
        provider: &str,
        model: &str,
        sticky: Option<&ProfileId>,
        pin: Option<&ProfileId>,
        now: Millis,
    ) -> Result<Ordered, PinError> {
        let configured = config.configured_profiles(provider);
        let req = OrderRequest {
            provider,
            model,
            now,
            stored_order: self.orders.get(provider).map(Vec::as_slice),
            config_order: config.auth.order.get(provider).map(Vec::as_slice),
            configured: &configured,
            stored: self.stored_ids.get(provider).map(Vec::as_slice).unwrap_or(&[]),
            rotation: config.rotation.order,
            sticky,
            pin,
        };
        order::order(&req, &self.views)
    }
}

struct Inner {
    roster: Roster,
    credentials: HashMap<ProfileId, Credential>,
    /// The nonce of each OAuth profile's sealed refresh token: the version a refresh must
    /// still find in the store to replace it (compare-and-swap).
    token_versions: HashMap<ProfileId, Vec<u8>>,
    model_cooldowns: HashMap<(String, String), ModelCooldown>,
    probes: ProbeThrottle,
    sessions: Recent<(String, String), ProfileId>,
}

pub struct Book {
    inner: Mutex<Inner>,
    queue: mpsc::UnboundedSender<Write>,
    policy: std::sync::RwLock<CooldownPolicy>,
}

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Open(#[from] OpenError),
}

impl Book {
    /// Loads every profile, decrypting stored secrets, and starts the writer.
    pub async fn load(store: Arc<dyn Store>, config: &Config, key: &MasterKey, now: Millis) -> Result<Book, LoadError> {
        store.sync_config_profiles(&config_rows(config, now)).await?;
        let snapshot = store.snapshot().await?;
        let roster = Roster::new(&snapshot, config);
        let mut credentials = HashMap::new();
        for (id, p) in config.auth.profiles.iter() {
            if let Some(secret) = p.secret() {
                let c =
                    if p.kind == ProfileType::Token { Credential::Token(secret) } else { Credential::ApiKey(secret) };
                credentials.insert(id.clone(), c);
            }
        }
        for (id, sealed) in &snapshot.secrets {
            if config.auth.profiles.contains_key(id) {
                continue;
            }
            let mut fields = HashMap::new();
            for s in sealed {
                fields.insert(s.field, key.open(id, s)?);
            }
            let c = match roster.views.get(id).map(|v| v.kind) {
                Some(ProfileType::ApiKey) => fields.remove(&SecretField::ApiKey).map(Credential::ApiKey),
                Some(ProfileType::Token) => fields.remove(&SecretField::Token).map(Credential::Token),
                Some(ProfileType::OAuth) => Some(Credential::OAuth {
                    access: fields.remove(&SecretField::AccessToken),
                    refresh: fields.remove(&SecretField::RefreshToken),
                }),
                None => None,
            };
            if let Some(c) = c {
                credentials.insert(id.clone(), c);
            }
        }
        let token_versions = snapshot
            .secrets
            .iter()
            .filter_map(|(id, s)| {
                Some((id.clone(), s.iter().find(|s| s.field == SecretField::RefreshToken)?.nonce.clone()))
            })
            .collect();
        let inner = Inner {
            roster,
            credentials,
            token_versions,
            model_cooldowns: snapshot.model_cooldowns,
            probes: ProbeThrottle::default(),
            sessions: Recent::new(SESSION_TTL, SESSION_KEYS),
        };
        let (queue, rx) = mpsc::unbounded_channel();
        tokio::spawn(write_loop(store, rx));
        Ok(Book { inner: Mutex::new(inner), queue, policy: std::sync::RwLock::new(config.cooldown_policy()) })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave a half-applied change: every change is
        // computed on a copy and stored in one assignment, so the state stays usable.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The order of `provider`'s profiles for `model`, with session stickiness and pins.
    pub fn order(
        &self,
        config: &Config,
        provider: &str,
        model: &str,
        session: Option<&str>,
        pin: Option<&ProfileId>,
        now: Millis,
    ) -> Result<Ordered, PinError> {
        let inner = self.lock();
        let sticky =
            session.and_then(|s| inner.sessions.get(&(provider.to_string(), s.to_string()), now)).map(|(id, _)| id);
        inner.roster.order(config, provider, model, sticky, pin, now)
    }

    /// Every profile in force with its state at `now` (for `/metrics`).
    pub fn states(&self, now: Millis) -> Vec<(ProfileId, crate::status::Status)> {
        let inner = self.lock();
        inner.roster.views.values().map(|v| (v.id.clone(), crate::status::Status::of(v, now))).collect()
    }

    pub fn credential(&self, id: &ProfileId) -> Option<Credential> {
        self.lock().credentials.get(id).cloned()
    }

    /// When the profile's credential stops working, if known.
    pub fn expires_at(&self, id: &ProfileId) -> Option<Millis> {
        self.lock().roster.views.get(id).and_then(|v| v.expires_at)
    }

    pub fn stats(&self, id: &ProfileId) -> Option<UsageStats> {
        self.lock().roster.views.get(id).map(|v| v.stats.clone())
    }

    /// The model's own cooldown on a provider (model_not_found), if active.
    pub fn model_cooled_until(&self, provider: &str, model: &str, now: Millis) -> Option<Millis> {
        let inner = self.lock();
        inner.model_cooldowns.get(&(provider.to_string(), model.to_string())).map(|m| m.until).filter(|u| now < *u)
    }

    /// Applies `change` to a profile's stats and queues the result for the store.
    fn update<R>(&self, id: &ProfileId, change: impl FnOnce(&mut UsageStats) -> R) -> Option<R> {
        let mut inner = self.lock();
        let view = inner.roster.views.get_mut(id)?;
        let mut next = view.stats.clone();
        let out = change(&mut next);
        view.stats = next.clone();
        let _ = self.queue.send(Write::Stats(id.clone(), next));
        Some(out)
    }

    /// The profile was chosen for an attempt; `session` sticks to it.
    pub fn mark_used(&self, id: &ProfileId, session: Option<&str>, now: Millis) {
        self.update(id, |s| s.mark_used(now));
        if let Some(s) = session {
            self.lock().sessions.insert((id.provider().to_string(), s.to_string()), id.clone(), now);
        }
    }

    /// The profile served `model`: its error state goes, and so does the model's own cooldown
    /// on that provider (the model exists after all).
    pub fn record_success(&self, id: &ProfileId, model: &str, now: Millis) {
        let mut inner = self.lock();
        if let Some(view) = inner.roster.views.get_mut(id) {
            view.stats.record_success(model, now);
            let _ = self.queue.send(Write::Stats(id.clone(), view.stats.clone()));
        }
        self.end_model_cooldown_locked(&mut inner, id.provider(), model, now);
    }

    /// Ends the model's cooldown on the provider (an admin's clear); whether one was active.
    pub fn end_model_cooldown(&self, provider: &str, model: &str, now: Millis) -> bool {
        self.end_model_cooldown_locked(&mut self.lock(), provider, model, now)
    }

    fn end_model_cooldown_locked(&self, inner: &mut Inner, provider: &str, model: &str, now: Millis) -> bool {
        if inner.model_cooldowns.is_empty() {
            return false;
        }
        let key = (provider.to_string(), model.to_string());
        let Some(m) = inner.model_cooldowns.get_mut(&key).filter(|m| now < m.until) else { return false };
        *m = ModelCooldown { until: now, error_count: 0, last_failure_at: m.last_failure_at };
        let _ = self.queue.send(Write::Model(key, m.clone()));
        true
    }

    /// Records a failure; returns the end of the window the profile is now in.
    pub fn record_failure(&self, id: &ProfileId, failure: &Failure, now: Millis) -> Option<Until> {
        let policy = self.policy();
        self.update(id, |s| s.record_failure(failure, now, &policy)).flatten()
    }

    /// Counts a failed call that is retried on the same profile (no window).
    pub fn count_failure(&self, id: &ProfileId, reason: Reason, now: Millis) {
        let policy = self.policy();
        self.update(id, |s| s.count_failure(reason, now, &policy));
    }

    /// model_not_found: cools the model on the provider for every profile; returns its end.
    pub fn record_model_not_found(&self, provider: &str, model: &str, now: Millis, started_at: Millis) -> Millis {
        let mut inner = self.lock();
        let key = (provider.to_string(), model.to_string());
        let next = ModelCooldown::after_failure(inner.model_cooldowns.get(&key), now, started_at, &self.policy());
        let until = next.until;
        inner.model_cooldowns.insert(key.clone(), next.clone());
        let _ = self.queue.send(Write::Model(key, next));
        until
    }

    fn policy(&self) -> CooldownPolicy {
        self.policy.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// New cooldown durations (a config reload) for the failures recorded from now on.
    pub fn set_policy(&self, policy: CooldownPolicy) {
        *self.policy.write().unwrap_or_else(|e| e.into_inner()) = policy;
    }

    /// A snapshot of what ordering reads (for listings; the hot path never copies it).
    pub fn roster(&self) -> Roster {
        self.lock().roster.clone()
    }

    /// A profile added through the API (already in the store): usable from the next request.
    pub fn add_profile(&self, profile: &StoredProfile, credential: Credential) {
        let mut inner = self.lock();
        let view = ProfileView {
            id: profile.id.clone(),
            kind: profile.kind,
            enabled: profile.enabled,
            has_secret: true,
            expires_at: profile.expires_at,
            stats: UsageStats::default(),
        };
        inner.roster.views.insert(profile.id.clone(), view);
        let ids = inner.roster.stored_ids.entry(profile.id.provider().to_string()).or_default();
        if !ids.contains(&profile.id) {
            ids.push(profile.id.clone());
        }
        inner.credentials.insert(profile.id.clone(), credential);
    }

    /// An OAuth login or refresh: the profile (added if new) gets these tokens; a known profile
    /// keeps its enabled flag and stats. `version` is the nonce of the sealed refresh token now
    /// stored.
    pub fn set_tokens(&self, profile: &StoredProfile, credential: Credential, version: Option<Vec<u8>>) {
        let mut inner = self.lock();
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

    /// An OAuth profile's credential, expiry and token version.
    pub fn tokens(&self, id: &ProfileId) -> Option<(Credential, Option<Millis>, Option<Vec<u8>>)> {
        let inner = self.lock();
        let cred = inner.credentials.get(id).filter(|c| matches!(c, Credential::OAuth { .. }))?.clone();
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
            .filter(|v| v.kind == ProfileType::OAuth && v.enabled && v.expires_at.is_some_and(|e| e < until))
            .filter(|v| v.stats.disabled.is_none())
            .map(|v| v.id.clone())
            .collect()
    }

    /// Takes a profile out of rotation for good; its stats are no longer written.
    pub fn remove_profile(&self, id: &ProfileId) -> bool {
        let mut inner = self.lock();
        let known = inner.roster.views.remove(id).is_some();
        inner.credentials.remove(id);
        inner.token_versions.remove(id);
        inner.roster.emails.remove(id);
        if let Some(ids) = inner.roster.stored_ids.get_mut(id.provider()) {
            ids.retain(|p| p != id);
        }
        for ids in inner.roster.orders.values_mut() {
            ids.retain(|p| p != id);
        }
        known
    }

    pub fn set_enabled(&self, id: &ProfileId, enabled: bool) -> bool {
        match self.lock().roster.views.get_mut(id) {
            Some(v) => {
                v.enabled = enabled;
                true
            }
            None => false,
        }
    }

    /// Sets (or with `None` removes) the explicit order of a provider, as the store holds it.
    pub fn set_order(&self, provider: &str, ids: Option<Vec<ProfileId>>) {
        let mut inner = self.lock();
        match ids {
            Some(ids) => inner.roster.orders.insert(provider.to_string(), ids),
            None => inner.roster.orders.remove(provider),
        };
    }

    /// Resets the windows and counters of every profile whose windows have ended, and writes
    /// them, so that what `usage_stats` holds is current when an auditor reads it (SPEC §3).
    /// Returns how many profiles were reset.
    pub fn sweep(&self, now: Millis) -> usize {
        let policy = self.policy();
        let mut inner = self.lock();
        let mut reset = 0;
        for (id, view) in inner.roster.views.iter_mut() {
            if view.stats.expire(now, &policy) {
                let _ = self.queue.send(Write::Stats(id.clone(), view.stats.clone()));
                reset += 1;
            }
        }
        reset
    }

    /// Sweeps every `every` (see `sweep`) until the book is dropped.
    pub fn sweep_every(self: &Arc<Self>, every: std::time::Duration, clock: Arc<dyn crate::engine::Clock>) {
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let Some(book) = weak.upgrade() else { return };
                book.sweep(clock.now());
            }
        });
    }

    /// An admin cleared the profile's cooldown and disabled state.
    pub fn clear(&self, id: &ProfileId) -> bool {
        self.update(id, UsageStats::clear_errors).is_some()
    }

    /// Waits until every change made so far is written.
    pub async fn flush(&self) {
        let (tx, rx) = oneshot::channel();
        if self.queue.send(Write::Flush(tx)).is_ok() {
            let _ = rx.await;
        }
    }

    /// Decides whether a candidate is tried, probed or skipped (claims the probe atomically).
    pub fn gate(&self, pos: Position<'_>, avail: Availability, now: Millis) -> Gate {
        gate::gate(pos, avail, &mut self.lock().probes, now)
    }
}

/// The writer: drains whatever is queued, keeps the latest state per key, writes it in one
/// transaction, then answers the flushes that were waiting on that batch.
async fn write_loop(store: Arc<dyn Store>, mut rx: mpsc::UnboundedReceiver<Write>) {
    const BATCH: usize = 512;
    let mut buf = Vec::with_capacity(BATCH);
    while rx.recv_many(&mut buf, BATCH).await > 0 {
        let mut stats: Vec<(ProfileId, UsageStats)> = Vec::new();
        let mut models: Vec<((String, String), ModelCooldown)> = Vec::new();
        let mut waiting = Vec::new();
        for w in buf.drain(..) {
            match w {
                Write::Stats(id, s) => match stats.iter_mut().find(|(i, _)| *i == id) {
                    Some(slot) => slot.1 = s,
                    None => stats.push((id, s)),
                },
                Write::Model(k, m) => match models.iter_mut().find(|(key, _)| *key == k) {
                    Some(slot) => slot.1 = m,
                    None => models.push((k, m)),
                },
                Write::Flush(tx) => waiting.push(tx),
            }
        }
        write_batch(store.as_ref(), &stats, &models).await;
        for tx in waiting {
            let _ = tx.send(());
        }
    }
}

/// Writes one batch. A failing batch is retried with backoff (the database may be busy or
/// briefly unavailable); if it keeps failing, rows are written one by one so that one bad row
/// cannot hold back the others, and each row that still fails is logged with its key.
async fn write_batch(
    store: &dyn Store,
    stats: &[(ProfileId, UsageStats)],
    models: &[((String, String), ModelCooldown)],
) {
    let mut delay = std::time::Duration::from_millis(50);
    for attempt in 1..=5 {
        let res = match store.save_stats(stats).await {
            Ok(()) => store.save_model_cooldowns(models).await,
            Err(e) => Err(e),
        };
        match res {
            Ok(()) => return,
            Err(e) => tracing::warn!(error = %e, attempt, "writing usage stats failed; retrying"),
        }
        tokio::time::sleep(delay).await;
        delay *= 2;
    }
    for row in stats {
        if let Err(e) = store.save_stats(std::slice::from_ref(row)).await {
            tracing::error!(profile = %row.0, error = %e, "usage stats of this profile could not be written");
        }
    }
    for row in models {
        if let Err(e) = store.save_model_cooldowns(std::slice::from_ref(row)).await {
            tracing::error!(provider = %row.0.0, model = %row.0.1, error = %e, "model cooldown could not be written");
        }
    }
}
