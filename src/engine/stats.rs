//! Per-profile usageStats and their transitions (SPEC §3): the cooldown ladder, reset hints,
//! the disabled lane, per-model scope, the burst guard and the three counter resets.
//!
//! Everything here is a pure function of the current stats, the failure and `now`.

use super::{Mark, Millis, Reason};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;

/// Durations of the two lanes. Defaults are SPEC §3's; every one is configurable.
#[derive(Clone, Debug, PartialEq)]
pub struct CooldownPolicy {
    pub base: Duration,
    pub factor: u32,
    pub max: Duration,
    pub failure_window: Duration,
    /// Longest provider hint honoured; longer hints are clamped to it.
    pub hint_max: Duration,
    pub billing_base: Duration,
    pub billing_max: Duration,
}

impl Default for CooldownPolicy {
    fn default() -> Self {
        CooldownPolicy {
            base: Duration::from_secs(60),
            factor: 5,
            max: Duration::from_secs(3600),
            failure_window: Duration::from_secs(600),
            hint_max: Duration::from_secs(6 * 3600),
            billing_base: Duration::from_secs(3600),
            billing_max: Duration::from_secs(24 * 3600),
        }
    }
}

fn ms(d: Duration) -> Millis {
    d.as_millis().min(Millis::MAX as u128) as Millis
}

impl CooldownPolicy {
    /// `min(max, base * factor^min(n - 1, 3))`: 1 min, 5 min, 25 min, 1 h, 1 h, …
    pub fn ladder(&self, error_count: u32) -> Millis {
        let step = error_count.saturating_sub(1).min(3);
        let d = ms(self.base).saturating_mul((self.factor as Millis).saturating_pow(step));
        d.min(ms(self.max))
    }

    /// Billing: `base * 2^(n - 1)` capped at `billing_max` (1 h, 2 h, 4 h, … 24 h).
    pub fn billing(&self, billing_count: u32) -> Millis {
        let step = billing_count.saturating_sub(1).min(30);
        ms(self.billing_base).saturating_mul(1 << step).min(ms(self.billing_max))
    }

    fn clamp_hint(&self, wait: Millis) -> Millis {
        wait.clamp(1000, ms(self.hint_max).max(1000))
    }
}

/// The cooldown lane: a short wait, optionally for one model only.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cooldown {
    pub until: Millis,
    pub reason: Reason,
    /// `None`: every model of the profile.
    pub model: Option<String>,
}

/// The disabled lane: billing (with expiry) or a permanent auth failure (until cleared).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Disabled {
    /// `None`: until an admin clears it or the account logs in again.
    pub until: Option<Millis>,
    pub reason: Reason,
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
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageStats {
    pub last_used: Option<Millis>,
    pub last_success_at: Option<Millis>,
    pub cooldown: Option<Cooldown>,
    pub disabled: Option<Disabled>,
    pub error_count: u32,
    pub failure_counts: BTreeMap<Reason, u32>,
    pub last_failure_at: Option<Millis>,
    /// When the active window was opened or last escalated (burst guard).
    pub window_opened_at: Option<Millis>,
    pub success_count: u64,
    pub failure_total: u64,
    /// The billing lane's doubling step: billing windows opened since the last success. It
    /// survives the expiry of the windows (unlike the counters) and resets on a success or an
    /// admin clear.
    pub billing_step: u32,
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
    /// (SPEC §3 "Evidence").
    pub claim: bool,
}

impl UsageStats {
    fn cooldown_active(&self, now: Millis) -> bool {
        self.cooldown.as_ref().is_some_and(|c| now < c.until)
    }

    fn disabled_active(&self, now: Millis) -> bool {
        self.disabled.as_ref().is_some_and(|d| d.until.is_none_or(|u| now < u))
    }

    /// Until when this profile may not serve `model`; `None` when it is usable.
    pub fn blocked_until(&self, model: &str, now: Millis) -> Option<Until> {
        let disabled = self
            .disabled
            .as_ref()
            .filter(|_| self.disabled_active(now))
            .map(|d| d.until.map_or(Until::Cleared, Until::At));
        let cooled = self
            .cooldown
            .as_ref()
            .filter(|c| now < c.until && c.model.as_deref().is_none_or(|m| m == model))
            .map(|c| Until::At(c.until));
        disabled.max(cooled)
    }

    /// The reason of the window that blocks `model`, the disabled lane first.
    pub fn blocked_reason(&self, model: &str, now: Millis) -> Option<Reason> {
        if self.disabled_active(now) {
            return self.disabled.as_ref().map(|d| d.reason);
        }
        self.cooldown
            .as_ref()
            .filter(|c| now < c.until && c.model.as_deref().is_none_or(|m| m == model))
            .map(|c| c.reason)
    }

    /// The profile was chosen for an attempt (set at selection, so concurrent requests spread).
    pub fn mark_used(&mut self, now: Millis) {
        self.last_used = Some(now);
    }

    /// A success clears all error state at once.
    pub fn record_success(&mut self, now: Millis) {
        self.clear_errors();
        self.last_success_at = Some(now);
        self.success_count += 1;
    }

    /// An admin cleared the profile (or it served): both lanes, the counters since the last
    /// reset and the billing step.
    pub fn clear_errors(&mut self) {
        self.reset_windows();
        self.billing_step = 0;
    }

    fn reset_windows(&mut self) {
        self.cooldown = None;
        self.disabled = None;
        self.error_count = 0;
        self.failure_counts.clear();
        self.window_opened_at = None;
    }

    /// Expiry reset: when both lanes have expired, the windows and the counters go; the billing
    /// step stays (SPEC §3). Whether anything was reset.
    pub fn expire(&mut self, now: Millis) -> bool {
        let had_window = self.cooldown.is_some() || self.disabled.is_some();
        let ended = had_window && !self.cooldown_active(now) && !self.disabled_active(now);
        if ended {
            self.reset_windows();
        }
        ended
    }

    /// Records a failure and returns the end of the window this profile is now in, if the
    /// reason cools the profile at all. Windows only ever grow here.
    pub fn record_failure(&mut self, f: &Failure, now: Millis, policy: &CooldownPolicy) -> Option<Until> {
        let mark = f.reason.mark();
        if !matches!(mark, Mark::CooldownModel | Mark::CooldownProfile | Mark::Disabled) {
            return None;
        }
        self.expire(now);
        let quiet = self.last_failure_at.is_some_and(|t| now - t > ms(policy.failure_window));
        if quiet && !self.cooldown_active(now) && !self.disabled_active(now) {
            self.error_count = 0;
            self.failure_counts.clear();
        }
        self.error_count += 1;
        *self.failure_counts.entry(f.reason).or_default() += 1;
        self.failure_total += 1;
        self.last_failure_at = Some(now);

        let in_flight = self.window_opened_at.is_some_and(|opened| f.started_at < opened);
        if f.reason == Reason::AuthPermanent && !f.claim {
            self.disabled = Some(Disabled { until: None, reason: f.reason });
            self.window_opened_at = Some(now);
            return Some(Until::Cleared);
        }
        let hint = f.hint_ms.map(|h| policy.clamp_hint(h)).map(|h| if f.claim { h.min(ms(policy.max)) } else { h });
        let to_disabled = !f.claim && (f.reason == Reason::Billing || hint.is_some_and(|h| h > ms(policy.max)));
        if to_disabled {
            if in_flight && self.disabled_active(now) {
                return self.current_end(now);
            }
            if f.reason == Reason::Billing {
                self.billing_step += 1;
            }
            let wait = hint.unwrap_or_else(|| policy.billing(self.billing_step));
            self.extend_disabled(now + wait, f.reason);
        } else {
            if in_flight && self.cooldown_active(now) {
                return self.current_end(now);
            }
            let wait = hint.unwrap_or_else(|| policy.ladder(self.error_count));
            let model = (mark == Mark::CooldownModel && !f.account_wide).then(|| f.model.clone());
            self.extend_cooldown(now, now + wait, f.reason, model);
        }
        self.window_opened_at = Some(now);
        self.current_end(now)
    }

    fn extend_disabled(&mut self, until: Millis, reason: Reason) {
        match &mut self.disabled {
            Some(d) if d.until.is_none() => {}
            Some(d) if d.until.is_some_and(|u| u >= until) => {}
            _ => self.disabled = Some(Disabled { until: Some(until), reason }),
        }
    }

    fn extend_cooldown(&mut self, now: Millis, until: Millis, reason: Reason, model: Option<String>) {
        match &mut self.cooldown {
            Some(c) if now < c.until => {
                // Two models cooling at once on one profile: the lane widens to every model
                // rather than forgetting one of them.
                if c.model != model {
                    c.model = None;
                }
                if until > c.until {
                    c.until = until;
                    c.reason = reason;
                }
            }
            _ => self.cooldown = Some(Cooldown { until, reason, model }),
        }
    }

    /// The later end of the active windows (either lane).
    fn current_end(&self, now: Millis) -> Option<Until> {
        let d = self
            .disabled
            .as_ref()
            .filter(|_| self.disabled_active(now))
            .map(|d| d.until.map_or(Until::Cleared, Until::At));
        let c = self.cooldown.as_ref().filter(|c| now < c.until).map(|c| Until::At(c.until));
        d.max(c)
    }
}

/// A model cooled on a provider for every profile (model_not_found).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelCooldown {
    pub until: Millis,
    pub error_count: u32,
    pub last_failure_at: Millis,
}

impl ModelCooldown {
    /// The next state after one more model_not_found, on the same ladder and resets as profiles.
    /// `started_at`: when the failed call started; calls already in flight when the window was
    /// last escalated are a burst and do not escalate it again (the burst guard).
    pub fn after_failure(
        prev: Option<&ModelCooldown>,
        now: Millis,
        started_at: Millis,
        policy: &CooldownPolicy,
    ) -> ModelCooldown {
        if let Some(p) = prev.filter(|p| now < p.until && started_at < p.last_failure_at) {
            return p.clone();
        }
        let count = match prev {
            Some(p) if now < p.until => p.error_count + 1,
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
    fn ladder_is_1_5_25_60_60_minutes() {
        let got: Vec<_> = (1..=6).map(|n| p().ladder(n) / MIN).collect();
        assert_eq!(got, [1, 5, 25, 60, 60, 60]);
    }

    #[test]
    fn ladder_follows_configured_base_factor_and_max() {
        let pol = CooldownPolicy { base: Duration::from_secs(10), factor: 2, max: Duration::from_secs(60), ..p() };
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
        assert_eq!(s.cooldown, Some(Cooldown { until: T0 + MIN, reason: Reason::RateLimit, model: Some("m1".into()) }));
        assert_eq!(s.blocked_until("m1", T0 + 1), Some(Until::At(T0 + MIN)));
        assert_eq!(s.blocked_until("m2", T0 + 1), None);
    }

    #[test]
    fn overloaded_and_timeout_are_model_scoped_too() {
        for r in [Reason::Overloaded, Reason::Timeout] {
            let mut s = UsageStats::default();
            s.record_failure(&fail(r, T0), T0, &p());
            assert_eq!(s.cooldown.as_ref().unwrap().model.as_deref(), Some("m1"), "{r}");
        }
    }

    #[test]
    fn account_wide_throttle_covers_every_model() {
        let mut s = UsageStats::default();
        s.record_failure(&Failure { account_wide: true, ..fail(Reason::RateLimit, T0) }, T0, &p());
        assert_eq!(s.cooldown.as_ref().unwrap().model, None);
        assert_eq!(s.blocked_until("m2", T0 + 1), Some(Until::At(T0 + MIN)));
    }

    #[test]
    fn auth_cooldown_covers_the_whole_profile() {
        let mut s = UsageStats::default();
        s.record_failure(&fail(Reason::Auth, T0), T0, &p());
        assert_eq!(s.cooldown, Some(Cooldown { until: T0 + MIN, reason: Reason::Auth, model: None }));
    }

    #[test]
    fn second_model_cooling_widens_the_lane_to_all_models() {
        let mut s = UsageStats::default();
        s.record_failure(&fail(Reason::RateLimit, T0), T0, &p());
        let t = T0 + 1000;
        s.record_failure(&Failure { model: "m2".into(), ..fail(Reason::RateLimit, t) }, t, &p());
        let c = s.cooldown.clone().unwrap();
        assert_eq!((c.model, c.until), (None, t + 5 * MIN));
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
        s.record_success(t);
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
        assert!(!s.expire(T0 + MIN - 1), "still cooling");
        assert_eq!(s.error_count, 1);
        assert!(s.expire(T0 + MIN));
        assert_eq!((s.cooldown.clone(), s.error_count, s.failure_counts.len()), (None, 0, 0));
        assert_eq!((s.failure_total, s.last_failure_at), (1, Some(T0)), "lifetime counters stay");
        assert!(!s.expire(T0 + 2 * MIN), "nothing left to reset");
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
        assert_eq!(s.cooldown, None);
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
        s.clear_errors();
        assert_eq!(s.blocked_until("m1", T0), None);
    }

    #[test]
    fn request_faults_leave_the_profile_untouched() {
        for r in [Reason::Format, Reason::ContextOverflow, Reason::Cancelled, Reason::Unknown, Reason::ModelNotFound] {
            let mut s = UsageStats::default();
            assert_eq!(s.record_failure(&fail(r, T0), T0, &p()), None);
            assert_eq!(s, UsageStats::default(), "{r}");
        }
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
        assert!(ends.iter().all(|e| *e == Until::At(T0 + 100 + MIN)), "{ends:?}");
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
        assert_eq!(s.cooldown.as_ref().unwrap().until, T0 + 50 * MIN);
        // Nor does a disabled lane with no expiry get an expiry from a billing failure.
        let mut s = UsageStats::default();
        s.record_failure(&fail(Reason::AuthPermanent, T0), T0, &p());
        s.record_failure(&fail(Reason::Billing, t), t, &p());
        assert_eq!(s.disabled.as_ref().unwrap().until, None);
    }

    #[test]
    fn success_clears_all_error_state() {
        let mut s = UsageStats::default();
        s.record_failure(&fail(Reason::Billing, T0), T0, &p());
        s.record_failure(&fail(Reason::RateLimit, T0 + 1), T0 + 1, &p());
        s.record_success(T0 + 2);
        assert_eq!((s.cooldown.clone(), s.disabled.clone(), s.error_count), (None, None, 0));
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
        assert_eq!(end, Some(Until::At(t + 25 * MIN)));
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
