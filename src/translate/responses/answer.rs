//! Non-streamed answers: OpenAI chat completion ⇄ Responses `response` object.

use super::*;

fn text(v: &Value, key: &str) -> String {
    v.get(key).and_then(Value::as_str).unwrap_or("").to_string()
}

/// OpenAI `chat.completion` → Responses `response` object. Item ids are made from the chat id.
pub fn chat_answer_to_responses(resp: &Value) -> Value {
    let chat_id = resp.get("id").and_then(Value::as_str).unwrap_or("");
    let choice = resp.pointer("/choices/0").unwrap_or(&Value::Null);
    let msg = choice.get("message").unwrap_or(&Value::Null);
    let (status, incomplete) = status_of_finish(choice.get("finish_reason").and_then(Value::as_str));
    let mut output = Vec::new();
    let reasoning = text(msg, "reasoning_content");
    if !reasoning.is_empty() {
        output.push(reasoning_item(&reasoning_id(chat_id), &reasoning));
    }
    let content = match msg.get("content") {
        Some(Value::Array(parts)) => parts.iter().filter_map(|p| p.get("text").and_then(Value::as_str)).collect(),
        _ => text(msg, "content"),
    };
    let refusal = msg.get("refusal").and_then(Value::as_str).filter(|r| !r.is_empty());
    if !content.is_empty() || refusal.is_some() {
        output.push(message_item(&message_id(chat_id), "completed", &content, refusal));
    }
    for (n, call) in msg.get("tool_calls").and_then(Value::as_array).into_iter().flatten().enumerate() {
        let f = call.get("function").unwrap_or(&Value::Null);
        output.push(call_item(&call_item_id(chat_id, n), "completed", &text(call, "id"), &text(f, "name"), &text(f, "arguments")));
    }
    let created = resp.get("created").and_then(Value::as_i64).unwrap_or(0);
    let model = resp.get("model").cloned().unwrap_or(json!(""));
    let usage = usage_to_responses(resp.get("usage").unwrap_or(&Value::Null));
    let mut out = response_object(&response_id(chat_id), created, &model, status, output, usage, incomplete);
    out["output_text"] = json!(content);
    out
}

/// Responses `response` object → OpenAI `chat.completion`.
pub fn responses_answer_to_chat(resp: &Value) -> Value {
    let (mut content, mut reasoning, mut refusal) = (String::new(), Vec::new(), String::new());
    let mut calls = Vec::new();
    for item in resp.get("output").and_then(Value::as_array).into_iter().flatten() {
        match item.get("type").and_then(Value::as_str) {
            Some("message") => {
                for part in item.get("content").and_then(Value::as_array).into_iter().flatten() {
                    match part.get("type").and_then(Value::as_str) {
                        Some("output_text") => content.push_str(&text(part, "text")),
                        Some("refusal") => refusal.push_str(&text(part, "refusal")),
                        _ => {}
                    }
                }
            }
            Some("reasoning") => {
                let summary = item.get("summary").and_then(Value::as_array).into_iter().flatten();
                let full = item.get("content").and_then(Value::as_array).into_iter().flatten();
                let texts: Vec<String> = summary.map(|p| text(p, "text")).collect();
                // The summary when there is one, else the raw reasoning text (open models).
                let texts = if texts.is_empty() { full.map(|p| text(p, "text")).collect() } else { texts };
                reasoning.extend(texts.into_iter().filter(|t| !t.is_empty()));
            }
            Some("function_call") => calls.push(json!({
                "id": text(item, "call_id"),
                "type": "function",
                "function": {"name": text(item, "name"), "arguments": text(item, "arguments")},
            })),
            _ => {}
        }
    }
    let incomplete = resp.pointer("/incomplete_details/reason").and_then(Value::as_str);
    let finish = finish_of_status(incomplete, !calls.is_empty());
    let mut message = json!({
        "role": "assistant",
        "content": if content.is_empty() && !calls.is_empty() { Value::Null } else { json!(content) },
    });
    if !reasoning.is_empty() {
        message["reasoning_content"] = json!(reasoning.join("\n\n"));
    }
    if !refusal.is_empty() {
        message["refusal"] = json!(refusal);
    }
    if !calls.is_empty() {
        message["tool_calls"] = Value::Array(calls);
    }
    let mut out = json!({
        "id": resp.get("id").cloned().unwrap_or(json!("")),
        "object": "chat.completion",
        "created": resp.get("created_at").and_then(Value::as_i64).unwrap_or_else(|| chrono::Utc::now().timestamp()),
        "model": resp.get("model").cloned().unwrap_or(json!("")),
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
    });
    let usage = usage_to_chat(resp.get("usage").unwrap_or(&Value::Null));
    if !usage.is_null() {
        out["usage"] = usage;
    }
    out
}
