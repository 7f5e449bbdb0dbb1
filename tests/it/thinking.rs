//! Signed thinking across models (docs/translation.md, "Thinking across models"): blocks another
//! provider signed never reach a provider that cannot verify them, and a refused signature is
//! retried once without thinking.

use crate::support::{self, ANTHROPIC_KEY, Mock, Reply, Scenario, Writes, row, spawn};
use serde_json::{Value, json};

const OTHER_KEY: (&str, &str) = ("claude2:main", "sk-ant-test-other-0006");

/// `anthropic/claude` first, then `claude2/claude`: a second Anthropic-format provider at the
/// same mock (another account's region, a reseller).
fn config(base: &str) -> String {
    format!(
        "{}[providers.claude2]\napi = \"anthropic\"\nbase_url = \"{base}\"\n[models]\nprimary = \"anthropic/claude\"\nfallbacks = [\"claude2/claude\"]\n",
        support::anthropic_provider(base)
    )
}

fn signed(sig: &str) -> Value {
    json!({"type": "thinking", "thinking": "the file first", "signature": sig})
}

/// An answer that thinks (signed `sig`), then asks for a tool.
fn thinking_answer(sig: &str) -> String {
    json!({"id": "msg_1", "type": "message", "role": "assistant", "model": "claude",
        "content": [signed(sig), {"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {"file_path": "a.txt"}}],
        "stop_reason": "tool_use", "usage": {"input_tokens": 10, "output_tokens": 4}})
    .to_string()
}

/// The second turn of the conversation: the first answer, then the tool's result.
fn second_turn(sig: &str) -> Value {
    json!({"model": "anthropic/claude", "max_tokens": 2048,
    "thinking": {"type": "enabled", "budget_tokens": 1024},
    "messages": [
        {"role": "user", "content": "read a.txt"},
        {"role": "assistant", "content": [signed(sig), {"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {"file_path": "a.txt"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "pineapple"}]},
    ]})
}

fn thinking_blocks(body: &Value) -> usize {
    body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|m| m["content"].as_array().cloned().unwrap_or_default())
        .filter(|b| b["type"] == "thinking")
        .count()
}

#[tokio::test]
async fn a_conversation_with_signed_thinking_falls_back_to_another_provider() {
    let (mock, base) = Mock::started().await;
    let cfg = config(&base);
    let rota = spawn(Scenario { config: &cfg, keys: &[ANTHROPIC_KEY, OTHER_KEY], ..Scenario::default() }).await;
    mock.script(ANTHROPIC_KEY.1, vec![Reply::Status(200, vec![], thinking_answer("sig-from-anthropic"))]);
    let first = json!({"model": "anthropic/claude", "max_tokens": 2048, "thinking": {"type": "enabled", "budget_tokens": 1024},
        "messages": [{"role": "user", "content": "read a.txt"}]});
    let r = rota.messages(first).await;
    assert_eq!(r.status(), 200);
    let answer: Value = r.json().await.unwrap();
    assert_eq!(answer["content"][0]["signature"], "sig-from-anthropic");

    // The second turn: the first provider is throttled, the fallback is another provider.
    mock.script(ANTHROPIC_KEY.1, vec![Reply::Status(429, vec![("retry-after", "30".into())], "{}".into())]);
    let r = rota.messages(second_turn("sig-from-anthropic")).await;
    assert_eq!(r.status(), 200, "{:?}", r.text().await);
    assert_eq!(r.headers()["x-rota-provider"], "claude2");
    assert_eq!(r.headers()["x-rota-dropped"], "thinking blocks signed elsewhere");
    let bodies = mock.bodies();
    assert_eq!(bodies.len(), 3);
    assert_eq!(thinking_blocks(&bodies[1]), 1, "the provider that signed it gets it back");
    assert_eq!(thinking_blocks(&bodies[2]), 0, "another provider cannot verify it");
    assert_eq!(bodies[2].get("thinking"), None, "the tool loop's turn lost its thinking: thinking is off");
    assert_eq!(
        bodies[2]["messages"][1]["content"],
        json!([{"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {"file_path": "a.txt"}}])
    );
    let a = rota.attempts().await;
    assert_eq!(
        a[1],
        row("primary", "anthropic/claude", Some("anthropic:main"), "failure", Some("rate_limit"), Some(429))
    );
    assert_eq!(a[2], row("fallback", "claude2/claude", Some("claude2:main"), "success", None, Some(200)));
}

#[tokio::test]
async fn a_refused_thinking_signature_is_retried_once_without_thinking() {
    let (mock, base) = Mock::started().await;
    let cfg = config(&base);
    let rota = spawn(Scenario { config: &cfg, keys: &[ANTHROPIC_KEY, OTHER_KEY], ..Scenario::default() }).await;
    // What Anthropic answers to a block it did not sign (recorded).
    let refused = r#"{"type":"error","error":{"type":"invalid_request_error","message":"messages.1.content.0: Invalid `signature` in `thinking` block"},"request_id":"req_011CVx"}"#;
    mock.script(ANTHROPIC_KEY.1, vec![Reply::Status(400, vec![], refused.into())]);
    // A signature rota never relayed: only the upstream can tell.
    let r = rota.messages(second_turn("sig-from-elsewhere")).await;
    assert_eq!(r.status(), 200, "{:?}", r.text().await);
    assert_eq!(r.headers()["x-rota-provider"], "anthropic");
    assert_eq!(r.headers()["x-rota-dropped"], "thinking blocks");
    let bodies = mock.bodies();
    assert_eq!(bodies.len(), 2, "one retry, on the same profile");
    assert_eq!((thinking_blocks(&bodies[0]), thinking_blocks(&bodies[1])), (1, 0));
    assert_eq!(bodies[1].get("thinking"), None);
    let a = rota.attempts().await;
    assert_eq!(
        a,
        [
            row("primary", "anthropic/claude", Some("anthropic:main"), "failure", Some("format"), Some(400)),
            row("retry", "anthropic/claude", Some("anthropic:main"), "success", None, Some(200)),
        ]
    );
    let error: String =
        sqlx::query_scalar("SELECT error FROM attempts WHERE seq = 1").fetch_one(rota.pool()).await.unwrap();
    assert!(error.ends_with("(thinking blocks taken out; trying again)"), "{error}");
    assert_eq!(rota.scalar("SELECT COUNT(*) FROM profile_cooldowns").await, Some(0), "no cooldown");
    assert_eq!(
        rota.scalar("SELECT COALESCE(SUM(error_count), 0) FROM usage_stats").await,
        Some(0),
        "no failure counted"
    );

    // Refused again, without thinking: no second retry, the upstream's answer goes back.
    mock.script(
        ANTHROPIC_KEY.1,
        vec![Reply::Status(400, vec![], refused.into()), Reply::Status(400, vec![], refused.into())],
    );
    let r = rota.messages(second_turn("sig-again")).await;
    assert_eq!(r.status(), 400);
    assert_eq!(mock.bodies().len(), 4, "tried twice: with, then without thinking");
}

#[tokio::test]
async fn a_signature_that_came_streamed_a_few_bytes_at_a_time_is_noted_too() {
    let (mock, base) = Mock::started().await;
    let cfg = config(&base);
    let rota = spawn(Scenario { config: &cfg, keys: &[ANTHROPIC_KEY, OTHER_KEY], ..Scenario::default() }).await;
    // A recorded Anthropic stream whose thinking block is signed by a `signature_delta`.
    let recorded = support::recorded("anthropic-thinking");
    let sig = "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds";
    assert!(recorded.contains(sig));
    mock.script(ANTHROPIC_KEY.1, vec![Reply::Raw(recorded, Writes::Bytes(5))]);
    let first = json!({"model": "anthropic/claude", "max_tokens": 2048, "stream": true,
        "messages": [{"role": "user", "content": "27 * 453?"}]});
    let text = rota.messages(first).await.text().await.unwrap();
    assert!(text.ends_with("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"), "{text}");
    mock.script(ANTHROPIC_KEY.1, vec![Reply::Status(429, vec![("retry-after", "30".into())], "{}".into())]);
    let r = rota.messages(second_turn(sig)).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-rota-provider"], "claude2");
    assert_eq!(r.headers()["x-rota-dropped"], "thinking blocks signed elsewhere");
    let bodies = mock.bodies();
    assert_eq!((thinking_blocks(&bodies[1]), thinking_blocks(&bodies[2])), (1, 0));
}
