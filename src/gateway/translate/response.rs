//! Non-streamed responses: Anthropic message ⇄ OpenAI chat completion.

use serde_json::{Value, json};

pub(crate) fn finish_from_stop(stop: Option<&str>) -> &'static str {
    match stop {
        Some("max_tokens") => "length",
        Some("tool_use") => "tool_calls",
        Some("refusal") => "content_filter",
        _ => "stop",
    }
}

pub(crate) fn stop_from_finish(finish: Option<&str>) -> &'static str {
    match finish {
        Some("length") => "max_tokens",
        Some("tool_calls") | Some("function_call") => "tool_use",
        Some("content_filter") => "refusal",
        _ => "end_turn",
    }
}

/// The whole prompt of an Anthropic `usage`: `input_tokens` leaves out cached tokens, which an
/// OpenAI client counts in `prompt_tokens`.
pub fn prompt_tokens(usage: &Value) -> i64 {
    ["input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens"]
        .iter()
        .filter_map(|k| usage.get(*k).and_then(Value::as_i64))
        .fold(0, i64::saturating_add)
}

fn now_secs() -> i64 {
    chrono::Utc::now().timestamp()
}

/// Anthropic `message` → OpenAI `chat.completion`.
pub fn messages_response_to_chat(resp: &Value) -> Value {
    let mut text = String::new();
    let mut reasoning = String::new();
    let mut calls = Vec::new();
    for b in resp.get("content").and_then(Value::as_array).into_iter().flatten() {
        match b.get("type").and_then(Value::as_str) {
            Some("text") => text.push_str(b.get("text").and_then(Value::as_str).unwrap_or("")),
            Some("thinking") => reasoning.push_str(b.get("thinking").and_then(Value::as_str).unwrap_or("")),
            Some("tool_use") => calls.push(json!({
                "id": b.get("id").cloned().unwrap_or(json!("")),
                "type": "function",
                "function": {"name": b.get("name").cloned().unwrap_or(json!("")),
                             "arguments": b.get("input").unwrap_or(&json!({})).to_string()},
            })),
            _ => {}
        }
    }
    let mut message = json!({"role": "assistant", "content": if text.is_empty() && !calls.is_empty() { Value::Null } else { json!(text) }});
    if !calls.is_empty() {
        message["tool_calls"] = Value::Array(calls);
    }
    // The thinking a chat client can read, in the field DeepSeek, vLLM and others use.
    if !reasoning.is_empty() {
        message["reasoning_content"] = json!(reasoning);
    }
    let input = resp.get("usage").map_or(0, prompt_tokens);
    let output = resp.pointer("/usage/output_tokens").and_then(Value::as_i64).unwrap_or(0);
    json!({
        "id": resp.get("id").cloned().unwrap_or(json!("")),
        "object": "chat.completion",
        "created": now_secs(),
        "model": resp.get("model").cloned().unwrap_or(json!("")),
        "choices": [{
            "index": 0,
            "message": message,
            "finish_reason": finish_from_stop(resp.get("stop_reason").and_then(Value::as_str)),
        }],
        "usage": {"prompt_tokens": input, "completion_tokens": output, "total_tokens": input.saturating_add(output)},
    })
}

/// OpenAI `chat.completion` → Anthropic `message`.
pub fn chat_response_to_messages(resp: &Value) -> Value {
    let choice = resp.pointer("/choices/0").unwrap_or(&Value::Null);
    let msg = choice.get("message").unwrap_or(&Value::Null);
    let mut content = Vec::new();
    if let Some(t) = msg.get("content").and_then(Value::as_str).filter(|t| !t.is_empty()) {
        content.push(json!({"type": "text", "text": t}));
    }
    for call in msg.get("tool_calls").and_then(Value::as_array).into_iter().flatten() {
        let args = call.pointer("/function/arguments").and_then(Value::as_str).unwrap_or("{}");
        content.push(json!({
            "type": "tool_use",
            "id": call.get("id").cloned().unwrap_or(json!("")),
            "name": call.pointer("/function/name").cloned().unwrap_or(json!("")),
            "input": serde_json::from_str::<Value>(args).unwrap_or(json!({})),
        }));
    }
    json!({
        "id": resp.get("id").cloned().unwrap_or(json!("")),
        "type": "message",
        "role": "assistant",
        "model": resp.get("model").cloned().unwrap_or(json!("")),
        "content": content,
        "stop_reason": stop_from_finish(choice.get("finish_reason").and_then(Value::as_str)),
        "stop_sequence": null,
        "usage": {
            "input_tokens": resp.pointer("/usage/prompt_tokens").and_then(Value::as_i64).unwrap_or(0),
            "output_tokens": resp.pointer("/usage/completion_tokens").and_then(Value::as_i64).unwrap_or(0),
        },
    })
}
