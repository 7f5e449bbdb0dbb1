//! Request bodies: OpenAI chat completions ⇄ Anthropic messages.

use super::{DEFAULT_MAX_TOKENS, Translated, Untranslatable};
use serde_json::{Map, Value, json};

/// The text of a message's content: a string, or its parts' `text`, one per line.
pub fn text_of(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(parts) => {
            parts.iter().filter_map(|p| p.get("text").and_then(Value::as_str)).collect::<Vec<_>>().join("\n")
        }
        _ => String::new(),
    }
}

/// Lists a dropped field once.
fn note(dropped: &mut Vec<String>, what: &str) {
    if !dropped.iter().any(|d| d == what) {
        dropped.push(what.to_string());
    }
}

/// Anthropic's prompt-caching markers (`cache_control` on system, message and tool blocks):
/// an OpenAI-format provider caches long prompts by itself, with no marker to carry them.
fn note_cache_control(v: &Value, dropped: &mut Vec<String>) {
    let marked = |b: &Value| b.get("cache_control").is_some();
    if marked(v) || v.as_array().is_some_and(|blocks| blocks.iter().any(marked)) {
        note(dropped, "cache_control");
    }
}

fn fail<T>(why: impl Into<String>) -> Result<T, Untranslatable> {
    Err(Untranslatable(why.into()))
}

/// An OpenAI image part's URL as an Anthropic image source.
fn image_source(url: &str) -> Value {
    if let Some(rest) = url.strip_prefix("data:")
        && let Some((meta, data)) = rest.split_once(",")
    {
        let media_type = meta.trim_end_matches(";base64");
        return json!({"type": "base64", "media_type": media_type, "data": data});
    }
    json!({"type": "url", "url": url})
}

fn chat_part_to_block(part: &Value) -> Result<Value, Untranslatable> {
    match part.get("type").and_then(Value::as_str) {
        Some("text") => Ok(json!({"type": "text", "text": part.get("text").cloned().unwrap_or(json!(""))})),
        Some("image_url") => {
            let url = part.pointer("/image_url/url").and_then(Value::as_str).unwrap_or("");
            Ok(json!({"type": "image", "source": image_source(url)}))
        }
        other => fail(format!("content part type {:?} has no Anthropic counterpart", other.unwrap_or("?"))),
    }
}

/// Anthropic wants alternating roles: consecutive messages of one role are merged.
fn push_message(out: &mut Vec<Value>, role: &str, mut blocks: Vec<Value>) {
    if let Some(last) = out.last_mut().filter(|m| m["role"] == role)
        && let Some(existing) = last.get_mut("content").and_then(Value::as_array_mut)
    {
        existing.append(&mut blocks);
        return;
    }
    out.push(json!({"role": role, "content": blocks}));
}

/// OpenAI chat completions request → Anthropic messages request.
pub fn chat_to_messages(req: &Map<String, Value>) -> Result<Translated, Untranslatable> {
    let mut out = Map::new();
    let mut dropped = Vec::new();
    let (system, messages) = chat_messages_to_anthropic(req)?;
    if !system.is_empty() {
        out.insert("system".into(), json!(system.join("\n\n")));
    }
    out.insert("messages".into(), Value::Array(messages));
    let max = req.get("max_completion_tokens").or_else(|| req.get("max_tokens")).cloned();
    out.insert("max_tokens".into(), max.unwrap_or(json!(DEFAULT_MAX_TOKENS)));

    for (key, value) in req {
        match key.as_str() {
            "messages" | "max_tokens" | "max_completion_tokens" => {}
            "temperature" if value.as_f64().is_some_and(|t| t > 1.0) => {
                return fail("temperature above 1 (Anthropic accepts 0 to 1)");
            }
            "model" | "temperature" | "top_p" | "stream" => {
                out.insert(key.clone(), value.clone());
            }
            "stop" => {
                let seqs = match value {
                    Value::String(s) => json!([s]),
                    Value::Null => continue,
                    other => other.clone(),
                };
                out.insert("stop_sequences".into(), seqs);
            }
            "user" => {
                out.insert("metadata".into(), json!({"user_id": value}));
            }
            "tools" => {
                out.insert("tools".into(), Value::Array(tools_to_anthropic(value)));
            }
            "tool_choice" => {
                out.insert("tool_choice".into(), tool_choice_to_anthropic(value, req)?);
            }
            "parallel_tool_calls" if !req.contains_key("tool_choice") && value == &json!(false) => {
                out.insert("tool_choice".into(), json!({"type": "auto", "disable_parallel_tool_use": true}));
            }
            "parallel_tool_calls" | "stream_options" => {}
            "n" if value.as_u64().is_some_and(|n| n > 1) => {
                return fail("n > 1 (several choices) has no Anthropic counterpart");
            }
            "n" => {}
            "response_format" if value.get("type").and_then(Value::as_str) != Some("text") => {
                return fail("response_format (JSON mode) has no Anthropic counterpart");
            }
            "logprobs" | "top_logprobs" if value != &json!(false) && !value.is_null() => {
                return fail(format!("{key} has no Anthropic counterpart"));
            }
            _ => dropped.push(key.clone()),
        }
    }
    Ok(Translated { body: out, dropped })
}

/// A chat request's messages as Anthropic's: the system and developer messages' texts (the
/// `system` prompt), and the conversation, a tool's result in a user turn.
fn chat_messages_to_anthropic(req: &Map<String, Value>) -> Result<(Vec<String>, Vec<Value>), Untranslatable> {
    let mut system: Vec<String> = Vec::new();
    let mut messages: Vec<Value> = Vec::new();
    for m in req.get("messages").and_then(Value::as_array).into_iter().flatten() {
        let role = m.get("role").and_then(Value::as_str).unwrap_or("");
        let content = m.get("content").unwrap_or(&Value::Null);
        match role {
            "system" | "developer" => system.push(text_of(content)),
            "user" => {
                let blocks = match content {
                    Value::String(s) => vec![json!({"type": "text", "text": s})],
                    Value::Array(parts) => parts.iter().map(chat_part_to_block).collect::<Result<_, _>>()?,
                    _ => vec![],
                };
                push_message(&mut messages, "user", blocks);
            }
            "assistant" => push_message(&mut messages, "assistant", assistant_to_blocks(m, content)?),
            "tool" => {
                let block = json!({
                    "type": "tool_result",
                    "tool_use_id": m.get("tool_call_id").cloned().unwrap_or(json!("")),
                    "content": text_of(content),
                });
                push_message(&mut messages, "user", vec![block]);
            }
            other => return fail(format!("message role {other:?} has no Anthropic counterpart")),
        }
    }
    Ok((system, messages))
}

/// An assistant message as Anthropic blocks: its text, then a `tool_use` block per tool call.
fn assistant_to_blocks(m: &Value, content: &Value) -> Result<Vec<Value>, Untranslatable> {
    let mut blocks = Vec::new();
    let text = text_of(content);
    if !text.is_empty() {
        blocks.push(json!({"type": "text", "text": text}));
    }
    for call in m.get("tool_calls").and_then(Value::as_array).into_iter().flatten() {
        let args = call.pointer("/function/arguments").and_then(Value::as_str).unwrap_or("{}");
        let input: Value = serde_json::from_str(if args.trim().is_empty() { "{}" } else { args })
            .map_err(|e| Untranslatable(format!("tool call arguments are not JSON: {e}")))?;
        blocks.push(json!({
            "type": "tool_use",
            "id": call.get("id").cloned().unwrap_or(json!("")),
            "name": call.pointer("/function/name").cloned().unwrap_or(json!("")),
            "input": input,
        }));
    }
    Ok(blocks)
}

/// Chat's function tools as Anthropic tools.
fn tools_to_anthropic(tools: &Value) -> Vec<Value> {
    tools
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| {
            let f = t.get("function").unwrap_or(t);
            let mut tool = json!({"name": f.get("name").cloned().unwrap_or(json!("")),
                                  "input_schema": f.get("parameters").cloned().unwrap_or(json!({"type": "object"}))});
            if let Some(d) = f.get("description") {
                tool["description"] = d.clone();
            }
            tool
        })
        .collect()
}

/// Chat's `tool_choice` as Anthropic's, with `parallel_tool_calls: false` as
/// `disable_parallel_tool_use`.
fn tool_choice_to_anthropic(choice: &Value, req: &Map<String, Value>) -> Result<Value, Untranslatable> {
    let mut choice = match choice {
        Value::String(s) if s == "auto" => json!({"type": "auto"}),
        Value::String(s) if s == "required" => json!({"type": "any"}),
        Value::String(s) if s == "none" => json!({"type": "none"}),
        Value::Object(o) => {
            json!({"type": "tool", "name": o.get("function").and_then(|f| f.get("name")).cloned().unwrap_or(json!(""))})
        }
        other => return fail(format!("tool_choice {other} has no Anthropic counterpart")),
    };
    if req.get("parallel_tool_calls") == Some(&json!(false)) && choice["type"] != "none" {
        choice["disable_parallel_tool_use"] = json!(true);
    }
    Ok(choice)
}

fn block_to_chat_part(block: &Value) -> Result<Value, Untranslatable> {
    match block.get("type").and_then(Value::as_str) {
        Some("text") => Ok(json!({"type": "text", "text": block.get("text").cloned().unwrap_or(json!(""))})),
        Some("image") => {
            let src = block.get("source").unwrap_or(&Value::Null);
            let url = match src.get("type").and_then(Value::as_str) {
                Some("base64") => format!(
                    "data:{};base64,{}",
                    src.get("media_type").and_then(Value::as_str).unwrap_or("image/png"),
                    src.get("data").and_then(Value::as_str).unwrap_or("")
                ),
                _ => src.get("url").and_then(Value::as_str).unwrap_or("").to_string(),
            };
            Ok(json!({"type": "image_url", "image_url": {"url": url}}))
        }
        other => fail(format!("content block type {:?} has no OpenAI chat counterpart", other.unwrap_or("?"))),
    }
}

/// Anthropic messages request → OpenAI chat completions request.
pub fn messages_to_chat(req: &Map<String, Value>) -> Result<Translated, Untranslatable> {
    let mut out = Map::new();
    let mut dropped = Vec::new();
    let messages = anthropic_messages_to_chat(req, &mut dropped)?;
    out.insert("messages".into(), Value::Array(messages));
    for (key, value) in req {
        match key.as_str() {
            "messages" | "system" => {}
            "model" | "temperature" | "top_p" | "max_tokens" => {
                out.insert(key.clone(), value.clone());
            }
            "stream" => {
                out.insert("stream".into(), value.clone());
                if value == &json!(true) {
                    out.insert("stream_options".into(), json!({"include_usage": true}));
                }
            }
            "stop_sequences" => {
                out.insert("stop".into(), value.clone());
            }
            "metadata" => match value.get("user_id") {
                Some(u) => {
                    out.insert("user".into(), u.clone());
                }
                None => dropped.push("metadata".into()),
            },
            "tools" => {
                let tools = tools_to_chat(value, &mut dropped);
                out.insert("tools".into(), Value::Array(tools));
            }
            "tool_choice" => {
                out.insert("tool_choice".into(), tool_choice_to_chat(value)?);
                if value.get("disable_parallel_tool_use") == Some(&json!(true)) {
                    out.insert("parallel_tool_calls".into(), json!(false));
                }
            }
            _ => dropped.push(key.clone()),
        }
    }
    // Every tool was a server tool: a chat upstream refuses an empty list, and a tool choice
    // with no tools.
    if out.get("tools").and_then(Value::as_array).is_some_and(|t| t.is_empty())
        && req.get("tools").and_then(Value::as_array).is_some_and(|t| !t.is_empty())
    {
        out.remove("tools");
        if out.remove("tool_choice").is_some() {
            out.remove("parallel_tool_calls");
            note(&mut dropped, "tool_choice");
        }
    }
    Ok(Translated { body: out, dropped })
}

/// A messages request's system prompt and messages as chat messages.
fn anthropic_messages_to_chat(
    req: &Map<String, Value>,
    dropped: &mut Vec<String>,
) -> Result<Vec<Value>, Untranslatable> {
    let mut messages: Vec<Value> = Vec::new();
    if let Some(system) = req.get("system") {
        note_cache_control(system, dropped);
        messages.push(json!({"role": "system", "content": text_of(system)}));
    }
    for m in req.get("messages").and_then(Value::as_array).into_iter().flatten() {
        let role = m.get("role").and_then(Value::as_str).unwrap_or("");
        let blocks: Vec<Value> = match m.get("content") {
            Some(Value::String(s)) => vec![json!({"type": "text", "text": s})],
            Some(Value::Array(b)) => b.clone(),
            _ => vec![],
        };
        note_cache_control(&Value::Array(blocks.clone()), dropped);
        match role {
            // Claude Code sends instructions in the middle of a conversation as a `system`
            // message; chat takes a system message anywhere.
            "system" => messages.push(json!({"role": "system", "content": text_of(&Value::Array(blocks))})),
            "user" => user_blocks_to_chat(&blocks, &mut messages, dropped)?,
            "assistant" => messages.push(assistant_blocks_to_chat(&blocks, dropped)?),
            other => return fail(format!("message role {other:?} has no OpenAI chat counterpart")),
        }
    }
    Ok(messages)
}

/// A user turn as chat messages: a `tool` message per tool result, then one user message with
/// the other blocks (a single text as a string).
fn user_blocks_to_chat(
    blocks: &[Value],
    messages: &mut Vec<Value>,
    dropped: &mut Vec<String>,
) -> Result<(), Untranslatable> {
    let mut parts = Vec::new();
    for b in blocks {
        if b.get("type").and_then(Value::as_str) == Some("tool_result") {
            let content = b.get("content").unwrap_or(&Value::Null);
            let images = content.as_array().into_iter().flatten().any(|p| p["type"] != "text");
            if images {
                note(dropped, "non-text tool_result content");
            }
            messages.push(json!({
                "role": "tool",
                "tool_call_id": b.get("tool_use_id").cloned().unwrap_or(json!("")),
                "content": text_of(content),
            }));
        } else {
            parts.push(block_to_chat_part(b)?);
        }
    }
    if !parts.is_empty() {
        let all_text = parts.iter().all(|p| p["type"] == "text");
        let content = if all_text && parts.len() == 1 { parts[0]["text"].clone() } else { Value::Array(parts) };
        messages.push(json!({"role": "user", "content": content}));
    }
    Ok(())
}

/// An assistant turn as one chat message: its texts joined, its tool uses as tool calls (its
/// thinking blocks dropped).
fn assistant_blocks_to_chat(blocks: &[Value], dropped: &mut Vec<String>) -> Result<Value, Untranslatable> {
    let mut text = Vec::new();
    let mut calls = Vec::new();
    for b in blocks {
        match b.get("type").and_then(Value::as_str) {
            Some("text") => text.push(b.get("text").and_then(Value::as_str).unwrap_or("").to_string()),
            Some("tool_use") => calls.push(json!({
                "id": b.get("id").cloned().unwrap_or(json!("")),
                "type": "function",
                "function": {
                    "name": b.get("name").cloned().unwrap_or(json!("")),
                    "arguments": b.get("input").unwrap_or(&json!({})).to_string(),
                },
            })),
            Some("thinking") | Some("redacted_thinking") => note(dropped, "thinking blocks"),
            other => {
                return fail(format!("assistant block type {:?} has no OpenAI chat counterpart", other.unwrap_or("?")));
            }
        }
    }
    let mut msg =
        json!({"role": "assistant", "content": if text.is_empty() { Value::Null } else { json!(text.join("")) }});
    if !calls.is_empty() {
        msg["tool_calls"] = Value::Array(calls);
    }
    Ok(msg)
}

/// Anthropic's tools as chat function tools; a server tool (`web_search_20250305`,
/// `bash_20250124`, …) runs at Anthropic, and a chat model has nothing to run it with: dropped.
fn tools_to_chat(tools: &Value, dropped: &mut Vec<String>) -> Vec<Value> {
    let mut out = Vec::new();
    for t in tools.as_array().into_iter().flatten() {
        match t.get("type").and_then(Value::as_str) {
            None | Some("custom") => {}
            Some(other) => {
                note(dropped, &format!("tools[type={other}]"));
                continue;
            }
        }
        note_cache_control(t, dropped);
        let mut f = json!({"name": t.get("name").cloned().unwrap_or(json!("")),
                           "parameters": t.get("input_schema").cloned().unwrap_or(json!({"type": "object"}))});
        if let Some(d) = t.get("description") {
            f["description"] = d.clone();
        }
        out.push(json!({"type": "function", "function": f}));
    }
    out
}

/// Anthropic's `tool_choice` as chat's.
fn tool_choice_to_chat(choice: &Value) -> Result<Value, Untranslatable> {
    Ok(match choice.get("type").and_then(Value::as_str) {
        Some("auto") => json!("auto"),
        Some("any") => json!("required"),
        Some("none") => json!("none"),
        Some("tool") => {
            json!({"type": "function", "function": {"name": choice.get("name").cloned().unwrap_or(json!(""))}})
        }
        _ => return fail(format!("tool_choice {choice} has no OpenAI counterpart")),
    })
}
