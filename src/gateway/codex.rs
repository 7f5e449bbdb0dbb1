//! The ChatGPT Codex backend's request rules (docs/providers.md, "Codex"): it keeps nothing
//! (`store: false`), answers only as a stream (`stream: true`; a client that asked for one
//! answer gets the `response` of the stream's `response.completed` event), and requires
//! non-empty `instructions`.

use super::translate::sse::Splitter;
use bytes::Bytes;
use serde_json::{Map, Value};

/// The instructions sent when the request carries none and no system or developer message.
pub const DEFAULT_INSTRUCTIONS: &str = "You are a helpful assistant.";

/// The Responses body as the Codex backend takes it. Without `instructions`, the text of the
/// input's system and developer messages becomes them (and those messages leave the input).
pub fn body(body: &Map<String, Value>) -> Map<String, Value> {
    let mut out = body.clone();
    out.insert("store".into(), Value::Bool(false));
    out.insert("stream".into(), Value::Bool(true));
    let given = out.get("instructions").and_then(Value::as_str).is_some_and(|s| !s.trim().is_empty());
    if given {
        return out;
    }
    let mut lifted = Vec::new();
    if let Some(Value::Array(items)) = out.get_mut("input") {
        items.retain(|item| {
            let role = item.get("role").and_then(Value::as_str);
            if !matches!(role, Some("system" | "developer")) {
                return true;
            }
            lifted.push(text_of(item.get("content")));
            false
        });
    }
    let lifted = lifted.join("\n\n");
    let instructions = if lifted.trim().is_empty() { DEFAULT_INSTRUCTIONS.to_string() } else { lifted };
    out.insert("instructions".into(), Value::String(instructions));
    out
}

/// The text of a message's content: a string, or its text parts joined.
fn text_of(content: Option<&Value>) -> String {
    match content {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => {
            parts.iter().filter_map(|p| p.get("text").and_then(Value::as_str)).collect::<Vec<_>>().join("\n")
        }
        _ => String::new(),
    }
}

/// What a whole Codex stream came to.
#[derive(Debug, PartialEq)]
pub enum Whole {
    /// The `response` object of `response.completed`: the one answer, as JSON.
    Completed(Bytes),
    /// The data of the `error` or `response.failed` event that ended it.
    Failed(String),
    /// The stream ended without either.
    Cut,
}

/// Reads a whole stream for its one answer.
pub fn whole(stream: &[u8]) -> Whole {
    let mut split = Splitter::default();
    let mut events = split.push(stream);
    events.extend(split.push(b"\n\n"));
    for ev in events {
        let Some(v) = ev.json() else { continue };
        let kind = v.get("type").and_then(Value::as_str).or(ev.name.as_deref());
        match kind {
            Some("response.completed") => {
                return match v.get("response") {
                    Some(r) if r.is_object() => Whole::Completed(Bytes::from(r.to_string())),
                    _ => Whole::Cut,
                };
            }
            Some("error" | "response.failed") => return Whole::Failed(ev.data),
            _ => {}
        }
    }
    Whole::Cut
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn map(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn the_body_keeps_nothing_streams_and_has_instructions() {
        let b = body(&map(json!({"model": "gpt-5", "input": "hi", "store": true, "stream": false})));
        assert_eq!(b["store"], false);
        assert_eq!(b["stream"], true);
        assert_eq!(b["instructions"], DEFAULT_INSTRUCTIONS);
        assert_eq!(b["input"], "hi");

        let given = body(&map(json!({"input": [], "instructions": "Be brief."})));
        assert_eq!(given["instructions"], "Be brief.");

        let lifted = body(&map(json!({"instructions": " ", "input": [
            {"role": "system", "content": "Be terse."},
            {"role": "developer", "content": [{"type": "input_text", "text": "Use French."}]},
            {"role": "user", "content": "hello"}
        ]})));
        assert_eq!(lifted["instructions"], "Be terse.\n\nUse French.");
        assert_eq!(lifted["input"], json!([{"role": "user", "content": "hello"}]));
    }

    #[test]
    fn a_whole_stream_gives_its_completed_response_or_says_why_not() {
        let done = b"event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"r\"}}\n\n\
event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"r\",\"output\":[]}}";
        assert_eq!(whole(done), Whole::Completed(Bytes::from(r#"{"id":"r","output":[]}"#)));
        let crlf = b"data: {\"type\":\"response.completed\",\"response\":{\"id\":\"x\"}}\r\n\r\n";
        assert_eq!(whole(crlf), Whole::Completed(Bytes::from(r#"{"id":"x"}"#)));
        let failed =
            b"data: {\"type\":\"response.failed\",\"response\":{\"error\":{\"code\":\"rate_limit_exceeded\"}}}\n\n";
        assert!(matches!(whole(failed), Whole::Failed(d) if d.contains("rate_limit_exceeded")));
        assert_eq!(whole(b"data: {\"type\":\"response.created\"}\n\n"), Whole::Cut);
        assert_eq!(whole(b""), Whole::Cut);
    }
}
