//! The error a client gets when every candidate failed (docs/audit.md).

use super::{Millis, Reason, Until};

/// The last failure of one candidate model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelFailure {
    /// `provider/model`
    pub label: String,
    pub reason: Reason,
    /// Redacted provider message.
    pub message: String,
    /// The upstream HTTP status, when there was an answer.
    pub status: Option<u16>,
    /// When the candidate becomes usable again, if known (cooldown set or found).
    pub until: Option<Until>,
    /// The candidate was skipped because it was cooling, without an upstream call.
    pub skipped: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Aggregated {
    pub status: u16,
    pub message: String,
    /// Seconds for `Retry-After`, when the error is a throttle with a known end.
    pub retry_after_secs: Option<u64>,
}

fn cooldown_like(f: &ModelFailure) -> bool {
    f.reason == Reason::RateLimit || (f.skipped && f.until.is_some())
}

fn fallback_status(reason: Reason) -> u16 {
    match reason {
        Reason::RateLimit => 429,
        Reason::Overloaded => 503,
        Reason::Timeout => 504,
        Reason::ContextOverflow | Reason::Format => 400,
        Reason::Auth | Reason::AuthPermanent | Reason::NoProfile | Reason::WireFormat => 502,
        Reason::Billing => 502,
        Reason::ModelNotFound => 404,
        Reason::Cancelled => 499,
        _ => 502,
    }
}

/// Seconds until the soonest timed window, at least 1.
fn retry_after(failures: &[&ModelFailure], now: Millis) -> Option<u64> {
    let soonest = failures.iter().filter_map(|f| match f.until {
        Some(Until::At(t)) => Some(t),
        _ => None,
    });
    soonest.min().map(|t| (((t - now).max(0) as u64).div_ceil(1000)).max(1))
}

/// Builds the client's error. A single candidate's failure is returned as it was.
pub fn aggregate(failures: &[ModelFailure], now: Millis) -> Aggregated {
    match failures {
        [] => Aggregated { status: 502, message: "no model could be tried".into(), retry_after_secs: None },
        [only] => {
            let status = only.status.filter(|s| *s >= 400).unwrap_or_else(|| fallback_status(only.reason));
            let retry = (status == 429 || status == 503).then(|| retry_after(&[only], now)).flatten();
            Aggregated { status, message: only.message.clone(), retry_after_secs: retry }
        }
        many => {
            let parts: Vec<String> =
                many.iter().map(|f| format!("{}: {} ({})", f.label, f.message, f.reason)).collect();
            let message = format!("All models failed ({}): {}", many.len(), parts.join(" | "));
            let all: Vec<&ModelFailure> = many.iter().collect();
            let (status, retry) = if many.iter().all(cooldown_like) {
                (429, retry_after(&all, now))
            } else if many.iter().any(|f| f.reason == Reason::Overloaded)
                && many.iter().all(|f| f.reason == Reason::Overloaded || cooldown_like(f))
            {
                (503, retry_after(&all, now))
            } else {
                (502, None)
            };
            Aggregated { status, message, retry_after_secs: retry }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: Millis = 5_000_000;

    fn f(label: &str, reason: Reason, status: Option<u16>, until: Option<Millis>) -> ModelFailure {
        ModelFailure {
            label: label.into(),
            reason,
            message: format!("{reason} happened"),
            status,
            until: until.map(Until::At),
            skipped: false,
        }
    }

    #[test]
    fn message_names_every_model_with_its_reason() {
        let out = aggregate(
            &[
                f("gemini/gemini-2.5-flash", Reason::RateLimit, Some(429), Some(NOW + 1000)),
                f("openai/gpt-4.1", Reason::ServerError, Some(500), None),
            ],
            NOW,
        );
        assert_eq!(
            out.message,
            "All models failed (2): gemini/gemini-2.5-flash: rate_limit happened (rate_limit) | openai/gpt-4.1: server_error happened (server_error)"
        );
        assert_eq!((out.status, out.retry_after_secs), (502, None));
    }

    #[test]
    fn all_throttled_is_429_with_the_soonest_retry_after() {
        let mut skipped = f("anthropic/claude", Reason::RateLimit, None, Some(NOW + 42_500));
        skipped.skipped = true;
        let out = aggregate(&[skipped, f("openai/gpt-4.1", Reason::RateLimit, Some(429), Some(NOW + 60_000))], NOW);
        assert_eq!((out.status, out.retry_after_secs), (429, Some(43)));
    }

    #[test]
    fn skipped_cooling_candidates_count_as_throttled_whatever_their_reason() {
        let mut skipped = f("anthropic/claude", Reason::Auth, None, Some(NOW + 5_000));
        skipped.skipped = true;
        let out = aggregate(&[skipped, f("openai/gpt", Reason::RateLimit, Some(429), Some(NOW + 9_000))], NOW);
        assert_eq!((out.status, out.retry_after_secs), (429, Some(5)));
    }

    #[test]
    fn overloaded_without_other_errors_is_503() {
        let out = aggregate(
            &[f("a/x", Reason::Overloaded, Some(529), None), f("b/y", Reason::RateLimit, Some(429), Some(NOW + 2_000))],
            NOW,
        );
        assert_eq!((out.status, out.retry_after_secs), (503, Some(2)));
    }

    #[test]
    fn mixed_failures_are_502() {
        let out =
            aggregate(&[f("a/x", Reason::Overloaded, Some(529), None), f("b/y", Reason::Auth, Some(401), None)], NOW);
        assert_eq!(out.status, 502);
    }

    #[test]
    fn single_candidate_failure_returns_its_own_error() {
        let out = aggregate(&[f("a/x", Reason::Format, Some(400), None)], NOW);
        assert_eq!(out, Aggregated { status: 400, message: "format happened".into(), retry_after_secs: None });
        let out = aggregate(&[f("a/x", Reason::RateLimit, Some(429), Some(NOW + 7_000))], NOW);
        assert_eq!((out.status, out.retry_after_secs), (429, Some(7)));
        let out = aggregate(&[f("a/x", Reason::Network, None, None)], NOW);
        assert_eq!(out.status, 502, "a transport failure has no upstream status");
    }

    #[test]
    fn retry_after_is_at_least_one_second() {
        let out = aggregate(
            &[
                f("a/x", Reason::RateLimit, Some(429), Some(NOW + 10)),
                f("b/y", Reason::RateLimit, Some(429), Some(NOW)),
            ],
            NOW,
        );
        assert_eq!(out.retry_after_secs, Some(1));
    }
}
