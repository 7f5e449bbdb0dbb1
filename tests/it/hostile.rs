//! Hostile input against the running gateway: text a client controls, echoed back by an
//! upstream, must not put a healthy account out of service (SPEC §3 "Evidence", §4).

use crate::support::{self, KEYS, Mock, Reply, Rota, Scenario, chat, spawn};
use serde_json::json;

const NOT_FOUND: &str = r#"{"error":{"message":"The model `{model}` does not exist or you do not have access to it.","type":"invalid_request_error","param":null,"code":"model_not_found"}}"#;

#[tokio::test]
async fn echoed_model_names_leave_every_profile_in_service() {
    let (mock, base) = Mock::started().await;
    let config = support::config(&base);
    let keys = [KEYS[0], KEYS[1]];
    let rota = spawn(Scenario { config: &config, keys: &keys, ..Scenario::default() }).await;
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
            .fetch_all(rota.pool())
            .await
            .unwrap();
    assert_eq!(reasons.len(), 5, "one call per request: a missing model is not the profile's fault: {reasons:?}");
    assert!(reasons.iter().all(|(_, r)| r.as_deref() == Some("model_not_found")), "{reasons:?}");
    let out_of_service: Vec<String> = sqlx::query_scalar(
        "SELECT profile_id FROM usage_stats
         WHERE disabled_until IS NOT NULL OR disabled_reason IS NOT NULL OR (cooldown_until IS NOT NULL AND cooldown_model IS NULL)",
    )
    .fetch_all(rota.pool())
    .await
    .unwrap();
    assert!(out_of_service.is_empty(), "no disabled lane, no profile-wide cooldown: {out_of_service:?}");
    // The real model is still served, at the first call.
    mock.unscript();
    let r = rota.chat(chat(), &[]).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-rota-attempts"], "1");
}

// -- lease reports are claims -------------------------------------------------------------------

const REVOKED: &str = r#"{"error":{"message":"This API key has been revoked.","type":"invalid_request_error"}}"#;
const HOUR_MS: i64 = 3_600_000;

fn lease_config(base: &str, extra: &str) -> String {
    format!("{}{extra}", support::config(base))
}

async fn lease(rota: &Rota, key: &str) -> (u16, serde_json::Value) {
    rota.api("POST", "/api/v1/leases", Some(key), Some(json!({"model": "openai/gpt-4.1"}))).await
}

async fn report(
    rota: &Rota,
    key: &str,
    lease: &serde_json::Value,
    body: serde_json::Value,
) -> (u16, serde_json::Value) {
    let path = format!("/api/v1/leases/{}/report", lease["lease_id"].as_str().unwrap());
    rota.api("POST", &path, Some(key), Some(body)).await
}

fn revoked() -> serde_json::Value {
    json!({"outcome": "failure", "http_status": 401, "error": REVOKED})
}

/// Reports every lease of the walk as revoked, until the walk is exhausted.
async fn claim_all_revoked(rota: &Rota) -> usize {
    let (code, mut l) = lease(rota, &rota.agent_key).await;
    assert_eq!(code, 201, "{l}");
    let mut reports = 0;
    loop {
        let (code, answer) = report(rota, &rota.agent_key, &l, revoked()).await;
        reports += 1;
        match answer.get("next").filter(|n| !n.is_null()) {
            Some(next) if code == 200 => l = next.clone(),
            _ => return reports,
        }
    }
}

/// `(profile, disabled_until, disabled_reason, cooldown_until)` of every profile.
async fn lanes(rota: &Rota) -> Vec<(String, Option<i64>, Option<String>, Option<i64>)> {
    rota.flush().await;
    sqlx::query_as(
        "SELECT profile_id, disabled_until, disabled_reason, cooldown_until FROM usage_stats ORDER BY profile_id",
    )
    .fetch_all(rota.pool())
    .await
    .unwrap()
}

#[tokio::test]
async fn an_agents_revocation_claims_cool_the_profiles_but_disable_none_when_rotas_own_call_succeeds() {
    let (mock, base) = Mock::started().await;
    let rota = spawn(Scenario { config: &lease_config(&base, ""), keys: &KEYS[..2], ..Scenario::default() }).await;
    let before = chrono::Utc::now().timestamp_millis();
    assert_eq!(claim_all_revoked(&rota).await, 2, "one report per profile, then the walk ends");
    let lanes = lanes(&rota).await;
    assert_eq!(lanes.len(), 2);
    for (profile, disabled_until, disabled_reason, cooldown_until) in &lanes {
        assert_eq!((disabled_until, disabled_reason), (&None, &None), "{profile}: not disabled");
        let until = cooldown_until.expect("a cooldown on the ladder");
        assert!(until <= before + HOUR_MS + 5_000, "{profile}: away no longer than cooldown.max");
    }
    // rota checked each claim with its own call, and the provider said 200.
    let confirms: Vec<String> = mock.seen().into_iter().filter(|s| s.path == "/v1/models").map(|s| s.key).collect();
    assert_eq!(confirms, [KEYS[0].1, KEYS[1].1]);
    let error: String =
        sqlx::query_scalar("SELECT error FROM attempts ORDER BY seq LIMIT 1").fetch_one(rota.pool()).await.unwrap();
    assert!(error.contains("an agent's claim; rota's own call said HTTP 200"), "{error}");
}

#[tokio::test]
async fn a_revocation_claim_that_rotas_own_call_confirms_disables_the_profile() {
    let (mock, base) = Mock::started().await;
    let rota = spawn(Scenario { config: &lease_config(&base, ""), keys: &KEYS[..2], ..Scenario::default() }).await;
    // The provider answers rota's own call with that key: 401.
    mock.script(KEYS[0].1, vec![Reply::Status(401, vec![], REVOKED.into())]);
    let (_, l) = lease(&rota, &rota.agent_key).await;
    assert_eq!(l["profile_id"], "openai:k1");
    let (code, answer) = report(&rota, &rota.agent_key, &l, revoked()).await;
    assert_eq!((code, answer["recorded"]["reason"].as_str()), (200, Some("auth_permanent")), "{answer}");
    let lanes = lanes(&rota).await;
    assert_eq!(lanes[0].0, "openai:k1");
    assert_eq!((lanes[0].1, lanes[0].2.as_deref()), (None, Some("auth_permanent")), "disabled until cleared");
}

#[tokio::test]
async fn a_trusted_agents_report_is_evidence_and_disables_without_a_confirming_call() {
    let (mock, base) = Mock::started().await;
    let rota = spawn(Scenario {
        config: &lease_config(&base, "[agents.tester]\ntrusted = true\n"),
        keys: &KEYS[..2],
        ..Scenario::default()
    })
    .await;
    let (_, l) = lease(&rota, &rota.agent_key).await;
    let (code, _) = report(&rota, &rota.agent_key, &l, revoked()).await;
    assert_eq!(code, 200);
    let lanes = lanes(&rota).await;
    assert_eq!((lanes[0].1, lanes[0].2.as_deref()), (None, Some("auth_permanent")));
    assert!(mock.seen().is_empty(), "no confirming call: {:?}", mock.seen());
}

#[tokio::test]
async fn one_agent_at_its_lease_cap_gets_429_and_another_still_leases() {
    let (_mock, base) = Mock::started().await;
    let rota = spawn(Scenario {
        config: &lease_config(&base, "[leases]\nmax_live_per_agent = 2\n"),
        keys: &KEYS[..2],
        ..Scenario::default()
    })
    .await;
    let (_, first) = lease(&rota, &rota.agent_key).await;
    assert_eq!(lease(&rota, &rota.agent_key).await.0, 201);
    let (code, v) = lease(&rota, &rota.agent_key).await;
    assert_eq!((code, v["error"]["type"].as_str()), (429, Some("too_many_leases")), "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("leases.max_live_per_agent = 2"), "{v}");
    assert_eq!(lease(&rota, &rota.admin_key).await.0, 201, "another agent is not held back");
    // A report frees a place.
    assert_eq!(report(&rota, &rota.agent_key, &first, json!({"outcome": "success"})).await.0, 200);
    assert_eq!(lease(&rota, &rota.agent_key).await.0, 201);
}

#[tokio::test]
async fn failure_reports_past_the_agents_rate_get_429_and_the_lease_stays_valid() {
    let (_mock, base) = Mock::started().await;
    let rota = spawn(Scenario {
        config: &lease_config(&base, "[leases]\nfailure_reports_per_minute = 1\n"),
        keys: &KEYS[..2],
        ..Scenario::default()
    })
    .await;
    let throttled =
        json!({"outcome": "failure", "http_status": 429, "error": "{\"error\":{\"message\":\"Rate limit reached\"}}"});
    let (_, l) = lease(&rota, &rota.agent_key).await;
    let (code, answer) = report(&rota, &rota.agent_key, &l, throttled.clone()).await;
    assert_eq!(code, 200, "{answer}");
    let next = answer["next"].clone();
    let (code, v) = report(&rota, &rota.agent_key, &next, throttled).await;
    assert_eq!((code, v["error"]["type"].as_str()), (429, Some("too_many_failure_reports")), "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("leases.failure_reports_per_minute"), "{v}");
    assert_eq!(
        report(&rota, &rota.agent_key, &next, json!({"outcome": "success"})).await.0,
        200,
        "the lease is still valid"
    );
}
