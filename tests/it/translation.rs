//! Format translation, OpenAI chat completions ⇄ Anthropic messages: golden requests, refused
//! and dropped fields, golden responses, golden streams (event by event, parsed back with the
//! gateway's own SSE splitter) and round-trip properties.

use proptest::prelude::*;
use rota::gateway::translate::sse::Splitter;
use rota::gateway::translate::{
    DEFAULT_MAX_TOKENS, StreamTranslator, Translated, Untranslatable, chat_response_to_messages, chat_to_messages,
    messages_response_to_chat, messages_to_chat,
};
use serde_json::{Map, Value, json};

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

fn obj(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        other => panic!("not an object: {other}"),
    }
}

/// chat → messages that must succeed.
fn to_messages(req: Value) -> Translated {
    chat_to_messages(&obj(req)).expect("the chat request is translatable")
}

/// messages → chat that must succeed.
fn to_chat(req: Value) -> Translated {
    messages_to_chat(&obj(req)).expect("the messages request is translatable")
}

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

/// Whether `msg` names `field` as a whole word.
fn names_field(msg: &str, field: &str) -> bool {
    msg.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).any(|w| w == field)
}

/// A chat completion (or chunk) without its volatile `created`, which must be an integer.
fn without_created(mut v: Value) -> Value {
    if let Some(o) = v.as_object_mut()
        && let Some(c) = o.remove("created")
    {
        assert!(c.is_i64(), "created must be an integer, got {c}");
    }
    v
}

/// The client's events as (event name, data JSON); `[DONE]` becomes the string "[DONE]".
fn client_events(bytes: &[u8]) -> Vec<(Option<String>, Value)> {
    let mut split = Splitter::default();
    let events = split.push(bytes);
    assert!(split.rest().is_empty(), "incomplete trailing event: {:?}", String::from_utf8_lossy(split.rest()));
    events
        .into_iter()
        .map(|e| {
            let data = if e.data == "[DONE]" {
                json!("[DONE]")
            } else {
                let v: Value = serde_json::from_str(&e.data)
                    .unwrap_or_else(|err| panic!("client event data is not JSON ({err}): {:?}", e.data));
                without_created(v)
            };
            (e.name, data)
        })
        .collect()
}

/// Feeds an upstream SSE body to a translator in awkward 7-byte pieces (as the network would)
/// and returns the client's events.
fn translate_stream(mut t: StreamTranslator, upstream: &str) -> Vec<(Option<String>, Value)> {
    let mut split = Splitter::default();
    let mut out = Vec::new();
    for piece in upstream.as_bytes().chunks(7) {
        for ev in split.push(piece) {
            out.extend(t.push(&ev));
        }
    }
    assert!(split.rest().is_empty(), "the upstream fixture ends mid-event");
    client_events(&out)
}

/// An Anthropic SSE body: `event: NAME\ndata: JSON\n\n` per event.
fn anthropic_sse(events: &[Value]) -> String {
    events.iter().map(|v| format!("event: {}\ndata: {}\n\n", v["type"].as_str().expect("typed event"), v)).collect()
}

/// An OpenAI SSE body: `data: JSON\n\n` per chunk, then `data: [DONE]`.
fn openai_sse(chunks: &[Value], done: bool) -> String {
    let mut s: String = chunks.iter().map(|v| format!("data: {v}\n\n")).collect();
    if done {
        s.push_str("data: [DONE]\n\n");
    }
    s
}

fn ev(name: &str, data: Value) -> (Option<String>, Value) {
    (Some(name.to_string()), data)
}

fn data(v: Value) -> (Option<String>, Value) {
    (None, v)
}

fn done() -> (Option<String>, Value) {
    (None, json!("[DONE]"))
}

const PING: &str = "event: ping\ndata: {\"type\": \"ping\"}\n\n";

// ---------------------------------------------------------------------------------------------
// 1. Golden requests
// ---------------------------------------------------------------------------------------------

#[test]
fn plain_text_chat_request_becomes_messages_request() {
    let t = to_messages(json!({
        "model": "claude-sonnet-4-5",
        "messages": [{"role": "user", "content": "Hello, Claude"}],
        "max_tokens": 1024
    }));
    assert_eq!(
        Value::Object(t.body),
        json!({
            "model": "claude-sonnet-4-5",
            "max_tokens": 1024,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "Hello, Claude"}]}]
        })
    );
    assert_eq!(t.dropped, Vec::<String>::new());
}

#[test]
fn plain_text_messages_request_becomes_chat_request() {
    let t = to_chat(json!({
        "model": "gpt-4o",
        "max_tokens": 1024,
        "messages": [{"role": "user", "content": "Hello, world"}]
    }));
    assert_eq!(
        Value::Object(t.body),
        json!({
            "model": "gpt-4o",
            "max_tokens": 1024,
            "messages": [{"role": "user", "content": "Hello, world"}]
        })
    );
    assert_eq!(t.dropped, Vec::<String>::new());

    // A single text block reads as plain string content.
    let t = to_chat(json!({
        "model": "gpt-4o",
        "max_tokens": 1024,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Hello, world"}]}]
    }));
    assert_eq!(
        Value::Object(t.body),
        json!({"model": "gpt-4o", "max_tokens": 1024, "messages": [{"role": "user", "content": "Hello, world"}]})
    );
}

#[test]
fn multi_turn_chat_request_keeps_turns_in_order() {
    let t = to_messages(json!({
        "model": "claude-sonnet-4-5",
        "max_tokens": 1024,
        "messages": [
            {"role": "user", "content": "Hello there."},
            {"role": "assistant", "content": "Hi, I'm Claude. How can I help you?"},
            {"role": "user", "content": "Can you explain LLMs in plain English?"}
        ]
    }));
    assert_eq!(
        Value::Object(t.body),
        json!({
            "model": "claude-sonnet-4-5",
            "max_tokens": 1024,
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "Hello there."}]},
                {"role": "assistant", "content": [{"type": "text", "text": "Hi, I'm Claude. How can I help you?"}]},
                {"role": "user", "content": [{"type": "text", "text": "Can you explain LLMs in plain English?"}]}
            ]
        })
    );
    assert!(t.dropped.is_empty());
}

#[test]
fn multi_turn_messages_request_keeps_turns_in_order() {
    let t = to_chat(json!({
        "model": "gpt-4o",
        "max_tokens": 1024,
        "messages": [
            {"role": "user", "content": "Hello there."},
            {"role": "assistant", "content": [{"type": "text", "text": "Hi, I'm Claude. How can I help you?"}]},
            {"role": "user", "content": [{"type": "text", "text": "Can you explain LLMs in plain English?"}]}
        ]
    }));
    assert_eq!(
        Value::Object(t.body),
        json!({
            "model": "gpt-4o",
            "max_tokens": 1024,
            "messages": [
                {"role": "user", "content": "Hello there."},
                {"role": "assistant", "content": "Hi, I'm Claude. How can I help you?"},
                {"role": "user", "content": "Can you explain LLMs in plain English?"}
            ]
        })
    );
    assert!(t.dropped.is_empty());
}

#[test]
fn system_and_developer_messages_become_top_level_system() {
    let t = to_messages(json!({
        "model": "claude-sonnet-4-5",
        "messages": [
            {"role": "system", "content": "You are a terse assistant."},
            {"role": "developer", "content": [{"type": "text", "text": "Answer in French."}]},
            {"role": "user", "content": "Hi"}
        ]
    }));
    assert_eq!(
        Value::Object(t.body),
        json!({
            "model": "claude-sonnet-4-5",
            "max_tokens": DEFAULT_MAX_TOKENS,
            "system": "You are a terse assistant.\n\nAnswer in French.",
            "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]
        })
    );
    assert!(t.dropped.is_empty());
}

#[test]
fn top_level_system_becomes_first_system_message() {
    let t = to_chat(json!({
        "model": "gpt-4o",
        "max_tokens": 256,
        "system": "You are a terse assistant.",
        "messages": [{"role": "user", "content": "Hi"}]
    }));
    assert_eq!(
        Value::Object(t.body),
        json!({
            "model": "gpt-4o",
            "max_tokens": 256,
            "messages": [
                {"role": "system", "content": "You are a terse assistant."},
                {"role": "user", "content": "Hi"}
            ]
        })
    );

    // The block form (as sent with cache_control) reads as the joined text.
    let t = to_chat(json!({
        "model": "gpt-4o",
        "max_tokens": 256,
        "system": [
            {"type": "text", "text": "You are a terse assistant."},
            {"type": "text", "text": "Answer in French.", "cache_control": {"type": "ephemeral"}}
        ],
        "messages": [{"role": "user", "content": "Hi"}]
    }));
    assert_eq!(
        Value::Object(t.body),
        json!({
            "model": "gpt-4o",
            "max_tokens": 256,
            "messages": [
                {"role": "system", "content": "You are a terse assistant.\nAnswer in French."},
                {"role": "user", "content": "Hi"}
            ]
        })
    );
}

fn weather_parameters() -> Value {
    json!({
        "type": "object",
        "properties": {
            "location": {"type": "string", "description": "The city and state, e.g. San Francisco, CA"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}
        },
        "required": ["location"]
    })
}

#[test]
fn parallel_tool_calls_and_results_become_tool_use_and_merged_tool_result_blocks() {
    let t = to_messages(json!({
        "model": "claude-sonnet-4-5",
        "messages": [
            {"role": "user", "content": "What's the weather in Paris and in Tokyo?"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_abc123", "type": "function",
                 "function": {"name": "get_weather", "arguments": "{\"location\":\"Paris\"}"}},
                {"id": "call_def456", "type": "function",
                 "function": {"name": "get_weather", "arguments": "{\"location\":\"Tokyo\",\"unit\":\"celsius\"}"}}
            ]},
            {"role": "tool", "tool_call_id": "call_abc123", "content": "18°C, sunny"},
            {"role": "tool", "tool_call_id": "call_def456", "content": "24°C, light rain"},
            {"role": "assistant", "content": "Paris is sunny at 18°C; Tokyo has light rain at 24°C."}
        ],
        "tools": [{"type": "function", "function": {
            "name": "get_weather",
            "description": "Get the current weather in a given location",
            "parameters": weather_parameters()
        }}]
    }));
    assert_eq!(
        Value::Object(t.body),
        json!({
            "model": "claude-sonnet-4-5",
            "max_tokens": DEFAULT_MAX_TOKENS,
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "What's the weather in Paris and in Tokyo?"}]},
                {"role": "assistant", "content": [
                    {"type": "tool_use", "id": "call_abc123", "name": "get_weather", "input": {"location": "Paris"}},
                    {"type": "tool_use", "id": "call_def456", "name": "get_weather",
                     "input": {"location": "Tokyo", "unit": "celsius"}}
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "call_abc123", "content": "18°C, sunny"},
                    {"type": "tool_result", "tool_use_id": "call_def456", "content": "24°C, light rain"}
                ]},
                {"role": "assistant", "content": [
                    {"type": "text", "text": "Paris is sunny at 18°C; Tokyo has light rain at 24°C."}
                ]}
            ],
            "tools": [{
                "name": "get_weather",
                "description": "Get the current weather in a given location",
                "input_schema": weather_parameters()
            }]
        })
    );
    assert!(t.dropped.is_empty());
}

#[test]
fn tool_results_followed_by_user_text_share_one_user_message() {
    let t = to_messages(json!({
        "model": "claude-sonnet-4-5",
        "max_tokens": 100,
        "messages": [
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": "Let me check.", "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
            ]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
            {"role": "user", "content": "And tomorrow?"}
        ]
    }));
    assert_eq!(
        Value::Object(t.body),
        json!({
            "model": "claude-sonnet-4-5",
            "max_tokens": 100,
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "Weather?"}]},
                {"role": "assistant", "content": [
                    {"type": "text", "text": "Let me check."},
                    {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {}}
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "call_1", "content": "sunny"},
                    {"type": "text", "text": "And tomorrow?"}
                ]}
            ]
        })
    );
}

#[test]
fn tool_use_and_tool_result_blocks_become_tool_calls_and_tool_messages() {
    let t = to_chat(json!({
        "model": "gpt-4o",
        "max_tokens": 1024,
        "tools": [{
            "name": "get_weather",
            "description": "Get the current weather in a given location",
            "input_schema": weather_parameters()
        }],
        "messages": [
            {"role": "user", "content": "What's the weather in Paris and in Tokyo?"},
            {"role": "assistant", "content": [
                {"type": "text", "text": "I'll check both cities."},
                {"type": "tool_use", "id": "toolu_01A09q90qw90lq917835lq9", "name": "get_weather",
                 "input": {"location": "Paris"}},
                {"type": "tool_use", "id": "toolu_01B19q90qw90lq917835lq9", "name": "get_weather",
                 "input": {"location": "Tokyo", "unit": "celsius"}}
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_01A09q90qw90lq917835lq9", "content": "18°C, sunny"},
                {"type": "tool_result", "tool_use_id": "toolu_01B19q90qw90lq917835lq9",
                 "content": [{"type": "text", "text": "24°C, light rain"}]}
            ]}
        ]
    }));
    assert_eq!(
        Value::Object(t.body),
        json!({
            "model": "gpt-4o",
            "max_tokens": 1024,
            "tools": [{"type": "function", "function": {
                "name": "get_weather",
                "description": "Get the current weather in a given location",
                "parameters": weather_parameters()
            }}],
            "messages": [
                {"role": "user", "content": "What's the weather in Paris and in Tokyo?"},
                {"role": "assistant", "content": "I'll check both cities.", "tool_calls": [
                    {"id": "toolu_01A09q90qw90lq917835lq9", "type": "function",
                     "function": {"name": "get_weather", "arguments": "{\"location\":\"Paris\"}"}},
                    {"id": "toolu_01B19q90qw90lq917835lq9", "type": "function",
                     "function": {"name": "get_weather", "arguments": "{\"location\":\"Tokyo\",\"unit\":\"celsius\"}"}}
                ]},
                {"role": "tool", "tool_call_id": "toolu_01A09q90qw90lq917835lq9", "content": "18°C, sunny"},
                {"role": "tool", "tool_call_id": "toolu_01B19q90qw90lq917835lq9", "content": "24°C, light rain"}
            ]
        })
    );
    assert!(t.dropped.is_empty());
}

#[test]
fn image_urls_become_base64_and_url_sources() {
    let t = to_messages(json!({
        "model": "claude-sonnet-4-5",
        "max_tokens": 300,
        "messages": [{"role": "user", "content": [
            {"type": "text", "text": "What is in these images?"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgoAAAANSUhEUg=="}},
            {"type": "image_url", "image_url": {"url": "https://upload.wikimedia.org/cat.jpg", "detail": "high"}}
        ]}]
    }));
    assert_eq!(
        Value::Object(t.body),
        json!({
            "model": "claude-sonnet-4-5",
            "max_tokens": 300,
            "messages": [{"role": "user", "content": [
                {"type": "text", "text": "What is in these images?"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgoAAAANSUhEUg=="}},
                {"type": "image", "source": {"type": "url", "url": "https://upload.wikimedia.org/cat.jpg"}}
            ]}]
        })
    );
}

#[test]
fn base64_and_url_image_sources_become_image_urls() {
    let t = to_chat(json!({
        "model": "gpt-4o",
        "max_tokens": 300,
        "messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": "/9j/4AAQSkZJRg=="}},
            {"type": "image", "source": {"type": "url", "url": "https://upload.wikimedia.org/cat.jpg"}},
            {"type": "text", "text": "Compare these images."}
        ]}]
    }));
    assert_eq!(
        Value::Object(t.body),
        json!({
            "model": "gpt-4o",
            "max_tokens": 300,
            "messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,/9j/4AAQSkZJRg=="}},
                {"type": "image_url", "image_url": {"url": "https://upload.wikimedia.org/cat.jpg"}},
                {"type": "text", "text": "Compare these images."}
            ]}]
        })
    );
}

#[test]
fn sampling_stop_string_and_user_map_to_messages_fields() {
    let t = to_messages(json!({
        "model": "claude-sonnet-4-5",
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 50,
        "temperature": 0.7,
        "top_p": 0.9,
        "stop": "\n\nHuman:",
        "user": "user-1234"
    }));
    assert_eq!(
        Value::Object(t.body),
        json!({
            "model": "claude-sonnet-4-5",
            "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
            "max_tokens": 50,
            "temperature": 0.7,
            "top_p": 0.9,
            "stop_sequences": ["\n\nHuman:"],
            "metadata": {"user_id": "user-1234"}
        })
    );
    assert!(t.dropped.is_empty());

    let t = to_messages(json!({
        "model": "claude-sonnet-4-5",
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 50,
        "stop": ["END", "STOP"]
    }));
    assert_eq!(
        Value::Object(t.body),
        json!({
            "model": "claude-sonnet-4-5",
            "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
            "max_tokens": 50,
            "stop_sequences": ["END", "STOP"]
        })
    );
}

#[test]
fn sampling_stop_sequences_and_metadata_map_to_chat_fields() {
    let t = to_chat(json!({
        "model": "gpt-4o",
        "max_tokens": 512,
        "messages": [{"role": "user", "content": "Hi"}],
        "temperature": 0.5,
        "top_p": 0.95,
        "stop_sequences": ["END", "STOP"],
        "metadata": {"user_id": "user-1234"}
    }));
    assert_eq!(
        Value::Object(t.body),
        json!({
            "model": "gpt-4o",
            "max_tokens": 512,
            "messages": [{"role": "user", "content": "Hi"}],
            "temperature": 0.5,
            "top_p": 0.95,
            "stop": ["END", "STOP"],
            "user": "user-1234"
        })
    );
    assert!(t.dropped.is_empty());
}

#[test]
fn max_tokens_defaults_and_prefers_max_completion_tokens() {
    let hi = json!([{"role": "user", "content": "Hi"}]);
    let hi_blocks = json!([{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]);
    let cases = [
        (json!({"model": "m", "messages": hi}), json!(DEFAULT_MAX_TOKENS)),
        (json!({"model": "m", "messages": hi, "max_tokens": 300}), json!(300)),
        (json!({"model": "m", "messages": hi, "max_completion_tokens": 500}), json!(500)),
        (json!({"model": "m", "messages": hi, "max_tokens": 300, "max_completion_tokens": 500}), json!(500)),
        (json!({"model": "m", "messages": hi, "max_completion_tokens": 500, "max_tokens": 300}), json!(500)),
    ];
    for (req, max) in cases {
        let t = to_messages(req.clone());
        assert_eq!(Value::Object(t.body), json!({"model": "m", "messages": hi_blocks, "max_tokens": max}), "for {req}");
        assert!(t.dropped.is_empty(), "for {req}");
    }
    assert_eq!(DEFAULT_MAX_TOKENS, 4096);
}

#[test]
fn tool_choice_maps_to_anthropic_tool_choice() {
    let hi_blocks = json!([{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]);
    let named = json!({"type": "function", "function": {"name": "get_weather"}});
    let cases = [
        (json!({"tool_choice": "auto"}), json!({"tool_choice": {"type": "auto"}})),
        (json!({"tool_choice": "required"}), json!({"tool_choice": {"type": "any"}})),
        (json!({"tool_choice": "none"}), json!({"tool_choice": {"type": "none"}})),
        (json!({"tool_choice": named}), json!({"tool_choice": {"type": "tool", "name": "get_weather"}})),
        (
            json!({"tool_choice": "auto", "parallel_tool_calls": false}),
            json!({"tool_choice": {"type": "auto", "disable_parallel_tool_use": true}}),
        ),
        (
            json!({"parallel_tool_calls": false, "tool_choice": "required"}),
            json!({"tool_choice": {"type": "any", "disable_parallel_tool_use": true}}),
        ),
        (
            json!({"tool_choice": named, "parallel_tool_calls": false}),
            json!({"tool_choice": {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": true}}),
        ),
        (
            json!({"parallel_tool_calls": false}),
            json!({"tool_choice": {"type": "auto", "disable_parallel_tool_use": true}}),
        ),
        // true is the default on both sides: nothing to say.
        (json!({"parallel_tool_calls": true}), json!({})),
    ];
    for (extra, want) in cases {
        let mut req = obj(json!({"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "Hi"}]}));
        req.extend(obj(extra.clone()));
        let t = chat_to_messages(&req).expect("translatable");
        let mut expected = obj(json!({"model": "m", "max_tokens": 10, "messages": hi_blocks}));
        expected.extend(obj(want));
        assert_eq!(Value::Object(t.body), Value::Object(expected), "for {extra}");
        assert!(t.dropped.is_empty(), "for {extra}");
    }
}

#[test]
fn tool_choice_none_with_parallel_tool_calls_false_stays_plain_none() {
    // Anthropic's ToolChoiceNone is `{"type": "none"}` only; disable_parallel_tool_use belongs to
    // auto/any/tool, and an extra field there is rejected by the API.
    let t = to_messages(json!({
        "model": "m", "max_tokens": 10,
        "messages": [{"role": "user", "content": "Hi"}],
        "tool_choice": "none", "parallel_tool_calls": false
    }));
    assert_eq!(
        Value::Object(t.body),
        json!({
            "model": "m", "max_tokens": 10,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
            "tool_choice": {"type": "none"}
        })
    );
}

#[test]
fn anthropic_tool_choice_maps_to_chat_tool_choice() {
    let cases = [
        (json!({"type": "auto"}), json!({"tool_choice": "auto"})),
        (json!({"type": "any"}), json!({"tool_choice": "required"})),
        (json!({"type": "none"}), json!({"tool_choice": "none"})),
        (
            json!({"type": "tool", "name": "get_weather"}),
            json!({"tool_choice": {"type": "function", "function": {"name": "get_weather"}}}),
        ),
        (
            json!({"type": "auto", "disable_parallel_tool_use": true}),
            json!({"tool_choice": "auto", "parallel_tool_calls": false}),
        ),
        (
            json!({"type": "any", "disable_parallel_tool_use": true}),
            json!({"tool_choice": "required", "parallel_tool_calls": false}),
        ),
        (
            json!({"type": "tool", "name": "get_weather", "disable_parallel_tool_use": true}),
            json!({"tool_choice": {"type": "function", "function": {"name": "get_weather"}}, "parallel_tool_calls": false}),
        ),
        (json!({"type": "auto", "disable_parallel_tool_use": false}), json!({"tool_choice": "auto"})),
    ];
    for (choice, want) in cases {
        let t = to_chat(json!({
            "model": "m", "max_tokens": 10,
            "messages": [{"role": "user", "content": "Hi"}],
            "tool_choice": choice
        }));
        let mut expected =
            obj(json!({"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "Hi"}]}));
        expected.extend(obj(want));
        assert_eq!(Value::Object(t.body), Value::Object(expected), "for {choice}");
        assert!(t.dropped.is_empty(), "for {choice}");
    }
}

#[test]
fn streamed_messages_request_asks_chat_upstream_for_usage() {
    let t = to_chat(json!({
        "model": "gpt-4o", "max_tokens": 10, "stream": true,
        "messages": [{"role": "user", "content": "Hi"}]
    }));
    assert_eq!(
        Value::Object(t.body),
        json!({
            "model": "gpt-4o", "max_tokens": 10, "stream": true,
            "stream_options": {"include_usage": true},
            "messages": [{"role": "user", "content": "Hi"}]
        })
    );

    let t = to_chat(json!({
        "model": "gpt-4o", "max_tokens": 10, "stream": false,
        "messages": [{"role": "user", "content": "Hi"}]
    }));
    assert_eq!(
        Value::Object(t.body),
        json!({"model": "gpt-4o", "max_tokens": 10, "stream": false, "messages": [{"role": "user", "content": "Hi"}]})
    );
}

#[test]
fn streamed_chat_request_stays_streamed_without_stream_options() {
    let t = to_messages(json!({
        "model": "claude-sonnet-4-5", "max_tokens": 10, "stream": true,
        "stream_options": {"include_usage": true},
        "messages": [{"role": "user", "content": "Hi"}]
    }));
    assert_eq!(
        Value::Object(t.body),
        json!({
            "model": "claude-sonnet-4-5", "max_tokens": 10, "stream": true,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]
        })
    );
    assert!(t.dropped.is_empty());
}

// ---------------------------------------------------------------------------------------------
// 2. Dropped and refused fields
// ---------------------------------------------------------------------------------------------

#[test]
fn seed_presence_penalty_and_logit_bias_are_dropped_and_listed() {
    let t = to_messages(json!({
        "model": "claude-sonnet-4-5",
        "max_tokens": 10,
        "messages": [{"role": "user", "content": "Hi"}],
        "seed": 42,
        "presence_penalty": 0.5,
        "logit_bias": {"50256": -100}
    }));
    assert_eq!(
        Value::Object(t.body),
        json!({
            "model": "claude-sonnet-4-5",
            "max_tokens": 10,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]
        })
    );
    assert_eq!(sorted(t.dropped), vec!["logit_bias", "presence_penalty", "seed"]);
}

#[test]
fn top_k_is_dropped_and_listed() {
    let t = to_chat(json!({
        "model": "gpt-4o",
        "max_tokens": 10,
        "top_k": 40,
        "messages": [{"role": "user", "content": "Hi"}]
    }));
    assert_eq!(
        Value::Object(t.body),
        json!({"model": "gpt-4o", "max_tokens": 10, "messages": [{"role": "user", "content": "Hi"}]})
    );
    assert_eq!(t.dropped, vec!["top_k"]);
}

#[test]
fn several_choices_json_mode_and_logprobs_are_refused_naming_the_field() {
    let base = || obj(json!({"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "Hi"}]}));
    for (field, value) in
        [("n", json!(2)), ("response_format", json!({"type": "json_object"})), ("logprobs", json!(true))]
    {
        let mut req = base();
        req.insert(field.into(), value.clone());
        let err: Untranslatable = chat_to_messages(&req).expect_err(&format!("{field}: {value} must be refused"));
        assert!(names_field(&err.0, field), "the refusal for {field} must name it, got {:?}", err.0);
        assert!(err.to_string().contains(&err.0));
    }
    // The harmless values of the same fields are accepted.
    for (field, value) in [("n", json!(1)), ("response_format", json!({"type": "text"})), ("logprobs", json!(false))] {
        let mut req = base();
        req.insert(field.into(), value.clone());
        let t = chat_to_messages(&req).unwrap_or_else(|e| panic!("{field}: {value} refused: {e}"));
        assert_eq!(
            Value::Object(t.body),
            json!({"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]}),
            "for {field}: {value}"
        );
    }
}

#[test]
fn thinking_blocks_are_dropped_and_listed() {
    let t = to_chat(json!({
        "model": "gpt-4o",
        "max_tokens": 2048,
        "messages": [
            {"role": "user", "content": "What is 27 * 453?"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "27 * 453 = 12231", "signature": "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds"},
                {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5L8rLVyIw"},
                {"type": "text", "text": "27 * 453 = 12,231."}
            ]},
            {"role": "user", "content": "Thanks"}
        ]
    }));
    assert_eq!(
        Value::Object(t.body),
        json!({
            "model": "gpt-4o",
            "max_tokens": 2048,
            "messages": [
                {"role": "user", "content": "What is 27 * 453?"},
                {"role": "assistant", "content": "27 * 453 = 12,231."},
                {"role": "user", "content": "Thanks"}
            ]
        })
    );
    assert_eq!(t.dropped, vec!["thinking blocks"]);
}

// ---------------------------------------------------------------------------------------------
// 3. Golden responses
// ---------------------------------------------------------------------------------------------

#[test]
fn text_message_response_becomes_chat_completion() {
    let got = messages_response_to_chat(&json!({
        "id": "msg_013Zva2CMHLNnXjNJJKqJ2EF",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5-20250929",
        "content": [{"type": "text", "text": "Hi! My name is Claude."}],
        "stop_reason": "end_turn",
        "stop_sequence": null,
        "usage": {"input_tokens": 2095, "output_tokens": 503}
    }));
    assert_eq!(
        without_created(got),
        json!({
            "id": "msg_013Zva2CMHLNnXjNJJKqJ2EF",
            "object": "chat.completion",
            "model": "claude-sonnet-4-5-20250929",
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": "Hi! My name is Claude."},
                "finish_reason": "stop"
            }],
            "usage": {"prompt_tokens": 2095, "completion_tokens": 503, "total_tokens": 2598}
        })
    );
}

#[test]
fn text_chat_completion_becomes_message_response() {
    let got = chat_response_to_messages(&json!({
        "id": "chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG",
        "object": "chat.completion",
        "created": 1741570283,
        "model": "gpt-4o-2024-08-06",
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": "The image shows a wooden boardwalk.", "refusal": null, "annotations": []},
            "logprobs": null,
            "finish_reason": "stop"
        }],
        "usage": {
            "prompt_tokens": 1117, "completion_tokens": 46, "total_tokens": 1163,
            "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0,
                                          "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0}
        },
        "service_tier": "default",
        "system_fingerprint": "fp_fc9f1d7035"
    }));
    assert_eq!(
        got,
        json!({
            "id": "chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG",
            "type": "message",
            "role": "assistant",
            "model": "gpt-4o-2024-08-06",
            "content": [{"type": "text", "text": "The image shows a wooden boardwalk."}],
            "stop_reason": "end_turn",
            "stop_sequence": null,
            "usage": {"input_tokens": 1117, "output_tokens": 46}
        })
    );
}

#[test]
fn parallel_tool_use_response_becomes_chat_tool_calls() {
    let got = messages_response_to_chat(&json!({
        "id": "msg_01Aq9w938a90dw8q",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5-20250929",
        "content": [
            {"type": "text", "text": "I'll check the weather in both cities."},
            {"type": "tool_use", "id": "toolu_01A09q90qw90lq917835lq9", "name": "get_weather", "input": {"location": "Paris"}},
            {"type": "tool_use", "id": "toolu_01B19q90qw90lq917835lq9", "name": "get_weather",
             "input": {"location": "Tokyo", "unit": "celsius"}}
        ],
        "stop_reason": "tool_use",
        "stop_sequence": null,
        "usage": {"input_tokens": 472, "output_tokens": 89}
    }));
    assert_eq!(
        without_created(got),
        json!({
            "id": "msg_01Aq9w938a90dw8q",
            "object": "chat.completion",
            "model": "claude-sonnet-4-5-20250929",
            "choices": [{
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": "I'll check the weather in both cities.",
                    "tool_calls": [
                        {"id": "toolu_01A09q90qw90lq917835lq9", "type": "function",
                         "function": {"name": "get_weather", "arguments": "{\"location\":\"Paris\"}"}},
                        {"id": "toolu_01B19q90qw90lq917835lq9", "type": "function",
                         "function": {"name": "get_weather", "arguments": "{\"location\":\"Tokyo\",\"unit\":\"celsius\"}"}}
                    ]
                },
                "finish_reason": "tool_calls"
            }],
            "usage": {"prompt_tokens": 472, "completion_tokens": 89, "total_tokens": 561}
        })
    );

    // Tool calls only: the chat message's content is null.
    let got = messages_response_to_chat(&json!({
        "id": "msg_02", "type": "message", "role": "assistant", "model": "claude-haiku-4-5",
        "content": [{"type": "tool_use", "id": "toolu_X", "name": "ping", "input": {}}],
        "stop_reason": "tool_use", "stop_sequence": null,
        "usage": {"input_tokens": 10, "output_tokens": 5}
    }));
    assert_eq!(
        without_created(got),
        json!({
            "id": "msg_02", "object": "chat.completion", "model": "claude-haiku-4-5",
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "toolu_X", "type": "function", "function": {"name": "ping", "arguments": "{}"}}
                ]},
                "finish_reason": "tool_calls"
            }],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
        })
    );
}

#[test]
fn parallel_chat_tool_calls_become_tool_use_blocks() {
    let got = chat_response_to_messages(&json!({
        "id": "chatcmpl-abc123",
        "object": "chat.completion",
        "created": 1699896916,
        "model": "gpt-4o-mini",
        "choices": [{
            "index": 0,
            "message": {
                "role": "assistant",
                "content": null,
                "tool_calls": [
                    {"id": "call_abc123", "type": "function",
                     "function": {"name": "get_current_weather", "arguments": "{\n\"location\": \"Boston, MA\"\n}"}},
                    {"id": "call_def456", "type": "function",
                     "function": {"name": "get_current_weather", "arguments": "{\"location\": \"Tokyo\", \"unit\": \"celsius\"}"}}
                ]
            },
            "logprobs": null,
            "finish_reason": "tool_calls"
        }],
        "usage": {"prompt_tokens": 82, "completion_tokens": 17, "total_tokens": 99}
    }));
    assert_eq!(
        got,
        json!({
            "id": "chatcmpl-abc123",
            "type": "message",
            "role": "assistant",
            "model": "gpt-4o-mini",
            "content": [
                {"type": "tool_use", "id": "call_abc123", "name": "get_current_weather", "input": {"location": "Boston, MA"}},
                {"type": "tool_use", "id": "call_def456", "name": "get_current_weather",
                 "input": {"location": "Tokyo", "unit": "celsius"}}
            ],
            "stop_reason": "tool_use",
            "stop_sequence": null,
            "usage": {"input_tokens": 82, "output_tokens": 17}
        })
    );
}

#[test]
fn stop_reasons_and_finish_reasons_map_both_ways() {
    for (stop, finish) in [("end_turn", "stop"), ("max_tokens", "length"), ("tool_use", "tool_calls")] {
        let got = messages_response_to_chat(&json!({
            "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5",
            "content": [{"type": "text", "text": "ok"}],
            "stop_reason": stop, "stop_sequence": null,
            "usage": {"input_tokens": 3, "output_tokens": 4}
        }));
        assert_eq!(
            without_created(got),
            json!({
                "id": "msg_1", "object": "chat.completion", "model": "claude-sonnet-4-5",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": finish}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
            }),
            "stop_reason {stop}"
        );

        let got = chat_response_to_messages(&json!({
            "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "gpt-4o",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "logprobs": null, "finish_reason": finish}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
        }));
        assert_eq!(
            got,
            json!({
                "id": "chatcmpl-1", "type": "message", "role": "assistant", "model": "gpt-4o",
                "content": [{"type": "text", "text": "ok"}],
                "stop_reason": stop, "stop_sequence": null,
                "usage": {"input_tokens": 3, "output_tokens": 4}
            }),
            "finish_reason {finish}"
        );
    }
    // A stop sequence ends the turn normally.
    let got = messages_response_to_chat(&json!({
        "id": "msg_1", "type": "message", "role": "assistant", "model": "m",
        "content": [{"type": "text", "text": "ok"}],
        "stop_reason": "stop_sequence", "stop_sequence": "END",
        "usage": {"input_tokens": 1, "output_tokens": 1}
    }));
    assert_eq!(got["choices"][0]["finish_reason"], json!("stop"));
}

#[test]
fn usage_maps_and_totals_both_ways() {
    let got = messages_response_to_chat(&json!({
        "id": "msg_u", "type": "message", "role": "assistant", "model": "m",
        "content": [{"type": "text", "text": "x"}], "stop_reason": "end_turn", "stop_sequence": null,
        "usage": {"input_tokens": 1234, "output_tokens": 56}
    }));
    assert_eq!(got["usage"], json!({"prompt_tokens": 1234, "completion_tokens": 56, "total_tokens": 1290}));

    let got = chat_response_to_messages(&json!({
        "id": "chatcmpl-u", "object": "chat.completion", "created": 1, "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "x"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1234, "completion_tokens": 56, "total_tokens": 1290}
    }));
    assert_eq!(got["usage"], json!({"input_tokens": 1234, "output_tokens": 56}));
}

#[test]
fn anthropic_cached_input_tokens_count_as_prompt_tokens() {
    // Anthropic's input_tokens excludes the cached part (cache_read/cache_creation); OpenAI's
    // prompt_tokens is the whole prompt.
    let got = messages_response_to_chat(&json!({
        "id": "msg_c", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5",
        "content": [{"type": "text", "text": "x"}], "stop_reason": "end_turn", "stop_sequence": null,
        "usage": {"input_tokens": 50, "cache_creation_input_tokens": 200, "cache_read_input_tokens": 1000, "output_tokens": 20}
    }));
    assert_eq!(got["usage"]["prompt_tokens"], json!(1250), "usage was {}", got["usage"]);
    assert_eq!(got["usage"]["completion_tokens"], json!(20));
    assert_eq!(got["usage"]["total_tokens"], json!(1270), "usage was {}", got["usage"]);
}

// ---------------------------------------------------------------------------------------------
// 4. Golden streams
// ---------------------------------------------------------------------------------------------

fn chat_chunk(id: &str, model: &str, delta: Value, finish: Value) -> (Option<String>, Value) {
    data(json!({
        "id": id, "object": "chat.completion.chunk", "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]
    }))
}

#[test]
fn anthropic_text_stream_becomes_chat_chunks() {
    let mut upstream = anthropic_sse(&[json!({"type": "message_start", "message": {
        "id": "msg_1nZdL29xx5MUA1yADyHTEsnR8uuvGzszyY", "type": "message", "role": "assistant", "content": [],
        "model": "claude-sonnet-4-5-20250929", "stop_reason": null, "stop_sequence": null,
        "usage": {"input_tokens": 25, "output_tokens": 1}}})]);
    upstream += &anthropic_sse(&[
        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
    ]);
    upstream += PING;
    upstream += &anthropic_sse(&[
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hello"}}),
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": ", wörld"}}),
    ]);
    upstream += PING;
    upstream += &anthropic_sse(&[
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "!"}}),
        json!({"type": "content_block_stop", "index": 0}),
        json!({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": null}, "usage": {"output_tokens": 15}}),
        json!({"type": "message_stop"}),
    ]);

    let (id, model) = ("msg_1nZdL29xx5MUA1yADyHTEsnR8uuvGzszyY", "claude-sonnet-4-5-20250929");
    let got = translate_stream(StreamTranslator::anthropic_to_chat(true), &upstream);
    assert_eq!(
        got,
        vec![
            chat_chunk(id, model, json!({"role": "assistant", "content": ""}), Value::Null),
            chat_chunk(id, model, json!({"content": "Hello"}), Value::Null),
            chat_chunk(id, model, json!({"content": ", wörld"}), Value::Null),
            chat_chunk(id, model, json!({"content": "!"}), Value::Null),
            chat_chunk(id, model, json!({}), json!("stop")),
            data(json!({
                "id": id, "object": "chat.completion.chunk", "model": model, "choices": [],
                "usage": {"prompt_tokens": 25, "completion_tokens": 15, "total_tokens": 40}
            })),
            done(),
        ]
    );
}

#[test]
fn chat_text_stream_becomes_anthropic_events() {
    let (id, model) = ("chatcmpl-123", "gpt-4o-mini-2024-07-18");
    let chunk = |delta: Value, finish: Value| {
        json!({"id": id, "object": "chat.completion.chunk", "created": 1694268190, "model": model,
               "system_fingerprint": "fp_44709d6fcb",
               "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}], "usage": null})
    };
    let upstream = openai_sse(
        &[
            chunk(json!({"role": "assistant", "content": "", "refusal": null}), Value::Null),
            chunk(json!({"content": "Hello"}), Value::Null),
            chunk(json!({"content": ", wörld"}), Value::Null),
            chunk(json!({"content": "!"}), Value::Null),
            chunk(json!({}), json!("stop")),
            json!({"id": id, "object": "chat.completion.chunk", "created": 1694268190, "model": model,
                   "system_fingerprint": "fp_44709d6fcb", "choices": [],
                   "usage": {"prompt_tokens": 9, "completion_tokens": 12, "total_tokens": 21,
                             "prompt_tokens_details": {"cached_tokens": 0}}}),
        ],
        true,
    );
    let got = translate_stream(StreamTranslator::chat_to_anthropic(), &upstream);
    assert_eq!(
        got,
        vec![
            ev(
                "message_start",
                json!({"type": "message_start", "message": {
                "id": id, "type": "message", "role": "assistant", "model": model, "content": [],
                "stop_reason": null, "stop_sequence": null, "usage": {"input_tokens": 0, "output_tokens": 0}}})
            ),
            ev(
                "content_block_start",
                json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})
            ),
            ev(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hello"}})
            ),
            ev(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": ", wörld"}})
            ),
            ev(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "!"}})
            ),
            ev("content_block_stop", json!({"type": "content_block_stop", "index": 0})),
            // The prompt size is only known at the end: message_delta's usage carries it
            // (MessageDeltaUsage.input_tokens, cumulative), since message_start said 0.
            ev(
                "message_delta",
                json!({"type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": null},
                "usage": {"input_tokens": 9, "output_tokens": 12}})
            ),
            ev("message_stop", json!({"type": "message_stop"})),
        ]
    );
}

#[test]
fn anthropic_streamed_tool_input_becomes_chat_tool_call_argument_deltas() {
    let (id, model) = ("msg_014p7gG3wDgGV9EUtLvnow3U", "claude-sonnet-4-5-20250929");
    let mut upstream = anthropic_sse(&[
        json!({"type": "message_start", "message": {"id": id, "type": "message", "role": "assistant", "model": model,
            "stop_sequence": null, "usage": {"input_tokens": 472, "output_tokens": 2}, "content": [], "stop_reason": null}}),
        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
    ]);
    upstream += PING;
    upstream += &anthropic_sse(&[
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Checking both."}}),
        json!({"type": "content_block_stop", "index": 0}),
        json!({"type": "content_block_start", "index": 1, "content_block":
            {"type": "tool_use", "id": "toolu_01T1x1fJ34qAmk2tNTrN7Up6", "name": "get_weather", "input": {}}}),
        json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": ""}}),
        json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "{\"location\":"}}),
        json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": " \"Paris\"}"}}),
        json!({"type": "content_block_stop", "index": 1}),
        json!({"type": "content_block_start", "index": 2, "content_block":
            {"type": "tool_use", "id": "toolu_02U2y2gK45rBnl3uOO4owo4V", "name": "get_weather", "input": {}}}),
        json!({"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": "{\"locat"}}),
        json!({"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": "ion\": \"Tokyo\"}"}}),
        json!({"type": "content_block_stop", "index": 2}),
        json!({"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": null}, "usage": {"output_tokens": 89}}),
        json!({"type": "message_stop"}),
    ]);
    let got = translate_stream(StreamTranslator::anthropic_to_chat(true), &upstream);
    let args = |n: u64, s: &str| json!({"tool_calls": [{"index": n, "function": {"arguments": s}}]});
    assert_eq!(
        got,
        vec![
            chat_chunk(id, model, json!({"role": "assistant", "content": ""}), Value::Null),
            chat_chunk(id, model, json!({"content": "Checking both."}), Value::Null),
            chat_chunk(
                id,
                model,
                json!({"tool_calls": [{"index": 0, "id": "toolu_01T1x1fJ34qAmk2tNTrN7Up6", "type": "function",
                "function": {"name": "get_weather", "arguments": ""}}]}),
                Value::Null
            ),
            chat_chunk(id, model, args(0, ""), Value::Null),
            chat_chunk(id, model, args(0, "{\"location\":"), Value::Null),
            chat_chunk(id, model, args(0, " \"Paris\"}"), Value::Null),
            chat_chunk(
                id,
                model,
                json!({"tool_calls": [{"index": 1, "id": "toolu_02U2y2gK45rBnl3uOO4owo4V", "type": "function",
                "function": {"name": "get_weather", "arguments": ""}}]}),
                Value::Null
            ),
            chat_chunk(id, model, args(1, "{\"locat"), Value::Null),
            chat_chunk(id, model, args(1, "ion\": \"Tokyo\"}"), Value::Null),
            chat_chunk(id, model, json!({}), json!("tool_calls")),
            data(json!({
                "id": id, "object": "chat.completion.chunk", "model": model, "choices": [],
                "usage": {"prompt_tokens": 472, "completion_tokens": 89, "total_tokens": 561}
            })),
            done(),
        ]
    );
}

#[test]
fn chat_streamed_tool_call_arguments_become_input_json_deltas() {
    let (id, model) = ("chatcmpl-9xTool", "gpt-4o-2024-08-06");
    let chunk = |delta: Value, finish: Value| {
        json!({"id": id, "object": "chat.completion.chunk", "created": 1723000000, "model": model,
               "system_fingerprint": "fp_abc", "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}],
               "usage": null})
    };
    let call_start = |n: u64, call_id: &str| json!({"tool_calls": [{"index": n, "id": call_id, "type": "function", "function": {"name": "get_weather", "arguments": ""}}]});
    let args = |n: u64, s: &str| json!({"tool_calls": [{"index": n, "function": {"arguments": s}}]});
    let mut first = call_start(0, "call_DdmO9pD3xa9XTPNJ32zg2hcA");
    first["role"] = json!("assistant");
    first["content"] = Value::Null;
    let upstream = openai_sse(
        &[
            chunk(first, Value::Null),
            chunk(args(0, "{\"lo"), Value::Null),
            chunk(args(0, "cation\": \"Paris\"}"), Value::Null),
            chunk(call_start(1, "call_ABkK4Zz1mJ6sY0XhW8pQe3Lr"), Value::Null),
            chunk(args(1, "{\"location\": "), Value::Null),
            chunk(args(1, "\"Tokyo\"}"), Value::Null),
            chunk(json!({}), json!("tool_calls")),
            json!({"id": id, "object": "chat.completion.chunk", "created": 1723000000, "model": model,
                   "system_fingerprint": "fp_abc", "choices": [],
                   "usage": {"prompt_tokens": 80, "completion_tokens": 48, "total_tokens": 128}}),
        ],
        true,
    );
    let got = translate_stream(StreamTranslator::chat_to_anthropic(), &upstream);
    let json_delta = |index: u64, s: &str| {
        ev(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": index,
            "delta": {"type": "input_json_delta", "partial_json": s}}),
        )
    };
    let block_start = |index: u64, call_id: &str| {
        ev(
            "content_block_start",
            json!({"type": "content_block_start", "index": index,
            "content_block": {"type": "tool_use", "id": call_id, "name": "get_weather", "input": {}}}),
        )
    };
    assert_eq!(
        got,
        vec![
            ev(
                "message_start",
                json!({"type": "message_start", "message": {
                "id": id, "type": "message", "role": "assistant", "model": model, "content": [],
                "stop_reason": null, "stop_sequence": null, "usage": {"input_tokens": 0, "output_tokens": 0}}})
            ),
            block_start(0, "call_DdmO9pD3xa9XTPNJ32zg2hcA"),
            json_delta(0, "{\"lo"),
            json_delta(0, "cation\": \"Paris\"}"),
            ev("content_block_stop", json!({"type": "content_block_stop", "index": 0})),
            block_start(1, "call_ABkK4Zz1mJ6sY0XhW8pQe3Lr"),
            json_delta(1, "{\"location\": "),
            json_delta(1, "\"Tokyo\"}"),
            ev("content_block_stop", json!({"type": "content_block_stop", "index": 1})),
            ev(
                "message_delta",
                json!({"type": "message_delta",
                "delta": {"stop_reason": "tool_use", "stop_sequence": null},
                "usage": {"input_tokens": 80, "output_tokens": 48}})
            ),
            ev("message_stop", json!({"type": "message_stop"})),
        ]
    );
}

#[test]
fn anthropic_error_event_mid_stream_becomes_chat_error_chunk() {
    let (id, model) = ("msg_01Err", "claude-sonnet-4-5-20250929");
    let mut upstream = anthropic_sse(&[
        json!({"type": "message_start", "message": {"id": id, "type": "message", "role": "assistant", "content": [],
            "model": model, "stop_reason": null, "stop_sequence": null, "usage": {"input_tokens": 12, "output_tokens": 1}}}),
        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Once upon"}}),
    ]);
    upstream += PING;
    upstream += "event: error\ndata: {\"type\": \"error\", \"error\": {\"type\": \"overloaded_error\", \"message\": \"Overloaded\"}}\n\n";
    let got = translate_stream(StreamTranslator::anthropic_to_chat(true), &upstream);
    assert_eq!(
        got,
        vec![
            chat_chunk(id, model, json!({"role": "assistant", "content": ""}), Value::Null),
            chat_chunk(id, model, json!({"content": "Once upon"}), Value::Null),
            data(json!({"error": {"message": "Overloaded", "type": "overloaded_error", "code": null}})),
        ]
    );
}

#[test]
fn chat_error_chunk_mid_stream_becomes_anthropic_error_event() {
    let (id, model) = ("chatcmpl-err", "gpt-4o");
    let chunk = |delta: Value| {
        json!({"id": id, "object": "chat.completion.chunk", "created": 1723000000, "model": model,
               "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": null}]})
    };
    let upstream = openai_sse(
        &[
            chunk(json!({"role": "assistant", "content": ""})),
            chunk(json!({"content": "Once upon"})),
            json!({"error": {"message": "The server had an error while processing your request. Sorry about that!",
                             "type": "server_error", "param": null, "code": null}}),
        ],
        false,
    );
    let got = translate_stream(StreamTranslator::chat_to_anthropic(), &upstream);
    assert_eq!(
        got,
        vec![
            ev(
                "message_start",
                json!({"type": "message_start", "message": {
                "id": id, "type": "message", "role": "assistant", "model": model, "content": [],
                "stop_reason": null, "stop_sequence": null, "usage": {"input_tokens": 0, "output_tokens": 0}}})
            ),
            ev(
                "content_block_start",
                json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})
            ),
            ev(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Once upon"}})
            ),
            ev(
                "error",
                json!({"type": "error", "error": {"type": "api_error",
                "message": "The server had an error while processing your request. Sorry about that!"}})
            ),
        ]
    );
}

#[test]
fn streams_cut_without_end_marker_get_no_clean_end() {
    // Anthropic upstream that ended after content: no [DONE] is made up for the chat client (the
    // relay adds its in-band error; see src/gateway/relay.rs).
    let upstream = anthropic_sse(&[
        json!({"type": "message_start", "message": {"id": "msg_cut", "type": "message", "role": "assistant", "content": [],
            "model": "m", "stop_reason": null, "stop_sequence": null, "usage": {"input_tokens": 1, "output_tokens": 1}}}),
        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi"}}),
    ]);
    let got = translate_stream(StreamTranslator::anthropic_to_chat(true), &upstream);
    assert_eq!(
        got,
        vec![
            chat_chunk("msg_cut", "m", json!({"role": "assistant", "content": ""}), Value::Null),
            chat_chunk("msg_cut", "m", json!({"content": "Hi"}), Value::Null),
        ]
    );

    // Chat upstream without [DONE]: no `message_stop` for the Anthropic client.
    let upstream = openai_sse(
        &[json!({"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m",
                 "choices": [{"index": 0, "delta": {"role": "assistant", "content": "Hi"}, "finish_reason": null}]})],
        false,
    );
    let got = translate_stream(StreamTranslator::chat_to_anthropic(), &upstream);
    let names: Vec<&str> = got.iter().filter_map(|(n, _)| n.as_deref()).collect();
    assert_eq!(names, ["message_start", "content_block_start", "content_block_delta"]);
}

// ---------------------------------------------------------------------------------------------
// 5. Round-trip properties
// ---------------------------------------------------------------------------------------------

/// A JSON object of scalars (and one level of nesting), as tool arguments or tool input.
fn json_object() -> impl Strategy<Value = Value> {
    let scalar = prop_oneof![
        any::<i32>().prop_map(Value::from),
        any::<bool>().prop_map(Value::from),
        "\\PC{0,8}".prop_map(Value::from),
        Just(Value::Null),
    ];
    let leaf = prop_oneof![
        4 => scalar.clone(),
        1 => prop::collection::vec(("[a-z]{1,5}", scalar), 0..3).prop_map(|kv| Value::Object(kv.into_iter().collect())),
    ];
    prop::collection::vec(("[a-z_]{1,8}", leaf), 0..4).prop_map(|kv| Value::Object(kv.into_iter().collect()))
}

fn text() -> impl Strategy<Value = String> {
    "[A-Za-z0-9 ,.!?'é]{1,24}"
}

#[derive(Clone, Debug)]
struct Call {
    id: String,
    name: String,
    args: Value,
}

fn call() -> impl Strategy<Value = Call> {
    ("[A-Za-z0-9]{8}", "[a-z_]{1,10}", json_object()).prop_map(|(id, name, args)| Call {
        id: format!("call_{id}"),
        name,
        args,
    })
}

/// One exchange after the first user message: the assistant answers (with text, or with tool
/// calls and perhaps text), then the user side (tool results for the calls, then perhaps text).
#[derive(Clone, Debug)]
struct Exchange {
    text: Option<String>,
    calls: Vec<Call>,
    results: Vec<String>,
    follow_up: Option<String>,
}

fn exchange() -> impl Strategy<Value = Exchange> {
    (
        prop::option::of(text()),
        prop::collection::vec(call(), 0..=2),
        prop::collection::vec(text(), 2),
        prop::option::of(text()),
        text(),
    )
        .prop_map(|(text, calls, results, follow_up, fallback)| {
            // Without calls the assistant says something, and the user must answer before the
            // next assistant turn (two assistant messages in a row would merge).
            let text = if calls.is_empty() { Some(text.unwrap_or(fallback.clone())) } else { text };
            let follow_up = if calls.is_empty() { Some(follow_up.unwrap_or(fallback)) } else { follow_up };
            Exchange { text, calls, results, follow_up }
        })
}

#[derive(Clone, Debug)]
enum Max {
    None,
    Tokens(u32),
    CompletionTokens(u32),
}

#[derive(Clone, Debug)]
enum Stop {
    None,
    One(String),
    Many(Vec<String>),
}

#[derive(Clone, Debug)]
enum Choice {
    None,
    Auto,
    Required,
    NoTools,
    Named(String),
}

fn tool_def() -> impl Strategy<Value = Value> {
    ("[a-z_]{1,10}", prop::option::of(text()), prop::collection::vec("[a-z]{1,6}", 0..3), any::<bool>()).prop_map(
        |(name, description, props, require_first)| {
            let properties: Map<String, Value> = props.iter().map(|p| (p.clone(), json!({"type": "string"}))).collect();
            let mut parameters = json!({"type": "object", "properties": properties});
            if require_first && let Some(p) = props.first() {
                parameters["required"] = json!([p]);
            }
            let mut function = json!({"name": name, "parameters": parameters});
            if let Some(d) = description {
                function["description"] = json!(d);
            }
            json!({"type": "function", "function": function})
        },
    )
}

/// Chat requests from the lossless subset.
fn chat_request() -> impl Strategy<Value = Map<String, Value>> {
    let conversation = (prop::option::of(text()), text(), prop::collection::vec(exchange(), 0..3));
    let sampling = (
        prop::option::of(0.0f64..=1.0),
        prop::option::of(0.0f64..=1.0),
        prop_oneof![
            Just(Max::None),
            (1u32..=8192).prop_map(Max::Tokens),
            (1u32..=8192).prop_map(Max::CompletionTokens)
        ],
        prop_oneof![
            Just(Stop::None),
            text().prop_map(Stop::One),
            prop::collection::vec(text(), 1..=4).prop_map(Stop::Many)
        ],
        prop::option::of("[a-z0-9-]{1,16}"),
        prop::option::of(any::<bool>()),
    );
    let tooling = (
        prop::option::of(prop::collection::vec(tool_def(), 1..=2)),
        prop_oneof![
            Just(Choice::None),
            Just(Choice::Auto),
            Just(Choice::Required),
            Just(Choice::NoTools),
            "[a-z_]{1,10}".prop_map(Choice::Named)
        ],
        any::<bool>(),
    );
    ("[a-z0-9.-]{1,20}", conversation, sampling, tooling).prop_map(
        |(
            model,
            (system, first, exchanges),
            (temperature, top_p, max, stop, user, stream),
            (tools, choice, serial),
        )| {
            let mut messages = Vec::new();
            messages.push(json!({"role": "user", "content": first}));
            for x in exchanges {
                let mut assistant = json!({"role": "assistant", "content": x.text});
                if !x.calls.is_empty() {
                    assistant["tool_calls"] = x
                        .calls
                        .iter()
                        .map(|c| {
                            json!({"id": c.id, "type": "function",
                                        "function": {"name": c.name, "arguments": c.args.to_string()}})
                        })
                        .collect();
                }
                messages.push(assistant);
                for (c, result) in x.calls.iter().zip(&x.results) {
                    messages.push(json!({"role": "tool", "tool_call_id": c.id, "content": result}));
                }
                if let Some(f) = x.follow_up {
                    messages.push(json!({"role": "user", "content": f}));
                }
            }
            messages.truncate(6);
            if let Some(s) = system {
                messages.insert(0, json!({"role": "system", "content": s}));
            }
            let mut req = obj(json!({"model": model, "messages": messages}));
            if let Some(t) = temperature {
                req.insert("temperature".into(), json!(t));
            }
            if let Some(p) = top_p {
                req.insert("top_p".into(), json!(p));
            }
            match max {
                Max::None => {}
                Max::Tokens(n) => {
                    req.insert("max_tokens".into(), json!(n));
                }
                Max::CompletionTokens(n) => {
                    req.insert("max_completion_tokens".into(), json!(n));
                }
            }
            match stop {
                Stop::None => {}
                Stop::One(s) => {
                    req.insert("stop".into(), json!(s));
                }
                Stop::Many(v) => {
                    req.insert("stop".into(), json!(v));
                }
            }
            if let Some(u) = user {
                req.insert("user".into(), json!(u));
            }
            if let Some(s) = stream {
                req.insert("stream".into(), json!(s));
            }
            if let Some(t) = tools {
                req.insert("tools".into(), Value::Array(t));
            }
            let choice = match choice {
                Choice::None => None,
                Choice::Auto => Some(json!("auto")),
                Choice::Required => Some(json!("required")),
                Choice::NoTools => Some(json!("none")),
                Choice::Named(n) => Some(json!({"type": "function", "function": {"name": n}})),
            };
            // parallel_tool_calls=false round-trips with auto, required and a named tool.
            let serial_ok = matches!(&choice, Some(c) if c != &json!("none"));
            if let Some(c) = choice {
                req.insert("tool_choice".into(), c);
            }
            if serial && serial_ok {
                req.insert("parallel_tool_calls".into(), json!(false));
            }
            req
        },
    )
}

/// What a chat request reads like after a trip through the messages format: only the
/// documented lossy spots are normalised.
fn normalise_chat(mut req: Map<String, Value>) -> Map<String, Value> {
    if let Some(m) = req.remove("max_completion_tokens") {
        req.insert("max_tokens".into(), m);
    }
    if !req.contains_key("max_tokens") {
        req.insert("max_tokens".into(), json!(DEFAULT_MAX_TOKENS));
    }
    if let Some(Value::String(s)) = req.get("stop").cloned() {
        req.insert("stop".into(), json!([s]));
    }
    req.remove("stream_options");
    if req.get("stream") == Some(&json!(true)) {
        req.insert("stream_options".into(), json!({"include_usage": true}));
    }
    req
}

/// Messages requests from the lossless subset (content always as blocks; one text block per
/// assistant turn).
fn messages_request() -> impl Strategy<Value = Map<String, Value>> {
    let conversation = (prop::option::of(text()), text(), prop::collection::vec(exchange(), 0..3));
    let sampling = (
        prop::option::of(0.0f64..=1.0),
        prop::option::of(0.0f64..=1.0),
        1u32..=8192,
        prop::option::of(prop::collection::vec(text(), 1..=4)),
        prop::option::of("[a-z0-9-]{1,16}"),
        prop::option::of(any::<bool>()),
    );
    let tooling = (
        prop::option::of(prop::collection::vec(tool_def(), 1..=2)),
        prop_oneof![
            Just(Choice::None),
            Just(Choice::Auto),
            Just(Choice::Required),
            Just(Choice::NoTools),
            "[a-z_]{1,10}".prop_map(Choice::Named)
        ],
        any::<bool>(),
    );
    ("[a-z0-9.-]{1,20}", conversation, sampling, tooling).prop_map(
        |(
            model,
            (system, first, exchanges),
            (temperature, top_p, max, stop, user, stream),
            (tools, choice, serial),
        )| {
            let mut messages = vec![json!({"role": "user", "content": [{"type": "text", "text": first}]})];
            for x in exchanges {
                let mut blocks = Vec::new();
                if let Some(t) = x.text {
                    blocks.push(json!({"type": "text", "text": t}));
                }
                for c in &x.calls {
                    blocks.push(json!({"type": "tool_use", "id": c.id, "name": c.name, "input": c.args}));
                }
                messages.push(json!({"role": "assistant", "content": blocks}));
                let mut user: Vec<Value> = x
                    .calls
                    .iter()
                    .zip(&x.results)
                    .map(|(c, r)| json!({"type": "tool_result", "tool_use_id": c.id, "content": r}))
                    .collect();
                if let Some(f) = x.follow_up {
                    user.push(json!({"type": "text", "text": f}));
                }
                if !user.is_empty() {
                    messages.push(json!({"role": "user", "content": user}));
                }
            }
            messages.truncate(6);
            let mut req = obj(json!({"model": model, "max_tokens": max, "messages": messages}));
            if let Some(s) = system {
                req.insert("system".into(), json!(s));
            }
            if let Some(t) = temperature {
                req.insert("temperature".into(), json!(t));
            }
            if let Some(p) = top_p {
                req.insert("top_p".into(), json!(p));
            }
            if let Some(s) = stop {
                req.insert("stop_sequences".into(), json!(s));
            }
            if let Some(u) = user {
                req.insert("metadata".into(), json!({"user_id": u}));
            }
            if let Some(s) = stream {
                req.insert("stream".into(), json!(s));
            }
            if let Some(tools) = tools {
                let tools: Vec<Value> = tools
                    .into_iter()
                    .map(|t| {
                        let f = &t["function"];
                        let mut tool = json!({"name": f["name"], "input_schema": f["parameters"]});
                        if let Some(d) = f.get("description") {
                            tool["description"] = d.clone();
                        }
                        tool
                    })
                    .collect();
                req.insert("tools".into(), Value::Array(tools));
            }
            let mut choice = match choice {
                Choice::None => None,
                Choice::Auto => Some(json!({"type": "auto"})),
                Choice::Required => Some(json!({"type": "any"})),
                Choice::NoTools => Some(json!({"type": "none"})),
                Choice::Named(n) => Some(json!({"type": "tool", "name": n})),
            };
            if let Some(c) = choice.as_mut().filter(|c| c["type"] != "none")
                && serial
            {
                c["disable_parallel_tool_use"] = json!(true);
            }
            if let Some(c) = choice {
                req.insert("tool_choice".into(), c);
            }
            req
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn chat_requests_survive_a_trip_through_messages(x in chat_request()) {
        let there = chat_to_messages(&x).map_err(|e| TestCaseError::fail(format!("chat → messages: {e}")))?;
        prop_assert!(there.dropped.is_empty(), "dropped on the way there: {:?}", there.dropped);
        let back = messages_to_chat(&there.body).map_err(|e| TestCaseError::fail(format!("messages → chat: {e}")))?;
        prop_assert!(back.dropped.is_empty(), "dropped on the way back: {:?}", back.dropped);
        prop_assert_eq!(Value::Object(back.body), Value::Object(normalise_chat(x)));
    }

    #[test]
    fn messages_requests_survive_a_trip_through_chat(x in messages_request()) {
        let there = messages_to_chat(&x).map_err(|e| TestCaseError::fail(format!("messages → chat: {e}")))?;
        prop_assert!(there.dropped.is_empty(), "dropped on the way there: {:?}", there.dropped);
        let back = chat_to_messages(&there.body).map_err(|e| TestCaseError::fail(format!("chat → messages: {e}")))?;
        prop_assert!(back.dropped.is_empty(), "dropped on the way back: {:?}", back.dropped);
        prop_assert_eq!(Value::Object(back.body), Value::Object(x));
    }
}

#[test]
fn temperature_above_one_cannot_go_to_anthropic() {
    let req = json!({"model": "m", "temperature": 1.5, "messages": [{"role": "user", "content": "hi"}]});
    let err = chat_to_messages(req.as_object().unwrap()).unwrap_err();
    assert_eq!(err.to_string(), "cannot translate: temperature above 1 (Anthropic accepts 0 to 1)");
    let ok = json!({"model": "m", "temperature": 1.0, "messages": [{"role": "user", "content": "hi"}]});
    assert_eq!(chat_to_messages(ok.as_object().unwrap()).unwrap().body["temperature"], json!(1.0));
}

// ---------------------------------------------------------------------------------------------
// What real agents send (captured from Claude Code 2.1.328, tests/fixtures/agents/)
// ---------------------------------------------------------------------------------------------

fn captured(name: &str) -> Map<String, Value> {
    let path = format!("{}/tests/fixtures/agents/{name}", env!("CARGO_MANIFEST_DIR"));
    let v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    obj(v["body"].clone())
}

#[test]
fn claude_codes_real_request_becomes_a_chat_request() {
    let req = captured("claude-code-2.1.328-messages.json");
    let out = to_chat(Value::Object(req.clone()));
    let messages = out.body["messages"].as_array().unwrap();
    // The top-level `system` array first, joined; then the conversation, with Claude Code's
    // mid-conversation `system` message kept in place.
    let roles: Vec<&str> = messages.iter().map(|m| m["role"].as_str().unwrap()).collect();
    let in_req: Vec<&str> = req["messages"].as_array().unwrap().iter().map(|m| m["role"].as_str().unwrap()).collect();
    assert_eq!(roles[0], "system");
    assert_eq!(roles[1..], in_req[..], "one chat message per messages entry");
    assert!(in_req.contains(&"system"), "the capture holds a system message inside `messages`");
    let first = messages[0]["content"].as_str().unwrap();
    assert!(
        first.starts_with("x-anthropic-billing-header") && first.contains("You are a Claude agent"),
        "{first:.200}"
    );
    // Every one of its tools is a function tool; `defer_loading` is Anthropic's alone.
    let tools = out.body["tools"].as_array().unwrap();
    assert_eq!(tools.len(), req["tools"].as_array().unwrap().len());
    assert!(tools.iter().all(|t| t["type"] == "function" && t["function"]["parameters"].is_object()));
    assert!(!out.body["tools"].to_string().contains("defer_loading"));
    assert_eq!(
        sorted(out.dropped.clone()),
        sorted(
            ["cache_control", "context_management", "output_config", "thinking"]
                .iter()
                .map(|s| s.to_string())
                .collect()
        )
    );
    assert_eq!(out.body["stream"], true);
    assert_eq!(out.body["stream_options"], json!({"include_usage": true}));
    assert_eq!(out.body["max_tokens"], 32000);
    // Claude Code's ids travel as the chat `user`, as any `metadata.user_id` does.
    assert_eq!(out.body["user"], req["metadata"]["user_id"]);
}

#[test]
fn server_tools_and_cache_markers_are_dropped_and_listed() {
    let out = to_chat(json!({
        "model": "m", "max_tokens": 10,
        "system": [{"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}],
        "tools": [
            {"type": "web_search_20250305", "name": "web_search", "max_uses": 3},
            {"name": "Read", "input_schema": {"type": "object"}, "cache_control": {"type": "ephemeral"}},
        ],
        "messages": [{"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t0", "content": [
                {"type": "text", "text": "seen"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]},
            {"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}]}],
    }));
    assert_eq!(out.body.get("system"), None, "the system text is the first message");
    assert_eq!(out.body["messages"][0], json!({"role": "system", "content": "be brief"}));
    assert_eq!(out.body["messages"][1], json!({"role": "tool", "tool_call_id": "t0", "content": "seen"}));
    assert_eq!(out.body["tools"].as_array().unwrap().len(), 1);
    assert_eq!(out.body["tools"][0]["function"]["name"], "Read");
    assert_eq!(out.dropped, ["cache_control", "non-text tool_result content", "tools[type=web_search_20250305]"]);
    // Only server tools: no tools, and no tool choice a chat upstream would refuse.
    let out = to_chat(json!({"model": "m", "max_tokens": 10, "messages": [],
        "tools": [{"type": "web_search_20250305", "name": "web_search"}], "tool_choice": {"type": "auto"}}));
    assert_eq!((out.body.get("tools"), out.body.get("tool_choice")), (None, None));
    assert!(out.dropped.contains(&"tool_choice".to_string()), "{:?}", out.dropped);
}

#[test]
fn anthropic_thinking_reaches_a_chat_client_as_reasoning_content() {
    let answer = json!({"id": "msg_1", "type": "message", "model": "claude", "content": [
        {"type": "thinking", "thinking": "two and two", "signature": "sig"},
        {"type": "text", "text": "four"}], "stop_reason": "end_turn",
        "usage": {"input_tokens": 3, "output_tokens": 5}});
    let chat = messages_response_to_chat(&answer);
    assert_eq!(chat["choices"][0]["message"]["reasoning_content"], "two and two");
    assert_eq!(chat["choices"][0]["message"]["content"], "four");
    let upstream = anthropic_sse(&[
        json!({"type": "message_start", "message": {"id": "msg_1", "model": "claude", "usage": {"input_tokens": 3}}}),
        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": ""}}),
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "two and two"}}),
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta", "signature": "sig"}}),
        json!({"type": "content_block_stop", "index": 0}),
        json!({"type": "message_stop"}),
    ]);
    let got = translate_stream(StreamTranslator::anthropic_to_chat(false), &upstream);
    assert_eq!(got[1].1["choices"][0]["delta"], json!({"reasoning_content": "two and two"}));
    assert_eq!(got.len(), 3, "the signature is Anthropic's alone: {got:?}");
}
