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

/// The latest quota a provider reported for one profile and model.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Quota {
    pub model: String,
    pub requests: Option<Window>,
    /// The token limit with the least remaining (Anthropic reports input and output tokens
    /// apart).
    pub tokens: Option<Window>,
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
        requests.max(tokens)
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
/// `x-ratelimit-{part}-{limit}`, `anthropic-ratelimit-{limit}-{part}`.
fn classify(name: &str) -> Option<(&str, Part)> {
    if let Some(rest) = name.strip_prefix("x-ratelimit-") {
        let (part, limit) = rest.split_once('-')?;
        return matches!(limit, "requests" | "tokens").then_some((limit, Part::of(part)?));
    }
    let (limit, part) = name.strip_prefix("anthropic-ratelimit-")?.rsplit_once('-')?;
    matches!(limit, "requests" | "tokens" | "input-tokens" | "output-tokens").then_some((limit, Part::of(part)?))
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
    model: &str,
    now: Millis,
    max_wait: Millis,
) -> Option<Quota> {
    // requests, tokens, input-tokens, output-tokens
    let mut seen: [Seen; 4] = Default::default();
    let mut any = false;
    for (name, value) in headers {
        let lower;
        let name = if name.bytes().any(|b| b.is_ascii_uppercase()) {
            lower = name.to_ascii_lowercase();
            lower.as_str()
        } else {
            name
        };
        let Some((limit, part)) = classify(name) else { continue };
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
            Part::Reset => {
                s.reset_at = crate::hints::reset_value(value, now).map(|wait| now + wait.clamp(0, max_wait.max(0)));
            }
        }
    }
    if !any {
        return None;
    }
    let [requests, tokens @ ..] = seen;
    let tokens = tokens.iter().filter_map(Seen::window).min_by_key(|w| (w.remaining, std::cmp::Reverse(w.reset_at)));
    Some(Quota { model: model.to_string(), requests: requests.window(), tokens, seen_at: now })
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
        read(headers.iter().copied(), "m", NOW, SIX_HOURS)
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
        let quota = |requests, tokens| Quota { model: "m".into(), requests, tokens, seen_at: NOW };
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
}
