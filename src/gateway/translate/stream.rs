//! Streamed responses: Anthropic events ⇄ OpenAI `chat.completion.chunk`s, event by event. A
//! translator ends its stream only when its source did (`message_stop`, `[DONE]`): a cut
//! source is the relay's business, never closed cleanly here.

use super::response::{finish_from_stop, prompt_tokens, stop_from_finish};
use super::responses::{ChatToResponses, ResponsesToChat};
use super::sse::{Event, Splitter};
use serde_json::{Value, json};

/// Turns the upstream's events into the client's; keeps what it needs between events.
#[derive(Debug)]
pub enum StreamTranslator {
    /// Anthropic upstream, OpenAI chat client.
    ToChat(ToChat),
    /// OpenAI chat upstream, Anthropic client.
    ToMessages(ToMessages),
    /// Responses upstream, OpenAI chat client.
    FromResponses(ResponsesToChat),
    /// OpenAI chat upstream, Responses client.
    ToResponses(ChatToResponses),
    /// Two steps through chat (Anthropic ⇄ Responses): the first one's events are split again
    /// for the second.
    Then(Box<StreamTranslator>, Splitter, Box<StreamTranslator>),
}

impl StreamTranslator {
    /// `include_usage`: the client asked for a final usage chunk (`stream_options.include_usage`),
    /// which OpenAI sends only on request.
    pub fn anthropic_to_chat(include_usage: bool) -> Self {
        StreamTranslator::ToChat(ToChat { include_usage, ..ToChat::default() })
    }

    pub fn chat_to_anthropic() -> Self {
        StreamTranslator::ToMessages(ToMessages::default())
    }

    pub fn responses_to_chat(include_usage: bool) -> Self {
        StreamTranslator::FromResponses(ResponsesToChat::new(include_usage))
    }

    pub fn chat_to_responses() -> Self {
        StreamTranslator::ToResponses(ChatToResponses::new())
    }

    /// `first` then `second`, either of which may be no step at all.
    pub fn then(first: Option<Self>, second: Option<Self>) -> Option<Self> {
        match (first, second) {
            (Some(a), Some(b)) => Some(StreamTranslator::Then(Box::new(a), Splitter::default(), Box::new(b))),
            (a, b) => a.or(b),
        }
    }

    /// The client's bytes for one upstream event (often none).
    pub fn push(&mut self, ev: &Event) -> Vec<u8> {
        match self {
            StreamTranslator::ToChat(t) => t.push(ev),
            StreamTranslator::ToMessages(t) => t.push(ev),
            StreamTranslator::FromResponses(t) => t.push(ev),
            StreamTranslator::ToResponses(t) => t.push(ev),
            StreamTranslator::Then(first, between, second) => {
                let mid = first.push(ev);
                between.push(&mid).iter().flat_map(|e| second.push(e)).collect()
            }
        }
    }
}

fn sse_data(v: &Value) -> Vec<u8> {
    format!("data: {v}\n\n").into_bytes()
}

fn sse_event(name: &str, v: &Value) -> Vec<u8> {
    format!("event: {name}\ndata: {v}\n\n").into_bytes()
}

#[derive(Debug, Default)]
pub struct ToChat {
    id: String,
    model: String,
    /// Anthropic block index → OpenAI tool call index.
    tools: Vec<(u64, usize)>,
    /// One timestamp for every chunk of the completion, as OpenAI sends.
    created: i64,
    input_tokens: i64,
    include_usage: bool,
}

impl ToChat {
    fn chunk(&self, delta: Value, finish: Option<&str>) -> Vec<u8> {
        sse_data(&json!({
            "id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }))
    }

    fn push(&mut self, ev: &Event) -> Vec<u8> {
        let Some(v) = ev.json() else { return Vec::new() };
        match v.get("type").and_then(Value::as_str).or(ev.name.as_deref()) {
            Some("message_start") => {
                self.id = v.pointer("/message/id").and_then(Value::as_str).unwrap_or("").to_string();
                self.model = v.pointer("/message/model").and_then(Value::as_str).unwrap_or("").to_string();
                self.input_tokens = v.pointer("/message/usage").map_or(0, prompt_tokens);
                self.created = chrono::Utc::now().timestamp();
                self.chunk(json!({"role": "assistant", "content": ""}), None)
            }
            Some("content_block_start") if v.pointer("/content_block/type") == Some(&json!("tool_use")) => {
                let block = v.get("index").and_then(Value::as_u64).unwrap_or(0);
                let n = self.tools.len();
                self.tools.push((block, n));
                let call = json!({"index": n, "id": v.pointer("/content_block/id"), "type": "function",
                                  "function": {"name": v.pointer("/content_block/name"), "arguments": ""}});
                self.chunk(json!({"tool_calls": [call]}), None)
            }
            Some("content_block_delta") => match v.pointer("/delta/type").and_then(Value::as_str) {
                Some("text_delta") => self.chunk(json!({"content": v.pointer("/delta/text")}), None),
                Some("thinking_delta") => self.chunk(json!({"reasoning_content": v.pointer("/delta/thinking")}), None),
                Some("input_json_delta") => {
                    let block = v.get("index").and_then(Value::as_u64).unwrap_or(0);
                    let n = self.tools.iter().find(|(b, _)| *b == block).map_or(0, |(_, n)| *n);
                    self.chunk(json!({"tool_calls": [{"index": n, "function": {"arguments": v.pointer("/delta/partial_json")}}]}), None)
                }
                _ => Vec::new(),
            },
            Some("message_delta") => {
                let finish = finish_from_stop(v.pointer("/delta/stop_reason").and_then(Value::as_str));
                let output = v.pointer("/usage/output_tokens").and_then(Value::as_i64).unwrap_or(0);
                let mut out = self.chunk(json!({}), Some(finish));
                if !self.include_usage {
                    return out;
                }
                out.extend(sse_data(&json!({
                    "id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                    "choices": [],
                    "usage": {"prompt_tokens": self.input_tokens, "completion_tokens": output, "total_tokens": self.input_tokens.saturating_add(output)},
                })));
                out
            }
            Some("message_stop") => b"data: [DONE]\n\n".to_vec(),
            Some("error") => {
                let message = v.pointer("/error/message").cloned().unwrap_or(json!("upstream error"));
                sse_data(&json!({"error": {"message": message, "type": v.pointer("/error/type"), "code": null}}))
            }
            _ => Vec::new(),
        }
    }
}

#[derive(Debug, Default)]
pub struct ToMessages {
    started: bool,
    done: bool,
    /// The index and kind of the open content block.
    open: Option<(usize, bool)>,
    next_index: usize,
    /// OpenAI tool call index → Anthropic block index.
    tools: Vec<(u64, usize)>,
    stop: Option<&'static str>,
    usage: (i64, i64),
}

impl ToMessages {
    fn close_block(&mut self) -> Vec<u8> {
        match self.open.take() {
            Some((index, _)) => sse_event("content_block_stop", &json!({"type": "content_block_stop", "index": index})),
            None => Vec::new(),
        }
    }

    fn close(&mut self) -> Vec<u8> {
        let mut out = self.close_block();
        out.extend(sse_event(
            "message_delta",
            &json!({
                "type": "message_delta",
                "delta": {"stop_reason": self.stop.unwrap_or("end_turn"), "stop_sequence": null},
                "usage": {"input_tokens": self.usage.0, "output_tokens": self.usage.1},
            }),
        ));
        out.extend(sse_event("message_stop", &json!({"type": "message_stop"})));
        self.done = true;
        out
    }

    fn push(&mut self, ev: &Event) -> Vec<u8> {
        if ev.data.trim() == "[DONE]" {
            return if self.started && !self.done { self.close() } else { Vec::new() };
        }
        let Some(v) = ev.json() else { return Vec::new() };
        let mut out = Vec::new();
        if let Some(err) = v.get("error") {
            let body = json!({"type": "error", "error": {"type": "api_error", "message": err.get("message").cloned().unwrap_or(json!("upstream error"))}});
            return sse_event("error", &body);
        }
        if !self.started {
            self.started = true;
            out.extend(sse_event(
                "message_start",
                &json!({
                    "type": "message_start",
                    "message": {"id": v.get("id"), "type": "message", "role": "assistant", "model": v.get("model"),
                                "content": [], "stop_reason": null, "stop_sequence": null,
                                "usage": {"input_tokens": 0, "output_tokens": 0}},
                }),
            ));
        }
        if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
            self.usage = (
                u.get("prompt_tokens").and_then(Value::as_i64).unwrap_or(0),
                u.get("completion_tokens").and_then(Value::as_i64).unwrap_or(0),
            );
        }
        let Some(choice) = v.pointer("/choices/0") else { return out };
        let delta = choice.get("delta").unwrap_or(&Value::Null);
        if let Some(text) = delta.get("content").and_then(Value::as_str).filter(|t| !t.is_empty()) {
            if !matches!(self.open, Some((_, false))) {
                out.extend(self.close_block());
                let index = self.next_index;
                self.next_index += 1;
                self.open = Some((index, false));
                out.extend(sse_event(
                    "content_block_start",
                    &json!({"type": "content_block_start", "index": index,
                                                                     "content_block": {"type": "text", "text": ""}}),
                ));
            }
            let index = self.open.map_or(0, |(i, _)| i);
            out.extend(sse_event(
                "content_block_delta",
                &json!({"type": "content_block_delta", "index": index,
                                                                 "delta": {"type": "text_delta", "text": text}}),
            ));
        }
        for call in delta.get("tool_calls").and_then(Value::as_array).into_iter().flatten() {
            let n = call.get("index").and_then(Value::as_u64).unwrap_or(0);
            if call.get("id").is_some_and(|id| !id.is_null()) {
                out.extend(self.close_block());
                let index = self.next_index;
                self.next_index += 1;
                self.tools.push((n, index));
                self.open = Some((index, true));
                out.extend(sse_event("content_block_start", &json!({"type": "content_block_start", "index": index,
                    "content_block": {"type": "tool_use", "id": call.get("id"), "name": call.pointer("/function/name"), "input": {}}})));
            }
            if let Some(args) = call.pointer("/function/arguments").and_then(Value::as_str).filter(|a| !a.is_empty()) {
                let index = self.tools.iter().find(|(i, _)| *i == n).map_or(0, |(_, b)| *b);
                out.extend(sse_event("content_block_delta", &json!({"type": "content_block_delta", "index": index,
                                                                     "delta": {"type": "input_json_delta", "partial_json": args}})));
            }
        }
        if let Some(finish) = choice.get("finish_reason").and_then(Value::as_str) {
            self.stop = Some(stop_from_finish(Some(finish)));
            out.extend(self.close_block());
        }
        out
    }
}
