//! Scrubbing secrets out of text that leaves rota: upstream error messages go to clients, logs
//! and `attempts.error`, and upstreams sometimes echo the key they were sent.

use regex::Regex;
use std::sync::LazyLock;

pub const MASK: &str = "[REDACTED]";

/// Shapes of well-known credentials: OpenAI/Anthropic/OpenRouter `sk-…`, Google `AIza…`,
/// rota agent keys `rk_…`, bearer tokens and JWTs.
static KEY_SHAPES: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?x)
        sk-[A-Za-z0-9_\-]{8,}
      | AIza[0-9A-Za-z_\-]{20,}
      | rk_[A-Za-z0-9_\-]{16,}
      | (?i:bearer)\s+[A-Za-z0-9_\-\.=]{8,}
      | eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]*",
    )
    .unwrap()
});

/// Replaces every given secret (exact, and the 12-character tail that providers often echo as
/// "…abcd1234efgh") and anything shaped like a credential.
pub fn redact(text: &str, secrets: &[&str]) -> String {
    let mut out = text.to_string();
    for s in secrets.iter().filter(|s| s.len() >= 8) {
        out = out.replace(s, MASK);
        if s.len() >= 16 {
            // The last 12 bytes, moved forward to a character boundary (never a panic).
            let cut = (s.len() - 12..s.len()).find(|&i| s.is_char_boundary(i)).unwrap_or(s.len());
            if s.len() - cut >= 8 {
                out = out.replace(&s[cut..], MASK);
            }
        }
    }
    KEY_SHAPES.replace_all(&out, MASK).into_owned()
}

/// At most `max` characters, cut on a character boundary, marked with `…` when cut.
pub fn truncate(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_string();
    }
    let mut out: String = text.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

/// The error and its causes, e.g. "error sending request: client error (Connect): tcp connect
/// error: Connection refused (os error 111)".
pub fn error_text(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts = vec![e.to_string()];
    let mut src = e.source();
    while let Some(s) = src {
        parts.push(s.to_string());
        src = s.source();
    }
    let mut text = parts.join(": ");
    if let Some(re) = e.downcast_ref::<reqwest::Error>()
        && re.is_timeout()
        && !text.contains("timed out")
    {
        text.push_str(" (timed out)");
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_secrets_and_their_echoed_tails_are_masked() {
        let key = "live-key-0123456789abcdefghij";
        let msg = format!("Incorrect API key provided: {key}. Also ****{}", &key[key.len() - 12..]);
        let out = redact(&msg, &[key]);
        assert!(!out.contains("0123456789abcdefghij") && !out.contains(&key[key.len() - 12..]), "{out}");
    }

    #[test]
    fn a_secret_ending_in_multibyte_characters_is_masked_without_a_panic() {
        // Its last 12 bytes begin inside the `é`.
        let key = "clé-secrète-0123456789-é01234567890";
        assert!(!key.is_char_boundary(key.len() - 12));
        assert_eq!(redact(&format!("echo: {key}"), &[key]), format!("echo: {MASK}"));
        assert_eq!(redact("…01234567890 was sent", &[key]), format!("…{MASK} was sent"));
    }

    #[test]
    fn credential_shapes_are_masked_without_knowing_the_secret() {
        let out = redact("key sk-proj-abcdefgh1234 and Bearer abc.def.ghi-123456 and AIzaSyA1234567890abcdefghij", &[]);
        assert_eq!(out, "key [REDACTED] and [REDACTED] and [REDACTED]");
        assert_eq!(redact("rate limit reached for gpt-4o", &[]), "rate limit reached for gpt-4o");
    }

    #[test]
    fn truncation_respects_character_boundaries() {
        assert_eq!(truncate("héllo", 10), "héllo");
        assert_eq!(truncate("héllo wörld", 5), "héll…");
        assert_eq!(truncate(&"x".repeat(600), 500).chars().count(), 500);
    }
}
