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
        output.push(call_item(
            &call_item_id(chat_id, n),
            "completed",
            &text(call, "id"),
            &text(f, "name"),
            &text(f, "arguments"),
        ));
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

#[cfg(test)]
mod tests {
    use super::*;

    fn chat_answer() -> Value {
        json!({
            "id": "chatcmpl-abc", "object": "chat.completion", "created": 1741569952, "model": "deepseek-reasoner",
            "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                "role": "assistant", "content": "Checking.", "reasoning_content": "Need ls.",
                "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "ls", "arguments": "{\"d\":\"/\"}"}},
                    {"id": "call_2", "type": "function", "function": {"name": "du", "arguments": "{}"}}]}}],
            "usage": {"prompt_tokens": 20, "completion_tokens": 9, "total_tokens": 29,
                      "prompt_tokens_details": {"cached_tokens": 16}, "completion_tokens_details": {"reasoning_tokens": 3}},
        })
    }

    #[test]
    fn a_chat_answer_becomes_a_response_object() {
        assert_eq!(
            chat_answer_to_responses(&chat_answer()),
            json!({
                "id": "resp_abc", "object": "response", "created_at": 1741569952, "status": "completed", "error": null,
                "incomplete_details": null, "model": "deepseek-reasoner",
                "output": [
                    {"type": "reasoning", "id": "rs_abc", "summary": [{"type": "summary_text", "text": "Need ls."}]},
                    {"type": "message", "id": "msg_abc", "status": "completed", "role": "assistant",
                     "content": [{"type": "output_text", "text": "Checking.", "annotations": []}]},
                    {"type": "function_call", "id": "fc_abc_0", "status": "completed", "call_id": "call_1", "name": "ls", "arguments": "{\"d\":\"/\"}"},
                    {"type": "function_call", "id": "fc_abc_1", "status": "completed", "call_id": "call_2", "name": "du", "arguments": "{}"},
                ],
                "parallel_tool_calls": true, "tool_choice": "auto", "tools": [],
                "usage": {"input_tokens": 20, "input_tokens_details": {"cached_tokens": 16}, "output_tokens": 9,
                          "output_tokens_details": {"reasoning_tokens": 3}, "total_tokens": 29},
                "output_text": "Checking.",
            })
        );
    }

    #[test]
    fn a_cut_or_filtered_chat_answer_is_an_incomplete_response() {
        for (finish, reason) in [("length", "max_output_tokens"), ("content_filter", "content_filter")] {
            let chat = json!({"id": "chatcmpl-x", "created": 1, "model": "m",
                              "choices": [{"index": 0, "finish_reason": finish, "message": {"role": "assistant", "content": "Par"}}]});
            let r = chat_answer_to_responses(&chat);
            assert_eq!((&r["status"], &r["incomplete_details"]), (&json!("incomplete"), &json!({"reason": reason})));
            assert_eq!((&r["output_text"], &r["usage"]), (&json!("Par"), &Value::Null));
            assert_eq!(responses_answer_to_chat(&r)["choices"][0]["finish_reason"], finish);
        }
    }

    #[test]
    fn a_response_object_becomes_a_chat_answer() {
        let resp = json!({
            "id": "resp_1", "object": "response", "created_at": 1741290958, "status": "completed", "model": "o4-mini",
            "output": [
                {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "One."}, {"type": "summary_text", "text": "Two."}]},
                {"type": "web_search_call", "id": "ws_1", "status": "completed"},
                {"type": "message", "id": "msg_1", "status": "completed", "role": "assistant",
                 "content": [{"type": "output_text", "text": "Hello", "annotations": []}, {"type": "output_text", "text": " there", "annotations": []}]},
                {"type": "function_call", "id": "fc_1", "call_id": "call_9", "name": "ls", "arguments": "{}", "status": "completed"},
            ],
            "usage": {"input_tokens": 37, "input_tokens_details": {"cached_tokens": 5}, "output_tokens": 11,
                      "output_tokens_details": {"reasoning_tokens": 4}, "total_tokens": 48},
        });
        assert_eq!(
            responses_answer_to_chat(&resp),
            json!({
                "id": "resp_1", "object": "chat.completion", "created": 1741290958, "model": "o4-mini",
                "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                    "role": "assistant", "content": "Hello there", "reasoning_content": "One.\n\nTwo.",
                    "tool_calls": [{"id": "call_9", "type": "function", "function": {"name": "ls", "arguments": "{}"}}]}}],
                "usage": {"prompt_tokens": 37, "completion_tokens": 11, "total_tokens": 48,
                          "prompt_tokens_details": {"cached_tokens": 5}, "completion_tokens_details": {"reasoning_tokens": 4}},
            })
        );
        let text_only = json!({"id": "r", "created_at": 2, "model": "m", "status": "completed",
                               "output": [{"type": "message", "content": [{"type": "output_text", "text": "ok"}]}]});
        let chat = responses_answer_to_chat(&text_only);
        assert_eq!((&chat["choices"][0]["finish_reason"], chat.get("usage")), (&json!("stop"), None));
        assert_eq!(chat["choices"][0]["message"], json!({"role": "assistant", "content": "ok"}));
    }

    #[test]
    fn a_chat_answer_survives_the_round_trip_through_responses() {
        let chat = chat_answer();
        let back = responses_answer_to_chat(&chat_answer_to_responses(&chat));
        assert_eq!(back["choices"], chat["choices"]);
        assert_eq!(back["usage"], chat["usage"]);
        assert_eq!((&back["created"], &back["model"]), (&chat["created"], &chat["model"]));
        let plain = json!({"id": "chatcmpl-p", "created": 3, "model": "m",
                           "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "Hi"}}],
                           "usage": {"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3}});
        let back = responses_answer_to_chat(&chat_answer_to_responses(&plain));
        assert_eq!(back["choices"], plain["choices"]);
        assert_eq!(
            back["usage"],
            json!({"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3,
                   "prompt_tokens_details": {"cached_tokens": 0}, "completion_tokens_details": {"reasoning_tokens": 0}})
        );
    }
}
