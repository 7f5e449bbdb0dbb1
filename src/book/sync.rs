//! The book's write-behind: changes written in batches and replayed on the rows as stored; and
//! the change feed's reader (docs/scale.md).

use super::load::{LoadError, unseal};
use super::state::Inner;
use super::{Book, ModelKey, Shared};
use crate::behind::Sink;
use crate::engine::{Change, CooldownPolicy, ModelChange, ModelCooldown, ProfileId, UsageStats};
use crate::store::{Applied, SessionBinding, Snapshot, Store, StoreError};
use parking_lot::MutexGuard;
use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

/// How often the change feed is read: other writers' changes are in force within this much
/// (plus the time a reload takes).
pub const FEED_EVERY: Duration = Duration::from_millis(250);

/// How long changes gather before a write that nobody waits for.
pub(super) const GATHER: Duration = Duration::from_millis(50);

/// What the writer took to write: the changes of each profile and model.
pub(super) struct Batch {
    stats: Vec<(ProfileId, Vec<Change>)>,
    models: Vec<(ModelKey, Vec<ModelChange>)>,
    sessions: Vec<SessionBinding>,
}

/// What waits for the stats writer (`Book::backlog`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backlog {
    pub inflight: usize,
    pub pending: usize,
    pub changes: usize,
}

impl Book {
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
}

/// The book's write-behind (`crate::behind`): the queued changes, written in batches. A batch
/// is replayed on the rows as stored, and the rows written back become the book's state. A
/// failing batch is retried until the database takes it (busy, read-only or failing for a
/// while: nothing is dropped, and later changes coalesce meanwhile). From the third failure
/// on, rows are also tried one by one: when some of them can be written, the database works
/// and the others are bad rows, logged with their key and given up, so that one
/// cannot hold back the rest. The task ends when the book is dropped, after writing what was
/// left.
pub(super) struct Stats {
    pub(super) shared: Arc<Shared>,
    /// The most profiles one batch takes (`Store::stats_batch`).
    pub(super) batch: usize,
}

impl Sink for Stats {
    type Batch = Batch;
    const WHAT: &'static str = "usage stats";

    fn ready(&self) -> bool {
        self.shared.lock().pending.len() >= self.batch
    }

    fn take(&mut self) -> (Batch, u64) {
        self.shared.take(self.batch)
    }

    fn rows(batch: &Batch) -> usize {
        batch.stats.len() + batch.models.len() + batch.sessions.len()
    }

    async fn write(&mut self, store: &dyn Store, batch: &Batch) -> Result<(), StoreError> {
        let applied = store.apply(&batch.stats, &batch.models, &batch.sessions, &self.shared.policy()).await?;
        let (before, after) = applied.feed;
        self.shared.settle(&batch.stats, &batch.models, vec![applied]);
        let mut inner = self.shared.lock();
        if inner.seen == before {
            inner.seen = after; // the entries in between are this batch's own
        }
        Ok(())
    }

    /// Writes each row of the batch alone; when at least one could be written, settles them
    /// all (the ones that could not are logged and given up) and returns true.
    async fn isolate(&mut self, store: &dyn Store, batch: &Batch) -> bool {
        let shared = &self.shared;
        let policy = shared.policy();
        let mut written = Vec::new();
        let mut bad = Vec::new();
        for row in &batch.stats {
            match store.apply(std::slice::from_ref(row), &[], &[], &policy).await {
                Ok(applied) => written.push(applied),
                Err(e) => bad.push((row.0.to_string(), e)),
            }
        }
        for row in &batch.models {
            match store.apply(&[], std::slice::from_ref(row), &[], &policy).await {
                Ok(applied) => written.push(applied),
                Err(e) => bad.push((format!("model {}/{}", row.0.0, row.0.1), e)),
            }
        }
        for b in &batch.sessions {
            if let Err(e) = store.apply(&[], &[], std::slice::from_ref(b), &policy).await {
                bad.push((format!("session binding to {}", b.profile), e));
            }
        }
        if bad.len() == Self::rows(batch) {
            return false;
        }
        for (key, e) in bad {
            tracing::error!(key, error = %e, "usage stats of this profile or model could not be written; given up");
        }
        shared.settle(&batch.stats, &batch.models, written);
        true
    }
}

/// The change feed's reader: reads the feed every `FEED_EVERY`, and at once when the database
/// says something changed (PostgreSQL's notifications), until the book is dropped. A task of
/// its own, beside the stats writer's: a write waiting for the database (behind the other
/// servers' on PostgreSQL) never holds back what the others changed. Both put rows as stored;
/// the feed position each was read at keeps the older read from undoing the newer
/// (`Inner::put_stats`).
pub(super) async fn read_feed(shared: Weak<Shared>, store: Arc<dyn Store>) {
    let mut every = tokio::time::interval(FEED_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut wake = store.wake();
    loop {
        tokio::select! {
            _ = every.tick() => {}
            _ = crate::store::woken(&mut wake) => {}
        }
        let Some(shared) = shared.upgrade().filter(|s| !s.writer.is_closed()) else { return };
        match follow(store.as_ref(), &shared).await {
            Ok(head) => {
                let mut inner = shared.lock();
                inner.seen = inner.seen.max(head);
            }
            Err(e) => tracing::warn!(error = %e, "reading the change feed failed; retrying"),
        }
    }
}

/// Reads the change feed after the position seen so far and reloads what changed; returns the
/// position it read up to.
async fn follow(store: &dyn Store, shared: &Shared) -> Result<i64, LoadError> {
    let seen = shared.lock().seen;
    let entries = store.changes_after(seen).await?;
    let Some(head) = entries.last().map(|e| e.seq) else { return Ok(seen) };
    let kinds = |k: &str| entries.iter().any(|e| e.kind == k);
    if kinds("session") {
        let bindings: Vec<SessionBinding> =
            entries.iter().filter(|e| e.kind == "session").filter_map(|e| SessionBinding::of_feed(&e.key)).collect();
        // Kept as used when they were bound, the latest of them.
        let at = bindings.iter().map(|b| b.bound_at).max().unwrap_or_default();
        shared.lock().sessions.adopt(bindings, at);
    }
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
        let (at, stored) = store.stats_of(&ids).await?;
        shared.refresh_stats(stored, at);
    }
    if kinds("model") {
        let (at, stored) = store.model_cooldowns().await?;
        shared.refresh_models(stored, at);
    }
    Ok(head)
}

impl Shared {
    /// The book's state, with the settings in force: when they changed since the last look,
    /// the rotation indexes built under the old ones go.
    pub(super) fn lock(&self) -> MutexGuard<'_, Inner> {
        let mut inner = self.inner.lock();
        if let Some(settings) = inner.live.changed() {
            inner.settings = settings;
            inner.forget_order();
        }
        inner
    }

    fn policy(&self) -> CooldownPolicy {
        self.lock().policy()
    }

    /// Moves the queued changes of at most `most` profiles (and every model's) to the writer
    /// (in flight until settled), with the count of changes queued up to them; what is left is
    /// the next batch's, at once.
    fn take(&self, most: usize) -> (Batch, u64) {
        let mut guard = self.lock();
        let inner = &mut *guard;
        let ids: Vec<ProfileId> = inner.pending.keys().take(most).cloned().collect();
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
        let sessions = inner.sessions.pending.drain().map(|(_, b)| b).collect();
        let left: u64 = inner.pending_changes.values().sum();
        if left > 0 {
            self.writer.wake();
        }
        (Batch { stats, models, sessions }, inner.queued - left)
    }

    /// A batch was written (or given up): its changes are no longer in flight, and the rows
    /// as stored (each write's, at the feed position its write ended at), with what was queued
    /// since replayed on top, become the book's state.
    fn settle(
        &self,
        stats: &[(ProfileId, Vec<Change>)],
        models: &[(ModelKey, Vec<ModelChange>)],
        written: Vec<Applied>,
    ) {
        let mut guard = self.lock();
        let inner = &mut *guard;
        let policy = inner.policy();
        for (id, _) in stats {
            inner.inflight.remove(id);
        }
        for (key, _) in models {
            inner.model_inflight.remove(key);
        }
        for applied in written {
            inner.put_stats(applied.stats, applied.feed.1, &policy);
            inner.put_models(applied.models, applied.feed.1, &policy);
        }
    }

    fn refresh_stats(&self, stored: Vec<(ProfileId, Option<UsageStats>)>, at: i64) {
        let mut inner = self.lock();
        let policy = inner.policy();
        inner.put_stats(stored.into_iter().filter_map(|(id, s)| Some((id, s?))), at, &policy);
    }

    fn refresh_models(&self, stored: HashMap<ModelKey, ModelCooldown>, at: i64) {
        let mut inner = self.lock();
        let policy = inner.policy();
        inner.put_models(stored, at, &policy);
    }

    /// Profiles, secrets or orders changed in the database: the roster and credentials are
    /// rebuilt from it; sessions and probe throttles stay. Not when this server edited its
    /// roster since `edits` was read (false).
    fn reload(&self, snapshot: Snapshot, edits: u64) -> Result<bool, LoadError> {
        let settings = self.lock().settings.clone();
        let (mut roster, credentials, token_versions) = unseal(&snapshot, &settings.config, &self.key)?;
        let mut guard = self.lock();
        let inner = &mut *guard;
        let policy = inner.policy();
        if inner.local_edits != edits {
            return Ok(false);
        }
        for (id, view) in roster.views.iter_mut() {
            // Stats the writer put from a later write than the snapshot stay.
            let newer = inner.stats_at.get(id).is_some_and(|&at| at > snapshot.head);
            match inner.roster.views.get(id).filter(|_| newer) {
                Some(held) => view.stats = held.stats.clone(),
                None => {
                    for c in inner.unwritten(id) {
                        view.stats.apply(&c, &policy);
                    }
                    inner.stats_at.insert(id.clone(), snapshot.head);
                }
            }
        }
        inner.pending.retain(|id, _| roster.views.contains_key(id));
        inner.pending_changes.retain(|id, _| roster.views.contains_key(id));
        inner.stats_at.retain(|id, _| roster.views.contains_key(id));
        inner.roster = roster;
        inner.forget_order();
        inner.credentials = credentials;
        inner.token_versions = token_versions;
        inner.put_models(snapshot.model_cooldowns, snapshot.head, &policy);
        Ok(true)
    }
}
