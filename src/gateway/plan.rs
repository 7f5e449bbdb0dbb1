//! How a candidate is called: the client's request as it is, or translated into the other wire
//! format, and its answers translated back. Chosen once per candidate.

use super::wire::{self, Api};
use crate::config::Api as WireFormat;
use crate::prices::Tokens;
use crate::translate::{self, StreamTranslator};
use bytes::Bytes;
use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::{Map, Value};

/// Which way, if any, a candidate's request and answers are translated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plan {
    /// The provider speaks the client's API: bodies and events pass through unchanged.
    Passthrough(Api),
    /// An OpenAI chat client served by an Anthropic provider.
    ChatToMessages,
    /// An Anthropic client served by an OpenAI-format provider.
    MessagesToChat,
}

impl Plan {
    pub fn choose(client: Api, wire: WireFormat) -> Result<Plan, String> {
        match (client, wire) {
            (api, wire) if api.wire() == wire => Ok(Plan::Passthrough(api)),
            (Api::Chat, WireFormat::Anthropic) => Ok(Plan::ChatToMessages),
            (Api::Messages, WireFormat::Openai) => Ok(Plan::MessagesToChat),
            (api, _) => Err(format!("the {} API is served only by OpenAI-format providers", api.as_str())),
        }
    }

    /// The API the upstream is called with.
    pub fn upstream(self) -> Api {
        match self {
            Plan::Passthrough(api) => api,
            Plan::ChatToMessages => Api::Messages,
            Plan::MessagesToChat => Api::Chat,
        }
    }

    pub fn translates(self) -> bool {
        !matches!(self, Plan::Passthrough(_))
    }

    /// The request body in the upstream's format (`None`: the client's, unchanged), with the
    /// fields that had no counterpart and were dropped.
    pub fn request(self, body: &Map<String, Value>) -> Result<Option<translate::Translated>, String> {
        let translated = match self {
            Plan::Passthrough(_) => return Ok(None),
            Plan::ChatToMessages => translate::chat_to_messages(body),
            Plan::MessagesToChat => translate::messages_to_chat(body),
        };
        translated.map(Some).map_err(|e| e.to_string())
    }

    /// A buffered 2xx answer in the client's format, with its token counts. `None` when the
    /// answer is not a JSON object.
    pub fn response(self, raw: Bytes) -> Option<(Bytes, Tokens)> {
        let translate: fn(&Value) -> Value = match self {
            Plan::Passthrough(_) => return wire::usage_of(&raw).map(|tokens| (raw, tokens)),
            Plan::ChatToMessages => translate::messages_response_to_chat,
            Plan::MessagesToChat => translate::chat_response_to_messages,
        };
        let json @ Value::Object(_) = serde_json::from_str::<Value>(&String::from_utf8_lossy(&raw)).ok()? else {
            return None;
        };
        Some((Bytes::from(translate(&json).to_string()), wire::usage(&json)))
    }

    /// The translator of a streamed answer; `client_body` is the client's request.
    pub fn stream_translator(self, client_body: &Map<String, Value>) -> Option<StreamTranslator> {
        match self {
            Plan::Passthrough(_) => None,
            Plan::ChatToMessages => {
                let usage =
                    client_body.get("stream_options").and_then(|o| o.get("include_usage")) == Some(&Value::Bool(true));
                Some(StreamTranslator::anthropic_to_chat(usage))
            }
            Plan::MessagesToChat => Some(StreamTranslator::chat_to_anthropic()),
        }
    }
}

/// The plan of the candidate under way and its request body when translated, made once per
/// candidate (not per attempt).
pub struct Prepared {
    pub index: usize,
    pub plan: Plan,
    pub body: Option<Map<String, Value>>,
}

/// A request body with its `model` set to the candidate's, serialized without copying the body.
pub struct WithModel<'a> {
    pub body: &'a Map<String, Value>,
    pub model: &'a str,
}

impl Serialize for WithModel<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let has_model = self.body.contains_key("model");
        let mut map = s.serialize_map(Some(self.body.len() + usize::from(!has_model)))?;
        for (k, v) in self.body {
            if k == "model" {
                map.serialize_entry(k, self.model)?;
            } else {
                map.serialize_entry(k, v)?;
            }
        }
        if !has_model {
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
        assert_eq!(Plan::choose(Api::Chat, WireFormat::Openai), Ok(Plan::Passthrough(Api::Chat)));
        assert_eq!(Plan::choose(Api::Messages, WireFormat::Anthropic), Ok(Plan::Passthrough(Api::Messages)));
        assert_eq!(Plan::choose(Api::Chat, WireFormat::Anthropic), Ok(Plan::ChatToMessages));
        assert_eq!(Plan::choose(Api::Messages, WireFormat::Openai), Ok(Plan::MessagesToChat));
        assert!(Plan::choose(Api::Responses, WireFormat::Anthropic).is_err());
        assert_eq!(Plan::ChatToMessages.upstream(), Api::Messages);
        assert_eq!(Plan::MessagesToChat.upstream(), Api::Chat);
    }

    #[test]
    fn with_model_replaces_the_model_in_place_or_adds_it() {
        let body = json!({"model": "fast", "messages": [], "stream": true});
        let out = serde_json::to_string(&WithModel { body: body.as_object().unwrap(), model: "gpt-4.1" }).unwrap();
        assert_eq!(out, r#"{"model":"gpt-4.1","messages":[],"stream":true}"#);
        let body = json!({"messages": []});
        let out = serde_json::to_string(&WithModel { body: body.as_object().unwrap(), model: "m" }).unwrap();
        assert_eq!(out, r#"{"messages":[],"model":"m"}"#);
    }
}
