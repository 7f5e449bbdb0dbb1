//! Hostile input against the running gateway: text a client controls, echoed back by an
//! upstream, must not put a healthy account out of service (SPEC §3 "Evidence", §4).

mod support;

use serde_json::json;
use support::{Mock, Reply, Rota};

const NOT_FOUND: &str = r#"{"error":{"message":"The model `{model}` does not exist or you do not have access to it.","type":"invalid_request_error","param":null,"code":"model_not_found"}}"#;

#[tokio::test]
async fn echoed_model_names_leave_every_profile_in_service() {
    let mock = Mock::default();
    let base = mock.start().await;
    let config = format!(
        "[providers.openai]\napi = \"openai\"\nbase_url = \"{base}/v1\"\n[models]\nprimary = \"openai/gpt-4.1\"\n"
    );
    let keys = [("openai:k1", "sk-test-key-one-0001"), ("openai:k2", "sk-test-key-two-0002")];
    let rota = Rota::start(&config, &keys).await;
    for name in ["billing", "insufficient_quota", "credit balance is too low", "revoked", "unauthorized"] {
        for (_, key) in keys {
            mock.script(key, vec![Reply::Echo(404, NOT_FOUND)]);
        }
        let r = rota
            .chat(json!({"model": format!("openai/{name}"), "messages": [{"role": "user", "content": "hi"}]}), &[])
            .await;
        assert_eq!(r.status(), 404, "model {name}");
        let text = r.text().await.unwrap();
        assert!(text.contains("does not exist"), "the upstream's own answer: {text}");
    }
    rota.flush().await;
    let reasons: Vec<(String, Option<String>)> =
        sqlx::query_as("SELECT model, reason FROM attempts ORDER BY started_at, seq")
            .fetch_all(rota.store.pool())
            .await
            .unwrap();
    assert_eq!(reasons.len(), 5, "one call per request: a missing model is not the profile's fault: {reasons:?}");
    assert!(reasons.iter().all(|(_, r)| r.as_deref() == Some("model_not_found")), "{reasons:?}");
    let out_of_service: Vec<String> = sqlx::query_scalar(
        "SELECT profile_id FROM usage_stats
         WHERE disabled_until IS NOT NULL OR disabled_reason IS NOT NULL OR (cooldown_until IS NOT NULL AND cooldown_model IS NULL)",
    )
    .fetch_all(rota.store.pool())
    .await
    .unwrap();
    assert!(out_of_service.is_empty(), "no disabled lane, no profile-wide cooldown: {out_of_service:?}");
    // The real model is still served, at the first call.
    mock.unscript();
    let r = rota.chat(json!({"model": "openai/gpt-4.1", "messages": [{"role": "user", "content": "hi"}]}), &[]).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-rota-attempts"], "1");
}
