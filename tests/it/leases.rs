//! The lease API end to end: an agent that leases a credential, calls a fault-injecting upstream
//! itself and reports, against rota in-process on a real SQLite file. For the same faults it
//! must walk the same profiles and models, and leave the same rows, as the gateway.

use crate::support::{self, AttemptRow, Mock, Reply, Rota, spawn};
use serde_json::{Value, json};
use std::time::Duration;

/// The base config with its fallback and a short first-byte timeout; `extra` goes last, in
/// `[timeouts]` until it opens a table. The agent's reports may cool every profile
/// (`leases.claim_share = 1`), so that a lease walk can go exactly where the gateway's goes.
fn config(base: &str, extra: &str) -> String {
    let share = "[leases]\nclaim_share = 1.0\n";
    let extra = match extra.contains("[leases]") {
        true => extra.replace("[leases]\n", share),
        false => format!("{extra}\n{share}"),
    };
    format!("{}[timeouts]\nfirst_byte = \"2s\"\n{extra}\n", support::config_with_backup(base))
}

/// Two `openai` profiles and the `backup` one.
const KEYS: [(&str, &str); 3] = [support::KEYS[0], support::KEYS[1], support::KEYS[3]];

fn status(code: u16, headers: Vec<(&'static str, String)>, body: &str) -> Reply {
    Reply::Status(code, headers, body.to_string())
}

fn rate_limited(secs: u32) -> Reply {
    status(
        429,
        vec![("retry-after", secs.to_string())],
        r#"{"error":{"message":"Rate limit reached","type":"rate_limit_error"}}"#,
    )
}

fn overloaded() -> Reply {
    status(503, vec![], r#"{"error":{"message":"The engine is currently overloaded"}}"#)
}

/// A named fault script: replies per upstream key.
struct Scenario {
    name: &'static str,
    script: Vec<(&'static str, Vec<Reply>)>,
}

fn scenarios() -> Vec<Scenario> {
    let gone = r#"{"error":{"message":"The model `gpt-4.1` does not exist or you do not have access to it.","code":"model_not_found"}}"#;
    vec![
        Scenario { name: "served at once", script: vec![] },
        Scenario { name: "429 rotates", script: vec![(KEYS[0].1, vec![rate_limited(30)])] },
        Scenario {
            name: "auth then overloaded retries, then fallback",
            script: vec![
                (KEYS[0].1, vec![status(401, vec![], r#"{"error":{"message":"Incorrect API key provided"}}"#)]),
                (KEYS[1].1, vec![overloaded(), overloaded(), overloaded()]),
            ],
        },
        Scenario { name: "model_not_found falls back", script: vec![(KEYS[0].1, vec![status(404, vec![], gone)])] },
        Scenario {
            name: "everything rate limited",
            script: vec![
                (KEYS[0].1, vec![rate_limited(30)]),
                (KEYS[1].1, vec![rate_limited(40)]),
                (KEYS[2].1, vec![rate_limited(20)]),
            ],
        },
        Scenario {
            name: "a context overflow moves to the context fallback",
            script: vec![(
                KEYS[0].1,
                vec![status(
                    400,
                    vec![],
                    r#"{"error":{"message":"This model's maximum context length is 128000 tokens","code":"context_length_exceeded"}}"#,
                )],
            )],
        },
        Scenario {
            name: "a bad request stops",
            script: vec![(
                KEYS[0].1,
                vec![status(
                    400,
                    vec![],
                    r#"{"error":{"message":"'messages' is required","type":"invalid_request_error"}}"#,
                )],
            )],
        },
    ]
}

/// An attempt, and whether it set a cooldown.
#[derive(Debug, PartialEq, sqlx::FromRow)]
struct AttemptLine {
    #[sqlx(flatten)]
    row: AttemptRow,
    cooled: bool,
}

/// What a run leaves behind, to compare a gateway run with a lease run.
#[derive(Debug, PartialEq)]
struct Trace {
    /// (key, model) of every upstream call.
    upstream: Vec<(String, String)>,
    attempts: Vec<AttemptLine>,
    /// (served_model, served_profile, status, attempts, cost) of the request.
    request: (Option<String>, Option<String>, i64, i64, Option<f64>),
    /// (profile, error_count, failure_counts, success_count, cooling reason) per profile.
    stats: Vec<(String, i64, String, i64, Option<String>)>,
    /// The status the client saw at the end.
    final_status: u16,
}

async fn trace(rota: &Rota, mock: &Mock, final_status: u16) -> Trace {
    rota.flush().await;
    let pool = rota.pool();
    let attempts = sqlx::query_as(
        "SELECT kind, provider || '/' || model AS model, profile_id AS profile, outcome, reason, http_status AS status,
                cooldown_until IS NOT NULL AS cooled
         FROM attempts ORDER BY seq",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    let request = sqlx::query_as("SELECT served_model, served_profile, status, attempts, cost FROM requests")
        .fetch_one(pool)
        .await
        .unwrap();
    let stats = sqlx::query_as(
        "SELECT profile_id, error_count, failure_counts, success_count, cooldown_reason FROM usage_stats ORDER BY profile_id",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    let upstream = mock.seen().into_iter().map(|s| (s.key, s.model)).collect();
    Trace { upstream, attempts, request, stats, final_status }
}

async fn lease_loop(rota: &Rota, key: &str, lease_body: Value) -> (Vec<(String, String)>, u16) {
    let client = Rota::client();
    let (code, mut lease) = rota.api("POST", "/api/v1/leases", Some(key), Some(lease_body)).await;
    if code != 201 {
        return (vec![], code);
    }
    let mut seen = Vec::new();
    loop {
        seen.push((lease["kind"].as_str().unwrap().to_string(), lease["profile_id"].as_str().unwrap().to_string()));
        tokio::time::sleep(Duration::from_millis(lease["retry_in_ms"].as_u64().unwrap())).await;
        let mut body = support::chat();
        body["model"] = lease["model"].clone();
        let r = client
            .post(format!("{}/chat/completions", lease["base_url"].as_str().unwrap()))
            .bearer_auth(lease["credential"]["secret"].as_str().unwrap())
            .json(&body)
            .send()
            .await
            .unwrap();
        let http_status = r.status().as_u16();
        let headers: serde_json::Map<String, Value> =
            r.headers().iter().map(|(k, v)| (k.to_string(), json!(v.to_str().unwrap()))).collect();
        let text = r.text().await.unwrap();
        let report = if (200..300).contains(&http_status) {
            let v: Value = serde_json::from_str(&text).unwrap();
            json!({"outcome": "success", "http_status": http_status, "usage": {
                "input_tokens": v["usage"]["prompt_tokens"], "output_tokens": v["usage"]["completion_tokens"]}})
        } else {
            json!({"outcome": "failure", "http_status": http_status, "error": text, "headers": headers})
        };
        let path = format!("/api/v1/leases/{}/report", lease["lease_id"].as_str().unwrap());
        let (code, answer) = rota.api("POST", &path, Some(key), Some(report)).await;
        match (code, &answer["next"]) {
            (200, Value::Object(_)) => lease = answer["next"].clone(),
            (200, _) => return (seen, http_status),
            (code, _) => {
                assert!(answer["error"]["message"].is_string(), "an error answer says why: {answer}");
                return (seen, code);
            }
        }
    }
}

/// `models.context_fallbacks` of the equivalence runs: another model than the chain's fallback.
const CONTEXT: &str = "[models.context_fallbacks]\n\"openai/gpt-4.1\" = [\"openai/o3\"]";

#[tokio::test]
async fn an_agent_loop_over_leases_walks_and_records_exactly_what_the_gateway_does() {
    for s in scenarios() {
        // The gateway, with its own upstream and database.
        let (mock, base) = Mock::started().await;
        let rota =
            spawn(support::Scenario { config: &config(&base, CONTEXT), keys: &KEYS, ..support::Scenario::default() })
                .await;
        for (key, replies) in &s.script {
            mock.script(key, replies.clone());
        }
        let r = rota.chat(support::chat(), &[]).await;
        let gateway_status = r.status().as_u16();
        let retry_after = r.headers().get("retry-after").map(|v| v.to_str().unwrap().to_string());
        let via_gateway = trace(&rota, &mock, gateway_status).await;

        // The same faults, through leases.
        let (mock, base) = Mock::started().await;
        let rota =
            spawn(support::Scenario { config: &config(&base, CONTEXT), keys: &KEYS, ..support::Scenario::default() })
                .await;
        for (key, replies) in &s.script {
            mock.script(key, replies.clone());
        }
        let (leases, status) = lease_loop(&rota, &rota.agent_key, json!({"model": "openai/gpt-4.1"})).await;
        let via_leases = trace(&rota, &mock, status).await;

        assert_eq!(via_leases, via_gateway, "scenario `{}`", s.name);
        let kinds: Vec<(String, Option<String>)> = via_leases
            .attempts
            .iter()
            .filter(|a| a.row.kind != "skipped")
            .map(|a| (a.row.kind.clone(), a.row.profile.clone()))
            .collect();
        let leased: Vec<(String, Option<String>)> = leases.into_iter().map(|(k, p)| (k, Some(p))).collect();
        assert_eq!(leased, kinds, "scenario `{}`: one lease per attempt, in order", s.name);
        let api: String = sqlx::query_scalar("SELECT api FROM requests").fetch_one(rota.pool()).await.unwrap();
        assert_eq!(api, "lease");
        if s.name == "a context overflow moves to the context fallback" {
            let served: Vec<&str> = via_leases.upstream.iter().map(|(_, m)| m.as_str()).collect();
            assert_eq!((served, status), (vec!["gpt-4.1", "o3"], 200));
        }
        if s.name == "everything rate limited" {
            assert_eq!(status, 429);
            assert!(retry_after.is_some(), "the gateway says when to come back");
        }
    }
}

/// A lease's reported usage is priced as the gateway prices an answer: the cached tokens at their
/// own price; tokens of a kind the model has no price for leave the cost NULL.
#[tokio::test]
async fn a_reported_usage_is_priced_to_the_micro_dollar() {
    let (_mock, base) = Mock::started().await;
    let rota =
        spawn(support::Scenario { config: &config(&base, ""), keys: &KEYS, ..support::Scenario::default() }).await;
    let agent = Some(rota.agent_key.as_str());
    for usage in [
        json!({"input_tokens": 2006, "output_tokens": 300, "cached_input_tokens": 1920}),
        json!({"input_tokens": 2006, "output_tokens": 300, "cache_write_tokens": 1000}),
    ] {
        let (code, lease) = rota.api("POST", "/api/v1/leases", agent, Some(json!({"model": "openai/gpt-4.1"}))).await;
        assert_eq!(code, 201, "{lease}");
        let path = format!("/api/v1/leases/{}/report", lease["lease_id"].as_str().unwrap());
        let report = json!({"outcome": "success", "http_status": 200, "usage": usage});
        assert_eq!(rota.api("POST", &path, agent, Some(report)).await.0, 200);
    }
    rota.flush().await;
    let costs: Vec<(Option<i64>, Option<f64>, Option<f64>)> = sqlx::query_as(
        "SELECT r.tokens_in, r.cost, a.cost FROM requests r JOIN attempts a ON a.request_id = r.id ORDER BY r.started_at",
    )
    .fetch_all(rota.pool())
    .await
    .unwrap();
    // 86 × $2 + 1,920 cached × $0.50 + 300 × $8 = 3,532 micro-dollars; gpt-4.1 has no cache-write price.
    assert_eq!(costs, [(Some(2006), Some(0.003532), Some(0.003532)), (Some(2006), None, None)]);
}

#[tokio::test]
async fn the_exhausted_lease_walk_answers_429_with_retry_after_and_the_aggregated_message() {
    let (_mock, base) = Mock::started().await;
    let rota =
        spawn(support::Scenario { config: &config(&base, ""), keys: &KEYS, ..support::Scenario::default() }).await;
    let (_, lease) = rota.api("POST", "/api/v1/leases", Some(&rota.agent_key), Some(json!({}))).await;
    assert_eq!(lease["profile_id"], "openai:k1", "no model: the configured primary");
    let report = |secs: u32| {
        json!({"outcome": "failure", "http_status": 429, "headers": {"Retry-After": secs.to_string()},
               "error": r#"{"error":{"message":"Rate limit reached"}}"#})
    };
    let path = |l: &Value| format!("/api/v1/leases/{}/report", l["lease_id"].as_str().unwrap());
    let (code, a) = rota.api("POST", &path(&lease), Some(&rota.agent_key), Some(report(30))).await;
    assert_eq!((code, a["recorded"]["reason"].as_str()), (200, Some("rate_limit")));
    let next = &a["next"];
    assert_eq!((next["kind"].as_str(), next["profile_id"].as_str()), (Some("rotate"), Some("openai:k2")));
    let (_, a) = rota.api("POST", &path(next), Some(&rota.agent_key), Some(report(40))).await;
    let next = &a["next"];
    assert_eq!((next["kind"].as_str(), next["profile_id"].as_str()), (Some("fallback"), Some("backup:b1")));
    assert_eq!(next["model"], "gpt-4.1-mini");
    let r = Rota::client()
        .post(format!("{}{}", rota.url, path(next)))
        .bearer_auth(&rota.agent_key)
        .json(&report(20))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    let retry_after: u64 = r.headers()["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((19..=20).contains(&retry_after), "the soonest window: {retry_after}");
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["type"], "all_models_failed");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.starts_with("All models failed (2): openai/gpt-4.1: "), "{msg}");
    assert!(msg.contains("backup/gpt-4.1-mini: Rate limit reached (rate_limit)"), "{msg}");
    // A new lease while everything cools: as in the gateway, the cooled primary may be probed
    // near the end of its window, and the last candidate is always tried; k2 is skipped.
    let (code, v) = rota.api("POST", "/api/v1/leases", Some(&rota.agent_key), Some(json!({}))).await;
    assert_eq!(code, 201);
    let got = (v["kind"].as_str().unwrap(), v["profile_id"].as_str().unwrap());
    assert!(matches!(got, ("probe", "openai:k1") | ("fallback", "backup:b1")), "{got:?}");
}

/// usageStats of every profile, as stored.
async fn stats(rota: &Rota) -> Vec<(String, Option<i64>, i64, i64, Option<i64>)> {
    rota.flush().await;
    sqlx::query_as(
        "SELECT profile_id, last_used, error_count, success_count, cooldown_until FROM usage_stats ORDER BY profile_id",
    )
    .fetch_all(rota.pool())
    .await
    .unwrap()
}

#[tokio::test]
async fn refused_reports_change_nothing_and_say_why() {
    let (mock, base) = Mock::started().await;
    let rota = spawn(support::Scenario {
        config: &config(&base, "[leases]\nttl = \"1s\""),
        keys: &KEYS,
        ..support::Scenario::default()
    })
    .await;
    let key = rota.agent_key.clone();
    let ok = json!({"outcome": "success", "http_status": 200});
    // Unknown and malformed ids.
    let unknown = format!("/api/v1/leases/{}/report", uuid::Uuid::new_v4());
    let (code, v) = rota.api("POST", &unknown, Some(&key), Some(ok.clone())).await;
    assert_eq!((code, v["error"]["type"].as_str()), (404, Some("not_found")));
    let (code, v) = rota.api("POST", "/api/v1/leases/12345/report", Some(&key), Some(ok.clone())).await;
    assert_eq!((code, v["error"]["type"].as_str()), (400, Some("bad_request")));
    assert!(v["error"]["message"].as_str().unwrap().contains("not a lease id"));

    // A report from another agent: refused, and the lease stays good for its owner.
    let (_, lease) = rota.api("POST", "/api/v1/leases", Some(&key), Some(json!({}))).await;
    let before = stats(&rota).await; // the lease marked its profile used as it chose it
    let path = format!("/api/v1/leases/{}/report", lease["lease_id"].as_str().unwrap());
    let (code, v) = rota.api("POST", &path, Some(&rota.admin_key), Some(ok.clone())).await;
    assert_eq!((code, v["error"]["type"].as_str()), (403, Some("forbidden")));
    // A malformed report: refused, the lease stays good.
    for bad in [
        json!({"outcome": "maybe"}),
        json!({"outcome": "failure", "http_status": 1000}),
        json!({"outcome": "success", "error": "but it failed"}),
        json!({"outcome": "success", "surprise": 1}),
    ] {
        let (code, v) = rota.api("POST", &path, Some(&key), Some(bad.clone())).await;
        assert_eq!((code, v["error"]["type"].as_str()), (400, Some("bad_request")), "{bad}");
    }
    // An unknown outcome: the message names the field and the values it takes.
    let (_, v) = rota.api("POST", &path, Some(&key), Some(json!({"outcome": "maybe"}))).await;
    let message = v["error"]["message"].as_str().unwrap();
    assert!(message.contains("outcome: unknown variant `maybe`, expected `success` or `failure`"), "{message}");
    let (code, _) = rota.api("POST", &path, None, Some(ok.clone())).await;
    assert_eq!(code, 401);
    assert_eq!(stats(&rota).await, before, "refused reports change no stats");

    // The owner reports once; a second report is refused and changes nothing more.
    let (code, v) = rota.api("POST", &path, Some(&key), Some(ok.clone())).await;
    assert_eq!((code, v["recorded"]["outcome"].as_str(), &v["next"]), (200, Some("success"), &Value::Null));
    let after_one = stats(&rota).await;
    assert_ne!(after_one, before);
    let (code, v) = rota.api("POST", &path, Some(&key), Some(json!({"outcome": "failure", "http_status": 429}))).await;
    assert_eq!((code, v["error"]["type"].as_str()), (409, Some("lease_reported")));
    assert_eq!(stats(&rota).await, after_one);

    // An unreported lease expires: audited as cancelled, no stats change; a late report is refused.
    let (_, lease) = rota.api("POST", "/api/v1/leases", Some(&key), Some(json!({}))).await;
    assert_eq!(lease["profile_id"], "openai:k2", "least recently used first");
    let issued = stats(&rota).await; // marked used as it was chosen
    tokio::time::sleep(Duration::from_millis(2300)).await;
    let path = format!("/api/v1/leases/{}/report", lease["lease_id"].as_str().unwrap());
    let (code, v) = rota.api("POST", &path, Some(&key), Some(json!({"outcome": "failure", "http_status": 429}))).await;
    assert_eq!((code, v["error"]["type"].as_str()), (410, Some("lease_expired")), "{v}");
    assert_eq!(stats(&rota).await, issued, "an expired lease changes no stats");
    let (reason, status): (Option<String>, i64) = sqlx::query_as(
        "SELECT a.reason, r.status FROM attempts a JOIN requests r ON r.id = a.request_id WHERE a.profile_id = 'openai:k2'",
    )
    .fetch_one(rota.pool())
    .await
    .unwrap();
    assert_eq!((reason.as_deref(), status), (Some("cancelled"), 499));
    assert!(mock.seen().is_empty(), "rota itself never called the upstream");
}

#[tokio::test]
async fn sessions_pins_and_exclusions_work_as_in_the_gateway() {
    let (_mock, base) = Mock::started().await;
    let rota =
        spawn(support::Scenario { config: &config(&base, ""), keys: &KEYS, ..support::Scenario::default() }).await;
    let key = rota.agent_key.clone();
    let lease_and_succeed = |body: Value| {
        let rota = &rota;
        let key = key.clone();
        async move {
            let (code, lease) = rota.api("POST", "/api/v1/leases", Some(&key), Some(body)).await;
            assert_eq!(code, 201, "{lease}");
            let path = format!("/api/v1/leases/{}/report", lease["lease_id"].as_str().unwrap());
            let (code, _) = rota.api("POST", &path, Some(&key), Some(json!({"outcome": "success"}))).await;
            assert_eq!(code, 200);
            lease["profile_id"].as_str().unwrap().to_string()
        }
    };
    // Round robin without a session; a session sticks to the profile that served it.
    assert_eq!(lease_and_succeed(json!({"session": "s1"})).await, "openai:k1");
    assert_eq!(lease_and_succeed(json!({})).await, "openai:k2");
    assert_eq!(lease_and_succeed(json!({"session": "s1"})).await, "openai:k1");
    // A pin: that profile only; an exclusion: never that one.
    assert_eq!(lease_and_succeed(json!({"profile": "openai:k1"})).await, "openai:k1");
    assert_eq!(lease_and_succeed(json!({"exclude": ["openai:k2"]})).await, "openai:k1");
    // Excluding every profile of the provider skips to the fallback model.
    assert_eq!(lease_and_succeed(json!({"exclude": ["openai:k1", "openai:k2"]})).await, "backup:b1");
    // Bad input.
    for (body, code, kind) in [
        (json!({"profile": "nonsense"}), 400, "bad_request"),
        (json!({"profile": "openai:nobody"}), 400, "bad_request"),
        (json!({"exclude": ["x"]}), 400, "bad_request"),
        (json!({"model": "openai/gpt-4.1", "temperature": 1}), 400, "bad_request"),
        (json!({"model": "mystery/m"}), 404, "unknown_model"),
    ] {
        let (got, v) = rota.api("POST", "/api/v1/leases", Some(&key), Some(body.clone())).await;
        assert_eq!((got, v["error"]["type"].as_str()), (code, Some(kind)), "{body}: {v}");
    }
    let (code, _) = rota.api("POST", "/api/v1/leases", None, Some(json!({}))).await;
    assert_eq!(code, 401);
}

#[tokio::test]
async fn leases_outstanding_at_shutdown_are_audited_as_cancelled() {
    let (_mock, base) = Mock::started().await;
    let mut rota =
        spawn(support::Scenario { config: &config(&base, ""), keys: &KEYS, ..support::Scenario::default() }).await;
    let (code, lease) = rota.api("POST", "/api/v1/leases", Some(&rota.agent_key), Some(json!({}))).await;
    assert_eq!(code, 201);
    let before = stats(&rota).await;
    rota.shutdown().await;
    let row: (String, Option<String>, Option<String>, i64) = sqlx::query_as(
        "SELECT a.profile_id, a.reason, a.error, r.status FROM attempts a JOIN requests r ON r.id = a.request_id",
    )
    .fetch_one(rota.pool())
    .await
    .unwrap();
    assert_eq!(row.0, lease["profile_id"].as_str().unwrap());
    assert_eq!((row.1.as_deref(), row.3), (Some("cancelled"), 499));
    assert!(row.2.unwrap().starts_with("rota shut down before the lease was reported"));
    assert_eq!(stats(&rota).await, before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_concurrent_leases_spread_evenly_over_four_profiles() {
    let (_mock, base) = Mock::started().await;
    let keys = [
        ("openai:k1", "sk-a-0001"),
        ("openai:k2", "sk-b-0002"),
        ("openai:k3", "sk-c-0003"),
        ("openai:k4", "sk-d-0004"),
    ];
    let rota = std::sync::Arc::new(
        spawn(support::Scenario { config: &config(&base, ""), keys: &keys, ..support::Scenario::default() }).await,
    );
    let tasks: Vec<_> = (0..64)
        .map(|_| {
            let rota = rota.clone();
            tokio::spawn(async move {
                let (code, lease) = rota
                    .api("POST", "/api/v1/leases", Some(&rota.agent_key), Some(json!({"model": "openai/gpt-4.1"})))
                    .await;
                assert_eq!(code, 201, "{lease}");
                lease["profile_id"].as_str().unwrap().to_string()
            })
        })
        .collect();
    let mut per_profile = std::collections::BTreeMap::<String, usize>::new();
    for t in tasks {
        *per_profile.entry(t.await.unwrap()).or_default() += 1;
    }
    assert_eq!(per_profile.len(), 4, "{per_profile:?}");
    assert!(per_profile.values().all(|n| (14..=18).contains(n)), "16 ± 2 each: {per_profile:?}");
}
