//! Stage 1: the order in which a provider's profiles are tried (docs/rotation.md).

use super::Views;
use super::quota::Floor;
use super::{Millis, ProfileId, ProfileView, Reason, Until, Unusable};
use serde::Deserialize;

/// Round-robin keys: `lru` = last used first, then type; `type_first` swaps them so that
/// subscription accounts are used before pay-per-use keys.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Rotation {
    #[default]
    Lru,
    TypeFirst,
}

/// Everything the order depends on, besides the profiles themselves.
#[derive(Clone, Debug)]
pub struct OrderRequest<'a> {
    pub provider: &'a str,
    pub model: &'a str,
    pub now: Millis,
    /// `auth.order[provider]` set through the API or web page (stored in the database).
    pub stored_order: Option<&'a [ProfileId]>,
    /// `auth.order[provider]` from the config file.
    pub config_order: Option<&'a [ProfileId]>,
    /// Profiles declared for this provider in the config file.
    pub configured: &'a [ProfileId],
    /// Profiles stored in the database for this provider.
    pub stored: &'a [ProfileId],
    pub rotation: Rotation,
    /// The profile that served this request's session last.
    pub sticky: Option<&'a ProfileId>,
    /// `x-rota-profile`: used even when cooled, never rotated. Ignored for another provider.
    pub pin: Option<&'a ProfileId>,
    /// `rotation.quota_floor`: profiles at it for this model go after those with quota.
    pub quota_floor: Floor,
}

/// One profile in the order, with the window that blocks it for this model, if any.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Slot {
    pub id: ProfileId,
    pub blocked: Option<(Until, Reason)>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ordered {
    pub slots: Vec<Slot>,
    /// The request pinned a profile: it is the only slot and it never rotates.
    pub pinned: bool,
    /// Only the first usable profiles are listed (`RotationIndex::first`): the order goes on,
    /// and asking again without them gives the next ones.
    pub more: bool,
}

impl Ordered {
    pub fn ids(&self) -> Vec<&str> {
        self.slots.iter().map(|s| s.id.as_str()).collect()
    }

    /// When every slot is blocked: the soonest end and the dominant reason (the most common
    /// one, ties to the soonest window). `None` when a slot is usable or there is none.
    pub fn all_blocked(&self) -> Option<(Until, Reason)> {
        if self.slots.is_empty() || self.slots.iter().any(|s| s.blocked.is_none()) {
            return None;
        }
        let soonest = self.slots.iter().filter_map(|s| s.blocked).map(|b| b.0).min()?;
        let mut counts: Vec<(Reason, usize, Until)> = Vec::new();
        for (until, reason) in self.slots.iter().filter_map(|s| s.blocked) {
            match counts.iter_mut().find(|c| c.0 == reason) {
                Some(c) => {
                    c.1 += 1;
                    c.2 = c.2.min(until);
                }
                None => counts.push((reason, 1, until)),
            }
        }
        let dominant = counts.iter().max_by(|a, b| a.1.cmp(&b.1).then(b.2.cmp(&a.2)))?.0;
        Some((soonest, dominant))
    }
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PinError {
    #[error("pinned profile `{0}` does not exist")]
    Unknown(ProfileId),
    #[error("pinned profile `{0}` cannot be used: {1}")]
    Unusable(ProfileId, Unusable),
    /// The provider has an explicit order that leaves the profile out: it is not used.
    #[error("pinned profile `{0}` is not in the explicit order of `{1}` ({2}): it is not used")]
    NotInOrder(ProfileId, String, String),
}

/// The explicit order in force: the stored one beats the config file's; an empty list is none.
fn explicit<'a>(req: &OrderRequest<'a>) -> Option<&'a [ProfileId]> {
    req.stored_order.filter(|o| !o.is_empty()).or(req.config_order.filter(|o| !o.is_empty()))
}

/// Resolves the order of `req.provider`'s profiles for `req.model`.
pub fn order(req: &OrderRequest<'_>, profiles: &Views) -> Result<Ordered, PinError> {
    if let Some(pin) = req.pin.filter(|p| p.provider() == req.provider) {
        let view = profiles.get(pin).ok_or_else(|| PinError::Unknown(pin.clone()))?;
        if let Some(why) = view.unusable(req.now) {
            return Err(PinError::Unusable(pin.clone(), why));
        }
        if let Some(list) = explicit(req).filter(|list| !list.contains(pin)) {
            let named: Vec<&str> = list.iter().map(ProfileId::as_str).collect();
            return Err(PinError::NotInOrder(pin.clone(), req.provider.to_string(), named.join(", ")));
        }
        let slot = Slot { id: pin.clone(), blocked: blocked(view, req) };
        return Ok(Ordered { slots: vec![slot], pinned: true, more: false });
    }

    let explicit = explicit(req);
    let base = explicit.or((!req.configured.is_empty()).then_some(req.configured)).unwrap_or(req.stored);

    let mut seen: std::collections::HashSet<&ProfileId, foldhash::fast::RandomState> =
        std::collections::HashSet::with_capacity_and_hasher(base.len(), Default::default());
    let mut usable: Vec<&ProfileView> = Vec::with_capacity(base.len());
    let mut cooled: Vec<(&ProfileView, (Until, Reason))> = Vec::new();
    for id in base {
        let Some(view) = profiles.get(id) else { continue };
        if id.provider() != req.provider || view.unusable(req.now).is_some() || !seen.insert(id) {
            continue;
        }
        match blocked(view, req) {
            Some(b) => cooled.push((view, b)),
            None => usable.push(view),
        }
    }

    if explicit.is_none() {
        // Sort keys computed once, inline (no pointer chasing while sorting); the position in
        // `base` breaks ties, so the unstable sort orders exactly as a stable one would.
        let lru = |v: &ProfileView| v.stats.last_used.unwrap_or(0);
        let mut keyed: Vec<((Millis, Millis, usize), &ProfileView)> = usable
            .iter()
            .enumerate()
            .map(|(i, v)| match req.rotation {
                Rotation::Lru => ((lru(v), v.kind as Millis, i), *v),
                Rotation::TypeFirst => ((v.kind as Millis, lru(v), i), *v),
            })
            .collect();
        keyed.sort_unstable_by_key(|(k, _)| *k);
        usable = keyed.into_iter().map(|(_, v)| v).collect();
    }
    // Rotate before the 429: profiles known to be out of quota for this model follow the ones
    // with quota (unknown quota counts as available); a session does not stick to one.
    let low: Vec<&ProfileView>;
    (usable, low) = usable.into_iter().partition(|v| !low_on_quota(v, req.model, req.quota_floor, req.now));
    if let Some(pos) = req.sticky.and_then(|s| usable.iter().position(|v| &v.id == s)) {
        let v = usable.remove(pos);
        usable.insert(0, v);
    }
    usable.extend(low);
    cooled.sort_by_key(|(_, (until, _))| *until);

    let slots = usable
        .into_iter()
        .map(|v| Slot { id: v.id.clone(), blocked: None })
        .chain(cooled.into_iter().map(|(v, b)| Slot { id: v.id.clone(), blocked: Some(b) }))
        .collect();
    Ok(Ordered { slots, pinned: false, more: false })
}

/// A provider's profiles kept in the rotation's order (no explicit order), so that a request
/// finds the first usable ones without sorting, or copying, all of them: with thousands of
/// profiles on one provider, `order` is O(n log n) per request, `RotationIndex::first` about
/// O(log n + k). Keyed as `order` sorts usable profiles (`lru`: last used, then type, then the
/// position in the provider's list; `type_first`: type first), so both give the same order.
#[derive(Clone, Debug)]
pub struct RotationIndex {
    rotation: Rotation,
    ids: Vec<ProfileId>,
    /// Each position's key as it is in `keys`.
    key_of: Vec<(Millis, Millis)>,
    pos_of: std::collections::HashMap<ProfileId, usize, foldhash::fast::RandomState>,
    keys: std::collections::BTreeSet<(Millis, Millis, usize)>,
    /// The latest `last_used` of the provider's profiles.
    latest: Option<Millis>,
}

impl RotationIndex {
    /// The index of `base` (the provider's profiles, in the order that breaks ties; its first
    /// occurrence of an id counts), with the stats of `profiles`.
    pub fn new(base: &[ProfileId], profiles: &Views, rotation: Rotation) -> RotationIndex {
        let mut index = RotationIndex {
            rotation,
            ids: Vec::with_capacity(base.len()),
            key_of: Vec::with_capacity(base.len()),
            pos_of: Default::default(),
            keys: Default::default(),
            latest: None,
        };
        for id in base {
            if index.pos_of.contains_key(id) {
                continue;
            }
            let pos = index.ids.len();
            index.pos_of.insert(id.clone(), pos);
            index.ids.push(id.clone());
            index.key_of.push((0, 0));
            index.touch(id, profiles);
        }
        index
    }

    /// The key of `id` after its stats (last use, type) changed.
    pub fn touch(&mut self, id: &ProfileId, profiles: &Views) {
        let (Some(&pos), Some(v)) = (self.pos_of.get(id), profiles.get(id)) else { return };
        let lru = v.stats.last_used.unwrap_or(0);
        let key = match self.rotation {
            Rotation::Lru => (lru, v.kind as Millis),
            Rotation::TypeFirst => (v.kind as Millis, lru),
        };
        self.keys.remove(&(self.key_of[pos].0, self.key_of[pos].1, pos));
        self.keys.insert((key.0, key.1, pos));
        self.key_of[pos] = key;
        self.latest = self.latest.max(v.stats.last_used);
    }

    /// The latest `last_used` of the provider's profiles.
    pub fn latest(&self) -> Option<Millis> {
        self.latest
    }

    /// The first `k` profiles of the order of `provider`'s profiles for `model` that are
    /// usable at `now`, less `exclude`: what `order` puts first without an explicit order, a
    /// sticky session or a pin, found without looking at the rest (the profiles low on quota
    /// only when fewer than `k` others are usable). Empty when none is usable (then `order`
    /// tells why: cooling, or no profile).
    pub fn first(
        &self,
        (provider, model): (&str, &str),
        now: Millis,
        profiles: &Views,
        exclude: &[ProfileId],
        (k, floor): (usize, Floor),
    ) -> Vec<ProfileId> {
        let mut out = Vec::with_capacity(k.min(self.ids.len()));
        let mut low = Vec::new();
        for &(_, _, pos) in &self.keys {
            if out.len() == k {
                return out;
            }
            let id = &self.ids[pos];
            let Some(view) = profiles.get(id) else { continue };
            if id.provider() != provider
                || view.unusable(now).is_some()
                || view.stats.blocked_until(model, now).is_some()
                || exclude.contains(id)
            {
                continue;
            }
            if low_on_quota(view, model, floor, now) {
                if low.len() < k {
                    low.push(id.clone());
                }
                continue;
            }
            out.push(id.clone());
        }
        out.extend(low.into_iter().take(k - out.len()));
        out
    }
}

fn low_on_quota(view: &ProfileView, model: &str, floor: Floor, now: Millis) -> bool {
    view.stats.quota_low_until(model, floor, now).is_some()
}

fn blocked(view: &ProfileView, req: &OrderRequest<'_>) -> Option<(Until, Reason)> {
    let until = view.stats.blocked_until(req.model, req.now)?;
    Some((until, view.stats.blocked_reason(req.model, req.now).unwrap_or(Reason::Unknown)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quota::{Quota, Window};
    use crate::{Cooldown, Disabled, ProfileType, UsageStats};

    const NOW: Millis = 10_000_000;

    fn id(s: &str) -> ProfileId {
        s.parse().unwrap()
    }

    fn view(name: &str, kind: ProfileType, last_used: Option<Millis>) -> ProfileView {
        ProfileView {
            id: id(name),
            kind,
            enabled: true,
            has_secret: true,
            expires_at: None,
            stats: UsageStats { last_used, ..Default::default() },
        }
    }

    fn book(views: Vec<ProfileView>) -> Views {
        views.into_iter().map(|v| (v.id.clone(), v)).collect()
    }

    fn cool(v: &mut ProfileView, until: Millis, model: Option<&str>) {
        let model = model.map(str::to_string);
        v.stats.cooldowns.push(Cooldown { until, reason: Reason::RateLimit, model, step: 1, opened_at: NOW });
    }

    fn req<'a>(stored: &'a [ProfileId]) -> OrderRequest<'a> {
        OrderRequest {
            provider: "openai",
            model: "gpt-4.1",
            now: NOW,
            stored_order: None,
            config_order: None,
            configured: &[],
            stored,
            rotation: Rotation::Lru,
            sticky: None,
            pin: None,
            quota_floor: Floor::default(),
        }
    }

    fn ids(names: &[&str]) -> Vec<ProfileId> {
        names.iter().map(|n| id(n)).collect()
    }

    #[test]
    fn round_robin_puts_least_recently_used_first_never_used_as_zero() {
        let all = ids(&["openai:a", "openai:b", "openai:c"]);
        let b = book(vec![
            view("openai:a", ProfileType::ApiKey, Some(300)),
            view("openai:b", ProfileType::ApiKey, None),
            view("openai:c", ProfileType::ApiKey, Some(100)),
        ]);
        assert_eq!(order(&req(&all), &b).unwrap().ids(), ["openai:b", "openai:c", "openai:a"]);
    }

    #[test]
    fn type_breaks_last_used_ties_oauth_token_api_key() {
        let all = ids(&["openai:key", "openai:tok", "openai:acct"]);
        let b = book(vec![
            view("openai:key", ProfileType::ApiKey, Some(5)),
            view("openai:tok", ProfileType::Token, Some(5)),
            view("openai:acct", ProfileType::OAuth, Some(5)),
        ]);
        assert_eq!(order(&req(&all), &b).unwrap().ids(), ["openai:acct", "openai:tok", "openai:key"]);
    }

    #[test]
    fn type_first_rotation_puts_subscriptions_before_keys() {
        let all = ids(&["openai:key", "openai:acct"]);
        let b = book(vec![
            view("openai:key", ProfileType::ApiKey, Some(1)),
            view("openai:acct", ProfileType::OAuth, Some(9)),
        ]);
        let mut r = req(&all);
        assert_eq!(order(&r, &b).unwrap().ids(), ["openai:key", "openai:acct"]);
        r.rotation = Rotation::TypeFirst;
        assert_eq!(order(&r, &b).unwrap().ids(), ["openai:acct", "openai:key"]);
    }

    #[test]
    fn equal_keys_keep_the_base_order() {
        let all = ids(&["openai:z", "openai:y", "openai:x"]);
        let b = book(all.iter().map(|i| view(i.as_str(), ProfileType::ApiKey, Some(7))).collect());
        assert_eq!(order(&req(&all), &b).unwrap().ids(), ["openai:z", "openai:y", "openai:x"]);
    }

    #[test]
    fn cooled_profiles_go_last_by_soonest_expiry() {
        let all = ids(&["openai:a", "openai:b", "openai:c", "openai:d"]);
        let mut a = view("openai:a", ProfileType::ApiKey, Some(1));
        let mut b = view("openai:b", ProfileType::ApiKey, Some(2));
        let c = view("openai:c", ProfileType::ApiKey, Some(3));
        let mut d = view("openai:d", ProfileType::ApiKey, Some(4));
        cool(&mut a, NOW + 50_000, None);
        cool(&mut b, NOW + 10_000, None);
        d.stats.disabled = Some(Disabled { until: Some(NOW + 20_000), reason: Reason::Billing });
        let out = order(&req(&all), &book(vec![a, b, c, d])).unwrap();
        assert_eq!(out.ids(), ["openai:c", "openai:b", "openai:d", "openai:a"]);
        assert_eq!(out.slots[1].blocked, Some((Until::At(NOW + 10_000), Reason::RateLimit)));
        assert_eq!(out.slots[2].blocked, Some((Until::At(NOW + 20_000), Reason::Billing)));
    }

    #[test]
    fn disabled_until_cleared_sorts_after_every_timed_window() {
        let all = ids(&["openai:a", "openai:b"]);
        let mut a = view("openai:a", ProfileType::ApiKey, None);
        let mut b = view("openai:b", ProfileType::ApiKey, None);
        a.stats.disabled = Some(Disabled { until: None, reason: Reason::AuthPermanent });
        cool(&mut b, NOW + 3_600_000, None);
        assert_eq!(order(&req(&all), &book(vec![a, b])).unwrap().ids(), ["openai:b", "openai:a"]);
    }

    #[test]
    fn model_scoped_cooldown_only_blocks_that_model() {
        let all = ids(&["openai:a", "openai:b"]);
        let mut a = view("openai:a", ProfileType::ApiKey, Some(1));
        let b = view("openai:b", ProfileType::ApiKey, Some(2));
        cool(&mut a, NOW + 10_000, Some("gpt-4.1"));
        let bk = book(vec![a, b]);
        assert_eq!(order(&req(&all), &bk).unwrap().ids(), ["openai:b", "openai:a"]);
        let mut r = req(&all);
        r.model = "gpt-4.1-mini";
        assert_eq!(order(&r, &bk).unwrap().ids(), ["openai:a", "openai:b"]);
    }

    #[test]
    fn expired_cooldown_is_usable_again() {
        let all = ids(&["openai:a", "openai:b"]);
        let mut a = view("openai:a", ProfileType::ApiKey, Some(1));
        cool(&mut a, NOW, None);
        let b = view("openai:b", ProfileType::ApiKey, Some(2));
        assert_eq!(order(&req(&all), &book(vec![a, b])).unwrap().ids(), ["openai:a", "openai:b"]);
    }

    #[test]
    fn filter_drops_missing_foreign_admin_disabled_secretless_and_expired_tokens() {
        let all = ids(&[
            "openai:ok",
            "openai:ghost",
            "anthropic:x",
            "openai:off",
            "openai:nokey",
            "openai:old",
            "openai:fresh",
        ]);
        let mut off = view("openai:off", ProfileType::ApiKey, None);
        off.enabled = false;
        let mut nokey = view("openai:nokey", ProfileType::ApiKey, None);
        nokey.has_secret = false;
        let mut old = view("openai:old", ProfileType::Token, None);
        old.expires_at = Some(NOW);
        let mut fresh = view("openai:fresh", ProfileType::Token, Some(9));
        fresh.expires_at = Some(NOW + 1);
        let b = book(vec![
            view("openai:ok", ProfileType::ApiKey, Some(1)),
            view("anthropic:x", ProfileType::ApiKey, None),
            off,
            nokey,
            old,
            fresh,
        ]);
        assert_eq!(order(&req(&all), &b).unwrap().ids(), ["openai:ok", "openai:fresh"]);
    }

    #[test]
    fn oauth_profile_with_only_a_refresh_token_is_kept() {
        // has_secret is true for an OAuth profile holding a refresh token and no access token.
        let all = ids(&["openai:acct"]);
        let b = book(vec![view("openai:acct", ProfileType::OAuth, None)]);
        assert_eq!(order(&req(&all), &b).unwrap().ids(), ["openai:acct"]);
    }

    #[test]
    fn explicit_order_is_kept_for_available_profiles_and_cooled_are_appended() {
        let all = ids(&["openai:a", "openai:b", "openai:c"]);
        let explicit = ids(&["openai:c", "openai:a", "openai:b"]);
        let mut c = view("openai:c", ProfileType::ApiKey, Some(1));
        cool(&mut c, NOW + 5_000, None);
        let b = book(vec![
            view("openai:a", ProfileType::ApiKey, Some(9)),
            view("openai:b", ProfileType::ApiKey, Some(1)),
            c,
        ]);
        let mut r = req(&all);
        r.config_order = Some(&explicit);
        assert_eq!(order(&r, &b).unwrap().ids(), ["openai:a", "openai:b", "openai:c"]);
    }

    #[test]
    fn explicit_order_leaves_out_profiles_it_does_not_name() {
        let all = ids(&["openai:a", "openai:b"]);
        let explicit = ids(&["openai:b", "openai:unknown"]);
        let b = book(vec![view("openai:a", ProfileType::ApiKey, None), view("openai:b", ProfileType::ApiKey, None)]);
        let mut r = req(&all);
        r.config_order = Some(&explicit);
        assert_eq!(order(&r, &b).unwrap().ids(), ["openai:b"]);
    }

    #[test]
    fn stored_order_beats_config_order() {
        let all = ids(&["openai:a", "openai:b"]);
        let from_config = ids(&["openai:a", "openai:b"]);
        let from_store = ids(&["openai:b", "openai:a"]);
        let b = book(vec![view("openai:a", ProfileType::ApiKey, None), view("openai:b", ProfileType::ApiKey, None)]);
        let mut r = req(&all);
        r.config_order = Some(&from_config);
        r.stored_order = Some(&from_store);
        assert_eq!(order(&r, &b).unwrap().ids(), ["openai:b", "openai:a"]);
        let empty: Vec<ProfileId> = vec![];
        r.stored_order = Some(&empty);
        assert_eq!(order(&r, &b).unwrap().ids(), ["openai:a", "openai:b"], "an empty stored order is none");
    }

    #[test]
    fn configured_profiles_beat_stored_ones() {
        let stored = ids(&["openai:a", "openai:b", "openai:cli"]);
        let configured = ids(&["openai:b", "openai:a"]);
        let b = book(vec![
            view("openai:a", ProfileType::ApiKey, Some(1)),
            view("openai:b", ProfileType::ApiKey, Some(2)),
            view("openai:cli", ProfileType::ApiKey, None),
        ]);
        let mut r = req(&stored);
        r.configured = &configured;
        assert_eq!(order(&r, &b).unwrap().ids(), ["openai:a", "openai:b"]);
        r.configured = &[];
        assert_eq!(order(&r, &b).unwrap().ids(), ["openai:cli", "openai:a", "openai:b"]);
    }

    #[test]
    fn session_sticks_to_its_profile_while_usable() {
        let all = ids(&["openai:a", "openai:b", "openai:c"]);
        let mut b = book(vec![
            view("openai:a", ProfileType::ApiKey, Some(1)),
            view("openai:b", ProfileType::ApiKey, Some(2)),
            view("openai:c", ProfileType::ApiKey, Some(3)),
        ]);
        let sticky = id("openai:c");
        let mut r = req(&all);
        r.sticky = Some(&sticky);
        assert_eq!(order(&r, &b).unwrap().ids(), ["openai:c", "openai:a", "openai:b"]);
        cool(b.get_mut(&sticky).unwrap(), NOW + 1000, None);
        assert_eq!(
            order(&r, &b).unwrap().ids(),
            ["openai:a", "openai:b", "openai:c"],
            "a cooled sticky profile moves on"
        );
    }

    #[test]
    fn pinned_profile_is_used_even_when_cooled_and_alone() {
        let all = ids(&["openai:a", "openai:b"]);
        let mut a = view("openai:a", ProfileType::ApiKey, Some(1));
        cool(&mut a, NOW + 1000, None);
        let b = book(vec![a, view("openai:b", ProfileType::ApiKey, None)]);
        let pin = id("openai:a");
        let mut r = req(&all);
        r.pin = Some(&pin);
        let out = order(&r, &b).unwrap();
        assert_eq!((out.ids(), out.pinned), (vec!["openai:a"], true));
        assert_eq!(out.slots[0].blocked, Some((Until::At(NOW + 1000), Reason::RateLimit)));
    }

    #[test]
    fn pins_never_cross_providers() {
        let all = ids(&["openai:a", "openai:b"]);
        let b =
            book(vec![view("openai:a", ProfileType::ApiKey, Some(2)), view("openai:b", ProfileType::ApiKey, Some(1))]);
        let pin = id("anthropic:main");
        let mut r = req(&all);
        r.pin = Some(&pin);
        let out = order(&r, &b).unwrap();
        assert_eq!((out.ids(), out.pinned), (vec!["openai:b", "openai:a"], false));
    }

    #[test]
    fn pin_to_unknown_or_unusable_profile_is_an_error() {
        let all = ids(&["openai:a"]);
        let mut a = view("openai:a", ProfileType::ApiKey, None);
        a.enabled = false;
        let b = book(vec![a]);
        let ghost = id("openai:ghost");
        let off = id("openai:a");
        let mut r = req(&all);
        r.pin = Some(&ghost);
        assert_eq!(order(&r, &b), Err(PinError::Unknown(ghost.clone())));
        r.pin = Some(&off);
        assert_eq!(order(&r, &b), Err(PinError::Unusable(off.clone(), Unusable::DisabledByAdmin)));
    }

    #[test]
    fn a_profile_an_explicit_order_leaves_out_cannot_be_pinned() {
        let all = ids(&["openai:a", "openai:b"]);
        let b = book(vec![view("openai:a", ProfileType::ApiKey, None), view("openai:b", ProfileType::ApiKey, None)]);
        let (listed, out) = (ids(&["openai:a"]), id("openai:b"));
        let mut r = req(&all);
        r.stored_order = Some(&listed);
        r.pin = Some(&out);
        let err = order(&r, &b).unwrap_err();
        assert_eq!(err, PinError::NotInOrder(out.clone(), "openai".into(), "openai:a".into()));
        assert_eq!(
            err.to_string(),
            "pinned profile `openai:b` is not in the explicit order of `openai` (openai:a): it is not used"
        );
        let inside = id("openai:a");
        r.pin = Some(&inside);
        assert_eq!(order(&r, &b).unwrap().ids(), vec!["openai:a"]);
    }

    fn out_of_quota(v: &mut ProfileView, model: &str, reset_at: Millis) {
        let window = Window { remaining: 0, limit: Some(3), reset_at: Some(reset_at) };
        v.stats.quotas.push(Quota {
            model: model.into(),
            requests: Some(window),
            tokens: None,
            plan: None,
            seen_at: NOW - 1,
        });
    }

    #[test]
    fn profiles_out_of_quota_go_after_those_with_quota_and_before_cooled_ones() {
        let all = ids(&["openai:a", "openai:b", "openai:c", "openai:d"]);
        let mut a = view("openai:a", ProfileType::ApiKey, Some(1));
        let b = view("openai:b", ProfileType::ApiKey, Some(2));
        let mut c = view("openai:c", ProfileType::ApiKey, Some(3));
        let mut d = view("openai:d", ProfileType::ApiKey, None);
        out_of_quota(&mut a, "gpt-4.1", NOW + 60_000);
        cool(&mut c, NOW + 5_000, None);
        out_of_quota(&mut d, "gpt-4.1-mini", NOW + 60_000);
        let bk = book(vec![a, b, c, d]);
        let out = order(&req(&all), &bk).unwrap();
        assert_eq!(out.ids(), ["openai:d", "openai:b", "openai:a", "openai:c"], "d is out of another model's quota");
        assert_eq!(out.slots[2].blocked, None, "out of quota is not a window: still usable, only later");
        let mut later = req(&all);
        later.now = NOW + 60_000;
        assert_eq!(order(&later, &bk).unwrap().ids()[..3], ["openai:d", "openai:a", "openai:b"], "after the reset");
        let index = RotationIndex::new(&all, &bk, Rotation::Lru);
        for k in 1..4 {
            let want: Vec<ProfileId> =
                out.slots.iter().filter(|s| s.blocked.is_none()).take(k).map(|s| s.id.clone()).collect();
            assert_eq!(index.first(("openai", "gpt-4.1"), NOW, &bk, &[], (k, Floor::default())), want);
        }
    }

    #[test]
    fn explicit_order_and_sessions_yield_to_quota() {
        let all = ids(&["openai:a", "openai:b", "openai:c"]);
        let explicit = ids(&["openai:a", "openai:b", "openai:c"]);
        let mut a = view("openai:a", ProfileType::ApiKey, Some(1));
        out_of_quota(&mut a, "gpt-4.1", NOW + 1);
        let bk =
            book(vec![a, view("openai:b", ProfileType::ApiKey, None), view("openai:c", ProfileType::ApiKey, None)]);
        let mut r = req(&all);
        r.config_order = Some(&explicit);
        assert_eq!(order(&r, &bk).unwrap().ids(), ["openai:b", "openai:c", "openai:a"]);
        r.config_order = None;
        let sticky = id("openai:a");
        r.sticky = Some(&sticky);
        assert_eq!(order(&r, &bk).unwrap().ids(), ["openai:b", "openai:c", "openai:a"], "the session moves on");
        let pin = id("openai:a");
        r.pin = Some(&pin);
        assert_eq!(order(&r, &bk).unwrap().ids(), ["openai:a"], "a pin is used whatever its quota");
    }

    #[test]
    fn all_blocked_reports_soonest_end_and_dominant_reason() {
        let slot = |until, reason| Slot { id: id("openai:x"), blocked: Some((Until::At(until), reason)) };
        let o = Ordered {
            slots: vec![slot(50, Reason::Overloaded), slot(70, Reason::RateLimit), slot(90, Reason::RateLimit)],
            pinned: false,
            more: false,
        };
        assert_eq!(o.all_blocked(), Some((Until::At(50), Reason::RateLimit)));
        let mut with_free = o.clone();
        with_free.slots.push(Slot { id: id("openai:y"), blocked: None });
        assert_eq!(with_free.all_blocked(), None);
        assert_eq!(Ordered::default().all_blocked(), None);
    }
}
