//! What differs between the client APIs rota serves: paths, error bodies, where the session
//! key and token usage live, and which event commits a stream.

use crate::config::WireFormat;
use crate::gateway::translate::sse::Event;
use crate::prices::Tokens;
use serde_json::{Value, json};

/// The API a client called.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Api {
    Chat,
    Responses,
    Messages,
}

impl Api {
    pub fn as_str(self) -> &'static str {
        match self {
            Api::Chat => "chat",
            Api::Responses => "responses",
            Api::Messages => "messages",
        }
    }

    /// The wire format an upstream must speak to serve this API without translation.
    pub fn wire(self) -> WireFormat {
        match self {
            Api::Chat | Api::Responses => WireFormat::Openai,
            Api::Messages => WireFormat::Anthropic,
        }
    }

    /// The path appended to the provider's base URL (the one its official SDK uses).
    pub fn upstream_path(self) -> &'static str {
        match self {
            Api::Chat => "/chat/completions",
            Api::Responses => "/responses",
            Api::Messages => "/v1/messages",
        }
    }

    /// An error body in this API's format.
    pub fn error_body(self, status: u16, message: &str) -> Value {
        match self {
            Api::Messages => json!({"type": "error", "error": {"type": anthropic_type(status), "message": message}}),
            Api::Chat | Api::Responses => json!({"error": {
                "message": message, "type": openai_type(status), "param": null, "code": openai_code(status)
            }}),
        }
    }

    /// An in-band stream error event in this API's format (after the response was committed).
    pub fn error_event(self, message: &str) -> Vec<u8> {
        match self {
            Api::Messages => {
                let body = json!({"type": "error", "error": {"type": "api_error", "message": message}});
                format!("event: error\ndata: {body}\n\n").into_bytes()
            }
            Api::Chat => {
                format!("data: {}\n\n", json!({"error": {"message": message, "type": "server_error", "code": null}}))
                    .into_bytes()
            }
            Api::Responses => {
                let body = json!({"type": "error", "code": "server_error", "message": message, "param": null});
                format!("event: error\ndata: {body}\n\n").into_bytes()
            }
        }
    }

    /// The session key a request carries in its body (docs/rotation.md, rule 7): Anthropic
    /// `metadata.user_id` (the `session_id` inside when it is Claude Code's JSON object of ids);
    /// Responses `prompt_cache_key` (Codex's conversation), else `user`; chat `user`.
    pub fn body_session(self, body: &serde_json::Map<String, Value>) -> Option<String> {
        fn text(v: Option<&Value>) -> Option<&str> {
            v.and_then(Value::as_str).filter(|s| !s.is_empty())
        }
        match self {
            Api::Messages => {
                let user_id = text(body.get("metadata").and_then(|m| m.get("user_id")))?;
                let inner = user_id
                    .starts_with('{')
                    .then(|| serde_json::from_str::<Value>(user_id).ok())
                    .flatten()
                    .and_then(|ids| text(ids.get("session_id")).map(str::to_string));
                Some(inner.unwrap_or_else(|| user_id.to_string()))
            }
            Api::Responses => text(body.get("prompt_cache_key")).or_else(|| text(body.get("user"))).map(str::to_string),
            Api::Chat => text(body.get("user")).map(str::to_string),
        }
    }
}

fn openai_type(status: u16) -> &'static str {
    match status {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        429 => "rate_limit_error",
        400 | 413 | 422 => "invalid_request_error",
        _ => "server_error",
    }
}

fn openai_code(status: u16) -> Value {
    match status {
        401 => json!("invalid_api_key"),
        404 => json!("model_not_found"),
        429 => json!("rate_limit_exceeded"),
        _ => Value::Null,
    }
}

fn anthropic_type(status: u16) -> &'static str {
    match status {
        400 | 422 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        _ => "api_error",
    }
}

/// Token usage in a response body or stream event, each count possibly unknown.
pub fn usage(v: &Value) -> Tokens {
    usage_in(v.get("usage"), v.get("message"), v.get("response"))
}

/// The token counts of a buffered answer passed through as is, read without building the whole
/// document: only `usage` (and `message`/`response`, which may hold it) are kept. `None` when the
/// body is not a JSON object.
pub fn usage_of(body: &[u8]) -> Option<Tokens> {
    /// The fields [`usage`] reads; the rest of the answer is skipped, not built.
    #[derive(serde::Deserialize)]
    struct Envelope {
        usage: Option<Value>,
        message: Option<Value>,
        response: Option<Value>,
    }
    if body.trim_ascii_start().first() != Some(&b'{') {
        return None;
    }
    match serde_json::from_slice::<Envelope>(body) {
        Ok(e) => Some(usage_in(e.usage.as_ref(), e.message.as_ref(), e.response.as_ref())),
        // A repeated key, or bytes that are not UTF-8 inside a string: read it the long way, as
        // any JSON object is served.
        Err(_) => match serde_json::from_str::<Value>(&String::from_utf8_lossy(body)) {
            Ok(v @ Value::Object(_)) => Some(usage(&v)),
            _ => None,
        },
    }
}

fn usage_in(usage: Option<&Value>, message: Option<&Value>, response: Option<&Value>) -> Tokens {
    let u = usage.or_else(|| message.and_then(|m| m.get("usage"))).or_else(|| response.and_then(|r| r.get("usage")));
    let Some(u) = u.filter(|u| u.is_object()) else { return Tokens::default() };
    // Each field by its keys, not `Value::pointer`: a pointer's path is split and unescaped
    // into new strings at every call, seven of them per answer (docs/performance.md).
    let at = |path: &[&str]| path.iter().try_fold(u, |v, k| v.get(k)).and_then(Value::as_i64);
    let field = |paths: &[&[&str]]| paths.iter().find_map(|p| at(p));
    // Anthropic leaves cached prompt tokens out of `input_tokens`; they count as input here.
    let input = field(&[&["prompt_tokens"]])
        .or_else(|| u.get("input_tokens").map(|_| crate::gateway::translate::response::prompt_tokens(u)));
    Tokens {
        input,
        output: field(&[&["completion_tokens"], &["output_tokens"]]),
        cached: field(&[
            &["cache_read_input_tokens"],
            &["prompt_tokens_details", "cached_tokens"],
            &["input_tokens_details", "cached_tokens"],
        ]),
        cache_write: field(&[&["cache_creation_input_tokens"]]),
        cache_write_1h: field(&[&["cache_creation", "ephemeral_1h_input_tokens"]]),
    }
}

/// What a streamed event means to the relay (docs/gateway.md).
#[derive(Debug, PartialEq, Eq)]
pub enum Seen {
    /// Content: the first one commits the response to the client.
    Content,
    /// The upstream reported an error.
    Error,
    /// The terminal event: the stream is whole.
    End,
    /// Neither (keep-alive, ping, `message_start`, `response.created`, a chunk with no choice).
    Other,
}

impl Api {
    /// The event that ends a whole stream of this API, for messages about cut streams.
    pub fn terminal_event(self) -> &'static str {
        match self {
            Api::Chat => "data: [DONE]",
            Api::Responses => "response.completed",
            Api::Messages => "message_stop",
        }
    }
}

/// What `ev` (with its data parsed as JSON, when it is) means in a stream of the `upstream` API:
/// Anthropic commits on the first `content_block_*` event (`message_start` and `ping` are held),
/// OpenAI chat on the first chunk with a choice, Responses on the first `response.output_*` event.
/// What the relay reads of an event's data: its `type`, whether it holds an `error` or content
/// (`choices` not empty), and its token counts.
#[derive(Debug, Default, PartialEq)]
pub struct Glance {
    pub kind: Option<String>,
    pub error: bool,
    pub content: bool,
    pub tokens: Tokens,
}

impl Glance {
    /// Reads an event's data without building the document: the content itself is skipped, not
    /// kept. `None` when the data is not JSON.
    pub fn of(data: &str) -> Option<Glance> {
        #[derive(serde::Deserialize)]
        struct Fields {
            #[serde(rename = "type")]
            kind: Option<String>,
            #[serde(default, deserialize_with = "present")]
            error: bool,
            choices: Option<Vec<serde::de::IgnoredAny>>,
            usage: Option<Value>,
            message: Option<Value>,
            response: Option<Value>,
        }
        /// Any value, `null` included, counts: the key is there.
        fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
            serde::de::IgnoredAny::deserialize(d).map(|_| true)
        }
        use serde::Deserialize as _;
        let fields = match data.trim_start().starts_with('{') {
            true => serde_json::from_str::<Fields>(data).ok(),
            false => None,
        };
        match fields {
            Some(f) => Some(Glance {
                kind: f.kind,
                error: f.error,
                content: f.choices.is_some_and(|c| !c.is_empty()),
                tokens: usage_in(f.usage.as_ref(), f.message.as_ref(), f.response.as_ref()),
            }),
            // Not an object of the usual shape (a `type` that is no string, `choices` that is no
            // list, a repeated key): read the long way.
            None => serde_json::from_str::<Value>(data).ok().map(|v| Glance {
                kind: v.get("type").and_then(Value::as_str).map(str::to_string),
                error: v.get("error").is_some(),
                content: v.get("choices").and_then(Value::as_array).is_some_and(|c| !c.is_empty()),
                tokens: usage(&v),
            }),
        }
    }
}

pub fn classify_event(upstream: Api, ev: &Event, glance: Option<&Glance>) -> Seen {
    if ev.is_keepalive() {
        return Seen::Other;
    }
    let kind = glance.and_then(|g| g.kind.as_deref());
    let name = ev.name.as_deref().or(kind).unwrap_or("");
    if name == "error" {
        return Seen::Error;
    }
    match upstream {
        Api::Messages => match name {
            "content_block_start" | "content_block_delta" | "content_block_stop" => Seen::Content,
            "message_stop" => Seen::End,
            _ => Seen::Other,
        },
        Api::Chat => match glance {
            _ if ev.data.trim() == "[DONE]" => Seen::End,
            Some(g) if g.error => Seen::Error,
            Some(g) if g.content => Seen::Content,
            _ => Seen::Other,
        },
        Api::Responses => match name {
            _ if ev.data.trim() == "[DONE]" => Seen::End,
            "response.failed" => Seen::Error,
            "response.completed" | "response.incomplete" => Seen::End,
            n if n.starts_with("response.output_") => Seen::Content,
            _ => Seen::Other,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::translate::sse::Splitter;

    fn ev(raw: &str) -> Event {
        Splitter::default().push(raw.as_bytes()).remove(0)
    }

    fn io(input: i64, output: i64) -> Tokens {
        Tokens { input: Some(input), output: Some(output), ..Tokens::default() }
    }

    fn seen(api: Api, raw: &str) -> Seen {
        let e = ev(raw);
        classify_event(api, &e, Glance::of(&e.data).as_ref())
    }

    #[test]
    fn usage_of_a_passed_through_answer_reads_what_the_whole_document_says() {
        let answer = br#"{"id":"c","choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":12,"completion_tokens":7}}"#;
        assert_eq!(usage_of(answer), Some(io(12, 7)));
        let messages = br#" {"type":"message","content":[],"usage":{"input_tokens":5,"cache_read_input_tokens":2,"output_tokens":3}}"#;
        let whole: Value = serde_json::from_slice(messages).unwrap();
        assert_eq!(usage_of(messages), Some(usage(&whole)));
        assert_eq!(usage_of(br#"{"id":"c"}"#), Some(Tokens::default()));
        // A repeated key, or bytes that are not UTF-8 in a string: still a JSON object, served.
        assert_eq!(
            usage_of(br#"{"usage":1,"usage":{"prompt_tokens":4}}"#),
            Some(Tokens { input: Some(4), ..Tokens::default() })
        );
        assert_eq!(usage_of(b"{\"text\":\"\xff\"}"), Some(Tokens::default()));
        assert_eq!(usage_of(b"[1]"), None);
        assert_eq!(usage_of(b"not json"), None);
    }

    #[test]
    fn a_glance_reads_what_the_whole_document_says() {
        let chunk = r#"{"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"hi"}}],
            "usage":{"prompt_tokens":3,"completion_tokens":5}}"#;
        let g = Glance::of(chunk).unwrap();
        assert_eq!(g, Glance { kind: None, error: false, content: true, tokens: io(3, 5) });
        let start = r#"{"type":"message_start","message":{"id":"m","usage":{"input_tokens":7,"output_tokens":1}}}"#;
        assert_eq!(
            Glance::of(start).unwrap(),
            Glance { kind: Some("message_start".into()), tokens: io(7, 1), ..Glance::default() }
        );
        assert!(Glance::of(r#"{"error":null}"#).unwrap().error, "an `error` key, whatever its value");
        assert!(!Glance::of(r#"{"choices":[]}"#).unwrap().content);
        // What the content says is not what the event is: only top-level keys count.
        let hostile = r#"{"choices":[{"delta":{"content":"{\"error\":1,\"type\":\"error\",\"usage\":{\"prompt_tokens\":9}}","usage":{"prompt_tokens":9}}}]}"#;
        assert_eq!(Glance::of(hostile).unwrap(), Glance { content: true, ..Glance::default() });
        let nested = r#"{"type":"content_block_delta","delta":{"type":"error","error":{"message":"x"}}}"#;
        assert_eq!(
            Glance::of(nested).unwrap(),
            Glance { kind: Some("content_block_delta".into()), ..Glance::default() }
        );
        // Shapes the fast read refuses are read the long way, with the same answers.
        assert_eq!(Glance::of(r#"{"type":3,"choices":{"a":1}}"#).unwrap(), Glance::default());
        assert!(
            Glance::of(r#"{"choices":[],"choices":[{"delta":{}}]}"#).unwrap().content,
            "the last of a repeated key"
        );
        assert_eq!(Glance::of(r#""text""#), Some(Glance::default()));
        assert_eq!(Glance::of("[DONE]"), None);
        assert_eq!(Glance::of("{not json"), None);
    }

    #[test]
    fn anthropic_commits_on_content_blocks_not_on_the_preamble() {
        assert_eq!(seen(Api::Messages, "event: ping\ndata: {}\n\n"), Seen::Other);
        assert_eq!(seen(Api::Messages, "event: message_start\ndata: {}\n\n"), Seen::Other);
        assert_eq!(seen(Api::Messages, "event: content_block_start\ndata: {}\n\n"), Seen::Content);
        assert_eq!(seen(Api::Messages, "event: content_block_delta\ndata: {}\n\n"), Seen::Content);
        assert_eq!(seen(Api::Messages, "event: message_delta\ndata: {}\n\n"), Seen::Other);
        assert_eq!(seen(Api::Messages, "event: message_stop\ndata: {}\n\n"), Seen::End);
        assert_eq!(seen(Api::Messages, "event: error\ndata: {\"type\":\"error\"}\n\n"), Seen::Error);
        // Without `event:` lines, the data's `type` names the event.
        assert_eq!(seen(Api::Messages, "data: {\"type\":\"content_block_delta\"}\n\n"), Seen::Content);
    }

    #[test]
    fn chat_commits_on_the_first_chunk_with_a_choice() {
        assert_eq!(seen(Api::Chat, "data: {\"choices\":[{\"index\":0}]}\n\n"), Seen::Content);
        assert_eq!(seen(Api::Chat, "data: {\"choices\":[],\"prompt_filter_results\":[]}\n\n"), Seen::Other);
        assert_eq!(seen(Api::Chat, "data: {\"error\":{\"message\":\"x\"}}\n\n"), Seen::Error);
        assert_eq!(seen(Api::Chat, "data: [DONE]\n\n"), Seen::End);
        assert_eq!(seen(Api::Chat, ": keep-alive\n\n"), Seen::Other);
    }

    #[test]
    fn responses_commit_on_the_first_output_event() {
        let r = |t: &str| seen(Api::Responses, &format!("event: {t}\ndata: {{\"type\":\"{t}\"}}\n\n"));
        assert_eq!(r("response.created"), Seen::Other);
        assert_eq!(r("response.in_progress"), Seen::Other);
        assert_eq!(r("response.output_item.added"), Seen::Content);
        assert_eq!(r("response.output_text.delta"), Seen::Content);
        assert_eq!(r("response.completed"), Seen::End);
        assert_eq!(r("response.incomplete"), Seen::End);
        assert_eq!(r("response.failed"), Seen::Error);
        assert_eq!(r("error"), Seen::Error);
    }

    #[test]
    fn usage_is_read_from_each_format() {
        assert_eq!(usage(&json!({"usage": {"prompt_tokens": 3, "completion_tokens": 5}})), io(3, 5));
        assert_eq!(usage(&json!({"usage": {"input_tokens": 7, "output_tokens": 2}})), io(7, 2));
        assert_eq!(
            usage(&json!({"type": "message_start", "message": {"usage": {"input_tokens": 9}}})),
            Tokens { input: Some(9), ..Tokens::default() }
        );
        assert_eq!(usage(&json!({"usage": null})), Tokens::default());
    }

    #[test]
    fn cached_and_cache_written_tokens_are_read_from_each_format() {
        // Anthropic: `input_tokens` leaves out the cache reads and writes; rota's input holds them.
        let anthropic = json!({"usage": {"input_tokens": 5, "cache_read_input_tokens": 100,
            "cache_creation_input_tokens": 20, "output_tokens": 1,
            "cache_creation": {"ephemeral_5m_input_tokens": 12, "ephemeral_1h_input_tokens": 8}}});
        let want = Tokens { cached: Some(100), cache_write: Some(20), cache_write_1h: Some(8), ..io(125, 1) };
        assert_eq!(usage(&anthropic), want);
        let chat = json!({"usage": {"prompt_tokens": 2006, "completion_tokens": 300, "total_tokens": 2306,
            "prompt_tokens_details": {"cached_tokens": 1920, "audio_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": 128}}});
        assert_eq!(usage(&chat), Tokens { cached: Some(1920), ..io(2006, 300) });
        let responses = json!({"type": "response.completed", "response": {"usage": {"input_tokens": 37,
            "input_tokens_details": {"cached_tokens": 32}, "output_tokens": 11, "total_tokens": 48}}});
        assert_eq!(usage(&responses), Tokens { cached: Some(32), ..io(37, 11) });
    }

    #[test]
    fn error_bodies_follow_the_client_format() {
        assert_eq!(Api::Messages.error_body(429, "slow")["error"]["type"], "rate_limit_error");
        assert_eq!(Api::Chat.error_body(401, "no")["error"]["code"], "invalid_api_key");
        let body = |v: Value| v.as_object().unwrap().clone();
        assert_eq!(Api::Messages.body_session(&body(json!({"metadata": {"user_id": "u1"}}))), Some("u1".into()));
        assert_eq!(Api::Chat.body_session(&body(json!({"user": "u2"}))), Some("u2".into()));
    }

    #[test]
    fn agents_sessions_are_read_from_their_bodies() {
        let body = |v: Value| v.as_object().unwrap().clone();
        // Claude Code: metadata.user_id is a JSON object of ids, as a string.
        let claude = r#"{"device_id":"9f2c","account_uuid":"","session_id":"4b1e-session"}"#;
        let messages = body(json!({"metadata": {"user_id": claude}}));
        assert_eq!(Api::Messages.body_session(&messages), Some("4b1e-session".into()));
        let older = "user_9f2c_account__session_4b1e";
        assert_eq!(Api::Messages.body_session(&body(json!({"metadata": {"user_id": older}}))), Some(older.into()));
        let no_session = r#"{"device_id":"9f2c"}"#;
        let messages = body(json!({"metadata": {"user_id": no_session}}));
        assert_eq!(Api::Messages.body_session(&messages), Some(no_session.into()), "the whole id then");
        // Codex: the Responses prompt_cache_key is its conversation, before `user`.
        let responses = body(json!({"prompt_cache_key": "conv-7", "user": "u"}));
        assert_eq!(Api::Responses.body_session(&responses), Some("conv-7".into()));
        assert_eq!(Api::Responses.body_session(&body(json!({"user": "u"}))), Some("u".into()));
        assert_eq!(Api::Chat.body_session(&body(json!({"user": ""}))), None);
    }
}
