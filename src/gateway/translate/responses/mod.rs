//! Translation between the OpenAI Responses API and OpenAI chat completions, both directions:
//! requests (`request`), whole answers (`answer`) and streams (`stream`). The chat side is rota's
//! hub format and may carry reasoning as the de-facto `reasoning_content` string (DeepSeek,
//! vLLM), which maps to Responses `reasoning` items with a `summary_text` summary.
//! `docs/translation.md` lists every field and what happens to it.

pub mod answer;
pub mod request;
pub mod stream;

pub use answer::{chat_answer_to_responses, responses_answer_to_chat};
pub use request::{chat_to_responses, responses_to_chat};
pub use stream::{ChatToResponses, ResponsesToChat};

use serde_json::{Value, json};

/// The part of a chat completion id that names it (`chatcmpl-abc` → `abc`), from which the
/// Responses ids are made: the same chat answer always gives the same ids.
fn id_stem(chat_id: &str) -> &str {
    chat_id.strip_prefix("chatcmpl-").unwrap_or(chat_id)
}

fn response_id(chat_id: &str) -> String {
    format!("resp_{}", id_stem(chat_id))
}

fn message_id(chat_id: &str) -> String {
    format!("msg_{}", id_stem(chat_id))
}

fn reasoning_id(chat_id: &str) -> String {
    format!("rs_{}", id_stem(chat_id))
}

fn call_item_id(chat_id: &str, n: usize) -> String {
    format!("fc_{}_{n}", id_stem(chat_id))
}

fn int(v: &Value, pointer: &str) -> i64 {
    v.pointer(pointer).and_then(Value::as_i64).unwrap_or(0)
}

/// Chat `usage` → Responses `usage`.
fn usage_to_responses(u: &Value) -> Value {
    if !u.is_object() {
        return Value::Null;
    }
    let (input, output) = (int(u, "/prompt_tokens"), int(u, "/completion_tokens"));
    let total = u.get("total_tokens").and_then(Value::as_i64).unwrap_or(input.saturating_add(output));
    json!({
        "input_tokens": input,
        "input_tokens_details": {"cached_tokens": int(u, "/prompt_tokens_details/cached_tokens")},
        "output_tokens": output,
        "output_tokens_details": {"reasoning_tokens": int(u, "/completion_tokens_details/reasoning_tokens")},
        "total_tokens": total,
    })
}

/// Responses `usage` → chat `usage`.
fn usage_to_chat(u: &Value) -> Value {
    if !u.is_object() {
        return Value::Null;
    }
    let (input, output) = (int(u, "/input_tokens"), int(u, "/output_tokens"));
    let total = u.get("total_tokens").and_then(Value::as_i64).unwrap_or(input.saturating_add(output));
    json!({
        "prompt_tokens": input,
        "completion_tokens": output,
        "total_tokens": total,
        "prompt_tokens_details": {"cached_tokens": int(u, "/input_tokens_details/cached_tokens")},
        "completion_tokens_details": {"reasoning_tokens": int(u, "/output_tokens_details/reasoning_tokens")},
    })
}

/// A chat `finish_reason` as a Responses `status` and `incomplete_details`.
fn status_of_finish(finish: Option<&str>) -> (&'static str, Value) {
    match finish {
        Some("length") => ("incomplete", json!({"reason": "max_output_tokens"})),
        Some("content_filter") => ("incomplete", json!({"reason": "content_filter"})),
        _ => ("completed", Value::Null),
    }
}

/// A Responses `incomplete_details.reason` (or none) and whether any function was called, as
/// a chat `finish_reason`.
fn finish_of_status(incomplete: Option<&str>, called: bool) -> &'static str {
    match incomplete {
        Some("max_output_tokens") => "length",
        Some("content_filter") => "content_filter",
        _ if called => "tool_calls",
        _ => "stop",
    }
}

/// A whole Responses `response` object.
fn response_object(
    id: &str,
    created_at: i64,
    model: &Value,
    status: &str,
    output: Vec<Value>,
    usage: Value,
    incomplete: Value,
) -> Value {
    json!({
        "id": id,
        "object": "response",
        "created_at": created_at,
        "status": status,
        "error": null,
        "incomplete_details": incomplete,
        "model": model,
        "output": output,
        "parallel_tool_calls": true,
        "tool_choice": "auto",
        "tools": [],
        "usage": usage,
    })
}

fn message_item(id: &str, status: &str, text: &str, refusal: Option<&str>) -> Value {
    let mut content = Vec::new();
    if !text.is_empty() || refusal.is_none() {
        content.push(json!({"type": "output_text", "text": text, "annotations": []}));
    }
    if let Some(r) = refusal {
        content.push(json!({"type": "refusal", "refusal": r}));
    }
    json!({"type": "message", "id": id, "status": status, "role": "assistant", "content": content})
}

fn reasoning_item(id: &str, text: &str) -> Value {
    json!({"type": "reasoning", "id": id, "summary": [{"type": "summary_text", "text": text}]})
}

fn call_item(id: &str, status: &str, call_id: &str, name: &str, arguments: &str) -> Value {
    json!({"type": "function_call", "id": id, "status": status, "call_id": call_id, "name": name, "arguments": arguments})
}
