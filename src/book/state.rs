//! The profiles in memory: their views and the stored order (`Roster`), sessions, model
//! cooldowns, the rotation indexes, and the changes not yet written.

use super::Credential;
use super::load::{Unsealed, views};
use crate::config::Config;
use crate::engine::gate::ProbeThrottle;
use crate::engine::order::{self, OrderRequest, Ordered, PinError, RotationIndex};
use crate::engine::recent::Recent;
use crate::engine::{
    Change, CooldownPolicy, Millis, ModelChange, ModelCooldown, ProfileId, Unwritten, UsageStats, Views,
};
use crate::settings::{Live, Settings};
use crate::store::{Origin, SessionBinding, Snapshot};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

/// How long a session stays stuck to its profile without traffic, and how many are kept in
/// memory (the database keeps more: `SESSION_ROWS`).
pub const SESSION_TTL: Millis = 6 * 3_600_000;
const SESSION_KEYS: usize = 10_000;
/// The most bindings the database keeps (docs/scale.md, "Sessions").
pub const SESSION_ROWS: usize = 1_000_000;
/// The most new bindings one agent makes on one server in `SESSION_TTL`: past it, its new
/// sessions are served unbound (docs/scale.md, "Sessions").
const SESSIONS_PER_AGENT: u32 = 50_000;
/// How often a binding's last use is written while it is used: it expires in the database at
/// most this much after its idle time is up.
const SEEN_EVERY: Millis = 10 * 60_000;
/// The longest session id kept as sent; a longer one (a client's `user` may be megabytes) is
/// kept as its SHA-256, so the map holds at most `SESSION_KEYS` short keys.
const SESSION_MAX: usize = 128;

/// A session id as kept: as sent, or its digest when long.
fn session_id(session: &str) -> String {
    if session.len() <= SESSION_MAX {
        session.to_string()
    } else {
        use sha2::Digest;
        format!("sha256:{:x}", sha2::Sha256::digest(session.as_bytes()))
    }
}

/// A session as an agent's: its name, a newline, and the `session_id`. One agent's session id
/// names nothing of another's (agent names hold no newline).
pub fn agents_session(agent: &str, session: &str) -> String {
    format!("{agent}\n{}", session_id(session))
}

/// The key a session (`agents_session`) sticks under: (provider, session).
fn session_key(provider: &str, session: &str) -> (String, String) {
    (provider.to_string(), session.to_string())
}

/// A session's binding as this server knows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Bound {
    pub(super) profile: ProfileId,
    /// When the session landed on the profile (on whichever server): the later binding wins.
    bound_at: Millis,
    /// Its last use as this server last wrote or read it.
    seen_at: Millis,
}

/// The sessions' bindings as this server knows them (`SESSION_KEYS` at most, idle ones
/// forgotten after `SESSION_TTL`), and those it has to write (docs/scale.md, "Sessions").
pub(super) struct Sessions {
    known: Recent<(String, String), Bound>,
    /// Bindings made, moved or used since their last write, for the stats writer.
    pub(super) pending: HashMap<(String, String), SessionBinding>,
    /// Per agent: when its current `SESSION_TTL` began and the new bindings it made since.
    made: HashMap<String, (Millis, u32)>,
    /// The most new bindings per agent in `SESSION_TTL` (`SESSIONS_PER_AGENT`).
    per_agent: u32,
}

impl Sessions {
    pub(super) fn new() -> Sessions {
        Sessions {
            known: Recent::new(SESSION_TTL, SESSION_KEYS),
            pending: HashMap::new(),
            made: HashMap::new(),
            per_agent: SESSIONS_PER_AGENT,
        }
    }

    /// Whether the agent of `session` may make one more new binding now (`SESSIONS_PER_AGENT`).
    fn may_bind(&mut self, session: &str, now: Millis) -> bool {
        let agent = session.split_once('\n').map_or("", |(a, _)| a);
        let (since, n) = self.made.entry(agent.to_string()).or_insert((now, 0));
        if now - *since >= SESSION_TTL || now < *since {
            (*since, *n) = (now, 0);
        }
        if *n >= self.per_agent {
            if *n == self.per_agent {
                tracing::warn!(
                    agent,
                    "an agent made {} new session bindings in 6 h: its further new sessions are served unbound",
                    self.per_agent
                );
                *n += 1;
            }
            return false;
        }
        *n += 1;
        true
    }

    pub(super) fn get(&self, provider: &str, session: &str, now: Millis) -> Option<&Bound> {
        Some(self.known.get(&session_key(provider, session), now)?.0)
    }

    /// Sticks `session` to the profile: a new binding or a move is queued for the database, and
    /// so is its last use every `SEEN_EVERY`. Whether it bound or moved the session, and
    /// whether it queued a write.
    pub(super) fn stick(&mut self, id: &ProfileId, session: &str, now: Millis) -> (bool, bool) {
        let key = session_key(id.provider(), session);
        let (bound_at, moved) = match self.known.get(&key, now).map(|(b, _)| b.clone()) {
            Some(b) if b.profile == *id && now - b.seen_at < SEEN_EVERY => {
                self.known.insert(key, b, now);
                return (false, false);
            }
            Some(b) if b.profile == *id => (b.bound_at, false),
            Some(_) => (now, true),
            None if self.may_bind(session, now) => (now, true),
            None => return (false, false),
        };
        let binding = SessionBinding { session: key.1.clone(), profile: id.clone(), bound_at, seen_at: now };
        self.known.insert(key.clone(), Bound { profile: id.clone(), bound_at, seen_at: now }, now);
        self.pending.insert(key, binding);
        (moved, true)
    }

    /// Bindings the database holds (read, or from the feed), as used at `now`: kept unless
    /// this server knows a later one. True when one changed what this server knew.
    pub(super) fn adopt(&mut self, bindings: Vec<SessionBinding>, now: Millis) -> bool {
        let mut changed = false;
        for b in bindings {
            let key = (b.profile.provider().to_string(), b.session);
            let known = self.known.get(&key, now).map(|(k, _)| (k.bound_at, k.profile == b.profile));
            if known.is_some_and(|(bound_at, same)| bound_at > b.bound_at || same) {
                continue;
            }
            changed = true;
            self.known.insert(key, Bound { profile: b.profile, bound_at: b.bound_at, seen_at: b.seen_at }, now);
        }
        changed
    }
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
    /// The profiles marked paid in the store (`profiles.paid`).
    pub paid: HashSet<ProfileId>,
}

impl Roster {
    /// Whether serving a request with `id` costs money: marked so in the store, or declared
    /// `paid = true` in the config file.
    pub fn is_paid(&self, config: &Config, id: &ProfileId) -> bool {
        self.paid.contains(id) || config.auth.profiles.get(id).is_some_and(|p| p.paid)
    }

    pub fn new(snapshot: &Snapshot, config: &Config) -> Roster {
        let mut stored_ids: BTreeMap<String, Vec<ProfileId>> = BTreeMap::new();
        for p in snapshot.profiles.iter().filter(|p| p.origin == Origin::Stored) {
            stored_ids.entry(p.id.provider().to_string()).or_default().push(p.id.clone());
        }
        let emails = snapshot.profiles.iter().filter_map(|p| Some((p.id.clone(), p.email.clone()?))).collect();
        let paid = snapshot.profiles.iter().filter(|p| p.paid).map(|p| p.id.clone()).collect();
        Roster { views: views(snapshot, config), emails, stored_ids, orders: snapshot.orders.clone(), paid }
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
    pub(super) sessions: Sessions,
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
    /// The change feed's position read so far (`sync::follow`; a batch of the stats writer
    /// moves it over its own entries).
    pub(super) seen: i64,
    /// The feed's position each profile's stats and each model's cooldown were stored at when
    /// put here: the writer and the feed's reader put rows read at different times, and the
    /// older read must not undo the newer one.
    pub(super) stats_at: HashMap<ProfileId, i64>,
    pub(super) models_at: HashMap<ModelKey, i64>,
}

/// How many usable profiles a request gets at once from the rotation index; a walk that tries
/// them all asks for the next ones.
const FIRST: usize = 8;

impl Inner {
    /// The state of a book just loaded: what the store held at feed position `seen`, nothing
    /// queued.
    pub(super) fn new(
        settings: Arc<Settings>,
        live: Live,
        (roster, credentials, token_versions): Unsealed,
        model_cooldowns: HashMap<ModelKey, ModelCooldown>,
        seen: i64,
    ) -> Inner {
        Inner {
            settings,
            live,
            roster,
            credentials,
            token_versions,
            model_cooldowns,
            probes: ProbeThrottle::default(),
            sessions: Sessions::new(),
            rotation: HashMap::new(),
            inflight: HashMap::new(),
            pending: HashMap::new(),
            pending_changes: HashMap::new(),
            model_inflight: HashMap::new(),
            model_pending: HashMap::new(),
            queued: 0,
            local_edits: 0,
            seen,
            stats_at: HashMap::new(),
            models_at: HashMap::new(),
        }
    }

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
    /// (`latest`), and sticks `session` to it; true when that bound or moved the session.
    pub(super) fn use_first(
        &mut self,
        id: &ProfileId,
        latest: Option<Millis>,
        session: Option<&str>,
        now: Millis,
        policy: &CooldownPolicy,
    ) -> bool {
        let change = Change::Used(latest.map_or(now, |l| now.max(l + 1)));
        if let Some(view) = self.roster.views.get_mut(id) {
            view.stats.apply(&change, policy);
            self.queue(id, change);
            self.reorder(id);
        }
        session.is_some_and(|s| self.stick(id, s, now))
    }

    /// Sticks `session` to the profile (`Sessions::stick`); true when it bound or moved it.
    pub(super) fn stick(&mut self, id: &ProfileId, session: &str, now: Millis) -> bool {
        let (moved, queued) = self.sessions.stick(id, session, now);
        self.queued += u64::from(queued);
        moved
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
    /// Puts stats as stored at feed position `at`, with what is unwritten replayed on them;
    /// not those of a profile already put from a later position.
    pub(super) fn put_stats(
        &mut self,
        stored: impl IntoIterator<Item = (ProfileId, UsageStats)>,
        at: i64,
        policy: &CooldownPolicy,
    ) {
        for (id, mut s) in stored {
            if !self.roster.views.contains_key(&id) || self.stats_at.get(&id).is_some_and(|&put| put > at) {
                continue;
            }
            for c in self.unwritten(&id) {
                s.apply(&c, policy);
            }
            if let Some(view) = self.roster.views.get_mut(&id) {
                view.stats = s;
            }
            self.stats_at.insert(id.clone(), at);
            self.reorder(&id);
        }
    }

    /// Puts model cooldowns as stored at feed position `at`, as `put_stats` does.
    pub(super) fn put_models(
        &mut self,
        stored: impl IntoIterator<Item = (ModelKey, ModelCooldown)>,
        at: i64,
        policy: &CooldownPolicy,
    ) {
        for (key, m) in stored {
            if self.models_at.get(&key).is_some_and(|&put| put > at) {
                continue;
            }
            let mut m = Some(m);
            let inflight = self.model_inflight.get(&key).into_iter().flatten();
            for c in inflight.chain(self.model_pending.get(&key).into_iter().flatten()) {
                m = ModelCooldown::apply(m.as_ref(), c, policy);
            }
            if let Some(m) = m {
                self.model_cooldowns.insert(key.clone(), m);
            }
            self.models_at.insert(key, at);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> ProfileId {
        s.parse().unwrap()
    }

    /// A book's state holding one profile, `openai:a`, nothing queued.
    fn holding_one() -> Inner {
        let config = Config::from_toml("").unwrap();
        let (_, live) = crate::settings::channel(Settings::new(config.clone()));
        let settings = Settings::new(config);
        let mut roster = Roster::default();
        let view = crate::engine::ProfileView {
            id: id("openai:a"),
            kind: crate::engine::ProfileType::ApiKey,
            enabled: true,
            has_secret: true,
            expires_at: None,
            stats: UsageStats::default(),
        };
        roster.views.insert(view.id.clone(), view);
        Inner::new(Arc::new(settings), live, (roster, HashMap::new(), HashMap::new()), HashMap::new(), 0)
    }

    /// The writer and the feed's reader put rows read at different feed positions, in either
    /// order: the state is the row read last in the feed, whichever was put last.
    #[test]
    fn stats_and_model_cooldowns_read_earlier_in_the_feed_never_undo_later_ones() {
        let mut inner = holding_one();
        let policy = inner.policy();
        let a = id("openai:a");
        let used = |at: Millis| UsageStats { last_used: Some(at), success_count: at as u64, ..UsageStats::default() };
        let model = ("openai".to_string(), "gpt".to_string());
        let cooled = |until: Millis| ModelCooldown { until, error_count: 1, last_failure_at: until - 60_000 };

        inner.put_stats([(a.clone(), used(20))], 20, &policy);
        inner.put_stats([(a.clone(), used(10))], 10, &policy);
        assert_eq!(inner.roster.views[&a].stats, used(20), "the earlier read came last: ignored");
        inner.put_stats([(a.clone(), used(20))], 20, &policy);
        assert_eq!(inner.roster.views[&a].stats, used(20), "the same position again: the same row");
        inner.put_stats([(a.clone(), used(30))], 30, &policy);
        assert_eq!(inner.roster.views[&a].stats, used(30), "a later read: taken");

        inner.put_models([(model.clone(), cooled(2_000))], 20, &policy);
        inner.put_models([(model.clone(), cooled(1_000))], 10, &policy);
        assert_eq!(inner.model_cooldowns[&model], cooled(2_000));
        inner.put_models([(model.clone(), cooled(3_000))], 30, &policy);
        assert_eq!(inner.model_cooldowns[&model], cooled(3_000));

        inner.put_stats([(id("openai:gone"), used(40))], 40, &policy);
        assert!(!inner.stats_at.contains_key(&id("openai:gone")), "a profile not held is not tracked");
    }

    fn written(s: &mut Sessions) -> Vec<(String, i64, i64)> {
        s.pending.drain().map(|(_, b)| (b.profile.to_string(), b.bound_at, b.seen_at)).collect()
    }

    #[test]
    fn a_binding_is_written_when_made_and_moved_and_its_use_every_ten_minutes() {
        let mut s = Sessions::new();
        let t = 1_000_000;
        assert_eq!(s.stick(&id("openai:a"), "c1", t), (true, true), "made");
        assert_eq!(written(&mut s), [("openai:a".into(), t, t)]);
        assert_eq!(s.stick(&id("openai:a"), "c1", t + SEEN_EVERY - 1), (false, false), "used: nothing to write");
        assert!(written(&mut s).is_empty());
        assert_eq!(s.stick(&id("openai:a"), "c1", t + SEEN_EVERY), (false, true), "its use, ten minutes on");
        assert_eq!(written(&mut s), [("openai:a".into(), t, t + SEEN_EVERY)], "bound when it was");
        assert_eq!(s.stick(&id("openai:b"), "c1", t + SEEN_EVERY + 5), (true, true), "moved");
        assert_eq!(written(&mut s), [("openai:b".into(), t + SEEN_EVERY + 5, t + SEEN_EVERY + 5)]);
        assert_eq!(s.stick(&id("anthropic:a"), "c1", t + SEEN_EVERY + 6), (true, true), "each provider its own");
        assert_eq!(s.get("openai", "c1", t + SEEN_EVERY + 6).unwrap().profile, id("openai:b"));
        assert!(s.get("openai", "c1", t + SEEN_EVERY + 5 + SESSION_TTL).is_none(), "forgotten when idle 6 h");
    }

    #[test]
    fn the_later_binding_wins_whichever_server_made_it() {
        let mut s = Sessions::new();
        let t = 1_000_000;
        s.stick(&id("openai:a"), "c1", t);
        let stored =
            |p: &str, at: i64| SessionBinding { session: "c1".into(), profile: id(p), bound_at: at, seen_at: at };
        assert!(!s.adopt(vec![stored("openai:c", t - 1)], t + 1), "an older one is not taken");
        assert!(!s.adopt(vec![stored("openai:a", t + 3)], t + 3), "the same profile changes nothing");
        assert!(s.adopt(vec![stored("openai:b", t + 2)], t + 3), "a later move is");
        assert_eq!(s.get("openai", "c1", t + 3).unwrap().profile, id("openai:b"));
        assert_eq!(s.stick(&id("openai:b"), "c1", t + 4), (false, false), "then used without a write");
        assert!(!s.adopt(vec![stored("openai:a", t)], t + 4));
    }

    #[test]
    fn a_long_session_id_is_kept_as_its_digest_under_its_agent() {
        let long = "u".repeat(4 << 20);
        let kept = agents_session("planner", &long);
        assert_eq!(kept.len(), "planner\nsha256:".len() + 64);
        assert_eq!(kept, agents_session("planner", &long.clone()), "the same id, the same key");
        assert_ne!(kept, agents_session("planner", &format!("{long}v")));
        assert_eq!(agents_session("planner", "conversation-1"), "planner\nconversation-1", "a short one as sent");
        assert_ne!(agents_session("coder", "conversation-1"), agents_session("planner", "conversation-1"));
    }

    #[test]
    fn an_agent_makes_at_most_its_share_of_new_bindings() {
        let mut s = Sessions { per_agent: 3, ..Sessions::new() };
        let t = 1_000_000;
        for i in 0..3 {
            assert_eq!(s.stick(&id("openai:a"), &format!("flood\n{i}"), t), (true, true));
        }
        assert_eq!(s.stick(&id("openai:a"), "flood\nmore", t), (false, false), "past its share: unbound");
        assert!(s.get("openai", "flood\nmore", t).is_none());
        assert_eq!(s.stick(&id("openai:a"), "other\nc1", t), (true, true), "another agent's are not counted");
        assert_eq!(s.stick(&id("openai:b"), "flood\n0", t + 1), (true, true), "a known one still moves");
        assert_eq!(s.stick(&id("openai:a"), "flood\nmore", t + SESSION_TTL), (true, true), "6 h on, a new share");
    }
}
