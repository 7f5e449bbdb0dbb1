//! A profile's state as people read it (`doctor`, `profiles list`, later the API and web page).

use crate::engine::quota::Floor;
use crate::engine::{Millis, ProfileView, Reason, Until, Unusable, UsageStats};
use serde::Serialize;

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Status {
    Usable,
    /// `until`, `reason`, `model`: the window that ends last (`model` absent: every model);
    /// `windows`: every active cooldown window of the profile, that one first.
    Cooling {
        until: Millis,
        reason: Reason,
        model: Option<String>,
        windows: Vec<Window>,
    },
    Disabled {
        until: Option<Millis>,
        reason: Reason,
    },
    Unusable {
        why: String,
    },
}

/// One cooldown window as people read it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Window {
    pub until: Millis,
    pub reason: Reason,
    pub model: Option<String>,
}

impl Status {
    /// The profile's state at `now`, across all models (model-scoped windows are shown as such).
    pub fn of(view: &ProfileView, now: Millis) -> Status {
        Status::scoped(view, None, now)
    }

    /// The state for one model: a window scoped to another model leaves it usable.
    pub fn for_model(view: &ProfileView, model: &str, now: Millis) -> Status {
        Status::scoped(view, Some(model), now)
    }

    fn scoped(view: &ProfileView, model: Option<&str>, now: Millis) -> Status {
        if let Some(why) = view.unusable(now) {
            return Status::Unusable { why: why_text(why).to_string() };
        }
        let s = &view.stats;
        if let Some(d) = s.active_disabled(now) {
            return Status::Disabled { until: d.until, reason: d.reason };
        }
        let active = s.active_cooldowns(now);
        let Some(head) = active.iter().find(|c| model.is_none_or(|m| c.applies_to(m))) else {
            return Status::Usable;
        };
        let windows =
            active.iter().map(|c| Window { until: c.until, reason: c.reason, model: c.model.clone() }).collect();
        Status::Cooling { until: head.until, reason: head.reason, model: head.model.clone(), windows }
    }

    pub fn display(&self, now: Millis) -> String {
        match self {
            Status::Usable => "usable".into(),
            Status::Cooling { until, reason, model, windows } => {
                let scope = model.as_ref().map(|m| format!(" for {m}")).unwrap_or_default();
                let mut text = format!("cooling{scope} until {} ({reason}, {} left)", time(*until), left(*until - now));
                for w in windows.iter().filter(|w| w.model != *model) {
                    let scope = w.model.as_deref().unwrap_or("every model");
                    text += &format!("; {scope} until {} ({}, {} left)", time(w.until), w.reason, left(w.until - now));
                }
                text
            }
            Status::Disabled { until: Some(u), reason } => {
                format!("disabled until {} because {reason} ({} left)", time(*u), left(*u - now))
            }
            Status::Disabled { until: None, reason } => {
                format!("disabled because {reason} until cleared (`rota profiles clear`)")
            }
            Status::Unusable { why } => format!("unusable: {why}"),
        }
    }
}

/// What the provider last reported of a profile's remaining quota for one model (rotate before
/// the 429, docs/rotation.md), as the API, `doctor` and the console show it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct QuotaInfo {
    /// The provider's model id.
    pub model: String,
    pub remaining_requests: Option<i64>,
    pub limit_requests: Option<i64>,
    /// When the requests window resets (Unix ms).
    pub requests_reset_at: Option<Millis>,
    /// The token limit with the least left.
    pub remaining_tokens: Option<i64>,
    pub limit_tokens: Option<i64>,
    pub tokens_reset_at: Option<Millis>,
    /// The share of a ChatGPT plan's window left, in percent (Codex), the window with the least.
    pub plan_left_percent: Option<i64>,
    pub plan_reset_at: Option<Millis>,
    /// When the answer that reported it arrived (Unix ms).
    pub seen_at: Millis,
    /// Until when the profile is at its floor (`rotation.quota_floor`, `quota_tokens_floor`)
    /// for this model and goes after the profiles with quota; `null` when it has quota.
    pub low_until: Option<Millis>,
}

impl QuotaInfo {
    /// Every model's report of the profile, the most recent first.
    pub fn of(stats: &UsageStats, floor: Floor, now: Millis) -> Vec<QuotaInfo> {
        let mut out: Vec<QuotaInfo> = stats
            .quotas
            .iter()
            .map(|q| QuotaInfo {
                model: q.model.clone(),
                remaining_requests: q.requests.map(|w| w.remaining),
                limit_requests: q.requests.and_then(|w| w.limit),
                requests_reset_at: q.requests.and_then(|w| w.reset_at),
                remaining_tokens: q.tokens.map(|w| w.remaining),
                limit_tokens: q.tokens.and_then(|w| w.limit),
                tokens_reset_at: q.tokens.and_then(|w| w.reset_at),
                plan_left_percent: q.plan.map(|w| w.remaining),
                plan_reset_at: q.plan.and_then(|w| w.reset_at),
                seen_at: q.seen_at,
                low_until: q.low_until(floor, now),
            })
            .collect();
        out.sort_by(|a, b| b.seen_at.cmp(&a.seen_at).then_with(|| a.model.cmp(&b.model)));
        out
    }

    /// `gpt-4.1: 0 of 3 requests left (resets in 42s), 90000 tokens left; after the others until 12:00:00Z`.
    pub fn display(&self, now: Millis) -> String {
        let part = |what: &str, remaining: Option<i64>, limit: Option<i64>, reset: Option<Millis>| {
            let remaining = remaining?;
            let of = limit.map(|l| format!(" of {l}")).unwrap_or_default();
            let reset =
                reset.filter(|r| *r > now).map(|r| format!(" (resets in {})", left(r - now))).unwrap_or_default();
            Some(format!("{remaining}{of} {what} left{reset}"))
        };
        let parts: Vec<String> = [
            part("requests", self.remaining_requests, self.limit_requests, self.requests_reset_at),
            part("tokens", self.remaining_tokens, self.limit_tokens, self.tokens_reset_at),
            part("% of the plan", self.plan_left_percent, None, self.plan_reset_at),
        ]
        .into_iter()
        .flatten()
        .collect();
        let mut text = format!("{}: {}, seen {} ago", self.model, parts.join(", "), left(now - self.seen_at));
        if let Some(until) = self.low_until {
            text += &format!("; at its floor: after the profiles with quota until {}", time(until));
        }
        text
    }
}

fn why_text(u: Unusable) -> &'static str {
    match u {
        Unusable::DisabledByAdmin => "disabled by an admin (`rota profiles enable` turns it back on)",
        Unusable::NoSecret => "no usable secret",
        Unusable::TokenExpired => "token expired",
    }
}

/// RFC 3339 in UTC, to the second.
pub fn time(ms: Millis) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.format("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_else(|| ms.to_string())
}

/// `1h 4m`, `4m 12s`, `9s`.
pub fn left(ms: Millis) -> String {
    let s = (ms.max(0) + 999) / 1000;
    match (s / 3600, (s % 3600) / 60, s % 60) {
        (0, 0, sec) => format!("{sec}s"),
        (0, m, sec) => format!("{m}m {sec}s"),
        (h, m, _) => format!("{h}h {m}m"),
    }
}

/// `Until` as a stored value: `None` for "until cleared" (`Until::at`).
pub fn until_ms(u: Until) -> Option<Millis> {
    u.at()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{Cooldown, Disabled, ProfileType, UsageStats};

    fn view(stats: UsageStats) -> ProfileView {
        ProfileView {
            id: "openai:a".parse().unwrap(),
            kind: ProfileType::ApiKey,
            enabled: true,
            has_secret: true,
            expires_at: None,
            stats,
        }
    }

    #[test]
    fn states_read_plainly() {
        let now = 1_700_000_000_000;
        let window = |model: &str, left: Millis, reason| Cooldown {
            until: now + left,
            reason,
            model: Some(model.into()),
            step: 1,
            opened_at: now,
        };
        let mut cooling =
            view(UsageStats { cooldowns: vec![window("gpt-4.1", 252_000, Reason::RateLimit)], ..Default::default() });
        assert_eq!(
            Status::of(&cooling, now).display(now),
            "cooling for gpt-4.1 until 2023-11-14T22:17:32Z (rate_limit, 4m 12s left)"
        );
        assert_eq!(Status::for_model(&cooling, "gpt-4.1-mini", now), Status::Usable);
        cooling.stats.cooldowns.push(window("o3", 60_000, Reason::Overloaded));
        assert_eq!(
            Status::of(&cooling, now).display(now),
            "cooling for gpt-4.1 until 2023-11-14T22:17:32Z (rate_limit, 4m 12s left); \
             o3 until 2023-11-14T22:14:20Z (overloaded, 1m 0s left)"
        );
        let Status::Cooling { model, windows, .. } = Status::for_model(&cooling, "o3", now) else { panic!() };
        assert_eq!((model.as_deref(), windows.len()), (Some("o3"), 2));
        let gone = view(UsageStats {
            disabled: Some(Disabled { until: None, reason: Reason::AuthPermanent }),
            ..Default::default()
        });
        assert_eq!(
            Status::of(&gone, now).display(now),
            "disabled because auth_permanent until cleared (`rota profiles clear`)"
        );
        let mut off = view(UsageStats::default());
        off.enabled = false;
        assert!(Status::of(&off, now).display(now).starts_with("unusable: disabled by an admin"));
    }

    #[test]
    fn quota_reads_plainly_and_tells_when_the_profile_goes_last() {
        use crate::engine::quota::{Quota, Window};
        let now = 1_700_000_000_000;
        let stats = UsageStats {
            quotas: vec![Quota {
                model: "gpt-4.1".into(),
                requests: Some(Window { remaining: 0, limit: Some(3), reset_at: Some(now + 42_000) }),
                tokens: Some(Window { remaining: 90_000, limit: None, reset_at: None }),
                plan: None,
                seen_at: now - 2_000,
            }],
            ..Default::default()
        };
        let info = QuotaInfo::of(&stats, Floor::default(), now);
        assert_eq!(info[0].low_until, Some(now + 42_000));
        assert_eq!(
            info[0].display(now),
            "gpt-4.1: 0 of 3 requests left (resets in 42s), 90000 tokens left, seen 2s ago; \
             at its floor: after the profiles with quota until 2023-11-14T22:14:02Z"
        );
        assert_eq!(QuotaInfo::of(&stats, Floor::default(), now + 42_000)[0].low_until, None, "reset");
    }

    #[test]
    fn durations_left_are_short() {
        assert_eq!(left(9_000), "9s");
        assert_eq!(left(252_000), "4m 12s");
        assert_eq!(left(3_840_000), "1h 4m");
    }
}
