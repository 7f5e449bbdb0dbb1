//! Rotate before the 429: what a provider's answers say of a profile's remaining quota, and
//! whether that puts the profile after the ones that still have some (docs/rotation.md, docs/rotation.md).
//!
//! OpenAI (and OpenAI-compatible providers) send `x-ratelimit-{limit,remaining,reset}-{requests,tokens}`
//! on every answer; Anthropic sends `anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-{limit,remaining,reset}`.
//! Both describe a limit of one model, so quota is kept per profile and model. A profile whose
//! known remaining requests (or tokens) are at the floor is *low* until the window resets: it is
//! still usable, but ordered after every profile with quota, without a failure, a cooldown, or
//! any change to its counters. Unknown quota counts as available.

use super::Millis;
use serde::{Deserialize, Serialize};

/// How long a profile at its floor stays low when the provider gave no reset time.
pub const UNKNOWN_RESET: Millis = 60_000;

/// One limit's state as the provider last reported it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Window {
    pub remaining: i64,
    pub limit: Option<i64>,
    /// When the provider said the window resets (absolute), if it did.
    pub reset_at: Option<Millis>,
}

impl Window {
    /// Until when this window is at or below `floor`: its reset (or `UNKNOWN_RESET` after it
    /// was seen), if that is still ahead of `now`.
    fn low_until(&self, floor: i64, seen_at: Millis, now: Millis) -> Option<Millis> {
        if self.remaining > floor {
            return None;
        }
        let until = self.reset_at.unwrap_or(seen_at + UNKNOWN_RESET);
        (now < until).then_some(until)
    }
}

/// A family of headers that report a profile's remaining quota (a provider's `quota`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Family {
    /// `x-ratelimit-{limit,remaining,reset}-{requests,tokens}`.
    Openai,
    /// `anthropic-ratelimit-*`.
    Anthropic,
    /// `x-codex-{primary,secondary}-*`: the share of a ChatGPT plan's windows used.
    Codex,
}

impl Family {
    pub fn as_str(self) -> &'static str {
        match self {
            Family::Openai => "openai",
            Family::Anthropic => "anthropic",
            Family::Codex => "codex",
        }
    }
}

/// The latest quota a provider reported for one profile and model.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Quota {
    pub model: String,
    pub requests: Option<Window>,
    /// The token limit with the least remaining (Anthropic reports input and output tokens
    /// apart).
    pub tokens: Option<Window>,
    /// The plan's window with the least left, in percent (Codex): low at 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<Window>,
    /// When the answer that reported it arrived.
    pub seen_at: Millis,
}

/// `rotation.quota_floor` and `rotation.quota_tokens_floor`: a profile whose remaining requests
/// (tokens) are at or below these is ordered after the profiles that still have quota.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct Floor {
    pub requests: i64,
    /// The estimate of the next request's size in tokens.
    pub tokens: i64,
}

impl Quota {
    /// Until when the profile is low on quota for this model: the later reset of the limits
    /// at their floor. `None`: it has quota, or its windows have reset.
    pub fn low_until(&self, floor: Floor, now: Millis) -> Option<Millis> {
        let requests = self.requests.and_then(|w| w.low_until(floor.requests, self.seen_at, now));
        let tokens = self.tokens.and_then(|w| w.low_until(floor.tokens, self.seen_at, now));
        let plan = self.plan.and_then(|w| w.low_until(0, self.seen_at, now));
        requests.max(tokens).max(plan)
    }
}

/// The most models whose quota one profile keeps: past it, the report seen longest ago goes.
pub const MODELS_MAX: usize = 32;

/// Keeps `q` as its model's report unless a newer one is already kept: a report that lands
/// after a newer one (another server's) changes nothing. At most `MODELS_MAX` models are kept,
/// the latest reports.
pub fn keep_latest(quotas: &mut Vec<Quota>, q: Quota) {
    match quotas.iter_mut().find(|p| p.model == q.model) {
        Some(p) if p.seen_at <= q.seen_at => *p = q,
        Some(_) => {}
        None => quotas.push(q),
    }
    if quotas.len() > MODELS_MAX {
        let oldest = quotas.iter().enumerate().min_by_key(|(_, q)| (q.seen_at, q.model.clone())).map(|(i, _)| i);
        quotas.swap_remove(oldest.expect("more than MODELS_MAX"));
    }
}

/// The limit a header is about, and which of its facts it gives.
enum Part {
    Limit,
    Remaining,
    Reset,
}

impl Part {
    fn of(word: &str) -> Option<Part> {
        match word {
            "limit" => Some(Part::Limit),
            "remaining" => Some(Part::Remaining),
            "reset" => Some(Part::Reset),
            _ => None,
        }
    }
}

/// Which limit a rate-limit header describes (`requests`, or a token family), and which part:
/// `x-ratelimit-{part}-{limit}`, `anthropic-ratelimit-{limit}-{part}`, of the families read.
fn classify<'a>(name: &'a str, families: &[Family]) -> Option<(&'a str, Part)> {
    if let Some(rest) = name.strip_prefix("x-ratelimit-") {
        let (part, limit) = rest.split_once('-')?;
        let read = families.contains(&Family::Openai) && matches!(limit, "requests" | "tokens");
        return read.then_some((limit, Part::of(part)?));
    }
    let (limit, part) = name.strip_prefix("anthropic-ratelimit-")?.rsplit_once('-')?;
    let read = families.contains(&Family::Anthropic)
        && matches!(limit, "requests" | "tokens" | "input-tokens" | "output-tokens");
    read.then_some((limit, Part::of(part)?))
}

/// What a Codex header says of its window (`primary` 0, `secondary` 1).
enum PlanPart {
    UsedPercent,
    ResetAt,
    ResetAfter,
}

fn classify_plan(name: &str) -> Option<(usize, PlanPart)> {
    let (window, part) = name.strip_prefix("x-codex-")?.split_once('-')?;
    let window = match window {
        "primary" => 0,
        "secondary" => 1,
        _ => return None,
    };
    let part = match part {
        "used-percent" => PlanPart::UsedPercent,
        "reset-at" => PlanPart::ResetAt,
        "reset-after-seconds" => PlanPart::ResetAfter,
        _ => return None,
    };
    Some((window, part))
}

/// A share used as providers send it: a number from 0 to 100. Anything else is no report.
fn percent_left(value: &str) -> Option<i64> {
    let used = value.parse::<f64>().ok().filter(|u| u.is_finite() && (0.0..=100.0).contains(u))?;
    Some((100.0 - used).floor() as i64)
}

/// A count of seconds as providers send it (whole, 0 or more), in milliseconds.
fn seconds(value: &str) -> Option<Millis> {
    value.parse::<u32>().ok().map(|s| Millis::from(s) * 1000)
}

#[derive(Default)]
struct Seen {
    remaining: Option<i64>,
    limit: Option<i64>,
    reset_at: Option<Millis>,
}

impl Seen {
    fn window(&self) -> Option<Window> {
        Some(Window { remaining: self.remaining?, limit: self.limit, reset_at: self.reset_at })
    }
}

/// A count as providers send it: a whole number, 0 or more. Anything else (`NaN`, `-1`, `1e3`,
/// words) is no report, so it can never make a profile look spent.
fn count(value: &str) -> Option<i64> {
    value.parse::<u64>().ok().map(|n| n.min(i64::MAX as u64) as i64)
}

/// Reads the quota an answer reports for `model`, from its headers (names in any case). Reset
/// times are clamped to `max_wait` after `now`: a header cannot order a profile last for
/// longer than a provider's reset hint may cool it (`cooldown.hint_max`). `None` when the answer
/// has no remaining count.
pub fn read<'a>(
    headers: impl IntoIterator<Item = (&'a str, &'a str)>,
    families: &[Family],
    model: &str,
    now: Millis,
    max_wait: Millis,
) -> Option<Quota> {
    // requests, tokens, input-tokens, output-tokens
    let mut seen: [Seen; 4] = Default::default();
    // Codex's primary and secondary windows.
    let mut plan: [Seen; 2] = Default::default();
    let mut any = false;
    let clamp = |wait: Millis| now + wait.clamp(0, max_wait.max(0));
    for (name, value) in headers {
        let lower;
        let name = if name.bytes().any(|b| b.is_ascii_uppercase()) {
            lower = name.to_ascii_lowercase();
            lower.as_str()
        } else {
            name
        };
        if families.contains(&Family::Codex)
            && let Some((window, part)) = classify_plan(name)
        {
            let (value, s) = (value.trim(), &mut plan[window]);
            match part {
                PlanPart::UsedPercent => {
                    s.remaining = percent_left(value);
                    s.limit = Some(100);
                    any |= s.remaining.is_some();
                }
                PlanPart::ResetAfter => s.reset_at = seconds(value).map(clamp),
                // `reset-after-seconds` wins: it does not depend on the provider's clock.
                PlanPart::ResetAt if s.reset_at.is_none() => {
                    s.reset_at = value.parse::<i64>().ok().and_then(|at| at.checked_mul(1000)).map(|at| clamp(at - now))
                }
                PlanPart::ResetAt => {}
            }
            continue;
        }
        let Some((limit, part)) = classify(name, families) else { continue };
        let slot = match limit {
            "requests" => 0,
            "tokens" => 1,
            "input-tokens" => 2,
            _ => 3,
        };
        let value = value.trim();
        let s = &mut seen[slot];
        match part {
            Part::Remaining => {
                s.remaining = count(value);
                any |= s.remaining.is_some();
            }
            Part::Limit => s.limit = count(value),
            Part::Reset => s.reset_at = crate::hints::reset_value(value, now).map(clamp),
        }
    }
    if !any {
        return None;
    }
    let [requests, tokens @ ..] = seen;
    let least = |w: &Window| (w.remaining, std::cmp::Reverse(w.reset_at));
    let tokens = tokens.iter().filter_map(Seen::window).min_by_key(least);
    let plan = plan.iter().filter_map(Seen::window).min_by_key(least);
    Some(Quota { model: model.to_string(), requests: requests.window(), tokens, plan, seen_at: now })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_profile_keeps_the_latest_reports_of_at_most_models_max_models() {
        let report = |i: usize| Quota {
            model: format!("m{i}"),
            requests: Some(Window { remaining: 1, limit: None, reset_at: None }),
            tokens: None,
            plan: None,
            seen_at: i as Millis,
        };
        let mut kept = Vec::new();
        for i in 0..MODELS_MAX + 10 {
            keep_latest(&mut kept, report(i));
        }
        assert_eq!(kept.len(), MODELS_MAX);
        assert!(kept.iter().all(|q| q.seen_at >= 10), "the ten seen longest ago went");
    }

    const NOW: Millis = 1_700_000_000_000;
    const SIX_HOURS: Millis = 6 * 3_600_000;

    fn q(headers: &[(&str, &str)]) -> Option<Quota> {
        read(headers.iter().copied(), &[Family::Openai, Family::Anthropic], "m", NOW, SIX_HOURS)
    }

    #[test]
    fn openai_headers_give_requests_and_tokens_with_their_resets() {
        let got = q(&[
            ("x-ratelimit-limit-requests", "60"),
            ("x-ratelimit-remaining-requests", "59"),
            ("x-ratelimit-reset-requests", "1s"),
            ("x-ratelimit-limit-tokens", "150000"),
            ("X-RateLimit-Remaining-Tokens", "149984"),
            ("x-ratelimit-reset-tokens", "6m0s"),
            ("content-type", "application/json"),
        ])
        .unwrap();
        assert_eq!(got.requests, Some(Window { remaining: 59, limit: Some(60), reset_at: Some(NOW + 1000) }));
        assert_eq!(
            got.tokens,
            Some(Window { remaining: 149_984, limit: Some(150_000), reset_at: Some(NOW + 360_000) })
        );
        assert_eq!((got.model.as_str(), got.seen_at), ("m", NOW));
    }

    #[test]
    fn anthropic_headers_keep_the_token_family_with_the_least_left() {
        let at = |secs: i64| chrono::DateTime::from_timestamp_millis(NOW + secs * 1000).unwrap().to_rfc3339();
        let (r, i, o) = (at(60), at(30), at(45));
        let got = q(&[
            ("anthropic-ratelimit-requests-limit", "50"),
            ("anthropic-ratelimit-requests-remaining", "3"),
            ("anthropic-ratelimit-requests-reset", &r),
            ("anthropic-ratelimit-input-tokens-limit", "40000"),
            ("anthropic-ratelimit-input-tokens-remaining", "39000"),
            ("anthropic-ratelimit-input-tokens-reset", &i),
            ("anthropic-ratelimit-output-tokens-limit", "8000"),
            ("anthropic-ratelimit-output-tokens-remaining", "120"),
            ("anthropic-ratelimit-output-tokens-reset", &o),
        ])
        .unwrap();
        assert_eq!(got.requests, Some(Window { remaining: 3, limit: Some(50), reset_at: Some(NOW + 60_000) }));
        assert_eq!(got.tokens, Some(Window { remaining: 120, limit: Some(8000), reset_at: Some(NOW + 45_000) }));
    }

    #[test]
    fn an_answer_without_remaining_counts_reports_nothing() {
        assert_eq!(q(&[("x-ratelimit-limit-requests", "60"), ("x-ratelimit-reset-requests", "1s")]), None);
        assert_eq!(q(&[("x-ratelimit-remaining-requests", "many")]), None);
        assert_eq!(q(&[("anthropic-ratelimit-unified-status", "allowed"), ("x-request-id", "1")]), None);
        assert_eq!(q(&[]), None);
    }

    #[test]
    fn counts_that_are_not_whole_numbers_are_no_report() {
        for bad in ["NaN", "-1", "-0.5", "inf", "1e3", "0.5", "zero", ""] {
            assert_eq!(q(&[("x-ratelimit-remaining-requests", bad)]), None, "{bad:?}");
        }
        let huge = q(&[("x-ratelimit-remaining-requests", "18000000000000000000")]).unwrap();
        assert_eq!(huge.requests.unwrap().remaining, i64::MAX, "more than anyone can spend, not zero");
        let limit = q(&[("x-ratelimit-remaining-requests", "4"), ("x-ratelimit-limit-requests", "-9")]).unwrap();
        assert_eq!(limit.requests.unwrap().limit, None);
    }

    #[test]
    fn a_far_reset_is_clamped_to_the_hint_maximum() {
        let got = q(&[("x-ratelimit-remaining-requests", "0"), ("x-ratelimit-reset-requests", "9999h")]).unwrap();
        assert_eq!(got.requests.unwrap().reset_at, Some(NOW + SIX_HOURS));
    }

    #[test]
    fn low_until_the_reset_when_a_count_is_at_its_floor() {
        let w = |remaining, reset_at| Some(Window { remaining, limit: None, reset_at });
        let quota = |requests, tokens| Quota { model: "m".into(), requests, tokens, plan: None, seen_at: NOW };
        let floor = Floor::default();
        assert_eq!(quota(w(1, Some(NOW + 5000)), None).low_until(floor, NOW), None);
        assert_eq!(quota(w(0, Some(NOW + 5000)), None).low_until(floor, NOW), Some(NOW + 5000));
        assert_eq!(quota(w(0, Some(NOW + 5000)), None).low_until(floor, NOW + 5000), None, "the window reset");
        assert_eq!(quota(w(0, None), None).low_until(floor, NOW + 1), Some(NOW + UNKNOWN_RESET));
        assert_eq!(quota(w(2, Some(NOW + 10)), None).low_until(Floor { requests: 2, tokens: 0 }, NOW), Some(NOW + 10));
        let both = quota(w(0, Some(NOW + 10)), w(100, Some(NOW + 90)));
        assert_eq!(both.low_until(Floor { requests: 0, tokens: 500 }, NOW), Some(NOW + 90), "the later reset");
        assert_eq!(both.low_until(floor, NOW + 20), None);
        assert_eq!(quota(None, None).low_until(floor, NOW), None, "unknown quota counts as available");
    }

    fn codex(headers: &[(&str, &str)]) -> Option<Quota> {
        read(headers.iter().copied(), &[Family::Codex], "gpt-5-codex", NOW, SIX_HOURS)
    }

    #[test]
    fn a_codex_plan_at_100_percent_is_low_until_its_window_resets() {
        let got = codex(&[
            ("x-codex-primary-used-percent", "100.0"),
            ("x-codex-primary-window-minutes", "300"),
            ("x-codex-primary-reset-after-seconds", "1200"),
            ("x-codex-secondary-used-percent", "37"),
            ("x-codex-secondary-reset-after-seconds", "86400"),
        ])
        .unwrap();
        assert_eq!(got.plan, Some(Window { remaining: 0, limit: Some(100), reset_at: Some(NOW + 1_200_000) }));
        assert_eq!((got.requests, got.tokens), (None, None));
        assert_eq!(got.low_until(Floor::default(), NOW), Some(NOW + 1_200_000));
        assert_eq!(got.low_until(Floor::default(), NOW + 1_200_000), None, "the window reset");
        // 99.5 % used leaves less than 1 %: still usable, and ordered by it.
        let most = codex(&[("x-codex-primary-used-percent", "99.5")]).unwrap();
        assert_eq!(most.plan.map(|w| w.remaining), Some(0));
        let some = codex(&[("x-codex-secondary-used-percent", "12.5")]).unwrap();
        assert_eq!(some.plan.map(|w| w.remaining), Some(87));
        assert_eq!(some.low_until(Floor::default(), NOW), None);
    }

    #[test]
    fn a_codex_reset_at_is_unix_seconds_and_every_reset_is_clamped() {
        let at = (NOW / 1000 + 600).to_string();
        let got = codex(&[("x-codex-primary-used-percent", "100"), ("x-codex-primary-reset-at", &at)]).unwrap();
        assert_eq!(got.plan.unwrap().reset_at, Some(NOW + 600_000));
        // The relative reset wins over the absolute one, whichever comes first.
        for order in [[0, 1], [1, 0]] {
            let pairs = [("x-codex-primary-reset-at", at.as_str()), ("x-codex-primary-reset-after-seconds", "60")];
            let mut headers = vec![("x-codex-primary-used-percent", "100")];
            headers.extend(order.map(|i| pairs[i]));
            assert_eq!(codex(&headers).unwrap().plan.unwrap().reset_at, Some(NOW + 60_000));
        }
        let far = (NOW / 1000 + 10 * 86_400).to_string();
        let got = codex(&[("x-codex-primary-used-percent", "100"), ("x-codex-primary-reset-at", &far)]).unwrap();
        assert_eq!(got.plan.unwrap().reset_at, Some(NOW + SIX_HOURS), "no header orders a profile last for days");
    }

    #[test]
    fn codex_shares_outside_0_to_100_are_no_report() {
        for bad in ["-1", "101", "NaN", "inf", "lots", ""] {
            assert_eq!(codex(&[("x-codex-primary-used-percent", bad)]), None, "{bad}");
        }
    }

    #[test]
    fn a_provider_reads_only_the_families_it_names() {
        let headers = [
            ("x-ratelimit-remaining-requests", "0"),
            ("anthropic-ratelimit-requests-remaining", "0"),
            ("x-codex-primary-used-percent", "100"),
        ];
        let with = |families: &[Family]| read(headers.iter().copied(), families, "m", NOW, SIX_HOURS);
        assert_eq!(with(&[]), None);
        let codex = with(&[Family::Codex]).unwrap();
        assert!(codex.requests.is_none() && codex.plan.is_some());
        let openai = with(&[Family::Openai]).unwrap();
        assert!(openai.requests.is_some() && openai.plan.is_none());
        assert!(with(&[Family::Anthropic]).unwrap().requests.is_some());
    }
}
