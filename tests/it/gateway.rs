//! The gateway end to end: a real HTTP client, rota in-process on a real SQLite file, and a
//! fault-injecting upstream that answers per API key.

use crate::support::{
    self, ANTHROPIC_KEY, Db, KEYS, Mock, Reply, Rota, Scenario, Skewed, Writes, recorded, row, spawn,
};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;

/// The base config with its fallback and the `anthropic` provider, and short timeouts; `extra`
/// goes last, in `[timeouts]` until it opens a table.
fn config(openai: &str, extra: &str) -> String {
    format!(
        "{}{}[timeouts]\nfirst_byte = \"2s\"\nidle = \"1s\"\n{extra}\n",
        support::config_with_backup(openai),
        support::anthropic_provider(openai)
    )
}

/// The base request with a sampling field and one no provider knows, to see them reach upstream.
fn chat() -> Value {
    let mut body = support::chat();
    body["temperature"] = json!(0.2);
    body["x_unknown"] = json!({"kept": true});
    body
}

#[tokio::test]
async fn lru_rotation_spreads_six_requests_over_three_keys() {
    let (mock, base) = Mock::started().await;
    let rota = spawn(Scenario { config: &config(&base, ""), keys: &KEYS[..3], ..Scenario::default() }).await;
    for _ in 0..6 {
        let r = rota.chat(chat(), &[]).await;
        assert_eq!(r.status(), 200);
    }
    let k = |i: usize| KEYS[i].1.to_string();
    assert_eq!(mock.keys(), [k(0), k(1), k(2), k(0), k(1), k(2)]);
    assert_eq!(rota.scalar("SELECT COUNT(*) FROM requests WHERE status = 200 AND attempts = 1").await, Some(6));
    assert_eq!(rota.scalar("SELECT SUM(success_count) FROM usage_stats").await, Some(6));
}

/// The request id is rota's own whatever the client sends: it is the answer's `x-request-id`
/// and the audit rows' id, so a client cannot choose (or collide with) another request's id.
#[tokio::test]
async fn the_request_id_is_rotas_own_not_the_clients() {
    let (_mock, base) = Mock::started().await;
    let rota = spawn(Scenario { config: &config(&base, ""), keys: &KEYS[..1], ..Scenario::default() }).await;
    let mut ids = Vec::new();
    for _ in 0..2 {
        let r = rota.chat(chat(), &[("x-request-id", "chosen-by-the-client")]).await;
        assert_eq!(r.status(), 200);
        let id = r.headers()["x-request-id"].to_str().unwrap().to_string();
        assert!(uuid::Uuid::parse_str(&id).is_ok(), "{id}");
        ids.push(id);
    }
    assert_ne!(ids[0], ids[1]);
    rota.flush().await;
    let mut rows: Vec<String> =
        sqlx::query_scalar("SELECT request_id FROM attempts").fetch_all(rota.pool()).await.unwrap();
    rows.sort();
    ids.sort();
    assert_eq!(rows, ids);
}

/// A provider with more profiles than a request takes at once from the rotation index (8):
/// when the first ones all fail, the walk asks for the next ones and keeps rotating on the same
/// model instead of falling back.
#[tokio::test]
async fn a_walk_rotates_past_the_first_eight_profiles_of_a_large_provider() {
    let (mock, base) = Mock::started().await;
    let keys: Vec<(String, String)> =
        (0..11).map(|i| (format!("openai:a{i:02}"), format!("sk-large-{i:02}"))).collect();
    let profiles: Vec<(&str, &str)> = keys.iter().map(|(id, k)| (id.as_str(), k.as_str())).collect();
    let calls = "[limits]\nmax_attempts = 30\n";
    let rota = spawn(Scenario { config: &config(&base, calls), keys: &profiles, ..Scenario::default() }).await;
    let bad = r#"{"error":{"message":"The server had an error processing your request","type":"server_error"}}"#;
    for (_, key) in &keys[..10] {
        mock.script(key, vec![Reply::Status(500, vec![], bad.into()); 3]);
    }
    let resp = rota.chat(support::chat(), &[]).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-rota-profile"], "openai:a10");
    let kinds: Vec<String> = rota
        .attempts()
        .await
        .into_iter()
        .filter(|a| a.outcome == "failure" || a.outcome == "success")
        .map(|a| a.kind)
        .collect();
    let profiles: Vec<Option<String>> =
        rota.attempts().await.into_iter().filter(|a| a.kind != "retry").map(|a| a.profile).collect();
    assert_eq!(
        profiles,
        keys.iter().map(|(id, _)| Some(id.clone())).collect::<Vec<_>>(),
        "each profile once, in order"
    );
    assert!(kinds.iter().all(|k| k == "primary" || k == "rotate" || k == "retry"), "no fallback: {kinds:?}");
}

#[tokio::test]
async fn answer_carries_rota_headers_and_the_body_reaches_upstream_unchanged_but_model() {
    let (mock, base) = Mock::started().await;
    let rota = spawn(Scenario {
        config: &config(&base, "[aliases]\nfast = \"openai/gpt-4.1\""),
        keys: &KEYS[..1],
        ..Scenario::default()
    })
    .await;
    let mut body = chat();
    body["model"] = json!("fast");
    let r = rota.chat(body, &[]).await;
    assert_eq!(r.status(), 200);
    let h = r.headers().clone();
    assert_eq!(h["x-rota-provider"], "openai");
    assert_eq!(h["x-rota-model"], "gpt-4.1");
    assert_eq!(h["x-rota-profile"], "openai:k1");
    assert_eq!(h["x-rota-attempts"], "1");
    assert_eq!(h["x-request-id"].len(), 36);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["choices"][0]["message"]["content"], "served");
    assert_eq!(mock.seen()[0].model, "gpt-4.1");
    assert_eq!(
        rota.scalar("SELECT tokens_in * 100 + tokens_out FROM requests").await,
        Some(302),
        "usage reported by the upstream is recorded"
    );
}

#[tokio::test]
async fn retry_after_7_cools_that_profile_exactly_7_seconds_and_it_is_skipped() {
    let (mock, base) = Mock::started().await;
    let rota = spawn(Scenario { config: &config(&base, ""), keys: &KEYS[..2], ..Scenario::default() }).await;
    let body = r#"{"error":{"message":"Rate limit reached","type":"rate_limit_error","code":"rate_limit_exceeded"}}"#;
    mock.script(KEYS[0].1, vec![Reply::Status(429, vec![("retry-after", "7".into())], body.into())]);
    assert_eq!(rota.chat(chat(), &[]).await.status(), 200);
    for _ in 0..3 {
        assert_eq!(rota.chat(chat(), &[]).await.status(), 200);
    }
    let k = |i: usize| KEYS[i].1.to_string();
    assert_eq!(mock.keys(), [k(0), k(1), k(1), k(1), k(1)]);
    assert_eq!(
        rota.scalar("SELECT cooldown_until - last_failure_at FROM usage_stats WHERE profile_id = 'openai:k1'").await,
        Some(7_000)
    );
    let attempts = rota.attempts().await;
    assert_eq!(
        attempts[0],
        row("primary", "openai/gpt-4.1", Some("openai:k1"), "failure", Some("rate_limit"), Some(429))
    );
    assert_eq!(attempts[1], row("rotate", "openai/gpt-4.1", Some("openai:k2"), "success", None, Some(200)));
    assert_eq!(rota.scalar("SELECT retry_after_ms FROM attempts WHERE reason = 'rate_limit'").await, Some(7_000));
    assert_eq!(
        rota.scalar("SELECT cooldown_model IS NOT NULL FROM usage_stats WHERE profile_id = 'openai:k1'").await,
        Some(1)
    );
}

#[tokio::test]
async fn all_profiles_429_falls_back_to_the_next_model() {
    let (mock, base) = Mock::started().await;
    let clock = Arc::new(Skewed::default());
    let rota = spawn(Scenario {
        config: &config(&base, ""),
        keys: &[KEYS[0], KEYS[1], KEYS[3]],
        clock: Some(clock.clone()),
        ..Scenario::default()
    })
    .await;
    let limited = || Reply::Status(429, vec![], r#"{"error":{"message":"Too many requests"}}"#.into());
    mock.script(KEYS[0].1, vec![limited()]);
    mock.script(KEYS[1].1, vec![limited()]);
    let r = rota.chat(chat(), &[]).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-rota-model"], "gpt-4.1-mini");
    assert_eq!(r.headers()["x-rota-attempts"], "3");
    assert_eq!(
        rota.attempts().await,
        [
            row("primary", "openai/gpt-4.1", Some("openai:k1"), "failure", Some("rate_limit"), Some(429)),
            row("rotate", "openai/gpt-4.1", Some("openai:k2"), "failure", Some("rate_limit"), Some(429)),
            row("fallback", "backup/gpt-4.1-mini", Some("backup:b1"), "success", None, Some(200)),
        ]
    );
    // Right after, openai is all cooled and the failure is fresh evidence: skipped without a
    // call. 30 s on, within 2 minutes of its end, the primary is probed once (it fails again,
    // and a probe is one call); the request after that is within the 30 s of that failure and
    // skips openai again.
    mock.script(KEYS[0].1, vec![limited()]);
    assert_eq!(rota.chat(chat(), &[]).await.status(), 200);
    clock.advance(Duration::from_secs(30));
    assert_eq!(rota.chat(chat(), &[]).await.status(), 200);
    assert_eq!(rota.chat(chat(), &[]).await.status(), 200);
    let attempts = rota.attempts().await;
    assert_eq!(attempts[3], row("skipped", "openai/gpt-4.1", None, "skipped", Some("rate_limit"), None));
    assert_eq!(attempts[4].kind, "fallback");
    assert_eq!(
        attempts[5],
        row("probe", "openai/gpt-4.1", Some("openai:k1"), "failure", Some("rate_limit"), Some(429))
    );
    assert_eq!(attempts[6].kind, "fallback");
    assert_eq!(attempts[7], row("skipped", "openai/gpt-4.1", None, "skipped", Some("rate_limit"), None));
    assert_eq!(mock.seen().len(), 7);
    assert_eq!(rota.scalar("SELECT COUNT(*) FROM requests WHERE served_model = 'backup/gpt-4.1-mini'").await, Some(4));
}

#[tokio::test]
async fn every_candidate_failing_gives_the_aggregated_error_with_retry_after() {
    let (mock, base) = Mock::started().await;
    let rota = spawn(Scenario { config: &config(&base, ""), keys: &[KEYS[0], KEYS[3]], ..Scenario::default() }).await;
    mock.script(
        KEYS[0].1,
        vec![Reply::Status(429, vec![("retry-after", "30".into())], r#"{"error":{"message":"slow down"}}"#.into())],
    );
    mock.script(
        KEYS[3].1,
        vec![Reply::Status(429, vec![("retry-after", "12".into())], r#"{"error":{"message":"busy"}}"#.into())],
    );
    let r = rota.chat(chat(), &[]).await;
    assert_eq!(r.status(), 429);
    assert_eq!(r.headers()["retry-after"], "12");
    assert_eq!(
        r.headers()["x-rota-tried"],
        "openai:k1 openai/gpt-4.1 429 rate_limit, backup:b1 backup/gpt-4.1-mini 429 rate_limit",
        "every call the error answer follows"
    );
    let v: Value = r.json().await.unwrap();
    assert_eq!(
        v["error"]["message"],
        "All models failed (2): openai/gpt-4.1: slow down (rate_limit) | backup/gpt-4.1-mini: busy (rate_limit)"
    );
    assert_eq!(v["error"]["type"], "rate_limit_error");
    assert_eq!(rota.scalar("SELECT status FROM requests").await, Some(429));
}

#[tokio::test]
async fn format_and_context_overflow_stop_after_one_call_without_cooldown() {
    for (body, reason) in [
        (r#"{"error":{"message":"Invalid value for 'temperature'","type":"invalid_request_error"}}"#, "format"),
        (
            r#"{"error":{"message":"This model's maximum context length is 128000 tokens","code":"context_length_exceeded"}}"#,
            "context_overflow",
        ),
    ] {
        let (mock, base) = Mock::started().await;
        let rota =
            spawn(Scenario { config: &config(&base, ""), keys: &[KEYS[0], KEYS[1], KEYS[3]], ..Scenario::default() })
                .await;
        mock.script(KEYS[0].1, vec![Reply::Status(400, vec![], body.into())]);
        let r = rota.chat(chat(), &[]).await;
        assert_eq!(r.status(), 400);
        let v: Value = r.json().await.unwrap();
        assert_eq!(v, serde_json::from_str::<Value>(body).unwrap(), "the upstream error is returned as is");
        assert_eq!(mock.seen().len(), 1, "{reason}: one upstream call");
        assert_eq!(
            rota.attempts().await,
            [row("primary", "openai/gpt-4.1", Some("openai:k1"), "failure", Some(reason), Some(400))]
        );
        // Counted against the profile that made the call, but no window: the request was at fault.
        assert_eq!(
            rota.scalar(
                "SELECT error_count * 100 + failure_total * 10 + (cooldown_until IS NULL AND disabled_reason IS NULL)
                 FROM usage_stats WHERE profile_id = 'openai:k1'"
            )
            .await,
            Some(111),
            "{reason}"
        );
        assert_eq!(rota.scalar("SELECT COUNT(*) FROM profile_cooldowns").await, Some(0));
    }
}

#[tokio::test]
async fn model_not_found_goes_to_the_next_model_and_cools_the_model_not_the_profile() {
    let (mock, base) = Mock::started().await;
    let clock = Arc::new(Skewed::default());
    let rota = spawn(Scenario {
        config: &config(&base, ""),
        keys: &[KEYS[0], KEYS[1], KEYS[3]],
        clock: Some(clock.clone()),
        ..Scenario::default()
    })
    .await;
    let gone = r#"{"error":{"message":"The model `gpt-4.1` does not exist or you do not have access to it.","code":"model_not_found"}}"#;
    mock.script(KEYS[0].1, vec![Reply::Status(404, vec![], gone.into())]);
    let r = rota.chat(chat(), &[]).await;
    assert_eq!(r.status(), 200);
    assert_eq!(mock.keys(), [KEYS[0].1, KEYS[3].1], "no rotation to k2: the model is gone for every profile");
    assert_eq!(
        rota.scalar("SELECT COUNT(*) FROM model_cooldowns WHERE provider = 'openai' AND model = 'gpt-4.1'").await,
        Some(1)
    );
    // The profile that answered is counted, but it is the model that cools.
    assert_eq!(
        rota.scalar(
            "SELECT error_count * 10 + failure_total FROM usage_stats
             WHERE profile_id = 'openai:k1' AND cooldown_until IS NULL AND disabled_reason IS NULL"
        )
        .await,
        Some(11)
    );
    // The model cools for 1 minute: 30 s on, a request probes it (still gone), and the one
    // after that, inside the 30 s of that failure, skips it without a call.
    mock.script(KEYS[1].1, vec![Reply::Status(404, vec![], gone.into())]);
    clock.advance(Duration::from_secs(30));
    assert_eq!(rota.chat(chat(), &[]).await.status(), 200);
    assert_eq!(rota.chat(chat(), &[]).await.status(), 200);
    let a = rota.attempts().await;
    assert_eq!(a[2], row("probe", "openai/gpt-4.1", Some("openai:k2"), "failure", Some("model_not_found"), Some(404)));
    assert_eq!(a[4], row("skipped", "openai/gpt-4.1", None, "skipped", Some("model_not_found"), None));
    assert_eq!(mock.seen().len(), 5);
    assert_eq!(rota.scalar("SELECT error_count FROM model_cooldowns").await, Some(2));
}

/// The demo's `smart`: an overloaded first model falls back. The next request, right after,
/// skips it without a call (the failure is fresh); a probe, 30 s on, is one call, not three.
#[tokio::test]
async fn a_fallback_is_not_undone_by_the_next_request_and_a_probe_is_one_call() {
    let (mock, base) = Mock::started().await;
    let clock = Arc::new(Skewed::default());
    let rota = spawn(Scenario {
        config: &config(&base, ""),
        keys: &[KEYS[0], KEYS[3]],
        clock: Some(clock.clone()),
        ..Scenario::default()
    })
    .await;
    let busy = || Reply::Status(503, vec![], r#"{"error":{"message":"The engine is currently overloaded"}}"#.into());
    mock.script(KEYS[0].1, vec![busy(); 10]);
    let r = rota.chat(chat(), &[]).await;
    assert_eq!((r.status().as_u16(), r.headers()["x-rota-model"].to_str().unwrap()), (200, "gpt-4.1-mini"));
    let r = rota.chat(chat(), &[]).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-rota-attempts"], "2", "a skip and the fallback");
    assert!(r.headers()["x-rota-tried"].to_str().unwrap().contains("skipped:overloaded"));
    clock.advance(Duration::from_secs(30));
    assert_eq!(rota.chat(chat(), &[]).await.status(), 200);
    let kinds: Vec<(String, Option<String>)> = rota.attempts().await.into_iter().map(|r| (r.kind, r.profile)).collect();
    let k1 = || Some("openai:k1".to_string());
    let b1 = || Some("backup:b1".to_string());
    assert_eq!(
        kinds,
        [
            ("primary".into(), k1()),
            ("retry".into(), k1()),
            ("retry".into(), k1()),
            ("fallback".into(), b1()),
            ("skipped".into(), None),
            ("fallback".into(), b1()),
            ("probe".into(), k1()),
            ("fallback".into(), b1()),
        ]
    );
    assert_eq!(mock.keys().iter().filter(|k| *k == KEYS[0].1).count(), 4, "3 calls, then 1 probe");
}

#[tokio::test]
async fn overloaded_503_is_retried_twice_on_the_same_key_then_rotates() {
    let (mock, base) = Mock::started().await;
    let rota = spawn(Scenario { config: &config(&base, ""), keys: &KEYS[..2], ..Scenario::default() }).await;
    let busy = || Reply::Status(503, vec![], r#"{"error":{"message":"The engine is currently overloaded"}}"#.into());
    mock.script(KEYS[0].1, vec![busy(), busy(), busy()]);
    assert_eq!(rota.chat(chat(), &[]).await.status(), 200);
    assert_eq!(mock.keys(), [KEYS[0].1, KEYS[0].1, KEYS[0].1, KEYS[1].1]);
    let kinds: Vec<String> = rota.attempts().await.into_iter().map(|r| r.kind).collect();
    assert_eq!(kinds, ["primary", "retry", "retry", "rotate"]);
    assert_eq!(
        rota.scalar("SELECT error_count * 10 + failure_total FROM usage_stats WHERE profile_id = 'openai:k1'").await,
        Some(33),
        "every failed call is counted"
    );
}

#[tokio::test]
async fn missing_unknown_or_revoked_agent_keys_get_401_and_no_upstream_call() {
    let (mock, base) = Mock::started().await;
    let rota = spawn(Scenario { config: &config(&base, ""), keys: &KEYS[..1], ..Scenario::default() }).await;
    let c = Rota::client();
    let url = format!("{}/v1/chat/completions", rota.url);
    assert_eq!(c.post(&url).json(&chat()).send().await.unwrap().status(), 401);
    let r = c.post(&url).bearer_auth("rk_nope").json(&chat()).send().await.unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(r.json::<Value>().await.unwrap()["error"]["code"], "invalid_api_key");
    let r =
        c.post(format!("{}/v1/messages", rota.url)).header("x-api-key", "rk_nope").json(&chat()).send().await.unwrap();
    assert_eq!(r.json::<Value>().await.unwrap()["error"]["type"], "authentication_error");
    assert!(mock.seen().is_empty());
}

#[tokio::test]
async fn bad_requests_are_refused_in_the_clients_format_without_upstream_calls() {
    let (mock, base) = Mock::started().await;
    let rota = spawn(Scenario {
        config: &config(&base, "[limits]\nmax_body_bytes = 2048"),
        keys: &KEYS[..1],
        ..Scenario::default()
    })
    .await;
    let c = Rota::client();
    let url = format!("{}/v1/chat/completions", rota.url);
    let send = |body: Vec<u8>| {
        c.post(&url).bearer_auth(&rota.agent_key).header("content-type", "application/json").body(body).send()
    };
    let r = send(b"{not json".to_vec()).await.unwrap();
    assert_eq!(r.status(), 400);
    assert!(r.json::<Value>().await.unwrap()["error"]["message"].as_str().unwrap().starts_with("invalid JSON"));
    assert_eq!(send(b"[1,2]".to_vec()).await.unwrap().status(), 400);
    assert_eq!(send(vec![b' '; 4096]).await.unwrap().status(), 413);
    let r = rota.chat(json!({"model": "nope/x", "messages": []}), &[]).await;
    assert_eq!(r.status(), 404);
    assert!(r.json::<Value>().await.unwrap()["error"]["message"].as_str().unwrap().contains("unknown provider `nope`"));
    let r = rota.chat(chat(), &[("x-rota-profile", "garbage")]).await;
    assert_eq!(r.status(), 400);
    let r = rota.chat(chat(), &[("x-rota-profile", "openai:ghost")]).await;
    assert_eq!(r.status(), 400);
    assert!(mock.seen().is_empty());
    let r = rota.chat(json!({"messages": []}), &[]).await;
    assert_eq!(r.status(), 200, "a missing model means the configured primary");
}

#[tokio::test]
async fn pinned_profile_is_used_and_never_rotates() {
    let (mock, base) = Mock::started().await;
    let rota =
        spawn(Scenario { config: &config(&base, ""), keys: &[KEYS[0], KEYS[1], KEYS[3]], ..Scenario::default() }).await;
    mock.script(KEYS[1].1, vec![Reply::Status(429, vec![], r#"{"error":{"message":"rate limit"}}"#.into())]);
    let r = rota.chat(chat(), &[("x-rota-profile", "openai:k2")]).await;
    assert_eq!(r.status(), 200);
    assert_eq!(mock.keys(), [KEYS[1].1, KEYS[3].1], "pinned k2 failed: straight to the fallback model, k1 untouched");
}

#[tokio::test]
async fn sessions_stick_to_their_profile() {
    let (mock, base) = Mock::started().await;
    let rota = spawn(Scenario { config: &config(&base, ""), keys: &KEYS[..3], ..Scenario::default() }).await;
    for _ in 0..3 {
        rota.chat(chat(), &[("x-rota-session", "conversation-1")]).await;
    }
    let mut body = chat();
    body["user"] = json!("user-7");
    for _ in 0..2 {
        rota.chat(body.clone(), &[]).await;
    }
    let k = mock.keys();
    assert_eq!((k[0] == k[1], k[1] == k[2]), (true, true), "session 1 stays on one key: {k:?}");
    assert_eq!(k[3], k[4], "the OpenAI `user` field is a session key too");
    assert_ne!(k[0], k[3]);
}

/// What agents send names their session: Claude Code's `X-Claude-Code-Session-Id` and the
/// `session_id` inside its `metadata.user_id`, Codex's `session_id` header and its Responses
/// `prompt_cache_key`. Each session's second request goes to the profile of its first, though a
/// request came between (least recently used would pick the third).
#[tokio::test]
async fn agents_sessions_stick_from_what_they_send() {
    let (mock, base) = Mock::started().await;
    let rota = spawn(Scenario { config: &config(&base, ""), keys: &KEYS[..3], ..Scenario::default() }).await;
    let send = async |path: &str, body: Value, header: Option<(&str, &str)>| {
        let mut req = Rota::client()
            .post(format!("{}{path}", rota.url))
            .bearer_auth(&rota.agent_key)
            .header("anthropic-version", "2023-06-01")
            .json(&body);
        if let Some((k, v)) = header {
            req = req.header(k, v);
        }
        let r = req.send().await.unwrap();
        assert_eq!(r.status(), 200, "{path}: {}", r.text().await.unwrap());
    };
    let claude = |device: &str| {
        let ids = json!({"device_id": device, "account_uuid": "", "session_id": "4b1e-session"}).to_string();
        json!({"model": "openai/gpt-4.1", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}],
               "metadata": {"user_id": ids}})
    };
    let codex = json!({"model": "openai/gpt-4.1", "input": "hi", "prompt_cache_key": "conv-7"});
    // (path, body, a session header) of each session's two turns.
    type Turn<'a> = (&'a str, Value, Option<(&'a str, &'a str)>);
    let sessions: [[Turn; 2]; 4] = [
        [0, 1].map(|_| ("/v1/chat/completions", chat(), Some(("x-claude-code-session-id", "cc-1")))),
        [0, 1].map(|_| ("/v1/chat/completions", chat(), Some(("session_id", "codex-1")))),
        [("/v1/responses", codex.clone(), None), ("/v1/responses", codex, None)],
        [("/v1/messages", claude("d1"), None), ("/v1/messages", claude("d2"), None)],
    ];
    for (n, [first, second]) in sessions.into_iter().enumerate() {
        let before = mock.keys().len();
        send(first.0, first.1, first.2).await;
        send("/v1/chat/completions", chat(), None).await;
        send(second.0, second.1, second.2).await;
        let k = &mock.keys()[before..];
        assert_eq!(k[0], k[2], "session {n} stays on its key: {k:?}");
        assert_ne!(k[0], k[1], "session {n}: the request between went elsewhere: {k:?}");
    }
}

#[tokio::test]
async fn upstream_echoing_the_key_never_reaches_the_client_or_the_audit() {
    let (mock, base) = Mock::started().await;
    let rota = spawn(Scenario { config: &config(&base, ""), keys: &[KEYS[0]], ..Scenario::default() }).await;
    let echo = format!(
        r#"{{"error":{{"message":"Incorrect API key provided: {}. Check it.","type":"invalid_request_error"}}}}"#,
        KEYS[0].1
    );
    mock.script(KEYS[0].1, vec![Reply::Status(400, vec![], echo.clone())]);
    let r = rota.chat(chat(), &[("x-rota-fallbacks", "none")]).await;
    let headers = format!("{:?}", r.headers());
    let text = r.text().await.unwrap();
    for hay in [&text, &headers] {
        assert!(!hay.contains("key-one-0001"), "secret leaked: {hay}");
        assert!(!hay.contains(&rota.agent_key), "agent key leaked: {hay}");
    }
    assert!(text.contains("[REDACTED]"), "{text}");
    rota.flush().await;
    let errors: Vec<Option<String>> =
        sqlx::query_scalar("SELECT error FROM attempts").fetch_all(rota.pool()).await.unwrap();
    assert_eq!(errors.len(), 1);
    assert!(!errors[0].as_deref().unwrap().contains("key-one-0001"), "{errors:?}");
}

#[tokio::test]
async fn stream_failing_before_its_first_event_fails_over_invisibly() {
    let (mock, base) = Mock::started().await;
    let rota = spawn(Scenario { config: &config(&base, ""), keys: &KEYS[..2], ..Scenario::default() }).await;
    mock.script(KEYS[0].1, vec![Reply::StreamErrorFirst]);
    let mut body = chat();
    body["stream"] = json!(true);
    let r = rota.chat(body, &[]).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "text/event-stream");
    assert_eq!(r.headers()["x-rota-profile"], "openai:k2");
    let text = r.text().await.unwrap();
    assert!(!text.contains("Rate limit"), "the failed stream is not visible: {text}");
    assert_eq!(text.matches("chat.completion.chunk").count(), 4, "three deltas and the finish: {text}");
    assert!(text.ends_with("data: [DONE]\n\n"));
    let a = rota.attempts().await;
    assert_eq!(a[0], row("primary", "openai/gpt-4.1", Some("openai:k1"), "failure", Some("rate_limit"), None));
    assert_eq!(a[1].outcome, "success");
    assert_eq!(
        rota.scalar("SELECT tokens_in * 100 + tokens_out FROM attempts WHERE outcome = 'success'").await,
        Some(302)
    );
}

#[tokio::test]
async fn stream_failing_after_its_first_event_ends_in_band_with_one_call() {
    let (mock, base) = Mock::started().await;
    let rota =
        spawn(Scenario { config: &config(&base, ""), keys: &[KEYS[0], KEYS[1], KEYS[3]], ..Scenario::default() }).await;
    mock.script(KEYS[0].1, vec![Reply::StreamBreakAfterFirst]);
    let mut body = chat();
    body["stream"] = json!(true);
    let text = rota.chat(body, &[]).await.text().await.unwrap();
    assert!(text.starts_with("data: {\"id\":\"c\""), "{text}");
    assert!(text.contains("\"error\"") && text.contains("upstream stream failed"), "{text}");
    assert_eq!(mock.seen().len(), 1, "no failover after commit");
    let a = rota.attempts().await;
    assert_eq!((a.len(), a[0].outcome.as_str(), a[0].reason.as_deref()), (1, "failure", Some("network")));
}

#[tokio::test]
async fn stalled_stream_ends_at_the_idle_timeout() {
    let (mock, base) = Mock::started().await;
    let rota = spawn(Scenario { config: &config(&base, ""), keys: &[KEYS[0]], ..Scenario::default() }).await;
    mock.script(KEYS[0].1, vec![Reply::StreamStallAfterFirst]);
    let mut body = chat();
    body["stream"] = json!(true);
    let started = std::time::Instant::now();
    let text = rota.chat(body, &[]).await.text().await.unwrap();
    let took = started.elapsed();
    assert!(took >= std::time::Duration::from_secs(1) && took < std::time::Duration::from_secs(10), "{took:?}");
    assert!(text.contains("the stream was idle for 1s"), "{text}");
    let a = rota.attempts().await;
    assert_eq!((a[0].outcome.as_str(), a[0].reason.as_deref()), ("failure", Some("timeout")));
}

#[tokio::test]
async fn anthropic_messages_are_served_with_x_api_key_upstream() {
    let (mock, base) = Mock::started().await;
    let cfg = support::anthropic_provider(&base);
    let rota = spawn(Scenario { config: &cfg, keys: &[ANTHROPIC_KEY], ..Scenario::default() }).await;
    let r = rota.messages(json!({"model": "anthropic/claude-sonnet-4-5", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]})).await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["content"][0]["text"], "served");
    assert_eq!(mock.seen()[0].path, "/v1/messages");
    assert_eq!(mock.seen()[0].key, ANTHROPIC_KEY.1);
    let mut stream = json!({"model": "anthropic/claude-sonnet-4-5", "max_tokens": 10, "stream": true, "messages": []});
    stream["metadata"] = json!({"user_id": "u1"});
    let text = rota.messages(stream).await.text().await.unwrap();
    assert!(text.starts_with(": keep-alive\n\nevent: message_start"), "bytes pass through unchanged: {text}");
    assert!(text.ends_with("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"), "{text}");
    assert_eq!(rota.scalar("SELECT tokens_in * 100 + tokens_out FROM requests WHERE stream = 1").await, Some(1104));
}

#[tokio::test]
async fn a_responses_request_is_served_by_an_anthropic_provider_through_chat() {
    let (mock, base) = Mock::started().await;
    let rota =
        spawn(Scenario { config: &config(&base, ""), keys: &[KEYS[0], ANTHROPIC_KEY], ..Scenario::default() }).await;
    let r = Rota::client()
        .post(format!("{}/v1/responses", rota.url))
        .bearer_auth(&rota.agent_key)
        .json(&json!({"model": "anthropic/claude", "instructions": "be brief", "input": "hi", "max_output_tokens": 50}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-rota-provider"], "anthropic");
    let v: Value = r.json().await.unwrap();
    assert_eq!((v["object"].as_str(), v["status"].as_str()), (Some("response"), Some("completed")));
    assert_eq!(v["output"][0]["content"][0], json!({"type": "output_text", "text": "served", "annotations": []}));
    assert_eq!(v["usage"]["input_tokens"], 11);
    let sent = &mock.bodies()[0];
    assert_eq!(mock.seen()[0].path, "/v1/messages");
    assert_eq!(sent["system"], "be brief");
    assert_eq!(sent["messages"], json!([{"role": "user", "content": [{"type": "text", "text": "hi"}]}]));
    assert_eq!(sent["max_tokens"], 50);
}

#[tokio::test]
async fn a_responses_request_that_names_a_stored_response_skips_a_provider_that_cannot_hold_it() {
    let (_mock, base) = Mock::started().await;
    let rota =
        spawn(Scenario { config: &config(&base, ""), keys: &[KEYS[0], ANTHROPIC_KEY], ..Scenario::default() }).await;
    let r = Rota::client()
        .post(format!("{}/v1/responses", rota.url))
        .bearer_auth(&rota.agent_key)
        .header("x-rota-fallbacks", "openai/gpt-4.1")
        .json(&json!({"model": "anthropic/claude", "input": "and then?", "previous_response_id": "resp_1"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-rota-provider"], "openai", "OpenAI's own Responses API holds it");
    let a = rota.attempts().await;
    assert_eq!(a[0], row("skipped", "anthropic/claude", None, "skipped", Some("wire_format"), None));
    let err: Option<String> = sqlx::query_scalar("SELECT error FROM attempts WHERE reason = 'wire_format'")
        .fetch_one(rota.pool())
        .await
        .unwrap();
    assert!(err.unwrap().starts_with("anthropic: cannot translate: previous_response_id: rota keeps no responses"));
}

#[tokio::test]
async fn chat_client_is_served_by_an_anthropic_upstream_through_translation() {
    let (mock, base) = Mock::started().await;
    let rota = spawn(Scenario { config: &config(&base, ""), keys: &[ANTHROPIC_KEY], ..Scenario::default() }).await;
    let r = rota.chat(json!({"model": "anthropic/claude-sonnet-4-5", "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]}), &[]).await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["content"], "served");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(v["usage"]["prompt_tokens"], 11);
    assert_eq!(mock.seen()[0].path, "/v1/messages");
    let mut body = chat();
    body["model"] = json!("anthropic/claude-sonnet-4-5");
    body["stream"] = json!(true);
    let text = rota.chat(body, &[]).await.text().await.unwrap();
    let events = rota::gateway::translate::sse::Splitter::default().push(text.as_bytes());
    let data: Vec<&str> = events.iter().map(|e| e.data.as_str()).collect();
    assert!(data[0].contains("\"role\":\"assistant\""), "{text}");
    assert!(data.iter().any(|d| d.contains("\"content\":\"t1\"")), "{text}");
    assert!(data.iter().any(|d| d.contains("\"finish_reason\":\"stop\"")), "{text}");
    assert_eq!(*data.last().unwrap(), "[DONE]");
    assert!(!text.contains("event:"), "no Anthropic event names reach an OpenAI client: {text}");
}

#[tokio::test]
async fn anthropic_client_is_served_by_an_openai_upstream_through_translation() {
    let (_mock, base) = Mock::started().await;
    let rota = spawn(Scenario { config: &config(&base, ""), keys: &[KEYS[0]], ..Scenario::default() }).await;
    let r = rota.messages(json!({"model": "openai/gpt-4.1", "max_tokens": 10, "system": "be brief", "messages": [{"role": "user", "content": "hi"}]})).await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["type"], "message");
    assert_eq!(v["content"], json!([{"type": "text", "text": "served"}]));
    assert_eq!(v["stop_reason"], "end_turn");
    assert_eq!(v["usage"], json!({"input_tokens": 3, "output_tokens": 2}));
    let text = rota.messages(json!({"model": "openai/gpt-4.1", "max_tokens": 10, "stream": true, "messages": [{"role": "user", "content": "hi"}]})).await.text().await.unwrap();
    let names: Vec<String> = rota::gateway::translate::sse::Splitter::default()
        .push(text.as_bytes())
        .iter()
        .filter_map(|e| e.name.clone())
        .collect();
    assert_eq!(names.first().map(String::as_str), Some("message_start"), "{text}");
    assert_eq!(names.last().map(String::as_str), Some("message_stop"), "{text}");
    assert!(names.iter().filter(|n| *n == "content_block_delta").count() == 3, "{text}");
}

#[tokio::test]
async fn anthropic_529_fails_over_to_an_openai_fallback_for_an_openai_client() {
    let (mock, base) = Mock::started().await;
    let cfg = config(&base, "").replace("primary = \"openai/gpt-4.1\"", "primary = \"anthropic/claude-sonnet-4-5\"");
    let rota = spawn(Scenario { config: &cfg, keys: &[ANTHROPIC_KEY, KEYS[3]], ..Scenario::default() }).await;
    let overloaded = r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#;
    mock.script(ANTHROPIC_KEY.1, vec![Reply::Status(529, vec![], overloaded.into()); 3]);
    let r = rota.chat(json!({"messages": [{"role": "user", "content": "hi"}]}), &[]).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-rota-provider"], "backup");
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["choices"][0]["message"]["content"], "served");
    let kinds: Vec<(String, String)> = rota.attempts().await.into_iter().map(|a| (a.kind, a.model)).collect();
    assert_eq!(
        kinds,
        [
            ("primary".to_string(), "anthropic/claude-sonnet-4-5".to_string()),
            ("retry".into(), "anthropic/claude-sonnet-4-5".into()),
            ("retry".into(), "anthropic/claude-sonnet-4-5".into()),
            ("fallback".into(), "backup/gpt-4.1-mini".into()),
        ]
    );
}

#[tokio::test]
async fn client_leaving_mid_stream_aborts_the_upstream_stream() {
    let (mock, base) = Mock::started().await;
    let rota = spawn(Scenario {
        config: &config(&base, "").replace("idle = \"1s\"", "idle = \"30s\""),
        keys: &[KEYS[0]],
        ..Scenario::default()
    })
    .await;
    mock.script(KEYS[0].1, vec![Reply::StreamStallAfterFirst]);
    let mut body = chat();
    body["stream"] = json!(true);
    let mut r = rota.chat(body, &[]).await;
    let first = r.chunk().await.unwrap().unwrap();
    assert!(String::from_utf8_lossy(&first).contains("chat.completion.chunk"));
    drop(r);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while mock.aborted() == 0 && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(mock.aborted(), 1, "the upstream stream was closed when the client left");
    let a = rota.attempts().await;
    assert_eq!((a.len(), a[0].outcome.as_str(), a[0].reason.as_deref()), (1, "failure", Some("cancelled")));
    assert_eq!(
        rota.scalar("SELECT error_count FROM usage_stats WHERE profile_id = 'openai:k1'").await,
        Some(0),
        "no cooldown"
    );
}

#[tokio::test]
async fn client_leaving_before_the_answer_records_a_cancelled_attempt() {
    let (mock, base) = Mock::started().await;
    let rota = spawn(Scenario {
        config: &config(&base, "").replace("first_byte = \"2s\"", "first_byte = \"30s\""),
        keys: &[KEYS[0]],
        ..Scenario::default()
    })
    .await;
    mock.script(KEYS[0].1, vec![Reply::Delay(std::time::Duration::from_secs(3))]);
    let client = reqwest::Client::builder().timeout(std::time::Duration::from_millis(300)).build().unwrap();
    let url = format!("{}/v1/chat/completions", rota.url);
    assert!(client.post(url).bearer_auth(&rota.agent_key).json(&chat()).send().await.is_err());
    let started = std::time::Instant::now();
    let mut a = rota.attempts().await;
    while a.is_empty() && started.elapsed() < std::time::Duration::from_secs(5) {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        a = rota.attempts().await;
    }
    assert_eq!((a.len(), a[0].outcome.as_str(), a[0].reason.as_deref()), (1, "failure", Some("cancelled")));
    assert_eq!(rota.scalar("SELECT status FROM requests").await, Some(499));
    assert_eq!(rota.scalar("SELECT error_count FROM usage_stats WHERE profile_id = 'openai:k1'").await, Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_under_load_loses_no_audit_row() {
    let (mock, base) = Mock::started().await;
    let mut rota = spawn(Scenario { config: &config(&base, ""), keys: &KEYS, ..Scenario::default() }).await;
    for (_, key) in &KEYS[..3] {
        let mut script = Vec::new();
        for i in 0..40 {
            script.push(match i % 4 {
                0 => Reply::Status(429, vec![], r#"{"error":{"message":"rate limit"}}"#.into()),
                1 => Reply::Status(503, vec![], r#"{"error":{"message":"overloaded"}}"#.into()),
                _ => Reply::Delay(std::time::Duration::from_millis(150)),
            });
        }
        mock.script(key, script);
    }
    let (url, key) = (format!("{}/v1/chat/completions", rota.url), rota.agent_key.clone());
    let tasks: Vec<_> = (0..60)
        .map(|i| {
            let (url, key) = (url.clone(), key.clone());
            tokio::spawn(async move {
                tokio::time::sleep(std::time::Duration::from_millis(i % 20)).await;
                Rota::client().post(url).bearer_auth(key).json(&chat()).send().await.map(|r| r.status().as_u16())
            })
        })
        .collect();
    // Shut down once calls are in flight (on a loaded machine the first ones take a while).
    let waited = std::time::Instant::now();
    while mock.seen().len() < 10 && waited.elapsed() < std::time::Duration::from_secs(5) {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    rota.shutdown().await;
    let mut answered = 0;
    for t in tasks {
        if let Ok(Ok(_)) = t.await {
            answered += 1;
        }
    }
    assert!(answered > 0, "some requests were in flight");
    let calls = mock.seen().len() as i64;
    let rows: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM attempts WHERE outcome != 'skipped'")
        .fetch_one(rota.pool())
        .await
        .unwrap();
    assert_eq!(rows, calls, "one attempts row per upstream call");
    let requests: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM requests").fetch_one(rota.pool()).await.unwrap();
    assert_eq!(requests, answered, "one requests row per answered request");
}

#[tokio::test]
async fn responses_api_passes_through_to_openai_format_providers() {
    let (mock, base) = Mock::started().await;
    let rota = spawn(Scenario { config: &config(&base, ""), keys: &[KEYS[0]], ..Scenario::default() }).await;
    let r = Rota::client()
        .post(format!("{}/v1/responses", rota.url))
        .bearer_auth(&rota.agent_key)
        .json(&json!({"model": "openai/gpt-4.1", "input": "hi"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(mock.seen()[0].path, "/v1/responses");
    assert_eq!(rota.scalar("SELECT api = 'responses' FROM requests").await, Some(1));
}

#[tokio::test]
async fn models_lists_what_the_agent_may_name() {
    let (_mock, base) = Mock::started().await;
    let rota = spawn(Scenario {
        config: &config(&base, "[aliases]\nfast = \"backup/gpt-4.1-mini\""),
        keys: &[KEYS[0]],
        ..Scenario::default()
    })
    .await;
    let r = Rota::client().get(format!("{}/v1/models", rota.url)).bearer_auth(&rota.agent_key).send().await.unwrap();
    let v: Value = r.json().await.unwrap();
    let ids: Vec<&str> = v["data"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["backup/gpt-4.1-mini", "fast", "openai/gpt-4.1"]);
    assert_eq!(v["object"], "list");
    let r = Rota::client().get(format!("{}/v1/models", rota.url)).send().await.unwrap();
    assert_eq!(r.status(), 401);
}

/// The `rota` binary with its logs captured: no upstream key and no agent key may appear in
/// them, even when the upstream echoes the key back.
#[tokio::test]
async fn secrets_never_reach_the_logs_of_the_binary() {
    use std::io::{BufRead, BufReader, Write};
    use std::process::{Command, Stdio};
    let (mock, base) = Mock::started().await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("rota.toml"), config(&base, "")).unwrap();
    let bin = env!("CARGO_BIN_EXE_rota");
    let run = |args: &[&str], stdin: &str| {
        let mut c = Command::new(bin)
            .args(args)
            .current_dir(dir.path())
            .env_remove("ROTA_MASTER_KEY")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        c.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
        let out = c.wait_with_output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    run(&["profiles", "add", "openai", "--name", "k1"], KEYS[0].1);
    run(&["profiles", "add", "backup", "--name", "b1"], KEYS[3].1);
    run(&["profiles", "add", "anthropic", "--name", "main"], ANTHROPIC_KEY.1);
    let agent_key = run(&["agents", "create", "ops"], "").lines().last().unwrap().to_string();
    let echo = |key: &str| {
        format!(
            r#"{{"error":{{"message":"Incorrect API key provided: {key}","type":"invalid_request_error","code":"invalid_api_key"}}}}"#
        )
    };
    let format_echo = format!(
        r#"{{"error":{{"message":"Invalid value for 'key_hint': {} is not allowed","type":"invalid_request_error"}}}}"#,
        KEYS[0].1
    );
    mock.script(KEYS[0].1, vec![Reply::Status(401, vec![], echo(KEYS[0].1)), Reply::Status(400, vec![], format_echo)]);
    mock.script(KEYS[3].1, vec![Reply::Status(401, vec![], echo(KEYS[3].1))]);

    let mut child = Command::new(bin)
        .args(["serve", "--listen", "127.0.0.1:0"])
        .current_dir(dir.path())
        .env("ROTA_LOG", "rota=debug,info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let url = line.trim().replace("rota listening on ", "");
    let post = |headers: Vec<(&'static str, &'static str)>| {
        let (url, agent_key) = (url.clone(), agent_key.clone());
        async move {
            let mut req =
                Rota::client().post(format!("{url}/v1/chat/completions")).bearer_auth(agent_key).json(&chat());
            for (k, v) in headers {
                req = req.header(k, v);
            }
            let r = req.send().await.unwrap();
            (r.status().as_u16(), format!("{:?}", r.headers()), r.text().await.unwrap())
        }
    };
    // 1: both providers answer 401 (echoing the key): the aggregated error.
    let all_failed = post(vec![]).await;
    assert_eq!(all_failed.0, 502, "{all_failed:?}");
    // 2: the cooling primary, pinned, answers a 400 that echoes the key: returned as is.
    let stopped = post(vec![("x-rota-profile", "openai:k1"), ("x-rota-fallbacks", "none")]).await;
    assert_eq!(stopped.0, 400, "{stopped:?} {:?}", mock.seen());
    // 3: the primary is skipped (its failure is fresh), the cooling last candidate serves: a
    // fallback.
    let served = post(vec![]).await;
    assert_eq!(served.0, 200, "{served:?} {:?}", mock.seen());
    // 4: a pinned profile is used even while it cools.
    let pinned = post(vec![("x-rota-profile", "openai:k1"), ("x-rota-fallbacks", "none")]).await;
    assert_eq!(pinned.0, 200, "{pinned:?}");
    // 5: a chat request served by an Anthropic provider: `seed` has no counterpart.
    let translated = Rota::client()
        .post(format!("{url}/v1/chat/completions"))
        .bearer_auth(&agent_key)
        .json(&json!({"model": "anthropic/claude", "seed": 7, "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(translated.status(), 200);
    let bad_agent = Rota::client()
        .post(format!("{url}/v1/chat/completions"))
        .bearer_auth("rk_wrongwrongwrongwrong")
        .json(&chat())
        .send()
        .await
        .unwrap();
    assert_eq!(bad_agent.status(), 401);

    std::process::Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    let out = tokio::task::spawn_blocking(move || child.wait_with_output().unwrap()).await.unwrap();
    let logs = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(logs.contains("All models failed (2)"), "{logs}");
    assert!(logs.contains("fallback: served by"), "{logs}");
    assert!(
        logs.contains("WARN")
            && logs.contains("dropped fields with no counterpart in the messages format")
            && logs.contains("seed"),
        "{logs}"
    );
    let db = std::fs::read(dir.path().join("rota.db")).unwrap();
    for secret in [KEYS[0].1, KEYS[3].1, ANTHROPIC_KEY.1, &agent_key, "rk_wrongwrongwrongwrong"] {
        let tail = &secret[secret.len() - 10..];
        for (what, hay) in [("logs", &logs), ("answers", &format!("{all_failed:?}{stopped:?}{pinned:?}{served:?}"))] {
            assert!(!hay.contains(tail), "{what} contain a secret ({tail}):\n{hay}");
        }
        assert!(!db.windows(tail.len()).any(|w| w == tail.as_bytes()), "the database holds {tail} in plaintext");
    }
}

/// One fault on the first key of a provider with two keys: which keys the upstream saw, the
/// client's answer, the attempts rows and the first key's usage_stats row.
struct ReasonCase {
    reply: Reply,
    reason: &'static str,
    client_status: u16,
    keys: &'static [usize],
    /// (cooldown_reason, disabled_reason, window length in ms or -1 for "until cleared", cooldown_model set)
    lane: Option<(Option<&'static str>, Option<&'static str>, i64, bool)>,
}

#[tokio::test]
async fn each_reason_has_its_effect_on_keys_answer_attempts_and_stats() {
    let status = |code: u16, body: &str| Reply::Status(code, vec![], body.to_string());
    let cases = [
        ReasonCase {
            reply: status(
                403,
                r#"{"error":{"message":"Your account has been deactivated","type":"permission_error"}}"#,
            ),
            reason: "auth_permanent",
            client_status: 200,
            keys: &[0, 1],
            lane: Some((None, Some("auth_permanent"), -1, false)),
        },
        ReasonCase {
            reply: status(401, r#"{"error":{"message":"Incorrect API key provided","code":"invalid_api_key"}}"#),
            reason: "auth",
            client_status: 200,
            keys: &[0, 1],
            lane: Some((Some("auth"), None, 60_000, false)),
        },
        ReasonCase {
            reply: status(402, r#"{"error":{"message":"Insufficient credits"}}"#),
            reason: "billing",
            client_status: 200,
            keys: &[0, 1],
            lane: Some((None, Some("billing"), 3_600_000, false)),
        },
        ReasonCase {
            reply: status(429, r#"{"error":{"message":"Rate limit reached for gpt-4.1"}}"#),
            reason: "rate_limit",
            client_status: 200,
            keys: &[0, 1],
            lane: Some((Some("rate_limit"), None, 60_000, true)),
        },
        ReasonCase {
            reply: status(500, r#"{"error":{"message":"The server had an error"}}"#),
            reason: "server_error",
            client_status: 200,
            keys: &[0, 0, 1],
            lane: Some((Some("server_error"), None, 60_000, true)),
        },
        ReasonCase {
            reply: Reply::Delay(std::time::Duration::from_secs(4)),
            reason: "timeout",
            client_status: 200,
            keys: &[0, 1],
            lane: Some((Some("timeout"), None, 60_000, true)),
        },
        ReasonCase {
            reply: status(418, "I'm a teapot"),
            reason: "unknown",
            client_status: 418,
            keys: &[0],
            lane: None,
        },
    ];
    for case in cases {
        let (mock, base) = Mock::started().await;
        let rota = spawn(Scenario { config: &config(&base, ""), keys: &KEYS[..2], ..Scenario::default() }).await;
        let retries = if case.reason == "server_error" { 2 } else { 1 };
        mock.script(KEYS[0].1, vec![case.reply.clone(); retries]);
        let r = rota.chat(chat(), &[]).await;
        let name = case.reason;
        assert_eq!(r.status().as_u16(), case.client_status, "{name}");
        let want: Vec<String> = case.keys.iter().map(|i| KEYS[*i].1.to_string()).collect();
        assert_eq!(mock.keys(), want, "{name}: keys seen");
        let attempts = rota.attempts().await;
        assert_eq!(attempts.len(), case.keys.len(), "{name}: {attempts:?}");
        assert!(
            attempts[..attempts.len() - 1]
                .iter()
                .all(|a| a.outcome == "failure" && a.reason.as_deref() == Some(case.reason)),
            "{name}: {attempts:?}"
        );
        let (lane_cool, lane_off, window, model_scoped): (Option<String>, Option<String>, Option<i64>, i64) =
            sqlx::query_as(
                "SELECT cooldown_reason, disabled_reason,
                    COALESCE(cooldown_until, disabled_until) - last_failure_at, cooldown_model IS NOT NULL
             FROM usage_stats WHERE profile_id = 'openai:k1'",
            )
            .fetch_one(rota.pool())
            .await
            .unwrap();
        match case.lane {
            None => {
                assert_eq!((lane_cool, lane_off, window), (None, None, None), "{name}: no cooldown");
                assert_eq!(attempts[0].reason.as_deref(), Some(case.reason));
            }
            Some((cool, off, len, scoped)) => {
                assert_eq!((lane_cool.as_deref(), lane_off.as_deref()), (cool, off), "{name}: lanes");
                assert_eq!(window.unwrap_or(-1), len, "{name}: window length");
                assert_eq!(model_scoped == 1, scoped, "{name}: model scope");
                assert_eq!(attempts.last().unwrap().outcome, "success", "{name}");
                assert_eq!(
                    rota.scalar("SELECT error_count FROM usage_stats WHERE profile_id = 'openai:k1'").await,
                    rota.scalar("SELECT COUNT(*) FROM attempts WHERE profile_id = 'openai:k1' AND outcome = 'failure'")
                        .await,
                    "{name}: every failed call is counted, retries too"
                );
            }
        }
        assert_eq!(rota.scalar("SELECT COUNT(*) FROM requests").await, Some(1), "{name}");
    }
}

#[tokio::test]
async fn network_failure_is_retried_once_then_falls_back() {
    let (mock, base) = Mock::started().await;
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let cfg = config(&base, "")
        .replace(
            "fallbacks = [\"backup/gpt-4.1-mini\"]",
            "fallbacks = [\"backup/gpt-4.1-mini\"]\n[providers.dead]\napi = \"openai\"\nbase_url = \"DEAD/v1\"",
        )
        .replace("DEAD", &dead);
    let rota =
        spawn(Scenario { config: &cfg, keys: &[("dead:d1", "sk-test-dead-0009"), KEYS[3]], ..Scenario::default() })
            .await;
    let r = rota.chat(json!({"model": "dead/gpt-4.1", "messages": []}), &[]).await;
    assert_eq!(r.status(), 200);
    assert_eq!(mock.keys(), [KEYS[3].1]);
    let a = rota.attempts().await;
    assert_eq!(a[0], row("primary", "dead/gpt-4.1", Some("dead:d1"), "failure", Some("network"), None));
    assert_eq!(a[1], row("retry", "dead/gpt-4.1", Some("dead:d1"), "failure", Some("network"), None));
    assert_eq!(a[2].kind, "fallback");
    assert_eq!(rota.scalar("SELECT cooldown_model IS NULL AND cooldown_reason = 'network' FROM usage_stats WHERE profile_id = 'dead:d1'").await, Some(1));
}

#[tokio::test]
async fn agent_fallbacks_replace_the_global_list() {
    let (mock, base) = Mock::started().await;
    let rota = spawn(Scenario {
        config: &config(&base, "[agents.tester]\nfallbacks = []"),
        keys: &[KEYS[0], KEYS[3]],
        ..Scenario::default()
    })
    .await;
    mock.script(KEYS[0].1, vec![Reply::Status(429, vec![], r#"{"error":{"message":"rate limit"}}"#.into())]);
    let r = rota.chat(chat(), &[]).await;
    assert_eq!(r.status(), 429, "no fallback for this agent");
    assert_eq!(mock.keys(), [KEYS[0].1]);
}

#[tokio::test]
async fn upstream_error_event_after_commit_reaches_the_client_once_and_is_classified() {
    let (mock, base) = Mock::started().await;
    let cfg = support::anthropic_provider(&base);
    let rota = spawn(Scenario {
        config: &cfg,
        keys: &[ANTHROPIC_KEY, ("anthropic:spare", "sk-ant-test-0006")],
        ..Scenario::default()
    })
    .await;
    mock.script(ANTHROPIC_KEY.1, vec![Reply::StreamErrorAfterFirst]);
    let text = rota
        .messages(json!({"model": "anthropic/claude-sonnet-4-5", "max_tokens": 10, "stream": true, "messages": []}))
        .await
        .text()
        .await
        .unwrap();
    assert!(text.starts_with("event: message_start"), "{text}");
    assert_eq!(text.matches("event: error").count(), 1, "{text}");
    assert!(text.contains("overloaded_error"), "{text}");
    assert_eq!(mock.seen().len(), 1, "no failover after commit");
    let a = rota.attempts().await;
    assert_eq!((a[0].outcome.as_str(), a[0].reason.as_deref()), ("failure", Some("overloaded")));
    assert_eq!(
        rota.scalar("SELECT cooldown_reason = 'overloaded' FROM usage_stats WHERE profile_id = 'anthropic:main'").await,
        Some(1)
    );
}

#[tokio::test]
async fn agents_created_or_revoked_while_serving_take_effect_within_a_second() {
    let (_mock, base) = Mock::started().await;
    let rota = spawn(Scenario { config: &config(&base, ""), keys: &[KEYS[0]], ..Scenario::default() }).await;
    let key = rota::agents::new_key();
    let plain = secrecy::ExposeSecret::expose_secret(&key).to_string();
    let call = || {
        Rota::client().post(format!("{}/v1/chat/completions", rota.url)).bearer_auth(plain.clone()).json(&chat()).send()
    };
    // Polls until the answer is `want`; returns how long that took.
    let until = |want: u16| async move {
        let started = std::time::Instant::now();
        while call().await.unwrap().status() != want {
            assert!(started.elapsed() < std::time::Duration::from_secs(10), "still not {want}");
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        started.elapsed()
    };
    assert_eq!(call().await.unwrap().status(), 401);
    rota.store.create_agent("late", &rota::agents::digest(&key), false, (&Default::default(), None), 0).await.unwrap();
    let took = until(200).await;
    assert!(took <= std::time::Duration::from_secs(1), "created agent usable after {took:?}");
    rota.store.revoke_agent("late", 1).await.unwrap();
    let took = until(401).await;
    assert!(took <= std::time::Duration::from_secs(1), "revoked agent refused after {took:?}");
}

#[tokio::test]
async fn a_changed_config_file_applies_to_the_next_request_and_a_broken_edit_is_rejected() {
    let (_mock, base) = Mock::started().await;
    let rota = spawn(Scenario {
        config: &config(&base, "[aliases]\nfast = \"openai/gpt-4.1\""),
        keys: &[KEYS[0], KEYS[3]],
        ..Scenario::default()
    })
    .await;
    let fast = || {
        let mut body = chat();
        body["model"] = json!("fast");
        rota.chat(body, &[("x-rota-fallbacks", "none")])
    };
    assert_eq!(fast().await.headers()["x-rota-provider"], "openai");
    let file = rota.dir.path().join("rota.toml");
    let original = std::fs::read_to_string(&file).unwrap();
    // Wait for the served provider to be `want`, polling; fails after 10 s.
    let served_by = |want: &'static str| async move {
        let started = std::time::Instant::now();
        loop {
            let r = fast().await;
            if r.headers()["x-rota-provider"] == want {
                return;
            }
            assert!(started.elapsed() < std::time::Duration::from_secs(10), "never served by {want}");
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    };
    std::fs::write(&file, original.replace("fast = \"openai/gpt-4.1\"", "fast = \"backup/gpt-4.1-mini\"")).unwrap();
    served_by("backup").await;
    // A broken edit (an unknown provider) is rejected: the last good config stays.
    std::fs::write(&file, original.replace("fast = \"openai/gpt-4.1\"", "fast = \"nowhere/x\"")).unwrap();
    tokio::time::sleep(rota::server::reload::SETTLE + rota::server::reload::EVERY * 3).await;
    assert_eq!(fast().await.headers()["x-rota-provider"], "backup");
    std::fs::write(&file, "this is not toml [").unwrap();
    tokio::time::sleep(rota::server::reload::SETTLE + rota::server::reload::EVERY * 3).await;
    let r = fast().await;
    assert_eq!((r.status().as_u16(), r.headers()["x-rota-provider"].to_str().unwrap()), (200, "backup"));
}

#[tokio::test]
async fn metrics_count_the_traffic_sent() {
    let (mock, base) = Mock::started().await;
    let rota =
        spawn(Scenario { config: &config(&base, ""), keys: &[KEYS[0], KEYS[1], KEYS[3]], ..Scenario::default() }).await;
    let busy = || Reply::Status(503, vec![], r#"{"error":{"message":"overloaded"}}"#.into());
    mock.script(
        KEYS[1].1,
        vec![Reply::Status(429, vec![("retry-after", "30".into())], r#"{"error":{"message":"rate limit"}}"#.into())],
    );
    mock.script(KEYS[0].1, vec![Reply::Ok, Reply::Ok, busy(), busy(), busy()]);
    for _ in 0..3 {
        assert_eq!(rota.chat(chat(), &[]).await.status(), 200);
    }
    let r = Rota::client().get(format!("{}/metrics", rota.url)).send().await.unwrap();
    assert!(r.headers()["content-type"].to_str().unwrap().starts_with("application/openmetrics-text"));
    let text = r.text().await.unwrap();
    let has = |line: &str| assert!(text.lines().any(|l| l == line), "missing `{line}` in:\n{text}");
    has(r#"rota_requests_total{agent="tester",api="chat",status="200"} 3"#);
    has(r#"rota_attempts_total{agent="tester",provider="openai",model="gpt-4.1",outcome="success",reason=""} 2"#);
    has(
        r#"rota_attempts_total{agent="tester",provider="openai",model="gpt-4.1",outcome="failure",reason="rate_limit"} 1"#,
    );
    has(
        r#"rota_attempts_total{agent="tester",provider="openai",model="gpt-4.1",outcome="failure",reason="overloaded"} 3"#,
    );
    has(r#"rota_attempts_total{agent="tester",provider="backup",model="gpt-4.1-mini",outcome="success",reason=""} 1"#);
    has(r#"rota_failovers_total{provider="backup"} 1"#);
    has(r#"rota_profiles{provider="openai",state="cooling"} 2"#);
    has(r#"rota_profiles{provider="backup",state="usable"} 1"#);
    has(r#"rota_upstream_latency_seconds_count{provider="openai"} 6"#);
    has(r#"rota_upstream_latency_seconds_count{provider="backup"} 1"#);
    has("rota_gateway_overhead_seconds_count 3");
    let k2_left: i64 = text
        .lines()
        .find_map(|l| l.strip_prefix(r#"rota_profile_cooldown_seconds{profile="openai:k2"} "#))
        .unwrap_or_else(|| panic!("{text}"))
        .parse()
        .unwrap();
    assert!((25..=30).contains(&k2_left), "{k2_left}");
    assert!(text.lines().any(|l| l.starts_with("rota_audit_queue_depth ")), "{text}");
    assert_eq!(mock.seen().len(), 7, "one upstream call per attempt counted above");
}

// -- streams: every event, whatever the chunking; cut streams; timings; deadline; redirects -------

/// The events of an SSE body, with `created` (the translator's clock) left out.
fn events_of(text: &str) -> Vec<(Option<String>, String)> {
    let mut split = rota::gateway::translate::sse::Splitter::default();
    let evs = split.push(text.as_bytes());
    assert!(split.rest().is_empty(), "half an event reached the client: {text}");
    evs.into_iter()
        .map(|e| {
            let data = match serde_json::from_str::<Value>(&e.data) {
                Ok(mut v) => {
                    v.as_object_mut().map(|o| o.remove("created"));
                    v.to_string()
                }
                Err(_) => e.data,
            };
            (e.name, data)
        })
        .collect()
}

fn streaming(mut body: Value, model: &str) -> Value {
    body["model"] = json!(model);
    body["stream"] = json!(true);
    body["max_tokens"] = json!(16);
    body
}

#[tokio::test]
async fn every_event_reaches_the_client_whatever_the_upstream_chunking() {
    let (mock, base) = Mock::started().await;
    let rota =
        spawn(Scenario { config: &config(&base, ""), keys: &[KEYS[0], ANTHROPIC_KEY], ..Scenario::default() }).await;
    let chat_req = |model: &str| streaming(chat(), model);
    let messages_req = |model: &str| streaming(json!({"messages": [{"role": "user", "content": "hi"}]}), model);
    // (upstream key, client API, model, the upstream's recorded stream)
    let cases = [
        (KEYS[0].1, "chat", "openai/gpt-4.1", "openai-chat-text"),
        (KEYS[0].1, "chat", "openai/gpt-4.1", "openai-chat-tool"),
        (KEYS[0].1, "chat", "openai/gpt-4.1", "openai-chat-preamble"),
        (KEYS[0].1, "messages", "openai/gpt-4.1", "openai-chat-text"),
        (KEYS[0].1, "messages", "openai/gpt-4.1", "openai-chat-tool"),
        (ANTHROPIC_KEY.1, "messages", "anthropic/claude-sonnet-4-5", "anthropic-text"),
        (ANTHROPIC_KEY.1, "messages", "anthropic/claude-sonnet-4-5", "anthropic-thinking"),
        (ANTHROPIC_KEY.1, "chat", "anthropic/claude-sonnet-4-5", "anthropic-text"),
        (ANTHROPIC_KEY.1, "chat", "anthropic/claude-sonnet-4-5", "anthropic-tool"),
    ];
    for (key, api, model, name) in cases {
        let upstream = recorded(name);
        let mut seen = Vec::new();
        for how in [Writes::Whole, Writes::PerEvent, Writes::Bytes(5), Writes::Bytes(1)] {
            mock.script(key, vec![Reply::Raw(upstream.clone(), how)]);
            let r = if api == "chat" {
                rota.chat(chat_req(model), &[]).await
            } else {
                rota.messages(messages_req(model)).await
            };
            assert_eq!(r.status(), 200, "{name} {how:?}");
            let text = r.text().await.unwrap();
            let passthrough = (api == "chat") == model.starts_with("openai");
            if passthrough {
                assert_eq!(text, upstream, "{name} written {how:?} passes through unchanged");
            }
            seen.push((how, events_of(&text)));
        }
        let (_, first) = &seen[0];
        let last = &first.last().unwrap().1;
        assert!(last == "[DONE]" || last.contains("message_stop"), "{name} → {api}: ends cleanly: {first:?}");
        for (how, evs) in &seen[1..] {
            assert_eq!(evs, first, "{name} → {api}: written {how:?}, the client's events are those of one write");
        }
    }
    let a = rota.attempts().await;
    assert!(a.iter().all(|r| r.outcome == "success"), "{a:?}");
}

#[tokio::test]
async fn a_stream_cut_before_its_terminal_event_fails_with_an_in_band_error_and_no_clean_end() {
    let (mock, base) = Mock::started().await;
    let rota =
        spawn(Scenario { config: &config(&base, ""), keys: &[KEYS[0], ANTHROPIC_KEY], ..Scenario::default() }).await;
    let anthropic = recorded("anthropic-truncated");
    let chat_cut = recorded("openai-chat-truncated");
    let responses_cut = recorded("openai-responses-truncated");
    // The last event cut in the middle, too.
    let mid_event = &recorded("anthropic-text")[..700];
    let cases: [(&str, &str, &str, String); 5] = [
        (ANTHROPIC_KEY.1, "messages", "anthropic/claude-sonnet-4-5", anthropic.clone()),
        (ANTHROPIC_KEY.1, "messages", "anthropic/claude-sonnet-4-5", mid_event.to_string()),
        (ANTHROPIC_KEY.1, "chat", "anthropic/claude-sonnet-4-5", anthropic),
        (KEYS[0].1, "chat", "openai/gpt-4.1", chat_cut),
        (KEYS[0].1, "responses", "openai/gpt-4.1", responses_cut),
    ];
    for (i, (key, api, model, body)) in cases.into_iter().enumerate() {
        // Each cut cools its profile (`network`): start each case from a usable one.
        for p in ["openai:k1", "anthropic:main"] {
            assert_eq!(
                rota.api("POST", &format!("/api/v1/profiles/{p}/clear"), Some(&rota.admin_key), None).await.0,
                200
            );
        }
        mock.script(key, vec![Reply::Raw(body, Writes::Whole)]);
        let req = match api {
            "responses" => json!({"model": model, "input": "hi", "stream": true}),
            _ => streaming(chat(), model),
        };
        let r = match api {
            "chat" => rota.chat(req, &[]).await,
            "messages" => rota.messages(req).await,
            _ => Rota::client()
                .post(format!("{}/v1/responses", rota.url))
                .bearer_auth(&rota.agent_key)
                .json(&req)
                .send()
                .await
                .unwrap(),
        };
        assert_eq!(r.status(), 200, "case {i}: committed before the cut");
        let text = r.text().await.unwrap();
        let evs = events_of(&text);
        let (name, data) = evs.last().unwrap();
        let in_band = match api {
            "chat" => name.is_none() && data.contains("\"error\"") && data.contains("upstream stream failed"),
            _ => name.as_deref() == Some("error") && data.contains("upstream stream failed"),
        };
        assert!(in_band, "case {i} ({api}): ends with rota's in-band error: {text}");
        let clean = |(name, data): &(Option<String>, String)| {
            data == "[DONE]" || matches!(name.as_deref(), Some("message_stop" | "response.completed"))
        };
        assert!(!evs.iter().any(clean), "case {i}: no clean end: {text}");
    }
    let a = rota.attempts().await;
    assert_eq!(a.len(), 5);
    assert!(a.iter().all(|r| r.outcome == "failure" && r.reason.as_deref() == Some("network")), "{a:?}");
    let errors: Vec<String> =
        sqlx::query_scalar("SELECT error FROM attempts ORDER BY started_at, seq").fetch_all(rota.pool()).await.unwrap();
    assert!(errors[1].contains("in the middle of an event"), "{errors:?}");
    assert!(errors[0].contains("before its terminal event `message_stop`"), "{errors:?}");
}

#[tokio::test]
async fn an_anthropic_error_after_message_start_fails_over_and_the_client_sees_only_the_next_stream() {
    let (mock, base) = Mock::started().await;
    let cfg = support::anthropic_provider(&base);
    let rota = spawn(Scenario {
        config: &cfg,
        keys: &[("anthropic:a", "sk-ant-test-000a"), ("anthropic:b", "sk-ant-test-000b")],
        ..Scenario::default()
    })
    .await;
    let served = recorded("anthropic-text");
    // The first profile's stream: `message_start`, a `ping`, then `overloaded_error`, in one write.
    mock.script("sk-ant-test-000a", vec![Reply::Raw(recorded("anthropic-error-before-content"), Writes::Whole); 3]);
    mock.script("sk-ant-test-000b", vec![Reply::Raw(served.clone(), Writes::PerEvent)]);
    let r = rota.messages(streaming(json!({"messages": []}), "anthropic/claude-sonnet-4-5")).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-rota-profile"], "anthropic:b");
    assert_eq!(r.text().await.unwrap(), served, "only the second profile's stream, byte for byte");
    let a = rota.attempts().await;
    let kinds: Vec<(&str, &str, Option<&str>)> =
        a.iter().map(|r| (r.kind.as_str(), r.outcome.as_str(), r.reason.as_deref())).collect();
    assert_eq!(
        kinds,
        [
            ("primary", "failure", Some("overloaded")),
            ("retry", "failure", Some("overloaded")),
            ("retry", "failure", Some("overloaded")),
            ("rotate", "success", None)
        ]
    );
}

#[tokio::test]
async fn attempt_timings_run_from_the_moment_the_request_is_sent() {
    let (mock, base) = Mock::started().await;
    let rota = spawn(Scenario { config: &config(&base, ""), keys: &[KEYS[0]], ..Scenario::default() }).await;
    let first = std::time::Duration::from_millis(300);
    mock.script(KEYS[0].1, vec![Reply::SlowStream { first, total: std::time::Duration::from_millis(600) }]);
    let text = rota.chat(streaming(chat(), "openai/gpt-4.1"), &[]).await.text().await.unwrap();
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    mock.script(KEYS[0].1, vec![Reply::Delay(std::time::Duration::from_millis(200))]);
    assert_eq!(rota.chat(chat(), &[]).await.status(), 200);
    rota.flush().await;
    let rows: Vec<(i64, Option<i64>, Option<i64>)> =
        sqlx::query_as("SELECT stream, ttfb_ms, attempts.duration_ms FROM attempts JOIN requests ON requests.id = request_id ORDER BY attempts.started_at")
            .fetch_all(rota.pool())
            .await
            .unwrap();
    let (stream, ttfb, duration) = rows[0];
    assert_eq!(stream, 1);
    assert!(ttfb.unwrap() >= 300 && duration.unwrap() >= 600, "stream: ttfb {ttfb:?}, duration {duration:?}");
    let (stream, ttfb, duration) = rows[1];
    assert_eq!(stream, 0);
    assert!(
        ttfb.unwrap() >= 200 && duration.unwrap() >= ttfb.unwrap(),
        "buffered: ttfb {ttfb:?}, duration {duration:?}"
    );
}

#[tokio::test]
async fn the_request_deadline_stops_the_walk_and_leaves_untried_profiles_alone() {
    let (mock, base) = Mock::started().await;
    let extra = "[providers.third]\napi = \"openai\"\nbase_url = \"BASE/v1\"\n".replace("BASE", &base);
    let cfg = config(&base, &format!("total = \"2s\"\n{extra}")).replace(
        "fallbacks = [\"backup/gpt-4.1-mini\"]",
        "fallbacks = [\"backup/gpt-4.1-mini\", \"third/gpt-4.1-nano\"]",
    );
    let rota = spawn(Scenario {
        config: &cfg,
        keys: &[KEYS[0], KEYS[3], ("third:t1", "sk-test-third-0007")],
        ..Scenario::default()
    })
    .await;
    let slow = || Reply::SlowStatus(std::time::Duration::from_millis(1500), 500);
    for key in [KEYS[0].1, KEYS[3].1, "sk-test-third-0007"] {
        mock.script(key, vec![slow(), slow(), slow()]);
    }
    let started = std::time::Instant::now();
    let r = rota.chat(chat(), &[]).await;
    let took = started.elapsed();
    assert_eq!(r.status(), 504);
    assert!(took < std::time::Duration::from_millis(2800), "answered at the deadline: {took:?}");
    let v: Value = r.json().await.unwrap();
    let message = v["error"]["message"].as_str().unwrap();
    assert!(message.contains("2s limit (timeouts.total) after 2 attempt(s)"), "{message}");
    assert!(message.contains("openai/gpt-4.1 via openai:k1: server_error"), "{message}");
    // The first call failed (500) and was retried; the deadline cut the retry. No other profile
    // was called: no row, no stats.
    let a = rota.attempts().await;
    assert_eq!(
        a,
        [
            row("primary", "openai/gpt-4.1", Some("openai:k1"), "failure", Some("server_error"), Some(500)),
            row("retry", "openai/gpt-4.1", Some("openai:k1"), "failure", Some("timeout"), None),
        ]
    );
    assert_eq!(mock.keys(), [KEYS[0].1, KEYS[0].1]);
    let touched: Vec<(String, Option<i64>, Option<i64>, i64)> = sqlx::query_as(
        "SELECT profile_id, last_used, cooldown_until, error_count FROM usage_stats WHERE last_used IS NOT NULL OR error_count > 0 OR cooldown_until IS NOT NULL",
    )
    .fetch_all(rota.pool())
    .await
    .unwrap();
    assert_eq!(touched.len(), 1, "{touched:?}");
    assert_eq!(
        (touched[0].0.as_str(), touched[0].2, touched[0].3),
        ("openai:k1", None, 1),
        "the 500 is counted; the cut call is not the profile's fault and opens no window"
    );
    assert_eq!(rota.scalar("SELECT status FROM requests").await, Some(504));
}

#[tokio::test]
async fn failover_disabled_serves_the_first_choice_only() {
    let (mock, base) = Mock::started().await;
    let rota =
        spawn(Scenario { config: &config(&base, "[failover]\nenabled = false\n"), keys: &KEYS, ..Scenario::default() })
            .await;
    let body = r#"{"error":{"message":"The server is overloaded","type":"server_error"}}"#;
    mock.script(KEYS[0].1, vec![Reply::Status(503, vec![], body.into())]);
    let r = rota.chat(chat(), &[]).await;
    assert_eq!(r.status(), 503);
    assert_eq!(r.text().await.unwrap(), body, "the upstream's own answer");
    assert_eq!(mock.keys(), [KEYS[0].1], "one upstream call: no retry, rotation or fallback");
    let a = rota.attempts().await;
    assert_eq!(a, [row("primary", "openai/gpt-4.1", Some("openai:k1"), "failure", Some("overloaded"), Some(503))]);
}

#[tokio::test]
async fn an_upstream_redirect_is_never_followed() {
    let (mock, base) = Mock::started().await;
    let (elsewhere, other) = Mock::started().await;
    let cfg = support::anthropic_provider(&base);
    let rota = spawn(Scenario {
        config: &cfg,
        keys: &[("anthropic:a", "sk-ant-test-000a"), ("anthropic:b", "sk-ant-test-000b")],
        ..Scenario::default()
    })
    .await;
    let location = format!("{other}/v1/messages");
    let redirect = Reply::Status(307, vec![("location", location.clone())], String::new());
    // A redirect is a server error: retried once, then the next profile.
    mock.script("sk-ant-test-000a", vec![redirect.clone(), redirect]);
    let r = rota.messages(json!({"model": "anthropic/claude-sonnet-4-5", "max_tokens": 10, "messages": []})).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-rota-profile"], "anthropic:b");
    assert!(elsewhere.seen().is_empty(), "the other host saw: {:?}", elsewhere.seen());
    let a = rota.attempts().await;
    assert_eq!(a[0].outcome, "failure");
    assert_eq!((a[0].reason.as_deref(), a[0].status), (Some("server_error"), Some(307)));
    let error: String =
        sqlx::query_scalar("SELECT error FROM attempts WHERE seq = 1").fetch_one(rota.pool()).await.unwrap();
    assert!(
        error.contains(&format!("redirecting to {location}")) && error.contains("does not follow redirects"),
        "{error}"
    );
}

// -- OAuth: a 401 refreshes the token once and retries the same profile ---------------------------

fn oauth_config(base: &str) -> String {
    format!("{}[auth.order]\ncorp = [\"corp:alice\", \"corp:spare\"]\n", crate::support::oauth_provider(base))
}

/// rota with an OAuth profile `corp:alice` (access `at-old-0001`, refused once with a 401) in
/// front of an API key `corp:spare`; the mock's token endpoint grants `at-new-0001`.
async fn oauth_rota() -> (Mock, Rota) {
    let (mock, base) = Mock::started().await;
    let oauth = [("corp:alice", "at-old-0001", "rt-old-0001")];
    let rota = spawn(Scenario {
        config: &oauth_config(&base),
        keys: &[("corp:spare", "sk-corp-spare-0002")],
        oauth: &oauth,
        ..Scenario::default()
    })
    .await;
    mock.script("at-old-0001", vec![Reply::Status(401, vec![], EXPIRED.into())]);
    (mock, rota)
}

const EXPIRED: &str = r#"{"error":{"message":"Invalid authentication credentials","type":"invalid_request_error"}}"#;

#[tokio::test]
async fn a_401_on_an_oauth_profile_refreshes_once_and_retries_the_same_profile() {
    let (mock, rota) = oauth_rota().await;
    let r = rota.chat(json!({"model": "corp/m", "messages": [{"role": "user", "content": "hi"}]}), &[]).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-rota-profile"], "corp:alice", "the same profile, with its new token");
    assert_eq!(mock.token_calls(), 1, "one refresh at the IdP");
    assert_eq!(mock.keys(), ["at-old-0001", "at-new-0001"]);
    let a = rota.attempts().await;
    assert_eq!(
        a,
        [
            row("primary", "corp/m", Some("corp:alice"), "failure", Some("auth"), Some(401)),
            row("retry", "corp/m", Some("corp:alice"), "success", None, Some(200)),
        ]
    );
    assert_eq!(rota.scalar("SELECT COUNT(*) FROM usage_stats WHERE cooldown_until IS NOT NULL").await, Some(0));
}

#[tokio::test]
async fn a_second_401_after_the_refresh_rotates_to_the_next_profile() {
    let (mock, rota) = oauth_rota().await;
    mock.script("at-new-0001", vec![Reply::Status(401, vec![], EXPIRED.into())]);
    let r = rota.chat(json!({"model": "corp/m", "messages": [{"role": "user", "content": "hi"}]}), &[]).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-rota-profile"], "corp:spare");
    assert_eq!(mock.token_calls(), 1, "no second refresh in the same request");
    assert_eq!(mock.keys(), ["at-old-0001", "at-new-0001", "sk-corp-spare-0002"]);
    let a = rota.attempts().await;
    assert_eq!(
        a,
        [
            row("primary", "corp/m", Some("corp:alice"), "failure", Some("auth"), Some(401)),
            row("retry", "corp/m", Some("corp:alice"), "failure", Some("auth"), Some(401)),
            row("rotate", "corp/m", Some("corp:spare"), "success", None, Some(200)),
        ]
    );
    assert_eq!(
        rota.scalar("SELECT cooldown_reason = 'auth' FROM usage_stats WHERE profile_id = 'corp:alice'").await,
        Some(1),
        "the refreshed token refused too: the profile cools"
    );
}

#[tokio::test]
async fn a_model_cooldown_ends_on_an_admin_clear_and_on_a_success_of_that_model() {
    let (mock, base) = Mock::started().await;
    let rota = spawn(Scenario { config: &config(&base, ""), keys: &[KEYS[0], KEYS[3]], ..Scenario::default() }).await;
    let gone = r#"{"error":{"message":"The model `gpt-4.1` does not exist or you do not have access to it.","code":"model_not_found"}}"#;
    let cooling = "SELECT COUNT(*) FROM model_cooldowns WHERE model = 'gpt-4.1' AND cooldown_until > CAST(unixepoch('subsec') * 1000 AS INTEGER)";
    mock.script(KEYS[0].1, vec![Reply::Status(404, vec![], gone.into())]);
    assert_eq!(rota.chat(chat(), &[]).await.headers()["x-rota-provider"], "backup");
    assert_eq!(rota.scalar(cooling).await, Some(1));

    // An admin ends it: the next request goes to openai again, without a skip.
    let clear = |model: &str| json!({"model": model});
    let (code, v) =
        rota.api("POST", "/api/v1/models/clear", Some(&rota.admin_key), Some(clear("openai/gpt-4.1"))).await;
    assert_eq!((code, v["cleared"].as_bool()), (200, Some(true)), "{v}");
    assert_eq!(rota.scalar(cooling).await, Some(0));
    let r = rota.chat(chat(), &[]).await;
    assert_eq!(
        (r.headers()["x-rota-provider"].to_str().unwrap(), r.headers()["x-rota-attempts"].to_str().unwrap()),
        ("openai", "1")
    );
    let (code, v) =
        rota.api("POST", "/api/v1/models/clear", Some(&rota.admin_key), Some(clear("openai/gpt-4.1"))).await;
    assert_eq!((code, v["cleared"].as_bool()), (200, Some(false)), "nothing left to clear: {v}");
    let (code, _) =
        rota.api("POST", "/api/v1/models/clear", Some(&rota.admin_key), Some(clear("nowhere/gpt-4.1"))).await;
    assert_eq!(code, 404);
    let (code, _) = rota.api("POST", "/api/v1/models/clear", Some(&rota.admin_key), Some(clear("gpt-4.1"))).await;
    assert_eq!(code, 400);
    let long = format!("openai/{}", "m".repeat(1_500_000));
    let (code, v) = rota.api("POST", "/api/v1/models/clear", Some(&rota.admin_key), Some(clear(&long))).await;
    assert_eq!(code, 400, "bounded like every model name");
    assert!(v.to_string().contains("longer than 256 bytes"), "{v}");
    let (_, actions) = rota.api("GET", "/api/v1/admin-actions", Some(&rota.admin_key), None).await;
    assert!(actions.to_string().len() < 10_000, "nothing of it recorded");
    assert_eq!(
        rota.api("POST", "/api/v1/models/clear", Some(&rota.agent_key), Some(clear("openai/gpt-4.1"))).await.0,
        403
    );

    // A success of the model ends it too: the model is back (the last candidate is always tried).
    mock.script(KEYS[0].1, vec![Reply::Status(404, vec![], gone.into())]);
    assert_eq!(rota.chat(chat(), &[]).await.headers()["x-rota-provider"], "backup");
    assert_eq!(rota.scalar(cooling).await, Some(1));
    let r = rota.chat(chat(), &[("x-rota-fallbacks", "none")]).await;
    assert_eq!((r.status().as_u16(), r.headers()["x-rota-provider"].to_str().unwrap()), (200, "openai"));
    assert_eq!(rota.scalar(cooling).await, Some(0), "a success of the model ends its cooldown");
}

#[tokio::test]
async fn concurrent_model_not_found_answers_escalate_the_model_cooldown_once() {
    let (mock, base) = Mock::started().await;
    let rota = spawn(Scenario { config: &config(&base, ""), keys: &[KEYS[0], KEYS[3]], ..Scenario::default() }).await;
    let gone = r#"{"error":{"message":"The model `gpt-4.1` does not exist or you do not have access to it.","code":"model_not_found"}}"#;
    // Eight requests in flight together, each answered 404 after the same short delay.
    let late_404 = Reply::After(std::time::Duration::from_millis(300), Box::new(Reply::Echo(404, gone)));
    mock.script(KEYS[0].1, vec![late_404; 8]);
    let calls: Vec<_> = (0..8).map(|_| rota.chat(chat(), &[])).collect();
    for r in futures_util::future::join_all(calls).await {
        assert_eq!(r.status(), 200);
    }
    let in_flight = mock.keys().iter().filter(|k| *k == KEYS[0].1).count();
    assert_eq!(in_flight, 8, "all eight were in flight before the first 404");
    // Calls already in flight when the window opened do not escalate it.
    let escalations = rota.scalar("SELECT error_count FROM model_cooldowns WHERE model = 'gpt-4.1'").await;
    assert_eq!(escalations, Some(1), "one window, one step: a 1 minute cooldown, not 1 hour");
}

#[tokio::test]
async fn usage_stats_show_an_ended_window_reset_without_waiting_for_the_next_failure() {
    let (mock, base) = Mock::started().await;
    let rota = spawn(Scenario { config: &config(&base, ""), keys: &[KEYS[0], KEYS[1]], ..Scenario::default() }).await;
    let throttled = r#"{"error":{"message":"Rate limit reached","type":"rate_limit_error"}}"#;
    mock.script(KEYS[0].1, vec![Reply::Status(429, vec![("retry-after", "1".into())], throttled.into())]);
    assert_eq!(rota.chat(chat(), &[]).await.status(), 200);
    let row = "SELECT (cooldown_until IS NOT NULL) * 100 + error_count * 10 + failure_total FROM usage_stats WHERE profile_id = 'openai:k1'";
    assert_eq!(rota.scalar(row).await, Some(111), "cooling, one error counted");
    // No request touches openai:k1 again; an auditor reading after the window ended sees it reset.
    tokio::time::sleep(std::time::Duration::from_millis(2300)).await;
    assert_eq!(rota.scalar(row).await, Some(1), "window and counters reset; the lifetime total stays");
    assert_eq!(
        rota.scalar("SELECT failure_counts = '{}' FROM usage_stats WHERE profile_id = 'openai:k1'").await,
        Some(1)
    );
}

#[tokio::test]
async fn two_models_cooling_on_one_profile_leave_a_third_model_served_by_it() {
    let (mock, base) = Mock::started().await;
    let rota = spawn(Scenario { config: &config(&base, ""), keys: &[KEYS[0], KEYS[3]], ..Scenario::default() }).await;
    let limited = || Reply::Status(429, vec![], r#"{"error":{"message":"Rate limit reached for requests"}}"#.into());
    let ask =
        |model: &str| json!({"model": format!("openai/{model}"), "messages": [{"role": "user", "content": "hi"}]});
    for model in ["gpt-4.1", "gpt-4.1-mini"] {
        mock.script(KEYS[0].1, vec![limited()]);
        assert_eq!(rota.chat(ask(model), &[("x-rota-fallbacks", "none")]).await.status(), 429, "{model}");
    }
    // With a fallback in the chain, a blocked o3 would be skipped for backup/gpt-4.1-mini.
    let r = rota.chat(ask("o3"), &[]).await;
    assert_eq!(r.status(), 200, "a healthy third model is not blocked");
    assert_eq!(mock.keys(), [KEYS[0].1; 3]);
    let last = rota.attempts().await.pop().unwrap();
    assert_eq!(last, row("primary", "openai/o3", Some("openai:k1"), "success", None, Some(200)));

    // Two windows in the table; usage_stats shows the one that ends last, still model-scoped.
    rota.flush().await;
    let windows: Vec<(String, String, i64)> = sqlx::query_as(
        "SELECT model, cooldown_reason, step FROM profile_cooldowns WHERE profile_id = 'openai:k1' ORDER BY model",
    )
    .fetch_all(rota.pool())
    .await
    .unwrap();
    assert_eq!(windows, [("gpt-4.1".into(), "rate_limit".into(), 1), ("gpt-4.1-mini".into(), "rate_limit".into(), 1)]);
    assert_eq!(
        rota.scalar("SELECT cooldown_model = 'gpt-4.1-mini' FROM usage_stats WHERE profile_id = 'openai:k1'").await,
        Some(1)
    );

    // The admin API lists both windows.
    let v: Value = Rota::client()
        .get(format!("{}/api/v1/profiles/openai:k1", rota.url))
        .bearer_auth(&rota.admin_key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["status"]["state"], "cooling");
    let models: Vec<&str> =
        v["status"]["windows"].as_array().unwrap().iter().map(|w| w["model"].as_str().unwrap()).collect();
    assert_eq!(models, ["gpt-4.1-mini", "gpt-4.1"]);
    assert!(v["status_text"].as_str().unwrap().contains("; gpt-4.1 until"), "{v}");
}

#[tokio::test]
async fn context_overflow_moves_to_the_context_fallbacks_instead_of_the_chain() {
    let (mock, base) = Mock::started().await;
    let extra = r#"
[models.context_fallbacks]
"openai/gpt-4.1" = ["openai/o3"]
"#;
    let rota =
        spawn(Scenario { config: &config(&base, extra), keys: &[KEYS[0], KEYS[1], KEYS[3]], ..Scenario::default() })
            .await;
    let overflow = |n: u32| {
        let body = format!(
            r#"{{"error":{{"message":"This model's maximum context length is {n} tokens","code":"context_length_exceeded"}}}}"#
        );
        Reply::Status(400, vec![], body)
    };
    mock.script(KEYS[0].1, vec![overflow(128_000)]);
    let r = rota.chat(chat(), &[]).await;
    assert_eq!(r.status(), 200, "served by the model with the larger window");
    assert_eq!(r.headers()["x-rota-model"], "o3");
    let seen: Vec<(String, String)> = mock.seen().into_iter().map(|s| (s.key, s.model)).collect();
    assert_eq!(
        seen,
        [(KEYS[0].1.to_string(), "gpt-4.1".to_string()), (KEYS[1].1.to_string(), "o3".to_string())],
        "the context fallback replaces the rest of the chain: backup/gpt-4.1-mini is not tried"
    );
    assert_eq!(
        rota.attempts().await,
        [
            row("primary", "openai/gpt-4.1", Some("openai:k1"), "failure", Some("context_overflow"), Some(400)),
            row("fallback", "openai/o3", Some("openai:k2"), "success", None, Some(200)),
        ]
    );
    assert_eq!(rota.scalar("SELECT COUNT(*) FROM profile_cooldowns").await, Some(0), "no cooldown");

    // The larger model overflows too and has no context fallback of its own: its error is
    // returned as it came, as without context_fallbacks.
    mock.unscript();
    mock.script(KEYS[0].1, vec![overflow(128_000)]);
    mock.script(KEYS[1].1, vec![overflow(200_000)]);
    let r = rota.chat(chat(), &[]).await;
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["message"], "This model's maximum context length is 200000 tokens");
}

#[tokio::test]
async fn each_answer_is_priced_to_the_micro_dollar_and_an_unpriced_one_is_null_on_sqlite() {
    each_answer_is_priced(Db::Sqlite).await;
}

#[tokio::test]
async fn each_answer_is_priced_to_the_micro_dollar_and_an_unpriced_one_is_null_on_postgres() {
    each_answer_is_priced(Db::Postgres(support::postgres_database().await)).await;
}

/// Each answer's tokens priced as the upstream reported them, in the bytes OpenAI and Anthropic
/// send (buffered and streamed, with cache reads and writes): the rows' cost is price × tokens
/// to the micro-dollar; a failed attempt, a cut stream and a model with no price cost NULL.
async fn each_answer_is_priced(db: Db) {
    let (mock, base) = Mock::started().await;
    let pg = match &db {
        Db::Postgres(url) => Some(sqlx::PgPool::connect(url).await.unwrap()),
        Db::Sqlite => None,
    };
    let prices = "[prices]\n\"backup/gpt-4.1-mini\" = { input = 1, output = 2 }\n";
    let keys = [KEYS[0], KEYS[1], KEYS[3], ANTHROPIC_KEY];
    let rota = spawn(Scenario { config: &config(&base, prices), keys: &keys, db, ..Scenario::default() }).await;
    let limited = Reply::Status(429, vec![], r#"{"error":{"message":"Rate limit reached"}}"#.into());
    let chat_answer = r#"{"id":"chatcmpl-2","object":"chat.completion","created":1741569952,"model":"gpt-4.1-2025-04-14","choices":[{"index":0,"message":{"role":"assistant","content":"Hi","refusal":null,"annotations":[]},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":2006,"completion_tokens":300,"total_tokens":2306,"prompt_tokens_details":{"cached_tokens":1920,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":0,"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}},"service_tier":"default","system_fingerprint":"fp_b8bc95a0ac"}"#;
    let chunk = |choices: &str| {
        format!(
            "data: {{\"id\":\"chatcmpl-3\",\"object\":\"chat.completion.chunk\",\"created\":1741569952,\"model\":\"gpt-4.1-2025-04-14\",\"service_tier\":\"default\",\"system_fingerprint\":\"fp_b8bc95a0ac\",\"choices\":{choices},\"usage\":null}}\n\n"
        )
    };
    let chat_stream = [
        chunk(r#"[{"index":0,"delta":{"role":"assistant","content":"","refusal":null},"logprobs":null,"finish_reason":null}]"#),
        chunk(r#"[{"index":0,"delta":{"content":"Hi"},"logprobs":null,"finish_reason":null}]"#),
        chunk(r#"[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}]"#),
        "data: {\"id\":\"chatcmpl-3\",\"object\":\"chat.completion.chunk\",\"created\":1741569952,\"model\":\"gpt-4.1-2025-04-14\",\"service_tier\":\"default\",\"system_fingerprint\":\"fp_b8bc95a0ac\",\"choices\":[],\"usage\":{\"prompt_tokens\":1200,\"completion_tokens\":50,\"total_tokens\":1250,\"prompt_tokens_details\":{\"cached_tokens\":1024,\"audio_tokens\":0},\"completion_tokens_details\":{\"reasoning_tokens\":0,\"audio_tokens\":0,\"accepted_prediction_tokens\":0,\"rejected_prediction_tokens\":0}}}\n\n".into(),
        "data: [DONE]\n\n".into(),
    ]
    .concat();
    let messages_answer = r#"{"id":"msg_01","type":"message","role":"assistant","model":"claude-sonnet-4-5-20250929","content":[{"type":"text","text":"Hi"}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":50,"cache_creation_input_tokens":1000,"cache_read_input_tokens":2000,"cache_creation":{"ephemeral_5m_input_tokens":1000,"ephemeral_1h_input_tokens":0},"output_tokens":120,"service_tier":"standard"}}"#;
    let messages_stream = concat!(
        "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_02\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"claude-haiku-4-5-20251001\",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":7,\"cache_creation_input_tokens\":0,\"cache_read_input_tokens\":4000,\"cache_creation\":{\"ephemeral_5m_input_tokens\":0,\"ephemeral_1h_input_tokens\":0},\"output_tokens\":1,\"service_tier\":\"standard\"}}}\n\n",
        "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
        "event: ping\ndata: {\"type\": \"ping\"}\n\n",
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\n\n",
        "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
        "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":33}}\n\n",
        "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
    );
    let ok = |body: &str| Reply::Status(200, vec![], body.to_string());
    mock.script(KEYS[0].1, vec![limited]);
    mock.script(KEYS[1].1, vec![ok(chat_answer), Reply::Raw(chat_stream, Writes::PerEvent)]);
    mock.script(
        ANTHROPIC_KEY.1,
        vec![ok(messages_answer), Reply::Raw(messages_stream.into(), Writes::Bytes(7)), Reply::StreamBreakAfterFirst],
    );

    let chat = |model: &str| json!({"model": model, "messages": [{"role": "user", "content": "hi"}]});
    // 1. k1 answers 429, k2 serves: 86 × $2 + 1,920 cached × $0.50 + 300 × $8 = 3,532 µ$.
    assert_eq!(rota.chat(chat("openai/gpt-4.1"), &[]).await.status(), 200);
    // 2. A dated name, streamed with its usage: 176 × $2 + 1,024 × $0.50 + 50 × $8 = 1,264 µ$.
    let mut stream = streaming(chat("openai/gpt-4.1-2025-04-14"), "openai/gpt-4.1-2025-04-14");
    stream["stream_options"] = json!({"include_usage": true});
    let text = rota.chat(stream, &[("x-rota-profile", "openai:k2")]).await.text().await.unwrap();
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    // 3. Anthropic, dated: 50 × $3 + 1,000 written × $3.75 + 2,000 read × $0.30 + 120 × $15 = 6,300 µ$.
    let messages =
        |model: &str| json!({"model": model, "max_tokens": 200, "messages": [{"role": "user", "content": "hi"}]});
    assert_eq!(rota.messages(messages("anthropic/claude-sonnet-4-5-20250929")).await.status(), 200);
    // 4. Streamed, in 7-byte writes: 7 × $1 + 4,000 read × $0.10 + 33 × $5 = 572 µ$.
    let text = rota.messages(streaming(messages(""), "anthropic/claude-haiku-4-5")).await.text().await.unwrap();
    assert!(text.ends_with("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"), "{text}");
    // 5. No price for gpt-9; 6. the config's price for backup/gpt-4.1-mini: 3 × $1 + 2 × $2.
    assert_eq!(rota.chat(chat("openai/gpt-9"), &[]).await.status(), 200);
    assert_eq!(rota.chat(chat("backup/gpt-4.1-mini"), &[]).await.status(), 200);
    // 7. A stream cut after its first content: its usage is not final, its cost unknown.
    let text = rota.messages(streaming(messages(""), "anthropic/claude-sonnet-4-5")).await.text().await.unwrap();
    assert!(text.contains("upstream stream failed"), "{text}");
    rota.flush().await;

    type Spent = (String, String, Option<i64>, Option<i64>, Option<f64>);
    let sql = "SELECT provider || '/' || model, outcome, tokens_in, tokens_out, cost FROM attempts
               ORDER BY started_at, request_id, seq";
    let attempts: Vec<Spent> = match &pg {
        Some(pool) => sqlx::query_as(sql).fetch_all(pool).await.unwrap(),
        None => sqlx::query_as(sql).fetch_all(rota.pool()).await.unwrap(),
    };
    let spent = |model: &str, outcome: &str, io: Option<(i64, i64)>, cost: Option<f64>| {
        (model.to_string(), outcome.to_string(), io.map(|t| t.0), io.map(|t| t.1), cost)
    };
    assert_eq!(
        attempts,
        [
            spent("openai/gpt-4.1", "failure", None, None),
            spent("openai/gpt-4.1", "success", Some((2006, 300)), Some(0.003532)),
            spent("openai/gpt-4.1-2025-04-14", "success", Some((1200, 50)), Some(0.001264)),
            spent("anthropic/claude-sonnet-4-5-20250929", "success", Some((3050, 120)), Some(0.0063)),
            spent("anthropic/claude-haiku-4-5", "success", Some((4007, 33)), Some(0.000572)),
            spent("openai/gpt-9", "success", Some((3, 2)), None),
            spent("backup/gpt-4.1-mini", "success", Some((3, 2)), Some(0.000007)),
            spent("anthropic/claude-sonnet-4-5", "failure", Some((11, 1)), None),
        ]
    );
    let sql = "SELECT cost FROM requests ORDER BY started_at";
    let requests: Vec<(Option<f64>,)> = match &pg {
        Some(pool) => sqlx::query_as(sql).fetch_all(pool).await.unwrap(),
        None => sqlx::query_as(sql).fetch_all(rota.pool()).await.unwrap(),
    };
    let costs: Vec<Option<f64>> = requests.into_iter().map(|r| r.0).collect();
    assert_eq!(costs, [Some(0.003532), Some(0.001264), Some(0.0063), Some(0.000572), None, Some(0.000007), None]);

    // The admin API lists the cost of each request and attempt.
    let admin = Some(rota.admin_key.as_str());
    let (_, page) = rota.api("GET", "/api/v1/requests?limit=2", admin, None).await;
    assert_eq!((page["items"][0]["cost"].clone(), page["items"][1]["cost"].as_f64()), (Value::Null, Some(0.000007)));
    let (_, page) = rota.api("GET", "/api/v1/attempts?limit=2", admin, None).await;
    assert_eq!(page["items"][1]["cost"].as_f64(), Some(0.000007));
    let (_, doc) = rota.api("GET", "/api/v1/openapi.json", None, None).await;
    for schema in ["RequestRecord", "AttemptRecord"] {
        let cost = &doc["components"]["schemas"][schema]["properties"]["cost"];
        assert!(cost["description"].as_str().is_some_and(|d| d.contains("micro-dollar")), "{schema}: {cost}");
    }
}

/// `model: "gpt-4.1"`, the first thing every SDK user sends: a 404 that suggests the
/// `provider/model` the config names it under, and no upstream call (rota never routes by guess).
#[tokio::test]
async fn an_unprefixed_model_one_provider_could_serve_is_refused_with_a_suggestion() {
    let (mock, base) = Mock::started().await;
    let rota = spawn(Scenario { config: &config(&base, ""), keys: &KEYS, ..Scenario::default() }).await;
    let ask = |model: &str| {
        let body = json!({"model": model, "messages": [{"role": "user", "content": "hi"}]});
        rota.chat(body, &[])
    };
    for (model, said) in
        [("gpt-4.1", "did you mean `openai/gpt-4.1`?"), ("gpt-4.1-mini", "did you mean `backup/gpt-4.1-mini`?")]
    {
        let r = ask(model).await;
        assert_eq!(r.status(), 404);
        let text = r.text().await.unwrap();
        assert!(text.contains(said), "{model}: {text}");
    }
    let r = ask("gpt-5").await;
    assert_eq!(r.status(), 404);
    assert!(!r.text().await.unwrap().contains("did you mean"), "three providers, none naming it: no guess");
    assert!(mock.seen().is_empty(), "no upstream call");
}

/// Rotation shows in the headers: an answer served after other attempts names them in
/// `x-rota-tried`; one served at once carries none.
#[tokio::test]
async fn an_answer_after_other_attempts_names_them_in_x_rota_tried() {
    let (mock, base) = Mock::started().await;
    let rota = spawn(Scenario { config: &config(&base, ""), keys: &KEYS, ..Scenario::default() }).await;
    let limited = Reply::Status(429, vec![], r#"{"error":{"message":"Rate limit reached"}}"#.into());
    mock.script(KEYS[0].1, vec![limited.clone()]);
    mock.script(KEYS[1].1, vec![limited]);
    let r = rota.chat(support::chat(), &[]).await;
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.headers()["x-rota-tried"],
        "openai:k1 openai/gpt-4.1 429 rate_limit, openai:k2 openai/gpt-4.1 429 rate_limit"
    );
    let served = rota.chat(support::chat(), &[]).await;
    assert_eq!(served.status(), 200);
    assert!(!served.headers().contains_key("x-rota-tried"), "served at once: {:?}", served.headers());
}
