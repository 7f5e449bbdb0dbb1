//! Request bodies: OpenAI Responses ⇄ OpenAI chat completions.

use crate::gateway::translate::{Translated, Untranslatable};
use serde_json::{Map, Value, json};

fn fail<T>(why: impl Into<String>) -> Result<T, Untranslatable> {
    Err(Untranslatable(why.into()))
}

/// Lists `what` once.
fn note(dropped: &mut Vec<String>, what: impl Into<String>) {
    let what = what.into();
    if !dropped.contains(&what) {
        dropped.push(what);
    }
}

fn str_of<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or("")
}

fn is_set(v: &Value) -> bool {
    !v.is_null()
}

/// The text of a string or of an array of text parts, joined with `sep`.
fn joined_text(content: &Value, sep: &str) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(parts) => {
            parts.iter().filter_map(|p| p.get("text").and_then(Value::as_str)).collect::<Vec<_>>().join(sep)
        }
        _ => String::new(),
    }
}

// ---------------------------------------------------------------------------------------------
// Responses → chat

/// A Responses content part as a chat content part.
fn part_to_chat(part: &Value) -> Result<Value, Untranslatable> {
    match part.get("type").and_then(Value::as_str) {
        Some("input_text") | Some("output_text") | Some("text") => {
            Ok(json!({"type": "text", "text": str_of(part, "text")}))
        }
        Some("input_image") => {
            let Some(url) = part.get("image_url").and_then(Value::as_str) else {
                return fail("input_image without image_url (a file_id) has no chat counterpart");
            };
            let mut image = json!({"url": url});
            if let Some(d) = part.get("detail").filter(|d| is_set(d)) {
                image["detail"] = d.clone();
            }
            Ok(json!({"type": "image_url", "image_url": image}))
        }
        Some("input_file") => fail("input_file parts have no chat counterpart"),
        other => fail(format!("content part type {:?} has no chat counterpart", other.unwrap_or("?"))),
    }
}

/// A `message` item (or an item with a role and no type) as a chat message.
fn message_to_chat(item: &Value) -> Result<Value, Untranslatable> {
    let role = str_of(item, "role");
    let content = item.get("content").unwrap_or(&Value::Null);
    let parts: Vec<Value> = match content {
        Value::String(s) => vec![json!({"type": "text", "text": s})],
        Value::Array(parts) => {
            let mut out = Vec::new();
            for p in parts {
                // An assistant's refusal, kept where chat keeps it.
                if p.get("type").and_then(Value::as_str) == Some("refusal") {
                    continue;
                }
                out.push(part_to_chat(p)?);
            }
            out
        }
        Value::Null => vec![],
        other => return fail(format!("message content {other} is neither a string nor parts")),
    };
    let all_text = parts.iter().all(|p| p["type"] == "text");
    let text = || parts.iter().filter_map(|p| p["text"].as_str()).collect::<Vec<_>>().join("");
    match role {
        // rota's chat upstreams (vLLM, Ollama, DeepSeek, …) do not all know `developer`.
        "system" | "developer" if all_text => {
            Ok(json!({"role": "system", "content": joined_text(&Value::Array(parts), "\n")}))
        }
        "system" | "developer" => fail("an image in a system or developer message has no chat counterpart"),
        "user" if content.is_string() || (all_text && parts.len() == 1) => {
            Ok(json!({"role": "user", "content": text()}))
        }
        "user" => Ok(json!({"role": "user", "content": parts})),
        "assistant" if all_text => {
            let mut msg = json!({"role": "assistant", "content": text()});
            let refusal: Vec<&str> = content
                .as_array()
                .into_iter()
                .flatten()
                .filter(|p| p["type"] == "refusal")
                .filter_map(|p| p.get("refusal").and_then(Value::as_str))
                .collect();
            if !refusal.is_empty() {
                msg["refusal"] = json!(refusal.join(""));
            }
            Ok(msg)
        }
        "assistant" => fail("an image in an assistant message has no chat counterpart"),
        other => fail(format!("message role {other:?} has no chat counterpart")),
    }
}

fn function_call_to_chat(item: &Value) -> Value {
    json!({
        "id": str_of(item, "call_id"),
        "type": "function",
        "function": {"name": str_of(item, "name"), "arguments": str_of(item, "arguments")},
    })
}

/// The `input` of a Responses request as chat messages.
fn input_to_messages(
    input: &Value,
    messages: &mut Vec<Value>,
    dropped: &mut Vec<String>,
) -> Result<(), Untranslatable> {
    let items = match input {
        Value::String(s) => {
            messages.push(json!({"role": "user", "content": s}));
            return Ok(());
        }
        Value::Array(items) => items,
        Value::Null => return Ok(()),
        other => return fail(format!("input {other} is neither a string nor items")),
    };
    // Whether the last chat message is an assistant message that function calls may join.
    let mut open_assistant = false;
    for item in items {
        let kind = item.get("type").and_then(Value::as_str);
        match kind {
            Some("message") | None if item.get("role").is_some() => {
                let msg = message_to_chat(item)?;
                open_assistant = msg["role"] == "assistant";
                messages.push(msg);
            }
            Some("function_call") => {
                let call = function_call_to_chat(item);
                match messages.last_mut().filter(|_| open_assistant) {
                    Some(last) => match last.get_mut("tool_calls").and_then(Value::as_array_mut) {
                        Some(calls) => calls.push(call),
                        None => last["tool_calls"] = json!([call]),
                    },
                    None => {
                        messages.push(json!({"role": "assistant", "content": null, "tool_calls": [call]}));
                        open_assistant = true;
                    }
                }
            }
            Some("function_call_output") => {
                let output = item.get("output").unwrap_or(&Value::Null);
                messages.push(json!({"role": "tool", "tool_call_id": str_of(item, "call_id"), "content": joined_text(output, "")}));
                open_assistant = false;
            }
            Some("reasoning") => note(dropped, "reasoning items"),
            Some("item_reference") => {
                return fail(
                    "item_reference: rota keeps no responses and a chat upstream cannot hold one; send the items themselves",
                );
            }
            other => return fail(format!("input item type {:?} has no chat counterpart", other.unwrap_or("?"))),
        }
    }
    // An assistant message that is only calls has no text: chat wants `null` content then, not "".
    for m in messages.iter_mut() {
        if m["role"] == "assistant" && m.get("tool_calls").is_some() && m["content"] == "" {
            m["content"] = Value::Null;
        }
    }
    Ok(())
}

fn tools_to_chat(tools: &Value, dropped: &mut Vec<String>) -> Vec<Value> {
    let mut out = Vec::new();
    for t in tools.as_array().into_iter().flatten() {
        match t.get("type").and_then(Value::as_str) {
            Some("function") => {
                let mut f = json!({"name": str_of(t, "name")});
                for key in ["description", "parameters", "strict"] {
                    if let Some(v) = t.get(key).filter(|v| is_set(v)) {
                        f[key] = v.clone();
                    }
                }
                out.push(json!({"type": "function", "function": f}));
            }
            other => note(dropped, format!("tools[type={}]", other.unwrap_or("?"))),
        }
    }
    out
}

fn tool_choice_to_chat(choice: &Value, have_tools: bool) -> Result<Option<Value>, Untranslatable> {
    match choice {
        Value::String(s) if s == "required" && !have_tools => {
            fail("tool_choice \"required\" with only tools that have no chat counterpart")
        }
        // Chat refuses a tool_choice without tools; with none left, "auto" and "none" mean the same.
        Value::String(_) if !have_tools => Ok(None),
        Value::String(_) => Ok(Some(choice.clone())),
        Value::Object(o) => match o.get("type").and_then(Value::as_str) {
            Some("function") => {
                Ok(Some(json!({"type": "function", "function": {"name": o.get("name").cloned().unwrap_or(json!(""))}})))
            }
            other => fail(format!(
                "tool_choice of type {:?} names a tool that has no chat counterpart",
                other.unwrap_or("?")
            )),
        },
        Value::Null => Ok(None),
        other => fail(format!("tool_choice {other} has no chat counterpart")),
    }
}

/// OpenAI Responses request → OpenAI chat completions request.
pub fn responses_to_chat(req: &Map<String, Value>) -> Result<Translated, Untranslatable> {
    let mut out = Map::new();
    let mut dropped = Vec::new();
    let mut messages = Vec::new();
    if let Some(i) = req.get("instructions").filter(|i| is_set(i)) {
        messages.push(json!({"role": "system", "content": joined_text(i, "\n")}));
    }
    input_to_messages(req.get("input").unwrap_or(&Value::Null), &mut messages, &mut dropped)?;
    out.insert("messages".into(), Value::Array(messages));
    let tools = tools_to_chat(req.get("tools").unwrap_or(&Value::Null), &mut dropped);
    let have_tools = !tools.is_empty();
    if have_tools {
        out.insert("tools".into(), Value::Array(tools));
    }

    for (key, value) in req {
        match key.as_str() {
            "instructions" | "input" | "tools" => {}
            "previous_response_id" | "conversation" if is_set(value) => {
                return fail(format!(
                    "{key}: rota keeps no responses and a chat upstream cannot hold one; send the whole conversation in `input`"
                ));
            }
            "previous_response_id" | "conversation" => {}
            "background" if value == &json!(true) => {
                return fail("background: true (a response polled later) has no chat counterpart");
            }
            "prompt" if is_set(value) => return fail("prompt (a stored prompt template) has no chat counterpart"),
            "model" | "temperature" | "top_p" | "user" | "prompt_cache_key" | "safety_identifier" => {
                out.insert(key.clone(), value.clone());
            }
            "parallel_tool_calls" if have_tools => {
                out.insert(key.clone(), value.clone());
            }
            "max_output_tokens" => {
                out.insert("max_completion_tokens".into(), value.clone());
            }
            "stream" => {
                out.insert("stream".into(), value.clone());
                if value == &json!(true) {
                    out.insert("stream_options".into(), json!({"include_usage": true}));
                }
            }
            "tool_choice" => {
                if let Some(choice) = tool_choice_to_chat(value, have_tools)? {
                    out.insert("tool_choice".into(), choice);
                }
            }
            "reasoning" => {
                for (k, v) in value.as_object().into_iter().flatten() {
                    match k.as_str() {
                        "effort" if is_set(v) => {
                            out.insert("reasoning_effort".into(), v.clone());
                        }
                        "effort" => {}
                        _ if v.is_null() => {}
                        _ => note(&mut dropped, format!("reasoning.{k}")),
                    }
                }
            }
            "text" => {
                for (k, v) in value.as_object().into_iter().flatten() {
                    match k.as_str() {
                        "format" => match v.get("type").and_then(Value::as_str) {
                            Some("json_schema") => {
                                let mut schema = Map::new();
                                for f in ["name", "description", "schema", "strict"] {
                                    if let Some(x) = v.get(f).filter(|x| is_set(x)) {
                                        schema.insert(f.into(), x.clone());
                                    }
                                }
                                out.insert(
                                    "response_format".into(),
                                    json!({"type": "json_schema", "json_schema": schema}),
                                );
                            }
                            Some("json_object") => {
                                out.insert("response_format".into(), json!({"type": "json_object"}));
                            }
                            Some("text") | None => {}
                            Some(other) => {
                                return fail(format!("text.format of type {other:?} has no chat counterpart"));
                            }
                        },
                        "verbosity" if is_set(v) => {
                            out.insert("verbosity".into(), v.clone());
                        }
                        _ if v.is_null() => {}
                        _ => note(&mut dropped, format!("text.{k}")),
                    }
                }
            }
            // Chat's `metadata` is only accepted with `store: true`, and rota never asks a chat
            // upstream to store.
            _ => note(&mut dropped, key.clone()),
        }
    }
    Ok(Translated { body: out, dropped })
}

// ---------------------------------------------------------------------------------------------
// chat → Responses

fn chat_part_to_input(part: &Value) -> Result<Value, Untranslatable> {
    match part.get("type").and_then(Value::as_str) {
        Some("text") => Ok(json!({"type": "input_text", "text": str_of(part, "text")})),
        Some("image_url") => {
            let image = part.get("image_url").unwrap_or(&Value::Null);
            let url = image.as_str().unwrap_or_else(|| str_of(image, "url"));
            let detail = image.get("detail").filter(|d| is_set(d)).cloned().unwrap_or(json!("auto"));
            Ok(json!({"type": "input_image", "image_url": url, "detail": detail}))
        }
        other => fail(format!("content part type {:?} has no Responses counterpart", other.unwrap_or("?"))),
    }
}

fn input_parts(content: &Value) -> Result<Vec<Value>, Untranslatable> {
    match content {
        Value::String(s) => Ok(vec![json!({"type": "input_text", "text": s})]),
        Value::Array(parts) => parts.iter().map(chat_part_to_input).collect(),
        Value::Null => Ok(vec![]),
        other => fail(format!("message content {other} is neither a string nor parts")),
    }
}

/// OpenAI chat completions request → OpenAI Responses request.
pub fn chat_to_responses(req: &Map<String, Value>) -> Result<Translated, Untranslatable> {
    let mut out = Map::new();
    let mut dropped = Vec::new();
    let (instructions, input) = messages_to_input(req, &mut dropped)?;
    if !instructions.is_empty() {
        out.insert("instructions".into(), json!(instructions.join("\n\n")));
    }
    out.insert("input".into(), Value::Array(input));
    // rota keeps no state upstream.
    out.insert("store".into(), json!(false));
    let max =
        req.get("max_completion_tokens").filter(|v| is_set(v)).or_else(|| req.get("max_tokens").filter(|v| is_set(v)));
    if let Some(max) = max {
        out.insert("max_output_tokens".into(), max.clone());
    }

    for (key, value) in req {
        match key.as_str() {
            "messages" | "max_tokens" | "max_completion_tokens" | "stream_options" => {}
            "n" if value.as_u64().is_some_and(|n| n > 1) => {
                return fail("n > 1 (several choices) has no Responses counterpart");
            }
            "logprobs" if value == &json!(true) => return fail("logprobs has no Responses counterpart rota can map"),
            "audio" if is_set(value) => return fail("audio output has no Responses counterpart"),
            "modalities" if value.as_array().is_some_and(|m| m.iter().any(|m| m == "audio")) => {
                return fail("audio output has no Responses counterpart");
            }
            "stop" if is_set(value) && value != &json!([]) => {
                return fail("stop sequences have no Responses counterpart");
            }
            "functions" | "function_call" if is_set(value) => {
                return fail(format!("{key} (the legacy function API) has no Responses counterpart; use tools"));
            }
            "n" | "logprobs" | "audio" | "modalities" | "stop" | "functions" | "function_call" => {}
            "top_logprobs" if value.is_null() || value == &json!(0) => {}
            "store" if value != &json!(true) => {}
            "model"
            | "temperature"
            | "top_p"
            | "user"
            | "stream"
            | "parallel_tool_calls"
            | "prompt_cache_key"
            | "safety_identifier"
            | "metadata"
            | "service_tier" => {
                out.insert(key.clone(), value.clone());
            }
            "reasoning_effort" if is_set(value) => {
                out.insert("reasoning".into(), json!({"effort": value}));
            }
            "verbosity" if is_set(value) => {
                let text = out.entry("text").or_insert_with(|| json!({}));
                text["verbosity"] = value.clone();
            }
            "response_format" => {
                if let Some(format) = response_format_to_text(value)? {
                    let text = out.entry("text").or_insert_with(|| json!({}));
                    text["format"] = format;
                }
            }
            "tools" => {
                out.insert("tools".into(), Value::Array(tools_to_responses(value)?));
            }
            "tool_choice" => {
                if let Some(choice) = tool_choice_to_responses(value)? {
                    out.insert("tool_choice".into(), choice);
                }
            }
            _ if value.is_null() => {}
            _ => note(&mut dropped, key.clone()),
        }
    }
    Ok(Translated { body: out, dropped })
}

/// A chat request's messages as Responses input: the leading system and developer messages'
/// texts (the `instructions`), and the input items.
fn messages_to_input(
    req: &Map<String, Value>,
    dropped: &mut Vec<String>,
) -> Result<(Vec<String>, Vec<Value>), Untranslatable> {
    let mut instructions: Vec<String> = Vec::new();
    let mut input: Vec<Value> = Vec::new();
    for m in req.get("messages").and_then(Value::as_array).into_iter().flatten() {
        let role = str_of(m, "role");
        let content = m.get("content").unwrap_or(&Value::Null);
        match role {
            "system" | "developer" if input.is_empty() => instructions.push(joined_text(content, "\n")),
            "system" | "developer" | "user" => {
                input.push(json!({"type": "message", "role": role, "content": input_parts(content)?}));
            }
            "assistant" => assistant_to_input(m, content, &mut input, dropped)?,
            "tool" => input.push(json!({
                "type": "function_call_output",
                "call_id": str_of(m, "tool_call_id"),
                "output": joined_text(content, ""),
            })),
            other => return fail(format!("message role {other:?} has no Responses counterpart")),
        }
    }
    Ok((instructions, input))
}

/// An assistant message as input items: a message of its text and refusal, then a
/// `function_call` per tool call (its `reasoning_content` dropped).
fn assistant_to_input(
    m: &Value,
    content: &Value,
    input: &mut Vec<Value>,
    dropped: &mut Vec<String>,
) -> Result<(), Untranslatable> {
    let mut parts = Vec::new();
    let text = joined_text(content, "");
    if !text.is_empty() {
        parts.push(json!({"type": "output_text", "text": text}));
    }
    if let Some(r) = m.get("refusal").and_then(Value::as_str).filter(|r| !r.is_empty()) {
        parts.push(json!({"type": "refusal", "refusal": r}));
    }
    if !parts.is_empty() {
        input.push(json!({"type": "message", "role": "assistant", "content": parts}));
    }
    if m.get("reasoning_content").is_some_and(is_set) {
        note(dropped, "reasoning_content");
    }
    for call in m.get("tool_calls").and_then(Value::as_array).into_iter().flatten() {
        if call.get("type").and_then(Value::as_str).is_some_and(|t| t != "function") {
            return fail(format!("tool call of type {} has no Responses counterpart", call["type"]));
        }
        input.push(json!({
            "type": "function_call",
            "call_id": str_of(call, "id"),
            "name": call.pointer("/function/name").cloned().unwrap_or(json!("")),
            "arguments": call.pointer("/function/arguments").cloned().unwrap_or(json!("")),
        }));
    }
    Ok(())
}

/// Chat's `response_format` as the Responses `text.format`; none for plain text.
fn response_format_to_text(format: &Value) -> Result<Option<Value>, Untranslatable> {
    Ok(Some(match format.get("type").and_then(Value::as_str) {
        Some("json_schema") => {
            let mut f = json!({"type": "json_schema"});
            for (k, v) in format.get("json_schema").and_then(Value::as_object).into_iter().flatten() {
                f[k] = v.clone();
            }
            f
        }
        Some("json_object") => json!({"type": "json_object"}),
        Some("text") | None => return Ok(None),
        Some(other) => return fail(format!("response_format of type {other:?} has no Responses counterpart")),
    }))
}

/// Chat's function tools as Responses function tools (flat: no `function` object).
fn tools_to_responses(tools: &Value) -> Result<Vec<Value>, Untranslatable> {
    let mut out = Vec::new();
    for t in tools.as_array().into_iter().flatten() {
        if t.get("type").and_then(Value::as_str) != Some("function") {
            return fail(format!("tools of type {} have no Responses counterpart rota maps", t["type"]));
        }
        let f = t.get("function").unwrap_or(&Value::Null);
        let mut tool = json!({"type": "function", "name": str_of(f, "name")});
        for k in ["description", "parameters", "strict"] {
            if let Some(v) = f.get(k).filter(|v| is_set(v)) {
                tool[k] = v.clone();
            }
        }
        out.push(tool);
    }
    Ok(out)
}

/// Chat's `tool_choice` as the Responses one; none for `null`.
fn tool_choice_to_responses(choice: &Value) -> Result<Option<Value>, Untranslatable> {
    Ok(Some(match choice {
        Value::String(_) => choice.clone(),
        Value::Object(o) if o.get("type").and_then(Value::as_str) == Some("function") => {
            json!({"type": "function", "name": choice.pointer("/function/name").cloned().unwrap_or(json!(""))})
        }
        Value::Null => return Ok(None),
        other => return fail(format!("tool_choice {other} has no Responses counterpart")),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(v: Value) -> Map<String, Value> {
        v.as_object().cloned().expect("an object")
    }

    fn to_chat(v: Value) -> Result<Translated, Untranslatable> {
        responses_to_chat(&obj(v))
    }

    fn to_responses(v: Value) -> Result<Translated, Untranslatable> {
        chat_to_responses(&obj(v))
    }

    fn refused(r: Result<Translated, Untranslatable>) -> String {
        r.expect_err("untranslatable").0
    }

    #[test]
    fn the_real_codex_request_translates_to_chat() {
        let recorded: Value =
            serde_json::from_str(include_str!("../../../../tests/fixtures/agents/codex-0.169.0-responses.json"))
                .unwrap();
        let t = responses_to_chat(recorded["body"].as_object().unwrap()).expect("translatable");
        let b = &t.body;
        assert_eq!(
            t.dropped,
            [
                "tools[type=namespace]",
                "tools[type=web_search]",
                "reasoning.summary",
                "store",
                "include",
                "client_metadata"
            ]
        );
        let roles: Vec<&str> = b["messages"].as_array().unwrap().iter().map(|m| m["role"].as_str().unwrap()).collect();
        assert_eq!(roles, ["system", "system", "user", "user"]);
        assert!(
            b["messages"][0]["content"]
                .as_str()
                .unwrap()
                .starts_with("You are a coding agent running in the Codex CLI")
        );
        assert_eq!(b["messages"][3]["content"], "Say hi");
        let tools: Vec<&str> =
            b["tools"].as_array().unwrap().iter().map(|t| t["function"]["name"].as_str().unwrap()).collect();
        assert_eq!(
            tools,
            [
                "exec_command",
                "write_stdin",
                "request_user_input",
                "view_image",
                "get_goal",
                "create_goal",
                "update_goal"
            ]
        );
        assert!(
            b["tools"].as_array().unwrap().iter().all(|t| t["type"] == "function" && t["function"]["strict"] == false)
        );
        assert_eq!(b["tools"][3]["function"]["parameters"]["required"], json!(["path"]));
        assert_eq!(b["model"], "beta/sim-small");
        assert_eq!((&b["stream"], &b["stream_options"]), (&json!(true), &json!({"include_usage": true})));
        assert_eq!((&b["tool_choice"], &b["parallel_tool_calls"]), (&json!("auto"), &json!(true)));
        assert_eq!(b["prompt_cache_key"], "01a23b60-4bb6-7c21-bb82-1d823cb95204");
        assert!(!b.contains_key("reasoning_effort") && !b.contains_key("store") && !b.contains_key("include"));
    }

    #[test]
    fn a_string_input_is_one_user_message_after_the_instructions() {
        let t = to_chat(json!({"model": "m", "instructions": "Be brief.", "input": "Hi", "max_output_tokens": 50}))
            .unwrap();
        assert_eq!(
            Value::Object(t.body),
            json!({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
                   "model": "m", "max_completion_tokens": 50})
        );
        assert!(t.dropped.is_empty());
    }

    #[test]
    fn items_become_messages_and_calls_join_the_assistant_message() {
        let t = to_chat(json!({"input": [
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
            {"role": "user", "content": [{"type": "input_text", "text": "look"},
                                         {"type": "input_image", "image_url": "https://x/cat.png", "detail": "low"}]},
            {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAA"},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Let me check."}]},
            {"type": "reasoning", "id": "rs_2", "summary": []},
            {"type": "function_call", "call_id": "call_1", "name": "ls", "arguments": "{\"d\":\"/\"}"},
            {"type": "function_call", "call_id": "call_2", "name": "pwd", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "bin etc"},
            {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "/ro"}, {"type": "input_text", "text": "ot"}]},
            {"type": "function_call", "call_id": "call_3", "name": "ls", "arguments": "{}"},
        ]}))
        .unwrap();
        assert_eq!(
            t.body["messages"],
            json!([
                {"role": "system", "content": "a\nb"},
                {"role": "user", "content": [{"type": "text", "text": "look"},
                                             {"type": "image_url", "image_url": {"url": "https://x/cat.png", "detail": "low"}}]},
                {"role": "assistant", "content": "Let me check.", "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "ls", "arguments": "{\"d\":\"/\"}"}},
                    {"id": "call_2", "type": "function", "function": {"name": "pwd", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "bin etc"},
                {"role": "tool", "tool_call_id": "call_2", "content": "/root"},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "call_3", "type": "function", "function": {"name": "ls", "arguments": "{}"}}]},
            ])
        );
        assert_eq!(t.dropped, ["reasoning items"]);
    }

    #[test]
    fn fields_map_to_their_chat_names() {
        let t = to_chat(json!({
            "input": "x", "temperature": 0.2, "top_p": 0.9, "user": "u", "safety_identifier": "s", "metadata": {"k": "v"},
            "reasoning": {"effort": "high", "summary": "detailed"},
            "text": {"format": {"type": "json_schema", "name": "pt", "schema": {"type": "object"}, "strict": true}, "verbosity": "low"},
            "tools": [{"type": "function", "name": "f", "description": "d", "parameters": {"type": "object"}, "strict": true},
                      {"type": "file_search", "vector_store_ids": []}, {"type": "custom", "name": "c"}],
            "tool_choice": {"type": "function", "name": "f"}, "parallel_tool_calls": false,
            "truncation": "auto", "background": false, "previous_response_id": null, "service_tier": "auto",
            "stream": false,
        }))
        .unwrap();
        assert_eq!(
            Value::Object(t.body),
            json!({
                "messages": [{"role": "user", "content": "x"}],
                "tools": [{"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object"}, "strict": true}}],
                "temperature": 0.2, "top_p": 0.9, "user": "u", "safety_identifier": "s",
                "reasoning_effort": "high",
                "response_format": {"type": "json_schema", "json_schema": {"name": "pt", "schema": {"type": "object"}, "strict": true}},
                "verbosity": "low",
                "tool_choice": {"type": "function", "function": {"name": "f"}}, "parallel_tool_calls": false,
                "stream": false,
            })
        );
        assert_eq!(
            t.dropped,
            [
                "tools[type=file_search]",
                "tools[type=custom]",
                "metadata",
                "reasoning.summary",
                "truncation",
                "background",
                "service_tier"
            ]
        );
        let t = to_chat(json!({"input": "x", "text": {"format": {"type": "json_object"}}})).unwrap();
        assert_eq!(t.body["response_format"], json!({"type": "json_object"}));
        let t = to_chat(json!({"input": "x", "text": {"format": {"type": "text"}}})).unwrap();
        assert!(!t.body.contains_key("response_format") && t.dropped.is_empty());
    }

    #[test]
    fn a_tool_choice_without_tools_left_is_dropped_or_refused() {
        let web = json!([{"type": "web_search"}]);
        let t =
            to_chat(json!({"input": "x", "tools": web, "tool_choice": "auto", "parallel_tool_calls": true})).unwrap();
        assert!(!t.body.contains_key("tools") && !t.body.contains_key("tool_choice"));
        assert_eq!(t.dropped, ["tools[type=web_search]", "parallel_tool_calls"]);
        let why = refused(to_chat(json!({"input": "x", "tools": web, "tool_choice": "required"})));
        assert!(why.contains("required"), "{why}");
        let why = refused(to_chat(json!({"input": "x", "tools": web, "tool_choice": {"type": "web_search"}})));
        assert!(why.contains("\"web_search\""), "{why}");
    }

    #[test]
    fn requests_that_cannot_mean_the_same_in_chat_are_refused() {
        let why = refused(to_chat(json!({"input": "x", "previous_response_id": "resp_1"})));
        assert_eq!(
            why,
            "previous_response_id: rota keeps no responses and a chat upstream cannot hold one; send the whole conversation in `input`"
        );
        assert!(
            refused(to_chat(json!({"input": "x", "conversation": "conv_1"}))).starts_with("conversation: rota keeps")
        );
        assert!(refused(to_chat(json!({"input": "x", "background": true}))).contains("background"));
        let file = json!([{"role": "user", "content": [{"type": "input_file", "file_id": "file-1"}]}]);
        assert!(refused(to_chat(json!({"input": file}))).contains("input_file"));
        let reference = json!([{"type": "item_reference", "id": "msg_1"}]);
        assert!(refused(to_chat(json!({"input": reference}))).starts_with("item_reference"));
        let search = json!([{"type": "web_search_call", "id": "ws_1", "status": "completed"}]);
        assert_eq!(
            refused(to_chat(json!({"input": search}))),
            "input item type \"web_search_call\" has no chat counterpart"
        );
    }

    #[test]
    fn chat_requests_become_responses_requests() {
        let t = to_responses(json!({
            "model": "gpt-5",
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "developer", "content": [{"type": "text", "text": "Use tools."}]},
                {"role": "user", "content": [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}}]},
                {"role": "assistant", "content": null, "reasoning_content": "hmm", "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "bin"},
                {"role": "system", "content": "Now answer."},
                {"role": "assistant", "content": "Done."},
            ],
            "max_tokens": 100, "reasoning_effort": "low", "verbosity": "high",
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}, "strict": true}},
            "tools": [{"type": "function", "function": {"name": "ls", "description": "list", "parameters": {"type": "object"}}}],
            "tool_choice": {"type": "function", "function": {"name": "ls"}},
            "stream": true, "stream_options": {"include_usage": true}, "n": 1, "seed": 7, "store": true,
        }))
        .unwrap();
        assert_eq!(
            Value::Object(t.body),
            json!({
                "instructions": "Be brief.\n\nUse tools.",
                "input": [
                    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "look"},
                        {"type": "input_image", "image_url": "data:image/png;base64,AA", "detail": "auto"}]},
                    {"type": "function_call", "call_id": "call_1", "name": "ls", "arguments": "{}"},
                    {"type": "function_call_output", "call_id": "call_1", "output": "bin"},
                    {"type": "message", "role": "system", "content": [{"type": "input_text", "text": "Now answer."}]},
                    {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Done."}]},
                ],
                "store": false,
                "max_output_tokens": 100,
                "model": "gpt-5",
                "reasoning": {"effort": "low"},
                "text": {"verbosity": "high", "format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}, "strict": true}},
                "tools": [{"type": "function", "name": "ls", "description": "list", "parameters": {"type": "object"}}],
                "tool_choice": {"type": "function", "name": "ls"},
                "stream": true,
            })
        );
        assert_eq!(t.dropped, ["reasoning_content", "seed", "store"]);
        let t = to_responses(json!({"messages": [], "response_format": {"type": "json_object"}, "max_completion_tokens": 9, "max_tokens": 5})).unwrap();
        assert_eq!(
            (&t.body["text"], &t.body["max_output_tokens"]),
            (&json!({"format": {"type": "json_object"}}), &json!(9))
        );
    }

    #[test]
    fn chat_requests_that_cannot_mean_the_same_in_responses_are_refused() {
        let m = json!([{"role": "user", "content": "x"}]);
        for (field, value) in [
            ("n", json!(2)),
            ("logprobs", json!(true)),
            ("audio", json!({"voice": "alloy", "format": "wav"})),
            ("modalities", json!(["text", "audio"])),
            ("stop", json!(["\n"])),
        ] {
            let mut req = json!({"messages": m});
            req[field] = value;
            assert!(to_responses(req).is_err(), "{field}");
        }
        let t = to_responses(json!({"messages": m, "n": 1, "logprobs": false, "modalities": ["text"], "stop": null}))
            .unwrap();
        assert!(t.dropped.is_empty(), "{:?}", t.dropped);
        let part = json!([{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "AA", "format": "wav"}}]}]);
        assert!(refused(to_responses(json!({"messages": part}))).contains("input_audio"));
    }

    #[test]
    fn a_chat_request_survives_the_round_trip_through_responses() {
        let chat = json!({
            "model": "m",
            "messages": [
                {"role": "system", "content": "sys"},
                {"role": "user", "content": "What is in /?"},
                {"role": "assistant", "content": "Checking.", "tool_calls": [
                    {"id": "call_a", "type": "function", "function": {"name": "ls", "arguments": "{\"d\":\"/\"}"}},
                    {"id": "call_b", "type": "function", "function": {"name": "du", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "call_a", "content": "bin etc"},
                {"role": "tool", "tool_call_id": "call_b", "content": "4K"},
                {"role": "assistant", "content": "bin and etc."},
                {"role": "user", "content": [{"type": "text", "text": "and this?"},
                                             {"type": "image_url", "image_url": {"url": "https://x/y.png", "detail": "high"}}]},
            ],
            "tools": [{"type": "function", "function": {"name": "ls", "parameters": {"type": "object"}}}],
            "tool_choice": "required", "temperature": 0.5, "max_completion_tokens": 300,
        });
        let there = to_responses(chat.clone()).unwrap();
        let back = responses_to_chat(&there.body).unwrap();
        assert_eq!(back.dropped, ["store"]);
        let mut want = obj(chat);
        want.insert("messages".into(), want["messages"].clone());
        for (k, v) in &want {
            assert_eq!(back.body.get(k), Some(v), "{k}");
        }
        assert_eq!(back.body.len(), want.len(), "{:?}", back.body.keys().collect::<Vec<_>>());
    }
}
