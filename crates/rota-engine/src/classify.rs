//! Error classification (SPEC §4): one ordered data table, first match wins.
//!
//! A rule matches when the HTTP status is in its status list (if it has one) **and** the error
//! text contains one of its words (if it has any). Rules that carry wording come before the
//! status-only rules, so "prompt is too long" on a 400 is a context overflow and not a format
//! error, and `insufficient_quota` on a 429 is billing and not a rate limit. Operators may put
//! their own rules in front of the table (`[[classification.rules]]` in the config).

use super::hints::{Hint, parse_hint};
use super::{Millis, Reason};
use serde::Deserialize;
use serde_json::Value;

/// One row of the classification table.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    pub reason: Reason,
    /// Status codes or ranges: `"429"`, `"5xx"`, `"400-499"`. Empty: any status (or none).
    #[serde(default)]
    pub status: Vec<StatusSpec>,
    /// Lower-case words, any of which must appear in the error text. Empty: no wording needed.
    #[serde(default)]
    pub any: Vec<String>,
}

/// An inclusive range of HTTP status codes, written `"429"`, `"5xx"` or `"400-499"`, or
/// `"transport"` for a failure with no HTTP answer (status 0 inside).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub struct StatusSpec {
    pub lo: u16,
    pub hi: u16,
}

impl TryFrom<String> for StatusSpec {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        let bad =
            || format!("invalid status `{s}`: expected a code (429), a class (5xx), a range (400-499) or `transport`");
        let t = s.trim();
        if t == "transport" {
            return Ok(StatusSpec { lo: 0, hi: 0 });
        }
        if let Some(class) = t.strip_suffix("xx") {
            let d: u16 = class.parse().map_err(|_| bad())?;
            if !(1..=5).contains(&d) {
                return Err(bad());
            }
            return Ok(StatusSpec { lo: d * 100, hi: d * 100 + 99 });
        }
        if let Some((a, b)) = t.split_once('-') {
            let lo = a.trim().parse().map_err(|_| bad())?;
            let hi = b.trim().parse().map_err(|_| bad())?;
            return if lo <= hi { Ok(StatusSpec { lo, hi }) } else { Err(bad()) };
        }
        let code = t.parse().map_err(|_| bad())?;
        Ok(StatusSpec { lo: code, hi: code })
    }
}

impl Rule {
    fn matches(&self, status: Option<u16>, text: &str) -> bool {
        let code = status.unwrap_or(0);
        let status_ok = self.status.is_empty() || self.status.iter().any(|r| (r.lo..=r.hi).contains(&code));
        let words_ok = self.any.is_empty() || self.any.iter().any(|w| text.contains(w.as_str()));
        status_ok && words_ok
    }
}

fn rule(reason: Reason, status: &[(u16, u16)], any: &[&str]) -> Rule {
    Rule {
        reason,
        status: status.iter().map(|&(lo, hi)| StatusSpec { lo, hi }).collect(),
        any: any.iter().map(|w| w.to_string()).collect(),
    }
}

/// The built-in table. Order matters: first match wins.
///
/// Evidence comes in order of trust (SPEC §4): the status, then the structured fields, then
/// wording — and wording only refines within what the status allows. Billing words count only
/// with 402/403/429 (and Anthropic's 400 "credit balance is too low"), permanent-auth words only
/// with 401/403 (or `invalid_grant`), and no word overrides a 404, which is `model_not_found` or
/// nothing. A stream's error event is classified
/// with status 200; a transport failure has no status (`transport`).
pub fn default_rules() -> Vec<Rule> {
    use Reason::*;
    const WORDLESS: &[&str] = &[];
    const AUTH: &[(u16, u16)] = &[(401, 401), (403, 403)];
    // Every answer but a 404 (and a redirect): in-stream events (200), client and server errors.
    const NOT_404: &[(u16, u16)] = &[(200, 299), (400, 403), (405, 599)];
    const TRANSPORT: (u16, u16) = (0, 0);
    vec![
        // rota never follows a redirect (a credential must not travel to another host): the
        // provider answered, but not with the answer.
        rule(ServerError, &[(300, 399)], WORDLESS),
        // A structured `model_not_found` (OpenAI's `error.code`) wins over any wording.
        rule(ModelNotFound, &[(200, 299), (400, 404), (422, 422)], &["model_not_found"]),
        // The prompt does not fit: another profile of the same model would fail the same way.
        rule(
            ContextOverflow,
            NOT_404,
            &[
                "context_length_exceeded",
                "prompt is too long",
                "maximum context length",
                "request_too_large",
                "input is too long",
                "context window",
                "too many input tokens",
                "exceeds the context",
                "exceed context limit",
                "input token count",
            ],
        ),
        rule(ContextOverflow, &[(413, 413)], WORDLESS),
        // A relay (OpenRouter, a proxy) reports its own upstream's failure as a 4xx.
        rule(ServerError, &[(400, 403), (405, 499)], &["upstream request failed", "upstream error"]),
        rule(
            AuthPermanent,
            AUTH,
            &[
                "revoked",
                "deactivated",
                "disabled",
                "deleted",
                "terms of service",
                "only authorized for use with",
                "suspended",
                "banned",
            ],
        ),
        // A refresh token that the identity provider no longer accepts.
        rule(AuthPermanent, &[(400, 401)], &["invalid_grant"]),
        // Google says "exceeded your current quota" on per-minute throttles too; its status
        // word tells them apart from OpenAI's `insufficient_quota`.
        rule(RateLimit, NOT_404, &["resource_exhausted"]),
        rule(
            Billing,
            &[(402, 403), (429, 429)],
            &[
                "billing",
                "payment required",
                "insufficient credits",
                "credit balance",
                "insufficient_quota",
                "exceeded your current quota",
                "quota exceeded",
                "out of credits",
                "requires more credits",
            ],
        ),
        // Anthropic's one documented exception: an empty balance is a 400
        // `invalid_request_error` with exactly these words.
        rule(Billing, &[(400, 400)], &["credit balance is too low"]),
        rule(
            Auth,
            &[(400, 401), (403, 403)],
            &[
                "authentication",
                "unauthorized",
                "invalid api key",
                "invalid_api_key",
                "incorrect api key",
                "invalid x-api-key",
                "api key not valid",
                "expired token",
                "token has expired",
                "token expired",
                "permission_error",
                "permission denied",
                // Anthropic answers a credential used outside its product with a 400: it cannot
                // serve here, so rotate (a cooldown step), but a 400 is no proof of revocation.
                "only authorized for use with",
            ],
        ),
        rule(
            RateLimit,
            NOT_404,
            &[
                "rate limit",
                "rate_limit",
                "ratelimit",
                "too many requests",
                "usage limit",
                "requests per minute",
                "tokens per minute",
            ],
        ),
        rule(Overloaded, NOT_404, &["overloaded", "capacity", "unavailable"]),
        rule(
            Timeout,
            &[TRANSPORT, (200, 299), (408, 408), (500, 599)],
            &["timeout", "timed out", "deadline exceeded", "deadline_exceeded", "etimedout"],
        ),
        rule(
            Network,
            &[TRANSPORT, (200, 299), (500, 599)],
            &[
                "connection refused",
                "econnrefused",
                "connection reset",
                "econnreset",
                "broken pipe",
                "dns error",
                "failed to lookup address",
                "name or service not known",
                "tls",
                "certificate",
                "connection closed before",
            ],
        ),
        rule(ModelNotFound, &[(404, 404)], &["model"]),
        // A missing model in other words; never on an auth, throttle or server status (a 401
        // "API key does not exist" is the key's problem, not the model's).
        rule(
            ModelNotFound,
            &[(200, 299), (400, 400), (404, 404), (422, 422)],
            &[
                "model not found",
                "does not exist",
                "unsupported model",
                "no such model",
                "is not a valid model",
                "unknown model",
                "not_found_error",
            ],
        ),
        // Statuses that say more than the error type some providers attach to everything
        // (OpenAI and DeepSeek send `invalid_request_error` with 401 and 402).
        rule(Billing, &[(402, 402)], WORDLESS),
        rule(Auth, AUTH, WORDLESS),
        rule(RateLimit, &[(429, 429)], WORDLESS),
        rule(Overloaded, &[(503, 503), (529, 529)], WORDLESS),
        rule(Timeout, &[(408, 408), (504, 504)], WORDLESS),
        rule(Format, &[(400, 400), (422, 422)], WORDLESS),
        rule(Format, NOT_404, &["invalid_request_error", "malformed", "tool_use_id", "tool_call_id"]),
        rule(ServerError, &[(500, 599)], WORDLESS),
        // A 2xx that reached the classifier is an empty or unusable successful reply.
        rule(ServerError, &[(200, 299)], WORDLESS),
    ]
}

/// Words that mark a throttle as account-wide (it then covers every model of the profile).
const ACCOUNT_WORDS: [&str; 4] = ["quota", "billing", "credits", "usage limit"];

/// What the classifier was given: an HTTP answer, or a transport error (`status: None`).
#[derive(Clone, Debug, Default)]
pub struct Observed<'a> {
    pub status: Option<u16>,
    pub headers: &'a [(String, String)],
    pub body: &'a str,
    /// Transport error text (connection refused, timed out…), when there was no answer.
    pub transport: Option<&'a str>,
    /// Text the client controls that the upstream may echo (the requested model): removed
    /// before any word rule or hint reads the answer, so a model named `billing` or
    /// `try again in 6h` cannot pick its own classification.
    pub echoed: &'a [&'a str],
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Classified {
    pub reason: Reason,
    pub hint: Option<Hint>,
    /// The provider signalled a limit for the whole account (wording or header).
    pub account_wide: bool,
    /// The provider's own error message, for logs and the client (may hold user text: redact
    /// secrets before storing it).
    pub message: String,
    /// An agent's claim (a lease report rota could not confirm), not rota's own evidence.
    pub claim: bool,
}

/// The classification table in force: the operator's rules first, then the built-in ones.
#[derive(Clone, Debug)]
pub struct Classifier {
    rules: Vec<Rule>,
}

impl Default for Classifier {
    fn default() -> Self {
        Classifier { rules: default_rules() }
    }
}

impl Classifier {
    pub fn with_overrides(overrides: Vec<Rule>) -> Self {
        let rules = overrides
            .into_iter()
            .map(|mut r| {
                r.any.iter_mut().for_each(|w| *w = w.to_lowercase());
                r
            })
            .chain(default_rules())
            .collect();
        Classifier { rules }
    }

    pub fn classify(&self, seen: &Observed<'_>, now: Millis) -> Classified {
        let json: Option<Value> = serde_json::from_str(seen.body).ok();
        let message = error_message(json.as_ref(), seen);
        let text = without_echoes(&error_text(json.as_ref(), seen).to_lowercase(), seen.echoed);
        let reason = self.rules.iter().find(|r| r.matches(seen.status, &text)).map_or(Reason::Unknown, |r| r.reason);
        // A reset hint sets the window of a throttle or an empty balance only; other reasons
        // take the ladder whatever headers came with them (SPEC §3).
        let hint = matches!(reason, Reason::RateLimit | Reason::Overloaded | Reason::Billing)
            .then(|| parse_hint(seen.headers, json.as_ref(), &without_echoes(&message, seen.echoed), now))
            .flatten();
        let account_wide =
            hint.is_some_and(|h| h.account_wide) || ACCOUNT_WORDS.iter().any(|w| contains_word(&text, w));
        Classified { reason, hint, account_wide, message, claim: false }
    }
}

/// `text` with every occurrence of the client's own strings (ASCII case-insensitive) blanked
/// out. Strings shorter than 3 characters are left alone: blanking them would eat ordinary words.
fn without_echoes(text: &str, echoed: &[&str]) -> String {
    let mut out = text.to_string();
    for e in echoed.iter().map(|e| e.trim()).filter(|e| e.chars().count() >= 3) {
        let (hay, needle) = (out.as_bytes(), e.as_bytes());
        let mut kept = String::with_capacity(out.len());
        let (mut from, mut i) = (0, 0);
        while i + needle.len() <= hay.len() {
            if hay[i..i + needle.len()].eq_ignore_ascii_case(needle) {
                // UTF-8 is self-synchronising: a match of a whole string starts and ends on
                // character boundaries.
                kept.push_str(&out[from..i]);
                kept.push(' ');
                i += needle.len();
                from = i;
            } else {
                i += 1;
            }
        }
        kept.push_str(&out[from..]);
        out = kept;
    }
    out
}

/// `word` appears in `text` with no letter or digit right before or after it (so the
/// `quotaincrease` of a link is not the word "quota").
fn contains_word(text: &str, word: &str) -> bool {
    text.match_indices(word).any(|(i, _)| {
        let before = text[..i].chars().next_back();
        let after = text[i + word.len()..].chars().next();
        !before.is_some_and(char::is_alphanumeric) && !after.is_some_and(char::is_alphanumeric)
    })
}

/// The fields providers put their error identity in: OpenAI `error.{type,code,message}`,
/// Anthropic `error.{type,message}`, Google `error.{status,message,details[].reason}`,
/// Ollama `{"error": "…"}`, FastAPI-style `detail`. A body that is not JSON counts whole.
fn error_text(json: Option<&Value>, seen: &Observed<'_>) -> String {
    let mut parts: Vec<String> = Vec::new();
    if let Some(t) = seen.transport {
        parts.push(t.to_string());
    }
    match json {
        Some(v) => {
            let err = v.get("error");
            let scopes = [err, Some(v)];
            for scope in scopes.into_iter().flatten() {
                for key in ["type", "code", "status", "message", "detail", "reason"] {
                    if let Some(f) = scope.get(key) {
                        parts.push(scalar(f));
                    }
                }
                if let Some(details) = scope.get("details").and_then(Value::as_array) {
                    parts.extend(details.iter().filter_map(|d| d.get("reason")).map(scalar));
                }
            }
            if let Some(Value::String(s)) = err {
                parts.push(s.clone());
            }
        }
        None => parts.push(seen.body.chars().take(4096).collect()),
    }
    parts.join(" \u{1f} ")
}

fn scalar(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

fn error_message(json: Option<&Value>, seen: &Observed<'_>) -> String {
    let from_json = json.and_then(|v| {
        let err = v.get("error");
        err.and_then(|e| e.get("message"))
            .or_else(|| err.filter(|e| e.is_string()))
            .or_else(|| v.get("message"))
            .or_else(|| v.get("detail"))
            .map(scalar)
    });
    let text = from_json.or_else(|| seen.transport.map(str::to_string)).unwrap_or_else(|| seen.body.trim().to_string());
    if text.is_empty() {
        return match seen.status {
            Some(s) => format!("HTTP {s} with an empty body"),
            None => "no answer".to_string(),
        };
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_specs_parse_codes_classes_and_ranges() {
        let p = |s: &str| StatusSpec::try_from(s.to_string());
        assert_eq!(p("429"), Ok(StatusSpec { lo: 429, hi: 429 }));
        assert_eq!(p("5xx"), Ok(StatusSpec { lo: 500, hi: 599 }));
        assert_eq!(p("400-499"), Ok(StatusSpec { lo: 400, hi: 499 }));
        assert!(p("9xx").is_err());
        assert!(p("500-400").is_err());
        assert!(p("teapot").is_err());
    }

    #[test]
    fn operator_rules_come_before_the_built_in_table() {
        let custom: Rule =
            toml::from_str("reason = \"rate_limit\"\nstatus = [\"400\"]\nany = [\"Slow Down Please\"]").unwrap();
        let c = Classifier::with_overrides(vec![custom]);
        let body = r#"{"error":{"message":"slow down please"}}"#;
        let seen = Observed { status: Some(400), body, ..Default::default() };
        assert_eq!(c.classify(&seen, 0).reason, Reason::RateLimit);
        assert_eq!(Classifier::default().classify(&seen, 0).reason, Reason::Format);
    }

    #[test]
    fn unknown_fields_in_an_operator_rule_are_refused() {
        assert!(toml::from_str::<Rule>("reason = \"format\"\nwords = [\"x\"]").is_err());
    }

    #[test]
    fn transport_errors_classify_from_their_text() {
        let c = Classifier::default();
        let seen = |t| Observed { transport: Some(t), ..Default::default() };
        assert_eq!(c.classify(&seen("connection refused"), 0).reason, Reason::Network);
        assert_eq!(c.classify(&seen("operation timed out"), 0).reason, Reason::Timeout);
        assert_eq!(c.classify(&seen("client went away"), 0).reason, Reason::Unknown);
    }

    #[test]
    fn account_words_match_whole_words_only() {
        assert!(contains_word("daily quota reached", "quota"));
        assert!(contains_word("quota.", "quota"));
        assert!(!contains_word("see aka.ms/oai/quotaincrease", "quota"));
    }

    #[test]
    fn echoes_are_blanked_whatever_their_case_and_nothing_else() {
        assert_eq!(without_echoes("The model `Billing` and billing", &["billing"]), "The model ` ` and  ");
        assert_eq!(without_echoes("ünïcode gpt-4.1 ünïcode", &["GPT-4.1"]), "ünïcode   ünïcode");
        assert_eq!(without_echoes("an ab echo", &["ab"]), "an ab echo", "too short to blank");
        assert_eq!(without_echoes("modèle modèle", &["modèle"]), "   ");
    }

    #[test]
    fn empty_body_gets_a_readable_message() {
        let c = Classifier::default();
        let out = c.classify(&Observed { status: Some(502), ..Default::default() }, 0);
        assert_eq!(out.reason, Reason::ServerError);
        assert_eq!(out.message, "HTTP 502 with an empty body");
    }
}
