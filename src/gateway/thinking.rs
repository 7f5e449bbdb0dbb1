//! Signed thinking across models (docs/translation.md, "Thinking across models"). Anthropic signs
//! the thinking blocks of its answers, and a client sends them back in later turns; only the
//! provider that signed a block can verify it, and any other answers 400 "Invalid signature in
//! thinking block". rota notes which provider signed each block it relayed, drops from a request
//! the blocks another provider signed (or nobody did) before calling an Anthropic-format
//! provider, and retries once without any thinking when the upstream still refuses a signature.

use parking_lot::Mutex;
use serde_json::{Map, Value};
use sha2::Digest;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

/// How many signatures are remembered (the oldest are forgotten first): a few hundred bytes each.
const KEPT: usize = 20_000;

type Key = [u8; 16];

fn key(signature: &str) -> Key {
    let d = sha2::Sha256::digest(signature.as_bytes());
    d[..16].try_into().expect("16 of 32 bytes")
}

/// Which provider signed the thinking blocks rota relayed, by a digest of the signature.
#[derive(Default)]
pub struct Origins {
    inner: Mutex<Signers>,
}

/// The signer of each digest, and the digests oldest first.
type Signers = (HashMap<Key, Arc<str>>, VecDeque<Key>);

impl Origins {
    pub fn record<'a>(&self, provider: &str, signatures: impl IntoIterator<Item = &'a str>) {
        let provider: Arc<str> = provider.into();
        let mut guard = self.inner.lock();
        let (map, order) = &mut *guard;
        for s in signatures {
            let k = key(s);
            if map.insert(k, provider.clone()).is_none() {
                order.push_back(k);
            }
            while order.len() > KEPT {
                if let Some(old) = order.pop_front() {
                    map.remove(&old);
                }
            }
        }
    }

    fn of(&self, signature: &str) -> Option<Arc<str>> {
        self.inner.lock().0.get(&key(signature)).cloned()
    }

    /// The request without the thinking blocks `provider` cannot verify: unsigned ones, and
    /// those another provider signed. A block rota never saw is kept (the retry catches it).
    /// `None` when nothing is dropped.
    pub fn for_provider(&self, body: &Map<String, Value>, provider: &str) -> Option<Map<String, Value>> {
        strip(body, |block| match signature(block) {
            None => true,
            Some(s) => self.of(s).is_some_and(|p| &*p != provider),
        })
    }
}

/// A thinking block's signature (`redacted_thinking` carries its `data` instead); `None` when it
/// has none. `Some("")` is no signature either.
fn signature(block: &Value) -> Option<&str> {
    let field = match block.get("type").and_then(Value::as_str) {
        Some("thinking") => "signature",
        _ => "data",
    };
    block.get(field).and_then(Value::as_str).filter(|s| !s.is_empty())
}

fn is_thinking(block: &Value) -> bool {
    matches!(block.get("type").and_then(Value::as_str), Some("thinking" | "redacted_thinking"))
}

/// The request with no thinking block at all, for the one retry after a refused signature.
/// `None` when it has none.
pub fn without_thinking(body: &Map<String, Value>) -> Option<Map<String, Value>> {
    strip(body, |_| true)
}

/// The signatures of an Anthropic answer's thinking blocks, buffered (a `message`) or streamed
/// (a `signature_delta` event's data).
pub fn signatures(answer: &Value) -> Vec<&str> {
    if let Some(s) = answer.pointer("/delta/signature").and_then(Value::as_str) {
        return vec![s];
    }
    let blocks = answer.get("content").and_then(Value::as_array).into_iter().flatten();
    blocks.filter(|b| is_thinking(b)).filter_map(signature).collect()
}

/// Whether a 400's text says a thinking signature was refused.
pub fn refused_signature(status: Option<u16>, body: &[u8]) -> bool {
    let lower = String::from_utf8_lossy(body).to_ascii_lowercase();
    status == Some(400) && lower.contains("signature") && lower.contains("thinking")
}

/// Whether an assistant turn of the request holds a thinking block.
pub fn has_thinking(body: &Map<String, Value>) -> bool {
    let messages = body.get("messages").and_then(Value::as_array).into_iter().flatten();
    messages.filter_map(assistant_blocks).flatten().any(is_thinking)
}

/// The content blocks of an assistant message.
fn assistant_blocks(m: &Value) -> Option<&Vec<Value>> {
    m.get("content").and_then(Value::as_array).filter(|_| m["role"] == "assistant")
}

/// Drops the assistant turns' thinking blocks `drop` picks. An assistant message left empty goes.
/// When the turn in progress (the last assistant message, using a tool) loses its thinking,
/// thinking is switched off for the call (`thinking`, and the `context_management` edits that
/// need it, are removed): Anthropic refuses a tool loop whose last turn does not start with one.
fn strip(body: &Map<String, Value>, drop: impl Fn(&Value) -> bool) -> Option<Map<String, Value>> {
    let messages = body.get("messages")?.as_array()?;
    // Looked at first without a copy: most requests have nothing to drop.
    if !messages.iter().filter_map(assistant_blocks).flatten().any(|b| is_thinking(b) && drop(b)) {
        return None;
    }
    let last_assistant = messages.iter().rposition(|m| m["role"] == "assistant");
    let mut off = false;
    let mut kept = Vec::with_capacity(messages.len());
    for (i, m) in messages.iter().enumerate() {
        let Some(blocks) = assistant_blocks(m) else {
            kept.push(m.clone());
            continue;
        };
        let left: Vec<Value> = blocks.iter().filter(|b| !(is_thinking(b) && drop(b))).cloned().collect();
        if left.len() == blocks.len() {
            kept.push(m.clone());
            continue;
        }
        if Some(i) == last_assistant && !left.iter().any(is_thinking) {
            off = true;
        }
        if !left.is_empty() {
            let mut m = m.clone();
            m["content"] = Value::Array(left);
            kept.push(m);
        }
    }
    let mut out = body.clone();
    out.insert("messages".into(), Value::Array(kept));
    if off {
        out.remove("thinking");
        out.remove("context_management");
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn body(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    fn thinking(sig: &str) -> Value {
        json!({"type": "thinking", "thinking": "let me see", "signature": sig})
    }

    /// A tool loop: the last assistant turn used a tool, after an earlier answered turn.
    fn conversation(earlier: Value, current: Value) -> Map<String, Value> {
        body(json!({
            "model": "m", "max_tokens": 100,
            "thinking": {"type": "enabled", "budget_tokens": 2048},
            "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
            "messages": [
                {"role": "user", "content": "one"},
                {"role": "assistant", "content": [earlier, {"type": "text", "text": "done"}]},
                {"role": "user", "content": "two"},
                {"role": "assistant", "content": [current, {"type": "tool_use", "id": "t1", "name": "Read", "input": {}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "x"}]},
            ],
        }))
    }

    #[test]
    fn blocks_another_provider_signed_are_dropped_and_its_own_kept() {
        let origins = Origins::default();
        origins.record("anthropic", ["sig-a"]);
        origins.record("bedrock", ["sig-b"]);
        let req = conversation(thinking("sig-b"), thinking("sig-a"));
        assert_eq!(origins.for_provider(&req, "bedrock"), Some(conversation_without(&req, false)));
        let out = origins.for_provider(&req, "anthropic").unwrap();
        assert_eq!(out["messages"][1]["content"], json!([{"type": "text", "text": "done"}]));
        assert_eq!(out["messages"][3]["content"][0], thinking("sig-a"), "the turn in progress keeps its own");
        assert!(out.contains_key("thinking") && out.contains_key("context_management"));
        // Both blocks from the provider called: nothing to do.
        let own = conversation(thinking("sig-a"), thinking("sig-a"));
        assert_eq!(origins.for_provider(&own, "anthropic"), None);
        // A signature rota never saw is kept: the provider may well have signed it.
        let unknown = conversation(thinking("sig-z"), thinking("sig-a"));
        assert_eq!(origins.for_provider(&unknown, "anthropic"), None);
    }

    /// `req` with the thinking of the turn in progress (and of the earlier one when `earlier`)
    /// dropped, and thinking switched off.
    fn conversation_without(req: &Map<String, Value>, earlier: bool) -> Map<String, Value> {
        let mut out = req.clone();
        let messages = out["messages"].as_array_mut().unwrap();
        messages[3]["content"].as_array_mut().unwrap().remove(0);
        if earlier {
            messages[1]["content"].as_array_mut().unwrap().remove(0);
        }
        out.remove("thinking");
        out.remove("context_management");
        out
    }

    #[test]
    fn unsigned_blocks_never_reach_an_anthropic_provider() {
        let origins = Origins::default();
        let req = conversation(thinking(""), json!({"type": "thinking", "thinking": "hmm"}));
        let out = origins.for_provider(&req, "anthropic").unwrap();
        assert_eq!(out, conversation_without(&req, true));
    }

    #[test]
    fn the_retry_drops_every_thinking_block_and_an_emptied_turn() {
        let mut req = conversation(thinking("s1"), json!({"type": "redacted_thinking", "data": "opaque"}));
        req["messages"][1]["content"] = json!([thinking("s1")]);
        let out = without_thinking(&req).unwrap();
        let roles: Vec<&str> =
            out["messages"].as_array().unwrap().iter().map(|m| m["role"].as_str().unwrap()).collect();
        assert_eq!(roles, ["user", "user", "assistant", "user"], "the assistant turn of only thinking is gone");
        assert!(!out.contains_key("thinking"));
        assert_eq!(without_thinking(&out), None);
        assert_eq!(without_thinking(&body(json!({"messages": "not a list"}))), None);
    }

    #[test]
    fn thinking_stays_on_when_the_turn_in_progress_keeps_its_block() {
        let origins = Origins::default();
        origins.record("other", ["old"]);
        let req = conversation(thinking("old"), thinking("mine"));
        let out = origins.for_provider(&req, "anthropic").unwrap();
        assert!(out.contains_key("thinking"), "only an earlier turn lost its block");
    }

    #[test]
    fn signatures_are_read_from_answers_and_stream_events() {
        let message = json!({"type": "message", "content": [thinking("s1"), {"type": "text", "text": "hi"},
            {"type": "redacted_thinking", "data": "r1"}]});
        assert_eq!(signatures(&message), ["s1", "r1"]);
        let delta =
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta", "signature": "s2"}});
        assert_eq!(signatures(&delta), ["s2"]);
        assert!(signatures(&json!({"type": "message", "content": [{"type": "text", "text": "x"}]})).is_empty());
    }

    #[test]
    fn a_refused_signature_is_a_400_that_says_so() {
        let said = r#"{"type":"error","error":{"type":"invalid_request_error","message":"messages.1.content.0: Invalid `signature` in `thinking` block"}}"#;
        assert!(refused_signature(Some(400), said.as_bytes()));
        assert!(!refused_signature(Some(500), said.as_bytes()));
        assert!(!refused_signature(Some(400), br#"{"error":{"message":"max_tokens: too large"}}"#));
    }

    #[test]
    fn the_oldest_signatures_are_forgotten_first() {
        let origins = Origins::default();
        let sigs: Vec<String> = (0..KEPT + 5).map(|i| format!("s{i}")).collect();
        origins.record("p", sigs.iter().map(String::as_str));
        assert_eq!(origins.of("s0"), None);
        assert_eq!(origins.of("s5").as_deref(), Some("p"));
        assert_eq!(origins.inner.lock().0.len(), KEPT);
    }
}
