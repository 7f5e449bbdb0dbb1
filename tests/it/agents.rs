//! What the agents people run send, through rota: Claude Code's real request served by a chat
//! model, its token counts, and Codex's session header (tests/fixtures/agents/ holds requests
//! captured from Claude Code 2.1.328 and Codex 0.169.0).

use crate::support::{self, ANTHROPIC_KEY, KEYS, Mock, Reply, Rota, Scenario, spawn};
use serde_json::{Value, json};

fn captured(name: &str) -> Value {
    let path = format!("{}/tests/fixtures/agents/{name}", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// `openai/gpt-4.1` first, Anthropic's provider beside it.
fn config(base: &str) -> String {
    format!("{}{}", support::config(base), support::anthropic_provider(base))
}

/// Posts a captured request to rota as the agent did (its path and headers), with `model`.
async fn replay(rota: &Rota, capture: &Value, model: &str, stream: bool) -> reqwest::Response {
    replay_body(rota, capture, capture["body"].clone(), model, stream).await
}

async fn replay_body(rota: &Rota, capture: &Value, mut body: Value, model: &str, stream: bool) -> reqwest::Response {
    let line = capture["request_line"].as_str().unwrap();
    let path = line.split_whitespace().nth(1).unwrap();
    body["model"] = json!(model);
    body["stream"] = json!(stream);
    let mut req = Rota::client().post(format!("{}{path}", rota.url)).bearer_auth(&rota.agent_key).json(&body);
    for (k, v) in capture["headers"].as_object().unwrap() {
        if !["content-type", "accept"].contains(&k.to_ascii_lowercase().as_str()) {
            req = req.header(k, v.as_str().unwrap());
        }
    }
    req.send().await.unwrap()
}

#[tokio::test]
async fn claude_codes_real_request_is_served_by_a_chat_model() {
    let (mock, base) = Mock::started().await;
    let cfg = config(&base);
    let rota = spawn(Scenario { config: &cfg, keys: &[KEYS[0]], ..Scenario::default() }).await;
    let capture = captured("claude-code-2.1.328-messages.json");
    for stream in [false, true] {
        let r = replay(&rota, &capture, "openai/gpt-4.1", stream).await;
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()["x-rota-dropped"], "cache_control, thinking, context_management, output_config");
        let text = r.text().await.unwrap();
        match stream {
            false => assert_eq!(serde_json::from_str::<Value>(&text).unwrap()["type"], "message"),
            true => assert!(
                text.starts_with("event: message_start")
                    && text.ends_with("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"),
                "{text}"
            ),
        }
    }
    let sent = &mock.bodies()[0];
    assert_eq!(mock.seen()[0].path, "/v1/chat/completions");
    assert_eq!(sent["messages"][0]["role"], "system");
    assert_eq!(sent["tools"].as_array().unwrap().len(), capture["body"]["tools"].as_array().unwrap().len());
}

#[tokio::test]
async fn token_counts_go_to_an_anthropic_provider_and_are_estimated_elsewhere() {
    let (mock, base) = Mock::started().await;
    let cfg = config(&base);
    let rota = spawn(Scenario { config: &cfg, keys: &[KEYS[0], ANTHROPIC_KEY], ..Scenario::default() }).await;
    let count = |model: &str| {
        let body =
            json!({"model": model, "system": "be brief", "messages": [{"role": "user", "content": "hello world!"}]});
        Rota::client()
            .post(format!("{}/v1/messages/count_tokens?beta=true", rota.url))
            .header("x-api-key", &rota.agent_key)
            .header("anthropic-beta", "token-counting-2024-11-01")
            .json(&body)
            .send()
    };
    mock.script(ANTHROPIC_KEY.1, vec![Reply::Status(200, vec![], r#"{"input_tokens":42}"#.into())]);
    let r = count("anthropic/claude-sonnet-4-5").await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.headers().get("x-rota-estimated").is_none());
    assert_eq!(r.json::<Value>().await.unwrap(), json!({"input_tokens": 42}));
    let seen = mock.seen();
    assert_eq!(
        (seen[0].path.as_str(), seen[0].key.as_str(), seen[0].model.as_str()),
        ("/v1/messages/count_tokens", ANTHROPIC_KEY.1, "claude-sonnet-4-5")
    );

    // A chat model has no count: rota estimates. "be brief" 8 + "user" 4 + "role" 4 +
    // "content" 7 + "hello world!" 12 = 35 bytes → 9 tokens.
    let r = count("openai/gpt-4.1").await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-rota-estimated"], "true");
    assert_eq!(r.json::<Value>().await.unwrap(), json!({"input_tokens": 9}));
    assert_eq!(mock.seen().len(), 1, "no upstream call for an estimate");
    // Not requests: no audit rows.
    assert_eq!(rota.scalar("SELECT COUNT(*) FROM requests").await, Some(0));
    // A key is still required, and an unknown model is refused.
    let r =
        Rota::client().post(format!("{}/v1/messages/count_tokens", rota.url)).json(&json!({})).send().await.unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(count("nope/none").await.unwrap().status(), 404);
}

#[tokio::test]
async fn codexs_session_header_keeps_its_turns_on_one_profile() {
    let (mock, base) = Mock::started().await;
    let cfg = config(&base);
    let rota = spawn(Scenario { config: &cfg, keys: &KEYS[..2], ..Scenario::default() }).await;
    let capture = captured("codex-0.169.0-responses.json");
    // The header alone: without the body's `prompt_cache_key`.
    let mut body = capture["body"].clone();
    body.as_object_mut().unwrap().remove("prompt_cache_key");
    let mut profiles = Vec::new();
    for _ in 0..3 {
        // Without a session, turns one after another alternate between the two profiles.
        let r = replay_body(&rota, &capture, body.clone(), "openai/gpt-4.1", false).await;
        assert_eq!(r.status(), 200);
        profiles.push(r.headers()["x-rota-profile"].to_str().unwrap().to_string());
    }
    assert_eq!(profiles, [profiles[0].clone(), profiles[0].clone(), profiles[0].clone()]);
    let other = rota.chat(support::chat(), &[]).await;
    assert_ne!(other.headers()["x-rota-profile"].to_str().unwrap(), profiles[0], "a request of no session rotates");
    assert_eq!(mock.seen().len(), 4);
}

#[tokio::test]
async fn chat_and_messages_clients_are_served_by_a_provider_that_speaks_only_responses() {
    let (mock, base) = Mock::started().await;
    let cfg = format!(
        "[providers.oai]\napi = \"openai-responses\"\nbase_url = \"{base}/v1\"\n[models]\nprimary = \"oai/gpt-4.1\"\n"
    );
    let rota = spawn(Scenario { config: &cfg, keys: &[("oai:k1", KEYS[0].1)], ..Scenario::default() }).await;
    let answer = json!({"id": "resp_1", "object": "response", "created_at": 1, "status": "completed", "model": "gpt-4.1",
        "output": [{"type": "message", "id": "msg_1", "status": "completed", "role": "assistant",
                    "content": [{"type": "output_text", "text": "from responses", "annotations": []}]}],
        "usage": {"input_tokens": 9, "output_tokens": 3, "total_tokens": 12}});
    mock.script(KEYS[0].1, vec![Reply::Status(200, vec![], answer.to_string()); 2]);
    let r = rota.chat(json!({"model": "oai/gpt-4.1", "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]}), &[]).await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["choices"][0]["message"]["content"], "from responses");
    assert_eq!((v["usage"]["prompt_tokens"].as_i64(), v["usage"]["completion_tokens"].as_i64()), (Some(9), Some(3)));
    let sent = &mock.bodies()[0];
    assert_eq!(mock.seen()[0].path, "/v1/responses");
    assert_eq!(sent["instructions"], "be brief");
    assert_eq!(sent["store"], false, "rota keeps nothing upstream either");
    // An Anthropic client, two steps through chat.
    let r = rota
        .messages(json!({"model": "oai/gpt-4.1", "max_tokens": 20, "messages": [{"role": "user", "content": "hi"}]}))
        .await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["content"], json!([{"type": "text", "text": "from responses"}]));
    assert_eq!(mock.bodies()[1]["max_output_tokens"], 20);
    // Streamed, a few bytes per write: a recorded function call reaches an Anthropic client as tool_use.
    let tool = support::recorded("openai-responses-tool");
    mock.script(KEYS[0].1, vec![Reply::Raw(tool, support::Writes::Bytes(7))]);
    let r = rota.messages(json!({"model": "oai/gpt-4.1", "max_tokens": 20, "stream": true, "messages": [{"role": "user", "content": "weather?"}]})).await;
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    assert!(text.contains(r#""content_block":{"type":"tool_use","id":"call_Kq3vX8bN2mR7tY5wZ1pL9dF4","name":"get_weather","input":{}}"#), "{text}");
    let args: String = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|v| v.pointer("/delta/partial_json").and_then(Value::as_str).map(str::to_string))
        .collect();
    assert_eq!(serde_json::from_str::<Value>(&args).unwrap(), json!({"location": "San Francisco, CA"}));
    assert!(
        text.contains(r#""stop_reason":"tool_use""#)
            && text.ends_with("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"),
        "{text}"
    );
    let rows = rota.attempts().await;
    assert!(rows.iter().all(|a| a.outcome == "success"), "{rows:?}");
}
