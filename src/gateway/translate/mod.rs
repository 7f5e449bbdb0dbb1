//! Translation between the OpenAI chat completions format and the Anthropic messages format,
//! and between chat and the OpenAI Responses API (`responses`), both directions, so failover may
//! cross providers of different wire formats.
//! `docs/translation.md` lists every field and what happens to it.

pub mod request;
pub mod response;
pub mod responses;
pub mod sse;
pub mod stream;

pub use request::{chat_to_messages, messages_to_chat};
pub use response::{chat_response_to_messages, messages_response_to_chat};
pub use responses::{
    ChatToResponses, ResponsesToChat, chat_answer_to_responses, chat_to_responses, responses_answer_to_chat,
    responses_to_chat,
};
pub use stream::StreamTranslator;

use serde_json::{Map, Value};

/// A request body in the other format, with the fields that had no counterpart and were
/// dropped (each is logged at `warn` by the gateway).
#[derive(Clone, Debug, PartialEq)]
pub struct Translated {
    pub body: Map<String, Value>,
    pub dropped: Vec<String>,
}

/// A request that cannot be expressed in the other format without changing its meaning: the
/// candidate is skipped (reason `wire_format`) with this explanation.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("cannot translate: {0}")]
pub struct Untranslatable(pub String);

/// The default `max_tokens` for an Anthropic request translated from a chat request that set
/// none (Anthropic requires it).
pub const DEFAULT_MAX_TOKENS: u64 = 4096;

/// An estimate of a messages request's input tokens where no provider counts them
/// (`count_tokens`, docs/gateway.md): a token for every 4 bytes of the text of `system`,
/// `messages` and `tools`, names included, and 1,600 for an image (what Anthropic counts for
/// the largest image it takes whole) rather than its encoded bytes.
pub fn estimate_tokens(body: &Map<String, Value>) -> u64 {
    const IMAGE_BYTES: usize = 1_600 * 4;
    fn bytes(v: &Value) -> usize {
        match v {
            Value::String(s) => s.len(),
            Value::Array(items) => items.iter().map(bytes).sum(),
            Value::Object(o) if o.get("type").and_then(Value::as_str) == Some("image") => IMAGE_BYTES,
            Value::Object(o) => o.iter().map(|(k, v)| k.len() + bytes(v)).sum(),
            other => other.to_string().len(),
        }
    }
    let total: usize = ["system", "messages", "tools"].iter().filter_map(|k| body.get(*k)).map(bytes).sum();
    total.div_ceil(4) as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_estimate_counts_text_not_the_bytes_of_an_image() {
        let body = |v: Value| v.as_object().unwrap().clone();
        // "user" 4 + "role" 4 + "content" 7 + "hello world!" 12 = 27 bytes → 7 tokens.
        let text = body(json!({"model": "m", "messages": [{"role": "user", "content": "hello world!"}]}));
        assert_eq!(estimate_tokens(&text), 7);
        let image = json!({"type": "image", "source": {"type": "base64", "data": "A".repeat(1_000_000)}});
        let with_image = body(json!({"messages": [{"role": "user", "content": [image]}]}));
        assert_eq!(estimate_tokens(&with_image), (4 + 4 + 7 + 6_400_u64).div_ceil(4));
        assert_eq!(estimate_tokens(&body(json!({"model": "m"}))), 0);
    }
}
