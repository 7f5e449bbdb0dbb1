//! Rotate before the 429 (docs/rotation.md, "Quota"): the remaining-quota headers of each answer
//! order a profile at its floor after the ones that still have quota, until the provider's reset,
//! without a failed attempt, a cooldown or a counted failure.

use crate::support::*;
use rota::engine::Clock;
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;

/// A 200 answer in the wire format, with the provider's rate-limit headers.
fn counted(anthropic: bool, headers: Vec<(&'static str, String)>) -> Reply {
    let body = if anthropic {
        json!({"id": "msg_q", "type": "message", "role": "assistant", "model": "claude-q",
               "content": [{"type": "text", "text": "served"}], "stop_reason": "end_turn",
               "usage": {"input_tokens": 5, "output_tokens": 2}})
    } else {
        json!({"id": "chatcmpl-q", "object": "chat.completion", "model": "gpt-4.1",
               "choices": [{"index": 0, "message": {"role": "assistant", "content": "served"}, "finish_reason": "stop"}],
               "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}})
    };
    let mut headers = headers;
    headers.push(("content-type", "application/json".into()));
    Reply::Status(200, headers, body.to_string())
}

/// Which profile served each request, and every attempt's outcome.
async fn served(rota: &Rota, anthropic: bool) -> String {
    let r = if anthropic {
        rota.messages(
            json!({"model": "anthropic/claude-q", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}),
        )
        .await
    } else {
        rota.chat(chat(), &[]).await
    };
    assert_eq!(r.status(), 200);
    let profile = r.headers()["x-rota-profile"].to_str().unwrap().to_string();
    assert_eq!(r.headers()["x-rota-attempts"], "1", "served at the first attempt");
    profile
}

/// The scenario of the issue: A's answers count its remaining requests down from 3 (2, 1, 0),
/// with the reset 60 s ahead; after A's third answer the next request goes to B, with no failed
/// attempt on A; once the reset has passed (the clock moved on), A serves again.
async fn rotates_before_the_429(anthropic: bool) {
    let (mock, base) = Mock::started().await;
    let clock = Arc::new(Skewed::default());
    let (provider, keys): (&str, &[(&str, &str)]) = if anthropic {
        ("anthropic", &[("anthropic:a", "sk-ant-quota-a"), ("anthropic:b", "sk-ant-quota-b")])
    } else {
        ("openai", &KEYS[..2])
    };
    let (a, b) = (keys[0].0, keys[1].0);
    let cfg = format!("{}{}[auth.order]\n{provider} = [\"{a}\", \"{b}\"]\n", config(&base), anthropic_provider(&base));
    let rota = spawn(Scenario { config: &cfg, keys, clock: Some(clock.clone()), ..Scenario::default() }).await;

    let reset_at = clock.now() + 60_000;
    let answers = (0..3)
        .map(|i| {
            let left = (2 - i).to_string();
            let headers = if anthropic {
                let reset = chrono::DateTime::from_timestamp_millis(reset_at).unwrap().to_rfc3339();
                vec![
                    ("anthropic-ratelimit-requests-limit", "3".to_string()),
                    ("anthropic-ratelimit-requests-remaining", left),
                    ("anthropic-ratelimit-requests-reset", reset),
                    ("anthropic-ratelimit-tokens-remaining", "90000".to_string()),
                ]
            } else {
                vec![
                    ("x-ratelimit-limit-requests", "3".to_string()),
                    ("x-ratelimit-remaining-requests", left),
                    ("x-ratelimit-reset-requests", "60s".to_string()),
                    ("x-ratelimit-remaining-tokens", "90000".to_string()),
                    ("x-ratelimit-reset-tokens", "1s".to_string()),
                ]
            };
            counted(anthropic, headers)
        })
        .collect();
    mock.script(keys[0].1, answers);

    for i in 0..3 {
        assert_eq!(served(&rota, anthropic).await, a, "request {i}: the explicit order's first profile");
    }
    assert_eq!(served(&rota, anthropic).await, b, "A reported 0 requests left: B serves, before any 429");
    assert_eq!(served(&rota, anthropic).await, b, "and keeps serving until A's window resets");

    rota.flush().await;
    let failures: i64 = sqlx::query_scalar("SELECT count(*) FROM attempts WHERE outcome <> 'success'")
        .fetch_one(rota.pool())
        .await
        .unwrap();
    assert_eq!(failures, 0, "no failed attempt on A");
    let (errors, cooldowns): (i64, i64) = sqlx::query_as(
        "SELECT s.error_count, (SELECT count(*) FROM profile_cooldowns c WHERE c.profile_id = s.profile_id)
         FROM usage_stats s WHERE profile_id = $1",
    )
    .bind(a)
    .fetch_one(rota.pool())
    .await
    .unwrap();
    assert_eq!((errors, cooldowns), (0, 0), "out of quota is no failure and no window");
    let (remaining, limit, reset, seen): (i64, i64, i64, i64) = sqlx::query_as(
        "SELECT quota_remaining_requests, quota_limit_requests, quota_reset_at, quota_seen_at
         FROM profile_quota WHERE profile_id = $1 AND model = $2",
    )
    .bind(a)
    .bind(if anthropic { "claude-q" } else { "gpt-4.1" })
    .fetch_one(rota.pool())
    .await
    .unwrap();
    assert_eq!((remaining, limit), (0, 3));
    assert!((reset - reset_at).abs() <= 1_000, "reset {reset} is 60 s after the answer ({reset_at})");
    assert!(seen <= clock.now() && seen >= reset_at - 61_000);

    // Another instance on the same database orders from what the database says, and `doctor`
    // tells the operator.
    if !anthropic {
        let out = rota_command()
            .args(["--config", rota.dir.path().join("rota.toml").to_str().unwrap(), "doctor"])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let line = text.lines().find(|l| l.contains("quota gpt-4.1:")).unwrap_or_else(|| panic!("{text}"));
        assert!(
            line.contains("0 of 3 requests left (resets in") && line.contains("after the profiles with quota until"),
            "{line}"
        );
        let json: serde_json::Value = serde_json::from_slice(
            &rota_command()
                .args(["--config", rota.dir.path().join("rota.toml").to_str().unwrap(), "doctor", "--json"])
                .output()
                .unwrap()
                .stdout,
        )
        .unwrap();
        let profiles = &json["agents"][0]["chain"][0]["profiles"];
        assert_eq!(profiles[0]["id"], b, "doctor's order puts A last: {profiles}");
        assert_eq!(profiles[1]["quota"]["remaining_requests"], 0, "{profiles}");

        let second = rota.another().await;
        assert_eq!(served(&second, false).await, b, "the second instance knows A is out of quota");
    }

    clock.advance(Duration::from_secs(61));
    assert_eq!(served(&rota, anthropic).await, a, "after the reset, A is first again");
    let seen: Vec<String> = mock.keys();
    assert_eq!(seen.iter().filter(|k| *k == keys[0].1).count(), 4, "A was called 3 times, then once after the reset");
}

#[tokio::test]
async fn openai_remaining_requests_rotate_before_the_429_and_back_after_the_reset() {
    rotates_before_the_429(false).await;
}

#[tokio::test]
async fn anthropic_remaining_requests_rotate_before_the_429_and_back_after_the_reset() {
    rotates_before_the_429(true).await;
}

/// Round robin (no explicit order): a profile out of quota is skipped by the rotation index
/// too, and a token floor (`rotation.quota_tokens_floor`) counts as well as requests.
#[tokio::test]
async fn round_robin_passes_over_a_profile_below_its_token_floor() {
    let (mock, base) = Mock::started().await;
    let cfg = format!("{}[rotation]\nquota_tokens_floor = 4000\n", config(&base));
    let rota = spawn(Scenario { config: &cfg, keys: &KEYS[..3], ..Scenario::default() }).await;
    let low = vec![
        ("x-ratelimit-remaining-requests", "500".to_string()),
        ("x-ratelimit-remaining-tokens", "3000".to_string()),
        ("x-ratelimit-reset-tokens", "2m".to_string()),
    ];
    mock.script(KEYS[0].1, vec![counted(false, low)]);
    let first = served(&rota, false).await;
    assert_eq!(first, KEYS[0].0, "never used: first");
    let next: Vec<String> = futures_util::future::join_all((0..4).map(|_| served(&rota, false))).await;
    assert!(next.iter().all(|p| p != KEYS[0].0), "k1 has 3000 tokens left, under the 4000 floor: {next:?}");

    let (status, k1) = rota.api("GET", "/api/v1/profiles/openai:k1", Some(&rota.admin_key), None).await;
    assert_eq!(status, 200);
    let quota = &k1["quota"][0];
    assert_eq!((quota["model"].as_str(), quota["remaining_tokens"].as_i64()), (Some("gpt-4.1"), Some(3000)), "{k1}");
    assert_eq!(quota["remaining_requests"], 500);
    assert!(quota["low_until"].as_i64().is_some_and(|t| t > quota["seen_at"].as_i64().unwrap()), "{k1}");
    assert_eq!(k1["status"]["state"], "usable", "out of quota is not a state of its own: {k1}");
}

/// A streamed answer's headers count as a buffered one's: they arrive before the first event.
#[tokio::test]
async fn a_streamed_answer_reports_quota_too() {
    let (mock, base) = Mock::started().await;
    let cfg = format!("{}[auth.order]\nopenai = [\"openai:k1\", \"openai:k2\"]\n", config(&base));
    let rota = spawn(Scenario { config: &cfg, keys: &KEYS[..2], ..Scenario::default() }).await;
    let spent =
        vec![("x-ratelimit-remaining-requests", "0".to_string()), ("x-ratelimit-reset-requests", "5m".to_string())];
    mock.script(KEYS[0].1, vec![Reply::Headed(spent, Box::new(Reply::Stream(3)))]);
    let mut body = chat();
    body["stream"] = json!(true);
    let r = rota.chat(body, &[]).await;
    assert_eq!(r.headers()["x-rota-profile"], KEYS[0].0);
    assert!(r.text().await.unwrap().contains("[DONE]"), "the stream is whole");
    assert_eq!(served(&rota, false).await, KEYS[1].0, "k1 said it has no request left");
}

/// A lease report's headers are the agent's claim: they order the profile last too, but for no
/// longer than `cooldown.max` (1 h), whatever reset they name.
#[tokio::test]
async fn a_lease_report_claims_quota_for_no_longer_than_the_cooldown_max() {
    let (_mock, base) = Mock::started().await;
    let cfg = format!("{}[auth.order]\nopenai = [\"openai:k1\", \"openai:k2\"]\n", config(&base));
    let rota = spawn(Scenario { config: &cfg, keys: &KEYS[..2], ..Scenario::default() }).await;
    let (_, lease) = rota.api("POST", "/api/v1/leases", Some(&rota.agent_key), Some(json!({}))).await;
    assert_eq!(lease["profile_id"], KEYS[0].0);
    let report = json!({"outcome": "success", "http_status": 200,
        "headers": {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "9999h"}});
    let path = format!("/api/v1/leases/{}/report", lease["lease_id"].as_str().unwrap());
    let (code, _) = rota.api("POST", &path, Some(&rota.agent_key), Some(report)).await;
    assert_eq!(code, 200);
    let (_, next) = rota.api("POST", "/api/v1/leases", Some(&rota.agent_key), Some(json!({}))).await;
    assert_eq!(next["profile_id"], KEYS[1].0, "k1 was reported out of requests");
    rota.flush().await;
    let (reset, seen): (i64, i64) =
        sqlx::query_as("SELECT quota_reset_at, quota_seen_at FROM profile_quota WHERE profile_id = 'openai:k1'")
            .fetch_one(rota.pool())
            .await
            .unwrap();
    assert_eq!(reset - seen, 3_600_000, "a claim's reset is held to cooldown.max");
}
