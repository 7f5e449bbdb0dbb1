//! Error classification (docs/rotation.md): one ordered data table, first match wins.
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
/// Evidence comes in order of trust (docs/rotation.md, "Classification"): the status, then the
/// structured fields, then wording — and wording only refines within what the status allows. A
/// 400 or a 422 is `format` or `context_overflow`, or one of the provider-documented 400s
/// (Anthropic's "credit balance is too low" and "only authorized for use with", Google's
/// `API_KEY_INVALID`, an identity provider's `invalid_grant`, a relay's "upstream error"); a
/// 5xx always fails over
/// (`server_error`, `overloaded`, `timeout` or `network`, never `format` or `unknown`). Billing
/// words count only with 402/403/429, permanent-auth words only with 401/403, and no word
/// overrides a 404, which is `model_not_found` or nothing. A stream's error event is classified
/// with status 200; a transport failure has no status (`transport`).
pub fn default_rules() -> Vec<Rule> {
    use Reason::*;
    const WORDLESS: &[&str] = &[];
    const AUTH: &[(u16, u16)] = &[(401, 401), (403, 403)];
    // Where a throttle or an overload may be worded: in-stream events (200) and every error but
    // a 404 and the invalid-request statuses 400 and 422, which only say the request was wrong
    // (their wording is the client's business, and often its own words echoed).
    const THROTTLE: &[(u16, u16)] = &[(200, 299), (401, 403), (405, 421), (423, 599)];
    // What the request itself may be blamed for: never a 5xx, which always fails over.
    const REQUEST: &[(u16, u16)] = &[(200, 299), (400, 403), (405, 499)];
    const TRANSPORT: (u16, u16) = (0, 0);
    vec![
        // rota never follows a redirect (a credential must not travel to another host): the
        // provider answered, but not with the answer.
        rule(ServerError, &[(300, 399)], WORDLESS),
        // A structured `model_not_found` (OpenAI's `error.code`) wins over any wording; never on
        // a 400 or a 422, whose text may be the client's own.
        rule(ModelNotFound, &[(200, 299), (401, 404)], &["model_not_found"]),
        // The prompt does not fit: another profile of the same model would fail the same way.
        rule(
            ContextOverflow,
            REQUEST,
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
        rule(RateLimit, THROTTLE, &["resource_exhausted"]),
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
            AUTH,
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
            ],
        ),
        // Anthropic answers a credential used outside its product with a 400 in exactly these
        // words: it cannot serve here, so rotate (a cooldown step), but a 400 is no proof of
        // revocation.
        rule(Auth, &[(400, 400)], &["only authorized for use with"]),
        // Google answers a key it does not know with a 400 whose structured reason says so.
        rule(Auth, &[(400, 400)], &["api_key_invalid"]),
        rule(
            RateLimit,
            THROTTLE,
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
        rule(Overloaded, THROTTLE, &["overloaded", "capacity", "unavailable"]),
        rule(
            Timeout,
            &[TRANSPORT, (200, 299), (408, 408), (500, 599)],
            &["timeout", "timed out", "deadline exceeded", "deadline_exceeded", "etimedout"],
        ),
        // rota's own connection failed (no answer), or a stream's error event says so. A 5xx
        // is an answer: the connection to the provider works, whatever its text says.
        rule(
            Network,
            &[TRANSPORT, (200, 299)],
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
        // "API key does not exist" is the key's problem, not the model's), nor on a 400 or a
        // 422 ("tool_call_id … does not exist" is the request's).
        rule(
            ModelNotFound,
            &[(200, 299), (404, 404)],
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
        rule(Format, REQUEST, &["invalid_request_error", "malformed", "tool_use_id", "tool_call_id"]),
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
    /// Text the client controls that the upstream may echo: removed before any word rule or
    /// hint reads the answer, so a model, a field or a message saying `billing` or `try again
    /// in 6h` cannot pick its own classification (`Echoed`).
    pub echoed: Echoed<'a>,
}

/// What the client sent, which an upstream may repeat in its error (OpenAI names an unknown
/// parameter, Anthropic an extra input, Gemini an unknown field, a relay the whole request):
/// loose strings (the model asked for, header values) and the request's JSON body, every key
/// and string value of it. Walked once per classified failure, never copied.
#[derive(Clone, Copy, Debug, Default)]
pub struct Echoed<'a> {
    pub strings: &'a [&'a str],
    pub body: Option<&'a serde_json::Map<String, Value>>,
}

impl<'a> Echoed<'a> {
    /// Only these strings.
    pub fn strings(strings: &'a [&'a str]) -> Echoed<'a> {
        Echoed { strings, body: None }
    }

    fn each(&self, f: &mut impl FnMut(&str)) {
        fn walk(v: &Value, f: &mut impl FnMut(&str)) {
            match v {
                Value::String(s) => f(s),
                Value::Array(a) => a.iter().for_each(|v| walk(v, f)),
                Value::Object(o) => o.iter().for_each(|(k, v)| {
                    f(k);
                    walk(v, f)
                }),
                _ => {}
            }
        }
        self.strings.iter().for_each(|s| f(s));
        if let Some(body) = self.body {
            body.iter().for_each(|(k, v)| {
                f(k);
                walk(v, f)
            });
        }
    }
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
        let text = without_echoes(&error_text(json.as_ref(), seen).to_lowercase(), &seen.echoed);
        let reason = self.rules.iter().find(|r| r.matches(seen.status, &text)).map_or(Reason::Unknown, |r| r.reason);
        // A reset hint sets the window of a throttle or an empty balance only; other reasons
        // take the ladder whatever headers came with them (docs/rotation.md).
        let hint = matches!(reason, Reason::RateLimit | Reason::Overloaded | Reason::Billing)
            .then(|| parse_hint(seen.headers, json.as_ref(), &without_echoes(&message, &seen.echoed), now))
            .flatten();
        let account_wide =
            hint.is_some_and(|h| h.account_wide) || ACCOUNT_WORDS.iter().any(|w| contains_word(&text, w));
        Classified { reason, hint, account_wide, message, claim: false }
    }
}

/// The span of client text that counts as an echo: a string of the client's at least this long
/// counts wherever `GRAM` bytes of it in a row appear in the answer (so a part of it counts too);
/// a shorter one counts where it appears whole.
const GRAM: usize = 8;

/// The most of an answer's text the rules read.
const TEXT_MAX: usize = 16 * 1024;

/// `text` with every part that repeats the client's own text blanked out (ASCII
/// case-insensitive): any run of `GRAM` bytes that also appears in one of the client's strings,
/// any whole client string shorter than that, and any word of 3 to `GRAM - 1` letters and
/// digits of a longer one (shorter ones would eat ordinary words). Client text can only remove words, so it can only make a
/// classification milder. The cost is one pass over the client's strings, whatever their size;
/// what is kept in memory is sized by `text` (at most `TEXT_MAX`).
fn without_echoes(text: &str, echoed: &Echoed<'_>) -> String {
    let mut end = text.len().min(TEXT_MAX);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let bytes = &text.as_bytes()[..end];
    if bytes.len() < 3 {
        return text[..end].to_string();
    }
    let lower: Vec<u8> = bytes.iter().map(u8::to_ascii_lowercase).collect();
    let mut runs = Runs::of(&lower);
    let mut blank = vec![false; lower.len()];
    echoed.each(&mut |s| {
        let s = s.trim().as_bytes();
        if s.len() < 3 {
            return;
        }
        if s.len() < GRAM {
            runs.mark(Key::of(s.iter().map(u8::to_ascii_lowercase)), &mut blank);
            return;
        }
        // Each run of GRAM bytes, and each short word: "quota" inside "Tell me about my quota".
        let (mut window, mut word) = (0u64, 0usize);
        for (i, &b) in s.iter().enumerate() {
            window = (window << 8) | u64::from(b.to_ascii_lowercase());
            if i + 1 >= GRAM {
                runs.mark(Key::Gram(window), &mut blank);
            }
            if !b.is_ascii_alphanumeric() {
                if (3..GRAM).contains(&(i - word)) {
                    runs.mark(Key::of(s[word..i].iter().map(u8::to_ascii_lowercase)), &mut blank);
                }
                word = i + 1;
            }
        }
        if (3..GRAM).contains(&(s.len() - word)) {
            runs.mark(Key::of(s[word..].iter().map(u8::to_ascii_lowercase)), &mut blank);
        }
    });
    if !blank.contains(&true) {
        return text[..end].to_string();
    }
    let kept: Vec<u8> = bytes.iter().zip(&blank).map(|(&b, &gone)| if gone { b' ' } else { b }).collect();
    String::from_utf8_lossy(&kept).into_owned()
}

/// A run of a text's bytes as one number: `GRAM` bytes, or 3 to `GRAM - 1` (their bytes below
/// their length, so no two short runs are equal).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Key {
    Gram(u64),
    Short(u64),
}

impl Key {
    /// The run of `n` bytes that end `w` (`n` is 3 to `GRAM`).
    fn last(w: u64, n: usize) -> Key {
        match n {
            GRAM => Key::Gram(w),
            _ => Key::Short(w & ((1 << (8 * n)) - 1) | ((n as u64) << 56)),
        }
    }

    /// The run of these 3 to `GRAM` bytes.
    fn of(bytes: impl ExactSizeIterator<Item = u8>) -> Key {
        let n = bytes.len();
        Key::last(bytes.fold(0, |w, b| (w << 8) | u64::from(b)), n)
    }

    fn len(self) -> usize {
        match self {
            Key::Gram(_) => GRAM,
            Key::Short(k) => (k >> 56) as usize,
        }
    }

    fn hash(self) -> u64 {
        let k = match self {
            Key::Gram(k) => k,
            Key::Short(k) => !k,
        };
        k.wrapping_mul(0x9E37_79B9_7F4A_7C15)
    }
}

/// Where each run of `GRAM` bytes of a text, and each of its substrings of 3 to `GRAM - 1`
/// bytes, starts. Most runs of the client's text are not in the answer: a bit per hashed run
/// answers those (at most about 6 % false hits). The first `SCANS` runs it may hold are looked
/// for by a pass over the text; past them, an index is built, one hash entry per distinct run
/// holding its last start, the earlier ones chained behind it. A run is blanked once, however
/// often the client's text repeats it, so blanking costs at most `SCANS` passes over the text
/// and one over each start.
struct Runs<'t> {
    text: &'t [u8],
    bits: Vec<u64>,
    shift: u32,
    scanned: Vec<Key>,
    index: Option<Index>,
}

struct Index {
    last: std::collections::HashMap<Key, (u32, bool), foldhash::fast::FixedState>,
    /// Per entry: where its run starts, and the entry of the same run before it (`NONE`).
    start: Vec<u32>,
    before: Vec<u32>,
}

impl<'t> Runs<'t> {
    const NONE: u32 = u32::MAX;

    /// Each run of `text` with where it starts.
    fn each(text: &[u8], mut f: impl FnMut(Key, usize)) {
        for i in 0..text.len() {
            let mut w = 0u64;
            for (n, &b) in text[i..text.len().min(i + GRAM)].iter().enumerate() {
                w = (w << 8) | u64::from(b);
                if n + 1 >= 3 {
                    f(Key::last(w, n + 1), i);
                }
            }
        }
    }

    /// Each run of `n` bytes of `text` with where it starts.
    fn each_of_length(text: &[u8], n: usize, mut f: impl FnMut(Key, usize)) {
        let mut w = 0u64;
        for (i, &b) in text.iter().enumerate() {
            w = (w << 8) | u64::from(b);
            if i + 1 >= n {
                f(Key::last(w, n), i + 1 - n);
            }
        }
    }

    fn of(text: &'t [u8]) -> Runs<'t> {
        // 16 bits a run.
        let log2 = (text.len() * (GRAM - 2) * 16).next_power_of_two().trailing_zeros().max(6);
        let mut runs =
            Runs { text, bits: vec![0; 1 << (log2 - 6)], shift: 64 - log2, scanned: Vec::new(), index: None };
        Self::each(text, |key, _| {
            let bit = key.hash() >> runs.shift;
            runs.bits[(bit >> 6) as usize] |= 1 << (bit & 63);
        });
        runs
    }

    /// Blanks the bytes at each start of `key`, the first time it is asked for.
    #[inline(always)]
    fn mark(&mut self, key: Key, blank: &mut [bool]) {
        let bit = key.hash() >> self.shift;
        if self.bits[(bit >> 6) as usize] & (1 << (bit & 63)) != 0 {
            self.mark_held(key, blank);
        }
    }

    #[inline(never)]
    fn mark_held(&mut self, key: Key, blank: &mut [bool]) {
        const SCANS: usize = 32;
        let (text, n) = (self.text, key.len());
        if self.index.is_none() && self.scanned.len() < SCANS {
            if !self.scanned.contains(&key) {
                self.scanned.push(key);
                Self::each_of_length(text, n, |run, at| {
                    if run == key {
                        blank[at..at + n].iter_mut().for_each(|b| *b = true);
                    }
                });
            }
            return;
        }
        let index = self.index.get_or_insert_with(|| {
            // TEXT_MAX bounds the entries far below u32::MAX.
            let entries = text.len() * (GRAM - 2);
            let mut index = Index {
                last: std::collections::HashMap::with_capacity_and_hasher(entries, Default::default()),
                start: Vec::with_capacity(entries),
                before: Vec::with_capacity(entries),
            };
            Self::each(text, |key, at| {
                let entry = index.start.len() as u32;
                index.start.push(at as u32);
                let last = index.last.entry(key).or_insert((Self::NONE, false));
                index.before.push(std::mem::replace(&mut last.0, entry));
            });
            index
        });
        let Some((mut entry, marked)) = index.last.get_mut(&key).map(|l| (l.0, std::mem::replace(&mut l.1, true)))
        else {
            return;
        };
        if marked {
            return;
        }
        while entry != Self::NONE {
            let at = index.start[entry as usize] as usize;
            blank[at..at + n].iter_mut().for_each(|b| *b = true);
            entry = index.before[entry as usize];
        }
    }
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

    fn blank(text: &str, echoed: &[&str]) -> String {
        without_echoes(text, &Echoed::strings(echoed))
    }

    #[test]
    fn echoes_are_blanked_whatever_their_case_and_nothing_else() {
        assert_eq!(blank("The model `Billing` and billing", &["billing"]), "The model `       ` and        ");
        assert_eq!(blank("ünïcode gpt-4.1 ünïcode", &["GPT-4.1"]), "ünïcode         ünïcode");
        assert_eq!(blank("an ab echo", &["ab"]), "an ab echo", "too short to blank");
        assert_eq!(blank("modèle modèle", &["modèle"]), " ".repeat(15), "7 bytes each, and the space between");
        assert_eq!(blank("no echo here", &[]), "no echo here");
    }

    #[test]
    fn a_part_of_a_client_string_counts_as_its_echo() {
        // OpenAI names an unknown parameter; a relay cuts a long value short.
        let field = "rate limit, try again in 6h";
        let text = format!("Unrecognized request argument supplied: {field}");
        assert_eq!(blank(&text, &[field]), format!("Unrecognized request argument supplied: {}", " ".repeat(27)));
        let cut = "the prompt said: rate limit, try again i…";
        let left = blank(cut, &["please: rate limit, try again in 6h and more"]);
        assert_eq!(left.split_whitespace().collect::<Vec<_>>(), ["the", "prompt", "said", "…"]);
        // A string of the body, a key or a value, however deep.
        let body: serde_json::Map<String, Value> =
            serde_json::from_str(r#"{"model":"m","metadata":{"note":["insufficient credits"]},"billing":1}"#).unwrap();
        let echoed = Echoed { strings: &[], body: Some(&body) };
        assert_eq!(without_echoes("insufficient credits; billing", &echoed), format!("{};        ", " ".repeat(20)));
    }

    /// The definition, by brute force: every occurrence of each run the client's strings yield.
    fn blank_by_definition(text: &str, echoed: &[&str]) -> String {
        let mut end = text.len().min(TEXT_MAX);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        let lower = text[..end].to_ascii_lowercase().into_bytes();
        let mut runs: Vec<Vec<u8>> = Vec::new();
        for s in echoed {
            let s = s.trim().to_ascii_lowercase().into_bytes();
            match s.len() {
                0..3 => {}
                3..GRAM => runs.push(s),
                _ => {
                    runs.extend(s.windows(GRAM).map(<[u8]>::to_vec));
                    let words = s.split(|b| !b.is_ascii_alphanumeric());
                    runs.extend(words.filter(|w| (3..GRAM).contains(&w.len())).map(<[u8]>::to_vec));
                }
            }
        }
        let mut blank = vec![false; lower.len()];
        for run in &runs {
            for (at, window) in lower.windows(run.len()).enumerate() {
                if window == run.as_slice() {
                    blank[at..at + run.len()].fill(true);
                }
            }
        }
        let kept: Vec<u8> =
            text.as_bytes()[..end].iter().zip(&blank).map(|(&b, &g)| if g { b' ' } else { b }).collect();
        String::from_utf8_lossy(&kept).into_owned()
    }

    proptest::proptest! {
        #![proptest_config(proptest::test_runner::Config { cases: 4096, failure_persistence: None, ..Default::default() })]
        #[test]
        fn echoes_are_blanked_as_defined(
            text in "[abAB é.-]{0,48}|[ab ]{0,200}",
            echoed in proptest::collection::vec("[abAB é.-]{0,14}|[abAB ]{0,60}", 0..6),
        ) {
            let echoed: Vec<&str> = echoed.iter().map(String::as_str).collect();
            proptest::prop_assert_eq!(blank(&text, &echoed), blank_by_definition(&text, &echoed));
        }
    }

    #[test]
    fn a_run_repeated_by_the_client_is_blanked_once() {
        // Every start of the answer is a start of the same runs: a walk over them per byte of
        // the client's text would be 16K times 64K steps.
        let text = "a".repeat(TEXT_MAX);
        let echo = "a".repeat(64 * 1024);
        assert_eq!(blank(&text, &[&echo]), " ".repeat(TEXT_MAX));
    }

    #[test]
    fn the_answer_read_is_bounded_whatever_its_size() {
        let long = "x".repeat(TEXT_MAX + 100) + "é";
        assert_eq!(blank(&long, &["rate limit"]).len(), TEXT_MAX);
    }

    #[test]
    fn empty_body_gets_a_readable_message() {
        let c = Classifier::default();
        let out = c.classify(&Observed { status: Some(502), ..Default::default() }, 0);
        assert_eq!(out.reason, Reason::ServerError);
        assert_eq!(out.message, "HTTP 502 with an empty body");
    }
}
