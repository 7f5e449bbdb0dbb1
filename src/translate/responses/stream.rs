//! Streamed answers: OpenAI `chat.completion.chunk`s ⇄ Responses events, event by event. A
//! translator ends its stream only when its source did (`[DONE]`, `response.completed`): a cut
//! source is the relay's business, never closed cleanly here.

use super::*;
use crate::translate::sse::Event;
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
            Kind::Message => json!({"type": "message", "id": id, "status": "in_progress", "role": "assistant", "content": []}),
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
        let message = err.get("message").filter(|m| m.is_string()).cloned().unwrap_or(json!("the upstream response failed"));
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
            "response.output_text.delta" if !delta.is_empty() => out.extend(self.delta(json!({"content": delta}), None)),
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
                    out.extend(self.delta(json!({"tool_calls": [{"index": n, "function": {"arguments": delta}}]}), None));
                }
            }
            // Arguments sent whole at the end, never as deltas.
            "response.function_call_arguments.done" => {
                let args = text(&v, "arguments");
                if let Some(n) = self.call_of(&v).filter(|n| !self.calls[*n].sent_arguments && !args.is_empty()) {
                    self.calls[n].sent_arguments = true;
                    out.extend(self.delta(json!({"tool_calls": [{"index": n, "function": {"arguments": args}}]}), None));
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
