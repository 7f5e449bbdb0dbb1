//! Property tests of the pure engine (docs/rotation.md profile order, §3 cooldowns and usageStats).
//!
//! Every property restates a rule of the spec independently of the engine's code and checks it
//! over random profiles, windows and failure sequences. Failures are not persisted to disk
//! (`failure_persistence: None`); set `PROPTEST_RNG_SEED` to replay a run.

use proptest::prelude::*;
use proptest::test_runner::Config as ProptestConfig;
use rota_engine::order::{OrderRequest, Ordered, Rotation, RotationIndex, Slot, order};
use rota_engine::quota::{Floor, Quota, Window};
use rota_engine::{
    Change, Cooldown, CooldownLane, CooldownPolicy, Disabled, Failure, Millis, ProfileId, ProfileType, ProfileView,
    Reason, Until, Unwritten, UsageStats,
};
use std::collections::HashSet;
use std::time::Duration;

const PROVIDER: &str = "openai";
const NOW: Millis = 1_700_000_000_000;
const MIN: Millis = 60_000;
const HOUR: Millis = 3_600_000;
const MODELS: [&str; 3] = ["gpt-4.1", "gpt-4.1-mini", "o3"];

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig { cases, failure_persistence: None, ..ProptestConfig::default() }
}

/// A total order on window ends where `Until::Cleared` is later than any time, written out here
/// rather than borrowed from the engine's derived `Ord`.
fn end_rank(u: Until) -> (u8, Millis) {
    match u {
        Until::At(t) => (0, t),
        Until::Cleared => (1, 0),
    }
}

// ---------------------------------------------------------------------------------------------
// Profiles and order requests
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Debug)]
struct ProfileSpec {
    kind: ProfileType,
    last_used: Option<Millis>,
    /// cooldown windows: (until - NOW, model index or whole profile, reason); the first of
    /// each scope is kept
    cooldowns: Vec<(Millis, Option<usize>, Reason)>,
    /// (until - NOW or until cleared, reason)
    disabled: Option<(Option<Millis>, Reason)>,
    enabled: bool,
    has_secret: bool,
    /// expires_at - NOW (only meaningful for tokens, set on any type to check it is ignored)
    expires: Option<Millis>,
}

fn any_kind() -> impl Strategy<Value = ProfileType> {
    prop_oneof![Just(ProfileType::OAuth), Just(ProfileType::Token), Just(ProfileType::ApiKey)]
}

fn any_reason() -> impl Strategy<Value = Reason> {
    proptest::sample::select(Reason::ALL.to_vec())
}

/// Coarse offsets from NOW, so that ties (equal ends, ends exactly at NOW) are common.
fn offset(lo: i64, hi: i64, unit: Millis) -> impl Strategy<Value = Millis> {
    (lo..=hi).prop_map(move |k| k * unit)
}

fn profile_spec() -> impl Strategy<Value = ProfileSpec> {
    (
        any_kind(),
        prop_oneof![Just(None), (0i64..4).prop_map(|k| Some(NOW - k * MIN)), (0..NOW).prop_map(Some)],
        prop_oneof![
            1 => Just(vec![]),
            1 => proptest::collection::vec(
                (offset(-4, 8, 15 * MIN), proptest::option::of(0usize..MODELS.len()), any_reason()),
                1..=3,
            ),
        ],
        proptest::option::weighted(
            0.3,
            (
                prop_oneof![Just(None), offset(-4, 26, HOUR).prop_map(Some)],
                proptest::sample::select(vec![Reason::Billing, Reason::AuthPermanent, Reason::RateLimit]),
            ),
        ),
        proptest::bool::weighted(0.85),
        proptest::bool::weighted(0.85),
        proptest::option::weighted(0.3, offset(-2, 2, 30 * MIN)),
    )
        .prop_map(|(kind, last_used, cooldowns, disabled, enabled, has_secret, expires)| ProfileSpec {
            kind,
            last_used,
            cooldowns,
            disabled,
            enabled,
            has_secret,
            expires,
        })
}

/// Reference universe for lists: `0..n` own profiles, `n` a missing id of the provider,
/// `n + 1` an existing, fully usable profile of another provider.
fn universe(n: usize) -> Vec<ProfileId> {
    let mut ids: Vec<ProfileId> = (0..n).map(own).collect();
    ids.push(ProfileId::new(PROVIDER, "ghost").unwrap());
    ids.push(foreign());
    ids
}

fn own(i: usize) -> ProfileId {
    ProfileId::new(PROVIDER, &format!("p{i}")).unwrap()
}

fn foreign() -> ProfileId {
    ProfileId::new("anthropic", "p0").unwrap()
}

#[derive(Clone, Debug)]
struct Scenario {
    specs: Vec<ProfileSpec>,
    /// the stored profiles of the provider, in database order (a permutation of all own ones)
    stored: Vec<usize>,
    configured: Vec<usize>,
    stored_order: Option<Vec<usize>>,
    config_order: Option<Vec<usize>>,
    rotation: Rotation,
    sticky: Option<usize>,
    model: usize,
}

fn scenario() -> impl Strategy<Value = Scenario> {
    (1usize..=12).prop_flat_map(|n| {
        let refs = move || proptest::collection::vec(0..n + 2, 0..=n + 2);
        (
            proptest::collection::vec(profile_spec(), n),
            Just((0..n).collect::<Vec<_>>()).prop_shuffle(),
            prop_oneof![2 => Just(vec![]), 1 => refs()],
            proptest::option::weighted(0.3, refs()),
            proptest::option::weighted(0.3, refs()),
            prop_oneof![Just(Rotation::Lru), Just(Rotation::TypeFirst)],
            proptest::option::weighted(0.6, 0..n + 2),
            0usize..MODELS.len(),
        )
            .prop_map(|(specs, stored, configured, stored_order, config_order, rotation, sticky, model)| {
                Scenario { specs, stored, configured, stored_order, config_order, rotation, sticky, model }
            })
    })
}

fn view_of(id: ProfileId, s: &ProfileSpec) -> ProfileView {
    let stats = UsageStats {
        last_used: s.last_used,
        cooldowns: s
            .cooldowns
            .iter()
            .enumerate()
            .filter(|(i, (_, m, _))| !s.cooldowns[..*i].iter().any(|(_, other, _)| other == m))
            .map(|(_, &(off, model, reason))| Cooldown {
                until: NOW + off,
                reason,
                model: model.map(|m| MODELS[m].to_string()),
                step: 1,
                opened_at: NOW - HOUR,
            })
            .collect(),
        disabled: s.disabled.map(|(off, reason)| Disabled { until: off.map(|o| NOW + o), reason }),
        ..UsageStats::default()
    };
    ProfileView {
        id,
        kind: s.kind,
        enabled: s.enabled,
        has_secret: s.has_secret,
        expires_at: s.expires.map(|o| NOW + o),
        stats,
    }
}

struct World {
    book: rota_engine::Views,
    stored: Vec<ProfileId>,
    configured: Vec<ProfileId>,
    stored_order: Option<Vec<ProfileId>>,
    config_order: Option<Vec<ProfileId>>,
    sticky: Option<ProfileId>,
    floor: Floor,
}

impl World {
    fn new(sc: &Scenario) -> World {
        let ids = universe(sc.specs.len());
        let pick = |v: &Vec<usize>| v.iter().map(|&i| ids[i].clone()).collect::<Vec<_>>();
        let mut book: rota_engine::Views =
            sc.specs.iter().enumerate().map(|(i, s)| (own(i), view_of(own(i), s))).collect();
        let foreign_spec = ProfileSpec {
            kind: ProfileType::OAuth,
            last_used: None,
            cooldowns: vec![],
            disabled: None,
            enabled: true,
            has_secret: true,
            expires: None,
        };
        book.insert(foreign(), view_of(foreign(), &foreign_spec));
        World {
            stored: pick(&sc.stored),
            configured: pick(&sc.configured),
            stored_order: sc.stored_order.as_ref().map(pick),
            config_order: sc.config_order.as_ref().map(pick),
            sticky: sc.sticky.map(|i| ids[i].clone()),
            book,
            floor: Floor::default(),
        }
    }

    /// Gives the own profiles the quota reports of `specs` (by position; `None`: never seen).
    fn with_quotas(mut self, specs: &[Option<QuotaSpec>], floor: Floor) -> World {
        for (i, spec) in specs.iter().enumerate() {
            let (Some(q), Some(v)) = (spec, self.book.get_mut(&own(i))) else { continue };
            let window = |remaining: Option<i64>| {
                remaining.map(|remaining| Window { remaining, limit: None, reset_at: q.reset.map(|r| NOW + r) })
            };
            v.stats.quotas.push(Quota {
                model: MODELS[q.model].to_string(),
                requests: window(q.requests),
                tokens: window(q.tokens),
                plan: window(q.plan),
                seen_at: NOW - q.seen_back,
            });
        }
        self.floor = floor;
        self
    }

    /// Low on quota for `model`, restated: a known remaining count at or below its floor, in
    /// a window that has not reset (a window with no reset time lasts a minute after it was
    /// seen).
    fn low(&self, id: &ProfileId, model: &str) -> bool {
        self.book[id].stats.quotas.iter().filter(|q| q.model == model).any(|q| {
            let low = |w: &Option<Window>, floor: i64| {
                w.is_some_and(|w| w.remaining <= floor && NOW < w.reset_at.unwrap_or(q.seen_at + MIN))
            };
            low(&q.requests, self.floor.requests) || low(&q.tokens, self.floor.tokens) || low(&q.plan, 0)
        })
    }

    fn request(&self, sc: &Scenario) -> OrderRequest<'_> {
        OrderRequest {
            provider: PROVIDER,
            model: MODELS[sc.model],
            now: NOW,
            stored_order: self.stored_order.as_deref(),
            config_order: self.config_order.as_deref(),
            configured: &self.configured,
            stored: &self.stored,
            rotation: sc.rotation,
            sticky: self.sticky.as_ref(),
            pin: None,
            quota_floor: self.floor,
        }
    }

    /// docs/rotation.md: the explicit order (stored beats config; an empty list is none), else the
    /// configured profiles, else the stored ones. Returns the list and whether it is explicit.
    fn base(&self) -> (Vec<ProfileId>, bool) {
        let explicit = self
            .stored_order
            .as_ref()
            .filter(|o| !o.is_empty())
            .or(self.config_order.as_ref().filter(|o| !o.is_empty()));
        match explicit {
            Some(o) => (o.clone(), true),
            None if !self.configured.is_empty() => (self.configured.clone(), false),
            None => (self.stored.clone(), false),
        }
    }

    /// docs/rotation.md, restated: exists, same provider, enabled by the admin, has a secret, not a
    /// static token at or past its expiry.
    fn passes_filter(&self, id: &ProfileId) -> bool {
        let Some(v) = self.book.get(id) else { return false };
        id.provider() == PROVIDER
            && v.enabled
            && v.has_secret
            && !(v.kind == ProfileType::Token && v.expires_at.is_some_and(|e| e <= NOW))
    }

    /// The filtered base list, first occurrence of each id kept.
    fn filtered_base(&self) -> Vec<ProfileId> {
        let mut seen = HashSet::new();
        self.base().0.into_iter().filter(|id| self.passes_filter(id) && seen.insert(id.clone())).collect()
    }

    fn blocked_for(&self, id: &ProfileId, model: &str) -> Option<Until> {
        self.book[id].stats.blocked_until(model, NOW)
    }

    /// Usable for `model` per docs/rotation.md ("cooled"), checked here from the raw lanes.
    fn cooled_raw(&self, id: &ProfileId, model: &str) -> bool {
        let s = &self.book[id].stats;
        let dis = s.disabled.as_ref().is_some_and(|d| d.until.is_none_or(|u| NOW < u));
        let cool = s.cooldowns.iter().any(|c| NOW < c.until && c.model.as_deref().is_none_or(|m| m == model));
        dis || cool
    }
}

/// One profile's quota report: remaining requests and tokens (either may be unknown), the reset
/// relative to NOW (past, future, or not given), and how long ago it was seen.
#[derive(Clone, Debug)]
struct QuotaSpec {
    model: usize,
    requests: Option<i64>,
    tokens: Option<i64>,
    /// Percent of a plan left (Codex).
    plan: Option<i64>,
    reset: Option<Millis>,
    seen_back: Millis,
}

fn quota_specs() -> impl Strategy<Value = Vec<Option<QuotaSpec>>> {
    let spec = (
        0usize..MODELS.len(),
        proptest::option::of(0i64..4),
        proptest::option::of(prop_oneof![Just(0i64), 0i64..3000]),
        proptest::option::of(prop_oneof![Just(0i64), 0i64..=100]),
        proptest::option::of(offset(-2, 4, 30_000)),
        offset(0, 3, 30_000),
    )
        .prop_map(|(model, requests, tokens, plan, reset, seen_back)| QuotaSpec {
            model,
            requests,
            tokens,
            plan,
            reset,
            seen_back,
        });
    proptest::collection::vec(proptest::option::weighted(0.6, spec), 12)
}

fn floors() -> impl Strategy<Value = Floor> {
    (prop_oneof![Just(0i64), 0i64..3], prop_oneof![Just(0i64), 0i64..2000])
        .prop_map(|(requests, tokens)| Floor { requests, tokens })
}

fn run_order(w: &World, sc: &Scenario) -> Ordered {
    order(&w.request(sc), &w.book).expect("no pin: order never fails")
}

fn first_blocked(slots: &[Slot]) -> usize {
    slots.iter().position(|s| s.blocked.is_some()).unwrap_or(slots.len())
}

// ---------------------------------------------------------------------------------------------
// Failure sequences
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Debug)]
struct Step {
    reason: Reason,
    model: usize,
    hint_ms: Option<Millis>,
    account_wide: bool,
    /// now - started_at
    started_back: Millis,
    /// how far the clock moves before this failure
    advance: Millis,
}

fn step() -> impl Strategy<Value = Step> {
    (
        // auth_permanent locks the profile for good, so it is drawn rarely to keep the rest
        // of a sequence interesting.
        prop_oneof![
            30 => proptest::sample::select(Reason::ALL.iter().copied().filter(|r| *r != Reason::AuthPermanent).collect::<Vec<_>>()),
            1 => Just(Reason::AuthPermanent),
        ],
        0usize..MODELS.len(),
        proptest::option::of(prop_oneof![0..10 * HOUR, offset(0, 10, HOUR), Just(0)]),
        any::<bool>(),
        prop_oneof![Just(0), 0..10 * MIN, 0..2 * HOUR],
        prop_oneof![Just(0), 0..MIN, 0..2 * HOUR],
    )
        .prop_map(|(reason, model, hint_ms, account_wide, started_back, advance)| Step {
            reason,
            model,
            hint_ms,
            account_wide,
            started_back,
            advance,
        })
}

fn failure(st: &Step, now: Millis) -> Failure {
    Failure {
        reason: st.reason,
        model: MODELS[st.model].to_string(),
        hint_ms: st.hint_ms,
        account_wide: st.account_wide,
        started_at: now - st.started_back,
        claim: false,
    }
}

fn policy() -> impl Strategy<Value = CooldownPolicy> {
    prop_oneof![
        3 => Just(CooldownPolicy::default()),
        1 => (1u64..=600, 1u32..=10, 0u64..=7200, 1u64..=1800, 1u64..=24).prop_map(|(base, factor, extra, window, hint_h)| {
            CooldownPolicy {
                cooldown: CooldownLane {
                    base: Duration::from_secs(base),
                    factor,
                    max: Duration::from_secs(base + extra),
                    failure_window: Duration::from_secs(window),
                    hint_max: Duration::from_secs(hint_h * 3600),
                },
                ..CooldownPolicy::default()
            }
        }),
    ]
}

// ---------------------------------------------------------------------------------------------
// Properties
// ---------------------------------------------------------------------------------------------

proptest! {
    #![proptest_config(config(512))]

    /// docs/rotation.md: the billing step survives expiry, so billing windows never shrink from one
    /// billing failure to the next without a success, whatever failed in between.
    #[test]
    fn billing_windows_never_shrink_across_expiry_without_a_success(
        between in proptest::collection::vec(proptest::option::of(step()), 1..16),
        pol in policy(),
    ) {
        let mut s = UsageStats::default();
        let mut now = NOW;
        let mut last_wait = 0;
        for (k, other) in between.iter().enumerate() {
            if let Some(st) = other.as_ref().filter(|st| st.reason != Reason::AuthPermanent) {
                now += st.advance;
                s.record_failure(&failure(st, now), now, &pol);
            }
            // The billing failure comes after every window has ended (nobody probed the profile).
            now = s.blocked_until("any", now).map_or(now, |u| match u { Until::At(t) => t.max(now), Until::Cleared => now }) + 1;
            let bill = Failure { reason: Reason::Billing, model: MODELS[0].into(), hint_ms: None, account_wide: false, started_at: now, claim: false };
            if let Some(Until::At(end)) = s.record_failure(&bill, now, &pol) {
                let wait = end - now;
                prop_assert!(wait >= last_wait, "a billing window shrank: {} after {}", wait, last_wait);
                prop_assert!(wait >= pol.billing(k as u32 + 1), "billing failure {} got {} ms", k + 1, wait);
                last_wait = wait;
            }
        }
    }

    /// docs/rotation.md "Evidence": whatever an agent claims, in any order and with any hint, a claim
    /// never reaches the disabled lanes and never keeps a profile away past `cooldown.max`.
    #[test]
    fn claims_never_disable_and_never_cool_past_the_cooldown_max(steps in proptest::collection::vec(step(), 1..24), pol in policy()) {
        let mut s = UsageStats::default();
        let mut now = NOW;
        let max = pol.cooldown.max.as_millis() as Millis;
        for st in &steps {
            now += st.advance;
            let f = Failure { claim: true, ..failure(st, now) };
            s.record_failure(&f, now, &pol);
            prop_assert!(s.disabled.is_none(), "a claim of {} disabled the profile", st.reason);
            for m in MODELS {
                prop_assert!(
                    s.blocked_until(m, now).is_none_or(|u| u <= Until::At(now + max)),
                    "a claim of {} keeps {m} away past cooldown.max", st.reason
                );
            }
        }
    }

    /// docs/rotation.md: cooled profiles go last (soonest expiry first); the first slot is usable
    /// whenever the filtered base list holds a usable profile; a usable sticky profile is first.
    #[test]
    fn a_cooled_profile_is_never_chosen_while_a_usable_one_exists_for_that_model(sc in scenario()) {
        let w = World::new(&sc);
        let model = MODELS[sc.model];
        let out = run_order(&w, &sc);
        prop_assert!(!out.pinned);

        // Slot annotations agree with the profile's own stats and with the raw lanes.
        for s in &out.slots {
            let b = w.blocked_for(&s.id, model);
            prop_assert_eq!(s.blocked.map(|x| x.0), b, "slot {} blocked annotation", s.id);
            prop_assert_eq!(b.is_some(), w.cooled_raw(&s.id, model), "slot {} cooled per docs/rotation.md", s.id);
        }

        let listed_usable: Vec<ProfileId> =
            w.filtered_base().into_iter().filter(|id| !w.cooled_raw(id, model)).collect();
        if !listed_usable.is_empty() {
            let first = out.slots.first();
            prop_assert!(first.is_some(), "a usable profile exists but the order is empty");
            let first = first.unwrap();
            prop_assert!(first.blocked.is_none(), "first slot {} is blocked: {:?}", first.id, first.blocked);
            prop_assert!(w.book[&first.id].stats.blocked_until(model, NOW).is_none());
            if let Some(sticky) = w.sticky.as_ref().filter(|s| listed_usable.contains(s)) {
                prop_assert_eq!(&first.id, sticky, "a usable sticky profile stays first");
            }
        }

        // Every usable slot precedes every blocked slot.
        let cut = first_blocked(&out.slots);
        prop_assert!(out.slots[cut..].iter().all(|s| s.blocked.is_some()), "usable after blocked: {:?}", out.slots);
        prop_assert_eq!(cut, listed_usable.len(), "every listed usable profile is in front");

        // Blocked slots by end ascending.
        let ends: Vec<_> = out.slots[cut..].iter().map(|s| end_rank(s.blocked.unwrap().0)).collect();
        prop_assert!(ends.windows(2).all(|p| p[0] <= p[1]), "blocked ends not ascending: {:?}", ends);
    }

    /// docs/rotation.md: the order is the filtered base list, each profile once, nothing of
    /// another provider, and a stable sort of it.
    #[test]
    fn order_is_stable_and_a_permutation_of_the_usable_filtered_base_list(sc in scenario(), kind in any_kind(), lu in prop_oneof![Just(None), (0..NOW).prop_map(Some)]) {
        let model = MODELS[sc.model];
        let w = World::new(&sc);
        let out = run_order(&w, &sc);
        let ids: Vec<ProfileId> = out.slots.iter().map(|s| s.id.clone()).collect();

        let distinct: HashSet<&ProfileId> = ids.iter().collect();
        prop_assert_eq!(distinct.len(), ids.len(), "duplicate ids: {:?}", ids);
        for id in &ids {
            prop_assert_eq!(id.provider(), PROVIDER, "{} belongs to another provider", id);
        }
        let expected = w.filtered_base();
        let expected_set: HashSet<&ProfileId> = expected.iter().collect();
        prop_assert_eq!(&distinct, &expected_set, "order {:?} vs filtered base {:?}", ids, expected);

        // Stability: the usable part (sticky aside) is the base order (explicit) or a stable
        // sort of it by the rotation keys (round robin).
        let (_, explicit) = w.base();
        let sticky_first = w.sticky.as_ref().filter(|s| expected.contains(s) && !w.cooled_raw(s, model));
        let mut usable: Vec<&ProfileView> = expected
            .iter()
            .filter(|id| !w.cooled_raw(id, model) && Some(*id) != sticky_first)
            .map(|id| &w.book[id])
            .collect();
        if !explicit {
            let key = |v: &ProfileView| v.stats.last_used.unwrap_or(0);
            match sc.rotation {
                Rotation::Lru => usable.sort_by(|a, b| key(a).cmp(&key(b)).then(a.kind.cmp(&b.kind))),
                Rotation::TypeFirst => usable.sort_by(|a, b| a.kind.cmp(&b.kind).then(key(a).cmp(&key(b)))),
            }
        }
        let mut want: Vec<ProfileId> = sticky_first.into_iter().cloned().collect();
        want.extend(usable.iter().map(|v| v.id.clone()));
        let cut = first_blocked(&out.slots);
        prop_assert_eq!(&ids[..cut], &want[..], "usable part out of order");

        // Round robin, all keys equal, nothing cooled, no sticky: exactly the base order.
        let mut flat = sc.clone();
        flat.stored_order = None;
        flat.config_order = None;
        flat.sticky = None;
        for s in &mut flat.specs {
            s.kind = kind;
            s.last_used = lu;
            for c in &mut s.cooldowns {
                c.0 = c.0.min(0); // expired (ends at or before NOW)
            }
            s.disabled = s.disabled.map(|(off, r)| (Some(off.unwrap_or(0).min(0)), r));
        }
        let w = World::new(&flat);
        for rotation in [Rotation::Lru, Rotation::TypeFirst] {
            flat.rotation = rotation;
            let got: Vec<ProfileId> = run_order(&w, &flat).slots.into_iter().map(|s| s.id).collect();
            prop_assert_eq!(&got, &w.filtered_base(), "{:?}: equal keys must keep the base order", rotation);
        }
    }

    /// docs/rotation.md "Model scope is per model": a model-scoped failure of model B (rate limit,
    /// overload, timeout, server error, not account-wide, no hint long enough to be an exhausted
    /// quota) never changes until when model C is blocked, whatever happened before.
    #[test]
    fn a_failure_for_model_b_never_blocks_model_c(
        history in proptest::collection::vec(step(), 0..=20),
        last in step(),
        reason in proptest::sample::select(vec![Reason::RateLimit, Reason::Overloaded, Reason::Timeout, Reason::ServerError]),
        hint_ms in proptest::option::of(0..10 * MIN),
        pol in policy(),
    ) {
        let mut s = UsageStats::default();
        let mut now = NOW;
        for st in &history {
            now += st.advance;
            s.record_failure(&failure(st, now), now, &pol);
        }
        now += last.advance;
        let f = Failure { reason, hint_ms, account_wide: false, ..failure(&last, now) };
        let max = pol.cooldown.max.as_millis() as Millis;
        let quota = f.hint_ms.is_some_and(|h| h.clamp(1000, (pol.cooldown.hint_max.as_millis() as Millis).max(1000)) > max);
        prop_assume!(!quota);
        let before: Vec<Option<Until>> = MODELS.iter().map(|m| s.blocked_until(m, now)).collect();
        s.record_failure(&f, now, &pol);
        for (m, b) in MODELS.iter().zip(&before) {
            if *m != f.model {
                prop_assert_eq!(s.blocked_until(m, now), *b, "{:?} changed how long {} is blocked", f, m);
            }
        }
        prop_assert!(s.blocked_until(&f.model, now).is_some(), "the failing model itself cools");
    }

    /// No client can put a healthy account out of service for longer than one cooldown step:
    /// failures the request caused (format, context_overflow, unknown, model_not_found) are
    /// counted but never open a window nor raise the step of the next one.
    #[test]
    fn request_faults_are_counted_and_never_cool_or_escalate(
        faults in proptest::collection::vec((prop_oneof![Just(Reason::Format), Just(Reason::ContextOverflow), Just(Reason::Unknown), Just(Reason::ModelNotFound)], 0usize..MODELS.len(), 0..MIN), 1..30),
        pol in policy(),
    ) {
        let mut s = UsageStats::default();
        let mut now = NOW;
        for (i, (reason, model, advance)) in faults.iter().enumerate() {
            now += advance;
            let f = Failure { reason: *reason, model: MODELS[*model].into(), hint_ms: Some(HOUR), account_wide: true, started_at: now, claim: false };
            prop_assert_eq!(s.record_failure(&f, now, &pol), None);
            prop_assert!(MODELS.iter().all(|m| s.blocked_until(m, now).is_none()));
            prop_assert!(s.error_count as usize <= i + 1 && s.failure_total as usize == i + 1);
        }
        let f = Failure { reason: Reason::RateLimit, model: MODELS[0].into(), hint_ms: None, account_wide: false, started_at: now, claim: false };
        let first = (pol.cooldown.base.as_millis() as Millis).min(pol.cooldown.max.as_millis() as Millis);
        prop_assert_eq!(s.record_failure(&f, now, &pol), Some(Until::At(now + first)));
    }

    /// docs/rotation.md: "A failure never clears, resets or shortens a cooldown or disabled window."
    #[test]
    fn a_failure_never_shortens_an_active_window(
        steps in proptest::collection::vec(step(), 1..=30),
        pol in policy(),
    ) {
        let mut s = UsageStats::default();
        let mut now = NOW;
        for (i, st) in steps.iter().enumerate() {
            now += st.advance;
            let before: Vec<Option<Until>> = MODELS.iter().map(|m| s.blocked_until(m, now)).collect();
            let total_before = s.failure_total;
            let f = failure(st, now);
            let snapshot = s.clone();
            s.record_failure(&f, now, &pol);
            for (m, b) in MODELS.iter().zip(&before) {
                let Some(b) = *b else { continue };
                let after = s.blocked_until(m, now);
                prop_assert!(
                    after.is_some_and(|a| end_rank(a) >= end_rank(b)),
                    "step {}: {:?} at {} shortened the window of {} from {:?} to {:?}\nbefore: {:?}\nafter: {:?}",
                    i, f, now, m, b, after, snapshot, s
                );
            }
            prop_assert!(s.failure_total >= total_before, "step {}: failure_total went down", i);
        }
    }

    /// docs/rotation.md counter reset: "on success (all error state cleared at once)" — the windows of
    /// another model aside, which are that model's own evidence and only run out.
    #[test]
    fn after_a_success_the_error_state_of_its_model_is_clean(
        steps in proptest::collection::vec(step(), 0..=30),
        pol in policy(),
        successes in 0u64..1000,
        gap in prop_oneof![Just(0), 0..2 * HOUR],
    ) {
        let mut s = UsageStats { success_count: successes, ..UsageStats::default() };
        let mut now = NOW;
        for st in &steps {
            now += st.advance;
            s.record_failure(&failure(st, now), now, &pol);
        }
        now += gap;
        let before = s.clone();
        s.record_success(MODELS[0], now, now);
        prop_assert_eq!(&s.disabled, &None);
        prop_assert_eq!(s.error_count, 0);
        prop_assert!(s.failure_counts.is_empty(), "failure_counts left: {:?}", s.failure_counts);
        for t in [now, now + 1, now + 1000 * HOUR] {
            for m in [MODELS[0], "some-other-model"] {
                prop_assert_eq!(s.blocked_until(m, t), None, "{} blocked at {} after success", m, t);
            }
            for m in &MODELS[1..] {
                let was = before.cooldowns.iter().filter(|c| c.model.as_deref() == Some(*m) && t < c.until).map(|c| c.until).max();
                prop_assert_eq!(s.blocked_until(m, t), was.map(Until::At), "{}: only its own window may remain", m);
            }
        }
        prop_assert_eq!(s.success_count, before.success_count + 1);
        prop_assert_eq!(s.failure_total, before.failure_total);
        prop_assert_eq!(s.last_success_at, Some(now));

        // And the next failure starts the ladder from its first step again.
        let f = Failure { reason: Reason::RateLimit, model: MODELS[0].into(), hint_ms: None, account_wide: false, started_at: now, claim: false };
        let end = s.record_failure(&f, now, &pol);
        prop_assert_eq!(end, Some(Until::At(now + (pol.cooldown.base.as_millis() as Millis).min(pol.cooldown.max.as_millis() as Millis))));
    }

    /// docs/rotation.md: `min(max, base * factor^min(error_count - 1, 3))`.
    #[test]
    fn ladder_durations_follow_the_formula(
        n in 1u32..50,
        base_s in 1u64..=600,
        factor in 1u32..=10,
        extra_ms in prop_oneof![Just(0u64), 0u64..=24 * 3_600_000],
    ) {
        let base_ms = base_s * 1000;
        let max_ms = base_ms + extra_ms;
        let pol = CooldownPolicy {
            cooldown: CooldownLane {
                base: Duration::from_secs(base_s),
                factor,
                max: Duration::from_millis(max_ms),
                ..CooldownLane::default()
            },
            ..CooldownPolicy::default()
        };
        let exp = (n - 1).min(3);
        let want = (base_ms as u128 * (factor as u128).pow(exp)).min(max_ms as u128) as Millis;
        prop_assert_eq!(pol.ladder(n), want, "n={} base={}s factor={} max={}ms", n, base_s, factor, max_ms);
    }
}

// ---------------------------------------------------------------------------------------------
// Merge rules: the changes of several servers land in any order (docs/scale.md)
// ---------------------------------------------------------------------------------------------

/// One server's changes, in the order it made them: (advance, kind, model, hint, started_back).
fn server_changes() -> impl Strategy<Value = Vec<(Millis, u8, usize, Option<Millis>, Millis)>> {
    proptest::collection::vec(
        (0..2 * MIN, 0u8..5, 0usize..MODELS.len(), proptest::option::weighted(0.3, 1000..2 * HOUR), 0..MIN),
        0..12,
    )
}

fn changes_of(server: &[(Millis, u8, usize, Option<Millis>, Millis)]) -> Vec<Change> {
    let mut now = NOW;
    server
        .iter()
        .map(|&(advance, kind, model, hint_ms, back)| {
            now += advance;
            let f = Failure {
                reason: Reason::RateLimit,
                model: MODELS[model].into(),
                hint_ms,
                account_wide: false,
                started_at: now - back,
                claim: false,
            };
            match kind {
                0 => Change::Used(now),
                1 => Change::Counted(Reason::ServerError, now),
                // Sent `back` before it was answered: in flight while other changes landed.
                2 => Change::Served { model: MODELS[model].into(), sent: now - back, at: now, times: 1 },
                3 => Change::Quota(Quota {
                    model: MODELS[model].into(),
                    requests: Some(Window { remaining: now % 5, limit: None, reset_at: Some(now + MIN) }),
                    tokens: None,
                    plan: None,
                    seen_at: now,
                }),
                _ => Change::Failed(f, now),
            }
        })
        .collect()
}

/// Interleaves two servers' changes, each server's in its own order, as `picks` says.
fn interleave(a: &[Change], b: &[Change], picks: &[bool]) -> Vec<Change> {
    let (mut a, mut b) = (a.iter(), b.iter());
    let mut out: Vec<Change> =
        picks.iter().filter_map(|&from_a| if from_a { a.next() } else { b.next() }).cloned().collect();
    out.extend(a.chain(b).cloned());
    out
}

fn replay(changes: &[Change], pol: &CooldownPolicy) -> UsageStats {
    let mut s = UsageStats::default();
    for c in changes {
        s.apply(c, pol);
    }
    s
}

proptest! {
    #![proptest_config(config(512))]

    /// Counters add up and times take the later value, whatever order two servers' writes land
    /// in: the same as one server making every change in time order.
    #[test]
    fn counters_and_times_do_not_depend_on_the_order_writes_land_in(
        a in server_changes(),
        b in server_changes(),
        picks in proptest::collection::vec(any::<bool>(), 0..24),
        pol in policy(),
    ) {
        let (a, b) = (changes_of(&a), changes_of(&b));
        let landed = replay(&interleave(&a, &b, &picks), &pol);
        let at = |c: &Change| match c {
            Change::Used(t) | Change::Counted(_, t) | Change::Served { at: t, .. } | Change::Failed(_, t) | Change::Cleared(t) | Change::Expired(t) => *t,
            Change::Quota(q) => q.seen_at,
        };
        let mut in_time = [a.clone(), b.clone()].concat();
        in_time.sort_by_key(at);
        let ordered = replay(&in_time, &pol);
        prop_assert_eq!(
            (landed.failure_total, landed.success_count, landed.last_used, landed.last_success_at, landed.last_success_sent_at, landed.last_failure_at),
            (ordered.failure_total, ordered.success_count, ordered.last_used, ordered.last_success_at, ordered.last_success_sent_at, ordered.last_failure_at)
        );
        let by_model = |mut q: Vec<Quota>| { q.sort_by(|x, y| x.model.cmp(&y.model)); q };
        prop_assert_eq!(by_model(landed.quotas), by_model(ordered.quotas), "the latest quota report of each model wins");
    }

    /// Changes waiting for the writer coalesce (successes in a row, uses) without changing what
    /// they leave: replaying the coalesced changes on any stored row gives the row the changes
    /// one by one give, even on a row another server changed meanwhile.
    #[test]
    fn coalesced_changes_leave_what_the_changes_one_by_one_leave(
        before in server_changes(),
        a in server_changes(),
        pol in policy(),
    ) {
        let stored = replay(&changes_of(&before), &pol);
        let a = changes_of(&a);
        let mut waiting = Unwritten::default();
        for c in &a {
            waiting.push(c.clone());
        }
        let coalesced = waiting.clone().into_changes();
        prop_assert!(coalesced.len() <= a.len());
        let (mut one_by_one, mut at_once) = (stored.clone(), stored);
        for c in &a {
            one_by_one.apply(c, &pol);
        }
        for c in waiting.replay() {
            at_once.apply(&c, &pol);
        }
        prop_assert_eq!(one_by_one, at_once);
    }

    /// Rotate before the 429: with any mix of known and unknown quota, no profile known to be
    /// out of quota for the model comes before a usable one that has quota (or whose quota is
    /// unknown), so the chosen profile is never one at its floor while another has quota; the
    /// order still holds every usable profile, and out of quota is never a window.
    #[test]
    fn a_profile_out_of_quota_is_never_chosen_while_another_usable_one_has_quota(
        sc in scenario(),
        quotas in quota_specs(),
        floor in floors(),
    ) {
        let model = MODELS[sc.model];
        let w = World::new(&sc).with_quotas(&quotas, floor);
        let out = run_order(&w, &sc);
        let cut = first_blocked(&out.slots);
        let usable = &out.slots[..cut];
        let with_quota = usable.iter().filter(|s| !w.low(&s.id, model)).count();
        prop_assert!(usable[..with_quota].iter().all(|s| !w.low(&s.id, model)), "out of quota before one with quota: {:?}", usable);
        if let Some(first) = usable.first() {
            prop_assert!(!w.low(&first.id, model) || with_quota == 0, "chose {} out of quota while another has some", first.id);
        }
        let plain = World::new(&sc);
        let plain = run_order(&plain, &sc);
        let mut without: Vec<&str> = plain.slots[..cut].iter().map(|s| s.id.as_str()).collect();
        let mut with: Vec<&str> = usable.iter().map(|s| s.id.as_str()).collect();
        without.sort_unstable();
        with.sort_unstable();
        prop_assert_eq!(with, without, "quota reorders the usable profiles, never drops or blocks one");
    }

    /// The rotation index gives what `order` gives first, without an explicit order or a
    /// sticky session: the first k usable profiles, less those excluded (the ones out of quota
    /// after the others), and again after each of a series of uses (which move a profile to
    /// the end).
    #[test]
    fn the_rotation_index_gives_the_first_usable_profiles_of_the_order(
        sc in scenario(),
        k in 1usize..6,
        exclude in proptest::collection::vec(0usize..14, 0..3),
        uses in proptest::collection::vec(0usize..14, 0..8),
        quotas in quota_specs(),
        floor in floors(),
    ) {
        let sc = Scenario { stored_order: None, config_order: None, sticky: None, ..sc };
        let mut w = World::new(&sc).with_quotas(&quotas, floor);
        let base = w.base().0;
        let mut index = RotationIndex::new(&base, &w.book, sc.rotation);
        let ids = universe(sc.specs.len());
        let exclude: Vec<ProfileId> = exclude.iter().filter_map(|&i| ids.get(i).cloned()).collect();
        let mut now = NOW;
        for step in 0..=uses.len() {
            let want: Vec<ProfileId> = run_order(&w, &sc)
                .slots
                .into_iter()
                .filter(|s| s.blocked.is_none() && !exclude.contains(&s.id))
                .map(|s| s.id)
                .take(k)
                .collect();
            prop_assert_eq!(index.first((PROVIDER, MODELS[sc.model]), NOW, &w.book, &exclude, (k, floor)), want, "after {} uses", step);
            let Some(used) = uses.get(step).and_then(|&i| ids.get(i)) else { continue };
            now += 1;
            if let Some(v) = w.book.get_mut(used) {
                v.stats.apply(&Change::Used(now), &CooldownPolicy::default());
                prop_assert!(index.latest() <= Some(now));
                index.touch(used, &w.book);
                if base.contains(used) {
                    prop_assert_eq!(index.latest(), Some(now));
                }
            }
        }
    }

    /// Calls in flight when a failure arrived never end the window it opened: after any history,
    /// one failure, then successes of any models whose calls were sent before the failing call
    /// (answered any time after it, in any number), leave the failing model blocked at least
    /// until that failure alone blocks it.
    #[test]
    fn no_success_sent_before_a_window_opened_ends_it(
        history in proptest::collection::vec(step(), 0..12),
        st in step(),
        in_flight in proptest::collection::vec((0usize..MODELS.len(), 1..10 * MIN, 0..10 * MIN), 1..8),
        pol in policy(),
    ) {
        let mut s = UsageStats::default();
        let mut now = NOW;
        for h in &history {
            now += h.advance;
            s.record_failure(&failure(h, now), now, &pol);
        }
        now += st.advance;
        let f = failure(&st, now);
        let Some(alone) = UsageStats::default().record_failure(&f, now, &pol) else { return Ok(()) };
        s.record_failure(&f, now, &pol);
        let model = MODELS[st.model];
        let mut last = now;
        for &(m, sent_back, answered_after) in &in_flight {
            last = last.max(now + answered_after);
            let sent = f.started_at - sent_back;
            s.apply(&Change::Served { model: MODELS[m].into(), sent, at: now + answered_after, times: 1 }, &pol);
        }
        if end_rank(alone) <= (0, last) {
            return Ok(()); // over before the last success: nothing to keep
        }
        let kept = s.blocked_until(model, last);
        prop_assert!(
            kept.is_some_and(|k| end_rank(k) >= end_rank(alone)),
            "{:?} alone blocks {} until {:?}; after the successes in flight: {:?}\n{:?}", f, model, alone, kept, s
        );
    }

    /// No server undoes what another learned, and no success older than a window ends it: after
    /// both servers' changes land, in any order, each model stays blocked at least as long as
    /// any single failure of it made it on its own, unless a call of it sent after the failing
    /// call succeeded (a success is dated when its call was sent: calls sent before prove
    /// nothing newer, however late they are answered).
    #[test]
    fn no_server_undoes_what_another_learned(
        a in server_changes(),
        b in server_changes(),
        picks in proptest::collection::vec(any::<bool>(), 0..24),
        pol in policy(),
    ) {
        let (a, b) = (changes_of(&a), changes_of(&b));
        let all = interleave(&a, &b, &picks);
        let landed = replay(&all, &pol);
        let last = all.iter().filter_map(|c| match c { Change::Failed(_, t) | Change::Used(t) | Change::Counted(_, t) | Change::Served { at: t, .. } => Some(*t), _ => None }).max().unwrap_or(NOW);
        for c in &all {
            let Change::Failed(f, now) = c else { continue };
            // A hint past cooldown.max is an exhausted quota: the disabled lane, which a success of
            // any model ends (the account served).
            let max = pol.cooldown.max.as_millis() as Millis;
            let quota = f.hint_ms.is_some_and(|h| h.clamp(1000, (pol.cooldown.hint_max.as_millis() as Millis).max(1000)) > max);
            let served_after =
                all.iter().any(|x| matches!(x, Change::Served { model, sent, .. } if (quota || *model == f.model) && *sent >= f.started_at));
            if served_after {
                continue;
            }
            let alone = replay(std::slice::from_ref(c), &pol).blocked_until(&f.model, *now).unwrap();
            if end_rank(alone) <= (0, last) {
                continue; // over before the end: nothing to keep
            }
            let kept = landed.blocked_until(&f.model, last);
            prop_assert!(
                kept.is_some_and(|k| end_rank(k) >= end_rank(alone)),
                "{:?} alone blocks {} until {:?}; after all landed: {:?}\n{:?}", c, f.model, alone, kept, all
            );
        }
    }
}
