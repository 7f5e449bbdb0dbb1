//! Per-profile usageStats and their transitions (docs/rotation.md): the cooldown ladder, reset hints,
//! the disabled lane, per-model scope, the burst guard and the three counter resets.
//!
//! Everything here is a pure function of the current stats, the failure and `now`.

use super::quota::{self, Floor, Quota};
use super::{Mark, Millis, Reason};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;

/// Durations of the two lanes: the config's `[cooldown]` and `[billing]` tables, which
/// deserialize straight into it (a table or key left out takes its default). The defaults are
/// those of docs/rotation.md, written once, in `impl Default`; every one is configurable.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default)]
pub struct CooldownPolicy {
    pub cooldown: CooldownLane,
    pub billing: BillingLane,
}

/// `[cooldown]`: the cooldown lane's ladder, the failure window and the longest hint honoured.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CooldownLane {
    #[serde(deserialize_with = "crate::duration::deserialize")]
    pub base: Duration,
    pub factor: u32,
    #[serde(deserialize_with = "crate::duration::deserialize")]
    pub max: Duration,
    #[serde(deserialize_with = "crate::duration::deserialize")]
    pub failure_window: Duration,
    /// Longest provider hint honoured; longer hints are clamped to it.
    #[serde(deserialize_with = "crate::duration::deserialize")]
    pub hint_max: Duration,
}

/// `[billing]`: the billing lane's doubling.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BillingLane {
    #[serde(deserialize_with = "crate::duration::deserialize")]
    pub base: Duration,
    #[serde(deserialize_with = "crate::duration::deserialize")]
    pub max: Duration,
}

impl Default for CooldownPolicy {
    fn default() -> Self {
        CooldownPolicy {
            cooldown: CooldownLane {
                base: Duration::from_secs(60),
                factor: 5,
                max: Duration::from_secs(3600),
                failure_window: Duration::from_secs(600),
                hint_max: Duration::from_secs(6 * 3600),
            },
            billing: BillingLane { base: Duration::from_secs(3600), max: Duration::from_secs(24 * 3600) },
        }
    }
}

/// The `[cooldown]` defaults: `CooldownPolicy::default()`'s.
impl Default for CooldownLane {
    fn default() -> Self {
        CooldownPolicy::default().cooldown
    }
}

/// The `[billing]` defaults: `CooldownPolicy::default()`'s.
impl Default for BillingLane {
    fn default() -> Self {
        CooldownPolicy::default().billing
    }
}

fn ms(d: Duration) -> Millis {
    d.as_millis().min(Millis::MAX as u128) as Millis
}

impl CooldownPolicy {
    /// `min(max, base * factor^min(n - 1, 3))`: 1 min, 5 min, 25 min, 1 h, 1 h, …
    pub fn ladder(&self, error_count: u32) -> Millis {
        let c = &self.cooldown;
        let step = error_count.saturating_sub(1).min(3);
        let d = ms(c.base).saturating_mul((c.factor as Millis).saturating_pow(step));
        d.min(ms(c.max))
    }

    /// Billing: `base * 2^(n - 1)` capped at `billing.max` (1 h, 2 h, 4 h, … 24 h).
    pub fn billing(&self, billing_count: u32) -> Millis {
        let step = billing_count.saturating_sub(1).min(30);
        ms(self.billing.base).saturating_mul(1 << step).min(ms(self.billing.max))
    }

    fn clamp_hint(&self, wait: Millis) -> Millis {
        wait.clamp(1000, ms(self.cooldown.hint_max).max(1000))
    }
}

/// One window of the cooldown lane: a short wait for one model, or for every model of the
/// profile. Each window climbs its own ladder.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cooldown {
    pub until: Millis,
    pub reason: Reason,
    /// `None`: every model of the profile.
    pub model: Option<String>,
    /// The ladder step the window is at (1: the first failure).
    pub step: u32,
    /// When the window was opened or last escalated: failures of calls started before it are
    /// a burst and do not escalate it again.
    pub opened_at: Millis,
}

impl Cooldown {
    /// Whether the window is still running at `now` (it ends at `until`, exclusive).
    pub fn active(&self, now: Millis) -> bool {
        now < self.until
    }

    /// When the window ends: a cooldown always has an end.
    pub fn ends(&self) -> Until {
        Until::At(self.until)
    }

    /// Whether the window's scope takes in `model`: its own model, or every model.
    pub fn applies_to(&self, model: &str) -> bool {
        self.model.as_deref().is_none_or(|m| m == model)
    }

    fn covers(&self, model: &str, now: Millis) -> bool {
        self.active(now) && self.applies_to(model)
    }
}

/// The disabled lane: billing (with expiry) or a permanent auth failure (until cleared).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Disabled {
    /// `None`: until an admin clears it or the account logs in again.
    pub until: Option<Millis>,
    pub reason: Reason,
}

impl Disabled {
    /// Whether the lane is still closed at `now`: until `until` (exclusive), or for good when
    /// it has none.
    pub fn active(&self, now: Millis) -> bool {
        self.until.is_none_or(|u| now < u)
    }

    /// When the lane opens again: at `until`, or when an admin clears it.
    pub fn ends(&self) -> Until {
        self.until.map_or(Until::Cleared, Until::At)
    }
}

/// When a window ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Until {
    At(Millis),
    Cleared,
}

impl Until {
    /// Sort key: a window that only an admin ends sorts after every timed one.
    pub fn key(self) -> Millis {
        match self {
            Until::At(t) => t,
            Until::Cleared => Millis::MAX,
        }
    }

    /// As stored: the time, or `None` for "until cleared".
    pub fn at(self) -> Option<Millis> {
        match self {
            Until::At(t) => Some(t),
            Until::Cleared => None,
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageStats {
    pub last_used: Option<Millis>,
    pub last_success_at: Option<Millis>,
    /// When the latest-sent call that succeeded was sent: what a success proves is dated then
    /// (a failure that arrives later ends nothing it proved, a window opened since it was sent
    /// outlives it).
    pub last_success_sent_at: Option<Millis>,
    /// The cooldown lane: at most one window per scope (a model, or `None` for every model).
    /// Two models cooling on one profile are two windows; a third model is not blocked.
    pub cooldowns: Vec<Cooldown>,
    pub disabled: Option<Disabled>,
    /// Failures since the last reset, every reason that is the upstream's or the request's
    /// (`Reason::counts`), whether or not it opened a window.
    pub error_count: u32,
    pub failure_counts: BTreeMap<Reason, u32>,
    pub last_failure_at: Option<Millis>,
    /// When a window of the profile was last opened or escalated (the disabled lane's burst
    /// guard; each cooldown window keeps its own).
    pub window_opened_at: Option<Millis>,
    pub success_count: u64,
    pub failure_total: u64,
    /// The billing lane's doubling step: billing windows opened since the last success. It
    /// survives the expiry of the windows (unlike the counters) and resets on a success or an
    /// admin clear.
    pub billing_step: u32,
    /// When an admin last cleared the profile (or an account logged in again): failures from
    /// before it open no window, whenever their write lands.
    pub cleared_at: Option<Millis>,
    /// What the provider's answers last said of the remaining quota, one entry per model
    /// (`profile_quota`): observations, not failures; they never open a window. Not serialized
    /// here: the API shows them with what they mean now (`quota`).
    #[serde(default, skip_serializing)]
    pub quotas: Vec<Quota>,
}

/// One change of a profile's usage stats. The book applies it at once; the store replays it on
/// the stored row in the database's commit order, so that concurrent writers (the CLI, other
/// instances) never lose each other's updates. Each change carries its own time: one that lands
/// late is judged at that time (docs/scale.md, "merge rules").
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// Chosen for an attempt.
    Used(Millis),
    /// A failed attempt (`record_failure`).
    Failed(Failure, Millis),
    /// A failed call that is retried on the same profile (`count_failure`).
    Counted(Reason, Millis),
    /// Served this model, this many times, by calls sent at `sent` and answered at `at`
    /// (successes in a row coalesce while they wait to be written: the latest times with the
    /// count are the same change as each in turn).
    Served { model: String, sent: Millis, at: Millis, times: u32 },
    /// An admin cleared the profile, or its account logged in again.
    Cleared(Millis),
    /// The sweep: windows that have ended go.
    Expired(Millis),
    /// An answer reported the remaining quota for a model: the latest report wins.
    Quota(Quota),
}

/// A profile's changes waiting to be written, coalesced so that what waits for a slow
/// database is bounded by the profiles, not by the requests: successes in a row of one model
/// become one change with their count and the latest time, and every `Used` the latest one
/// (it only moves `last_used` forward, whatever else happens). Replayed, they leave the stats
/// as the changes one by one would.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Unwritten {
    used: Option<Millis>,
    changes: Vec<Change>,
    /// The latest quota report of each model (only the latest of a model counts).
    quotas: Vec<Quota>,
}

impl Unwritten {
    pub fn push(&mut self, change: Change) {
        match (change, self.changes.last_mut()) {
            (Change::Used(t), _) => self.used = self.used.max(Some(t)),
            (Change::Quota(q), _) => quota::keep_latest(&mut self.quotas, q),
            (
                Change::Served { model, sent, at, times: n },
                Some(Change::Served { model: last, sent: last_sent, at: last_at, times }),
            ) if *last == model => {
                *last_sent = (*last_sent).max(sent);
                *last_at = (*last_at).max(at);
                *times += n;
            }
            (c, _) => self.changes.push(c),
        }
    }

    /// The changes to replay, in order.
    pub fn replay(&self) -> impl Iterator<Item = Change> + '_ {
        let quotas = self.quotas.iter().cloned().map(Change::Quota);
        self.changes.iter().cloned().chain(quotas).chain(self.used.map(Change::Used))
    }

    pub fn into_changes(self) -> Vec<Change> {
        let mut v = self.changes;
        v.extend(self.quotas.into_iter().map(Change::Quota));
        v.extend(self.used.map(Change::Used));
        v
    }
}

/// What the engine needs to know about one failed attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    pub reason: Reason,
    pub model: String,
    /// The provider's reset hint (relative wait), if it gave one.
    pub hint_ms: Option<Millis>,
    pub account_wide: bool,
    /// When the failed attempt started: attempts already in flight when a window opened are
    /// a burst and do not escalate it again.
    pub started_at: Millis,
    /// An agent's claim (a lease report), not rota's own evidence: it may cool the profile on
    /// the ladder, never for longer than `cooldown.max`, and never reaches the disabled lanes
    /// (docs/rotation.md "Evidence").
    pub claim: bool,
}

impl UsageStats {
    /// The disabled lane, if it is closed at `now`.
    pub fn active_disabled(&self, now: Millis) -> Option<&Disabled> {
        self.disabled.as_ref().filter(|d| d.active(now))
    }

    fn disabled_active(&self, now: Millis) -> bool {
        self.active_disabled(now).is_some()
    }

    /// Until when this profile may not serve `model`; `None` when it is usable.
    pub fn blocked_until(&self, model: &str, now: Millis) -> Option<Until> {
        let disabled = self.active_disabled(now).map(Disabled::ends);
        let cooled = self.cooldowns.iter().filter(|c| c.covers(model, now)).map(Cooldown::ends).max();
        disabled.max(cooled)
    }

    /// The reason of the window that blocks `model`, the disabled lane first.
    pub fn blocked_reason(&self, model: &str, now: Millis) -> Option<Reason> {
        if self.disabled_active(now) {
            return self.disabled.as_ref().map(|d| d.reason);
        }
        self.cooldowns.iter().filter(|c| c.covers(model, now)).max_by_key(|c| c.until).map(|c| c.reason)
    }

    /// The active cooldown windows, the one that ends last first (the profile-wide one first
    /// on a tie): the first is what `usage_stats.cooldown_*` show.
    pub fn active_cooldowns(&self, now: Millis) -> Vec<&Cooldown> {
        let mut v: Vec<_> = self.cooldowns.iter().filter(|c| c.active(now)).collect();
        v.sort_by_key(|c| (std::cmp::Reverse(c.until), c.model.is_some(), c.model.clone()));
        v
    }

    /// Whether a window for every model is active (a failed refresh opens one).
    pub fn cooling_every_model(&self, now: Millis) -> bool {
        self.cooldowns.iter().any(|c| c.model.is_none() && c.active(now))
    }

    /// Applies one change; returns what `record_failure` returns for a failure.
    pub fn apply(&mut self, change: &Change, policy: &CooldownPolicy) -> Option<Until> {
        match change {
            Change::Used(now) => self.mark_used(*now),
            Change::Failed(f, now) => return self.record_failure(f, *now, policy),
            Change::Counted(reason, now) => {
                self.count_failure(*reason, *now, policy);
            }
            Change::Served { model, sent, at, times } => {
                self.record_success(model, *sent, *at);
                self.success_count += u64::from(times.saturating_sub(1));
            }
            Change::Cleared(now) => self.clear_errors(*now),
            Change::Expired(now) => {
                self.expire(*now, policy);
            }
            Change::Quota(q) => quota::keep_latest(&mut self.quotas, q.clone()),
        }
        None
    }

    /// Until when the profile is low on quota for `model` (`Quota::low_until`).
    pub fn quota_low_until(&self, model: &str, floor: Floor, now: Millis) -> Option<Millis> {
        self.quotas.iter().find(|q| q.model == model)?.low_until(floor, now)
    }

    /// The profile was chosen for an attempt (set at selection, so concurrent requests spread).
    /// The later time wins.
    pub fn mark_used(&mut self, now: Millis) {
        self.last_used = self.last_used.max(Some(now));
    }

    /// The profile served `model` with a call sent at `sent`, answered at `now`. What it proves
    /// is dated when it was sent: the windows that cover `model` and opened at or before `sent`
    /// end, and so does the disabled lane when no window opened since; the counters and the
    /// billing step reset when no failure was recorded since. A window opened after the call
    /// was sent (a 429 answered while it was in flight, or another server's failure) stays:
    /// it is the newer evidence. Another model's window stays too: it is that model's own
    /// evidence, and runs out on its own.
    pub fn record_success(&mut self, model: &str, sent: Millis, now: Millis) {
        self.cooldowns.retain(|c| c.active(now) && !(c.applies_to(model) && c.opened_at <= sent));
        if self.window_opened_at.is_none_or(|o| o <= sent) {
            self.disabled = None;
        }
        if self.last_failure_at.is_none_or(|t| t <= sent) {
            self.reset_counters();
            self.billing_step = 0;
        }
        self.last_success_at = self.last_success_at.max(Some(now));
        self.last_success_sent_at = self.last_success_sent_at.max(Some(sent));
        self.success_count += 1;
    }

    /// An admin cleared the profile at `now`: both lanes and every window opened until then,
    /// the counters and the billing step. Failures from before `now` that land later open no
    /// window.
    pub fn clear_errors(&mut self, now: Millis) {
        self.cooldowns.retain(|c| c.opened_at > now);
        if self.window_opened_at.is_none_or(|o| o <= now) {
            self.disabled = None;
        }
        self.reset_counters();
        self.billing_step = 0;
        self.cleared_at = self.cleared_at.max(Some(now));
    }

    fn reset_counters(&mut self) {
        self.error_count = 0;
        self.failure_counts.clear();
        self.window_opened_at = None;
    }

    /// Drops the windows that have ended. When both lanes are over, the counters reset too:
    /// at once when a window has just ended, and otherwise (failures that opened no window)
    /// once the last failure is older than the failure window. The billing step stays
    /// (docs/rotation.md). Whether anything changed.
    pub fn expire(&mut self, now: Millis, policy: &CooldownPolicy) -> bool {
        let windows = self.cooldowns.len();
        self.cooldowns.retain(|c| c.active(now));
        let mut changed = self.cooldowns.len() != windows;
        if self.disabled.is_some() && !self.disabled_active(now) {
            self.disabled = None;
            changed = true;
        }
        let idle = self.cooldowns.is_empty() && self.disabled.is_none();
        let quiet = self.last_failure_at.is_none_or(|t| now - t > ms(policy.cooldown.failure_window));
        let counted = self.error_count > 0 || !self.failure_counts.is_empty() || self.window_opened_at.is_some();
        if idle && counted && (changed || quiet) {
            self.reset_counters();
            changed = true;
        }
        changed
    }

    /// Counts a failure without opening or escalating a window (a failed call that is retried
    /// on the same profile: only the last try leaves a mark). Whether it counted.
    pub fn count_failure(&mut self, reason: Reason, now: Millis, policy: &CooldownPolicy) -> bool {
        if !reason.counts() {
            return false;
        }
        self.failure_total += 1;
        let cleared_since = self.cleared_at.is_some_and(|c| now < c);
        if !cleared_since {
            self.expire(now, policy);
        }
        self.last_failure_at = self.last_failure_at.max(Some(now));
        if cleared_since {
            return false; // an admin cleared the profile after it: lifetime counter only
        }
        self.error_count += 1;
        *self.failure_counts.entry(reason).or_default() += 1;
        true
    }

    /// Records a failure and returns until when the profile may not serve the failing model,
    /// if the reason cools the profile at all. Every failure that `Reason::counts` is counted;
    /// only the reasons that mark the profile open or escalate a window, and windows only ever
    /// grow here.
    pub fn record_failure(&mut self, f: &Failure, now: Millis, policy: &CooldownPolicy) -> Option<Until> {
        if !self.count_failure(f.reason, now, policy) {
            return None;
        }
        let mark = f.reason.mark();
        if !matches!(mark, Mark::CooldownModel | Mark::CooldownProfile | Mark::Disabled) {
            return None;
        }
        // A call sent at or after this failure served (the failure's write landed late): that
        // success is the newer evidence, and it would have ended a profile-wide window.
        let served_since = self.last_success_sent_at.is_some_and(|t| t >= now);
        let model_scoped = mark == Mark::CooldownModel && !f.account_wide;
        if served_since && !model_scoped {
            return self.blocked_until(&f.model, now);
        }
        if f.reason == Reason::AuthPermanent && !f.claim {
            self.disabled = Some(Disabled { until: None, reason: f.reason });
            self.window_opened_at = Some(now);
            return Some(Until::Cleared);
        }
        let hint =
            f.hint_ms.map(|h| policy.clamp_hint(h)).map(|h| if f.claim { h.min(ms(policy.cooldown.max)) } else { h });
        let to_disabled =
            !f.claim && (f.reason == Reason::Billing || hint.is_some_and(|h| h > ms(policy.cooldown.max)));
        if to_disabled {
            let in_flight = self.window_opened_at.is_some_and(|opened| f.started_at < opened);
            if in_flight && self.disabled_active(now) {
                // A burst (or a late write): no new billing step, but at least its own wait.
                let wait = hint.unwrap_or_else(|| policy.billing(self.billing_step.max(1)));
                self.extend_disabled(now + wait, f.reason);
                return self.blocked_until(&f.model, now);
            }
            if f.reason == Reason::Billing {
                self.billing_step += 1;
            }
            let wait = hint.unwrap_or_else(|| policy.billing(self.billing_step));
            self.extend_disabled(now + wait, f.reason);
        } else {
            let scope = (mark == Mark::CooldownModel && !f.account_wide).then(|| f.model.clone());
            match self.cooldowns.iter_mut().find(|c| c.model == scope) {
                // A burst: the call was in flight when the window opened or last escalated (or
                // another server's earlier failure landed late). It does not escalate the
                // window, but the window lasts at least as long as that failure alone would
                // have made it (its hint included).
                Some(c) if f.started_at < c.opened_at => {
                    let until = now + hint.unwrap_or_else(|| policy.ladder(1));
                    if until > c.until {
                        c.until = until;
                        c.reason = f.reason;
                    }
                    return self.blocked_until(&f.model, now);
                }
                Some(c) => {
                    c.step += 1;
                    let until = now + hint.unwrap_or_else(|| policy.ladder(c.step));
                    if until > c.until {
                        c.until = until;
                        c.reason = f.reason;
                    }
                    c.opened_at = now;
                }
                None => {
                    let until = now + hint.unwrap_or_else(|| policy.ladder(1));
                    self.cooldowns.push(Cooldown { until, reason: f.reason, model: scope, step: 1, opened_at: now });
                }
            }
        }
        self.window_opened_at = self.window_opened_at.max(Some(now));
        self.blocked_until(&f.model, now)
    }

    fn extend_disabled(&mut self, until: Millis, reason: Reason) {
        match &mut self.disabled {
            Some(d) if d.until.is_none() => {}
            Some(d) if d.until.is_some_and(|u| u >= until) => {}
            _ => self.disabled = Some(Disabled { until: Some(until), reason }),
        }
    }
}

/// A model cooled on a provider for every profile (model_not_found).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelCooldown {
    pub until: Millis,
    pub error_count: u32,
    pub last_failure_at: Millis,
}

/// A change of a model's cooldown on a provider, replayed like `Change`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModelChange {
    /// A `model_not_found` of a call that started at `started_at`.
    NotFound { now: Millis, started_at: Millis },
    /// A success of the model, or an admin's clear.
    Ended(Millis),
}

impl ModelCooldown {
    /// Whether the model is still cooling at `now` (the window ends at `until`, exclusive).
    pub fn active(&self, now: Millis) -> bool {
        now < self.until
    }

    /// The state after `change`; `None` when there is none.
    pub fn apply(prev: Option<&ModelCooldown>, change: &ModelChange, policy: &CooldownPolicy) -> Option<ModelCooldown> {
        match *change {
            ModelChange::NotFound { now, started_at } => {
                Some(ModelCooldown::after_failure(prev, now, started_at, policy))
            }
            // A window opened after `now` (its write landed first) stays.
            ModelChange::Ended(now) => prev.map(|p| match p.active(now) && p.last_failure_at <= now {
                true => ModelCooldown { until: now, error_count: 0, last_failure_at: p.last_failure_at },
                false => p.clone(),
            }),
        }
    }

    /// The next state after one more model_not_found, on the same ladder and resets as profiles.
    /// `started_at`: when the failed call started; calls already in flight when the window was
    /// last escalated are a burst and do not escalate it again (the burst guard).
    pub fn after_failure(
        prev: Option<&ModelCooldown>,
        now: Millis,
        started_at: Millis,
        policy: &CooldownPolicy,
    ) -> ModelCooldown {
        if let Some(p) = prev.filter(|p| p.active(now) && started_at < p.last_failure_at) {
            return p.clone();
        }
        let count = match prev {
            Some(p) if p.active(now) => p.error_count + 1,
            _ => 1,
        };
        let until = now + policy.ladder(count);
        ModelCooldown { until: prev.map_or(until, |p| p.until.max(until)), error_count: count, last_failure_at: now }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: Millis = 60_000;
    const HOUR: Millis = 60 * MIN;
    const T0: Millis = 1_000_000_000;

    fn p() -> CooldownPolicy {
        CooldownPolicy::default()
    }

    fn fail(reason: Reason, at: Millis) -> Failure {
        Failure { reason, model: "m1".into(), hint_ms: None, account_wide: false, started_at: at, claim: false }
    }

    fn fail_hint(reason: Reason, at: Millis, hint: Millis) -> Failure {
        Failure { hint_ms: Some(hint), ..fail(reason, at) }
    }

    #[test]
    fn the_policy_deserializes_from_the_cooldown_and_billing_tables_with_defaults_for_what_is_left_out() {
        let none: CooldownPolicy = toml::from_str("").unwrap();
        assert_eq!(none, p());
        let d = Duration::from_secs;
        assert_eq!(
            p(),
            CooldownPolicy {
                cooldown: CooldownLane {
                    base: d(60),
                    factor: 5,
                    max: d(3600),
                    failure_window: d(600),
                    hint_max: d(6 * 3600)
                },
                billing: BillingLane { base: d(3600), max: d(24 * 3600) },
            },
            "the defaults of docs/rotation.md"
        );
        let some: CooldownPolicy = toml::from_str(
            "[cooldown]\nbase = \"30s\"\nmax = 7200\nfailure_window = \"1h30m\"\n[billing]\nmax = \"12h\"",
        )
        .unwrap();
        let want = CooldownPolicy {
            cooldown: CooldownLane { base: d(30), max: d(7200), failure_window: d(5400), ..p().cooldown },
            billing: BillingLane { max: d(12 * 3600), ..p().billing },
        };
        assert_eq!(some, want);
        let all: CooldownPolicy = toml::from_str(
            "[cooldown]\nbase = 10\nfactor = 2\nmax = \"5m\"\nfailure_window = \"1m\"\nhint_max = \"2h\"\n\
             [billing]\nbase = \"30m\"\nmax = \"2d\"",
        )
        .unwrap();
        let want = CooldownPolicy {
            cooldown: CooldownLane { base: d(10), factor: 2, max: d(300), failure_window: d(60), hint_max: d(7200) },
            billing: BillingLane { base: d(1800), max: d(2 * 86_400) },
        };
        assert_eq!(all, want);
        // Each table alone, too (the config file holds them as two of its fields).
        let lane: CooldownLane = toml::from_str("factor = 3").unwrap();
        assert_eq!(lane, CooldownLane { factor: 3, ..p().cooldown });
        assert_eq!(toml::from_str::<BillingLane>("").unwrap(), p().billing);
    }

    #[test]
    fn the_policy_tables_refuse_unknown_keys_and_bad_durations_saying_how_to_write_one() {
        let err = toml::from_str::<CooldownPolicy>("[cooldown]\nbsae = \"30s\"").unwrap_err().to_string();
        assert!(err.contains("unknown field `bsae`"), "{err}");
        let err = toml::from_str::<CooldownPolicy>("[billing]\nmax = \"soon\"").unwrap_err().to_string();
        assert!(
            err.contains("invalid duration `soon`") && err.contains("write e.g. \"90s\", \"5m\" or \"1h\""),
            "{err}"
        );
        let err = toml::from_str::<CooldownPolicy>("[cooldown]\nbase = \"60\"").unwrap_err().to_string();
        assert!(err.contains("invalid duration `60`"), "a quoted number without a unit: {err}");
    }

    #[test]
    fn a_cooldown_window_is_active_until_its_end_for_its_scope() {
        let w =
            Cooldown { until: T0 + MIN, reason: Reason::RateLimit, model: Some("m1".into()), step: 1, opened_at: T0 };
        assert!(w.active(T0) && w.active(T0 + MIN - 1));
        assert!(!w.active(T0 + MIN), "the end is exclusive");
        assert_eq!(w.ends(), Until::At(T0 + MIN));
        assert!(w.applies_to("m1") && !w.applies_to("m2"));
        let every = Cooldown { model: None, ..w };
        assert!(every.applies_to("m1") && every.applies_to("m2"));
    }

    #[test]
    fn a_disabled_lane_is_active_until_its_end_or_for_good_without_one() {
        let timed = Disabled { until: Some(T0 + HOUR), reason: Reason::Billing };
        assert!(timed.active(T0 + HOUR - 1) && !timed.active(T0 + HOUR));
        assert_eq!(timed.ends(), Until::At(T0 + HOUR));
        let for_good = Disabled { until: None, reason: Reason::AuthPermanent };
        assert!(for_good.active(Millis::MAX));
        assert_eq!(for_good.ends(), Until::Cleared);
        let s = UsageStats { disabled: Some(timed.clone()), ..Default::default() };
        assert_eq!(s.active_disabled(T0), Some(&timed));
        assert_eq!(s.active_disabled(T0 + HOUR), None, "ended, though the sweep has not dropped it yet");
        assert_eq!(UsageStats::default().active_disabled(T0), None);
    }

    #[test]
    fn until_reads_back_as_the_stored_time() {
        assert_eq!(Until::At(T0).at(), Some(T0));
        assert_eq!(Until::Cleared.at(), None);
    }

    #[test]
    fn a_model_cooldown_is_active_until_its_end() {
        let m = ModelCooldown { until: T0 + MIN, error_count: 1, last_failure_at: T0 };
        assert!(m.active(T0 + MIN - 1) && !m.active(T0 + MIN));
    }

    #[test]
    fn ladder_is_1_5_25_60_60_minutes() {
        let got: Vec<_> = (1..=6).map(|n| p().ladder(n) / MIN).collect();
        assert_eq!(got, [1, 5, 25, 60, 60, 60]);
    }

    #[test]
    fn ladder_follows_configured_base_factor_and_max() {
        let ladder =
            CooldownLane { base: Duration::from_secs(10), factor: 2, max: Duration::from_secs(60), ..p().cooldown };
        let pol = CooldownPolicy { cooldown: ladder, ..p() };
        assert_eq!((1..=5).map(|n| pol.ladder(n)).collect::<Vec<_>>(), [10_000, 20_000, 40_000, 60_000, 60_000]);
    }

    #[test]
    fn billing_lane_doubles_from_one_hour_to_a_day() {
        let got: Vec<_> = (1..=7).map(|n| p().billing(n) / MIN).collect();
        assert_eq!(got, [60, 120, 240, 480, 960, 1440, 1440]);
    }

    #[test]
    fn failures_during_an_active_window_escalate_the_ladder() {
        // The last candidate is always tried, so a cooled profile can fail again in its window.
        let mut s = UsageStats::default();
        let mut t = T0;
        let mut ends = vec![];
        for _ in 0..5 {
            let end = s.record_failure(&fail(Reason::RateLimit, t), t, &p()).unwrap();
            ends.push((end.key() - t) / MIN);
            t += 30_000;
        }
        assert_eq!(ends, [1, 5, 25, 60, 60]);
        assert_eq!(s.error_count, 5);
        assert_eq!(s.failure_total, 5);
    }

    #[test]
    fn rate_limit_cooldown_is_scoped_to_the_failing_model() {
        let mut s = UsageStats::default();
        s.record_failure(&fail(Reason::RateLimit, T0), T0, &p());
        let window =
            Cooldown { until: T0 + MIN, reason: Reason::RateLimit, model: Some("m1".into()), step: 1, opened_at: T0 };
        assert_eq!(s.cooldowns, [window]);
        assert_eq!(s.blocked_until("m1", T0 + 1), Some(Until::At(T0 + MIN)));
        assert_eq!(s.blocked_until("m2", T0 + 1), None);
    }

    #[test]
    fn overloaded_and_timeout_are_model_scoped_too() {
        for r in [Reason::Overloaded, Reason::Timeout] {
            let mut s = UsageStats::default();
            s.record_failure(&fail(r, T0), T0, &p());
            assert_eq!(s.cooldowns[0].model.as_deref(), Some("m1"), "{r}");
        }
    }

    #[test]
    fn account_wide_throttle_covers_every_model() {
        let mut s = UsageStats::default();
        s.record_failure(&Failure { account_wide: true, ..fail(Reason::RateLimit, T0) }, T0, &p());
        assert_eq!(s.cooldowns[0].model, None);
        assert_eq!(s.blocked_until("m2", T0 + 1), Some(Until::At(T0 + MIN)));
    }

    #[test]
    fn auth_cooldown_covers_the_whole_profile() {
        let mut s = UsageStats::default();
        s.record_failure(&fail(Reason::Auth, T0), T0, &p());
        assert_eq!(
            s.cooldowns,
            [Cooldown { until: T0 + MIN, reason: Reason::Auth, model: None, step: 1, opened_at: T0 }]
        );
    }

    #[test]
    fn two_models_cooling_on_one_profile_are_two_windows_and_a_third_is_not_blocked() {
        let mut s = UsageStats::default();
        s.record_failure(&fail(Reason::RateLimit, T0), T0, &p());
        let t = T0 + 1000;
        let end = s.record_failure(&Failure { model: "m2".into(), ..fail(Reason::RateLimit, t) }, t, &p());
        assert_eq!(end, Some(Until::At(t + MIN)), "m2 climbs its own ladder from the first step");
        assert_eq!(s.blocked_until("m1", t), Some(Until::At(T0 + MIN)));
        assert_eq!(s.blocked_until("m2", t), Some(Until::At(t + MIN)));
        assert_eq!(s.blocked_until("m3", t), None);
        assert_eq!(s.error_count, 2, "the counters are the profile's");
        let heads: Vec<_> = s.active_cooldowns(t).iter().map(|c| c.model.clone()).collect();
        assert_eq!(heads, [Some("m2".to_string()), Some("m1".to_string())], "the one that ends last first");
    }

    #[test]
    fn each_window_climbs_its_own_ladder() {
        let mut s = UsageStats::default();
        let mut t = T0;
        for _ in 0..3 {
            s.record_failure(&fail(Reason::RateLimit, t), t, &p());
            t += 1000;
        }
        assert_eq!(s.blocked_until("m1", t), Some(Until::At(t - 1000 + 25 * MIN)));
        let end = s.record_failure(&Failure { model: "m2".into(), ..fail(Reason::Overloaded, t) }, t, &p());
        assert_eq!(end, Some(Until::At(t + MIN)), "m1's failures do not escalate m2");
    }

    #[test]
    fn the_burst_guard_is_per_window() {
        let mut s = UsageStats::default();
        s.record_failure(&fail(Reason::RateLimit, T0), T0 + 10, &p());
        // A call to m2 that started before m1's window opened still opens m2's window.
        let end = s.record_failure(&Failure { model: "m2".into(), ..fail(Reason::RateLimit, T0) }, T0 + 20, &p());
        assert_eq!(end, Some(Until::At(T0 + 20 + MIN)));
        // And a second in-flight m2 failure does not escalate it (it lasts as long as that
        // failure's own first step).
        let end = s.record_failure(&Failure { model: "m2".into(), ..fail(Reason::RateLimit, T0) }, T0 + 30, &p());
        assert_eq!(end, Some(Until::At(T0 + 30 + MIN)));
        assert_eq!(s.cooldowns.iter().map(|c| c.step).collect::<Vec<_>>(), [1, 1]);
    }

    #[test]
    fn a_success_ends_the_windows_of_its_model_and_leaves_another_models_window() {
        let mut s = UsageStats::default();
        s.record_failure(&fail(Reason::RateLimit, T0), T0, &p());
        s.record_failure(&Failure { model: "m2".into(), ..fail(Reason::RateLimit, T0 + 1) }, T0 + 1, &p());
        s.record_failure(&Failure { account_wide: true, ..fail(Reason::Network, T0 + 2) }, T0 + 2, &p());
        s.record_success("m1", T0 + 3, T0 + 3);
        assert_eq!(s.blocked_until("m1", T0 + 3), None);
        assert_eq!(s.blocked_until("m2", T0 + 3), Some(Until::At(T0 + 1 + MIN)), "m2's own window runs out");
        assert_eq!(s.cooldowns.len(), 1);
        assert_eq!((s.error_count, s.failure_counts.len()), (0, 0));
    }

    #[test]
    fn a_claim_of_revocation_or_billing_cools_the_whole_profile_on_the_ladder_and_never_disables() {
        for reason in [Reason::AuthPermanent, Reason::Billing] {
            let mut s = UsageStats::default();
            let claim = Failure { claim: true, ..fail(reason, T0) };
            let end = s.record_failure(&claim, T0, &p());
            assert_eq!(end, Some(Until::At(T0 + 60_000)), "{reason}: the first ladder step");
            assert!(s.disabled.is_none(), "{reason}");
            assert_eq!(s.blocked_until("another-model", T0), Some(Until::At(T0 + 60_000)), "profile-wide");
            for i in 1..10 {
                let t = T0 + i * 3_600_000;
                s.record_failure(&Failure { claim: true, ..fail(reason, t) }, t, &p());
                assert!(s.disabled.is_none());
                assert!(
                    s.blocked_until("m1", t).is_some_and(|u| u <= Until::At(t + 3_600_000)),
                    "never past cooldown.max"
                );
            }
        }
    }

    #[test]
    fn billing_escalation_survives_expiry_and_resets_only_on_success() {
        let mut s = UsageStats::default();
        let mut t = T0;
        let mut waits = Vec::new();
        for _ in 0..6 {
            let end = s.record_failure(&fail(Reason::Billing, t), t, &p());
            let Some(Until::At(end)) = end else { panic!("a billing window has an end") };
            waits.push((end - t) / HOUR);
            t = end + 1; // expired, nobody probed it
        }
        assert_eq!(waits, [1, 2, 4, 8, 16, 24]);
        assert_eq!(s.error_count, 1, "the counters reset on expiry; the step does not");
        s.record_success("m1", t, t);
        let end = s.record_failure(&fail(Reason::Billing, t + 1), t + 1, &p());
        assert_eq!(end, Some(Until::At(t + 1 + HOUR)), "a success starts the ladder again");
    }

    #[test]
    fn model_cooldowns_climb_the_ladder_once_per_window_whatever_the_burst() {
        let first = ModelCooldown::after_failure(None, T0, T0 - 10, &p());
        assert_eq!(first.until, T0 + MIN);
        // Ten concurrent 404s that were in flight when the window opened: no escalation.
        let mut m = first.clone();
        for i in 1..=10 {
            m = ModelCooldown::after_failure(Some(&m), T0 + i, T0 - 5, &p());
        }
        assert_eq!(m, first);
        // A call started after the window opened (the last candidate is always tried) escalates.
        let next = ModelCooldown::after_failure(Some(&m), T0 + 100, T0 + 50, &p());
        assert_eq!((next.until, next.error_count), (T0 + 100 + 5 * MIN, 2));
    }

    #[test]
    fn an_ended_window_resets_the_windows_and_counters_at_once() {
        let mut s = UsageStats::default();
        s.record_failure(&fail(Reason::RateLimit, T0), T0, &p());
        assert!(!s.expire(T0 + MIN - 1, &p()), "still cooling");
        assert_eq!(s.error_count, 1);
        assert!(s.expire(T0 + MIN, &p()));
        assert_eq!((s.cooldowns.len(), s.error_count, s.failure_counts.len()), (0, 0, 0));
        assert_eq!((s.failure_total, s.last_failure_at), (1, Some(T0)), "lifetime counters stay");
        assert!(!s.expire(T0 + 2 * MIN, &p()), "nothing left to reset");
    }

    #[test]
    fn counters_without_a_window_reset_once_the_failure_window_has_passed() {
        let mut s = UsageStats::default();
        s.record_failure(&fail(Reason::Format, T0), T0, &p());
        assert!(!s.expire(T0 + 10 * MIN, &p()), "inside the failure window");
        assert_eq!(s.error_count, 1);
        assert!(s.expire(T0 + 10 * MIN + 1, &p()));
        assert_eq!((s.error_count, s.failure_total), (0, 1));
    }

    #[test]
    fn a_claimed_hint_is_capped_at_the_cooldown_max() {
        let mut s = UsageStats::default();
        let claim = Failure { claim: true, ..fail_hint(Reason::RateLimit, T0, 6 * 3_600_000) };
        assert_eq!(s.record_failure(&claim, T0, &p()), Some(Until::At(T0 + 3_600_000)));
        assert!(s.disabled.is_none());
    }

    #[test]
    fn provider_hint_wins_over_the_ladder() {
        let mut s = UsageStats::default();
        let end = s.record_failure(&fail_hint(Reason::RateLimit, T0, 7_000), T0, &p());
        assert_eq!(end, Some(Until::At(T0 + 7_000)));
    }

    #[test]
    fn hints_are_clamped_to_at_least_one_second() {
        let mut s = UsageStats::default();
        let end = s.record_failure(&fail_hint(Reason::RateLimit, T0, 5), T0, &p());
        assert_eq!(end, Some(Until::At(T0 + 1_000)));
    }

    #[test]
    fn hint_longer_than_cooldown_max_goes_to_the_disabled_lane() {
        let mut s = UsageStats::default();
        let end = s.record_failure(&fail_hint(Reason::RateLimit, T0, 3 * 3_600_000), T0, &p());
        assert_eq!(end, Some(Until::At(T0 + 3 * 3_600_000)));
        assert_eq!(s.disabled, Some(Disabled { until: Some(T0 + 3 * 3_600_000), reason: Reason::RateLimit }));
        assert_eq!(s.cooldowns, []);
        assert_eq!(s.blocked_until("other-model", T0 + 1), Some(Until::At(T0 + 3 * 3_600_000)));
    }

    #[test]
    fn hints_are_clamped_to_hint_max() {
        let mut s = UsageStats::default();
        let end = s.record_failure(&fail_hint(Reason::RateLimit, T0, 48 * 3_600_000), T0, &p());
        assert_eq!(end, Some(Until::At(T0 + 6 * 3_600_000)));
    }

    #[test]
    fn billing_disables_the_profile_doubling_per_billing_failure() {
        let mut s = UsageStats::default();
        let e1 = s.record_failure(&fail(Reason::Billing, T0), T0, &p()).unwrap();
        assert_eq!(e1, Until::At(T0 + 60 * MIN));
        let t = T0 + MIN;
        let e2 = s.record_failure(&fail(Reason::Billing, t), t, &p()).unwrap();
        assert_eq!(e2, Until::At(t + 120 * MIN));
        assert_eq!(s.disabled.as_ref().unwrap().reason, Reason::Billing);
        assert_eq!(s.blocked_until("any", t), Some(Until::At(t + 120 * MIN)));
    }

    #[test]
    fn auth_permanent_disables_until_cleared() {
        let mut s = UsageStats::default();
        let end = s.record_failure(&fail(Reason::AuthPermanent, T0), T0, &p());
        assert_eq!(end, Some(Until::Cleared));
        assert_eq!(s.blocked_until("m1", T0 + 365 * 24 * 60 * MIN), Some(Until::Cleared));
        s.clear_errors(T0 + 1);
        assert_eq!(s.blocked_until("m1", T0 + 1), None);
    }

    #[test]
    fn a_clear_wins_over_windows_before_it_and_loses_to_failures_after_it_whenever_they_land() {
        let mut s = UsageStats::default();
        s.record_failure(&fail(Reason::RateLimit, T0), T0, &p());
        s.clear_errors(T0 + 10);
        // A failure from before the clear lands late: counted for life, no window, no reset counter.
        let late = s.record_failure(&fail(Reason::AuthPermanent, T0 + 5), T0 + 5, &p());
        assert_eq!((late, s.blocked_until("m1", T0 + 20), s.error_count, s.failure_total), (None, None, 0, 2));
        // One after it cools as usual.
        let after = s.record_failure(&fail(Reason::RateLimit, T0 + 20), T0 + 20, &p());
        assert_eq!(after, Some(Until::At(T0 + 20 + MIN)));
        // And a clear that lands after a later failure leaves that failure's window.
        s.clear_errors(T0 + 15);
        assert_eq!(s.blocked_until("m1", T0 + 21), Some(Until::At(T0 + 20 + MIN)));
    }

    #[test]
    fn calls_in_flight_when_a_429_arrived_never_end_the_window_it_opened() {
        // Five calls sent at T0 are in flight on the account when a sixth, sent at T0 + 100, is
        // answered 429 with a 10-minute hint at T0 + 200. The five succeed after it.
        let mut s = UsageStats::default();
        let until = s.record_failure(&fail_hint(Reason::RateLimit, T0 + 100, 10 * MIN), T0 + 200, &p());
        assert_eq!(until, Some(Until::At(T0 + 200 + 10 * MIN)));
        for i in 0..5 {
            s.record_success("m1", T0, T0 + 2_000 + i);
        }
        // Nor does one sent after the failing call, but before its 429 arrived.
        s.record_success("m1", T0 + 150, T0 + 2_100);
        assert_eq!(s.blocked_until("m1", T0 + 3_000), Some(Until::At(T0 + 200 + 10 * MIN)), "the window holds");
        assert_eq!((s.error_count, s.success_count, s.last_success_at), (1, 6, Some(T0 + 2_100)));
        // A call sent after the 429 arrived that succeeds is newer evidence: it ends the window.
        s.record_success("m1", T0 + 201, T0 + 3_000);
        assert_eq!((s.blocked_until("m1", T0 + 3_000), s.error_count), (None, 0));
    }

    #[test]
    fn a_success_sent_before_a_billing_window_opened_leaves_the_disabled_lane() {
        let mut s = UsageStats::default();
        s.record_failure(&fail(Reason::Billing, T0 + 10), T0 + 10, &p());
        s.record_success("m1", T0, T0 + 20);
        assert_eq!(s.blocked_until("m1", T0 + 20), Some(Until::At(T0 + 10 + HOUR)));
        assert_eq!(s.billing_step, 1);
        s.record_success("m1", T0 + 11, T0 + 30);
        assert_eq!((s.disabled.clone(), s.billing_step), (None, 0));
    }

    #[test]
    fn a_profile_wide_failure_that_lands_after_a_later_sent_success_opens_nothing() {
        // The success was sent after the 401 arrived: landing first, it still ends what the 401
        // would open, as it would have in time order.
        let mut s = UsageStats::default();
        s.record_success("m1", T0 + 10, T0 + 500);
        assert_eq!(s.record_failure(&fail(Reason::Auth, T0 + 5), T0 + 5, &p()), None);
        // One sent before the 401 arrived ends nothing it opened, whichever lands first.
        let mut s = UsageStats::default();
        s.record_success("m1", T0, T0 + 500);
        assert_eq!(s.record_failure(&fail(Reason::Auth, T0 + 5), T0 + 5, &p()), Some(Until::At(T0 + 5 + MIN)));
    }

    #[test]
    fn a_success_that_lands_after_a_later_failure_ends_nothing() {
        let mut s = UsageStats::default();
        s.record_failure(&fail(Reason::RateLimit, T0 + 10), T0 + 10, &p());
        s.record_success("m1", T0 + 5, T0 + 5);
        assert_eq!(s.blocked_until("m1", T0 + 11), Some(Until::At(T0 + 10 + MIN)));
        assert_eq!((s.error_count, s.last_success_at, s.success_count), (1, Some(T0 + 5), 1));
        // A profile-wide failure from before a success lands late: the account served since.
        let mut s = UsageStats::default();
        s.record_success("m1", T0 + 10, T0 + 10);
        assert_eq!(s.record_failure(&fail(Reason::Auth, T0 + 5), T0 + 5, &p()), None);
        assert_eq!(s.failure_total, 1);
    }

    #[test]
    fn times_take_the_later_value_whatever_order_they_land_in() {
        let mut s = UsageStats::default();
        s.apply(&Change::Used(T0 + 10), &p());
        s.apply(&Change::Used(T0 + 5), &p());
        s.apply(&Change::Counted(Reason::ServerError, T0 + 8), &p());
        s.apply(&Change::Counted(Reason::ServerError, T0 + 3), &p());
        assert_eq!((s.last_used, s.last_failure_at, s.failure_total), (Some(T0 + 10), Some(T0 + 8), 2));
    }

    #[test]
    fn every_failure_is_counted_and_request_faults_open_no_window() {
        for r in [Reason::Format, Reason::ContextOverflow, Reason::Unknown, Reason::ModelNotFound] {
            let mut s = UsageStats::default();
            assert_eq!(s.record_failure(&fail(r, T0), T0, &p()), None, "{r}");
            assert_eq!((s.cooldowns.len(), s.disabled.clone(), s.window_opened_at), (0, None, None), "{r}");
            assert_eq!((s.error_count, s.failure_total, s.failure_counts[&r]), (1, 1, 1), "{r}");
            assert_eq!(s.blocked_until("m1", T0), None, "{r}");
        }
    }

    #[test]
    fn a_client_that_left_and_a_skipped_candidate_are_not_failures_of_the_profile() {
        for r in [Reason::Cancelled, Reason::NoProfile, Reason::WireFormat] {
            let mut s = UsageStats::default();
            assert_eq!(s.record_failure(&fail(r, T0), T0, &p()), None);
            assert_eq!(s, UsageStats::default(), "{r}");
        }
    }

    #[test]
    fn request_faults_never_raise_the_ladder_step() {
        // A client sending malformed requests cannot make the next real 429 cool longer.
        let mut s = UsageStats::default();
        for i in 0..10 {
            s.record_failure(&fail(Reason::Format, T0 + i), T0 + i, &p());
        }
        let t = T0 + 100;
        assert_eq!(s.record_failure(&fail(Reason::RateLimit, t), t, &p()), Some(Until::At(t + MIN)));
        assert_eq!(s.error_count, 11);
    }

    #[test]
    fn burst_of_in_flight_failures_escalates_the_window_once() {
        let mut s = UsageStats::default();
        // Five requests started at T0 on the same profile; all come back 429 a little later.
        let mut ends = vec![];
        for i in 0..5 {
            let now = T0 + 100 + i;
            ends.push(s.record_failure(&fail(Reason::RateLimit, T0), now, &p()).unwrap());
        }
        // One window at the first step, lasting as long as the last failure alone would make it.
        let want: Vec<_> = (0..5).map(|i| Until::At(T0 + 100 + i + MIN)).collect();
        assert_eq!(ends, want);
        assert_eq!(s.cooldowns.iter().map(|c| (c.step, c.opened_at)).collect::<Vec<_>>(), [(1, T0 + 100)]);
        assert_eq!(s.error_count, 5);
        assert_eq!(s.failure_total, 5);
        assert_eq!(s.failure_counts[&Reason::RateLimit], 5);
    }

    #[test]
    fn burst_guard_does_not_hide_a_permanent_auth_failure() {
        let mut s = UsageStats::default();
        s.record_failure(&fail(Reason::RateLimit, T0), T0 + 10, &p());
        s.record_failure(&fail(Reason::AuthPermanent, T0), T0 + 20, &p());
        assert_eq!(s.blocked_until("m1", T0 + 100 * MIN), Some(Until::Cleared));
    }

    #[test]
    fn a_failure_never_shortens_an_active_window() {
        let mut s = UsageStats::default();
        s.record_failure(&fail_hint(Reason::RateLimit, T0, 50 * MIN), T0, &p());
        let t = T0 + 1000;
        s.record_failure(&fail_hint(Reason::RateLimit, t, 2_000), t, &p());
        assert_eq!(s.cooldowns[0].until, T0 + 50 * MIN);
        // Nor does a disabled lane with no expiry get an expiry from a billing failure.
        let mut s = UsageStats::default();
        s.record_failure(&fail(Reason::AuthPermanent, T0), T0, &p());
        s.record_failure(&fail(Reason::Billing, t), t, &p());
        assert_eq!(s.disabled.as_ref().unwrap().until, None);
    }

    #[test]
    fn a_success_clears_the_disabled_lane_the_counters_and_the_windows_of_its_model() {
        let mut s = UsageStats::default();
        s.record_failure(&fail(Reason::Billing, T0), T0, &p());
        s.record_failure(&fail(Reason::RateLimit, T0 + 1), T0 + 1, &p());
        s.record_success("m1", T0 + 2, T0 + 2);
        assert_eq!((s.cooldowns.len(), s.disabled.clone(), s.error_count), (0, None, 0));
        assert!(s.failure_counts.is_empty());
        assert_eq!((s.success_count, s.failure_total, s.last_success_at), (1, 2, Some(T0 + 2)));
    }

    #[test]
    fn counters_reset_when_both_lanes_have_expired() {
        let mut s = UsageStats::default();
        s.record_failure(&fail(Reason::RateLimit, T0), T0, &p());
        let t = T0 + 2 * MIN; // the 1-minute window is over
        let end = s.record_failure(&fail(Reason::RateLimit, t), t, &p());
        assert_eq!(end, Some(Until::At(t + MIN)), "back to the first step");
        assert_eq!(s.error_count, 1);
        assert_eq!(s.failure_total, 2, "lifetime counter is never reset");
    }

    #[test]
    fn counters_reset_after_a_quiet_failure_window() {
        // A failure that set no window (none active) long ago: the next one starts afresh.
        let mut s = UsageStats { error_count: 3, last_failure_at: Some(T0), ..Default::default() };
        s.failure_counts.insert(Reason::Timeout, 3);
        let t = T0 + 11 * MIN;
        s.record_failure(&fail(Reason::RateLimit, t), t, &p());
        assert_eq!(s.error_count, 1);
        assert_eq!(s.failure_counts.get(&Reason::Timeout), None);
    }

    #[test]
    fn counters_survive_inside_the_failure_window() {
        let mut s = UsageStats { error_count: 2, last_failure_at: Some(T0), ..Default::default() };
        let t = T0 + 9 * MIN;
        let end = s.record_failure(&fail(Reason::RateLimit, t), t, &p());
        assert_eq!(s.error_count, 3);
        assert_eq!(end, Some(Until::At(t + MIN)), "failures that opened no window do not climb the ladder");
    }

    #[test]
    fn failure_counts_are_kept_per_reason() {
        let mut s = UsageStats::default();
        s.record_failure(&fail(Reason::Timeout, T0), T0, &p());
        s.record_failure(&fail(Reason::RateLimit, T0 + 1), T0 + 1, &p());
        s.record_failure(&fail(Reason::RateLimit, T0 + 2), T0 + 2, &p());
        assert_eq!(s.failure_counts, BTreeMap::from([(Reason::RateLimit, 2), (Reason::Timeout, 1)]));
    }

    #[test]
    fn mark_used_sets_last_used() {
        let mut s = UsageStats::default();
        s.mark_used(T0);
        assert_eq!(s.last_used, Some(T0));
    }

    #[test]
    fn model_not_found_cools_the_model_on_the_ladder() {
        let a = ModelCooldown::after_failure(None, T0, T0, &p());
        assert_eq!(a, ModelCooldown { until: T0 + MIN, error_count: 1, last_failure_at: T0 });
        let b = ModelCooldown::after_failure(Some(&a), T0 + 1000, T0 + 500, &p());
        assert_eq!((b.until, b.error_count), (T0 + 1000 + 5 * MIN, 2));
        let c = ModelCooldown::after_failure(Some(&b), T0 + 60 * MIN, T0 + 60 * MIN, &p());
        assert_eq!((c.until, c.error_count), (T0 + 61 * MIN, 1));
    }
}
