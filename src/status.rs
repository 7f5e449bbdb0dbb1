//! A profile's state as people read it (`doctor`, `profiles list`, later the API and web page).

use crate::engine::{Millis, ProfileView, Reason, Until, Unusable};
use serde::Serialize;

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Status {
    Usable,
    Cooling { until: Millis, reason: Reason, model: Option<String> },
    Disabled { until: Option<Millis>, reason: Reason },
    Unusable { why: String },
}

impl Status {
    /// The profile's state at `now`, across all models (a model-scoped cooldown is shown as such).
    pub fn of(view: &ProfileView, now: Millis) -> Status {
        if let Some(why) = view.unusable(now) {
            return Status::Unusable { why: why_text(why).to_string() };
        }
        let s = &view.stats;
        if let Some(d) = s.disabled.as_ref().filter(|d| d.until.is_none_or(|u| now < u)) {
            return Status::Disabled { until: d.until, reason: d.reason };
        }
        if let Some(c) = s.cooldown.as_ref().filter(|c| now < c.until) {
            return Status::Cooling { until: c.until, reason: c.reason, model: c.model.clone() };
        }
        Status::Usable
    }

    /// The state for one model: a cooldown scoped to another model leaves it usable.
    pub fn for_model(view: &ProfileView, model: &str, now: Millis) -> Status {
        match Status::of(view, now) {
            Status::Cooling { model: Some(m), .. } if m != model => Status::Usable,
            other => other,
        }
    }

    pub fn display(&self, now: Millis) -> String {
        match self {
            Status::Usable => "usable".into(),
            Status::Cooling { until, reason, model } => {
                let scope = model.as_ref().map(|m| format!(" for {m}")).unwrap_or_default();
                format!("cooling{scope} until {} ({reason}, {} left)", time(*until), left(*until - now))
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

/// `Until` as a stored value: `None` for "until cleared".
pub fn until_ms(u: Until) -> Option<Millis> {
    match u {
        Until::At(t) => Some(t),
        Until::Cleared => None,
    }
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
        let cooling = view(UsageStats {
            cooldown: Some(Cooldown { until: now + 252_000, reason: Reason::RateLimit, model: Some("gpt-4.1".into()) }),
            ..Default::default()
        });
        assert_eq!(
            Status::of(&cooling, now).display(now),
            "cooling for gpt-4.1 until 2023-11-14T22:17:32Z (rate_limit, 4m 12s left)"
        );
        assert_eq!(Status::for_model(&cooling, "gpt-4.1-mini", now), Status::Usable);
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
    fn durations_left_are_short() {
        assert_eq!(left(9_000), "9s");
        assert_eq!(left(252_000), "4m 12s");
        assert_eq!(left(3_840_000), "1h 4m");
    }
}
