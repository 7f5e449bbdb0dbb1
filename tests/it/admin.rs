//! The admin API end to end, against rota in-process on a real SQLite file: every endpoint, its
//! bad input, and that each change reaches the running gateway at once (no restart).

use crate::support::{self, Mock, Reply, Rota, Scenario, chat, spawn};
use serde_json::{Value, json};

/// The base config with its fallback, an alias, a virtual model and an agent without fallbacks.
fn config(base: &str) -> String {
    format!(
        r#"{}
[aliases]
fast = "openai/gpt-4.1-mini"
[virtual_models.smart]
targets = ["backup/gpt-4.1", "openai/gpt-4.1"]
[agents.solo]
fallbacks = []
"#,
        support::config_with_backup(base)
    )
}

/// Two `openai` profiles and the `backup` one.
const KEYS: [(&str, &str); 3] = [support::KEYS[0], support::KEYS[1], support::KEYS[3]];

async fn start() -> (Mock, Rota) {
    let (mock, base) = Mock::started().await;
    let rota = spawn(Scenario { config: &config(&base), keys: &KEYS, ..Scenario::default() }).await;
    (mock, rota)
}

fn error_type(v: &Value) -> &str {
    assert!(v["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "an error says why: {v}");
    v["error"]["type"].as_str().unwrap()
}

#[tokio::test]
async fn only_admin_keys_reach_the_admin_api() {
    let (_, rota) = start().await;
    let endpoints = [
        ("GET", "/api/v1/profiles"),
        ("POST", "/api/v1/profiles"),
        ("GET", "/api/v1/profiles/openai:k1"),
        ("DELETE", "/api/v1/profiles/openai:k1"),
        ("POST", "/api/v1/profiles/openai:k1/enable"),
        ("POST", "/api/v1/profiles/openai:k1/disable"),
        ("POST", "/api/v1/profiles/openai:k1/clear"),
        ("GET", "/api/v1/providers"),
        ("PUT", "/api/v1/providers/openai/order"),
        ("DELETE", "/api/v1/providers/openai/order"),
        ("GET", "/api/v1/models"),
        ("GET", "/api/v1/agents"),
        ("POST", "/api/v1/agents"),
        ("DELETE", "/api/v1/agents/tester"),
        ("GET", "/api/v1/usage"),
        ("GET", "/api/v1/attempts"),
        ("GET", "/api/v1/requests"),
    ];
    for (method, path) in endpoints {
        let body = (method != "GET" && method != "DELETE").then(|| json!({}));
        let (code, v) = rota.api(method, path, Some(&rota.agent_key), body.clone()).await;
        assert_eq!((code, error_type(&v)), (403, "forbidden"), "{method} {path}");
        let (code, v) = rota.api(method, path, None, body.clone()).await;
        assert_eq!((code, error_type(&v)), (401, "unauthorized"), "{method} {path}");
        let (code, _) = rota.api(method, path, Some("rk_not-a-key"), body).await;
        assert_eq!(code, 401, "{method} {path}");
    }
    // Nothing was changed by the refused calls.
    let (_, profiles) = rota.api("GET", "/api/v1/profiles", Some(&rota.admin_key), None).await;
    assert_eq!(profiles.as_array().unwrap().len(), 3);
    assert!(profiles.as_array().unwrap().iter().all(|p| p["enabled"] == true));
}

#[tokio::test]
async fn profiles_added_disabled_and_removed_over_the_api_take_effect_on_the_next_request() {
    let (mock, rota) = start().await;
    let admin = Some(rota.admin_key.as_str());

    // Disable k1: the gateway stops using it at once.
    let (code, p) = rota.api("POST", "/api/v1/profiles/openai:k1/disable", admin, None).await;
    assert_eq!((code, &p["enabled"], p["status"]["state"].as_str()), (200, &json!(false), Some("unusable")));
    for _ in 0..2 {
        assert_eq!(rota.chat(chat(), &[]).await.status(), 200);
    }
    assert_eq!(mock.keys(), [KEYS[1].1, KEYS[1].1]);

    // Add a key over the API: used by the next request (least recently used first).
    let new = json!({"provider": "openai", "name": "k9", "secret": "  sk-added-over-api-0009\n"});
    let (code, p) = rota.api("POST", "/api/v1/profiles", admin, Some(new)).await;
    assert_eq!(code, 201, "{p}");
    assert_eq!(
        (p["id"].as_str(), p["type"].as_str(), p["source"].as_str()),
        (Some("openai:k9"), Some("api_key"), Some("stored"))
    );
    assert_eq!(rota.chat(chat(), &[]).await.status(), 200);
    assert_eq!(mock.keys().last().unwrap(), "sk-added-over-api-0009", "the secret was trimmed and used");

    // Enable k1 again, then remove k2: its rows go, the gateway never picks it again.
    let (code, _) = rota.api("POST", "/api/v1/profiles/openai:k1/enable", admin, None).await;
    assert_eq!(code, 200);
    let (code, v) = rota.api("DELETE", "/api/v1/profiles/openai:k2", admin, None).await;
    assert_eq!((code, v), (204, Value::Null));
    let (code, v) = rota.api("GET", "/api/v1/profiles/openai:k2", admin, None).await;
    assert_eq!((code, error_type(&v)), (404, "not_found"));
    let before = mock.seen().len();
    for _ in 0..4 {
        assert_eq!(rota.chat(chat(), &[]).await.status(), 200);
    }
    let used: Vec<String> = mock.keys()[before..].to_vec();
    assert!(!used.contains(&KEYS[1].1.to_string()), "{used:?}");
    assert!(used.contains(&KEYS[0].1.to_string()) && used.contains(&"sk-added-over-api-0009".to_string()));
    assert_eq!(rota.scalar("SELECT COUNT(*) FROM profiles WHERE id = 'openai:k2'").await, Some(0));
    assert_eq!(rota.scalar("SELECT COUNT(*) FROM secrets WHERE profile_id = 'openai:k2'").await, Some(0));
    assert_eq!(rota.scalar("SELECT COUNT(*) FROM secrets WHERE profile_id = 'openai:k9'").await, Some(1));

    // The listing shows the change.
    let (_, listed) = rota.api("GET", "/api/v1/profiles?provider=openai", admin, None).await;
    let ids: Vec<&str> = listed.as_array().unwrap().iter().map(|p| p["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["openai:k1", "openai:k9"]);
}

#[tokio::test]
async fn bad_profile_input_is_refused_with_the_reason() {
    let (_, rota) = start().await;
    let admin = Some(rota.admin_key.as_str());
    let cases = [
        (json!({"provider": "azure", "name": "x", "secret": "sk-1"}), 400, "unknown provider `azure`"),
        (json!({"provider": "openai", "name": "bad name", "secret": "sk-1"}), 400, "malformed profile id"),
        (json!({"provider": "openai", "name": "x", "secret": "   "}), 400, "empty API key"),
        (json!({"provider": "openai", "name": "x", "secret": "sk one"}), 400, "whitespace"),
        (json!({"provider": "openai", "name": "x", "type": "oauth", "secret": "t"}), 400, "logging in"),
        (json!({"provider": "openai", "name": "x", "type": "bogus", "secret": "t"}), 400, "bogus"),
        (
            json!({"provider": "openai", "name": "x", "secret": "sk-1", "expires_at": "2030-01-01T00:00:00Z"}),
            400,
            "token profiles only",
        ),
        (
            json!({"provider": "openai", "name": "x", "type": "token", "secret": "t", "expires_at": "soon"}),
            400,
            "RFC 3339",
        ),
        (
            json!({"provider": "openai", "name": "x", "type": "token", "secret": "t", "expires_at": "2001-01-01T00:00:00Z"}),
            400,
            "in the past",
        ),
        (json!({"provider": "openai", "name": "x"}), 400, "secret"),
        (json!({"provider": "openai", "name": "x", "secret": "sk-1", "extra": true}), 400, "extra"),
        (json!({"provider": "openai", "name": "k1", "secret": "sk-1"}), 409, "already exists"),
    ];
    for (body, code, says) in cases {
        let (got, v) = rota.api("POST", "/api/v1/profiles", admin, Some(body.clone())).await;
        assert_eq!(got, code, "{body}: {v}");
        error_type(&v);
        assert!(v["error"]["message"].as_str().unwrap().contains(says), "{body}: {v}");
    }
    let r = Rota::client()
        .post(format!("{}/api/v1/profiles", rota.url))
        .bearer_auth(&rota.admin_key)
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    // A token with an expiry is accepted and shows it.
    let token = json!({"provider": "openai", "name": "t", "type": "token", "secret": "tok-1", "expires_at": "2099-01-01T00:00:00Z"});
    let (code, p) = rota.api("POST", "/api/v1/profiles", admin, Some(token)).await;
    assert_eq!(
        (code, p["expires_at"].as_str(), p["type"].as_str()),
        (201, Some("2099-01-01T00:00:00Z"), Some("token"))
    );

    for (method, path, code, kind) in [
        ("GET", "/api/v1/profiles/openai:nobody", 404, "not_found"),
        ("GET", "/api/v1/profiles/no-colon", 400, "bad_request"),
        ("DELETE", "/api/v1/profiles/openai:nobody", 404, "not_found"),
        ("DELETE", "/api/v1/profiles/Bad:Id", 400, "bad_request"),
        ("POST", "/api/v1/profiles/openai:nobody/enable", 404, "not_found"),
        ("POST", "/api/v1/profiles/openai:nobody/disable", 404, "not_found"),
        ("POST", "/api/v1/profiles/openai:nobody/clear", 404, "not_found"),
        ("POST", "/api/v1/profiles/:x/clear", 400, "bad_request"),
        ("GET", "/api/v1/profiles?vendor=openai", 400, "bad_request"),
    ] {
        let (got, v) = rota.api(method, path, admin, None).await;
        assert_eq!((got, error_type(&v)), (code, kind), "{method} {path}: {v}");
    }
}

#[tokio::test]
async fn config_declared_profiles_are_removed_in_the_config_file_only() {
    let (mock, base) = Mock::started().await;
    // A variable cargo sets for every test run stands in for the key's environment variable.
    let secret = std::env::var("CARGO_PKG_NAME").expect("cargo sets CARGO_PKG_NAME when it runs tests");
    let extra = "[auth.profiles.\"openai:declared\"]\nprovider = \"openai\"\ntype = \"api_key\"\napi_key_env = \"CARGO_PKG_NAME\"\n";
    let rota =
        spawn(Scenario { config: &format!("{}{extra}", config(&base)), keys: &KEYS, ..Scenario::default() }).await;
    let admin = Some(rota.admin_key.as_str());
    let (code, v) = rota.api("DELETE", "/api/v1/profiles/openai:declared", admin, None).await;
    assert_eq!((code, error_type(&v)), (409, "conflict"));
    assert!(v["error"]["message"].as_str().unwrap().contains("config file"));
    let (code, p) = rota.api("GET", "/api/v1/profiles/openai:declared", admin, None).await;
    assert_eq!((code, p["source"].as_str()), (200, Some("config")));
    let (code, v) = rota
        .api(
            "POST",
            "/api/v1/profiles",
            admin,
            Some(json!({"provider": "openai", "name": "declared", "secret": "sk-x"})),
        )
        .await;
    assert_eq!((code, error_type(&v)), (400, "bad_request"));
    // Disabling works on it like on any profile, and reaches the gateway at once: the config
    // file declares openai's profiles, so with this one off the fallback serves.
    assert_eq!(rota.chat(chat(), &[]).await.status(), 200);
    assert_eq!(mock.keys(), std::slice::from_ref(&secret));
    let (code, _) = rota.api("POST", "/api/v1/profiles/openai:declared/disable", admin, None).await;
    assert_eq!(code, 200);
    let r = rota.chat(chat(), &[]).await;
    assert_eq!((r.status().as_u16(), r.headers()["x-rota-profile"].to_str().unwrap()), (200, "backup:b1"));
}

#[tokio::test]
async fn clear_and_order_reach_the_gateway_at_once() {
    let (mock, rota) = start().await;
    let admin = Some(rota.admin_key.as_str());
    mock.script(
        KEYS[0].1,
        vec![Reply::Status(429, vec![("retry-after", "600".into())], r#"{"error":{"message":"slow down"}}"#.into())],
    );
    assert_eq!(rota.chat(chat(), &[]).await.status(), 200);
    let (_, p) = rota.api("GET", "/api/v1/profiles/openai:k1", admin, None).await;
    assert_eq!((p["status"]["state"].as_str(), p["status"]["reason"].as_str()), (Some("cooling"), Some("rate_limit")));
    assert!(p["status_text"].as_str().unwrap().starts_with("cooling"));
    assert_eq!(p["usage_stats"]["error_count"], 1);

    let (code, p) = rota.api("POST", "/api/v1/profiles/openai:k1/clear", admin, None).await;
    assert_eq!(
        (code, p["status"]["state"].as_str(), &p["usage_stats"]["error_count"]),
        (200, Some("usable"), &json!(0))
    );
    assert_eq!(
        rota.scalar("SELECT COUNT(*) FROM usage_stats WHERE profile_id = 'openai:k1' AND cooldown_until IS NULL").await,
        Some(1)
    );

    // An explicit order: k2 first every time (no round robin).
    let order = json!({"profiles": ["openai:k2", "openai:k1"]});
    let (code, p) = rota.api("PUT", "/api/v1/providers/openai/order", admin, Some(order)).await;
    assert_eq!(
        (code, p["order_source"].as_str(), &p["order"]),
        (200, Some("stored"), &json!(["openai:k2", "openai:k1"]))
    );
    let before = mock.seen().len();
    for _ in 0..3 {
        assert_eq!(rota.chat(chat(), &[]).await.status(), 200);
    }
    assert_eq!(mock.keys()[before..], [KEYS[1].1, KEYS[1].1, KEYS[1].1]);
    let (code, p) = rota.api("DELETE", "/api/v1/providers/openai/order", admin, None).await;
    assert_eq!((code, p["order_source"].as_str(), &p["order"]), (200, Some("round_robin"), &json!([])));
    assert_eq!(rota.scalar("SELECT COUNT(*) FROM profile_order").await, Some(0));

    for (body, path, code, says) in [
        (json!({"profiles": ["backup:b1"]}), "/api/v1/providers/openai/order", 400, "belongs to provider backup"),
        (json!({"profiles": ["openai:k1", "openai:k1"]}), "/api/v1/providers/openai/order", 400, "listed twice"),
        (json!({"profiles": ["openai:ghost"]}), "/api/v1/providers/openai/order", 400, "does not exist"),
        (json!({"profiles": ["nope"]}), "/api/v1/providers/openai/order", 400, "malformed"),
        (json!({"profiles": []}), "/api/v1/providers/openai/order", 400, "at least one"),
        (json!({"order": []}), "/api/v1/providers/openai/order", 400, "order"),
        (json!({"profiles": ["azure:x"]}), "/api/v1/providers/azure/order", 404, "unknown provider"),
    ] {
        let (got, v) = rota.api("PUT", path, admin, Some(body.clone())).await;
        assert_eq!(got, code, "{body}: {v}");
        assert!(v["error"]["message"].as_str().unwrap().contains(says), "{body}: {v}");
    }
    let (code, _) = rota.api("DELETE", "/api/v1/providers/azure/order", admin, None).await;
    assert_eq!(code, 404);
}

#[tokio::test]
async fn providers_models_and_agents() {
    let (_, rota) = start().await;
    let admin = Some(rota.admin_key.as_str());
    let (code, providers) = rota.api("GET", "/api/v1/providers", admin, None).await;
    assert_eq!(code, 200);
    assert_eq!(providers[1]["name"], "openai");
    assert_eq!(providers[1]["profiles"], json!(["openai:k1", "openai:k2"]));
    assert_eq!((providers[1]["api"].as_str(), providers[1]["oauth"].as_bool()), (Some("openai"), Some(false)));

    let (code, models) = rota.api("GET", "/api/v1/models", admin, None).await;
    assert_eq!(code, 200);
    assert_eq!(models["primary"], "openai/gpt-4.1");
    assert_eq!(models["aliases"], json!({"fast": "openai/gpt-4.1-mini"}));
    assert_eq!(models["virtual_models"][0]["name"], "smart");
    assert_eq!(
        models["virtual_models"][0]["chain"],
        json!(["backup/gpt-4.1", "openai/gpt-4.1", "backup/gpt-4.1-mini"])
    );
    assert_eq!(
        models["chains"],
        json!([
            {"agent": "(default)", "chain": ["openai/gpt-4.1", "backup/gpt-4.1-mini"], "error": null},
            {"agent": "solo", "chain": ["openai/gpt-4.1"], "error": null},
        ])
    );

    // Agents: create (the key is shown once and works at once), list, revoke (refused at once).
    let (code, created) = rota.api("POST", "/api/v1/agents", admin, Some(json!({"name": "planner"}))).await;
    assert_eq!(
        (code, created["agent"]["name"].as_str(), created["agent"]["admin"].as_bool()),
        (201, Some("planner"), Some(false))
    );
    let key = created["key"].as_str().unwrap().to_string();
    assert!(key.starts_with("rk_"));
    let (code, _) = rota.api("POST", "/api/v1/leases", Some(&key), Some(json!({}))).await;
    assert_eq!(code, 201, "the new key works without waiting for a reload");
    let (code, listed) = rota.api("GET", "/api/v1/agents", admin, None).await;
    assert_eq!(code, 200);
    let names: Vec<&str> = listed.as_array().unwrap().iter().map(|a| a["name"].as_str().unwrap()).collect();
    assert!(names.contains(&"planner") && names.contains(&"admin") && names.contains(&"tester"), "{names:?}");
    assert!(!listed.to_string().contains(&key) && !listed.to_string().contains("digest"));
    for (body, code, kind) in [
        (json!({"name": "planner"}), 409, "conflict"),
        (json!({"name": "Bad Name"}), 400, "bad_request"),
        (json!({"name": "x", "admin": "yes"}), 400, "bad_request"),
        (json!({}), 400, "bad_request"),
    ] {
        let (got, v) = rota.api("POST", "/api/v1/agents", admin, Some(body.clone())).await;
        assert_eq!((got, error_type(&v)), (code, kind), "{body}");
    }
    let (code, _) = rota.api("DELETE", "/api/v1/agents/planner", admin, None).await;
    assert_eq!(code, 204);
    let (code, _) = rota.api("POST", "/api/v1/leases", Some(&key), Some(json!({}))).await;
    assert_eq!(code, 401, "a revoked key is refused at once");
    let (code, v) = rota.api("DELETE", "/api/v1/agents/planner", admin, None).await;
    assert_eq!((code, error_type(&v)), (404, "not_found"));
}

#[tokio::test]
async fn usage_attempts_and_requests_filter_and_page() {
    let (mock, rota) = start().await;
    let admin = Some(rota.admin_key.as_str());
    mock.script(KEYS[0].1, vec![Reply::Status(429, vec![], r#"{"error":{"message":"slow down"}}"#.into())]);
    for _ in 0..5 {
        assert_eq!(rota.chat(chat(), &[]).await.status(), 200);
    }
    // 6 attempts: k1 429 then k2 for the first request; k1 cools, so k2 serves the other four.
    let (code, page) = rota.api("GET", "/api/v1/attempts", admin, None).await;
    assert_eq!(code, 200);
    let items = page["items"].as_array().unwrap();
    assert_eq!(items.len(), 6);
    assert_eq!(page["next_cursor"], Value::Null);
    assert!(items.windows(2).all(|w| w[0]["started_at"].as_i64() >= w[1]["started_at"].as_i64()), "newest first");
    let last = &items[5];
    assert_eq!(
        (last["profile_id"].as_str(), last["reason"].as_str(), last["http_status"].as_i64()),
        (Some("openai:k1"), Some("rate_limit"), Some(429))
    );

    // Filters.
    let count = |v: &Value| v["items"].as_array().unwrap().len();
    for (query, n) in [
        ("reason=rate_limit", 1),
        ("profile=openai:k2", 5),
        ("outcome=success", 5),
        ("provider=openai&outcome=failure", 1),
        ("model=openai/gpt-4.1", 6),
        ("model=gpt-4.1", 6),
        ("agent=tester", 6),
        ("agent=nobody", 0),
        ("since=2000-01-01T00:00:00Z&until=2001-01-01T00:00:00Z", 0),
        ("since=0", 6),
    ] {
        let (code, v) = rota.api("GET", &format!("/api/v1/attempts?{query}"), admin, None).await;
        assert_eq!((code, count(&v)), (200, n), "{query}: {v}");
    }
    let first_request = last["request_id"].as_str().unwrap().to_string();
    let (_, v) = rota.api("GET", &format!("/api/v1/attempts?request_id={first_request}"), admin, None).await;
    assert_eq!(count(&v), 2);

    // Pages of 4 then 2, no row twice, none lost.
    let (_, p1) = rota.api("GET", "/api/v1/attempts?limit=4", admin, None).await;
    assert_eq!(count(&p1), 4);
    let cursor = p1["next_cursor"].as_str().unwrap();
    let (_, p2) = rota.api("GET", &format!("/api/v1/attempts?limit=4&cursor={cursor}"), admin, None).await;
    assert_eq!((count(&p2), &p2["next_cursor"]), (2, &Value::Null));
    let mut all: Vec<Value> = p1["items"].as_array().unwrap().clone();
    all.extend(p2["items"].as_array().unwrap().iter().cloned());
    assert_eq!(&all, items);

    // Requests: filters select requests with a matching attempt.
    let (_, v) = rota.api("GET", "/api/v1/requests", admin, None).await;
    assert_eq!(count(&v), 5);
    let (_, v) = rota.api("GET", "/api/v1/requests?reason=rate_limit", admin, None).await;
    assert_eq!((count(&v), v["items"][0]["id"].as_str()), (1, Some(first_request.as_str())));
    assert_eq!(
        (v["items"][0]["attempts"].as_i64(), v["items"][0]["served_profile"].as_str()),
        (Some(2), Some("openai:k2"))
    );
    let (_, r1) = rota.api("GET", "/api/v1/requests?limit=3", admin, None).await;
    let (_, r2) = rota
        .api("GET", &format!("/api/v1/requests?limit=3&cursor={}", r1["next_cursor"].as_str().unwrap()), admin, None)
        .await;
    assert_eq!((count(&r1), count(&r2)), (3, 2));

    // Usage per profile.
    let (code, u) = rota.api("GET", "/api/v1/usage", admin, None).await;
    assert_eq!(code, 200);
    let k2 = u["profiles"].as_array().unwrap().iter().find(|p| p["profile_id"] == "openai:k2").unwrap();
    assert_eq!(
        (k2["attempts"].as_i64(), k2["successes"].as_i64(), k2["tokens_in"].as_i64()),
        (Some(5), Some(5), Some(15))
    );
    let k1 = u["profiles"].as_array().unwrap().iter().find(|p| p["profile_id"] == "openai:k1").unwrap();
    assert_eq!((k1["failures"].as_i64(), k1["usage_stats"]["error_count"].as_i64()), (Some(1), Some(1)));
    let (_, u) =
        rota.api("GET", "/api/v1/usage?since=2000-01-01T00:00:00Z&until=2000-01-02T00:00:00Z", admin, None).await;
    assert!(u["profiles"].as_array().unwrap().iter().all(|p| p["attempts"] == 0));

    for path in [
        "/api/v1/attempts?limit=0",
        "/api/v1/attempts?limit=5000",
        "/api/v1/attempts?limit=ten",
        "/api/v1/attempts?reason=bad_luck",
        "/api/v1/attempts?outcome=maybe",
        "/api/v1/attempts?since=yesterday",
        "/api/v1/attempts?cursor=garbage",
        "/api/v1/attempts?profile=nocolon",
        "/api/v1/attempts?model=backup/x&provider=openai",
        "/api/v1/attempts?colour=blue",
        "/api/v1/requests?cursor=1.2",
        "/api/v1/usage?since=2030-01-01T00:00:00Z&until=2029-01-01T00:00:00Z",
        "/api/v1/usage?since=later",
    ] {
        let (code, v) = rota.api("GET", path, admin, None).await;
        assert_eq!((code, error_type(&v)), (400, "bad_request"), "{path}: {v}");
    }
}

#[tokio::test]
async fn every_answer_forbids_content_sniffing() {
    let (_mock, base) = Mock::started().await;
    let rota = spawn(Scenario { config: &config(&base), keys: &KEYS[..1], ..Scenario::default() }).await;
    let client = Rota::client();
    let answers = [
        client.get(format!("{}/healthz", rota.url)).send().await.unwrap(),
        client.get(format!("{}/metrics", rota.url)).send().await.unwrap(),
        client.get(format!("{}/ui/", rota.url)).send().await.unwrap(),
        client.get(format!("{}/no/such/page", rota.url)).send().await.unwrap(),
        client.post(format!("{}/v1/chat/completions", rota.url)).body("{").send().await.unwrap(),
        rota.chat(chat(), &[]).await,
        client.get(format!("{}/api/v1/profiles", rota.url)).bearer_auth(&rota.admin_key).send().await.unwrap(),
    ];
    for r in answers {
        let nosniff = r.headers().get("x-content-type-options").map(|v| v.to_str().unwrap().to_string());
        assert_eq!(nosniff.as_deref(), Some("nosniff"), "{} {}", r.url(), r.status());
    }
}

/// `GET /api/v1/providers` says the order the next requests take (`rotation`, `next`), and the
/// gateway then serves them in that order: round robin with a cooling and a disabled profile,
/// an explicit order, and back to round robin when the order is removed.
#[tokio::test]
async fn the_rotation_the_providers_list_shows_is_the_one_the_gateway_takes() {
    let (mock, base) = Mock::started().await;
    const FOUR: [(&str, &str); 5] = [
        support::KEYS[0],
        support::KEYS[1],
        support::KEYS[2],
        ("openai:k4", "sk-test-key-four-0044"),
        support::KEYS[3],
    ];
    let rota = spawn(Scenario { config: &config(&base), keys: &FOUR, ..Scenario::default() }).await;
    let admin = Some(rota.admin_key.as_str());
    let openai = || async {
        let (code, all) = rota.api("GET", "/api/v1/providers", admin, None).await;
        assert_eq!(code, 200);
        all.as_array().unwrap().iter().find(|p| p["name"] == "openai").unwrap().clone()
    };
    let fresh = openai().await;
    assert_eq!(fresh["rotation"], json!(["openai:k1", "openai:k2", "openai:k3", "openai:k4"]));
    assert_eq!((fresh["next"].as_str(), fresh["rotation_model"].as_str()), (Some("openai:k1"), Some("openai/gpt-4.1")));

    // k1 and k2 serve; k3 answers 429 (cooling 10 min for gpt-4.1) and k4 serves: last used
    // k1 < k2 < k3 < k4. Then k2 is disabled by an admin.
    mock.script(
        FOUR[2].1,
        vec![Reply::Status(429, vec![("retry-after", "600".into())], r#"{"error":{"message":"slow down"}}"#.into())],
    );
    for _ in 0..3 {
        assert_eq!(rota.chat(chat(), &[]).await.status(), 200);
    }
    assert_eq!(mock.keys(), [FOUR[0].1, FOUR[1].1, FOUR[2].1, FOUR[3].1]);
    let (code, _) = rota.api("POST", "/api/v1/profiles/openai:k2/disable", admin, None).await;
    assert_eq!(code, 200);

    let p = openai().await;
    assert_eq!(p["rotation"], json!(["openai:k1", "openai:k4", "openai:k3", "openai:k2"]), "{p}");
    assert_eq!(p["next"], "openai:k1");
    // Every request goes to the `next` the list showed just before it.
    for _ in 0..4 {
        let next = openai().await["next"].as_str().unwrap().to_string();
        let r = rota.chat(chat(), &[]).await;
        assert_eq!((r.status().as_u16(), r.headers()["x-rota-profile"].to_str().unwrap()), (200, next.as_str()));
    }
    let served: Vec<&str> = mock.keys()[4..].iter().map(|k| FOUR.iter().find(|f| f.1 == k).unwrap().0).collect();
    assert_eq!(served, ["openai:k1", "openai:k4", "openai:k1", "openai:k4"]);

    // An explicit order: it is the rotation (k3 still cooling behind, k2 still off).
    let order = json!({"profiles": ["openai:k4", "openai:k3", "openai:k1"]});
    let (code, p) = rota.api("PUT", "/api/v1/providers/openai/order", admin, Some(order)).await;
    assert_eq!(
        (code, p["rotation"].clone(), p["next"].as_str()),
        (200, json!(["openai:k4", "openai:k1", "openai:k3", "openai:k2"]), Some("openai:k4"))
    );
    let r = rota.chat(chat(), &[]).await;
    assert_eq!(r.headers()["x-rota-profile"], "openai:k4");
    assert_eq!(openai().await["next"], "openai:k4", "an explicit order does not rotate");

    // Removed: least recently used first again (k1 was used before k4).
    let (code, p) = rota.api("DELETE", "/api/v1/providers/openai/order", admin, None).await;
    assert_eq!((code, p["order_source"].as_str(), p["next"].as_str()), (200, Some("round_robin"), Some("openai:k1")));
    assert_eq!(p["rotation"], json!(["openai:k1", "openai:k4", "openai:k3", "openai:k2"]));
    let r = rota.chat(chat(), &[]).await;
    assert_eq!(r.headers()["x-rota-profile"], "openai:k1");

    // Every usable profile blocked: no `next`.
    for id in ["openai:k1", "openai:k4"] {
        let (code, _) = rota.api("POST", &format!("/api/v1/profiles/{id}/disable"), admin, None).await;
        assert_eq!(code, 200);
    }
    let p = openai().await;
    assert_eq!(
        (p["next"].clone(), p["rotation"].clone()),
        (Value::Null, json!(["openai:k3", "openai:k1", "openai:k2", "openai:k4"]))
    );
}

/// What the console does with its session: add a token with an expiry (listed with it), and
/// create and revoke an agent, each with the session's CSRF token (refused without it).
#[tokio::test]
async fn the_console_session_adds_tokens_with_an_expiry_and_manages_agents() {
    let (_, rota) = start().await;
    let client = Rota::client();
    let signed = client.post(format!("{}/api/v1/session", rota.url)).json(&json!({"key": rota.admin_key}));
    let signed = signed.send().await.unwrap();
    assert_eq!(signed.status(), 200);
    let cookie = signed
        .headers()
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap().split(';').next().unwrap().to_string())
        .find(|c| c.starts_with("rota_session="))
        .expect("a session cookie");
    let csrf = signed.json::<Value>().await.unwrap()["csrf"].as_str().unwrap().to_string();
    let call = |method: reqwest::Method, path: &str, body: Option<Value>, with_csrf: bool| {
        let mut req = client.request(method, format!("{}{path}", rota.url)).header("cookie", &cookie);
        if with_csrf {
            req = req.header("x-csrf-token", &csrf);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        async move {
            let r = req.send().await.unwrap();
            let code = r.status().as_u16();
            let text = r.text().await.unwrap();
            (code, if text.is_empty() { Value::Null } else { serde_json::from_str::<Value>(&text).unwrap() })
        }
    };
    use reqwest::Method;
    let token = json!({"provider": "openai", "name": "tok", "type": "token", "secret": "tok-secret-1",
                       "expires_at": "2099-06-01T12:00:00Z"});
    let (code, v) = call(Method::POST, "/api/v1/profiles", Some(token.clone()), false).await;
    assert_eq!((code, v["error"]["type"].as_str()), (403, Some("csrf")));
    let (code, p) = call(Method::POST, "/api/v1/profiles", Some(token), true).await;
    assert_eq!(
        (code, p["type"].as_str(), p["expires_at"].as_str()),
        (201, Some("token"), Some("2099-06-01T12:00:00Z"))
    );
    let (code, all) = call(Method::GET, "/api/v1/profiles?provider=openai", None, false).await;
    assert_eq!(code, 200);
    let listed = all.as_array().unwrap().iter().find(|p| p["id"] == "openai:tok").unwrap();
    assert_eq!(
        (listed["expires_at"].as_str(), listed["status"]["state"].as_str()),
        (Some("2099-06-01T12:00:00Z"), Some("usable"))
    );
    assert!(!all.to_string().contains("tok-secret-1"));

    let (code, _) = call(Method::POST, "/api/v1/agents", Some(json!({"name": "console-made"})), false).await;
    assert_eq!(code, 403);
    let (code, created) = call(Method::POST, "/api/v1/agents", Some(json!({"name": "console-made"})), true).await;
    assert_eq!((code, created["agent"]["name"].as_str()), (201, Some("console-made")));
    let key = created["key"].as_str().unwrap().to_string();
    assert_eq!(rota.chat(chat(), &[]).await.status(), 200);
    let with_key =
        || Rota::client().post(format!("{}/v1/chat/completions", rota.url)).bearer_auth(&key).json(&chat()).send();
    let r = with_key().await.unwrap();
    assert_eq!(r.status(), 200, "the new key works at once");
    let (code, _) = call(Method::DELETE, "/api/v1/agents/console-made", None, false).await;
    assert_eq!(code, 403);
    let (code, _) = call(Method::DELETE, "/api/v1/agents/console-made", None, true).await;
    assert_eq!(code, 204);
    let r = with_key().await.unwrap();
    assert_eq!(r.status(), 401, "a revoked key is refused at once");
}
