//! Provider reset hints: how long the provider asks us to wait (docs/rotation.md, "Provider hint wins").
//!
//! Sources, most explicit first: `retry-after-ms`, `Retry-After` (seconds or HTTP-date), Google's
//! `RetryInfo.retryDelay` / `quotaResetDelay` in the error body, `x-ratelimit-reset-*` and
//! `anthropic-ratelimit-*-reset` headers, then "try again in 20s" wording in the message.

use super::Millis;
use regex::Regex;
use serde_json::Value;
use std::sync::LazyLock;

/// A parsed reset hint, relative to the time of the failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hint {
    pub wait_ms: Millis,
    /// The hint came from a header that describes the whole account (not one model).
    pub account_wide: bool,
}

/// Headers whose reset describes the account rather than a model (Claude subscription
/// "unified" windows cover every model of the account).
const ACCOUNT_RESET_HEADERS: [&str; 1] = ["anthropic-ratelimit-unified-reset"];

/// Reads the reset hint of a failed upstream answer. `headers` names are matched without
/// regard to case.
pub fn parse_hint(headers: &[(String, String)], body: Option<&Value>, message: &str, now: Millis) -> Option<Hint> {
    let header = |name: &str| headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.trim());
    let plain = |wait_ms| Hint { wait_ms, account_wide: false };

    if let Some(ms) = header("retry-after-ms").and_then(|v| v.parse::<f64>().ok()) {
        return Some(plain(ms.max(0.0).round() as Millis));
    }
    if let Some(v) = header("retry-after")
        && let Some(ms) = retry_after(v, now)
    {
        return Some(plain(ms));
    }
    if let Some(ms) = body.and_then(google_retry_delay) {
        return Some(plain(ms));
    }
    if let Some(h) = reset_headers(headers, now) {
        return Some(h);
    }
    message_wait(message).map(plain)
}

/// `Retry-After: 7` or `Retry-After: Wed, 21 Oct 2015 07:28:00 GMT`.
fn retry_after(value: &str, now: Millis) -> Option<Millis> {
    if let Ok(secs) = value.parse::<f64>() {
        return Some((secs.max(0.0) * 1000.0).round() as Millis);
    }
    let at = chrono::DateTime::parse_from_rfc2822(value).ok()?;
    Some((at.timestamp_millis() - now).max(0))
}

/// Google APIs: `error.details[]` holds `google.rpc.RetryInfo {retryDelay: "37s"}` and, for
/// quota errors, `ErrorInfo.metadata.quotaResetDelay`.
fn google_retry_delay(body: &Value) -> Option<Millis> {
    let error = body.get("error").unwrap_or(body);
    let details = error.get("details")?.as_array()?;
    details.iter().find_map(|d| {
        d.get("retryDelay")
            .or_else(|| d.get("metadata").and_then(|m| m.get("quotaResetDelay")))
            .and_then(Value::as_str)
            .and_then(go_duration)
    })
}

/// `x-ratelimit-reset-requests: 6m0s`, `x-ratelimit-reset: 1741305600000`,
/// `anthropic-ratelimit-tokens-reset: 2025-01-01T00:00:00Z`. When `*-remaining-*` headers say
/// which limit is exhausted (value 0), only those resets count; the longest one wins.
fn reset_headers(headers: &[(String, String)], now: Millis) -> Option<Hint> {
    let mut exhausted: Option<(Millis, bool)> = None;
    let mut any: Option<(Millis, bool)> = None;
    for (name, value) in headers {
        let name = name.to_ascii_lowercase();
        let is_reset = (name.starts_with("x-ratelimit-reset") || name.starts_with("anthropic-ratelimit-"))
            && name.contains("reset");
        if !is_reset {
            continue;
        }
        let Some(ms) = reset_value(value.trim(), now) else { continue };
        let account = ACCOUNT_RESET_HEADERS.contains(&name.as_str());
        let keep = |slot: &mut Option<(Millis, bool)>| {
            if slot.is_none_or(|(m, _)| ms > m) {
                *slot = Some((ms, account));
            }
        };
        keep(&mut any);
        let remaining = name.replacen("reset", "remaining", 1);
        let is_exhausted = headers.iter().any(|(k, v)| k.eq_ignore_ascii_case(&remaining) && v.trim() == "0");
        if is_exhausted || account {
            keep(&mut exhausted);
        }
    }
    exhausted.or(any).map(|(wait_ms, account_wide)| Hint { wait_ms, account_wide })
}

/// A reset value: a Go-style duration, an RFC 3339 time, Unix seconds or Unix milliseconds,
/// or a small number of seconds to wait.
pub(crate) fn reset_value(value: &str, now: Millis) -> Option<Millis> {
    if let Ok(n) = value.parse::<f64>() {
        let at = if n >= 1e12 {
            n as Millis
        } else if n >= 1e9 {
            (n * 1000.0) as Millis
        } else {
            return Some((n.max(0.0) * 1000.0).round() as Millis);
        };
        return Some((at - now).max(0));
    }
    if let Ok(at) = chrono::DateTime::parse_from_rfc3339(value) {
        return Some((at.timestamp_millis() - now).max(0));
    }
    go_duration(value)
}

static DURATION_PART: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?i)(\d+(?:\.\d+)?)\s*(ms|milliseconds?|hours?|hrs?|h|minutes?|mins?|m|seconds?|secs?|s)").unwrap()
});

/// `1h2m3.5s`, `6m0s`, `20ms`, `37s`, `1m 30s`, `2 minutes`.
fn go_duration(text: &str) -> Option<Millis> {
    let text = text.trim();
    let mut total = 0.0;
    let mut end = 0;
    for caps in DURATION_PART.captures_iter(text) {
        let whole = caps.get(0).unwrap();
        if !text[end..whole.start()].trim().is_empty() {
            return None;
        }
        end = whole.end();
        let n: f64 = caps[1].parse().ok()?;
        let unit = caps[2].to_ascii_lowercase();
        total += n * match unit.as_str() {
            "ms" | "millisecond" | "milliseconds" => 1.0,
            u if u.starts_with('h') => 3_600_000.0,
            u if u.starts_with('m') => 60_000.0,
            _ => 1000.0,
        };
    }
    (end > 0 && text[end..].trim().is_empty()).then(|| total.round() as Millis)
}

static TRY_AGAIN: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?i)(?:try again|retry(?: again)?|retry after|reset(?:s)?)\s+(?:in|after)\s+((?:\d+(?:\.\d+)?\s*(?:ms|milliseconds?|hours?|hrs?|h|minutes?|mins?|m|seconds?|secs?|s)(?:\s|,|and)*)+)")
        .unwrap()
});

/// "Please try again in 20s", "try again in 1m30s", "retry after 2 minutes".
fn message_wait(message: &str) -> Option<Millis> {
    let caps = TRY_AGAIN.captures(message)?;
    let text = caps[1].replace(',', " ").replace(" and ", " ");
    go_duration(text.trim())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const NOW: Millis = 1_700_000_000_000;

    fn h(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn wait(pairs: &[(&str, &str)], body: Option<Value>, msg: &str) -> Option<Millis> {
        parse_hint(&h(pairs), body.as_ref(), msg, NOW).map(|h| h.wait_ms)
    }

    #[test]
    fn retry_after_seconds_is_read() {
        assert_eq!(wait(&[("Retry-After", "7")], None, ""), Some(7_000));
    }

    #[test]
    fn retry_after_http_date_is_relative_to_now() {
        // NOW is 2023-11-14T22:13:20Z; the date is 90 s later.
        assert_eq!(wait(&[("retry-after", "Tue, 14 Nov 2023 22:14:50 GMT")], None, ""), Some(90_000));
    }

    #[test]
    fn retry_after_ms_beats_retry_after() {
        assert_eq!(wait(&[("retry-after", "2"), ("retry-after-ms", "1500")], None, ""), Some(1_500));
    }

    #[test]
    fn openai_reset_headers_use_the_exhausted_limit() {
        let headers = [
            ("x-ratelimit-remaining-requests", "499"),
            ("x-ratelimit-reset-requests", "120ms"),
            ("x-ratelimit-remaining-tokens", "0"),
            ("x-ratelimit-reset-tokens", "6m0s"),
        ];
        assert_eq!(wait(&headers, None, ""), Some(360_000));
    }

    #[test]
    fn reset_headers_without_remaining_take_the_longest() {
        let headers = [("x-ratelimit-reset-requests", "1s"), ("x-ratelimit-reset-tokens", "1m30s")];
        assert_eq!(wait(&headers, None, ""), Some(90_000));
    }

    #[test]
    fn openrouter_reset_in_unix_millis_is_relative_to_now() {
        assert_eq!(wait(&[("X-RateLimit-Reset", "1700000042000")], None, ""), Some(42_000));
    }

    #[test]
    fn anthropic_reset_rfc3339_is_relative_to_now() {
        let headers = [
            ("anthropic-ratelimit-requests-remaining", "0"),
            ("anthropic-ratelimit-requests-reset", "2023-11-14T22:13:50Z"),
        ];
        assert_eq!(wait(&headers, None, ""), Some(30_000));
    }

    #[test]
    fn anthropic_unified_reset_is_account_wide() {
        let hint = parse_hint(&h(&[("anthropic-ratelimit-unified-reset", "1700003600")]), None, "", NOW).unwrap();
        assert_eq!(hint, Hint { wait_ms: 3_600_000, account_wide: true });
    }

    #[test]
    fn google_retry_info_retry_delay_is_read() {
        let body = json!({"error": {"code": 429, "status": "RESOURCE_EXHAUSTED", "details": [
            {"@type": "type.googleapis.com/google.rpc.QuotaFailure", "violations": []},
            {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "37s"}]}});
        assert_eq!(wait(&[], Some(body), ""), Some(37_000));
    }

    #[test]
    fn google_quota_reset_delay_is_read() {
        let body = json!({"error": {"details": [{"@type": "type.googleapis.com/google.rpc.ErrorInfo",
            "metadata": {"quotaResetDelay": "1h2m3.5s"}}]}});
        assert_eq!(wait(&[], Some(body), ""), Some(3_723_500));
    }

    #[test]
    fn try_again_wording_in_seconds_and_minutes() {
        assert_eq!(wait(&[], None, "Rate limit reached. Please try again in 20s."), Some(20_000));
        assert_eq!(wait(&[], None, "Please try again in 1m30s"), Some(90_000));
        assert_eq!(wait(&[], None, "try again in 1m 30s"), Some(90_000));
        assert_eq!(wait(&[], None, "Please try again in 6ms."), Some(6));
        assert_eq!(wait(&[], None, "please retry after 2 minutes"), Some(120_000));
        assert_eq!(wait(&[], None, "Try again in 1.5 seconds"), Some(1_500));
    }

    #[test]
    fn no_hint_when_nothing_says_when() {
        assert_eq!(
            wait(
                &[("content-type", "application/json")],
                Some(json!({"error": {"message": "slow down"}})),
                "slow down"
            ),
            None
        );
        assert_eq!(wait(&[("retry-after", "soon")], None, ""), None);
    }

    #[test]
    fn go_durations_parse_exactly() {
        assert_eq!(go_duration("6m0s"), Some(360_000));
        assert_eq!(go_duration("20ms"), Some(20));
        assert_eq!(go_duration("0.5s"), Some(500));
        assert_eq!(go_duration("abc"), None);
        assert_eq!(go_duration("5s later"), None);
    }
}
