//! How a candidate is called: the client's request as it is, or translated into the other wire
//! format, and its answers translated back. Chosen once per candidate.

use super::wire::{self, Api};
use crate::config::WireFormat;
use crate::gateway::translate::{self, StreamTranslator};
use crate::prices::Tokens;
use axum::http::HeaderValue;
use bytes::Bytes;
use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::{Map, Value};

/// Which API a candidate is called with, and so whether its request and answers are translated.
/// Translation goes through OpenAI chat, the format every other one maps to (docs/translation.md):
/// a direct pair takes one step, Anthropic messages ⇄ Responses take two.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    client: Api,
    upstream: Api,
}

impl Plan {
    /// The client's API as it is when the provider speaks it, else the provider's.
    pub fn choose(client: Api, wire: WireFormat) -> Plan {
        let upstream = match wire {
            WireFormat::Openai if client == Api::Messages => Api::Chat,
            WireFormat::Openai => client,
            WireFormat::OpenaiChat => Api::Chat,
            WireFormat::OpenaiResponses => Api::Responses,
            WireFormat::Anthropic => Api::Messages,
        };
        Plan { client, upstream }
    }

    /// The API the upstream is called with.
    pub fn upstream(self) -> Api {
        self.upstream
    }

    pub fn translates(self) -> bool {
        self.client != self.upstream
    }

    /// The request body in the upstream's format (`None`: the client's, unchanged), with the
    /// fields that had no counterpart and were dropped.
    pub fn request(self, body: &Map<String, Value>) -> Result<Option<translate::Translated>, String> {
        if !self.translates() {
            return Ok(None);
        }
        let step = |from: Api, to: Api, body: &Map<String, Value>| match (from, to) {
            (Api::Messages, Api::Chat) => translate::messages_to_chat(body),
            (Api::Responses, Api::Chat) => translate::responses_to_chat(body),
            (Api::Chat, Api::Messages) => translate::chat_to_messages(body),
            (Api::Chat, Api::Responses) => translate::chat_to_responses(body),
            _ => unreachable!("one side of a step is chat"),
        };
        let translated = if self.client == Api::Chat || self.upstream == Api::Chat {
            step(self.client, self.upstream, body)
        } else {
            step(self.client, Api::Chat, body).and_then(|chat| {
                let mut out = step(Api::Chat, self.upstream, &chat.body)?;
                out.dropped.splice(0..0, chat.dropped);
                Ok(out)
            })
        };
        translated.map(Some).map_err(|e| e.to_string())
    }

    /// A buffered 2xx answer in the client's format, with its token counts. `None` when the
    /// answer is not a JSON object.
    pub fn response(self, raw: Bytes) -> Option<(Bytes, Tokens)> {
        if !self.translates() {
            return wire::usage_of(&raw).map(|tokens| (raw, tokens));
        }
        let json @ Value::Object(_) = serde_json::from_str::<Value>(&String::from_utf8_lossy(&raw)).ok()? else {
            return None;
        };
        let chat = match self.upstream {
            Api::Chat => json.clone(),
            Api::Messages => translate::messages_response_to_chat(&json),
            Api::Responses => translate::responses_answer_to_chat(&json),
        };
        let answer = match self.client {
            Api::Chat => chat,
            Api::Messages => translate::chat_response_to_messages(&chat),
            Api::Responses => translate::chat_answer_to_responses(&chat),
        };
        Some((Bytes::from(answer.to_string()), wire::usage(&json)))
    }

    /// The translator of a streamed answer; `client_body` is the client's request.
    pub fn stream_translator(self, client_body: &Map<String, Value>) -> Option<StreamTranslator> {
        if !self.translates() {
            return None;
        }
        // A chat client gets a usage chunk only when it asked; the other formats always carry usage.
        let usage = self.client != Api::Chat
            || client_body.get("stream_options").and_then(|o| o.get("include_usage")) == Some(&Value::Bool(true));
        let to_chat = match self.upstream {
            Api::Chat => None,
            Api::Messages => Some(StreamTranslator::anthropic_to_chat(usage)),
            Api::Responses => Some(StreamTranslator::responses_to_chat(usage)),
        };
        let from_chat = match self.client {
            Api::Chat => None,
            Api::Messages => Some(StreamTranslator::chat_to_anthropic()),
            Api::Responses => Some(StreamTranslator::chat_to_responses()),
        };
        StreamTranslator::then(to_chat, from_chat)
    }
}

/// The plan of the candidate under way and its request body when translated, made once per
/// candidate (not per attempt).
pub struct Prepared {
    pub index: usize,
    pub plan: Plan,
    pub body: Option<Map<String, Value>>,
    /// What the translation dropped, which the client learns (`x-rota-dropped`).
    pub dropped: Vec<String>,
}

/// The `x-rota-dropped` value: the names of the fields a translation dropped, comma-separated.
/// The names come from the client's body: at most 16, each a short plain name, are listed;
/// the rest are counted (`+N more`).
pub fn dropped_header(dropped: &[String]) -> Option<HeaderValue> {
    const LISTED: usize = 16;
    const NAME_MAX: usize = 64;
    let plain =
        |n: &&String| n.len() <= NAME_MAX && n.bytes().all(|b| b.is_ascii_alphanumeric() || b" _-.[]=".contains(&b));
    let listed: Vec<&str> = dropped.iter().filter(plain).take(LISTED).map(String::as_str).collect();
    let mut value = listed.join(", ");
    if dropped.len() > listed.len() {
        let more = format!("+{} more", dropped.len() - listed.len());
        value = if value.is_empty() { more } else { format!("{value}, {more}") };
    }
    (!value.is_empty()).then(|| HeaderValue::from_str(&value).expect("plain ASCII"))
}

/// A request body with its `model` set to the candidate's, serialized without copying the body.
/// For Claude on Vertex AI (`in_url`) the model goes in the URL instead, and the body carries
/// `anthropic_version`.
pub struct WithModel<'a> {
    pub body: &'a Map<String, Value>,
    pub model: &'a str,
    pub in_url: bool,
}

impl Serialize for WithModel<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let has_model = self.body.contains_key("model");
        let mut map = s.serialize_map(None)?;
        for (k, v) in self.body {
            match k.as_str() {
                "model" if self.in_url => {}
                "model" => map.serialize_entry(k, self.model)?,
                _ => map.serialize_entry(k, v)?,
            }
        }
        if self.in_url {
            if !self.body.contains_key("anthropic_version") {
                map.serialize_entry("anthropic_version", crate::config::VERTEX_ANTHROPIC_VERSION)?;
            }
        } else if !has_model {
            map.serialize_entry("model", self.model)?;
        }
        map.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_plan_follows_client_api_and_wire_format() {
        let upstream = |client, wire| Plan::choose(client, wire).upstream();
        for client in [Api::Chat, Api::Responses, Api::Messages] {
            assert_eq!(upstream(client, WireFormat::OpenaiChat), Api::Chat);
            assert_eq!(upstream(client, WireFormat::OpenaiResponses), Api::Responses);
            assert_eq!(upstream(client, WireFormat::Anthropic), Api::Messages);
        }
        assert_eq!(upstream(Api::Chat, WireFormat::Openai), Api::Chat);
        assert_eq!(upstream(Api::Responses, WireFormat::Openai), Api::Responses);
        assert_eq!(upstream(Api::Messages, WireFormat::Openai), Api::Chat);
        assert!(!Plan::choose(Api::Messages, WireFormat::Anthropic).translates());
        assert!(Plan::choose(Api::Responses, WireFormat::Anthropic).translates());
    }

    #[test]
    fn the_dropped_header_lists_plain_names_and_counts_the_rest() {
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(dropped_header(&[]), None);
        let h = dropped_header(&names(&["thinking", "context_management", "tools[type=web_search]"])).unwrap();
        assert_eq!(h, "thinking, context_management, tools[type=web_search]");
        let hostile = names(&["a\r\nx-evil: 1", &"k".repeat(65), "top_k"]);
        assert_eq!(dropped_header(&hostile).unwrap(), "top_k, +2 more");
        let many: Vec<String> = (0..40).map(|i| format!("f{i}")).collect();
        let h = dropped_header(&many).unwrap();
        assert!(h.to_str().unwrap().ends_with("f15, +24 more"), "{h:?}");
        assert_eq!(dropped_header(&names(&["\u{1}"])).unwrap(), "+1 more");
    }

    #[test]
    fn with_model_replaces_the_model_in_place_or_adds_it() {
        let body = json!({"model": "fast", "messages": [], "stream": true});
        let out =
            serde_json::to_string(&WithModel { body: body.as_object().unwrap(), model: "gpt-4.1", in_url: false })
                .unwrap();
        assert_eq!(out, r#"{"model":"gpt-4.1","messages":[],"stream":true}"#);
        let body = json!({"messages": []});
        let out =
            serde_json::to_string(&WithModel { body: body.as_object().unwrap(), model: "m", in_url: false }).unwrap();
        assert_eq!(out, r#"{"messages":[],"model":"m"}"#);
    }

    #[test]
    fn claude_on_vertex_takes_the_model_out_and_its_version_in() {
        let body = json!({"model": "vertex/claude-x", "max_tokens": 8, "stream": true});
        let out =
            serde_json::to_string(&WithModel { body: body.as_object().unwrap(), model: "claude-x", in_url: true });
        assert_eq!(out.unwrap(), r#"{"max_tokens":8,"stream":true,"anthropic_version":"vertex-2023-10-16"}"#);
        let body = json!({"anthropic_version": "vertex-2099-01-01", "max_tokens": 8});
        let out =
            serde_json::to_string(&WithModel { body: body.as_object().unwrap(), model: "claude-x", in_url: true });
        assert_eq!(
            out.unwrap(),
            r#"{"anthropic_version":"vertex-2099-01-01","max_tokens":8}"#,
            "the client's own kept"
        );
    }
}
