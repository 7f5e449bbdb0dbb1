//! The profiles in memory: their views and the stored order (`Roster`), sessions, model
//! cooldowns, the rotation indexes, and the changes not yet written.

use super::Credential;
use super::load::views;
use crate::config::Config;
use crate::engine::gate::ProbeThrottle;
use crate::engine::order::{self, OrderRequest, Ordered, PinError, RotationIndex};
use crate::engine::recent::Recent;
use crate::engine::{
    Change, CooldownPolicy, Millis, ModelChange, ModelCooldown, ProfileId, Unwritten, UsageStats, Views,
};
use crate::settings::{Live, Settings};
use crate::store::{Origin, Snapshot};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// How long a session stays stuck to its profile without traffic, and how many are kept.
pub(super) const SESSION_TTL: Millis = 6 * 3_600_000;
pub(super) const SESSION_KEYS: usize = 10_000;
/// The longest session id kept as sent; a longer one (a client's `user` may be megabytes) is
/// kept as its SHA-256, so the map holds at most `SESSION_KEYS` short keys.
const SESSION_MAX: usize = 128;

/// The key a session sticks under: (provider, session id, or the id's digest when long).
pub(super) fn session_key(provider: &str, session: &str) -> (String, String) {
    let id = if session.len() <= SESSION_MAX {
        session.to_string()
    } else {
        use sha2::Digest;
        format!("sha256:{:x}", sha2::Sha256::digest(session.as_bytes()))
    };
    (provider.to_string(), id)
}

pub(super) type ModelKey = (String, String);

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

pub(super) struct Inner {
    /// The settings in force as this book last saw them, and the reader that tells when they
    /// change (`Shared::lock`).
    pub(super) settings: Arc<Settings>,
    pub(super) live: Live,
    pub(super) roster: Roster,
    pub(super) credentials: HashMap<ProfileId, Credential>,
    /// The nonce of each OAuth profile's sealed refresh token: the version a refresh must
    /// still find in the store to replace it (compare-and-swap).
    pub(super) token_versions: HashMap<ProfileId, Vec<u8>>,
    pub(super) model_cooldowns: HashMap<ModelKey, ModelCooldown>,
    pub(super) probes: ProbeThrottle,
    pub(super) sessions: Recent<(String, String), ProfileId>,
    /// Each provider's profiles in rotation order, built on first use and dropped when the
    /// roster or the config changes (`forget_order`).
    pub(super) rotation: HashMap<String, RotationIndex>,
    /// Changes applied here and not yet written, replayed on top of what the database says (a
    /// written batch, a reload from the feed): those the writer is writing, then those queued.
    pub(super) inflight: HashMap<ProfileId, Vec<Change>>,
    pub(super) pending: HashMap<ProfileId, Unwritten>,
    /// How many changes each pending entry holds (before coalescing): what a batch that leaves
    /// some entries pending has not written of `queued`.
    pub(super) pending_changes: HashMap<ProfileId, u64>,
    pub(super) model_inflight: HashMap<ModelKey, Vec<ModelChange>>,
    pub(super) model_pending: HashMap<ModelKey, Vec<ModelChange>>,
    /// Changes queued so far (coalesced ones too): what `flush` waits for.
    pub(super) queued: u64,
    /// Counts this server's own edits of profiles, secrets and orders (made in memory as they
    /// are stored): a reload from a snapshot read before one of them would undo it.
    pub(super) local_edits: u64,
}

/// How many usable profiles a request gets at once from the rotation index; a walk that tries
/// them all asks for the next ones.
const FIRST: usize = 8;

impl Inner {
    /// The cooldown durations in force.
    pub(super) fn policy(&self) -> CooldownPolicy {
        self.settings.config.cooldown_policy()
    }

    /// The first usable profiles of `provider` for `model`, less `exclude`, from the rotation
    /// index (built here when missing). Only for a provider without an explicit order.
    pub(super) fn first_usable(
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
    pub(super) fn use_first(
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
    pub(super) fn reorder(&mut self, id: &ProfileId) {
        if let Some(index) = self.rotation.get_mut(id.provider()) {
            index.touch(id, &self.roster.views);
        }
    }

    /// The roster or the config changed: the rotation indexes are built again on next use.
    pub(super) fn forget_order(&mut self) {
        self.rotation.clear();
    }

    /// A change already applied to a profile's stats here: queued for the writer in the same
    /// critical section, so that the writer sees changes in the order they happened.
    pub(super) fn queue(&mut self, id: &ProfileId, change: Change) {
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
    pub(super) fn unwritten(&self, id: &ProfileId) -> impl Iterator<Item = Change> + '_ {
        let inflight = self.inflight.get(id).into_iter().flatten().cloned();
        inflight.chain(self.pending.get(id).into_iter().flat_map(Unwritten::replay))
    }

    /// Stats as stored become the profiles' state, with their unwritten changes replayed.
    pub(super) fn put_stats(&mut self, stored: Vec<(ProfileId, UsageStats)>, policy: &CooldownPolicy) {
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

    pub(super) fn put_models(&mut self, stored: Vec<(ModelKey, ModelCooldown)>, policy: &CooldownPolicy) {
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
