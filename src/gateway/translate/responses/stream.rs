//! Streamed answers: OpenAI `chat.completion.chunk`s ⇄ Responses events, event by event. A
//! translator ends its stream only when its source did (`[DONE]`, `response.completed`): a cut
//! source is the relay's business, never closed cleanly here.

use super::*;
use crate::gateway::translate::sse::Event;
use serde_json::Map;

fn sse_data(v: &Value) -> Vec<u8> {
    format!("data: {v}\n\n").into_bytes()
}

fn text(v: &Value, key: &str) -> String {
    v.get(key).and_then(Value::as_str).unwrap_or("").to_string()
}

/// `base` for the first item of a kind, `base_n` for the next ones, so ids stay unique.
fn nth(base: String, n: usize) -> String {
    if n == 0 { base } else { format!("{base}_{n}") }
}

#[derive(Debug, Clone, PartialEq)]
enum Kind {
    Message,
    Reasoning,
    Call { call_id: String, name: String, chat_index: u64 },
}

/// One output item of the response being built: its id, kind, and text so far (the message
/// text, the reasoning summary or the call's arguments).
#[derive(Debug)]
struct Item {
    id: String,
    kind: Kind,
    text: String,
}

impl Item {
    fn whole(&self) -> Value {
        match &self.kind {
            Kind::Message => message_item(&self.id, "completed", &self.text, None),
            Kind::Reasoning => reasoning_item(&self.id, &self.text),
            Kind::Call { call_id, name, .. } => call_item(&self.id, "completed", call_id, name, &self.text),
        }
    }
}

/// OpenAI chat upstream, Responses client: chat chunks → Responses events.
#[derive(Debug, Default)]
pub struct ChatToResponses {
    sequence: u64,
    started: bool,
    /// Completed or failed: nothing more is sent.
    ended: bool,
    chat_id: String,
    model: Value,
    created: i64,
    items: Vec<Item>,
    /// The output index of the item still receiving deltas.
    open: Option<usize>,
    finish: Option<String>,
    usage: Value,
}

impl ChatToResponses {
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends one event: `event: <type>` and its data, `type` and `sequence_number` first.
    fn emit(&mut self, out: &mut Vec<u8>, kind: &str, fields: Value) {
        let mut data = Map::new();
        data.insert("type".into(), json!(kind));
        data.insert("sequence_number".into(), json!(self.sequence));
        self.sequence += 1;
        if let Value::Object(f) = fields {
            data.extend(f);
        }
        out.extend(format!("event: {kind}\ndata: {}\n\n", Value::Object(data)).into_bytes());
    }

    fn response(&self, status: &str, output: Vec<Value>, usage: Value, incomplete: Value) -> Value {
        response_object(&response_id(&self.chat_id), self.created, &self.model, status, output, usage, incomplete)
    }

    fn start(&mut self, out: &mut Vec<u8>, chunk: &Value) {
        self.started = true;
        self.chat_id = text(chunk, "id");
        self.model = chunk.get("model").cloned().unwrap_or(json!(""));
        self.created = chunk.get("created").and_then(Value::as_i64).unwrap_or_else(|| chrono::Utc::now().timestamp());
        let response = self.response("in_progress", vec![], Value::Null, Value::Null);
        self.emit(out, "response.created", json!({"response": response}));
        self.emit(out, "response.in_progress", json!({"response": response}));
    }

    fn count(&self, kind: fn(&Kind) -> bool) -> usize {
        self.items.iter().filter(|i| kind(&i.kind)).count()
    }

    /// Opens a new output item (closing the open one) and announces it.
    fn open_item(&mut self, out: &mut Vec<u8>, kind: Kind) -> usize {
        self.close_open(out);
        let id = match &kind {
            Kind::Message => nth(message_id(&self.chat_id), self.count(|k| *k == Kind::Message)),
            Kind::Reasoning => nth(reasoning_id(&self.chat_id), self.count(|k| *k == Kind::Reasoning)),
            Kind::Call { .. } => call_item_id(&self.chat_id, self.count(|k| matches!(k, Kind::Call { .. }))),
        };
        let index = self.items.len();
        let added = match &kind {
            Kind::Message => {
                json!({"type": "message", "id": id, "status": "in_progress", "role": "assistant", "content": []})
            }
            Kind::Reasoning => json!({"type": "reasoning", "id": id, "summary": []}),
            Kind::Call { call_id, name, .. } => call_item(&id, "in_progress", call_id, name, ""),
        };
        self.emit(out, "response.output_item.added", json!({"output_index": index, "item": added}));
        match &kind {
            Kind::Message => self.emit(
                out,
                "response.content_part.added",
                json!({"item_id": id, "output_index": index, "content_index": 0,
                       "part": {"type": "output_text", "text": "", "annotations": []}}),
            ),
            Kind::Reasoning => self.emit(
                out,
                "response.reasoning_summary_part.added",
                json!({"item_id": id, "output_index": index, "summary_index": 0,
                       "part": {"type": "summary_text", "text": ""}}),
            ),
            Kind::Call { .. } => {}
        }
        self.items.push(Item { id, kind, text: String::new() });
        self.open = Some(index);
        index
    }

    /// The open item of this kind (message or reasoning), opened if need be.
    fn open_of(&mut self, out: &mut Vec<u8>, kind: Kind) -> usize {
        match self.open {
            Some(i) if self.items[i].kind == kind => i,
            _ => self.open_item(out, kind),
        }
    }

    /// Closes the open item with its `.done` events.
    fn close_open(&mut self, out: &mut Vec<u8>) {
        let Some(index) = self.open.take() else { return };
        let (id, text, whole) = {
            let item = &self.items[index];
            (item.id.clone(), item.text.clone(), item.whole())
        };
        match self.items[index].kind {
            Kind::Message => {
                self.emit(
                    out,
                    "response.output_text.done",
                    json!({"item_id": id, "output_index": index, "content_index": 0, "text": text, "logprobs": []}),
                );
                self.emit(
                    out,
                    "response.content_part.done",
                    json!({"item_id": id, "output_index": index, "content_index": 0,
                           "part": {"type": "output_text", "text": text, "annotations": []}}),
                );
            }
            Kind::Reasoning => {
                self.emit(
                    out,
                    "response.reasoning_summary_text.done",
                    json!({"item_id": id, "output_index": index, "summary_index": 0, "text": text}),
                );
                self.emit(
                    out,
                    "response.reasoning_summary_part.done",
                    json!({"item_id": id, "output_index": index, "summary_index": 0,
                           "part": {"type": "summary_text", "text": text}}),
                );
            }
            Kind::Call { .. } => self.emit(
                out,
                "response.function_call_arguments.done",
                json!({"item_id": id, "output_index": index, "arguments": text}),
            ),
        }
        self.emit(out, "response.output_item.done", json!({"output_index": index, "item": whole}));
    }

    /// At `[DONE]`: closes what is open and sends the whole response.
    fn finish(&mut self, out: &mut Vec<u8>) {
        if !self.started {
            self.start(out, &Value::Null);
        }
        self.close_open(out);
        let (status, incomplete) = status_of_finish(self.finish.as_deref());
        let output = self.items.iter().map(Item::whole).collect();
        let response = self.response(status, output, self.usage.clone(), incomplete);
        let kind = if status == "completed" { "response.completed" } else { "response.incomplete" };
        self.emit(out, kind, json!({"response": response}));
        self.ended = true;
    }

    /// The client's bytes for one upstream event (often none).
    pub fn push(&mut self, ev: &Event) -> Vec<u8> {
        let mut out = Vec::new();
        if self.ended {
            return out;
        }
        if ev.data.trim() == "[DONE]" {
            self.finish(&mut out);
            return out;
        }
        let Some(v) = ev.json() else { return out };
        if let Some(err) = v.get("error").filter(|e| !e.is_null()) {
            let message = err.get("message").cloned().unwrap_or(json!("upstream error"));
            let code = err.get("code").cloned().unwrap_or(Value::Null);
            self.emit(&mut out, "error", json!({"code": code, "message": message, "param": null}));
            self.ended = true;
            return out;
        }
        if !self.started {
            self.start(&mut out, &v);
        }
        if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
            self.usage = usage_to_responses(u);
        }
        let Some(choice) = v.pointer("/choices/0") else { return out };
        let delta = choice.get("delta").unwrap_or(&Value::Null);
        let reasoning = ["reasoning_content", "reasoning"]
            .iter()
            .find_map(|k| delta.get(*k).and_then(Value::as_str).filter(|r| !r.is_empty()));
        if let Some(r) = reasoning {
            let index = self.open_of(&mut out, Kind::Reasoning);
            self.items[index].text.push_str(r);
            let id = self.items[index].id.clone();
            self.emit(
                &mut out,
                "response.reasoning_summary_text.delta",
                json!({"item_id": id, "output_index": index, "summary_index": 0, "delta": r}),
            );
        }
        if let Some(t) = delta.get("content").and_then(Value::as_str).filter(|t| !t.is_empty()) {
            let index = self.open_of(&mut out, Kind::Message);
            self.items[index].text.push_str(t);
            let id = self.items[index].id.clone();
            self.emit(
                &mut out,
                "response.output_text.delta",
                json!({"item_id": id, "output_index": index, "content_index": 0, "delta": t, "logprobs": []}),
            );
        }
        for call in delta.get("tool_calls").and_then(Value::as_array).into_iter().flatten() {
            let calls: Vec<(usize, u64, String)> = (self.items.iter().enumerate())
                .filter_map(|(i, it)| match &it.kind {
                    Kind::Call { call_id, chat_index, .. } => Some((i, *chat_index, call_id.clone())),
                    _ => None,
                })
                .collect();
            let id = call.get("id").and_then(Value::as_str).filter(|id| !id.is_empty());
            // Chat names a call by `index`; a provider that leaves it out names it by a new id.
            let chat_index = match call.get("index").and_then(Value::as_u64) {
                Some(n) => n,
                None => match (id, calls.last()) {
                    (Some(id), Some(last)) if id != last.2 => calls.len() as u64,
                    (_, Some(last)) => last.1,
                    (_, None) => 0,
                },
            };
            let name = call.pointer("/function/name").and_then(Value::as_str).unwrap_or("");
            let index = match calls.iter().find(|c| c.1 == chat_index) {
                Some(c) => c.0,
                None => {
                    let kind = Kind::Call { call_id: id.unwrap_or("").to_string(), name: name.to_string(), chat_index };
                    self.open_item(&mut out, kind)
                }
            };
            if let Kind::Call { name: n, .. } = &mut self.items[index].kind
                && n.is_empty()
            {
                *n = name.to_string();
            }
            let args = call.pointer("/function/arguments").and_then(Value::as_str).unwrap_or("");
            if args.is_empty() {
                continue;
            }
            self.items[index].text.push_str(args);
            // Arguments of a call already closed (interleaved calls) reach the client only in
            // the completed response.
            if self.open == Some(index) {
                let item_id = self.items[index].id.clone();
                self.emit(
                    &mut out,
                    "response.function_call_arguments.delta",
                    json!({"item_id": item_id, "output_index": index, "delta": args}),
                );
            }
        }
        if let Some(f) = choice.get("finish_reason").and_then(Value::as_str) {
            self.finish = Some(f.to_string());
            self.close_open(&mut out);
        }
        out
    }
}

/// A function call announced to the chat client: where the Responses stream names it.
#[derive(Debug)]
struct Call {
    item_id: String,
    output_index: Option<u64>,
    sent_arguments: bool,
}

/// Responses upstream, OpenAI chat client: Responses events → chat chunks.
#[derive(Debug, Default)]
pub struct ResponsesToChat {
    include_usage: bool,
    started: bool,
    ended: bool,
    id: String,
    model: Value,
    /// One timestamp for every chunk of the completion, as OpenAI sends.
    created: i64,
    calls: Vec<Call>,
    /// The reasoning part deltas last came from, so the next part starts a new paragraph.
    reasoning_at: Option<(String, u64)>,
}

impl ResponsesToChat {
    /// `include_usage`: the client asked for a final usage chunk (`stream_options.include_usage`).
    pub fn new(include_usage: bool) -> Self {
        ResponsesToChat { include_usage, ..Self::default() }
    }

    fn chunk(&self, choices: Value) -> Vec<u8> {
        sse_data(&json!({
            "id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
            "choices": choices,
        }))
    }

    fn delta(&self, delta: Value, finish: Option<&str>) -> Vec<u8> {
        self.chunk(json!([{"index": 0, "delta": delta, "finish_reason": finish}]))
    }

    fn start(&mut self, out: &mut Vec<u8>, response: &Value) {
        self.started = true;
        self.id = text(response, "id");
        self.model = response.get("model").cloned().unwrap_or(json!(""));
        self.created =
            response.get("created_at").and_then(Value::as_i64).unwrap_or_else(|| chrono::Utc::now().timestamp());
        out.extend(self.delta(json!({"role": "assistant", "content": ""}), None));
    }

    fn call_of(&self, v: &Value) -> Option<usize> {
        let item_id = v.get("item_id").and_then(Value::as_str);
        let index = v.get("output_index").and_then(Value::as_u64);
        (self.calls.iter().position(|c| item_id.is_some_and(|i| i == c.item_id)))
            .or_else(|| self.calls.iter().position(|c| index.is_some() && c.output_index == index))
    }

    fn error(&mut self, err: &Value) -> Vec<u8> {
        self.ended = true;
        let message =
            err.get("message").filter(|m| m.is_string()).cloned().unwrap_or(json!("the upstream response failed"));
        let code = err.get("code").cloned().unwrap_or(Value::Null);
        let kind = err.get("type").filter(|t| t.is_string()).or(code.as_str().map(|_| &code)).cloned();
        sse_data(&json!({"error": {"message": message, "type": kind.unwrap_or(json!("api_error")), "code": code}}))
    }

    /// The client's bytes for one upstream event (often none).
    pub fn push(&mut self, ev: &Event) -> Vec<u8> {
        let mut out = Vec::new();
        if self.ended {
            return out;
        }
        let Some(v) = ev.json() else { return out };
        let kind = v.get("type").and_then(Value::as_str).or(ev.name.as_deref()).unwrap_or("");
        match kind {
            "response.failed" => return self.error(v.pointer("/response/error").unwrap_or(&Value::Null)),
            "error" => {
                let err = match v.get("error").filter(|e| e.is_object()) {
                    Some(e) => e.clone(),
                    None => json!({"message": v.get("message"), "code": v.get("code")}),
                };
                return self.error(&err);
            }
            "response.created" if !self.started => {
                self.start(&mut out, v.get("response").unwrap_or(&Value::Null));
                return out;
            }
            _ => {}
        }
        let starts_output = matches!(
            kind,
            "response.output_text.delta"
                | "response.refusal.delta"
                | "response.reasoning_summary_text.delta"
                | "response.reasoning_text.delta"
                | "response.output_item.added"
                | "response.function_call_arguments.delta"
                | "response.function_call_arguments.done"
                | "response.completed"
                | "response.incomplete"
        );
        if starts_output && !self.started {
            self.start(&mut out, v.get("response").unwrap_or(&Value::Null));
        }
        let delta = v.get("delta").and_then(Value::as_str).unwrap_or("");
        match kind {
            "response.output_text.delta" if !delta.is_empty() => {
                out.extend(self.delta(json!({"content": delta}), None))
            }
            "response.refusal.delta" if !delta.is_empty() => out.extend(self.delta(json!({"refusal": delta}), None)),
            "response.reasoning_summary_text.delta" | "response.reasoning_text.delta" if !delta.is_empty() => {
                let part = v.get("summary_index").or(v.get("content_index")).and_then(Value::as_u64).unwrap_or(0);
                let at = (text(&v, "item_id"), part);
                let mut r = String::new();
                if self.reasoning_at.as_ref().is_some_and(|a| *a != at) {
                    r.push_str("\n\n");
                }
                self.reasoning_at = Some(at);
                r.push_str(delta);
                out.extend(self.delta(json!({"reasoning_content": r}), None));
            }
            "response.output_item.added" if v.pointer("/item/type") == Some(&json!("function_call")) => {
                let item = &v["item"];
                let args = text(item, "arguments");
                let n = self.calls.len();
                self.calls.push(Call {
                    item_id: text(item, "id"),
                    output_index: v.get("output_index").and_then(Value::as_u64),
                    sent_arguments: !args.is_empty(),
                });
                let call = json!({"index": n, "id": text(item, "call_id"), "type": "function",
                                  "function": {"name": text(item, "name"), "arguments": args}});
                out.extend(self.delta(json!({"tool_calls": [call]}), None));
            }
            "response.function_call_arguments.delta" if !delta.is_empty() => {
                if let Some(n) = self.call_of(&v) {
                    self.calls[n].sent_arguments = true;
                    out.extend(
                        self.delta(json!({"tool_calls": [{"index": n, "function": {"arguments": delta}}]}), None),
                    );
                }
            }
            // Arguments sent whole at the end, never as deltas.
            "response.function_call_arguments.done" => {
                let args = text(&v, "arguments");
                if let Some(n) = self.call_of(&v).filter(|n| !self.calls[*n].sent_arguments && !args.is_empty()) {
                    self.calls[n].sent_arguments = true;
                    out.extend(
                        self.delta(json!({"tool_calls": [{"index": n, "function": {"arguments": args}}]}), None),
                    );
                }
            }
            "response.completed" | "response.incomplete" => {
                let response = v.get("response").unwrap_or(&Value::Null);
                let incomplete = response.pointer("/incomplete_details/reason").and_then(Value::as_str);
                let called = !self.calls.is_empty()
                    || (response.get("output").and_then(Value::as_array).into_iter().flatten())
                        .any(|i| i.get("type").and_then(Value::as_str) == Some("function_call"));
                out.extend(self.delta(json!({}), Some(finish_of_status(incomplete, called))));
                if self.include_usage {
                    let usage = response.get("usage").filter(|u| u.is_object()).cloned().unwrap_or(json!({}));
                    let mut chunk = json!({
                        "id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                        "choices": [],
                    });
                    chunk["usage"] = usage_to_chat(&usage);
                    out.extend(sse_data(&chunk));
                }
                out.extend(b"data: [DONE]\n\n");
                self.ended = true;
            }
            _ => {}
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::translate::sse::Splitter;
    use proptest::prelude::*;

    /// Recorded chat streams (`tests/fixtures/streams/`), the source of `ChatToResponses`.
    const CHAT: [(&str, &str); 6] = [
        ("openai-chat-text", include_str!("../../../../tests/fixtures/streams/openai-chat-text.sse")),
        ("openai-chat-tool", include_str!("../../../../tests/fixtures/streams/openai-chat-tool.sse")),
        ("openai-chat-preamble", include_str!("../../../../tests/fixtures/streams/openai-chat-preamble.sse")),
        ("openai-chat-reasoning", include_str!("../../../../tests/fixtures/streams/openai-chat-reasoning.sse")),
        (
            "openai-chat-error-before-content",
            include_str!("../../../../tests/fixtures/streams/openai-chat-error-before-content.sse"),
        ),
        ("openai-chat-truncated", include_str!("../../../../tests/fixtures/streams/openai-chat-truncated.sse")),
    ];

    /// Recorded Responses streams, the source of `ResponsesToChat`.
    const RESPONSES: [(&str, &str); 5] = [
        ("openai-responses-text", include_str!("../../../../tests/fixtures/streams/openai-responses-text.sse")),
        ("openai-responses-tool", include_str!("../../../../tests/fixtures/streams/openai-responses-tool.sse")),
        (
            "openai-responses-reasoning",
            include_str!("../../../../tests/fixtures/streams/openai-responses-reasoning.sse"),
        ),
        (
            "openai-responses-error-before-content",
            include_str!("../../../../tests/fixtures/streams/openai-responses-error-before-content.sse"),
        ),
        (
            "openai-responses-truncated",
            include_str!("../../../../tests/fixtures/streams/openai-responses-truncated.sse"),
        ),
    ];

    #[derive(Clone, Copy, Debug, PartialEq)]
    enum Dir {
        ToResponses,
        ToChat,
    }

    /// Every recorded stream with the translator that reads it.
    fn recorded() -> Vec<(&'static str, &'static str, Dir)> {
        let chat = CHAT.iter().map(|(n, t)| (*n, *t, Dir::ToResponses));
        chat.chain(RESPONSES.iter().map(|(n, t)| (*n, *t, Dir::ToChat))).collect()
    }

    /// The client's bytes for a source stream written in `pieces`.
    fn run(dir: Dir, pieces: &[&[u8]]) -> String {
        let (mut splitter, mut to_responses, mut to_chat) =
            (Splitter::default(), ChatToResponses::new(), ResponsesToChat::new(true));
        let mut out = Vec::new();
        for p in pieces {
            for ev in splitter.push(p) {
                out.extend(match dir {
                    Dir::ToResponses => to_responses.push(&ev),
                    Dir::ToChat => to_chat.push(&ev),
                });
            }
        }
        String::from_utf8(out).expect("UTF-8")
    }

    fn events(stream: &str) -> Vec<(Option<String>, String)> {
        Splitter::default().push(stream.as_bytes()).into_iter().map(|e| (e.name, e.data)).collect()
    }

    /// What a stream says, whichever format wrote it.
    #[derive(Debug, Default, PartialEq)]
    struct Meaning {
        text: String,
        reasoning: String,
        /// call id, name, arguments.
        calls: Vec<(String, String, String)>,
        finish: Option<String>,
        /// prompt, completion, total, cached, reasoning tokens.
        usage: Option<[i64; 5]>,
        ended: bool,
    }

    fn chat_usage(u: &Value) -> Option<[i64; 5]> {
        u.is_object().then(|| {
            [
                "/prompt_tokens",
                "/completion_tokens",
                "/total_tokens",
                "/prompt_tokens_details/cached_tokens",
                "/completion_tokens_details/reasoning_tokens",
            ]
            .map(|p| int(u, p))
        })
    }

    fn chat_meaning(stream: &str) -> Meaning {
        let mut m = Meaning::default();
        let mut calls: Vec<(u64, String, String, String)> = Vec::new();
        for (_, data) in events(stream) {
            if data == "[DONE]" {
                m.ended = true;
                continue;
            }
            let Ok(v) = serde_json::from_str::<Value>(&data) else { continue };
            if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
                m.usage = chat_usage(u);
            }
            let Some(c) = v.pointer("/choices/0") else { continue };
            let d = &c["delta"];
            m.text.push_str(d["content"].as_str().unwrap_or(""));
            m.reasoning.push_str(d["reasoning_content"].as_str().unwrap_or(""));
            for call in d["tool_calls"].as_array().into_iter().flatten() {
                let n = call["index"].as_u64().unwrap();
                let args = call.pointer("/function/arguments").and_then(Value::as_str).unwrap_or("");
                match calls.iter_mut().find(|c| c.0 == n) {
                    Some(c) => c.3.push_str(args),
                    None => calls.push((
                        n,
                        text(call, "id"),
                        call["function"]["name"].as_str().unwrap().into(),
                        args.into(),
                    )),
                }
            }
            if let Some(f) = c["finish_reason"].as_str() {
                m.finish = Some(f.into());
            }
        }
        m.calls = calls.into_iter().map(|c| (c.1, c.2, c.3)).collect();
        m
    }

    fn responses_meaning(stream: &str) -> Meaning {
        let mut m = Meaning::default();
        let mut calls: Vec<(String, String, String, String)> = Vec::new();
        for (_, data) in events(stream) {
            let v: Value = serde_json::from_str(&data).expect("JSON events");
            let delta = v["delta"].as_str().unwrap_or("");
            match v["type"].as_str().unwrap() {
                "response.output_text.delta" => m.text.push_str(delta),
                "response.reasoning_summary_text.delta" => m.reasoning.push_str(delta),
                "response.output_item.added" if v["item"]["type"] == "function_call" => {
                    let i = &v["item"];
                    calls.push((text(i, "id"), text(i, "call_id"), text(i, "name"), text(i, "arguments")));
                }
                "response.function_call_arguments.delta" => {
                    calls.iter_mut().find(|c| c.0 == v["item_id"]).expect("a call announced").3.push_str(delta);
                }
                "response.completed" | "response.incomplete" => {
                    let r = &v["response"];
                    let incomplete = r.pointer("/incomplete_details/reason").and_then(Value::as_str);
                    m.finish = Some(finish_of_status(incomplete, !calls.is_empty()).into());
                    m.usage = chat_usage(&usage_to_chat(&r["usage"]));
                    m.ended = true;
                }
                _ => {}
            }
        }
        m.calls = calls.into_iter().map(|c| (c.1, c.2, c.3)).collect();
        m
    }

    /// What a strict Responses client checks: numbering, names, items opened and closed in
    /// order, `.done` texts that are their deltas, a final response holding the items.
    fn check_responses_events(name: &str, out: &str) {
        let evs = events(out);
        let mut added: Vec<Value> = Vec::new();
        let mut done: Vec<Value> = Vec::new();
        let mut texts: Vec<(String, String)> = Vec::new();
        for (n, (event, data)) in evs.iter().enumerate() {
            let v: Value = serde_json::from_str(data).unwrap();
            let kind = v["type"].as_str().unwrap();
            assert_eq!(event.as_deref(), Some(kind), "{name}: event name");
            assert_eq!(v["sequence_number"], json!(n), "{name}: numbering");
            let item_text = |texts: &mut Vec<(String, String)>| {
                let id = text(&v, "item_id");
                match texts.iter_mut().find(|t| t.0 == id) {
                    Some(t) => t.1.push_str(v["delta"].as_str().unwrap()),
                    None => texts.push((id, v["delta"].as_str().unwrap().into())),
                }
            };
            match kind {
                "response.output_item.added" => {
                    assert_eq!(v["output_index"], json!(added.len()), "{name}");
                    assert_eq!(added.len(), done.len(), "{name}: the previous item closed first");
                    added.push(v["item"].clone());
                }
                "response.output_item.done" => {
                    assert_eq!(v["output_index"], json!(done.len()), "{name}");
                    assert_eq!(v["item"]["id"], added[done.len()]["id"], "{name}");
                    done.push(v["item"].clone());
                }
                "response.output_text.delta"
                | "response.reasoning_summary_text.delta"
                | "response.function_call_arguments.delta" => item_text(&mut texts),
                "response.output_text.done" | "response.reasoning_summary_text.done" => {
                    let whole = texts.iter().find(|t| t.0 == v["item_id"]).map_or("", |t| t.1.as_str());
                    assert_eq!(v["text"], whole, "{name}");
                }
                "response.function_call_arguments.done" => {
                    let whole = texts.iter().find(|t| t.0 == v["item_id"]).map_or("", |t| t.1.as_str());
                    assert_eq!(v["arguments"], whole, "{name}");
                }
                "response.completed" | "response.incomplete" => {
                    assert_eq!(n, evs.len() - 1, "{name}: the response ends the stream");
                    assert_eq!(v["response"]["output"], json!(done), "{name}: the final output is the items done");
                }
                _ => {}
            }
        }
        if evs.len() > 1 {
            assert_eq!(evs[0].0.as_deref(), Some("response.created"), "{name}");
            assert_eq!(evs[1].0.as_deref(), Some("response.in_progress"), "{name}");
        }
    }

    /// What a strict chat client checks: one id, model and `created`, the role first, one finish,
    /// `[DONE]` last.
    fn check_chat_chunks(name: &str, out: &str) {
        let evs = events(out);
        let chunks: Vec<Value> = evs.iter().filter_map(|e| serde_json::from_str(&e.1).ok()).collect();
        if chunks.iter().any(|c| c.get("error").is_some()) {
            return;
        }
        for c in &chunks {
            assert_eq!(
                (&c["id"], &c["created"], &c["model"]),
                (&chunks[0]["id"], &chunks[0]["created"], &chunks[0]["model"]),
                "{name}"
            );
            assert_eq!(c["object"], "chat.completion.chunk", "{name}");
        }
        assert_eq!(chunks[0]["choices"][0]["delta"], json!({"role": "assistant", "content": ""}), "{name}");
        let finishes =
            chunks.iter().filter(|c| c.pointer("/choices/0/finish_reason").is_some_and(|f| !f.is_null())).count();
        let done = evs.iter().position(|e| e.1 == "[DONE]");
        assert_eq!(finishes, usize::from(done.is_some()), "{name}");
        assert!(done.is_none_or(|d| d == evs.len() - 1), "{name}");
    }

    #[test]
    fn chat_streams_become_responses_events_that_mean_the_same() {
        for (name, text) in CHAT.iter().filter(|(n, _)| !n.ends_with("error-before-content")) {
            let out = run(Dir::ToResponses, &[text.as_bytes()]);
            check_responses_events(name, &out);
            let (source, got) = (chat_meaning(text), responses_meaning(&out));
            assert_eq!(got, source, "{name}");
            assert_eq!(got.ended, !name.ends_with("truncated"), "{name}");
        }
        let out = run(Dir::ToResponses, &[CHAT[3].1.as_bytes()]);
        let last: Value = serde_json::from_str(&events(&out).last().unwrap().1).unwrap();
        assert_eq!(
            last["response"]["usage"],
            json!({"input_tokens": 14, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 58,
                   "output_tokens_details": {"reasoning_tokens": 46}, "total_tokens": 72})
        );
        assert_eq!(
            last["response"]["output"],
            json!([
                {"type": "reasoning", "id": "rs_C4f7Qe2LrXv9Hn3KbTz8WsYd1Mp6A",
                 "summary": [{"type": "summary_text", "text": "The user wants 17 + 25.\n\n17 + 25 = 42."}]},
                {"type": "message", "id": "msg_C4f7Qe2LrXv9Hn3KbTz8WsYd1Mp6A", "status": "completed", "role": "assistant",
                 "content": [{"type": "output_text", "text": "17 + 25 = **42**.", "annotations": []}]},
            ])
        );
        assert_eq!(
            (&last["response"]["id"], &last["response"]["created_at"]),
            (&json!("resp_C4f7Qe2LrXv9Hn3KbTz8WsYd1Mp6A"), &json!(1755432001))
        );
    }

    #[test]
    fn a_chat_tool_stream_opens_one_function_call_item_per_call() {
        let out = run(Dir::ToResponses, &[CHAT[1].1.as_bytes()]);
        let kinds: Vec<String> = events(&out).into_iter().map(|e| e.0.unwrap()).collect();
        assert_eq!(
            kinds,
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.done",
                "response.output_item.done",
                "response.completed",
            ]
        );
        let evs = events(&out);
        let added: Value = serde_json::from_str(&evs[2].1).unwrap();
        assert_eq!(
            added,
            json!({"type": "response.output_item.added", "sequence_number": 2, "output_index": 0,
                   "item": {"type": "function_call", "id": "fc_B9MBs8CjcvOU2jLn4n570S5qMJKcT_0", "status": "in_progress",
                            "call_id": "call_DdmO9pD3xa9XTPNJ32zg2hcA", "name": "get_weather", "arguments": ""}})
        );
        let done: Value = serde_json::from_str(&evs[7].1).unwrap();
        assert_eq!(done["item"]["arguments"], "{\"location\":\"San Francisco, CA\"}");
        assert_eq!(done["item"]["status"], "completed");
    }

    #[test]
    fn an_upstream_error_chunk_is_one_error_event_and_nothing_more() {
        let out = run(Dir::ToResponses, &[CHAT[4].1.as_bytes(), b"data: [DONE]\n\n"]);
        let evs = events(&out);
        assert_eq!(evs.len(), 1, "{out}");
        assert_eq!(evs[0].0.as_deref(), Some("error"));
        assert_eq!(
            serde_json::from_str::<Value>(&evs[0].1).unwrap(),
            json!({"type": "error", "sequence_number": 0, "code": "rate_limit_exceeded",
                   "message": "Rate limit reached for gpt-4.1-mini in organization org-x on tokens per min (TPM): Limit 200000, Used 199000.",
                   "param": null})
        );
    }

    #[test]
    fn a_chat_stream_cut_for_length_ends_incomplete_after_the_usage_chunk() {
        let chunk = |delta: Value, finish: Value| {
            format!(
                "data: {}\n\n",
                json!({"id": "chatcmpl-L", "created": 5, "model": "m", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
            )
        };
        let stream = [
            chunk(json!({"role": "assistant", "content": "Once"}), Value::Null),
            chunk(json!({}), json!("length")),
            format!("data: {}\n\n", json!({"id": "chatcmpl-L", "created": 5, "model": "m", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}})),
        ]
        .concat();
        let before_done = run(Dir::ToResponses, &[stream.as_bytes()]);
        assert!(!before_done.contains("response.incomplete") && !before_done.contains("response.completed"));
        let out = run(Dir::ToResponses, &[stream.as_bytes(), b"data: [DONE]\n\n"]);
        check_responses_events("length", &out);
        let (event, data) = events(&out).pop().unwrap();
        let v: Value = serde_json::from_str(&data).unwrap();
        assert_eq!(event.as_deref(), Some("response.incomplete"));
        assert_eq!(
            (&v["response"]["status"], &v["response"]["incomplete_details"]),
            (&json!("incomplete"), &json!({"reason": "max_output_tokens"}))
        );
        assert_eq!(v["response"]["usage"]["output_tokens"], 1);
    }

    #[test]
    fn responses_streams_become_chat_chunks_that_mean_the_same() {
        for (name, text) in RESPONSES.iter().filter(|(n, _)| !n.ends_with("error-before-content")) {
            let out = run(Dir::ToChat, &[text.as_bytes()]);
            check_chat_chunks(name, &out);
            let (source, got) = (responses_meaning(text), chat_meaning(&out));
            assert_eq!(got, source, "{name}");
            assert_eq!(got.ended, !name.ends_with("truncated"), "{name}");
        }
        let out = run(Dir::ToChat, &[RESPONSES[1].1.as_bytes()]);
        let evs = events(&out);
        assert_eq!(
            serde_json::from_str::<Value>(&evs[1].1).unwrap()["choices"][0]["delta"],
            json!({"tool_calls": [{"index": 0, "id": "call_Kq3vX8bN2mR7tY5wZ1pL9dF4", "type": "function",
                                   "function": {"name": "get_weather", "arguments": ""}}]})
        );
        let n = evs.len();
        assert_eq!(
            serde_json::from_str::<Value>(&evs[n - 2].1).unwrap(),
            json!({"id": "resp_68a1c2f0e5b88190a6d1a7c3f2e4b5d60c9e8f7a6b5c4d3e", "object": "chat.completion.chunk",
                   "created": 1755431664, "model": "gpt-4.1-2025-04-14", "choices": [],
                   "usage": {"prompt_tokens": 81, "completion_tokens": 17, "total_tokens": 98,
                             "prompt_tokens_details": {"cached_tokens": 64}, "completion_tokens_details": {"reasoning_tokens": 0}}})
        );
        assert_eq!(serde_json::from_str::<Value>(&evs[n - 3].1).unwrap()["choices"][0]["finish_reason"], "tool_calls");
        let out = run(Dir::ToChat, &[RESPONSES[2].1.as_bytes()]);
        let m = chat_meaning(&out);
        assert_eq!(
            (m.reasoning.as_str(), m.text.as_str()),
            ("**Adding the numbers**\n\nThe user asks for 17 + 25. 17 + 25 = 42.", "17 + 25 = **42**.")
        );
        assert_eq!(m.usage, Some([14, 214, 228, 0, 192]));
    }

    #[test]
    fn without_include_usage_there_is_no_usage_chunk() {
        let mut splitter = Splitter::default();
        let mut t = ResponsesToChat::new(false);
        let out: Vec<u8> = splitter.push(RESPONSES[0].1.as_bytes()).iter().flat_map(|e| t.push(e)).collect();
        let out = String::from_utf8(out).unwrap();
        assert!(!out.contains("\"usage\"") && out.ends_with("data: [DONE]\n\n"), "{out}");
    }

    #[test]
    fn a_failed_response_or_an_error_event_is_a_chat_error_chunk() {
        let out = run(Dir::ToChat, &[RESPONSES[3].1.as_bytes()]);
        let evs = events(&out);
        assert_eq!(evs.len(), 2, "{out}");
        assert_eq!(
            serde_json::from_str::<Value>(&evs[1].1).unwrap(),
            json!({"error": {"message": "The model failed to generate a response.", "type": "server_error", "code": "server_error"}})
        );
        let err = b"event: error\ndata: {\"type\":\"error\",\"sequence_number\":3,\"code\":\"rate_limit_exceeded\",\"message\":\"slow down\",\"param\":null}\n\n";
        let out = run(
            Dir::ToChat,
            &[
                RESPONSES[4].1.as_bytes(),
                err,
                b"event: response.completed\ndata: {\"type\":\"response.completed\"}\n\n",
            ],
        );
        let (_, last) = events(&out).pop().unwrap();
        assert_eq!(
            serde_json::from_str::<Value>(&last).unwrap(),
            json!({"error": {"message": "slow down", "type": "rate_limit_exceeded", "code": "rate_limit_exceeded"}})
        );
        assert!(!out.contains("[DONE]"));
    }

    #[test]
    fn a_chat_stream_through_responses_and_back_means_the_same() {
        for (name, text) in CHAT.iter().filter(|(n, _)| !n.ends_with("error-before-content")) {
            let there = run(Dir::ToResponses, &[text.as_bytes()]);
            let back = run(Dir::ToChat, &[there.as_bytes()]);
            check_chat_chunks(name, &back);
            let (mut source, got) = (chat_meaning(text), chat_meaning(&back));
            // A chat client that asked for usage gets a usage chunk, zeros when the source had none.
            if source.ended && source.usage.is_none() {
                source.usage = Some([0; 5]);
            }
            assert_eq!(got, source, "{name}");
        }
    }

    #[test]
    fn every_single_split_gives_the_bytes_of_the_whole_stream() {
        for (name, text, dir) in recorded() {
            let b = text.as_bytes();
            let want = run(dir, &[b]);
            assert!(!want.is_empty(), "{name}");
            for i in 0..=b.len() {
                assert_eq!(run(dir, &[&b[..i], &b[i..]]), want, "{name}, split at byte {i}");
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn any_chunking_gives_the_bytes_of_the_whole_stream(
            which in 0usize..11,
            cuts in proptest::collection::vec(0usize..5000, 0..12),
        ) {
            let (name, text, dir) = recorded()[which];
            let b = text.as_bytes();
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c % (b.len() + 1)).collect();
            cuts.sort_unstable();
            let mut pieces = Vec::new();
            let mut from = 0;
            for c in cuts {
                pieces.push(&b[from..c]);
                from = c;
            }
            pieces.push(&b[from..]);
            prop_assert_eq!(run(dir, &pieces), run(dir, &[b]), "{}", name);
        }

        #[test]
        fn a_stream_cut_anywhere_never_ends_cleanly(which in 0usize..11, cut in 0usize..100_000) {
            let (name, text, dir) = recorded()[which];
            let b = text.as_bytes();
            let out = run(dir, &[&b[..cut % b.len()]]);
            let end = match dir {
                Dir::ToResponses => ["response.completed", "response.incomplete"],
                Dir::ToChat => ["[DONE]", "[DONE]"],
            };
            prop_assert!(!end.iter().any(|e| out.contains(e)), "{} cut at {}: {}", name, cut % b.len(), out);
        }
    }
}
