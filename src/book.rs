//! The profile book: every profile's state in memory, for the request hot path, kept in step
//! with the database by one background task.
//!
//! Each change of a profile's stats is applied in memory under one short lock and queued in
//! the same critical section (`Change`), so the writer sees changes in the order they happened.
//! The writer replays a batch of them on the rows as stored, in one write transaction, so that
//! what another writer (the CLI, another instance) did meanwhile is kept; the rows it gets back
//! become the book's state, with the changes queued since replayed on top. Nothing is lost: a
//! failing write is retried until the database takes it, and `flush` waits until everything
//! queued so far is written. What waits is bounded by the profiles: successes and uses of a
//! profile coalesce while they wait.
//!
//! Between batches the same task reads the database's change feed every `FEED_EVERY` (and at
//! once when PostgreSQL notifies a change), and reloads what other writers changed: stats,
//! model cooldowns, and profiles, secrets and orders (docs/scale.md).

use crate::behind::{self, Sink, Writer};
use crate::config::Config;
use crate::engine::gate::{self, Availability, Gate, Position, ProbeThrottle};
use crate::engine::order::{self, OrderRequest, Ordered, PinError, RotationIndex, Slot};
use crate::engine::quota::Quota;
use crate::engine::recent::Recent;
use crate::engine::{
    Change, CooldownPolicy, Failure, Millis, ModelChange, ModelCooldown, ProfileId, ProfileType, ProfileView, Reason,
    Until, Unwritten, UsageStats, Views,
};
use crate::secrets::{MasterKey, OpenError, SecretField};
use crate::store::{Origin, Snapshot, Store, StoreError, StoredProfile};
use parking_lot::{Mutex, MutexGuard, RwLock};
use secrecy::{ExposeSecret, SecretString};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// How often the change feed is read: other writers' changes are in force within this much
/// (plus the time a reload takes).
pub const FEED_EVERY: Duration = Duration::from_millis(250);

/// How long a session stays stuck to its profile without traffic, and how many are kept.
const SESSION_TTL: Millis = 6 * 3_600_000;
const SESSION_KEYS: usize = 10_000;
/// The longest session id kept as sent; a longer one (a client's `user` may be megabytes) is
/// kept as its SHA-256, so the map holds at most `SESSION_KEYS` short keys.
const SESSION_MAX: usize = 128;

/// The key a session sticks under: (provider, session id, or the id's digest when long).
fn session_key(provider: &str, session: &str) -> (String, String) {
    let id = if session.len() <= SESSION_MAX {
        session.to_string()
    } else {
        use sha2::Digest;
        format!("sha256:{:x}", sha2::Sha256::digest(session.as_bytes()))
    };
    (provider.to_string(), id)
}

/// The secret of one profile, decrypted. `SecretString` never prints its content.
#[derive(Clone, Debug)]
pub enum Credential {
    ApiKey(SecretString),
    Token(SecretString),
    OAuth { access: Option<SecretString>, refresh: Option<SecretString> },
}

impl Credential {
    /// A static credential of this type: an API key, or a token.
    pub fn new(kind: ProfileType, secret: SecretString) -> Credential {
        if kind == ProfileType::Token { Credential::Token(secret) } else { Credential::ApiKey(secret) }
    }

    /// The secrets an upstream could echo back: the ones rota sends.
    pub fn secrets(&self) -> Vec<&str> {
        match self {
            Credential::ApiKey(s) | Credential::Token(s) => vec![s.expose_secret()],
            Credential::OAuth { access, refresh } => {
                access.iter().chain(refresh.iter()).map(|s| s.expose_secret()).collect()
            }
        }
    }
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
            oauth_subject: None,
        })
        .collect()
}

type ModelKey = (String, String);

/// What the writer took to write: the changes of each profile and model.
struct Batch {
    stats: Vec<(ProfileId, Vec<Change>)>,
    models: Vec<(ModelKey, Vec<ModelChange>)>,
}

/// What a snapshot's secrets unseal to: the roster, the credentials and the refresh-token
/// versions.
type Unsealed = (Roster, HashMap<ProfileId, Credential>, HashMap<ProfileId, Vec<u8>>);

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

    /// Whether `provider`'s profiles follow an explicit order (stored, or the config file's).
    pub fn has_explicit_order(&self, config: &Config, provider: &str) -> bool {
        let set = |o: Option<&Vec<ProfileId>>| o.is_some_and(|o| !o.is_empty());
        set(self.orders.get(provider)) || set(config.auth.order.get(provider))
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
            quota_floor: config.rotation.floor(),
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
    model_cooldowns: HashMap<ModelKey, ModelCooldown>,
    probes: ProbeThrottle,
    sessions: Recent<(String, String), ProfileId>,
    /// Each provider's profiles in rotation order, built on first use and dropped when the
    /// roster or the config changes (`forget_order`).
    rotation: HashMap<String, RotationIndex>,
    /// Changes applied here and not yet written, replayed on top of what the database says (a
    /// written batch, a reload from the feed): those the writer is writing, then those queued.
    inflight: HashMap<ProfileId, Vec<Change>>,
    pending: HashMap<ProfileId, Unwritten>,
    /// How many changes each pending entry holds (before coalescing): what a batch that leaves
    /// some entries pending has not written of `queued`.
    pending_changes: HashMap<ProfileId, u64>,
    model_inflight: HashMap<ModelKey, Vec<ModelChange>>,
    model_pending: HashMap<ModelKey, Vec<ModelChange>>,
    /// Changes queued so far (coalesced ones too): what `flush` waits for.
    queued: u64,
    /// Counts this server's own edits of profiles, secrets and orders (made in memory as they
    /// are stored): a reload from a snapshot read before one of them would undo it.
    local_edits: u64,
}

/// What the book and its background task share.
struct Shared {
    inner: Mutex<Inner>,
    /// The config in force: the cooldown durations, and the declared profiles a reload from
    /// the feed builds on.
    config: RwLock<Arc<Config>>,
    key: Arc<MasterKey>,
    /// The stats' write-behind: woken when changes are queued; it counts what it wrote in
    /// `Inner::queued`'s terms.
    writer: Arc<Writer>,
}

pub struct Book {
    shared: Arc<Shared>,
}

impl Drop for Book {
    fn drop(&mut self) {
        self.shared.writer.close();
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Open(#[from] OpenError),
}

impl Book {
    /// Loads every profile, decrypting stored secrets, and starts the writer and the feed.
    pub async fn load(
        store: Arc<dyn Store>,
        config: &Config,
        key: Arc<MasterKey>,
        now: Millis,
    ) -> Result<Book, LoadError> {
        store.sync_config_profiles(&config_rows(config, now)).await?;
        let seen = store.feed_head(None).await?;
        let snapshot = store.snapshot().await?;
        let (roster, credentials, token_versions) = unseal(&snapshot, config, &key)?;
        let inner = Inner {
            roster,
            credentials,
            token_versions,
            model_cooldowns: snapshot.model_cooldowns,
            probes: ProbeThrottle::default(),
            sessions: Recent::new(SESSION_TTL, SESSION_KEYS),
            rotation: HashMap::new(),
            inflight: HashMap::new(),
            pending: HashMap::new(),
            pending_changes: HashMap::new(),
            model_inflight: HashMap::new(),
            model_pending: HashMap::new(),
            queued: 0,
            local_edits: 0,
        };
        let shared = Arc::new(Shared {
            inner: Mutex::new(inner),
            config: RwLock::new(Arc::new(config.clone())),
            key,
            writer: Writer::new(),
        });
        let mut feed = tokio::time::interval(FEED_EVERY);
        feed.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let sink = Stats { shared: shared.clone(), seen, feed, wake: store.wake() };
        behind::spawn(shared.writer.clone(), store, sink, GATHER);
        Ok(Book { shared })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.shared.lock()
    }

    /// The order of `provider`'s profiles for `model` (with session stickiness and pins, less
    /// `exclude`), and the first of them, when usable, marked used (and stuck to `session`) in
    /// the same critical section, so that concurrent requests and leases spread over the
    /// profiles instead of all taking the least recently used one. The mark is later than every
    /// other profile's of the provider, even within one millisecond. True when it marked.
    pub fn pick(
        &self,
        config: &Config,
        (provider, model): (&str, &str),
        session: Option<&str>,
        pin: Option<&ProfileId>,
        exclude: &[ProfileId],
        now: Millis,
    ) -> Result<(Ordered, bool), PinError> {
        let policy = self.policy();
        let mut guard = self.lock();
        let inner = &mut *guard;
        let sticky = session.and_then(|s| inner.sessions.get(&session_key(provider, s), now)).map(|(id, _)| id.clone());
        let pinned = pin.is_some_and(|p| p.provider() == provider);
        if !pinned && sticky.is_none() && !inner.roster.has_explicit_order(config, provider) {
            let first = inner.first_usable(config, (provider, model), exclude, now);
            if let Some(id) = first.first().cloned() {
                let latest = inner.rotation.get(provider).and_then(RotationIndex::latest);
                inner.use_first(&id, latest, session, now, &policy);
                self.shared.writer.wake();
                let slots = first.into_iter().map(|id| Slot { id, blocked: None }).collect();
                return Ok((Ordered { slots, pinned: false, more: true }, true));
            }
        }
        let mut ordered = inner.roster.order(config, provider, model, sticky.as_ref(), pin, now)?;
        ordered.slots.retain(|s| !exclude.contains(&s.id));
        let Some(first) = ordered.slots.first().filter(|s| s.blocked.is_none()).map(|s| s.id.clone()) else {
            return Ok((ordered, false));
        };
        let views = &inner.roster.views;
        let latest = ordered.slots.iter().filter_map(|s| views.get(&s.id)?.stats.last_used).max();
        inner.use_first(&first, latest, session, now, &policy);
        self.shared.writer.wake();
        Ok((ordered, true))
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

    /// Applies `change` to a profile's stats and queues it for the store.
    fn update(&self, id: &ProfileId, change: Change) -> Option<Option<Until>> {
        let policy = self.policy();
        let mut guard = self.lock();
        let inner = &mut *guard;
        let out = inner.roster.views.get_mut(id)?.stats.apply(&change, &policy);
        let used = matches!(change, Change::Used(_));
        inner.queue(id, change);
        if used {
            inner.reorder(id);
        }
        self.shared.writer.wake();
        Some(out)
    }

    /// Applies `change` to a model's cooldown and queues it for the store.
    fn update_model(&self, inner: &mut Inner, key: ModelKey, change: ModelChange) -> Option<ModelCooldown> {
        let next = ModelCooldown::apply(inner.model_cooldowns.get(&key), &change, &self.policy())?;
        inner.model_cooldowns.insert(key.clone(), next.clone());
        inner.model_pending.entry(key).or_default().push(change);
        inner.queued += 1;
        self.shared.writer.wake();
        Some(next)
    }

    /// The profile was chosen for an attempt; `session` sticks to it.
    pub fn mark_used(&self, id: &ProfileId, session: Option<&str>, now: Millis) {
        self.update(id, Change::Used(now));
        if let Some(s) = session {
            self.lock().sessions.insert(session_key(id.provider(), s), id.clone(), now);
        }
    }

    /// The profile served `model` with a call sent at `sent`: the error state it proves over
    /// goes (what opened since the call was sent stays: `UsageStats::record_success`), and so
    /// does the model's own cooldown on that provider if it began before (the model exists).
    pub fn record_success(&self, id: &ProfileId, model: &str, sent: Millis, now: Millis) {
        self.update(id, Change::Served { model: model.to_string(), sent, at: now, times: 1 });
        self.end_model_cooldown(id.provider(), model, sent);
    }

    /// Ends the model's cooldown on the provider (an admin's clear); whether one was active.
    pub fn end_model_cooldown(&self, provider: &str, model: &str, now: Millis) -> bool {
        let mut inner = self.lock();
        if inner.model_cooldowns.is_empty() {
            return false;
        }
        let key = (provider.to_string(), model.to_string());
        if inner.model_cooldowns.get(&key).is_none_or(|m| now >= m.until) {
            return false;
        }
        self.update_model(&mut inner, key, ModelChange::Ended(now));
        true
    }

    /// An answer reported the profile's remaining quota for a model: kept, and written with
    /// its stats (`profile_quota`).
    pub fn record_quota(&self, id: &ProfileId, quota: Quota) {
        self.update(id, Change::Quota(quota));
    }

    /// Records a failure; returns the end of the window the profile is now in.
    pub fn record_failure(&self, id: &ProfileId, failure: &Failure, now: Millis) -> Option<Until> {
        self.update(id, Change::Failed(failure.clone(), now)).flatten()
    }

    /// Counts a failed call that is retried on the same profile (no window).
    pub fn count_failure(&self, id: &ProfileId, reason: Reason, now: Millis) {
        self.update(id, Change::Counted(reason, now));
    }

    /// model_not_found: cools the model on the provider for every profile; returns its end.
    pub fn record_model_not_found(&self, provider: &str, model: &str, now: Millis, started_at: Millis) -> Millis {
        let mut inner = self.lock();
        let key = (provider.to_string(), model.to_string());
        let next = self.update_model(&mut inner, key, ModelChange::NotFound { now, started_at });
        next.expect("a model_not_found always leaves a cooldown").until
    }

    fn policy(&self) -> CooldownPolicy {
        self.shared.policy()
    }

    /// A config reload: new cooldown durations for the failures recorded from now on, and the
    /// declared profiles a reload from the feed builds on.
    pub fn set_config(&self, config: &Config) {
        *self.shared.config.write() = Arc::new(config.clone());
        self.lock().forget_order();
    }

    /// A snapshot of what ordering reads (for listings; the hot path never copies it).
    pub fn roster(&self) -> Roster {
        self.lock().roster.clone()
    }

    /// A profile added through the API (already in the store): usable from the next request.
    pub fn add_profile(&self, profile: &StoredProfile, credential: Credential) {
        let mut inner = self.lock();
        inner.local_edits += 1;
        inner.forget_order();
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
        inner.local_edits += 1;
        inner.forget_order();
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
        let mut inner = self.lock();
        inner.local_edits += 1;
        inner.forget_order();
        match inner.roster.views.get_mut(id) {
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
        inner.local_edits += 1;
        inner.forget_order();
        match ids {
            Some(ids) => inner.roster.orders.insert(provider.to_string(), ids),
            None => inner.roster.orders.remove(provider),
        };
    }

    /// Resets the windows and counters of every profile whose windows have ended, and writes
    /// them, so that what `usage_stats` holds is current when an auditor reads it (docs/rotation.md).
    /// Returns how many profiles were reset.
    pub fn sweep(&self, now: Millis) -> usize {
        let policy = self.policy();
        let mut guard = self.lock();
        let inner = &mut *guard;
        let views = inner.roster.views.iter_mut();
        let ended: Vec<ProfileId> =
            views.filter_map(|(id, v)| v.stats.expire(now, &policy).then(|| id.clone())).collect();
        for id in &ended {
            inner.queue(id, Change::Expired(now));
        }
        if !ended.is_empty() {
            self.shared.writer.wake();
        }
        ended.len()
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

    /// An admin cleared the profile's cooldown and disabled state at `now`.
    pub fn clear(&self, id: &ProfileId, now: Millis) -> bool {
        self.update(id, Change::Cleared(now)).is_some()
    }

    /// Waits until every change made so far is written. Concurrent callers share the writer's
    /// transactions (group commit).
    pub async fn flush(&self) {
        let target = self.lock().queued;
        self.shared.writer.written(target).await;
    }

    /// `flush`, for at most `limit`: whether everything made so far is written.
    pub async fn durable(&self, limit: Duration) -> bool {
        tokio::time::timeout(limit, self.flush()).await.is_ok()
    }

    /// Whether the last write of stats failed (the writer retries it), and how many profiles
    /// and models have changes waiting.
    pub fn writer_state(&self) -> (bool, usize) {
        let inner = self.lock();
        let waiting =
            inner.pending.len() + inner.inflight.len() + inner.model_pending.len() + inner.model_inflight.len();
        (self.shared.writer.failing(), waiting)
    }

    /// What waits for the stats writer: the profiles whose changes it is writing, those whose
    /// changes are queued, and the changes of both (coalesced: `Unwritten`).
    pub fn backlog(&self) -> Backlog {
        let inner = self.lock();
        Backlog {
            inflight: inner.inflight.len(),
            pending: inner.pending.len(),
            changes: inner.inflight.values().map(Vec::len).sum::<usize>()
                + inner.pending.values().map(|p| p.replay().count()).sum::<usize>(),
        }
    }

    /// The longest one batch of stats took to write since start.
    pub fn slowest_write(&self) -> Duration {
        self.shared.writer.slowest()
    }

    /// Decides whether a candidate is tried, probed or skipped (claims the probe atomically).
    pub fn gate(&self, pos: Position<'_>, avail: Availability, now: Millis) -> Gate {
        gate::gate(pos, avail, &mut self.lock().probes, now)
    }
}

/// What waits for the stats writer (`Book::backlog`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backlog {
    pub inflight: usize,
    pub pending: usize,
    pub changes: usize,
}

/// How long changes gather before a write that nobody waits for.
const GATHER: Duration = Duration::from_millis(50);

/// The book's write-behind (`crate::behind`): the queued changes, written in batches, and the
/// change feed, read between them. One task does both, so a reload never races a batch being
/// written. A batch is replayed on the rows as stored, and the rows written back become the
/// book's state. A failing batch is retried until the database takes it (busy, read-only or
/// failing for a while: nothing is dropped, and later changes coalesce meanwhile). From the
/// third failure on, rows are also tried one by one: when some of them can be written, the
/// database works and the others are bad rows, logged with their key and given up, so that one
/// cannot hold back the rest. The task ends when the book is dropped, after writing what was
/// left.
struct Stats {
    shared: Arc<Shared>,
    /// The change feed's position read so far.
    seen: i64,
    feed: tokio::time::Interval,
    wake: Option<watch::Receiver<u64>>,
}

impl Sink for Stats {
    type Batch = Batch;
    const WHAT: &'static str = "usage stats";

    fn ready(&self) -> bool {
        self.shared.full()
    }

    fn take(&mut self) -> (Batch, u64) {
        self.shared.take()
    }

    fn rows(batch: &Batch) -> usize {
        batch.stats.len() + batch.models.len()
    }

    async fn write(&mut self, store: &dyn Store, batch: &Batch) -> Result<(), StoreError> {
        let applied = store.apply(&batch.stats, &batch.models, &self.shared.policy()).await?;
        self.shared.settle(&batch.stats, &batch.models, applied.stats, applied.models);
        if applied.feed.0 == self.seen {
            self.seen = applied.feed.1; // the entries in between are this batch's own
        }
        Ok(())
    }

    /// Writes each row of the batch alone; when at least one could be written, settles them
    /// all (the ones that could not are logged and given up) and returns true.
    async fn isolate(&mut self, store: &dyn Store, batch: &Batch) -> bool {
        let shared = &self.shared;
        let policy = shared.policy();
        let mut written = (Vec::new(), Vec::new());
        let mut bad = Vec::new();
        for row in &batch.stats {
            match store.apply(std::slice::from_ref(row), &[], &policy).await {
                Ok(applied) => written.0.extend(applied.stats),
                Err(e) => bad.push((row.0.to_string(), e)),
            }
        }
        for row in &batch.models {
            match store.apply(&[], std::slice::from_ref(row), &policy).await {
                Ok(applied) => written.1.extend(applied.models),
                Err(e) => bad.push((format!("model {}/{}", row.0.0, row.0.1), e)),
            }
        }
        if bad.len() == batch.stats.len() + batch.models.len() {
            return false;
        }
        for (key, e) in bad {
            tracing::error!(key, error = %e, "usage stats of this profile or model could not be written; given up");
        }
        shared.settle(&batch.stats, &batch.models, written.0, written.1);
        true
    }

    async fn idle(&mut self) {
        tokio::select! {
            _ = self.feed.tick() => {}
            _ = crate::store::woken(&mut self.wake) => {}
        }
    }

    async fn between(&mut self, store: &dyn Store) {
        match follow(store, &self.shared, self.seen).await {
            Ok(head) => self.seen = head,
            Err(e) => tracing::warn!(error = %e, "reading the change feed failed; retrying"),
        }
    }
}

/// Reads the change feed after `seen` and reloads what changed; returns the new position.
async fn follow(store: &dyn Store, shared: &Shared, seen: i64) -> Result<i64, LoadError> {
    let entries = store.changes_after(seen).await?;
    let Some(head) = entries.last().map(|e| e.seq) else { return Ok(seen) };
    let kinds = |k: &str| entries.iter().any(|e| e.kind == k);
    if kinds("profile") || kinds("order") {
        let edits = shared.lock().local_edits;
        let snapshot = store.snapshot().await?;
        // An own edit made meanwhile may be newer than the snapshot: read again next time.
        return Ok(if shared.reload(snapshot, edits)? { head } else { seen });
    }
    let mut ids: Vec<ProfileId> =
        entries.iter().filter(|e| e.kind == "stats").filter_map(|e| e.key.parse().ok()).collect();
    ids.sort();
    ids.dedup();
    if !ids.is_empty() {
        shared.refresh_stats(store.stats_of(&ids).await?);
    }
    if kinds("model") {
        shared.refresh_models(store.model_cooldowns().await?);
    }
    Ok(head)
}

/// The stored roster, credentials and refresh-token versions of a snapshot.
fn unseal(snapshot: &Snapshot, config: &Config, key: &MasterKey) -> Result<Unsealed, OpenError> {
    let roster = Roster::new(snapshot, config);
    let mut credentials = HashMap::new();
    for (id, p) in config.auth.profiles.iter() {
        if let Some(secret) = p.secret() {
            let c = if p.kind == ProfileType::Token { Credential::Token(secret) } else { Credential::ApiKey(secret) };
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
    Ok((roster, credentials, token_versions))
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock()
    }

    fn config(&self) -> Arc<Config> {
        self.config.read().clone()
    }

    fn policy(&self) -> CooldownPolicy {
        self.config.read().cooldown_policy()
    }

    /// Moves every queued change to the writer (in flight until settled), with the count of
    /// changes queued up to them.
    fn take(&self) -> (Batch, u64) {
        let mut guard = self.lock();
        let inner = &mut *guard;
        // At most `STATS_BATCH` profiles a batch, so that one write transaction stays short beside
        // the audit writer's (they take turns); what is left is the next batch's, at once.
        let ids: Vec<ProfileId> = inner.pending.keys().take(STATS_BATCH).cloned().collect();
        let mut stats: Vec<(ProfileId, Vec<Change>)> = ids
            .into_iter()
            .filter_map(|id| {
                inner.pending_changes.remove(&id);
                let p = inner.pending.remove(&id)?;
                Some((id, p.into_changes()))
            })
            .collect();
        stats.sort_by(|a, b| a.0.cmp(&b.0));
        let mut models: Vec<(ModelKey, Vec<ModelChange>)> = inner.model_pending.drain().collect();
        models.sort_by(|a, b| a.0.cmp(&b.0));
        for (id, changes) in &stats {
            inner.inflight.insert(id.clone(), changes.clone());
        }
        for (key, changes) in &models {
            inner.model_inflight.insert(key.clone(), changes.clone());
        }
        let left: u64 = inner.pending_changes.values().sum();
        if left > 0 {
            self.writer.wake();
        }
        (Batch { stats, models }, inner.queued - left)
    }

    /// Whether a whole batch waits.
    fn full(&self) -> bool {
        self.lock().pending.len() >= STATS_BATCH
    }

    /// A batch was written (or given up): its changes are no longer in flight, and the rows
    /// as stored, with what was queued since replayed on top, become the book's state.
    fn settle(
        &self,
        stats: &[(ProfileId, Vec<Change>)],
        models: &[(ModelKey, Vec<ModelChange>)],
        stored: Vec<(ProfileId, UsageStats)>,
        stored_models: Vec<(ModelKey, ModelCooldown)>,
    ) {
        let policy = self.policy();
        let mut guard = self.lock();
        let inner = &mut *guard;
        for (id, _) in stats {
            inner.inflight.remove(id);
        }
        for (key, _) in models {
            inner.model_inflight.remove(key);
        }
        inner.put_stats(stored, &policy);
        inner.put_models(stored_models, &policy);
    }

    fn refresh_stats(&self, stored: Vec<(ProfileId, Option<UsageStats>)>) {
        let policy = self.policy();
        self.lock().put_stats(stored.into_iter().filter_map(|(id, s)| Some((id, s?))).collect(), &policy);
    }

    fn refresh_models(&self, stored: HashMap<ModelKey, ModelCooldown>) {
        let policy = self.policy();
        self.lock().put_models(stored.into_iter().collect(), &policy);
    }

    /// Profiles, secrets or orders changed in the database: the roster and credentials are
    /// rebuilt from it; sessions and probe throttles stay. Not when this server edited its
    /// roster since `edits` was read (false).
    fn reload(&self, snapshot: Snapshot, edits: u64) -> Result<bool, LoadError> {
        let config = self.config();
        let (mut roster, credentials, token_versions) = unseal(&snapshot, &config, &self.key)?;
        let policy = self.policy();
        let mut guard = self.lock();
        let inner = &mut *guard;
        if inner.local_edits != edits {
            return Ok(false);
        }
        for (id, view) in roster.views.iter_mut() {
            for c in inner.unwritten(id) {
                view.stats.apply(&c, &policy);
            }
        }
        inner.pending.retain(|id, _| roster.views.contains_key(id));
        inner.pending_changes.retain(|id, _| roster.views.contains_key(id));
        inner.roster = roster;
        inner.forget_order();
        inner.credentials = credentials;
        inner.token_versions = token_versions;
        inner.put_models(snapshot.model_cooldowns.into_iter().collect(), &policy);
        Ok(true)
    }
}

/// The most profiles one write of the stats writer takes: about 20 ms of the database's time
/// under load (a batch of 2,000 took 148 ms), so the audit writer's turn is never long in coming.
const STATS_BATCH: usize = 256;

/// How many usable profiles a request gets at once from the rotation index; a walk that tries
/// them all asks for the next ones.
const FIRST: usize = 8;

impl Inner {
    /// The first usable profiles of `provider` for `model`, less `exclude`, from the rotation
    /// index (built here when missing). Only for a provider without an explicit order.
    fn first_usable(
        &mut self,
        config: &Config,
        (provider, model): (&str, &str),
        exclude: &[ProfileId],
        now: Millis,
    ) -> Vec<ProfileId> {
        let roster = &self.roster;
        let index = self.rotation.entry(provider.to_string()).or_insert_with(|| {
            let configured = config.configured_profiles(provider);
            let stored = roster.stored_ids.get(provider).map(Vec::as_slice).unwrap_or(&[]);
            let base = if configured.is_empty() { stored } else { &configured };
            RotationIndex::new(base, &roster.views, config.rotation.order)
        });
        index.first((provider, model), now, &roster.views, exclude, (FIRST, config.rotation.floor()))
    }

    /// Marks the profile a request takes used, later than every other profile of its provider
    /// (`latest`), and sticks `session` to it.
    fn use_first(
        &mut self,
        id: &ProfileId,
        latest: Option<Millis>,
        session: Option<&str>,
        now: Millis,
        policy: &CooldownPolicy,
    ) {
        let change = Change::Used(latest.map_or(now, |l| now.max(l + 1)));
        if let Some(view) = self.roster.views.get_mut(id) {
            view.stats.apply(&change, policy);
            self.queue(id, change);
            self.reorder(id);
        }
        if let Some(s) = session {
            self.sessions.insert(session_key(id.provider(), s), id.clone(), now);
        }
    }

    /// The profile's last use changed: its place in the rotation index too.
    fn reorder(&mut self, id: &ProfileId) {
        if let Some(index) = self.rotation.get_mut(id.provider()) {
            index.touch(id, &self.roster.views);
        }
    }

    /// The roster or the config changed: the rotation indexes are built again on next use.
    fn forget_order(&mut self) {
        self.rotation.clear();
    }

    /// A change already applied to a profile's stats here: queued for the writer in the same
    /// critical section, so that the writer sees changes in the order they happened.
    fn queue(&mut self, id: &ProfileId, change: Change) {
        self.queued += 1;
        *self.pending_changes.entry(id.clone()).or_default() += 1;
        match self.pending.get_mut(id) {
            Some(p) => p.push(change),
            None => {
                let mut p = Unwritten::default();
                p.push(change);
                self.pending.insert(id.clone(), p);
            }
        }
    }

    /// A profile's changes not yet written, in order: those in flight, then those queued.
    fn unwritten(&self, id: &ProfileId) -> impl Iterator<Item = Change> + '_ {
        let inflight = self.inflight.get(id).into_iter().flatten().cloned();
        inflight.chain(self.pending.get(id).into_iter().flat_map(Unwritten::replay))
    }

    /// Stats as stored become the profiles' state, with their unwritten changes replayed.
    fn put_stats(&mut self, stored: Vec<(ProfileId, UsageStats)>, policy: &CooldownPolicy) {
        for (id, mut s) in stored {
            if !self.roster.views.contains_key(&id) {
                continue;
            }
            for c in self.unwritten(&id) {
                s.apply(&c, policy);
            }
            if let Some(view) = self.roster.views.get_mut(&id) {
                view.stats = s;
            }
            self.reorder(&id);
        }
    }

    fn put_models(&mut self, stored: Vec<(ModelKey, ModelCooldown)>, policy: &CooldownPolicy) {
        for (key, m) in stored {
            let mut m = Some(m);
            let inflight = self.model_inflight.get(&key).into_iter().flatten();
            for c in inflight.chain(self.model_pending.get(&key).into_iter().flatten()) {
                m = ModelCooldown::apply(m.as_ref(), c, policy);
            }
            if let Some(m) = m {
                self.model_cooldowns.insert(key, m);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_session_id_is_kept_as_its_digest() {
        let long = "u".repeat(4 << 20);
        let (_, kept) = session_key("openai", &long);
        assert_eq!(kept.len(), "sha256:".len() + 64);
        assert_eq!(session_key("openai", &long), session_key("openai", &long.clone()), "the same id, the same key");
        assert_ne!(session_key("openai", &long).1, session_key("openai", &format!("{long}v")).1);
        assert_eq!(session_key("openai", "conversation-1").1, "conversation-1", "a short one as sent");
    }
}
