//! The provider catalog (docs/providers.md): a preset's credential header reaches the upstream,
//! the lease says which header to use, a Codex plan at 100 % goes last until its reset with no
//! failure counted, and `rota doctor` shows what each preset filled in.

use crate::support::*;
use rota::engine::Clock;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;

#[tokio::test]
async fn an_azure_key_travels_in_api_key_and_the_lease_names_that_header() {
    let (mock, base) = Mock::started().await;
    // The preset's base URL is Azure's; the test points it at the mock.
    let cfg = format!(
        "[providers.azure]\npreset = \"azure-openai\"\nresource = \"contoso\"\nbase_url = \"{base}/v1\"\n\
         [providers.openai]\napi = \"openai\"\nbase_url = \"{base}/v1\"\n\
         [models]\nprimary = \"azure/gpt-4.1\"\n"
    );
    let keys = [("azure:eu", "azure-key-0001"), ("openai:k", "sk-openai-0002")];
    let rota = spawn(Scenario { config: &cfg, keys: &keys, ..Scenario::default() }).await;
    let r = rota.chat(json!({"model": "azure/gpt-4.1", "messages": [{"role": "user", "content": "hi"}]}), &[]).await;
    assert_eq!(r.status(), 200);
    let r = rota.chat(json!({"model": "openai/gpt-4.1", "messages": [{"role": "user", "content": "hi"}]}), &[]).await;
    assert_eq!(r.status(), 200);
    let seen: Vec<(String, &str)> = mock.seen().into_iter().map(|s| (s.key, s.header)).collect();
    assert_eq!(seen, [("azure-key-0001".into(), "api-key"), ("sk-openai-0002".into(), "authorization")]);

    let agent = Some(rota.agent_key.as_str());
    for (model, header) in [("azure/gpt-4.1", "api-key"), ("openai/gpt-4.1", "authorization")] {
        let (code, lease) = rota.api("POST", "/api/v1/leases", agent, Some(json!({"model": model}))).await;
        assert_eq!(code, 201, "{lease}");
        assert_eq!(lease["credential"]["header"], header, "{lease}");
        let path = format!("/api/v1/leases/{}/report", lease["lease_id"].as_str().unwrap());
        assert_eq!(rota.api("POST", &path, agent, Some(json!({"outcome": "success"}))).await.0, 200);
    }
}

/// A Responses answer as ChatGPT's Codex backend writes it: always a stream, one event per
/// write, with its plan headers.
fn codex_answer(used_percent: &str, reset_after: u64) -> Reply {
    let response = json!({
        "id": "resp_1", "object": "response", "status": "completed", "model": "gpt-5-codex",
        "output": [{"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
                    "content": [{"type": "output_text", "text": "served", "annotations": []}]}],
        "usage": {"input_tokens": 3, "output_tokens": 2, "total_tokens": 5}
    });
    Reply::Headed(
        vec![
            ("x-codex-primary-used-percent", used_percent.into()),
            ("x-codex-primary-window-minutes", "300".into()),
            ("x-codex-primary-reset-after-seconds", reset_after.to_string()),
            ("x-codex-secondary-used-percent", "41".into()),
            ("x-codex-secondary-reset-after-seconds", "500000".into()),
        ],
        Box::new(Reply::Raw(codex_stream(&response, true), Writes::PerEvent)),
    )
}

/// The events of a Codex answer, with or without its closing `response.completed`.
fn codex_stream(response: &Value, completed: bool) -> String {
    let mut created = response.clone();
    created["status"] = json!("in_progress");
    created["output"] = json!([]);
    let mut events = vec![
        ("response.created", json!({"type": "response.created", "sequence_number": 0, "response": created})),
        (
            "response.output_item.added",
            json!({"type": "response.output_item.added", "sequence_number": 1, "output_index": 0,
                   "item": {"type": "message", "id": "msg_1", "role": "assistant", "status": "in_progress", "content": []}}),
        ),
        (
            "response.output_text.delta",
            json!({"type": "response.output_text.delta", "sequence_number": 2, "item_id": "msg_1",
                   "output_index": 0, "content_index": 0, "delta": "served"}),
        ),
    ];
    if completed {
        events.push((
            "response.completed",
            json!({"type": "response.completed", "sequence_number": 3, "response": response}),
        ));
    }
    events.iter().map(|(name, data)| format!("event: {name}\ndata: {data}\n\n")).collect()
}

#[tokio::test]
async fn a_codex_plan_at_100_percent_goes_after_the_others_until_its_reset_with_no_failure() {
    let (mock, base) = Mock::started().await;
    let clock = Arc::new(Skewed::default());
    let cfg = format!(
        "[providers.chatgpt]\npreset = \"codex\"\nbase_url = \"{base}/v1\"\n\
         [models]\nprimary = \"chatgpt/gpt-5-codex\"\n[auth.order]\nchatgpt = [\"chatgpt:a\", \"chatgpt:b\"]\n"
    );
    let keys = [("chatgpt:a", "codex-token-a"), ("chatgpt:b", "codex-token-b")];
    let rota = spawn(Scenario { config: &cfg, keys: &keys, clock: Some(clock.clone()), ..Scenario::default() }).await;
    mock.script("codex-token-a", vec![codex_answer("72.5", 600), codex_answer("100.0", 600), codex_answer("3", 900)]);
    mock.script("codex-token-b", (0..3).map(|_| codex_answer("10", 600)).collect());

    let served = || async {
        let body = json!({"model": "chatgpt/gpt-5-codex", "messages": [{"role": "user", "content": "hi"}]});
        let r = rota.chat(body, &[]).await;
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()["x-rota-attempts"], "1", "served at the first attempt");
        let profile = r.headers()["x-rota-profile"].to_str().unwrap().to_string();
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["choices"][0]["message"]["content"], "served");
        profile
    };
    assert_eq!(served().await, "chatgpt:a", "27.5 % left: A is still first");
    assert_eq!(served().await, "chatgpt:a", "this answer says A's plan is spent");
    assert_eq!(served().await, "chatgpt:b", "A goes after B, before any 429");
    assert_eq!(served().await, "chatgpt:b", "and stays there until the window resets");
    assert!(mock.seen().iter().all(|s| s.path == "/v1/responses"), "Codex takes the Responses API");

    rota.flush().await;
    let (failures, errors): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM attempts WHERE outcome <> 'success'),
                (SELECT COALESCE(SUM(error_count), 0) FROM usage_stats)",
    )
    .fetch_one(rota.pool())
    .await
    .unwrap();
    assert_eq!((failures, errors), (0, 0), "a spent plan is no failure");
    let (left, reset): (i64, i64) =
        sqlx::query_as("SELECT quota_plan_left, quota_plan_reset_at FROM profile_quota WHERE profile_id = 'chatgpt:a'")
            .fetch_one(rota.pool())
            .await
            .unwrap();
    assert_eq!(left, 0);
    assert!((reset - (clock.now() + 600_000)).abs() < 5_000, "reset {reset}");

    let (code, profiles) = rota.api("GET", "/api/v1/profiles", Some(&rota.admin_key), None).await;
    assert_eq!(code, 200);
    let a = profiles.as_array().unwrap().iter().find(|p| p["id"] == "chatgpt:a").unwrap().clone();
    assert_eq!(a["quota"][0]["plan_left_percent"], 0, "{a}");

    clock.advance(Duration::from_secs(601));
    assert_eq!(served().await, "chatgpt:a", "after the reset, A is first again");
}

#[test]
fn doctor_shows_each_preset_and_what_it_filled() {
    let dir = tempfile::tempdir().unwrap();
    let config = "[providers.azure]\npreset = \"azure-openai\"\nresource = \"contoso\"\nkey_header = \"bearer\"\n\
                  [providers.chatgpt]\npreset = \"codex\"\n\
                  [providers.local]\napi = \"openai-chat\"\nbase_url = \"http://127.0.0.1:8000/v1\"\n\
                  [models]\nprimary = \"azure/gpt-4.1\"\n";
    std::fs::write(dir.path().join("rota.toml"), config).unwrap();
    let run = |args: &[&str]| {
        let out = rota_command().current_dir(dir.path()).args(args).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
        out.stdout
    };
    let text = String::from_utf8(run(&["doctor"])).unwrap();
    assert!(
        text.contains(
            "provider azure (preset azure-openai filled api, base_url, confirm_path, quota, client_credentials):\n  \
             openai at https://contoso.openai.azure.com/openai/v1, key in bearer, quota headers openai\n"
        ),
        "{text}"
    );
    assert!(text.contains("provider chatgpt (preset codex filled api, base_url, key_header, confirm_path, quota, oauth):\n  openai-responses at https://chatgpt.com/backend-api/codex, key in bearer, quota headers codex, sign-in\n"), "{text}");
    assert!(
        text.contains(
            "provider local:\n  openai-chat at http://127.0.0.1:8000/v1, key in bearer, quota headers openai\n"
        ),
        "{text}"
    );
    let json: Value = serde_json::from_slice(&run(&["doctor", "--json"])).unwrap();
    let azure = json["providers"].as_array().unwrap().iter().find(|p| p["name"] == "azure").unwrap();
    assert_eq!(azure["preset"], "azure-openai");
    assert_eq!(azure["key_header"], "bearer", "the file's key wins over the preset's");
    assert!(!azure["filled"].as_array().unwrap().contains(&json!("key_header")), "{azure}");
}

/// Vertex AI (docs/providers.md): Google's models through the OpenAI-compatible endpoint, Claude
/// through the Anthropic publisher's, the model in the URL and `anthropic_version` in the body,
/// streamed at `:streamRawPredict`; one provider, one token.
#[tokio::test]
async fn vertex_serves_gemini_on_its_openai_endpoint_and_claude_on_the_anthropic_one() {
    let (mock, base) = Mock::started().await;
    let cfg = format!(
        "[providers.vertex]\npreset = \"vertex\"\nproject = \"acme-ml\"\nlocation = \"us-east5\"\n\
         base_url = \"{base}/v1\"\n\
         claude_base_url = \"{base}/v1/projects/acme-ml/locations/us-east5/publishers/anthropic/models\"\n\
         [models]\nprimary = \"vertex/google/gemini-2.5-pro\"\n"
    );
    let rota =
        spawn(Scenario { config: &cfg, keys: &[("vertex:sa", "ya29.vertex-token-0001")], ..Scenario::default() }).await;
    let r = rota
        .chat(json!({"model": "vertex/google/gemini-2.5-pro", "messages": [{"role": "user", "content": "hi"}]}), &[])
        .await;
    assert_eq!(r.status(), 200);
    let claude = "vertex/claude-sonnet-4-5@20250929";
    let r = rota
        .chat(json!({"model": claude, "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}), &[])
        .await;
    assert_eq!(r.status(), 200);
    let answer: Value = r.json().await.unwrap();
    assert_eq!(answer["choices"][0]["message"]["content"], "served", "Anthropic's answer, in the client's format");
    let r = rota
        .messages(
            json!({"model": claude, "max_tokens": 16, "stream": true, "messages": [{"role": "user", "content": "hi"}]}),
        )
        .await;
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    assert!(text.contains("event: message_stop"), "{text}");

    let seen = mock.seen();
    let calls: Vec<(&str, &str, &str)> =
        seen.iter().map(|s| (s.path.as_str(), s.model.as_str(), s.key.as_str())).collect();
    let models = "/v1/projects/acme-ml/locations/us-east5/publishers/anthropic/models";
    assert_eq!(
        calls,
        [
            ("/v1/chat/completions", "google/gemini-2.5-pro", "ya29.vertex-token-0001"),
            (
                &format!("{models}/claude-sonnet-4-5@20250929:rawPredict") as &str,
                "claude-sonnet-4-5@20250929",
                "ya29.vertex-token-0001"
            ),
            (
                &format!("{models}/claude-sonnet-4-5@20250929:streamRawPredict"),
                "claude-sonnet-4-5@20250929",
                "ya29.vertex-token-0001"
            ),
        ]
    );
    let bodies = mock.bodies();
    for body in &bodies[1..] {
        assert_eq!(body["anthropic_version"], "vertex-2023-10-16", "{body}");
        assert!(body.get("model").is_none(), "the model is in the URL only: {body}");
    }
    assert_eq!(bodies[0]["model"], "google/gemini-2.5-pro");

    // A lease for a Claude model names Anthropic's format and the publisher's URL.
    let agent = Some(rota.agent_key.as_str());
    let (code, lease) = rota.api("POST", "/api/v1/leases", agent, Some(json!({"model": claude}))).await;
    assert_eq!(code, 201, "{lease}");
    assert_eq!(
        (lease["api"].as_str(), lease["base_url"].as_str()),
        (Some("anthropic"), Some(&format!("{base}{models}") as &str))
    );
}

/// An unsigned JWT with these claims, as the shape of ChatGPT's access tokens.
fn jwt(claims: Value) -> String {
    use base64::Engine as _;
    let part = |v: &Value| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string());
    format!("{}.{}.sig", part(&json!({"alg": "RS256", "typ": "JWT"})), part(&claims))
}

/// A ChatGPT sign-in's access token names its account: rota sends it as `ChatGPT-Account-ID`,
/// as the Codex CLI does, and sends nothing for a token without one or with an id of another
/// shape; providers without the `codex` preset never get the header.
#[tokio::test]
async fn a_codex_access_token_sends_its_chatgpt_account_id() {
    let (mock, base) = Mock::started().await;
    let cfg = format!(
        "[providers.chatgpt]\npreset = \"codex\"\nbase_url = \"{base}/v1\"\n\
         [providers.openai]\napi = \"openai\"\nbase_url = \"{base}/v1\"\n\
         [models]\nprimary = \"chatgpt/gpt-5-codex\"\n[auth.order]\nchatgpt = [\"chatgpt:a\", \"chatgpt:b\", \"chatgpt:c\"]\n"
    );
    let auth =
        |id: &str| jwt(json!({"https://api.openai.com/auth": {"chatgpt_account_id": id, "chatgpt_plan_type": "plus"}}));
    let (a, b, c) =
        (auth("3f9c1d2e-0000-4a1b-9c2d-acc0unt00001"), auth("bad id\r\nx-injected: 1"), jwt(json!({"sub": "x"})));
    let oauth =
        [("chatgpt:a", a.as_str(), "rt-a"), ("chatgpt:b", b.as_str(), "rt-b"), ("chatgpt:c", c.as_str(), "rt-c")];
    let rota =
        spawn(Scenario { config: &cfg, oauth: &oauth, keys: &[("openai:k", a.as_str())], ..Scenario::default() }).await;
    for (pin, model) in [
        ("chatgpt:a", "chatgpt/gpt-5-codex"),
        ("chatgpt:b", "chatgpt/gpt-5-codex"),
        ("chatgpt:c", "chatgpt/gpt-5-codex"),
        ("openai:k", "openai/gpt-4.1"),
    ] {
        let body = json!({"model": model, "messages": [{"role": "user", "content": "hi"}]});
        if let Some((_, token, _)) = oauth.iter().find(|o| o.0 == pin) {
            mock.script(token, vec![codex_answer("10", 60)]);
        }
        let r = rota.chat(body, &[("x-rota-profile", pin)]).await;
        assert_eq!(r.status(), 200, "{pin}");
    }
    let accounts: Vec<Option<String>> = mock.seen().into_iter().map(|s| s.account).collect();
    assert_eq!(accounts, [Some("3f9c1d2e-0000-4a1b-9c2d-acc0unt00001".to_string()), None, None, None]);
}

/// The Codex backend's rules (docs/providers.md): every call keeps nothing, streams, and has
/// instructions; a client that asked for one answer gets the stream's `response.completed`; a
/// stream that ends without it is a `network` failure.
#[tokio::test]
async fn codex_calls_keep_nothing_stream_and_carry_instructions() {
    let (mock, base) = Mock::started().await;
    let cfg = format!(
        "[providers.chatgpt]\npreset = \"codex\"\nbase_url = \"{base}/v1\"\n\
         [models]\nprimary = \"chatgpt/gpt-5-codex\"\n"
    );
    let keys = [("chatgpt:a", "codex-token-a")];
    let rota = spawn(Scenario { config: &cfg, keys: &keys, ..Scenario::default() }).await;
    let response: Value = serde_json::from_str(
        r#"{"id": "resp_1", "object": "response", "status": "completed", "model": "gpt-5-codex",
            "output": [{"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
                        "content": [{"type": "output_text", "text": "served", "annotations": []}]}],
            "usage": {"input_tokens": 3, "output_tokens": 2, "total_tokens": 5}}"#,
    )
    .unwrap();
    let cut = Reply::Raw(codex_stream(&response, false), Writes::PerEvent);
    mock.script("codex-token-a", vec![codex_answer("1", 60), codex_answer("1", 60), cut, codex_answer("1", 60)]);

    // One chat answer, with a system message: it becomes the instructions.
    let chat = json!({"model": "chatgpt/gpt-5-codex", "stream": false, "messages": [
        {"role": "system", "content": "Answer in one word."}, {"role": "user", "content": "hi"}]});
    let r = rota.chat(chat, &[]).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "application/json");
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["choices"][0]["message"]["content"], "served", "{body}");
    assert_eq!(body["usage"]["total_tokens"], 5, "{body}");

    // A Responses stream with its own instructions, relayed as it came.
    let stream = json!({"model": "chatgpt/gpt-5-codex", "stream": true, "store": true, "instructions": "Be brief.", "input": "hi"});
    let r = Rota::client()
        .post(format!("{}/v1/responses", rota.url))
        .bearer_auth(&rota.agent_key)
        .json(&stream)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    assert!(text.contains("event: response.completed"), "{text}");

    // A stream cut before `response.completed` is a `network` failure, tried again.
    let r = rota
        .chat(json!({"model": "chatgpt/gpt-5-codex", "messages": [{"role": "user", "content": "again"}]}), &[])
        .await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-rota-profile"], "chatgpt:a", "`network` is retried once on the profile");
    assert_eq!(r.headers()["x-rota-attempts"], "2");

    let bodies = mock.bodies();
    assert_eq!(bodies.len(), 4);
    for b in &bodies {
        assert_eq!((b["store"].clone(), b["stream"].clone()), (json!(false), json!(true)), "{b}");
        assert!(b["instructions"].as_str().is_some_and(|i| !i.trim().is_empty()), "{b}");
    }
    assert_eq!(bodies[0]["instructions"], "Answer in one word.");
    assert!(!bodies[0]["input"].to_string().contains("one word"), "the system message left the input: {}", bodies[0]);
    assert_eq!(bodies[1]["instructions"], "Be brief.");
    rota.flush().await;
    let (reason,): (String,) =
        sqlx::query_as("SELECT reason FROM attempts WHERE outcome <> 'success'").fetch_one(rota.pool()).await.unwrap();
    assert_eq!(reason, "network");
}
