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
//!
//! `state`: the profiles in memory and what ordering reads; `sync`: the write-behind and the
//! change feed; `load`: the first read and unsealing; `credentials`: the decrypted secrets.
//! The config in force is the live settings' (`crate::settings::Live`), read under the book's
//! lock: a reload takes effect at the next change or pick, and drops the rotation indexes.

mod credentials;
mod load;
mod state;
mod sync;

pub use credentials::{Credential, Exchange};
pub use load::{LoadError, config_rows, views};
pub use state::{Roster, SESSION_ROWS, SESSION_TTL, agents_session};
pub use sync::{Backlog, FEED_EVERY};

use crate::behind::Writer;
use crate::config::Config;
use crate::engine::gate::{self, Availability, Gate, Position};
use crate::engine::order::{Ordered, PinError, RotationIndex, Slot};
use crate::engine::quota::Quota;
use crate::engine::{
    Change, Failure, Millis, ModelChange, ModelCooldown, ProfileId, ProfileView, Reason, Until, UsageStats,
};
use crate::secrets::MasterKey;
use crate::store::{SessionBinding, StoredProfile};
use parking_lot::{Mutex, MutexGuard};
use state::{Inner, ModelKey};
use std::sync::Arc;

/// What the book and its background task share.
struct Shared {
    inner: Mutex<Inner>,
    key: Arc<MasterKey>,
    /// The stats' write-behind: woken when changes are queued; it counts what it wrote in
    /// `Inner::queued`'s terms.
    writer: Arc<Writer>,
}

pub struct Book {
    shared: Arc<Shared>,
}

/// What `Book::pick` gives a request.
pub struct Picked {
    pub ordered: Ordered,
    /// The first profile was usable and is marked used.
    pub marked: bool,
    /// That bound the request's session to it, or moved it there (written with the stats).
    pub bound: bool,
}

impl Drop for Book {
    fn drop(&mut self) {
        self.shared.writer.close();
    }
}

impl Book {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.shared.lock()
    }

    /// The order of `provider`'s profiles for `model` (with session stickiness and pins, less
    /// `exclude`), and the first of them, when usable, marked used (and stuck to `session`) in
    /// the same critical section, so that concurrent requests and leases spread over the
    /// profiles instead of all taking the least recently used one. The mark is later than every
    /// other profile's of the provider, even within one millisecond.
    pub fn pick(
        &self,
        config: &Config,
        (provider, model): (&str, &str),
        session: Option<&str>,
        pin: Option<&ProfileId>,
        exclude: &[ProfileId],
        now: Millis,
    ) -> Result<Picked, PinError> {
        let mut guard = self.lock();
        let inner = &mut *guard;
        let policy = inner.policy();
        let sticky = session.and_then(|s| Some(inner.sessions.get(provider, s, now)?.profile.clone()));
        let pinned = pin.is_some_and(|p| p.provider() == provider);
        if !pinned && sticky.is_none() && !inner.roster.has_explicit_order(config, provider) {
            let first = inner.first_usable(config, (provider, model), exclude, now);
            if let Some(id) = first.first().cloned() {
                let latest = inner.rotation.get(provider).and_then(RotationIndex::latest);
                let bound = inner.use_first(&id, latest, session, now, &policy);
                self.shared.writer.wake();
                let slots = first.into_iter().map(|id| Slot { id, blocked: None }).collect();
                return Ok(Picked { ordered: Ordered { slots, pinned: false, more: true }, marked: true, bound });
            }
        }
        let mut ordered = inner.roster.order(config, provider, model, sticky.as_ref(), pin, now)?;
        ordered.slots.retain(|s| !exclude.contains(&s.id));
        let Some(first) = ordered.slots.first().filter(|s| s.blocked.is_none()).map(|s| s.id.clone()) else {
            return Ok(Picked { ordered, marked: false, bound: false });
        };
        let views = &inner.roster.views;
        let latest = ordered.slots.iter().filter_map(|s| views.get(&s.id)?.stats.last_used).max();
        let bound = inner.use_first(&first, latest, session, now, &policy);
        self.shared.writer.wake();
        Ok(Picked { ordered, marked: true, bound })
    }

    /// Whether `session` sticks here to a profile of `provider` that can serve `model` now:
    /// then this server need not ask the database (docs/scale.md, "Sessions").
    pub fn knows_session(&self, (provider, model): (&str, &str), session: &str, now: Millis) -> bool {
        let inner = self.lock();
        let Some(bound) = inner.sessions.get(provider, session, now) else { return false };
        inner.roster.views.get(&bound.profile).is_some_and(|v| v.serves(model, now))
    }

    /// Bindings read from the database: kept unless this server knows a later one.
    pub fn adopt_sessions(&self, bindings: Vec<SessionBinding>, now: Millis) {
        self.lock().sessions.adopt(bindings, now);
    }

    /// Every profile in force with its state at `now` (for `/metrics`).
    pub fn states(&self, now: Millis) -> Vec<(ProfileId, crate::status::Status)> {
        let inner = self.lock();
        inner.roster.views.values().map(|v| (v.id.clone(), crate::status::Status::of(v, now))).collect()
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
        let mut guard = self.lock();
        let inner = &mut *guard;
        let policy = inner.policy();
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
        let next = ModelCooldown::apply(inner.model_cooldowns.get(&key), &change, &inner.policy())?;
        inner.model_cooldowns.insert(key.clone(), next.clone());
        inner.model_pending.entry(key).or_default().push(change);
        inner.queued += 1;
        self.shared.writer.wake();
        Some(next)
    }

    /// The profile was chosen for an attempt; `session` sticks to it. True when that bound or
    /// moved the session.
    pub fn mark_used(&self, id: &ProfileId, session: Option<&str>, now: Millis) -> bool {
        self.update(id, Change::Used(now));
        let Some(s) = session else { return false };
        let bound = self.lock().stick(id, s, now);
        self.shared.writer.wake();
        bound
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
        let until = self.update(id, Change::Failed(failure.clone(), now)).flatten();
        if until.is_some() {
            self.lock().probes.failed(id.provider(), now);
        }
        until
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
        inner.probes.failed(provider, now);
        next.expect("a model_not_found always leaves a cooldown").until
    }

    /// A snapshot of what ordering reads (for listings; the hot path never copies it).
    /// How many profiles `provider` has (enabled or not).
    pub fn profile_count(&self, provider: &str) -> usize {
        self.lock().roster.views.keys().filter(|id| id.provider() == provider).count()
    }

    pub fn roster(&self) -> Roster {
        self.lock().roster.clone()
    }

    /// Resets the windows and counters of every profile whose windows have ended, and writes
    /// them, so that what `usage_stats` holds is current when an auditor reads it (docs/rotation.md).
    /// Returns how many profiles were reset.
    pub fn sweep(&self, now: Millis) -> usize {
        let mut guard = self.lock();
        let inner = &mut *guard;
        let policy = inner.policy();
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

    /// Decides whether a candidate is tried, probed or skipped (claims the probe atomically).
    pub fn gate(&self, pos: Position<'_>, avail: Availability, now: Millis) -> Gate {
        gate::gate(pos, avail, &mut self.lock().probes, now)
    }
}

/// Edits of the roster made through the API, in force at once (already in the store).
impl Book {
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
    /// Marks the profile paid or not, as the store holds it.
    pub fn set_paid(&self, id: &ProfileId, paid: bool) {
        let mut inner = self.lock();
        inner.local_edits += 1;
        match paid {
            true => inner.roster.paid.insert(id.clone()),
            false => inner.roster.paid.remove(id),
        };
    }
    /// Whether the store marks the profile paid.
    pub fn marked_paid(&self, id: &ProfileId) -> bool {
        self.lock().roster.paid.contains(id)
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
}
