//! Translation between the OpenAI chat completions format and the Anthropic messages format,
//! and between chat and the OpenAI Responses API (`responses`), both directions, so failover may
//! cross providers of different wire formats.
//! `docs/translation.md` lists every field and what happens to it.

pub mod request;
pub mod response;
pub mod responses;
pub mod sse;
pub mod stream;

pub use request::{chat_to_messages, messages_to_chat};
pub use response::{chat_response_to_messages, messages_response_to_chat};
pub use responses::{
    ChatToResponses, ResponsesToChat, chat_answer_to_responses, chat_to_responses, responses_answer_to_chat,
    responses_to_chat,
};
pub use stream::StreamTranslator;

use serde_json::{Map, Value};

/// A request body in the other format, with the fields that had no counterpart and were
/// dropped (each is logged at `warn` by the gateway).
#[derive(Clone, Debug, PartialEq)]
pub struct Translated {
    pub body: Map<String, Value>,
    pub dropped: Vec<String>,
}

/// A request that cannot be expressed in the other format without changing its meaning: the
/// candidate is skipped (reason `wire_format`) with this explanation.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("cannot translate: {0}")]
pub struct Untranslatable(pub String);

/// The default `max_tokens` for an Anthropic request translated from a chat request that set
/// none (Anthropic requires it).
pub const DEFAULT_MAX_TOKENS: u64 = 4096;
