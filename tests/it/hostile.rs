//! Hostile input against the running gateway: text a client controls, echoed back by an
//! upstream, must not put a healthy account out of service (docs/rotation.md "Evidence"), and
//! every number and name from outside is bounded at the door (docs/gateway.md "Bounds at the
//! door"). Black-box: the real `rota serve` binary, the mock upstream and the database file.

use crate::support::{self, KEYS, Mock, Reply, Rota, Scenario, chat};
use serde_json::json;

/// The real binary, as the scenario says.
async fn spawn(scenario: Scenario<'_>) -> Rota {
    support::spawn(Scenario { binary: true, ..scenario }).await
}

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
    let config = lease_config(&base, "[leases]\nclaim_share = 1.0\n");
    let rota = spawn(Scenario { config: &config, keys: &KEYS[..2], ..Scenario::default() }).await;
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

// -- client text chooses no reason, 5xx fail over, names and numbers bounded at the door -------

/// OpenAI's answer to a body field it does not know: it names the field.
const UNKNOWN_FIELD: &str = r#"{"error":{"message":"Unrecognized request argument supplied: {extra}","type":"invalid_request_error","param":null,"code":null}}"#;

/// Profiles with a window or a disabled lane, and every `profile_cooldowns` row.
async fn out_of_service(rota: &Rota) -> (Vec<String>, i64) {
    rota.flush().await;
    let lanes: Vec<String> = sqlx::query_scalar(
        "SELECT profile_id FROM usage_stats WHERE disabled_until IS NOT NULL OR disabled_reason IS NOT NULL
           OR cooldown_until IS NOT NULL",
    )
    .fetch_all(rota.pool())
    .await
    .unwrap();
    (lanes, rota.scalar("SELECT count(*) FROM profile_cooldowns").await.unwrap())
}

/// Finding: one request with an extra field named `rate limit, try again in 6h`, echoed in the
/// upstream's 400, put every profile in the disabled lane for 6 h; a field named `rate_limit`
/// sent three times left every profile cooling. Now: the client's 400, one call, no mark.
#[tokio::test]
async fn a_field_named_like_a_throttle_and_echoed_in_a_400_marks_no_profile() {
    let (mock, base) = Mock::started().await;
    let rota = spawn(Scenario { config: &support::config(&base), keys: &KEYS[..3], ..Scenario::default() }).await;
    for field in ["rate limit, try again in 6h", "rate_limit", "rate_limit", "rate_limit"] {
        for (_, key) in &KEYS[..3] {
            mock.script(key, vec![Reply::Echo(400, UNKNOWN_FIELD)]);
        }
        let mut body = chat();
        body[field] = json!(true);
        let r = rota.chat(body, &[]).await;
        assert_eq!(r.status(), 400, "{field}");
        assert_eq!(r.headers()["x-rota-attempts"], "1", "{field}: the request's own fault, no rotation");
        mock.unscript();
    }
    assert_eq!(out_of_service(&rota).await, (vec![], 0), "no profile cooled or disabled");
    let reasons: Vec<String> = sqlx::query_scalar("SELECT reason FROM attempts").fetch_all(rota.pool()).await.unwrap();
    assert_eq!(reasons, ["format"; 4]);
    assert_eq!(rota.chat(chat(), &[]).await.headers()["x-rota-attempts"], "1", "served at the first call");
}

/// Finding: a 400 saying "capacity" or "overloaded" was retried as `overloaded`; a 400
/// "tool_call_id … does not exist" cooled the model as `model_not_found`. Both are the
/// request's fault: one call, no mark, no model cooldown.
#[tokio::test]
async fn a_400_saying_capacity_or_a_missing_tool_call_is_the_requests_fault() {
    let (mock, base) = Mock::started().await;
    let rota = spawn(Scenario { config: &support::config(&base), keys: &KEYS[..2], ..Scenario::default() }).await;
    let bodies = [
        r#"{"error":{"message":"Invalid value: the model is overloaded at this capacity setting","type":"invalid_request_error"}}"#,
        r#"{"error":{"message":"Invalid parameter: tool_call_id call_x does not exist","type":"invalid_request_error","param":"messages.[2].tool_call_id"}}"#,
    ];
    for body in bodies {
        for (_, key) in &KEYS[..2] {
            mock.script(key, vec![Reply::Status(400, vec![], body.into())]);
        }
        let r = rota.chat(chat(), &[]).await;
        assert_eq!((r.status().as_u16(), r.headers()["x-rota-attempts"].to_str().unwrap()), (400, "1"), "{body}");
        mock.unscript();
    }
    assert_eq!(out_of_service(&rota).await, (vec![], 0));
    assert_eq!(rota.scalar("SELECT count(*) FROM model_cooldowns").await, Some(0), "no model cooled");
    let reasons: Vec<String> = sqlx::query_scalar("SELECT reason FROM attempts").fetch_all(rota.pool()).await.unwrap();
    assert_eq!(reasons, ["format", "format"]);
}

/// Finding: a 502 "Received malformed response from upstream" and a 500 typed
/// `invalid_request_error` were `format`: one call, the 5xx to the client. A 5xx always fails
/// over.
#[tokio::test]
async fn every_5xx_fails_over_whatever_it_says() {
    let (mock, base) = Mock::started().await;
    let rota = spawn(Scenario { config: &support::config(&base), keys: &KEYS[..2], ..Scenario::default() }).await;
    let answers = [
        (502, r#"{"error":{"message":"Received malformed response from upstream","type":"server_error"}}"#),
        (500, r#"{"error":{"message":"The request was malformed","type":"invalid_request_error"}}"#),
    ];
    for (status, body) in answers {
        mock.script(KEYS[0].1, vec![Reply::Status(status, vec![], body.into()); 2]);
        let r = rota.chat(chat(), &[("x-rota-session", &format!("s{status}"))]).await;
        assert_eq!(r.status(), 200, "{status}: {body}");
        assert_eq!(r.headers()["x-rota-profile"], "openai:k2", "{status}: served by the next profile");
        mock.unscript();
        rota.api("POST", "/api/v1/profiles/openai:k1/clear", Some(&rota.admin_key), None).await;
    }
}

/// Findings: model names were unbounded (20 requests with 4 MiB names: +355 MB RSS, an 84 MB
/// `/metrics`, +650 MB of database), and each invented name became a label, a model cooldown and
/// a quota row. Now: a name past 256 bytes is refused before anything is kept but a bounded
/// prefix; an invented name that the upstream does not know leaves no label, no model cooldown,
/// no quota row.
#[tokio::test]
async fn model_names_are_bounded_and_invented_ones_leave_nothing_behind() {
    let (mock, base) = Mock::started().await;
    let rota = spawn(Scenario { config: &support::config(&base), keys: &KEYS[..1], ..Scenario::default() }).await;
    let long = format!("openai/{}", "x".repeat(4 << 20));
    let r = rota.chat(json!({"model": long, "messages": [{"role": "user", "content": "hi"}]}), &[]).await;
    assert_eq!(r.status(), 400);
    let text = r.text().await.unwrap();
    assert!(text.contains("the model name is longer than 256 bytes"), "{text}");
    assert!(text.len() < 1024, "the answer does not repeat the name: {} bytes", text.len());
    assert!(mock.seen().is_empty(), "no upstream call");
    let kept = rota.scalar("SELECT max(length(requested_model)) FROM requests").await;
    assert_eq!(kept, Some(256), "the refused request keeps a 256-byte prefix");

    let limited = ("x-ratelimit-remaining-requests", "0".to_string());
    for i in 0..50 {
        mock.script(KEYS[0].1, vec![Reply::Headed(vec![limited.clone()], Box::new(Reply::Echo(404, NOT_FOUND)))]);
        let r = rota
            .chat(
                json!({"model": format!("openai/invented-{i}"), "messages": [{"role": "user", "content": "hi"}]}),
                &[],
            )
            .await;
        assert_eq!(r.status(), 404);
    }
    let metrics = Rota::client().get(format!("{}/metrics", rota.url)).send().await.unwrap().text().await.unwrap();
    assert!(!metrics.contains("invented"), "an invented name is no label");
    assert!(metrics.contains(r#"model="other""#), "its attempts count as `other`");
    assert_eq!(rota.scalar("SELECT count(*) FROM model_cooldowns").await, Some(0), "no model cooldown");
    assert_eq!(rota.scalar("SELECT count(*) FROM profile_quota").await, Some(0), "no quota from a 404");
}

/// Finding: `x-rota-fallbacks` was unbounded: one request of an agent limited to one request a
/// minute made 1,001 upstream calls. Now: more than 16 is refused before any call.
#[tokio::test]
async fn a_fallback_list_past_16_is_refused_before_any_call() {
    let (mock, base) = Mock::started().await;
    let config = format!("{}[agents.tester]\nrequests_per_minute = 1\n", support::config(&base));
    let rota = spawn(Scenario { config: &config, keys: &KEYS[..1], ..Scenario::default() }).await;
    let list: Vec<String> = (0..1001).map(|i| format!("openai/m{i}")).collect();
    let r = rota.chat(chat(), &[("x-rota-fallbacks", &list.join(","))]).await;
    assert_eq!(r.status(), 400);
    assert!(r.text().await.unwrap().contains("1001 fallbacks given: at most 16"));
    assert!(mock.seen().is_empty(), "no upstream call");
}

/// Finding: 16 fallbacks that all answered 429 made 85 upstream calls for one request. Now
/// `limits.max_attempts` bounds the calls, across retries, rotations and fallbacks, and the
/// answer names it.
#[tokio::test]
async fn one_request_makes_at_most_max_attempts_upstream_calls() {
    let (mock, base) = Mock::started().await;
    let config = support::config(&base).replace("[models]", "[limits]\nmax_attempts = 2\n[models]");
    let rota = spawn(Scenario { config: &config, keys: &KEYS[..3], ..Scenario::default() }).await;
    let limited = Reply::Status(429, vec![], r#"{"error":{"message":"Rate limit reached"}}"#.into());
    for (_, key) in &KEYS[..3] {
        mock.script(key, vec![limited.clone(); 20]);
    }
    let list: Vec<String> = (0..16).map(|i| format!("openai/m{i}")).collect();
    let r = rota.chat(chat(), &[("x-rota-fallbacks", &list.join(","))]).await;
    assert_eq!(r.status(), 429);
    let text = r.text().await.unwrap();
    assert!(text.contains("stopped after 2 upstream calls (limits.max_attempts = 2)"), "{text}");
    assert_eq!(mock.seen().len(), 2, "two calls, not three profiles' and sixteen fallbacks'");
}

/// Finding: a body was parsed whole before any limit (three 32 MiB bodies of an agent already
/// over its limit: ~2 GB RSS, though all three were answered 429). Now the limit comes first:
/// an agent over it is refused whatever its body, even one that is not JSON.
#[tokio::test]
async fn an_agent_over_its_limit_is_refused_before_its_body_is_read() {
    let (_mock, base) = Mock::started().await;
    let config = format!("{}[agents.tester]\nrequests_per_minute = 1\n", support::config(&base));
    let rota = spawn(Scenario { config: &config, keys: &KEYS[..1], ..Scenario::default() }).await;
    assert_eq!(rota.chat(chat(), &[]).await.status(), 200);
    let r = Rota::client()
        .post(format!("{}/v1/chat/completions", rota.url))
        .bearer_auth(&rota.agent_key)
        .body("this is not JSON")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429, "the limit, not the body");
    assert!(r.headers().contains_key("retry-after"));
}

/// A session id is client text of any length (the OpenAI `user` field may be megabytes): a long
/// one is kept as its digest, and sticks as a short one does.
#[tokio::test]
async fn a_long_session_id_sticks_like_a_short_one() {
    let (mock, base) = Mock::started().await;
    let rota = spawn(Scenario { config: &support::config(&base), keys: &KEYS[..3], ..Scenario::default() }).await;
    let (a, b) = ("a".repeat(1 << 20), "b".repeat(1 << 20));
    for user in [&a, &a, &b, &a] {
        let mut body = chat();
        body["user"] = json!(user);
        assert_eq!(rota.chat(body, &[]).await.status(), 200);
    }
    let k = mock.keys();
    assert_eq!((k[0] == k[1], k[1] == k[3]), (true, true), "one session, one key: {k:?}");
    assert_ne!(k[0], k[2], "another session, the next key");
}

/// Finding: a lease report's `usage` was not checked: `input_tokens` = i64::MAX then 5 jammed
/// PostgreSQL's audit writer (`bigint out of range`), and a negative count lowered the agent's
/// day. Now each count is 0 to 100,000,000 and the cached tokens are within the prompt.
async fn usage_out_of_range_is_refused(db: support::Db) {
    let (_mock, base) = Mock::started().await;
    let rota = spawn(Scenario { config: &support::config(&base), keys: &KEYS[..1], db, ..Scenario::default() }).await;
    let bad = [
        (json!({"input_tokens": i64::MAX}), "usage.input_tokens must be a count from 0 to 100000000"),
        (json!({"output_tokens": -1_000_000_000}), "usage.output_tokens must be a count from 0 to 100000000"),
        (json!({"input_tokens": 5, "cached_input_tokens": 9}), "are part of usage.input_tokens"),
    ];
    for (usage, said) in bad {
        let (code, l) = lease(&rota, &rota.agent_key).await;
        assert_eq!(code, 201, "{l}");
        let (code, answer) = report(&rota, &rota.agent_key, &l, json!({"outcome": "success", "usage": usage})).await;
        assert_eq!(code, 400, "{usage}: {answer}");
        assert!(answer["error"]["message"].as_str().unwrap().contains(said), "{answer}");
        // The lease is still open: a good report is taken.
        let ok = json!({"outcome": "success", "usage": {"input_tokens": 5, "output_tokens": 2}});
        assert_eq!(report(&rota, &rota.agent_key, &l, ok).await.0, 200);
    }
    rota.flush().await;
    let (_, agents) = rota.api("GET", "/api/v1/agents", Some(&rota.admin_key), None).await;
    let tester = agents.as_array().unwrap().iter().find(|a| a["name"] == "tester").unwrap();
    assert_eq!(tester["usage"]["tokens_today"], 21, "three good reports of 7 tokens: nothing else counted");
}

#[tokio::test]
async fn lease_usage_out_of_range_is_refused_on_sqlite() {
    usage_out_of_range_is_refused(support::Db::Sqlite).await;
}

#[tokio::test]
async fn lease_usage_out_of_range_is_refused_on_postgres() {
    usage_out_of_range_is_refused(support::Db::Postgres(support::postgres_database().await)).await;
}

// -- the lower findings ------------------------------------------------------------------------

/// Finding: a profile left out of an explicit order could still be pinned and leased, though
/// the order's docs say it "is not used". Now a pin on it is a 400 naming the order.
#[tokio::test]
async fn a_profile_an_explicit_order_leaves_out_cannot_be_pinned_or_leased() {
    let (mock, base) = Mock::started().await;
    let config = format!("{}[auth.order]\nopenai = [\"openai:k1\"]\n", support::config(&base));
    let rota = spawn(Scenario { config: &config, keys: &KEYS[..2], ..Scenario::default() }).await;
    let r = rota.chat(chat(), &[("x-rota-profile", "openai:k2")]).await;
    assert_eq!(r.status(), 400);
    let said = "pinned profile `openai:k2` is not in the explicit order of `openai` (openai:k1): it is not used";
    assert!(r.text().await.unwrap().contains(said));
    let body = json!({"model": "openai/gpt-4.1", "profile": "openai:k2"});
    let (code, answer) = rota.api("POST", "/api/v1/leases", Some(&rota.agent_key), Some(body)).await;
    assert_eq!(code, 400, "{answer}");
    assert!(answer["error"]["message"].as_str().unwrap().contains(said), "{answer}");
    assert!(mock.seen().is_empty());
    assert_eq!(rota.chat(chat(), &[("x-rota-profile", "openai:k1")]).await.status(), 200, "a listed one is");
}

/// Finding: a lease refused at the agent's cap had already moved a profile's `last_used`. A
/// refused lease marks nothing.
#[tokio::test]
async fn a_lease_refused_at_the_agents_cap_marks_no_profile() {
    let (_mock, base) = Mock::started().await;
    let config = format!("{}[leases]\nmax_live_per_agent = 1\n", support::config(&base));
    let rota = spawn(Scenario { config: &config, keys: &KEYS[..2], ..Scenario::default() }).await;
    let (code, first) = lease(&rota, &rota.agent_key).await;
    assert_eq!(code, 201, "{first}");
    let (code, refused) = lease(&rota, &rota.agent_key).await;
    assert_eq!(code, 429, "{refused}");
    rota.flush().await;
    let used: Vec<(String, Option<i64>)> =
        sqlx::query_as("SELECT profile_id, last_used FROM usage_stats ORDER BY profile_id")
            .fetch_all(rota.pool())
            .await
            .unwrap();
    let marked: Vec<&str> = used.iter().filter(|(_, at)| at.is_some()).map(|(p, _)| p.as_str()).collect();
    assert_eq!(marked, [first["profile_id"].as_str().unwrap()], "only the issued lease's profile is marked");
}

/// Finding: an exhausted lease walk answered with the upstream's own status, e.g. 401, which
/// an agent reads as its rota key refused. Now rota's own error and a 502.
#[tokio::test]
async fn an_exhausted_lease_walk_is_never_answered_401() {
    let (mock, base) = Mock::started().await;
    let rota = spawn(Scenario { config: &support::config(&base), keys: &KEYS[..1], ..Scenario::default() }).await;
    let (code, l) = lease(&rota, &rota.agent_key).await;
    assert_eq!(code, 201, "{l}");
    // rota's confirming call finds the key refused too.
    mock.script(
        KEYS[0].1,
        vec![Reply::Status(401, vec![], r#"{"error":{"message":"Incorrect API key provided"}}"#.into())],
    );
    let failed = json!({"outcome": "failure", "http_status": 401, "error": "Incorrect API key provided"});
    let (code, answer) = report(&rota, &rota.agent_key, &l, failed).await;
    assert_eq!(code, 502, "{answer}");
    assert_eq!(answer["error"]["type"], "all_models_failed", "{answer}");
}

/// Finding: `since=0&until=i64::MAX` on `/usage/series` panicked its handler, and other
/// extremes gave wrong ranges. Now a time outside 1970–9999 is a clear 400.
#[tokio::test]
async fn audit_time_ranges_outside_1970_to_9999_are_a_clear_400() {
    let (_mock, base) = Mock::started().await;
    let rota = spawn(Scenario { config: &support::config(&base), keys: &KEYS[..1], ..Scenario::default() }).await;
    let admin = Some(rota.admin_key.as_str());
    for query in [
        "/api/v1/usage/series?since=0&until=9223372036854775807&step=86400",
        "/api/v1/usage/series?since=-9223372036854775808",
        "/api/v1/usage?since=-1",
        "/api/v1/attempts?until=9223372036854775807",
    ] {
        let (code, answer) = rota.api("GET", query, admin, None).await;
        assert_eq!(code, 400, "{query}: {answer}");
        assert!(answer["error"]["message"].as_str().unwrap().contains("out of range: from 1970 to 9999"), "{answer}");
    }
    let (code, _) = rota.api("GET", "/api/v1/usage/series?since=0&until=3600000&step=60", admin, None).await;
    assert_eq!(code, 200, "1970's first hour is a range like any other");
}

/// Finding: the confirming call for a claimed revocation used the leased OAuth token even once
/// it had expired, so a plain 401 for an expired token disabled the account until a new login.
/// Now the token is refreshed first, and only a 401 on a fresh token confirms.
#[tokio::test]
async fn a_revocation_claim_is_checked_with_a_fresh_token_not_an_expired_one() {
    let (mock, base) = Mock::started().await;
    mock.token_endpoint(3600, std::time::Duration::ZERO);
    let clock = std::sync::Arc::new(support::Skewed::default());
    let config = format!("{}[secrets]\nkeyring = \"off\"\n[leases]\nttl = \"3d\"\n", support::oauth_provider(&base));
    // In-process: the test moves rota's clock two days on.
    let rota = support::spawn(Scenario {
        config: &config,
        oauth: &[("corp:alice", "at-old-0001", "rt-old-0001")],
        clock: Some(clock.clone()),
        ..Scenario::default()
    })
    .await;
    let (code, l) = rota.api("POST", "/api/v1/leases", Some(&rota.agent_key), Some(json!({"model": "corp/m"}))).await;
    assert_eq!(code, 201, "{l}");
    assert_eq!(l["credential"]["secret"], "at-old-0001");
    // Two days on, the leased token has expired: the provider refuses it, not the account.
    clock.advance(std::time::Duration::from_secs(2 * 86_400));
    mock.script("at-old-0001", vec![Reply::Status(401, vec![], r#"{"error":{"message":"token expired"}}"#.into())]);
    let (code, answer) = report(&rota, &rota.agent_key, &l, revoked()).await;
    assert!(code == 200 || code == 502, "{answer}");
    assert_eq!(mock.token_calls(), 1, "the token was refreshed before rota's own call");
    let checked: Vec<String> = mock.seen().into_iter().filter(|s| s.path == "/v1/models").map(|s| s.key).collect();
    assert_eq!(checked, ["at-new-0001"], "the confirming call used the fresh token");
    let lanes = lanes(&rota).await;
    assert!(lanes.iter().all(|(_, until, reason, _)| until.is_none() && reason.is_none()), "not disabled: {lanes:?}");
}

/// Finding: five lease failure reports (429, `retry-after: 3600`) cooled every profile of a
/// model for an hour, and one success report per profile an hour kept each at the back. Now one
/// agent's claims cool or push back at most `leases.claim_share` of a provider's profiles per
/// `leases.claim_window`, and push each back once in it (docs/api.md, "A report is a claim").
#[tokio::test]
async fn hostile_reports_leave_most_of_the_provider_usable() {
    let (_mock, base) = Mock::started().await;
    let keys =
        [KEYS[0], KEYS[1], KEYS[2], ("openai:k4", "sk-test-key-four-0004"), ("openai:k5", "sk-test-key-five-0005")];
    let rota = spawn(Scenario { config: &lease_config(&base, ""), keys: &keys, ..Scenario::default() }).await;
    let limited = json!({"outcome": "failure", "http_status": 429, "headers": {"retry-after": "3600"},
        "error": "Rate limit reached"});
    let mut cooled_by_claims = Vec::new();
    for _ in 0..5 {
        let (code, l) = lease(&rota, &rota.agent_key).await;
        assert_eq!(code, 201, "{l}");
        let (code, answer) = report(&rota, &rota.agent_key, &l, limited.clone()).await;
        assert_eq!(code, 200, "{answer}");
        cooled_by_claims.push(l["profile_id"].as_str().unwrap().to_string());
    }
    rota.flush().await;
    let cooled: i64 = sqlx::query_scalar("SELECT count(DISTINCT profile_id) FROM profile_cooldowns")
        .fetch_one(rota.pool())
        .await
        .unwrap();
    assert_eq!(cooled, 2, "half of five profiles, rounded down: {cooled_by_claims:?}");
    let past: Vec<String> = sqlx::query_scalar("SELECT error FROM attempts WHERE error LIKE '%leases.claim_share%'")
        .fetch_all(rota.pool())
        .await
        .unwrap();
    assert_eq!(past.len(), 3, "the other three claims are audited, with no cooldown: {past:?}");
}

/// Success reports whose quota headers say "none left until the reset" order a profile last;
/// one agent's do so to at most `leases.claim_share` of the provider's profiles a window.
#[tokio::test]
async fn success_claims_push_back_at_most_the_agents_share() {
    let (_mock, base) = Mock::started().await;
    let keys = [KEYS[0], KEYS[1], KEYS[2], ("openai:k4", "sk-test-key-four-0004")];
    let rota = spawn(Scenario { config: &lease_config(&base, ""), keys: &keys, ..Scenario::default() }).await;
    let spent = json!({"outcome": "success", "http_status": 200, "headers": {
        "x-ratelimit-limit-requests": "100", "x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "50m0s"}});
    let mut first = Vec::new();
    for _ in 0..4 {
        let (_, l) = lease(&rota, &rota.agent_key).await;
        first.push(l["profile_id"].as_str().unwrap().to_string());
        let (code, answer) = report(&rota, &rota.agent_key, &l, spent.clone()).await;
        assert_eq!(code, 200, "{answer}");
    }
    first.sort();
    assert_eq!(first, ["openai:k1", "openai:k2", "openai:k3", "openai:k4"], "each leased once");
    let mut next = std::collections::BTreeSet::new();
    for _ in 0..4 {
        let (_, l) = lease(&rota, &rota.agent_key).await;
        next.insert(l["profile_id"].as_str().unwrap().to_string());
        report(&rota, &rota.agent_key, &l, json!({"outcome": "success", "http_status": 200})).await;
    }
    assert_eq!(next.len(), 2, "two pushed back (half of four), the other two in rotation: {next:?}");
}

/// Finding: success reports, whose quota headers may order any leased profile last for an
/// hour, had no rate limit. They have their own, like failure reports.
#[tokio::test]
async fn success_reports_past_the_agents_rate_get_429_and_the_lease_stays_valid() {
    let (_mock, base) = Mock::started().await;
    let rota = spawn(Scenario {
        config: &lease_config(&base, "[leases]\nsuccess_reports_per_minute = 2\nclaim_share = 1.0\n"),
        keys: &KEYS[..2],
        ..Scenario::default()
    })
    .await;
    let spent = json!({"outcome": "success", "headers": {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "1h"}});
    for _ in 0..2 {
        let (_, l) = lease(&rota, &rota.agent_key).await;
        assert_eq!(report(&rota, &rota.agent_key, &l, spent.clone()).await.0, 200);
    }
    let (_, l) = lease(&rota, &rota.agent_key).await;
    let (code, v) = report(&rota, &rota.agent_key, &l, spent).await;
    assert_eq!((code, v["error"]["type"].as_str()), (429, Some("too_many_success_reports")), "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("leases.success_reports_per_minute"), "{v}");
    let failed = json!({"outcome": "failure", "http_status": 500, "error": "boom"});
    assert_eq!(report(&rota, &rota.agent_key, &l, failed).await.0, 200, "the lease is still valid");
    rota.flush().await;
    assert_eq!(
        rota.scalar("SELECT count(*) FROM profile_quota").await,
        Some(2),
        "the refused report's headers were not read"
    );
}

#[tokio::test]
async fn an_upstreams_usage_out_of_range_is_held_and_flagged_on_sqlite() {
    usage_out_of_range(support::Db::Sqlite).await;
}

#[tokio::test]
async fn an_upstreams_usage_out_of_range_is_held_and_flagged_on_postgres() {
    usage_out_of_range(support::Db::Postgres(support::postgres_database().await)).await;
}

/// Finding: an upstream's `prompt_tokens = i64::MAX` and negative counts were stored as sent,
/// and `/api/v1/usage` and `/usage/series` then answered 500 for the whole retention window. Now
/// each count is held to 0..=100,000,000, the rows flagged `usage_suspect` and left unpriced,
/// and every usage view answers 200 whatever a row holds (docs/schema.md, `usage_suspect`).
async fn usage_out_of_range(db: support::Db) {
    let (mock, base) = Mock::started().await;
    let pg = match &db {
        support::Db::Postgres(url) => Some(sqlx::PgPool::connect(url).await.unwrap()),
        support::Db::Sqlite => None,
    };
    let config = format!(
        "{}{}[prices]\n\"openai/gpt-4.1\" = {{ input = 1, output = 2 }}\n",
        support::config(&base),
        support::anthropic_provider(&base)
    );
    let keys = [KEYS[0], support::ANTHROPIC_KEY];
    let rota = spawn(Scenario { config: &config, keys: &keys, db, ..Scenario::default() }).await;
    let huge = i64::MAX;
    let chat_body = format!(
        r#"{{"id":"c","object":"chat.completion","model":"gpt-4.1","choices":[{{"index":0,"message":{{"role":"assistant","content":"Hi"}},"finish_reason":"stop"}}],"usage":{{"prompt_tokens":{huge},"completion_tokens":-5,"total_tokens":{huge}}}}}"#
    );
    let messages_body = format!(
        r#"{{"id":"m","type":"message","role":"assistant","model":"claude","content":[{{"type":"text","text":"Hi"}}],"stop_reason":"end_turn","usage":{{"input_tokens":{huge},"cache_creation_input_tokens":{huge},"cache_read_input_tokens":-5,"output_tokens":-5}}}}"#
    );
    mock.script(KEYS[0].1, vec![Reply::Status(200, vec![], chat_body)]);
    mock.script(support::ANTHROPIC_KEY.1, vec![Reply::Status(200, vec![], messages_body)]);
    let r = rota.chat(chat(), &[]).await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    let r = rota.messages(json!({"model": "anthropic/claude-sonnet-4-5", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]})).await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    rota.flush().await;
    type Row = (String, Option<i64>, Option<i64>, bool, Option<f64>);
    let sql = "SELECT provider, tokens_in, tokens_out, usage_suspect, cost FROM attempts ORDER BY provider";
    let rows: Vec<Row> = match &pg {
        Some(pg) => sqlx::query_as(sql).fetch_all(pg).await.unwrap(),
        None => sqlx::query_as(sql).fetch_all(rota.pool()).await.unwrap(),
    };
    let held = |p: &str| (p.to_string(), Some(100_000_000), Some(0), true, None);
    assert_eq!(rows, vec![held("anthropic"), held("openai")]);
    let requests = "SELECT count(*) FROM requests WHERE usage_suspect AND tokens_in = 100000000";
    let flagged: i64 = match &pg {
        Some(pg) => sqlx::query_scalar(requests).fetch_one(pg).await.unwrap(),
        None => sqlx::query_scalar(requests).fetch_one(rota.pool()).await.unwrap(),
    };
    assert_eq!(flagged, 2);

    // Rows written before the bound (or by hand) may hold anything: the views still answer.
    let hour = (chrono::Utc::now().timestamp_millis() / 3_600_000 - 3) * 3_600_000;
    let hostile = format!(
        "INSERT INTO usage_hourly (hour, profile_id, attempts, successes, failures, tokens_in, tokens_out)
         VALUES ({hour}, 'openai:k1', 1, 1, 0, {huge}, {huge}), ({hour}, 'openai:k2', 1, 1, 0, {huge}, -{huge})"
    );
    let attempt = format!(
        "INSERT INTO attempts (request_id, seq, kind, provider, model, profile_id, started_at, outcome, tokens_in, tokens_out)
         VALUES ('r-old', 1, 'primary', 'openai', 'gpt-4.1', 'openai:k1', {}, 'success', {huge}, {huge})",
        chrono::Utc::now().timestamp_millis() - 60_000
    );
    for sql in [hostile, attempt] {
        match &pg {
            Some(pg) => sqlx::query(sqlx::AssertSqlSafe(sql)).execute(pg).await.map(|_| ()).unwrap(),
            None => sqlx::query(sqlx::AssertSqlSafe(sql)).execute(rota.pool()).await.map(|_| ()).unwrap(),
        }
    }
    let admin = Some(rota.admin_key.as_str());
    for path in ["/api/v1/usage", "/api/v1/usage/series", "/api/v1/usage?since=0"] {
        let (code, answer) = rota.api("GET", path, admin, None).await;
        assert_eq!(code, 200, "{path}: {answer}");
    }
    let (_, usage) = rota.api("GET", "/api/v1/usage", admin, None).await;
    assert!(usage.to_string().contains("openai:k1"), "{usage}");
}

/// Finding: agent B, sending agent A's session id with a pin, moved A's session and learned its
/// profile. Now a binding is the agent's own: the same id from another agent names another
/// session (docs/rotation.md, rule 7).
#[tokio::test]
async fn one_agents_session_id_neither_moves_nor_shows_anothers_binding() {
    let (_mock, base) = Mock::started().await;
    let rota = spawn(Scenario { config: &support::config(&base), keys: &KEYS[..3], ..Scenario::default() }).await;
    let send = async |key: &str, pin: Option<&str>| {
        let mut req = Rota::client()
            .post(format!("{}/v1/chat/completions", rota.url))
            .bearer_auth(key)
            .header("x-rota-session", "conversation-a")
            .json(&chat());
        if let Some(p) = pin {
            req = req.header("x-rota-profile", p);
        }
        let r = req.send().await.unwrap();
        assert_eq!(r.status(), 200);
        r.headers()["x-rota-profile"].to_str().unwrap().to_string()
    };
    let a = send(&rota.agent_key, None).await;
    let b = send(&rota.admin_key, None).await;
    assert_ne!(b, a, "B's first request takes the least recently used profile, not A's binding");
    let elsewhere = KEYS[..3].iter().map(|(id, _)| *id).find(|id| *id != a && *id != b).unwrap();
    assert_eq!(send(&rota.admin_key, Some(elsewhere)).await, elsewhere);
    assert_eq!(send(&rota.admin_key, None).await, elsewhere, "B's own session moved");
    for _ in 0..3 {
        assert_eq!(send(&rota.agent_key, None).await, a, "A's session stays where it was");
    }
}
